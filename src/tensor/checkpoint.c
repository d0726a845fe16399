/* Activation checkpointing on the tape: a region's forward keeps only its output, and one node
 * whose backward replays the region (its forward again, recorded, then backward through it).
 *
 * Forward. The region runs as any code on the tape — gradients on, its nodes recorded — but into a
 * chain of its own, starting after an arena mark. Its output is copied aside, the arenas are
 * rewound to the mark (every activation of the region is gone), the output is copied back into a
 * fresh tensor, and one node is recorded for it. Running the region exactly as it runs without
 * checkpointing (not with gradients off) makes the output the same bits, whatever an op does
 * differently when it records. The node's inputs are the region's inputs and every tensor from
 * outside the region its ops read that wants a gradient (parameters included), so backward
 * fetches them (FULL_SHARD gathers the unit) and the distributed layer sees when a unit's
 * gradient is final. The generators the region drew from are noted with their states before the
 * first draw (cmi_rng_note), and the tape's row context and autocast are kept.
 *
 * Backward. The generators are set back to the noted states, the row context and autocast
 * restored, and the region runs again with gradients on into a chain of its own, allocating from
 * the tape's replay arenas; its output takes the checkpoint node's upstream gradient, and the
 * chain runs backward (without the backward hook: the tape's own chain has the checkpoint node).
 * Gradients of tensors from outside the region go to the main arenas (tape.c's outer_grad_begin);
 * everything else the replay made is dropped by resetting the replay arenas. The generators are
 * then set to the states they had after the forward. Batch norm leaves its running statistics
 * alone during a replay (cm_tape_replaying), so they are updated once, as without checkpointing. */
#include "tensor/backend.h"
#include "tensor/tensor_impl.h"

typedef struct ckpt_ctx {
    cm_tape_region_fn fn;
    void *data;
    int n_in;
    cm_tensor **in; /* the region's inputs as given (NULL entries kept) */
    int n_rng;
    struct cmi_rng_note *rngs;
    int64_t row_first, row_n, row_total;
    cm_dtype autocast;
} ckpt_ctx;

void cmi_rng_note(cm_tape *tp, cm_rng *rng) {
    if (!tp || tp->ckpt_depth == 0 || tp->replaying || !rng) return;
    for (int i = 0; i < tp->n_notes; i++)
        if (tp->notes[i].rng == rng) return;
    if (tp->n_notes == tp->cap_notes) {
        const int cap = tp->cap_notes ? 2 * tp->cap_notes : 16;
        struct cmi_rng_note *nn = cm_alloc(sizeof *nn * (size_t)cap, 16);
        if (!nn) {
            cmi_fail(tp, CM_ERR_OOM, "checkpoint: out of memory noting a generator");
            return;
        }
        if (tp->n_notes) memcpy(nn, tp->notes, sizeof *nn * (size_t)tp->n_notes);
        cm_free(tp->notes);
        tp->notes = nn;
        tp->cap_notes = cap;
    }
    tp->notes[tp->n_notes++] = (struct cmi_rng_note){rng, *rng};
}

bool cm_tape_replaying(const cm_tape *tp) { return tp && tp->replaying; }
int64_t cm_tape_n_checkpoints(const cm_tape *tp) { return tp ? tp->n_ckpt : 0; }

size_t cm_tape_peak_bytes(const cm_tape *tp) {
    if (!tp) return 0;
    const size_t main = cm_arena_peak(tp->replaying ? tp->alt_arena : tp->arena);
    return main > tp->ckpt_peak ? main : tp->ckpt_peak;
}

size_t cm_tape_budget(const cm_tape *tp, cm_device dev) {
    if (!tp) return 0;
    return dev == CM_DEVICE_CPU ? cm_arena_budget(tp->arena) : tp->dev_budget;
}

void cm_tape_set_budget(cm_tape *tp, cm_device dev, size_t bytes) {
    if (!tp) return;
    if (dev == CM_DEVICE_CPU) {
        cm_arena_set_budget(tp->arena, bytes);
        return;
    }
    tp->dev_budget = bytes;
    if (tp->dev_arena) cm_arena_set_budget(tp->dev_arena, bytes);
}

void cm_tape_reset_peak(cm_tape *tp) {
    if (!tp) return;
    cm_arena_reset_peak(tp->replaying ? tp->alt_arena : tp->arena);
    tp->ckpt_peak = 0;
}

static bool add_outer(cm_tape *tp, cm_tensor *t) {
    for (int i = 0; i < tp->n_outer; i++)
        if (tp->outer[i] == t) return true;
    if (tp->n_outer == tp->cap_outer) {
        const int cap = tp->cap_outer ? 2 * tp->cap_outer : 64;
        cm_tensor **no = cm_alloc(sizeof *no * (size_t)cap, 16);
        if (!no) return false;
        if (tp->n_outer) memcpy(no, tp->outer, sizeof *no * (size_t)tp->n_outer);
        cm_free(tp->outer);
        tp->outer = no;
        tp->cap_outer = cap;
    }
    tp->outer[tp->n_outer++] = t;
    return true;
}

/* The tensors from outside the region that the region's nodes read and that want a gradient. */
static bool collect_outer(cm_tape *tp, const cm_node *sub) {
    tp->n_outer = 0;
    for (const cm_node *n = sub; n; n = n->prev)
        for (int j = 0; j < n->n_in; j++) {
            cm_tensor *t = n->in[j];
            if (!t || !(t->flags & CM_TF_REQUIRES_GRAD) || (t->node && t->node->inner)) continue;
            if (!add_outer(tp, t)) return false;
        }
    return true;
}

/* Copies src (any strides) into the contiguous block `dst` of src's dtype, shape and device. */
static cm_status copy_into(void *dst, const cm_tensor *src) {
    cm_tensor d = *src;
    d.data = dst;
    d.flags = 0;
    d.grad = NULL;
    d.node = NULL;
    cmi_contig_strides(src->ndim, src->shape, d.stride);
    if (src->device == CM_DEVICE_CPU && cmi_is_contig(src)) {
        cmi_parallel_memcpy(dst, src->data, cm_tensor_nbytes(src));
        return CM_OK;
    }
    return cmi_copy_any(&d, src, src->stride);
}

static cm_status ckpt_backward(cm_tape *tp, cm_node *n, const cm_tensor *gout);

/* The nodes recorded since `saved_last` back on the tape's chain, as if recorded without a region. */
static void splice(cm_tape *tp, cm_node *sub, cm_node *saved_last) {
    if (!sub) {
        tp->last = saved_last;
        return;
    }
    cm_node *first = sub;
    for (cm_node *n = sub; n; n = n->prev) {
        n->inner = false;
        first = n;
    }
    first->prev = saved_last;
    tp->last = sub;
}

cm_tensor *cm_tape_checkpoint(cm_tape *tp, cm_tape_region_fn fn, void *data, int n_in, cm_tensor *const *in) {
    if (!tp) {
        cm_set_error(CM_ERR_INVALID_ARG, "checkpoint: tape is NULL");
        return NULL;
    }
    if (tp->status) return NULL;
    if (!fn || n_in < 0 || (n_in > 0 && !in)) {
        cmi_fail(tp, CM_ERR_INVALID_ARG, "checkpoint: %s", !fn ? "fn is NULL" : "n_in < 0 or in is NULL");
        return NULL;
    }
    /* Nothing to save without a graph; a region inside a region runs as part of the outer one. */
    if (!tp->grad_enabled || tp->ckpt_depth > 0) return fn(tp, n_in, in, data);

    cm_arena *host = tp->arena;
    const size_t mark = cm_arena_mark(host);
    cm_arena *dev_a = tp->dev_arena;
    const size_t dev_mark = dev_a ? cm_arena_mark(dev_a) : 0;
    cm_node *saved_last = tp->last;
    const int64_t saved_n = tp->n_nodes;
    tp->last = NULL;
    tp->n_notes = 0;
    tp->ckpt_depth++;
    cm_tensor *y = fn(tp, n_in, in, data);
    tp->ckpt_depth--;
    cm_node *sub = tp->last;
    if (!y || tp->status) {
        splice(tp, sub, saved_last);
        if (!y && !tp->status)
            cmi_fail(tp, CM_ERR_INTERNAL, "checkpoint: the region returned NULL without recording an error");
        return NULL;
    }
    /* An output that no node of the region made (an input returned as is, a region with no
     * gradient path): nothing to recompute — keep what was recorded, as if not checkpointed. */
    if (!(y->flags & CM_TF_REQUIRES_GRAD) || !y->node || !y->node->inner) {
        splice(tp, sub, saved_last);
        return y;
    }
    if (!collect_outer(tp, sub)) {
        splice(tp, sub, saved_last);
        cmi_fail(tp, CM_ERR_OOM, "checkpoint: out of memory listing the region's inputs");
        return NULL;
    }
    const bool bf16_gout = y->node->bf16_gout;
    /* y aside, rewind, y back */
    const size_t bytes = cm_tensor_nbytes(y);
    void *tmp = cmi_gpool_take(tp, bytes ? bytes : 1, y->device);
    if (!tmp) {
        splice(tp, sub, saved_last);
        cmi_fail(tp, CM_ERR_OOM, "checkpoint: out of memory for the region's output %s (%zu bytes)", cmi_shape(y), bytes);
        return NULL;
    }
    cm_status s = copy_into(tmp, y);
    if (s) {
        cmi_gpool_give(tp, tmp);
        splice(tp, sub, saved_last);
        cmi_dev_fail(tp, s, "checkpoint");
        return NULL;
    }
    const cm_dtype dt = y->dtype;
    const cm_device dev = y->device;
    const int ndim = y->ndim;
    int64_t shape[CM_MAX_DIMS];
    memcpy(shape, y->shape, sizeof shape);
    cm_arena_rewind(host, mark);
    if (tp->dev_arena) cm_arena_rewind(tp->dev_arena, dev_a ? dev_mark : 0); /* made in the region: all of it */
    tp->last = saved_last;
    tp->n_nodes = saved_n;
    const cm_device prev_dev = tp->dev;
    tp->dev = dev;
    cm_tensor *out = cmi_new(tp, dt, ndim, shape);
    tp->dev = prev_dev;
    if (out) {
        const cmi_backend *be = cmi_backend_get(dev);
        s = be ? be->memcpy(out->data, tmp, bytes, CMI_D2D) : CM_OK;
        if (!be) cmi_parallel_memcpy(out->data, tmp, bytes);
    }
    cmi_gpool_give(tp, tmp);
    if (!out || cmi_dev_fail(tp, s, "checkpoint")) return NULL;

    /* the node: the non-NULL inputs, then the outside tensors the region reads */
    int n_node = 0;
    for (int i = 0; i < n_in; i++) n_node += in[i] != NULL;
    const int n_outer = tp->n_outer;
    cm_tensor **node_in = cmi_scratch(tp, sizeof(cm_tensor *) * (size_t)(n_node + n_outer + 1));
    ckpt_ctx *c = cmi_scratch(tp, sizeof *c);
    cm_tensor **keep = cmi_scratch(tp, sizeof(cm_tensor *) * (size_t)(n_in + 1));
    struct cmi_rng_note *rngs = cmi_scratch(tp, sizeof *rngs * (size_t)(tp->n_notes + 1));
    if (!node_in || !c || !keep || !rngs) return NULL;
    int k = 0;
    for (int i = 0; i < n_in; i++)
        if (in[i]) node_in[k++] = in[i];
    for (int i = 0; i < n_outer; i++) {
        bool dup = false;
        for (int j = 0; j < n_node && !dup; j++) dup = node_in[j] == tp->outer[i];
        if (!dup) node_in[k++] = tp->outer[i];
    }
    if (n_in) memcpy(keep, in, sizeof(cm_tensor *) * (size_t)n_in);
    if (tp->n_notes) memcpy(rngs, tp->notes, sizeof *rngs * (size_t)tp->n_notes);
    *c = (ckpt_ctx){fn, data, n_in, keep, tp->n_notes, rngs, tp->row_first, tp->row_n, tp->row_total, tp->autocast};
    cm_node *nd = cmi_record(tp, "checkpoint", out, k, node_in, ckpt_backward, 0);
    if (!nd) return NULL;
    nd->ctx = c;
    nd->bf16_gout = bf16_gout;
    tp->n_ckpt++;
    return out;
}

/* The replay arenas: made on first use, the host one with what is left of the main budget. */
static bool replay_arenas_begin(cm_tape *tp) {
    if (!tp->alt_arena) {
        if (cm_arena_new(0, &tp->alt_arena) != CM_OK) return false;
        cm_arena_set_poison(tp->alt_arena, tp->poison);
    }
    const size_t budget = cm_arena_budget(tp->arena), used = cm_arena_used(tp->arena);
    cm_arena_set_budget(tp->alt_arena, budget == 0 ? 0 : used < budget ? budget - used : 1);
    cm_arena_reset(tp->alt_arena);
    cm_arena_reset_peak(tp->alt_arena);
    if (tp->alt_dev_arena) cm_arena_reset(tp->alt_dev_arena);
    cmi_swap_arenas(tp);
    return true;
}

static void replay_arenas_end(cm_tape *tp) {
    cmi_swap_arenas(tp);
    /* both arenas at once: what the main one holds (the replay's outer gradients included) and
     * the most the replay held */
    const size_t both = cm_arena_used(tp->arena) + cm_arena_peak(tp->alt_arena);
    if (both > tp->ckpt_peak) tp->ckpt_peak = both;
    cm_arena_reset(tp->alt_arena);
    if (tp->alt_dev_arena) cm_arena_reset(tp->alt_dev_arena);
}

static cm_status ckpt_backward(cm_tape *tp, cm_node *n, const cm_tensor *gout) {
    const ckpt_ctx *c = n->ctx;
    if (tp->replaying) return cmi_fail(tp, CM_ERR_INTERNAL, "checkpoint: a replay inside a replay");
    cm_node *saved_last = tp->last;
    const int64_t saved_n = tp->n_nodes, rf = tp->row_first, rn = tp->row_n, rt = tp->row_total;
    const bool grad = tp->grad_enabled, in_bw = tp->in_backward;
    const cm_dtype ac = tp->autocast;
    cm_rng after[64], *after_p = after;
    if (c->n_rng > 64 && !(after_p = cm_alloc(sizeof(cm_rng) * (size_t)c->n_rng, 16)))
        return cmi_fail(tp, CM_ERR_OOM, "checkpoint: out of memory for %d generators", c->n_rng);
    if (!replay_arenas_begin(tp)) {
        if (after_p != after) cm_free(after_p);
        return cmi_fail(tp, CM_ERR_OOM, "checkpoint: out of memory for the replay arena");
    }
    for (int i = 0; i < c->n_rng; i++) {
        after_p[i] = *c->rngs[i].rng;
        *c->rngs[i].rng = c->rngs[i].before;
    }
    tp->row_first = c->row_first, tp->row_n = c->row_n, tp->row_total = c->row_total;
    tp->autocast = c->autocast;
    tp->last = NULL;
    tp->grad_enabled = true;
    tp->in_backward = false;
    tp->replaying = true;
    tp->ckpt_depth++;
    cm_tensor *y = c->fn(tp, c->n_in, c->in, c->data);
    cm_node *sub = tp->last;
    tp->last = saved_last;
    tp->n_nodes = saved_n;
    tp->grad_enabled = grad; /* off: backward builds no graph */
    tp->in_backward = in_bw;
    tp->autocast = ac;
    tp->row_first = rf, tp->row_n = rn, tp->row_total = rt;
    for (int i = 0; i < c->n_rng; i++) *c->rngs[i].rng = after_p[i];
    if (after_p != after) cm_free(after_p);
    cm_status st = tp->status;
    if (!st && !y) st = cmi_fail(tp, CM_ERR_INTERNAL, "checkpoint: the replayed region returned NULL");
    if (!st && (!y->node || !y->node->inner || y->dtype != n->out->dtype || y->ndim != n->out->ndim ||
                memcmp(y->shape, n->out->shape, sizeof(int64_t) * (size_t)y->ndim) != 0))
        st = cmi_fail(tp, CM_ERR_STATE,
                      "checkpoint: the replayed region gave %s (%s) where its forward gave %s (%s): a checkpointed "
                      "function must compute the same thing when run again",
                      cmi_shape(y), cm_dtype_name(y->dtype), cmi_shape(n->out), cm_dtype_name(n->out->dtype));
    if (!st) {
        /* y takes the node's upstream gradient; it stays the caller's (never given to the pool here) */
        cm_tensor *g = cmi_view(tp, gout->dtype, gout->ndim, gout->shape, gout->stride, gout->data);
        if (!g) {
            st = tp->status;
        } else {
            g->device = gout->device;
            g->flags |= CM_TF_GRAD_ALIAS;
            y->grad = g;
            st = cmi_run_backward(tp, sub, false);
        }
    }
    tp->ckpt_depth--;
    tp->replaying = false;
    replay_arenas_end(tp);
    tp->dev = n->out->device;
    if (st && !tp->status) cmi_fail(tp, st, "checkpoint: replaying the region: %s", cm_last_error());
    return tp->status;
}
