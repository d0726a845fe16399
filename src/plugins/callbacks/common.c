/* Shared pieces of the callbacks: wall-clock units, comparisons, monitored metrics, JSON. */
#include "cb_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static const char *const wall_names[] = {
#define CM_X_(name, str, secs) str,
    CM_WALL_UNIT_LIST(CM_X_)
#undef CM_X_
};
static const double wall_secs[] = {
#define CM_X_(name, str, secs) secs,
    CM_WALL_UNIT_LIST(CM_X_)
#undef CM_X_
};
_Static_assert(sizeof wall_names / sizeof *wall_names == CM_WALL_UNIT_COUNT, "wall unit table");

const char *cm_wall_unit_name(cm_wall_unit u) { return (unsigned)u < CM_WALL_UNIT_COUNT ? wall_names[u] : "?"; }
double cm_wall_unit_seconds(cm_wall_unit u) { return (unsigned)u < CM_WALL_UNIT_COUNT ? wall_secs[u] : 0.0; }

cm_status cm_wall_unit_parse(const char *s, cm_wall_unit *out) {
    for (int i = 0; s && i < CM_WALL_UNIT_COUNT; i++) {
        if (!strcasecmp(s, wall_names[i])) {
            *out = (cm_wall_unit)i;
            return CM_OK;
        }
    }
    return cm_set_error(CM_ERR_INVALID_ARG, "time_unit '%s' is not known (use seconds, minutes, hours or days)",
                        s ? s : "(null)");
}

cm_status cm_comp_parse(const char *s, cm_comp *out) {
    if (s && (!strcasecmp(s, "less") || !strcasecmp(s, "lt"))) return *out = CM_COMP_LESS, CM_OK;
    if (s && (!strcasecmp(s, "greater") || !strcasecmp(s, "gt"))) return *out = CM_COMP_GREATER, CM_OK;
    if (s && !strcasecmp(s, "auto")) return *out = CM_COMP_AUTO, CM_OK;
    return cm_set_error(CM_ERR_INVALID_ARG, "comp '%s' is not known (use less/lt, greater/gt or auto)",
                        s ? s : "(null)");
}

cm_comp cm_comp_for_metric(const char *monitor) {
    static const char *const lower_is_better[] = {"loss", "error", "perplexity", "crossentropy", "cross_entropy"};
    char low[256];
    size_t n = 0;
    for (; monitor && monitor[n] && n + 1 < sizeof low; n++)
        low[n] = (char)(monitor[n] >= 'A' && monitor[n] <= 'Z' ? monitor[n] - 'A' + 'a' : monitor[n]);
    low[n] = 0;
    for (size_t i = 0; i < sizeof lower_is_better / sizeof *lower_is_better; i++)
        if (strstr(low, lower_is_better[i])) return CM_COMP_LESS;
    return CM_COMP_GREATER;
}

char *cbi_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = cm_alloc(n, 1);
    if (!d) {
        cm_set_error(CM_ERR_OOM, "out of memory copying '%s'", s);
        return NULL;
    }
    memcpy(d, s, n);
    return d;
}

cm_status cbi_check_label(const char *who, const cm_state *st, const char *label) {
    char known[512] = "";
    size_t len = 0;
    for (int i = 0; i < cm_state_n_metric_labels(st); i++) {
        const char *l = cm_state_metric_label_at(st, i);
        if (!strcmp(l, label)) return CM_OK;
        if (len < sizeof known) len += (size_t)snprintf(known + len, sizeof known - len, "%s'%s'", i ? ", " : "", l);
    }
    return cm_set_error(CM_ERR_INVALID_ARG, "%s: dataloader_label '%s' is no loader of this trainer (its labels: %s), "
                        "so it would never stop", who, label, known);
}

cm_status cbi_monitored_metric(const char *who, const cm_state *st, const char *label, const char *monitor,
                               double *out) {
    if (cm_state_metric(st, label, monitor, out) == CM_OK) return CM_OK;
    char why[512]; /* the state's reason: not computed yet, no such label, training metrics off */
    snprintf(why, sizeof why, "%s", cm_last_error());
    char known[512] = "";
    size_t len = 0;
    for (int i = 0; i < cm_state_n_metrics(st, label); i++) {
        const char *name;
        if (cm_state_metric_at(st, label, i, &name, NULL) == CM_OK && len < sizeof known)
            len += (size_t)snprintf(known + len, sizeof known - len, "%s%s", i ? ", " : "", name);
    }
    return cm_set_error(CM_ERR_NOT_FOUND,
                        "%s: metric '%s' of dataloader_label '%s' has not been computed (%s%s; the label is 'train' "
                        "or an evaluator's label such as 'eval')",
                        who, monitor, label, len ? "computed for that label: " : "", len ? known : why);
}

size_t cbi_json_save(cJSON *obj, char *buf, size_t cap) {
    char *s = obj ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    if (!s) return 0;
    size_t n = strlen(s);
    if (cap) {
        size_t k = n < cap - 1 ? n : cap - 1;
        memcpy(buf, s, k);
        buf[k] = 0;
    }
    cJSON_free(s);
    return n;
}

cm_status cbi_json_parse(const char *who, const char *json, size_t len, cJSON **out) {
    cJSON *o = json ? cJSON_ParseWithLength(json, len) : NULL;
    if (!o || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return cm_set_error(CM_ERR_FORMAT, "%s: the saved state is not a JSON object (%zu bytes)", who, len);
    }
    *out = o;
    return CM_OK;
}

cm_status cbi_json_number(const char *who, const cJSON *obj, const char *key, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(v))
        return cm_set_error(CM_ERR_FORMAT, "%s: the saved state has no number '%s'", who, key);
    *out = v->valuedouble;
    return CM_OK;
}
