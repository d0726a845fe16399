/*
 * train_throughput — training throughput of the library's trainer against PyTorch on the same
 * machine, model, shapes, data and precision, run side by side (DESIGN.md §7, issue 8).
 *
 *     build/bench/bench_train_throughput [options]          (from the repository root)
 *       --workloads char,gpt2,bert,resnet56   which models (default all four)
 *       --precisions fp32,amp_bf16        (default both)
 *       --reps R        repetitions of each (ours, torch) pair, interleaved (default 3)
 *       --steps S       timed optimizer steps per run (default: char 4, gpt2 2, resnet56 3)
 *       --warmup W      untimed steps first (default 1)
 *       --threads N     threads for both sides (default: cm_num_threads())
 *       --no-torch      our side only
 *       --torch-channels-last   PyTorch's ResNet in torch.channels_last (ours is channels-last inside
 *                       by default, cm_resnet_config.channels_last); off by default because a
 *                       PyTorch user has to ask for it. Its TSV rows say "torch_cl".
 *       --torch-dense-mlm   PyTorch's BERT computes the MLM head on every position, as Hugging
 *                       Face's BertForMaskedLM does, instead of on the masked ones as ours does;
 *                       its TSV rows say "torch_dense".
 *       --out FILE      results TSV (default bench/results/train_throughput.tsv)
 *
 * Workloads (B = batch, T = sequence length):
 *   char      nanoGPT's shakespeare-char GPT: 6 layers, C 384, 6 heads, V 65, T 256, B 8, dropout 0.2
 *   gpt2      GPT-2 124M: 12 layers, C 768, 12 heads, V 50257, T 256, B 8, dropout 0.1, tied lm_head
 *   bert      masked-LM pretraining of the BERT-Tiny shape examples/bert-mlm.yaml trains: 2 layers,
 *             C 128, 2 heads, intermediate 512, V 30522, T 128, B 64, dropout 0.1, decoder tied to
 *             the word embeddings; 15% of the positions masked (80/10/10) and the MLM head on those
 *             only on both sides (ours: cm_bert_mlm_sparse_logits, as `composer train` runs it;
 *             PyTorch: the hidden states' masked rows gathered before the head)
 *   resnet56  He et al.'s CIFAR ResNet-56 (option-A shortcuts), B 128 × (3, 32, 32), 10 classes
 * GPTs train with AdamW (lr 6e-4, betas 0.9/0.95, wd 0.1), BERT with AdamW (examples/bert-mlm.yaml's
 * lr 1e-3, betas 0.9/0.98, eps 1e-6, wd 1e-5), the ResNet with SGD (lr 0.1, momentum
 * 0.9, wd 5e-4); both sides have the same optimizer kind and hyperparameters.
 *
 * The driver writes the data once (a token stream or images and labels, from a fixed seed) to a
 * temporary file both sides read, then for each repetition runs our side and the PyTorch side
 * (bench/train_throughput.py under Debian's /usr/bin/python3, torch.set_num_threads(N)) as child
 * processes, alternating which goes first. Each child times the steps after its warm-up with the
 * same clock rules and prints its throughput; the driver takes each child's peak RSS from wait4's
 * rusage, so both are measured the same way. It prints a table of medians, appends every run to
 * the TSV and prints the machine line (CPU model, ISA, threads, load average).
 *
 * The worker (our side of one run) is this binary again:
 *   bench_train_throughput --worker WORKLOAD PRECISION STEPS WARMUP DATAFILE
 */
#include <composer/composer.h>
#include <composer/callbacks.h>
#include <composer/trainer.h>
#include <composer/zoo_bert.h>
#include <composer/zoo_gpt2.h>
#include <composer/zoo_vision.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(call)                                                                                        \
    do {                                                                                                   \
        if ((call) != CM_OK) {                                                                             \
            fprintf(stderr, "train_throughput: %s:%d: %s\n", __FILE__, __LINE__, cm_last_error());         \
            exit(1);                                                                                       \
        }                                                                                                  \
    } while (0)

/* ---- workloads ---- */

typedef enum { W_GPT, W_BERT, W_RESNET } workload_kind;

typedef struct workload {
    const char *name;
    workload_kind kind;
    const char *preset; /* zoo preset */
    int64_t batch, seq; /* seq: T for GPTs and BERT */
    int default_steps, default_warmup;
    const char *unit;   /* "tok/s" or "img/s" */
} workload;

static const workload WORKLOADS[] = {
    {"char", W_GPT, "shakespeare-char", 8, 256, 4, 1, "tok/s"},
    {"gpt2", W_GPT, "gpt2", 8, 256, 2, 1, "tok/s"},
    {"bert", W_BERT, "bert-tiny", 64, 128, 10, 2, "tok/s"},
    {"resnet56", W_RESNET, "resnet56", 128, 0, 3, 1, "img/s"},
};
#define N_WORKLOADS ((int)(sizeof WORKLOADS / sizeof WORKLOADS[0]))

#define BERT_MLM_PROBABILITY 0.15
#define BERT_MASK_ID 103  /* bert-base-uncased's [MASK] */
#define BERT_FIRST_WORD 999 /* ids below are [PAD], [unused*], [CLS], [SEP], [MASK] and the like */

static const workload *find_workload(const char *name) {
    for (int i = 0; i < N_WORKLOADS; i++)
        if (strcmp(WORKLOADS[i].name, name) == 0) return &WORKLOADS[i];
    return NULL;
}

/* Training FLOPs of one item (token or image): 3 × forward, the usual MFU convention. */
static double flops_per_item(const workload *w) {
    if (w->kind == W_GPT) {
        cm_gpt2_config c;
        CHECK(cm_gpt2_config_preset(w->preset, &c));
        double n = (double)cm_gpt2_config_n_params(&c, true);
        return 6.0 * n + 12.0 * (double)c.n_layer * (double)c.n_embd * (double)w->seq;
    }
    if (w->kind == W_BERT) { /* the decoder on the masked positions only, as cm_model_flops counts it */
        cm_bert_config c;
        CHECK(cm_bert_config_preset(w->preset, &c));
        const double C = (double)c.hidden_size, T = (double)w->seq;
        const double head = 6.0 * (C * C + C * (double)c.vocab_size) * T;
        return (cm_bert_flops_per_sequence(&c, true, w->seq) - head * (1.0 - BERT_MLM_PROBABILITY)) / T;
    }
    cm_resnet_config rc;
    CHECK(cm_resnet_config_preset(w->preset, &rc));
    return 3.0 * cm_resnet_forward_flops(&rc, 32, 32);
}

/* ---- the data file both sides read: a header line-free binary ----
 * GPT: int32 tokens, (steps_total · B · T + 1) of them, uniform in [0, V).
 * BERT: int32 input_ids (n, T) then int32 labels (n, T): words uniform in [999, V); each position
 *   masked with probability 0.15 (label = the word, input [MASK] / a random word / the word itself
 *   with probabilities 0.8 / 0.1 / 0.1, as DataCollatorForLanguageModeling), label -100 elsewhere.
 * ResNet: f32 images (n, 3, 32, 32) ~ N(0, 1) then int64 labels (n) in [0, 10). */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int64_t n_samples(const workload *w, int steps_total) { return (int64_t)steps_total * w->batch; }

static void write_data(const workload *w, int steps_total, const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "train_throughput: cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
    uint64_t s = 12345;
    int64_t n = n_samples(w, steps_total);
    if (w->kind == W_GPT) {
        cm_gpt2_config c;
        CHECK(cm_gpt2_config_preset(w->preset, &c));
        int64_t nt = n * w->seq + 1;
        for (int64_t i = 0; i < nt; i++) {
            int32_t t = (int32_t)(splitmix(&s) % (uint64_t)c.vocab_size);
            fwrite(&t, 4, 1, f);
        }
    } else if (w->kind == W_BERT) {
        cm_bert_config c;
        CHECK(cm_bert_config_preset(w->preset, &c));
        const int64_t nt = n * w->seq, words = c.vocab_size - BERT_FIRST_WORD;
        int32_t *ids = malloc((size_t)nt * 4), *lab = malloc((size_t)nt * 4);
        if (!ids || !lab) {
            fprintf(stderr, "train_throughput: out of memory for the BERT data\n");
            exit(1);
        }
        for (int64_t i = 0; i < nt; i++) {
            const int32_t word = (int32_t)(BERT_FIRST_WORD + (int64_t)(splitmix(&s) % (uint64_t)words));
            const double u = (double)(splitmix(&s) >> 11) / 9007199254740992.0;
            ids[i] = word, lab[i] = -100;
            if (u < BERT_MLM_PROBABILITY) {
                const double v = u / BERT_MLM_PROBABILITY; /* uniform in [0, 1) again */
                lab[i] = word;
                if (v < 0.8) ids[i] = BERT_MASK_ID;
                else if (v < 0.9) ids[i] = (int32_t)(BERT_FIRST_WORD + (int64_t)(splitmix(&s) % (uint64_t)words));
            }
        }
        fwrite(ids, 4, (size_t)nt, f);
        fwrite(lab, 4, (size_t)nt, f);
        free(ids);
        free(lab);
    } else {
        int64_t ni = n * 3 * 32 * 32;
        for (int64_t i = 0; i < ni; i += 2) { /* Box-Muller */
            double u1 = ((double)(splitmix(&s) >> 11) + 0.5) / 9007199254740992.0;
            double u2 = (double)(splitmix(&s) >> 11) / 9007199254740992.0;
            double r = sqrt(-2.0 * log(u1));
            float v[2] = {(float)(r * cos(6.283185307179586 * u2)), (float)(r * sin(6.283185307179586 * u2))};
            fwrite(v, 4, 2, f);
        }
        for (int64_t i = 0; i < n; i++) {
            int64_t y = (int64_t)(splitmix(&s) % 10);
            fwrite(&y, 8, 1, f);
        }
    }
    if (fclose(f) != 0) {
        fprintf(stderr, "train_throughput: writing %s failed\n", path);
        exit(1);
    }
}

/* ---- our side: an in-memory dataset over the data file ---- */

typedef struct memds {
    const workload *w;
    int64_t n;
    int32_t *tokens; /* GPT; BERT: input_ids (n, T) */
    int32_t *mlm;    /* BERT: labels (n, T) */
    float *images;   /* ResNet (n, 3, 32, 32) */
    int64_t *labels; /* ResNet (n) */
    cm_field_desc fields[3];
} memds;

static int64_t memds_len(void *self) { return ((memds *)self)->n; }
static int memds_n_fields(void *self) { return ((memds *)self)->w->kind == W_BERT ? 3 : 2; }
static const cm_field_desc *memds_field(void *self, int i) { return &((memds *)self)->fields[i]; }
static cm_status memds_get(void *self, int64_t index, const cm_sample_ctx *ctx, void *const *out) {
    (void)ctx;
    memds *d = self;
    const int64_t T = d->w->seq;
    if (d->w->kind == W_GPT) {
        memcpy(out[0], d->tokens + index * T, (size_t)T * 4);
        memcpy(out[1], d->tokens + index * T + 1, (size_t)T * 4);
    } else if (d->w->kind == W_BERT) { /* input_ids, attention_mask (packed text: all ones), labels */
        memcpy(out[0], d->tokens + index * T, (size_t)T * 4);
        for (int64_t t = 0; t < T; t++) ((int32_t *)out[1])[t] = 1;
        memcpy(out[2], d->mlm + index * T, (size_t)T * 4);
    } else {
        memcpy(out[0], d->images + index * 3072, 3072 * 4);
        memcpy(out[1], d->labels + index, 8);
    }
    return CM_OK;
}
static int64_t memds_n_tokens(void *self, int64_t index) {
    (void)index;
    memds *d = self;
    return d->w->kind == W_RESNET ? 0 : d->w->seq;
}

static const cm_dataset_i MEMDS_I = {CM_DATASET_ABI, "bench", memds_len, memds_n_fields, memds_field,
                                     memds_get, memds_n_tokens, NULL};

static void *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "train_throughput: cannot read %s: %s\n", path, strerror(errno));
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc((size_t)n);
    if (!p || fread(p, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "train_throughput: reading %s failed\n", path);
        exit(1);
    }
    fclose(f);
    *len = (size_t)n;
    return p;
}

/* ---- our side: step timing ---- */

typedef struct timer_cb {
    double *t; /* clock after each batch */
    int n, cap;
} timer_cb;

static cm_status timer_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    (void)st, (void)lg;
    timer_cb *c = self;
    if (ev == CM_EVENT_BATCH_END && c->n < c->cap) c->t[c->n++] = cm_clock_s();
    return CM_OK;
}
static void timer_free(void *self) { (void)self; }
static const cm_callback_i TIMER_I = {CM_CALLBACK_ABI, "BenchTimer", timer_event, NULL, NULL, NULL, timer_free};

static int run_worker(const char *wname, const char *prec, int steps, int warmup, const char *path) {
    const workload *w = find_workload(wname);
    if (!w) {
        fprintf(stderr, "train_throughput: unknown workload '%s'\n", wname);
        return 2;
    }
    int total = steps + warmup;
    memds *d = calloc(1, sizeof *d);
    d->w = w;
    d->n = n_samples(w, total);
    size_t len;
    char *raw = read_all(path, &len);
    if (w->kind == W_GPT) {
        d->tokens = (int32_t *)raw;
        d->fields[0] = (cm_field_desc){"input_ids", CM_DTYPE_I32, 1, {w->seq}};
        d->fields[1] = (cm_field_desc){"labels", CM_DTYPE_I32, 1, {w->seq}};
    } else if (w->kind == W_BERT) {
        d->tokens = (int32_t *)raw;
        d->mlm = (int32_t *)raw + d->n * w->seq;
        d->fields[0] = (cm_field_desc){"input_ids", CM_DTYPE_I32, 1, {w->seq}};
        d->fields[1] = (cm_field_desc){"attention_mask", CM_DTYPE_I32, 1, {w->seq}};
        d->fields[2] = (cm_field_desc){"labels", CM_DTYPE_I32, 1, {w->seq}};
    } else {
        d->images = (float *)raw;
        d->labels = (int64_t *)(raw + (size_t)d->n * 3072 * 4);
        d->fields[0] = (cm_field_desc){"image", CM_DTYPE_F32, 3, {3, 32, 32}};
        d->fields[1] = (cm_field_desc){"label", CM_DTYPE_I64, 0, {0}};
    }
    cm_dataset *ds;
    CHECK(cm_dataset_new(&MEMDS_I, d, &ds));

    cm_model *model;
    cm_optim_hparams hp;
    cm_optim_kind kind;
    if (w->kind == W_GPT) {
        cm_gpt2_config c;
        CHECK(cm_gpt2_config_preset(w->preset, &c));
        cm_rng rng = cm_rng_init(1337, 0);
        CHECK(cm_gpt2_new(&c, &rng, &model));
        kind = CM_OPTIM_ADAMW;
        hp = cm_optim_hparams_default(kind);
        hp.lr = 6e-4, hp.beta1 = 0.9, hp.beta2 = 0.95, hp.weight_decay = 0.1;
    } else if (w->kind == W_BERT) {
        cm_bert_config c;
        CHECK(cm_bert_config_preset(w->preset, &c));
        cm_rng rng = cm_rng_init(1337, 0);
        CHECK(cm_bert_mlm_new(&c, &rng, &model));
        CHECK(cm_bert_mlm_sparse_logits(model, true));
        kind = CM_OPTIM_ADAMW;
        hp = cm_optim_hparams_default(kind);
        hp.lr = 1e-3, hp.beta1 = 0.9, hp.beta2 = 0.98, hp.eps = 1e-6, hp.weight_decay = 1e-5;
    } else {
        cm_resnet_config rc;
        CHECK(cm_resnet_config_preset(w->preset, &rc));
        rc.random_init = true, rc.seed = 1337;
        CHECK(cm_resnet_model_new(&rc, &model));
        kind = CM_OPTIM_SGD;
        hp = cm_optim_hparams_default(kind);
        hp.lr = 0.1, hp.momentum = 0.9, hp.weight_decay = 5e-4;
    }
    cm_module *root = cm_model_module(model);
    int n_units = cm_module_n_units(root);
    cm_optim_span *spans = calloc((size_t)n_units, sizeof *spans);
    for (int i = 0; i < n_units; i++) {
        const cm_unit_info *u = cm_module_unit(root, i);
        spans[i] = (cm_optim_span){u->name, u->params, u->grads, u->numel};
    }
    cm_optim *opt;
    CHECK(cm_optim_new(kind, &opt));
    CHECK(cm_optim_add_group(opt, &hp, spans, n_units));

    cm_dataloader_config lc = cm_dataloader_config_default();
    lc.batch_size = w->batch, lc.shuffle = false;
    cm_dataloader *dl;
    CHECK(cm_dataloader_new(ds, &lc, &dl));

    timer_cb tc = {calloc((size_t)total, sizeof(double)), 0, total};
    cm_callback_plugin cb = {&TIMER_I, &tc};
    cm_trainer_config cfg = cm_trainer_config_default();
    cfg.model = model;
    cfg.train_dataloader = dl;
    cfg.optimizer = opt;
    cfg.max_duration = cm_time_make(total, CM_TIME_BATCH);
    cfg.callbacks = &cb, cfg.n_callbacks = 1;
    CHECK(cm_precision_parse(prec, &cfg.precision));
    cm_trainer *tr;
    CHECK(cm_trainer_new(&cfg, &tr));
    double t0 = cm_clock_s();
    CHECK(cm_trainer_fit(tr, NULL));
    if (tc.n != total) {
        fprintf(stderr, "train_throughput: %d batches timed, expected %d\n", tc.n, total);
        return 1;
    }
    double start = warmup > 0 ? tc.t[warmup - 1] : t0;
    double dt = tc.t[total - 1] - start;
    double items = (double)steps * (double)w->batch * (w->kind == W_RESNET ? 1.0 : (double)w->seq);
    printf("RESULT %.3f %.4f\n", items / dt, dt / steps);
    cm_trainer_free(tr);
    cm_optim_free(opt);
    cm_model_free(model);
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
    free(spans);
    free(tc.t);
    free(raw);
    return 0;
}

/* ---- the driver ---- */

typedef struct run_result {
    double items_per_s; /* 0 = failed */
    double rss_mib;
} run_result;

/* Runs argv as a child, reads its "RESULT <items/s> ..." line, takes its peak RSS from wait4. */
static run_result run_child(char *const *argv) {
    run_result r = {0, 0};
    int fd[2];
    if (pipe(fd) != 0) return r;
    pid_t pid = fork();
    if (pid < 0) return r;
    if (pid == 0) {
        dup2(fd[1], STDOUT_FILENO);
        close(fd[0]);
        close(fd[1]);
        execv(argv[0], argv);
        fprintf(stderr, "train_throughput: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fd[1]);
    FILE *f = fdopen(fd[0], "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        double v;
        if (sscanf(line, "RESULT %lf", &v) == 1) r.items_per_s = v;
        else fputs(line, stderr);
    }
    if (f) fclose(f);
    int status;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "train_throughput: %s %s failed\n", argv[0], argv[1]);
        r.items_per_s = 0;
    }
    r.rss_mib = (double)ru.ru_maxrss / 1024.0;
    return r;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void cpu_model(char *buf, size_t cap) {
    snprintf(buf, cap, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *p = strchr(line, ':');
            if (p) {
                p += 2;
                p[strcspn(p, "\n")] = 0;
                snprintf(buf, cap, "%s", p);
            }
            break;
        }
    }
    fclose(f);
}

/* The bf16 peak: all threads running vdpbf16ps (16 lanes x 2 products, 64 FLOPs per instruction)
 * on independent accumulators, best of 24 rounds per thread, summed. 0 without AVX512-BF16 (bf16
 * GEMMs then run as widened f32 and the f32 FMA peak is the one that applies). */
#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx512f,avx512bf16"))) static float dpbf16_loop(int64_t iters, float seed) {
    enum { NA = 12 };
    __m512 acc[NA];
    const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380); /* 1, ~6e-8 */
    for (int k = 0; k < NA; k++) acc[k] = _mm512_set1_ps(seed + (float)k);
    for (int64_t i = 0; i < iters; i++)
        for (int k = 0; k < NA; k++) acc[k] = _mm512_dpbf16_ps(acc[k], a, b);
    __m512 t = acc[0];
    for (int k = 1; k < NA; k++) t = _mm512_add_ps(t, acc[k]);
    return _mm512_reduce_add_ps(t);
}
#endif

static double bf16_peak(int threads) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bf16")) return 0;
    const int64_t iters = 200000;
    const double flops = 64.0 * 12 * (double)iters;
    double total = 0;
    volatile float sink = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : total)
    for (int t = 0; t < threads; t++) {
        double best = 0;
        for (int round = 0; round < 24; round++) {
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            float v = dpbf16_loop(iters, 1.0f + (float)t);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            sink += v;
            const double dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
            if (dt > 0 && flops / dt > best) best = flops / dt;
        }
        total += best;
    }
    (void)sink;
    return total;
#else
    (void)threads;
    return 0;
#endif
}

/* The f32 FMA peak now (cm_peak_flops keeps its first measurement for the process). */
static double f32_peak(void) {
    double pk = 0;
    return cm_peak_flops_measure(&pk) == CM_OK ? pk : 0;
}
static const char *isa(void) {
#if defined(__AVX512F__)
    return "AVX-512";
#elif defined(__AVX2__) && defined(__FMA__)
    return "AVX2+FMA";
#else
    return "scalar/SSE";
#endif
}

static bool in_list(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return true;
        p = e ? e + 1 : NULL;
    }
    return false;
}

/* The TSV's side name of a PyTorch run: the flags that change what PyTorch runs are named. */
static const char *torch_side(const workload *w, bool torch_cl, bool torch_dense) {
    if (w->kind == W_RESNET && torch_cl) return "torch_cl";
    if (w->kind == W_BERT && torch_dense) return "torch_dense";
    return "torch";
}

static bool have_torch(const char *py) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s -c 'import torch' >/dev/null 2>&1", py);
    return system(cmd) == 0;
}

int main(int argc, char **argv) {
    if (argc >= 7 && strcmp(argv[1], "--worker") == 0)
        return run_worker(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]), argv[6]);

    const char *workloads = "char,gpt2,bert,resnet56", *precisions = "fp32,amp_bf16";
    const char *out = "bench/results/train_throughput.tsv", *py = "/usr/bin/python3";
    int reps = 3, steps = 0, warmup = -1, threads = cm_num_threads();
    bool torch = true, torch_cl = false, torch_dense = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--no-torch") == 0) torch = false;
        else if (strcmp(a, "--torch-channels-last") == 0) torch_cl = true;
        else if (strcmp(a, "--torch-dense-mlm") == 0) torch_dense = true;
        else if (v && strcmp(a, "--workloads") == 0) workloads = v, i++;
        else if (v && strcmp(a, "--precisions") == 0) precisions = v, i++;
        else if (v && strcmp(a, "--reps") == 0) reps = atoi(v), i++;
        else if (v && strcmp(a, "--steps") == 0) steps = atoi(v), i++;
        else if (v && strcmp(a, "--warmup") == 0) warmup = atoi(v), i++;
        else if (v && strcmp(a, "--threads") == 0) threads = atoi(v), i++;
        else if (v && strcmp(a, "--out") == 0) out = v, i++;
        else {
            fprintf(stderr, "usage: %s [--workloads char,gpt2,bert,resnet56] [--precisions fp32,amp_bf16] [--reps R] "
                            "[--steps S] [--warmup W] [--threads N] [--no-torch] [--torch-channels-last] "
                            "[--torch-dense-mlm] [--out FILE]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1 || threads < 1 || steps < 0) {
        fprintf(stderr, "train_throughput: reps and threads must be >= 1, steps >= 0\n");
        return 2;
    }
    if (torch && !have_torch(py)) {
        fprintf(stderr, "train_throughput: %s has no torch; installing Debian's python3-torch\n", py);
        if (system("scripts/install-deps --golden") != 0 || !have_torch(py)) {
            fprintf(stderr, "train_throughput: no PyTorch; run with --no-torch for our side only\n");
            return 1;
        }
    }
    char nbuf[16];
    snprintf(nbuf, sizeof nbuf, "%d", threads);
    setenv("CM_NUM_THREADS", nbuf, 1);
    setenv("OMP_NUM_THREADS", nbuf, 1);
    if (torch_cl) setenv("CM_BENCH_TORCH_CHANNELS_LAST", "1", 1);
    else unsetenv("CM_BENCH_TORCH_CHANNELS_LAST");
    if (torch_dense) setenv("CM_BENCH_TORCH_DENSE_MLM", "1", 1);
    else unsetenv("CM_BENCH_TORCH_DENSE_MLM");
    double peak = 0;
    CHECK(cm_set_num_threads(threads));
    CHECK(cm_peak_flops(&peak));
    const double pk0 = f32_peak();
    if (pk0 > peak) peak = pk0;

    char cpu[256];
    cpu_model(cpu, sizeof cpu);
    double load[3] = {0, 0, 0};
    getloadavg(load, 3);
    time_t now = time(NULL);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) {
        fprintf(stderr, "train_throughput: cannot find my own executable\n");
        return 1;
    }
    self[sl] = 0;

    FILE *tsv = fopen(out, "a");
    if (!tsv) fprintf(stderr, "train_throughput: cannot append to %s (results only printed)\n", out);
    else if (ftell(tsv) == 0)
        fprintf(tsv, "date\tcpu\tisa\tthreads\tload1\tworkload\tprecision\trep\tside\titems_per_s\tunit\tpeak_rss_mib\n");

    double peak16 = bf16_peak(threads);
    char p16[64] = "";
    if (peak16 > 0) snprintf(p16, sizeof p16, ", bf16 dot-product peak %.1f GFLOP/s", peak16 / 1e9);
    printf("%s; %s, %s, %d threads; load average at start %.2f %.2f %.2f; FMA peak %.1f GFLOP/s%s\n", stamp, cpu,
           isa(), threads, load[0], load[1], load[2], peak / 1e9, p16);
    if (torch_cl) printf("PyTorch's ResNet runs in torch.channels_last (--torch-channels-last)\n");
    if (torch_dense) printf("PyTorch's BERT computes the MLM head on every position (--torch-dense-mlm)\n");
    printf("| workload | precision | ours | torch | speed-up | ours peak RSS MiB | torch peak RSS MiB | ours MFU | torch MFU |\n");
    printf("|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    fflush(stdout);

    for (int wi = 0; wi < N_WORKLOADS; wi++) {
        const workload *w = &WORKLOADS[wi];
        if (!in_list(workloads, w->name)) continue;
        int ns = steps ? steps : w->default_steps, nw = warmup >= 0 ? warmup : w->default_warmup;
        char path[] = "/tmp/cm_bench_train_XXXXXX";
        int fd = mkstemp(path);
        if (fd < 0) {
            fprintf(stderr, "train_throughput: mkstemp failed\n");
            return 1;
        }
        close(fd);
        write_data(w, ns + nw, path);
        char s_steps[16], s_warm[16];
        snprintf(s_steps, sizeof s_steps, "%d", ns);
        snprintf(s_warm, sizeof s_warm, "%d", nw);
        const char *precs[] = {"fp32", "amp_bf16"};
        for (int pi = 0; pi < 2; pi++) {
            if (!in_list(precisions, precs[pi])) continue;
            double ours[64], theirs[64], rss_o = 0, rss_t = 0;
            int no = 0, nt = 0;
            for (int r = 0; r < reps && r < 64; r++) {
                for (int k = 0; k < 2; k++) {
                    bool torch_turn = (k == 0) == (r % 2 == 1);
                    if (torch_turn && !torch) continue;
                    run_result rr;
                    if (torch_turn) {
                        char *av[] = {(char *)py, "bench/train_throughput.py", (char *)w->name, (char *)precs[pi],
                                      s_steps, s_warm, nbuf, path, NULL};
                        rr = run_child(av);
                    } else {
                        char *av[] = {self, "--worker", (char *)w->name, (char *)precs[pi], s_steps, s_warm, path, NULL};
                        rr = run_child(av);
                    }
                    if (rr.items_per_s <= 0) continue;
                    getloadavg(load, 3);
                    if (tsv)
                        fprintf(tsv, "%s\t%s\t%s\t%d\t%.2f\t%s\t%s\t%d\t%s\t%.3f\t%s\t%.1f\n", stamp, cpu, isa(),
                                threads, load[0], w->name, precs[pi], r, torch_turn ? torch_side(w, torch_cl, torch_dense) : "ours", rr.items_per_s,
                                w->unit, rr.rss_mib);
                    if (torch_turn) theirs[nt++] = rr.items_per_s, rss_t = rss_t > rr.rss_mib ? rss_t : rr.rss_mib;
                    else ours[no++] = rr.items_per_s, rss_o = rss_o > rr.rss_mib ? rss_o : rr.rss_mib;
                }
            }
            if (tsv) fflush(tsv);
            /* The peaks again after each row's runs, keeping the highest: this VM's two virtual
             * cores sometimes share a physical one for minutes, and a peak read then (half the
             * real one) put MFU above 100 %. */
            double pk_now = 0;
            if ((pk_now = f32_peak()) > peak) peak = pk_now;
            if (peak16 > 0 && (pk_now = bf16_peak(threads)) > peak16) peak16 = pk_now;
            double mo = median(ours, no), mt = median(theirs, nt), fpi = flops_per_item(w);
            /* amp_bf16 against the bf16 peak where the CPU has bf16 dot products (the GEMMs run there) */
            const double pk = pi == 1 && peak16 > 0 ? peak16 : peak;
            char sp[32] = "–", t_s[32] = "–", rt[32] = "–", mfu_t[32] = "–";
            if (nt) {
                snprintf(sp, sizeof sp, "%.2fx", mo / mt);
                snprintf(t_s, sizeof t_s, "%.1f %s", mt, w->unit);
                snprintf(rt, sizeof rt, "%.0f", rss_t);
                snprintf(mfu_t, sizeof mfu_t, "%.1f%%", 100.0 * mt * fpi / pk);
            }
            printf("| %s | %s | %.1f %s | %s | %s | %.0f | %s | %.1f%% | %s |\n", w->name, precs[pi], mo, w->unit,
                   t_s, sp, rss_o, rt, 100.0 * mo * fpi / pk, mfu_t);
            fflush(stdout);
        }
        remove(path);
    }
    getloadavg(load, 3);
    p16[0] = 0;
    if (peak16 > 0) snprintf(p16, sizeof p16, ", bf16 dot-product peak %.1f GFLOP/s", peak16 / 1e9);
    printf("load average at end %.2f %.2f %.2f; FMA peak %.1f GFLOP/s%s (the highest measured: at the start and "
           "after each row, whose MFU uses the highest so far); MFU = items/s × training FLOPs per item / FMA peak "
           "(amp_bf16: / bf16 dot-product peak where the CPU has one; the FLOPs are the model's, of direct "
           "convolutions: ours run the 32- and 64-channel ResNet convolutions by Winograd, with fewer "
           "multiplies, so its MFU can pass 100 %%); peak RSS from wait4 (whole process, torch's interpreter "
           "included)\n", load[0], load[1], load[2], peak / 1e9, p16);
    if (tsv) fclose(tsv);
    return 0;
}
