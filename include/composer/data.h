/*
 * composer/data.h — the data layer: datasets, samplers, the dataloader and the data spec.
 *
 * A dataset is random access: it has a length, describes the fields of one sample (name, dtype,
 * per-sample shape), and writes sample i into caller memory. Any source — a token file, MNIST,
 * CIFAR, a TSV of sentences, a user's own — implements the small cm_dataset_i vtable; the library's
 * formats live in datasets.h.
 *
 *     cm_dataset *ds;
 *     if (cm_dataset_mnist_new("../shared/data/mnist", CM_SPLIT_TRAIN, NULL, &ds) != CM_OK)
 *         fprintf(stderr, "%s\n", cm_last_error());
 *     int64_t n = cm_dataset_len(ds);                      // 60000
 *     const cm_field_desc *f = cm_dataset_field(ds, 0);     // "image", f32, (1, 28, 28)
 *
 * Determinism: a sample's content may depend on the dataset's own configuration and on the
 * cm_sample_ctx passed to get (seed, epoch) — augmentation draws its randomness from the
 * counter-based RNG keyed by (seed, epoch, sample index) — and on nothing else: not on the thread,
 * the number of workers, or the order of calls.
 */
#ifndef COMPOSER_DATA_H
#define COMPOSER_DATA_H

#include <composer/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Datasets
 * ------------------------------------------------------------------------------------------- */

#define CM_DATASET_MAX_FIELDS 8
#define CM_DATASET_ABI 1

/* One field of a sample: e.g. "image" u8 (1, 28, 28), "label" i64 (), "input_ids" i32 (128,). */
typedef struct cm_field_desc {
    const char *name; /* owned by the dataset; valid for its life */
    cm_dtype dtype;
    int ndim;
    int64_t shape[CM_MAX_DIMS];
} cm_field_desc;

/* What a sample may depend on besides its index. */
typedef struct cm_sample_ctx {
    uint64_t seed;  /* the run's data seed */
    int64_t epoch;  /* the epoch the sample is drawn for (augmentation changes per epoch) */
    bool training;  /* false for evaluation: no random augmentation */
} cm_sample_ctx;

/* The dataset vtable. `self` is the implementation's state. */
typedef struct cm_dataset_i {
    int abi; /* CM_DATASET_ABI */
    const char *type_name; /* "mnist", "tokens", ... (for messages) */
    int64_t (*len)(void *self);
    int (*n_fields)(void *self);
    const cm_field_desc *(*field)(void *self, int i);
    /* Writes sample `index` (0 <= index < len): out[f] points at room for field f of one sample
     * (numel × dtype size bytes, contiguous). Must be safe to call from several threads at once
     * for different output buffers. On failure returns a status and sets cm_last_error() with a
     * message naming the file and the sample. */
    cm_status (*get)(void *self, int64_t index, const cm_sample_ctx *ctx, void *const *out);
    /* Optional: tokens in sample `index` (for token-based time and throughput); NULL = 0. */
    int64_t (*n_tokens)(void *self, int64_t index);
    /* Optional: frees self. */
    void (*close)(void *self);
} cm_dataset_i;

typedef struct cm_dataset cm_dataset;

/* Wraps an implementation. On success the dataset owns `self` (vt->close frees it in
 * cm_dataset_free); on failure nothing is taken. Errors: CM_ERR_INVALID_ARG (bad abi, missing
 * required slots, a field with an invalid dtype/shape, more than CM_DATASET_MAX_FIELDS fields),
 * CM_ERR_OOM. */
cm_status cm_dataset_new(const cm_dataset_i *vt, void *self, cm_dataset **out);
void cm_dataset_free(cm_dataset *ds); /* NULL is a no-op */

int64_t cm_dataset_len(const cm_dataset *ds);
int cm_dataset_n_fields(const cm_dataset *ds);
const cm_field_desc *cm_dataset_field(const cm_dataset *ds, int i);
/* The index of the field called `name`, or -1. */
int cm_dataset_find_field(const cm_dataset *ds, const char *name);
/* Bytes of field f for one sample. */
size_t cm_dataset_field_bytes(const cm_dataset *ds, int f);
const char *cm_dataset_type_name(const cm_dataset *ds);
/* Writes sample `index` (see cm_dataset_i.get); checks the index (CM_ERR_INVALID_ARG naming it
 * and the length). ctx NULL means {seed 0, epoch 0, training false}. Thread-safe if the
 * implementation's get is. */
cm_status cm_dataset_get(const cm_dataset *ds, int64_t index, const cm_sample_ctx *ctx, void *const *out);
int64_t cm_dataset_n_tokens(const cm_dataset *ds, int64_t index);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_DATA_H */
