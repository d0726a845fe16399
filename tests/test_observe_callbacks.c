/* The observability callbacks of issue 21 in real fits on a tiny MLP: NaNMonitor (a NaN fails
 * the run, or rolls it back to the last checkpoint and skips the offending batches, which must
 * equal training on the data without them), ... */
#define _GNU_SOURCE /* nftw */
#include "cmtest.h"
#include "cmtrain.h"

#include <composer/callbacks.h>
#include <composer/loggers.h>

#include <ftw.h>
#include <math.h>
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
static void tmp_make(char *dir, size_t cap) {
    snprintf(dir, cap, "/tmp/cm-obs-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}
static void tmp_remove(const char *dir) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* An algorithm that makes the loss NaN (× NaN, on the tape) in every microbatch holding dataset
 * sample `*self`: an injected divergence, tied to the data so that skipping the data removes it. */
static bool poison_match(void *self, cm_event ev, const cm_state *st) { return ev == CM_EVENT_AFTER_LOSS; }
static cm_status poison_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    const cm_batch *b = cm_state_batch(st);
    for (int64_t i = 0; b && b->indices && i < b->n_rows; i++)
        if (b->indices[i] == *(int64_t *)self) {
            cm_state_set_loss(st, cm_mul_scalar(cm_state_tape(st), cm_state_loss(st), NAN));
            break;
        }
    return CM_OK;
}
static const cm_algorithm_i poison_vt = {.abi = CM_ALGORITHM_ABI, .name = "PoisonLoss", .match = poison_match, .apply = poison_apply};

static cm_dataloader *ordered_loader(cm_dataset *ds, int64_t batch) {
    cm_dataloader_config lc = cm_dataloader_config_default();
    lc.batch_size = batch;
    lc.shuffle = false;
    cm_dataloader *dl;
    cr_assert_eq(cm_dataloader_new(ds, &lc, &dl), CM_OK, "%s", cm_last_error());
    return dl;
}

/* ---- NaNMonitor ----------------------------------------------------------------------------- */

typedef struct nan_run {
    cm_status fit;
    char err[1024];
    float *params;
    int64_t n_params, batches;
    double skipped;
} nan_run;

/* 48 samples in order, batch 4 (12 batches an epoch), sample `nan_at` poisoned (-1: none), over
 * the samples `keep` (NULL: all), checkpoints every 3 batches into dir when given. */
static nan_run nan_fit(const char *dir, int64_t nan_at, const int64_t *keep, int64_t n_keep, cm_nan_action action,
                       int max_rollbacks, const char *max_duration) {
    nan_run r = {0};
    cm_dataset *ds = cmt_synth_dataset(n_keep ? n_keep : 48, 8, 3, false, keep);
    cm_dataloader *dl = ordered_loader(ds, 4);
    cm_algorithm_plugin poison = {&poison_vt, &nan_at};
    cm_model *model = cmt_mlp(8, 16, 3, 0.0f, 3);
    cm_nan_monitor_config nc = cm_nan_monitor_config_default();
    nc.on_nan = action;
    nc.max_rollbacks = max_rollbacks;
    cm_callback_plugin cb;
    cr_assert_eq(cm_nan_monitor_new(&nc, &cb), CM_OK);
    cm_in_memory_logger *mem;
    cm_logger_plugin lp;
    cr_assert_eq(cm_in_memory_logger_new(&mem, &lp), CM_OK);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = model, c.train_dataloader = dl, c.run_name = "nan";
    cr_assert_eq(cm_time_parse(max_duration, &c.max_duration), CM_OK);
    char ck[128];
    if (dir) {
        snprintf(ck, sizeof ck, "%s/ck", dir);
        c.save_folder = ck;
        cr_assert_eq(cm_time_parse("3ba", &c.save_interval), CM_OK);
    }
    c.callbacks = &cb, c.n_callbacks = 1;
    c.loggers = &lp, c.n_loggers = 1;
    c.algorithms = &poison, c.n_algorithms = nan_at >= 0 ? 1 : 0;
    cm_trainer *tr;
    cr_assert_eq(cm_trainer_new(&c, &tr), CM_OK, "%s", cm_last_error());
    r.fit = cm_trainer_fit(tr, NULL);
    if (r.fit) snprintf(r.err, sizeof r.err, "%s", cm_last_error());
    r.batches = cm_state_timestamp(cm_trainer_state(tr))->batch;
    r.skipped = -1;
    cm_in_memory_logger_last(mem, "trainer/rollback/skipped_batches", &r.skipped);
    r.params = cmt_params_copy(model, &r.n_params);
    cm_trainer_free(tr);
    cm_model_free(model);
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
    return r;
}

/* A NaN in sample 21 poisons batch 6 (samples 20-23). Rolling back goes to the checkpoint at
 * batch 3 and skips batches 4-6 (samples 12-23): the run must end exactly — bit for bit — as a
 * run that never saw samples 12-23, with the same number of batches. */
Test(nan_monitor, rollback_equals_training_without_the_skipped_batches) {
    char dir[64];
    tmp_make(dir, sizeof dir);
    nan_run rb = nan_fit(dir, 21, NULL, 0, CM_NAN_ROLLBACK, 5, "1ep");
    cr_assert_eq(rb.fit, CM_OK, "%s", rb.err);
    cr_assert_eq(rb.batches, 9, "3 batches, then 6 on samples 24-47: %lld", (long long)rb.batches);
    cr_assert_eq(rb.skipped, 3, "batches 4-6 skipped, logged %g", rb.skipped);
    int64_t keep[36];
    for (int i = 0; i < 12; i++) keep[i] = i;
    for (int i = 12; i < 36; i++) keep[i] = i + 12;
    nan_run ref = nan_fit(NULL, -1, keep, 36, CM_NAN_ERROR, 0, "1ep");
    cr_assert_eq(ref.fit, CM_OK, "%s", ref.err);
    cr_assert_eq(ref.batches, 9);
    cr_assert_eq(rb.n_params, ref.n_params);
    for (int64_t i = 0; i < rb.n_params; i++) {
        cr_assert(isfinite(rb.params[i]), "parameter %lld is not finite", (long long)i);
        cr_assert_eq(rb.params[i], ref.params[i], "parameter %lld: %.9g after the rollback, %.9g without the data",
                     (long long)i, rb.params[i], ref.params[i]);
    }
    free(rb.params), free(ref.params);
    tmp_remove(dir);
}

Test(nan_monitor, a_nan_fails_the_run_by_default_and_after_max_rollbacks) {
    nan_run e = nan_fit(NULL, 21, NULL, 0, CM_NAN_ERROR, 5, "1ep");
    cr_assert_eq(e.fit, CM_ERR_STATE);
    cr_assert(strstr(e.err, "Train loss contains a NaN.") && strstr(e.err, "batch 6"), "%s", e.err);
    cr_assert(strstr(e.err, "NaNMonitor"), "the plugin is named: %s", e.err);
    free(e.params);
    char dir[64];
    tmp_make(dir, sizeof dir);
    nan_run m = nan_fit(dir, 21, NULL, 0, CM_NAN_ROLLBACK, 0, "1ep");
    cr_assert_eq(m.fit, CM_ERR_STATE);
    cr_assert(strstr(m.err, "max_rollbacks reached"), "%s", m.err);
    free(m.params);
    tmp_remove(dir);
    /* nothing to roll back to: the error names the batch and the fix */
    nan_run n = nan_fit(NULL, 21, NULL, 0, CM_NAN_ROLLBACK, 5, "1ep");
    cr_assert_eq(n.fit, CM_ERR_STATE);
    cr_assert(strstr(n.err, "no checkpoint to go back to") && strstr(n.err, "save_folder"), "%s", n.err);
    free(n.params);
}

Test(nan_monitor, bad_configs_are_refused) {
    cm_callback_plugin cb;
    cm_nan_monitor_config c = cm_nan_monitor_config_default();
    cr_assert_eq(c.on_nan, CM_NAN_ERROR);
    c.max_rollbacks = -1;
    cr_assert_eq(cm_nan_monitor_new(&c, &cb), CM_ERR_INVALID_ARG);
    cm_nan_action a;
    cr_assert_eq(cm_nan_action_parse("Rollback", &a), CM_OK);
    cr_assert_eq(a, CM_NAN_ROLLBACK);
    cr_assert_eq(cm_nan_action_parse("retry", &a), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "error or rollback"), "%s", cm_last_error());
}

/* ---- a small rig: the tiny MLP on 48 shuffled samples, batch 8 ------------------------------- */

typedef struct rig {
    cm_dataset *ds;
    cm_dataloader *dl;
    cm_model *model;
    cm_trainer *tr;
    cm_in_memory_logger *mem;
} rig;

static rig rig_make(const char *max_duration, cm_callback_plugin *cbs, int n_cbs, uint64_t model_seed,
                    cm_trainer_config *extra) {
    rig g = {0};
    g.ds = cmt_synth_dataset(48, 8, 3, false, NULL);
    g.dl = cmt_loader(g.ds, 8, false, 7);
    g.model = cmt_mlp(8, 16, 3, 0.0f, model_seed);
    cm_logger_plugin lp;
    cr_assert_eq(cm_in_memory_logger_new(&g.mem, &lp), CM_OK);
    cm_trainer_config c = extra ? *extra : cm_trainer_config_default();
    c.model = g.model, c.train_dataloader = g.dl;
    if (!c.run_name) c.run_name = "obs";
    cr_assert_eq(cm_time_parse(max_duration, &c.max_duration), CM_OK);
    c.callbacks = cbs, c.n_callbacks = n_cbs;
    c.loggers = &lp, c.n_loggers = 1;
    cr_assert_eq(cm_trainer_new(&c, &g.tr), CM_OK, "%s", cm_last_error());
    return g;
}

static void rig_fit(rig *g) { cr_assert_eq(cm_trainer_fit(g->tr, NULL), CM_OK, "%s", cm_last_error()); }

static void rig_free(rig *g) {
    cm_trainer_free(g->tr);
    cm_model_free(g->model);
    cm_dataloader_free(g->dl);
    cm_dataset_free(g->ds);
}

/* ---- SystemMetricsMonitor ------------------------------------------------------------------- */

/* Sleeps 30 ms at every batch end: /proc/stat's CPU counters move in 10 ms ticks. */
static cm_status nap_run(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    if (ev == CM_EVENT_BATCH_END) usleep(30000);
    return CM_OK;
}
static const cm_callback_i nap_vt = {CM_CALLBACK_ABI, "Nap", nap_run, NULL, NULL, NULL, NULL};

Test(system_metrics_monitor, logs_cpu_memory_disk_and_network_every_interval) {
    cm_system_metrics_monitor_config sc = cm_system_metrics_monitor_config_default();
    cm_callback_plugin cb[2] = {{0}, {&nap_vt, NULL}};
    cr_assert_eq(cm_system_metrics_monitor_new(&sc, &cb[0]), CM_OK);
    rig g = rig_make("4ba", cb, 2, 3, NULL);
    rig_fit(&g);
    double v;
    cr_assert_eq(cm_in_memory_logger_count(g.mem, "cpu_memory_total"), 4, "once per batch start");
    cr_assert_eq(cm_in_memory_logger_count(g.mem, "cpu_percentage"), 3, "from the second batch on (a difference)");
    cr_assert_eq(cm_in_memory_logger_last(g.mem, "cpu_percentage", &v), CM_OK);
    cr_assert(v >= 0 && v <= 100, "cpu_percentage %g", v);
    cr_assert_eq(cm_in_memory_logger_last(g.mem, "cpu_memory_total", &v), CM_OK);
    cr_assert_gt(v, 1e6);
    double avail;
    cr_assert_eq(cm_in_memory_logger_last(g.mem, "cpu_memory_available", &avail), CM_OK);
    cr_assert(avail > 0 && avail <= v);
    cr_assert_eq(cm_in_memory_logger_last(g.mem, "disk_memory_total", &v), CM_OK);
    cr_assert_gt(v, 0);
    cr_assert_eq(cm_in_memory_logger_last(g.mem, "disk_memory_percent", &v), CM_OK);
    cr_assert(v >= 0 && v <= 100);
    cr_assert_eq(cm_in_memory_logger_last(g.mem, "network_bytes_recv", &v), CM_OK, "lo is always there");
    cr_assert_eq(cm_in_memory_logger_last(g.mem, "process_rss_bytes", &v), CM_OK);
    cr_assert_gt(v, 1e5);
    rig_free(&g);
    sc.interval = 2;
    cr_assert_eq(cm_system_metrics_monitor_new(&sc, &cb[0]), CM_OK);
    rig h = rig_make("4ba", cb, 1, 3, NULL);
    rig_fit(&h);
    cr_assert_eq(cm_in_memory_logger_count(h.mem, "cpu_memory_total"), 2, "every 2nd batch start");
    rig_free(&h);
    sc.interval = 0;
    cr_assert_eq(cm_system_metrics_monitor_new(&sc, &cb[0]), CM_ERR_INVALID_ARG);
}

/* ---- FreeOutputs ---------------------------------------------------------------------------- */

Test(free_outputs, the_outputs_are_gone_after_the_loss_so_train_metrics_see_none) {
    cm_trainer_config tm = cm_trainer_config_default();
    tm.compute_training_metrics = true;
    rig a = rig_make("2ba", NULL, 0, 3, &tm);
    rig_fit(&a);
    double with, without;
    cr_assert_eq(cm_in_memory_logger_last(a.mem, "metrics/train/MulticlassAccuracy", &without), CM_OK);
    cr_assert(isfinite(without), "without FreeOutputs the train accuracy is computed: %g", without);
    rig_free(&a);
    cm_callback_plugin cb;
    cr_assert_eq(cm_free_outputs_new(&cb), CM_OK);
    rig b = rig_make("2ba", &cb, 1, 3, &tm);
    rig_fit(&b);
    cr_assert_eq(cm_in_memory_logger_last(b.mem, "metrics/train/MulticlassAccuracy", &with), CM_OK);
    cr_assert(isnan(with), "with FreeOutputs no outputs reach the train metrics: %g", with);
    double l1, l2;
    cr_assert_eq(cm_in_memory_logger_last(b.mem, "loss/train/total", &l2), CM_OK);
    rig c = rig_make("2ba", NULL, 0, 3, &tm);
    rig_fit(&c);
    cr_assert_eq(cm_in_memory_logger_last(c.mem, "loss/train/total", &l1), CM_OK);
    cr_assert_eq(l1, l2, "training itself is unchanged: loss %g vs %g", l1, l2);
    rig_free(&b), rig_free(&c);
}

/* ---- LoadCheckpoint and CheckpointSaver ----------------------------------------------------- */

static void expect_same_params(cm_model *a, cm_model *b, const char *what) {
    int64_t na, nb;
    float *pa = cmt_params_copy(a, &na), *pb = cmt_params_copy(b, &nb);
    cr_assert_eq(na, nb);
    for (int64_t i = 0; i < na; i++) cr_assert_eq(pa[i], pb[i], "%s: parameter %lld differs: %.9g vs %.9g", what, (long long)i, pa[i], pb[i]);
    free(pa), free(pb);
}

Test(load_checkpoint, loads_a_checkpoints_weights_or_a_safetensors_file_at_its_event) {
    char dir[64], folder[128], file[160], ck[200];
    tmp_make(dir, sizeof dir);
    /* a run saves its checkpoints through CheckpointSaver's arguments ({run_name} expanded) */
    cm_checkpoint_saver_config sv = cm_checkpoint_saver_config_default();
    char fmt[128];
    snprintf(fmt, sizeof fmt, "%s/{run_name}/ckpts", dir);
    sv.folder = fmt;
    cr_assert_eq(cm_time_parse("2ba", &sv.save_interval), CM_OK);
    sv.num_checkpoints_to_keep = 1;
    cm_trainer_config tc = cm_trainer_config_default();
    tc.run_name = "src";
    cr_assert_eq(cm_checkpoint_saver_apply(&sv, "src", folder, sizeof folder, &tc), CM_OK);
    char want[128];
    snprintf(want, sizeof want, "%s/src/ckpts", dir);
    cr_assert_str_eq(folder, want);
    rig a = rig_make("4ba", NULL, 0, 3, &tc);
    rig_fit(&a);
    snprintf(ck, sizeof ck, "%s/ep0-ba4", folder);
    struct stat sb;
    cr_assert_eq(stat(ck, &sb), 0, "CheckpointSaver's folder holds %s", ck);
    snprintf(file, sizeof file, "%s/ep0-ba2", folder);
    cr_assert_neq(stat(file, &sb), 0, "num_checkpoints_to_keep 1 removed ep0-ba2");
    snprintf(file, sizeof file, "%s/w.safetensors", dir);
    cr_assert_eq(cm_module_save_safetensors(cm_model_module(a.model), file), CM_OK);

    const char *paths[2] = {ck, file};
    const cm_event events[2] = {CM_EVENT_BEFORE_LOAD, CM_EVENT_FIT_START};
    for (int k = 0; k < 2; k++) {
        cm_load_checkpoint_config lc = cm_load_checkpoint_config_default();
        lc.load_path = paths[k];
        lc.event = events[k];
        cm_callback_plugin cb;
        cr_assert_eq(cm_load_checkpoint_new(&lc, &cb), CM_OK);
        rig b = rig_make("1ba", &cb, 1, 99, NULL); /* other initial weights */
        int64_t n;
        float *before = cmt_params_copy(b.model, &n);
        if (k == 1) { /* not loaded before its event */
            float *now = cmt_params_copy(a.model, &n);
            bool differ = false;
            for (int64_t i = 0; i < n; i++) differ |= before[i] != now[i];
            cr_assert(differ);
            free(now);
            cr_assert_eq(cm_trainer_fit(b.tr, &(cm_fit_opts){cm_time_make(0, CM_TIME_BATCH), false}), CM_OK);
        }
        free(before);
        if (k == 0) expect_same_params(a.model, b.model, "loaded at BEFORE_LOAD from the checkpoint");
        rig_free(&b);
    }
    /* errors name the path */
    cm_load_checkpoint_config lc = cm_load_checkpoint_config_default();
    lc.load_path = "/nonexistent/ckpt";
    cm_callback_plugin cb;
    cr_assert_eq(cm_load_checkpoint_new(&lc, &cb), CM_OK);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = a.model, c.run_name = "bad";
    c.callbacks = &cb, c.n_callbacks = 1;
    cm_trainer *tr;
    cr_assert_neq(cm_trainer_new(&c, &tr), CM_OK);
    cr_assert(strstr(cm_last_error(), "/nonexistent/ckpt") && strstr(cm_last_error(), "LoadCheckpoint"), "%s",
              cm_last_error());
    cm_callback_plugin_free(cb);
    lc.load_path = NULL;
    cr_assert_eq(cm_load_checkpoint_new(&lc, &cb), CM_ERR_INVALID_ARG);
    sv.num_checkpoints_to_keep = 0;
    cr_assert_eq(cm_checkpoint_saver_apply(&sv, "x", folder, sizeof folder, &tc), CM_ERR_INVALID_ARG);
    rig_free(&a);
    tmp_remove(dir);
}

/* ---- Generate ------------------------------------------------------------------------------- */

#include <composer/datasets.h>
#include <composer/tokenizer.h>
#include <composer/zoo_gpt2.h>

/* A tiny char GPT on a repeated text, in `dir`: tokenizer, token file, model, loader. */
typedef struct gpt_rig {
    cm_tokenizer *tok;
    cm_dataset *ds;
    cm_dataloader *dl;
    cm_model *model;
} gpt_rig;

static gpt_rig gpt_make(const char *dir) {
    gpt_rig g = {0};
    static const char text[] = "the quick brown fox jumps over the lazy dog. ";
    char buf[4096] = "";
    for (int i = 0; i < 60; i++) strcat(buf, text);
    cr_assert_eq(cm_tokenizer_char_new_from_text(buf, strlen(buf), &g.tok), CM_OK);
    int32_t *ids;
    int64_t n;
    cr_assert_eq(cm_tokenizer_encode(g.tok, buf, strlen(buf), &ids, &n), CM_OK);
    char path[128];
    snprintf(path, sizeof path, "%s/tokens.bin", dir);
    cr_assert_eq(cm_token_file_write(path, ids, n, CM_TOKEN_WIDTH_AUTO), CM_OK);
    cm_free(ids);
    cm_tokens_config tc = cm_tokens_config_default();
    tc.seq_len = 16;
    cr_assert_eq(cm_dataset_tokens_new(path, &tc, &g.ds), CM_OK, "%s", cm_last_error());
    g.dl = cmt_loader(g.ds, 4, false, 1);
    cm_gpt2_config gc;
    cr_assert_eq(cm_gpt2_config_preset("tiny", &gc), CM_OK);
    gc.vocab_size = cm_tokenizer_vocab_size(g.tok);
    gc.n_positions = 16;
    cm_rng rng = cm_rng_init(5, 0);
    cr_assert_eq(cm_gpt2_new(&gc, &rng, &g.model), CM_OK, "%s", cm_last_error());
    return g;
}

static void gpt_free(gpt_rig *g) {
    cm_model_free(g->model);
    cm_dataloader_free(g->dl);
    cm_dataset_free(g->ds);
    cm_tokenizer_free(g->tok);
}

/* Every batch, each prompt's continuation is logged as a text; the last one is exactly what the
 * trained model generates from that prompt afterwards. */
Test(generate, logs_each_prompts_continuation_every_interval) {
    char dir[64];
    tmp_make(dir, sizeof dir);
    gpt_rig g = gpt_make(dir);
    const char *prompts[2] = {"the ", ""};
    cm_generate_config gc = cm_generate_config_default();
    gc.tokenizer = g.tok;
    gc.prompts = prompts, gc.n_prompts = 2;
    cr_assert_eq(cm_time_parse("1ba", &gc.interval), CM_OK);
    gc.max_new_tokens = 6;
    cm_callback_plugin cb;
    cr_assert_eq(cm_generate_new(&gc, &cb), CM_OK, "%s", cm_last_error());
    cm_in_memory_logger *mem;
    cm_logger_plugin lp;
    cr_assert_eq(cm_in_memory_logger_new(&mem, &lp), CM_OK);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = g.model, c.train_dataloader = g.dl, c.run_name = "gen";
    cr_assert_eq(cm_time_parse("3ba", &c.max_duration), CM_OK);
    c.callbacks = &cb, c.n_callbacks = 1;
    c.loggers = &lp, c.n_loggers = 1;
    cm_trainer *tr;
    cr_assert_eq(cm_trainer_new(&c, &tr), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_fit(tr, NULL), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_in_memory_logger_text_count(mem, "generate/0"), 3);
    cr_assert_eq(cm_in_memory_logger_text_count(mem, "generate/1"), 3);
    const char *last = cm_in_memory_logger_text(mem, "generate/0");
    cr_assert_not_null(last);
    cr_assert_eq(strncmp(last, "the ", 4), 0, "starts with the prompt: '%s'", last);
    cr_assert_eq(strlen(last), 4 + 6, "the prompt and 6 characters: '%s'", last);
    /* the same generation from the trained model */
    int32_t *ids;
    int64_t n;
    cr_assert_eq(cm_tokenizer_encode(g.tok, "the ", 4, &ids, &n), CM_OK);
    int64_t p64[4], out[6], n_out;
    for (int i = 0; i < 4; i++) p64[i] = ids[i];
    cm_gpt2_generate_config ggc = cm_gpt2_generate_config_default();
    ggc.temperature = 0, ggc.seed = 42;
    cr_assert_eq(cm_gpt2_generate(g.model, p64, 4, 6, &ggc, out, &n_out), CM_OK);
    int32_t all[10];
    for (int i = 0; i < 4; i++) all[i] = ids[i];
    for (int i = 0; i < n_out; i++) all[4 + i] = (int32_t)out[i];
    char *text;
    size_t len;
    cr_assert_eq(cm_tokenizer_decode(g.tok, all, 4 + n_out, &text, &len), CM_OK);
    cr_assert_str_eq(last, text, "logged '%s', the trained model gives '%s'", last, text);
    cm_free(text), cm_free(ids);
    cm_trainer_free(tr);
    gpt_free(&g);
    tmp_remove(dir);
}

Test(generate, bad_configs_are_refused) {
    cm_generate_config gc = cm_generate_config_default();
    cm_callback_plugin cb;
    cr_assert_eq(cm_generate_new(&gc, &cb), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "tokenizer"), "%s", cm_last_error());
}

/* ---- ImageVisualizer ------------------------------------------------------------------------ */

#include <composer/zoo_vision.h>

/* One MNIST batch of 8 through the zoo CNN: the PNG grid is read back by PIL (Debian's
 * python3-pil), an independent decoder; its first tile is sample 0 scaled to 0..255, and the
 * strips under it hold the logged prediction (green or red) and target (blue). */
Test(image_visualizer, writes_a_png_grid_that_pil_reads_back) {
    char dir[64], folder[128];
    tmp_make(dir, sizeof dir);
    snprintf(folder, sizeof folder, "%s/{run_name}/img", dir);
    cm_mnist_config mc = cm_mnist_config_default();
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_mnist_new("../shared/data/mnist", CM_SPLIT_TEST, &mc, &ds), CM_OK, "%s", cm_last_error());
    cm_dataloader *dl = ordered_loader(ds, 8);
    cm_cnn_config cc;
    cr_assert_eq(cm_cnn_config_preset("mnist_small", &cc), CM_OK);
    cc.random_init = true, cc.seed = 1;
    cm_model *model;
    cr_assert_eq(cm_cnn_model_new(&cc, &model), CM_OK, "%s", cm_last_error());
    cm_image_visualizer_config vc = cm_image_visualizer_config_default();
    cr_assert_eq(cm_time_parse("1ba", &vc.interval), CM_OK);
    vc.folder = folder;
    cm_callback_plugin cb;
    cr_assert_eq(cm_image_visualizer_new(&vc, &cb), CM_OK, "%s", cm_last_error());
    cm_in_memory_logger *mem;
    cm_logger_plugin lp;
    cr_assert_eq(cm_in_memory_logger_new(&mem, &lp), CM_OK);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = model, c.train_dataloader = dl, c.run_name = "viz";
    cr_assert_eq(cm_time_parse("1ba", &c.max_duration), CM_OK);
    c.callbacks = &cb, c.n_callbacks = 1;
    c.loggers = &lp, c.n_loggers = 1;
    cm_trainer *tr;
    cr_assert_eq(cm_trainer_new(&c, &tr), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_fit(tr, NULL), CM_OK, "%s", cm_last_error());
    const char *text = cm_in_memory_logger_text(mem, "Images/Train");
    cr_assert_not_null(text);
    char path[256];
    snprintf(path, sizeof path, "%s/viz/img/train_ba0.png", dir);
    cr_assert_eq(strncmp(text, path, strlen(path)), 0, "logged '%s'", text);
    int preds[8], tgts[8];
    const char *p = strstr(text, "predictions: "), *t = strstr(text, "targets: ");
    cr_assert(p && t, "%s", text);
    p += 13, t += 9;
    for (int i = 0; i < 8; i++) {
        preds[i] = (int)strtol(p, (char **)&p, 10);
        tgts[i] = (int)strtol(t, (char **)&t, 10);
    }
    /* PIL: size, mode, tile 0 (scaled ×2, at (2, 2)), the strips' colours under it */
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c \"from PIL import Image; im = Image.open('%s'); im.load(); print(im.format, im.mode, "
             "im.size[0], im.size[1]); print(' '.join(str(im.getpixel((2 + 2 * x, 2 + 2 * y))[0]) for y in range(28) "
             "for x in range(28))); print(*im.getpixel((2 + %d * 56 // 10 + 1, 2 + 56 + 3))); "
             "print(*im.getpixel((2 + %d * 56 // 10 + 1, 2 + 56 + 7 + 3)))\"",
             path, preds[0], tgts[0]);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    char fmt[16], mode[16];
    int w = 0, h = 0;
    cr_assert_eq(fscanf(f, "%15s %15s %d %d", fmt, mode, &w, &h), 4, "PIL could not read %s", path);
    cr_assert_str_eq(fmt, "PNG");
    cr_assert_str_eq(mode, "RGB");
    cr_assert_eq(w, 8 * 58 + 2);
    cr_assert_eq(h, 56 + 2 * 7 + 2 + 2);
    /* sample 0, min-max scaled */
    float img[784], lbl_f[2];
    int64_t lbl;
    void *outs[2] = {img, &lbl};
    (void)lbl_f;
    const cm_sample_ctx ctx = {0, 0, false};
    cr_assert_eq(cm_dataset_get(ds, 0, &ctx, outs), CM_OK);
    float lo = img[0], hi = img[0];
    for (int i = 0; i < 784; i++) lo = img[i] < lo ? img[i] : lo, hi = img[i] > hi ? img[i] : hi;
    for (int i = 0; i < 784; i++) {
        int got;
        cr_assert_eq(fscanf(f, "%d", &got), 1);
        const double want = (img[i] - lo) / (hi - lo) * 255.0;
        cr_assert(fabs(got - want) <= 1.0, "pixel %d: %d, want %.1f", i, got, want);
    }
    cr_assert_eq(tgts[0], (int)lbl, "the target is the label");
    int pr, pg, pb, tr_, tg, tb;
    cr_assert_eq(fscanf(f, "%d %d %d %d %d %d", &pr, &pg, &pb, &tr_, &tg, &tb), 6);
    if (preds[0] == tgts[0]) cr_assert(pr == 30 && pg == 170 && pb == 60, "a right prediction is green");
    else cr_assert(pr == 220 && pg == 40 && pb == 40, "a wrong prediction is red: %d %d %d", pr, pg, pb);
    cr_assert(tr_ == 40 && tg == 90 && tb == 220, "the target is blue: %d %d %d", tr_, tg, tb);
    cr_assert_eq(pclose(f), 0);
    cm_trainer_free(tr);
    cm_model_free(model);
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
    tmp_remove(dir);
}

Test(png, cm_png_write_refuses_bad_images) {
    uint8_t px[12] = {0};
    cr_assert_eq(cm_png_write("/tmp/x.png", 0, 2, 3, px), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_png_write("/tmp/x.png", 2, 2, 2, px), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_png_write("/nonexistent/dir/x.png", 2, 2, 3, px), CM_ERR_IO);
    cr_assert(strstr(cm_last_error(), "/nonexistent/dir/x.png"), "%s", cm_last_error());
}

/* ---- ExportForInference --------------------------------------------------------------------- */

/* At FIT_END the MLP is exported; its infer.c compiles with warnings as errors, reads the
 * exported weights and prints the trained model's eval logits for an input. */
Test(export_for_inference, the_exported_c_program_compiles_and_gives_our_logits) {
    char dir[64], save[128];
    tmp_make(dir, sizeof dir);
    snprintf(save, sizeof save, "%s/export", dir);
    cm_export_for_inference_config ec = cm_export_for_inference_config_default();
    ec.save_path = save;
    cm_callback_plugin cb;
    cr_assert_eq(cm_export_for_inference_new(&ec, &cb), CM_OK, "%s", cm_last_error());
    rig g = rig_make("3ba", &cb, 1, 3, NULL);
    rig_fit(&g);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cc -O2 -std=c99 -Wall -Wextra -Werror -o %s/infer %s/infer.c -lm 2>&1", save, save);
    cr_assert_eq(system(cmd), 0, "infer.c does not compile: %s", cmd);
    /* an input and our logits for it */
    const float in[8] = {0.5f, -1.25f, 2.0f, 0.125f, -0.75f, 1.5f, -2.5f, 0.25f};
    cm_tape *tp;
    cr_assert_eq(cm_tape_new(NULL, &tp), CM_OK);
    int64_t shape[2] = {1, 8};
    cm_tensor *x;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 2, shape, &x), CM_OK);
    memcpy(cm_tensor_data(x), in, sizeof in);
    cm_module *root = cm_model_module(g.model);
    cm_module_train(root, false);
    cm_tensor *y = cm_module_forward(root, tp, x);
    cr_assert_not_null(y, "%s", cm_tape_error(tp));
    char input[256] = "";
    for (int i = 0; i < 8; i++) snprintf(input + strlen(input), sizeof input - strlen(input), "%.9g ", (double)in[i]);
    snprintf(cmd, sizeof cmd, "echo '%s' | %s/infer %s/model.safetensors", input, save, save);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    for (int k = 0; k < 3; k++) {
        double got;
        cr_assert_eq(fscanf(p, "%lf", &got), 1, "logit %d missing", k);
        const double want = cm_tensor_get_flat(y, k);
        cr_assert(fabs(got - want) <= 1e-5 * (1 + fabs(want)), "logit %d: the program gives %.9g, the model %.9g", k,
                  got, want);
    }
    cr_assert_eq(pclose(p), 0);
    /* another weights file is refused */
    snprintf(cmd, sizeof cmd, "echo 1 | %s/infer /dev/null 2>/dev/null", save);
    cr_assert_neq(system(cmd), 0);
    cm_tensor_free(x);
    cm_tape_free(tp);
    rig_free(&g);
    tmp_remove(dir);
}

Test(export_for_inference, other_formats_and_layers_are_refused_by_name) {
    cm_export_for_inference_config ec = cm_export_for_inference_config_default();
    cm_callback_plugin cb;
    ec.save_path = "/tmp/x";
    ec.save_format = "onnx";
    cr_assert_eq(cm_export_for_inference_new(&ec, &cb), CM_ERR_UNSUPPORTED);
    cr_assert(strstr(cm_last_error(), "onnx"), "%s", cm_last_error());
    ec.save_format = "c", ec.save_path = NULL;
    cr_assert_eq(cm_export_for_inference_new(&ec, &cb), CM_ERR_INVALID_ARG);
    cm_cnn_config cc;
    cr_assert_eq(cm_cnn_config_preset("mnist_small", &cc), CM_OK);
    cm_model *cnn;
    cr_assert_eq(cm_cnn_model_new(&cc, &cnn), CM_OK);
    cr_assert_eq(cm_export_for_inference(cnn, "/tmp/cm-obs-never"), CM_ERR_UNSUPPORTED);
    cr_assert(strstr(cm_last_error(), "Sequential"), "%s", cm_last_error());
    cm_model_free(cnn);
}

/* ---- MemorySnapshot and OOMObserver --------------------------------------------------------- */

#include <cjson/cJSON.h>

static cJSON *read_json(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s missing", path);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    cJSON *j = cJSON_Parse(buf);
    cr_assert_not_null(j, "%s is not JSON", path);
    return j;
}

/* skip 1, record 2 batches of 2 microbatches: 16 events each, the arena growing in forward and
 * backward; one file, named after the last recorded batch, and its plot. */
Test(memory_snapshot, records_the_arena_over_the_chosen_batches) {
    char dir[64], folder[128];
    tmp_make(dir, sizeof dir);
    snprintf(folder, sizeof folder, "%s/mem", dir);
    cm_memory_snapshot_config mc = cm_memory_snapshot_config_default();
    mc.interval = cm_time_make(2, CM_TIME_BATCH);
    mc.folder = folder;
    cm_callback_plugin cb;
    cr_assert_eq(cm_memory_snapshot_new(&mc, &cb), CM_OK);
    cm_trainer_config tc = cm_trainer_config_default();
    tc.device_train_microbatch_size = 4;
    rig g = rig_make("4ba", &cb, 1, 3, &tc);
    rig_fit(&g);
    char path[256];
    snprintf(path, sizeof path, "%s/rank0.3.memory_snapshot.json", folder);
    cJSON *j = read_json(path);
    const cJSON *entries = cJSON_GetObjectItemCaseSensitive(j, "entries");
    cr_assert_eq(cJSON_GetArraySize(entries), 2 * 16, "%d entries", cJSON_GetArraySize(entries));
    double fwd = -1, bwd = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, entries) {
        const double b = cJSON_GetObjectItemCaseSensitive(e, "batch")->valuedouble;
        cr_assert(b == 1 || b == 2, "batch %g recorded", b);
        const char *ev = cJSON_GetObjectItemCaseSensitive(e, "event")->valuestring;
        const double a = cJSON_GetObjectItemCaseSensitive(e, "arena_bytes")->valuedouble;
        if (!strcmp(ev, "after_forward") && fwd < 0) fwd = a;
        if (!strcmp(ev, "after_backward") && bwd < 0) bwd = a;
    }
    cr_assert_gt(fwd, 0, "activations in the arena after forward");
    cr_assert_geq(bwd, fwd, "backward adds to them (%g vs %g)", bwd, fwd);
    cJSON_Delete(j);
    snprintf(path, sizeof path, "%s/rank0.3.memory_snapshot.svg", folder);
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0, "the plot %s", path);
    rig_free(&g);
    /* again into the same folder: refused without overwrite, naming the file */
    cr_assert_eq(cm_memory_snapshot_new(&mc, &cb), CM_OK);
    rig h = rig_make("4ba", &cb, 1, 3, &tc);
    cr_assert_eq(cm_trainer_fit(h.tr, NULL), CM_ERR_IO);
    cr_assert(strstr(cm_last_error(), "exists"), "%s", cm_last_error());
    rig_free(&h);
    tmp_remove(dir);
}

/* An arena budget too small for a batch of 8: with a fixed microbatch size the fit fails with the
 * arena's own error, and the observer has written the batch's timeline and the failed request. */
Test(oom_observer, writes_the_batch_timeline_when_the_arena_runs_out) {
    char dir[64], folder[128];
    tmp_make(dir, sizeof dir);
    snprintf(folder, sizeof folder, "%s/{run_name}", dir);
    cm_oom_observer_config oc = cm_oom_observer_config_default();
    oc.folder = folder;
    cm_callback_plugin cb;
    cr_assert_eq(cm_oom_observer_new(&oc, &cb), CM_OK);
    cm_trainer_config tc = cm_trainer_config_default();
    tc.arena_budget = 3000;
    tc.run_name = "oomrun";
    rig g = rig_make("2ba", &cb, 1, 3, &tc);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_ERR_OOM);
    cr_assert(strstr(cm_last_error(), "arena") || strstr(cm_last_error(), "budget"), "the arena's message: %s",
              cm_last_error());
    char path[256];
    snprintf(path, sizeof path, "%s/oomrun/rank0_oom.json", dir);
    cJSON *j = read_json(path);
    const cJSON *oom = cJSON_GetObjectItemCaseSensitive(j, "oom");
    cr_assert_not_null(oom);
    cr_assert_gt(cJSON_GetObjectItemCaseSensitive(oom, "request_bytes")->valuedouble, 0);
    cr_assert_eq(cJSON_GetObjectItemCaseSensitive(oom, "budget_bytes")->valuedouble, 3000);
    cr_assert_geq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "entries")), 2);
    cJSON_Delete(j);
    rig_free(&g);
    tmp_remove(dir);
}

/* ---- ActivationMonitor ---------------------------------------------------------------------- */

static double first_logged(const cm_in_memory_logger *m, const char *name) {
    for (int64_t i = 0; i < cm_in_memory_logger_n(m); i++)
        if (!strcmp(cm_in_memory_logger_record(m, i)->name, name)) return cm_in_memory_logger_record(m, i)->value;
    cr_assert_fail("nothing logged as %s", name);
    return NAN;
}

/* Every 2nd batch, the first microbatch's modules: the root's input statistics equal the ones
 * computed by hand from the batch (samples 0-7, in order), a module's input has the statistics of
 * the previous module's output, and ignored modules log nothing. */
Test(activation_monitor, logs_module_input_and_output_statistics_at_the_interval) {
    cm_activation_monitor_config ac = cm_activation_monitor_config_default();
    cr_assert_eq(cm_time_parse("2ba", &ac.interval), CM_OK);
    const char *ignore[1] = {"2"};
    ac.ignore_module_types = ignore, ac.n_ignore_module_types = 1;
    cm_callback_plugin cb;
    cr_assert_eq(cm_activation_monitor_new(&ac, &cb), CM_OK);
    cm_dataset *ds = cmt_synth_dataset(48, 8, 3, false, NULL);
    cm_dataloader *dl = ordered_loader(ds, 8);
    cm_model *model = cmt_mlp(8, 16, 3, 0.0f, 3);
    cm_in_memory_logger *mem;
    cm_logger_plugin lp;
    cr_assert_eq(cm_in_memory_logger_new(&mem, &lp), CM_OK);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = model, c.train_dataloader = dl, c.run_name = "act";
    cr_assert_eq(cm_time_parse("4ba", &c.max_duration), CM_OK);
    c.callbacks = &cb, c.n_callbacks = 1;
    c.loggers = &lp, c.n_loggers = 1;
    cm_trainer *tr;
    cr_assert_eq(cm_trainer_new(&c, &tr), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_fit(tr, NULL), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_in_memory_logger_count(mem, "activations/max/0_output.0"), 2, "batches 0 and 2");
    cr_assert_eq(cm_in_memory_logger_count(mem, "activations/kurtosis/_input.0"), 2);
    cr_assert_eq(cm_in_memory_logger_count(mem, "activations/max/2_output.0"), 0, "module 2 is ignored");
    cr_assert_eq(first_logged(mem, "activations/average/1_input.0"), first_logged(mem, "activations/average/0_output.0"));
    cr_assert_eq(first_logged(mem, "activations/l2_norm/1_input.0"), first_logged(mem, "activations/l2_norm/0_output.0"));
    cr_assert_geq(first_logged(mem, "activations/average/1_output.0"), 0.0, "a ReLU's output");
    /* the root's input: samples 0-7 */
    double mx = 0, sum = 0, l2 = 0, kurt = 0;
    for (int s = 0; s < 8; s++) {
        float x[8];
        int64_t y;
        float tok;
        void *outs[3] = {x, &y, &tok};
        const cm_sample_ctx ctx = {0, 0, true};
        cr_assert_eq(cm_dataset_get(ds, s, &ctx, outs), CM_OK);
        double s1 = 0, s2 = 0, m = -INFINITY;
        for (int j = 0; j < 8; j++) s1 += x[j], s2 += (double)x[j] * x[j], m = x[j] > m ? x[j] : m;
        double m2 = 0, m4 = 0;
        for (int j = 0; j < 8; j++) {
            const double d = x[j] - s1 / 8;
            m2 += d * d, m4 += d * d * d * d;
        }
        m2 /= 8, m4 /= 8;
        mx += m, sum += s1, l2 += sqrt(s2), kurt += m4 / (m2 * m2);
    }
    cr_assert_float_eq(first_logged(mem, "activations/max/_input.0"), mx / 8, 1e-9);
    cr_assert_float_eq(first_logged(mem, "activations/average/_input.0"), sum / 64, 1e-9);
    cr_assert_float_eq(first_logged(mem, "activations/l2_norm/_input.0"), l2 / 8, 1e-9);
    cr_assert_float_eq(first_logged(mem, "activations/kurtosis/_input.0"), kurt / 8, 1e-9);
    cm_trainer_free(tr);
    cm_model_free(model);
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
}
