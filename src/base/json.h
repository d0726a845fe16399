/* Whole numbers out of parsed JSON (private). A JSON number is a double; converting one that is
 * out of an integer type's range (1e30, NaN, inf) is undefined behaviour in C, and every reader of
 * a file we did not write (tokenizer.json, checkpoints' metadata, MDS indexes, traces) goes through
 * this one check instead of a bare cast. */
#ifndef CM_BASE_JSON_H
#define CM_BASE_JSON_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

/* True when v is a JSON number holding a whole value in [lo, hi] (clamped to +-2^53, where doubles
 * stop being exact), stored in *out; false (and *out untouched) otherwise, NULL v included. */
bool cmi_json_whole(const cJSON *v, int64_t lo, int64_t hi, int64_t *out);

#endif
