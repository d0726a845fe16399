/* Reductions over a set of axes (sum, mean, max, min, var) and softmax / log-softmax along one
 * axis. Inputs may be any strided view; results are contiguous f32.
 *
 * A reduction is planned once: the input's dims are split into kept and reduced groups (size-1
 * dims dropped, neighbours merged where both the input strides and the contiguous strides allow),
 * then one of two loop orders runs:
 *   - "inner": the innermost reduced dim is the fastest in memory (e.g. sum over the last axis):
 *     one output at a time, a strided row loop per group, parallel over outputs — or, for few
 *     outputs (a full reduction), parallel over rows with per-thread partials combined in order.
 *   - "outer": the innermost kept dim is contiguous (e.g. sum over axis 0 of (N, C)): a chunk of
 *     outputs is carried in a vector accumulator while the reduced indices are walked.
 * Sums accumulate in double; max/min keep the first extreme element (row-major order within the
 * group) and propagate NaN (the first NaN wins), as torch.max. */
#include "tensor/backend.h"
#include "tensor/tensor_impl.h"
#include "tensor/vexp.h"

#include <math.h>
#include <omp.h>

typedef enum { R_SUM, R_MEAN, R_MAX, R_MIN, R_VAR } red_op;
static const char *const k_red_names[] = {"sum", "mean", "max", "min", "var"};

/* ------------------------------------------------------------------------------------------ */
/* Planning                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* nk, nr: kept / reduced dims after collapsing (nr >= 1); k/rstride: input strides (elements);
 * k/rcstride: strides in the contiguous layout of the input's shape. The backend's struct, so a
 * device reduction runs the same plan. */
typedef cmi_red_plan red_plan;

/* Normalises the axes into a mask; errors name the op, the axes and the shape. */
static bool parse_axes(cm_tape *tp, const char *op, const cm_tensor *a, const int *axes, int n_axes,
                       bool *mask) {
    for (int i = 0; i < CM_MAX_DIMS; i++) mask[i] = n_axes == 0;
    if (n_axes < 0 || n_axes > a->ndim || (n_axes > 0 && !axes)) {
        cmi_fail(tp, CM_ERR_INVALID_ARG, "%s: %d axes%s given for a %d-d tensor %s (use 0..%d axes; 0 reduces all)", op,
                 n_axes, (n_axes > 0 && !axes) ? " (NULL list)" : "", a->ndim, cmi_shape(a), a->ndim);
        return false;
    }
    for (int i = 0; i < n_axes; i++) {
        int ax = axes[i];
        if (ax < -a->ndim || ax >= a->ndim) {
            cmi_fail(tp, CM_ERR_INVALID_ARG, "%s: axis %d is out of range for %s (use -%d..%d)", op, axes[i],
                     cmi_shape(a), a->ndim, a->ndim - 1);
            return false;
        }
        if (ax < 0) ax += a->ndim;
        if (mask[ax]) {
            cmi_fail(tp, CM_ERR_INVALID_ARG, "%s: axis %d is repeated (as axis %d of %s); list each axis once", op,
                     axes[i], ax, cmi_shape(a));
            return false;
        }
        mask[ax] = true;
    }
    return true;
}

static void plan_reduce(const cm_tensor *a, const bool *mask, red_plan *P) {
    int64_t cs[CM_MAX_DIMS];
    cmi_contig_strides(a->ndim, a->shape, cs);
    memset(P, 0, sizeof *P);
    P->n_out = P->n_red = 1;
    for (int i = 0; i < a->ndim; i++) {
        const int64_t n = a->shape[i];
        if (mask[i]) P->n_red *= n;
        else P->n_out *= n;
        if (n == 1) continue;
        int *cnt = mask[i] ? &P->nr : &P->nk;
        int64_t *sh = mask[i] ? P->rshape : P->kshape, *st = mask[i] ? P->rstride : P->kstride,
                *cst = mask[i] ? P->rcstride : P->kcstride;
        int m = *cnt - 1;
        if (m >= 0 && st[m] == a->stride[i] * n && cst[m] == cs[i] * n) {
            sh[m] *= n;
            st[m] = a->stride[i];
            cst[m] = cs[i];
        } else {
            sh[m + 1] = n;
            st[m + 1] = a->stride[i];
            cst[m + 1] = cs[i];
            (*cnt)++;
        }
    }
    if (P->nr == 0) { /* nothing (or only size-1 dims) reduced: one-element groups */
        P->rshape[0] = 1;
        P->rstride[0] = P->rcstride[0] = 0;
        P->nr = 1;
    }
}

/* Offset of flat index i over the first n dims of (shape, stride), row-major. */
static inline int64_t unravel(int64_t i, int n, const int64_t *shape, const int64_t *stride) {
    int64_t off = 0;
    for (int d = n - 1; d >= 0; d--) {
        off += (i % shape[d]) * stride[d];
        i /= shape[d];
    }
    return off;
}

/* ------------------------------------------------------------------------------------------ */
/* Kernels                                                                                      */
/* ------------------------------------------------------------------------------------------ */

typedef enum { K_SUM, K_SQDEV, K_MAX, K_MIN } red_kernel;

typedef struct {
    double s;    /* K_SUM / K_SQDEV */
    float best;  /* K_MAX / K_MIN */
    int64_t arg; /* flat index of best within the group */
} red_acc;

static red_acc acc_init(red_kernel k) {
    red_acc r = {0.0, k == K_MAX ? -INFINITY : INFINITY, 0};
    return r;
}

/* True when v should replace best: strictly more extreme, or the first NaN. */
static inline bool better(red_kernel k, float v, float best) {
    if (k == K_MAX) return v > best || (isnan(v) && !isnan(best));
    return v < best || (isnan(v) && !isnan(best));
}

/* Sum of n floats at stride s, in double (8 lanes for the contiguous case, so it vectorises). */
static double sum_row(const float *p, int64_t n, int64_t s) {
    double total = 0.0;
    if (s != 1) {
        for (int64_t i = 0; i < n; i++) total += p[i * s];
        return total;
    }
    double acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += p[i + j];
    for (; i < n; i++) total += p[i];
    return total + (((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])));
}

/* Inner order: folds virtual rows [v0, v1) of one group (its element (0, ..., 0) at base) into acc.
 * Each of the group's rows (innermost reduced dim, length L) is cut into `pieces` equal parts, so a
 * group made of one long row can still be split over threads; virtual row v is part v % pieces of
 * row v / pieces. */
static void rows_inner(const red_plan *P, red_kernel k, const float *base, double mean, int64_t pieces, int64_t v0,
                       int64_t v1, red_acc *acc) {
    const int64_t L = P->rshape[P->nr - 1], s = P->rstride[P->nr - 1];
    for (int64_t v = v0; v < v1; v++) {
        const int64_t r = v / pieces, part = v % pieces;
        const int64_t i0 = L * part / pieces, i1 = L * (part + 1) / pieces;
        const float *p = base + unravel(r, P->nr - 1, P->rshape, P->rstride) + i0 * s;
        const int64_t len = i1 - i0, first = r * L + i0;
        switch (k) {
        case K_SUM: acc->s += sum_row(p, len, s); break;
        case K_SQDEV: {
            double t = 0.0;
            for (int64_t i = 0; i < len; i++) {
                const double d = (double)p[i * s] - mean;
                t += d * d;
            }
            acc->s += t;
            break;
        }
        case K_MAX:
        case K_MIN:
            for (int64_t i = 0; i < len; i++)
                if (better(k, p[i * s], acc->best)) {
                    acc->best = p[i * s];
                    acc->arg = first + i;
                }
            break;
        }
    }
}

/* Combines a later partial into an earlier one (ties keep the earlier, i.e. first, element). */
static void acc_merge(red_kernel k, red_acc *into, const red_acc *later) {
    if (k == K_SUM || k == K_SQDEV) into->s += later->s;
    else if (better(k, later->best, into->best)) *into = *later;
}

/* Runs kernel k over every group. Results per output o: sums into `s_out` (double), extremes into
 * `best_out` and `arg_out` (flat index in the group). `mean` (per output) is read by K_SQDEV. */
static cm_status run_reduce(cm_tape *tp, const red_plan *P, red_kernel k, const float *x, const double *mean,
                            double *s_out, float *best_out, int64_t *arg_out) {
    const int64_t n_out = P->n_out, n_red = P->n_red;
    if (n_out == 0) return CM_OK;
    if (n_red == 0) { /* empty groups: sum 0; max/min are rejected before we get here */
        for (int64_t o = 0; o < n_out; o++) {
            if (s_out) s_out[o] = 0.0;
            if (best_out) best_out[o] = k == K_MAX ? -INFINITY : INFINITY;
            if (arg_out) arg_out[o] = 0;
        }
        return CM_OK;
    }
    const bool big = n_out * n_red >= CMI_PAR_MIN;
    const int nth = big ? cm_num_threads() : 1;
    const bool outer_order = P->nk >= 1 && P->kstride[P->nk - 1] == 1 && P->rstride[P->nr - 1] != 1;
    if (outer_order) {
        enum { CH = 256 };
        const int64_t Kin = P->kshape[P->nk - 1], n_chunks = (Kin + CH - 1) / CH, tasks = (n_out / Kin) * n_chunks;
#pragma omp parallel for if (big && tasks > 1) num_threads(nth) schedule(static)
        for (int64_t t = 0; t < tasks; t++) {
            const int64_t ko = t / n_chunks, j0 = (t % n_chunks) * CH, w = Kin - j0 < CH ? Kin - j0 : CH;
            const float *base = x + unravel(ko, P->nk - 1, P->kshape, P->kstride) + j0;
            const int64_t o0 = ko * Kin + j0;
            double s[CH];
            float best[CH];
            int64_t arg[CH];
            for (int64_t j = 0; j < w; j++) {
                s[j] = 0.0;
                best[j] = k == K_MAX ? -INFINITY : INFINITY;
                arg[j] = 0;
            }
            for (int64_t r = 0; r < n_red; r++) {
                const float *p = base + unravel(r, P->nr, P->rshape, P->rstride);
                switch (k) {
                case K_SUM:
                    for (int64_t j = 0; j < w; j++) s[j] += p[j];
                    break;
                case K_SQDEV:
                    for (int64_t j = 0; j < w; j++) {
                        const double d = (double)p[j] - mean[o0 + j];
                        s[j] += d * d;
                    }
                    break;
                case K_MAX:
                case K_MIN:
                    for (int64_t j = 0; j < w; j++)
                        if (better(k, p[j], best[j])) {
                            best[j] = p[j];
                            arg[j] = r;
                        }
                    break;
                }
            }
            for (int64_t j = 0; j < w; j++) {
                if (s_out) s_out[o0 + j] = s[j];
                if (best_out) best_out[o0 + j] = best[j];
                if (arg_out) arg_out[o0 + j] = arg[j];
            }
        }
        return CM_OK;
    }
    const int64_t L = P->rshape[P->nr - 1], rows = n_red / L;
    if (n_out >= nth || n_red < CMI_PAR_MIN) {
#pragma omp parallel for if (big && n_out > 1) num_threads(nth) schedule(static)
        for (int64_t o = 0; o < n_out; o++) {
            red_acc acc = acc_init(k);
            rows_inner(P, k, x + unravel(o, P->nk, P->kshape, P->kstride), mean ? mean[o] : 0.0, 1, 0, rows, &acc);
            if (s_out) s_out[o] = acc.s;
            if (best_out) best_out[o] = acc.best;
            if (arg_out) arg_out[o] = acc.arg;
        }
        return CM_OK;
    }
    /* Few large groups (e.g. a full reduction): split each group over the threads, cutting rows
     * into pieces when there are too few of them. */
    const int64_t want = 4 * (int64_t)nth, pieces = rows >= want ? 1 : (want + rows - 1) / rows,
                  vrows = rows * pieces;
    red_acc *part = cmi_scratch(tp, sizeof(red_acc) * (size_t)nth);
    if (!part) return cmi_status(tp);
    for (int64_t o = 0; o < n_out; o++) {
        const float *base = x + unravel(o, P->nk, P->kshape, P->kstride);
        const double m = mean ? mean[o] : 0.0;
        int used = nth;
#pragma omp parallel num_threads(nth)
        {
            const int t = omp_get_thread_num(), T = omp_get_num_threads();
#pragma omp single
            used = T;
            /* contiguous ranges in thread order, so partials merge in row-major order */
            const int64_t v0 = vrows * t / T, v1 = vrows * (t + 1) / T;
            part[t] = acc_init(k);
            rows_inner(P, k, base, m, pieces, v0, v1, &part[t]);
        }
        red_acc acc = part[0];
        for (int t = 1; t < used; t++) acc_merge(k, &acc, &part[t]);
        if (s_out) s_out[o] = acc.s;
        if (best_out) best_out[o] = acc.best;
        if (arg_out) arg_out[o] = acc.arg;
    }
    return CM_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* sum / mean / max / min / var and their backward                                              */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    bool mask[CM_MAX_DIMS];
    int64_t *idx;  /* max/min: (n_out) index of the chosen element in the input's contiguous layout */
    double *mean;  /* var: (n_out) group means */
    float *mean32; /* var on a device: the means as f32, for the backward kernel */
    double scale;  /* mean: 1/n; var: 2/(n - correction) */
} red_ctx;

/* Strides over the input's shape of a tensor laid out like the output (reduced dims: stride 0). */
static void out_bcast_strides(const cm_tensor *a, const bool *mask, int64_t *st) {
    int64_t kd[CM_MAX_DIMS];
    for (int i = 0; i < a->ndim; i++) kd[i] = mask[i] ? 1 : a->shape[i];
    cmi_contig_strides(a->ndim, kd, st);
    for (int i = 0; i < a->ndim; i++)
        if (mask[i]) st[i] = 0;
}

typedef struct {
    float scale;
} bsum_ctx;

/* ga[i] += scale · g[i·sg] */
static void bsum_row(int64_t n, char *const *p, const int64_t *inner, void *vctx) {
    const float sc = ((const bsum_ctx *)vctx)->scale;
    float *ga = (float *)p[0];
    const float *g = (const float *)p[1];
    const int64_t sg = inner[1];
    if (sg == 0) {
        const float v = sc * g[0];
        for (int64_t i = 0; i < n; i++) ga[i] += v;
    } else {
        for (int64_t i = 0; i < n; i++) ga[i] += sc * g[i * sg];
    }
}

/* ga[i] += scale · g[i·sg] · (x[i·sx] - mean[i·sm]); mean is stored as f32 for this pass. */
static void bvar_row(int64_t n, char *const *p, const int64_t *inner, void *vctx) {
    const float sc = ((const bsum_ctx *)vctx)->scale;
    float *ga = (float *)p[0];
    const float *g = (const float *)p[1], *x = (const float *)p[2], *m = (const float *)p[3];
    const int64_t sg = inner[1], sx = inner[2], sm = inner[3];
    for (int64_t i = 0; i < n; i++) ga[i] += sc * g[i * sg] * (x[i * sx] - m[i * sm]);
}

static cm_status red_backward(cm_tape *tp, cm_node *n, const cm_tensor *g) {
    cm_tensor *a = n->in[0];
    const red_ctx *c = n->ctx;
    const red_op op = (red_op)n->i[0];
    cm_tensor *ga = cmi_grad(tp, a); // (a's shape), contiguous
    if (!ga) return cmi_status(tp);
    const float *gv = cmi_f32(g); // (output shape)
    float *gav = cmi_f32(ga);
    const int64_t n_out = cm_tensor_numel(g);
    const cmi_backend *be = cmi_be(tp);
    if (be) {
        cm_status s;
        int64_t sg[CM_MAX_DIMS];
        out_bcast_strides(a, c->mask, sg);
        if (op == R_MAX || op == R_MIN) s = be->scatter_add(gav, c->idx, gv, n_out);
        else if (op == R_VAR) s = be->var_bwd(gav, gv, sg, cmi_f32(a), a->stride, c->mean32, sg, (float)c->scale,
                                              a->ndim, a->shape);
        else s = be->add_scaled(gav, gv, sg, (float)c->scale, a->ndim, a->shape);
        cmi_dev_fail(tp, s, k_red_names[op]);
        return cmi_status(tp);
    }
    if (op == R_MAX || op == R_MIN) {
        /* each output owns a distinct input element */
#pragma omp parallel for if (n_out >= CMI_PAR_MIN) schedule(static)
        for (int64_t o = 0; o < n_out; o++) gav[c->idx[o]] += gv[o];
        return cmi_status(tp);
    }
    int64_t st[4][CM_MAX_DIMS];
    cmi_contig_strides(a->ndim, a->shape, st[0]);
    out_bcast_strides(a, c->mask, st[1]);
    bsum_ctx bc = {(float)c->scale};
    size_t es[4] = {4, 4, 4, 4};
    if (op == R_VAR) {
        float *m32 = cmi_scratch(tp, sizeof(float) * (size_t)(n_out ? n_out : 1)); // (output shape)
        if (!m32) return cmi_status(tp);
        for (int64_t o = 0; o < n_out; o++) m32[o] = (float)c->mean[o];
        memcpy(st[2], a->stride, sizeof(int64_t) * (size_t)a->ndim);
        memcpy(st[3], st[1], sizeof(int64_t) * (size_t)a->ndim);
        char *bases[4] = {(char *)gav, (char *)gv, (char *)a->data, (char *)m32};
        cmi_iterate(a->ndim, a->shape, 4, st, bases, es, true, bvar_row, &bc);
    } else {
        char *bases[2] = {(char *)gav, (char *)gv};
        cmi_iterate(a->ndim, a->shape, 2, st, bases, es, true, bsum_row, &bc);
    }
    return cmi_status(tp);
}

static cm_tensor *reduce(cm_tape *tp, red_op op, cm_tensor *a, const int *axes, int n_axes, int correction,
                         bool keepdim) {
    const char *name = k_red_names[op];
    if (!cmi_begin(tp, name, 1, &a)) return NULL;
    if (!cmi_check_f32(tp, name, "input", a)) return NULL;
    bool mask[CM_MAX_DIMS];
    if (!parse_axes(tp, name, a, axes, n_axes, mask)) return NULL;
    if (op == R_VAR && correction < 0) {
        cmi_fail(tp, CM_ERR_INVALID_ARG, "var: correction %d must be >= 0 (0: population, 1: sample)", correction);
        return NULL;
    }
    red_plan P;
    plan_reduce(a, mask, &P);
    if ((op == R_MAX || op == R_MIN) && P.n_red == 0 && P.n_out > 0) {
        cmi_fail(tp, CM_ERR_SHAPE, "%s: cannot reduce %s over empty axes (no elements to pick from)", name,
                 cmi_shape(a));
        return NULL;
    }
    int nd = 0;
    int64_t shape[CM_MAX_DIMS];
    for (int i = 0; i < a->ndim; i++)
        if (!mask[i]) shape[nd++] = a->shape[i];
        else if (keepdim) shape[nd++] = 1;
    cm_tensor *out = cmi_new(tp, CM_DTYPE_F32, nd, shape);
    if (!out) return NULL;
    const bool grad = cmi_needs_grad(tp, 1, &a);
    const int64_t n_out = P.n_out;
    float *ov = cmi_f32(out);
    const float *xv = cmi_f32(a);
    const size_t n_alloc = (size_t)(n_out ? n_out : 1);
    red_ctx c;
    memset(&c, 0, sizeof c);
    memcpy(c.mask, mask, sizeof mask);
    const cmi_backend *be = cmi_be(tp);
    if (be) {
        cm_status s = CM_OK;
        const double inv = P.n_red ? 1.0 / (double)P.n_red : NAN;
        if (op == R_SUM || op == R_MEAN) {
            c.scale = op == R_SUM ? 1.0 : 1.0 / (double)P.n_red;
            s = be->reduce(CMI_RED_SUM, &P, xv, NULL, op == R_SUM ? 1.0 : inv, ov, NULL, NULL);
        } else if (op == R_VAR) {
            double *mean = cmi_dev_scratch(tp, sizeof(double) * n_alloc); // (n_out)
            float *mean32 = cmi_dev_scratch(tp, sizeof(float) * n_alloc); // (n_out)
            if (!mean || !mean32) return NULL;
            const double dof = (double)P.n_red - correction > 0 ? (double)P.n_red - correction : 0.0;
            s = be->reduce(CMI_RED_SUM, &P, xv, NULL, inv, mean32, mean, NULL);
            if (!s) s = be->reduce(CMI_RED_SQDEV, &P, xv, mean, 1.0 / dof, ov, NULL, NULL);
            c.mean = mean;
            c.mean32 = mean32;
            c.scale = 2.0 / dof;
        } else {
            int64_t *arg = grad ? cmi_dev_scratch(tp, sizeof(int64_t) * n_alloc) : NULL; // (n_out)
            if (grad && !arg) return NULL;
            s = be->reduce(op == R_MAX ? CMI_RED_MAX : CMI_RED_MIN, &P, xv, NULL, 0.0, ov, NULL, arg);
            c.idx = arg;
        }
        if (cmi_dev_fail(tp, s, name)) return NULL;
    } else switch (op) {
    case R_SUM:
    case R_MEAN:
    case R_VAR: {
        double *s = cmi_scratch(tp, sizeof(double) * n_alloc); // (n_out)
        if (!s) return NULL;
        if (run_reduce(tp, &P, K_SUM, xv, NULL, s, NULL, NULL)) return NULL;
        if (op == R_SUM) {
            for (int64_t o = 0; o < n_out; o++) ov[o] = (float)s[o];
            c.scale = 1.0;
            break;
        }
        const double inv = 1.0 / (double)P.n_red; /* n_red = 0: NaN means, as torch */
        for (int64_t o = 0; o < n_out; o++) s[o] = P.n_red ? s[o] * inv : NAN;
        if (op == R_MEAN) {
            for (int64_t o = 0; o < n_out; o++) ov[o] = (float)s[o];
            c.scale = inv;
            break;
        }
        double *sq = cmi_scratch(tp, sizeof(double) * n_alloc); // (n_out)
        if (!sq) return NULL;
        if (run_reduce(tp, &P, K_SQDEV, xv, s, sq, NULL, NULL)) return NULL;
        /* dof <= 0 divides by zero (inf, or NaN for 0/0), as torch does */
        const double dof = (double)P.n_red - correction > 0 ? (double)P.n_red - correction : 0.0;
        for (int64_t o = 0; o < n_out; o++) ov[o] = (float)(sq[o] / dof);
        c.mean = s;
        c.scale = 2.0 / dof;
        break;
    }
    case R_MAX:
    case R_MIN: {
        int64_t *arg = cmi_scratch(tp, sizeof(int64_t) * n_alloc); // (n_out)
        if (!arg) return NULL;
        if (run_reduce(tp, &P, op == R_MAX ? K_MAX : K_MIN, xv, NULL, NULL, ov, arg)) return NULL;
        if (grad) {
            /* group-flat index -> index in the contiguous layout of the input (ga) */
            for (int64_t o = 0; o < n_out; o++)
                arg[o] = unravel(o, P.nk, P.kshape, P.kcstride) + unravel(arg[o], P.nr, P.rshape, P.rcstride);
            c.idx = arg;
        }
        break;
    }
    }
    if (grad) {
        cm_node *n = cmi_record(tp, name, out, 1, &a, red_backward, sizeof(red_ctx));
        if (!n) return NULL;
        memcpy(n->ctx, &c, sizeof c);
        n->i[0] = op;
    }
    return out;
}

cm_tensor *cm_sum(cm_tape *tp, cm_tensor *a, const int *axes, int n_axes, bool keepdim) {
    return reduce(tp, R_SUM, a, axes, n_axes, 0, keepdim);
}
cm_tensor *cm_mean(cm_tape *tp, cm_tensor *a, const int *axes, int n_axes, bool keepdim) {
    return reduce(tp, R_MEAN, a, axes, n_axes, 0, keepdim);
}
cm_tensor *cm_max(cm_tape *tp, cm_tensor *a, const int *axes, int n_axes, bool keepdim) {
    return reduce(tp, R_MAX, a, axes, n_axes, 0, keepdim);
}
cm_tensor *cm_min(cm_tape *tp, cm_tensor *a, const int *axes, int n_axes, bool keepdim) {
    return reduce(tp, R_MIN, a, axes, n_axes, 0, keepdim);
}
cm_tensor *cm_var(cm_tape *tp, cm_tensor *a, const int *axes, int n_axes, int correction, bool keepdim) {
    return reduce(tp, R_VAR, a, axes, n_axes, correction, keepdim);
}

/* ------------------------------------------------------------------------------------------ */
/* softmax / log_softmax along one axis: the input (made contiguous) is viewed as               */
/* (outer, L, inner); inner == 1 is the row fast path, else columns are done in chunks of CH.   */
/* ------------------------------------------------------------------------------------------ */

enum { SM_CH = 64 };

static void softmax_row(const float *x, float *y, int64_t L, bool log_out) {
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int64_t l = 0; l < L; l++) mx = x[l] > mx ? x[l] : mx;
    if (mx == -INFINITY) mx = 0.0f; /* an all -inf row: exp gives 0s, sum 0 -> NaN as torch */
    double sum = 0.0;
    if (log_out) {
        sum = cmi_sum_exp(x, L, 1, mx);
        const float lse = mx + (float)log(sum);
        for (int64_t l = 0; l < L; l++) y[l] = x[l] - lse;
    } else {
        /* two loops: GCC does not if-convert the exp's selects when the store and the
         * reduction share one loop */
#pragma omp simd
        for (int64_t l = 0; l < L; l++) y[l] = cmi_vexpf(x[l] - mx);
#pragma omp simd reduction(+ : sum)
        for (int64_t l = 0; l < L; l++) sum += y[l];
        const float inv = (float)(1.0 / sum);
        for (int64_t l = 0; l < L; l++) y[l] *= inv;
    }
}

/* Columns [j0, j0+w) of one (L, inner) block. */
static void softmax_cols(const float *x, float *y, int64_t L, int64_t inner, int64_t w, bool log_out) {
    float mx[SM_CH], sum[SM_CH];
    for (int64_t j = 0; j < w; j++) {
        mx[j] = -INFINITY;
        sum[j] = 0.0f;
    }
    for (int64_t l = 0; l < L; l++)
        for (int64_t j = 0; j < w; j++) mx[j] = x[l * inner + j] > mx[j] ? x[l * inner + j] : mx[j];
    for (int64_t j = 0; j < w; j++)
        if (mx[j] == -INFINITY) mx[j] = 0.0f;
    for (int64_t l = 0; l < L; l++)
        for (int64_t j = 0; j < w; j++) {
            const float e = cmi_vexpf(x[l * inner + j] - mx[j]);
            sum[j] += e;
            if (!log_out) y[l * inner + j] = e;
        }
    if (log_out) {
        for (int64_t j = 0; j < w; j++) mx[j] += logf(sum[j]);
        for (int64_t l = 0; l < L; l++)
            for (int64_t j = 0; j < w; j++) y[l * inner + j] = x[l * inner + j] - mx[j];
    } else {
        for (int64_t j = 0; j < w; j++) sum[j] = 1.0f / sum[j];
        for (int64_t l = 0; l < L; l++)
            for (int64_t j = 0; j < w; j++) y[l * inner + j] *= sum[j];
    }
}

/* softmax: gx += y·(g - Σ g·y); log_softmax: gx += g - exp(y)·Σ g. */
static void softmax_bwd_cols(const float *y, const float *g, float *gx, int64_t L, int64_t inner, int64_t w,
                             bool log_out) {
    float dot[SM_CH];
    for (int64_t j = 0; j < w; j++) dot[j] = 0.0f;
    for (int64_t l = 0; l < L; l++)
        for (int64_t j = 0; j < w; j++) dot[j] += log_out ? g[l * inner + j] : g[l * inner + j] * y[l * inner + j];
    for (int64_t l = 0; l < L; l++)
        for (int64_t j = 0; j < w; j++) {
            const int64_t q = l * inner + j;
            gx[q] += log_out ? g[q] - cmi_vexpf(y[q]) * dot[j] : y[q] * (g[q] - dot[j]);
        }
}

static void softmax_bwd_row(const float *y, const float *g, float *gx, int64_t L, bool log_out) {
    double dot = 0.0;
    if (log_out) {
#pragma omp simd reduction(+ : dot)
        for (int64_t l = 0; l < L; l++) dot += g[l];
        const float d = (float)dot;
        for (int64_t l = 0; l < L; l++) gx[l] += g[l] - cmi_vexpf(y[l]) * d;
    } else {
#pragma omp simd reduction(+ : dot)
        for (int64_t l = 0; l < L; l++) dot += (double)g[l] * y[l];
        const float d = (float)dot;
        for (int64_t l = 0; l < L; l++) gx[l] += y[l] * (g[l] - d);
    }
}

static void axis_split(const cm_tensor *a, int axis, int64_t *outer, int64_t *L, int64_t *inner) {
    *outer = *inner = 1;
    for (int i = 0; i < axis; i++) *outer *= a->shape[i];
    for (int i = axis + 1; i < a->ndim; i++) *inner *= a->shape[i];
    *L = a->shape[axis];
}

static cm_status softmax_backward(cm_tape *tp, cm_node *n, const cm_tensor *g) {
    cm_tensor *a = n->in[0];
    cm_tensor *ga = cmi_grad(tp, a);
    if (!ga) return cmi_status(tp);
    const bool log_out = n->i[0];
    int64_t outer, L, inner;
    axis_split(a, (int)n->i[1], &outer, &L, &inner);
    const float *y = cmi_f32(n->out), *gv = cmi_f32(g); // (outer, L, inner)
    float *gx = cmi_f32(ga);
    const cmi_backend *be = cmi_be(tp);
    if (be) {
        cmi_dev_fail(tp, be->softmax_bwd(y, gv, gx, outer, L, inner, log_out), "softmax backward");
        return cmi_status(tp);
    }
    const bool par = outer * L * inner >= CMI_PAR_MIN;
    if (inner == 1) {
#pragma omp parallel for if (par) schedule(static)
        for (int64_t o = 0; o < outer; o++) softmax_bwd_row(y + o * L, gv + o * L, gx + o * L, L, log_out);
    } else {
        const int64_t nch = (inner + SM_CH - 1) / SM_CH;
#pragma omp parallel for if (par) schedule(static)
        for (int64_t t = 0; t < outer * nch; t++) {
            const int64_t o = t / nch, j0 = (t % nch) * SM_CH, w = inner - j0 < SM_CH ? inner - j0 : SM_CH;
            const int64_t off = o * L * inner + j0;
            softmax_bwd_cols(y + off, gv + off, gx + off, L, inner, w, log_out);
        }
    }
    return cmi_status(tp);
}

static cm_tensor *softmax_impl(cm_tape *tp, cm_tensor *a, int axis, bool log_out) {
    const char *name = log_out ? "log_softmax" : "softmax";
    if (!cmi_begin(tp, name, 1, &a)) return NULL;
    if (!cmi_check_f32(tp, name, "input", a)) return NULL;
    if (a->ndim == 0) {
        cmi_fail(tp, CM_ERR_SHAPE, "%s: input is a scalar %s; it needs at least one dim", name, cmi_shape(a));
        return NULL;
    }
    if (!cmi_axis(tp, name, a->ndim, &axis)) return NULL;
    a = cm_contiguous(tp, a); /* recorded when a copy is made, so the gradient still reaches the view */
    if (!a) return NULL;
    cm_tensor *out = cmi_new(tp, CM_DTYPE_F32, a->ndim, a->shape);
    if (!out) return NULL;
    int64_t outer, L, inner;
    axis_split(a, axis, &outer, &L, &inner);
    const float *x = cmi_f32(a); // (outer, L, inner)
    float *y = cmi_f32(out);     // (outer, L, inner)
    const bool par = outer * L * inner >= CMI_PAR_MIN;
    const cmi_backend *be = cmi_be(tp);
    if (be) {
        if (cmi_dev_fail(tp, be->softmax(x, y, outer, L, inner, log_out), name)) return NULL;
    } else if (inner == 1) {
#pragma omp parallel for if (par) schedule(static)
        for (int64_t o = 0; o < outer; o++) softmax_row(x + o * L, y + o * L, L, log_out);
    } else {
        const int64_t nch = (inner + SM_CH - 1) / SM_CH;
#pragma omp parallel for if (par) schedule(static)
        for (int64_t t = 0; t < outer * nch; t++) {
            const int64_t o = t / nch, j0 = (t % nch) * SM_CH, w = inner - j0 < SM_CH ? inner - j0 : SM_CH;
            const int64_t off = o * L * inner + j0;
            softmax_cols(x + off, y + off, L, inner, w, log_out);
        }
    }
    if (cmi_needs_grad(tp, 1, &a)) {
        cm_node *n = cmi_record(tp, name, out, 1, &a, softmax_backward, 0);
        if (!n) return NULL;
        n->i[0] = log_out;
        n->i[1] = axis;
    }
    return out;
}

cm_tensor *cm_softmax(cm_tape *tp, cm_tensor *a, int axis) { return softmax_impl(tp, a, axis, false); }
cm_tensor *cm_log_softmax(cm_tape *tp, cm_tensor *a, int axis) { return softmax_impl(tp, a, axis, true); }

/* ------------------------------------------------------------------------------------------ */
/* argmax over the last axis, read back to the host (the trainer's accuracy on a GPU)           */
/* ------------------------------------------------------------------------------------------ */

cm_status cmi_argmax_last(cm_tape *tp, const cm_tensor *x, int64_t *out) {
    if (x->dtype != CM_DTYPE_F32 || x->ndim < 1 || x->shape[x->ndim - 1] < 1 || !cm_tensor_is_contiguous(x))
        return cm_set_error(CM_ERR_INVALID_ARG, "argmax: %s %s must be contiguous f32 with a last axis of 1 or more",
                            cmi_shape(x), cm_dtype_name(x->dtype));
    const int64_t C = x->shape[x->ndim - 1], rows = cm_tensor_numel(x) / C;
    const float *xv = x->data;
    if (x->device == CM_DEVICE_CPU) { /* the first maximum; NaN propagates (the first NaN wins), as the kernels */
        for (int64_t r = 0; r < rows; r++) {
            const float *row = xv + r * C;
            int64_t best = 0;
            for (int64_t c = 1; c < C && !isnan(row[best]); c++)
                if (row[c] > row[best] || isnan(row[c])) best = c;
            out[r] = best;
        }
        return CM_OK;
    }
    const cmi_backend *be = cmi_backend_get(x->device);
    cm_arena *a = be ? cmi_dev_arena(tp, x->device) : NULL;
    if (!a) return cm_set_error(CM_ERR_UNSUPPORTED, "argmax: device %s cannot be used", cm_device_name(x->device));
    if (rows == 0) return CM_OK;
    const size_t mark = cm_arena_mark(a);
    float *vals = cm_arena_alloc(a, sizeof(float) * (size_t)rows);
    int64_t *idx = vals ? cm_arena_alloc(a, sizeof(int64_t) * (size_t)rows) : NULL;
    cm_status s = idx ? CM_OK : cm_last_status();
    if (!s) {
        bool mask[CM_MAX_DIMS] = {false};
        mask[x->ndim - 1] = true;
        red_plan P;
        plan_reduce(x, mask, &P);
        s = be->reduce(CMI_RED_MAX, &P, xv, NULL, 0.0, vals, NULL, idx);
    }
    if (!s) s = be->memcpy(out, idx, sizeof(int64_t) * (size_t)rows, CMI_D2H);
    cm_arena_rewind(a, mark);
    if (s) return s;
    for (int64_t r = 0; r < rows; r++) out[r] -= r * C; /* contiguous index -> column */
    return CM_OK;
}
