/* Max / average / adaptive average pooling and bilinear resize: gradient checks over strides,
 * padding, ceil_mode, count_include_pad, odd sizes, channels-last and non-contiguous inputs;
 * hand-computed values for the PyTorch window rules; errors.
 *
 * Tolerances: all four ops are piecewise linear in x, so central differences (eps 1e-2) are exact
 * up to f32 rounding: atol 1e-3, rtol 1e-2 (the defaults). Max pool inputs are distinct values
 * at least 0.05 apart, so a ±eps step never changes a window's argmax. */
#include "cmtest.h"

#include <math.h>
#include <stdio.h>

/* A (possibly non-contiguous) tensor whose elements are a shuffled 0.05·k, k = 0..numel-1. */
static cm_tensor *distinct(cm_tape *tp, int nd, const int64_t *shape, uint64_t seed, bool noncontig) {
    cm_tensor *t = noncontig ? cmt_randn_noncontig(tp, nd, shape, seed, false) : cmt_randn(tp, nd, shape, seed, false);
    int64_t n = cm_tensor_numel(t);
    int64_t *perm = malloc(sizeof(int64_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    cm_rng r = cm_rng_init(seed, 3);
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j;
        cm_rng_randint(&r, &j, 1, 0, i + 1);
        int64_t s = perm[i];
        perm[i] = perm[j];
        perm[j] = s;
    }
    int64_t idx[4];
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = i;
        for (int d = nd - 1; d >= 0; d--) idx[d] = rem % shape[d], rem /= shape[d];
        cm_tensor_set(t, idx, 0.05 * (double)perm[i] - 0.025 * (double)n);
    }
    free(perm);
    cm_tensor_set_requires_grad(t, true);
    return t;
}

typedef struct {
    int kind; /* 0 max, 1 avg, 2 adaptive, 3 bilinear */
    cm_pool2d_opts o;
    int64_t oh, ow;
    bool align;
} pcase;

static cm_tensor *call_pool(cm_tape *tp, cm_tensor *const *in, void *ctx) {
    const pcase *c = ctx;
    switch (c->kind) {
    case 0: return cm_max_pool2d(tp, in[0], &c->o);
    case 1: return cm_avg_pool2d(tp, in[0], &c->o);
    case 2: return cm_adaptive_avg_pool2d(tp, in[0], c->oh, c->ow, c->o.channels_last);
    default: return cm_resize_bilinear(tp, in[0], c->oh, c->ow, c->align, c->o.channels_last);
    }
}

static pcase pool_case(int kind, int kh, int kw, int sh, int sw, int ph, int pw, bool ceil, bool incl, bool cl) {
    pcase c = {0};
    c.kind = kind;
    c.o = cm_pool2d_opts_default(kh, kw);
    c.o.stride[0] = sh, c.o.stride[1] = sw, c.o.padding[0] = ph, c.o.padding[1] = pw;
    c.o.ceil_mode = ceil, c.o.count_include_pad = incl, c.o.channels_last = cl;
    return c;
}

/* x of logical (N, C, H, W) in the case's layout. */
static cm_tensor *pool_input(cm_tape *tp, const pcase *c, int64_t n, int64_t ch, int64_t h, int64_t w, uint64_t seed,
                             bool noncontig) {
    int64_t s[4] = {n, ch, h, w};
    if (c->o.channels_last) s[1] = h, s[2] = w, s[3] = ch;
    if (c->kind == 0) return distinct(tp, 4, s, seed, noncontig);
    return noncontig ? cmt_randn_noncontig(tp, 4, s, seed, true) : cmt_randn(tp, 4, s, seed, true);
}

static void check_cases(const char *what, const pcase *cs, size_t ncs) {
    const int64_t sizes[][4] = {{2, 3, 7, 6}, {1, 2, 5, 5}, {2, 2, 8, 9}};
    for (size_t k = 0; k < ncs; k++)
        for (int s = 0; s < 3; s++)
            for (int nc = 0; nc < 2; nc++) {
                cm_tape *tp = cmt_tape();
                cm_tensor *x = pool_input(tp, &cs[k], sizes[s][0], sizes[s][1], sizes[s][2], sizes[s][3],
                                          10 * k + s, nc);
                char name[96];
                snprintf(name, sizeof name, "%s case %zu size %d%s", what, k, s, nc ? " non-contiguous" : "");
                cmt_gradcheck(name, call_pool, (void *)&cs[k], 1, &x, NULL);
                cm_tape_free(tp);
            }
}

Test(pool, max_pool_gradcheck) {
    const pcase cs[] = {
        pool_case(0, 2, 2, 0, 0, 0, 0, false, true, false), pool_case(0, 3, 3, 2, 2, 1, 1, false, true, false),
        pool_case(0, 3, 2, 2, 1, 1, 1, true, true, false),  pool_case(0, 2, 3, 2, 2, 1, 0, true, true, true),
        pool_case(0, 3, 3, 1, 1, 1, 1, false, true, true),
    };
    check_cases("max_pool2d", cs, sizeof cs / sizeof cs[0]);
}

Test(pool, avg_pool_gradcheck) {
    const pcase cs[] = {
        pool_case(1, 2, 2, 0, 0, 0, 0, false, true, false), pool_case(1, 3, 3, 2, 2, 1, 1, false, true, false),
        pool_case(1, 3, 3, 2, 2, 1, 1, false, false, false), pool_case(1, 2, 3, 2, 2, 1, 1, true, true, false),
        pool_case(1, 2, 3, 2, 2, 1, 1, true, false, true),   pool_case(1, 3, 2, 2, 1, 1, 0, true, true, true),
    };
    check_cases("avg_pool2d", cs, sizeof cs / sizeof cs[0]);
}

Test(pool, adaptive_and_bilinear_gradcheck) {
    pcase cs[8] = {0};
    const int64_t outs[4][2] = {{3, 2}, {1, 1}, {10, 11}, {4, 4}};
    for (int i = 0; i < 4; i++) {
        cs[i].kind = 2;
        cs[i].oh = outs[i][0], cs[i].ow = outs[i][1];
        cs[i].o.channels_last = i == 3;
        cs[4 + i].kind = 3;
        cs[4 + i].oh = outs[i][0] + 1, cs[4 + i].ow = outs[i][1];
        cs[4 + i].align = i % 2;
        cs[4 + i].o.channels_last = i >= 2;
    }
    cs[5].oh = 1; /* align_corners with a single output row: scale 0 */
    check_cases("adaptive/bilinear", cs, 8);
}

Test(pool, channels_last_equals_permuted_nchw) {
    pcase cs[4] = {pool_case(0, 3, 3, 2, 2, 1, 1, true, true, false),
                   pool_case(1, 3, 2, 2, 2, 1, 1, true, false, false), {0}, {0}};
    cs[2].kind = 2, cs[2].oh = 3, cs[2].ow = 4;
    cs[3].kind = 3, cs[3].oh = 9, cs[3].ow = 4, cs[3].align = false;
    const int to_cl[4] = {0, 2, 3, 1}, to_nchw[4] = {0, 3, 1, 2};
    int64_t s[4] = {2, 3, 7, 8};
    for (int k = 0; k < 4; k++) {
        cm_tape *tp = cmt_tape();
        cm_tensor *x = cmt_randn(tp, 4, s, 5, false);
        cm_tensor *y = call_pool(tp, &x, &cs[k]);
        pcase cl = cs[k];
        cl.o.channels_last = true;
        cm_tensor *xc = cm_contiguous(tp, cm_permute(tp, x, to_cl));
        cm_tensor *ycl = call_pool(tp, &xc, &cl);
        cr_assert(y && ycl, "%s", cm_tape_error(tp));
        cmt_assert_close("channels_last", cm_permute(tp, ycl, to_nchw), y, 0, 0);
        cm_tape_free(tp);
    }
}

Test(pool, windows_follow_pytorch_rules) {
    cm_tape *tp = cmt_tape();
    int64_t s[4] = {1, 1, 1, 5};
    cm_tensor *x = cm_arange(tp, CM_DTYPE_F32, 1, 6, 1);
    x = cm_reshape(tp, x, 4, s); /* [1 2 3 4 5] */
    /* ceil_mode, k 2, s 2, pad 1: windows start at -1, 1, 3; a 4th would start at 5 = W + pad, in
     * the right padding only, so PyTorch drops it. */
    cm_pool2d_opts o = cm_pool2d_opts_default(1, 2);
    o.stride[1] = 2, o.padding[1] = 0, o.ceil_mode = true;
    o.padding[0] = 0;
    cm_pool2d_opts op = o;
    op.kernel[0] = 1;
    op.padding[1] = 1;
    cm_tensor *a = cm_avg_pool2d(tp, x, &op); /* count_include_pad: [(0+1)/2, (2+3)/2, (4+5)/2] */
    cr_assert(a, "%s", cm_tape_error(tp));
    cr_assert_eq(cm_tensor_shape(a)[3], 3);
    const float wa[3] = {0.5f, 2.5f, 4.5f};
    cmt_assert_close_f32("avg ceil pad", cm_tensor_data(a), wa, 3, 1e-6, 0);
    op.count_include_pad = false;
    a = cm_avg_pool2d(tp, x, &op); /* [1, 2.5, 4.5] */
    const float wb[3] = {1.0f, 2.5f, 4.5f};
    cmt_assert_close_f32("avg ceil pad excl", cm_tensor_data(a), wb, 3, 1e-6, 0);
    /* ceil_mode without padding: last window [5] alone; include_pad divides by the window clipped
     * to the padded input (1), so 5. */
    o.count_include_pad = true;
    a = cm_avg_pool2d(tp, x, &o);
    const float wc[3] = {1.5f, 3.5f, 5.0f};
    cr_assert_eq(cm_tensor_shape(a)[3], 3);
    cmt_assert_close_f32("avg ceil", cm_tensor_data(a), wc, 3, 1e-6, 0);
    cm_tensor *m = cm_max_pool2d(tp, x, &op); /* padding is -inf: [1, 3, 5] */
    const float wm[3] = {1.0f, 3.0f, 5.0f};
    cmt_assert_close_f32("max ceil pad", cm_tensor_data(m), wm, 3, 0, 0);
    /* adaptive 5 -> 3: windows [0,2) [1,4) [3,5) */
    cm_tensor *ad = cm_adaptive_avg_pool2d(tp, x, 1, 3, false);
    const float wd[3] = {1.5f, 3.0f, 4.5f};
    cmt_assert_close_f32("adaptive", cm_tensor_data(ad), wd, 3, 1e-6, 0);
    /* bilinear 5 -> 3, align_corners: samples at 0, 2, 4; not aligned: src = 5/3·(i+0.5)-0.5 */
    cm_tensor *r = cm_resize_bilinear(tp, x, 1, 3, true, false);
    const float wr[3] = {1.0f, 3.0f, 5.0f};
    cmt_assert_close_f32("bilinear align", cm_tensor_data(r), wr, 3, 1e-6, 0);
    r = cm_resize_bilinear(tp, x, 1, 3, false, false);
    const float wr2[3] = {1.0f + 1.0f / 3.0f, 3.0f, 4.0f + 2.0f / 3.0f};
    cmt_assert_close_f32("bilinear", cm_tensor_data(r), wr2, 3, 1e-5, 0);
    cr_assert(!cm_tape_status(tp), "%s", cm_tape_error(tp));
    cm_tape_free(tp);
}

Test(pool, max_pool_ties_send_gradient_to_first_max) {
    cm_tape *tp = cmt_tape();
    int64_t s[4] = {1, 1, 2, 2};
    cm_tensor *x = cm_full(tp, CM_DTYPE_F32, 4, s, 3.0);
    cm_tensor_set_requires_grad(x, true);
    cm_pool2d_opts o = cm_pool2d_opts_default(2, 2);
    cm_tensor *y = cm_max_pool2d(tp, x, &o);
    cr_assert_eq(cm_tape_backward(tp, y), CM_OK, "%s", cm_tape_error(tp));
    const float want[4] = {1, 0, 0, 0};
    cmt_assert_close_f32("tie grad", cm_tensor_data(cm_tensor_grad(x)), want, 4, 0, 0);
    cm_tape_free(tp);
}

static void expect_error(cm_tape *tp, cm_tensor *y, cm_status st, const char *op, const char *s1) {
    cmt_expect_error(tp, y, st, op, s1, NULL);
    cm_tape_free(tp);
}

Test(pool, errors) {
    int64_t s[4] = {1, 2, 4, 4};
    cm_tape *tp;
    cm_pool2d_opts o = cm_pool2d_opts_default(2, 2);
    o.padding[0] = 2;
    tp = cmt_tape();
    expect_error(tp, cm_max_pool2d(tp, cmt_randn(tp, 4, s, 1, false), &o), CM_ERR_INVALID_ARG, "max_pool2d",
                 "at most half");
    o = cm_pool2d_opts_default(5, 5);
    tp = cmt_tape();
    expect_error(tp, cm_avg_pool2d(tp, cmt_randn(tp, 4, s, 1, false), &o), CM_ERR_SHAPE, "avg_pool2d",
                 "(1, 2, 4, 4)");
    o = cm_pool2d_opts_default(0, 2);
    tp = cmt_tape();
    expect_error(tp, cm_avg_pool2d(tp, cmt_randn(tp, 4, s, 1, false), &o), CM_ERR_INVALID_ARG, "avg_pool2d",
                 "kernel (0, 2)");
    tp = cmt_tape();
    expect_error(tp, cm_max_pool2d(tp, cmt_randn(tp, 4, s, 1, false), NULL), CM_ERR_INVALID_ARG, "max_pool2d",
                 "opts");
    o = cm_pool2d_opts_default(2, 2);
    tp = cmt_tape();
    expect_error(tp, cm_max_pool2d(tp, cmt_randn(tp, 3, s, 1, false), &o), CM_ERR_SHAPE, "max_pool2d", "(1, 2, 4)");
    tp = cmt_tape();
    expect_error(tp, cm_adaptive_avg_pool2d(tp, cmt_randn(tp, 4, s, 1, false), 0, 2, false), CM_ERR_SHAPE,
                 "adaptive_avg_pool2d", "(0, 2)");
    tp = cmt_tape();
    expect_error(tp, cm_resize_bilinear(tp, cmt_randn(tp, 4, s, 1, false), 3, -1, false, false), CM_ERR_SHAPE,
                 "resize_bilinear", "(3, -1)");
    tp = cmt_tape();
    expect_error(tp, cm_resize_bilinear(tp, cm_zeros(tp, CM_DTYPE_I32, 4, s), 3, 3, false, false), CM_ERR_DTYPE,
                 "resize_bilinear", "i32");
}
