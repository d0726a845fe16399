/*
 * composer/data_algos.h — Composer's data methods: algorithms that change the batch (its inputs,
 * targets, rows or sequence length) rather than the model or the optimizer — MixUp, CutMix,
 * CutOut, LabelSmoothing, ProgressiveResizing, SeqLengthWarmup, SelectiveBackprop, ColOut,
 * RandAugment and AugMix (with the Pillow operations they use, on u8 images). Each comes twice, as
 * in Composer: a plugin for the trainer (Composer's class name, constructor arguments, defaults
 * and events; a config struct with cm_<name>_config_default() and cm_<name>_new) and its math as
 * plain functions usable without a trainer (composer.functional: mixup_batch, cutmix_batch, ...).
 * `composer train` reads them under algorithms: with Composer's snake_case names (mixup, cutmix,
 * cutout, colout, label_smoothing, progressive_resizing, seq_length_warmup, selective_backprop,
 * randaugment, augmix) and argument names. The trainer hooks they use (replacing the batch or a
 * field of it, the dry run) are in composer/trainer.h.
 *
 *     cm_mixup_config mc = cm_mixup_config_default();          // alpha 0.2
 *     cm_label_smoothing_config lc = cm_label_smoothing_config_default();  // smoothing 0.1
 *     cm_algorithm_plugin algs[2];
 *     if (cm_mixup_new(&mc, &algs[0]) != CM_OK || cm_label_smoothing_new(&lc, &algs[1]) != CM_OK)
 *         fprintf(stderr, "%s\n", cm_last_error());
 *     cfg.algorithms = algs; cfg.n_algorithms = 2;             // cm_trainer_config; taken on success
 *
 *     // the functional form, on tensors of your own
 *     int64_t perm[64];
 *     cm_rng rng = cm_rng_init(42, 0);
 *     cm_random_permutation(&rng, 64, perm);
 *     cm_mixup_batch(images, perm, 0.3, mixed);                // mixed = 0.7·x + 0.3·x[perm]
 *
 * Batch fields. Composer finds the input and the target by input_key / target_key, 0 and 1 by
 * default (the first two elements of the batch). Here a batch's fields are named (the dataset's
 * names: "image" and "label" for MNIST and CIFAR, "input_ids" and "labels" for token files), so a
 * key is a field name, or decimal digits for a position ("0", "1", as Composer's integer keys), and
 * NULL (the default) means the batch's field 0 for the input and field 1 for the target, as
 * Composer's defaults. A key that names no field is an error listing the
 * fields; so is a field whose shape or dtype the method cannot work on (it names what it looked
 * for: "CutMix: input 'input' is (16, 8) f32; CutMix cuts boxes out of images (N, C, H, W)").
 *
 * Randomness. Composer draws from numpy's and torch's global generators and checkpoints their
 * states. Here every draw comes from a Philox stream keyed by the run's seed (cm_state_seed), the
 * method and where the draw is made (the batch number, and the rank and microbatch for methods that
 * work per microbatch; the epoch and dataset index of the sample for per-sample draws), so a draw
 * depends on nothing else: resuming from a checkpoint replays exactly the draws of an
 * uninterrupted run, with no generator state to save. Per-batch draws (CutOut's holes,
 * ProgressiveResizing's crop, ColOut's rows) are the same on every rank, so N ranks apply what
 * one process would; MixUp and CutMix pair samples within a microbatch, as Composer does, so
 * their pairs depend on the microbatch size and the number of ranks.
 *
 * State in checkpoints. Every schedule here (ProgressiveResizing's scale, SeqLengthWarmup's
 * length, SelectiveBackprop's interval) is a function of the timestamp, which the checkpoint
 * holds, and every draw is keyed as above, so these methods need no state to resume exactly.
 * ProgressiveResizing and SeqLengthWarmup still save what they last applied (scale and size;
 * length and batch size) for the record; loading checks its form and otherwise ignores it.
 *
 * Devices: the functional forms read and write host memory; a tensor on another device is
 * CM_ERR_UNSUPPORTED naming it (copy it with cm_tensor_to_device), never read as host memory.
 *
 * Threading: a plugin belongs to its trainer's thread. The functional forms are thread-safe for
 * distinct outputs and generators.
 */
#ifndef COMPOSER_DATA_ALGOS_H
#define COMPOSER_DATA_ALGOS_H

#include <composer/trainer.h>

#ifdef __cplusplus
extern "C" {
#endif

/* =============================================================================================
 * Shared draws
 * =========================================================================================== */

/* A uniform random permutation of 0..n-1 into perm (n entries): Fisher–Yates over rng. */
void cm_random_permutation(cm_rng *rng, int64_t n, int64_t *perm);
/* A Beta(a, b) draw (a, b > 0), from two Gamma draws (Marsaglia–Tsang, with the a < 1 boost). */
double cm_random_beta(cm_rng *rng, double a, double b);

/* Dense targets for mixing: out (N, C) f32 = w·onehot(target) + (1 - w)·onehot(target[perm]),
 * where target is class indices (N) (i32, i64 or u8, each in [0, C)) or already dense (N, C) f32
 * (used as they are, as Composer's ensure_targets_one_hot). perm (N entries) may be NULL (no
 * permuted part: out = onehot(target), whatever w). Errors: CM_ERR_SHAPE (other shapes, naming
 * them), CM_ERR_DTYPE, CM_ERR_INVALID_ARG (a class outside [0, C), naming it; NULLs). */
cm_status cm_mix_targets(const cm_tensor *target, const int64_t *perm, double w, int64_t num_classes, cm_tensor *out);

/* =============================================================================================
 * MixUp (Composer's MixUp: alpha 0.2, interpolate_loss false)
 *
 * On BEFORE_FORWARD of each microbatch: mixing = min(z, 1 - z), z ~ Beta(alpha, alpha) (so the
 * original sample always has the larger weight) and a random permutation of the microbatch's
 * rows; the input becomes (1 - mixing)·x + mixing·x[perm]. On BEFORE_LOSS the target becomes
 * (1 - mixing)·onehot(y) + mixing·onehot(y[perm]) (C from the outputs (N, C)); with
 * interpolate_loss it stays and, on BEFORE_BACKWARD, the loss becomes (1 - mixing)·loss +
 * mixing·loss(outputs, y[perm]) (the model's own loss, for losses linear in the target).
 * Applies to float inputs (N, ...) and class targets (N) or dense ones (N, C).
 * =========================================================================================== */

typedef struct cm_mixup_config {
    double alpha;          /* 0.2: Beta(alpha, alpha); 0 = no mixing; >= 0 */
    bool interpolate_loss; /* false */
    const char *input_key;  /* NULL = field 0 (copied) */
    const char *target_key; /* NULL = field 1 (copied) */
} cm_mixup_config;
cm_mixup_config cm_mixup_config_default(void);
/* Errors: CM_ERR_INVALID_ARG (alpha < 0 or not finite, NULL out), CM_ERR_OOM. */
cm_status cm_mixup_new(const cm_mixup_config *cfg, cm_algorithm_plugin *out);

/* Composer's _gen_mixing_coef: min(z, 1 - z) for z ~ Beta(alpha, alpha); 0 when alpha is 0. */
double cm_mixup_draw_mixing(double alpha, cm_rng *rng);
/* out = (1 - mixing)·input + mixing·input[perm] along dim 0 (composer.functional.mixup_batch with
 * given mixing and indices). input and out: f32, the same shape (N, ...), contiguous, distinct.
 * Errors: CM_ERR_SHAPE, CM_ERR_DTYPE, CM_ERR_INVALID_ARG (NULLs, in == out, a perm entry outside
 * [0, N)). */
cm_status cm_mixup_batch(const cm_tensor *input, const int64_t *perm, double mixing, cm_tensor *out);

/* =============================================================================================
 * CutMix (Composer's CutMix: alpha 1.0, interpolate_loss false, uniform_sampling false)
 *
 * On BEFORE_FORWARD of each microbatch: a random permutation, lambda ~ Beta(alpha, alpha) and a
 * box of area (1 - lambda) (Composer's _rand_bbox, clipped to the image); the box of every image
 * is replaced by the same box of its partner x[perm]. The weight of the original is then the
 * adjusted lambda, 1 - box area / (H·W). On BEFORE_LOSS the target becomes lambda·onehot(y) +
 * (1 - lambda)·onehot(y[perm]) — or, for a target with the input's height and width
 * (segmentation), the box of the partner's target is pasted; with interpolate_loss the loss is
 * interpolated on BEFORE_BACKWARD instead. Applies to inputs (N, C, H, W) of any dtype.
 * =========================================================================================== */

typedef struct cm_cutmix_config {
    double alpha;          /* 1.0; >= 0 */
    bool interpolate_loss; /* false */
    bool uniform_sampling; /* false: box centres uniform over the image (the paper's); true: every
                              pixel equally likely to be in the box */
    const char *input_key, *target_key; /* NULL = fields 0 and 1 (copied) */
} cm_cutmix_config;
cm_cutmix_config cm_cutmix_config_default(void);
cm_status cm_cutmix_new(const cm_cutmix_config *cfg, cm_algorithm_plugin *out); /* errors as cm_mixup_new */

/* A box: rows [x1, x2) of dim -2 and columns [y1, y2) of dim -1 (Composer's (bbx1, bby1, bbx2,
 * bby2), whose "x" runs along dim 2). */
typedef struct cm_bbox {
    int64_t x1, y1, x2, y2;
} cm_bbox;

/* Composer's _gen_cutmix_coef: lambda ~ Beta(alpha, alpha); 0 when alpha is 0. */
double cm_cutmix_draw_lambda(double alpha, cm_rng *rng);
/* Composer's _rand_bbox for an H×W image (H = dim -2): cut = sqrt(1 - lambda), box H·cut by
 * W·cut (truncated), centre uniform over [0, H) × [0, W) (uniform_sampling: over
 * [-cut_h//2, H + cut_h//2) and likewise, Python's floor division), clipped to the image. */
cm_bbox cm_cutmix_draw_bbox(int64_t H, int64_t W, double lambda, bool uniform_sampling, cm_rng *rng);
/* 1 - box area / (H·W): the weight of the original sample (Composer's _adjust_lambda). */
double cm_cutmix_adjusted_lambda(int64_t H, int64_t W, cm_bbox box);
/* out = input with out[i, :, box] = input[perm[i], :, box] (composer.functional.cutmix_batch with
 * given bbox and indices). input and out (N, C, H, W), the same dtype, contiguous, distinct.
 * Errors: CM_ERR_SHAPE, CM_ERR_DTYPE, CM_ERR_INVALID_ARG (NULLs, in == out, a perm entry outside
 * [0, N), a box outside the image). */
cm_status cm_cutmix_batch(const cm_tensor *input, const int64_t *perm, cm_bbox box, cm_tensor *out);

/* =============================================================================================
 * CutOut (Composer's CutOut: num_holes 1, length 0.5, uniform_sampling false)
 *
 * On AFTER_DATALOADER: num_holes squares of side int(length·min(H, W)) are zeroed in every image
 * of the batch — the same squares for the whole batch, as Composer. Applies to images (N, C, H, W)
 * or (N, H, W) of any dtype.
 * =========================================================================================== */

typedef struct cm_cutout_config {
    int num_holes;         /* 1; >= 0 */
    double length;         /* 0.5: the side as a fraction of min(H, W), in [0, 1] */
    bool uniform_sampling; /* false: centres uniform over the image; true: every pixel equally likely */
    const char *input_key; /* NULL = field 0 (copied) */
} cm_cutout_config;
cm_cutout_config cm_cutout_config_default(void);
/* Errors: CM_ERR_INVALID_ARG (num_holes < 0, length outside [0, 1]), CM_ERR_OOM. */
cm_status cm_cutout_new(const cm_cutout_config *cfg, cm_algorithm_plugin *out);

/* composer.functional.cutout_batch, in place: draws each hole's centre (y over H first, then x
 * over W, as Composer) and zeroes [y - L//2, y + L//2) × [x - L//2, x + L//2) clipped to the image
 * (L = int(min(H, W)·length)) in every image of `input` ((..., H, W), contiguous, any dtype).
 * Errors: CM_ERR_SHAPE (fewer than 2 dims), CM_ERR_INVALID_ARG (NULLs, bad num_holes or length). */
cm_status cm_cutout_batch(cm_tensor *input, int num_holes, double length, bool uniform_sampling, cm_rng *rng);

/* =============================================================================================
 * LabelSmoothing (Composer's LabelSmoothing: smoothing 0.1)
 *
 * On BEFORE_LOSS the target becomes (1 - smoothing)·onehot(y) + smoothing / C (C from the outputs
 * (N, C)); on AFTER_LOSS the original target is put back. Applies to class logits (N, C) with
 * targets (N) or (N, C).
 * =========================================================================================== */

typedef struct cm_label_smoothing_config {
    double smoothing;       /* 0.1, in [0, 1] */
    const char *target_key; /* NULL = field 1 (copied) */
} cm_label_smoothing_config;
cm_label_smoothing_config cm_label_smoothing_config_default(void);
/* Errors: CM_ERR_INVALID_ARG (smoothing outside [0, 1]), CM_ERR_OOM. */
cm_status cm_label_smoothing_new(const cm_label_smoothing_config *cfg, cm_algorithm_plugin *out);

/* composer.functional.smooth_labels: out (N, C) f32 = (1 - smoothing)·onehot(target) +
 * smoothing / C, C = logits' dim 1 (logits (N, C) give the shape; their values are not read, so
 * they may be on any device; target and out are host tensors, as every data method's).
 * Errors: as cm_mix_targets, and CM_ERR_SHAPE for logits that are not (N, C). */
cm_status cm_smooth_labels(const cm_tensor *logits, const cm_tensor *target, double smoothing, cm_tensor *out);

/* =============================================================================================
 * ProgressiveResizing (Composer's ProgressiveResizing: mode resize, initial_scale 0.5,
 * finetune_fraction 0.2, delay_fraction 0.5, size_increment 4, resize_targets false)
 *
 * On AFTER_DATALOADER, with e the elapsed fraction of the run: the scale is initial_scale until
 * delay_fraction, then grows linearly to 1 at 1 - finetune_fraction:
 *   scale = initial_scale + (1 - initial_scale)·min(1, max(0, e - delay) / (1 - finetune - delay)),
 * pinned so the width is a multiple of size_increment: round(W·scale / inc)·inc / W (Python's
 * round, half to even). Below 1 the images shrink to floor(H·s) × floor(W·s) by nearest-neighbour
 * interpolation (resize) or a random crop of that size (crop, one crop for the batch); with
 * resize_targets targets (N, H, W) or (N, C, H, W) follow. Logs progressive_resizing/height,
 * /width and /scale_factor (the unpinned scale). Applies to images (N, C, H, W).
 * =========================================================================================== */

#define CM_RESIZE_MODE_LIST(X)            \
    X(CM_RESIZE_MODE_RESIZE, "resize")    \
    X(CM_RESIZE_MODE_CROP, "crop")

typedef enum cm_resize_mode {
#define CM_X_(name, str) name,
    CM_RESIZE_MODE_LIST(CM_X_)
#undef CM_X_
    CM_RESIZE_MODE_COUNT
} cm_resize_mode;

const char *cm_resize_mode_name(cm_resize_mode m); /* "resize"; "?" out of range */
/* Case-sensitive, as Composer ('resize', 'crop'); CM_ERR_INVALID_ARG listing them otherwise. */
cm_status cm_resize_mode_parse(const char *s, cm_resize_mode *out);

typedef struct cm_progressive_resizing_config {
    cm_resize_mode mode;      /* resize */
    double initial_scale;     /* 0.5, in [0, 1] */
    double finetune_fraction; /* 0.2, in [0, 1] */
    double delay_fraction;    /* 0.5, in [0, 1]; delay + finetune <= 1 */
    int64_t size_increment;   /* 4, >= 1 */
    bool resize_targets;      /* false */
    const char *input_key, *target_key; /* NULL = fields 0 and 1 (copied) */
} cm_progressive_resizing_config;
cm_progressive_resizing_config cm_progressive_resizing_config_default(void);
/* Errors: CM_ERR_INVALID_ARG naming the argument (Composer's checks; size_increment < 1), CM_ERR_OOM. */
cm_status cm_progressive_resizing_new(const cm_progressive_resizing_config *cfg, cm_algorithm_plugin *out);

/* The unpinned scale at elapsed fraction e (the formula above). */
double cm_progressive_resizing_scale(const cm_progressive_resizing_config *cfg, double elapsed);
/* The scale pinned to size_increment for an image `width` wide (the formula above). */
double cm_progressive_resizing_pinned_scale(double scale, int64_t width, int64_t size_increment);

/* composer.functional.resize_batch: *out_input (and *out_target when resize_targets) new
 * contiguous tensors (the caller frees them with cm_tensor_free), input (N, C, H, W) resized to
 * (N, C, floor(H·s), floor(W·s)) — resize: F.interpolate(scale_factor = s, mode "nearest",
 * recompute_scale_factor False), i.e. source index floor(i·(1/s)) in f32, clamped; crop: the crop
 * at a (top, left) drawn from rng, uniform in [0, H - h) × [0, W - w) — and a target (N, H, W)
 * (class indices) or (N, C, H, W) treated alike. With scale_factor >= 1 (nothing to do) or
 * !resize_targets the outputs not resized are copies. target may be NULL when !resize_targets
 * (*out_target is then NULL). Errors: CM_ERR_SHAPE (input not 4-D, a target that cannot be
 * resized, an empty result), CM_ERR_INVALID_ARG (NULLs, scale <= 0 or not finite, a bad mode),
 * CM_ERR_OOM. */
cm_status cm_resize_batch(const cm_tensor *input, const cm_tensor *target, double scale_factor, cm_resize_mode mode,
                          bool resize_targets, cm_rng *rng, cm_tensor **out_input, cm_tensor **out_target);

/* =============================================================================================
 * SeqLengthWarmup (Composer's SeqLengthWarmup: duration 0.3, min_seq_length 8,
 * max_seq_length 1024, step_size 8, truncate true, preserve_end_of_sequence false)
 *
 * On INIT: checks that the train dataset has an "input_ids" field of sequences (Composer requires
 * a HuggingFaceModel). On the first AFTER_DATALOADER of each trainer (also after resuming): the
 * "activation" of Composer's _activate_model — a dry run (cm_state_dry_run) of the batch cut to
 * max_seq_length, so the arena is claimed at full length up front and automatic microbatching
 * settles on a size that fits the longest sequences. Then, on every AFTER_DATALOADER, with T the
 * run's batches (max_duration in ep or ba), W = int(T·duration), U = (max - min) // step_size and
 * every = W // U, the length is min(max, min + step_size·(batch // every)) and every field of the
 * batch is cut to it (truncate: each row's first L tokens; preserve_end_of_sequence keeps each
 * row's last real token, by attention_mask, at its truncated position) or reshaped (truncate
 * false: the batch's tokens re-cut into rows of L, the remainder dropped, so the batch has more,
 * shorter rows). Time counts the new batch's samples and tokens, as Composer's. Logs
 * seq_length_warmup/curr_seq_len and /curr_bs.
 * Composer divides by zero when every or U is 0 (a warmup shorter than its steps, or max - min <
 * step_size); here U is at least 1 and every at least 1 (so the length grows one step per batch),
 * and duration 0 means no warmup (always max_seq_length).
 * =========================================================================================== */

typedef struct cm_seq_length_warmup_config {
    double duration;               /* 0.3, in [0, 1] */
    int64_t min_seq_length;        /* 8, >= 1 */
    int64_t max_seq_length;        /* 1024, >= min_seq_length */
    int64_t step_size;             /* 8, >= 1 */
    bool truncate;                 /* true */
    bool preserve_end_of_sequence; /* false; needs an attention_mask; ignored with truncate false */
} cm_seq_length_warmup_config;
cm_seq_length_warmup_config cm_seq_length_warmup_config_default(void);
/* Errors: CM_ERR_INVALID_ARG naming the argument (Composer's checks, min >= 1, step >= 1),
 * CM_ERR_OOM. */
cm_status cm_seq_length_warmup_new(const cm_seq_length_warmup_config *cfg, cm_algorithm_plugin *out);

/* The length at global batch `batch` of a run of `total_batches` batches (the formula above). */
int64_t cm_seq_length_warmup_length(const cm_seq_length_warmup_config *cfg, int64_t batch, int64_t total_batches);

/* composer.functional.set_batch_sequence_length over n named fields (B, T, ...): out[i] new
 * contiguous tensors (the caller frees them) cut to seq_len as above, or, when seq_len >= T,
 * copies. With truncate false every field must have input_ids' shape (B, T) and out has
 * (B·T // L, L); *out_rows (may be NULL) gets the new row count. preserve_end_of_sequence needs a
 * field "attention_mask" and is ignored with truncate false (as Composer). Errors: CM_ERR_SHAPE
 * (a field with fewer than 2 dims or another (B, T), or other shapes with truncate false),
 * CM_ERR_NOT_FOUND (no input_ids with truncate false, no attention_mask with
 * preserve_end_of_sequence), CM_ERR_INVALID_ARG (seq_len < 1, NULLs), CM_ERR_OOM; on error
 * nothing is allocated. */
cm_status cm_set_batch_sequence_length(const char *const *names, cm_tensor *const *fields, int n, int64_t seq_len,
                                       bool truncate, bool preserve_end_of_sequence, cm_tensor **out,
                                       int64_t *out_rows);

/* =============================================================================================
 * SelectiveBackprop (Composer's SelectiveBackprop: start 0.5, end 0.9, keep 0.5,
 * scale_factor 1.0, interrupt 2)
 *
 * On AFTER_DATALOADER of the batches cm_should_selective_backprop picks: an extra forward of the
 * batch without gradients (in training mode, in the trainer's precision, in chunks of the
 * microbatch size; input downscaled bilinearly by scale_factor when < 1) gives each sample's loss
 * — the model's own loss of that row — and int(keep·N) rows are kept, drawn without replacement
 * with probabilities rising with the loss's rank (cm_select_using_loss): the batch becomes those
 * rows (every field), so the step trains on the harder samples. Time counts the kept samples, as
 * Composer's. Per rank, on its own rows. As in Composer the extra forward runs in training mode:
 * dropout draws from its streams and batch norm updates its running statistics with the whole
 * batch (deterministically, so runs still resume exactly). Not under a sharded strategy on several ranks
 * (CM_ERR_UNSUPPORTED: the extra forward would need the ranks' parameter gathers in step).
 * =========================================================================================== */

typedef struct cm_selective_backprop_config {
    double start;        /* 0.5: the first elapsed fraction with selection */
    double end;          /* 0.9: selection stops at this elapsed fraction */
    double keep;         /* 0.5: the fraction of each batch kept, in (0, 1] (1 = never select) */
    double scale_factor; /* 1.0: downscaling of the selection forward's input, in (0, 1] */
    int64_t interrupt;   /* 2: every interrupt-th batch of an epoch trains on the whole batch; 0 = never */
    const char *input_key, *target_key; /* NULL = fields 0 and 1 (copied) */
} cm_selective_backprop_config;
cm_selective_backprop_config cm_selective_backprop_config_default(void);
/* Errors: CM_ERR_INVALID_ARG naming the argument, CM_ERR_OOM. */
cm_status cm_selective_backprop_new(const cm_selective_backprop_config *cfg, cm_algorithm_plugin *out);

/* Composer's should_selective_backprop: start <= elapsed < end and (interrupt == 0 or
 * (batch_in_epoch + 1) % interrupt != 0). */
bool cm_should_selective_backprop(double elapsed, int64_t batch_in_epoch, double start, double end, int64_t interrupt);

/* The selection of composer.functional.select_using_loss from per-sample losses (n of them):
 * rows sorted by loss ascending, the i-th getting weight ((i + 0.5)/n)^(1/keep - 1), and
 * int(keep·n) of them drawn without replacement with probability proportional to their weights —
 * numpy.random.choice(n, k, replace=False, p) — draw j taking the remaining row at which the
 * running weight sum first exceeds u[j]·(the remaining total). u: k uniforms in [0, 1) (NULL =
 * draw them from rng). select (k entries) gets the chosen rows' indices in draw order, *n_select
 * = k. Errors: CM_ERR_INVALID_ARG (n < 1, keep outside (0, 1], NULLs). */
cm_status cm_select_using_loss(const float *losses, int64_t n, double keep, const double *u, cm_rng *rng,
                               int64_t *select, int64_t *n_select);

/* F.interpolate(x, scale_factor = s, mode "bilinear", align_corners False, recompute_scale_factor
 * False) of x (N, C, H, W) f32 contiguous into a new tensor (N, C, floor(H·s), floor(W·s)) (the
 * caller frees it): SelectiveBackprop's downscaled selection input. Errors: CM_ERR_SHAPE,
 * CM_ERR_DTYPE, CM_ERR_INVALID_ARG (s not in (0, 1], an empty result), CM_ERR_OOM. */
cm_status cm_interpolate_bilinear(const cm_tensor *x, double scale_factor, cm_tensor **out);

/* =============================================================================================
 * ColOut (Composer's ColOut: p_row 0.15, p_col 0.15, batch true, resize_target auto)
 *
 * On AFTER_DATALOADER: int((1 - p_row)·H) rows and int((1 - p_col)·W) columns are kept (a random
 * subset, in order) and the rest dropped — the same ones for the whole batch (batch true), or
 * different ones per sample (batch false; Composer then adds a transform to the dataset, here each
 * sample's rows and columns are drawn from (seed, epoch, dataset index), which is the same per-
 * sample augmentation independent of workers and ranks). With resize_target true, or auto and a
 * target with the input's height and width, the target loses the same rows and columns.
 * Applies to images (N, C, H, W) (any dtype).
 * =========================================================================================== */

typedef enum cm_resize_target {
    CM_RESIZE_TARGET_AUTO = 0, /* "auto": when the target has the input's (H, W) */
    CM_RESIZE_TARGET_NO = 1,   /* false */
    CM_RESIZE_TARGET_YES = 2,  /* true */
} cm_resize_target;

typedef struct cm_colout_config {
    double p_row, p_col;            /* 0.15 each, in [0, 1] */
    bool batch;                     /* true */
    cm_resize_target resize_target; /* auto */
    const char *input_key, *target_key; /* NULL = fields 0 and 1 (copied) */
} cm_colout_config;
cm_colout_config cm_colout_config_default(void);
/* Errors: CM_ERR_INVALID_ARG (p outside [0, 1]), CM_ERR_UNSUPPORTED (resize_target true with
 * batch false, as Composer's NotImplementedError), CM_ERR_OOM. */
cm_status cm_colout_new(const cm_colout_config *cfg, cm_algorithm_plugin *out);

/* composer.functional.colout_batch: drops the same random rows and columns from every image of
 * input (..., H, W) and, when target is not NULL, from target (..., H, W) too (same H and W):
 * *out_input (and *out_target) new contiguous tensors (the caller frees them). Errors:
 * CM_ERR_SHAPE (fewer than 2 dims, a target of another size), CM_ERR_INVALID_ARG (p outside
 * [0, 1], NULLs), CM_ERR_OOM. */
cm_status cm_colout_batch(const cm_tensor *input, const cm_tensor *target, double p_row, double p_col, cm_rng *rng,
                          cm_tensor **out_input, cm_tensor **out_target);

/* =============================================================================================
 * The Pillow operations of AugMix and RandAugment, on u8 images
 *
 * Images are u8 (C, H, W), contiguous, C = 1 (Pillow's "L") or 3 ("RGB") — the layout of the
 * datasets' raw pixels. Each function computes what Pillow 9 computes, pixel for pixel (tests
 * compare them with Debian's python3-pil exactly): look-up tables per band, bilinear resampling
 * of the pixel centres with black outside (truncated to u8, as Pillow), and ImageEnhance's blends.
 * in and out may be the same memory except for the geometric ones (rotate, affine). Errors:
 * CM_ERR_SHAPE (C not 1 or 3, an empty image), CM_ERR_INVALID_ARG (NULLs, overlap, a bad
 * parameter), CM_ERR_OOM. Thread-safe.
 * =========================================================================================== */

cm_status cm_pil_autocontrast(const uint8_t *in, int64_t C, int64_t H, int64_t W, uint8_t *out); /* ImageOps.autocontrast */
cm_status cm_pil_equalize(const uint8_t *in, int64_t C, int64_t H, int64_t W, uint8_t *out);     /* ImageOps.equalize */
/* ImageOps.posterize(image, bits), bits in [0, 8]. */
cm_status cm_pil_posterize(const uint8_t *in, int64_t C, int64_t H, int64_t W, int bits, uint8_t *out);
/* ImageOps.solarize(image, threshold): pixels >= threshold become 255 - pixel. */
cm_status cm_pil_solarize(const uint8_t *in, int64_t C, int64_t H, int64_t W, int threshold, uint8_t *out);
/* image.rotate(degrees, resample=BILINEAR): counter-clockwise about the centre, same size. */
cm_status cm_pil_rotate(const uint8_t *in, int64_t C, int64_t H, int64_t W, double degrees, uint8_t *out);
/* image.transform(size, AFFINE, a, resample=BILINEAR): output (x, y) reads the input at
 * (a0·x + a1·y + a2, a3·x + a4·y + a5) of pixel centres — shear_x is (1, s, 0, 0, 1, 0), translate_x
 * (1, 0, t, 0, 1, 0). */
cm_status cm_pil_affine(const uint8_t *in, int64_t C, int64_t H, int64_t W, const double a[6], uint8_t *out);
/* ImageEnhance.Color / Contrast / Brightness / Sharpness(image).enhance(factor). */
cm_status cm_pil_color(const uint8_t *in, int64_t C, int64_t H, int64_t W, double factor, uint8_t *out);
cm_status cm_pil_contrast(const uint8_t *in, int64_t C, int64_t H, int64_t W, double factor, uint8_t *out);
cm_status cm_pil_brightness(const uint8_t *in, int64_t C, int64_t H, int64_t W, double factor, uint8_t *out);
cm_status cm_pil_sharpness(const uint8_t *in, int64_t C, int64_t H, int64_t W, double factor, uint8_t *out);

/* Composer's augmentation functions (augmentation_primitives.py): each draws its strength from
 * the severity (0..10) — e.g. rotate by ±int(U(0.1, severity)·3) degrees, solarize at
 * 256 - int(U(0.1, severity)·25.6) — then applies the Pillow operation above. */
#define CM_AUGMENT_OP_LIST(X)                                    \
    X(CM_AUGMENT_AUTOCONTRAST, "autocontrast")                   \
    X(CM_AUGMENT_EQUALIZE, "equalize")                           \
    X(CM_AUGMENT_POSTERIZE, "posterize")                         \
    X(CM_AUGMENT_ROTATE, "rotate")                               \
    X(CM_AUGMENT_SOLARIZE, "solarize")                           \
    X(CM_AUGMENT_SHEAR_X, "shear_x")                             \
    X(CM_AUGMENT_SHEAR_Y, "shear_y")                             \
    X(CM_AUGMENT_TRANSLATE_X, "translate_x")                     \
    X(CM_AUGMENT_TRANSLATE_Y, "translate_y")                     \
    X(CM_AUGMENT_COLOR, "color")                                 \
    X(CM_AUGMENT_CONTRAST, "contrast")                           \
    X(CM_AUGMENT_BRIGHTNESS, "brightness")                       \
    X(CM_AUGMENT_SHARPNESS, "sharpness")                         \
    X(CM_AUGMENT_COLOR_ORIGINAL, "color_original")               \
    X(CM_AUGMENT_CONTRAST_ORIGINAL, "contrast_original")         \
    X(CM_AUGMENT_BRIGHTNESS_ORIGINAL, "brightness_original")     \
    X(CM_AUGMENT_SHARPNESS_ORIGINAL, "sharpness_original")

typedef enum cm_augment_op {
#define CM_X_(name, str) name,
    CM_AUGMENT_OP_LIST(CM_X_)
#undef CM_X_
    CM_AUGMENT_OP_COUNT
} cm_augment_op;

/* Composer's augmentation_sets: "all" (the first thirteen), "safe" (the nine that ImageNet-C and
 * CIFAR-10-C do not test: no color, contrast, brightness, sharpness), "original" (the nine and the
 * *_original enhancements of google-research/augmix). */
#define CM_AUGMENTATION_SET_LIST(X)                  \
    X(CM_AUGMENTATION_SET_ALL, "all")                \
    X(CM_AUGMENTATION_SET_SAFE, "safe")              \
    X(CM_AUGMENTATION_SET_ORIGINAL, "original")

typedef enum cm_augmentation_set {
#define CM_X_(name, str) name,
    CM_AUGMENTATION_SET_LIST(CM_X_)
#undef CM_X_
    CM_AUGMENTATION_SET_COUNT
} cm_augmentation_set;

const char *cm_augment_op_name(cm_augment_op op);            /* "rotate"; "?" out of range */
const char *cm_augmentation_set_name(cm_augmentation_set s); /* "all"; "?" out of range */
/* Exact names, as Composer's keys; CM_ERR_INVALID_ARG listing them otherwise. */
cm_status cm_augmentation_set_parse(const char *s, cm_augmentation_set *out);
/* The set's operations into ops (room for CM_AUGMENT_OP_COUNT); returns how many (0 for a bad set). */
int cm_augmentation_set_ops(cm_augmentation_set set, cm_augment_op *ops);
/* One augmentation function at `severity`, drawing from rng. Errors as the operations'. */
cm_status cm_augment_op_apply(cm_augment_op op, double severity, cm_rng *rng, const uint8_t *in, int64_t C, int64_t H,
                              int64_t W, uint8_t *out);

/* =============================================================================================
 * RandAugment (Composer's RandAugment: severity 9, depth 2, augmentation_set "all") and AugMix
 * (Composer's AugMix: severity 3, depth -1, width 3, alpha 1.0, augmentation_set "all")
 *
 * RandAugment applies `depth` operations drawn uniformly from the set. AugMix makes `width` chains
 * of `depth` operations (depth <= 0: 1 to 3, drawn per chain) from the image, and mixes:
 * out = (1 - m)·image + m·Σ w_i·chain_i, w ~ Dirichlet(alpha), m ~ Beta(alpha, alpha), in f32,
 * truncated to u8 (Composer's _augmix_pil_image).
 *
 * Composer inserts them as a transform of a torchvision dataset's PIL images at FIT_START. Here
 * the same place is the image datasets' augmentation (datasets.h, cm_image_augment.u8_transform:
 * set it to cm_randaugment_transform / cm_augmix_transform with the config as its data): on the
 * raw pixels after the crop and flip, before normalisation, in the loader's workers, each sample's
 * draws keyed by (the loader's seed, the epoch, the dataset index) — the same images for any
 * number of workers and ranks, and after resuming. `composer train` does that for
 * algorithms.randaugment / algorithms.augmix. The plugins do the same on AFTER_DATALOADER for
 * batches that are u8 images (N, C, H, W) (a model that normalises itself): keyed by (the trainer's
 * seed, the batch's epoch, each row's dataset index); a float batch is refused with this advice.
 * =========================================================================================== */

typedef struct cm_randaugment_config {
    int severity;                         /* 9, in [0, 10] */
    int depth;                            /* 2, >= 0 */
    cm_augmentation_set augmentation_set; /* all */
} cm_randaugment_config;
cm_randaugment_config cm_randaugment_config_default(void);

typedef struct cm_augmix_config {
    int severity;                         /* 3, in [0, 10] */
    int depth;                            /* -1: 1 to 3 per chain; > 0: that many */
    int width;                            /* 3, >= 1: the chains */
    double alpha;                         /* 1.0, > 0 */
    cm_augmentation_set augmentation_set; /* all */
} cm_augmix_config;
cm_augmix_config cm_augmix_config_default(void);

/* composer.functional.randaugment_image / augmix_image on one image (in may be out); cfg NULL =
 * the defaults. Errors: CM_ERR_INVALID_ARG (Composer's argument checks; alpha > 0), the
 * operations' errors. */
cm_status cm_randaugment_image(const cm_randaugment_config *cfg, cm_rng *rng, const uint8_t *in, int64_t C, int64_t H,
                               int64_t W, uint8_t *out);
cm_status cm_augmix_image(const cm_augmix_config *cfg, cm_rng *rng, const uint8_t *in, int64_t C, int64_t H, int64_t W,
                          uint8_t *out);
/* AugMix's mixing of n pixels: out = trunc((1 - mixing)·in + mixing·Σ_i weights[i]·chains[i]) in
 * f32, clipped to [0, 255]. */
cm_status cm_augmix_combine(const uint8_t *in, const uint8_t *const *chains, const float *weights, int width,
                            float mixing, int64_t n, uint8_t *out);
/* The dataset form (cm_image_augment.u8_transform): augments img in place with draws keyed by
 * (seed, epoch, index); data is a const cm_randaugment_config * / cm_augmix_config * (NULL = the
 * defaults). Thread-safe. */
cm_status cm_randaugment_transform(uint8_t *img, int64_t C, int64_t H, int64_t W, uint64_t seed, int64_t epoch,
                                   int64_t index, const void *data);
cm_status cm_augmix_transform(uint8_t *img, int64_t C, int64_t H, int64_t W, uint64_t seed, int64_t epoch,
                              int64_t index, const void *data);

/* The plugins "RandAugment" and "AugMix" (see above), on the field input_key (NULL = field 0;
 * copied). Errors: the configs' checks, CM_ERR_OOM. */
cm_status cm_randaugment_new(const cm_randaugment_config *cfg, const char *input_key, cm_algorithm_plugin *out);
cm_status cm_augmix_new(const cm_augmix_config *cfg, const char *input_key, cm_algorithm_plugin *out);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_DATA_ALGOS_H */
