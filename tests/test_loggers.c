/* The logger destinations driven by real fits on a tiny MLP (48 samples, batch 8: 6 batches per
 * epoch; eval 32 samples, batch 16: 2 batches): the progress bar's lines and terminal redraws,
 * the console blocks and hyperparameter YAML, the FileLogger's run folder (metrics.jsonl, log.txt,
 * loss.svg), folders shared by the loggers of a run, and the errors (unwritable folder at INIT,
 * bad configurations). */
#define _GNU_SOURCE /* nftw */
#include "cmtest.h"
#include "cmtrain.h"

#include <composer/loggers.h>

#include <cjson/cJSON.h>
#include <ftw.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers -------------------------------------------------------------------------------- */

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb, (void)flag, (void)f;
    return remove(p);
}

typedef struct {
    char dir[64];
} tmpdir;

static tmpdir tmp_make(void) {
    tmpdir t;
    snprintf(t.dir, sizeof t.dir, "/tmp/cm-loggers-XXXXXX");
    cr_assert_not_null(mkdtemp(t.dir), "mkdtemp failed");
    return t;
}

static void tmp_remove(tmpdir *t) { nftw(t->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static int count_of(const char *hay, const char *needle) {
    int c = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) c++;
    return c;
}

static bool matches(const char *re, const char *s) {
    regex_t r;
    cr_assert_eq(regcomp(&r, re, REG_EXTENDED | REG_NOSUB), 0, "bad regex %s", re);
    bool ok = regexec(&r, s, 0, NULL, 0) == 0;
    regfree(&r);
    return ok;
}

/* A constant clock: elapsed 00:00 and unknown rates, so bar lines are exact. */
static double zero_clock(void *data) {
    (void)data;
    return 0.0;
}

static cm_status noop_reduce(double *v, int n, void *data) {
    (void)v, (void)n, (void)data;
    return CM_OK;
}

typedef struct {
    cm_dataset *ds, *eds;
    cm_dataloader *dl, *edl;
    cm_model *model;
    cm_trainer *tr;
} rig;

typedef struct {
    const char *max_duration; /* default "2ep" */
    const char *run_name;     /* NULL = the trainer's generated name */
    bool no_eval;
    const char *eval_interval; /* default 1ep */
    int rank, world_size;
    int64_t eval_n;      /* eval samples (default 32) */
    int64_t eval_subset; /* eval_subset_num_batches (0 = the default, all) */
} rig_opts;

/* A trainer over the tiny data with `n` loggers (taken). */
static rig make(const rig_opts *o, const cm_logger_plugin *loggers, int n) {
    rig g = {0};
    g.ds = cmt_synth_dataset(48, 8, 3, false, NULL);
    g.dl = cmt_loader(g.ds, 8, false, 7);
    if (!o->no_eval) {
        g.eds = cmt_synth_dataset(o->eval_n ? o->eval_n : 32, 8, 3, false, NULL);
        g.edl = cmt_loader(g.eds, 16, true, 0);
    }
    g.model = cmt_mlp(8, 16, 3, 0.0f, 3);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = g.model;
    c.train_dataloader = g.dl;
    c.eval_dataloader = g.edl;
    cr_assert_eq(cm_time_parse(o->max_duration ? o->max_duration : "2ep", &c.max_duration), CM_OK);
    c.run_name = o->run_name;
    if (o->eval_subset) c.eval_subset_num_batches = o->eval_subset;
    if (o->eval_interval) cr_assert_eq(cm_time_parse(o->eval_interval, &c.eval_interval), CM_OK);
    c.loggers = loggers;
    c.n_loggers = n;
    if (o->world_size > 1) {
        c.dist.rank = o->rank;
        c.dist.world_size = o->world_size;
        c.dist.all_reduce_sum = noop_reduce;
    }
    cr_assert_eq(cm_trainer_new(&c, &g.tr), CM_OK, "%s", cm_last_error());
    return g;
}

static void unmake(rig *g) {
    cm_trainer_free(g->tr);
    cm_model_free(g->model);
    cm_dataloader_free(g->dl);
    cm_dataloader_free(g->edl);
    cm_dataset_free(g->ds);
    cm_dataset_free(g->eds);
}

static void fit(rig *g) { cr_assert_eq(cm_trainer_fit(g->tr, NULL), CM_OK, "%s", cm_last_error()); }

/* Runs a whole fit with one logger, returning what it printed to a memory stream (free()). */
typedef struct {
    char *text;
    size_t len;
    FILE *f;
} capture;

/* open_memstream keeps the addresses of text and len: the capture must stay where it is. */
static void capture_open(capture *c) {
    *c = (capture){0};
    c->f = open_memstream(&c->text, &c->len);
    cr_assert_not_null(c->f);
}

static void capture_close(capture *c) { fclose(c->f); }

/* ---- ProgressBarLogger ---------------------------------------------------------------------- */

Test(progress_bar_logger, lines_mode_prints_one_clean_line_per_interval) {
    capture cap;
    capture_open(&cap);
    cm_progress_bar_logger_config pc = cm_progress_bar_logger_config_default();
    pc.stream = cap.f;
    pc.line_every_frac = 0.5;
    pc.clock = zero_clock;
    cm_logger_plugin p;
    cr_assert_eq(cm_progress_bar_logger_new(&pc, &p), CM_OK);
    rig g = make(&(rig_opts){0}, &p, 1);
    fit(&g);
    unmake(&g);
    capture_close(&cap);
    cr_assert_null(strchr(cap.text, '\r'), "lines mode must not redraw:\n%s", cap.text);
    cr_assert_null(strchr(cap.text, '\x1b'), "lines mode must not use escape codes:\n%s", cap.text);
    /* per epoch: 3/6 and 6/6, then the eval bar at 1/2 and its final line with its metrics */
    const char *want_re[] = {
        "^train Epoch 0:  50% 3/6 \\[00:00<\\?, \\?ba/s, loss/train/total=[0-9]\\.[0-9]{4}\\]$",
        "^train Epoch 0: 100% 6/6 \\[00:00<00:00, \\?ba/s, loss/train/total=[0-9]\\.[0-9]{4}\\]$",
        "^eval:  50% 1/2 \\[00:00<\\?, \\?ba/s\\]$",
        "^eval: 100% 2/2 \\[00:00<00:00, \\?ba/s, metrics/eval/[A-Za-z]+=[0-9]\\.[0-9]{4}.*\\]$",
        "^train Epoch 1:  50% 3/6 \\[00:00<\\?, \\?ba/s, loss/train/total=[0-9]\\.[0-9]{4}\\]$",
        "^train Epoch 1: 100% 6/6 \\[00:00<00:00, \\?ba/s, loss/train/total=[0-9]\\.[0-9]{4}\\]$",
        "^eval:  50% 1/2 \\[00:00<\\?, \\?ba/s\\]$",
        "^eval: 100% 2/2 \\[00:00<00:00, \\?ba/s, metrics/eval/[A-Za-z]+=[0-9]\\.[0-9]{4}.*\\]$",
    };
    int i = 0;
    for (char *line = strtok(cap.text, "\n"); line; line = strtok(NULL, "\n"), i++) {
        cr_assert_lt(i, 8, "more lines than expected, extra: '%s'", line);
        cr_assert(matches(want_re[i], line), "line %d '%s' does not match %s", i, line, want_re[i]);
    }
    cr_assert_eq(i, 8, "got %d lines, want 8", i);
    free(cap.text);
}

/* The eval bar's total is the batches the evaluation runs: eval_subset_num_batches of them when
 * that is fewer than the loader has (here 2 of 4), not the loader's length. */
Test(progress_bar_logger, eval_bar_total_counts_eval_subset_num_batches) {
    capture cap;
    capture_open(&cap);
    cm_progress_bar_logger_config pc = cm_progress_bar_logger_config_default();
    pc.stream = cap.f;
    pc.mode = CM_PROGRESS_LINES;
    pc.line_every_frac = 0.5;
    pc.clock = zero_clock;
    cm_logger_plugin p;
    cr_assert_eq(cm_progress_bar_logger_new(&pc, &p), CM_OK);
    rig g = make(&(rig_opts){.max_duration = "1ep", .eval_n = 64, .eval_subset = 2}, &p, 1);
    fit(&g);
    cr_assert_eq(cm_state_dataloader_len(cm_trainer_state(g.tr)), 6, "after eval the train loop's length is back");
    unmake(&g);
    capture_close(&cap);
    cr_assert(matches("\neval: 100% 2/2 \\[", cap.text), "the eval bar ends full at 2/2:\n%s", cap.text);
    cr_assert_null(strstr(cap.text, "/4 "), "no bar counts the loader's 4 batches:\n%s", cap.text);
    free(cap.text);
}

Test(progress_bar_logger, tty_mode_redraws_the_bar_in_place) {
    capture cap;
    capture_open(&cap);
    cm_progress_bar_logger_config pc = cm_progress_bar_logger_config_default();
    pc.stream = cap.f;
    pc.mode = CM_PROGRESS_TTY;
    pc.width = 120;
    pc.clock = zero_clock;
    cm_logger_plugin p;
    cr_assert_eq(cm_progress_bar_logger_new(&pc, &p), CM_OK);
    rig g = make(&(rig_opts){.no_eval = true}, &p, 1);
    fit(&g);
    unmake(&g);
    capture_close(&cap);
    cr_assert_gt(count_of(cap.text, "\r"), 2, "a terminal bar redraws with \\r:\n%s", cap.text);
    cr_assert_not_null(strstr(cap.text, "train Epoch 0: 100%|"), "%s", cap.text);
    cr_assert_not_null(strstr(cap.text, "| 6/6 [00:00<00:00, ?ba/s, loss/train/total="), "%s", cap.text);
    cr_assert_not_null(strstr(cap.text, "█"), "the bar has full blocks:\n%s", cap.text);
    cr_assert_not_null(strstr(cap.text, "train Epoch 1:"), "%s", cap.text);
    /* each finished epoch bar stays on screen: two lines end with a newline */
    cr_assert_eq(count_of(cap.text, "\n"), 2, "%s", cap.text);
    free(cap.text);
}

Test(progress_bar_logger, max_duration_in_batches_sets_the_remaining_total) {
    capture cap;
    capture_open(&cap);
    cm_progress_bar_logger_config pc = cm_progress_bar_logger_config_default();
    pc.stream = cap.f;
    pc.line_every_frac = 0; /* only the final line of each bar */
    pc.clock = zero_clock;
    cm_logger_plugin p;
    cr_assert_eq(cm_progress_bar_logger_new(&pc, &p), CM_OK);
    rig g = make(&(rig_opts){.max_duration = "4ba", .no_eval = true}, &p, 1);
    fit(&g); /* 4 of epoch 0's 6 batches */
    cm_fit_opts fo = cm_fit_opts_default();
    cr_assert_eq(cm_time_parse("4ba", &fo.duration), CM_OK);
    cr_assert_eq(cm_trainer_fit(g.tr, &fo), CM_OK, "%s", cm_last_error()); /* 2 more in epoch 0, 2 in epoch 1 */
    unmake(&g);
    capture_close(&cap);
    const char *want = "train Epoch 0: 100% 4/4 ";
    cr_assert(!strncmp(cap.text, want, strlen(want)), "first bar: want '%s...', got:\n%s", want, cap.text);
    cr_assert_not_null(strstr(cap.text, "\ntrain Epoch 0: 100% 2/2 "), "the resumed epoch counts what is left:\n%s",
                       cap.text);
    cr_assert_not_null(strstr(cap.text, "\ntrain Epoch 1: 100% 2/2 "), "the run ends after 2 batches:\n%s", cap.text);
    cr_assert_eq(count_of(cap.text, "\n"), 3, "%s", cap.text);
    free(cap.text);
}

Test(progress_bar_logger, eval_mid_epoch_on_a_terminal_starts_a_new_line) {
    capture cap;
    capture_open(&cap);
    cm_progress_bar_logger_config pc = cm_progress_bar_logger_config_default();
    pc.stream = cap.f;
    pc.mode = CM_PROGRESS_TTY;
    pc.width = 100;
    pc.clock = zero_clock;
    cm_logger_plugin p;
    cr_assert_eq(cm_progress_bar_logger_new(&pc, &p), CM_OK);
    rig g = make(&(rig_opts){.max_duration = "4ba", .eval_interval = "2ba"}, &p, 1);
    fit(&g); /* eval at batch 2 with the train bar (of 4) open, and at batch 4 after it is done */
    unmake(&g);
    capture_close(&cap);
    const char *ev = strstr(cap.text, "\n\reval:   0%|");
    cr_assert_not_null(ev, "the eval bar starts on a line of its own:\n%s", cap.text);
    cr_assert_not_null(strstr(cap.text, "| 2/4 [00:00<?, ?ba/s, loss/train/total="), "%s", cap.text);
    cr_assert(strstr(ev, "\rtrain Epoch 0: 100%|"), "the train bar continues under the eval bar:\n%s", cap.text);
    cr_assert_eq(count_of(cap.text, "eval: 100%|"), 2 * 2, "two evals, each drawn full then with metrics:\n%s",
                 cap.text);
    cr_assert_eq(count_of(cap.text, "\n"), 4, "train (interrupted), eval, train, eval:\n%s", cap.text);
    free(cap.text);
}

Test(progress_bar_logger, ranks_other_than_zero_draw_nothing) {
    capture cap;
    capture_open(&cap);
    cm_progress_bar_logger_config pc = cm_progress_bar_logger_config_default();
    pc.stream = cap.f;
    cm_logger_plugin p;
    cr_assert_eq(cm_progress_bar_logger_new(&pc, &p), CM_OK);
    rig g = make(&(rig_opts){.max_duration = "2ba", .rank = 1, .world_size = 2}, &p, 1);
    fit(&g);
    unmake(&g);
    capture_close(&cap);
    cr_assert_eq(cap.len, 0, "rank 1 printed:\n%s", cap.text);
    free(cap.text);
}

Test(progress_bar_logger, traces_are_printed_only_when_asked) {
    for (int on = 0; on < 2; on++) {
        capture cap;
    capture_open(&cap);
        cm_progress_bar_logger_config pc = cm_progress_bar_logger_config_default();
        pc.stream = cap.f;
        pc.log_traces = on;
        cm_logger_plugin p;
        cr_assert_eq(cm_progress_bar_logger_new(&pc, &p), CM_OK);
        rig g = make(&(rig_opts){.max_duration = "1ba", .no_eval = true}, &p, 1);
        cr_assert_eq(cm_logger_log_metric(cm_trainer_logger(g.tr), "traces/GradientClipping", 1.0), CM_OK);
        unmake(&g);
        capture_close(&cap);
        const char *want = "[trace]: traces/GradientClipping: 1.0000\n";
        if (on) cr_assert_not_null(strstr(cap.text, want), "log_traces on: want '%s' in:\n%s", want, cap.text);
        else cr_assert_null(strstr(cap.text, "traces/"), "log_traces off:\n%s", cap.text);
        free(cap.text);
    }
}

Test(progress_bar_logger, rejects_bad_configurations) {
    cm_logger_plugin p;
    cm_progress_bar_logger_config pc = cm_progress_bar_logger_config_default();
    pc.width = -1;
    cr_assert_eq(cm_progress_bar_logger_new(&pc, &p), CM_ERR_INVALID_ARG);
    cr_assert_not_null(strstr(cm_last_error(), "width"), "%s", cm_last_error());
    pc = cm_progress_bar_logger_config_default();
    pc.line_every_frac = NAN;
    cr_assert_eq(cm_progress_bar_logger_new(&pc, &p), CM_ERR_INVALID_ARG);
    pc = cm_progress_bar_logger_config_default();
    pc.mode = (cm_progress_mode)7;
    cr_assert_eq(cm_progress_bar_logger_new(&pc, &p), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_progress_bar_logger_new(NULL, &p), CM_ERR_INVALID_ARG);
}

/* ---- ConsoleLogger -------------------------------------------------------------------------- */

static char *console_run(const char *interval, const rig_opts *o) {
    capture cap;
    capture_open(&cap);
    cm_console_logger_config cc = cm_console_logger_config_default();
    cc.stream = cap.f;
    if (interval) cr_assert_eq(cm_time_parse(interval, &cc.log_interval), CM_OK);
    cm_logger_plugin p;
    cr_assert_eq(cm_console_logger_new(&cc, &p), CM_OK, "%s", cm_last_error());
    rig g = make(o, &p, 1);
    fit(&g);
    unmake(&g);
    capture_close(&cap);
    return cap.text;
}

Test(console_logger, prints_hparams_then_a_block_per_batch_and_per_eval) {
    char *out = console_run(NULL, &(rig_opts){.run_name = "console-run"});
    const char *head = "******************************\nConfig:\n";
    cr_assert(!strncmp(out, head, strlen(head)), "the output starts with the config block:\n%s", out);
    /* YAML, keys sorted; strings that would read as numbers are quoted */
    const char *hp = "deterministic_mode: false\ndevice_train_microbatch_size: '0'\nmax_duration: 2ep\n"
                     "num_threads: ";
    cr_assert_not_null(strstr(out, hp), "want\n%s\nin:\n%s", hp, out);
    cr_assert_not_null(strstr(out, "\nprecision: fp32\nrun_name: console-run\nscale_schedule_ratio: 1\nseed: 42\n"
                                   "world_size: 1\n******************************\n"),
                       "%s", out);
    cr_assert_eq(count_of(out, "Config:"), 1, "the config is printed once");
    cr_assert_eq(count_of(out, "[batch="), 12, "one block per batch:\n%s", out);
    cr_assert_not_null(strstr(out, "\n[batch=1/12]:\n\t Train time/epoch: 0\n\t Train time/batch: 0\n"), "%s", out);
    cr_assert(matches("\\[batch=12/12\\]:\n(\t [^\n]*\n)*\t Train loss/train/total: [0-9]\\.[0-9]{4}\n", out), "%s",
              out);
    cr_assert_eq(count_of(out, "[Eval batch=2/2]:\n"), 2, "one eval block per epoch:\n%s", out);
    cr_assert(matches("\\[Eval batch=2/2\\]:\n\t Eval metrics/eval/[A-Za-z]+: [0-9]\\.[0-9]{4}\n", out), "%s", out);
    /* eval metrics stay out of the train blocks */
    cr_assert_null(strstr(out, "Train metrics/eval/"), "%s", out);
    free(out);
}

Test(console_logger, epoch_interval_prints_one_block_per_epoch) {
    char *out = console_run("1ep", &(rig_opts){.no_eval = true});
    cr_assert_eq(count_of(out, "[batch="), 0, "%s", out);
    cr_assert_not_null(strstr(out, "[epoch=1/2]:\n"), "%s", out);
    cr_assert_not_null(strstr(out, "[epoch=2/2]:\n"), "%s", out);
    cr_assert_eq(count_of(out, "[epoch="), 2, "%s", out);
    free(out);
}

Test(console_logger, batch_interval_logs_first_every_nth_and_last_batch) {
    char *out = console_run("5ba", &(rig_opts){.no_eval = true});
    cr_assert_eq(count_of(out, "[batch="), 4, "batches 1, 5, 10 and the end (12):\n%s", out);
    cr_assert_not_null(strstr(out, "[batch=1/12]:"), "%s", out);
    cr_assert_not_null(strstr(out, "[batch=5/12]:"), "%s", out);
    cr_assert_not_null(strstr(out, "[batch=10/12]:"), "%s", out);
    cr_assert_not_null(strstr(out, "[batch=12/12]:"), "%s", out);
    free(out);
}

Test(console_logger, rejects_an_interval_not_in_batches_or_epochs) {
    cm_console_logger_config cc = cm_console_logger_config_default();
    cm_logger_plugin p;
    cr_assert_eq(cm_time_parse("64sp", &cc.log_interval), CM_OK);
    cr_assert_eq(cm_console_logger_new(&cc, &p), CM_ERR_INVALID_ARG);
    cr_assert_not_null(strstr(cm_last_error(), "'64sp'"), "%s", cm_last_error());
    cc.log_interval = cm_time_make(0, CM_TIME_BATCH);
    cr_assert_eq(cm_console_logger_new(&cc, &p), CM_ERR_INVALID_ARG);
    cr_assert_not_null(strstr(cm_last_error(), "positive"), "%s", cm_last_error());
}

/* ---- FileLogger ----------------------------------------------------------------------------- */

static char *path_in(const char *dir, const char *file) {
    char *p = malloc(strlen(dir) + strlen(file) + 2);
    sprintf(p, "%s/%s", dir, file);
    return p;
}

Test(file_logger, writes_metrics_jsonl_log_and_loss_plot_in_the_run_folder) {
    tmpdir t = tmp_make();
    cm_file_logger_config fc = cm_file_logger_config_default();
    fc.root = t.dir;
    cm_logger_plugin p;
    cr_assert_eq(cm_file_logger_new(&fc, &p), CM_OK);
    cm_logger_plugin keep = p;
    rig g = make(&(rig_opts){.run_name = "r1"}, &p, 1);
    char *dir = path_in(t.dir, "r1");
    cr_assert_str_eq(cm_file_logger_folder(&keep), dir);
    fit(&g);
    unmake(&g);

    char *mpath = path_in(dir, "metrics.jsonl");
    char *text = cmt_slurp(mpath, NULL);
    cr_assert_not_null(text, "no %s", mpath);
    int n_lines = 0, n_loss = 0, n_eval = 0;
    int64_t prev_batch = -1;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), n_lines++) {
        cJSON *o = cJSON_Parse(line);
        cr_assert_not_null(o, "line %d is not JSON: %s", n_lines + 1, line);
        cJSON *k0 = o->child, *k1 = k0 ? k0->next : NULL;
        cr_assert(k0 && !strcmp(k0->string, "batch") && cJSON_IsNumber(k0), "line %d: %s", n_lines + 1, line);
        cr_assert(k1 && !strcmp(k1->string, "epoch") && cJSON_IsNumber(k1), "line %d: %s", n_lines + 1, line);
        cr_assert(k1->next, "line %d has no metric: %s", n_lines + 1, line);
        cJSON *loss = cJSON_GetObjectItemCaseSensitive(o, "loss/train/total");
        if (loss) {
            cr_assert(cJSON_IsNumber(loss) && isfinite(loss->valuedouble), "%s", line);
            cr_assert_eq((int64_t)k0->valuedouble, prev_batch + 1, "loss lines batch by batch: %s", line);
            prev_batch = (int64_t)k0->valuedouble;
            n_loss++;
        }
        if (cJSON_GetObjectItemCaseSensitive(o, "metrics/eval/MulticlassAccuracy")) n_eval++;
        cJSON_Delete(o);
    }
    cr_assert_eq(n_loss, 12, "one loss line per batch");
    cr_assert_eq(n_eval, 2, "eval metrics once per epoch");
    cr_assert_gt(n_lines, 24);
    free(text);

    char *lpath = path_in(dir, "log.txt");
    text = cmt_slurp(lpath, NULL);
    cr_assert_not_null(text, "no %s", lpath);
    cr_assert_not_null(strstr(text, "Config:\n"), "%s", text);
    cr_assert_not_null(strstr(text, "run_name: r1\n"), "%s", text);
    cr_assert_eq(count_of(text, "[batch="), 12, "%s", text);
    cr_assert_eq(count_of(text, "[Eval batch=2/2]:"), 2, "%s", text);
    free(text);

    char *spath = path_in(dir, "loss.svg");
    text = cmt_slurp(spath, NULL);
    cr_assert_not_null(text, "no %s", spath);
    cr_assert_not_null(strstr(text, "<svg"), "%.200s", text);
    size_t len = strlen(text);
    cr_assert(len > 7 && strstr(text + len - 8, "</svg>"), "the SVG is complete: ...%s", text + len - 20);
    cr_assert_eq(count_of(text, "<svg"), count_of(text, "</svg>"));
    cr_assert_not_null(strstr(text, "loss/train/total"), "train loss in the legend");
    cr_assert_not_null(strstr(text, "metrics/eval/CrossEntropy"), "eval loss in the legend");
    free(text);
    free(mpath), free(lpath), free(spath), free(dir);
    tmp_remove(&t);
}

Test(file_logger, loggers_of_one_run_share_the_generated_run_folder) {
    tmpdir t = tmp_make();
    cm_file_logger_config a = cm_file_logger_config_default(), b = cm_file_logger_config_default();
    a.root = b.root = t.dir;
    a.text_log = false;     /* one writes the metrics (and the plot) */
    b.metrics_file = false; /* the other the text log */
    cm_logger_plugin p[2];
    cr_assert_eq(cm_file_logger_new(&a, &p[0]), CM_OK);
    cr_assert_eq(cm_file_logger_new(&b, &p[1]), CM_OK);
    cm_logger_plugin keep[2] = {p[0], p[1]};
    rig g = make(&(rig_opts){.max_duration = "2ba", .no_eval = true}, p, 2);
    const char *run = cm_state_run_name(cm_trainer_state(g.tr));
    cr_assert(run && run[0], "the trainer names the run");
    const char *d0 = cm_file_logger_folder(&keep[0]), *d1 = cm_file_logger_folder(&keep[1]);
    cr_assert(d0 && d1);
    cr_assert_str_eq(d0, d1);
    char *want = path_in(t.dir, run);
    cr_assert_str_eq(d0, want);
    /* a program puts the resolved configuration beside them */
    cm_run_folder_config rc = {.root = t.dir, .run_name = run};
    char *same;
    cr_assert_eq(cm_run_folder_setup(&rc, &same), CM_OK, "%s", cm_last_error());
    cr_assert_str_eq(same, d0);
    cr_assert_eq(cm_run_folder_write_text(same, CM_RUN_FILE_CONFIG, "seed: 42\n"), CM_OK, "%s", cm_last_error());
    fit(&g);
    unmake(&g);
    const char *files[] = {"metrics.jsonl", "log.txt", "loss.svg", "config.yaml"};
    for (int i = 0; i < 4; i++) {
        char *f = path_in(want, files[i]);
        cr_assert(cmt_exists(f), "missing %s", f);
        free(f);
    }
    cm_free(same);
    free(want);
    tmp_remove(&t);
}

Test(file_logger, unwritable_folder_fails_at_init_naming_the_path) {
    tmpdir t = tmp_make();
    char *blocker = path_in(t.dir, "afile");
    FILE *f = fopen(blocker, "w");
    cr_assert_not_null(f);
    fclose(f);
    for (int explicit_folder = 0; explicit_folder < 2; explicit_folder++) {
        cm_file_logger_config fc = cm_file_logger_config_default();
        char *folder = path_in(blocker, "run");
        if (explicit_folder) fc.folder = folder;
        else fc.root = blocker;
        cm_logger_plugin p;
        cr_assert_eq(cm_file_logger_new(&fc, &p), CM_OK);
        cm_dataset *ds = cmt_synth_dataset(16, 8, 3, false, NULL);
        cm_dataloader *dl = cmt_loader(ds, 8, false, 7);
        cm_model *m = cmt_mlp(8, 16, 3, 0.0f, 3);
        cm_trainer_config c = cm_trainer_config_default();
        c.model = m;
        c.train_dataloader = dl;
        c.run_name = "run";
        c.loggers = &p;
        c.n_loggers = 1;
        cm_trainer *tr = NULL;
        cr_assert_eq(cm_trainer_new(&c, &tr), CM_ERR_IO, "%s", cm_last_error());
        const char *msg = cm_last_error();
        cr_assert_not_null(strstr(msg, "FileLogger"), "%s", msg);
        cr_assert_not_null(strstr(msg, "INIT"), "%s", msg);
        cr_assert_not_null(strstr(msg, blocker), "the message names the path: %s", msg);
        cm_logger_plugin_free(p); /* not taken on failure */
        cm_model_free(m);
        cm_dataloader_free(dl);
        cm_dataset_free(ds);
        free(folder);
    }
    free(blocker);
    tmp_remove(&t);
}

/* A callback that fails at the BATCH_END of batch `at` (a crash after a checkpoint). */
static cm_status fail_at_run(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    (void)lg;
    if (ev == CM_EVENT_BATCH_END && cm_state_timestamp(st)->batch == *(int64_t *)self)
        return cm_set_error(CM_ERR_IO, "injected failure after batch %lld", (long long)*(int64_t *)self);
    return CM_OK;
}
static const cm_callback_i fail_at_vt = {CM_CALLBACK_ABI, "FailAt", fail_at_run, NULL, NULL, NULL, NULL};

/* One fit of a resumable run: FileLogger into `dir`, checkpoints every 2 batches into `ck`. */
static cm_status resumable_fit(const char *dir, const char *ck, bool resume, int64_t *fail_at) {
    cm_file_logger_config fc = cm_file_logger_config_default();
    fc.folder = dir;
    fc.append = resume;
    fc.plot = false;
    cm_logger_plugin p;
    cr_assert_eq(cm_file_logger_new(&fc, &p), CM_OK);
    cm_callback_plugin cb = {&fail_at_vt, fail_at};
    cm_dataset *ds = cmt_synth_dataset(48, 8, 3, false, NULL);
    cm_dataloader *dl = cmt_loader(ds, 8, false, 7);
    cm_model *m = cmt_mlp(8, 16, 3, 0.0f, 3);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = m;
    c.train_dataloader = dl;
    c.run_name = "resumable";
    cr_assert_eq(cm_time_parse("5ba", &c.max_duration), CM_OK);
    cr_assert_eq(cm_time_parse("2ba", &c.save_interval), CM_OK);
    c.save_folder = ck;
    c.autoresume = resume;
    c.loggers = &p, c.n_loggers = 1;
    c.callbacks = &cb, c.n_callbacks = fail_at ? 1 : 0;
    cm_trainer *tr;
    cr_assert_eq(cm_trainer_new(&c, &tr), CM_OK, "%s", cm_last_error());
    cm_status s = cm_trainer_fit(tr, NULL);
    cm_trainer_free(tr);
    cm_model_free(m);
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
    return s;
}

/* A run killed after its checkpoint at batch 2 had logged batch 3 and part of 4; the resumed run
 * trains batches 3 to 5 again. metrics.jsonl must hold each batch's rows once: one train loss
 * and one time/batch per batch, in order. */
Test(file_logger, autoresume_keeps_one_set_of_rows_per_batch) {
    tmpdir t = tmp_make();
    char dir[128], ck[128], path[160];
    snprintf(dir, sizeof dir, "%s/run", t.dir);
    snprintf(ck, sizeof ck, "%s/ck", t.dir);
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    int64_t fail_at = 4;
    cr_assert_eq(resumable_fit(dir, ck, false, &fail_at), CM_ERR_IO, "the first run stops at batch 4");
    char *before = cmt_slurp(path, NULL);
    cr_assert_eq(count_of(before, "\"loss/train/total\""), 4, "the interrupted run logged 4 losses:\n%s", before);
    free(before);
    cr_assert_eq(resumable_fit(dir, ck, true, NULL), CM_OK, "%s", cm_last_error());
    char *text = cmt_slurp(path, NULL);
    int64_t want = 0;
    int n_loss = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        cr_assert_not_null(o, "bad line %s", line);
        const cJSON *tb = cJSON_GetObjectItemCaseSensitive(o, "time/batch");
        if (tb) {
            cr_assert_eq((int64_t)tb->valuedouble, want, "time/batch %g, want %lld (rows repeated or missing)",
                         tb->valuedouble, (long long)want);
            want++;
        }
        n_loss += cJSON_GetObjectItemCaseSensitive(o, "loss/train/total") != NULL;
        cJSON_Delete(o);
    }
    cr_assert_eq(want, 5, "time/batch rows for batches 0..4, got %lld", (long long)want);
    cr_assert_eq(n_loss, 5, "one train loss per batch, got %d", n_loss);
    free(text);
    tmp_remove(&t);
}

Test(file_logger, append_continues_the_files_and_default_truncates) {
    tmpdir t = tmp_make();
    int lines[3];
    for (int run = 0; run < 3; run++) {
        cm_file_logger_config fc = cm_file_logger_config_default();
        fc.root = t.dir;
        fc.append = run == 2;
        cm_logger_plugin p;
        cr_assert_eq(cm_file_logger_new(&fc, &p), CM_OK);
        rig g = make(&(rig_opts){.max_duration = "2ba", .no_eval = true, .run_name = "again"}, &p, 1);
        fit(&g);
        unmake(&g);
        char *dir = path_in(t.dir, "again"), *m = path_in(dir, "metrics.jsonl");
        char *text = cmt_slurp(m, NULL);
        lines[run] = count_of(text, "\n");
        free(text), free(m), free(dir);
    }
    cr_assert_gt(lines[0], 0);
    cr_assert_eq(lines[1], lines[0], "a new run truncates: %d vs %d", lines[1], lines[0]);
    cr_assert_eq(lines[2], 2 * lines[0], "append keeps the earlier lines: %d vs 2 x %d", lines[2], lines[0]);
    tmp_remove(&t);
}

Test(file_logger, a_plot_with_no_matching_metric_warns_without_failing) {
    tmpdir t = tmp_make();
    cm_file_logger_config fc = cm_file_logger_config_default();
    fc.root = t.dir;
    const char *pats[] = {"nothing/like/this*"};
    fc.plot_patterns = pats;
    fc.n_plot_patterns = 1;
    cm_logger_plugin p;
    cr_assert_eq(cm_file_logger_new(&fc, &p), CM_OK);
    rig g = make(&(rig_opts){.max_duration = "2ba", .no_eval = true, .run_name = "noplot"}, &p, 1);
    fit(&g);
    cr_assert_eq(cm_trainer_close(g.tr), CM_OK, "%s", cm_last_error());
    unmake(&g);
    char *dir = path_in(t.dir, "noplot"), *svg = path_in(dir, "loss.svg"), *m = path_in(dir, "metrics.jsonl");
    cr_assert(!cmt_exists(svg), "no plot without a matching metric");
    cr_assert(cmt_exists(m));
    free(dir), free(svg), free(m);
    tmp_remove(&t);
}

/* The engine by hand: duplicate names keep the last value, reserved names and traces are left out. */
Test(file_logger, one_line_per_log_call_with_batch_and_epoch_first) {
    tmpdir t = tmp_make();
    cm_file_logger_config fc = cm_file_logger_config_default();
    fc.folder = t.dir;
    fc.plot = false;
    cm_logger_plugin p;
    cr_assert_eq(cm_file_logger_new(&fc, &p), CM_OK);
    cm_state *st;
    cm_engine *e;
    cr_assert_eq(cm_state_new(&st), CM_OK);
    cr_assert_eq(cm_engine_new(st, &e), CM_OK);
    cr_assert_eq(cm_engine_add_logger(e, p), CM_OK);
    cr_assert_eq(cm_engine_run_event(e, CM_EVENT_INIT), CM_OK, "%s", cm_last_error());
    cm_logger *lg = cm_engine_logger(e);
    cm_metric_value v[] = {{"a", 1.0}, {"b", 0.1}, {"a", 2.5}, {"batch", 3}, {"traces/X", 1}};
    cr_assert_eq(cm_logger_log_metrics(lg, v, 5), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_logger_log_metric(lg, "loss/train/total", NAN), CM_OK);
    cr_assert_eq(cm_logger_log_metric(lg, "traces/only", 1), CM_OK); /* nothing left: no line */
    cr_assert_eq(cm_engine_close(e), CM_OK, "%s", cm_last_error());
    cm_engine_free(e);
    cm_state_free(st);
    char *m = path_in(t.dir, "metrics.jsonl");
    char *text = cmt_slurp(m, NULL);
    const char *want = "{\"batch\": 0, \"epoch\": 0, \"a\": 2.5, \"b\": 0.1}\n"
                       "{\"batch\": 0, \"epoch\": 0, \"loss/train/total\": \"NaN\"}\n";
    cr_assert_str_eq(text, want);
    free(text), free(m);
    tmp_remove(&t);
}

Test(file_logger, rejects_bad_configurations) {
    cm_logger_plugin p;
    cm_file_logger_config fc = cm_file_logger_config_default();
    fc.flush_interval = 0;
    cr_assert_eq(cm_file_logger_new(&fc, &p), CM_ERR_INVALID_ARG);
    cr_assert_not_null(strstr(cm_last_error(), "flush_interval"), "%s", cm_last_error());
    fc = cm_file_logger_config_default();
    fc.n_plot_patterns = 2;
    cr_assert_eq(cm_file_logger_new(&fc, &p), CM_ERR_INVALID_ARG);
    fc = cm_file_logger_config_default();
    fc.log_interval = cm_time_make(3, CM_TIME_TOKEN);
    cr_assert_eq(cm_file_logger_new(&fc, &p), CM_ERR_INVALID_ARG);
    fc = cm_file_logger_config_default();
    fc.folder = "";
    cr_assert_eq(cm_file_logger_new(&fc, &p), CM_ERR_INVALID_ARG);
    cr_assert_null(cm_file_logger_folder(NULL));
}

/* ---- run folder ----------------------------------------------------------------------------- */

Test(run_folder, setup_creates_the_folder_and_write_text_replaces_files) {
    tmpdir t = tmp_make();
    char *root = path_in(t.dir, "nested/runs");
    cm_run_folder_config rc = {.root = root, .run_name = "exp1"};
    char *dir;
    cr_assert_eq(cm_run_folder_setup(&rc, &dir), CM_OK, "%s", cm_last_error());
    char *want = path_in(root, "exp1");
    cr_assert_str_eq(dir, want);
    cr_assert(cmt_exists(dir));
    cr_assert_eq(cm_run_folder_write_text(dir, "config.yaml", "a: 1\n"), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_run_folder_write_text(dir, "config.yaml", "a: 2\n"), CM_OK, "%s", cm_last_error());
    char *f = path_in(dir, "config.yaml");
    char *text = cmt_slurp(f, NULL);
    cr_assert_str_eq(text, "a: 2\n");
    free(text), free(f);
    cr_assert_eq(cm_run_folder_write_text(dir, "sub/x.yaml", "x"), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_run_folder_write_text(dir, "..", "x"), CM_ERR_INVALID_ARG);
    char *missing = path_in(t.dir, "missing");
    cr_assert_eq(cm_run_folder_write_text(missing, "config.yaml", "x"), CM_ERR_IO);
    cr_assert_not_null(strstr(cm_last_error(), missing), "%s", cm_last_error());
    cm_free(dir);

    rc.run_name = "bad/name";
    cr_assert_eq(cm_run_folder_setup(&rc, &dir), CM_ERR_INVALID_ARG);
    rc.run_name = NULL;
    cr_assert_eq(cm_run_folder_setup(&rc, &dir), CM_OK, "%s", cm_last_error());
    const char *name = strrchr(dir, '/') + 1;
    cr_assert(matches("^[0-9]+-[a-z]+-[a-z]+$", name), "generated name '%s'", name);
    cm_free(dir);
    free(missing), free(want), free(root);
    tmp_remove(&t);
}

/* The engine by hand: hyperparameters as YAML that reads back as the values logged. */
Test(console_logger, hyperparameters_are_yaml_quoted_where_needed_and_sorted) {
    capture cap;
    capture_open(&cap);
    cm_console_logger_config cc = cm_console_logger_config_default();
    cc.stream = cap.f;
    cm_logger_plugin p;
    cr_assert_eq(cm_console_logger_new(&cc, &p), CM_OK);
    cm_state *st;
    cm_engine *e;
    cr_assert_eq(cm_state_new(&st), CM_OK);
    cr_assert_eq(cm_engine_new(st, &e), CM_OK);
    cr_assert_eq(cm_engine_add_logger(e, p), CM_OK);
    cr_assert_eq(cm_engine_run_event(e, CM_EVENT_INIT), CM_OK, "%s", cm_last_error());
    cm_hparam h[] = {
        {"s_plain", CM_HPARAM_STRING, 0, "hello world"}, {"s_empty", CM_HPARAM_STRING, 0, ""},
        {"s_bool", CM_HPARAM_STRING, 0, "yes"},          {"s_num", CM_HPARAM_STRING, 0, "1e-3"},
        {"s_colon", CM_HPARAM_STRING, 0, "a: b"},        {"s_quote", CM_HPARAM_STRING, 0, "'x' it's"},
        {"s_newline", CM_HPARAM_STRING, 0, "a\nb\"c"},   {"n_frac", CM_HPARAM_NUMBER, 0.1, NULL},
        {"n_int", CM_HPARAM_NUMBER, 3, NULL},            {"n_nan", CM_HPARAM_NUMBER, NAN, NULL},
        {"b_true", CM_HPARAM_BOOL, 1, NULL},             {"n_int", CM_HPARAM_NUMBER, 4, NULL},
    };
    cr_assert_eq(cm_logger_log_hyperparameters(cm_engine_logger(e), h, 12), CM_OK);
    cr_assert_eq(cm_engine_run_event(e, CM_EVENT_FIT_START), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_engine_run_event(e, CM_EVENT_FIT_START), CM_OK, "%s", cm_last_error()); /* printed once */
    cr_assert_eq(cm_engine_close(e), CM_OK);
    cm_engine_free(e);
    cm_state_free(st);
    capture_close(&cap);
    const char *want = "******************************\n"
                       "Config:\n"
                       "b_true: true\n"
                       "n_frac: 0.1\n"
                       "n_int: 4\n"
                       "n_nan: .nan\n"
                       "s_bool: 'yes'\n"
                       "s_colon: 'a: b'\n"
                       "s_empty: ''\n"
                       "s_newline: \"a\\nb\\\"c\"\n"
                       "s_num: '1e-3'\n"
                       "s_plain: hello world\n"
                       "s_quote: '''x'' it''s'\n"
                       "******************************\n";
    cr_assert_str_eq(cap.text, want);
    free(cap.text);
}

/* Every allocation of a FileLogger + ConsoleLogger run failing in turn: an error or success each
 * time, never a crash (and, under the sanitizer build, never a leak). */
static bool oom_scenario(const char *dir, FILE *out) {
    cm_file_logger_config fc = cm_file_logger_config_default();
    fc.folder = dir;
    cm_console_logger_config cc = cm_console_logger_config_default();
    cc.stream = out;
    cm_logger_plugin fp = {0}, cp = {0};
    cm_state *st = NULL;
    cm_engine *e = NULL;
    bool ok = false;
    if (cm_file_logger_new(&fc, &fp)) goto done;
    if (cm_console_logger_new(&cc, &cp)) goto done;
    if (cm_state_new(&st) || cm_engine_new(st, &e)) goto done;
    if (cm_engine_add_logger(e, fp)) goto done;
    fp = (cm_logger_plugin){0};
    if (cm_engine_add_logger(e, cp)) goto done;
    cp = (cm_logger_plugin){0};
    if (cm_engine_run_event(e, CM_EVENT_INIT)) goto done;
    cm_hparam h[] = {{"seed", CM_HPARAM_NUMBER, 42, NULL}, {"name", CM_HPARAM_STRING, 0, "x"}};
    if (cm_logger_log_hyperparameters(cm_engine_logger(e), h, 2)) goto done;
    if (cm_engine_run_event(e, CM_EVENT_FIT_START)) goto done;
    cm_metric_value v[] = {{"loss/train/total", 1.5}, {"time/batch", 0}};
    if (cm_logger_log_metrics(cm_engine_logger(e), v, 2)) goto done;
    if (cm_engine_run_event(e, CM_EVENT_BATCH_END) || cm_engine_run_event(e, CM_EVENT_FIT_END)) goto done;
    ok = cm_engine_close(e) == CM_OK;
done:
    cm_engine_free(e);
    cm_state_free(st);
    cm_logger_plugin_free(fp);
    cm_logger_plugin_free(cp);
    return ok;
}

Test(file_logger, survives_each_allocation_failing) {
    tmpdir t = tmp_make();
    FILE *null = fopen("/dev/null", "w");
    cr_assert_not_null(null);
    bool completed = false;
    for (int64_t n = 1; n < 400 && !completed; n++) {
        cm_alloc_fail_at(n);
        bool ok = oom_scenario(t.dir, null);
        int64_t made = cm_alloc_fail_at(0);
        completed = ok && made < n; /* the failure point was past the scenario's last allocation */
    }
    cr_assert(completed, "the scenario never ran to the end without a failed allocation");
    fclose(null);
    tmp_remove(&t);
}
