/* The engine on its own: algorithm order and FILO reversal on AFTER_* events, ordering passes,
 * callbacks after algorithms and loggers last (first on INIT), traces, error attribution, close
 * running every plugin, ownership on registration, the logging handle. */
#include "cmtest.h"
#include "cmtrain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char g_log[4096];
static void note(const char *s) {
    strcat(g_log, s);
    strcat(g_log, " ");
}

typedef struct {
    const char *name;
    cm_event only;      /* CM_EVENT_COUNT: every event */
    cm_event fail_on;   /* CM_EVENT_COUNT: never */
    cm_status close_st; /* what close returns */
    int *freed;
} plug;

static bool p_match(void *self, cm_event ev, const cm_state *st) {
    plug *p = self;
    return p->only == CM_EVENT_COUNT || p->only == ev;
}
static cm_status p_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    plug *p = self;
    char b[64];
    snprintf(b, sizeof b, "a:%s", p->name);
    note(b);
    if (ev == p->fail_on) return cm_set_error(CM_ERR_INVALID_ARG, "%s says no", p->name);
    return CM_OK;
}
static cm_status p_close_alg(void *self, cm_state *st, cm_logger *lg) {
    plug *p = self;
    char b[64];
    snprintf(b, sizeof b, "close:%s", p->name);
    note(b);
    return p->close_st ? cm_set_error(p->close_st, "%s close failed", p->name) : CM_OK;
}
static void p_free(void *self) {
    plug *p = self;
    if (p->freed) (*p->freed)++;
    free(p);
}
static cm_status p_cb(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    plug *p = self;
    char b[64];
    snprintf(b, sizeof b, "c:%s", p->name);
    note(b);
    if (ev == p->fail_on) return cm_set_error(CM_ERR_IO, "%s broke", p->name);
    return CM_OK;
}
static cm_status p_close_cb(void *self, const cm_state *st, cm_logger *lg) { return p_close_alg(self, NULL, lg); }
static cm_status p_lg_init(void *self, const cm_state *st) {
    plug *p = self;
    char b[64];
    snprintf(b, sizeof b, "init:%s", p->name);
    note(b);
    return CM_OK;
}
static cm_status p_lg_event(void *self, cm_event ev, const cm_state *st) { return p_cb(self, ev, st, NULL); }
static cm_status p_lg_close(void *self, const cm_state *st) { return p_close_alg(self, NULL, NULL); }
static cm_status p_lg_metrics(void *self, const cm_metric_value *v, int n, const cm_timestamp *ts) {
    plug *p = self;
    char b[128];
    snprintf(b, sizeof b, "m:%s:%s=%g", p->name, v[0].name, v[0].value);
    note(b);
    return p->fail_on == CM_EVENT_INIT ? cm_set_error(CM_ERR_IO, "disk full") : CM_OK;
}

static const cm_algorithm_i alg_vt = {CM_ALGORITHM_ABI, "Alg", p_match, p_apply, NULL, NULL, p_close_alg, p_free, NULL};
static const cm_callback_i cb_vt = {CM_CALLBACK_ABI, "Cb", p_cb, NULL, NULL, p_close_cb, p_free};
static const cm_logger_i lg_vt = {CM_LOGGER_ABI, "Lg", p_lg_init, NULL, p_lg_metrics, p_lg_event, NULL, p_lg_close, p_free, NULL, NULL, NULL};

static plug *mk(const char *name) {
    plug *p = calloc(1, sizeof *p);
    p->name = name;
    p->only = CM_EVENT_COUNT;
    p->fail_on = CM_EVENT_COUNT;
    return p;
}

/* Algorithms report their own names through a per-instance vtable copy so errors name them. */
static cm_algorithm_i vts[8];
static cm_algorithm_plugin alg(int i, plug *p) {
    vts[i] = alg_vt;
    vts[i].name = p->name;
    return (cm_algorithm_plugin){&vts[i], p};
}

static cm_engine *engine(cm_state **st) {
    g_log[0] = '\0';
    cr_assert_eq(cm_state_new(st), CM_OK);
    cm_engine *e;
    cr_assert_eq(cm_engine_new(*st, &e), CM_OK);
    return e;
}

Test(engine, algorithms_in_order_and_reversed_on_after_events) {
    cm_state *st;
    cm_engine *e = engine(&st);
    cr_assert_eq(cm_engine_add_algorithm(e, alg(0, mk("A"))), CM_OK);
    cr_assert_eq(cm_engine_add_algorithm(e, alg(1, mk("B"))), CM_OK);
    cr_assert_eq(cm_engine_add_algorithm(e, alg(2, mk("C"))), CM_OK);
    cr_assert_eq(cm_engine_run_event(e, CM_EVENT_BEFORE_LOSS), CM_OK);
    cr_expect_str_eq(g_log, "a:A a:B a:C ");
    g_log[0] = '\0';
    cr_assert_eq(cm_engine_run_event(e, CM_EVENT_AFTER_LOSS), CM_OK);
    cr_expect_str_eq(g_log, "a:C a:B a:A ", "FILO on AFTER_*: %s", g_log);
    cr_assert_eq(cm_engine_n_traces(e), 3);
    cr_expect_str_eq(cm_engine_trace(e, 0)->algorithm, "C");
    cr_expect_eq(cm_engine_trace(e, 0)->event, CM_EVENT_AFTER_LOSS);
    cr_expect_eq(cm_engine_trace(e, 2)->order, 2);
    g_log[0] = '\0';
    cr_assert_eq(cm_engine_run_event(e, CM_EVENT_BATCH_CHECKPOINT), CM_OK); /* neither before nor after */
    cr_expect_str_eq(g_log, "a:A a:B a:C ");
    cr_expect_eq(cm_engine_n_applied(e, 1), 3);
    cm_engine_free(e);
    cm_state_free(st);
}

Test(engine, filo_reverses_only_the_events_named_after_as_composer) {
    cm_state *st;
    cm_engine *e = engine(&st);
    cm_engine_add_algorithm(e, alg(0, mk("A")));
    cm_engine_add_algorithm(e, alg(1, mk("B")));
    const cm_event reversed[] = {CM_EVENT_AFTER_LOAD, CM_EVENT_AFTER_DATALOADER, CM_EVENT_AFTER_FORWARD,
                                 CM_EVENT_AFTER_LOSS, CM_EVENT_AFTER_BACKWARD, CM_EVENT_AFTER_TRAIN_BATCH};
    for (size_t i = 0; i < sizeof reversed / sizeof *reversed; i++) {
        g_log[0] = '\0';
        cr_assert_eq(cm_engine_run_event(e, reversed[i]), CM_OK);
        cr_expect_str_eq(g_log, "a:B a:A ", "%s: %s", cm_event_name(reversed[i]), g_log);
    }
    /* Composer's is_after_event holds for these, but set_filo_order only looks at the AFTER_ prefix */
    const cm_event kept[] = {CM_EVENT_BATCH_END, CM_EVENT_EPOCH_END, CM_EVENT_FIT_END, CM_EVENT_EVAL_AFTER_FORWARD,
                             CM_EVENT_EVAL_END, CM_EVENT_PREDICT_AFTER_FORWARD};
    for (size_t i = 0; i < sizeof kept / sizeof *kept; i++) {
        cr_assert(cm_event_is_after(kept[i]));
        g_log[0] = '\0';
        cr_assert_eq(cm_engine_run_event(e, kept[i]), CM_OK);
        cr_expect_str_eq(g_log, "a:A a:B ", "%s: %s", cm_event_name(kept[i]), g_log);
    }
    cm_engine_free(e);
    cm_state_free(st);
}

Test(engine, selective_backprop_first_and_low_precision_layernorm_last_then_filo_as_composer) {
    cm_state *st;
    cm_engine *e = engine(&st);
    cm_engine_add_algorithm(e, alg(0, mk("LowPrecisionLayerNorm")));
    cm_engine_add_algorithm(e, alg(1, mk("A")));
    cm_engine_add_algorithm(e, alg(2, mk("SelectiveBackprop")));
    cm_engine_add_algorithm(e, alg(3, mk("B")));
    cm_engine_add_algorithm(e, alg(4, mk("C")));
    cr_assert_eq(cm_engine_run_event(e, CM_EVENT_INIT), CM_OK);
    cr_expect_str_eq(g_log, "a:SelectiveBackprop a:A a:B a:C a:LowPrecisionLayerNorm ", "INIT: %s", g_log);
    /* Composer's passes run the two moves before FILO, so on an AFTER_ event the whole sorted
     * order is reversed: SelectiveBackprop last on AFTER_DATALOADER */
    g_log[0] = '\0';
    cr_assert_eq(cm_engine_run_event(e, CM_EVENT_AFTER_DATALOADER), CM_OK);
    cr_expect_str_eq(g_log, "a:LowPrecisionLayerNorm a:C a:B a:A a:SelectiveBackprop ", "AFTER_DATALOADER: %s", g_log);
    /* *_END events are not reversed */
    g_log[0] = '\0';
    cr_assert_eq(cm_engine_run_event(e, CM_EVENT_BATCH_END), CM_OK);
    cr_expect_str_eq(g_log, "a:SelectiveBackprop a:A a:B a:C a:LowPrecisionLayerNorm ", "BATCH_END: %s", g_log);
    cm_engine_free(e);
    cm_state_free(st);
}

Test(engine, placement_passes_are_stable) {
    cm_algorithm *a[6];
    static cm_algorithm_i v[6];
    const char *names[6] = {"X", "SelectiveBackprop", "Y", "LowPrecisionLayerNorm", "SelectiveBackprop",
                            "LowPrecisionLayerNorm"};
    cm_state *st;
    cm_engine *e = engine(&st);
    for (int i = 0; i < 6; i++) {
        v[i] = alg_vt;
        v[i].name = names[i];
        cr_assert_eq(cm_engine_add_algorithm(e, (cm_algorithm_plugin){&v[i], mk(names[i])}), CM_OK);
        a[i] = cm_engine_algorithm(e, i);
    }
    cm_algorithm *r[6];
    memcpy(r, a, sizeof r);
    cr_assert_eq(cm_ordering_pass_selective_backprop_first(r, 6, CM_EVENT_INIT, st, NULL), 6);
    cm_algorithm *want1[6] = {a[1], a[4], a[0], a[2], a[3], a[5]};
    for (int i = 0; i < 6; i++) cr_expect_eq(r[i], want1[i], "front: slot %d", i);
    cr_assert_eq(cm_ordering_pass_low_precision_layernorm_last(r, 6, CM_EVENT_INIT, st, NULL), 6);
    cm_algorithm *want2[6] = {a[1], a[4], a[0], a[2], a[3], a[5]};
    for (int i = 0; i < 6; i++) cr_expect_eq(r[i], want2[i], "back (already last): slot %d", i);
    memcpy(r, a, sizeof r);
    cr_assert_eq(cm_ordering_pass_low_precision_layernorm_last(r, 6, CM_EVENT_INIT, st, NULL), 6);
    cm_algorithm *want3[6] = {a[0], a[1], a[2], a[4], a[3], a[5]};
    for (int i = 0; i < 6; i++) cr_expect_eq(r[i], want3[i], "back: slot %d", i);
    cm_engine_free(e);
    cm_state_free(st);
}

Test(engine, only_matching_algorithms_run_and_are_traced) {
    cm_state *st;
    cm_engine *e = engine(&st);
    plug *a = mk("A"), *b = mk("B");
    b->only = CM_EVENT_AFTER_TRAIN_BATCH;
    cm_engine_add_algorithm(e, alg(0, a));
    cm_engine_add_algorithm(e, alg(1, b));
    cr_assert_eq(cm_engine_run_event(e, CM_EVENT_BATCH_START), CM_OK);
    cr_expect_str_eq(g_log, "a:A ");
    cr_expect_eq(cm_engine_n_traces(e), 1);
    cm_engine_free(e);
    cm_state_free(st);
}

static int reverse_names(cm_algorithm **algs, int n, cm_event ev, const cm_state *st, void *data) {
    /* puts "C" first and drops "B" */
    int k = 0;
    cm_algorithm *c = NULL;
    cm_algorithm *keep[8];
    for (int i = 0; i < n; i++) {
        if (!strcmp(cm_algorithm_name(algs[i]), "C"))
            c = algs[i];
        else if (strcmp(cm_algorithm_name(algs[i]), "B"))
            keep[k++] = algs[i];
    }
    int m = 0;
    if (c) algs[m++] = c;
    for (int i = 0; i < k; i++) algs[m++] = keep[i];
    (*(int *)data)++;
    return m;
}

static int bad_pass(cm_algorithm **algs, int n, cm_event ev, const cm_state *st, void *data) { return n + 1; }

Test(engine, ordering_passes_reorder_and_drop_after_the_built_in_ones) {
    cm_state *st;
    cm_engine *e = engine(&st);
    cm_engine_add_algorithm(e, alg(0, mk("A")));
    cm_engine_add_algorithm(e, alg(1, mk("B")));
    cm_engine_add_algorithm(e, alg(2, mk("C")));
    cm_engine_add_algorithm(e, alg(3, mk("D")));
    int calls = 0;
    cr_assert_eq(cm_engine_add_ordering_pass(e, (cm_ordering_pass){reverse_names, &calls}, -1), CM_OK);
    cr_assert_eq(cm_engine_run_event(e, CM_EVENT_BEFORE_FORWARD), CM_OK);
    cr_expect_str_eq(g_log, "a:C a:A a:D ", "%s", g_log);
    g_log[0] = '\0';
    cr_assert_eq(cm_engine_run_event(e, CM_EVENT_AFTER_FORWARD), CM_OK); /* FILO first: D C B A -> C D A */
    cr_expect_str_eq(g_log, "a:C a:D a:A ", "%s", g_log);
    cr_expect_eq(calls, 2);
    cr_expect_eq(cm_engine_add_ordering_pass(e, (cm_ordering_pass){bad_pass, NULL}, 7), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_engine_add_ordering_pass(e, (cm_ordering_pass){bad_pass, NULL}, 0), CM_OK);
    cr_expect_eq(cm_engine_run_event(e, CM_EVENT_BEFORE_FORWARD), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "ordering pass 0 returned 5"), "%s", cm_last_error());
    cm_engine_free(e);
    cm_state_free(st);
}

Test(engine, callbacks_after_algorithms_loggers_last_and_first_on_init) {
    cm_state *st;
    cm_engine *e = engine(&st);
    cm_engine_add_algorithm(e, alg(0, mk("A")));
    cr_assert_eq(cm_engine_add_callback(e, (cm_callback_plugin){&cb_vt, mk("X")}), CM_OK);
    cr_assert_eq(cm_engine_add_logger(e, (cm_logger_plugin){&lg_vt, mk("L")}), CM_OK);
    cr_assert_eq(cm_engine_run_event(e, CM_EVENT_INIT), CM_OK);
    cr_expect_str_eq(g_log, "init:L c:L c:X a:A ", "INIT: %s", g_log);
    g_log[0] = '\0';
    cr_assert_eq(cm_engine_run_event(e, CM_EVENT_BATCH_END), CM_OK);
    cr_expect_str_eq(g_log, "a:A c:X c:L ", "BATCH_END: %s", g_log);
    cm_engine_free(e);
    cm_state_free(st);
}

Test(engine, first_failure_stops_the_event_and_names_plugin_and_event) {
    cm_state *st;
    cm_engine *e = engine(&st);
    plug *b = mk("Clipper");
    b->fail_on = CM_EVENT_AFTER_TRAIN_BATCH;
    cm_engine_add_algorithm(e, alg(0, mk("A")));
    cm_engine_add_algorithm(e, alg(1, b));
    cm_engine_add_algorithm(e, alg(2, mk("C")));
    cm_engine_add_callback(e, (cm_callback_plugin){&cb_vt, mk("X")});
    cr_assert_eq(cm_engine_run_event(e, CM_EVENT_AFTER_TRAIN_BATCH), CM_ERR_INVALID_ARG);
    cr_expect_str_eq(cm_last_error(), "plugin 'Clipper' failed on AFTER_TRAIN_BATCH: Clipper says no");
    cr_expect_str_eq(g_log, "a:C a:Clipper ", "nothing after the failure ran: %s", g_log);
    cr_expect_eq(cm_engine_trace(e, 1)->status, CM_ERR_INVALID_ARG);
    /* a failing callback is named too */
    g_log[0] = '\0';
    plug *y = mk("Watcher");
    y->fail_on = CM_EVENT_EPOCH_END;
    static cm_callback_i watcher_vt;
    watcher_vt = cb_vt;
    watcher_vt.name = "Watcher";
    cm_engine_add_callback(e, (cm_callback_plugin){&watcher_vt, y});
    cr_assert_eq(cm_engine_run_event(e, CM_EVENT_EPOCH_END), CM_ERR_IO);
    cr_expect_str_eq(cm_last_error(), "plugin 'Watcher' failed on EPOCH_END: Watcher broke");
    cm_engine_free(e);
    cm_state_free(st);
}

Test(engine, close_runs_every_plugin_and_returns_the_first_error) {
    cm_state *st;
    cm_engine *e = engine(&st);
    int freed = 0;
    plug *a = mk("A"), *b = mk("B"), *x = mk("X"), *l = mk("L");
    a->freed = b->freed = x->freed = l->freed = &freed;
    b->close_st = CM_ERR_IO;
    x->close_st = CM_ERR_STATE;
    cm_engine_add_algorithm(e, alg(0, a));
    cm_engine_add_algorithm(e, alg(1, b));
    cm_engine_add_callback(e, (cm_callback_plugin){&cb_vt, x});
    cm_engine_add_logger(e, (cm_logger_plugin){&lg_vt, l});
    cr_assert_eq(cm_engine_close(e), CM_ERR_IO);
    cr_expect_str_eq(cm_last_error(), "plugin 'B' failed to close: B close failed");
    cr_expect_str_eq(g_log, "close:A close:B close:X close:L ", "%s", g_log);
    cr_expect_eq(cm_engine_close(e), CM_OK, "second close is a no-op");
    cr_expect_eq(cm_engine_run_event(e, CM_EVENT_BATCH_END), CM_ERR_STATE);
    cr_expect_eq(cm_engine_add_algorithm(e, alg(2, mk("late"))), CM_ERR_STATE);
    cm_engine_free(e);
    cr_expect_eq(freed, 4);
    cm_state_free(st);
}

Test(engine, registration_checks_vtables_and_takes_ownership_only_on_success) {
    cm_state *st;
    cm_engine *e = engine(&st);
    int freed = 0;
    plug *p = mk("P");
    p->freed = &freed;
    cm_algorithm_i bad = alg_vt;
    bad.abi = 99;
    cr_expect_eq(cm_engine_add_algorithm(e, (cm_algorithm_plugin){&bad, p}), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "abi 1 (got 99)"), "%s", cm_last_error());
    bad = alg_vt;
    bad.match = NULL;
    cr_expect_eq(cm_engine_add_algorithm(e, (cm_algorithm_plugin){&bad, p}), CM_ERR_INVALID_ARG);
    cm_callback_i badc = cb_vt;
    badc.run_event = NULL;
    cr_expect_eq(cm_engine_add_callback(e, (cm_callback_plugin){&badc, p}), CM_ERR_INVALID_ARG);
    cm_logger_i badl = lg_vt;
    badl.log_metrics = NULL;
    cr_expect_eq(cm_engine_add_logger(e, (cm_logger_plugin){&badl, p}), CM_ERR_INVALID_ARG);
    cm_engine_free(e);
    cr_expect_eq(freed, 0, "rejected plugins are not freed by the engine");
    cm_algorithm_plugin_free((cm_algorithm_plugin){&alg_vt, p});
    cr_expect_eq(freed, 1);
    cr_expect_eq(cm_engine_new(NULL, &e), CM_ERR_INVALID_ARG);
    cm_state_free(st);
}

Test(engine, logger_handle_reaches_every_logger_and_reports_the_first_failure) {
    cm_state *st;
    cm_engine *e = engine(&st);
    plug *l1 = mk("L1"), *l2 = mk("L2");
    l1->fail_on = CM_EVENT_INIT; /* p_lg_metrics fails for this one */
    cm_engine_add_logger(e, (cm_logger_plugin){&lg_vt, l1});
    cm_engine_add_logger(e, (cm_logger_plugin){&lg_vt, l2});
    cm_in_memory_logger *mem;
    cm_logger_plugin mp;
    cr_assert_eq(cm_in_memory_logger_new(&mem, &mp), CM_OK);
    cr_assert_eq(cm_engine_add_logger(e, mp), CM_OK);
    cr_expect_eq(cm_logger_log_metric(cm_engine_logger(e), "loss/train/total", 2.5), CM_ERR_IO);
    cr_expect_str_eq(cm_last_error(), "logger 'Lg' failed to log metrics: disk full");
    cr_expect_str_eq(g_log, "m:L1:loss/train/total=2.5 m:L2:loss/train/total=2.5 ", "%s", g_log);
    double v;
    cr_assert_eq(cm_in_memory_logger_last(mem, "loss/train/total", &v), CM_OK);
    cr_expect_eq(v, 2.5);
    cr_expect_eq(cm_in_memory_logger_count(mem, "loss/train/total"), 1);
    cr_expect_eq(cm_in_memory_logger_last(mem, "nope", &v), CM_ERR_NOT_FOUND);
    cm_hparam h = {"seed", CM_HPARAM_NUMBER, 42, NULL};
    cr_expect_eq(cm_logger_log_hyperparameters(cm_engine_logger(e), &h, 1), CM_OK);
    cr_expect_str_eq(cm_in_memory_logger_hparam(mem, "seed"), "42");
    cm_engine_free(e);
    cm_state_free(st);
}
