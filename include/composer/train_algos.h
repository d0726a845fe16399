/*
 * composer/train_algos.h — Composer's training methods as algorithms: EMA, SWA, SAM and
 * LayerFreezing, with Composer's class names, argument names, defaults and events. Each has a
 * config struct with a _default() holding Composer's defaults, a constructor giving a plugin for
 * the trainer (cfg.algorithms) and, where it computes something, its math as a plain function
 * that needs no trainer (Composer's functional API: compute_ema, freeze_layers, ...).
 *
 * State. Every one of them checkpoints what it needs so that a resumed run continues bit for bit
 * (Composer marks the resumption of LayerFreezing, SAM and SWA as failing; here they resume
 * exactly): EMA's averaged weights and which weights the model holds, SWA's average, its count
 * and its schedule, SAM's step counter, LayerFreezing's progress. Large state goes into the
 * checkpoint's algorithms.safetensors (cm_algorithm_i.tensors), the rest into the manifest.
 *
 * Distributed. They work on one process and under NO_SHARD data parallelism (every rank holds the
 * whole model and applies the same update); under SHARD_GRAD_OP and FULL_SHARD, where a rank holds
 * only pieces of the parameters, they refuse to start (CM_ERR_UNSUPPORTED on INIT, naming the
 * algorithm and the strategy to use).
 *
 *     cm_ema_config ec = cm_ema_config_default();            // half_life "1000ba"
 *     ec.half_life = "50ba";
 *     cm_ema *ema;                                          // a handle, valid while the trainer lives
 *     cm_algorithm_plugin algs[2];
 *     if (cm_ema_new(&ec, &ema, &algs[0]) != CM_OK) ...;
 *     cm_layer_freezing_config lf = cm_layer_freezing_config_default();
 *     cm_layer_freezing_new(&lf, &algs[1]);
 *     cfg.algorithms = algs; cfg.n_algorithms = 2;           // the trainer takes them
 *     ... cm_trainer_fit(tr, NULL) ...
 *     cm_ema_use_ema_weights(ema);                          // the averaged model, e.g. to export it
 *
 * Threading: an algorithm belongs to its trainer's thread; the plain functions are thread-safe
 * on distinct buffers.
 */
#ifndef COMPOSER_TRAIN_ALGOS_H
#define COMPOSER_TRAIN_ALGOS_H

#include <composer/trainer.h>

#ifdef __cplusplus
extern "C" {
#endif

/* =============================================================================================
 * EMA — exponential moving average of the weights (Composer's EMA)
 *
 * W_ema ← smoothing·W_ema + (1 − smoothing)·W_model, after every update_interval, where
 * smoothing = 2^(−update_interval / half_life) (so half_life is the number of intervals after which
 * a term's weight has halved). The average covers the parameters that require grad when the
 * average starts and every persistent buffer (batch-norm statistics, also num_batches_tracked,
 * averaged in f32 and truncated as torch does).
 *
 * Events, as Composer: INIT makes the average (a copy of the model, so a checkpoint can be
 * loaded into it); on the update event (BATCH_END for intervals in ba, EPOCH_END in ep) the
 * average starts once ema_start is reached — it is made again from the model then — and is
 * updated whenever the timestamp is a multiple of update_interval. EVAL_START swaps the averaged
 * weights into the model and EVAL_END swaps the training weights back, so evaluation sees the
 * average. On BATCH_CHECKPOINT / EPOCH_CHECKPOINT, when a checkpoint is about to be saved
 * (cm_state_checkpoint_due), the averaged weights are swapped in, so model.safetensors holds the
 * EMA model, and the EMA's own state (algorithms.safetensors) holds the training weights; the next
 * BATCH_START swaps them back. A resumed run therefore continues exactly. A checkpoint saved by
 * cm_trainer_save_checkpoint or after a preemption signal holds the training weights in the model
 * (as Composer's trainer.save_checkpoint); either way the checkpoint records where each is.
 * After fit, the model holds the averaged weights when the last checkpoint was saved at the end
 * (Composer's behaviour); cm_ema_use_ema_weights / cm_ema_use_training_weights choose.
 * On a GPU the average lives in device memory beside the model (made at INIT on the model's device,
 * it follows the model when the trainer moves it there) and is updated and swapped there, with the
 * CPU's roundings; checkpoints hold it as on the CPU, so a run resumes on either device.
 *
 * Differences from Composer, on purpose: before an update the training weights are swapped back
 * in if a checkpoint left the averaged ones in the model (Composer would average the average into
 * itself when an epoch-interval update follows a batch checkpoint); and averaging the model's
 * master weights happens in f32 exactly as torch computes it (smoothing rounded to f32, two
 * products, one sum), so the result equals Composer's bit for bit.
 * =========================================================================================== */

typedef struct cm_ema_config {
    const char *half_life;       /* "1000ba" (Composer's default); ba or ep, a whole count; NULL when
                                    smoothing is given (Composer refuses both, and so do we) */
    double smoothing;            /* NAN (None): from half_life; else in [0, 1] (half_life must be NULL) */
    const char *ema_start;       /* "0.0dur": dur, ba, ep, sp or tok */
    const char *update_interval; /* NULL (None): 1 in half_life's unit, or "1ba" with smoothing; ba or
                                    ep, and with half_life the same unit */
} cm_ema_config;

cm_ema_config cm_ema_config_default(void);

/* The smoothing of a half life: 2^(−update_interval / half_life) (0 for a half life of 0). */
double cm_ema_smoothing(double half_life, double update_interval);

/* Composer's compute_ema over n floats: ema[i] = fl(fl(ema[i]·s) + fl(model[i]·(1 − s))) with
 * s = (float)smoothing and 1 − s computed in double then rounded, as torch evaluates
 * `ema * smoothing + param * (1. - smoothing)` on f32 tensors. */
void cm_ema_update(float *ema, const float *model, int64_t n, double smoothing);

/* Composer's compute_ema(model, ema_model, smoothing) on two module trees: every parameter and
 * persistent buffer of `model` that `ema_model` has under the same name (and shape and dtype) is
 * averaged into ema_model's; names ema_model lacks are skipped, as Composer does. Integer buffers
 * (num_batches_tracked) are averaged in f32 and truncated toward zero, as torch's copy_ does.
 * The two trees may be on the CPU or on one GPU (averaged there). Errors: CM_ERR_INVALID_ARG
 * (NULL, smoothing outside [0, 1], a tensor on another device in each tree), CM_ERR_SHAPE naming
 * a tensor whose shape or dtype differs. */
cm_status cm_compute_ema(cm_module *model, cm_module *ema_model, double smoothing);

/* The algorithm (name "EMA"), with a handle for the calls below (handle may be NULL; it stays
 * valid while the plugin lives, i.e. until the trainer that took it is freed, or until
 * cm_algorithm_plugin_free for a plugin never registered). Errors: CM_ERR_INVALID_ARG naming the
 * argument: both or neither of half_life and smoothing, a time string that does not parse or has
 * a unit Composer does not allow there, update_interval in another unit than half_life,
 * smoothing outside [0, 1]; CM_ERR_OOM. */
typedef struct cm_ema cm_ema;
cm_status cm_ema_new(const cm_ema_config *cfg, cm_ema **handle, cm_algorithm_plugin *out);

double cm_ema_get_smoothing(const cm_ema *e);
bool cm_ema_started(const cm_ema *e);        /* the average has started (ema_start reached) */
bool cm_ema_weights_active(const cm_ema *e); /* the model holds the averaged weights now */
/* Makes the model hold the averaged (or the training) weights, swapping them with the ones the
 * EMA keeps: nothing is lost, and the trainer's later swaps stay consistent. A no-op when they are
 * already there. Errors: CM_ERR_STATE before INIT (no model yet). */
cm_status cm_ema_use_ema_weights(cm_ema *e);
cm_status cm_ema_use_training_weights(cm_ema *e);

/* =============================================================================================
 * LayerFreezing — progressively freeze the network's layers, earliest first (Composer's
 * LayerFreezing; FreezeOut, Freeze Training)
 *
 * The layers are the modules with parameters and no children, in depth-first order (Composer's
 * _get_layers); the last one (the head) is never frozen. On every EPOCH_END, with elapsed duration
 * d: the frozen fraction is 0 while d ≤ freeze_start, then freeze_level · (d − freeze_start) /
 * (1 − freeze_start); the first ⌊fraction · (layers − 1)⌋ layers are frozen: their parameters stop
 * requiring grad (backward no longer computes them) and are removed from the optimizer
 * (cm_optim_exclude: no update, no weight decay, no momentum). A parameter tied to a frozen layer's
 * (GPT-2's lm_head.weight is transformer.wte.weight) freezes with it, as in torch. Logs
 * layer_freezing/layers_frozen and layer_freezing/percentage_frozen.
 *
 * Checkpoints record how many layers are frozen; loading freezes them again (model and optimizer)
 * on AFTER_LOAD, so a resumed run continues exactly (Composer saves nothing and warns that such
 * checkpoints cannot reliably resume). Layers never thaw.
 * =========================================================================================== */

typedef struct cm_layer_freezing_config {
    double freeze_start; /* 0.5: the fraction of training before freezing begins, in [0, 1) */
    double freeze_level; /* 1.0: the fraction of layers frozen at the end of training, in [0, 1] */
} cm_layer_freezing_config;

cm_layer_freezing_config cm_layer_freezing_config_default(void);

/* Composer's _freeze_schedule: the fraction of layers to freeze at elapsed duration
 * current_duration (see above). */
double cm_layer_freezing_schedule(double current_duration, double freeze_start, double freeze_level);

/* Composer's _get_layers: the modules of root's tree that have parameters and no children, in
 * depth-first order, into out (room for cap; NULL to count); returns how many there are. */
int64_t cm_layer_freezing_layers(cm_module *root, cm_module **out, int64_t cap);

/* Freezes the first `n_layers` layers of root's tree (never the last): their parameters stop
 * requiring grad and, when opt is not NULL, are removed from it (cm_optim_exclude: opt's spans
 * must be the finalized root's unit buffers, or hold the parameters). Errors: CM_ERR_INVALID_ARG
 * (NULL root, n_layers < 0), CM_ERR_STATE (root not finalized), cm_optim_exclude's
 * (CM_ERR_NOT_FOUND naming the parameter the optimizer does not hold). */
cm_status cm_layer_freezing_freeze(cm_module *root, cm_optim *opt, int64_t n_layers);

/* Composer's freeze_layers(model, optimizers, current_duration, freeze_start, freeze_level):
 * freezes the first ⌊schedule · (layers − 1)⌋ layers and reports that depth and the fraction
 * (each may be NULL). Errors as cm_layer_freezing_freeze, and CM_ERR_INVALID_ARG for a
 * freeze_start outside [0, 1) or a freeze_level outside [0, 1]. */
cm_status cm_freeze_layers(cm_module *root, cm_optim *opt, double current_duration, double freeze_start,
                           double freeze_level, int64_t *freeze_depth, double *freeze_percentage);

/* The algorithm (name "LayerFreezing"). Errors: CM_ERR_INVALID_ARG naming freeze_start or
 * freeze_level out of range, CM_ERR_OOM. */
cm_status cm_layer_freezing_new(const cm_layer_freezing_config *cfg, cm_algorithm_plugin *out);

/* =============================================================================================
 * SAM — sharpness-aware minimization (Composer's SAM and SAMOptimizer, after Foret et al. 2020)
 *
 * Every `interval`-th optimizer step (the k-th step with k % interval == 0, counting from 1) is
 * taken at the gradient of the perturbed weights: compute the gradient g at w, move to
 * w + e(w) with e(w) = rho · g / (‖g‖₂ + epsilon) (‖g‖ over every gradient, frozen parameters
 * contributing nothing), compute the gradient there, return to w and take the base optimizer's step
 * with that second gradient. Other steps are ordinary. It installs a custom train step on
 * AFTER_LOAD (Composer's event) through cm_state_set_train_step, so each gradient computation is
 * the trainer's whole microbatch loop with its events: GradientClipping and other
 * AFTER_TRAIN_BATCH algorithms act on both gradients, as inside Composer's closure. The batch's
 * loss and train metrics are the first gradient's (Composer discards the second's loss dict).
 * The step counter is checkpointed, so resumption is exact (Composer: xfail).
 *
 * Differences from Composer, on purpose: w is restored exactly from a copy (Composer subtracts
 * e(w) again, which can leave w an ulp off); on several ranks the first gradient is the global
 * batch's (synchronised), so every rank takes the same perturbation and N ranks train as one
 * (Composer perturbs each rank by its local gradient); a batch whose loss is exactly 0 still
 * steps (Composer's `if loss:` skips it).
 * =========================================================================================== */

typedef struct cm_sam_config {
    double rho;       /* 0.05: the neighbourhood size, ≥ 0 */
    double epsilon;   /* 1e-12: added to the gradient norm */
    int64_t interval; /* 1: SAM runs on every interval-th step (≥ 1) */
} cm_sam_config;

cm_sam_config cm_sam_config_default(void);

/* SAMOptimizer.first_step over n spans (params[i] and grads[i] hold lens[i] floats): saves w into
 * saved[i] (lens[i] floats each, caller's memory), then w ← w + g · (rho / (‖g‖₂ + epsilon)),
 * the scale rounded to f32 as torch's. *grad_norm (may be NULL) gets ‖g‖₂ (accumulated in
 * double). The buffers are host memory or all on one GPU (a model moved with cm_module_to_device;
 * then the update runs there, with the same roundings). Errors: CM_ERR_INVALID_ARG (rho < 0 or not
 * finite, epsilon < 0, NULL spans, buffers on different devices). */
cm_status cm_sam_perturb(float *const *params, const float *const *grads, float *const *saved, const int64_t *lens,
                         int n, double rho, double epsilon, double *grad_norm);
/* Puts w back from saved (the spans cm_sam_perturb filled). */
void cm_sam_restore(float *const *params, const float *const *saved, const int64_t *lens, int n);

/* The algorithm (name "SAM"). Errors: CM_ERR_INVALID_ARG naming rho (< 0 or not finite), epsilon
 * (< 0) or interval (< 1); CM_ERR_OOM. On AFTER_LOAD: CM_ERR_STATE when another algorithm already
 * replaced the train step, CM_ERR_UNSUPPORTED under a sharded strategy. */
cm_status cm_sam_new(const cm_sam_config *cfg, cm_algorithm_plugin *out);

/* =============================================================================================
 * SWA — stochastic weight averaging (Composer's SWA, Izmailov et al. 2018, with torch's
 * AveragedModel and SWALR)
 *
 * From swa_start on, every update_interval-th update event (BATCH_END for an interval in ba,
 * EPOCH_END in ep; the average is made again from the model when SWA starts) adds the model's
 * parameters to an equal-weight running average: avg ← avg + (w − avg) / (n + 1), n the number
 * averaged so far (AveragedModel.update_parameters); the average's buffers follow the model's at
 * each update (AveragedModel with use_buffers=False in the torch Composer runs on today). On the
 * first update event at or after swa_end the model's parameters and buffers are replaced by the
 * average and SWA stops. Batch-norm statistics are recomputed as Composer does: by the training
 * that follows swa_end (its advice: leave at least an epoch after swa_end; a warning is logged when
 * the average is put in at the very end of training, where they cannot be).
 *
 * With schedule_swa_lr, SWA owns the learning rate from its start to the end of the run (through
 * cm_state_set_lr_multiplier_override, replacing the schedulers): SWALR's schedule, annealed from
 * the learning rate in use when SWA started, lr₀, toward swa_lr over anneal_steps SWA updates:
 * lr = swa_lr·α + lr₀·(1 − α), α = anneal(min(1, k / anneal_steps)) after k updates, anneal(t) = t
 * (linear) or (1 − cos πt)/2 (cos). The optimizer's groups must share one learning rate (Composer:
 * "SWA supports only one LR").
 *
 * The checkpoint holds the average (algorithms.safetensors), the update count, the step counter,
 * whether SWA started or completed and the schedule's state, so resumption is exact (Composer:
 * xfail on several ranks).
 *
 * Differences from Composer, on purpose: swa_lr is honoured (Composer replaces it by the
 * schedulers' last learning rate whenever schedule_swa_lr is set, so its schedule is flat; with
 * swa_lr unset we do the same: the learning rate stays at lr₀); and the SWA schedule is not undone
 * by the schedulers each batch (Composer's LambdaLR schedulers override SWALR's learning rate at
 * their next step).
 * =========================================================================================== */

typedef enum cm_swa_anneal { CM_SWA_ANNEAL_LINEAR = 0, CM_SWA_ANNEAL_COS = 1 } cm_swa_anneal;
/* "linear"/"lin" and "cos"/"cosine", case-insensitive (Composer's names). CM_ERR_INVALID_ARG
 * listing them otherwise. */
cm_status cm_swa_anneal_parse(const char *s, cm_swa_anneal *out);

typedef struct cm_swa_config {
    const char *swa_start;       /* "0.7dur": dur or ep */
    const char *swa_end;         /* "0.97dur": dur or ep, the unit of swa_start, after it */
    const char *update_interval; /* "1ep": ba or ep */
    bool schedule_swa_lr;        /* false */
    const char *anneal_strategy; /* "linear" (or "cos") */
    int64_t anneal_steps;        /* 10 (> 0) */
    double swa_lr;               /* NAN (None): the learning rate SWA started with */
} cm_swa_config;

cm_swa_config cm_swa_config_default(void);

/* AveragedModel.update_parameters over n floats after n_averaged updates: a copy when
 * n_averaged is 0, else avg ← avg + (model − avg) / (n_averaged + 1), each operation rounded to
 * f32 as torch computes it. */
void cm_swa_average_update(float *avg, const float *model, int64_t n, int64_t n_averaged);

/* SWALR's learning rate after `step` scheduler steps (0: as created, lr0): swa_lr·α + lr0·(1 − α),
 * α = anneal(min(1, step / max(1, anneal_steps))) (anneal_steps 0: α = 1 from the first step). */
double cm_swa_lr(double lr0, double swa_lr, int64_t step, int64_t anneal_steps, cm_swa_anneal strategy);

/* The algorithm (name "SWA"). Errors: CM_ERR_INVALID_ARG naming the argument (a time string that
 * does not parse or has a unit Composer refuses there, swa_start and swa_end in different units or
 * not swa_start < swa_end, a fraction outside [0, 1], anneal_steps ≤ 0, an unknown
 * anneal_strategy, swa_lr < 0); CM_ERR_OOM. On INIT: CM_ERR_UNSUPPORTED under a sharded strategy;
 * with schedule_swa_lr, CM_ERR_INVALID_ARG when the optimizer's groups have different learning
 * rates. */
cm_status cm_swa_new(const cm_swa_config *cfg, cm_algorithm_plugin *out);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_TRAIN_ALGOS_H */
