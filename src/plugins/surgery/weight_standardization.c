/* WeightStandardization (Qiao et al. 2019; Composer's WeightStandardization): convolutions use
 * their weights standardized per output channel. Composer registers a torch parametrization on
 * every convolution but the last n_last_layers_ignore (in the traced module order); here each
 * Conv2d is switched in place (cm_nn_conv2d_set_weight_standardization), so the parameter keeps
 * its name and no re-packing is needed. Composer does not mark it required on load — there the
 * parametrization renames the weight (parametrizations.weight.original), so a checkpoint trained
 * with it fails to load without it; here the names stay, so it is required on load instead, and a
 * checkpoint re-applies it rather than silently dropping the standardization. */
#include "plugins/surgery/surgery_impl.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    int64_t n, done, target, seen;
} ws_ctx;

static bool is_conv(const cm_module *m) { return !strcmp(cm_module_type_name(m), "Conv2d"); }

static bool count_visit(cm_module *m, const char *path, int depth, void *data) {
    ws_ctx *c = data;
    if (is_conv(m)) c->n++, c->done += cm_nn_conv2d_weight_standardization(m);
    return true;
}

static bool set_visit(cm_module *m, const char *path, int depth, void *data) {
    ws_ctx *c = data;
    if (!is_conv(m)) return true;
    if (c->seen++ < c->target) cm_nn_conv2d_set_weight_standardization(m, true);
    return true;
}

cm_status cm_apply_weight_standardization(cm_module *root, int64_t n_last_layers_ignore, int64_t *n_standardized) {
    if (n_standardized) *n_standardized = 0;
    if (!root) return cm_set_error(CM_ERR_INVALID_ARG, "cm_apply_weight_standardization: the model is NULL");
    if (n_last_layers_ignore < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "WeightStandardization: n_last_layers_ignore %lld must be >= 0",
                            (long long)n_last_layers_ignore);
    ws_ctx c = {0, 0, 0, 0};
    cm_module_visit(root, count_visit, &c);
    if (!c.n) return cmi_nothing_to_apply(root, "WeightStandardization", "Conv2d layers", "");
    c.target = c.n > n_last_layers_ignore ? c.n - n_last_layers_ignore : 0;
    cm_module_visit(root, set_visit, &c);
    if (n_standardized) *n_standardized = c.target;
    if (c.done < c.target)
        cm_log_msg(CM_LOG_INFO, "WeightStandardization: %lld of the %lld Conv2d layers of %s standardize their weights",
                   (long long)c.target, (long long)c.n, cm_module_type_name(root));
    return CM_OK;
}

/* ---- the algorithm ---- */

typedef struct {
    cm_weight_standardization_config cfg;
} ws_self;

static bool ws_match(void *self, cm_event ev, const cm_state *st) { return ev == CM_EVENT_INIT; }

static cm_status ws_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    ws_self *s = self;
    cm_module *root;
    int64_t n;
    cm_status r = cmi_state_root(st, "WeightStandardization", &root);
    if (r || (r = cm_apply_weight_standardization(root, s->cfg.n_last_layers_ignore, &n))) return r;
    cm_hparam h = {"WeightStandardization/num_weights_standardized", CM_HPARAM_NUMBER, (double)n, NULL};
    return cm_logger_log_hyperparameters(lg, &h, 1);
}

static void ws_free(void *self) { cm_free(self); }

static const cm_algorithm_i ws_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "WeightStandardization",
    .match = ws_match,
    .apply = ws_apply,
    .free = ws_free,
};

cm_weight_standardization_config cm_weight_standardization_config_default(void) {
    return (cm_weight_standardization_config){0};
}

cm_status cm_weight_standardization_new(const cm_weight_standardization_config *cfg, cm_algorithm_plugin *out) {
    if (!out || !cfg) return cm_set_error(CM_ERR_INVALID_ARG, "cm_weight_standardization_new: NULL argument");
    if (cfg->n_last_layers_ignore < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "WeightStandardization: n_last_layers_ignore %lld must be >= 0",
                            (long long)cfg->n_last_layers_ignore);
    ws_self *s = cm_alloc_zeroed(sizeof *s, 16);
    if (!s) return CM_ERR_OOM;
    s->cfg = *cfg;
    *out = (cm_algorithm_plugin){&ws_vt, s};
    return CM_OK;
}

static void cfg_default(void *c) { *(cm_weight_standardization_config *)c = cm_weight_standardization_config_default(); }
static cm_status make(const void *c, cm_algorithm_plugin *out) { return cm_weight_standardization_new(c, out); }

static const cmi_arg k_args[] = {
    {{"n_last_layers_ignore", CM_ALGO_ARG_INT, "0", NULL, 0},
     offsetof(cm_weight_standardization_config, n_last_layers_ignore), false},
};

const cmi_algo_entry cmi_weight_std_entry = {
    {"WeightStandardization", "weight_standardization", true, 1}, &ws_vt, sizeof(cm_weight_standardization_config),
    cfg_default, k_args, 1, make,
};
