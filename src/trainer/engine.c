/* The engine: registered plugins, ordering passes, running an event, tracing, closing; and the
 * logging handle that fans out to every logger. */
#include "trainer/trainer_impl.h"
#include "base/prof_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

struct cm_algorithm {
    const cm_algorithm_i *vt;
    void *self;
    int index; /* registration order */
};

struct cm_logger {
    cm_engine *engine;
};

struct cm_engine {
    cm_state *st;
    cm_algorithm **algs; /* pointers, so handles stay put when the array grows */
    int64_t *n_applied;
    int n_algs, cap_algs;
    cm_algorithm **run; /* scratch: the matched algorithms of an event (cap_algs) */
    cm_callback_plugin *cbs;
    int n_cbs, cap_cbs;
    cm_logger_plugin *lgs;
    int n_lgs, cap_lgs;
    cm_ordering_pass *passes;
    int n_passes, cap_passes;
    cm_trace *traces; /* cap_algs */
    int n_traces;
    cm_logger logger;
    bool closed;
};

/* Grows *arr (elements of `size` bytes, *cap of them) to hold `need`. */
static cm_status grow(void **arr, int *cap, size_t size, int need) {
    if (need <= *cap) return CM_OK;
    int ncap = *cap ? *cap * 2 : 4;
    while (ncap < need) ncap *= 2;
    void *n = cm_alloc_zeroed(size * (size_t)ncap, 16);
    if (!n) return CM_ERR_OOM;
    if (*arr) memcpy(n, *arr, size * (size_t)*cap);
    cm_free(*arr);
    *arr = n;
    *cap = ncap;
    return CM_OK;
}

void cm_algorithm_plugin_free(cm_algorithm_plugin p) {
    if (p.vt && p.vt->free && p.self) p.vt->free(p.self);
}
void cm_callback_plugin_free(cm_callback_plugin p) {
    if (p.vt && p.vt->free && p.self) p.vt->free(p.self);
}
void cm_logger_plugin_free(cm_logger_plugin p) {
    if (p.vt && p.vt->free && p.self) p.vt->free(p.self);
}

const char *cm_algorithm_name(const cm_algorithm *a) { return a ? a->vt->name : "?"; }
void *cm_algorithm_self(const cm_algorithm *a) { return a ? a->self : NULL; }
const cm_algorithm_i *cm_algorithm_vtable(const cm_algorithm *a) { return a ? a->vt : NULL; }

/* Composer's set_filo_order: reversed on the events whose name starts with AFTER_ (AFTER_LOAD,
 * AFTER_DATALOADER, AFTER_FORWARD, AFTER_LOSS, AFTER_BACKWARD, AFTER_TRAIN_BATCH); *_END events and
 * EVAL_AFTER_FORWARD keep the registration order. */
int cm_ordering_pass_filo(cm_algorithm **algs, int n, cm_event ev, const cm_state *st, void *data) {
    if (!strncmp(cm_event_name(ev), "AFTER_", 6))
        for (int i = 0, j = n - 1; i < j; i++, j--) {
            cm_algorithm *t = algs[i];
            algs[i] = algs[j];
            algs[j] = t;
        }
    return n;
}

/* Stable partition in place: the algorithms called `name` to the front (front) or to the back,
 * every other algorithm keeping its relative order (Python's sorted() with a boolean key). */
static void move_named(cm_algorithm **algs, int n, const char *name, bool front) {
    int k = front ? 0 : n - 1; /* next slot for a hit */
    for (int c = 0; c < n; c++) {
        const int i = front ? c : n - 1 - c;
        if (strcmp(algs[i]->vt->name, name)) continue;
        cm_algorithm *hit = algs[i];
        if (front) {
            memmove(algs + k + 1, algs + k, sizeof *algs * (size_t)(i - k));
            algs[k++] = hit;
        } else {
            memmove(algs + i, algs + i + 1, sizeof *algs * (size_t)(k - i));
            algs[k--] = hit;
        }
    }
}

int cm_ordering_pass_selective_backprop_first(cm_algorithm **algs, int n, cm_event ev, const cm_state *st,
                                              void *data) {
    move_named(algs, n, "SelectiveBackprop", true);
    return n;
}

int cm_ordering_pass_low_precision_layernorm_last(cm_algorithm **algs, int n, cm_event ev, const cm_state *st,
                                                  void *data) {
    move_named(algs, n, "LowPrecisionLayerNorm", false);
    return n;
}

cm_status cm_engine_new(cm_state *st, cm_engine **out) {
    if (!out || !st) return cm_set_error(CM_ERR_INVALID_ARG, "cm_engine_new: NULL %s", out ? "state" : "out");
    *out = NULL;
    cm_engine *e = cm_alloc_zeroed(sizeof *e, 16);
    if (!e) return CM_ERR_OOM;
    e->st = st;
    e->logger.engine = e;
    if (grow((void **)&e->passes, &e->cap_passes, sizeof *e->passes, 3)) {
        cm_free(e);
        return CM_ERR_OOM;
    }
    /* Composer's _get_default_passes order: the two placement rules, then FILO (so on AFTER_*
     * events the reversal has the last word, as in Composer) */
    e->passes[e->n_passes++] = (cm_ordering_pass){cm_ordering_pass_selective_backprop_first, NULL};
    e->passes[e->n_passes++] = (cm_ordering_pass){cm_ordering_pass_low_precision_layernorm_last, NULL};
    e->passes[e->n_passes++] = (cm_ordering_pass){cm_ordering_pass_filo, NULL};
    *out = e;
    return CM_OK;
}

void cm_engine_free(cm_engine *e) {
    if (!e) return;
    if (!e->closed && cm_engine_close(e) != CM_OK)
        cm_log_msg(CM_LOG_WARN, "engine: closing the plugins: %s", cm_last_error());
    for (int i = 0; i < e->n_algs; i++) {
        cm_algorithm_plugin_free((cm_algorithm_plugin){e->algs[i]->vt, e->algs[i]->self});
        cm_free(e->algs[i]);
    }
    for (int i = 0; i < e->n_cbs; i++) cm_callback_plugin_free(e->cbs[i]);
    for (int i = 0; i < e->n_lgs; i++) cm_logger_plugin_free(e->lgs[i]);
    cm_free(e->algs);
    cm_free(e->n_applied);
    cm_free(e->run);
    cm_free(e->traces);
    cm_free(e->cbs);
    cm_free(e->lgs);
    cm_free(e->passes);
    cm_free(e);
}

void cmi_engine_release(cm_engine *e) {
    for (int i = 0; i < e->n_algs; i++) cm_free(e->algs[i]);
    e->n_algs = e->n_cbs = e->n_lgs = 0;
    e->closed = true;
}

int cmi_engine_order_all(cm_engine *e, cm_event ev, cm_algorithm **out) {
    int n = e->n_algs;
    for (int i = 0; i < n; i++) out[i] = e->algs[i];
    for (int p = 0; p < e->n_passes && n > 0; p++) {
        int m = e->passes[p].fn(out, n, ev, e->st, e->passes[p].data);
        if (m < 0 || m > n) {
            cm_set_error(CM_ERR_INVALID_ARG, "ordering pass %d returned %d algorithms on %s (must be 0..%d)", p, m,
                         cm_event_name(ev), n);
            return -1;
        }
        n = m;
    }
    return n;
}

void cmi_engine_pop_algorithms(cm_engine *e, int n) {
    for (; n > 0 && e->n_algs > 0; n--) {
        cm_algorithm *a = e->algs[--e->n_algs];
        cm_algorithm_plugin_free((cm_algorithm_plugin){a->vt, a->self});
        cm_free(a);
    }
}

static cm_status check_open(const cm_engine *e, const char *what) {
    if (!e) return cm_set_error(CM_ERR_INVALID_ARG, "%s: engine is NULL", what);
    if (e->closed) return cm_set_error(CM_ERR_STATE, "%s: the engine is closed (after cm_trainer_close)", what);
    return CM_OK;
}

cm_status cm_engine_add_algorithm(cm_engine *e, cm_algorithm_plugin p) {
    cm_status s = check_open(e, "cm_engine_add_algorithm");
    if (s) return s;
    if (!p.vt || p.vt->abi != CM_ALGORITHM_ABI || !p.vt->name || !p.vt->match || !p.vt->apply)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "algorithm '%s': the vtable needs abi %d (got %d), a name, match and apply",
                            p.vt && p.vt->name ? p.vt->name : "?", CM_ALGORITHM_ABI, p.vt ? p.vt->abi : -1);
    if (e->n_algs == e->cap_algs) { /* grow the four per-algorithm arrays together */
        int ncap = e->cap_algs ? e->cap_algs * 2 : 4;
        cm_algorithm **algs = cm_alloc_zeroed(sizeof *algs * (size_t)ncap, 16);
        cm_algorithm **run = cm_alloc_zeroed(sizeof *run * (size_t)ncap, 16);
        int64_t *applied = cm_alloc_zeroed(sizeof *applied * (size_t)ncap, 16);
        cm_trace *traces = cm_alloc_zeroed(sizeof *traces * (size_t)ncap, 16);
        if (!algs || !run || !applied || !traces) {
            cm_free(algs), cm_free(run), cm_free(applied), cm_free(traces);
            return CM_ERR_OOM;
        }
        if (e->n_algs) {
            memcpy(algs, e->algs, sizeof *algs * (size_t)e->n_algs);
            memcpy(applied, e->n_applied, sizeof *applied * (size_t)e->n_algs);
        }
        cm_free(e->algs), cm_free(e->run), cm_free(e->n_applied), cm_free(e->traces);
        e->algs = algs, e->run = run, e->n_applied = applied, e->traces = traces;
        e->cap_algs = ncap;
    }
    cm_algorithm *a = cm_alloc_zeroed(sizeof *a, 16);
    if (!a) return CM_ERR_OOM;
    *a = (cm_algorithm){p.vt, p.self, e->n_algs};
    e->n_applied[e->n_algs] = 0;
    e->algs[e->n_algs++] = a;
    return CM_OK;
}

cm_status cm_engine_add_callback(cm_engine *e, cm_callback_plugin p) {
    cm_status s = check_open(e, "cm_engine_add_callback");
    if (s) return s;
    if (!p.vt || p.vt->abi != CM_CALLBACK_ABI || !p.vt->name || !p.vt->run_event)
        return cm_set_error(CM_ERR_INVALID_ARG, "callback '%s': the vtable needs abi %d (got %d), a name and run_event",
                            p.vt && p.vt->name ? p.vt->name : "?", CM_CALLBACK_ABI, p.vt ? p.vt->abi : -1);
    if (grow((void **)&e->cbs, &e->cap_cbs, sizeof *e->cbs, e->n_cbs + 1)) return CM_ERR_OOM;
    e->cbs[e->n_cbs++] = p;
    return CM_OK;
}

cm_status cm_engine_add_logger(cm_engine *e, cm_logger_plugin p) {
    cm_status s = check_open(e, "cm_engine_add_logger");
    if (s) return s;
    if (!p.vt || p.vt->abi != CM_LOGGER_ABI || !p.vt->name || !p.vt->log_metrics)
        return cm_set_error(CM_ERR_INVALID_ARG, "logger '%s': the vtable needs abi %d (got %d), a name and log_metrics",
                            p.vt && p.vt->name ? p.vt->name : "?", CM_LOGGER_ABI, p.vt ? p.vt->abi : -1);
    if (grow((void **)&e->lgs, &e->cap_lgs, sizeof *e->lgs, e->n_lgs + 1)) return CM_ERR_OOM;
    e->lgs[e->n_lgs++] = p;
    return CM_OK;
}

cm_status cm_engine_add_ordering_pass(cm_engine *e, cm_ordering_pass pass, int index) {
    if (!e || !pass.fn) return cm_set_error(CM_ERR_INVALID_ARG, "cm_engine_add_ordering_pass: NULL engine or pass");
    if (index < -1 || index > e->n_passes)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_engine_add_ordering_pass: index %d is out of range (-1..%d)",
                            index, e->n_passes);
    if (grow((void **)&e->passes, &e->cap_passes, sizeof *e->passes, e->n_passes + 1)) return CM_ERR_OOM;
    if (index == -1) index = e->n_passes;
    memmove(e->passes + index + 1, e->passes + index, sizeof *e->passes * (size_t)(e->n_passes - index));
    e->passes[index] = pass;
    e->n_passes++;
    return CM_OK;
}

int cm_engine_n_algorithms(const cm_engine *e) { return e ? e->n_algs : 0; }
cm_algorithm *cm_engine_algorithm(const cm_engine *e, int i) {
    return e && i >= 0 && i < e->n_algs ? e->algs[i] : NULL;
}
int cm_engine_n_callbacks(const cm_engine *e) { return e ? e->n_cbs : 0; }
cm_callback_plugin cm_engine_callback(const cm_engine *e, int i) {
    return e && i >= 0 && i < e->n_cbs ? e->cbs[i] : (cm_callback_plugin){NULL, NULL};
}
int cm_engine_n_loggers(const cm_engine *e) { return e ? e->n_lgs : 0; }
cm_logger_plugin cm_engine_logger_plugin(const cm_engine *e, int i) {
    return e && i >= 0 && i < e->n_lgs ? e->lgs[i] : (cm_logger_plugin){NULL, NULL};
}
cm_logger *cm_engine_logger(cm_engine *e) { return e ? &e->logger : NULL; }
int cm_engine_n_traces(const cm_engine *e) { return e ? e->n_traces : 0; }
const cm_trace *cm_engine_trace(const cm_engine *e, int i) {
    return e && i >= 0 && i < e->n_traces ? &e->traces[i] : NULL;
}
int64_t cm_engine_n_applied(const cm_engine *e, int i) { return e && i >= 0 && i < e->n_algs ? e->n_applied[i] : 0; }

/* ---- profiling (composer/profiler.h): event pairs as slices, each plugin call as a complete
 * event; nothing but a load and a branch when no profiler records ---- */

/* Composer's Event.canonical_name: the value without before_/after_/_start/_end ("batch",
 * "forward", "eval_forward"), as the slice "event/<canonical>". */
static char g_pair_names[CM_EVENT_COUNT][48];
static pthread_once_t g_pair_once = PTHREAD_ONCE_INIT;

static void cut(char *s, const char *what) {
    char *p;
    while ((p = strstr(s, what))) memmove(p, p + strlen(what), strlen(p + strlen(what)) + 1);
}

static void pair_names_init(void) {
    for (int i = 0; i < CM_EVENT_COUNT; i++) {
        char v[40];
        snprintf(v, sizeof v, "%s", cm_event_value((cm_event)i));
        cut(v, "before_"), cut(v, "after_"), cut(v, "_start"), cut(v, "_end");
        snprintf(g_pair_names[i], sizeof g_pair_names[i], "event/%s", v);
    }
}

static const char *pair_name(cm_event ev) {
    pthread_once(&g_pair_once, pair_names_init);
    return g_pair_names[ev];
}

/* A plugin call is a slice (begin/end, not a complete event): a marker the plugin leaves open is
 * then closed with it, so the trace still nests. */
static bool prof_call(bool begin, const char *kind, const char *name, cm_event ev) {
    char n[160];
    snprintf(n, sizeof n, "%s/%s/event/%s", kind, name, cm_event_value(ev));
    if (begin) {
        char cat[128];
        snprintf(cat, sizeof cat, "%s,%s", cm_event_value(ev), name);
        cmi_prof_begin(n, cat, NULL);
    } else {
        cmi_prof_end(n);
    }
    return true;
}

/* Rewrites the last error as "plugin '<name>' failed <what>: <message>". */
static cm_status blame(cm_status s, const char *name, const char *what) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", cm_last_status() != CM_OK && cm_last_error()[0] ? cm_last_error() : cm_status_str(s));
    return cm_set_error(s, "plugin '%s' failed %s: %s", name, what, msg);
}

static cm_status run_algorithms(cm_engine *e, cm_event ev) {
    int n = 0;
    for (int i = 0; i < e->n_algs; i++)
        if (e->algs[i]->vt->match(e->algs[i]->self, ev, e->st)) e->run[n++] = e->algs[i];
    for (int p = 0; p < e->n_passes && n > 0; p++) {
        int m = e->passes[p].fn(e->run, n, ev, e->st, e->passes[p].data);
        if (m < 0 || m > n)
            return cm_set_error(CM_ERR_INVALID_ARG, "ordering pass %d returned %d algorithms on %s (must be 0..%d)", p,
                                m, cm_event_name(ev), n);
        for (int i = 0; i < m; i++)
            if (!e->run[i] || e->run[i]->index < 0 || e->run[i]->index >= e->n_algs ||
                e->algs[e->run[i]->index] != e->run[i])
                return cm_set_error(CM_ERR_INVALID_ARG, "ordering pass %d left an unknown algorithm at %d on %s", p, i,
                                    cm_event_name(ev));
        n = m;
    }
    char what[64];
    snprintf(what, sizeof what, "on %s", cm_event_name(ev));
    for (int i = 0; i < n; i++) {
        cm_algorithm *a = e->run[i];
        cm_clear_error();
        const bool prof = cmi_prof_on() && prof_call(true, "algorithm", a->vt->name, ev);
        cm_status s = a->vt->apply(a->self, ev, e->st, &e->logger);
        if (prof) prof_call(false, "algorithm", a->vt->name, ev);
        e->traces[e->n_traces++] = (cm_trace){a->vt->name, ev, i, s};
        e->n_applied[a->index]++;
        cm_log_msg(CM_LOG_DEBUG, "engine: %s: %s (order %d) %s", cm_event_name(ev), a->vt->name, i,
                   s ? cm_status_name(s) : "ok");
        if (s) return blame(s, a->vt->name, what);
    }
    return CM_OK;
}

static cm_status run_callbacks(cm_engine *e, cm_event ev) {
    char what[64];
    snprintf(what, sizeof what, "on %s", cm_event_name(ev));
    for (int i = 0; i < e->n_cbs; i++) {
        cm_clear_error();
        const bool prof = cmi_prof_on() && prof_call(true, "callback", e->cbs[i].vt->name, ev);
        cm_status s = e->cbs[i].vt->run_event(e->cbs[i].self, ev, e->st, &e->logger);
        if (prof) prof_call(false, "callback", e->cbs[i].vt->name, ev);
        if (s) return blame(s, e->cbs[i].vt->name, what);
    }
    return CM_OK;
}

static cm_status run_loggers(cm_engine *e, cm_event ev) {
    char what[64];
    snprintf(what, sizeof what, "on %s", cm_event_name(ev));
    for (int i = 0; i < e->n_lgs; i++) {
        const cm_logger_i *vt = e->lgs[i].vt;
        cm_status s = CM_OK;
        cm_clear_error();
        const bool prof = vt->run_event && cmi_prof_on() && prof_call(true, "logger", vt->name, ev);
        if (ev == CM_EVENT_INIT && vt->init) s = vt->init(e->lgs[i].self, e->st);
        if (!s && vt->run_event) s = vt->run_event(e->lgs[i].self, ev, e->st);
        if (prof) prof_call(false, "logger", vt->name, ev);
        if (s) return blame(s, vt->name, what);
    }
    return CM_OK;
}

cm_status cm_engine_run_event(cm_engine *e, cm_event ev) {
    cm_status s = check_open(e, "cm_engine_run_event");
    if (s) return s;
    if ((unsigned)ev >= CM_EVENT_COUNT)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_engine_run_event: event %d is not valid", (int)ev);
    e->n_traces = 0;
    const cm_event prev = e->st->event;
    e->st->event = ev;
    /* the profiler decides first whether this event is recorded; an after event closes its pair's
     * slice before the plugins run and a before event opens it after them, as Composer's engine */
    if (cmi_prof_event_hook.fn) cmi_prof_event_hook.fn(cmi_prof_event_hook.data, (int)ev, e->st);
    if (cm_event_is_after(ev) && cmi_prof_on()) cmi_prof_end(pair_name(ev));
    if (ev == CM_EVENT_INIT) {
        if (!(s = run_loggers(e, ev)) && !(s = run_callbacks(e, ev))) s = run_algorithms(e, ev);
    } else if (!(s = run_algorithms(e, ev)) && !(s = run_callbacks(e, ev))) {
        s = run_loggers(e, ev);
    }
    e->st->event = prev;
    if (s) return s;
    if (cm_event_is_before(ev) && cmi_prof_on()) {
        char args[96];
        snprintf(args, sizeof args, "{\"epoch\": %lld, \"batch\": %lld}", (long long)e->st->ts.epoch,
                 (long long)e->st->ts.batch);
        cmi_prof_begin(pair_name(ev), "event", args);
    }
    return CM_OK;
}

cm_status cm_engine_close(cm_engine *e) {
    if (!e) return cm_set_error(CM_ERR_INVALID_ARG, "cm_engine_close: engine is NULL");
    if (e->closed) return CM_OK;
    e->closed = true;
    cm_status first = CM_OK;
    char first_msg[1024] = "";
#define CLOSE_ONE(call, name)                                                    \
    do {                                                                         \
        cm_clear_error();                                                        \
        cm_status s_ = (call);                                                   \
        if (s_ && !first) {                                                      \
            first = blame(s_, (name), "to close");                               \
            snprintf(first_msg, sizeof first_msg, "%s", cm_last_error());        \
        }                                                                        \
    } while (0)
    for (int i = 0; i < e->n_algs; i++)
        if (e->algs[i]->vt->close) CLOSE_ONE(e->algs[i]->vt->close(e->algs[i]->self, e->st, &e->logger), e->algs[i]->vt->name);
    for (int i = 0; i < e->n_cbs; i++)
        if (e->cbs[i].vt->close) CLOSE_ONE(e->cbs[i].vt->close(e->cbs[i].self, e->st, &e->logger), e->cbs[i].vt->name);
    for (int i = 0; i < e->n_lgs; i++) {
        if (e->lgs[i].vt->flush) CLOSE_ONE(e->lgs[i].vt->flush(e->lgs[i].self), e->lgs[i].vt->name);
        if (e->lgs[i].vt->close) CLOSE_ONE(e->lgs[i].vt->close(e->lgs[i].self, e->st), e->lgs[i].vt->name);
    }
#undef CLOSE_ONE
    if (first) return cm_set_error(first, "%s", first_msg);
    return CM_OK;
}

/* ---- the logging handle ---- */

cm_status cm_logger_log_metrics(cm_logger *lg, const cm_metric_value *values, int n) {
    if (!lg || (n > 0 && !values)) return cm_set_error(CM_ERR_INVALID_ARG, "cm_logger_log_metrics: NULL argument");
    cm_engine *e = lg->engine;
    cm_status first = CM_OK;
    char msg[1024] = "";
    for (int i = 0; i < e->n_lgs && n > 0; i++) {
        cm_clear_error();
        cm_status s = e->lgs[i].vt->log_metrics(e->lgs[i].self, values, n, &e->st->ts);
        if (s && !first) {
            first = s;
            snprintf(msg, sizeof msg, "logger '%s' failed to log metrics: %s", e->lgs[i].vt->name,
                     cm_last_error()[0] ? cm_last_error() : cm_status_str(s));
        }
    }
    return first ? cm_set_error(first, "%s", msg) : CM_OK;
}

cm_status cm_logger_log_metric(cm_logger *lg, const char *name, double value) {
    cm_metric_value v = {name, value};
    return cm_logger_log_metrics(lg, &v, 1);
}

cm_status cm_logger_log_text(cm_logger *lg, const char *key, const char *text) {
    if (!lg || !key || !text) return cm_set_error(CM_ERR_INVALID_ARG, "cm_logger_log_text: NULL argument");
    cm_engine *e = lg->engine;
    cm_status first = CM_OK;
    char msg[1024] = "";
    for (int i = 0; i < e->n_lgs; i++) {
        if (!e->lgs[i].vt->log_text) continue;
        cm_clear_error();
        cm_status s = e->lgs[i].vt->log_text(e->lgs[i].self, key, text, &e->st->ts);
        if (s && !first) {
            first = s;
            snprintf(msg, sizeof msg, "logger '%s' failed to log text: %s", e->lgs[i].vt->name,
                     cm_last_error()[0] ? cm_last_error() : cm_status_str(s));
        }
    }
    return first ? cm_set_error(first, "%s", msg) : CM_OK;
}

cm_status cm_logger_log_hyperparameters(cm_logger *lg, const cm_hparam *hparams, int n) {
    if (!lg || (n > 0 && !hparams))
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_logger_log_hyperparameters: NULL argument");
    cm_engine *e = lg->engine;
    cm_status first = CM_OK;
    char msg[1024] = "";
    for (int i = 0; i < e->n_lgs && n > 0; i++) {
        if (!e->lgs[i].vt->log_hyperparameters) continue;
        cm_clear_error();
        cm_status s = e->lgs[i].vt->log_hyperparameters(e->lgs[i].self, hparams, n);
        if (s && !first) {
            first = s;
            snprintf(msg, sizeof msg, "logger '%s' failed to log hyperparameters: %s", e->lgs[i].vt->name,
                     cm_last_error()[0] ? cm_last_error() : cm_status_str(s));
        }
    }
    return first ? cm_set_error(first, "%s", msg) : CM_OK;
}
