/* Times cm_conv2d forward and forward + backward on ResNet-CIFAR shapes (N = 128), NCHW and
 * channels-last, for each convolution kernel (src/tensor/dnnl_conv.h):
 *   im2col        conv.c's im2col + OpenBLAS sgemm (CM_CONV=im2col)
 *   dnnl-plain    oneDNN primitives on the user's nchw / nhwc activations (the default for NHWC)
 *   dnnl-blocked  oneDNN primitives on its own blocked activation layout, reordered in and out
 *                 (the default for NCHW)
 *   dnnl-winograd oneDNN's f32 Winograd F(4x4, 3x3) wherever it has one (blocked layout), direct
 *                 elsewhere (CM_CONV_ALGO=winograd)
 *   dnnl-auto     the default: Winograd where cmi_conv_algo's auto rule takes it, direct elsewhere
 * (the f32 variants above dnnl-winograd run the direct algorithm) in f32, and with bf16 x and
 * weight (explicit bf16 leaves, as autocast produces them):
 *   bf16-widen    bf16 widened to f32, then the f32 oneDNN kernel (CM_CONV_BF16=widen)
 *   bf16-dnnl-*   oneDNN's bf16 primitives (needs avx512_core_bf16 or AMX; skipped elsewhere), and
 *                 where they fit our own bf16 kernels (conv_bf16.h), direct algorithm
 *   bf16-auto     the default: our own kernels' Winograd where the auto rule takes it
 *   bf16-winograd Winograd for forward and backward-data at every channel count, 16 included
 * Usage: bench_conv [reps] [filter] [shape] (CM_NUM_THREADS sets the threads; filter: run only
 * kernels whose name contains it; shape: only shapes whose name contains it). Prints the best of
 * `reps` timed runs (after one warm-up) and the ratio to im2col f32 of the same shape and layout. */
#include "tensor/dnnl_conv.h"
#include "tensor/dnnl_gemm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
    const char *name;
    int64_t n, cin, hw, cout, k;
    int stride, pad;
} shape;

typedef struct {
    const char *name;
    cmi_conv_kernel kernel;
    cmi_conv_act_layout act;
    bool bf16;
    cmi_conv_bf16_kernel bk;
    cmi_conv_algo algo; /* f32 algorithm (bf16 is always direct) */
} variant;

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 3;
    const char *filter = argc > 2 ? argv[2] : NULL, *shape_filter = argc > 3 ? argv[3] : NULL;
    const shape shapes[] = {
        {"stage1 16->16 3x3 32x32", 128, 16, 32, 16, 3, 1, 1}, {"stage2 32->32 3x3 16x16", 128, 32, 16, 32, 3, 1, 1},
        {"stage3 64->64 3x3 8x8", 128, 64, 8, 64, 3, 1, 1},    {"down 16->32 3x3 s2", 128, 16, 32, 32, 3, 2, 1},
        {"down 32->64 3x3 s2", 128, 32, 16, 64, 3, 2, 1},      {"stem 3->16 3x3 32x32", 128, 3, 32, 16, 3, 1, 1},
        {"1x1 32->64 16x16", 128, 32, 16, 64, 1, 1, 0},
        /* ImageNet ResNet-18/34 stages at batch 32 */
        {"in-s1 64->64 3x3 56x56", 32, 64, 56, 64, 3, 1, 1},   {"in-s2 128->128 3x3 28x28", 32, 128, 28, 128, 3, 1, 1},
        {"in-s3 256->256 3x3 14x14", 32, 256, 14, 256, 3, 1, 1}, {"in-s4 512->512 3x3 7x7", 32, 512, 7, 512, 3, 1, 1},
    };
    const variant variants[] = {
        {"im2col", CMI_CONV_IM2COL, CMI_CONV_ACT_AUTO, false, CMI_CONV_BF16_WIDEN, CMI_CONV_ALGO_DIRECT},
        {"dnnl-plain", CMI_CONV_DNNL, CMI_CONV_ACT_PLAIN, false, CMI_CONV_BF16_WIDEN, CMI_CONV_ALGO_DIRECT},
        {"dnnl-blocked", CMI_CONV_DNNL, CMI_CONV_ACT_BLOCKED, false, CMI_CONV_BF16_WIDEN, CMI_CONV_ALGO_DIRECT},
        {"dnnl-winograd", CMI_CONV_DNNL, CMI_CONV_ACT_AUTO, false, CMI_CONV_BF16_WIDEN, CMI_CONV_ALGO_WINOGRAD},
        {"dnnl-auto", CMI_CONV_DNNL, CMI_CONV_ACT_AUTO, false, CMI_CONV_BF16_WIDEN, CMI_CONV_ALGO_AUTO},
        {"bf16-widen", CMI_CONV_DNNL, CMI_CONV_ACT_AUTO, true, CMI_CONV_BF16_WIDEN, CMI_CONV_ALGO_DIRECT},
        {"bf16-dnnl-plain", CMI_CONV_DNNL, CMI_CONV_ACT_PLAIN, true, CMI_CONV_BF16_ONEDNN, CMI_CONV_ALGO_DIRECT},
        {"bf16-dnnl-blocked", CMI_CONV_DNNL, CMI_CONV_ACT_BLOCKED, true, CMI_CONV_BF16_ONEDNN, CMI_CONV_ALGO_DIRECT},
        {"bf16-auto", CMI_CONV_DNNL, CMI_CONV_ACT_AUTO, true, CMI_CONV_BF16_ONEDNN, CMI_CONV_ALGO_AUTO},
        {"bf16-winograd", CMI_CONV_DNNL, CMI_CONV_ACT_AUTO, true, CMI_CONV_BF16_ONEDNN, CMI_CONV_ALGO_WINOGRAD},
    };
    const int nv = (int)(sizeof variants / sizeof variants[0]);
    cm_tape_config cfg = cm_tape_config_default();
    cm_tape *tp;
    if (cm_tape_new(&cfg, &tp) != CM_OK) return 1;
    printf("threads %d, oneDNN ISA %s (bf16 native: %s)\n", cm_num_threads(), cmi_dnnl_isa_name(),
           cmi_bf16_native() ? "yes" : "no");
    printf("%-26s %-4s %-18s %9s %9s %7s %7s\n", "shape", "lay", "kernel", "fwd ms", "f+b ms", "fwd x", "f+b x");
    for (int cl = 0; cl < 2; cl++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const shape *sh = &shapes[s];
            if (shape_filter && !strstr(sh->name, shape_filter)) continue;
            int64_t xs[4] = {sh->n, sh->cin, sh->hw, sh->hw}, ws[4] = {sh->cout, sh->cin, sh->k, sh->k};
            if (cl) xs[1] = sh->hw, xs[2] = sh->hw, xs[3] = sh->cin;
            cm_tensor *x, *w, *xh, *wh;
            cm_tensor_new(CM_DTYPE_F32, 4, xs, &x);
            cm_tensor_new(CM_DTYPE_F32, 4, ws, &w);
            cm_tensor_new(CM_DTYPE_BF16, 4, xs, &xh);
            cm_tensor_new(CM_DTYPE_BF16, 4, ws, &wh);
            cm_rng r = cm_rng_init(1, 0);
            cm_tensor_init_normal(x, &r, 0, 1);
            cm_tensor_init_normal(w, &r, 0, 0.1f);
            cm_tensor_copy(xh, x);
            cm_tensor_copy(wh, w);
            cm_tensor *all[4] = {x, w, xh, wh};
            for (int i = 0; i < 4; i++) cm_tensor_set_requires_grad(all[i], true);
            cm_conv2d_opts o = cm_conv2d_opts_default();
            o.stride[0] = o.stride[1] = sh->stride;
            o.padding[0] = o.padding[1] = sh->pad;
            o.channels_last = cl;
            double base_f = 0, base_b = 0;
            for (int v = 0; v < nv; v++) {
                const variant *va = &variants[v];
                if (filter && !strstr(va->name, filter) && v != 0) continue;
                if (va->bf16 && va->bk == CMI_CONV_BF16_ONEDNN && !cmi_bf16_native()) continue;
                cmi_conv_set_kernel(va->kernel);
                cmi_conv_set_act_layout(va->act);
                cmi_conv_set_bf16_kernel(va->bk);
                cmi_conv_set_algo(va->algo);
                double tf = 1e30, tb = 1e30;
                for (int i = 0; i < reps + 1; i++) {
                    double t0 = now();
                    cm_tensor *y = cm_conv2d(tp, va->bf16 ? xh : x, va->bf16 ? wh : w, NULL, &o);
                    double t1 = now();
                    cm_tensor *g = cm_full(tp, CM_DTYPE_F32, 4, cm_tensor_shape(y), 1.0);
                    double t2 = now();
                    if (cm_tape_backward_with(tp, y, g) != CM_OK) {
                        fprintf(stderr, "%s\n", cm_tape_error(tp));
                        return 1;
                    }
                    double t3 = now();
                    if (i > 0 && t1 - t0 < tf) tf = t1 - t0;
                    if (i > 0 && (t1 - t0) + (t3 - t2) < tb) tb = (t1 - t0) + (t3 - t2);
                    cm_tape_reset(tp);
                }
                if (v == 0) base_f = tf, base_b = tb;
                printf("%-26s %-4s %-18s %9.2f %9.2f %6.2fx %6.2fx\n", sh->name, cl ? "NHWC" : "NCHW", va->name,
                       tf * 1e3, tb * 1e3, base_f / tf, base_b / tb);
            }
            for (int i = 0; i < 4; i++) cm_tensor_free(all[i]);
        }
    cmi_conv_set_act_layout(CMI_CONV_ACT_AUTO);
    cmi_conv_set_algo(CMI_CONV_ALGO_AUTO);
    cm_tape_free(tp);
    return 0;
}
