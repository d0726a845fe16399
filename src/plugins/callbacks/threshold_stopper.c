/* ThresholdStopper: stops training once a monitored metric passes a threshold (Composer's
 * ThresholdStopper). */
#include "cb_impl.h"

#include <math.h>
#include <string.h>

typedef struct {
    char *monitor, *label;
    double threshold;
    cm_comp comp;
    bool stop_on_batch;
} threshold_stopper;

static cm_status ts_run_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    threshold_stopper *t = self;
    if (ev == CM_EVENT_FIT_START) return cbi_check_label("ThresholdStopper", st, t->label);
    if (strcmp(cm_state_dataloader_label(st), t->label)) return CM_OK;
    if (!(ev == CM_EVENT_EVAL_END || ev == CM_EVENT_EPOCH_END || (ev == CM_EVENT_BATCH_END && t->stop_on_batch)))
        return CM_OK;
    double v;
    cm_status s = cbi_monitored_metric("ThresholdStopper", st, t->label, t->monitor, &v);
    if (s) return s;
    if (t->comp == CM_COMP_LESS ? v < t->threshold : v > t->threshold) {
        cm_log_msg(CM_LOG_INFO, "ThresholdStopper: %s/%s = %g is %s %g; stopping", t->label, t->monitor, v,
                   t->comp == CM_COMP_LESS ? "below" : "above", t->threshold);
        cm_state_stop_training(st);
    }
    return CM_OK;
}

static void ts_free(void *self) {
    threshold_stopper *t = self;
    if (!t) return;
    cm_free(t->monitor);
    cm_free(t->label);
    cm_free(t);
}

static const cm_callback_i threshold_stopper_vt = {
    .abi = CM_CALLBACK_ABI,
    .name = "ThresholdStopper",
    .run_event = ts_run_event,
    .free = ts_free,
};

cm_threshold_stopper_config cm_threshold_stopper_config_default(void) {
    return (cm_threshold_stopper_config){.monitor = NULL, .dataloader_label = "eval", .threshold = NAN,
                                         .comp = CM_COMP_AUTO, .stop_on_batch = false};
}

cm_status cm_threshold_stopper_new(const cm_threshold_stopper_config *cfg, cm_callback_plugin *out) {
    if (!cfg || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_threshold_stopper_new: cfg or out is NULL");
    if (!cfg->monitor || !*cfg->monitor)
        return cm_set_error(CM_ERR_INVALID_ARG, "ThresholdStopper: monitor is not set (the metric's name, e.g. "
                                                "\"MulticlassAccuracy\")");
    if (!cfg->dataloader_label || !*cfg->dataloader_label)
        return cm_set_error(CM_ERR_INVALID_ARG, "ThresholdStopper: dataloader_label is empty (use \"eval\", \"train\" "
                                                "or an evaluator's label)");
    if (!isfinite(cfg->threshold))
        return cm_set_error(CM_ERR_INVALID_ARG, "ThresholdStopper: threshold %g must be set to a finite number",
                            cfg->threshold);
    if ((unsigned)cfg->comp > CM_COMP_GREATER)
        return cm_set_error(CM_ERR_INVALID_ARG, "ThresholdStopper: comp %d is not valid (auto, less, greater)",
                            (int)cfg->comp);
    threshold_stopper *t = cm_alloc_zeroed(sizeof *t, 16);
    if (!t) return CM_ERR_OOM;
    t->monitor = cbi_strdup(cfg->monitor);
    t->label = cbi_strdup(cfg->dataloader_label);
    if (!t->monitor || !t->label) {
        ts_free(t);
        return CM_ERR_OOM;
    }
    t->threshold = cfg->threshold;
    t->comp = cfg->comp == CM_COMP_AUTO ? cm_comp_for_metric(cfg->monitor) : cfg->comp;
    t->stop_on_batch = cfg->stop_on_batch;
    *out = (cm_callback_plugin){&threshold_stopper_vt, t};
    return CM_OK;
}
