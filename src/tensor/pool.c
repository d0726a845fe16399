/* Pooling and resizing over (N, C, H, W) or channels-last (N, H, W, C): max, average and adaptive
 * average pooling, and bilinear resize. Index arithmetic follows PyTorch's CPU kernels (window
 * bounds, ceil_mode, count_include_pad, source-index formula) so results match it exactly.
 *
 * Every kernel works on one (n, c) plane at a time through element strides, so any input view
 * (channels-last, transposed, sliced) is read in place; planes run in parallel. Results and
 * gradients are contiguous in the op's layout. */
#include "tensor/backend.h"
#include "tensor/tensor_impl.h"

#include <math.h>

/* A 4-d tensor seen as (N, C, H, W): sizes and element strides in that order. */
typedef struct {
    int64_t n, c, h, w;
    int64_t sn, sc, sh, sw;
} plane4;

static plane4 plane_of(int ndim_unused, const int64_t *shape, const int64_t *stride, bool cl) {
    (void)ndim_unused;
    plane4 p;
    p.n = shape[0], p.sn = stride[0];
    if (cl) p.h = shape[1], p.w = shape[2], p.c = shape[3], p.sh = stride[1], p.sw = stride[2], p.sc = stride[3];
    else p.c = shape[1], p.h = shape[2], p.w = shape[3], p.sc = stride[1], p.sh = stride[2], p.sw = stride[3];
    return p;
}
static plane4 plane_t(const cm_tensor *t, bool cl) { return plane_of(4, t->shape, t->stride, cl); }
/* The contiguous layout of t's shape (where gradients live). */
static plane4 plane_contig(const cm_tensor *t, bool cl) {
    int64_t st[4];
    cmi_contig_strides(4, t->shape, st);
    return plane_of(4, t->shape, st, cl);
}
static inline int64_t pl_off(const plane4 *p, int64_t n, int64_t c) { return n * p->sn + c * p->sc; }

/* A new (N, C, oh, ow) result in the op's layout. */
static cm_tensor *new_out(cm_tape *tp, const plane4 *x, int64_t oh, int64_t ow, bool cl) {
    int64_t s[4] = {x->n, x->c, oh, ow};
    if (cl) s[1] = oh, s[2] = ow, s[3] = x->c;
    return cmi_new(tp, CM_DTYPE_F32, 4, s);
}

static bool check_4d(cm_tape *tp, const char *op, const cm_tensor *x, bool cl) {
    if (!cmi_check_f32(tp, op, "x", x)) return false;
    if (x->ndim != 4) {
        cmi_fail(tp, CM_ERR_SHAPE, "%s: x %s must be 4-d %s", op, cmi_shape(x),
                 cl ? "(N, H, W, C) (channels_last)" : "(N, C, H, W)");
        return false;
    }
    return true;
}

/* ------------------------------------------------------------------------------------------ */
/* Max and average pooling                                                                      */
/* ------------------------------------------------------------------------------------------ */

cm_pool2d_opts cm_pool2d_opts_default(int kh, int kw) {
    cm_pool2d_opts o = {{kh, kw}, {0, 0}, {0, 0}, true, false, false};
    return o;
}

static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

/* PyTorch's pooling_output_shape (dilation 1): with ceil_mode the last window must start inside
 * the input or its left padding. */
static int64_t pool_out_size(int64_t in, int64_t k, int64_t pad, int64_t s, bool ceil_mode) {
    int64_t out = floor_div(in + 2 * pad - (k - 1) - 1 + (ceil_mode ? s - 1 : 0), s) + 1;
    if (ceil_mode && (out - 1) * s >= in + pad) out--;
    return out;
}

typedef struct {
    int64_t kh, kw, sh, sw, ph, pw, oh, ow;
    bool include_pad, cl;
} pool_geom;

/* The GPU's description of a pooling (backend.h): x read through X's strides, y (and its
 * gradient) through Y's, x's gradient through GX's (NULL: X's). Window fields from g (NULL:
 * adaptive). */
static cmi_pool_desc dev_desc(cmi_pool_kind kind, const plane4 *X, const plane4 *Y, const plane4 *GX,
                              const pool_geom *g) {
    cmi_pool_desc d = {.kind = kind, .N = X->n, .C = X->c, .H = X->h, .W = X->w, .OH = Y->h, .OW = Y->w};
    if (g) {
        d.kh = g->kh, d.kw = g->kw, d.sh = g->sh, d.sw = g->sw, d.ph = g->ph, d.pw = g->pw;
        d.include_pad = g->include_pad;
    }
    const plane4 *G = GX ? GX : X;
    const int64_t xs[4] = {X->sn, X->sc, X->sh, X->sw}, ys[4] = {Y->sn, Y->sc, Y->sh, Y->sw},
                  gs[4] = {G->sn, G->sc, G->sh, G->sw};
    memcpy(d.xs, xs, sizeof xs);
    memcpy(d.ys, ys, sizeof ys);
    memcpy(d.gxs, gs, sizeof gs);
    return d;
}

/* The backward of a pooling on the GPU: gx += the gradient gathered from gy (and arg for max). */
static cm_status dev_pool_bwd(cm_tape *tp, const struct cmi_backend *be, cmi_pool_kind kind, const cm_node *nd,
                              const float *gy, const int32_t *arg, float *gx, const pool_geom *g, bool cl) {
    const plane4 X = plane_contig(nd->in[0], cl), Y = plane_contig(nd->out, cl);
    const cmi_pool_desc d = dev_desc(kind, &X, &Y, NULL, g);
    cmi_dev_fail(tp, be->pool_bwd(&d, gy, arg, gx), nd->op);
    return cmi_status(tp);
}

static bool pool_setup(cm_tape *tp, const char *op, const cm_tensor *x, const cm_pool2d_opts *opts, pool_geom *g) {
    if (!opts) {
        cmi_fail(tp, CM_ERR_INVALID_ARG, "%s: opts is NULL (the kernel size is required: cm_pool2d_opts_default(kh, kw))",
                 op);
        return false;
    }
    if (!check_4d(tp, op, x, opts->channels_last)) return false;
    g->cl = opts->channels_last;
    g->include_pad = opts->count_include_pad;
    g->kh = opts->kernel[0], g->kw = opts->kernel[1];
    g->sh = opts->stride[0] ? opts->stride[0] : g->kh;
    g->sw = opts->stride[1] ? opts->stride[1] : g->kw;
    g->ph = opts->padding[0], g->pw = opts->padding[1];
    if (g->kh < 1 || g->kw < 1 || g->sh < 1 || g->sw < 1 || g->ph < 0 || g->pw < 0) {
        cmi_fail(tp, CM_ERR_INVALID_ARG,
                 "%s: kernel (%d, %d) must be >= 1, stride (%d, %d) >= 0 (0 = kernel) and padding (%d, %d) >= 0", op,
                 opts->kernel[0], opts->kernel[1], opts->stride[0], opts->stride[1], opts->padding[0],
                 opts->padding[1]);
        return false;
    }
    if (g->ph > g->kh / 2 || g->pw > g->kw / 2) {
        cmi_fail(tp, CM_ERR_INVALID_ARG, "%s: padding (%d, %d) must be at most half the kernel (%d, %d), as in PyTorch",
                 op, opts->padding[0], opts->padding[1], opts->kernel[0], opts->kernel[1]);
        return false;
    }
    plane4 p = plane_t(x, g->cl);
    g->oh = pool_out_size(p.h, g->kh, g->ph, g->sh, opts->ceil_mode);
    g->ow = pool_out_size(p.w, g->kw, g->pw, g->sw, opts->ceil_mode);
    if (g->oh <= 0 || g->ow <= 0) {
        cmi_fail(tp, CM_ERR_SHAPE, "%s: x %s with kernel (%d, %d), stride (%lld, %lld), padding (%d, %d) gives an "
                 "empty output (%lld x %lld)", op, cmi_shape(x), opts->kernel[0], opts->kernel[1], (long long)g->sh,
                 (long long)g->sw, opts->padding[0], opts->padding[1], (long long)g->oh, (long long)g->ow);
        return false;
    }
    return true;
}

/* ---- max pool: the gradient goes to the first maximum of each window (argmax saved) ---- */

typedef struct {
    pool_geom g;
    int32_t *arg; /* (N, C, OH, OW): h·W + w of the window's maximum */
} maxpool_ctx;

static cm_status max_pool_backward(cm_tape *tp, cm_node *nd, const cm_tensor *gout) {
    const maxpool_ctx *c = nd->ctx;
    cm_tensor *gx = cmi_grad(tp, nd->in[0]);
    if (!gx) return cmi_status(tp);
    const cmi_backend *be = cmi_be(tp);
    if (be) return dev_pool_bwd(tp, be, CMI_POOL_MAX, nd, cmi_f32(gout), c->arg, cmi_f32(gx), &c->g, c->g.cl);
    const plane4 X = plane_contig(nd->in[0], c->g.cl), Y = plane_contig(nd->out, c->g.cl);
    const int64_t OH = c->g.oh, OW = c->g.ow, NC = X.n * X.c;
    const float *gy = cmi_f32(gout);
    float *gxv = cmi_f32(gx);
    const int64_t work = NC * OH * OW; // planes run in parallel
#pragma omp parallel for if (work >= CMI_PAR_MIN) schedule(static)
    for (int64_t pc = 0; pc < NC; pc++) {
        const int64_t n = pc / X.c, ch = pc % X.c;
        const float *gp = gy + pl_off(&Y, n, ch);
        float *dp = gxv + pl_off(&X, n, ch);
        const int32_t *ap = c->arg + pc * OH * OW;
        for (int64_t i = 0; i < OH; i++)
            for (int64_t j = 0; j < OW; j++) {
                int64_t a = ap[i * OW + j];
                dp[(a / X.w) * X.sh + (a % X.w) * X.sw] += gp[i * Y.sh + j * Y.sw];
            }
    }
    return cmi_status(tp);
}

cm_tensor *cm_max_pool2d(cm_tape *tp, cm_tensor *x, const cm_pool2d_opts *opts) {
    static const char *op = "max_pool2d";
    if (!cmi_begin(tp, op, 1, &x)) return NULL;
    pool_geom g;
    if (!pool_setup(tp, op, x, opts, &g)) return NULL;
    const plane4 X = plane_t(x, g.cl);
    if (X.h * X.w > INT32_MAX) {
        cmi_fail(tp, CM_ERR_SHAPE, "max_pool2d: x %s has more than 2^31 elements per plane", cmi_shape(x));
        return NULL;
    }
    cm_tensor *out = new_out(tp, &X, g.oh, g.ow, g.cl);
    if (!out) return NULL;
    const plane4 Y = plane_t(out, g.cl);
    const int64_t NC = X.n * X.c, OH = g.oh, OW = g.ow;
    const bool grad = cmi_needs_grad(tp, 1, &x);
    int32_t *arg = NULL;
    if (grad && !(arg = cmi_dev_scratch(tp, sizeof(int32_t) * (size_t)(NC * OH * OW)))) return NULL;
    const float *xv = cmi_f32(x);
    float *yv = cmi_f32(out);
    const cmi_backend *be = cmi_be(tp);
    const cmi_pool_desc d = dev_desc(CMI_POOL_MAX, &X, &Y, NULL, &g);
    if (be && cmi_dev_fail(tp, be->pool(&d, xv, yv, arg), op)) return NULL;
    const int64_t work = NC * OH * OW * g.kh * g.kw; // planes run in parallel
#pragma omp parallel for if (work >= CMI_PAR_MIN) schedule(static)
    for (int64_t pc = 0; pc < (be ? 0 : NC); pc++) {
        const int64_t n = pc / X.c, ch = pc % X.c;
        const float *xp = xv + pl_off(&X, n, ch);
        float *yp = yv + pl_off(&Y, n, ch);
        for (int64_t i = 0; i < OH; i++) {
            const int64_t h0 = i * g.sh - g.ph, h1 = h0 + g.kh < X.h ? h0 + g.kh : X.h, hs = h0 < 0 ? 0 : h0;
            for (int64_t j = 0; j < OW; j++) {
                const int64_t w0 = j * g.sw - g.pw, w1 = w0 + g.kw < X.w ? w0 + g.kw : X.w, ws = w0 < 0 ? 0 : w0;
                float best = -INFINITY;
                int64_t bi = hs * X.w + ws;
                for (int64_t h = hs; h < h1; h++)
                    for (int64_t w = ws; w < w1; w++) {
                        float v = xp[h * X.sh + w * X.sw];
                        if (v > best || (isnan(v) && !isnan(best))) {
                            best = v;
                            bi = h * X.w + w;
                        }
                    }
                yp[i * Y.sh + j * Y.sw] = best;
                if (arg) arg[pc * OH * OW + i * OW + j] = (int32_t)bi;
            }
        }
    }
    if (grad) {
        cm_node *nd = cmi_record(tp, op, out, 1, &x, max_pool_backward, sizeof(maxpool_ctx));
        if (!nd) return NULL;
        maxpool_ctx *c = nd->ctx;
        c->g = g;
        c->arg = arg;
    }
    return out;
}

/* ---- average pool ---- */

/* The window of output (i) along one axis: [*s, *e) clipped to the input, and the divisor
 * extent (clipped to the padded input only), as PyTorch's avg_pool2d. */
static inline void avg_window(int64_t i, int64_t s, int64_t p, int64_t k, int64_t in, int64_t *a, int64_t *b,
                              int64_t *padded) {
    int64_t st = i * s - p, en = st + k < in + p ? st + k : in + p;
    *padded = en - st;
    *a = st < 0 ? 0 : st;
    *b = en < in ? en : in;
}

static cm_status avg_pool_backward(cm_tape *tp, cm_node *nd, const cm_tensor *gout) {
    const pool_geom *g = nd->ctx;
    cm_tensor *gx = cmi_grad(tp, nd->in[0]);
    if (!gx) return cmi_status(tp);
    const cmi_backend *be = cmi_be(tp);
    if (be) return dev_pool_bwd(tp, be, CMI_POOL_AVG, nd, cmi_f32(gout), NULL, cmi_f32(gx), g, g->cl);
    const plane4 X = plane_contig(nd->in[0], g->cl), Y = plane_contig(nd->out, g->cl);
    const int64_t NC = X.n * X.c;
    const float *gy = cmi_f32(gout);
    float *gxv = cmi_f32(gx);
    const int64_t work = NC * g->oh * g->ow * g->kh * g->kw; // planes run in parallel
#pragma omp parallel for if (work >= CMI_PAR_MIN) schedule(static)
    for (int64_t pc = 0; pc < NC; pc++) {
        const int64_t n = pc / X.c, ch = pc % X.c;
        const float *gp = gy + pl_off(&Y, n, ch);
        float *dp = gxv + pl_off(&X, n, ch);
        for (int64_t i = 0; i < g->oh; i++) {
            int64_t ha, hb, hp;
            avg_window(i, g->sh, g->ph, g->kh, X.h, &ha, &hb, &hp);
            for (int64_t j = 0; j < g->ow; j++) {
                int64_t wa, wb, wp;
                avg_window(j, g->sw, g->pw, g->kw, X.w, &wa, &wb, &wp);
                int64_t div = g->include_pad ? hp * wp : (hb - ha) * (wb - wa);
                float v = gp[i * Y.sh + j * Y.sw] / (float)div;
                for (int64_t h = ha; h < hb; h++)
                    for (int64_t w = wa; w < wb; w++) dp[h * X.sh + w * X.sw] += v;
            }
        }
    }
    return cmi_status(tp);
}

cm_tensor *cm_avg_pool2d(cm_tape *tp, cm_tensor *x, const cm_pool2d_opts *opts) {
    static const char *op = "avg_pool2d";
    if (!cmi_begin(tp, op, 1, &x)) return NULL;
    pool_geom g;
    if (!pool_setup(tp, op, x, opts, &g)) return NULL;
    const plane4 X = plane_t(x, g.cl);
    cm_tensor *out = new_out(tp, &X, g.oh, g.ow, g.cl);
    if (!out) return NULL;
    const plane4 Y = plane_t(out, g.cl);
    const int64_t NC = X.n * X.c;
    const float *xv = cmi_f32(x);
    float *yv = cmi_f32(out);
    const cmi_backend *be = cmi_be(tp);
    const cmi_pool_desc d = dev_desc(CMI_POOL_AVG, &X, &Y, NULL, &g);
    if (be && cmi_dev_fail(tp, be->pool(&d, xv, yv, NULL), op)) return NULL;
    const int64_t work = NC * g.oh * g.ow * g.kh * g.kw; // planes run in parallel
#pragma omp parallel for if (work >= CMI_PAR_MIN) schedule(static)
    for (int64_t pc = 0; pc < (be ? 0 : NC); pc++) {
        const int64_t n = pc / X.c, ch = pc % X.c;
        const float *xp = xv + pl_off(&X, n, ch);
        float *yp = yv + pl_off(&Y, n, ch);
        for (int64_t i = 0; i < g.oh; i++) {
            int64_t ha, hb, hp;
            avg_window(i, g.sh, g.ph, g.kh, X.h, &ha, &hb, &hp);
            for (int64_t j = 0; j < g.ow; j++) {
                int64_t wa, wb, wp;
                avg_window(j, g.sw, g.pw, g.kw, X.w, &wa, &wb, &wp);
                float s = 0.0f;
                for (int64_t h = ha; h < hb; h++)
                    for (int64_t w = wa; w < wb; w++) s += xp[h * X.sh + w * X.sw];
                int64_t div = g.include_pad ? hp * wp : (hb - ha) * (wb - wa);
                yp[i * Y.sh + j * Y.sw] = s / (float)div;
            }
        }
    }
    if (cmi_needs_grad(tp, 1, &x)) {
        cm_node *nd = cmi_record(tp, op, out, 1, &x, avg_pool_backward, sizeof(pool_geom));
        if (!nd) return NULL;
        *(pool_geom *)nd->ctx = g;
    }
    return out;
}

/* ------------------------------------------------------------------------------------------ */
/* Adaptive average pool: window i covers [floor(i·H/out), ceil((i+1)·H/out))                   */
/* ------------------------------------------------------------------------------------------ */

static inline int64_t ad_start(int64_t i, int64_t in, int64_t out) { return (i * in) / out; }
static inline int64_t ad_end(int64_t i, int64_t in, int64_t out) { return ((i + 1) * in + out - 1) / out; }

static cm_status adaptive_backward(cm_tape *tp, cm_node *nd, const cm_tensor *gout) {
    const bool cl = nd->i[0];
    cm_tensor *gx = cmi_grad(tp, nd->in[0]);
    if (!gx) return cmi_status(tp);
    const cmi_backend *be = cmi_be(tp);
    if (be) return dev_pool_bwd(tp, be, CMI_POOL_ADAPTIVE, nd, cmi_f32(gout), NULL, cmi_f32(gx), NULL, cl);
    const plane4 X = plane_contig(nd->in[0], cl), Y = plane_contig(nd->out, cl);
    const int64_t NC = X.n * X.c, OH = Y.h, OW = Y.w;
    const float *gy = cmi_f32(gout);
    float *gxv = cmi_f32(gx);
    const int64_t work = NC * X.h * X.w; // planes run in parallel
#pragma omp parallel for if (work >= CMI_PAR_MIN) schedule(static)
    for (int64_t pc = 0; pc < NC; pc++) {
        const int64_t n = pc / X.c, ch = pc % X.c;
        const float *gp = gy + pl_off(&Y, n, ch);
        float *dp = gxv + pl_off(&X, n, ch);
        for (int64_t i = 0; i < OH; i++) {
            const int64_t ha = ad_start(i, X.h, OH), hb = ad_end(i, X.h, OH);
            for (int64_t j = 0; j < OW; j++) {
                const int64_t wa = ad_start(j, X.w, OW), wb = ad_end(j, X.w, OW);
                float v = gp[i * Y.sh + j * Y.sw] / (float)((hb - ha) * (wb - wa));
                for (int64_t h = ha; h < hb; h++)
                    for (int64_t w = wa; w < wb; w++) dp[h * X.sh + w * X.sw] += v;
            }
        }
    }
    return cmi_status(tp);
}

cm_tensor *cm_adaptive_avg_pool2d(cm_tape *tp, cm_tensor *x, int64_t out_h, int64_t out_w, bool channels_last) {
    static const char *op = "adaptive_avg_pool2d";
    if (!cmi_begin(tp, op, 1, &x)) return NULL;
    if (!check_4d(tp, op, x, channels_last)) return NULL;
    const plane4 X = plane_t(x, channels_last);
    if (out_h < 1 || out_w < 1 || X.h < 1 || X.w < 1) {
        cmi_fail(tp, CM_ERR_SHAPE, "adaptive_avg_pool2d: output size (%lld, %lld) and the spatial size of x %s must be "
                 ">= 1", (long long)out_h, (long long)out_w, cmi_shape(x));
        return NULL;
    }
    cm_tensor *out = new_out(tp, &X, out_h, out_w, channels_last);
    if (!out) return NULL;
    const plane4 Y = plane_t(out, channels_last);
    const int64_t NC = X.n * X.c;
    const float *xv = cmi_f32(x);
    float *yv = cmi_f32(out);
    const cmi_backend *be = cmi_be(tp);
    const cmi_pool_desc d = dev_desc(CMI_POOL_ADAPTIVE, &X, &Y, NULL, NULL);
    if (be && cmi_dev_fail(tp, be->pool(&d, xv, yv, NULL), op)) return NULL;
    const int64_t work = NC * X.h * X.w; // planes run in parallel
#pragma omp parallel for if (work >= CMI_PAR_MIN) schedule(static)
    for (int64_t pc = 0; pc < (be ? 0 : NC); pc++) {
        const int64_t n = pc / X.c, ch = pc % X.c;
        const float *xp = xv + pl_off(&X, n, ch);
        float *yp = yv + pl_off(&Y, n, ch);
        for (int64_t i = 0; i < out_h; i++) {
            const int64_t ha = ad_start(i, X.h, out_h), hb = ad_end(i, X.h, out_h);
            for (int64_t j = 0; j < out_w; j++) {
                const int64_t wa = ad_start(j, X.w, out_w), wb = ad_end(j, X.w, out_w);
                float s = 0.0f;
                for (int64_t h = ha; h < hb; h++)
                    for (int64_t w = wa; w < wb; w++) s += xp[h * X.sh + w * X.sw];
                yp[i * Y.sh + j * Y.sw] = s / (float)((hb - ha) * (wb - wa));
            }
        }
    }
    if (cmi_needs_grad(tp, 1, &x)) {
        cm_node *nd = cmi_record(tp, op, out, 1, &x, adaptive_backward, 0);
        if (!nd) return NULL;
        nd->i[0] = channels_last;
    }
    return out;
}

/* ------------------------------------------------------------------------------------------ */
/* Bilinear resize (F.interpolate mode="bilinear", size given)                                  */
/* ------------------------------------------------------------------------------------------ */

typedef cmi_lin_tap lin_tap; /* i0, i1 and their weights l0, l1 (backend.h) */

/* PyTorch's area_pixel_compute_source_index + guard_index_and_lambda, in float as its CPU kernel. */
static void linear_taps(int64_t in, int64_t out, bool align_corners, lin_tap *t) {
    float scale = align_corners ? (out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f) : (float)in / (float)out;
    for (int64_t o = 0; o < out; o++) {
        float src;
        if (align_corners) {
            src = scale * (float)o;
        } else {
            src = scale * ((float)o + 0.5f) - 0.5f;
            if (src < 0.0f) src = 0.0f;
        }
        int64_t i0 = (int64_t)floorf(src);
        if (i0 > in - 1) i0 = in - 1;
        float l = src - (float)i0;
        l = l < 0.0f ? 0.0f : (l > 1.0f ? 1.0f : l);
        t[o].i0 = i0;
        t[o].i1 = i0 + (i0 < in - 1 ? 1 : 0);
        t[o].l1 = l;
        t[o].l0 = 1.0f - l;
    }
}

typedef struct {
    lin_tap *th, *tw; /* (OH), (OW) */
    bool cl;
    void *dev; /* on the GPU: the taps and the backward's ranges in device memory (cmi_resize_desc) */
} resize_ctx;

/* The device's description of a resize of X into Y (gradients of x through GX's strides) with
 * its taps at `dev` (resize_upload's layout). */
static cmi_resize_desc resize_desc(const plane4 *X, const plane4 *Y, const plane4 *GX, void *dev) {
    cmi_resize_desc d = {.g = dev_desc(CMI_POOL_AVG, X, Y, GX, NULL)};
    d.th = dev;
    d.tw = d.th + Y->h;
    d.rh = (const int64_t *)(d.tw + Y->w);
    d.rw = d.rh + 2 * X->h;
    return d;
}

/* For each input coordinate v in [0, in) the output coordinates [r[2v], r[2v + 1]) whose taps read
 * it (a contiguous run: i0 never decreases along the output and i1 is i0 or i0 + 1). */
static void tap_ranges(const lin_tap *t, int64_t in, int64_t out, int64_t *r) {
    for (int64_t v = 0; v < in; v++) r[2 * v] = out, r[2 * v + 1] = 0;
    for (int64_t o = 0; o < out; o++) {
        const int64_t vs[2] = {t[o].i0, t[o].i1};
        for (int k = 0; k < 2; k++) {
            int64_t *lo = r + 2 * vs[k], *hi = lo + 1;
            if (o < *lo) *lo = o;
            if (o + 1 > *hi) *hi = o + 1;
        }
    }
    for (int64_t v = 0; v < in; v++)
        if (r[2 * v] > r[2 * v + 1]) r[2 * v] = r[2 * v + 1] = 0;
}

/* The taps th (OH), tw (OW) and their ranges copied to device memory of the tape: NULL + tape
 * error on failure. */
static void *resize_upload(cm_tape *tp, const cmi_backend *be, const lin_tap *th, int64_t H, int64_t OH,
                           const lin_tap *tw, int64_t W, int64_t OW) {
    const size_t bytes = sizeof(lin_tap) * (size_t)(OH + OW) + sizeof(int64_t) * (size_t)(2 * H + 2 * W);
    char *host = cmi_scratch(tp, bytes);
    void *dev = cmi_dev_scratch(tp, bytes);
    if (!host || !dev) return NULL;
    memcpy(host, th, sizeof(lin_tap) * (size_t)OH);
    memcpy(host + sizeof(lin_tap) * (size_t)OH, tw, sizeof(lin_tap) * (size_t)OW);
    int64_t *rh = (int64_t *)(host + sizeof(lin_tap) * (size_t)(OH + OW)), *rw = rh + 2 * H;
    tap_ranges(th, H, OH, rh);
    tap_ranges(tw, W, OW, rw);
    if (cmi_dev_fail(tp, be->memcpy(dev, host, bytes, CMI_H2D), "resize_bilinear")) return NULL;
    return dev;
}

static cm_status resize_backward(cm_tape *tp, cm_node *nd, const cm_tensor *gout) {
    const resize_ctx *c = nd->ctx;
    cm_tensor *gx = cmi_grad(tp, nd->in[0]);
    if (!gx) return cmi_status(tp);
    const plane4 X = plane_contig(nd->in[0], c->cl), Y = plane_contig(nd->out, c->cl);
    const int64_t NC = X.n * X.c;
    const cmi_backend *be = cmi_be(tp);
    if (be) {
        const cmi_resize_desc d = resize_desc(&X, &Y, NULL, c->dev);
        cmi_dev_fail(tp, be->resize_bwd(&d, cmi_f32(gout), cmi_f32(gx)), "resize_bilinear backward");
        return cmi_status(tp);
    }
    const float *gy = cmi_f32(gout);
    float *gxv = cmi_f32(gx);
    const int64_t work = NC * Y.h * Y.w; // planes run in parallel
#pragma omp parallel for if (work >= CMI_PAR_MIN) schedule(static)
    for (int64_t pc = 0; pc < NC; pc++) {
        const int64_t n = pc / X.c, ch = pc % X.c;
        const float *gp = gy + pl_off(&Y, n, ch);
        float *dp = gxv + pl_off(&X, n, ch);
        for (int64_t i = 0; i < Y.h; i++) {
            const lin_tap th = c->th[i];
            float *r0 = dp + th.i0 * X.sh, *r1 = dp + th.i1 * X.sh;
            for (int64_t j = 0; j < Y.w; j++) {
                const lin_tap tw = c->tw[j];
                const float v = gp[i * Y.sh + j * Y.sw];
                r0[tw.i0 * X.sw] += th.l0 * tw.l0 * v;
                r0[tw.i1 * X.sw] += th.l0 * tw.l1 * v;
                r1[tw.i0 * X.sw] += th.l1 * tw.l0 * v;
                r1[tw.i1 * X.sw] += th.l1 * tw.l1 * v;
            }
        }
    }
    return cmi_status(tp);
}

cm_tensor *cm_resize_bilinear(cm_tape *tp, cm_tensor *x, int64_t out_h, int64_t out_w, bool align_corners,
                              bool channels_last) {
    static const char *op = "resize_bilinear";
    if (!cmi_begin(tp, op, 1, &x)) return NULL;
    if (!check_4d(tp, op, x, channels_last)) return NULL;
    const plane4 X = plane_t(x, channels_last);
    if (out_h < 1 || out_w < 1 || X.h < 1 || X.w < 1) {
        cmi_fail(tp, CM_ERR_SHAPE, "resize_bilinear: output size (%lld, %lld) and the spatial size of x %s must be >= 1",
                 (long long)out_h, (long long)out_w, cmi_shape(x));
        return NULL;
    }
    cm_tensor *out = new_out(tp, &X, out_h, out_w, channels_last);
    lin_tap *th = cmi_scratch(tp, sizeof(lin_tap) * (size_t)(out_h + out_w));
    if (!out || !th) return NULL;
    lin_tap *tw = th + out_h;
    linear_taps(X.h, out_h, align_corners, th);
    linear_taps(X.w, out_w, align_corners, tw);
    const plane4 Y = plane_t(out, channels_last);
    const int64_t NC = X.n * X.c;
    const float *xv = cmi_f32(x);
    float *yv = cmi_f32(out);
    const cmi_backend *be = cmi_be(tp);
    void *dev = NULL;
    if (be) {
        if (!(dev = resize_upload(tp, be, th, X.h, out_h, tw, X.w, out_w))) return NULL;
        const cmi_resize_desc d = resize_desc(&X, &Y, NULL, dev);
        if (cmi_dev_fail(tp, be->resize(&d, xv, yv), op)) return NULL;
    }
    const int64_t work = NC * out_h * out_w; // planes run in parallel
#pragma omp parallel for if (work >= CMI_PAR_MIN) schedule(static)
    for (int64_t pc = 0; pc < (be ? 0 : NC); pc++) {
        const int64_t n = pc / X.c, ch = pc % X.c;
        const float *xp = xv + pl_off(&X, n, ch);
        float *yp = yv + pl_off(&Y, n, ch);
        for (int64_t i = 0; i < out_h; i++) {
            const lin_tap a = th[i];
            const float *r0 = xp + a.i0 * X.sh, *r1 = xp + a.i1 * X.sh;
            for (int64_t j = 0; j < out_w; j++) {
                const lin_tap b = tw[j];
                yp[i * Y.sh + j * Y.sw] = a.l0 * (b.l0 * r0[b.i0 * X.sw] + b.l1 * r0[b.i1 * X.sw]) +
                                          a.l1 * (b.l0 * r1[b.i0 * X.sw] + b.l1 * r1[b.i1 * X.sw]);
            }
        }
    }
    if (cmi_needs_grad(tp, 1, &x)) {
        cm_node *nd = cmi_record(tp, op, out, 1, &x, resize_backward, sizeof(resize_ctx));
        if (!nd) return NULL;
        resize_ctx *c = nd->ctx;
        c->th = th;
        c->tw = tw;
        c->cl = channels_last;
        c->dev = dev;
    }
    return out;
}
