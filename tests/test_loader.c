/* The dataloader over a small synthetic dataset: every epoch visits each sample once on 1..8 ranks,
 * rank slices put together give the single-rank batch, jumping equals iterating, any number of
 * workers and any prefetch depth give identical batches, drop_last, evaluation padding, token
 * counts, worker errors with the sample index, shutdown mid-epoch, bad configs and OOM. */
#include "cmtest.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Sample i: "x" f32 (3,) = (i, epoch + seed/1000, training), "y" i64 () = i; tokens i % 5 + 1.
 * Fails with CM_ERR_IO on sample fail_at (if >= 0). spin > 0 burns that many hash rounds. */
typedef struct synth {
    int64_t n;
    _Atomic int64_t fail_at; /* changed by the test while workers prefetch */
    int spin;
    atomic_int calls;
    _Atomic uint64_t sink;
    cm_field_desc fields[2];
} synth;

static int64_t synth_len(void *self) { return ((synth *)self)->n; }
static int synth_n_fields(void *self) {
    (void)self;
    return 2;
}
static const cm_field_desc *synth_field(void *self, int i) { return &((synth *)self)->fields[i]; }
static cm_status synth_get(void *self, int64_t index, const cm_sample_ctx *ctx, void *const *out) {
    synth *s = self;
    atomic_fetch_add(&s->calls, 1);
    if (index == s->fail_at) return cm_set_error(CM_ERR_IO, "synthetic: record %lld is corrupt", (long long)index);
    uint64_t h = (uint64_t)index;
    for (int k = 0; k < s->spin; k++) h = cm_hash64(&h, sizeof h, (uint64_t)k);
    atomic_store_explicit(&s->sink, h, memory_order_relaxed); /* keeps the spin from being optimised away */
    float *x = out[0];
    x[0] = (float)index;
    x[1] = (float)ctx->epoch + (float)(ctx->seed % 1000) / 1000.0f;
    x[2] = ctx->training ? 1.0f : 0.0f;
    *(int64_t *)out[1] = index;
    return CM_OK;
}
static int64_t synth_tokens(void *self, int64_t index) {
    (void)self;
    return index % 5 + 1;
}
static void synth_close(void *self) { free(self); }

static const cm_dataset_i synth_vt = {CM_DATASET_ABI, "synthetic", synth_len, synth_n_fields, synth_field,
                                      synth_get, synth_tokens, synth_close};

static cm_dataset *synth_new(int64_t n, synth **impl) {
    synth *s = calloc(1, sizeof *s);
    s->n = n;
    s->fail_at = -1;
    s->fields[0] = (cm_field_desc){.name = "x", .dtype = CM_DTYPE_F32, .ndim = 1, .shape = {3}};
    s->fields[1] = (cm_field_desc){.name = "y", .dtype = CM_DTYPE_I64, .ndim = 0};
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_new(&synth_vt, s, &ds), CM_OK, "%s", cm_last_error());
    if (impl) *impl = s;
    return ds;
}

static cm_dataloader *loader(const cm_dataset *ds, cm_dataloader_config cfg) {
    cm_dataloader *dl;
    cr_assert_eq(cm_dataloader_new(ds, &cfg, &dl), CM_OK, "%s", cm_last_error());
    return dl;
}

static cm_batch *next_batch(cm_dataloader *dl) {
    cm_batch *b;
    cr_assert_eq(cm_dataloader_next(dl, &b), CM_OK, "%s", cm_last_error());
    return b;
}

/* Checks a batch's internal consistency: y equals indices, x[0] equals y, masks and counts. */
static void check_batch(const cm_batch *b) {
    cr_assert_eq(b->n_fields, 2);
    cr_assert_eq(b->n_rows, b->n_samples + b->n_padded);
    cr_assert_eq(cm_tensor_dim(b->fields[0], 0), b->n_rows);
    cr_assert_eq(cm_batch_field(b, "y"), b->fields[1]);
    const float *x = cm_tensor_data(b->fields[0]);
    const int64_t *y = cm_tensor_data(b->fields[1]);
    int64_t tokens = 0;
    for (int64_t j = 0; j < b->n_rows; j++) {
        cr_assert_eq(b->valid[j], j < b->n_samples, "row %lld valid %d with %lld samples", (long long)j, b->valid[j],
                     (long long)b->n_samples);
        if (b->valid[j]) {
            cr_assert_eq(y[j], b->indices[j], "row %lld: y %lld, index %lld", (long long)j, (long long)y[j],
                         (long long)b->indices[j]);
            tokens += b->indices[j] % 5 + 1;
            cr_assert_eq(b->row_tokens[j], b->indices[j] % 5 + 1);
        } else {
            cr_assert_eq(b->indices[j], -1);
            cr_assert_eq(b->row_tokens[j], 0);
        }
        cr_assert_eq((int64_t)x[3 * j], y[j]);
        cr_assert_eq((int64_t)x[3 * j + 1], b->epoch, "row %lld (index %lld) drawn for epoch %g, batch epoch %lld",
                     (long long)j, (long long)y[j], x[3 * j + 1], (long long)b->epoch);
    }
    cr_assert_eq(b->n_tokens, tokens, "batch tokens %lld, rows sum to %lld", (long long)b->n_tokens, (long long)tokens);
}

Test(loader, every_epoch_visits_each_sample_once_on_1_to_8_ranks) {
    const int64_t n = 103;
    cm_dataset *ds = synth_new(n, NULL);
    const int64_t batches[] = {10, 13, 7, 103};
    int *count = calloc((size_t)n, sizeof(int));
    for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++)
        for (int N = 1; N <= 8; N++)
            for (int drop = 0; drop < 2; drop++) {
                const int64_t B = batches[bi];
                for (int64_t epoch = 0; epoch < 2; epoch++) {
                    memset(count, 0, (size_t)n * sizeof(int));
                    int64_t total = 0;
                    for (int r = 0; r < N; r++) {
                        cm_dataloader_config cfg = cm_dataloader_config_default();
                        cfg.batch_size = B, cfg.seed = 5, cfg.rank = r, cfg.world_size = N, cfg.drop_last = drop;
                        cm_dataloader *dl = loader(ds, cfg);
                        cr_assert_eq(cm_dataloader_set_state(dl, (cm_dataloader_state){epoch, 0}), CM_OK);
                        cm_batch *b;
                        int64_t steps = 0;
                        while ((b = next_batch(dl))) {
                            check_batch(b);
                            cr_assert_eq(b->epoch, epoch);
                            cr_assert_eq(b->step, steps);
                            for (int64_t j = 0; j < b->n_samples; j++) count[b->indices[j]]++;
                            total += b->n_samples;
                            steps++;
                        }
                        cr_assert_eq(steps, cm_dataloader_steps_per_epoch(dl));
                        cr_assert_eq(cm_dataloader_get_state(dl).epoch, epoch + 1);
                        cm_dataloader_free(dl);
                    }
                    const int64_t want = drop ? n / B * B : n;
                    cr_assert_eq(total, want, "B %lld N %d drop %d: %lld samples in the epoch, want %lld",
                                 (long long)B, N, drop, (long long)total, (long long)want);
                    for (int64_t i = 0; i < n; i++)
                        cr_assert_leq(count[i], 1, "B %lld N %d drop %d epoch %lld: sample %lld seen %d times",
                                      (long long)B, N, drop, (long long)epoch, (long long)i, count[i]);
                }
            }
    free(count);
    cm_dataset_free(ds);
}

Test(loader, rank_slices_put_together_equal_the_single_rank_batch) {
    const int64_t n = 50, B = 13; /* 13 does not divide over 2..8 ranks, and 50 % 13 = 11 */
    cm_dataset *ds = synth_new(n, NULL);
    cm_dataloader_config cfg = cm_dataloader_config_default();
    cfg.batch_size = B, cfg.seed = 11, cfg.drop_last = false;
    cm_dataloader *one = loader(ds, cfg);
    for (int N = 2; N <= 8; N++) {
        cm_dataloader *dls[8];
        for (int r = 0; r < N; r++) {
            cm_dataloader_config c = cfg;
            c.rank = r, c.world_size = N, c.num_workers = r % 3;
            dls[r] = loader(ds, c);
        }
        cm_dataloader_set_state(one, (cm_dataloader_state){0, 0});
        for (int step = 0; step < 10; step++) { /* crosses the epoch boundary after 4 steps */
            cm_batch *g = next_batch(one);
            int64_t off = 0, lo = B, hi = 0;
            for (int r = 0; r < N; r++) {
                cm_batch *b = next_batch(dls[r]);
                cr_assert_eq(!b, !g, "N %d step %d rank %d: end of epoch disagrees", N, step, r);
                if (!b) continue;
                check_batch(b);
                cr_assert_eq(b->global_n_samples, g->n_samples);
                cr_assert_eq(b->global_n_tokens, g->n_tokens);
                cr_assert_eq(b->rank_offset, off);
                for (int64_t j = 0; j < b->n_samples; j++) {
                    cr_assert_eq(b->indices[j], g->indices[off + j],
                                 "N %d step %d rank %d row %lld: index %lld, single rank has %lld at %lld", N, step, r,
                                 (long long)j, (long long)b->indices[j], (long long)g->indices[off + j],
                                 (long long)(off + j));
                    cr_assert(!memcmp((float *)cm_tensor_data(b->fields[0]) + 3 * j,
                                      (float *)cm_tensor_data(g->fields[0]) + 3 * (off + j), 3 * sizeof(float)));
                }
                off += b->n_samples;
                lo = b->n_samples < lo ? b->n_samples : lo;
                hi = b->n_samples > hi ? b->n_samples : hi;
            }
            if (g) {
                cr_assert_eq(off, g->n_samples, "N %d step %d: ranks hold %lld of %lld", N, step, (long long)off,
                             (long long)g->n_samples);
                cr_assert_leq(hi - lo, 1, "N %d step %d: rank shares %lld..%lld", N, step, (long long)lo,
                              (long long)hi);
            }
        }
        for (int r = 0; r < N; r++) cm_dataloader_free(dls[r]);
    }
    cm_dataloader_free(one);
    cm_dataset_free(ds);
}

/* A compact record of a batch: its indices and a hash of its bytes. */
typedef struct rec {
    bool end;
    int64_t epoch, step, n_rows;
    uint64_t hash;
    cm_dataloader_state after;
} rec;

static rec record(cm_dataloader *dl) {
    cm_batch *b = next_batch(dl);
    rec r = {.end = !b, .after = cm_dataloader_get_state(dl)};
    if (b) {
        check_batch(b);
        r.epoch = b->epoch, r.step = b->step, r.n_rows = b->n_rows;
        r.hash = cm_hash64(cm_tensor_data(b->fields[0]), cm_tensor_nbytes(b->fields[0]), 1) ^
                 cm_hash64(b->indices, (size_t)b->n_rows * sizeof(int64_t), 2) ^
                 cm_hash64(cm_tensor_data(b->fields[1]), cm_tensor_nbytes(b->fields[1]), 3);
    }
    return r;
}

static void assert_same(const rec *a, const rec *b, const char *what, int i) {
    cr_assert_eq(a->end, b->end, "%s, call %d: end of epoch %d vs %d", what, i, a->end, b->end);
    cr_assert(a->epoch == b->epoch && a->step == b->step && a->n_rows == b->n_rows,
              "%s, call %d: (epoch %lld, step %lld, rows %lld) vs (%lld, %lld, %lld)", what, i, (long long)a->epoch,
              (long long)a->step, (long long)a->n_rows, (long long)b->epoch, (long long)b->step, (long long)b->n_rows);
    cr_assert_eq(a->hash, b->hash, "%s, call %d (epoch %lld step %lld): batch contents differ", what, i,
                 (long long)a->epoch, (long long)a->step);
    cr_assert(a->after.epoch == b->after.epoch && a->after.position == b->after.position,
              "%s, call %d: state after (%lld, %lld) vs (%lld, %lld)", what, i, (long long)a->after.epoch,
              (long long)a->after.position, (long long)b->after.epoch, (long long)b->after.position);
}

#define N_CALLS 20

Test(loader, jump_to_a_state_equals_iterating_to_it) {
    cm_dataset *ds = synth_new(37, NULL);
    cm_dataloader_config cfg = cm_dataloader_config_default();
    cfg.batch_size = 8, cfg.seed = 3, cfg.rank = 1, cfg.world_size = 3; /* 4 steps, then end of epoch */
    cm_dataloader *dl = loader(ds, cfg);
    rec ref[N_CALLS];
    cm_dataloader_state before[N_CALLS];
    for (int i = 0; i < N_CALLS; i++) {
        before[i] = cm_dataloader_get_state(dl);
        ref[i] = record(dl);
    }
    cm_dataloader_free(dl);
    cr_assert(ref[4].end && ref[9].end && !ref[5].end, "4 batches per epoch, then the end-of-epoch call");
    /* each start: a fresh loader, and one that already ran ahead with prefetching workers */
    const int starts[] = {0, 2, 3, 4, 5, 9, 11, 14};
    for (size_t k = 0; k < sizeof starts / sizeof starts[0]; k++)
        for (int workers = 0; workers <= 2; workers += 2) {
            cm_dataloader_config c = cfg;
            c.num_workers = workers;
            cm_dataloader *j = loader(ds, c);
            if (workers) (void)record(j), (void)record(j);
            const int s = starts[k];
            cr_assert_eq(cm_dataloader_set_state(j, before[s]), CM_OK);
            for (int i = s; i < N_CALLS; i++) {
                char what[96];
                snprintf(what, sizeof what, "jump to (%lld, %lld) with %d workers", (long long)before[s].epoch,
                         (long long)before[s].position, workers);
                rec r = record(j);
                assert_same(&r, &ref[i], what, i);
            }
            cm_dataloader_free(j);
        }
    /* the state after the last batch of an epoch, (e, 32), and (e + 1, 0) both lead to epoch e + 1 */
    cr_assert(before[4].epoch == 0 && before[4].position == 32 && before[5].epoch == 1 && before[5].position == 0);
    cm_dataset_free(ds);
}

Test(loader, any_number_of_workers_and_prefetch_depth_gives_identical_batches) {
    synth *impl;
    cm_dataset *ds = synth_new(61, &impl);
    impl->spin = 20;
    const int workers[] = {0, 1, 2, 4};
    const int depths[] = {1, 3};
    for (int mode = 0; mode < 2; mode++) {
        rec ref[N_CALLS];
        for (size_t w = 0; w < 4; w++)
            for (size_t d = 0; d < 2; d++) {
                cm_dataloader_config cfg = mode ? cm_dataloader_config_eval() : cm_dataloader_config_default();
                cfg.batch_size = 16, cfg.seed = 9, cfg.rank = 1, cfg.world_size = 2;
                cfg.num_workers = workers[w], cfg.prefetch_depth = depths[d];
                cm_dataloader *dl = loader(ds, cfg);
                for (int i = 0; i < N_CALLS; i++) {
                    rec r = record(dl);
                    if (w == 0 && d == 0) {
                        ref[i] = r;
                    } else {
                        char what[64];
                        snprintf(what, sizeof what, "%s, %d workers, depth %d", mode ? "eval" : "train", workers[w],
                                 depths[d]);
                        assert_same(&r, &ref[i], what, i);
                    }
                }
                cm_dataloader_free(dl);
            }
    }
    cm_dataset_free(ds);
}

Test(loader, drop_last_drops_only_the_partial_final_batch) {
    cm_dataset *ds = synth_new(10, NULL);
    for (int drop = 0; drop < 2; drop++) {
        cm_dataloader_config cfg = cm_dataloader_config_default();
        cfg.batch_size = 4, cfg.drop_last = drop, cfg.num_workers = 1;
        cm_dataloader *dl = loader(ds, cfg);
        cr_assert_eq(cm_dataloader_steps_per_epoch(dl), drop ? 2 : 3);
        cr_assert_eq(cm_dataloader_samples_per_epoch(dl), drop ? 8 : 10);
        int64_t sizes[4] = {0}, k = 0;
        cm_batch *b;
        while ((b = next_batch(dl))) sizes[k++] = b->n_samples;
        cr_assert_eq(k, drop ? 2 : 3);
        cr_assert(sizes[0] == 4 && sizes[1] == 4 && (drop || sizes[2] == 2), "sizes %lld %lld %lld",
                  (long long)sizes[0], (long long)sizes[1], (long long)sizes[2]);
        cm_dataloader_free(dl);
    }
    cm_dataset_free(ds);
}

Test(loader, evaluation_pads_ranks_equally_and_masks_the_padding) {
    const int64_t n = 10, B = 4;
    cm_dataset *ds = synth_new(n, NULL);
    for (int N = 1; N <= 8; N++) {
        int count[10] = {0};
        cm_dataloader *dls[8];
        for (int r = 0; r < N; r++) {
            cm_dataloader_config cfg = cm_dataloader_config_eval();
            cfg.batch_size = B, cfg.rank = r, cfg.world_size = N, cfg.num_workers = r % 2;
            dls[r] = loader(ds, cfg);
            cr_assert_eq(cm_dataloader_steps_per_epoch(dls[r]), 3);
        }
        for (int step = 0; step < 3; step++) {
            const int64_t gb = step < 2 ? B : n - 2 * B, rows = (gb + N - 1) / N;
            for (int r = 0; r < N; r++) {
                cm_batch *b = next_batch(dls[r]);
                check_batch(b);
                cr_assert_eq(b->n_rows, rows, "N %d step %d rank %d: %lld rows, every rank needs %lld", N, step, r,
                             (long long)b->n_rows, (long long)rows);
                cr_assert_eq(b->global_n_samples, gb);
                const float *x = cm_tensor_data(b->fields[0]);
                for (int64_t j = 0; j < b->n_rows; j++) {
                    if (b->valid[j]) count[b->indices[j]]++;
                    cr_assert_eq(x[3 * j + 2], 0.0f, "evaluation samples are drawn with training = false");
                }
                /* a padding row is a real sample's data (the global batch's first) */
                if (b->n_padded) cr_assert_eq((int64_t)x[3 * (b->n_rows - 1)], step * B);
            }
        }
        for (int r = 0; r < N; r++) {
            cr_assert_null(next_batch(dls[r]));
            cm_dataloader_free(dls[r]);
        }
        for (int i = 0; i < n; i++)
            cr_assert_eq(count[i], 1, "N %d: sample %d counted %d times by the masks", N, i, count[i]);
    }
    cm_dataset_free(ds);
}

Test(loader, training_flag_seed_and_sequential_order_reach_the_dataset) {
    cm_dataset *ds = synth_new(6, NULL);
    cm_dataloader_config cfg = cm_dataloader_config_default();
    cfg.batch_size = 6, cfg.shuffle = false, cfg.seed = 1234;
    cm_dataloader *dl = loader(ds, cfg);
    cm_batch *b = next_batch(dl);
    const float *x = cm_tensor_data(b->fields[0]);
    for (int64_t j = 0; j < 6; j++) {
        cr_assert_eq(b->indices[j], j, "no shuffle: row %lld is sample %lld", (long long)j, (long long)b->indices[j]);
        cr_assert_float_eq(x[3 * j + 1], 0.234f, 1e-6, "seed 1234 -> ctx.seed: %g", x[3 * j + 1]);
        cr_assert_eq(x[3 * j + 2], 1.0f, "training loader: ctx.training");
    }
    cr_assert_eq(b->n_tokens, 1 + 2 + 3 + 4 + 5 + 1);
    cr_assert_eq(b->global_n_tokens, b->n_tokens);
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
}

Test(loader, worker_error_names_the_sample_and_the_loader_stays_at_the_batch) {
    synth *impl;
    cm_dataset *ds = synth_new(40, &impl);
    for (int workers = 0; workers <= 2; workers++) {
        cm_dataloader_config cfg = cm_dataloader_config_default();
        cfg.batch_size = 8, cfg.shuffle = false, cfg.num_workers = workers;
        impl->fail_at = 19; /* the third batch of epoch 0: positions 16..23 */
        cm_dataloader *dl = loader(ds, cfg);
        next_batch(dl);
        next_batch(dl);
        for (int attempt = 0; attempt < 2; attempt++) {
            cm_batch *b = (cm_batch *)1;
            cm_status st = cm_dataloader_next(dl, &b);
            cr_assert_eq(st, CM_ERR_IO, "%d workers: status %s", workers, cm_status_name(st));
            cr_assert_null(b);
            const char *m = cm_last_error();
            cr_assert(strstr(m, "sample 19") && strstr(m, "epoch 0") && strstr(m, "synthetic") &&
                          strstr(m, "record 19 is corrupt"),
                      "%d workers: message '%s'", workers, m);
            cm_dataloader_state s = cm_dataloader_get_state(dl);
            cr_assert(s.epoch == 0 && s.position == 16, "state after the error: (%lld, %lld), want (0, 16)",
                      (long long)s.epoch, (long long)s.position);
        }
        impl->fail_at = -1; /* the file is repaired: the retry yields the batch */
        cm_batch *b = next_batch(dl);
        cr_assert(b && b->indices[0] == 16 && b->n_samples == 8);
        check_batch(b);
        cm_dataloader_free(dl);
    }
    cm_dataset_free(ds);
}

Test(loader, free_mid_epoch_joins_busy_workers) {
    synth *impl;
    cm_dataset *ds = synth_new(5000, &impl);
    impl->spin = 200;
    cm_dataloader_config cfg = cm_dataloader_config_default();
    cfg.batch_size = 256, cfg.num_workers = 4, cfg.prefetch_depth = 4;
    cm_dataloader *dl = loader(ds, cfg);
    check_batch(next_batch(dl));
    cm_dataloader_free(dl); /* workers are filling the next batches */
    dl = loader(ds, cfg);   /* and freeing before the first batch */
    cm_dataloader_free(dl);
    cm_dataloader_free(NULL);
    cm_dataset_free(ds);
}

Test(loader, bad_configs_and_states_are_rejected_with_the_value) {
    cm_dataset *ds = synth_new(10, NULL);
    cm_dataloader *dl = (cm_dataloader *)1;
    cm_dataloader_config c = cm_dataloader_config_default();
    c.batch_size = 0;
    cr_assert_eq(cm_dataloader_new(ds, &c, &dl), CM_ERR_INVALID_ARG);
    cr_assert_null(dl);
    cr_assert(strstr(cm_last_error(), "batch_size 0"), "%s", cm_last_error());
    c = cm_dataloader_config_default();
    c.num_workers = -1;
    cr_assert_eq(cm_dataloader_new(ds, &c, &dl), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "num_workers -1"), "%s", cm_last_error());
    c = cm_dataloader_config_default();
    c.prefetch_depth = 0;
    cr_assert_eq(cm_dataloader_new(ds, &c, &dl), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "prefetch_depth 0"), "%s", cm_last_error());
    c = cm_dataloader_config_default();
    c.batch_size = 4, c.rank = 2, c.world_size = 2;
    cr_assert_eq(cm_dataloader_new(ds, &c, &dl), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "rank 2 of world_size 2"), "%s", cm_last_error());
    c = cm_dataloader_config_default();
    c.batch_size = 11;
    cr_assert_eq(cm_dataloader_new(ds, &c, &dl), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "10 samples") && strstr(cm_last_error(), "drop_last"), "%s", cm_last_error());
    c.drop_last = false; /* then one short batch per epoch is fine */
    dl = loader(ds, c);
    cr_assert_eq(next_batch(dl)->n_samples, 10);
    cr_assert_eq(cm_dataloader_set_state(dl, (cm_dataloader_state){0, 11}), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "position 11"), "%s", cm_last_error());
    cr_assert_eq(cm_dataloader_set_state(dl, (cm_dataloader_state){-1, 0}), CM_ERR_INVALID_ARG);
    cm_dataloader_state s = cm_dataloader_get_state(dl);
    cr_assert(s.epoch == 0 && s.position == 10, "a rejected state leaves the loader where it was");
    cr_assert_null(next_batch(dl));
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
}

Test(loader, out_of_memory_at_any_allocation_is_reported_without_leaks) {
    cm_dataset *ds = synth_new(20, NULL);
    cm_dataloader_config c = cm_dataloader_config_default();
    c.batch_size = 4, c.num_workers = 2;
    for (int64_t k = 1;; k++) {
        cm_alloc_fail_at(k);
        cm_dataloader *dl;
        cm_status st = cm_dataloader_new(ds, &c, &dl);
        cm_batch *b = NULL;
        if (st == CM_OK) st = cm_dataloader_next(dl, &b);
        cm_alloc_fail_at(0);
        if (st == CM_OK) {
            cr_assert_not_null(b);
            cm_dataloader_free(dl);
            cr_assert_gt(k, 3, "some allocation must have been hit");
            break;
        }
        cr_assert_eq(st, CM_ERR_OOM, "allocation %lld: %s", (long long)k, cm_last_error());
        if (dl) cm_dataloader_free(dl);
    }
    cm_dataset_free(ds);
}

Test(loader, resume_on_a_different_world_size_sees_the_same_global_batches) {
    cm_dataset *ds = synth_new(45, NULL);
    cm_dataloader_config cfg = cm_dataloader_config_default();
    cfg.batch_size = 10, cfg.seed = 77; /* 4 steps per epoch */
    cm_dataloader *ref = loader(ds, cfg);
    int64_t want[12][10];
    bool end[12];
    for (int i = 0; i < 12; i++) {
        cm_batch *b = next_batch(ref);
        end[i] = !b;
        if (b) memcpy(want[i], b->indices, sizeof want[i]);
    }
    cm_dataloader_free(ref);
    /* train 3 steps on 2 ranks, save the state */
    cm_dataloader_state saved[2];
    for (int r = 0; r < 2; r++) {
        cm_dataloader_config c = cfg;
        c.rank = r, c.world_size = 2;
        cm_dataloader *dl = loader(ds, c);
        for (int i = 0; i < 3; i++) next_batch(dl);
        saved[r] = cm_dataloader_get_state(dl);
        cm_dataloader_free(dl);
    }
    cr_assert(saved[0].epoch == saved[1].epoch && saved[0].position == saved[1].position && saved[0].position == 30,
              "every rank saves the same global state");
    /* resume on 3 ranks: 10 samples split 4, 3, 3 */
    cm_dataloader *dls[3];
    for (int r = 0; r < 3; r++) {
        cm_dataloader_config c = cfg;
        c.rank = r, c.world_size = 3, c.num_workers = r;
        dls[r] = loader(ds, c);
        cr_assert_eq(cm_dataloader_set_state(dls[r], saved[0]), CM_OK);
    }
    for (int i = 3; i < 12; i++) {
        int64_t off = 0;
        for (int r = 0; r < 3; r++) {
            cm_batch *b = next_batch(dls[r]);
            cr_assert_eq(!b, end[i], "call %d rank %d: end of epoch disagrees", i, r);
            if (!b) continue;
            for (int64_t j = 0; j < b->n_samples; j++)
                cr_assert_eq(b->indices[j], want[i][off + j], "call %d rank %d row %lld: %lld, reference %lld", i, r,
                             (long long)j, (long long)b->indices[j], (long long)want[i][off + j]);
            off += b->n_samples;
        }
        if (!end[i]) cr_assert_eq(off, 10);
    }
    for (int r = 0; r < 3; r++) cm_dataloader_free(dls[r]);
    cm_dataset_free(ds);
}

/* ---- trim_padding (llm-foundry's allow_pad_trimming) ----
 * Sample i of a padded text-like dataset, L = 20: row length n = (7 i) % 21 (0 .. 20, empty rows
 * included); "input_ids" i32 (L) = 100 i + t then 0; "attention_mask" f32 (L) = 1 then 0 (a float
 * mask: any dtype works); "pair" i64 (L, 2) = (i, t) then (-1, -1); "other" i32 (5) and "label"
 * i64 () are not sequence fields. */
enum { RG_L = 20 };
typedef struct ragged {
    int64_t n;
    int n_fields; /* 5, or 4 without the mask */
    cm_field_desc fields[5];
} ragged;
static int64_t rg_len(void *self) { return ((ragged *)self)->n; }
static int rg_n_fields(void *self) { return ((ragged *)self)->n_fields; }
static const cm_field_desc *rg_field(void *self, int i) { return &((ragged *)self)->fields[i]; }
static int64_t rg_row_len(int64_t i) { return 7 * i % 21; }
static cm_status rg_get(void *self, int64_t i, const cm_sample_ctx *ctx, void *const *out) {
    (void)ctx;
    const ragged *r = self;
    const int64_t n = rg_row_len(i);
    int32_t *ids = out[0];
    int64_t *pair = out[1];
    for (int64_t t = 0; t < RG_L; t++) {
        ids[t] = t < n ? (int32_t)(100 * i + t) : 0;
        pair[2 * t] = t < n ? i : -1;
        pair[2 * t + 1] = t < n ? t : -1;
    }
    for (int k = 0; k < 5; k++) ((int32_t *)out[2])[k] = (int32_t)(i + k);
    *(int64_t *)out[3] = i % 2;
    if (r->n_fields == 5)
        for (int64_t t = 0; t < RG_L; t++) ((float *)out[4])[t] = t < n ? 1.0f : 0.0f;
    return CM_OK;
}
static void rg_close(void *self) { free(self); }
static const cm_dataset_i ragged_vt = {.abi = CM_DATASET_ABI, .type_name = "ragged", .len = rg_len,
                                       .n_fields = rg_n_fields, .field = rg_field, .get = rg_get, .close = rg_close};
static cm_dataset *ragged_new(int64_t n, bool with_mask) {
    ragged *r = calloc(1, sizeof *r);
    r->n = n;
    r->n_fields = with_mask ? 5 : 4;
    r->fields[0] = (cm_field_desc){.name = "input_ids", .dtype = CM_DTYPE_I32, .ndim = 1, .shape = {RG_L}};
    r->fields[1] = (cm_field_desc){.name = "pair", .dtype = CM_DTYPE_I64, .ndim = 2, .shape = {RG_L, 2}};
    r->fields[2] = (cm_field_desc){.name = "other", .dtype = CM_DTYPE_I32, .ndim = 1, .shape = {5}};
    r->fields[3] = (cm_field_desc){.name = "label", .dtype = CM_DTYPE_I64, .ndim = 0};
    r->fields[4] = (cm_field_desc){.name = "attention_mask", .dtype = CM_DTYPE_F32, .ndim = 1, .shape = {RG_L}};
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_new(&ragged_vt, r, &ds), CM_OK, "%s", cm_last_error());
    return ds;
}

Test(loader, trim_padding_cuts_each_batch_to_its_longest_row_and_keeps_everything_else) {
    cm_dataset *ds = ragged_new(53, true);
    const int64_t multiples[] = {1, 8, 32};
    int64_t n_cut = 0, n_batches = 0, lengths_seen = 0;
    for (int mode = 0; mode < 2; mode++)
        for (int world = 1; world <= 3; world += 2)
            for (int mi = 0; mi < 3; mi++)
                for (int workers = 0; workers <= 2; workers += 2) {
                    const int64_t m = multiples[mi];
                    cm_dataloader_config ref_cfg = mode ? cm_dataloader_config_eval() : cm_dataloader_config_default();
                    ref_cfg.batch_size = 6, ref_cfg.seed = 5, ref_cfg.world_size = world, ref_cfg.rank = world - 1;
                    ref_cfg.drop_last = false;
                    cm_dataloader_config cfg = ref_cfg;
                    cfg.trim_padding = true, cfg.pad_to_multiple_of = m, cfg.num_workers = workers;
                    cm_dataloader *ref = loader(ds, ref_cfg), *dl = loader(ds, cfg);
                    uint32_t seen = 0;
                    for (int step = 0; step < 40; step++) {
                        cm_batch *a = next_batch(ref), *b = next_batch(dl);
                        cr_assert_eq(!a, !b);
                        if (!a) break;
                        n_batches++;
                        cr_assert_eq(b->n_rows, a->n_rows);
                        int64_t longest = 0;
                        for (int64_t r = 0; r < a->n_rows; r++) {
                            cr_assert_eq(b->indices[r], a->indices[r]);
                            const int64_t idx = a->indices[r] >= 0 ? a->indices[r] : a->indices[0];
                            if (rg_row_len(idx) > longest) longest = rg_row_len(idx);
                        }
                        int64_t want = (longest + m - 1) / m * m;
                        if (want < 1) want = m;
                        if (want > RG_L) want = RG_L;
                        n_cut += want < RG_L;
                        if (want < 32) seen |= 1u << want;
                        for (int f = 0; f < 5; f++) {
                            const cm_tensor *ta = a->fields[f], *tb = b->fields[f];
                            cr_assert_str_eq(b->names[f], a->names[f]);
                            const bool seq = f != 2 && f != 3;
                            cr_assert_eq(cm_tensor_ndim(tb), cm_tensor_ndim(ta));
                            cr_assert_eq(cm_tensor_dim(tb, 0), a->n_rows);
                            for (int k = 1; k < cm_tensor_ndim(ta); k++)
                                cr_assert_eq(cm_tensor_dim(tb, k), k == 1 && seq ? want : cm_tensor_dim(ta, k),
                                             "mode %d world %d multiple %lld: field '%s' dim %d is %lld", mode, world,
                                             (long long)m, a->names[f], k, (long long)cm_tensor_dim(tb, k));
                            const int64_t per_row_a = a->n_rows ? cm_tensor_numel(ta) / a->n_rows : 0;
                            const int64_t per_row_b = a->n_rows ? cm_tensor_numel(tb) / a->n_rows : 0;
                            const int64_t per_pos = seq ? per_row_a / RG_L : per_row_a;
                            for (int64_t r = 0; r < a->n_rows; r++)
                                for (int64_t e = 0; e < per_row_a; e++) {
                                    const double va = cm_tensor_get_flat(ta, r * per_row_a + e);
                                    if (!seq || e / per_pos < want) {
                                        const double vb = cm_tensor_get_flat(tb, r * per_row_b + e);
                                        cr_assert_eq(vb, va, "field '%s' row %lld element %lld: %g, untrimmed %g",
                                                     a->names[f], (long long)r, (long long)e, vb, va);
                                    } else {
                                        /* what was cut is padding only */
                                        cr_assert(va == 0.0 || va == -1.0, "field '%s' row %lld: cut a real value %g",
                                                  a->names[f], (long long)r, va);
                                    }
                                }
                        }
                    }
                    if (m == 1) lengths_seen += __builtin_popcount(seen);
                    cm_dataloader_free(dl);
                    cm_dataloader_free(ref);
                }
    cr_assert_gt(n_cut, n_batches / 2, "most batches are cut (%lld of %lld)", (long long)n_cut, (long long)n_batches);
    cr_assert_gt(lengths_seen, 8, "batches of many different lengths (%lld)", (long long)lengths_seen);
    cm_dataset_free(ds);
}

Test(loader, trim_padding_needs_an_attention_mask_and_a_positive_multiple) {
    cm_dataset *bare = ragged_new(10, false), *ds = ragged_new(10, true);
    cm_dataloader_config cfg = cm_dataloader_config_default();
    cfg.batch_size = 4;
    cfg.trim_padding = true;
    cm_dataloader *dl = NULL;
    cr_assert_eq(cm_dataloader_new(bare, &cfg, &dl), CM_ERR_NOT_FOUND);
    cr_assert(!dl);
    cr_assert(strstr(cm_last_error(), "attention_mask") && strstr(cm_last_error(), "ragged") &&
                  strstr(cm_last_error(), "trim_padding"),
              "%s", cm_last_error());
    cfg.pad_to_multiple_of = 0;
    cr_assert_eq(cm_dataloader_new(ds, &cfg, &dl), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "pad_to_multiple_of 0"), "%s", cm_last_error());
    cfg.trim_padding = false; /* the multiple is not looked at without trimming */
    dl = loader(ds, cfg);
    cr_assert_eq(cm_tensor_dim(next_batch(dl)->fields[0], 1), RG_L);
    cm_dataloader_free(dl);
    cm_dataset_free(bare);
    cm_dataset_free(ds);
}
