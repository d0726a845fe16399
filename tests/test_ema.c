/* EMA: compute_ema against Composer's (torch) bit for bit over a short trajectory with batch-norm
 * buffers; in the trainer, evaluation sees exactly the average of the training weights (tracked
 * independently) and training resumes with the training weights; ema_start and update_interval;
 * checkpoints hold the EMA model and the training weights; resumption is exact and fit-again
 * works on every model family; argument errors. */
#include "cmalgo.h"
#include "cmtest.h"
#include "cmtrain.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- golden: compute_ema ---- */

static const cm_module_i holder_vt = {CM_MODULE_ABI, "Small", NULL, NULL, NULL};

/* Composer's test model: fc = Linear(5, 3), bn = BatchNorm2d(4), as children of a holder. */
static cm_module *small(void) {
    cm_module *root, *fc, *bn;
    cr_assert_eq(cm_module_new(&holder_vt, NULL, &root), CM_OK);
    cr_assert_eq(cm_nn_linear_new(5, 3, true, NULL, &fc), CM_OK);
    cm_nn_batch_norm_config bc = cm_nn_batch_norm_config_default();
    cr_assert_eq(cm_nn_batch_norm2d_new(4, &bc, &bn), CM_OK);
    cr_assert_eq(cm_module_add_child(root, "fc", fc, NULL), CM_OK);
    cr_assert_eq(cm_module_add_child(root, "bn", bn, NULL), CM_OK);
    cr_assert_eq(cm_module_finalize(root), CM_OK, "%s", cm_last_error());
    return root;
}

static const char *const k_names[] = {"fc.weight", "fc.bias", "bn.weight", "bn.bias", "bn.running_mean",
                                      "bn.running_var", "bn.num_batches_tracked"};

static cm_tensor *find(cm_module *m, const char *name) {
    cm_tensor *t = cm_module_find_param(m, name);
    return t ? t : cm_module_find_buffer(m, name);
}

static void set_state(cmt_golden *g, cm_module *m, const char *prefix) {
    for (int i = 0; i < 7; i++) {
        char key[128];
        snprintf(key, sizeof key, "%s.%s", prefix, k_names[i]);
        cm_tensor *src = cmt_golden_get(g, key), *dst = find(m, k_names[i]);
        cr_assert(dst && cm_tensor_nbytes(src) == cm_tensor_nbytes(dst), "%s", key);
        memcpy(cm_tensor_data(dst), cm_tensor_data(src), cm_tensor_nbytes(src));
        cm_tensor_free(src);
    }
}

Test(ema, compute_ema_matches_composer_bitwise_over_a_trajectory) {
    cmt_golden *g = cmt_golden_open("tests/golden/train_algos.safetensors");
    const double smoothing = cm_ema_smoothing(3, 1); /* the generator's 2 ** (-(1 / 3)) */
    cr_assert_eq(smoothing, pow(2.0, -1.0 / 3.0));
    cm_module *model = small(), *ema = small();
    set_state(g, ema, "ema.w0");
    for (int k = 1; k <= 5; k++) {
        char pre[32];
        snprintf(pre, sizeof pre, "ema.w%d", k);
        set_state(g, model, pre);
        cr_assert_eq(cm_compute_ema(model, ema, smoothing), CM_OK, "%s", cm_last_error());
        for (int i = 0; i < 7; i++) {
            char key[128];
            snprintf(key, sizeof key, "ema.avg%d.%s", k, k_names[i]);
            cm_tensor *want = cmt_golden_get(g, key);
            const cm_tensor *got = find(ema, k_names[i]);
            cr_assert(memcmp(cm_tensor_data(want), cm_tensor_data(got), cm_tensor_nbytes(want)) == 0,
                      "step %d: %s differs from torch (tol 0)", k, k_names[i]);
            cm_tensor_free(want);
        }
    }
    /* num_batches_tracked is averaged in f32 and truncated: after step 1 (ema 1, model 4) it is
     * trunc(0.7937 + 0.8254) = 1 */
    cr_expect_eq(*(int64_t *)cm_tensor_data(find(ema, "bn.num_batches_tracked")) > 0, 1);
    /* errors */
    cr_expect_eq(cm_compute_ema(model, ema, 1.5), CM_ERR_INVALID_ARG);
    cm_module *other;
    cr_assert_eq(cm_module_new(&holder_vt, NULL, &other), CM_OK);
    cm_module *fc;
    cr_assert_eq(cm_nn_linear_new(5, 4, true, NULL, &fc), CM_OK);
    cr_assert_eq(cm_module_add_child(other, "fc", fc, NULL), CM_OK);
    cr_assert_eq(cm_module_finalize(other), CM_OK);
    cr_expect_eq(cm_compute_ema(model, other, 0.5), CM_ERR_SHAPE);
    cr_expect(strstr(cm_last_error(), "fc.weight"), "%s", cm_last_error());
    cm_module_free(other);
    cm_module_free(model);
    cm_module_free(ema);
    cmt_golden_close(g);
}

Test(ema, update_function_is_the_plain_formula) {
    float e[3] = {1, 2, 3}, m[3] = {3, 2, 1};
    cm_ema_update(e, m, 3, 0.75);
    cr_expect(e[0] == 1.5f && e[1] == 2.0f && e[2] == 2.5f, "%g %g %g", e[0], e[1], e[2]);
    cm_ema_update(e, m, 3, 0.0); /* no memory: the model */
    cr_expect(memcmp(e, m, sizeof e) == 0);
    cr_expect_eq(cm_ema_smoothing(0, 1), 0.0);
    cr_expect_float_eq(cm_ema_smoothing(10, 5), pow(2, -0.5), 1e-15);
}

/* ---- in the trainer: what evaluation sees ---- */

/* A callback that keeps its own average of the training weights (seen at BATCH_END, after EMA's
 * update) and checks, on EVAL_START (after EMA's swap), that the model holds exactly it, and on
 * EVAL_END that the training weights are back. */
typedef struct watcher {
    double smoothing;
    int64_t start_batch, interval;
    bool started;
    int64_t n;        /* floats over params + buffers (f32 only; the rig has none other) */
    float *avg, *train;
    int evals_checked;
    int failures;
    char msg[256];
} watcher;

static int64_t gather(cm_module *root, float *out) {
    int64_t n = 0;
    for (int64_t i = 0; i < cm_module_n_params(root); i++) {
        cm_param_info p = cm_module_param_info(root, i);
        if (out) memcpy(out + n, cm_tensor_data(p.tensor), sizeof(float) * (size_t)p.numel);
        n += p.numel;
    }
    for (int64_t i = 0; i < cm_module_n_buffers(root); i++) {
        cm_buffer_info b = cm_module_buffer_info(root, i);
        if (cm_tensor_dtype(b.tensor) != CM_DTYPE_F32) continue;
        if (out) memcpy(out + n, cm_tensor_data(b.tensor), sizeof(float) * (size_t)cm_tensor_numel(b.tensor));
        n += cm_tensor_numel(b.tensor);
    }
    return n;
}

static void fail(watcher *w, const char *what) {
    if (!w->failures++) snprintf(w->msg, sizeof w->msg, "%s", what);
}

static cm_status w_run(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    watcher *w = self;
    cm_module *root = cm_model_module(cm_state_model(st));
    if (!w->avg) {
        w->n = gather(root, NULL);
        w->avg = calloc((size_t)w->n, sizeof(float));
        w->train = calloc((size_t)w->n, sizeof(float));
    }
    float *now = malloc(sizeof(float) * (size_t)w->n);
    gather(root, now);
    const int64_t b = cm_state_timestamp(st)->batch;
    if (ev == CM_EVENT_BATCH_END) {
        memcpy(w->train, now, sizeof(float) * (size_t)w->n);
        if (!w->started && b >= w->start_batch) {
            memcpy(w->avg, now, sizeof(float) * (size_t)w->n);
            w->started = true;
        }
        if (w->started && b % w->interval == 0) cm_ema_update(w->avg, now, w->n, w->smoothing);
    } else if (ev == CM_EVENT_EVAL_START) {
        if (memcmp(now, w->started ? w->avg : w->train, sizeof(float) * (size_t)w->n))
            fail(w, w->started ? "EVAL_START: the model does not hold the average" : "EVAL_START before the start: not the training weights");
        w->evals_checked++;
    } else if (ev == CM_EVENT_EVAL_END || ev == CM_EVENT_BATCH_START) {
        if (b > 0 && memcmp(now, w->train, sizeof(float) * (size_t)w->n))
            fail(w, ev == CM_EVENT_EVAL_END ? "EVAL_END: the training weights are not back" : "BATCH_START: not the training weights");
    }
    free(now);
    return CM_OK;
}
static void w_free(void *self) {}
static const cm_callback_i watcher_vt = {CM_CALLBACK_ABI, "Watcher", w_run, NULL, NULL, NULL, w_free};

typedef struct ema_case {
    const char *half_life, *ema_start, *update_interval;
    double smoothing;
    cm_ema *handle;
} ema_case;

static int ema_algos(cm_algorithm_plugin *out, int cap, void *data) {
    ema_case *c = data;
    cm_ema_config cfg = cm_ema_config_default();
    if (c) {
        cfg.half_life = c->half_life;
        cfg.smoothing = c->smoothing;
        if (c->ema_start) cfg.ema_start = c->ema_start;
        cfg.update_interval = c->update_interval;
    } else {
        cfg.half_life = "3ba";
    }
    cr_assert_eq(cm_ema_new(&cfg, c ? &c->handle : NULL, &out[0]), CM_OK, "%s", cm_last_error());
    return 1;
}

static void eval_sees_average_saving(ema_case *c, int64_t start_batch, int64_t interval, double smoothing,
                                     const char *save_interval, const char *eval_interval, int n_evals);

static void eval_sees_average(ema_case *c, int64_t start_batch, int64_t interval, double smoothing) {
    eval_sees_average_saving(c, start_batch, interval, smoothing, NULL, "1ba", 6);
}

static void eval_sees_average_saving(ema_case *c, int64_t start_batch, int64_t interval, double smoothing,
                                     const char *save_interval, const char *eval_interval, int n_evals) {
    cmt_rig rig;
    cmt_rig_resnet(&rig, NULL); /* batch-norm statistics are averaged too */
    cmt_run_opts o = cmt_run_opts_default();
    char *dir = save_interval ? cmt_tmpdir() : NULL;
    o.max_duration = "6ba", o.eval = true, o.eval_interval = eval_interval;
    o.save_folder = dir, o.save_interval = save_interval;
    cmt_run r = cmt_run_new(&rig, ema_algos, c, &o);
    watcher w = {.smoothing = smoothing, .start_batch = start_batch, .interval = interval};
    cr_assert_eq(cm_engine_add_callback(cm_trainer_engine(r.tr), (cm_callback_plugin){&watcher_vt, &w}), CM_OK);
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_expect_eq(w.failures, 0, "%d failures, first: %s", w.failures, w.msg);
    cr_expect_eq(w.evals_checked, n_evals);
    cr_expect(cm_ema_started(c->handle));
    if (dir) { /* a save at the end of training may have left the average in the model */
        cr_assert_eq(cm_ema_use_training_weights(c->handle), CM_OK);
        cmt_rmtree(dir);
        free(dir);
    }
    cr_expect(!cm_ema_weights_active(c->handle), "the training weights are in the model after fit");
    cr_expect_float_eq(cm_ema_get_smoothing(c->handle), smoothing, 1e-15);
    /* the handle swaps the average in and out */
    float *t = malloc(sizeof(float) * (size_t)w.n);
    gather(cm_model_module(rig.model), t);
    cr_expect(memcmp(t, w.train, sizeof(float) * (size_t)w.n) == 0);
    cr_assert_eq(cm_ema_use_ema_weights(c->handle), CM_OK);
    cr_assert_eq(cm_ema_use_ema_weights(c->handle), CM_OK); /* idempotent */
    gather(cm_model_module(rig.model), t);
    cr_expect(memcmp(t, w.avg, sizeof(float) * (size_t)w.n) == 0, "use_ema_weights: not the average");
    cr_assert_eq(cm_ema_use_training_weights(c->handle), CM_OK);
    gather(cm_model_module(rig.model), t);
    cr_expect(memcmp(t, w.train, sizeof(float) * (size_t)w.n) == 0, "use_training_weights: not the training weights");
    /* the average differs from the training weights (it is not a copy) */
    cr_expect(memcmp(w.avg, w.train, sizeof(float) * (size_t)w.n) != 0);
    free(t);
    free(w.avg);
    free(w.train);
    cmt_run_free(&r);
    cmt_rig_free(&rig);
}

Test(ema, evaluation_sees_exactly_the_average_and_training_resumes_with_training_weights) {
    ema_case c = {.half_life = "3ba", .smoothing = NAN};
    eval_sees_average(&c, 1, 1, pow(2, -1.0 / 3));
}

/* Averages in epochs with a checkpoint after every batch: the batch checkpoint before each epoch
 * end swaps the average into the model, and the epoch-end update must average the training
 * weights all the same (Composer would average the average into the training weights). */
Test(ema, epoch_updates_after_batch_checkpoints_average_the_training_weights) {
    ema_case c = {.half_life = "2ep", .smoothing = NAN};
    eval_sees_average_saving(&c, 2, 2, pow(2, -1.0 / 2), "1ba", "1ep", 3);
}

Test(ema, ema_start_and_update_interval) {
    /* starts at batch 2 (made again from the model then), averages every 2 batches, half life 4ba */
    ema_case c = {.half_life = "4ba", .ema_start = "2ba", .update_interval = "2ba", .smoothing = NAN};
    eval_sees_average(&c, 2, 2, pow(2, -2.0 / 4));
    /* smoothing given directly, start at half the run */
    ema_case d = {.half_life = NULL, .ema_start = "0.5dur", .smoothing = 0.8};
    eval_sees_average(&d, 3, 1, 0.8);
}

/* ---- checkpoints ---- */

Test(ema, checkpoint_holds_the_ema_model_and_the_training_weights) {
    char *dir = cmt_tmpdir();
    cmt_rig rig;
    cmt_rig_mlp(&rig, NULL);
    cmt_run_opts o = cmt_run_opts_default();
    o.max_duration = "3ba", o.save_folder = dir, o.save_interval = "2ba";
    ema_case c = {.half_life = "2ba", .smoothing = NAN};
    cmt_run r = cmt_run_new(&rig, ema_algos, &c, &o);
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_OK, "%s", cm_last_error());
    /* the run ended with a save: the model holds the average now, as in Composer */
    cr_expect(cm_ema_weights_active(c.handle));
    int64_t n;
    float *avg = cmt_params_copy(rig.model, &n);
    cr_assert_eq(cm_ema_use_training_weights(c.handle), CM_OK);
    float *train = cmt_params_copy(rig.model, &n);
    cr_assert(memcmp(avg, train, sizeof(float) * (size_t)n) != 0);
    char ck[600];
    snprintf(ck, sizeof ck, "%s/ba3", dir);
    cm_checkpoint *cp;
    cr_assert_eq(cm_checkpoint_open(ck, &cp), CM_OK, "%s", cm_last_error());
    const cm_safetensors *mf = cm_checkpoint_file(cp, CM_CKPT_MODEL_FILE), *af = cm_checkpoint_file(cp, CM_CKPT_ALGO_FILE);
    cr_assert(mf && af, "the checkpoint has no %s", CM_CKPT_ALGO_FILE);
    cm_module *root = cm_model_module(rig.model);
    int64_t off = 0;
    for (int64_t i = 0; i < cm_module_n_params(root); i++) {
        cm_param_info p = cm_module_param_info(root, i);
        char an[256];
        snprintf(an, sizeof an, "EMA/%s", p.name);
        const cm_st_tensor *mt = cm_safetensors_find(mf, p.name), *at = cm_safetensors_find(af, an);
        cr_assert(mt && at, "%s", p.name);
        cr_expect(memcmp(mt->data, avg + off, sizeof(float) * (size_t)p.numel) == 0, "%s: model file is not the EMA", p.name);
        cr_expect(memcmp(at->data, train + off, sizeof(float) * (size_t)p.numel) == 0, "%s: EMA file is not the training weights",
                  p.name);
        off += p.numel;
    }
    const char *man = cm_checkpoint_manifest(cp);
    const char *at = strstr(man, "\"ema_weights_active\"");
    cr_assert(at, "the manifest has no EMA state");
    at += strlen("\"ema_weights_active\"");
    while (*at == ':' || *at == ' ' || *at == '\t') at++;
    cr_expect(!strncmp(at, "true", 4), "the manifest does not record that the EMA weights are in the model");
    cm_checkpoint_close(cp);
    free(avg);
    free(train);
    cmt_run_free(&r);
    cmt_rig_free(&rig);
    cmt_rmtree(dir);
    free(dir);
}

/* ---- every family: fit twice, resume exactly ---- */

static cmt_rig_fn k_rigs[] = {cmt_rig_mlp, cmt_rig_cnn, cmt_rig_resnet, cmt_rig_gpt2};

Test(ema, fit_twice_on_every_family) {
    cmt_run_opts o = cmt_run_opts_default();
    o.max_duration = "3ba", o.eval = true, o.eval_interval = "2ba";
    for (int i = 0; i < 4; i++) cmt_check_fit_twice(k_rigs[i], NULL, ema_algos, NULL, &o, "1ba", "EMA");
}

Test(ema, resumption_is_exact_on_every_family) {
    for (int i = 0; i < 4; i++) {
        cmt_resumption_opts o = cmt_resumption_opts_default();
        o.label = "EMA";
        cmt_check_algorithm_resumption(k_rigs[i], NULL, ema_algos, NULL, &o);
    }
    /* later start, interval 2, eval every batch, over an epoch boundary, bf16 */
    ema_case c = {.half_life = "4ba", .ema_start = "2ba", .update_interval = "2ba", .smoothing = NAN};
    cmt_resumption_opts o = cmt_resumption_opts_default();
    o.total_batches = 5, o.resume_batch = 3, o.label = "EMA (start 2ba, every 2ba, eval, bf16)";
    o.run.eval = true, o.run.eval_interval = "1ba", o.run.precision = CM_PRECISION_AMP_BF16;
    cmt_check_algorithm_resumption(cmt_rig_resnet, NULL, ema_algos, &c, &o);
}

/* ---- errors ---- */

static void bad(cm_ema_config cfg, const char *needle) {
    cm_algorithm_plugin p;
    cr_expect_eq(cm_ema_new(&cfg, NULL, &p), CM_ERR_INVALID_ARG, "%s", needle);
    cr_expect(strstr(cm_last_error(), needle), "want '%s' in: %s", needle, cm_last_error());
}

Test(ema, bad_arguments_are_named) {
    cm_ema_config c = cm_ema_config_default();
    cr_expect_str_eq(c.half_life, "1000ba");
    cr_expect(isnan(c.smoothing));
    cr_expect_str_eq(c.ema_start, "0.0dur");
    cr_expect_null(c.update_interval);
    c.smoothing = 0.9;
    bad(c, "only one of half_life and smoothing");
    c = cm_ema_config_default(), c.half_life = NULL;
    bad(c, "either half_life or smoothing");
    c = cm_ema_config_default(), c.half_life = "10sp";
    bad(c, "half_life '10sp': the unit must be ba or ep");
    c = cm_ema_config_default(), c.half_life = "10ba", c.update_interval = "1ep";
    bad(c, "units of half_life '10ba' and update_interval '1ep' must match");
    c = cm_ema_config_default(), c.half_life = "10bx";
    bad(c, "EMA: half_life");
    c = cm_ema_config_default(), c.ema_start = "1h";
    bad(c, "ema_start");
    c = cm_ema_config_default(), c.half_life = NULL, c.smoothing = 1.5;
    bad(c, "smoothing 1.5");
    c = cm_ema_config_default(), c.update_interval = "0ba";
    bad(c, "at least 1");
    cm_ema *h = NULL;
    cm_algorithm_plugin p;
    c = cm_ema_config_default();
    cr_assert_eq(cm_ema_new(&c, &h, &p), CM_OK);
    cr_expect_eq(cm_ema_use_ema_weights(h), CM_ERR_STATE, "before INIT there is no model");
    cr_expect_float_eq(cm_ema_get_smoothing(h), pow(2, -1.0 / 1000), 1e-15);
    cm_algorithm_plugin_free(p);
}
