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
/* A dataset that decides the epoch order itself (streaming datasets, whose order is MosaicML
 * Streaming's). batch_order writes `rank`'s dataset indices for the global batch of
 * `global_batch` positions that starts at `position` of `epoch` (at most
 * ceil(global_batch / world_size) of them) into ids and their count into *n_rank, and the real
 * samples of that global batch over all ranks into *n_global (0: the epoch is over). epoch_size
 * gives the real samples of an epoch from position 0 over `world_size` ranks (-1 with an error
 * set). A loader over such a dataset ignores its own shuffle and seed. Both are called from the
 * loader's consumer thread. */
typedef struct cm_dataset_order_i {
    cm_status (*batch_order)(void *self, int64_t epoch, int64_t position, int64_t global_batch, int rank,
                             int world_size, int64_t *ids, int64_t *n_rank, int64_t *n_global);
    int64_t (*epoch_size)(void *self, int64_t global_batch, int world_size);
} cm_dataset_order_i;

/* Gives `ds` its own order; `order` is borrowed (static) and is called with the dataset's self.
 * Call before any loader is made over ds. Errors: CM_ERR_INVALID_ARG (a slot is NULL). */
cm_status cm_dataset_set_order(cm_dataset *ds, const cm_dataset_order_i *order);
/* Whether the dataset decides its own epoch order. */
bool cm_dataset_has_order(const cm_dataset *ds);
/* The order's batch_order / epoch_size (the dataset must have an order). */
cm_status cm_dataset_batch_order(const cm_dataset *ds, int64_t epoch, int64_t position, int64_t global_batch, int rank,
                                 int world_size, int64_t *ids, int64_t *n_rank, int64_t *n_global);
int64_t cm_dataset_epoch_size(const cm_dataset *ds, int64_t global_batch, int world_size);
/* The implementation's `self` (for the library's own dataset types). */
void *cm_dataset_self(const cm_dataset *ds);

/* ---------------------------------------------------------------------------------------------
 * Samplers: the epoch order as a pure function of (seed, epoch, position)
 *
 * A sampler maps a position in an epoch to a dataset index without storing a permutation. With
 * shuffle on, the order of epoch e is a keyed bijection of [0, len): a Feistel network over the
 * next power of two of len (8 rounds, round keys from XXH3 of (seed, epoch)), with cycle-walking
 * back into [0, len). One lookup costs a few dozen multiplies (cycle-walking needs fewer than two
 * passes on average), so a run jumps to any position in O(1). The order looks uniform and differs
 * from epoch to epoch and from seed to seed; it is not a cryptographic permutation. With shuffle
 * off the order is 0, 1, 2, ... (evaluation).
 *
 *     cm_sampler s;
 *     cm_sampler_init(&s, 60000, true, 42);
 *     int64_t first = cm_sampler_index(&s, 3, 0);   // the first sample of epoch 3
 * ------------------------------------------------------------------------------------------- */

/* Transparent plain data; fill it with cm_sampler_init. */
typedef struct cm_sampler {
    int64_t len;   /* samples in the dataset (>= 1) */
    bool shuffle;  /* false: sequential order */
    uint64_t seed; /* with shuffle: the order of every epoch is a function of (seed, epoch) */
} cm_sampler;

/* Fills *s. Errors: CM_ERR_INVALID_ARG for len < 1 (naming it). */
cm_status cm_sampler_init(cm_sampler *s, int64_t len, bool shuffle, uint64_t seed);

/* The dataset index at `position` (0 <= position < len) of epoch `epoch` (>= 0); -1 when either is
 * out of range. Pure: the same arguments always give the same index, on any thread and machine.
 * For a fixed epoch, positions 0..len-1 give every index exactly once. */
int64_t cm_sampler_index(const cm_sampler *s, int64_t epoch, int64_t position);

/* Rank r's share of a global batch of `global_count` samples over `world_size` ranks: the
 * contiguous range [*begin, *begin + *count) of the batch's positions. Shares differ by at most
 * one sample: the first global_count % world_size ranks take one more. A rank's share may be 0
 * when global_count < world_size. Requires 0 <= rank < world_size and global_count >= 0. */
void cm_data_rank_slice(int64_t global_count, int rank, int world_size, int64_t *begin, int64_t *count);

/* ---------------------------------------------------------------------------------------------
 * Batches
 * ------------------------------------------------------------------------------------------- */

/* One rank's rows of one global batch (or one microbatch of it). Every tensor, array and string
 * belongs to whoever produced the batch (the dataloader, or the data spec for microbatches) and is
 * valid until that owner's next call that produces batches (cm_dataloader_next, cm_data_spec_next,
 * cm_data_spec_split) or its _free. A transform may change the tensors' contents in place; it
 * must not replace or free the tensors.
 *
 * Weighting: a rank's share of the global batch is n_samples / global_n_samples (and tokens
 * likewise), which stays exact when the batch does not divide evenly over the ranks or when
 * evaluation pads. */
typedef struct cm_batch {
    int n_fields;
    const char *names[CM_DATASET_MAX_FIELDS]; /* field names (the dataset's) */
    cm_tensor *fields[CM_DATASET_MAX_FIELDS]; /* (n_rows, per-sample shape...), contiguous */
    int64_t n_rows;            /* rows in every tensor: n_samples + n_padded */
    int64_t n_samples;         /* real samples among the rows */
    int64_t n_padded;          /* evaluation padding rows (always at the end) */
    const int64_t *indices;    /* (n_rows,) dataset index of each row; -1 for padding rows */
    const uint8_t *valid;      /* (n_rows,) 1 for a real sample, 0 for padding (mask metrics with it) */
    const int64_t *row_tokens; /* (n_rows,) cm_dataset_n_tokens of each row; 0 for padding */
    int64_t n_tokens;          /* tokens in the real samples among the rows */
    int64_t global_n_samples;  /* real samples in the whole global batch, all ranks together */
    int64_t global_n_tokens;   /* tokens in the whole global batch (0 if the dataset counts none) */
    int64_t epoch;             /* the epoch the batch belongs to */
    int64_t step;              /* the batch's step within the epoch (position / batch_size) */
    int64_t position;          /* epoch position of the global batch's first sample */
    int64_t rank_offset;       /* offset of this rank's first real row within the global batch */
    int64_t microbatch;        /* for microbatches: which one (0-based); -1 for a whole batch */
} cm_batch;

/* The tensor of the field called `name`, or NULL. */
cm_tensor *cm_batch_field(const cm_batch *b, const char *name);

/* ---------------------------------------------------------------------------------------------
 * The dataloader: batches assembled ahead of the trainer on worker threads
 *
 * The global batch at step s of an epoch is the sampler's positions [s·B, (s+1)·B); rank r of N
 * takes its contiguous slice (cm_data_rank_slice). What a step sees therefore depends only on
 * (dataset, seed, epoch, position, B) — not on the number of ranks, workers or the prefetch
 * depth: batches are bit-identical for any num_workers. The state is (epoch, position): saved and
 * restored in O(1), so a resumed run jumps to where it stopped without replaying anything.
 *
 *     cm_dataloader_config cfg = cm_dataloader_config_default();
 *     cfg.batch_size = 256;           // global batch
 *     cfg.num_workers = 2;
 *     cfg.rank = rank; cfg.world_size = world;
 *     cm_dataloader *dl;
 *     if (cm_dataloader_new(ds, &cfg, &dl) != CM_OK) fprintf(stderr, "%s\n", cm_last_error());
 *     for (int epoch = 0; epoch < 3; epoch++) {
 *         cm_batch *b;
 *         while (cm_dataloader_next(dl, &b) == CM_OK && b) {
 *             cm_tensor *x = cm_batch_field(b, "image");   // (b->n_rows, 1, 28, 28)
 *             ...
 *         }
 *     }
 *     cm_dataloader_state st = cm_dataloader_get_state(dl);   // into the checkpoint
 *     cm_dataloader_free(dl);
 *
 * Modes. Training: the order is shuffled (if cfg.shuffle), each sample's cm_sample_ctx has
 * training = true, and with drop_last a final partial global batch is dropped; without it the
 * final batch is short and its rank slices differ by at most one sample (a slice may be empty).
 * Evaluation: every sample is seen exactly once (drop_last is ignored); in the final, short
 * global batch every rank gets the same number of rows, ceil(b / N), and the rows a rank lacks are
 * padding — copies of the global batch's first sample with valid = 0 and index -1 — so metrics
 * that honour the mask count each sample once.
 * ------------------------------------------------------------------------------------------- */

typedef enum cm_data_mode { CM_DATA_TRAIN = 0, CM_DATA_EVAL = 1 } cm_data_mode;

typedef struct cm_dataloader_config {
    int64_t batch_size;  /* the global batch in samples (all ranks together); default 32 */
    bool shuffle;        /* default true (cm_dataloader_config_eval: false) */
    uint64_t seed;       /* order and augmentation seed; default 0 */
    bool drop_last;      /* training only: drop a final partial global batch; default true */
    int num_workers;     /* threads that assemble batches; 0 = in the calling thread; default 0 */
    int prefetch_depth;  /* batches assembled ahead while the trainer holds one (>= 1); default 2 */
    int rank;            /* this process's rank, 0 <= rank < world_size; default 0 */
    int world_size;      /* default 1 */
    cm_data_mode mode;   /* default CM_DATA_TRAIN */
    /* Padding trimming (llm-foundry's allow_pad_trimming; Hugging Face's DataCollatorWithPadding
     * pads to the batch's longest row the same way): every batch's sequence fields are cut to its
     * longest row, rounded up to pad_to_multiple_of and never past the dataset's length. A row's
     * length is one past its last position whose "attention_mask" is nonzero; the dataset must
     * have that field, with a per-sample shape (L, ...), and pad at the end. The sequence fields
     * are those whose per-sample shape starts with L (ids, token types, masked-LM labels, the mask
     * itself): a batch of them is (n_rows, L', ...) with L' <= L, the positions cut all padding;
     * other fields (a class label) are untouched. Each rank cuts its own rows, so ranks may differ
     * in L'; evaluation padding rows copy a real row and count like one. A model that masks its
     * padding computes the same result on the shorter batch at less cost. Default false. */
    bool trim_padding;
    int64_t pad_to_multiple_of; /* with trim_padding: L' is a multiple of it (or L); >= 1; default 8 */
} cm_dataloader_config;

/* Training defaults (listed above). */
cm_dataloader_config cm_dataloader_config_default(void);
/* Evaluation defaults: the training defaults with mode CM_DATA_EVAL, shuffle false and
 * drop_last false. */
cm_dataloader_config cm_dataloader_config_eval(void);

/* Where the loader stands: the next batch starts at `position` of epoch `epoch`. Plain data. */
typedef struct cm_dataloader_state {
    int64_t epoch;
    int64_t position; /* global sample position within the epoch, 0 <= position <= len */
} cm_dataloader_state;

typedef struct cm_dataloader cm_dataloader;

/* A loader over `ds`, which is borrowed and must outlive the loader (its get must be thread-safe
 * when num_workers > 0). cfg NULL means cm_dataloader_config_default(). Starts at (0, 0); worker
 * threads start at once and begin filling batches. Errors: CM_ERR_INVALID_ARG (batch_size < 1,
 * num_workers < 0, prefetch_depth < 1, rank/world_size out of range, an empty dataset, or a
 * training loader with drop_last whose dataset is smaller than one global batch — it would never
 * yield a batch, or trim_padding with pad_to_multiple_of < 1), CM_ERR_NOT_FOUND (trim_padding on a
 * dataset without an "attention_mask" field of per-sample shape (L, ...)), CM_ERR_OOM,
 * CM_ERR_INTERNAL (a thread could not be started). */
cm_status cm_dataloader_new(const cm_dataset *ds, const cm_dataloader_config *cfg, cm_dataloader **out);

/* Stops the workers (each finishes the rows it holds, at most batch / (4 · num_workers), mid-epoch
 * or not), joins them and frees everything, including the last batch handed out. NULL is a no-op. */
void cm_dataloader_free(cm_dataloader *dl);

/* The next batch of the current epoch in *out (owned by the loader, valid until the next call to
 * cm_dataloader_next, cm_dataloader_set_state or cm_dataloader_free), or *out = NULL at the end of
 * the epoch — that call moves the loader to (epoch + 1, 0), and the following call starts the new
 * epoch. Waits for the workers if the batch is not ready yet.
 *
 * Errors: when the dataset fails on a sample, the status is the dataset's and cm_last_error()
 * names the sample index, the epoch and position, the dataset type and the dataset's own message.
 * The loader then stays at the failing batch: its state is unchanged, so a later call retries it
 * (cm_dataloader_set_state can skip it). CM_ERR_OOM if a batch view cannot be made.
 * Not thread-safe: one consumer thread per loader. */
cm_status cm_dataloader_next(cm_dataloader *dl, cm_batch **out);

/* The state after the last batch handed out (or after the last set_state): saving it and later
 * calling cm_dataloader_set_state on a loader with the same dataset, seed and batch size continues
 * with exactly the batches this loader would give next — on any world size. */
cm_dataloader_state cm_dataloader_get_state(const cm_dataloader *dl);

/* Jumps to (epoch, position) in O(1): prefetched batches are discarded and the workers start on
 * the new position. Any position 0 <= position <= len is allowed; batches then run from there in
 * steps of batch_size. Invalidates the last batch handed out. Errors: CM_ERR_INVALID_ARG (negative
 * epoch, position out of range; the state is then unchanged). */
cm_status cm_dataloader_set_state(cm_dataloader *dl, cm_dataloader_state st);

/* Global batches per epoch from position 0: len / B with drop_last in training, else ceil(len / B). */
int64_t cm_dataloader_steps_per_epoch(const cm_dataloader *dl);
/* Real samples per epoch, all ranks together (len, less the dropped tail with drop_last). */
int64_t cm_dataloader_samples_per_epoch(const cm_dataloader *dl);
const cm_dataloader_config *cm_dataloader_get_config(const cm_dataloader *dl);
const cm_dataset *cm_dataloader_dataset(const cm_dataloader *dl);

/* ---------------------------------------------------------------------------------------------
 * The data spec: how the trainer counts, transforms and splits batches (Composer's DataSpec)
 *
 *     cm_data_spec_config sc = cm_data_spec_config_default();
 *     sc.microbatch_transform = to_bf16;  sc.data = &my_ctx;
 *     cm_data_spec *spec;
 *     cm_data_spec_new(dl, &sc, &spec);
 *     cm_batch *b, *mbs;
 *     int64_t n_mb;
 *     while (cm_data_spec_next(spec, &b) == CM_OK && b) {
 *         cm_data_spec_split(spec, b, 16, &mbs, &n_mb);     // views of 16 rows, the last may be short
 *         for (int64_t i = 0; i < n_mb; i++) {
 *             double share = (double)mbs[i].n_samples / (double)b->global_n_samples;
 *             ...  // forward mbs[i], scale its loss by share, backward
 *         }
 *     }
 *     cm_data_spec_free(spec);
 * ------------------------------------------------------------------------------------------- */

/* A transform changes a batch's tensor contents in place (normalise, cast into a preallocated
 * buffer, mask tokens...) and may adjust its counts. Returns CM_OK or an error with
 * cm_set_error. */
typedef cm_status (*cm_batch_transform_fn)(cm_batch *batch, void *data);
/* Counts samples or tokens in a batch (for models whose batches count differently). */
typedef int64_t (*cm_batch_count_fn)(const cm_batch *batch, void *data);

typedef struct cm_data_spec_config {
    cm_batch_count_fn count_samples;            /* NULL: batch->n_samples */
    cm_batch_count_fn count_tokens;             /* NULL: batch->n_tokens */
    cm_batch_count_fn count_loss_tokens;        /* NULL: the "labels" count (cm_data_spec_n_loss_tokens) */
    cm_batch_transform_fn batch_transform;      /* NULL: none; applied by cm_data_spec_next */
    cm_batch_transform_fn microbatch_transform; /* NULL: none; applied to each microbatch by split */
    void *data;                                 /* passed to every callback */
} cm_data_spec_config;

cm_data_spec_config cm_data_spec_config_default(void); /* all NULL */

typedef struct cm_data_spec cm_data_spec;

/* A spec over `dl` (borrowed; may be NULL for a spec that only splits and counts batches made
 * elsewhere). cfg NULL means the defaults. Errors: CM_ERR_OOM. */
cm_status cm_data_spec_new(cm_dataloader *dl, const cm_data_spec_config *cfg, cm_data_spec **out);
/* Frees the spec and the microbatches it handed out. NULL is a no-op. */
void cm_data_spec_free(cm_data_spec *spec);
cm_dataloader *cm_data_spec_loader(const cm_data_spec *spec);

/* cm_dataloader_next, then the batch transform. *out = NULL at the end of an epoch. Errors: the
 * loader's, CM_ERR_STATE without a loader, or the transform's, its message prefixed with
 * "batch transform (epoch E, step S): " (the loader has then moved past that batch). */
cm_status cm_data_spec_next(cm_data_spec *spec, cm_batch **out);

/* The samples / tokens the spec counts in a batch (the callbacks, or the batch's own counts). */
int64_t cm_data_spec_n_samples(const cm_data_spec *spec, const cm_batch *batch);
int64_t cm_data_spec_n_tokens(const cm_data_spec *spec, const cm_batch *batch);
/* The loss-generating tokens of a batch (Composer's get_num_tokens_in_batch with token_type
 * 'loss_generating'; the trainer weights microbatches by them under
 * accumulate_train_batch_on_tokens): count_loss_tokens when set; else, when the batch has an
 * integer field "labels" of two or more dimensions on the host (a masked-LM's or causal LM's
 * per-token targets), its entries other than -100 (Hugging Face's ignore index) in the real rows;
 * else -1: not known (callers fall back to cm_data_spec_n_tokens). 0 means the batch has no token
 * to compute a loss on (a masked-LM microbatch in which nothing was masked). */
int64_t cm_data_spec_n_loss_tokens(const cm_data_spec *spec, const cm_batch *batch);

/* Splits `batch` into microbatches of `microbatch_size` rows: views (no copies) of rows
 * [i·m, min((i+1)·m, n_rows)) of every field, so the last may be short and a batch with 0 rows
 * gives 0 microbatches. Each microbatch is a cm_batch with its own n_rows, n_samples, n_padded,
 * n_tokens, indices, valid and row_tokens, the parent's global counts, epoch, step and position,
 * and microbatch = i; a microbatch of only padding rows has n_samples = 0. The microbatch
 * transform, if any, runs on each in order. *out (an array of *n_out) belongs to the spec and is
 * valid until the next split or cm_data_spec_free; the batch's tensors must outlive it. Errors:
 * CM_ERR_INVALID_ARG (microbatch_size < 1, a batch whose field tensors are not contiguous with
 * n_rows rows), CM_ERR_OOM, or the transform's, prefixed with "microbatch transform (microbatch i
 * of n, epoch E, step S): "; after an error no microbatches are handed out (*n_out = 0). A batch
 * made by hand may leave indices, valid and row_tokens NULL: every row then counts as a sample
 * with no tokens. Not thread-safe: one spec per thread. */
cm_status cm_data_spec_split(cm_data_spec *spec, const cm_batch *batch, int64_t microbatch_size, cm_batch **out,
                             int64_t *n_out);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_DATA_H */
