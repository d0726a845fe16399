/*
 * composer/optim.h — optimizers over flat f32 buffers, and Composer's learning-rate schedulers as
 * pure functions of training time.
 *
 * Optimizers. A cm_optim holds parameter groups; each group has hyperparameters (cm_optim_hparams)
 * and a list of spans: a parameter buffer, its gradient buffer and a length, both borrowed. The
 * optimizer allocates its state (momentum buffers, Adam moments, step counts) mirroring the spans,
 * one flat buffer per span, and exposes it by name for checkpoints ("<span>.exp_avg").
 * cm_optim_step(o, m) updates every span with learning rate group.lr · m, where m is the product
 * of the schedulers' multipliers. The update rules are exactly PyTorch's (torch 1.13) SGD, Adam and
 * AdamW, and Composer's DecoupledSGDW and DecoupledAdamW; each is written out below.
 *
 * Schedulers. A scheduler is plain data (cm_sched_config) and a pure function
 * cm_sched_multiplier(config, clock) -> α, where the clock holds the timestamp, the run's
 * max_duration, the dataloader length and the scale-schedule ratio. Several schedulers multiply
 * (cm_sched_multiplier_product). All of Composer's schedulers are here, with its formulas and
 * Time arguments.
 *
 *     float w[1000], g[1000];                               // (1000,) parameters and gradients
 *     cm_optim *opt;
 *     cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_DECOUPLED_ADAMW);
 *     hp.lr = 6e-4;
 *     cm_optim_span span = {"w", w, g, 1000};
 *     if (cm_optim_new(CM_OPTIM_DECOUPLED_ADAMW, &opt) != CM_OK ||
 *         cm_optim_add_group(opt, &hp, &span, 1) != CM_OK) { ... cm_last_error() ... }
 *
 *     cm_sched_config cos = cm_sched_config_default(CM_SCHED_COSINE_ANNEALING_WITH_WARMUP);
 *     cm_time_parse("100ba", &cos.t_warmup);
 *     cm_sched_clock clk = cm_sched_clock_default();
 *     cm_time_parse("10ep", &clk.max_duration);
 *     clk.batches_per_epoch = 500;
 *     for (...each batch...) {
 *         ... forward, backward into g ...
 *         double alpha;
 *         if (cm_sched_multiplier(&cos, &clk, &alpha) != CM_OK || cm_optim_step(opt, alpha) != CM_OK) ...
 *         cm_optim_zero_grad(opt);
 *         cm_timestamp_next_batch(&clk.now, batch_size, 0, seconds);
 *     }
 *     cm_optim_free(opt);
 *
 * When the multiplier is evaluated. We evaluate the schedule at the batch about to be trained:
 * the update of batch k (0-based; clock.now.batch == k, i.e. k batches done) uses α(k). Composer
 * wraps its schedulers in torch's LambdaLR and calls scheduler.step() after the optimizer step but
 * before advancing the timestamp, so its batch k uses α(k-1) (and batch 0 uses α(0)): one batch
 * late. Warmup therefore reaches its peak one batch earlier here, and the last batch of a cosine
 * decay uses α(T-1) rather than α(T-2).
 */
#ifndef COMPOSER_OPTIM_H
#define COMPOSER_OPTIM_H

#include <composer/base.h>
#include <composer/tensor.h>
#include <composer/time.h>

#ifdef __cplusplus
extern "C" {
#endif

/* =============================================================================================
 * Optimizers
 * =========================================================================================== */

/* X-macro list: enum name, config name. */
#define CM_OPTIM_KIND_LIST(X)                        \
    X(CM_OPTIM_SGD, "sgd")                           \
    X(CM_OPTIM_DECOUPLED_SGDW, "decoupled_sgdw")     \
    X(CM_OPTIM_ADAM, "adam")                         \
    X(CM_OPTIM_ADAMW, "adamw")                       \
    X(CM_OPTIM_DECOUPLED_ADAMW, "decoupled_adamw")

/*
 * The update rules, per element, for step t = 1, 2, ... of a span (p parameter, g gradient,
 * lr = group.lr · multiplier, wd = weight_decay, decay = lr / initial_lr where initial_lr is
 * group.lr when the group was added, or 1 when that is 0):
 *
 *  SGD (torch.optim.SGD):
 *      d = g + wd·p
 *      if momentum ≠ 0:  b = d at t = 1, else b = momentum·b + (1 - dampening)·d
 *                        d = nesterov ? d + momentum·b : b
 *      p = p - lr·d
 *  DECOUPLED_SGDW (Composer): as SGD with d = g (no wd in the gradient), then
 *      p = p·(1 - decay·wd) - lr·d
 *  ADAM (torch.optim.Adam):
 *      d = g + wd·p
 *      m = β1·m + (1-β1)·d;  v = β2·v + (1-β2)·d²;  (amsgrad: vmax = max(vmax, v), use vmax for v)
 *      p = p - (lr / (1-β1^t)) · m / (sqrt(v) / sqrt(1-β2^t) + eps)
 *  ADAMW (torch.optim.AdamW): p = p·(1 - lr·wd), then the Adam update with d = g
 *  DECOUPLED_ADAMW (Composer): p = p·(1 - decay·wd), then the Adam update with d = g
 *
 * Nesterov needs momentum > 0 and dampening = 0 (as in torch). Scalars (lr, bias corrections,
 * decay factors) are computed in double and applied in f32, as torch does, so results agree with
 * torch to a few f32 ulps.
 */
typedef enum cm_optim_kind {
#define CM_X_(name, str) name,
    CM_OPTIM_KIND_LIST(CM_X_)
#undef CM_X_
    CM_OPTIM_KIND_COUNT
} cm_optim_kind;

/* "sgd", "adamw", ... ("?" out of range); parsing is case-insensitive and lists the names on
 * error (CM_ERR_INVALID_ARG). */
const char *cm_optim_kind_name(cm_optim_kind k);
cm_status cm_optim_kind_parse(const char *s, cm_optim_kind *out);

/* A group's hyperparameters. SGD kinds read momentum, dampening, nesterov; Adam kinds read
 * beta1, beta2, eps, amsgrad; all read lr and weight_decay. */
typedef struct cm_optim_hparams {
    double lr;           /* base learning rate (≥ 0); SGD kinds: NAN until set (torch requires it) */
    double weight_decay; /* ≥ 0 */
    double momentum;     /* SGD kinds, ≥ 0 */
    double dampening;    /* SGD kinds */
    bool nesterov;       /* SGD kinds */
    double beta1, beta2; /* Adam kinds, in [0, 1) */
    double eps;          /* Adam kinds, ≥ 0 */
    bool amsgrad;        /* Adam kinds */
} cm_optim_hparams;

/* The defaults of the torch / Composer class: SGD and DecoupledSGDW lr = NAN (must be set),
 * everything else 0 / false; Adam lr 1e-3, betas (0.9, 0.999), eps 1e-8, wd 0; AdamW the same with
 * wd 1e-2; DecoupledAdamW lr 1e-3, betas (0.9, 0.95), eps 1e-8, wd 1e-5. */
cm_optim_hparams cm_optim_hparams_default(cm_optim_kind kind);

/* One flat buffer to optimize. `param` and `grad` are borrowed: they must hold `n` floats and stay
 * valid for the optimizer's lifetime. `grad` may be NULL: the span is then skipped by steps (like a
 * torch parameter whose .grad is None) and its step count does not advance. `name` (copied; NULL
 * gives "span<i>") names the span's state buffers and must be unique within the optimizer. */
/* A span's memory may be on the host or on a GPU (a model moved with cm_module_to_device: pass its
 * cm_unit_info buffers as they are); the optimizer finds out which from the pointer, keeps its
 * state on the same device and updates there. param and grad must be on one device. */
typedef struct cm_optim_span {
    const char *name;
    float *param; /* (n,) */
    float *grad;  /* (n,) or NULL */
    int64_t n;
} cm_optim_span;

typedef struct cm_optim cm_optim;

/* Creates an optimizer of `kind` with no groups. Errors: CM_ERR_INVALID_ARG, CM_ERR_OOM. */
cm_status cm_optim_new(cm_optim_kind kind, cm_optim **out);
/* Frees the optimizer and its state (not the spans' buffers). NULL is a no-op. */
void cm_optim_free(cm_optim *o);

cm_optim_kind cm_optim_get_kind(const cm_optim *o);

/* Adds a parameter group (like torch's add_param_group): validates the hyperparameters (lr set
 * and ≥ 0, wd ≥ 0, momentum ≥ 0, betas in [0, 1), eps ≥ 0, nesterov only with momentum > 0 and
 * dampening 0), the spans (non-NULL param, n ≥ 0, unique names) and allocates zeroed state.
 * initial_lr (for the decoupled kinds) is hp->lr. The group's index is the number of groups
 * before the call. On error nothing is added. Errors: CM_ERR_INVALID_ARG (naming the field and
 * value), CM_ERR_OOM. Not thread-safe with other calls on the same optimizer. */
cm_status cm_optim_add_group(cm_optim *o, const cm_optim_hparams *hp, const cm_optim_span *spans, int n_spans);

int cm_optim_n_groups(const cm_optim *o);

/* Reads / replaces group g's hyperparameters (validated as in add_group; initial_lr is kept, so
 * changing lr here scales the decoupled decay like changing group['lr'] in torch). Errors:
 * CM_ERR_INVALID_ARG for a bad index or value. */
cm_status cm_optim_group_get(const cm_optim *o, int g, cm_optim_hparams *out);
cm_status cm_optim_group_set(cm_optim *o, int g, const cm_optim_hparams *hp);

/* Applies one update to every span with a gradient, using lr = group.lr · lr_multiplier
 * (lr_multiplier ≥ 0 and finite, else CM_ERR_INVALID_ARG and nothing changes). Runs on
 * cm_num_threads() OpenMP threads for large spans. The buffers must not be used by other threads
 * during the call. */
cm_status cm_optim_step(cm_optim *o, double lr_multiplier);

/* Sets every span's gradient to 0 (spans with NULL grad are skipped). */
void cm_optim_zero_grad(cm_optim *o);

/* Removes parameters from the optimizer, as Composer's LayerFreezing removes frozen parameters
 * from the param groups: the `n` floats at `param` — a part of one span's parameter buffer (a
 * parameter's range of its unit) — are skipped by every later step: no update, no weight decay,
 * no change to their momentum or Adam moments (their state stays in the checkpoint as it was).
 * The span's step count still advances for its other elements, as torch's per-parameter counts
 * do for the parameters left in the group. Excluding a part twice is harmless; there is no way
 * back. Not saved in checkpoints (LayerFreezing excludes again when its state is loaded).
 * Errors: CM_ERR_INVALID_ARG (NULL, n < 0), CM_ERR_NOT_FOUND (no span's buffer holds the whole
 * range), CM_ERR_OOM. */
cm_status cm_optim_exclude(cm_optim *o, const float *param, int64_t n);
/* The number of elements excluded (over all spans). */
int64_t cm_optim_n_excluded(const cm_optim *o);

/* Moves part of a span into group g's hyperparameters, as torch's param_groups put a parameter
 * in a group of its own (llm-foundry's optimizer `param_groups`): the `n` floats at `param` — a
 * part of one span's parameter buffer, usually one parameter's range of its unit — are updated
 * with group g's lr (times the schedulers' multiplier), weight decay, betas, eps or momentum,
 * and the decoupled kinds scale their decay by group g's lr / initial_lr. Their state stays in
 * the span's buffers under the span's names, so checkpoints keep their layout. Group g usually
 * holds no spans of its own (cm_optim_add_group with n_spans = 0). A later assignment of the
 * same elements replaces the earlier one; assigning them to the span's own group undoes it.
 * Exclusion (cm_optim_exclude) wins over assignment. Not saved in checkpoints (the assignments
 * come from the run's configuration). Errors: CM_ERR_INVALID_ARG (NULL, n < 0, g out of range,
 * or group g keeps different state than the span's group: momentum 0 against non-0, amsgrad on
 * against off — the message names both groups), CM_ERR_NOT_FOUND (no span's buffer holds the
 * whole range), CM_ERR_OOM. */
cm_status cm_optim_assign(cm_optim *o, int g, const float *param, int64_t n);
/* The number of elements assigned to a group other than their span's (over all spans). */
int64_t cm_optim_n_assigned(const cm_optim *o);

/* Optimizer state, for checkpoints. Entries are named "<span>.<key>" with key one of
 * "step" (i64, 1 element: updates applied to the span), "momentum_buffer" (SGD kinds with
 * momentum ≠ 0), "exp_avg", "exp_avg_sq", "max_exp_avg_sq" (amsgrad) — f32, n elements —
 * following torch's state_dict keys. Entries are listed group by group, span by span. */
typedef struct cm_optim_state_entry {
    const char *name; /* borrowed, valid until the optimizer is freed */
    cm_dtype dtype;   /* CM_DTYPE_F32 or CM_DTYPE_I64 */
    void *data;       /* borrowed; writable (loading a checkpoint writes here) */
    int64_t numel;
    cm_device device; /* where data lives: the spans' device (steps are always host memory) */
} cm_optim_state_entry;

/* The number of state entries (it changes only when a group is added). */
int cm_optim_n_state(const cm_optim *o);
/* Entry i in [0, cm_optim_n_state). Errors: CM_ERR_INVALID_ARG for a bad index. */
cm_status cm_optim_state_get(const cm_optim *o, int i, cm_optim_state_entry *out);
/* The entry with this name. Errors: CM_ERR_NOT_FOUND (naming it). */
cm_status cm_optim_state_find(const cm_optim *o, const char *name, cm_optim_state_entry *out);

/* =============================================================================================
 * Schedulers
 * =========================================================================================== */

/* X-macro list: enum name, config name (Composer's class name in snake case). */
#define CM_SCHED_KIND_LIST(X)                                                             \
    X(CM_SCHED_STEP, "step")                                                              \
    X(CM_SCHED_MULTISTEP, "multistep")                                                    \
    X(CM_SCHED_CONSTANT, "constant")                                                      \
    X(CM_SCHED_LINEAR, "linear")                                                          \
    X(CM_SCHED_EXPONENTIAL, "exponential")                                                \
    X(CM_SCHED_COSINE_ANNEALING, "cosine_annealing")                                      \
    X(CM_SCHED_COSINE_ANNEALING_WARM_RESTARTS, "cosine_annealing_warm_restarts")          \
    X(CM_SCHED_POLYNOMIAL, "polynomial")                                                  \
    X(CM_SCHED_MULTISTEP_WITH_WARMUP, "multistep_with_warmup")                            \
    X(CM_SCHED_CONSTANT_WITH_WARMUP, "constant_with_warmup")                              \
    X(CM_SCHED_LINEAR_WITH_WARMUP, "linear_with_warmup")                                  \
    X(CM_SCHED_COSINE_ANNEALING_WITH_WARMUP, "cosine_annealing_with_warmup")              \
    X(CM_SCHED_POLYNOMIAL_WITH_WARMUP, "polynomial_with_warmup")

/*
 * The formulas (Composer's). t is the current time in the unit of the argument it is compared
 * with, after conversion (see cm_sched_clock); τ = clamp(t / t_max, 0, 1);
 * cos_anneal(x) = α_f + (1 - α_f)·(1 + cos(π·x)) / 2.
 *
 *  STEP(step_size, gamma=0.1)                 α = gamma^floor(t / step_size)
 *  MULTISTEP(milestones, gamma=0.1)           α = gamma^(number of milestones m with t ≥ m)
 *  CONSTANT(alpha=1, t_max=1dur)              α = alpha if t < t_max else 1
 *  LINEAR(alpha_i=1, alpha_f=0, t_max=1dur)   α = alpha_i + (alpha_f - alpha_i)·τ
 *  EXPONENTIAL(gamma, decay_period=1ep)       α = gamma^(t / decay_period)
 *  COSINE_ANNEALING(t_max=1dur, alpha_f=0)    α = cos_anneal(τ)
 *  COSINE_ANNEALING_WARM_RESTARTS(t_0, t_mult=1, alpha_f=0)
 *      cycles of lengths t_0, ⌊t_mult·t_0⌋, ⌊t_mult·⌊t_mult·t_0⌋⌋, ... (in t_0's converted unit);
 *      α = cos_anneal((t - cycle start) / cycle length)
 *  POLYNOMIAL(power, t_max=1dur, alpha_f=0)   α = alpha_f + (1 - alpha_f)·(1 - τ)^power
 *
 *  The warmup variants: for t < t_warmup, α = peak · t / t_warmup (peak = alpha_i for
 *  LINEAR_WITH_WARMUP and alpha for CONSTANT_WITH_WARMUP, else 1). After the warmup, with
 *  τ_w = clamp((t - t_warmup) / (t_max - t_warmup), 0, 1), or 0 when t_max ≤ t_warmup:
 *  MULTISTEP_WITH_WARMUP(t_warmup, milestones, gamma=0.1)       α = MULTISTEP
 *  CONSTANT_WITH_WARMUP(t_warmup, alpha=1, t_max=1dur)          α = alpha (also after t_max: it
 *      is Composer's LinearWithWarmup with alpha_i = alpha_f = alpha; the docstring's "1.0
 *      after t_max" is not what Composer computes)
 *  LINEAR_WITH_WARMUP(t_warmup, alpha_i=1, alpha_f=0, t_max=1dur)  α = alpha_i + (alpha_f - alpha_i)·τ_w
 *  COSINE_ANNEALING_WITH_WARMUP(t_warmup, t_max=1dur, alpha_f=0)   α = cos_anneal(τ_w)
 *  POLYNOMIAL_WITH_WARMUP(t_warmup, power=2, t_max=1dur, alpha_f=0)
 *                                                α = alpha_f + (1 - alpha_f)·(1 - τ_w)^power
 *  For all but MULTISTEP_WITH_WARMUP, t_warmup and t_max must convert to the same unit, and t_max
 *  (converted) must not be shorter than max_duration when they are comparable (Composer raises on
 *  both; it compares the unconverted t_max, which wrongly fails for ssr > 1).
 *
 * Edge cases where Composer would divide by zero: step_size, decay_period or a restart cycle of
 * 0 is CM_ERR_INVALID_ARG; a t_max of 0 counts as finished (τ = 1).
 */
typedef enum cm_sched_kind {
#define CM_X_(name, str) name,
    CM_SCHED_KIND_LIST(CM_X_)
#undef CM_X_
    CM_SCHED_KIND_COUNT
} cm_sched_kind;

/* "cosine_annealing_with_warmup", ... ("?" out of range). Parsing is case-insensitive, also
 * accepts the class names ("CosineAnnealingWithWarmupScheduler") and llm-foundry's aliases
 * ("cosine_with_warmup", "linear_decay_with_warmup", "constant_with_warmup"), and lists the names
 * on error. */
const char *cm_sched_kind_name(cm_sched_kind k);
cm_status cm_sched_kind_parse(const char *s, cm_sched_kind *out);

#define CM_SCHED_MAX_MILESTONES 32

/* A scheduler: its kind and the arguments of Composer's class (unused ones are ignored). Plain
 * data, copy freely. Start from cm_sched_config_default(kind), which fills Composer's defaults
 * (times "1dur" and "1ep" where Composer has them; t_warmup, step_size, t_0 as 0ba, to be set). */
typedef struct cm_sched_config {
    cm_sched_kind kind;
    cm_time t_max;        /* CONSTANT*, LINEAR*, COSINE_ANNEALING*, POLYNOMIAL* (default 1dur) */
    cm_time t_warmup;     /* *_WITH_WARMUP */
    cm_time step_size;    /* STEP */
    cm_time decay_period; /* EXPONENTIAL (default 1ep) */
    cm_time t_0;          /* COSINE_ANNEALING_WARM_RESTARTS */
    cm_time milestones[CM_SCHED_MAX_MILESTONES]; /* MULTISTEP* */
    int n_milestones;
    double gamma;   /* STEP, MULTISTEP* (default 0.1); EXPONENTIAL (must be set; default 1) */
    double alpha;   /* CONSTANT* (default 1) */
    double alpha_i; /* LINEAR* (default 1) */
    double alpha_f; /* LINEAR* (default 0), COSINE*, POLYNOMIAL* (default 0) */
    double power;   /* POLYNOMIAL (must be set; default 1), POLYNOMIAL_WITH_WARMUP (default 2) */
    double t_mult;  /* COSINE_ANNEALING_WARM_RESTARTS (default 1) */
    bool scale_warmup; /* *_WITH_WARMUP: the scale-schedule ratio also stretches the warmup (default false) */
} cm_sched_config;

cm_sched_config cm_sched_config_default(cm_sched_kind kind);

/* What a scheduler reads: the current timestamp, the run's length (max_duration; already scaled
 * by the scale-schedule ratio, as Composer's trainer does), the number of batches per epoch (the
 * dataloader length; needed for times in ep and for dur when max_duration is in ep; 0 = unknown)
 * and the scale-schedule ratio ssr (> 0; default 1).
 *
 * Converting a scheduler's time argument x (Composer's _convert_time):
 *   x in dur:  max_duration in ep -> ⌊x · batches_per_epoch · max_epochs⌋ ba, otherwise
 *              ⌊x · max_duration⌋ in max_duration's unit (not scaled by ssr: max_duration is)
 *   x in ep:   -> ⌊x · batches_per_epoch · ssr⌋ ba
 *   otherwise: ⌊x · ssr⌋ in x's unit;  sec is CM_ERR_INVALID_ARG (wall clock cannot drive a schedule)
 * Where Composer truncates a product that is an integer up to rounding noise (0.29 · 100 =
 * 28.999999999999996 -> 28), we round to the integer (29): ⌊y + 1e-9·max(1, y)⌋.
 * The warmup time is converted without ssr unless scale_warmup is set. With scale_warmup,
 * Composer compares t against the unscaled warmup but ramps over the scaled one (so the ramp
 * reaches 1 early and then waits); we use the scaled warmup for both, which makes
 * α_ssr(t) = α_1(t / ssr) hold as Composer documents. */
typedef struct cm_sched_clock {
    cm_timestamp now;
    cm_time max_duration;
    int64_t batches_per_epoch;
    double ssr;
} cm_sched_clock;

/* A zeroed timestamp, max_duration 1ep, batches_per_epoch 0 (set both), ssr 1. */
cm_sched_clock cm_sched_clock_default(void);

/* Checks a config on its own: the kind, gamma/alpha/power finite, t_mult > 0, n_milestones in
 * [0, CM_SCHED_MAX_MILESTONES], no duration-typed max, no sec arguments, non-negative times.
 * Errors: CM_ERR_INVALID_ARG naming the field and the value. */
cm_status cm_sched_validate(const cm_sched_config *cfg);

/* The learning-rate multiplier α of one scheduler at clock->now. Pure: same inputs, same
 * output; thread-safe. Errors (CM_ERR_INVALID_ARG, *out untouched): an invalid config (see
 * cm_sched_validate), a conversion that needs batches_per_epoch when it is 0, ssr ≤ 0, units that
 * cannot be compared, max_duration in dur. */
cm_status cm_sched_multiplier(const cm_sched_config *cfg, const cm_sched_clock *clock, double *out);

/* The product of n schedulers' multipliers (1 for n = 0): Composer multiplies schedulers that
 * are used together. The first error stops and is returned. */
cm_status cm_sched_multiplier_product(const cm_sched_config *cfgs, int n, const cm_sched_clock *clock, double *out);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_OPTIM_H */
