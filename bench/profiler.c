/*
 * profiler — what the profiler (composer/profiler.h) costs a training step.
 *
 *     build/bench/bench_profiler [--steps S] [--reps R] [--preset P] [--batch B] [--seq T]
 *                                [--out FILE]
 *
 * Trains a GPT (zoo preset P, default "tiny": 2 layers, width 32; "shakespeare-char" for a bigger
 * one) on random tokens, S timed steps after 2 untimed ones, in four configurations, interleaved R
 * times (default 5) so that drifts of a shared machine hit all of them alike:
 *   none        no profiler at all (the hooks are one load and a branch each)
 *   attached    a profiler whose schedule never records (skip_first beyond the run)
 *   active      every timed step recorded (events, plugin calls, every op with FLOPs, counters),
 *               its trace written to a temporary folder at the end of the cycle (the write is
 *               timed too: it happens at the start of the batch after the cycle)
 *   active_noop the same without the op hook (record_ops false)
 * It prints the median seconds per step of each and the ratio to `none`, and appends the medians
 * to FILE (default bench/results/profiler.tsv). Times come from a callback reading the clock at
 * every BATCH_END.
 */
#include <composer/composer.h>
#include <composer/profiler.h>
#include <composer/trainer.h>
#include <composer/zoo_gpt2.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK(call)                                                                                  \
    do {                                                                                             \
        if ((call) != CM_OK) {                                                                       \
            fprintf(stderr, "bench_profiler: %s:%d: %s\n", __FILE__, __LINE__, cm_last_error());     \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

/* ---- random tokens ---- */

typedef struct toks {
    int64_t n, seq;
    int32_t *ids; /* n · seq + 1 */
    cm_field_desc fields[2];
} toks;

static int64_t toks_len(void *self) { return ((toks *)self)->n; }
static int toks_n_fields(void *self) { return 2; }
static const cm_field_desc *toks_field(void *self, int i) { return &((toks *)self)->fields[i]; }
static cm_status toks_get(void *self, int64_t index, const cm_sample_ctx *ctx, void *const *out) {
    toks *d = self;
    memcpy(out[0], d->ids + index * d->seq, (size_t)d->seq * 4);
    memcpy(out[1], d->ids + index * d->seq + 1, (size_t)d->seq * 4);
    return CM_OK;
}
static int64_t toks_n_tokens(void *self, int64_t index) { return ((toks *)self)->seq; }
static const cm_dataset_i TOKS_I = {CM_DATASET_ABI, "bench", toks_len, toks_n_fields, toks_field, toks_get,
                                    toks_n_tokens, NULL};

/* ---- step timing ---- */

typedef struct timer {
    double t[256];
    int n;
} timer;
static cm_status timer_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    timer *c = self;
    if (ev == CM_EVENT_BATCH_END && c->n < 256) c->t[c->n++] = cm_clock_s();
    return CM_OK;
}
static void timer_free(void *self) {}
static const cm_callback_i TIMER_I = {CM_CALLBACK_ABI, "BenchTimer", timer_event, NULL, NULL, NULL, timer_free};

enum { NONE, ATTACHED, ACTIVE, ACTIVE_NOOPS, N_MODES };
static const char *const MODE_NAMES[N_MODES] = {"none", "attached", "active", "active_noops"};

typedef struct setup {
    const char *preset;
    int64_t batch, seq;
    int steps, warmup;
} setup;

/* Seconds per timed step of one run in `mode`. */
static double run_once(const setup *su, int mode, toks *data) {
    cm_gpt2_config gc;
    CHECK(cm_gpt2_config_preset(su->preset, &gc));
    gc.n_positions = su->seq > gc.n_positions ? su->seq : gc.n_positions;
    cm_rng rng = cm_rng_init(1, 0);
    cm_model *model;
    CHECK(cm_gpt2_new(&gc, &rng, &model));
    cm_dataset *ds;
    CHECK(cm_dataset_new(&TOKS_I, data, &ds));
    cm_dataloader_config lc = cm_dataloader_config_default();
    lc.batch_size = su->batch, lc.shuffle = false;
    cm_dataloader *dl;
    CHECK(cm_dataloader_new(ds, &lc, &dl));
    const int total = su->steps + su->warmup;
    timer tm = {{0}, 0};
    cm_callback_plugin cbs[2];
    int n_cbs = 0;
    char dir[64] = "";
    if (mode != NONE) {
        cm_profiler_config pc = cm_profiler_config_default();
        cm_trace_handler th;
        if (mode == ATTACHED) {
            pc.schedule.skip_first = 1 << 30;
        } else {
            snprintf(dir, sizeof dir, "/tmp/cm-bench-prof-XXXXXX");
            if (!mkdtemp(dir)) exit(1);
            cm_json_trace_handler_config jc = cm_json_trace_handler_config_default();
            jc.folder = dir;
            jc.overwrite = true;
            CHECK(cm_json_trace_handler_new(&jc, &th));
            pc.trace_handlers = &th, pc.n_trace_handlers = 1;
            pc.schedule = (cm_cyclic_schedule){su->warmup, 0, 0, su->steps, 1};
            pc.record_ops = mode == ACTIVE;
        }
        cm_profiler *prof;
        CHECK(cm_profiler_new(&pc, &prof, &cbs[n_cbs++]));
    }
    cbs[n_cbs++] = (cm_callback_plugin){&TIMER_I, &tm};
    cm_trainer_config cfg = cm_trainer_config_default();
    cfg.model = model;
    cfg.train_dataloader = dl;
    cfg.max_duration = cm_time_make(total + 1, CM_TIME_BATCH); /* +1: the batch that writes the trace */
    cfg.callbacks = cbs, cfg.n_callbacks = n_cbs;
    cfg.handle_signals = false;
    cm_trainer *tr;
    CHECK(cm_trainer_new(&cfg, &tr));
    CHECK(cm_trainer_fit(tr, NULL));
    /* from the end of the last warm-up step to the end of the step after the cycle (which starts
     * by writing the cycle's trace), per timed step */
    const double dt = (tm.t[total] - tm.t[su->warmup - 1]) / (double)su->steps;
    cm_trainer_free(tr);
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
    cm_model_free(model);
    if (dir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0) fprintf(stderr, "bench_profiler: could not remove %s\n", dir);
    }
    return dt;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    setup su = {"tiny", 8, 64, 8, 2};
    int reps = 5;
    const char *out = "bench/results/profiler.tsv";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--steps")) su.steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--preset")) su.preset = argv[i + 1];
        else if (!strcmp(argv[i], "--batch")) su.batch = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--seq")) su.seq = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--out")) out = argv[i + 1];
        else {
            fprintf(stderr, "bench_profiler: unknown option %s (see the comment at the top of bench/profiler.c)\n",
                    argv[i]);
            return 2;
        }
    }
    if (su.steps < 1 || su.steps > 200 || reps < 1) {
        fprintf(stderr, "bench_profiler: --steps 1..200 and --reps >= 1\n");
        return 2;
    }
    cm_log_set_level(CM_LOG_WARN);
    toks data = {0};
    data.seq = su.seq;
    data.n = su.batch * (su.steps + su.warmup + 2);
    data.ids = malloc(sizeof(int32_t) * (size_t)(data.n * su.seq + 1));
    cm_gpt2_config gc;
    CHECK(cm_gpt2_config_preset(su.preset, &gc));
    cm_rng r = cm_rng_init(7, 0);
    const size_t n_ids = (size_t)(data.n * su.seq + 1);
    int64_t *draw = malloc(sizeof(int64_t) * n_ids);
    cm_rng_randint(&r, draw, n_ids, 0, gc.vocab_size);
    for (size_t i = 0; i < n_ids; i++) data.ids[i] = (int32_t)draw[i];
    free(draw);
    data.fields[0] = (cm_field_desc){"input_ids", CM_DTYPE_I32, 1, {su.seq}};
    data.fields[1] = (cm_field_desc){"labels", CM_DTYPE_I32, 1, {su.seq}};

    double *t[N_MODES];
    for (int m = 0; m < N_MODES; m++) t[m] = calloc((size_t)reps, sizeof(double));
    run_once(&su, NONE, &data); /* warm the caches and the allocator */
    for (int rep = 0; rep < reps; rep++)
        for (int k = 0; k < N_MODES; k++) {
            const int m = (k + rep) % N_MODES; /* rotate who goes first */
            t[m][rep] = run_once(&su, m, &data);
        }
    double med[N_MODES];
    printf("profiler cost: GPT %s, batch %lld x %lld tokens, %d timed steps, %d reps, %d threads\n", su.preset,
           (long long)su.batch, (long long)su.seq, su.steps, reps, cm_num_threads());
    printf("%-14s %12s %10s\n", "mode", "ms/step", "vs none");
    for (int m = 0; m < N_MODES; m++) {
        qsort(t[m], (size_t)reps, sizeof(double), cmp_d);
        med[m] = t[m][reps / 2];
    }
    for (int m = 0; m < N_MODES; m++)
        printf("%-14s %12.3f %9.3fx\n", MODE_NAMES[m], med[m] * 1e3, med[m] / med[NONE]);
    double load[3] = {0};
    if (getloadavg(load, 3) < 0) load[0] = -1;
    printf("(load average %.2f: figures from a shared machine are rough)\n", load[0]);
    FILE *f = fopen(out, "a");
    if (f) {
        time_t now = time(NULL);
        char when[32];
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", localtime(&now));
        for (int m = 0; m < N_MODES; m++)
            fprintf(f, "%s\t%s\t%lld\t%lld\t%d\t%d\t%s\t%.6f\t%.4f\t%.2f\n", when, su.preset, (long long)su.batch,
                    (long long)su.seq, su.steps, cm_num_threads(), MODE_NAMES[m], med[m], med[m] / med[NONE], load[0]);
        fclose(f);
    }
    for (int m = 0; m < N_MODES; m++) free(t[m]);
    free(data.ids);
    return 0;
}
