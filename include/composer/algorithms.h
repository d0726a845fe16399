/*
 * composer/algorithms.h — training algorithms: each as a plain function over flat gradient spans
 * (the functional API) and as a plugin for the trainer (match/apply), after Composer.
 *
 * GradientClipping (Composer's GradientClipping, applied on AFTER_TRAIN_BATCH, i.e. after the
 * last microbatch's backward and before the optimizer step):
 *   norm      torch.nn.utils.clip_grad_norm_: the global L2 norm ‖g‖ of all gradients; every
 *             gradient is multiplied by min(1, threshold / (‖g‖ + 1e-6)).
 *   value     torch.nn.utils.clip_grad_value_: every element clamped to [-threshold, threshold].
 *   adaptive  Adaptive gradient clipping (Brock et al., Composer's _apply_agc), per parameter and
 *             per unit (the whole tensor for ≤ 1 dims, each row (dim 1 norm) of 2-D and 3-D
 *             tensors, each output filter (dims 1..3) of 4-D ones): with w = max(‖W_unit‖, 1e-6)
 *             and n = ‖G_unit‖, the unit's gradient is scaled by threshold·w / max(n, 1e-6) when
 *             n > threshold·w (Composer keeps the gradient when n < threshold·w; at equality the
 *             scale is 1 either way up to rounding).
 * Norms accumulate in double (torch in f32), so results agree with torch to f32 rounding.
 *
 *     cm_algorithm_plugin clip;
 *     if (cm_grad_clip_new(CM_GRAD_CLIP_NORM, 1.0, &clip) != CM_OK) ...;
 *     cfg.algorithms = &clip; cfg.n_algorithms = 1;            // the trainer takes it
 *
 *     double total;                                            // or by hand, on a model:
 *     cm_grad_clip_module(cm_model_module(model), CM_GRAD_CLIP_NORM, 1.0, &total);
 */
#ifndef COMPOSER_ALGORITHMS_H
#define COMPOSER_ALGORITHMS_H

#include <composer/trainer.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CM_GRAD_CLIP_TYPE_LIST(X)            \
    X(CM_GRAD_CLIP_NORM, "norm")             \
    X(CM_GRAD_CLIP_VALUE, "value")           \
    X(CM_GRAD_CLIP_ADAPTIVE, "adaptive")

typedef enum cm_grad_clip_type {
#define CM_X_(name, str) name,
    CM_GRAD_CLIP_TYPE_LIST(CM_X_)
#undef CM_X_
    CM_GRAD_CLIP_TYPE_COUNT
} cm_grad_clip_type;

const char *cm_grad_clip_type_name(cm_grad_clip_type t); /* "norm"; "?" out of range */
/* Case-insensitive; CM_ERR_INVALID_ARG listing the names otherwise. */
cm_status cm_grad_clip_type_parse(const char *s, cm_grad_clip_type *out);

/* Global-norm clipping over n gradient spans (grads[i] holds lens[i] floats): *total_norm (if
 * not NULL) gets the norm before clipping. Errors: CM_ERR_INVALID_ARG (max_norm not > 0 and
 * finite, NULL span with a positive length). Uses OpenMP for large spans. */
cm_status cm_grad_clip_norm(float *const *grads, const int64_t *lens, int n, double max_norm, double *total_norm);
/* Elementwise clamp to [-clip_value, clip_value]. Errors as above. */
cm_status cm_grad_clip_value(float *const *grads, const int64_t *lens, int n, double clip_value);
/* Adaptive clipping of one parameter's gradient (param and grad contiguous, shape (ndim dims)).
 * Errors: CM_ERR_INVALID_ARG (threshold not > 0, NULL pointers), CM_ERR_SHAPE (more than 4 dims,
 * as Composer). */
cm_status cm_grad_clip_adaptive(const float *param, float *grad, int ndim, const int64_t *shape, double threshold);

/* Clips the gradients of a finalized module tree: norm and value over the units' flat gradient
 * buffers, adaptive per parameter. *total_norm (norm only; may be NULL) gets the norm before
 * clipping. Errors: CM_ERR_STATE (not finalized), the functions' errors. */
cm_status cm_grad_clip_module(cm_module *root, cm_grad_clip_type type, double threshold, double *total_norm);

/* The GradientClipping algorithm (name "GradientClipping"): on AFTER_TRAIN_BATCH, clips the
 * model's gradients with cm_grad_clip_module. Errors: CM_ERR_INVALID_ARG (bad type, threshold not
 * > 0 and finite), CM_ERR_OOM. */
cm_status cm_grad_clip_new(cm_grad_clip_type type, double threshold, cm_algorithm_plugin *out);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_ALGORITHMS_H */
