/* GradientClipping: the functional forms (norm, value, adaptive over flat spans) and the
 * algorithm plugin that applies them on AFTER_TRAIN_BATCH — over the model's flat gradients, or
 * under a sharded strategy over this rank's shard spans with the norm summed over ranks. */
#include <composer/algorithms.h>

#include "tensor/backend.h"
#include "tensor/tensor_impl.h"

#include <math.h>
#include <strings.h>

static const char *const clip_names[] = {
#define CM_X_(name, str) str,
    CM_GRAD_CLIP_TYPE_LIST(CM_X_)
#undef CM_X_
};
_Static_assert(sizeof clip_names / sizeof *clip_names == CM_GRAD_CLIP_TYPE_COUNT, "clip type table");

const char *cm_grad_clip_type_name(cm_grad_clip_type t) {
    return (unsigned)t < CM_GRAD_CLIP_TYPE_COUNT ? clip_names[t] : "?";
}

cm_status cm_grad_clip_type_parse(const char *s, cm_grad_clip_type *out) {
    for (int i = 0; s && i < CM_GRAD_CLIP_TYPE_COUNT; i++) {
        if (!strcasecmp(s, clip_names[i])) {
            *out = (cm_grad_clip_type)i;
            return CM_OK;
        }
    }
    return cm_set_error(CM_ERR_INVALID_ARG, "clipping_type '%s' is not known (use norm, value or adaptive)",
                        s ? s : "(null)");
}

static cm_status check_spans(const char *what, float *const *grads, const int64_t *lens, int n, double thr) {
    if (!(thr > 0) || !isfinite(thr))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: the threshold %g must be > 0 and finite", what, thr);
    if (n < 0 || (n > 0 && (!grads || !lens)))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: %d spans without arrays", what, n);
    for (int i = 0; i < n; i++)
        if (lens[i] < 0 || (lens[i] > 0 && !grads[i]))
            return cm_set_error(CM_ERR_INVALID_ARG, "%s: span %d has length %lld and %s data", what, i,
                                (long long)lens[i], grads[i] ? "some" : "no");
    return CM_OK;
}

/* Spans in GPU memory (a model moved with cm_module_to_device) are reduced and scaled there. */
static double sumsq(const float *g, int64_t n) {
    const cm_device d = cmi_ptr_device(g);
    if (d != CM_DEVICE_CPU) {
        double r = NAN; /* a failed device call makes the norm NaN: clipping then reports it */
        if (cmi_backend_get(d)->sumsq(g, n, &r)) return NAN;
        return r;
    }
    double acc = 0;
#pragma omp parallel for schedule(static) reduction(+ : acc) if (n > 65536)
    for (int64_t i = 0; i < n; i++) acc += (double)g[i] * g[i];
    return acc;
}

static void scale(float *g, int64_t n, float c) {
    const cm_device d = cmi_ptr_device(g);
    if (d != CM_DEVICE_CPU) {
        cmi_backend_get(d)->unary(CMI_UN_MUL_S, c, 0.0f, g, g, NULL, 1, &n);
        return;
    }
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) g[i] *= c;
}

/* Norm clipping with the sum of squares summed over ranks by st (NULL: this process only);
 * uncounted[i] (NULL: none) leaves span i out of the sum (a HYBRID_SHARD replica's piece, which
 * its first shard group's rank counts) but not out of the scaling. */
static cm_status clip_norm(float *const *grads, const int64_t *lens, int n, double max_norm, double *total_norm,
                           const cm_state *st, const bool *uncounted) {
    cm_status s = check_spans("clip_grad_norm", grads, lens, n, max_norm);
    if (s) return s;
    double ss = 0;
    for (int i = 0; i < n; i++)
        if (!uncounted || !uncounted[i]) ss += sumsq(grads[i], lens[i]);
    if (isnan(ss) && cm_last_status() == CM_ERR_DEVICE) return CM_ERR_DEVICE;
    if (st && (s = cm_state_all_reduce_sum(st, &ss, 1))) return s;
    const double total = sqrt(ss);
    if (total_norm) *total_norm = total;
    /* torch 1.13: clip_coef = max_norm / (total + 1e-6), clamped to 1, always multiplied */
    const double coef = fmin(max_norm / (total + 1e-6), 1.0);
    if (coef < 1.0)
        for (int i = 0; i < n; i++) scale(grads[i], lens[i], (float)coef);
    return CM_OK;
}

cm_status cm_grad_clip_norm(float *const *grads, const int64_t *lens, int n, double max_norm, double *total_norm) {
    return clip_norm(grads, lens, n, max_norm, total_norm, NULL, NULL);
}

cm_status cm_grad_clip_value(float *const *grads, const int64_t *lens, int n, double clip_value) {
    cm_status s = check_spans("clip_grad_value", grads, lens, n, clip_value);
    if (s) return s;
    const float v = (float)clip_value;
    for (int i = 0; i < n; i++) {
        float *g = grads[i];
        int64_t len = lens[i];
        const cm_device d = cmi_ptr_device(g);
        if (d != CM_DEVICE_CPU) {
            if ((s = cmi_backend_get(d)->unary(CMI_UN_CLAMP, -v, v, g, g, NULL, 1, &len))) return s;
            continue;
        }
#pragma omp parallel for schedule(static) if (len > 65536)
        for (int64_t k = 0; k < len; k++) g[k] = fminf(fmaxf(g[k], -v), v);
    }
    return CM_OK;
}

cm_status cm_grad_clip_adaptive(const float *param, float *grad, int ndim, const int64_t *shape, double threshold) {
    if (!(threshold > 0) || !isfinite(threshold))
        return cm_set_error(CM_ERR_INVALID_ARG, "adaptive clipping: the threshold %g must be > 0 and finite", threshold);
    if (ndim < 0 || (ndim > 0 && !shape))
        return cm_set_error(CM_ERR_INVALID_ARG, "adaptive clipping: bad shape (ndim %d)", ndim);
    if (ndim > 4)
        return cm_set_error(CM_ERR_SHAPE, "adaptive clipping: a %d-d parameter has no unit-wise norm (1 to 4 dims, as "
                                          "Composer)", ndim);
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) numel *= shape[i];
    if (numel == 0) return CM_OK;
    if (!param || !grad) return cm_set_error(CM_ERR_INVALID_ARG, "adaptive clipping: NULL param or grad");
    if (cmi_ptr_device(grad) != CM_DEVICE_CPU)
        return cm_set_error(CM_ERR_UNSUPPORTED, "adaptive clipping is not implemented on the GPU yet (use norm or "
                                                "value clipping there)");
    /* Units: the whole tensor (≤ 1 dim); for 2-D and 3-D the norm over dim 1 (a 3-D tensor has
     * shape[0]·shape[2] units of shape[1] strided elements); for 4-D each output filter. */
    int64_t outer = 1, len = numel, inner = 1;
    if (ndim == 2 || ndim == 3) {
        outer = shape[0];
        len = shape[1];
        inner = ndim == 3 ? shape[2] : 1;
    } else if (ndim == 4) {
        outer = shape[0];
        len = numel / shape[0];
    }
#pragma omp parallel for schedule(static) collapse(2) if (numel > 65536)
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t in = 0; in < inner; in++) {
            const int64_t base = o * len * inner + in;
            double wn = 0, gn = 0;
            for (int64_t k = 0; k < len; k++) {
                const double w = param[base + k * inner], g = grad[base + k * inner];
                wn += w * w, gn += g * g;
            }
            const double max_norm = fmax(sqrt(wn), 1e-6) * threshold, gnorm = sqrt(gn);
            if (gnorm > max_norm) { /* Composer keeps the gradient when gnorm < max_norm */
                const float c = (float)(max_norm / fmax(gnorm, 1e-6));
                for (int64_t k = 0; k < len; k++) grad[base + k * inner] *= c;
            }
        }
    }
    return CM_OK;
}

cm_status cm_grad_clip_module(cm_module *root, cm_grad_clip_type type, double threshold, double *total_norm) {
    if (!root || !cm_module_is_finalized(root))
        return cm_set_error(CM_ERR_STATE, "gradient clipping: the module tree is %s", root ? "not finalized" : "NULL");
    if (type == CM_GRAD_CLIP_ADAPTIVE) {
        const int64_t n = cm_module_n_params(root);
        for (int64_t i = 0; i < n; i++) {
            cm_param_info p = cm_module_param_info(root, i);
            if (!p.requires_grad) continue;
            const cm_tensor *g = cm_tensor_grad(p.tensor);
            if (!g) continue;
            cm_status s = cm_grad_clip_adaptive(cm_tensor_data(p.tensor), cm_tensor_data(g), cm_tensor_ndim(p.tensor),
                                                cm_tensor_shape(p.tensor), threshold);
            if (s) return s;
        }
        return CM_OK;
    }
    enum { MAXU = 256 };
    int n = cm_module_n_units(root);
    if (n > MAXU) return cm_set_error(CM_ERR_UNSUPPORTED, "gradient clipping: more than %d units", MAXU);
    float *grads[MAXU];
    int64_t lens[MAXU];
    for (int i = 0; i < n; i++) {
        const cm_unit_info *u = cm_module_unit(root, i);
        grads[i] = u->grads;
        lens[i] = u->numel;
    }
    if (type == CM_GRAD_CLIP_NORM) return cm_grad_clip_norm(grads, lens, n, threshold, total_norm);
    if (type == CM_GRAD_CLIP_VALUE) return cm_grad_clip_value(grads, lens, n, threshold);
    return cm_set_error(CM_ERR_INVALID_ARG, "gradient clipping: type %d is not valid", (int)type);
}

/* ---- the algorithm ---- */

typedef struct {
    cm_grad_clip_type type;
    double threshold;
} grad_clip;

static bool gc_match(void *self, cm_event ev, const cm_state *st) { return ev == CM_EVENT_AFTER_TRAIN_BATCH; }

/* Under a sharded strategy each rank holds the global gradient of its pieces only: the norm is
 * the square root of the sum over ranks of each rank's sum of squares, and every rank scales its
 * pieces by the same coefficient. */
static cm_status clip_shards(const grad_clip *gc, cm_state *st, const cm_shard_span *sp, int n) {
    if (gc->type == CM_GRAD_CLIP_ADAPTIVE)
        return cm_set_error(CM_ERR_UNSUPPORTED, "adaptive clipping needs whole parameters, and under a sharded "
                                                "strategy a rank holds pieces of them (use clipping_type norm or "
                                                "value, or sharding_strategy NO_SHARD)");
    enum { MAXU = 256 };
    if (n > MAXU) return cm_set_error(CM_ERR_UNSUPPORTED, "gradient clipping: more than %d units", MAXU);
    float *grads[MAXU];
    int64_t lens[MAXU];
    bool replica[MAXU];
    for (int i = 0; i < n; i++) grads[i] = sp[i].grads, lens[i] = sp[i].end - sp[i].begin, replica[i] = sp[i].replica;
    if (gc->type == CM_GRAD_CLIP_VALUE) return cm_grad_clip_value(grads, lens, n, gc->threshold);
    return clip_norm(grads, lens, n, gc->threshold, NULL, st, replica);
}

static cm_status gc_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    grad_clip *gc = self;
    cm_model *m = cm_state_model(st);
    if (!m) return cm_set_error(CM_ERR_STATE, "the state has no model");
    int n_sh = 0;
    const cm_shard_span *sh = cm_state_shard_spans(st, &n_sh);
    if (sh) return clip_shards(gc, st, sh, n_sh);
    return cm_grad_clip_module(cm_model_module(m), gc->type, gc->threshold, NULL);
}

static void gc_free(void *self) { cm_free(self); }

static const cm_algorithm_i grad_clip_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "GradientClipping",
    .match = gc_match,
    .apply = gc_apply,
    .free = gc_free,
};

cm_status cm_grad_clip_new(cm_grad_clip_type type, double threshold, cm_algorithm_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_grad_clip_new: out is NULL");
    if ((unsigned)type >= CM_GRAD_CLIP_TYPE_COUNT)
        return cm_set_error(CM_ERR_INVALID_ARG, "GradientClipping: clipping_type %d is not valid (norm, value, adaptive)",
                            (int)type);
    if (!(threshold > 0) || !isfinite(threshold))
        return cm_set_error(CM_ERR_INVALID_ARG, "GradientClipping: clipping_threshold %g must be > 0 and finite",
                            threshold);
    grad_clip *gc = cm_alloc_zeroed(sizeof *gc, 16);
    if (!gc) return CM_ERR_OOM;
    gc->type = type, gc->threshold = threshold;
    *out = (cm_algorithm_plugin){&grad_clip_vt, gc};
    return CM_OK;
}
