/* Data parallelism. NO_SHARD (DDP): every rank holds the whole model, computes the gradient of
 * its slice of the global batch, and the flat gradient buffers of the wrap units (one bucket
 * each) are summed over ranks. The trainer already weights each microbatch's loss by its share of
 * the global batch, so the sum is the full batch's gradient — no division afterwards.
 *
 * Overlap: a backward hook on the trainer's tape knows, for each unit, the earliest-recorded node
 * that reads one of its parameters; once backward has run past that node the unit's gradient is
 * final and its all-reduce starts. Buckets start in a fixed order (highest unit index first, the
 * order backward usually finishes them), so every rank issues the same sequence of collectives
 * whatever the timing; a unit that finishes out of that order waits for its turn.
 *
 * SHARD_GRAD_OP (ZeRO-2): each unit's flat buffers are padded to W·chunk floats (chunk =
 * ceil(numel / W)) so the collectives need no staging copies. The bucket of a unit becomes a
 * reduce-scatter of its whole gradient buffer into this rank's chunk (started from the same
 * backward hook, in the same order), the optimizer holds only this rank's piece of every unit
 * (parameters in place in the model's buffer, the reduced gradient in the chunk), and after the
 * step every unit is all-gathered in place so all ranks hold the new parameters again.
 *
 * FULL_SHARD (ZeRO-3): as SHARD_GRAD_OP, but the master parameters of this rank's piece live in
 * their own chunk and the model's flat parameter buffer of a unit is valid only while the unit is
 * gathered. The trainer's tape calls a fetch hook on every op input (and on every node's inputs
 * before its backward); an input whose data lies in a unit's buffer makes that unit resident: an
 * all-gather of the chunks into the buffer, at the same address, so views and saved tensors stay
 * valid. At most max_resident units are resident; gathering another evicts the least recently
 * used one, whose pages are returned to the system (madvise MADV_DONTNEED: the buffer keeps its
 * address, its memory is freed). After each optimizer step every unit is stale and released.
 * Gradients are sharded too: every microbatch's backward reduce-scatters each unit as soon as it is
 * final (the same hook and order as the buckets above) into a receive chunk, and before the next
 * backward writes gradients again the chunks are added into this rank's gradient shard and the
 * unit's full gradient pages are released (they read as zeros afterwards, which is what the next
 * accumulation needs, so zeroing them costs nothing either). Every rank must issue the same
 * gathers and reduce-scatters, so the trainer gives every rank the same number of microbatches
 * (collectives_per_microbatch).
 *
 * HYBRID_SHARD / _HYBRID_SHARD_ZERO2: FULL_SHARD / SHARD_GRAD_OP inside shard groups of S ranks
 * (a sub-communicator: every gather and reduce-scatter above runs there, and rank / world are
 * the rank in the group and S), replicated across the R groups. The reduce-scatter leaves each
 * rank the sum over its group's ranks only; sync_grads then all-reduces every gradient chunk
 * over the replicate group (the R ranks holding the same piece, a second sub-communicator), once
 * per batch after the last microbatch — the sum is the same whichever comes first, and one
 * all-reduce a batch is what the slow links between nodes should carry. */
#include "dist/dist_impl.h"
#include "nn/nn_impl.h"
#include "tensor/tensor_impl.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>

typedef struct unit_range {
    const char *lo, *hi; /* the unit's parameter bytes */
    int unit;
} unit_range;

struct cm_dist {
    cm_comm *comm;
    int rank, world;         /* in the shard group (hybrid), else in comm */
    bool sharded;            /* SHARD_GRAD_OP or FULL_SHARD (or a hybrid strategy) */
    bool full;               /* FULL_SHARD or HYBRID_SHARD */
    bool hybrid;             /* HYBRID_SHARD or _HYBRID_SHARD_ZERO2 */
    cm_comm *scomm;          /* the shard group: owned when hybrid, else comm */
    cm_comm *rcomm;          /* hybrid: the replicate group (owned), else NULL */
    bool replica;            /* hybrid: not in the first shard group (its spans are replicas) */
    float **pshard;          /* FULL_SHARD: (n_units) this rank's master parameter chunk (chunk floats) */
    size_t *pbytes;          /* FULL_SHARD: (n_units) bytes of each unit's page-aligned parameter buffer
                                (its gradient buffer has the same size) */
    float **grecv;           /* FULL_SHARD: (n_units) a microbatch's reduce-scattered chunk, added into gshard */
    bool *resident;          /* FULL_SHARD: (n_units) the unit's flat parameter buffer is valid */
    uint64_t *last_use;      /* FULL_SHARD: (n_units) tick of the last fetch */
    uint64_t tick;
    int n_resident, max_resident;
    int64_t *chunk;          /* (n_units) elements per rank of each padded unit */
    float **gshard;          /* (n_units) this rank's reduced gradient chunk (chunk floats) */
    cm_shard_span *spans;    /* (n_units) this rank's pieces */
    cm_model *model;
    cm_dist_config cfg;
    int n_units;
    cm_comm_request **req;   /* (n_units) in flight, NULL otherwise */
    cm_optim_span *ospans;   /* (n_units) what an optimizer over this rank's parameters holds */
    int64_t *unit_last;      /* (n_units) backward index after which the unit is final; -1: not on the tape */
    unit_range *ranges;      /* (n_units) sorted by address */
    int next;                /* units started so far in this step (issue order: n_units-1 down to 0) */
    bool armed;              /* this backward is the last microbatch's */
    const cm_node *cursor;   /* walking the tape alongside backward */
    int64_t cursor_idx;
    cm_state *st;
    cm_tape *tape;
    struct tape_link *link;  /* the plugin that tells us when the trainer (and its tape) goes */
    bool locked;             /* we hold a lock on the model (its buffers must not be re-packed) */
    cm_status hook_status;   /* a failure inside the hook, reported by sync_grads */
    char hook_error[1024];
    cm_dist_stats stats;
};

cm_dist_config cm_dist_config_default(void) { return (cm_dist_config){CM_SHARDING_NO_SHARD, true, true, 2, 0, 0}; }

cm_comm *cm_dist_comm(const cm_dist *d) { return d ? d->comm : NULL; }
cm_comm *cm_dist_shard_comm(const cm_dist *d) { return d ? d->scomm : NULL; }
cm_comm *cm_dist_replicate_comm(const cm_dist *d) { return d ? d->rcomm : NULL; }

cm_status cm_dist_optim_spans(cm_dist *d, const cm_optim_span **out, int *n) {
    if (!d || !out || !n) return cm_set_error(CM_ERR_INVALID_ARG, "cm_dist_optim_spans: NULL argument");
    *out = d->ospans;
    *n = d->n_units;
    return CM_OK;
}
cm_dist_stats cm_dist_get_stats(const cm_dist *d) { return d ? d->stats : (cm_dist_stats){0}; }
void cm_dist_reset_stats(cm_dist *d) {
    if (d) memset(&d->stats, 0, sizeof d->stats);
}

static int cmp_range(const void *a, const void *b) {
    const unit_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

typedef struct tape_link {
    cm_dist *d;
} tape_link;

void cm_dist_free(cm_dist *d) {
    if (!d) return;
    if (d->full && d->resident && d->model) {
        /* the model's buffers become ordinary memory again; units that were not gathered hold NaN
         * (loud, unlike the zeros of released pages): gather before freeing to keep the values */
        cm_module *root = cm_model_module(d->model);
        for (int u = 0; u < d->n_units; u++) {
            if (d->resident[u] || !d->pbytes[u]) continue;
            float *p = cm_module_unit(root, u)->params;
            mprotect(p, d->pbytes[u], PROT_READ | PROT_WRITE);
            for (size_t i = 0; i < d->pbytes[u] / sizeof(float); i++) p[i] = NAN;
        }
    }
    if (d->tape) cm_tape_set_backward_hook(d->tape, NULL, NULL);
    if (d->link) d->link->d = NULL;
    for (int u = 0; u < d->n_units; u++) cm_free(d->req ? d->req[u] : NULL); /* abandoned, see header */
    for (int u = 0; d->gshard && u < d->n_units; u++) cm_free(d->gshard[u]);
    for (int u = 0; d->pshard && u < d->n_units; u++) cm_free(d->pshard[u]);
    for (int u = 0; d->grecv && u < d->n_units; u++) cm_free(d->grecv[u]);
    cm_free(d->grecv);
    cm_free(d->gshard);
    cm_free(d->pshard);
    cm_free(d->pbytes);
    cm_free(d->resident);
    cm_free(d->last_use);
    cm_free(d->chunk);
    cm_free(d->spans);
    if (d->locked) cm_module_unlock(cm_model_module(d->model));
    cm_free(d->req);
    cm_free(d->ospans);
    cm_free(d->unit_last);
    cm_free(d->ranges);
    if (d->hybrid) {
        cm_comm_free(d->rcomm);
        if (d->scomm != d->comm) cm_comm_free(d->scomm);
    }
    cm_free(d);
}

static cm_status broadcast_states(cm_dist *d) {
    cm_module *root = cm_model_module(d->model);
    cm_status s;
    for (int u = 0; u < d->n_units; u++) {
        const cm_unit_info *ui = cm_module_unit(root, u);
        if ((s = cm_comm_broadcast(d->comm, ui->params, ui->numel, CM_COMM_F32, 0))) return s;
    }
    for (int64_t i = 0; i < cm_module_n_buffers(root); i++) {
        cm_buffer_info b = cm_module_buffer_info(root, i);
        if (!b.tensor) continue;
        const int64_t bytes = cm_tensor_numel(b.tensor) * (int64_t)cm_dtype_size(cm_tensor_dtype(b.tensor));
        if ((s = cm_comm_broadcast(d->comm, cm_tensor_data(b.tensor), bytes, CM_COMM_U8, 0))) return s;
    }
    return CM_OK;
}

/* SHARD_GRAD_OP: pads every unit to W·chunk floats, allocates this rank's gradient chunks and
 * describes its pieces. Locks the model so nothing re-packs the padded buffers under us. */
static cm_status shard_setup(cm_dist *d) {
    cm_module *root = cm_model_module(d->model);
    const size_t n = (size_t)(d->n_units > 0 ? d->n_units : 1);
    d->chunk = cm_alloc_zeroed(n * sizeof *d->chunk, 16);
    d->gshard = cm_alloc_zeroed(n * sizeof *d->gshard, 16);
    d->spans = cm_alloc_zeroed(n * sizeof *d->spans, 16);
    if (!d->chunk || !d->gshard || !d->spans) return cm_set_error(CM_ERR_OOM, "cm_dist_new: out of memory");
    if (d->full) {
        d->pshard = cm_alloc_zeroed(n * sizeof *d->pshard, 16);
        d->pbytes = cm_alloc_zeroed(n * sizeof *d->pbytes, 16);
        d->resident = cm_alloc_zeroed(n * sizeof *d->resident, 16);
        d->last_use = cm_alloc_zeroed(n * sizeof *d->last_use, 16);
        d->grecv = cm_alloc_zeroed(n * sizeof *d->grecv, 16);
        if (!d->pshard || !d->pbytes || !d->resident || !d->last_use || !d->grecv)
            return cm_set_error(CM_ERR_OOM, "cm_dist_new: out of memory");
    }
    const int64_t page = 4096 / (int64_t)sizeof(float);
    for (int u = 0; u < d->n_units; u++) {
        const int64_t numel = cm_module_unit(root, u)->numel, W = d->world;
        const int64_t chunk = (numel + W - 1) / W;
        /* FULL_SHARD releases a unit's parameter pages: the buffer gets whole pages of its own */
        const int64_t cap = d->full ? (chunk * W + page - 1) / page * page : chunk * W;
        cm_status s = cmn_unit_reserve(root, u, cap, d->full ? 4096 : 64);
        if (s) return s;
        d->chunk[u] = chunk;
        if (!(d->gshard[u] = cm_alloc_zeroed(sizeof(float) * (size_t)(chunk ? chunk : 1), 64)) ||
            (d->full && !(d->pshard[u] = cm_alloc_zeroed(sizeof(float) * (size_t)(chunk ? chunk : 1), 64))) ||
            (d->full && !(d->grecv[u] = cm_alloc_zeroed(sizeof(float) * (size_t)(chunk ? chunk : 1), 64))))
            return cm_set_error(CM_ERR_OOM, "cm_dist_new: out of memory for shards");
        if (d->full) {
            d->pbytes[u] = (size_t)cap * sizeof(float);
            d->resident[u] = true; /* holds rank 0's values until shard_take */
            d->n_resident++;
        }
    }
    for (int u = 0; u < d->n_units; u++) { /* after every reserve: the unit pointers are final */
        const cm_unit_info *ui = cm_module_unit(root, u);
        int64_t b = (int64_t)d->rank * d->chunk[u], e = b + d->chunk[u];
        if (b > ui->numel) b = ui->numel;
        if (e > ui->numel) e = ui->numel;
        d->spans[u] = (cm_shard_span){u, b, e, d->full ? d->pshard[u] : ui->params + b, d->gshard[u], d->replica};
    }
    cm_status s = cm_module_lock(root);
    if (!s) d->locked = true;
    return s;
}

/* ---------------------------------------------------------------------------------------------
 * FULL_SHARD: residency of the units' parameter buffers
 * ------------------------------------------------------------------------------------------- */

static void release(cm_dist *d, int u) {
    if (!d->resident[u]) return;
    float *p = cm_module_unit(cm_model_module(d->model), u)->params;
    /* the pages go back to the system, and the buffer is made unreadable until the next gather:
     * code that reads a released unit without the fetch hook faults at once instead of reading
     * zeros */
    if (d->pbytes[u]) {
        madvise(p, d->pbytes[u], MADV_DONTNEED);
        mprotect(p, d->pbytes[u], PROT_NONE);
    }
    d->resident[u] = false;
    d->n_resident--;
}

static void release_all(cm_dist *d) {
    for (int u = 0; u < d->n_units; u++) release(d, u);
}

/* Makes unit u's flat parameters valid: all-gathers every rank's chunk into them. */
static cm_status gather(cm_dist *d, int u) {
    d->last_use[u] = ++d->tick;
    if (d->resident[u]) return CM_OK;
    while (d->n_resident >= d->max_resident) { /* evict the least recently used */
        int lru = -1;
        for (int v = 0; v < d->n_units; v++)
            if (d->resident[v] && v != u && (lru < 0 || d->last_use[v] < d->last_use[lru])) lru = v;
        if (lru < 0) break;
        release(d, lru);
    }
    float *p = cm_module_unit(cm_model_module(d->model), u)->params;
    if (d->pbytes[u] && mprotect(p, d->pbytes[u], PROT_READ | PROT_WRITE) != 0)
        return cm_set_error(CM_ERR_OOM, "FULL_SHARD: cannot map the parameters of unit '%s' again (mprotect: %s)",
                            cm_module_unit(cm_model_module(d->model), u)->name, strerror(errno));
    cm_status s = cm_comm_all_gather(d->scomm, d->pshard[u], p, d->chunk[u], CM_COMM_F32);
    if (s) return s;
    d->resident[u] = true;
    d->n_resident++;
    d->stats.n_gathers++;
    return CM_OK;
}

/* After cm_dist_new's broadcast: each rank keeps its chunk as the master copy, and the full
 * buffers are released. */
static void shard_take(cm_dist *d) {
    cm_module *root = cm_model_module(d->model);
    for (int u = 0; u < d->n_units; u++) {
        const cm_shard_span *sp = &d->spans[u];
        memcpy(d->pshard[u], cm_module_unit(root, u)->params + sp->begin, sizeof(float) * (size_t)(sp->end - sp->begin));
    }
    release_all(d);
}

static int unit_of(const cm_dist *d, const void *p);

static cm_status fetch_hook(cm_tape *tp, const cm_tensor *t, void *data) {
    cm_dist *d = data;
    const int u = unit_of(d, cm_tensor_data(t));
    if (u < 0) return CM_OK;
    cm_status s = gather(d, u);
    if (s) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "FULL_SHARD: gathering the parameters of unit '%s' failed: %s",
                            cm_module_unit(cm_model_module(d->model), u)->name, msg);
    }
    return CM_OK;
}

cm_status cm_dist_gather_params(cm_dist *d) {
    if (!d) return cm_set_error(CM_ERR_INVALID_ARG, "cm_dist_gather_params: NULL");
    if (!d->full) return CM_OK;
    const int keep = d->max_resident;
    d->max_resident = d->n_units + 1;
    cm_status s = CM_OK;
    for (int u = 0; u < d->n_units && !s; u++) s = gather(d, u);
    d->max_resident = keep;
    return s;
}

/* HYBRID: shard group g = ranks [g·S, (g+1)·S) (a node, by default), replicate group k = the
 * ranks k, k + S, k + 2S, ... (the same piece in every group). */
static cm_status hybrid_groups(cm_dist *d, int shard_degree) {
    const int r = cm_comm_rank(d->comm);
    d->hybrid = true;
    d->scomm = NULL;
    cm_status s = cm_comm_split(d->comm, r / shard_degree, r, &d->scomm);
    if (!s) s = cm_comm_split(d->comm, r % shard_degree, r, &d->rcomm);
    if (s) {
        if (!d->scomm) d->scomm = d->comm; /* nothing of ours to free */
        return s;
    }
    d->rank = cm_comm_rank(d->scomm), d->world = cm_comm_size(d->scomm);
    d->replica = cm_comm_rank(d->rcomm) != 0;
    return CM_OK;
}

cm_status cm_dist_new(cm_comm *comm, cm_model *model, const cm_dist_config *cfg, cm_dist **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_dist_new: out is NULL");
    *out = NULL;
    if (!comm || !model) return cm_set_error(CM_ERR_INVALID_ARG, "cm_dist_new: %s is NULL", comm ? "model" : "comm");
    cm_dist_config c = cfg ? *cfg : cm_dist_config_default();
    if ((unsigned)c.sharding >= CM_SHARDING_COUNT)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_dist_new: sharding %d is not a cm_sharding", (int)c.sharding);
    const bool full = c.sharding == CM_SHARDING_FULL_SHARD || c.sharding == CM_SHARDING_HYBRID_SHARD;
    if (full && c.max_resident_units < 2)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_dist_new: max_resident_units %d: %s needs at least 2 (an op may "
                                                "read parameters of two units at once)",
                            c.max_resident_units, cm_sharding_name(c.sharding));
    int shard_degree = c.shard_degree, replicate_degree = c.replicate_degree;
    if (cm_sharding_is_hybrid(c.sharding)) {
        cm_status s = cm_dist_hybrid_degrees(cm_comm_size(comm), cm_dist_env_get().local_world_size, &shard_degree,
                                             &replicate_degree);
        if (s) return s;
    }
    cm_module *root = cm_model_module(model);
    if (!root || !cm_module_is_finalized(root))
        return cm_set_error(CM_ERR_STATE, "cm_dist_new: the model's module tree is not finalized (call "
                                          "cm_module_finalize first: its wrap units are the gradient buckets)");
    cm_dist *d = cm_alloc_zeroed(sizeof *d, 16);
    if (!d) return cm_set_error(CM_ERR_OOM, "cm_dist_new: out of memory");
    d->comm = comm, d->model = model, d->cfg = c;
    d->rank = cm_comm_rank(comm), d->world = cm_comm_size(comm);
    d->sharded = c.sharding != CM_SHARDING_NO_SHARD;
    d->full = full;
    d->scomm = comm;
    d->max_resident = c.max_resident_units;
    if (cm_sharding_is_hybrid(c.sharding)) {
        cm_status s = hybrid_groups(d, shard_degree);
        if (s) {
            cm_dist_free(d);
            return s;
        }
    }
    d->n_units = cm_module_n_units(root);
    const size_t n = (size_t)(d->n_units > 0 ? d->n_units : 1);
    d->req = cm_alloc_zeroed(n * sizeof *d->req, 16);
    d->unit_last = cm_alloc_zeroed(n * sizeof *d->unit_last, 16);
    d->ranges = cm_alloc_zeroed(n * sizeof *d->ranges, 16);
    d->ospans = cm_alloc_zeroed(n * sizeof *d->ospans, 16);
    if (!d->req || !d->unit_last || !d->ranges || !d->ospans) {
        cm_dist_free(d);
        return cm_set_error(CM_ERR_OOM, "cm_dist_new: out of memory for %d units", d->n_units);
    }
    cm_status s = d->sharded ? shard_setup(d) : CM_OK;
    if (s) {
        cm_dist_free(d);
        return s;
    }
    for (int u = 0; u < d->n_units; u++) {
        const cm_unit_info *ui = cm_module_unit(root, u);
        d->ranges[u] = (unit_range){(const char *)ui->params, (const char *)(ui->params + ui->numel), u};
        if (d->sharded)
            d->ospans[u] = (cm_optim_span){ui->name, d->spans[u].params, d->spans[u].grads,
                                           d->spans[u].end - d->spans[u].begin};
        else
            d->ospans[u] = (cm_optim_span){ui->name, ui->params, ui->grads, ui->numel};
    }
    qsort(d->ranges, (size_t)d->n_units, sizeof *d->ranges, cmp_range);
    s = c.sync_module_states && cm_comm_size(comm) > 1 ? broadcast_states(d) : CM_OK;
    if (s) {
        cm_dist_free(d);
        return s;
    }
    if (d->full) shard_take(d);
    *out = d;
    return CM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Buckets
 * ------------------------------------------------------------------------------------------- */

static int unit_of(const cm_dist *d, const void *p) {
    const char *x = p;
    int lo = 0, hi = d->n_units - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (x < d->ranges[mid].lo) hi = mid - 1;
        else if (x >= d->ranges[mid].hi) lo = mid + 1;
        else return d->ranges[mid].unit;
    }
    return -1;
}

static cm_status start_next(cm_dist *d) {
    const int u = d->n_units - 1 - d->next;
    const cm_unit_info *ui = cm_module_unit(cm_model_module(d->model), u);
    cm_status s;
    if (d->sharded) /* the padded gradient (W·chunk, tail zero) into this rank's chunk */
        s = cm_comm_ireduce_scatter(d->scomm, ui->grads, d->full ? d->grecv[u] : d->gshard[u], d->chunk[u],
                                    CM_COMM_F32, CM_REDUCE_SUM, &d->req[u]);
    else
        s = cm_comm_iall_reduce(d->comm, ui->grads, ui->numel, CM_COMM_F32, CM_REDUCE_SUM, &d->req[u]);
    if (s) return s;
    d->next++;
    d->stats.bytes += (double)(d->sharded ? d->chunk[u] * d->world : ui->numel) * 4.0;
    return CM_OK;
}

/* Pokes the requests in flight: MPI progresses non-blocking collectives only inside MPI calls. */
static cm_status progress(cm_dist *d) {
    for (int k = 0; k < d->next; k++) {
        const int u = d->n_units - 1 - k;
        if (!d->req[u]) continue;
        bool done = false;
        cm_status s = cm_comm_test(d->sharded ? d->scomm : d->comm, d->req[u], &done);
        if (s || done) d->req[u] = NULL;
        if (s) return s;
    }
    return CM_OK;
}

static void hook_fail(cm_dist *d, cm_status s) {
    if (d->hook_status) return;
    d->hook_status = s;
    snprintf(d->hook_error, sizeof d->hook_error, "%s", cm_last_error());
}

static cm_status flush(cm_dist *d);

static void backward_hook(cm_tape *tp, const void *node, void *data) {
    cm_dist *d = data;
    if (d->hook_status || !d->cfg.overlap || cm_comm_size(d->comm) < 2) return;
    const double t0 = cm_clock_s();
    if (!node) {
        /* FULL_SHARD reduce-scatters every microbatch: finish the previous one's before this
         * backward writes gradients again */
        if (d->full && d->next) {
            cm_status s = flush(d);
            if (s) {
                hook_fail(d, s);
                return;
            }
        }
        /* a new backward: is it the last microbatch's (or any, under FULL_SHARD)? then find when
         * each unit becomes final */
        d->armed = d->st && d->next == 0 && !cm_state_microbatch_auto(d->st) &&
                   (d->full || cm_state_microbatch_index(d->st) == cm_state_n_microbatches(d->st) - 1);
        if (!d->armed) return;
        for (int u = 0; u < d->n_units; u++) d->unit_last[u] = -1;
        int64_t idx = 0;
        for (const cm_node *n = tp->last; n; n = n->prev, idx++)
            for (int j = 0; j < n->n_in; j++) {
                const cm_tensor *in = n->in[j];
                if (!in || in->node || !(in->flags & CM_TF_REQUIRES_GRAD)) continue;
                const int u = unit_of(d, in->data);
                if (u >= 0) d->unit_last[u] = idx;
            }
        d->cursor = tp->last;
        d->cursor_idx = 0;
    } else {
        if (!d->armed) return;
        while (d->cursor && d->cursor != node) d->cursor = d->cursor->prev, d->cursor_idx++;
        if (!d->cursor) { /* not a node of this tape walk: stop overlapping for this step */
            d->armed = false;
            return;
        }
        const int64_t done_idx = d->cursor_idx;
        cm_status s = CM_OK;
        while (!s && d->next < d->n_units && d->unit_last[d->n_units - 1 - d->next] <= done_idx) {
            s = start_next(d);
            if (!s) d->stats.n_buckets_early++;
        }
        if (!s && d->next) s = progress(d);
        if (s) hook_fail(d, s);
    }
    d->stats.hook_s += cm_clock_s() - t0;
}

/* Starts the buckets backward has not started, waits for all of them and, under FULL_SHARD, adds
 * the received chunks into the gradient shards and releases the full gradient pages. */
static cm_status flush(cm_dist *d) {
    cm_status s = CM_OK;
    if (cm_comm_size(d->comm) > 1 || d->sharded) {
        while (!s && d->next < d->n_units) {
            s = start_next(d);
            if (!s) d->stats.n_buckets_late++;
        }
        for (int u = d->n_units - 1; u >= 0; u--) {
            if (!d->req[u]) continue;
            cm_status w = cm_comm_wait(d->sharded ? d->scomm : d->comm, d->req[u]);
            d->req[u] = NULL;
            if (!s) s = w;
        }
    }
    if (!s && d->full && d->next) {
        cm_module *root = cm_model_module(d->model);
        for (int u = 0; u < d->n_units; u++) {
            float *g = d->gshard[u];
            const float *r = d->grecv[u];
            for (int64_t i = 0; i < d->chunk[u]; i++) g[i] += r[i];
            if (d->pbytes[u]) madvise(cm_module_unit(root, u)->grads, d->pbytes[u], MADV_DONTNEED);
        }
    }
    d->next = 0;
    return s;
}

/* HYBRID: each rank's gradient chunk holds its shard group's sum; summed over the replicate
 * group it is the global batch's. Every unit's all-reduce in flight at once, in unit order. */
static cm_status replicate_reduce(cm_dist *d) {
    cm_status s = CM_OK;
    for (int u = d->n_units - 1; u >= 0 && !s; u--) {
        s = cm_comm_iall_reduce(d->rcomm, d->gshard[u], d->chunk[u], CM_COMM_F32, CM_REDUCE_SUM, &d->req[u]);
        if (!s) d->stats.bytes += (double)d->chunk[u] * 4.0;
    }
    for (int u = d->n_units - 1; u >= 0; u--) {
        if (!d->req[u]) continue;
        cm_status w = cm_comm_wait(d->rcomm, d->req[u]);
        d->req[u] = NULL;
        if (!s) s = w;
    }
    return s;
}

cm_status cm_dist_sync_grads(cm_dist *d) {
    if (!d) return cm_set_error(CM_ERR_INVALID_ARG, "cm_dist_sync_grads: NULL");
    d->armed = false;
    if (d->hook_status) {
        cm_status s = d->hook_status;
        d->hook_status = CM_OK;
        return cm_set_error(s, "%s", d->hook_error);
    }
    const double t0 = cm_clock_s();
    cm_status s = flush(d);
    if (!s && d->hybrid) s = replicate_reduce(d);
    d->stats.n_syncs++;
    d->stats.wait_s += cm_clock_s() - t0;
    return s;
}

/* FULL_SHARD, at the start of each batch (instead of cm_module_zero_grad): the shards start at
 * zero and the full gradient buffers give their pages back (so they read as zeros). */
static cm_status zero_grad_full(cm_dist *d) {
    cm_module *root = cm_model_module(d->model);
    for (int u = 0; u < d->n_units; u++) {
        memset(d->gshard[u], 0, sizeof(float) * (size_t)d->chunk[u]);
        if (d->pbytes[u]) madvise(cm_module_unit(root, u)->grads, d->pbytes[u], MADV_DONTNEED);
    }
    cmn_relink_grads(root);
    return CM_OK;
}

cm_status cm_dist_sync_params(cm_dist *d) {
    if (!d) return cm_set_error(CM_ERR_INVALID_ARG, "cm_dist_sync_params: NULL");
    if (!d->sharded) return CM_OK;
    if (d->full) { /* the chunks changed: every gathered buffer is stale */
        release_all(d);
        return CM_OK;
    }
    cm_module *root = cm_model_module(d->model);
    cm_status s = CM_OK;
    /* every unit's gather in flight at once, then wait for all (in place: this rank's chunk of the
     * padded buffer is where it is received) */
    for (int u = 0; u < d->n_units && !s; u++) {
        float *p = cm_module_unit(root, u)->params;
        s = cm_comm_iall_gather(d->scomm, p + (int64_t)d->rank * d->chunk[u], p, d->chunk[u], CM_COMM_F32, &d->req[u]);
    }
    for (int u = 0; u < d->n_units; u++) {
        if (!d->req[u]) continue;
        cm_status w = cm_comm_wait(d->scomm, d->req[u]);
        d->req[u] = NULL;
        if (!s) s = w;
    }
    return s;
}

/* ---------------------------------------------------------------------------------------------
 * Trainer hooks
 * ------------------------------------------------------------------------------------------- */

static cm_status hook_all_reduce_sum(double *values, int n, void *data) {
    cm_dist *d = data;
    return cm_comm_all_reduce_sum_f64(d->comm, values, n);
}

/* A callback the trainer's engine owns: when the trainer is freed (and its tape with it), its
 * free() unhooks the cm_dist; when the cm_dist goes first, cm_dist_free clears link->d. */
static cm_status link_run_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) { return CM_OK; }
static void link_free(void *self) {
    tape_link *l = self;
    if (l->d) {
        l->d->tape = NULL;
        l->d->st = NULL;
        l->d->link = NULL;
    }
    cm_free(l);
}
static const cm_callback_i k_link = {CM_CALLBACK_ABI, "DistributedDataParallel", link_run_event, NULL, NULL, NULL,
                                     link_free};

static cm_status hook_sync_grads(cm_state *st, void *data) { return cm_dist_sync_grads(data); }
static cm_status hook_sync_params(cm_state *st, void *data) { return cm_dist_sync_params(data); }
static cm_status hook_zero_grad(cm_state *st, void *data) { return zero_grad_full(data); }
static cm_status hook_barrier(void *data) { return cm_comm_barrier(((cm_dist *)data)->comm); }
static cm_status hook_broadcast(void *buf, int64_t bytes, int root, void *data) {
    return cm_comm_broadcast(((cm_dist *)data)->comm, buf, bytes, CM_COMM_U8, root);
}
static cm_status hook_all_gather(const void *send, void *recv, int64_t bytes, void *data) {
    return cm_comm_all_gather(((cm_dist *)data)->comm, send, recv, bytes, CM_COMM_U8);
}

void cm_dist_trainer_hooks(cm_dist *d, cm_trainer_config *cfg) {
    if (!d || !cfg) return;
    cfg->dist.rank = cm_comm_rank(d->comm);
    cfg->dist.world_size = cm_comm_size(d->comm);
    cfg->dist.all_reduce_sum = hook_all_reduce_sum;
    cfg->dist.sync_grads = hook_sync_grads;
    cfg->dist.barrier = hook_barrier;
    cfg->dist.broadcast = hook_broadcast;
    cfg->dist.all_gather = hook_all_gather;
    cfg->dist.sync_params = d->sharded ? hook_sync_params : NULL;
    cfg->dist.shard_spans = d->sharded ? d->spans : NULL;
    cfg->dist.n_shard_spans = d->sharded ? d->n_units : 0;
    cfg->dist.params_sharded = d->full;
    cfg->dist.collectives_per_microbatch = d->full && d->world > 1;
    cfg->dist.fetch = d->full ? fetch_hook : NULL;
    cfg->dist.zero_grad = d->full ? hook_zero_grad : NULL;
    cfg->dist.data = d;
}

cm_status cm_dist_attach(cm_dist *d, cm_trainer *tr) {
    if (!d || !tr) return cm_set_error(CM_ERR_INVALID_ARG, "cm_dist_attach: %s is NULL", d ? "trainer" : "dist");
    if (d->link) return cm_set_error(CM_ERR_STATE, "cm_dist_attach: already attached to a trainer");
    tape_link *l = cm_alloc_zeroed(sizeof *l, 16);
    if (!l) return cm_set_error(CM_ERR_OOM, "cm_dist_attach: out of memory");
    l->d = d;
    cm_status s = cm_engine_add_callback(cm_trainer_engine(tr), (cm_callback_plugin){&k_link, l});
    if (s) {
        cm_free(l);
        return s;
    }
    d->link = l;
    d->st = cm_trainer_state(tr);
    d->tape = cm_state_tape(d->st);
    cm_tape_set_backward_hook(d->tape, backward_hook, d);
    return CM_OK;
}
