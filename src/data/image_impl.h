/* Private: image helpers shared by the MNIST and CIFAR datasets. */
#ifndef CM_DATA_IMAGE_IMPL_H
#define CM_DATA_IMAGE_IMPL_H

#include <composer/datasets.h>

/* CM_ERR_INVALID_ARG (prefixed with `who`) for a negative padding or hflip_p outside [0, 1]. */
cm_status cm_image_augment_check(const cm_image_augment *aug, const char *who);
bool cm_image_augment_enabled(const cm_image_augment *aug);

/* cm_image_transform on u8 pixels (the datasets augment before converting to float). */
void cm_image_transform_u8(const cm_image_augment_params *p, int64_t C, int64_t H, int64_t W, const uint8_t *in,
                           uint8_t *out);

/* The training augmentation of one u8 image: the crop and flip drawn for (ctx, index) from src into
 * dst, then aug->u8_transform on dst; its error is prefixed with `who`, the sample and the epoch. */
cm_status cm_image_augment_u8(const cm_image_augment *aug, const cm_sample_ctx *ctx, int64_t index, int64_t C, int64_t H,
                              int64_t W, const uint8_t *src, uint8_t *dst, const char *who);

/* lut[v] = (v/255 - mean) / std, computed in that order so results match the reference formula. */
void cm_image_make_lut(float lut[256], float mean, float std);

#endif
