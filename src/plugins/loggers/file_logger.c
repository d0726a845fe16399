/* FileLogger: the run folder's files — metrics.jsonl (every log call, as JSON Lines), log.txt (the
 * console text) and loss.svg (drawn from metrics.jsonl at the end of fit). */
#include "loggers_impl.h"
#include "base/json.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <string.h>

typedef struct {
    /* configuration (strings owned) */
    char *folder_cfg, *root;
    char **patterns;
    size_t n_patterns;
    bool append, metrics_on, text_on, plot_on, log_traces;
    cm_time interval;
    int64_t flush_interval;
    /* the run */
    bool active, warned_reserved, dirty;
    char *dir, *metrics_path, *log_path, *plot_path;
    cm_metrics_file *mf;
    int64_t opened_size; /* metrics.jsonl's length when this run opened it (appending) */
    FILE *log;
    cmi_console con;
    const char **names; /* scratch for one log call */
    double *values;
    int cap;
} file_logger;

cm_file_logger_config cm_file_logger_config_default(void) {
    return (cm_file_logger_config){
        .folder = NULL,
        .root = CM_RUN_ROOT_DEFAULT,
        .append = false,
        .metrics_file = true,
        .text_log = true,
        .plot = true,
        .log_interval = cm_time_make(1, CM_TIME_BATCH),
        .flush_interval = 100,
        .log_traces = false,
        .plot_patterns = NULL,
        .n_plot_patterns = 0,
    };
}

static cm_status close_files(file_logger *lg) {
    cm_status s = cm_metrics_file_close(lg->mf);
    lg->mf = NULL;
    if (lg->log) {
        bool bad = ferror(lg->log) != 0;
        if (fclose(lg->log) != 0) bad = true;
        lg->log = NULL;
        if (bad && !s) s = cm_set_error(CM_ERR_IO, "FileLogger: writing '%s' failed: %s", lg->log_path, strerror(errno));
    }
    lg->con.out = NULL;
    return s;
}

static cm_status fl_init(void *self, const cm_state *st) {
    file_logger *lg = self;
    if (lg->dir) return cm_set_error(CM_ERR_STATE, "FileLogger: already initialised for run folder '%s' (one logger "
                                                   "per trainer)", lg->dir);
    if (cm_state_rank(st) != 0) return CM_OK;
    cm_status s;
    if (lg->folder_cfg) {
        if ((s = cmi_folder_make(lg->folder_cfg))) return s;
        if (!(lg->dir = cmi_strdup(lg->folder_cfg))) return CM_ERR_OOM;
    } else {
        cm_run_folder_config rc = {.root = lg->root, .run_name = cm_state_run_name(st)};
        if ((s = cm_run_folder_setup(&rc, &lg->dir))) return s;
    }
    if ((s = cm_run_folder_path(lg->dir, CM_RUN_FILE_METRICS, &lg->metrics_path)) ||
        (s = cm_run_folder_path(lg->dir, CM_RUN_FILE_LOG, &lg->log_path)) ||
        (s = cm_run_folder_path(lg->dir, CM_RUN_FILE_PLOT, &lg->plot_path)))
        return s;
    if (lg->metrics_on && (s = cm_metrics_file_open(lg->metrics_path, lg->append, &lg->mf))) return s;
    if (lg->mf && (lg->opened_size = cm_metrics_file_size(lg->mf)) < 0) {
        s = cm_last_status();
        close_files(lg);
        return s;
    }
    if (lg->text_on) {
        lg->log = fopen(lg->log_path, lg->append ? "a" : "w");
        if (!lg->log) {
            s = cm_set_error(CM_ERR_IO, "FileLogger: cannot open the log '%s': %s", lg->log_path, strerror(errno));
            close_files(lg);
            return s;
        }
        lg->con.out = lg->log;
    }
    lg->active = true;
    return CM_OK;
}

static cm_status fl_log_hparams(void *self, const cm_hparam *h, int n) {
    file_logger *lg = self;
    return lg->text_on ? cmi_console_log_hparams(&lg->con, h, n) : CM_OK;
}

static cm_status fl_log_metrics(void *self, const cm_metric_value *v, int n, const cm_timestamp *ts) {
    file_logger *lg = self;
    if (!lg->active) return CM_OK;
    cm_status s;
    if (lg->log && (s = cmi_console_log_metrics(&lg->con, v, n))) return s;
    if (!lg->mf) return CM_OK;
    if (n > lg->cap) {
        cm_free(lg->names), cm_free(lg->values);
        lg->names = cm_alloc(sizeof *lg->names * (size_t)n, 16);
        lg->values = cm_alloc(sizeof *lg->values * (size_t)n, 16);
        lg->cap = lg->names && lg->values ? n : 0;
        if (!lg->cap) return cm_set_error(CM_ERR_OOM, "FileLogger: no memory for %d metrics", n);
    }
    int k = 0;
    for (int i = 0; i < n; i++) {
        const char *name = v[i].name;
        if (!name || !name[0] || (!lg->log_traces && cmi_is_trace(name))) continue;
        if (!strcmp(name, "batch") || !strcmp(name, "epoch")) {
            if (!lg->warned_reserved)
                cm_log_msg(CM_LOG_WARN, "FileLogger: a metric named '%s' is left out of '%s' (the name is taken by "
                                        "the timestamp)", name, lg->metrics_path);
            lg->warned_reserved = true;
            continue;
        }
        int j = 0;
        while (j < k && strcmp(lg->names[j], name)) j++;
        lg->names[j] = name;
        lg->values[j] = v[i].value;
        if (j == k) k++;
    }
    if (k == 0) return CM_OK;
    if ((s = cm_metrics_file_write(lg->mf, ts ? ts->batch : 0, ts ? ts->epoch : 0, lg->names, lg->values, (size_t)k)))
        return s;
    lg->dirty = true;
    return CM_OK;
}

static cm_status flush_log(file_logger *lg) {
    if (!lg->log) return CM_OK;
    if (fflush(lg->log) != 0 || ferror(lg->log)) {
        cm_status s = cm_set_error(CM_ERR_IO, "FileLogger: writing '%s' failed: %s", lg->log_path, strerror(errno));
        clearerr(lg->log);
        return s;
    }
    return CM_OK;
}

/* Draws loss.svg from the metrics file; a plot that cannot be drawn is only a warning. */
static void plot(file_logger *lg) {
    if (!lg->plot_on || !lg->mf || !lg->dirty) return;
    lg->dirty = false;
    cm_status s = cm_svg_plot_metrics_file(lg->metrics_path, lg->plot_path, (const char *const *)lg->patterns,
                                           lg->n_patterns, NULL);
    if (s) cm_log_msg(CM_LOG_WARN, "FileLogger: no plot '%s': %s", lg->plot_path, cm_last_error());
}

static cm_status fl_run_event(void *self, cm_event ev, const cm_state *st) {
    file_logger *lg = self;
    if (!lg->active) return CM_OK;
    if (lg->log) cmi_console_run_event(&lg->con, ev, st, true);
    switch (ev) {
    case CM_EVENT_BATCH_END:
        if (cm_state_timestamp(st)->batch % lg->flush_interval == 0) return flush_log(lg);
        break;
    case CM_EVENT_EPOCH_END:
    case CM_EVENT_EVAL_END:
        return flush_log(lg);
    case CM_EVENT_FIT_END:
        plot(lg);
        return flush_log(lg);
    default:
        break;
    }
    return CM_OK;
}

static cm_status fl_flush(void *self) { return flush_log(self); }

static cm_status fl_close(void *self, const cm_state *st) {
    file_logger *lg = self;
    if (!lg->active) return CM_OK;
    plot(lg);
    lg->active = false;
    return close_files(lg);
}

static void fl_free(void *self) {
    file_logger *lg = self;
    close_files(lg);
    cmi_console_deinit(&lg->con);
    for (size_t i = 0; i < lg->n_patterns; i++) cm_free(lg->patterns[i]);
    cm_free(lg->patterns);
    cm_free(lg->folder_cfg), cm_free(lg->root), cm_free(lg->dir);
    cm_free(lg->metrics_path), cm_free(lg->log_path), cm_free(lg->plot_path);
    cm_free(lg->names), cm_free(lg->values);
    cm_free(lg);
}

/* Texts (generated samples) go to log.txt, each under a header line. */
static cm_status fl_log_text(void *self, const char *key, const char *text, const cm_timestamp *ts) {
    file_logger *lg = self;
    if (!lg->active || !lg->log) return CM_OK;
    fprintf(lg->log, "[text] %s (epoch %lld, batch %lld):\n%s%s", key, (long long)(ts ? ts->epoch : 0),
            (long long)(ts ? ts->batch : 0), text, text[0] && text[strlen(text) - 1] == '\n' ? "" : "\n");
    return flush_log(lg);
}

/* Checkpoint state: where metrics.jsonl ended when the checkpoint was saved. */
static size_t fl_save(void *self, char *buf, size_t cap) {
    file_logger *lg = self;
    const int64_t n = lg->mf ? cm_metrics_file_size(lg->mf) : -1;
    int k = n >= 0 ? snprintf(buf, cap, "{\"metrics_bytes\": %lld}", (long long)n) : snprintf(buf, cap, "{}");
    return (size_t)k;
}

/* Lines in bytes [from, to) of a file (-1 if it cannot be read). */
static int64_t count_lines(const char *path, int64_t from, int64_t to) {
    FILE *f = fopen(path, "rb");
    if (!f || fseeko(f, (off_t)from, SEEK_SET) != 0) {
        if (f) fclose(f);
        return -1;
    }
    int64_t n = 0;
    for (int64_t at = from; at < to; at++) {
        int c = fgetc(f);
        if (c == EOF) break;
        n += c == '\n';
    }
    fclose(f);
    return n;
}

/* A resumed run trains again the batches after the checkpoint: the lines the interrupted run wrote
 * after it are dropped, so metrics.jsonl keeps one set of rows per batch (the lines this run wrote
 * since it opened the file stay). */
static cm_status fl_load(void *self, const char *json, size_t len) {
    file_logger *lg = self;
    cJSON *o = cJSON_ParseWithLength(json, len);
    const cJSON *n = o ? cJSON_GetObjectItemCaseSensitive(o, "metrics_bytes") : NULL;
    const bool empty = o && cJSON_IsObject(o) && !o->child;
    int64_t at = -1;
    if (!cmi_json_whole(n, 0, INT64_MAX, &at)) at = -1;
    cJSON_Delete(o);
    if (empty) return CM_OK; /* saved while not writing metrics */
    if (at < 0)
        return cm_set_error(CM_ERR_FORMAT, "FileLogger: checkpoint state '%.*s' is not {\"metrics_bytes\": N}",
                            (int)(len < 200 ? len : 200), json);
    if (!lg->mf) return CM_OK; /* not writing metrics (another rank, or metrics_file off) */
    const int64_t size = cm_metrics_file_size(lg->mf);
    if (size < 0) return cm_last_status();
    /* a checkpoint of an earlier run (resuming): drop its later lines, keep this run's since it
     * opened the file; one of this run (a rollback): drop everything after it */
    const int64_t to = at <= lg->opened_size ? lg->opened_size : size;
    if (at > size) {
        cm_log_msg(CM_LOG_WARN, "FileLogger: the checkpoint was saved when '%s' had %lld bytes, but it has %lld "
                                "(another file?); it is left as it is",
                   lg->metrics_path, (long long)at, (long long)size);
        return CM_OK;
    }
    if (at == to) return CM_OK;
    const int64_t lines = count_lines(lg->metrics_path, at, to);
    cm_status s = cm_metrics_file_cut(lg->mf, at, to);
    if (s) return s;
    cm_log_msg(CM_LOG_INFO, "FileLogger: dropped %lld line(s) of '%s' written after the checkpoint (the run trains "
                            "those batches again)", (long long)lines, lg->metrics_path);
    if (lg->opened_size > at) lg->opened_size = at;
    return CM_OK;
}

static const cm_logger_i file_vt = {
    .abi = CM_LOGGER_ABI,
    .name = "FileLogger",
    .init = fl_init,
    .log_hyperparameters = fl_log_hparams,
    .log_metrics = fl_log_metrics,
    .run_event = fl_run_event,
    .flush = fl_flush,
    .close = fl_close,
    .free = fl_free,
    .save = fl_save,
    .load = fl_load,
    .log_text = fl_log_text,
};

cm_status cm_file_logger_new(const cm_file_logger_config *cfg, cm_logger_plugin *out) {
    if (!cfg || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_file_logger_new: cfg and out must not be NULL");
    *out = (cm_logger_plugin){0};
    cm_status s;
    if (cfg->text_log && (s = cmi_check_log_interval("FileLogger", cfg->log_interval))) return s;
    if (cfg->flush_interval < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "FileLogger: flush_interval must be at least 1 batch, got %lld",
                            (long long)cfg->flush_interval);
    if (cfg->n_plot_patterns > 0 && !cfg->plot_patterns)
        return cm_set_error(CM_ERR_INVALID_ARG, "FileLogger: n_plot_patterns is %zu but plot_patterns is NULL",
                            cfg->n_plot_patterns);
    for (size_t i = 0; i < cfg->n_plot_patterns; i++)
        if (!cfg->plot_patterns[i])
            return cm_set_error(CM_ERR_INVALID_ARG, "FileLogger: plot_patterns[%zu] is NULL", i);
    if (cfg->folder && !cfg->folder[0])
        return cm_set_error(CM_ERR_INVALID_ARG, "FileLogger: folder is empty (NULL = <root>/<run name>)");
    file_logger *lg = cm_alloc_zeroed(sizeof *lg, 16);
    if (!lg) return cm_set_error(CM_ERR_OOM, "cm_file_logger_new: out of memory");
    bool oom = false;
    if (cfg->folder) oom |= !(lg->folder_cfg = cmi_strdup(cfg->folder));
    oom |= !(lg->root = cmi_strdup(cfg->root && cfg->root[0] ? cfg->root : CM_RUN_ROOT_DEFAULT));
    if (cfg->n_plot_patterns) {
        lg->patterns = cm_alloc_zeroed(sizeof *lg->patterns * cfg->n_plot_patterns, 16);
        oom |= !lg->patterns;
        for (size_t i = 0; lg->patterns && i < cfg->n_plot_patterns; i++, lg->n_patterns++)
            oom |= !(lg->patterns[i] = cmi_strdup(cfg->plot_patterns[i]));
    }
    lg->append = cfg->append;
    lg->metrics_on = cfg->metrics_file;
    lg->text_on = cfg->text_log;
    lg->plot_on = cfg->plot;
    lg->log_traces = cfg->log_traces;
    lg->interval = cfg->log_interval;
    lg->flush_interval = cfg->flush_interval;
    cmi_console_init(&lg->con, NULL, cfg->log_interval, cfg->log_traces);
    if (oom) {
        fl_free(lg);
        return cm_set_error(CM_ERR_OOM, "cm_file_logger_new: out of memory");
    }
    *out = (cm_logger_plugin){&file_vt, lg};
    return CM_OK;
}

const char *cm_file_logger_folder(const cm_logger_plugin *p) {
    if (!p || p->vt != &file_vt || !p->self) return NULL;
    return ((const file_logger *)p->self)->dir;
}
