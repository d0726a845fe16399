/* cm_peak_flops: the machine's f32 FMA peak, from CM_PEAK_FLOPS or a short measurement on every
 * thread at once (for SpeedMonitor's MFU). */
#include "cb_impl.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CM_X86 1
#endif

/* Independent accumulators: enough to cover the FMA latency (4) on two ports. */
enum { NACC = 12 };

#ifdef CM_X86
__attribute__((target("avx512f"))) static float fma_avx512(int64_t iters, float seed) {
    __m512 acc[NACC];
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(seed * 1e-7f);
    for (int k = 0; k < NACC; k++) acc[k] = _mm512_set1_ps(seed + (float)k);
    for (int64_t i = 0; i < iters; i++)
        for (int k = 0; k < NACC; k++) acc[k] = _mm512_fmadd_ps(acc[k], a, b);
    __m512 s = acc[0];
    for (int k = 1; k < NACC; k++) s = _mm512_add_ps(s, acc[k]);
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static float fma_avx2(int64_t iters, float seed) {
    __m256 acc[NACC];
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(seed * 1e-7f);
    for (int k = 0; k < NACC; k++) acc[k] = _mm256_set1_ps(seed + (float)k);
    for (int64_t i = 0; i < iters; i++)
        for (int k = 0; k < NACC; k++) acc[k] = _mm256_fmadd_ps(acc[k], a, b);
    __m256 s = acc[0];
    for (int k = 1; k < NACC; k++) s = _mm256_add_ps(s, acc[k]);
    float o[8];
    _mm256_storeu_ps(o, s);
    return o[0] + o[1] + o[2] + o[3] + o[4] + o[5] + o[6] + o[7];
}
#endif

static float fma_scalar(int64_t iters, float seed) {
    float acc[NACC];
    for (int k = 0; k < NACC; k++) acc[k] = seed + (float)k;
    for (int64_t i = 0; i < iters; i++)
        for (int k = 0; k < NACC; k++) acc[k] = fmaf(acc[k], 0.999999f, seed * 1e-7f);
    float s = 0;
    for (int k = 0; k < NACC; k++) s += acc[k];
    return s;
}

static volatile float g_sink;

/* FLOP/s of all threads running the widest FMA loop the CPU has at once. Each thread times its
 * own loop (best of 24 rounds of under a millisecond: a VM's virtual cores can share a physical
 * core for a while, which halves a round's rate; with 4 rounds one run here read 118 GFLOP/s
 * where the next read 236) and the rates add up, so a thread that starts late or is preempted
 * between rounds does not pull the others' numbers down. */
static double measure(void) {
    int lanes = 1;
    float (*fn)(int64_t, float) = fma_scalar;
#ifdef CM_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) fn = fma_avx512, lanes = 16;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) fn = fma_avx2, lanes = 8;
#endif
    const int nt = cm_num_threads() > 0 ? cm_num_threads() : 1;
    const int64_t iters = lanes > 1 ? 200000 : 20000; /* ~10 ms per round at a few GHz */
    const double flops = 2.0 * NACC * lanes * (double)iters;
    double total = 0;
    float sink = 0;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(+ : total, sink)
    for (int t = 0; t < nt; t++) {
        double best = 0;
        for (int round = 0; round < 24; round++) {
            const double t0 = cm_clock_s();
            sink += fn(iters, 1.0f + (float)t);
            const double dt = cm_clock_s() - t0;
            if (dt > 0 && flops / dt > best) best = flops / dt;
        }
        total += best;
    }
    g_sink = sink;
    return total;
}

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static double g_measured;
static void do_measure(void) { g_measured = measure(); }

cm_status cm_peak_flops_measure(double *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_peak_flops_measure: out is NULL");
    *out = measure();
    return CM_OK;
}

cm_status cm_peak_flops(double *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_peak_flops: out is NULL");
    const char *env = getenv("CM_PEAK_FLOPS");
    if (env && *env) {
        char *end;
        errno = 0;
        double v = strtod(env, &end);
        while (*end == ' ') end++;
        if (errno || *end || !(v > 0) || !isfinite(v))
            return cm_set_error(CM_ERR_INVALID_ARG,
                                "CM_PEAK_FLOPS='%s' is not a positive number of FLOP/s (e.g. 3.2e12); unset it to "
                                "measure the peak", env);
        *out = v;
        return CM_OK;
    }
    pthread_once(&g_once, do_measure);
    *out = g_measured;
    return CM_OK;
}
