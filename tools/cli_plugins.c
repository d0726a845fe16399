/* The plugin registry of `composer train` (config name -> constructor). Adding a plugin is one
 * registry row. The run's loggers (FileLogger, ProgressBarLogger, ConsoleLogger from loggers.h)
 * are made by cli_train.c from the settings the logger rows record. */
#include "cli.h"

/* Keys and paths are cut to their buffers on purpose (longer ones are not valid config paths). */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void cli_say(const cli_ctx *ctx, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (!ctx || !ctx->quiet) {
        va_list aq;
        va_copy(aq, ap);
        vprintf(fmt, aq);
        va_end(aq);
        fflush(stdout);
    }
    if (ctx && ctx->log) {
        vfprintf(ctx->log, fmt, ap);
        fflush(ctx->log);
    }
    va_end(ap);
}

/* ---------------------------------------------------------------------------------------------
 * Constructors
 * ------------------------------------------------------------------------------------------- */

/* Marks an argument-less entry ({} or null) read. cm_config_touch marks a whole subtree, so it is
 * not called on an entry with arguments: those the constructor does not read stay unknown keys,
 * reported with the closest valid argument. */
void cli_touch_entry(cm_config *c, const char *path) {
    if (cm_config_len(c, path) == 0) cm_config_touch(c, path);
}

/* algorithms.gradient_clipping: {clipping_type: norm|value|adaptive, clipping_threshold: 1.0} */
static cm_status make_gradient_clipping(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    static const char *const types[] = {"norm", "value", "adaptive"};
    char key[256];
    int type;
    double thr;
    cm_status s;
    snprintf(key, sizeof key, "%s.clipping_type", path);
    if ((s = cm_config_get_choice(c, key, types, 3, "norm", &type))) return s;
    snprintf(key, sizeof key, "%s.clipping_threshold", path);
    if ((s = cm_config_get_double(c, key, 1.0, &thr))) return s;
    if (!(thr > 0) || thr == thr + 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s: %g must be > 0 and finite", cm_config_origin(c, key), key, thr);
    return cm_grad_clip_new((cm_grad_clip_type)type, thr, &out->algorithm);
}

/* The surgery methods (composer/surgery_algorithms.h): their arguments, Composer's names and
 * defaults, come from the library's argument tables; each is read with the config getter of its
 * kind (so a typo is an unknown key with the closest argument, and print-config shows the
 * defaults), then the method is made from the arguments as JSON. */
static cm_status json_append(char *buf, size_t cap, size_t *len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static cm_status json_append(char *buf, size_t cap, size_t *len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= cap - *len) return cm_set_error(CM_ERR_INVALID_ARG, "algorithm arguments too long");
    *len += (size_t)k;
    return CM_OK;
}

static cm_status make_surgery(cm_config *c, const char *path, const char *key, cli_plugin_out *out) {
    const cm_algorithm_info *info = cm_algorithm_info_find(key);
    if (!info) return cm_set_error(CM_ERR_INTERNAL, "%s: not a surgery method", key);
    if (!info->n_args && cm_config_len(c, path) > 0) {
        char k[256];
        snprintf(k, sizeof k, "%s.%s", path, cm_config_key_at(c, path, 0));
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: unknown key '%s': %s takes no arguments (write %s: {})",
                            cm_config_origin(c, k), k, info->name, path);
    }
    cli_touch_entry(c, path);
    char json[2048], k[256];
    size_t len = 0;
    cm_status s = json_append(json, sizeof json, &len, "{");
    for (int i = 0; !s && i < info->n_args; i++) {
        const cm_algo_arg *a = cm_algorithm_info_arg(info, i);
        snprintf(k, sizeof k, "%s.%s", path, a->name);
        const char *sep = len > 1 ? "," : "";
        if (!a->def && !cm_config_has(c, k))
            return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s: required (%s's %s)", cm_config_origin(c, path), k,
                                info->name, a->name);
        switch (a->kind) {
        case CM_ALGO_ARG_BOOL: {
            bool v;
            if (!(s = cm_config_get_bool(c, k, a->def && !strcmp(a->def, "true"), &v)))
                s = json_append(json, sizeof json, &len, "%s\"%s\":%s", sep, a->name, v ? "true" : "false");
            break;
        }
        case CM_ALGO_ARG_INT: {
            int64_t v;
            if (!(s = cm_config_get_int(c, k, a->def ? strtoll(a->def, NULL, 10) : 0, &v)))
                s = json_append(json, sizeof json, &len, "%s\"%s\":%lld", sep, a->name, (long long)v);
            break;
        }
        case CM_ALGO_ARG_REAL: {
            double v;
            if (!(s = cm_config_get_double(c, k, a->def ? strtod(a->def, NULL) : 0, &v)))
                s = json_append(json, sizeof json, &len, "%s\"%s\":%.17g", sep, a->name, v);
            break;
        }
        case CM_ALGO_ARG_CHOICE: {
            int v;
            const bool null_def = a->def && !strcmp(a->def, "null");
            if (!(s = cm_config_get_choice(c, k, a->choices, a->n_choices, null_def ? NULL : a->def, &v))) {
                if (v < 0)
                    s = json_append(json, sizeof json, &len, "%s\"%s\":null", sep, a->name);
                else
                    s = json_append(json, sizeof json, &len, "%s\"%s\":\"%s\"", sep, a->name, a->choices[v]);
            }
            break;
        }
        case CM_ALGO_ARG_TIME: {
            const char *v;
            if (!(s = cm_config_get_string(c, k, a->def, &v)))
                s = json_append(json, sizeof json, &len, "%s\"%s\":\"%s\"", sep, a->name, v);
            break;
        }
        }
    }
    if (!s) s = json_append(json, sizeof json, &len, "}");
    if (!s && (s = cm_algorithm_new_from_json(info->name, json, &out->algorithm))) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "%s: %s: %s", cm_config_origin(c, path), path, msg);
    }
    return s;
}

#define SURGERY_ROW(key)                                                                           \
    static cm_status make_##key(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) { \
        (void)ctx;                                                                                 \
        return make_surgery(c, path, #key, out);                                                   \
    }
SURGERY_ROW(alibi)
SURGERY_ROW(blurpool)
SURGERY_ROW(channels_last)
SURGERY_ROW(ghost_batchnorm)
SURGERY_ROW(low_precision_layernorm)
SURGERY_ROW(low_precision_groupnorm)
SURGERY_ROW(squeeze_excite)
SURGERY_ROW(stochastic_depth)
SURGERY_ROW(factorize)
SURGERY_ROW(gated_linear_units)
SURGERY_ROW(gyro_dropout)
SURGERY_ROW(weight_standardization)
SURGERY_ROW(no_op_model)
#undef SURGERY_ROW

/* algorithms.fused_layernorm: {} — accepted (Composer's and llm-foundry's configs name it); every
 * LayerNorm here is the fused kernel already, which it logs once. */
static cm_status make_fused_layernorm(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    return make_surgery(c, path, "fused_layernorm", out);
}

/* The training methods (train_algos.h), with Composer's argument names and defaults. A null
 * value (`half_life: null`) is Composer's None. Constructor errors get the entry's origin. */
static cm_status at_entry(cm_config *c, const char *path, cm_status s) {
    if (!s) return s;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", cm_last_error());
    return cm_set_error(s, "%s: %s: %s", cm_config_origin(c, path), path, msg);
}

/* A string argument whose null means None: *out NULL for `key: null`, def when absent. */
static cm_status get_optional_string(cm_config *c, const char *key, const char *def, const char **out) {
    if (cm_config_kind_of(c, key) == CM_CONFIG_NULL) {
        cm_config_touch(c, key);
        *out = NULL;
        return CM_OK;
    }
    return cm_config_get_string(c, key, def, out);
}

/* A real argument whose null or absence means None (NaN). */
static cm_status get_optional_double(cm_config *c, const char *key, double *out) {
    *out = NAN;
    if (!cm_config_has(c, key)) {
        cm_config_touch(c, key);
        return CM_OK;
    }
    return cm_config_get_double(c, key, NAN, out);
}

#define AKEY(k) (snprintf(key, sizeof key, "%s." k, path), key)

/* algorithms.ema: {half_life: 1000ba, smoothing: null, ema_start: 0.0dur, update_interval: null} */
static cm_status make_ema(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    char key[256];
    cm_ema_config cfg = cm_ema_config_default();
    cm_status s;
    if ((s = get_optional_string(c, AKEY("half_life"), "1000ba", &cfg.half_life)) ||
        (s = get_optional_double(c, AKEY("smoothing"), &cfg.smoothing)) ||
        (s = cm_config_get_string(c, AKEY("ema_start"), "0.0dur", &cfg.ema_start)) ||
        (s = get_optional_string(c, AKEY("update_interval"), NULL, &cfg.update_interval)))
        return s;
    return at_entry(c, path, cm_ema_new(&cfg, NULL, &out->algorithm));
}

/* algorithms.swa: {swa_start: 0.7dur, swa_end: 0.97dur, update_interval: 1ep, schedule_swa_lr:
 * false, anneal_strategy: linear, anneal_steps: 10, swa_lr: null} */
static cm_status make_swa(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    char key[256];
    cm_swa_config cfg = cm_swa_config_default();
    int64_t steps;
    cm_status s;
    if ((s = cm_config_get_string(c, AKEY("swa_start"), cfg.swa_start, &cfg.swa_start)) ||
        (s = cm_config_get_string(c, AKEY("swa_end"), cfg.swa_end, &cfg.swa_end)) ||
        (s = cm_config_get_string(c, AKEY("update_interval"), cfg.update_interval, &cfg.update_interval)) ||
        (s = cm_config_get_bool(c, AKEY("schedule_swa_lr"), false, &cfg.schedule_swa_lr)) ||
        (s = cm_config_get_string(c, AKEY("anneal_strategy"), cfg.anneal_strategy, &cfg.anneal_strategy)) ||
        (s = cm_config_get_int(c, AKEY("anneal_steps"), cfg.anneal_steps, &steps)) ||
        (s = get_optional_double(c, AKEY("swa_lr"), &cfg.swa_lr)))
        return s;
    cfg.anneal_steps = steps;
    return at_entry(c, path, cm_swa_new(&cfg, &out->algorithm));
}

/* algorithms.sam: {rho: 0.05, epsilon: 1.0e-12, interval: 1} */
static cm_status make_sam(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    char key[256];
    cm_sam_config cfg = cm_sam_config_default();
    cm_status s;
    if ((s = cm_config_get_double(c, AKEY("rho"), cfg.rho, &cfg.rho)) ||
        (s = cm_config_get_double(c, AKEY("epsilon"), cfg.epsilon, &cfg.epsilon)) ||
        (s = cm_config_get_int(c, AKEY("interval"), cfg.interval, &cfg.interval)))
        return s;
    return at_entry(c, path, cm_sam_new(&cfg, &out->algorithm));
}

/* algorithms.layer_freezing: {freeze_start: 0.5, freeze_level: 1.0} */
static cm_status make_layer_freezing(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    char key[256];
    cm_layer_freezing_config cfg = cm_layer_freezing_config_default();
    cm_status s;
    if ((s = cm_config_get_double(c, AKEY("freeze_start"), cfg.freeze_start, &cfg.freeze_start)) ||
        (s = cm_config_get_double(c, AKEY("freeze_level"), cfg.freeze_level, &cfg.freeze_level)))
        return s;
    return at_entry(c, path, cm_layer_freezing_new(&cfg, &out->algorithm));
}
#undef AKEY

/* loggers.progress_bar: {} — the ProgressBarLogger, added unless the top-level progress_bar is
 * false (Composer adds its ProgressBarLogger for progress_bar: true). */
static cm_status make_progress_bar(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    cli_touch_entry(c, path);
    out->none = true;
    return CM_OK;
}

/* loggers.console: {log_interval: 1ep} — a ConsoleLogger printing Composer's blocks on stdout. */
static cm_status make_console(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    char key[256];
    snprintf(key, sizeof key, "%s.log_interval", path);
    cli_touch_entry(c, path);
    cm_status s = cm_config_get_time(c, key, "1ep", &ctx->console_log_interval);
    out->none = true;
    return s;
}

/* Callbacks (callbacks.h), with Composer's argument names. */
#define KEY(k) (snprintf(key, sizeof key, "%s." k, path), key)

static cm_status get_comp(cm_config *c, const char *key, cm_comp *out) {
    const char *v;
    cm_status s = cm_config_get_string(c, key, "auto", &v);
    if (!s && (s = cm_comp_parse(v, out))) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "%s: %s: %s", cm_config_origin(c, key), key, msg);
    }
    return s;
}

static cm_status get_wall_unit(cm_config *c, const char *key, cm_wall_unit *out) {
    const char *v;
    cm_status s = cm_config_get_string(c, key, "hours", &v);
    if (!s && (s = cm_wall_unit_parse(v, out))) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "%s: %s: %s", cm_config_origin(c, key), key, msg);
    }
    return s;
}

/* callbacks.speed_monitor: {window_size: 100, peak_flops: 0 (measure), time_unit: hours} */
static cm_status make_speed_monitor(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    char key[256];
    cm_speed_monitor_config cfg = cm_speed_monitor_config_default();
    int64_t w;
    cm_status s;
    cli_touch_entry(c, path);
    if ((s = cm_config_get_int(c, KEY("window_size"), cfg.window_size, &w))) return s;
    cfg.window_size = (int)w;
    if ((s = cm_config_get_double(c, KEY("peak_flops"), cfg.peak_flops, &cfg.peak_flops))) return s;
    if ((s = get_wall_unit(c, KEY("time_unit"), &cfg.time_unit))) return s;
    return cm_speed_monitor_new(&cfg, &out->callback);
}

/* callbacks.lr_monitor: {} and callbacks.memory_monitor: {} */
static cm_status make_lr_monitor(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    cli_touch_entry(c, path);
    return cm_lr_monitor_new(&out->callback);
}

static cm_status make_memory_monitor(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    cli_touch_entry(c, path);
    return cm_memory_monitor_new(&out->callback);
}

/* callbacks.early_stopper: {monitor, dataloader_label: eval, comp: auto, min_delta: 0, patience: 1ep} */
static cm_status make_early_stopper(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    char key[256];
    cm_early_stopper_config cfg = cm_early_stopper_config_default();
    cm_status s;
    if ((s = cm_config_get_string(c, KEY("monitor"), NULL, &cfg.monitor))) return s;
    if ((s = cm_config_get_string(c, KEY("dataloader_label"), "eval", &cfg.dataloader_label))) return s;
    if ((s = get_comp(c, KEY("comp"), &cfg.comp))) return s;
    if ((s = cm_config_get_double(c, KEY("min_delta"), 0.0, &cfg.min_delta))) return s;
    if ((s = cm_config_get_time(c, KEY("patience"), "1ep", &cfg.patience))) return s;
    return cm_early_stopper_new(&cfg, &out->callback);
}

/* callbacks.threshold_stopper: {monitor, dataloader_label: eval, threshold, comp: auto, stop_on_batch: false} */
static cm_status make_threshold_stopper(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    char key[256];
    cm_threshold_stopper_config cfg = cm_threshold_stopper_config_default();
    cm_status s;
    if ((s = cm_config_get_string(c, KEY("monitor"), NULL, &cfg.monitor))) return s;
    if ((s = cm_config_get_string(c, KEY("dataloader_label"), "eval", &cfg.dataloader_label))) return s;
    if ((s = cm_config_get_double(c, KEY("threshold"), cfg.threshold, &cfg.threshold))) return s;
    if ((s = get_comp(c, KEY("comp"), &cfg.comp))) return s;
    if ((s = cm_config_get_bool(c, KEY("stop_on_batch"), false, &cfg.stop_on_batch))) return s;
    return cm_threshold_stopper_new(&cfg, &out->callback);
}

/* callbacks.runtime_estimator: {skip_batches: 1, time_unit: hours} */
static cm_status make_runtime_estimator(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    char key[256];
    cm_runtime_estimator_config cfg = cm_runtime_estimator_config_default();
    int64_t k;
    cm_status s;
    cli_touch_entry(c, path);
    if ((s = cm_config_get_int(c, KEY("skip_batches"), cfg.skip_batches, &k))) return s;
    cfg.skip_batches = (int)k;
    if ((s = get_wall_unit(c, KEY("time_unit"), &cfg.time_unit))) return s;
    return cm_runtime_estimator_new(&cfg, &out->callback);
}

/* callbacks.optimizer_monitor: {log_optimizer_metrics: true, batch_log_interval: 1} */
static cm_status make_optimizer_monitor(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    char key[256];
    cm_optimizer_monitor_config cfg = cm_optimizer_monitor_config_default();
    int64_t k;
    cm_status s;
    cli_touch_entry(c, path);
    if ((s = cm_config_get_bool(c, KEY("log_optimizer_metrics"), true, &cfg.log_optimizer_metrics))) return s;
    if ((s = cm_config_get_int(c, KEY("batch_log_interval"), cfg.batch_log_interval, &k))) return s;
    cfg.batch_log_interval = (int)k;
    return cm_optimizer_monitor_new(&cfg, &out->callback);
}
/* callbacks.hf_checkpointer: {save_folder, save_interval: 1dur, huggingface_folder_name: ba{batch}}
 * (llm-foundry's HuggingFaceCheckpointer), for model.name: hf */
static cm_status make_hf_checkpointer(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    char key[256];
    cm_hf_checkpointer_config cfg = cm_hf_checkpointer_config_default();
    cm_status s;
    if ((s = cm_config_get_string(c, KEY("save_folder"), NULL, &cfg.save_folder))) return s;
    if (!cfg.save_folder)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s: required: where to write the pretrained folders "
                                                "(<save_folder>/huggingface/<huggingface_folder_name>)",
                            cm_config_origin(c, path), key);
    if ((s = cm_config_get_time(c, KEY("save_interval"), "1dur", &cfg.save_interval))) return s;
    if ((s = cm_config_get_string(c, KEY("huggingface_folder_name"), cfg.huggingface_folder_name,
                                  &cfg.huggingface_folder_name)))
        return s;
    if (ctx->full_shard)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s: not with FULL_SHARD (the parameters are sharded at rest); "
                                                "export a checkpoint instead (composer ckpt export --hf)",
                            cm_config_origin(c, path), path);
    cfg.model = ctx->model;
    cfg.tokenizer = ctx->tok;
    cfg.model_max_length = ctx->model_max_length;
    if ((s = cm_hf_checkpointer_new(&cfg, &out->callback))) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "%s: %s: %s", cm_config_origin(c, path), path, msg);
    }
    return CM_OK;
}
#undef KEY

const cli_plugin_entry cli_plugin_registry[] = {
    {"gradient_clipping", CLI_ALGORITHM, make_gradient_clipping,
     "GradientClipping: clipping_type (norm, value, adaptive; norm), clipping_threshold (1.0)"},
    {"alibi", CLI_ALGORITHM, make_alibi,
     "Alibi: max_sequence_length (required), train_sequence_length_scaling (0.25; only 1 for now)"},
    {"blurpool", CLI_ALGORITHM, make_blurpool,
     "BlurPool: replace_convs (true), replace_maxpools (true), blur_first (true), min_channels (16)"},
    {"channels_last", CLI_ALGORITHM, make_channels_last, "ChannelsLast: no arguments"},
    {"factorize", CLI_ALGORITHM, make_factorize,
     "Factorize: factorize_convs (true), factorize_linears (true), min_channels (256), latent_channels (0.25), "
     "min_features (256), latent_features (128)"},
    {"fused_layernorm", CLI_ALGORITHM, make_fused_layernorm, "FusedLayerNorm: built in (every LayerNorm is fused)"},
    {"gated_linear_units", CLI_ALGORITHM, make_gated_linear_units,
     "GatedLinearUnits: act_fn (null: the model's; relu, gelu, gelu_tanh, silu, tanh, sigmoid, identity), "
     "gated_layer_bias (false), non_gated_layer_bias (false)"},
    {"gyro_dropout", CLI_ALGORITHM, make_gyro_dropout, "GyroDropout: p (0.5), sigma (256), tau (16)"},
    {"ghost_batchnorm", CLI_ALGORITHM, make_ghost_batchnorm, "GhostBatchNorm: ghost_batch_size (32)"},
    {"low_precision_groupnorm", CLI_ALGORITHM, make_low_precision_groupnorm,
     "LowPrecisionGroupNorm: apply_at (init, before_load, after_load; init)"},
    {"low_precision_layernorm", CLI_ALGORITHM, make_low_precision_layernorm,
     "LowPrecisionLayerNorm: apply_at (init, before_load, after_load; init)"},
    {"no_op_model", CLI_ALGORITHM, make_no_op_model, "NoOpModel: no arguments (the model becomes a no-op)"},
    {"squeeze_excite", CLI_ALGORITHM, make_squeeze_excite, "SqueezeExcite: latent_channels (64), min_channels (128)"},
    {"stochastic_depth", CLI_ALGORITHM, make_stochastic_depth,
     "StochasticDepth: target_layer_name (ResNetBottleneck, ResNetBasicBlock; required), stochastic_method "
     "(block, sample; block), drop_rate (0.2), drop_distribution (uniform, linear; linear), drop_warmup (0dur)"},
    {"weight_standardization", CLI_ALGORITHM, make_weight_standardization,
     "WeightStandardization: n_last_layers_ignore (0)"},
    {"mixup", CLI_ALGORITHM, cli_make_mixup, "MixUp: alpha (0.2), interpolate_loss (false), input_key, target_key"},
    {"cutmix", CLI_ALGORITHM, cli_make_cutmix,
     "CutMix: alpha (1.0), interpolate_loss (false), uniform_sampling (false), input_key, target_key"},
    {"cutout", CLI_ALGORITHM, cli_make_cutout, "CutOut: num_holes (1), length (0.5), uniform_sampling (false), input_key"},
    {"label_smoothing", CLI_ALGORITHM, cli_make_label_smoothing, "LabelSmoothing: smoothing (0.1), target_key"},
    {"progressive_resizing", CLI_ALGORITHM, cli_make_progressive_resizing,
     "ProgressiveResizing: mode (resize, crop; resize), initial_scale (0.5), finetune_fraction (0.2), delay_fraction "
     "(0.5), size_increment (4), resize_targets (false), input_key, target_key"},
    {"seq_length_warmup", CLI_ALGORITHM, cli_make_seq_length_warmup,
     "SeqLengthWarmup: duration (0.3), min_seq_length (8), max_seq_length (1024), step_size (8), truncate (true), "
     "preserve_end_of_sequence (false)"},
    {"selective_backprop", CLI_ALGORITHM, cli_make_selective_backprop,
     "SelectiveBackprop: start (0.5), end (0.9), keep (0.5), scale_factor (1.0), interrupt (2), input_key, target_key"},
    {"colout", CLI_ALGORITHM, cli_make_colout,
     "ColOut: p_row (0.15), p_col (0.15), batch (true), resize_target (auto, true, false; auto), input_key, target_key"},
    {"randaugment", CLI_ALGORITHM, cli_make_randaugment,
     "RandAugment (in the train image dataset): severity (9), depth (2), augmentation_set (all, safe, original; all)"},
    {"augmix", CLI_ALGORITHM, cli_make_augmix,
     "AugMix (in the train image dataset): severity (3), depth (-1), width (3), alpha (1.0), augmentation_set (all)"},
    {"ema", CLI_ALGORITHM, make_ema,
     "EMA: half_life (1000ba; null to use smoothing), smoothing (null), ema_start (0.0dur), update_interval (null)"},
    {"swa", CLI_ALGORITHM, make_swa,
     "SWA: swa_start (0.7dur), swa_end (0.97dur), update_interval (1ep), schedule_swa_lr (false), anneal_strategy "
     "(linear, cos), anneal_steps (10), swa_lr (null)"},
    {"sam", CLI_ALGORITHM, make_sam, "SAM: rho (0.05), epsilon (1.0e-12), interval (1)"},
    {"layer_freezing", CLI_ALGORITHM, make_layer_freezing, "LayerFreezing: freeze_start (0.5), freeze_level (1.0)"},
    {"progress_bar", CLI_LOGGER, make_progress_bar, "ProgressBarLogger on stderr (also top-level progress_bar: true)"},
    {"console", CLI_LOGGER, make_console, "ConsoleLogger: metric blocks on stdout every log_interval (1ep)"},
    {"speed_monitor", CLI_CALLBACK, make_speed_monitor,
     "SpeedMonitor: window_size (100), peak_flops (0: measured), time_unit (hours)"},
    {"lr_monitor", CLI_CALLBACK, make_lr_monitor, "LRMonitor: logs lr-<Optimizer>/group<i>"},
    {"memory_monitor", CLI_CALLBACK, make_memory_monitor, "MemoryMonitor: process RSS and arena use"},
    {"early_stopper", CLI_CALLBACK, make_early_stopper,
     "EarlyStopper: monitor, dataloader_label (eval), comp (auto), min_delta (0), patience (1ep)"},
    {"threshold_stopper", CLI_CALLBACK, make_threshold_stopper,
     "ThresholdStopper: monitor, dataloader_label (eval), threshold, comp (auto), stop_on_batch (false)"},
    {"runtime_estimator", CLI_CALLBACK, make_runtime_estimator,
     "RuntimeEstimator: skip_batches (1), time_unit (hours)"},
    {"optimizer_monitor", CLI_CALLBACK, make_optimizer_monitor,
     "OptimizerMonitor: log_optimizer_metrics (true), batch_log_interval (1)"},
    {"hf_checkpointer", CLI_CALLBACK, make_hf_checkpointer,
     "HuggingFaceCheckpointer: save_folder, save_interval (1dur), huggingface_folder_name (ba{batch}); model.name: hf"},
    {NULL, CLI_ALGORITHM, NULL, NULL},
};

static const char *kind_section(cli_plugin_kind k) {
    return k == CLI_ALGORITHM ? "algorithms" : k == CLI_CALLBACK ? "callbacks" : "loggers";
}

const cli_plugin_entry *cli_plugin_find(cm_config *c, const char *section, const char *name, cli_plugin_kind kind) {
    const char *names[64];
    int n = 0;
    for (const cli_plugin_entry *e = cli_plugin_registry; e->name; e++) {
        if (e->kind != kind) continue;
        if (strcasecmp(e->name, name) == 0) return e;
        if (n < 64) names[n++] = e->name;
    }
    char list[512] = "";
    for (int i = 0; i < n; i++) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", names[i]);
    char path[256];
    snprintf(path, sizeof path, "%s.%s", section, name);
    const char *near = cm_config_closest(name, names, n);
    cm_set_error(CM_ERR_INVALID_ARG, "%s: unknown %s '%s' (%s%s%savailable: %s)", cm_config_origin(c, path),
                 kind_section(kind), name, near ? "did you mean '" : "", near ? near : "", near ? "'? " : "",
                 n ? list : "none yet");
    return NULL;
}
