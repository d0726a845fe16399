/* Private helpers shared by the vision zoo (mlp.c, cnn.c, resnet.c): preset-name errors and the
 * classifier model wrapper that reports FLOPs for the batch's image size. Not installed. */
#ifndef CM_ZOO_VISION_IMPL_H
#define CM_ZOO_VISION_IMPL_H

#include <composer/zoo_vision.h>

/* Records CM_ERR_INVALID_ARG "<fn>: unknown preset '<name>' (did you mean '<closest>'? valid: a,
 * b, c)" and returns it. */
cm_status cmz_unknown_preset(const char *fn, const char *name, const char *const *names, int n);

/* Forward FLOPs of one sample of h × w pixels for the configuration `cfg`. */
typedef double (*cmz_flops_fn)(const void *cfg, int64_t h, int64_t w);

/* Wraps net in the classifier of model.h (input "image", target "label") and reports
 * 3 × flops(cfg, H, W) per sample for the batch's "image" (B, C, H, W). Copies cfg (cfg_bytes).
 * Takes net in every case: on failure it is freed. */
cm_status cmz_vision_model_new(cm_module *net, cmz_flops_fn flops, const void *cfg, size_t cfg_bytes,
                               cm_model **out);

/* Frees a half-built module and passes the status on (for `return cmz_fail_build(&m, st)`). */
cm_status cmz_fail_build(cm_module **m, cm_status st);

#endif
