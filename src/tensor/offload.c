/* Activation offload on the tape (Composer's fsdp_config activation_cpu_offload, PyTorch's
 * offload_wrapper / save_on_cpu): what a region saves for backward waits in host memory between
 * its forward and its backward.
 *
 * Forward. The region runs as any code on the tape, but its GPU tensors come from an arena of its
 * own whose chunks are fixed-address device ranges (the backend's vm_*: the same address whether
 * mapped or not), so every pointer the region's nodes keep — inputs, outputs, op contexts —
 * stays valid while the memory behind it is gone. Its result is copied into the tape's main arena
 * (one node passes the gradient back), then each chunk's used bytes are downloaded into a pinned
 * host buffer and the chunk is unmapped: the device holds one region's activations at a time.
 *
 * Backward. Before a node whose output or inputs lie in an offloaded region runs, the region's
 * chunks are mapped and uploaded again (the first such node is the result's copy, so the whole
 * region is back before its first backward node); the regions recorded after it are done and
 * unmapped, and the region recorded before it starts uploading on the copy stream (prefetch,
 * joined when backward reaches it). cm_tape_reset unmaps what is left. Regions are pooled across
 * steps (their address ranges and host buffers reused). The values are the plain run's bit for
 * bit: the same ops on the same bytes, only where the bytes wait changes. */
#include "tensor/backend.h"
#include "tensor/tensor_impl.h"

#include <stdio.h>
#include <string.h>

enum { AOFF_FREE, AOFF_LIVE, AOFF_HOST, AOFF_UPLOADING };

typedef struct aoff_chunk {
    char *p;     /* fixed-address device range (cap bytes, rounded up by the backend) */
    size_t cap;  /* what the arena asked for */
    void *host;  /* pinned, cap bytes (made on the first download) */
    size_t used; /* bytes downloaded */
    bool mapped;
    void *ev; /* an upload in flight */
} aoff_chunk;

struct cmi_aoff_region {
    cm_tape *tp;
    cm_arena *arena;
    aoff_chunk *chunks;
    int n_chunks, cap_chunks;
    int state;
};

static const cmi_backend *be_of(const cm_tape *tp) { return cmi_backend_get(tp->default_dev); }

/* Device bytes behind the regions now, and the most at once (cm_tape_offload_peak_bytes). */
static void note_mapped(cm_tape *tp, size_t bytes, bool map) {
    if (map) tp->aoff_mapped += bytes;
    else tp->aoff_mapped -= bytes;
    if (tp->aoff_mapped > tp->aoff_mapped_peak) tp->aoff_mapped_peak = tp->aoff_mapped;
}

static void *chunk_alloc(void *ctx, size_t bytes) {
    struct cmi_aoff_region *r = ctx;
    const cmi_backend *be = be_of(r->tp);
    if (r->n_chunks == r->cap_chunks) {
        const int cap = r->cap_chunks ? 2 * r->cap_chunks : 8;
        aoff_chunk *nc = cm_alloc_zeroed(sizeof *nc * (size_t)cap, 16);
        if (!nc) return NULL;
        if (r->n_chunks) memcpy(nc, r->chunks, sizeof *nc * (size_t)r->n_chunks);
        cm_free(r->chunks);
        r->chunks = nc;
        r->cap_chunks = cap;
    }
    void *p = be->vm_reserve(bytes);
    if (!p) return NULL;
    if (be->vm_map(p) != CM_OK) {
        be->vm_release(p);
        return NULL;
    }
    r->chunks[r->n_chunks++] = (aoff_chunk){p, bytes, NULL, 0, true, NULL};
    note_mapped(r->tp, bytes, true);
    return p;
}

static void chunk_free(void *ctx, void *p) {
    struct cmi_aoff_region *r = ctx;
    const cmi_backend *be = be_of(r->tp);
    for (int i = 0; i < r->n_chunks; i++) {
        if (r->chunks[i].p != p) continue;
        if (r->chunks[i].ev) (void)be->copy_wait(r->chunks[i].ev);
        if (r->chunks[i].mapped) note_mapped(r->tp, r->chunks[i].cap, false);
        be->vm_release(p);
        if (r->chunks[i].host) be->host_free(r->chunks[i].host);
        memmove(&r->chunks[i], &r->chunks[i + 1], sizeof *r->chunks * (size_t)(r->n_chunks - i - 1));
        r->n_chunks--;
        return;
    }
}

static cm_status chunk_fill(void *ctx, void *p, int byte, size_t bytes) {
    return be_of(((struct cmi_aoff_region *)ctx)->tp)->memset(p, byte, bytes);
}

/* Unmaps every chunk (after any upload in flight): the region holds no device memory. */
static void region_unmap(struct cmi_aoff_region *r) {
    const cmi_backend *be = be_of(r->tp);
    for (int i = 0; i < r->n_chunks; i++) {
        aoff_chunk *c = &r->chunks[i];
        if (c->ev) (void)be->copy_wait(c->ev);
        c->ev = NULL;
        if (c->mapped) {
            be->vm_unmap(c->p);
            note_mapped(r->tp, c->cap, false);
        }
        c->mapped = false;
    }
    r->state = AOFF_FREE;
}

static cm_status region_map(struct cmi_aoff_region *r) {
    const cmi_backend *be = be_of(r->tp);
    for (int i = 0; i < r->n_chunks; i++) {
        aoff_chunk *c = &r->chunks[i];
        if (c->mapped) continue;
        cm_status s = be->vm_map(c->p);
        if (s) return s;
        c->mapped = true;
        note_mapped(r->tp, c->cap, true);
    }
    return CM_OK;
}

void cmi_aoff_free(cm_tape *tp) {
    for (int k = 0; k < tp->n_aoff_pool; k++) {
        struct cmi_aoff_region *r = tp->aoff[k];
        region_unmap(r);
        cm_arena_free(r->arena); /* its chunks: chunk_free */
        cm_free(r->chunks);
        cm_free(r);
    }
    cm_free(tp->aoff);
    tp->aoff = NULL;
    tp->n_aoff = tp->n_aoff_pool = 0;
}

void cmi_aoff_reset(cm_tape *tp) {
    for (int k = 0; k < tp->n_aoff; k++) region_unmap(tp->aoff[k]);
    tp->n_aoff = 0;
}

static struct cmi_aoff_region *region_get(cm_tape *tp) {
    if (tp->n_aoff < tp->n_aoff_pool) return tp->aoff[tp->n_aoff];
    struct cmi_aoff_region **np = cm_alloc(sizeof *np * (size_t)(tp->n_aoff_pool + 1), 16);
    struct cmi_aoff_region *r = cm_alloc_zeroed(sizeof *r, 16);
    if (!np || !r) {
        cm_free(np);
        cm_free(r);
        return NULL;
    }
    r->tp = tp;
    /* chunks in whole mapping granules (2 MiB on a GPU): every byte mapped is one the arena can use,
     * and the bytes counted as mapped are the device's */
    const cmi_backend *be = be_of(tp);
    cm_arena_allocator al = {chunk_alloc, chunk_free, chunk_fill, r, be->vm_granularity ? be->vm_granularity() : 0,
                             NULL, NULL, NULL};
    if (cm_arena_new_with(0, &al, &r->arena) != CM_OK) {
        cm_free(np);
        cm_free(r);
        return NULL;
    }
    cm_arena_set_poison(r->arena, tp->poison);
    /* blocks repeat: a new region starts with one chunk as large as the largest region so far, not
     * the arena's 1, 2, 4, ... MiB whose skipped tails would be mapped too */
    if (tp->aoff_max_used && !cm_arena_alloc(r->arena, tp->aoff_max_used)) {
        cm_arena_free(r->arena);
        cm_free(np);
        cm_free(r->chunks);
        cm_free(r);
        return NULL;
    }
    if (tp->n_aoff_pool) memcpy(np, tp->aoff, sizeof *np * (size_t)tp->n_aoff_pool);
    cm_free(tp->aoff);
    tp->aoff = np;
    tp->aoff[tp->n_aoff_pool++] = r;
    return r;
}

static int region_of(const cm_tape *tp, const void *p) {
    const char *x = p;
    for (int k = 0; x && k < tp->n_aoff; k++) {
        const struct cmi_aoff_region *r = tp->aoff[k];
        for (int i = 0; i < r->n_chunks; i++)
            if (x >= r->chunks[i].p && x < r->chunks[i].p + r->chunks[i].cap) return k;
    }
    return -1;
}

/* The region's used bytes to host, then its chunks unmapped. Positions are cumulative over the
 * arena's chunks, in the order chunk_alloc made them. */
static cm_status region_download(struct cmi_aoff_region *r) {
    const cmi_backend *be = be_of(r->tp);
    const size_t used = cm_arena_used(r->arena);
    if (used > r->tp->aoff_max_used) r->tp->aoff_max_used = used;
    size_t base = 0;
    for (int i = 0; i < r->n_chunks; i++) {
        aoff_chunk *c = &r->chunks[i];
        c->used = used > base ? (used - base < c->cap ? used - base : c->cap) : 0;
        base += c->cap;
        if (c->used && !c->host && !(c->host = be->host_alloc(c->cap)))
            return cm_set_error(CM_ERR_OOM, "activation offload: out of pinned host memory (%zu bytes)", c->cap);
        cm_status s = c->used ? be->memcpy(c->host, c->p, c->used, CMI_D2H) : CM_OK;
        if (s) return s;
        be->vm_unmap(c->p);
        c->mapped = false;
        note_mapped(r->tp, c->cap, false);
    }
    r->state = AOFF_HOST;
    return CM_OK;
}

/* Starts (prefetch) or makes (not) the region's upload; joined in region_ready. */
static cm_status region_upload(struct cmi_aoff_region *r, bool prefetch) {
    const cmi_backend *be = be_of(r->tp);
    cm_status s = region_map(r);
    for (int i = 0; !s && i < r->n_chunks; i++) {
        aoff_chunk *c = &r->chunks[i];
        if (!c->used) continue;
        s = prefetch ? be->copy_start(c->p, c->host, c->used, CMI_H2D, &c->ev) : be->memcpy(c->p, c->host, c->used, CMI_H2D);
    }
    r->state = prefetch ? AOFF_UPLOADING : AOFF_LIVE;
    return s;
}

static cm_status region_ready(struct cmi_aoff_region *r) {
    const cmi_backend *be = be_of(r->tp);
    cm_status s = CM_OK;
    if (r->state == AOFF_HOST) return region_upload(r, false);
    for (int i = 0; i < r->n_chunks; i++) {
        aoff_chunk *c = &r->chunks[i];
        cm_status w = c->ev ? be->copy_join(c->ev) : CM_OK;
        c->ev = NULL;
        if (!s) s = w;
    }
    r->state = AOFF_LIVE;
    return s;
}

bool cmi_aoff_before_node(cm_tape *tp, const cm_node *n) {
    int k = n->out ? region_of(tp, n->out->data) : -1;
    for (int j = 0; k < 0 && j < n->n_in; j++) k = n->in[j] ? region_of(tp, n->in[j]->data) : -1;
    if (k < 0) return true;
    struct cmi_aoff_region *r = tp->aoff[k];
    if (r->state == AOFF_LIVE) return true;
    cm_status s = region_ready(r);
    /* backward runs in reverse: the regions recorded after this one are done */
    for (int j = k + 1; !s && j < tp->n_aoff; j++)
        if (tp->aoff[j]->state != AOFF_HOST) region_unmap(tp->aoff[j]);
    if (!s && k > 0 && tp->aoff[k - 1]->state == AOFF_HOST) s = region_upload(tp->aoff[k - 1], true);
    if (s) {
        char msg[900];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        cmi_fail(tp, s, "activation offload: bringing region %d back to the device: %s", k, msg);
        return false;
    }
    return true;
}

static cm_status link_backward(cm_tape *tp, cm_node *n, const cm_tensor *gout) { return cmi_accum(tp, n->in[0], gout); }

cm_tensor *cm_tape_offload(cm_tape *tp, cm_tape_region_fn fn, void *data, int n_in, cm_tensor *const *in) {
    if (!tp) {
        cm_set_error(CM_ERR_INVALID_ARG, "activation offload: tape is NULL");
        return NULL;
    }
    if (tp->status) return NULL;
    if (!fn || n_in < 0 || (n_in > 0 && !in)) {
        cmi_fail(tp, CM_ERR_INVALID_ARG, "activation offload: %s", !fn ? "fn is NULL" : "n_in < 0 or in is NULL");
        return NULL;
    }
    /* nothing saved without a graph; host memory already on the CPU; regions do not nest */
    if (!tp->grad_enabled || tp->default_dev == CM_DEVICE_CPU || tp->in_aoff || tp->ckpt_depth > 0 || tp->replaying)
        return fn(tp, n_in, in, data);
    const cmi_backend *be = be_of(tp);
    cm_arena *main = cmi_dev_arena(tp, tp->default_dev);
    if (!be || !be->vm_reserve || !main) {
        cmi_fail(tp, CM_ERR_UNSUPPORTED, "activation offload: device %s has no fixed-address ranges",
                 cm_device_name(tp->default_dev));
        return NULL;
    }
    struct cmi_aoff_region *r = region_get(tp);
    if (!r) {
        cmi_fail(tp, CM_ERR_OOM, "activation offload: out of memory for a region");
        return NULL;
    }
    cm_status s = region_map(r);
    if (s) {
        cmi_dev_fail(tp, s, "activation offload");
        return NULL;
    }
    cm_arena_reset(r->arena);
    const int k = tp->n_aoff++;
    r->state = AOFF_LIVE;
    tp->dev_arena = r->arena;
    tp->in_aoff = true;
    cm_tensor *y = fn(tp, n_in, in, data);
    tp->in_aoff = false;
    tp->dev_arena = main;
    if (!y || tp->status) {
        if (!y && !tp->status) cmi_fail(tp, CM_ERR_INTERNAL, "activation offload: the region returned NULL without an error");
        return NULL;
    }
    cm_tensor *out = y;
    if (region_of(tp, y->data) == k) { /* the result stays on the device: a copy in the main arena */
        const cm_device prev = tp->dev;
        tp->dev = y->device;
        out = cmi_new(tp, y->dtype, y->ndim, y->shape);
        tp->dev = prev;
        if (!out) return NULL;
        s = cmi_is_contig(y) ? be->memcpy(out->data, y->data, cm_tensor_nbytes(y), CMI_D2D)
                             : cmi_copy_any(out, y, y->stride);
        if (cmi_dev_fail(tp, s, "activation offload")) return NULL;
        if ((y->flags & CM_TF_REQUIRES_GRAD) && !cmi_record(tp, "activation_offload", out, 1, &y, link_backward, 0))
            return NULL;
    }
    if ((s = region_download(r))) {
        cmi_dev_fail(tp, s, "activation offload");
        return NULL;
    }
    tp->n_aoff_regions++;
    return out;
}

int64_t cm_tape_n_offloaded(const cm_tape *tp) { return tp ? tp->n_aoff_regions : 0; }
size_t cm_tape_offload_peak_bytes(const cm_tape *tp) { return tp ? tp->aoff_mapped_peak : 0; }
