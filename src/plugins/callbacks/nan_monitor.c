/* NaNMonitor (Composer's): a NaN loss fails the run, or — on_nan: rollback — asks the trainer to
 * go back to its last checkpoint and skip the offending batches (cm_state_rollback). */
#include "cb_impl.h"

#include <math.h>
#include <stdio.h>
#include <strings.h>

static const char *const k_nan_actions[] = {
#define CM_X_(name, str) str,
    CM_NAN_ACTION_LIST(CM_X_)
#undef CM_X_
};

cm_status cm_nan_action_parse(const char *s, cm_nan_action *out) {
    for (int i = 0; s && i < CM_NAN_ACTION_COUNT; i++)
        if (!strcasecmp(s, k_nan_actions[i])) {
            *out = (cm_nan_action)i;
            return CM_OK;
        }
    return cm_set_error(CM_ERR_INVALID_ARG, "on_nan '%s': use error or rollback", s ? s : "");
}

cm_nan_monitor_config cm_nan_monitor_config_default(void) { return (cm_nan_monitor_config){CM_NAN_ERROR, 5}; }

typedef struct nan_monitor {
    cm_nan_monitor_config cfg;
    int rollbacks;
} nan_monitor;

static cm_status nm_run_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    nan_monitor *m = self;
    if (ev != CM_EVENT_AFTER_LOSS) return CM_OK;
    const cm_tensor *loss = cm_state_loss(st);
    if (!loss) return CM_OK;
    bool nan = false;
    for (int64_t i = 0; i < cm_tensor_numel(loss) && !nan; i++) nan = isnan(cm_tensor_get_flat(loss, i));
    if (!nan) return CM_OK;
    const cm_timestamp *ts = cm_state_timestamp(st);
    if (m->cfg.on_nan == CM_NAN_ROLLBACK && m->rollbacks < m->cfg.max_rollbacks) {
        if (cm_state_rollback_requested(st)) return CM_OK; /* another microbatch of the same batch */
        m->rollbacks++;
        cm_log_msg(CM_LOG_WARN, "NaNMonitor: the train loss is NaN at batch %lld (epoch %lld, microbatch %lld); "
                                "rolling back to the last checkpoint (rollback %d of at most %d)",
                   (long long)ts->batch + 1, (long long)ts->epoch, (long long)cm_state_microbatch_index(st) + 1,
                   m->rollbacks, m->cfg.max_rollbacks);
        cm_state_rollback(st);
        return cm_logger_log_metric(lg, "nan_monitor/rollbacks", (double)m->rollbacks);
    }
    return cm_set_error(CM_ERR_STATE, "Train loss contains a NaN. (epoch %lld, batch %lld, microbatch %lld of %lld%s)",
                        (long long)ts->epoch, (long long)ts->batch_in_epoch + 1,
                        (long long)cm_state_microbatch_index(st) + 1, (long long)cm_state_n_microbatches(st),
                        m->cfg.on_nan == CM_NAN_ROLLBACK ? "; max_rollbacks reached" : "");
}

static size_t nm_save(void *self, char *buf, size_t cap) {
    return (size_t)snprintf(buf, cap, "{\"rollbacks\": %d}", ((nan_monitor *)self)->rollbacks);
}

static cm_status nm_load(void *self, const char *json, size_t len) {
    cJSON *o;
    double v;
    cm_status s = cbi_json_parse("NaNMonitor", json, len, &o);
    if (s) return s;
    s = cbi_json_number("NaNMonitor", o, "rollbacks", &v);
    cJSON_Delete(o);
    if (s) return s;
    if (!(v >= 0) || v > 1e9) return cm_set_error(CM_ERR_FORMAT, "NaNMonitor: rollbacks %g is not a count", v);
    /* a rollback loads the checkpoint's count, which is lower: the rollbacks since still count */
    nan_monitor *m = self;
    if ((int)v > m->rollbacks) m->rollbacks = (int)v;
    return CM_OK;
}

static void nm_free(void *self) { cm_free(self); }

static const cm_callback_i nan_monitor_vt = {
    .abi = CM_CALLBACK_ABI,
    .name = "NaNMonitor",
    .run_event = nm_run_event,
    .save = nm_save,
    .load = nm_load,
    .free = nm_free,
};

cm_status cm_nan_monitor_new(const cm_nan_monitor_config *cfg, cm_callback_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_nan_monitor_new: out is NULL");
    *out = (cm_callback_plugin){0};
    const cm_nan_monitor_config c = cfg ? *cfg : cm_nan_monitor_config_default();
    if ((unsigned)c.on_nan >= CM_NAN_ACTION_COUNT)
        return cm_set_error(CM_ERR_INVALID_ARG, "NaNMonitor: on_nan %d is not a cm_nan_action", (int)c.on_nan);
    if (c.max_rollbacks < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "NaNMonitor: max_rollbacks %d must be >= 0", c.max_rollbacks);
    nan_monitor *m = cm_alloc_zeroed(sizeof *m, 16);
    if (!m) return cm_set_error(CM_ERR_OOM, "NaNMonitor: out of memory");
    m->cfg = c;
    *out = (cm_callback_plugin){&nan_monitor_vt, m};
    return CM_OK;
}
