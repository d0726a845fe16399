/* FSDP mixed precision (cm_mixed_precision, Composer's fsdp_config mixed_precision) on one rank:
 * each policy against a reference built here from its definition — a plain trainer whose
 * algorithm rounds the parameters (and buffers, and gradients) to bf16 at the moments the policy
 * says — bit for bit under every strategy; DEFAULT differs from FULL (a policy silently ignored
 * fails); the byte counters halve; a GPT's loss under DEFAULT tracks FULL; checkpoints hold the
 * f32 masters and resume under another policy; bad fields are refused by name. On a GPU (where
 * one is) DEFAULT and PURE equal the same reference run on the GPU. N ranks = 1 rank: tests/dist
 * (mixed_precision_equivalence). */
#include "cmtest.h"

#include "cmalgo.h"
#include "cmtrain.h"
#include "tensor/tensor_impl.h"

#include <composer/dist.h>
#include <composer/zoo_gpt2.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static float bf16_round(float x) { return cm_bf16_to_f32(cm_f32_to_bf16(x)); }

/* n floats at p on device dev rounded to bf16, by the host (a GPU's through a host copy): the
 * reference rounds as the definition says, not with the code under test. */
static void round_on(float *p, int64_t n, cm_device dev) {
    float *h = dev == CM_DEVICE_CPU ? p : malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (h != p) cr_assert_eq(cmi_dev_memcpy(h, CM_DEVICE_CPU, p, dev, sizeof(float) * (size_t)n), CM_OK);
    for (int64_t i = 0; i < n; i++) h[i] = bf16_round(h[i]);
    if (h != p) {
        cr_assert_eq(cmi_dev_memcpy(p, dev, h, CM_DEVICE_CPU, sizeof(float) * (size_t)n), CM_OK);
        free(h);
    }
}

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
        cr_assert_eq(cmi_dev_memcpy(r->saved + k, CM_DEVICE_CPU, ui->params, ui->device, sizeof(float) * (size_t)ui->numel),
                     CM_OK);
        round_on(ui->params, ui->numel, ui->device);
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
        cr_assert_eq(cmi_dev_memcpy(ui->params, ui->device, r->saved + k, CM_DEVICE_CPU, sizeof(float) * (size_t)ui->numel),
                     CM_OK);
        k += ui->numel;
    }
    r->held = false;
}

static void round_buffers(cm_model *m) {
    cm_module *root = cm_model_module(m);
    for (int64_t i = 0; i < cm_module_n_buffers(root); i++) {
        cm_tensor *t = cm_module_buffer_info(root, i).tensor;
        if (!t || cm_tensor_dtype(t) != CM_DTYPE_F32) continue;
        round_on(cm_tensor_data(t), cm_tensor_numel(t), cm_tensor_device(t));
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
                round_on(ui->grads, ui->numel, ui->device);
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
    bool no_eval;
    cm_device device; /* moved there after cm_dist_new, as the CLI does */
    bool offload;     /* cpu_offload (the model stays on the CPU; device is the GPU it computes on) */
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
        dc.cpu_offload = o.offload;
        cr_assert_eq(cm_mixed_precision_policy(o.policy, CM_PRECISION_AMP_BF16, &dc.mixed_precision), CM_OK, "%s",
                     cm_last_error());
        cr_assert_eq(cm_dist_new(c, rig.model, &dc, &d), CM_OK, "%s", cm_last_error());
    }
    if (o.device != CM_DEVICE_CPU && !o.offload)
        cr_assert_eq(cm_module_to_device(cm_model_module(rig.model), o.device), CM_OK, "%s", cm_last_error());
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
    cfg.eval_dataloader = o.no_eval ? NULL : rig.eval_dl;
    cfg.eval_interval = cm_time_make(2, CM_TIME_BATCH);
    cfg.optimizer = opt;
    cfg.algorithms = &alg;
    cfg.n_algorithms = 1;
    cfg.precision = CM_PRECISION_AMP_BF16;
    cfg.device = o.device;
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
        cr_assert_eq(cmi_dev_memcpy(out.b + out.nb, CM_DEVICE_CPU, cm_tensor_data(t), cm_tensor_device(t),
                                    sizeof(float) * (size_t)cm_tensor_numel(t)),
                     CM_OK);
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

/* The model families every policy is checked on: a GPT-2 (dropout, tied embeddings, layer
 * norms) and a ResNet (BatchNorm running statistics, buffer_dtype). */
static const struct {
    cmt_rig_fn rig;
    const char *name;
} fams[] = {{cmt_rig_gpt2, "gpt2"}, {cmt_rig_resnet, "resnet"}};

/* DEFAULT (bf16 parameters and buffers, f32 reductions) and PURE (bf16 reductions too) on one
 * rank are, bit for bit, a plain run whose algorithm rounds the parameters (and buffers) to bf16
 * before every forward — train and eval — and puts the f32 masters back before the optimizer
 * step (PURE: the gradients rounded to bf16 before it), for a GPT-2 (dropout, tied embeddings,
 * layer norms) and a ResNet (BatchNorm running statistics), under every strategy. Microbatches
 * of 2 (NO_SHARD accumulates them before its one reduction; the sharded strategies reduce each
 * one, so they are compared with the whole batch as one microbatch, where the orders agree;
 * the hybrid strategies for the GPT under DEFAULT). FULL is not the reference: the test fails
 * if the policy is silently ignored. */
Test(mixed_precision, default_and_pure_on_one_rank_equal_rounding_before_every_forward, .timeout = 180) {
    for (size_t f = 0; f < sizeof fams / sizeof *fams; f++) {
        for (int pure = 0; pure < 2; pure++) {
            for (int64_t mb = 2; mb <= 4; mb += 2) {
                mp_opts ref = {fams[f].rig, 2, getenv("DUR") ? getenv("DUR") : "4ba", -1, NULL, mb, true, true, pure == 1, NULL, NULL, false, CM_DEVICE_CPU, false};
                mp_out want = mp_run(ref);
                for (int strat = 0; strat < CM_SHARDING_COUNT; strat++) {
                    if (mb == 2 && strat != CM_SHARDING_NO_SHARD) continue;
                    /* the hybrid strategies once (on one rank they are FULL_SHARD / SHARD_GRAD_OP
                     * over groups of one): the GPT under DEFAULT */
                    if (cm_sharding_is_hybrid((cm_sharding)strat) && (f || pure)) continue;
                    mp_opts o = {fams[f].rig, 2, "4ba", strat, pure ? "PURE" : "DEFAULT", mb, false, false, false,
                                 NULL, NULL, false, CM_DEVICE_CPU, false};
                    mp_out got = mp_run(o);
                    char what[160];
                    snprintf(what, sizeof what, "%s %s %s, microbatch %lld", fams[f].name, o.policy,
                             cm_sharding_name((cm_sharding)strat), (long long)mb);
                    assert_same(&want, &got, what);
                    out_free(&got);
                }
                if (!pure && mb == 4) { /* FULL is something else */
                    mp_opts o = {fams[f].rig, 2, "4ba", CM_SHARDING_NO_SHARD, "FULL", mb, false, false, false, NULL,
                                 NULL, false, CM_DEVICE_CPU, false};
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

/* The gains are in the bytes moved: with a bf16 param_dtype FULL_SHARD's unit gathers and
 * SHARD_GRAD_OP's after-step gathers move half the bytes of FULL's (the same gathers, 2-byte
 * elements), and with a bf16 reduce_dtype every gradient reduction does (NO_SHARD's all-reduce,
 * the sharded reduce-scatters). On one rank the counters count what the collectives were handed;
 * tests/dist checks the same on 2 ranks. */
Test(mixed_precision, bf16_params_and_reductions_halve_the_bytes_gathered_and_reduced, .timeout = 120) {
    for (int strat = 0; strat <= CM_SHARDING_FULL_SHARD; strat++) {
        /* (NO_SHARD on one rank: nothing to reduce in f32; its halving is shown on 2 ranks) */
        mp_opts o = {cmt_rig_gpt2, 2, "2ba", strat, "FULL", 2, false, false, false, NULL, NULL, false, CM_DEVICE_CPU, false};
        mp_out full = mp_run(o);
        o.policy = "DEFAULT";
        mp_out def = mp_run(o);
        o.policy = "PURE";
        mp_out pure = mp_run(o);
        const char *sn = cm_sharding_name((cm_sharding)strat);
        if (strat == CM_SHARDING_NO_SHARD) { /* one rank reduces nothing in f32; bf16: the rounding, counted */
            cr_assert(full.st.bytes == 0 && def.st.bytes == 0 && pure.st.bytes > 0, "NO_SHARD on one rank: %g %g %g",
                      full.st.bytes, def.st.bytes, pure.st.bytes);
            out_free(&full), out_free(&def), out_free(&pure);
            continue;
        }
        cr_assert_gt(full.st.bytes, 0, "%s: no reduction counted", sn);
        cr_assert(def.st.bytes == full.st.bytes, "%s DEFAULT (f32 reductions): %g bytes reduced, FULL %g", sn,
                  def.st.bytes, full.st.bytes);
        cr_assert(2 * pure.st.bytes == full.st.bytes, "%s PURE: %g bytes reduced, FULL %g (want half)", sn,
                  pure.st.bytes, full.st.bytes);
        {
            cr_assert_gt(full.st.gather_bytes, 0, "%s: no gather counted", sn);
            cr_assert(full.st.n_gathers == def.st.n_gathers, "%s: %lld gathers under FULL, %lld under DEFAULT", sn,
                      (long long)full.st.n_gathers, (long long)def.st.n_gathers);
            cr_assert(2 * def.st.gather_bytes == full.st.gather_bytes && 2 * pure.st.gather_bytes == full.st.gather_bytes,
                      "%s: gathered %g bytes under FULL, %g DEFAULT, %g PURE (want half)", sn, full.st.gather_bytes,
                      def.st.gather_bytes, pure.st.gather_bytes);
        }
        out_free(&full), out_free(&def), out_free(&pure);
    }
}

/* A learnable sequence task (each sequence counts up from a start by a step, modulo V) for a
 * GPT-2 of 2 blocks: a rig for the loss comparison. */
enum { CT_T = 8, CT_V = 24, CT_N = 32 };
static cm_field_desc ct_fields[2] = {{"input_ids", CM_DTYPE_I32, 1, {CT_T}}, {"labels", CM_DTYPE_I32, 1, {CT_T}}};
static int64_t ct_len(void *self) { return CT_N; }
static int ct_nf(void *self) { return 2; }
static const cm_field_desc *ct_field(void *self, int i) { return &ct_fields[i]; }
static cm_status ct_get(void *self, int64_t i, const cm_sample_ctx *ctx, void *const *out) {
    int32_t *x = out[0], *y = out[1];
    for (int t = 0; t < CT_T; t++) {
        x[t] = (int32_t)((i * 7 + (1 + i % 3) * t) % CT_V);
        y[t] = (int32_t)((i * 7 + (1 + i % 3) * (t + 1)) % CT_V);
    }
    return CM_OK;
}
static int64_t ct_tok(void *self, int64_t i) { return CT_T; }
static void ct_close(void *self) {}
static const cm_dataset_i k_count = {CM_DATASET_ABI, "count", ct_len, ct_nf, ct_field, ct_get, ct_tok, ct_close};

static void rig_count_gpt(cmt_rig *out, void *data) {
    memset(out, 0, sizeof *out);
    out->family = "gpt2-count";
    cm_gpt2_config gc = cm_gpt2_config_default();
    gc.vocab_size = CT_V, gc.n_positions = 16, gc.n_embd = 32, gc.n_layer = 2, gc.n_head = 2;
    cm_rng rng = cm_rng_init(3, 0);
    cr_assert_eq(cm_gpt2_new(&gc, &rng, &out->model), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_dataset_new(&k_count, NULL, &out->ds), CM_OK);
    out->dl = cmt_loader(out->ds, 8, false, 1);
    out->batches_per_epoch = CT_N / 8;
}

/* A GPT-2 under amp_bf16 for 24 AdamW steps on the counting task (the loss falls from 3.2 to
 * 0.8): DEFAULT's loss tracks FULL's. The matmuls already round the weights to bf16 under
 * amp_bf16; DEFAULT also rounds what autocast leaves in f32 (embeddings, layer norms, biases),
 * each by at most 2^-9 relative: the first batch differs by 4e-6, and the trajectories drift
 * apart as Adam compounds it, 0.7% at worst over the 24 batches. Tolerance 3% per batch. */
Test(mixed_precision, default_loss_tracks_full_on_a_short_gpt_run, .timeout = 120) {
    mp_opts o = {rig_count_gpt, 4, "24ba", CM_SHARDING_NO_SHARD, "FULL", 4, false, false, false, NULL, NULL, false, CM_DEVICE_CPU, false};
    mp_out full = mp_run(o);
    o.policy = "DEFAULT";
    mp_out def = mp_run(o);
    cr_assert_eq(full.n_loss, 24);
    cr_assert_eq(def.n_loss, 24);
    cr_assert_lt(full.loss[23], 0.5 * full.loss[0], "FULL did not learn: %.4f -> %.4f", full.loss[0], full.loss[23]);
    double worst = 0;
    for (int i = 0; i < 24; i++) {
        const double rel = fabs(def.loss[i] - full.loss[i]) / fabs(full.loss[i]);
        if (rel > worst) worst = rel;
        cr_assert_leq(rel, 3e-2, "batch %d: DEFAULT loss %.6f, FULL %.6f (relative %.3g > 3e-2)", i, def.loss[i],
                      full.loss[i], rel);
    }
    cr_assert_gt(worst, 0, "DEFAULT's losses are FULL's: the policy changed nothing");
    cr_log_info("DEFAULT vs FULL: worst relative loss difference %.3g over 24 batches (%.4f -> %.4f)", worst,
                def.loss[0], def.loss[23]);
    out_free(&full), out_free(&def);
}

/* Checkpoints hold the f32 masters: a run under PURE saves at batch 2; a run under FULL loads it
 * and finds the same masters bit for bit (some of them not bf16 values) and trains on; and the
 * other way round (FULL saves, PURE loads: the masters are not rounded by the load). NO_SHARD
 * (a monolithic checkpoint from the model's buffers, which hold the masters at rest),
 * SHARD_GRAD_OP and FULL_SHARD (sharded ones from the master chunks). */
Test(mixed_precision, checkpoints_hold_the_f32_masters_and_resume_under_another_policy, .timeout = 120) {
    const int strats[] = {CM_SHARDING_NO_SHARD, CM_SHARDING_SHARD_GRAD_OP, CM_SHARDING_FULL_SHARD};
    for (size_t k = 0; k < 3; k++) {
        for (int dir = 0; dir < 2; dir++) {
            char dirpath[] = "/tmp/cm_mp_ckptXXXXXX";
            cr_assert_not_null(mkdtemp(dirpath));
            const char *save = dir ? "FULL" : "PURE", *load = dir ? "PURE" : "FULL";
            mp_opts o = {cmt_rig_gpt2, 2, "2ba", strats[k], save, 2, false, false, false, dirpath, NULL, false, CM_DEVICE_CPU, false};
            mp_out a = mp_run(o);
            int64_t not_bf16 = 0;
            for (int64_t i = 0; i < a.n; i++) not_bf16 += a.p[i] != bf16_round(a.p[i]);
            cr_assert_gt(not_bf16, a.n / 2, "%s: only %lld of %lld masters are not bf16 values", save,
                         (long long)not_bf16, (long long)a.n);
            char ck[512];
            snprintf(ck, sizeof ck, "%s/ep0-ba2", dirpath);
            cr_assert_eq(access(ck, F_OK), 0, "no checkpoint %s", ck);
            /* the same length: the load alone, then the masters as loaded */
            mp_opts b = {cmt_rig_gpt2, 2, "2ba", strats[k], load, 2, false, false, false, NULL, ck, false, CM_DEVICE_CPU, false};
            mp_out got = mp_run(b);
            char what[128];
            snprintf(what, sizeof what, "%s saved under %s, loaded under %s", cm_sharding_name((cm_sharding)strats[k]),
                     save, load);
            cr_assert_eq(got.n, a.n);
            for (int64_t i = 0; i < a.n; i++)
                cr_assert(got.p[i] == a.p[i], "%s: master %lld: %.9g saved, %.9g loaded", what, (long long)i, a.p[i],
                          got.p[i]);
            /* and on: two more batches under the other policy */
            b.dur = "4ba";
            mp_out on = mp_run(b);
            cr_assert_eq(on.n_loss, 2, "%s: %d batches trained after the load, want 2", what, on.n_loss);
            for (int i = 0; i < on.n_loss; i++) cr_assert(isfinite(on.loss[i]), "%s: loss %g", what, on.loss[i]);
            cr_assert(differs(&on, &a), "%s: nothing trained after the load", what);
            out_free(&a), out_free(&got), out_free(&on);
            char cmd[600];
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", dirpath);
            cr_assert_eq(system(cmd), 0);
        }
    }
}

/* Bad fields of a cm_mixed_precision are refused by cm_dist_new, each naming the field. */
Test(mixed_precision, bad_fields_and_policy_names_are_refused_by_name) {
    cm_mixed_precision mp;
    cr_assert_eq(cm_mixed_precision_policy("default", CM_PRECISION_AMP_BF16, &mp), CM_OK);
    cr_assert(mp.param_dtype == CM_DTYPE_BF16 && mp.reduce_dtype == CM_DTYPE_F32 && mp.buffer_dtype == CM_DTYPE_BF16 &&
                  !mp.keep_low_precision_grads,
              "DEFAULT under amp_bf16");
    cr_assert_eq(cm_mixed_precision_policy("PURE", CM_PRECISION_FP32, &mp), CM_OK);
    cr_assert(mp.param_dtype == CM_DTYPE_F32 && mp.reduce_dtype == CM_DTYPE_F32 && mp.buffer_dtype == CM_DTYPE_F32,
              "PURE under fp32 is f32 throughout (Composer's autocast dtype is fp32)");
    cr_assert_eq(cm_mixed_precision_policy("PURE", CM_PRECISION_AMP_FP16, &mp), CM_OK);
    cr_assert_eq(mp.reduce_dtype, CM_DTYPE_F16);
    cr_assert_eq(cm_mixed_precision_policy("HALF", CM_PRECISION_AMP_BF16, &mp), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "'HALF': use FULL, DEFAULT or PURE"), "message: %s", cm_last_error());
    const struct {
        cm_mixed_precision mp;
        cm_status want;
        const char *msg;
    } bad[] = {
        {{CM_DTYPE_F16, CM_DTYPE_F32, CM_DTYPE_F32, false}, CM_ERR_UNSUPPORTED, "param_dtype fp16 is not built"},
        {{CM_DTYPE_F32, CM_DTYPE_I32, CM_DTYPE_F32, false}, CM_ERR_INVALID_ARG, "reduce_dtype"},
        {{CM_DTYPE_F32, CM_DTYPE_F32, CM_DTYPE_F16, false}, CM_ERR_UNSUPPORTED, "buffer_dtype fp16"},
        {{CM_DTYPE_BF16, CM_DTYPE_F32, CM_DTYPE_F32, true}, CM_ERR_UNSUPPORTED, "keep_low_precision_grads true"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cm_comm *c;
        cr_assert_eq(cm_comm_single_new(NULL, &c), CM_OK);
        cm_model *m = cmt_mlp(4, 8, 3, 0, 1);
        cm_dist_config dc = cm_dist_config_default();
        dc.mixed_precision = bad[i].mp;
        cm_dist *d = NULL;
        cr_assert_eq(cm_dist_new(c, m, &dc, &d), bad[i].want, "case %zu: %s", i, cm_last_error());
        cr_assert(strstr(cm_last_error(), bad[i].msg), "case %zu: message: %s", i, cm_last_error());
        cr_assert_null(d);
        cm_model_free(m);
        cm_comm_free(c);
    }
}

/* The largest |a - b| over two runs' parameters, and whether every loss agrees within rtol. */
static double max_diff(const mp_out *a, const mp_out *b) {
    cr_assert_eq(a->n, b->n);
    double m = 0;
    for (int64_t i = 0; i < a->n; i++) m = fmax(m, fabs((double)a->p[i] - b->p[i]));
    return m;
}
static void expect_losses_within(const mp_out *a, const mp_out *b, double rtol, const char *what) {
    cr_assert_eq(a->n_loss, b->n_loss, "%s: %d vs %d losses", what, a->n_loss, b->n_loss);
    for (int i = 0; i < a->n_loss; i++)
        cr_expect(fabs(a->loss[i] - b->loss[i]) <= rtol * fabs(b->loss[i]), "%s: loss of batch %d: %.9g vs %.9g", what,
                  i, a->loss[i], b->loss[i]);
}

/* On a GPU (one process, NO_SHARD, the model moved there after cm_dist_new as the CLI does) DEFAULT
 * and PURE are the same reference as on the CPU — a plain GPU run whose algorithm rounds the
 * parameters, buffers (and, PURE, gradients) to bf16 at the policy's moments — for the GPT-2 and
 * the ResNet (BatchNorm statistics: buffer_dtype), microbatches of 2; FULL on the GPU is far from
 * it (the policy is applied, not ignored), and DEFAULT on the GPU tracks DEFAULT on the CPU. The
 * masters stay f32 on the device: the trained parameters are not all bf16 values, while the
 * buffers at rest are. */
Test(mixed_precision, default_and_pure_on_a_gpu_equal_rounding_before_every_forward, .timeout = 300) {
    if (cm_device_check(CM_DEVICE_CUDA) != CM_OK) cr_skip_test("no GPU: %s", cm_last_error());
    for (size_t f = 0; f < sizeof fams / sizeof *fams; f++) {
        for (int pure = 0; pure < 2; pure++) {
            char what[160];
            mp_opts ref = {fams[f].rig, 2, getenv("DUR") ? getenv("DUR") : "4ba", -1, NULL, 2, true, true, pure == 1, NULL, NULL, false, CM_DEVICE_CUDA, false};
            mp_out want = mp_run(ref);
            mp_opts o = {fams[f].rig, 2, "4ba", CM_SHARDING_NO_SHARD, pure ? "PURE" : "DEFAULT", 2, false, false, false,
                         NULL, NULL, false, CM_DEVICE_CUDA, false};
            mp_out got = mp_run(o);
            snprintf(what, sizeof what, "%s %s on the gpu vs the rounding reference on the gpu", fams[f].name, o.policy);
            /* the same kernels on the same values: equal up to the GPU's run-to-run order */
            expect_losses_within(&got, &want, 1e-6, what);
            const double same = max_diff(&got, &want);
            cr_expect_leq(same, 1e-6, "%s: parameters differ by %g", what, same);
            int64_t not_bf16 = 0;
            for (int64_t i = 0; i < got.n; i++) not_bf16 += got.p[i] != bf16_round(got.p[i]);
            cr_expect_gt(not_bf16, got.n / 2, "%s: %lld of %lld trained parameters are bf16 values: the f32 masters "
                                              "were not kept", what, (long long)(got.n - not_bf16), (long long)got.n);
            for (int64_t i = 0; i < got.nb; i++)
                cr_assert(got.b[i] == bf16_round(got.b[i]), "%s: buffer element %lld is %.9g, not a bf16 value", what,
                          (long long)i, got.b[i]);
            if (!pure) {
                o.policy = "FULL";
                mp_out full = mp_run(o);
                const double off = max_diff(&full, &want);
                cr_expect_gt(off, 100 * same + 1e-5, "%s: FULL on the gpu is %g from the reference (DEFAULT %g)",
                             fams[f].name, off, same);
                out_free(&full);
                o.policy = "DEFAULT", o.device = CM_DEVICE_CPU;
                mp_out cpu = mp_run(o);
                snprintf(what, sizeof what, "%s DEFAULT on the gpu vs on the cpu", fams[f].name);
                expect_losses_within(&got, &cpu, 2e-3, what);
                out_free(&cpu);
            }
            out_free(&got);
            out_free(&want);
        }
    }
}

/* How many of two runs' parameters differ by more than 1e-6 (robust to the few that part by the
 * learning rate once a last-bit difference flips a bf16 rounding: see below). */
static int64_t n_apart(const mp_out *a, const mp_out *b) {
    cr_assert_eq(a->n, b->n);
    int64_t k = 0;
    for (int64_t i = 0; i < a->n; i++) k += fabs((double)a->p[i] - b->p[i]) > 1e-6;
    return k;
}

/* cpu_offload under DEFAULT and PURE: the f32 masters, gradients and optimizer state stay in host
 * memory, each unit is uploaded as f32 and rounded on the GPU, PURE's gradients are rounded on the
 * GPU before their download, and the BatchNorm statistics (on the GPU) are rounded there — the
 * same rounding reference on the GPU as above, for the GPT-2 and the ResNet: DEFAULT with
 * microbatches of 2 (each re-uploads and rounds the units; their gradients are summed on the host)
 * and with the whole batch, PURE with the whole batch (offload rounds each microbatch's gradient,
 * as FULL_SHARD reduces each one, where the reference rounds their sum). The optimizer steps on the
 * host (CPU kernels, not the GPU's): the runs agree up to that rounding — until a last-bit
 * difference in a master flips its bf16 rounding, after which Adam's steps on noise-sized gradients
 * (GPT-2's key biases) part by up to the learning rate (on the emulator DEFAULT matches within
 * 2.4e-7 for 4 batches and parts after 6). So 2 batches: the losses agree within 1e-5, at most 1%
 * of the parameters are more than 1e-6 apart (none on the emulator), while FULL under cpu_offload
 * has over a quarter apart (the policy is applied, not ignored) and the other policy's reference
 * over 10x as many plus 5% (PURE's gradients are rounded, DEFAULT's are not). Buffers at rest are
 * bf16 values; the trained masters are not. */
Test(mixed_precision, default_and_pure_with_cpu_offload_on_a_gpu_equal_rounding_before_every_forward, .timeout = 300) {
    if (cm_device_check(CM_DEVICE_CUDA) != CM_OK) cr_skip_test("no GPU: %s", cm_last_error());
    static const struct {
        bool pure;
        int64_t mb;
        int other; /* the case of the other policy with the same microbatches, or -1 */
    } cases[] = {{false, 2, -1}, {false, 4, 2}, {true, 4, 1}};
    enum { NC = sizeof cases / sizeof *cases };
    for (size_t f = 0; f < sizeof fams / sizeof *fams; f++) {
        mp_out want[NC], got[NC], full[2];
        for (int c = 0; c < NC; c++) {
            mp_opts ref = {fams[f].rig, 2, "2ba", -1, NULL, cases[c].mb, true, true, cases[c].pure, NULL, NULL, false,
                           CM_DEVICE_CUDA, false};
            want[c] = mp_run(ref);
            mp_opts o = {fams[f].rig, 2, "2ba", CM_SHARDING_NO_SHARD, cases[c].pure ? "PURE" : "DEFAULT", cases[c].mb,
                         false, false, false, NULL, NULL, false, CM_DEVICE_CUDA, true};
            got[c] = mp_run(o);
            cr_assert_gt(got[c].st.n_gathers, 0, "the units were uploaded");
            if (c < 2) {
                o.policy = "FULL";
                full[c] = mp_run(o);
            }
        }
        for (int c = 0; c < NC; c++) {
            char what[160];
            snprintf(what, sizeof what, "%s %s, microbatch %lld, under cpu_offload vs the rounding reference on the gpu",
                     fams[f].name, cases[c].pure ? "PURE" : "DEFAULT", (long long)cases[c].mb);
            expect_losses_within(&got[c], &want[c], 1e-5, what);
            const int64_t same = n_apart(&got[c], &want[c]), off = n_apart(&full[cases[c].mb == 4], &want[c]);
            printf("%s: %lld of %lld parameters apart by more than 1e-6 (max %.3g); FULL's %lld\n", what,
                   (long long)same, (long long)got[c].n, max_diff(&got[c], &want[c]), (long long)off);
            cr_expect_leq(same, got[c].n / 100, "%s: %lld of %lld parameters apart by more than 1e-6", what,
                          (long long)same, (long long)got[c].n);
            cr_expect_gt(off, got[c].n / 4, "%s: FULL under cpu_offload has only %lld of %lld parameters apart from the "
                                            "reference: the policy was not applied",
                         what, (long long)off, (long long)got[c].n);
            if (cases[c].other >= 0) {
                const int64_t other = n_apart(&got[c], &want[cases[c].other]);
                printf("  from the other policy's reference: %lld\n", (long long)other);
                cr_expect_gt(other, 10 * same + got[c].n / 20, "%s: %lld parameters apart from the other policy's "
                                                              "reference, %lld from its own",
                             what, (long long)other, (long long)same);
            }
            int64_t not_bf16 = 0;
            for (int64_t i = 0; i < got[c].n; i++) not_bf16 += got[c].p[i] != bf16_round(got[c].p[i]);
            cr_expect_gt(not_bf16, got[c].n / 2, "%s: %lld of %lld trained parameters are bf16 values: the f32 masters "
                                                 "were not kept",
                         what, (long long)(got[c].n - not_bf16), (long long)got[c].n);
            for (int64_t i = 0; i < got[c].nb; i++)
                cr_assert(got[c].b[i] == bf16_round(got[c].b[i]), "%s: buffer element %lld is %.9g, not a bf16 value",
                          what, (long long)i, got[c].b[i]);
        }
        for (int c = 0; c < NC; c++) out_free(&want[c]), out_free(&got[c]);
        for (int c = 0; c < 2; c++) out_free(&full[c]);
    }
}

/* The strategies that keep host buffers of their own cannot follow a model to the GPU: a model
 * already there is refused by cm_dist_new, naming the strategy and the fix; one sharded first
 * cannot be moved (the strategy locks its buffers). */
Test(mixed_precision, sharded_strategies_refuse_a_model_on_a_gpu_by_name) {
    if (cm_device_check(CM_DEVICE_CUDA) != CM_OK) cr_skip_test("no GPU: %s", cm_last_error());
    for (int after = 0; after < 2; after++) {
        cmt_rig rig;
        int64_t batches = 2;
        cmt_rig_gpt2(&rig, &batches);
        cm_comm *c;
        cr_assert_eq(cm_comm_single_new(NULL, &c), CM_OK);
        cm_dist_config dc = cm_dist_config_default();
        dc.sharding = CM_SHARDING_SHARD_GRAD_OP;
        cm_dist *d = NULL;
        if (!after) {
            cr_assert_eq(cm_module_to_device(cm_model_module(rig.model), CM_DEVICE_CUDA), CM_OK, "%s", cm_last_error());
            cr_assert_eq(cm_dist_new(c, rig.model, &dc, &d), CM_ERR_UNSUPPORTED, "model on the gpu: %s", cm_last_error());
            cr_assert(strstr(cm_last_error(), "SHARD_GRAD_OP") && strstr(cm_last_error(), "use NO_SHARD"), "%s",
                      cm_last_error());
        } else {
            cr_assert_eq(cm_dist_new(c, rig.model, &dc, &d), CM_OK, "%s", cm_last_error());
            cr_assert_eq(cm_module_to_device(cm_model_module(rig.model), CM_DEVICE_CUDA), CM_ERR_STATE,
                         "a sharded model moved: %s", cm_last_error());
        }
        cm_dist_free(d);
        cm_comm_free(c);
        cmt_rig_free(&rig);
    }
}

/* buffer_dtype bf16 holds the running statistics as bf16 values at rest too: after a batch with
 * no evaluation (whose reads would round them) every one is a bf16 value — the checkpoint of that
 * moment holds what a bf16 buffer holds; under FULL they are not. */
Test(mixed_precision, buffers_are_bf16_values_at_rest) {
    for (int full = 0; full < 2; full++) {
        mp_opts o = {cmt_rig_resnet, 2, "1ba", CM_SHARDING_NO_SHARD, full ? "FULL" : "DEFAULT", 2, false, false, false,
                     NULL, NULL, true, CM_DEVICE_CPU, false};
        mp_out r = mp_run(o);
        cr_assert_gt(r.nb, 0, "the ResNet has no f32 buffers");
        int64_t not_bf16 = 0;
        for (int64_t i = 0; i < r.nb; i++) not_bf16 += r.b[i] != bf16_round(r.b[i]);
        if (full) cr_assert_gt(not_bf16, 0, "FULL: every running statistic is a bf16 value");
        else cr_assert_eq(not_bf16, 0, "DEFAULT: %lld of %lld running statistics are not bf16 values", (long long)not_bf16,
                          (long long)r.nb);
        out_free(&r);
    }
}
