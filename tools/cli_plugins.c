/* The plugin registry of `composer train` (config name -> constructor) and the built-in run
 * logger (metrics file, progress, evaluation lines) that stands in until the loggers layer
 * (ProgressBarLogger, ConsoleLogger, FileLogger) lands. Adding a plugin is one registry row. */
#include "cli.h"

/* Keys and paths are cut to their buffers on purpose (longer ones are not valid config paths). */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#include <stdarg.h>
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

/* loggers.progress_bar: {} — the built-in logger's bar, drawn unless the top-level
 * progress_bar is false (Composer adds its ProgressBarLogger for progress_bar: true). */
static cm_status make_progress_bar(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    cm_config_touch(c, path);
    out->none = true;
    return CM_OK;
}

/* loggers.console: {log_interval: 1ep} — the built-in logger prints plain progress lines. */
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
#undef KEY

const cli_plugin_entry cli_plugin_registry[] = {
    {"gradient_clipping", CLI_ALGORITHM, make_gradient_clipping,
     "GradientClipping: clipping_type (norm, value, adaptive; norm), clipping_threshold (1.0)"},
    {"progress_bar", CLI_LOGGER, make_progress_bar, "a progress bar on stderr (built in for now)"},
    {"console", CLI_LOGGER, make_console, "plain progress lines every log_interval (1ep) (built in for now)"},
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

/* ---------------------------------------------------------------------------------------------
 * The built-in run logger
 * ------------------------------------------------------------------------------------------- */

typedef struct run_logger {
    cli_ctx *ctx;
    cm_metrics_file *mf;
    cm_progress *bar;
    double loss;
    int64_t last_line_batch;
    char eval_line[1024];
} run_logger;

static cm_status rl_log_metrics(void *self, const cm_metric_value *values, int n, const cm_timestamp *ts) {
    run_logger *rl = self;
    const char *names[32];
    double vals[32];
    size_t k = 0;
    for (int i = 0; i < n && k < 32; i++) {
        if (strncmp(values[i].name, "time/", 5) == 0) continue;
        if (strcmp(values[i].name, "loss/train/total") == 0) rl->loss = values[i].value;
        if (strncmp(values[i].name, "metrics/", 8) == 0 && strncmp(values[i].name, "metrics/train/", 14) != 0) {
            char v[CM_FORMAT_MAX];
            size_t len = strlen(rl->eval_line);
            snprintf(rl->eval_line + len, sizeof rl->eval_line - len, "%s%s: %s", len ? ", " : "", values[i].name,
                     cm_format_metric(values[i].value, v, sizeof v));
        }
        names[k] = values[i].name, vals[k] = values[i].value, k++;
    }
    if (!rl->mf || !k) return CM_OK;
    return cm_metrics_file_write(rl->mf, ts->batch, ts->epoch, names, vals, k);
}

static void rl_line(run_logger *rl, const char *msg) {
    if (rl->bar) {
        cm_progress_write(rl->bar, msg);
        if (rl->ctx->log) fprintf(rl->ctx->log, "%s\n", msg), fflush(rl->ctx->log);
    } else {
        cli_say(rl->ctx, "%s\n", msg);
    }
}

static cm_status rl_run_event(void *self, cm_event ev, const cm_state *st) {
    run_logger *rl = self;
    cli_ctx *ctx = rl->ctx;
    const cm_timestamp *ts = cm_state_timestamp(st);
    char msg[1200];
    switch (ev) {
    case CM_EVENT_FIT_START:
        if (ctx->progress_bar && !ctx->quiet && !rl->bar) {
            cm_progress_config pc = cm_progress_config_default();
            pc.total = ctx->total_batches;
            pc.desc = "train";
            if (cm_progress_new(&pc, &rl->bar) != CM_OK) rl->bar = NULL;
        }
        break;
    case CM_EVENT_BATCH_END: {
        const char *name = "loss/train/total";
        if (rl->bar) cm_progress_update(rl->bar, ts->batch, &name, &rl->loss, 1);
        cm_time iv = ctx->console_log_interval;
        bool due = false;
        if (iv.count > 0 && iv.unit == CM_TIME_BATCH) due = ts->batch % iv.count == 0;
        if (iv.count > 0 && iv.unit == CM_TIME_EPOCH) due = ts->batch_in_epoch == cm_state_batches_per_epoch(st);
        if (due || (ctx->log && ts->batch % 100 == 0)) {
            char v[CM_FORMAT_MAX];
            snprintf(msg, sizeof msg, "[batch=%lld/%lld] loss/train/total: %s", (long long)ts->batch,
                     (long long)ctx->total_batches, cm_format_metric(rl->loss, v, sizeof v));
            if (due && !rl->bar) cli_say(ctx, "%s\n", msg);
            else if (ctx->log) fprintf(ctx->log, "%s\n", msg), fflush(ctx->log);
        }
        break;
    }
    case CM_EVENT_EVAL_START:
        rl->eval_line[0] = 0;
        break;
    case CM_EVENT_EVAL_END:
        snprintf(msg, sizeof msg, "[batch=%lld] %s", (long long)ts->batch, rl->eval_line);
        rl_line(rl, msg);
        rl->eval_line[0] = 0;
        break;
    case CM_EVENT_FIT_END:
        if (rl->bar) {
            cm_progress_finish(rl->bar);
            cm_progress_free(rl->bar);
            rl->bar = NULL;
        }
        break;
    default:
        break;
    }
    return CM_OK;
}

static cm_status rl_flush(void *self) {
    (void)self;
    return CM_OK;
}

static cm_status rl_close(void *self, const cm_state *st) {
    (void)st;
    run_logger *rl = self;
    cm_progress_free(rl->bar);
    rl->bar = NULL;
    cm_status s = cm_metrics_file_close(rl->mf);
    rl->mf = NULL;
    return s;
}

static void rl_free(void *self) {
    run_logger *rl = self;
    if (!rl) return;
    cm_progress_free(rl->bar);
    cm_metrics_file_close(rl->mf);
    cm_free(rl);
}

static const cm_logger_i k_run_logger_vt = {
    .abi = CM_LOGGER_ABI,
    .name = "RunLogger",
    .log_metrics = rl_log_metrics,
    .run_event = rl_run_event,
    .flush = rl_flush,
    .close = rl_close,
    .free = rl_free,
};

cm_status cli_run_logger_new(cli_ctx *ctx, cm_logger_plugin *out) {
    run_logger *rl = cm_alloc_zeroed(sizeof *rl, 16);
    if (!rl) return CM_ERR_OOM;
    rl->ctx = ctx;
    rl->loss = 0.0 / 0.0;
    if (ctx->run_dir) {
        char *path = NULL;
        cm_status s = cm_run_folder_path(ctx->run_dir, CM_RUN_FILE_METRICS, &path);
        if (!s) s = cm_metrics_file_open(path, false, &rl->mf);
        cm_free(path);
        if (s) {
            cm_free(rl);
            return s;
        }
    }
    out->vt = &k_run_logger_vt;
    out->self = rl;
    return CM_OK;
}
