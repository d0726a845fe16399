/* 2-d convolution through oneDNN's convolution primitives (private to the tensor layer), and the
 * choice between them and the im2col kernel in conv.c.
 *
 * Kernels: CM_CONV=dnnl (the default) runs forward, backward-data and backward-weights as oneDNN
 * primitives; CM_CONV=im2col runs conv.c's im2col + OpenBLAS kernel. When oneDNN has no
 * implementation for a problem (primitive creation answers "unimplemented"), that one pass falls
 * back — an f32 pass to im2col, a native bf16 pass to the widened f32 kernel — and
 * cmi_conv_stats counts it in `unimplemented`; any other oneDNN failure is an error.
 *
 * bf16 (explicit bf16 x and w, or f32 ones cast by autocast): CM_CONV_BF16=onednn runs oneDNN's
 * bf16 primitives (bf16 src/weights/diff_dst, f32 or bf16 dst and diff_src, f32 diff_weights, f32
 * accumulation);
 * CM_CONV_BF16=widen widens the bf16 operands to f32 (exactly) and runs the f32 kernel. The
 * default is onednn where oneDNN's ISA has bf16 instructions (cmi_bf16_native) and widen elsewhere
 * (AVX2 has no bf16 convolution; plain AVX-512 only emulates it). */
#ifndef CM_DNNL_CONV_H
#define CM_DNNL_CONV_H

#include "tensor/tensor_impl.h"

#include "tensor/backend.h" /* cmi_conv_geom */

typedef enum { CMI_CONV_DNNL, CMI_CONV_IM2COL } cmi_conv_kernel;
typedef enum { CMI_CONV_BF16_ONEDNN, CMI_CONV_BF16_WIDEN } cmi_conv_bf16_kernel;

/* The kernels in use: read from CM_CONV / CM_CONV_BF16 once; the setters change them (tests,
 * benchmarks). Not meant to change while a convolution runs on another thread. */
cmi_conv_kernel cmi_conv_get_kernel(void);
void cmi_conv_set_kernel(cmi_conv_kernel k);
cmi_conv_bf16_kernel cmi_conv_get_bf16_kernel(void);
void cmi_conv_set_bf16_kernel(cmi_conv_bf16_kernel k);

/* Activation layout inside the oneDNN primitives. AUTO (the default): channels-last tensors go to
 * the primitives as they are (nhwc has direct kernels), NCHW ones are reordered to and from the
 * blocked layout oneDNN picks (nChw16c, ...): on plain nchw oneDNN 2.6 runs a GEMM-based kernel
 * that is 5-50x slower than its direct ones, while a reorder costs about a tenth of a direct
 * pass (bench/conv). Except NCHW 1x1 stride-1 unpadded convolutions: those are one GEMM per
 * image on plain nchw, faster than the reorders. PLAIN and BLOCKED force one or the other. */
typedef enum { CMI_CONV_ACT_AUTO, CMI_CONV_ACT_PLAIN, CMI_CONV_ACT_BLOCKED } cmi_conv_act_layout;
cmi_conv_act_layout cmi_conv_get_act_layout(void);
void cmi_conv_set_act_layout(cmi_conv_act_layout l);

/* Our own bf16 kernels (conv_bf16.h) instead of oneDNN's bf16 primitives, per pass, where they
 * fit (3x3, stride 1, pad 1, channels-last, AVX512-BF16; forward and backward-weights without a
 * bias, forward with a bf16-stored x):
 * a mask of bits 1 << CMI_CONV_FWD / CMI_CONV_BWD_DATA / CMI_CONV_BWD_WEIGHTS, all set by default;
 * CM_CONV_BF16_OWN=none, or a comma list of fwd, data, weights, sets it. Only consulted where
 * the bf16 kernel is onednn. */
unsigned cmi_conv_get_own_passes(void);
void cmi_conv_set_own_passes(unsigned mask);

/* The f32 algorithm of oneDNN's primitives. DIRECT: direct convolution everywhere. WINOGRAD:
 * oneDNN's Winograd F(4x4, 3x3) kernel for every f32 3x3 stride-1 undilated ungrouped
 * convolution it has one for (AVX-512; Cin and Cout multiples of 16), direct elsewhere. AUTO (the
 * default): Winograd where it measured faster than direct on this machine kind (bench/conv: with
 * 32 and 64 channels about 1.7-2x per forward + backward, reorders to and from the blocked layout
 * included; with 16 channels slower): Cin and Cout multiples of 16 and at least 32, output at
 * least 4x4, oneDNN's ISA with AVX-512 (elsewhere it has no f32 Winograd: direct). Winograd rounds differently from direct (transforms in f32): test_conv bounds its
 * error against a double-precision reference. Passes that run Winograd work on oneDNN's blocked
 * activation layout whatever cmi_conv_act_layout says. bf16 (oneDNN has no bf16 Winograd): our own
 * kernels' forward and backward-data (conv_bf16.h) run our bf16 Winograd F(2x2, 3x3) where it fits
 * — WINOGRAD: always; AUTO: with 32 or more channels each way (1.2-1.3x their direct kernel per
 * pass there; with 16 no faster) — its transformed operands rounded to bf16 (error ~3x the direct
 * kernel's, bounded by test_conv). CM_CONV_ALGO=auto|direct|winograd sets it. */
typedef enum { CMI_CONV_ALGO_AUTO, CMI_CONV_ALGO_DIRECT, CMI_CONV_ALGO_WINOGRAD } cmi_conv_algo;
cmi_conv_algo cmi_conv_get_algo(void);
void cmi_conv_set_algo(cmi_conv_algo a);
/* Whether oneDNN's ISA (as capped now: ONEDNN_MAX_CPU_ISA, dnnl_set_max_cpu_isa) has its f32
 * Winograd kernels, AVX-512; the f32 Winograd is asked for only there. */
bool cmi_conv_winograd_f32_available(void);
/* Passes: forward, backward-data, backward-weights. */
enum { CMI_CONV_FWD, CMI_CONV_BWD_DATA, CMI_CONV_BWD_WEIGHTS, CMI_CONV_N_PASSES };

/* How many passes ran where, since the process started or the last reset (process-wide, atomic).
 * Tests use it to prove which kernel ran. A widened bf16 pass counts in `widened` and also in
 * dnnl or im2col (whichever computed it in f32). */
typedef struct {
    int64_t dnnl[CMI_CONV_N_PASSES];      /* oneDNN f32 primitives */
    int64_t dnnl_bf16[CMI_CONV_N_PASSES]; /* oneDNN bf16 primitives */
    int64_t im2col[CMI_CONV_N_PASSES];    /* conv.c's im2col kernel */
    int64_t widened[CMI_CONV_N_PASSES];   /* bf16 operands widened to f32 first */
    int64_t own_bf16[CMI_CONV_N_PASSES];  /* our own bf16 kernels (conv_bf16.h) */
    int64_t winograd[CMI_CONV_N_PASSES];  /* oneDNN f32 Winograd primitives (also counted in dnnl) */
    int64_t unimplemented;                /* passes oneDNN refused, run on a fallback instead */
} cmi_conv_stats;
void cmi_conv_stats_get(cmi_conv_stats *s);
void cmi_conv_stats_reset(void);
/* Counts one pass (CMI_CONV_FWD, ...) on a path; used by conv.c and dnnl_conv.c. */
typedef enum {
    CMI_CONV_RAN_DNNL,
    CMI_CONV_RAN_DNNL_BF16,
    CMI_CONV_RAN_IM2COL,
    CMI_CONV_RAN_WIDENED,
    CMI_CONV_RAN_OWN_BF16,
    CMI_CONV_RAN_WINOGRAD,
    CMI_CONV_N_PATHS
} cmi_conv_path;
void cmi_conv_stats_note(cmi_conv_path path, int pass);
void cmi_conv_stats_note_unimplemented(void);

/* Passes through oneDNN. dt is the dtype the convolution computes in (f32, or bf16: needs the
 * bf16 ISA or oneDNN's emulation); xs and ws the dtypes x and w are stored in: dt, or f32 in a
 * bf16 convolution (autocast), which the reorder into the primitive's layout rounds to bf16 on
 * the way. ys, y's storage: f32, or bf16 for a bf16 convolution (written by the primitive
 * directly); dys likewise dy's (a bf16 dy in the primitive's layout is read as it is), and dxs
 * dx's (a bf16 dx, for a bf16 convolution, is written by backward-data directly, rounded to
 * nearest even; each dtype its own cached primitive). dw and db are f32. Layouts: x, dx (N, Cin,
 * H, W) or channels-last (N, H, W, Cin); y, dy likewise with Cout; w, dw (Cout, Cin/g, kh, kw);
 * bias, db (Cout) or NULL. Outputs are overwritten (not accumulated). The *ran flags are false (and that
 * output untouched) for a pass oneDNN has no implementation for; other failures are recorded on
 * tp (CM_ERR_INTERNAL naming the oneDNN status and the shapes, CM_ERR_OOM for arena scratch).
 * Primitives are created once per problem and cached for the life of the process (thread-safe).
 *
 * Forward: y = conv(x, w) + bias. */
cm_status cmi_dnnl_conv_forward(cm_tape *tp, const cmi_conv_geom *g, cm_dtype dt, cm_dtype xs, cm_dtype ws,
                                const void *x, const void *w, const float *bias, cm_dtype ys, void *y, bool *ran);
/* Backward: dx (NULL: not wanted) = backward-data(dy, w); dw (NULL: not wanted) and db (NULL, or
 * with dw) = backward-weights(x, dy). dy is reordered to the primitives' layout once for both
 * passes; for bf16 that same reorder rounds it to bf16 (round to nearest even). */
cm_status cmi_dnnl_conv_backward(cm_tape *tp, const cmi_conv_geom *g, cm_dtype dt, cm_dtype xs, cm_dtype ws,
                                 const void *x, const void *w, cm_dtype dys, const void *dy, cm_dtype dxs, void *dx,
                                 float *dw, float *db, bool *ran_data, bool *ran_weights);

/* Number of problems in the primitive cache (tests: repeated calls must not grow it). */
int cmi_dnnl_conv_cache_size(void);

#endif
