/* Indexing and joining: embedding, index_select, gather, concat, stack, split. The forward passes
 * copy elements of any dtype; the backward passes scatter-add the f32 gradient, partitioned so no
 * two threads write the same element. */
#include "tensor/backend.h"
#include "tensor/tensor_impl.h"

#include <stdio.h>

/* ------------------------------------------------------------------------------------------ */
/* Index helpers                                                                                */
/* ------------------------------------------------------------------------------------------ */

static inline int64_t load_index(cm_dtype dt, const void *p, int64_t i) {
    switch (dt) {
    case CM_DTYPE_I32: return ((const int32_t *)p)[i];
    case CM_DTYPE_I64: return ((const int64_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
    }
}

/* "[1, 2]": the multi-index of flat position i in a tensor of the given shape. */
static const char *pos_str(char *buf, size_t cap, int ndim, const int64_t *shape, int64_t i) {
    int64_t idx[CM_MAX_DIMS];
    for (int d = ndim - 1; d >= 0; d--) {
        idx[d] = shape[d] ? i % shape[d] : 0;
        i = shape[d] ? i / shape[d] : 0;
    }
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && k < cap; d++)
        k += (size_t)snprintf(buf + k, cap - k, d ? ", %lld" : "%lld", (long long)idx[d]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
    return buf;
}

/* The indices of idx (any strides, integer dtype) as a contiguous i64 array in the arena, each
 * checked against [0, limit). NULL + tape error otherwise, naming the value and its position. */
static int64_t *read_indices(cm_tape *tp, const char *op, cm_tensor *idx, int64_t limit, const char *what) {
    if (!cmi_check_index(tp, op, "idx", idx)) return NULL;
    cm_tensor *ic = cm_contiguous(tp, idx);
    if (!ic) return NULL;
    const int64_t n = cm_tensor_numel(ic);
    int64_t *out = cmi_dev_scratch(tp, sizeof(int64_t) * (size_t)(n + 1)); // (n), on the op's device
    if (!out) return NULL;
    int64_t bad = -1, bad_val = 0;
    const cmi_backend *be = cmi_be(tp);
    if (be) {
        if (cmi_dev_fail(tp, be->read_indices(out, ic->data, ic->dtype, n, limit, &bad, &bad_val), op)) return NULL;
    } else {
        for (int64_t i = 0; i < n; i++) {
            const int64_t v = load_index(ic->dtype, ic->data, i);
            out[i] = v;
            if ((v < 0 || v >= limit) && bad < 0) bad = i;
        }
        if (bad >= 0) bad_val = out[bad];
    }
    if (bad >= 0) {
        char pos[160];
        cmi_fail(tp, CM_ERR_INVALID_ARG, "%s: index %lld at position %s of idx %s is outside [0, %lld) (%s)", op,
                 (long long)bad_val, pos_str(pos, sizeof pos, idx->ndim, idx->shape, bad), cmi_shape(idx),
                 (long long)limit, what);
        return NULL;
    }
    return out;
}

/* ------------------------------------------------------------------------------------------ */
/* Row selection: a (O, A, I) -> out (O, K, I) with out[o, k] = a[o, idx[k]]; embedding is O = 1  */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    int64_t *idx; // (K)
    int64_t O, A, I, K;
} select_ctx;

static void select_forward(char *out, const char *a, const select_ctx *s, size_t es) {
    const size_t row = (size_t)s->I * es;
#pragma omp parallel for if (s->O * s->K * s->I >= CMI_PAR_MIN) schedule(static)
    for (int64_t ok = 0; ok < s->O * s->K; ok++) {
        const int64_t o = ok / s->K, k = ok % s->K;
        memcpy(out + (size_t)ok * row, a + (size_t)(o * s->A + s->idx[k]) * row, row);
    }
}

/* ga (O, A, I) += scatter of g (O, K, I). Tasks are (o, block of I columns): each writes its own
 * columns of ga[o], so repeated indices never race. */
static void select_backward_kernel(float *ga, const float *g, const select_ctx *s) {
    enum { BLK = 256 };
    const int64_t nb = (s->I + BLK - 1) / BLK;
#pragma omp parallel for collapse(2) if (s->O * s->K * s->I >= CMI_PAR_MIN) schedule(static)
    for (int64_t o = 0; o < s->O; o++)
        for (int64_t bl = 0; bl < nb; bl++) {
            const int64_t i0 = bl * BLK, i1 = i0 + BLK < s->I ? i0 + BLK : s->I;
            for (int64_t k = 0; k < s->K; k++) {
                float *dst = ga + (o * s->A + s->idx[k]) * s->I;
                const float *src = g + (o * s->K + k) * s->I;
                for (int64_t i = i0; i < i1; i++) dst[i] += src[i];
            }
        }
}

static cm_status select_backward(cm_tape *tp, cm_node *n, const cm_tensor *gout) {
    cm_tensor *ga = cmi_grad(tp, n->in[0]);
    const cmi_backend *be = cmi_be(tp);
    const select_ctx *s = n->ctx;
    if (ga && be)
        cmi_dev_fail(tp, be->select_rows_bwd(cmi_f32(ga), cmi_f32(gout), s->idx, s->O, s->A, s->I, s->K),
                     "select backward");
    else if (ga)
        select_backward_kernel(cmi_f32(ga), cmi_f32(gout), s);
    return cmi_status(tp);
}

static cm_tensor *select_rows(cm_tape *tp, const char *op, cm_tensor *a, int64_t *idx, int64_t O, int64_t A,
                              int64_t I, int64_t K, int ndim, const int64_t *shape) {
    a = cm_contiguous(tp, a);
    if (!a) return NULL;
    cm_tensor *out = cmi_new(tp, a->dtype, ndim, shape);
    if (!out) return NULL;
    select_ctx s = {idx, O, A, I, K};
    const cmi_backend *be = cmi_be(tp);
    if (be) {
        if (cmi_dev_fail(tp, be->select_rows(out->data, a->data, idx, O, A, I, K, cm_dtype_size(a->dtype)), op))
            return NULL;
    } else {
        select_forward(out->data, a->data, &s, cm_dtype_size(a->dtype));
    }
    if (cmi_needs_grad(tp, 1, &a)) {
        cm_node *n = cmi_record(tp, op, out, 1, &a, select_backward, sizeof s);
        if (!n) return NULL;
        *(select_ctx *)n->ctx = s;
    }
    return out;
}

cm_tensor *cm_embedding(cm_tape *tp, cm_tensor *weight, cm_tensor *idx) {
    cm_tensor *ins[2] = {weight, idx};
    if (!cmi_begin(tp, "embedding", 2, ins)) return NULL;
    if (weight->ndim != 2) {
        cmi_fail(tp, CM_ERR_SHAPE, "embedding: weight %s must be 2-d (V, D)", cmi_shape(weight));
        return NULL;
    }
    if (idx->ndim + 1 > CM_MAX_DIMS) {
        cmi_fail(tp, CM_ERR_SHAPE, "embedding: idx %s has too many dims (the result adds one; max %d)", cmi_shape(idx),
                 CM_MAX_DIMS);
        return NULL;
    }
    const int64_t V = weight->shape[0], D = weight->shape[1];
    int64_t *iv = read_indices(tp, "embedding", idx, V, "the rows of weight");
    if (!iv) return NULL;
    int64_t shape[CM_MAX_DIMS];
    memcpy(shape, idx->shape, sizeof(int64_t) * (size_t)idx->ndim);
    shape[idx->ndim] = D;
    return select_rows(tp, "embedding", weight, iv, 1, V, D, cm_tensor_numel(idx), idx->ndim + 1, shape);
}

cm_tensor *cm_index_select(cm_tape *tp, cm_tensor *a, int axis, cm_tensor *idx) {
    cm_tensor *ins[2] = {a, idx};
    if (!cmi_begin(tp, "index_select", 2, ins)) return NULL;
    if (!cmi_axis(tp, "index_select", a->ndim, &axis)) return NULL;
    if (idx->ndim > 1) {
        cmi_fail(tp, CM_ERR_SHAPE, "index_select: idx %s must be 1-d", cmi_shape(idx));
        return NULL;
    }
    int64_t *iv = read_indices(tp, "index_select", idx, a->shape[axis], "the size of the selected axis");
    if (!iv) return NULL;
    const int64_t K = cm_tensor_numel(idx);
    int64_t shape[CM_MAX_DIMS];
    memcpy(shape, a->shape, sizeof shape);
    shape[axis] = K;
    return select_rows(tp, "index_select", a, iv, cmi_numel(axis, a->shape), a->shape[axis],
                       cmi_numel(a->ndim - axis - 1, a->shape + axis + 1), K, a->ndim, shape);
}

/* ------------------------------------------------------------------------------------------ */
/* Gather: out (idx's shape), out[..., j, ...] = a[..., idx[..., j, ...], ...] along axis         */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    int64_t *idx; // (idx's shape), contiguous
    int axis;
} gather_ctx;

/* Offset (elements, with `stride`) of the start of row r (all dims but the last) of a tensor with
 * the idx shape, leaving out the gathered axis. */
static int64_t row_offset(int ndim, const int64_t *shape, const int64_t *stride, int axis, int64_t r) {
    int64_t off = 0;
    for (int d = ndim - 2; d >= 0; d--) {
        const int64_t i = r % shape[d];
        r /= shape[d];
        if (d != axis) off += i * stride[d];
    }
    return off;
}

static cm_status gather_backward(cm_tape *tp, cm_node *n, const cm_tensor *gout) {
    cm_tensor *a = n->in[0];
    cm_tensor *ga = cmi_grad(tp, a);
    if (!ga) return cmi_status(tp);
    const gather_ctx *c = n->ctx;
    const cmi_backend *be = cmi_be(tp);
    if (be) {
        cmi_dev_fail(tp, be->gather_bwd(cmi_f32(ga), a->shape, cmi_f32(gout), c->idx, gout->ndim, gout->shape, c->axis),
                     "gather backward");
        return cmi_status(tp);
    }
    const int nd = gout->ndim, ax = c->axis;
    const int64_t L = gout->shape[nd - 1], R = L ? cm_tensor_numel(gout) / L : 0;
    int64_t gs[CM_MAX_DIMS];
    cmi_contig_strides(a->ndim, a->shape, gs);
    float *gav = cmi_f32(ga);
    const float *g = cmi_f32(gout);
    const bool par = R * L >= CMI_PAR_MIN;
    if (ax == nd - 1) {
        /* Rows differ in a non-gathered dim, so they write disjoint rows of ga. */
#pragma omp parallel for if (par) schedule(static)
        for (int64_t r = 0; r < R; r++) {
            float *dst = gav + row_offset(nd, gout->shape, gs, ax, r);
            for (int64_t j = 0; j < L; j++) dst[c->idx[r * L + j] * gs[ax]] += g[r * L + j];
        }
    } else {
        /* Columns j (the last dim, not gathered) write disjoint elements of ga. */
#pragma omp parallel for if (par) schedule(static)
        for (int64_t j = 0; j < L; j++)
            for (int64_t r = 0; r < R; r++)
                gav[row_offset(nd, gout->shape, gs, ax, r) + j * gs[nd - 1] + c->idx[r * L + j] * gs[ax]] +=
                    g[r * L + j];
    }
    return cmi_status(tp);
}

cm_tensor *cm_gather(cm_tape *tp, cm_tensor *a, int axis, cm_tensor *idx) {
    cm_tensor *ins[2] = {a, idx};
    if (!cmi_begin(tp, "gather", 2, ins)) return NULL;
    if (!cmi_axis(tp, "gather", a->ndim, &axis)) return NULL;
    if (idx->ndim != a->ndim) {
        cmi_fail(tp, CM_ERR_SHAPE, "gather: idx %s must have as many dims as a %s", cmi_shape(idx), cmi_shape(a));
        return NULL;
    }
    for (int d = 0; d < a->ndim; d++)
        if (d != axis && idx->shape[d] > a->shape[d]) {
            cmi_fail(tp, CM_ERR_SHAPE, "gather: idx %s is larger than a %s in dim %d (only the gathered axis %d may be)",
                     cmi_shape(idx), cmi_shape(a), d, axis);
            return NULL;
        }
    int64_t *iv = read_indices(tp, "gather", idx, a->shape[axis], "the size of the gathered axis");
    if (!iv) return NULL;
    cm_tensor *out = cmi_new(tp, a->dtype, idx->ndim, idx->shape);
    if (!out) return NULL;
    const int nd = a->ndim;
    const int64_t L = idx->shape[nd - 1], R = L ? cm_tensor_numel(idx) / L : 0;
    const size_t es = cm_dtype_size(a->dtype);
    const char *av = a->data;
    char *ov = out->data;
    const cmi_backend *be = cmi_be(tp);
    if (be && cmi_dev_fail(tp, be->gather(ov, av, a->stride, iv, nd, idx->shape, axis, es), "gather")) return NULL;
#pragma omp parallel for if (R * L >= CMI_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < (be ? 0 : R); r++) {
        const int64_t base = row_offset(nd, idx->shape, a->stride, axis, r);
        for (int64_t j = 0; j < L; j++) {
            int64_t off = base + iv[r * L + j] * a->stride[axis];
            if (axis != nd - 1) off += j * a->stride[nd - 1];
            memcpy(ov + (size_t)(r * L + j) * es, av + off * (int64_t)es, es);
        }
    }
    if (cmi_needs_grad(tp, 1, &a)) {
        cm_node *n = cmi_record(tp, "gather", out, 1, &a, gather_backward, sizeof(gather_ctx));
        if (!n) return NULL;
        gather_ctx *c = n->ctx;
        c->idx = iv;
        c->axis = axis;
    }
    return out;
}

/* ------------------------------------------------------------------------------------------ */
/* Concat and stack: out (O, T, I), input k occupies [off_k, off_k + A_k) of T                   */
/* ------------------------------------------------------------------------------------------ */

/* n->i[0] = axis of out, n->i[1] = 1 for stack (each input is one slice, A_k = 1). */
static cm_status join_backward(cm_tape *tp, cm_node *n, const cm_tensor *gout) {
    const int axis = (int)n->i[0];
    const bool stack = n->i[1];
    const int64_t O = cmi_numel(axis, gout->shape), T = gout->shape[axis],
                  I = cmi_numel(gout->ndim - axis - 1, gout->shape + axis + 1);
    const float *g = cmi_f32(gout); // (O, T, I)
    int64_t off = 0;
    for (int k = 0; k < n->n_in; k++) {
        cm_tensor *t = n->in[k];
        const int64_t A = stack ? 1 : t->shape[axis];
        cm_tensor *gt = cmi_grad(tp, t);
        if (cmi_status(tp)) return cmi_status(tp);
        const cmi_backend *be = cmi_be(tp);
        if (gt && be) { /* gt (O, A, I) += g's slice of it */
            const int64_t shape[3] = {O, A, I}, st[3] = {T * I, I, 1};
            if (cmi_dev_fail(tp, be->add_scaled(cmi_f32(gt), g + off * I, st, 1.0f, 3, shape), n->op))
                return cmi_status(tp);
        } else if (gt) {
            float *d = cmi_f32(gt); // (O, A, I)
#pragma omp parallel for if (O * A * I >= CMI_PAR_MIN) schedule(static)
            for (int64_t oa = 0; oa < O * A; oa++) {
                const float *src = g + ((oa / A) * T + off + oa % A) * I;
                float *dst = d + oa * I;
                for (int64_t i = 0; i < I; i++) dst[i] += src[i];
            }
        }
        off += A;
    }
    return cmi_status(tp);
}

static cm_tensor *join(cm_tape *tp, const char *op, cm_tensor *const *ts, int n, int axis, bool stack) {
    if (!tp) {
        cm_set_error(CM_ERR_INVALID_ARG, "%s: tape is NULL", op);
        return NULL;
    }
    if (tp->status) return NULL;
    if (n < 1 || !ts) {
        cmi_fail(tp, CM_ERR_INVALID_ARG, "%s: needs at least one input (got %d)", op, n);
        return NULL;
    }
    if (!cmi_begin(tp, op, n, ts)) return NULL;
    const cm_tensor *t0 = ts[0];
    const int nd = t0->ndim, ond = stack ? nd + 1 : nd;
    if (ond > CM_MAX_DIMS) {
        cmi_fail(tp, CM_ERR_SHAPE, "%s: the result of stacking %s would have more than %d dims", op, cmi_shape(t0),
                 CM_MAX_DIMS);
        return NULL;
    }
    if (!stack && nd == 0) {
        cmi_fail(tp, CM_ERR_SHAPE, "%s: input 0 is a scalar; concat needs at least 1-d inputs (use stack)", op);
        return NULL;
    }
    if (!cmi_axis(tp, op, ond, &axis)) return NULL;
    int64_t total = 0;
    for (int k = 0; k < n; k++) {
        const cm_tensor *t = ts[k];
        if (t->dtype != t0->dtype) {
            cmi_fail(tp, CM_ERR_DTYPE, "%s: input %d %s has dtype %s but input 0 %s has %s; cast them to one dtype", op,
                     k, cmi_shape(t), cm_dtype_name(t->dtype), cmi_shape(t0), cm_dtype_name(t0->dtype));
            return NULL;
        }
        bool ok = t->ndim == nd;
        for (int d = 0; ok && d < nd; d++)
            if (t->shape[d] != t0->shape[d] && (stack || d != axis)) ok = false;
        if (!ok) {
            if (stack)
                cmi_fail(tp, CM_ERR_SHAPE, "%s: input %d has shape %s but input 0 has %s; all shapes must be equal", op,
                         k, cmi_shape(t), cmi_shape(t0));
            else
                cmi_fail(tp, CM_ERR_SHAPE, "%s: input %d has shape %s but input 0 has %s; shapes must match except along axis %d",
                         op, k, cmi_shape(t), cmi_shape(t0), axis);
            return NULL;
        }
        total += stack ? 1 : t->shape[axis];
    }
    int64_t shape[CM_MAX_DIMS];
    for (int d = 0, s = 0; d < ond; d++) shape[d] = (stack && d == axis) ? n : t0->shape[s++];
    if (!stack) shape[axis] = total;
    cm_tensor *out = cmi_new(tp, t0->dtype, ond, shape);
    if (!out) return NULL;
    /* Copy each input into its slice of out through a strided view (handles any input strides). */
    const size_t es = cm_dtype_size(t0->dtype);
    int64_t off = 0;
    for (int k = 0; k < n; k++) {
        cm_tensor *t = ts[k];
        int64_t vstride[CM_MAX_DIMS];
        for (int d = 0, s = 0; d < ond; d++)
            if (!(stack && d == axis)) vstride[s++] = out->stride[d];
        cm_tensor *v = cmi_view(tp, t0->dtype, nd, t->shape, vstride, (char *)out->data + (size_t)(off * out->stride[axis]) * es);
        if (!v) return NULL;
        if (cmi_dev_fail(tp, cm_tensor_copy(v, t), op)) return NULL;
        off += stack ? 1 : t->shape[axis];
    }
    if (cmi_needs_grad(tp, n, ts)) {
        cm_node *nd_ = cmi_record(tp, op, out, n, ts, join_backward, 0);
        if (!nd_) return NULL;
        nd_->i[0] = axis;
        nd_->i[1] = stack;
    }
    return out;
}

cm_tensor *cm_concat(cm_tape *tp, cm_tensor *const *ts, int n, int axis) { return join(tp, "concat", ts, n, axis, false); }
cm_tensor *cm_stack(cm_tape *tp, cm_tensor *const *ts, int n, int axis) { return join(tp, "stack", ts, n, axis, true); }

/* ------------------------------------------------------------------------------------------ */
/* Split                                                                                        */
/* ------------------------------------------------------------------------------------------ */

cm_status cm_split(cm_tape *tp, cm_tensor *a, int axis, const int64_t *sizes, int n, cm_tensor **out) {
    if (out)
        for (int k = 0; k < n; k++) out[k] = NULL;
    if (!cmi_begin(tp, "split", 1, &a)) return tp ? cmi_status(tp) : CM_ERR_INVALID_ARG;
    if (n < 1 || !sizes || !out)
        return cmi_fail(tp, CM_ERR_INVALID_ARG, "split: needs n >= 1 sizes and an output array (got n = %d)", n);
    if (!cmi_axis(tp, "split", a->ndim, &axis)) return cmi_status(tp);
    int64_t sum = 0;
    for (int k = 0; k < n; k++) {
        if (sizes[k] < 0)
            return cmi_fail(tp, CM_ERR_INVALID_ARG, "split: size %d is %lld (must be >= 0)", k, (long long)sizes[k]);
        sum += sizes[k];
    }
    if (sum != a->shape[axis])
        return cmi_fail(tp, CM_ERR_SHAPE, "split: sizes sum to %lld but axis %d of %s has %lld", (long long)sum, axis,
                        cmi_shape(a), (long long)a->shape[axis]);
    int64_t start = 0;
    for (int k = 0; k < n; k++) {
        out[k] = cm_narrow(tp, a, axis, start, sizes[k]);
        if (!out[k]) {
            for (int j = 0; j < k; j++) out[j] = NULL;
            return cmi_status(tp);
        }
        start += sizes[k];
    }
    return CM_OK;
}
