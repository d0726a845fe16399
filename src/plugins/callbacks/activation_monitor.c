/* ActivationMonitor (Composer's): statistics of every module's inputs and outputs at an interval,
 * through forward hooks on the module tree. */
#include "cb_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct named {
    cm_module *m;
    char *path;
} named;

typedef struct act_mon {
    cm_activation_monitor_config cfg;
    char **ignore;
    named *names;
    int n_names, cap_names;
    cm_module *hooked;
    cm_logger *lg;
    cm_status err; /* the first logging error inside a hook */
    char err_msg[1024];
} act_mon;

cm_activation_monitor_config cm_activation_monitor_config_default(void) {
    return (cm_activation_monitor_config){{CM_TIME_BATCH, 25, 0}, NULL, 0, true};
}

static bool collect(cm_module *m, const char *path, int depth, void *data) {
    act_mon *a = data;
    if (a->n_names == a->cap_names) {
        const int cap = a->cap_names ? 2 * a->cap_names : 64;
        named *nn = cm_alloc(sizeof *nn * (size_t)cap, 16);
        if (!nn) return false;
        if (a->n_names) memcpy(nn, a->names, sizeof *nn * (size_t)a->n_names);
        cm_free(a->names);
        a->names = nn, a->cap_names = cap;
    }
    char *p = cbi_strdup(path);
    if (!p) return false;
    a->names[a->n_names++] = (named){m, p};
    return true;
}

static const char *path_of(const act_mon *a, const cm_module *m) {
    for (int i = 0; i < a->n_names; i++)
        if (a->names[i].m == m) return a->names[i].path;
    return NULL;
}

/* The four statistics of t over its last dimension, averaged over the rows (Composer's). */
static bool stats(const cm_tensor *t, double out[4]) {
    const cm_dtype dt = cm_tensor_dtype(t);
    if (dt != CM_DTYPE_F32 && dt != CM_DTYPE_BF16 && dt != CM_DTYPE_F16) return false;
    const int nd = cm_tensor_ndim(t);
    const int64_t n = cm_tensor_numel(t), d = nd ? cm_tensor_shape(t)[nd - 1] : 1;
    if (n == 0 || d == 0) return false;
    const int64_t rows = n / d;
    /* host f32 read in place; anything else (bf16, strided views, a GPU tensor) through one
     * contiguous f32 host copy — never element by element (a GPU element is a transfer) */
    cm_tensor *h = NULL, *c = NULL;
    if (!(dt == CM_DTYPE_F32 && cm_tensor_is_contiguous(t) && cm_tensor_device(t) == CM_DEVICE_CPU)) {
        bool ok = cm_tensor_device(t) == CM_DEVICE_CPU || cm_tensor_to_device(t, CM_DEVICE_CPU, &c) == CM_OK;
        ok = ok && cm_tensor_new(CM_DTYPE_F32, nd, cm_tensor_shape(t), &h) == CM_OK;
        ok = ok && cm_tensor_copy(h, c ? c : t) == CM_OK;
        cm_tensor_free(c);
        if (!ok) {
            cm_tensor_free(h);
            return false;
        }
    }
    const float *f = cm_tensor_data(h ? h : t);
    double sum = 0, l2 = 0, kurt = 0, mx = 0;
    for (int64_t r = 0; r < rows; r++) {
        double s1 = 0, s2 = 0, m = -INFINITY;
        for (int64_t j = 0; j < d; j++) {
            const double v = f[r * d + j];
            s1 += v, s2 += v * v;
            if (v > m) m = v;
        }
        const double mean = s1 / (double)d;
        double m2 = 0, m4 = 0;
        for (int64_t j = 0; j < d; j++) {
            const double v = f[r * d + j] - mean;
            m2 += v * v, m4 += v * v * v * v;
        }
        m2 /= (double)d, m4 /= (double)d;
        sum += s1, l2 += sqrt(s2), mx += m, kurt += m4 / (m2 * m2);
    }
    cm_tensor_free(h);
    out[0] = mx / (double)rows;
    out[1] = sum / (double)n;
    out[2] = l2 / (double)rows;
    out[3] = kurt / (double)rows;
    return true;
}

static void log_tensor(act_mon *a, const char *path, const char *suffix, const cm_tensor *t) {
    double v[4];
    if (a->err || !t || !stats(t, v)) return;
    static const char *const kinds[4] = {"max", "average", "l2_norm", "kurtosis"};
    char names[4][600];
    cm_metric_value m[4];
    for (int k = 0; k < 4; k++) {
        snprintf(names[k], sizeof names[k], "activations/%s/%s%s", kinds[k], path, suffix);
        m[k] = (cm_metric_value){names[k], v[k]};
    }
    cm_status s = cm_logger_log_metrics(a->lg, m, 4);
    if (s) {
        a->err = s;
        snprintf(a->err_msg, sizeof a->err_msg, "%s", cm_last_error());
    }
}

static void hook(cm_module *m, int n_in, cm_tensor *const *in, cm_tensor *out, void *data) {
    act_mon *a = data;
    const char *path = path_of(a, m);
    if (!path) return;
    for (int i = 0; i < a->cfg.n_ignore_module_types; i++)
        if (strstr(path, a->ignore[i])) return;
    char suffix[32];
    for (int i = 0; i < n_in; i++) {
        snprintf(suffix, sizeof suffix, "_input.%d", i);
        log_tensor(a, path, suffix, in[i]);
    }
    log_tensor(a, path, "_output.0", out);
}

static bool due(const act_mon *a, const cm_state *st) {
    const cm_timestamp *ts = cm_state_timestamp(st);
    if (cm_state_microbatch_index(st) != 0) return false;
    if (a->cfg.interval.unit == CM_TIME_BATCH) return ts->batch % a->cfg.interval.count == 0;
    return ts->batch_in_epoch == 0 && ts->epoch % a->cfg.interval.count == 0;
}

static cm_status am_run_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    act_mon *a = self;
    if (ev == CM_EVENT_BEFORE_FORWARD && due(a, st)) {
        cm_module *root = cm_model_module(cm_state_model(st));
        if (!a->n_names && root) {
            if (!cm_module_visit(root, collect, a)) return cm_set_error(CM_ERR_OOM, "ActivationMonitor: out of memory");
        }
        a->lg = lg;
        a->hooked = root;
        cm_module_set_forward_hook(root, hook, a);
    } else if (ev == CM_EVENT_AFTER_FORWARD && a->hooked) {
        cm_module_set_forward_hook(a->hooked, NULL, NULL);
        a->hooked = NULL;
        if (a->err) {
            cm_status s = a->err;
            a->err = CM_OK;
            return cm_set_error(s, "%s", a->err_msg);
        }
    }
    return CM_OK;
}

static cm_status am_close(void *self, const cm_state *st, cm_logger *lg) {
    act_mon *a = self;
    if (a->hooked) cm_module_set_forward_hook(a->hooked, NULL, NULL);
    a->hooked = NULL;
    return CM_OK;
}

static void am_free(void *self) {
    act_mon *a = self;
    for (int i = 0; i < a->n_names; i++) cm_free(a->names[i].path);
    cm_free(a->names);
    for (int i = 0; a->ignore && i < a->cfg.n_ignore_module_types; i++) cm_free(a->ignore[i]);
    cm_free(a->ignore);
    cm_free(a);
}

static const cm_callback_i act_vt = {
    .abi = CM_CALLBACK_ABI,
    .name = "ActivationMonitor",
    .run_event = am_run_event,
    .close = am_close,
    .free = am_free,
};

cm_status cm_activation_monitor_new(const cm_activation_monitor_config *cfg, cm_callback_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_activation_monitor_new: out is NULL");
    *out = (cm_callback_plugin){0};
    const cm_activation_monitor_config c = cfg ? *cfg : cm_activation_monitor_config_default();
    if ((c.interval.unit != CM_TIME_BATCH && c.interval.unit != CM_TIME_EPOCH) || c.interval.count < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "ActivationMonitor: interval must be a positive count of ba or ep");
    if (c.n_ignore_module_types < 0 || (c.n_ignore_module_types > 0 && !c.ignore_module_types))
        return cm_set_error(CM_ERR_INVALID_ARG, "ActivationMonitor: n_ignore_module_types without the array");
    if (c.interval.unit == CM_TIME_BATCH && c.interval.count < 10)
        cm_log_msg(CM_LOG_WARN, "ActivationMonitor: interval %lldba is below the recommended 10ba (the hooks cost "
                                "throughput)", (long long)c.interval.count);
    act_mon *a = cm_alloc_zeroed(sizeof *a, 16);
    if (!a) return cm_set_error(CM_ERR_OOM, "ActivationMonitor: out of memory");
    a->cfg = c;
    if (c.n_ignore_module_types) {
        a->cfg.n_ignore_module_types = 0;
        if (!(a->ignore = cm_alloc_zeroed(sizeof *a->ignore * (size_t)c.n_ignore_module_types, 16))) {
            am_free(a);
            return cm_set_error(CM_ERR_OOM, "ActivationMonitor: out of memory");
        }
        for (int i = 0; i < c.n_ignore_module_types; i++, a->cfg.n_ignore_module_types++)
            if (!(a->ignore[i] = cbi_strdup(c.ignore_module_types[i]))) {
                am_free(a);
                return cm_set_error(CM_ERR_OOM, "ActivationMonitor: out of memory");
            }
    }
    a->cfg.ignore_module_types = NULL;
    *out = (cm_callback_plugin){&act_vt, a};
    return CM_OK;
}
