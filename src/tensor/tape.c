/* The autograd tape: arena-backed tensors and nodes, error chaining, backward. */
#include "tensor/backend.h"
#include "tensor/tensor_impl.h"

#include <stdio.h>

cm_tape_config cm_tape_config_default(void) {
    cm_tape_config c = {0};
    return c;
}

cm_status cm_tape_new(const cm_tape_config *cfg, cm_tape **out) {
    *out = NULL;
    cm_tape_config c = cfg ? *cfg : cm_tape_config_default();
    (void)cm_num_threads(); /* applies CM_NUM_THREADS to OpenMP and BLAS before the first kernel */
    cm_tape *tp = cm_alloc_zeroed(sizeof *tp, 16);
    if (!tp) return CM_ERR_OOM;
    cm_status st = cm_arena_new(c.arena_budget, &tp->arena);
    if (st) {
        cm_free(tp);
        return st;
    }
    cm_arena_set_poison(tp->arena, c.poison);
    tp->poison = c.poison;
    tp->dev_budget = c.device_budget;
    tp->retain_grads = c.retain_grads;
    tp->grad_enabled = true;
    tp->autocast = CM_DTYPE_F32;
    *out = tp;
    return CM_OK;
}

static void gblock_free(const struct cmi_gblock *b) {
    if (b->device == CM_DEVICE_CPU) cm_free(b->p);
    else cmi_backend_get(b->device)->free(b->p);
}

void cm_tape_free(cm_tape *tp) {
    if (!tp) return;
    for (int i = 0; i < tp->n_gblocks; i++) gblock_free(&tp->gblocks[i]);
    cm_free(tp->gblocks);
    cmi_aoff_free(tp);
    cm_arena_free(tp->arena);
    cm_arena_free(tp->dev_arena);
    cm_arena_free(tp->alt_arena);
    cm_arena_free(tp->alt_dev_arena);
    cm_free(tp->notes);
    cm_free(tp->outer);
    cm_free(tp);
}

void cm_tape_reset(cm_tape *tp) {
    for (int i = 0; i < tp->n_gblocks; i++) tp->gblocks[i].in_use = false; /* their tensors are gone */
    cmi_aoff_reset(tp);
    cm_arena_reset(tp->arena);
    if (tp->dev_arena) cm_arena_reset(tp->dev_arena);
    if (tp->alt_arena) cm_arena_reset(tp->alt_arena);
    if (tp->alt_dev_arena) cm_arena_reset(tp->alt_dev_arena);
    tp->dev = tp->default_dev;
    tp->last = NULL;
    tp->n_nodes = 0;
    tp->n_ckpt = 0;
    tp->status = CM_OK;
    tp->error[0] = '\0';
}

void cm_tape_trim(cm_tape *tp) {
    if (!tp) return;
    cm_tape_reset(tp);
    cmi_aoff_free(tp);
    for (int i = 0; i < tp->n_gblocks; i++) gblock_free(&tp->gblocks[i]);
    tp->n_gblocks = 0;
    cm_arena_trim(tp->arena);
    cm_arena_trim(tp->dev_arena);
    cm_arena_trim(tp->alt_arena);
    cm_arena_trim(tp->alt_dev_arena);
}

void cm_tape_set_rows(cm_tape *tp, int64_t first, int64_t n, int64_t total) {
    if (!tp) return;
    const bool ok = total > 0 && n > 0 && first >= 0 && first + n <= total;
    tp->row_first = ok ? first : 0;
    tp->row_n = ok ? n : 0;
    tp->row_total = ok ? total : 0;
}

bool cm_tape_rows(const cm_tape *tp, int64_t *first, int64_t *n, int64_t *total) {
    const bool on = tp && tp->row_total > 0;
    if (first) *first = on ? tp->row_first : 0;
    if (n) *n = on ? tp->row_n : 0;
    if (total) *total = on ? tp->row_total : 0;
    return on;
}

void cm_tape_set_fetch_hook(cm_tape *tp, cm_tape_fetch_fn fn, void *data) {
    if (!tp) return;
    tp->fetch = fn;
    tp->fetch_data = fn ? data : NULL;
}

void cm_tape_set_op_hook(cm_tape *tp, cm_tape_op_hook_fn fn, void *data) {
    if (!tp) return;
    tp->op_hook = fn;
    tp->op_hook_data = fn ? data : NULL;
}

void cm_tape_set_backward_hook(cm_tape *tp, cm_tape_backward_hook_fn fn, void *data) {
    if (!tp) return;
    tp->bw_hook = fn;
    tp->bw_hook_data = fn ? data : NULL;
}

bool cm_tape_set_grad_enabled(cm_tape *tp, bool on) {
    bool prev = tp->grad_enabled;
    tp->grad_enabled = on;
    return prev;
}
bool cm_tape_grad_enabled(const cm_tape *tp) { return tp->grad_enabled; }
cm_dtype cm_tape_set_autocast(cm_tape *tp, cm_dtype dt) {
    cm_dtype prev = tp->autocast;
    if (dt == CM_DTYPE_F32 || dt == CM_DTYPE_BF16) tp->autocast = dt;
    return prev;
}
cm_dtype cm_tape_autocast(const cm_tape *tp) { return tp->autocast; }
cm_status cm_tape_status(const cm_tape *tp) { return tp->status; }
const char *cm_tape_error(const cm_tape *tp) { return tp->error; }
cm_arena *cm_tape_arena(cm_tape *tp) { return tp->arena; }
int64_t cm_tape_n_nodes(const cm_tape *tp) { return tp->n_nodes; }

cm_status cmi_failv(cm_tape *tp, cm_status s, const char *fmt, va_list ap) {
    if (tp->status != CM_OK) { /* first error wins; keep it as the thread's last error too */
        cm_set_error(tp->status, "%s", tp->error);
        return tp->status;
    }
    vsnprintf(tp->error, sizeof tp->error, fmt, ap);
    tp->status = s;
    cm_set_error(s, "%s", tp->error);
    return s;
}

cm_status cmi_fail(cm_tape *tp, cm_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cmi_failv(tp, s, fmt, ap);
    va_end(ap);
    return tp->status;
}

cm_status cm_tape_fail(cm_tape *tp, cm_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cmi_failv(tp, s, fmt, ap);
    va_end(ap);
    return tp->status;
}

/* OOM inside the arena: copy the arena's message (in cm_last_error) onto the tape. */
static void fail_oom(cm_tape *tp, const char *what) {
    cmi_fail(tp, CM_ERR_OOM, "%s: %s", what, cm_last_error());
}

/* Every input of an op on the op's device (tp->dev). */
static bool same_device(cm_tape *tp, const char *op, int n, cm_tensor *const *ts) {
    for (int i = 0; i < n; i++) {
        if (!ts[i] || ts[i]->device == tp->dev) continue;
        cmi_fail(tp, CM_ERR_INVALID_ARG,
                 "%s: input %d %s%s%s is on %s but the op runs on %s (the device of its first input): move it with "
                 "cm_to_device",
                 op ? op : "op", i, cmi_shape(ts[i]), ts[i]->name ? " " : "", ts[i]->name ? ts[i]->name : "",
                 cm_device_name(ts[i]->device), cm_device_name(tp->dev));
        return false;
    }
    return true;
}

bool cmi_fetch(cm_tape *tp, int n, cm_tensor *const *ts) {
    if (tp->status == CM_OK && tp->dev != CM_DEVICE_CPU && !tp->in_backward && !same_device(tp, NULL, n, ts))
        return false;
    if (!tp->fetch) return tp->status == CM_OK;
    for (int i = 0; i < n && tp->status == CM_OK; i++) {
        if (!ts[i]) continue;
        cm_status s = tp->fetch(tp, ts[i], tp->fetch_data);
        if (s) cmi_fail(tp, s, "fetching an input: %s", cm_last_error());
    }
    return tp->status == CM_OK;
}

bool cmi_begin(cm_tape *tp, const char *op, int n, cm_tensor *const *ins) {
    if (!tp) {
        cm_set_error(CM_ERR_INVALID_ARG, "%s: tape is NULL", op);
        return false;
    }
    if (tp->status != CM_OK) return false;
    for (int i = 0; i < n; i++) {
        if (!ins[i]) {
            cmi_fail(tp, CM_ERR_INVALID_ARG, "%s: input %d is NULL", op, i);
            return false;
        }
    }
    tp->dev = n ? ins[0]->device : tp->default_dev;
    if (tp->dev != CM_DEVICE_CPU) {
        if (!same_device(tp, op, n, ins)) return false;
        if (!cmi_op_on_device(op, tp->dev)) {
            cmi_fail(tp, CM_ERR_UNSUPPORTED,
                     "%s: not implemented on %s yet (input %s is on %s); move the inputs to the CPU with cm_to_device",
                     op, cm_device_name(tp->dev), n ? cmi_shape(ins[0]) : "()", cm_device_name(tp->dev));
            return false;
        }
    }
    if (!cmi_fetch(tp, n, ins)) return false;
    if (tp->op_hook) tp->op_hook(CM_TAPE_OP_BEGIN, op, NULL, n, ins, tp->op_hook_data);
    return true;
}

bool cmi_check_f32(cm_tape *tp, const char *op, const char *name, const cm_tensor *t) {
    if (t->dtype == CM_DTYPE_F32) return true;
    cmi_fail(tp, CM_ERR_DTYPE, "%s: '%s' %s has dtype %s; this op needs f32 (convert with cm_cast)", op, name,
             cmi_shape(t), cm_dtype_name(t->dtype));
    return false;
}

bool cmi_check_index(cm_tape *tp, const char *op, const char *name, const cm_tensor *t) {
    if (t->dtype == CM_DTYPE_I32 || t->dtype == CM_DTYPE_I64 || t->dtype == CM_DTYPE_U8) return true;
    cmi_fail(tp, CM_ERR_DTYPE, "%s: '%s' %s has dtype %s; indices must be i32, i64 or u8", op, name, cmi_shape(t),
             cm_dtype_name(t->dtype));
    return false;
}

bool cmi_axis(cm_tape *tp, const char *op, int ndim, int *axis) {
    int a = *axis < 0 ? *axis + ndim : *axis;
    if (a < 0 || a >= ndim) {
        cmi_fail(tp, CM_ERR_INVALID_ARG, "%s: axis %d is out of range for a %d-d tensor (use -%d..%d)", op, *axis,
                 ndim, ndim, ndim - 1);
        return false;
    }
    *axis = a;
    return true;
}

void *cmi_scratch(cm_tape *tp, size_t bytes) {
    void *p = cm_arena_alloc(tp->arena, bytes);
    if (!p) fail_oom(tp, "scratch");
    return p;
}

static cm_tensor *new_struct(cm_tape *tp, cm_dtype dt, int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > CM_MAX_DIMS) {
        cmi_fail(tp, CM_ERR_INVALID_ARG, "tensor: ndim %d is out of range (0..%d)", ndim, CM_MAX_DIMS);
        return NULL;
    }
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            cmi_fail(tp, CM_ERR_INVALID_ARG, "tensor: shape %s has a negative dim", cmi_shape_of(ndim, shape));
            return NULL;
        }
    }
    cm_tensor *t = cm_arena_alloc(tp->arena, sizeof *t);
    if (!t) {
        fail_oom(tp, "tensor");
        return NULL;
    }
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->device = tp->dev;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->flags = CM_TF_TAPE;
    return t;
}

cm_tensor *cmi_new(cm_tape *tp, cm_dtype dt, int ndim, const int64_t *shape) {
    cm_tensor *t = new_struct(tp, dt, ndim, shape);
    if (!t) return NULL;
    cmi_contig_strides(ndim, shape, t->stride);
    size_t bytes = (size_t)cmi_numel(ndim, shape) * cm_dtype_size(dt);
    cm_arena *a = tp->dev == CM_DEVICE_CPU ? tp->arena : cmi_dev_arena(tp, tp->dev);
    t->data = a ? cm_arena_alloc(a, bytes ? bytes : 1) : NULL;
    if (!t->data) {
        fail_oom(tp, cmi_shape_of(ndim, shape));
        return NULL;
    }
    return t;
}

cm_tensor *cmi_zeros(cm_tape *tp, cm_dtype dt, int ndim, const int64_t *shape) {
    cm_tensor *t = cmi_new(tp, dt, ndim, shape);
    if (!t) return NULL;
    const struct cmi_backend *be = cmi_be(tp);
    if (!be) memset(t->data, 0, cm_tensor_nbytes(t));
    else if (cmi_dev_fail(tp, be->memset(t->data, 0, cm_tensor_nbytes(t)), "zeros")) return NULL;
    return t;
}

cm_tensor *cmi_view(cm_tape *tp, cm_dtype dt, int ndim, const int64_t *shape, const int64_t *stride, void *data) {
    cm_tensor *t = new_struct(tp, dt, ndim, shape);
    if (!t) return NULL;
    for (int i = 0; i < ndim; i++) t->stride[i] = stride[i];
    t->data = data;
    return t;
}

bool cmi_needs_grad(const cm_tape *tp, int n, cm_tensor *const *ins) {
    if (!tp->grad_enabled) return false;
    for (int i = 0; i < n; i++)
        if (ins[i] && (ins[i]->flags & CM_TF_REQUIRES_GRAD)) return true;
    return false;
}

cm_node *cmi_record(cm_tape *tp, const char *op, cm_tensor *out, int n, cm_tensor *const *ins, cm_backward_fn fn,
                    size_t ctx_bytes) {
    cm_node *node = cm_arena_alloc(tp->arena, sizeof *node + sizeof(cm_tensor *) * (size_t)n);
    if (!node) {
        fail_oom(tp, op);
        return NULL;
    }
    memset(node, 0, sizeof *node);
    node->in = (cm_tensor **)(node + 1);
    for (int i = 0; i < n; i++) node->in[i] = ins[i];
    if (ctx_bytes) {
        node->ctx = cm_arena_alloc(tp->arena, ctx_bytes);
        if (!node->ctx) {
            fail_oom(tp, op);
            return NULL;
        }
        memset(node->ctx, 0, ctx_bytes);
    }
    node->op = op;
    node->backward = fn;
    node->out = out;
    node->n_in = n;
    node->prev = tp->last;
    node->inner = tp->ckpt_depth > 0;
    tp->last = node;
    tp->n_nodes++;
    out->node = node;
    out->flags |= CM_TF_REQUIRES_GRAD;
    if (tp->op_hook) tp->op_hook(CM_TAPE_OP_RECORDED, op, out, n, ins, tp->op_hook_data);
    return node;
}

/* Chunks of 64 KiB (a multiple of any element size), in parallel above CMI_PAR_MIN floats. */
#define PAR_CHUNK ((size_t)64 << 10)

void cmi_parallel_memset(void *p, int v, size_t bytes) {
    const int64_t nc = (int64_t)((bytes + PAR_CHUNK - 1) / PAR_CHUNK);
#pragma omp parallel for schedule(static) if (bytes >= sizeof(float) * CMI_PAR_MIN)
    for (int64_t i = 0; i < nc; i++) {
        const size_t off = (size_t)i * PAR_CHUNK, len = bytes - off < PAR_CHUNK ? bytes - off : PAR_CHUNK;
        memset((char *)p + off, v, len);
    }
}

void cmi_parallel_memcpy(void *dst, const void *src, size_t bytes) {
    const int64_t nc = (int64_t)((bytes + PAR_CHUNK - 1) / PAR_CHUNK);
#pragma omp parallel for schedule(static) if (bytes >= sizeof(float) * CMI_PAR_MIN)
    for (int64_t i = 0; i < nc; i++) {
        const size_t off = (size_t)i * PAR_CHUNK, len = bytes - off < PAR_CHUNK ? bytes - off : PAR_CHUNK;
        memcpy((char *)dst + off, (const char *)src + off, len);
    }
}

void cmi_bf16_round(uint16_t *d, const float *s, int64_t n) {
    enum { BLK = 4096 };
#pragma omp parallel for schedule(static) if (n > CMI_PAR_MIN)
    for (int64_t i = 0; i < n; i += BLK) cmi_bf16_round_n(d + i, s + i, n - i < BLK ? n - i : BLK);
}

void cmi_bf16_widen(float *d, const uint16_t *s, int64_t n) {
#pragma omp parallel for schedule(static) if (n > CMI_PAR_MIN)
    for (int64_t i = 0; i < n; i++) d[i] = cmi_bf16_to_f32(s[i]);
}

/* Gradients of at least this many bytes come from the tape's block pool; smaller ones from the
 * arena (not worth a heap block each). */
#define GRAD_POOL_MIN ((size_t)64 << 10)

/* A free pool block of at least `bytes` (the smallest that fits, and at most twice the size so
 * one huge block is not pinned by a small gradient), or a new one. NULL on OOM.
 * A new block replaces the free blocks it outgrows (at least half its size, too small for it):
 * they could only serve requests the new one serves. Without this a gradient whose size varies
 * from step to step (BERT's sparse masked-LM logits: one row per masked token) left a block
 * behind at every new maximum — 6 blocks of ~150 MB after 30 steps of BERT-Tiny, one in use. */
static void *gpool_take(cm_tape *tp, size_t bytes, cm_device dev) {
    int best = -1;
    for (int i = 0; i < tp->n_gblocks; i++) {
        const struct cmi_gblock *b = &tp->gblocks[i];
        if (!b->in_use && b->device == dev && b->bytes >= bytes && b->bytes / 2 <= bytes &&
            (best < 0 || b->bytes < tp->gblocks[best].bytes))
            best = i;
    }
    if (best >= 0) {
        tp->gblocks[best].in_use = true;
        return tp->gblocks[best].p;
    }
    for (int i = 0; i < tp->n_gblocks;) {
        const struct cmi_gblock *b = &tp->gblocks[i];
        if (!b->in_use && b->device == dev && b->bytes < bytes && b->bytes >= bytes / 2) {
            gblock_free(b);
            tp->gblocks[i] = tp->gblocks[--tp->n_gblocks];
        } else {
            i++;
        }
    }
    if (tp->n_gblocks == tp->cap_gblocks) {
        int cap = tp->cap_gblocks ? 2 * tp->cap_gblocks : 32;
        struct cmi_gblock *nb = cm_alloc(sizeof *nb * (size_t)cap, 16);
        if (!nb) return NULL;
        if (tp->n_gblocks) memcpy(nb, tp->gblocks, sizeof *nb * (size_t)tp->n_gblocks);
        cm_free(tp->gblocks);
        tp->gblocks = nb;
        tp->cap_gblocks = cap;
    }
    void *p = dev == CM_DEVICE_CPU ? cm_alloc(bytes, 64) : cmi_backend_get(dev)->alloc(bytes);
    if (!p) return NULL;
    tp->gblocks[tp->n_gblocks++] = (struct cmi_gblock){p, bytes, true, dev};
    return p;
}

static void gpool_give(cm_tape *tp, void *p) {
    for (int i = tp->n_gblocks - 1; i >= 0; i--)
        if (tp->gblocks[i].p == p) {
            tp->gblocks[i].in_use = false;
            return;
        }
}

void *cmi_gpool_take(cm_tape *tp, size_t bytes, cm_device dev) { return gpool_take(tp, bytes, dev); }
void cmi_gpool_give(cm_tape *tp, void *p) { gpool_give(tp, p); }

void cmi_swap_arenas(cm_tape *tp) {
    cm_arena *a = tp->arena, *d = tp->dev_arena;
    tp->arena = tp->alt_arena, tp->dev_arena = tp->alt_dev_arena;
    tp->alt_arena = a, tp->alt_dev_arena = d;
}

/* While a checkpointed region is replayed (checkpoint.c) the tape allocates from its replay
 * arenas, which are reset once the region's backward has run. The gradient of a tensor from
 * outside the region (its input, a tensor it captured, a leaf) must outlive that: it is allocated
 * in the main arenas, swapped in for the allocation. Returns whether it swapped (swap back then). */
static bool outer_grad_begin(cm_tape *tp, const cm_tensor *t) {
    if (!tp->replaying || (t->node && t->node->inner)) return false;
    cmi_swap_arenas(tp);
    return true;
}

/* Whether a gradient of `bytes` bytes comes from the block pool (and goes back to it). */
static bool grad_pooled(const cm_tape *tp, const cm_tensor *t, size_t bytes) {
    return !tp->retain_grads && t->node && bytes >= GRAD_POOL_MIN;
}

/* A new gradient of dtype dt for tape tensor t: from the arena (small ones, and with retain_grads
 * or for leaves, which keep theirs to the reset) or the block pool; zeroed when `zero`. */
static cm_tensor *tape_grad_in(cm_tape *tp, cm_tensor *t, bool zero, cm_dtype dt);
static cm_tensor *tape_grad(cm_tape *tp, cm_tensor *t, bool zero, cm_dtype dt) {
    const bool swapped = outer_grad_begin(tp, t);
    cm_tensor *g = tape_grad_in(tp, t, zero, dt);
    if (swapped) cmi_swap_arenas(tp);
    return g;
}

static cm_tensor *tape_grad_in(cm_tape *tp, cm_tensor *t, bool zero, cm_dtype dt) {
    const size_t bytes = (size_t)cm_tensor_numel(t) * cm_dtype_size(dt);
    if (!grad_pooled(tp, t, bytes))
        return zero ? cmi_zeros(tp, dt, t->ndim, t->shape) : cmi_new(tp, dt, t->ndim, t->shape);
    cm_tensor *g = new_struct(tp, dt, t->ndim, t->shape);
    if (!g) return NULL;
    cmi_contig_strides(t->ndim, t->shape, g->stride);
    if (!(g->data = gpool_take(tp, bytes, t->device))) {
        cmi_fail(tp, CM_ERR_OOM, "gradient of %s: out of memory (%zu bytes on %s)", cmi_shape(t), bytes,
                 cm_device_name(t->device));
        return NULL;
    }
    if (zero) {
        const struct cmi_backend *be = cmi_backend_get(t->device);
        if (!be) cmi_parallel_memset(g->data, 0, bytes);
        else if (cmi_dev_fail(tp, be->memset(g->data, 0, bytes), "gradient")) return NULL;
    }
    return g;
}

cm_tensor *cmi_grad_for_write(cm_tape *tp, cm_tensor *t, bool *fresh) {
    *fresh = false;
    if (!t || !(t->flags & CM_TF_REQUIRES_GRAD)) return NULL;
    if (t->grad || !(t->flags & CM_TF_TAPE) || tp->retain_grads || !t->node || cmi_view_alias_base(t))
        return cmi_grad(tp, t); /* exists, long-lived, retained or possibly shared: zeroed as usual */
    if (!(t->grad = tape_grad(tp, t, false, CM_DTYPE_F32))) return NULL;
    *fresh = true;
    return t->grad;
}

cm_tensor *cmi_grad_for_write_as(cm_tape *tp, cm_tensor *t, cm_dtype dt, bool *fresh) {
    *fresh = false;
    if (dt != CM_DTYPE_BF16 || !t || !(t->flags & CM_TF_REQUIRES_GRAD) || t->dtype != CM_DTYPE_BF16 || t->grad ||
        !(t->flags & CM_TF_TAPE) || tp->retain_grads || !t->node || !t->node->bf16_gout || cmi_view_alias_base(t))
        return cmi_grad_for_write(tp, t, fresh);
    if (!(t->grad = tape_grad(tp, t, false, CM_DTYPE_BF16))) return NULL;
    *fresh = true;
    return t->grad;
}

/* t's bf16 gradient (cmi_grad_for_write_as) replaced by an f32 one with the same values. */
static cm_tensor *promote_grad(cm_tape *tp, cm_tensor *t) {
    cm_tensor *g16 = t->grad, *g = tape_grad(tp, t, false, CM_DTYPE_F32);
    if (!g) return NULL;
    if (t->device != CM_DEVICE_CPU) {
        if (cmi_dev_fail(tp, cmi_copy_any(g, g16, g16->stride), "gradient")) return NULL;
    } else {
        cmi_bf16_widen(cmi_f32(g), g16->data, cm_tensor_numel(t));
    }
    if (grad_pooled(tp, t, cm_tensor_nbytes(g16))) gpool_give(tp, g16->data);
    return t->grad = g;
}

cm_tensor *cmi_grad(cm_tape *tp, cm_tensor *t) {
    if (!t || !(t->flags & CM_TF_REQUIRES_GRAD)) return NULL;
    if (t->grad) return t->grad->dtype == CM_DTYPE_F32 ? t->grad : promote_grad(tp, t);
    /* A view covering all of its base in the same order (GPT-2's logits reshaped to (B·T, V) for
     * the loss: 393 MiB) gets the base's gradient itself, reshaped, instead of its own buffer
     * that view_backward then adds over — when the base has no gradient yet (so the shared buffer
     * starts at zero, as a new one would) and retain_grads does not promise separate ones. */
    cm_tensor *vb = tp->retain_grads ? NULL : cmi_view_alias_base(t);
    if (vb && !vb->grad && (vb->flags & CM_TF_REQUIRES_GRAD)) {
        cm_tensor *gb = cmi_grad(tp, vb);
        if (!gb) return NULL;
        const bool swapped = outer_grad_begin(tp, t);
        cm_tensor *g = new_struct(tp, CM_DTYPE_F32, t->ndim, t->shape);
        if (swapped) cmi_swap_arenas(tp);
        if (!g) return NULL;
        cmi_contig_strides(t->ndim, t->shape, g->stride);
        g->data = gb->data;
        g->flags |= CM_TF_GRAD_ALIAS;
        t->grad = g;
        return g;
    }
    if (t->flags & CM_TF_TAPE) return t->grad = tape_grad(tp, t, true, CM_DTYPE_F32);
    cm_tensor *g;
    if (cm_tensor_new_on(t->device, CM_DTYPE_F32, t->ndim, t->shape, &g) != CM_OK) {
        cmi_fail(tp, CM_ERR_OOM, "gradient of %s: %s", cmi_shape(t), cm_last_error());
        return NULL;
    }
    t->grad = g;
    t->flags |= CM_TF_OWNS_GRAD;
    return g;
}

/* g has the broadcast shape; t's shape broadcasts to it. */
static void accum_row(int64_t n, char *const *p, const int64_t *inner, void *ctx) {
    (void)ctx;
    float *dst = (float *)p[0];
    const float *src = (const float *)p[1];
    const int64_t sd = inner[0], ss = inner[1];
    if (sd == 1 && ss == 1) {
        for (int64_t i = 0; i < n; i++) dst[i] += src[i];
    } else if (sd == 0) {
        float acc = 0.0f;
        for (int64_t i = 0; i < n; i++) acc += src[i * ss];
        dst[0] += acc;
    } else {
        for (int64_t i = 0; i < n; i++) dst[i * sd] += src[i * ss];
    }
}

cm_status cmi_accum(cm_tape *tp, cm_tensor *t, const cm_tensor *g) {
    if (!t || !(t->flags & CM_TF_REQUIRES_GRAD)) return CM_OK;
    const bool same = cm_tensor_numel(t) == cm_tensor_numel(g);
    bool fresh = false;
    /* t's first gradient, no broadcasting (a residual add's): a copy of g, not zeros plus g */
    cm_tensor *gt = same ? cmi_grad_for_write(tp, t, &fresh) : cmi_grad(tp, t);
    if (!gt) return tp->status;
    const struct cmi_backend *be = cmi_backend_get(t->device);
    if (be) {
        cm_status s = fresh ? be->memcpy(gt->data, g->data, cm_tensor_nbytes(gt), CMI_D2D) : CM_OK;
        if (!fresh) {
            int64_t dst[CM_MAX_DIMS];
            cmi_broadcast_strides(gt, g->ndim, g->shape, dst);
            s = be->accum(cmi_f32(gt), dst, cmi_f32(g), g->ndim, g->shape);
        }
        return cmi_dev_fail(tp, s, "gradient accumulation") ? tp->status : CM_OK;
    }
    if (fresh) {
        cmi_parallel_memcpy(gt->data, g->data, cm_tensor_nbytes(gt));
        return CM_OK;
    }
    int64_t st[2][CM_MAX_DIMS];
    cmi_broadcast_strides(gt, g->ndim, g->shape, st[0]);
    cmi_contig_strides(g->ndim, g->shape, st[1]);
    char *bases[2] = {(char *)gt->data, (char *)g->data};
    size_t es[2] = {4, 4};
    cmi_iterate(g->ndim, g->shape, 2, st, bases, es, same, accum_row, NULL);
    return CM_OK;
}

/* ---- backward ---- */

cm_status cmi_run_backward(cm_tape *tp, cm_node *last, bool hooks) {
    cm_status st = CM_OK;
    for (cm_node *n = last; n && st == CM_OK; n = n->prev) {
        cm_tensor *gout = n->out->grad;
        if (!gout) continue; /* not on the path from `out` */
        if (gout->dtype != CM_DTYPE_F32 && !n->bf16_gout && !(gout = cmi_grad(tp, n->out))) {
            st = tp->status;
            break;
        }
        tp->dev = n->out->device;
        if (tp->n_aoff && !cmi_aoff_before_node(tp, n)) {
            st = tp->status;
            break;
        }
        if (tp->fetch && !cmi_fetch(tp, n->n_in, n->in)) {
            st = tp->status;
            break;
        }
        if (tp->op_hook) tp->op_hook(CM_TAPE_OP_BACKWARD_BEGIN, n->op, n->out, n->n_in, n->in, tp->op_hook_data);
        st = n->backward(tp, n, gout);
        if (tp->op_hook) tp->op_hook(CM_TAPE_OP_BACKWARD_END, n->op, n->out, n->n_in, n->in, tp->op_hook_data);
        if (st == CM_OK && tp->status) st = tp->status;
        if (st == CM_OK && hooks && tp->bw_hook) tp->bw_hook(tp, n, tp->bw_hook_data);
        /* Every consumer of n->out was recorded after n and has run: its gradient is dead. */
        if (!tp->retain_grads && (n->out->flags & CM_TF_TAPE)) {
            if (grad_pooled(tp, n->out, cm_tensor_nbytes(gout)) && !(gout->flags & CM_TF_GRAD_ALIAS))
                gpool_give(tp, gout->data);
            n->out->grad = NULL;
        }
    }
    return st;
}

cm_status cm_tape_backward_with(cm_tape *tp, cm_tensor *out, const cm_tensor *grad) {
    if (tp->status) return cm_set_error(tp->status, "%s", tp->error);
    if (!out || !grad) return cmi_fail(tp, CM_ERR_INVALID_ARG, "backward: output or gradient is NULL");
    if (!(out->flags & CM_TF_REQUIRES_GRAD))
        return cmi_fail(tp, CM_ERR_STATE,
                        "backward: the output %s does not require grad (no input requires grad, or grad was disabled)",
                        cmi_shape(out));
    if (grad->dtype != CM_DTYPE_F32 || grad->ndim != out->ndim ||
        memcmp(grad->shape, out->shape, sizeof(int64_t) * (size_t)out->ndim) != 0)
        return cmi_fail(tp, CM_ERR_SHAPE, "backward: gradient %s (%s) must be f32 with the output's shape %s",
                        cmi_shape(grad), cm_dtype_name(grad->dtype), cmi_shape(out));
    if (grad->device != out->device)
        return cmi_fail(tp, CM_ERR_INVALID_ARG, "backward: gradient is on %s but the output %s is on %s",
                        cm_device_name(grad->device), cmi_shape(out), cm_device_name(out->device));
    bool prev = tp->grad_enabled;
    tp->grad_enabled = false; /* backward functions build no graph */
    tp->dev = out->device;
    tp->in_backward = true; /* a node's inputs may sit on another device (cm_to_device's) */
    cm_status st = cmi_accum(tp, out, grad);
    if (tp->bw_hook && st == CM_OK) tp->bw_hook(tp, NULL, tp->bw_hook_data);
    if (st == CM_OK) st = cmi_run_backward(tp, tp->last, true);
    tp->grad_enabled = prev;
    tp->in_backward = false;
    if (st && !tp->status) cmi_fail(tp, st, "backward: %s", cm_last_error());
    return st;
}

cm_status cm_tape_backward(cm_tape *tp, cm_tensor *loss) {
    if (tp->status) return cm_set_error(tp->status, "%s", tp->error);
    if (!loss) return cmi_fail(tp, CM_ERR_INVALID_ARG, "backward: loss is NULL");
    if (cm_tensor_numel(loss) != 1)
        return cmi_fail(tp, CM_ERR_SHAPE, "backward: loss must have one element, got shape %s (reduce it first, "
                                          "or use cm_tape_backward_with)", cmi_shape(loss));
    tp->dev = loss->device;
    cm_tensor *one = cmi_new(tp, CM_DTYPE_F32, loss->ndim, loss->shape);
    if (!one) return tp->status;
    const struct cmi_backend *be = cmi_be(tp);
    if (!be) cmi_f32(one)[0] = 1.0f;
    else if (cmi_dev_fail(tp, be->fill(one->data, CM_DTYPE_F32, 0, NULL, NULL, 1.0), "backward")) return tp->status;
    return cm_tape_backward_with(tp, loss, one);
}
