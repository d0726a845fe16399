/* cm_conv2d: forward against a direct (naive, double) convolution, gradient checks over strides,
 * padding, dilation, groups, depthwise, 1x1, channels-last and non-contiguous inputs, and the
 * error messages for bad shapes and parameters.
 *
 * Tolerances: conv is linear in each input, so central differences with eps 1e-2 are exact up to
 * f32 rounding of the forward sums (~1e-6 relative); atol 2e-3 + rtol 1e-2 leaves room for that
 * divided by 2·eps. Forward vs the double reference: 1e-4 abs + 1e-4 rel (f32 GEMM sums of <= 150
 * products of N(0,1) values). */
#include "cmtest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    int64_t n, cin, h, w, cout, kh, kw;
    int sh, sw, ph, pw, dh, dw, groups;
    bool cl, bias, noncontig;
} cfg;

static cm_conv2d_opts opts_of(const cfg *c) {
    cm_conv2d_opts o = cm_conv2d_opts_default();
    o.stride[0] = c->sh, o.stride[1] = c->sw;
    o.padding[0] = c->ph, o.padding[1] = c->pw;
    o.dilation[0] = c->dh, o.dilation[1] = c->dw;
    o.groups = c->groups;
    o.channels_last = c->cl;
    return o;
}

static cm_tensor *call_conv(cm_tape *tp, cm_tensor *const *in, void *ctx) {
    cm_conv2d_opts o = opts_of(ctx);
    return cm_conv2d(tp, in[0], in[1], in[2], &o);
}

static const cfg k_cfgs[] = {
    /* n  cin h  w  cout kh kw  sh sw ph pw dh dw  g   cl     bias   noncontig */
    {2, 3, 5, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, false, true, false},  /* same padding, par images */
    {1, 3, 7, 6, 2, 3, 2, 2, 2, 1, 0, 1, 1, 1, false, true, false},  /* stride 2, asymmetric pad/kernel */
    {2, 2, 7, 7, 3, 3, 3, 1, 1, 2, 2, 2, 2, 1, false, false, false}, /* dilation 2 */
    {3, 4, 5, 5, 6, 3, 3, 1, 2, 1, 1, 1, 1, 2, false, true, false},  /* groups 2, stride (1, 2) */
    {2, 4, 6, 5, 4, 3, 3, 2, 1, 1, 1, 1, 1, 4, false, true, false},  /* depthwise */
    {2, 4, 4, 5, 3, 1, 1, 1, 1, 0, 0, 1, 1, 1, false, true, false},  /* 1x1 pointwise (no im2col) */
    {1, 4, 3, 5, 4, 1, 1, 1, 1, 0, 0, 1, 1, 2, false, false, false}, /* 1x1, groups, one image */
    {2, 3, 5, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, true, true, false},   /* channels-last */
    {1, 4, 7, 6, 4, 3, 2, 2, 1, 1, 1, 2, 1, 2, true, true, false},   /* channels-last, groups, dilation */
    {2, 4, 5, 5, 4, 3, 3, 1, 1, 1, 1, 1, 1, 4, true, false, false},  /* channels-last depthwise */
    {2, 4, 4, 3, 6, 1, 1, 1, 1, 0, 0, 1, 1, 2, true, true, false},   /* channels-last pointwise */
    {2, 3, 6, 5, 2, 3, 3, 2, 2, 1, 1, 1, 1, 1, false, true, true},   /* non-contiguous x and weight */
    {1, 2, 5, 4, 4, 2, 3, 1, 1, 0, 1, 1, 1, 2, true, false, true},   /* non-contiguous, channels-last */
    {1, 1, 3, 3, 1, 3, 3, 1, 1, 0, 0, 1, 1, 1, false, true, false},  /* kernel covers input: 1x1 out */
};

static void make_inputs(cm_tape *tp, const cfg *c, uint64_t seed, bool grad, cm_tensor **x, cm_tensor **w,
                        cm_tensor **b) {
    int64_t xs[4] = {c->n, c->cin, c->h, c->w};
    if (c->cl) xs[1] = c->h, xs[2] = c->w, xs[3] = c->cin;
    int64_t ws[4] = {c->cout, c->cin / c->groups, c->kh, c->kw}, bs[1] = {c->cout};
    *x = c->noncontig ? cmt_randn_noncontig(tp, 4, xs, seed, grad) : cmt_randn(tp, 4, xs, seed, grad);
    *w = c->noncontig ? cmt_randn_noncontig(tp, 4, ws, seed + 1, grad) : cmt_randn(tp, 4, ws, seed + 1, grad);
    *b = c->bias ? cmt_randn(tp, 1, bs, seed + 2, grad) : NULL;
}

/* Direct convolution in double, result in the config's layout. */
static double *ref_conv(const cfg *c, const cm_tensor *x, const cm_tensor *w, const cm_tensor *b, int64_t *oh_out,
                        int64_t *ow_out) {
    const int64_t OH = (c->h + 2 * c->ph - c->dh * (c->kh - 1) - 1) / c->sh + 1;
    const int64_t OW = (c->w + 2 * c->pw - c->dw * (c->kw - 1) - 1) / c->sw + 1;
    const int64_t Cg = c->cin / c->groups, Og = c->cout / c->groups;
    double *y = calloc((size_t)(c->n * c->cout * OH * OW), sizeof(double));
    for (int64_t n = 0; n < c->n; n++)
        for (int64_t o = 0; o < c->cout; o++)
            for (int64_t i = 0; i < OH; i++)
                for (int64_t j = 0; j < OW; j++) {
                    double s = b ? cm_tensor_get_flat(b, o) : 0.0;
                    const int64_t g = o / Og;
                    for (int64_t ci = 0; ci < Cg; ci++)
                        for (int64_t ki = 0; ki < c->kh; ki++)
                            for (int64_t kj = 0; kj < c->kw; kj++) {
                                int64_t ih = i * c->sh - c->ph + ki * c->dh, iw = j * c->sw - c->pw + kj * c->dw;
                                if (ih < 0 || ih >= c->h || iw < 0 || iw >= c->w) continue;
                                int64_t xi[4] = {n, g * Cg + ci, ih, iw};
                                if (c->cl) xi[1] = ih, xi[2] = iw, xi[3] = g * Cg + ci;
                                int64_t wi[4] = {o, ci, ki, kj};
                                s += cm_tensor_get(x, xi) * cm_tensor_get(w, wi);
                            }
                    int64_t at = c->cl ? ((n * OH + i) * OW + j) * c->cout + o : ((n * c->cout + o) * OH + i) * OW + j;
                    y[at] = s;
                }
    *oh_out = OH;
    *ow_out = OW;
    return y;
}

Test(conv, forward_matches_direct_convolution) {
    for (size_t k = 0; k < sizeof k_cfgs / sizeof k_cfgs[0]; k++) {
        const cfg *c = &k_cfgs[k];
        cm_tape *tp = cmt_tape();
        cm_tensor *x, *w, *b;
        make_inputs(tp, c, 100 + k, false, &x, &w, &b);
        cm_conv2d_opts o = opts_of(c);
        cm_tensor *y = cm_conv2d(tp, x, w, b, &o);
        cr_assert(y, "config %zu: %s", k, cm_tape_error(tp));
        int64_t OH, OW;
        double *want = ref_conv(c, x, w, b, &OH, &OW);
        const int64_t *ys = cm_tensor_shape(y);
        if (c->cl) cr_assert(ys[0] == c->n && ys[1] == OH && ys[2] == OW && ys[3] == c->cout, "config %zu", k);
        else cr_assert(ys[0] == c->n && ys[1] == c->cout && ys[2] == OH && ys[3] == OW, "config %zu", k);
        const float *yv = cm_tensor_data(y);
        for (int64_t i = 0; i < cm_tensor_numel(y); i++)
            cr_assert(fabs(yv[i] - want[i]) <= 1e-4 + 1e-4 * fabs(want[i]), "config %zu [%lld]: %.7g vs %.7g", k,
                      (long long)i, (double)yv[i], want[i]);
        free(want);
        cm_tape_free(tp);
    }
}

Test(conv, gradcheck_all_configs) {
    cmt_gradcheck_opts go = cmt_gradcheck_defaults();
    go.atol = 2e-3;
    for (size_t k = 0; k < sizeof k_cfgs / sizeof k_cfgs[0]; k++) {
        const cfg *c = &k_cfgs[k];
        cm_tape *tp = cmt_tape();
        cm_tensor *in[3];
        make_inputs(tp, c, 200 + k, true, &in[0], &in[1], &in[2]);
        char name[64];
        snprintf(name, sizeof name, "conv2d config %zu", k);
        cmt_gradcheck(name, call_conv, (void *)c, 3, in, &go);
        cm_tape_free(tp);
    }
}

Test(conv, gradcheck_only_weight_or_only_input) {
    /* backward must work when only some inputs want a gradient (no dx / no dW buffers) */
    cmt_gradcheck_opts go = cmt_gradcheck_defaults();
    go.atol = 2e-3;
    const cfg *cs[2] = {&k_cfgs[1], &k_cfgs[8]};
    for (int k = 0; k < 2; k++)
        for (int which = 0; which < 2; which++) {
            cm_tape *tp = cmt_tape();
            cm_tensor *in[3];
            make_inputs(tp, cs[k], 300 + k, false, &in[0], &in[1], &in[2]);
            cm_tensor_set_requires_grad(in[which], true);
            cmt_gradcheck("conv2d partial grads", call_conv, (void *)cs[k], 3, in, &go);
            cm_tape_free(tp);
        }
}

Test(conv, channels_last_equals_permuted_nchw) {
    cm_tape *tp = cmt_tape();
    cfg c = k_cfgs[3];
    cm_tensor *x, *w, *b;
    make_inputs(tp, &c, 7, false, &x, &w, &b);
    cm_conv2d_opts o = opts_of(&c);
    cm_tensor *y = cm_conv2d(tp, x, w, b, &o);
    const int to_cl[4] = {0, 2, 3, 1};
    o.channels_last = true;
    cm_tensor *ycl = cm_conv2d(tp, cm_permute(tp, x, to_cl), w, b, &o);
    cr_assert(y && ycl, "%s", cm_tape_error(tp));
    cmt_assert_close("channels_last", cm_permute(tp, ycl, (const int[4]){0, 3, 1, 2}), y, 1e-5, 1e-5);
    cm_tape_free(tp);
}

static void expect_error(cm_tape *tp, cm_tensor *y, cm_status st, const char *s1, const char *s2) {
    cmt_expect_error(tp, y, st, "conv2d", s1, s2, NULL);
}

Test(conv, errors_name_shapes_and_parameters) {
    int64_t xs[4] = {1, 4, 5, 5}, ws[4] = {6, 4, 3, 3}, wbad[4] = {6, 3, 3, 3}, bs[1] = {5}, w3[3] = {6, 4, 3};
    cm_conv2d_opts o = cm_conv2d_opts_default();
    cm_tape *tp;

    tp = cmt_tape(); /* empty output: dilated kernel larger than the input */
    o.dilation[0] = o.dilation[1] = 3;
    expect_error(tp, cm_conv2d(tp, cmt_randn(tp, 4, xs, 1, false), cmt_randn(tp, 4, ws, 2, false), NULL, &o),
                 CM_ERR_SHAPE, "(1, 4, 5, 5)", "dilation (3, 3)");
    cm_tape_free(tp);
    o = cm_conv2d_opts_default();

    tp = cmt_tape(); /* Cin not divisible by groups */
    o.groups = 3;
    expect_error(tp, cm_conv2d(tp, cmt_randn(tp, 4, xs, 1, false), cmt_randn(tp, 4, ws, 2, false), NULL, &o),
                 CM_ERR_SHAPE, "groups 3", "(1, 4, 5, 5)");
    cm_tape_free(tp);
    o = cm_conv2d_opts_default();

    tp = cmt_tape(); /* weight's Cin/groups mismatch */
    expect_error(tp, cm_conv2d(tp, cmt_randn(tp, 4, xs, 1, false), cmt_randn(tp, 4, wbad, 2, false), NULL, &o),
                 CM_ERR_SHAPE, "(6, 3, 3, 3)", "Cin/groups = 4");
    cm_tape_free(tp);

    tp = cmt_tape(); /* bias size */
    expect_error(tp,
                 cm_conv2d(tp, cmt_randn(tp, 4, xs, 1, false), cmt_randn(tp, 4, ws, 2, false),
                           cmt_randn(tp, 1, bs, 3, false), &o),
                 CM_ERR_SHAPE, "(5,)", "(6, 4, 3, 3)");
    cm_tape_free(tp);

    tp = cmt_tape(); /* 3-d weight */
    expect_error(tp, cm_conv2d(tp, cmt_randn(tp, 4, xs, 1, false), cmt_randn(tp, 3, w3, 2, false), NULL, &o),
                 CM_ERR_SHAPE, "(6, 4, 3)", NULL);
    cm_tape_free(tp);

    tp = cmt_tape(); /* 3-d x */
    expect_error(tp, cm_conv2d(tp, cmt_randn(tp, 3, xs + 1, 1, false), cmt_randn(tp, 4, ws, 2, false), NULL, &o),
                 CM_ERR_SHAPE, "(4, 5, 5)", NULL);
    cm_tape_free(tp);

    tp = cmt_tape(); /* bad stride */
    o.stride[1] = 0;
    expect_error(tp, cm_conv2d(tp, cmt_randn(tp, 4, xs, 1, false), cmt_randn(tp, 4, ws, 2, false), NULL, &o),
                 CM_ERR_INVALID_ARG, "stride (1, 0)", NULL);
    cm_tape_free(tp);
    o = cm_conv2d_opts_default();

    tp = cmt_tape(); /* dtype */
    expect_error(tp, cm_conv2d(tp, cm_zeros(tp, CM_DTYPE_I64, 4, xs), cmt_randn(tp, 4, ws, 2, false), NULL, &o),
                 CM_ERR_DTYPE, "i64", NULL);
    cm_tape_free(tp);

    tp = cmt_tape(); /* NULL input */
    expect_error(tp, cm_conv2d(tp, NULL, cmt_randn(tp, 4, ws, 2, false), NULL, &o), CM_ERR_INVALID_ARG, "NULL", NULL);
    cm_tape_free(tp);
}
