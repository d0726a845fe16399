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
                     be->ce_bwd(x, target->data, target->dtype, c->soft, c->N, C, S, c->ignore, c->eps,
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
static void bad_target(cm_tape *tp, const char *op, const cm_tensor *target, const cm_tensor *logits, int64_t p,
                       int64_t t, int64_t C, int64_t ignore) {
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
             "%s: target%s = %" PRId64 " is not a class index in [0, %" PRId64 ") (logits %s) nor ignore_index %" PRId64,
             op, pos, t, C, cmi_shape(logits), ignore);
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
    if (!soft && be) {
        int64_t bad = -1, bad_val = 0;
        if (cmi_dev_fail(tp, be->ce_check(target->data, target->dtype, P, C, o.ignore_index, &count, &bad, &bad_val), op))
            return NULL;
        if (bad >= 0) {
            bad_target(tp, op, target, logits, bad, bad_val, C, o.ignore_index);
            return NULL;
        }
    } else if (!soft) {
        count = 0;
        for (int64_t p = 0; p < P; p++) {
            const int64_t t = load_index(target, p);
            if (t == o.ignore_index) continue;
            if (t < 0 || t >= C) {
                bad_target(tp, op, target, logits, p, t, C, o.ignore_index);
                return NULL;
            }
            count++;
        }
    }
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
                         be->ce_fwd(cmi_f32(logits), target->data, target->dtype, soft, N, C, S, o.ignore_index,
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
