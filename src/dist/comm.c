/* The communicator: argument checks, sequence numbers and timeouts over a backend vtable, and the
 * single-process backend. */
#include "dist/dist_impl.h"
#include "base/prof_impl.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct cm_comm {
    const cm_comm_i *vt;
    void *self;
    double timeout_s;
    uint64_t seq;
    cm_status status; /* first failure */
    char error[1536];
    char scope[160];  /* a sub-communicator: " (a sub-communicator of ranks 1, 3 of 4)", else "" */
};

struct cm_comm_request {
    void *breq;
    cm_coll_info ci;
    int64_t prof_t0; /* when it started, if a profiler was recording (0: not) */
};

static const char *const k_coll_names[] = {
#define CM_X_(name, str) str,
    CM_COLL_LIST(CM_X_)
#undef CM_X_
};

const char *cm_coll_name(cm_coll c) { return (unsigned)c < CM_COLL_COUNT ? k_coll_names[c] : "?"; }

size_t cm_comm_dtype_size(cm_comm_dtype dt) {
    static const size_t sz[] = {4, 8, 4, 8, 1, 2};
    return (unsigned)dt < CM_COMM_DTYPE_COUNT ? sz[dt] : 0;
}

static const char *dtype_name(cm_comm_dtype dt) {
    static const char *const n[] = {"f32", "f64", "i32", "i64", "u8", "bf16"};
    return (unsigned)dt < CM_COMM_DTYPE_COUNT ? n[dt] : "?";
}

cm_comm_config cm_comm_config_default(void) {
    cm_comm_config c = {300.0, true};
    const char *e = getenv("CM_DIST_TIMEOUT");
    if (e && *e) {
        char *end;
        double v = strtod(e, &end);
        if (end != e && *end == '\0' && v > 0) c.timeout_s = v;
        else cm_log_msg(CM_LOG_WARN, "CM_DIST_TIMEOUT='%s' is not a positive number of seconds; using %g", e, c.timeout_s);
    }
    return c;
}

void cmi_dist_backoff(int64_t spins, double waited_s) {
    if (spins < 64) return;
    if (waited_s < 2e-3) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, waited_s < 0.1 ? 50000 : 1000000};
    nanosleep(&ts, NULL);
}

/* ---------------------------------------------------------------------------------------------
 * Construction
 * ------------------------------------------------------------------------------------------- */

cm_status cm_comm_new(const cm_comm_i *vt, void *self, const cm_comm_config *cfg, cm_comm **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_comm_new: out is NULL");
    *out = NULL;
    if (!vt || vt->abi != CM_COMM_ABI || !vt->rank || !vt->size || !vt->iall_reduce || !vt->ireduce_scatter ||
        !vt->iall_gather || !vt->ibroadcast || !vt->ibarrier || !vt->test || !vt->free)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "cm_comm_new: backend '%s' has abi %d (want %d) or a missing required slot",
                            vt && vt->name ? vt->name : "?", vt ? vt->abi : -1, CM_COMM_ABI);
    cm_comm_config c = cfg ? *cfg : cm_comm_config_default();
    if (!(c.timeout_s > 0))
        return cm_set_error(CM_ERR_INVALID_ARG, "communicator: timeout %g s must be > 0 (dist_timeout)", c.timeout_s);
    cm_comm *cm = cm_alloc_zeroed(sizeof *cm, 16);
    if (!cm) return cm_set_error(CM_ERR_OOM, "communicator: out of memory");
    cm->vt = vt, cm->self = self, cm->timeout_s = c.timeout_s;
    *out = cm;
    return CM_OK;
}

void cm_comm_free(cm_comm *c) {
    if (!c) return;
    c->vt->free(c->self, c->status != CM_OK);
    cm_free(c);
}

int cm_comm_rank(const cm_comm *c) { return c ? c->vt->rank(c->self) : 0; }
int cm_comm_size(const cm_comm *c) { return c ? c->vt->size(c->self) : 1; }
const char *cm_comm_backend(const cm_comm *c) { return c && c->vt->name ? c->vt->name : "?"; }
double cm_comm_timeout(const cm_comm *c) { return c ? c->timeout_s : 0; }
void cm_comm_set_timeout(cm_comm *c, double s) {
    if (c && s > 0) c->timeout_s = s;
}
uint64_t cm_comm_seq(const cm_comm *c) { return c ? c->seq : 0; }
cm_status cm_comm_status(const cm_comm *c) { return c ? c->status : CM_ERR_INVALID_ARG; }
const char *cm_comm_error(const cm_comm *c) { return c ? c->error : ""; }

/* Records the first failure and returns it (with the message in cm_last_error()). */
static cm_status comm_fail(cm_comm *c, cm_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static cm_status comm_fail(cm_comm *c, cm_status s, const char *fmt, ...) {
    char msg[sizeof c->error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!c->status) {
        c->status = s;
        snprintf(c->error, sizeof c->error, "%s", msg);
    }
    return cm_set_error(s, "%s", msg);
}

cm_status cm_comm_abort(cm_comm *c, int code, const char *msg) {
    if (!c) return cm_set_error(CM_ERR_INVALID_ARG, "cm_comm_abort: communicator is NULL");
    if (msg) fprintf(stderr, "composer: rank %d: %s\n", cm_comm_rank(c), msg);
    fflush(stderr);
    fflush(stdout);
    if (c->vt->abort) c->vt->abort(c->self, code ? code : 1); /* returns only if the abort failed */
    return cm_set_error(CM_ERR_UNSUPPORTED,
                        "cm_comm_abort: the '%s' communicator cannot stop the job (one process, or the abort "
                        "failed): return from main with exit status %d instead",
                        c->vt->name, code ? code : 1);
}

/* ---------------------------------------------------------------------------------------------
 * Starting and finishing collectives
 * ------------------------------------------------------------------------------------------- */

static cm_status check_start(cm_comm *c, const char *what, int64_t count, cm_comm_dtype dt, bool need_buf,
                             cm_comm_request **req) {
    if (!c || !req) return cm_set_error(CM_ERR_INVALID_ARG, "%s: communicator or request pointer is NULL", what);
    *req = NULL;
    if (c->status)
        return cm_set_error(CM_ERR_STATE, "%s: the communicator failed earlier and cannot be used: %s", what, c->error);
    if (count < 0) return cm_set_error(CM_ERR_INVALID_ARG, "%s: count %lld is negative", what, (long long)count);
    if ((unsigned)dt >= CM_COMM_DTYPE_COUNT)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: dtype %d is not a cm_comm_dtype", what, (int)dt);
    if (need_buf) return cm_set_error(CM_ERR_INVALID_ARG, "%s: buffer is NULL with count %lld", what, (long long)count);
    return CM_OK;
}

static cm_status started(cm_comm *c, cm_status s, void *breq, const cm_coll_info *ci, cm_comm_request **req) {
    if (s) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return comm_fail(c, s, "dist: rank %d could not start collective #%llu %s: %s", cm_comm_rank(c),
                         (unsigned long long)ci->seq, cm_coll_name(ci->coll), msg);
    }
    cm_comm_request *r = cm_alloc(sizeof *r, 16);
    if (!r) {
        /* the operation is running; without a handle it can only be abandoned */
        return comm_fail(c, CM_ERR_OOM, "dist: out of memory for a request handle (collective #%llu)",
                         (unsigned long long)ci->seq);
    }
    r->breq = breq, r->ci = *ci;
    r->prof_t0 = cmi_prof_on() ? cmi_prof_now_ns() : 0;
    *req = r;
    return CM_OK;
}

/* A finished collective as an async profiler span (composer/profiler.h): its sequence number is
 * the span's id, so the trace merger can line the ranks' spans up. */
static void prof_done(const cm_comm_request *r) {
    if (!r->prof_t0 || !cmi_prof_on()) return;
    char name[64], args[160];
    snprintf(name, sizeof name, "collective/%s", cm_coll_name(r->ci.coll));
    snprintf(args, sizeof args, "{\"seq\": %llu, \"bytes\": %lld, \"dtype\": \"%s\"}", (unsigned long long)r->ci.seq,
             (long long)(r->ci.count * (int64_t)cm_comm_dtype_size(r->ci.dtype)), dtype_name(r->ci.dtype));
    cmi_prof_async(name, "collective", r->ci.seq, r->prof_t0, cmi_prof_now_ns(), args);
}

static cm_coll_info next_info(cm_comm *c, cm_coll coll, int64_t count, cm_comm_dtype dt) {
    return (cm_coll_info){coll, ++c->seq, count, dt};
}

cm_status cm_comm_iall_reduce(cm_comm *c, void *buf, int64_t count, cm_comm_dtype dt, cm_reduce_op op,
                              cm_comm_request **req) {
    cm_status s = check_start(c, "all_reduce", count, dt, !buf && count > 0, req);
    if (s) return s;
    if ((unsigned)op >= CM_REDUCE_OP_COUNT)
        return cm_set_error(CM_ERR_INVALID_ARG, "all_reduce: op %d is not a cm_reduce_op", (int)op);
    cm_coll_info ci = next_info(c, CM_COLL_ALL_REDUCE, count, dt);
    void *br = NULL;
    s = c->vt->iall_reduce(c->self, &ci, buf, op, &br);
    return started(c, s, br, &ci, req);
}

cm_status cm_comm_ireduce_scatter(cm_comm *c, const void *send, void *recv, int64_t recv_count, cm_comm_dtype dt,
                                  cm_reduce_op op, cm_comm_request **req) {
    cm_status s = check_start(c, "reduce_scatter", recv_count, dt, (!send || !recv) && recv_count > 0, req);
    if (s) return s;
    if ((unsigned)op >= CM_REDUCE_OP_COUNT)
        return cm_set_error(CM_ERR_INVALID_ARG, "reduce_scatter: op %d is not a cm_reduce_op", (int)op);
    cm_coll_info ci = next_info(c, CM_COLL_REDUCE_SCATTER, recv_count, dt);
    void *br = NULL;
    s = c->vt->ireduce_scatter(c->self, &ci, send, recv, op, &br);
    return started(c, s, br, &ci, req);
}

cm_status cm_comm_iall_gather(cm_comm *c, const void *send, void *recv, int64_t send_count, cm_comm_dtype dt,
                              cm_comm_request **req) {
    cm_status s = check_start(c, "all_gather", send_count, dt, (!send || !recv) && send_count > 0, req);
    if (s) return s;
    cm_coll_info ci = next_info(c, CM_COLL_ALL_GATHER, send_count, dt);
    void *br = NULL;
    s = c->vt->iall_gather(c->self, &ci, send, recv, &br);
    return started(c, s, br, &ci, req);
}

cm_status cm_comm_ibroadcast(cm_comm *c, void *buf, int64_t count, cm_comm_dtype dt, int root,
                             cm_comm_request **req) {
    cm_status s = check_start(c, "broadcast", count, dt, !buf && count > 0, req);
    if (s) return s;
    if (root < 0 || root >= cm_comm_size(c))
        return cm_set_error(CM_ERR_INVALID_ARG, "broadcast: root %d is not a rank of this world (size %d)", root,
                            cm_comm_size(c));
    cm_coll_info ci = next_info(c, CM_COLL_BROADCAST, count, dt);
    void *br = NULL;
    s = c->vt->ibroadcast(c->self, &ci, buf, root, &br);
    return started(c, s, br, &ci, req);
}

cm_status cm_comm_ibarrier(cm_comm *c, cm_comm_request **req) {
    cm_status s = check_start(c, "barrier", 0, CM_COMM_U8, false, req);
    if (s) return s;
    cm_coll_info ci = next_info(c, CM_COLL_BARRIER, 0, CM_COMM_U8);
    void *br = NULL;
    s = c->vt->ibarrier(c->self, &ci, &br);
    return started(c, s, br, &ci, req);
}

static cm_status test_once(cm_comm *c, cm_comm_request *req, bool *done) {
    cm_status s = c->vt->test(c->self, req->breq, done);
    if (s) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return comm_fail(c, s, "dist: rank %d of %d%s: collective #%llu %s (%lld %s) failed: %s", cm_comm_rank(c),
                         cm_comm_size(c), c->scope, (unsigned long long)req->ci.seq, cm_coll_name(req->ci.coll),
                         (long long)req->ci.count, dtype_name(req->ci.dtype), msg);
    }
    if (*done) prof_done(req);
    return CM_OK;
}

cm_status cm_comm_test(cm_comm *c, cm_comm_request *req, bool *done) {
    if (!c || !req || !done) return cm_set_error(CM_ERR_INVALID_ARG, "cm_comm_test: NULL argument");
    *done = false;
    cm_status s = test_once(c, req, done);
    if (s || *done) cm_free(req);
    return s;
}

cm_status cm_comm_wait(cm_comm *c, cm_comm_request *req) {
    if (!c || !req) return cm_set_error(CM_ERR_INVALID_ARG, "cm_comm_wait: NULL argument");
    const double t0 = cm_clock_s();
    cm_status s = CM_OK;
    for (int64_t spins = 0;; spins++) {
        bool done = false;
        if ((s = test_once(c, req, &done)) || done) break;
        const double waited = cm_clock_s() - t0;
        if (waited > c->timeout_s) {
            char who[1024] = "";
            if (c->vt->describe_missing) c->vt->describe_missing(c->self, &req->ci, who, sizeof who);
            s = comm_fail(c, CM_ERR_TIMEOUT,
                          "dist: rank %d of %d%s timed out after %.1f s (dist_timeout) in collective #%llu %s "
                          "(%lld %s): %s. The job cannot go on: exit nonzero so the launcher stops every rank",
                          cm_comm_rank(c), cm_comm_size(c), c->scope, waited, (unsigned long long)req->ci.seq,
                          cm_coll_name(req->ci.coll), (long long)req->ci.count, dtype_name(req->ci.dtype),
                          who[0] ? who : "no information on the other ranks");
            break;
        }
        cmi_dist_backoff(spins, waited);
    }
    cm_free(req);
    return s;
}

/* ---------------------------------------------------------------------------------------------
 * Blocking forms
 * ------------------------------------------------------------------------------------------- */

/* (the request is read only after the start call has written it) */
#define FINISH(start_call)                   \
    cm_comm_request *r = NULL;               \
    cm_status s_ = (start_call);             \
    return s_ ? s_ : cm_comm_wait(c, r)

cm_status cm_comm_all_reduce(cm_comm *c, void *buf, int64_t count, cm_comm_dtype dt, cm_reduce_op op) {
    FINISH(cm_comm_iall_reduce(c, buf, count, dt, op, &r));
}
cm_status cm_comm_reduce_scatter(cm_comm *c, const void *send, void *recv, int64_t recv_count, cm_comm_dtype dt,
                                 cm_reduce_op op) {
    FINISH(cm_comm_ireduce_scatter(c, send, recv, recv_count, dt, op, &r));
}
cm_status cm_comm_all_gather(cm_comm *c, const void *send, void *recv, int64_t send_count, cm_comm_dtype dt) {
    FINISH(cm_comm_iall_gather(c, send, recv, send_count, dt, &r));
}
cm_status cm_comm_broadcast(cm_comm *c, void *buf, int64_t count, cm_comm_dtype dt, int root) {
    FINISH(cm_comm_ibroadcast(c, buf, count, dt, root, &r));
}
cm_status cm_comm_barrier(cm_comm *c) {
    FINISH(cm_comm_ibarrier(c, &r));
}
cm_status cm_comm_all_reduce_sum_f32(cm_comm *c, float *buf, int64_t count) {
    return cm_comm_all_reduce(c, buf, count, CM_COMM_F32, CM_REDUCE_SUM);
}
cm_status cm_comm_all_reduce_sum_f64(cm_comm *c, double *buf, int64_t count) {
    return cm_comm_all_reduce(c, buf, count, CM_COMM_F64, CM_REDUCE_SUM);
}

/* ---------------------------------------------------------------------------------------------
 * Sub-communicators
 * ------------------------------------------------------------------------------------------- */

cm_status cm_comm_split(cm_comm *c, int color, int key, cm_comm **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_comm_split: out is NULL");
    *out = NULL;
    if (!c) return cm_set_error(CM_ERR_INVALID_ARG, "cm_comm_split: communicator is NULL");
    if (color < 0) return cm_set_error(CM_ERR_INVALID_ARG, "cm_comm_split: color %d must be >= 0", color);
    if (!c->vt->split)
        return cm_set_error(CM_ERR_UNSUPPORTED, "cm_comm_split: the '%s' communicator cannot make sub-communicators",
                            c->vt->name);
    /* every rank's (color, key) first, under the timeout: a missing rank is named here rather
     * than hanging in the backend's split, and the scope of the new communicator is known */
    const int n = cm_comm_size(c), me = cm_comm_rank(c);
    int32_t mine[2] = {color, key};
    int32_t *all = cm_alloc(sizeof *all * 2 * (size_t)n, 16);
    if (!all) return cm_set_error(CM_ERR_OOM, "cm_comm_split: out of memory");
    cm_status s = cm_comm_all_gather(c, mine, all, 2, CM_COMM_I32);
    if (s) {
        cm_free(all);
        return s;
    }
    char scope[sizeof c->scope];
    size_t used = (size_t)snprintf(scope, sizeof scope, " (a sub-communicator of ranks");
    int members = 0;
    for (int r = 0; r < n; r++) {
        if (all[2 * r] != color) continue;
        if (used + 24 < sizeof scope) used += (size_t)snprintf(scope + used, sizeof scope - used, "%s %d", members ? "," : "", r);
        else if (used + 6 < sizeof scope) used += (size_t)snprintf(scope + used, sizeof scope - used, " ...");
        members++;
    }
    snprintf(scope + used, sizeof scope - used, " of %d)", n);
    cm_free(all);
    const cm_comm_i *vt = NULL;
    void *self = NULL;
    if ((s = c->vt->split(c->self, color, key, &vt, &self))) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return comm_fail(c, s, "dist: rank %d of %d could not split the communicator (color %d): %s", me, n, color, msg);
    }
    cm_comm_config cc = cm_comm_config_default();
    cc.timeout_s = c->timeout_s;
    if ((s = cm_comm_new(vt, self, &cc, out))) {
        vt->free(self, false);
        return s;
    }
    snprintf((*out)->scope, sizeof (*out)->scope, "%s", scope);
    const int got = cm_comm_size(*out);
    if (got != members) { /* the backend disagrees with the colors every rank sent */
        cm_comm_free(*out);
        *out = NULL;
        return cm_set_error(CM_ERR_STATE, "cm_comm_split: the '%s' backend made a communicator of %d ranks for color "
                                          "%d, which %d ranks chose", c->vt->name, got, color, members);
    }
    return CM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * The single-process backend: rank 0 of 1
 * ------------------------------------------------------------------------------------------- */

static int single_rank(void *self) { return 0; }
static int single_size(void *self) { return 1; }
static void *const k_done = (void *)&k_done; /* every single-process request is finished at once */
/* one rank: a reduction is its own values (bf16 ones are bf16 already: the one rounding is a no-op) */
static cm_status single_iall_reduce(void *self, const cm_coll_info *ci, void *buf, cm_reduce_op op, void **req) {
    *req = k_done;
    return CM_OK;
}
static cm_status single_ireduce_scatter(void *self, const cm_coll_info *ci, const void *send, void *recv,
                                        cm_reduce_op op, void **req) {
    if (ci->count && send != recv) memmove(recv, send, (size_t)ci->count * cm_comm_dtype_size(ci->dtype));
    *req = k_done;
    return CM_OK;
}
static cm_status single_iall_gather(void *self, const cm_coll_info *ci, const void *send, void *recv, void **req) {
    if (ci->count && send != recv) memmove(recv, send, (size_t)ci->count * cm_comm_dtype_size(ci->dtype));
    *req = k_done;
    return CM_OK;
}
static cm_status single_ibroadcast(void *self, const cm_coll_info *ci, void *buf, int root, void **req) {
    *req = k_done;
    return CM_OK;
}
static cm_status single_ibarrier(void *self, const cm_coll_info *ci, void **req) {
    *req = k_done;
    return CM_OK;
}
static cm_status single_test(void *self, void *req, bool *done) {
    *done = true;
    return CM_OK;
}
static void single_free(void *self, bool failed) {}
static cm_status single_split(void *self, int color, int key, const cm_comm_i **vt, void **out);

static const cm_comm_i k_single = {
    CM_COMM_ABI,       "single",          single_rank,       single_size, single_iall_reduce, single_ireduce_scatter,
    single_iall_gather, single_ibroadcast, single_ibarrier, single_test, NULL,               NULL,
    single_free,       single_split,
};

static cm_status single_split(void *self, int color, int key, const cm_comm_i **vt, void **out) {
    *vt = &k_single, *out = NULL; /* rank 0 of 1 again */
    return CM_OK;
}

cm_status cm_comm_single_new(const cm_comm_config *cfg, cm_comm **out) { return cm_comm_new(&k_single, NULL, cfg, out); }

cm_status cm_comm_mpi_new(const cm_comm_config *cfg, cm_comm **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_comm_mpi_new: out is NULL");
    *out = NULL;
    cm_comm_config c = cfg ? *cfg : cm_comm_config_default();
    if (!(c.timeout_s > 0))
        return cm_set_error(CM_ERR_INVALID_ARG, "communicator: timeout %g s must be > 0 (dist_timeout)", c.timeout_s);
    const cm_comm_i *vt;
    void *self;
    cm_status s = cmi_comm_mpi_backend_new(&c, &vt, &self);
    if (s) return s;
    if ((s = cm_comm_new(vt, self, &c, out))) vt->free(self, false);
    return s;
}

static int g_prefix_rank;
static void rank_prefix(char *buf, size_t cap, void *data) { snprintf(buf, cap, "[rank %d] ", g_prefix_rank); }

cm_status cm_comm_auto_new(const cm_comm_config *cfg, cm_comm **out) {
    const char *force = getenv("CM_DIST");
    bool mpi = cm_dist_launched();
    if (force && *force) {
        if (!strcmp(force, "mpi")) mpi = true;
        else if (!strcmp(force, "single")) mpi = false;
        else return cm_set_error(CM_ERR_INVALID_ARG, "CM_DIST='%s': use 'mpi' or 'single' (or leave it unset)", force);
    }
    cm_status s = mpi ? cm_comm_mpi_new(cfg, out) : cm_comm_single_new(cfg, out);
    if (!s && cm_comm_size(*out) > 1) {
        g_prefix_rank = cm_comm_rank(*out);
        cm_log_set_prefix(rank_prefix, NULL);
    }
    return s;
}
