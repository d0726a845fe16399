/*
 * gpu_train — training throughput of the library's trainer on the GPU, for the side-by-side table
 * against PyTorch on the same GPU (bench/gpu_train.py; scripts/gpu-check runs both).
 *
 *     build/bench/bench_gpu_train [options]
 *       --model gpt2|char     GPT-2 124M (12 layers, C 768, 12 heads, V 50257, tied lm_head) or
 *                             nanoGPT's shakespeare-char GPT (6 layers, C 384, 6 heads, V 65)
 *       --precision fp32|tf32|amp_bf16
 *       --batch B --seq T     (default gpt2: 8 × 1024; char: 64 × 256)
 *       --steps S --warmup W  timed and untimed optimizer steps (default 10 and 3)
 *       --dropout P           (default 0: the throughput runs of llm.c and nanoGPT turn it off)
 *       --device cpu|gpu      (default gpu; cpu for a smoke run)
 *       --tiny                a 2-layer C-64 model with T 64 (the emulator's smoke test)
 *       --fused               lm_head fused with the loss (cm_gpt2_set_fused_linear_cross_entropy)
 *       --vocab N             the model's vocab_size, >= the data's 50257 / 65 (llm.c pads GPT-2's to
 *                             50304 so every GEMM of the LM head has 16-byte rows and dimensions)
 *
 * The data are random tokens from a fixed seed (throughput does not depend on them). The optimizer
 * is AdamW (lr 6e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1) with gradient clipping at 1.0,
 * as llm.c's GPT-2 runs. The timed region starts after the warm-up steps and ends when the GPU is
 * idle (cm_device_synchronize). MFU uses llm.c's convention, FLOPs per token = 6·N + 6·L·C·T with
 * N every parameter (tied embedding once), over the data-sheet peak for the precision
 * (cm_device_peak_flops). It prints one line:
 *     ours[-fused] <model> <precision> B T tok/s <x> step_ms <x> mfu <x> peak_mib <x> peak_blocks_mib <x>
 *         arena_peak_mib <x> params <n> device <name>
 * peak_mib is the peak of the requests (rounded to 512 bytes), as torch.cuda.max_memory_allocated()
 * that bench/gpu_train.py prints; peak_blocks_mib the caching allocator's blocks in use at their
 * peak (a reused block may be up to twice its request); arena_peak_mib the high-water mark of the
 * trainer tape's device arena (a step's activations and workspace; the rest of peak_mib is the
 * parameters, gradients, optimizer state and what the kernels allocate beside the tape). Sessions
 * before 2026-11-29 printed the blocks' peak as peak_mib.
 */
#include <composer/composer.h>
#include <composer/trainer.h>
#include <composer/zoo_gpt2.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(call)                                                                                 \
    do {                                                                                            \
        if ((call) != CM_OK) {                                                                      \
            fprintf(stderr, "gpu_train: %s:%d: %s\n", __FILE__, __LINE__, cm_last_error());         \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

typedef struct {
    int64_t n, T, V;
    uint64_t seed;
    cm_field_desc fields[2];
} rand_ds;

static int64_t r_len(void *self) { return ((rand_ds *)self)->n; }
static int r_nf(void *self) { return (void)self, 2; }
static const cm_field_desc *r_field(void *self, int i) { return &((rand_ds *)self)->fields[i]; }
static int64_t r_tok(void *self, int64_t i) { return (void)i, ((rand_ds *)self)->T; }
static cm_status r_get(void *self, int64_t i, const cm_sample_ctx *ctx, void *const *out) {
    (void)ctx;
    rand_ds *d = self;
    cm_rng r = cm_rng_init(d->seed, (uint64_t)i);
    int64_t *ids = out[0], *lab = out[1];
    cm_rng_randint(&r, ids, (size_t)d->T, 0, d->V);
    for (int64_t t = 0; t + 1 < d->T; t++) lab[t] = ids[t + 1];
    lab[d->T - 1] = ids[0];
    return CM_OK;
}
static void r_close(void *self) { free(self); }
static const cm_dataset_i rand_vt = {CM_DATASET_ABI, "random_tokens", r_len, r_nf, r_field, r_get, r_tok, r_close};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    const char *model = "gpt2", *prec = "amp_bf16", *devname = "gpu";
    int64_t B = 0, T = 0, steps = 10, warmup = 3, vocab = 0;
    float dropout = 0.0f;
    bool tiny = false, fused = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--tiny")) {
            tiny = true;
            continue;
        }
        if (!strcmp(a, "--fused")) {
            fused = true;
            continue;
        }
        if (!v) {
            fprintf(stderr, "gpu_train: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--precision")) prec = v;
        else if (!strcmp(a, "--batch")) B = atoll(v);
        else if (!strcmp(a, "--seq")) T = atoll(v);
        else if (!strcmp(a, "--vocab")) vocab = atoll(v);
        else if (!strcmp(a, "--steps")) steps = atoll(v);
        else if (!strcmp(a, "--warmup")) warmup = atoll(v);
        else if (!strcmp(a, "--dropout")) dropout = (float)atof(v);
        else if (!strcmp(a, "--device")) devname = v;
        else {
            fprintf(stderr, "gpu_train: unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    const bool gpt2 = !strcmp(model, "gpt2");
    if (!gpt2 && strcmp(model, "char")) {
        fprintf(stderr, "gpu_train: --model %s: use gpt2 or char\n", model);
        return 2;
    }
    const bool tf32 = !strcmp(prec, "tf32"), bf16 = !strcmp(prec, "amp_bf16");
    if (!tf32 && !bf16 && strcmp(prec, "fp32")) {
        fprintf(stderr, "gpu_train: --precision %s: use fp32, tf32 or amp_bf16\n", prec);
        return 2;
    }
    if (tf32) setenv("CM_CUDA_TF32", "1", 1); /* read when the first GEMM runs */
    cm_device dev;
    CHECK(cm_device_parse(devname, &dev));
    CHECK(cm_device_check(dev));

    cm_gpt2_config cfg = cm_gpt2_config_default();
    if (!gpt2) cfg.vocab_size = 65, cfg.n_embd = 384, cfg.n_layer = 6, cfg.n_head = 6;
    if (tiny) cfg.n_embd = 64, cfg.n_layer = 2, cfg.n_head = 2;
    if (!B) B = tiny ? 2 : gpt2 ? 8 : 64;
    if (!T) T = tiny ? 64 : gpt2 ? 1024 : 256;
    cfg.n_positions = T > 1024 ? T : (gpt2 ? 1024 : T);
    cfg.embd_pdrop = cfg.attn_pdrop = cfg.resid_pdrop = dropout;
    const int64_t data_vocab = cfg.vocab_size;
    if (vocab && vocab < data_vocab) {
        fprintf(stderr, "gpu_train: --vocab %lld is smaller than the data's %lld tokens\n", (long long)vocab,
                (long long)data_vocab);
        return 2;
    }
    if (vocab) cfg.vocab_size = vocab;
    cm_rng rng = cm_rng_init(1234, 0);
    cm_model *m;
    CHECK(cm_gpt2_new(&cfg, &rng, &m));
    if (fused) CHECK(cm_gpt2_set_fused_linear_cross_entropy(m, true, 0));
    cm_module *root = cm_model_module(m);
    const int64_t nparams = cm_module_count_params(root, false);

    rand_ds *d = calloc(1, sizeof *d);
    d->n = B * (steps + warmup + 2), d->T = T, d->V = data_vocab, d->seed = 7;
    d->fields[0] = (cm_field_desc){"input_ids", CM_DTYPE_I64, 1, {T}};
    d->fields[1] = (cm_field_desc){"labels", CM_DTYPE_I64, 1, {T}};
    cm_dataset *ds;
    CHECK(cm_dataset_new(&rand_vt, d, &ds));
    cm_dataloader_config dc = cm_dataloader_config_default();
    dc.batch_size = B, dc.shuffle = false;
    cm_dataloader *dl;
    CHECK(cm_dataloader_new(ds, &dc, &dl));

    CHECK(cm_module_to_device(root, dev));
    cm_optim *opt;
    CHECK(cm_optim_new(CM_OPTIM_ADAMW, &opt));
    const int nu = cm_module_n_units(root);
    cm_optim_span *spans = calloc((size_t)nu, sizeof *spans);
    for (int i = 0; i < nu; i++) {
        const cm_unit_info *u = cm_module_unit(root, i);
        spans[i] = (cm_optim_span){u->name, u->params, u->grads, u->numel};
    }
    cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_ADAMW);
    hp.lr = 6e-4, hp.beta1 = 0.9, hp.beta2 = 0.95, hp.eps = 1e-8, hp.weight_decay = 0.1;
    CHECK(cm_optim_add_group(opt, &hp, spans, nu));
    free(spans);
    cm_algorithm_plugin clip;
    CHECK(cm_grad_clip_new(CM_GRAD_CLIP_NORM, 1.0, &clip));

    cm_trainer_config tc = cm_trainer_config_default();
    tc.model = m, tc.train_dataloader = dl, tc.optimizer = opt, tc.device = dev;
    tc.algorithms = &clip, tc.n_algorithms = 1;
    tc.precision = bf16 ? CM_PRECISION_AMP_BF16 : CM_PRECISION_FP32;
    tc.run_name = "bench-gpu-train";
    char dur[32];
    snprintf(dur, sizeof dur, "%lldba", (long long)warmup);
    CHECK(cm_time_parse(dur, &tc.max_duration));
    cm_trainer *tr;
    CHECK(cm_trainer_new(&tc, &tr));
    CHECK(cm_trainer_fit(tr, NULL)); /* the warm-up */
    CHECK(cm_device_synchronize(dev));
    cm_device_reset_peak(dev);
    cm_fit_opts fo = cm_fit_opts_default();
    snprintf(dur, sizeof dur, "%lldba", (long long)steps); /* this much more */
    CHECK(cm_time_parse(dur, &fo.duration));
    const double t0 = now_s();
    CHECK(cm_trainer_fit(tr, &fo));
    CHECK(cm_device_synchronize(dev));
    const double secs = now_s() - t0;
    cm_device_memory mem = {0};
    if (dev != CM_DEVICE_CPU) CHECK(cm_device_memory_stats(dev, &mem));

    const double toks = (double)(B * T * steps) / secs;
    const double flops_tok = 6.0 * (double)nparams + 6.0 * (double)cfg.n_layer * (double)cfg.n_embd * (double)T;
    double peak = 0;
    if (dev != CM_DEVICE_CPU &&
        cm_device_peak_flops(dev, bf16 ? CM_DTYPE_BF16 : tf32 ? CM_DTYPE_F16 : CM_DTYPE_F32, &peak) != CM_OK)
        peak = 0;
    const double mfu = peak > 0 ? toks * flops_tok / peak : NAN;
    char vtag[32] = "";
    if (vocab) snprintf(vtag, sizeof vtag, "-v%lld", (long long)vocab);
    cm_tape *tape = cm_state_tape(cm_trainer_state(tr)); /* the step's activations and workspace */
    cm_arena *arena = tape ? cm_tape_device_arena(tape, dev) : NULL;
    printf("ours%s%s %s %s %lld %lld tok/s %.0f step_ms %.2f mfu %.4f peak_mib %.0f peak_blocks_mib %.0f "
           "arena_peak_mib %.0f params %lld device %s\n",
           fused ? "-fused" : "", vtag, model, prec,
           (long long)B, (long long)T, toks, 1e3 * secs / (double)steps, mfu,
           (double)mem.peak_requested / (double)(1 << 20), (double)mem.peak / (double)(1 << 20),
           arena ? (double)cm_arena_peak(arena) / (double)(1 << 20) : 0.0, (long long)nparams,
           cm_device_describe(dev));
    cm_trainer_free(tr);
    cm_optim_free(opt);
    cm_model_free(m);
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
    return 0;
}
