/* EMA: Composer's exponential moving average of the weights — the functional form
 * (cm_ema_update, cm_compute_ema) and the algorithm (events and checkpoints in train_algos.h). */
#include "plugins/train_algos_impl.h"
#include "tensor/backend.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

cm_ema_config cm_ema_config_default(void) {
    return (cm_ema_config){.half_life = "1000ba", .smoothing = NAN, .ema_start = "0.0dur", .update_interval = NULL};
}

double cm_ema_smoothing(double half_life, double update_interval) {
    if (half_life == 0) return 0.0;
    return pow(2.0, -(update_interval / half_life));
}

/* torch: ema * s + param * (1. - s) on f32 tensors — each product and the sum rounded to f32, s
 * and (1 - s) rounded to f32 first. No fused multiply-add: it would round once instead of twice
 * and differ from torch in the last bit. */
__attribute__((optimize("fp-contract=off"))) void cm_ema_update(float *ema, const float *model, int64_t n,
                                                                double smoothing) {
    const float s = (float)smoothing, oms = (float)(1.0 - smoothing);
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
        const float a = ema[i] * s, b = model[i] * oms;
        ema[i] = a + b;
    }
}

/* An integer buffer (num_batches_tracked): torch promotes to f32, averages, and copy_ truncates. */
__attribute__((optimize("fp-contract=off"))) static void ema_update_i64(int64_t *ema, const int64_t *model, int64_t n,
                                                                        double smoothing) {
    const float s = (float)smoothing, oms = (float)(1.0 - smoothing);
    for (int64_t i = 0; i < n; i++) {
        const float a = (float)ema[i] * s, b = (float)model[i] * oms;
        ema[i] = (int64_t)(a + b);
    }
}

/* ema ← the average of ema and model (n elements of dt) where both are, on dev. */
static cm_status update_tensor(cm_device dev, void *ema, const void *model, cm_dtype dt, int64_t n, double smoothing,
                               const char *name) {
    if (dt != CM_DTYPE_F32 && dt != CM_DTYPE_I64)
        return cm_set_error(CM_ERR_DTYPE, "EMA: tensor '%s' is %s; only f32 and i64 tensors are averaged", name,
                            cm_dtype_name(dt));
    if (dev != CM_DEVICE_CPU) /* the same roundings, on the device */
        return cmi_backend_get(dev)->ema_update(ema, model, dt, n, (float)smoothing, (float)(1.0 - smoothing));
    if (dt == CM_DTYPE_F32) cm_ema_update(ema, model, n, smoothing);
    else ema_update_i64(ema, model, n, smoothing);
    return CM_OK;
}

cm_status cm_compute_ema(cm_module *model, cm_module *ema_model, double smoothing) {
    if (!model || !ema_model) return cm_set_error(CM_ERR_INVALID_ARG, "compute_ema: NULL model");
    if (!(smoothing >= 0 && smoothing <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "compute_ema: smoothing %g must be in [0, 1]", smoothing);
    const int64_t np = cm_module_n_params(model), nb = cm_module_n_buffers(model);
    /* check everything first: nothing changes unless every matched tensor fits */
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t i = 0; i < np + nb; i++) {
            const char *name;
            cm_tensor *src, *dst;
            if (i < np) {
                cm_param_info pi = cm_module_param_info(model, i);
                name = pi.name, src = pi.tensor, dst = cm_module_find_param(ema_model, name);
            } else {
                cm_buffer_info bi = cm_module_buffer_info(model, i - np);
                name = bi.name, src = bi.tensor, dst = cm_module_find_buffer(ema_model, name);
            }
            if (!dst) continue;
            if (pass == 0) {
                bool same = cm_tensor_ndim(src) == cm_tensor_ndim(dst) && cm_tensor_dtype(src) == cm_tensor_dtype(dst) &&
                            cm_tensor_is_contiguous(src) && cm_tensor_is_contiguous(dst);
                for (int d = 0; same && d < cm_tensor_ndim(src); d++) same = cm_tensor_dim(src, d) == cm_tensor_dim(dst, d);
                if (!same)
                    return cm_set_error(CM_ERR_SHAPE, "compute_ema: '%s' has another shape, dtype or layout in the EMA "
                                                      "model", name);
                if (cm_tensor_dtype(src) != CM_DTYPE_F32 && cm_tensor_dtype(src) != CM_DTYPE_I64)
                    return cm_set_error(CM_ERR_DTYPE, "compute_ema: '%s' is %s; only f32 and i64 tensors are averaged",
                                        name, cm_dtype_name(cm_tensor_dtype(src)));
                if (cm_tensor_device(src) != cm_tensor_device(dst))
                    return cm_set_error(CM_ERR_INVALID_ARG, "compute_ema: '%s' is on %s in the model but on %s in the EMA "
                                                            "model (move both to one device)", name,
                                        cm_device_name(cm_tensor_device(src)), cm_device_name(cm_tensor_device(dst)));
            } else {
                cm_status s = update_tensor(cm_tensor_device(src), cm_tensor_data(dst), cm_tensor_data(src),
                                            cm_tensor_dtype(src), cm_tensor_numel(src), smoothing, name);
                if (s) return s;
            }
        }
    }
    return CM_OK;
}

/* ---- the algorithm ---- */

struct cm_ema {
    bool has_half_life;
    cm_time half_life, ema_start, update_interval;
    double smoothing;
    cm_event update_event;
    cm_model *model; /* the state's, from INIT */
    cmi_wcopy w;     /* the average (or, while ema_weights_active, the training weights) */
    bool ema_started, ema_weights_active;
};

static bool should_start(const cm_ema *e, const cm_state *st) { return cmi_time_reached(st, e->ema_start); }

static bool at_interval(const cm_ema *e, const cm_state *st) {
    cm_time now;
    if (cm_timestamp_get(cm_state_timestamp(st), e->update_interval.unit, &now)) return false;
    return e->update_interval.count > 0 && now.count % e->update_interval.count == 0;
}

static bool ema_match(void *self, cm_event ev, const cm_state *st) {
    cm_ema *e = self;
    if (ev == CM_EVENT_INIT) return true;
    if (ev == e->update_event) return (!e->ema_started && should_start(e, st)) || (e->ema_started && at_interval(e, st));
    if (!e->ema_started) return false;
    switch (ev) {
    case CM_EVENT_BATCH_START: return e->ema_weights_active;
    case CM_EVENT_EVAL_START:
    case CM_EVENT_EVAL_END: return true;
    case CM_EVENT_BATCH_CHECKPOINT:
    case CM_EVENT_EPOCH_CHECKPOINT: return cm_state_checkpoint_due(st);
    default: return false;
    }
}

static cm_status activate(cm_ema *e, bool ema_weights) {
    if (e->ema_weights_active == ema_weights) return CM_OK;
    cm_status s = cmi_wcopy_swap(&e->w);
    if (!s) e->ema_weights_active = ema_weights;
    return s;
}

static cm_status ema_update_all(cm_ema *e) {
    cm_status s = cmi_wcopy_follow(&e->w); /* the average lives where the model trains */
    for (int i = 0; i < e->w.n && !s; i++) {
        cmi_wentry *x = &e->w.e[i];
        if (x->tracked)
            s = update_tensor(e->w.dev, x->copy, cm_tensor_data(x->t), x->dtype, x->numel, e->smoothing, x->name);
    }
    return s;
}

static cm_status ema_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    cm_ema *e = self;
    cm_status s;
    if (ev == CM_EVENT_INIT) {
        if ((s = cmi_algo_refuse_sharded("EMA", st))) return s;
        cm_model *m = cm_state_model(st);
        if (!m) return cm_set_error(CM_ERR_STATE, "EMA: the state has no model");
        cmi_wcopy_free(&e->w);
        e->model = m;
        e->ema_started = e->ema_weights_active = false;
        /* made now so a checkpoint can be loaded into it */
        return cmi_wcopy_init(&e->w, cm_model_module(m), true, false);
    }
    if (ev == e->update_event) {
        if ((s = activate(e, false))) return s;
        if (!e->ema_started && should_start(e, st)) {
            /* the average starts from the model as it is now */
            if ((s = cmi_wcopy_refresh(&e->w, false))) return s;
            e->ema_started = true;
        }
        if (e->ema_started && at_interval(e, st)) return ema_update_all(e);
        return CM_OK;
    }
    switch (ev) {
    case CM_EVENT_BATCH_START:
    case CM_EVENT_EVAL_END: return activate(e, false);
    case CM_EVENT_EVAL_START:
    case CM_EVENT_BATCH_CHECKPOINT:
    case CM_EVENT_EPOCH_CHECKPOINT: return activate(e, true);
    default: return CM_OK;
    }
}

static size_t ema_save(void *self, char *buf, size_t cap) {
    cm_ema *e = self;
    char head[160];
    const int h = snprintf(head, sizeof head, "{\"ema_started\": %s, \"ema_weights_active\": %s, \"smoothing\": %.17g, "
                                             "\"untracked\": ",
                           e->ema_started ? "true" : "false", e->ema_weights_active ? "true" : "false", e->smoothing);
    const size_t list = cmi_wcopy_untracked_json(&e->w, NULL, 0), need = (size_t)h + list + 1;
    if (cap >= need + 1) {
        memcpy(buf, head, (size_t)h);
        cmi_wcopy_untracked_json(&e->w, buf + h, cap - (size_t)h);
        buf[h + list] = '}';
        buf[h + list + 1] = 0;
    } else if (cap) {
        buf[0] = 0;
    }
    return need;
}

static cm_status ema_load(void *self, const char *json, size_t len) {
    cm_ema *e = self;
    cJSON *j = cJSON_ParseWithLength(json, len);
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "ema_started");
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "ema_weights_active");
    const cJSON *un = cJSON_GetObjectItemCaseSensitive(j, "untracked");
    if (!cJSON_IsBool(st) || !cJSON_IsBool(act) || !cJSON_IsArray(un)) {
        cJSON_Delete(j);
        return cm_set_error(CM_ERR_FORMAT, "EMA: the saved state lacks ema_started, ema_weights_active or untracked");
    }
    cm_status s = cmi_wcopy_set_untracked(&e->w, un, "EMA");
    if (!s) {
        /* the model was loaded with whatever the checkpoint's model held: the averaged weights if
         * they were active at the save, and the EMA's tensors hold the others */
        e->ema_started = cJSON_IsTrue(st);
        e->ema_weights_active = cJSON_IsTrue(act);
    }
    cJSON_Delete(j);
    return s;
}

static int ema_tensors(void *self, cm_plugin_tensor *out, int cap) { return cmi_wcopy_tensors(&((cm_ema *)self)->w, out, cap); }

static void ema_free(void *self) {
    cm_ema *e = self;
    cmi_wcopy_free(&e->w);
    cm_free(e);
}

static const cm_algorithm_i ema_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "EMA",
    .match = ema_match,
    .apply = ema_apply,
    .save = ema_save,
    .load = ema_load,
    .free = ema_free,
    .tensors = ema_tensors,
};

cm_status cm_ema_new(const cm_ema_config *cfg, cm_ema **handle, cm_algorithm_plugin *out) {
    if (!cfg || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_ema_new: NULL config or output");
    const bool has_hl = cfg->half_life != NULL, has_sm = !isnan(cfg->smoothing);
    if (has_hl == has_sm)
        return cm_set_error(CM_ERR_INVALID_ARG, "EMA: %s", has_hl ? "give only one of half_life and smoothing (set "
                                                                    "half_life to null to use smoothing)"
                                                                  : "either half_life or smoothing must be given");
    const unsigned ba_ep = CMI_UNIT(CM_TIME_BATCH) | CMI_UNIT(CM_TIME_EPOCH);
    cm_ema e = {0};
    cm_status s;
    e.has_half_life = has_hl;
    if (has_hl && (s = cmi_algo_time("EMA", "half_life", cfg->half_life, ba_ep, "ba or ep", &e.half_life))) return s;
    if ((s = cmi_algo_time("EMA", "ema_start", cfg->ema_start ? cfg->ema_start : "0.0dur",
                           ba_ep | CMI_UNIT(CM_TIME_DURATION) | CMI_UNIT(CM_TIME_SAMPLE) | CMI_UNIT(CM_TIME_TOKEN),
                           "dur, ba, ep, sp or tok", &e.ema_start)))
        return s;
    if (cfg->update_interval) {
        if ((s = cmi_algo_time("EMA", "update_interval", cfg->update_interval, ba_ep, "ba or ep", &e.update_interval)))
            return s;
        if (e.update_interval.count < 1)
            return cm_set_error(CM_ERR_INVALID_ARG, "EMA: update_interval '%s' must be at least 1", cfg->update_interval);
    } else {
        e.update_interval = cm_time_make(1, has_hl ? e.half_life.unit : CM_TIME_BATCH);
    }
    if (has_hl && e.half_life.unit != e.update_interval.unit)
        return cm_set_error(CM_ERR_INVALID_ARG, "EMA: the units of half_life '%s' and update_interval '%s' must match",
                            cfg->half_life, cfg->update_interval);
    if (has_sm && !(cfg->smoothing >= 0 && cfg->smoothing <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "EMA: smoothing %g must be in [0, 1]", cfg->smoothing);
    e.smoothing = has_sm ? cfg->smoothing : cm_ema_smoothing((double)e.half_life.count, (double)e.update_interval.count);
    e.update_event = e.update_interval.unit == CM_TIME_BATCH ? CM_EVENT_BATCH_END : CM_EVENT_EPOCH_END;
    cm_ema *p = cm_alloc_zeroed(sizeof *p, 64);
    if (!p) return cm_set_error(CM_ERR_OOM, "EMA: out of memory");
    *p = e;
    *out = (cm_algorithm_plugin){&ema_vt, p};
    if (handle) *handle = p;
    return CM_OK;
}

double cm_ema_get_smoothing(const cm_ema *e) { return e ? e->smoothing : NAN; }
bool cm_ema_started(const cm_ema *e) { return e && e->ema_started; }
bool cm_ema_weights_active(const cm_ema *e) { return e && e->ema_weights_active; }

static cm_status use(cm_ema *e, bool ema_weights) {
    if (!e) return cm_set_error(CM_ERR_INVALID_ARG, "EMA: NULL handle");
    if (!e->model) return cm_set_error(CM_ERR_STATE, "EMA: no model yet (the trainer runs INIT in cm_trainer_new)");
    return activate(e, ema_weights);
}

cm_status cm_ema_use_ema_weights(cm_ema *e) { return use(e, true); }
cm_status cm_ema_use_training_weights(cm_ema *e) { return use(e, false); }
