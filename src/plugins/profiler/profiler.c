/* The profiler (composer/profiler.h): the schedule, the callback that binds it to a trainer, the
 * engine hook that switches recording on and off per batch, markers, the op hook on the tape, the
 * system sampling thread, and handing finished cycles to the trace handlers. */
#include "plugins/profiler/profiler_impl.h"
#include "base/prof_impl.h"
#include "plugins/sysstat_impl.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* ---- actions and the schedule ---- */

static const char *const k_action_names[] = {
#define CM_X_(name, str) str,
    CM_PROFILER_ACTION_LIST(CM_X_)
#undef CM_X_
};

const char *cm_profiler_action_name(cm_profiler_action a) {
    return (unsigned)a < CM_PROFILER_ACTION_COUNT ? k_action_names[a] : "?";
}

cm_cyclic_schedule cm_cyclic_schedule_default(void) { return (cm_cyclic_schedule){0, 0, 1, 4, 1}; }

cm_status cm_cyclic_schedule_check(const cm_cyclic_schedule *s) {
    if (!s) return cm_set_error(CM_ERR_INVALID_ARG, "cyclic_schedule: NULL");
    const struct {
        const char *name;
        int64_t v;
    } f[] = {{"skip_first", s->skip_first}, {"wait", s->wait}, {"warmup", s->warmup}, {"repeat", s->repeat}};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++)
        if (f[i].v < 0)
            return cm_set_error(CM_ERR_INVALID_ARG, "cyclic_schedule: %s %lld must be >= 0", f[i].name, (long long)f[i].v);
    if (s->active < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "cyclic_schedule: active %lld must be >= 1 (batches recorded per cycle)",
                            (long long)s->active);
    return CM_OK;
}

cm_profiler_action cm_cyclic_schedule_action(const cm_cyclic_schedule *s, int64_t b, int64_t len, int64_t start) {
    if (!s || b < 0 || (len >= 0 && b >= len)) return CM_PROFILER_ACTION_SKIP;
    const int64_t first = s->skip_first + (start > 0 ? start : 0);
    const int64_t cycle = s->wait + s->warmup + s->active;
    if (b < first || cycle <= 0) return CM_PROFILER_ACTION_SKIP;
    if (s->repeat != 0 && b >= first + cycle * s->repeat) return CM_PROFILER_ACTION_SKIP;
    const int64_t pos = (b - first) % cycle;
    if (pos < s->wait) return CM_PROFILER_ACTION_SKIP;
    if (pos < s->wait + s->warmup) return CM_PROFILER_ACTION_WARMUP;
    if (pos == cycle - 1 || (len > 0 && b == len - 1)) return CM_PROFILER_ACTION_ACTIVE_AND_SAVE;
    return CM_PROFILER_ACTION_ACTIVE;
}

/* ---- the profiler ---- */

struct cm_marker {
    cm_profiler *p;
    char *name, *cat;
    unsigned actions;
    bool instant_on_start, instant_on_finish;
    bool started, recorded;
};

typedef struct op_frame {
    const char *op;
    int64_t t0, child_ns;
} op_frame;

enum { MAX_OP_FRAMES = 64 };

struct cm_profiler {
    /* configuration */
    cm_cyclic_schedule sched;
    cm_trace_handler *handlers;
    int n_handlers;
    bool record_ops, sys_cpu, sys_memory, sys_disk, sys_net;
    double interval_s;
    FILE *summary;
    int row_limit;
    cmi_prof *rec;
    /* the run it is bound to (INIT to close) */
    const cm_state *st;
    bool bound, closed;
    int rank, world;
    int32_t main_tid;
    cm_profiler_action action;
    bool cycle_open, save_pending;
    cm_timestamp save_ts;
    int64_t n_cycles;
    int64_t sync_ns, sync_err_ns;
    int64_t resume_epoch, resume_batch;
    cm_status deferred; /* an error in the engine hook, reported by the callback */
    char deferred_msg[1024];
    /* markers */
    cm_marker **markers;
    int n_markers, cap_markers;
    /* ops */
    op_frame frames[MAX_OP_FRAMES];
    int n_frames;
    bool in_backward;
    int64_t bw_t0;
    cm_tape *hooked; /* the tape the op hook is on */
    cmi_op_stats stats;
    /* the sampling thread */
    pthread_t thread;
    bool thread_on, stop;
    int32_t sampler_tid;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

/* The profiler bound to a trainer now (one per process: the hooks are process-wide). */
static pthread_mutex_t g_bind_mu = PTHREAD_MUTEX_INITIALIZER;
static cm_profiler *g_bound;

cm_profiler_config cm_profiler_config_default(void) {
    return (cm_profiler_config){
        .schedule = cm_cyclic_schedule_default(),
        .trace_handlers = NULL,
        .n_trace_handlers = 0,
        .record_ops = true,
        .sys_prof_cpu = true,
        .sys_prof_memory = false,
        .sys_prof_disk = false,
        .sys_prof_net = false,
        .sys_prof_stats_thread_interval_seconds = 0.5,
        .summary_stream = NULL,
        .summary_row_limit = 20,
    };
}

cm_marker_config cm_marker_config_default(void) {
    return (cm_marker_config){CM_PROFILER_ACTIONS_RECORDING, false, false, ""};
}

cm_profiler *cm_profiler_of(const cm_state *st) {
    pthread_mutex_lock(&g_bind_mu);
    cm_profiler *p = g_bound && st && g_bound->st == st ? g_bound : NULL;
    pthread_mutex_unlock(&g_bind_mu);
    return p;
}

cm_profiler_action cm_profiler_action_now(const cm_profiler *p) { return p ? p->action : CM_PROFILER_ACTION_SKIP; }
int64_t cm_profiler_n_cycles(const cm_profiler *p) { return p ? p->n_cycles : 0; }
int cm_profiler_n_op_stats(const cm_profiler *p) { return p ? cmi_op_stats_n((cmi_op_stats *)&p->stats) : 0; }
const cm_op_stat *cm_profiler_op_stat(const cm_profiler *p, int i) {
    return p ? cmi_op_stats_at((cmi_op_stats *)&p->stats, i) : NULL;
}
size_t cm_profiler_op_table(const cm_profiler *p, int row_limit, char *buf, size_t cap) {
    if (!p) return 0;
    return cmi_op_stats_table((cmi_op_stats *)&p->stats, row_limit, buf, cap);
}

static void defer(cm_profiler *p, cm_status s) {
    if (p->deferred || !s) return;
    p->deferred = s;
    snprintf(p->deferred_msg, sizeof p->deferred_msg, "%s", cm_last_error());
}

/* ---- the op hook ---- */

static bool counting(const cm_profiler *p) {
    return p->action == CM_PROFILER_ACTION_ACTIVE || p->action == CM_PROFILER_ACTION_ACTIVE_AND_SAVE;
}

static void op_args(char *buf, size_t cap, const cm_tensor *out, int n_in, cm_tensor *const *ins, double flops) {
    size_t k = (size_t)snprintf(buf, cap, "{\"shapes\": [");
    for (int i = 0; i < n_in && k < cap; i++) {
        k += (size_t)snprintf(buf + k, cap - k, "%s[", i ? ", " : "");
        for (int d = 0; ins[i] && d < cm_tensor_ndim(ins[i]) && k < cap; d++)
            k += (size_t)snprintf(buf + k, cap - k, "%s%lld", d ? ", " : "", (long long)cm_tensor_shape(ins[i])[d]);
        if (k < cap) k += (size_t)snprintf(buf + k, cap - k, "]");
    }
    if (k < cap) k += (size_t)snprintf(buf + k, cap - k, "], \"dtypes\": [");
    for (int i = 0; i < n_in && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s\"%s\"", i ? ", " : "", ins[i] ? cm_dtype_name(cm_tensor_dtype(ins[i])) : "");
    if (k < cap && out)
        k += (size_t)snprintf(buf + k, cap - k, "], \"out\": \"%s\", \"flops\": %.17g}", cm_dtype_name(cm_tensor_dtype(out)),
                              flops);
    if (k >= cap) snprintf(buf, cap, "{\"flops\": %.17g}", flops); /* too many inputs to list */
}

static void emit_op(cm_profiler *p, const char *op, bool backward, int64_t t0, int64_t t1, int64_t child_ns,
                    const cm_tensor *out, int n_in, cm_tensor *const *ins) {
    const double flops = cm_op_flops(op, backward, out, n_in, ins);
    char name[96], args[1024];
    snprintf(name, sizeof name, "%s%s", op, backward ? "_backward" : "");
    op_args(args, sizeof args, out, n_in, ins, flops);
    cmi_prof_complete(name, backward ? "op,backward" : "op", t0, t1, args);
    if (counting(p) && cmi_op_stats_add(&p->stats, name, t1 - t0, t1 - t0 - child_ns, flops))
        defer(p, cm_set_error(CM_ERR_OOM, "profiler: out of memory for the op table"));
}

static void op_hook(cm_tape_op_phase phase, const char *op, const cm_tensor *out, int n_in, cm_tensor *const *ins,
                    void *data) {
    cm_profiler *p = data;
    switch (phase) {
    case CM_TAPE_OP_BEGIN:
        if (p->in_backward) return; /* ops a backward function runs are part of it */
        if (p->n_frames == MAX_OP_FRAMES) p->n_frames = 0; /* ops that recorded nothing pile up: start over */
        p->frames[p->n_frames++] = (op_frame){op, cmi_prof_now_ns(), 0};
        return;
    case CM_TAPE_OP_RECORDED: {
        if (p->in_backward) return;
        int i = p->n_frames - 1;
        while (i >= 0 && strcmp(p->frames[i].op, op)) i--;
        if (i < 0) return;
        const int64_t t1 = cmi_prof_now_ns();
        const op_frame f = p->frames[i];
        p->n_frames = i; /* frames above it recorded nothing (gradients off for them) */
        if (i > 0) p->frames[i - 1].child_ns += t1 - f.t0;
        emit_op(p, op, false, f.t0, t1, f.child_ns, out, n_in, ins);
        return;
    }
    case CM_TAPE_OP_BACKWARD_BEGIN:
        p->in_backward = true;
        p->bw_t0 = cmi_prof_now_ns();
        return;
    case CM_TAPE_OP_BACKWARD_END:
        p->in_backward = false;
        emit_op(p, op, true, p->bw_t0, cmi_prof_now_ns(), 0, out, n_in, ins);
        return;
    }
}

/* ---- recording on and off ---- */

static void set_action(cm_profiler *p, cm_profiler_action a) {
    p->action = a;
    const bool on = a != CM_PROFILER_ACTION_SKIP;
    cmi_prof_set_active(on ? p->rec : NULL);
    cm_tape *tp = p->st ? cm_state_tape(p->st) : NULL;
    p->n_frames = 0, p->in_backward = false;
    if (p->hooked && p->hooked != tp) cm_tape_set_op_hook(p->hooked, NULL, NULL);
    p->hooked = NULL;
    if (tp) {
        cm_tape_set_op_hook(tp, on && p->record_ops ? op_hook : NULL, p);
        if (on && p->record_ops) p->hooked = tp;
    }
}

static cm_status barrier(void *data) {
    cm_profiler *p = data;
    if (!p->st || p->world <= 1) return CM_OK;
    double x = 0;
    return cm_state_all_reduce_sum(p->st, &x, 1);
}

/* A new cycle: every rank reads its clock between two barriers (Composer's clock sync). */
static void open_cycle(cm_profiler *p) {
    const int64_t a = cmi_prof_now_ns();
    cm_status s = barrier(p);
    p->sync_ns = cmi_prof_now_ns();
    if (!s) s = barrier(p);
    p->sync_err_ns = cmi_prof_now_ns() - a;
    defer(p, s);
    p->cycle_open = true;
}

/* Hands the recorded events to the trace handlers. */
static void write_cycle(cm_profiler *p, const cm_timestamp *ts) {
    p->cycle_open = p->save_pending = false;
    cmi_prof_list l;
    int64_t dropped = 0;
    cm_status s = cmi_prof_take(p->rec, cmi_prof_now_ns(), &l, &dropped);
    if (s) {
        defer(p, s);
        return;
    }
    cm_trace_event *ev = l.n ? cm_alloc(sizeof *ev * (size_t)l.n, 16) : NULL;
    if (l.n && !ev) {
        cmi_prof_list_free(&l);
        defer(p, cm_set_error(CM_ERR_OOM, "profiler: out of memory handing over %lld events", (long long)l.n));
        return;
    }
    for (int64_t i = 0; i < l.n; i++) {
        const cmi_prof_event *e = &l.ev[i];
        ev[i] = (cm_trace_event){e->ph, e->name, e->cat, e->ts_ns, e->dur_ns, p->rank, e->tid, e->id, e->args};
    }
    pthread_mutex_lock(&p->mu);
    const int32_t sampler = p->sampler_tid;
    pthread_mutex_unlock(&p->mu);
    cm_trace_thread threads[2] = {{p->main_tid, "Training Loop"}, {sampler, "System Profiler"}};
    const cm_trace_cycle c = {ev, l.n, threads, sampler ? 2 : 1, p->n_cycles, ts, p->sync_ns, p->sync_err_ns, dropped};
    if (dropped)
        cm_log_msg(CM_LOG_WARN, "profiler: %lld event(s) of cycle %lld were lost for lack of memory", (long long)dropped,
                   (long long)p->n_cycles);
    /* every handler runs (each may hold a barrier the other ranks wait in) */
    for (int i = 0; i < p->n_handlers; i++) {
        cm_clear_error();
        cm_status hs = p->handlers[i].vt->save(p->handlers[i].self, &c);
        if (hs) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            defer(p, cm_set_error(hs, "%s: %s", p->handlers[i].vt->name, msg));
        }
    }
    p->n_cycles++;
    cm_free(ev);
    cmi_prof_list_free(&l);
}

/* The engine calls this at the start of every event of every engine: only the bound state's
 * train batches matter. */
static void on_event(void *data, int evi, void *state) {
    cm_profiler *p = data;
    if (!p->bound || state != p->st) return;
    const cm_event ev = (cm_event)evi;
    const cm_timestamp *ts = cm_state_timestamp(p->st);
    switch (ev) {
    case CM_EVENT_BEFORE_DATALOADER: {
        if (p->save_pending) write_cycle(p, &p->save_ts);
        const int64_t start = ts->epoch == p->resume_epoch ? p->resume_batch : 0;
        cm_profiler_action a =
            cm_cyclic_schedule_action(&p->sched, ts->batch_in_epoch, cm_state_dataloader_len(p->st), start);
        /* a max_duration in batches ends the epoch early: its last batch saves too */
        const cm_time md = cm_state_max_duration(p->st);
        if ((a == CM_PROFILER_ACTION_ACTIVE || a == CM_PROFILER_ACTION_WARMUP) && md.unit == CM_TIME_BATCH &&
            ts->batch + 1 == md.count)
            a = CM_PROFILER_ACTION_ACTIVE_AND_SAVE;
        if (a == CM_PROFILER_ACTION_SKIP && p->cycle_open) write_cycle(p, ts);
        if (a != CM_PROFILER_ACTION_SKIP && !p->cycle_open) open_cycle(p);
        set_action(p, a);
        if (a == CM_PROFILER_ACTION_ACTIVE_AND_SAVE) p->save_pending = true, p->save_ts = *ts;
        return;
    }
    case CM_EVENT_BATCH_END:
        if (p->save_pending) p->save_ts = *ts; /* the file is named after the batches done */
        return;
    case CM_EVENT_FIT_END:
        if (p->cycle_open) write_cycle(p, p->save_pending ? &p->save_ts : ts);
        set_action(p, CM_PROFILER_ACTION_SKIP);
        return;
    default:
        return;
    }
}

/* ---- the sampling thread ---- */

static void counter1(const char *name, const char *cat, const char *series, double v) {
    cmi_prof_counter(name, cat, &series, &v, 1);
}

static void sample(cm_profiler *p, const cmi_sysstat *prev, const cmi_sysstat *now) {
    if (p->sys_cpu) {
        const double sys = cmi_sysstat_cpu_percent(prev, now), proc = cmi_sysstat_proc_percent(prev, now);
        if (sys >= 0) counter1("cpu", "cpu", "cpu_percent", sys);
        if (proc >= 0) counter1("cpu/process", "cpu", "cpu_percent", proc);
    }
    if (p->sys_memory) {
        if (now->rss_bytes >= 0) counter1("memory/process", "memory", "rss_bytes", (double)now->rss_bytes);
        if (now->mem_total >= 0 && now->mem_available >= 0) {
            const char *series[2] = {"used_bytes", "available_bytes"};
            const double v[2] = {(double)(now->mem_total - now->mem_available), (double)now->mem_available};
            cmi_prof_counter("memory/virtual", "memory", series, v, 2);
        }
    }
    if (p->sys_disk) {
        const char *series[2] = {"read_bytes", "write_bytes"};
        char name[64];
        for (int i = 0; i < now->n_disks; i++) {
            const double v[2] = {(double)now->disks[i].a, (double)now->disks[i].b};
            snprintf(name, sizeof name, "disk/%s", now->disks[i].name);
            cmi_prof_counter(name, "disk", series, v, 2);
        }
        if (now->io_read_bytes >= 0) {
            const double v[2] = {(double)now->io_read_bytes, (double)now->io_write_bytes};
            cmi_prof_counter("disk/process", "disk", series, v, 2);
        }
    }
    if (p->sys_net) {
        const char *series[2] = {"bytes_sent", "bytes_recv"};
        char name[64];
        for (int i = 0; i < now->n_nics; i++) {
            const double v[2] = {(double)now->nics[i].a, (double)now->nics[i].b};
            snprintf(name, sizeof name, "network/%s", now->nics[i].name);
            cmi_prof_counter(name, "net", series, v, 2);
        }
    }
}

static void *sampler_main(void *arg) {
    cm_profiler *p = arg;
    pthread_mutex_lock(&p->mu);
    p->sampler_tid = cmi_prof_tid();
    pthread_mutex_unlock(&p->mu);
    cmi_sysstat prev, now;
    cmi_sysstat_read(&prev, p->sys_cpu, p->sys_memory, p->sys_disk, p->sys_net);
    for (;;) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        const double t = (double)until.tv_sec + until.tv_nsec * 1e-9 + p->interval_s;
        until.tv_sec = (time_t)t;
        until.tv_nsec = (long)((t - (double)until.tv_sec) * 1e9);
        pthread_mutex_lock(&p->mu);
        while (!p->stop && pthread_cond_timedwait(&p->cv, &p->mu, &until) == 0) {
        }
        const bool stop = p->stop;
        pthread_mutex_unlock(&p->mu);
        if (stop) break;
        cmi_sysstat_read(&now, p->sys_cpu, p->sys_memory, p->sys_disk, p->sys_net);
        if (cmi_prof_on()) sample(p, &prev, &now);
        prev = now;
    }
    return NULL;
}

static void start_sampler(cm_profiler *p) {
    if (p->thread_on || !(p->sys_cpu || p->sys_memory || p->sys_disk || p->sys_net)) return;
    p->stop = false;
    if (pthread_create(&p->thread, NULL, sampler_main, p) == 0) p->thread_on = true;
    else cm_log_msg(CM_LOG_WARN, "profiler: cannot start the system sampling thread; no system counters");
}

static void stop_sampler(cm_profiler *p) {
    if (!p->thread_on) return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    p->thread_on = false;
}

/* ---- the callback ---- */

static cm_status bind(cm_profiler *p, const cm_state *st) {
    pthread_mutex_lock(&g_bind_mu);
    if (g_bound && g_bound != p) {
        pthread_mutex_unlock(&g_bind_mu);
        return cm_set_error(CM_ERR_STATE, "another profiler is recording in this process (one profiled trainer at a "
                                          "time: close the other trainer first)");
    }
    g_bound = p;
    pthread_mutex_unlock(&g_bind_mu);
    p->st = st;
    p->rank = cm_state_rank(st), p->world = cm_state_world_size(st);
    p->main_tid = cmi_prof_tid();
    p->bound = true, p->closed = false;
    cmi_prof_event_hook = (cmi_prof_hook){on_event, p};
    const cm_trace_run run = {cm_state_run_name(st), p->rank, p->world, barrier, p};
    for (int i = 0; i < p->n_handlers; i++) {
        if (!p->handlers[i].vt->init) continue;
        cm_clear_error();
        cm_status s = p->handlers[i].vt->init(p->handlers[i].self, &run);
        if (s) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            return cm_set_error(s, "%s: %s", p->handlers[i].vt->name, msg);
        }
    }
    return CM_OK;
}

static void unbind(cm_profiler *p) {
    set_action(p, CM_PROFILER_ACTION_SKIP);
    if (p->hooked) cm_tape_set_op_hook(p->hooked, NULL, NULL), p->hooked = NULL;
    pthread_mutex_lock(&g_bind_mu);
    if (g_bound == p) {
        g_bound = NULL;
        cmi_prof_event_hook = (cmi_prof_hook){NULL, NULL};
        cmi_prof_set_active(NULL);
    }
    pthread_mutex_unlock(&g_bind_mu);
    p->bound = false;
}

static cm_status take_deferred(cm_profiler *p) {
    if (!p->deferred) return CM_OK;
    cm_status s = p->deferred;
    p->deferred = CM_OK;
    return cm_set_error(s, "%s", p->deferred_msg);
}

static cm_status pr_run_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    cm_profiler *p = self;
    switch (ev) {
    case CM_EVENT_INIT: {
        cm_status s = bind(p, st);
        if (s) unbind(p);
        return s;
    }
    case CM_EVENT_AFTER_LOAD: /* skip_first counts from here in the epoch a run resumes in */
        p->resume_epoch = cm_state_timestamp(st)->epoch;
        p->resume_batch = cm_state_timestamp(st)->batch_in_epoch;
        break;
    case CM_EVENT_FIT_START:
        start_sampler(p);
        break;
    case CM_EVENT_FIT_END:
        stop_sampler(p);
        break;
    default:
        break;
    }
    return take_deferred(p);
}

static cm_status pr_close(void *self, const cm_state *st, cm_logger *lg) {
    cm_profiler *p = self;
    if (!p->bound) return take_deferred(p);
    stop_sampler(p);
    if (p->cycle_open) write_cycle(p, p->save_pending ? &p->save_ts : cm_state_timestamp(st));
    cm_status s = take_deferred(p);
    for (int i = 0; i < p->n_handlers; i++) {
        if (!p->handlers[i].vt->close) continue;
        cm_clear_error();
        cm_status hs = p->handlers[i].vt->close(p->handlers[i].self);
        if (hs && !s) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            s = cm_set_error(hs, "%s: %s", p->handlers[i].vt->name, msg);
        }
    }
    if (p->summary && cmi_op_stats_n(&p->stats) > 0) {
        const size_t need = cmi_op_stats_table(&p->stats, p->row_limit, NULL, 0);
        char *buf = cm_alloc(need + 1, 1);
        if (buf) {
            cmi_op_stats_table(&p->stats, p->row_limit, buf, need + 1);
            fprintf(p->summary, "profiler: ops of the %lld ACTIVE batch(es) recorded (rank %d)\n%s",
                    (long long)cm_profiler_n_cycles(p), p->rank, buf);
            fflush(p->summary);
            cm_free(buf);
        }
    }
    unbind(p);
    p->closed = true;
    return s;
}

static void pr_free(void *self) {
    cm_profiler *p = self;
    if (!p) return;
    stop_sampler(p);
    if (p->bound) unbind(p);
    for (int i = 0; i < p->n_handlers; i++) cm_trace_handler_free(p->handlers[i]);
    cm_free(p->handlers);
    for (int i = 0; i < p->n_markers; i++) {
        cm_free(p->markers[i]->name), cm_free(p->markers[i]->cat);
        cm_free(p->markers[i]);
    }
    cm_free(p->markers);
    cmi_op_stats_free(&p->stats);
    cmi_prof_free(p->rec);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    cm_free(p);
}

static const cm_callback_i profiler_vt = {
    .abi = CM_CALLBACK_ABI,
    .name = "Profiler",
    .run_event = pr_run_event,
    .save = NULL,
    .load = NULL,
    .close = pr_close,
    .free = pr_free,
};

cm_status cm_profiler_new(const cm_profiler_config *cfg, cm_profiler **handle, cm_callback_plugin *plugin) {
    if (!cfg || !handle || !plugin) return cm_set_error(CM_ERR_INVALID_ARG, "cm_profiler_new: NULL argument");
    *handle = NULL;
    *plugin = (cm_callback_plugin){0};
    cm_status s = cm_cyclic_schedule_check(&cfg->schedule);
    if (s) return s;
    if (cfg->n_trace_handlers < 0 || (cfg->n_trace_handlers > 0 && !cfg->trace_handlers))
        return cm_set_error(CM_ERR_INVALID_ARG, "profiler: n_trace_handlers %d without a trace_handlers array",
                            cfg->n_trace_handlers);
    for (int i = 0; i < cfg->n_trace_handlers; i++) {
        const cm_trace_handler_i *vt = cfg->trace_handlers[i].vt;
        if (!vt || vt->abi != CM_TRACE_HANDLER_ABI || !vt->name || !vt->save || !vt->free)
            return cm_set_error(CM_ERR_INVALID_ARG, "profiler: trace_handlers[%d] needs abi %d, a name, save and free",
                                i, CM_TRACE_HANDLER_ABI);
    }
    const double iv = cfg->sys_prof_stats_thread_interval_seconds;
    if (!(iv > 0) || !isfinite(iv))
        return cm_set_error(CM_ERR_INVALID_ARG, "profiler: sys_prof_stats_thread_interval_seconds %g must be > 0", iv);
    if (cfg->summary_row_limit < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "profiler: summary_row_limit %d must be >= 0 (0 = all)",
                            cfg->summary_row_limit);
    cm_profiler *p = cm_alloc_zeroed(sizeof *p, 64);
    if (!p) return cm_set_error(CM_ERR_OOM, "profiler: out of memory");
    pthread_mutex_init(&p->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    if ((s = cmi_prof_new(&p->rec))) {
        pr_free(p);
        return s;
    }
    if (cfg->n_trace_handlers &&
        !(p->handlers = cm_alloc(sizeof *p->handlers * (size_t)cfg->n_trace_handlers, 16))) {
        pr_free(p);
        return cm_set_error(CM_ERR_OOM, "profiler: out of memory");
    }
    p->sched = cfg->schedule;
    p->record_ops = cfg->record_ops;
    p->sys_cpu = cfg->sys_prof_cpu, p->sys_memory = cfg->sys_prof_memory;
    p->sys_disk = cfg->sys_prof_disk, p->sys_net = cfg->sys_prof_net;
    p->interval_s = iv;
    p->summary = cfg->summary_stream;
    p->row_limit = cfg->summary_row_limit;
    p->action = CM_PROFILER_ACTION_SKIP;
    for (int i = 0; i < cfg->n_trace_handlers; i++) p->handlers[i] = cfg->trace_handlers[i];
    p->n_handlers = cfg->n_trace_handlers;
    *handle = p;
    *plugin = (cm_callback_plugin){&profiler_vt, p};
    return CM_OK;
}

/* ---- markers ---- */

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = cm_alloc(n, 1);
    if (d) memcpy(d, s, n);
    return d;
}

cm_status cm_profiler_marker(cm_profiler *p, const char *name, const cm_marker_config *cfg, cm_marker **out) {
    if (!p || !name || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_profiler_marker: NULL argument");
    *out = NULL;
    if (!name[0]) return cm_set_error(CM_ERR_INVALID_ARG, "profiler marker: the name is empty");
    const cm_marker_config c = cfg ? *cfg : cm_marker_config_default();
    if (!(c.actions & ((1u << CM_PROFILER_ACTION_COUNT) - 1)))
        return cm_set_error(CM_ERR_INVALID_ARG, "profiler marker '%s': actions 0x%x name no action (use "
                                                "CM_PROFILER_ACTIONS(ACTIVE) | ...)", name, c.actions);
    for (int i = 0; i < p->n_markers; i++) {
        cm_marker *m = p->markers[i];
        if (strcmp(m->name, name)) continue;
        if (cfg) { /* as Composer: a later call updates the categories */
            char *cat = dup_str(c.categories ? c.categories : "");
            if (!cat) return cm_set_error(CM_ERR_OOM, "profiler: out of memory");
            cm_free(m->cat);
            m->cat = cat;
        }
        *out = m;
        return CM_OK;
    }
    if (p->n_markers == p->cap_markers) {
        const int cap = p->cap_markers ? 2 * p->cap_markers : 16;
        cm_marker **nm = cm_alloc(sizeof *nm * (size_t)cap, 16);
        if (!nm) return cm_set_error(CM_ERR_OOM, "profiler: out of memory");
        if (p->n_markers) memcpy(nm, p->markers, sizeof *nm * (size_t)p->n_markers);
        cm_free(p->markers);
        p->markers = nm, p->cap_markers = cap;
    }
    cm_marker *m = cm_alloc_zeroed(sizeof *m, 16);
    if (m) {
        m->name = dup_str(name);
        m->cat = dup_str(c.categories ? c.categories : "");
    }
    if (!m || !m->name || !m->cat) {
        if (m) cm_free(m->name), cm_free(m->cat);
        cm_free(m);
        return cm_set_error(CM_ERR_OOM, "profiler: out of memory");
    }
    m->p = p;
    m->actions = c.actions;
    m->instant_on_start = c.record_instant_on_start;
    m->instant_on_finish = c.record_instant_on_finish;
    p->markers[p->n_markers++] = m;
    *out = m;
    return CM_OK;
}

static bool should_record(const cm_marker *m) { return (m->actions >> m->p->action) & 1u; }

cm_status cm_marker_start(cm_marker *m) {
    if (!m) return cm_set_error(CM_ERR_INVALID_ARG, "cm_marker_start: marker is NULL");
    if (m->started)
        return cm_set_error(CM_ERR_STATE, "profiler marker '%s': started again before it finished", m->name);
    m->started = true;
    m->recorded = should_record(m);
    if (m->recorded) {
        cmi_prof_begin_in(m->p->rec, m->name, m->cat, NULL);
        if (m->instant_on_start) cmi_prof_instant_in(m->p->rec, m->name, m->cat, NULL);
    }
    return CM_OK;
}

cm_status cm_marker_finish(cm_marker *m) {
    if (!m) return cm_set_error(CM_ERR_INVALID_ARG, "cm_marker_finish: marker is NULL");
    if (!m->started) return cm_set_error(CM_ERR_STATE, "profiler marker '%s': finished but not started", m->name);
    m->started = false;
    if (m->recorded) {
        cmi_prof_end_in(m->p->rec, m->name);
        if (m->instant_on_finish) cmi_prof_instant_in(m->p->rec, m->name, m->cat, NULL);
    }
    return CM_OK;
}

void cm_marker_instant(cm_marker *m) {
    if (m && should_record(m)) cmi_prof_instant_in(m->p->rec, m->name, m->cat, NULL);
}

void cm_marker_counter(cm_marker *m, const char *const *series, const double *values, int n) {
    if (m && series && values && n > 0 && should_record(m)) cmi_prof_counter_in(m->p->rec, m->name, m->cat, series, values, n);
}
