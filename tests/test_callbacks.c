/* The callbacks: keys and values they log in short fits (throughput consistent with the window,
 * MFU = flops × samples/s / peak, LR following the scheduler, memory, optimizer norms equal to
 * hand-computed ones), and on a state driven by hand with a fake clock (throughput, wall-clock,
 * the runtime estimate, the stoppers on scripted metric sequences); save/load; bad configs. */
#include "cmtest.h"
#include "cmtrain.h"
#include "trainer/trainer_impl.h"

#include <composer/callbacks.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Real fits
 * ------------------------------------------------------------------------------------------- */

typedef struct {
    cm_dataset *ds, *eds;
    cm_dataloader *dl, *edl;
    cm_model *model;
    cm_trainer *tr;
    cm_in_memory_logger *mem;
} rig;

typedef struct {
    const char *max_duration;
    int64_t n, batch, eval_n;
    bool tokens;
    double flops_per_sample;
    cm_optim *optimizer;
    const cm_sched_config *sched;
    size_t arena_budget;
    int64_t mb;
    bool train_metrics; /* compute_training_metrics */
} rig_opts;

static rig_opts defaults(void) { return (rig_opts){.max_duration = "2ep", .n = 48, .batch = 8}; }

/* The MLP of cmtrain with a FLOP count per sample. */
static cm_model *mlp_with_flops(double fps) {
    cm_rng rng = cm_rng_init(3, 0);
    cm_module *seq, *l1, *act, *l2;
    cr_assert_eq(cm_nn_sequential_new(&seq), CM_OK);
    cr_assert_eq(cm_nn_linear_new(8, 16, true, &rng, &l1), CM_OK);
    cr_assert_eq(cm_nn_activation_new(CM_ACT_RELU, &act), CM_OK);
    cr_assert_eq(cm_nn_linear_new(16, 3, true, &rng, &l2), CM_OK);
    cm_nn_sequential_append(seq, l1);
    cm_nn_sequential_append(seq, act);
    cm_nn_sequential_append(seq, l2);
    cm_classifier_config cc = cm_classifier_config_default();
    cc.flops_per_sample = fps;
    cm_model *m;
    cr_assert_eq(cm_model_classifier_new(seq, &cc, &m), CM_OK, "%s", cm_last_error());
    return m;
}

static rig make(const rig_opts *o, cm_callback_plugin *cbs, int n_cbs) {
    rig g = {0};
    g.ds = cmt_synth_dataset(o->n, 8, 3, o->tokens, NULL);
    g.dl = cmt_loader(g.ds, o->batch, false, 7);
    if (o->eval_n) {
        g.eds = cmt_synth_dataset(o->eval_n, 8, 3, false, NULL);
        g.edl = cmt_loader(g.eds, 16, true, 0);
    }
    g.model = o->flops_per_sample > 0 ? mlp_with_flops(o->flops_per_sample) : cmt_mlp(8, 16, 3, 0, 3);
    cm_logger_plugin mp;
    cr_assert_eq(cm_in_memory_logger_new(&g.mem, &mp), CM_OK);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = g.model;
    c.train_dataloader = g.dl;
    c.eval_dataloader = g.edl;
    cr_assert_eq(cm_time_parse(o->max_duration, &c.max_duration), CM_OK);
    c.optimizer = o->optimizer;
    c.schedulers = o->sched;
    c.n_schedulers = o->sched ? 1 : 0;
    c.arena_budget = o->arena_budget;
    c.device_train_microbatch_size = o->mb;
    c.compute_training_metrics = o->train_metrics;
    c.loggers = &mp;
    c.n_loggers = 1;
    c.callbacks = cbs;
    c.n_callbacks = n_cbs;
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

static double last(const cm_in_memory_logger *m, const char *name) {
    double v = NAN;
    cr_assert_eq(cm_in_memory_logger_last(m, name, &v), CM_OK, "'%s' was never logged", name);
    return v;
}

/* The value of `name` logged at timestamp batch `batch` (NaN if none). */
static double at_batch(const cm_in_memory_logger *m, const char *name, int64_t batch) {
    for (int64_t i = 0; i < cm_in_memory_logger_n(m); i++) {
        const cm_log_record *r = cm_in_memory_logger_record(m, i);
        if (r->batch == batch && !strcmp(r->name, name)) return r->value;
    }
    return NAN;
}

static void expect_rel(const char *what, double got, double want, double rtol) {
    cr_expect(fabs(got - want) <= rtol * fabs(want), "%s: got %.17g, want %.17g (rtol %g)", what, got, want, rtol);
}

Test(speed_monitor, fit_logs_throughput_consistent_with_window_and_mfu_from_peak) {
    cm_speed_monitor_config sc = cm_speed_monitor_config_default();
    sc.window_size = 3;
    sc.peak_flops = 1e9;
    sc.time_unit = CM_WALL_SECONDS;
    cm_callback_plugin cb;
    cr_assert_eq(cm_speed_monitor_new(&sc, &cb), CM_OK);
    rig_opts o = defaults();
    o.tokens = true;
    o.flops_per_sample = 1000;
    rig g = make(&o, &cb, 1);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK, "%s", cm_last_error());
    /* 12 batches: the window of 3 fills at the 4th batch end. */
    cr_expect_eq(cm_in_memory_logger_count(g.mem, "throughput/samples_per_sec"), 12 - 3);
    cr_expect_eq(cm_in_memory_logger_count(g.mem, "wall_clock/train"), 12);
    const double bps = last(g.mem, "throughput/batches_per_sec"), sps = last(g.mem, "throughput/samples_per_sec");
    cr_expect_gt(bps, 0);
    expect_rel("samples/s = 8 × batches/s", sps, 8 * bps, 1e-12);
    expect_rel("device samples/s (world 1)", last(g.mem, "throughput/device/samples_per_sec"), sps, 0);
    const double tps = last(g.mem, "throughput/tokens_per_sec");
    cr_expect_gt(tps, sps, "tokens/s %g should exceed samples/s %g (1..5 tokens a sample)", tps, sps);
    const double fl = last(g.mem, "throughput/flops_per_sec");
    expect_rel("flops/s = 1000 × samples/s", fl, 1000 * sps, 1e-12);
    expect_rel("device/mfu = flops/s / peak", last(g.mem, "throughput/device/mfu"), fl / 1e9, 1e-12);
    expect_rel("mfu = device/mfu", last(g.mem, "throughput/mfu"), fl / 1e9, 1e-12);
    /* The window: Δbatches / Δwall-clock over the last 3 batches, wall_clock/train being total_wct. */
    const double w12 = at_batch(g.mem, "wall_clock/train", 12), w9 = at_batch(g.mem, "wall_clock/train", 9);
    expect_rel("batches/s over the window", bps, 3 / (w12 - w9), 1e-9);
    expect_rel("wall_clock/train is the timestamp's total_wct", w12, cm_state_timestamp(cm_trainer_state(g.tr))->total_wct,
               1e-12);
    cr_expect_eq(last(g.mem, "wall_clock/val"), 0);
    /* a second fit from time zero starts a new window: 4 more batch ends before it logs again */
    cm_fit_opts fo = cm_fit_opts_default();
    fo.reset_time = true;
    fo.duration = cm_time_make(5, CM_TIME_BATCH);
    cr_assert_eq(cm_trainer_fit(g.tr, &fo), CM_OK, "%s", cm_last_error());
    cr_expect_eq(cm_in_memory_logger_count(g.mem, "throughput/samples_per_sec"), 12 - 3 + 5 - 3);
    cr_expect_gt(last(g.mem, "throughput/samples_per_sec"), 0);
    unmake(&g);
}

Test(speed_monitor, no_flops_keys_without_a_model_flop_count_and_no_tokens_keys_without_tokens) {
    cm_speed_monitor_config sc = cm_speed_monitor_config_default();
    sc.window_size = 2;
    sc.peak_flops = -1;
    cm_callback_plugin cb;
    cr_assert_eq(cm_speed_monitor_new(&sc, &cb), CM_OK);
    rig_opts o = defaults();
    o.max_duration = "4ba";
    rig g = make(&o, &cb, 1);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_expect_eq(cm_in_memory_logger_count(g.mem, "throughput/samples_per_sec"), 2);
    cr_expect_eq(cm_in_memory_logger_count(g.mem, "throughput/tokens_per_sec"), 0);
    cr_expect_eq(cm_in_memory_logger_count(g.mem, "throughput/flops_per_sec"), 0);
    cr_expect_eq(cm_in_memory_logger_count(g.mem, "throughput/mfu"), 0);
    unmake(&g);
}

Test(speed_monitor, flops_without_peak_log_flops_but_no_mfu) {
    cm_speed_monitor_config sc = cm_speed_monitor_config_default();
    sc.window_size = 1;
    sc.peak_flops = -1;
    cm_callback_plugin cb;
    cr_assert_eq(cm_speed_monitor_new(&sc, &cb), CM_OK);
    rig_opts o = defaults();
    o.max_duration = "3ba";
    o.flops_per_sample = 50;
    rig g = make(&o, &cb, 1);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_expect_eq(cm_in_memory_logger_count(g.mem, "throughput/flops_per_sec"), 2);
    cr_expect_eq(cm_in_memory_logger_count(g.mem, "throughput/device/mfu"), 0);
    unmake(&g);
}

Test(peak_flops, env_variable_sets_the_peak_and_a_bad_one_is_refused) {
    setenv("CM_PEAK_FLOPS", "2.5e9", 1);
    double p = 0;
    cr_assert_eq(cm_peak_flops(&p), CM_OK, "%s", cm_last_error());
    cr_expect_eq(p, 2.5e9);
    setenv("CM_PEAK_FLOPS", "fast", 1);
    cr_expect_eq(cm_peak_flops(&p), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "CM_PEAK_FLOPS='fast'"), "message: %s", cm_last_error());
    setenv("CM_PEAK_FLOPS", "-3", 1);
    cr_expect_eq(cm_peak_flops(&p), CM_ERR_INVALID_ARG);
}

Test(peak_flops, measured_peak_is_positive_and_cached) {
    unsetenv("CM_PEAK_FLOPS");
    double a = 0, b = 0;
    cr_assert_eq(cm_peak_flops(&a), CM_OK);
    cr_assert_eq(cm_peak_flops(&b), CM_OK);
    /* positive (the bound allows an unoptimised sanitizer build); the second call reads the cache */
    cr_expect_gt(a, 1e6, "measured peak %g FLOP/s", a);
    cr_expect_eq(a, b);
}

/* cm_peak_flops_measure measures on every call: positive, ignoring CM_PEAK_FLOPS, and each call,
 * also after cm_peak_flops has cached its value, runs the FMA loops again — milliseconds (24 rounds
 * of at least 240k FMA instructions per thread), where returning a cached value takes nanoseconds.
 * (Equal values do not show a cache: on a quiet core the best round's time repeats to the
 * nanosecond, so three measurements can agree.) */
Test(peak_flops, measure_takes_a_new_measurement_every_call) {
    unsetenv("CM_PEAK_FLOPS");
    double cached = 0;
    cr_assert_eq(cm_peak_flops(&cached), CM_OK, "%s", cm_last_error());
    setenv("CM_PEAK_FLOPS", "2.5e9", 1);
    for (int k = 0; k < 3; k++) {
        double a = 0;
        const double t0 = cm_clock_s();
        cr_assert_eq(cm_peak_flops_measure(&a), CM_OK, "%s", cm_last_error());
        const double dt = cm_clock_s() - t0;
        cr_expect(a > 1e6 && a != 2.5e9, "measured %g FLOP/s, not the environment's", a);
        cr_expect(dt > 1e-3, "call %d took %.3g s: too short to have measured anything", k, dt);
    }
    cr_expect_eq(cm_peak_flops_measure(NULL), CM_ERR_INVALID_ARG);
}

Test(lr_monitor, logs_each_batch_lr_following_the_scheduler) {
    cm_callback_plugin cb;
    cr_assert_eq(cm_lr_monitor_new(&cb), CM_OK);
    cm_sched_config lin = cm_sched_config_default(CM_SCHED_LINEAR);
    rig_opts o = defaults();
    o.max_duration = "4ba";
    o.sched = &lin;
    rig g = make(&o, &cb, 1);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK, "%s", cm_last_error());
    const char *key = "lr-DecoupledSGDW/group0";
    cr_expect_eq(cm_in_memory_logger_count(g.mem, key), 4);
    for (int64_t b = 1; b <= 4; b++) { /* batch b-1 trained with 0.1 · (1 - (b-1)/4) */
        const double want = 0.1 * (1.0 - (double)(b - 1) / 4.0);
        const double got = at_batch(g.mem, key, b);
        cr_expect(fabs(got - want) < 1e-15, "batch %lld: lr %.17g, want %.17g", (long long)b, got, want);
    }
    unmake(&g);
}

Test(lr_monitor, names_every_group_by_the_optimizer_class) {
    cr_expect_str_eq(cm_optim_class_name(CM_OPTIM_DECOUPLED_ADAMW), "DecoupledAdamW");
    cr_expect_str_eq(cm_optim_class_name(CM_OPTIM_SGD), "SGD");
    cr_expect_str_eq(cm_optim_class_name(CM_OPTIM_ADAMW), "AdamW");
    cr_expect_str_eq(cm_optim_class_name((cm_optim_kind)99), "?");
    /* two groups over a hand-made state */
    float w[4] = {0}, gr[4] = {0};
    cm_optim *opt;
    cr_assert_eq(cm_optim_new(CM_OPTIM_ADAM, &opt), CM_OK);
    cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_ADAM);
    cm_optim_span s0 = {"a", w, gr, 2}, s1 = {"b", w + 2, gr + 2, 2};
    cr_assert_eq(cm_optim_add_group(opt, &hp, &s0, 1), CM_OK);
    hp.lr = 0.5;
    cr_assert_eq(cm_optim_add_group(opt, &hp, &s1, 1), CM_OK);
    cm_state *st;
    cr_assert_eq(cm_state_new(&st), CM_OK);
    st->optimizer = opt;
    st->lr_multiplier = 0.25;
    cm_engine *e;
    cr_assert_eq(cm_engine_new(st, &e), CM_OK);
    cm_in_memory_logger *mem;
    cm_logger_plugin mp;
    cm_callback_plugin cb;
    cr_assert_eq(cm_in_memory_logger_new(&mem, &mp), CM_OK);
    cr_assert_eq(cm_engine_add_logger(e, mp), CM_OK);
    cr_assert_eq(cm_lr_monitor_new(&cb), CM_OK);
    cr_assert_eq(cm_engine_add_callback(e, cb), CM_OK);
    cr_assert_eq(cm_engine_run_event(e, CM_EVENT_BATCH_END), CM_OK, "%s", cm_last_error());
    cr_expect_eq(last(mem, "lr-Adam/group0"), 1e-3 * 0.25);
    cr_expect_eq(last(mem, "lr-Adam/group1"), 0.5 * 0.25);
    cm_engine_free(e);
    cm_state_free(st);
    cm_optim_free(opt);
}

Test(memory_monitor, logs_positive_rss_and_arena_use) {
    cm_callback_plugin cb;
    cr_assert_eq(cm_memory_monitor_new(&cb), CM_OK);
    rig_opts o = defaults();
    o.max_duration = "3ba";
    o.arena_budget = 64 << 20;
    o.mb = 4; /* two microbatches a batch */
    rig g = make(&o, &cb, 1);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_expect_eq(cm_in_memory_logger_count(g.mem, "memory/rss_bytes"), 3);
    const double rss = last(g.mem, "memory/rss_bytes"), peak = last(g.mem, "memory/peak_rss_bytes");
    const double ab = last(g.mem, "memory/arena_bytes"), ap = last(g.mem, "memory/arena_peak_bytes");
    cr_expect_gt(rss, 1 << 20, "rss %g bytes", rss);
    cr_expect_geq(peak, rss, "peak rss %g < rss %g", peak, rss);
    cr_expect_gt(ab, 0, "arena bytes %g", ab);
    cr_expect_geq(ap, ab, "arena peak %g < arena bytes %g", ap, ab);
    cr_expect_eq(last(g.mem, "memory/arena_budget_bytes"), (double)(64 << 20));
    int64_t r, p;
    cm_process_memory(&r, &p);
    cr_expect_gt(r, 0);
    cr_expect_geq(p, r);
    unmake(&g);
}

/* The optimizer the trainer would build, as DecoupledAdamW: one span per unit, named after it. */
static cm_optim *unit_adamw(cm_model *m, cm_optim_kind kind, double wd) {
    cm_module *root = cm_model_module(m);
    cm_optim *opt;
    cr_assert_eq(cm_optim_new(kind, &opt), CM_OK);
    cm_optim_span spans[8];
    int n = cm_module_n_units(root);
    cr_assert_leq(n, 8);
    for (int i = 0; i < n; i++) {
        const cm_unit_info *u = cm_module_unit(root, i);
        spans[i] = (cm_optim_span){u->name, u->params, u->grads, u->numel};
    }
    cm_optim_hparams hp = cm_optim_hparams_default(kind);
    hp.lr = 0.01;
    hp.weight_decay = wd;
    cr_assert_eq(cm_optim_add_group(opt, &hp, spans, n), CM_OK, "%s", cm_last_error());
    return opt;
}

static void check_optimizer_norms(cm_optim_kind kind, double wd) {
    cm_callback_plugin cb;
    cr_assert_eq(cm_optimizer_monitor_new(NULL, &cb), CM_OK);
    rig_opts oo = defaults();
    oo.max_duration = "3ba";
    {
        /* the model first, so the optimizer can span its units */
        cm_callback_plugin none[1] = {cb};
        rig g = {0};
        g.model = cmt_mlp(8, 16, 3, 0, 3);
        cm_optim *opt = unit_adamw(g.model, kind, wd);
        g.ds = cmt_synth_dataset(oo.n, 8, 3, false, NULL);
        g.dl = cmt_loader(g.ds, oo.batch, false, 7);
        cm_logger_plugin mp;
        cr_assert_eq(cm_in_memory_logger_new(&g.mem, &mp), CM_OK);
        cm_trainer_config c = cm_trainer_config_default();
        c.model = g.model;
        c.train_dataloader = g.dl;
        cr_assert_eq(cm_time_parse(oo.max_duration, &c.max_duration), CM_OK);
        c.optimizer = opt;
        c.loggers = &mp;
        c.n_loggers = 1;
        c.callbacks = none;
        c.n_callbacks = 1;
        cr_assert_eq(cm_trainer_new(&c, &g.tr), CM_OK, "%s", cm_last_error());
        cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK, "%s", cm_last_error());

        /* After the fit the gradients and the state are those of the last BATCH_END. */
        cm_module *root = cm_model_module(g.model);
        cm_optim_hparams hp;
        cr_assert_eq(cm_optim_group_get(opt, 0, &hp), CM_OK);
        double global = 0;
        int checked = 0;
        for (int64_t i = 0; i < cm_module_n_params(root); i++) {
            cm_param_info p = cm_module_param_info(root, i);
            const cm_unit_info *u = cm_module_unit(root, p.unit);
            const float *gr = u->grads + p.offset, *w = u->params + p.offset;
            char key[256], sname[128];
            snprintf(sname, sizeof sname, "%s.exp_avg", u->name);
            cm_optim_state_entry em, ev, es;
            cr_assert_eq(cm_optim_state_find(opt, sname, &em), CM_OK);
            snprintf(sname, sizeof sname, "%s.exp_avg_sq", u->name);
            cr_assert_eq(cm_optim_state_find(opt, sname, &ev), CM_OK);
            snprintf(sname, sizeof sname, "%s.step", u->name);
            cr_assert_eq(cm_optim_state_find(opt, sname, &es), CM_OK);
            const float *m = (const float *)em.data + p.offset, *v = (const float *)ev.data + p.offset;
            const double t = (double)*(int64_t *)es.data;
            cr_assert_eq(t, 3);
            const double bc1 = 1 - pow(hp.beta1, t), bc2 = 1 - pow(hp.beta2, t);
            double gg = 0, pp = 0, mm = 0, vv = 0, uu = 0, gu = 0;
            for (int64_t k = 0; k < p.numel; k++) {
                double upd = (hp.lr / bc1) * m[k] / (sqrt((double)v[k]) / sqrt(bc2) + hp.eps);
                if (kind == CM_OPTIM_DECOUPLED_ADAMW) upd += hp.weight_decay * 1.0 * w[k];
                if (kind == CM_OPTIM_ADAMW) upd += hp.lr * hp.weight_decay * w[k];
                gg += (double)gr[k] * gr[k], pp += (double)w[k] * w[k], mm += (double)m[k] * m[k];
                vv += (double)v[k] * v[k], uu += upd * upd, gu += gr[k] * upd;
            }
            global += gg;
            snprintf(key, sizeof key, "l2_norm/grad/%s", p.name);
            expect_rel(key, last(g.mem, key), sqrt(gg), 1e-12);
            snprintf(key, sizeof key, "l2_norm/param/%s", p.name);
            expect_rel(key, last(g.mem, key), sqrt(pp), 1e-12);
            snprintf(key, sizeof key, "l2_norm/moment/%s", p.name);
            expect_rel(key, last(g.mem, key), sqrt(mm), 1e-12);
            snprintf(key, sizeof key, "l2_norm/second_moment_sqrt/%s", p.name);
            expect_rel(key, last(g.mem, key), sqrt(sqrt(vv)), 1e-12);
            snprintf(key, sizeof key, "l2_norm/update/%s", p.name);
            expect_rel(key, last(g.mem, key), sqrt(uu), 1e-9);
            snprintf(key, sizeof key, "cosine/update_grad/%s", p.name);
            expect_rel(key, last(g.mem, key), gu / (sqrt(gg) * sqrt(uu)), 1e-9);
            checked++;
        }
        cr_expect_eq(checked, 4, "the MLP has 4 parameters, checked %d", checked);
        cr_expect_gt(global, 0);
        expect_rel("l2_norm/grad/global", last(g.mem, "l2_norm/grad/global"), sqrt(global), 1e-12);
        cr_expect_eq(cm_in_memory_logger_count(g.mem, "l2_norm/grad/global"), 3);
        unmake(&g);
        cm_optim_free(opt);
    }
}

Test(optimizer_monitor, norms_equal_hand_computed_ones_decoupled_adamw) { check_optimizer_norms(CM_OPTIM_DECOUPLED_ADAMW, 1e-2); }
Test(optimizer_monitor, norms_equal_hand_computed_ones_adamw) { check_optimizer_norms(CM_OPTIM_ADAMW, 1e-2); }

Test(optimizer_monitor, default_sgd_logs_grad_and_param_norms_only_and_honours_interval) {
    cm_optimizer_monitor_config oc = cm_optimizer_monitor_config_default();
    oc.batch_log_interval = 2;
    cm_callback_plugin cb;
    cr_assert_eq(cm_optimizer_monitor_new(&oc, &cb), CM_OK);
    rig_opts o = defaults();
    o.max_duration = "5ba";
    rig g = make(&o, &cb, 1);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_expect_eq(cm_in_memory_logger_count(g.mem, "l2_norm/grad/global"), 2, "batches 2 and 4");
    cr_expect_eq(cm_in_memory_logger_count(g.mem, "l2_norm/param/0.weight"), 2);
    cr_expect_eq(cm_in_memory_logger_count(g.mem, "l2_norm/moment/0.weight"), 0, "SGD without momentum has no moment");
    cr_expect(!isnan(at_batch(g.mem, "l2_norm/grad/global", 4)));
    unmake(&g);
}

/* ---------------------------------------------------------------------------------------------
 * A state driven by hand, with a fake clock and scripted metrics
 * ------------------------------------------------------------------------------------------- */

static double fake_now;
static double fake_clock(void *data) { return fake_now; }

static double fake_compute(const void *self, const double *state) { return state[0]; }
static const cm_metric_i acc_vt = {CM_METRIC_ABI, "MulticlassAccuracy", 1, NULL, fake_compute};
static const cm_metric_i ce_vt = {CM_METRIC_ABI, "CrossEntropy", 1, NULL, fake_compute};

typedef struct {
    cm_state *st;
    cm_engine *e;
    cm_in_memory_logger *mem;
    cm_metric metrics[2];
    double values[2];
    cm_metric_set sets[2]; /* "train", "eval" */
} hand;

static void hand_init(hand *h, cm_callback_plugin cb) {
    memset(h, 0, sizeof *h);
    cr_assert_eq(cm_state_new(&h->st), CM_OK);
    cr_assert_eq(cm_engine_new(h->st, &h->e), CM_OK);
    cm_logger_plugin mp;
    cr_assert_eq(cm_in_memory_logger_new(&h->mem, &mp), CM_OK);
    cr_assert_eq(cm_engine_add_logger(h->e, mp), CM_OK);
    cr_assert_eq(cm_engine_add_callback(h->e, cb), CM_OK);
    h->metrics[0] = (cm_metric){&acc_vt, NULL};
    h->metrics[1] = (cm_metric){&ce_vt, NULL};
    for (int i = 0; i < 2; i++) {
        snprintf(h->sets[i].label, sizeof h->sets[i].label, "%s", i ? "eval" : "train");
        h->sets[i].n = 2;
        h->sets[i].metrics = h->metrics;
        h->sets[i].values = h->values;
        h->sets[i].computed = true;
    }
    h->st->metric_sets = h->sets;
    h->st->n_metric_sets = 2;
    snprintf(h->st->dl_label, sizeof h->st->dl_label, "train");
    fake_now = 100;
}

static void hand_free(hand *h) {
    cm_engine_free(h->e);
    cm_state_free(h->st);
}

static void ev(hand *h, cm_event e) { cr_assert_eq(cm_engine_run_event(h->e, e), CM_OK, "%s", cm_last_error()); }

/* One training batch of 8 samples and 40 tokens taking `secs` on the fake clock. */
static void hand_batch(hand *h, double secs) {
    ev(h, CM_EVENT_BATCH_START);
    fake_now += secs;
    cm_timestamp_next_batch(&h->st->ts, 8, 40, secs);
    ev(h, CM_EVENT_BATCH_END);
}

/* An evaluation labelled "eval" with the given accuracy, taking `secs`. */
static void hand_eval(hand *h, double acc, double secs) {
    snprintf(h->st->dl_label, sizeof h->st->dl_label, "eval");
    ev(h, CM_EVENT_EVAL_START);
    fake_now += secs;
    h->values[0] = acc;
    ev(h, CM_EVENT_EVAL_END);
    snprintf(h->st->dl_label, sizeof h->st->dl_label, "train");
}

Test(speed_monitor, fake_clock_gives_exact_throughput_and_wall_clock_split) {
    cm_speed_monitor_config sc = cm_speed_monitor_config_default();
    sc.window_size = 2;
    sc.clock = fake_clock;
    hand h;
    cm_callback_plugin cb;
    cr_assert_eq(cm_speed_monitor_new(&sc, &cb), CM_OK);
    hand_init(&h, cb);
    h.st->world_size = 2;
    hand_batch(&h, 0.5);
    hand_batch(&h, 0.5);
    cr_expect_eq(cm_in_memory_logger_count(h.mem, "throughput/samples_per_sec"), 0, "window not full yet");
    hand_eval(&h, 0.5, 36.0);
    hand_batch(&h, 0.25);
    /* window: batches 2 and 3 in 0.75 s */
    expect_rel("batches/s", last(h.mem, "throughput/batches_per_sec"), 2 / 0.75, 1e-12);
    expect_rel("samples/s", last(h.mem, "throughput/samples_per_sec"), 16 / 0.75, 1e-12);
    expect_rel("tokens/s", last(h.mem, "throughput/tokens_per_sec"), 80 / 0.75, 1e-12);
    expect_rel("device samples/s", last(h.mem, "throughput/device/samples_per_sec"), 8 / 0.75, 1e-12);
    expect_rel("wall_clock/train (h)", last(h.mem, "wall_clock/train"), 1.25 / 3600, 1e-12);
    expect_rel("wall_clock/val (h)", last(h.mem, "wall_clock/val"), 36.0 / 3600, 1e-12);
    expect_rel("wall_clock/total (h)", last(h.mem, "wall_clock/total"), 37.25 / 3600, 1e-12);

    /* save, load into a fresh monitor: the next batch logs what the original would */
    const cm_callback_plugin reg = cm_engine_callback(h.e, 0);
    char buf[1024];
    size_t n = reg.vt->save(reg.self, buf, sizeof buf);
    cr_assert(n > 0 && n < sizeof buf);
    cm_callback_plugin cb2;
    cr_assert_eq(cm_speed_monitor_new(&sc, &cb2), CM_OK);
    cr_assert_eq(cb2.vt->load(cb2.self, buf, n), CM_OK, "%s", cm_last_error());
    char buf2[1024];
    cr_expect_eq(cb2.vt->save(cb2.self, buf2, sizeof buf2), n);
    cr_expect_str_eq(buf2, buf);
    cr_expect_eq(cb2.vt->load(cb2.self, "{\"window\": 3}", 13), CM_ERR_FORMAT);
    cr_expect_eq(cb2.vt->load(cb2.self, "not json", 8), CM_ERR_FORMAT);
    cr_expect_eq(cb2.vt->load(cb2.self, "{\"total_eval_wct\": 1, \"window\": [[1,2,3]]}", 42), CM_ERR_FORMAT);
    /* a failed load changes nothing */
    cr_expect_eq(cb2.vt->save(cb2.self, buf2, sizeof buf2), n);
    cr_expect_str_eq(buf2, buf);
    /* a save into a short buffer says how much it needs and stays terminated */
    char small[8];
    cr_expect_eq(cb2.vt->save(cb2.self, small, sizeof small), n);
    cr_expect_eq(strlen(small), 7);
    cm_callback_plugin_free(cb2);
    hand_free(&h);
}

Test(runtime_estimator, fake_clock_estimate_counts_batches_and_evals_left) {
    cm_runtime_estimator_config rc = cm_runtime_estimator_config_default();
    rc.clock = fake_clock;
    rc.time_unit = CM_WALL_SECONDS;
    hand h;
    cm_callback_plugin cb;
    cr_assert_eq(cm_runtime_estimator_new(&rc, &cb), CM_OK);
    hand_init(&h, cb);
    h.st->max_duration = cm_time_make(10, CM_TIME_BATCH);
    ev(&h, CM_EVENT_FIT_START);
    cr_expect_str_eq(cm_in_memory_logger_hparam(h.mem, "time/remaining_estimate_unit"), "seconds");
    hand_batch(&h, 1.0); /* skipped */
    cr_expect_eq(cm_in_memory_logger_count(h.mem, "time/remaining_estimate"), 0);
    hand_batch(&h, 1.0); /* clock started at f = 0.1; now f = 0.2 after 1 s */
    expect_rel("8 batches of 1 s left", last(h.mem, "time/remaining_estimate"), 8.0, 1e-12);
    hand_batch(&h, 1.0);
    hand_batch(&h, 1.0);
    hand_batch(&h, 1.0); /* f = 0.5 */
    hand_eval(&h, 0.5, 2.0);
    hand_batch(&h, 1.0); /* f = 0.6: 4 s of batches; one eval per half of the run: one more of 2 s */
    expect_rel("batches + evals left", last(h.mem, "time/remaining_estimate"), 4.0 + 2.0, 1e-12);
    for (int i = 0; i < 4; i++) hand_batch(&h, 1.0);
    expect_rel("only the last eval left", last(h.mem, "time/remaining_estimate"), 2.0, 1e-12);
    cr_expect_eq(cm_in_memory_logger_count(h.mem, "time/remaining_estimate"), 9);
    hand_free(&h);
}

Test(runtime_estimator, hours_by_default_and_silent_without_max_duration) {
    hand h;
    cm_callback_plugin cb;
    cm_runtime_estimator_config rc = cm_runtime_estimator_config_default();
    rc.clock = fake_clock;
    rc.skip_batches = 0;
    cr_assert_eq(cm_runtime_estimator_new(&rc, &cb), CM_OK);
    hand_init(&h, cb);
    hand_batch(&h, 1.0);
    hand_batch(&h, 1.0);
    cr_expect_eq(cm_in_memory_logger_count(h.mem, "time/remaining_estimate"), 0);
    hand_free(&h);

    cr_assert_eq(cm_runtime_estimator_new(&rc, &cb), CM_OK);
    hand_init(&h, cb);
    h.st->max_duration = cm_time_make(2, CM_TIME_EPOCH);
    h.st->batches_per_epoch = 4;
    hand_batch(&h, 3.0); /* f = 1/8 after 3 s: 7 × 3 s left */
    expect_rel("hours", last(h.mem, "time/remaining_estimate"), 21.0 / 3600, 1e-12);
    hand_free(&h);
}

Test(runtime_estimator, fit_logs_positive_estimates) {
    cm_callback_plugin cb;
    cr_assert_eq(cm_runtime_estimator_new(NULL, &cb), CM_OK);
    rig_opts o = defaults();
    o.eval_n = 16;
    rig g = make(&o, &cb, 1);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_expect_eq(cm_in_memory_logger_count(g.mem, "time/remaining_estimate"), 11, "12 batches, the first skipped");
    for (int64_t b = 2; b <= 12; b++) {
        const double r = at_batch(g.mem, "time/remaining_estimate", b);
        cr_expect(isfinite(r) && r >= 0, "estimate at batch %lld: %g", (long long)b, r);
    }
    /* at the last batch end only the final evaluation is left: well under a second here */
    cr_expect_lt(last(g.mem, "time/remaining_estimate"), 1.0 / 3600, "%g h", last(g.mem, "time/remaining_estimate"));
    unmake(&g);
}

/* Runs one epoch end + eval with the given accuracy and returns whether a stop was requested. */
static bool epoch_eval(hand *h, double acc) {
    cm_timestamp_next_batch(&h->st->ts, 8, 0, 0.1);
    cm_timestamp_next_epoch(&h->st->ts, 0);
    ev(h, CM_EVENT_EPOCH_END);
    hand_eval(h, acc, 0.1);
    return cm_state_stop_requested(h->st);
}

Test(early_stopper, stops_after_patience_epochs_without_improvement) {
    cm_early_stopper_config ec = cm_early_stopper_config_default();
    ec.monitor = "MulticlassAccuracy";
    cr_assert_eq(cm_time_parse("2ep", &ec.patience), CM_OK);
    hand h;
    cm_callback_plugin cb;
    cr_assert_eq(cm_early_stopper_new(&ec, &cb), CM_OK);
    hand_init(&h, cb);
    const double accs[] = {0.5, 0.6, 0.6, 0.55, 0.6, 0.7};
    int stopped_at = -1;
    for (int i = 0; i < 6 && stopped_at < 0; i++)
        if (epoch_eval(&h, accs[i])) stopped_at = i + 1;
    /* best 0.6 at epoch 2; epochs 3 and 4 are 1 and 2 epochs later (not > 2); epoch 5 stops */
    cr_expect_eq(stopped_at, 5, "stopped at epoch %d", stopped_at);

    /* the state survives save/load */
    const cm_callback_plugin reg = cm_engine_callback(h.e, 0);
    char buf[256];
    size_t n = reg.vt->save(reg.self, buf, sizeof buf);
    cr_assert(n > 0 && n < sizeof buf);
    cm_callback_plugin cb2;
    cr_assert_eq(cm_early_stopper_new(&ec, &cb2), CM_OK);
    cr_assert_eq(cb2.vt->load(cb2.self, buf, n), CM_OK, "%s", cm_last_error());
    char buf2[256];
    cb2.vt->save(cb2.self, buf2, sizeof buf2);
    cr_expect_str_eq(buf2, buf);
    cr_expect(strstr(buf, "\"best_epoch\":2"), "saved: %s", buf);
    cr_expect_eq(cb2.vt->load(cb2.self, "{\"best\": 1}", 11), CM_ERR_FORMAT);
    cr_expect_eq(cb2.vt->load(cb2.self, "[]", 2), CM_ERR_FORMAT);
    cm_callback_plugin_free(cb2);
    hand_free(&h);
}

Test(early_stopper, loss_like_metric_is_minimised_and_min_delta_counts) {
    cr_expect_eq(cm_comp_for_metric("CrossEntropy"), CM_COMP_LESS);
    cr_expect_eq(cm_comp_for_metric("LanguagePerplexity"), CM_COMP_LESS);
    cr_expect_eq(cm_comp_for_metric("loss/train/total"), CM_COMP_LESS);
    cr_expect_eq(cm_comp_for_metric("MulticlassAccuracy"), CM_COMP_GREATER);
    cm_early_stopper_config ec = cm_early_stopper_config_default();
    ec.monitor = "CrossEntropy";
    ec.min_delta = -0.05; /* its absolute value */
    ec.patience = cm_time_make(1, CM_TIME_EPOCH);
    hand h;
    cm_callback_plugin cb;
    cr_assert_eq(cm_early_stopper_new(&ec, &cb), CM_OK);
    hand_init(&h, cb);
    /* CrossEntropy is values[1] */
    const double ces[] = {2.0, 1.5, 1.47, 1.46};
    int stopped_at = -1;
    for (int i = 0; i < 4 && stopped_at < 0; i++) {
        h.values[1] = ces[i];
        if (epoch_eval(&h, 0)) stopped_at = i + 1;
    }
    /* 1.47 and 1.46 are within min_delta of 1.5 (epoch 2): epoch 4 is 2 > 1 epochs later */
    cr_expect_eq(stopped_at, 4, "stopped at epoch %d", stopped_at);
    hand_free(&h);
}

Test(early_stopper, batch_patience_on_train_metric_checks_every_batch) {
    cm_early_stopper_config ec = cm_early_stopper_config_default();
    ec.monitor = "MulticlassAccuracy";
    ec.dataloader_label = "train";
    cr_assert_eq(cm_time_parse("3ba", &ec.patience), CM_OK);
    hand h;
    cm_callback_plugin cb;
    cr_assert_eq(cm_early_stopper_new(&ec, &cb), CM_OK);
    hand_init(&h, cb);
    const double accs[] = {0.1, 0.3, 0.2, 0.2, 0.3, 0.25, 0.9};
    int stopped_at = -1;
    for (int i = 0; i < 7 && stopped_at < 0; i++) {
        h.values[0] = accs[i];
        hand_batch(&h, 0.1);
        if (cm_state_stop_requested(h.st)) stopped_at = i + 1;
    }
    /* best 0.3 at batch 2 (0.3 again at 5 is no improvement); batch 6 is 4 > 3 batches later */
    cr_expect_eq(stopped_at, 6, "stopped at batch %d", stopped_at);
    hand_free(&h);
}

Test(early_stopper, unknown_metric_fails_the_fit_naming_it) {
    cm_early_stopper_config ec = cm_early_stopper_config_default();
    ec.monitor = "Accuracy";
    cm_callback_plugin cb;
    cr_assert_eq(cm_early_stopper_new(&ec, &cb), CM_OK);
    rig_opts o = defaults();
    o.eval_n = 16;
    rig g = make(&o, &cb, 1);
    cr_expect_eq(cm_trainer_fit(g.tr, NULL), CM_ERR_NOT_FOUND);
    const char *msg = cm_last_error();
    cr_expect(strstr(msg, "EarlyStopper") && strstr(msg, "'Accuracy'") && strstr(msg, "MulticlassAccuracy"),
              "message: %s", msg);
    unmake(&g);
}

/* A stopper watching a label no loader has would never stop: the fit fails at its start, naming
 * the labels there are (Composer's stoppers wait silently). */
Test(early_stopper, a_label_no_loader_has_fails_the_fit_naming_the_labels) {
    for (int k = 0; k < 2; k++) {
        cm_callback_plugin cb;
        if (k == 0) {
            cm_early_stopper_config ec = cm_early_stopper_config_default();
            ec.monitor = "MulticlassAccuracy";
            ec.dataloader_label = "eval/val";
            cr_assert_eq(cm_early_stopper_new(&ec, &cb), CM_OK);
        } else {
            cm_threshold_stopper_config tc = cm_threshold_stopper_config_default();
            tc.monitor = "MulticlassAccuracy";
            tc.threshold = 0.5;
            tc.dataloader_label = "evall";
            cr_assert_eq(cm_threshold_stopper_new(&tc, &cb), CM_OK);
        }
        rig_opts o = defaults();
        o.eval_n = 16;
        rig g = make(&o, &cb, 1);
        cr_expect_eq(cm_trainer_fit(g.tr, NULL), CM_ERR_INVALID_ARG);
        const char *msg = cm_last_error();
        const char *want = k ? "ThresholdStopper: dataloader_label 'evall'" : "EarlyStopper: dataloader_label 'eval/val'";
        cr_expect(strstr(msg, want) && strstr(msg, "(its labels: 'train', 'eval')"), "message: %s", msg);
        cr_expect_eq(cm_state_timestamp(cm_trainer_state(g.tr))->batch, 0, "trained before failing");
        unmake(&g);
    }
}

Test(early_stopper, fit_stops_early_on_eval_metric) {
    /* a learning rate of 0 keeps the eval accuracy constant: no improvement after the first eval */
    cm_early_stopper_config ec = cm_early_stopper_config_default();
    ec.monitor = "MulticlassAccuracy";
    ec.patience = cm_time_make(1, CM_TIME_EPOCH);
    cm_callback_plugin cb;
    cr_assert_eq(cm_early_stopper_new(&ec, &cb), CM_OK);
    cm_sched_config zero = cm_sched_config_default(CM_SCHED_CONSTANT);
    zero.alpha = 0;
    rig_opts o = defaults();
    o.eval_n = 16;
    o.max_duration = "10ep";
    o.sched = &zero;
    rig g = make(&o, &cb, 1);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_expect_eq(cm_state_timestamp(cm_trainer_state(g.tr))->epoch, 3, "best at epoch 1, stop at epoch 3");
    cr_expect_eq(cm_in_memory_logger_count(g.mem, "metrics/eval/MulticlassAccuracy"), 3);
    unmake(&g);
}

Test(threshold_stopper, stops_when_metric_passes_threshold) {
    cm_threshold_stopper_config tc = cm_threshold_stopper_config_default();
    tc.monitor = "MulticlassAccuracy";
    tc.threshold = 0.8;
    hand h;
    cm_callback_plugin cb;
    cr_assert_eq(cm_threshold_stopper_new(&tc, &cb), CM_OK);
    hand_init(&h, cb);
    cr_expect(!epoch_eval(&h, 0.5));
    cr_expect(!epoch_eval(&h, 0.8), "strictly greater");
    cr_expect(epoch_eval(&h, 0.81));
    hand_free(&h);

    tc.monitor = "CrossEntropy"; /* auto: less */
    tc.threshold = 1.0;
    cr_assert_eq(cm_threshold_stopper_new(&tc, &cb), CM_OK);
    hand_init(&h, cb);
    h.values[1] = 1.2;
    cr_expect(!epoch_eval(&h, 0));
    h.values[1] = 0.9;
    cr_expect(epoch_eval(&h, 0));
    hand_free(&h);
}

Test(threshold_stopper, stop_on_batch_ends_a_fit_after_the_first_batch) {
    cm_threshold_stopper_config tc = cm_threshold_stopper_config_default();
    tc.monitor = "MulticlassAccuracy";
    tc.dataloader_label = "train";
    tc.threshold = -1;
    tc.stop_on_batch = true;
    cm_callback_plugin cb;
    cr_assert_eq(cm_threshold_stopper_new(&tc, &cb), CM_OK);
    rig_opts o = defaults();
    o.train_metrics = true;
    rig g = make(&o, &cb, 1);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_expect_eq(cm_state_timestamp(cm_trainer_state(g.tr))->batch, 1);
    unmake(&g);
    /* training metrics off (the default): the stopper names the key, it does not wait forever */
    cr_assert_eq(cm_threshold_stopper_new(&tc, &cb), CM_OK);
    o.train_metrics = false;
    g = make(&o, &cb, 1);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_ERR_NOT_FOUND);
    cr_expect(strstr(cm_last_error(), "training metrics are off") &&
                  strstr(cm_last_error(), "set compute_training_metrics: true"),
              "%s", cm_last_error());
    cr_expect_eq(cm_state_timestamp(cm_trainer_state(g.tr))->batch, 1);
    unmake(&g);
}

/* ---------------------------------------------------------------------------------------------
 * Configuration errors and names
 * ------------------------------------------------------------------------------------------- */

Test(callbacks, bad_configs_are_refused_with_the_field_named) {
    cm_callback_plugin cb = {0};
    cm_speed_monitor_config sc = cm_speed_monitor_config_default();
    sc.window_size = 0;
    cr_expect_eq(cm_speed_monitor_new(&sc, &cb), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "window_size"), "%s", cm_last_error());
    sc = cm_speed_monitor_config_default();
    sc.peak_flops = NAN;
    cr_expect_eq(cm_speed_monitor_new(&sc, &cb), CM_ERR_INVALID_ARG);
    sc = cm_speed_monitor_config_default();
    sc.time_unit = (cm_wall_unit)7;
    cr_expect_eq(cm_speed_monitor_new(&sc, &cb), CM_ERR_INVALID_ARG);
    cr_expect_eq(cm_speed_monitor_new(NULL, NULL), CM_ERR_INVALID_ARG);

    cm_early_stopper_config ec = cm_early_stopper_config_default();
    cr_expect_eq(cm_early_stopper_new(&ec, &cb), CM_ERR_INVALID_ARG, "no monitor");
    cr_expect(strstr(cm_last_error(), "monitor"), "%s", cm_last_error());
    ec.monitor = "MulticlassAccuracy";
    cr_assert_eq(cm_time_parse("10sp", &ec.patience), CM_OK);
    cr_expect_eq(cm_early_stopper_new(&ec, &cb), CM_ERR_INVALID_ARG, "patience in samples");
    cr_expect(strstr(cm_last_error(), "patience"), "%s", cm_last_error());
    ec.patience = cm_time_make(1, CM_TIME_EPOCH);
    ec.dataloader_label = "";
    cr_expect_eq(cm_early_stopper_new(&ec, &cb), CM_ERR_INVALID_ARG);
    ec.dataloader_label = "eval";
    ec.comp = (cm_comp)9;
    cr_expect_eq(cm_early_stopper_new(&ec, &cb), CM_ERR_INVALID_ARG);

    cm_threshold_stopper_config tc = cm_threshold_stopper_config_default();
    tc.monitor = "MulticlassAccuracy";
    cr_expect_eq(cm_threshold_stopper_new(&tc, &cb), CM_ERR_INVALID_ARG, "threshold not set");
    cr_expect(strstr(cm_last_error(), "threshold"), "%s", cm_last_error());

    cm_runtime_estimator_config rc = cm_runtime_estimator_config_default();
    rc.skip_batches = -1;
    cr_expect_eq(cm_runtime_estimator_new(&rc, &cb), CM_ERR_INVALID_ARG);
    cm_optimizer_monitor_config oc = cm_optimizer_monitor_config_default();
    oc.batch_log_interval = 0;
    cr_expect_eq(cm_optimizer_monitor_new(&oc, &cb), CM_ERR_INVALID_ARG);
    cr_expect_eq(cm_lr_monitor_new(NULL), CM_ERR_INVALID_ARG);
    cr_expect_eq(cm_memory_monitor_new(NULL), CM_ERR_INVALID_ARG);
}

Test(callbacks, unit_and_comp_strings_parse_as_composer_writes_them) {
    cm_wall_unit u;
    cr_expect_eq(cm_wall_unit_parse("Minutes", &u), CM_OK);
    cr_expect_eq(u, CM_WALL_MINUTES);
    cr_expect_eq(cm_wall_unit_seconds(CM_WALL_DAYS), 86400);
    cr_expect_str_eq(cm_wall_unit_name(CM_WALL_HOURS), "hours");
    cr_expect_eq(cm_wall_unit_parse("fortnights", &u), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "seconds, minutes, hours or days"), "%s", cm_last_error());
    cm_comp c;
    cr_expect_eq(cm_comp_parse("gt", &c), CM_OK);
    cr_expect_eq(c, CM_COMP_GREATER);
    cr_expect_eq(cm_comp_parse("LESS", &c), CM_OK);
    cr_expect_eq(c, CM_COMP_LESS);
    cr_expect_eq(cm_comp_parse("ge", &c), CM_ERR_INVALID_ARG);
}

Test(callbacks, constructors_fail_cleanly_at_every_allocation) {
    for (int n = 1; n < 4; n++) {
        cm_callback_plugin cb;
        cm_early_stopper_config ec = cm_early_stopper_config_default();
        ec.monitor = "MulticlassAccuracy";
        cm_alloc_fail_at(n);
        cm_status s = cm_early_stopper_new(&ec, &cb);
        cm_alloc_fail_at(0);
        if (s == CM_OK) cm_callback_plugin_free(cb);
        else cr_expect_eq(s, CM_ERR_OOM);
        cm_alloc_fail_at(n);
        s = cm_speed_monitor_new(NULL, &cb);
        cm_alloc_fail_at(0);
        if (s == CM_OK) cm_callback_plugin_free(cb);
        else cr_expect_eq(s, CM_ERR_OOM);
    }
}
