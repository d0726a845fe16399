/* Private helpers shared by the callbacks: the clock, monitored metrics, and JSON for save/load. */
#ifndef CM_CB_IMPL_H
#define CM_CB_IMPL_H

#include <composer/callbacks.h>

#include <cjson/cJSON.h>

static inline double cbi_now(cm_clock_fn clock, void *data) { return clock ? clock(data) : cm_clock_s(); }

/* A copy of s made with cm_alloc (NULL and CM_ERR_OOM set on failure). */
char *cbi_strdup(const char *s);

/* FIT_START: `label` is one the trainer keeps metrics for ("train" or an evaluator's), else
 * CM_ERR_INVALID_ARG naming the labels there are (a stopper watching no loader never stops). */
cm_status cbi_check_label(const char *who, const cm_state *st, const char *label);

/* Reads metric `monitor` of `label` from the state; CM_ERR_NOT_FOUND saying which callback wanted
 * it and how to fix the names. */
cm_status cbi_monitored_metric(const char *who, const cm_state *st, const char *label, const char *monitor,
                               double *out);

/* Writes a cJSON object into buf as the vtables' save does (snprintf semantics); the object is
 * deleted. Returns 0 if printing fails (out of memory). */
size_t cbi_json_save(cJSON *obj, char *buf, size_t cap);

/* Parses len bytes as a JSON object; CM_ERR_FORMAT naming `who` otherwise. */
cm_status cbi_json_parse(const char *who, const char *json, size_t len, cJSON **out);

/* The number under key (CM_ERR_FORMAT if missing or not a number). */
cm_status cbi_json_number(const char *who, const cJSON *obj, const char *key, double *out);

#endif
