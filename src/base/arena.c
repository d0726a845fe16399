/* Arena: bump allocation from a list of chunks, with a byte budget, peak tracking and rewinding.
 *
 * Positions are cumulative over the chunk list (chunk i starts at the sum of the capacities of the
 * chunks before it); an allocation that does not fit in the current chunk skips the rest of it.
 * Positions therefore only grow between resets, which makes mark/rewind a single number. Chunks are
 * kept across resets, so their pages stay touched.
 *
 * A host arena's first chunk is a reservation of address space as large as the machine's memory
 * (or the budget, if smaller), mapped without committing it: only the pages an allocation touches
 * become resident, so one chunk serves every size and no tail is ever skipped. Skipped tails were
 * resident waste: GPT-2 124M at T 1024 under activation checkpointing skipped ~290 MiB a step, the
 * 393 MiB logits-sized requests not fitting the tails the blocks' forward had touched and rewound.
 * A caller's allocator that can reserve and commit (a GPU's virtual memory: the tape's device arena)
 * gets the same shape: one reserved range, committed from its start as positions grow. Before
 * that, a GPU arena grew in chunks each as large as all before it, and a request that did not fit a
 * chunk's tail skipped it: GPT-2's device arena could hold up to twice its peak (the emulator's
 * tiny GPT-2 step: 53 MiB of chunks, a 27 MiB chunk made for a 16 KiB request).
 * Where the kernel refuses the reservation (strict overcommit accounting), a user's allocator hooks
 * are installed, or the arena's chunks come from a caller's allocator without reserve, chunks are
 * allocated as they are needed, growing geometrically. */
#include <composer/base.h>

#include "alloc_impl.h"

#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define ARENA_ALIGN 64
#define ARENA_MIN_CHUNK ((size_t)1 << 20)

typedef struct chunk {
    char *mem;
    size_t cap;
    size_t base; /* cumulative position of mem[0] */
    bool mapped; /* the address-space reservation: munmap, not the allocator */
    bool grows;  /* the allocator's growable range (al.reserve): usable up to `committed` */
    size_t committed;
} chunk;

struct cm_arena {
    chunk *chunks;
    int n_chunks, cap_chunks;
    int cur;       /* index of the chunk being filled */
    size_t pos;    /* cumulative position */
    size_t budget; /* 0 = unlimited */
    size_t peak;
    bool poison;
    bool custom;            /* chunks from `al` instead of the allocator hook */
    cm_arena_allocator al;
    cm_arena_oom_fn oom_hook; /* cm_arena_set_oom_hook */
    void *oom_data;
};

cm_status cm_arena_new_with(size_t budget, const cm_arena_allocator *al, cm_arena **out) {
    *out = NULL;
    if (al && (al->granule & (al->granule - 1)))
        return cm_set_error(CM_ERR_INVALID_ARG, "arena allocator granule %zu is not a power of two", al->granule);
    if (al && (!al->reserve != !al->commit || !al->reserve != !al->release))
        return cm_set_error(CM_ERR_INVALID_ARG, "arena allocator: reserve, commit and release go together "
                                                "(set all three or none)");
    cm_arena *a = cm_alloc_zeroed(sizeof *a, 16);
    if (!a) return CM_ERR_OOM;
    a->budget = budget;
    if (al) {
        a->custom = true;
        a->al = *al;
    }
    *out = a;
    return CM_OK;
}

cm_status cm_arena_new(size_t budget, cm_arena **out) { return cm_arena_new_with(budget, NULL, out); }

static void chunk_free(cm_arena *a, const chunk *c) {
    if (c->mapped) munmap(c->mem, c->cap);
    else if (c->grows) a->al.release(a->al.ctx, c->mem);
    else if (a->custom) a->al.free(a->al.ctx, c->mem);
    else cm_free(c->mem);
}

void cm_arena_trim(cm_arena *a) {
    if (!a) return;
    for (int i = 0; i < a->n_chunks; i++) chunk_free(a, &a->chunks[i]);
    a->n_chunks = 0;
    a->cur = 0;
    a->pos = 0;
}

void cm_arena_free(cm_arena *a) {
    if (!a) return;
    for (int i = 0; i < a->n_chunks; i++) chunk_free(a, &a->chunks[i]);
    cm_free(a->chunks);
    cm_free(a);
}

static size_t total_cap(const cm_arena *a) {
    return a->n_chunks ? a->chunks[a->n_chunks - 1].base + a->chunks[a->n_chunks - 1].cap : 0;
}

/* The first chunk of a host arena with the default allocator: address space for the machine's
 * memory (or the budget), committed page by page as it is touched. NULL, with nothing recorded,
 * where the kernel refuses it or it could not hold `min_bytes` (then chunks come from cm_alloc). */
static char *reserve(const cm_arena *a, size_t min_bytes, size_t *cap) {
    const long page = sysconf(_SC_PAGESIZE), pages = sysconf(_SC_PHYS_PAGES);
    if (page <= 0 || pages <= 0) return NULL;
    size_t r = (size_t)pages * (size_t)page;
    if (a->budget && a->budget < r) r = (a->budget + (size_t)page - 1) & ~((size_t)page - 1);
    if (r < min_bytes || r < ARENA_MIN_CHUNK) return NULL;
    void *p = mmap(NULL, r, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return NULL;
    *cap = r;
    return p;
}

/* Makes [0, end) of a growable chunk usable: an eighth more than it had, between 1 and 16 granules
 * (fewer mappings while a first step grows it, at most 16 granules past the high-water mark), or
 * just enough where that much is refused. */
static bool commit_to(cm_arena *a, chunk *c, size_t end) {
    const size_t g = a->al.granule > 1 ? a->al.granule : ARENA_ALIGN;
    size_t step = c->committed / 8 / g * g;
    step = step < g ? g : step > 16 * g ? 16 * g : step;
    size_t want = (end + g - 1) & ~(g - 1), more = c->committed + step;
    if (more > c->cap) more = c->cap;
    if (more > want && a->al.commit(a->al.ctx, c->mem, more) == CM_OK) {
        c->committed = more;
        return true;
    }
    if (a->al.commit(a->al.ctx, c->mem, want) != CM_OK) return false;
    c->committed = want;
    return true;
}

static bool add_chunk(cm_arena *a, size_t min_bytes) {
    if (a->n_chunks == a->cap_chunks) {
        int nc = a->cap_chunks ? a->cap_chunks * 2 : 8;
        chunk *c = cm_alloc(sizeof(chunk) * (size_t)nc, 16);
        if (!c) return false;
        if (a->n_chunks) memcpy(c, a->chunks, sizeof(chunk) * (size_t)a->n_chunks);
        cm_free(a->chunks);
        a->chunks = c;
        a->cap_chunks = nc;
    }
    size_t tc = total_cap(a);
    if (a->n_chunks == 0 && !a->custom && cmi_alloc_is_default()) {
        if (!cmi_alloc_tick(min_bytes)) return false; /* an injected failure (cm_alloc_fail_at) */
        size_t cap;
        char *mem = reserve(a, min_bytes, &cap);
        if (mem) {
            a->chunks[0] = (chunk){mem, cap, 0, true, false, cap};
            a->n_chunks = 1;
            return true;
        }
    }
    if (a->n_chunks == 0 && a->custom && a->al.reserve) {
        size_t cap = 0;
        char *mem = a->al.reserve(a->al.ctx, a->budget, &cap);
        if (mem && cap >= min_bytes) {
            a->chunks[0] = (chunk){mem, cap, 0, false, true, 0};
            a->n_chunks = 1;
            return true;
        }
        if (mem) a->al.release(a->al.ctx, mem); /* too small for the first request: chunks as without */
    }
    size_t cap = min_bytes;
    if (cap < ARENA_MIN_CHUNK) cap = ARENA_MIN_CHUNK;
    if (cap < tc) cap = tc; /* geometric growth */
    if (a->budget && tc + cap > a->budget) cap = a->budget - tc; /* never reserve past the budget */
    if (cap < min_bytes) cap = min_bytes;
    cap = (cap + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    if (a->custom && a->al.granule > 1) cap = (cap + a->al.granule - 1) & ~(a->al.granule - 1);
    char *mem = a->custom ? a->al.alloc(a->al.ctx, cap) : cm_alloc(cap, ARENA_ALIGN);
    if (!mem) return false;
    a->chunks[a->n_chunks] = (chunk){mem, cap, tc, false, false, cap};
    a->n_chunks++;
    return true;
}

/* A custom allocator refused memory and said why (a device's out-of-memory names the device). */
static void *allocator_failed(const cm_arena *a, size_t bytes) {
    char why[512];
    snprintf(why, sizeof why, "%s", cm_last_error());
    cm_set_error(cm_last_status() == CM_ERR_OOM ? CM_ERR_OOM : cm_last_status(),
                 "out of memory: arena request of %zu bytes failed (in use %zu bytes, budget %zu bytes): %s", bytes,
                 a->pos, a->budget, why);
    return NULL;
}

void *cm_arena_alloc(cm_arena *a, size_t bytes) {
    size_t need = (bytes + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    if (need == 0) need = ARENA_ALIGN;
    for (;;) {
        if (a->cur < a->n_chunks) {
            chunk *c = &a->chunks[a->cur];
            size_t off = a->pos > c->base ? a->pos - c->base : 0;
            if (off + need <= c->cap) {
                size_t newpos = c->base + off + need;
                if (a->budget && newpos > a->budget) break;
                if (c->grows && off + need > c->committed && !commit_to(a, c, off + need))
                    return allocator_failed(a, bytes);
                a->pos = newpos;
                if (a->pos > a->peak) a->peak = a->pos;
                void *p = c->mem + off;
                if (a->poison) {
                    if (!a->custom) memset(p, 0xFF, bytes);
                    else if (a->al.fill && a->al.fill(a->al.ctx, p, 0xFF, bytes) != CM_OK) return NULL;
                }
                return p;
            }
            if (a->cur + 1 < a->n_chunks) { /* skip the rest of this chunk */
                a->cur++;
                a->pos = a->chunks[a->cur].base;
                continue;
            }
        }
        size_t start = total_cap(a);
        if (a->budget && start + need > a->budget) break;
        if (!add_chunk(a, need)) {
            if (a->custom) return allocator_failed(a, bytes);
            cm_set_error(CM_ERR_OOM,
                         "out of memory: arena request of %zu bytes failed (in use %zu bytes, budget %zu bytes)",
                         bytes, a->pos, a->budget);
            if (a->oom_hook) a->oom_hook(bytes, a->pos, a->budget, a->oom_data);
            return NULL;
        }
        a->cur = a->n_chunks - 1;
        a->pos = a->chunks[a->cur].base;
    }
    cm_set_error(CM_ERR_OOM,
                 "out of memory: arena request of %zu bytes exceeds the budget (in use %zu of %zu bytes; raise the "
                 "budget or lower the microbatch size)",
                 bytes, a->pos, a->budget);
    if (a->oom_hook) a->oom_hook(bytes, a->pos, a->budget, a->oom_data);
    return NULL;
}

void cm_arena_set_oom_hook(cm_arena *a, cm_arena_oom_fn fn, void *data) {
    if (!a) return;
    a->oom_hook = fn;
    a->oom_data = fn ? data : NULL;
}

/* Chunks are kept as they are: merging them into one block would hand the next step freshly
 * allocated memory whose every page faults in again on first touch (ResNet-56: the step after such
 * a merge ran at 68 instead of 92 img/s, a quarter of it in the kernel clearing pages). Chunks grow
 * geometrically, so there are at most about log2(total / 1 MiB) of them, and a repeating step
 * settles into the same chunks and reuses their touched pages. */
void cm_arena_reset(cm_arena *a) {
    a->cur = 0;
    a->pos = 0;
}

size_t cm_arena_mark(const cm_arena *a) { return a->pos; }

void cm_arena_rewind(cm_arena *a, size_t mark) {
    if (mark >= a->pos) return;
    a->pos = mark;
    while (a->cur > 0 && a->chunks[a->cur].base > mark) a->cur--;
}

size_t cm_arena_used(const cm_arena *a) { return a->pos; }
size_t cm_arena_peak(const cm_arena *a) { return a->peak; }
size_t cm_arena_budget(const cm_arena *a) { return a->budget; }
void cm_arena_set_budget(cm_arena *a, size_t budget) { a->budget = budget; }
void cm_arena_reset_peak(cm_arena *a) { a->peak = a->pos; }
void cm_arena_set_poison(cm_arena *a, bool on) { a->poison = on; }
