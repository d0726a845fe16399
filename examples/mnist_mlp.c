/*
 * mnist_mlp — train a two-layer perceptron on MNIST with the tensor API alone.
 *
 * The smallest complete training program on this library: read the shipped MNIST files, build
 * the model from long-lived parameter tensors, and for each batch run forward ops on a tape,
 * backward, and an SGD-with-momentum update over the parameters; then evaluate on the test set
 * and draw a few test digits with their predictions. (The Trainer, data loaders and optimizers
 * of later layers replace the hand-written parts.)
 *
 *     build/examples/mnist_mlp [DATA_DIR] [EPOCHS]   (defaults: ../shared/data/mnist, 3 epochs)
 */
#include <composer/composer.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

/* Reads a gzip'd IDX file (big-endian header) into a malloc'd byte array. */
static uint8_t *read_idx(const char *path, uint32_t want_magic, int64_t *count, int64_t *item_bytes) {
    gzFile f = gzopen(path, "rb");
    if (!f) {
        fprintf(stderr, "error: cannot open %s (pass the MNIST folder as the first argument)\n", path);
        return NULL;
    }
    uint8_t hdr[16];
    int ndim = want_magic == 0x803 ? 3 : 1;
    int hbytes = 4 + 4 * ndim;
    if (gzread(f, hdr, (unsigned)hbytes) != hbytes) {
        fprintf(stderr, "error: %s: truncated header\n", path);
        gzclose(f);
        return NULL;
    }
    uint32_t magic = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
    if (magic != want_magic) {
        fprintf(stderr, "error: %s: magic 0x%08x, expected 0x%08x (not an MNIST IDX file?)\n", path, magic,
                want_magic);
        gzclose(f);
        return NULL;
    }
    int64_t dims[3] = {1, 1, 1};
    for (int i = 0; i < ndim; i++)
        dims[i] = (int64_t)hdr[4 + 4 * i] << 24 | (int64_t)hdr[5 + 4 * i] << 16 | (int64_t)hdr[6 + 4 * i] << 8 |
                  hdr[7 + 4 * i];
    *count = dims[0];
    *item_bytes = dims[1] * dims[2];
    size_t n = (size_t)(*count * *item_bytes);
    uint8_t *buf = malloc(n);
    if (!buf || gzread(f, buf, (unsigned)n) != (int)n) {
        fprintf(stderr, "error: %s: file shorter than its header says (%zu bytes)\n", path, n);
        free(buf);
        gzclose(f);
        return NULL;
    }
    gzclose(f);
    return buf;
}

typedef struct {
    cm_tensor *w1, *b1, *w2, *b2; /* (256, 784) (256) (10, 256) (10) */
    cm_tensor *m[4];              /* momentum buffers */
} mlp;

static cm_tensor *forward(cm_tape *tp, mlp *m, cm_tensor *x) {
    cm_tensor *h = cm_relu(tp, cm_linear(tp, x, m->w1, m->b1)); /* (B, 256) */
    return cm_linear(tp, h, m->w2, m->b2);                        /* (B, 10) */
}

static void sgd_step(mlp *m, float lr, float momentum) {
    cm_tensor *p[4] = {m->w1, m->b1, m->w2, m->b2};
    for (int i = 0; i < 4; i++) {
        float *w = cm_tensor_data(p[i]), *g = cm_tensor_data(cm_tensor_grad(p[i])), *v = cm_tensor_data(m->m[i]);
        int64_t n = cm_tensor_numel(p[i]);
        for (int64_t k = 0; k < n; k++) {
            v[k] = momentum * v[k] + g[k];
            w[k] -= lr * v[k];
        }
        cm_tensor_zero_grad(p[i]);
    }
}

/* Fills a batch: x (B, 784) scaled to [0, 1] and normalised, y (B) class indices. */
static void fill_batch(const uint8_t *img, const uint8_t *lab, const int64_t *order, int64_t start, int64_t B,
                       float *x, int64_t *y) {
    for (int64_t b = 0; b < B; b++) {
        int64_t i = order ? order[start + b] : start + b;
        for (int k = 0; k < 784; k++) x[b * 784 + k] = ((float)img[i * 784 + k] / 255.0f - 0.1307f) / 0.3081f;
        y[b] = lab[i];
    }
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "../shared/data/mnist";
    int epochs = argc > 2 ? atoi(argv[2]) : 3;
    const bool tty = isatty(STDOUT_FILENO);
    if (epochs < 1) epochs = 1;
    char path[1024];
    int64_t ntr, nte, isz, one;
    snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", dir);
    uint8_t *tr_img = read_idx(path, 0x803, &ntr, &isz);
    snprintf(path, sizeof path, "%s/train-labels-idx1-ubyte.gz", dir);
    uint8_t *tr_lab = read_idx(path, 0x801, &ntr, &one);
    snprintf(path, sizeof path, "%s/t10k-images-idx3-ubyte.gz", dir);
    uint8_t *te_img = read_idx(path, 0x803, &nte, &isz);
    snprintf(path, sizeof path, "%s/t10k-labels-idx1-ubyte.gz", dir);
    uint8_t *te_lab = read_idx(path, 0x801, &nte, &one);
    if (!tr_img || !tr_lab || !te_img || !te_lab) return 1;
    printf("MNIST: %lld training and %lld test images, %d threads\n", (long long)ntr, (long long)nte,
           cm_num_threads());

    mlp m;
    int64_t s_w1[2] = {256, 784}, s_b1[1] = {256}, s_w2[2] = {10, 256}, s_b2[1] = {10};
    cm_tensor_new(CM_DTYPE_F32, 2, s_w1, &m.w1);
    cm_tensor_new(CM_DTYPE_F32, 1, s_b1, &m.b1);
    cm_tensor_new(CM_DTYPE_F32, 2, s_w2, &m.w2);
    cm_tensor_new(CM_DTYPE_F32, 1, s_b2, &m.b2);
    cm_rng rng = cm_rng_init(17, 0);
    cm_tensor_init_kaiming_uniform(m.w1, &rng, CM_FAN_IN, sqrtf(5.0f)); /* nn.Linear's default */
    cm_tensor_init_kaiming_uniform(m.w2, &rng, CM_FAN_IN, sqrtf(5.0f));
    cm_tensor_init_uniform(m.b1, &rng, -1.0f / 28.0f, 1.0f / 28.0f);
    cm_tensor_init_uniform(m.b2, &rng, -1.0f / 16.0f, 1.0f / 16.0f);
    cm_tensor *p[4] = {m.w1, m.b1, m.w2, m.b2};
    for (int i = 0; i < 4; i++) {
        cm_tensor_set_requires_grad(p[i], true);
        cm_tensor_new(CM_DTYPE_F32, cm_tensor_ndim(p[i]), cm_tensor_shape(p[i]), &m.m[i]);
    }

    const int64_t B = 64, steps = ntr / B;
    cm_tape *tp;
    cm_tape_config tc = cm_tape_config_default();
    tc.arena_budget = (size_t)64 << 20;
    if (cm_tape_new(&tc, &tp) != CM_OK) return 1;
    int64_t *order = malloc(sizeof(int64_t) * (size_t)ntr);
    float *xb = malloc(sizeof(float) * (size_t)(B * 784));
    int64_t *yb = malloc(sizeof(int64_t) * (size_t)B);
    int64_t xs[2] = {B, 784}, ys[1] = {B};
    cm_tensor *xt, *yt;
    cm_tensor_from_data(CM_DTYPE_F32, 2, xs, xb, &xt);
    cm_tensor_from_data(CM_DTYPE_I64, 1, ys, yb, &yt);
    double t0 = cm_clock_s();
    for (int ep = 0; ep < epochs; ep++) {
        /* shuffle with the counter-based RNG (Fisher-Yates over random keys) */
        for (int64_t i = 0; i < ntr; i++) order[i] = i;
        cm_rng sr = cm_rng_init(1000 + (uint64_t)ep, 1);
        for (int64_t i = ntr - 1; i > 0; i--) {
            int64_t j;
            cm_rng_randint(&sr, &j, 1, 0, i + 1);
            int64_t t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        double run_loss = 0;
        int64_t run_n = 0;
        for (int64_t s = 0; s < steps; s++) {
            fill_batch(tr_img, tr_lab, order, s * B, B, xb, yb);
            cm_tensor *loss = cm_cross_entropy(tp, forward(tp, &m, xt), yt, NULL);
            if (!loss || cm_tape_backward(tp, loss) != CM_OK) {
                fprintf(stderr, "error: step %lld: %s\n", (long long)s, cm_tape_error(tp));
                return 1;
            }
            run_loss += cm_tensor_get_flat(loss, 0);
            run_n++;
            float lr = 0.05f * (1.0f - (float)(ep * steps + s) / (float)(epochs * steps)); /* linear decay */
            sgd_step(&m, lr, 0.9f);
            cm_tape_reset(tp);
            if ((s + 1) % 100 == 0 || s + 1 == steps) {
                printf("%sepoch %d  step %4lld/%lld  loss %.4f  %.0f img/s%s", tty ? "\r" : "", ep + 1, (long long)(s + 1),
                       (long long)steps, run_loss / (double)run_n,
                       (double)((ep * steps + s + 1) * B) / (cm_clock_s() - t0), tty ? " " : "\n");
                fflush(stdout);
                run_loss = 0;
                run_n = 0;
            }
        }
        if (tty) printf("\n");
    }

    /* evaluation, grad recording off */
    cm_tape_set_grad_enabled(tp, false);
    int64_t correct = 0;
    int8_t *pred = malloc((size_t)nte);
    for (int64_t s = 0; s * B < nte; s++) {
        int64_t bsz = (s + 1) * B <= nte ? B : nte - s * B;
        fill_batch(te_img, te_lab, NULL, s * B, bsz, xb, yb);
        int64_t xs2[2] = {bsz, 784};
        cm_tensor *xv;
        cm_tensor_from_data(CM_DTYPE_F32, 2, xs2, xb, &xv);
        cm_tensor *logits = forward(tp, &m, xv);
        const float *l = cm_tensor_data(logits);
        for (int64_t b = 0; b < bsz; b++) {
            int best = 0;
            for (int c = 1; c < 10; c++)
                if (l[b * 10 + c] > l[b * 10 + best]) best = c;
            pred[s * B + b] = (int8_t)best;
            correct += best == yb[b];
        }
        cm_tensor_free(xv);
        cm_tape_reset(tp);
    }
    printf("test accuracy: %.2f%% (%lld/%lld) after %d epoch(s), %.1f s\n\n", 100.0 * (double)correct / (double)nte,
           (long long)correct, (long long)nte, epochs, cm_clock_s() - t0);

    /* show a few test digits with the model's answers */
    const char *shade = " .:-=+*#%@";
    for (int row = 0; row < 14; row++) {
        for (int k = 0; k < 6; k++) {
            for (int col = 0; col < 28; col += 2) {
                int v = te_img[k * 784 + row * 2 * 28 + col];
                putchar(shade[v * 9 / 255]);
            }
            printf("   ");
        }
        putchar('\n');
    }
    for (int k = 0; k < 6; k++) printf("  predicted %d (%s)    ", pred[k], pred[k] == te_lab[k] ? "right" : "wrong");
    printf("\n");

    for (int i = 0; i < 4; i++) {
        cm_tensor_free(p[i]);
        cm_tensor_free(m.m[i]);
    }
    cm_tensor_free(xt);
    cm_tensor_free(yt);
    cm_tape_free(tp);
    free(order), free(xb), free(yb), free(pred), free(tr_img), free(tr_lab), free(te_img), free(te_lab);
    return 0;
}
