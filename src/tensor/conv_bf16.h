/* Our own bf16 convolution kernels for 3x3, stride-1, pad-1 convolutions on channels-last
 * activations (private to the tensor layer; conv_bf16.c says how they work and why): backward-
 * weights, and one direct kernel for forward and backward-data. conv.c runs them instead of
 * oneDNN's bf16 primitives where they fit, per pass as CM_CONV_BF16_OWN says
 * (cmi_conv_get_own_passes in dnnl_conv.h). */
#ifndef CM_CONV_BF16_H
#define CM_CONV_BF16_H

#include "tensor/dnnl_conv.h"

/* Whether the kernel handles g: this CPU has AVX512-BF16 (and AVX512-BW), g is channels-last,
 * one group, 3x3, stride 1, padding 1, dilation 1, W even, Cin and Cout multiples of 16. */
bool cmi_conv_wgrad_bf16_fits(const cmi_conv_geom *g);

/* dW (Cout, Cin, 3, 3) f32 += Σ over images and pixels of dy ⊗ the shifted x, with x (N, H, W,
 * Cin) and dy (N, H, W, Cout) each stored as bf16 or f32 (xs, dys; f32 values are rounded to bf16
 * to nearest even first, as oneDNN's reorder does) and f32 products added up in f32. g must fit
 * (cmi_conv_wgrad_bf16_fits; otherwise CM_ERR_INTERNAL). Runs on cm_num_threads() threads, with
 * arena scratch (CM_ERR_OOM on tp when short). */
cm_status cmi_conv_wgrad_bf16(cm_tape *tp, const cmi_conv_geom *g, cm_dtype xs, const void *x, cm_dtype dys,
                              const void *dy, float *dW);

/* Whether the direct kernel (forward and backward-data) handles g: as cmi_conv_wgrad_bf16_fits,
 * with Cin and Cout each 16, 32 or 64 and W a multiple of 8. */
bool cmi_conv_direct_bf16_fits(const cmi_conv_geom *g);

/* Whether the Winograd F(2x2, 3x3) kernel (conv_bf16.c) handles g: as the direct kernel, with H
 * even and blocks of whole tile rows whose 2x2 tiles are a multiple of 16 and at most 128 (W 8
 * needs H a multiple of 8, W 16 a multiple of 4). cmi_conv_fwd_bf16 and cmi_conv_bwd_data_bf16
 * run it instead of the direct kernel where it fits, unless cmi_conv_get_algo() is DIRECT. */
bool cmi_conv_winograd_bf16_fits(const cmi_conv_geom *g);

/* y (N, H, W, Cout) = conv(x, w) for a g the direct kernel fits: x bf16 (N, H, W, Cin), w (Cout,
 * Cin, 3, 3) f32 (rounded to bf16, nearest even) or bf16 (ws), y f32 or bf16 (ys: the f32 sum
 * rounded to nearest even); products of bf16 values added up in f32. Overwrites y. */
cm_status cmi_conv_fwd_bf16(cm_tape *tp, const cmi_conv_geom *g, const uint16_t *x, cm_dtype ws, const void *w,
                            cm_dtype ys, void *y);
/* dx (N, H, W, Cin) = backward-data(dy, w) for a g the direct kernel fits: dy bf16 (N, H, W,
 * Cout), w and dx as w and y of cmi_conv_fwd_bf16. Overwrites dx, or with accumulate (f32 dx
 * only) adds to it — in the kernel's store, no scratch and no pass of its own. */
cm_status cmi_conv_bwd_data_bf16(cm_tape *tp, const cmi_conv_geom *g, const uint16_t *dy, cm_dtype ws, const void *w,
                                 cm_dtype dxs, void *dx, bool accumulate);

#endif
