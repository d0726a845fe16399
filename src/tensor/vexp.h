/* A vectorisable expf for the softmax and cross-entropy kernels (private).
 *
 * glibc's expf is only vectorised under -ffast-math, which the library does not use, so the
 * softmax loops ran one scalar expf per element. This is the Cephes single-precision scheme:
 * exp(x) = 2^n · exp(r), r = x - n·ln2 in [-ln2/2, ln2/2], a degree-6 polynomial, n put in the
 * exponent bits. Error ≤ 3 ulp against expf for x ≤ 88 (tested) (the kernels only call it with x ≤ 0);
 * exp(x) = 0 below -87.3 (where expf is denormal), +inf above 88.72, NaN in gives NaN out. Every
 * step is branch-free so GCC vectorises loops that call it. */
#ifndef CM_TENSOR_VEXP_H
#define CM_TENSOR_VEXP_H

#include <math.h>
#include <stdint.h>

static inline float cmi_vexpf(float x) {
    const float lo = -87.33654475f, hi = 88.0f;
    /* ternaries, not fminf/fmaxf: those stay libm calls without -ffinite-math-only */
    /* NaN compares false, so it takes the `lo` arm: n stays in range and the shift below is
     * defined (the NaN is passed through at the end) */
    const float xc = x >= lo ? (x > hi ? hi : x) : lo;
    /* round to nearest by the 1.5·2^23 trick: floorf is a libm call (not vectorised) unless
     * -fno-trapping-math */
    const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float e = p * r * r + r + 1.0f;
    /* 2^n through the exponent bits; a union (defined in C) rather than memcpy, which GCC
     * leaves as a stack round-trip that blocks vectorisation */
    const union {
        int32_t i;
        float f;
    } scale = {.i = ((int32_t)n + 127) << 23};
    const float res = e * scale.f;
    return x != x ? x : (x < lo ? 0.0f : (x > 88.72283935f ? INFINITY : res));
}

/* Σ exp(x[k·s] - shift) for k < n. Float lanes inside blocks of 1024 (an omp-simd float
 * reduction vectorises; a double one around cmi_vexpf does not), block sums in double.
 * always_inline so a call with a literal s = 1 becomes a contiguous loop. */
static inline __attribute__((always_inline)) double cmi_sum_exp(const float *x, int64_t n, int64_t s, float shift) {
    double total = 0.0;
    for (int64_t b = 0; b < n; b += 1024) {
        const int64_t e = n - b < 1024 ? n : b + 1024;
        float part = 0.0f;
#pragma omp simd reduction(+ : part)
        for (int64_t k = b; k < e; k++) part += cmi_vexpf(x[k * s] - shift);
        total += part;
    }
    return total;
}

/* A vectorisable tanhf for the GELU kernels (private), branch-free like cmi_vexpf: for |x| < 0.625
 * Cephes' odd polynomial x + x^3 P(x^2) (relative error ~1 ulp near 0, where 1 - 2/(e+1) would
 * lose all relative precision), else sign(x)(1 - 2/(exp(2|x|) + 1)) through cmi_vexpf, which
 * saturates to ±1 (exp overflows to +inf) without a special case. Error ≤ 3 ulp against tanhf
 * (tested); NaN in gives NaN out. glibc's tanhf is a scalar call into expm1f, which was 12 % of a
 * GPT training step. */
static inline float cmi_vtanhf(float x) {
    const float ax = x < 0.0f ? -x : x;
    const float z = x * x;
    float p = -5.70498872745e-3f;
    p = p * z + 2.06390887954e-2f;
    p = p * z - 5.37397155531e-2f;
    p = p * z + 1.33314422036e-1f;
    p = p * z - 3.33332819422e-1f;
    const float small = p * z * x + x;
    const float t = 1.0f - 2.0f / (cmi_vexpf(2.0f * ax) + 1.0f);
    const float big = x < 0.0f ? -t : t;
    return ax < 0.625f ? small : (x != x ? x : big);
}

/* exp(-a²/2 + c) for 0 ≤ a ≤ 20 and a small c ≤ 0, with -a²/2 split so that its rounding (up to
 * 64 ulp of the result near a = 12) does not reach the exponential: a = hi + lo with hi's low 12
 * mantissa bits cleared, so hi² is exact, and exp(-hi²/2) · exp(c - hi·lo - lo²/2). */
static inline float cmi_vexp_neg_half_sq(float a, float c) {
    union {
        float f;
        int32_t i;
    } h = {.f = a};
    h.i &= (int32_t)0xFFFFF000;
    const float hi = h.f, lo = a - hi;
    return cmi_vexpf(-0.5f * hi * hi) * cmi_vexpf(c - (hi * lo + 0.5f * lo * lo));
}

/* A vectorisable standard normal CDF Φ(x) = ½·erfc(|x|/√2) or 1 - ½·erfc(|x|/√2) for the exact-GELU
 * kernels (private). erfc(z), z ≥ 0, is Numerical Recipes' erfcc (Press et al., 2nd ed., §6.2: a
 * Chebyshev fit t·exp(-z² + P(t)), t = 1/(1 + z/2), fractional error < 1.2e-7 for every z ≥ 0).
 * Taking the small tail directly keeps Φ's relative precision for negative x, where
 * ½(1 + erff(x/√2)) cancels (libm's erff included: 4 % off at x = -5, no digit left at x = -6);
 * exp(-z² + P) = exp(-x²/2 + P) through cmi_vexp_neg_half_sq.
 * Error ≤ 8 ulp against a double-precision reference over x in [-12, 12] (tested); Φ(+inf) = 1,
 * Φ(-inf) = 0, NaN in gives NaN out. Branch-free, as cmi_vexpf. glibc's erff is a scalar call:
 * GELU's forward and backward were 14 % of a BERT-Tiny training step. */
static inline float cmi_vnormcdf(float x) {
    /* |x| capped at 20 (Φ(-20) ≈ 3e-89 is 0 in float) so that ±inf meets no inf - inf; NaN takes
     * the cap too and is passed through at the end */
    const float ax = x < 0.0f ? (x > -20.0f ? -x : 20.0f) : (x < 20.0f ? x : 20.0f);
    const float t = 1.0f / (1.0f + 0.35355339059327376f * ax); /* 1 / (1 + z/2) */
    float p = 0.17087277f;
    p = p * t - 0.82215223f;
    p = p * t + 1.48851587f;
    p = p * t - 1.13520398f;
    p = p * t + 0.27886807f;
    p = p * t - 0.18628806f;
    p = p * t + 0.09678418f;
    p = p * t + 0.37409196f;
    p = p * t + 1.00002368f;
    p = p * t - 1.26551223f;
    const float half_erfc = 0.5f * t * cmi_vexp_neg_half_sq(ax, p);
    return x >= 0.0f ? 1.0f - half_erfc : (x != x ? x : half_erfc);
}

/* The standard normal density φ(x) = exp(-x²/2)/√(2π), -x²/2 split as in cmi_vnormcdf: error
 * ≤ 8 ulp for |x| ≤ 12 (tested with GELU's derivative Φ + x·φ); NaN gives NaN, ±inf gives 0. */
static inline float cmi_vnormpdf(float x) {
    const float ax = x < 0.0f ? (x > -20.0f ? -x : 20.0f) : (x < 20.0f ? x : 20.0f);
    return x != x ? x : 0.3989422804014327f * cmi_vexp_neg_half_sq(ax, 0.0f);
}

#endif
