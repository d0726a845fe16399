/* The event sequence of fit, eval and predict, compared event by event with Composer's order;
 * event counts; the event name tables. */
#include "cmtest.h"
#include "cmtrain.h"

#include <string.h>

#define MAXEV 1024

typedef struct {
    cm_event ev[MAXEV];
    int n;
} recorder;

static cm_status rec_run(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    recorder *r = self;
    cr_assert_lt(r->n, MAXEV);
    r->ev[r->n++] = ev;
    return CM_OK;
}
static const cm_callback_i rec_vt = {CM_CALLBACK_ABI, "Recorder", rec_run, NULL, NULL, NULL, NULL};

typedef struct {
    cm_event ev[MAXEV];
    int n;
} expect;
static void push(expect *e, cm_event ev) { e->ev[e->n++] = ev; }

static void compare(const recorder *r, const expect *e) {
    int n = r->n < e->n ? r->n : e->n;
    for (int i = 0; i < n; i++)
        cr_assert_eq(r->ev[i], e->ev[i], "event %d: got %s, expected %s", i, cm_event_name(r->ev[i]),
                     cm_event_name(e->ev[i]));
    cr_assert_eq(r->n, e->n, "got %d events, expected %d (next expected: %s)", r->n, e->n,
                 e->n > n ? cm_event_name(e->ev[n]) : "none");
}

static int count(const recorder *r, cm_event ev) {
    int c = 0;
    for (int i = 0; i < r->n; i++) c += r->ev[i] == ev;
    return c;
}

typedef struct {
    cm_dataset *ds, *eds;
    cm_dataloader *dl, *edl;
    cm_model *model;
    cm_trainer *tr;
    recorder *rec;
} rig;

/* 12 training samples in batches of 4 (3 per epoch); 5 eval samples in batches of 4 (2 batches). */
static rig make_rig(const char *max_duration, int64_t mb) {
    rig g;
    g.ds = cmt_synth_dataset(12, 4, 3, false, NULL);
    g.eds = cmt_synth_dataset(5, 4, 3, false, NULL);
    g.dl = cmt_loader(g.ds, 4, false, 1);
    g.edl = cmt_loader(g.eds, 4, true, 0);
    g.model = cmt_mlp(4, 8, 3, 0, 1);
    g.rec = calloc(1, sizeof *g.rec);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = g.model;
    c.train_dataloader = g.dl;
    c.eval_dataloader = g.edl;
    cr_assert_eq(cm_time_parse(max_duration, &c.max_duration), CM_OK);
    c.device_train_microbatch_size = mb;
    cm_callback_plugin cb = {&rec_vt, g.rec};
    c.callbacks = &cb;
    c.n_callbacks = 1;
    cr_assert_eq(cm_trainer_new(&c, &g.tr), CM_OK, "%s", cm_last_error());
    return g;
}

static void free_rig(rig *g) {
    cm_trainer_free(g->tr); /* the recorder is freed by nobody (no free slot): free it here */
    free(g->rec);
    cm_model_free(g->model);
    cm_dataloader_free(g->dl);
    cm_dataloader_free(g->edl);
    cm_dataset_free(g->ds);
    cm_dataset_free(g->eds);
}

static void push_eval(expect *e, int batches) {
    push(e, CM_EVENT_EVAL_START);
    for (int i = 0; i < batches; i++) {
        push(e, CM_EVENT_EVAL_BATCH_START);
        push(e, CM_EVENT_EVAL_BEFORE_FORWARD);
        push(e, CM_EVENT_EVAL_AFTER_FORWARD);
        push(e, CM_EVENT_EVAL_BATCH_END);
    }
    push(e, CM_EVENT_EVAL_END);
}

static void push_batch(expect *e, int microbatches) {
    push(e, CM_EVENT_BEFORE_DATALOADER);
    push(e, CM_EVENT_AFTER_DATALOADER);
    push(e, CM_EVENT_BATCH_START);
    push(e, CM_EVENT_BEFORE_TRAIN_BATCH);
    for (int m = 0; m < microbatches; m++) {
        push(e, CM_EVENT_BEFORE_FORWARD);
        push(e, CM_EVENT_AFTER_FORWARD);
        push(e, CM_EVENT_BEFORE_LOSS);
        push(e, CM_EVENT_AFTER_LOSS);
        push(e, CM_EVENT_BEFORE_BACKWARD);
        push(e, CM_EVENT_AFTER_BACKWARD);
    }
    push(e, CM_EVENT_AFTER_TRAIN_BATCH);
    push(e, CM_EVENT_BATCH_END);
}

Test(events, fit_two_epochs_three_batches_two_microbatches_eval_each_epoch) {
    rig g = make_rig("2ep", 2);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK, "%s", cm_last_error());
    expect *e = calloc(1, sizeof *e);
    push(e, CM_EVENT_INIT);
    push(e, CM_EVENT_BEFORE_LOAD);
    push(e, CM_EVENT_AFTER_LOAD);
    push(e, CM_EVENT_FIT_START);
    push(e, CM_EVENT_ITERATION_START);
    for (int ep = 0; ep < 2; ep++) {
        push(e, CM_EVENT_EPOCH_START);
        for (int b = 0; b < 3; b++) {
            push_batch(e, 2);
            push(e, CM_EVENT_BATCH_CHECKPOINT);
        }
        push(e, CM_EVENT_BEFORE_DATALOADER); /* finds the epoch exhausted */
        push(e, CM_EVENT_EPOCH_END);
        push(e, CM_EVENT_EVAL_BEFORE_ALL);
        push_eval(e, 2);
        push(e, CM_EVENT_EVAL_AFTER_ALL);
        push(e, CM_EVENT_EPOCH_CHECKPOINT);
    }
    push(e, CM_EVENT_ITERATION_END);
    push(e, CM_EVENT_ITERATION_CHECKPOINT);
    push(e, CM_EVENT_FIT_END);
    compare(g.rec, e);
    cr_expect_eq(count(g.rec, CM_EVENT_BEFORE_DATALOADER), 2 * (3 + 1));
    cr_expect_eq(count(g.rec, CM_EVENT_AFTER_DATALOADER), 2 * 3);
    cr_expect_eq(count(g.rec, CM_EVENT_BEFORE_FORWARD), 2 * 3 * 2);
    cr_expect_eq(count(g.rec, CM_EVENT_ITERATION_START), 1);
    cr_expect_eq(cm_state_timestamp(cm_trainer_state(g.tr))->batch, 6);
    cr_expect_eq(cm_state_timestamp(cm_trainer_state(g.tr))->epoch, 2);
    free(e);
    free_rig(&g);
}

Test(events, max_duration_mid_epoch_stops_without_the_final_dataloader_call) {
    rig g = make_rig("4ba", 0);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK, "%s", cm_last_error());
    expect *e = calloc(1, sizeof *e);
    push(e, CM_EVENT_INIT);
    push(e, CM_EVENT_BEFORE_LOAD);
    push(e, CM_EVENT_AFTER_LOAD);
    push(e, CM_EVENT_FIT_START);
    push(e, CM_EVENT_ITERATION_START);
    push(e, CM_EVENT_EPOCH_START);
    for (int b = 0; b < 3; b++) {
        push_batch(e, 1);
        push(e, CM_EVENT_BATCH_CHECKPOINT);
    }
    push(e, CM_EVENT_BEFORE_DATALOADER);
    push(e, CM_EVENT_EPOCH_END);
    push(e, CM_EVENT_EVAL_BEFORE_ALL);
    push_eval(e, 2);
    push(e, CM_EVENT_EVAL_AFTER_ALL);
    push(e, CM_EVENT_EPOCH_CHECKPOINT);
    push(e, CM_EVENT_EPOCH_START);
    push_batch(e, 1); /* batch 4 ends the run mid-epoch: evaluated once more at its end */
    push(e, CM_EVENT_EVAL_BEFORE_ALL);
    push_eval(e, 2);
    push(e, CM_EVENT_EVAL_AFTER_ALL);
    push(e, CM_EVENT_BATCH_CHECKPOINT);
    push(e, CM_EVENT_ITERATION_END);
    push(e, CM_EVENT_ITERATION_CHECKPOINT);
    push(e, CM_EVENT_FIT_END);
    compare(g.rec, e);
    free(e);
    free_rig(&g);
}

Test(events, standalone_eval_and_predict_sequences) {
    rig g = make_rig("1ep", 0);
    int base = g.rec->n;
    cr_assert_eq(cm_trainer_eval(g.tr, NULL, 0), CM_OK, "%s", cm_last_error());
    expect *e = calloc(1, sizeof *e);
    push(e, CM_EVENT_INIT);
    push(e, CM_EVENT_BEFORE_LOAD);
    push(e, CM_EVENT_AFTER_LOAD);
    cr_assert_eq(base, 3);
    push(e, CM_EVENT_EVAL_STANDALONE_START);
    push_eval(e, 2);
    push(e, CM_EVENT_EVAL_STANDALONE_END);
    compare(g.rec, e);

    cr_expect_eq(cm_trainer_predict(g.tr, g.edl, -1, NULL, NULL), CM_ERR_INVALID_ARG);
    free(e);
    free_rig(&g);
}

static cm_status count_rows(const cm_batch *b, cm_tensor *out, void *data) {
    *(int64_t *)data += cm_tensor_dim(out, 0);
    return CM_OK;
}

Test(events, predict_sequence_and_subset) {
    rig g = make_rig("1ep", 0);
    int64_t rows = 0;
    cr_assert_eq(cm_trainer_predict(g.tr, g.edl, -1, count_rows, &rows), CM_OK, "%s", cm_last_error());
    cr_expect_eq(rows, 5);
    expect *e = calloc(1, sizeof *e);
    push(e, CM_EVENT_INIT);
    push(e, CM_EVENT_BEFORE_LOAD);
    push(e, CM_EVENT_AFTER_LOAD);
    push(e, CM_EVENT_PREDICT_START);
    for (int i = 0; i < 2; i++) {
        push(e, CM_EVENT_PREDICT_BATCH_START);
        push(e, CM_EVENT_PREDICT_BEFORE_FORWARD);
        push(e, CM_EVENT_PREDICT_AFTER_FORWARD);
        push(e, CM_EVENT_PREDICT_BATCH_END);
    }
    push(e, CM_EVENT_PREDICT_END);
    compare(g.rec, e);
    rows = 0;
    cr_assert_eq(cm_trainer_predict(g.tr, g.edl, 1, count_rows, &rows), CM_OK, "%s", cm_last_error());
    cr_expect_eq(rows, 4, "subset of 1 batch: %lld rows", (long long)rows);
    free(e);
    free_rig(&g);
}

Test(events, names_values_parse_and_kinds) {
    cr_expect_str_eq(cm_event_name(CM_EVENT_AFTER_TRAIN_BATCH), "AFTER_TRAIN_BATCH");
    cr_expect_str_eq(cm_event_value(CM_EVENT_AFTER_TRAIN_BATCH), "after_train_batch");
    cr_expect_str_eq(cm_event_name(CM_EVENT_COUNT), "?");
    cm_event ev;
    cr_expect_eq(cm_event_parse("batch_end", &ev), CM_OK);
    cr_expect_eq(ev, CM_EVENT_BATCH_END);
    cr_expect_eq(cm_event_parse("EVAL_AFTER_ALL", &ev), CM_OK);
    cr_expect_eq(ev, CM_EVENT_EVAL_AFTER_ALL);
    cr_expect_eq(cm_event_parse("batch_ending", &ev), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "batch_ending"));
    cr_expect(cm_event_is_after(CM_EVENT_AFTER_LOSS) && cm_event_is_after(CM_EVENT_FIT_END) &&
              cm_event_is_after(CM_EVENT_EPOCH_END) && cm_event_is_after(CM_EVENT_AFTER_DATALOADER));
    cr_expect(cm_event_is_before(CM_EVENT_BEFORE_LOSS) && cm_event_is_before(CM_EVENT_FIT_START));
    cr_expect(!cm_event_is_after(CM_EVENT_INIT) && !cm_event_is_before(CM_EVENT_INIT) &&
              !cm_event_is_after(CM_EVENT_BATCH_CHECKPOINT) && !cm_event_is_before(CM_EVENT_EPOCH_CHECKPOINT));
    cr_expect_eq(CM_EVENT_COUNT, 40);
}
