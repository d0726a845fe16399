/* The trace recorder every layer writes profiling events into (private to the library).
 *
 * The profiler (composer/profiler.h, src/plugins/profiler) owns one recorder and, while its
 * schedule says a batch is recorded (WARMUP, ACTIVE, ACTIVE_AND_SAVE), makes it the process's
 * active recorder. Code in any layer then records with the cmi_prof_* calls below, which cost one
 * relaxed atomic load and a predicted branch when no recorder is active (cmi_prof_on()):
 *
 *     if (cmi_prof_on()) cmi_prof_begin("checkpoint/save", "checkpoint", NULL);
 *     ...
 *     cmi_prof_end("checkpoint/save");            // records only if the begin was recorded
 *
 * Events are kept in memory with their thread (the OS thread id) and a timestamp in nanoseconds
 * of the wall clock, read from the monotonic clock plus a fixed offset so that a thread's events
 * never go back in time. Duration slices (B/E) are kept balanced per thread: an end is recorded
 * only when its begin is open on that thread (ends that would close a slice above it close that
 * one too), and cmi_prof_take closes the slices still open when the events are handed over. So
 * every handed-over list nests, as Chrome's trace viewer and Perfetto need.
 *
 * Thread-safety: every call may come from any thread (a mutex guards the recorder). */
#ifndef CM_PROF_IMPL_H
#define CM_PROF_IMPL_H

#include <composer/base.h>

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct cmi_prof cmi_prof;

/* One recorded event (Chrome's trace event fields; names and args live in the recorder). */
typedef struct cmi_prof_event {
    char ph;            /* 'B', 'E', 'X', 'i', 'C', 'b', 'e' */
    int32_t tid;        /* OS thread id */
    int64_t ts_ns;      /* wall clock, ns */
    int64_t dur_ns;     /* 'X' only */
    uint64_t id;        /* 'b' / 'e' only */
    const char *name;   /* valid until the list is freed */
    const char *cat;    /* may be "" */
    const char *args;   /* a JSON object's text, or NULL */
} cmi_prof_event;

/* A list handed over by cmi_prof_take (owns its strings). */
typedef struct cmi_prof_list {
    cmi_prof_event *ev;
    int64_t n;
    void *strings; /* private */
} cmi_prof_list;
void cmi_prof_list_free(cmi_prof_list *l);

cm_status cmi_prof_new(cmi_prof **out);
void cmi_prof_free(cmi_prof *p); /* must not be the active recorder */

/* The active recorder (NULL: none). */
extern _Atomic(cmi_prof *) cmi_prof_g;
static inline bool cmi_prof_on(void) { return atomic_load_explicit(&cmi_prof_g, memory_order_relaxed) != NULL; }
/* Makes p the active recorder (NULL: none). */
void cmi_prof_set_active(cmi_prof *p);

/* Wall-clock nanoseconds as the recorder stamps them (monotonic, so never going back). */
int64_t cmi_prof_now_ns(void);
/* The calling thread's OS id. */
int32_t cmi_prof_tid(void);

/* Recording into the active recorder (nothing when none). name/cat/args are copied; args is a
 * JSON object's text (NULL for none). */
void cmi_prof_begin(const char *name, const char *cat, const char *args);
void cmi_prof_end(const char *name);
void cmi_prof_complete(const char *name, const char *cat, int64_t t0_ns, int64_t t1_ns, const char *args);
void cmi_prof_instant(const char *name, const char *cat, const char *args);
/* A counter: one track per series (Chrome 'C'). */
void cmi_prof_counter(const char *name, const char *cat, const char *const *series, const double *values, int n);
/* An async span [t0, t1] with an id (Chrome 'b' and 'e'): spans that may overlap on one thread,
 * such as collectives that run under backward. */
void cmi_prof_async(const char *name, const char *cat, uint64_t id, int64_t t0_ns, int64_t t1_ns, const char *args);

/* The same, into a given recorder whether or not it is active (markers whose actions include
 * SKIP record while the profiler is not active). */
void cmi_prof_begin_in(cmi_prof *p, const char *name, const char *cat, const char *args);
void cmi_prof_end_in(cmi_prof *p, const char *name);
void cmi_prof_instant_in(cmi_prof *p, const char *name, const char *cat, const char *args);
void cmi_prof_counter_in(cmi_prof *p, const char *name, const char *cat, const char *const *series,
                         const double *values, int n);
void cmi_prof_complete_in(cmi_prof *p, const char *name, const char *cat, int64_t t0_ns, int64_t t1_ns,
                          const char *args);

/* Hands over every event recorded so far (the recorder starts a new list). Slices still open are
 * closed in the list at `close_ns` (with args {"truncated": true}) and forgotten, so their later
 * ends are dropped. Returns CM_ERR_OOM (nothing taken) when memory runs out; an event that could
 * not be recorded for lack of memory is counted in *dropped (may be NULL). */
cm_status cmi_prof_take(cmi_prof *p, int64_t close_ns, cmi_prof_list *out, int64_t *dropped);

/* The hook the engine calls at the start of every event, before any plugin runs (the profiler
 * uses it to decide whether this event is recorded). One per process. */
typedef void (*cmi_prof_event_fn)(void *data, int event, void *state);
typedef struct cmi_prof_hook {
    cmi_prof_event_fn fn;
    void *data;
} cmi_prof_hook;
extern cmi_prof_hook cmi_prof_event_hook;

#endif
