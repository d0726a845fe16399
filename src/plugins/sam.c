/* SAM: Composer's sharpness-aware minimization — the first and second step as plain functions
 * and the algorithm, a custom train step that runs the batch's closure twice (train_algos.h). */
#include "plugins/train_algos_impl.h"
#include "tensor/backend.h"
#include "tensor/tensor_impl.h"
#include "base/json.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

cm_sam_config cm_sam_config_default(void) { return (cm_sam_config){.rho = 0.05, .epsilon = 1.0e-12, .interval = 1}; }

static double sumsq(const float *g, int64_t n) {
    double acc = 0;
#pragma omp parallel for schedule(static) reduction(+ : acc) if (n > 65536)
    for (int64_t i = 0; i < n; i++) acc += (double)g[i] * g[i];
    return acc;
}

/* The device all spans' buffers are on (params, grads and saved alike), or an error. */
static cm_status spans_device(float *const *params, const float *const *grads, float *const *saved,
                              const int64_t *lens, int n, cm_device *out) {
    *out = CM_DEVICE_CPU;
    bool first = true;
    for (int i = 0; i < n; i++) {
        if (lens[i] <= 0) continue;
        const cm_device d = cmi_ptr_device(params[i]);
        if (first) *out = d, first = false;
        if (d != *out || cmi_ptr_device(grads[i]) != d || (saved && cmi_ptr_device(saved[i]) != d))
            return cm_set_error(CM_ERR_INVALID_ARG, "SAM: span %d's buffers are not all on %s, where span 0's are", i,
                                cm_device_name(*out));
    }
    return CM_OK;
}

cm_status cm_sam_perturb(float *const *params, const float *const *grads, float *const *saved, const int64_t *lens,
                         int n, double rho, double epsilon, double *grad_norm) {
    if (!(rho >= 0) || !isfinite(rho)) return cm_set_error(CM_ERR_INVALID_ARG, "SAM: rho %g must be >= 0 and finite", rho);
    if (!(epsilon >= 0) || !isfinite(epsilon))
        return cm_set_error(CM_ERR_INVALID_ARG, "SAM: epsilon %g must be >= 0 and finite", epsilon);
    if (n < 0 || (n > 0 && (!params || !grads || !saved || !lens)))
        return cm_set_error(CM_ERR_INVALID_ARG, "SAM: %d spans without arrays", n);
    for (int i = 0; i < n; i++)
        if (lens[i] < 0 || (lens[i] > 0 && (!params[i] || !grads[i] || !saved[i])))
            return cm_set_error(CM_ERR_INVALID_ARG, "SAM: span %d has length %lld and a NULL buffer", i, (long long)lens[i]);
    cm_device dev;
    cm_status s = spans_device(params, grads, saved, lens, n, &dev);
    if (s) return s;
    const cmi_backend *be = cmi_backend_get(dev); /* NULL: host memory */
    double ss = 0;
    for (int i = 0; i < n; i++) {
        double part = 0;
        if (be && lens[i] > 0 && (s = be->sumsq(grads[i], lens[i], &part))) return s;
        ss += be ? part : sumsq(grads[i], lens[i]);
    }
    const double norm = sqrt(ss);
    if (grad_norm) *grad_norm = norm;
    /* torch: scale = rho / (grad_norm + eps) as an f32 tensor; e_w = p.grad * scale; p.add_(e_w) */
    const float scale = (float)(rho / (norm + epsilon));
    for (int i = 0; i < n; i++) {
        float *p = params[i], *w = saved[i];
        const float *g = grads[i];
        const int64_t len = lens[i];
        if (len <= 0) continue;
        if (be) { /* the same roundings on the device */
            if ((s = cmi_dev_memcpy(w, dev, p, dev, sizeof(float) * (size_t)len)) ||
                (s = be->sam_perturb(p, g, len, scale)))
                return s;
            continue;
        }
        memcpy(w, p, sizeof(float) * (size_t)len);
#pragma omp parallel for simd schedule(static) if (len > 65536)
        for (int64_t k = 0; k < len; k++) {
            const float e = g[k] * scale;
            p[k] = p[k] + e;
        }
    }
    return CM_OK;
}

static cm_status restore(float *const *params, const float *const *saved, const int64_t *lens, int n) {
    cm_status s = CM_OK;
    for (int i = 0; i < n && !s; i++)
        if (lens[i] > 0) {
            const cm_device d = cmi_ptr_device(params[i]);
            s = cmi_dev_memcpy(params[i], d, saved[i], d, sizeof(float) * (size_t)lens[i]);
        }
    return s;
}

void cm_sam_restore(float *const *params, const float *const *saved, const int64_t *lens, int n) {
    (void)restore(params, saved, lens, n); /* host copies cannot fail; a device's error stays in cm_last_error */
}

/* ---- the algorithm ---- */

enum { SAM_MAX_UNITS = 256 };

typedef struct {
    double rho, epsilon;
    int64_t interval;
    int64_t global_step; /* optimizer steps taken (SAMOptimizer.global_step) */
    float *saved;        /* a copy of the parameters while perturbed, on the parameters' device */
    int64_t saved_n;
    cm_device saved_dev;
    cm_model *model;
} sam;

static cm_status sam_step(void *data, cm_state *st, cm_train_closure *c) {
    sam *a = data;
    cm_status s;
    if ((a->global_step + 1) % a->interval != 0) {
        if ((s = cm_train_closure_run(c)) || (s = cm_train_closure_step(c))) return s;
        a->global_step++;
        return CM_OK;
    }
    cm_module *root = cm_model_module(a->model);
    const int n = cm_module_n_units(root);
    if (n > SAM_MAX_UNITS) return cm_set_error(CM_ERR_UNSUPPORTED, "SAM: more than %d wrap units", SAM_MAX_UNITS);
    float *params[SAM_MAX_UNITS], *saved[SAM_MAX_UNITS];
    const float *grads[SAM_MAX_UNITS];
    int64_t lens[SAM_MAX_UNITS], total = 0;
    for (int i = 0; i < n; i++) total += cm_module_unit(root, i)->numel;
    const cm_device dev = cm_module_device(root);
    if (total > a->saved_n || dev != a->saved_dev) {
        cmi_dev_free(a->saved_dev, a->saved);
        a->saved = NULL, a->saved_n = 0, a->saved_dev = dev;
        if (!(a->saved = cmi_dev_alloc(dev, sizeof(float) * (size_t)(total ? total : 1), false)))
            return cm_set_error(CM_ERR_OOM, "SAM: out of %s memory for a copy of the %lld parameters",
                                cm_device_name(dev), (long long)total);
        a->saved_n = total;
    }
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        const cm_unit_info *u = cm_module_unit(root, i);
        params[i] = u->params, grads[i] = u->grads, lens[i] = u->numel, saved[i] = a->saved + off;
        off += u->numel;
    }
    if ((s = cm_train_closure_run(c))) return s;                                           /* g at w */
    if ((s = cm_sam_perturb(params, grads, saved, lens, n, a->rho, a->epsilon, NULL))) return s; /* w + e(w) */
    s = cm_train_closure_run(c);                                                          /* g at w + e(w) */
    const cm_status r = restore(params, (const float *const *)saved, lens, n);            /* back to w */
    if (s || (s = r) || (s = cm_train_closure_step(c))) return s;
    a->global_step++;
    return CM_OK;
}

static bool sam_match(void *self, cm_event ev, const cm_state *st) { return ev == CM_EVENT_AFTER_LOAD; }

static cm_status sam_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    sam *a = self;
    cm_status s = cmi_algo_refuse_sharded("SAM", st);
    if (s) return s;
    if (!(a->model = cm_state_model(st))) return cm_set_error(CM_ERR_STATE, "SAM: the state has no model");
    return cm_state_set_train_step(st, "SAM", sam_step, a);
}

static size_t sam_save(void *self, char *buf, size_t cap) {
    return (size_t)snprintf(buf, cap, "{\"global_step\": %lld}", (long long)((sam *)self)->global_step);
}

static cm_status sam_load(void *self, const char *json, size_t len) {
    cJSON *j = cJSON_ParseWithLength(json, len);
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(j, "global_step");
    int64_t step;
    const bool ok = cmi_json_whole(n, 0, INT64_MAX, &step);
    if (ok) ((sam *)self)->global_step = step;
    cJSON_Delete(j);
    return ok ? CM_OK : cm_set_error(CM_ERR_FORMAT, "SAM: the saved state has no valid global_step");
}

static void sam_free(void *self) {
    sam *a = self;
    cmi_dev_free(a->saved_dev, a->saved);
    cm_free(a);
}

static const cm_algorithm_i sam_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "SAM",
    .match = sam_match,
    .apply = sam_apply,
    .save = sam_save,
    .load = sam_load,
    .free = sam_free,
};

cm_status cm_sam_new(const cm_sam_config *cfg, cm_algorithm_plugin *out) {
    if (!cfg || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_sam_new: NULL config or output");
    if (!(cfg->rho >= 0) || !isfinite(cfg->rho))
        return cm_set_error(CM_ERR_INVALID_ARG, "SAM: rho %g must be non-negative and finite", cfg->rho);
    if (!(cfg->epsilon >= 0) || !isfinite(cfg->epsilon))
        return cm_set_error(CM_ERR_INVALID_ARG, "SAM: epsilon %g must be non-negative and finite", cfg->epsilon);
    if (cfg->interval < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "SAM: interval %lld must be at least 1 (SAM runs on every interval-th "
                                                "step)", (long long)cfg->interval);
    sam *a = cm_alloc_zeroed(sizeof *a, 16);
    if (!a) return cm_set_error(CM_ERR_OOM, "SAM: out of memory");
    a->rho = cfg->rho, a->epsilon = cfg->epsilon, a->interval = cfg->interval;
    *out = (cm_algorithm_plugin){&sam_vt, a};
    return CM_OK;
}
