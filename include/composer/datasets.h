/*
 * composer/datasets.h — the library's dataset formats: llm.c token files, MNIST (IDX), CIFAR-10
 * binary batches, and the image augmentation they share.
 *
 * Each constructor validates its files completely when it opens them — wrong magic numbers,
 * truncated or oversized files, label/image count mismatches, a sequence longer than the file —
 * and fails with a message that names the file and what is wrong. After that, get() only reads:
 * it is safe to call from many loader threads at once, and a sample is a pure function of
 * (dataset configuration, index, ctx->seed, ctx->epoch, ctx->training).
 *
 *     cm_mnist_config mc = cm_mnist_config_default();
 *     mc.augment.crop_padding = 2;                     // random shifts of up to 2 pixels
 *     cm_dataset *train;
 *     if (cm_dataset_mnist_new("../shared/data/mnist", CM_SPLIT_TRAIN, &mc, &train) != CM_OK) {
 *         fprintf(stderr, "%s\n", cm_last_error());
 *         return 1;
 *     }
 *     float image[1 * 28 * 28];
 *     int64_t label;
 *     void *out[2] = {image, &label};                  // fields: "image" f32 (1,28,28), "label" i64 ()
 *     cm_sample_ctx ctx = {.seed = 42, .epoch = 0, .training = true};
 *     cm_dataset_get(train, 0, &ctx, out);             // label == 5
 *     cm_dataset_free(train);
 *
 *     cm_tokens_config tc = cm_tokens_config_default();
 *     tc.seq_len = 256;                                // fields "input_ids", "labels": i32 (256,)
 *     cm_dataset *lm;
 *     cm_dataset_tokens_new("data/tiny_shakespeare_train.bin", &tc, &lm);
 */
#ifndef COMPOSER_DATASETS_H
#define COMPOSER_DATASETS_H

#include <composer/data.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Which part of a dataset with a fixed split to open. (Not `cm_split`: that is the tensor op.) */
typedef enum cm_data_split {
    CM_SPLIT_TRAIN = 0,
    CM_SPLIT_TEST = 1,
} cm_data_split;

/* ---------------------------------------------------------------------------------------------
 * Image augmentation (CIFAR/MNIST style)
 * ------------------------------------------------------------------------------------------- */

/* Random geometric augmentation, applied by the image datasets only when ctx->training is true.
 * The zero value is "no augmentation". The randomness of sample `index` comes from the Philox
 * stream keyed by (seed, a stream derived from epoch) at counter `index`, so the result depends on
 * (seed, epoch, index) alone: not on threads, batch composition or call order. */
typedef struct cm_image_augment {
    /* Random crop with zero padding, as torchvision's RandomCrop(size, padding=P): the image is
     * padded by P zero pixels on each side and an H×W window is taken at a uniform random offset,
     * i.e. shifted by a uniform (dy, dx) in [-P, P]². 0 disables. Padding happens before
     * normalisation, so padded pixels are black (raw 0). */
    int crop_padding;
    /* Probability of a horizontal (left-right) flip, in [0, 1]. 0 disables. */
    float hflip_p;
    /* Optional: a transform of the raw u8 pixels (C, H, W) after the crop and flip, before
     * normalisation (where torchvision pipelines put PIL transforms) — e.g. cm_randaugment_transform
     * or cm_augmix_transform of composer/data_algos.h, with their config as u8_transform_data
     * (borrowed: it must outlive the dataset). Called on the loader's workers, only when
     * ctx->training, with (ctx->seed, ctx->epoch, sample index) to key its draws, so it must be
     * thread-safe and a pure function of them. An error fails the sample's get. NULL: none. */
    cm_status (*u8_transform)(uint8_t *img, int64_t C, int64_t H, int64_t W, uint64_t seed, int64_t epoch,
                              int64_t index, const void *data);
    const void *u8_transform_data;
} cm_image_augment;

/* The usual CIFAR recipe: crop_padding 4, hflip_p 0.5. (Dataset configs default to no
 * augmentation; assign this to turn it on.) */
cm_image_augment cm_image_augment_default(void);

/* One draw of the random parameters: the output pixel (y, x) reads the input pixel
 * (y + shift_y, x' + shift_x), where x' = W-1-x when flip is set and x otherwise; reads outside
 * the image give 0. */
typedef struct cm_image_augment_params {
    int shift_y, shift_x; /* in [-crop_padding, crop_padding] */
    bool flip;
} cm_image_augment_params;

/* The parameters for sample `index` in `epoch` under `seed` (a pure function of its arguments;
 * thread-safe). A disabled component draws shift 0 / no flip. */
cm_image_augment_params cm_image_augment_draw(const cm_image_augment *aug, uint64_t seed, int64_t epoch,
                                              int64_t index);

/* Applies `p` to a (C, H, W) f32 image: `in` and `out` are contiguous and must not overlap.
 * Errors: CM_ERR_INVALID_ARG for C, H or W < 1, in == out, or NULL buffers. Thread-safe. */
cm_status cm_image_transform(const cm_image_augment_params *p, int64_t C, int64_t H, int64_t W, const float *in,
                             float *out);

/* The functional form of the augmentation: draws the parameters for (seed, epoch, index) and
 * applies them to the (C, H, W) f32 image `in`, writing `out` (no overlap). Gives the same
 * geometry the datasets apply. Errors: CM_ERR_INVALID_ARG for a negative crop_padding, hflip_p
 * outside [0, 1], or the conditions of cm_image_transform. Thread-safe. */
cm_status cm_image_augment_apply(const cm_image_augment *aug, uint64_t seed, int64_t epoch, int64_t index,
                                 int64_t C, int64_t H, int64_t W, const float *in, float *out);

/* Normalises a (C, H·W) f32 image in place: x = (x - mean[c]) / std[c], as torchvision's
 * Normalize. Errors: CM_ERR_INVALID_ARG for C < 1, hw < 1, or a std that is not > 0. */
cm_status cm_image_normalize(float *img, int64_t C, int64_t hw, const float *mean, const float *std);

/* ---------------------------------------------------------------------------------------------
 * Token files (llm.c layout)
 * ------------------------------------------------------------------------------------------- */

/* A token file is a 1024-byte header of 256 little-endian int32 — [0] magic 20240520, [1] version
 * (1: uint16 tokens, 2: uint32 tokens), [2] the token count — followed by exactly that many tokens,
 * little-endian. Sample i is the window of seq_len + 1 tokens starting at i·seq_len:
 * "input_ids" = its first seq_len tokens, "labels" = its last seq_len (the next-token targets).
 * Consecutive samples share one token (the last label of i is the first input of i + 1), so the
 * dataset has (n_tokens - 1) / seq_len samples and every token is predicted once. */
typedef struct cm_tokens_config {
    int64_t seq_len;    /* T, tokens per sample (default 1024) */
    cm_dtype dtype;     /* of input_ids and labels: CM_DTYPE_I32 (default) or CM_DTYPE_I64 */
    int64_t vocab_size; /* > 0: get fails (CM_ERR_FORMAT, naming the file and position) on a token
                           >= vocab_size instead of handing an embedding an out-of-range id; 0 = no check */
} cm_tokens_config;

cm_tokens_config cm_tokens_config_default(void);

/* Opens the token file at `path` (memory-mapped read-only; the pages are shared with the OS cache
 * and with every other process reading the file). A `path` containing *, ? or [ is a glob
 * pattern, as llm.c's loader takes shards ("data/fineweb_train_*.bin"): every match is opened, in
 * sorted order, and the samples of all shards follow one another (a window never spans two
 * shards; each shard must hold seq_len + 1 tokens). cfg NULL means the defaults. Fields:
 * "input_ids" and "labels", dtype cfg->dtype, shape (seq_len,); n_tokens(i) = seq_len.
 * Errors, each naming the file: CM_ERR_NOT_FOUND (a missing file, or a pattern that matches
 * nothing), CM_ERR_IO, CM_ERR_FORMAT (short header, bad magic, unknown version, a count that
 * disagrees with the file size in either direction), CM_ERR_INVALID_ARG (seq_len < 1, a file with
 * fewer than seq_len + 1 tokens, a dtype other than i32/i64), CM_ERR_OOM. The dataset keeps its
 * own copies of the paths. Its get is thread-safe. A file with uint32 tokens >= 2^31 needs i64
 * output (get fails otherwise). */
cm_status cm_dataset_tokens_new(const char *path, const cm_tokens_config *cfg, cm_dataset **out);

/* ---------------------------------------------------------------------------------------------
 * MNIST (IDX files)
 * ------------------------------------------------------------------------------------------- */

typedef struct cm_mnist_config {
    /* false (default): "image" is f32 (1, 28, 28), (x/255 - mean) / std. true: u8 raw pixels. */
    bool raw_u8;
    float mean, std;          /* default 0.1307, 0.3081 (the MNIST training-set statistics) */
    cm_image_augment augment; /* default none; applied only when ctx->training */
} cm_mnist_config;

cm_mnist_config cm_mnist_config_default(void);

/* Opens MNIST (or Fashion-MNIST, which uses the same names) from `dir`: train-images-idx3-ubyte
 * and train-labels-idx1-ubyte for CM_SPLIT_TRAIN, t10k-* for CM_SPLIT_TEST, each as .gz or, when
 * the .gz is absent, uncompressed. Both files are decompressed into memory once, here. Fields:
 * "image" (see cm_mnist_config) and "label" i64 (). cfg NULL means the defaults.
 * Errors, each naming the file: CM_ERR_NOT_FOUND (neither form present), CM_ERR_IO,
 * CM_ERR_FORMAT (corrupt or truncated gzip, bad magic — images must be 0x00000803 with dims
 * N×28×28, labels 0x00000801 with dims N —, a size that disagrees with the header, an image count
 * that differs from the label count, a label outside 0..9, no samples), CM_ERR_INVALID_ARG (bad
 * split, std <= 0, bad augmentation), CM_ERR_OOM. get is thread-safe. */
cm_status cm_dataset_mnist_new(const char *dir, cm_data_split split, const cm_mnist_config *cfg, cm_dataset **out);

/* ---------------------------------------------------------------------------------------------
 * CIFAR-10 (binary batches)
 * ------------------------------------------------------------------------------------------- */

typedef struct cm_cifar10_config {
    /* false (default): "image" is f32 (3, 32, 32), (x/255 - mean[c]) / std[c]. true: u8 raw. */
    bool raw_u8;
    float mean[3], std[3];    /* default (0.4914, 0.4822, 0.4465) / (0.2470, 0.2435, 0.2616) */
    cm_image_augment augment; /* default none; cm_image_augment_default() is the usual recipe */
} cm_cifar10_config;

cm_cifar10_config cm_cifar10_config_default(void);

/* Opens the CIFAR-10 binary version from `dir` (or from dir/cifar-10-batches-bin, the folder the
 * official archive unpacks to): data_batch_1.bin .. data_batch_5.bin for CM_SPLIT_TRAIN,
 * test_batch.bin for CM_SPLIT_TEST, concatenated in that order. Each record is 1 label byte and
 * 3072 pixel bytes (1024 R, 1024 G, 1024 B, each 32×32 row-major). The files are memory-mapped.
 * Fields: "image" (see cm_cifar10_config) and "label" i64 (). cfg NULL means the defaults.
 * Errors, each naming the file: CM_ERR_NOT_FOUND, CM_ERR_IO, CM_ERR_FORMAT (an empty file or a
 * size that is not a multiple of 3073 bytes), CM_ERR_INVALID_ARG (bad split, std <= 0, bad
 * augmentation), CM_ERR_OOM; get fails with CM_ERR_FORMAT naming the file and record on a label
 * byte outside 0..9. get is thread-safe. */
cm_status cm_dataset_cifar10_new(const char *dir, cm_data_split split, const cm_cifar10_config *cfg, cm_dataset **out);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_DATASETS_H */
