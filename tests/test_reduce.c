/* Reductions (sum, mean, max, min, var) and softmax / log-softmax: gradient checks on contiguous,
 * odd-sized and non-contiguous inputs, forward values against a brute-force reference over every
 * subset of axes, tie and NaN rules for max/min, the parallel paths, and the error messages.
 *
 * Tolerances: gradchecks use the defaults (eps 1e-2, atol 1e-3, rtol 1e-2): sum/mean are linear and
 * var quadratic, so central differences are exact up to f32 rounding; max/min get inputs whose
 * values are 0.1 apart, so the ±eps step never changes the winner; softmax is smooth with small
 * third derivatives (truncation ~1e-5). Forward values are compared with a double reference at
 * 1e-5 relative (the kernels accumulate in double; the output is rounded once to f32). */
#include "cmtest.h"

#include <math.h>
#include <stdio.h>

#include "tensor/vexp.h"

typedef struct {
    int op; /* 0 sum, 1 mean, 2 max, 3 min, 4 var */
    int axes[CM_MAX_DIMS];
    int n_axes;
    int correction;
    bool keepdim;
} red_case;

static cm_tensor *call_red(cm_tape *tp, cm_tensor *const *in, void *vctx) {
    const red_case *c = vctx;
    switch (c->op) {
    case 0: return cm_sum(tp, in[0], c->axes, c->n_axes, c->keepdim);
    case 1: return cm_mean(tp, in[0], c->axes, c->n_axes, c->keepdim);
    case 2: return cm_max(tp, in[0], c->axes, c->n_axes, c->keepdim);
    case 3: return cm_min(tp, in[0], c->axes, c->n_axes, c->keepdim);
    default: return cm_var(tp, in[0], c->axes, c->n_axes, c->correction, c->keepdim);
    }
}

/* Overwrites t (any strides) with distinct values 0.1 apart in a scrambled order. */
static void fill_distinct(cm_tensor *t) {
    const int64_t n = cm_tensor_numel(t);
    const int64_t *sh = cm_tensor_shape(t);
    const int nd = cm_tensor_ndim(t);
    for (int64_t i = 0; i < n; i++) {
        int64_t idx[CM_MAX_DIMS], rem = i;
        for (int d = nd - 1; d >= 0; d--) {
            idx[d] = rem % sh[d];
            rem /= sh[d];
        }
        cm_tensor_set(t, idx, 0.1 * (double)((i * 7919 + 3) % n) - 0.05 * (double)n);
    }
}

static const char *k_names[] = {"sum", "mean", "max", "min", "var"};

Test(reduce, gradcheck_all_ops_over_axis_sets_keepdim_and_strides) {
    const int64_t s3[3] = {3, 4, 5}, s4[4] = {2, 3, 1, 4};
    const struct {
        int axes[3];
        int n;
    } sets[] = {{{0}, 0}, {{0}, 1}, {{-1}, 1}, {{1}, 1}, {{0, 2}, 2}, {{2, 0}, 2}, {{-2, -1}, 2}, {{0, 1, 2}, 3}};
    for (int op = 0; op < 5; op++)
        for (size_t k = 0; k < sizeof sets / sizeof sets[0]; k++)
            for (int variant = 0; variant < 3; variant++) {
                cm_tape *tp = cmt_tape();
                red_case c = {op, {0}, sets[k].n, (int)(k % 2), (k + (size_t)variant) % 2 == 0};
                memcpy(c.axes, sets[k].axes, sizeof sets[k].axes);
                cm_tensor *x;
                if (variant == 0) x = cmt_randn(tp, 3, s3, 10 + k, true);
                else if (variant == 1) x = cmt_randn_noncontig(tp, 3, s3, 20 + k, true);
                else x = cmt_randn(tp, 4, s4, 30 + k, true); /* a size-1 dim inside */
                if (variant == 2 && c.n_axes == 3) c.axes[2] = 3;
                if (op == 2 || op == 3) fill_distinct(x);
                char name[64];
                snprintf(name, sizeof name, "%s set %zu variant %d", k_names[op], k, variant);
                cm_tensor *in[1] = {x};
                cmt_gradcheck(name, call_red, &c, 1, in, NULL);
                cm_tape_free(tp);
            }
}

/* Brute-force reference over the axis mask, in double, with the first-extreme rule. */
static double ref_reduce(const cm_tensor *x, int op, unsigned mask, int correction, const int64_t *oidx) {
    const int nd = cm_tensor_ndim(x);
    const int64_t *sh = cm_tensor_shape(x);
    const int64_t n = cm_tensor_numel(x);
    double s = 0, s2 = 0, best = op == 2 ? -INFINITY : INFINITY;
    int64_t cnt = 0;
    for (int pass = 0; pass < (op == 4 ? 2 : 1); pass++) {
        const double mean = cnt ? s / (double)cnt : 0;
        for (int64_t i = 0; i < n; i++) {
            int64_t idx[CM_MAX_DIMS], rem = i;
            for (int d = nd - 1; d >= 0; d--) {
                idx[d] = rem % sh[d];
                rem /= sh[d];
            }
            bool in_group = true;
            for (int d = 0; d < nd; d++)
                if (!(mask >> d & 1) && idx[d] != oidx[d]) in_group = false;
            if (!in_group) continue;
            const double v = cm_tensor_get(x, idx);
            if (pass == 1) {
                s2 += (v - mean) * (v - mean);
                continue;
            }
            s += v;
            cnt++;
            if ((op == 2 && v > best) || (op == 3 && v < best)) best = v;
        }
    }
    switch (op) {
    case 0: return s;
    case 1: return s / (double)cnt;
    case 4: return s2 / (double)(cnt - correction);
    default: return best;
    }
}

Test(reduce, forward_matches_reference_for_every_axis_subset_and_layout) {
    const int64_t shape[4] = {3, 4, 2, 5};
    for (int layout = 0; layout < 2; layout++) {
        cm_tape *tp = cmt_tape();
        cm_tensor *x = layout ? cmt_randn_noncontig(tp, 4, shape, 7, false) : cmt_randn(tp, 4, shape, 7, false);
        for (unsigned mask = 0; mask < 16; mask++)
            for (int op = 0; op < 5; op++)
                for (int keep = 0; keep < 2; keep++) {
                    int axes[4], n = 0;
                    for (int d = 0; d < 4; d++)
                        if (mask >> d & 1) axes[n++] = (d % 2) ? d - 4 : d; /* mix negative axes in */
                    const unsigned um = n ? mask : 15u; /* n_axes = 0 reduces all */
                    red_case c = {op, {0}, n, 1, keep};
                    memcpy(c.axes, axes, sizeof axes);
                    cm_tensor *in[1] = {x};
                    cm_tensor *out = call_red(tp, in, &c);
                    cr_assert(out, "%s mask %u: %s", k_names[op], mask, cm_tape_error(tp));
                    /* output shape */
                    int want_nd = 0;
                    for (int d = 0; d < 4; d++)
                        if (!(um >> d & 1) || keep) want_nd++;
                    cr_assert_eq(cm_tensor_ndim(out), want_nd, "%s mask %u keep %d: ndim %d", k_names[op], mask, keep,
                                 cm_tensor_ndim(out));
                    const int64_t n_out = cm_tensor_numel(out);
                    for (int64_t o = 0; o < n_out; o++) {
                        /* the input index of the group's first element */
                        int64_t oidx[4] = {0}, rem = o;
                        for (int d = 3; d >= 0; d--) {
                            if (um >> d & 1) continue;
                            oidx[d] = rem % shape[d];
                            rem /= shape[d];
                        }
                        const double want = ref_reduce(x, op, um, 1, oidx);
                        const double got = cm_tensor_get_flat(out, o);
                        cr_assert(fabs(got - want) <= 1e-5 * (1 + fabs(want)),
                                  "%s mask %u keep %d layout %d out[%lld]: %.8g vs expected %.8g (tol 1e-5 rel)",
                                  k_names[op], mask, keep, layout, (long long)o, got, want);
                    }
                }
        cm_tape_free(tp);
    }
}

static void backward_ones(cm_tape *tp, cm_tensor *out) {
    cm_tensor *g = cm_full(tp, CM_DTYPE_F32, cm_tensor_ndim(out), cm_tensor_shape(out), 1.0);
    cr_assert_eq(cm_tape_backward_with(tp, out, g), CM_OK, "%s", cm_tape_error(tp));
}

Test(reduce, max_and_min_gradient_goes_to_the_first_extreme_element) {
    cm_tape *tp = cmt_tape();
    /* inner order: along the last axis */
    const float v[8] = {1, 3, 3, 2, /**/ -1, -5, 0, -5};
    int64_t s[2] = {2, 4};
    cm_tensor *x;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 2, s, &x), CM_OK);
    memcpy(cm_tensor_data(x), v, sizeof v);
    cm_tensor_set_requires_grad(x, true);
    int ax = -1;
    backward_ones(tp, cm_max(tp, x, &ax, 1, false));
    const float want_max[8] = {0, 1, 0, 0, 0, 0, 1, 0};
    cmt_assert_close_f32("max grad (last axis)", cm_tensor_data(cm_tensor_grad(x)), want_max, 8, 0, 0);
    cm_tensor_zero_grad(x);
    cm_tape_reset(tp); /* backward runs every recorded node: drop the max node */
    backward_ones(tp, cm_min(tp, x, &ax, 1, false));
    const float want_min[8] = {1, 0, 0, 0, 0, 1, 0, 0};
    cmt_assert_close_f32("min grad (last axis)", cm_tensor_data(cm_tensor_grad(x)), want_min, 8, 0, 0);
    /* outer order: along axis 0 of (4, 2) — column ties */
    cm_tape_reset(tp);
    int64_t s2[2] = {4, 2};
    const float w[8] = {0, 7, 2, 7, 2, 1, 1, 7};
    cm_tensor *y;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 2, s2, &y), CM_OK);
    memcpy(cm_tensor_data(y), w, sizeof w);
    cm_tensor_set_requires_grad(y, true);
    int ax0 = 0;
    cm_tensor *m = cm_max(tp, y, &ax0, 1, true);
    backward_ones(tp, m);
    const float want_y[8] = {0, 1, 1, 0, 0, 0, 0, 0};
    cmt_assert_close_f32("max grad (axis 0)", cm_tensor_data(cm_tensor_grad(y)), want_y, 8, 0, 0);
    const float want_m[2] = {2, 7};
    cmt_assert_close_f32("max values (axis 0)", cm_tensor_data(m), want_m, 2, 0, 0);
    cm_tensor_free(x);
    cm_tensor_free(y);
    cm_tape_free(tp);
}

Test(reduce, full_reduction_parallel_path_keeps_first_tie_and_sums_accurately) {
    cm_tape *tp = cmt_tape();
    int64_t s[2] = {256, 1024}; /* one output, rows split across threads */
    cm_tensor *x = cm_zeros(tp, CM_DTYPE_F32, 2, s);
    float *xv = cm_tensor_data(x);
    xv[200 * 1024 + 5] = 4.0f; /* a later row, likely another thread's chunk */
    xv[10 * 1024 + 7] = 4.0f;  /* the first maximum */
    cm_tensor_set_requires_grad(x, true);
    backward_ones(tp, cm_max(tp, x, NULL, 0, false));
    const float *g = cm_tensor_data(cm_tensor_grad(x));
    cr_assert(g[10 * 1024 + 7] == 1.0f && g[200 * 1024 + 5] == 0.0f, "first tie must win: %g %g",
              (double)g[10 * 1024 + 7], (double)g[200 * 1024 + 5]);
    /* sum of 262144 values of 0.1 (not exact in f32): double accumulation keeps it tight */
    cm_tensor *y = cm_full(tp, CM_DTYPE_F32, 2, s, 0.1);
    cm_tensor *sum = cm_sum(tp, y, NULL, 0, false);
    const double want = 262144.0 * (double)0.1f;
    cr_assert(fabs(cm_tensor_get_flat(sum, 0) - want) <= 1e-6 * want, "sum %.8g vs %.8g (tol 1e-6 rel)",
              cm_tensor_get_flat(sum, 0), want);
    /* large outer-order sum (over axis 0) and inner-order mean, checked against the reference */
    cm_tensor *r = cmt_randn(tp, 2, s, 3, false);
    int ax0 = 0, ax1 = 1;
    cm_tensor *c0 = cm_sum(tp, r, &ax0, 1, false), *c1 = cm_mean(tp, r, &ax1, 1, false);
    cr_assert(c0 && c1);
    for (int64_t j = 0; j < 1024; j += 97) {
        int64_t oidx[2] = {0, j};
        double w = ref_reduce(r, 0, 1u, 0, oidx);
        cr_assert(fabs(cm_tensor_get_flat(c0, j) - w) <= 1e-4, "col sum %lld: %g vs %g", (long long)j,
                  cm_tensor_get_flat(c0, j), w);
    }
    for (int64_t i = 0; i < 256; i += 31) {
        int64_t oidx[2] = {i, 0};
        double w = ref_reduce(r, 1, 2u, 0, oidx);
        cr_assert(fabs(cm_tensor_get_flat(c1, i) - w) <= 1e-6, "row mean %lld: %g vs %g", (long long)i,
                  cm_tensor_get_flat(c1, i), w);
    }
    cm_tape_free(tp);
}

Test(reduce, max_propagates_nan_and_var_of_one_sample_is_nan) {
    cm_tape *tp = cmt_tape();
    int64_t s[1] = {4};
    cm_tensor *x = cm_arange(tp, CM_DTYPE_F32, 0, 4, 1);
    ((float *)cm_tensor_data(x))[1] = NAN;
    cr_assert(isnan(cm_tensor_get_flat(cm_max(tp, x, NULL, 0, false), 0)));
    cr_assert(isnan(cm_tensor_get_flat(cm_min(tp, x, NULL, 0, false), 0)));
    int64_t s1[2] = {3, 1};
    cm_tensor *y = cmt_randn(tp, 2, s1, 1, false);
    int ax = 1;
    cm_tensor *v1 = cm_var(tp, y, &ax, 1, 1, false), *v0 = cm_var(tp, y, &ax, 1, 0, false);
    cr_assert(v1 && v0);
    cr_assert(isnan(cm_tensor_get_flat(v1, 0)), "var of 1 sample, correction 1 -> NaN as torch");
    cr_assert_eq(cm_tensor_get_flat(v0, 0), 0.0);
    (void)s;
    cm_tape_free(tp);
}

Test(reduce, bad_axes_are_errors_naming_the_op_axis_and_shape) {
    int64_t s[3] = {2, 3, 4};
    const struct {
        int axes[3];
        int n;
        const char *want;
    } bad[] = {{{1, -2}, 2, "repeated"}, {{3}, 1, "out of range"}, {{-4}, 1, "out of range"},
               {{0, 1, 2}, 4, "axes"}, {{0}, -1, "axes"}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        cm_tape *tp = cmt_tape();
        cm_tensor *x = cmt_randn(tp, 3, s, 1, false);
        cr_assert_null(cm_sum(tp, x, bad[k].axes, bad[k].n, false));
        cr_assert_eq(cm_tape_status(tp), CM_ERR_INVALID_ARG);
        const char *e = cm_tape_error(tp);
        cr_assert(strstr(e, "sum:") && strstr(e, bad[k].want) && strstr(e, "(2, 3, 4)"), "case %zu: %s", k, e);
        cm_tape_free(tp);
    }
    cm_tape *tp = cmt_tape();
    cm_tensor *x = cmt_randn(tp, 3, s, 1, false);
    cr_assert_null(cm_var(tp, x, NULL, 0, -1, false));
    cr_assert(strstr(cm_tape_error(tp), "correction"), "%s", cm_tape_error(tp));
    cm_tape_free(tp);
    tp = cmt_tape();
    int64_t se[2] = {3, 0};
    cm_tensor *e = cm_zeros(tp, CM_DTYPE_F32, 2, se);
    int ax = 1;
    cr_assert_null(cm_max(tp, e, &ax, 1, false));
    cr_assert_eq(cm_tape_status(tp), CM_ERR_SHAPE, "%s", cm_tape_error(tp));
    cm_tape_free(tp);
    tp = cmt_tape();
    cm_tensor *sum_empty = cm_sum(tp, cm_zeros(tp, CM_DTYPE_F32, 2, se), &ax, 1, false);
    cr_assert(sum_empty && cm_tensor_get_flat(sum_empty, 2) == 0.0, "sum over an empty axis is 0");
    cm_tensor *i = cm_zeros(tp, CM_DTYPE_I64, 2, s);
    cr_assert_null(cm_mean(tp, i, NULL, 0, false));
    cr_assert_eq(cm_tape_status(tp), CM_ERR_DTYPE);
    cm_tape_free(tp);
}

/* ---- softmax / log_softmax ---- */

typedef struct {
    bool log;
    int axis;
} sm_case;

static cm_tensor *call_sm(cm_tape *tp, cm_tensor *const *in, void *vctx) {
    const sm_case *c = vctx;
    return c->log ? cm_log_softmax(tp, in[0], c->axis) : cm_softmax(tp, in[0], c->axis);
}

Test(softmax, gradcheck_every_axis_contiguous_and_strided) {
    const int64_t s3[3] = {3, 5, 4}, s1[1] = {7};
    for (int lg = 0; lg < 2; lg++)
        for (int axis = -1; axis < 3; axis++)
            for (int variant = 0; variant < 2; variant++) {
                cm_tape *tp = cmt_tape();
                cm_tensor *x = variant ? cmt_randn_noncontig(tp, 3, s3, 40 + axis, true) : cmt_randn(tp, 3, s3, 50 + axis, true);
                sm_case c = {lg, axis};
                cm_tensor *in[1] = {x};
                cmt_gradcheck(lg ? "log_softmax" : "softmax", call_sm, &c, 1, in, NULL);
                cm_tape_free(tp);
            }
    cm_tape *tp = cmt_tape();
    cm_tensor *x = cmt_randn_noncontig(tp, 1, s1, 3, true);
    sm_case c = {false, 0};
    cm_tensor *in[1] = {x};
    cmt_gradcheck("softmax 1-d strided", call_sm, &c, 1, in, NULL);
    cm_tape_free(tp);
}

Test(softmax, values_sum_to_one_and_stay_finite_for_huge_logits) {
    cm_tape *tp = cmt_tape();
    int64_t s[3] = {2, 3, 70}; /* inner 70 > one column chunk */
    cm_tensor *x = cmt_randn(tp, 3, s, 9, false);
    float *xv = cm_tensor_data(x);
    xv[0] = 1000.0f;
    xv[70] = 1001.0f;
    xv[5] = -1e30f;
    for (int axis = 0; axis < 3; axis++) {
        cm_tensor *p = cm_softmax(tp, x, axis), *lp = cm_log_softmax(tp, x, axis);
        cr_assert(p && lp, "%s", cm_tape_error(tp));
        int ax = axis;
        cm_tensor *tot = cm_sum(tp, p, &ax, 1, false);
        for (int64_t i = 0; i < cm_tensor_numel(tot); i++)
            cr_assert(fabs(cm_tensor_get_flat(tot, i) - 1.0) < 1e-5, "axis %d sum[%lld] = %.8g", axis, (long long)i,
                      cm_tensor_get_flat(tot, i));
        for (int64_t i = 0; i < cm_tensor_numel(p); i++) {
            const double a = cm_tensor_get_flat(p, i), b = cm_tensor_get_flat(lp, i);
            cr_assert(isfinite(a) && isfinite(b), "axis %d elem %lld: %g %g", axis, (long long)i, a, b);
            /* logits near 1000 carry f32 rounding of ~6e-5 into log_softmax, so 1e-4 relative */
            cr_assert(fabs(exp(b) - a) <= 1e-6 + 1e-4 * a, "exp(log_softmax) vs softmax at %lld: %g %g", (long long)i,
                      exp(b), a);
        }
    }
    cm_tensor *e = cm_softmax(tp, x, 3);
    cr_assert_null(e);
    cr_assert_eq(cm_tape_status(tp), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_tape_error(tp), "softmax") && strstr(cm_tape_error(tp), "axis 3"), "%s", cm_tape_error(tp));
    cm_tape_free(tp);
}

Test(softmax, large_input_uses_parallel_path_and_matches_small_path) {
    cm_tape *tp = cmt_tape();
    int64_t s[3] = {8, 64, 100};
    cm_tensor *x = cmt_randn(tp, 3, s, 11, false);
    for (int axis = 0; axis < 3; axis++) {
        cm_tensor *p = cm_log_softmax(tp, x, axis);
        cr_assert(p);
        /* spot-check against a double reference */
        for (int64_t q = 0; q < cm_tensor_numel(p); q += 997) {
            int64_t idx[3] = {q / 6400, (q / 100) % 64, q % 100}, j[3];
            memcpy(j, idx, sizeof j);
            double mx = -INFINITY, se = 0;
            for (j[axis] = 0; j[axis] < s[axis]; j[axis]++) mx = fmax(mx, cm_tensor_get(x, j));
            for (j[axis] = 0; j[axis] < s[axis]; j[axis]++) se += exp(cm_tensor_get(x, j) - mx);
            const double want = cm_tensor_get(x, idx) - mx - log(se);
            cr_assert(fabs(cm_tensor_get_flat(p, q) - want) < 1e-5, "axis %d [%lld]: %g vs %g", axis, (long long)q,
                      cm_tensor_get_flat(p, q), want);
        }
    }
    cm_tape_free(tp);
}

Test(softmax, vectorised_exp_matches_expf_within_3_ulp) {
    double worst = 0;
    for (float x = -87.0f; x <= 88.0f; x += 0.0137f) {
        const double want = expf(x), got = cmi_vexpf(x);
        const double rel = fabs(got - want) / want;
        worst = rel > worst ? rel : worst;
        cr_assert(rel <= 3 * 5.96e-8, "vexpf(%.7g) = %.9g vs expf %.9g (rel %.3g > 3 ulp)", (double)x, got, want, rel);
    }
    cr_assert_eq(cmi_vexpf(-INFINITY), 0.0f);
    cr_assert_eq(cmi_vexpf(-100.0f), 0.0f);
    cr_assert(isinf(cmi_vexpf(100.0f)) && isnan(cmi_vexpf(NAN)));
    cr_assert_eq(cmi_vexpf(0.0f), 1.0f);
    (void)worst;
}
