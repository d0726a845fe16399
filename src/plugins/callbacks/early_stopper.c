/* EarlyStopper: stops training when a monitored metric has not improved for a while (Composer's
 * EarlyStopper). */
#include "cb_impl.h"

#include <math.h>
#include <string.h>

typedef struct {
    char *monitor, *label;
    cm_comp comp;
    double min_delta;
    cm_time patience;
    bool has_best;
    double best;
    int64_t best_epoch, best_batch; /* the timestamp when the best occurred */
} early_stopper;

static cm_status es_update(early_stopper *e, const cm_state *st) {
    double v;
    cm_status s = cbi_monitored_metric("EarlyStopper", st, e->label, e->monitor, &v);
    if (s) return s;
    const cm_timestamp *ts = cm_state_timestamp(st);
    const bool better = e->comp == CM_COMP_LESS ? v < e->best : v > e->best;
    if (!e->has_best || (better && fabs(v - e->best) > e->min_delta)) {
        e->has_best = true;
        e->best = v;
        e->best_epoch = ts->epoch, e->best_batch = ts->batch;
    }
    const int64_t since = e->patience.unit == CM_TIME_EPOCH ? ts->epoch - e->best_epoch : ts->batch - e->best_batch;
    if (since > e->patience.count) {
        cm_log_msg(CM_LOG_INFO, "EarlyStopper: %s/%s has not improved on %g for %lld %s; stopping", e->label,
                   e->monitor, e->best, (long long)since, e->patience.unit == CM_TIME_EPOCH ? "epochs" : "batches");
        cm_state_stop_training(st);
    }
    return CM_OK;
}

static cm_status es_run_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    early_stopper *e = self;
    if (ev == CM_EVENT_FIT_START) return cbi_check_label("EarlyStopper", st, e->label);
    const bool mine = !strcmp(cm_state_dataloader_label(st), e->label);
    if (!mine) return CM_OK;
    if (ev == CM_EVENT_EVAL_END || ev == CM_EVENT_EPOCH_END ||
        (ev == CM_EVENT_BATCH_END && e->patience.unit == CM_TIME_BATCH))
        return es_update(e, st);
    return CM_OK;
}

static size_t es_save(void *self, char *buf, size_t cap) {
    early_stopper *e = self;
    cJSON *o = cJSON_CreateObject();
    if (!o) return 0;
    if (e->has_best) {
        cJSON_AddNumberToObject(o, "best", e->best);
        cJSON_AddNumberToObject(o, "best_epoch", (double)e->best_epoch);
        cJSON_AddNumberToObject(o, "best_batch", (double)e->best_batch);
    } else {
        cJSON_AddNullToObject(o, "best");
    }
    return cbi_json_save(o, buf, cap);
}

static cm_status es_load(void *self, const char *json, size_t len) {
    early_stopper *e = self;
    cJSON *o;
    cm_status s = cbi_json_parse("EarlyStopper", json, len, &o);
    if (s) return s;
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(o, "best");
    double best, ep, ba;
    if (cJSON_IsNull(b)) {
        e->has_best = false;
    } else if (!(s = cbi_json_number("EarlyStopper", o, "best", &best)) &&
               !(s = cbi_json_number("EarlyStopper", o, "best_epoch", &ep)) &&
               !(s = cbi_json_number("EarlyStopper", o, "best_batch", &ba))) {
        e->has_best = true;
        e->best = best, e->best_epoch = (int64_t)ep, e->best_batch = (int64_t)ba;
    }
    cJSON_Delete(o);
    return s;
}

static void es_free(void *self) {
    early_stopper *e = self;
    if (!e) return;
    cm_free(e->monitor);
    cm_free(e->label);
    cm_free(e);
}

static const cm_callback_i early_stopper_vt = {
    .abi = CM_CALLBACK_ABI,
    .name = "EarlyStopper",
    .run_event = es_run_event,
    .save = es_save,
    .load = es_load,
    .free = es_free,
};

cm_early_stopper_config cm_early_stopper_config_default(void) {
    return (cm_early_stopper_config){.monitor = NULL, .dataloader_label = "eval", .comp = CM_COMP_AUTO,
                                     .min_delta = 0.0, .patience = cm_time_make(1, CM_TIME_EPOCH)};
}

cm_status cm_early_stopper_new(const cm_early_stopper_config *cfg, cm_callback_plugin *out) {
    if (!cfg || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_early_stopper_new: cfg or out is NULL");
    if (!cfg->monitor || !*cfg->monitor)
        return cm_set_error(CM_ERR_INVALID_ARG, "EarlyStopper: monitor is not set (the metric's name, e.g. "
                                                "\"MulticlassAccuracy\" or \"CrossEntropy\")");
    if (!cfg->dataloader_label || !*cfg->dataloader_label)
        return cm_set_error(CM_ERR_INVALID_ARG, "EarlyStopper: dataloader_label is empty (use \"eval\", \"train\" or "
                                                "an evaluator's label)");
    if ((cfg->patience.unit != CM_TIME_EPOCH && cfg->patience.unit != CM_TIME_BATCH) || cfg->patience.count < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "EarlyStopper: patience must be a count of epochs or batches ≥ 0 "
                                                "(e.g. \"3ep\" or \"100ba\")");
    if (isnan(cfg->min_delta))
        return cm_set_error(CM_ERR_INVALID_ARG, "EarlyStopper: min_delta is NaN");
    if ((unsigned)cfg->comp > CM_COMP_GREATER)
        return cm_set_error(CM_ERR_INVALID_ARG, "EarlyStopper: comp %d is not valid (auto, less, greater)", (int)cfg->comp);
    early_stopper *e = cm_alloc_zeroed(sizeof *e, 16);
    if (!e) return CM_ERR_OOM;
    e->monitor = cbi_strdup(cfg->monitor);
    e->label = cbi_strdup(cfg->dataloader_label);
    if (!e->monitor || !e->label) {
        es_free(e);
        return CM_ERR_OOM;
    }
    e->comp = cfg->comp == CM_COMP_AUTO ? cm_comp_for_metric(cfg->monitor) : cfg->comp;
    e->min_delta = fabs(cfg->min_delta);
    e->patience = cfg->patience;
    *out = (cm_callback_plugin){&early_stopper_vt, e};
    return CM_OK;
}
