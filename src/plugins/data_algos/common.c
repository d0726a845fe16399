/* Shared pieces of the data methods: keyed draws (uniforms, integers, permutations, Beta), dense
 * mixed targets, batch-field lookup and plugin-owned tensors. */
#include "plugins/data_algos/da_impl.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>

/* ---- draws ---- */

cm_rng cmi_da_rng(uint64_t seed, uint64_t tag, int64_t a, int64_t b, int64_t c) {
    const int64_t key[4] = {(int64_t)tag, a, b, c};
    return cm_rng_init(seed, cm_hash64(key, sizeof key, 0x44415441 /* "DATA" */));
}

double cmi_da_u01(cm_rng *rng) {
    uint32_t w[4];
    cm_philox4x32(rng->seed, rng->stream, rng->counter++, w);
    return (double)(((uint64_t)(w[0] >> 5) << 26) | (w[1] >> 6)) * (1.0 / 9007199254740992.0);
}

int64_t cmi_da_randint(cm_rng *rng, int64_t lo, int64_t hi) {
    int64_t v;
    cm_rng_randint(rng, &v, 1, lo, hi);
    return v;
}

void cm_random_permutation(cm_rng *rng, int64_t n, int64_t *perm) {
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        const int64_t j = cmi_da_randint(rng, 0, i + 1);
        const int64_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
}

static double normal01(cm_rng *rng) {
    /* Box–Muller; 1 - u keeps the log's argument in (0, 1] */
    const double u = 1.0 - cmi_da_u01(rng), v = cmi_da_u01(rng);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* Marsaglia and Tsang (2000) for shape >= 1; Gamma(a) = Gamma(a + 1)·U^(1/a) below 1. */
double cmi_da_gamma(cm_rng *rng, double a) {
    if (a < 1.0) {
        const double u = 1.0 - cmi_da_u01(rng); /* (0, 1] */
        return cmi_da_gamma(rng, a + 1.0) * pow(u, 1.0 / a);
    }
    const double d = a - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x, v;
        do {
            x = normal01(rng);
            v = 1.0 + c * x;
        } while (v <= 0.0);
        v = v * v * v;
        const double u = cmi_da_u01(rng);
        if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
        if (u > 0.0 && log(u) < 0.5 * x * x + d * (1.0 - v + log(v))) return d * v;
    }
}

double cm_random_beta(cm_rng *rng, double a, double b) {
    const double x = cmi_da_gamma(rng, a), y = cmi_da_gamma(rng, b);
    /* both underflow only for tiny shapes: fall back on which one is larger in expectation */
    if (x + y <= 0.0) return a >= b ? 1.0 : 0.0;
    return x / (x + y);
}

/* ---- targets ---- */

bool cmi_da_is_index_dtype(cm_dtype dt) { return dt == CM_DTYPE_I32 || dt == CM_DTYPE_I64 || dt == CM_DTYPE_U8; }

int64_t cmi_da_class_at(const cm_tensor *t, int64_t i) { return (int64_t)cm_tensor_get_flat(t, i); }

cm_status cm_mix_targets(const cm_tensor *target, const int64_t *perm, double w, int64_t C, cm_tensor *out) {
    if (!target || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_mix_targets: NULL target or out");
    cm_status hs = cmi_da_check_host("cm_mix_targets", target, out, NULL);
    if (hs) return hs;
    char a[96], b[96];
    const int64_t N = cm_tensor_ndim(target) >= 1 ? cm_tensor_dim(target, 0) : -1;
    if (C < 1 || cm_tensor_ndim(out) != 2 || cm_tensor_dim(out, 0) != N || cm_tensor_dim(out, 1) != C ||
        cm_tensor_dtype(out) != CM_DTYPE_F32 || !cm_tensor_is_contiguous(out))
        return cm_set_error(CM_ERR_SHAPE, "cm_mix_targets: out %s must be (%lld, %lld) f32 contiguous for target %s",
                            cmi_da_desc(out, a, sizeof a), (long long)N, (long long)C, cmi_da_desc(target, b, sizeof b));
    float *o = cm_tensor_data(out);
    const bool index = cm_tensor_ndim(target) == 1 && cmi_da_is_index_dtype(cm_tensor_dtype(target));
    const bool dense = cm_tensor_ndim(target) == 2 && cm_tensor_dim(target, 1) == C &&
                       cm_tensor_dtype(target) == CM_DTYPE_F32;
    if (!index && !dense)
        return cm_set_error(cm_tensor_ndim(target) == 1 || cm_tensor_ndim(target) == 2 ? CM_ERR_DTYPE : CM_ERR_SHAPE,
                            "cm_mix_targets: target %s must be class indices (N) (i32, i64 or u8) or dense (N, %lld) "
                            "f32",
                            cmi_da_desc(target, a, sizeof a), (long long)C);
    for (int64_t i = 0; perm && i < N; i++)
        if (perm[i] < 0 || perm[i] >= N)
            return cm_set_error(CM_ERR_INVALID_ARG, "cm_mix_targets: perm[%lld] = %lld is outside [0, %lld)",
                                (long long)i, (long long)perm[i], (long long)N);
    if (index)
        for (int64_t i = 0; i < N; i++) {
            const int64_t y = cmi_da_class_at(target, i);
            if (y < 0 || y >= C)
                return cm_set_error(CM_ERR_INVALID_ARG, "cm_mix_targets: target[%lld] = %lld is not a class in [0, %lld)",
                                    (long long)i, (long long)y, (long long)C);
        }
    const double w2 = perm ? 1.0 - w : 0.0, w1 = perm ? w : 1.0;
    for (int64_t i = 0; i < N; i++) {
        float *row = o + i * C;
        if (index) {
            memset(row, 0, sizeof(float) * (size_t)C);
            row[cmi_da_class_at(target, i)] += (float)w1;
            if (perm) row[cmi_da_class_at(target, perm[i])] += (float)w2;
        } else {
            for (int64_t c = 0; c < C; c++) {
                const double t1 = cm_tensor_get_flat(target, i * C + c);
                const double t2 = perm ? cm_tensor_get_flat(target, perm[i] * C + c) : 0.0;
                row[c] = (float)(w1 * t1 + w2 * t2);
            }
        }
    }
    return CM_OK;
}

/* ---- fields, owned tensors, keys ---- */

/* A key of decimal digits is a position, as Composer's integer keys. */
static int key_position(const char *key) {
    if (!key || !*key || strlen(key) > 3) return -1;
    for (const char *p = key; *p; p++)
        if (*p < '0' || *p > '9') return -1;
    return atoi(key);
}

int cmi_da_field(const char *const *names, int n, const char *key, int pos, const char *algo, const char *role) {
    const int kp = key_position(key);
    if (kp >= 0) {
        if (kp < n) return kp;
        key = NULL, pos = kp;
    }
    if (key) {
        for (int i = 0; i < n; i++)
            if (!strcmp(names[i], key)) return i;
    } else if (pos < n) {
        return pos;
    }
    char list[512] = "";
    for (int i = 0; i < n; i++) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", names[i]);
    if (key)
        cm_set_error(CM_ERR_NOT_FOUND, "%s: the batch has no field '%s' for %s (fields: %s)", algo, key, role, list);
    else
        cm_set_error(CM_ERR_NOT_FOUND, "%s: %s is the batch's field %d, but the batch has %d field%s (%s); set %s to a "
                                       "field name",
                     algo, role, pos, n, n == 1 ? "" : "s", list, role);
    return -1;
}

void cmi_da_owned_clear(cmi_da_owned *o) {
    for (int i = 0; i < o->n; i++) cm_tensor_free(o->t[i]);
    o->n = 0;
}

cm_status cmi_da_owned_add(cmi_da_owned *o, cm_tensor *t) {
    if (!t) return CM_OK;
    if (o->n == (int)(sizeof o->t / sizeof *o->t)) {
        cm_tensor_free(t);
        return cm_set_error(CM_ERR_INTERNAL, "data method: more than %d replaced tensors in one batch", o->n);
    }
    o->t[o->n++] = t;
    return CM_OK;
}

bool cmi_da_dup_key(const char *key, char **out) {
    *out = NULL;
    if (!key) return true;
    const size_t n = strlen(key) + 1;
    if (!(*out = cm_alloc(n, 1))) return false;
    memcpy(*out, key, n);
    return true;
}

const char *cmi_da_desc(const cm_tensor *t, char *buf, size_t cap) {
    char sh[80];
    snprintf(buf, cap, "%s %s", cm_tensor_shape_str(t, sh, sizeof sh), cm_dtype_name(cm_tensor_dtype(t)));
    return buf;
}

cm_status cmi_da_new_like(const cm_tensor *src, int ndim, const int64_t *shape, cm_tensor **out) {
    return cm_tensor_new(cm_tensor_dtype(src), ndim, shape, out);
}

cm_status cmi_da_load_numbers(const char *algo, const char *json, size_t len, const char *const *keys, double *vals,
                              int n) {
    cJSON *o = json ? cJSON_ParseWithLength(json, len) : NULL;
    cm_status s = CM_OK;
    if (!o || !cJSON_IsObject(o)) {
        s = cm_set_error(CM_ERR_FORMAT, "%s: the checkpoint state is not a JSON object", algo);
    } else {
        for (int i = 0; !s && i < n; i++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, keys[i]);
            if (!cJSON_IsNumber(v))
                s = cm_set_error(CM_ERR_FORMAT, "%s: the checkpoint state has no number '%s'", algo, keys[i]);
            else
                vals[i] = v->valuedouble;
        }
    }
    cJSON_Delete(o);
    return s;
}

cm_status cmi_da_check_host(const char *who, const cm_tensor *t, ...) {
    va_list ap;
    va_start(ap, t);
    cm_status s = CM_OK;
    for (const cm_tensor *x = t; x && !s; x = va_arg(ap, const cm_tensor *))
        if (cm_tensor_device(x) != CM_DEVICE_CPU)
            s = cm_set_error(CM_ERR_UNSUPPORTED, "%s: a tensor is on %s; the data methods work on CPU tensors (copy it "
                                                 "with cm_tensor_to_device)",
                             who, cm_device_name(cm_tensor_device(x)));
    va_end(ap);
    return s;
}
