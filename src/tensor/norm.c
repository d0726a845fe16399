/* Normalisation (layer, batch, group) and dropout. Each forward pass saves its statistics (per-row or
 * per-channel mean and 1/std) in the arena and each backward pass uses the fused closed form, so a
 * normalisation layer costs one node and no intermediate activations.
 *
 * Batch norm's dtypes: x and its output are f32 or bf16 alike, the residual f32 or bf16, the
 * statistics and arithmetic f32. Gradients are f32 with two bf16 exceptions (cmi_grad_for_write_as),
 * both under autocast in a ResNet: the new gradient of a bf16 x made by a bf16 convolution is
 * written in bf16 (the convolution would round it anyway), and the gradient of a bf16 output may
 * arrive in bf16 (n->bf16_gout: written so by the bf16 convolution consuming it), read widened
 * (exact) in both passes over it. A bf16 gradient only ever meets a bf16 x. */
#include "tensor/backend.h"
#include "tensor/tensor_impl.h"

#include <math.h>
#include <omp.h>

/* ------------------------------------------------------------------------------------------ */
/* Shared helpers                                                                               */
/* ------------------------------------------------------------------------------------------ */

/* An optional per-channel parameter: NULL, or f32 (C). Replaced by its contiguous version. */
static bool param_check(cm_tape *tp, const char *op, const char *name, cm_tensor **p, int64_t C, const cm_tensor *x) {
    if (!*p) return true;
    if (!cmi_check_f32(tp, op, name, *p)) return false;
    if ((*p)->ndim != 1 || (*p)->shape[0] != C) {
        cmi_fail(tp, CM_ERR_SHAPE, "%s: %s %s must be 1-d with %lld entries (the channels of x %s)", op, name,
                 cmi_shape(*p), (long long)C, cmi_shape(x));
        return false;
    }
    *p = cm_contiguous(tp, *p);
    return *p != NULL;
}

static bool eps_check(cm_tape *tp, const char *op, float eps) {
    if (eps >= 0.0f && isfinite(eps)) return true;
    cmi_fail(tp, CM_ERR_INVALID_ARG, "%s: eps %g must be finite and >= 0", op, (double)eps);
    return false;
}

/* Mean and 1/sqrt(var + eps) of each contiguous row: x (rows, L) -> mean, rstd (rows). Two passes
 * (mean, then squared deviations) so large offsets do not cancel. */
static void row_stats(const float *x, int64_t rows, int64_t L, float eps, float *mean, float *rstd) {
#pragma omp parallel for if (rows * L >= CMI_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * L; // (L)
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < L; i++) s += xr[i];
        const float m = s / (float)L;
        float v = 0.0f;
#pragma omp simd reduction(+ : v)
        for (int64_t i = 0; i < L; i++) v += (xr[i] - m) * (xr[i] - m);
        mean[r] = m;
        rstd[r] = 1.0f / sqrtf(v / (float)L + eps);
    }
}

/* Saved statistics of a normalisation node: (rows) for layer/group norm, (C) for batch norm. */
typedef struct {
    float *mean;
    float *rstd;
    float *affine; /* batch norm: the forward's Q then R, (C) each (chan_affine's coefficients) */
} stats_ctx;

/* ------------------------------------------------------------------------------------------ */
/* Layer norm: x (R, C) -> (x - mean_r) · rstd_r · w + b                                        */
/* ------------------------------------------------------------------------------------------ */

static cm_status layer_norm_backward(cm_tape *tp, cm_node *n, const cm_tensor *gout) {
    cm_tensor *x = n->in[0], *w = n->in[1], *b = n->in[2];
    const stats_ctx *s = n->ctx;
    const int64_t C = x->shape[x->ndim - 1], R = cmi_numel(x->ndim - 1, x->shape);
    bool fresh = false; /* a gradient of x created now is written, not zeroed and added to */
    cm_tensor *gx = cmi_grad_for_write(tp, x, &fresh), *gw = cmi_grad(tp, w), *gb = cmi_grad(tp, b);
    if (cmi_status(tp)) return cmi_status(tp);
    const float *xv = cmi_f32(x), *gv = cmi_f32(gout), *wv = w ? cmi_f32(w) : NULL; // (R, C), (R, C), (C)
    float *gxv = gx ? cmi_f32(gx) : NULL;                                               // (R, C)
    const cmi_backend *be = cmi_be(tp);
    if (be) {
        cmi_dev_fail(tp,
                     be->layer_norm_bwd(xv, wv, gv, s->mean, s->rstd, gxv, fresh, gw ? cmi_f32(gw) : NULL,
                                        gb ? cmi_f32(gb) : NULL, R, C),
                     "layer_norm backward");
        return cmi_status(tp);
    }
    const int nth = (R * C >= CMI_PAR_MIN) ? cm_num_threads() : 1;
    float *partial = NULL; // (nth, 2, C): per-thread sums of g·xhat and g
    if (gw || gb) {
        partial = cmi_scratch(tp, sizeof(float) * (size_t)(2 * C * nth + 1));
        if (!partial) return cmi_status(tp);
        memset(partial, 0, sizeof(float) * (size_t)(2 * C * nth));
    }
#pragma omp parallel num_threads(nth)
    {
        float *pw = partial ? partial + (int64_t)omp_get_thread_num() * 2 * C : NULL, *pb = pw ? pw + C : NULL;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < R; r++) {
            const float *xr = xv + r * C, *gr = gv + r * C;
            const float m = s->mean[r], rs = s->rstd[r];
            if (gxv) {
                /* dx = rstd · (g·w - mean(g·w) - xhat · mean(g·w·xhat)) */
                float a = 0.0f, c2 = 0.0f;
#pragma omp simd reduction(+ : a, c2)
                for (int64_t c = 0; c < C; c++) {
                    const float gw_ = wv ? gr[c] * wv[c] : gr[c];
                    a += gw_;
                    c2 += gw_ * (xr[c] - m) * rs;
                }
                a /= (float)C;
                c2 /= (float)C;
                float *dx = gxv + r * C;
                if (fresh) {
#pragma omp simd
                    for (int64_t c = 0; c < C; c++) {
                        const float gw_ = wv ? gr[c] * wv[c] : gr[c];
                        dx[c] = rs * (gw_ - a - (xr[c] - m) * rs * c2);
                    }
                } else {
#pragma omp simd
                    for (int64_t c = 0; c < C; c++) {
                        const float gw_ = wv ? gr[c] * wv[c] : gr[c];
                        dx[c] += rs * (gw_ - a - (xr[c] - m) * rs * c2);
                    }
                }
            }
            if (pw) {
#pragma omp simd
                for (int64_t c = 0; c < C; c++) {
                    pw[c] += gr[c] * (xr[c] - m) * rs;
                    pb[c] += gr[c];
                }
            }
        }
    }
    for (int t = 0; t < (partial ? nth : 0); t++) {
        const float *pw = partial + (int64_t)t * 2 * C, *pb = pw + C;
        if (gw)
            for (int64_t c = 0; c < C; c++) cmi_f32(gw)[c] += pw[c];
        if (gb)
            for (int64_t c = 0; c < C; c++) cmi_f32(gb)[c] += pb[c];
    }
    return cmi_status(tp);
}

cm_tensor *cm_layer_norm(cm_tape *tp, cm_tensor *x, cm_tensor *weight, cm_tensor *bias, float eps) {
    if (!cmi_begin(tp, "layer_norm", 1, &x) || !cmi_fetch(tp, 2, (cm_tensor *const[]){weight, bias})) return NULL;
    if (!cmi_check_f32(tp, "layer_norm", "x", x) || !eps_check(tp, "layer_norm", eps)) return NULL;
    if (x->ndim < 1) {
        cmi_fail(tp, CM_ERR_SHAPE, "layer_norm: x %s must have at least one dim (normalised over the last)",
                 cmi_shape(x));
        return NULL;
    }
    const int64_t C = x->shape[x->ndim - 1];
    int64_t R = cmi_numel(x->ndim - 1, x->shape);
    if (!param_check(tp, "layer_norm", "weight", &weight, C, x) || !param_check(tp, "layer_norm", "bias", &bias, C, x))
        return NULL;
    x = cm_contiguous(tp, x);
    if (!x) return NULL;
    cm_tensor *out = cmi_new(tp, CM_DTYPE_F32, x->ndim, x->shape);
    float *mean = cmi_dev_scratch(tp, sizeof(float) * (size_t)(R + 1)); // (R)
    float *rstd = cmi_dev_scratch(tp, sizeof(float) * (size_t)(R + 1)); // (R)
    if (!out || !mean || !rstd) return NULL;
    const float *xv = cmi_f32(x), *wv = weight ? cmi_f32(weight) : NULL, *bv = bias ? cmi_f32(bias) : NULL;
    float *ov = cmi_f32(out);
    const cmi_backend *be = cmi_be(tp);
    if (be) {
        if (cmi_dev_fail(tp, be->layer_norm(xv, wv, bv, ov, mean, rstd, R, C, eps), "layer_norm")) return NULL;
        R = 0; /* the CPU loops below have nothing to do */
    } else {
        row_stats(xv, R, C, eps, mean, rstd);
    }
#pragma omp parallel for if (R * C >= CMI_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < R; r++) {
        const float *xr = xv + r * C; // (C)
        float *orow = ov + r * C;     // (C)
        const float m = mean[r], rs = rstd[r];
        for (int64_t c = 0; c < C; c++) {
            float y = (xr[c] - m) * rs;
            if (wv) y *= wv[c];
            if (bv) y += bv[c];
            orow[c] = y;
        }
    }
    cm_tensor *ins[3] = {x, weight, bias};
    if (cmi_needs_grad(tp, 3, ins)) {
        cm_node *n = cmi_record(tp, "layer_norm", out, 3, ins, layer_norm_backward, sizeof(stats_ctx));
        if (!n) return NULL;
        stats_ctx *s = n->ctx;
        s->mean = mean;
        s->rstd = rstd;
    }
    return out;
}

/* ------------------------------------------------------------------------------------------ */
/* Per-channel kernels over a (O, C, I) layout: NCHW is (N, C, H·W); channels_last is (N·H·W, C, 1) */
/* ------------------------------------------------------------------------------------------ */

/* Element i of an f32 (bf false) or bf16 (bf true) buffer, as f32; with a constant bf a loop over it
 * compiles to the plain f32 loop or to a widening load, both vectorised. */
static inline __attribute__((always_inline)) float ld(const void *p, int64_t i, const bool bf) {
    return bf ? cmi_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}
/* Stores v at element i, rounded to nearest even when bf. */
static inline __attribute__((always_inline)) void st(void *p, int64_t i, float v, const bool bf) {
    if (bf)
        ((uint16_t *)p)[i] = cmi_f32_to_bf16(v);
    else
        ((float *)p)[i] = v;
}
/* p advanced by i elements of its dtype. */
static inline __attribute__((always_inline)) const void *at(const void *p, int64_t i, const bool bf) {
    return bf ? (const void *)((const uint16_t *)p + i) : (const void *)((const float *)p + i);
}

/* F(args..., CK): the row kernels with the channel count CV a compile-time constant CK for the
 * common widths (fully unrolled, no remainder), else CK 0 (CV at run time). */
#define CMI_BY_C(CV, F, ...)                                                                                           \
    do {                                                                                                               \
        if ((CV) == 16) F(__VA_ARGS__, 16);                                                                            \
        else if ((CV) == 32) F(__VA_ARGS__, 32);                                                                       \
        else if ((CV) == 64) F(__VA_ARGS__, 64);                                                                       \
        else F(__VA_ARGS__, 0);                                                                                        \
    } while (0)

/* Rows [o0, o1) of C channels (channels_last) for chan_affine, specialised by the constant flags. */
static inline __attribute__((always_inline)) void affine_rows(void *restrict out, const void *restrict x,
                                                              const void *restrict res, const float *restrict S,
                                                              const float *restrict Q, const float *restrict R,
                                                              int64_t o0, int64_t o1, int64_t C, const bool has_res,
                                                              const bool relu, const bool xbf, const bool rbf,
                                                              const int64_t CK) {
    if (CK) C = CK;
    float yb[64]; /* a bf16 row of CK channels: f32 here, then rounded as a row */
    for (int64_t o = o0; o < o1; o++) {
        void *restrict orow = (void *)at(out, o * C, xbf);
        const void *restrict xr = at(x, o * C, xbf), *restrict rr = has_res ? at(res, o * C, rbf) : NULL; // (C)
#pragma omp simd
        for (int64_t c = 0; c < C; c++) {
            float y = (ld(xr, c, xbf) - S[c]) * Q[c] + R[c];
            if (has_res) y += ld(rr, c, rbf);
            if (relu) y = y > 0.0f ? y : 0.0f;
            if (xbf && CK) yb[c] = y;
            else st(orow, c, y, xbf);
        }
        if (xbf && CK) cmi_bf16_round16(orow, yb, CK);
    }
}

/* One (o, c) plane of I values (NCHW) for chan_affine. */
static inline __attribute__((always_inline)) void affine_plane(void *restrict out, const void *restrict x,
                                                               const void *restrict res, float s, float q, float r,
                                                               int64_t I, const bool has_res, const bool relu,
                                                               const bool xbf, const bool rbf) {
#pragma omp simd
    for (int64_t i = 0; i < I; i++) {
        float y = (ld(x, i, xbf) - s) * q + r;
        if (has_res) y += ld(res, i, rbf);
        if (relu) y = y > 0.0f ? y : 0.0f;
        st(out, i, y, xbf);
    }
}

/* out[e] = (x[e] - S[c])·Q[c] + R[c] over the (O, C, I) layout, + res[e] when res is given, then
 * max(·, 0) when relu. x and out are both f32 or both bf16 (xbf; out rounded to nearest even), res
 * f32 or bf16 (rbf); S, Q and R are f32 (C) and the arithmetic is f32 either way. out is new
 * memory (it overlaps neither x nor res). */
static void chan_affine(void *out, const void *x, const float *S, const float *Q, const float *R, int64_t O, int64_t C,
                        int64_t I, const void *res, bool relu, bool xbf, bool rbf) {
    const bool par = O * C * I >= CMI_PAR_MIN;
    /* one specialised loop per case and dtype, chosen inside the parallel loops (OpenMP outlines a
     * parallel region before inlining, so flags passed into one would stay run-time values) */
    const int mode = (relu ? 1 : 0) | (xbf ? 2 : 0) | (res ? (rbf ? 8 : 4) : 0);
#define CMI_AFFINE_CASES(CALL)                                                                                        \
    switch (mode) {                                                                                                    \
    case 0: CALL(false, false, false, false); break;                                                                   \
    case 1: CALL(false, true, false, false); break;                                                                    \
    case 2: CALL(false, false, true, false); break;                                                                    \
    case 3: CALL(false, true, true, false); break;                                                                     \
    case 4: CALL(true, false, false, false); break;                                                                    \
    case 5: CALL(true, true, false, false); break;                                                                     \
    case 6: CALL(true, false, true, false); break;                                                                     \
    case 7: CALL(true, true, true, false); break;                                                                      \
    case 8: CALL(true, false, false, true); break;                                                                     \
    case 9: CALL(true, true, false, true); break;                                                                      \
    case 10: CALL(true, false, true, true); break;                                                                     \
    default: CALL(true, true, true, true); break;                                                                      \
    }
    if (I == 1) {
        enum { BLK = 64 };
#pragma omp parallel for if (par) schedule(static)
        for (int64_t o0 = 0; o0 < O; o0 += BLK) {
            const int64_t o1 = o0 + BLK < O ? o0 + BLK : O;
#define CMI_ROWS(HR, RL, XB, RB) CMI_BY_C(C, affine_rows, out, x, res, S, Q, R, o0, o1, C, HR, RL, XB, RB)
            CMI_AFFINE_CASES(CMI_ROWS)
#undef CMI_ROWS
        }
    } else {
#pragma omp parallel for collapse(2) if (par) schedule(static)
        for (int64_t o = 0; o < O; o++)
            for (int64_t c = 0; c < C; c++) {
                const int64_t base = (o * C + c) * I;
#define CMI_PLANE(HR, RL, XB, RB)                                                                                      \
    affine_plane((void *)at(out, base, XB), at(x, base, XB), (HR) ? at(res, base, RB) : NULL, S[c], Q[c], R[c], I, HR, \
                 RL, XB, RB)
                CMI_AFFINE_CASES(CMI_PLANE)
#undef CMI_PLANE
            }
    }
#undef CMI_AFFINE_CASES
}

/* Whether the fused ReLU let x through in the forward: its input (x - S)·Q + R, computed as
 * chan_affine computed it (S the mean, Q and R the forward's coefficients), is positive — so the
 * backward of batch norm without a residual need not read the output for its mask. */
static inline __attribute__((always_inline)) bool relu_passes(float x, float s, float q, float r) {
    return (x - s) * q + r > 0.0f;
}

/* The value chan_sums adds up at one element: the upstream gradient (f32, or bf16 when gbf; zero
 * where the fused ReLU did not pass: its output y is not positive, or with has_z its recomputed
 * input (x - m)·q + r is not), or without one the shifted input x - m (the forward's moments). */
static inline __attribute__((always_inline)) float sum_value(float x, float m, const void *g, const void *y,
                                                             float q, float r, int64_t e, const bool has_g,
                                                             const bool has_y, const bool has_z, const bool bf,
                                                             const bool gbf) {
    if (!has_g) return x - m;
    if (has_z) return relu_passes(x, m, q, r) ? ld(g, e, gbf) : 0.0f;
    return has_y && !(ld(y, e, bf) > 0.0f) ? 0.0f : ld(g, e, gbf);
}

/* Rows [o0, o1) of C channels (channels_last) for chan_sums, specialised by the constant flags
 * (bf: x and y are bf16; gbf: g is bf16). */
static inline __attribute__((always_inline)) void sums_rows(const void *restrict x, const float *restrict mean,
                                                            const void *restrict g, const void *restrict y,
                                                            const float *restrict zq, float *restrict gr, int64_t o0,
                                                            int64_t o1, int64_t C, float *restrict f1,
                                                            float *restrict f2, const bool has_g, const bool has_y,
                                                            const bool has_z, const bool has_gr, const bool gr_fresh,
                                                            const bool bf, const bool gbf, const int64_t CK) {
    if (CK) C = CK;
    for (int64_t o = o0; o < o1; o++) {
        const void *restrict xr = at(x, o * C, bf);
#pragma omp simd
        for (int64_t c = 0; c < C; c++) {
            const float xc = ld(xr, c, bf);
            const float v = sum_value(xc, mean[c], g, y, has_z ? zq[c] : 0.0f, has_z ? zq[C + c] : 0.0f, o * C + c,
                                      has_g, has_y, has_z, bf, gbf);
            if (has_gr) gr[o * C + c] = gr_fresh ? v : gr[o * C + c] + v;
            f1[c] += v;
            f2[c] += (xc - mean[c]) * v;
        }
    }
}

/* One (o, c) plane of I values (NCHW) for chan_sums: f[0] += Σ v, f[1] += Σ (x - m)·v. */
static inline __attribute__((always_inline)) void sums_plane(const void *restrict x, float m,
                                                             const void *restrict g, const void *restrict y, float q,
                                                             float r, float *restrict gr, int64_t I, float *f,
                                                             const bool has_g, const bool has_y, const bool has_z,
                                                             const bool has_gr, const bool gr_fresh, const bool bf,
                                                             const bool gbf) {
    float f1 = 0.0f, f2 = 0.0f;
#pragma omp simd reduction(+ : f1, f2)
    for (int64_t i = 0; i < I; i++) {
        const float xi = ld(x, i, bf);
        const float v = sum_value(xi, m, g, y, q, r, i, has_g, has_y, has_z, bf, gbf);
        if (has_gr) gr[i] = gr_fresh ? v : gr[i] + v;
        f1 += v;
        f2 += (xi - m) * v;
    }
    f[0] += f1;
    f[1] += f2;
}

/* Batch norm's per-channel sums over the (O, C, I) layout, one pass: s1[c] = Σ v and
 * s2[c] = Σ (x - m[c])·v, where
 *   - forward (g NULL): v = x - m, m a shift near the mean: the shifted moments;
 *   - backward: v = gz = g where y > 0 (y given: the fused ReLU's output) else 0, or where
 *     (x - m)·Q + R > 0 (zq given instead: the forward's Q and R, (C) each, when there was no
 *     residual: relu_passes) else 0, or g (neither), m the mean; and gr = gz (gr_fresh) or gr += gz (gr given: the residual's gradient), so gz is
 *     never materialised and the residual needs no pass of its own.
 * x and y are both f32 or both bf16 (bf); g is f32, or bf16 (gbf: a bf16 gradient of batch norm's
 * bf16 output, cmi_grad_for_write_as; only with bf) read exactly; m, gr and the arithmetic are f32.
 * Float sums per plane (NCHW) or per block of 64 rows (channels-last), added up in double. */
static cm_status chan_sums(cm_tape *tp, const void *x, const float *m, const void *g, const void *y,
                           const float *zq, float *gr, bool gr_fresh, int64_t O, int64_t C, int64_t I, double *s1,
                           double *s2, bool bf, bool gbf) {
    const bool par = O * C * I >= CMI_PAR_MIN;
    /* one specialised loop per case and dtype (branches in the loops would keep them scalar) */
    const int mode = !g ? 6 : zq && !gr ? 7 : (y ? 1 : 0) | (gr ? (gr_fresh ? 2 : 4) : 0);
#define CMI_SUMS_MODES(CALL, BF, GB)                                                                                  \
    switch (mode) {                                                                                                    \
    case 0: CALL(g, NULL, NULL, true, false, false, false, false, BF, GB); break;                                      \
    case 1: CALL(g, y, NULL, true, true, false, false, false, BF, GB); break;                                          \
    case 2: CALL(g, NULL, gr, true, false, false, true, true, BF, GB); break;                                          \
    case 3: CALL(g, y, gr, true, true, false, true, true, BF, GB); break;                                              \
    case 4: CALL(g, NULL, gr, true, false, false, true, false, BF, GB); break;                                         \
    case 5: CALL(g, y, gr, true, true, false, true, false, BF, GB); break;                                             \
    case 7: CALL(g, NULL, NULL, true, false, true, false, false, BF, GB); break;                                       \
    default: CALL(NULL, NULL, NULL, false, false, false, false, false, BF, GB); break;                                 \
    }
#define CMI_SUMS_CASES(CALL)                                                                                          \
    if (gbf) {                                                                                                         \
        CMI_SUMS_MODES(CALL, true, true)                                                                               \
    } else if (bf) {                                                                                                   \
        CMI_SUMS_MODES(CALL, true, false)                                                                              \
    } else {                                                                                                           \
        CMI_SUMS_MODES(CALL, false, false)                                                                             \
    }
    if (I > 1) {
#pragma omp parallel for if (par) schedule(static)
        for (int64_t c = 0; c < C; c++) {
            const float mc = m[c];
            double d1 = 0, d2 = 0;
            for (int64_t o = 0; o < O; o++) {
                const int64_t base = (o * C + c) * I;
                float f[2] = {0.0f, 0.0f};
#define CMI_PLANE(G, Y, GR, HG, HY, HZ, HR, FR, BF, GB)                                                                \
    sums_plane(at(x, base, BF), mc, (G) ? at(g, base, GB) : NULL, (Y) ? at(y, base, BF) : NULL, (HZ) ? zq[c] : 0.0f,   \
               (HZ) ? zq[C + c] : 0.0f, (GR) ? gr + base : NULL, I, f, HG, HY, HZ, HR, FR, BF, GB)
                CMI_SUMS_CASES(CMI_PLANE)
#undef CMI_PLANE
                d1 += f[0];
                d2 += f[1];
            }
            s1[c] = d1;
            s2[c] = d2;
        }
        return CM_OK;
    }
    enum { BLK = 64 };
    const int nth = par ? cm_num_threads() : 1;
    double *part = cmi_scratch(tp, sizeof(double) * (size_t)(2 * C * nth + 1)); // (nth, 2, C)
    float *facc = cmi_scratch(tp, sizeof(float) * (size_t)(2 * C * nth + 1));   // (nth, 2, C)
    if (!part || !facc) return cmi_status(tp);
    memset(part, 0, sizeof(double) * (size_t)(2 * C * nth));
#pragma omp parallel num_threads(nth)
    {
        const int t = omp_get_thread_num();
        double *p1 = part + (int64_t)t * 2 * C, *p2 = p1 + C;
        float *restrict f1 = facc + (int64_t)t * 2 * C, *restrict f2 = f1 + C;
#pragma omp for schedule(static)
        for (int64_t o0 = 0; o0 < O; o0 += BLK) {
            const int64_t o1 = o0 + BLK < O ? o0 + BLK : O;
            for (int64_t c = 0; c < C; c++) f1[c] = f2[c] = 0.0f;
#define CMI_ROWS(G, Y, GR, HG, HY, HZ, HR, FR, BF, GB)                                                                 \
    CMI_BY_C(C, sums_rows, x, m, G, Y, zq, GR, o0, o1, C, f1, f2, HG, HY, HZ, HR, FR, BF, GB)
            CMI_SUMS_CASES(CMI_ROWS)
#undef CMI_ROWS
            for (int64_t c = 0; c < C; c++) p1[c] += f1[c], p2[c] += f2[c];
        }
    }
#undef CMI_SUMS_CASES
#undef CMI_SUMS_MODES
    for (int64_t c = 0; c < C; c++) {
        double d1 = 0, d2 = 0;
        for (int th = 0; th < nth; th++) {
            d1 += part[(int64_t)th * 2 * C + c];
            d2 += part[(int64_t)th * 2 * C + C + c];
        }
        s1[c] = d1;
        s2[c] = d2;
    }
    return CM_OK;
}

/* Rows [o0, o1) of C channels (channels_last) for bn_bwd_dx, specialised by the constant flags (bf: x
 * and y are bf16; gb: the output is bf16; gbf: g is bf16). */
static inline __attribute__((always_inline)) void dx_rows(void *restrict o, const void *restrict x,
                                                          const float *restrict mean, const void *restrict g,
                                                          const void *restrict y, const float *restrict zq,
                                                          const float *restrict P, const float *restrict Q,
                                                          const float *restrict R, int64_t o0, int64_t o1, int64_t C,
                                                          const bool has_y, const bool has_z, const bool fresh,
                                                          const bool bf, const bool gb, const bool gbf,
                                                          const int64_t CK) {
    if (CK) C = CK;
    const bool rows_bf = fresh && gb && CK; /* bf16 rows of CK channels: f32 here, then rounded as a row */
    float db[64]; /* CK <= 64 */
    for (int64_t r = o0; r < o1; r++) {
#pragma omp simd
        for (int64_t c = 0; c < C; c++) {
            const int64_t e = r * C + c;
            const float v = has_z   ? (relu_passes(ld(x, e, bf), mean[c], zq[c], zq[C + c]) ? ld(g, e, gbf) : 0.0f)
                            : has_y ? (ld(y, e, bf) > 0.0f ? ld(g, e, gbf) : 0.0f)
                                    : ld(g, e, gbf);
            const float d = v * P[c] + (ld(x, e, bf) - mean[c]) * Q[c] + R[c];
            if (rows_bf) db[c] = d;
            else if (fresh) st(o, e, d, gb);
            else ((float *)o)[e] += d;
        }
        if (rows_bf) cmi_bf16_round16((uint16_t *)o + r * C, db, CK);
    }
}

/* One (o, c) plane of I values (NCHW) for bn_bwd_dx. */
static inline __attribute__((always_inline)) void dx_plane(void *restrict o, const void *restrict x,
                                                           const void *restrict g, const void *restrict y, float m,
                                                           float zq_q, float zq_r, float p, float q, float r, int64_t I,
                                                           const bool has_y, const bool has_z, const bool fresh,
                                                           const bool bf, const bool gb, const bool gbf) {
#pragma omp simd
    for (int64_t i = 0; i < I; i++) {
        const float v = has_z   ? (relu_passes(ld(x, i, bf), m, zq_q, zq_r) ? ld(g, i, gbf) : 0.0f)
                        : has_y ? (ld(y, i, bf) > 0.0f ? ld(g, i, gbf) : 0.0f)
                                : ld(g, i, gbf);
        const float d = v * p + (ld(x, i, bf) - m) * q + r;
        if (fresh) st(o, i, d, gb);
        else ((float *)o)[i] += d;
    }
}

/* gx = (fresh) or += gz·P[c] + (x - mean[c])·Q[c] + R[c], gz as in chan_sums. x and y are both f32
 * or both bf16 (bf); g is f32, or bf16 (gbf, only with bf) read exactly; the arithmetic is f32; gx
 * is f32, or bf16 (gb: a fresh gradient of a bf16 x, cmi_grad_for_write_as) rounded to nearest
 * even. */
static void bn_bwd_dx(void *gx, bool fresh, const void *x, const float *mean, const void *g, const void *y,
                      const float *zq, const float *P, const float *Q, const float *R, int64_t O, int64_t C, int64_t I,
                      bool bf, bool gb, bool gbf) {
    const bool par = O * C * I >= CMI_PAR_MIN;
    /* one specialised loop per case and dtype; a bf16 g (gbf) comes with a bf16 x, and a bf16 gx
     * (gb) is always fresh with a bf16 x; zq (the ReLU mask recomputed) comes without y */
    const int mode = (y ? 1 : 0) | (fresh ? 2 : 0) | (bf ? 4 : 0) | (gb ? 8 : 0) | (gbf ? 16 : 0) | (zq ? 32 : 0);
#define CMI_DX_CASES(CALL)                                                                                            \
    switch (mode) {                                                                                                    \
    case 0: CALL(NULL, false, false, false, false, false, false); break;                                               \
    case 1: CALL(y, true, false, false, false, false, false); break;                                                   \
    case 2: CALL(NULL, false, false, true, false, false, false); break;                                                \
    case 3: CALL(y, true, false, true, false, false, false); break;                                                    \
    case 4: CALL(NULL, false, false, false, true, false, false); break;                                                \
    case 5: CALL(y, true, false, false, true, false, false); break;                                                    \
    case 6: CALL(NULL, false, false, true, true, false, false); break;                                                 \
    case 7: CALL(y, true, false, true, true, false, false); break;                                                     \
    case 14: CALL(NULL, false, false, true, true, true, false); break;                                                 \
    case 15: CALL(y, true, false, true, true, true, false); break;                                                     \
    case 20: CALL(NULL, false, false, false, true, false, true); break;                                                \
    case 21: CALL(y, true, false, false, true, false, true); break;                                                    \
    case 22: CALL(NULL, false, false, true, true, false, true); break;                                                 \
    case 23: CALL(y, true, false, true, true, false, true); break;                                                     \
    case 30: CALL(NULL, false, false, true, true, true, true); break;                                                  \
    case 31: CALL(y, true, false, true, true, true, true); break;                                                      \
    case 32: CALL(NULL, false, true, false, false, false, false); break;                                               \
    case 34: CALL(NULL, false, true, true, false, false, false); break;                                                \
    case 36: CALL(NULL, false, true, false, true, false, false); break;                                                \
    case 38: CALL(NULL, false, true, true, true, false, false); break;                                                 \
    case 46: CALL(NULL, false, true, true, true, true, false); break;                                                  \
    case 52: CALL(NULL, false, true, false, true, false, true); break;                                                 \
    case 54: CALL(NULL, false, true, true, true, false, true); break;                                                  \
    default: CALL(NULL, false, true, true, true, true, true); break; /* 62 */                                          \
    }
    if (I == 1) {
        enum { BLK = 64 };
#pragma omp parallel for if (par) schedule(static)
        for (int64_t o0 = 0; o0 < O; o0 += BLK) {
            const int64_t o1 = o0 + BLK < O ? o0 + BLK : O;
#define CMI_ROW(Y, HY, HZ, FR, BF, GB, GBF)                                                                            \
    CMI_BY_C(C, dx_rows, gx, x, mean, g, Y, zq, P, Q, R, o0, o1, C, HY, HZ, FR, BF, GB, GBF)
            CMI_DX_CASES(CMI_ROW)
#undef CMI_ROW
        }
        return;
    }
#pragma omp parallel for collapse(2) if (par) schedule(static)
    for (int64_t o = 0; o < O; o++)
        for (int64_t c = 0; c < C; c++) {
            const int64_t base = (o * C + c) * I;
            const float m = mean[c], p = P[c], q = Q[c], r = R[c];
            const float zq_q = zq ? zq[c] : 0.0f, zq_r = zq ? zq[C + c] : 0.0f;
#define CMI_PLANE(Y, HY, HZ, FR, BF, GB, GBF)                                                                          \
    dx_plane((void *)at(gx, base, GB), at(x, base, BF), at(g, base, GBF), (Y) ? at(y, base, BF) : NULL, m, zq_q, zq_r, \
             p, q, r, I, HY, HZ, FR, BF, GB, GBF)
            CMI_DX_CASES(CMI_PLANE)
#undef CMI_PLANE
        }
#undef CMI_DX_CASES
}

/* ------------------------------------------------------------------------------------------ */
/* Batch norm                                                                                   */
/* ------------------------------------------------------------------------------------------ */

cm_batch_norm_opts cm_batch_norm_opts_default(void) {
    cm_batch_norm_opts o = {.training = true, .momentum = 0.1f, .eps = 1e-5f, .channels_last = false};
    return o;
}

/* The (O, C, I) view of x. */
static void bn_layout(const cm_tensor *x, bool channels_last, int64_t *O, int64_t *C, int64_t *I) {
    if (channels_last) {
        *C = x->shape[x->ndim - 1];
        *O = cmi_numel(x->ndim - 1, x->shape);
        *I = 1;
    } else {
        *C = x->shape[1];
        *O = x->shape[0];
        *I = cmi_numel(x->ndim - 2, x->shape + 2);
    }
}

static cm_status batch_norm_backward(cm_tape *tp, cm_node *n, const cm_tensor *gout) {
    cm_tensor *x = n->in[0], *w = n->in[1], *b = n->in[2];
    const stats_ctx *s = n->ctx;
    const bool training = n->i[0], channels_last = n->i[1];
    int64_t O, C, I;
    bn_layout(x, channels_last, &O, &C, &I);
    const double M = (double)(O * I);
    cm_tensor *res = n->n_in > 3 ? n->in[3] : NULL;
    /* gradients created now are written rather than added to (no zeroing pass) */
    bool gx_fresh = false, gr_fresh = false;
    const bool same = res == x; /* x is also the residual: both add into one (zeroed) gradient */
    /* a bf16 x made by a bf16 convolution gets its new gradient in bf16: the convolution would
     * round it to bf16 in a pass of its own (cmi_grad_for_write_as) */
    cm_tensor *gx = same ? cmi_grad(tp, x) : cmi_grad_for_write_as(tp, x, CM_DTYPE_BF16, &gx_fresh);
    cm_tensor *gr = same ? gx : cmi_grad_for_write(tp, res, &gr_fresh);
    cm_tensor *gw = cmi_grad(tp, w), *gb = cmi_grad(tp, b);
    if (cmi_status(tp)) return cmi_status(tp);
    /* everything below is scratch for this node (the gradients above were allocated before) */
    const size_t mark = cm_arena_mark(tp->arena);
    double *sg = cmi_scratch(tp, sizeof(double) * (size_t)(2 * C + 1)), *sgx = sg + C; // Σ g, Σ g·(x - mean): (C)
    float *coef = cmi_scratch(tp, sizeof(float) * (size_t)(3 * C + 1));                // P, Q, R: (C) each
    if (!sg || !coef) return cmi_status(tp);
    /* x and the output y are f32 or bf16 alike; the gradients are f32 (gx maybe bf16), gout f32 or,
     * for a bf16 y written by a consumer that takes it (a bf16 convolution: n->bf16_gout,
     * cmi_grad_for_write_as), bf16: widened exactly as it is read, the arithmetic stays f32 */
    const bool bf = x->dtype == CM_DTYPE_BF16, gbf = gout->dtype == CM_DTYPE_BF16;
    if (gbf && !bf)
        return cmi_fail(tp, CM_ERR_INTERNAL, "%s backward: bf16 upstream gradient for an f32 output %s", n->op,
                        cmi_shape(x));
    const void *xv = x->data, *gv = gout->data;
    /* fused ReLU: the gradient passes where its input was positive — recomputed from x and the
     * forward's coefficients without a residual (no read of the output), else where y > 0 */
    const float *zq = n->i[2] && !res ? s->affine : NULL;
    const void *y = n->i[2] && res ? n->out->data : NULL;
    const cmi_backend *be = cmi_be(tp);
    if (be) { /* the GPU: f32 gradients (n->bf16_gout is off there) */
        cm_arena_rewind(tp->arena, mark);
        if ((gx && gx->dtype != CM_DTYPE_F32) || (gr && gr->dtype != CM_DTYPE_F32))
            return cmi_fail(tp, CM_ERR_INTERNAL, "%s backward: a bf16 gradient on the GPU", n->op);
        const cmi_bn_bwd_args a = {.O = O, .C = C, .I = I, .x = xv, .bf = bf, .g = gv, .gbf = gbf, .y = y, .zq = zq,
                                   .gr = gr ? cmi_f32(gr) : NULL, .gr_fresh = gr_fresh, .mean = s->mean,
                                   .rstd = s->rstd, .w = w ? cmi_f32(w) : NULL, .training = training,
                                   .gw = gw ? cmi_f32(gw) : NULL, .gb = gb ? cmi_f32(gb) : NULL,
                                   .gx = gx ? cmi_f32(gx) : NULL, .gx_fresh = gx_fresh};
        cmi_dev_fail(tp, be->batch_norm_bwd(&a), n->op);
        return cmi_status(tp);
    }
    if (chan_sums(tp, xv, s->mean, gv, y, zq, gr ? cmi_f32(gr) : NULL, gr_fresh, O, C, I, sg, sgx, bf, gbf))
        return cmi_status(tp);
    float *P = coef, *Q = coef + C, *R = coef + 2 * C;
    for (int64_t c = 0; c < C; c++) {
        const float rs = s->rstd[c], wc = w ? cmi_f32(w)[c] : 1.0f;
        const double sum_gxhat = sgx[c] * rs; // Σ g·xhat
        if (gw) cmi_f32(gw)[c] += (float)sum_gxhat;
        if (gb) cmi_f32(gb)[c] += (float)sg[c];
        /* training: dx = w·rstd·(g - mean(g) - xhat·mean(g·xhat)); eval: dx = w·rstd·g */
        P[c] = wc * rs;
        Q[c] = training ? (float)(-(double)P[c] * rs * sum_gxhat / M) : 0.0f;
        R[c] = training ? (float)(-(double)P[c] * sg[c] / M) : 0.0f;
    }
    if (gx)
        bn_bwd_dx(gx->data, gx_fresh, xv, s->mean, gv, y, zq, P, Q, R, O, C, I, bf, gx->dtype == CM_DTYPE_BF16, gbf);
    cm_arena_rewind(tp->arena, mark);
    return cmi_status(tp);
}

/* A running statistic: NULL, or f32 (C) with any stride. */
static bool running_check(cm_tape *tp, const char *name, const cm_tensor *r, int64_t C, const cm_tensor *x) {
    if (!r) return true;
    if (!cmi_check_f32(tp, "batch_norm", name, r)) return false;
    if (r->ndim != 1 || r->shape[0] != C) {
        cmi_fail(tp, CM_ERR_SHAPE, "batch_norm: %s %s must be 1-d with %lld entries (the channels of x %s)", name,
                 cmi_shape(r), (long long)C, cmi_shape(x));
        return false;
    }
    return true;
}

/* x or residual: f32 or bf16 (the kernels' two instantiations). */
static bool bn_dtype_check(cm_tape *tp, const char *op, const char *name, const cm_tensor *t) {
    if (t->dtype == CM_DTYPE_F32 || t->dtype == CM_DTYPE_BF16) return true;
    cmi_fail(tp, CM_ERR_DTYPE, "%s: '%s' %s has dtype %s; %s needs f32 or bf16 (cast with cm_cast)", op, name,
             cmi_shape(t), cm_dtype_name(t->dtype), op);
    return false;
}

/* batch_norm(x) [+ residual] [then ReLU]; op names the op in errors and on the tape. x and the
 * output are f32 or bf16 alike, residual f32 or bf16; statistics and arithmetic are f32. */
static cm_tensor *batch_norm_impl(cm_tape *tp, const char *op, cm_tensor *x, cm_tensor *weight, cm_tensor *bias,
                                  cm_tensor *running_mean, cm_tensor *running_var, cm_tensor *residual, bool relu,
                                  const cm_batch_norm_opts *opts) {
    const cm_batch_norm_opts o = opts ? *opts : cm_batch_norm_opts_default();
    if (!cmi_begin(tp, op, 1, &x) ||
        !cmi_fetch(tp, 5, (cm_tensor *const[]){weight, bias, running_mean, running_var, residual}))
        return NULL;
    if (residual && !bn_dtype_check(tp, op, "residual", residual)) return NULL;
    if (residual && (residual->ndim != x->ndim ||
                     memcmp(residual->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim) != 0)) {
        cmi_fail(tp, CM_ERR_SHAPE, "%s: residual %s must have the shape of x %s", op, cmi_shape(residual),
                 cmi_shape(x));
        return NULL;
    }
    if (!bn_dtype_check(tp, op, "x", x) || !eps_check(tp, "batch_norm", o.eps)) return NULL;
    if (x->ndim < 2) {
        cmi_fail(tp, CM_ERR_SHAPE, "batch_norm: x %s must be (N, C, ...)%s with at least 2 dims", cmi_shape(x),
                 o.channels_last ? " or (N, ..., C)" : "");
        return NULL;
    }
    if (!isfinite(o.momentum)) {
        cmi_fail(tp, CM_ERR_INVALID_ARG, "batch_norm: momentum %g must be finite", (double)o.momentum);
        return NULL;
    }
    int64_t O, C, I;
    bn_layout(x, o.channels_last, &O, &C, &I);
    const int64_t M = O * I; // values per channel
    if (!param_check(tp, "batch_norm", "weight", &weight, C, x) || !param_check(tp, "batch_norm", "bias", &bias, C, x) ||
        !running_check(tp, "running_mean", running_mean, C, x) || !running_check(tp, "running_var", running_var, C, x))
        return NULL;
    if ((running_mean == NULL) != (running_var == NULL)) {
        cmi_fail(tp, CM_ERR_INVALID_ARG, "batch_norm: give both running_mean and running_var, or neither");
        return NULL;
    }
    if (!o.training && !running_mean) {
        cmi_fail(tp, CM_ERR_INVALID_ARG,
                 "batch_norm: eval mode needs running_mean and running_var (or set training to use batch statistics)");
        return NULL;
    }
    if (o.training && M <= 1) {
        cmi_fail(tp, CM_ERR_SHAPE,
                 "batch_norm: training needs more than one value per channel, x %s has %lld (use eval mode)",
                 cmi_shape(x), (long long)M);
        return NULL;
    }
    x = cm_contiguous(tp, x);
    if (!x || (residual && !(residual = cm_contiguous(tp, residual)))) return NULL;
    cm_tensor *out = cmi_new(tp, x->dtype, x->ndim, x->shape); // x's dtype, as torch's autocast
    float *stat = cmi_scratch(tp, sizeof(float) * (size_t)(4 * C + 1)); // mean, rstd, Q, R: (C) each
    double *s1 = cmi_scratch(tp, sizeof(double) * (size_t)(2 * C + 1)), *s2 = s1 ? s1 + C : NULL;
    if (!out || !stat || !s1) return NULL;
    float *mean = stat, *rstd = stat + C, *Q = stat + 2 * C, *R = stat + 3 * C;
    const bool bf = x->dtype == CM_DTYPE_BF16;
    const void *xv = x->data;
    const cmi_backend *be = cmi_be(tp);
    if (be) { /* the GPU: statistics, running statistics and the affine map in its kernels */
        float *d = cmi_dev_scratch(tp, sizeof(float) * (size_t)(4 * C + 1));
        if (!d) return NULL;
        mean = d, rstd = d + C, Q = d + 2 * C, R = d + 3 * C;
        const cmi_bn_args a = {.O = O, .C = C, .I = I, .x = xv, .y = out->data, .bf = bf,
                               .res = residual ? residual->data : NULL,
                               .rbf = residual && residual->dtype == CM_DTYPE_BF16, .relu = relu,
                               .training = o.training, .w = weight ? cmi_f32(weight) : NULL,
                               .b = bias ? cmi_f32(bias) : NULL, .rm = running_mean ? cmi_f32(running_mean) : NULL,
                               .rv = running_var ? cmi_f32(running_var) : NULL,
                               .rms = running_mean ? running_mean->stride[0] : 0,
                               .rvs = running_var ? running_var->stride[0] : 0, .momentum = o.momentum, .eps = o.eps,
                               .mean = mean, .rstd = rstd, .q = Q, .r = R};
        if (cmi_dev_fail(tp, be->batch_norm(&a), op)) return NULL;
    } else if (o.training) {
        /* One pass, shifted by each channel's first value K (close to the mean, so the shifted sums
         * do not cancel): mean = K + Σ(x - K)/M, var = (Σ(x - K)² - (Σ(x - K))²/M)/M. */
        for (int64_t c = 0; c < C; c++) mean[c] = ld(xv, c * I, bf);
        if (chan_sums(tp, xv, mean, NULL, NULL, NULL, NULL, false, O, C, I, s1, s2, bf, false)) return NULL;
        for (int64_t c = 0; c < C; c++) {
            const double var_shift = (s2[c] - s1[c] * s1[c] / (double)M) / (double)M; // biased
            mean[c] = (float)((double)mean[c] + s1[c] / (double)M);
            double var = var_shift;
            if (var < 0) var = 0;
            rstd[c] = (float)(1.0 / sqrt(var + (double)o.eps));
            if (running_mean && !tp->replaying) { /* a checkpoint's replay: updated in its forward */
                float *rm = (float *)running_mean->data + c * running_mean->stride[0];
                float *rv = (float *)running_var->data + c * running_var->stride[0];
                *rm = (1.0f - o.momentum) * *rm + o.momentum * mean[c];
                *rv = (1.0f - o.momentum) * *rv + o.momentum * (float)(var * (double)M / (double)(M - 1));
            }
        }
    } else {
        for (int64_t c = 0; c < C; c++) {
            mean[c] = ((const float *)running_mean->data)[c * running_mean->stride[0]];
            const float v = ((const float *)running_var->data)[c * running_var->stride[0]];
            rstd[c] = 1.0f / sqrtf(v + o.eps);
        }
    }
    for (int64_t c = 0; c < (be ? 0 : C); c++) {
        Q[c] = rstd[c] * (weight ? cmi_f32(weight)[c] : 1.0f);
        R[c] = bias ? cmi_f32(bias)[c] : 0.0f;
    }
    if (!be)
        chan_affine(out->data, xv, mean, Q, R, O, C, I, residual ? residual->data : NULL, relu, bf,
                    residual && residual->dtype == CM_DTYPE_BF16);
    cm_tensor *ins[4] = {x, weight, bias, residual};
    const int n_in = residual ? 4 : 3;
    if (cmi_needs_grad(tp, n_in, ins)) {
        cm_node *n = cmi_record(tp, op, out, n_in, ins, batch_norm_backward, sizeof(stats_ctx));
        if (!n) return NULL;
        stats_ctx *s = n->ctx;
        s->mean = mean;
        s->rstd = rstd;
        s->affine = Q; /* Q then R */
        n->i[0] = o.training;
        n->i[1] = o.channels_last;
        n->i[2] = relu;
        /* a bf16 output's gradient may come in bf16 (a bf16 convolution consuming it writes its dx
         * in bf16, cmi_grad_for_write_as): it is read as it is */
        n->bf16_gout = bf && !be; /* (the GPU's gradients are f32) */
    }
    return out;
}

cm_tensor *cm_batch_norm(cm_tape *tp, cm_tensor *x, cm_tensor *weight, cm_tensor *bias, cm_tensor *running_mean,
                         cm_tensor *running_var, const cm_batch_norm_opts *opts) {
    return batch_norm_impl(tp, "batch_norm", x, weight, bias, running_mean, running_var, NULL, false, opts);
}

cm_tensor *cm_batch_norm_add_relu(cm_tape *tp, cm_tensor *x, cm_tensor *weight, cm_tensor *bias,
                                  cm_tensor *running_mean, cm_tensor *running_var, cm_tensor *residual,
                                  const cm_batch_norm_opts *opts) {
    return batch_norm_impl(tp, "batch_norm_add_relu", x, weight, bias, running_mean, running_var, residual, true,
                           opts);
}

/* ------------------------------------------------------------------------------------------ */
/* Group norm: x (N, C, S) with C = G·cpg; rows (n, g) of length cpg·S are contiguous            */
/* ------------------------------------------------------------------------------------------ */

static cm_status group_norm_backward(cm_tape *tp, cm_node *n, const cm_tensor *gout) {
    cm_tensor *x = n->in[0], *w = n->in[1], *b = n->in[2];
    const stats_ctx *s = n->ctx;
    const int64_t G = n->i[0], N = x->shape[0], C = x->shape[1], S = cmi_numel(x->ndim - 2, x->shape + 2);
    const int64_t cpg = C / G, L = cpg * S;
    cm_tensor *gx = cmi_grad(tp, x), *gw = cmi_grad(tp, w), *gb = cmi_grad(tp, b);
    if (cmi_status(tp)) return cmi_status(tp);
    const float *xv = cmi_f32(x), *gv = cmi_f32(gout), *wv = w ? cmi_f32(w) : NULL; // (N, C, S), (N, C, S), (C)
    const cmi_backend *be = cmi_be(tp);
    if (be) {
        cmi_dev_fail(tp,
                     be->group_norm_bwd(xv, wv, gv, s->mean, s->rstd, gx ? cmi_f32(gx) : NULL, gw ? cmi_f32(gw) : NULL,
                                        gb ? cmi_f32(gb) : NULL, N, C, S, G),
                     "group_norm backward");
        return cmi_status(tp);
    }
    const bool par = N * C * S >= CMI_PAR_MIN;
    if (gx) {
        float *gxv = cmi_f32(gx);
        /* per row: dx = rstd · (g·w - mean(g·w) - xhat · mean(g·w·xhat)) */
#pragma omp parallel for if (par) schedule(static)
        for (int64_t r = 0; r < N * G; r++) {
            const int64_t c0 = (r % G) * cpg;
            const float m = s->mean[r], rs = s->rstd[r];
            const float *xr = xv + r * L, *gr = gv + r * L; // (cpg, S)
            float a = 0.0f, c2 = 0.0f;
            for (int64_t j = 0; j < cpg; j++) {
                const float wc = wv ? wv[c0 + j] : 1.0f;
                float fa = 0.0f, fb = 0.0f;
#pragma omp simd reduction(+ : fa, fb)
                for (int64_t i = 0; i < S; i++) {
                    fa += gr[j * S + i];
                    fb += gr[j * S + i] * (xr[j * S + i] - m);
                }
                a += wc * fa;
                c2 += wc * fb * rs;
            }
            a /= (float)L;
            c2 /= (float)L;
            float *dx = gxv + r * L;
            for (int64_t j = 0; j < cpg; j++) {
                const float wc = wv ? wv[c0 + j] : 1.0f;
#pragma omp simd
                for (int64_t i = 0; i < S; i++) {
                    const int64_t e = j * S + i;
                    dx[e] += rs * (gr[e] * wc - a - (xr[e] - m) * rs * c2);
                }
            }
        }
    }
    if (gw || gb) {
#pragma omp parallel for if (par) schedule(static)
        for (int64_t c = 0; c < C; c++) {
            double dw = 0, db = 0;
            for (int64_t nn = 0; nn < N; nn++) {
                const int64_t r = nn * G + c / cpg;
                const float m = s->mean[r], rs = s->rstd[r];
                const float *xr = xv + (nn * C + c) * S, *gr = gv + (nn * C + c) * S; // (S)
                float fw = 0.0f, fb = 0.0f;
#pragma omp simd reduction(+ : fw, fb)
                for (int64_t i = 0; i < S; i++) {
                    fw += gr[i] * (xr[i] - m);
                    fb += gr[i];
                }
                dw += (double)fw * rs;
                db += fb;
            }
            if (gw) cmi_f32(gw)[c] += (float)dw;
            if (gb) cmi_f32(gb)[c] += (float)db;
        }
    }
    return cmi_status(tp);
}

cm_tensor *cm_group_norm(cm_tape *tp, cm_tensor *x, int64_t groups, cm_tensor *weight, cm_tensor *bias, float eps) {
    if (!cmi_begin(tp, "group_norm", 1, &x) || !cmi_fetch(tp, 2, (cm_tensor *const[]){weight, bias})) return NULL;
    if (!cmi_check_f32(tp, "group_norm", "x", x) || !eps_check(tp, "group_norm", eps)) return NULL;
    if (x->ndim < 2) {
        cmi_fail(tp, CM_ERR_SHAPE, "group_norm: x %s must be (N, C, ...) with at least 2 dims", cmi_shape(x));
        return NULL;
    }
    const int64_t N = x->shape[0], C = x->shape[1], S = cmi_numel(x->ndim - 2, x->shape + 2);
    if (groups < 1 || C % groups != 0) {
        cmi_fail(tp, CM_ERR_INVALID_ARG, "group_norm: %lld groups do not divide the %lld channels of x %s",
                 (long long)groups, (long long)C, cmi_shape(x));
        return NULL;
    }
    if (!param_check(tp, "group_norm", "weight", &weight, C, x) || !param_check(tp, "group_norm", "bias", &bias, C, x))
        return NULL;
    x = cm_contiguous(tp, x);
    if (!x) return NULL;
    const int64_t G = groups, cpg = C / G, L = cpg * S;
    cm_tensor *out = cmi_new(tp, CM_DTYPE_F32, x->ndim, x->shape);
    float *mean = cmi_dev_scratch(tp, sizeof(float) * (size_t)(N * G + 1)); // (N, G)
    float *rstd = cmi_dev_scratch(tp, sizeof(float) * (size_t)(N * G + 1)); // (N, G)
    if (!out || !mean || !rstd) return NULL;
    const float *xv = cmi_f32(x), *wv = weight ? cmi_f32(weight) : NULL, *bv = bias ? cmi_f32(bias) : NULL;
    float *ov = cmi_f32(out);
    const cmi_backend *be = cmi_be(tp);
    if (be) {
        if (cmi_dev_fail(tp, be->group_norm(xv, wv, bv, ov, mean, rstd, N, C, S, G, eps), "group_norm")) return NULL;
    } else {
        row_stats(xv, N * G, L, eps, mean, rstd);
    }
#pragma omp parallel for if (N * C * S >= CMI_PAR_MIN) schedule(static)
    for (int64_t nc = 0; nc < (be ? 0 : N * C); nc++) {
        const int64_t c = nc % C, r = (nc / C) * G + c / cpg;
        const float m = mean[r], q = rstd[r] * (wv ? wv[c] : 1.0f), b0 = bv ? bv[c] : 0.0f;
        const float *xr = xv + nc * S; // (S)
        float *orow = ov + nc * S;
        for (int64_t i = 0; i < S; i++) orow[i] = (xr[i] - m) * q + b0;
    }
    cm_tensor *ins[3] = {x, weight, bias};
    if (cmi_needs_grad(tp, 3, ins)) {
        cm_node *n = cmi_record(tp, "group_norm", out, 3, ins, group_norm_backward, sizeof(stats_ctx));
        if (!n) return NULL;
        stats_ctx *s = n->ctx;
        s->mean = mean;
        s->rstd = rstd;
        n->i[0] = G;
    }
    return out;
}

/* ------------------------------------------------------------------------------------------ */
/* Dropout                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* drop (numel) u8: 1 where the element was zeroed; kept elements scale by n->f[0] = 1/(1-p). */
static cm_status dropout_backward(cm_tape *tp, cm_node *n, const cm_tensor *gout) {
    bool fresh = false; /* a gradient created now is written, not zeroed and added to */
    cm_tensor *gx = cmi_grad_for_write(tp, n->in[0], &fresh);
    if (!gx) return cmi_status(tp);
    const uint8_t *drop = n->ctx ? *(uint8_t *const *)n->ctx : NULL;
    const float scale = (float)n->f[0], *g = cmi_f32(gout);
    float *d = cmi_f32(gx);
    const int64_t numel = cm_tensor_numel(gx);
    const cmi_backend *be = cmi_be(tp);
    if (be) {
        cmi_dev_fail(tp, be->dropout_bwd(g, drop, d, numel, scale, fresh), "dropout backward");
        return cmi_status(tp);
    }
    if (fresh) {
#pragma omp parallel for simd if (numel >= CMI_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < numel; i++) d[i] = drop[i] ? 0.0f : g[i] * scale;
    } else {
#pragma omp parallel for simd if (numel >= CMI_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < numel; i++) d[i] += drop[i] ? 0.0f : g[i] * scale;
    }
    return cmi_status(tp);
}

void cmi_dropout_mask(const cm_tape *tp, cm_rng *rng, uint8_t *drop, int64_t rows, int64_t numel, float p) {
    if (!tp || tp->row_total <= 0 || rows != tp->row_n || rows <= 0 || numel % rows) {
        /* drop[i] = (uniform at block counter + i/4, word i%4) < p, i.e. kept where it is >= p */
        cm_rng_bernoulli(rng, drop, (size_t)numel, p);
        return;
    }
    const int64_t per_row = numel / rows, blocks = (per_row + 3) / 4;
    const uint64_t base = rng->counter;
#pragma omp parallel for schedule(static) if (numel >= CMI_PAR_MIN)
    for (int64_t i = 0; i < rows; i++) {
        cm_rng r = *rng;
        r.counter = base + (uint64_t)((tp->row_first + i) * blocks);
        cm_rng_bernoulli(&r, drop + i * per_row, (size_t)per_row, p);
    }
    rng->counter = base + (uint64_t)(tp->row_total * blocks);
}

cm_tensor *cm_dropout(cm_tape *tp, cm_tensor *a, float p, bool training, cm_rng *rng) {
    if (!cmi_begin(tp, "dropout", 1, &a)) return NULL;
    if (!cmi_check_f32(tp, "dropout", "input", a)) return NULL;
    if (!(p >= 0.0f && p <= 1.0f)) {
        cmi_fail(tp, CM_ERR_INVALID_ARG, "dropout: p %g must be in [0, 1]", (double)p);
        return NULL;
    }
    if (!training || p == 0.0f) return a;
    if (!rng) {
        cmi_fail(tp, CM_ERR_INVALID_ARG, "dropout: rng is NULL (training with p > 0 needs a generator)");
        return NULL;
    }
    a = cm_contiguous(tp, a); /* the mask follows the row-major order of the view */
    if (!a) return NULL;
    const int64_t numel = cm_tensor_numel(a);
    cm_tensor *out = cmi_new(tp, CM_DTYPE_F32, a->ndim, a->shape);
    uint8_t *drop = cmi_dev_scratch(tp, (size_t)numel + 1); // (numel)
    if (!out || !drop) return NULL;
    const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f, *x = cmi_f32(a);
    float *y = cmi_f32(out);
    cmi_rng_note(tp, rng);
    const cmi_backend *be = cmi_be(tp);
    if (be) {
        /* the same numbers as cmi_dropout_mask: per-row counters with the row context, else in sequence */
        const int64_t rows = a->ndim ? a->shape[0] : 1;
        const bool by_row = tp->row_total > 0 && rows == tp->row_n && rows > 0 && numel % rows == 0;
        const int64_t blocks = by_row ? (numel / rows + 3) / 4 : (numel + 3) / 4;
        if (cmi_dev_fail(tp,
                         be->dropout(x, y, drop, numel, by_row ? rows : 0, by_row ? tp->row_first : 0, rng->seed,
                                     rng->stream, rng->counter, p, scale),
                         "dropout"))
            return NULL;
        rng->counter += (uint64_t)(by_row ? tp->row_total * blocks : blocks);
    } else {
        cmi_dropout_mask(tp, rng, drop, a->ndim ? a->shape[0] : 1, numel, p);
#pragma omp parallel for simd if (numel >= CMI_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < numel; i++) y[i] = drop[i] ? 0.0f : x[i] * scale;
    }
    if (cmi_needs_grad(tp, 1, &a)) {
        cm_node *n = cmi_record(tp, "dropout", out, 1, &a, dropout_backward, sizeof(uint8_t *));
        if (!n) return NULL;
        *(uint8_t **)n->ctx = drop;
        n->f[0] = scale;
    }
    return out;
}
