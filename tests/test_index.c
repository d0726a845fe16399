/* Indexing and joining: embedding, index_select, gather, concat, stack, split — gradient checks
 * (repeated indices, non-contiguous inputs, every axis), forward values against direct loops, and
 * errors naming the offending value/input.
 *
 * Gradcheck: defaults (eps 1e-2, atol 1e-3, rtol 1e-2). These ops are linear in the float input,
 * so central differences are exact up to f32 rounding (~1e-6/eps = 1e-4). */
#include "cmtest.h"

#include <math.h>

static cm_tensor *ints(cm_tape *tp, cm_dtype dt, int ndim, const int64_t *shape, const int64_t *v) {
    cm_tensor *t = cm_empty(tp, dt, ndim, shape);
    cr_assert(t);
    for (int64_t i = 0; i < cm_tensor_numel(t); i++) {
        if (dt == CM_DTYPE_I32) ((int32_t *)cm_tensor_data(t))[i] = (int32_t)v[i];
        else ((int64_t *)cm_tensor_data(t))[i] = v[i];
    }
    return t;
}

/* ---- embedding ---- */

static cm_tensor *call_emb(cm_tape *tp, cm_tensor *const *in, void *ctx) { return cm_embedding(tp, in[0], ctx); }

Test(index, embedding_forward_and_gradcheck_with_repeated_indices) {
    cm_tape *tp = cmt_tape();
    const int64_t ws[2] = {6, 5}, is[2] = {2, 4};
    const int64_t iv[8] = {0, 5, 2, 2, 5, 5, 1, 0};
    for (int dt = 0; dt < 2; dt++) {
        cm_tensor *w = cmt_randn(tp, 2, ws, 1, true);
        cm_tensor *idx = ints(tp, dt ? CM_DTYPE_I32 : CM_DTYPE_I64, 2, is, iv);
        cm_tensor *y = cm_embedding(tp, w, idx);
        cr_assert(y, "%s", cm_tape_error(tp));
        cr_assert(cm_tensor_ndim(y) == 3 && cm_tensor_dim(y, 2) == 5 && cm_tensor_dim(y, 1) == 4);
        for (int i = 0; i < 8; i++)
            for (int d = 0; d < 5; d++)
                cr_assert_eq(cm_tensor_get_flat(y, i * 5 + d), cm_tensor_get_flat(w, iv[i] * 5 + d));
        cm_tensor *in[1] = {w};
        cmt_gradcheck("embedding", call_emb, idx, 1, in, NULL);
        /* non-contiguous weight */
        cm_tensor *wn = cmt_randn_noncontig(tp, 2, ws, 2, true);
        cm_tensor *in2[1] = {wn};
        cmt_gradcheck("embedding (non-contiguous weight)", call_emb, idx, 1, in2, NULL);
    }
    cm_tape_free(tp);
}

Test(index, embedding_backward_parallel_matches_serial_sum) {
    /* Large enough for the parallel scatter: 4096 lookups of width 64 into 50 rows. */
    cm_tape *tp = cmt_tape();
    const int64_t ws[2] = {50, 64}, is[1] = {4096};
    cm_tensor *w = cmt_randn(tp, 2, ws, 3, true);
    cm_tensor *idx = cmt_randint(tp, 1, is, 4, 0, 50);
    cm_tensor *y = cm_embedding(tp, w, idx);
    const int64_t gs[2] = {4096, 64};
    cm_tensor *g = cmt_randn(tp, 2, gs, 5, false);
    cr_assert_eq(cm_tape_backward_with(tp, y, g), CM_OK, "%s", cm_tape_error(tp));
    double *want = calloc(50 * 64, sizeof(double));
    const int64_t *iv = cm_tensor_data(idx);
    const float *gv = cm_tensor_data(g);
    for (int i = 0; i < 4096; i++)
        for (int d = 0; d < 64; d++) want[iv[i] * 64 + d] += gv[i * 64 + d];
    const float *dw = cm_tensor_data(cm_tensor_grad(w));
    for (int i = 0; i < 50 * 64; i++)
        cr_assert(fabs(dw[i] - want[i]) <= 1e-4 + 1e-5 * fabs(want[i]), "dw[%d] %g vs %g (tol 1e-4)", i, dw[i],
                  want[i]);
    free(want);
    cm_tape_free(tp);
}

/* ---- index_select ---- */

typedef struct {
    int axis;
    cm_tensor *idx;
} ax_ctx;

static cm_tensor *call_isel(cm_tape *tp, cm_tensor *const *in, void *vctx) {
    ax_ctx *c = vctx;
    return cm_index_select(tp, in[0], c->axis, c->idx);
}

Test(index, index_select_every_axis_forward_and_gradcheck) {
    cm_tape *tp = cmt_tape();
    const int64_t s[3] = {3, 4, 5}, ks[1] = {6};
    const int64_t iv[6] = {2, 0, 2, 1, 1, 2};
    for (int axis = -3; axis < 3; axis++) {
        const int a = axis < 0 ? axis + 3 : axis;
        cm_tensor *x = cmt_randn(tp, 3, s, 10 + a, true);
        cm_tensor *idx = ints(tp, CM_DTYPE_I64, 1, ks, iv);
        ax_ctx c = {axis, idx};
        cm_tensor *y = cm_index_select(tp, x, axis, idx);
        cr_assert(y, "%s", cm_tape_error(tp));
        cr_assert_eq(cm_tensor_dim(y, a), 6);
        for (int64_t i = 0; i < cm_tensor_numel(y); i++) {
            int64_t p[3], r = i;
            for (int d = 2; d >= 0; d--) {
                p[d] = r % cm_tensor_dim(y, d);
                r /= cm_tensor_dim(y, d);
            }
            p[a] = iv[p[a]];
            cr_assert_eq(cm_tensor_get_flat(y, i), cm_tensor_get(x, p), "axis %d, element %lld", axis, (long long)i);
        }
        cm_tensor *in[1] = {x};
        cmt_gradcheck("index_select", call_isel, &c, 1, in, NULL);
        cm_tensor *xn = cmt_randn_noncontig(tp, 3, s, 20 + a, true);
        cm_tensor *in2[1] = {xn};
        cmt_gradcheck("index_select (non-contiguous)", call_isel, &c, 1, in2, NULL);
    }
    cm_tape_free(tp);
}

/* ---- gather ---- */

static cm_tensor *call_gather(cm_tape *tp, cm_tensor *const *in, void *vctx) {
    ax_ctx *c = vctx;
    return cm_gather(tp, in[0], c->axis, c->idx);
}

Test(index, gather_every_axis_smaller_index_forward_and_gradcheck) {
    cm_tape *tp = cmt_tape();
    const int64_t s[3] = {3, 4, 5};
    for (int a = 0; a < 3; a++) {
        /* idx is smaller than x in the other dims and larger along the gathered axis */
        int64_t is[3] = {2, 3, 4};
        is[a] = 6;
        cm_tensor *idx = cmt_randint(tp, 3, is, 30 + a, 0, s[a]);
        cm_tensor *x = cmt_randn(tp, 3, s, 40 + a, true);
        ax_ctx c = {a, idx};
        cm_tensor *y = cm_gather(tp, x, a, idx);
        cr_assert(y, "%s", cm_tape_error(tp));
        for (int64_t i = 0; i < cm_tensor_numel(y); i++) {
            int64_t p[3], r = i;
            for (int d = 2; d >= 0; d--) {
                p[d] = r % is[d];
                r /= is[d];
            }
            p[a] = (int64_t)cm_tensor_get_flat(idx, i);
            cr_assert_eq(cm_tensor_get_flat(y, i), cm_tensor_get(x, p), "axis %d, element %lld", a, (long long)i);
        }
        cm_tensor *in[1] = {x};
        cmt_gradcheck("gather", call_gather, &c, 1, in, NULL);
        cm_tensor *xn = cmt_randn_noncontig(tp, 3, s, 50 + a, true);
        cm_tensor *in2[1] = {xn};
        cmt_gradcheck("gather (non-contiguous)", call_gather, &c, 1, in2, NULL);
    }
    cm_tape_free(tp);
}

/* ---- concat, stack, split ---- */

typedef struct {
    int axis, n;
    bool stack;
} join_ctx;

static cm_tensor *call_join(cm_tape *tp, cm_tensor *const *in, void *vctx) {
    join_ctx *c = vctx;
    return c->stack ? cm_stack(tp, in, c->n, c->axis) : cm_concat(tp, in, c->n, c->axis);
}

Test(index, concat_every_axis_forward_and_gradcheck) {
    cm_tape *tp = cmt_tape();
    for (int axis = 0; axis < 3; axis++) {
        int64_t s0[3] = {2, 3, 4}, s1[3] = {2, 3, 4}, s2[3] = {2, 3, 4};
        s1[axis] = 1;
        s2[axis] = 3;
        cm_tensor *in[3] = {cmt_randn(tp, 3, s0, 1, true), cmt_randn_noncontig(tp, 3, s1, 2, true),
                            cmt_randn(tp, 3, s2, 3, true)};
        join_ctx c = {axis - 3, 3, false}; /* negative axis */
        cm_tensor *y = call_join(tp, in, &c);
        cr_assert(y, "%s", cm_tape_error(tp));
        cr_assert_eq(cm_tensor_dim(y, axis), s0[axis] + 1 + 3);
        /* the slices of y are the inputs */
        int64_t off = 0;
        for (int k = 0; k < 3; k++) {
            cm_tensor *part = cm_narrow(tp, y, axis, off, cm_tensor_dim(in[k], axis));
            cmt_assert_close("concat slice", part, in[k], 0, 0);
            off += cm_tensor_dim(in[k], axis);
        }
        cmt_gradcheck("concat", call_join, &c, 3, in, NULL);
    }
    cm_tape_free(tp);
}

Test(index, stack_every_axis_forward_and_gradcheck) {
    cm_tape *tp = cmt_tape();
    const int64_t s[2] = {3, 4};
    for (int axis = 0; axis <= 2; axis++) {
        cm_tensor *in[2] = {cmt_randn(tp, 2, s, 5, true), cmt_randn_noncontig(tp, 2, s, 6, true)};
        join_ctx c = {axis, 2, true};
        cm_tensor *y = call_join(tp, in, &c);
        cr_assert(y, "%s", cm_tape_error(tp));
        cr_assert(cm_tensor_ndim(y) == 3 && cm_tensor_dim(y, axis) == 2);
        for (int k = 0; k < 2; k++) {
            cm_tensor *part = cm_squeeze(tp, cm_narrow(tp, y, axis, k, 1), axis);
            cmt_assert_close("stack slice", part, in[k], 0, 0);
        }
        cmt_gradcheck("stack", call_join, &c, 2, in, NULL);
    }
    cm_tape_free(tp);
}

Test(index, concat_of_integer_tensors_copies_values) {
    cm_tape *tp = cmt_tape();
    const int64_t s[1] = {3}, a[3] = {1, 2, 3}, b[3] = {4, 5, 6};
    cm_tensor *in[2] = {ints(tp, CM_DTYPE_I32, 1, s, a), ints(tp, CM_DTYPE_I32, 1, s, b)};
    cm_tensor *y = cm_concat(tp, in, 2, 0);
    cr_assert(y && cm_tensor_dtype(y) == CM_DTYPE_I32, "%s", cm_tape_error(tp));
    for (int i = 0; i < 6; i++) cr_assert_eq(cm_tensor_get_flat(y, i), i + 1);
    cm_tape_free(tp);
}

typedef struct {
    int axis;
} split_ctx;

/* Splits along axis into (1, 2, rest) and recombines with weights, so every piece gets a gradient. */
static cm_tensor *call_split(cm_tape *tp, cm_tensor *const *in, void *vctx) {
    const int axis = ((split_ctx *)vctx)->axis;
    const int64_t d = cm_tensor_dim(in[0], axis), sizes[3] = {1, 2, d - 3};
    cm_tensor *out[3];
    if (cm_split(tp, in[0], axis, sizes, 3, out) != CM_OK) return NULL;
    cm_tensor *parts[3] = {cm_mul_scalar(tp, out[2], 3.0f), out[0], cm_mul_scalar(tp, out[1], -2.0f)};
    return cm_concat(tp, parts, 3, axis);
}

Test(index, split_views_and_gradcheck) {
    cm_tape *tp = cmt_tape();
    const int64_t s[2] = {6, 5};
    for (int axis = 0; axis < 2; axis++) {
        cm_tensor *x = cmt_randn(tp, 2, s, 7 + axis, true);
        cm_tensor *out[3];
        const int64_t sizes[3] = {1, 2, s[axis] - 3};
        cr_assert_eq(cm_split(tp, x, axis, sizes, 3, out), CM_OK, "%s", cm_tape_error(tp));
        for (int k = 0; k < 3; k++) cr_assert_eq(cm_tensor_dim(out[k], axis), sizes[k]);
        cr_assert_eq(cm_tensor_data(out[0]), cm_tensor_data(x), "split returns views");
        split_ctx c = {axis};
        cm_tensor *in[1] = {x};
        cmt_gradcheck("split", call_split, &c, 1, in, NULL);
    }
    cm_tape_free(tp);
}

/* ---- errors ---- */

static void expect_error(cm_tape *tp, cm_status want, const char *must_contain) {
    cmt_expect_error(tp, NULL, want, must_contain, NULL);
    cm_tape_reset(tp);
}

Test(index, bad_indices_and_shapes_are_errors_naming_them) {
    cm_tape *tp = cmt_tape();
    const int64_t ws[2] = {4, 3}, is[2] = {2, 3}, bad[6] = {0, 1, 2, 3, 7, 1};
    cm_tensor *w = cmt_randn(tp, 2, ws, 1, false);
    cr_assert_null(cm_embedding(tp, w, ints(tp, CM_DTYPE_I64, 2, is, bad)));
    expect_error(tp, CM_ERR_INVALID_ARG, "embedding: index 7 at position [1, 1] of idx (2, 3) is outside [0, 4)");
    const int64_t neg[6] = {0, -1, 0, 0, 0, 0};
    w = cmt_randn(tp, 2, ws, 1, false);
    cr_assert_null(cm_embedding(tp, w, ints(tp, CM_DTYPE_I32, 2, is, neg)));
    expect_error(tp, CM_ERR_INVALID_ARG, "index -1 at position [0, 1]");
    w = cmt_randn(tp, 2, ws, 1, false);
    cr_assert_null(cm_embedding(tp, w, cmt_randn(tp, 2, is, 1, false)));
    expect_error(tp, CM_ERR_DTYPE, "embedding");
    const int64_t k1[1] = {2}, iv[2] = {0, 3};
    w = cmt_randn(tp, 2, ws, 1, false);
    cr_assert_null(cm_index_select(tp, w, 1, ints(tp, CM_DTYPE_I64, 1, k1, iv)));
    expect_error(tp, CM_ERR_INVALID_ARG, "index_select: index 3 at position [1]");
    w = cmt_randn(tp, 2, ws, 1, false);
    cr_assert_null(cm_index_select(tp, w, 2, ints(tp, CM_DTYPE_I64, 1, k1, iv)));
    expect_error(tp, CM_ERR_INVALID_ARG, "axis 2 is out of range");
    w = cmt_randn(tp, 2, ws, 1, false);
    cr_assert_null(cm_gather(tp, w, 0, ints(tp, CM_DTYPE_I64, 1, k1, iv)));
    expect_error(tp, CM_ERR_SHAPE, "gather: idx (2,) must have as many dims");
    const int64_t gs[2] = {4, 5};
    w = cmt_randn(tp, 2, ws, 1, false);
    cr_assert_null(cm_gather(tp, w, 0, cmt_randint(tp, 2, gs, 1, 0, 2)));
    expect_error(tp, CM_ERR_SHAPE, "larger than a (4, 3) in dim 1");
    w = cmt_randn(tp, 2, ws, 1, false);
    cr_assert_null(cm_gather(tp, w, 1, cmt_randint(tp, 2, ws, 1, 3, 5)));
    expect_error(tp, CM_ERR_INVALID_ARG, "gather: index");
    const int64_t o1[2] = {4, 2}, o2[2] = {3, 3};
    cm_tensor *cin[3] = {cmt_randn(tp, 2, ws, 1, false), cmt_randn(tp, 2, o1, 2, false), cmt_randn(tp, 2, o2, 3, false)};
    cr_assert_null(cm_concat(tp, cin, 3, 1));
    expect_error(tp, CM_ERR_SHAPE, "concat: input 2 has shape (3, 3) but input 0 has (4, 3)");
    cm_tensor *sin[2] = {cmt_randn(tp, 2, ws, 1, false), cmt_randn(tp, 2, o1, 2, false)};
    cr_assert_null(cm_stack(tp, sin, 2, 0));
    expect_error(tp, CM_ERR_SHAPE, "stack: input 1 has shape (4, 2)");
    cm_tensor *din[2] = {cmt_randn(tp, 2, ws, 1, false), cm_zeros(tp, CM_DTYPE_I64, 2, ws)};
    cr_assert_null(cm_concat(tp, din, 2, 0));
    expect_error(tp, CM_ERR_DTYPE, "input 1 (4, 3) has dtype i64");
    cr_assert_null(cm_concat(tp, din, 0, 0));
    expect_error(tp, CM_ERR_INVALID_ARG, "at least one input");
    cm_tensor *out[2];
    const int64_t sz[2] = {1, 2};
    w = cmt_randn(tp, 2, ws, 1, false);
    cr_assert_eq(cm_split(tp, w, 0, sz, 2, out), CM_ERR_SHAPE);
    cr_assert_null(out[0]);
    expect_error(tp, CM_ERR_SHAPE, "split: sizes sum to 3 but axis 0 of (4, 3) has 4");
    cm_tape_free(tp);
}
