/* The Trainer end to end on tiny models: training lowers the loss; microbatches give the full
 * batch's gradients (by samples and by tokens); same seed, same bits; fit twice equals fit once;
 * the loop equals a hand-written one (optimizer + scheduler); eval metrics ignore padding;
 * amp_bf16 trains; amp_fp16 is refused clearly; automatic microbatching shrinks on arena OOM
 * without changing the result; stop requests; configuration errors. */
#include "cmtest.h"
#include "cmtrain.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    cm_dataset *ds, *eds;
    cm_dataloader *dl, *edl;
    cm_model *model;
    cm_trainer *tr;
    cm_in_memory_logger *mem;
} rig;

typedef struct {
    int64_t n, batch, mb, eval_n;
    const char *max_duration;
    float dropout;
    uint64_t seed, data_seed;
    cm_precision precision;
    size_t arena_budget;
    bool no_plan; /* automatic microbatching without the pre-flight plan: the search alone */
    bool tokens;
    cm_model *model; /* optional: a ready model */
    cm_optim *optimizer;
    const cm_sched_config *sched;
    bool train_metrics; /* compute_training_metrics */
} rig_opts;

static rig_opts defaults(void) {
    return (rig_opts){.n = 48, .batch = 8, .mb = 0, .eval_n = 0, .max_duration = "2ep", .seed = 42, .data_seed = 7};
}

static rig make(const rig_opts *o) {
    rig g = {0};
    g.ds = cmt_synth_dataset(o->n, 8, 3, o->tokens, NULL);
    g.dl = cmt_loader(g.ds, o->batch, false, o->data_seed);
    if (o->eval_n) {
        g.eds = cmt_synth_dataset(o->eval_n, 8, 3, false, NULL);
        g.edl = cmt_loader(g.eds, 16, true, 0);
    }
    g.model = o->model ? o->model : cmt_mlp(8, 16, 3, o->dropout, 3);
    cm_logger_plugin mp;
    cr_assert_eq(cm_in_memory_logger_new(&g.mem, &mp), CM_OK);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = g.model;
    c.train_dataloader = g.dl;
    c.eval_dataloader = g.edl;
    if (o->max_duration) cr_assert_eq(cm_time_parse(o->max_duration, &c.max_duration), CM_OK);
    c.device_train_microbatch_size = o->mb;
    c.seed = o->seed;
    c.precision = o->precision;
    c.arena_budget = o->arena_budget;
    c.plan_memory = !o->no_plan;
    c.accumulate_train_batch_on_tokens = o->tokens;
    c.compute_training_metrics = o->train_metrics;
    c.optimizer = o->optimizer;
    c.schedulers = o->sched;
    c.n_schedulers = o->sched ? 1 : 0;
    c.loggers = &mp;
    c.n_loggers = 1;
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

static double first_loss(const cm_in_memory_logger *m) {
    for (int64_t i = 0; i < cm_in_memory_logger_n(m); i++)
        if (!strcmp(cm_in_memory_logger_record(m, i)->name, "loss/train/total"))
            return cm_in_memory_logger_record(m, i)->value;
    return NAN;
}

Test(trainer, mlp_loss_drops_and_metrics_are_logged) {
    rig_opts o = defaults();
    o.n = 96, o.eval_n = 40, o.max_duration = "10ep", o.train_metrics = true;
    rig g = make(&o);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK, "%s", cm_last_error());
    double last, acc, ce;
    cr_assert_eq(cm_in_memory_logger_last(g.mem, "loss/train/total", &last), CM_OK);
    double first = first_loss(g.mem);
    cr_expect_lt(last, 0.6 * first, "loss %g -> %g should drop by 40%%", first, last);
    cr_expect_eq(cm_in_memory_logger_count(g.mem, "loss/train/total"), 10 * 12);
    cr_assert_eq(cm_in_memory_logger_last(g.mem, "metrics/train/MulticlassAccuracy", &acc), CM_OK);
    cr_expect_eq(cm_in_memory_logger_count(g.mem, "metrics/train/MulticlassAccuracy"), 10 * 12, "one a batch");
    cr_assert_eq(cm_in_memory_logger_last(g.mem, "metrics/eval/MulticlassAccuracy", &acc), CM_OK);
    cr_assert_eq(cm_in_memory_logger_last(g.mem, "metrics/eval/CrossEntropy", &ce), CM_OK);
    cr_expect_gt(acc, 0.6, "eval accuracy %g", acc);
    cr_expect_eq(cm_in_memory_logger_count(g.mem, "metrics/eval/MulticlassAccuracy"), 10);
    double v;
    cr_assert_eq(cm_state_metric(cm_trainer_state(g.tr), "eval", "MulticlassAccuracy", &v), CM_OK);
    cr_expect_eq(v, acc);
    cr_expect_eq(cm_state_metric(cm_trainer_state(g.tr), "eval", "F1", &v), CM_ERR_NOT_FOUND);
    cr_expect_str_eq(cm_in_memory_logger_hparam(g.mem, "precision"), "fp32");
    cr_expect_eq(cm_in_memory_logger_last(g.mem, "time/batch", &v), CM_OK);
    cr_expect_eq(v, 119);
    unmake(&g);
}

/* Parameters of two runs agree within tol (0 = bitwise). */
static void expect_params(cm_model *a, cm_model *b, double tol, const char *what) {
    int64_t na, nb;
    float *pa = cmt_params_copy(a, &na), *pb = cmt_params_copy(b, &nb);
    cr_assert_eq(na, nb);
    if (tol == 0)
        cr_expect(memcmp(pa, pb, sizeof(float) * (size_t)na) == 0, "%s: parameters differ", what);
    else
        cmt_assert_close_f32(what, pa, pb, na, tol, 0);
    free(pa);
    free(pb);
}

/* Composer's default: compute_training_metrics false — no metrics/train/ values, the same losses
 * and weights as with them on, and cm_state_metric of "train" says why there is none. */
Test(trainer, training_metrics_are_off_by_default_and_change_nothing) {
    rig_opts o = defaults();
    o.n = 48, o.eval_n = 16, o.max_duration = "2ep";
    rig a = make(&o);
    o.train_metrics = true;
    rig b = make(&o);
    cr_assert_eq(cm_trainer_fit(a.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_fit(b.tr, NULL), CM_OK, "%s", cm_last_error());
    for (int64_t i = 0; i < cm_in_memory_logger_n(a.mem); i++)
        cr_expect(strncmp(cm_in_memory_logger_record(a.mem, i)->name, "metrics/train/", 14), "logged %s",
                  cm_in_memory_logger_record(a.mem, i)->name);
    cr_expect_gt(cm_in_memory_logger_count(b.mem, "metrics/train/MulticlassAccuracy"), 0);
    double x, y;
    cr_assert_eq(cm_in_memory_logger_last(a.mem, "loss/train/total", &x), CM_OK);
    cr_assert_eq(cm_in_memory_logger_last(b.mem, "loss/train/total", &y), CM_OK);
    cr_expect_eq(x, y, "the last loss differs: %.9g vs %.9g", x, y);
    cr_assert_eq(cm_in_memory_logger_last(a.mem, "metrics/eval/MulticlassAccuracy", &x), CM_OK);
    cr_assert_eq(cm_in_memory_logger_last(b.mem, "metrics/eval/MulticlassAccuracy", &y), CM_OK);
    cr_expect_eq(x, y);
    expect_params(a.model, b.model, 0, "training metrics on and off");
    cr_expect_eq(cm_state_metric(cm_trainer_state(a.tr), "train", "MulticlassAccuracy", &x), CM_ERR_NOT_FOUND);
    cr_expect(strstr(cm_last_error(), "training metrics are off"), "%s", cm_last_error());
    unmake(&a);
    unmake(&b);
}

/* Gradient accumulation is exact up to summation order: the microbatch gradients are summed in
 * a different order than one GEMM over the whole batch sums them, so the results differ in the
 * last bits, not in value (1e-6 after several steps). */
Test(trainer, microbatches_of_three_with_uneven_last_equal_the_full_batch) {
    rig_opts o = defaults();
    o.max_duration = "10ba";
    rig full = make(&o);
    o.mb = 3; /* 8 = 3 + 3 + 2 */
    rig micro = make(&o);
    cr_assert_eq(cm_trainer_fit(full.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_fit(micro.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_expect_eq(cm_state_n_microbatches(cm_trainer_state(micro.tr)), 3);
    expect_params(full.model, micro.model, 1e-6, "microbatch 3 vs full batch");
    double lf, lm;
    cm_in_memory_logger_last(full.mem, "loss/train/total", &lf);
    cm_in_memory_logger_last(micro.mem, "loss/train/total", &lm);
    cr_expect(fabs(lf - lm) < 1e-6, "batch loss %.9g vs %.9g", lf, lm);
    unmake(&full);
    unmake(&micro);
}

/* A model whose loss is the mean over tokens: Σ ntok·ce / Σ ntok. */
typedef struct {
    cm_module *net;
} tokmodel;
static cm_tensor *tm_forward(void *self, cm_tape *tp, const cm_model_batch *b) {
    return cm_module_forward(((tokmodel *)self)->net, tp, cm_model_batch_field(b, "input"));
}
static cm_tensor *tm_loss(void *self, cm_tape *tp, cm_tensor *out, const cm_model_batch *b) {
    cm_cross_entropy_opts co = cm_cross_entropy_opts_default();
    co.reduction = CM_REDUCTION_NONE;
    cm_tensor *ce = cm_cross_entropy(tp, out, cm_model_batch_field(b, "label"), &co);
    cm_tensor *w = cm_model_batch_field(b, "ntok");
    return cm_div(tp, cm_sum(tp, cm_mul(tp, ce, w), NULL, 0, false), cm_sum(tp, w, NULL, 0, false));
}
static cm_module *tm_module(void *self) { return ((tokmodel *)self)->net; }
static void tm_free(void *self) {
    cm_module_free(((tokmodel *)self)->net);
    free(self);
}
static const cm_model_i tm_vt = {CM_MODEL_ABI, "TokenMean", tm_forward, tm_loss, NULL, NULL, NULL, NULL, tm_module, tm_free};

static cm_model *token_model(void) {
    cm_model *mlp = cmt_mlp(8, 16, 3, 0, 3);
    tokmodel *t = calloc(1, sizeof *t);
    /* take the network out of the classifier: rebuild it with the same seed instead */
    cm_model_free(mlp);
    cm_rng rng = cm_rng_init(3, 0);
    cm_module *seq, *l1, *act, *l2;
    cm_nn_sequential_new(&seq);
    cm_nn_linear_new(8, 16, true, &rng, &l1);
    cm_nn_activation_new(CM_ACT_RELU, &act);
    cm_nn_linear_new(16, 3, true, &rng, &l2);
    cm_nn_sequential_append(seq, l1);
    cm_nn_sequential_append(seq, act);
    cm_nn_sequential_append(seq, l2);
    cr_assert_eq(cm_module_finalize(seq), CM_OK);
    t->net = seq;
    cm_model *m;
    cr_assert_eq(cm_model_new(&tm_vt, t, &m), CM_OK, "%s", cm_last_error());
    return m;
}

Test(trainer, token_weighted_microbatches_equal_the_full_batch) {
    rig_opts o = defaults();
    o.max_duration = "8ba";
    o.tokens = true;
    o.model = token_model();
    rig full = make(&o);
    o.mb = 3;
    o.model = token_model();
    rig micro = make(&o);
    cr_assert_eq(cm_trainer_fit(full.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_fit(micro.tr, NULL), CM_OK, "%s", cm_last_error());
    expect_params(full.model, micro.model, 1e-6, "token-weighted microbatch 3 vs full batch");
    cr_expect_gt(cm_state_timestamp(cm_trainer_state(full.tr))->token, 8 * 8, "tokens counted");
    unmake(&full);
    unmake(&micro);
    /* the same microbatches weighted by samples are not the token mean: the parameters differ */
    o.model = token_model();
    o.tokens = false;
    o.mb = 0;
    rig a = make(&o);
    o.model = token_model();
    o.mb = 3;
    rig b = make(&o);
    cm_trainer_fit(a.tr, NULL);
    cm_trainer_fit(b.tr, NULL);
    int64_t n;
    float *pa = cmt_params_copy(a.model, &n), *pb = cmt_params_copy(b.model, &n);
    double md = 0;
    for (int64_t i = 0; i < n; i++) md = fmax(md, fabs(pa[i] - pb[i]));
    cr_expect_gt(md, 1e-4, "sample weighting of a token-mean loss must differ (max diff %g)", md);
    free(pa), free(pb);
    unmake(&a);
    unmake(&b);
}

Test(trainer, same_seed_gives_bitwise_identical_parameters) {
    rig_opts o = defaults();
    o.dropout = 0.3f;
    o.max_duration = "2ep";
    o.mb = 3;
    rig a = make(&o), b = make(&o);
    o.seed = 43;
    rig c = make(&o);
    cr_assert_eq(cm_trainer_fit(a.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_fit(b.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_fit(c.tr, NULL), CM_OK, "%s", cm_last_error());
    expect_params(a.model, b.model, 0, "same seed");
    int64_t n;
    float *pa = cmt_params_copy(a.model, &n), *pc = cmt_params_copy(c.model, &n);
    cr_expect(memcmp(pa, pc, sizeof(float) * (size_t)n) != 0, "another seed changes the dropout masks");
    free(pa), free(pc);
    unmake(&a);
    unmake(&b);
    unmake(&c);
}

Test(trainer, fit_twice_equals_fit_once_with_the_summed_duration) {
    rig_opts o = defaults();
    o.dropout = 0.2f;
    o.max_duration = "8ba"; /* 6 batches per epoch: crosses an epoch boundary */
    rig once = make(&o);
    o.max_duration = NULL;
    rig twice = make(&o);
    cr_assert_eq(cm_trainer_fit(once.tr, NULL), CM_OK, "%s", cm_last_error());
    cm_fit_opts fo = cm_fit_opts_default();
    cr_assert_eq(cm_trainer_fit(twice.tr, &fo), CM_ERR_INVALID_ARG, "no duration anywhere");
    cr_expect(strstr(cm_last_error(), "max_duration is not set"), "%s", cm_last_error());
    fo.duration = cm_time_make(6, CM_TIME_BATCH); /* ends exactly at the epoch's last batch */
    cr_assert_eq(cm_trainer_fit(twice.tr, &fo), CM_OK, "%s", cm_last_error());
    cr_expect_eq(cm_state_timestamp(cm_trainer_state(twice.tr))->epoch, 1);
    fo.duration = cm_time_make(2, CM_TIME_BATCH);
    cr_assert_eq(cm_trainer_fit(twice.tr, &fo), CM_OK, "%s", cm_last_error());
    cr_expect_eq(cm_state_timestamp(cm_trainer_state(twice.tr))->batch, 8);
    expect_params(once.model, twice.model, 0, "fit(6ba) + fit(2ba) vs fit(8ba)");
    /* reset_time starts again from batch 0 */
    fo.reset_time = true;
    fo.duration = cm_time_make(1, CM_TIME_BATCH);
    cr_assert_eq(cm_trainer_fit(twice.tr, &fo), CM_OK, "%s", cm_last_error());
    cr_expect_eq(cm_state_timestamp(cm_trainer_state(twice.tr))->batch, 1);
    unmake(&once);
    unmake(&twice);
}

/* The trainer's step is the hand-written loop: forward, loss, backward, α = schedule(batch),
 * optimizer step — bit for bit. */
Test(trainer, loop_equals_hand_written_optimizer_and_scheduler_steps) {
    cm_sched_config sc = cm_sched_config_default(CM_SCHED_COSINE_ANNEALING_WITH_WARMUP);
    cr_assert_eq(cm_time_parse("3ba", &sc.t_warmup), CM_OK);
    cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_SGD);
    hp.lr = 0.2, hp.momentum = 0.9;

    rig_opts o = defaults();
    o.max_duration = "2ep";
    o.model = cmt_mlp(8, 16, 3, 0, 3);
    cm_module *root = cm_model_module(o.model);
    const cm_unit_info *u = cm_module_unit(root, 0);
    cm_optim *opt;
    cr_assert_eq(cm_optim_new(CM_OPTIM_SGD, &opt), CM_OK);
    cr_assert_eq(cm_optim_add_group(opt, &hp, &(cm_optim_span){"root", u->params, u->grads, u->numel}, 1), CM_OK);
    o.optimizer = opt;
    o.sched = &sc;
    rig g = make(&o);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK, "%s", cm_last_error());

    /* by hand */
    cm_model *m = cmt_mlp(8, 16, 3, 0, 3);
    cm_module *r2 = cm_model_module(m);
    const cm_unit_info *u2 = cm_module_unit(r2, 0);
    cm_optim *opt2;
    cm_optim_new(CM_OPTIM_SGD, &opt2);
    cm_optim_add_group(opt2, &hp, &(cm_optim_span){"root", u2->params, u2->grads, u2->numel}, 1);
    cm_dataset *ds = cmt_synth_dataset(48, 8, 3, false, NULL);
    cm_dataloader *dl = cmt_loader(ds, 8, false, 7);
    cm_tape *tp;
    cm_tape_new(NULL, &tp);
    cm_sched_clock clk = cm_sched_clock_default();
    clk.max_duration = cm_time_make(2, CM_TIME_EPOCH);
    clk.batches_per_epoch = 6;
    for (int ep = 0; ep < 2; ep++) {
        cm_batch *b;
        while (cm_dataloader_next(dl, &b) == CM_OK && b) {
            cm_model_batch mb = {b->names, b->fields, b->n_fields, b->n_samples, 0};
            cm_module_zero_grad(r2);
            cm_tensor *loss = cm_model_loss(m, tp, cm_model_forward(m, tp, &mb), &mb);
            cr_assert_eq(cm_tape_backward(tp, loss), CM_OK, "%s", cm_tape_error(tp));
            double a;
            cr_assert_eq(cm_sched_multiplier(&sc, &clk, &a), CM_OK);
            cm_optim_step(opt2, a);
            cm_tape_reset(tp);
            cm_timestamp_next_batch(&clk.now, b->n_samples, 0, 0);
        }
        cm_timestamp_next_epoch(&clk.now, 0);
    }
    expect_params(g.model, m, 0, "trainer vs hand-written loop");
    double mult;
    clk.now = *cm_state_timestamp(cm_trainer_state(g.tr));
    clk.now.batch = 11;
    cm_sched_multiplier(&sc, &clk, &mult);
    cr_expect_eq(cm_state_lr_multiplier(cm_trainer_state(g.tr)), mult);
    cm_tape_free(tp);
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
    cm_optim_free(opt2);
    cm_model_free(m);
    unmake(&g);
    cm_optim_free(opt);
}

/* Rank 1 of 2 gets samples 2, 3, 6, 7 of 9 (batches of 4) and one padding row (a copy of sample
 * 8, valid = 0); its metrics must equal those of a loader over exactly those four samples. */
Test(trainer, eval_metrics_do_not_count_padding_rows) {
    rig_opts o = defaults();
    rig g = make(&o);
    cm_dataset *ds9 = cmt_synth_dataset(9, 8, 3, false, NULL);
    cm_dataloader_config c = cm_dataloader_config_eval();
    c.batch_size = 4, c.rank = 1, c.world_size = 2;
    cm_dataloader *padded;
    cr_assert_eq(cm_dataloader_new(ds9, &c, &padded), CM_OK, "%s", cm_last_error());
    const int64_t idx[4] = {2, 3, 6, 7};
    cm_dataset *ds4 = cmt_synth_dataset(4, 8, 3, false, idx);
    cm_dataloader *plain = cmt_loader(ds4, 2, true, 0);
    cm_evaluator ev = cm_evaluator_default();
    ev.label = "padded";
    ev.dataloader = padded;
    cr_assert_eq(cm_trainer_eval(g.tr, &ev, 1), CM_OK, "%s", cm_last_error());
    ev.label = "plain";
    ev.dataloader = plain;
    cr_assert_eq(cm_trainer_eval(g.tr, &ev, 1), CM_OK, "%s", cm_last_error());
    double a, b;
    cr_assert_eq(cm_in_memory_logger_last(g.mem, "metrics/padded/CrossEntropy", &a), CM_OK);
    cr_assert_eq(cm_in_memory_logger_last(g.mem, "metrics/plain/CrossEntropy", &b), CM_OK);
    cr_expect(fabs(a - b) < 1e-12, "cross-entropy with padding %.15g vs without %.15g", a, b);
    cr_assert_eq(cm_in_memory_logger_last(g.mem, "metrics/padded/MulticlassAccuracy", &a), CM_OK);
    cr_assert_eq(cm_in_memory_logger_last(g.mem, "metrics/plain/MulticlassAccuracy", &b), CM_OK);
    cr_expect_eq(a, b);
    cm_dataloader_free(padded);
    cm_dataloader_free(plain);
    cm_dataset_free(ds9);
    cm_dataset_free(ds4);
    unmake(&g);
}

Test(trainer, amp_bf16_trains_and_loss_decreases) {
    rig_opts o = defaults();
    o.n = 96, o.max_duration = "5ep", o.precision = CM_PRECISION_AMP_BF16, o.mb = 4;
    rig g = make(&o);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK, "%s", cm_last_error());
    double last;
    cm_in_memory_logger_last(g.mem, "loss/train/total", &last);
    cr_expect_lt(last, 0.7 * first_loss(g.mem), "bf16 loss %g -> %g", first_loss(g.mem), last);
    cr_expect_str_eq(cm_in_memory_logger_hparam(g.mem, "precision"), "amp_bf16");
    /* bf16 GEMMs differ from f32 ones: the run is not the fp32 run */
    o.precision = CM_PRECISION_FP32;
    rig f = make(&o);
    cr_assert_eq(cm_trainer_fit(f.tr, NULL), CM_OK);
    int64_t n;
    float *pa = cmt_params_copy(g.model, &n), *pb = cmt_params_copy(f.model, &n);
    cr_expect(memcmp(pa, pb, sizeof(float) * (size_t)n) != 0, "amp_bf16 must actually use bf16");
    free(pa), free(pb);
    unmake(&g);
    unmake(&f);
}

Test(trainer, autocast_linear_equals_explicit_casts_and_grads_stay_f32) {
    cm_tape *tp = cmt_tape();
    const int64_t xs[2] = {5, 7}, ws[2] = {3, 7}, bs[1] = {3};
    cm_tensor *x = cmt_randn(tp, 2, xs, 1, true), *w = cmt_randn(tp, 2, ws, 2, true), *b = cmt_randn(tp, 1, bs, 3, true);
    cm_tensor *ref = cm_linear(tp, cm_cast(tp, x, CM_DTYPE_BF16), cm_cast(tp, w, CM_DTYPE_BF16), b);
    cr_expect_eq(cm_tape_set_autocast(tp, CM_DTYPE_BF16), CM_DTYPE_F32);
    cm_tensor *y = cm_linear(tp, x, w, b);
    cr_assert(y, "%s", cm_tape_error(tp));
    cmt_assert_close("autocast linear", y, ref, 0, 0);
    cr_assert_eq(cm_tape_backward(tp, cm_sum(tp, y, NULL, 0, false)), CM_OK, "%s", cm_tape_error(tp));
    cr_expect_eq(cm_tensor_dtype(cm_tensor_grad(w)), CM_DTYPE_F32);
    cr_expect_eq(cm_tape_set_autocast(tp, CM_DTYPE_F16), CM_DTYPE_BF16, "f16 is ignored");
    cr_expect_eq(cm_tape_autocast(tp), CM_DTYPE_BF16);
    cm_tape_set_autocast(tp, CM_DTYPE_F32);
    cmt_assert_close("autocast off", cm_matmul(tp, x, cm_transpose(tp, w, 0, 1)), cm_linear(tp, x, w, NULL), 1e-5, 1e-5);
    cm_tape_free(tp);
}

Test(trainer, amp_fp16_is_refused_with_a_clear_message) {
    cm_model *m = cmt_mlp(8, 16, 3, 0, 3);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = m;
    c.precision = CM_PRECISION_AMP_FP16;
    cm_trainer *tr = (cm_trainer *)1;
    cr_expect_eq(cm_trainer_new(&c, &tr), CM_ERR_UNSUPPORTED);
    cr_expect_null(tr);
    cr_expect(strstr(cm_last_error(), "amp_fp16") && strstr(cm_last_error(), "use amp_bf16"), "%s", cm_last_error());
    cm_precision p;
    cr_expect_eq(cm_precision_parse("AMP_BF16", &p), CM_OK);
    cr_expect_eq(p, CM_PRECISION_AMP_BF16);
    cr_expect_eq(cm_precision_parse("bf16", &p), CM_ERR_INVALID_ARG);
    cm_model_free(m);
}

Test(trainer, auto_microbatch_shrinks_on_arena_oom_and_matches_the_fixed_size_run) {
    rig_opts o = defaults();
    o.batch = 16, o.n = 64, o.max_duration = "4ba", o.mb = 4;
    rig fixed = make(&o);
    cr_assert_eq(cm_trainer_fit(fixed.tr, NULL), CM_OK, "%s", cm_last_error());
    size_t peak = cm_arena_peak(cm_tape_arena(cm_state_tape(cm_trainer_state(fixed.tr))));
    o.mb = CM_MICROBATCH_AUTO;
    o.no_plan = true; /* the search itself (the plan would start at 4: test_memory_plan) */
    o.arena_budget = peak; /* 16 and 8 rows do not fit, 4 do */
    rig autom = make(&o);
    cr_assert_eq(cm_trainer_fit(autom.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_expect_eq(cm_state_microbatch_size(cm_trainer_state(autom.tr)), 4);
    double v;
    cr_assert_eq(cm_in_memory_logger_last(autom.mem, "trainer/device_train_microbatch_size", &v), CM_OK);
    cr_expect_eq(v, 4);
    cr_expect_eq(cm_in_memory_logger_count(autom.mem, "trainer/device_train_microbatch_size"), 3, "16, 8, 4");
    expect_params(fixed.model, autom.model, 0, "auto (shrunk to 4) vs fixed 4");
    unmake(&fixed);
    unmake(&autom);
    /* a fixed size that does not fit is an OOM error naming the place */
    o.mb = 16;
    rig tight = make(&o);
    cr_expect_eq(cm_trainer_fit(tight.tr, NULL), CM_ERR_OOM);
    cr_expect(strstr(cm_last_error(), "epoch 0, batch 0"), "%s", cm_last_error());
    unmake(&tight);
    o.mb = CM_MICROBATCH_AUTO;
    o.arena_budget = 256;
    rig tiny = make(&o);
    cr_expect_eq(cm_trainer_fit(tiny.tr, NULL), CM_ERR_OOM, "%s", cm_last_error());
    cr_expect(strstr(cm_last_error(), "even a microbatch of 1 row"), "%s", cm_last_error());
    unmake(&tiny);
}

static cm_status stopper(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    if (ev == CM_EVENT_BATCH_END && cm_state_timestamp(st)->batch == 2) cm_state_stop_training(st);
    return CM_OK;
}
static const cm_callback_i stop_vt = {CM_CALLBACK_ABI, "Stopper", stopper, NULL, NULL, NULL, NULL};

Test(trainer, a_callback_can_stop_training) {
    rig_opts o = defaults();
    rig g = make(&o);
    cr_assert_eq(cm_engine_add_callback(cm_trainer_engine(g.tr), (cm_callback_plugin){&stop_vt, NULL}), CM_OK);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_expect_eq(cm_state_timestamp(cm_trainer_state(g.tr))->batch, 2);
    cr_expect(cm_state_stop_requested(cm_trainer_state(g.tr)));
    unmake(&g);
}

Test(trainer, configuration_errors_name_the_field) {
    cm_model *m = cmt_mlp(8, 16, 3, 0, 3);
    cm_dataset *ds = cmt_synth_dataset(16, 8, 3, false, NULL);
    cm_dataloader *tl = cmt_loader(ds, 4, false, 0), *el = cmt_loader(ds, 4, true, 0);
    cm_trainer *tr;
    cm_trainer_config c = cm_trainer_config_default();
    cr_expect_eq(cm_trainer_new(&c, &tr), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "cfg.model"), "%s", cm_last_error());
    c.model = m;
    c.train_dataloader = el;
    cr_expect_eq(cm_trainer_new(&c, &tr), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "train_dataloader") && strstr(cm_last_error(), "eval mode"), "%s", cm_last_error());
    c.train_dataloader = tl;
    c.eval_dataloader = tl;
    cr_expect_eq(cm_trainer_new(&c, &tr), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "cm_dataloader_config_eval"), "%s", cm_last_error());
    c.eval_dataloader = el;
    c.max_duration = cm_time_dur(0.5);
    cr_expect_eq(cm_trainer_new(&c, &tr), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "max_duration '0.5dur'"), "%s", cm_last_error());
    c.max_duration = cm_time_make(1, CM_TIME_EPOCH);
    c.eval_interval = cm_time_make(5, CM_TIME_SECOND);
    cr_expect_eq(cm_trainer_new(&c, &tr), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "eval_interval"), "%s", cm_last_error());
    c.eval_interval = cm_time_make(1, CM_TIME_EPOCH);
    c.device_train_microbatch_size = -2;
    cr_expect_eq(cm_trainer_new(&c, &tr), CM_ERR_INVALID_ARG);
    c.device_train_microbatch_size = 0;
    c.scale_schedule_ratio = 0;
    cr_expect_eq(cm_trainer_new(&c, &tr), CM_ERR_INVALID_ARG);
    c.scale_schedule_ratio = 0.4; /* 1ep x 0.4 rounds down to 0 epochs: said, not "max_duration is not set" */
    cr_expect_eq(cm_trainer_new(&c, &tr), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "scale_schedule_ratio 0.4 scales max_duration 1ep to nothing"), "%s",
              cm_last_error());
    c.scale_schedule_ratio = 1;
    /* a plugin failing on INIT: the trainer is not made and the caller keeps the plugin */
    cm_algorithm_plugin clip;
    cr_assert_eq(cm_grad_clip_new(CM_GRAD_CLIP_NORM, 1.0, &clip), CM_OK);
    c.algorithms = &clip;
    c.n_algorithms = 1;
    cr_assert_eq(cm_trainer_new(&c, &tr), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_close(tr), CM_OK);
    cr_expect_eq(cm_trainer_fit(tr, NULL), CM_ERR_STATE);
    cr_expect(strstr(cm_last_error(), "closed"), "%s", cm_last_error());
    cm_trainer_free(tr);
    /* deterministic mode refuses a changed thread count */
    c.algorithms = NULL, c.n_algorithms = 0;
    c.deterministic_mode = true;
    cr_assert_eq(cm_trainer_new(&c, &tr), CM_OK, "%s", cm_last_error());
    int nt = cm_num_threads();
    cm_set_num_threads(nt + 1);
    cr_expect_eq(cm_trainer_fit(tr, NULL), CM_ERR_STATE);
    cr_expect(strstr(cm_last_error(), "deterministic_mode"), "%s", cm_last_error());
    cm_set_num_threads(nt);
    cr_expect_eq(cm_trainer_fit(tr, NULL), CM_OK, "%s", cm_last_error());
    cm_trainer_free(tr);
    cm_dataloader_free(tl);
    cm_dataloader_free(el);
    cm_dataset_free(ds);
    cm_model_free(m);
}
