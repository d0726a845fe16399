/* The trainer hooks the training-method algorithms are built on, each on its own: parameters
 * removed from the optimizer (cm_optim_exclude), the learning-rate multiplier override, custom
 * train steps with closures, cm_state_checkpoint_due, and algorithm tensors in checkpoints. */
#include "cmalgo.h"
#include "cmtest.h"
#include "cmtrain.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- cm_optim_exclude ---- */

static void fill(float *p, int64_t n, uint64_t seed) {
    cm_rng r = cm_rng_init(seed, 0);
    cm_rng_normal(&r, p, (size_t)n, 0, 1);
}

static void excluded_ranges_do_not_move(cm_optim_kind kind) {
    enum { N = 100 };
    float pa[N], ga[N], pb[N], gb[N];
    fill(pa, N, 1);
    memcpy(pb, pa, sizeof pa);
    cm_optim *a, *b;
    cm_optim_hparams hp = cm_optim_hparams_default(kind);
    hp.lr = 0.1, hp.weight_decay = 0.01;
    if (kind == CM_OPTIM_SGD || kind == CM_OPTIM_DECOUPLED_SGDW) hp.momentum = 0.9;
    cm_optim_span sa = {"s", pa, ga, N}, sb = {"s", pb, gb, N};
    cr_assert_eq(cm_optim_new(kind, &a), CM_OK);
    cr_assert_eq(cm_optim_new(kind, &b), CM_OK);
    cr_assert_eq(cm_optim_add_group(a, &hp, &sa, 1), CM_OK);
    cr_assert_eq(cm_optim_add_group(b, &hp, &sb, 1), CM_OK);
    for (int step = 0; step < 4; step++) {
        fill(ga, N, 10 + step);
        memcpy(gb, ga, sizeof ga);
        if (step == 2) { /* two overlapping ranges and a touching one merge into [10, 40) and [70, 80) */
            cr_assert_eq(cm_optim_exclude(b, pb + 10, 15), CM_OK);
            cr_assert_eq(cm_optim_exclude(b, pb + 20, 10), CM_OK);
            cr_assert_eq(cm_optim_exclude(b, pb + 70, 10), CM_OK);
            cr_assert_eq(cm_optim_exclude(b, pb + 30, 10), CM_OK);
            cr_assert_eq(cm_optim_n_excluded(b), 40);
        }
        float before[N];
        memcpy(before, pb, sizeof pb);
        cr_assert_eq(cm_optim_step(a, 0.5), CM_OK);
        cr_assert_eq(cm_optim_step(b, 0.5), CM_OK);
        for (int i = 0; i < N; i++) {
            const bool ex = step >= 2 && ((i >= 10 && i < 40) || (i >= 70 && i < 80));
            if (ex)
                cr_assert(memcmp(&pb[i], &before[i], 4) == 0, "%s step %d: excluded element %d moved", cm_optim_kind_name(kind),
                          step, i);
            else
                cr_assert(memcmp(&pb[i], &pa[i], 4) == 0, "%s step %d: element %d is %.9g, %.9g without exclusion",
                          cm_optim_kind_name(kind), step, i, pb[i], pa[i]);
        }
    }
    cr_expect_eq(cm_optim_exclude(b, pb + 95, 10), CM_ERR_NOT_FOUND);
    cr_expect(strstr(cm_last_error(), "no span"), "%s", cm_last_error());
    cr_expect_eq(cm_optim_exclude(b, pb, -1), CM_ERR_INVALID_ARG);
    cm_optim_free(a);
    cm_optim_free(b);
}

Test(train_hooks, optimizer_exclusion_freezes_ranges_and_leaves_the_rest_bitwise) {
    excluded_ranges_do_not_move(CM_OPTIM_DECOUPLED_SGDW);
    excluded_ranges_do_not_move(CM_OPTIM_SGD);
    excluded_ranges_do_not_move(CM_OPTIM_ADAMW);
    excluded_ranges_do_not_move(CM_OPTIM_DECOUPLED_ADAMW);
}

/* ---- a probe algorithm: counts events, sets the override, installs a closure step ---- */

typedef struct probe {
    int mode;               /* 0 count only; 1 override; 2 closure twice; 3 step without run; 4 step twice; 5 no run */
    int after_train_batch;  /* AFTER_TRAIN_BATCH count */
    int before_train_batch;
    int due[16];            /* cm_state_checkpoint_due at BATCH_CHECKPOINT of batch i (1-based) */
    float counter[4];       /* tensor state (modes 6-8) */
} probe;

static cm_status probe_step(void *data, cm_state *st, cm_train_closure *c) {
    probe *p = data;
    cm_status s = CM_OK;
    if (p->mode == 2) {
        if ((s = cm_train_closure_run(c)) || (s = cm_train_closure_run(c))) return s;
        return cm_train_closure_step(c);
    }
    if (p->mode == 3) return cm_train_closure_step(c);
    if (p->mode == 4) {
        if ((s = cm_train_closure_run(c)) || (s = cm_train_closure_step(c))) return s;
        return cm_train_closure_step(c);
    }
    return CM_OK; /* mode 5: nothing */
}

static bool probe_match(void *self, cm_event ev, const cm_state *st) { return true; }
static cm_status probe_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    probe *p = self;
    if (ev == CM_EVENT_AFTER_TRAIN_BATCH) p->after_train_batch++;
    if (ev == CM_EVENT_BEFORE_TRAIN_BATCH) p->before_train_batch++;
    if (ev == CM_EVENT_BATCH_CHECKPOINT) {
        const int64_t b = cm_state_timestamp(st)->batch;
        if (b < 16) p->due[b] = cm_state_checkpoint_due(st) ? 1 : -1;
    } else if (cm_state_checkpoint_due(st)) {
        return cm_set_error(CM_ERR_STATE, "checkpoint_due outside a checkpoint event");
    }
    if (ev == CM_EVENT_INIT && p->mode >= 2 && p->mode <= 5) return cm_state_set_train_step(st, "Probe", probe_step, p);
    if (ev == CM_EVENT_BATCH_START && p->mode == 1) /* batch 1 (0-based) trains with lr 0 */
        return cm_state_set_lr_multiplier_override(st, cm_state_timestamp(st)->batch == 1 ? 0.0 : NAN);
    if (ev == CM_EVENT_BATCH_END && p->mode == 6)
        for (int i = 0; i < 3; i++) p->counter[i] += (float)(i + 1);
    return CM_OK;
}
static int probe_tensors(void *self, cm_plugin_tensor *out, int cap) {
    probe *p = self;
    if (p->mode < 6) return 0;
    /* 7: another shape than saved; 8: a tensor the checkpoint does not have */
    if (cap >= 1)
        out[0] = (cm_plugin_tensor){p->mode == 8 ? "other" : "counter", CM_DTYPE_F32, 1, {p->mode == 7 ? 4 : 3},
                                    p->counter};
    return 1;
}
static size_t probe_save(void *self, char *buf, size_t cap) { return (size_t)snprintf(buf, cap, "{}"); }
static cm_status probe_load(void *self, const char *json, size_t len) { return CM_OK; }
static void probe_free(void *self) {}
static const cm_algorithm_i probe_vt = {.abi = CM_ALGORITHM_ABI, .name = "Probe", .match = probe_match,
                                        .apply = probe_apply, .save = probe_save, .load = probe_load,
                                        .free = probe_free, .tensors = probe_tensors};

static probe g_probe; /* the probe of the run being made (runs are made one at a time) */
static int probe_algos(cm_algorithm_plugin *out, int cap, void *data) {
    out[0] = (cm_algorithm_plugin){&probe_vt, &g_probe};
    return 1;
}

static float *params(cm_model *m, int64_t *n) { return cmt_params_copy(m, n); }

Test(train_hooks, lr_override_replaces_the_schedulers_for_a_batch) {
    cmt_run_opts o = cmt_run_opts_default();
    o.max_duration = "3ba", o.adam = false;
    cmt_rig rig;
    cmt_rig_mlp(&rig, NULL);
    memset(&g_probe, 0, sizeof g_probe);
    g_probe.mode = 1;
    cmt_run r = cmt_run_new(&rig, probe_algos, NULL, &o);
    cm_fit_opts fo = cm_fit_opts_default();
    cm_time_parse("1ba", &fo.duration);
    cr_assert_eq(cm_trainer_fit(r.tr, &fo), CM_OK, "%s", cm_last_error());
    int64_t n;
    float *w1 = params(rig.model, &n);
    cr_assert_eq(cm_trainer_fit(r.tr, &fo), CM_OK, "%s", cm_last_error()); /* batch 1: lr 0 */
    float *w2 = params(rig.model, &n);
    /* SGDW with momentum: lr 0 moves nothing (the decoupled decay scales with lr / initial_lr) */
    cr_assert(memcmp(w1, w2, sizeof(float) * (size_t)n) == 0, "the override of 0 still moved the weights");
    cr_expect_eq(cm_state_lr_multiplier(cm_trainer_state(r.tr)), 0.0);
    cr_assert_eq(cm_trainer_fit(r.tr, &fo), CM_OK, "%s", cm_last_error()); /* batch 2: the step scheduler again */
    cr_expect_eq(cm_state_lr_multiplier(cm_trainer_state(r.tr)), 0.25);
    cr_expect(isnan(cm_state_lr_multiplier_override(cm_trainer_state(r.tr))));
    cr_expect_eq(cm_state_set_lr_multiplier_override(cm_trainer_state(r.tr), -1), CM_ERR_INVALID_ARG);
    cr_expect_eq(cm_state_set_lr_multiplier_override(cm_trainer_state(r.tr), INFINITY), CM_ERR_INVALID_ARG);
    free(w1);
    free(w2);
    cmt_run_free(&r);
    cmt_rig_free(&rig);
}

/* A step that computes the gradient twice at the same parameters and steps once trains exactly as
 * the default step; every closure run fires BEFORE/AFTER_TRAIN_BATCH; the loss is the first run's. */
Test(train_hooks, closure_run_twice_equals_the_default_step) {
    cmt_run_opts o = cmt_run_opts_default();
    o.max_duration = "3ba", o.microbatch = 3;
    int64_t n;
    double loss_default, loss_closure;
    cmt_rig rig;
    cmt_rig_mlp(&rig, NULL); /* with dropout: the second run draws the same masks */
    cmt_run r = cmt_run_new(&rig, NULL, NULL, &o);
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_OK, "%s", cm_last_error());
    float *wd = params(rig.model, &n);
    cr_assert_eq(cm_in_memory_logger_last(r.mem, "loss/train/total", &loss_default), CM_OK);
    cmt_run_free(&r);
    cmt_rig_free(&rig);

    cmt_rig_mlp(&rig, NULL);
    memset(&g_probe, 0, sizeof g_probe);
    g_probe.mode = 2;
    r = cmt_run_new(&rig, probe_algos, NULL, &o);
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_OK, "%s", cm_last_error());
    float *wc = params(rig.model, &n);
    cr_assert_eq(cm_in_memory_logger_last(r.mem, "loss/train/total", &loss_closure), CM_OK);
    cr_assert(memcmp(wd, wc, sizeof(float) * (size_t)n) == 0, "two closure runs then a step differ from one");
    cr_expect(memcmp(&loss_default, &loss_closure, sizeof(double)) == 0, "loss %.17g vs %.17g", loss_closure,
              loss_default);
    cr_expect_eq(g_probe.after_train_batch, 6, "AFTER_TRAIN_BATCH fired %d times in 3 batches of 2 runs",
                 g_probe.after_train_batch);
    cr_expect_eq(g_probe.before_train_batch, 6);
    cr_expect_eq(cm_in_memory_logger_count(r.mem, "loss/train/total"), 3);
    /* a second algorithm cannot take over the step */
    cr_expect_eq(cm_state_set_train_step(cm_trainer_state(r.tr), "Other", probe_step, NULL), CM_ERR_STATE);
    cr_expect(strstr(cm_last_error(), "'Probe' already"), "%s", cm_last_error());
    free(wd);
    free(wc);
    cmt_run_free(&r);
    cmt_rig_free(&rig);
}

static void bad_step(int mode, const char *needle) {
    cmt_run_opts o = cmt_run_opts_default();
    cmt_rig rig;
    cmt_rig_mlp(&rig, NULL);
    memset(&g_probe, 0, sizeof g_probe);
    g_probe.mode = mode;
    cmt_run r = cmt_run_new(&rig, probe_algos, NULL, &o);
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_ERR_STATE, "mode %d", mode);
    cr_expect(strstr(cm_last_error(), needle) && strstr(cm_last_error(), "Probe"), "mode %d: %s", mode, cm_last_error());
    cmt_run_free(&r);
    cmt_rig_free(&rig);
}

Test(train_hooks, closure_misuse_is_reported_with_the_steps_name) {
    bad_step(3, "before any gradient computation");
    bad_step(4, "second optimizer step");
    bad_step(5, "without computing the batch's gradient");
}

Test(train_hooks, checkpoint_due_is_true_exactly_before_the_saves) {
    char *dir = cmt_tmpdir();
    cmt_run_opts o = cmt_run_opts_default();
    o.max_duration = "5ba", o.save_folder = dir, o.save_interval = "2ba";
    cmt_rig rig;
    cmt_rig_mlp(&rig, NULL);
    memset(&g_probe, 0, sizeof g_probe);
    cmt_run r = cmt_run_new(&rig, probe_algos, NULL, &o);
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_OK, "%s", cm_last_error());
    const int want[6] = {0, -1, 1, -1, 1, 1}; /* saves at 2, 4 and the end (5) */
    for (int b = 1; b <= 5; b++) cr_expect_eq(g_probe.due[b], want[b], "batch %d: due %d, want %d", b, g_probe.due[b], want[b]);
    cmt_run_free(&r);
    cmt_rig_free(&rig);
    cmt_rmtree(dir);
    free(dir);
}

static void algorithm_tensors_case(bool save_async);

Test(train_hooks, algorithm_tensors_are_saved_checked_and_restored) { algorithm_tensors_case(false); }
/* a background save snapshots them at the save point (batch 2 changes them right after) */
Test(train_hooks, algorithm_tensors_are_snapshotted_by_background_saves) { algorithm_tensors_case(true); }

static void algorithm_tensors_case(bool save_async) {
    char *dir = cmt_tmpdir();
    char ck[600];
    cmt_run_opts o = cmt_run_opts_default();
    o.max_duration = "2ba", o.save_folder = dir, o.save_async = save_async;
    cmt_rig rig;
    cmt_rig_mlp(&rig, NULL);
    memset(&g_probe, 0, sizeof g_probe);
    g_probe.mode = 6;
    cmt_run r = cmt_run_new(&rig, probe_algos, NULL, &o);
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_OK, "%s", cm_last_error());
    cmt_run_free(&r);
    cmt_rig_free(&rig);
    snprintf(ck, sizeof ck, "%s/ba1", dir);
    cm_checkpoint *c;
    cr_assert_eq(cm_checkpoint_open(ck, &c), CM_OK, "%s", cm_last_error());
    const cm_st_tensor *t = cm_safetensors_find(cm_checkpoint_file(c, CM_CKPT_ALGO_FILE), "Probe/counter");
    cr_assert(t && t->numel == 3, "algorithms.safetensors has no Probe/counter");
    float v[3];
    memcpy(v, t->data, sizeof v);
    cr_expect(v[0] == 1 && v[1] == 2 && v[2] == 3, "counter after batch 1: %g %g %g", v[0], v[1], v[2]);
    cm_checkpoint_close(c);

    /* loading puts it back (before AFTER_LOAD) */
    cmt_rig_mlp(&rig, NULL);
    memset(&g_probe, 0, sizeof g_probe);
    g_probe.mode = 6;
    o.save_folder = NULL, o.load_path = ck, o.save_async = false;
    r = cmt_run_new(&rig, probe_algos, NULL, &o);
    cr_expect(g_probe.counter[0] == 1 && g_probe.counter[2] == 3, "loaded %g %g", g_probe.counter[0], g_probe.counter[2]);
    cmt_run_free(&r);
    cmt_rig_free(&rig);

    /* a run whose algorithm lists a tensor of another shape, or one the checkpoint lacks, is
     * refused with the tensor's name; excluding the algorithm from the load starts it fresh */
    const int modes[3] = {7, 8, 8};
    const cm_status want[3] = {CM_ERR_SHAPE, CM_ERR_FORMAT, CM_OK};
    const char *needle[3] = {"Probe/counter", "Probe/other", ""};
    for (int k = 0; k < 3; k++) {
        cmt_rig_mlp(&rig, NULL);
        memset(&g_probe, 0, sizeof g_probe);
        g_probe.mode = modes[k];
        o.load_exclude_algorithms = k == 2 ? "Prob*" : NULL;
        cm_status s = cmt_run_try(&rig, probe_algos, NULL, &o, &r);
        cr_expect_eq(s, want[k], "case %d: %s", k, s ? cm_last_error() : "ok");
        if (s) cr_expect(strstr(cm_last_error(), needle[k]), "case %d: %s", k, cm_last_error());
        if (!s) cmt_run_free(&r);
        cmt_rig_free(&rig);
    }
    cmt_rmtree(dir);
    free(dir);
}

/* ---- the training methods together, and their refusal of sharded strategies ---- */

static int all_four(cm_algorithm_plugin *out, int cap, void *data) {
    cm_ema_config e = cm_ema_config_default();
    e.half_life = "2ba";
    cm_swa_config w = cm_swa_config_default();
    w.swa_start = "0.25dur", w.swa_end = "0.75dur", w.update_interval = "1ba", w.schedule_swa_lr = true, w.swa_lr = 1e-3;
    cm_sam_config s = cm_sam_config_default();
    s.interval = 2;
    cm_layer_freezing_config l = cm_layer_freezing_config_default();
    l.freeze_start = 0.0;
    cr_assert_eq(cm_ema_new(&e, NULL, &out[0]), CM_OK);
    cr_assert_eq(cm_swa_new(&w, &out[1]), CM_OK);
    cr_assert_eq(cm_sam_new(&s, &out[2]), CM_OK);
    cr_assert_eq(cm_layer_freezing_new(&l, &out[3]), CM_OK);
    cr_assert_eq(cm_grad_clip_new(CM_GRAD_CLIP_NORM, 1.0, &out[4]), CM_OK);
    return 5;
}

Test(train_hooks, the_four_methods_compose_and_resume_exactly_on_resnet_and_gpt2) {
    cmt_rig_fn rigs[2] = {cmt_rig_resnet, cmt_rig_gpt2};
    for (int i = 0; i < 2; i++) {
        cmt_resumption_opts o = cmt_resumption_opts_default();
        o.total_batches = 6, o.resume_batch = 3, o.label = "EMA + SWA + SAM + LayerFreezing + clipping";
        o.run.eval = true, o.run.eval_interval = "2ba";
        cmt_check_algorithm_resumption(rigs[i], NULL, all_four, NULL, &o);
    }
}

static int one_of(cm_algorithm_plugin *out, int cap, void *data) {
    cm_algorithm_plugin all[5];
    all_four(all, 5, NULL);
    const int k = *(int *)data;
    for (int i = 0; i < 5; i++)
        if (i != k) cm_algorithm_plugin_free(all[i]);
    out[0] = all[k];
    return 1;
}

Test(train_hooks, the_methods_refuse_sharded_parameters) {
    /* a one-rank "sharded" trainer whose shard spans cover every unit: every rank would hold
     * pieces, which the methods cannot average, perturb or freeze */
    const char *names[4] = {"EMA", "SWA", "SAM", "LayerFreezing"};
    for (int k = 0; k < 4; k++) {
        cmt_rig rig;
        cmt_rig_mlp(&rig, NULL);
        cm_module *root = cm_model_module(rig.model);
        cm_shard_span spans[4];
        const int n = cm_module_n_units(root);
        for (int u = 0; u < n; u++) {
            const cm_unit_info *ui = cm_module_unit(root, u);
            spans[u] = (cm_shard_span){u, 0, ui->numel, ui->params, ui->grads, false};
        }
        cm_algorithm_plugin alg;
        one_of(&alg, 1, &k);
        cm_trainer_config tc = cm_trainer_config_default();
        tc.model = rig.model, tc.train_dataloader = rig.dl, tc.algorithms = &alg, tc.n_algorithms = 1;
        tc.dist.shard_spans = spans, tc.dist.n_shard_spans = n;
        cm_trainer *tr = NULL;
        cm_status s = cm_trainer_new(&tc, &tr);
        cr_expect_eq(s, CM_ERR_UNSUPPORTED, "%s: %s", names[k], s ? cm_last_error() : "accepted");
        if (s) {
            cr_expect(strstr(cm_last_error(), names[k]) && strstr(cm_last_error(), "NO_SHARD"), "%s", cm_last_error());
            cm_algorithm_plugin_free(alg);
        }
        cm_trainer_free(tr);
        cmt_rig_free(&rig);
    }
}
