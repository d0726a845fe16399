/* The manifest's self-checksum and small JSON helpers (64-bit integers as strings, timestamps). */
#include "checkpoint/ckpt_impl.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

cm_status cmi_manifest_serialize(const cJSON *root, char **out, size_t *len) {
    *out = NULL;
    char *text = cJSON_Print(root);
    if (!text) return cm_set_error(CM_ERR_OOM, "manifest: out of memory while printing JSON");
    size_t n = strlen(text);
    /* drop the closing brace (and the whitespace before it): the checksum field closes the object */
    if (n && text[n - 1] == '}') n--;
    while (n && (text[n - 1] == '\n' || text[n - 1] == '\t' || text[n - 1] == ' ')) n--;
    const bool empty = n && text[n - 1] == '{';
    uint64_t h = cm_hash64(text, n, 0);
    size_t cap = n + 64;
    char *buf = cm_alloc(cap, 1);
    if (!buf) {
        cJSON_free(text);
        return cm_set_error(CM_ERR_OOM, "manifest: out of memory");
    }
    memcpy(buf, text, n);
    int k = snprintf(buf + n, cap - n, "%s\n\t" CMI_MANIFEST_KEY ":\t\"%016" PRIx64 "\"\n}\n", empty ? "" : ",", h);
    cJSON_free(text);
    *out = buf;
    *len = n + (size_t)k;
    return CM_OK;
}

cm_status cmi_manifest_parse(const char *text, size_t len, const char *label, cJSON **out) {
    *out = NULL;
    /* The checksum covers every byte before the comma that precedes the last "manifest_xxh3". */
    const char *key = NULL;
    for (size_t i = len; i-- > 0;) {
        if (i + sizeof CMI_MANIFEST_KEY - 1 <= len && !memcmp(text + i, CMI_MANIFEST_KEY, sizeof CMI_MANIFEST_KEY - 1)) {
            key = text + i;
            break;
        }
    }
    if (!key)
        return cm_set_error(CM_ERR_FORMAT, "%s: no manifest_xxh3 field at the end (torn or not written by "
                                           "composer)", label);
    const char *p = key;
    while (p > text && (p[-1] == ' ' || p[-1] == '\t' || p[-1] == '\n' || p[-1] == '\r')) p--;
    if (p > text && p[-1] == ',') p--;
    uint64_t h = cm_hash64(text, (size_t)(p - text), 0);
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return cm_set_error(CM_ERR_FORMAT, "%s: not valid JSON (torn or edited)", label);
    }
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(root, "manifest_xxh3");
    char want[17];
    snprintf(want, sizeof want, "%016" PRIx64, h);
    if (!cJSON_IsString(c) || strcmp(c->valuestring, want) != 0) {
        cm_status s = cm_set_error(CM_ERR_FORMAT, "%s: checksum mismatch (manifest_xxh3 %s, content hashes to %s): "
                                                  "the manifest was edited or damaged",
                                   label, cJSON_IsString(c) ? c->valuestring : "(not a string)", want);
        cJSON_Delete(root);
        return s;
    }
    *out = root;
    return CM_OK;
}

cJSON *cmi_json_u64(uint64_t v) {
    char b[32];
    snprintf(b, sizeof b, "%" PRIu64, v);
    return cJSON_CreateString(b);
}

bool cmi_json_get_u64(const cJSON *o, const char *key, uint64_t *out) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(c) || !c->valuestring[0]) return false;
    char *end;
    unsigned long long v = strtoull(c->valuestring, &end, 10);
    if (*end || c->valuestring[0] == '-') return false;
    *out = v;
    return true;
}

bool cmi_json_get_i64(const cJSON *o, const char *key, int64_t *out) {
    return cmi_json_whole(cJSON_GetObjectItemCaseSensitive(o, key), INT64_MIN, INT64_MAX, out);
}

bool cmi_json_get_double(const cJSON *o, const char *key, double *out) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsNull(c)) {
        *out = NAN;
        return true;
    }
    if (!cJSON_IsNumber(c)) return false;
    *out = c->valuedouble;
    return true;
}

#define CMI_TS_INTS(X) \
    X(iteration) X(epoch) X(batch) X(sample) X(token) X(epoch_in_iteration) X(token_in_iteration) \
    X(batch_in_epoch) X(sample_in_epoch) X(token_in_epoch)
#define CMI_TS_DOUBLES(X) X(total_wct) X(iteration_wct) X(epoch_wct) X(batch_wct)

cJSON *cmi_timestamp_to_json(const cm_timestamp *ts) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    bool ok = true;
#define X_(f) ok &= cJSON_AddNumberToObject(o, #f, (double)ts->f) != NULL;
    CMI_TS_INTS(X_)
    CMI_TS_DOUBLES(X_)
#undef X_
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

bool cmi_timestamp_from_json(const cJSON *o, cm_timestamp *ts) {
    if (!cJSON_IsObject(o)) return false;
    cm_timestamp t = {0};
    bool ok = true;
#define X_(f) ok &= cmi_json_get_i64(o, #f, &t.f) && t.f >= 0;
    CMI_TS_INTS(X_)
#undef X_
#define X_(f) ok &= cmi_json_get_double(o, #f, &t.f);
    CMI_TS_DOUBLES(X_)
#undef X_
    if (ok) *ts = t;
    return ok;
}
