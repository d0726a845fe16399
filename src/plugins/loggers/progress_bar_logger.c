/* ProgressBarLogger: a report.h progress bar per train epoch and per evaluation, after Composer's
 * ProgressBarLogger (tqdm): the train bar shows the latest loss/train metrics, the eval bar the
 * evaluation's metrics at its end. Only rank 0 draws. */
#include "loggers_impl.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    cm_progress_bar_logger_config cfg; /* stream resolved */
    bool active, tty;
    cm_progress *train, *eval;
    int64_t train_start; /* batch_in_epoch when the train bar started (a fit resumed mid-epoch) */
    int64_t train_total;
    int64_t eval_n, eval_total;
    char eval_prefix[96]; /* "metrics/<label>/" */
} bar_logger;

cm_progress_bar_logger_config cm_progress_bar_logger_config_default(void) {
    cm_progress_config pc = cm_progress_config_default();
    return (cm_progress_bar_logger_config){
        .stream = NULL,
        .mode = CM_PROGRESS_AUTO,
        .width = 0,
        .line_every_frac = pc.line_every_frac,
        .line_every_s = pc.line_every_s,
        .log_traces = false,
        .clock = NULL,
        .clock_data = NULL,
    };
}

static void end_bar(cm_progress **p) {
    if (!*p) return;
    cm_progress_finish(*p);
    cm_progress_free(*p);
    *p = NULL;
}

static cm_status start_bar(bar_logger *lg, const char *desc, int64_t total, cm_progress **out) {
    cm_progress_config pc = cm_progress_config_default();
    pc.total = total > 0 ? total : 0;
    pc.unit = "ba";
    pc.desc = desc;
    pc.stream = lg->cfg.stream;
    pc.mode = lg->tty ? CM_PROGRESS_TTY : CM_PROGRESS_LINES;
    pc.width = lg->cfg.width;
    pc.line_every_frac = lg->cfg.line_every_frac;
    pc.line_every_s = lg->cfg.line_every_s;
    pc.clock = lg->cfg.clock;
    pc.clock_data = lg->cfg.clock_data;
    return cm_progress_new(&pc, out);
}

static cm_status start_train(bar_logger *lg, const cm_state *st) {
    const cm_timestamp *ts = cm_state_timestamp(st);
    int64_t bpe = cm_state_batches_per_epoch(st), total = bpe > 0 ? bpe - ts->batch_in_epoch : 0;
    cm_time md = cm_state_max_duration(st);
    if (md.unit == CM_TIME_BATCH && md.count > 0) {
        int64_t left = md.count - ts->batch;
        if (total <= 0 || left < total) total = left;
    }
    char desc[64];
    snprintf(desc, sizeof desc, "train Epoch %lld", (long long)ts->epoch);
    lg->train_start = ts->batch_in_epoch;
    lg->train_total = total;
    return start_bar(lg, desc, total, &lg->train);
}

static cm_status pb_init(void *self, const cm_state *st) {
    bar_logger *lg = self;
    lg->active = cm_state_rank(st) == 0;
    return CM_OK;
}

static bool starts_with(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

static cm_status pb_log_metrics(void *self, const cm_metric_value *v, int n, const cm_timestamp *ts) {
    bar_logger *lg = self;
    if (!lg->active) return CM_OK;
    for (int i = 0; i < n; i++) {
        const char *name = v[i].name;
        if (!name) continue;
        cm_status s = CM_OK;
        if (cmi_is_trace(name)) {
            if (!lg->cfg.log_traces) continue;
            char val[CM_FORMAT_MAX], line[512];
            snprintf(line, sizeof line, "[trace]: %s: %s", name, cm_format_metric(v[i].value, val, sizeof val));
            cm_progress *p = lg->eval ? lg->eval : lg->train;
            if (p) cm_progress_write(p, line);
            else fprintf(lg->cfg.stream, "%s\n", line);
        } else if (lg->eval) {
            if (starts_with(name, lg->eval_prefix)) s = cm_progress_set_metric(lg->eval, name, v[i].value);
        } else if (lg->train && starts_with(name, "loss/train")) {
            s = cm_progress_set_metric(lg->train, name, v[i].value);
        }
        if (s) return s;
    }
    return CM_OK;
}

static cm_status pb_run_event(void *self, cm_event ev, const cm_state *st) {
    bar_logger *lg = self;
    if (!lg->active) return CM_OK;
    switch (ev) {
    case CM_EVENT_EPOCH_START:
        end_bar(&lg->train);
        return start_train(lg, st);
    case CM_EVENT_BATCH_START: /* a fit that continues mid-epoch has no EPOCH_START */
        return lg->train ? CM_OK : start_train(lg, st);
    case CM_EVENT_BATCH_END: {
        if (!lg->train) return CM_OK;
        int64_t n = cm_state_timestamp(st)->batch_in_epoch - lg->train_start;
        cm_status s = cm_progress_update(lg->train, n, NULL, NULL, 0);
        /* A full bar is done: an evaluation that follows gets the next line to itself. */
        if (lg->train_total > 0 && n >= lg->train_total) end_bar(&lg->train);
        return s;
    }
    case CM_EVENT_EPOCH_END:
    case CM_EVENT_FIT_END:
        end_bar(&lg->train);
        return CM_OK;
    case CM_EVENT_EVAL_START: {
        end_bar(&lg->eval);
        /* On a terminal the train bar's line is still open mid-epoch: it is drawn as it is now and
         * left there, and the eval bar takes the next line (the train bar continues below it). */
        if (lg->train && lg->tty) {
            char line[1024];
            fprintf(lg->cfg.stream, "\r%s\x1b[K\n", cm_progress_format(lg->train, true, line, sizeof line));
            fflush(lg->cfg.stream);
        }
        const char *label = cm_state_dataloader_label(st);
        if (!label || !label[0]) label = "eval";
        snprintf(lg->eval_prefix, sizeof lg->eval_prefix, "metrics/%s/", label);
        lg->eval_n = 0;
        lg->eval_total = cm_state_dataloader_len(st); /* eval_subset_num_batches counted */
        if (lg->eval_total < 0) lg->eval_total = 0;
        return start_bar(lg, label, lg->eval_total, &lg->eval);
    }
    case CM_EVENT_EVAL_BATCH_END:
        lg->eval_n++;
        /* In lines mode the last line waits for EVAL_END, when the eval metrics have been logged. */
        if (!lg->eval || (!lg->tty && lg->eval_total > 0 && lg->eval_n >= lg->eval_total)) return CM_OK;
        return cm_progress_update(lg->eval, lg->eval_n, NULL, NULL, 0);
    case CM_EVENT_EVAL_END: {
        cm_status s = lg->eval ? cm_progress_update(lg->eval, lg->eval_n, NULL, NULL, 0) : CM_OK;
        end_bar(&lg->eval);
        return s;
    }
    default:
        return CM_OK;
    }
}

static cm_status pb_flush(void *self) {
    fflush(((bar_logger *)self)->cfg.stream);
    return CM_OK;
}

static cm_status pb_close(void *self, const cm_state *st) {
    bar_logger *lg = self;
    end_bar(&lg->eval);
    end_bar(&lg->train);
    return CM_OK;
}

static void pb_free(void *self) {
    bar_logger *lg = self;
    end_bar(&lg->eval);
    end_bar(&lg->train);
    cm_free(lg);
}

static const cm_logger_i bar_vt = {
    .abi = CM_LOGGER_ABI,
    .name = "ProgressBarLogger",
    .init = pb_init,
    .log_metrics = pb_log_metrics,
    .run_event = pb_run_event,
    .flush = pb_flush,
    .close = pb_close,
    .free = pb_free,
};

cm_status cm_progress_bar_logger_new(const cm_progress_bar_logger_config *cfg, cm_logger_plugin *out) {
    if (!cfg || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_progress_bar_logger_new: cfg and out must not be NULL");
    *out = (cm_logger_plugin){0};
    if (cfg->mode < CM_PROGRESS_AUTO || cfg->mode > CM_PROGRESS_LINES)
        return cm_set_error(CM_ERR_INVALID_ARG, "ProgressBarLogger: mode %d is not a cm_progress_mode", (int)cfg->mode);
    if (cfg->width < 0) return cm_set_error(CM_ERR_INVALID_ARG, "ProgressBarLogger: width %d is negative", cfg->width);
    if (!(cfg->line_every_frac >= 0) || !(cfg->line_every_s >= 0))
        return cm_set_error(CM_ERR_INVALID_ARG, "ProgressBarLogger: line_every_frac (%g) and line_every_s (%g) must be "
                                                "≥ 0 (0 = off)", cfg->line_every_frac, cfg->line_every_s);
    bar_logger *lg = cm_alloc_zeroed(sizeof *lg, 16);
    if (!lg) return cm_set_error(CM_ERR_OOM, "cm_progress_bar_logger_new: out of memory");
    lg->cfg = *cfg;
    if (!lg->cfg.stream) lg->cfg.stream = stderr;
    if (cfg->mode == CM_PROGRESS_AUTO) {
        int fd = fileno(lg->cfg.stream);
        lg->tty = fd >= 0 && isatty(fd);
    } else {
        lg->tty = cfg->mode == CM_PROGRESS_TTY;
    }
    lg->active = true;
    *out = (cm_logger_plugin){&bar_vt, lg};
    return CM_OK;
}
