/* Times cm_conv2d forward + backward on ResNet-CIFAR shapes (N = 128), NCHW and channels-last.
 * Usage: bench_conv [reps] (CM_NUM_THREADS sets the threads). Prints ms per forward and per
 * forward+backward, and GFLOP/s of the forward. */
#include <composer/composer.h>

#include <stdio.h>
#include <stdlib.h>
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

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 3;
    const shape shapes[] = {
        {"stage1 16->16 3x3 32x32", 128, 16, 32, 16, 3, 1, 1}, {"stage2 32->32 3x3 16x16", 128, 32, 16, 32, 3, 1, 1},
        {"stage3 64->64 3x3 8x8", 128, 64, 8, 64, 3, 1, 1},    {"down 16->32 3x3 s2", 128, 16, 32, 32, 3, 2, 1},
        {"1x1 32->64 16x16", 128, 32, 16, 64, 1, 1, 0},
    };
    cm_tape_config cfg = cm_tape_config_default();
    cm_tape *tp;
    if (cm_tape_new(&cfg, &tp) != CM_OK) return 1;
    printf("threads %d\n", cm_num_threads());
    for (int cl = 0; cl < 2; cl++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const shape *sh = &shapes[s];
            int64_t xs[4] = {sh->n, sh->cin, sh->hw, sh->hw}, ws[4] = {sh->cout, sh->cin, sh->k, sh->k};
            if (cl) xs[1] = sh->hw, xs[2] = sh->hw, xs[3] = sh->cin;
            cm_tensor *x, *w;
            cm_tensor_new(CM_DTYPE_F32, 4, xs, &x);
            cm_tensor_new(CM_DTYPE_F32, 4, ws, &w);
            cm_rng r = cm_rng_init(1, 0);
            cm_tensor_init_normal(x, &r, 0, 1);
            cm_tensor_init_normal(w, &r, 0, 0.1f);
            cm_tensor_set_requires_grad(x, true);
            cm_tensor_set_requires_grad(w, true);
            cm_conv2d_opts o = cm_conv2d_opts_default();
            o.stride[0] = o.stride[1] = sh->stride;
            o.padding[0] = o.padding[1] = sh->pad;
            o.channels_last = cl;
            double tf = 1e30, tb = 1e30;
            for (int i = 0; i < reps + 1; i++) {
                double t0 = now();
                cm_tensor *y = cm_conv2d(tp, x, w, NULL, &o);
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
            int64_t oh = (sh->hw + 2 * sh->pad - sh->k) / sh->stride + 1;
            double flops = 2.0 * sh->n * sh->cout * oh * oh * sh->cin * sh->k * sh->k;
            printf("%-28s %s  fwd %7.2f ms (%5.1f GFLOP/s)  fwd+bwd %7.2f ms\n", sh->name, cl ? "NHWC" : "NCHW",
                   tf * 1e3, flops / tf * 1e-9, tb * 1e3);
            cm_tensor_free(x);
            cm_tensor_free(w);
        }
    cm_tape_free(tp);
    return 0;
}
