/*
 * composer/trainer.h — the training loop, after Composer: events, the state plugins see, the
 * engine that runs algorithms, callbacks and loggers on each event, and the Trainer
 * (fit / eval / predict / close) with microbatching, mixed precision and metrics.
 *
 * The loop is a sequence of events (Composer's names and order, listed in CM_EVENT_LIST). At each
 * event the engine runs the algorithms whose match() accepts it (ordered by the ordering passes:
 * SelectiveBackprop first and LowPrecisionLayerNorm last, then reversed on AFTER_* events so
 * before/after pairs nest), then the callbacks, then the loggers. On
 * INIT the order is loggers, callbacks, algorithms. Plugins are vtables with an abi number and a
 * `void *self`; registering one hands `self` to the engine, which frees it.
 *
 *     cm_model *model = ...;                                  // e.g. cm_model_classifier_new
 *     cm_dataloader *train = ..., *test = ...;                 // test: cm_dataloader_config_eval()
 *     cm_algorithm_plugin clip;
 *     cm_grad_clip_new(CM_GRAD_CLIP_NORM, 1.0, &clip);         // composer/algorithms.h
 *     cm_in_memory_logger *mem;
 *     cm_logger_plugin memp;
 *     cm_in_memory_logger_new(&mem, &memp);
 *
 *     cm_trainer_config cfg = cm_trainer_config_default();
 *     cfg.model = model;
 *     cfg.train_dataloader = train;
 *     cfg.eval_dataloader = test;
 *     cm_time_parse("2ep", &cfg.max_duration);
 *     cfg.device_train_microbatch_size = 16;
 *     cfg.precision = CM_PRECISION_AMP_BF16;
 *     cfg.algorithms = &clip;  cfg.n_algorithms = 1;
 *     cfg.loggers = &memp;     cfg.n_loggers = 1;
 *     cm_trainer *tr;
 *     if (cm_trainer_new(&cfg, &tr) != CM_OK || cm_trainer_fit(tr, NULL) != CM_OK)
 *         fprintf(stderr, "error: %s\n", cm_last_error());
 *     double acc;
 *     if (cm_in_memory_logger_last(mem, "metrics/eval/MulticlassAccuracy", &acc) == CM_OK)
 *         printf("accuracy %.4f\n", acc);
 *     cm_trainer_free(tr);                                     // closes and frees the plugins
 *
 * The fit loop, event by event (eval is run where the eval interval says, see cfg.eval_interval):
 *
 *   INIT, BEFORE_LOAD, AFTER_LOAD                             (cm_trainer_new)
 *   FIT_START, ITERATION_START                                (each cm_trainer_fit)
 *   per epoch:  EPOCH_START
 *     per batch:  BEFORE_DATALOADER, AFTER_DATALOADER, BATCH_START, BEFORE_TRAIN_BATCH,
 *                 per microbatch: BEFORE_FORWARD, AFTER_FORWARD, BEFORE_LOSS, AFTER_LOSS,
 *                                 BEFORE_BACKWARD, AFTER_BACKWARD
 *                 AFTER_TRAIN_BATCH, (optimizer step), BATCH_END, [eval], BATCH_CHECKPOINT
 *                 (a custom train step may run BEFORE_TRAIN_BATCH ... AFTER_TRAIN_BATCH more than
 *                 once before its optimizer step: see cm_state_set_train_step)
 *     BEFORE_DATALOADER (finds the epoch exhausted), EPOCH_END, [eval], EPOCH_CHECKPOINT
 *   ITERATION_END, ITERATION_CHECKPOINT, FIT_END
 *   eval:        EVAL_BEFORE_ALL, per evaluator: EVAL_START, per batch: EVAL_BATCH_START,
 *                EVAL_BEFORE_FORWARD, EVAL_AFTER_FORWARD, EVAL_BATCH_END; EVAL_END; EVAL_AFTER_ALL
 *   standalone:  EVAL_STANDALONE_START, (EVAL_START ... EVAL_END) per evaluator, EVAL_STANDALONE_END
 *   predict:     PREDICT_START, per batch: PREDICT_BATCH_START, PREDICT_BEFORE_FORWARD,
 *                PREDICT_AFTER_FORWARD, PREDICT_BATCH_END; PREDICT_END
 *
 * When max_duration is reached in the middle of an epoch, the loop stops after BATCH_CHECKPOINT
 * (no final BEFORE_DATALOADER); if that batch was the epoch's last, EPOCH_END and
 * EPOCH_CHECKPOINT still fire, as in Composer.
 *
 * Differences from Composer, on purpose:
 *  - ITERATION_START fires at the start of each fit and ITERATION_END / ITERATION_CHECKPOINT at
 *    the end of a fit that reached max_duration, so the pairs always nest (Composer fires
 *    ITERATION_END only with an iteration length set, so by default never).
 *  - BEFORE_TRAIN_BATCH fires once per batch, also when automatic microbatching retries the batch
 *    with a smaller microbatch (Composer fires it again on each retry); under a custom train step
 *    (cm_state_set_train_step, e.g. SAM) it fires once per gradient computation, as in Composer.
 *  - Evaluation runs each batch whole (no eval microbatching); padded rows of an eval batch are
 *    run through the model but not counted by the metrics.
 *  - seed defaults to 42 rather than a random seed, so runs are reproducible by default.
 *
 * Determinism. Given the seed, the data (the loader's own seed: set it from the same seed) and
 * the thread count, a run is bitwise reproducible: dropout draws from counter-based streams
 * seeded by cm_module_set_seed(model, seed), the loader's order is a pure function of (seed,
 * epoch, position), every kernel is deterministic for a fixed number of threads (OpenMP loops use
 * static schedules; reductions are split the same way each time) and the schedulers are pure
 * functions of the timestamp. Changing the thread count (CM_NUM_THREADS, cm_set_num_threads) may
 * change how GEMMs and reductions are blocked and so the last bits of the results.
 * deterministic_mode makes that a checked guarantee: the trainer records cm_num_threads() when it
 * is created and refuses to fit, eval or predict (CM_ERR_STATE) if the count has changed.
 *
 * Threading: a trainer, its state and its engine belong to one thread.
 */
#ifndef COMPOSER_TRAINER_H
#define COMPOSER_TRAINER_H

#include <composer/data.h>
#include <composer/model.h>
#include <composer/optim.h>
#include <composer/time.h>
#include <composer/checkpoint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* =============================================================================================
 * Events
 * =========================================================================================== */

/* X-macro list: enum suffix, Composer's value string, kind (BEFORE: has a matching after event;
 * AFTER: Composer's is_after_event; NONE: neither), in Composer's order. Algorithms run in
 * reverse order on the AFTER_* events only (see cm_ordering_pass_filo). */
#define CM_EVENT_LIST(X)                                          \
    X(INIT, "init", NONE)                                         \
    X(BEFORE_LOAD, "before_load", BEFORE)                         \
    X(AFTER_LOAD, "after_load", AFTER)                            \
    X(FIT_START, "fit_start", BEFORE)                             \
    X(ITERATION_START, "iteration_start", BEFORE)                 \
    X(EPOCH_START, "epoch_start", BEFORE)                         \
    X(BEFORE_DATALOADER, "before_dataloader", BEFORE)             \
    X(AFTER_DATALOADER, "after_dataloader", AFTER)                \
    X(BATCH_START, "batch_start", BEFORE)                         \
    X(BEFORE_TRAIN_BATCH, "before_train_batch", BEFORE)           \
    X(BEFORE_FORWARD, "before_forward", BEFORE)                   \
    X(AFTER_FORWARD, "after_forward", AFTER)                      \
    X(BEFORE_LOSS, "before_loss", BEFORE)                         \
    X(AFTER_LOSS, "after_loss", AFTER)                            \
    X(BEFORE_BACKWARD, "before_backward", BEFORE)                 \
    X(AFTER_BACKWARD, "after_backward", AFTER)                    \
    X(AFTER_TRAIN_BATCH, "after_train_batch", AFTER)              \
    X(BATCH_END, "batch_end", AFTER)                              \
    X(BATCH_CHECKPOINT, "batch_checkpoint", NONE)                 \
    X(EPOCH_END, "epoch_end", AFTER)                              \
    X(EPOCH_CHECKPOINT, "epoch_checkpoint", NONE)                 \
    X(ITERATION_END, "iteration_end", AFTER)                      \
    X(ITERATION_CHECKPOINT, "iteration_checkpoint", NONE)         \
    X(FIT_END, "fit_end", AFTER)                                  \
    X(EVAL_BEFORE_ALL, "eval_before_all", BEFORE)                 \
    X(EVAL_START, "eval_start", BEFORE)                           \
    X(EVAL_BATCH_START, "eval_batch_start", BEFORE)               \
    X(EVAL_BEFORE_FORWARD, "eval_before_forward", BEFORE)         \
    X(EVAL_AFTER_FORWARD, "eval_after_forward", AFTER)            \
    X(EVAL_BATCH_END, "eval_batch_end", AFTER)                    \
    X(EVAL_END, "eval_end", AFTER)                                \
    X(EVAL_AFTER_ALL, "eval_after_all", AFTER)                    \
    X(EVAL_STANDALONE_START, "eval_standalone_start", BEFORE)     \
    X(EVAL_STANDALONE_END, "eval_standalone_end", AFTER)          \
    X(PREDICT_START, "predict_start", BEFORE)                     \
    X(PREDICT_BATCH_START, "predict_batch_start", BEFORE)         \
    X(PREDICT_BEFORE_FORWARD, "predict_before_forward", BEFORE)   \
    X(PREDICT_AFTER_FORWARD, "predict_after_forward", AFTER)      \
    X(PREDICT_BATCH_END, "predict_batch_end", AFTER)              \
    X(PREDICT_END, "predict_end", AFTER)

typedef enum cm_event {
#define CM_X_(name, value, kind) CM_EVENT_##name,
    CM_EVENT_LIST(CM_X_)
#undef CM_X_
    CM_EVENT_COUNT
} cm_event;

/* "AFTER_LOSS" (the enum's suffix) and "after_loss" (Composer's value); "?" out of range. */
const char *cm_event_name(cm_event ev);
const char *cm_event_value(cm_event ev);
/* Parses either form, case-insensitive. CM_ERR_INVALID_ARG naming the string otherwise. */
cm_status cm_event_parse(const char *s, cm_event *out);
/* Composer's Event.is_before_event / is_after_event. */
bool cm_event_is_before(cm_event ev);
bool cm_event_is_after(cm_event ev);

/* =============================================================================================
 * Precision
 * =========================================================================================== */

/* fp32: everything in f32.
 * amp_bf16: the tape autocasts (cm_tape_set_autocast): matmul and linear cast their f32 inputs to
 *   bf16 (recorded casts, so gradients flow back to the f32 master weights) and run the bf16 GEMM
 *   with f32 accumulation; conv2d, attention, norms, softmax and losses stay f32 (there is no
 *   bf16 conv or attention kernel yet). The optimizer always updates the f32 master weights.
 * amp_fp16: not available — there are no fp16 CPU kernels here; cm_trainer_new refuses it with
 *   CM_ERR_UNSUPPORTED (use amp_bf16: the same memory savings without loss scaling). */
#define CM_PRECISION_LIST(X)                  \
    X(CM_PRECISION_FP32, "fp32")              \
    X(CM_PRECISION_AMP_BF16, "amp_bf16")      \
    X(CM_PRECISION_AMP_FP16, "amp_fp16")

typedef enum cm_precision {
#define CM_X_(name, str) name,
    CM_PRECISION_LIST(CM_X_)
#undef CM_X_
    CM_PRECISION_COUNT
} cm_precision;

const char *cm_precision_name(cm_precision p); /* "amp_bf16"; "?" out of range */
/* Case-insensitive; CM_ERR_INVALID_ARG listing the names otherwise. */
cm_status cm_precision_parse(const char *s, cm_precision *out);

/* One rank's piece of a wrap unit under sharded data parallelism (SHARD_GRAD_OP, FULL_SHARD):
 * the rank owns elements [begin, end) of unit `unit`'s flat buffers (cm_module_unit) and keeps
 * the f32 master values of those parameters, their optimizer state and, after sync_grads, their
 * global-batch gradient. Pieces of one unit over all ranks tile [0, numel) in rank order —
 * counting only the spans that are not replicas: under HYBRID_SHARD every piece is held by one
 * rank in each shard group, and all but the first (replica = true) hold copies. A sum over ranks
 * of something summed over the spans (a gradient norm) skips the replicas' spans; what changes
 * the pieces (clipping, the optimizer) changes them on every rank. */
typedef struct cm_shard_span {
    int unit;           /* index of the wrap unit */
    int64_t begin, end; /* this rank's elements of the unit's flat buffer, 0 <= begin <= end <= numel */
    float *params;      /* (end - begin): the master values the optimizer updates */
    float *grads;       /* (end - begin): the global batch's gradient, from sync_grads to the step */
    bool replica;       /* another rank (in the first shard group) holds the same piece: count it there */
} cm_shard_span;

/* =============================================================================================
 * The state: everything a plugin may look at
 * =========================================================================================== */

typedef struct cm_state cm_state;

/* An empty state (no model, zero timestamp, rank 0 of 1) for driving an engine by hand: tests
 * and custom loops. The trainer makes its own. Errors: CM_ERR_OOM. */
cm_status cm_state_new(cm_state **out);
void cm_state_free(cm_state *st); /* only for states from cm_state_new; NULL is a no-op */

/* Getters. Pointers are borrowed from the trainer; "during a batch" means valid from
 * AFTER_DATALOADER until BATCH_END (the microbatch ones from BEFORE_FORWARD to AFTER_BACKWARD);
 * tensors made on the tape (outputs, loss) are valid until the end of the microbatch. */
cm_model *cm_state_model(const cm_state *st);
/* Replaces the model the trainer trains (Composer's `state.model = ...`, as NoOpModel does): only
 * on INIT and while a checkpoint's required algorithms are applied (CM_ERR_STATE otherwise), so
 * the trainer makes its optimizer, metrics and lock for the new model. The model stays the
 * caller's (a plugin keeps it alive until its free, which comes after the trainer stops using it);
 * its module must be finalized (CM_ERR_STATE). A state from cm_state_new accepts it any time. */
cm_status cm_state_set_model(cm_state *st, cm_model *model);
cm_optim *cm_state_optimizer(const cm_state *st);
int cm_state_n_schedulers(const cm_state *st);
const cm_sched_config *cm_state_scheduler(const cm_state *st, int i); /* NULL out of range */
/* The learning-rate multiplier the last optimizer step used (product of the schedulers). */
double cm_state_lr_multiplier(const cm_state *st);
cm_dataloader *cm_state_train_dataloader(const cm_state *st);
/* The loader being iterated now (train, an evaluator's or predict's) and its label ("train",
 * the evaluator's label, "predict"); NULL / "" outside loops. */
cm_dataloader *cm_state_dataloader(const cm_state *st);
const char *cm_state_dataloader_label(const cm_state *st);
/* Global batches per epoch of the train loader (0 when there is none). */
int64_t cm_state_batches_per_epoch(const cm_state *st);
/* How many batches the loop over cm_state_dataloader runs (Composer's state.dataloader_len): the
 * train loader's batches per epoch during fit, an evaluator's batches limited by its
 * subset_num_batches during eval, predict's limited by its subset; -1 outside loops or when the
 * loader cannot say. */
int64_t cm_state_dataloader_len(const cm_state *st);
/* The current batch: the train batch (from AFTER_DATALOADER, the trainer's working copy of the
 * loader's, with the changes algorithms made on AFTER_DATALOADER; see cm_state_set_batch), or the
 * current microbatch between BEFORE_FORWARD and AFTER_BACKWARD (and the eval/predict batch in
 * those loops). NULL outside. */
cm_batch *cm_state_batch(const cm_state *st);
/* The same batch as the model sees it (field names, tensors, counts). NULL outside. */
const cm_model_batch *cm_state_model_batch(const cm_state *st);
/* The model's outputs (after AFTER_FORWARD / EVAL_AFTER_FORWARD / PREDICT_AFTER_FORWARD) and the
 * microbatch's loss (after AFTER_LOSS, before it is scaled by the microbatch's share). */
cm_tensor *cm_state_outputs(const cm_state *st);
cm_tensor *cm_state_loss(const cm_state *st);
/* Algorithms may replace them (e.g. a loss-modifying algorithm on AFTER_LOSS): the new tensor
 * must come from cm_state_tape (the trainer backpropagates whatever loss is set after AFTER_LOSS
 * and BEFORE_BACKWARD). */
void cm_state_set_outputs(cm_state *st, cm_tensor *outputs);
void cm_state_set_loss(cm_state *st, cm_tensor *loss);
cm_tape *cm_state_tape(const cm_state *st);
/* The loss of the last trained batch: Σ over microbatches (and ranks) of loss × share, i.e. the
 * full batch's mean loss. NaN before the first batch. */
double cm_state_total_loss(const cm_state *st);
const cm_timestamp *cm_state_timestamp(const cm_state *st);
/* The run's length (already scaled by the scale-schedule ratio); count 0 when not set yet. */
cm_time cm_state_max_duration(const cm_state *st);
/* The elapsed fraction of max_duration (see cm_timestamp_elapsed; in batches for epochs). */
cm_status cm_state_elapsed(const cm_state *st, double *out);
cm_precision cm_state_precision(const cm_state *st);
/* The microbatch size in use (rows; automatic microbatching may have lowered it), the number of
 * microbatches of the current batch and the index of the current one. */
int64_t cm_state_microbatch_size(const cm_state *st);
/* Whether the microbatch size is automatic (device_train_microbatch_size "auto"): a batch may be
 * thrown away and retried with smaller microbatches, so nothing may communicate during it. */
bool cm_state_microbatch_auto(const cm_state *st);
int64_t cm_state_n_microbatches(const cm_state *st);
int64_t cm_state_microbatch_index(const cm_state *st);
int cm_state_rank(const cm_state *st);       /* this process's rank (0 on one process) */
int cm_state_world_size(const cm_state *st); /* ranks in the job (1 on one process) */
/* Sums n doubles over all ranks in place (nothing to do on one process): for plugins that need
 * global quantities (norms, counts). Every rank must call it at the same point. Errors: the
 * communicator's. */
cm_status cm_state_all_reduce_sum(const cm_state *st, double *values, int n);
/* This rank's shard spans under a sharded strategy (*n = 0 and NULL when every rank holds all
 * parameters and gradients in the model's flat buffers). Gradient norms over the spans need
 * cm_state_all_reduce_sum to become global; over the flat buffers they already are (after
 * sync_grads every rank holds the global gradient). */
const cm_shard_span *cm_state_shard_spans(const cm_state *st, int *n);
uint64_t cm_state_seed(const cm_state *st);
const char *cm_state_run_name(const cm_state *st);
bool cm_state_progress_bar(const cm_state *st);

/* Metrics last computed for a loader label ("train", or an evaluator's label such as "eval"):
 * the value of the metric called `name`. CM_ERR_NOT_FOUND naming the label and the metric when
 * it has not been computed (yet). The listing form gives the i-th metric of a label. */
cm_status cm_state_metric(const cm_state *st, const char *label, const char *name, double *out);
int cm_state_n_metrics(const cm_state *st, const char *label);
cm_status cm_state_metric_at(const cm_state *st, const char *label, int i, const char **name, double *value);
/* The loader labels metrics are kept for: "train" (i = 0), then every evaluator's in order
 * ("eval", "eval/<label>", ...). NULL out of range. */
int cm_state_n_metric_labels(const cm_state *st);
const char *cm_state_metric_label_at(const cm_state *st, int i);

/* ---- What algorithms may change in the batch ----
 * Composer's algorithms change state.batch on the events Composer allows; here the changes go
 * through these calls, so the trainer knows what changed and keeps its counts consistent.
 *
 * On AFTER_DATALOADER (during fit) the batch is the trainer's working copy of the loader's
 * batch (the loader's own tensors are never touched): an algorithm may replace a field's tensor
 * (same rows; e.g. ProgressiveResizing's smaller images, CutOut's masked ones) or the whole batch
 * (other rows or sequence lengths: SelectiveBackprop's selected rows, SeqLengthWarmup's
 * truncation). The trainer counts samples and tokens after AFTER_DATALOADER, as Composer does, so
 * time, the microbatch weights and throughput follow the new batch; when any rank replaced its
 * batch the global counts and this rank's row offset (which key the dropout masks) are
 * recomputed from every rank's rows. Tensors given here must stay valid until BATCH_END (the
 * plugin owns them; e.g. it frees them on its next apply or in its free), be contiguous, and
 * have the batch's rows in dim 0.
 *
 * From BEFORE_FORWARD to BEFORE_BACKWARD (each microbatch) an algorithm may replace a field of
 * the model batch (cm_state_model_batch): what the model's forward and loss read for the rest of
 * the microbatch (MixUp's mixed inputs on BEFORE_FORWARD, LabelSmoothing's smoothed targets on
 * BEFORE_LOSS); the tensor may come from cm_state_tape (valid until the microbatch ends) and must
 * keep the microbatch's rows in dim 0. cm_state_batch keeps the loader's view of the microbatch,
 * and the training metrics are computed on the microbatch as it was before these changes (as
 * Composer's metrics use the batch copied at the microbatch's start).
 *
 * The event the engine is running now (CM_EVENT_COUNT outside events). */
cm_event cm_state_event(const cm_state *st);
/* Replaces the tensor of the field called `name` (see above for when and what). Errors:
 * CM_ERR_NOT_FOUND (no such field, listing the fields), CM_ERR_SHAPE (other rows in dim 0),
 * CM_ERR_INVALID_ARG (NULLs; a non-contiguous tensor on AFTER_DATALOADER), CM_ERR_STATE (another
 * event, or no batch). */
cm_status cm_state_set_batch_field(cm_state *st, const char *name, cm_tensor *t);
/* Replaces the whole train batch on AFTER_DATALOADER: fields, names, n_rows, n_samples, n_padded,
 * indices, valid, row_tokens and n_tokens are taken from *b (the struct is copied; its arrays,
 * strings and tensors are borrowed until BATCH_END; NULL arrays mean "every row is a sample with
 * no tokens", as cm_data_spec_split reads them); epoch, step and position stay the loader's. Errors:
 * CM_ERR_STATE (another event), CM_ERR_INVALID_ARG (inconsistent counts, a field without a name
 * or tensor, a non-contiguous one), CM_ERR_SHAPE (a field without n_rows rows). */
cm_status cm_state_set_batch(cm_state *st, const cm_batch *b);
/* A dry run of a train step on `batch` (on AFTER_DATALOADER during fit; Composer's
 * SeqLengthWarmup "activates" the model so): forward and backward of its microbatches exactly as
 * the trainer would train them (the microbatch size; automatic microbatching lowers it until the
 * batch fits, and keeps the size it found; the ranks' gradient synchronisation) — one gradient
 * computation, also under a custom train step — with no events, metrics, loss logging or
 * optimizer step. Afterwards everything is as before: gradients zeroed,
 * dropout counters and batch-norm statistics restored — only the arena has grown to the batch's
 * size (memory claimed up front) and an automatic microbatch size may be smaller. Every rank must
 * call it on the same batch step. Errors: CM_ERR_STATE (another event), CM_ERR_INVALID_ARG (a
 * field without the batch's rows, not contiguous), the model's errors and CM_ERR_OOM as
 * cm_trainer_fit's, prefixed "dry run of a N-row batch: ". */
cm_status cm_state_dry_run(cm_state *st, const cm_batch *batch);

/* Asks the trainer to stop after the current batch (Composer's state.stop_training()): the loop
 * finishes the batch (BATCH_END, BATCH_CHECKPOINT), then fires FIT_END. Callbacks receive a
 * const state and may still call this: it is the one change a callback may make. */
void cm_state_stop_training(const cm_state *st);
bool cm_state_stop_requested(const cm_state *st);

/* During BATCH_CHECKPOINT and EPOCH_CHECKPOINT: whether the trainer saves a checkpoint into
 * save_folder right after this event (the save interval is due, or training ends here) — what
 * Composer's algorithms ask its CheckpointSaver (EMA swaps its weights in for such a save).
 * false at every other event, without a save_folder, and for cm_trainer_save_checkpoint and the
 * save after a preemption signal. */
bool cm_state_checkpoint_due(const cm_state *st);

/* Learning-rate control for algorithms that own the schedule for a while (SWA's SWALR): from the
 * next optimizer step on, the multiplier of every group's lr is `multiplier` instead of the
 * product of the schedulers (NaN: the schedulers again, the default). multiplier must be ≥ 0 and
 * finite or NaN (CM_ERR_INVALID_ARG). The override is not saved in checkpoints: the algorithm
 * that sets it sets it again when its state is loaded (on AFTER_LOAD). */
cm_status cm_state_set_lr_multiplier_override(cm_state *st, double multiplier);
double cm_state_lr_multiplier_override(const cm_state *st); /* NaN when none */

/* ---- Custom train steps: closures, after Composer's optimizer.step(closure) ----
 *
 * A batch is normally one gradient computation — BEFORE_TRAIN_BATCH, every microbatch's forward
 * and backward (BEFORE_FORWARD ... AFTER_BACKWARD), the gradient synchronisation across ranks,
 * AFTER_TRAIN_BATCH — followed by one optimizer step. An algorithm that needs several gradient
 * computations per step (SAM: the gradient at w, then at w + e(w)) installs a train step with
 * cm_state_set_train_step; the trainer then calls it once per batch with a closure instead:
 *
 *   cm_train_closure_run(c)   one gradient computation at the model's current parameters, the
 *                             whole sequence above with its events (so GradientClipping and other
 *                             AFTER_TRAIN_BATCH algorithms act on every gradient, as inside
 *                             Composer's closure); it starts from zero gradients. The first run
 *                             of a batch gives the batch's loss and train metrics; later runs
 *                             update neither (Composer passes them a throw-away loss dict). Every
 *                             run draws dropout from the batch's starting counters, so all runs
 *                             of a batch see the same masks; batch-norm running statistics are
 *                             updated by every run, as in Composer.
 *   cm_train_closure_step(c)  the optimizer step with the batch's learning-rate multiplier (the
 *                             schedulers' product or the override), then the parameter
 *                             synchronisation of sharded strategies.
 *
 * The step function must run the closure at least once and step at most once per batch
 * (CM_ERR_STATE otherwise, naming the algorithm's step); it may leave the parameters as it
 * likes (SAM restores w before stepping). Errors it returns stop the fit like a plugin's error.
 * fn NULL restores the default. Setting a step when another algorithm's is installed fails with
 * CM_ERR_STATE naming both (two closure algorithms do not compose). `name` (static storage)
 * names the step in messages. */
typedef struct cm_train_closure cm_train_closure;
typedef cm_status (*cm_train_step_fn)(void *data, cm_state *st, cm_train_closure *c);
cm_status cm_state_set_train_step(cm_state *st, const char *name, cm_train_step_fn fn, void *data);
cm_status cm_train_closure_run(cm_train_closure *c);
cm_status cm_train_closure_step(cm_train_closure *c);

/* Asks the trainer to roll the batch in progress back (NaNMonitor's on_nan: rollback; callable
 * from a callback during a training batch, up to AFTER_TRAIN_BATCH). The trainer finishes the
 * batch's microbatches (so every rank runs the same collectives), then — on every rank, if any
 * rank asked — abandons it: no BATCH_END, no metrics, no checkpoint; it loads the last checkpoint
 * this trainer saved or resumed from (the whole state: weights, optimizer, timestamp, plugin
 * states; the loggers' too, so the FileLogger drops the rows logged since) and moves the train
 * loader past the abandoned batch, so the data of the batches since the checkpoint — this one
 * included — is skipped, and the run trains the same number of batches on later data. A skipped
 * range that reaches into the next epoch ends the checkpoint's epoch instead. The rollback is
 * logged (a warning naming the checkpoint and the skipped batches) and the metrics
 * trainer/rollback/skipped_batches and trainer/rollback/skipped_samples are logged at the batch
 * the run continues from. Without a checkpoint to go back to, fit fails with CM_ERR_STATE naming
 * the batch. */
void cm_state_rollback(const cm_state *st);
bool cm_state_rollback_requested(const cm_state *st);

/* Drops the state's outputs (FreeOutputs): a callback may call it from AFTER_LOSS on; the train
 * metrics are then not computed for the microbatch. */
void cm_state_free_outputs(const cm_state *st);

/* =============================================================================================
 * Logging: the handle plugins log through, and the logger vtable
 * =========================================================================================== */

/* One logged value: "loss/train/total", "metrics/eval/MulticlassAccuracy", "time/batch". */
typedef struct cm_metric_value {
    const char *name;
    double value;
} cm_metric_value;

typedef enum cm_hparam_kind { CM_HPARAM_NUMBER = 0, CM_HPARAM_STRING = 1, CM_HPARAM_BOOL = 2 } cm_hparam_kind;

/* One hyperparameter: a key and a number, a string or a bool (number != 0). */
typedef struct cm_hparam {
    const char *key;
    cm_hparam_kind kind;
    double number;
    const char *string;
} cm_hparam;

/* The logging handle the engine gives to algorithms and callbacks (Composer's Logger): each call
 * goes to every registered logger destination, stamped with the state's timestamp. Every
 * destination gets the call even when one fails; the first failure is returned with a message
 * "logger '<name>' failed to log metrics: ...". Strings are borrowed for the call only. */
typedef struct cm_logger cm_logger;
cm_status cm_logger_log_metrics(cm_logger *lg, const cm_metric_value *values, int n);
cm_status cm_logger_log_metric(cm_logger *lg, const char *name, double value);
cm_status cm_logger_log_hyperparameters(cm_logger *lg, const cm_hparam *hparams, int n);
/* A text under a key (a generated sample: Composer's Logger.log_table), stamped with the state's
 * timestamp: every destination with a log_text slot gets it, the others do not. Errors as
 * cm_logger_log_metrics. */
cm_status cm_logger_log_text(cm_logger *lg, const char *key, const char *text);

#define CM_LOGGER_ABI 1

/* A logger destination (console, file, tracker). Every slot but name and log_metrics is optional
 * (NULL). Each returns CM_OK or an error set with cm_set_error. `self` is the destination. */
typedef struct cm_logger_i {
    int abi;          /* CM_LOGGER_ABI */
    const char *name; /* "InMemoryLogger", "ConsoleLogger", ... (in messages) */
    /* On INIT, before run_event(INIT): the run's name, rank and world size are in the state. */
    cm_status (*init)(void *self, const cm_state *st);
    cm_status (*log_hyperparameters)(void *self, const cm_hparam *hparams, int n);
    /* Values (names and the array borrowed for the call) at timestamp ts (step = ts->batch). */
    cm_status (*log_metrics)(void *self, const cm_metric_value *values, int n, const cm_timestamp *ts);
    /* Every event, after the algorithms and callbacks (first on INIT): for progress bars. */
    cm_status (*run_event)(void *self, cm_event ev, const cm_state *st);
    cm_status (*flush)(void *self);
    /* At cm_engine_close / cm_trainer_close, after flush. */
    cm_status (*close)(void *self, const cm_state *st);
    void (*free)(void *self);
    /* Checkpoint state, as cm_callback_i's save / load (Composer's logger destinations are
     * callbacks with a state_dict): saved with every checkpoint, loaded between BEFORE_LOAD and
     * AFTER_LOAD of a resumed run. Optional (NULL: nothing kept). */
    size_t (*save)(void *self, char *buf, size_t cap);
    cm_status (*load)(void *self, const char *json, size_t len);
    /* A text (cm_logger_log_text) at timestamp ts. Optional (NULL: texts are not kept). */
    cm_status (*log_text)(void *self, const char *key, const char *text, const cm_timestamp *ts);
} cm_logger_i;

/* =============================================================================================
 * Algorithms and callbacks
 * =========================================================================================== */

#define CM_ALGORITHM_ABI 1

/* One tensor of an algorithm's checkpoint state: a contiguous buffer the algorithm owns (a save
 * reads it, a load writes it). name: unique within the algorithm, borrowed. */
typedef struct cm_plugin_tensor {
    const char *name;
    cm_dtype dtype;
    int ndim;
    int64_t shape[CM_MAX_DIMS];
    void *data;
} cm_plugin_tensor;

/* An algorithm changes the training (Composer's Algorithm): match(event, state) decides whether
 * apply runs on this event. name, match and apply are required; the rest may be NULL. */
typedef struct cm_algorithm_i {
    int abi;          /* CM_ALGORITHM_ABI */
    const char *name; /* "GradientClipping" (in traces and errors) */
    bool (*match)(void *self, cm_event ev, const cm_state *st);
    /* Returns CM_OK or an error set with cm_set_error; the engine prefixes it with
     * "plugin '<name>' failed on <EVENT>: ". */
    cm_status (*apply)(void *self, cm_event ev, cm_state *st, cm_logger *lg);
    /* Checkpoint state as a small JSON object: write at most cap bytes (NUL included) into buf
     * and return the length needed without the NUL, as snprintf; load parses it back. */
    size_t (*save)(void *self, char *buf, size_t cap);
    cm_status (*load)(void *self, const char *json, size_t len);
    cm_status (*close)(void *self, cm_state *st, cm_logger *lg);
    void (*free)(void *self);
    /* Optional: tensors of the checkpoint state, for what JSON cannot hold (EMA's averaged weights,
     * SWA's average). Writes up to cap entries into out and returns how many there are (call with
     * cap 0 to count); the list must not change after INIT. A checkpoint saves them in
     * algorithms.safetensors as "<name>/<tensor>" ("<name>#<k>/<tensor>" for the k-th algorithm
     * of the same name, k ≥ 1); loading checks every one (present, same dtype and shape: errors
     * name the tensor) before anything changes, copies them into data, then calls load with the
     * JSON state. Weights-only checkpoints hold none; sharded checkpoints refuse an algorithm
     * that has some (CM_ERR_UNSUPPORTED at the save). */
    int (*tensors)(void *self, cm_plugin_tensor *out, int cap);
} cm_algorithm_i;

#define CM_CALLBACK_ABI 1

/* A callback observes the run (Composer's Callback): run_event gets every event with a read-only
 * state (it may only ask to stop: cm_state_stop_training) and the logging handle. name and
 * run_event are required. */
typedef struct cm_callback_i {
    int abi;          /* CM_CALLBACK_ABI */
    const char *name; /* "SpeedMonitor", ... */
    cm_status (*run_event)(void *self, cm_event ev, const cm_state *st, cm_logger *lg);
    size_t (*save)(void *self, char *buf, size_t cap); /* as cm_algorithm_i.save */
    cm_status (*load)(void *self, const char *json, size_t len);
    cm_status (*close)(void *self, const cm_state *st, cm_logger *lg);
    void (*free)(void *self);
} cm_callback_i;

/* A plugin ready to register: its vtable and its state. Registration (cm_engine_add_*, or
 * cm_trainer_new) takes `self` on success; an unregistered plugin is freed with *_plugin_free. */
typedef struct cm_algorithm_plugin {
    const cm_algorithm_i *vt;
    void *self;
} cm_algorithm_plugin;
typedef struct cm_callback_plugin {
    const cm_callback_i *vt;
    void *self;
} cm_callback_plugin;
typedef struct cm_logger_plugin {
    const cm_logger_i *vt;
    void *self;
} cm_logger_plugin;

void cm_algorithm_plugin_free(cm_algorithm_plugin p); /* calls vt->free(self) if both are set */
void cm_callback_plugin_free(cm_callback_plugin p);
void cm_logger_plugin_free(cm_logger_plugin p);

/* =============================================================================================
 * The engine
 * =========================================================================================== */

typedef struct cm_engine cm_engine;
/* A registered algorithm (owned by the engine). */
typedef struct cm_algorithm cm_algorithm;
const char *cm_algorithm_name(const cm_algorithm *a);
void *cm_algorithm_self(const cm_algorithm *a);
const cm_algorithm_i *cm_algorithm_vtable(const cm_algorithm *a);

/* An ordering pass: reorders (and may drop) the n matched algorithms of event ev in place and
 * returns how many remain (0..n; entries must come from the input). Passes run in registration
 * order on each event's matched algorithms (Composer's algorithm passes). */
typedef int (*cm_ordering_pass_fn)(cm_algorithm **algs, int n, cm_event ev, const cm_state *st, void *data);
typedef struct cm_ordering_pass {
    cm_ordering_pass_fn fn;
    void *data;
} cm_ordering_pass;
/* The built-in passes every engine starts with, in this order (Composer's default passes, in
 * Composer's order):
 *  - cm_ordering_pass_selective_backprop_first (sort_selective_backprop_first): algorithms named
 *    "SelectiveBackprop" move to the front.
 *  - cm_ordering_pass_low_precision_layernorm_last (sort_low_precision_layernorm_last):
 *    algorithms named "LowPrecisionLayerNorm" move to the back, so on INIT its surgery comes after
 *    every surgery that adds LayerNorms (GatedLinearUnits).
 *  - cm_ordering_pass_filo (Composer's set_filo_order): reverses the order on the events whose
 *    name starts with AFTER_ (AFTER_LOAD, AFTER_DATALOADER, AFTER_FORWARD, AFTER_LOSS,
 *    AFTER_BACKWARD, AFTER_TRAIN_BATCH), so an algorithm that runs first on BEFORE_X runs last on
 *    AFTER_X (first in, last out); *_START / *_END events keep the registration order.
 * Both moves are stable (the others keep their order). Since FILO comes last, on AFTER_* events
 * the net order is reversed: SelectiveBackprop runs last on AFTER_DATALOADER, after the other
 * methods there changed the batch — Composer's net behaviour, kept so recipes compose the same. */
int cm_ordering_pass_filo(cm_algorithm **algs, int n, cm_event ev, const cm_state *st, void *data);
int cm_ordering_pass_selective_backprop_first(cm_algorithm **algs, int n, cm_event ev, const cm_state *st,
                                              void *data);
int cm_ordering_pass_low_precision_layernorm_last(cm_algorithm **algs, int n, cm_event ev, const cm_state *st,
                                                  void *data);

/* A new engine over `st` (borrowed; the trainer's state, or one from cm_state_new). Errors:
 * CM_ERR_INVALID_ARG (NULL), CM_ERR_OOM. */
cm_status cm_engine_new(cm_state *st, cm_engine **out);
/* Closes (if not closed yet; errors are logged) and frees every plugin. NULL is a no-op. */
void cm_engine_free(cm_engine *e);

/* Register a plugin. On success the engine owns p.self; on failure nothing is taken. Errors:
 * CM_ERR_INVALID_ARG (wrong abi or missing required slots, naming the plugin), CM_ERR_STATE
 * (engine closed), CM_ERR_OOM. Algorithms run in registration order (before the passes). */
cm_status cm_engine_add_algorithm(cm_engine *e, cm_algorithm_plugin p);
cm_status cm_engine_add_callback(cm_engine *e, cm_callback_plugin p);
cm_status cm_engine_add_logger(cm_engine *e, cm_logger_plugin p);
/* Inserts a pass at `index` (0 = first, before the three built-in passes; -1 = last). Errors:
 * CM_ERR_INVALID_ARG (NULL fn, index out of range), CM_ERR_OOM. */
cm_status cm_engine_add_ordering_pass(cm_engine *e, cm_ordering_pass pass, int index);

int cm_engine_n_algorithms(const cm_engine *e);
cm_algorithm *cm_engine_algorithm(const cm_engine *e, int i); /* registration order; NULL out of range */
int cm_engine_n_callbacks(const cm_engine *e);
cm_callback_plugin cm_engine_callback(const cm_engine *e, int i);
int cm_engine_n_loggers(const cm_engine *e);
cm_logger_plugin cm_engine_logger_plugin(const cm_engine *e, int i);
/* The logging handle (valid for the engine's life). */
cm_logger *cm_engine_logger(cm_engine *e);

/* Runs one event: matching algorithms (ordered by the passes), then callbacks, then loggers'
 * run_event; on INIT: loggers (init, then run_event), callbacks, algorithms. The first failure
 * stops the event: the status is returned and cm_last_error() reads
 * "plugin '<name>' failed on <EVENT>: <the plugin's message>". Errors also: CM_ERR_STATE (engine
 * closed), CM_ERR_INVALID_ARG (bad event; an ordering pass returning a bad count). */
cm_status cm_engine_run_event(cm_engine *e, cm_event ev);

/* One traced algorithm run of the last event run: which algorithm, its position in the run
 * order, and what apply returned. Algorithms that did not match are not traced. */
typedef struct cm_trace {
    const char *algorithm; /* borrowed from the vtable */
    cm_event event;
    int order;
    cm_status status;
} cm_trace;
int cm_engine_n_traces(const cm_engine *e);
const cm_trace *cm_engine_trace(const cm_engine *e, int i); /* NULL out of range */
/* How many times algorithm i (registration order) has been applied, over the engine's life. */
int64_t cm_engine_n_applied(const cm_engine *e, int i);

/* Closes every plugin: algorithms, then callbacks, then loggers (flush, then close) — all of
 * them, even when one fails — and returns the first error ("plugin '<name>' failed to close:
 * ..."). A second call does nothing and returns CM_OK. */
cm_status cm_engine_close(cm_engine *e);

/* =============================================================================================
 * InMemoryLogger: records every metric (Composer's InMemoryLogger)
 * =========================================================================================== */

typedef struct cm_in_memory_logger cm_in_memory_logger;

/* A new logger and its plugin (to register). The handle stays valid while the engine that owns
 * the plugin lives (or until cm_logger_plugin_free if it is never registered). Errors: CM_ERR_OOM. */
cm_status cm_in_memory_logger_new(cm_in_memory_logger **out, cm_logger_plugin *plugin);

/* One record: a logged value and the timestamp's batch and epoch at the time. */
typedef struct cm_log_record {
    const char *name; /* owned by the logger */
    double value;
    int64_t batch, epoch;
} cm_log_record;

int64_t cm_in_memory_logger_n(const cm_in_memory_logger *lg);
const cm_log_record *cm_in_memory_logger_record(const cm_in_memory_logger *lg, int64_t i); /* NULL out of range */
/* How many values were logged under `name`, and the latest one (CM_ERR_NOT_FOUND if none). */
int64_t cm_in_memory_logger_count(const cm_in_memory_logger *lg, const char *name);
cm_status cm_in_memory_logger_last(const cm_in_memory_logger *lg, const char *name, double *out);
/* The latest hyperparameter value logged under key, as a string ("%.17g" for numbers); NULL if none. */
const char *cm_in_memory_logger_hparam(const cm_in_memory_logger *lg, const char *key);
/* How many texts were logged under key, and the latest (NULL if none; valid while the logger lives). */
int64_t cm_in_memory_logger_text_count(const cm_in_memory_logger *lg, const char *key);
const char *cm_in_memory_logger_text(const cm_in_memory_logger *lg, const char *key);

/* =============================================================================================
 * The trainer
 * =========================================================================================== */

/* An evaluation set: metrics are logged as metrics/<label>/<Name>. */
typedef struct cm_evaluator {
    const char *label;          /* "eval" by default (copied) */
    cm_dataloader *dataloader;  /* borrowed; made with cm_dataloader_config_eval() (mode eval) */
    int64_t subset_num_batches; /* batches per evaluation; -1 = the trainer's eval_subset_num_batches */
    cm_time eval_interval;      /* count 0 (and frac 0) = the trainer's eval_interval */
} cm_evaluator;

cm_evaluator cm_evaluator_default(void); /* label "eval", subset -1, interval the trainer's */

/* Hooks for the distributed layer (composer/dist.h fills them with cm_dist_trainer_hooks). All
 * NULL / 0: one process. */
typedef struct cm_trainer_dist {
    int rank, world_size; /* 0 and 1 */
    /* Sums `n` doubles over all ranks in place (the batch loss, metric sums). */
    cm_status (*all_reduce_sum)(double *values, int n, void *data);
    /* After the last microbatch's backward, before AFTER_TRAIN_BATCH: make the gradients the
     * global batch's (all-reduce the flat gradient buffers; reduce-scatter into the shard spans). */
    cm_status (*sync_grads)(cm_state *st, void *data);
    /* After each optimizer step and after a checkpoint load wrote the shard spans: make the
     * model's flat parameter buffers agree with the spans (SHARD_GRAD_OP: all-gather; FULL_SHARD:
     * gather each unit again when it is next used). NULL when parameters are not sharded. */
    cm_status (*sync_params)(cm_state *st, void *data);
    /* Plain collectives, for checkpoints and plugins: a barrier; `bytes` bytes from root to all;
     * `bytes` from every rank into recv (world_size × bytes, rank order). */
    cm_status (*barrier)(void *data);
    cm_status (*broadcast)(void *buf, int64_t bytes, int root, void *data);
    cm_status (*all_gather)(const void *send, void *recv, int64_t bytes, void *data);
    /* Sharded strategies: this rank's pieces (borrowed; valid as long as `data`), in unit order.
     * n_shard_spans 0: every rank holds every parameter and gradient in the model's flat buffers. */
    const cm_shard_span *shard_spans;
    int n_shard_spans;
    /* FULL_SHARD: the model's flat parameter buffers are valid only while a unit is gathered (the
     * spans hold the parameters at rest); every microbatch then runs collectives, so all ranks run
     * the same number of microbatches (see cm_trainer_fit). */
    bool params_sharded;
    /* Every microbatch's forward or backward runs collectives (FULL_SHARD, SHARD_GRAD_OP): the
     * trainer gives every rank the same number of microbatches per batch. */
    bool collectives_per_microbatch;
    /* FULL_SHARD: installed as the trainer's tape fetch hook (cm_tape_set_fetch_hook, with data). */
    cm_tape_fetch_fn fetch;
    /* Replaces cm_module_zero_grad at the start of each batch (FULL_SHARD: zero the gradient
     * shards, release the full gradient buffers). NULL: cm_module_zero_grad. */
    cm_status (*zero_grad)(cm_state *st, void *data);
    void *data;
} cm_trainer_dist;

/* device_train_microbatch_size: automatic (halve on arena out-of-memory, retry the batch). */
#define CM_MICROBATCH_AUTO (-1)

typedef struct cm_trainer_config {
    cm_model *model;                  /* required; borrowed (the caller frees it after the trainer) */
    cm_dataloader *train_dataloader;  /* borrowed; needed by fit; mode train */
    cm_data_spec_config train_data_spec; /* how batches are counted and transformed (defaults: none) */
    cm_dataloader *eval_dataloader;   /* borrowed; optional: an evaluator labelled "eval" */
    const cm_evaluator *evaluators;   /* optional, copied: more evaluation sets */
    int n_evaluators;
    cm_time max_duration;             /* ep, ba, sp or tok; count 0 = not set (fit must give one) */
    cm_time eval_interval;            /* default 1ep; ep, ba, sp, tok or dur; count 0 = never */
    int64_t eval_subset_num_batches;  /* -1 = the whole eval set (default) */
    bool compute_training_metrics;    /* Composer's compute_training_metrics (default false, as there):
                                         update the model's training metrics on every batch and log
                                         metrics/train/<Name>; off, they cost nothing (no pass over
                                         the outputs, no device-to-host copy) and cm_state_metric of
                                         "train" says they are off */
    cm_optim *optimizer;              /* borrowed; NULL = DecoupledSGDW(lr 0.1) over the model (Composer's default) */
    const cm_sched_config *schedulers; /* copied; multiplied together */
    int n_schedulers;
    double scale_schedule_ratio;      /* > 0; scales max_duration and the schedules (default 1) */
    const cm_algorithm_plugin *algorithms; /* taken on success */
    int n_algorithms;
    const cm_callback_plugin *callbacks;   /* taken on success */
    int n_callbacks;
    const cm_logger_plugin *loggers;       /* taken on success */
    int n_loggers;
    const cm_ordering_pass *algorithm_passes; /* appended after the built-in passes */
    int n_algorithm_passes;
    cm_precision precision;               /* default fp32 */
    int64_t device_train_microbatch_size; /* rows per microbatch; 0 = the whole batch (default); CM_MICROBATCH_AUTO */
    bool accumulate_train_batch_on_tokens; /* weight microbatches by their loss-generating tokens (the
                                            * "labels" other than -100, cm_data_spec_n_loss_tokens;
                                            * the spec's tokens when it cannot tell) instead of samples,
                                            * as Composer: microbatched = the full batch's mean loss */
    uint64_t seed;                        /* default 42 */
    bool deterministic_mode;              /* see the overview */
    const char *run_name;                 /* copied; NULL = "run-<date>-<time>" */
    bool progress_bar;                    /* for the console logger (read through the state) */
    size_t arena_budget;                  /* bytes for one microbatch's activations; 0 = unlimited */
    cm_trainer_dist dist;
    /* Where training runs (Composer's device: cpu or gpu). With CM_DEVICE_CUDA the model trains on
     * the process's GPU: the trainer moves it there (cm_module_to_device) after the INIT model surgery
     * (which re-packs its buffers on the CPU) unless it is there already,
     * keeps the tape's activations in GPU memory (device_arena_budget bytes per microbatch, 0 = what
     * the GPU has; going over it is an out-of-memory error that automatic microbatching catches, as
     * arena_budget on the CPU), copies every microbatch to the GPU, and reads outputs back for the
     * metrics. An optimizer passed in must have been made from the model's buffers on that device
     * (move the model first). Several ranks on GPUs: each process uses the GPU of its local rank,
     * and cm_dist (NO_SHARD) all-reduces the gradients through host memory over MPI
     * (include/composer/dist.h). Errors: cm_device_check's (no CUDA build, no driver, no GPU). */
    cm_device device;
    size_t device_arena_budget;
    /* device_train_microbatch_size auto: before the first step, plan the microbatch size from a
     * dry run of 1 and 2 rows (cm_memory_plan; default true); false: the out-of-memory search alone,
     * from the whole batch. */
    bool plan_memory;

    /* Checkpoints (Composer's names; the format and the guarantees are in composer/checkpoint.h).
     * Saving happens when save_folder is set: at save_interval and once at the end of training
     * (a run that reached max_duration always leaves a checkpoint of its last batch). */
    const char *save_folder;          /* copied; NULL or "" = no saving (default); a local folder, or
                                         s3:// gs:// oci:// (checkpoint.h: remote checkpoints) */
    const char *save_filename;        /* NULL = "ep{epoch}-ba{batch}" ({epoch} {batch} {sample} {token}
                                         {run_name} {rank}) */
    const char *save_latest_filename; /* the pointer file in save_folder; NULL = "latest", "" = none */
    cm_time save_interval;            /* default 1ep; ep, ba, sp, tok or dur */
    const char *save_interval_str;    /* if set, parsed instead: "500ba", "0.25dur", "1ep" */
    bool save_overwrite;              /* replace a checkpoint of the same name (default: refuse) */
    bool save_weights_only;           /* only model.safetensors (no optimizer, time or data order) */
    int save_num_checkpoints_to_keep; /* -1 = all (default); n > 0 = this trainer's n newest */
    bool save_async;                  /* snapshot, then write on a background thread */
    size_t save_async_max_bytes;      /* bound on the snapshot; larger states are saved synchronously
                                         (0 = 1 GiB) */
    const char *load_path;            /* a checkpoint directory to start from (NULL = none), local
                                         or s3:// gs:// oci:// */
    bool load_weights_only;           /* load only the model's weights from it */
    bool load_strict_model_weights;   /* default true: every model tensor must match by name */
    const char *const *load_ignore_keys; /* glob patterns of model tensor names not to load */
    int n_load_ignore_keys;
    const char *const *load_exclude_algorithms; /* glob patterns of algorithm names whose state is not
                                                    loaded and which are not re-applied from the checkpoint */
    int n_load_exclude_algorithms;
    bool autoresume;                  /* resume from the newest complete checkpoint in save_folder
                                         (needs run_name); takes precedence over load_path */
    bool handle_signals;              /* default true: during fit, SIGTERM/SIGINT finish the batch,
                                         save, close the plugins and make fit return
                                         CM_ERR_INTERRUPTED (a second signal acts as usual) */
} cm_trainer_config;

cm_trainer_config cm_trainer_config_default(void);

typedef struct cm_trainer cm_trainer;

/* Checks the configuration, builds the state and the engine, registers the plugins (taking them
 * only if everything succeeds), then:
 *  1. fires INIT — model surgery happens here (composer/surgery_algorithms.h) — logs the
 *     hyperparameters and fires BEFORE_LOAD;
 *  2. picks the checkpoint to load (autoresume, else load_path) and applies the model surgery it
 *     requires that the algorithms do not already apply (Composer's required-on-load rule: the
 *     checkpoint's required_on_load algorithms are made from their recorded arguments, registered
 *     after cfg's (they are then saved in later checkpoints too) and applied on INIT, in the
 *     passes' order; load_exclude_algorithms skips them. The same algorithm given with other
 *     arguments is a warning, as in Composer);
 *  3. makes its own optimizer when cfg.optimizer is NULL — after the surgery, so on INIT
 *     cm_state_optimizer is NULL then — locks the model's flat buffers (cm_module_lock, until
 *     cm_trainer_free), and seeds the model (cm_module_set_seed);
 *  4. loads the checkpoint (weights, optimizer state, timestamp, data positions, dropout RNG
 *     counters, plugin states — all verified first) and fires AFTER_LOAD.
 * Errors: CM_ERR_INVALID_ARG naming the field and the fix (no model,
 * a loader in the wrong mode, max_duration in dur/iter/sec, a bad eval_interval or save_interval,
 * microbatch size < -1, ssr <= 0, an invalid scheduler or precision, a bad plugin vtable, a bad
 * save_filename, autoresume without save_folder and run_name), CM_ERR_UNSUPPORTED (amp_fp16; a
 * checkpoint of another format version), CM_ERR_STATE (the model's module is not finalized; a
 * checkpoint whose optimizer differs; surgery on INIT re-packed the parameters under a
 * cfg.optimizer made before — call cm_trainer_prepare_model first; a checkpoint's required
 * algorithm that the passes order before one of cfg's, Composer's ValueError), CM_ERR_FORMAT (a
 * damaged checkpoint, named), CM_ERR_NOT_FOUND (load_path missing; model names that do not match
 * with load_strict_model_weights), CM_ERR_OOM, a plugin's error on INIT, BEFORE_LOAD or AFTER_LOAD,
 * a required algorithm's error (naming it and load_exclude_algorithms). On any failure nothing is
 * taken: the caller still owns (and frees) the plugins. */
cm_status cm_trainer_new(const cm_trainer_config *cfg, cm_trainer **out);

/* Closes (if not closed) and frees the trainer, its engine and plugins, and the optimizer it
 * made; unlocks the model. Not the model or the loaders. NULL is a no-op. */
void cm_trainer_free(cm_trainer *tr);

typedef struct cm_fit_opts {
    /* Train this much more: max_duration becomes the timestamp (in duration's unit) + duration.
     * count 0 = train to the configured max_duration. Units as max_duration. */
    cm_time duration;
    /* Start from a zero timestamp (the train loader restarts at epoch 0) before training. */
    bool reset_time;
} cm_fit_opts;
cm_fit_opts cm_fit_opts_default(void);

/* Trains until max_duration (or a stop request), firing the events above. Calling it again
 * continues where it stopped: with a duration it trains that much more, so fit(3ba) then fit(2ba)
 * equals fit(5ba) bit for bit. opts NULL = defaults. Errors: CM_ERR_STATE (closed trainer, no
 * train loader, deterministic_mode with a changed thread count), CM_ERR_INVALID_ARG (no or bad
 * duration), the model's errors (with the epoch and batch), CM_ERR_OOM (the arena budget with a
 * fixed microbatch size, or a microbatch of one row under "auto"), the loader's and the
 * plugins' errors ("plugin '<name>' failed on <EVENT>: ..."), a checkpoint save's errors (also
 * those of a background save, reported at the next batch with the checkpoint's path), and
 * CM_ERR_INTERRUPTED: SIGTERM or SIGINT arrived (with handle_signals), the current batch was
 * finished, a checkpoint saved (when save_folder is set) and the trainer closed; exit with
 * cm_trainer_exit_code. After an error the trainer may be closed and freed; the model holds the
 * parameters of the last completed step.
 *
 * On several ranks (cfg.dist): a signal on any rank stops every rank after the same batch, and
 * they save together. Each microbatch tells the tape which global rows it holds
 * (cm_tape_set_rows) and every microbatch of a batch starts the model's dropout generators from
 * the batch's counters, so dropout masks do not depend on the split over ranks or microbatches.
 * With collectives_per_microbatch (FULL_SHARD) every rank runs as many microbatches as the rank
 * with the most; a rank with fewer rows runs "phantom" microbatches — one row (its first, or the
 * train dataset's sample 0 when its slice is empty) forward and backward in eval mode with an
 * upstream gradient of 0 — that issue the same collectives and change nothing (no events, metrics
 * or loss). With device_train_microbatch_size auto the ranks share their out-of-memory flags after
 * each attempt and retry together. */
cm_status cm_trainer_fit(cm_trainer *tr, const cm_fit_opts *opts);

/* ---- The pre-flight memory plan (device_train_microbatch_size auto) ----
 * Before the first step of an automatic run (cm_trainer_config.plan_memory), the trainer runs
 * microbatches of the first batch forward and backward as dry runs (no events, no optimizer step)
 * and reads the peak of the tape's arena after each (cm_tape_peak_bytes; on a GPU the device
 * arena's): 1 row, 2 rows, then the size the line through the measurements names for the budget
 * less CM_MEMORY_PLAN_MARGIN, refitted through every measured point until the largest size that
 * fits is measured next to one that does not (or the whole batch fits); that size evened out over
 * the same number of microbatches is measured too. The line through 1 and 2 rows alone is not
 * enough: gradients of 64 KiB or more leave the arena for the tape's heap pool as the rows grow
 * (it under-predicted a character GPT's peak by 40%), and the arena's chunk layout makes the peak
 * bumpy. The dry runs run with the budget lifted to twice itself and each on new arena chunks
 * (cm_tape_trim), as does the run after them, so a measurement is what a run of that size alone
 * reaches. The run then uses the chosen size first; the out-of-memory search stays as the
 * fallback from it. Parameters, gradients and optimizer state are read from the model's flat
 * buffers and the optimizer's state (under SHARD_GRAD_OP / FULL_SHARD what this rank holds of the
 * shards); they live outside the arena and its budget and are reported, not planned. A train
 * loader with trim_padding cuts each batch to its longest row, so the first batch can be shorter
 * than later ones: the dry runs take its rows as the dataset pads them (its full length), so the
 * size chosen fits the longest batch.
 * The dry runs leave no trace: no event fires (so memory a plugin takes on a microbatch event is
 * not seen: the search then takes over), the batch-norm statistics and dropout counters are
 * restored, no optimizer step, loss or metric value is logged; the timestamp and the loader do not
 * move; a run planned under auto equals the run with the fixed size the plan chose, bit for bit.
 * The plan is logged as metrics (memory_plan/<component>_mib, memory_plan/microbatch_size) and,
 * on rank 0, as an info line. */
#define CM_MEMORY_PLAN_MARGIN 0.10
typedef struct cm_memory_plan {
    cm_device device;         /* where the planned arena lives */
    const char *budget_key;   /* "arena_budget" or "device_arena_budget" (static) */
    size_t budget;            /* that budget in bytes (0 = unlimited) */
    size_t usable;            /* budget × (1 − CM_MEMORY_PLAN_MARGIN) (0 = unlimited) */
    int64_t batch_rows;       /* this rank's rows of the planned batch */
    size_t parameters;        /* bytes of parameters this rank holds */
    size_t gradients;         /* bytes of gradient buffers this rank holds */
    size_t optimizer_state;   /* bytes of the optimizer's state (its f32 buffers and steps) */
    size_t peak_1, peak_2;    /* measured arena peaks of 1 and 2 rows (peak_2 0: the batch has 1 row) */
    int n_probes;             /* dry microbatches run (1 and 2 rows, then the candidates measured) */
    int64_t fit_size;         /* the largest size measured to fit the usable budget */
    size_t per_row;           /* activations: arena bytes a row, the slope between the measured
                                 sizes around the chosen one */
    size_t workspace;         /* arena bytes that do not grow with the rows (that line at 0 rows) */
    int64_t microbatch_size;  /* the chosen size in rows: fit_size evened out over as many
                                 microbatches, if that measured to fit too, else fit_size */
    size_t predicted_peak;    /* the arena peak the dry run measured at microbatch_size */
} cm_memory_plan;

/* Plans the microbatch size for the train loader's next batch (the next epoch's first when the
 * loader is at an epoch's end) as fit's first step would (see above), without training: the
 * loader's position is restored afterwards, the gradients copied back (zeroed on a GPU or under a
 * distributed zero_grad hook). The batch is the loader's, before any algorithm changes it on
 * AFTER_DATALOADER. No collectives: each rank plans its own rows. Errors: CM_ERR_STATE (closed,
 * no train loader or no batch), CM_ERR_OOM naming the budget key and the bytes one row needs when
 * one row does not fit, the model's errors. */
cm_status cm_trainer_plan_memory(cm_trainer *tr, cm_memory_plan *out);
/* The plan fit made before its first step (NULL when it made none: a fixed size, plan_memory off,
 * or fit not run yet). Borrowed; valid while the trainer lives. */
const cm_memory_plan *cm_trainer_memory_plan(const cm_trainer *tr);
/* The plan as text, one component a line in MiB (as the trainer logs it); returns what snprintf
 * returns. */
int cm_memory_plan_format(const cm_memory_plan *p, char *buf, size_t cap);

/* Standalone evaluation of `evaluators` (NULL/0 = the configured ones), each on its
 * subset_num_batches: EVAL_STANDALONE_START, (EVAL_START ... EVAL_END) each, EVAL_STANDALONE_END;
 * logs metrics/<label>/<Name>. The model is in eval mode without gradients during the loop and
 * returns to its previous mode. Errors: CM_ERR_STATE (closed), CM_ERR_INVALID_ARG (no evaluator,
 * a loader not in eval mode), the model's, metrics' and plugins' errors. */
cm_status cm_trainer_eval(cm_trainer *tr, const cm_evaluator *evaluators, int n_evaluators);

/* Called once per predicted batch with the loader's batch and the model's outputs (both valid
 * for the call only; padded rows have batch->valid[i] == 0). Return CM_OK to go on. */
typedef cm_status (*cm_predict_fn)(const cm_batch *batch, cm_tensor *outputs, void *data);

/* Runs the model's forward (eval mode, no gradients) over `dataloader` from its start, at most
 * subset_num_batches batches (-1 = all), calling fn on each: PREDICT_START, per batch
 * PREDICT_BATCH_START, PREDICT_BEFORE_FORWARD, PREDICT_AFTER_FORWARD, PREDICT_BATCH_END;
 * PREDICT_END. Errors: CM_ERR_STATE (closed), CM_ERR_INVALID_ARG (NULL loader or fn), the
 * model's, fn's and plugins' errors. */
cm_status cm_trainer_predict(cm_trainer *tr, cm_dataloader *dataloader, int64_t subset_num_batches,
                             cm_predict_fn fn, void *data);

/* Waits for a background checkpoint save, then closes the engine's plugins (see
 * cm_engine_close) and returns the first error (the save's first). Afterwards fit,
 * eval and predict fail with CM_ERR_STATE. A second call returns CM_OK. */
cm_status cm_trainer_close(cm_trainer *tr);

/* Saves a checkpoint now, synchronously (waiting for a background save first): path NULL saves
 * into save_folder under save_filename and updates the latest pointer and the rotation, as an
 * interval save; otherwise `path` is the checkpoint directory to create (transactionally; no
 * pointer, no rotation). Errors: CM_ERR_INVALID_ARG (NULL path without save_folder), CM_ERR_STATE
 * (the checkpoint exists and save_overwrite is off), CM_ERR_IO naming the path (unwritable folder,
 * full disk: earlier checkpoints stay intact), CM_ERR_OOM, a plugin's save returning invalid JSON. */
cm_status cm_trainer_save_checkpoint(cm_trainer *tr, const char *path);
/* The last checkpoint this trainer committed, and the one it resumed from (NULL if none). The
 * strings stay valid until the next save or cm_trainer_free. */
const char *cm_trainer_last_checkpoint(const cm_trainer *tr);
const char *cm_trainer_resumed_from(const cm_trainer *tr);
/* The signal (SIGTERM, SIGINT) that made the last fit return CM_ERR_INTERRUPTED, else 0. */
int cm_trainer_interrupted_signal(const cm_trainer *tr);
/* The process exit status for a fit that returned `s`: 0, 128 + signal after an interruption
 * (143 for SIGTERM), else 1. Programs end with `return cm_trainer_exit_code(tr, s);` — the
 * library never exits by itself. */
int cm_trainer_exit_code(const cm_trainer *tr, cm_status s);

cm_state *cm_trainer_state(cm_trainer *tr);
cm_engine *cm_trainer_engine(cm_trainer *tr); /* to add plugins or ordering passes after new */
cm_logger *cm_trainer_logger(cm_trainer *tr);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_TRAINER_H */
