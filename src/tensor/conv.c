/* 2-d convolution: im2col + OpenBLAS GEMM, forward and backward, in NCHW and channels-last layouts.
 *
 * NCHW, per image n and group g (K = Cin/groups · kh · kw, P = OH · OW):
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
 * arena memory is rewound when the call returns (forward and backward), so only one is live at a time. */
#include "tensor/tensor_impl.h"

#include <cblas.h>
#include <omp.h>

typedef struct {
    int64_t N, Cin, H, W, Cout, OH, OW, kh, kw;
    int64_t sh, sw, ph, pw, dh, dw, groups;
    bool cl;
} conv_geom;

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

/* ---- forward ---- */

/* y (N, Cout, OH, OW) or (N, OH, OW, Cout) = conv(x, w) + bias. x contiguous in its layout;
 * w is W (NCHW) or Wr (channels-last). colbuf holds nth·K·P floats (unused for pointwise). */
static void conv_forward(const conv_geom *g, const float *x, const float *w, const float *bias, float *y,
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
        }
        for (int64_t gi = 0; gi < G; gi++) {
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

/* ---- backward ---- */

typedef struct {
    conv_geom g;
    const float *wr; /* channels-last: the rearranged weight from forward (arena) */
} conv_ctx;

static cm_status conv_backward(cm_tape *tp, cm_node *nd, const cm_tensor *gout) {
    const conv_ctx *c = nd->ctx;
    const conv_geom *g = &c->g;
    cm_tensor *gx = cmi_grad(tp, nd->in[0]);
    cm_tensor *gw = cmi_grad(tp, nd->in[1]);
    cm_tensor *gb = cmi_grad(tp, nd->in[2]);
    if (cmi_status(tp)) return cmi_status(tp);
    const int64_t K = cg_K(g), P = cg_P(g), G = g->groups, Cog = g->Cout / G, Cg = g->Cin / G;
    const int64_t xs = g->Cin * g->H * g->W, ys = g->Cout * P, WN = g->Cout * K;
    const float *dy = cmi_f32(gout);
    const float *x = cmi_f32(nd->in[0]);
    const float *w = g->cl ? c->wr : cmi_f32(nd->in[1]);

    if (gb) { // db[o] = Σ_n,p dy
        float *db = cmi_f32(gb);
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
    if (!gx && !gw) return cmi_status(tp);

    const int nth = cm_num_threads();
    const bool pw = cg_pointwise(g), par = par_images(g, nth);
    const int nbuf = par ? nth : 1;
    float *cols = NULL, *dcols = NULL, *dwp = NULL;
    /* the scratch below is dead once this node is done: give it back, so a deep network's
     * backward reuses one conv's worth instead of keeping every layer's im2col until reset */
    const size_t mark = cm_arena_mark(tp->arena);
    if (!pw) {
        if (gw && !(cols = cmi_scratch(tp, sizeof(float) * (size_t)(nbuf * K * P)))) return cmi_status(tp);
        if (gx && !(dcols = cmi_scratch(tp, sizeof(float) * (size_t)(nbuf * K * P)))) return cmi_status(tp);
    }
    if (gw) { // per-thread partial dW (in Wr's layout when channels-last)
        if (!(dwp = cmi_scratch(tp, sizeof(float) * (size_t)(nbuf * WN)))) return cmi_status(tp);
        memset(dwp, 0, sizeof(float) * (size_t)(nbuf * WN));
    }
    float *dx = gx ? cmi_f32(gx) : NULL;

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
    if (gw) {
        for (int t = 1; t < nbuf; t++)
            for (int64_t i = 0; i < WN; i++) dwp[i] += dwp[(int64_t)t * WN + i];
        float *dW = cmi_f32(gw);
        if (g->cl) add_khwc_to_weight(g, dwp, dW);
        else
            for (int64_t i = 0; i < WN; i++) dW[i] += dwp[i];
    }
    cm_arena_rewind(tp->arena, mark);
    return cmi_status(tp);
}

cm_conv2d_opts cm_conv2d_opts_default(void) {
    cm_conv2d_opts o = {{1, 1}, {0, 0}, {1, 1}, 1, false};
    return o;
}

cm_tensor *cm_conv2d(cm_tape *tp, cm_tensor *x, cm_tensor *weight, cm_tensor *bias, const cm_conv2d_opts *opts) {
    static const char *op = "conv2d";
    cm_tensor *req[2] = {x, weight};
    if (!cmi_begin(tp, op, 2, req) || !cmi_fetch(tp, 1, &bias)) return NULL;
    if (!cmi_check_f32(tp, op, "x", x) || !cmi_check_f32(tp, op, "weight", weight)) return NULL;
    if (bias && !cmi_check_f32(tp, op, "bias", bias)) return NULL;
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

    int64_t yshape[4] = {g.N, g.Cout, g.OH, g.OW};
    if (g.cl) yshape[1] = g.OH, yshape[2] = g.OW, yshape[3] = g.Cout;
    cm_tensor *y = cmi_new(tp, CM_DTYPE_F32, 4, yshape);
    if (!y) return NULL;
    if (g.N == 0 || g.Cout == 0) return y;

    const int64_t K = cg_K(&g), P = cg_P(&g);
    const int nth = cm_num_threads();
    const float *w = cmi_f32(weight);
    float *wr = NULL;
    if (g.cl) {
        if (!(wr = cmi_scratch(tp, sizeof(float) * (size_t)(g.Cout * K)))) return NULL;
        weight_to_khwc(&g, w, wr);
        w = wr;
    }
    float *colbuf = NULL;
    const size_t mark = cm_arena_mark(tp->arena); /* the im2col buffer lives only during this call */
    if (!cg_pointwise(&g)) {
        int nbuf = par_images(&g, nth) ? nth : 1;
        if (!(colbuf = cmi_scratch(tp, sizeof(float) * (size_t)(nbuf * K * P)))) return NULL;
    }
    conv_forward(&g, cmi_f32(x), w, bias ? cmi_f32(bias) : NULL, cmi_f32(y), colbuf, nth);
    cm_arena_rewind(tp->arena, mark);

    cm_tensor *ins[3] = {x, weight, bias};
    if (cmi_needs_grad(tp, 3, ins)) {
        cm_node *n = cmi_record(tp, op, y, 3, ins, conv_backward, sizeof(conv_ctx));
        if (!n) return NULL;
        conv_ctx *c = n->ctx;
        c->g = g;
        c->wr = wr;
    }
    return y;
}
