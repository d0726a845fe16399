/* ConsoleLogger: Composer's console blocks (hyperparameters, train metrics per interval, eval
 * metrics) on a stream. The text itself is console_fmt.c's, shared with the FileLogger's log.txt. */
#include "loggers_impl.h"

#include <string.h>

typedef struct {
    cmi_console con;
    bool rank0;
} console_logger;

cm_console_logger_config cm_console_logger_config_default(void) {
    return (cm_console_logger_config){.log_interval = cm_time_make(1, CM_TIME_BATCH), .stream = NULL, .log_traces = false};
}

static cm_status cl_init(void *self, const cm_state *st) {
    console_logger *lg = self;
    lg->rank0 = cm_state_rank(st) == 0;
    return CM_OK;
}

static cm_status cl_log_hparams(void *self, const cm_hparam *h, int n) {
    return cmi_console_log_hparams(&((console_logger *)self)->con, h, n);
}

static cm_status cl_log_metrics(void *self, const cm_metric_value *v, int n, const cm_timestamp *ts) {
    return cmi_console_log_metrics(&((console_logger *)self)->con, v, n);
}

static cm_status cl_run_event(void *self, cm_event ev, const cm_state *st) {
    console_logger *lg = self;
    cmi_console_run_event(&lg->con, ev, st, lg->rank0);
    return CM_OK;
}

static cm_status cl_log_text(void *self, const char *key, const char *text, const cm_timestamp *ts) {
    console_logger *lg = self;
    if (!lg->rank0) return CM_OK;
    fprintf(lg->con.out, "[text] %s (epoch %lld, batch %lld):\n%s%s", key, (long long)(ts ? ts->epoch : 0),
            (long long)(ts ? ts->batch : 0), text, text[0] && text[strlen(text) - 1] == '\n' ? "" : "\n");
    return CM_OK;
}

static cm_status cl_flush(void *self) {
    fflush(((console_logger *)self)->con.out);
    return CM_OK;
}

static void cl_free(void *self) {
    console_logger *lg = self;
    cmi_console_deinit(&lg->con);
    cm_free(lg);
}

static const cm_logger_i console_vt = {
    .abi = CM_LOGGER_ABI,
    .name = "ConsoleLogger",
    .init = cl_init,
    .log_hyperparameters = cl_log_hparams,
    .log_metrics = cl_log_metrics,
    .run_event = cl_run_event,
    .flush = cl_flush,
    .free = cl_free,
    .log_text = cl_log_text,
};

cm_status cm_console_logger_new(const cm_console_logger_config *cfg, cm_logger_plugin *out) {
    if (!cfg || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_console_logger_new: cfg and out must not be NULL");
    *out = (cm_logger_plugin){0};
    cm_status s = cmi_check_log_interval("ConsoleLogger", cfg->log_interval);
    if (s) return s;
    console_logger *lg = cm_alloc_zeroed(sizeof *lg, 16);
    if (!lg) return cm_set_error(CM_ERR_OOM, "cm_console_logger_new: out of memory");
    cmi_console_init(&lg->con, cfg->stream ? cfg->stream : stderr, cfg->log_interval, cfg->log_traces);
    lg->rank0 = true;
    *out = (cm_logger_plugin){&console_vt, lg};
    return CM_OK;
}
