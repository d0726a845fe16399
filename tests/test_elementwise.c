/* Gradient checks and forward values for the elementwise ops, on contiguous, broadcast and
 * non-contiguous inputs. */
#include "cmtest.h"
#include "tensor/vexp.h"

#include <math.h>

typedef cm_tensor *(*bin_fn)(cm_tape *, cm_tensor *, cm_tensor *);
typedef cm_tensor *(*un_fn)(cm_tape *, cm_tensor *);

static cm_tensor *call_bin(cm_tape *tp, cm_tensor *const *in, void *ctx) { return ((bin_fn)ctx)(tp, in[0], in[1]); }
static cm_tensor *call_un(cm_tape *tp, cm_tensor *const *in, void *ctx) { return ((un_fn)ctx)(tp, in[0]); }

static const struct {
    const char *name;
    bin_fn fn;
} k_bins[] = {{"add", cm_add}, {"sub", cm_sub}, {"mul", cm_mul}, {"div", cm_div}};

Test(elementwise, binary_ops_gradcheck_same_shape_broadcast_and_strided) {
    const int64_t sa[3] = {2, 3, 4}, sb_full[3] = {2, 3, 4}, sb_row[1] = {4}, sb_col[3] = {2, 3, 1}, sb_mid[2] = {3, 1};
    for (size_t k = 0; k < sizeof k_bins / sizeof k_bins[0]; k++) {
        cm_tape *tp = cmt_tape();
        struct {
            int nd;
            const int64_t *s;
        } bs[] = {{3, sb_full}, {1, sb_row}, {3, sb_col}, {2, sb_mid}};
        for (size_t j = 0; j < 4; j++) {
            cm_tensor *a = cmt_randn(tp, 3, sa, 1 + j, true);
            cm_tensor *b = k_bins[k].fn == cm_div ? cmt_rand_uniform(tp, bs[j].nd, bs[j].s, 2 + j, 0.5f, 2.0f, true)
                                                 : cmt_randn(tp, bs[j].nd, bs[j].s, 2 + j, true);
            cm_tensor *in[2] = {a, b};
            cmt_gradcheck(k_bins[k].name, call_bin, (void *)k_bins[k].fn, 2, in, NULL);
            /* b broadcast against a (swap roles) */
            cm_tensor *in2[2] = {b, a};
            if (k_bins[k].fn != cm_div) cmt_gradcheck(k_bins[k].name, call_bin, (void *)k_bins[k].fn, 2, in2, NULL);
        }
        cm_tensor *an = cmt_randn_noncontig(tp, 3, sa, 9, true);
        cm_tensor *bn = cmt_randn_noncontig(tp, 3, sa, 10, true);
        cm_tensor *in3[2] = {an, bn};
        if (k_bins[k].fn != cm_div) cmt_gradcheck(k_bins[k].name, call_bin, (void *)k_bins[k].fn, 2, in3, NULL);
        cm_tape_free(tp);
    }
}

Test(elementwise, binary_forward_values) {
    cm_tape *tp = cmt_tape();
    int64_t s[2] = {2, 2}, r[1] = {2};
    cm_tensor *a = cm_arange(tp, CM_DTYPE_F32, 1, 5, 1);
    a = cm_reshape(tp, a, 2, s);
    cm_tensor *b = cm_full(tp, CM_DTYPE_F32, 1, r, 2.0);
    cm_tensor *o = cm_div(tp, cm_sub(tp, cm_mul(tp, cm_add(tp, a, b), b), b), b);
    cr_assert(o, "%s", cm_tape_error(tp));
    const float want[4] = {2, 3, 4, 5}; /* ((a+2)*2-2)/2 = a+1 */
    cmt_assert_close_f32("chain", cm_tensor_data(o), want, 4, 1e-6, 0);
    cm_tape_free(tp);
}

Test(elementwise, binary_shape_mismatch_names_shapes) {
    cm_tape *tp = cmt_tape();
    int64_t s1[2] = {2, 3}, s2[2] = {4, 3};
    cm_tensor *a = cmt_randn(tp, 2, s1, 1, false), *b = cmt_randn(tp, 2, s2, 2, false);
    cr_assert_null(cm_add(tp, a, b));
    cr_assert_eq(cm_tape_status(tp), CM_ERR_SHAPE);
    cr_assert(strstr(cm_tape_error(tp), "(2, 3)") && strstr(cm_tape_error(tp), "(4, 3)"), "message: %s",
              cm_tape_error(tp));
    /* chaining: later ops return NULL and keep the first error */
    cr_assert_null(cm_exp(tp, cm_add(tp, a, b)));
    cr_assert(strstr(cm_tape_error(tp), "add:"), "first error kept: %s", cm_tape_error(tp));
    cr_assert_eq(cm_last_status(), CM_ERR_SHAPE);
    cm_tape_free(tp);
}

Test(elementwise, bad_dtype_is_an_error_naming_the_op) {
    cm_tape *tp = cmt_tape();
    int64_t s[1] = {3};
    cm_tensor *a = cm_zeros(tp, CM_DTYPE_I64, 1, s);
    cr_assert_null(cm_exp(tp, a));
    cr_assert_eq(cm_tape_status(tp), CM_ERR_DTYPE);
    cr_assert(strstr(cm_tape_error(tp), "exp") && strstr(cm_tape_error(tp), "i64"), "%s", cm_tape_error(tp));
    cm_tape_free(tp);
}

static const struct {
    const char *name;
    un_fn fn;
    float lo, hi; /* input domain */
} k_uns[] = {
    {"neg", cm_neg, -2, 2},   {"exp", cm_exp, -2, 2},   {"log", cm_log, 0.5f, 3}, {"sqrt", cm_sqrt, 0.5f, 3},
    {"abs", cm_abs, -2, 2},   {"relu", cm_relu, -2, 2}, {"silu", cm_silu, -3, 3}, {"tanh", cm_tanh, -2, 2},
    {"sigmoid", cm_sigmoid, -3, 3},
};

Test(elementwise, unary_ops_gradcheck) {
    const int64_t s[2] = {5, 7};
    for (size_t k = 0; k < sizeof k_uns / sizeof k_uns[0]; k++) {
        cm_tape *tp = cmt_tape();
        cm_tensor *x = cmt_rand_uniform(tp, 2, s, 3 + k, k_uns[k].lo, k_uns[k].hi, true);
        /* keep |x| away from the kinks of abs and relu */
        if (k_uns[k].fn == cm_abs || k_uns[k].fn == cm_relu) {
            float *v = cm_tensor_data(x);
            for (int i = 0; i < 35; i++)
                if (fabsf(v[i]) < 0.05f) v[i] = 0.3f;
        }
        cm_tensor *in[1] = {x};
        cmt_gradcheck(k_uns[k].name, call_un, (void *)k_uns[k].fn, 1, in, NULL);
        cm_tensor *xn = cmt_randn_noncontig(tp, 2, s, 4 + k, false);
        cm_tensor *o1 = k_uns[k].fn(tp, xn);
        cm_tensor *o2 = k_uns[k].fn(tp, cm_contiguous(tp, xn));
        cr_assert(o1 && o2);
        cmt_assert_close(k_uns[k].name, o1, o2, 0, 0);
        cm_tape_free(tp);
    }
}

typedef struct {
    int kind;
    float p0, p1;
} sc_ctx;

static cm_tensor *call_sc(cm_tape *tp, cm_tensor *const *in, void *vctx) {
    const sc_ctx *c = vctx;
    switch (c->kind) {
    case 0: return cm_add_scalar(tp, in[0], c->p0);
    case 1: return cm_mul_scalar(tp, in[0], c->p0);
    case 2: return cm_pow(tp, in[0], c->p0);
    case 3: return cm_clamp(tp, in[0], c->p0, c->p1);
    case 4: return cm_gelu(tp, in[0], true);
    case 5: return cm_gelu(tp, in[0], false);
    default: return cm_bias_gelu(tp, in[0], in[1], c->p0 != 0);
    }
}

Test(elementwise, scalar_ops_gelu_and_bias_gelu_gradcheck) {
    cm_tape *tp = cmt_tape();
    const int64_t s[2] = {4, 6}, bs[1] = {6};
    sc_ctx cases[] = {{0, 1.5f, 0}, {1, -0.7f, 0}, {2, 2.0f, 0}, {2, 3.0f, 0}, {2, 0.5f, 0},
                      {3, -0.5f, 0.5f}, {4, 0, 0}, {5, 0, 0}, {6, 1, 0}, {6, 0, 0}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        bool positive = cases[k].kind == 2 && cases[k].p0 == 0.5f;
        cm_tensor *x = positive ? cmt_rand_uniform(tp, 2, s, 10 + k, 0.5f, 2.0f, true)
                                : cmt_rand_uniform(tp, 2, s, 10 + k, -2.0f, 2.0f, true);
        if (cases[k].kind == 3) { /* away from the clamp edges */
            float *v = cm_tensor_data(x);
            for (int i = 0; i < 24; i++)
                if (fabsf(fabsf(v[i]) - 0.5f) < 0.05f) v[i] = 0.2f;
        }
        cm_tensor *b = cmt_randn(tp, 1, bs, 20 + k, true);
        cm_tensor *in[2] = {x, b};
        cmt_gradcheck("scalar/gelu", call_sc, &cases[k], cases[k].kind == 6 ? 2 : 1, in, NULL);
    }
    cm_tape_free(tp);
}

Test(elementwise, gelu_values_match_reference_formulas) {
    cm_tape *tp = cmt_tape();
    cm_tensor *x = cm_arange(tp, CM_DTYPE_F32, -3, 3, 0.5);
    cm_tensor *gt = cm_gelu(tp, x, true), *ge = cm_gelu(tp, x, false);
    for (int64_t i = 0; i < cm_tensor_numel(x); i++) {
        double v = cm_tensor_get_flat(x, i);
        double t = 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
        double e = 0.5 * v * (1 + erf(v / sqrt(2.0)));
        cr_assert_float_eq(cm_tensor_get_flat(gt, i), t, 1e-6, "gelu tanh at %g", v);
        cr_assert_float_eq(cm_tensor_get_flat(ge, i), e, 1e-6, "gelu erf at %g", v);
    }
    cm_tape_free(tp);
}

/* The GELU kernels use cmi_vtanhf (vexp.h) instead of libm's tanhf: check it over the range GELU
 * feeds it, at the polynomial/exp switch (0.625), in the saturated tails and for NaN / ±inf. */
Test(elementwise, vectorised_tanh_matches_tanhf_within_3_ulp) {
    for (float x = -12.0f; x <= 12.0f; x += 0.00731f) {
        const double want = tanhf(x), got = cmi_vtanhf(x);
        const double ulp = fabs(want) < 1.2e-38 ? 1.4e-45 : fabs(want) * 5.96e-8;
        cr_assert(fabs(got - want) <= 3 * ulp + 1e-45, "vtanhf(%.7g) = %.9g vs tanhf %.9g (> 3 ulp)", (double)x, got,
                  want);
    }
    const float edge[] = {0.62499994f, 0.625f, -0.625f, 1e-6f, -1e-30f, 0.0f, 9.0f, -9.0f, 50.0f, -50.0f};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) {
        const double want = tanhf(edge[i]), got = cmi_vtanhf(edge[i]);
        cr_assert(fabs(got - want) <= 3 * fabs(want) * 5.96e-8, "vtanhf(%.9g) = %.9g vs tanhf %.9g", (double)edge[i],
                  got, want);
    }
    cr_assert_eq(cmi_vtanhf(INFINITY), 1.0f);
    cr_assert_eq(cmi_vtanhf(-INFINITY), -1.0f);
    cr_assert(isnan(cmi_vtanhf(NAN)));
}

/* The exact-GELU kernels use cmi_vnormcdf / cmi_vnormpdf (vexp.h) instead of libm's erff / expf:
 * Φ within 8 ulp of a double-precision reference over [-12, 12] — including the negative tail,
 * where the old ½(1 + erff(x/√2)) lost every digit — and GELU's derivative Φ + x·φ within 8 ulp of
 * the larger of its two terms (it crosses 0 near x = -0.75); the infinities and NaN. */
Test(elementwise, vectorised_normal_cdf_and_density_within_8_ulp) {
    double worst_cdf = 0, worst_grad = 0;
    for (float x = -12.0f; x <= 12.0f; x += 0.000731f) {
        const double Phi = 0.5 * erfc(-(double)x / sqrt(2.0)), phi = exp(-0.5 * (double)x * x) / sqrt(2.0 * M_PI);
        const double e_cdf = fabs(cmi_vnormcdf(x) - Phi) / (Phi * 5.96e-8);
        const double got_grad = (double)cmi_vnormcdf(x) + (double)x * (double)cmi_vnormpdf(x);
        const double e_grad = fabs(got_grad - (Phi + x * phi)) / ((Phi + fabs(x * phi)) * 5.96e-8);
        cr_assert(e_cdf <= 8.0, "vnormcdf(%.7g) = %.9g vs %.9g (%.1f ulp)", (double)x, (double)cmi_vnormcdf(x), Phi, e_cdf);
        cr_assert(e_grad <= 8.0, "GELU'(%.7g) = %.9g vs %.9g (%.1f ulp)", (double)x, got_grad, Phi + x * phi, e_grad);
        worst_cdf = fmax(worst_cdf, e_cdf), worst_grad = fmax(worst_grad, e_grad);
    }
    cr_log_info("vnormcdf worst %.2f ulp, GELU' worst %.2f ulp", worst_cdf, worst_grad);
    cr_assert_eq(cmi_vnormcdf(INFINITY), 1.0f);
    cr_assert_eq(cmi_vnormcdf(-INFINITY), 0.0f);
    cr_assert_eq(cmi_vnormcdf(0.0f), 0.5f);
    cr_assert_eq(cmi_vnormpdf(INFINITY), 0.0f);
    cr_assert_eq(cmi_vnormpdf(-INFINITY), 0.0f);
    cr_assert(isnan(cmi_vnormcdf(NAN)) && isnan(cmi_vnormpdf(NAN)));
}
