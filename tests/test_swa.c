/* SWA: the running average against torch's AveragedModel bit for bit, SWALR's learning rates
 * against torch; in the trainer, the model becomes exactly the average of the models at the update
 * events between swa_start and swa_end (buffers following the model) and training goes on from
 * it; the SWA schedule replaces the schedulers; resumption is exact in the middle of averaging on
 * every model family (with the schedule), and a lost average is caught; fit twice; errors. */
#include "cmalgo.h"
#include "cmtest.h"
#include "cmtrain.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static cmt_golden *golden(void) { return cmt_golden_open("tests/golden/train_algos.safetensors"); }

Test(swa, running_average_matches_torch_averaged_model_bitwise) {
    cmt_golden *g = golden();
    const char *names[4] = {"fc.weight", "fc.bias", "bn.weight", "bn.bias"};
    for (int i = 0; i < 4; i++) {
        char key[96];
        snprintf(key, sizeof key, "swa.avg0.%s", names[i]);
        cm_tensor *avg = cmt_golden_get(g, key); /* the buffer the average lives in */
        for (int k = 0; k < 6; k++) {
            snprintf(key, sizeof key, "swa.w%d.%s", k, names[i]);
            cm_tensor *w = cmt_golden_get(g, key);
            cm_swa_average_update(cm_tensor_data(avg), cm_tensor_data(w), cm_tensor_numel(w), k);
            snprintf(key, sizeof key, "swa.avg%d.%s", k, names[i]);
            cm_tensor *want = cmt_golden_get(g, key);
            cr_assert(memcmp(cm_tensor_data(avg), cm_tensor_data(want), cm_tensor_nbytes(want)) == 0,
                      "%s after update %d differs from torch (tol 0)", names[i], k);
            cm_tensor_free(w);
            cm_tensor_free(want);
        }
        cm_tensor_free(avg);
    }
    cmt_golden_close(g);
}

Test(swa, swalr_learning_rates_match_torch) {
    cmt_golden *g = golden();
    const char *strat[2] = {"linear", "cos"};
    const int anneals[3] = {0, 1, 4};
    for (int s = 0; s < 2; s++)
        for (int a = 0; a < 3; a++) {
            char key[64];
            snprintf(key, sizeof key, "swa.lr.%s.a%d", strat[s], anneals[a]);
            cm_tensor *lrs = cmt_golden_get(g, key);
            cm_swa_anneal an;
            cr_assert_eq(cm_swa_anneal_parse(s ? "Cosine" : "lin", &an), CM_OK);
            for (int64_t k = 0; k < cm_tensor_numel(lrs); k++) {
                const double want = cm_tensor_get_flat(lrs, k), got = cm_swa_lr(0.1, 0.01, k, anneals[a], an);
                cr_expect(fabs(got - want) <= 1e-6 * want, "%s: step %lld: %.9g vs torch %.9g", key, (long long)k, got,
                          want);
            }
            cm_tensor_free(lrs);
        }
    cm_swa_anneal an;
    cr_expect_eq(cm_swa_anneal_parse("cosh", &an), CM_ERR_INVALID_ARG);
    cmt_golden_close(g);
}

/* ---- in the trainer ---- */

typedef struct swa_case {
    const char *swa_start, *swa_end, *update_interval;
    bool schedule;
    double swa_lr;
    int64_t anneal_steps;
    const char *anneal;
} swa_case;

static int swa_algos(cm_algorithm_plugin *out, int cap, void *data) {
    cm_swa_config c = cm_swa_config_default();
    swa_case *k = data;
    if (k) {
        c.swa_start = k->swa_start, c.swa_end = k->swa_end, c.update_interval = k->update_interval;
        c.schedule_swa_lr = k->schedule, c.swa_lr = k->swa_lr;
        if (k->anneal_steps) c.anneal_steps = k->anneal_steps;
        if (k->anneal) c.anneal_strategy = k->anneal;
    }
    cr_assert_eq(cm_swa_new(&c, &out[0]), CM_OK, "%s", cm_last_error());
    return 1;
}

/* An algorithm registered before SWA, so it runs before SWA on BATCH_END and EPOCH_END (Composer
 * reverses the order only on events named AFTER_*, not on *_END): it averages the parameters the
 * update events see, and at the BATCH_START after swa_end checks that the model holds that average
 * and the buffers of the last update. */
typedef struct avg_watch {
    cm_event update_event;
    int64_t first_update, last_update; /* the timestamp's batch at the first and last update events */
    float *avg, *buf_snap;
    int64_t n, nb, n_avg;
    int checked, failures;
    char msg[160];
} avg_watch;

static int64_t buffers(cm_module *root, float *out) {
    int64_t n = 0;
    for (int64_t i = 0; i < cm_module_n_buffers(root); i++) {
        cm_buffer_info b = cm_module_buffer_info(root, i);
        if (cm_tensor_dtype(b.tensor) != CM_DTYPE_F32) continue;
        if (out) memcpy(out + n, cm_tensor_data(b.tensor), sizeof(float) * (size_t)cm_tensor_numel(b.tensor));
        n += cm_tensor_numel(b.tensor);
    }
    return n;
}

static bool aw_match(void *self, cm_event ev, const cm_state *st) {
    avg_watch *w = self;
    return ev == w->update_event || ev == CM_EVENT_BATCH_START;
}

static cm_status aw_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    avg_watch *w = self;
    cm_model *m = cm_state_model(st);
    const int64_t b = cm_state_timestamp(st)->batch;
    if (ev == w->update_event && b >= w->first_update && b <= w->last_update) {
        int64_t n;
        float *p = cmt_params_copy(m, &n);
        if (!w->avg) w->avg = calloc((size_t)n, sizeof(float)), w->n = n;
        cm_swa_average_update(w->avg, p, n, w->n_avg++);
        free(p);
        w->nb = buffers(cm_model_module(m), NULL);
        free(w->buf_snap);
        w->buf_snap = calloc((size_t)w->nb + 1, sizeof(float));
        buffers(cm_model_module(m), w->buf_snap);
    }
    if (ev == CM_EVENT_BATCH_START && b == w->last_update) {
        int64_t n;
        float *p = cmt_params_copy(m, &n);
        if (!w->avg || memcmp(p, w->avg, sizeof(float) * (size_t)n))
            if (!w->failures++)
                snprintf(w->msg, sizeof w->msg, "after swa_end the model is not the average of %lld", (long long)w->n_avg);
        float *bs = calloc((size_t)w->nb + 1, sizeof(float));
        buffers(cm_model_module(m), bs);
        if (memcmp(bs, w->buf_snap, sizeof(float) * (size_t)w->nb) && !w->failures++)
            snprintf(w->msg, sizeof w->msg, "after swa_end the buffers are not the last update's");
        free(bs);
        free(p);
        w->checked++;
    }
    return CM_OK;
}
static void aw_free(void *self) {}
static const cm_algorithm_i aw_vt = {.abi = CM_ALGORITHM_ABI, .name = "AvgWatch", .match = aw_match,
                                     .apply = aw_apply, .free = aw_free};

typedef struct watch_then_swa {
    avg_watch *w;
    swa_case *c;
} watch_then_swa;

static int watch_then_swa_algos(cm_algorithm_plugin *out, int cap, void *data) {
    watch_then_swa *k = data;
    out[0] = (cm_algorithm_plugin){&aw_vt, k->w};
    return 1 + swa_algos(out + 1, cap - 1, k->c);
}

static void becomes_average(cmt_rig_fn make, const char *max_duration, swa_case *c, cm_event update_event,
                            int64_t first, int64_t last, int64_t n_avg) {
    cmt_rig rig;
    make(&rig, NULL);
    cmt_run_opts o = cmt_run_opts_default();
    o.max_duration = max_duration;
    avg_watch w = {.update_event = update_event, .first_update = first, .last_update = last};
    watch_then_swa k = {&w, c};
    cmt_run r = cmt_run_new(&rig, watch_then_swa_algos, &k, &o);
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_expect_eq(w.checked, 1, "%s: the batch after swa_end was not checked", rig.family);
    cr_expect_eq(w.n_avg, n_avg);
    cr_expect_eq(w.failures, 0, "%s: %s", rig.family, w.msg);
    int64_t n;
    float *fin = cmt_params_copy(rig.model, &n);
    cr_expect(memcmp(fin, w.avg, sizeof(float) * (size_t)n) != 0, "training did not go on after swa_end");
    free(fin);
    free(w.avg);
    free(w.buf_snap);
    cmt_run_free(&r);
    cmt_rig_free(&rig);
}

Test(swa, the_model_becomes_the_average_at_swa_end_and_training_goes_on) {
    /* 10 batches, 2 per epoch: epoch ends at elapsed 0.2, 0.4, ..., 1.0; updates at the ends of
     * epochs 2, 3, 4 (batches 4, 6, 8), where 0.8 = swa_end puts the average in. Batch norm: the
     * buffers follow the model. */
    swa_case c = {"0.4dur", "0.8dur", "1ep", false, NAN, 0, NULL};
    becomes_average(cmt_rig_resnet, "5ep", &c, CM_EVENT_EPOCH_END, 4, 8, 3);
    /* every batch from epoch 1 (batch 3) on; the epoch count reaches 3 at batch 7 */
    swa_case d = {"1ep", "3ep", "1ba", false, NAN, 0, NULL};
    becomes_average(cmt_rig_mlp, "8ba", &d, CM_EVENT_BATCH_END, 3, 7, 5);
}

/* The learning-rate multiplier each step used. */
typedef struct lr_watch {
    double mult[16];
} lr_watch;
static cm_status lw_run(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    lr_watch *w = self;
    const int64_t b = cm_state_timestamp(st)->batch;
    if (ev == CM_EVENT_BATCH_END && b >= 1 && b <= 16) w->mult[b - 1] = cm_state_lr_multiplier(st);
    return CM_OK;
}
static void lw_free(void *self) {}
static const cm_callback_i lw_vt = {CM_CALLBACK_ABI, "LrWatch", lw_run, NULL, NULL, NULL, lw_free};

Test(swa, swa_schedule_replaces_the_schedulers_from_its_start) {
    cmt_rig rig;
    cmt_rig_mlp(&rig, NULL);
    cmt_run_opts o = cmt_run_opts_default();
    o.max_duration = "8ba", o.adam = false; /* SGD lr 0.1, the step scheduler halves it every batch */
    swa_case c = {"0.5dur", "1.0dur", "1ba", true, 0.01, 2, "cos"};
    cmt_run r = cmt_run_new(&rig, swa_algos, &c, &o);
    lr_watch w = {{0}};
    cr_assert_eq(cm_engine_add_callback(cm_trainer_engine(r.tr), (cm_callback_plugin){&lw_vt, &w}), CM_OK);
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_OK, "%s", cm_last_error());
    /* batches 1..4 follow the scheduler (0.5^(b-1)); SWA starts at the BATCH_END of batch 4 with
     * lr0 = 0.125 (batch 4's), and batches 5..8 use SWALR after 1..4 updates, toward 0.01 / 0.1 */
    for (int b = 1; b <= 8; b++) {
        const double want = b <= 4 ? pow(0.5, b - 1) : cm_swa_lr(0.125, 0.1, b - 4, 2, CM_SWA_ANNEAL_COS);
        cr_expect(fabs(w.mult[b - 1] - want) < 1e-15, "batch %d: lr multiplier %.17g, want %.17g", b, w.mult[b - 1], want);
    }
    cr_expect(fabs(w.mult[7] - 0.1) < 1e-15, "annealed to swa_lr: %.17g", w.mult[7]);
    cmt_run_free(&r);
    cmt_rig_free(&rig);
}

/* ---- every family ---- */

static cmt_rig_fn k_rigs[] = {cmt_rig_mlp, cmt_rig_cnn, cmt_rig_resnet, cmt_rig_gpt2};
static swa_case k_mid = {"0.25dur", "0.75dur", "1ba", true, 1e-3, 3, "linear"};

Test(swa, resumption_in_the_middle_of_averaging_is_exact_on_every_family) {
    /* 6 batches: SWA starts at batch 2 (elapsed 1/3), the run resumes at 3, the model becomes the
     * average at batch 5 and trains one more batch from it */
    for (int i = 0; i < 4; i++) {
        cmt_resumption_opts o = cmt_resumption_opts_default();
        o.total_batches = 6, o.resume_batch = 3, o.label = "SWA (every batch, scheduled lr)";
        cmt_check_algorithm_resumption(k_rigs[i], NULL, swa_algos, &k_mid, &o);
    }
    /* epochs, without the schedule, resuming at an epoch boundary */
    swa_case e = {"1ep", "2ep", "1ep", false, NAN, 0, NULL};
    cmt_resumption_opts o = cmt_resumption_opts_default();
    o.total_batches = 6, o.resume_batch = 2, o.label = "SWA (epochs)";
    cmt_check_algorithm_resumption(cmt_rig_resnet, NULL, swa_algos, &e, &o);
}

Test(swa, a_lost_average_is_caught) {
    cmt_resumption_opts o = cmt_resumption_opts_default();
    o.total_batches = 6, o.resume_batch = 3, o.label = "SWA without its state";
    o.run.load_exclude_algorithms = "SWA";
    char msg[3000];
    cr_expect(cmt_algorithm_resumption_differs(cmt_rig_mlp, NULL, swa_algos, &k_mid, &o, msg, sizeof msg),
              "a resumed SWA that lost its average was not told apart");
}

Test(swa, fit_twice_on_every_family) {
    cmt_run_opts o = cmt_run_opts_default();
    o.max_duration = "4ba";
    swa_case c = {"0.25dur", "0.75dur", "1ba", true, 1e-3, 2, "cos"};
    for (int i = 0; i < 4; i++) cmt_check_fit_twice(k_rigs[i], NULL, swa_algos, &c, &o, "2ba", "SWA");
}

/* ---- errors ---- */

static void bad(cm_swa_config c, const char *needle) {
    cm_algorithm_plugin p;
    cr_expect_eq(cm_swa_new(&c, &p), CM_ERR_INVALID_ARG, "%s", needle);
    cr_expect(strstr(cm_last_error(), needle), "want '%s' in: %s", needle, cm_last_error());
}

Test(swa, bad_arguments_are_named) {
    cm_swa_config c = cm_swa_config_default();
    cr_expect_str_eq(c.swa_start, "0.7dur");
    cr_expect_str_eq(c.swa_end, "0.97dur");
    cr_expect_str_eq(c.update_interval, "1ep");
    cr_expect(!c.schedule_swa_lr);
    cr_expect_str_eq(c.anneal_strategy, "linear");
    cr_expect_eq(c.anneal_steps, 10);
    cr_expect(isnan(c.swa_lr));
    c.swa_start = "10ba";
    bad(c, "swa_start '10ba': the unit must be dur or ep");
    c = cm_swa_config_default(), c.swa_start = "1ep";
    bad(c, "same unit");
    c = cm_swa_config_default(), c.swa_start = "0.9dur", c.swa_end = "0.5dur";
    bad(c, "must come after swa_start");
    c = cm_swa_config_default(), c.swa_end = "1.5dur";
    bad(c, "[0, 1]");
    c = cm_swa_config_default(), c.update_interval = "0.5dur";
    bad(c, "update_interval '0.5dur': the unit must be ba or ep");
    c = cm_swa_config_default(), c.anneal_steps = 0;
    bad(c, "anneal_steps 0");
    c = cm_swa_config_default(), c.anneal_strategy = "exp";
    bad(c, "anneal_strategy 'exp'");
    c = cm_swa_config_default(), c.swa_lr = -1;
    bad(c, "swa_lr -1");
}
