/* LayerFreezing: Composer's progressive layer freezing — the schedule, the layer list, the
 * freezing of a model and its optimizer, and the algorithm (train_algos.h). */
#include "plugins/train_algos_impl.h"
#include "base/json.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

cm_layer_freezing_config cm_layer_freezing_config_default(void) {
    return (cm_layer_freezing_config){.freeze_start = 0.5, .freeze_level = 1.0};
}

double cm_layer_freezing_schedule(double current_duration, double freeze_start, double freeze_level) {
    if (current_duration <= freeze_start) return 0.0;
    const double total = 1.0 - freeze_start, elapsed = current_duration - freeze_start;
    return freeze_level * (elapsed / total);
}

typedef struct {
    cm_module **out;
    int64_t cap, n;
} layers_ctx;

static bool layers_fn(cm_module *m, const char *path, int depth, void *data) {
    layers_ctx *c = data;
    if (cm_module_n_children(m) == 0 && cm_module_n_own_params(m) > 0) {
        if (c->out && c->n < c->cap) c->out[c->n] = m;
        c->n++;
    }
    return true;
}

int64_t cm_layer_freezing_layers(cm_module *root, cm_module **out, int64_t cap) {
    if (!root) return 0;
    layers_ctx c = {out, cap, 0};
    /* cm_module_visit goes parents first, children in registration order: depth-first, as
     * Composer's recursion over module.children() */
    cm_module_visit(root, layers_fn, &c);
    return c.n;
}

static cm_status check_args(double freeze_start, double freeze_level, const char *who) {
    if (!(freeze_start >= 0 && freeze_start < 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: freeze_start %g must be in [0, 1) (a fraction of training)", who,
                            freeze_start);
    if (!(freeze_level >= 0 && freeze_level <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: freeze_level %g must be in [0, 1] (a fraction of the layers)", who,
                            freeze_level);
    return CM_OK;
}

cm_status cm_layer_freezing_freeze(cm_module *root, cm_optim *opt, int64_t n_layers) {
    if (!root || n_layers < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "layer freezing: NULL module or a negative layer count %lld",
                            (long long)n_layers);
    if (!cm_module_is_finalized(root)) return cm_set_error(CM_ERR_STATE, "layer freezing: the model is not finalized");
    const int64_t n = cm_layer_freezing_layers(root, NULL, 0);
    if (n_layers > n - 1) n_layers = n > 0 ? n - 1 : 0;
    if (n_layers == 0) return CM_OK;
    cm_module **layers = cm_alloc(sizeof *layers * (size_t)n, 16);
    if (!layers) return cm_set_error(CM_ERR_OOM, "layer freezing: out of memory");
    cm_layer_freezing_layers(root, layers, n);
    cm_status s = CM_OK;
    /* the optimizer first (it can refuse), then the flags */
    for (int64_t l = 0; !s && opt && l < n_layers; l++)
        for (int k = 0; !s && k < cm_module_n_own_params(layers[l]); k++) {
            const char *pname;
            cm_tensor *t = cm_module_own_param_at(layers[l], k, &pname);
            if ((s = cm_optim_exclude(opt, cm_tensor_data(t), cm_tensor_numel(t)))) {
                char path[512];
                cm_module_path(layers[l], path, sizeof path);
                s = cm_set_error(s, "layer freezing: the optimizer does not hold parameter '%s%s%s' (build it over the "
                                    "model's flat unit buffers)", path, path[0] ? "." : "", pname);
            }
        }
    for (int64_t l = 0; !s && l < n_layers; l++)
        for (int k = 0; k < cm_module_n_own_params(layers[l]); k++) {
            cm_tensor *t = cm_module_own_param_at(layers[l], k, NULL);
            cm_tensor_set_requires_grad(t, false);
            cm_tensor_zero_grad(t);
        }
    cm_free(layers);
    return s;
}

static void depth_of(cm_module *root, double current_duration, double freeze_start, double freeze_level,
                     int64_t *depth, double *pct) {
    *pct = cm_layer_freezing_schedule(current_duration, freeze_start, freeze_level);
    const int64_t n = cm_layer_freezing_layers(root, NULL, 0);
    *depth = n > 1 ? (int64_t)(*pct * (double)(n - 1)) : 0; /* Python's int(): toward zero */
}

cm_status cm_freeze_layers(cm_module *root, cm_optim *opt, double current_duration, double freeze_start,
                           double freeze_level, int64_t *freeze_depth, double *freeze_percentage) {
    cm_status s = check_args(freeze_start, freeze_level, "freeze_layers");
    if (s) return s;
    if (!root) return cm_set_error(CM_ERR_INVALID_ARG, "freeze_layers: NULL module");
    int64_t depth;
    double pct;
    depth_of(root, current_duration, freeze_start, freeze_level, &depth, &pct);
    if ((s = cm_layer_freezing_freeze(root, opt, depth))) return s;
    if (freeze_depth) *freeze_depth = depth;
    if (freeze_percentage) *freeze_percentage = pct;
    return CM_OK;
}

/* ---- the algorithm ---- */

typedef struct {
    double freeze_start, freeze_level;
    int64_t frozen;  /* layers frozen so far (they never thaw) */
    int64_t pending; /* layers to freeze again after a load (on AFTER_LOAD) */
} layer_freezing;

static bool lf_match(void *self, cm_event ev, const cm_state *st) {
    layer_freezing *lf = self;
    return ev == CM_EVENT_INIT || ev == CM_EVENT_EPOCH_END || (ev == CM_EVENT_AFTER_LOAD && lf->pending > 0);
}

static cm_status lf_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    layer_freezing *lf = self;
    cm_model *m = cm_state_model(st);
    if (!m) return cm_set_error(CM_ERR_STATE, "LayerFreezing: the state has no model");
    cm_module *root = cm_model_module(m);
    if (ev == CM_EVENT_INIT) {
        lf->frozen = lf->pending = 0;
        return cmi_algo_refuse_sharded("LayerFreezing", st);
    }
    cm_status s;
    if (ev == CM_EVENT_AFTER_LOAD) {
        if ((s = cm_layer_freezing_freeze(root, cm_state_optimizer(st), lf->pending))) return s;
        lf->frozen = lf->pending, lf->pending = 0;
        return CM_OK;
    }
    double elapsed;
    if ((s = cm_state_elapsed(st, &elapsed))) return s;
    int64_t depth;
    double pct;
    depth_of(root, elapsed, lf->freeze_start, lf->freeze_level, &depth, &pct);
    if ((s = cm_layer_freezing_freeze(root, cm_state_optimizer(st), depth))) return s;
    if (depth > lf->frozen) lf->frozen = depth;
    cm_metric_value v[2] = {{"layer_freezing/layers_frozen", (double)depth},
                            {"layer_freezing/percentage_frozen", pct}};
    return cm_logger_log_metrics(lg, v, 2);
}

static size_t lf_save(void *self, char *buf, size_t cap) {
    return (size_t)snprintf(buf, cap, "{\"layers_frozen\": %lld}", (long long)((layer_freezing *)self)->frozen);
}

static cm_status lf_load(void *self, const char *json, size_t len) {
    layer_freezing *lf = self;
    cJSON *j = cJSON_ParseWithLength(json, len);
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(j, "layers_frozen");
    int64_t frozen;
    const bool ok = cmi_json_whole(n, 0, INT64_MAX, &frozen);
    if (ok) lf->pending = frozen;
    cJSON_Delete(j);
    return ok ? CM_OK : cm_set_error(CM_ERR_FORMAT, "LayerFreezing: the saved state has no valid layers_frozen");
}

static void lf_free(void *self) { cm_free(self); }

static const cm_algorithm_i layer_freezing_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "LayerFreezing",
    .match = lf_match,
    .apply = lf_apply,
    .save = lf_save,
    .load = lf_load,
    .free = lf_free,
};

cm_status cm_layer_freezing_new(const cm_layer_freezing_config *cfg, cm_algorithm_plugin *out) {
    if (!cfg || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_layer_freezing_new: NULL config or output");
    cm_status s = check_args(cfg->freeze_start, cfg->freeze_level, "LayerFreezing");
    if (s) return s;
    layer_freezing *lf = cm_alloc_zeroed(sizeof *lf, 16);
    if (!lf) return cm_set_error(CM_ERR_OOM, "LayerFreezing: out of memory");
    lf->freeze_start = cfg->freeze_start, lf->freeze_level = cfg->freeze_level;
    *out = (cm_algorithm_plugin){&layer_freezing_vt, lf};
    return CM_OK;
}
