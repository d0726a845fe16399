/* The Trainer: configuration checks, the fit loop (epochs, batches, microbatches, automatic
 * microbatching, mixed precision, the optimizer step with the schedulers), evaluation at the
 * eval interval, standalone eval, predict, close. The event order is documented in trainer.h. */
#include "trainer/trainer_impl.h"
#include "checkpoint/ckpt_impl.h"
#include "base/prof_impl.h"
#include "model/model_impl.h"
#include "tensor/tensor_impl.h"
#include <composer/surgery_algorithms.h>

#include <composer/report.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

cm_evaluator cm_evaluator_default(void) {
    return (cm_evaluator){"eval", NULL, -1, {CM_TIME_EPOCH, 0, 0}};
}

/* The training metric set: the model's training metrics when `on` (compute_training_metrics), else
 * an empty set marked off, so nothing is updated or logged and cm_state_metric says why. */
static cm_status train_metrics_init(cm_metric_set *ms, const cm_model *model, const char *label, bool on) {
    if (on) return cmi_metric_set_init(ms, model, true, label);
    memset(ms, 0, sizeof *ms);
    snprintf(ms->label, sizeof ms->label, "%s", label);
    ms->off = true;
    return CM_OK;
}

cm_trainer_config cm_trainer_config_default(void) {
    cm_trainer_config c;
    memset(&c, 0, sizeof c);
    c.train_data_spec = cm_data_spec_config_default();
    c.max_duration = cm_time_make(0, CM_TIME_EPOCH);
    c.eval_interval = cm_time_make(1, CM_TIME_EPOCH);
    c.eval_subset_num_batches = -1;
    c.scale_schedule_ratio = 1.0;
    c.precision = CM_PRECISION_FP32;
    c.seed = 42;
    c.dist.rank = 0;
    c.dist.world_size = 1;
    c.save_interval = cm_time_make(1, CM_TIME_EPOCH);
    c.save_num_checkpoints_to_keep = -1;
    c.load_strict_model_weights = true;
    c.handle_signals = true;
    c.plan_memory = true;
    return c;
}

cm_fit_opts cm_fit_opts_default(void) {
    return (cm_fit_opts){cm_time_make(0, CM_TIME_EPOCH), false};
}

static bool time_is_zero(cm_time t) { return t.unit == CM_TIME_DURATION ? t.frac == 0 : t.count == 0; }
static cm_time scaled(cm_time t, double ssr);

static cm_status check_duration_unit(const char *what, cm_time t) {
    if (t.unit == CM_TIME_EPOCH || t.unit == CM_TIME_BATCH || t.unit == CM_TIME_SAMPLE || t.unit == CM_TIME_TOKEN)
        return CM_OK;
    char buf[CM_TIME_STR_MAX];
    cm_time_to_string(t, buf, sizeof buf);
    return cm_set_error(CM_ERR_INVALID_ARG, "%s '%s': the unit must be ep, ba, sp or tok (a fraction of the run, "
                                            "iterations or wall-clock seconds cannot set the run's length)",
                        what, buf);
}

static cm_status check_interval(const char *what, cm_time t) {
    if (time_is_zero(t)) return CM_OK;
    char buf[CM_TIME_STR_MAX];
    cm_time_to_string(t, buf, sizeof buf);
    if (t.unit == CM_TIME_DURATION) {
        if (t.frac > 0 && t.frac <= 1) return CM_OK;
        return cm_set_error(CM_ERR_INVALID_ARG, "%s '%s': a fraction of the run must be in (0, 1]", what, buf);
    }
    if (t.unit == CM_TIME_ITERATION || t.unit == CM_TIME_SECOND || (unsigned)t.unit >= CM_TIME_UNIT_COUNT || t.count < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s '%s': use ep, ba, sp, tok or dur (or 0 to disable)", what, buf);
    return CM_OK;
}

/* Events are not fired during a dry run (cm_state_dry_run): nothing but the step itself happens. */
static cm_status run(cm_trainer *tr, cm_event ev) { return tr->dry ? CM_OK : cm_engine_run_event(tr->engine, ev); }

/* Batches a loop over dl runs: the loader's count per epoch, at most `subset` when that is set
 * (> 0); -1 when the loader does not know its length. */
static int64_t loop_len(cm_dataloader *dl, int64_t subset) {
    const int64_t n = dl ? cm_dataloader_steps_per_epoch(dl) : 0;
    if (subset > 0 && (n <= 0 || subset < n)) return subset;
    return n > 0 ? n : -1;
}

static cm_status reduce(cm_trainer *tr, double *v, int n) {
    if (!tr->dist.all_reduce_sum || n == 0) return CM_OK;
    cm_status s = tr->dist.all_reduce_sum(v, n, tr->dist.data);
    if (s) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "all-reduce of %d values over %d ranks failed: %s", n, tr->dist.world_size, msg);
    }
    return CM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Construction
 * ------------------------------------------------------------------------------------------- */

static cm_status check_loader(const char *what, cm_dataloader *dl, cm_data_mode want) {
    const cm_dataloader_config *c = cm_dataloader_get_config(dl);
    if (c->mode != want)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: the loader is in %s mode; make it with %s", what,
                            c->mode == CM_DATA_TRAIN ? "train" : "eval",
                            want == CM_DATA_EVAL ? "cm_dataloader_config_eval() (mode CM_DATA_EVAL)"
                                                 : "cm_dataloader_config_default() (mode CM_DATA_TRAIN)");
    return CM_OK;
}

static cm_status validate(const cm_trainer_config *c) {
    cm_status s;
    if (!c->model) return cm_set_error(CM_ERR_INVALID_ARG, "trainer: model is NULL (set cfg.model)");
    cm_module *root = cm_model_module(c->model);
    if (!root || !cm_module_is_finalized(root))
        return cm_set_error(CM_ERR_STATE, "trainer: the model's module tree is not finalized (call cm_module_finalize)");
    if (c->train_dataloader && (s = check_loader("train_dataloader", c->train_dataloader, CM_DATA_TRAIN))) return s;
    if (c->eval_dataloader && (s = check_loader("eval_dataloader", c->eval_dataloader, CM_DATA_EVAL))) return s;
    if (c->n_evaluators < 0 || (c->n_evaluators > 0 && !c->evaluators))
        return cm_set_error(CM_ERR_INVALID_ARG, "trainer: n_evaluators %d without an evaluators array", c->n_evaluators);
    for (int i = 0; i < c->n_evaluators; i++) {
        char what[96];
        snprintf(what, sizeof what, "evaluators[%d] ('%s')", i, c->evaluators[i].label ? c->evaluators[i].label : "eval");
        if (!c->evaluators[i].dataloader) return cm_set_error(CM_ERR_INVALID_ARG, "%s: dataloader is NULL", what);
        if ((s = check_loader(what, c->evaluators[i].dataloader, CM_DATA_EVAL))) return s;
        if ((s = check_interval(what, c->evaluators[i].eval_interval))) return s;
        if (c->evaluators[i].label && (!c->evaluators[i].label[0] || strlen(c->evaluators[i].label) >= 64 ||
                                       !strcmp(c->evaluators[i].label, "train")))
            return cm_set_error(CM_ERR_INVALID_ARG, "%s: the label must have 1 to 63 characters and not be 'train'",
                                what);
    }
    if (!time_is_zero(c->max_duration) && (s = check_duration_unit("max_duration", c->max_duration))) return s;
    if (c->max_duration.unit != CM_TIME_DURATION && c->max_duration.count < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "max_duration must not be negative");
    if ((s = check_interval("eval_interval", c->eval_interval))) return s;
    if (c->eval_subset_num_batches < -1 || c->eval_subset_num_batches == 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "eval_subset_num_batches %lld: use -1 (all) or a positive count",
                            (long long)c->eval_subset_num_batches);
    if (!(c->scale_schedule_ratio > 0) || !isfinite(c->scale_schedule_ratio))
        return cm_set_error(CM_ERR_INVALID_ARG, "scale_schedule_ratio %g must be > 0", c->scale_schedule_ratio);
    if (!time_is_zero(c->max_duration) && time_is_zero(scaled(c->max_duration, c->scale_schedule_ratio))) {
        char d[CM_TIME_STR_MAX];
        cm_time_to_string(c->max_duration, d, sizeof d);
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "scale_schedule_ratio %g scales max_duration %s to nothing: raise the ratio, or give "
                            "max_duration in a finer unit (batches or samples)",
                            c->scale_schedule_ratio, d);
    }
    if (c->n_schedulers < 0 || (c->n_schedulers > 0 && !c->schedulers))
        return cm_set_error(CM_ERR_INVALID_ARG, "trainer: n_schedulers %d without a schedulers array", c->n_schedulers);
    for (int i = 0; i < c->n_schedulers; i++) {
        if ((s = cm_sched_validate(&c->schedulers[i]))) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            return cm_set_error(s, "schedulers[%d]: %s", i, msg);
        }
    }
    if ((unsigned)c->precision >= CM_PRECISION_COUNT)
        return cm_set_error(CM_ERR_INVALID_ARG, "precision %d is not valid (fp32, amp_bf16 or amp_fp16)", (int)c->precision);
    if (c->precision == CM_PRECISION_AMP_FP16)
        return cm_set_error(CM_ERR_UNSUPPORTED, "precision amp_fp16: there are no fp16 CPU kernels here; use amp_bf16 "
                                                "(bf16 compute with f32 master weights, no loss scaling needed) or fp32");
    if (c->device_train_microbatch_size < CM_MICROBATCH_AUTO)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "device_train_microbatch_size %lld: use a positive row count, 0 (the whole batch) or "
                            "CM_MICROBATCH_AUTO", (long long)c->device_train_microbatch_size);
    if (c->dist.world_size < 1 || c->dist.rank < 0 || c->dist.rank >= c->dist.world_size)
        return cm_set_error(CM_ERR_INVALID_ARG, "dist: rank %d of world size %d is out of range", c->dist.rank,
                            c->dist.world_size);
    if (c->dist.collectives_per_microbatch && c->dist.world_size > 1 && !c->dist.all_gather)
        return cm_set_error(CM_ERR_INVALID_ARG, "dist: collectives_per_microbatch needs an all_gather hook (the ranks "
                                                "agree on the number of microbatches)");
    if (c->dist.collectives_per_microbatch && c->dist.world_size > 1 &&
        c->device_train_microbatch_size == CM_MICROBATCH_AUTO)
        return cm_set_error(CM_ERR_UNSUPPORTED,
                            "device_train_microbatch_size auto with FULL_SHARD on %d ranks: every microbatch gathers "
                            "parameters, so the ranks would have to agree on each retry, which is not supported yet "
                            "(set a microbatch size, or use SHARD_GRAD_OP)",
                            c->dist.world_size);
    if (c->dist.world_size > 1 && !c->dist.all_reduce_sum)
        return cm_set_error(CM_ERR_INVALID_ARG, "dist: world size %d needs an all_reduce_sum hook", c->dist.world_size);
    if ((c->n_algorithms && !c->algorithms) || (c->n_callbacks && !c->callbacks) || (c->n_loggers && !c->loggers) ||
        (c->n_algorithm_passes && !c->algorithm_passes) || c->n_algorithms < 0 || c->n_callbacks < 0 ||
        c->n_loggers < 0 || c->n_algorithm_passes < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "trainer: a plugin count without its array (or a negative count)");
    if (c->run_name && strlen(c->run_name) >= 128)
        return cm_set_error(CM_ERR_INVALID_ARG, "run_name is longer than 127 characters");
    return cmi_ckpt_validate(c);
}

/* max_duration × ssr in its unit (Composer scales the run's length by the ratio). */
static cm_time scaled(cm_time t, double ssr) {
    if (ssr == 1.0) return t;
    double y = (double)t.count * ssr;
    t.count = (int64_t)floor(y + 1e-9 * fmax(1.0, y));
    return t;
}

static cm_status log_hparams(cm_trainer *tr) {
    cm_state *st = &tr->st;
    char dur[CM_TIME_STR_MAX] = "", mb[32];
    if (!time_is_zero(st->max_duration)) cm_time_to_string(st->max_duration, dur, sizeof dur);
    if (tr->mb_config == CM_MICROBATCH_AUTO)
        snprintf(mb, sizeof mb, "auto");
    else
        snprintf(mb, sizeof mb, "%lld", (long long)tr->mb_config);
    cm_hparam h[] = {
        {"run_name", CM_HPARAM_STRING, 0, st->run_name},
        {"seed", CM_HPARAM_NUMBER, (double)st->seed, NULL},
        {"precision", CM_HPARAM_STRING, 0, cm_precision_name(st->precision)},
        {"device_train_microbatch_size", CM_HPARAM_STRING, 0, mb},
        {"max_duration", CM_HPARAM_STRING, 0, dur},
        {"scale_schedule_ratio", CM_HPARAM_NUMBER, st->ssr, NULL},
        {"world_size", CM_HPARAM_NUMBER, st->world_size, NULL},
        {"deterministic_mode", CM_HPARAM_BOOL, tr->deterministic, NULL},
        {"num_threads", CM_HPARAM_NUMBER, cm_num_threads(), NULL},
    };
    return cm_logger_log_hyperparameters(cm_engine_logger(tr->engine), h, (int)(sizeof h / sizeof *h));
}

static cm_status default_optimizer(cm_trainer *tr) {
    cm_module *root = cm_model_module(tr->st.model);
    int n = cm_module_n_units(root);
    cm_optim_span *spans = cm_alloc_zeroed(sizeof *spans * (size_t)(n > 0 ? n : 1), 16);
    if (!spans) return CM_ERR_OOM;
    /* under a sharded strategy the optimizer holds this rank's pieces only */
    const cm_shard_span *sh = tr->dist.n_shard_spans == n ? tr->dist.shard_spans : NULL;
    for (int i = 0; i < n; i++) {
        const cm_unit_info *u = cm_module_unit(root, i);
        spans[i] = sh ? (cm_optim_span){u->name, sh[i].params, sh[i].grads, sh[i].end - sh[i].begin}
                      : (cm_optim_span){u->name, u->params, u->grads, u->numel};
    }
    cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_DECOUPLED_SGDW);
    hp.lr = 0.1;
    cm_status s = cm_optim_new(CM_OPTIM_DECOUPLED_SGDW, &tr->own_optim);
    if (!s) s = cm_optim_add_group(tr->own_optim, &hp, spans, n);
    cm_free(spans);
    return s;
}

/* The dropout generators of the (locked, so stable) module tree. */
static bool count_dropout(cm_module *m, const char *path, int depth, void *data) {
    if (cm_nn_dropout_rng(m)) (*(int *)data)++;
    return true;
}
typedef struct {
    cm_trainer *tr;
    int k;
} drop_collect;
static bool take_dropout(cm_module *m, const char *path, int depth, void *data) {
    drop_collect *c = data;
    cm_rng *r = cm_nn_dropout_rng(m);
    if (r && c->k < c->tr->n_drop) c->tr->drop_rngs[c->k++] = r;
    return true;
}
static cm_status collect_dropout(cm_trainer *tr, cm_module *root) {
    int n = 0;
    cm_module_visit(root, count_dropout, &n);
    if (!n) return CM_OK;
    tr->drop_rngs = cm_alloc_zeroed(sizeof *tr->drop_rngs * (size_t)n, 16);
    tr->drop_base = cm_alloc_zeroed(sizeof *tr->drop_base * (size_t)n, 16);
    if (!tr->drop_rngs || !tr->drop_base) return cm_set_error(CM_ERR_OOM, "cm_trainer_new: out of memory");
    tr->n_drop = n;
    drop_collect c = {tr, 0};
    cm_module_visit(root, take_dropout, &c);
    return CM_OK;
}

cm_status cm_trainer_new(const cm_trainer_config *cfg, cm_trainer **out) {
    if (!cfg || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_trainer_new: NULL %s", cfg ? "out" : "config");
    *out = NULL;
    cm_status s = validate(cfg);
    if (s) return s;
    for (int i = 0; i < cfg->n_algorithms; i++) {
        const cm_algorithm_i *vt = cfg->algorithms[i].vt;
        if (!vt || vt->abi != CM_ALGORITHM_ABI || !vt->name || !vt->match || !vt->apply)
            return cm_set_error(CM_ERR_INVALID_ARG, "algorithms[%d]: bad vtable (abi %d, name, match, apply needed)", i,
                                CM_ALGORITHM_ABI);
    }
    for (int i = 0; i < cfg->n_callbacks; i++) {
        const cm_callback_i *vt = cfg->callbacks[i].vt;
        if (!vt || vt->abi != CM_CALLBACK_ABI || !vt->name || !vt->run_event)
            return cm_set_error(CM_ERR_INVALID_ARG, "callbacks[%d]: bad vtable (abi %d, name, run_event needed)", i,
                                CM_CALLBACK_ABI);
    }
    for (int i = 0; i < cfg->n_loggers; i++) {
        const cm_logger_i *vt = cfg->loggers[i].vt;
        if (!vt || vt->abi != CM_LOGGER_ABI || !vt->name || !vt->log_metrics)
            return cm_set_error(CM_ERR_INVALID_ARG, "loggers[%d]: bad vtable (abi %d, name, log_metrics needed)", i,
                                CM_LOGGER_ABI);
    }

    cm_trainer *tr = cm_alloc_zeroed(sizeof *tr, 64);
    if (!tr) return CM_ERR_OOM;
    cm_state *st = &tr->st;
    st->world_size = cfg->dist.world_size;
    st->rank = cfg->dist.rank;
    st->seed = cfg->seed;
    st->progress_bar = cfg->progress_bar;
    if (cfg->run_name) {
        snprintf(st->run_name, sizeof st->run_name, "%s", cfg->run_name);
    } else {
        /* Composer-style "<unix time>-<adjective>-<animal>". The entropy must agree across the
         * ranks of one job (they share the launcher as parent) and differ between jobs started in
         * the same second (so their run folders never clash). */
        const bool launched = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
        uint64_t ent[2] = {(uint64_t)(launched ? getppid() : getpid()), cfg->seed};
        cm_run_name_generate((int64_t)time(NULL), cm_hash64(ent, sizeof ent, 0x52554e), st->run_name,
                             sizeof st->run_name);
    }
    st->model = cfg->model;
    st->ssr = cfg->scale_schedule_ratio;
    st->lr_multiplier = 1.0;
    st->lr_override = NAN;
    st->total_loss = NAN;
    st->train_dl = cfg->train_dataloader;
    st->batches_per_epoch = cfg->train_dataloader ? cm_dataloader_steps_per_epoch(cfg->train_dataloader) : 0;
    st->max_duration = time_is_zero(cfg->max_duration) ? cfg->max_duration : scaled(cfg->max_duration, st->ssr);
    st->precision = cfg->precision;
    st->microbatch_size = cfg->device_train_microbatch_size > 0 ? cfg->device_train_microbatch_size : 0;
    tr->mb_config = cfg->device_train_microbatch_size;
    st->microbatch_auto = tr->mb_config == CM_MICROBATCH_AUTO;
    tr->plan_memory = cfg->plan_memory;
    tr->tokens_weighting = cfg->accumulate_train_batch_on_tokens;
    tr->deterministic = cfg->deterministic_mode;
    tr->n_threads = cm_num_threads();
    tr->dist = cfg->dist;
    st->dist = &tr->dist;
    tr->last_eval_batch = -1;
    st->event = CM_EVENT_COUNT;
    st->trainer = tr;

    /* evaluators: eval_dataloader first (label "eval"), then the list */
    tr->n_evals = (cfg->eval_dataloader ? 1 : 0) + cfg->n_evaluators;
    st->n_metric_sets = 1 + tr->n_evals;
    tr->evals = cm_alloc_zeroed(sizeof *tr->evals * (size_t)(tr->n_evals + 1), 16);
    st->metric_sets = cm_alloc_zeroed(sizeof *st->metric_sets * (size_t)st->n_metric_sets, 16);
    if (!tr->evals || !st->metric_sets) goto oom;
    for (int i = 0, k = 0; i < tr->n_evals; i++) {
        evaluator_rt *e = &tr->evals[i];
        cm_evaluator ev = cm_evaluator_default();
        if (cfg->eval_dataloader && i == 0)
            ev.dataloader = cfg->eval_dataloader;
        else
            ev = cfg->evaluators[k++];
        snprintf(e->label, sizeof e->label, "%s", ev.label ? ev.label : "eval");
        for (int j = 0; j < i; j++)
            if (!strcmp(tr->evals[j].label, e->label)) {
                s = cm_set_error(CM_ERR_INVALID_ARG, "evaluator label '%s' is used twice (metrics would mix)", e->label);
                goto fail;
            }
        e->dl = ev.dataloader;
        e->subset = ev.subset_num_batches > 0 ? ev.subset_num_batches : cfg->eval_subset_num_batches;
        e->interval = time_is_zero(ev.eval_interval) ? cfg->eval_interval : ev.eval_interval;
        e->set = i + 1;
    }
    if ((s = train_metrics_init(&st->metric_sets[0], st->model, "train", cfg->compute_training_metrics))) goto fail;
    for (int i = 0; i < tr->n_evals; i++)
        if ((s = cmi_metric_set_init(&st->metric_sets[i + 1], st->model, false, tr->evals[i].label))) goto fail;
    if (cfg->n_schedulers) {
        st->schedulers = cm_alloc(sizeof *st->schedulers * (size_t)cfg->n_schedulers, 16);
        if (!st->schedulers) goto oom;
        memcpy(st->schedulers, cfg->schedulers, sizeof *st->schedulers * (size_t)cfg->n_schedulers);
        st->n_schedulers = cfg->n_schedulers;
    }

    /* the device: checked now; the model moves there after the INIT surgery and before the
     * optimizer is made over its buffers */
    tr->device = cfg->device;
    if (cfg->device != CM_DEVICE_CPU) {
        cm_module *mroot = cm_model_module(st->model);
        if ((s = cm_device_check(cfg->device))) goto fail;
        if (cm_module_device(mroot) != cfg->device) {
            if (cfg->optimizer) {
                s = cm_set_error(CM_ERR_INVALID_ARG,
                                 "device %s: the model is on %s and an optimizer was passed in, made over its %s "
                                 "buffers; move the model first (cm_module_to_device) and make the optimizer after",
                                 cm_device_name(cfg->device), cm_device_name(cm_module_device(mroot)),
                                 cm_device_name(cm_module_device(mroot)));
                goto fail;
            }
            /* moved after INIT: surgery re-packs the model's buffers on the CPU */
        }
    }
    cm_tape_config tc = cm_tape_config_default();
    tc.arena_budget = cfg->arena_budget;
    tc.device_budget = cfg->device_arena_budget;
    if ((s = cm_tape_new(&tc, &tr->tape))) goto fail;
    if (cfg->device != CM_DEVICE_CPU && (s = cm_tape_set_device(tr->tape, cfg->device))) goto fail;
    st->tape = tr->tape;
    cm_tape_set_autocast(tr->tape, st->precision == CM_PRECISION_AMP_BF16 ? CM_DTYPE_BF16 : CM_DTYPE_F32);
    if (cfg->dist.fetch) cm_tape_set_fetch_hook(tr->tape, cfg->dist.fetch, cfg->dist.data);
    if (cfg->train_dataloader && (s = cm_data_spec_new(cfg->train_dataloader, &cfg->train_data_spec, &tr->spec)))
        goto fail;
    if ((s = cmi_ckpt_new(tr, cfg))) goto fail;
    cm_module *root = cm_model_module(st->model);
    /* the trainer's own optimizer is made after the INIT surgery (below); a given one is visible
     * on INIT */
    st->optimizer = cfg->optimizer;

    if ((s = cm_engine_new(st, &tr->engine))) goto fail;
    for (int i = 0; i < cfg->n_algorithm_passes; i++)
        if ((s = cm_engine_add_ordering_pass(tr->engine, cfg->algorithm_passes[i], -1))) goto fail;
    for (int i = 0; i < cfg->n_loggers; i++)
        if ((s = cm_engine_add_logger(tr->engine, cfg->loggers[i]))) goto release;
    for (int i = 0; i < cfg->n_callbacks; i++)
        if ((s = cm_engine_add_callback(tr->engine, cfg->callbacks[i]))) goto release;
    for (int i = 0; i < cfg->n_algorithms; i++)
        if ((s = cm_engine_add_algorithm(tr->engine, cfg->algorithms[i]))) goto release;
    tr->n_user_algs = cfg->n_algorithms;
    st->dl = st->train_dl;
    st->dl_len = loop_len(st->train_dl, -1);
    snprintf(st->dl_label, sizeof st->dl_label, "train");
    /* INIT (model surgery), then the surgery the checkpoint to load requires — all before the
     * optimizer and the lock, so re-packing the flat buffers is safe */
    const uint64_t layout = cm_module_layout_version(root);
    st->model_settable = true;
    if ((s = run(tr, CM_EVENT_INIT)) || (s = log_hparams(tr)) || (s = run(tr, CM_EVENT_BEFORE_LOAD)) ||
        (s = cmi_ckpt_prepare_load(tr)))
        goto release;
    st->model_settable = false;
    if (st->model != cfg->model) { /* an algorithm replaced the model (NoOpModel): its metrics and root */
        if (cfg->optimizer) {
            s = cm_set_error(CM_ERR_STATE, "an algorithm replaced the model on INIT, but the optimizer in the config was "
                                           "made over the old model's parameters: leave optimizer NULL for the "
                                           "trainer's own");
            goto release;
        }
        for (int i = 0; i < st->n_metric_sets; i++) {
            char label[64];
            snprintf(label, sizeof label, "%s", st->metric_sets[i].label);
            const bool off = st->metric_sets[i].off;
            cmi_metric_set_deinit(&st->metric_sets[i]);
            s = i == 0 ? train_metrics_init(&st->metric_sets[i], st->model, label, !off)
                       : cmi_metric_set_init(&st->metric_sets[i], st->model, false, label);
            if (s) goto release;
        }
        root = cm_model_module(st->model);
    }
    if (cfg->optimizer && cm_module_layout_version(root) != layout) {
        char names[256] = "";
        for (int i = 0; i < cm_engine_n_algorithms(tr->engine); i++) {
            cm_algorithm *a = cm_engine_algorithm(tr->engine, i);
            if (!cm_algorithm_info_of(cm_algorithm_vtable(a))) continue;
            size_t l = strlen(names);
            snprintf(names + l, sizeof names - l, "%s%s", l ? ", " : "", cm_algorithm_name(a));
        }
        s = cm_set_error(CM_ERR_STATE,
                         "model surgery on INIT (%s) re-packed the model's parameters, but the optimizer in the "
                         "config was made over the old ones: call cm_trainer_prepare_model(&cfg) before making the "
                         "optimizer (and data parallelism), or leave optimizer NULL for the trainer's own",
                         names[0] ? names : "the algorithms");
        goto release;
    }
    if (cfg->device != CM_DEVICE_CPU && cm_module_device(root) != cfg->device &&
        (s = cm_module_to_device(root, cfg->device)))
        goto release;
    if (!cfg->optimizer) {
        if ((s = default_optimizer(tr))) goto release;
        st->optimizer = tr->own_optim;
    }
    if ((s = cm_module_lock(root))) goto release;
    tr->locked = true;
    if ((s = collect_dropout(tr, root))) goto release;
    cm_module_set_seed(root, st->seed);
    if ((s = cmi_ckpt_load_start(tr)) || (s = run(tr, CM_EVENT_AFTER_LOAD))) goto release;
    *out = tr;
    return CM_OK;

oom:
    s = cm_set_error(CM_ERR_OOM, "cm_trainer_new: out of memory");
    goto fail;
release: {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", cm_last_error());
    /* the algorithms the trainer made (required on load) are its own; the config's go back */
    if (cm_engine_n_algorithms(tr->engine) > cfg->n_algorithms)
        cmi_engine_pop_algorithms(tr->engine, cm_engine_n_algorithms(tr->engine) - cfg->n_algorithms);
    cmi_engine_release(tr->engine);
    cm_set_error(s, "%s", msg);
}
fail:
    tr->closed = true;
    {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        cm_trainer_free(tr);
        cm_set_error(s, "%s", msg);
    }
    return s;
}

cm_status cm_trainer_close(cm_trainer *tr) {
    if (!tr) return cm_set_error(CM_ERR_INVALID_ARG, "cm_trainer_close: trainer is NULL");
    if (tr->closed) return CM_OK;
    tr->closed = true;
    char msg[1536];
    cm_status w = cmi_ckpt_finish(tr, false); /* the background save and the uploads */
    if (w) snprintf(msg, sizeof msg, "%s", cm_last_error());
    cm_status s = tr->engine ? cm_engine_close(tr->engine) : CM_OK;
    return w ? cm_set_error(w, "%s", msg) : s;
}

void cm_trainer_free(cm_trainer *tr) {
    if (!tr) return;
    if (!tr->closed && cm_trainer_close(tr) != CM_OK)
        cm_log_msg(CM_LOG_WARN, "trainer: closing: %s", cm_last_error());
    cmi_ckpt_free(tr);
    /* unlock first: a model an algorithm put in the state (NoOpModel) goes with the plugins */
    if (tr->locked) cm_module_unlock(cm_model_module(tr->st.model));
    tr->locked = false;
    cm_engine_free(tr->engine);
    cm_optim_free(tr->own_optim);
    cm_data_spec_free(tr->spec);
    cm_tape_free(tr->tape);
    for (int f = 0; tr->has_phantom && f < tr->phantom.n_fields; f++) cm_tensor_free(tr->phantom.fields[f]);
    cm_free(tr->drop_rngs);
    cm_free(tr->drop_base);
    cm_free(tr->mb_counts);
    cm_free(tr->count_buf);
    for (int i = 0; tr->st.metric_sets && i < tr->st.n_metric_sets; i++) cmi_metric_set_deinit(&tr->st.metric_sets[i]);
    cm_free(tr->st.metric_sets);
    cm_free(tr->st.schedulers);
    cm_free(tr->evals);
    cm_free(tr);
}

cm_state *cm_trainer_state(cm_trainer *tr) { return tr ? &tr->st : NULL; }
cm_engine *cm_trainer_engine(cm_trainer *tr) { return tr ? tr->engine : NULL; }
cm_logger *cm_trainer_logger(cm_trainer *tr) { return tr ? cm_engine_logger(tr->engine) : NULL; }

static cm_status check_usable(cm_trainer *tr, const char *what) {
    if (!tr) return cm_set_error(CM_ERR_INVALID_ARG, "%s: trainer is NULL", what);
    if (tr->closed) return cm_set_error(CM_ERR_STATE, "%s: the trainer is closed (make a new one)", what);
    if (tr->deterministic && cm_num_threads() != tr->n_threads)
        return cm_set_error(CM_ERR_STATE,
                            "%s: deterministic_mode: the thread count changed from %d to %d since the trainer was "
                            "made, which may change results in the last bits; restore it or turn deterministic_mode off",
                            what, tr->n_threads, cm_num_threads());
    return CM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Metrics
 * ------------------------------------------------------------------------------------------- */

/* A built-in cross-entropy or accuracy metric of logits on a GPU, computed there: cross-entropy
 * as the fused loss summed on the device, accuracy from the rows' argmax read back (8 bytes a row),
 * so the logits never cross to the host (GPT-2's are 1.6 GB a batch; a masked-LM head's n × 30522).
 * The targets are counted on the host (the batch as the microbatch started is there). Sparse
 * metrics take the non-ignored targets in row-major order as the logits' rows. *done false
 * (nothing added) for another metric or shapes other than (..., C) logits with (...) integer
 * targets (or (n, C) with n such targets); the host path then handles it and names the problem. */
static cm_status metric_on_device(cm_tape *tp, const cm_metric *mt, cm_tensor *outputs, const cm_model_batch *b,
                                  double *state, bool *done) {
    *done = false;
    const char *field;
    bool sparse;
    const cmi_metric_kind kind = cmi_metric_kind_of(mt, &field, &sparse);
    cm_tensor *tgt = kind != CMI_METRIC_OTHER ? cm_model_batch_field(b, field) : NULL;
    const int nd = cm_tensor_ndim(outputs);
    if (!tgt || cm_tensor_dtype(outputs) != CM_DTYPE_F32 || nd < 2 || cm_tensor_dtype(tgt) == CM_DTYPE_F32 ||
        cm_tensor_dtype(tgt) == CM_DTYPE_BF16 || cm_tensor_dtype(tgt) == CM_DTYPE_F16)
        return CM_OK;
    sparse = sparse && nd == 2 && cm_tensor_ndim(tgt) >= 2; /* else the sparse metric takes dense logits */
    if (!sparse) {
        if (cm_tensor_ndim(tgt) != nd - 1) return CM_OK;
        for (int i = 0; i < nd - 1; i++)
            if (cm_tensor_dim(tgt, i) != cm_tensor_dim(outputs, i)) return CM_OK;
    }
    const int64_t C = cm_tensor_dim(outputs, -1), rows = cm_tensor_numel(outputs) / (C ? C : 1);
    const bool prev = cm_tape_set_grad_enabled(tp, false);
    cm_tensor *ht = cm_tensor_device(tgt) == CM_DEVICE_CPU ? tgt : cm_to_device(tp, tgt, CM_DEVICE_CPU);
    cm_tensor *t1 = NULL; /* the targets of the logits' rows, (rows) on the host */
    if (ht && sparse) {
        if (cmi_labelled(ht, NULL, NULL) != rows) { /* the host path names the mismatch */
            cm_tape_set_grad_enabled(tp, prev);
            return CM_OK;
        }
        const int64_t n[1] = {rows};
        if ((t1 = cm_empty_on(tp, CM_DEVICE_CPU, CM_DTYPE_I64, 1, n))) cmi_labelled(ht, NULL, cm_tensor_data(t1));
    } else if (ht) {
        const int64_t n[1] = {rows};
        t1 = cm_reshape(tp, cm_tensor_is_contiguous(ht) ? ht : cm_contiguous(tp, ht), 1, n);
    }
    cm_tensor *sum = NULL, *x = NULL;
    const int64_t flat[2] = {rows, C};
    if (t1 && rows > 0) {
        x = cm_reshape(tp, cm_tensor_is_contiguous(outputs) ? outputs : cm_contiguous(tp, outputs), 2, flat);
        if (kind == CMI_METRIC_CE) {
            cm_cross_entropy_opts o = cm_cross_entropy_opts_default();
            o.reduction = CM_REDUCTION_SUM;
            sum = cm_cross_entropy(tp, x, cm_to_device(tp, t1, cm_tensor_device(outputs)), &o);
        }
    }
    cm_tape_set_grad_enabled(tp, prev);
    if (cm_tape_status(tp)) return cm_set_error(cm_tape_status(tp), "metrics: %s: %s", mt->vt->name, cm_tape_error(tp));
    int64_t counted = 0, correct = 0;
    int64_t *pred = NULL;
    if (kind == CMI_METRIC_ACC && rows > 0) {
        if (!(pred = cm_alloc(sizeof(int64_t) * (size_t)rows, 16)))
            return cm_set_error(CM_ERR_OOM, "metrics: %s: out of memory", mt->vt->name);
        cm_status s = cmi_argmax_last(tp, x, pred);
        if (s) {
            cm_free(pred);
            char msg[512];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            return cm_set_error(s, "metrics: %s: %s", mt->vt->name, msg);
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        const int64_t y = (int64_t)cm_tensor_get_flat(t1, r);
        if (y == -100) continue;
        if (y < 0 || y >= C) { /* the host path reports it */
            cm_free(pred);
            return CM_OK;
        }
        counted++;
        if (pred) correct += pred[r] == y;
    }
    cm_free(pred);
    if (kind == CMI_METRIC_CE) {
        const int64_t i0[1] = {0};
        state[0] += !sum ? 0.0 : cm_tensor_ndim(sum) ? cm_tensor_get(sum, i0) : cm_tensor_get_flat(sum, 0);
    } else {
        state[0] += (double)correct;
    }
    state[1] += (double)counted;
    *done = true;
    return CM_OK;
}

/* The metrics read outputs and targets on the host: on a GPU they are copied back first (on the
 * tape, freed with it) — except the built-in cross-entropy and accuracy metrics, computed on the
 * device. */
static cm_status metrics_update(cm_tape *tp, cm_metric_set *ms, cm_tensor *outputs, const cm_model_batch *b) {
    const bool on_gpu = outputs && cm_tensor_device(outputs) != CM_DEVICE_CPU;
    cm_tensor *host_out = NULL, *host_fields[CM_DATASET_MAX_FIELDS];
    cm_model_batch hb;
    for (int i = 0; i < ms->n; i++) {
        double *state = ms->sums + i * CM_METRIC_MAX_STATE;
        cm_status s;
        if (on_gpu) {
            bool done;
            if ((s = metric_on_device(tp, &ms->metrics[i], outputs, b, state, &done))) return s;
            if (done) continue;
            if (!host_out) { /* the first metric that reads the host: copy once */
                const bool prev = cm_tape_set_grad_enabled(tp, false);
                host_out = cm_to_device(tp, outputs, CM_DEVICE_CPU);
                for (int f = 0; f < b->n && f < CM_DATASET_MAX_FIELDS; f++)
                    host_fields[f] = b->fields[f] ? cm_to_device(tp, b->fields[f], CM_DEVICE_CPU) : NULL;
                cm_tape_set_grad_enabled(tp, prev);
                if (cm_tape_status(tp)) return cm_set_error(cm_tape_status(tp), "metrics: %s", cm_tape_error(tp));
                hb = *b;
                hb.fields = host_fields;
            }
        }
        if ((s = cm_metric_update(&ms->metrics[i], on_gpu ? host_out : outputs, on_gpu ? &hb : b, state))) return s;
    }
    return CM_OK;
}

/* Reduces the sums over ranks, computes the values and logs metrics/<label>/<Name>. */
static cm_status metrics_finish(cm_trainer *tr, cm_metric_set *ms) {
    if (!ms->n) return CM_OK;
    cm_status s = reduce(tr, ms->sums, ms->n * CM_METRIC_MAX_STATE);
    if (s) return s;
    cm_metric_value vals[16];
    char names[16][128];
    int k = 0;
    for (int i = 0; i < ms->n; i++) {
        ms->values[i] = cm_metric_compute(&ms->metrics[i], ms->sums + i * CM_METRIC_MAX_STATE);
        if (k == 16) {
            if ((s = cm_logger_log_metrics(cm_engine_logger(tr->engine), vals, k))) return s;
            k = 0;
        }
        snprintf(names[k], sizeof names[k], "metrics/%s/%s", ms->label, ms->metrics[i].vt->name);
        vals[k] = (cm_metric_value){names[k], ms->values[i]};
        k++;
    }
    ms->computed = true;
    return cm_logger_log_metrics(cm_engine_logger(tr->engine), vals, k);
}

/* ---------------------------------------------------------------------------------------------
 * One training batch
 * ------------------------------------------------------------------------------------------- */

static cm_status model_error(cm_trainer *tr, const char *where) {
    const cm_timestamp *ts = &tr->st.ts;
    const char *msg = cm_tape_status(tr->tape) ? cm_tape_error(tr->tape) : cm_last_error();
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", msg);
    cm_status s = cm_tape_status(tr->tape) ? cm_tape_status(tr->tape) : cm_last_status();
    if (!s) s = CM_ERR_INTERNAL;
    return cm_set_error(s, "%s (epoch %lld, batch %lld, microbatch %lld of %lld): %s", where, (long long)ts->epoch,
                        (long long)ts->batch_in_epoch, (long long)tr->st.microbatch_index + 1,
                        (long long)tr->st.n_microbatches, buf);
}

/* ---- phantom microbatches (FULL_SHARD) ----
 * Every forward and backward under FULL_SHARD gathers parameters, so every rank must run as many
 * microbatches as the rank with the most. A rank short of them runs phantoms: one row (the
 * batch's first, or the train dataset's sample 0 when its slice is empty) forward and backward in
 * eval mode with an upstream gradient of 0. They issue the same gathers as a real microbatch and
 * change nothing: no events, no metrics, no loss, gradients += 0, no dropout or batch-norm
 * statistics. */

static cm_status phantom_from_dataset(cm_trainer *tr) {
    if (tr->has_phantom) return CM_OK;
    const cm_dataset *ds = tr->st.train_dl ? cm_dataloader_dataset(tr->st.train_dl) : NULL;
    if (!ds || cm_dataset_len(ds) < 1)
        return cm_set_error(CM_ERR_STATE, "FULL_SHARD: this rank's slice of the batch is empty and the train dataset "
                                          "has no sample to run a phantom microbatch on");
    cm_batch *pb = &tr->phantom;
    memset(pb, 0, sizeof *pb);
    pb->n_fields = cm_dataset_n_fields(ds);
    void *out[CM_DATASET_MAX_FIELDS];
    for (int f = 0; f < pb->n_fields; f++) {
        const cm_field_desc *fd = cm_dataset_field(ds, f);
        int64_t shape[CM_MAX_DIMS + 1] = {1};
        memcpy(shape + 1, fd->shape, sizeof(int64_t) * (size_t)fd->ndim);
        cm_status s = cm_tensor_new(fd->dtype, fd->ndim + 1, shape, &pb->fields[f]);
        if (s) {
            for (int g = 0; g < f; g++) cm_tensor_free(pb->fields[g]);
            return s;
        }
        pb->names[f] = fd->name;
        out[f] = cm_tensor_data(pb->fields[f]);
    }
    static const uint8_t k_invalid = 0;
    static const int64_t k_no_index = -1, k_no_tokens = 0;
    pb->n_rows = 1, pb->n_padded = 1, pb->valid = &k_invalid, pb->indices = &k_no_index, pb->row_tokens = &k_no_tokens;
    pb->microbatch = -1;
    const cm_sample_ctx ctx = {tr->st.seed, 0, false};
    cm_status s = cm_dataset_get(ds, 0, &ctx, out);
    if (s) {
        for (int f = 0; f < pb->n_fields; f++) cm_tensor_free(pb->fields[f]);
        return s;
    }
    tr->has_phantom = true;
    return CM_OK;
}

static cm_status model_error(cm_trainer *tr, const char *where);

/* On a GPU: the model batch's fields become copies on the device, on the tape (freed with it; the
 * cm_batch keeps the host tensors). False on failure, with the tape's error. */
static bool batch_to_device(cm_trainer *tr) {
    cm_state *st = &tr->st;
    if (tr->device == CM_DEVICE_CPU) return true;
    const bool prev = cm_tape_set_grad_enabled(tr->tape, false);
    for (int i = 0; i < st->mbatch.n; i++)
        if (st->mb_fields[i]) st->mb_fields[i] = cm_to_device(tr->tape, st->mb_fields[i], tr->device);
    cm_tape_set_grad_enabled(tr->tape, prev);
    return cm_tape_status(tr->tape) == CM_OK;
}

static cm_status run_phantom(cm_trainer *tr, cm_batch *b, int64_t index) {
    cm_state *st = &tr->st;
    cm_module *root = cm_model_module(st->model);
    cm_batch *pb;
    int64_t n1;
    cm_status s;
    if (b->n_rows > 0) {
        if ((s = cm_data_spec_split(tr->spec, b, 1, &pb, &n1))) return s;
    } else {
        if ((s = phantom_from_dataset(tr))) return s;
        pb = &tr->phantom;
    }
    st->microbatch_index = index;
    cmi_state_set_batch(st, pb, 0, 0);
    if (!batch_to_device(tr)) return model_error(tr, "fit (phantom microbatch)");
    cm_module_train(root, false);
    cm_tensor *out = cm_model_forward(st->model, tr->tape, &st->mbatch);
    cm_tensor *loss = out ? cm_model_loss(st->model, tr->tape, out, &st->mbatch) : NULL;
    cm_tensor *g = loss ? cm_full(tr->tape, CM_DTYPE_F32, cm_tensor_ndim(loss), cm_tensor_shape(loss), 0.0) : NULL;
    s = g ? cm_tape_backward_with(tr->tape, loss, g) : CM_ERR_INTERNAL;
    cm_module_train(root, true);
    if (s) return model_error(tr, "fit (phantom microbatch)");
    cm_tape_reset(tr->tape);
    st->outputs = st->loss = NULL;
    return CM_OK;
}

/* The number of microbatches every rank runs: the most any rank has (FULL_SHARD), else n_mb. */
static cm_status agree_microbatches(cm_trainer *tr, int64_t n_mb, int64_t *n_total) {
    *n_total = n_mb;
    if (!tr->dist.collectives_per_microbatch || tr->dist.world_size <= 1) return CM_OK;
    if (!tr->mb_counts && !(tr->mb_counts = cm_alloc(sizeof(int64_t) * (size_t)tr->dist.world_size, 16)))
        return cm_set_error(CM_ERR_OOM, "fit: out of memory");
    cm_status s = tr->dist.all_gather(&n_mb, tr->mb_counts, (int64_t)sizeof n_mb, tr->dist.data);
    for (int r = 0; !s && r < tr->dist.world_size; r++)
        if (tr->mb_counts[r] > *n_total) *n_total = tr->mb_counts[r];
    return s;
}

double cmi_loss_tokens(const cm_trainer *tr, const cm_batch *b) {
    const int64_t n = cm_data_spec_n_loss_tokens(tr->spec, b);
    return (double)(n >= 0 ? n : cm_data_spec_n_tokens(tr->spec, b));
}

/* One real microbatch: forward, loss, metrics, backward of loss × its share of the global batch.
 * *oom is set when the tape ran out of its arena budget. */
cm_status cmi_run_one(cm_trainer *tr, cm_batch *mb, int64_t i, int64_t first_row, double global_w, bool *oom,
                      double *loss_sum) {
    cm_state *st = &tr->st;
    cm_status s;
    st->microbatch_index = i;
    /* dropout: this microbatch's rows are global rows [first_row, first_row + n) of the batch,
     * and every microbatch draws from the batch's starting counters */
    for (int k = 0; k < tr->n_drop; k++) tr->drop_rngs[k]->counter = tr->drop_base[k];
    cm_tape_set_rows(tr->tape, first_row, mb->n_rows, mb->global_n_samples);
    int64_t ns = cm_data_spec_n_samples(tr->spec, mb), nt = cm_data_spec_n_tokens(tr->spec, mb);
    const int64_t nl = cm_data_spec_n_loss_tokens(tr->spec, mb);
    cmi_state_set_batch(st, mb, ns, nt);
    /* Training metrics see the microbatch as it was before the algorithms of this microbatch
     * changed its fields (MixUp's mixed targets, LabelSmoothing's smoothed ones), as Composer's
     * metrics see the batch copied at the start of the microbatch. */
    cm_tensor *orig[CM_DATASET_MAX_FIELDS];
    memcpy(orig, st->mb_fields, sizeof(cm_tensor *) * (size_t)mb->n_fields);
    if ((s = run(tr, CM_EVENT_BEFORE_FORWARD))) return s; /* plugins see the batch on the host */
    if (!batch_to_device(tr)) goto tape_fail;
    cm_tensor *out = cm_model_forward(st->model, tr->tape, &st->mbatch);
    if (!out) goto tape_fail;
    st->outputs = out;
    if ((s = run(tr, CM_EVENT_AFTER_FORWARD)) || (s = run(tr, CM_EVENT_BEFORE_LOSS))) return s;
    cm_tensor *loss = cm_model_loss(st->model, tr->tape, st->outputs, &st->mbatch);
    if (!loss) goto tape_fail;
    st->loss = loss;
    if ((s = run(tr, CM_EVENT_AFTER_LOSS))) return s;
    if (tr->record_pass && (!tr->dry || tr->probing) && st->metric_sets[0].n && st->outputs) {
        const cm_model_batch mb0 = {st->mb_names, orig, st->mbatch.n, st->mbatch.n_samples, st->mbatch.n_tokens};
        if ((s = metrics_update(tr->tape, &st->metric_sets[0], st->outputs, &mb0))) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            return cm_set_error(s, "train metrics (epoch %lld, batch %lld): %s", (long long)st->ts.epoch,
                                (long long)st->ts.batch_in_epoch, msg);
        }
    }
    if ((s = run(tr, CM_EVENT_BEFORE_BACKWARD))) return s;
    if (!st->loss || cm_tensor_numel(st->loss) != 1 || cm_tensor_dtype(st->loss) != CM_DTYPE_F32)
        return cm_set_error(CM_ERR_STATE, "fit: the loss set by a plugin must be an f32 scalar on the state's tape");
    /* This microbatch's share of the global batch: gradients then add up to the full batch's. */
    const double share = (tr->tokens_weighting ? (double)(nl >= 0 ? nl : nt) : (double)ns) / global_w;
    cm_tensor *g = cm_full(tr->tape, CM_DTYPE_F32, cm_tensor_ndim(st->loss), cm_tensor_shape(st->loss), share);
    if (!g || cm_tape_backward_with(tr->tape, st->loss, g) != CM_OK) goto tape_fail;
    /* A microbatch with no loss-generating token (a masked-LM microbatch in which nothing was
     * masked) has a NaN mean loss (0/0, as torch) and a zero gradient: it adds nothing to the
     * batch loss either. Weighted by samples it still holds a share, so the batch's loss and
     * gradient are that share smaller; said once, with the key that weights by labelled tokens. */
    if (nl == 0 && share != 0.0 && !tr->warned_no_loss_tokens) {
        tr->warned_no_loss_tokens = true;
        cm_log_msg(CM_LOG_WARN,
                   "trainer: microbatch %lld of batch %lld has no token to compute a loss on (every label is -100): "
                   "it adds nothing to the loss or the gradient, yet weighted by samples it holds %.3g of the "
                   "batch; accumulate_train_batch_on_tokens: true weights microbatches by their labelled tokens "
                   "(then microbatched equals the full batch). Said once.",
                   (long long)i, (long long)st->ts.batch_in_epoch, share);
    }
    if (tr->record_pass && share != 0.0 && nl != 0) *loss_sum += share * cm_tensor_get_flat(st->loss, 0);
    if ((s = run(tr, CM_EVENT_AFTER_BACKWARD))) return s;
    cm_tape_reset(tr->tape);
    st->outputs = st->loss = NULL;
    /* the tape's copies (a GPU's, a plugin's) went with it: later readers of the model batch
     * (SpeedMonitor's FLOPs at BATCH_END) see the microbatch's own tensors */
    memcpy(st->mb_fields, orig, sizeof(cm_tensor *) * (size_t)mb->n_fields);
    return CM_OK;
tape_fail:
    if (cm_tape_status(tr->tape) == CM_ERR_OOM) *oom = true;
    return model_error(tr, "fit");
}

/* Runs the microbatches of batch b with the current microbatch size (then the phantoms this rank
 * owes, see above); *oom is set when the tape ran out of its arena budget (the caller may retry
 * with a smaller size). */
static cm_status run_microbatches(cm_trainer *tr, cm_batch *b, int64_t mbsz, double global_w, bool *oom,
                                  double *loss_sum) {
    cm_state *st = &tr->st;
    cm_module *root = cm_model_module(st->model);
    *oom = false;
    *loss_sum = 0;
    cm_status s;
    if (tr->dist.zero_grad) {
        if ((s = tr->dist.zero_grad(st, tr->dist.data))) return s;
    } else {
        cm_module_zero_grad(root);
    }
    if (tr->record_pass) cmi_metric_set_reset(&st->metric_sets[0]);
    cm_tape_reset(tr->tape);
    cm_batch *mbs;
    int64_t n_mb, n_total;
    s = cm_data_spec_split(tr->spec, b, mbsz, &mbs, &n_mb);
    if (s || (s = agree_microbatches(tr, n_mb, &n_total))) return s;
    st->n_microbatches = n_total;
    for (int64_t i = 0, row = b->rank_offset; i < n_mb; row += mbs[i].n_rows, i++)
        if ((s = cmi_run_one(tr, &mbs[i], i, row, global_w, oom, loss_sum))) {
            cm_tape_set_rows(tr->tape, 0, 0, 0);
            return s;
        }
    cm_tape_set_rows(tr->tape, 0, 0, 0);
    for (int64_t i = n_mb; i < n_total; i++) /* after the real ones: re-splitting invalidates mbs */
        if ((s = run_phantom(tr, b, i))) return s;
    return CM_OK;
}

/* One gradient computation of the batch (a closure run, see cm_train_closure in trainer.h):
 * BEFORE_TRAIN_BATCH, the microbatches (retried with smaller ones under automatic
 * microbatching), the gradient synchronisation, AFTER_TRAIN_BATCH. */
struct cm_train_closure {
    cm_trainer *tr;
    cm_batch *b;
    int64_t local_samples, local_tokens;
    double global_w;
    int runs, steps;
    double loss_sum; /* the first run's */
};

static cm_status grad_pass(cm_train_closure *c) {
    cm_trainer *tr = c->tr;
    cm_state *st = &tr->st;
    cm_batch *b = c->b;
    cm_status s;
    tr->record_pass = c->runs == 0;
    cmi_state_set_batch(st, b, c->local_samples, c->local_tokens);
    if ((s = run(tr, CM_EVENT_BEFORE_TRAIN_BATCH))) return s;

    if (tr->mb_config == CM_MICROBATCH_AUTO && st->microbatch_size <= 0) {
        /* the pre-flight plan (memory_plan.c), else the search starts at the whole batch */
        if (tr->plan_memory) {
            if ((s = cmi_memory_plan_first(tr, b, c->global_w))) return s;
        } else {
            st->microbatch_size = b->n_rows > 0 ? b->n_rows : 1;
        }
        if ((s = cm_logger_log_metric(cm_engine_logger(tr->engine), "trainer/device_train_microbatch_size",
                                      (double)st->microbatch_size)))
            return s;
    }
    double loss_sum = 0;
    /* On several ranks the search is collective: after each attempt the ranks tell each other
     * whether one ran out of memory (or failed), and all retry together (cm_dist does not start
     * gradient collectives during backward while the size is automatic, so an attempt that is
     * thrown away never leaves one half-done). */
    const bool agree = tr->mb_config == CM_MICROBATCH_AUTO && tr->dist.world_size > 1;
    for (;;) {
        int64_t mbsz = tr->mb_config == 0 ? (b->n_rows > 0 ? b->n_rows : 1) : st->microbatch_size;
        bool oom;
        s = run_microbatches(tr, b, mbsz, c->global_w, &oom, &loss_sum);
        if (agree) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", s ? cm_last_error() : "");
            double flags[2] = {s && oom ? 1.0 : 0.0, s && !oom ? 1.0 : 0.0};
            cm_status r = reduce(tr, flags, 2);
            if (r) return r;
            if (flags[1] > 0)
                return s ? cm_set_error(s, "%s", msg)
                         : cm_set_error(CM_ERR_STATE, "fit (epoch %lld, batch %lld): %g other rank(s) failed in this batch "
                                                      "(their output has the error)",
                                        (long long)st->ts.epoch, (long long)st->ts.batch_in_epoch, flags[1]);
            if (!s && flags[0] > 0) { /* another rank ran out: retry with it */
                cm_log_msg(CM_LOG_INFO, "trainer: %g rank(s) ran out of arena memory with microbatches of %lld rows",
                           flags[0], (long long)mbsz);
                s = cm_set_error(CM_ERR_OOM, "another rank ran out of arena memory");
                oom = true;
            } else if (s) {
                cm_set_error(s, "%s", msg);
            }
        }
        if (!s) break;
        if (!(oom && tr->mb_config == CM_MICROBATCH_AUTO)) return s;
        if (mbsz <= 1) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            return cm_set_error(CM_ERR_OOM,
                                "automatic microbatching: even a microbatch of 1 row does not fit the arena budget "
                                "of %zu bytes (raise arena_budget): %s",
                                cm_arena_budget(cm_tape_arena(tr->tape)), msg);
        }
        /* Same math with smaller pieces: retry the whole batch from zero gradients. */
        st->microbatch_size = mbsz / 2;
        cm_log_msg(CM_LOG_INFO, "trainer: out of arena memory with microbatches of %lld rows; retrying with %lld",
                   (long long)mbsz, (long long)st->microbatch_size);
        cm_tape_reset(tr->tape);
        if ((s = cm_logger_log_metric(cm_engine_logger(tr->engine), "trainer/device_train_microbatch_size",
                                      (double)st->microbatch_size)))
            return s;
    }
    cmi_state_set_batch(st, b, c->local_samples, c->local_tokens);
    st->outputs = st->loss = NULL;
    if (tr->dist.sync_grads && cmi_prof_on()) cmi_prof_begin("dist/sync_grads", "dist", NULL);
    if (tr->dist.sync_grads && (s = tr->dist.sync_grads(st, tr->dist.data))) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "gradient synchronisation failed: %s", msg);
    }
    if (tr->dist.sync_grads) cmi_prof_end("dist/sync_grads");
    if (c->runs == 0) c->loss_sum = loss_sum;
    c->runs++;
    tr->record_pass = true;
    return run(tr, CM_EVENT_AFTER_TRAIN_BATCH);
}

static cm_status opt_step(cm_train_closure *c) {
    cm_trainer *tr = c->tr;
    cm_state *st = &tr->st;
    cm_status s;
    if (cmi_prof_on()) cmi_prof_begin("optimizer/step", "optimizer", NULL);
    double mult = 1.0;
    if (!isnan(st->lr_override)) {
        mult = st->lr_override;
    } else {
        cm_sched_clock clk = {st->ts, st->max_duration, st->batches_per_epoch, st->ssr};
        if ((s = cm_sched_multiplier_product(st->schedulers, st->n_schedulers, &clk, &mult))) return s;
    }
    st->lr_multiplier = mult;
    if ((s = cm_optim_step(st->optimizer, mult))) return s;
    c->steps++;
    if (tr->dist.sync_params && (s = tr->dist.sync_params(st, tr->dist.data))) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "parameter synchronisation after the optimizer step failed: %s", msg);
    }
    cmi_prof_end("optimizer/step");
    return CM_OK;
}

cm_status cm_train_closure_run(cm_train_closure *c) {
    if (!c) return cm_set_error(CM_ERR_INVALID_ARG, "cm_train_closure_run: NULL closure");
    if (c->steps)
        return cm_set_error(CM_ERR_STATE, "train step '%s': the closure ran after the optimizer step of this batch",
                            c->tr->st.step_name ? c->tr->st.step_name : "?");
    return grad_pass(c);
}

cm_status cm_train_closure_step(cm_train_closure *c) {
    if (!c) return cm_set_error(CM_ERR_INVALID_ARG, "cm_train_closure_step: NULL closure");
    const char *name = c->tr->st.step_name ? c->tr->st.step_name : "?";
    if (c->runs == 0)
        return cm_set_error(CM_ERR_STATE, "train step '%s': the optimizer step came before any gradient computation "
                                          "(run the closure first)", name);
    if (c->steps) return cm_set_error(CM_ERR_STATE, "train step '%s': a second optimizer step in one batch", name);
    return opt_step(c);
}

/* This rank's counts of batch b (the spec's samples and tokens) summed over the ranks into
 * counts[2], in one all-reduce. When `fixup` is set on any rank (an algorithm replaced the batch,
 * or a dry run's batch), b's global counts and this rank's row offset are recomputed from every
 * rank's rows, so dropout keys rows of the new batch without overlap between ranks. */
static cm_status count_batch(cm_trainer *tr, cm_batch *b, bool fixup, double counts[2]) {
    const int W = tr->dist.world_size > 1 ? tr->dist.world_size : 0, n = 5 + W;
    if (!tr->count_buf && !(tr->count_buf = cm_alloc(sizeof(double) * (size_t)n, 16)))
        return cm_set_error(CM_ERR_OOM, "fit: out of memory");
    double *v = tr->count_buf;
    memset(v, 0, sizeof(double) * (size_t)n);
    v[0] = (double)cm_data_spec_n_samples(tr->spec, b), v[1] = cmi_loss_tokens(tr, b);
    v[2] = fixup ? 1.0 : 0.0, v[3] = (double)b->n_samples, v[4] = (double)b->n_tokens;
    if (W) v[5 + tr->dist.rank] = (double)b->n_rows;
    cm_status s = reduce(tr, v, n);
    if (s) return s;
    if (v[2] > 0) {
        b->global_n_samples = (int64_t)v[3], b->global_n_tokens = (int64_t)v[4], b->rank_offset = 0;
        for (int r = 0; r < tr->dist.rank && W; r++) b->rank_offset += (int64_t)v[5 + r];
    }
    counts[0] = v[0], counts[1] = v[1];
    return CM_OK;
}

static cm_status check_global_weight(cm_trainer *tr, double global_w) {
    if (global_w > 0) return CM_OK;
    return cm_set_error(CM_ERR_INVALID_ARG,
                        "fit (epoch %lld, batch %lld): the global batch has no %s to weight microbatches by%s",
                        (long long)tr->st.ts.epoch, (long long)tr->st.ts.batch_in_epoch,
                        tr->tokens_weighting ? "loss-generating tokens" : "samples",
                        tr->tokens_weighting ? " (accumulate_train_batch_on_tokens weights by the labels other than "
                                               "-100, else by the tokens the dataset counts: every label of this "
                                               "batch is -100, or the dataset counts no tokens; a count_loss_tokens "
                                               "in train_data_spec counts them your way)" : "");
}

static cm_status train_batch(cm_trainer *tr, cm_batch *b) {
    cm_state *st = &tr->st;
    cm_module *root = cm_model_module(st->model);
    cm_module_train(root, true);
    cm_status s;
    const int64_t local_samples = cm_data_spec_n_samples(tr->spec, b), local_tokens = cm_data_spec_n_tokens(tr->spec, b);
    double counts[2] = {0, 0};
    if ((s = count_batch(tr, b, st->batch_dirty, counts))) return s;
    const double global_w = tr->tokens_weighting ? counts[1] : counts[0];
    if ((s = check_global_weight(tr, global_w))) return s;
    /* every microbatch of every attempt and closure run draws dropout from the counters the
     * batch starts with */
    for (int k = 0; k < tr->n_drop; k++) tr->drop_base[k] = tr->drop_rngs[k]->counter;
    cm_train_closure c = {tr, b, local_samples, local_tokens, global_w, 0, 0, 0.0};
    if (st->step_fn) {
        const char *name = st->step_name;
        s = st->step_fn(st->step_data, st, &c);
        tr->record_pass = true;
        if (s) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            return cm_set_error(s, "train step '%s' (epoch %lld, batch %lld): %s", name, (long long)st->ts.epoch,
                                (long long)st->ts.batch_in_epoch, msg);
        }
        if (c.runs == 0)
            return cm_set_error(CM_ERR_STATE, "train step '%s' returned without computing the batch's gradient (it must "
                                              "call cm_train_closure_run at least once)", name);
        cmi_state_set_batch(st, b, local_samples, local_tokens);
        st->outputs = st->loss = NULL;
    } else {
        if ((s = grad_pass(&c)) || (s = opt_step(&c))) return s;
    }
    /* one reduce for the loss and for whether some rank asked to roll this batch back */
    double red[2] = {c.loss_sum, st->rollback ? 1.0 : 0.0};
    if ((s = reduce(tr, red, 2))) return s;
    const double loss_sum = red[0];
    if (red[1] > 0) {
        st->rollback = true; /* on every rank: fit_loop abandons the batch */
        return CM_OK;
    }
    st->total_loss = loss_sum;
    if ((s = cm_logger_log_metric(cm_engine_logger(tr->engine), "loss/train/total", loss_sum))) return s;
    return metrics_finish(tr, &st->metric_sets[0]);
}

/* ---- the dry run (cm_state_dry_run) ---- */

/* Copies of the model's persistent buffers (batch-norm statistics), to undo a dry run's forward. */
cm_status cmi_snapshot_buffers(cm_module *root, char **out, bool restore) {
    const int64_t n = cm_module_n_buffers(root);
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) total += cm_tensor_nbytes(cm_module_buffer_info(root, i).tensor);
    if (!restore && !(*out = cm_alloc(total ? total : 1, 16))) return cm_set_error(CM_ERR_OOM, "dry run: out of memory");
    size_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        cm_tensor *t = cm_module_buffer_info(root, i).tensor;
        const size_t nb = cm_tensor_nbytes(t);
        if (restore) memcpy(cm_tensor_data(t), *out + off, nb);
        else memcpy(*out + off, cm_tensor_data(t), nb);
        off += nb;
    }
    return CM_OK;
}

cm_status cm_state_dry_run(cm_state *st, const cm_batch *batch) {
    if (!st || !batch) return cm_set_error(CM_ERR_INVALID_ARG, "cm_state_dry_run: NULL state or batch");
    cm_trainer *tr = st->trainer;
    if (!tr || st->event != CM_EVENT_AFTER_DATALOADER || st->batch != &tr->work || tr->dry)
        return cm_set_error(CM_ERR_STATE, "cm_state_dry_run: only on AFTER_DATALOADER during fit (now: %s)",
                            st->event < CM_EVENT_COUNT ? cm_event_name(st->event) : "outside events");
    for (int f = 0; f < batch->n_fields; f++)
        if (!batch->fields[f] || cm_tensor_ndim(batch->fields[f]) < 1 || cm_tensor_dim(batch->fields[f], 0) != batch->n_rows ||
            !cm_tensor_is_contiguous(batch->fields[f]))
            return cm_set_error(CM_ERR_INVALID_ARG, "cm_state_dry_run: field %d ('%s') must be contiguous with the batch's "
                                                    "%lld rows in dim 0",
                                f, batch->names[f] ? batch->names[f] : "?", (long long)batch->n_rows);
    cm_module *root = cm_model_module(st->model);
    uint64_t *counters = tr->n_drop ? cm_alloc(sizeof(uint64_t) * (size_t)tr->n_drop, 16) : NULL;
    if (tr->n_drop && !counters) return cm_set_error(CM_ERR_OOM, "dry run: out of memory");
    char *bufs = NULL;
    cm_status s = cmi_snapshot_buffers(root, &bufs, false);
    if (s) {
        cm_free(counters);
        return s;
    }
    for (int k = 0; k < tr->n_drop; k++) counters[k] = tr->drop_rngs[k]->counter;
    cm_batch b = *batch;
    b.microbatch = -1;
    const int64_t local_samples = cm_data_spec_n_samples(tr->spec, &b), local_tokens = cm_data_spec_n_tokens(tr->spec, &b);
    const int64_t mb_index = st->microbatch_index, n_mb = st->n_microbatches;
    tr->dry = true;
    double counts[2] = {0, 0};
    if (!(s = count_batch(tr, &b, true, counts))) {
        const double global_w = tr->tokens_weighting ? counts[1] : counts[0];
        for (int k = 0; k < tr->n_drop; k++) tr->drop_base[k] = tr->drop_rngs[k]->counter;
        /* one gradient computation as the default step makes it (its events are off: tr->dry) */
        cm_train_closure c = {tr, &b, local_samples, local_tokens, global_w, 0, 0, 0.0};
        if (!(s = check_global_weight(tr, global_w))) s = grad_pass(&c);
    }
    tr->dry = false;
    tr->record_pass = true;
    char msg[1024] = "";
    if (s) snprintf(msg, sizeof msg, "%s", cm_last_error());
    /* undo: gradients, dropout counters, batch-norm statistics; the batch the algorithms see */
    cm_tape_reset(tr->tape);
    cm_status z = tr->dist.zero_grad ? tr->dist.zero_grad(st, tr->dist.data) : (cm_module_zero_grad(root), CM_OK);
    for (int k = 0; k < tr->n_drop; k++) tr->drop_rngs[k]->counter = counters[k];
    cmi_snapshot_buffers(root, &bufs, true);
    cm_free(bufs);
    cm_free(counters);
    st->microbatch_index = mb_index, st->n_microbatches = n_mb;
    cmi_state_set_batch(st, &tr->work, cm_data_spec_n_samples(tr->spec, &tr->work),
                        cm_data_spec_n_tokens(tr->spec, &tr->work));
    if (s) return cm_set_error(s, "dry run of a %lld-row batch: %s", (long long)b.n_rows, msg);
    return z;
}

/* ---------------------------------------------------------------------------------------------
 * Evaluation
 * ------------------------------------------------------------------------------------------- */

/* The metrics see only the real rows: padding is always at the end of an eval batch. */
static cm_status eval_update(cm_trainer *tr, cm_metric_set *ms, cm_batch *b) {
    cm_state *st = &tr->st;
    if (!ms->n || !st->outputs) return CM_OK;
    const int64_t real = b->n_rows - b->n_padded;
    if (b->n_padded <= 0) return metrics_update(tr->tape, ms, st->outputs, &st->mbatch);
    if (real <= 0) return CM_OK;
    cm_tensor *fields[CM_DATASET_MAX_FIELDS];
    for (int i = 0; i < st->mbatch.n; i++) {
        cm_tensor *f = st->mbatch.fields[i];
        fields[i] = cm_tensor_ndim(f) >= 1 && cm_tensor_dim(f, 0) == b->n_rows ? cm_narrow(tr->tape, f, 0, 0, real) : f;
    }
    cm_tensor *out = st->outputs;
    if (cm_tensor_ndim(out) >= 1 && cm_tensor_dim(out, 0) == b->n_rows) out = cm_narrow(tr->tape, out, 0, 0, real);
    if (cm_tape_status(tr->tape)) return model_error(tr, "eval");
    cm_model_batch mb = {st->mbatch.names, fields, st->mbatch.n, real, b->n_tokens};
    return metrics_update(tr->tape, ms, out, &mb);
}

static cm_status eval_loop(cm_trainer *tr, const evaluator_rt *ev) {
    cm_state *st = &tr->st;
    cm_module *root = cm_model_module(st->model);
    cm_metric_set *ms = &st->metric_sets[ev->set];
    const bool was_training = cm_module_is_training(root);
    cm_dataloader *prev_dl = st->dl;
    const int64_t prev_len = st->dl_len;
    char prev_label[64];
    snprintf(prev_label, sizeof prev_label, "%s", st->dl_label);
    cm_module_train(root, false);
    const bool prev_grad = cm_tape_set_grad_enabled(tr->tape, false);
    cm_tape_reset(tr->tape);
    st->dl = ev->dl;
    st->dl_len = loop_len(ev->dl, ev->subset);
    snprintf(st->dl_label, sizeof st->dl_label, "%s", ev->label);
    cmi_metric_set_reset(ms);
    st->n_microbatches = 1, st->microbatch_index = 0;
    cm_status s = cm_dataloader_set_state(ev->dl, (cm_dataloader_state){0, 0});
    if (!s) s = run(tr, CM_EVENT_EVAL_START);
    for (int64_t n = 0; !s && (ev->subset < 0 || n < ev->subset); n++) {
        cm_batch *b;
        if ((s = cm_dataloader_next(ev->dl, &b)) || !b) break;
        cmi_state_set_batch(st, b, b->n_samples, b->n_tokens);
        if ((s = run(tr, CM_EVENT_EVAL_BATCH_START)) || (s = run(tr, CM_EVENT_EVAL_BEFORE_FORWARD))) break;
        if (!batch_to_device(tr)) {
            s = model_error(tr, "eval");
            break;
        }
        st->outputs = cm_model_eval_forward(st->model, tr->tape, &st->mbatch);
        if (!st->outputs) {
            s = model_error(tr, "eval");
            break;
        }
        if ((s = run(tr, CM_EVENT_EVAL_AFTER_FORWARD))) break;
        if ((s = eval_update(tr, ms, b))) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            s = cm_set_error(s, "eval '%s' metrics (batch %lld): %s", ev->label, (long long)n, msg);
            break;
        }
        if ((s = run(tr, CM_EVENT_EVAL_BATCH_END))) break;
        cm_tape_reset(tr->tape);
        cmi_state_clear_batch(st);
    }
    cm_tape_reset(tr->tape);
    cmi_state_clear_batch(st);
    if (!s) s = metrics_finish(tr, ms);
    if (!s) s = run(tr, CM_EVENT_EVAL_END);
    cm_tape_set_grad_enabled(tr->tape, prev_grad);
    cm_module_train(root, was_training);
    st->dl = prev_dl;
    st->dl_len = prev_len;
    snprintf(st->dl_label, sizeof st->dl_label, "%s", prev_label);
    return s;
}

/* Whether an interval is crossed between two timestamps (ep only at epoch ends; the rest only at
 * batch ends). */
bool cmi_interval_hit(const cm_trainer *tr, cm_time iv, const cm_timestamp *prev, const cm_timestamp *now,
                         bool epoch_end) {
    if (time_is_zero(iv)) return false;
    if ((iv.unit == CM_TIME_EPOCH) != epoch_end) return false;
    if (iv.unit == CM_TIME_DURATION) {
        double a, b;
        if (cm_timestamp_elapsed(prev, tr->st.max_duration, tr->st.batches_per_epoch, &a) ||
            cm_timestamp_elapsed(now, tr->st.max_duration, tr->st.batches_per_epoch, &b))
            return false;
        return floor(a / iv.frac + 1e-9) != floor(b / iv.frac + 1e-9);
    }
    cm_time pa, pb;
    if (cm_timestamp_get(prev, iv.unit, &pa) || cm_timestamp_get(now, iv.unit, &pb)) return false;
    return pa.count / iv.count != pb.count / iv.count;
}

bool cmi_fit_done(const cm_trainer *tr) {
    int c = -1;
    cm_timestamp_cmp(&tr->st.ts, tr->st.max_duration, &c);
    return c >= 0;
}

/* Runs the evaluators that are due (EVAL_BEFORE_ALL ... EVAL_AFTER_ALL around them). */
static cm_status maybe_eval(cm_trainer *tr, const cm_timestamp *prev, bool epoch_end) {
    if (tr->n_evals == 0) return CM_OK;
    const cm_state *st = &tr->st;
    const bool done = cmi_fit_done(tr);
    const bool last_of_epoch = st->batches_per_epoch > 0 && st->ts.batch_in_epoch == st->batches_per_epoch;
    bool due[64] = {false}, any = false;
    for (int i = 0; i < tr->n_evals && i < 64; i++) {
        const evaluator_rt *e = &tr->evals[i];
        due[i] = cmi_interval_hit(tr, e->interval, prev, &st->ts, epoch_end);
        /* once more at the end of training, unless this batch was just evaluated; at the end of an
         * epoch for epoch intervals when the run ends there */
        if (!due[i] && done && !time_is_zero(e->interval) && tr->last_eval_batch != st->ts.batch) {
            if (epoch_end || e->interval.unit != CM_TIME_EPOCH || !last_of_epoch) due[i] = true;
        }
        any |= due[i];
    }
    if (!any) return CM_OK;
    tr->last_eval_batch = st->ts.batch;
    cm_status s = run(tr, CM_EVENT_EVAL_BEFORE_ALL);
    for (int i = 0; !s && i < tr->n_evals && i < 64; i++)
        if (due[i]) s = eval_loop(tr, &tr->evals[i]);
    if (!s) s = run(tr, CM_EVENT_EVAL_AFTER_ALL);
    return s;
}

/* ---------------------------------------------------------------------------------------------
 * fit
 * ------------------------------------------------------------------------------------------- */

static cm_status log_time(cm_trainer *tr) {
    const cm_timestamp *t = &tr->st.ts;
    cm_metric_value v[] = {
        {"time/batch", (double)t->batch},          {"time/sample", (double)t->sample},
        {"time/batch_in_epoch", (double)t->batch_in_epoch}, {"time/sample_in_epoch", (double)t->sample_in_epoch},
        {"time/token", (double)t->token},          {"time/token_in_epoch", (double)t->token_in_epoch},
    };
    return cm_logger_log_metrics(cm_engine_logger(tr->engine), v, (int)(sizeof v / sizeof *v));
}

/* cm_state_rollback: the batch in progress is abandoned, the last checkpoint loaded, and the
 * loader moved past the abandoned batch (see trainer.h). */
static cm_status rollback(cm_trainer *tr) {
    cm_state *st = &tr->st;
    st->rollback = false;
    cm_tape_reset(tr->tape);
    cmi_state_clear_batch(st);
    st->outputs = st->loss = NULL;
    const cm_timestamp bad = st->ts; /* the abandoned batch is number bad.batch (0-based) */
    const cm_dataloader_state after = cm_dataloader_get_state(st->train_dl);
    cm_status s = cmi_ckpt_wait(tr);
    if (s) return s;
    const char *last = cm_trainer_last_checkpoint(tr);
    if (!last) last = cm_trainer_resumed_from(tr);
    if (!last)
        return cm_set_error(CM_ERR_STATE, "rollback asked at batch %lld (epoch %lld), but there is no checkpoint to go "
                                          "back to (set save_folder and a save_interval)",
                            (long long)bad.batch, (long long)bad.epoch);
    char path[4096];
    snprintf(path, sizeof path, "%s", last);
    if ((s = cmi_ckpt_rollback_load(tr, path))) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "rollback at batch %lld: %s", (long long)bad.batch, msg);
    }
    /* skip the data of the batches since the checkpoint, the abandoned one included */
    cm_dataloader_state to = after;
    const bool crossed = after.epoch != st->ts.epoch;
    if (crossed) {
        const cm_dataset *ds = cm_dataloader_dataset(st->train_dl);
        to = (cm_dataloader_state){st->ts.epoch, ds ? cm_dataset_len(ds) : 0};
    }
    if ((s = cm_dataloader_set_state(st->train_dl, to))) return s;
    const int64_t skipped = bad.batch + 1 - st->ts.batch, skipped_samples = bad.sample - st->ts.sample;
    cm_log_msg(CM_LOG_WARN, "rollback at batch %lld (epoch %lld): went back to checkpoint '%s' (batch %lld) and "
                            "skipped the data of batches %lld to %lld%s; training goes on from batch %lld",
               (long long)bad.batch + 1, (long long)bad.epoch, path, (long long)st->ts.batch,
               (long long)st->ts.batch + 1, (long long)bad.batch + 1,
               crossed ? " (to the end of the checkpoint's epoch)" : "", (long long)st->ts.batch + 1);
    cm_metric_value v[] = {{"trainer/rollback/skipped_batches", (double)skipped},
                           {"trainer/rollback/skipped_samples", (double)(skipped_samples > 0 ? skipped_samples : 0)}};
    return cm_logger_log_metrics(cm_engine_logger(tr->engine), v, 2);
}

/* Preemption: the signal that arrived during fit (0: none). Handlers are installed only while
 * fit runs; they set this flag and reset themselves, so a second signal acts as usual. */
static volatile sig_atomic_t g_signal;

static void on_signal(int sig) { g_signal = sig; }

static cm_status fit_loop(cm_trainer *tr) {
    cm_state *st = &tr->st;
    cm_status s;
    /* The timestamp's wall-clock is Composer's: the time from one batch's end to the next — data
     * loading, the algorithms on AFTER_DATALOADER, the step and checkpoints — with evaluation
     * paused (Composer's "Pause the timing during evaluation"), so time-to-quality counts what a
     * run spends to train, and a recipe's data-side methods are not free. */
    double wct_mark = cm_clock_s();
    while (!cmi_fit_done(tr) && !st->stop) {
        if (st->ts.batch_in_epoch == 0) {
            if ((s = run(tr, CM_EVENT_EPOCH_START))) return s;
            if ((s = cm_logger_log_metric(cm_engine_logger(tr->engine), "time/epoch", (double)st->ts.epoch))) return s;
        }
        bool exhausted = false, early = false;
        int64_t n_batches = 0;
        for (;;) {
            if ((s = run(tr, CM_EVENT_BEFORE_DATALOADER))) return s;
            cm_batch *lb;
            if ((s = cm_data_spec_next(tr->spec, &lb))) return s;
            if (!lb) {
                exhausted = true;
                break;
            }
            n_batches++;
            /* algorithms change the working copy on AFTER_DATALOADER, never the loader's batch */
            tr->work = *lb;
            cm_batch *b = &tr->work;
            st->batch_dirty = false;
            cmi_state_set_batch(st, b, cm_data_spec_n_samples(tr->spec, b), cm_data_spec_n_tokens(tr->spec, b));
            if ((s = run(tr, CM_EVENT_AFTER_DATALOADER)) || (s = run(tr, CM_EVENT_BATCH_START)) ||
                (s = log_time(tr)))
                return s;
            if ((s = train_batch(tr, b))) return s;
            if (st->rollback) {
                if ((s = rollback(tr))) return s;
                continue;
            }
            double counts[2] = {(double)cm_data_spec_n_samples(tr->spec, b), (double)cm_data_spec_n_tokens(tr->spec, b)};
            if ((s = reduce(tr, counts, 2))) return s;
            if (st->max_duration.unit == CM_TIME_TOKEN && counts[1] <= 0)
                return cm_set_error(CM_ERR_INVALID_ARG, "max_duration is in tokens but the train batches count no "
                                                        "tokens (use a token dataset or a count_tokens function)");
            const cm_timestamp prev = st->ts;
            const double now = cm_clock_s();
            cm_timestamp_next_batch(&st->ts, (int64_t)counts[0], (int64_t)counts[1], now - wct_mark);
            wct_mark = now;
            if ((s = run(tr, CM_EVENT_BATCH_END))) return s;
            const double e0 = cm_clock_s();
            if ((s = maybe_eval(tr, &prev, false))) return s;
            wct_mark += cm_clock_s() - e0;
            st->checkpoint_due = cmi_ckpt_due(tr, CM_EVENT_BATCH_CHECKPOINT, &prev);
            s = run(tr, CM_EVENT_BATCH_CHECKPOINT);
            st->checkpoint_due = false;
            if (s || (s = cmi_ckpt_on_event(tr, CM_EVENT_BATCH_CHECKPOINT, &prev))) return s;
            cmi_state_clear_batch(st);
            /* preemption: stop after this batch — on every rank, if any rank got the signal, so all
             * of them save together (a signal arriving after this point is seen after the next) */
            if (!tr->stop_signal && tr->signals_on) {
                const int sig_now = g_signal;
                double flag = sig_now ? 1.0 : 0.0;
                if (tr->dist.world_size > 1 && (s = reduce(tr, &flag, 1))) return s;
                if (flag > 0) tr->stop_signal = sig_now ? sig_now : SIGTERM;
            }
            if (tr->stop_signal) st->stop = true;
            if (cmi_fit_done(tr) || st->stop) {
                early = true;
                break;
            }
        }
        if (exhausted && n_batches == 0 && st->ts.batch_in_epoch == 0)
            return cm_set_error(CM_ERR_STATE, "fit: the train loader gave no batch in epoch %lld (is it empty?)",
                                (long long)st->ts.epoch);
        if (!early || (st->batches_per_epoch > 0 && st->ts.batch_in_epoch == st->batches_per_epoch)) {
            if (!exhausted) { /* stopped on the epoch's last batch: move the loader to the next epoch too */
                cm_dataloader_state ds = cm_dataloader_get_state(st->train_dl);
                if ((s = cm_dataloader_set_state(st->train_dl, (cm_dataloader_state){ds.epoch + 1, 0}))) return s;
            }
            const cm_timestamp prev = st->ts;
            cm_timestamp_next_epoch(&st->ts, 0.0);
            if ((s = run(tr, CM_EVENT_EPOCH_END))) return s;
            const double e0 = cm_clock_s();
            if ((s = maybe_eval(tr, &prev, true))) return s;
            wct_mark += cm_clock_s() - e0;
            st->checkpoint_due = cmi_ckpt_due(tr, CM_EVENT_EPOCH_CHECKPOINT, &prev);
            s = run(tr, CM_EVENT_EPOCH_CHECKPOINT);
            st->checkpoint_due = false;
            if (s || (s = cmi_ckpt_on_event(tr, CM_EVENT_EPOCH_CHECKPOINT, &prev))) return s;
        }
    }
    return CM_OK;
}

/* After a preemption signal: save (when save_folder is set), close the plugins, report. */
static cm_status interrupted(cm_trainer *tr, int sig) {
    tr->interrupted_signal = sig;
    const char *name = sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "a signal";
    const long long batch = (long long)tr->st.ts.batch;
    cm_status s = cmi_ckpt_save_now(tr);
    char msg[2048] = "";
    if (s) snprintf(msg, sizeof msg, "%s", cm_last_error());
    cm_status c = cm_trainer_close(tr);
    if (c) cm_log_msg(CM_LOG_WARN, "trainer: closing after %s: %s", name, cm_last_error());
    if (s)
        return cm_set_error(s, "fit: interrupted by %s after batch %lld, and the checkpoint save failed: %s", name, batch,
                            msg);
    const char *where = cm_trainer_last_checkpoint(tr);
    return cm_set_error(CM_ERR_INTERRUPTED, "fit: interrupted by %s after batch %lld; %s%s%s; plugins closed (exit with "
                                            "status %d)",
                        name, batch, where ? "checkpoint saved in '" : "no save_folder, nothing saved",
                        where ? where : "", where ? "'" : "", cm_exit_status(CM_ERR_INTERRUPTED, sig));
}

cm_status cm_trainer_fit(cm_trainer *tr, const cm_fit_opts *opts) {
    cm_status s = check_usable(tr, "fit");
    if (s) return s;
    cm_state *st = &tr->st;
    if (!st->train_dl || !tr->spec)
        return cm_set_error(CM_ERR_STATE, "fit: there is no train_dataloader (set it in the trainer config)");
    cm_fit_opts o = opts ? *opts : cm_fit_opts_default();
    if (o.reset_time) {
        memset(&st->ts, 0, sizeof st->ts);
        tr->iteration_open = false;
        tr->last_eval_batch = -1;
        if ((s = cm_dataloader_set_state(st->train_dl, (cm_dataloader_state){0, 0}))) return s;
    }
    if (!time_is_zero(o.duration)) {
        if ((s = check_duration_unit("fit duration", o.duration))) return s;
        if (o.duration.count < 0) return cm_set_error(CM_ERR_INVALID_ARG, "fit duration must not be negative");
        cm_time now;
        if ((s = cm_timestamp_get(&st->ts, o.duration.unit, &now))) return s;
        st->max_duration = cm_time_make(now.count + o.duration.count, o.duration.unit);
    }
    if (time_is_zero(st->max_duration))
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "fit: max_duration is not set (set cfg.max_duration, e.g. \"2ep\", or pass a duration)");
    if (st->max_duration.unit == CM_TIME_EPOCH && st->batches_per_epoch == 0)
        return cm_set_error(CM_ERR_STATE, "fit: the train loader has no batches per epoch");
    st->stop = false;
    st->dl = st->train_dl;
    st->dl_len = loop_len(st->train_dl, -1);
    snprintf(st->dl_label, sizeof st->dl_label, "train");
    cm_module_train(cm_model_module(st->model), true);
    if ((s = run(tr, CM_EVENT_FIT_START))) return s;
    if (!tr->iteration_open) {
        if ((s = run(tr, CM_EVENT_ITERATION_START))) return s;
        tr->iteration_open = true;
    }
    struct sigaction old_term, old_int;
    const bool signals = cmi_ckpt_handles_signals(tr);
    tr->signals_on = signals; /* every rank has the same setting, so the stop flag's reduce matches */
    if (signals) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sa.sa_flags = SA_RESETHAND;
        sigemptyset(&sa.sa_mask);
        g_signal = 0;
        tr->stop_signal = 0;
        sigaction(SIGTERM, &sa, &old_term);
        sigaction(SIGINT, &sa, &old_int);
    }
    s = fit_loop(tr);
    const int sig = signals ? tr->stop_signal : 0;
    if (signals) {
        sigaction(SIGTERM, &old_term, NULL);
        sigaction(SIGINT, &old_int, NULL);
        g_signal = 0;
    }
    if (s) {
        cm_tape_reset(tr->tape);
        cmi_state_clear_batch(st);
        return s;
    }
    if (sig) return interrupted(tr, sig);
    if (cmi_fit_done(tr)) {
        if ((s = run(tr, CM_EVENT_ITERATION_END)) || (s = run(tr, CM_EVENT_ITERATION_CHECKPOINT))) return s;
        tr->iteration_open = false;
        /* with a remote save_folder, fit ends when every checkpoint is uploaded (or fails loudly) */
        if ((s = cmi_ckpt_finish(tr, true))) return s;
    }
    return run(tr, CM_EVENT_FIT_END);
}

/* ---------------------------------------------------------------------------------------------
 * eval and predict
 * ------------------------------------------------------------------------------------------- */

cm_status cm_trainer_eval(cm_trainer *tr, const cm_evaluator *evaluators, int n_evaluators) {
    cm_status s = check_usable(tr, "eval");
    if (s) return s;
    if (n_evaluators > 0 && evaluators) {
        /* ad-hoc evaluators: use the configured metric set of the same label, or a temporary one */
        for (int i = 0; i < n_evaluators; i++) {
            if (!evaluators[i].dataloader) return cm_set_error(CM_ERR_INVALID_ARG, "eval: evaluators[%d] has no dataloader", i);
            if ((s = check_loader("eval", evaluators[i].dataloader, CM_DATA_EVAL))) return s;
        }
    } else if (tr->n_evals == 0) {
        return cm_set_error(CM_ERR_INVALID_ARG, "eval: no evaluators (set eval_dataloader or evaluators in the config, "
                                                "or pass evaluators)");
    }
    cm_state *st = &tr->st;
    if ((s = run(tr, CM_EVENT_EVAL_STANDALONE_START))) return s;
    if (n_evaluators > 0 && evaluators) {
        for (int i = 0; !s && i < n_evaluators; i++) {
            evaluator_rt e = {{0}, evaluators[i].dataloader, evaluators[i].subset_num_batches, {0}, -1};
            snprintf(e.label, sizeof e.label, "%s", evaluators[i].label ? evaluators[i].label : "eval");
            for (int j = 0; j < tr->n_evals; j++)
                if (!strcmp(tr->evals[j].label, e.label)) e.set = tr->evals[j].set;
            if (e.set < 0) {
                /* a label the trainer has no metric set for: grow the state's sets */
                cm_metric_set *ns = cm_alloc_zeroed(sizeof *ns * (size_t)(st->n_metric_sets + 1), 16);
                if (!ns) return CM_ERR_OOM;
                memcpy(ns, st->metric_sets, sizeof *ns * (size_t)st->n_metric_sets);
                if ((s = cmi_metric_set_init(&ns[st->n_metric_sets], st->model, false, e.label))) {
                    cm_free(ns);
                    return s;
                }
                cm_free(st->metric_sets);
                st->metric_sets = ns;
                e.set = st->n_metric_sets++;
            }
            s = eval_loop(tr, &e);
        }
    } else {
        for (int i = 0; !s && i < tr->n_evals; i++) s = eval_loop(tr, &tr->evals[i]);
    }
    if (s) return s;
    return run(tr, CM_EVENT_EVAL_STANDALONE_END);
}

cm_status cm_trainer_predict(cm_trainer *tr, cm_dataloader *dl, int64_t subset_num_batches, cm_predict_fn fn,
                             void *data) {
    cm_status s = check_usable(tr, "predict");
    if (s) return s;
    if (!dl || !fn) return cm_set_error(CM_ERR_INVALID_ARG, "predict: NULL %s", dl ? "fn" : "dataloader");
    cm_state *st = &tr->st;
    cm_module *root = cm_model_module(st->model);
    const bool was_training = cm_module_is_training(root);
    cm_module_train(root, false);
    const bool prev_grad = cm_tape_set_grad_enabled(tr->tape, false);
    cm_dataloader *prev_dl = st->dl;
    const int64_t prev_len = st->dl_len;
    st->dl = dl;
    st->dl_len = loop_len(dl, subset_num_batches);
    snprintf(st->dl_label, sizeof st->dl_label, "predict");
    cm_tape_reset(tr->tape);
    s = cm_dataloader_set_state(dl, (cm_dataloader_state){cm_dataloader_get_state(dl).epoch, 0});
    if (!s) s = run(tr, CM_EVENT_PREDICT_START);
    for (int64_t n = 0; !s && (subset_num_batches < 0 || n < subset_num_batches); n++) {
        cm_batch *b;
        if ((s = cm_dataloader_next(dl, &b)) || !b) break;
        cmi_state_set_batch(st, b, b->n_samples, b->n_tokens);
        if ((s = run(tr, CM_EVENT_PREDICT_BATCH_START)) || (s = run(tr, CM_EVENT_PREDICT_BEFORE_FORWARD))) break;
        if (!batch_to_device(tr)) {
            s = model_error(tr, "predict");
            break;
        }
        st->outputs = cm_model_forward(st->model, tr->tape, &st->mbatch);
        if (!st->outputs) {
            s = model_error(tr, "predict");
            break;
        }
        if ((s = run(tr, CM_EVENT_PREDICT_AFTER_FORWARD))) break;
        cm_tensor *host_out = st->outputs; /* the callback reads the outputs on the host */
        if (cm_tensor_device(host_out) != CM_DEVICE_CPU && !(host_out = cm_to_device(tr->tape, host_out, CM_DEVICE_CPU))) {
            s = model_error(tr, "predict");
            break;
        }
        if ((s = fn(b, host_out, data))) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            s = cm_set_error(s, "predict: the callback failed on batch %lld: %s", (long long)n, msg);
            break;
        }
        if ((s = run(tr, CM_EVENT_PREDICT_BATCH_END))) break;
        cm_tape_reset(tr->tape);
        cmi_state_clear_batch(st);
    }
    cm_tape_reset(tr->tape);
    cmi_state_clear_batch(st);
    if (!s) s = run(tr, CM_EVENT_PREDICT_END);
    cm_tape_set_grad_enabled(tr->tape, prev_grad);
    cm_module_train(root, was_training);
    st->dl = prev_dl;
    st->dl_len = prev_len;
    snprintf(st->dl_label, sizeof st->dl_label, "train");
    return s;
}

/* ---------------------------------------------------------------------------------------------
 * Model surgery before the trainer (composer/surgery_algorithms.h)
 * ------------------------------------------------------------------------------------------- */

cm_status cm_trainer_prepare_model(const cm_trainer_config *cfg) {
    static const char fn[] = "cm_trainer_prepare_model";
    if (!cfg || !cfg->model) return cm_set_error(CM_ERR_INVALID_ARG, "%s: NULL %s", fn, cfg ? "model" : "config");
    cm_module *root = cm_model_module(cfg->model);
    if (!cm_module_is_finalized(root))
        return cm_set_error(CM_ERR_STATE, "%s: the model's module is not finalized (cm_module_finalize)", fn);
    if (cm_module_is_locked(root))
        return cm_set_error(CM_ERR_STATE, "%s: the model is locked by an optimizer or data parallelism already: call "
                                          "%s first, then make them",
                            fn, fn);
    if (cfg->n_algorithms < 0 || (cfg->n_algorithms && !cfg->algorithms))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: n_algorithms %d without algorithms", fn, cfg->n_algorithms);
    for (int i = 0; i < cfg->n_algorithms; i++) {
        const cm_algorithm_i *vt = cfg->algorithms[i].vt;
        if (!vt || vt->abi != CM_ALGORITHM_ABI || !vt->name || !vt->match || !vt->apply)
            return cm_set_error(CM_ERR_INVALID_ARG, "algorithms[%d]: bad vtable (abi %d, name, match, apply needed)", i,
                                CM_ALGORITHM_ABI);
    }
    cm_state *st = NULL;
    cm_engine *e = NULL;
    cm_algorithm **order = NULL;
    char *path = NULL;
    cm_status s = cm_state_new(&st);
    if (s) return s;
    st->model = cfg->model;
    st->seed = cfg->seed;
    st->precision = cfg->precision;
    st->rank = cfg->dist.rank;
    st->world_size = cfg->dist.world_size > 0 ? cfg->dist.world_size : 1;
    if ((s = cm_engine_new(st, &e))) goto done;
    for (int i = 0; !s && i < cfg->n_algorithm_passes; i++)
        s = cm_engine_add_ordering_pass(e, cfg->algorithm_passes[i], -1);
    for (int i = 0; !s && i < cfg->n_algorithms; i++) s = cm_engine_add_algorithm(e, cfg->algorithms[i]);
    if (s) goto done;
    /* the INIT of the config's surgery methods, in the engine's order */
    if (!(order = cm_alloc(sizeof *order * (size_t)(cfg->n_algorithms + 1), 16))) {
        s = cm_set_error(CM_ERR_OOM, "%s: out of memory", fn);
        goto done;
    }
    const int n = cmi_engine_order_all(e, CM_EVENT_INIT, order);
    if (n < 0) {
        s = cm_last_status();
        goto done;
    }
    for (int i = 0; i < n; i++) {
        const cm_algorithm_i *vt = cm_algorithm_vtable(order[i]);
        void *self = cm_algorithm_self(order[i]);
        if (!cm_algorithm_info_of(vt) || !vt->match(self, CM_EVENT_INIT, st)) continue;
        cm_clear_error();
        if ((s = vt->apply(self, CM_EVENT_INIT, st, cm_engine_logger(e)))) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", cm_last_error()[0] ? cm_last_error() : cm_status_str(s));
            s = cm_set_error(s, "plugin '%s' failed on INIT: %s", vt->name, msg);
            goto done;
        }
    }
    /* the surgery the checkpoint to load requires (a checkpoint on an object store: the trainer's) */
    const bool folder = cfg->save_folder && cfg->save_folder[0];
    const bool remote = (cfg->autoresume && folder && cm_storage_is_remote(cfg->save_folder)) ||
                        (cfg->load_path && cm_storage_is_remote(cfg->load_path));
    if (remote) {
        cm_log_msg(CM_LOG_INFO, "%s: the surgery a checkpoint on an object store requires is applied by the trainer "
                                "(make the optimizer after cm_trainer_new if it requires any)", fn);
        goto done;
    }
    if ((s = cmi_ckpt_resolve(NULL, cfg->autoresume && folder, folder ? cfg->save_folder : NULL,
                              cfg->save_latest_filename ? cfg->save_latest_filename : CM_CKPT_LATEST_DEFAULT,
                              cfg->load_path, &path)))
        goto done;
    if (path) {
        int added = 0;
        /* quiet: cm_trainer_new applies them again and warns then (once is enough) */
        s = cmi_apply_required_algorithms(e, st, path, NULL, cfg->load_exclude_algorithms,
                                          cfg->n_load_exclude_algorithms > 0 ? cfg->n_load_exclude_algorithms : 0,
                                          false, &added);
        if (!s) cmi_engine_pop_algorithms(e, added); /* made here, freed here: cm_trainer_new makes its own */
    }
done:
    cm_free(path);
    cm_free(order);
    if (e) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", s ? cm_last_error() : "");
        cmi_engine_release(e); /* the config's plugins stay the caller's */
        cm_engine_free(e);
        if (s) cm_set_error(s, "%s", msg);
    }
    cm_state_free(st);
    return s;
}
