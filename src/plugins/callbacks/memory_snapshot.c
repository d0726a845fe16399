/* MemorySnapshot and OOMObserver: the tape arena sampled at every event of a training batch,
 * written as JSON with an SVG plot (the CPU analogue of Composer's CUDA memory snapshots). */
#include "cb_impl.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the timeline ---- */

typedef struct entry {
    double t_us;
    cm_event event;
    int64_t batch, microbatch;
    int64_t arena, peak, rss;
} entry;

typedef struct timeline {
    entry *v;
    int n, cap;
    double t0;
    int64_t peak;
} timeline;

static void tl_clear(timeline *t) {
    t->n = 0;
    t->peak = 0;
    t->t0 = cm_clock_s();
}

static void tl_add(timeline *t, cm_event ev, const cm_state *st, int64_t batch, int max_entries) {
    if (t->n >= max_entries) return;
    if (t->n == t->cap) {
        const int cap = t->cap ? 2 * t->cap : 256;
        entry *nv = cm_alloc(sizeof *nv * (size_t)cap, 16);
        if (!nv) return; /* a snapshot with fewer entries rather than a failed run */
        if (t->n) memcpy(nv, t->v, sizeof *nv * (size_t)t->n);
        cm_free(t->v);
        t->v = nv, t->cap = cap;
    }
    cm_tape *tp = cm_state_tape(st);
    cm_arena *a = tp ? cm_tape_arena(tp) : NULL;
    const int64_t used = a ? (int64_t)cm_arena_used(a) : 0;
    if (used > t->peak) t->peak = used;
    int64_t rss = 0;
    cm_process_memory(&rss, NULL);
    t->v[t->n++] = (entry){(cm_clock_s() - t->t0) * 1e6, ev, batch,
                           cm_state_microbatch_index(st), used, t->peak, rss};
}

static cm_status mkdirs(const char *who, const char *path) {
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                return cm_set_error(CM_ERR_IO, "%s: cannot create '%s': %s", who, tmp, strerror(errno));
            *p = '/';
        }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return cm_set_error(CM_ERR_IO, "%s: cannot create '%s': %s", who, tmp, strerror(errno));
    return CM_OK;
}

/* {run_name}, {rank}, {batch} */
static void expand(const char *fmt, const cm_state *st, int64_t batch, char *out, size_t cap) {
    size_t k = 0;
    for (const char *p = fmt; *p && k + 1 < cap; p++) {
        if (!strncmp(p, "{run_name}", 10)) k += (size_t)snprintf(out + k, cap - k, "%s", cm_state_run_name(st)), p += 9;
        else if (!strncmp(p, "{rank}", 6)) k += (size_t)snprintf(out + k, cap - k, "%d", cm_state_rank(st)), p += 5;
        else if (!strncmp(p, "{batch}", 7)) k += (size_t)snprintf(out + k, cap - k, "%lld", (long long)batch), p += 6;
        else out[k++] = *p;
        if (k >= cap) k = cap - 1;
    }
    out[k] = '\0';
}

/* The JSON (and the .svg beside it: `path` with its extension replaced) of a timeline. */
static cm_status tl_write(const char *who, const timeline *t, const char *path, const cm_state *st, const char *oom_json) {
    FILE *f = fopen(path, "w");
    if (!f) return cm_set_error(CM_ERR_IO, "%s: cannot write '%s': %s", who, path, strerror(errno));
    cm_tape *tp = cm_state_tape(st);
    const size_t budget = tp ? cm_arena_budget(cm_tape_arena(tp)) : 0;
    fprintf(f, "{\"rank\": %d, \"arena_budget_bytes\": %zu,%s%s%s \"entries\": [", cm_state_rank(st), budget,
            oom_json ? " \"oom\": " : "", oom_json ? oom_json : "", oom_json ? "," : "");
    for (int i = 0; i < t->n; i++) {
        const entry *e = &t->v[i];
        fprintf(f, "%s\n  {\"t_us\": %.3f, \"event\": \"%s\", \"batch\": %lld, \"microbatch\": %lld, \"arena_bytes\": %lld, "
                   "\"arena_peak_bytes\": %lld, \"rss_bytes\": %lld}",
                i ? "," : "", e->t_us, cm_event_value(e->event), (long long)e->batch, (long long)e->microbatch,
                (long long)e->arena, (long long)e->peak, (long long)e->rss);
    }
    fputs("\n]}\n", f);
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0) bad = true;
    if (bad) return cm_set_error(CM_ERR_IO, "%s: writing '%s' failed", who, path);
    /* the plot: arena bytes against time, one polyline */
    char svg[1100];
    snprintf(svg, sizeof svg, "%s", path);
    char *dot = strrchr(svg, '.');
    if (dot && !strchr(dot, '/')) *dot = '\0';
    strncat(svg, ".svg", sizeof svg - strlen(svg) - 1);
    if (!(f = fopen(svg, "w"))) return cm_set_error(CM_ERR_IO, "%s: cannot write '%s': %s", who, svg, strerror(errno));
    const double W = 800, H = 300, m = 50;
    double tmax = t->n ? t->v[t->n - 1].t_us : 1, ymax = 1;
    for (int i = 0; i < t->n; i++) ymax = (double)t->v[i].arena > ymax ? (double)t->v[i].arena : ymax;
    if (budget && (double)budget > ymax) ymax = (double)budget;
    if (tmax <= 0) tmax = 1;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
               "<text x=\"%g\" y=\"20\">%s: tape arena bytes (max %.0f) over %.1f ms, rank %d</text>\n"
               "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"",
            W, H, m, who, ymax, tmax / 1e3, cm_state_rank(st));
    for (int i = 0; i < t->n; i++)
        fprintf(f, "%.1f,%.1f ", m + (W - 2 * m) * t->v[i].t_us / tmax, H - m - (H - 2 * m) * (double)t->v[i].arena / ymax);
    fprintf(f, "\"/>\n");
    if (budget)
        fprintf(f, "<line x1=\"%g\" x2=\"%g\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"red\" stroke-dasharray=\"4\"/>\n", m, W - m,
                H - m - (H - 2 * m) * (double)budget / ymax, H - m - (H - 2 * m) * (double)budget / ymax);
    fprintf(f, "<line x1=\"%g\" x2=\"%g\" y1=\"%g\" y2=\"%g\" stroke=\"black\"/>\n</svg>\n", m, W - m, H - m, H - m);
    bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) return cm_set_error(CM_ERR_IO, "%s: writing '%s' failed", who, svg);
    return CM_OK;
}

/* ---- MemorySnapshot ---- */

typedef struct snap {
    cm_memory_snapshot_config cfg;
    char *folder, *filename;
    timeline tl;
    bool done;
} snap;

cm_memory_snapshot_config cm_memory_snapshot_config_default(void) {
    return (cm_memory_snapshot_config){1, {CM_TIME_BATCH, 3, 0}, 100000, "{run_name}/memory_traces",
                                       "rank{rank}.{batch}.memory_snapshot.json", false};
}

static cm_status ms_run_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    snap *s = self;
    if (s->done || !cm_state_tape(st)) return CM_OK;
    const cm_timestamp *ts = cm_state_timestamp(st);
    const int64_t first = s->cfg.skip_batches, last = first + s->cfg.interval.count - 1;
    /* the batch in progress: ts.batch until BATCH_END counts it */
    const int64_t b = ev == CM_EVENT_BATCH_END || ev == CM_EVENT_BATCH_CHECKPOINT ? ts->batch - 1 : ts->batch;
    if (ev == CM_EVENT_BATCH_START && b == first) tl_clear(&s->tl);
    if (b < first || b > last || ev < CM_EVENT_BATCH_START || ev > CM_EVENT_BATCH_END) return CM_OK;
    tl_add(&s->tl, ev, st, b, s->cfg.max_entries);
    if (ev != CM_EVENT_BATCH_END || b != last) return CM_OK;
    s->done = true;
    char dir[1024], name[512], path[1600];
    expand(s->folder, st, ts->batch, dir, sizeof dir);
    expand(s->filename, st, ts->batch, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cm_status r = mkdirs("MemorySnapshot", dir);
    if (!r && !s->cfg.overwrite && access(path, F_OK) == 0)
        r = cm_set_error(CM_ERR_IO, "MemorySnapshot: '%s' exists (set overwrite, or another folder)", path);
    if (!r) r = tl_write("MemorySnapshot", &s->tl, path, st, NULL);
    if (!r) cm_log_msg(CM_LOG_INFO, "MemorySnapshot: wrote %s (%d entries)", path, s->tl.n);
    return r;
}

static void ms_free(void *self) {
    snap *s = self;
    cm_free(s->tl.v), cm_free(s->folder), cm_free(s->filename);
    cm_free(s);
}

static const cm_callback_i snapshot_vt = {
    .abi = CM_CALLBACK_ABI,
    .name = "MemorySnapshot",
    .run_event = ms_run_event,
    .free = ms_free,
};

cm_status cm_memory_snapshot_new(const cm_memory_snapshot_config *cfg, cm_callback_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_memory_snapshot_new: out is NULL");
    *out = (cm_callback_plugin){0};
    const cm_memory_snapshot_config c = cfg ? *cfg : cm_memory_snapshot_config_default();
    if (c.skip_batches < 0) return cm_set_error(CM_ERR_INVALID_ARG, "MemorySnapshot: skip_batches %d must be >= 0", c.skip_batches);
    if (c.interval.unit != CM_TIME_BATCH || c.interval.count < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "MemorySnapshot: interval must be a positive count of ba (e.g. 3ba)");
    if (c.max_entries < 1) return cm_set_error(CM_ERR_INVALID_ARG, "MemorySnapshot: max_entries %d must be >= 1", c.max_entries);
    if (!c.folder || !c.folder[0] || !c.filename || !c.filename[0])
        return cm_set_error(CM_ERR_INVALID_ARG, "MemorySnapshot: folder and filename must not be empty");
    snap *s = cm_alloc_zeroed(sizeof *s, 16);
    if (!s || !(s->folder = cbi_strdup(c.folder)) || !(s->filename = cbi_strdup(c.filename))) {
        if (s) cm_free(s->folder);
        cm_free(s);
        return cm_set_error(CM_ERR_OOM, "MemorySnapshot: out of memory");
    }
    s->cfg = c;
    *out = (cm_callback_plugin){&snapshot_vt, s};
    return CM_OK;
}

/* ---- OOMObserver ---- */

typedef struct oom_obs {
    cm_oom_observer_config cfg;
    char *folder, *filename;
    timeline tl;
    const cm_state *st;
    cm_arena *hooked;
    cm_event last_event;
    int count;
} oom_obs;

cm_oom_observer_config cm_oom_observer_config_default(void) {
    return (cm_oom_observer_config){"{run_name}/traces", "rank{rank}_oom", 100000};
}

static void on_oom(size_t request, size_t used, size_t budget, void *data) {
    oom_obs *o = data;
    if (!o->st) return;
    o->count++;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", cm_last_error()); /* the arena's message: keep it for the caller */
    const cm_status err = cm_last_status();
    tl_add(&o->tl, o->last_event, o->st, cm_state_timestamp(o->st)->batch, o->cfg.max_entries);
    char dir[1024], name[512], path[1600], oom[512];
    expand(o->folder, o->st, cm_state_timestamp(o->st)->batch, dir, sizeof dir);
    expand(o->filename, o->st, cm_state_timestamp(o->st)->batch, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s.json", dir, name);
    snprintf(oom, sizeof oom, "{\"request_bytes\": %zu, \"used_bytes\": %zu, \"budget_bytes\": %zu, \"event\": \"%s\", "
                              "\"batch\": %lld, \"microbatch\": %lld, \"count\": %d}",
             request, used, budget, cm_event_value(o->last_event), (long long)cm_state_timestamp(o->st)->batch,
             (long long)cm_state_microbatch_index(o->st), o->count);
    cm_status s = mkdirs("OOMObserver", dir);
    if (!s) s = tl_write("OOMObserver", &o->tl, path, o->st, oom);
    if (s) cm_log_msg(CM_LOG_WARN, "OOMObserver: the snapshot of the out-of-memory could not be written: %s", cm_last_error());
    else cm_log_msg(CM_LOG_WARN, "OOMObserver: out of memory in batch %lld (a request of %zu bytes with %zu of %zu in use); "
                                 "the batch's arena timeline is in %s",
                    (long long)cm_state_timestamp(o->st)->batch + 1, request, used, budget, path);
    cm_set_error(err, "%s", msg);
}

static cm_status oo_run_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    oom_obs *o = self;
    cm_tape *tp = cm_state_tape(st);
    if (ev == CM_EVENT_FIT_START && tp) {
        o->st = st;
        o->hooked = cm_tape_arena(tp);
        cm_arena_set_oom_hook(o->hooked, on_oom, o);
    }
    if (ev == CM_EVENT_BATCH_START) tl_clear(&o->tl);
    o->last_event = ev;
    const cm_timestamp *ts = cm_state_timestamp(st);
    if (ev >= CM_EVENT_BATCH_START && ev <= CM_EVENT_BATCH_END)
        tl_add(&o->tl, ev, st, ev == CM_EVENT_BATCH_END ? ts->batch - 1 : ts->batch, o->cfg.max_entries);
    if (ev == CM_EVENT_FIT_END && o->hooked) {
        cm_arena_set_oom_hook(o->hooked, NULL, NULL);
        o->hooked = NULL;
    }
    return CM_OK;
}

static cm_status oo_close(void *self, const cm_state *st, cm_logger *lg) {
    oom_obs *o = self;
    if (o->hooked) cm_arena_set_oom_hook(o->hooked, NULL, NULL);
    o->hooked = NULL;
    o->st = NULL;
    return CM_OK;
}

static void oo_free(void *self) {
    oom_obs *o = self;
    cm_free(o->tl.v), cm_free(o->folder), cm_free(o->filename);
    cm_free(o);
}

static const cm_callback_i oom_vt = {
    .abi = CM_CALLBACK_ABI,
    .name = "OOMObserver",
    .run_event = oo_run_event,
    .close = oo_close,
    .free = oo_free,
};

cm_status cm_oom_observer_new(const cm_oom_observer_config *cfg, cm_callback_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_oom_observer_new: out is NULL");
    *out = (cm_callback_plugin){0};
    const cm_oom_observer_config c = cfg ? *cfg : cm_oom_observer_config_default();
    if (!c.folder || !c.folder[0] || !c.filename || !c.filename[0])
        return cm_set_error(CM_ERR_INVALID_ARG, "OOMObserver: folder and filename must not be empty");
    if (c.max_entries < 1) return cm_set_error(CM_ERR_INVALID_ARG, "OOMObserver: max_entries %d must be >= 1", c.max_entries);
    oom_obs *o = cm_alloc_zeroed(sizeof *o, 16);
    if (!o || !(o->folder = cbi_strdup(c.folder)) || !(o->filename = cbi_strdup(c.filename))) {
        if (o) cm_free(o->folder);
        cm_free(o);
        return cm_set_error(CM_ERR_OOM, "OOMObserver: out of memory");
    }
    o->cfg = c;
    *out = (cm_callback_plugin){&oom_vt, o};
    return CM_OK;
}
