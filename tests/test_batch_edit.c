/* The trainer's hooks for algorithms that change the batch (trainer.h, "What algorithms may change
 * in the batch"): field and whole-batch replacement on AFTER_DATALOADER, model-batch fields during a
 * microbatch, counting after AFTER_DATALOADER, training metrics on the unchanged microbatch, the
 * dry run, and the errors for the wrong event, field or shape. */
#include "cmtest.h"
#include "cmtrain.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A test algorithm: on `event` calls fn(self, st). */
typedef struct edit edit;
typedef cm_status (*edit_fn)(edit *e, cm_state *st);
struct edit {
    cm_event event;
    edit_fn fn;
    cm_tensor *owned[4];
    int n_owned;
    int calls;
    cm_status last;
    char err[512];
    double value; /* test-specific */
};
static bool e_match(void *self, cm_event ev, const cm_state *st) { return ev == ((edit *)self)->event; }
static cm_status e_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    edit *e = self;
    e->calls++;
    return e->fn(e, st);
}
static void e_free(void *self) {
    edit *e = self;
    for (int i = 0; i < e->n_owned; i++) cm_tensor_free(e->owned[i]);
    e->n_owned = 0;
}
static const cm_algorithm_i edit_vt = {.abi = CM_ALGORITHM_ABI, .name = "Edit", .match = e_match, .apply = e_apply,
                                       .free = e_free};

static void own(edit *e, cm_tensor *t) {
    if (e->n_owned == 4) {
        cm_tensor_free(e->owned[0]);
        memmove(e->owned, e->owned + 1, 3 * sizeof *e->owned);
        e->n_owned = 3;
    }
    e->owned[e->n_owned++] = t;
}

typedef struct {
    cm_model *m;
    cm_dataset *ds;
    cm_dataloader *dl;
    cm_trainer *tr;
    cm_in_memory_logger *mem;
} rig;

static rig make(edit *e, const char *dur, float dropout, int64_t microbatch, size_t budget) {
    rig r;
    r.ds = cmt_synth_dataset(64, 8, 3, false, NULL);
    r.dl = cmt_loader(r.ds, 16, false, 0);
    r.m = cmt_mlp(8, 16, 3, dropout, 5);
    cm_logger_plugin lp;
    cr_assert_eq(cm_in_memory_logger_new(&r.mem, &lp), CM_OK);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = r.m;
    c.train_dataloader = r.dl;
    cr_assert_eq(cm_time_parse(dur, &c.max_duration), CM_OK);
    cm_algorithm_plugin ap = {&edit_vt, e};
    c.algorithms = &ap;
    c.n_algorithms = e ? 1 : 0;
    c.loggers = &lp;
    c.n_loggers = 1;
    c.device_train_microbatch_size = microbatch;
    c.arena_budget = budget;
    c.compute_training_metrics = true; /* the metrics must see the original labels */
    cr_assert_eq(cm_trainer_new(&c, &r.tr), CM_OK, "%s", cm_last_error());
    return r;
}
static void unmake(rig *r) {
    cm_trainer_free(r->tr);
    cm_model_free(r->m);
    cm_dataloader_free(r->dl);
    cm_dataset_free(r->ds);
}

/* ---- whole-batch field replacement ---- */

static cm_status zero_input(edit *e, cm_state *st) {
    cm_tensor *x = cm_batch_field(cm_state_batch(st), "input");
    cm_tensor *z;
    cm_status s = cm_tensor_new(CM_DTYPE_F32, cm_tensor_ndim(x), cm_tensor_shape(x), &z);
    if (s) return s;
    own(e, z);
    return cm_state_set_batch_field(st, "input", z);
}

/* A callback that checks, on BEFORE_FORWARD, that the model batch's input is all zeros. */
typedef struct {
    int seen, nonzero;
} zprobe;
static cm_status zp_run(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    if (ev != CM_EVENT_BEFORE_FORWARD) return CM_OK;
    zprobe *p = self;
    cm_tensor *x = cm_model_batch_field(cm_state_model_batch(st), "input");
    p->seen++;
    for (int64_t i = 0; i < cm_tensor_numel(x); i++) p->nonzero += cm_tensor_get_flat(x, i) != 0;
    return CM_OK;
}
static const cm_callback_i zp_vt = {CM_CALLBACK_ABI, "ZeroProbe", zp_run, NULL, NULL, NULL, NULL};

Test(batch_edit, field_replaced_on_after_dataloader_is_what_every_microbatch_sees) {
    edit *e = calloc(1, sizeof *e);
    e->event = CM_EVENT_AFTER_DATALOADER, e->fn = zero_input;
    rig r = make(e, "2ba", 0, 4, 0);
    zprobe p = {0};
    cm_callback_plugin cb = {&zp_vt, &p};
    cr_assert_eq(cm_engine_add_callback(cm_trainer_engine(r.tr), cb), CM_OK);
    /* with zero inputs the first layer's weights get no gradient: they stay as initialised */
    const cm_unit_info *u = cm_module_unit(cm_model_module(r.m), 0);
    cm_tensor *w = cm_module_find_param(cm_model_module(r.m), "0.weight");
    cr_assert(w, "the MLP's first weight");
    float w0[16 * 8];
    memcpy(w0, cm_tensor_data(w), sizeof w0);
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_expect_eq(p.seen, 8, "4 microbatches of 4 rows in each of 2 batches (saw %d)", p.seen);
    cr_expect_eq(p.nonzero, 0, "%d non-zero inputs reached the model", p.nonzero);
    cr_expect(memcmp(w0, cm_tensor_data(w), sizeof w0) == 0, "first-layer weights moved");
    (void)u;
    unmake(&r);
    free(e);
}

/* ---- whole-batch replacement with fewer rows: counted after AFTER_DATALOADER ---- */

typedef struct {
    int64_t idx[16], tok[16];
    uint8_t valid[16];
} half_arrays;

static cm_status keep_half(edit *e, cm_state *st) {
    cm_batch b = *cm_state_batch(st);
    const int64_t n = b.n_rows / 2;
    for (int f = 0; f < b.n_fields; f++) {
        cm_tensor *src = b.fields[f], *dst;
        int64_t shape[CM_MAX_DIMS];
        memcpy(shape, cm_tensor_shape(src), sizeof(int64_t) * (size_t)cm_tensor_ndim(src));
        shape[0] = n;
        cm_status s = cm_tensor_new(cm_tensor_dtype(src), cm_tensor_ndim(src), shape, &dst);
        if (s) return s;
        memcpy(cm_tensor_data(dst), cm_tensor_data(src), cm_tensor_nbytes(dst));
        own(e, dst);
        b.fields[f] = dst;
    }
    b.n_rows = b.n_samples = n;
    b.n_padded = 0;
    b.indices = NULL, b.valid = NULL, b.row_tokens = NULL, b.n_tokens = 0;
    e->value = (double)n;
    return cm_state_set_batch(st, &b);
}

Test(batch_edit, replaced_batch_is_counted_after_after_dataloader) {
    edit *e = calloc(1, sizeof *e);
    e->event = CM_EVENT_AFTER_DATALOADER, e->fn = keep_half;
    rig r = make(e, "3ba", 0, 3, 0);
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_OK, "%s", cm_last_error());
    const cm_timestamp *ts = cm_state_timestamp(cm_trainer_state(r.tr));
    cr_expect_eq(ts->batch, 3);
    cr_expect_eq(ts->sample, 3 * 8, "3 batches of 8 kept rows: %lld samples", (long long)ts->sample);
    double loss;
    cr_assert_eq(cm_in_memory_logger_last(r.mem, "loss/train/total", &loss), CM_OK);
    cr_expect(isfinite(loss));
    unmake(&r);
    free(e);
}

/* ---- model-batch fields during a microbatch; metrics on the unchanged microbatch ---- */

static cm_status uniform_targets(edit *e, cm_state *st) {
    cm_tensor *out = cm_state_outputs(st);
    cm_tape *tp = cm_state_tape(st);
    cm_tensor *u = cm_full(tp, CM_DTYPE_F32, 2, cm_tensor_shape(out), 1.0 / (double)cm_tensor_dim(out, 1));
    if (!u) return cm_tape_status(tp);
    return cm_state_set_batch_field(st, "label", u);
}

typedef struct {
    double worst;
    int n;
} lprobe;
/* On AFTER_LOSS: the loss must be the cross-entropy against uniform targets, i.e. the mean over
 * rows of lse(x) - mean_c x_c. */
static cm_status lp_run(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    if (ev != CM_EVENT_AFTER_LOSS) return CM_OK;
    lprobe *p = self;
    cm_tensor *x = cm_state_outputs(st);
    const int64_t N = cm_tensor_dim(x, 0), C = cm_tensor_dim(x, 1);
    double want = 0;
    for (int64_t i = 0; i < N; i++) {
        double mx = -INFINITY, se = 0, mean = 0;
        for (int64_t c = 0; c < C; c++) mx = fmax(mx, cm_tensor_get_flat(x, i * C + c));
        for (int64_t c = 0; c < C; c++) {
            const double v = cm_tensor_get_flat(x, i * C + c);
            se += exp(v - mx), mean += v / (double)C;
        }
        want += (mx + log(se) - mean) / (double)N;
    }
    p->worst = fmax(p->worst, fabs(cm_tensor_get_flat(cm_state_loss(st), 0) - want));
    p->n++;
    return CM_OK;
}
static const cm_callback_i lp_vt = {CM_CALLBACK_ABI, "LossProbe", lp_run, NULL, NULL, NULL, NULL};

Test(batch_edit, microbatch_field_feeds_the_loss_and_metrics_keep_the_original_labels) {
    edit *e = calloc(1, sizeof *e);
    e->event = CM_EVENT_BEFORE_LOSS, e->fn = uniform_targets;
    rig r = make(e, "2ba", 0, 8, 0);
    lprobe p = {0, 0};
    cm_callback_plugin cb = {&lp_vt, &p};
    cr_assert_eq(cm_engine_add_callback(cm_trainer_engine(r.tr), cb), CM_OK);
    /* the accuracy metric needs integer labels: it would fail on the (N, C) soft targets */
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_expect_eq(p.n, 4);
    cr_expect_leq(p.worst, 1e-5, "loss vs cross-entropy with uniform targets: off by %g (tolerance 1e-5)", p.worst);
    double acc;
    cr_expect_eq(cm_in_memory_logger_last(r.mem, "metrics/train/MulticlassAccuracy", &acc), CM_OK);
    unmake(&r);
    free(e);
}

/* ---- errors ---- */

static cm_status try_wrong_things(edit *e, cm_state *st) {
    cm_tensor *x = cm_batch_field(cm_state_batch(st), "input");
    cm_status s = cm_state_set_batch_field(st, "input", x);
    snprintf(e->err, sizeof e->err, "%s", cm_last_error());
    e->last = s;
    return CM_OK;
}

Test(batch_edit, replacing_on_another_event_names_the_event) {
    edit *e = calloc(1, sizeof *e);
    e->event = CM_EVENT_BATCH_START, e->fn = try_wrong_things;
    rig r = make(e, "1ba", 0, 0, 0);
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_expect_eq(e->last, CM_ERR_STATE);
    cr_expect(strstr(e->err, "AFTER_DATALOADER") && strstr(e->err, "BATCH_START"), "%s", e->err);
    unmake(&r);
    free(e);
}

static cm_status bad_field_and_rows(edit *e, cm_state *st) {
    cm_tensor *x = cm_batch_field(cm_state_batch(st), "input");
    cm_status s = cm_state_set_batch_field(st, "image", x);
    cr_expect_eq(s, CM_ERR_NOT_FOUND);
    cr_expect(strstr(cm_last_error(), "'image'") && strstr(cm_last_error(), "input, label, ntok"), "%s",
              cm_last_error());
    int64_t shape[2] = {3, 8};
    cm_tensor *t;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 2, shape, &t), CM_OK);
    own(e, t);
    s = cm_state_set_batch_field(st, "input", t);
    cr_expect_eq(s, CM_ERR_SHAPE);
    cr_expect(strstr(cm_last_error(), "16 rows"), "%s", cm_last_error());
    cm_batch b = *cm_state_batch(st);
    b.n_samples = 3; /* no longer n_rows - n_padded */
    cr_expect_eq(cm_state_set_batch(st, &b), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "inconsistent"), "%s", cm_last_error());
    e->last = CM_OK;
    return CM_OK;
}

Test(batch_edit, unknown_fields_and_wrong_rows_are_refused) {
    edit *e = calloc(1, sizeof *e);
    e->event = CM_EVENT_AFTER_DATALOADER, e->fn = bad_field_and_rows;
    rig r = make(e, "1ba", 0, 0, 0);
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_expect_eq(e->calls, 1);
    unmake(&r);
    free(e);
}

/* ---- the dry run ---- */

static cm_status dry_once(edit *e, cm_state *st) {
    if (e->calls > 1) return CM_OK;
    return cm_state_dry_run(st, cm_state_batch(st));
}

Test(batch_edit, dry_run_changes_nothing_but_the_arena) {
    /* dropout on: the dry run must restore the dropout counters for the run to stay identical */
    rig a = make(NULL, "3ba", 0.3f, 4, 0);
    cr_assert_eq(cm_trainer_fit(a.tr, NULL), CM_OK, "%s", cm_last_error());
    edit *e = calloc(1, sizeof *e);
    e->event = CM_EVENT_AFTER_DATALOADER, e->fn = dry_once;
    rig b = make(e, "3ba", 0.3f, 4, 0);
    cr_assert_eq(cm_trainer_fit(b.tr, NULL), CM_OK, "%s", cm_last_error());
    int64_t na, nb;
    float *pa = cmt_params_copy(a.m, &na), *pb = cmt_params_copy(b.m, &nb);
    cr_assert_eq(na, nb);
    cr_expect(memcmp(pa, pb, sizeof(float) * (size_t)na) == 0, "a dry run changed the training");
    cr_expect_eq(cm_state_timestamp(cm_trainer_state(b.tr))->sample, 48, "the dry run is not counted");
    cr_expect_eq(cm_in_memory_logger_count(b.mem, "loss/train/total"), 3, "the dry run logs no loss");
    free(pa), free(pb);
    unmake(&a);
    unmake(&b);
    free(e);
}

static cm_status dry_rows(edit *e, cm_state *st) {
    if (e->calls > 1) return CM_OK;
    e->value = (double)cm_state_microbatch_size(st);
    cm_status s = cm_state_dry_run(st, cm_state_batch(st));
    e->value = (double)cm_state_microbatch_size(st) + 1000 * e->value;
    return s;
}

Test(batch_edit, dry_run_finds_the_automatic_microbatch_size) {
    /* the arena budget of one 4-row microbatch (measured): the dry run finds a size that fits */
    rig m = make(NULL, "1ba", 0, 4, 0);
    cr_assert_eq(cm_trainer_fit(m.tr, NULL), CM_OK, "%s", cm_last_error());
    const size_t peak = cm_arena_peak(cm_tape_arena(cm_state_tape(cm_trainer_state(m.tr))));
    unmake(&m);
    edit *e = calloc(1, sizeof *e);
    e->event = CM_EVENT_AFTER_DATALOADER, e->fn = dry_rows;
    rig r = make(e, "2ba", 0, CM_MICROBATCH_AUTO, peak);
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_OK, "%s", cm_last_error());
    /* the dry run made the pre-flight memory plan (its safety margin may take it below 4) */
    const cm_memory_plan *p = cm_trainer_memory_plan(r.tr);
    cr_assert_not_null(p, "the dry run made no memory plan");
    cr_expect(p->microbatch_size >= 1 && p->microbatch_size <= 4, "planned %lld", (long long)p->microbatch_size);
    cr_expect_eq((int64_t)e->value, p->microbatch_size, "microbatch size before / after the dry run: %g (want 0 -> %lld)",
                 e->value, (long long)p->microbatch_size);
    cr_expect_eq(cm_state_microbatch_size(cm_trainer_state(r.tr)), p->microbatch_size);
    unmake(&r);
    free(e);
}

static cm_status dry_on_wrong_event(edit *e, cm_state *st) {
    e->last = cm_state_dry_run(st, cm_state_batch(st));
    snprintf(e->err, sizeof e->err, "%s", cm_last_error());
    return CM_OK;
}

Test(batch_edit, dry_run_only_on_after_dataloader) {
    edit *e = calloc(1, sizeof *e);
    e->event = CM_EVENT_BEFORE_TRAIN_BATCH, e->fn = dry_on_wrong_event;
    rig r = make(e, "1ba", 0, 0, 0);
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_expect_eq(e->last, CM_ERR_STATE);
    cr_expect(strstr(e->err, "BEFORE_TRAIN_BATCH"), "%s", e->err);
    unmake(&r);
    free(e);
}
