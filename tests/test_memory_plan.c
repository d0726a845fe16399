/* The pre-flight memory plan of automatic microbatching (trainer.h, cm_memory_plan): on a tiny
 * GPT-2 and a small ResNet under a budget that forces a microbatch below the batch, the plan's size
 * trains on the first try (the size is logged once: no out-of-memory retry) and its predicted arena
 * peak is within 10% of the peak measured at that size; a run planned under auto equals, bit for
 * bit, the run with the fixed size the plan chose (parameters, optimizer state, dropout counters,
 * loader position, timestamp, losses), and a standalone plan before fit changes nothing; one row
 * over the budget is an error naming the budget key and the bytes needed; the out-of-memory search
 * still takes over when the plan under-predicts (memory the dry run cannot see). */
#include "cmalgo.h"
#include "cmtest.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BATCH 16

/* A rig of `family` with batches of BATCH rows (4 batches an epoch). */
static void rig_new(cmt_rig *r, const char *family) {
    int64_t bpe = BATCH; /* the rig's dataset holds 4 × bpe samples */
    if (!strcmp(family, "gpt2")) cmt_rig_gpt2(r, &bpe);
    else cmt_rig_resnet(r, &bpe);
    cm_dataloader_free(r->dl);
    cm_dataloader_config c = cm_dataloader_config_default();
    c.batch_size = BATCH;
    c.seed = 17;
    cr_assert_eq(cm_dataloader_new(r->ds, &c, &r->dl), CM_OK, "%s", cm_last_error());
}

typedef struct {
    cm_trainer *tr;
    cm_optim *opt;
    cm_in_memory_logger *mem;
} run;

static cm_optim *adamw(cm_model *m) {
    cm_module *root = cm_model_module(m);
    const int n = cm_module_n_units(root);
    cm_optim_span *spans = calloc((size_t)n + 1, sizeof *spans);
    for (int i = 0; i < n; i++) {
        const cm_unit_info *u = cm_module_unit(root, i);
        spans[i] = (cm_optim_span){u->name, u->params, u->grads, u->numel};
    }
    cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_DECOUPLED_ADAMW);
    hp.lr = 1e-2;
    cm_optim *o;
    cr_assert_eq(cm_optim_new(CM_OPTIM_DECOUPLED_ADAMW, &o), CM_OK);
    cr_assert_eq(cm_optim_add_group(o, &hp, spans, n), CM_OK, "%s", cm_last_error());
    free(spans);
    return o;
}

static cm_status run_try(cmt_rig *rig, int64_t mb, size_t budget, const char *dur, const cm_callback_plugin *cb,
                         run *out) {
    memset(out, 0, sizeof *out);
    out->opt = adamw(rig->model);
    cm_logger_plugin mp;
    cr_assert_eq(cm_in_memory_logger_new(&out->mem, &mp), CM_OK);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = rig->model;
    c.train_dataloader = rig->dl;
    c.eval_interval = cm_time_make(0, CM_TIME_EPOCH);
    cr_assert_eq(cm_time_parse(dur, &c.max_duration), CM_OK);
    c.optimizer = out->opt;
    c.device_train_microbatch_size = mb;
    c.arena_budget = budget;
    c.loggers = &mp;
    c.n_loggers = 1;
    c.callbacks = cb;
    c.n_callbacks = cb ? 1 : 0;
    c.handle_signals = false;
    c.compute_training_metrics = true; /* a plan must not disturb them */
    c.run_name = "plan-test";
    cm_status s = cm_trainer_new(&c, &out->tr);
    if (s) {
        cm_logger_plugin_free(mp);
        cm_optim_free(out->opt);
        out->opt = NULL;
    }
    return s;
}

static run run_new(cmt_rig *rig, int64_t mb, size_t budget, const char *dur) {
    run r;
    cr_assert_eq(run_try(rig, mb, budget, dur, NULL, &r), CM_OK, "%s", cm_last_error());
    return r;
}

static void run_free(run *r) {
    cm_trainer_free(r->tr);
    cm_optim_free(r->opt);
    memset(r, 0, sizeof *r);
}

/* The plan of the rig's first batch with no budget: the line the budgets below are made from. */
static cm_memory_plan free_plan(const char *family) {
    cmt_rig rig;
    rig_new(&rig, family);
    run r = run_new(&rig, CM_MICROBATCH_AUTO, 0, "1ba");
    cm_memory_plan p;
    cr_assert_eq(cm_trainer_plan_memory(r.tr, &p), CM_OK, "%s", cm_last_error());
    cr_expect_eq(p.microbatch_size, BATCH, "no budget: the whole batch");
    cr_expect_eq(p.batch_rows, BATCH);
    cr_expect_gt(p.per_row, 0);
    cr_expect_gt(p.parameters, 0);
    cr_expect_eq(p.gradients, p.parameters, "one process: a gradient per parameter");
    /* AdamW: exp_avg and exp_avg_sq per parameter, plus a step per unit */
    cr_expect_geq(p.optimizer_state, 2 * p.parameters);
    cr_expect_lt(p.optimizer_state, 2 * p.parameters + 4096);
    run_free(&r);
    cmt_rig_free(&rig);
    return p;
}

/* A budget under which the line allows `rows` rows (and not rows + 1), margin included. */
static size_t budget_for(const cm_memory_plan *p, double rows) {
    return (size_t)(((double)p->workspace + rows * (double)p->per_row) / (1.0 - CM_MEMORY_PLAN_MARGIN));
}

/* Under a budget forcing about 5 of 16 rows: the plan's size trains on the first try, and its
 * predicted arena peak is within 10% of the peak measured at that size (in the planned run and in
 * a run with that fixed size, whose arena never saw the dry run). */
static void check_first_try(const char *family) {
    const cm_memory_plan fp = free_plan(family);
    const size_t budget = budget_for(&fp, 5.5);
    cmt_rig rig;
    rig_new(&rig, family);
    run r = run_new(&rig, CM_MICROBATCH_AUTO, budget, "2ba");
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_OK, "%s: %s", family, cm_last_error());
    const cm_memory_plan *p = cm_trainer_memory_plan(r.tr);
    cr_assert_not_null(p, "%s: fit made no plan", family);
    cr_expect(p->microbatch_size >= 2 && p->microbatch_size < BATCH, "%s: size %lld", family,
              (long long)p->microbatch_size);
    cr_expect_eq(p->budget, budget);
    cr_expect_str_eq(p->budget_key, "arena_budget");
    const int64_t used = cm_state_microbatch_size(cm_trainer_state(r.tr));
    cr_expect_eq(used, p->microbatch_size, "%s: the run used the plan's size", family);
    /* the size is logged once per choice: a retry would log it again */
    cr_expect_eq(cm_in_memory_logger_count(r.mem, "trainer/device_train_microbatch_size"), 1, "%s: OOM retries",
                 family);
    double v;
    cr_assert_eq(cm_in_memory_logger_last(r.mem, "memory_plan/microbatch_size", &v), CM_OK);
    cr_expect_eq(v, (double)p->microbatch_size);
    cr_assert_eq(cm_in_memory_logger_last(r.mem, "memory_plan/activations_per_row_mib", &v), CM_OK);
    cr_expect(fabs(v - (double)p->per_row / (1024.0 * 1024.0)) < 1e-9);
    const size_t measured = cm_tape_peak_bytes(cm_state_tape(cm_trainer_state(r.tr)));
    cr_expect_leq(measured, budget, "%s: fits", family);
    const double err = fabs((double)p->predicted_peak - (double)measured) / (double)measured;
    cr_expect_leq(err, 0.10, "%s: predicted %zu bytes, measured %zu at %lld rows (%.1f%% off)", family,
                  p->predicted_peak, measured, (long long)p->microbatch_size, 100 * err);
    cr_log_info("%s: %lld rows (%lld measured to fit, %d probes), predicted %zu, measured %zu (%.2f%%)", family,
                (long long)p->microbatch_size, (long long)p->fit_size, p->n_probes, p->predicted_peak, measured,
                100 * err);
    const int64_t m = p->microbatch_size;
    const size_t predicted = p->predicted_peak;
    run_free(&r);
    cmt_rig_free(&rig);

    rig_new(&rig, family);
    r = run_new(&rig, m, 0, "2ba");
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_OK, "%s", cm_last_error());
    const size_t fixed = cm_tape_peak_bytes(cm_state_tape(cm_trainer_state(r.tr)));
    const double err2 = fabs((double)predicted - (double)fixed) / (double)fixed;
    cr_expect_leq(err2, 0.10, "%s: predicted %zu bytes, a fixed-size run measured %zu at %lld rows (%.1f%% off)",
                  family, predicted, fixed, (long long)m, 100 * err2);
    cr_log_info("%s: a fixed %lld-row run measured %zu (%.2f%%)", family, (long long)m, fixed, 100 * err2);
    run_free(&r);
    cmt_rig_free(&rig);
}

Test(memory_plan, gpt2_size_fits_on_the_first_try_and_the_peak_is_predicted) { check_first_try("gpt2"); }

/* A wider GPT (n_embd 128, 64 tokens): a row's activation gradients are 32 KiB, under the 64 KiB
 * from which the tape takes gradients from its heap pool instead of the arena, and two rows' are
 * over it — so the arena grows more slowly from 1 to 2 rows than a row at larger sizes, and the
 * line through 1 and 2 rows alone under-predicts the peak. The plan measures its candidates and
 * predicts the real peak. */
static void rig_wide_gpt(cmt_rig *r, int64_t vocab) {
    memset(r, 0, sizeof *r);
    r->family = "gpt2-wide";
    cr_assert_eq(system("mkdir -p build/test_memory_plan"), 0);
    const int64_t T = 64, n = T * BATCH * 2 + 1;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)((i * 7919 + i / 13) % 65);
    cr_assert_eq(cm_token_file_write("build/test_memory_plan/tokens.bin", ids, n, CM_TOKEN_WIDTH_AUTO), CM_OK);
    free(ids);
    cm_tokens_config tc = cm_tokens_config_default();
    tc.seq_len = T;
    cr_assert_eq(cm_dataset_tokens_new("build/test_memory_plan/tokens.bin", &tc, &r->ds), CM_OK, "%s", cm_last_error());
    cm_dataloader_config c = cm_dataloader_config_default();
    c.batch_size = BATCH;
    c.seed = 17;
    cr_assert_eq(cm_dataloader_new(r->ds, &c, &r->dl), CM_OK, "%s", cm_last_error());
    cm_gpt2_config g;
    cr_assert_eq(cm_gpt2_config_preset("tiny", &g), CM_OK);
    g.vocab_size = vocab, g.n_positions = T, g.n_embd = 128, g.n_layer = 1, g.n_head = 4;
    cm_rng rng = cm_rng_init(6, 0);
    cr_assert_eq(cm_gpt2_new(&g, &rng, &r->model), CM_OK, "%s", cm_last_error());
}

static void check_wide(int64_t vocab, bool line_short) {
    cmt_rig rig;
    rig_wide_gpt(&rig, vocab);
    run r = run_new(&rig, CM_MICROBATCH_AUTO, 0, "1ba");
    cm_memory_plan fp;
    cr_assert_eq(cm_trainer_plan_memory(r.tr, &fp), CM_OK, "%s", cm_last_error());
    run_free(&r);
    cmt_rig_free(&rig);
    cr_assert_eq(fp.microbatch_size, BATCH);
    /* the whole batch was measured; the line through 1 and 2 rows says much less */
    const double line16 = (double)fp.peak_1 + (BATCH - 1) * ((double)fp.peak_2 - (double)fp.peak_1);
    if (line_short)
        cr_expect_lt(line16, 0.8 * (double)fp.predicted_peak, "1-2 row line %.0f vs measured %zu at %d rows", line16,
                     fp.predicted_peak, BATCH);
    cr_log_info("wide gpt: 1-2 row line at 16 rows %.0f, measured %zu", line16, fp.predicted_peak);

    const size_t budget = (size_t)((double)fp.predicted_peak * 0.55 / (1.0 - CM_MEMORY_PLAN_MARGIN));
    rig_wide_gpt(&rig, vocab);
    r = run_new(&rig, CM_MICROBATCH_AUTO, budget, "1ba");
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_OK, "%s", cm_last_error());
    const cm_memory_plan *p = cm_trainer_memory_plan(r.tr);
    cr_assert_not_null(p);
    cr_expect(p->microbatch_size > 1 && p->microbatch_size < BATCH, "size %lld", (long long)p->microbatch_size);
    cr_expect_eq(cm_in_memory_logger_count(r.mem, "trainer/device_train_microbatch_size"), 1, "OOM retries");
    const size_t measured = cm_tape_peak_bytes(cm_state_tape(cm_trainer_state(r.tr)));
    const double err = fabs((double)p->predicted_peak - (double)measured) / (double)measured;
    cr_expect_leq(err, 0.10, "predicted %zu, measured %zu at %lld rows", p->predicted_peak, measured,
                  (long long)p->microbatch_size);
    cr_log_info("wide gpt: %lld rows (%d probes), predicted %zu, measured %zu (%.2f%%)", (long long)p->microbatch_size,
                p->n_probes, p->predicted_peak, measured, 100 * err);
    /* a run of that fixed size (a new arena, no dry run before it) reaches the same peak: the dry
     * runs leave the run no arena layout of theirs */
    const int64_t m = p->microbatch_size;
    const size_t predicted = p->predicted_peak;
    run_free(&r);
    cmt_rig_free(&rig);
    rig_wide_gpt(&rig, vocab);
    r = run_new(&rig, m, 0, "1ba");
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_OK, "%s", cm_last_error());
    const size_t fixed = cm_tape_peak_bytes(cm_state_tape(cm_trainer_state(r.tr)));
    cr_expect_leq(fabs((double)predicted - (double)fixed), 0.10 * (double)fixed, "predicted %zu, a fixed %lld-row run %zu",
                  predicted, (long long)m, fixed);
    cr_expect_leq(measured, fixed, "the planned run's peak %zu is over the fixed-size run's %zu", measured, fixed);
    run_free(&r);
    cmt_rig_free(&rig);
}

Test(memory_plan, a_gpt_whose_gradients_leave_the_arena_is_predicted_by_the_measured_candidates) {
    check_wide(65, true);
}

/* A vocabulary of 8192: 2 MiB of logits a row. Arena chunks grow with the first requests, and a
 * request that does not fit the rest of a chunk skips it, so a layout grown by 1- and 2-row dry
 * runs would waste more on the larger run's logits: every dry run and the run itself start from
 * new chunks (cm_tape_trim), and the planned run peaks where a run of that fixed size does. */
Test(memory_plan, the_dry_runs_leave_no_arena_layout) { check_wide(8192, false); }

Test(memory_plan, resnet_size_fits_on_the_first_try_and_the_peak_is_predicted) { check_first_try("resnet"); }

/* ---- no trace ---- */

static float *flat(cm_model *m, int64_t *n, bool grads) {
    cm_module *root = cm_model_module(m);
    int64_t total = 0;
    for (int i = 0; i < cm_module_n_units(root); i++) total += cm_module_unit(root, i)->numel;
    float *p = malloc(sizeof(float) * (size_t)(total + 1));
    int64_t off = 0;
    for (int i = 0; i < cm_module_n_units(root); i++) {
        const cm_unit_info *u = cm_module_unit(root, i);
        memcpy(p + off, grads ? u->grads : u->params, sizeof(float) * (size_t)u->numel);
        off += u->numel;
    }
    *n = total;
    return p;
}

static float *flat_params(cm_model *m, int64_t *n) { return flat(m, n, false); }
static float *flat_grads(cm_model *m, int64_t *n) { return flat(m, n, true); }

static bool add_counter(cm_module *m, const char *path, int depth, void *data) {
    (void)path, (void)depth;
    cm_rng *r = cm_nn_dropout_rng(m);
    uint64_t *acc = data;
    if (r) acc[0] = acc[0] * 1000003u + r->counter, acc[1]++;
    return true;
}

/* Everything a step leaves behind, of two runs, bit for bit. */
static void expect_same_state(run *a, cmt_rig *ra, run *b, cmt_rig *rb, const char *what) {
    int64_t na, nb;
    float *pa = flat_params(ra->model, &na), *pb = flat_params(rb->model, &nb);
    cr_assert_eq(na, nb);
    cr_expect(memcmp(pa, pb, sizeof(float) * (size_t)na) == 0, "%s: parameters differ", what);
    free(pa), free(pb);
    cr_assert_eq(cm_optim_n_state(a->opt), cm_optim_n_state(b->opt));
    for (int i = 0; i < cm_optim_n_state(a->opt); i++) {
        cm_optim_state_entry ea, eb;
        cr_assert_eq(cm_optim_state_get(a->opt, i, &ea), CM_OK);
        cr_assert_eq(cm_optim_state_get(b->opt, i, &eb), CM_OK);
        cr_assert_eq(ea.numel, eb.numel);
        cr_expect(memcmp(ea.data, eb.data, (size_t)ea.numel * (ea.dtype == CM_DTYPE_I64 ? 8 : 4)) == 0,
                  "%s: optimizer state %s differs", what, ea.name);
    }
    uint64_t ca[2] = {0, 0}, cb[2] = {0, 0};
    cm_module_visit(cm_model_module(ra->model), add_counter, ca);
    cm_module_visit(cm_model_module(rb->model), add_counter, cb);
    cr_expect_gt(ca[1], 0, "the model has dropout");
    cr_expect_eq(ca[0], cb[0], "%s: dropout counters differ", what);
    const cm_dataloader_state la = cm_dataloader_get_state(ra->dl), lb = cm_dataloader_get_state(rb->dl);
    cr_expect(la.epoch == lb.epoch && la.position == lb.position, "%s: loader at %lld/%lld vs %lld/%lld", what,
              (long long)la.epoch, (long long)la.position, (long long)lb.epoch, (long long)lb.position);
    const cm_timestamp *ta = cm_state_timestamp(cm_trainer_state(a->tr)), *tb = cm_state_timestamp(cm_trainer_state(b->tr));
    cr_expect(ta->batch == tb->batch && ta->sample == tb->sample && ta->token == tb->token && ta->epoch == tb->epoch,
              "%s: timestamps differ", what);
    const int64_t n = cm_in_memory_logger_count(a->mem, "loss/train/total");
    cr_expect_eq(n, cm_in_memory_logger_count(b->mem, "loss/train/total"));
    double la_, lb_;
    cr_assert_eq(cm_in_memory_logger_last(a->mem, "loss/train/total", &la_), CM_OK);
    cr_assert_eq(cm_in_memory_logger_last(b->mem, "loss/train/total", &lb_), CM_OK);
    cr_expect(memcmp(&la_, &lb_, sizeof la_) == 0, "%s: last loss %.17g vs %.17g", what, la_, lb_);
}

Test(memory_plan, a_planned_run_equals_the_fixed_size_run_bitwise) {
    const cm_memory_plan fp = free_plan("gpt2");
    const size_t budget = budget_for(&fp, 6.5);
    cmt_rig ra, rb;
    rig_new(&ra, "gpt2");
    rig_new(&rb, "gpt2");
    run a = run_new(&ra, CM_MICROBATCH_AUTO, budget, "5ba"); /* crosses an epoch (4 batches) */
    cr_assert_eq(cm_trainer_fit(a.tr, NULL), CM_OK, "%s", cm_last_error());
    const int64_t m = cm_trainer_memory_plan(a.tr)->microbatch_size;
    cr_assert(m > 1 && m < BATCH, "size %lld", (long long)m);
    run b = run_new(&rb, m, budget, "5ba");
    cr_assert_eq(cm_trainer_fit(b.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_expect_null(cm_trainer_memory_plan(b.tr), "a fixed size makes no plan");
    expect_same_state(&a, &ra, &b, &rb, "auto (planned) vs fixed");
    run_free(&a), run_free(&b);
    cmt_rig_free(&ra), cmt_rig_free(&rb);
}

/* Plan between two fits (batch-norm statistics, dropout counters, loader position, metrics): the
 * run then equals one that never planned. */
static void check_standalone(const char *family) {
    cmt_rig ra, rb;
    rig_new(&ra, family);
    rig_new(&rb, family);
    run a = run_new(&ra, 4, 0, "3ba"), b = run_new(&rb, 4, 0, "3ba");
    cr_assert_eq(cm_trainer_fit(a.tr, NULL), CM_OK, "%s", cm_last_error());
    const char *metric = strcmp(family, "gpt2") ? "MulticlassAccuracy" : "LanguageCrossEntropy";
    double m0, m1, mb;
    cr_assert_eq(cm_state_metric(cm_trainer_state(a.tr), "train", metric, &m0), CM_OK, "%s", cm_last_error());
    uint64_t c0[2] = {0, 0}, c1[2] = {0, 0};
    cm_module_visit(cm_model_module(ra.model), add_counter, c0);
    const cm_dataloader_state before = cm_dataloader_get_state(ra.dl);
    int64_t ng;
    float *g0 = flat_grads(ra.model, &ng);
    cm_memory_plan p;
    cr_assert_eq(cm_trainer_plan_memory(a.tr, &p), CM_OK, "%s", cm_last_error());
    cr_expect_eq(p.microbatch_size, BATCH);
    const cm_dataloader_state after = cm_dataloader_get_state(ra.dl);
    cr_expect(before.epoch == after.epoch && before.position == after.position, "%s: the loader moved", family);
    cr_assert_eq(cm_state_metric(cm_trainer_state(a.tr), "train", metric, &m1), CM_OK);
    cr_expect(memcmp(&m0, &m1, sizeof m0) == 0, "%s: the train metric changed %g -> %g", family, m0, m1);
    cm_module_visit(cm_model_module(ra.model), add_counter, c1);
    float *g1 = flat_grads(ra.model, &ng);
    cr_expect(memcmp(g0, g1, sizeof(float) * (size_t)ng) == 0, "%s: the last batch's gradients changed", family);
    free(g0), free(g1);
    cr_expect_eq(c0[0], c1[0], "%s: dropout counters moved", family);
    const cm_fit_opts more = {cm_time_make(2, CM_TIME_BATCH), false};
    cr_assert_eq(cm_trainer_fit(a.tr, &more), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_fit(b.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_fit(b.tr, &more), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_state_metric(cm_trainer_state(a.tr), "train", metric, &m1), CM_OK);
    cr_assert_eq(cm_state_metric(cm_trainer_state(b.tr), "train", metric, &mb), CM_OK);
    cr_expect(memcmp(&m1, &mb, sizeof m1) == 0, "%s: train metric %.17g vs %.17g", family, m1, mb);
    int64_t na, nb;
    float *pa = flat_params(ra.model, &na), *pb = flat_params(rb.model, &nb);
    cr_expect(memcmp(pa, pb, sizeof(float) * (size_t)na) == 0, "%s: plan then fit vs fit: parameters differ", family);
    free(pa), free(pb);
    /* the batch-norm running statistics (buffers) too */
    cm_module *ma = cm_model_module(ra.model), *mm = cm_model_module(rb.model);
    cr_assert_eq(cm_module_n_buffers(ma), cm_module_n_buffers(mm));
    for (int64_t i = 0; i < cm_module_n_buffers(ma); i++) {
        cm_tensor *x = cm_module_buffer_info(ma, i).tensor, *y = cm_module_buffer_info(mm, i).tensor;
        cr_expect(memcmp(cm_tensor_data(x), cm_tensor_data(y), cm_tensor_nbytes(x)) == 0, "%s: buffer %lld differs",
                  family, (long long)i);
    }
    run_free(&a), run_free(&b);
    cmt_rig_free(&ra), cmt_rig_free(&rb);
}

Test(memory_plan, a_standalone_plan_changes_nothing_gpt2) { check_standalone("gpt2"); }

Test(memory_plan, a_standalone_plan_changes_nothing_resnet) {
    cmt_rig r;
    rig_new(&r, "resnet");
    cr_assert_gt(cm_module_n_buffers(cm_model_module(r.model)), 0, "the ResNet has batch-norm statistics");
    cmt_rig_free(&r);
    check_standalone("resnet");
}

/* ---- errors and the fallback ---- */

Test(memory_plan, one_row_over_the_budget_names_the_key_and_the_need) {
    const cm_memory_plan fp = free_plan("gpt2");
    const size_t budget = fp.peak_1 / 2;
    cmt_rig rig;
    rig_new(&rig, "gpt2");
    run r = run_new(&rig, CM_MICROBATCH_AUTO, budget, "1ba");
    cm_memory_plan p;
    cr_expect_eq(cm_trainer_plan_memory(r.tr, &p), CM_ERR_OOM);
    cr_expect(strstr(cm_last_error(), "raise arena_budget") && strstr(cm_last_error(), "one row needs"), "%s",
              cm_last_error());
    char need[64];
    snprintf(need, sizeof need, "%.2f MiB", (double)fp.peak_1 / (1024.0 * 1024.0));
    cr_expect(strstr(cm_last_error(), need), "the need (%s) is named: %s", need, cm_last_error());
    cr_expect_eq(cm_trainer_fit(r.tr, NULL), CM_ERR_OOM);
    cr_expect(strstr(cm_last_error(), "raise arena_budget to at least"), "%s", cm_last_error());
    cr_expect_eq(cm_state_timestamp(cm_trainer_state(r.tr))->batch, 0);
    run_free(&r);
    cmt_rig_free(&rig);
}

/* A callback that takes `bytes` a row of the tape on BEFORE_FORWARD: memory the dry run (no
 * events) does not see, so the plan's size runs out and the search takes over. */
static cm_status hog_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    (void)lg;
    if (ev != CM_EVENT_BEFORE_FORWARD) return CM_OK;
    const int64_t n = (int64_t)(*(size_t *)self / 4) * cm_state_microbatch_size(st);
    cm_tape *tp = cm_state_tape(st);
    if (!cm_empty(tp, CM_DTYPE_F32, 1, &n)) return CM_OK; /* the tape holds the OOM; the forward reports it */
    return CM_OK;
}
static const cm_callback_i hog_vt = {CM_CALLBACK_ABI, "Hog", hog_event, NULL, NULL, NULL, NULL};

Test(memory_plan, the_oom_search_takes_over_when_the_plan_is_short) {
    const cm_memory_plan fp = free_plan("resnet");
    const size_t budget = budget_for(&fp, 8.5);
    cmt_rig rig;
    rig_new(&rig, "resnet");
    size_t hog = fp.per_row; /* doubles what a row takes */
    run r;
    cr_assert_eq(run_try(&rig, CM_MICROBATCH_AUTO, budget, "2ba", &(cm_callback_plugin){&hog_vt, &hog}, &r), CM_OK,
                 "%s", cm_last_error());
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_OK, "%s", cm_last_error());
    const int64_t planned = cm_trainer_memory_plan(r.tr)->microbatch_size;
    const int64_t used = cm_state_microbatch_size(cm_trainer_state(r.tr));
    cr_expect_eq(planned, 8);
    cr_expect_lt(used, planned, "the search lowered the plan's %lld", (long long)planned);
    cr_expect_geq(cm_in_memory_logger_count(r.mem, "trainer/device_train_microbatch_size"), 2);
    run_free(&r);
    cmt_rig_free(&rig);
}
