/* RuntimeEstimator: estimates the time left in training from the rate of progress so far, plus
 * the evaluations still to come (Composer's RuntimeEstimator). */
#include "cb_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { RE_MAX_LABELS = 32 };

typedef struct {
    char label[64];
    int64_t n;           /* evaluations finished during training */
    double sum, first;   /* their wall-clock seconds, and the first one's */
    double frac_per_eval; /* elapsed fraction per evaluation, at the last EVAL_END */
} re_eval;

typedef struct {
    cm_runtime_estimator_config cfg;
    bool enabled, started, unit_logged;
    int skip_left;
    double start_time, start_dur;
    double total_eval_wct; /* seconds spent evaluating since the clock started */
    double eval_t0;
    re_eval evals[RE_MAX_LABELS];
    int n_evals;
} runtime_estimator;

static double re_now(const runtime_estimator *r) { return cbi_now(r->cfg.clock, r->cfg.clock_data); }

static cm_status re_batch_end(runtime_estimator *r, const cm_state *st, cm_logger *lg) {
    if (!r->enabled) return CM_OK;
    if (r->skip_left > 0) {
        r->skip_left--;
        return CM_OK;
    }
    double f;
    if (!r->started || cm_state_elapsed(st, &f) != CM_OK || !(f > r->start_dur)) return CM_OK;
    const double elapsed = re_now(r) - r->start_time - r->total_eval_wct;
    const double rate = elapsed / (f - r->start_dur);
    double remaining = rate * (1.0 - f);
    for (int i = 0; i < r->n_evals; i++) {
        const re_eval *e = &r->evals[i];
        if (e->n <= 0 || !(e->frac_per_eval > 0)) continue;
        /* The first evaluation is often slower (caches, lazy setup): drop it once there are two. */
        const double avg = e->n > 1 ? (e->sum - e->first) / (double)(e->n - 1) : e->sum;
        const double calls_left = floor(1.0 / e->frac_per_eval + 1e-9) - (double)e->n;
        if (calls_left > 0) remaining += avg * calls_left;
    }
    if (remaining < 0) remaining = 0;
    return cm_logger_log_metric(lg, "time/remaining_estimate", remaining / cm_wall_unit_seconds(r->cfg.time_unit));
}

static cm_status re_eval_end(runtime_estimator *r, const cm_state *st) {
    double f;
    /* Evaluations outside a run with a length (standalone, before training) are not counted. */
    if (!r->enabled || cm_state_elapsed(st, &f) != CM_OK || !(f > 0)) return CM_OK;
    const double dt = re_now(r) - r->eval_t0;
    if (r->started) r->total_eval_wct += dt;
    const char *label = cm_state_dataloader_label(st);
    re_eval *e = NULL;
    for (int i = 0; i < r->n_evals && !e; i++)
        if (!strcmp(r->evals[i].label, label)) e = &r->evals[i];
    if (!e) {
        if (r->n_evals == RE_MAX_LABELS) return CM_OK; /* more evaluators than we track: time only */
        e = &r->evals[r->n_evals++];
        snprintf(e->label, sizeof e->label, "%s", label);
    }
    if (e->n == 0) e->first = dt;
    e->n++;
    e->sum += dt;
    /* Evaluations run on a schedule from the start of the run: the i-th at about i·f/n. */
    e->frac_per_eval = f / (double)e->n;
    return CM_OK;
}

static cm_status re_run_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    runtime_estimator *r = self;
    switch (ev) {
    case CM_EVENT_FIT_START: {
        if (r->unit_logged) return CM_OK;
        r->unit_logged = true;
        cm_hparam hp = {"time/remaining_estimate_unit", CM_HPARAM_STRING, 0, cm_wall_unit_name(r->cfg.time_unit)};
        return cm_logger_log_hyperparameters(lg, &hp, 1);
    }
    case CM_EVENT_BATCH_START:
        if (r->enabled && !r->started && r->skip_left == 0) {
            double f;
            if (cm_state_elapsed(st, &f) != CM_OK) {
                cm_log_msg(CM_LOG_WARN, "RuntimeEstimator: max_duration is not set; cannot estimate the time left");
                r->enabled = false;
                return CM_OK;
            }
            r->started = true;
            r->start_time = re_now(r);
            r->start_dur = f;
        }
        return CM_OK;
    case CM_EVENT_BATCH_END: return re_batch_end(r, st, lg);
    case CM_EVENT_EVAL_START: r->eval_t0 = re_now(r); return CM_OK;
    case CM_EVENT_EVAL_END: return re_eval_end(r, st);
    default: return CM_OK;
    }
}

static void re_free(void *self) { cm_free(self); }

static const cm_callback_i runtime_estimator_vt = {
    .abi = CM_CALLBACK_ABI,
    .name = "RuntimeEstimator",
    .run_event = re_run_event,
    .free = re_free,
};

cm_runtime_estimator_config cm_runtime_estimator_config_default(void) {
    return (cm_runtime_estimator_config){.skip_batches = 1, .time_unit = CM_WALL_HOURS};
}

cm_status cm_runtime_estimator_new(const cm_runtime_estimator_config *cfg, cm_callback_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_runtime_estimator_new: out is NULL");
    cm_runtime_estimator_config c = cfg ? *cfg : cm_runtime_estimator_config_default();
    if (c.skip_batches < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "RuntimeEstimator: skip_batches %d must be ≥ 0", c.skip_batches);
    if ((unsigned)c.time_unit >= CM_WALL_UNIT_COUNT)
        return cm_set_error(CM_ERR_INVALID_ARG, "RuntimeEstimator: time_unit %d is not valid (seconds, minutes, hours, "
                                                "days)", (int)c.time_unit);
    runtime_estimator *r = cm_alloc_zeroed(sizeof *r, 16);
    if (!r) return CM_ERR_OOM;
    r->cfg = c;
    r->enabled = true;
    r->skip_left = c.skip_batches;
    *out = (cm_callback_plugin){&runtime_estimator_vt, r};
    return CM_OK;
}
