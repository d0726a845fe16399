/* The plugin registry of `composer train` (config name -> constructor). Adding a plugin is one
 * registry row. The run's loggers (FileLogger, ProgressBarLogger, ConsoleLogger from loggers.h)
 * are made by cli_train.c from the settings the logger rows record. */
#include "cli.h"

/* Keys and paths are cut to their buffers on purpose (longer ones are not valid config paths). */
#pragma GCC diagnostic ignored "-Wformat-truncation"

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

/* loggers.progress_bar: {} — the ProgressBarLogger, added unless the top-level progress_bar is
 * false (Composer adds its ProgressBarLogger for progress_bar: true). */
static cm_status make_progress_bar(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    cm_config_touch(c, path);
    out->none = true;
    return CM_OK;
}

/* loggers.console: {log_interval: 1ep} — a ConsoleLogger printing Composer's blocks on stdout. */
static cm_status make_console(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    char key[256];
    snprintf(key, sizeof key, "%s.log_interval", path);
    cm_config_touch(c, path);
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
    cm_config_touch(c, path);
    if ((s = cm_config_get_int(c, KEY("window_size"), cfg.window_size, &w))) return s;
    cfg.window_size = (int)w;
    if ((s = cm_config_get_double(c, KEY("peak_flops"), cfg.peak_flops, &cfg.peak_flops))) return s;
    if ((s = get_wall_unit(c, KEY("time_unit"), &cfg.time_unit))) return s;
    return cm_speed_monitor_new(&cfg, &out->callback);
}

/* callbacks.lr_monitor: {} and callbacks.memory_monitor: {} */
static cm_status make_lr_monitor(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    cm_config_touch(c, path);
    return cm_lr_monitor_new(&out->callback);
}

static cm_status make_memory_monitor(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    cm_config_touch(c, path);
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
    cm_config_touch(c, path);
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
    cm_config_touch(c, path);
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
#undef KEY

const cli_plugin_entry cli_plugin_registry[] = {
    {"gradient_clipping", CLI_ALGORITHM, make_gradient_clipping,
     "GradientClipping: clipping_type (norm, value, adaptive; norm), clipping_threshold (1.0)"},
    {"progress_bar", CLI_LOGGER, make_progress_bar, "ProgressBarLogger on stderr (also top-level progress_bar: true)"},
    {"console", CLI_LOGGER, make_console, "ConsoleLogger: metric blocks on stdout every log_interval (1ep)"},
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
