/* The trace recorder (prof_impl.h): a mutex-guarded list of events, their strings in chunks, and
 * per thread the stack of open duration slices that keeps begins and ends balanced. */
#define _GNU_SOURCE /* syscall(SYS_gettid) */
#include "base/prof_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

_Atomic(cmi_prof *) cmi_prof_g;
cmi_prof_hook cmi_prof_event_hook;

/* ---- strings: bump allocation in chunks ---- */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    char data[];
} chunk;

enum { CHUNK_BYTES = 64 << 10 };

static void chunks_free(chunk *c) {
    while (c) {
        chunk *n = c->next;
        cm_free(c);
        c = n;
    }
}

/* ---- per-thread stacks of open slices ---- */

typedef struct open_stack {
    int32_t tid;
    const char **names; /* in the recorder's strings */
    int n, cap;
} open_stack;

struct cmi_prof {
    pthread_mutex_t mu;
    cmi_prof_event *ev;
    int64_t n, cap;
    chunk *strings;
    open_stack *stacks;
    int n_stacks, cap_stacks;
    int64_t dropped; /* events lost to out-of-memory since the last take */
};

/* ---- clock and thread id ---- */

static int64_t g_clock_offset;
static pthread_once_t g_clock_once = PTHREAD_ONCE_INIT;

static int64_t ns_of(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void clock_init(void) { g_clock_offset = ns_of(CLOCK_REALTIME) - ns_of(CLOCK_MONOTONIC); }

int64_t cmi_prof_now_ns(void) {
    pthread_once(&g_clock_once, clock_init);
    return ns_of(CLOCK_MONOTONIC) + g_clock_offset;
}

int32_t cmi_prof_tid(void) {
    static _Thread_local int32_t tid;
    if (!tid) tid = (int32_t)syscall(SYS_gettid);
    return tid;
}

/* ---- construction ---- */

cm_status cmi_prof_new(cmi_prof **out) {
    *out = NULL;
    cmi_prof *p = cm_alloc_zeroed(sizeof *p, 16);
    if (!p) return cm_set_error(CM_ERR_OOM, "profiler: out of memory");
    pthread_mutex_init(&p->mu, NULL);
    *out = p;
    return CM_OK;
}

static void drop_stacks(cmi_prof *p) {
    for (int i = 0; i < p->n_stacks; i++) cm_free(p->stacks[i].names);
    cm_free(p->stacks);
    p->stacks = NULL;
    p->n_stacks = p->cap_stacks = 0;
}

void cmi_prof_free(cmi_prof *p) {
    if (!p) return;
    cmi_prof *expected = p;
    atomic_compare_exchange_strong(&cmi_prof_g, &expected, NULL);
    drop_stacks(p);
    cm_free(p->ev);
    chunks_free(p->strings);
    pthread_mutex_destroy(&p->mu);
    cm_free(p);
}

void cmi_prof_list_free(cmi_prof_list *l) {
    if (!l) return;
    cm_free(l->ev);
    chunks_free(l->strings);
    memset(l, 0, sizeof *l);
}

void cmi_prof_set_active(cmi_prof *p) { atomic_store_explicit(&cmi_prof_g, p, memory_order_release); }

/* ---- recording (p->mu held) ---- */

static const char *keep(cmi_prof *p, const char *s) {
    if (!s) return NULL;
    const size_t n = strlen(s) + 1;
    chunk *c = p->strings;
    if (!c || c->cap - c->used < n) {
        const size_t cap = n > CHUNK_BYTES ? n : CHUNK_BYTES;
        chunk *nc = cm_alloc(sizeof *nc + cap, 16);
        if (!nc) return NULL;
        nc->next = c, nc->used = 0, nc->cap = cap;
        p->strings = c = nc;
    }
    char *d = c->data + c->used;
    memcpy(d, s, n);
    c->used += n;
    return d;
}

static cmi_prof_event *push(cmi_prof *p) {
    if (p->n == p->cap) {
        const int64_t cap = p->cap ? 2 * p->cap : 1024;
        cmi_prof_event *ne = cm_alloc(sizeof *ne * (size_t)cap, 16);
        if (!ne) {
            p->dropped++;
            return NULL;
        }
        if (p->n) memcpy(ne, p->ev, sizeof *ne * (size_t)p->n);
        cm_free(p->ev);
        p->ev = ne, p->cap = cap;
    }
    cmi_prof_event *e = &p->ev[p->n++];
    memset(e, 0, sizeof *e);
    return e;
}

/* Records an event whose name and category are already kept (or NULL on OOM: dropped). */
static bool add(cmi_prof *p, char ph, int32_t tid, int64_t ts, int64_t dur, uint64_t id, const char *name,
                const char *cat, const char *args) {
    if (!name || !cat) {
        p->dropped++;
        return false;
    }
    cmi_prof_event *e = push(p);
    if (!e) return false;
    *e = (cmi_prof_event){ph, tid, ts, dur, id, name, cat, args};
    return true;
}

static open_stack *stack_of(cmi_prof *p, int32_t tid, bool make) {
    for (int i = 0; i < p->n_stacks; i++)
        if (p->stacks[i].tid == tid) return &p->stacks[i];
    if (!make) return NULL;
    if (p->n_stacks == p->cap_stacks) {
        const int cap = p->cap_stacks ? 2 * p->cap_stacks : 8;
        open_stack *ns = cm_alloc_zeroed(sizeof *ns * (size_t)cap, 16);
        if (!ns) return NULL;
        if (p->n_stacks) memcpy(ns, p->stacks, sizeof *ns * (size_t)p->n_stacks);
        cm_free(p->stacks);
        p->stacks = ns, p->cap_stacks = cap;
    }
    open_stack *s = &p->stacks[p->n_stacks++];
    memset(s, 0, sizeof *s);
    s->tid = tid;
    return s;
}

static const char k_truncated[] = "{\"truncated\": true}";

static void begin_locked(cmi_prof *p, const char *name, const char *cat, const char *args, int64_t ts) {
    const int32_t tid = cmi_prof_tid();
    open_stack *s = stack_of(p, tid, true);
    if (!s) {
        p->dropped++;
        return;
    }
    if (s->n == s->cap) {
        const int cap = s->cap ? 2 * s->cap : 16;
        const char **nn = cm_alloc(sizeof *nn * (size_t)cap, 16);
        if (!nn) {
            p->dropped++;
            return;
        }
        if (s->n) memcpy(nn, s->names, sizeof *nn * (size_t)s->n);
        cm_free(s->names);
        s->names = nn, s->cap = cap;
    }
    const char *kn = keep(p, name);
    if (!add(p, 'B', tid, ts, 0, 0, kn, keep(p, cat ? cat : ""), keep(p, args))) return;
    s->names[s->n++] = kn;
}

static void end_locked(cmi_prof *p, const char *name, int64_t ts) {
    const int32_t tid = cmi_prof_tid();
    open_stack *s = stack_of(p, tid, false);
    if (!s) return;
    int at = s->n - 1;
    while (at >= 0 && strcmp(s->names[at], name)) at--;
    if (at < 0) return; /* its begin was not recorded (or was handed over already) */
    /* slices above it were left open by their owners: close them here, nested inside */
    const char *trunc = s->n - 1 > at ? keep(p, k_truncated) : NULL;
    for (int i = s->n - 1; i > at; i--) add(p, 'E', tid, ts, 0, 0, s->names[i], "", trunc);
    add(p, 'E', tid, ts, 0, 0, s->names[at], "", NULL);
    s->n = at;
}

/* ---- the public (library-private) recording calls ---- */

static cmi_prof *active(void) { return atomic_load_explicit(&cmi_prof_g, memory_order_acquire); }

void cmi_prof_begin_in(cmi_prof *p, const char *name, const char *cat, const char *args) {
    if (!p || !name) return;
    const int64_t ts = cmi_prof_now_ns();
    pthread_mutex_lock(&p->mu);
    begin_locked(p, name, cat, args, ts);
    pthread_mutex_unlock(&p->mu);
}

void cmi_prof_end_in(cmi_prof *p, const char *name) {
    if (!p || !name) return;
    const int64_t ts = cmi_prof_now_ns();
    pthread_mutex_lock(&p->mu);
    end_locked(p, name, ts);
    pthread_mutex_unlock(&p->mu);
}

void cmi_prof_complete_in(cmi_prof *p, const char *name, const char *cat, int64_t t0_ns, int64_t t1_ns,
                          const char *args) {
    if (!p || !name) return;
    pthread_mutex_lock(&p->mu);
    add(p, 'X', cmi_prof_tid(), t0_ns, t1_ns > t0_ns ? t1_ns - t0_ns : 0, 0, keep(p, name), keep(p, cat ? cat : ""),
        keep(p, args));
    pthread_mutex_unlock(&p->mu);
}

void cmi_prof_instant_in(cmi_prof *p, const char *name, const char *cat, const char *args) {
    if (!p || !name) return;
    const int64_t ts = cmi_prof_now_ns();
    pthread_mutex_lock(&p->mu);
    add(p, 'i', cmi_prof_tid(), ts, 0, 0, keep(p, name), keep(p, cat ? cat : ""), keep(p, args));
    pthread_mutex_unlock(&p->mu);
}

void cmi_prof_counter_in(cmi_prof *p, const char *name, const char *cat, const char *const *series,
                         const double *values, int n) {
    if (!p || !name || n <= 0) return;
    char args[1024];
    size_t k = 0;
    args[k++] = '{';
    for (int i = 0; i < n && k < sizeof args - 64; i++) {
        char v[40];
        if (values[i] == values[i] && values[i] - values[i] == 0) snprintf(v, sizeof v, "%.17g", values[i]);
        else snprintf(v, sizeof v, "0"); /* JSON has no NaN; a counter track needs a number */
        k += (size_t)snprintf(args + k, sizeof args - k, "%s\"%s\": %s", i ? ", " : "", series[i], v);
    }
    snprintf(args + k, sizeof args - k, "}");
    const int64_t ts = cmi_prof_now_ns();
    pthread_mutex_lock(&p->mu);
    add(p, 'C', cmi_prof_tid(), ts, 0, 0, keep(p, name), keep(p, cat ? cat : ""), keep(p, args));
    pthread_mutex_unlock(&p->mu);
}

void cmi_prof_begin(const char *name, const char *cat, const char *args) { cmi_prof_begin_in(active(), name, cat, args); }
void cmi_prof_end(const char *name) {
    /* an end goes to whichever recorder holds its begin: the active one */
    cmi_prof_end_in(active(), name);
}
void cmi_prof_complete(const char *name, const char *cat, int64_t t0_ns, int64_t t1_ns, const char *args) {
    cmi_prof_complete_in(active(), name, cat, t0_ns, t1_ns, args);
}
void cmi_prof_instant(const char *name, const char *cat, const char *args) {
    cmi_prof_instant_in(active(), name, cat, args);
}
void cmi_prof_counter(const char *name, const char *cat, const char *const *series, const double *values, int n) {
    cmi_prof_counter_in(active(), name, cat, series, values, n);
}

void cmi_prof_async(const char *name, const char *cat, uint64_t id, int64_t t0_ns, int64_t t1_ns, const char *args) {
    cmi_prof *p = active();
    if (!p || !name) return;
    pthread_mutex_lock(&p->mu);
    const int32_t tid = cmi_prof_tid();
    const char *kn = keep(p, name), *kc = keep(p, cat ? cat : "");
    if (add(p, 'b', tid, t0_ns, 0, id, kn, kc, keep(p, args)) && !add(p, 'e', tid, t1_ns, 0, id, kn, kc, NULL))
        p->n--; /* never a begin without its end */
    pthread_mutex_unlock(&p->mu);
}

cm_status cmi_prof_take(cmi_prof *p, int64_t close_ns, cmi_prof_list *out, int64_t *dropped) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&p->mu);
    const char *trunc = keep(p, k_truncated);
    for (int i = 0; i < p->n_stacks; i++) {
        open_stack *s = &p->stacks[i];
        for (int k = s->n - 1; k >= 0; k--)
            if (!add(p, 'E', s->tid, close_ns, 0, 0, s->names[k], "", trunc)) {
                pthread_mutex_unlock(&p->mu);
                return cm_set_error(CM_ERR_OOM, "profiler: out of memory closing the open slices");
            }
        s->n = 0;
    }
    out->ev = p->ev, out->n = p->n, out->strings = p->strings;
    if (dropped) *dropped = p->dropped;
    p->ev = NULL, p->n = p->cap = 0, p->strings = NULL, p->dropped = 0;
    drop_stacks(p);
    pthread_mutex_unlock(&p->mu);
    return CM_OK;
}
