/* Layer, batch and group norm and dropout: gradient checks (contiguous, non-contiguous, without
 * weight/bias, training and eval, channels_last), running statistics, dropout's mask, errors.
 *
 * Gradcheck: eps 3e-3, atol 1e-3, rtol 1e-2. Normalised outputs have large third derivatives when a
 * row is short (a group of 8 values, a batch of 2), so the default step 1e-2 leaves a truncation error
 * (~eps^2 f''') of ~2e-3; at 3e-3 it is ~10x smaller, while the f32 forward's rounding contributes
 * ~1e-6/eps = 3e-4. */
#include "cmtest.h"
#include "tensor/dnnl_conv.h"
#include "tensor/dnnl_gemm.h"

#include <math.h>
#include <string.h>

static const cmt_gradcheck_opts k_gc = {3e-3, 1e-3, 1e-2, 48};

/* ---- layer norm ---- */

typedef struct {
    float eps;
} ln_ctx;

/* in: x, weight or NULL, bias or NULL */
static cm_tensor *call_ln(cm_tape *tp, cm_tensor *const *in, void *vctx) {
    return cm_layer_norm(tp, in[0], in[1], in[2], ((ln_ctx *)vctx)->eps);
}

Test(norm, layer_norm_gradcheck_shapes_noncontig_and_optional_params) {
    cm_tape *tp = cmt_tape();
    ln_ctx c = {1e-5f};
    const int64_t shapes[][3] = {{4, 7, 0}, {2, 3, 5}, {1, 1, 0}, {3, 1, 16}};
    const int nds[] = {2, 3, 2, 3};
    for (int k = 0; k < 4; k++) {
        const int nd = nds[k];
        const int64_t C = shapes[k][nd - 1];
        cm_tensor *x = cmt_randn(tp, nd, shapes[k], 1 + k, true);
        cm_tensor *w = cmt_randn(tp, 1, &C, 10 + k, true), *b = cmt_randn(tp, 1, &C, 20 + k, true);
        cm_tensor *in[3] = {x, w, b};
        if (C > 1) cmt_gradcheck("layer_norm", call_ln, &c, 3, in, &k_gc);
        cm_tensor *in_nowb[3] = {x, NULL, NULL};
        if (C > 1) cmt_gradcheck("layer_norm (no weight/bias)", call_ln, &c, 3, in_nowb, &k_gc);
        cm_tensor *in_w[3] = {x, w, NULL};
        if (C > 1) cmt_gradcheck("layer_norm (weight only)", call_ln, &c, 3, in_w, &k_gc);
    }
    /* non-contiguous x (transposed storage) and only weight/bias requiring grad */
    const int64_t s[3] = {2, 6, 5}, C = 5;
    cm_tensor *xn = cmt_randn_noncontig(tp, 3, s, 40, true);
    cm_tensor *w = cmt_randn(tp, 1, &C, 41, true), *b = cmt_randn(tp, 1, &C, 42, true);
    cm_tensor *in[3] = {xn, w, b};
    cmt_gradcheck("layer_norm (non-contiguous x)", call_ln, &c, 3, in, &k_gc);
    cm_tensor *xc = cmt_randn(tp, 3, s, 43, false);
    cm_tensor *in2[3] = {xc, w, b};
    cmt_gradcheck("layer_norm (only params need grad)", call_ln, &c, 3, in2, &k_gc);
    cm_tape_free(tp);
}

Test(norm, layer_norm_forward_rows_have_zero_mean_unit_variance) {
    cm_tape *tp = cmt_tape();
    const int64_t s[2] = {5, 64};
    cm_tensor *x = cmt_rand_uniform(tp, 2, s, 3, 100.0f, 104.0f, false); /* large offset: two-pass stats */
    cm_tensor *y = cm_layer_norm(tp, x, NULL, NULL, 0.0f);
    cr_assert(y, "%s", cm_tape_error(tp));
    for (int r = 0; r < 5; r++) {
        double m = 0, v = 0;
        for (int c = 0; c < 64; c++) m += cm_tensor_get_flat(y, r * 64 + c);
        m /= 64;
        for (int c = 0; c < 64; c++) v += pow(cm_tensor_get_flat(y, r * 64 + c) - m, 2);
        v /= 64;
        cr_assert(fabs(m) < 1e-4 && fabs(v - 1) < 1e-3, "row %d: mean %g var %g (tol 1e-4, 1e-3)", r, m, v);
    }
    cm_tape_free(tp);
}

/* ---- batch norm ---- */

typedef struct {
    cm_batch_norm_opts o;
    cm_tensor *rm, *rv;
} bn_ctx;

static cm_tensor *call_bn(cm_tape *tp, cm_tensor *const *in, void *vctx) {
    bn_ctx *c = vctx;
    return cm_batch_norm(tp, in[0], in[1], in[2], c->rm, c->rv, &c->o);
}

Test(norm, batch_norm_gradcheck_train_eval_channels_last_and_optional_params) {
    cm_tape *tp = cmt_tape();
    const int64_t shapes[][4] = {{4, 3, 0, 0}, {2, 3, 4, 5}, {3, 2, 5, 0}, {2, 4, 1, 3}};
    const int nds[] = {2, 4, 3, 4};
    for (int k = 0; k < 4; k++) {
        for (int cl = 0; cl < 2; cl++) {
            const int nd = nds[k];
            const int64_t C = shapes[k][cl ? nd - 1 : 1];
            cm_tensor *x = cmt_randn(tp, nd, shapes[k], 1 + k, true);
            cm_tensor *w = cmt_randn(tp, 1, &C, 10 + k, true), *b = cmt_randn(tp, 1, &C, 20 + k, true);
            cm_tensor *rm = cmt_randn(tp, 1, &C, 30 + k, false);
            cm_tensor *rv = cmt_rand_uniform(tp, 1, &C, 31 + k, 0.5f, 2.0f, false);
            bn_ctx c = {cm_batch_norm_opts_default(), rm, rv};
            c.o.channels_last = cl;
            cm_tensor *in[3] = {x, w, b};
            cmt_gradcheck("batch_norm train", call_bn, &c, 3, in, &k_gc);
            cm_tensor *in_nowb[3] = {x, NULL, NULL};
            c.rm = c.rv = NULL;
            cmt_gradcheck("batch_norm train (no weight/bias, no running stats)", call_bn, &c, 3, in_nowb, &k_gc);
            c.rm = rm;
            c.rv = rv;
            c.o.training = false;
            cmt_gradcheck("batch_norm eval", call_bn, &c, 3, in, &k_gc);
            cmt_gradcheck("batch_norm eval (no weight/bias)", call_bn, &c, 3, in_nowb, &k_gc);
        }
    }
    /* non-contiguous x */
    const int64_t s[3] = {2, 3, 4}, C = 3;
    cm_tensor *xn = cmt_randn_noncontig(tp, 3, s, 50, true);
    cm_tensor *w = cmt_randn(tp, 1, &C, 51, true), *b = cmt_randn(tp, 1, &C, 52, true);
    bn_ctx c = {cm_batch_norm_opts_default(), NULL, NULL};
    cm_tensor *in[3] = {xn, w, b};
    cmt_gradcheck("batch_norm train (non-contiguous x)", call_bn, &c, 3, in, &k_gc);
    cm_tape_free(tp);
}

Test(norm, batch_norm_updates_running_stats_with_unbiased_variance) {
    cm_tape *tp = cmt_tape();
    /* x (2, 2, 2): channel 0 holds {1, 2, 5, 6}, channel 1 holds {0, 0, 4, 4} */
    const float xv[8] = {1, 2, 0, 0, 5, 6, 4, 4};
    const int64_t s[3] = {2, 2, 2}, C = 2;
    cm_tensor *x = cm_empty(tp, CM_DTYPE_F32, 3, s);
    memcpy(cm_tensor_data(x), xv, sizeof xv);
    cm_tensor *rm, *rv;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 1, &C, &rm), CM_OK);
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 1, &C, &rv), CM_OK);
    cm_tensor_fill(rm, 1.0);
    cm_tensor_fill(rv, 1.0);
    cm_batch_norm_opts o = cm_batch_norm_opts_default();
    o.momentum = 0.25f;
    cm_tensor *y = cm_batch_norm(tp, x, NULL, NULL, rm, rv, &o);
    cr_assert(y, "%s", cm_tape_error(tp));
    /* ch0: mean 3.5, biased var 4.25, unbiased 17/3; ch1: mean 2, biased var 4, unbiased 16/3 */
    const float want_rm[2] = {0.75f + 0.25f * 3.5f, 0.75f + 0.25f * 2.0f};
    const float want_rv[2] = {0.75f + 0.25f * 17.0f / 3.0f, 0.75f + 0.25f * 16.0f / 3.0f};
    cmt_assert_close_f32("running_mean", cm_tensor_data(rm), want_rm, 2, 1e-6, 1e-6);
    cmt_assert_close_f32("running_var", cm_tensor_data(rv), want_rv, 2, 1e-6, 1e-6);
    /* normalised with the biased variance */
    cr_assert_float_eq(cm_tensor_get_flat(y, 0), (1 - 3.5) / sqrt(4.25 + 1e-5), 1e-5);
    cr_assert_float_eq(cm_tensor_get_flat(y, 2), (0 - 2.0) / sqrt(4.0 + 1e-5), 1e-5);
    /* eval uses the running statistics and leaves them alone */
    o.training = false;
    cm_tensor *ye = cm_batch_norm(tp, x, NULL, NULL, rm, rv, &o);
    cr_assert(ye);
    cr_assert_float_eq(cm_tensor_get_flat(ye, 0), (1 - want_rm[0]) / sqrt(want_rv[0] + 1e-5), 1e-5);
    cmt_assert_close_f32("running_mean after eval", cm_tensor_data(rm), want_rm, 2, 0, 0);
    /* channels_last on the permuted tensor gives the same statistics */
    cm_tensor_fill(rm, 1.0);
    cm_tensor_fill(rv, 1.0);
    const int perm[3] = {0, 2, 1};
    o.training = true;
    o.channels_last = true;
    cm_tensor *ycl = cm_batch_norm(tp, cm_permute(tp, x, perm), NULL, NULL, rm, rv, &o);
    cr_assert(ycl, "%s", cm_tape_error(tp));
    cmt_assert_close_f32("running_mean (channels_last)", cm_tensor_data(rm), want_rm, 2, 1e-6, 1e-6);
    cmt_assert_close_f32("running_var (channels_last)", cm_tensor_data(rv), want_rv, 2, 1e-6, 1e-6);
    cmt_assert_close("channels_last output", cm_permute(tp, ycl, perm), y, 1e-6, 1e-6);
    cm_tensor_free(rm);
    cm_tensor_free(rv);
    cm_tape_free(tp);
}

/* cm_batch_norm_add_relu against the three ops it fuses (each gradchecked on its own): outputs,
 * running statistics and the gradients of x, weight, bias and residual agree to f32 round-off
 * (same formulas, the ReLU mask from the output), in training and eval, NCHW and channels_last,
 * without a residual and with a strided one. A gradcheck of the fused op itself would sit on the
 * ReLU kink for some of the random values. */
/* Two pairs of long-lived running statistics (C) at the same start values (mean 0.25, var 1.5), one
 * for each of two runs to compare; the caller frees them. */
static void running_stats(int64_t C, cm_tensor **rm, cm_tensor **rv) {
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 1, &C, &rm[k]), CM_OK);
        cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 1, &C, &rv[k]), CM_OK);
        cm_tensor_fill(rm[k], 0.25);
        cm_tensor_fill(rv[k], 1.5);
    }
}

Test(norm, batch_norm_add_relu_matches_the_unfused_ops) {
    const int64_t s4[4] = {3, 4, 5, 6}, C4 = 4, scl[4] = {3, 5, 6, 4};
    for (int cl = 0; cl < 2; cl++)
        for (int train = 0; train < 2; train++)
            for (int rk = 0; rk < 3; rk++) { /* residual: none, contiguous, strided view */
                cm_tape *tp = cmt_tape();
                const int64_t *shape = cl ? scl : s4;
                cm_tensor *x = cmt_randn(tp, 4, shape, 1, true);
                cm_tensor *w = cmt_randn(tp, 1, &C4, 2, true), *b = cmt_randn(tp, 1, &C4, 3, true);
                cm_tensor *res = rk == 0 ? NULL : rk == 1 ? cmt_randn(tp, 4, shape, 4, true)
                                                          : cmt_randn_noncontig(tp, 4, shape, 4, true);
                cm_tensor *g = cmt_randn(tp, 4, shape, 5, false);
                cm_tensor *rm[2], *rv[2];
                running_stats(C4, rm, rv);
                cm_batch_norm_opts o = cm_batch_norm_opts_default();
                o.channels_last = cl;
                o.training = train;
                cm_tensor *y0 = cm_batch_norm(tp, x, w, b, rm[0], rv[0], &o);
                if (res) y0 = cm_add(tp, y0, res);
                y0 = cm_relu(tp, y0);
                cr_assert(y0, "%s", cm_tape_error(tp));
                cr_assert_eq(cm_tape_backward_with(tp, y0, g), CM_OK, "%s", cm_tape_error(tp));
                cm_tensor *ref[4] = {cm_clone_detached(tp, cm_tensor_grad(x)), cm_clone_detached(tp, cm_tensor_grad(w)),
                                     cm_clone_detached(tp, cm_tensor_grad(b)),
                                     res ? cm_clone_detached(tp, cm_tensor_grad(res)) : NULL};
                cm_tensor *leaves[4] = {x, w, b, res};
                for (int k = 0; k < 4; k++) cm_tensor_zero_grad(leaves[k]);
                cm_tensor *y1 = cm_batch_norm_add_relu(tp, x, w, b, rm[1], rv[1], res, &o);
                cr_assert(y1, "%s", cm_tape_error(tp));
                char what[96];
                snprintf(what, sizeof what, "cl %d train %d residual %d", cl, train, rk);
                cmt_assert_close(what, y1, y0, 1e-6, 1e-6);
                cmt_assert_close_f32("running_mean", cm_tensor_data(rm[1]), cm_tensor_data(rm[0]), C4, 0, 0);
                cmt_assert_close_f32("running_var", cm_tensor_data(rv[1]), cm_tensor_data(rv[0]), C4, 0, 0);
                cr_assert_eq(cm_tape_backward_with(tp, y1, g), CM_OK, "%s", cm_tape_error(tp));
                const char *names[4] = {"grad x", "grad weight", "grad bias", "grad residual"};
                for (int k = 0; k < 4; k++)
                    if (leaves[k]) cmt_assert_close(names[k], cm_tensor_grad(leaves[k]), ref[k], 1e-5, 1e-5);
                for (int k = 0; k < 2; k++) cm_tensor_free(rm[k]), cm_tensor_free(rv[k]);
                cm_tape_free(tp);
            }
}

/* On intermediate x and residual (tensors with a node) the backward writes their new gradients
 * instead of adding to zeroed ones; on a poisoning tape (new arena memory is NaN) any element it
 * failed to write shows up. The reference is the same op on leaves (whose gradients are zeroed and
 * added to): grad x0 = 1.5 · grad x, grad r0 = 0.5 · grad r. Also the residual being x itself. */
Test(norm, batch_norm_add_relu_writes_fresh_gradients_of_intermediates) {
    const int64_t s4[4] = {3, 4, 5, 6}, C4 = 4, scl[4] = {3, 5, 6, 4};
    for (int cl = 0; cl < 2; cl++)
        for (int rk = 0; rk < 3; rk++) { /* residual: none, another tensor, x itself */
            cm_tape *tp = cmt_tape(); /* poisoning */
            const int64_t *shape = cl ? scl : s4;
            cm_tensor *x0 = cmt_randn(tp, 4, shape, 1, true), *r0 = cmt_randn(tp, 4, shape, 4, true);
            cm_tensor *w = cmt_randn(tp, 1, &C4, 2, true), *b = cmt_randn(tp, 1, &C4, 3, true);
            cm_tensor *g = cmt_randn(tp, 4, shape, 5, false);
            cm_batch_norm_opts o = cm_batch_norm_opts_default();
            o.channels_last = cl;
            /* reference: leaves holding the same values */
            cm_tensor *xl = cm_clone_detached(tp, cm_mul_scalar(tp, x0, 1.5f));
            cm_tensor *rl = cm_clone_detached(tp, cm_mul_scalar(tp, r0, 0.5f));
            cm_tensor_set_requires_grad(xl, true);
            cm_tensor_set_requires_grad(rl, true);
            cm_tensor *yl = cm_batch_norm_add_relu(tp, xl, w, b, NULL, NULL, rk == 0 ? NULL : rk == 1 ? rl : xl, &o);
            cr_assert(yl, "%s", cm_tape_error(tp));
            cr_assert_eq(cm_tape_backward_with(tp, yl, g), CM_OK, "%s", cm_tape_error(tp));
            cm_tensor *gxl = cm_mul_scalar(tp, cm_tensor_grad(xl), 1.5f);
            cm_tensor *grl = rk == 1 ? cm_mul_scalar(tp, cm_tensor_grad(rl), 0.5f) : NULL;
            cm_tensor *x = cm_mul_scalar(tp, x0, 1.5f); /* intermediates */
            cm_tensor *res = rk == 0 ? NULL : rk == 1 ? cm_mul_scalar(tp, r0, 0.5f) : x;
            cm_tensor *y = cm_batch_norm_add_relu(tp, x, w, b, NULL, NULL, res, &o);
            cr_assert(y, "%s", cm_tape_error(tp));
            cmt_assert_close("forward", y, yl, 1e-6, 1e-6);
            cr_assert_eq(cm_tape_backward_with(tp, y, g), CM_OK, "%s", cm_tape_error(tp));
            char what[96];
            snprintf(what, sizeof what, "grad x (cl %d, residual %d)", cl, rk);
            cmt_assert_close(what, cm_tensor_grad(x0), gxl, 1e-5, 1e-5);
            if (rk == 1) cmt_assert_close("grad residual", cm_tensor_grad(r0), grl, 1e-5, 1e-5);
            cm_tape_free(tp);
        }
}

/* An f32 leaf holding t's values (any dtype, any strides), for a reference on the same values. */
static cm_tensor *f32_leaf(cm_tape *tp, cm_tensor *t) {
    cm_tensor *l = cm_clone_detached(tp, cm_cast(tp, t, CM_DTYPE_F32));
    cr_assert(l, "%s", cm_tape_error(tp));
    cm_tensor_set_requires_grad(l, true);
    return l;
}

/* got (bf16) against want (f32) rounded to bf16: each element within one bf16 ulp, and at most 1% of
 * them not exactly the rounded value (the f32 results may differ in the last bits, since the bf16
 * kernels may sum in another order; truncating instead of rounding would miss half of them). */
static void assert_bf16_rounding(const char *what, cm_tape *tp, const cm_tensor *got, cm_tensor *want) {
    cr_assert_eq(cm_tensor_dtype(got), CM_DTYPE_BF16, "%s: output dtype %s, want bf16", what,
                 cm_dtype_name(cm_tensor_dtype(got)));
    cm_tensor *r = cm_cast(tp, want, CM_DTYPE_BF16);
    cr_assert(r, "%s", cm_tape_error(tp));
    cmt_assert_close(what, got, r, 1e-30, 1.0 / 128); /* < 2 ulp: 1 ulp is 2^-8 to 2^-7 of the value */
    const int64_t n = cm_tensor_numel(got);
    int64_t off = 0;
    for (int64_t i = 0; i < n; i++) off += cm_tensor_get_flat(got, i) != cm_tensor_get_flat(r, i);
    cr_assert(off * 100 <= n, "%s: %lld of %lld values are not the f32 result rounded to nearest even", what,
              (long long)off, (long long)n);
}

/* bf16 x (a cast of an f32 leaf, so its gradient reaches the leaf) with a residual that is none,
 * f32, bf16, strided f32 or strided bf16, against the f32 op on the same values (f32 leaves): the
 * output is bf16 and is the f32 output rounded to nearest even (assert_bf16_rounding); the running
 * statistics and the f32 gradients of x, weight, bias and residual agree to f32 round-off (the
 * ReLU masks agree: a positive f32 rounds to a positive bf16). cm_batch_norm
 * and cm_batch_norm_add_relu, NCHW and channels_last, training and eval, short rows and rows long
 * enough for the vector loops' main bodies. */
Test(norm, batch_norm_bf16_x_and_residual_match_f32_on_the_same_values) {
    const int64_t shapes[2][2][4] = {{{3, 4, 5, 6}, {3, 5, 6, 4}}, {{2, 19, 6, 11}, {2, 6, 11, 19}}};
    for (int sz = 0; sz < 2; sz++)
        for (int cl = 0; cl < 2; cl++)
            for (int train = 0; train < 2; train++)
                for (int rk = -1; rk < 5; rk++) { /* -1: cm_batch_norm; add_relu with residual none,
                                                     f32, bf16, strided f32, strided bf16 */
                    cm_tape *tp = cmt_tape();
                    const int64_t *shape = shapes[sz][cl], C = shape[cl ? 3 : 1];
                    const int64_t tshape[4] = {shape[0], shape[1], shape[3], shape[2]};
                    cm_tensor *x32 = cmt_randn(tp, 4, shape, 1, true);
                    cm_tensor *x = cm_cast(tp, x32, CM_DTYPE_BF16), *xl = f32_leaf(tp, x);
                    cm_tensor *w = cmt_randn(tp, 1, &C, 2, true), *b = cmt_randn(tp, 1, &C, 3, true);
                    cm_tensor *r32 = NULL, *res = NULL;
                    if (rk == 1 || rk == 2) r32 = cmt_randn(tp, 4, shape, 4, true);
                    if (rk == 3) r32 = cmt_randn_noncontig(tp, 4, shape, 4, true);
                    if (rk == 4) r32 = cmt_randn(tp, 4, tshape, 4, true);
                    res = rk == 2 ? cm_cast(tp, r32, CM_DTYPE_BF16)
                          : rk == 4 ? cm_transpose(tp, cm_cast(tp, r32, CM_DTYPE_BF16), 2, 3)
                                    : r32;
                    cm_tensor *rl = res ? f32_leaf(tp, res) : NULL;
                    cm_tensor *g = cmt_randn(tp, 4, shape, 5, false);
                    cm_tensor *rm[2], *rv[2];
                    running_stats(C, rm, rv);
                    cm_batch_norm_opts o = cm_batch_norm_opts_default();
                    o.channels_last = cl;
                    o.training = train;
                    cm_tensor *y0 = rk < 0 ? cm_batch_norm(tp, xl, w, b, rm[0], rv[0], &o)
                                           : cm_batch_norm_add_relu(tp, xl, w, b, rm[0], rv[0], rl, &o);
                    cr_assert(y0, "%s", cm_tape_error(tp));
                    cr_assert_eq(cm_tape_backward_with(tp, y0, g), CM_OK, "%s", cm_tape_error(tp));
                    cm_tensor *ref[4] = {cm_tensor_grad(xl), cm_clone_detached(tp, cm_tensor_grad(w)),
                                         cm_clone_detached(tp, cm_tensor_grad(b)), rl ? cm_tensor_grad(rl) : NULL};
                    cm_tensor_zero_grad(w);
                    cm_tensor_zero_grad(b);
                    cm_tensor *y1 = rk < 0 ? cm_batch_norm(tp, x, w, b, rm[1], rv[1], &o)
                                           : cm_batch_norm_add_relu(tp, x, w, b, rm[1], rv[1], res, &o);
                    cr_assert(y1, "%s", cm_tape_error(tp));
                    char what[128];
                    snprintf(what, sizeof what, "size %d cl %d train %d residual %d", sz, cl, train, rk);
                    assert_bf16_rounding(what, tp, y1, y0);
                    cmt_assert_close_f32("running_mean", cm_tensor_data(rm[1]), cm_tensor_data(rm[0]), C, 1e-7, 1e-6);
                    cmt_assert_close_f32("running_var", cm_tensor_data(rv[1]), cm_tensor_data(rv[0]), C, 1e-7, 1e-6);
                    cr_assert_eq(cm_tape_backward_with(tp, y1, g), CM_OK, "%s", cm_tape_error(tp));
                    cm_tensor *gr = r32 ? cm_tensor_grad(r32) : NULL;
                    if (rk == 4) gr = cm_transpose(tp, gr, 2, 3);
                    cm_tensor *got[4] = {cm_tensor_grad(x32), cm_tensor_grad(w), cm_tensor_grad(b), gr};
                    const char *names[4] = {"grad x", "grad weight", "grad bias", "grad residual"};
                    for (int k = 0; k < 4; k++) {
                        if (!ref[k]) continue;
                        char gw[192];
                        snprintf(gw, sizeof gw, "%s (%s)", names[k], what);
                        cr_assert_eq(cm_tensor_dtype(got[k]), CM_DTYPE_F32, "%s: dtype", gw);
                        cmt_assert_close(gw, got[k], ref[k], 1e-5, 1e-5);
                    }
                    for (int k = 0; k < 2; k++) cm_tensor_free(rm[k]), cm_tensor_free(rv[k]);
                    cm_tape_free(tp);
                }
}

/* As batch_norm_add_relu_writes_fresh_gradients_of_intermediates for bf16 x: an intermediate bf16 x
 * and residual get fresh f32 gradients, every element written (a poisoning tape shows any that is
 * not); the reference is the op on f32 leaves holding the same values. */
Test(norm, batch_norm_add_relu_bf16_writes_fresh_gradients_of_intermediates) {
    const int64_t s4[4] = {3, 4, 5, 6}, C4 = 4, scl[4] = {3, 5, 6, 4};
    for (int cl = 0; cl < 2; cl++)
        for (int rk = 0; rk < 4; rk++) { /* residual: none, bf16, f32, x itself */
            cm_tape *tp = cmt_tape(); /* poisoning */
            const int64_t *shape = cl ? scl : s4;
            cm_tensor *x0 = cmt_randn(tp, 4, shape, 1, true), *r0 = cmt_randn(tp, 4, shape, 4, true);
            cm_tensor *w = cmt_randn(tp, 1, &C4, 2, true), *b = cmt_randn(tp, 1, &C4, 3, true);
            cm_tensor *g = cmt_randn(tp, 4, shape, 5, false);
            cm_batch_norm_opts o = cm_batch_norm_opts_default();
            o.channels_last = cl;
            cm_tensor *x = cm_cast(tp, cm_mul_scalar(tp, x0, 1.5f), CM_DTYPE_BF16); /* intermediates */
            cm_tensor *res = rk == 0   ? NULL
                             : rk == 1 ? cm_cast(tp, cm_mul_scalar(tp, r0, 0.5f), CM_DTYPE_BF16)
                             : rk == 2 ? cm_mul_scalar(tp, r0, 0.5f)
                                       : x;
            /* reference: f32 leaves holding the same values */
            cm_tensor *xl = f32_leaf(tp, x), *rl = res && rk != 3 ? f32_leaf(tp, res) : NULL;
            cm_tensor *yl = cm_batch_norm_add_relu(tp, xl, w, b, NULL, NULL, rk == 3 ? xl : rl, &o);
            cr_assert(yl, "%s", cm_tape_error(tp));
            cr_assert_eq(cm_tape_backward_with(tp, yl, g), CM_OK, "%s", cm_tape_error(tp));
            cm_tensor *gxl = cm_mul_scalar(tp, cm_tensor_grad(xl), 1.5f);
            cm_tensor *grl = rl ? cm_mul_scalar(tp, cm_tensor_grad(rl), 0.5f) : NULL;
            cm_tensor *y = cm_batch_norm_add_relu(tp, x, w, b, NULL, NULL, res, &o);
            cr_assert(y, "%s", cm_tape_error(tp));
            assert_bf16_rounding("forward", tp, y, yl);
            cr_assert_eq(cm_tape_backward_with(tp, y, g), CM_OK, "%s", cm_tape_error(tp));
            char what[96];
            snprintf(what, sizeof what, "grad x (cl %d, residual %d)", cl, rk);
            cmt_assert_close(what, cm_tensor_grad(x0), gxl, 1e-5, 1e-5);
            if (rl) cmt_assert_close("grad residual", cm_tensor_grad(r0), grl, 1e-5, 1e-5);
            cm_tape_free(tp);
        }
}

/* The point of fusing: the op allocates its output only, where the three ops keep the batch norm's
 * output and the sum as well. */
Test(norm, batch_norm_add_relu_keeps_two_tensors_fewer) {
    cm_tape *tp = cmt_tape();
    const int64_t s[4] = {8, 16, 32, 32}, C = 16;
    const size_t bytes = sizeof(float) * 8 * 16 * 32 * 32;
    cm_tensor *x = cmt_randn(tp, 4, s, 1, true), *res = cmt_randn(tp, 4, s, 2, true);
    cm_tensor *w = cmt_randn(tp, 1, &C, 3, true), *b = cmt_randn(tp, 1, &C, 4, true);
    /* one big chunk first, so no allocation below skips a chunk's tail */
    const size_t m = cm_arena_mark(cm_tape_arena(tp));
    cr_assert(cm_arena_alloc(cm_tape_arena(tp), 64u << 20));
    cm_arena_rewind(cm_tape_arena(tp), m);
    size_t u0 = cm_arena_used(cm_tape_arena(tp));
    cr_assert(cm_relu(tp, cm_add(tp, cm_batch_norm(tp, x, w, b, NULL, NULL, NULL), res)));
    size_t u1 = cm_arena_used(cm_tape_arena(tp));
    cr_assert(cm_batch_norm_add_relu(tp, x, w, b, NULL, NULL, res, NULL));
    size_t u2 = cm_arena_used(cm_tape_arena(tp));
    cr_assert(u2 - u1 < bytes + bytes / 8 && u1 - u0 >= 3 * bytes, "fused %zu bytes, unfused %zu (one tensor %zu)",
              u2 - u1, u1 - u0, bytes);
    cm_tape_free(tp);
}

/* ---- group norm ---- */

typedef struct {
    int64_t groups;
} gn_ctx;

static cm_tensor *call_gn(cm_tape *tp, cm_tensor *const *in, void *vctx) {
    return cm_group_norm(tp, in[0], ((gn_ctx *)vctx)->groups, in[1], in[2], 1e-5f);
}

Test(norm, group_norm_gradcheck_shapes_noncontig_and_optional_params) {
    cm_tape *tp = cmt_tape();
    const int64_t shapes[][4] = {{2, 6, 4, 0}, {2, 4, 3, 2}, {3, 4, 0, 0}, {1, 6, 5, 0}};
    const int nds[] = {3, 4, 2, 3};
    const int64_t groups[] = {3, 2, 2, 6};
    for (int k = 0; k < 4; k++) {
        const int64_t C = shapes[k][1];
        gn_ctx c = {groups[k]};
        cm_tensor *x = cmt_randn(tp, nds[k], shapes[k], 1 + k, true);
        cm_tensor *w = cmt_randn(tp, 1, &C, 10 + k, true), *b = cmt_randn(tp, 1, &C, 20 + k, true);
        cm_tensor *in[3] = {x, w, b};
        cmt_gradcheck("group_norm", call_gn, &c, 3, in, &k_gc);
        cm_tensor *in_nowb[3] = {x, NULL, NULL};
        cmt_gradcheck("group_norm (no weight/bias)", call_gn, &c, 3, in_nowb, &k_gc);
    }
    const int64_t s[3] = {2, 4, 3}, C = 4;
    gn_ctx c = {2};
    cm_tensor *xn = cmt_randn_noncontig(tp, 3, s, 60, true);
    cm_tensor *w = cmt_randn(tp, 1, &C, 61, true), *b = cmt_randn(tp, 1, &C, 62, true);
    cm_tensor *in[3] = {xn, w, b};
    cmt_gradcheck("group_norm (non-contiguous x)", call_gn, &c, 3, in, &k_gc);
    cm_tape_free(tp);
}

Test(norm, group_norm_with_one_group_per_channel_matches_per_channel_stats) {
    cm_tape *tp = cmt_tape();
    const int64_t s[3] = {2, 3, 8};
    cm_tensor *x = cmt_randn(tp, 3, s, 5, false);
    cm_tensor *y = cm_group_norm(tp, x, 3, NULL, NULL, 0.0f);
    cr_assert(y, "%s", cm_tape_error(tp));
    const float *xv = cm_tensor_data(x);
    for (int r = 0; r < 6; r++) {
        double m = 0, v = 0;
        for (int i = 0; i < 8; i++) m += xv[r * 8 + i];
        m /= 8;
        for (int i = 0; i < 8; i++) v += pow(xv[r * 8 + i] - m, 2);
        v /= 8;
        for (int i = 0; i < 8; i++)
            cr_assert_float_eq(cm_tensor_get_flat(y, r * 8 + i), (xv[r * 8 + i] - m) / sqrt(v), 1e-5);
    }
    cm_tape_free(tp);
}

/* ---- dropout ---- */

Test(norm, dropout_mask_is_reproducible_and_advances_counter) {
    cm_tape *tp = cmt_tape();
    const int64_t s[2] = {50, 41}; /* 2050 elements: not a multiple of 4 */
    const int64_t n = 2050;
    cm_tensor *x = cm_full(tp, CM_DTYPE_F32, 2, s, 1.0);
    cm_rng r1 = cm_rng_init(7, 3), r2 = cm_rng_init(7, 3);
    r1.counter = r2.counter = 100;
    cm_tensor *a = cm_dropout(tp, x, 0.3f, true, &r1);
    cm_tensor *b = cm_dropout(tp, x, 0.3f, true, &r2);
    cr_assert(a && b, "%s", cm_tape_error(tp));
    cr_assert_eq(r1.counter, 100 + (n + 3) / 4, "counter advanced by %llu, want ceil(n/4) = %lld",
                 (unsigned long long)(r1.counter - 100), (long long)((n + 3) / 4));
    cmt_assert_close("same rng state -> same mask", a, b, 0, 0);
    /* the mask is element i = uniform at word i of the stream from the counter >= p */
    int64_t kept = 0;
    for (int64_t i = 0; i < n; i++) {
        const float u = cm_rng_uniform_at(7, 3, 100 * 4 + (uint64_t)i);
        const double want = u >= 0.3f ? 1.0 / 0.7 : 0.0;
        cr_assert_float_eq(cm_tensor_get_flat(a, i), want, 1e-6, "element %lld", (long long)i);
        kept += u >= 0.3f;
    }
    /* the next call continues the stream: a different mask */
    cm_tensor *c = cm_dropout(tp, x, 0.3f, true, &r1);
    int64_t diff = 0;
    for (int64_t i = 0; i < n; i++) diff += cm_tensor_get_flat(a, i) != cm_tensor_get_flat(c, i);
    cr_assert(diff > n / 5, "a new counter gives a new mask: only %lld of %lld differ", (long long)diff, (long long)n);
    /* mean of the mask ≈ 1 - p: binomial sd sqrt(n p (1-p)) / n ≈ 0.01; allow 5 sd */
    const double frac = (double)kept / (double)n;
    cr_assert(fabs(frac - 0.7) < 0.05, "kept fraction %g, want 0.7 ± 0.05", frac);
    cm_tape_free(tp);
}

Test(norm, dropout_gradient_is_mask_over_keep_probability) {
    cm_tape *tp = cmt_tape();
    const int64_t s[2] = {7, 9};
    cm_tensor *x = cmt_randn_noncontig(tp, 2, s, 8, true);
    cm_rng r = cm_rng_init(11, 0);
    cm_tensor *y = cm_dropout(tp, x, 0.4f, true, &r);
    cr_assert(y, "%s", cm_tape_error(tp));
    cm_tensor *g = cmt_randn(tp, 2, s, 9, false);
    cr_assert_eq(cm_tape_backward_with(tp, y, g), CM_OK, "%s", cm_tape_error(tp));
    const cm_tensor *gx = cm_tensor_grad(x);
    cr_assert(gx);
    for (int64_t i = 0; i < 63; i++) {
        const double yi = cm_tensor_get_flat(y, i), xi = cm_tensor_get_flat(x, i), gi = cm_tensor_get_flat(g, i);
        const double m = yi == 0.0 ? 0.0 : 1.0 / 0.6; /* x is N(0,1): never exactly 0 */
        cr_assert_float_eq(yi, xi * m, 1e-6, "y[%lld]", (long long)i);
        cr_assert_float_eq(cm_tensor_get_flat(gx, i), gi * m, 1e-6, "dx[%lld]: want g·mask/(1-p)", (long long)i);
    }
    cm_tape_free(tp);
}

Test(norm, dropout_identity_cases_and_p_one) {
    cm_tape *tp = cmt_tape();
    const int64_t s[1] = {10};
    cm_tensor *x = cmt_randn(tp, 1, s, 1, true);
    cm_rng r = cm_rng_init(1, 0);
    cr_assert_eq(cm_dropout(tp, x, 0.5f, false, &r), x, "eval is the identity");
    cr_assert_eq(cm_dropout(tp, x, 0.0f, true, &r), x, "p = 0 is the identity");
    cr_assert_eq(r.counter, 0, "identity consumes no random numbers");
    cm_tensor *z = cm_dropout(tp, x, 1.0f, true, &r);
    cr_assert(z, "%s", cm_tape_error(tp));
    for (int i = 0; i < 10; i++) cr_assert_eq(cm_tensor_get_flat(z, i), 0.0, "p = 1 zeroes everything");
    cm_tape_free(tp);
}

/* ---- errors ---- */

static void expect_error(cm_tape *tp, cm_status want, const char *must_contain) {
    cmt_expect_error(tp, NULL, want, must_contain, NULL);
    cm_tape_reset(tp);
}

Test(norm, batch_norm_add_relu_bad_residual_is_an_error_naming_both_shapes) {
    cm_tape *tp = cmt_tape();
    const int64_t s[3] = {2, 6, 4}, s2[3] = {2, 6, 5};
    cm_tensor *x = cmt_randn(tp, 3, s, 1, false);
    cr_assert_null(cm_batch_norm_add_relu(tp, x, NULL, NULL, NULL, NULL, cmt_randn(tp, 3, s2, 2, false), NULL));
    cmt_expect_error(tp, NULL, CM_ERR_SHAPE, "batch_norm_add_relu: residual (2, 6, 5)", "x (2, 6, 4)", NULL);
    cm_tape_reset(tp);
    cm_tape_free(tp);
}

/* x and residual must be f32 or bf16; the message names the op, the tensor, its shape and dtype. */
Test(norm, batch_norm_other_dtypes_are_errors_naming_op_shape_and_dtype) {
    cm_tape *tp = cmt_tape();
    const int64_t s[3] = {2, 6, 4};
    cr_assert_null(cm_batch_norm(tp, cm_zeros(tp, CM_DTYPE_I32, 3, s), NULL, NULL, NULL, NULL, NULL));
    cmt_expect_error(tp, NULL, CM_ERR_DTYPE, "batch_norm: 'x' (2, 6, 4) has dtype i32", "f32 or bf16", "cm_cast",
                     NULL);
    cm_tape_reset(tp);
    cm_tensor *x = cm_cast(tp, cmt_randn(tp, 3, s, 1, false), CM_DTYPE_BF16);
    cr_assert_null(cm_batch_norm_add_relu(tp, x, NULL, NULL, NULL, NULL, cm_zeros(tp, CM_DTYPE_I32, 3, s), NULL));
    cmt_expect_error(tp, NULL, CM_ERR_DTYPE, "batch_norm_add_relu: 'residual' (2, 6, 4) has dtype i32",
                     "f32 or bf16", "cm_cast", NULL);
    cm_tape_reset(tp);
    cr_assert_null(
        cm_batch_norm_add_relu(tp, cm_zeros(tp, CM_DTYPE_I64, 3, s), NULL, NULL, NULL, NULL, NULL, NULL));
    cmt_expect_error(tp, NULL, CM_ERR_DTYPE, "batch_norm_add_relu: 'x' (2, 6, 4) has dtype i64", NULL);
    cm_tape_free(tp);
}

Test(norm, bad_inputs_are_errors_naming_op_and_shapes) {
    cm_tape *tp = cmt_tape();
    const int64_t s[3] = {2, 6, 4}, c5 = 5, c6 = 6;
    cm_tensor *x = cmt_randn(tp, 3, s, 1, false);
    cm_tensor *w5 = cmt_randn(tp, 1, &c5, 2, false);
    cr_assert_null(cm_layer_norm(tp, x, w5, NULL, 1e-5f));
    expect_error(tp, CM_ERR_SHAPE, "layer_norm: weight (5,)");
    x = cmt_randn(tp, 3, s, 1, false);
    cr_assert_null(cm_layer_norm(tp, x, NULL, NULL, -1.0f));
    expect_error(tp, CM_ERR_INVALID_ARG, "eps");
    x = cmt_randn(tp, 3, s, 1, false);
    cr_assert_null(cm_group_norm(tp, x, 4, NULL, NULL, 1e-5f));
    expect_error(tp, CM_ERR_INVALID_ARG, "4 groups do not divide the 6 channels");
    x = cmt_randn(tp, 3, s, 1, false);
    cm_batch_norm_opts o = cm_batch_norm_opts_default();
    o.training = false;
    cr_assert_null(cm_batch_norm(tp, x, NULL, NULL, NULL, NULL, &o));
    expect_error(tp, CM_ERR_INVALID_ARG, "eval mode needs running_mean");
    x = cmt_randn(tp, 3, s, 1, false);
    cm_tensor *b5 = cmt_randn(tp, 1, &c5, 3, false);
    cr_assert_null(cm_batch_norm(tp, x, NULL, b5, NULL, NULL, NULL));
    expect_error(tp, CM_ERR_SHAPE, "batch_norm: bias (5,)");
    x = cmt_randn(tp, 3, s, 1, false);
    cm_tensor *rm = cmt_randn(tp, 1, &c6, 3, false);
    o.training = true;
    o.channels_last = true; /* channels = 4 */
    cr_assert_null(cm_batch_norm(tp, x, NULL, NULL, rm, rm, &o));
    expect_error(tp, CM_ERR_SHAPE, "running_mean (6,) must be 1-d with 4 entries");
    const int64_t one[2] = {1, 3};
    x = cmt_randn(tp, 2, one, 1, false);
    cr_assert_null(cm_batch_norm(tp, x, NULL, NULL, NULL, NULL, NULL));
    expect_error(tp, CM_ERR_SHAPE, "more than one value per channel");
    x = cmt_randn(tp, 3, s, 1, false);
    cm_rng r = cm_rng_init(0, 0);
    cr_assert_null(cm_dropout(tp, x, 1.5f, true, &r));
    expect_error(tp, CM_ERR_INVALID_ARG, "dropout: p 1.5");
    x = cmt_randn(tp, 3, s, 1, false);
    cm_tensor *xi = cm_zeros(tp, CM_DTYPE_I64, 3, s);
    cr_assert_null(cm_layer_norm(tp, xi, NULL, NULL, 1e-5f));
    expect_error(tp, CM_ERR_DTYPE, "layer_norm");
    cm_tape_free(tp);
}

/* ---- large inputs: the parallel kernels (per-thread partial sums) against a double reference ---- */

Test(norm, layer_norm_and_channels_last_batch_norm_parallel_paths_match_double_reference) {
    cm_tape *tp = cmt_tape();
    enum { R = 512, C = 80 }; /* R·C = 40960 >= CMI_PAR_MIN */
    const int64_t s[2] = {R, C}, cs = C;
    for (int op = 0; op < 2; op++) {
        cm_tensor *x = cmt_randn(tp, 2, s, 70 + op, true);
        cm_tensor *w = cmt_randn(tp, 1, &cs, 72, true), *b = cmt_randn(tp, 1, &cs, 73, true);
        cm_tensor *g = cmt_randn(tp, 2, s, 74, false);
        cm_batch_norm_opts o = cm_batch_norm_opts_default();
        o.channels_last = true;
        cm_tensor *y = op == 0 ? cm_layer_norm(tp, x, w, b, 1e-5f) : cm_batch_norm(tp, x, w, b, NULL, NULL, &o);
        cr_assert(y, "%s", cm_tape_error(tp));
        cr_assert_eq(cm_tape_backward_with(tp, y, g), CM_OK, "%s", cm_tape_error(tp));
        const float *xv = cm_tensor_data(x), *wv = cm_tensor_data(w), *gv = cm_tensor_data(g);
        const float *dx = cm_tensor_data(cm_tensor_grad(x)), *dw = cm_tensor_data(cm_tensor_grad(w)),
                    *db = cm_tensor_data(cm_tensor_grad(b));
        /* groups: rows for layer norm (stride 1 within, C between), columns for batch norm */
        const int n_grp = op == 0 ? R : C, len = op == 0 ? C : R;
        const int step = op == 0 ? 1 : C, gstep = op == 0 ? C : 1;
        double *rdw = calloc(C, sizeof(double)), *rdb = calloc(C, sizeof(double));
        for (int k = 0; k < n_grp; k++) {
            double m = 0, v = 0, a = 0, c2 = 0;
            for (int j = 0; j < len; j++) m += xv[k * gstep + j * step];
            m /= len;
            for (int j = 0; j < len; j++) v += pow(xv[k * gstep + j * step] - m, 2);
            const double rs = 1.0 / sqrt(v / len + 1e-5);
            for (int j = 0; j < len; j++) {
                const int e = k * gstep + j * step, c = e % C;
                const double xh = (xv[e] - m) * rs;
                cr_assert(fabs(cm_tensor_get_flat(y, e) - (xh * wv[c] + ((float *)cm_tensor_data(b))[c])) < 1e-4,
                          "op %d y[%d]", op, e);
                a += gv[e] * wv[c];
                c2 += gv[e] * wv[c] * xh;
                rdw[c] += gv[e] * xh;
                rdb[c] += gv[e];
            }
            a /= len;
            c2 /= len;
            for (int j = 0; j < len; j++) {
                const int e = k * gstep + j * step, c = e % C;
                const double want = rs * (gv[e] * wv[c] - a - (xv[e] - m) * rs * c2);
                cr_assert(fabs(dx[e] - want) <= 1e-4 + 1e-3 * fabs(want), "op %d dx[%d] %g vs %g (tol 1e-4 + 1e-3 rel)",
                          op, e, dx[e], want);
            }
        }
        for (int c = 0; c < C; c++) {
            cr_assert(fabs(dw[c] - rdw[c]) <= 1e-3 + 1e-4 * fabs(rdw[c]), "op %d dw[%d] %g vs %g", op, c, dw[c], rdw[c]);
            cr_assert(fabs(db[c] - rdb[c]) <= 1e-3 + 1e-4 * fabs(rdb[c]), "op %d db[%d] %g vs %g", op, c, db[c], rdb[c]);
        }
        free(rdw);
        free(rdb);
    }
    cm_tape_free(tp);
}

/* Channels-last batch norm runs its row loops with the channel count a compile-time constant for 16,
 * 32 and 64 channels (CMI_BY_C in norm.c) and at run time otherwise; NCHW runs the plane loops, which
 * share none of that. Each width (and 24, the run-time one) against NCHW on the same values (the
 * channels-last x permuted on the tape, so both gradients reach one leaf): f32 and bf16 x,
 * cm_batch_norm, cm_batch_norm_add_relu without a residual (its ReLU mask recomputed from x) and
 * with one, training and eval, fresh gradients (x an intermediate) and accumulated ones (a leaf),
 * serial and parallel sizes with a partial last block of rows. */
Test(norm, channels_last_batch_norm_of_16_32_64_channels_matches_nchw) {
    const int64_t widths[4] = {16, 32, 64, 24}, sizes[2][3] = {{2, 3, 5}, {9, 15, 17}}; /* N, H, W */
    const int to_nchw[4] = {0, 3, 1, 2}, to_cl[4] = {0, 2, 3, 1};
    for (int wi = 0; wi < 4; wi++)
        for (int sz = 0; sz < 2; sz++)
            for (int bf = 0; bf < 2; bf++)
                for (int rk = -1; rk < 2; rk++) /* cm_batch_norm; add_relu without, with a residual */
                    for (int train = 0; train < 2; train++) {
                        const int64_t C = widths[wi], *s = sizes[sz], shape[4] = {s[0], s[1], s[2], C};
                        const bool leaf = !bf && train; /* bf16 x is a cast: an intermediate */
                        cm_tape *tp = cmt_tape();
                        cm_tensor *x0 = cmt_randn(tp, 4, shape, 80 + (uint64_t)wi, true);
                        cm_tensor *x = bf ? cm_cast(tp, x0, CM_DTYPE_BF16) : leaf ? x0 : cm_mul_scalar(tp, x0, 1.0f);
                        cm_tensor *r0 = rk == 1 ? cmt_randn(tp, 4, shape, 90 + (uint64_t)wi, true) : NULL;
                        cm_tensor *r = r0 && bf ? cm_cast(tp, r0, CM_DTYPE_BF16) : r0;
                        cm_tensor *w = cmt_randn(tp, 1, &C, 2, true), *b = cmt_randn(tp, 1, &C, 3, true);
                        cm_tensor *g = cmt_randn(tp, 4, shape, 5, false);
                        cm_tensor *rm[2], *rv[2];
                        running_stats(C, rm, rv);
                        cm_tensor *y[2], *grads[2][4];
                        for (int nc = 0; nc < 2; nc++) { /* 0: channels-last, 1: NCHW */
                            cm_batch_norm_opts o = cm_batch_norm_opts_default();
                            o.channels_last = !nc;
                            o.training = train;
                            cm_tensor *xi = nc ? cm_contiguous(tp, cm_permute(tp, x, to_nchw)) : x;
                            cm_tensor *ri = r && nc ? cm_contiguous(tp, cm_permute(tp, r, to_nchw)) : r;
                            cm_tensor *gi = nc ? cm_contiguous(tp, cm_permute(tp, g, to_nchw)) : g;
                            y[nc] = rk < 0 ? cm_batch_norm(tp, xi, w, b, rm[nc], rv[nc], &o)
                                           : cm_batch_norm_add_relu(tp, xi, w, b, rm[nc], rv[nc], ri, &o);
                            cr_assert(y[nc] && gi, "%s", cm_tape_error(tp));
                            cr_assert_eq(cm_tape_backward_with(tp, y[nc], gi), CM_OK, "%s", cm_tape_error(tp));
                            cm_tensor *leaves[4] = {x0, w, b, r0};
                            for (int k = 0; k < 4; k++) {
                                grads[nc][k] = leaves[k] ? cm_clone_detached(tp, cm_tensor_grad(leaves[k])) : NULL;
                                if (leaves[k]) cm_tensor_zero_grad(leaves[k]);
                            }
                        }
                        char what[160];
                        snprintf(what, sizeof what, "C %lld, N %lld, %s x, %s, %s", (long long)C, (long long)s[0],
                                 bf ? "bf16" : "f32", rk < 0 ? "batch_norm" : rk ? "add_relu + residual" : "add_relu",
                                 train ? "training" : "eval");
                        const double tol = bf ? 1.0 / 128 : 1e-5; /* bf16 outputs: within one rounding */
                        cmt_assert_close(what, y[0], cm_permute(tp, y[1], to_cl), 1e-5, tol);
                        if (train)
                            cmt_assert_close_f32("running_var", cm_tensor_data(rv[0]), cm_tensor_data(rv[1]), C, 1e-7,
                                                 1e-6);
                        const char *names[4] = {"grad x", "grad weight", "grad bias", "grad residual"};
                        for (int k = 0; k < 4; k++) {
                            if (!grads[0][k]) continue;
                            char gw[224];
                            snprintf(gw, sizeof gw, "%s (%s)", names[k], what);
                            cmt_assert_close(gw, grads[0][k], grads[1][k], 1e-5, 1e-4);
                        }
                        for (int k = 0; k < 2; k++) cm_tensor_free(rm[k]), cm_tensor_free(rv[k]);
                        cm_tape_free(tp);
                    }
}

/* ---- a bf16 batch norm output's gradient written in bf16 by the bf16 convolution consuming it ---- */

/* One ResNet-like stage under autocast: x (f32 leaf) -> conv1 (3x3, bf16 result) -> batch norm
 * (plain or with its fused ReLU) -> h (bf16) -> consumer; leaves x, w1, bn weight, bn bias (and w2).
 * mode 0: consumer conv2 (3x3, f32 result); h's gradient is new when conv2 runs, so conv2 writes it
 *         in bf16 and batch norm reads it so;
 *      1: as 0 plus 0·h added to conv2's result: that f32 consumer runs first, so h's gradient is
 *         f32 and conv2 adds its f32 dx to it (the f32 path, same values up to dx's rounding);
 *      2: as 0 on a tape with retain_grads: h's gradient is kept, f32;
 *      3: consumer a 1x1 identity convolution (f32 result): h's gradient is the upstream gradient,
 *         written in bf16;
 *      4: consumer cast to f32: h's gradient is the upstream gradient in f32.
 * g: the upstream gradient (f32, z's shape); h_dtype: the dtype of h's gradient batch norm read. */
typedef struct {
    cm_tape *tp;
    cm_tensor *grads[5]; /* x, w1, bn weight, bn bias, w2 (NULL in modes 3 and 4) */
    cm_dtype h_dtype;
    cm_tensor *h_kept; /* mode 2: h's gradient after backward */
} bn16_run;

static bn16_run bn16_stage(const int64_t *xshape, int64_t C, bool cl, bool add_relu, int mode, const float *g) {
    bn16_run r = {0};
    cm_tape_config tc = cm_tape_config_default();
    tc.poison = true; /* new arena memory is NaN: an element the bf16 writes miss shows */
    tc.retain_grads = mode == 2;
    cr_assert_eq(cm_tape_new(&tc, &r.tp), CM_OK);
    cm_tape *tp = r.tp;
    const int64_t Cin = xshape[cl ? 3 : 1];
    const int64_t w1s[4] = {C, Cin, 3, 3}, w2s[4] = {C, C, 3, 3}, ids[4] = {C, C, 1, 1};
    cm_tensor *x = cmt_randn(tp, 4, xshape, 90, true), *w1 = cmt_randn(tp, 4, w1s, 91, true);
    cm_tensor *bw = cmt_randn(tp, 1, &C, 92, true), *bb = cmt_randn(tp, 1, &C, 93, true);
    cm_tensor *w2 = mode < 3 ? cmt_randn(tp, 4, w2s, 94, true) : NULL;
    if (mode == 3) {
        w2 = cm_zeros(tp, CM_DTYPE_F32, 4, ids);
        cr_assert(w2, "%s", cm_tape_error(tp));
        for (int64_t c = 0; c < C; c++) ((float *)cm_tensor_data(w2))[c * C + c] = 1.0f;
    }
    cm_conv2d_opts o1 = cm_conv2d_opts_default(), o2 = o1;
    o1.padding[0] = o1.padding[1] = 1;
    o1.channels_last = o2.channels_last = cl;
    o1.out_bf16 = true;
    if (mode < 3) o2.padding[0] = o2.padding[1] = 1;
    cm_batch_norm_opts bo = cm_batch_norm_opts_default();
    bo.channels_last = cl;
    cm_tape_set_autocast(tp, CM_DTYPE_BF16);
    cm_tensor *y1 = cm_conv2d(tp, x, w1, NULL, &o1);
    cm_tensor *h = add_relu ? cm_batch_norm_add_relu(tp, y1, bw, bb, NULL, NULL, NULL, &bo)
                            : cm_batch_norm(tp, y1, bw, bb, NULL, NULL, &bo);
    cr_assert(h && cm_tensor_dtype(h) == CM_DTYPE_BF16, "%s", cm_tape_error(tp));
    cm_tensor *z = mode == 4 ? cm_cast(tp, h, CM_DTYPE_F32) : cm_conv2d(tp, h, w2, NULL, &o2);
    if (mode == 1) z = cm_add(tp, z, cm_mul_scalar(tp, cm_cast(tp, h, CM_DTYPE_F32), 0.0f));
    cr_assert(z && cm_tensor_dtype(z) == CM_DTYPE_F32, "%s", cm_tape_error(tp));
    cm_tensor *gt = cm_zeros(tp, CM_DTYPE_F32, 4, cm_tensor_shape(z));
    cr_assert(gt, "%s", cm_tape_error(tp));
    memcpy(cm_tensor_data(gt), g, sizeof(float) * (size_t)cm_tensor_numel(z));
    cmt_grad_probe pr = {h, add_relu ? "batch_norm_add_relu" : "batch_norm", 0, CM_DTYPE_COUNT};
    cm_tape_set_backward_hook(tp, cmt_grad_probe_hook, &pr);
    cr_assert_eq(cm_tape_backward_with(tp, z, gt), CM_OK, "%s", cm_tape_error(tp));
    cr_assert_eq(pr.seen, 1, "batch norm's node ran %d times with h's gradient there", pr.seen);
    r.h_dtype = pr.dtype;
    r.h_kept = mode == 2 ? cm_tensor_grad(h) : NULL;
    cm_tensor *leaves[5] = {x, w1, bw, bb, mode < 3 ? w2 : NULL};
    for (int i = 0; i < 5; i++) {
        r.grads[i] = leaves[i] ? cm_tensor_grad(leaves[i]) : NULL;
        cr_assert(!leaves[i] || (r.grads[i] && cm_tensor_dtype(r.grads[i]) == CM_DTYPE_F32));
    }
    return r;
}

/* The relative L2 distance ||a - b|| / ||b||. */
static double rel_l2(const cm_tensor *a, const cm_tensor *b) {
    double dd = 0, nn = 0;
    for (int64_t e = 0; e < cm_tensor_numel(b); e++) {
        const double u = cm_tensor_get_flat(a, e), v = cm_tensor_get_flat(b, e);
        dd += (u - v) * (u - v), nn += v * v;
    }
    return sqrt(dd / nn);
}

/* conv (bf16 result) -> batch norm (plain, or with the fused ReLU) -> h -> conv under autocast: the
 * consuming convolution writes h's new gradient in bf16 (cmi_grad_for_write_as; the gradient
 * batch norm reads is bf16, seen in a backward hook), on oneDNN's bf16 kernel (backward-data
 * writing diff_src in bf16 itself: counted, none unimplemented), the widened kernel and im2col
 * (both computing dx in f32 and rounding it), NCHW and channels-last, a small stage (arena
 * gradients, poisoned) and one large enough for the parallel loops (N·C·H·W = CMI_PAR_MIN).
 *   - Against the f32 path (mode 1 of bn16_stage: another consumer of h first, so h's gradient is
 *     f32): the runs differ only by the rounding of dx (h's gradient) to bf16, at most u = 2^-8 of
 *     each element (8 significant bits), 1.65e-3 relative L2 as measured here. Batch norm's backward
 *     is linear in that gradient (per channel w·rstd times a projection), and its weight and bias
 *     gradients are per-channel sums of it: the same relative error, up to ~2x where a channel's
 *     sum cancels (16 channels; measured up to 3.5e-3). Batch norm's dx is then rounded to bf16 for
 *     conv1 in both runs, and where the two values differ by ~1.65e-3 a rounding lands one ulp (2u)
 *     apart with probability about 1.65e-3/2u: sqrt(0.2)·2u ≈ 3.5e-3 RMS more, 2.8e-3 measured for
 *     grad x and w1. Bound: relative L2 error <= 2u = 7.8e-3, about twice the largest measured; a
 *     wrong read or an unwritten (NaN) element is orders of magnitude beyond it.
 *   - retain_grads (mode 2) keeps h's gradient in f32 and takes the f32 path: bitwise mode 1's.
 *   - Batch norm alone (modes 3 and 4): h's gradient of bf16-exact values, read in bf16 (a 1x1
 *     identity convolution writes it) or in f32 (a cast): bitwise the same gradients. */
Test(norm, batch_norm_reads_a_bf16_gradient_of_its_bf16_output_from_a_bf16_convolution) {
    const int64_t sizes[2][4] = {{2, 8, 6, 6}, {8, 8, 16, 16}}; /* N, Cin, H, W */
    const int64_t C = 16;
    for (int kern = 0; kern < 4; kern++) { /* oneDNN bf16, widened, im2col, own bf16 kernels where they fit */
        if ((kern == 0 || kern == 3) && !cmi_bf16_native()) continue;
        cmi_conv_set_kernel(kern == 2 ? CMI_CONV_IM2COL : CMI_CONV_DNNL);
        cmi_conv_set_bf16_kernel(kern == 0 || kern == 3 ? CMI_CONV_BF16_ONEDNN : CMI_CONV_BF16_WIDEN);
        cmi_conv_set_own_passes(kern == 3 ? 7u : 0u);
        for (int sz = 0; sz < 2; sz++)
            for (int cl = 0; cl < 2; cl++)
                for (int ar = 0; ar < 2; ar++) {
                    const int64_t *s = sizes[sz];
                    const int64_t xs[4] = {s[0], cl ? s[2] : s[1], cl ? s[3] : s[2], cl ? s[1] : s[3]};
                    const int64_t zn = s[0] * C * s[2] * s[3];
                    float *g = malloc(sizeof(float) * (size_t)zn);
                    cm_rng rng = cm_rng_init(95, 0);
                    cm_rng_normal(&rng, g, (size_t)zn, 0.0f, 1.0f);
                    for (int64_t e = 0; e < zn; e++) { /* bf16-exact: modes 3 and 4 compare bitwise */
                        uint32_t u;
                        memcpy(&u, &g[e], 4);
                        u &= 0xffff0000u;
                        memcpy(&g[e], &u, 4);
                    }
                    char what[160];
                    snprintf(what, sizeof what, "kernel %s, N %lld, %s, %s",
                             kern == 0 ? "onednn" : kern == 1 ? "widen" : kern == 2 ? "im2col" : "own", (long long)s[0],
                             cl ? "channels-last" : "NCHW", ar ? "batch_norm_add_relu" : "batch_norm");
                    bn16_run r[5];
                    for (int mode = 0; mode < 5; mode++) {
                        cmi_conv_stats_reset();
                        r[mode] = bn16_stage(xs, C, cl, ar, mode, g);
                        const cm_dtype want = mode == 0 || mode == 3 ? CM_DTYPE_BF16 : CM_DTYPE_F32;
                        cr_assert_eq(r[mode].h_dtype, want, "%s mode %d: batch norm read h's gradient in %s, want %s",
                                     what, mode, cm_dtype_name(r[mode].h_dtype), cm_dtype_name(want));
                        cmi_conv_stats st;
                        cmi_conv_stats_get(&st);
                        cr_assert_eq(st.unimplemented, 0, "%s mode %d", what, mode);
                        if ((kern == 0 || kern == 3) && mode == 0)
                            cr_assert(st.dnnl_bf16[CMI_CONV_BWD_DATA] + st.own_bf16[CMI_CONV_BWD_DATA] == 2 &&
                                          st.widened[CMI_CONV_BWD_DATA] == 0 &&
                                          (kern == 3 || st.own_bf16[CMI_CONV_BWD_DATA] == 0),
                                      "%s: %lld backward-data passes on oneDNN bf16 and %lld on the own kernel (want "
                                      "2), %lld widened",
                                      what, (long long)st.dnnl_bf16[CMI_CONV_BWD_DATA],
                                      (long long)st.own_bf16[CMI_CONV_BWD_DATA],
                                      (long long)st.widened[CMI_CONV_BWD_DATA]);
                        if (kern == 3 && mode == 0 && cl && sz == 1) /* conv 16 -> 16, 3x3 pad 1, 16x16: the own kernel */
                            cr_assert(st.own_bf16[CMI_CONV_BWD_DATA] == 1, "%s: h's bf16 gradient from the own kernel",
                                      what);
                    }
                    cr_assert(r[2].h_kept && cm_tensor_dtype(r[2].h_kept) == CM_DTYPE_F32,
                              "%s: retain_grads keeps h's gradient, in f32", what);
                    const char *names[5] = {"grad x", "grad w1", "grad bn weight", "grad bn bias", "grad w2"};
                    for (int i = 0; i < 5; i++) {
                        char w[256];
                        const double d = rel_l2(r[0].grads[i], r[1].grads[i]);
                        cr_assert(d <= 0x1p-7, "%s %s: bf16 vs f32 gradient of h: relative L2 error %.3g > 2^-7",
                                  what, names[i], d);
                        snprintf(w, sizeof w, "%s %s: retain_grads vs the f32 path", what, names[i]);
                        cmt_assert_close(w, r[2].grads[i], r[1].grads[i], 0, 0);
                        if (i == 4) continue;
                        snprintf(w, sizeof w, "%s %s: h's gradient read in bf16 vs the same values in f32", what,
                                 names[i]);
                        cmt_assert_close(w, r[3].grads[i], r[4].grads[i], 0, 0);
                    }
                    for (int mode = 0; mode < 5; mode++) cm_tape_free(r[mode].tp);
                    free(g);
                }
    }
    cmi_conv_set_kernel(CMI_CONV_DNNL);
    cmi_conv_set_bf16_kernel(cmi_bf16_native() ? CMI_CONV_BF16_ONEDNN : CMI_CONV_BF16_WIDEN);
    cmi_conv_set_own_passes(7u);
}
