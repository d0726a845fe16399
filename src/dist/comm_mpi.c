/* The MPI backend: collectives on a duplicate of MPI_COMM_WORLD, and heartbeats on a second
 * duplicate (sub-communicators from MPI_Comm_split have the collectives only). A heartbeat is a small message each rank sends to every peer when it enters a
 * collective ("I am at #seq all_reduce of n elements"); a rank that times out drains them to say
 * which ranks never arrived and where they were last seen. */
#include "dist/dist_impl.h"
#include "tensor/tensor_impl.h"

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

typedef struct hb_msg {
    uint64_t seq;
    int64_t count;
    int32_t coll;
    int32_t pad;
} hb_msg;

typedef struct mpi_self {
    MPI_Comm comm, side;
    int rank, size;
    bool child;         /* a sub-communicator (cm_comm_split): no heartbeats, no side channel */
    bool heartbeats;
    hb_msg mine;        /* the latest collective this rank entered */
    bool mine_unsent;   /* some peer has not been sent `mine` yet */
    hb_msg *send_buf;   /* (size) */
    MPI_Request *send_req;
    uint64_t *sent_seq; /* (size) the seq last sent to each peer */
    hb_msg *recv_buf;   /* (size) */
    MPI_Request *recv_req;
    hb_msg *seen;       /* (size) latest heartbeat from each peer */
    double *seen_t;     /* (size) when it arrived (cm_clock_s), 0 = never */
} mpi_self;

static int g_mpi_users;    /* communicators alive in this process */
static bool g_mpi_ours;    /* we called MPI_Init */

static cm_status mpi_err(const char *what, int rc) {
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return cm_set_error(CM_ERR_IO, "%s failed: %s (MPI error %d)", what, msg, rc);
}

static MPI_Datatype mpi_type(cm_comm_dtype dt) {
    switch (dt) {
    case CM_COMM_F32: return MPI_FLOAT;
    case CM_COMM_F64: return MPI_DOUBLE;
    case CM_COMM_I32: return MPI_INT32_T;
    case CM_COMM_I64: return MPI_INT64_T;
    case CM_COMM_BF16: return MPI_UINT16_T; /* moved as patterns; reduced by bf16_reduce */
    default: return MPI_UINT8_T;
    }
}

static MPI_Op mpi_op(cm_reduce_op op) { return op == CM_REDUCE_MAX ? MPI_MAX : op == CM_REDUCE_MIN ? MPI_MIN : MPI_SUM; }

/* ---- heartbeats ---- */

static void hb_post_recv(mpi_self *m, int peer) {
    MPI_Irecv(&m->recv_buf[peer], (int)sizeof(hb_msg), MPI_BYTE, peer, 7, m->side, &m->recv_req[peer]);
}

/* Takes in every heartbeat that has arrived. */
static void hb_drain(mpi_self *m) {
    for (int p = 0; p < m->size; p++) {
        if (p == m->rank) continue;
        for (;;) {
            int flag = 0;
            if (MPI_Test(&m->recv_req[p], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag) break;
            if (m->recv_buf[p].seq >= m->seen[p].seq) {
                m->seen[p] = m->recv_buf[p];
                m->seen_t[p] = cm_clock_s();
            }
            hb_post_recv(m, p);
        }
    }
}

/* Sends `mine` to every peer whose previous heartbeat has left (the others get it later). */
static void hb_flush(mpi_self *m) {
    if (!m->mine_unsent) return;
    bool all = true;
    for (int p = 0; p < m->size; p++) {
        if (p == m->rank || m->sent_seq[p] == m->mine.seq) continue;
        int flag = 1;
        if (m->send_req[p] != MPI_REQUEST_NULL) MPI_Test(&m->send_req[p], &flag, MPI_STATUS_IGNORE);
        if (!flag) {
            all = false;
            continue;
        }
        m->send_buf[p] = m->mine;
        MPI_Isend(&m->send_buf[p], (int)sizeof(hb_msg), MPI_BYTE, p, 7, m->side, &m->send_req[p]);
        m->sent_seq[p] = m->mine.seq;
    }
    m->mine_unsent = !all;
}

static void hb_enter(mpi_self *m, const cm_coll_info *ci) {
    if (!m->heartbeats || m->size < 2) return;
    m->mine = (hb_msg){ci->seq, ci->count, (int32_t)ci->coll, 0};
    m->mine_unsent = true;
    hb_flush(m);
    hb_drain(m);
}

static void mpi_describe_missing(void *self, const cm_coll_info *ci, char *buf, size_t cap) {
    mpi_self *m = self;
    if (!m->heartbeats || m->size < 2) {
        snprintf(buf, cap, m->child ? "a sub-communicator sends no heartbeats, so the missing ranks are unknown (the "
                                      "world communicator's timeout names them)"
                                    : "heartbeats are off, so the missing ranks are unknown");
        return;
    }
    /* let the heartbeats already on their way arrive */
    const double t0 = cm_clock_s();
    while (cm_clock_s() - t0 < 0.2) {
        hb_flush(m);
        hb_drain(m);
        cmi_dist_backoff(1000, 1.0);
    }
    size_t n = 0;
    int missing = 0, mismatched = 0;
    const double now = cm_clock_s();
    for (int p = 0; p < m->size && n + 200 < cap; p++) {
        if (p == m->rank) continue;
        const hb_msg *h = &m->seen[p];
        if (h->seq < ci->seq) {
            if (h->seq == 0)
                n += (size_t)snprintf(buf + n, cap - n, "%srank %d did not arrive (it has not entered any collective)",
                                      missing + mismatched ? "; " : "", p);
            else
                n += (size_t)snprintf(buf + n, cap - n,
                                      "%srank %d did not arrive (last seen entering #%llu %s %.1f s ago)",
                                      missing + mismatched ? "; " : "", p, (unsigned long long)h->seq,
                                      cm_coll_name((cm_coll)h->coll), now - m->seen_t[p]);
            missing++;
        } else if (h->seq == ci->seq && (h->coll != (int32_t)ci->coll || h->count != ci->count)) {
            n += (size_t)snprintf(buf + n, cap - n, "%srank %d called #%llu as %s of %lld elements instead",
                                  missing + mismatched ? "; " : "", p, (unsigned long long)h->seq,
                                  cm_coll_name((cm_coll)h->coll), (long long)h->count);
            mismatched++;
        }
    }
    if (!missing && !mismatched)
        snprintf(buf, cap, "every rank entered it (a transport stall, or a rank stopped inside it)");
}

/* ---- collectives ---- */

/* A request. A bf16 reduction runs in stages (MPI has no bf16 type, and its own reductions would
 * combine in an order of its choosing): 1, an all-to-all brings every rank's copy of this rank's
 * block here; the block is combined in f32 in rank order and rounded once (bf16_reduce); 2, for
 * all_reduce, every rank sends its reduced block to every other one. Stage 2 starts when a test
 * finds stage 1 done, which is not in the same order on every rank when several reductions are
 * in flight, so it is point-to-point (tagged by the collective's sequence number), never a
 * collective, whose matching would depend on that order. */
typedef struct mpi_req {
    MPI_Request r;
    int stage;            /* 0: a plain MPI request; 1: the exchange; 2: all_reduce's gather */
    MPI_Comm comm;
    cm_reduce_op op;
    int size;
    int64_t block;        /* this rank's block (elements) */
    uint16_t *tmp;        /* (size × block) every rank's copy of this rank's block, rank order */
    uint16_t *out;        /* where the reduced block goes */
    uint16_t *buf;        /* all_reduce: the whole buffer (in place) */
    int *counts, *displs; /* all_reduce: (size) each rank's block of the buffer */
    int *rcounts;         /* all_reduce: (2 × size) the exchange's receive counts and offsets (MPI reads
                             the arrays of a non-blocking call until it completes) */
    int tag;              /* all_reduce: stage 2's messages */
    int rank;
    MPI_Request *p2p;     /* all_reduce: (2 × size) stage 2's sends and receives */
    int n_p2p;
} mpi_req;

static cm_status count_ok(const cm_coll_info *ci, int64_t factor) {
    if (ci->count > INT_MAX / (factor > 0 ? factor : 1))
        return cm_set_error(CM_ERR_UNSUPPORTED, "%s of %lld elements: MPI counts are int; split it into pieces of at "
                                                "most %d elements", cm_coll_name(ci->coll), (long long)ci->count, INT_MAX);
    return CM_OK;
}

static cm_status new_req(mpi_req **out) {
    *out = cm_alloc(sizeof **out, 16);
    if (!*out) return cm_set_error(CM_ERR_OOM, "MPI request: out of memory");
    memset(*out, 0, sizeof **out);
    (*out)->r = MPI_REQUEST_NULL;
    return CM_OK;
}

static void req_free(mpi_req *q) {
    cm_free(q->tmp);
    cm_free(q->counts);
    cm_free(q->displs);
    cm_free(q->rcounts);
    cm_free(q->p2p);
    cm_free(q);
}

/* out[i] = the n_blocks values blocks[r·n + i] combined in f32 in rank order, rounded once. */
static void bf16_reduce(uint16_t *out, const uint16_t *blocks, int n_blocks, int64_t n, cm_reduce_op op) {
    for (int64_t i = 0; i < n; i++) {
        float acc = cmi_bf16_to_f32(blocks[i]);
        for (int r = 1; r < n_blocks; r++) {
            const float v = cmi_bf16_to_f32(blocks[(int64_t)r * n + i]);
            acc = op == CM_REDUCE_SUM ? acc + v : op == CM_REDUCE_MAX ? (v > acc ? v : acc) : (v < acc ? v : acc);
        }
        out[i] = cmi_f32_to_bf16(acc);
    }
}

static cm_status launched(mpi_req *q, int rc, const char *what, void **req) {
    if (rc != MPI_SUCCESS) {
        req_free(q);
        return mpi_err(what, rc);
    }
    *req = q;
    return CM_OK;
}

static int m_rank(void *self) { return ((mpi_self *)self)->rank; }
static int m_size(void *self) { return ((mpi_self *)self)->size; }

/* bf16 all_reduce: rank r's block is [r·b, min((r+1)·b, count)), b = ceil(count / size); the
 * exchange sends each rank its block of this rank's buffer. */
static cm_status bf16_all_reduce(mpi_self *m, const cm_coll_info *ci, void *buf, cm_reduce_op op, void **req) {
    mpi_req *q;
    cm_status s = new_req(&q);
    if (s) return s;
    const int W = m->size;
    const int64_t b = (ci->count + W - 1) / W;
    q->counts = cm_alloc(sizeof(int) * (size_t)W, 16);
    q->displs = cm_alloc(sizeof(int) * (size_t)W, 16);
    int *rcounts = q->rcounts = cm_alloc(sizeof(int) * (size_t)W * 2, 16);
    q->p2p = cm_alloc(sizeof(MPI_Request) * (size_t)W * 2, 16);
    if (!q->counts || !q->displs || !rcounts || !q->p2p) {
        req_free(q);
        return cm_set_error(CM_ERR_OOM, "bf16 all_reduce: out of memory");
    }
    for (int r = 0; r < W; r++) {
        const int64_t lo = (int64_t)r * b < ci->count ? (int64_t)r * b : ci->count;
        const int64_t hi = lo + b < ci->count ? lo + b : ci->count;
        q->counts[r] = (int)(hi - lo), q->displs[r] = (int)lo;
    }
    q->block = q->counts[m->rank];
    for (int r = 0; r < W; r++) rcounts[r] = (int)q->block, rcounts[W + r] = (int)(r * q->block);
    q->tmp = cm_alloc(sizeof(uint16_t) * (size_t)(W * q->block > 0 ? W * q->block : 1), 16);
    if (!q->tmp) {
        req_free(q);
        return cm_set_error(CM_ERR_OOM, "bf16 all_reduce: out of memory for %lld elements", (long long)(W * q->block));
    }
    q->stage = 1, q->comm = m->comm, q->op = op, q->size = W;
    q->tag = 100 + (int)(ci->seq % 30000); /* the reductions in flight at once are far fewer than 30000 */
    q->rank = m->rank;
    q->buf = buf;
    q->out = (uint16_t *)buf + q->displs[m->rank];
    hb_enter(m, ci);
    int rc = MPI_Ialltoallv(buf, q->counts, q->displs, MPI_UINT16_T, q->tmp, rcounts, rcounts + W, MPI_UINT16_T,
                            m->comm, &q->r);
    return launched(q, rc, "MPI_Ialltoallv", req);
}

static cm_status m_iall_reduce(void *self, const cm_coll_info *ci, void *buf, cm_reduce_op op, void **req) {
    mpi_self *m = self;
    mpi_req *q;
    cm_status s = count_ok(ci, 1);
    if (s) return s;
    if (ci->dtype == CM_COMM_BF16 && m->size > 1) return bf16_all_reduce(m, ci, buf, op, req);
    if ((s = new_req(&q))) return s;
    hb_enter(m, ci);
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)ci->count, mpi_type(ci->dtype), mpi_op(op), m->comm, &q->r);
    return launched(q, rc, "MPI_Iallreduce", req);
}

static cm_status m_ireduce_scatter(void *self, const cm_coll_info *ci, const void *send, void *recv, cm_reduce_op op,
                                   void **req) {
    mpi_self *m = self;
    mpi_req *q;
    cm_status s = count_ok(ci, m->size);
    if (s || (s = new_req(&q))) return s;
    if (ci->dtype == CM_COMM_BF16 && m->size > 1) { /* every rank's copy of this rank's block, then bf16_reduce */
        q->tmp = cm_alloc(sizeof(uint16_t) * (size_t)(ci->count * m->size > 0 ? ci->count * m->size : 1), 16);
        if (!q->tmp) {
            req_free(q);
            return cm_set_error(CM_ERR_OOM, "bf16 reduce_scatter: out of memory for %lld elements",
                                (long long)(ci->count * m->size));
        }
        q->stage = 1, q->comm = m->comm, q->op = op, q->size = m->size, q->block = ci->count, q->out = recv;
        hb_enter(m, ci);
        int rc = MPI_Ialltoall(send, (int)ci->count, MPI_UINT16_T, q->tmp, (int)ci->count, MPI_UINT16_T, m->comm, &q->r);
        return launched(q, rc, "MPI_Ialltoall", req);
    }
    hb_enter(m, ci);
    int rc = MPI_Ireduce_scatter_block(send, recv, (int)ci->count, mpi_type(ci->dtype), mpi_op(op), m->comm, &q->r);
    return launched(q, rc, "MPI_Ireduce_scatter_block", req);
}

static cm_status m_iall_gather(void *self, const cm_coll_info *ci, const void *send, void *recv, void **req) {
    mpi_self *m = self;
    mpi_req *q;
    cm_status s = count_ok(ci, m->size);
    if (s || (s = new_req(&q))) return s;
    hb_enter(m, ci);
    /* in place: this rank's block already sits where it is received */
    const size_t es = cm_comm_dtype_size(ci->dtype);
    const bool in_place = send == (const char *)recv + (size_t)m->rank * (size_t)ci->count * es;
    int rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : send, (int)ci->count, mpi_type(ci->dtype), recv, (int)ci->count,
                            mpi_type(ci->dtype), m->comm, &q->r);
    return launched(q, rc, "MPI_Iallgather", req);
}

static cm_status m_ibroadcast(void *self, const cm_coll_info *ci, void *buf, int root, void **req) {
    mpi_self *m = self;
    mpi_req *q;
    cm_status s = count_ok(ci, 1);
    if (s || (s = new_req(&q))) return s;
    hb_enter(m, ci);
    int rc = MPI_Ibcast(buf, (int)ci->count, mpi_type(ci->dtype), root, m->comm, &q->r);
    return launched(q, rc, "MPI_Ibcast", req);
}

static cm_status m_ibarrier(void *self, const cm_coll_info *ci, void **req) {
    mpi_self *m = self;
    mpi_req *q;
    cm_status s = new_req(&q);
    if (s) return s;
    hb_enter(m, ci);
    return launched(q, MPI_Ibarrier(m->comm, &q->r), "MPI_Ibarrier", req);
}

static cm_status m_test(void *self, void *req, bool *done) {
    mpi_self *m = self;
    mpi_req *q = req;
    int flag = 0;
    int rc = q->stage == 2 ? MPI_Testall(q->n_p2p, q->p2p, &flag, MPI_STATUSES_IGNORE)
                           : MPI_Test(&q->r, &flag, MPI_STATUS_IGNORE);
    if (m->mine_unsent) hb_flush(m);
    if (rc == MPI_SUCCESS && flag && q->stage == 1) { /* a bf16 reduction's exchange arrived */
        bf16_reduce(q->out, q->tmp, q->size, q->block, q->op);
        if (q->buf) { /* all_reduce: this rank's reduced block to every rank, theirs here */
            q->stage = 2;
            q->n_p2p = 0;
            for (int p = 0; p < q->size && rc == MPI_SUCCESS; p++) {
                if (p == q->rank) continue;
                if (q->counts[q->rank] > 0)
                    rc = MPI_Isend(q->out, q->counts[q->rank], MPI_UINT16_T, p, q->tag, q->comm, &q->p2p[q->n_p2p++]);
                if (rc == MPI_SUCCESS && q->counts[p] > 0)
                    rc = MPI_Irecv(q->buf + q->displs[p], q->counts[p], MPI_UINT16_T, p, q->tag, q->comm,
                                   &q->p2p[q->n_p2p++]);
            }
            flag = 0;
            if (rc != MPI_SUCCESS) {
                req_free(q);
                *done = true;
                return mpi_err("MPI_Isend / MPI_Irecv", rc);
            }
            rc = MPI_Testall(q->n_p2p, q->p2p, &flag, MPI_STATUSES_IGNORE);
        }
    }
    if (rc != MPI_SUCCESS) {
        req_free(q);
        *done = true; /* released; the caller records the failure */
        return mpi_err("MPI_Test", rc);
    }
    *done = flag != 0;
    if (flag) req_free(q);
    return CM_OK;
}

static void m_abort(void *self, int code) { MPI_Abort(MPI_COMM_WORLD, code); }

static void m_free(void *self, bool failed) {
    mpi_self *m = self;
    if (m->child) {
        /* no heartbeats in flight, so nothing to drain and no barrier: freeing a sub-communicator
         * never waits for the other ranks (cm_dist_free runs on failure paths too) */
        if (!failed && m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
    } else if (!failed) {
        /* every rank got here through the same collectives: heartbeats in flight are matched by
         * the receives still posted, so cancel those and let the sends finish */
        for (int p = 0; m->heartbeats && p < m->size; p++) {
            if (p == m->rank) continue;
            MPI_Cancel(&m->recv_req[p]);
            MPI_Wait(&m->recv_req[p], MPI_STATUS_IGNORE);
        }
        MPI_Barrier(m->side);
        for (int p = 0; m->heartbeats && p < m->size; p++)
            if (m->send_req[p] != MPI_REQUEST_NULL) MPI_Wait(&m->send_req[p], MPI_STATUS_IGNORE);
        MPI_Comm_free(&m->side);
        MPI_Comm_free(&m->comm);
    }
    cm_free(m->send_buf);
    cm_free(m->send_req);
    cm_free(m->sent_seq);
    cm_free(m->recv_buf);
    cm_free(m->recv_req);
    cm_free(m->seen);
    cm_free(m->seen_t);
    cm_free(m);
    if (--g_mpi_users == 0 && g_mpi_ours && !failed) {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin) MPI_Finalize();
    }
}

static cm_status m_split(void *self, int color, int key, const cm_comm_i **vt, void **out);

static const cm_comm_i k_mpi = {
    CM_COMM_ABI, "mpi",       m_rank, m_size, m_iall_reduce, m_ireduce_scatter, m_iall_gather, m_ibroadcast,
    m_ibarrier,  m_test,      mpi_describe_missing, m_abort, m_free, m_split,
};

/* A sub-communicator's backend over `comm` (taken). */
static cm_status child_new(MPI_Comm comm, const cm_comm_i **vt, void **self) {
    mpi_self *m = cm_alloc_zeroed(sizeof *m, 16);
    if (!m) {
        MPI_Comm_free(&comm);
        return cm_set_error(CM_ERR_OOM, "MPI sub-communicator: out of memory");
    }
    m->comm = comm, m->side = MPI_COMM_NULL, m->child = true;
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(m->comm, &m->rank);
    MPI_Comm_size(m->comm, &m->size);
    g_mpi_users++; /* MPI is finalised after the last communicator, sub-communicators included */
    *vt = &k_mpi;
    *self = m;
    return CM_OK;
}

static cm_status m_split(void *self, int color, int key, const cm_comm_i **vt, void **out) {
    mpi_self *m = self;
    MPI_Comm sub = MPI_COMM_NULL;
    int rc = MPI_Comm_split(m->comm, color, key, &sub);
    if (rc != MPI_SUCCESS) return mpi_err("MPI_Comm_split", rc);
    return child_new(sub, vt, out);
}

cm_status cmi_comm_mpi_backend_new(const cm_comm_config *cfg, const cm_comm_i **vt, void **self) {
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (fin)
        return cm_set_error(CM_ERR_STATE, "MPI communicator: MPI was already finalized in this process (MPI cannot "
                                          "start twice: keep one communicator for the process's life)");
    if (!inited) {
        int provided = 0;
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) return mpi_err("MPI_Init_thread", rc);
        g_mpi_ours = true;
    }
    mpi_self *m = cm_alloc_zeroed(sizeof *m, 16);
    if (!m) return cm_set_error(CM_ERR_OOM, "MPI communicator: out of memory");
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(MPI_COMM_WORLD, &m->side);
    if (rc != MPI_SUCCESS) {
        cm_free(m);
        return mpi_err("MPI_Comm_dup", rc);
    }
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(m->side, MPI_ERRORS_RETURN);
    MPI_Comm_rank(m->comm, &m->rank);
    MPI_Comm_size(m->comm, &m->size);
    m->heartbeats = cfg->heartbeats && m->size > 1;
    const size_t n = (size_t)m->size;
    m->send_buf = cm_alloc_zeroed(n * sizeof(hb_msg), 16);
    m->recv_buf = cm_alloc_zeroed(n * sizeof(hb_msg), 16);
    m->seen = cm_alloc_zeroed(n * sizeof(hb_msg), 16);
    m->send_req = cm_alloc_zeroed(n * sizeof(MPI_Request), 16);
    m->recv_req = cm_alloc_zeroed(n * sizeof(MPI_Request), 16);
    m->sent_seq = cm_alloc_zeroed(n * sizeof(uint64_t), 16);
    m->seen_t = cm_alloc_zeroed(n * sizeof(double), 16);
    g_mpi_users++;
    if (!m->send_buf || !m->recv_buf || !m->seen || !m->send_req || !m->recv_req || !m->sent_seq || !m->seen_t) {
        m->heartbeats = false;
        m_free(m, false);
        return cm_set_error(CM_ERR_OOM, "MPI communicator: out of memory for %d ranks", (int)n);
    }
    for (int p = 0; p < m->size; p++) {
        m->send_req[p] = m->recv_req[p] = MPI_REQUEST_NULL;
        if (m->heartbeats && p != m->rank) hb_post_recv(m, p);
    }
    *vt = &k_mpi;
    *self = m;
    return CM_OK;
}
