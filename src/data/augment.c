/* Image augmentation: random crop with zero padding and horizontal flip, drawn from Philox keyed by
 * (seed, epoch, sample index) so a sample's augmentation never depends on who computes it. */
#include "data/image_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Augmentation draws from its own family of streams, away from whatever streams the sampler and
 * model initialisation use with the same seed: stream = this base + epoch. */
#define CM_AUG_STREAM_BASE 0x4155474d00000000ull /* "AUGM" */

cm_image_augment cm_image_augment_default(void) { return (cm_image_augment){.crop_padding = 4, .hflip_p = 0.5f}; }

bool cm_image_augment_enabled(const cm_image_augment *aug) {
    return aug->crop_padding > 0 || aug->hflip_p > 0.0f || aug->u8_transform;
}

cm_status cm_image_augment_u8(const cm_image_augment *aug, const cm_sample_ctx *ctx, int64_t index, int64_t C, int64_t H,
                              int64_t W, const uint8_t *src, uint8_t *dst, const char *who) {
    cm_image_augment_params p = cm_image_augment_draw(aug, ctx->seed, ctx->epoch, index);
    cm_image_transform_u8(&p, C, H, W, src, dst);
    if (!aug->u8_transform) return CM_OK;
    cm_status s = aug->u8_transform(dst, C, H, W, ctx->seed, ctx->epoch, index, aug->u8_transform_data);
    if (s) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "%s: sample %lld (epoch %lld): the augment's u8 transform: %s", who, (long long)index,
                            (long long)ctx->epoch, msg);
    }
    return CM_OK;
}

cm_status cm_image_augment_check(const cm_image_augment *aug, const char *who) {
    if (aug->crop_padding < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: augment.crop_padding is %d (must be >= 0; 0 disables the crop)", who,
                            aug->crop_padding);
    if (!(aug->hflip_p >= 0.0f && aug->hflip_p <= 1.0f))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: augment.hflip_p is %g (must be a probability in [0, 1])", who,
                            (double)aug->hflip_p);
    return CM_OK;
}

cm_image_augment_params cm_image_augment_draw(const cm_image_augment *aug, uint64_t seed, int64_t epoch,
                                              int64_t index) {
    cm_image_augment_params p = {0, 0, false};
    uint32_t w[4];
    cm_philox4x32(seed, CM_AUG_STREAM_BASE + (uint64_t)epoch, (uint64_t)index, w);
    if (aug->crop_padding > 0) {
        uint64_t span = 2 * (uint64_t)aug->crop_padding + 1;
        p.shift_y = (int)(((uint64_t)w[0] * span) >> 32) - aug->crop_padding;
        p.shift_x = (int)(((uint64_t)w[1] * span) >> 32) - aug->crop_padding;
    }
    if (aug->hflip_p > 0.0f) p.flip = (float)(w[2] >> 8) * (1.0f / 16777216.0f) < aug->hflip_p;
    return p;
}

/* out[c][y][x] = in[c][y + sy][xs + sx] with xs = flip ? W-1-x : x, 0 outside. Rows are handled as
 * a valid column range plus zero borders so the inner loop is a copy (or a reversed copy). */
#define CM_TRANSFORM(NAME, T)                                                                     \
    void NAME(const cm_image_augment_params *p, int64_t C, int64_t H, int64_t W, const T *in, T *out) { \
        const int64_t sy = p->shift_y, sx = p->shift_x;                                           \
        for (int64_t c = 0; c < C; c++) {                                                         \
            const T *ic = in + c * H * W;                                                         \
            T *oc = out + c * H * W;                                                              \
            for (int64_t y = 0; y < H; y++) {                                                     \
                T *orow = oc + y * W;                                                             \
                int64_t iy = y + sy;                                                              \
                if (iy < 0 || iy >= H) {                                                          \
                    memset(orow, 0, (size_t)W * sizeof(T));                                       \
                    continue;                                                                     \
                }                                                                                 \
                const T *irow = ic + iy * W;                                                      \
                /* source column of output x (before flip): xs + sx must lie in [0, W) */        \
                int64_t lo = sx < 0 ? -sx : 0, hi = sx > 0 ? W - sx : W; /* valid xs: [lo, hi) */ \
                if (hi < lo) hi = lo;                                                             \
                if (!p->flip) {                                                                   \
                    for (int64_t x = 0; x < lo && x < W; x++) orow[x] = 0;                        \
                    for (int64_t x = lo; x < hi; x++) orow[x] = irow[x + sx];                     \
                    for (int64_t x = hi; x < W; x++) orow[x] = 0;                                 \
                } else {                                                                          \
                    for (int64_t x = 0; x < W; x++) {                                             \
                        int64_t xs = W - 1 - x;                                                   \
                        orow[x] = (xs >= lo && xs < hi) ? irow[xs + sx] : (T)0;                   \
                    }                                                                             \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
    }
static CM_TRANSFORM(transform_f32, float)
CM_TRANSFORM(cm_image_transform_u8, uint8_t)
#undef CM_TRANSFORM

cm_status cm_image_transform(const cm_image_augment_params *p, int64_t C, int64_t H, int64_t W, const float *in,
                             float *out) {
    if (!p || !in || !out)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_image_transform: params, in and out must not be NULL");
    if (C < 1 || H < 1 || W < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_image_transform: image shape (%lld, %lld, %lld) must be >= 1 in "
                            "every dim", (long long)C, (long long)H, (long long)W);
    if (in == out)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_image_transform: in and out are the same buffer (use a separate "
                            "output)");
    transform_f32(p, C, H, W, in, out);
    return CM_OK;
}

cm_status cm_image_augment_apply(const cm_image_augment *aug, uint64_t seed, int64_t epoch, int64_t index,
                                 int64_t C, int64_t H, int64_t W, const float *in, float *out) {
    if (!aug) return cm_set_error(CM_ERR_INVALID_ARG, "cm_image_augment_apply: aug is NULL");
    cm_status st = cm_image_augment_check(aug, "cm_image_augment_apply");
    if (st != CM_OK) return st;
    cm_image_augment_params p = cm_image_augment_draw(aug, seed, epoch, index);
    return cm_image_transform(&p, C, H, W, in, out);
}

cm_status cm_image_normalize(float *img, int64_t C, int64_t hw, const float *mean, const float *std) {
    if (!img || !mean || !std || C < 1 || hw < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_image_normalize: need an image, C >= 1 (got %lld), hw >= 1 "
                            "(got %lld), mean and std", (long long)C, (long long)hw);
    for (int64_t c = 0; c < C; c++)
        if (!(std[c] > 0.0f))
            return cm_set_error(CM_ERR_INVALID_ARG, "cm_image_normalize: std[%lld] is %g (must be > 0)", (long long)c,
                                (double)std[c]);
    for (int64_t c = 0; c < C; c++) {
        float m = mean[c], s = std[c];
        float *row = img + c * hw;
        for (int64_t i = 0; i < hw; i++) row[i] = (row[i] - m) / s;
    }
    return CM_OK;
}

void cm_image_make_lut(float lut[256], float mean, float std) {
    for (int v = 0; v < 256; v++) lut[v] = ((float)v / 255.0f - mean) / std;
}
