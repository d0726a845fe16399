/* FSDP mixed precision (cm_mixed_precision, Composer's fsdp_config mixed_precision) on one rank:
 * each policy against a reference built here from its definition — a plain trainer whose
 * algorithm rounds the parameters (and buffers, and gradients) to bf16 at the moments the policy
 * says — bit for bit under every strategy; DEFAULT differs from FULL (a policy silently ignored
 * fails); the byte counters halve; a GPT's loss under DEFAULT tracks FULL; checkpoints hold the
 * f32 masters and resume under another policy; bad fields are refused by name. N ranks = 1 rank:
 * tests/dist (mixed_precision_equivalence). */
#include "cmtest.h"

#include "cmalgo.h"
#include "cmtrain.h"

#include <composer/dist.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static float bf16_round(float x) { return cm_bf16_to_f32(cm_f32_to_bf16(x)); }

/* ---------------------------------------------------------------------------------------------
 * The reference: an algorithm on a plain trainer (no cm_dist)
 * ------------------------------------------------------------------------------------------- */

typedef struct ref_alg {
    bool round_params, round_buffers, round_grads;
    cm_model *m;
    float *saved; /* the f32 masters while the model holds rounded parameters */
    bool held;
    double loss[64];
    int n_loss;
} ref_alg;

static int64_t model_numel(cm_module *root) {
    int64_t n = 0;
    for (int u = 0; u < cm_module_n_units(root); u++) n += cm_module_unit(root, u)->numel;
    return n;
}

/* Before every forward (train and eval): the masters aside, the parameters rounded. */
static void hold(ref_alg *r) {
    if (r->held) return;
    cm_module *root = cm_model_module(r->m);
    if (!r->saved) r->saved = malloc(sizeof(float) * (size_t)model_numel(root));
    int64_t k = 0;
    for (int u = 0; u < cm_module_n_units(root); u++) {
        const cm_unit_info *ui = cm_module_unit(root, u);
        memcpy(r->saved + k, ui->params, sizeof(float) * (size_t)ui->numel);
        for (int64_t i = 0; i < ui->numel; i++) ui->params[i] = bf16_round(ui->params[i]);
        k += ui->numel;
    }
    r->held = true;
}

/* Before the optimizer step and after an evaluation: the masters back. */
static void give_back(ref_alg *r) {
    if (!r->held) return;
    cm_module *root = cm_model_module(r->m);
    int64_t k = 0;
    for (int u = 0; u < cm_module_n_units(root); u++) {
        const cm_unit_info *ui = cm_module_unit(root, u);
        memcpy(ui->params, r->saved + k, sizeof(float) * (size_t)ui->numel);
        k += ui->numel;
    }
    r->held = false;
}

static void round_buffers(cm_model *m) {
    cm_module *root = cm_model_module(m);
    for (int64_t i = 0; i < cm_module_n_buffers(root); i++) {
        cm_tensor *t = cm_module_buffer_info(root, i).tensor;
        if (!t || cm_tensor_dtype(t) != CM_DTYPE_F32) continue;
        float *p = cm_tensor_data(t);
        for (int64_t j = 0; j < cm_tensor_numel(t); j++) p[j] = bf16_round(p[j]);
    }
}

static bool ref_match(void *self, cm_event ev, const cm_state *st) {
    return ev == CM_EVENT_BEFORE_FORWARD || ev == CM_EVENT_EVAL_BEFORE_FORWARD || ev == CM_EVENT_AFTER_TRAIN_BATCH ||
           ev == CM_EVENT_EVAL_END || ev == CM_EVENT_BATCH_END;
}

static cm_status ref_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    ref_alg *r = self;
    r->m = cm_state_model(st);
    switch (ev) {
    case CM_EVENT_BEFORE_FORWARD:
    case CM_EVENT_EVAL_BEFORE_FORWARD:
        if (r->round_params) hold(r);
        if (r->round_buffers) round_buffers(r->m);
        break;
    case CM_EVENT_AFTER_TRAIN_BATCH: /* after the last backward, before the step */
        give_back(r);
        if (r->round_buffers) round_buffers(r->m);
        if (r->round_grads) {
            cm_module *root = cm_model_module(r->m);
            for (int u = 0; u < cm_module_n_units(root); u++) {
                const cm_unit_info *ui = cm_module_unit(root, u);
                for (int64_t i = 0; i < ui->numel; i++) ui->grads[i] = bf16_round(ui->grads[i]);
            }
        }
        break;
    case CM_EVENT_EVAL_END: give_back(r); break;
    case CM_EVENT_BATCH_END:
        if (r->n_loss < 64) r->loss[r->n_loss++] = cm_state_total_loss(st);
        break;
    default: break;
    }
    return CM_OK;
}

static void ref_free(void *self) {
    ref_alg *r = self;
    free(r->saved);
    free(r);
}

static const cm_algorithm_i k_ref = {.abi = CM_ALGORITHM_ABI, .name = "MixedPrecisionReference", .match = ref_match,
                                     .apply = ref_apply, .free = ref_free};

/* ---------------------------------------------------------------------------------------------
 * One run
 * ------------------------------------------------------------------------------------------- */

typedef struct mp_opts {
    cmt_rig_fn rig;
    int64_t batches; /* per epoch */
    const char *dur;
    int strategy;       /* a cm_sharding, or -1: no cm_dist (the reference) */
    const char *policy; /* "FULL", "DEFAULT", "PURE" */
    int64_t mb;         /* device_train_microbatch_size */
    bool round_params, round_buffers, round_grads; /* the reference's algorithm */
    const char *save_folder, *load_path;
} mp_opts;

typedef struct mp_out {
    float *p; /* the f32 masters after training */
    int64_t n;
    float *b; /* the f32 buffers (BatchNorm running statistics) after training */
    int64_t nb;
    double loss[64];
    int n_loss;
    double eval;
    cm_dist_stats st;
} mp_out;

static mp_out mp_run(mp_opts o) {
    cmt_rig rig;
    o.rig(&rig, &o.batches);
    cm_comm *c = NULL;
    cm_dist *d = NULL;
    cm_trainer_config cfg = cm_trainer_config_default();
    if (o.strategy >= 0) {
        cr_assert_eq(cm_comm_single_new(NULL, &c), CM_OK);
        cm_dist_config dc = cm_dist_config_default();
        dc.sharding = (cm_sharding)o.strategy;
        cr_assert_eq(cm_mixed_precision_policy(o.policy, CM_PRECISION_AMP_BF16, &dc.mixed_precision), CM_OK, "%s",
                     cm_last_error());
        cr_assert_eq(cm_dist_new(c, rig.model, &dc, &d), CM_OK, "%s", cm_last_error());
    }
    const cm_optim_span *sp = NULL;
    int nsp = 0;
    cm_optim_span *own = NULL;
    if (d) {
        cr_assert_eq(cm_dist_optim_spans(d, &sp, &nsp), CM_OK);
    } else {
        cm_module *root = cm_model_module(rig.model);
        nsp = cm_module_n_units(root);
        own = calloc((size_t)nsp, sizeof *own);
        for (int u = 0; u < nsp; u++) {
            const cm_unit_info *ui = cm_module_unit(root, u);
            own[u] = (cm_optim_span){ui->name, ui->params, ui->grads, ui->numel};
        }
        sp = own;
    }
    cm_optim *opt;
    cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_DECOUPLED_ADAMW);
    hp.lr = 1e-2;
    cr_assert_eq(cm_optim_new(CM_OPTIM_DECOUPLED_ADAMW, &opt), CM_OK);
    cr_assert_eq(cm_optim_add_group(opt, &hp, sp, nsp), CM_OK, "%s", cm_last_error());
    free(own);
    ref_alg *r = calloc(1, sizeof *r);
    r->round_params = o.round_params, r->round_buffers = o.round_buffers, r->round_grads = o.round_grads;
    cm_algorithm_plugin alg = {&k_ref, r};
    cfg.model = rig.model;
    cfg.train_dataloader = rig.dl;
    cfg.eval_dataloader = rig.eval_dl;
    cfg.eval_interval = cm_time_make(2, CM_TIME_BATCH);
    cfg.optimizer = opt;
    cfg.algorithms = &alg;
    cfg.n_algorithms = 1;
    cfg.precision = CM_PRECISION_AMP_BF16;
    cfg.device_train_microbatch_size = o.mb;
    cfg.run_name = "mp";
    cfg.save_folder = o.save_folder;
    cfg.save_interval = cm_time_make(2, CM_TIME_BATCH);
    cfg.load_path = o.load_path;
    cr_assert_eq(cm_time_parse(o.dur, &cfg.max_duration), CM_OK);
    if (d) cm_dist_trainer_hooks(d, &cfg);
    cm_trainer *tr;
    cr_assert_eq(cm_trainer_new(&cfg, &tr), CM_OK, "%s", cm_last_error());
    if (d) cr_assert_eq(cm_dist_attach(d, tr), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_fit(tr, NULL), CM_OK, "%s", cm_last_error());
    mp_out out = {0};
    if (d) {
        out.st = cm_dist_get_stats(d);
        cr_assert_eq(cm_dist_gather_params(d), CM_OK, "%s", cm_last_error());
    }
    out.p = cmt_params_copy(rig.model, &out.n);
    cm_module *root = cm_model_module(rig.model);
    out.b = malloc(sizeof(float) * 1);
    for (int64_t i = 0; i < cm_module_n_buffers(root); i++) {
        cm_tensor *t = cm_module_buffer_info(root, i).tensor;
        if (!t || cm_tensor_dtype(t) != CM_DTYPE_F32) continue;
        out.b = realloc(out.b, sizeof(float) * (size_t)(out.nb + cm_tensor_numel(t)));
        memcpy(out.b + out.nb, cm_tensor_data(t), sizeof(float) * (size_t)cm_tensor_numel(t));
        out.nb += cm_tensor_numel(t);
    }
    memcpy(out.loss, r->loss, sizeof r->loss);
    out.n_loss = r->n_loss;
    const char *name;
    if (cm_state_n_metrics(cm_trainer_state(tr), "eval") > 0)
        cr_assert_eq(cm_state_metric_at(cm_trainer_state(tr), "eval", 0, &name, &out.eval), CM_OK);
    cm_trainer_free(tr);
    cm_dist_free(d);
    cm_optim_free(opt);
    cm_comm_free(c);
    cmt_rig_free(&rig);
    return out;
}

static void assert_same(const mp_out *a, const mp_out *b, const char *what) {
    cr_assert_eq(a->n, b->n, "%s: %lld vs %lld parameters", what, (long long)a->n, (long long)b->n);
    for (int64_t i = 0; i < a->n; i++)
        cr_assert(a->p[i] == b->p[i], "%s: parameter %lld: %.9g vs %.9g", what, (long long)i, a->p[i], b->p[i]);
    cr_assert_eq(a->n_loss, b->n_loss, "%s: %d vs %d losses", what, a->n_loss, b->n_loss);
    for (int i = 0; i < a->n_loss; i++)
        cr_assert(a->loss[i] == b->loss[i], "%s: loss of batch %d: %.9g vs %.9g", what, i, a->loss[i], b->loss[i]);
    cr_assert(a->eval == b->eval, "%s: eval metric %.9g vs %.9g", what, a->eval, b->eval);
    cr_assert_eq(a->nb, b->nb, "%s: %lld vs %lld buffer elements", what, (long long)a->nb, (long long)b->nb);
    for (int64_t i = 0; i < a->nb; i++)
        cr_assert(a->b[i] == b->b[i], "%s: buffer element %lld: %.9g vs %.9g", what, (long long)i, a->b[i], b->b[i]);
}

static void out_free(mp_out *o) {
    free(o->p);
    free(o->b);
}

static bool differs(const mp_out *a, const mp_out *b) {
    for (int64_t i = 0; i < a->n && i < b->n; i++)
        if (a->p[i] != b->p[i]) return true;
    return false;
}

/* DEFAULT (bf16 parameters and buffers, f32 reductions) and PURE (bf16 reductions too) on one
 * rank are, bit for bit, a plain run whose algorithm rounds the parameters (and buffers) to bf16
 * before every forward — train and eval — and puts the f32 masters back before the optimizer
 * step (PURE: the gradients rounded to bf16 before it), for a GPT-2 (dropout, tied embeddings,
 * layer norms) and a ResNet (BatchNorm running statistics), under every strategy. Microbatches
 * of 2 (NO_SHARD accumulates them before its one reduction; the sharded strategies reduce each
 * one, so they are compared with the whole batch as one microbatch, where the orders agree).
 * FULL is not the reference: the test fails if the policy is silently ignored. */
Test(mixed_precision, default_and_pure_on_one_rank_equal_rounding_before_every_forward, .timeout = 60) {
    const struct {
        cmt_rig_fn rig;
        const char *name;
    } fams[] = {{cmt_rig_gpt2, "gpt2"}, {cmt_rig_resnet, "resnet"}};
    for (size_t f = 0; f < sizeof fams / sizeof *fams; f++) {
        for (int pure = 0; pure < 2; pure++) {
            for (int64_t mb = 2; mb <= 4; mb += 2) {
                mp_opts ref = {fams[f].rig, 2, "4ba", -1, NULL, mb, true, true, pure == 1, NULL, NULL};
                mp_out want = mp_run(ref);
                for (int strat = 0; strat < CM_SHARDING_COUNT; strat++) {
                    if (mb == 2 && strat != CM_SHARDING_NO_SHARD) continue;
                    mp_opts o = {fams[f].rig, 2, "4ba", strat, pure ? "PURE" : "DEFAULT", mb, false, false, false,
                                 NULL, NULL};
                    mp_out got = mp_run(o);
                    char what[160];
                    snprintf(what, sizeof what, "%s %s %s, microbatch %lld", fams[f].name, o.policy,
                             cm_sharding_name((cm_sharding)strat), (long long)mb);
                    assert_same(&want, &got, what);
                    out_free(&got);
                }
                if (!pure && mb == 4) { /* FULL is something else */
                    mp_opts o = {fams[f].rig, 2, "4ba", CM_SHARDING_NO_SHARD, "FULL", mb, false, false, false, NULL,
                                 NULL};
                    mp_out full = mp_run(o);
                    cr_assert(differs(&full, &want), "%s: FULL trained the same parameters as DEFAULT", fams[f].name);
                    if (want.nb) { /* and held the running statistics in f32 */
                        bool bdiff = false;
                        for (int64_t i = 0; i < want.nb; i++) bdiff |= want.b[i] != full.b[i];
                        cr_assert(bdiff, "%s: FULL's buffers are DEFAULT's", fams[f].name);
                    }
                    out_free(&full);
                }
                out_free(&want);
            }
        }
    }
}
