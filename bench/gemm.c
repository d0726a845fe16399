/* GEMM throughput: f32 (OpenBLAS) and bf16 (oneDNN, f32 accumulation) at transformer shapes — the
 * forward GEMM of a linear layer and its two backward GEMMs — beside the machine's measured FMA
 * peak, then the cost of thread oversubscription. Prints tables and appends one dated line per
 * result to bench/results/gemm.tsv.
 *
 *   make bench                      # or: build/bench/bench_gemm [results.tsv]
 *
 * Shapes: rows = B·T = 2048 (GPT-2 small, C = 768, and a 384-wide model at T = 256, B = 8).
 *   fwd  y (R, out)  = x (R, in) · wᵀ        M = R,   N = out, K = in   (B transposed)
 *   bwdx dx (R, in)  = dy (R, out) · w       M = R,   N = in,  K = out
 *   bwdw dw (out,in) = dyᵀ (out, R) · x      M = out, N = in,  K = R     (A transposed) */
#include <composer/composer.h>

#include <cblas.h>
#include <errno.h>
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tensor/dnnl_gemm.h"

static FILE *g_tsv;
static char g_date[32], g_host[64];

static void tsv(const char *section, const char *name, const char *dtype, int64_t m, int64_t n, int64_t k, int threads,
                double ms, double gflops, double pct) {
    if (!g_tsv) return;
    fprintf(g_tsv, "%s\t%s\t%s\t%s\t%s\t%lld\t%lld\t%lld\t%d\t%.3f\t%.1f\t%.1f\n", g_date, g_host, section, name, dtype,
            (long long)m, (long long)n, (long long)k, threads, ms, gflops, pct);
}

static FILE *open_tsv(const char *path_arg) {
    char path[1024];
    if (path_arg) {
        snprintf(path, sizeof path, "%s", path_arg);
    } else {
        /* bench/results under the working directory (make bench runs from the repo root), else next to
         * this source file. */
        struct stat st;
        if (stat("bench", &st) == 0 && S_ISDIR(st.st_mode)) {
            snprintf(path, sizeof path, "bench/results");
        } else {
            snprintf(path, sizeof path, "%s", __FILE__);
            char *slash = strrchr(path, '/');
            if (slash) snprintf(slash, sizeof path - (size_t)(slash - path), "/results");
            else snprintf(path, sizeof path, "results");
        }
        if (mkdir(path, 0755) != 0 && errno != EEXIST) {
            fprintf(stderr, "bench_gemm: cannot create %s: %s (results not saved)\n", path, strerror(errno));
            return NULL;
        }
        strncat(path, "/gemm.tsv", sizeof path - strlen(path) - 1);
    }
    struct stat st;
    bool fresh = stat(path, &st) != 0;
    FILE *f = fopen(path, "a");
    if (!f) {
        fprintf(stderr, "bench_gemm: cannot open %s: %s (results not saved)\n", path, strerror(errno));
        return NULL;
    }
    if (fresh) fprintf(f, "date\thost\tsection\tname\tdtype\tM\tN\tK\tthreads\tms\tgflops\tpct_peak\n");
    printf("results: appending to %s\n", path);
    return f;
}

/* ------------------------------------------------------------------------------------------ */
/* FMA peak                                                                                    */
/* ------------------------------------------------------------------------------------------ */

#if defined(__AVX512F__)
#define VEC 16
typedef __m512 vec;
#define VSET1 _mm512_set1_ps
#define VFMA _mm512_fmadd_ps
static float vsum(vec v) { return _mm512_reduce_add_ps(v); }
#define ISA "AVX-512"
#elif defined(__FMA__)
#define VEC 8
typedef __m256 vec;
#define VSET1 _mm256_set1_ps
#define VFMA _mm256_fmadd_ps
static float vsum(vec v) {
    float t[8];
    _mm256_storeu_ps(t, v);
    return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}
#define ISA "AVX2"
#else
#error "bench_gemm needs FMA (build with -march=native on an x86-64 machine with FMA)"
#endif

/* 16 independent FMA chains (2 ports × 4-cycle latency need ≥ 8 in flight). Returns FLOPs. */
static double fma_loop(int64_t iters, float *sink) {
    vec acc[16];
    for (int j = 0; j < 16; j++) acc[j] = VSET1(0.001f * (float)j);
    const vec m = VSET1(0.9999999f), a = VSET1(1e-6f);
    for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) acc[j] = VFMA(acc[j], m, a);
    }
    float s = 0;
    for (int j = 0; j < 16; j++) s += vsum(acc[j]);
    *sink += s;
    return (double)iters * 16.0 * VEC * 2.0;
}

static double peak_gflops(int threads) {
    /* Many short runs, best one: on a shared machine the quiet moments give the real peak. */
    const int64_t iters = 3000000;
    double best = 0;
    for (int rep = 0; rep < 25; rep++) {
        double flops = 0;
        float sink = 0;
        double t0 = cm_clock_s();
#pragma omp parallel num_threads(threads) reduction(+ : flops, sink)
        flops += fma_loop(iters, &sink);
        double dt = cm_clock_s() - t0;
        if (sink == 12345.0f) printf(" "); /* keep the loop alive */
        double g = flops / dt * 1e-9;
        if (g > best) best = g;
    }
    return best;
}

/* ------------------------------------------------------------------------------------------ */
/* GEMMs                                                                                       */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    const char *name;
    int64_t m, n, k;
    bool ta, tb;
} problem;

static float *g_a, *g_b, *g_c;
static uint16_t *g_ah, *g_bh;
static cm_tape *g_tape;

static bool g_f32_onednn; /* f32 through oneDNN's sgemm (cmi_sgemm's other kernel) instead of OpenBLAS */

static void run_gemm(cm_dtype dt, const problem *p) {
    const int64_t lda = p->ta ? p->m : p->k, ldb = p->tb ? p->k : p->n;
    if (dt == CM_DTYPE_F32 && g_f32_onednn) {
        cmi_f32_set_kernel(CMI_F32_ONEDNN);
        cmi_sgemm(p->ta, p->tb, p->m, p->n, p->k, 1.0f, g_a, lda, g_b, ldb, 0.0f, g_c, p->n);
    } else if (dt == CM_DTYPE_F32) {
        cblas_sgemm(CblasRowMajor, p->ta ? CblasTrans : CblasNoTrans, p->tb ? CblasTrans : CblasNoTrans, (int)p->m,
                    (int)p->n, (int)p->k, 1.0f, g_a, (int)lda, g_b, (int)ldb, 0.0f, g_c, (int)p->n);
    } else {
        if (cmi_gemm_bf16(g_tape, p->m, p->n, p->k, g_ah, lda, p->ta, g_bh, ldb, p->tb, NULL, false, g_c, p->n)) {
            fprintf(stderr, "bench_gemm: %s\n", cm_tape_error(g_tape));
            exit(1);
        }
        cm_tape_reset(g_tape);
    }
}

/* Best of `reps` timed runs after one warm-up (the warm-up also creates the oneDNN primitive). */
static double time_gemm(cm_dtype dt, const problem *p, int reps) {
    run_gemm(dt, p);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = cm_clock_s();
        run_gemm(dt, p);
        double t = cm_clock_s() - t0;
        if (t < best) best = t;
    }
    return best;
}

static double flops_of(const problem *p) { return 2.0 * (double)p->m * (double)p->n * (double)p->k; }

/* ------------------------------------------------------------------------------------------ */
/* Oversubscription                                                                            */
/* ------------------------------------------------------------------------------------------ */

static double time_split(int64_t m, int64_t n, int64_t k, int outer, int reps) {
    /* `outer` threads each multiply their own block of m/outer rows: x (m, k) · wᵀ */
    double best = 1e30;
    for (int r = 0; r <= reps; r++) {
        double t0 = cm_clock_s();
#pragma omp parallel num_threads(outer)
        {
            int t = omp_get_thread_num();
            int64_t rows = m / outer, r0 = rows * t;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)n, (int)k, 1.0f, g_a + r0 * k, (int)k,
                        g_b, (int)k, 0.0f, g_c + r0 * n, (int)n);
        }
        double dt = cm_clock_s() - t0;
        if (r > 0 && dt < best) best = dt; /* r = 0 warms up */
    }
    return best;
}

int main(int argc, char **argv) {
    time_t now = time(NULL);
    strftime(g_date, sizeof g_date, "%Y-%m-%dT%H:%M:%S", localtime(&now));
    if (gethostname(g_host, sizeof g_host) != 0) snprintf(g_host, sizeof g_host, "?");
    if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
        fprintf(stderr, "usage: %s [results.tsv]   (default: bench/results/gemm.tsv)\n", argv[0]);
        return argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) ? 0 : 2;
    }
    g_tsv = open_tsv(argc > 1 ? argv[1] : NULL);
    const int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    const int nt = cm_num_threads();
    if (cm_tape_new(NULL, &g_tape) != CM_OK) return 1;

    printf("\n== FMA peak (%s, %d-wide f32, measured) ==\n", ISA, VEC);
    double peak1 = peak_gflops(1), peakn = peak_gflops(cores);
    printf("  1 core      %8.1f GFLOP/s\n  %2d cores    %8.1f GFLOP/s\n", peak1, cores, peakn);
    tsv("peak", "fma", "f32", 0, 0, 0, 1, 0, peak1, 100);
    tsv("peak", "fma", "f32", 0, 0, 0, cores, 0, peakn, 100);
    /* On a shared machine the all-core run rarely gets every core to itself; cores × the 1-core
     * peak is the ideal the GEMMs are measured against then. */
    if (peakn < peak1 * cores) {
        printf("  reference   %8.1f GFLOP/s   (%d x 1-core peak: the all-core run was disturbed)\n", peak1 * cores,
               cores);
        peakn = peak1 * cores;
    }

    const int64_t R = 2048;
    const struct {
        const char *model;
        int64_t in, out;
    } layers[] = {
        {"768 qkv", 768, 2304}, {"768 proj", 768, 768}, {"768 fc", 768, 3072}, {"768 fc2", 3072, 768},
        {"384 qkv", 384, 1152}, {"384 proj", 384, 384}, {"384 fc", 384, 1536}, {"384 fc2", 1536, 384},
    };
    const int n_layers = (int)(sizeof layers / sizeof layers[0]);
    size_t maxe = 0;
    for (int i = 0; i < n_layers; i++) {
        size_t e = (size_t)R * (size_t)(layers[i].in > layers[i].out ? layers[i].in : layers[i].out);
        if (e > maxe) maxe = e;
    }
    g_a = malloc(sizeof(float) * maxe);
    g_b = malloc(sizeof(float) * maxe);
    g_c = malloc(sizeof(float) * maxe);
    g_ah = malloc(sizeof(uint16_t) * maxe);
    g_bh = malloc(sizeof(uint16_t) * maxe);
    if (!g_a || !g_b || !g_c || !g_ah || !g_bh) return 1;
    cm_rng rng = cm_rng_init(1, 0);
    cm_rng_normal(&rng, g_a, maxe, 0, 1);
    cm_rng_normal(&rng, g_b, maxe, 0, 1);
    for (size_t i = 0; i < maxe; i++) g_ah[i] = cm_f32_to_bf16(g_a[i]), g_bh[i] = cm_f32_to_bf16(g_b[i]);

    printf("\n== GEMM, %d threads, rows B*T = %lld (best of 3; %% of the %d-core reference peak) ==\n", nt, (long long)R, cores);
    printf("  f32: OpenBLAS cblas_sgemm | oneDNN dnnl_sgemm (cmi_sgemm's kernels; the library uses %s here)\n",
           cmi_f32_kernel_name(cmi_f32_get_kernel()));
    printf("  %-9s %-5s %6s %6s %6s | %9s %8s %5s | %9s %8s %5s | %9s %8s %5s\n", "layer", "gemm", "M", "N", "K",
           "f32 ms", "GFLOP/s", "%pk", "dnnl ms", "GFLOP/s", "%pk", "bf16 ms", "GFLOP/s", "%pk");
    for (int i = 0; i < n_layers; i++) {
        const int64_t in = layers[i].in, out = layers[i].out;
        const problem ps[3] = {{"fwd", R, out, in, false, true}, {"bwdx", R, in, out, false, false},
                               {"bwdw", out, in, R, true, false}};
        for (int j = 0; j < 3; j++) {
            const problem *p = &ps[j];
            const cmi_f32_kernel kept = cmi_f32_get_kernel();
            g_f32_onednn = false;
            double t32 = time_gemm(CM_DTYPE_F32, p, 3);
            g_f32_onednn = true;
            double td = time_gemm(CM_DTYPE_F32, p, 3);
            g_f32_onednn = false;
            cmi_f32_set_kernel(kept);
            double t16 = time_gemm(CM_DTYPE_BF16, p, 3);
            double g32 = flops_of(p) / t32 * 1e-9, gd = flops_of(p) / td * 1e-9, g16 = flops_of(p) / t16 * 1e-9;
            printf("  %-9s %-5s %6lld %6lld %6lld | %9.2f %8.1f %5.0f | %9.2f %8.1f %5.0f | %9.2f %8.1f %5.0f\n",
                   layers[i].model, p->name, (long long)p->m, (long long)p->n, (long long)p->k, t32 * 1e3, g32,
                   100 * g32 / peakn, td * 1e3, gd, 100 * gd / peakn, t16 * 1e3, g16, 100 * g16 / peakn);
            char name[64];
            snprintf(name, sizeof name, "%s %s", layers[i].model, p->name);
            tsv("gemm", name, "f32", p->m, p->n, p->k, nt, t32 * 1e3, g32, 100 * g32 / peakn);
            tsv("gemm", name, "f32_onednn", p->m, p->n, p->k, nt, td * 1e3, gd, 100 * gd / peakn);
            tsv("gemm", name, "bf16", p->m, p->n, p->k, nt, t16 * 1e3, g16, 100 * g16 / peakn);
        }
    }

    /* Oversubscription: the same f32 work (x (2048, 768) · wᵀ (768, 768)) three ways. */
    const int64_t om = R, on = 768, ok = 768;
    const double of = 2.0 * (double)om * (double)on * (double)ok;
    const problem op = {"fwd", om, on, ok, false, true};
    printf("\n== Thread oversubscription: f32 GEMM M=%lld N=%lld K=%lld on %d cores (best of 5) ==\n", (long long)om,
           (long long)on, (long long)ok, cores);
    printf("  %-62s %9s %8s\n", "configuration", "ms", "GFLOP/s");
    struct {
        const char *name;
        double t;
    } rows[3];
    cm_set_num_threads(2);
    rows[0].name = "(a) one GEMM, cm_set_num_threads(2)";
    rows[0].t = time_gemm(CM_DTYPE_F32, &op, 5);
    rows[1].name = "(b) omp parallel(2), each thread one GEMM of half the rows";
    rows[1].t = time_split(om, on, ok, 2, 5);
    cm_set_num_threads(4);
    rows[2].name = "(c) one GEMM, OMP/BLAS threads = 4 on 2 cores";
    rows[2].t = time_gemm(CM_DTYPE_F32, &op, 5);
    cm_set_num_threads(nt);
    for (int i = 0; i < 3; i++) {
        printf("  %-62s %9.2f %8.1f\n", rows[i].name, rows[i].t * 1e3, of / rows[i].t * 1e-9);
        const char tag[2] = {(char)('a' + i), 0};
        tsv("oversub", tag, "f32", om, on, ok, i == 2 ? 4 : 2, rows[i].t * 1e3, of / rows[i].t * 1e-9,
            100 * of / rows[i].t * 1e-9 / peakn);
    }
    if (cores != 2)
        printf("  note: this machine has %d cores; (c) oversubscribes only where cores < 4\n", cores);

    if (g_tsv) fclose(g_tsv);
    cm_tape_free(g_tape);
    free(g_a), free(g_b), free(g_c), free(g_ah), free(g_bh);
    return 0;
}
