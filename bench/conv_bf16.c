/* Times our own bf16 convolution kernels (src/tensor/conv_bf16.c) on the ResNet-CIFAR body
 * convolutions (3x3, stride 1, pad 1, channels-last, N = 128) against oneDNN's primitives for the
 * same pass, with the operands a ResNet under autocast has: bf16 x and dy, f32 master weights
 * (both sides round them to bf16 on the way), bf16 forward result and dx (batch norm's input
 * gradient), f32 dW. Each call
 * reads a different one of several x/dy copies (together larger than the L3 cache), as a
 * training step finds them: written long before, not in cache. Prints the best of `reps` calls
 * per kernel and pass, its GFLOP/s, and the largest difference between the two results relative
 * to the largest |value|.
 * Usage: bench_conv_bf16 [--cpu-time] [reps] (CM_NUM_THREADS sets the threads). */
#include "tensor/conv_bf16.h"
#include "tensor/dnnl_conv.h"
#include "tensor/dnnl_gemm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Wall time, or with --cpu-time the process's CPU time: with CM_NUM_THREADS=1 that times a
 * kernel on a machine other work shares (run-queue waits do not count). */
static clockid_t g_clock = CLOCK_MONOTONIC;
static double now(void) {
    struct timespec t;
    clock_gettime(g_clock, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

enum { COPIES = 8 };

static float from_bf16(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

typedef struct {
    cmi_conv_geom g;
    uint16_t *x[COPIES], *dy[COPIES];
    float *w;
} problem;

/* One call of pass p (CMI_CONV_FWD, ...) on copy c by our kernel (own) or oneDNN's, into out: y
 * and dx bf16, dW f32 (zeroed first: ours adds). */
static cm_status run(cm_tape *tp, const problem *pr, int p, bool own, int c, void *out) {
    const cmi_conv_geom *g = &pr->g;
    bool a = false, b = false;
    cm_status st;
    if (p == CMI_CONV_FWD)
        st = own ? cmi_conv_fwd_bf16(tp, g, pr->x[c], CM_DTYPE_F32, pr->w, CM_DTYPE_BF16, out)
                 : cmi_dnnl_conv_forward(tp, g, CM_DTYPE_BF16, CM_DTYPE_BF16, CM_DTYPE_F32, pr->x[c], pr->w, NULL,
                                         CM_DTYPE_BF16, out, &a);
    else if (p == CMI_CONV_BWD_DATA)
        st = own ? cmi_conv_bwd_data_bf16(tp, g, pr->dy[c], CM_DTYPE_F32, pr->w, CM_DTYPE_BF16, out, false)
                 : cmi_dnnl_conv_backward(tp, g, CM_DTYPE_BF16, CM_DTYPE_BF16, CM_DTYPE_F32, pr->x[c], pr->w,
                                          CM_DTYPE_BF16, pr->dy[c], CM_DTYPE_BF16, out, NULL, NULL, &a, &b);
    else {
        memset(out, 0, sizeof(float) * (size_t)(g->Cout * g->Cin * 9));
        st = own ? cmi_conv_wgrad_bf16(tp, g, CM_DTYPE_BF16, pr->x[c], CM_DTYPE_BF16, pr->dy[c], out)
                 : cmi_dnnl_conv_backward(tp, g, CM_DTYPE_BF16, CM_DTYPE_BF16, CM_DTYPE_F32, pr->x[c], pr->w,
                                          CM_DTYPE_BF16, pr->dy[c], CM_DTYPE_F32, NULL, out, NULL, &a, &b);
        a = b;
    }
    if (st == CM_OK && !own && !a) {
        fprintf(stderr, "oneDNN has no bf16 primitive for pass %d\n", p);
        return CM_ERR_INTERNAL;
    }
    if (st) fprintf(stderr, "%s\n", cm_tape_error(tp));
    return st;
}

int main(int argc, char **argv) {
    int ai = 1;
    if (argc > 1 && strcmp(argv[1], "--cpu-time") == 0) g_clock = CLOCK_PROCESS_CPUTIME_ID, ai++;
    const int reps = argc > ai ? atoi(argv[ai]) : 10;
    const int64_t shapes[][3] = {{16, 32, 16}, {32, 16, 32}, {64, 8, 64}}; /* Cin, H = W, Cout */
    const char *pass_names[3] = {"forward", "backward-data", "backward-weights"};
    cm_tape_config cfg = cm_tape_config_default();
    cm_tape *tp;
    if (cm_tape_new(&cfg, &tp) != CM_OK) return 1;
    printf("threads %d, oneDNN ISA %s\n", cm_num_threads(), cmi_dnnl_isa_name());
    printf("%-16s %-17s %9s %9s %10s %11s %7s %12s\n", "shape (N 128)", "pass", "own ms", "own GF/s", "onednn ms",
           "onednn GF/s", "own x", "max rel diff");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t IC = shapes[s][0], HW = shapes[s][1], OC = shapes[s][2], N = 128;
        problem pr = {{N, IC, HW, HW, OC, HW, HW, 3, 3, 1, 1, 1, 1, 1, 1, 1, true}, {0}, {0}, NULL};
        if (!cmi_conv_direct_bf16_fits(&pr.g) || !cmi_conv_wgrad_bf16_fits(&pr.g)) {
            printf("own kernels do not run on this CPU (they need AVX512-BF16)\n");
            return 0;
        }
        const size_t xn = (size_t)(N * HW * HW * IC), yn = (size_t)(N * HW * HW * OC), wn = (size_t)(OC * IC * 9);
        cm_rng r = cm_rng_init(7, 0);
        float *tmp = malloc((xn > yn ? xn : yn) * 4);
        for (int c = 0; c < COPIES; c++) {
            pr.x[c] = malloc(xn * 2), pr.dy[c] = malloc(yn * 2);
            cm_rng_normal(&r, tmp, xn, 0.0f, 1.0f);
            for (size_t i = 0; i < xn; i++) pr.x[c][i] = to_bf16(tmp[i]);
            cm_rng_normal(&r, tmp, yn, 0.0f, 1.0f);
            for (size_t i = 0; i < yn; i++) pr.dy[c][i] = to_bf16(tmp[i]);
        }
        free(tmp);
        pr.w = malloc(wn * 4);
        cm_rng_normal(&r, pr.w, wn, 0.0f, 0.1f);
        const size_t on[3] = {yn, xn, wn}; /* output elements per pass */
        for (int p = 0; p < 3; p++) {
            const size_t esz = p == CMI_CONV_BWD_WEIGHTS ? 4 : 2;
            void *out[2] = {malloc(on[p] * esz), malloc(on[p] * esz)};
            double best[2] = {1e30, 1e30};
            for (int i = 0; i < reps + 1; i++)
                for (int k = 0; k < 2; k++) {
                    const double t0 = now();
                    if (run(tp, &pr, p, k == 0, (2 * i + k) % COPIES, out[k])) return 1;
                    const double dt = now() - t0;
                    if (i > 0 && dt < best[k]) best[k] = dt;
                }
            /* both results on the same copy */
            for (int k = 0; k < 2; k++)
                if (run(tp, &pr, p, k == 0, 0, out[k])) return 1;
            double md = 0, mx = 0;
            for (size_t i = 0; i < on[p]; i++) {
                const double a = esz == 2 ? from_bf16(((uint16_t *)out[0])[i]) : ((float *)out[0])[i];
                const double b = esz == 2 ? from_bf16(((uint16_t *)out[1])[i]) : ((float *)out[1])[i];
                md = fmax(md, fabs(a - b));
                mx = fmax(mx, fabs(b));
            }
            const double flops = 2.0 * (double)N * (double)(HW * HW) * (double)(OC * IC * 9);
            char name[64];
            snprintf(name, sizeof name, "%lld->%lld %lldx%lld", (long long)IC, (long long)OC, (long long)HW,
                     (long long)HW);
            printf("%-16s %-17s %9.3f %9.1f %10.3f %11.1f %6.2fx %12.2e\n", name, pass_names[p], best[0] * 1e3,
                   flops / best[0] / 1e9, best[1] * 1e3, flops / best[1] / 1e9, best[1] / best[0], md / mx);
            free(out[0]), free(out[1]);
        }
        for (int c = 0; c < COPIES; c++) free(pr.x[c]), free(pr.dy[c]);
        free(pr.w);
        cm_tape_reset(tp);
    }
    cm_tape_free(tp);
    return 0;
}
