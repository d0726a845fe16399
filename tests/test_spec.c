/* The data spec: microbatch views with a short last one, sample and token counts (also with
 * evaluation padding), custom counters, batch and microbatch transforms and their errors. */
#include "cmtest.h"

#include <stdlib.h>
#include <string.h>

/* Sample i: "x" f32 (2,) = (i, -i); tokens i + 1. */
typedef struct synth {
    int64_t n;
    cm_field_desc field;
} synth;
static int64_t synth_len(void *self) { return ((synth *)self)->n; }
static int synth_n_fields(void *self) {
    (void)self;
    return 1;
}
static const cm_field_desc *synth_field(void *self, int i) {
    (void)i;
    return &((synth *)self)->field;
}
static cm_status synth_get(void *self, int64_t index, const cm_sample_ctx *ctx, void *const *out) {
    (void)self, (void)ctx;
    float *x = out[0];
    x[0] = (float)index;
    x[1] = -(float)index;
    return CM_OK;
}
static int64_t synth_tokens(void *self, int64_t index) {
    (void)self;
    return index + 1;
}
static void synth_close(void *self) { free(self); }
static const cm_dataset_i synth_vt = {CM_DATASET_ABI, "synthetic", synth_len, synth_n_fields, synth_field,
                                      synth_get, synth_tokens, synth_close};

static cm_dataset *synth_new(int64_t n) {
    synth *s = calloc(1, sizeof *s);
    s->n = n;
    s->field = (cm_field_desc){.name = "x", .dtype = CM_DTYPE_F32, .ndim = 1, .shape = {2}};
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_new(&synth_vt, s, &ds), CM_OK, "%s", cm_last_error());
    return ds;
}

static cm_dataloader *seq_loader(cm_dataset *ds, cm_dataloader_config cfg) {
    cfg.shuffle = false;
    cm_dataloader *dl;
    cr_assert_eq(cm_dataloader_new(ds, &cfg, &dl), CM_OK, "%s", cm_last_error());
    return dl;
}

Test(spec, split_gives_views_with_a_short_last_microbatch_and_exact_counts) {
    cm_dataset *ds = synth_new(30);
    cm_dataloader_config cfg = cm_dataloader_config_default();
    cfg.batch_size = 10;
    cm_dataloader *dl = seq_loader(ds, cfg);
    cm_data_spec *sp;
    cr_assert_eq(cm_data_spec_new(dl, NULL, &sp), CM_OK);
    cr_assert_eq(cm_data_spec_loader(sp), dl);
    cm_batch *b;
    cr_assert_eq(cm_data_spec_next(sp, &b), CM_OK);
    cr_assert_eq(cm_data_spec_n_samples(sp, b), 10);
    cr_assert_eq(cm_data_spec_n_tokens(sp, b), 55); /* 1 + ... + 10 */
    const int64_t sizes[] = {1, 3, 4, 10, 11};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        const int64_t m = sizes[k];
        cm_batch *mbs;
        int64_t n;
        cr_assert_eq(cm_data_spec_split(sp, b, m, &mbs, &n), CM_OK, "%s", cm_last_error());
        cr_assert_eq(n, (10 + m - 1) / m, "m %lld: %lld microbatches", (long long)m, (long long)n);
        int64_t samples = 0, tokens = 0;
        for (int64_t i = 0; i < n; i++) {
            const cm_batch *mb = &mbs[i];
            const int64_t want_rows = (i + 1) * m <= 10 ? m : 10 - i * m;
            cr_assert_eq(mb->n_rows, want_rows, "m %lld microbatch %lld: %lld rows, want %lld", (long long)m,
                         (long long)i, (long long)mb->n_rows, (long long)want_rows);
            cr_assert_eq(mb->microbatch, i);
            cr_assert_eq(cm_tensor_dim(mb->fields[0], 0), want_rows);
            cr_assert_eq(cm_tensor_dim(mb->fields[0], 1), 2);
            /* a view: same memory as the batch's rows */
            cr_assert_eq((float *)cm_tensor_data(mb->fields[0]), (float *)cm_tensor_data(b->fields[0]) + 2 * i * m);
            cr_assert_eq(mb->indices[0], i * m);
            cr_assert_eq(mb->global_n_samples, 10);
            cr_assert_eq(mb->global_n_tokens, 55);
            cr_assert_eq(mb->step, 0);
            int64_t t = 0;
            for (int64_t j = 0; j < mb->n_rows; j++) t += i * m + j + 1;
            cr_assert_eq(mb->n_tokens, t, "microbatch %lld: %lld tokens, rows sum to %lld", (long long)i,
                         (long long)mb->n_tokens, (long long)t);
            cr_assert_eq(cm_data_spec_n_tokens(sp, mb), t);
            samples += cm_data_spec_n_samples(sp, mb);
            tokens += mb->n_tokens;
        }
        cr_assert_eq(samples, 10);
        cr_assert_eq(tokens, 55);
    }
    cm_data_spec_free(sp);
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
}

Test(spec, split_of_a_padded_evaluation_batch_counts_only_real_samples) {
    cm_dataset *ds = synth_new(10);
    cm_dataloader_config cfg = cm_dataloader_config_eval();
    cfg.batch_size = 8, cfg.rank = 2, cfg.world_size = 3; /* step 1: 2 samples over 3 ranks; rank 2 pads */
    cm_dataloader *dl = seq_loader(ds, cfg);
    cm_data_spec *sp;
    cr_assert_eq(cm_data_spec_new(dl, NULL, &sp), CM_OK);
    cm_batch *b, *mbs;
    int64_t n;
    cr_assert_eq(cm_data_spec_next(sp, &b), CM_OK);
    cr_assert(b->n_rows == 3 && b->n_samples == 2 && b->n_padded == 1, "step 0 rank 2: %lld rows %lld samples",
              (long long)b->n_rows, (long long)b->n_samples);
    cr_assert_eq(cm_data_spec_split(sp, b, 2, &mbs, &n), CM_OK);
    cr_assert_eq(n, 2);
    cr_assert(mbs[0].n_samples == 2 && mbs[0].n_padded == 0 && mbs[0].n_tokens == 7 + 8);
    cr_assert(mbs[1].n_samples == 0 && mbs[1].n_padded == 1 && mbs[1].n_tokens == 0 && mbs[1].valid[0] == 0,
              "a microbatch of padding counts nothing: %lld samples, %lld tokens", (long long)mbs[1].n_samples,
              (long long)mbs[1].n_tokens);
    cr_assert_eq(cm_data_spec_next(sp, &b), CM_OK);
    cr_assert(b->n_rows == 1 && b->n_samples == 0 && b->n_padded == 1 && b->global_n_samples == 2);
    cr_assert_eq(cm_data_spec_split(sp, b, 4, &mbs, &n), CM_OK);
    cr_assert(n == 1 && mbs[0].n_samples == 0 && mbs[0].n_rows == 1);
    cr_assert_eq(cm_data_spec_next(sp, &b), CM_OK);
    cr_assert_null(b, "end of epoch");
    cm_data_spec_free(sp);
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
}

typedef struct calls {
    int batches, microbatches;
    int64_t seen_rows;
    int fail_microbatch;
} calls;

static cm_status double_x(cm_batch *b, void *data) {
    calls *c = data;
    c->batches++;
    float *x = cm_tensor_data(b->fields[0]);
    for (int64_t i = 0; i < cm_tensor_numel(b->fields[0]); i++) x[i] *= 2;
    return CM_OK;
}
static cm_status count_mb(cm_batch *b, void *data) {
    calls *c = data;
    if (b->microbatch == c->fail_microbatch) return cm_set_error(CM_ERR_DTYPE, "cannot cast field x");
    c->microbatches++;
    c->seen_rows += b->n_rows;
    return CM_OK;
}
static int64_t rows_as_samples(const cm_batch *b, void *data) {
    (void)data;
    return b->n_rows * 100;
}
static int64_t no_tokens(const cm_batch *b, void *data) {
    (void)b, (void)data;
    return -7;
}

Test(spec, transforms_and_counters_run_with_their_data) {
    cm_dataset *ds = synth_new(12);
    cm_dataloader_config cfg = cm_dataloader_config_default();
    cfg.batch_size = 5, cfg.drop_last = false;
    cm_dataloader *dl = seq_loader(ds, cfg);
    calls c = {.fail_microbatch = -1};
    cm_data_spec_config sc = cm_data_spec_config_default();
    cr_assert(!sc.batch_transform && !sc.microbatch_transform && !sc.count_samples && !sc.count_tokens && !sc.data);
    sc.batch_transform = double_x, sc.microbatch_transform = count_mb;
    sc.count_samples = rows_as_samples, sc.count_tokens = no_tokens, sc.data = &c;
    cm_data_spec *sp;
    cr_assert_eq(cm_data_spec_new(dl, &sc, &sp), CM_OK);
    cm_batch *b, *mbs;
    int64_t n;
    cr_assert_eq(cm_data_spec_next(sp, &b), CM_OK);
    cr_assert_eq(c.batches, 1);
    cr_assert_float_eq(((float *)cm_tensor_data(b->fields[0]))[2], 2.0f, 0, "row 1 doubled by the batch transform");
    cr_assert_eq(cm_data_spec_n_samples(sp, b), 500);
    cr_assert_eq(cm_data_spec_n_tokens(sp, b), -7);
    cr_assert_eq(cm_data_spec_split(sp, b, 2, &mbs, &n), CM_OK);
    cr_assert(n == 3 && c.microbatches == 3 && c.seen_rows == 5);
    c.fail_microbatch = 1;
    cr_assert_eq(cm_data_spec_split(sp, b, 2, &mbs, &n), CM_ERR_DTYPE);
    cr_assert(n == 0 && mbs == NULL);
    cr_assert(strstr(cm_last_error(), "microbatch transform (microbatch 1 of 3") &&
                  strstr(cm_last_error(), "cannot cast field x"),
              "%s", cm_last_error());
    cm_data_spec_free(sp);
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
}

static cm_status fail_batch(cm_batch *b, void *data) {
    (void)b, (void)data;
    return cm_set_error(CM_ERR_INVALID_ARG, "label out of range");
}

Test(spec, bad_inputs_and_a_failing_batch_transform_are_reported) {
    cm_data_spec *sp;
    cr_assert_eq(cm_data_spec_new(NULL, NULL, &sp), CM_OK);
    cm_batch *b = (cm_batch *)1, *mbs;
    cr_assert_eq(cm_data_spec_next(sp, &b), CM_ERR_STATE);
    cr_assert_null(b);
    cr_assert(strstr(cm_last_error(), "no dataloader"), "%s", cm_last_error());

    /* a hand-made batch: 0 rows splits into 0 microbatches; a bad size and a wrong tensor are refused */
    int64_t shape[2] = {0, 2}, n = -1;
    float mem[8];
    cm_tensor *t;
    cr_assert_eq(cm_tensor_from_data(CM_DTYPE_F32, 2, shape, mem, &t), CM_OK);
    cm_batch hb = {.n_fields = 1, .names = {"x"}, .fields = {t}, .n_rows = 0};
    cr_assert_eq(cm_data_spec_split(sp, &hb, 4, &mbs, &n), CM_OK);
    cr_assert_eq(n, 0);
    cr_assert_eq(cm_data_spec_split(sp, &hb, 0, &mbs, &n), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "microbatch_size 0"), "%s", cm_last_error());
    hb.n_rows = 3;
    cr_assert_eq(cm_data_spec_split(sp, &hb, 2, &mbs, &n), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "'x'") && strstr(cm_last_error(), "n_rows = 3"), "%s", cm_last_error());
    /* a hand-made batch without masks or token counts: every row is a sample */
    cm_tensor_free(t);
    shape[0] = 4;
    cr_assert_eq(cm_tensor_from_data(CM_DTYPE_F32, 2, shape, mem, &t), CM_OK);
    hb.fields[0] = t, hb.n_rows = 4;
    cr_assert_eq(cm_data_spec_split(sp, &hb, 3, &mbs, &n), CM_OK);
    cr_assert(n == 2 && mbs[1].n_rows == 1 && mbs[1].n_samples == 1 && mbs[1].n_tokens == 0 && !mbs[1].valid);
    cm_data_spec_free(sp);
    cm_tensor_free(t);

    cm_dataset *ds = synth_new(4);
    cm_dataloader_config cfg = cm_dataloader_config_default();
    cfg.batch_size = 2;
    cm_dataloader *dl = seq_loader(ds, cfg);
    cm_data_spec_config sc = cm_data_spec_config_default();
    sc.batch_transform = fail_batch;
    cr_assert_eq(cm_data_spec_new(dl, &sc, &sp), CM_OK);
    cr_assert_eq(cm_data_spec_next(sp, &b), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "batch transform (epoch 0, step 0): label out of range"), "%s", cm_last_error());
    cm_data_spec_free(sp);
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
    cm_data_spec_free(NULL);
}

static int64_t forty_two(const cm_batch *b, void *data) {
    (void)b, (void)data;
    return 42;
}

/* Loss-generating tokens (Composer's token_type 'loss_generating'): the labels other than -100 in
 * the real rows of an integer "labels" field of two or more dimensions, i32 or i64, also in a
 * microbatch view; -1 (not known) without such a field; count_loss_tokens overrides the count. */
Test(spec, loss_tokens_count_the_labels_other_than_minus_100_in_real_rows) {
    int64_t y64[3][4] = {{5, -100, 7, -100}, {-100, -100, -100, -100}, {1, 2, 3, 4}};
    int32_t y32[3][4] = {{-100, 0, 0, -100}, {9, -100, -100, -100}, {-100, -100, -100, -100}};
    int64_t lab1[3] = {0, 1, -100};
    float x[3][2] = {{0}};
    const int64_t s2[2] = {3, 4}, s1[1] = {3}, sx[2] = {3, 2};
    cm_batch b = {0};
    b.n_fields = 2, b.n_rows = 3, b.n_samples = 3, b.n_tokens = 12, b.microbatch = -1;
    b.names[0] = "x", b.names[1] = "labels";
    cr_assert_eq(cm_tensor_from_data(CM_DTYPE_F32, 2, sx, x, &b.fields[0]), CM_OK);
    cr_assert_eq(cm_tensor_from_data(CM_DTYPE_I64, 2, s2, y64, &b.fields[1]), CM_OK);
    cm_data_spec *sp;
    cr_assert_eq(cm_data_spec_new(NULL, NULL, &sp), CM_OK);
    cr_expect_eq(cm_data_spec_n_loss_tokens(sp, &b), 6);
    const uint8_t valid[3] = {1, 1, 0}; /* the last row is evaluation padding */
    b.valid = valid, b.n_samples = 2, b.n_padded = 1;
    cr_expect_eq(cm_data_spec_n_loss_tokens(sp, &b), 2);
    cm_batch *mbs;
    int64_t n;
    cr_assert_eq(cm_data_spec_split(sp, &b, 1, &mbs, &n), CM_OK);
    cr_assert_eq(n, 3);
    cr_expect(cm_data_spec_n_loss_tokens(sp, &mbs[0]) == 2 && cm_data_spec_n_loss_tokens(sp, &mbs[1]) == 0 &&
                  cm_data_spec_n_loss_tokens(sp, &mbs[2]) == 0,
              "microbatches: %lld %lld %lld", (long long)cm_data_spec_n_loss_tokens(sp, &mbs[0]),
              (long long)cm_data_spec_n_loss_tokens(sp, &mbs[1]), (long long)cm_data_spec_n_loss_tokens(sp, &mbs[2]));
    b.valid = NULL, b.n_samples = 3, b.n_padded = 0;
    cm_tensor_free(b.fields[1]);
    cr_assert_eq(cm_tensor_from_data(CM_DTYPE_I32, 2, s2, y32, &b.fields[1]), CM_OK);
    cr_expect_eq(cm_data_spec_n_loss_tokens(sp, &b), 3);
    /* one label per row (a classifier's) or no labels: not known */
    cm_tensor_free(b.fields[1]);
    cr_assert_eq(cm_tensor_from_data(CM_DTYPE_I64, 1, s1, lab1, &b.fields[1]), CM_OK);
    cr_expect_eq(cm_data_spec_n_loss_tokens(sp, &b), -1);
    b.names[1] = "targets";
    cr_expect_eq(cm_data_spec_n_loss_tokens(sp, &b), -1);
    cm_data_spec_free(sp);
    cm_data_spec_config sc = cm_data_spec_config_default();
    cr_assert(!sc.count_loss_tokens);
    sc.count_loss_tokens = forty_two;
    cr_assert_eq(cm_data_spec_new(NULL, &sc, &sp), CM_OK);
    cr_expect_eq(cm_data_spec_n_loss_tokens(sp, &b), 42);
    cm_data_spec_free(sp);
    cm_tensor_free(b.fields[0]);
    cm_tensor_free(b.fields[1]);
}
