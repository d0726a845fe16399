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

cm_status cli_key_error(cm_config *c, const char *key, cm_status s, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *o = cm_config_origin(c, key);
    return cm_set_error(s, "%s%s%s: %s", o, *o ? ": " : "", key, msg);
}

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
void cli_touch_entry(cm_config *c, const char *path) { cm_config_mark_read(c, path); }

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
    cm_config_mark_read(c, path);
    out->none = true;
    return CM_OK;
}

/* loggers.console: {log_interval: 1ep} — a ConsoleLogger printing Composer's blocks on stdout. */
static cm_status make_console(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    char key[256];
    snprintf(key, sizeof key, "%s.log_interval", path);
    cm_config_mark_read(c, path);
    cm_status s = cm_config_get_time(c, key, "1ep", &ctx->console_log_interval);
    out->none = true;
    return s;
}

/* loggers.file: {flush_interval: 100, log_traces: false} — the run's FileLogger (metrics.jsonl and
 * loss.svg in the run folder), which the CLI always has; Composer's filename names its text log,
 * which here is the run folder's log.txt. */
static cm_status make_file(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    char key[256];
    cm_status s;
    cm_config_mark_read(c, path);
    snprintf(key, sizeof key, "%s.filename", path);
    if (cm_config_has(c, key))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s: the run's files are runs/<run_name>/metrics.jsonl and log.txt; "
                                                "set run_root and run_name to place them",
                            cm_config_origin(c, key), key);
    snprintf(key, sizeof key, "%s.flush_interval", path);
    if ((s = cm_config_get_int(c, key, 100, &ctx->file_flush_interval))) return s;
    if (ctx->file_flush_interval < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s: %lld must be at least 1 (batches)", cm_config_origin(c, key), key,
                            (long long)ctx->file_flush_interval);
    snprintf(key, sizeof key, "%s.log_traces", path);
    if ((s = cm_config_get_bool(c, key, false, &ctx->file_log_traces))) return s;
    out->none = true;
    return CM_OK;
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
    cm_config_mark_read(c, path);
    if ((s = cm_config_get_int(c, KEY("window_size"), cfg.window_size, &w))) return s;
    cfg.window_size = (int)w;
    if ((s = cm_config_get_double(c, KEY("peak_flops"), cfg.peak_flops, &cfg.peak_flops))) return s;
    if ((s = get_wall_unit(c, KEY("time_unit"), &cfg.time_unit))) return s;
    return cm_speed_monitor_new(&cfg, &out->callback);
}

/* callbacks.lr_monitor: {} and callbacks.memory_monitor: {} */
static cm_status make_lr_monitor(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    cm_config_mark_read(c, path);
    return cm_lr_monitor_new(&out->callback);
}

static cm_status make_memory_monitor(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    cm_config_mark_read(c, path);
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
    cm_config_mark_read(c, path);
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
    cm_config_mark_read(c, path);
    if ((s = cm_config_get_bool(c, KEY("log_optimizer_metrics"), true, &cfg.log_optimizer_metrics))) return s;
    if ((s = cm_config_get_int(c, KEY("batch_log_interval"), cfg.batch_log_interval, &k))) return s;
    cfg.batch_log_interval = (int)k;
    return cm_optimizer_monitor_new(&cfg, &out->callback);
}
/* Tracker loggers (loggers.h), with Composer's argument names. */

/* loggers.tensorboard: {log_dir: tensorboard_logs, flush_interval: 100, rank_zero_only: true,
 * histogram_interval: 0, histogram_params: true, histogram_grads: true, log_traces: false} */
static cm_status make_tensorboard(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    char key[256];
    cm_tensorboard_logger_config cfg = cm_tensorboard_logger_config_default();
    cm_status s;
    if ((s = cm_config_get_string(c, KEY("log_dir"), cfg.log_dir, &cfg.log_dir))) return s;
    if ((s = cm_config_get_int(c, KEY("flush_interval"), cfg.flush_interval, &cfg.flush_interval))) return s;
    if ((s = cm_config_get_bool(c, KEY("rank_zero_only"), cfg.rank_zero_only, &cfg.rank_zero_only))) return s;
    if ((s = cm_config_get_int(c, KEY("histogram_interval"), 0, &cfg.histogram_interval))) return s;
    if ((s = cm_config_get_bool(c, KEY("histogram_params"), true, &cfg.histogram_params))) return s;
    if ((s = cm_config_get_bool(c, KEY("histogram_grads"), true, &cfg.histogram_grads))) return s;
    if ((s = cm_config_get_bool(c, KEY("log_traces"), false, &cfg.log_traces))) return s;
    if ((s = cm_tensorboard_logger_new(&cfg, &out->logger))) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "%s: %s", cm_config_origin(c, path), msg);
    }
    return CM_OK;
}
/* A map of strings (`tags: {team: ml}`) as (key, value) pairs in a malloc'd array (*n pairs);
 * absent or null = none. */
static cm_status get_string_map(cm_config *c, const char *key, const char ***out, size_t *n) {
    *out = NULL, *n = 0;
    cm_config_kind k = cm_config_kind_of(c, key);
    if (k == CM_CONFIG_ABSENT || k == CM_CONFIG_NULL) {
        cm_config_touch(c, key);
        return CM_OK;
    }
    if (k != CM_CONFIG_MAP)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s: expected a map of names to values ({name: value, ...})",
                            cm_config_origin(c, key), key);
    const int len = cm_config_len(c, key);
    const char **p = calloc((size_t)(2 * len + 1), sizeof *p);
    if (!p) return cm_set_error(CM_ERR_OOM, "out of memory reading %s", key);
    for (int i = 0; i < len; i++) {
        char sub[512];
        p[2 * i] = cm_config_key_at(c, key, i);
        snprintf(sub, sizeof sub, "%s.%s", key, p[2 * i]);
        cm_status s = cm_config_get_string(c, sub, "", &p[2 * i + 1]);
        if (s) {
            free(p);
            return s;
        }
    }
    *out = p, *n = (size_t)len;
    return CM_OK;
}

/* A list of strings (or one string) in a malloc'd array; absent or null = none. */
static cm_status get_string_list(cm_config *c, const char *key, const char ***out, size_t *n) {
    *out = NULL, *n = 0;
    cm_config_kind k = cm_config_kind_of(c, key);
    if (k == CM_CONFIG_ABSENT || k == CM_CONFIG_NULL) {
        cm_config_touch(c, key);
        return CM_OK;
    }
    if (k == CM_CONFIG_MAP)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s: expected a list of names ([a, b*])", cm_config_origin(c, key),
                            key);
    const int len = k == CM_CONFIG_SEQ ? cm_config_len(c, key) : 1;
    const char **p = calloc((size_t)len + 1, sizeof *p);
    if (!p) return cm_set_error(CM_ERR_OOM, "out of memory reading %s", key);
    for (int i = 0; i < len; i++) {
        char sub[512];
        if (k == CM_CONFIG_SEQ) snprintf(sub, sizeof sub, "%s.%d", key, i);
        else snprintf(sub, sizeof sub, "%s", key);
        cm_status s = cm_config_get_string(c, sub, "", &p[i]);
        if (s) {
            free(p);
            return s;
        }
    }
    *out = p, *n = (size_t)len;
    return CM_OK;
}

/* Composer's MLFlowLogger arguments this logger accepts and that change nothing here. */
static cm_status accept_inert(cm_config *c, const char *path, const char *const *names, int n, const char *why) {
    char key[256];
    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof key, "%s.%s", path, names[i]);
        if (cm_config_has(c, key))
            cm_log_msg(CM_LOG_WARN, "%s: %s has no effect here (%s)", cm_config_origin(c, key), key, why);
        cm_config_touch(c, key);
    }
    return CM_OK;
}

/* loggers.mlflow: Composer's MLFlowLogger arguments — experiment_name, run_name, tags, tracking_uri,
 * rank_zero_only, flush_interval (s), rename_metrics, ignore_metrics, ignore_hyperparameters,
 * run_group, resume, log_duplicated_metric_every_n_steps — and the HTTP settings max_retries,
 * backoff_factor, request_timeout, close_timeout, max_queued. */
static cm_status make_mlflow(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    char key[256];
    cm_mlflow_logger_config cfg = cm_mlflow_logger_config_default();
    cm_status s;
    int64_t k;
    const char **tags = NULL, **ren = NULL, **ign = NULL, **ign_h = NULL;
    if ((s = cm_config_get_string(c, KEY("tracking_uri"), NULL, &cfg.tracking_uri)) ||
        (s = cm_config_get_string(c, KEY("experiment_name"), NULL, &cfg.experiment_name)) ||
        (s = cm_config_get_string(c, KEY("run_name"), NULL, &cfg.run_name)) ||
        (s = cm_config_get_string(c, KEY("run_group"), NULL, &cfg.run_group)) ||
        (s = cm_config_get_bool(c, KEY("rank_zero_only"), true, &cfg.rank_zero_only)) ||
        (s = cm_config_get_double(c, KEY("flush_interval"), cfg.flush_interval, &cfg.flush_interval)) ||
        (s = cm_config_get_bool(c, KEY("resume"), false, &cfg.resume)) ||
        (s = cm_config_get_int(c, KEY("log_duplicated_metric_every_n_steps"), cfg.log_duplicated_metric_every_n_steps,
                               &cfg.log_duplicated_metric_every_n_steps)) ||
        (s = cm_config_get_int(c, KEY("max_retries"), -1, &k)))
        return s;
    cfg.max_retries = (int)(k < -1 ? -1 : k > 1000 ? 1000 : k);
    if ((s = cm_config_get_double(c, KEY("backoff_factor"), -1, &cfg.backoff_factor)) ||
        (s = cm_config_get_double(c, KEY("request_timeout"), 0, &cfg.request_timeout)) ||
        (s = cm_config_get_double(c, KEY("close_timeout"), cfg.close_timeout, &cfg.close_timeout)) ||
        (s = cm_config_get_int(c, KEY("max_queued"), cfg.max_queued, &cfg.max_queued)))
        return s;
    static const char *const inert[] = {"synchronous", "log_system_metrics", "logging_buffer_seconds",
                                        "model_registry_prefix", "model_registry_uri"};
    accept_inert(c, path, inert, 5, "this logger always sends from its own thread, and logs no system metrics or "
                                    "models");
    if (!(s = get_string_map(c, KEY("tags"), &tags, &cfg.n_tags)) &&
        !(s = get_string_map(c, KEY("rename_metrics"), &ren, &cfg.n_rename)) &&
        !(s = get_string_list(c, KEY("ignore_metrics"), &ign, &cfg.n_ignore_metrics)) &&
        !(s = get_string_list(c, KEY("ignore_hyperparameters"), &ign_h, &cfg.n_ignore_hyperparameters))) {
        cfg.tags = tags, cfg.rename_metrics = ren, cfg.ignore_metrics = ign, cfg.ignore_hyperparameters = ign_h;
        if ((s = cm_mlflow_logger_new(&cfg, &out->logger))) {
            char msg[768];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            s = cm_set_error(s, "%s: %s: %s", cm_config_origin(c, path), path, msg);
        }
    }
    free(tags), free(ren), free(ign), free(ign_h);
    return s;
}
/* loggers.wandb: Composer's WandBLogger arguments — project, group, name, entity, tags,
 * rank_zero_only, log_artifacts (not supported: a warning), init_kwargs {mode, dir, notes,
 * job_type, id} (wandb.init's; also accepted at the top level) — and flush_interval, max_retries,
 * backoff_s, request_timeout, close_timeout, max_queued. */
static cm_status make_wandb(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    char key[256];
    cm_wandb_logger_config cfg = cm_wandb_logger_config_default();
    cm_status s;
    int64_t k;
    bool artifacts;
    const char **tags = NULL;
    if ((s = cm_config_get_string(c, KEY("project"), NULL, &cfg.project)) ||
        (s = cm_config_get_string(c, KEY("entity"), NULL, &cfg.entity)) ||
        (s = cm_config_get_string(c, KEY("name"), NULL, &cfg.name)) ||
        (s = cm_config_get_string(c, KEY("group"), NULL, &cfg.group)) ||
        (s = cm_config_get_bool(c, KEY("rank_zero_only"), true, &cfg.rank_zero_only)) ||
        (s = cm_config_get_bool(c, KEY("log_artifacts"), false, &artifacts)) ||
        (s = cm_config_get_double(c, KEY("flush_interval"), cfg.flush_interval, &cfg.flush_interval)) ||
        (s = cm_config_get_int(c, KEY("max_retries"), cfg.max_retries, &k)))
        return s;
    cfg.max_retries = (int)(k < -1 ? -1 : k > 1000 ? 1000 : k);
    if ((s = cm_config_get_double(c, KEY("backoff_s"), cfg.backoff_s, &cfg.backoff_s)) ||
        (s = cm_config_get_double(c, KEY("request_timeout"), cfg.request_timeout, &cfg.request_timeout)) ||
        (s = cm_config_get_double(c, KEY("close_timeout"), cfg.close_timeout, &cfg.close_timeout)) ||
        (s = cm_config_get_int(c, KEY("max_queued"), cfg.max_queued, &cfg.max_queued)))
        return s;
    if (artifacts)
        cm_log_msg(CM_LOG_WARN, "%s: %s.log_artifacts: artifacts are not uploaded by this WandBLogger",
                   cm_config_origin(c, KEY("log_artifacts")), path);
    /* wandb.init's settings, at the top level or in init_kwargs (Composer's way) */
    static const char *const modes[] = {"online", "offline", "disabled", "dryrun"};
    const char *sub[2] = {path, NULL};
    char kw[256];
    snprintf(kw, sizeof kw, "%s.init_kwargs", path);
    if (cm_config_kind_of(c, kw) == CM_CONFIG_MAP) sub[1] = kw;
    else cm_config_touch(c, kw);
    for (int i = 0; i < 2 && sub[i]; i++) {
        char p[320];
        int mode;
        snprintf(p, sizeof p, "%s.mode", sub[i]);
        if ((s = cm_config_get_choice(c, p, modes, 4, NULL, &mode))) return s;
        if (mode >= 0) cfg.mode = mode == 3 ? CM_WANDB_OFFLINE : mode;
        const char **fields[] = {&cfg.dir, &cfg.notes, &cfg.job_type, &cfg.id};
        const char *names[] = {"dir", "notes", "job_type", "id"};
        for (int f = 0; f < 4; f++) {
            const char *v = NULL;
            snprintf(p, sizeof p, "%s.%s", sub[i], names[f]);
            if ((s = cm_config_get_string(c, p, NULL, &v))) return s;
            if (v) *fields[f] = v;
        }
        if (i == 1) {
            const char *pv = NULL;
            static const char *const alias[][2] = {{"project", "project"}, {"entity", "entity"}, {"name", "name"},
                                                   {"group", "group"}};
            for (int a = 0; a < 4; a++) {
                snprintf(p, sizeof p, "%s.%s", sub[i], alias[a][0]);
                if ((s = cm_config_get_string(c, p, NULL, &pv))) return s;
                if (pv && a == 0 && !cfg.project) cfg.project = pv;
                if (pv && a == 1 && !cfg.entity) cfg.entity = pv;
                if (pv && a == 2 && !cfg.name) cfg.name = pv;
                if (pv && a == 3 && !cfg.group) cfg.group = pv;
            }
        }
    }
    if ((s = get_string_list(c, KEY("tags"), &tags, &cfg.n_tags))) return s;
    cfg.tags = tags;
    if ((s = cm_wandb_logger_new(&cfg, &out->logger))) {
        char msg[768];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        s = cm_set_error(s, "%s: %s: %s", cm_config_origin(c, path), path, msg);
    }
    free(tags);
    return s;
}

/* A list of strings under key (a scalar counts as one), into out (cap entries; borrowed). */
static cm_status get_strings(cm_config *c, const char *key, const char **out, int cap, int *n) {
    *n = 0;
    const cm_config_kind k = cm_config_kind_of(c, key);
    if (k == CM_CONFIG_ABSENT || k == CM_CONFIG_NULL) {
        cm_config_touch(c, key);
        return CM_OK;
    }
    if (k == CM_CONFIG_SCALAR) {
        *n = 1;
        return cm_config_get_string(c, key, NULL, &out[0]);
    }
    if (k != CM_CONFIG_SEQ)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s: expected a list of strings", cm_config_origin(c, key), key);
    const int len = cm_config_len(c, key);
    if (len > cap) return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s: at most %d entries", cm_config_origin(c, key), key, cap);
    for (int i = 0; i < len; i++) {
        char ki[300];
        snprintf(ki, sizeof ki, "%s.%d", key, i);
        cm_status s = cm_config_get_string(c, ki, "", &out[i]);
        if (s) return s;
    }
    *n = len;
    cm_config_touch(c, key);
    return CM_OK;
}

/* A folder default under the run folder: <run_root>/{run_name}/<sub>. */
static const char *run_sub(const cli_ctx *ctx, const char *sub, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/{run_name}/%s", ctx->run_root ? ctx->run_root : CM_RUN_ROOT_DEFAULT, sub);
    return buf;
}

/* Prefixes the current error with the config origin of `path`; a value the library does not
 * support is a config error (exit status 2) like any other bad value. */
static cm_status at(cm_config *c, const char *path, cm_status s) {
    char msg[768];
    snprintf(msg, sizeof msg, "%s", cm_last_error());
    return cm_set_error(s == CM_ERR_UNSUPPORTED ? CM_ERR_INVALID_ARG : s, "%s: %s: %s", cm_config_origin(c, path), path,
                        msg);
}

/* callbacks.nan_monitor: {on_nan: error | rollback, max_rollbacks: 5} */
static cm_status make_nan_monitor(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    char key[256];
    cm_nan_monitor_config cfg = cm_nan_monitor_config_default();
    static const char *const actions[] = {"error", "rollback"};
    int a;
    int64_t k;
    cm_status s;
    cm_config_mark_read(c, path);
    if ((s = cm_config_get_choice(c, KEY("on_nan"), actions, 2, "error", &a))) return s;
    cfg.on_nan = (cm_nan_action)a;
    if ((s = cm_config_get_int(c, KEY("max_rollbacks"), cfg.max_rollbacks, &k))) return s;
    cfg.max_rollbacks = (int)k;
    if ((s = cm_nan_monitor_new(&cfg, &out->callback))) return at(c, path, s);
    return CM_OK;
}

/* callbacks.system_metrics_monitor: {log_all_data: false, interval: 1} */
static cm_status make_system_metrics_monitor(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    char key[256];
    cm_system_metrics_monitor_config cfg = cm_system_metrics_monitor_config_default();
    int64_t k;
    cm_status s;
    cm_config_mark_read(c, path);
    if ((s = cm_config_get_bool(c, KEY("log_all_data"), false, &cfg.log_all_data))) return s;
    if ((s = cm_config_get_int(c, KEY("interval"), 1, &k))) return s;
    cfg.interval = (int)k;
    if ((s = cm_system_metrics_monitor_new(&cfg, &out->callback))) return at(c, path, s);
    return CM_OK;
}

/* callbacks.free_outputs: {} */
static cm_status make_free_outputs(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    cm_config_mark_read(c, path);
    return cm_free_outputs_new(&out->callback);
}

/* callbacks.activation_monitor: {interval: 25ba, ignore_module_types: [...], only_log_wandb: true} */
static cm_status make_activation_monitor(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    char key[256];
    cm_activation_monitor_config cfg = cm_activation_monitor_config_default();
    const char *ignore[32];
    int n;
    cm_status s;
    cm_config_mark_read(c, path);
    if ((s = cm_config_get_time(c, KEY("interval"), "25ba", &cfg.interval)) ||
        (s = get_strings(c, KEY("ignore_module_types"), ignore, 32, &n)) ||
        (s = cm_config_get_bool(c, KEY("only_log_wandb"), true, &cfg.only_log_wandb)))
        return s;
    cfg.ignore_module_types = ignore, cfg.n_ignore_module_types = n;
    if ((s = cm_activation_monitor_new(&cfg, &out->callback))) return at(c, path, s);
    return CM_OK;
}

/* callbacks.generate: {prompts: [...], interval: 100ba, max_new_tokens: 100, do_sample: false,
 * temperature: 1.0, top_k: 0, top_p: 1.0, seed: 42} (Composer's Generate and its generate kwargs) */
static cm_status make_generate(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    char key[256];
    cm_generate_config cfg = cm_generate_config_default();
    const char *prompts[64];
    int n;
    bool sample;
    double temp, top_p;
    int64_t k;
    cm_status s;
    if ((s = get_strings(c, KEY("prompts"), prompts, 64, &n))) return s;
    if (!n)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s.prompts: required (a list of strings)", cm_config_origin(c, path),
                            path);
    if ((s = cm_config_get_time(c, KEY("interval"), NULL, &cfg.interval))) return s;
    if (cfg.interval.count == 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s.interval: required (e.g. 100ba)", cm_config_origin(c, path), path);
    if ((s = cm_config_get_int(c, KEY("max_new_tokens"), 100, &cfg.max_new_tokens)) ||
        (s = cm_config_get_bool(c, KEY("do_sample"), false, &sample)) ||
        (s = cm_config_get_double(c, KEY("temperature"), 1.0, &temp)) ||
        (s = cm_config_get_int(c, KEY("top_k"), 0, &cfg.top_k)) ||
        (s = cm_config_get_double(c, KEY("top_p"), 1.0, &top_p)) || (s = cm_config_get_int(c, KEY("seed"), 42, &k)))
        return s;
    cfg.temperature = sample ? (float)temp : 0.0f; /* Hugging Face: greedy unless do_sample */
    cfg.top_p = (float)top_p;
    cfg.seed = (uint64_t)k;
    cfg.prompts = prompts, cfg.n_prompts = n;
    cfg.tokenizer = ctx->tok;
    if (!cfg.tokenizer)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s: no tokenizer (a GPT on token data with a tokenizer.json next "
                                                "to it)", cm_config_origin(c, path), path);
    if ((s = cm_generate_new(&cfg, &out->callback))) return at(c, path, s);
    return CM_OK;
}

/* callbacks.image_visualizer: {interval: 100ba, mode: input, num_images: 8, channels_last: false,
 * input_key: 0, target_key: 1, folder} */
static cm_status make_image_visualizer(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    char key[256], def[512];
    cm_image_visualizer_config cfg = cm_image_visualizer_config_default();
    int64_t n, ik, tk;
    cm_status s;
    cm_config_mark_read(c, path);
    if ((s = cm_config_get_time(c, KEY("interval"), "100ba", &cfg.interval)) ||
        (s = cm_config_get_string(c, KEY("mode"), "input", &cfg.mode)) ||
        (s = cm_config_get_int(c, KEY("num_images"), 8, &n)) ||
        (s = cm_config_get_bool(c, KEY("channels_last"), false, &cfg.channels_last)) ||
        (s = cm_config_get_int(c, KEY("input_key"), 0, &ik)) || (s = cm_config_get_int(c, KEY("target_key"), 1, &tk)) ||
        (s = cm_config_get_string(c, KEY("folder"), run_sub(ctx, "images", def, sizeof def), &cfg.folder)))
        return s;
    cfg.num_images = (int)n, cfg.input_key = (int)ik, cfg.target_key = (int)tk;
    if ((s = cm_image_visualizer_new(&cfg, &out->callback))) return at(c, path, s);
    return CM_OK;
}

/* callbacks.memory_snapshot: {skip_batches: 1, interval: 3ba, max_entries: 100000, folder, filename,
 * overwrite: false} */
static cm_status make_memory_snapshot(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    char key[256], def[512];
    cm_memory_snapshot_config cfg = cm_memory_snapshot_config_default();
    int64_t skip, max;
    cm_status s;
    cm_config_mark_read(c, path);
    if ((s = cm_config_get_int(c, KEY("skip_batches"), 1, &skip)) ||
        (s = cm_config_get_time(c, KEY("interval"), "3ba", &cfg.interval)) ||
        (s = cm_config_get_int(c, KEY("max_entries"), 100000, &max)) ||
        (s = cm_config_get_string(c, KEY("folder"), run_sub(ctx, "memory_traces", def, sizeof def), &cfg.folder)) ||
        (s = cm_config_get_string(c, KEY("filename"), cfg.filename, &cfg.filename)) ||
        (s = cm_config_get_bool(c, KEY("overwrite"), false, &cfg.overwrite)))
        return s;
    cfg.skip_batches = (int)skip, cfg.max_entries = (int)max;
    if ((s = cm_memory_snapshot_new(&cfg, &out->callback))) return at(c, path, s);
    return CM_OK;
}

/* callbacks.oom_observer: {folder, filename: rank{rank}_oom, max_entries: 100000} */
static cm_status make_oom_observer(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    char key[256], def[512];
    cm_oom_observer_config cfg = cm_oom_observer_config_default();
    int64_t max;
    cm_status s;
    cm_config_mark_read(c, path);
    if ((s = cm_config_get_string(c, KEY("folder"), run_sub(ctx, "traces", def, sizeof def), &cfg.folder)) ||
        (s = cm_config_get_string(c, KEY("filename"), cfg.filename, &cfg.filename)) ||
        (s = cm_config_get_int(c, KEY("max_entries"), 100000, &max)))
        return s;
    cfg.max_entries = (int)max;
    if ((s = cm_oom_observer_new(&cfg, &out->callback))) return at(c, path, s);
    return CM_OK;
}

/* callbacks.export_for_inference: {save_format: c, save_path (default: the run folder's export/)} */
static cm_status make_export_for_inference(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    char key[256], def[512];
    cm_export_for_inference_config cfg = cm_export_for_inference_config_default();
    const char *sp;
    cm_status s;
    cm_config_mark_read(c, path);
    if ((s = cm_config_get_string(c, KEY("save_format"), "c", &cfg.save_format)) ||
        (s = cm_config_get_string(c, KEY("save_path"), NULL, &sp)))
        return s;
    if (!sp) sp = run_sub(ctx, "export", def, sizeof def);
    cfg.save_path = sp;
    if ((s = cm_export_for_inference_new(&cfg, &out->callback))) return at(c, path, s);
    return CM_OK;
}

/* callbacks.load_checkpoint: {load_path, event: before_load, strict_model_weights: true,
 * ignore_keys: [...]} (of Composer's load_options, the model's weights) */
static cm_status make_load_checkpoint(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    char key[256];
    cm_load_checkpoint_config cfg = cm_load_checkpoint_config_default();
    const char *ev, *ignore[32];
    int n;
    cm_status s;
    if ((s = cm_config_get_string(c, KEY("load_path"), NULL, &cfg.load_path))) return s;
    if (!cfg.load_path)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s.load_path: required (a checkpoint folder or .safetensors)",
                            cm_config_origin(c, path), path);
    if ((s = cm_config_get_string(c, KEY("event"), "before_load", &ev))) return s;
    if ((s = cm_event_parse(ev, &cfg.event))) return at(c, KEY("event"), s);
    if ((s = cm_config_get_bool(c, KEY("strict_model_weights"), true, &cfg.strict_model_weights)) ||
        (s = get_strings(c, KEY("ignore_keys"), ignore, 32, &n)))
        return s;
    cfg.ignore_keys = ignore, cfg.n_ignore_keys = n;
    if ((s = cm_load_checkpoint_new(&cfg, &out->callback))) return at(c, path, s);
    return CM_OK;
}

/* callbacks.checkpoint_saver: {folder, filename, latest_filename, save_interval: 1ep, weights_only,
 * num_checkpoints_to_keep: -1, overwrite} — the trainer's own saver, set up from these */
static cm_status make_checkpoint_saver(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    char key[256];
    cm_checkpoint_saver_config cfg = cm_checkpoint_saver_config_default();
    int64_t keep;
    cm_status s;
    cm_config_mark_read(c, path);
    if (cm_config_has(c, "save_folder"))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s: save_folder is set too; keep one of them",
                            cm_config_origin(c, path), path);
    if ((s = cm_config_get_string(c, KEY("folder"), cfg.folder, &cfg.folder)) ||
        (s = cm_config_get_string(c, KEY("filename"), cfg.filename, &cfg.filename)) ||
        (s = cm_config_get_string(c, KEY("latest_filename"), cfg.latest_filename, &cfg.latest_filename)) ||
        (s = cm_config_get_time(c, KEY("save_interval"), "1ep", &cfg.save_interval)) ||
        (s = cm_config_get_bool(c, KEY("weights_only"), false, &cfg.weights_only)) ||
        (s = cm_config_get_int(c, KEY("num_checkpoints_to_keep"), -1, &keep)) ||
        (s = cm_config_get_bool(c, KEY("overwrite"), false, &cfg.overwrite)))
        return s;
    cfg.num_checkpoints_to_keep = (int)keep;
    if (cfg.num_checkpoints_to_keep < -1 || cfg.num_checkpoints_to_keep == 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s.num_checkpoints_to_keep: %d (use -1 for all, or >= 1)",
                            cm_config_origin(c, path), path, cfg.num_checkpoints_to_keep);
    ctx->saver = cfg;
    ctx->has_saver = true;
    out->none = true;
    return CM_OK;
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
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s: not with FULL_SHARD or HYBRID_SHARD (the parameters are sharded at rest); "
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

/* ---------------------------------------------------------------------------------------------
 * The profiler (top-level key, as llm-foundry's build_profiler)
 * ------------------------------------------------------------------------------------------- */

cm_status cli_profiler_make(cm_config *c, const char *run_root, bool autoresume, bool summary, cm_callback_plugin *out,
                            bool *present) {
    *present = false;
    *out = (cm_callback_plugin){0};
    cm_config_kind k = cm_config_kind_of(c, "profiler");
    if (k == CM_CONFIG_ABSENT || k == CM_CONFIG_NULL) {
        cm_config_touch(c, "profiler");
        return CM_OK;
    }
    if (k != CM_CONFIG_MAP)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: profiler: expected a map ({schedule: {...}, json_trace_handler: "
                                                "{...}})", cm_config_origin(c, "profiler"));
    cm_config_mark_read(c, "profiler");
    cm_profiler_config pc = cm_profiler_config_default();
    cm_status s;
    struct {
        const char *key;
        int64_t *v;
    } sched[] = {{"profiler.schedule.skip_first", &pc.schedule.skip_first}, {"profiler.schedule.wait", &pc.schedule.wait},
                 {"profiler.schedule.warmup", &pc.schedule.warmup}, {"profiler.schedule.active", &pc.schedule.active},
                 {"profiler.schedule.repeat", &pc.schedule.repeat}};
    cm_config_mark_read(c, "profiler.schedule");
    for (size_t i = 0; i < sizeof sched / sizeof *sched; i++)
        if ((s = cm_config_get_int(c, sched[i].key, *sched[i].v, sched[i].v))) return s;
    if ((s = cm_cyclic_schedule_check(&pc.schedule))) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "%s: profiler.schedule: %s", cm_config_origin(c, "profiler.schedule"), msg);
    }
    if ((s = cm_config_get_bool(c, "profiler.sys_prof_cpu", pc.sys_prof_cpu, &pc.sys_prof_cpu)) ||
        (s = cm_config_get_bool(c, "profiler.sys_prof_memory", pc.sys_prof_memory, &pc.sys_prof_memory)) ||
        (s = cm_config_get_bool(c, "profiler.sys_prof_disk", pc.sys_prof_disk, &pc.sys_prof_disk)) ||
        (s = cm_config_get_bool(c, "profiler.sys_prof_net", pc.sys_prof_net, &pc.sys_prof_net)) ||
        (s = cm_config_get_double(c, "profiler.sys_prof_stats_thread_interval_seconds",
                                  pc.sys_prof_stats_thread_interval_seconds, &pc.sys_prof_stats_thread_interval_seconds)) ||
        (s = cm_config_get_bool(c, "profiler.record_ops", pc.record_ops, &pc.record_ops)))
        return s;
    int64_t rows;
    if ((s = cm_config_get_int(c, "profiler.summary_row_limit", pc.summary_row_limit, &rows))) return s;
    pc.summary_row_limit = (int)rows;
    pc.summary_stream = summary ? stdout : NULL;
    /* the JSON trace handler, into the run folder unless told otherwise */
    cm_trace_handler th = {0};
    const cm_config_kind jk = cm_config_kind_of(c, "profiler.json_trace_handler");
    cm_config_mark_read(c, "profiler.json_trace_handler");
    if (jk != CM_CONFIG_NULL) {
        cm_json_trace_handler_config jc = cm_json_trace_handler_config_default();
        char folder[1024];
        snprintf(folder, sizeof folder, "%s/{run_name}/traces", run_root ? run_root : CM_RUN_ROOT_DEFAULT);
        int64_t keep;
        const char *merged = jc.merged_trace_filename;
        if ((s = cm_config_get_string(c, "profiler.json_trace_handler.folder", folder, &jc.folder)) ||
            (s = cm_config_get_string(c, "profiler.json_trace_handler.filename", jc.filename, &jc.filename)) ||
            (s = cm_config_get_bool(c, "profiler.json_trace_handler.overwrite", autoresume, &jc.overwrite)) ||
            (s = cm_config_get_int(c, "profiler.json_trace_handler.num_traces_to_keep", -1, &keep)))
            return s;
        if (cm_config_kind_of(c, "profiler.json_trace_handler.merged_trace_filename") == CM_CONFIG_NULL) {
            cm_config_touch(c, "profiler.json_trace_handler.merged_trace_filename");
            merged = NULL;
        } else if ((s = cm_config_get_string(c, "profiler.json_trace_handler.merged_trace_filename", merged, &merged))) {
            return s;
        }
        jc.merged_trace_filename = merged;
        jc.num_traces_to_keep = (int)keep;
        if ((s = cm_json_trace_handler_new(&jc, &th))) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            return cm_set_error(s, "%s: profiler.json_trace_handler: %s",
                                cm_config_origin(c, "profiler.json_trace_handler"), msg);
        }
        pc.trace_handlers = &th, pc.n_trace_handlers = 1;
    }
    cm_profiler *prof;
    if ((s = cm_profiler_new(&pc, &prof, out))) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        cm_trace_handler_free(th);
        return cm_set_error(s, "%s: profiler: %s", cm_config_origin(c, "profiler"), msg);
    }
    *present = true;
    return CM_OK;
}

const cli_plugin_entry cli_plugin_registry[] = {
    {"gradient_clipping", CLI_ALGORITHM, make_gradient_clipping,
     "GradientClipping: clipping_type (norm, value, adaptive; norm), clipping_threshold (1.0)"},
    {"alibi", CLI_ALGORITHM, make_alibi,
     "Alibi: max_sequence_length (required), train_sequence_length_scaling (0.25: training rows reshaped to T·s)"},
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
    {"file", CLI_LOGGER, make_file, "FileLogger (the run folder's metrics.jsonl): flush_interval (100), log_traces (false)"},
    {"tensorboard", CLI_LOGGER, make_tensorboard,
     "TensorBoardLogger: log_dir (tensorboard_logs), flush_interval (100), rank_zero_only (true), "
     "histogram_interval (0: none), histogram_params, histogram_grads (true)"},
    {"mlflow", CLI_LOGGER, make_mlflow,
     "MLFlowLogger: tracking_uri ($MLFLOW_TRACKING_URI), experiment_name, run_name, tags, run_group, "
     "flush_interval (10 s), rename_metrics, ignore_metrics, ignore_hyperparameters, resume, rank_zero_only"},
    {"wandb", CLI_LOGGER, make_wandb,
     "WandBLogger: project, entity, name, group, tags, init_kwargs {mode: online | offline | disabled, dir, notes, "
     "job_type, id}, rank_zero_only ($WANDB_API_KEY, $WANDB_BASE_URL)"},
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
    {"nan_monitor", CLI_CALLBACK, make_nan_monitor, "NaNMonitor: on_nan (error | rollback), max_rollbacks (5)"},
    {"activation_monitor", CLI_CALLBACK, make_activation_monitor,
     "ActivationMonitor: interval (25ba), ignore_module_types ([]), only_log_wandb (true)"},
    {"system_metrics_monitor", CLI_CALLBACK, make_system_metrics_monitor,
     "SystemMetricsMonitor: log_all_data (false), interval (1)"},
    {"generate", CLI_CALLBACK, make_generate,
     "Generate: prompts, interval, max_new_tokens (100), do_sample (false), temperature (1), top_k, top_p, seed"},
    {"image_visualizer", CLI_CALLBACK, make_image_visualizer,
     "ImageVisualizer: interval (100ba), mode (input), num_images (8), channels_last, input_key (0), target_key (1), "
     "folder"},
    {"memory_snapshot", CLI_CALLBACK, make_memory_snapshot,
     "MemorySnapshot: skip_batches (1), interval (3ba), max_entries, folder, filename, overwrite"},
    {"oom_observer", CLI_CALLBACK, make_oom_observer, "OOMObserver: folder, filename (rank{rank}_oom), max_entries"},
    {"free_outputs", CLI_CALLBACK, make_free_outputs, "FreeOutputs: drops the outputs after the loss"},
    {"export_for_inference", CLI_CALLBACK, make_export_for_inference,
     "ExportForInferenceCallback: save_format (c), save_path (the run folder's export/)"},
    {"load_checkpoint", CLI_CALLBACK, make_load_checkpoint,
     "LoadCheckpoint: load_path, event (before_load), strict_model_weights (true), ignore_keys"},
    {"checkpoint_saver", CLI_CALLBACK, make_checkpoint_saver,
     "CheckpointSaver: folder, filename, latest_filename, save_interval (1ep), weights_only, "
     "num_checkpoints_to_keep (-1), overwrite"},
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
