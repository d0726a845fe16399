/*
 * composer/base.h — the base layer: status codes and error messages, logging, allocator hooks,
 * arenas, threads, counter-based random numbers, hashing and clocks.
 *
 * Every fallible call in the library returns a cm_status (CM_OK is 0, errors are negative) and
 * leaves a human-readable message in a thread-local buffer that cm_last_error() returns. The
 * message names what failed, with which value, and what to do about it.
 *
 *     #include <composer/composer.h>
 *
 *     cm_arena *arena;
 *     if (cm_arena_new(1 << 20, &arena) != CM_OK) {
 *         fprintf(stderr, "error: %s\n", cm_last_error());
 *         return 1;
 *     }
 *     float *x = cm_arena_alloc(arena, 256 * sizeof(float));   // NULL + CM_ERR_OOM over budget
 *     cm_rng rng = cm_rng_init(42, 0);
 *     cm_rng_normal(&rng, x, 256, 0.0f, 1.0f);                  // reproducible from (42, 0, 0)
 *     cm_arena_free(arena);
 */
#ifndef COMPOSER_BASE_H
#define COMPOSER_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Status codes
 * ------------------------------------------------------------------------------------------- */

/* X-macro list: name, value, short description. Generates the enum, cm_status_name() and
 * cm_status_str(). Values are dense (0, -1, -2, ...): a new status goes at the end with the next
 * value (src/base/status.c checks it at compile time). A program's exit status for any error is 1
 * (usage errors 2, signals 128 + n: see cm_exit_status in checkpoint.h). */
#define CM_STATUS_LIST(X)                                                             \
    X(CM_OK, 0, "ok")                                                                 \
    X(CM_ERR_INVALID_ARG, -1, "invalid argument")                                     \
    X(CM_ERR_SHAPE, -2, "shape mismatch")                                             \
    X(CM_ERR_DTYPE, -3, "unsupported dtype")                                          \
    X(CM_ERR_OOM, -4, "out of memory")                                                \
    X(CM_ERR_IO, -5, "I/O error")                                                     \
    X(CM_ERR_FORMAT, -6, "bad file format")                                           \
    X(CM_ERR_STATE, -7, "invalid state")                                              \
    X(CM_ERR_UNSUPPORTED, -8, "unsupported")                                          \
    X(CM_ERR_NOT_FOUND, -9, "not found")                                              \
    X(CM_ERR_INTERNAL, -10, "internal error")                                         \
    /* a run stopped on SIGTERM/SIGINT (see cm_trainer_exit_code) */                  \
    X(CM_ERR_INTERRUPTED, -11, "interrupted by a signal")                             \
    /* a collective waited longer than dist_timeout (see composer/dist.h) */         \
    X(CM_ERR_TIMEOUT, -12, "timed out")                                               \
    /* an accelerator's runtime failed (a CUDA error other than out of memory) */     \
    X(CM_ERR_DEVICE, -13, "device error")

typedef enum cm_status {
#define CM_X_(name, value, desc) name = value,
    CM_STATUS_LIST(CM_X_)
#undef CM_X_
} cm_status;

/* The enum value's name, e.g. "CM_ERR_SHAPE"; "CM_ERR_?" for values not in the list. */
const char *cm_status_name(cm_status s);

/* A short description of the status, e.g. "shape mismatch". */
const char *cm_status_str(cm_status s);

/* The message of the last error raised on this thread ("" if none). The pointer stays valid until
 * the next failing call on the same thread. Thread-safe (the buffer is thread-local). */
const char *cm_last_error(void);

/* The status of the last error raised on this thread (CM_OK if none, or after cm_clear_error). */
cm_status cm_last_status(void);

/* Records an error for this thread: the message is formatted printf-style and prefixed with
 * nothing (write the context into the message). Returns `s`, so library code can write
 * `return cm_set_error(CM_ERR_SHAPE, "add: shapes %s and %s do not broadcast", ...);`.
 * Plugins and user callbacks may use it to report their own failures. */
cm_status cm_set_error(cm_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
cm_status cm_set_errorv(cm_status s, const char *fmt, va_list ap);

/* Clears this thread's last error. */
void cm_clear_error(void);

/* Suggestions for messages: the Levenshtein distance of two names (compared on their first 63
 * bytes), and the candidate closest to `word` when it is close enough to be a likely typo (at most
 * 2 edits for names under 6 characters, else a third of the name + 1), else NULL. NULL candidates
 * are skipped. Thread-safe. */
int cm_edit_distance(const char *a, const char *b);
const char *cm_closest_name(const char *word, const char *const *cands, int n);

/* The library version string ("0.1.0"). */
const char *cm_version(void);

/* ---------------------------------------------------------------------------------------------
 * Logging
 * ------------------------------------------------------------------------------------------- */

typedef enum cm_log_level {
    CM_LOG_DEBUG = 0,
    CM_LOG_INFO = 1,
    CM_LOG_WARN = 2,
    CM_LOG_ERROR = 3,
    CM_LOG_OFF = 4,
} cm_log_level;

/* Writes one line to stderr if `level` is at or above the current level. The default level comes
 * from the environment variable CM_LOG (debug, info, warn, error, off; default info), read on the
 * first call. Lines look like "[composer info] <prefix>message". Thread-safe. */
void cm_log_msg(cm_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void cm_log_set_level(cm_log_level level);
cm_log_level cm_log_get_level(void);

/* Parses "debug", "info", "warn", "error" or "off". CM_ERR_INVALID_ARG on anything else. */
cm_status cm_log_level_parse(const char *s, cm_log_level *out);

/* A prefix hook: called for each line to write a prefix such as "[rank 3] " into buf (at most
 * `cap` bytes including the NUL). NULL removes the hook. The distributed layer installs one. */
typedef void (*cm_log_prefix_fn)(char *buf, size_t cap, void *data);
void cm_log_set_prefix(cm_log_prefix_fn fn, void *data);

/* ---------------------------------------------------------------------------------------------
 * Allocator hooks
 * ------------------------------------------------------------------------------------------- */

/* All long-lived library memory goes through these hooks (arenas, tensors, gradients). */
typedef struct cm_allocator_i {
    int abi;                                           /* set to CM_ALLOCATOR_ABI */
    void *(*alloc)(size_t bytes, size_t align, void *data); /* NULL on failure */
    void (*free)(void *ptr, void *data);
    void *data;
} cm_allocator_i;
#define CM_ALLOCATOR_ABI 1

/* Installs an allocator; NULL restores the default (aligned malloc). Not thread-safe: call before
 * any other library call, or while no other thread uses the library. Memory must be freed by the
 * allocator that allocated it, so tests install an allocator around a self-contained scenario. */
void cm_set_allocator(const cm_allocator_i *a);

/* Allocates `bytes` aligned to `align` (a power of two, ≥ sizeof(void*)) through the hook. On
 * failure returns NULL and records CM_ERR_OOM with the size. cm_free(NULL) is a no-op. */
void *cm_alloc(size_t bytes, size_t align);
void *cm_alloc_zeroed(size_t bytes, size_t align);
void cm_free(void *ptr);

/* Testing aid: make the Nth allocation from now on fail (1 = the next one), then succeed again.
 * n = 0 disables. Counts cm_alloc calls on all threads. Returns the number of allocations made
 * since the last call to this function. */
int64_t cm_alloc_fail_at(int64_t n);

/* ---------------------------------------------------------------------------------------------
 * Arena: bump allocation with a byte budget
 * ------------------------------------------------------------------------------------------- */

typedef struct cm_arena cm_arena;

/* Creates an arena that hands out at most `budget` bytes (0 = unlimited) between resets. Memory is
 * kept across resets. With the default allocator it is address space reserved for the machine's
 * memory (or the budget, if smaller) and committed page by page as allocations touch it, so
 * positions are contiguous and nothing is wasted between allocations; with hooks installed
 * (cm_set_allocator), or where the kernel refuses the reservation, it is taken from the allocator
 * in chunks as needed, and a request that does not fit the rest of a chunk skips it. Errors:
 * CM_ERR_OOM. */
cm_status cm_arena_new(size_t budget, cm_arena **out);

/* Where an arena's chunks come from, for memory the host does not address directly (a GPU's: the
 * tensor layer's device arenas). alloc returns NULL after recording an error with cm_set_error
 * (CM_ERR_OOM for an out-of-memory, so callers can catch it); fill, used to poison new allocations,
 * may be NULL (no poisoning). The arena never reads or writes chunk memory itself otherwise. */
typedef struct cm_arena_allocator {
    void *(*alloc)(void *ctx, size_t bytes);
    void (*free)(void *ctx, void *p);
    cm_status (*fill)(void *ctx, void *p, int byte, size_t bytes);
    void *ctx;
    size_t granule; /* chunks are multiples of this many bytes (a power of two; 0 = no constraint): the
                     * unit the allocator hands memory out in, so no chunk has bytes behind it that the
                     * arena cannot use (a GPU's virtual memory maps 2 MiB at a time) */
    /* Optional, all three or none: one range of address space that grows in place, as a host
     * arena's reservation does. reserve(ctx, max_bytes, &cap) reserves up to max_bytes (0: as much
     * as the allocator thinks sensible) and says how much in *cap, or returns NULL (then chunks come
     * from alloc, as without it); commit(ctx, base, n) makes [0, n) of it usable (n a multiple of
     * granule, growing only; an error recorded, CM_ERR_OOM for out-of-memory, when it cannot);
     * release(ctx, base) gives it back. The arena commits as its position grows (an eighth more
     * than it holds, 1 to 16 granules), so the memory behind it is its high-water mark and no request
     * skips a chunk's tail (a GPU tape's arena: cuMemAddressReserve, then cuMemMap). */
    void *(*reserve)(void *ctx, size_t max_bytes, size_t *cap);
    cm_status (*commit)(void *ctx, void *base, size_t bytes);
    void (*release)(void *ctx, void *base);
} cm_arena_allocator;

/* As cm_arena_new, with chunks from `al` (copied; NULL = the allocator hook). */
cm_status cm_arena_new_with(size_t budget, const cm_arena_allocator *al, cm_arena **out);
void cm_arena_free(cm_arena *a);

/* Returns `bytes` of 64-byte-aligned memory, or NULL with CM_ERR_OOM recorded (the message gives
 * the request, the bytes in use and the budget) when the budget or the system is exhausted.
 * Not thread-safe: one arena per thread. */
void *cm_arena_alloc(cm_arena *a, size_t bytes);

/* Forgets every allocation; the memory is reused by later allocations. Keeps the peak. */
void cm_arena_reset(cm_arena *a);
/* As cm_arena_reset, and gives all its memory back (the pages to the system): later allocations
 * lay out memory as in a new arena (over chunks, how positions fall in them, and so what a budget
 * admits, depends on the chunks: a layout grown by small requests wastes more chunk tails on large
 * ones). */
void cm_arena_trim(cm_arena *a);

/* A mark/rewind pair: cm_arena_rewind(a, m) frees everything allocated after cm_arena_mark(a). */
size_t cm_arena_mark(const cm_arena *a);
void cm_arena_rewind(cm_arena *a, size_t mark);

size_t cm_arena_used(const cm_arena *a);   /* bytes handed out since the last reset */
size_t cm_arena_peak(const cm_arena *a);   /* the largest cm_arena_used() ever seen */
size_t cm_arena_budget(const cm_arena *a); /* 0 = unlimited */
void cm_arena_set_budget(cm_arena *a, size_t budget);
void cm_arena_reset_peak(cm_arena *a);

/* When on, every allocation is filled with 0xFF bytes (a NaN for floats), so a kernel that forgets
 * to write part of its output is caught by the tests. Off by default. */
void cm_arena_set_poison(cm_arena *a, bool on);

/* A function the arena calls when an allocation fails (over the budget, or the system refused):
 * the request, the bytes in use and the budget (0 = none), after the error is recorded. For
 * OOMObserver. It must not allocate from this arena. NULL fn removes it. */
typedef void (*cm_arena_oom_fn)(size_t request, size_t used, size_t budget, void *data);
void cm_arena_set_oom_hook(cm_arena *a, cm_arena_oom_fn fn, void *data);

/* ---------------------------------------------------------------------------------------------
 * Threads
 * ------------------------------------------------------------------------------------------- */

/* The number of threads kernels use: CM_NUM_THREADS from the environment if set (read on first
 * use), else the number of online cores. Applies to OpenMP and to OpenBLAS (which uses the same
 * OpenMP runtime, so the two never run on top of each other). */
int cm_num_threads(void);

/* Sets the thread count for OpenMP and BLAS. n < 1 is CM_ERR_INVALID_ARG. Call from the main
 * thread outside parallel regions. */
cm_status cm_set_num_threads(int n);

/* ---------------------------------------------------------------------------------------------
 * Counter-based random numbers (Philox-4x32-10)
 * ------------------------------------------------------------------------------------------- */

/* A stream of random numbers fully described by (seed, stream, counter): no hidden state, so any
 * draw can be reproduced, checkpointed (save the three fields) and skipped to in O(1). Each block
 * of four 32-bit words consumes one counter value. Transparent plain data. */
typedef struct cm_rng {
    uint64_t seed;
    uint64_t stream;
    uint64_t counter;
} cm_rng;

cm_rng cm_rng_init(uint64_t seed, uint64_t stream);

/* Philox-4x32-10 on an explicit 128-bit counter and 64-bit key, as Random123 defines it (for
 * known-answer tests and for reproducing streams outside the library). */
void cm_philox4x32_raw(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* The raw generator: four 32-bit words for one (seed, stream, counter) block. */
void cm_philox4x32(uint64_t seed, uint64_t stream, uint64_t counter, uint32_t out[4]);

/* Fill `n` values and advance rng->counter by the number of blocks used: ceil(n / 4) for uniform,
 * normal and bernoulli (value i comes from block counter + i / 4), ceil(n / 2) for randint (two
 * words per draw). Filling in pieces equals filling at once when each piece is a whole number of
 * blocks. Thread-safe for distinct cm_rng. */
void cm_rng_uniform(cm_rng *rng, float *out, size_t n, float lo, float hi); /* [lo, hi) */
void cm_rng_normal(cm_rng *rng, float *out, size_t n, float mean, float std);
void cm_rng_bernoulli(cm_rng *rng, uint8_t *out, size_t n, float p);       /* 1 with prob. p */
/* Integers in [lo, hi) (hi > lo), from 64-bit draws by multiply-shift: bias below (hi-lo)/2^64. */
void cm_rng_randint(cm_rng *rng, int64_t *out, size_t n, int64_t lo, int64_t hi);

/* Stateless scalar helpers: the uniform float in [0, 1) at word `index` of the stream. */
float cm_rng_uniform_at(uint64_t seed, uint64_t stream, uint64_t index);

/* ---------------------------------------------------------------------------------------------
 * Hashing and clocks
 * ------------------------------------------------------------------------------------------- */

/* XXH3-64 of `n` bytes with a seed (0 is XXH3's default). Stable across versions and machines. */
uint64_t cm_hash64(const void *data, size_t n, uint64_t seed);

/* Monotonic clock in nanoseconds (arbitrary origin) and seconds. */
uint64_t cm_clock_ns(void);
double cm_clock_s(void);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_BASE_H */
