/* Parameter initialisers over the counter-based RNG, matching torch.nn.init's formulas. */
#include "tensor/tensor_impl.h"

#include <math.h>

/* Draws n f32 values with fn into t (through a temporary when t is not a contiguous f32). */
typedef void (*draw_fn)(cm_rng *rng, float *out, size_t n, float a, float b);

static void draw_uniform(cm_rng *rng, float *out, size_t n, float a, float b) { cm_rng_uniform(rng, out, n, a, b); }
static void draw_normal(cm_rng *rng, float *out, size_t n, float a, float b) { cm_rng_normal(rng, out, n, a, b); }

static cm_status fill_with(cm_tensor *t, cm_rng *rng, draw_fn fn, float a, float b, const float *trunc) {
    if (t->dtype != CM_DTYPE_F32 && t->dtype != CM_DTYPE_BF16 && t->dtype != CM_DTYPE_F16)
        return cm_set_error(CM_ERR_DTYPE, "init: tensor %s has dtype %s; initialisers fill floating tensors",
                            cmi_shape(t), cm_dtype_name(t->dtype));
    size_t n = (size_t)cm_tensor_numel(t);
    bool direct = t->dtype == CM_DTYPE_F32 && cmi_is_contig(t);
    float *buf = direct ? (float *)t->data : cm_alloc(n * sizeof(float) + 1, 64);
    if (!buf) return CM_ERR_OOM;
    fn(rng, buf, n, a, b);
    if (trunc) {
        /* Inverse-CDF truncation as torch's trunc_normal_: the normal draws are ignored; use
         * uniforms u in [Φ(lo), Φ(hi)] and map back through erfinv. */
        const float mean = trunc[0], std = trunc[1], lo = trunc[2], hi = trunc[3];
        double l = 0.5 * (1.0 + erf(((lo - mean) / std) / sqrt(2.0)));
        double h = 0.5 * (1.0 + erf(((hi - mean) / std) / sqrt(2.0)));
        cm_rng_uniform(rng, buf, n, 0.0f, 1.0f);
        for (size_t i = 0; i < n; i++) {
            double u = 2.0 * (l + (h - l) * buf[i]) - 1.0; /* in [2l-1, 2h-1] */
            if (u <= -1.0) u = -1.0 + 1e-7;
            if (u >= 1.0) u = 1.0 - 1e-7;
            /* erfinv by Newton on erf, from Giles' initial guess */
            double w = -log((1.0 - u) * (1.0 + u)), x;
            if (w < 5.0) {
                w -= 2.5;
                x = 2.81022636e-08;
                x = 3.43273939e-07 + x * w;
                x = -3.5233877e-06 + x * w;
                x = -4.39150654e-06 + x * w;
                x = 0.00021858087 + x * w;
                x = -0.00125372503 + x * w;
                x = -0.00417768164 + x * w;
                x = 0.246640727 + x * w;
                x = 1.50140941 + x * w;
            } else {
                w = sqrt(w) - 3.0;
                x = -0.000200214257;
                x = 0.000100950558 + x * w;
                x = 0.00134934322 + x * w;
                x = -0.00367342844 + x * w;
                x = 0.00573950773 + x * w;
                x = -0.0076224613 + x * w;
                x = 0.00943887047 + x * w;
                x = 1.00167406 + x * w;
                x = 2.83297682 + x * w;
            }
            x *= u;
            for (int it = 0; it < 2; it++) x -= (erf(x) - u) / (2.0 / sqrt(M_PI) * exp(-x * x));
            double v = mean + std * sqrt(2.0) * x;
            if (v < lo) v = lo;
            if (v > hi) v = hi;
            buf[i] = (float)v;
        }
    }
    if (!direct) {
        cm_tensor *src;
        cm_status st = cm_tensor_from_data(CM_DTYPE_F32, t->ndim, t->shape, buf, &src);
        if (st == CM_OK) {
            st = cm_tensor_copy(t, src);
            cm_tensor_free(src);
        }
        cm_free(buf);
        return st;
    }
    return CM_OK;
}

static cm_status fans(const cm_tensor *t, double *fan_in, double *fan_out) {
    if (t->ndim < 2)
        return cm_set_error(CM_ERR_SHAPE, "init: fan in/out need at least 2 dims, tensor has shape %s", cmi_shape(t));
    double rf = 1.0;
    for (int i = 2; i < t->ndim; i++) rf *= (double)t->shape[i];
    *fan_in = (double)t->shape[1] * rf;
    *fan_out = (double)t->shape[0] * rf;
    return CM_OK;
}

cm_status cm_tensor_init_uniform(cm_tensor *t, cm_rng *rng, float lo, float hi) {
    return fill_with(t, rng, draw_uniform, lo, hi, NULL);
}

cm_status cm_tensor_init_normal(cm_tensor *t, cm_rng *rng, float mean, float std) {
    return fill_with(t, rng, draw_normal, mean, std, NULL);
}

static void draw_none(cm_rng *rng, float *out, size_t n, float a, float b) {
    (void)rng, (void)out, (void)n, (void)a, (void)b;
}

cm_status cm_tensor_init_trunc_normal(cm_tensor *t, cm_rng *rng, float mean, float std, float a, float b) {
    if (!(a < b) || !(std > 0))
        return cm_set_error(CM_ERR_INVALID_ARG, "trunc_normal: need a < b and std > 0 (got a=%g b=%g std=%g)",
                            (double)a, (double)b, (double)std);
    float tr[4] = {mean, std, a, b};
    return fill_with(t, rng, draw_none, 0, 0, tr);
}

cm_status cm_tensor_init_kaiming_uniform(cm_tensor *t, cm_rng *rng, cm_fan_mode mode, float a) {
    double fi = 0, fo = 0;
    cm_status st = fans(t, &fi, &fo);
    if (st) return st;
    double fan = mode == CM_FAN_IN ? fi : fo;
    double bound = sqrt(3.0) * sqrt(2.0 / (1.0 + (double)a * a)) / sqrt(fan);
    return cm_tensor_init_uniform(t, rng, (float)-bound, (float)bound);
}

cm_status cm_tensor_init_kaiming_normal(cm_tensor *t, cm_rng *rng, cm_fan_mode mode, float a) {
    double fi = 0, fo = 0;
    cm_status st = fans(t, &fi, &fo);
    if (st) return st;
    double fan = mode == CM_FAN_IN ? fi : fo;
    return cm_tensor_init_normal(t, rng, 0.0f, (float)(sqrt(2.0 / (1.0 + (double)a * a)) / sqrt(fan)));
}

cm_status cm_tensor_init_xavier_uniform(cm_tensor *t, cm_rng *rng, float gain) {
    double fi = 0, fo = 0;
    cm_status st = fans(t, &fi, &fo);
    if (st) return st;
    double bound = gain * sqrt(6.0 / (fi + fo));
    return cm_tensor_init_uniform(t, rng, (float)-bound, (float)bound);
}

cm_status cm_tensor_init_xavier_normal(cm_tensor *t, cm_rng *rng, float gain) {
    double fi = 0, fo = 0;
    cm_status st = fans(t, &fi, &fo);
    if (st) return st;
    return cm_tensor_init_normal(t, rng, 0.0f, (float)(gain * sqrt(2.0 / (fi + fo))));
}
