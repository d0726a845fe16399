/*
 * composer/callbacks.h — callbacks that observe a training run and log what they see, after
 * Composer's composer/callbacks: SpeedMonitor, LRMonitor, MemoryMonitor, OptimizerMonitor,
 * RuntimeEstimator, and the two that may end a run, EarlyStopper and ThresholdStopper.
 *
 * Each callback has a config with defaults (cm_<name>_config_default(), Composer's defaults) and a
 * constructor that fills a cm_callback_plugin for the trainer (the trainer takes it; an unused one
 * is freed with cm_callback_plugin_free). They log through the state's logger, under Composer's
 * metric keys (each callback's section lists them), so an InMemoryLogger, a console or a file
 * logger shows the same names a Composer user knows. Callbacks only read the state; the stoppers'
 * one action is cm_state_stop_training.
 *
 *     cm_speed_monitor_config sc = cm_speed_monitor_config_default();
 *     sc.window_size = 20;
 *     cm_early_stopper_config ec = cm_early_stopper_config_default();
 *     ec.monitor = "MulticlassAccuracy";                      // metrics/eval/MulticlassAccuracy
 *     ec.dataloader_label = "eval";
 *     cm_time_parse("3ep", &ec.patience);
 *     cm_callback_plugin cbs[4];
 *     if (cm_speed_monitor_new(&sc, &cbs[0]) != CM_OK || cm_lr_monitor_new(&cbs[1]) != CM_OK ||
 *         cm_early_stopper_new(&ec, &cbs[2]) != CM_OK || cm_optimizer_monitor_new(NULL, &cbs[3]) != CM_OK)
 *         fprintf(stderr, "error: %s\n", cm_last_error());
 *     cfg.callbacks = cbs; cfg.n_callbacks = 4;               // cm_trainer_config; the trainer takes them
 *
 * Checkpoints. Callbacks with state worth keeping (SpeedMonitor: the eval wall-clock total and
 * the throughput window; EarlyStopper: the best value and when it occurred) implement the vtable's save/load as a small JSON object, so a resumed run continues where the
 * saved one stopped. Loading a malformed object fails with CM_ERR_FORMAT and changes nothing.
 *
 * Distributed runs. A callback sees only its rank's state and has no access to the trainer's
 * all_reduce_sum hook, so the reductions Composer does are replaced by what needs none:
 * throughput uses the timestamp's global sample and token counts (and flops_per_sample × global
 * samples for FLOPs, which is Composer's per-rank sum when the ranks' batches have the same
 * shape); OptimizerMonitor's norms are over the gradients this rank holds — the global batch's
 * after the trainer's sync_grads (DDP), but a shard's only under a sharded strategy.
 *
 * Threading: a callback belongs to the trainer's thread. cm_peak_flops may be called from any
 * thread.
 */
#ifndef COMPOSER_CALLBACKS_H
#define COMPOSER_CALLBACKS_H

#include <composer/trainer.h>

#ifdef __cplusplus
extern "C" {
#endif

/* =============================================================================================
 * Shared pieces
 * =========================================================================================== */

/* Wall-clock units for logged times (Composer's time_unit strings). */
#define CM_WALL_UNIT_LIST(X)                     \
    X(CM_WALL_SECONDS, "seconds", 1.0)           \
    X(CM_WALL_MINUTES, "minutes", 60.0)          \
    X(CM_WALL_HOURS, "hours", 3600.0)            \
    X(CM_WALL_DAYS, "days", 86400.0)

typedef enum cm_wall_unit {
#define CM_X_(name, str, secs) name,
    CM_WALL_UNIT_LIST(CM_X_)
#undef CM_X_
    CM_WALL_UNIT_COUNT
} cm_wall_unit;

const char *cm_wall_unit_name(cm_wall_unit u); /* "hours"; "?" out of range */
double cm_wall_unit_seconds(cm_wall_unit u);   /* 3600 for hours; 0 out of range */
/* Case-insensitive "seconds", "minutes", "hours", "days". CM_ERR_INVALID_ARG listing them. */
cm_status cm_wall_unit_parse(const char *s, cm_wall_unit *out);

/* A clock in seconds (monotonic, any origin). Callbacks that time things take one so tests can
 * drive them with a fake clock; NULL means cm_clock_s. */
typedef double (*cm_clock_fn)(void *data);

/* How a stopper compares a metric: CM_COMP_AUTO decides from the metric's name as Composer does —
 * less for names containing "loss", "error" or "perplexity" (case-insensitive), and here also
 * "crossentropy" and "cross_entropy" (Composer would maximise a metric called CrossEntropy);
 * greater for everything else (accuracy, F1, ...). */
typedef enum cm_comp { CM_COMP_AUTO = 0, CM_COMP_LESS = 1, CM_COMP_GREATER = 2 } cm_comp;
/* "less"/"lt", "greater"/"gt" (Composer's strings) or "auto", case-insensitive; CM_ERR_INVALID_ARG. */
cm_status cm_comp_parse(const char *s, cm_comp *out);
/* CM_COMP_LESS or CM_COMP_GREATER for a monitored name, by the rule above. */
cm_comp cm_comp_for_metric(const char *monitor);

/* =============================================================================================
 * SpeedMonitor: throughput, MFU and wall-clock
 * =========================================================================================== */

/* Logged at every BATCH_END (Composer's keys):
 *   once window_size + 1 batch ends have been seen, over the last window_size batches
 *   (Δ = newest − oldest of the window, in the timestamp's global counts and total_wct):
 *     throughput/batches_per_sec = Δbatches / Δwct         throughput/device/batches_per_sec (÷ world size)
 *     throughput/samples_per_sec = Δsamples / Δwct         throughput/device/samples_per_sec
 *     throughput/tokens_per_sec  (only when Δtokens > 0)   throughput/device/tokens_per_sec
 *   when the model reports cm_model_flops_per_sample > 0 for the batch (flops of a batch =
 *   flops_per_sample × the batch's global samples), over the same window:
 *     throughput/flops_per_sec = Σ flops of the window's batches / Δwct
 *     throughput/device/flops_per_sec (÷ world size)
 *     throughput/device/mfu = device flops_per_sec / peak_flops, and throughput/mfu (the same value:
 *       the run's MFU, total FLOP/s over world size × peak) — when a peak is known
 *   always:
 *     wall_clock/train = total_wct of the timestamp (training batches only, as Composer: it
 *       excludes evaluation) in time_unit; wall_clock/val = the time spent between EVAL_START and
 *       EVAL_END (all evaluators, measured with the clock); wall_clock/total = their sum.
 * Composer reads the GPU's peak from a table of GPU models; here the peak is the CPU's: */
typedef struct cm_speed_monitor_config {
    int window_size;  /* batches to average over (≥ 1); default 100 */
    /* Peak FLOP/s of one rank, for MFU. 0 (default) = cm_peak_flops() (the CM_PEAK_FLOPS
     * environment variable, else measured once); < 0 = no MFU is logged. */
    double peak_flops;
    cm_wall_unit time_unit; /* for the wall_clock keys; default hours */
    cm_clock_fn clock;      /* times evaluation; NULL = cm_clock_s */
    void *clock_data;
} cm_speed_monitor_config;

cm_speed_monitor_config cm_speed_monitor_config_default(void);

/* A SpeedMonitor plugin (name "SpeedMonitor"). cfg NULL = defaults. Save/load: the eval
 * wall-clock total and the window. Errors: CM_ERR_INVALID_ARG (window_size < 1, a NaN or infinite
 * peak, a bad time_unit), CM_ERR_OOM. */
cm_status cm_speed_monitor_new(const cm_speed_monitor_config *cfg, cm_callback_plugin *out);

/* This machine's peak FLOP/s for f32 FMA over cm_num_threads() threads, for MFU: the value of the
 * environment variable CM_PEAK_FLOPS (a positive number, e.g. "3.2e12") if set, else measured
 * once per process with a short FMA loop (about 50 ms; AVX-512 where the CPU has it, else AVX2 +
 * FMA, else scalar) on every thread at once, and cached. The measurement sees the clock speed of
 * the moment and a busy machine lowers it; set CM_PEAK_FLOPS for MFU numbers comparable across
 * runs. It counts f32 FMA throughput, not AMX bf16: an amp_bf16 run on an AMX machine can show an
 * MFU above 1. Errors: CM_ERR_INVALID_ARG (CM_PEAK_FLOPS set but not a positive number). Thread-safe. */
cm_status cm_peak_flops(double *out);

/* The same FMA measurement taken now, every call (not cached; CM_PEAK_FLOPS not consulted): for a
 * benchmark that re-measures between runs because the machine's clock or core sharing moved. About
 * 50 ms. Errors: CM_ERR_INVALID_ARG (out NULL). Thread-safe. */
cm_status cm_peak_flops_measure(double *out);

/* =============================================================================================
 * LRMonitor: the learning rate of each parameter group
 * =========================================================================================== */

/* Logs lr-<Optimizer>/group<i> at every BATCH_END for each of the optimizer's groups (Composer's
 * f'lr-{optimizer.__class__.__name__}/group{idx}'): the rate the batch just trained used, group.lr
 * × cm_state_lr_multiplier. The class names are Composer's and torch's: SGD, DecoupledSGDW, Adam,
 * AdamW, DecoupledAdamW. Composer logs the rate after its scheduler step, which its one-batch-late
 * schedule (see optim.h) makes the same value at the same batch as here.
 * Name "LRMonitor". Errors: CM_ERR_INVALID_ARG (out NULL), CM_ERR_OOM. */
cm_status cm_lr_monitor_new(cm_callback_plugin *out);

/* The optimizer class name Composer logs for a kind ("DecoupledAdamW"; "?" out of range). */
const char *cm_optim_class_name(cm_optim_kind kind);

/* =============================================================================================
 * MemoryMonitor: process and arena memory
 * =========================================================================================== */

/* The CPU analogue of Composer's MemoryMonitor (which logs torch.cuda.memory_stats): at every
 * AFTER_TRAIN_BATCH it logs, in bytes,
 *   memory/rss_bytes          the process's resident set now (/proc/self/statm)
 *   memory/peak_rss_bytes     the largest resident set so far (getrusage ru_maxrss)
 *   memory/arena_bytes        the tape arena's use after the largest microbatch of this batch
 *                             (activations and tape nodes; the arena is rewound after each)
 *   memory/arena_peak_bytes   the arena's peak use since it was made (cm_arena_peak)
 *   memory/arena_budget_bytes the arena's budget, when one is set (cfg.arena_budget)
 * Composer's allocated/reserved split maps onto arena_bytes (live activations) and rss_bytes
 * (everything the process holds: parameters, optimizer state, loader buffers, allocator slack).
 * When the model is on a GPU it also logs Composer's names, in GiB as Composer does, with
 * PyTorch's measure (cm_device_memory.requested: what live allocations asked for, each rounded up
 * to 512 bytes, as torch.cuda.memory_stats' allocated_bytes):
 *   memory/allocated_mem       bytes in use now
 *   memory/reserved_mem        bytes the caching allocator holds (blocks in use plus cached)
 *   memory/peak_allocated_mem  the largest allocated_mem since the last peak reset
 * the allocator's own blocks in use (a cached block serves any request of half its size or more),
 *   memory/allocated_blocks_mem, memory/peak_allocated_blocks_mem
 * and memory/device_arena_peak_bytes, the peak of the tape's GPU arena (activations).
 * Name "MemoryMonitor". Errors: CM_ERR_INVALID_ARG (out NULL), CM_ERR_OOM. */
cm_status cm_memory_monitor_new(cm_callback_plugin *out);

/* The process's resident set now and its peak, in bytes (0 where the system does not say). */
void cm_process_memory(int64_t *rss_bytes, int64_t *peak_rss_bytes);

/* =============================================================================================
 * EarlyStopper and ThresholdStopper
 * =========================================================================================== */

/* EarlyStopper (Composer's): stops training when `monitor` has not improved for `patience`.
 * The metric is the one the trainer logs as metrics/<dataloader_label>/<monitor> (read with
 * cm_state_metric). It is checked at EVAL_END of the evaluator labelled dataloader_label, at
 * EPOCH_END when the label is "train", and also at every BATCH_END of training when patience is
 * in batches and the label is "train". A value improves on the best when comp(value, best) and
 * |value − best| > min_delta; the first value seen is the first best. Training stops (after the
 * current batch) when now − (time of the best) > patience, in patience's unit (epochs or
 * batches), as Composer: with patience 1ep the run stops at the second epoch end without
 * improvement. A metric that has not been computed yet when checked is an error naming it (as
 * Composer raises), so a typo in monitor fails at the first check rather than never stopping. */
typedef struct cm_early_stopper_config {
    const char *monitor;          /* required; copied: "MulticlassAccuracy", "CrossEntropy" */
    const char *dataloader_label; /* copied; "eval" (the evaluator's label) or "train"; default "eval" */
    cm_comp comp;                 /* default CM_COMP_AUTO */
    double min_delta;             /* its absolute value is used; default 0 */
    cm_time patience;             /* ep or ba; default 1ep (Composer's int patience is epochs) */
} cm_early_stopper_config;

cm_early_stopper_config cm_early_stopper_config_default(void);

/* Name "EarlyStopper". Save/load: the best value and the epoch and batch it occurred at. Errors:
 * CM_ERR_INVALID_ARG (no monitor, an empty label, patience not in ep or ba or negative, NaN
 * min_delta, bad comp), CM_ERR_OOM. */
cm_status cm_early_stopper_new(const cm_early_stopper_config *cfg, cm_callback_plugin *out);

/* ThresholdStopper (Composer's): stops training as soon as comp(metric, threshold) holds (strict:
 * less or greater), checked at EVAL_END of the evaluator labelled dataloader_label, at EPOCH_END
 * for "train", and at every training BATCH_END for "train" when stop_on_batch is set. Errors for
 * a metric not computed as EarlyStopper. */
typedef struct cm_threshold_stopper_config {
    const char *monitor;          /* required; copied */
    const char *dataloader_label; /* copied; default "eval" */
    double threshold;             /* required (default NaN: must be set) */
    cm_comp comp;                 /* default CM_COMP_AUTO */
    bool stop_on_batch;           /* default false */
} cm_threshold_stopper_config;

cm_threshold_stopper_config cm_threshold_stopper_config_default(void);

/* Name "ThresholdStopper". Errors: CM_ERR_INVALID_ARG (no monitor, empty label, NaN or infinite
 * threshold, bad comp), CM_ERR_OOM. */
cm_status cm_threshold_stopper_new(const cm_threshold_stopper_config *cfg, cm_callback_plugin *out);

/* =============================================================================================
 * RuntimeEstimator: time left
 * =========================================================================================== */

/* Logs time/remaining_estimate (in time_unit) at every BATCH_END once skip_batches batch ends
 * have passed and the run has progressed since the clock started (Composer's RuntimeEstimator):
 *   rate = (clock now − clock at the first counted BATCH_START − eval time since) / (f − f0)
 *   remaining = rate × (1 − f) + Σ over evaluators of (mean eval time) × (evals still to come)
 * where f is cm_state_elapsed (in batches for epoch durations) and f0 its value when the clock
 * started. The mean eval time of an evaluator drops its first run once there are two (often
 * slower: caches). Evals still to come = ⌊1 / p⌋ − evals done, with p = f / (evals done) at that
 * evaluator's last EVAL_END: evaluations run on a schedule from the start of the run. (Composer
 * measures p from f0 and so expects fractional extra evaluations — 1.2 instead of 1 for a
 * per-epoch eval of a 2-epoch run; and before that it shared one "last fraction" across
 * evaluators, which divides by zero with two.) The unit is logged as the hyperparameter
 * time/remaining_estimate_unit (a string, as Composer) at the first FIT_START. Without a
 * max_duration nothing is logged. */
typedef struct cm_runtime_estimator_config {
    int skip_batches;       /* ≥ 0; default 1 */
    cm_wall_unit time_unit; /* default hours */
    cm_clock_fn clock;      /* NULL = cm_clock_s */
    void *clock_data;
} cm_runtime_estimator_config;

cm_runtime_estimator_config cm_runtime_estimator_config_default(void);

/* Name "RuntimeEstimator". Its clock restarts in a resumed run (no save/load, as Composer). Errors: CM_ERR_INVALID_ARG
 * (skip_batches < 0, bad time_unit), CM_ERR_OOM. */
cm_status cm_runtime_estimator_new(const cm_runtime_estimator_config *cfg, cm_callback_plugin *out);

/* =============================================================================================
 * OptimizerMonitor: gradient, parameter and optimizer-state norms
 * =========================================================================================== */

/* At every BATCH_END whose batch count is a multiple of batch_log_interval (after the optimizer
 * step; the gradients are still the batch's), for each parameter that requires a gradient
 * (name = its dotted name, e.g. "0.weight"):
 *   l2_norm/grad/<name>      ‖g‖ of the parameter's gradient
 * and with log_optimizer_metrics (Composer's report_per_parameter_metrics):
 *   l2_norm/param/<name>     ‖p‖ (after the step)
 *   l2_norm/moment/<name>    ‖exp_avg‖ (Adam kinds) or ‖momentum_buffer‖ (SGD kinds with momentum)
 *   l2_norm/second_moment_sqrt/<name>  sqrt(‖exp_avg_sq‖) (Adam kinds)
 *   l2_norm/update/<name>    ‖u‖ and cosine/update_grad/<name> = cos(g, u) (Adam kinds), with u
 *                            the step the optimizer took, as a descent direction (p_new = p − u):
 *                            (lr/bc1)·m/(sqrt(v)/sqrt(bc2) + eps) + c·p, at the group's
 *                            lr·multiplier and the span's step count; c = wd·multiplier
 *                            (DecoupledAdamW), lr·wd (AdamW), 0 (Adam: the decay is in m).
 *                            Composer's DecoupledAdamW subtracts its decay term instead of adding
 *                            it (a sign slip); only the weight-decay part differs.
 *   cosine/moment_grad/<name> cos(g, moment) (when there is a moment)
 * and always
 *   l2_norm/grad/global      sqrt of Σ ‖g‖² over the parameters.
 * The optimizer state is found by the trainer's span naming (one span per wrap unit, named after
 * the unit: "<unit>.exp_avg"); parameters of an optimizer built differently get grad and param
 * norms only. The hyperparameters are group 0's for every parameter, as Composer reads
 * param_groups[0] (a span does not say which group it is in). Norms accumulate in double (OpenMP
 * over large spans); cosines of a zero vector are 0 (torch's eps clamp). Per batch this reads
 * every parameter, gradient and moment once: about the cost of an optimizer step.
 * Distributed: under NO_SHARD every rank holds the global gradient, so the values are global as
 * they are; under a sharded strategy each rank sums over its pieces (cm_state_shard_spans) and the
 * sums are added over ranks (cm_state_all_reduce_sum) — so every rank must run the callback. */
typedef struct cm_optimizer_monitor_config {
    bool log_optimizer_metrics; /* default true */
    int batch_log_interval;     /* ≥ 1; default 1 */
} cm_optimizer_monitor_config;

cm_optimizer_monitor_config cm_optimizer_monitor_config_default(void);

/* Name "OptimizerMonitor". cfg NULL = defaults. Errors: CM_ERR_INVALID_ARG
 * (batch_log_interval < 1), CM_ERR_OOM. */
cm_status cm_optimizer_monitor_new(const cm_optimizer_monitor_config *cfg, cm_callback_plugin *out);

/* =============================================================================================
 * NaNMonitor: a NaN loss fails the run, or rolls it back
 * =========================================================================================== */

/* What NaNMonitor does when a microbatch's loss is NaN (checked at every AFTER_LOSS, before the
 * loss is scaled). */
#define CM_NAN_ACTION_LIST(X)                  \
    X(CM_NAN_ERROR, "error")                   \
    X(CM_NAN_ROLLBACK, "rollback")

typedef enum cm_nan_action {
#define CM_X_(name, str) name,
    CM_NAN_ACTION_LIST(CM_X_)
#undef CM_X_
    CM_NAN_ACTION_COUNT
} cm_nan_action;

/* "error" or "rollback" (case-insensitive); CM_ERR_INVALID_ARG naming both otherwise. */
cm_status cm_nan_action_parse(const char *s, cm_nan_action *out);

typedef struct cm_nan_monitor_config {
    /* CM_NAN_ERROR (Composer's behaviour, the default): the fit fails with CM_ERR_STATE "Train loss
     * contains a NaN." naming the epoch, batch and microbatch. CM_NAN_ROLLBACK: cm_state_rollback —
     * the batch is abandoned, the trainer goes back to its last checkpoint and skips the data of
     * the batches since then, this one included (trainer.h); the callback logs
     * nan_monitor/rollbacks (their count so far) when it asks. */
    cm_nan_action on_nan;
    /* Rollbacks allowed over the run (a NaN that comes back from every checkpoint would otherwise
     * eat the data); the next NaN fails the fit as with CM_NAN_ERROR. Default 5; >= 0. */
    int max_rollbacks;
} cm_nan_monitor_config;

cm_nan_monitor_config cm_nan_monitor_config_default(void);

/* Name "NaNMonitor". cfg NULL = defaults. Save/load: the number of rollbacks so far. Errors:
 * CM_ERR_INVALID_ARG (a bad on_nan, max_rollbacks < 0), CM_ERR_OOM. */
cm_status cm_nan_monitor_new(const cm_nan_monitor_config *cfg, cm_callback_plugin *out);

/* =============================================================================================
 * SystemMetricsMonitor: the machine's CPU, memory, disk and network
 * =========================================================================================== */

/* Composer's SystemMetricsMonitor, read from /proc and statvfs: at every BATCH_START,
 * EVAL_BATCH_START and PREDICT_BATCH_START (every interval-th of them) it logs
 *   cpu_percentage            the machine's busy CPU share since the last log (0..100)
 *   cpu_memory_total, cpu_memory_available, cpu_memory_used (bytes), cpu_memory_percent
 *   disk_memory_total, disk_memory_used, disk_memory_free (bytes), disk_memory_percent (of "/")
 *   network_bytes_sent, network_bytes_recv (all interfaces, since boot)
 * and, beyond Composer, process_cpu_percentage (this process, 100 = one core) and
 * process_rss_bytes. Composer logs only GPU metrics unless log_all_data on a CPU-only machine;
 * here the CPU ones are always logged (there are no GPU metrics). */
typedef struct cm_system_metrics_monitor_config {
    bool log_all_data; /* Composer's flag; accepted, no effect (one process: its own metrics) */
    int interval;      /* log every interval-th batch start (>= 1); default 1, as Composer */
} cm_system_metrics_monitor_config;

cm_system_metrics_monitor_config cm_system_metrics_monitor_config_default(void);
/* Name "SystemMetricsMonitor". cfg NULL = defaults. Errors: CM_ERR_INVALID_ARG (interval < 1),
 * CM_ERR_OOM. */
cm_status cm_system_metrics_monitor_new(const cm_system_metrics_monitor_config *cfg, cm_callback_plugin *out);

/* =============================================================================================
 * FreeOutputs
 * =========================================================================================== */

/* Composer's FreeOutputs: at AFTER_LOSS the state's outputs are dropped (cm_state_free_outputs),
 * so nothing after the loss holds them — as in Composer, the train metrics then see no outputs
 * and are not computed. The outputs' memory is the tape arena's and comes back when the
 * microbatch ends, as it would without the callback (Composer's frees a GPU tensor early).
 * Name "FreeOutputs". Errors: CM_ERR_INVALID_ARG (out NULL), CM_ERR_OOM. */
cm_status cm_free_outputs_new(cm_callback_plugin *out);

/* =============================================================================================
 * LoadCheckpoint: weights from a checkpoint at a chosen event
 * =========================================================================================== */

/* Composer's LoadCheckpoint(load_path, load_options, event): the first time `event` fires, the
 * model's weights are loaded from load_path — a checkpoint directory written by the trainer
 * (monolithic or sharded; its model tensors are verified), or a .safetensors file — into the
 * model (cm_module_load_safetensors). Composer loads again at every later occurrence of the
 * event; here once (a recurring event would otherwise reset the weights each time). Only the
 * model: the optimizer and the run's time come from the trainer's own load_path / autoresume.
 * Not under a sharded strategy (the parameters live in the shards). */
typedef struct cm_load_checkpoint_config {
    const char *load_path;            /* required; copied */
    cm_event event;                   /* default CM_EVENT_BEFORE_LOAD */
    bool strict_model_weights;        /* default true: every model tensor must match by name */
    const char *const *ignore_keys;   /* glob patterns of names not to load (copied) */
    int n_ignore_keys;
} cm_load_checkpoint_config;

cm_load_checkpoint_config cm_load_checkpoint_config_default(void);
/* Name "LoadCheckpoint". Errors: CM_ERR_INVALID_ARG (no load_path, a bad event), CM_ERR_OOM. At
 * the event: the load's errors (CM_ERR_NOT_FOUND for a missing path or, strict, names that do
 * not match; CM_ERR_SHAPE; CM_ERR_FORMAT for a damaged checkpoint), CM_ERR_UNSUPPORTED under a
 * sharded strategy. */
cm_status cm_load_checkpoint_new(const cm_load_checkpoint_config *cfg, cm_callback_plugin *out);

/* =============================================================================================
 * CheckpointSaver
 * =========================================================================================== */

/* Composer's CheckpointSaver arguments. Composer's Trainer turns its save_* arguments into a
 * CheckpointSaver callback; here the trainer saves itself (transactional, sharded and elastic
 * checkpoints: composer/checkpoint.h), so the callback's arguments configure that saver:
 * cm_checkpoint_saver_apply writes them into a trainer config (save_folder = folder,
 * save_filename = filename, save_latest_filename = latest_filename, save_interval,
 * save_weights_only = weights_only, save_num_checkpoints_to_keep, save_overwrite = overwrite).
 * The checkpoints are directories (manifest.json + safetensors), so Composer's ".pt" file
 * names do not apply: filename's default is the trainer's "ep{epoch}-ba{batch}". */
typedef struct cm_checkpoint_saver_config {
    const char *folder;          /* default "{run_name}/checkpoints" */
    const char *filename;        /* default "ep{epoch}-ba{batch}" */
    const char *latest_filename; /* default "latest"; "" = no pointer */
    cm_time save_interval;       /* default 1ep */
    bool weights_only;           /* default false */
    int num_checkpoints_to_keep; /* default -1 (all) */
    bool overwrite;              /* default false */
} cm_checkpoint_saver_config;

cm_checkpoint_saver_config cm_checkpoint_saver_config_default(void);
/* Writes the saver's settings into *tc; {run_name} in folder is expanded with `run_name` into
 * folder_buf (cap bytes), which must outlive the trainer's construction. Errors:
 * CM_ERR_INVALID_ARG (an empty folder, num_checkpoints_to_keep < -1 or 0, a folder too long for
 * folder_buf, tc NULL). */
cm_status cm_checkpoint_saver_apply(const cm_checkpoint_saver_config *cfg, const char *run_name, char *folder_buf,
                                    size_t cap, cm_trainer_config *tc);

/* =============================================================================================
 * Generate: samples from a GPT during training
 * =========================================================================================== */

struct cm_tokenizer;

/* Composer's Generate(prompts, interval, **generate_kwargs): every `interval` (at BATCH_END for a
 * batch interval, at EPOCH_END for an epoch one), rank 0 continues each prompt with
 * cm_gpt2_generate (KV cache, eval mode, no gradients, the model unchanged) and logs
 * prompt + continuation with cm_logger_log_text under "generate/<i>" (i: the prompt's index),
 * which the FileLogger writes into log.txt and the ConsoleLogger prints; the InMemoryLogger keeps
 * them. Generation stops at the tokenizer's end-of-text token when it has one. Composer logs a
 * table per call (prompt, generation); here one text per prompt. The model must be a GPT-2 of
 * the zoo (cm_model_is_gpt2); not under FULL_SHARD (the parameters live in the shards). */
typedef struct cm_generate_config {
    const struct cm_tokenizer *tokenizer; /* required; borrowed (must outlive the trainer) */
    const char *const *prompts;          /* required, copied; "" = start from end-of-text (or id 0) */
    int n_prompts;
    cm_time interval;                    /* required: ba or ep, count >= 1 */
    int64_t max_new_tokens;              /* default 100 */
    float temperature;                   /* default 0: greedy (Hugging Face's default, do_sample false) */
    int64_t top_k;                       /* default 0 = all */
    float top_p;                         /* default 1 */
    uint64_t seed;                       /* the sampling stream; default 42 */
} cm_generate_config;

cm_generate_config cm_generate_config_default(void);
/* Name "Generate". Errors: CM_ERR_INVALID_ARG (no tokenizer, no prompts, an interval not in ba or
 * ep, max_new_tokens < 1, temperature < 0, top_p outside (0, 1]), CM_ERR_OOM. During the run: a
 * model that is not a GPT-2 (CM_ERR_UNSUPPORTED at FIT_START), the tokenizer's and generation's
 * errors. */
cm_status cm_generate_new(const cm_generate_config *cfg, cm_callback_plugin *out);

/* =============================================================================================
 * ImageVisualizer: a PNG grid of input images and predictions
 * =========================================================================================== */

/* Composer's ImageVisualizer (mode "input"): every `interval` during training (at AFTER_FORWARD
 * of the batch's first microbatch, when the batch count is a multiple of it) and at the first
 * batch of every evaluation, rank 0 writes a PNG grid of the batch's first num_images images —
 * each scaled to its own minimum and maximum, enlarged to at least 56 pixels — with, under each,
 * two strips of one cell per class: the predicted class (the outputs' argmax) filled green when
 * it is the target and red when not, and the target class filled blue. The file is
 * <folder>/<label>_ba<batch>.png (label "train" or the evaluator's), and its path with the
 * predictions and targets is logged as a text under "Images/Train" or "Images/<Label>" (Composer
 * logs the images to its image-capable loggers). Images: field input_key, (N, C, H, W) or with
 * channels_last (N, H, W, C), C 1 or 3, f32 or u8; targets: field target_key, integer (N); the
 * outputs: (N, classes) logits. */
typedef struct cm_image_visualizer_config {
    cm_time interval;   /* ba or ep; default 100ba */
    const char *mode;   /* "input" (default); "segmentation" is not supported */
    int num_images;     /* default 8 */
    bool channels_last; /* default false */
    int input_key;      /* the batch field of the images; default 0 */
    int target_key;     /* the batch field of the targets; default 1 */
    const char *folder; /* copied; default "{run_name}/images" ({run_name}: the state's) */
} cm_image_visualizer_config;

cm_image_visualizer_config cm_image_visualizer_config_default(void);
/* Name "ImageVisualizer". Errors: CM_ERR_INVALID_ARG (interval not in ba or ep or < 1,
 * num_images < 1, a key < 0, an empty folder), CM_ERR_UNSUPPORTED (mode "segmentation"), CM_ERR_OOM.
 * During the run: CM_ERR_SHAPE naming the field when the images or targets do not have those
 * shapes, CM_ERR_IO naming the file. */
cm_status cm_image_visualizer_new(const cm_image_visualizer_config *cfg, cm_callback_plugin *out);

/* =============================================================================================
 * ExportForInference: weights and a standalone C program
 * =========================================================================================== */

/* Composer's ExportForInferenceCallback(save_format, save_path): at FIT_END, rank 0 writes into
 * the folder save_path the model's weights (model.safetensors) and infer.c, a self-contained C
 * program (C99 and libm, nothing of this library) that reads those weights and prints the
 * logits of one input:
 *     cc -O2 -o infer save_path/infer.c -lm
 *     ./infer save_path/model.safetensors < input.txt    # in_features numbers -> one logit a line
 * Composer exports TorchScript or ONNX; here save_format "c", for models that are a Sequential
 * of Flatten, Linear (and GPT-2's Conv1D), the activations (ReLU, GELU, NewGELU, SiLU, Tanh,
 * Sigmoid, Identity) and Dropout (inactive at inference) — the zoo MLP. Other layers are refused
 * by name. The program computes in float with double accumulation; it agrees with the model's
 * eval forward to float rounding. */
typedef struct cm_export_for_inference_config {
    const char *save_format; /* "c" (default); "torchscript" and "onnx" are refused */
    const char *save_path;   /* required: the folder (made if missing; {run_name} is the state's); copied */
} cm_export_for_inference_config;

cm_export_for_inference_config cm_export_for_inference_config_default(void);
/* Name "ExportForInferenceCallback". Errors: CM_ERR_INVALID_ARG (no save_path, an unknown format),
 * CM_ERR_UNSUPPORTED (torchscript, onnx), CM_ERR_OOM. At FIT_END: CM_ERR_UNSUPPORTED naming a
 * layer the program cannot run, CM_ERR_IO naming a file. */
cm_status cm_export_for_inference_new(const cm_export_for_inference_config *cfg, cm_callback_plugin *out);
/* The export itself, for a model outside a trainer (the same files). */
cm_status cm_export_for_inference(cm_model *model, const char *save_path);

/* =============================================================================================
 * MemorySnapshot and OOMObserver: the tape arena's timeline
 * =========================================================================================== */

/* The CPU analogue of Composer's MemorySnapshot and OOMObserver, which record PyTorch's CUDA
 * allocator: here the tape arena (activations and tape nodes; composer/base.h) is sampled at every
 * event of a training batch — per microbatch BEFORE_FORWARD, AFTER_FORWARD, AFTER_LOSS,
 * AFTER_BACKWARD and the rest — as entries {t_us, event, batch, microbatch, arena_bytes,
 * arena_peak_bytes, rss_bytes}, written as JSON ({"rank", "arena_budget_bytes", "entries": [...],
 * and for an OOM "oom": {...}}) next to an SVG plot of arena_bytes over time (same name, .svg). */
typedef struct cm_memory_snapshot_config {
    int skip_batches;     /* batches not recorded first; default 1 */
    cm_time interval;     /* how long to record after them (ba); default 3ba */
    int max_entries;      /* entries kept; default 100000 */
    const char *folder;   /* copied; default "{run_name}/memory_traces" */
    const char *filename; /* copied; default "rank{rank}.{batch}.memory_snapshot.json" ({batch}: the last recorded) */
    bool overwrite;       /* default false: an existing file is an error */
} cm_memory_snapshot_config;

cm_memory_snapshot_config cm_memory_snapshot_config_default(void);
/* Name "MemorySnapshot": records batches skip_batches .. skip_batches + interval − 1 (0-based)
 * and writes the snapshot once, after the last of them. Errors: CM_ERR_INVALID_ARG
 * (skip_batches < 0, interval not a positive count of ba, max_entries < 1, empty folder or
 * filename), CM_ERR_OOM; CM_ERR_IO naming the file when it is written. */
cm_status cm_memory_snapshot_new(const cm_memory_snapshot_config *cfg, cm_callback_plugin *out);

/* OOMObserver: keeps the timeline of the batch in progress; when the arena runs out of its
 * budget (CM_ERR_OOM: a fixed microbatch size fails, automatic microbatching retries smaller)
 * it writes that batch's timeline with "oom": {request_bytes, used_bytes, budget_bytes, event,
 * batch, microbatch, count} to <folder>/<filename>.json and .svg (a later OOM overwrites them;
 * count says how many there were) and logs a warning naming the file. */
typedef struct cm_oom_observer_config {
    const char *folder;   /* copied; default "{run_name}/traces" */
    const char *filename; /* copied; default "rank{rank}_oom" */
    int max_entries;      /* per batch; default 100000 */
} cm_oom_observer_config;

cm_oom_observer_config cm_oom_observer_config_default(void);
/* Name "OOMObserver". Errors: CM_ERR_INVALID_ARG (empty folder or filename, max_entries < 1),
 * CM_ERR_OOM; a snapshot that cannot be written is a warning (the OOM itself is the error). */
cm_status cm_oom_observer_new(const cm_oom_observer_config *cfg, cm_callback_plugin *out);

/* =============================================================================================
 * ActivationMonitor: statistics of every module's inputs and outputs
 * =========================================================================================== */

/* Composer's ActivationMonitor: at the first microbatch of every `interval`-th batch it hooks
 * every module's forward (cm_module_set_forward_hook, from BEFORE_FORWARD to AFTER_FORWARD) and
 * logs, for each floating-point input i and the output of each module (path = its dotted name,
 * "" for the root), statistics over the last dimension averaged over the other rows:
 *   activations/max/<path>_input.<i>, activations/average/<path>_input.<i> (the plain mean),
 *   activations/l2_norm/<path>_input.<i>, activations/kurtosis/<path>_input.<i> (m4 / var²),
 * and the same with _output.0. Modules whose path contains one of ignore_module_types are left
 * out. Composer's only_log_wandb sends them to W&B alone when it is there; here they go to every
 * logger (a W&B logger included). Only modules called through cm_module_forward are seen. */
typedef struct cm_activation_monitor_config {
    cm_time interval;                       /* ba or ep; default 25ba */
    const char *const *ignore_module_types; /* substrings of paths to skip (copied); default none */
    int n_ignore_module_types;
    bool only_log_wandb;                    /* default true; see above */
} cm_activation_monitor_config;

cm_activation_monitor_config cm_activation_monitor_config_default(void);
/* Name "ActivationMonitor". A batch interval below 10ba is allowed with a warning (Composer's:
 * the hooks cost throughput). Errors: CM_ERR_INVALID_ARG (interval not a positive count of ba or
 * ep, n_ignore without the array), CM_ERR_OOM. */
cm_status cm_activation_monitor_new(const cm_activation_monitor_config *cfg, cm_callback_plugin *out);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_CALLBACKS_H */
