/*
 * act_ckpt — what activation checkpointing saves and costs (issue 22): peak RSS and throughput of
 * GPT-2 124M training with and without it, each in its own process.
 *
 *     build/bench/bench_act_ckpt [options]          (from the repository root)
 *       --seq T        sequence length (default 1024)
 *       --batch B      rows per step (default 1)
 *       --steps S      timed optimizer steps per run (default 2)
 *       --warmup W     untimed steps first (default 1)
 *       --precision P  fp32 | amp_bf16 (default fp32)
 *       --preset NAME  a GPT-2 zoo preset (default gpt2, the 124M model)
 *       --out FILE     results TSV (default bench/results/act_ckpt.tsv)
 *       --fused        every run with lm_head fused with the loss
 *                      (cm_gpt2_set_fused_linear_cross_entropy: the T × V logits and their gradient
 *                      never held whole); the TSV's run names get "+fused"
 *
 * Five children, one after another, over the same random tokens (uniform in [0, V), fixed seed)
 * and the same model init (dropout 0.1 as in the preset), AdamW:
 *   static  the same training at T = 16: parameters, gradients, optimizer state, the loader, the
 *           runtime — everything but the activations, which are 1/64 of the T run's (and the logits
 *           16 × V instead of T × V)
 *   plain   at T, no checkpointing
 *   ckpt    at T, cm_module_checkpoint_policy's default: every GPT2Block one region
 *   static1, plain1  the same two with one block (n_layer 1): they split the activations into the
 *           blocks' part and the rest (embeddings, final norm, the T × V logits and the loss), which
 *           checkpointing the blocks cannot touch
 * Peak RSS is each child's, from wait4's rusage; "activations" is a run's peak minus its static's
 * (what the activations, the replay and the step's workspace added on top of the model's state).
 * Each child also reports its tape's peak (cm_tape_peak_bytes: activations, their gradients and the
 * replay's arena), which splits exactly where RSS, moving in the allocator's steps, cannot: with L
 * blocks, per block b = (tape(plain) - tape(plain1)) / (L - 1), the rest = tape(plain1) - b; the
 * blocks' part is L·b without checkpointing and tape(ckpt) - rest with it.
 * Throughput is tokens per second over the timed steps (BATCH_END clock after the warm-up).
 * The figures go to stdout and the TSV (time, run, preset, T, B, precision, tok/s, s/step, peak RSS
 * MiB, tape peak MiB, CPU, threads, load) with the CPU model and the load average (a shared machine
 * makes the throughput noisy; the RSS figures are not).
 *
 * The worker (one run) is this binary again: bench_act_ckpt --worker MODE T B STEPS WARMUP P PRESET LAYERS DATA FUSED
 * (LAYERS 0: the preset's; FUSED 0 or 1)
 */
#include <composer/composer.h>
#include <composer/trainer.h>
#include <composer/zoo_gpt2.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(call)                                                                                \
    do {                                                                                           \
        if ((call) != CM_OK) {                                                                     \
            fprintf(stderr, "act_ckpt: %s:%d: %s\n", __FILE__, __LINE__, cm_last_error());        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define STATIC_T 16

/* ---- the worker: an in-memory token dataset, a timer callback, the trainer ---- */

typedef struct memds {
    int64_t n, T;
    const int32_t *tokens;
    cm_field_desc fields[2];
} memds;

static int64_t memds_len(void *self) { return ((memds *)self)->n; }
static int memds_n_fields(void *self) { (void)self; return 2; }
static const cm_field_desc *memds_field(void *self, int i) { return &((memds *)self)->fields[i]; }
static cm_status memds_get(void *self, int64_t index, const cm_sample_ctx *ctx, void *const *out) {
    (void)ctx;
    memds *d = self;
    memcpy(out[0], d->tokens + index * d->T, (size_t)d->T * 4);     /* (T) */
    memcpy(out[1], d->tokens + index * d->T + 1, (size_t)d->T * 4); /* (T), shifted by one */
    return CM_OK;
}
static int64_t memds_n_tokens(void *self, int64_t index) {
    (void)index;
    return ((memds *)self)->T;
}
static const cm_dataset_i MEMDS_I = {CM_DATASET_ABI, "bench", memds_len, memds_n_fields, memds_field,
                                     memds_get, memds_n_tokens, NULL};

typedef struct timer_cb {
    double *t; /* clock after each batch */
    int n, cap;
    size_t tape_peak; /* the most the trainer's tape held (cm_tape_peak_bytes) */
} timer_cb;

static cm_status timer_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    (void)lg;
    timer_cb *c = self;
    if (ev == CM_EVENT_BATCH_END && c->n < c->cap) c->t[c->n++] = cm_clock_s();
    if (ev == CM_EVENT_BATCH_END && cm_state_tape(st)) {
        const size_t p = cm_tape_peak_bytes(cm_state_tape(st));
        if (p > c->tape_peak) c->tape_peak = p;
    }
    return CM_OK;
}
static void timer_free(void *self) { (void)self; }
static const cm_callback_i TIMER_I = {CM_CALLBACK_ABI, "BenchTimer", timer_event, NULL, NULL, NULL, timer_free};

static int run_worker(char **a) {
    const char *mode = a[0];
    const int64_t T = atoll(a[1]), B = atoll(a[2]);
    const int steps = atoi(a[3]), warmup = atoi(a[4]), total = steps + warmup;
    const char *prec = a[5], *preset = a[6], *path = a[8];
    const int layers = atoi(a[7]);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "act_ckpt: cannot read %s: %s\n", path, strerror(errno));
        return 1;
    }
    const size_t nt = (size_t)(total * B * T + 1);
    int32_t *tokens = malloc(nt * 4);
    if (!tokens || fread(tokens, 4, nt, f) != nt) {
        fprintf(stderr, "act_ckpt: %s is shorter than %zu tokens\n", path, nt);
        return 1;
    }
    fclose(f);
    memds d = {total * B, T, tokens, {{"input_ids", CM_DTYPE_I32, 1, {T}}, {"labels", CM_DTYPE_I32, 1, {T}}}};
    cm_dataset *ds;
    CHECK(cm_dataset_new(&MEMDS_I, &d, &ds));

    cm_gpt2_config c;
    CHECK(cm_gpt2_config_preset(preset, &c));
    if (layers > 0) c.n_layer = layers;
    cm_rng rng = cm_rng_init(1337, 0);
    cm_model *model;
    CHECK(cm_gpt2_new(&c, &rng, &model));
    if (atoi(a[9])) CHECK(cm_gpt2_set_fused_linear_cross_entropy(model, true, 0));
    cm_module *root = cm_model_module(model);
    int marked = 0;
    if (!strcmp(mode, "ckpt")) CHECK(cm_module_checkpoint_policy(root, NULL, 0, &marked));
    const int n_units = cm_module_n_units(root);
    cm_optim_span *spans = calloc((size_t)n_units, sizeof *spans);
    for (int i = 0; i < n_units; i++) {
        const cm_unit_info *u = cm_module_unit(root, i);
        spans[i] = (cm_optim_span){u->name, u->params, u->grads, u->numel};
    }
    cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_ADAMW);
    hp.lr = 6e-4, hp.beta1 = 0.9, hp.beta2 = 0.95, hp.weight_decay = 0.1;
    cm_optim *opt;
    CHECK(cm_optim_new(CM_OPTIM_ADAMW, &opt));
    CHECK(cm_optim_add_group(opt, &hp, spans, n_units));
    cm_dataloader_config lc = cm_dataloader_config_default();
    lc.batch_size = B, lc.shuffle = false;
    cm_dataloader *dl;
    CHECK(cm_dataloader_new(ds, &lc, &dl));

    timer_cb tc = {calloc((size_t)total, sizeof(double)), 0, total, 0};
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
    const double t0 = cm_clock_s();
    CHECK(cm_trainer_fit(tr, NULL));
    if (tc.n != total) {
        fprintf(stderr, "act_ckpt: %d batches timed, expected %d\n", tc.n, total);
        return 1;
    }
    const double start = warmup > 0 ? tc.t[warmup - 1] : t0;
    const double dt = tc.t[total - 1] - start;
    printf("RESULT %.3f %.4f %d %.3f\n", (double)steps * (double)B * (double)T / dt, dt / steps, marked,
           (double)tc.tape_peak / 1048576.0);
    cm_trainer_free(tr);
    cm_optim_free(opt);
    cm_model_free(model);
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
    free(spans);
    free(tc.t);
    free(tokens);
    return 0;
}

/* ---- the driver ---- */

typedef struct result {
    double tok_s, s_step, rss_mib, tape_mib; /* tok_s 0 = failed */
    int marked;
} result;

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static result run_child(char *const *argv) {
    result r = {0};
    int fd[2];
    if (pipe(fd) != 0) return r;
    pid_t pid = fork();
    if (pid < 0) return r;
    if (pid == 0) {
        dup2(fd[1], STDOUT_FILENO);
        close(fd[0]);
        close(fd[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fd[1]);
    char buf[4096];
    size_t n = 0;
    ssize_t k;
    while (n < sizeof buf - 1 && (k = read(fd[0], buf + n, sizeof buf - 1 - n)) > 0) n += (size_t)k;
    buf[n] = 0;
    close(fd[0]);
    int status;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return r;
    const char *line = strstr(buf, "RESULT ");
    if (!line || sscanf(line, "RESULT %lf %lf %d %lf", &r.tok_s, &r.s_step, &r.marked, &r.tape_mib) != 4) r.tok_s = 0;
    r.rss_mib = (double)ru.ru_maxrss / 1024.0; /* Linux: KiB */
    return r;
}

static void cpu_name(char *out, size_t cap) {
    snprintf(out, cap, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            const char *v = strchr(line, ':');
            if (v) snprintf(out, cap, "%s", v + 2);
            out[strcspn(out, "\n")] = 0;
            break;
        }
    fclose(f);
}

int main(int argc, char **argv) {
    if (argc == 12 && !strcmp(argv[1], "--worker")) return run_worker(argv + 2);
    int64_t T = 1024, B = 1;
    int steps = 2, warmup = 1;
    const char *prec = "fp32", *preset = "gpt2", *out = "bench/results/act_ckpt.tsv";
    bool fused = false;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--fused")) {
            fused = true;
            continue;
        }
        if (!v) {
            fprintf(stderr, "act_ckpt: %s needs a value (see the comment at the top of bench/act_ckpt.c)\n", argv[i]);
            return 2;
        }
        if (!strcmp(argv[i], "--seq")) T = atoll(v);
        else if (!strcmp(argv[i], "--batch")) B = atoll(v);
        else if (!strcmp(argv[i], "--steps")) steps = atoi(v);
        else if (!strcmp(argv[i], "--warmup")) warmup = atoi(v);
        else if (!strcmp(argv[i], "--precision")) prec = v;
        else if (!strcmp(argv[i], "--preset")) preset = v;
        else if (!strcmp(argv[i], "--out")) out = v;
        else {
            fprintf(stderr, "act_ckpt: unknown option %s\n", argv[i]);
            return 2;
        }
        i++;
    }
    if (T < STATIC_T || B < 1 || steps < 1 || warmup < 0) {
        fprintf(stderr, "act_ckpt: need --seq >= %d, --batch >= 1, --steps >= 1, --warmup >= 0\n", STATIC_T);
        return 2;
    }
    cm_gpt2_config c;
    CHECK(cm_gpt2_config_preset(preset, &c));
    if (T > c.n_positions) {
        fprintf(stderr, "act_ckpt: --seq %lld exceeds the preset's %lld positions\n", (long long)T,
                (long long)c.n_positions);
        return 2;
    }
    char data[] = "/tmp/act_ckpt_XXXXXX";
    int dfd = mkstemp(data);
    FILE *f = dfd >= 0 ? fdopen(dfd, "wb") : NULL;
    if (!f) {
        fprintf(stderr, "act_ckpt: cannot make a temporary file: %s\n", strerror(errno));
        return 1;
    }
    uint64_t s = 12345;
    const int64_t nt = (int64_t)(steps + warmup) * B * T + 1;
    for (int64_t i = 0; i < nt; i++) {
        const int32_t t = (int32_t)(splitmix(&s) % (uint64_t)c.vocab_size);
        fwrite(&t, 4, 1, f);
    }
    fclose(f);

    static const char *const modes[] = {"static", "plain", "ckpt", "static1", "plain1"};
    result r[5];
    char self[4096];
    const ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) return 1;
    self[sl] = 0;
    if (c.n_layer < 2) {
        fprintf(stderr, "act_ckpt: the preset needs at least 2 blocks to split the activations\n");
        return 2;
    }
    for (int m = 0; m < 5; m++) {
        char ts[32], bs[32], ss[32], ws[32];
        const bool is_static = m == 0 || m == 3;
        snprintf(ts, sizeof ts, "%lld", (long long)(is_static ? STATIC_T : T));
        snprintf(bs, sizeof bs, "%lld", (long long)B);
        snprintf(ss, sizeof ss, "%d", steps);
        snprintf(ws, sizeof ws, "%d", warmup);
        char *av[] = {self, "--worker", (char *)modes[m], ts, bs, ss, ws, (char *)prec, (char *)preset,
                      m >= 3 ? "1" : "0", data, fused ? "1" : "0", NULL};
        r[m] = run_child(av);
        if (r[m].tok_s <= 0) {
            fprintf(stderr, "act_ckpt: the %s run failed\n", modes[m]);
            unlink(data);
            return 1;
        }
        fprintf(stderr, "act_ckpt: %-6s T %-5lld %10.1f tok/s %8.3f s/step  peak RSS %8.1f MiB%s\n", modes[m],
                (long long)(is_static ? STATIC_T : T), r[m].tok_s, r[m].s_step, r[m].rss_mib, m >= 3 ? " (1 block)" : "");
    }
    unlink(data);
    char cpu[256];
    cpu_name(cpu, sizeof cpu);
    double load[3] = {0};
    getloadavg(load, 3);
    const double act_plain = r[1].rss_mib - r[0].rss_mib, act_ckpt = r[2].rss_mib - r[0].rss_mib;
    const double cut = act_plain > 0 ? 100.0 * (1.0 - act_ckpt / act_plain) : 0;
    const double cost = 100.0 * (1.0 - r[2].tok_s / r[1].tok_s);
    /* the split into blocks and the rest, from the tape's own peak (exact; RSS moves in the
     * allocator's steps, too coarse for one block) */
    const double L = (double)c.n_layer;
    const double per_block = (r[1].tape_mib - r[4].tape_mib) / (L - 1), rest = r[4].tape_mib - per_block;
    const double blocks_plain = L * per_block, blocks_ckpt = r[2].tape_mib - rest;
    const double cut_blocks = blocks_plain > 0 ? 100.0 * (1.0 - blocks_ckpt / blocks_plain) : 0;
    const double cut_tape = 100.0 * (1.0 - r[2].tape_mib / r[1].tape_mib);
    printf("GPT-2 preset %s, T %lld, B %lld, %s%s, %d timed steps after %d warm-up; %s, %d threads, load %.1f\n", preset,
           (long long)T, (long long)B, prec, fused ? ", lm_head fused with the loss" : "", steps, warmup, cpu,
           cm_num_threads(), load[0]);
    printf("%-8s %6s %12s %10s %14s %18s %14s\n", "run", "T", "tok/s", "s/step", "peak RSS MiB", "RSS - static MiB",
           "tape peak MiB");
    for (int m = 0; m < 5; m++) {
        char d[32] = "";
        if (m == 1 || m == 2) snprintf(d, sizeof d, "%.1f", m == 1 ? act_plain : act_ckpt);
        if (m == 4) snprintf(d, sizeof d, "%.1f", r[4].rss_mib - r[3].rss_mib);
        printf("%-8s %6lld %12.1f %10.3f %14.1f %18s %14.1f\n", modes[m], (long long)(m == 0 || m == 3 ? STATIC_T : T),
               r[m].tok_s, r[m].s_step, r[m].rss_mib, d, r[m].tape_mib);
    }
    printf("activations (tape peak): %.1f MiB a block, %.1f MiB the rest (embeddings, final norm, logits, loss);\n"
           "  the blocks' part %.1f MiB plain, %.1f MiB checkpointed (-%.1f%%); the whole tape -%.1f%%\n",
           per_block, rest, blocks_plain, blocks_ckpt, cut_blocks, cut_tape);
    printf("activation checkpointing (%d blocks): RSS above static -%.1f%%, peak RSS -%.1f%%, throughput -%.1f%%\n",
           r[2].marked, cut, 100.0 * (1.0 - r[2].rss_mib / r[1].rss_mib), cost);
    FILE *o = fopen(out, "a");
    if (o) {
        time_t now = time(NULL);
        char when[32];
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
        for (int m = 0; m < 5; m++)
            fprintf(o, "%s\t%s%s\t%s\t%lld\t%lld\t%s\t%.1f\t%.3f\t%.1f\t%.1f\t%s\t%d\t%.1f\n", when, modes[m],
                    fused ? "+fused" : "", preset,
                    (long long)(m == 0 || m == 3 ? STATIC_T : T), (long long)B, prec, r[m].tok_s, r[m].s_step, r[m].rss_mib,
                    r[m].tape_mib, cpu,
                    cm_num_threads(), load[0]);
        fclose(o);
    } else {
        fprintf(stderr, "act_ckpt: cannot append to %s: %s\n", out, strerror(errno));
    }
    return 0;
}
