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

#endif
