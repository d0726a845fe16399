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
static const cm_algorithm_i poison_vt = {CM_ALGORITHM_ABI, "PoisonLoss", poison_match, poison_apply, NULL, NULL, NULL, NULL};

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
