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
 * address, its memory is freed; units of 2 MiB and more are on transparent huge pages, so the next
 * gather faults them in 2 MiB at a time: see HUGE_PAGE). After each optimizer step every unit is
 * stale and released.
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
 * all-reduce a batch is what the slow links between nodes should carry.
 *
 * FULL_SHARD prefetch (forward_prefetch, backward_prefetch, limit_all_gathers): the fetch hook
 * records, per pass (forward; backward, checkpoint replays included), the sequence of units the
 * tape moves between, and follows the previous pass's sequence; entering a unit (forward_prefetch,
 * BACKWARD_PRE) or finishing one's gradient (BACKWARD_POST, from the backward hook) starts the
 * non-blocking all-gather of the unit(s) that come next in it, into pages mapped for it. The
 * unit is "pending" until the tape reads it: then the hook waits for the gather (the fetch hook
 * tests the gathers in flight on every call, since MPI progresses them only inside MPI calls).
 * Every decision depends only on the sequence of fetches and backward nodes, which is the same on
 * every rank — never on timing — so every rank issues the same gathers in the same order. Pending
 * units are not resident: eviction never touches them (their pages are being written), and they
 * are bounded by the in-flight limit; after the step any left (a pass that read another order)
 * are completed and released with the rest.
 *
 * Mixed precision (cm_mixed_precision, FSDP's MixedPrecision). param_dtype bf16: the tape must
 * read bf16-rounded parameters while the optimizer steps f32 masters. FULL_SHARD gathers a unit
 * as bf16 (each rank rounds its master chunk, the all-gather moves the 16-bit patterns, the result
 * is widened into the flat buffer); SHARD_GRAD_OP keeps its masters in a chunk of their own and
 * gathers them the same way after each step; NO_SHARD, with nothing to gather, rounds a unit's
 * buffer in place the first time the tape reads it (the fetch hook), keeping the masters aside,
 * and puts the masters back when the pass ends (sync_grads; the end of an evaluation, from the
 * trainer's events). A unit whose buffer holds f32 values the tape must not read (NO_SHARD at
 * rest, or after cm_dist_gather_params, which gathers f32) is "hi": the fetch hook rounds it
 * first. reduce_dtype bf16: each bucket is rounded into a bf16 copy, reduced as CM_COMM_BF16 and
 * widened back into the f32 buffer or chunk when it is waited for. buffer_dtype bf16: f32 buffers
 * are rounded in place at the start, on every read through the fetch hook and after each batch's
 * backward. On a GPU (one rank, NO_SHARD) the same happens in device memory: the masters are device
 * buffers, rounding runs on the device, and a bf16 reduce_dtype rounds the gradients in place (a
 * reduction over one rank). The model may move to the GPU after cm_dist_new, as the CLI and the
 * trainer move it: NO_SHARD then takes the new addresses (relayout). Under cpu_offload the masters
 * stay the f32 host shards: a unit is uploaded as f32 and rounded on the device once the upload is
 * done (FSDP casts an offloaded shard after moving it: the same values), a bf16 reduce_dtype rounds
 * each microbatch's gradient on the device before its download, and the buffers, which live on
 * the GPU, are rounded there.
 *
 * NO_SHARD with the model on GPUs, over several ranks (one process per GPU, each on the GPU of its
 * local rank): the reduction runs over MPI through host memory. A unit's bucket becomes a download
 * of its gradient into a pinned host stage (on the copy stream, after the backward work queued so
 * far), and once the download is done the stage is all-reduced in place (a bf16 reduce_dtype: as
 * on the CPU, through a bf16 copy); when every unit is reduced the stages are uploaded back into
 * the gradients. Downloads finish in the order they started, and a unit's all-reduce starts only
 * after every earlier unit's did, so every rank still issues the same collectives in the same
 * order. NCCL (device buffers reduced on the GPUs themselves) would skip the staging; this path
 * needs nothing but MPI.
 *
 * cpu_offload (one process on a GPU) is FULL_SHARD on one rank with host memory as the shards' home:
 * the master parameters, the gradient shard and its receive chunk are pinned host buffers of the
 * whole unit, and the model's unit buffers are fixed-address GPU ranges (the backend's vm_*: CUDA's
 * virtual memory management) — the same address whether mapped or not, as FULL_SHARD's released
 * pages keep theirs, so the tape's views and saved tensors stay valid. "Gather" maps the range and
 * uploads the master copy (on the compute stream; a prefetch on the copy stream, joined when the tape
 * reads the unit); "release" unmaps it. A unit's gradient range is mapped and zeroed when backward
 * first reaches the unit (the fetch hook); the backward hook's bucket becomes a download into the
 * receive chunk once the unit is final, and when the download is done the chunk is added into the
 * gradient shard and the range unmapped — so the device holds the gradients of the units backward
 * is in, not the model's. The optimizer and clipping see the host shards (CPU kernels). */
#include "dist/dist_impl.h"
#include "nn/nn_impl.h"
#include "tensor/backend.h"
#include "tensor/tensor_impl.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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
    /* FULL_SHARD prefetch (see the header comment) */
    bool prefetch;           /* forward_prefetch or a backward_prefetch other than NONE */
    cm_comm_request **greq;  /* (n_units) a prefetched gather still running, NULL otherwise */
    bool *pending;           /* (n_units) prefetched (pages mapped), not yet read by the tape */
    int n_pending;
    int *rec[2], rec_len[2];   /* units entered by the current forward [0] / backward [1] pass */
    int *pred[2], pred_len[2]; /* the previous pass's, which the current one follows */
    int pos[2], last_unit[2];  /* where the current pass is in pred; the unit it read last */
    int phase;                 /* the pass the last fetch belonged to (-1: a new one starts) */
    int seq_cap;
    int64_t *post_last;        /* BACKWARD_POST: (n_units) backward index after which the unit is final */
    const cm_node *post_cursor;
    int64_t post_idx;
    bool post_armed;
    /* mixed precision (see the header comment) */
    bool mp_params, mp_reduce, mp_buffers; /* the bf16 fields of cfg.mixed_precision */
    bool *hi;                /* mp_params: (n_units) the flat buffer holds f32 values the tape must not read */
    float **master;          /* NO_SHARD + mp_params: (n_units) the masters while the buffer holds rounded values */
    uint16_t **rsend;        /* mp_reduce: (n_units) the bf16 copy of a bucket being reduced, NULL otherwise */
    uint16_t **rrecv;        /* mp_reduce, sharded: (n_units) its reduced chunk (chunk) */
    uint16_t **gstage;       /* mp_params, sharded: (n_units) a bf16 gather in flight (W·chunk), NULL otherwise */
    float **bufs;            /* mp_buffers: (n_bufs) the model's f32 buffers, buf_n[i] elements each */
    cm_device mdev;          /* the model's device when ranges, ospans, bufs and master were taken */
    int64_t *buf_n;
    int n_bufs;
    bool ready;              /* cm_dist_new finished: the state above is consistent */
    /* cpu_offload (see the header comment) */
    bool offload;
    bool adopted;            /* the model's unit buffers are the ranges below */
    const cmi_backend *be;
    float **vparams, **vgrads; /* (n_units) the fixed-address GPU ranges */
    void **upev;             /* (n_units) a prefetched upload in flight (its event), else NULL */
    void **downev;           /* (n_units) a gradient download in flight, else NULL */
    bool *gmapped;           /* (n_units) the unit's GPU gradient range is mapped (zeroed, then written) */
    /* NO_SHARD on GPUs over several ranks (see the header comment); downev above is shared */
    float **stage;           /* (n_units) pinned host copy of the unit's gradient, reduced in place */
    uint8_t *sstate;         /* (n_units) STAGE_* below */
    cm_device sdev;          /* the device the stages were made for */
    void *rscratch;          /* round_bf16_on's bf16 scratch (rscratch_n elements on rscratch_dev), or NULL */
    int64_t rscratch_n;
    cm_device rscratch_dev;
};

enum { STAGE_IDLE, STAGE_DOWNLOADING, STAGE_REDUCING };

cm_dist_config cm_dist_config_default(void) {
    return (cm_dist_config){CM_SHARDING_NO_SHARD, true, true, 2, 0, 0, CM_BACKWARD_PREFETCH_POST, false, true,
                            {CM_DTYPE_F32, CM_DTYPE_F32, CM_DTYPE_F32, false}, false};
}

cm_status cm_mixed_precision_policy(const char *name, cm_precision precision, cm_mixed_precision *out) {
    if (!name || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_mixed_precision_policy: NULL argument");
    const cm_dtype ac = precision == CM_PRECISION_AMP_BF16 ? CM_DTYPE_BF16
                        : precision == CM_PRECISION_AMP_FP16 ? CM_DTYPE_F16 : CM_DTYPE_F32;
    if (!strcasecmp(name, "FULL")) *out = (cm_mixed_precision){CM_DTYPE_F32, CM_DTYPE_F32, CM_DTYPE_F32, false};
    else if (!strcasecmp(name, "DEFAULT")) *out = (cm_mixed_precision){ac, CM_DTYPE_F32, ac, false};
    else if (!strcasecmp(name, "PURE")) *out = (cm_mixed_precision){ac, ac, ac, false};
    else return cm_set_error(CM_ERR_INVALID_ARG, "mixed_precision '%s': use FULL, DEFAULT or PURE", name);
    return CM_OK;
}

/* The fields of a cm_mixed_precision this library can hold. */
static cm_status check_mixed_precision(const cm_mixed_precision *mp) {
    const cm_dtype dt[3] = {mp->param_dtype, mp->reduce_dtype, mp->buffer_dtype};
    static const char *const field[3] = {"param_dtype", "reduce_dtype", "buffer_dtype"};
    for (int i = 0; i < 3; i++) {
        if (dt[i] == CM_DTYPE_F32 || dt[i] == CM_DTYPE_BF16) continue;
        if (dt[i] == CM_DTYPE_F16)
            return cm_set_error(CM_ERR_UNSUPPORTED, "cm_dist_new: mixed_precision %s fp16 is not built (there are no "
                                                    "fp16 kernels; precision amp_fp16 is refused too): use bf16 or fp32",
                                field[i]);
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_dist_new: mixed_precision %s %d: use CM_DTYPE_F32 or CM_DTYPE_BF16",
                            field[i], (int)dt[i]);
    }
    if (mp->keep_low_precision_grads)
        return cm_set_error(CM_ERR_UNSUPPORTED, "cm_dist_new: mixed_precision keep_low_precision_grads true is not "
                                                "built: the optimizer steps f32 gradients here (the reduced gradient is "
                                                "widened to f32, as with false); set it to false");
    return CM_OK;
}

/* p[i] = p[i] rounded to bf16 (nearest even), for i < n. */
static void round_bf16(float *p, int64_t n) {
    for (int64_t i = 0; i < n; i++) p[i] = cmi_bf16_to_f32(cmi_f32_to_bf16(p[i]));
}

/* The same rounding of n floats on the model's device (d->mdev): on a GPU a cast to bf16 and
 * back through a scratch the dist keeps (grown to the largest request; under cpu_offload every
 * upload rounds), the backend's conversions rounding to nearest even as cmi_f32_to_bf16. */
static cm_status round_bf16_on(cm_dist *d, float *p, int64_t n) {
    if (d->mdev == CM_DEVICE_CPU) {
        round_bf16(p, n);
        return CM_OK;
    }
    if (n <= 0) return CM_OK;
    const cmi_backend *be = cmi_backend_get(d->mdev);
    if (!be) return cm_last_status() ? cm_last_status() : CM_ERR_UNSUPPORTED;
    if (d->rscratch && (d->rscratch_dev != d->mdev || d->rscratch_n < n)) {
        cmi_dev_free(d->rscratch_dev, d->rscratch);
        d->rscratch = NULL;
    }
    if (!d->rscratch) {
        if (!(d->rscratch = cmi_dev_alloc(d->mdev, sizeof(uint16_t) * (size_t)n, false)))
            return cm_last_status() ? cm_last_status() : CM_ERR_OOM;
        d->rscratch_dev = d->mdev, d->rscratch_n = n;
    }
    const int64_t shape[1] = {n}, one[1] = {1};
    cm_status s = be->copy(d->rscratch, CM_DTYPE_BF16, one, p, CM_DTYPE_F32, one, 1, shape);
    if (!s) s = be->copy(p, CM_DTYPE_F32, one, d->rscratch, CM_DTYPE_BF16, one, 1, shape);
    return s;
}

static const char *const k_backward_prefetch[] = {
#define CM_X_(name, str) str,
    CM_BACKWARD_PREFETCH_LIST(CM_X_)
#undef CM_X_
};

const char *cm_backward_prefetch_name(cm_backward_prefetch p) {
    return (unsigned)p < CM_BACKWARD_PREFETCH_COUNT ? k_backward_prefetch[p] : "?";
}

cm_status cm_backward_prefetch_parse(const char *s, cm_backward_prefetch *out) {
    for (int i = 0; s && out && i < CM_BACKWARD_PREFETCH_COUNT; i++)
        if (!strcasecmp(s, k_backward_prefetch[i])) {
            *out = (cm_backward_prefetch)i;
            return CM_OK;
        }
    return cm_set_error(CM_ERR_INVALID_ARG, "backward_prefetch '%s': use BACKWARD_PRE, BACKWARD_POST or NONE",
                        s ? s : "(null)");
}

cm_comm *cm_dist_comm(const cm_dist *d) { return d ? d->comm : NULL; }
cm_comm *cm_dist_shard_comm(const cm_dist *d) { return d ? d->scomm : NULL; }
cm_comm *cm_dist_replicate_comm(const cm_dist *d) { return d ? d->rcomm : NULL; }

static cm_status relayout(cm_dist *d);

cm_status cm_dist_optim_spans(cm_dist *d, const cm_optim_span **out, int *n) {
    if (!d || !out || !n) return cm_set_error(CM_ERR_INVALID_ARG, "cm_dist_optim_spans: NULL argument");
    cm_status s = relayout(d); /* the model may have moved to a GPU since cm_dist_new */
    if (s) return s;
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

static cm_status prefetch_drain(cm_dist *d);
static cm_status mp_restore(cm_dist *d);
static void offload_free(cm_dist *d);
static void stage_free(cm_dist *d);

void cm_dist_free(cm_dist *d) {
    if (!d) return;
    /* nothing may still write into the buffers: finish the prefetched gathers (every rank has the
     * same ones) unless the communicator failed (then they are abandoned, as d->req below) */
    if (d->n_pending && cm_comm_status(d->scomm) == CM_OK) (void)prefetch_drain(d);
    (void)mp_restore(d); /* NO_SHARD: the masters back into the model */
    stage_free(d);
    if (d->offload) {
        offload_free(d);
    } else if (d->full && d->resident && d->model) {
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
    for (int u = 0; !d->offload && d->gshard && u < d->n_units; u++) cm_free(d->gshard[u]);
    for (int u = 0; !d->offload && d->pshard && u < d->n_units; u++) cm_free(d->pshard[u]);
    for (int u = 0; !d->offload && d->grecv && u < d->n_units; u++) cm_free(d->grecv[u]);
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
    for (int u = 0; d->greq && u < d->n_units; u++) cm_free(d->greq[u]);
    cm_free(d->greq);
    cm_free(d->pending);
    for (int k = 0; k < 2; k++) {
        cm_free(d->rec[k]);
        cm_free(d->pred[k]);
    }
    cm_free(d->post_last);
    for (int u = 0; u < d->n_units; u++) {
        if (d->master) cmi_dev_free(d->mdev, d->master[u]);
        if (d->rsend) cm_free(d->rsend[u]);
        if (d->rrecv) cm_free(d->rrecv[u]);
        if (d->gstage) cm_free(d->gstage[u]);
    }
    cm_free(d->hi);
    cm_free(d->master);
    cm_free(d->rsend);
    cm_free(d->rrecv);
    cm_free(d->gstage);
    cm_free(d->bufs);
    cm_free(d->buf_n);
    if (d->rscratch) cmi_dev_free(d->rscratch_dev, d->rscratch);
    if (d->hybrid) {
        cm_comm_free(d->rcomm);
        if (d->scomm != d->comm) cm_comm_free(d->scomm);
    }
    cm_free(d);
}

/* Rank 0's bytes at p (on device dev) to every rank; device memory through a host copy. */
static cm_status broadcast_on(cm_dist *d, void *p, cm_device dev, int64_t n, cm_comm_dtype dt, size_t esize) {
    if (dev == CM_DEVICE_CPU) return cm_comm_broadcast(d->comm, p, n, dt, 0);
    const size_t bytes = esize * (size_t)n;
    void *h = cm_alloc(bytes ? bytes : 1, 64);
    if (!h) return cm_set_error(CM_ERR_OOM, "cm_dist_new: out of host memory broadcasting %zu bytes", bytes);
    cm_status s = cmi_dev_memcpy(h, CM_DEVICE_CPU, p, dev, bytes);
    if (!s) s = cm_comm_broadcast(d->comm, h, n, dt, 0);
    if (!s) s = cmi_dev_memcpy(p, dev, h, CM_DEVICE_CPU, bytes);
    cm_free(h);
    return s;
}

static cm_status broadcast_states(cm_dist *d) {
    cm_module *root = cm_model_module(d->model);
    cm_status s;
    for (int u = 0; u < d->n_units; u++) {
        const cm_unit_info *ui = cm_module_unit(root, u);
        if ((s = broadcast_on(d, ui->params, ui->device, ui->numel, CM_COMM_F32, sizeof(float)))) return s;
    }
    for (int64_t i = 0; i < cm_module_n_buffers(root); i++) {
        cm_buffer_info b = cm_module_buffer_info(root, i);
        if (!b.tensor) continue;
        const int64_t bytes = cm_tensor_numel(b.tensor) * (int64_t)cm_dtype_size(cm_tensor_dtype(b.tensor));
        if ((s = broadcast_on(d, cm_tensor_data(b.tensor), cm_tensor_device(b.tensor), bytes, CM_COMM_U8, 1))) return s;
    }
    return CM_OK;
}

/* NO_SHARD on GPUs over several ranks: the stages are given back (downloads in flight waited for). */
static void stage_free(cm_dist *d) {
    if (!d->stage) return;
    const cmi_backend *be = cmi_backend_get(d->sdev);
    for (int u = 0; u < d->n_units; u++) {
        if (d->downev[u] && be) (void)be->copy_wait(d->downev[u]);
        if (d->stage[u] && be) be->host_free(d->stage[u]);
    }
    cm_free(d->stage);
    cm_free(d->sstate);
    cm_free(d->downev);
    d->stage = NULL, d->sstate = NULL, d->downev = NULL;
}

/* ... and made for a model on device dev (a GPU): a pinned stage per unit. */
static cm_status stage_setup(cm_dist *d, cm_device dev) {
    const cmi_backend *be = cmi_backend_get(dev);
    if (!be) return cm_last_status() ? cm_last_status() : CM_ERR_UNSUPPORTED;
    const size_t n = (size_t)(d->n_units > 0 ? d->n_units : 1);
    d->stage = cm_alloc_zeroed(n * sizeof *d->stage, 16);
    d->sstate = cm_alloc_zeroed(n * sizeof *d->sstate, 16);
    d->downev = cm_alloc_zeroed(n * sizeof *d->downev, 16);
    d->sdev = dev;
    d->be = be;
    if (!d->stage || !d->sstate || !d->downev) {
        stage_free(d);
        return cm_set_error(CM_ERR_OOM, "cm_dist: out of memory");
    }
    cm_module *root = cm_model_module(d->model);
    for (int u = 0; u < d->n_units; u++) {
        const cm_unit_info *ui = cm_module_unit(root, u);
        const size_t bytes = sizeof(float) * (size_t)(ui->numel ? ui->numel : 1);
        if (!(d->stage[u] = be->host_alloc(bytes))) {
            stage_free(d);
            return cm_set_error(CM_ERR_OOM, "cm_dist: out of pinned host memory for the gradient stage of unit '%s' "
                                            "(%zu bytes)",
                                ui->name, bytes);
        }
    }
    return CM_OK;
}

/* Transparent huge pages for FULL_SHARD's unit buffers. A released unit's pages are returned
 * (MADV_DONTNEED) and fault in again on its next gather, and its gradient pages on every backward:
 * on 4 KiB pages that is a fault per 4 KiB, 11 k faults and ~30 ms for GPT-2 medium's 43 MB on the
 * 2-core VM, against ~4 ms in 2 MiB pages (docs/PERFORMANCE.md). Buffers of units of 2 MiB and
 * more start on a 2 MiB boundary and their whole 2 MiB pages are madvised MADV_HUGEPAGE; the tail
 * stays on small pages, so a resident unit holds no more memory than before. Where the kernel has
 * THP off the hint is refused and nothing else changes. */
#define HUGE_PAGE ((size_t)2 << 20)

/* Asks for huge pages over the whole 2 MiB pages inside [p, p + bytes); false (errno set) if the
 * kernel refused. */
static bool huge_pages(void *p, size_t bytes) {
    const uintptr_t b = ((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1);
    const uintptr_t e = ((uintptr_t)p + bytes) & ~(uintptr_t)(HUGE_PAGE - 1);
    return e <= b || madvise((void *)b, e - b, MADV_HUGEPAGE) == 0;
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
    if (d->full || d->mp_params) { /* the master chunks (SHARD_GRAD_OP: under a bf16 param_dtype) */
        d->pshard = cm_alloc_zeroed(n * sizeof *d->pshard, 16);
        if (!d->pshard) return cm_set_error(CM_ERR_OOM, "cm_dist_new: out of memory");
    }
    if (d->full) {
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
        const bool huge = d->full && (size_t)cap * sizeof(float) >= HUGE_PAGE;
        cm_status s = cmn_unit_reserve(root, u, cap, huge ? HUGE_PAGE : d->full ? 4096 : 64);
        if (s) return s;
        if (huge) { /* every gather and every backward faults the released pages in again: 2 MiB at a time */
            const cm_unit_info *ui = cm_module_unit(root, u);
            if (!huge_pages(ui->params, (size_t)cap * sizeof(float)) || !huge_pages(ui->grads, (size_t)cap * sizeof(float)))
                cm_log_msg(CM_LOG_DEBUG, "FULL_SHARD: unit '%s' stays on 4 KiB pages (madvise MADV_HUGEPAGE: %s)",
                           ui->name, strerror(errno));
        }
        d->chunk[u] = chunk;
        if (!(d->gshard[u] = cm_alloc_zeroed(sizeof(float) * (size_t)(chunk ? chunk : 1), 64)) ||
            (d->pshard && !(d->pshard[u] = cm_alloc_zeroed(sizeof(float) * (size_t)(chunk ? chunk : 1), 64))) ||
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
        d->spans[u] = (cm_shard_span){u, b, e, d->pshard ? d->pshard[u] : ui->params + b, d->gshard[u], d->replica};
    }
    cm_status s = cm_module_lock(root);
    if (!s) d->locked = true;
    return s;
}

/* cpu_offload: the shards are the whole units in pinned host memory (the model's values), the
 * model's unit buffers become fixed-address GPU ranges (unmapped: nothing resident), its buffers
 * move to the GPU. Nothing changes in the model until every allocation succeeded. */
static cm_status offload_setup(cm_dist *d) {
    cm_module *root = cm_model_module(d->model);
    if (cm_module_device(root) != CM_DEVICE_CPU)
        return cm_set_error(CM_ERR_STATE, "cm_dist_new: cpu_offload: the model is on %s already; make the "
                                          "data-parallel object while it is on the CPU (its parameters stay in host "
                                          "memory; their GPU ranges are made here)",
                            cm_device_name(cm_module_device(root)));
    if (cm_module_is_locked(root))
        return cm_set_error(CM_ERR_STATE, "cm_dist_new: cpu_offload: the model is locked by an optimizer or a trainer; "
                                          "set up data parallelism (cm_dist_new) before creating them");
    if (d->n_units < 2)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "cm_dist_new: cpu_offload: %s has %d wrap unit%s ('%s'): all its parameters would be on "
                            "the GPU whenever it is used, so offloading saves nothing; wrap its blocks into units "
                            "(the zoo's transformers are) or leave cpu_offload off",
                            cm_model_type_name(d->model), d->n_units, d->n_units == 1 ? "" : "s",
                            d->n_units ? cm_module_unit(root, 0)->name : "");
    cm_status s = cm_device_check(CM_DEVICE_CUDA);
    if (s) {
        char msg[900];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "cm_dist_new: cpu_offload streams parameters to a GPU: %s", msg);
    }
    const cmi_backend *be = d->be = cmi_backend_get(CM_DEVICE_CUDA);
    const size_t n = (size_t)d->n_units;
    d->chunk = cm_alloc_zeroed(n * sizeof *d->chunk, 16);
    d->gshard = cm_alloc_zeroed(n * sizeof *d->gshard, 16);
    d->spans = cm_alloc_zeroed(n * sizeof *d->spans, 16);
    d->pshard = cm_alloc_zeroed(n * sizeof *d->pshard, 16);
    d->pbytes = cm_alloc_zeroed(n * sizeof *d->pbytes, 16);
    d->resident = cm_alloc_zeroed(n * sizeof *d->resident, 16);
    d->last_use = cm_alloc_zeroed(n * sizeof *d->last_use, 16);
    d->grecv = cm_alloc_zeroed(n * sizeof *d->grecv, 16);
    d->vparams = cm_alloc_zeroed(n * sizeof *d->vparams, 16);
    d->vgrads = cm_alloc_zeroed(n * sizeof *d->vgrads, 16);
    d->upev = cm_alloc_zeroed(n * sizeof *d->upev, 16);
    d->downev = cm_alloc_zeroed(n * sizeof *d->downev, 16);
    d->gmapped = cm_alloc_zeroed(n * sizeof *d->gmapped, 16);
    if (!d->chunk || !d->gshard || !d->spans || !d->pshard || !d->pbytes || !d->resident || !d->last_use ||
        !d->grecv || !d->vparams || !d->vgrads || !d->upev || !d->downev || !d->gmapped)
        return cm_set_error(CM_ERR_OOM, "cm_dist_new: out of memory");
    for (int u = 0; u < d->n_units; u++) {
        const cm_unit_info *ui = cm_module_unit(root, u);
        const size_t bytes = sizeof(float) * (size_t)(ui->numel ? ui->numel : 1);
        d->chunk[u] = ui->numel;
        d->pbytes[u] = bytes;
        if (!(d->pshard[u] = be->host_alloc(bytes)) || !(d->gshard[u] = be->host_alloc(bytes)) ||
            !(d->grecv[u] = be->host_alloc(bytes)))
            return cm_set_error(CM_ERR_OOM, "cm_dist_new: cpu_offload: out of pinned host memory for unit '%s' "
                                            "(3 x %zu bytes)",
                                ui->name, bytes);
        memcpy(d->pshard[u], ui->params, sizeof(float) * (size_t)ui->numel);
        memset(d->gshard[u], 0, bytes);
        if (!(d->vparams[u] = be->vm_reserve(bytes)) || !(d->vgrads[u] = be->vm_reserve(bytes))) {
            char msg[900];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            return cm_set_error(cm_last_status() ? cm_last_status() : CM_ERR_OOM,
                                "cm_dist_new: cpu_offload: GPU address space for unit '%s': %s", ui->name, msg);
        }
    }
    if ((s = cmn_buffers_to_device(root, CM_DEVICE_CUDA))) return s;
    for (int u = 0; u < d->n_units; u++) { /* nothing fails from here on */
        float *op, *og;
        cmn_unit_rebind(root, u, d->vparams[u], d->vgrads[u], CM_DEVICE_CUDA, &op, &og);
        cm_free(op);
        cm_free(og);
        d->spans[u] = (cm_shard_span){u, 0, d->chunk[u], d->pshard[u], d->gshard[u], false};
    }
    d->adopted = true;
    if ((s = cm_module_lock(root))) return s;
    d->locked = true;
    return CM_OK;
}

/* cpu_offload: the model goes back to ordinary host memory holding the master parameters (its
 * buffers too), and the GPU ranges and pinned memory are given back. */
static void offload_free(cm_dist *d) {
    const cmi_backend *be = d->be;
    if (!be) return;
    for (int u = 0; u < d->n_units; u++) {
        if (d->upev && d->upev[u]) (void)be->copy_wait(d->upev[u]);
        if (d->downev && d->downev[u]) (void)be->copy_wait(d->downev[u]);
    }
    cm_module *root = d->model ? cm_model_module(d->model) : NULL;
    bool keep = false; /* out of host memory: the model keeps its GPU ranges (and they leak) */
    if (d->adopted && root) {
        float **np = cm_alloc_zeroed(sizeof(float *) * (size_t)(2 * d->n_units), 16);
        for (int u = 0; np && u < d->n_units; u++) {
            const size_t bytes = d->pbytes[u];
            np[2 * u] = cm_alloc(bytes, 64);
            np[2 * u + 1] = cm_alloc_zeroed(bytes, 64);
            if (!np[2 * u] || !np[2 * u + 1]) {
                for (int v = 0; v <= u; v++) cm_free(np[2 * v]), cm_free(np[2 * v + 1]);
                cm_free(np);
                np = NULL;
            }
        }
        if (np) {
            for (int u = 0; u < d->n_units; u++) {
                memcpy(np[2 * u], d->pshard[u], sizeof(float) * (size_t)d->chunk[u]);
                cmn_unit_rebind(root, u, np[2 * u], np[2 * u + 1], CM_DEVICE_CPU, NULL, NULL);
            }
            cm_free(np);
            if (cmn_buffers_to_device(root, CM_DEVICE_CPU) != CM_OK)
                cm_log_msg(CM_LOG_WARN, "cpu_offload: the model's buffers could not move back to the CPU: %s",
                           cm_last_error());
        } else {
            keep = true;
            cm_log_msg(CM_LOG_WARN, "cpu_offload: out of host memory moving the model back to the CPU: it keeps its "
                                    "GPU ranges, which hold no values");
        }
    }
    for (int u = 0; !keep && u < d->n_units; u++) {
        if (d->vparams && d->vparams[u]) be->vm_release(d->vparams[u]);
        if (d->vgrads && d->vgrads[u]) be->vm_release(d->vgrads[u]);
    }
    for (int u = 0; u < d->n_units; u++) {
        if (d->pshard && d->pshard[u]) be->host_free(d->pshard[u]);
        if (d->gshard && d->gshard[u]) be->host_free(d->gshard[u]);
        if (d->grecv && d->grecv[u]) be->host_free(d->grecv[u]);
    }
    cm_free(d->vparams);
    cm_free(d->vgrads);
    cm_free(d->upev);
    cm_free(d->downev);
    cm_free(d->gmapped);
}

/* ---------------------------------------------------------------------------------------------
 * FULL_SHARD: residency of the units' parameter buffers
 * ------------------------------------------------------------------------------------------- */

static void release(cm_dist *d, int u) {
    if (!d->resident[u]) return;
    float *p = cm_module_unit(cm_model_module(d->model), u)->params;
    /* the pages go back to the system, and the buffer is made unreadable until the next gather:
     * code that reads a released unit without the fetch hook faults at once instead of reading
     * zeros (cpu_offload: the GPU range is unmapped) */
    if (d->offload) {
        d->be->vm_unmap(p);
    } else if (d->pbytes[u]) {
        madvise(p, d->pbytes[u], MADV_DONTNEED);
        mprotect(p, d->pbytes[u], PROT_NONE);
    }
    d->resident[u] = false;
    d->n_resident--;
    if (d->hi) d->hi[u] = false;
}

static void release_all(cm_dist *d) {
    for (int u = 0; u < d->n_units; u++) release(d, u);
}

/* Room for unit u among the resident units: evicts the least recently used ones (never u, never
 * a pending one: those are not resident). */
static void make_room(cm_dist *d, int u) {
    while (d->n_resident >= d->max_resident) { /* evict the least recently used */
        int lru = -1;
        for (int v = 0; v < d->n_units; v++)
            if (d->resident[v] && v != u && (lru < 0 || d->last_use[v] < d->last_use[lru])) lru = v;
        if (lru < 0) break;
        release(d, lru);
    }
}

static cm_status take_pending(cm_dist *d, int u);
static void note_held(cm_dist *d, int gathering);

/* A bf16 gather of unit u's master chunks: this rank's chunk rounded into its block of a W·chunk
 * staging buffer (*stage, allocated here), gathered in place; the caller widens it. */
static cm_status start_gather_bf16(cm_dist *d, int u, uint16_t **stage, cm_comm_request **req) {
    const int64_t c = d->chunk[u];
    uint16_t *g = cm_alloc(sizeof(uint16_t) * (size_t)(c * d->world > 0 ? c * d->world : 1), 64);
    if (!g) return cm_set_error(CM_ERR_OOM, "cm_dist: out of memory for a bf16 gather of %lld elements",
                                (long long)(c * d->world));
    cmi_bf16_round(g + (int64_t)d->rank * c, d->pshard[u], c);
    cm_status s = req ? cm_comm_iall_gather(d->scomm, g + (int64_t)d->rank * c, g, c, CM_COMM_BF16, req)
                      : cm_comm_all_gather(d->scomm, g + (int64_t)d->rank * c, g, c, CM_COMM_BF16);
    if (s) {
        cm_free(g);
        return s;
    }
    *stage = g;
    d->stats.gather_bytes += (double)(c * d->world) * 2.0;
    return CM_OK;
}

/* Widens a finished bf16 gather of unit u into its flat parameter buffer and frees the stage. */
static void finish_gather_bf16(cm_dist *d, int u, uint16_t **stage) {
    cmi_bf16_widen(cm_module_unit(cm_model_module(d->model), u)->params, *stage, d->chunk[u] * d->world);
    cm_free(*stage);
    *stage = NULL;
}

/* Makes unit u's flat parameters valid: all-gathers every rank's chunk into them (or waits for
 * the gather prefetch started). `f32`: the f32 masters even under a bf16 param_dtype
 * (cm_dist_gather_params); otherwise what the tape reads. */
static cm_status gather(cm_dist *d, int u, bool f32) {
    d->last_use[u] = ++d->tick;
    const bool want_hi = d->mp_params && f32;
    if (d->resident[u] && d->hi && d->hi[u] && !want_hi) { /* f32 masters in the buffer: rounded for the tape */
        cm_status s = round_bf16_on(d, cm_module_unit(cm_model_module(d->model), u)->params, d->chunk[u] * d->world);
        if (s) return s;
        d->hi[u] = false;
    }
    if (d->resident[u] && !(want_hi && !d->hi[u])) return CM_OK;
    if (d->resident[u]) release(d, u); /* rounded, and the f32 masters are wanted */
    make_room(d, u);
    if (d->pending && d->pending[u]) {
        d->stats.n_prefetch_hits++;
        cm_status s = take_pending(d, u);
        if (s || !want_hi) return s;
        release(d, u); /* a bf16 prefetch: gather the f32 masters instead */
    }
    note_held(d, 1);
    float *p = cm_module_unit(cm_model_module(d->model), u)->params;
    if (d->offload) {
        /* under a bf16 param_dtype the f32 master is uploaded and rounded on the device, as FSDP
         * casts an offloaded shard after moving it */
        cm_status s = d->be->vm_map(p);
        if (!s) s = d->be->memcpy(p, d->pshard[u], sizeof(float) * (size_t)d->chunk[u], CMI_H2D);
        if (!s && d->mp_params && !f32) s = round_bf16_on(d, p, d->chunk[u]);
        if (s) {
            d->be->vm_unmap(p);
            return s;
        }
        d->resident[u] = true;
        d->n_resident++;
        if (d->hi) d->hi[u] = want_hi;
        d->stats.n_gathers++;
        return CM_OK;
    }
    if (d->pbytes[u] && mprotect(p, d->pbytes[u], PROT_READ | PROT_WRITE) != 0)
        return cm_set_error(CM_ERR_OOM, "FULL_SHARD: cannot map the parameters of unit '%s' again (mprotect: %s)",
                            cm_module_unit(cm_model_module(d->model), u)->name, strerror(errno));
    cm_status s;
    if (d->mp_params && !f32) {
        uint16_t *g = NULL;
        s = start_gather_bf16(d, u, &g, NULL);
        if (!s) finish_gather_bf16(d, u, &g);
    } else {
        s = cm_comm_all_gather(d->scomm, d->pshard[u], p, d->chunk[u], CM_COMM_F32);
        if (!s) d->stats.gather_bytes += (double)(d->chunk[u] * d->world) * 4.0;
    }
    if (s) return s;
    d->resident[u] = true;
    d->n_resident++;
    if (d->hi) d->hi[u] = want_hi;
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
static void hook_fail(cm_dist *d, cm_status s);

/* ---------------------------------------------------------------------------------------------
 * FULL_SHARD prefetch
 * ------------------------------------------------------------------------------------------- */

static cm_status prefetch_setup(cm_dist *d) {
    const size_t n = (size_t)(d->n_units > 0 ? d->n_units : 1);
    d->seq_cap = 4 * d->n_units + 16;
    d->greq = cm_alloc_zeroed(n * sizeof *d->greq, 16);
    d->pending = cm_alloc_zeroed(n * sizeof *d->pending, 16);
    d->post_last = cm_alloc_zeroed(n * sizeof *d->post_last, 16);
    if (!d->greq || !d->pending || !d->post_last) return cm_set_error(CM_ERR_OOM, "cm_dist_new: out of memory");
    for (int k = 0; k < 2; k++) {
        d->rec[k] = cm_alloc_zeroed(sizeof(int) * (size_t)d->seq_cap, 16);
        d->pred[k] = cm_alloc_zeroed(sizeof(int) * (size_t)d->seq_cap, 16);
        if (!d->rec[k] || !d->pred[k]) return cm_set_error(CM_ERR_OOM, "cm_dist_new: out of memory");
        d->pos[k] = d->last_unit[k] = -1;
    }
    d->phase = -1;
    return CM_OK;
}

/* Units holding pages now (with `gathering` a blocking gather about to start): the peaks. */
static void note_held(cm_dist *d, int gathering) {
    const int in_flight = d->n_pending + gathering, held = d->n_resident + in_flight;
    if (in_flight > d->stats.max_in_flight) d->stats.max_in_flight = in_flight;
    if (held > d->stats.max_gathered) d->stats.max_gathered = held;
}

/* Finishes the prefetched gather of unit u (waiting for it if it still runs): u becomes resident
 * (the caller made room). */
static cm_status take_pending(cm_dist *d, int u) {
    cm_status s = CM_OK;
    if (d->greq[u]) s = cm_comm_wait(d->scomm, d->greq[u]);
    if (d->offload && d->upev[u]) s = d->be->copy_join(d->upev[u]); /* kernels after it wait for the upload */
    d->greq[u] = NULL;
    if (d->offload) d->upev[u] = NULL;
    if (!s && d->offload && d->mp_params) /* the uploaded master rounded for the tape, after the upload */
        s = round_bf16_on(d, cm_module_unit(cm_model_module(d->model), u)->params, d->chunk[u]);
    d->pending[u] = false;
    d->n_pending--;
    if (d->gstage && d->gstage[u]) { /* a bf16 gather: widened into the buffer */
        if (!s) finish_gather_bf16(d, u, &d->gstage[u]);
        cm_free(d->gstage[u]);
        d->gstage[u] = NULL;
    }
    if (s) { /* the buffer holds garbage: unreadable again */
        float *p = cm_module_unit(cm_model_module(d->model), u)->params;
        if (d->offload) {
            d->be->vm_unmap(p);
        } else if (d->pbytes[u]) {
            madvise(p, d->pbytes[u], MADV_DONTNEED);
            mprotect(p, d->pbytes[u], PROT_NONE);
        }
        return s;
    }
    d->resident[u] = true;
    d->n_resident++;
    if (d->hi) d->hi[u] = false;
    return CM_OK;
}

/* Completes every pending unit (each becomes resident; the caller releases them). */
static cm_status prefetch_drain(cm_dist *d) {
    cm_status s = CM_OK;
    for (int u = 0; d->pending && u < d->n_units; u++) {
        if (!d->pending[u]) continue;
        d->stats.n_prefetch_unused++;
        cm_status w = take_pending(d, u);
        if (!s) s = w;
    }
    return s;
}

/* MPI progresses a non-blocking collective only inside MPI calls: test the gathers in flight. A
 * finished one stays pending (the tape has not read it yet). */
static cm_status prefetch_progress(cm_dist *d) {
    for (int u = 0; d->offload && u < d->n_units; u++) { /* a finished upload needs no join */
        bool done = false;
        cm_status s = d->upev[u] ? d->be->copy_test(d->upev[u], &done) : CM_OK;
        if (!s && done) {
            s = d->be->copy_wait(d->upev[u]);
            d->upev[u] = NULL;
        }
        if (s) return s;
    }
    for (int u = 0; u < d->n_units; u++) {
        if (!d->greq[u]) continue;
        bool done = false;
        cm_status s = cm_comm_test(d->scomm, d->greq[u], &done);
        if (s || done) d->greq[u] = NULL;
        if (s) { /* released by the test: never read what it wrote */
            d->pending[u] = false;
            d->n_pending--;
            if (d->gstage) cm_free(d->gstage[u]), d->gstage[u] = NULL;
            return s;
        }
    }
    return CM_OK;
}

/* Starts the gather of unit v ahead of its use, into its pages mapped again. */
static cm_status start_prefetch(cm_dist *d, int v) {
    const cm_unit_info *ui = cm_module_unit(cm_model_module(d->model), v);
    if (d->offload) {
        cm_status s = d->be->vm_map(ui->params);
        if (!s) s = d->be->copy_start(ui->params, d->pshard[v], sizeof(float) * (size_t)d->chunk[v], CMI_H2D, &d->upev[v]);
        if (s) {
            d->be->vm_unmap(ui->params);
            return s;
        }
    } else if (d->pbytes[v] && mprotect(ui->params, d->pbytes[v], PROT_READ | PROT_WRITE) != 0)
        return cm_set_error(CM_ERR_OOM, "FULL_SHARD: cannot map the parameters of unit '%s' again (mprotect: %s)",
                            ui->name, strerror(errno));
    cm_status s;
    if (d->offload) {
        s = CM_OK; /* the upload started above */
    } else if (d->mp_params) {
        s = start_gather_bf16(d, v, &d->gstage[v], &d->greq[v]);
    } else {
        s = cm_comm_iall_gather(d->scomm, d->pshard[v], ui->params, d->chunk[v], CM_COMM_F32, &d->greq[v]);
        if (!s) d->stats.gather_bytes += (double)(d->chunk[v] * d->world) * 4.0;
    }
    if (s) {
        if (d->pbytes[v]) mprotect(ui->params, d->pbytes[v], PROT_NONE);
        return s;
    }
    d->pending[v] = true;
    d->n_pending++;
    d->stats.n_gathers++;
    d->stats.n_prefetches++;
    note_held(d, 0);
    return CM_OK;
}

/* Starts the gathers of the units the previous pass of phase ph entered after the current
 * position: one unit ahead with at most 2 gathers in flight under limit_all_gathers, else up to
 * max_resident_units ahead with at most that + 1 in flight. `gathering`: the current unit's own
 * (blocking) gather comes right after, and counts as in flight. */
static cm_status prefetch_ahead(cm_dist *d, int ph, int cur, bool gathering) {
    const int depth = d->cfg.limit_all_gathers ? 1 : d->max_resident;
    const int cap = d->cfg.limit_all_gathers ? 2 : d->max_resident + 1;
    int looked = 0;
    for (int i = d->pos[ph] + 1; i < d->pred_len[ph] && looked < depth; i++) {
        const int v = d->pred[ph][i];
        if (v == cur) continue;
        looked++;
        if (d->resident[v] || d->pending[v]) continue;
        if (d->n_pending + (gathering ? 1 : 0) >= cap) break;
        cm_status s = start_prefetch(d, v);
        if (s) return s;
    }
    return CM_OK;
}

/* A new pass of phase ph: the one recorded last becomes the sequence to follow. The first
 * backward follows the reverse of the forward just run. */
static void begin_pass(cm_dist *d, int ph) {
    d->phase = ph;
    if (d->rec_len[ph]) {
        int *t = d->pred[ph];
        d->pred[ph] = d->rec[ph], d->pred_len[ph] = d->rec_len[ph];
        d->rec[ph] = t;
    } else if (ph == 1 && !d->pred_len[1]) {
        for (int i = 0; i < d->rec_len[0]; i++) d->pred[1][i] = d->rec[0][d->rec_len[0] - 1 - i];
        d->pred_len[1] = d->rec_len[0];
    }
    d->rec_len[ph] = 0;
    d->pos[ph] = d->last_unit[ph] = -1;
}

/* The tape enters unit u in phase ph: record it, and move to it in the sequence followed (the
 * next entry; else its next occurrence; else its first; else nowhere). */
static void follow(cm_dist *d, int ph, int u) {
    if (d->rec_len[ph] < d->seq_cap) d->rec[ph][d->rec_len[ph]++] = u;
    const int *p = d->pred[ph], n = d->pred_len[ph], at = d->pos[ph];
    if (at + 1 < n && p[at + 1] == u) {
        d->pos[ph] = at + 1;
        return;
    }
    for (int i = at + 2; i < n; i++)
        if (p[i] == u) {
            d->pos[ph] = i;
            return;
        }
    for (int i = 0; i <= at && i < n; i++)
        if (p[i] == u) {
            d->pos[ph] = i;
            return;
        }
    d->pos[ph] = n;
}

/* The fetch hook's path with prefetch on: follows the pass, starts the prefetches that entering
 * u triggers (forward_prefetch in forward, BACKWARD_PRE in backward), then gathers u. */
static cm_status fetch_prefetching(cm_dist *d, cm_tape *tp, int u) {
    const int ph = tp->in_backward || tp->replaying;
    if (ph != d->phase) begin_pass(d, ph);
    if (u != d->last_unit[ph]) {
        d->last_unit[ph] = u;
        follow(d, ph, u);
        if (ph ? d->cfg.backward_prefetch == CM_BACKWARD_PREFETCH_PRE : d->cfg.forward_prefetch) {
            d->last_use[u] = ++d->tick;
            if (!d->resident[u]) make_room(d, u); /* before: a unit about to be evicted is not "resident" */
            cm_status s = prefetch_ahead(d, ph, u, !d->resident[u] && !d->pending[u]);
            if (s) return s;
        }
    }
    return gather(d, u, false);
}

/* A new backward: last[u] = how many nodes from the tape's end backward reaches the last node
 * reading a leaf of unit u (after it the unit's gradient is final), -1 for units it never reads. */
static void unit_final_index(const cm_dist *d, const cm_tape *tp, int64_t *last) {
    for (int u = 0; u < d->n_units; u++) last[u] = -1;
    int64_t idx = 0;
    for (const cm_node *n = tp->last; n; n = n->prev, idx++)
        for (int j = 0; j < n->n_in; j++) {
            const cm_tensor *in = n->in[j];
            if (!in || in->node || !(in->flags & CM_TF_REQUIRES_GRAD)) continue;
            const int u = unit_of(d, in->data);
            if (u >= 0) last[u] = idx;
        }
}

/* BACKWARD_POST, from the backward hook: once backward has run the node after which a unit's
 * gradient is final, start the gather of what comes next. */
static void prefetch_post(cm_dist *d, cm_tape *tp, const cm_node *node) {
    if (!node) { /* a new backward: where each unit becomes final (as backward_hook's unit_last) */
        unit_final_index(d, tp, d->post_last);
        d->post_cursor = tp->last;
        d->post_idx = 0;
        d->post_armed = true;
        return;
    }
    if (!d->post_armed) return;
    while (d->post_cursor && d->post_cursor != node) d->post_cursor = d->post_cursor->prev, d->post_idx++;
    if (!d->post_cursor) {
        d->post_armed = false;
        return;
    }
    bool final = false;
    for (int u = 0; u < d->n_units && !final; u++) final = d->post_last[u] == d->post_idx;
    if (!final || d->phase != 1) return;
    const double t0 = cm_clock_s();
    cm_status s = prefetch_ahead(d, 1, d->last_unit[1], false);
    d->stats.hook_s += cm_clock_s() - t0;
    if (s) hook_fail(d, s);
}

/* ---------------------------------------------------------------------------------------------
 * Mixed precision: what the fetch hook does besides FULL_SHARD's gathers
 * ------------------------------------------------------------------------------------------- */

static cm_status round_buffers(cm_dist *d) {
    cm_status s = CM_OK;
    for (int i = 0; i < d->n_bufs && !s; i++) s = round_bf16_on(d, d->bufs[i], d->buf_n[i]);
    return s;
}

/* NO_SHARD: the masters back into the buffers the tape rounded (the pass is over). */
static cm_status mp_restore(cm_dist *d) {
    if (!d->ready || !d->mp_params || d->sharded || !d->master) return CM_OK;
    cm_module *root = cm_model_module(d->model);
    cm_status s = CM_OK;
    for (int u = 0; u < d->n_units && !s; u++) {
        if (d->hi[u]) continue;
        const cm_unit_info *ui = cm_module_unit(root, u);
        s = cmi_dev_memcpy(ui->params, d->mdev, d->master[u], d->mdev, sizeof(float) * (size_t)ui->numel);
        if (!s) d->hi[u] = true;
    }
    return s;
}

/* The unit ranges (sorted by address, for unit_of) and the optimizer spans of the model's
 * current buffers. */
static void take_ranges(cm_dist *d) {
    cm_module *root = cm_model_module(d->model);
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
}

/* mp_buffers: the model's contiguous f32 buffers, where they are now. */
static void take_buffers(cm_dist *d) {
    cm_module *root = cm_model_module(d->model);
    const int64_t nb = cm_module_n_buffers(root);
    d->n_bufs = 0;
    for (int64_t i = 0; i < nb; i++) {
        cm_buffer_info b = cm_module_buffer_info(root, i);
        if (!b.tensor || cm_tensor_dtype(b.tensor) != CM_DTYPE_F32 || !cm_tensor_is_contiguous(b.tensor)) continue;
        d->bufs[d->n_bufs] = cm_tensor_data(b.tensor);
        d->buf_n[d->n_bufs++] = cm_tensor_numel(b.tensor);
    }
}

/* The model moved to another device after cm_dist_new (the CLI and the trainer move it after data
 * parallelism is set up, before the optimizer): NO_SHARD takes the new addresses, and under a bf16
 * param_dtype its master copies move to that device too (at rest the model's buffers hold the
 * masters, so their contents need not). The sharded strategies hold host memory of their own and
 * cannot follow. */
static cm_status relayout(cm_dist *d) {
    cm_module *root = cm_model_module(d->model);
    const cm_device dev = root ? cm_module_device(root) : d->mdev;
    if (dev == d->mdev) return CM_OK;
    if (d->sharded || d->offload)
        return cm_set_error(CM_ERR_STATE, "cm_dist: the model moved from %s to %s after cm_dist_new, which %s keeps in "
                                          "buffers of its own: move the model before cm_dist_new",
                            cm_device_name(d->mdev), cm_device_name(dev),
                            d->offload ? "cpu_offload" : cm_sharding_name(d->cfg.sharding));
    if (d->next)
        return cm_set_error(CM_ERR_STATE, "cm_dist: the model moved to %s while gradients were being reduced",
                            cm_device_name(dev));
    for (int u = 0; d->master && u < d->n_units; u++)
        if (!d->hi[u])
            return cm_set_error(CM_ERR_STATE, "cm_dist: the model moved to %s in the middle of a pass (unit '%s' "
                                              "holds bf16-rounded parameters)",
                                cm_device_name(dev), cm_module_unit(root, u)->name);
    /* several ranks on a GPU: the gradients are reduced through host stages (made first: a
     * failure below gives them back and leaves everything as it was) */
    const bool staged = cm_comm_size(d->comm) > 1 && dev != CM_DEVICE_CPU;
    if (staged && !d->stage) {
        cm_status s = stage_setup(d, dev);
        if (s) return s;
    }
    if (d->master) { /* every new master first, so a failure leaves the old ones (and mdev) as they were */
        float **nm = cm_alloc_zeroed(sizeof *nm * (size_t)(d->n_units > 0 ? d->n_units : 1), 16);
        if (!nm) {
            if (staged) stage_free(d);
            return cm_set_error(CM_ERR_OOM, "cm_dist: out of memory");
        }
        for (int u = 0; u < d->n_units; u++) {
            const size_t bytes = sizeof(float) * (size_t)(cm_module_unit(root, u)->numel + 1);
            if (!(nm[u] = cmi_dev_alloc(dev, bytes, false))) {
                char msg[512];
                snprintf(msg, sizeof msg, "%s", cm_last_error());
                for (int v = 0; v < u; v++) cmi_dev_free(dev, nm[v]);
                cm_free(nm);
                if (staged) stage_free(d);
                return cm_set_error(CM_ERR_OOM, "cm_dist: no memory on %s for the f32 masters of unit '%s' (%zu "
                                                "bytes): %s",
                                    cm_device_name(dev), cm_module_unit(root, u)->name, bytes, msg);
            }
        }
        for (int u = 0; u < d->n_units; u++) {
            cmi_dev_free(d->mdev, d->master[u]);
            d->master[u] = nm[u];
        }
        cm_free(nm);
    }
    if (!staged) stage_free(d);
    take_ranges(d);
    if (d->mp_buffers) take_buffers(d);
    d->mdev = dev;
    return CM_OK;
}

/* The tape reads t: a buffer under a bf16 buffer_dtype is rounded (its last update may not be
 * yet); a unit holding f32 values under a bf16 param_dtype (NO_SHARD, SHARD_GRAD_OP) is rounded
 * in place, NO_SHARD keeping the masters aside. */
static cm_status mp_fetch(cm_dist *d, const cm_tensor *t) {
    cm_status s = relayout(d);
    if (s) return s;
    const char *p = cm_tensor_data(t);
    for (int i = 0; i < d->n_bufs; i++)
        if (p >= (const char *)d->bufs[i] && p < (const char *)(d->bufs[i] + d->buf_n[i]))
            return round_bf16_on(d, d->bufs[i], d->buf_n[i]);
    if (d->full || !d->mp_params) return CM_OK;
    const int u = unit_of(d, p);
    if (u < 0 || !d->hi[u]) return CM_OK;
    const cm_unit_info *ui = cm_module_unit(cm_model_module(d->model), u);
    if (!d->sharded) {
        if (!d->link)
            return cm_set_error(CM_ERR_STATE, "mixed_precision param_dtype bf16 under NO_SHARD needs cm_dist_attach: "
                                              "the trainer's events say when a pass ends and the f32 masters go back "
                                              "into the model");
        s = cmi_dev_memcpy(d->master[u], d->mdev, ui->params, d->mdev, sizeof(float) * (size_t)ui->numel);
        if (s) return s;
    }
    if ((s = round_bf16_on(d, ui->params, ui->numel))) return s;
    d->hi[u] = false;
    return CM_OK;
}

/* cpu_offload: backward reaches unit u: its gradient range is mapped and zeroed (it accumulates). */
static cm_status offload_grad_map(cm_dist *d, int u) {
    if (d->gmapped[u]) return CM_OK;
    float *g = cm_module_unit(cm_model_module(d->model), u)->grads;
    cm_status s = d->be->vm_map(g);
    if (!s) s = d->be->memset(g, 0, sizeof(float) * (size_t)d->chunk[u]);
    if (s) {
        d->be->vm_unmap(g);
        return s;
    }
    d->gmapped[u] = true;
    return CM_OK;
}

static cm_status fetch_hook(cm_tape *tp, const cm_tensor *t, void *data) {
    cm_dist *d = data;
    cm_status s = d->n_pending ? prefetch_progress(d) : CM_OK;
    if (s) return s;
    if ((d->mp_params || d->mp_buffers) && (s = mp_fetch(d, t))) return s;
    if (!d->full) return CM_OK;
    const int u = unit_of(d, cm_tensor_data(t));
    if (u < 0) return CM_OK;
    const double t0 = cm_clock_s();
    s = d->prefetch ? fetch_prefetching(d, tp, u) : gather(d, u, false);
    if (!s && d->offload && (tp->in_backward || tp->replaying)) s = offload_grad_map(d, u);
    d->stats.gather_s += cm_clock_s() - t0;
    if (s) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "%s the parameters of unit '%s' failed: %s",
                            d->offload ? "cpu_offload: uploading" : "FULL_SHARD: gathering",
                            cm_module_unit(cm_model_module(d->model), u)->name, msg);
    }
    return CM_OK;
}

cm_status cm_dist_gather_params(cm_dist *d) {
    if (!d) return cm_set_error(CM_ERR_INVALID_ARG, "cm_dist_gather_params: NULL");
    if (!d->full) {
        if (!d->mp_params) return CM_OK;
        if (!d->sharded) {
            cm_status s = relayout(d);
            return s ? s : mp_restore(d);
        }
        /* SHARD_GRAD_OP under a bf16 param_dtype: the buffers hold the rounded values; the f32
         * masters from every rank's chunk (the fetch hook rounds them again for the tape) */
        cm_module *root = cm_model_module(d->model);
        cm_status s = CM_OK;
        for (int u = 0; u < d->n_units && !s; u++) {
            s = cm_comm_iall_gather(d->scomm, d->pshard[u], cm_module_unit(root, u)->params, d->chunk[u], CM_COMM_F32,
                                    &d->req[u]);
            if (!s) d->stats.gather_bytes += (double)(d->chunk[u] * d->world) * 4.0;
        }
        for (int u = 0; u < d->n_units; u++) {
            if (!d->req[u]) continue;
            cm_status w = cm_comm_wait(d->scomm, d->req[u]);
            d->req[u] = NULL;
            if (!s) s = w;
            d->hi[u] = true;
        }
        return s;
    }
    const int keep = d->max_resident;
    d->max_resident = d->n_units + 1;
    cm_status s = CM_OK;
    for (int u = 0; u < d->n_units && !s; u++) s = gather(d, u, true);
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
    if (c.cpu_offload && cm_comm_size(comm) > 1)
        return cm_set_error(CM_ERR_UNSUPPORTED, "cm_dist_new: cpu_offload on %d ranks is not built (offloading "
                                                "streams one GPU's units from host memory on one process): train one "
                                                "process with cpu_offload, or several ranks with NO_SHARD on GPUs",
                            cm_comm_size(comm));
    if (c.cpu_offload) c.sharding = CM_SHARDING_FULL_SHARD; /* one rank: the shard is the whole unit, at home on the host */
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
    if ((unsigned)c.backward_prefetch >= CM_BACKWARD_PREFETCH_COUNT)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_dist_new: backward_prefetch %d is not a cm_backward_prefetch",
                            (int)c.backward_prefetch);
    cm_status mps = check_mixed_precision(&c.mixed_precision);
    if (mps) return mps;
    cm_module *root = cm_model_module(model);
    if (!root || !cm_module_is_finalized(root))
        return cm_set_error(CM_ERR_STATE, "cm_dist_new: the model's module tree is not finalized (call "
                                          "cm_module_finalize first: its wrap units are the gradient buckets)");
    if (cm_module_device(root) != CM_DEVICE_CPU && !c.cpu_offload && c.sharding != CM_SHARDING_NO_SHARD)
        return cm_set_error(CM_ERR_UNSUPPORTED, "cm_dist_new: %s over %d rank(s) with the model on %s is not built (the "
                                                "shards live in host memory): use NO_SHARD (on one rank, cpu_offload "
                                                "keeps the model in host memory)",
                            cm_sharding_name(c.sharding), cm_comm_size(comm), cm_device_name(cm_module_device(root)));
    cm_dist *d = cm_alloc_zeroed(sizeof *d, 16);
    if (!d) return cm_set_error(CM_ERR_OOM, "cm_dist_new: out of memory");
    d->comm = comm, d->model = model, d->cfg = c;
    d->rank = cm_comm_rank(comm), d->world = cm_comm_size(comm);
    d->sharded = c.sharding != CM_SHARDING_NO_SHARD;
    d->full = full;
    d->offload = c.cpu_offload;
    d->mdev = cm_module_device(root);
    d->scomm = comm;
    d->max_resident = c.max_resident_units;
    d->mp_params = c.mixed_precision.param_dtype == CM_DTYPE_BF16;
    d->mp_reduce = c.mixed_precision.reduce_dtype == CM_DTYPE_BF16;
    d->mp_buffers = c.mixed_precision.buffer_dtype == CM_DTYPE_BF16;
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
    bool mp_ok = true;
    if (d->mp_params) {
        mp_ok = (d->hi = cm_alloc_zeroed(n * sizeof *d->hi, 16)) != NULL;
        if (mp_ok && d->sharded) mp_ok = (d->gstage = cm_alloc_zeroed(n * sizeof *d->gstage, 16)) != NULL;
        if (mp_ok && !d->sharded) mp_ok = (d->master = cm_alloc_zeroed(n * sizeof *d->master, 16)) != NULL;
        for (int u = 0; mp_ok && d->master && u < d->n_units; u++)
            mp_ok = (d->master[u] = cmi_dev_alloc(d->mdev, sizeof(float) * (size_t)(cm_module_unit(root, u)->numel + 1),
                                                  false)) != NULL;
    }
    if (mp_ok && d->mp_reduce)
        mp_ok = (d->rsend = cm_alloc_zeroed(n * sizeof *d->rsend, 16)) && (d->rrecv = cm_alloc_zeroed(n * sizeof *d->rrecv, 16));
    if (mp_ok && d->mp_buffers) {
        const int64_t nb = cm_module_n_buffers(root);
        d->bufs = cm_alloc_zeroed(sizeof *d->bufs * (size_t)(nb > 0 ? nb : 1), 16);
        d->buf_n = cm_alloc_zeroed(sizeof *d->buf_n * (size_t)(nb > 0 ? nb : 1), 16);
        mp_ok = d->bufs && d->buf_n;
    }
    if (!d->req || !d->unit_last || !d->ranges || !d->ospans || !mp_ok) {
        cm_dist_free(d);
        return cm_set_error(CM_ERR_OOM, "cm_dist_new: out of memory for %d units", d->n_units);
    }
    cm_status s = d->offload ? offload_setup(d) : d->sharded ? shard_setup(d) : CM_OK;
    if (!s && d->full) s = prefetch_setup(d);
    d->prefetch = d->full && (c.forward_prefetch || c.backward_prefetch != CM_BACKWARD_PREFETCH_NONE);
    if (s) {
        cm_dist_free(d);
        return s;
    }
    take_ranges(d);
    if (d->mp_buffers) take_buffers(d);
    d->mdev = cm_module_device(root); /* (cpu_offload: where its setup left the model) */
    if (!d->offload && d->mdev != CM_DEVICE_CPU && cm_comm_size(comm) > 1 && (s = stage_setup(d, d->mdev))) {
        cm_dist_free(d);
        return s;
    }
    s = c.sync_module_states && cm_comm_size(comm) > 1 ? broadcast_states(d) : CM_OK;
    if (s) {
        cm_dist_free(d);
        return s;
    }
    if (d->full && !d->offload) shard_take(d);
    if (d->mp_params && !d->full) {
        for (int u = 0; u < d->n_units; u++) {
            const cm_unit_info *ui = cm_module_unit(root, u);
            if (!d->sharded) { /* NO_SHARD: the buffers hold the masters at rest */
                d->hi[u] = true;
                continue;
            }
            /* SHARD_GRAD_OP: this rank's masters into their chunk, the buffers rounded (every rank
             * holds rank 0's values: what a bf16 gather would give) */
            const cm_shard_span *sp = &d->spans[u];
            memcpy(d->pshard[u], ui->params + sp->begin, sizeof(float) * (size_t)(sp->end - sp->begin));
            round_bf16(ui->params, ui->numel);
        }
    }
    if (d->mp_buffers && (s = round_buffers(d))) {
        cm_dist_free(d);
        return s;
    }
    d->ready = true;
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

/* The all-reduce of a unit's gradient (f32, or a bf16 copy under a bf16 reduce_dtype), in place
 * in g (host memory), started. */
static cm_status start_all_reduce(cm_dist *d, int u, float *g, int64_t n) {
    if (!d->mp_reduce) return cm_comm_iall_reduce(d->comm, g, n, CM_COMM_F32, CM_REDUCE_SUM, &d->req[u]);
    if (!(d->rsend[u] = cm_alloc(sizeof(uint16_t) * (size_t)(n > 0 ? n : 1), 64)))
        return cm_set_error(CM_ERR_OOM, "cm_dist: out of memory for the bf16 gradient of unit '%s'",
                            cm_module_unit(cm_model_module(d->model), u)->name);
    cmi_bf16_round(d->rsend[u], g, n);
    return cm_comm_iall_reduce(d->comm, d->rsend[u], n, CM_COMM_BF16, CM_REDUCE_SUM, &d->req[u]);
}

static cm_status start_next(cm_dist *d) {
    const int u = d->n_units - 1 - d->next;
    const cm_unit_info *ui = cm_module_unit(cm_model_module(d->model), u);
    cm_status s;
    const int64_t n = d->sharded ? d->chunk[u] * d->world : ui->numel;
    if (d->offload) { /* a gradient backward never reached is zero: nothing to add */
        /* a bf16 reduce_dtype: the reduction over one rank is the rounding, on the device before
         * the download (each microbatch's, as FULL_SHARD reduces each one) */
        s = d->gmapped[u] && d->mp_reduce ? round_bf16_on(d, ui->grads, d->chunk[u]) : CM_OK;
        if (!s && d->gmapped[u])
            s = d->be->copy_start(d->grecv[u], ui->grads, sizeof(float) * (size_t)d->chunk[u], CMI_D2H, &d->downev[u]);
    } else if (d->stage) { /* several ranks on GPUs: downloaded first, reduced in stage_progress */
        s = d->be->copy_start(d->stage[u], ui->grads, sizeof(float) * (size_t)n, CMI_D2H, &d->downev[u]);
        if (!s) d->sstate[u] = STAGE_DOWNLOADING;
    } else if (d->mp_reduce && d->mdev != CM_DEVICE_CPU) {
        /* one rank on a GPU: the reduction over one rank is the rounding */
        s = round_bf16_on(d, ui->grads, n);
    } else if (d->mp_reduce && d->sharded) { /* a bf16 copy, reduced as bf16 and widened back in finish_reduce */
        d->rsend[u] = cm_alloc(sizeof(uint16_t) * (size_t)(n > 0 ? n : 1), 64);
        d->rrecv[u] = cm_alloc(sizeof(uint16_t) * (size_t)(d->chunk[u] > 0 ? d->chunk[u] : 1), 64);
        if (!d->rsend[u] || !d->rrecv[u])
            return cm_set_error(CM_ERR_OOM, "cm_dist: out of memory for the bf16 gradient of unit '%s'", ui->name);
        cmi_bf16_round(d->rsend[u], ui->grads, n);
        s = cm_comm_ireduce_scatter(d->scomm, d->rsend[u], d->rrecv[u], d->chunk[u], CM_COMM_BF16, CM_REDUCE_SUM,
                                    &d->req[u]);
    } else if (d->sharded) { /* the padded gradient (W·chunk, tail zero) into this rank's chunk */
        s = cm_comm_ireduce_scatter(d->scomm, ui->grads, d->full ? d->grecv[u] : d->gshard[u], d->chunk[u],
                                    CM_COMM_F32, CM_REDUCE_SUM, &d->req[u]);
    } else {
        s = start_all_reduce(d, u, ui->grads, ui->numel);
    }
    if (s) return s;
    d->next++;
    d->stats.bytes += (double)n * (d->mp_reduce ? 2.0 : 4.0);
    return CM_OK;
}

/* Several ranks on GPUs: each finished download (waited for when `block`) becomes its unit's
 * all-reduce of the stage, in the order the downloads started — the first unfinished one stops
 * the walk, so every rank starts the same collectives in the same order. */
static cm_status stage_progress(cm_dist *d, bool block) {
    const cm_module *root = cm_model_module(d->model);
    for (int k = 0; k < d->next; k++) {
        const int u = d->n_units - 1 - k;
        if (d->sstate[u] != STAGE_DOWNLOADING) continue;
        bool done = block;
        cm_status s = block ? CM_OK : d->be->copy_test(d->downev[u], &done);
        if (s) return s;
        if (!done) return CM_OK;
        s = d->be->copy_wait(d->downev[u]);
        d->downev[u] = NULL;
        d->sstate[u] = STAGE_REDUCING;
        if (!s) s = start_all_reduce(d, u, d->stage[u], cm_module_unit(root, u)->numel);
        if (s) return s;
    }
    return CM_OK;
}

/* After the wait: a bf16 reduction's result widened where the f32 one would have gone. */
static void finish_reduce(cm_dist *d, int u, bool ok) {
    if (!d->rsend || !d->rsend[u]) return;
    const cm_unit_info *ui = cm_module_unit(cm_model_module(d->model), u);
    if (ok && d->sharded) cmi_bf16_widen(d->full ? d->grecv[u] : d->gshard[u], d->rrecv[u], d->chunk[u]);
    else if (ok) cmi_bf16_widen(d->stage ? d->stage[u] : ui->grads, d->rsend[u], ui->numel);
    cm_free(d->rsend[u]);
    cm_free(d->rrecv[u]);
    d->rsend[u] = d->rrecv[u] = NULL;
}

/* Pokes the requests in flight: MPI progresses non-blocking collectives only inside MPI calls. */
static cm_status grad_done(cm_dist *d, int u);

static cm_status progress(cm_dist *d) {
    if (d->stage) {
        cm_status s = stage_progress(d, false);
        if (s) return s;
    }
    for (int k = 0; d->offload && k < d->next; k++) {
        const int u = d->n_units - 1 - k;
        bool done = false;
        cm_status s = d->downev[u] ? d->be->copy_test(d->downev[u], &done) : CM_OK;
        if (!s && done) s = grad_done(d, u);
        if (s) return s;
    }
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
    if (d->full && d->cfg.backward_prefetch == CM_BACKWARD_PREFETCH_POST && !d->hook_status) prefetch_post(d, tp, node);
    if (d->hook_status || !d->cfg.overlap || (cm_comm_size(d->comm) < 2 && !d->offload)) return;
    const double t0 = cm_clock_s();
    if (!node) {
        /* the model may have moved to a GPU since cm_dist_new (the trainer moves it): the unit
         * ranges and the gradient stages follow before any bucket starts */
        cm_status s = relayout(d);
        /* FULL_SHARD reduce-scatters every microbatch: finish the previous one's before this
         * backward writes gradients again */
        if (!s && d->full && d->next) s = flush(d);
        if (s) {
            hook_fail(d, s);
            return;
        }
        /* a new backward: is it the last microbatch's (or any, under FULL_SHARD)? then find when
         * each unit becomes final */
        d->armed = d->st && d->next == 0 && !cm_state_microbatch_auto(d->st) &&
                   (d->full || cm_state_microbatch_index(d->st) == cm_state_n_microbatches(d->st) - 1);
        if (!d->armed) return;
        unit_final_index(d, tp, d->unit_last);
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

/* cpu_offload: unit u's gradient download is done (or waited for here): the chunk goes into the
 * host gradient shard and the GPU range is released. */
static cm_status grad_done(cm_dist *d, int u) {
    cm_status s = d->downev[u] ? d->be->copy_wait(d->downev[u]) : CM_OK;
    const bool had = d->downev[u] != NULL;
    d->downev[u] = NULL;
    if (s) return s;
    if (had) {
        float *g = d->gshard[u];
        const float *r = d->grecv[u];
        for (int64_t i = 0; i < d->chunk[u]; i++) g[i] += r[i];
    }
    if (d->gmapped[u]) d->be->vm_unmap(cm_module_unit(cm_model_module(d->model), u)->grads);
    d->gmapped[u] = false;
    return CM_OK;
}

/* Starts the buckets backward has not started, waits for all of them and, under FULL_SHARD, adds
 * the received chunks into the gradient shards and releases the full gradient pages. */
static cm_status flush(cm_dist *d) {
    cm_status s = CM_OK;
    if (d->offload) {
        while (!s && d->next < d->n_units) {
            s = start_next(d);
            if (!s) d->stats.n_buckets_late++;
        }
        for (int u = d->n_units - 1; u >= 0; u--) {
            if (!d->downev[u]) continue;
            cm_status w = grad_done(d, u);
            if (!s) s = w;
        }
        d->next = 0;
        return s;
    }
    /* one rank under a bf16 reduce_dtype too: the reduction over one rank is the rounding */
    if (cm_comm_size(d->comm) > 1 || d->sharded || d->mp_reduce) {
        while (!s && d->next < d->n_units) {
            s = start_next(d);
            if (!s) d->stats.n_buckets_late++;
        }
        if (!s && d->stage) s = stage_progress(d, true);
        for (int u = d->n_units - 1; u >= 0; u--) {
            if (!d->req[u]) continue;
            cm_status w = cm_comm_wait(d->sharded ? d->scomm : d->comm, d->req[u]);
            d->req[u] = NULL;
            if (!s) s = w;
        }
        for (int u = 0; d->mp_reduce && u < d->n_units; u++) finish_reduce(d, u, !s);
        /* several ranks on GPUs: the reduced stages back into the gradients */
        for (int u = 0; d->stage && u < d->n_units; u++) {
            if (d->downev[u]) { /* a failure left it in flight */
                (void)d->be->copy_wait(d->downev[u]);
                d->downev[u] = NULL;
            }
            if (!s && d->sstate[u] == STAGE_REDUCING)
                s = d->be->memcpy(cm_module_unit(cm_model_module(d->model), u)->grads, d->stage[u],
                                  sizeof(float) * (size_t)cm_module_unit(cm_model_module(d->model), u)->numel, CMI_H2D);
            d->sstate[u] = STAGE_IDLE;
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
        if (d->mp_reduce) { /* a bf16 copy of the chunk, widened back below */
            if (!(d->rsend[u] = cm_alloc(sizeof(uint16_t) * (size_t)(d->chunk[u] > 0 ? d->chunk[u] : 1), 64))) {
                s = cm_set_error(CM_ERR_OOM, "cm_dist: out of memory for a bf16 gradient chunk");
                break;
            }
            cmi_bf16_round(d->rsend[u], d->gshard[u], d->chunk[u]);
            s = cm_comm_iall_reduce(d->rcomm, d->rsend[u], d->chunk[u], CM_COMM_BF16, CM_REDUCE_SUM, &d->req[u]);
        } else {
            s = cm_comm_iall_reduce(d->rcomm, d->gshard[u], d->chunk[u], CM_COMM_F32, CM_REDUCE_SUM, &d->req[u]);
        }
        if (!s) d->stats.bytes += (double)d->chunk[u] * (d->mp_reduce ? 2.0 : 4.0);
    }
    for (int u = d->n_units - 1; u >= 0; u--) {
        if (!d->req[u]) continue;
        cm_status w = cm_comm_wait(d->rcomm, d->req[u]);
        d->req[u] = NULL;
        if (!s) s = w;
    }
    for (int u = 0; d->mp_reduce && u < d->n_units; u++) {
        if (!d->rsend[u]) continue;
        if (!s) cmi_bf16_widen(d->gshard[u], d->rsend[u], d->chunk[u]);
        cm_free(d->rsend[u]);
        d->rsend[u] = NULL;
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
    cm_status s = relayout(d);
    if (!s) s = mp_restore(d); /* NO_SHARD: the optimizer steps the masters */
    /* the last microbatch's updates, as a bf16 buffer holds them */
    if (!s && d->mp_buffers) s = round_buffers(d);
    if (!s) s = flush(d);
    /* cpu_offload: no upload may still read a master copy the host optimizer is about to write
     * (the prefetched ones, and blocking ones queued on the compute stream) */
    if (!s && d->offload && d->n_pending) s = prefetch_drain(d);
    if (!s && d->offload) s = d->be->sync();
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
        if (d->offload) {
            if (d->gmapped[u]) d->be->vm_unmap(cm_module_unit(root, u)->grads);
            d->gmapped[u] = false;
        } else if (d->pbytes[u]) madvise(cm_module_unit(root, u)->grads, d->pbytes[u], MADV_DONTNEED);
    }
    cmn_relink_grads(root);
    return CM_OK;
}

cm_status cm_dist_sync_params(cm_dist *d) {
    if (!d) return cm_set_error(CM_ERR_INVALID_ARG, "cm_dist_sync_params: NULL");
    if (!d->sharded) return CM_OK;
    if (d->full) { /* the chunks changed: every gathered buffer is stale */
        cm_status s = prefetch_drain(d); /* prefetched units no pass read: finished, then released */
        release_all(d);
        d->phase = -1; /* the next fetch starts a new pass */
        return s;
    }
    cm_module *root = cm_model_module(d->model);
    cm_status s = CM_OK;
    /* every unit's gather in flight at once, then wait for all (in place: this rank's chunk of the
     * padded buffer is where it is received; under a bf16 param_dtype, of a bf16 stage) */
    for (int u = 0; u < d->n_units && !s; u++) {
        float *p = cm_module_unit(root, u)->params;
        if (d->mp_params) {
            s = start_gather_bf16(d, u, &d->gstage[u], &d->req[u]);
        } else {
            s = cm_comm_iall_gather(d->scomm, p + (int64_t)d->rank * d->chunk[u], p, d->chunk[u], CM_COMM_F32, &d->req[u]);
            if (!s) d->stats.gather_bytes += (double)(d->chunk[u] * d->world) * 4.0;
        }
    }
    for (int u = 0; u < d->n_units; u++) {
        if (!d->req[u]) continue;
        cm_status w = cm_comm_wait(d->scomm, d->req[u]);
        d->req[u] = NULL;
        if (!s) s = w;
    }
    for (int u = 0; d->mp_params && u < d->n_units; u++) {
        if (!d->gstage[u]) continue;
        if (!s) finish_gather_bf16(d, u, &d->gstage[u]);
        cm_free(d->gstage[u]);
        d->gstage[u] = NULL;
        d->hi[u] = false;
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
/* NO_SHARD under a bf16 param_dtype: a pass that did not end in sync_grads (an evaluation, a
 * prediction) has ended at these events: the masters go back into the model. */
static cm_status link_run_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    tape_link *l = self;
    if (l->d && (ev == CM_EVENT_EVAL_END || ev == CM_EVENT_PREDICT_END || ev == CM_EVENT_BATCH_END ||
                 ev == CM_EVENT_FIT_END))
        return mp_restore(l->d);
    return CM_OK;
}
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
    cfg->dist.fetch = d->full || d->mp_params || d->mp_buffers ? fetch_hook : NULL;
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
