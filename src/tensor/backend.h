/*
 * The device backends' kernel table (private to the tensor layer).
 *
 * An op's logic — argument and shape checks, output allocation, the backward node — is written
 * once in the op files of src/tensor/. Where the CPU path computes with loops over host memory, the device path
 * calls a slot of this table with device pointers, shapes and strides (in elements). One table per
 * device: the CUDA one lives in src/tensor/cuda/ (built with nvcc, or for the CUDA emulator), and a
 * build without CUDA has none (cmi_backend_get returns NULL and says why).
 *
 * Every slot returns CM_OK or an error recorded with cm_set_error naming the kernel and the CUDA
 * error (CM_ERR_DEVICE), or CM_ERR_OOM for device memory. Kernels are queued on the backend's
 * stream and run in order; results are visible to later kernels and copies at once, to the host
 * after memcpy (D2H), which waits.
 *
 * Semantics mirror the CPU code they replace (named at each slot), so CPU and GPU give the same
 * results up to floating-point summation order: the backend comparison tests
 * (tests/test_backend_ops.c) check each against the CPU.
 */
#ifndef CM_TENSOR_BACKEND_H
#define CM_TENSOR_BACKEND_H

#include <composer/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { CMI_H2D, CMI_D2H, CMI_D2D } cmi_copy_kind;

/* Binary elementwise ops (elementwise.c). */
typedef enum { CMI_BIN_ADD, CMI_BIN_SUB, CMI_BIN_MUL, CMI_BIN_DIV } cmi_bin_op;
/* Backward of binary ops: t = g·x (0), t = g/x (1), t = -g·o/x (2), t = -g (3). */
typedef enum { CMI_BWD_MUL = 0, CMI_BWD_DIV = 1, CMI_BWD_DIV_B = 2, CMI_BWD_NEG = 3 } cmi_bin_bwd_mode;
/* Unary elementwise ops (elementwise.c); p0, p1 are the scalar arguments. */
typedef enum {
    CMI_UN_NEG, CMI_UN_EXP, CMI_UN_LOG, CMI_UN_SQRT, CMI_UN_ABS, CMI_UN_RELU, CMI_UN_GELU_TANH, CMI_UN_GELU_ERF,
    CMI_UN_SILU, CMI_UN_TANH, CMI_UN_SIGMOID, CMI_UN_ADD_S, CMI_UN_MUL_S, CMI_UN_POW, CMI_UN_CLAMP, CMI_UN_COUNT
} cmi_un_op;
/* Reduction kernels (reduce.c): sums (in double), squared deviations from a per-output mean,
 * first extreme element (NaN propagates, the first NaN wins). */
typedef enum { CMI_RED_SUM, CMI_RED_SQDEV, CMI_RED_MAX, CMI_RED_MIN } cmi_red_kernel;

/* A reduction plan: the input split into kept dims (one output each) and reduced dims, both
 * collapsed where possible (reduce.c's plan_reduce). kcstride/rcstride are the strides of the same
 * dims in the contiguous layout of the input's shape (for the index of the chosen element). */
typedef struct cmi_red_plan {
    int nk, nr;
    int64_t kshape[CM_MAX_DIMS], kstride[CM_MAX_DIMS], kcstride[CM_MAX_DIMS];
    int64_t rshape[CM_MAX_DIMS], rstride[CM_MAX_DIMS], rcstride[CM_MAX_DIMS];
    int64_t n_out, n_red;
} cmi_red_plan;

/* What scaled dot-product attention computes (attention.c): q (B, H, T, D), k and v (B, H, S, D)
 * read through their strides; bias (f32, strides broadcast to (B, H, T, S)) or NULL; mrow (B, S)
 * f32 with 0 marking padded keys, or NULL; dropout from (seed, stream, counter) as cm_dropout draws
 * it over the contiguous (B, H, T, S) probabilities (rows > 0: the tape's row context over B). */
typedef struct cmi_attn_desc {
    const float *q, *k, *v;
    int64_t qs[4], ks[4], vs[4];
    const float *bias;
    int64_t bst[4];
    const float *mrow;
    int64_t B, H, T, S, D;
    float scale;
    bool causal;
    float dropout_p, keep_scale;
    uint64_t seed, stream, counter;
    int64_t rows, row_first;
    bool bthd; /* out and its gradient (B, T, H, D), else (B, H, T, D) */
    bool bf16; /* under bf16 autocast: the products may run on bf16 operands with f32 accumulation (the
                * tensor cores), q, k, v, P, dO and dS rounded to bf16 */
} cmi_attn_desc;

/* One optimizer update over a flat span (optim.c's sgd_range / adam_range). */
typedef struct cmi_sgd_args {
    float *p, *b; /* b: momentum buffer or NULL */
    const float *g;
    int64_t n;
    float l2, mom, one_minus_damp, keep, neg_lr;
    bool has_mom, first, nesterov, decay, use_l2;
} cmi_sgd_args;
typedef struct cmi_adam_args {
    float *p, *m, *v, *vmax;
    const float *g;
    int64_t n;
    float keep, l2, b1, omb1, b2, omb2, neg_step, bc2_sqrt, eps;
    bool decay, use_l2, amsgrad;
} cmi_adam_args;

/* The geometry of one 2-d convolution (conv.c validated it). Dilation is PyTorch's (1 = dense). */
typedef struct cmi_conv_geom {
    int64_t N, Cin, H, W, Cout, OH, OW, kh, kw;
    int64_t sh, sw, ph, pw, dh, dw, groups;
    bool cl; /* x and y are (N, H, W, C); otherwise (N, C, H, W). The weight is always (Cout, Cin/g, kh, kw). */
} cmi_conv_geom;

/* Batch norm over the (O, C, I) view of x (norm.c's bn_layout: NCHW is (N, C, H·W), channels-last
 * (N·H·W, C, 1)), forward: training computes the batch statistics (shifted one-pass moments in
 * double, shift = each channel's first value) and updates the running ones (strided; NULL for
 * none), eval reads them; y = (x - mean)·Q + R [+ res] [then ReLU] with Q = rstd·w, R = b. x and
 * y are f32 or bf16 alike (bf), res f32 or bf16 (rbf). mean, rstd, q, r: (C) each, written. */
typedef struct cmi_bn_args {
    int64_t O, C, I;
    const void *x;
    void *y;
    bool bf;
    const void *res;
    bool rbf, relu, training;
    const float *w, *b;
    float *rm, *rv;
    int64_t rms, rvs;
    float momentum, eps;
    float *mean, *rstd, *q, *r;
} cmi_bn_args;
/* Its backward (norm.c's batch_norm_backward): gz = g masked by the fused ReLU (y > 0 given y,
 * else recomputed from zq = the forward's Q then R), or g; gr (the residual's gradient) = gz
 * (gr_fresh) or += gz; gw += Σ gz·xhat, gb += Σ gz; gx (f32) = or += dx. Any output may be NULL. */
typedef struct cmi_bn_bwd_args {
    int64_t O, C, I;
    const void *x;
    bool bf;
    const void *g;
    bool gbf;
    const void *y;
    const float *zq;
    float *gr;
    bool gr_fresh;
    const float *mean, *rstd, *w;
    bool training;
    float *gw, *gb;
    float *gx;
    bool gx_fresh;
} cmi_bn_bwd_args;

/* Pooling (pool.c) of x read as (N, C, H, W) through element strides xs (n, c, h, w) into y, whose
 * (n, c, h, w) strides are ys; gradients gx (strides gxs) and gy (strides ys). Max: the first
 * maximum of each window (NaN wins), its h·W + w in arg (N, C, OH, OW) contiguous; avg: PyTorch's
 * avg_pool2d windows and divisor (include_pad); adaptive: windows [floor(i·H/OH), ceil((i+1)·H/OH)). */
typedef enum { CMI_POOL_MAX, CMI_POOL_AVG, CMI_POOL_ADAPTIVE } cmi_pool_kind;
typedef struct cmi_pool_desc {
    cmi_pool_kind kind;
    int64_t N, C, H, W, OH, OW;
    int64_t kh, kw, sh, sw, ph, pw;
    bool include_pad;
    int64_t xs[4], ys[4], gxs[4];
} cmi_pool_desc;

/* One output coordinate's two linear taps (pool.c's bilinear resize, PyTorch's source-index rule):
 * out = l0·in[i0] + l1·in[i1]. */
typedef struct cmi_lin_tap {
    int64_t i0, i1;
    float l0, l1;
} cmi_lin_tap;
/* A bilinear resize on the device: sizes and strides as a cmi_pool_desc (N, C, H, W, OH, OW, xs,
 * ys, gxs); taps in device memory: th (OH) then tw (OW) cmi_lin_tap, and for the backward, per
 * input row h the output rows [rh[2h], rh[2h+1]) whose taps read it (likewise rw per column). */
typedef struct cmi_resize_desc {
    cmi_pool_desc g;
    const cmi_lin_tap *th, *tw;
    const int64_t *rh, *rw;
} cmi_resize_desc;

typedef struct cmi_backend {
    const char *name; /* "cuda" */
    cm_device device;

    /* ---- runtime ---- */
    cm_status (*init)(void); /* idempotent; CM_OK, or why the device cannot be used */
    const char *(*describe)(void);
    /* Caching allocator: 256-byte aligned device memory, NULL + CM_ERR_OOM (naming the request
     * and the device's use) when the device or the budget is full. */
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    cm_status (*memcpy)(void *dst, const void *src, size_t bytes, cmi_copy_kind kind);
    cm_status (*memset)(void *p, int byte, size_t bytes);
    cm_status (*sync)(void);
    void (*mem_stats)(cm_device_memory *out);
    void (*reset_peak)(void);
    void (*set_budget)(size_t bytes);
    /* Whether p points into memory this backend handed out (a live allocation or a reserved
     * range, mapped or not). No device call. */
    bool (*owns)(const void *p);
    /* Bytes copied from the device to the host since the process started (memcpy and copy_start
     * downloads): what tests check crossed, e.g. that metrics did not download the logits. */
    uint64_t (*d2h_bytes)(void);

    /* ---- fixed-address ranges, pinned host memory, copies beside compute (cpu_offload) ----
     * A reserved range keeps its address while device memory is mapped behind it and unmapped
     * again (CUDA's virtual memory management), so tensors and tape nodes pointing into it stay
     * valid across a release, as FULL_SHARD's released pages keep theirs on the CPU. */
    size_t (*vm_granularity)(void);       /* ranges are multiples of this (2 MiB on a GPU) */
    void *(*vm_reserve)(size_t bytes);     /* address space only, rounded up; NULL + error */
    /* Maps memory behind the whole range (counted as allocated: peak, budget; contents undefined);
     * CM_ERR_OOM when the device or the budget is full. A mapped range is left as it is. */
    cm_status (*vm_map)(void *p);
    void (*vm_unmap)(void *p);             /* after the work queued so far; no-op when unmapped */
    void (*vm_release)(void *p);           /* unmaps, then gives the addresses back */
    /* A growable range (the tape's device arena): address space for `bytes` (0: as much as the
     * device has), *cap its size, mapped from its start as vm_extend(p, n) asks ([0, n) usable, n a
     * multiple of the granularity; only the new part is mapped and counted as allocated; CM_ERR_OOM
     * when the device or the budget is full). vm_unmap unmaps all of it, vm_release gives it back.
     * So the memory behind an arena is its high-water mark, as PyTorch's expandable segments. */
    void *(*vm_reserve_growable)(size_t bytes, size_t *cap);
    cm_status (*vm_extend)(void *p, size_t bytes);
    void *(*host_alloc)(size_t bytes);     /* pinned host memory (copies from it run asynchronously) */
    void (*host_free)(void *p);
    /* A copy on the copy stream, after the work queued on the compute stream so far; *ev is the
     * event that says it is done, given to exactly one of copy_join (the compute stream waits for
     * it: an upload before kernels read it) or copy_wait (the host waits: a download). */
    cm_status (*copy_start)(void *dst, const void *src, size_t bytes, cmi_copy_kind kind, void **ev);
    cm_status (*copy_test)(void *ev, bool *done); /* ev stays valid */
    cm_status (*copy_join)(void *ev);
    cm_status (*copy_wait)(void *ev);

    /* ---- copies and fills (tensor.c, views.c) ---- */
    /* dst[i] = v over an nd-dim strided view (dtype dt; v converted as cmi_store does). */
    cm_status (*fill)(void *dst, cm_dtype dt, int nd, const int64_t *shape, const int64_t *stride, double v);
    /* dst[i] = convert(src[i]) elementwise over `shape`; src strides may be 0 (broadcast). Same
     * conversions as cmi_load/cmi_store (through double; bf16/f16 rounded to nearest even). */
    cm_status (*copy)(void *dst, cm_dtype ddt, const int64_t *dstride, const void *src, cm_dtype sdt,
                      const int64_t *sstride, int nd, const int64_t *shape);
    /* dst[i] = start + i·step, row-major, contiguous (cm_tensor_arange_fill / cm_arange). */
    cm_status (*arange)(void *dst, cm_dtype dt, int64_t n, double start, double step);

    /* ---- elementwise, f32 (elementwise.c) ---- */
    /* out (contiguous, shape) = a op b, a and b read through their (broadcast) strides. */
    cm_status (*binary)(cmi_bin_op op, float *out, const float *a, const int64_t *sa, const float *b,
                        const int64_t *sb, int nd, const int64_t *shape);
    /* t (contiguous) = f(g, x, o) per mode: g and o contiguous, x through (broadcast) strides sx. */
    cm_status (*binary_bwd)(cmi_bin_bwd_mode mode, float *t, const float *g, const float *x, const int64_t *sx,
                            const float *o, int nd, const int64_t *shape);
    /* out (contiguous) = f(a) with a through strides sa. */
    cm_status (*unary)(cmi_un_op op, float p0, float p1, float *out, const float *a, const int64_t *sa, int nd,
                       const int64_t *shape);
    /* ga[i] += g[i]·f'(a[i], out[i]): ga, g, out contiguous, a through strides sa. */
    cm_status (*unary_bwd)(cmi_un_op op, float p0, float p1, float *ga, const float *g, const float *a,
                           const int64_t *sa, const float *out, int nd, const int64_t *shape);
    /* dst[i] += scale·src[i], dst contiguous over `shape`, src through (broadcast) strides. */
    cm_status (*add_scaled)(float *dst, const float *src, const int64_t *sstride, float scale, int nd,
                            const int64_t *shape);
    /* dst (strides dstride, with 0 on the dims summed over) += the sum of src (contiguous, shape)
     * over the dims where dstride is 0: cmi_accum's broadcast reduction. Sums in double. */
    cm_status (*accum)(float *dst, const int64_t *dstride, const float *src, int nd, const int64_t *shape);
    /* A self-check of the tensor cores' bf16 product (mma m16n8k16) with the fragment layout the
     * kernels assume (common.cuh's cmi_mma_16816): random A (16x16), B (16x8), C against a double
     * reference; *max_rel_err = max |D - ref| / max |ref|. Also ldmatrix, plain and transposing
     * (cmi_ldsm_x4*): CM_ERR_INTERNAL naming the lane and register where a register differs from the
     * layout the attention kernels assume. CM_ERR_UNSUPPORTED below sm_80. May be NULL (a backend
     * without tensor cores). */
    cm_status (*check_mma)(double *max_rel_err);

    /* ---- reductions (reduce.c) ---- */
    /* Over plan P of x: SUM writes out[o] = (float)(Σ·scale) (scale NaN gives NaN), SQDEV writes
     * out[o] = (float)(Σ(x - mean[o])²·scale) and needs mean (double, n_out); both also write
     * Σ·scale in double to sums (n_out, may be NULL). MAX/MIN write the extreme to out and, when
     * idx is not NULL, its index in the contiguous layout of x's shape to idx. */
    cm_status (*reduce)(cmi_red_kernel k, const cmi_red_plan *P, const float *x, const double *mean, double scale,
                        float *out, double *sums, int64_t *idx);
    /* ga[idx[o]] += g[o], o < n (each idx distinct). */
    cm_status (*scatter_add)(float *ga, const int64_t *idx, const float *g, int64_t n);
    /* ga[i] += scale·g[i·sg]·(x[i·sx] - m[i·sm]) over shape (reduce.c's var backward); ga contiguous. */
    cm_status (*var_bwd)(float *ga, const float *g, const int64_t *sg, const float *x, const int64_t *sx,
                         const float *m, const int64_t *sm, float scale, int nd, const int64_t *shape);
    /* softmax / log_softmax of contiguous x viewed as (outer, L, inner) along L; and their backward
     * gx += ... from y = the output and g (reduce.c). */
    cm_status (*softmax)(const float *x, float *y, int64_t outer, int64_t L, int64_t inner, bool log_out);
    cm_status (*softmax_bwd)(const float *y, const float *g, float *gx, int64_t outer, int64_t L, int64_t inner,
                             bool log_out);
    /* out[i] = (float)in[i]. */
    cm_status (*f64_to_f32)(float *out, const double *in, int64_t n);

    /* ---- GEMM (matmul.c) ---- */
    /* Row-major C (M, N), rows ldc apart, = op(A) (M, K) · op(B) (K, N) [+ bias (N)] [+ C when acc],
     * for `batch` entries at element strides sa, sb, sc (batch 1: one GEMM). A element (i, k) is at
     * a[ta ? k·lda + i : i·lda + k], B's likewise. A and B have dtype dt (f32 or bf16), C and bias
     * f32; f32 accumulation. */
    cm_status (*gemm)(cm_dtype dt, int64_t M, int64_t N, int64_t K, const void *a, int64_t lda, bool ta,
                      const void *b, int64_t ldb, bool tb, const float *bias, bool acc, float *c, int64_t ldc,
                      int64_t batch, int64_t sa, int64_t sb, int64_t sc);

    /* ---- losses (loss.c) ---- */
    /* Class-index targets (P of them, dtype dt): *count gets how many are not `ignore`, *bad the
     * first position holding neither a class in [0, C) nor ignore (-1 if none) and *bad_val its
     * value. Waits for the device (the caller needs the answer). */
    cm_status (*ce_check)(const void *target, cm_dtype dt, int64_t P, int64_t C, int64_t ignore, int64_t *count,
                          int64_t *bad, int64_t *bad_val);
    /* Cross-entropy of logits (N, C, S) (loss.c), position p = n·S + s at x + n·ldn + s, its C logits
     * at stride S (ldn = C·S: contiguous; more: rows padded, as linear_cross_entropy's on a GPU):
     * lse (N·S) gets each position's log-sum-exp; out (N·S) the losses when `none`, else out[0] =
     * Σ losses / denom. soft: target is contiguous f32 probabilities (N, C, S), else class indices of
     * dtype tdt. */
    cm_status (*ce_fwd)(const float *x, const void *target, cm_dtype tdt, bool soft, int64_t N, int64_t C, int64_t S,
                        int64_t ldn, int64_t ignore, float eps, bool none, double denom, float *out, float *lse);
    /* Its backward: gl (x's layout) written (fresh) or added to, gt (soft targets) added to; either
     * may be NULL. g is the upstream gradient: (N·S) when none, else g[0] (divided by denom). */
    cm_status (*ce_bwd)(const float *x, const void *target, cm_dtype tdt, bool soft, int64_t N, int64_t C, int64_t S,
                        int64_t ldn, int64_t ignore, float eps, bool none, double denom, const float *g,
                        const float *lse, float *gl, bool fresh, float *gt);

    /* Mean squared error of contiguous p and t (n each): none: out[i] = (p - t)², else out[0] =
     * (float)(Σ (p - t)² in double / denom). Backward: d = (none ? 2·g[i] : (float)(2·g[0] / denom))
     * · (p - t); gp += d, gt -= d (either may be NULL). */
    cm_status (*mse)(const float *p, const float *t, int64_t n, bool none, double denom, float *out);
    cm_status (*mse_bwd)(const float *p, const float *t, const float *g, int64_t n, bool none, double denom, float *gp,
                         float *gt);

    /* ---- normalisation, dropout, fused activations (norm.c, elementwise.c) ---- */
    /* y = (x - mean)·rstd·w + b per row of contiguous x (R, C); w, b may be NULL; mean, rstd (R). */
    cm_status (*layer_norm)(const float *x, const float *w, const float *b, float *y, float *mean, float *rstd,
                            int64_t R, int64_t C, float eps);
    /* gx (written when fresh, else added; may be NULL), gw and gb (added; may be NULL). */
    cm_status (*layer_norm_bwd)(const float *x, const float *w, const float *g, const float *mean, const float *rstd,
                                float *gx, bool fresh, float *gw, float *gb, int64_t R, int64_t C);
    /* Group norm of contiguous x (N, C, S) in G groups (norm.c): rows (n, g) of C/G·S values;
     * mean, rstd (N·G) written; y = (x - mean)·rstd·w[c] + b[c] (w, b may be NULL). */
    cm_status (*group_norm)(const float *x, const float *w, const float *b, float *y, float *mean, float *rstd,
                            int64_t N, int64_t C, int64_t S, int64_t G, float eps);
    /* gx, gw, gb added to (any may be NULL); the parameter gradients are per-channel sums in
     * double in a fixed order. */
    cm_status (*group_norm_bwd)(const float *x, const float *w, const float *g, const float *mean, const float *rstd,
                                float *gx, float *gw, float *gb, int64_t N, int64_t C, int64_t S, int64_t G);
    /* y = gelu(x + b) over rows of C (contiguous x, y; b (C)). */
    cm_status (*bias_gelu)(const float *x, const float *b, float *y, int64_t rows, int64_t C, bool approx);
    cm_status (*bias_gelu_bwd)(const float *x, const float *b, const float *g, float *gx, bool fresh, float *gb,
                               int64_t rows, int64_t C, bool approx);
    /* Dropout of contiguous x (numel): drop[i] = 1 where dropped, y = kept·scale. The mask is
     * cm_rng_bernoulli's from (seed, stream, counter): with rows > 0, row i (numel/rows elements)
     * draws from counter + (row_first + i)·ceil(numel/rows / 4) (cmi_dropout_mask's row context);
     * rows 0, the whole tensor from counter. */
    cm_status (*dropout)(const float *x, float *y, uint8_t *drop, int64_t numel, int64_t rows, int64_t row_first,
                         uint64_t seed, uint64_t stream, uint64_t counter, float p, float scale);
    cm_status (*dropout_bwd)(const float *g, const uint8_t *drop, float *gx, int64_t n, float scale, bool fresh);

    /* ---- indexing (index.c) ---- */
    /* out (n, i64) = the indices of idx (contiguous, dtype dt); *bad the first position outside
     * [0, limit) (-1 if none) with *bad_val its value. Waits for the device. */
    cm_status (*read_indices)(int64_t *out, const void *idx, cm_dtype dt, int64_t n, int64_t limit, int64_t *bad,
                              int64_t *bad_val);
    /* out (O, K, I) = rows idx[k] of a (O, A, I), elements of es bytes; and the backward
     * ga[o, idx[k]] += g[o, k] (repeated indices accumulate). */
    cm_status (*select_rows)(void *out, const void *a, const int64_t *idx, int64_t O, int64_t A, int64_t I, int64_t K,
                             size_t es);
    cm_status (*select_rows_bwd)(float *ga, const float *g, const int64_t *idx, int64_t O, int64_t A, int64_t I,
                                 int64_t K);
    /* Gather (index.c): out (contiguous, `shape` = idx's, elements of es bytes) = a read through
     * strides sa, with the coordinate on `axis` replaced by idx (i64, contiguous, `shape`). Its
     * backward: ga (contiguous, ashape) += g (contiguous, `shape`) scattered the same way; each
     * line along the axis is one thread's, in order (no atomics, the CPU's order). */
    cm_status (*gather)(void *out, const void *a, const int64_t *sa, const int64_t *idx, int nd, const int64_t *shape,
                        int axis, size_t es);
    cm_status (*gather_bwd)(float *ga, const int64_t *ashape, const float *g, const int64_t *idx, int nd,
                            const int64_t *shape, int axis);

    /* ---- attention (attention.c) ---- */
    /* out (B, H, T, D) or (B, T, H, D), contiguous; lse (B, H, T): each query's log-sum-exp (+inf
     * for a query whose keys are all masked). */
    cm_status (*attention)(const cmi_attn_desc *d, float *out, float *lse);
    /* Gradients from out, its gradient gout (out's layout) and lse: gq (B, H, T, D), gk and gv
     * (B, H, S, D), contiguous, each written (fresh) or added to, or NULL. dS (B, H, T, S), if not
     * NULL, gets the score gradients (for a bias's gradient); entries the causal mask skips are left
     * as they are (the caller zeroes dS first). */
    cm_status (*attention_bwd)(const cmi_attn_desc *d, const float *out, const float *gout, const float *lse,
                               float *gq, bool q_fresh, float *gk, bool k_fresh, float *gv, bool v_fresh, float *dS);

    /* ---- convolution, batch norm, pooling (conv.c, norm.c, pool.c) ---- */
    /* y = conv(x, w) [+ bias], computed in dt (f32; bf16: x and w rounded to bf16 on the way in
     * when stored as f32, f32 accumulation); y stored as ys (f32, or bf16 rounded). */
    cm_status (*conv)(const cmi_conv_geom *g, cm_dtype dt, cm_dtype xs, const void *x, cm_dtype ws, const void *w,
                      const float *bias, cm_dtype ys, void *y);
    /* Its backward from dy (stored as dys; rounded to bf16 when dt is bf16): dx (f32) written when
     * dx_fresh else added to, dW and db added to; any may be NULL. */
    cm_status (*conv_bwd)(const cmi_conv_geom *g, cm_dtype dt, cm_dtype xs, const void *x, cm_dtype ws, const void *w,
                          cm_dtype dys, const void *dy, float *dx, bool dx_fresh, float *dW, float *db);
    cm_status (*batch_norm)(const cmi_bn_args *a);
    cm_status (*batch_norm_bwd)(const cmi_bn_bwd_args *a);
    /* arg may be NULL (no gradient wanted) for max; gx is added to. */
    cm_status (*pool)(const cmi_pool_desc *d, const float *x, float *y, int32_t *arg);
    cm_status (*pool_bwd)(const cmi_pool_desc *d, const float *gy, const int32_t *arg, float *gx);
    /* Bilinear resize (pool.c): y = the taps' blend of x; backward gx += Σ over the output
     * pixels whose taps read each input pixel (gathered per input pixel, no atomics). */
    cm_status (*resize)(const cmi_resize_desc *d, const float *x, float *y);
    cm_status (*resize_bwd)(const cmi_resize_desc *d, const float *gy, float *gx);

    /* ---- optimizers and clipping over flat spans (optim.c, grad_clip.c) ---- */
    cm_status (*sgd_step)(const cmi_sgd_args *a);
    cm_status (*adam_step)(const cmi_adam_args *a);
    /* *out = Σ x[i]² in double (waits for the device). */
    cm_status (*sumsq)(const float *x, int64_t n, double *out);

    /* ---- the training algorithms' updates over flat spans (plugins: ema.c, swa.c, sam.c), each
     * operation rounded on its own as the CPU code rounds it (no fused multiply-add) ---- */
    /* EMA: ema[i] = ema[i]·s + model[i]·oms in f32; dt I64 (counters): through f32, truncated. */
    cm_status (*ema_update)(void *ema, const void *model, cm_dtype dt, int64_t n, float s, float oms);
    /* SWA: avg[i] = avg[i] + (model[i] - avg[i]) / d. */
    cm_status (*swa_update)(float *avg, const float *model, int64_t n, float d);
    /* SAM: p[i] = p[i] + g[i]·scale. */
    cm_status (*sam_perturb)(float *p, const float *g, int64_t n, float scale);
} cmi_backend;

/* The table of device d (NULL for the CPU). For CUDA in a build without it, NULL. */
const cmi_backend *cmi_backend_get(cm_device d);
/* The CUDA table when this build has one (src/tensor/cuda/backend.cu), else NULL; *why (may be
 * NULL) gets a reason for its absence. */
const cmi_backend *cmi_cuda_backend(const char **why);
/* Opens cuBLASLt, which a CUDA build loads on its first GEMM rather than at program start (so a
 * process that never uses the GPU never pays for its initialisers), without touching a device.
 * *from (may be NULL) names what was opened, as it was given to dlopen (the soname, the toolkit's
 * path or CM_CUBLASLT_PATH), or "the CUDA emulator". A build without CUDA: CM_ERR_UNSUPPORTED. A
 * failure names the library and the fix and is retried on the next call; once opened, later calls
 * return the first result. Thread-safe. */
cm_status cmi_cuda_blas_load(const char **from);

#ifdef __cplusplus
}
#endif
#endif
