/* cm_conv2d: forward against a direct (naive, double) convolution, gradient checks over strides,
 * padding, dilation, groups, depthwise, 1x1, channels-last and non-contiguous inputs — on both
 * kernels (oneDNN and im2col, src/tensor/dnnl_conv.h), with counters proving which one ran —
 * oneDNN against im2col, bf16 (autocast and explicit) against f32 on bf16-rounded values on both
 * bf16 kernels, and the error messages for bad shapes, dtypes and parameters.
 *
 * Tolerances: conv is linear in each input, so central differences with eps 1e-2 are exact up to
 * f32 rounding of the forward sums (~1e-6 relative); atol 2e-3 + rtol 1e-2 leaves room for that
 * divided by 2·eps. Forward vs the double reference: 1e-4 abs + 1e-4 rel (f32 GEMM sums of <= 150
 * products of N(0,1) values). */
#include "cmtest.h"
#include "tensor/conv_bf16.h"
#include "tensor/dnnl_conv.h"
#include "tensor/dnnl_gemm.h"

#include <composer/zoo_vision.h>

#include <math.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Whether pass p (CMI_CONV_FWD, ...) of c's bf16 convolution runs on our own kernels
 * (conv_bf16.h) rather than oneDNN's: 3x3 stride-1 pad-1 channels-last, on a CPU with
 * AVX512-BF16, the pass switched on; forward and backward-weights also need no bias, forward x
 * stored in bf16 (x_bf16). */
static bool own_pass(const cfg *c, int p, bool x_bf16) {
    const int64_t oh = (c->h + 2 * c->ph - c->dh * (c->kh - 1) - 1) / c->sh + 1;
    const int64_t ow = (c->w + 2 * c->pw - c->dw * (c->kw - 1) - 1) / c->sw + 1;
    const cmi_conv_geom g = {c->n,  c->cin, c->h,  c->w,  c->cout, oh,    ow,        c->kh, c->kw,
                             c->sh, c->sw,  c->ph, c->pw, c->dh,   c->dw, c->groups, c->cl};
    if ((c->bias && p != CMI_CONV_BWD_DATA) || !(cmi_conv_get_own_passes() >> p & 1)) return false;
    if (p == CMI_CONV_FWD) return x_bf16 && cmi_conv_direct_bf16_fits(&g);
    if (p == CMI_CONV_BWD_WEIGHTS) return cmi_conv_wgrad_bf16_fits(&g);
    return cmi_conv_direct_bf16_fits(&g);
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
    {2, 2, 6, 6, 8, 1, 1, 1, 1, 0, 0, 1, 1, 1, true, false, false},  /* channels-last pointwise, groups 1 */
    {2, 4, 6, 6, 8, 1, 1, 2, 2, 0, 0, 1, 1, 1, true, false, false},  /* channels-last 1x1 stride 2 */
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

static void gradcheck_all_configs(cmi_conv_kernel kernel) {
    cmi_conv_set_kernel(kernel);
    cmt_gradcheck_opts go = cmt_gradcheck_defaults();
    go.atol = 2e-3;
    for (size_t k = 0; k < sizeof k_cfgs / sizeof k_cfgs[0]; k++) {
        const cfg *c = &k_cfgs[k];
        cm_tape *tp = cmt_tape();
        cm_tensor *in[3];
        make_inputs(tp, c, 200 + k, true, &in[0], &in[1], &in[2]);
        char name[64];
        snprintf(name, sizeof name, "conv2d config %zu (%s)", k, kernel == CMI_CONV_DNNL ? "dnnl" : "im2col");
        cmi_conv_stats_reset();
        cmt_gradcheck(name, call_conv, (void *)c, 3, in, &go);
        cmi_conv_stats st;
        cmi_conv_stats_get(&st);
        /* the kernel asked for is the one that ran, every pass (oneDNN implements all these) */
        for (int p = 0; p < CMI_CONV_N_PASSES; p++) {
            const int64_t ran = kernel == CMI_CONV_DNNL ? st.dnnl[p] : st.im2col[p];
            const int64_t other = kernel == CMI_CONV_DNNL ? st.im2col[p] : st.dnnl[p];
            cr_assert(ran > 0 && other == 0, "%s pass %d: %lld on the kernel asked for, %lld on the other", name, p,
                      (long long)ran, (long long)other);
        }
        cr_assert_eq(st.unimplemented, 0, "%s: oneDNN refused it %lld times", name, (long long)st.unimplemented);
        cm_tape_free(tp);
    }
}

Test(conv, gradcheck_all_configs_dnnl) { gradcheck_all_configs(CMI_CONV_DNNL); }
Test(conv, gradcheck_all_configs_im2col) { gradcheck_all_configs(CMI_CONV_IM2COL); }

/* x feeds two convolutions: the second backward finds x's gradient already written and must add
 * to it (oneDNN writes a fresh gradient in place, an existing one through scratch). */
static cm_tensor *call_conv_twice(cm_tape *tp, cm_tensor *const *in, void *ctx) {
    cm_conv2d_opts o = opts_of(ctx);
    return cm_add(tp, cm_conv2d(tp, in[0], in[1], in[2], &o), cm_conv2d(tp, in[0], in[3], NULL, &o));
}

Test(conv, gradcheck_input_used_twice_accumulates) {
    cmt_gradcheck_opts go = cmt_gradcheck_defaults();
    go.atol = 2e-3;
    const cfg *cs[2] = {&k_cfgs[0], &k_cfgs[7]};
    for (int kern = 0; kern < 2; kern++)
        for (int k = 0; k < 2; k++) {
            cmi_conv_set_kernel(kern ? CMI_CONV_IM2COL : CMI_CONV_DNNL);
            cm_tape *tp = cmt_tape();
            cm_tensor *in[4];
            make_inputs(tp, cs[k], 400 + k, true, &in[0], &in[1], &in[2]);
            in[3] = cmt_randn(tp, 4, cm_tensor_shape(in[1]), 410 + k, true);
            cmt_gradcheck(kern ? "conv2d twice (im2col)" : "conv2d twice (dnnl)", call_conv_twice, (void *)cs[k], 4, in,
                          &go);
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

/* ------------------------------------------------------------------------------------------ */
/* Kernels: oneDNN against im2col, the ResNet shapes, bf16                                      */
/* ------------------------------------------------------------------------------------------ */

/* One forward + backward on its own tape: inputs from make_inputs(seed) (optionally rounded to
 * bf16 values, still f32), upstream gradient N(0,1) from seed + 7 (optionally rounded), autocast
 * optional; x, w, b are the leaves whose gradients backward filled. */
typedef struct {
    cm_tape *tp;
    cm_tensor *x, *w, *b, *y;
} conv_run;

typedef struct {
    bool round_inputs, round_grad, autocast, explicit_bf16;
} run_mode;

static cm_tensor *rounded(cm_tape *tp, cm_tensor *t) { /* t's values rounded to bf16, as f32 */
    cm_tensor *f = cm_empty(tp, CM_DTYPE_F32, cm_tensor_ndim(t), cm_tensor_shape(t));
    cr_assert(f);
    cm_tensor_copy(f, cm_cast(tp, t, CM_DTYPE_BF16));
    return f;
}

static conv_run run_conv(const cfg *c, uint64_t seed, run_mode m) {
    conv_run r = {cmt_tape(), NULL, NULL, NULL, NULL};
    make_inputs(r.tp, c, seed, !m.round_inputs && !m.explicit_bf16, &r.x, &r.w, &r.b);
    if (m.round_inputs) {
        r.x = rounded(r.tp, r.x), r.w = rounded(r.tp, r.w);
        cm_tensor_set_requires_grad(r.x, true);
        cm_tensor_set_requires_grad(r.w, true);
    }
    if (m.explicit_bf16) { /* bf16 leaves (their gradients are f32) */
        r.x = cm_cast(r.tp, r.x, CM_DTYPE_BF16), r.w = cm_cast(r.tp, r.w, CM_DTYPE_BF16);
        cr_assert(r.x && r.w);
        cm_tensor_set_requires_grad(r.x, true);
        cm_tensor_set_requires_grad(r.w, true);
    }
    if (r.b) cm_tensor_set_requires_grad(r.b, true);
    if (m.autocast) cm_tape_set_autocast(r.tp, CM_DTYPE_BF16);
    cm_conv2d_opts o = opts_of(c);
    r.y = cm_conv2d(r.tp, r.x, r.w, r.b, &o);
    cr_assert(r.y, "%s", cm_tape_error(r.tp));
    cr_assert_eq(cm_tensor_dtype(r.y), CM_DTYPE_F32);
    cm_tensor *g = cmt_randn(r.tp, 4, cm_tensor_shape(r.y), seed + 7, false);
    if (m.round_grad) g = rounded(r.tp, g);
    cr_assert_eq(cm_tape_backward_with(r.tp, r.y, g), CM_OK, "%s", cm_tape_error(r.tp));
    return r;
}

/* a's y and gradients against b's, within atol + rtol·|b| */
static void assert_runs_close(const char *what, size_t k, const conv_run *a, const conv_run *b, double atol,
                              double rtol) {
    char label[96];
    const cm_tensor *ta[4] = {a->y, cm_tensor_grad(a->x), cm_tensor_grad(a->w), a->b ? cm_tensor_grad(a->b) : NULL};
    const cm_tensor *tb[4] = {b->y, cm_tensor_grad(b->x), cm_tensor_grad(b->w), b->b ? cm_tensor_grad(b->b) : NULL};
    const char *names[4] = {"y", "dx", "dw", "db"};
    for (int i = 0; i < 4; i++) {
        if (!ta[i] && !tb[i]) continue;
        snprintf(label, sizeof label, "%s config %zu %s", what, k, names[i]);
        cr_assert(ta[i] && tb[i], "%s: missing", label);
        cr_assert_eq(cm_tensor_dtype(ta[i]), CM_DTYPE_F32, "%s: gradients are f32", label);
        cmt_assert_close(label, ta[i], tb[i], atol, rtol);
    }
}

/* oneDNN and im2col compute the same f32 sums in different orders (and oneDNN may split the
 * reduction over threads or blocks): sums of <= 150 products (forward, dx) and <= 2·30·30 (dw) of
 * N(0,1) values differ by a few f32 ulps of the partial sums, ~1e-5 here: 1e-4 abs + 1e-4 rel. */
Test(conv, dnnl_matches_im2col_on_all_configs) {
    const run_mode m = {false, false, false, false};
    for (size_t k = 0; k < sizeof k_cfgs / sizeof k_cfgs[0]; k++) {
        cmi_conv_set_kernel(CMI_CONV_IM2COL);
        conv_run a = run_conv(&k_cfgs[k], 500 + k, m);
        cmi_conv_set_kernel(CMI_CONV_DNNL);
        conv_run b = run_conv(&k_cfgs[k], 500 + k, m);
        assert_runs_close("dnnl vs im2col", k, &b, &a, 1e-4, 1e-4);
        cm_tape_free(a.tp);
        cm_tape_free(b.tp);
    }
}

/* The convolutions of a CIFAR ResNet (16/32/64 channels at 32/16/8 pixels, the stride-2
 * downsamples, the 3-channel stem), on a small batch: every pass must run on oneDNN — a silent
 * fallback to im2col here would hide a slow path — and agree with im2col (tolerance as above,
 * with sums of up to 576 products forward and 4·32·32 for dw: 2e-4 abs + 2e-4 rel). */
static const cfg k_resnet[] = {
    /* n  cin h   w   cout kh kw sh sw ph pw dh dw g  cl     bias   noncontig */
    {4, 3, 32, 32, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, false, false, false},  /* stem */
    {4, 16, 32, 32, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, false, false, false}, /* stage 1 */
    {4, 16, 32, 32, 32, 3, 3, 2, 2, 1, 1, 1, 1, 1, false, false, false}, /* downsample to stage 2 */
    {4, 32, 16, 16, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, false, false, false}, /* stage 2 */
    {4, 32, 16, 16, 64, 3, 3, 2, 2, 1, 1, 1, 1, 1, false, false, false}, /* downsample to stage 3 */
    {4, 64, 8, 8, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, false, true, false},    /* stage 3 (with a bias) */
    {4, 16, 32, 32, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, true, false, false},  /* channels-last stage 1 */
    {4, 32, 16, 16, 64, 3, 3, 2, 2, 1, 1, 1, 1, 1, true, false, false},  /* channels-last downsample */
    {4, 64, 8, 8, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, true, true, false},     /* channels-last stage 3 */
};

Test(conv, resnet_shapes_run_on_dnnl_and_match_im2col) {
    const run_mode m = {false, false, false, false};
    for (size_t k = 0; k < sizeof k_resnet / sizeof k_resnet[0]; k++) {
        cmi_conv_set_kernel(CMI_CONV_IM2COL);
        conv_run a = run_conv(&k_resnet[k], 600 + k, m);
        cmi_conv_set_kernel(CMI_CONV_DNNL);
        cmi_conv_stats_reset();
        conv_run b = run_conv(&k_resnet[k], 600 + k, m);
        cmi_conv_stats st;
        cmi_conv_stats_get(&st);
        for (int p = 0; p < CMI_CONV_N_PASSES; p++)
            cr_assert(st.dnnl[p] == 1 && st.im2col[p] == 0, "resnet config %zu pass %d: %lld on oneDNN, %lld on im2col",
                      k, p, (long long)st.dnnl[p], (long long)st.im2col[p]);
        cr_assert_eq(st.unimplemented, 0, "resnet config %zu: oneDNN refused it", k);
        assert_runs_close("resnet dnnl vs im2col", k, &b, &a, 2e-4, 2e-4);
        cm_tape_free(a.tp);
        cm_tape_free(b.tp);
    }
}

Test(conv, dnnl_primitives_are_cached) {
    cmi_conv_set_kernel(CMI_CONV_DNNL);
    const run_mode m = {false, false, false, false};
    conv_run a = run_conv(&k_resnet[1], 1, m);
    const int n = cmi_dnnl_conv_cache_size();
    cr_assert(n >= 3, "forward, backward-data and backward-weights cached: %d", n);
    conv_run b = run_conv(&k_resnet[1], 2, m);
    cr_assert_eq(cmi_dnnl_conv_cache_size(), n, "a repeated problem must not grow the cache");
    cm_tape_free(a.tp);
    cm_tape_free(b.tp);
}

/* bf16 under autocast against f32 on the same bf16-rounded x and w, with an upstream gradient that
 * is itself bf16-exact (so rounding it, as the bf16 backward does, changes nothing): products of
 * bf16 values are exact in f32 and both sides accumulate in f32, so they differ only by summation
 * order — the f32 tolerance (1e-4 abs + 1e-4 rel) holds. f32 leaves get f32 gradients through the
 * recorded casts. */
static void check_bf16(const cfg *cs, size_t n, cmi_conv_bf16_kernel bk, bool explicit_bf16) {
    const run_mode ref = {true, true, false, false};
    const run_mode ac = {false, true, !explicit_bf16, explicit_bf16};
    cmi_conv_set_algo(CMI_CONV_ALGO_DIRECT); /* exact products: the Winograd kernels have tests of their own */
    for (size_t k = 0; k < n; k++) {
        cmi_conv_set_kernel(CMI_CONV_DNNL);
        conv_run a = run_conv(&cs[k], 700 + k, ref);
        cmi_conv_set_bf16_kernel(bk);
        cmi_conv_stats_reset();
        conv_run b = run_conv(&cs[k], 700 + k, ac);
        cmi_conv_stats st;
        cmi_conv_stats_get(&st);
        for (int p = 0; p < CMI_CONV_N_PASSES; p++) {
            const int64_t own = own_pass(&cs[k], p, explicit_bf16);
            if (bk == CMI_CONV_BF16_ONEDNN)
                cr_assert(st.dnnl_bf16[p] == 1 - own && st.own_bf16[p] == own && st.widened[p] == 0,
                          "bf16 config %zu pass %d: %lld native, %lld own (want %lld), %lld widened", k, p,
                          (long long)st.dnnl_bf16[p], (long long)st.own_bf16[p], (long long)own,
                          (long long)st.widened[p]);
            else
                cr_assert(st.widened[p] == 1 && st.dnnl_bf16[p] == 0 && st.dnnl[p] == 1,
                          "bf16 config %zu pass %d: %lld widened (%lld of them on oneDNN f32), %lld native", k, p,
                          (long long)st.widened[p], (long long)st.dnnl[p], (long long)st.dnnl_bf16[p]);
        }
        assert_runs_close(bk == CMI_CONV_BF16_ONEDNN ? "bf16 onednn vs f32" : "bf16 widen vs f32", k, &b, &a, 1e-4,
                          1e-4);
        cm_tape_free(a.tp);
        cm_tape_free(b.tp);
    }
    cmi_conv_set_algo(CMI_CONV_ALGO_AUTO);
}

Test(conv_bf16, widen_autocast_matches_f32_on_rounded_values) {
    check_bf16(k_cfgs, sizeof k_cfgs / sizeof k_cfgs[0], CMI_CONV_BF16_WIDEN, false);
    check_bf16(k_resnet, sizeof k_resnet / sizeof k_resnet[0], CMI_CONV_BF16_WIDEN, false);
}

Test(conv_bf16, onednn_autocast_matches_f32_on_rounded_values) {
    if (!cmi_bf16_native()) cr_skip_test("oneDNN ISA %s has no native bf16 convolution", cmi_dnnl_isa_name());
    check_bf16(k_cfgs, sizeof k_cfgs / sizeof k_cfgs[0], CMI_CONV_BF16_ONEDNN, false);
    check_bf16(k_resnet, sizeof k_resnet / sizeof k_resnet[0], CMI_CONV_BF16_ONEDNN, false);
}

Test(conv_bf16, explicit_bf16_inputs_match_f32_on_rounded_values) {
    check_bf16(k_resnet, 3, CMI_CONV_BF16_WIDEN, true);
    if (cmi_bf16_native()) check_bf16(k_resnet, 3, CMI_CONV_BF16_ONEDNN, true);
}

/* bf16 on the im2col kernel: widened operands, im2col sums. */
Test(conv_bf16, im2col_kernel_widens) {
    const run_mode ref = {true, true, false, false}, ac = {false, true, true, false};
    cmi_conv_set_kernel(CMI_CONV_IM2COL);
    conv_run a = run_conv(&k_cfgs[3], 9, ref);
    cmi_conv_stats_reset();
    conv_run b = run_conv(&k_cfgs[3], 9, ac);
    cmi_conv_stats st;
    cmi_conv_stats_get(&st);
    for (int p = 0; p < CMI_CONV_N_PASSES; p++)
        cr_assert(st.widened[p] == 1 && st.im2col[p] == 1 && st.dnnl_bf16[p] == 0, "pass %d", p);
    assert_runs_close("bf16 im2col vs f32", 3, &b, &a, 1e-4, 1e-4);
    cm_tape_free(a.tp);
    cm_tape_free(b.tp);
}

/* The upstream gradient is rounded to bf16 in backward (as linear's): with a gradient that is not
 * bf16-exact, each of the K = Cout·kh·kw = 576 terms w·dy of dx (w, dy ~ N(0,1)) is off by a
 * uniform relative error of at most 2⁻⁹, so an element of dx is off by σ ≈ 2⁻⁹/√3·√K ≈ 0.027;
 * the largest of its 16384 elements (product-of-normal tails) stays within 12σ ≈ 0.3 = 12·2⁻⁹·
 * √(K/3). Yet it is not equal at f32 precision: that proves the rounding happens. */
Test(conv_bf16, backward_rounds_the_upstream_gradient) {
    const run_mode ref = {true, false, false, false}, ac = {false, false, true, false};
    conv_run a = run_conv(&k_resnet[5], 11, ref);
    conv_run b = run_conv(&k_resnet[5], 11, ac);
    const cfg *c = &k_resnet[5];
    const double tol = 12.0 * ldexp(1.0, -9) * sqrt((double)(c->cout * c->kh * c->kw) / 3.0);
    cmt_assert_close("bf16 dx", cm_tensor_grad(b.x), cm_tensor_grad(a.x), tol, 0.0);
    const float *ga = cm_tensor_data(cm_tensor_grad(a.x)), *gb = cm_tensor_data(cm_tensor_grad(b.x));
    double maxd = 0;
    for (int64_t i = 0; i < cm_tensor_numel(a.x); i++) maxd = fmax(maxd, fabs((double)ga[i] - gb[i]));
    cr_assert(maxd > 1e-4, "bf16 dx equals the f32 dx to %g: the upstream gradient was not rounded", maxd);
    cm_tape_free(a.tp);
    cm_tape_free(b.tp);
}

Test(conv_bf16, env_cm_conv_bf16_widen_selects_widen) {
    setenv("CM_CONV_BF16", "widen", 1); /* read on first use, in this test's own process */
    cr_assert_eq(cmi_conv_get_bf16_kernel(), CMI_CONV_BF16_WIDEN);
}

Test(conv, env_cm_conv_im2col_selects_im2col) {
    setenv("CM_CONV", "im2col", 1);
    cr_assert_eq(cmi_conv_get_kernel(), CMI_CONV_IM2COL);
    cmi_conv_stats_reset();
    const run_mode m = {false, false, false, false};
    conv_run a = run_conv(&k_cfgs[0], 1, m);
    cmi_conv_stats st;
    cmi_conv_stats_get(&st);
    cr_assert(st.im2col[CMI_CONV_FWD] == 1 && st.dnnl[CMI_CONV_FWD] == 0);
    cm_tape_free(a.tp);
}

Test(conv, env_cm_conv_algo_selects_the_algorithm) {
    setenv("CM_CONV_ALGO", "direct", 1); /* read on first use, in this test's own process */
    cr_assert_eq(cmi_conv_get_algo(), CMI_CONV_ALGO_DIRECT);
    cmi_conv_set_kernel(CMI_CONV_DNNL);
    cmi_conv_stats_reset();
    conv_run a = run_conv(&k_resnet[5], 1, (run_mode){false, false, false, false}); /* stage 3: auto's Winograd */
    cmi_conv_stats st;
    cmi_conv_stats_get(&st);
    for (int p = 0; p < CMI_CONV_N_PASSES; p++) cr_assert(st.dnnl[p] == 1 && st.winograd[p] == 0, "pass %d", p);
    cm_tape_free(a.tp);
}

Test(conv, env_cm_conv_algo_rejects_an_unknown_algorithm_and_keeps_auto) {
    setenv("CM_CONV_ALGO", "fft", 1);
    cr_assert_eq(cmi_conv_get_algo(), CMI_CONV_ALGO_AUTO);
}

/* Without overrides: oneDNN, and native bf16 exactly where the ISA has it. */
Test(conv, default_kernels_follow_the_isa) {
    const char *e1 = getenv("CM_CONV"), *e2 = getenv("CM_CONV_BF16");
    if ((e1 && *e1) || (e2 && *e2)) cr_skip_test("CM_CONV / CM_CONV_BF16 override the defaults");
    cr_assert_eq(cmi_conv_get_kernel(), CMI_CONV_DNNL);
    if (!(getenv("CM_CONV_ALGO") && *getenv("CM_CONV_ALGO"))) cr_assert_eq(cmi_conv_get_algo(), CMI_CONV_ALGO_AUTO);
    cr_assert_eq(cmi_conv_get_bf16_kernel(), cmi_bf16_native() ? CMI_CONV_BF16_ONEDNN : CMI_CONV_BF16_WIDEN, "ISA %s",
                 cmi_dnnl_isa_name());
}

Test(conv_bf16, dtype_errors_name_the_tensors) {
    int64_t xs[4] = {1, 4, 5, 5}, ws[4] = {6, 4, 3, 3}, bs[1] = {6};
    cm_conv2d_opts o = cm_conv2d_opts_default();
    cm_tape *tp = cmt_tape(); /* bf16 x with f32 weight (no autocast) */
    cm_tensor *xh = cm_cast(tp, cmt_randn(tp, 4, xs, 1, false), CM_DTYPE_BF16);
    expect_error(tp, cm_conv2d(tp, xh, cmt_randn(tp, 4, ws, 2, false), NULL, &o), CM_ERR_DTYPE, "dtypes differ",
                 "(6, 4, 3, 3)");
    cm_tape_free(tp);
    tp = cmt_tape(); /* bf16 bias */
    xh = cm_cast(tp, cmt_randn(tp, 4, xs, 1, false), CM_DTYPE_BF16);
    cm_tensor *wh = cm_cast(tp, cmt_randn(tp, 4, ws, 2, false), CM_DTYPE_BF16);
    cm_tensor *bh = cm_cast(tp, cmt_randn(tp, 1, bs, 3, false), CM_DTYPE_BF16);
    expect_error(tp, cm_conv2d(tp, xh, wh, bh, &o), CM_ERR_DTYPE, "bias (6,)", "f32");
    cm_tape_free(tp);
}

/* A problem oneDNN has no implementation for runs elsewhere and is counted, never silently: with
 * oneDNN capped at AVX2 (as on an AVX2-only CI machine) a forced native bf16 convolution is
 * unimplemented, so each pass goes to the widened f32 kernel, with the same numbers. */
Test(conv_bf16, unimplemented_problem_falls_back_and_is_counted) {
    /* this test's own process: no oneDNN kernel has been generated yet */
    cr_assert_eq(dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx2), dnnl_success);
    cr_assert(!cmi_bf16_native(), "ISA %s", cmi_dnnl_isa_name());
    cr_assert(!cmi_conv_winograd_f32_available(), "no f32 Winograd asked for below AVX-512 (ISA %s)",
              cmi_dnnl_isa_name());
    const run_mode ref = {true, true, false, false}, ac = {false, true, true, false};
    cmi_conv_set_kernel(CMI_CONV_DNNL);
    conv_run a = run_conv(&k_resnet[2], 21, ref);
    cmi_conv_set_bf16_kernel(CMI_CONV_BF16_ONEDNN);
    cmi_conv_stats_reset();
    conv_run b = run_conv(&k_resnet[2], 21, ac);
    cmi_conv_stats st;
    cmi_conv_stats_get(&st);
    cr_assert_eq(st.unimplemented, 3, "forward, backward-data and backward-weights refused: %lld",
                 (long long)st.unimplemented);
    for (int p = 0; p < CMI_CONV_N_PASSES; p++)
        cr_assert(st.dnnl_bf16[p] == 0 && st.widened[p] == 1 && st.dnnl[p] == 1, "pass %d", p);
    assert_runs_close("bf16 fallback vs f32", 2, &b, &a, 1e-4, 1e-4);
    cm_tape_free(a.tp);
    cm_tape_free(b.tp);
}

/* ResNet-56 itself, the zoo model bench_train_throughput trains (channels-last, the default) and
 * its NCHW form, f32 and under bf16 autocast: every convolution pass of a forward + backward runs on
 * oneDNN — 55 convolutions (stem + 27 blocks × 2, option-A shortcuts have none), 55 weight
 * gradients and 54 input gradients (the images need none) — and none falls back. */
Test(conv, resnet56_model_convolutions_all_run_on_onednn) {
    cmi_conv_set_kernel(CMI_CONV_DNNL);
    for (int cl = 0; cl < 2; cl++)
        for (int amp = 0; amp < 2; amp++) {
            cm_resnet_config rc;
            cr_assert_eq(cm_resnet_config_preset("resnet56", &rc), CM_OK, "%s", cm_last_error());
            rc.channels_last = cl;
            cm_module *m;
            cr_assert_eq(cm_resnet_new(&rc, &m), CM_OK, "%s", cm_last_error());
            cr_assert_eq(cm_module_finalize(m), CM_OK, "%s", cm_last_error());
            cm_tape *tp = cmt_tape();
            if (amp) cm_tape_set_autocast(tp, CM_DTYPE_BF16);
            const int64_t xs[4] = {2, 3, 32, 32};
            cm_tensor *x = cmt_randn(tp, 4, xs, 1, false);
            cmi_conv_stats_reset();
            cm_tensor *y = cm_module_forward(m, tp, x);
            cr_assert(y, "%s", cm_tape_error(tp));
            cm_tensor *g = cm_full(tp, CM_DTYPE_F32, cm_tensor_ndim(y), cm_tensor_shape(y), 1.0);
            cr_assert_eq(cm_tape_backward_with(tp, y, g), CM_OK, "%s", cm_tape_error(tp));
            cmi_conv_stats st;
            cmi_conv_stats_get(&st);
            const bool native = amp && cmi_conv_get_bf16_kernel() == CMI_CONV_BF16_ONEDNN;
            const int64_t want[CMI_CONV_N_PASSES] = {55, 54, 55};
            /* the 52 3x3 stride-1 body convolutions on our own bf16 kernels where they fit (their x is
             * batch norm's bf16 output) */
            const cfg body = {2, 16, 32, 32, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, cl, false, false};
            for (int p = 0; p < CMI_CONV_N_PASSES; p++) {
                const int64_t own = native && own_pass(&body, p, true) ? 52 : 0;
                cr_assert_eq(st.own_bf16[p], own, "%s%s pass %d: %lld on the own kernels (want %lld)",
                             cl ? "channels-last" : "NCHW", amp ? " amp_bf16" : "", p, (long long)st.own_bf16[p],
                             (long long)own);
            }
            /* the 34 stride-1 convolutions of stages 2 and 3 (32 and 64 channels) on Winograd (auto):
             * oneDNN's in f32, every pass; our own in bf16, forward and backward-data, where the own
             * kernels run (the images are 32x32: every body convolution fits Winograd's blocks) */
            const bool autoalgo = cmi_conv_get_algo() == CMI_CONV_ALGO_AUTO;
            for (int p = 0; p < CMI_CONV_N_PASSES; p++) {
                const int64_t wino = !autoalgo                ? 0
                                     : !amp                   ? (cmi_conv_winograd_f32_available() ? 34 : 0)
                                     : p == CMI_CONV_BWD_WEIGHTS ? 0
                                                              : (native && own_pass(&body, p, true) ? 34 : 0);
                const int64_t on = native ? st.dnnl_bf16[p] + st.own_bf16[p] : st.dnnl[p];
                cr_assert_eq(st.winograd[p], wino, "%s%s pass %d: %lld on Winograd (want %lld)",
                             cl ? "channels-last" : "NCHW", amp ? " amp_bf16" : "", p, (long long)st.winograd[p],
                             (long long)wino);
                cr_assert(on == want[p] && st.im2col[p] == 0,
                          "%s%s pass %d: %lld on oneDNN (want %lld), %lld on im2col", cl ? "channels-last" : "NCHW",
                          amp ? " amp_bf16" : "", p, (long long)on, (long long)want[p], (long long)st.im2col[p]);
            }
            cr_assert_eq(st.unimplemented, 0);
            cm_tape_free(tp);
            cm_module_free(m);
        }
}

/* Under autocast x and weight may each be f32 or bf16 (a ResNet under autocast feeds bf16
 * activations from batch norm to f32 master weights): one conv2d node, no casts recorded, on both
 * bf16 kernels; the result is bf16 with opts.out_bf16. Values and the f32 tensors' gradients match
 * the f32 convolution of the rounded values (bf16-exact upstream gradient: tolerance as
 * check_bf16); a bf16 result is that f32 result rounded, so within one bf16 ulp (2^-8 relative). */
Test(conv_bf16, autocast_takes_any_mix_of_bf16_and_f32_and_can_write_a_bf16_result) {
    const cfg *cs[2] = {&k_resnet[3], &k_resnet[6]}; /* NCHW stage 2, channels-last stage 1 */
    for (int bk = 0; bk < 2; bk++) {
        if (bk == CMI_CONV_BF16_ONEDNN && !cmi_bf16_native()) continue; /* widen runs everywhere */
        cmi_conv_set_bf16_kernel((cmi_conv_bf16_kernel)bk);
        for (int k = 0; k < 2; k++)
            for (int mix = 0; mix < 2; mix++) /* 0: bf16 x, f32 weight; 1: f32 x, bf16 weight */
                for (int out16 = 0; out16 < 2; out16++) {
                    const cfg *c = cs[k];
                    cm_tape *tp = cmt_tape();
                    cm_tensor *x, *w, *b;
                    make_inputs(tp, c, 31 + (uint64_t)k, true, &x, &w, &b);
                    cm_tensor *xr = rounded(tp, x), *wr = rounded(tp, w);
                    cm_tensor_set_requires_grad(xr, true);
                    cm_tensor_set_requires_grad(wr, true);
                    cm_conv2d_opts o = opts_of(c);
                    cm_tensor *yr = cm_conv2d(tp, xr, wr, NULL, &o);
                    cm_tensor *xa = mix == 0 ? cm_cast(tp, x, CM_DTYPE_BF16) : x;
                    cm_tensor *wa = mix == 1 ? cm_cast(tp, w, CM_DTYPE_BF16) : w;
                    cm_tape_set_autocast(tp, CM_DTYPE_BF16);
                    o.out_bf16 = out16;
                    const int64_t nodes = cm_tape_n_nodes(tp);
                    cmi_conv_stats_reset();
                    cm_tensor *y = cm_conv2d(tp, xa, wa, NULL, &o);
                    cr_assert(y && yr, "%s", cm_tape_error(tp));
                    cr_assert_eq(cm_tape_n_nodes(tp), nodes + 1, "one conv2d node, no casts: %lld nodes recorded",
                                 (long long)(cm_tape_n_nodes(tp) - nodes));
                    cr_assert_eq(cm_tensor_dtype(y), out16 ? CM_DTYPE_BF16 : CM_DTYPE_F32);
                    char what[128];
                    snprintf(what, sizeof what, "kernel %d config %d mix %d out_bf16 %d", bk, k, mix, out16);
                    cmt_assert_close(what, y, yr, 1e-4, out16 ? 8e-3 : 1e-4);
                    cm_tensor *g = rounded(tp, cmt_randn(tp, 4, cm_tensor_shape(yr), 32, false));
                    cm_tape_set_autocast(tp, CM_DTYPE_F32);
                    cr_assert_eq(cm_tape_backward_with(tp, yr, g), CM_OK, "%s", cm_tape_error(tp));
                    cr_assert_eq(cm_tape_backward_with(tp, y, g), CM_OK, "%s", cm_tape_error(tp));
                    cmi_conv_stats st;
                    cmi_conv_stats_get(&st);
                    for (int p = 0; p < CMI_CONV_N_PASSES; p++) {
                        const int64_t ran =
                            bk == CMI_CONV_BF16_ONEDNN ? st.dnnl_bf16[p] + st.own_bf16[p] : st.widened[p];
                        cr_assert_eq(ran, 1, "%s: pass %d ran %lld times on the chosen bf16 kernel", what, p,
                                     (long long)ran);
                    }
                    cmt_assert_close("grad x", cm_tensor_grad(x), cm_tensor_grad(xr), 1e-4, 1e-4);
                    cmt_assert_close("grad weight", cm_tensor_grad(w), cm_tensor_grad(wr), 1e-4, 1e-4);
                    cm_tape_free(tp);
                }
    }
    cmi_conv_set_bf16_kernel(cmi_bf16_native() ? CMI_CONV_BF16_ONEDNN : CMI_CONV_BF16_WIDEN);
}

/* A bf16 convolution output (opts.out_bf16) going into batch norm gets its gradient written by
 * batch norm's backward in bf16 (cmi_grad_for_write_as), and the convolution reads it as it is
 * instead of rounding an f32 one: the same f32 value rounded once either way, so the gradients of
 * x, w and batch norm's parameters are bitwise those of the f32-gradient path. Runs: (0) conv ->
 * batch_norm_add_relu (bf16 gradient: checked in a backward hook at batch norm's node); (1) the
 * conv output also used after batch norm (times 0), so its gradient exists, f32, when batch norm
 * runs: bitwise run 0's; (2) that use times 0.5 (f32 path) and (3) the same use recorded before
 * batch norm, so batch norm's bf16 gradient is promoted to f32 when that consumer adds to it:
 * run 2's within one more bf16 rounding of batch norm's part (2^-9 relative per element of dy;
 * relative L2 error of the gradients 4e-3, measured 7e-4); (4) run 0 on a tape with retain_grads:
 * the kept gradient of the conv output is f32, and the rest bitwise run 0's.
 * Both bf16 kernels, NCHW and channels-last. */
Test(conv_bf16, batch_norm_writes_a_bf16_convolution_output_gradient_in_bf16) {
    const cfg *cs[2] = {&k_resnet[1], &k_resnet[6]}; /* NCHW and channels-last stage 1 */
    for (int bk = 0; bk < 2; bk++) {
        if (bk == CMI_CONV_BF16_ONEDNN && !cmi_bf16_native()) continue;
        cmi_conv_set_bf16_kernel((cmi_conv_bf16_kernel)bk);
        for (int k = 0; k < 2; k++) {
            const cfg *c = cs[k];
            const int64_t C = c->cout;
            cm_tensor *grads[5][4];
            cm_tape *tps[5];
            for (int run = 0; run < 5; run++) {
                cm_tape_config tc = cm_tape_config_default();
                tc.poison = true;
                tc.retain_grads = run == 4;
                cm_tape *tp;
                cr_assert_eq(cm_tape_new(&tc, &tp), CM_OK);
                tps[run] = tp;
                cm_tensor *x, *w, *b;
                make_inputs(tp, c, 70 + (uint64_t)k, true, &x, &w, &b);
                cm_tensor *bw = cmt_randn(tp, 1, &C, 80, true), *bb = cmt_randn(tp, 1, &C, 81, true);
                cm_conv2d_opts o = opts_of(c);
                o.out_bf16 = true;
                cm_batch_norm_opts bo = cm_batch_norm_opts_default();
                bo.channels_last = c->cl;
                cm_tape_set_autocast(tp, CM_DTYPE_BF16);
                cm_tensor *y = cm_conv2d(tp, x, w, NULL, &o);
                cr_assert(y && cm_tensor_dtype(y) == CM_DTYPE_BF16, "%s", cm_tape_error(tp));
                const float f = run == 1 ? 0.0f : 0.5f;
                cm_tensor *early = run == 3 ? cm_mul_scalar(tp, cm_cast(tp, y, CM_DTYPE_F32), f) : NULL;
                cm_tensor *z = cm_cast(tp, cm_batch_norm_add_relu(tp, y, bw, bb, NULL, NULL, NULL, &bo), CM_DTYPE_F32);
                if (run == 1 || run == 2) z = cm_add(tp, z, cm_mul_scalar(tp, cm_cast(tp, y, CM_DTYPE_F32), f));
                if (run == 3) z = cm_add(tp, z, early);
                cr_assert(z, "%s", cm_tape_error(tp));
                cmt_grad_probe pr = {y, "batch_norm_add_relu", 0, CM_DTYPE_COUNT};
                cm_tape_set_backward_hook(tp, cmt_grad_probe_hook, &pr);
                cm_tensor *g = cmt_randn(tp, 4, cm_tensor_shape(z), 82, false);
                cr_assert_eq(cm_tape_backward_with(tp, z, g), CM_OK, "%s", cm_tape_error(tp));
                cr_assert_eq(pr.seen, 1);
                cr_assert_eq(pr.dtype, run == 1 || run == 2 || run == 4 ? CM_DTYPE_F32 : CM_DTYPE_BF16,
                             "kernel %d config %d run %d: the conv output's gradient after batch norm is %s", bk, k,
                             run, cm_dtype_name(pr.dtype));
                if (run == 4)
                    cr_assert(cm_tensor_grad(y) && cm_tensor_dtype(cm_tensor_grad(y)) == CM_DTYPE_F32,
                              "retain_grads keeps the conv output's gradient, in f32");
                cm_tensor *leaves[4] = {x, w, bw, bb};
                for (int i = 0; i < 4; i++) {
                    grads[run][i] = cm_tensor_grad(leaves[i]);
                    cr_assert_eq(cm_tensor_dtype(grads[run][i]), CM_DTYPE_F32);
                }
            }
            const char *names[4] = {"grad x", "grad w", "grad bn weight", "grad bn bias"};
            for (int i = 0; i < 4; i++) {
                char what[96];
                snprintf(what, sizeof what, "kernel %d config %d run 1 %s", bk, k, names[i]);
                cmt_assert_close(what, grads[1][i], grads[0][i], 0, 0);
                snprintf(what, sizeof what, "kernel %d config %d run 4 (retain_grads) %s", bk, k, names[i]);
                cmt_assert_close(what, grads[4][i], grads[0][i], 0, 0);
                double dd = 0, nn = 0; /* relative L2 error: elements where the two parts cancel differ more */
                for (int64_t e = 0; e < cm_tensor_numel(grads[2][i]); e++) {
                    const double a = cm_tensor_get_flat(grads[3][i], e), r = cm_tensor_get_flat(grads[2][i], e);
                    dd += (a - r) * (a - r), nn += r * r;
                }
                cr_assert(sqrt(dd) <= 4e-3 * sqrt(nn), "kernel %d config %d run 3 %s: relative L2 error %.3g", bk, k,
                          names[i], sqrt(dd / nn));
            }
            for (int run = 0; run < 5; run++) cm_tape_free(tps[run]);
        }
    }
    cmi_conv_set_bf16_kernel(cmi_bf16_native() ? CMI_CONV_BF16_ONEDNN : CMI_CONV_BF16_WIDEN);
}

/* An intermediate x (a tensor with a node) gets its gradient written, not zeroed and added: on a
 * poisoning tape (new arena memory is NaN) each kernel — oneDNN, im2col (which zeroes it first),
 * and under autocast — must give the gradient the same op gives a leaf: grad x0 = 2 · grad x. */
Test(conv, fresh_gradient_of_an_intermediate_input_is_fully_written) {
    const cfg *cs[2] = {&k_cfgs[0], &k_cfgs[7]}; /* NCHW and channels-last, small: arena gradients */
    for (int kern = 0; kern < 2; kern++)
        for (int amp = 0; amp < 2; amp++)
            for (int k = 0; k < 2; k++) {
                cmi_conv_set_kernel(kern ? CMI_CONV_IM2COL : CMI_CONV_DNNL);
                cm_tape_config tc = cm_tape_config_default();
                tc.poison = true;
                cm_tape *tp;
                cr_assert_eq(cm_tape_new(&tc, &tp), CM_OK);
                cm_tensor *x0, *w, *b;
                make_inputs(tp, cs[k], 40 + (uint64_t)k, true, &x0, &w, &b);
                cm_conv2d_opts o = opts_of(cs[k]);
                if (amp) cm_tape_set_autocast(tp, CM_DTYPE_BF16);
                cm_tensor *xl = cm_clone_detached(tp, cm_mul_scalar(tp, x0, 2.0f)); /* the leaf reference */
                cm_tensor_set_requires_grad(xl, true);
                cm_tensor *yl = cm_conv2d(tp, xl, w, b, &o);
                cr_assert(yl, "%s", cm_tape_error(tp));
                cm_tensor *g = cmt_randn(tp, cm_tensor_ndim(yl), cm_tensor_shape(yl), 7, false);
                cr_assert_eq(cm_tape_backward_with(tp, yl, g), CM_OK, "%s", cm_tape_error(tp));
                cm_tensor *want = cm_mul_scalar(tp, cm_tensor_grad(xl), 2.0f);
                cm_tensor *y = cm_conv2d(tp, cm_mul_scalar(tp, x0, 2.0f), w, b, &o);
                cr_assert(y, "%s", cm_tape_error(tp));
                cr_assert_eq(cm_tape_backward_with(tp, y, g), CM_OK, "%s", cm_tape_error(tp));
                char what[96];
                snprintf(what, sizeof what, "grad x (%s, amp %d, config %d)", kern ? "im2col" : "dnnl", amp, k);
                cmt_assert_close(what, cm_tensor_grad(x0), want, 1e-5, 1e-5);
                cm_tape_free(tp);
            }
    cmi_conv_set_kernel(CMI_CONV_DNNL);
}

static uint16_t bf16_bits(float f) { /* round to nearest even (finite values) */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float bf16_value(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The reference walk of the own bf16 kernels' tests: fn(ctx, input pixel, output pixel, kh, kw)
 * for every tap of a 3x3, stride-1, pad-1 problem on N images of H x W that lands inside the image
 * (pixels numbered (n·H + h)·W + w). */
typedef void (*tap_fn)(void *ctx, int64_t ip, int64_t op, int kh, int kw);
static void each_tap(int64_t N, int64_t H, int64_t W, tap_fn fn, void *ctx) {
    for (int64_t n = 0; n < N; n++)
        for (int64_t oh = 0; oh < H; oh++)
            for (int64_t ow = 0; ow < W; ow++)
                for (int kh = 0; kh < 3; kh++)
                    for (int kw = 0; kw < 3; kw++) {
                        const int64_t ih = oh + kh - 1, iw = ow + kw - 1;
                        if (ih >= 0 && ih < H && iw >= 0 && iw < W) fn(ctx, (n * H + ih) * W + iw, (n * H + oh) * W + ow, kh, kw);
                    }
}

/* Backward-weights: dW[oc][ic][kh][kw] += dy[op][oc]·x[ip][ic], and Σ|products| per entry. */
typedef struct {
    const uint16_t *x, *dy;
    int64_t IC, OC;
    double *ref, *mag;
} wgrad_ref;
static void wgrad_tap(void *ctx, int64_t ip, int64_t op, int kh, int kw) {
    const wgrad_ref *r = ctx;
    for (int64_t oc = 0; oc < r->OC; oc++)
        for (int64_t ic = 0; ic < r->IC; ic++) {
            const double p = (double)bf16_value(r->dy[op * r->OC + oc]) * bf16_value(r->x[ip * r->IC + ic]);
            r->ref[((oc * r->IC + ic) * 3 + kh) * 3 + kw] += p;
            r->mag[((oc * r->IC + ic) * 3 + kh) * 3 + kw] += fabs(p);
        }
}

/* The direct problem: out[op][co] += in[ip][ci]·w, w[co][ci][kh][kw] (forward) or, backward-data,
 * w[ci][co][2-kh][2-kw] (w is (CI, CO, 3, 3) then: the forward's (Cout, Cin)); the weight's bf16
 * values w, or its f32 values wf where given. */
typedef struct {
    const uint16_t *in, *w;
    const float *wf;
    int64_t CI, CO;
    bool bwd;
    double *ref, *mag;
} direct_ref;
static void direct_tap(void *ctx, int64_t ip, int64_t op, int kh, int kw) {
    const direct_ref *r = ctx;
    const int64_t CI = r->CI, CO = r->CO;
    for (int64_t co = 0; co < CO; co++)
        for (int64_t ci = 0; ci < CI; ci++) {
            const int64_t wi = r->bwd ? ((ci * CO + co) * 3 + 2 - kh) * 3 + 2 - kw : ((co * CI + ci) * 3 + kh) * 3 + kw;
            const double p = (double)bf16_value(r->in[ip * CI + ci]) * (r->wf ? (double)r->wf[wi] : bf16_value(r->w[wi]));
            r->ref[op * CO + co] += p;
            r->mag[op * CO + co] += fabs(p);
        }
}

/* Our own bf16 backward-weights kernel (conv_wgrad.c) against a double reference on the same bf16
 * values: one and several chunks (a chunk is ~1024 pixels: N 70 at 4x4 is two, the second
 * partial; N 3 at 5x6 one of three images), 16..64 input channels (one lane block each), 16..128
 * output channels (tiles of 8), images one pixel pair wide and one row high, x and dy stored as
 * bf16 or as f32 (unrounded: the kernel rounds them, to nearest even), and dW added to. f32 sums
 * of <= 1120 products: within 1e-5 of the entry's Σ|products|. The problems it does not take are
 * named by cmi_conv_wgrad_bf16_fits. */
Test(conv_bf16, own_backward_weights_matches_a_double_reference) {
    const cmi_conv_geom probe = {1, 16, 2, 2, 16, 2, 2, 3, 3, 1, 1, 1, 1, 1, 1, 1, true};
    if (!cmi_conv_wgrad_bf16_fits(&probe)) cr_skip_test("this CPU has no AVX512-BF16: oneDNN's kernel runs instead");
    const int64_t shapes[][5] = {/* N, Cin, H, W, Cout */
                                 {1, 16, 1, 2, 16}, {3, 16, 5, 6, 32},  {2, 32, 7, 4, 16},
                                 {70, 16, 4, 4, 48}, {5, 48, 3, 8, 64}, {2, 64, 8, 8, 128}};
    cm_tape_config tc = cm_tape_config_default();
    cm_tape *tp;
    cr_assert_eq(cm_tape_new(&tc, &tp), CM_OK);
    cm_rng rng = cm_rng_init(91, 0);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int st = 0; st < 4; st++) { /* bit 0: x stored f32; bit 1: dy stored f32 */
            const int64_t N = shapes[s][0], IC = shapes[s][1], H = shapes[s][2], W = shapes[s][3], OC = shapes[s][4];
            const cmi_conv_geom g = {N, IC, H, W, OC, H, W, 3, 3, 1, 1, 1, 1, 1, 1, 1, true};
            cr_assert(cmi_conv_wgrad_bf16_fits(&g), "shape %zu", s);
            const size_t xn = (size_t)(N * H * W * IC), yn = (size_t)(N * H * W * OC), wn = (size_t)(OC * IC * 9);
            float *xf = malloc(xn * 4), *yf = malloc(yn * 4), *dw = malloc(wn * 4);
            uint16_t *xh = malloc(xn * 2), *yh = malloc(yn * 2);
            double *ref = calloc(wn, sizeof(double)), *mag = calloc(wn, sizeof(double));
            cm_rng_normal(&rng, xf, xn, 0.0f, 1.0f);
            cm_rng_normal(&rng, yf, yn, 0.0f, 1.0f);
            cm_rng_normal(&rng, dw, wn, 0.0f, 1.0f);
            for (size_t i = 0; i < xn; i++) xh[i] = bf16_bits(xf[i]);
            for (size_t i = 0; i < yn; i++) yh[i] = bf16_bits(yf[i]);
            for (size_t i = 0; i < wn; i++) ref[i] = dw[i];
            wgrad_ref wr = {xh, yh, IC, OC, ref, mag};
            each_tap(N, H, W, wgrad_tap, &wr);
            const bool x32 = st & 1, y32 = st & 2;
            cr_assert_eq(cmi_conv_wgrad_bf16(tp, &g, x32 ? CM_DTYPE_F32 : CM_DTYPE_BF16, x32 ? (void *)xf : xh,
                                             y32 ? CM_DTYPE_F32 : CM_DTYPE_BF16, y32 ? (void *)yf : yh, dw),
                         CM_OK, "%s", cm_tape_error(tp));
            for (size_t i = 0; i < wn; i++)
                cr_assert(fabs(dw[i] - ref[i]) <= 1e-5 * mag[i] + 1e-6 * fabs(ref[i]),
                          "shape %zu (N %lld Cin %lld %lldx%lld Cout %lld) storage %d: dW[%zu] = %.7g, reference %.7g", s,
                          (long long)N, (long long)IC, (long long)H, (long long)W, (long long)OC, st, i, dw[i], ref[i]);
            free(xf), free(yf), free(dw), free(xh), free(yh), free(ref), free(mag);
        }
    cm_tape_free(tp);
    /* what it does not take (conv.c then runs oneDNN's bf16 backward-weights) */
    const cmi_conv_geom no[] = {
        {1, 16, 4, 4, 16, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, false}, /* NCHW */
        {1, 8, 4, 4, 16, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},   /* Cin 8 */
        {1, 16, 4, 4, 24, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},  /* Cout 24 */
        {1, 16, 4, 5, 16, 4, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},  /* W odd */
        {1, 16, 4, 4, 16, 2, 2, 3, 3, 2, 2, 1, 1, 1, 1, 1, true},  /* stride 2 */
        {1, 16, 4, 4, 16, 2, 2, 3, 3, 1, 1, 0, 0, 1, 1, 1, true},  /* no padding */
        {1, 16, 4, 4, 16, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 2, true},  /* 2 groups */
        {1, 16, 4, 4, 16, 2, 2, 3, 3, 1, 1, 1, 1, 2, 2, 1, true},  /* dilation 2 */
        {1, 16, 4, 4, 16, 4, 4, 1, 1, 1, 1, 0, 0, 1, 1, 1, true},  /* 1x1 */
    };
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        cr_assert(!cmi_conv_wgrad_bf16_fits(&no[i]), "problem %zu is not the own kernel's", i);
}

/* Through cm_conv2d on explicit bf16 inputs (so the forward's x is bf16): our own kernels and
 * oneDNN's (CM_CONV_BF16_OWN=none, or cmi_conv_set_own_passes(0)) give the same results up to f32
 * summation order (y: one bf16 rounding), and the counters say which ran; the environment
 * variable is read on first use (this test's own process). */
Test(conv_bf16, own_kernels_agree_with_onednn_and_can_be_switched_off) {
    setenv("CM_CONV_BF16_OWN", "none", 1); /* before anything reads the switches */
    cr_assert_eq(cmi_conv_get_own_passes(), 0u, "CM_CONV_BF16_OWN=none switches the own kernels off");
    cmi_conv_set_own_passes(7);
    if (!cmi_bf16_native()) cr_skip_test("oneDNN ISA %s has no native bf16 convolution", cmi_dnnl_isa_name());
    if (!own_pass(&k_resnet[6], CMI_CONV_BWD_WEIGHTS, true))
        cr_skip_test("this CPU has no AVX512-BF16: oneDNN's kernels run anyway");
    const run_mode m = {false, true, false, true};
    conv_run r[2];
    for (int own = 0; own < 2; own++) {
        cmi_conv_set_own_passes(own ? 7 : 0);
        cmi_conv_stats_reset();
        r[own] = run_conv(&k_resnet[6], 77, m); /* channels-last stage 1 */
        cmi_conv_stats st;
        cmi_conv_stats_get(&st);
        for (int p = 0; p < CMI_CONV_N_PASSES; p++) {
            const int64_t want = own && own_pass(&k_resnet[6], p, true);
            cr_assert(st.own_bf16[p] == want && st.dnnl_bf16[p] == 1 - want, "own %d pass %d: %lld own, %lld oneDNN",
                      own, p, (long long)st.own_bf16[p], (long long)st.dnnl_bf16[p]);
        }
    }
    cr_assert(own_pass(&k_resnet[6], CMI_CONV_FWD, true), "the forward runs on the own kernel here");
    /* y: f32 sums in another order, within f32 rounding (the result is f32 here) */
    assert_runs_close("own vs oneDNN", 6, &r[1], &r[0], 1e-4, 1e-4);
    cm_tape_free(r[0].tp);
    cm_tape_free(r[1].tp);
    /* an x read by two convolutions: the second backward-data adds into its gradient (the own
     * kernel in its store) */
    cm_tensor *gx[2];
    cm_tape *tps[2];
    for (int own = 0; own < 2; own++) {
        cmi_conv_set_own_passes(own ? 7 : 0);
        cm_tape *tp = tps[own] = cmt_tape();
        cm_tensor *x, *w, *b, *x2, *w2, *b2;
        make_inputs(tp, &k_resnet[6], 78, true, &x, &w, &b);
        make_inputs(tp, &k_resnet[6], 88, true, &x2, &w2, &b2); /* x2 unused: a second weight */
        cm_tensor *xb = cm_cast(tp, x, CM_DTYPE_BF16);
        cm_tape_set_autocast(tp, CM_DTYPE_BF16);
        cm_conv2d_opts o = opts_of(&k_resnet[6]);
        cm_tensor *y = cm_add(tp, cm_conv2d(tp, xb, w, NULL, &o), cm_conv2d(tp, xb, w2, NULL, &o));
        cr_assert(y, "%s", cm_tape_error(tp));
        cm_tape_set_autocast(tp, CM_DTYPE_F32);
        cr_assert_eq(cm_tape_backward_with(tp, y, rounded(tp, cmt_randn(tp, 4, cm_tensor_shape(y), 89, false))), CM_OK,
                     "%s", cm_tape_error(tp));
        gx[own] = cm_tensor_grad(x);
    }
    cmt_assert_close("grad of an x read twice, own vs oneDNN", gx[1], gx[0], 1e-4, 1e-4);
    cm_tape_free(tps[0]);
    cm_tape_free(tps[1]);
}

Test(conv_bf16, env_cm_conv_bf16_own_takes_a_list_of_passes) {
    setenv("CM_CONV_BF16_OWN", "fwd,weights", 1);
    cr_assert_eq(cmi_conv_get_own_passes(), (1u << CMI_CONV_FWD) | (1u << CMI_CONV_BWD_WEIGHTS));
}

Test(conv_bf16, env_cm_conv_bf16_own_rejects_an_unknown_pass_and_keeps_all) {
    setenv("CM_CONV_BF16_OWN", "fwd,bogus", 1);
    cr_assert_eq(cmi_conv_get_own_passes(), 7u, "an unknown name warns and keeps every own kernel");
}

/* Forward and backward-data of our own bf16 kernels (cmi_conv_fwd_bf16, cmi_conv_bwd_data_bf16) on
 * algorithm `algo` against a double reference, for each shape (N, Cin, H, W, Cout) and each mix of
 * weight storage (f32 / bf16) and result (f32 / bf16; an f32 backward-data result is added to:
 * it starts at 1). Per entry: |error| <= tol_mag·Σ|products| + (bf16 result: half a bf16 ulp of
 * the reference; f32: 1e-6·|reference|); with sum_bound, also Σ|error| <= sum_bound·Σ Σ|products|.
 * The reference takes the weight's bf16 values, or its f32 values where the kernel transforms an
 * f32 weight unrounded (f32_weight_ref). The pass must run on the algorithm asked for (counted). */
static void check_own_bf16_passes(cmi_conv_algo algo, const int64_t (*shapes)[5], size_t n_shapes, uint64_t seed,
                                  double tol_mag, double sum_bound, bool f32_weight_ref) {
    cmi_conv_set_algo(algo);
    cm_tape_config tc = cm_tape_config_default();
    tc.poison = true; /* scratch starts as NaN: nothing may be read before it is written */
    cm_tape *tp;
    cr_assert_eq(cm_tape_new(&tc, &tp), CM_OK);
    cm_rng rng = cm_rng_init(seed, 0);
    for (size_t s = 0; s < n_shapes; s++)
        for (int bwd = 0; bwd < 2; bwd++)
            for (int st = 0; st < 4; st++) { /* bit 0: weight bf16; bit 1: result bf16 */
                const int64_t N = shapes[s][0], IC = shapes[s][1], H = shapes[s][2], W = shapes[s][3],
                              OC = shapes[s][4];
                const cmi_conv_geom g = {N, IC, H, W, OC, H, W, 3, 3, 1, 1, 1, 1, 1, 1, 1, true};
                cr_assert(algo == CMI_CONV_ALGO_WINOGRAD ? cmi_conv_winograd_bf16_fits(&g)
                                                         : cmi_conv_direct_bf16_fits(&g),
                          "shape %zu", s);
                const int64_t CI = bwd ? OC : IC, CO = bwd ? IC : OC; /* the direct problem's channels */
                const size_t in_n = (size_t)(N * H * W * CI), out_n = (size_t)(N * H * W * CO),
                             wn = (size_t)(OC * IC * 9);
                float *inf = malloc(in_n * 4), *wf = malloc(wn * 4), *out = malloc(out_n * 4);
                uint16_t *inh = malloc(in_n * 2), *wh = malloc(wn * 2);
                double *ref = calloc(out_n, sizeof(double)), *mag = calloc(out_n, sizeof(double));
                cm_rng_normal(&rng, inf, in_n, 0.0f, 1.0f);
                cm_rng_normal(&rng, wf, wn, 0.0f, 1.0f);
                for (size_t i = 0; i < in_n; i++) inh[i] = bf16_bits(inf[i]);
                for (size_t i = 0; i < wn; i++) wh[i] = bf16_bits(wf[i]);
                const bool wb = st & 1, ob = st & 2;
                direct_ref dr = {inh, wh, f32_weight_ref && !wb ? wf : NULL, CI, CO, bwd, ref, mag};
                each_tap(N, H, W, direct_tap, &dr);
                const void *w = wb ? (const void *)wh : wf;
                const cm_dtype wd = wb ? CM_DTYPE_BF16 : CM_DTYPE_F32, od = ob ? CM_DTYPE_BF16 : CM_DTYPE_F32;
                /* backward-data with an f32 result also adds into what is there: start from 1 */
                const bool acc = bwd && !ob;
                if (acc)
                    for (size_t i = 0; i < out_n; i++) out[i] = 1.0f, ref[i] += 1.0;
                cmi_conv_stats_reset();
                cr_assert_eq(bwd ? cmi_conv_bwd_data_bf16(tp, &g, inh, wd, w, od, out, acc)
                                 : cmi_conv_fwd_bf16(tp, &g, inh, wd, w, od, out),
                             CM_OK, "%s", cm_tape_error(tp));
                cmi_conv_stats cs;
                cmi_conv_stats_get(&cs);
                cr_assert_eq(cs.winograd[bwd ? CMI_CONV_BWD_DATA : CMI_CONV_FWD], algo == CMI_CONV_ALGO_WINOGRAD,
                             "shape %zu: Winograd ran %lld times", s,
                             (long long)cs.winograd[bwd ? CMI_CONV_BWD_DATA : CMI_CONV_FWD]);
                double err_sum = 0.0, mag_sum = 0.0;
                for (size_t i = 0; i < out_n; i++) {
                    const double v = ob ? bf16_value(((uint16_t *)out)[i]) : out[i], e = fabs(v - ref[i]);
                    const double tol = tol_mag * mag[i] + (ob ? fabs(ref[i]) * (1.0 / 256) : 1e-6 * fabs(ref[i]));
                    err_sum += e, mag_sum += mag[i];
                    cr_assert(e <= tol,
                              "shape %zu (N %lld Cin %lld %lldx%lld Cout %lld) %s weight %s result %s: [%zu] = %.7g, "
                              "reference %.7g (Σ|products| %.4g)",
                              s, (long long)N, (long long)IC, (long long)H, (long long)W, (long long)OC,
                              bwd ? "backward-data" : "forward", wb ? "bf16" : "f32", ob ? "bf16" : "f32", i, v, ref[i],
                              mag[i]);
                }
                if (sum_bound > 0)
                    cr_assert(err_sum <= sum_bound * mag_sum, "shape %zu %s: summed error %.3g of the summed Σ|products|",
                              s, bwd ? "backward-data" : "forward", err_sum / mag_sum);
                free(inf), free(wf), free(out), free(inh), free(wh), free(ref), free(mag);
            }
    cm_tape_free(tp);
    cmi_conv_set_algo(CMI_CONV_ALGO_AUTO);
}

/* Our own direct bf16 kernel (forward, and backward-data as the forward of dy with the weight
 * transposed and flipped) against a double reference on the same bf16 values: 16, 32 and 64
 * channels each way, rows of 8 to 32 pixels (tiles of 8 or 16: one tile touching both edges, edge
 * and interior tiles), one to five rows, weights f32 (rounded inside) or bf16, results f32 or
 * bf16 (rounded once); an f32 backward-data result added to what it holds. f32 sums of <= 576
 * products: within 1e-5 of Σ|products| (f32 result), or half a bf16 ulp more (bf16 result). */
Test(conv_bf16, own_direct_kernel_matches_a_double_reference) {
    const cmi_conv_geom probe = {1, 16, 2, 8, 16, 2, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, true};
    if (!cmi_conv_direct_bf16_fits(&probe)) cr_skip_test("this CPU has no AVX512-BF16: oneDNN's kernels run instead");
    const int64_t shapes[][5] = {/* N, Cin, H, W, Cout */
                                 {2, 16, 3, 16, 16}, {1, 16, 5, 32, 16}, {3, 32, 1, 8, 16}, {2, 16, 4, 24, 32},
                                 {2, 64, 3, 8, 64},  {1, 32, 2, 16, 64}, {1, 64, 3, 24, 32}};
    check_own_bf16_passes(CMI_CONV_ALGO_DIRECT, shapes, sizeof shapes / sizeof shapes[0], 93, 1e-5, 0.0, false);
    const cmi_conv_geom no[] = {
        {1, 48, 4, 8, 16, 4, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},  /* Cin 48 */
        {1, 16, 4, 8, 128, 4, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, true}, /* Cout 128 */
        {1, 16, 4, 12, 16, 4, 12, 3, 3, 1, 1, 1, 1, 1, 1, 1, true}, /* W 12: not a multiple of 8 */
        {1, 16, 4, 8, 16, 4, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, false}, /* NCHW */
    };
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        cr_assert(!cmi_conv_direct_bf16_fits(&no[i]), "problem %zu is not the direct kernel's", i);
}

/* ------------------------------------------------------------------------------------------ */
/* f32 algorithm: Winograd (oneDNN's F(4x4, 3x3)) against direct                                 */
/* ------------------------------------------------------------------------------------------ */

/* t (4-d, the config's layout) as doubles in (N, C, H, W) order */
static double *as_nchw(const cm_tensor *t, bool cl) {
    const int64_t *s = cm_tensor_shape(t);
    const int64_t N = s[0], C = cl ? s[3] : s[1], H = cl ? s[1] : s[2], W = cl ? s[2] : s[3];
    double *v = malloc((size_t)(N * C * H * W) * sizeof(double));
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t w = 0; w < W; w++) {
                    int64_t i[4] = {n, c, h, w};
                    if (cl) i[1] = h, i[2] = w, i[3] = c;
                    v[((n * C + c) * H + h) * W + w] = cm_tensor_get(t, i);
                }
    return v;
}

/* Largest |got - want| / (Σ|products| + tiny) over t, t in the config's layout, want and mag NCHW */
static double worst_error(const cm_tensor *t, bool cl, const double *want, const double *mag) {
    double *got = as_nchw(t, cl), worst = 0.0;
    for (int64_t i = 0; i < cm_tensor_numel(t); i++) {
        const double e = fabs(got[i] - want[i]) / (mag[i] + 1e-30);
        if (e > worst) worst = e;
    }
    free(got);
    return worst;
}

/* y, dx and dw of a 3x3 stride-1 pad-1 convolution in double (NCHW, weight (Cout, Cin, 3, 3)),
 * each with Σ|products| per entry */
typedef struct {
    double *y, *dx, *dw, *ym, *dxm, *dwm;
} conv_ref3;
static conv_ref3 ref_conv3(int64_t N, int64_t CI, int64_t H, int64_t W, int64_t CO, const double *x, const double *w,
                           const double *dy) {
    conv_ref3 r;
    const size_t xn = (size_t)(N * CI * H * W), yn = (size_t)(N * CO * H * W), wn = (size_t)(CO * CI * 9);
    r.y = calloc(yn, 8), r.ym = calloc(yn, 8), r.dx = calloc(xn, 8), r.dxm = calloc(xn, 8);
    r.dw = calloc(wn, 8), r.dwm = calloc(wn, 8);
    for (int64_t n = 0; n < N; n++)
        for (int64_t co = 0; co < CO; co++)
            for (int64_t ci = 0; ci < CI; ci++)
                for (int64_t oh = 0; oh < H; oh++)
                    for (int64_t ow = 0; ow < W; ow++)
                        for (int kh = 0; kh < 3; kh++)
                            for (int kw = 0; kw < 3; kw++) {
                                const int64_t ih = oh + kh - 1, iw = ow + kw - 1;
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                const int64_t xi = ((n * CI + ci) * H + ih) * W + iw;
                                const int64_t yi = ((n * CO + co) * H + oh) * W + ow;
                                const int64_t wi = ((co * CI + ci) * 3 + kh) * 3 + kw;
                                r.y[yi] += x[xi] * w[wi], r.ym[yi] += fabs(x[xi] * w[wi]);
                                r.dx[xi] += dy[yi] * w[wi], r.dxm[xi] += fabs(dy[yi] * w[wi]);
                                r.dw[wi] += dy[yi] * x[xi], r.dwm[wi] += fabs(dy[yi] * x[xi]);
                            }
    return r;
}

/* Each algorithm's forward, backward-data and backward-weights against the double reference, on
 * the ResNet-CIFAR stage shapes and odd ones (7x9 pixels: partial 4x4 tiles; 48 -> 32 channels),
 * NCHW and channels-last, with and without a bias; the counters say which algorithm ran.
 * Error, as a fraction of each entry's Σ|products| (measured on this machine, AVX-512): direct
 * up to 3.2e-7, Winograd up to 1.5e-6 (its transforms, at points 0, ±1, ±2, ±1/2, amplify f32
 * rounding; worst in dw). Bounds 1e-6 and 5e-6: a wrong tap or a lost tile border is O(1). */
Test(conv, winograd_and_direct_match_a_double_reference) {
    cmi_conv_set_kernel(CMI_CONV_DNNL);
    const int wino = cmi_conv_winograd_f32_available();
    const int64_t shapes[][5] = {/* N, Cin, H, W, Cout */
                                 {4, 32, 16, 16, 32}, {3, 64, 8, 8, 64}, {2, 48, 7, 9, 32}, {2, 32, 4, 4, 64}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int cl = 0; cl < 2; cl++) {
            const int64_t N = shapes[s][0], CI = shapes[s][1], H = shapes[s][2], W = shapes[s][3], CO = shapes[s][4];
            const bool bias = s == 2;
            const cfg c = {N, CI, H, W, CO, 3, 3, 1, 1, 1, 1, 1, 1, 1, cl, bias, false};
            double worst[2][3] = {{0}};
            for (int algo = 0; algo < 2; algo++) {
                cmi_conv_set_algo(algo ? CMI_CONV_ALGO_WINOGRAD : CMI_CONV_ALGO_DIRECT);
                cmi_conv_stats_reset();
                const run_mode m = {false, false, false, false};
                conv_run r = run_conv(&c, 900 + s, m);
                cmi_conv_stats st;
                cmi_conv_stats_get(&st);
                for (int p = 0; p < CMI_CONV_N_PASSES; p++)
                    cr_assert(st.dnnl[p] == 1 && st.winograd[p] == (algo && wino) && st.im2col[p] == 0,
                              "shape %zu %s algo %d pass %d: dnnl %lld winograd %lld im2col %lld", s,
                              cl ? "NHWC" : "NCHW", algo, p, (long long)st.dnnl[p], (long long)st.winograd[p], (long long)st.im2col[p]);
                double *x = as_nchw(r.x, cl), *dy = NULL, *w = malloc((size_t)(CO * CI * 9) * 8);
                for (int64_t i = 0; i < CO * CI * 9; i++) w[i] = cm_tensor_get_flat(r.w, i);
                cm_tensor *g = cmt_randn(r.tp, 4, cm_tensor_shape(r.y), 900 + s + 7, false); /* run_conv's dy */
                dy = as_nchw(g, cl);
                conv_ref3 ref = ref_conv3(N, CI, H, W, CO, x, w, dy);
                if (bias) /* y's reference without the bias: take it off (exact enough: b is O(1)) */
                    for (int64_t n = 0; n < N; n++)
                        for (int64_t co = 0; co < CO; co++)
                            for (int64_t i = 0; i < H * W; i++) {
                                ref.y[(n * CO + co) * H * W + i] += cm_tensor_get_flat(r.b, co);
                                ref.ym[(n * CO + co) * H * W + i] += fabs(cm_tensor_get_flat(r.b, co));
                            }
                worst[algo][0] = worst_error(r.y, cl, ref.y, ref.ym);
                worst[algo][1] = worst_error(cm_tensor_grad(r.x), cl, ref.dx, ref.dxm);
                double wworst = 0.0;
                for (int64_t i = 0; i < CO * CI * 9; i++) {
                    const double got = cm_tensor_get_flat(cm_tensor_grad(r.w), i);
                    const double e = fabs(got - ref.dw[i]) / (ref.dwm[i] + 1e-30);
                    if (e > wworst) wworst = e;
                }
                worst[algo][2] = wworst;
                if (bias) {
                    const cm_tensor *db = cm_tensor_grad(r.b);
                    for (int64_t co = 0; co < CO; co++) {
                        double want = 0.0, mag = 0.0;
                        for (int64_t n = 0; n < N; n++)
                            for (int64_t i = 0; i < H * W; i++) {
                                want += dy[(n * CO + co) * H * W + i];
                                mag += fabs(dy[(n * CO + co) * H * W + i]);
                            }
                        cr_assert(fabs(cm_tensor_get_flat(db, co) - want) <= 1e-6 * mag, "shape %zu algo %d db[%lld]",
                                  s, algo, (long long)co);
                    }
                }
                free(x), free(dy), free(w);
                free(ref.y), free(ref.ym), free(ref.dx), free(ref.dxm), free(ref.dw), free(ref.dwm);
                cm_tape_free(r.tp);
            }
            const char *names[3] = {"y", "dx", "dw"};
            for (int i = 0; i < 3; i++)
                for (int algo = 0; algo < 2; algo++) {
                    const double bound = algo ? 5e-6 : 1e-6;
                    cr_assert(worst[algo][i] <= bound, "shape %zu %s %s %s: error %.3g of Σ|products| (bound %.0e)", s,
                              cl ? "channels-last" : "NCHW", algo ? "winograd" : "direct", names[i], worst[algo][i],
                              bound);
                }
        }
    cmi_conv_set_algo(CMI_CONV_ALGO_AUTO);
}

/* Our own bf16 Winograd F(2x2, 3x3) kernel (forward and backward-data, conv_bf16.c) against a
 * double reference on the same bf16 input values and the f32 or bf16 weight: one and several
 * blocks per image, blocks of several tile rows (W 8, 16, 24), 16..64 channels each way, f32 and
 * bf16 results, backward-data added into an f32 result. Its error is the rounding of the
 * transformed input and weight to bf16 (2^-9 relative each) carried through the transforms:
 * measured worst 3.7e-3 of the entry's Σ|products| (the direct kernel, which rounds an f32 weight
 * to bf16 and is exact otherwise: 1.1e-3 on these problems). Bound 1e-2 of Σ|products| (+ half a
 * bf16 ulp for a bf16 result): a wrong tap, tile or transform sign is O(1). And the summed error
 * must stay within 2e-3 of the summed Σ|products|: a systematic bias would show there. */
Test(conv_bf16, own_winograd_kernel_matches_a_double_reference) {
    const cmi_conv_geom probe = {1, 16, 2, 32, 16, 2, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, true};
    if (!cmi_conv_winograd_bf16_fits(&probe)) cr_skip_test("this CPU has no AVX512-BF16: oneDNN's kernels run instead");
    const int64_t shapes[][5] = {/* N, Cin, H, W, Cout */
                                 {2, 16, 4, 32, 16}, {1, 32, 4, 16, 32}, {2, 64, 8, 8, 64}, {1, 16, 8, 8, 32},
                                 {1, 32, 4, 16, 64}, {1, 64, 8, 8, 16},  {1, 32, 8, 24, 32}, {3, 16, 6, 32, 64}};
    check_own_bf16_passes(CMI_CONV_ALGO_WINOGRAD, shapes, sizeof shapes / sizeof shapes[0], 97, 1e-2, 2e-3, true);
    const cmi_conv_geom no[] = {
        {1, 16, 3, 32, 16, 3, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, true}, /* H odd */
        {1, 16, 2, 16, 16, 2, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, true}, /* W 16, one tile row: 8 tiles */
        {1, 16, 4, 8, 16, 4, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},   /* W 8, H 4: 8 tiles */
        {1, 48, 4, 32, 16, 4, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, true}, /* not the direct kernel's (Cin 48) */
    };
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        cr_assert(!cmi_conv_winograd_bf16_fits(&no[i]), "problem %zu is not the Winograd kernel's", i);
}

/* Training with the bf16 Winograd kernels tracks training with the direct ones: ResNet-20 (16/32/64
 * channels, channels-last) under amp_bf16 overfits one batch of 64 N(0,1) images with fixed labels
 * by plain SGD (lr 0.05), 30 steps from the same initial weights, once with CMI_CONV_ALGO_DIRECT and
 * once with AUTO (its 32- and 64-channel forward and backward-data on Winograd: counted). Measured
 * over 60 steps: the losses differ by at most 0.5 % (2.821 -> 0.2468 direct, 0.2454 Winograd);
 * bound 3 % at every step, and the loss must fall below 60 % of its start (it learns at all). */
static void overfit_resnet20(cmi_conv_algo algo, double *losses, int steps, int64_t *wino) {
    cmi_conv_set_algo(algo);
    cm_resnet_config rc;
    cr_assert_eq(cm_resnet_config_preset("resnet20", &rc), CM_OK);
    cm_model *model;
    cr_assert_eq(cm_resnet_model_new(&rc, &model), CM_OK, "%s", cm_last_error());
    cm_module *net = cm_model_module(model);
    cm_tape *tp = cmt_tape();
    const int64_t N = 64, xs[4] = {N, 3, 32, 32}, ys[1] = {N};
    cm_tensor *x, *y; /* off the tape, which is reset every step */
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 4, xs, &x), CM_OK);
    cr_assert_eq(cm_tensor_new(CM_DTYPE_I64, 1, ys, &y), CM_OK);
    cm_rng r = cm_rng_init(5, 0);
    cm_tensor_init_normal(x, &r, 0.0f, 1.0f);
    int64_t *yl = cm_tensor_data(y);
    for (int i = 0; i < N; i++) yl[i] = (i * 7 + 3) % 10;
    const char *names[2] = {"image", "label"};
    cm_tensor *fields[2] = {x, y};
    cm_model_batch b = {names, fields, 2, N, 0};
    cm_module_train(net, true);
    cmi_conv_stats_reset();
    for (int step = 0; step < steps; step++) {
        cm_tape_set_autocast(tp, CM_DTYPE_BF16);
        cm_tensor *loss = cm_model_loss(model, tp, cm_model_forward(model, tp, &b), &b);
        cr_assert(loss, "%s", cm_tape_error(tp));
        losses[step] = cm_tensor_get_flat(loss, 0);
        cr_assert_eq(cm_tape_backward(tp, loss), CM_OK, "%s", cm_tape_error(tp));
        for (int64_t i = 0; i < cm_module_n_params(net); i++) {
            cm_param_info p = cm_module_param_info(net, i);
            const cm_tensor *g = cm_tensor_grad(p.tensor);
            if (!g) continue;
            float *w = cm_tensor_data(p.tensor);
            const float *gv = cm_tensor_data(g);
            for (int64_t k = 0; k < cm_tensor_numel(p.tensor); k++) w[k] -= 0.05f * gv[k];
        }
        cm_module_zero_grad(net);
        cm_tape_reset(tp);
    }
    cmi_conv_stats st;
    cmi_conv_stats_get(&st);
    *wino = st.winograd[CMI_CONV_FWD] + st.winograd[CMI_CONV_BWD_DATA];
    cm_tensor_free(x);
    cm_tensor_free(y);
    cm_tape_free(tp);
    cm_model_free(model);
    cmi_conv_set_algo(CMI_CONV_ALGO_AUTO);
}

Test(conv_bf16, amp_training_with_winograd_tracks_the_direct_kernels) {
    const cmi_conv_geom probe = {1, 32, 16, 16, 32, 16, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, true};
    if (!cmi_conv_winograd_bf16_fits(&probe) || !cmi_bf16_native())
        cr_skip_test("this CPU has no AVX512-BF16: the own bf16 kernels do not run");
    enum { STEPS = 30 };
    double direct[STEPS], wino[STEPS];
    int64_t nd, nw;
    overfit_resnet20(CMI_CONV_ALGO_DIRECT, direct, STEPS, &nd);
    overfit_resnet20(CMI_CONV_ALGO_AUTO, wino, STEPS, &nw);
    /* stages 2 and 3: 5 stride-1 convolutions each, forward and backward-data */
    cr_assert(nd == 0 && nw == STEPS * 2 * 10, "Winograd passes: direct run %lld, auto run %lld (want 0 and %d)",
              (long long)nd, (long long)nw, STEPS * 2 * 10);
    for (int s = 0; s < STEPS; s++)
        cr_assert(fabs(wino[s] - direct[s]) <= 0.03 * direct[s], "step %d: loss %.5f with Winograd, %.5f direct", s,
                  wino[s], direct[s]);
    cr_assert(direct[STEPS - 1] < 0.6 * direct[0], "the loss fell from %.4f to %.4f only", direct[0],
              direct[STEPS - 1]);
}
