/* SpeedMonitor: throughput over a sliding window of batches, FLOP/s and MFU, wall-clock split
 * into training and evaluation (Composer's SpeedMonitor). */
#include "cb_impl.h"

#include <stdlib.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    double sample, token, wct, flops; /* global counts and total_wct after a batch; that batch's FLOPs (0 = unknown) */
} sm_entry;

typedef struct {
    cm_speed_monitor_config cfg;
    double peak;          /* resolved peak FLOP/s (0 = none) */
    bool peak_resolved;
    sm_entry *ring;       /* (window_size + 1) */
    int cap, n, head;     /* head: where the next entry goes */
    double total_eval_wct;
    double eval_t0;       /* clock at EVAL_START */
} speed_monitor;

static const sm_entry *sm_at(const speed_monitor *m, int i) { /* i-th oldest */
    return &m->ring[(m->head - m->n + i + m->cap) % m->cap];
}

static void sm_push(speed_monitor *m, sm_entry e) {
    m->ring[m->head] = e;
    m->head = (m->head + 1) % m->cap;
    if (m->n < m->cap) m->n++;
}

/* The peak for MFU: the configured one, else on a GPU the data sheet's for the precision (bf16
 * under amp_bf16, f32 — or TF32 with CM_CUDA_TF32=1 — otherwise), else the CPU's measured peak. */
static cm_status sm_resolve_peak(speed_monitor *m, const cm_state *st) {
    if (m->peak_resolved) return CM_OK;
    m->peak_resolved = true;
    if (m->cfg.peak_flops > 0) {
        m->peak = m->cfg.peak_flops;
        return CM_OK;
    }
    if (m->cfg.peak_flops < 0) return CM_OK;
    const cm_model *model = cm_state_model(st);
    const cm_device dev = model ? cm_module_device(cm_model_module((cm_model *)model)) : CM_DEVICE_CPU;
    if (dev != CM_DEVICE_CPU) {
        const char *tf = getenv("CM_CUDA_TF32");
        const cm_dtype dt = cm_state_precision(st) == CM_PRECISION_AMP_BF16 ? CM_DTYPE_BF16
                            : tf && tf[0] == '1'                             ? CM_DTYPE_F16
                                                                             : CM_DTYPE_F32;
        cm_status s = cm_device_peak_flops(dev, dt, &m->peak);
        if (s == CM_ERR_NOT_FOUND) { /* MFU is left out, the rest is logged; said once */
            cm_log_msg(CM_LOG_WARN, "SpeedMonitor: %s; MFU is not logged", cm_last_error());
            m->peak = 0;
            return CM_OK;
        }
        return s;
    }
    return cm_peak_flops(&m->peak);
}

static cm_status sm_batch_end(speed_monitor *m, const cm_state *st, cm_logger *lg) {
    const cm_timestamp *ts = cm_state_timestamp(st);
    /* A fit with reset_time starts the counts again: the old window means nothing now. */
    if (m->n && ((double)ts->sample < sm_at(m, m->n - 1)->sample || ts->total_wct < sm_at(m, m->n - 1)->wct))
        m->n = m->head = 0;
    const int world = cm_state_world_size(st) > 0 ? cm_state_world_size(st) : 1;
    double flops = 0;
    cm_model *model = cm_state_model(st);
    const cm_model_batch *mb = cm_state_model_batch(st);
    if (model && mb) {
        const double fps = cm_model_flops_per_sample(model, mb);
        /* FLOPs of the global batch: the batch's global samples (the timestamp's step). */
        const double samples = m->n ? (double)ts->sample - sm_at(m, m->n - 1)->sample : (double)mb->n_samples * world;
        if (fps > 0 && samples > 0) flops = fps * samples;
    }
    sm_push(m, (sm_entry){(double)ts->sample, (double)ts->token, ts->total_wct, flops});

    cm_metric_value v[16];
    int k = 0;
    if (m->n == m->cap) {
        const sm_entry *o = sm_at(m, 0), *nw = sm_at(m, m->n - 1);
        const double dwct = nw->wct - o->wct;
        if (dwct > 0) {
            const double bps = (double)(m->n - 1) / dwct, sps = (nw->sample - o->sample) / dwct;
            v[k++] = (cm_metric_value){"throughput/batches_per_sec", bps};
            v[k++] = (cm_metric_value){"throughput/samples_per_sec", sps};
            v[k++] = (cm_metric_value){"throughput/device/batches_per_sec", bps / world};
            v[k++] = (cm_metric_value){"throughput/device/samples_per_sec", sps / world};
            const double dtok = nw->token - o->token;
            if (dtok > 0) {
                v[k++] = (cm_metric_value){"throughput/tokens_per_sec", dtok / dwct};
                v[k++] = (cm_metric_value){"throughput/device/tokens_per_sec", dtok / dwct / world};
            }
            double wflops = 0;
            bool all = true;
            for (int i = 1; i < m->n; i++) {
                wflops += sm_at(m, i)->flops;
                all = all && sm_at(m, i)->flops > 0;
            }
            if (all) {
                cm_status s = sm_resolve_peak(m, st);
                if (s) return s;
                const double fl = wflops / dwct;
                v[k++] = (cm_metric_value){"throughput/flops_per_sec", fl};
                v[k++] = (cm_metric_value){"throughput/device/flops_per_sec", fl / world};
                if (m->peak > 0) {
                    v[k++] = (cm_metric_value){"throughput/device/mfu", fl / world / m->peak};
                    v[k++] = (cm_metric_value){"throughput/mfu", fl / world / m->peak};
                }
            }
        }
    }
    const double div = cm_wall_unit_seconds(m->cfg.time_unit);
    v[k++] = (cm_metric_value){"wall_clock/train", ts->total_wct / div};
    v[k++] = (cm_metric_value){"wall_clock/val", m->total_eval_wct / div};
    v[k++] = (cm_metric_value){"wall_clock/total", (ts->total_wct + m->total_eval_wct) / div};
    return cm_logger_log_metrics(lg, v, k);
}

static cm_status sm_run_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    speed_monitor *m = self;
    switch (ev) {
    case CM_EVENT_BATCH_END: return sm_batch_end(m, st, lg);
    case CM_EVENT_EVAL_START: m->eval_t0 = cbi_now(m->cfg.clock, m->cfg.clock_data); return CM_OK;
    case CM_EVENT_EVAL_END: m->total_eval_wct += cbi_now(m->cfg.clock, m->cfg.clock_data) - m->eval_t0; return CM_OK;
    default: return CM_OK;
    }
}

static size_t sm_save(void *self, char *buf, size_t cap) {
    speed_monitor *m = self;
    cJSON *o = cJSON_CreateObject(), *w = cJSON_CreateArray();
    if (!o || !w) {
        cJSON_Delete(o);
        cJSON_Delete(w);
        return 0;
    }
    cJSON_AddNumberToObject(o, "total_eval_wct", m->total_eval_wct);
    for (int i = 0; i < m->n; i++) {
        const sm_entry *e = sm_at(m, i);
        const double row[4] = {e->sample, e->token, e->wct, e->flops};
        cJSON_AddItemToArray(w, cJSON_CreateDoubleArray(row, 4));
    }
    cJSON_AddItemToObject(o, "window", w);
    return cbi_json_save(o, buf, cap);
}

static cm_status sm_load(void *self, const char *json, size_t len) {
    speed_monitor *m = self;
    cJSON *o;
    cm_status s = cbi_json_parse("SpeedMonitor", json, len, &o);
    if (s) return s;
    double eval_wct;
    if ((s = cbi_json_number("SpeedMonitor", o, "total_eval_wct", &eval_wct))) goto out;
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(o, "window");
    if (w && !cJSON_IsArray(w)) {
        s = cm_set_error(CM_ERR_FORMAT, "SpeedMonitor: the saved 'window' is not an array");
        goto out;
    }
    const int n = w ? cJSON_GetArraySize(w) : 0;
    for (int i = 0; i < n; i++) {
        const cJSON *row = cJSON_GetArrayItem(w, i);
        if (!cJSON_IsArray(row) || cJSON_GetArraySize(row) != 4) {
            s = cm_set_error(CM_ERR_FORMAT, "SpeedMonitor: window entry %d is not [sample, token, wct, flops]", i);
            goto out;
        }
        for (int j = 0; j < 4; j++)
            if (!cJSON_IsNumber(cJSON_GetArrayItem(row, j))) {
                s = cm_set_error(CM_ERR_FORMAT, "SpeedMonitor: window entry %d has a non-number", i);
                goto out;
            }
    }
    m->total_eval_wct = eval_wct;
    m->n = m->head = 0;
    /* A window saved with another size: keep its newest entries. */
    for (int i = n > m->cap ? n - m->cap : 0; i < n; i++) {
        const cJSON *row = cJSON_GetArrayItem(w, i);
        sm_push(m, (sm_entry){cJSON_GetArrayItem(row, 0)->valuedouble, cJSON_GetArrayItem(row, 1)->valuedouble,
                              cJSON_GetArrayItem(row, 2)->valuedouble, cJSON_GetArrayItem(row, 3)->valuedouble});
    }
out:
    cJSON_Delete(o);
    return s;
}

static void sm_free(void *self) {
    speed_monitor *m = self;
    if (!m) return;
    cm_free(m->ring);
    cm_free(m);
}

static const cm_callback_i speed_monitor_vt = {
    .abi = CM_CALLBACK_ABI,
    .name = "SpeedMonitor",
    .run_event = sm_run_event,
    .save = sm_save,
    .load = sm_load,
    .free = sm_free,
};

cm_speed_monitor_config cm_speed_monitor_config_default(void) {
    return (cm_speed_monitor_config){.window_size = 100, .peak_flops = 0, .time_unit = CM_WALL_HOURS};
}

cm_status cm_speed_monitor_new(const cm_speed_monitor_config *cfg, cm_callback_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_speed_monitor_new: out is NULL");
    cm_speed_monitor_config c = cfg ? *cfg : cm_speed_monitor_config_default();
    if (c.window_size < 1 || c.window_size > (1 << 24))
        return cm_set_error(CM_ERR_INVALID_ARG, "SpeedMonitor: window_size %d must be in [1, 16777216]", c.window_size);
    if (!isfinite(c.peak_flops))
        return cm_set_error(CM_ERR_INVALID_ARG, "SpeedMonitor: peak_flops %g must be finite (0 = measure, < 0 = no MFU)",
                            c.peak_flops);
    if ((unsigned)c.time_unit >= CM_WALL_UNIT_COUNT)
        return cm_set_error(CM_ERR_INVALID_ARG, "SpeedMonitor: time_unit %d is not valid (seconds, minutes, hours, days)",
                            (int)c.time_unit);
    speed_monitor *m = cm_alloc_zeroed(sizeof *m, 16);
    if (!m) return CM_ERR_OOM;
    m->cfg = c;
    m->cap = c.window_size + 1;
    m->ring = cm_alloc_zeroed(sizeof *m->ring * (size_t)m->cap, 16);
    if (!m->ring) {
        sm_free(m);
        return CM_ERR_OOM;
    }
    *out = (cm_callback_plugin){&speed_monitor_vt, m};
    return CM_OK;
}
