/* Samples per second of the dataloader over a synthetic dataset whose get() costs a configurable
 * amount of work, for 0 (calling thread), 1 and 2 workers.
 * then over real data: MNIST train with augmentation (from ../shared/data/mnist, run from the
 * repository root) and GPT-style token windows (T = 256) from a generated token file.
 * Usage: bench_dataloader [global_batch=256] [seconds_per_row=1] [cost_ns_per_sample ...=0 2000 20000]
 * Each row: the dataset, the workers, the samples/s the trainer sees when it does nothing but take
 * batches, and the speed-up over the calling thread (token rows use batch/16 windows). */
#include <composer/composer.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct synth {
    int64_t n;
    uint64_t cost_ns;
    cm_field_desc fields[2];
} synth;

static int64_t s_len(void *self) { return ((synth *)self)->n; }
static int s_nf(void *self) {
    (void)self;
    return 2;
}
static const cm_field_desc *s_field(void *self, int i) { return &((synth *)self)->fields[i]; }
static cm_status s_get(void *self, int64_t index, const cm_sample_ctx *ctx, void *const *out) {
    const synth *s = self;
    (void)ctx;
    /* per-sample work: busy until cost_ns has passed (a stand-in for decoding/augmenting) */
    if (s->cost_ns) {
        uint64_t t0 = cm_clock_ns();
        while (cm_clock_ns() - t0 < s->cost_ns) {
        }
    }
    float *x = out[0];
    for (int i = 0; i < 784; i++) x[i] = (float)((index + i) & 255) / 255.0f;
    *(int64_t *)out[1] = index % 10;
    return CM_OK;
}
static const cm_dataset_i s_vt = {CM_DATASET_ABI, "bench", s_len, s_nf, s_field, s_get, NULL, NULL};

/* One row per worker count: samples/s the trainer sees when it does nothing but take batches. */
static int bench_rows(const char *label, cm_dataset *ds, int64_t B, double seconds, bool train) {
    double base = 0;
    for (int w = 0; w <= 2; w++) {
        cm_dataloader_config cfg = train ? cm_dataloader_config_default() : cm_dataloader_config_eval();
        cfg.batch_size = B, cfg.num_workers = w, cfg.prefetch_depth = 4, cfg.seed = 1;
        cm_dataloader *dl;
        if (cm_dataloader_new(ds, &cfg, &dl) != CM_OK) return fprintf(stderr, "%s\n", cm_last_error()), 1;
        cm_batch *b;
        cm_dataloader_next(dl, &b); /* warm up: threads started, first batch in */
        int64_t samples = 0;
        const double t0 = cm_clock_s();
        double t = t0;
        while (t - t0 < seconds) {
            if (cm_dataloader_next(dl, &b) != CM_OK) return fprintf(stderr, "%s\n", cm_last_error()), 1;
            if (b) samples += b->n_samples;
            t = cm_clock_s();
        }
        const double rate = (double)samples / (t - t0);
        if (w == 0) base = rate;
        printf("%-34s %-8d %14.0f %9.2fx\n", label, w, rate, rate / base);
        cm_dataloader_free(dl);
    }
    return 0;
}

int main(int argc, char **argv) {
    const int64_t B = argc > 1 ? atoll(argv[1]) : 256;
    const double seconds = argc > 2 ? atof(argv[2]) : 1.0;
    uint64_t costs[8] = {0, 2000, 20000};
    int n_costs = 3;
    if (argc > 3) {
        n_costs = 0;
        for (int a = 3; a < argc && n_costs < 8; a++) costs[n_costs++] = strtoull(argv[a], NULL, 10);
    }
    if (B < 1 || seconds <= 0) return fprintf(stderr, "usage: bench_dataloader [batch] [seconds] [cost_ns ...]\n"), 2;
    synth s = {.n = 60000};
    s.fields[0] = (cm_field_desc){.name = "image", .dtype = CM_DTYPE_F32, .ndim = 3, .shape = {1, 28, 28}};
    s.fields[1] = (cm_field_desc){.name = "label", .dtype = CM_DTYPE_I64, .ndim = 0};
    cm_dataset *ds;
    if (cm_dataset_new(&s_vt, &s, &ds) != CM_OK) return fprintf(stderr, "%s\n", cm_last_error()), 1;
    printf("dataloader: global batch %lld, %.1f s per row, %d threads\n", (long long)B, seconds, cm_num_threads());
    printf("%-34s %-8s %14s %10s\n", "dataset", "workers", "samples/s", "speed-up");
    for (int c = 0; c < n_costs; c++) {
        s.cost_ns = costs[c];
        char label[64];
        snprintf(label, sizeof label, "synthetic, %.1f us/sample", (double)costs[c] / 1000.0);
        if (bench_rows(label, ds, B, seconds, true)) return 1;
    }
    cm_dataset_free(ds);

    /* Real data: MNIST train with random crops (the trainer's augmentation path), from ../shared. */
    cm_mnist_config mc = cm_mnist_config_default();
    mc.augment.crop_padding = 2;
    if (cm_dataset_mnist_new("../shared/data/mnist", CM_SPLIT_TRAIN, &mc, &ds) == CM_OK) {
        if (bench_rows("MNIST train, crop 2 + normalise", ds, B, seconds, true)) return 1;
        cm_dataset_free(ds);
    } else {
        printf("%-34s (skipped: %s)\n", "MNIST", cm_last_error());
    }

    /* Token windows: a 4M-token uint16 file of random ids, T = 256 (GPT-style samples). */
    char path[128];
    snprintf(path, sizeof path, "/tmp/cm_bench_tokens_%d.bin", (int)getpid());
    const int64_t n_tok = 4 << 20;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_tok);
    for (int64_t i = 0; i < n_tok; i++) ids[i] = (int32_t)((i * 2654435761u) % 50257u);
    if (!ids || cm_token_file_write(path, ids, n_tok, CM_TOKEN_WIDTH_AUTO) != CM_OK)
        return fprintf(stderr, "%s\n", cm_last_error()), 1;
    free(ids);
    cm_tokens_config tc = cm_tokens_config_default();
    tc.seq_len = 256;
    if (cm_dataset_tokens_new(path, &tc, &ds) != CM_OK) return fprintf(stderr, "%s\n", cm_last_error()), 1;
    int rc = bench_rows("token windows, T = 256 (u16 file)", ds, B / 16 > 0 ? B / 16 : 1, seconds, true);
    cm_dataset_free(ds);
    unlink(path);
    return rc;
}
