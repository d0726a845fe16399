/* 2-d convolution, forward and backward, NCHW and channels-last, f32 and bf16: the op, its
 * kernel choice, and the im2col + OpenBLAS kernel.
 *
 * What runs where (src/tensor/dnnl_conv.h has the switches):
 *   - f32: oneDNN's direct convolution primitives (dnnl_conv.c) by default; this file's im2col
 *     kernel with CM_CONV=im2col, and for any problem oneDNN answers "unimplemented" for
 *     (counted in cmi_conv_stats; none of the test or ResNet shapes is). 3x3 stride-1
 *     convolutions with 32 or more channels (multiples of 16) run oneDNN's Winograd F(4x4, 3x3)
 *     instead of direct (CM_CONV_ALGO, cmi_conv_algo): about 1.7-2x faster per forward +
 *     backward on ResNet-CIFAR stages 2 and 3, reorders to its blocked layout included.
 *   - bf16 (x and weight bf16, or under autocast each of them f32 or bf16, an f32 one rounded to
 *     bf16 inside the op with no cast nodes; gradients f32 but dx as below, the result f32 or,
 *     with opts.out_bf16, bf16): oneDNN's bf16 primitives where its ISA has bf16 instructions
 *     (avx512_core_bf16, AMX), their reorders doing the rounding and the primitive writing a bf16
 *     result directly; elsewhere, or with CM_CONV_BF16=widen, the bf16 values of x, w and the
 *     rounded upstream gradient are put in f32 arena scratch and the f32 kernel runs on them (a
 *     bf16 result is rounded from its f32 one). A 3x3 stride-1 pad-1 channels-last convolution
 *     without bias (a ResNet's body) runs on our own AVX512-BF16 kernels instead of oneDNN's
 *     where the CPU has them (conv_bf16.c; forward with a bf16-stored x, backward-data,
 *     backward-weights), each faster than oneDNN's on those shapes;
 *     CM_CONV_BF16_OWN switches them per pass. Their forward and backward-data run a bf16
 *     Winograd F(2x2, 3x3) instead of the direct kernel from 32 channels (CM_CONV_ALGO).
 *   - backward: oneDNN writes dx straight into a gradient buffer created now (uninitialised:
 *     cmi_grad_for_write), and through scratch + add into one that already holds a gradient; dW
 *     and db always go through scratch (they accumulate over microbatches). A bf16 upstream
 *     gradient (written by a bf16 consumer, see cmi_grad_for_write_as) is read as it is. In a
 *     bf16 convolution, dx of a bf16 x made by an op that takes a bf16 gradient (batch norm's bf16
 *     output: n->bf16_gout) is created in bf16 when it is new (cmi_grad_for_write_as; f32 when x
 *     already has a gradient, or with retain_grads): oneDNN's backward-data writes diff_src in
 *     bf16 itself (half the bytes written, and batch norm reads half in its two passes over it),
 *     the widened and im2col kernels compute dx in f32 scratch and round it into the gradient.
 *
 * Measured (bench/conv: N = 128, ResNet-CIFAR shapes, 2 threads, AMD EPYC with avx512_core_bf16,
 * best of 5 while other work shared the 2 cores; ratios to im2col f32 from the same run):
 *   forward + backward, NCHW 3x3: oneDNN f32 (blocked activations) 1.7-3.1x, oneDNN bf16 1.6-5.4x;
 *   channels-last 3x3: oneDNN f32 1.9-2.9x, bf16 1.9-3.4x; the 3-channel stem 1.2x (NCHW) and
 *   2.3x (NHWC). On plain nchw oneDNN 2.6 has only a GEMM-based convolution (0.4-1.3x of
 *   im2col), hence the reorders to its blocked layout (a reorder costs 0.1-0.4 ms on these
 *   shapes against 1-2 ms per direct pass). With ONEDNN_MAX_CPU_ISA=AVX2 (no bf16: widen)
 *   oneDNN f32 is 1.4-1.5x im2col on the NCHW 3x3 shapes.
 *
 * The im2col kernel, NCHW, per image n and group g (K = Cin/groups · kh · kw, P = OH · OW):
 *   cols (K, P) = im2col(x[n], g)              // rows ordered (c, ki, kj), matching weight's layout
 *   y[n, g] (Cout/g, P) = W_g (Cout/g, K) · cols
 *   dW_g += dy[n, g] · colsᵀ,   dcols = W_gᵀ · dy[n, g],   dx[n] += col2im(dcols)
 * Channels-last, the transposed problem (so the output needs no transpose):
 *   cols (P, K) with K ordered (ki, kj, c) — a run of channels is one memcpy from (N, H, W, C);
 *   the weight is rearranged once per call to Wr (Cout, kh, kw, Cin/g) to match.
 *   y[n][:, g] (P, Cout/g) = cols · Wr_gᵀ,   dWr_g += dy_gᵀ · cols,   dcols = dy_g · Wr_g
 * A 1x1, stride-1, unpadded convolution uses x itself as cols (no im2col, no col2im).
 *
 * Threading: with at least as many images as threads, images run in parallel (OpenMP) and each
 * GEMM is single-threaded (the OpenMP build of OpenBLAS does that inside a parallel region);
 * weight gradients go to per-thread partial buffers, summed at the end. With fewer images, images
 * run one after another and each GEMM uses all threads. bench/conv (N = 128, ResNet-CIFAR
 * shapes, 2 threads): images in parallel 30-37 ms per NCHW 3x3 forward vs 190-240 ms with
 * threaded per-image GEMMs; one big (N·P, K) GEMM over all images (channels-last) was no faster
 * than images in parallel and needs N times the im2col memory, so it was dropped.
 *
 * The im2col buffer is recomputed in backward instead of kept: it is K/Cin times larger than x; its
 * arena memory is rewound when the call returns (forward and backward), so only one is live at a
 * time. The channels-last weight rearrangement Wr is likewise redone in backward (it is small). */
#include "tensor/conv_bf16.h"
#include "tensor/dnnl_conv.h"
#include "tensor/tensor_impl.h"

#include <cblas.h>
#include <omp.h>

typedef cmi_conv_geom conv_geom;

static inline int64_t cg_K(const conv_geom *g) { return g->Cin / g->groups * g->kh * g->kw; }
static inline int64_t cg_P(const conv_geom *g) { return g->OH * g->OW; }
static inline bool cg_pointwise(const conv_geom *g) {
    return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
}

/* The range [lo, hi) of output positions o with 0 <= o·s + off < n. */
static inline void valid_range(int64_t n_out, int64_t s, int64_t off, int64_t n, int64_t *lo, int64_t *hi) {
    int64_t a = off >= 0 ? 0 : (-off + s - 1) / s;
    int64_t b = off >= n ? 0 : (n - 1 - off) / s + 1;
    if (b > n_out) b = n_out;
    if (a > b) a = b;
    *lo = a;
    *hi = b;
}

/* ---- NCHW im2col / col2im: x plane block (Cg, H, W) <-> cols (Cg·kh·kw, OH·OW) ---- */

static void im2col_nchw(const conv_geom *g, const float *x, float *cols) {
    const int64_t Cg = g->Cin / g->groups, H = g->H, W = g->W, OH = g->OH, OW = g->OW, P = OH * OW;
    for (int64_t c = 0; c < Cg; c++)
        for (int64_t ki = 0; ki < g->kh; ki++)
            for (int64_t kj = 0; kj < g->kw; kj++) {
                float *row = cols + ((c * g->kh + ki) * g->kw + kj) * P; // (OH, OW)
                const float *xc = x + c * H * W;
                const int64_t offh = ki * g->dh - g->ph, offw = kj * g->dw - g->pw;
                int64_t wlo, whi;
                valid_range(OW, g->sw, offw, W, &wlo, &whi);
                for (int64_t oh = 0; oh < OH; oh++) {
                    float *r = row + oh * OW;
                    const int64_t ih = oh * g->sh + offh;
                    if (ih < 0 || ih >= H) {
                        memset(r, 0, sizeof(float) * (size_t)OW);
                        continue;
                    }
                    const float *xr = xc + ih * W;
                    for (int64_t ow = 0; ow < wlo; ow++) r[ow] = 0.0f;
                    if (g->sw == 1) {
                        memcpy(r + wlo, xr + wlo + offw, sizeof(float) * (size_t)(whi - wlo));
                    } else {
                        for (int64_t ow = wlo; ow < whi; ow++) r[ow] = xr[ow * g->sw + offw];
                    }
                    for (int64_t ow = whi; ow < OW; ow++) r[ow] = 0.0f;
                }
            }
}

static void col2im_nchw(const conv_geom *g, const float *cols, float *dx) {
    const int64_t Cg = g->Cin / g->groups, H = g->H, W = g->W, OH = g->OH, OW = g->OW, P = OH * OW;
    for (int64_t c = 0; c < Cg; c++)
        for (int64_t ki = 0; ki < g->kh; ki++)
            for (int64_t kj = 0; kj < g->kw; kj++) {
                const float *row = cols + ((c * g->kh + ki) * g->kw + kj) * P;
                float *dc = dx + c * H * W;
                const int64_t offh = ki * g->dh - g->ph, offw = kj * g->dw - g->pw;
                int64_t wlo, whi, hlo, hhi;
                valid_range(OW, g->sw, offw, W, &wlo, &whi);
                valid_range(OH, g->sh, offh, H, &hlo, &hhi);
                for (int64_t oh = hlo; oh < hhi; oh++) {
                    const float *r = row + oh * OW;
                    float *dr = dc + (oh * g->sh + offh) * W + offw;
                    for (int64_t ow = wlo; ow < whi; ow++) dr[ow * g->sw] += r[ow];
                }
            }
}

/* ---- channels-last im2col / col2im: x (H, W, Cin) at group offset <-> cols (OH·OW, kh·kw·Cg) ---- */

static void im2col_nhwc(const conv_geom *g, const float *x, float *cols) {
    const int64_t Cg = g->Cin / g->groups, Cin = g->Cin, K = cg_K(g);
    for (int64_t oh = 0; oh < g->OH; oh++)
        for (int64_t ow = 0; ow < g->OW; ow++) {
            float *dst = cols + (oh * g->OW + ow) * K;
            for (int64_t ki = 0; ki < g->kh; ki++) {
                const int64_t ih = oh * g->sh - g->ph + ki * g->dh;
                for (int64_t kj = 0; kj < g->kw; kj++, dst += Cg) {
                    const int64_t iw = ow * g->sw - g->pw + kj * g->dw;
                    if (ih < 0 || ih >= g->H || iw < 0 || iw >= g->W) memset(dst, 0, sizeof(float) * (size_t)Cg);
                    else memcpy(dst, x + (ih * g->W + iw) * Cin, sizeof(float) * (size_t)Cg);
                }
            }
        }
}

static void col2im_nhwc(const conv_geom *g, const float *cols, float *dx) {
    const int64_t Cg = g->Cin / g->groups, Cin = g->Cin, K = cg_K(g);
    for (int64_t oh = 0; oh < g->OH; oh++)
        for (int64_t ow = 0; ow < g->OW; ow++) {
            const float *src = cols + (oh * g->OW + ow) * K;
            for (int64_t ki = 0; ki < g->kh; ki++) {
                const int64_t ih = oh * g->sh - g->ph + ki * g->dh;
                for (int64_t kj = 0; kj < g->kw; kj++, src += Cg) {
                    const int64_t iw = ow * g->sw - g->pw + kj * g->dw;
                    if (ih < 0 || ih >= g->H || iw < 0 || iw >= g->W) continue;
                    float *d = dx + (ih * g->W + iw) * Cin;
                    for (int64_t c = 0; c < Cg; c++) d[c] += src[c];
                }
            }
        }
}

/* W (Cout, Cg, kh, kw) <-> Wr (Cout, kh, kw, Cg). */
static void weight_to_khwc(const conv_geom *g, const float *w, float *wr) {
    const int64_t Cg = g->Cin / g->groups, KK = g->kh * g->kw;
    for (int64_t o = 0; o < g->Cout; o++)
        for (int64_t c = 0; c < Cg; c++)
            for (int64_t k = 0; k < KK; k++) wr[(o * KK + k) * Cg + c] = w[(o * Cg + c) * KK + k];
}

static void add_khwc_to_weight(const conv_geom *g, const float *wr, float *w) {
    const int64_t Cg = g->Cin / g->groups, KK = g->kh * g->kw;
    for (int64_t o = 0; o < g->Cout; o++)
        for (int64_t c = 0; c < Cg; c++)
            for (int64_t k = 0; k < KK; k++) w[(o * Cg + c) * KK + k] += wr[(o * KK + k) * Cg + c];
}

/* True: images in parallel with single-threaded GEMMs; false: images in turn, threaded GEMMs. */
static bool par_images(const conv_geom *g, int nth) { return nth > 1 && g->N >= nth; }


/* ---- im2col forward ---- */

/* y (N, Cout, OH, OW) or (N, OH, OW, Cout) = conv(x, w) + bias. x contiguous in its layout;
 * w is W (NCHW) or Wr (channels-last). colbuf holds nth·K·P floats (unused for pointwise). */
static void im2col_forward_run(const conv_geom *g, const float *x, const float *w, const float *bias, float *y,
                               float *colbuf, int nth) {
    const int64_t K = cg_K(g), P = cg_P(g), G = g->groups, Cog = g->Cout / G, Cg = g->Cin / G;
    const int64_t xs = g->Cin * g->H * g->W, ys = g->Cout * P;
    const bool pw = cg_pointwise(g), par = par_images(g, nth);
#pragma omp parallel for num_threads(par ? nth : 1) schedule(static)
    for (int64_t n = 0; n < g->N; n++) {
        float *cols = colbuf ? colbuf + (int64_t)omp_get_thread_num() * K * P : NULL;
        const float *xn = x + n * xs;
        float *yn = y + n * ys;
        float beta = 0.0f;
        if (bias) {
            beta = 1.0f;
            if (g->cl)
                for (int64_t p = 0; p < P; p++) memcpy(yn + p * g->Cout, bias, sizeof(float) * (size_t)g->Cout);
            else
                for (int64_t o = 0; o < g->Cout; o++)
                    for (int64_t p = 0; p < P; p++) yn[o * P + p] = bias[o];
        } else if (K == 0) {
            memset(yn, 0, sizeof(float) * (size_t)ys);
        }
        for (int64_t gi = 0; gi < G && K > 0; gi++) {
            const float *wg = w + gi * Cog * K;
            if (!g->cl) {
                const float *b = xn + gi * Cg * g->H * g->W; // (Cg, H·W) == (K, P) when pointwise
                if (!pw) {
                    im2col_nchw(g, b, cols);
                    b = cols;
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)Cog, (int)P, (int)K, 1.0f, wg, (int)K, b,
                            (int)P, beta, yn + gi * Cog * P, (int)P);
            } else {
                const float *a = xn + gi * Cg; // (P, Cg) with row stride Cin when pointwise
                int lda = (int)g->Cin;
                if (!pw) {
                    im2col_nhwc(g, xn + gi * Cg, cols);
                    a = cols;
                    lda = (int)K;
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)P, (int)Cog, (int)K, 1.0f, a, lda, wg,
                            (int)K, beta, yn + gi * Cog, (int)g->Cout);
            }
        }
    }
}

static cm_status im2col_forward(cm_tape *tp, const conv_geom *g, const float *x, const float *w, const float *bias,
                                float *y) {
    const int64_t K = cg_K(g), P = cg_P(g);
    const int nth = cm_num_threads();
    const size_t mark = cm_arena_mark(tp->arena); /* Wr and the im2col buffer live only during this call */
    if (g->cl) {
        float *wr = cmi_scratch(tp, sizeof(float) * (size_t)(g->Cout * K + 1));
        if (!wr) return cmi_status(tp);
        weight_to_khwc(g, w, wr);
        w = wr;
    }
    float *colbuf = NULL;
    if (!cg_pointwise(g)) {
        int nbuf = par_images(g, nth) ? nth : 1;
        if (!(colbuf = cmi_scratch(tp, sizeof(float) * (size_t)(nbuf * K * P + 1)))) return cmi_status(tp);
    }
    im2col_forward_run(g, x, w, bias, y, colbuf, nth);
    cm_arena_rewind(tp->arena, mark);
    cmi_conv_stats_note(CMI_CONV_RAN_IM2COL, CMI_CONV_FWD);
    return CM_OK;
}

/* ---- im2col backward ---- */

/* db[o] += Σ_n,p dy */
static void bias_grad(const conv_geom *g, const float *dy, float *db) {
    const int64_t P = cg_P(g), ys = g->Cout * P;
    for (int64_t n = 0; n < g->N; n++) {
        const float *dyn = dy + n * ys;
        if (g->cl)
            for (int64_t p = 0; p < P; p++)
                for (int64_t o = 0; o < g->Cout; o++) db[o] += dyn[p * g->Cout + o];
        else
            for (int64_t o = 0; o < g->Cout; o++) {
                float s = 0.0f;
                for (int64_t p = 0; p < P; p++) s += dyn[o * P + p];
                db[o] += s;
            }
    }
}

/* dx += conv's input gradient, dW += its weight gradient (either may be NULL), from dy and the f32
 * x and w (W's layout). */
static cm_status im2col_backward(cm_tape *tp, const conv_geom *g, const float *x, const float *w, const float *dy,
                                 float *dx, float *dW) {
    if (!dx && !dW) return CM_OK;
    const int64_t K = cg_K(g), P = cg_P(g), G = g->groups, Cog = g->Cout / G, Cg = g->Cin / G;
    const int64_t xs = g->Cin * g->H * g->W, ys = g->Cout * P, WN = g->Cout * K;
    if (K == 0) return CM_OK;
    const int nth = cm_num_threads();
    const bool pw = cg_pointwise(g), par = par_images(g, nth);
    const int nbuf = par ? nth : 1;
    float *cols = NULL, *dcols = NULL, *dwp = NULL;
    /* the scratch below is dead once this node is done: give it back, so a deep network's
     * backward reuses one conv's worth instead of keeping every layer's im2col until reset */
    const size_t mark = cm_arena_mark(tp->arena);
    if (g->cl) { /* Wr (Cout, kh, kw, Cg) */
        float *wr = cmi_scratch(tp, sizeof(float) * (size_t)WN);
        if (!wr) return cmi_status(tp);
        weight_to_khwc(g, w, wr);
        w = wr;
    }
    if (!pw) {
        if (dW && !(cols = cmi_scratch(tp, sizeof(float) * (size_t)(nbuf * K * P)))) return cmi_status(tp);
        if (dx && !(dcols = cmi_scratch(tp, sizeof(float) * (size_t)(nbuf * K * P)))) return cmi_status(tp);
    }
    if (dW) { // per-thread partial dW (in Wr's layout when channels-last)
        if (!(dwp = cmi_scratch(tp, sizeof(float) * (size_t)(nbuf * WN)))) return cmi_status(tp);
        memset(dwp, 0, sizeof(float) * (size_t)(nbuf * WN));
    }

#pragma omp parallel for num_threads(par ? nth : 1) schedule(static)
    for (int64_t n = 0; n < g->N; n++) {
        const int t = omp_get_thread_num();
        float *cb = cols ? cols + (int64_t)t * K * P : NULL;
        float *dcb = dcols ? dcols + (int64_t)t * K * P : NULL;
        float *dw = dwp ? dwp + (int64_t)t * WN : NULL;
        const float *xn = x + n * xs, *dyn = dy + n * ys;
        float *dxn = dx ? dx + n * xs : NULL;
        for (int64_t gi = 0; gi < G; gi++) {
            const float *wg = w + gi * Cog * K;
            if (!g->cl) {
                const float *dyg = dyn + gi * Cog * P; // (Cog, P)
                if (dw) {
                    const float *b = xn + gi * Cg * g->H * g->W;
                    if (!pw) {
                        im2col_nchw(g, b, cb);
                        b = cb;
                    }
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)Cog, (int)K, (int)P, 1.0f, dyg, (int)P,
                                b, (int)P, 1.0f, dw + gi * Cog * K, (int)K);
                }
                if (dxn) {
                    float *dxg = dxn + gi * Cg * g->H * g->W;
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)K, (int)P, (int)Cog, 1.0f, wg, (int)K,
                                dyg, (int)P, pw ? 1.0f : 0.0f, pw ? dxg : dcb, (int)P);
                    if (!pw) col2im_nchw(g, dcb, dxg);
                }
            } else {
                const float *dyg = dyn + gi * Cog; // (P, Cog), row stride Cout
                if (dw) {
                    const float *a = xn + gi * Cg;
                    int lda = (int)g->Cin;
                    if (!pw) {
                        im2col_nhwc(g, xn + gi * Cg, cb);
                        a = cb;
                        lda = (int)K;
                    }
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)Cog, (int)K, (int)P, 1.0f, dyg,
                                (int)g->Cout, a, lda, 1.0f, dw + gi * Cog * K, (int)K);
                }
                if (dxn) {
                    float *dxg = dxn + gi * Cg;
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)P, (int)K, (int)Cog, 1.0f, dyg,
                                (int)g->Cout, wg, (int)K, pw ? 1.0f : 0.0f, pw ? dxg : dcb, pw ? (int)g->Cin : (int)K);
                    if (!pw) col2im_nhwc(g, dcb, dxg);
                }
            }
        }
    }
    if (dW) {
        for (int t = 1; t < nbuf; t++)
            for (int64_t i = 0; i < WN; i++) dwp[i] += dwp[(int64_t)t * WN + i];
        if (g->cl) add_khwc_to_weight(g, dwp, dW);
        else
            for (int64_t i = 0; i < WN; i++) dW[i] += dwp[i];
        cmi_conv_stats_note(CMI_CONV_RAN_IM2COL, CMI_CONV_BWD_WEIGHTS);
    }
    if (dx) cmi_conv_stats_note(CMI_CONV_RAN_IM2COL, CMI_CONV_BWD_DATA);
    cm_arena_rewind(tp->arena, mark);
    return CM_OK;
}

/* ---- kernel dispatch ---- */

/* oneDNN wants every dimension positive; an empty Cin (a 0-channel input) stays on im2col. */
static bool dnnl_wanted(const conv_geom *g) { return cmi_conv_get_kernel() == CMI_CONV_DNNL && g->Cin > 0; }

/* Whether our own bf16 kernel for pass (CMI_CONV_FWD, ...) is switched on (CM_CONV_BF16_OWN). */
static bool own_on(int pass) { return cmi_conv_get_own_passes() >> pass & 1u; }

static void add_into(float *dst, const float *src, int64_t n) {
#pragma omp parallel for schedule(static) if (n > CMI_PAR_MIN)
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

/* n bf16 values widened to f32 (exact) in arena scratch. */
static float *widen(cm_tape *tp, const uint16_t *p, int64_t n) {
    float *o = cmi_scratch(tp, sizeof(float) * (size_t)(n ? n : 1));
    if (o) cmi_bf16_widen(o, p, n);
    return o;
}

/* n f32 values rounded to bf16 in arena scratch (the upstream gradient of a bf16 convolution). */
static uint16_t *to_bf16(cm_tape *tp, const float *p, int64_t n) {
    uint16_t *o = cmi_scratch(tp, sizeof(uint16_t) * (size_t)(n ? n : 1));
    if (o) cmi_bf16_round(o, p, n);
    return o;
}

/* n values stored as st (bf16, or f32 to be rounded to bf16) as f32 holding bf16 values, in arena
 * scratch: what the widened kernel computes on. */
static float *bf16_values(cm_tape *tp, const void *p, cm_dtype st, int64_t n) {
    if (st == CM_DTYPE_BF16) return widen(tp, p, n);
    uint32_t *o = cmi_scratch(tp, sizeof(float) * (size_t)(n ? n : 1));
    if (!o) return NULL;
    const float *s = p;
#pragma omp parallel for schedule(static) if (n > CMI_PAR_MIN)
    for (int64_t i = 0; i < n; i++) o[i] = (uint32_t)cmi_f32_to_bf16(s[i]) << 16;
    return (float *)o;
}

static int64_t x_numel(const conv_geom *g) { return g->N * g->Cin * g->H * g->W; }
static int64_t y_numel(const conv_geom *g) { return g->N * g->Cout * g->OH * g->OW; }
static int64_t w_numel(const conv_geom *g) { return g->Cout * cg_K(g); }

/* y = conv(x, w) + bias with f32 operands: oneDNN unless CM_CONV=im2col or it has no
 * implementation for the problem. */
static cm_status forward_f32(cm_tape *tp, const conv_geom *g, const float *x, const float *w, const float *bias,
                             float *y) {
    if (dnnl_wanted(g)) {
        bool ran = false;
        if (cmi_dnnl_conv_forward(tp, g, CM_DTYPE_F32, CM_DTYPE_F32, CM_DTYPE_F32, x, w, bias, CM_DTYPE_F32, y, &ran))
            return cmi_status(tp);
        if (ran) return CM_OK;
    }
    return im2col_forward(tp, g, x, w, bias, y);
}

/* The convolution computed in dt (f32 or bf16) of x and w stored as xs and ws (dt, or f32 under
 * autocast), into y stored as ys (f32; bf16 only for a bf16 convolution). bf16 runs oneDNN's bf16
 * primitive when the bf16 kernel is onednn, else (or when it has no implementation) the f32
 * kernels on the bf16 values widened to f32, rounding the result to bf16 for a bf16 y. */
static cm_status conv_forward(cm_tape *tp, const conv_geom *g, cm_dtype dt, cm_dtype xs, cm_dtype ws, const void *x,
                              const void *w, const float *bias, cm_dtype ys, void *y) {
    if (dt == CM_DTYPE_F32) return forward_f32(tp, g, x, w, bias, y);
    if (dnnl_wanted(g) && cmi_conv_get_bf16_kernel() == CMI_CONV_BF16_ONEDNN) {
        if (!bias && xs == CM_DTYPE_BF16 && own_on(CMI_CONV_FWD) &&
            cmi_conv_direct_bf16_fits(g)) { /* our own kernel (conv_bf16.h) */
            if (cmi_conv_fwd_bf16(tp, g, x, ws, w, ys, y)) return cmi_status(tp);
            cmi_conv_stats_note(CMI_CONV_RAN_OWN_BF16, CMI_CONV_FWD);
            return CM_OK;
        }
        bool ran = false;
        if (cmi_dnnl_conv_forward(tp, g, CM_DTYPE_BF16, xs, ws, x, w, bias, ys, y, &ran)) return cmi_status(tp);
        if (ran) return CM_OK;
    }
    const size_t mark = cm_arena_mark(tp->arena);
    float *xw = bf16_values(tp, x, xs, x_numel(g)), *ww = xw ? bf16_values(tp, w, ws, w_numel(g)) : NULL;
    float *yf = ys == CM_DTYPE_BF16 ? cmi_scratch(tp, sizeof(float) * (size_t)y_numel(g)) : y;
    if (!ww || !yf || forward_f32(tp, g, xw, ww, bias, yf)) return cmi_status(tp);
    if (yf != y) cmi_bf16_round(y, yf, y_numel(g));
    cmi_conv_stats_note(CMI_CONV_RAN_WIDENED, CMI_CONV_FWD);
    cm_arena_rewind(tp->arena, mark);
    return CM_OK;
}

/* oneDNN's backward for x and w of dtype dt and dy stored as dys: dx (written in place when
 * dx_fresh, else through scratch and added; stored as dxs: f32, or bf16 for a bf16 convolution,
 * then always fresh), dW and db (through scratch, added); any may be NULL (db is only computed
 * with dW). *dx_done / *dw_done say which passes ran (oneDNN may have no implementation for one). */
static cm_status dnnl_backward(cm_tape *tp, const conv_geom *g, cm_dtype dt, cm_dtype xs, cm_dtype ws, const void *x,
                               const void *w, cm_dtype dys, const void *dy, cm_dtype dxs, void *dx, bool dx_fresh,
                               float *dW, float *db, bool *dx_done, bool *dw_done) {
    *dx_done = *dw_done = false;
    if (!dx && !dW) return CM_OK;
    if (dx && dxs != CM_DTYPE_F32 && !dx_fresh)
        return cmi_fail(tp, CM_ERR_INTERNAL, "conv2d backward: a %s dx must be a fresh gradient", cm_dtype_name(dxs));
    const size_t mark = cm_arena_mark(tp->arena);
    void *t = dx ? (dx_fresh ? dx : cmi_scratch(tp, sizeof(float) * (size_t)x_numel(g))) : NULL;
    float *tw = dW ? cmi_scratch(tp, sizeof(float) * (size_t)w_numel(g)) : NULL;
    float *tb = dW && db ? cmi_scratch(tp, sizeof(float) * (size_t)g->Cout) : NULL;
    if ((dx && !t) || (dW && !tw) || (dW && db && !tb)) return cmi_status(tp);
    bool rd = false, rw = false;
    if (cmi_dnnl_conv_backward(tp, g, dt, xs, ws, x, w, dys, dy, dxs, t, tw, tb, &rd, &rw)) return cmi_status(tp);
    if (rd) {
        if (t != dx) add_into(dx, t, x_numel(g));
        *dx_done = true;
    }
    if (rw) {
        add_into(dW, tw, w_numel(g));
        if (db) add_into(db, tb, g->Cout);
        *dw_done = true;
    }
    cm_arena_rewind(tp->arena, mark);
    return CM_OK;
}

/* Backward with f32 operands: dx (overwritten when dx_fresh, else accumulated), dW and db
 * (accumulated; any may be NULL). A pass oneDNN has no implementation for runs on im2col. */
static cm_status backward_f32(cm_tape *tp, const conv_geom *g, const float *x, const float *w, const float *dy,
                              float *dx, bool dx_fresh, float *dW, float *db) {
    if (dnnl_wanted(g)) {
        bool dd = false, wd = false;
        if (dnnl_backward(tp, g, CM_DTYPE_F32, CM_DTYPE_F32, CM_DTYPE_F32, x, w, CM_DTYPE_F32, dy, CM_DTYPE_F32, dx,
                          dx_fresh, dW, db, &dd, &wd))
            return cmi_status(tp);
        if (dd) dx = NULL;
        if (wd) dW = NULL, db = NULL;
    }
    if (db) bias_grad(g, dy, db);
    if (dx && dx_fresh) memset(dx, 0, sizeof(float) * (size_t)x_numel(g)); /* im2col adds into it */
    return im2col_backward(tp, g, x, w, dy, dx, dW);
}

typedef struct {
    conv_geom g;
    cm_dtype dt; /* computed in: f32, or bf16 (explicit bf16 x and w, or autocast) */
    cm_dtype xs, ws; /* x and w stored as: dt, or either f32 under autocast (rounded on the way in) */
} conv_ctx;

static cm_status conv_backward(cm_tape *tp, cm_node *nd, const cm_tensor *gout) {
    const conv_ctx *c = nd->ctx;
    const conv_geom *g = &c->g;
    const cmi_backend *be = cmi_be(tp);
    if (be) { /* the GPU: f32 gradients (backend.h conv_bwd) */
        bool fresh = false;
        cm_tensor *gx = cmi_grad_for_write(tp, nd->in[0], &fresh), *gw = cmi_grad(tp, nd->in[1]);
        cm_tensor *gb = cmi_grad(tp, nd->in[2]);
        if (cmi_status(tp) || (!gx && !gw && !gb)) return cmi_status(tp);
        cmi_dev_fail(tp,
                     be->conv_bwd(g, c->dt, c->xs, nd->in[0]->data, c->ws, nd->in[1]->data, gout->dtype, gout->data,
                                  gx ? cmi_f32(gx) : NULL, fresh, gw ? cmi_f32(gw) : NULL, gb ? cmi_f32(gb) : NULL),
                     "conv2d backward");
        return cmi_status(tp);
    }
    /* A gradient buffer created now (uninitialised: cmi_grad_for_write) is written by oneDNN
     * directly instead of through scratch that is then added; the im2col fallback zeroes it first.
     * In a bf16 convolution a new gradient of a bf16 x whose producer takes a bf16 gradient (batch
     * norm: cmi_grad_for_write_as) is bf16: oneDNN's backward-data writes it directly, the
     * fallbacks round their f32 result into it. */
    bool dx_fresh = false;
    cm_tensor *gx = c->dt == CM_DTYPE_BF16 ? cmi_grad_for_write_as(tp, nd->in[0], CM_DTYPE_BF16, &dx_fresh)
                                           : cmi_grad_for_write(tp, nd->in[0], &dx_fresh);
    cm_tensor *gw = cmi_grad(tp, nd->in[1]);
    cm_tensor *gb = cmi_grad(tp, nd->in[2]);
    if (cmi_status(tp)) return cmi_status(tp);
    void *dx = gx ? gx->data : NULL;
    float *dW = gw ? cmi_f32(gw) : NULL, *db = gb ? cmi_f32(gb) : NULL;
    const cm_dtype dxs = gx ? gx->dtype : CM_DTYPE_F32; /* f32, or bf16 (then dx_fresh) */
    if (!dx && !dW && !db) return CM_OK;
    const void *x = nd->in[0]->data, *w = nd->in[1]->data;
    if (c->dt == CM_DTYPE_F32) return backward_f32(tp, g, x, w, cmi_f32(gout), dx, dx_fresh, dW, db);

    /* bf16: the upstream gradient is rounded to bf16, as linear's backward does (by oneDNN's
     * reorder of dy on the native path, by to_bf16 on the widened one) — unless the consumer
     * already wrote it in bf16 (nd->bf16_gout: cmi_grad_for_write_as) */
    const cm_dtype dys = gout->dtype;
    if (dnnl_wanted(g) && cmi_conv_get_bf16_kernel() == CMI_CONV_BF16_ONEDNN) {
        /* backward-weights of the 3x3 body convolutions on our own kernel (conv_bf16.h) */
        if (dW && !db && own_on(CMI_CONV_BWD_WEIGHTS) && cmi_conv_wgrad_bf16_fits(g)) {
            if (cmi_conv_wgrad_bf16(tp, g, c->xs, x, dys, gout->data, dW)) return cmi_status(tp);
            cmi_conv_stats_note(CMI_CONV_RAN_OWN_BF16, CMI_CONV_BWD_WEIGHTS);
            dW = NULL;
        }
        /* and backward-data on the direct kernel, which reads dy in bf16 (an f32 one is rounded
         * first, in a pass of its own: the same values oneDNN's reorder would give it) */
        if (dx && own_on(CMI_CONV_BWD_DATA) && cmi_conv_direct_bf16_fits(g)) {
            const size_t m0 = cm_arena_mark(tp->arena);
            uint16_t *dy16 = dys == CM_DTYPE_BF16 ? (uint16_t *)gout->data : cmi_scratch(tp, 2 * (size_t)y_numel(g));
            if (!dy16) return cmi_status(tp);
            if (dy16 != gout->data) cmi_bf16_round(dy16, cmi_f32(gout), y_numel(g));
            /* written into a new gradient (f32, or bf16 for batch norm), added into one that holds
             * a gradient already (f32) */
            if (cmi_conv_bwd_data_bf16(tp, g, dy16, c->ws, w, dxs, dx, !dx_fresh)) return cmi_status(tp);
            cm_arena_rewind(tp->arena, m0);
            cmi_conv_stats_note(CMI_CONV_RAN_OWN_BF16, CMI_CONV_BWD_DATA);
            dx = NULL;
        }
        bool dd = false, wd = false;
        if (dnnl_backward(tp, g, CM_DTYPE_BF16, c->xs, c->ws, x, w, dys, gout->data, dxs, dx, dx_fresh, dW, db, &dd,
                          &wd))
            return cmi_status(tp);
        if (dd) dx = NULL;
        if (wd) dW = NULL, db = NULL;
    }
    const size_t mark = cm_arena_mark(tp->arena);
    if (dx || dW || db) { /* widen: f32 kernels on the exact f32 values of x, w and the rounded dy */
        const uint16_t *dy16 = dys == CM_DTYPE_BF16 ? gout->data : to_bf16(tp, cmi_f32(gout), y_numel(g));
        float *dyw = dy16 ? widen(tp, dy16, y_numel(g)) : NULL;
        float *xw = dyw && dW ? bf16_values(tp, x, c->xs, x_numel(g)) : NULL;
        float *ww = dyw && dx ? bf16_values(tp, w, c->ws, w_numel(g)) : NULL;
        /* a bf16 dx (fresh): computed in f32 scratch, then rounded into it */
        float *dxf = dx && dxs == CM_DTYPE_BF16 ? cmi_scratch(tp, sizeof(float) * (size_t)(x_numel(g) ? x_numel(g) : 1))
                                                : dx;
        if (!dyw || (dW && !xw) || (dx && (!ww || !dxf))) return cmi_status(tp);
        if (backward_f32(tp, g, xw, ww, dyw, dxf, dx_fresh, dW, db)) return cmi_status(tp);
        if (dx && dxf != dx) cmi_bf16_round(dx, dxf, x_numel(g));
        if (dx) cmi_conv_stats_note(CMI_CONV_RAN_WIDENED, CMI_CONV_BWD_DATA);
        if (dW) cmi_conv_stats_note(CMI_CONV_RAN_WIDENED, CMI_CONV_BWD_WEIGHTS);
    }
    cm_arena_rewind(tp->arena, mark);
    return cmi_status(tp);
}

cm_conv2d_opts cm_conv2d_opts_default(void) {
    cm_conv2d_opts o = {{1, 1}, {0, 0}, {1, 1}, 1, false, false};
    return o;
}

cm_tensor *cm_conv2d(cm_tape *tp, cm_tensor *x, cm_tensor *weight, cm_tensor *bias, const cm_conv2d_opts *opts) {
    static const char *op = "conv2d";
    cm_tensor *req[2] = {x, weight};
    if (!cmi_begin(tp, op, 2, req) || !cmi_fetch(tp, 1, &bias)) return NULL;
    /* Mixed precision: an f32 x or weight is rounded to bf16 inside the convolution (oneDNN's
     * reorder into its layout rounds on the way) and its gradient goes straight to it in f32, like
     * linear's; no bf16 copies on the tape, whichever of x and weight is f32 or bf16. */
    const bool autocast = tp->autocast == CM_DTYPE_BF16;
    for (int k = 0; k < 2; k++) {
        const cm_tensor *t = k ? weight : x;
        if (t->dtype != CM_DTYPE_F32 && t->dtype != CM_DTYPE_BF16) {
            cmi_fail(tp, CM_ERR_DTYPE, "conv2d: '%s' %s has dtype %s; conv2d needs f32 or bf16 (cast with cm_cast)",
                     k ? "weight" : "x", cmi_shape(t), cm_dtype_name(t->dtype));
            return NULL;
        }
    }
    if (!autocast && weight->dtype != x->dtype) {
        cmi_fail(tp, CM_ERR_DTYPE, "conv2d: dtypes differ: x %s is %s, weight %s is %s (cast one with cm_cast)",
                 cmi_shape(x), cm_dtype_name(x->dtype), cmi_shape(weight), cm_dtype_name(weight->dtype));
        return NULL;
    }
    if (bias && bias->dtype != CM_DTYPE_F32) {
        cmi_fail(tp, CM_ERR_DTYPE, "conv2d: bias %s has dtype %s; the bias is f32 (also for bf16 x and weight)",
                 cmi_shape(bias), cm_dtype_name(bias->dtype));
        return NULL;
    }
    const cm_conv2d_opts o = opts ? *opts : cm_conv2d_opts_default();
    if (o.stride[0] < 1 || o.stride[1] < 1 || o.dilation[0] < 1 || o.dilation[1] < 1 || o.padding[0] < 0 ||
        o.padding[1] < 0 || o.groups < 1) {
        cmi_fail(tp, CM_ERR_INVALID_ARG,
                 "conv2d: stride (%d, %d) and dilation (%d, %d) must be >= 1, padding (%d, %d) >= 0, groups %d >= 1",
                 o.stride[0], o.stride[1], o.dilation[0], o.dilation[1], o.padding[0], o.padding[1], o.groups);
        return NULL;
    }
    const char *layout = o.channels_last ? "(N, H, W, Cin)" : "(N, Cin, H, W)";
    if (x->ndim != 4) {
        cmi_fail(tp, CM_ERR_SHAPE, "conv2d: x %s must be 4-d %s", cmi_shape(x), layout);
        return NULL;
    }
    if (weight->ndim != 4) {
        cmi_fail(tp, CM_ERR_SHAPE, "conv2d: weight %s must be 4-d (Cout, Cin/groups, kh, kw)", cmi_shape(weight));
        return NULL;
    }
    conv_geom g = {0};
    g.cl = o.channels_last;
    g.N = x->shape[0];
    g.Cin = x->shape[g.cl ? 3 : 1];
    g.H = x->shape[g.cl ? 1 : 2];
    g.W = x->shape[g.cl ? 2 : 3];
    g.Cout = weight->shape[0];
    g.kh = weight->shape[2];
    g.kw = weight->shape[3];
    g.sh = o.stride[0], g.sw = o.stride[1], g.ph = o.padding[0], g.pw = o.padding[1];
    g.dh = o.dilation[0], g.dw = o.dilation[1], g.groups = o.groups;
    if (g.Cin % g.groups || g.Cout % g.groups) {
        cmi_fail(tp, CM_ERR_SHAPE, "conv2d: Cin %lld (x %s %s) and Cout %lld (weight %s) must be divisible by groups %d",
                 (long long)g.Cin, cmi_shape(x), layout, (long long)g.Cout, cmi_shape(weight), o.groups);
        return NULL;
    }
    if (weight->shape[1] != g.Cin / g.groups || g.kh < 1 || g.kw < 1) {
        cmi_fail(tp, CM_ERR_SHAPE,
                 "conv2d: weight %s must be (Cout, Cin/groups = %lld, kh >= 1, kw >= 1) for x %s %s with groups %d",
                 cmi_shape(weight), (long long)(g.Cin / g.groups), cmi_shape(x), layout, o.groups);
        return NULL;
    }
    if (bias && (bias->ndim != 1 || bias->shape[0] != g.Cout)) {
        cmi_fail(tp, CM_ERR_SHAPE, "conv2d: bias %s must be (Cout) = (%lld) for weight %s", cmi_shape(bias),
                 (long long)g.Cout, cmi_shape(weight));
        return NULL;
    }
    int64_t eh = g.H + 2 * g.ph - g.dh * (g.kh - 1) - 1, ew = g.W + 2 * g.pw - g.dw * (g.kw - 1) - 1;
    g.OH = eh < 0 ? 0 : eh / g.sh + 1;
    g.OW = ew < 0 ? 0 : ew / g.sw + 1;
    if (g.OH <= 0 || g.OW <= 0) {
        cmi_fail(tp, CM_ERR_SHAPE,
                 "conv2d: x %s %s with weight %s, padding (%d, %d), dilation (%d, %d) gives an empty output "
                 "(%lld x %lld): the dilated kernel is larger than the padded input",
                 cmi_shape(x), layout, cmi_shape(weight), o.padding[0], o.padding[1], o.dilation[0], o.dilation[1],
                 (long long)g.OH, (long long)g.OW);
        return NULL;
    }
    x = cm_contiguous(tp, x);
    weight = cm_contiguous(tp, weight);
    if (bias) bias = cm_contiguous(tp, bias);
    if (!x || !weight || cmi_status(tp)) return NULL;

    const cm_dtype dt = autocast ? CM_DTYPE_BF16 : x->dtype; /* what the convolution computes in */
    int64_t yshape[4] = {g.N, g.Cout, g.OH, g.OW};
    if (g.cl) yshape[1] = g.OH, yshape[2] = g.OW, yshape[3] = g.Cout;
    const cm_dtype ys = dt == CM_DTYPE_BF16 && o.out_bf16 ? CM_DTYPE_BF16 : CM_DTYPE_F32;
    cm_tensor *y = cmi_new(tp, ys, 4, yshape);
    if (!y) return NULL;
    if (g.N == 0 || g.Cout == 0) return y;
    const cmi_backend *be = cmi_be(tp);
    if (be) {
        if (cmi_dev_fail(tp,
                         be->conv(&g, dt, x->dtype, x->data, weight->dtype, weight->data, bias ? cmi_f32(bias) : NULL,
                                  ys, y->data),
                         op))
            return NULL;
    } else if (conv_forward(tp, &g, dt, x->dtype, weight->dtype, x->data, weight->data, bias ? cmi_f32(bias) : NULL,
                            ys, y->data)) {
        return NULL;
    }

    cm_tensor *ins[3] = {x, weight, bias};
    if (cmi_needs_grad(tp, 3, ins)) {
        cm_node *n = cmi_record(tp, op, y, 3, ins, conv_backward, sizeof(conv_ctx));
        if (!n) return NULL;
        /* a bf16 consumer may write the gradient in bf16 (on the CPU; the GPU's gradients are f32) */
        n->bf16_gout = ys == CM_DTYPE_BF16 && !be;
        conv_ctx *c = n->ctx;
        c->g = g;
        c->dt = dt;
        c->xs = x->dtype;
        c->ws = weight->dtype;
    }
    return y;
}
