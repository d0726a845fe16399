/* Optimizer step throughput on one flat buffer, against the machine's memory bandwidth.
 * Usage: bench_optim [millions of parameters (default 16)] [reps (default 10)]; CM_NUM_THREADS
 * sets the threads. An AdamW step reads p, g, m, v and writes p, m, v: 28 bytes per parameter;
 * SGD with momentum reads p, g, b and writes p, b: 20 bytes. The yardstick is a STREAM-style
 * triad a = b + s·c on buffers of the same size, counted as 16 bytes per element (two reads, one
 * write, and the read the cache does before writing a line it does not hold). */
#include <composer/composer.h>
#include <composer/optim.h>

#include <stdio.h>
#include <stdlib.h>

static double bench_step(cm_optim_kind kind, float *p, float *g, int64_t n, int reps) {
    cm_optim_hparams h = cm_optim_hparams_default(kind);
    if (kind == CM_OPTIM_SGD) {
        h.lr = 0.01;
        h.momentum = 0.9;
    }
    cm_optim_span sp = {"w", p, g, n};
    cm_optim *o;
    if (cm_optim_new(kind, &o) != CM_OK || cm_optim_add_group(o, &h, &sp, 1) != CM_OK) {
        fprintf(stderr, "bench_optim: %s\n", cm_last_error());
        exit(1);
    }
    cm_optim_step(o, 1.0); /* first touch of the state */
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = cm_clock_s();
        cm_optim_step(o, 1.0);
        double t = cm_clock_s() - t0;
        if (t < best) best = t;
    }
    cm_optim_free(o);
    return best;
}

int main(int argc, char **argv) {
    int64_t n = (int64_t)((argc > 1 ? atof(argv[1]) : 16.0) * 1e6);
    int reps = argc > 2 ? atoi(argv[2]) : 10;
    float *p = cm_alloc(sizeof(float) * (size_t)n, 64), *g = cm_alloc(sizeof(float) * (size_t)n, 64);
    float *c = cm_alloc(sizeof(float) * (size_t)n, 64);
    if (!p || !g || !c) {
        fprintf(stderr, "bench_optim: %s\n", cm_last_error());
        return 1;
    }
    cm_rng r = cm_rng_init(1, 0);
    cm_rng_normal(&r, p, (size_t)n, 0, 1);
    cm_rng_normal(&r, g, (size_t)n, 0, 1);
    cm_rng_normal(&r, c, (size_t)n, 0, 1);

    double triad = 1e30;
    for (int k = 0; k < reps + 1; k++) {
        double t0 = cm_clock_s();
#pragma omp parallel for simd schedule(static)
        for (int64_t i = 0; i < n; i++) p[i] = g[i] + 0.5f * c[i];
        double t = cm_clock_s() - t0;
        if (k > 0 && t < triad) triad = t;
    }
    double bw = 16.0 * (double)n / triad / 1e9;
    printf("threads %d, %.1fM parameters\n", cm_num_threads(), (double)n / 1e6);
    printf("%-28s %10s %10s %8s\n", "kernel", "ms", "GB/s", "of triad");
    printf("%-28s %10.2f %10.1f %7.0f%%\n", "triad a = b + s*c", triad * 1e3, bw, 100.0);
    struct {
        const char *name;
        cm_optim_kind kind;
        double bytes;
    } ks[] = {{"adamw step", CM_OPTIM_ADAMW, 28}, {"decoupled_adamw step", CM_OPTIM_DECOUPLED_ADAMW, 28},
              {"sgd momentum step", CM_OPTIM_SGD, 20}};
    for (size_t k = 0; k < sizeof ks / sizeof ks[0]; k++) {
        double t = bench_step(ks[k].kind, p, g, n, reps);
        double gbs = ks[k].bytes * (double)n / t / 1e9;
        printf("%-28s %10.2f %10.1f %7.0f%%\n", ks[k].name, t * 1e3, gbs, 100.0 * gbs / bw);
    }
    cm_free(p);
    cm_free(g);
    cm_free(c);
    return 0;
}
