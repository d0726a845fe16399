/* Cross-entropy and MSE: gradient checks over target kinds (i64 / i32 class indices with
 * ignore_index, probabilities), label smoothing, reductions, (N, C) and (N, C, d1, d2) shapes and
 * strided logits; forward values against a double reference; the all-ignored NaN rule; errors.
 *
 * cm_linear_cross_entropy (the fused lm head + loss): gradchecks over chunk sizes, smoothing,
 * reductions, ignored rows and (..., C) inputs, equality with cm_linear + cm_cross_entropy in f32
 * and under autocast, and its errors.
 *
 * Tolerances: gradchecks use the defaults (eps 1e-2, atol 1e-3, rtol 1e-2) — the losses are smooth
 * and, with 5-7 classes, third derivatives are O(1) so truncation is ~1e-5. Forward values are
 * compared with a double reference at 1e-5 (f32 logits, double accumulation). */
#include "cmtest.h"

#include <math.h>
#include <stdio.h>

typedef struct {
    cm_cross_entropy_opts o;
} ce_case;

static cm_tensor *call_ce(cm_tape *tp, cm_tensor *const *in, void *vctx) {
    return cm_cross_entropy(tp, in[0], in[1], &((const ce_case *)vctx)->o);
}

/* Sets every `every`-th target to ignore_index. */
static void ignore_some(cm_tensor *t, int64_t ignore, int every) {
    for (int64_t i = 0; i < cm_tensor_numel(t); i += every) ((int64_t *)cm_tensor_data(t))[i] = ignore;
}

/* A probability tensor (softmax of random values along axis 1), as a leaf. */
static cm_tensor *rand_probs(cm_tape *tp, int nd, const int64_t *shape, uint64_t seed, bool grad) {
    cm_tensor *r = cmt_randn(tp, nd, shape, seed, false);
    cm_tensor *p = cm_clone_detached(tp, cm_softmax(tp, r, 1));
    cr_assert(p);
    if (grad) cm_tensor_set_requires_grad(p, true);
    return p;
}

Test(cross_entropy, gradcheck_index_targets_smoothing_reductions_and_shapes) {
    const int64_t s2[2] = {6, 5}, t2[1] = {6}, s4[4] = {2, 4, 3, 2}, t4[3] = {2, 3, 2};
    const float smooth[2] = {0.0f, 0.1f};
    const cm_reduction reds[3] = {CM_REDUCTION_MEAN, CM_REDUCTION_SUM, CM_REDUCTION_NONE};
    for (int shp = 0; shp < 3; shp++)
        for (int si = 0; si < 2; si++)
            for (int ri = 0; ri < 3; ri++) {
                cm_tape *tp = cmt_tape();
                ce_case c = {cm_cross_entropy_opts_default()};
                c.o.label_smoothing = smooth[si];
                c.o.reduction = reds[ri];
                cm_tensor *x, *t;
                if (shp == 0) {
                    x = cmt_randn(tp, 2, s2, 100 + ri, true);
                    t = cmt_randint(tp, 1, t2, 200 + ri, 0, 5);
                } else if (shp == 1) {
                    x = cmt_randn_noncontig(tp, 2, s2, 110 + ri, true);
                    t = cmt_randint(tp, 1, t2, 210 + ri, 0, 5);
                    c.o.ignore_index = 2; /* a valid class used as ignore_index */
                } else {
                    x = cmt_randn(tp, 4, s4, 120 + ri, true);
                    t = cmt_randint(tp, 3, t4, 220 + ri, 0, 4);
                }
                ignore_some(t, c.o.ignore_index, 4);
                char name[80];
                snprintf(name, sizeof name, "ce shape %d smoothing %g reduction %d", shp, (double)smooth[si], ri);
                cm_tensor *in[2] = {x, t};
                cmt_gradcheck(name, call_ce, &c, 2, in, NULL);
                cm_tape_free(tp);
            }
}

Test(cross_entropy, gradcheck_probability_targets_for_logits_and_targets) {
    const int64_t s2[2] = {4, 7}, s3[3] = {3, 4, 5};
    for (int shp = 0; shp < 2; shp++)
        for (int ri = 0; ri < 3; ri++) {
            cm_tape *tp = cmt_tape();
            ce_case c = {cm_cross_entropy_opts_default()};
            c.o.label_smoothing = ri == 1 ? 0.0f : 0.2f;
            c.o.reduction = (cm_reduction)ri;
            const int nd = shp ? 3 : 2;
            const int64_t *s = shp ? s3 : s2;
            cm_tensor *x = shp ? cmt_randn_noncontig(tp, nd, s, 300 + ri, true) : cmt_randn(tp, nd, s, 300 + ri, true);
            cm_tensor *p = rand_probs(tp, nd, s, 400 + ri, true);
            cm_tensor *in[2] = {x, p};
            cmt_gradcheck("ce soft targets", call_ce, &c, 2, in, NULL);
            cm_tape_free(tp);
        }
}

Test(cross_entropy, i32_targets_match_i64_targets) {
    cm_tape *tp = cmt_tape();
    int64_t s[2] = {5, 3}, ts[1] = {5};
    cm_tensor *x = cmt_randn(tp, 2, s, 1, false);
    cm_tensor *t64 = cmt_randint(tp, 1, ts, 2, 0, 3);
    ignore_some(t64, -100, 3);
    cm_tensor *t32 = cm_cast(tp, t64, CM_DTYPE_I32);
    cm_tensor *a = cm_cross_entropy(tp, x, t64, NULL), *b = cm_cross_entropy(tp, x, t32, NULL);
    cr_assert(a && b, "%s", cm_tape_error(tp));
    cmt_assert_close("i32 vs i64", b, a, 0, 0);
    cm_tape_free(tp);
}

/* Reference loss of one position in double. */
static double ref_ce_pos(const cm_tensor *x, int64_t n, int64_t s, int64_t S, int64_t C, int64_t t, float eps) {
    const float *xv = cm_tensor_data(x);
    double mx = -INFINITY, se = 0, sx = 0;
    for (int64_t k = 0; k < C; k++) mx = fmax(mx, xv[(n * C + k) * S + s]);
    for (int64_t k = 0; k < C; k++) {
        se += exp(xv[(n * C + k) * S + s] - mx);
        sx += xv[(n * C + k) * S + s];
    }
    const double lse = mx + log(se);
    return (1 - eps) * (lse - xv[(n * C + t) * S + s]) + eps * (lse - sx / (double)C);
}

Test(cross_entropy, forward_matches_reference_with_ignore_and_smoothing) {
    cm_tape *tp = cmt_tape();
    const int64_t N = 4, C = 6, S = 3;
    int64_t s[3] = {N, C, S}, ts[2] = {N, S};
    cm_tensor *x = cmt_randn(tp, 3, s, 5, false);
    cm_tensor *t = cmt_randint(tp, 2, ts, 6, 0, C);
    ignore_some(t, -100, 5);
    const int64_t *tv = cm_tensor_data(t);
    for (int ri = 0; ri < 3; ri++) {
        cm_cross_entropy_opts o = cm_cross_entropy_opts_default();
        o.label_smoothing = 0.1f;
        o.reduction = (cm_reduction)ri;
        cm_tensor *l = cm_cross_entropy(tp, x, t, &o);
        cr_assert(l, "%s", cm_tape_error(tp));
        double total = 0;
        int64_t cnt = 0;
        for (int64_t n = 0; n < N; n++)
            for (int64_t j = 0; j < S; j++) {
                const int64_t tt = tv[n * S + j];
                const double v = tt == -100 ? 0.0 : ref_ce_pos(x, n, j, S, C, tt, 0.1f);
                cnt += tt != -100;
                total += v;
                if (ri == CM_REDUCTION_NONE)
                    cr_assert(fabs(cm_tensor_get_flat(l, n * S + j) - v) < 1e-5, "none [%lld,%lld]: %g vs %g",
                              (long long)n, (long long)j, cm_tensor_get_flat(l, n * S + j), v);
            }
        if (ri == CM_REDUCTION_NONE) continue;
        cr_assert_eq(cm_tensor_ndim(l), 0);
        const double want = ri == CM_REDUCTION_MEAN ? total / (double)cnt : total;
        cr_assert(fabs(cm_tensor_get_flat(l, 0) - want) < 1e-5 * (1 + fabs(want)), "reduction %d: %g vs %g", ri,
                  cm_tensor_get_flat(l, 0), want);
    }
    cm_tape_free(tp);
}

Test(cross_entropy, all_targets_ignored_gives_nan_mean_and_zero_gradient) {
    cm_tape *tp = cmt_tape();
    int64_t s[2] = {3, 4}, ts[1] = {3};
    cm_tensor *x = cmt_randn(tp, 2, s, 1, true);
    cm_tensor *t = cm_full(tp, CM_DTYPE_I64, 1, ts, -100);
    cm_tensor *l = cm_cross_entropy(tp, x, t, NULL);
    cr_assert(l && isnan(cm_tensor_get_flat(l, 0)), "mean over zero targets is NaN, as torch");
    cr_assert_eq(cm_tape_backward(tp, l), CM_OK, "%s", cm_tape_error(tp));
    for (int i = 0; i < 12; i++) cr_assert_eq(((float *)cm_tensor_data(cm_tensor_grad(x)))[i], 0.0f);
    cm_cross_entropy_opts o = cm_cross_entropy_opts_default();
    o.reduction = CM_REDUCTION_SUM;
    cm_tensor *ls = cm_cross_entropy(tp, x, t, &o);
    cr_assert(ls && cm_tensor_get_flat(ls, 0) == 0.0, "sum over zero targets is 0");
    cm_tape_free(tp);
}

Test(cross_entropy, large_batch_parallel_path_matches_reference) {
    cm_tape *tp = cmt_tape();
    int64_t s[2] = {512, 100}, ts[1] = {512};
    cm_tensor *x = cmt_randn(tp, 2, s, 8, true);
    cm_tensor *t = cmt_randint(tp, 1, ts, 9, 0, 100);
    cm_tensor *l = cm_cross_entropy(tp, x, t, NULL);
    cr_assert(l);
    double want = 0;
    for (int64_t n = 0; n < 512; n++) want += ref_ce_pos(x, n, 0, 1, 100, ((int64_t *)cm_tensor_data(t))[n], 0.0f);
    want /= 512;
    cr_assert(fabs(cm_tensor_get_flat(l, 0) - want) < 1e-5, "%g vs %g", cm_tensor_get_flat(l, 0), want);
    cr_assert_eq(cm_tape_backward(tp, l), CM_OK);
    /* each row's gradient sums to zero (softmax - onehot) */
    const float *g = cm_tensor_data(cm_tensor_grad(x));
    for (int64_t n = 0; n < 512; n += 37) {
        double rs = 0;
        for (int k = 0; k < 100; k++) rs += g[n * 100 + k];
        cr_assert(fabs(rs) < 1e-7, "row %lld gradient sum %g", (long long)n, rs);
    }
    cm_tape_free(tp);
}

Test(cross_entropy, bad_targets_and_options_are_errors_naming_values) {
    int64_t s[3] = {2, 5, 3}, ts[2] = {2, 3};
    cm_tape *tp = cmt_tape();
    cm_tensor *x = cmt_randn(tp, 3, s, 1, false);
    cm_tensor *t = cmt_randint(tp, 2, ts, 2, 0, 5);
    ((int64_t *)cm_tensor_data(t))[5] = 7; /* position (1, 2) */
    cr_assert_null(cm_cross_entropy(tp, x, t, NULL));
    cr_assert_eq(cm_tape_status(tp), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_tape_error(tp), "target(1, 2) = 7") && strstr(cm_tape_error(tp), "[0, 5)"), "%s",
              cm_tape_error(tp));
    cm_tape_free(tp);

    tp = cmt_tape();
    x = cmt_randn(tp, 3, s, 1, false);
    t = cmt_randint(tp, 2, ts, 2, 0, 5);
    ((int64_t *)cm_tensor_data(t))[0] = -1;
    cr_assert_null(cm_cross_entropy(tp, x, t, NULL));
    cr_assert(strstr(cm_tape_error(tp), "target(0, 0) = -1"), "%s", cm_tape_error(tp));
    cm_tape_free(tp);

    tp = cmt_tape();
    x = cmt_randn(tp, 3, s, 1, false);
    int64_t bad_ts[2] = {2, 5};
    cr_assert_null(cm_cross_entropy(tp, x, cmt_randint(tp, 2, bad_ts, 2, 0, 5), NULL));
    cr_assert_eq(cm_tape_status(tp), CM_ERR_SHAPE);
    cr_assert(strstr(cm_tape_error(tp), "(2, 5)") && strstr(cm_tape_error(tp), "(2, 3)") &&
                  strstr(cm_tape_error(tp), "(2, 5, 3)"),
              "%s", cm_tape_error(tp));
    cm_tape_free(tp);

    tp = cmt_tape();
    x = cmt_randn(tp, 3, s, 1, false);
    int64_t soft_bad[3] = {2, 5, 4};
    cr_assert_null(cm_cross_entropy(tp, x, cmt_randn(tp, 3, soft_bad, 3, false), NULL));
    cr_assert_eq(cm_tape_status(tp), CM_ERR_SHAPE);
    cr_assert(strstr(cm_tape_error(tp), "probability"), "%s", cm_tape_error(tp));
    cm_tape_free(tp);

    tp = cmt_tape();
    x = cmt_randn(tp, 3, s, 1, false);
    t = cmt_randint(tp, 2, ts, 2, 0, 5);
    cm_cross_entropy_opts o = cm_cross_entropy_opts_default();
    o.label_smoothing = 1.5f;
    cr_assert_null(cm_cross_entropy(tp, x, t, &o));
    cr_assert(strstr(cm_tape_error(tp), "label_smoothing 1.5"), "%s", cm_tape_error(tp));
    cm_tape_free(tp);

    tp = cmt_tape();
    x = cmt_randn(tp, 3, s, 1, false);
    o = cm_cross_entropy_opts_default();
    o.reduction = (cm_reduction)7;
    cr_assert_null(cm_cross_entropy(tp, x, cmt_randint(tp, 2, ts, 2, 0, 5), &o));
    cr_assert_eq(cm_tape_status(tp), CM_ERR_INVALID_ARG);
    cm_tape_free(tp);

    tp = cmt_tape();
    int64_t s1[1] = {5};
    cr_assert_null(cm_cross_entropy(tp, cmt_randn(tp, 1, s1, 1, false), cmt_randint(tp, 1, s1, 2, 0, 5), NULL));
    cr_assert_eq(cm_tape_status(tp), CM_ERR_SHAPE);
    cm_tape_free(tp);
}

/* ---- linear + cross-entropy, fused ---- */

typedef struct {
    cm_cross_entropy_opts o;
    int64_t chunk;
} lce_case;

/* A long-lived copy of t (freed by the caller). */
static cm_tensor *keep(const cm_tensor *t) {
    cm_tensor *c = NULL;
    cr_assert(t && cm_tensor_new(cm_tensor_dtype(t), cm_tensor_ndim(t), cm_tensor_shape(t), &c) == CM_OK);
    cr_assert(cm_tensor_copy(c, t) == CM_OK);
    return c;
}

static cm_tensor *call_lce(cm_tape *tp, cm_tensor *const *in, void *vctx) {
    const lce_case *c = vctx;
    return cm_linear_cross_entropy(tp, in[0], in[1], in[2], &c->o, c->chunk);
}

/* The same loss unfused: cm_cross_entropy(cm_linear(x, w)) with (..., V) logits flattened. */
static cm_tensor *call_lce_ref(cm_tape *tp, cm_tensor *const *in, void *vctx) {
    const lce_case *c = vctx;
    cm_tensor *lg = cm_linear(tp, in[0], in[1], NULL);
    if (!lg) return NULL;
    const int64_t V = cm_tensor_dim(in[1], 0), R = cm_tensor_numel(in[2]);
    const int64_t ls[2] = {R, V}, ts[1] = {R};
    return cm_cross_entropy(tp, cm_reshape(tp, lg, 2, ls), cm_reshape(tp, in[2], 1, ts), &c->o);
}

Test(linear_cross_entropy, gradcheck_chunks_smoothing_reductions_ignore_and_shapes) {
    const int64_t xs2[2] = {7, 5}, ts1[1] = {7}, xs3[3] = {2, 3, 5}, ts2[2] = {2, 3}, ws[2] = {11, 5};
    const int64_t chunks[3] = {3, 1, 0};
    for (int shp = 0; shp < 2; shp++)
        for (int si = 0; si < 2; si++)
            for (int ri = 0; ri < 2; ri++)
                for (int ci = 0; ci < 3; ci++) {
                    cm_tape *tp = cmt_tape();
                    lce_case c = {cm_cross_entropy_opts_default(), chunks[ci]};
                    c.o.label_smoothing = si ? 0.1f : 0.0f;
                    c.o.reduction = ri ? CM_REDUCTION_SUM : CM_REDUCTION_MEAN;
                    const uint64_t seed = (uint64_t)(100 * shp + 10 * si + 3 * ri + ci);
                    cm_tensor *x = shp ? cmt_randn_noncontig(tp, 3, xs3, 500 + seed, true)
                                       : cmt_randn(tp, 2, xs2, 500 + seed, true);
                    cm_tensor *w = cmt_randn(tp, 2, ws, 600 + seed, true);
                    cm_tensor *t = shp ? cmt_randint(tp, 2, ts2, 700 + seed, 0, 11) : cmt_randint(tp, 1, ts1, 700 + seed, 0, 11);
                    ignore_some(t, c.o.ignore_index, 3);
                    char name[96];
                    snprintf(name, sizeof name, "linear_cross_entropy shape %d smoothing %d reduction %d chunk %lld", shp,
                             si, ri, (long long)c.chunk);
                    cm_tensor *in[3] = {x, w, t};
                    cmt_gradcheck(name, call_lce, &c, 3, in, NULL);
                    cm_tape_free(tp);
                }
}

typedef enum { LCE_F32, LCE_AUTOCAST, LCE_BF16 } lce_mode;

/* The fused op against cm_linear + cm_cross_entropy on the same inputs (x (xs), w (ws), targets
 * (ts) in [0, V) with every 7th ignored): the losses within 1e-5 relative, dx and dw within
 * atol + rtol. LCE_AUTOCAST: f32 leaves under autocast; LCE_BF16: bf16 leaves, no autocast. */
static void expect_lce_matches_unfused(const char *what, int xnd, const int64_t *xs, const int64_t *ws, int tnd,
                                       const int64_t *ts, lce_case c, lce_mode mode, double atol, double rtol) {
    cm_tensor *g[2][2] = {{NULL}};
    float loss[2];
    for (int k = 0; k < 2; k++) {
        cm_tape *tp = cmt_tape();
        if (mode == LCE_AUTOCAST) cm_tape_set_autocast(tp, CM_DTYPE_BF16);
        cm_tensor *x = cmt_randn(tp, xnd, xs, 11, mode != LCE_BF16), *w = cmt_randn(tp, 2, ws, 12, mode != LCE_BF16);
        if (mode == LCE_BF16) {
            x = cm_clone_detached(tp, cm_cast(tp, x, CM_DTYPE_BF16));
            w = cm_clone_detached(tp, cm_cast(tp, w, CM_DTYPE_BF16));
            cr_assert(x && w && cm_tensor_set_requires_grad(x, true) == CM_OK &&
                      cm_tensor_set_requires_grad(w, true) == CM_OK);
        }
        cm_tensor *t = cmt_randint(tp, tnd, ts, 13, 0, ws[0]);
        ignore_some(t, c.o.ignore_index, 7);
        cm_tensor *in[3] = {x, w, t};
        cm_tensor *l = k ? call_lce_ref(tp, in, &c) : call_lce(tp, in, &c);
        cr_assert(l && cm_tape_backward(tp, l) == CM_OK, "%s: %s", what, cm_tape_error(tp));
        loss[k] = (float)cm_tensor_get_flat(l, 0);
        g[k][0] = keep(cm_tensor_grad(x));
        g[k][1] = keep(cm_tensor_grad(w));
        cr_assert(cm_tensor_dtype(g[k][0]) == CM_DTYPE_F32 && cm_tensor_dtype(g[k][1]) == CM_DTYPE_F32, "%s", what);
        cm_tape_free(tp);
    }
    cr_assert(fabsf(loss[0] - loss[1]) <= 1e-5f * fabsf(loss[1]), "%s: loss %.8g vs unfused %.8g", what,
              (double)loss[0], (double)loss[1]);
    char name[160];
    snprintf(name, sizeof name, "%s: dx vs unfused", what);
    cmt_assert_close(name, g[0][0], g[1][0], atol, rtol);
    snprintf(name, sizeof name, "%s: dw vs unfused", what);
    cmt_assert_close(name, g[0][1], g[1][1], atol, rtol);
    for (int k = 0; k < 2; k++) cm_tensor_free(g[k][0]), cm_tensor_free(g[k][1]);
}

/* Loss and both gradients against the unfused ops on a size with several automatic chunks (256
 * rows each, the last one partial) and with one-row chunks. */
Test(linear_cross_entropy, equals_linear_then_cross_entropy) {
    const int64_t xs[3] = {3, 200, 24}, ws[2] = {300, 24}, ts[2] = {3, 200};
    const int64_t chunks[3] = {0, 1, 77};
    for (int ci = 0; ci < 3; ci++)
        for (int si = 0; si < 2; si++) {
            lce_case c = {cm_cross_entropy_opts_default(), chunks[ci]};
            c.o.label_smoothing = si ? 0.2f : 0.0f;
            char what[64];
            snprintf(what, sizeof what, "chunk %lld smoothing %d", (long long)c.chunk, si);
            expect_lce_matches_unfused(what, 3, xs, ws, 2, ts, c, LCE_F32, 1e-7, 1e-4);
        }
}

Test(linear_cross_entropy, first_gradients_are_written_and_upstream_scales) {
    const int64_t xs[2] = {9, 6}, ws[2] = {13, 6}, ts[1] = {9};
    cm_tape *tp = cmt_tape();
    lce_case c = {cm_cross_entropy_opts_default(), 4};
    cm_tensor *x = cmt_randn(tp, 2, xs, 21, true), *w = cmt_randn(tp, 2, ws, 22, true);
    cm_tensor *t = cmt_randint(tp, 1, ts, 23, 0, 13);
    cm_tensor *in[3] = {x, w, t};
    cmt_check_fresh_grads("linear_cross_entropy", call_lce, &c, 3, in, 1e-6, 1e-5);
    cm_tape_free(tp);
}

/* Under autocast the fused op multiplies bf16 copies and rounds the chunk's gradient to bf16, as
 * cm_linear's backward rounds its upstream gradient: it tracks the unfused ops under autocast; and
 * with bf16 x and w (no autocast), the same bf16 GEMMs as cm_linear on bf16 operands. */
Test(linear_cross_entropy, bf16_and_autocast_track_the_unfused_ops) {
    const int64_t xs[2] = {300, 32}, ws[2] = {200, 32}, ts[1] = {300};
    lce_case c = {cm_cross_entropy_opts_default(), 0};
    expect_lce_matches_unfused("autocast", 2, xs, ws, 1, ts, c, LCE_AUTOCAST, 1e-5, 2e-2);
    expect_lce_matches_unfused("bf16 operands", 2, xs, ws, 1, ts, c, LCE_BF16, 1e-5, 2e-2);
}

Test(linear_cross_entropy, all_ignored_gives_nan_mean_zero_gradients_and_no_grad_records_nothing) {
    const int64_t xs[2] = {4, 3}, ws[2] = {5, 3}, ts[1] = {4};
    cm_tape *tp = cmt_tape();
    cm_tensor *x = cmt_randn(tp, 2, xs, 41, true), *w = cmt_randn(tp, 2, ws, 42, true);
    cm_tensor *t = cmt_randint(tp, 1, ts, 43, 0, 5);
    ignore_some(t, -100, 1);
    cm_tensor *l = cm_linear_cross_entropy(tp, x, w, t, NULL, 0);
    cr_assert(l && isnan(cm_tensor_get_flat(l, 0)), "%s", cm_tape_error(tp));
    cm_cross_entropy_opts o = cm_cross_entropy_opts_default();
    o.reduction = CM_REDUCTION_SUM;
    l = cm_linear_cross_entropy(tp, x, w, t, &o, 0);
    cr_assert(l && cm_tensor_get_flat(l, 0) == 0.0);
    cr_assert_eq(cm_tape_backward(tp, l), CM_OK, "%s", cm_tape_error(tp));
    for (int64_t i = 0; i < 12; i++) cr_assert_eq(cm_tensor_get_flat(cm_tensor_grad(x), i), 0.0);
    for (int64_t i = 0; i < 15; i++) cr_assert_eq(cm_tensor_get_flat(cm_tensor_grad(w), i), 0.0);
    cm_tape_free(tp);

    tp = cmt_tape();
    x = cmt_randn(tp, 2, xs, 41, true), w = cmt_randn(tp, 2, ws, 42, true);
    t = cmt_randint(tp, 1, ts, 43, 0, 5);
    cm_tensor *in[3] = {x, w, t};
    lce_case c = {cm_cross_entropy_opts_default(), 0};
    const float want = (float)cm_tensor_get_flat(call_lce_ref(tp, in, &c), 0);
    const bool prev = cm_tape_set_grad_enabled(tp, false);
    l = cm_linear_cross_entropy(tp, x, w, t, NULL, 0);
    cm_tape_set_grad_enabled(tp, prev);
    cr_assert(l && !cm_tensor_requires_grad(l), "%s", cm_tape_error(tp));
    cr_assert(fabsf((float)cm_tensor_get_flat(l, 0) - want) <= 1e-6f * fabsf(want));
    cm_tape_free(tp);
}

Test(linear_cross_entropy, bad_inputs_are_errors_naming_them) {
    const int64_t xs[2] = {4, 3}, ws[2] = {5, 3}, ts[1] = {4};
    cm_tape *tp = cmt_tape();
    cm_tensor *x = cmt_randn(tp, 2, xs, 1, false), *w = cmt_randn(tp, 2, ws, 2, false);
    cm_tensor *t = cmt_randint(tp, 1, ts, 3, 0, 5);
    ((int64_t *)cm_tensor_data(t))[2] = 9;
    cmt_expect_error(tp, cm_linear_cross_entropy(tp, x, w, t, NULL, 0), CM_ERR_INVALID_ARG, "target(2) = 9",
                     "[0, 5)", "w (5, 3)", NULL);
    cm_tape_free(tp);

    tp = cmt_tape();
    x = cmt_randn(tp, 2, xs, 1, false), w = cmt_randn(tp, 2, ws, 2, false);
    cm_cross_entropy_opts o = cm_cross_entropy_opts_default();
    o.reduction = CM_REDUCTION_NONE;
    cmt_expect_error(tp, cm_linear_cross_entropy(tp, x, w, cmt_randint(tp, 1, ts, 3, 0, 5), &o, 0), CM_ERR_UNSUPPORTED,
                     "reduction NONE", "cm_linear + cm_cross_entropy", NULL);
    cm_tape_free(tp);

    tp = cmt_tape();
    x = cmt_randn(tp, 2, xs, 1, false), w = cmt_randn(tp, 2, ws, 2, false);
    const int64_t ps[2] = {4, 5};
    cmt_expect_error(tp, cm_linear_cross_entropy(tp, x, w, cmt_randn(tp, 2, ps, 3, false), NULL, 0), CM_ERR_UNSUPPORTED,
                     "probability targets", NULL);
    cm_tape_free(tp);

    tp = cmt_tape();
    x = cmt_randn(tp, 2, xs, 1, false);
    const int64_t ws_bad[2] = {5, 4}, ts_bad[1] = {3};
    cmt_expect_error(tp, cm_linear_cross_entropy(tp, x, cmt_randn(tp, 2, ws_bad, 2, false), cmt_randint(tp, 1, ts, 3, 0, 5), NULL, 0),
                     CM_ERR_SHAPE, "w (5, 4)", "x (4, 3)", NULL);
    cm_tape_free(tp);

    tp = cmt_tape();
    x = cmt_randn(tp, 2, xs, 1, false), w = cmt_randn(tp, 2, ws, 2, false);
    cmt_expect_error(tp, cm_linear_cross_entropy(tp, x, w, cmt_randint(tp, 1, ts_bad, 3, 0, 5), NULL, 0), CM_ERR_SHAPE,
                     "target (3,)", "must be (4,)", NULL);
    cm_tape_free(tp);

    tp = cmt_tape();
    x = cmt_randn(tp, 2, xs, 1, false), w = cm_cast(tp, cmt_randn(tp, 2, ws, 2, false), CM_DTYPE_BF16);
    cmt_expect_error(tp, cm_linear_cross_entropy(tp, x, w, cmt_randint(tp, 1, ts, 3, 0, 5), NULL, 0), CM_ERR_DTYPE,
                     "bf16", "f32", NULL);
    cm_tape_free(tp);
}

/* ---- mse ---- */

typedef struct {
    cm_reduction r;
} mse_case;

static cm_tensor *call_mse(cm_tape *tp, cm_tensor *const *in, void *vctx) {
    return cm_mse_loss(tp, in[0], in[1], ((const mse_case *)vctx)->r);
}

Test(mse_loss, gradcheck_all_reductions_and_strided_inputs) {
    const int64_t s[3] = {2, 3, 5};
    for (int ri = 0; ri < 3; ri++)
        for (int variant = 0; variant < 2; variant++) {
            cm_tape *tp = cmt_tape();
            cm_tensor *p = variant ? cmt_randn_noncontig(tp, 3, s, 1 + ri, true) : cmt_randn(tp, 3, s, 1 + ri, true);
            cm_tensor *t = cmt_randn(tp, 3, s, 7 + ri, true);
            mse_case c = {(cm_reduction)ri};
            cm_tensor *in[2] = {p, t};
            cmt_gradcheck("mse", call_mse, &c, 2, in, NULL);
            cm_tape_free(tp);
        }
}

Test(mse_loss, values_and_errors) {
    cm_tape *tp = cmt_tape();
    int64_t s[1] = {4};
    cm_tensor *a = cm_arange(tp, CM_DTYPE_F32, 0, 4, 1), *b = cm_full(tp, CM_DTYPE_F32, 1, s, 1.0);
    cr_assert_eq(cm_tensor_get_flat(cm_mse_loss(tp, a, b, CM_REDUCTION_MEAN), 0), 1.5); /* (1+0+1+4)/4 */
    cr_assert_eq(cm_tensor_get_flat(cm_mse_loss(tp, a, b, CM_REDUCTION_SUM), 0), 6.0);
    cm_tensor *none = cm_mse_loss(tp, a, b, CM_REDUCTION_NONE);
    const float want[4] = {1, 0, 1, 4};
    cmt_assert_close_f32("mse none", cm_tensor_data(none), want, 4, 0, 0);
    int64_t s5[1] = {5};
    cr_assert_null(cm_mse_loss(tp, a, cm_zeros(tp, CM_DTYPE_F32, 1, s5), CM_REDUCTION_MEAN));
    cr_assert_eq(cm_tape_status(tp), CM_ERR_SHAPE);
    cr_assert(strstr(cm_tape_error(tp), "mse_loss") && strstr(cm_tape_error(tp), "(4,)") &&
                  strstr(cm_tape_error(tp), "(5,)"),
              "%s", cm_tape_error(tp));
    cm_tape_free(tp);
}
