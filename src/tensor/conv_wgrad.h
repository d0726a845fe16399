/* Our own bf16 backward-weights kernel for 3x3, stride-1, pad-1 convolutions on channels-last
 * activations (private to the tensor layer; conv_wgrad.c says how it works and why). conv.c runs
 * it instead of oneDNN's bf16 backward-weights where it fits, unless CM_CONV_BF16_WGRAD=onednn
 * (cmi_conv_set_own_wgrad in dnnl_conv.h). */
#ifndef CM_CONV_WGRAD_H
#define CM_CONV_WGRAD_H

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

#endif
