/* SWA: Composer's stochastic weight averaging — the average and SWALR's schedule as plain
 * functions, and the algorithm (events, schedule, checkpoints in train_algos.h). */
#include "plugins/train_algos_impl.h"
#include "tensor/backend.h"
#include "base/json.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

cm_swa_config cm_swa_config_default(void) {
    return (cm_swa_config){.swa_start = "0.7dur",
                           .swa_end = "0.97dur",
                           .update_interval = "1ep",
                           .schedule_swa_lr = false,
                           .anneal_strategy = "linear",
                           .anneal_steps = 10,
                           .swa_lr = NAN};
}

cm_status cm_swa_anneal_parse(const char *s, cm_swa_anneal *out) {
    if (s && (!strcasecmp(s, "linear") || !strcasecmp(s, "lin"))) return *out = CM_SWA_ANNEAL_LINEAR, CM_OK;
    if (s && (!strcasecmp(s, "cos") || !strcasecmp(s, "cosine"))) return *out = CM_SWA_ANNEAL_COS, CM_OK;
    return cm_set_error(CM_ERR_INVALID_ARG, "SWA: anneal_strategy '%s' must be one of linear, cos", s ? s : "(null)");
}

/* torch: averaged + (model - averaged) / (num_averaged + 1) on f32 tensors (the count a long
 * tensor: the division is in f32). */
void cm_swa_average_update(float *avg, const float *model, int64_t n, int64_t n_averaged) {
    if (n_averaged == 0) {
        memcpy(avg, model, sizeof(float) * (size_t)n);
        return;
    }
    const float d = (float)(n_averaged + 1);
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
        const float diff = model[i] - avg[i];
        const float q = diff / d;
        avg[i] = avg[i] + q;
    }
}

static double anneal(cm_swa_anneal a, double t) { return a == CM_SWA_ANNEAL_COS ? (1 - cos(M_PI * t)) / 2 : t; }

double cm_swa_lr(double lr0, double swa_lr, int64_t step, int64_t anneal_steps, cm_swa_anneal strategy) {
    if (anneal_steps == 0 && step < 1) step = 1; /* torch: with no annealing, swa_lr at once */
    if (step <= 0) return lr0;
    const double t = fmax(0.0, fmin(1.0, (double)step / (double)(anneal_steps > 1 ? anneal_steps : 1)));
    const double alpha = anneal(strategy, t);
    return swa_lr * alpha + lr0 * (1 - alpha);
}

/* ---- the algorithm ---- */

typedef struct {
    cm_time swa_start, swa_end, update_interval;
    cm_event match_event;
    bool schedule_swa_lr;
    cm_swa_anneal anneal;
    int64_t anneal_steps;
    double swa_lr;          /* absolute; NaN: lr0 */
    cmi_wcopy avg;          /* parameters (all of them, as AveragedModel) and buffers */
    int64_t n_averaged, step_counter;
    bool started, completed;
    double lr0_mult;        /* the multiplier in use when SWA started */
    double target_mult;     /* swa_lr / base lr (or lr0_mult) */
    int64_t lr_steps;       /* SWALR steps taken */
} swa;

/* Composer's _get_time: the epoch count, or the elapsed fraction, in swa_start's unit. */
static bool reached(const cm_state *st, cm_time t) {
    if (t.unit == CM_TIME_EPOCH) return cm_state_timestamp(st)->epoch >= t.count;
    return cmi_time_reached(st, t);
}

static bool swa_match(void *self, cm_event ev, const cm_state *st) {
    swa *w = self;
    if (ev == CM_EVENT_INIT) return true;
    if (ev == CM_EVENT_AFTER_LOAD) return w->schedule_swa_lr && w->started;
    return ev == w->match_event && !w->completed && reached(st, w->swa_start);
}

static cm_status set_lr(swa *w, cm_state *st) {
    const double lr = cm_swa_lr(w->lr0_mult, w->target_mult, w->lr_steps, w->anneal_steps, w->anneal);
    return cm_state_set_lr_multiplier_override(st, lr);
}

/* SWALR works on one learning rate: the groups' common lr. */
static cm_status base_lr(const cm_state *st, double *out) {
    cm_optim *o = cm_state_optimizer(st);
    if (!o || cm_optim_n_groups(o) < 1) return cm_set_error(CM_ERR_STATE, "SWA: the trainer has no optimizer group");
    cm_optim_hparams hp;
    cm_optim_group_get(o, 0, &hp);
    for (int g = 1; g < cm_optim_n_groups(o); g++) {
        cm_optim_hparams h2;
        cm_optim_group_get(o, g, &h2);
        if (h2.lr != hp.lr)
            return cm_set_error(CM_ERR_INVALID_ARG, "SWA: schedule_swa_lr needs one learning rate, and optimizer group %d "
                                                    "has lr %g where group 0 has %g (Composer: SWA supports only one LR)",
                                g, h2.lr, hp.lr);
    }
    *out = hp.lr;
    return CM_OK;
}

static cm_status start(swa *w, cm_state *st) {
    cm_status s = cmi_wcopy_refresh(&w->avg, true); /* AveragedModel(deepcopy(model)) */
    if (s) return s;
    w->n_averaged = 0, w->lr_steps = 0;
    if (!w->schedule_swa_lr) return CM_OK;
    w->lr0_mult = cm_state_lr_multiplier(st);
    double lr;
    if ((s = base_lr(st, &lr))) return s;
    if (isnan(w->swa_lr)) w->target_mult = w->lr0_mult;
    else if (lr > 0) w->target_mult = w->swa_lr / lr;
    else return cm_set_error(CM_ERR_INVALID_ARG, "SWA: swa_lr %g cannot be reached from an optimizer lr of 0", w->swa_lr);
    return set_lr(w, st);
}

/* One update of the average: parameters averaged, buffers copied (AveragedModel), where the model
 * is (the copy follows it to the GPU). */
static cm_status average(swa *w) {
    cm_status s = cmi_wcopy_follow(&w->avg);
    const cmi_backend *be = cmi_backend_get(w->avg.dev);
    for (int i = 0; i < w->avg.n && !s; i++) {
        cmi_wentry *e = &w->avg.e[i];
        const void *m = cm_tensor_data(e->t);
        if (!e->is_param || w->n_averaged == 0)
            s = cmi_wcopy_memcpy(&w->avg, e->copy, m, (size_t)e->numel * cm_dtype_size(e->dtype));
        else if (be) /* cm_swa_average_update's roundings, on the device */
            s = be->swa_update(e->copy, m, e->numel, (float)(w->n_averaged + 1));
        else
            cm_swa_average_update(e->copy, m, e->numel, w->n_averaged);
    }
    return s;
}

static cm_status swa_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    swa *w = self;
    cm_status s;
    if (ev == CM_EVENT_INIT) {
        if ((s = cmi_algo_refuse_sharded("SWA", st))) return s;
        if (!cm_state_model(st)) return cm_set_error(CM_ERR_STATE, "SWA: the state has no model");
        if (w->schedule_swa_lr) {
            double lr;
            if ((s = base_lr(st, &lr))) return s;
        }
        cmi_wcopy_free(&w->avg);
        w->started = w->completed = false;
        w->n_averaged = w->step_counter = w->lr_steps = 0;
        /* made now so a checkpoint can be loaded into it */
        return cmi_wcopy_init(&w->avg, cm_model_module(cm_state_model(st)), true, true);
    }
    if (ev == CM_EVENT_AFTER_LOAD) return set_lr(w, st); /* the schedule the checkpoint was in */
    if (!w->started) {
        if ((s = start(w, st))) return s;
        w->started = true;
    }
    if (w->step_counter % w->update_interval.count == 0) {
        if ((s = average(w))) return s;
        w->n_averaged++;
        if (w->schedule_swa_lr) {
            w->lr_steps++;
            if ((s = set_lr(w, st))) return s;
        }
    }
    w->step_counter++;
    if (reached(st, w->swa_end)) {
        w->completed = true;
        double el = 0;
        if (cm_state_elapsed(st, &el) == CM_OK && el >= 1.0)
            cm_log_msg(CM_LOG_WARN, "SWA: the model was replaced by the averaged model at the end of training, so its "
                                    "batch-norm statistics were not recomputed by further training; end SWA at least an "
                                    "epoch before the end (swa_end)");
        for (int i = 0; i < w->avg.n; i++) {
            cmi_wentry *e = &w->avg.e[i];
            if ((s = cmi_wcopy_memcpy(&w->avg, cm_tensor_data(e->t), e->copy, (size_t)e->numel * cm_dtype_size(e->dtype))))
                return s;
        }
        cm_log_msg(CM_LOG_INFO, "SWA: set the model to the average of %lld models", (long long)w->n_averaged);
    }
    return CM_OK;
}

static size_t swa_save(void *self, char *buf, size_t cap) {
    swa *w = self;
    return (size_t)snprintf(buf, cap,
                            "{\"swa_started\": %s, \"swa_completed\": %s, \"step_counter\": %lld, \"n_averaged\": %lld, "
                            "\"swa_scheduler\": {\"step\": %lld, \"lr0_multiplier\": %.17g, \"target_multiplier\": %.17g}}",
                            w->started ? "true" : "false", w->completed ? "true" : "false", (long long)w->step_counter,
                            (long long)w->n_averaged, (long long)w->lr_steps, w->lr0_mult, w->target_mult);
}

static bool get_count(const cJSON *o, const char *k, int64_t *out) {
    return cmi_json_whole(cJSON_GetObjectItemCaseSensitive(o, k), 0, INT64_MAX, out);
}

static cm_status swa_load(void *self, const char *json, size_t len) {
    swa *w = self;
    cJSON *j = cJSON_ParseWithLength(json, len);
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "swa_started"),
                *cp = cJSON_GetObjectItemCaseSensitive(j, "swa_completed"),
                *sc = cJSON_GetObjectItemCaseSensitive(j, "swa_scheduler");
    const cJSON *l0 = cJSON_GetObjectItemCaseSensitive(sc, "lr0_multiplier"),
                *tm = cJSON_GetObjectItemCaseSensitive(sc, "target_multiplier");
    int64_t steps, n_avg, lr_steps;
    const bool ok = cJSON_IsBool(st) && cJSON_IsBool(cp) && get_count(j, "step_counter", &steps) &&
                    get_count(j, "n_averaged", &n_avg) && get_count(sc, "step", &lr_steps) && cJSON_IsNumber(l0) &&
                    cJSON_IsNumber(tm);
    if (ok) {
        w->started = cJSON_IsTrue(st), w->completed = cJSON_IsTrue(cp);
        w->step_counter = steps, w->n_averaged = n_avg, w->lr_steps = lr_steps;
        w->lr0_mult = l0->valuedouble, w->target_mult = tm->valuedouble;
    }
    cJSON_Delete(j);
    return ok ? CM_OK : cm_set_error(CM_ERR_FORMAT, "SWA: the saved state is incomplete");
}

static int swa_tensors(void *self, cm_plugin_tensor *out, int cap) { return cmi_wcopy_tensors(&((swa *)self)->avg, out, cap); }

static void swa_free(void *self) {
    swa *w = self;
    cmi_wcopy_free(&w->avg);
    cm_free(w);
}

static const cm_algorithm_i swa_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "SWA",
    .match = swa_match,
    .apply = swa_apply,
    .save = swa_save,
    .load = swa_load,
    .free = swa_free,
    .tensors = swa_tensors,
};

cm_status cm_swa_new(const cm_swa_config *cfg, cm_algorithm_plugin *out) {
    if (!cfg || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_swa_new: NULL config or output");
    swa w = {0};
    cm_status s;
    const unsigned dur_ep = CMI_UNIT(CM_TIME_DURATION) | CMI_UNIT(CM_TIME_EPOCH);
    const unsigned ba_ep = CMI_UNIT(CM_TIME_BATCH) | CMI_UNIT(CM_TIME_EPOCH);
    if ((s = cmi_algo_time("SWA", "swa_start", cfg->swa_start, dur_ep, "dur or ep", &w.swa_start)) ||
        (s = cmi_algo_time("SWA", "swa_end", cfg->swa_end, dur_ep, "dur or ep", &w.swa_end)) ||
        (s = cmi_algo_time("SWA", "update_interval", cfg->update_interval, ba_ep, "ba or ep", &w.update_interval)))
        return s;
    if (w.swa_start.unit != w.swa_end.unit)
        return cm_set_error(CM_ERR_INVALID_ARG, "SWA: swa_start '%s' and swa_end '%s' must have the same unit",
                            cfg->swa_start, cfg->swa_end);
    if (cm_time_value(w.swa_start) >= cm_time_value(w.swa_end))
        return cm_set_error(CM_ERR_INVALID_ARG, "SWA: swa_end '%s' must come after swa_start '%s'", cfg->swa_end,
                            cfg->swa_start);
    if (w.swa_start.unit == CM_TIME_DURATION && (w.swa_end.frac > 1 || w.swa_start.frac < 0))
        return cm_set_error(CM_ERR_INVALID_ARG, "SWA: times in dur must be in [0, 1] (swa_start '%s', swa_end '%s')",
                            cfg->swa_start, cfg->swa_end);
    if (w.swa_end.unit == CM_TIME_DURATION && w.swa_end.frac == 1)
        cm_log_msg(CM_LOG_WARN, "SWA: swa_end = 1dur: the averaged model's batch-norm statistics will not be updated "
                                "by further training, which hurts accuracy (see swa_end in composer/train_algos.h)");
    if (w.update_interval.count < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "SWA: update_interval '%s' must be at least 1", cfg->update_interval);
    if (cfg->anneal_steps <= 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "SWA: anneal_steps %lld must be greater than 0", (long long)cfg->anneal_steps);
    if ((s = cm_swa_anneal_parse(cfg->anneal_strategy, &w.anneal))) return s;
    if (!isnan(cfg->swa_lr) && (!(cfg->swa_lr >= 0) || !isfinite(cfg->swa_lr)))
        return cm_set_error(CM_ERR_INVALID_ARG, "SWA: swa_lr %g must be >= 0 and finite (or unset)", cfg->swa_lr);
    w.schedule_swa_lr = cfg->schedule_swa_lr;
    w.anneal_steps = cfg->anneal_steps;
    w.swa_lr = cfg->swa_lr;
    w.match_event = w.update_interval.unit == CM_TIME_BATCH ? CM_EVENT_BATCH_END : CM_EVENT_EPOCH_END;
    swa *p = cm_alloc_zeroed(sizeof *p, 64);
    if (!p) return cm_set_error(CM_ERR_OOM, "SWA: out of memory");
    *p = w;
    *out = (cm_algorithm_plugin){&swa_vt, p};
    return CM_OK;
}
