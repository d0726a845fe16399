/* Times bf16 backward-weights of the ResNet-CIFAR body convolutions (3x3, stride 1, pad 1,
 * channels-last, N = 128): our own kernel (src/tensor/conv_wgrad.c) against oneDNN's
 * (cmi_dnnl_conv_backward with only dW wanted), with bf16 x and dy as a ResNet under autocast has
 * them. Each call reads a different one of several x/dy copies (together larger than the L3
 * cache), as a training step finds them: written long before, not in cache. Prints the best of
 * `reps` calls per kernel, its GFLOP/s, and the largest difference between the two results
 * relative to the largest |dW|.
 * Usage: bench_conv_wgrad [reps] (CM_NUM_THREADS sets the threads). */
#include "tensor/conv_wgrad.h"
#include "tensor/dnnl_conv.h"
#include "tensor/dnnl_gemm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

enum { COPIES = 8 };

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 10;
    const int64_t shapes[][3] = {{16, 32, 16}, {32, 16, 32}, {64, 8, 64}}; /* Cin, H = W, Cout */
    cm_tape_config cfg = cm_tape_config_default();
    cm_tape *tp;
    if (cm_tape_new(&cfg, &tp) != CM_OK) return 1;
    printf("threads %d, oneDNN ISA %s\n", cm_num_threads(), cmi_dnnl_isa_name());
    printf("%-22s %10s %10s %10s %10s %8s %12s\n", "shape (N 128)", "own ms", "own GF/s", "onednn ms", "onednn GF/s",
           "own x", "max rel diff");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t IC = shapes[s][0], HW = shapes[s][1], OC = shapes[s][2], N = 128;
        cmi_conv_geom g = {N, IC, HW, HW, OC, HW, HW, 3, 3, 1, 1, 1, 1, 1, 1, 1, true};
        if (!cmi_conv_wgrad_bf16_fits(&g)) {
            printf("own kernel does not run on this CPU (needs AVX512-BF16)\n");
            return 0;
        }
        const size_t xn = (size_t)(N * HW * HW * IC), yn = (size_t)(N * HW * HW * OC), wn = (size_t)(OC * IC * 9);
        uint16_t *x[COPIES], *dy[COPIES];
        cm_rng r = cm_rng_init(7, 0);
        float *tmp = malloc((xn > yn ? xn : yn) * 4);
        for (int c = 0; c < COPIES; c++) {
            x[c] = malloc(xn * 2), dy[c] = malloc(yn * 2);
            cm_rng_normal(&r, tmp, xn, 0.0f, 1.0f);
            for (size_t i = 0; i < xn; i++) x[c][i] = to_bf16(tmp[i]);
            cm_rng_normal(&r, tmp, yn, 0.0f, 1.0f);
            for (size_t i = 0; i < yn; i++) dy[c][i] = to_bf16(tmp[i]);
        }
        free(tmp);
        float *w = calloc(wn, 4), *dw_own = malloc(wn * 4), *dw_dnnl = malloc(wn * 4);
        double best[2] = {1e30, 1e30};
        for (int i = 0; i < reps + 1; i++)
            for (int k = 0; k < 2; k++) {
                const int c = (2 * i + k) % COPIES;
                float *dw = k ? dw_dnnl : dw_own;
                memset(dw, 0, wn * 4);
                bool rd = false, rw = false;
                const double t0 = now();
                cm_status st = k ? cmi_dnnl_conv_backward(tp, &g, CM_DTYPE_BF16, CM_DTYPE_BF16, CM_DTYPE_BF16, x[c], w,
                                                          CM_DTYPE_BF16, dy[c], CM_DTYPE_F32, NULL, dw, NULL, &rd,
                                                          &rw)
                                 : cmi_conv_wgrad_bf16(tp, &g, CM_DTYPE_BF16, x[c], CM_DTYPE_BF16, dy[c], dw);
                const double dt = now() - t0;
                if (st != CM_OK || (k && !rw)) {
                    fprintf(stderr, "%s\n", st ? cm_tape_error(tp) : "oneDNN has no bf16 backward-weights here");
                    return 1;
                }
                if (i > 0 && dt < best[k]) best[k] = dt;
            }
        /* both results on the same copy */
        memset(dw_own, 0, wn * 4);
        memset(dw_dnnl, 0, wn * 4);
        bool rd = false, rw = false;
        cmi_conv_wgrad_bf16(tp, &g, CM_DTYPE_BF16, x[0], CM_DTYPE_BF16, dy[0], dw_own);
        cmi_dnnl_conv_backward(tp, &g, CM_DTYPE_BF16, CM_DTYPE_BF16, CM_DTYPE_BF16, x[0], w, CM_DTYPE_BF16, dy[0],
                               CM_DTYPE_F32, NULL, dw_dnnl, NULL, &rd, &rw);
        double md = 0, mx = 0;
        for (size_t i = 0; i < wn; i++) {
            md = fmax(md, fabs((double)dw_own[i] - dw_dnnl[i]));
            mx = fmax(mx, fabs((double)dw_dnnl[i]));
        }
        const double flops = 2.0 * (double)N * (double)(HW * HW) * (double)(OC * IC * 9);
        char name[64];
        snprintf(name, sizeof name, "%lld->%lld %lldx%lld", (long long)IC, (long long)OC, (long long)HW, (long long)HW);
        printf("%-22s %10.3f %10.1f %10.3f %10.1f %7.2fx %12.2e\n", name, best[0] * 1e3, flops / best[0] / 1e9,
               best[1] * 1e3, flops / best[1] / 1e9, best[1] / best[0], md / mx);
        for (int c = 0; c < COPIES; c++) free(x[c]), free(dy[c]);
        free(w), free(dw_own), free(dw_dnnl);
        cm_tape_reset(tp);
    }
    cm_tape_free(tp);
    return 0;
}
