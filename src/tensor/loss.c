/* Losses: fused cross-entropy (log-softmax + NLL, index or probability targets, label smoothing,
 * ignore_index) and mean squared error. Both have a hand-written backward that never builds the
 * softmax tensor: cross-entropy keeps only the per-position log-sum-exp (N, d1, ...). */
#include "tensor/backend.h"
#include "tensor/tensor_impl.h"
#include "tensor/vexp.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>

cm_cross_entropy_opts cm_cross_entropy_opts_default(void) {
    cm_cross_entropy_opts o = {-100, 0.0f, CM_REDUCTION_MEAN};
    return o;
}

static bool check_reduction(cm_tape *tp, const char *op, cm_reduction r) {
    if (r == CM_REDUCTION_MEAN || r == CM_REDUCTION_SUM || r == CM_REDUCTION_NONE) return true;
    cmi_fail(tp, CM_ERR_INVALID_ARG, "%s: reduction %d is not one of CM_REDUCTION_MEAN, _SUM, _NONE", op, (int)r);
    return false;
}

/* ------------------------------------------------------------------------------------------ */
/* Cross-entropy. logits (made contiguous) are viewed as (N, C, S), S = d1·d2·...; a position  */
/* p = n·S + s has its C logits at stride S. Index targets are (N·S) integers.                   */
/* ------------------------------------------------------------------------------------------ */

static inline int64_t load_index(const cm_tensor *t, int64_t i) {
    switch (t->dtype) {
    case CM_DTYPE_I32: return ((const int32_t *)t->data)[i];
    case CM_DTYPE_U8: return ((const uint8_t *)t->data)[i];
    default: return ((const int64_t *)t->data)[i];
    }
}

/* Log-sum-exp of C logits at stride S. Called with a literal S = 1 for (N, C) logits, so the
 * inlined copy is a contiguous loop that vectorises. */
static inline __attribute__((always_inline)) float ce_lse(const float *xr, int64_t C, int64_t S) {
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int64_t k = 0; k < C; k++) mx = xr[k * S] > mx ? xr[k * S] : mx;
    if (mx == -INFINITY) mx = 0.0f;
    return mx + (float)log(cmi_sum_exp(xr, C, S, mx));
}

/* Index target: gr += w·(softmax - ls/C - (1-ls)·onehot(t)). */
static inline __attribute__((always_inline)) void ce_grad_index(float *gr, const float *xr, int64_t C, int64_t S,
                                                                float lse, float w, float u, float eps, int64_t t,
                                                                const bool fresh) {
    if (fresh) {
#pragma omp simd
        for (int64_t k = 0; k < C; k++) gr[k * S] = w * (cmi_vexpf(xr[k * S] - lse) - u);
    } else {
#pragma omp simd
        for (int64_t k = 0; k < C; k++) gr[k * S] += w * (cmi_vexpf(xr[k * S] - lse) - u);
    }
    gr[t * S] -= w * (1.0f - eps);
}

typedef struct {
    int64_t N, C, S;
    bool soft;
    int64_t ignore;
    float eps; /* label smoothing */
    cm_reduction red;
    float *lse;   /* (N·S) log-sum-exp of each position */
    double denom; /* mean: the divisor (non-ignored count, or N·S for soft targets); else 1 */
} ce_ctx;

static cm_status ce_backward(cm_tape *tp, cm_node *n, const cm_tensor *g) {
    const ce_ctx *c = n->ctx;
    cm_tensor *logits = n->in[0], *target = n->in[1];
    bool fresh = false; /* a gradient of logits created now is written, not zeroed and added to */
    cm_tensor *gl = cmi_grad_for_write(tp, logits, &fresh); // (N, C, S)
    cm_tensor *gt = c->soft ? cmi_grad(tp, target) : NULL; // (N, C, S) soft targets only
    if (cmi_status(tp)) return cmi_status(tp);
    const int64_t C = c->C, S = c->S, P = c->N * S;
    const float *x = cmi_f32(logits), *gv = cmi_f32(g);
    const float *tv = c->soft ? cmi_f32(target) : NULL;
    float *glv = gl ? cmi_f32(gl) : NULL, *gtv = gt ? cmi_f32(gt) : NULL;
    const cmi_backend *be = cmi_be(tp);
    if (be) {
        cmi_dev_fail(tp,
                     be->ce_bwd(x, target->data, target->dtype, c->soft, c->N, C, S, C * S, c->ignore, c->eps,
                                c->red == CM_REDUCTION_NONE, c->denom, gv, c->lse, glv, fresh, gtv),
                     "cross_entropy backward");
        return cmi_status(tp);
    }
    const float eps = c->eps, u = eps / (float)C;
    const double g_all = c->red == CM_REDUCTION_NONE ? 0.0 : (double)gv[0] / c->denom;
#pragma omp parallel for if (P * C >= CMI_PAR_MIN) schedule(static)
    for (int64_t p = 0; p < P; p++) {
        const int64_t off = (p / S) * C * S + p % S;
        const float *xr = x + off;
        const float w = c->red == CM_REDUCTION_NONE ? gv[p] : (float)g_all;
        const float lse = c->lse[p];
        if (!c->soft) {
            const int64_t t = load_index(target, p);
            if (!glv) continue;
            if (t == c->ignore) { /* no gradient: a new buffer still needs its zeros */
                if (fresh)
                    for (int64_t k = 0; k < C; k++) glv[off + k * S] = 0.0f;
                continue;
            }
            if (S == 1 && fresh) ce_grad_index(glv + off, xr, C, 1, lse, w, u, eps, t, true);
            else if (S == 1) ce_grad_index(glv + off, xr, C, 1, lse, w, u, eps, t, false);
            else ce_grad_index(glv + off, xr, C, S, lse, w, u, eps, t, fresh);
        } else {
            const float *tr = tv + off;
            if (glv) {
                float tsum = 0.0f; /* Σ of the smoothed targets; 1 for a distribution */
                for (int64_t k = 0; k < C; k++) tsum += (1.0f - eps) * tr[k * S] + u;
                float *gr = glv + off;
                for (int64_t k = 0; k < C; k++) {
                    const float d = w * (cmi_vexpf(xr[k * S] - lse) * tsum - ((1.0f - eps) * tr[k * S] + u));
                    gr[k * S] = fresh ? d : gr[k * S] + d;
                }
            }
            if (gtv) {
                float *gr = gtv + off;
                for (int64_t k = 0; k < C; k++) gr[k * S] += w * (1.0f - eps) * (lse - xr[k * S]);
            }
        }
    }
    return cmi_status(tp);
}

/* The error for a class index t at flat position p of target that is neither in [0, C) nor ignore. */
static void bad_target(cm_tape *tp, const char *op, const cm_tensor *target, const char *what, const cm_tensor *logits,
                       int64_t p, int64_t t, int64_t C, int64_t ignore) {
    int64_t idx[CM_MAX_DIMS];
    int64_t rem = p;
    for (int d = target->ndim - 1; d >= 0; d--) {
        idx[d] = rem % target->shape[d];
        rem /= target->shape[d];
    }
    char pos[160];
    int len = snprintf(pos, sizeof pos, "(");
    for (int d = 0; d < target->ndim; d++)
        len += snprintf(pos + len, sizeof pos - (size_t)len, d ? ", %" PRId64 : "%" PRId64, idx[d]);
    snprintf(pos + len, sizeof pos - (size_t)len, ")");
    cmi_fail(tp, CM_ERR_INVALID_ARG,
             "%s: target%s = %" PRId64 " is not a class index in [0, %" PRId64 ") (%s %s) nor ignore_index %" PRId64,
             op, pos, t, C, what, cmi_shape(logits), ignore);
}

/* P class indices of contiguous target on the tape's device: *count gets the number that are not
 * ignore; false + the tape error naming the first that is neither a class in [0, C) nor ignore
 * (`what` and `ref` name the tensor whose shape the message shows). */
static bool count_targets(cm_tape *tp, const char *op, const cm_tensor *target, const char *what,
                          const cm_tensor *ref, int64_t P, int64_t C, int64_t ignore, int64_t *count) {
    const cmi_backend *be = cmi_be(tp);
    if (be) {
        int64_t bad = -1, bad_val = 0;
        if (cmi_dev_fail(tp, be->ce_check(target->data, target->dtype, P, C, ignore, count, &bad, &bad_val), op))
            return false;
        if (bad >= 0) bad_target(tp, op, target, what, ref, bad, bad_val, C, ignore);
        return bad < 0;
    }
    *count = 0;
    for (int64_t p = 0; p < P; p++) {
        const int64_t t = load_index(target, p);
        if (t == ignore) continue;
        if (t < 0 || t >= C) {
            bad_target(tp, op, target, what, ref, p, t, C, ignore);
            return false;
        }
        (*count)++;
    }
    return true;
}

cm_tensor *cm_cross_entropy(cm_tape *tp, cm_tensor *logits, cm_tensor *target, const cm_cross_entropy_opts *opts) {
    static const char *op = "cross_entropy";
    cm_tensor *ins[2] = {logits, target};
    if (!cmi_begin(tp, op, 2, ins)) return NULL;
    const cm_cross_entropy_opts o = opts ? *opts : cm_cross_entropy_opts_default();
    if (!cmi_check_f32(tp, op, "logits", logits) || !check_reduction(tp, op, o.reduction)) return NULL;
    if (!(o.label_smoothing >= 0.0f && o.label_smoothing <= 1.0f)) {
        cmi_fail(tp, CM_ERR_INVALID_ARG, "%s: label_smoothing %g must be in [0, 1]", op, (double)o.label_smoothing);
        return NULL;
    }
    if (logits->ndim < 2) {
        cmi_fail(tp, CM_ERR_SHAPE, "%s: logits %s must be (N, C) or (N, C, d1, ...)", op, cmi_shape(logits));
        return NULL;
    }
    const bool soft = target->dtype == CM_DTYPE_F32;
    if (soft) {
        if (target->ndim != logits->ndim ||
            memcmp(target->shape, logits->shape, sizeof(int64_t) * (size_t)logits->ndim) != 0) {
            cmi_fail(tp, CM_ERR_SHAPE, "%s: probability target %s must have the logits' shape %s", op,
                     cmi_shape(target), cmi_shape(logits));
            return NULL;
        }
    } else {
        if (!cmi_check_index(tp, op, "target", target)) return NULL;
        bool ok = target->ndim == logits->ndim - 1 && target->shape[0] == logits->shape[0];
        for (int i = 1; ok && i < target->ndim; i++) ok = target->shape[i] == logits->shape[i + 1];
        if (!ok) {
            int64_t want[CM_MAX_DIMS];
            want[0] = logits->shape[0];
            for (int i = 2; i < logits->ndim; i++) want[i - 1] = logits->shape[i];
            cmi_fail(tp, CM_ERR_SHAPE, "%s: class-index target %s must be %s for logits %s (N, C, d1, ...)", op,
                     cmi_shape(target), cmi_shape_of(logits->ndim - 1, want), cmi_shape(logits));
            return NULL;
        }
    }
    logits = cm_contiguous(tp, logits);
    target = cm_contiguous(tp, target);
    if (!logits || !target) return NULL;
    ins[0] = logits;
    ins[1] = target;
    const int64_t N = logits->shape[0], C = logits->shape[1];
    int64_t S = 1;
    for (int i = 2; i < logits->ndim; i++) S *= logits->shape[i];
    const int64_t P = N * S;
    if (C == 0 && P > 0) {
        cmi_fail(tp, CM_ERR_SHAPE, "%s: logits %s have no classes (C = 0)", op, cmi_shape(logits));
        return NULL;
    }
    /* Validate class indices first (serial, cheap next to the C-wide rows). */
    int64_t count = P;
    const cmi_backend *be = cmi_be(tp);
    if (!soft && !count_targets(tp, op, target, "logits", logits, P, C, o.ignore_index, &count)) return NULL;
    int64_t oshape[CM_MAX_DIMS];
    int ond = 0;
    if (o.reduction == CM_REDUCTION_NONE) {
        oshape[ond++] = N;
        for (int i = 2; i < logits->ndim; i++) oshape[ond++] = logits->shape[i];
    }
    cm_tensor *out = cmi_new(tp, CM_DTYPE_F32, ond, oshape);
    float *lse = cmi_dev_scratch(tp, sizeof(float) * (size_t)(P ? P : 1)); // (N·S)
    if (!out || !lse) return NULL;
    if (be) {
        const double denom = o.reduction == CM_REDUCTION_MEAN ? (double)count : 1.0;
        if (cmi_dev_fail(tp,
                         be->ce_fwd(cmi_f32(logits), target->data, target->dtype, soft, N, C, S, C * S, o.ignore_index,
                                    o.label_smoothing, o.reduction == CM_REDUCTION_NONE, denom, cmi_f32(out), lse),
                         op))
            return NULL;
        if (cmi_needs_grad(tp, 2, ins)) {
            cm_node *n = cmi_record(tp, op, out, 2, ins, ce_backward, sizeof(ce_ctx));
            if (!n) return NULL;
            *(ce_ctx *)n->ctx = (ce_ctx){N, C, S, soft, o.ignore_index, o.label_smoothing, o.reduction, lse, denom};
        }
        return out;
    }
    const float *x = cmi_f32(logits), *tv = soft ? cmi_f32(target) : NULL;
    float *ov = cmi_f32(out);
    const float eps = o.label_smoothing, u = eps / (float)C;
    const bool none = o.reduction == CM_REDUCTION_NONE;
    double total = 0.0;
#pragma omp parallel for if (P * C >= CMI_PAR_MIN) schedule(static) reduction(+ : total)
    for (int64_t p = 0; p < P; p++) {
        const int64_t off = (p / S) * C * S + p % S;
        const float *xr = x + off; // (C) at stride S
        const float l = S == 1 ? ce_lse(xr, C, 1) : ce_lse(xr, C, S);
        lse[p] = l;
        double loss;
        if (!soft) {
            const int64_t t = load_index(target, p);
            if (t == o.ignore_index) {
                loss = 0.0;
            } else {
                loss = (1.0 - eps) * ((double)l - xr[t * S]);
                if (eps > 0.0f) {
                    double sx = 0.0;
                    for (int64_t k = 0; k < C; k++) sx += xr[k * S];
                    loss += eps * ((double)l - sx / (double)C);
                }
            }
        } else {
            const float *tr = tv + off;
            loss = 0.0;
            for (int64_t k = 0; k < C; k++) loss += ((1.0 - eps) * tr[k * S] + u) * ((double)l - xr[k * S]);
        }
        if (none) ov[p] = (float)loss;
        else total += loss;
    }
    /* mean over non-ignored targets; all ignored gives 0/0 = NaN, as torch */
    const double denom = o.reduction == CM_REDUCTION_MEAN ? (double)count : 1.0;
    if (!none) ov[0] = (float)(total / denom);
    if (cmi_needs_grad(tp, 2, ins)) {
        cm_node *n = cmi_record(tp, op, out, 2, ins, ce_backward, sizeof(ce_ctx));
        if (!n) return NULL;
        ce_ctx *c = n->ctx;
        *c = (ce_ctx){N, C, S, soft, o.ignore_index, eps, o.reduction, lse, denom};
    }
    return out;
}

/* ------------------------------------------------------------------------------------------ */
/* Linear + cross-entropy, fused (Liger's FusedLinearCrossEntropy): the logits x·wᵀ are made a   */
/* chunk of rows at a time, their loss summed and, when gradients are wanted, the softmax        */
/* gradient of the chunk turned into its share of dx and dw at once. Nothing (R, V)-sized lives  */
/* past a chunk; the backward only scales the saved dx, dw by the upstream gradient.             */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    float *dx; /* (R, C) f32: d loss / d x for upstream 1, or NULL */
    float *dw; /* (V, C) f32: d loss / d w for upstream 1, or NULL */
    int64_t nx, nw;
} lce_ctx;

/* grad(t) += g[0]·d over n elements (g a scalar on the tape's device). */
static void lce_scale_into(cm_tape *tp, cm_tensor *t, float *d, int64_t n, const cm_tensor *g) {
    bool fresh = false;
    cm_tensor *gt = cmi_grad_for_write(tp, t, &fresh);
    if (!gt || cmi_status(tp)) return;
    const cmi_backend *be = cmi_be(tp);
    if (be) { /* g stays on the device: d·g broadcast, written or added */
        const int64_t one[1] = {1}, zero[1] = {0}, shape[1] = {n};
        if (cmi_dev_fail(tp, be->binary(CMI_BIN_MUL, fresh ? cmi_f32(gt) : d, d, one, cmi_f32(g), zero, 1, shape),
                         "linear_cross_entropy backward"))
            return;
        if (!fresh) cmi_dev_fail(tp, be->accum(cmi_f32(gt), one, d, 1, shape), "linear_cross_entropy backward");
        return;
    }
    const float gv = cmi_f32(g)[0];
    float *o = cmi_f32(gt);
    if (fresh) {
#pragma omp parallel for simd schedule(static) if (n > CMI_PAR_MIN)
        for (int64_t i = 0; i < n; i++) o[i] = gv * d[i];
    } else {
#pragma omp parallel for simd schedule(static) if (n > CMI_PAR_MIN)
        for (int64_t i = 0; i < n; i++) o[i] += gv * d[i];
    }
}

static cm_status lce_backward(cm_tape *tp, cm_node *n, const cm_tensor *g) {
    const lce_ctx *c = n->ctx;
    if (c->dx) lce_scale_into(tp, n->in[0], c->dx, c->nx, g);
    if (c->dw && !cmi_status(tp)) lce_scale_into(tp, n->in[1], c->dw, c->nw, g);
    return cmi_status(tp);
}

/* Rows per chunk: Liger's rule (a chunk of logits about the size of x: ceil(V / C) chunks, rows a
 * power of two), but at least 256 rows — every chunk reads and writes all of dw (V·C), so fewer,
 * larger chunks keep that traffic a small part of the GEMMs on a CPU. On a GPU, which does a
 * chunk's GEMMs in a fraction of the time, chunks grow to 256 MiB of f32 logits (CMI_LINEAR_DY_BLOCK_
 * DEVICE, linear's backward blocks): GPT-2's 8192 rows of 50257 in 8 chunks of 1024, not 32 of 256,
 * so w is read and dw read and written 8 times a step instead of 32. */
static int64_t lce_chunk_rows(int64_t R, int64_t V, int64_t C, int64_t user, bool device) {
    int64_t r;
    if (user > 0) {
        r = user;
    } else {
        const int64_t inc = C > 0 ? (V + C - 1) / C : 1;
        const int64_t want = (R + inc - 1) / (inc > 0 ? inc : 1);
        r = 1;
        while (r < want) r *= 2;
        if (r < 256) r = 256;
        while (device && r < R && (double)(2 * r) * (double)V * 4.0 <= (double)CMI_LINEAR_DY_BLOCK_DEVICE) r *= 2;
    }
    return r < R ? r : (R > 0 ? R : 1);
}

/* The CPU part of one chunk: m rows of logits L (m, V) in place → their losses summed (returned)
 * and, when grad, the rows' gradient scale·(softmax - smoothed one-hot) written over L. */
static double lce_rows_cpu(float *L, const cm_tensor *target, int64_t r0, int64_t m, int64_t V, int64_t ignore,
                           float eps, float scale, bool grad) {
    const float u = eps / (float)V;
    double total = 0.0;
#pragma omp parallel for if (m * V >= CMI_PAR_MIN) schedule(static) reduction(+ : total)
    for (int64_t i = 0; i < m; i++) {
        float *row = L + i * V;
        const int64_t t = load_index(target, r0 + i);
        if (t == ignore) {
            if (grad) memset(row, 0, sizeof(float) * (size_t)V);
            continue;
        }
        const float lse = ce_lse(row, V, 1);
        double loss = (1.0 - eps) * ((double)lse - row[t]);
        if (eps > 0.0f) {
            double sx = 0.0;
            for (int64_t k = 0; k < V; k++) sx += row[k];
            loss += eps * ((double)lse - sx / (double)V);
        }
        total += loss;
        if (grad) ce_grad_index(row, row, V, 1, lse, scale, u, eps, t, true);
    }
    return total;
}

cm_tensor *cm_linear_cross_entropy(cm_tape *tp, cm_tensor *x, cm_tensor *w, cm_tensor *target,
                                   const cm_cross_entropy_opts *opts, int64_t chunk_rows) {
    static const char *op = "linear_cross_entropy";
    cm_tensor *ins[3] = {x, w, target};
    if (!cmi_begin(tp, op, 3, ins)) return NULL;
    const cm_cross_entropy_opts o = opts ? *opts : cm_cross_entropy_opts_default();
    if (!check_reduction(tp, op, o.reduction)) return NULL;
    if (o.reduction == CM_REDUCTION_NONE) {
        cmi_fail(tp, CM_ERR_UNSUPPORTED,
                 "%s: reduction NONE is not supported (per-row losses need their own gradients); use CM_REDUCTION_MEAN "
                 "or _SUM, or cm_linear + cm_cross_entropy",
                 op);
        return NULL;
    }
    if (!(o.label_smoothing >= 0.0f && o.label_smoothing <= 1.0f)) {
        cmi_fail(tp, CM_ERR_INVALID_ARG, "%s: label_smoothing %g must be in [0, 1]", op, (double)o.label_smoothing);
        return NULL;
    }
    const bool ac = tp->autocast == CM_DTYPE_BF16;
    for (int k = 0; k < 2; k++) {
        const cm_tensor *t = ins[k];
        const bool ok = ac ? (t->dtype == CM_DTYPE_F32 || t->dtype == CM_DTYPE_BF16) : t->dtype == x->dtype &&
                                                                                         (t->dtype == CM_DTYPE_F32 ||
                                                                                          t->dtype == CM_DTYPE_BF16);
        if (!ok) {
            cmi_fail(tp, CM_ERR_DTYPE, "%s: x %s has dtype %s and w %s dtype %s; both f32 or both bf16 (under autocast, each f32 or bf16)",
                     op, cmi_shape(x), cm_dtype_name(x->dtype), cmi_shape(w), cm_dtype_name(w->dtype));
            return NULL;
        }
    }
    if (target->dtype == CM_DTYPE_F32) {
        cmi_fail(tp, CM_ERR_UNSUPPORTED, "%s: probability targets are not supported; pass class indices (or use cm_linear + cm_cross_entropy)", op);
        return NULL;
    }
    if (!cmi_check_index(tp, op, "target", target)) return NULL;
    if (w->ndim != 2 || x->ndim < 1 || x->shape[x->ndim - 1] != w->shape[1]) {
        cmi_fail(tp, CM_ERR_SHAPE, "%s: w %s must be (V, C) and x %s (..., C) with the same C", op, cmi_shape(w),
                 cmi_shape(x));
        return NULL;
    }
    bool same = target->ndim == x->ndim - 1;
    for (int i = 0; same && i < target->ndim; i++) same = target->shape[i] == x->shape[i];
    if (!same) {
        cmi_fail(tp, CM_ERR_SHAPE, "%s: target %s must be %s for x %s (..., C)", op, cmi_shape(target),
                 cmi_shape_of(x->ndim - 1, x->shape), cmi_shape(x));
        return NULL;
    }
    const int64_t V = w->shape[0], C = w->shape[1], R = cmi_numel(x->ndim - 1, x->shape);
    if (V == 0 && R > 0) {
        cmi_fail(tp, CM_ERR_SHAPE, "%s: w %s has no classes (V = 0)", op, cmi_shape(w));
        return NULL;
    }
    const bool cast_x = ac && x->dtype == CM_DTYPE_F32, cast_w = ac && w->dtype == CM_DTYPE_F32;
    if (!cast_x && !cmi_is_contig(x) && !(x = cm_contiguous(tp, x))) return NULL;
    if (!cast_w && !cmi_is_contig(w) && !(w = cm_contiguous(tp, w))) return NULL;
    if (!cmi_is_contig(target) && !(target = cm_contiguous(tp, target))) return NULL;
    ins[0] = x, ins[1] = w, ins[2] = target;
    const cm_dtype dt = ac ? CM_DTYPE_BF16 : x->dtype;
    const size_t es = cm_dtype_size(dt);
    /* class indices checked and counted (the mean's divisor) */
    int64_t count = 0;
    const cmi_backend *be = cmi_be(tp);
    if (!count_targets(tp, op, target, "w", w, R, V, o.ignore_index, &count)) return NULL;
    const double denom = o.reduction == CM_REDUCTION_MEAN ? (double)count : 1.0;
    const bool gx = cmi_needs_grad(tp, 1, ins), gw = cmi_needs_grad(tp, 1, ins + 1);
    /* On a GPU, rows of V logits that are not whole 16-byte vectors (GPT-2's 50257) send cuBLASLt to
     * its align1 kernels, or matmul.cu to padded copies — of the chunk's logits and gradient and of
     * w, three GEMMs a chunk, and of all of dw (V, C) for every chunk's accumulation. So there the
     * classes are padded once, to Vp (a multiple of 8), by zero rows of w's copy: a chunk's logits
     * are (m, Vp) with zero columns past V, which the loss skips (its rows Vp apart) and whose
     * gradient stays zero; dw is (Vp, C), its first V rows w's gradient. */
    const int64_t Vp = be && V % 8 && cmi_is_contig(w) ? (V + 7) / 8 * 8 : V;
    cm_tensor *out = cmi_new(tp, CM_DTYPE_F32, 0, NULL);
    float *dx = gx && R ? cmi_dev_scratch(tp, sizeof(float) * (size_t)(R * C)) : NULL;  // (R, C)
    float *dw = gw && R ? cmi_dev_scratch(tp, sizeof(float) * (size_t)(Vp * C)) : NULL; // (Vp, C)
    if (!out || (gx && R && !dx) || (gw && R && !dw)) return NULL;
    cm_arena *arena = cmi_op_arena(tp);
    const size_t mark = cm_arena_mark(arena); /* operand copies and the chunk: freed before returning */
    const char *xd = cast_x ? cmi_bf16_copy(tp, x) : (const char *)x->data;
    const char *wd = Vp != V ? cmi_dev_rows_padded(tp, w, dt, Vp, op) /* w (V, C) as dt, then zero rows */
                     : cast_w ? cmi_bf16_copy(tp, w)
                              : (const char *)w->data;
    if (!xd || !wd) return NULL;
    const int64_t rb = lce_chunk_rows(R, Vp, C, chunk_rows, be != NULL);
    const bool grad = dx || dw;
    float *L = cmi_dev_scratch(tp, sizeof(float) * (size_t)(rb * Vp + 1)); // (rb, Vp)
    uint16_t *Lb = grad && dt == CM_DTYPE_BF16 ? cmi_dev_scratch(tp, 2 * (size_t)(rb * Vp + 1)) : NULL;
    float *rl = be ? cmi_dev_scratch(tp, sizeof(float) * (size_t)(R + 1)) : NULL;   // (R) per-row losses
    float *lse = be ? cmi_dev_scratch(tp, sizeof(float) * (size_t)(rb + 1)) : NULL; // (rb)
    float *one = be && grad ? cmi_dev_scratch(tp, sizeof(float)) : NULL;
    if (!L || (grad && dt == CM_DTYPE_BF16 && !Lb) || (be && (!rl || !lse)) || (be && grad && !one)) return NULL;
    if (one) {
        const int64_t s1[1] = {1}, st1[1] = {1};
        if (cmi_dev_fail(tp, be->fill(one, CM_DTYPE_F32, 1, s1, st1, 1.0), op)) return NULL;
    }
    const size_t tes = cm_dtype_size(target->dtype);
    double total = 0.0;
    cm_status st = CM_OK;
    for (int64_t r0 = 0; r0 < R && !st; r0 += rb) {
        const int64_t m = R - r0 < rb ? R - r0 : rb;
        const char *xr = xd + (size_t)(r0 * C) * es;
        /* L (m, Vp) = x[r0:r0+m] (m, C) · wᵀ (C, Vp) */
        if ((st = cmi_gemm(tp, dt, m, Vp, C, xr, C, false, wd, C, true, NULL, false, L, Vp))) break;
        if (be) {
            const void *tc = (const char *)target->data + (size_t)r0 * tes;
            if (cmi_dev_fail(tp, be->ce_fwd(L, tc, target->dtype, false, m, V, 1, Vp, o.ignore_index,
                                            o.label_smoothing, true, 1.0, rl + r0, lse),
                             op) ||
                (grad && cmi_dev_fail(tp, be->ce_bwd(L, tc, target->dtype, false, m, V, 1, Vp, o.ignore_index,
                                                     o.label_smoothing, false, denom, one, lse, L, true, NULL),
                                      op))) {
                st = cmi_status(tp);
                break;
            }
        } else {
            total += lce_rows_cpu(L, target, r0, m, V, o.ignore_index, o.label_smoothing, (float)(1.0 / denom), grad);
        }
        if (!grad) continue;
        const char *gl = (const char *)L; // (m, Vp): the chunk's d loss / d logits
        if (Lb) {
            const int64_t cnt = m * Vp;
            if (be) {
                if (cmi_dev_fail(tp, be->copy(Lb, CM_DTYPE_BF16, NULL, L, CM_DTYPE_F32, NULL, 1, &cnt), op)) {
                    st = cmi_status(tp);
                    break;
                }
            } else {
                cmi_bf16_round(Lb, L, cnt);
            }
            gl = (const char *)Lb;
        }
        /* dx (m, C) = gl (m, Vp) · w (Vp, C); dw (Vp, C) (+)= glᵀ (Vp, m) · x (m, C) */
        if (dx && (st = cmi_gemm(tp, dt, m, C, Vp, gl, Vp, false, wd, C, false, NULL, false, dx + r0 * C, C))) break;
        if (dw && (st = cmi_gemm(tp, dt, Vp, C, m, gl, Vp, true, xr, C, false, NULL, r0 > 0, dw, C))) break;
    }
    if (!st && be) { /* the loss: Σ row losses / denom, on the device */
        cmi_red_plan P;
        memset(&P, 0, sizeof P);
        P.nr = 1, P.rshape[0] = R, P.rstride[0] = 1, P.rcstride[0] = 1, P.n_out = 1, P.n_red = R;
        if (R == 0) {
            const int64_t s1[1] = {1}, st1[1] = {1};
            cmi_dev_fail(tp, be->fill(cmi_f32(out), CM_DTYPE_F32, 1, s1, st1, denom == 0.0 ? NAN : 0.0), op);
        } else {
            cmi_dev_fail(tp, be->reduce(CMI_RED_SUM, &P, rl, NULL, 1.0 / denom, cmi_f32(out), NULL, NULL), op);
        }
    } else if (!st) {
        cmi_f32(out)[0] = (float)(total / denom); /* all ignored: 0/0 = NaN, as torch */
    }
    cm_arena_rewind(arena, mark);
    if (st || cmi_status(tp)) return NULL;
    if (gx || gw) {
        cm_node *n = cmi_record(tp, op, out, 3, ins, lce_backward, sizeof(lce_ctx));
        if (!n) return NULL;
        *(lce_ctx *)n->ctx = (lce_ctx){dx, dw, R * C, V * C};
    }
    return out;
}

/* ------------------------------------------------------------------------------------------ */
/* Mean squared error                                                                           */
/* ------------------------------------------------------------------------------------------ */

static cm_status mse_backward(cm_tape *tp, cm_node *n, const cm_tensor *g) {
    cm_tensor *pred = n->in[0], *target = n->in[1];
    cm_tensor *gp = cmi_grad(tp, pred), *gt = cmi_grad(tp, target);
    if (cmi_status(tp)) return cmi_status(tp);
    const int64_t len = cm_tensor_numel(pred);
    const bool none = n->i[0] == CM_REDUCTION_NONE;
    const float *pv = cmi_f32(pred), *tv = cmi_f32(target), *gv = cmi_f32(g);
    float *gpv = gp ? cmi_f32(gp) : NULL, *gtv = gt ? cmi_f32(gt) : NULL;
    const cmi_backend *be = cmi_be(tp);
    if (be) { /* g[0] stays on the device: the kernel reads it */
        cmi_dev_fail(tp, be->mse_bwd(pv, tv, gv, len, none, n->f[0], gpv, gtv), "mse_loss backward");
        return cmi_status(tp);
    }
    const float k = none ? 2.0f : (float)(2.0 * gv[0] / n->f[0]);
#pragma omp parallel for if (len >= CMI_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < len; i++) {
        const float d = (none ? 2.0f * gv[i] : k) * (pv[i] - tv[i]);
        if (gpv) gpv[i] += d;
        if (gtv) gtv[i] -= d;
    }
    return cmi_status(tp);
}

cm_tensor *cm_mse_loss(cm_tape *tp, cm_tensor *pred, cm_tensor *target, cm_reduction reduction) {
    static const char *op = "mse_loss";
    cm_tensor *ins[2] = {pred, target};
    if (!cmi_begin(tp, op, 2, ins)) return NULL;
    if (!cmi_check_f32(tp, op, "pred", pred) || !cmi_check_f32(tp, op, "target", target) ||
        !check_reduction(tp, op, reduction))
        return NULL;
    if (pred->ndim != target->ndim || memcmp(pred->shape, target->shape, sizeof(int64_t) * (size_t)pred->ndim) != 0) {
        cmi_fail(tp, CM_ERR_SHAPE, "%s: pred %s and target %s must have the same shape", op, cmi_shape(pred),
                 cmi_shape(target));
        return NULL;
    }
    pred = cm_contiguous(tp, pred);
    target = cm_contiguous(tp, target);
    if (!pred || !target) return NULL;
    ins[0] = pred;
    ins[1] = target;
    const bool none = reduction == CM_REDUCTION_NONE;
    cm_tensor *out = none ? cmi_new(tp, CM_DTYPE_F32, pred->ndim, pred->shape) : cmi_new(tp, CM_DTYPE_F32, 0, NULL);
    if (!out) return NULL;
    const int64_t len = cm_tensor_numel(pred);
    const float *pv = cmi_f32(pred), *tv = cmi_f32(target);
    float *ov = cmi_f32(out);
    const cmi_backend *be = cmi_be(tp);
    if (be) {
        const double denom = reduction == CM_REDUCTION_MEAN ? (double)len : 1.0;
        if (cmi_dev_fail(tp, be->mse(pv, tv, len, none, denom, ov), op)) return NULL;
    } else if (none) {
#pragma omp parallel for if (len >= CMI_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < len; i++) ov[i] = (pv[i] - tv[i]) * (pv[i] - tv[i]);
    } else {
        double total = 0.0;
#pragma omp parallel for if (len >= CMI_PAR_MIN) schedule(static) reduction(+ : total)
        for (int64_t i = 0; i < len; i++) {
            const double d = (double)pv[i] - tv[i];
            total += d * d;
        }
        /* mean of an empty tensor is 0/0 = NaN, as torch */
        ov[0] = (float)(reduction == CM_REDUCTION_MEAN ? total / (double)len : total);
    }
    if (cmi_needs_grad(tp, 2, ins)) {
        cm_node *n = cmi_record(tp, op, out, 2, ins, mse_backward, 0);
        if (!n) return NULL;
        n->i[0] = reduction;
        n->f[0] = reduction == CM_REDUCTION_MEAN ? (double)len : 1.0;
    }
    return out;
}
