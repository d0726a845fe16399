/* The base layer: status codes and messages, logging levels, allocator hook, arena budget and
 * rewinding, Philox known answers and distributions, hashing, clocks, threads. */
#include "cmtest.h"

#include <criterion/redirect.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

Test(status, names_descriptions_and_thread_local_message) {
    cr_assert_str_eq(cm_status_name(CM_ERR_SHAPE), "CM_ERR_SHAPE");
    cr_assert_str_eq(cm_status_name(CM_OK), "CM_OK");
    cr_assert_str_eq(cm_status_name((cm_status)-999), "CM_ERR_?");
    cr_assert_str_eq(cm_status_str(CM_ERR_OOM), "out of memory");
    cr_assert_str_eq(cm_status_name(CM_ERR_TIMEOUT), "CM_ERR_TIMEOUT");
    cr_assert_str_eq(cm_status_str(CM_ERR_TIMEOUT), "timed out");
    cr_assert_eq(CM_ERR_TIMEOUT, -12, "statuses are dense and append-only: the value is part of the ABI");
    cr_assert_eq(cm_set_error(CM_ERR_IO, "open '%s' failed: %s", "x.bin", "no such file"), CM_ERR_IO);
    cr_assert_str_eq(cm_last_error(), "open 'x.bin' failed: no such file");
    cr_assert_eq(cm_last_status(), CM_ERR_IO);
    /* a message may quote the previous one */
    cm_set_error(CM_ERR_IO, "while loading: %s", cm_last_error());
    cr_assert_str_eq(cm_last_error(), "while loading: open 'x.bin' failed: no such file");
    cm_clear_error();
    cr_assert_str_eq(cm_last_error(), "");
    cr_assert_eq(cm_last_status(), CM_OK);
    cr_assert_str_eq(cm_version(), "0.1.0");
}

Test(log, level_parsing_accepts_names_and_rejects_others) {
    cm_log_level lv;
    cr_assert_eq(cm_log_level_parse("debug", &lv), CM_OK);
    cr_assert_eq(lv, CM_LOG_DEBUG);
    cr_assert_eq(cm_log_level_parse("WARN", &lv), CM_OK);
    cr_assert_eq(lv, CM_LOG_WARN);
    cr_assert_eq(cm_log_level_parse("loud", &lv), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "loud") && strstr(cm_last_error(), "debug, info, warn, error"), "%s",
              cm_last_error());
    cm_log_set_level(CM_LOG_ERROR);
    cr_assert_eq(cm_log_get_level(), CM_LOG_ERROR);
    cm_log_msg(CM_LOG_INFO, "this line is below the level and not printed");
    cm_log_set_level(CM_LOG_INFO);
}

static void rank_prefix(char *buf, size_t cap, void *data) { snprintf(buf, cap, "[rank %d] ", *(int *)data); }

Test(log, prefix_hook_is_applied, .init = cr_redirect_stderr) {
    int rank = 3;
    cm_log_set_level(CM_LOG_INFO);
    cm_log_set_prefix(rank_prefix, &rank);
    cm_log_msg(CM_LOG_WARN, "hello %d", 7);
    cm_log_set_prefix(NULL, NULL);
    fflush(stderr);
    cr_assert_stderr_eq_str("[composer warn] [rank 3] hello 7\n");
}

Test(alloc, fail_at_nth_allocation_then_recover) {
    cm_alloc_fail_at(2);
    void *a = cm_alloc(16, 16);
    void *b = cm_alloc(16, 16);
    void *c = cm_alloc(16, 16);
    cr_assert_not_null(a);
    cr_assert_null(b, "the 2nd allocation must fail");
    cr_assert_eq(cm_last_status(), CM_ERR_OOM);
    cr_assert(strstr(cm_last_error(), "16 bytes"), "%s", cm_last_error());
    cr_assert_not_null(c);
    cr_assert_eq(cm_alloc_fail_at(0), 3);
    cm_free(a);
    cm_free(c);
    cm_free(NULL);
}

/* Every allocation inside tape creation + a small forward/backward can fail; each failure must be a
 * clean CM_ERR_OOM (no crash, no leak under ASan). */
Test(alloc, every_failing_allocation_in_a_training_step_is_clean) {
    for (int n = 1; n < 64; n++) {
        cm_alloc_fail_at(n);
        cm_tape *tp = NULL;
        cm_status st = cm_tape_new(NULL, &tp);
        cm_tensor *w = NULL;
        int64_t s[2] = {4, 3};
        if (st == CM_OK) st = cm_tensor_new(CM_DTYPE_F32, 2, s, &w);
        if (st == CM_OK) st = cm_tensor_set_requires_grad(w, true);
        if (st == CM_OK) {
            cm_tensor *y = cm_exp(tp, cm_mul(tp, w, w));
            cm_tensor *ones = cm_full(tp, CM_DTYPE_F32, 2, s, 1.0);
            if (y && ones) st = cm_tape_backward_with(tp, y, ones);
            else st = cm_tape_status(tp);
        }
        int64_t made = cm_alloc_fail_at(0);
        cr_assert(st == CM_OK || st == CM_ERR_OOM, "n=%d: status %s (%s)", n, cm_status_name(st), cm_last_error());
        cm_tensor_free(w);
        cm_tape_free(tp);
        if (made < n) break; /* the step needed fewer allocations than n: all failure points covered */
    }
}

Test(arena, budget_is_an_oom_error_with_numbers) {
    cm_arena *a;
    cr_assert_eq(cm_arena_new(4096, &a), CM_OK);
    void *p = cm_arena_alloc(a, 1000);
    cr_assert_not_null(p);
    cr_assert_eq((uintptr_t)p % 64, 0, "64-byte alignment");
    cr_assert_not_null(cm_arena_alloc(a, 2000));
    cr_assert_null(cm_arena_alloc(a, 2000));
    cr_assert_eq(cm_last_status(), CM_ERR_OOM);
    cr_assert(strstr(cm_last_error(), "2000") && strstr(cm_last_error(), "4096"), "%s", cm_last_error());
    cr_assert_eq(cm_arena_used(a), 1024 + 2048);
    cm_arena_reset(a);
    cr_assert_eq(cm_arena_used(a), 0);
    cr_assert_eq(cm_arena_peak(a), 1024 + 2048);
    cr_assert_not_null(cm_arena_alloc(a, 4000), "after reset the budget is free again");
    cm_arena_free(a);
}

/* The lane-parallel bernoulli draws word k of the stream for output k, like the scalar definition
 * (cm_rng_uniform_at), for lengths that end mid-group and a stream that does not start at 0; the
 * counter advances by one per four outputs. Large n takes the parallel path. */
Test(rng, bernoulli_is_the_streams_uniforms_below_p) {
    const size_t ns[] = {1, 3, 63, 64, 65, 1000, 300001};
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
        const size_t n = ns[t];
        cm_rng r = cm_rng_init(0x1234567890abcdefull, 77);
        r.counter = 5 + t;
        const uint64_t c0 = r.counter;
        uint8_t *m = malloc(n);
        cm_rng_bernoulli(&r, m, n, 0.37f);
        for (size_t k = 0; k < n; k++)
            cr_assert_eq(m[k], cm_rng_uniform_at(r.seed, r.stream, c0 * 4 + k) < 0.37f ? 1 : 0, "n %zu, output %zu", n,
                         k);
        cr_assert_eq(r.counter, c0 + (n + 3) / 4);
        free(m);
    }
}

Test(arena, reset_reuses_the_same_memory_for_the_same_steps) {
    /* a repeating step gets the same addresses after a reset: no fresh pages to fault in (64 KiB
     * requests fill the 1, 1, 2, 4, ... MiB chunks exactly, so no tail is skipped and the chunks stay) */
    cm_arena *a;
    cr_assert_eq(cm_arena_new(0, &a), CM_OK);
    enum { NS = 300 };
    static void *first[NS];
    for (int i = 0; i < NS; i++) cr_assert_not_null(first[i] = cm_arena_alloc(a, 64 << 10));
    for (int step = 0; step < 3; step++) {
        cm_arena_reset(a);
        for (int i = 0; i < NS; i++) cr_assert_eq(cm_arena_alloc(a, 64 << 10), first[i], "step %d alloc %d", step, i);
    }
    cm_arena_free(a);
}

/* Requests of 1, 3, 5 and 9 MiB after small ones: over chunks grown as needed (1, 3, 4, 8, 16 MiB)
 * the 64 bytes take a 4 MiB chunk and the 9 MiB do not fit what the 5 and 1 left of theirs. */
static const size_t k_tail_sizes[] = {100, 700 * 1024, 3 << 20, 64, 5 << 20, 1 << 20, 9 << 20};
enum { K_TAILS = sizeof k_tail_sizes / sizeof k_tail_sizes[0] };

static size_t arena_step(cm_arena *a, void **at) {
    size_t exact = 0;
    for (int i = 0; i < K_TAILS; i++) {
        cr_assert_not_null(at[i] = cm_arena_alloc(a, k_tail_sizes[i]), "alloc %d: %s", i, cm_last_error());
        exact += (k_tail_sizes[i] + 63) & ~(size_t)63;
    }
    return exact;
}

static int overcommit_mode(void) {
    FILE *f = fopen("/proc/sys/vm/overcommit_memory", "r");
    int m = -1;
    if (f) {
        if (fscanf(f, "%d", &m) != 1) m = -1;
        fclose(f);
    }
    return m;
}

Test(arena, a_host_arena_lays_every_step_out_without_gaps) {
    /* The first chunk reserves address space for the machine's memory, so no request skips a tail
     * (where the kernel accounts strictly, mode 2, the reservation is refused and chunks grow). */
    if (overcommit_mode() == 2) cr_skip_test("vm.overcommit_memory is 2: no address-space reservation");
    cm_arena *a;
    cr_assert_eq(cm_arena_new(0, &a), CM_OK);
    void *first[K_TAILS], *again[K_TAILS];
    const size_t exact = arena_step(a, first);
    cr_assert_eq(cm_arena_used(a), exact, "no tail skipped: %zu used for %zu bytes", cm_arena_used(a), exact);
    for (int i = 1; i < K_TAILS; i++)
        cr_assert_eq((char *)first[i], (char *)first[i - 1] + ((k_tail_sizes[i - 1] + 63) & ~(size_t)63), "%d", i);
    for (int step = 0; step < 3; step++) {
        cm_arena_reset(a);
        arena_step(a, again);
        for (int i = 0; i < K_TAILS; i++) cr_assert_eq(again[i], first[i], "step %d alloc %d", step, i);
    }
    cm_arena_free(a);
}

static size_t g_hook_bytes;
static void *counting_alloc(size_t bytes, size_t align, void *data) {
    (void)data;
    g_hook_bytes += bytes;
    void *p = NULL;
    return posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, bytes) ? NULL : p;
}
static void counting_free(void *p, void *data) {
    (void)data;
    free(p);
}

Test(arena, a_users_allocator_hooks_get_the_chunks) {
    /* with hooks installed nothing bypasses them: chunks grow through them as needed, and a request
     * that does not fit a chunk's rest skips it */
    cm_allocator_i hooks = {CM_ALLOCATOR_ABI, counting_alloc, counting_free, NULL};
    cm_set_allocator(&hooks);
    g_hook_bytes = 0;
    cm_arena *a;
    cr_assert_eq(cm_arena_new(0, &a), CM_OK);
    void *at[K_TAILS];
    const size_t exact = arena_step(a, at);
    const size_t used = cm_arena_used(a);
    cm_arena_free(a);
    cm_set_allocator(NULL);
    cr_assert_geq(g_hook_bytes, (size_t)32 << 20, "the chunks (1 + 3 + 4 + 8 + 16 MiB) came from the hooks: %zu", g_hook_bytes);
    cr_assert_gt(used, exact + exact / 8, "tails skipped over grown chunks: %zu used for %zu bytes", used, exact);
}

/* An arena allocator handing memory out in 2 MiB granules, as a GPU's virtual memory maps it: every chunk it is asked for is a whole number of granules. */
static size_t g_chunk_sizes[16];
static int g_n_chunks;
static void *granule_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    if (g_n_chunks < 16) g_chunk_sizes[g_n_chunks++] = bytes;
    return malloc(bytes);
}
static void granule_free(void *ctx, void *p) {
    (void)ctx;
    free(p);
}

Test(arena, a_custom_allocators_granule_sizes_every_chunk) {
    const size_t granule = (size_t)2 << 20;
    cm_arena_allocator al = {granule_alloc, granule_free, NULL, NULL, granule, NULL, NULL, NULL};
    cm_arena *a;
    g_n_chunks = 0;
    cr_assert_eq(cm_arena_new_with(0, &al, &a), CM_OK, "%s", cm_last_error());
    cr_assert_not_null(cm_arena_alloc(a, 100));              /* a first chunk: 1 MiB, rounded to 2 */
    cr_assert_not_null(cm_arena_alloc(a, (3 << 20) + 1));    /* does not fit: a chunk of at least 3 MiB + 1 */
    cr_assert_not_null(cm_arena_alloc(a, ((size_t)5 << 20) + 7));
    cm_arena_free(a);
    cr_assert_geq(g_n_chunks, 3);
    for (int i = 0; i < g_n_chunks; i++)
        cr_expect_eq(g_chunk_sizes[i] % granule, 0, "chunk %d of %zu bytes is whole granules", i, g_chunk_sizes[i]);
    cr_expect_eq(g_chunk_sizes[0], granule, "the first chunk is one granule, not the arena's 1 MiB");
    cr_expect_eq(g_chunk_sizes[1], (size_t)4 << 20, "3 MiB + 1 byte rounds to 2 granules");

    al.granule = 3 << 20;
    cr_assert_eq(cm_arena_new_with(0, &al, &a), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "granule 3145728 is not a power of two"), "%s", cm_last_error());
}

/* A growable range as a GPU's virtual memory gives one (the tape's device arena): address space
 * reserved without access, made usable from its start as the arena commits (mprotect here). */
static struct {
    int reserves, commits, releases, allocs;
    size_t max_asked, cap, committed, refuse_above;
    char *base;
} g_grow;
static void *grow_reserve(void *ctx, size_t max_bytes, size_t *cap) {
    (void)ctx;
    g_grow.reserves++;
    g_grow.max_asked = max_bytes;
    if (!g_grow.cap) return NULL; /* no virtual memory: chunks */
    void *p = mmap(NULL, g_grow.cap, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    cr_assert_neq(p, MAP_FAILED);
    g_grow.base = p;
    g_grow.committed = 0;
    *cap = g_grow.cap;
    return p;
}
static cm_status grow_commit(void *ctx, void *base, size_t bytes) {
    (void)ctx;
    cr_assert_eq(base, g_grow.base);
    cr_assert_gt(bytes, g_grow.committed, "commits only grow: %zu after %zu", bytes, g_grow.committed);
    if (g_grow.refuse_above && bytes > g_grow.refuse_above)
        return cm_set_error(CM_ERR_OOM, "test device: out of memory at %zu bytes", bytes);
    cr_assert_eq(mprotect(g_grow.base, bytes, PROT_READ | PROT_WRITE), 0);
    g_grow.commits++;
    g_grow.committed = bytes;
    return CM_OK;
}
static void grow_release(void *ctx, void *base) {
    (void)ctx;
    cr_assert_eq(base, g_grow.base);
    munmap(base, g_grow.cap);
    g_grow.releases++;
}
static void *grow_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    g_grow.allocs++;
    return malloc(bytes);
}

Test(arena, a_growable_range_holds_the_high_water_mark_not_chunks) {
    const size_t g = (size_t)64 << 10; /* the granule */
    memset(&g_grow, 0, sizeof g_grow);
    g_grow.cap = (size_t)256 << 20;
    cm_arena_allocator al = {grow_alloc, granule_free, NULL, NULL, g, grow_reserve, grow_commit, grow_release};
    cm_arena *a;
    cr_assert_eq(cm_arena_new_with(0, &al, &a), CM_OK, "%s", cm_last_error());
    /* what made the chunked device arena hold twice its peak: a request as large as all before it,
     * then a small one that no longer fits the chunk's tail */
    char *p1 = cm_arena_alloc(a, 100);
    char *p2 = cm_arena_alloc(a, (size_t)24 << 20);
    char *p3 = cm_arena_alloc(a, 16 << 10);
    cr_assert(p1 && p2 && p3, "%s", cm_last_error());
    cr_expect_eq(g_grow.reserves, 1);
    cr_expect_eq(g_grow.max_asked, 0, "no budget: as much as the allocator offers");
    cr_expect_eq(g_grow.allocs, 0, "no chunks from alloc");
    cr_expect(p1 == g_grow.base && p2 == p1 + 128 && p3 == p2 + ((size_t)24 << 20), "one range, no skipped tail");
    memset(p2, 1, (size_t)24 << 20); /* committed: writable */
    memset(p3, 2, 16 << 10);
    const size_t used = cm_arena_used(a);
    cr_expect_eq(g_grow.committed % g, 0);
    cr_expect_geq(g_grow.committed, used);
    cr_expect_leq(g_grow.committed, used + 16 * g, "committed %zu for %zu in use", g_grow.committed, used);
    const int commits = g_grow.commits;
    cr_expect_leq(commits, 3, "%d commits", commits);

    /* a step repeats in what it has: no new commits */
    cm_arena_reset(a);
    cr_assert_eq(cm_arena_alloc(a, 100), p1);
    cr_assert_not_null(cm_arena_alloc(a, (size_t)24 << 20));
    cr_assert_not_null(cm_arena_alloc(a, 16 << 10));
    cr_expect_eq(g_grow.commits, commits);

    /* the device refuses the step (16 granules here) but has room for what is asked: just enough */
    const size_t before = g_grow.committed;
    g_grow.refuse_above = before + 4 * g;
    char *p4 = cm_arena_alloc(a, before - cm_arena_used(a) + g);
    cr_assert_not_null(p4, "%s", cm_last_error());
    cr_expect_eq(g_grow.committed, before + g, "committed %zu after %zu", g_grow.committed, before);
    /* and refuses outright: an out-of-memory naming the request and the device's reason, nothing moved */
    const size_t pos = cm_arena_used(a);
    cr_assert_null(cm_arena_alloc(a, 8 * g));
    cr_expect_eq(cm_last_status(), CM_ERR_OOM);
    cr_expect(strstr(cm_last_error(), "arena request of 524288 bytes") && strstr(cm_last_error(), "test device"), "%s",
              cm_last_error());
    cr_expect_eq(cm_arena_used(a), pos);
    g_grow.refuse_above = 0;
    cr_assert_not_null(cm_arena_alloc(a, 8 * g), "room again: %s", cm_last_error());

    /* trim gives the range back; the next request reserves again */
    cm_arena_trim(a);
    cr_expect_eq(g_grow.releases, 1);
    cr_assert_not_null(cm_arena_alloc(a, 100));
    cr_expect_eq(g_grow.reserves, 2);
    cm_arena_free(a);
    cr_expect_eq(g_grow.releases, 2);

    /* a budget is what is reserved; where no range can be reserved, chunks as before */
    memset(&g_grow, 0, sizeof g_grow);
    cr_assert_eq(cm_arena_new_with((size_t)8 << 20, &al, &a), CM_OK);
    cr_assert_not_null(cm_arena_alloc(a, 100));
    cr_expect_eq(g_grow.max_asked, (size_t)8 << 20);
    cr_expect_eq(g_grow.allocs, 1, "no range: a chunk from alloc");
    cm_arena_free(a);

    al.release = NULL;
    cr_assert_eq(cm_arena_new_with(0, &al, &a), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "reserve, commit and release go together"), "%s", cm_last_error());
}

Test(arena, an_injected_failure_reaches_the_reservation) {
    cm_arena *a;
    cr_assert_eq(cm_arena_new(0, &a), CM_OK);
    cm_alloc_fail_at(1);
    cr_assert_null(cm_arena_alloc(a, 100));
    cr_assert_eq(cm_last_status(), CM_ERR_OOM);
    cr_assert(strstr(cm_last_error(), "arena request of 100 bytes"), "%s", cm_last_error());
    cm_alloc_fail_at(0);
    cr_assert_not_null(cm_arena_alloc(a, 100), "the next try succeeds");
    cm_arena_free(a);
}

Test(arena, grows_in_chunks_and_rewinds) {
    cm_arena *a;
    cr_assert_eq(cm_arena_new(0, &a), CM_OK);
    char *p1 = cm_arena_alloc(a, 100);
    size_t m = cm_arena_mark(a);
    for (int i = 0; i < 10; i++) cr_assert_not_null(cm_arena_alloc(a, 700 * 1024)); /* spans chunks */
    cr_assert_gt(cm_arena_used(a), (size_t)7000 * 1024);
    cm_arena_rewind(a, m);
    cr_assert_eq(cm_arena_used(a), m);
    char *p2 = cm_arena_alloc(a, 100);
    cr_assert_eq(p2, p1 + 128, "rewind reuses memory");
    cm_arena_reset(a);
    for (int i = 0; i < 10; i++) cr_assert_not_null(cm_arena_alloc(a, 700 * 1024));
    cm_arena_set_poison(a, true);
    float *f = cm_arena_alloc(a, 4 * sizeof(float));
    cr_assert(isnan(f[0]) && isnan(f[3]), "poisoned memory reads as NaN");
    cm_arena_free(a);
}

Test(tape, arena_budget_exceeded_is_oom_on_the_tape) {
    cm_tape_config c = cm_tape_config_default();
    c.arena_budget = 64 * 1024;
    cm_tape *tp;
    cr_assert_eq(cm_tape_new(&c, &tp), CM_OK);
    int64_t s[2] = {128, 128}; /* 64 KiB of f32: with the struct it cannot fit */
    cm_tensor *t = cm_zeros(tp, CM_DTYPE_F32, 2, s);
    cr_assert_null(t);
    cr_assert_eq(cm_tape_status(tp), CM_ERR_OOM);
    cr_assert(strstr(cm_tape_error(tp), "(128, 128)") && strstr(cm_tape_error(tp), "budget"), "%s",
              cm_tape_error(tp));
    cm_tape_reset(tp);
    cr_assert_eq(cm_tape_status(tp), CM_OK, "reset clears the error");
    int64_t s2[2] = {16, 16};
    cr_assert_not_null(cm_zeros(tp, CM_DTYPE_F32, 2, s2));
    cm_tape_free(tp);
}

Test(rng, philox_matches_random123_known_answers) {
    /* Known-answer vectors from Random123's kat_vectors (philox4x32_10). */
    const uint32_t c0[4] = {0, 0, 0, 0}, k0[2] = {0, 0}, e0[4] = {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8};
    const uint32_t c1[4] = {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, k1[2] = {0xffffffff, 0xffffffff},
                   e1[4] = {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd};
    const uint32_t c2[4] = {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, k2[2] = {0xa4093822, 0x299f31d0},
                   e2[4] = {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1};
    uint32_t out[4];
    cm_philox4x32_raw(c0, k0, out);
    for (int i = 0; i < 4; i++) cr_assert_eq(out[i], e0[i], "zero vector word %d: %08x vs %08x", i, out[i], e0[i]);
    cm_philox4x32_raw(c1, k1, out);
    for (int i = 0; i < 4; i++) cr_assert_eq(out[i], e1[i], "ones vector word %d: %08x vs %08x", i, out[i], e1[i]);
    cm_philox4x32_raw(c2, k2, out);
    for (int i = 0; i < 4; i++) cr_assert_eq(out[i], e2[i], "pi vector word %d: %08x vs %08x", i, out[i], e2[i]);
}

Test(rng, draws_are_reproducible_and_resumable) {
    float a[64], b[64];
    cm_rng r1 = cm_rng_init(42, 3), r2 = cm_rng_init(42, 3);
    cm_rng_uniform(&r1, a, 64, 0, 1);
    cm_rng_uniform(&r2, b, 32, 0, 1);
    cm_rng_uniform(&r2, b + 32, 32, 0, 1);
    cr_assert_eq(r1.counter, 16);
    cr_assert_eq(memcmp(a, b, sizeof a), 0, "filling in whole blocks equals filling at once");
    for (int i = 0; i < 64; i++) cr_assert_eq(a[i], cm_rng_uniform_at(42, 3, (uint64_t)i));
    cm_rng r3 = cm_rng_init(42, 4);
    cm_rng_uniform(&r3, b, 64, 0, 1);
    cr_assert_neq(memcmp(a, b, sizeof a), 0, "another stream differs");
}

Test(rng, distributions_have_the_right_moments) {
    enum { N = 200000 };
    float *x = malloc(sizeof(float) * N);
    cm_rng r = cm_rng_init(7, 0);
    cm_rng_normal(&r, x, N, 2.0f, 3.0f);
    double s = 0, s2 = 0;
    for (int i = 0; i < N; i++) s += x[i], s2 += (double)x[i] * x[i];
    double mean = s / N, var = s2 / N - mean * mean;
    cr_assert(fabs(mean - 2.0) < 0.03, "normal mean %g", mean);
    cr_assert(fabs(sqrt(var) - 3.0) < 0.03, "normal std %g", sqrt(var));
    cm_rng_uniform(&r, x, N, -1.0f, 3.0f);
    s = 0;
    float lo = 1e9f, hi = -1e9f;
    for (int i = 0; i < N; i++) s += x[i], lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]);
    cr_assert(fabs(s / N - 1.0) < 0.02 && lo >= -1.0f && hi < 3.0f, "uniform mean %g range [%g, %g]", s / N, lo, hi);
    uint8_t *m = malloc(N);
    cm_rng_bernoulli(&r, m, N, 0.3f);
    long ones = 0;
    for (int i = 0; i < N; i++) ones += m[i];
    cr_assert(fabs((double)ones / N - 0.3) < 0.005, "bernoulli rate %g", (double)ones / N);
    int64_t *k = malloc(sizeof(int64_t) * N);
    cm_rng_randint(&r, k, N, -5, 5);
    long hist[10] = {0};
    for (int i = 0; i < N; i++) {
        cr_assert(k[i] >= -5 && k[i] < 5, "randint out of range: %lld", (long long)k[i]);
        hist[k[i] + 5]++;
    }
    for (int i = 0; i < 10; i++) cr_assert(labs(hist[i] - N / 10) < N / 100, "randint bucket %d: %ld", i, hist[i]);
    free(x);
    free(m);
    free(k);
}

Test(hash, xxh3_is_stable) {
    /* XXH3_64bits("", 0) and of "abc" with seed 0 are fixed by the XXH3 specification. */
    cr_assert_eq(cm_hash64("", 0, 0), 0x2D06800538D394C2ull, "%016llx", (unsigned long long)cm_hash64("", 0, 0));
    cr_assert_eq(cm_hash64("abc", 3, 0), cm_hash64("abc", 3, 0));
    cr_assert_neq(cm_hash64("abc", 3, 0), cm_hash64("abc", 3, 1));
}

Test(clock, is_monotonic) {
    uint64_t a = cm_clock_ns(), b = cm_clock_ns();
    cr_assert_geq(b, a);
    cr_assert_gt(cm_clock_s(), 0.0);
}

Test(threads, count_is_settable_and_validated) {
    int n = cm_num_threads();
    cr_assert_geq(n, 1);
    cr_assert_eq(cm_set_num_threads(0), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_set_num_threads(1), CM_OK);
    cr_assert_eq(cm_num_threads(), 1);
    cr_assert_eq(cm_set_num_threads(n), CM_OK);
}
