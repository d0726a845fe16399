/* LowPrecisionLayerNorm and LowPrecisionGroupNorm (Composer's): under amp_bf16 the norms compute in
 * bf16 — Composer's LPLayerNorm / LPGroupNorm cast x, weight and bias to the autocast dtype and run
 * the norm outside autocast. Here the LayerNorm / GroupNorm modules are switched in place
 * (cm_nn_norm_set_low_precision: no parameter changes, so apply_at may be any of Composer's three
 * events, before or after the optimizer exists). And FusedLayerNorm, accepted: the layer norm here
 * is always the fused kernel. */
#include "plugins/surgery/surgery_impl.h"

#include <stdio.h>
#include <string.h>

static const char *const k_events[] = {"init", "before_load", "after_load"};
static const cm_event k_event_of[] = {CM_EVENT_INIT, CM_EVENT_BEFORE_LOAD, CM_EVENT_AFTER_LOAD};

typedef struct {
    const char *type;
    int64_t n, on;
} lp_scan;

static bool scan_visit(cm_module *m, const char *path, int depth, void *data) {
    lp_scan *s = data;
    if (strcmp(cm_module_type_name(m), s->type)) return true;
    s->n++;
    if (cm_nn_norm_is_low_precision(m)) s->on++;
    return true;
}

static bool set_visit(cm_module *m, const char *path, int depth, void *data) {
    if (!strcmp(cm_module_type_name(m), ((lp_scan *)data)->type)) cm_nn_norm_set_low_precision(m, true);
    return true;
}

static cm_status apply_lp(cm_module *root, cm_precision precision, const char *type, const char *algo, int64_t *n) {
    if (n) *n = 0;
    if (!root) return cm_set_error(CM_ERR_INVALID_ARG, "%s: the model is NULL", algo);
    if (precision != CM_PRECISION_AMP_BF16 && precision != CM_PRECISION_AMP_FP16) {
        /* Composer's NoEffectWarning */
        cm_log_msg(CM_LOG_WARN, "%s only applies to the amp_fp16 and amp_bf16 precisions (the run is %s): the "
                                "model is left as it is", algo, cm_precision_name(precision));
        return CM_OK;
    }
    lp_scan sc = {type, 0, 0};
    cm_module_visit(root, scan_visit, &sc);
    if (!sc.n) {
        char looked[64];
        snprintf(looked, sizeof looked, "%s layers", type);
        return cmi_nothing_to_apply(root, algo, looked, "");
    }
    cm_module_visit(root, set_visit, &sc);
    if (n) *n = sc.n - sc.on;
    if (sc.n > sc.on)
        cm_log_msg(CM_LOG_INFO, "%s: %lld %s layers of %s compute in bf16 under autocast", algo, (long long)sc.n, type,
                   cm_module_type_name(root));
    return CM_OK;
}

cm_status cm_apply_low_precision_layernorm(cm_module *root, cm_precision precision, int64_t *n_changed) {
    return apply_lp(root, precision, "LayerNorm", "LowPrecisionLayerNorm", n_changed);
}

cm_status cm_apply_low_precision_groupnorm(cm_module *root, cm_precision precision, int64_t *n_changed) {
    return apply_lp(root, precision, "GroupNorm", "LowPrecisionGroupNorm", n_changed);
}

/* ---- the algorithms ---- */

typedef struct {
    cm_low_precision_norm_config cfg;
    bool group; /* LowPrecisionGroupNorm */
} lp_self;

static bool lp_match(void *self, cm_event ev, const cm_state *st) {
    const lp_self *s = self;
    return ev == k_event_of[s->cfg.apply_at];
}

static cm_status lp_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    lp_self *s = self;
    const char *algo = s->group ? "LowPrecisionGroupNorm" : "LowPrecisionLayerNorm";
    cm_module *root;
    cm_status r = cmi_state_root(st, algo, &root);
    if (r) return r;
    return s->group ? cm_apply_low_precision_groupnorm(root, cm_state_precision(st), NULL)
                    : cm_apply_low_precision_layernorm(root, cm_state_precision(st), NULL);
}

static void lp_free(void *self) { cm_free(self); }

static const cm_algorithm_i lpln_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "LowPrecisionLayerNorm",
    .match = lp_match,
    .apply = lp_apply,
    .free = lp_free,
};

static const cm_algorithm_i lpgn_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "LowPrecisionGroupNorm",
    .match = lp_match,
    .apply = lp_apply,
    .free = lp_free,
};

cm_low_precision_norm_config cm_low_precision_norm_config_default(void) {
    return (cm_low_precision_norm_config){0}; /* apply_at init */
}

static cm_status lp_new(const cm_low_precision_norm_config *cfg, bool group, cm_algorithm_plugin *out) {
    const char *algo = group ? "LowPrecisionGroupNorm" : "LowPrecisionLayerNorm";
    if (!out || !cfg) return cm_set_error(CM_ERR_INVALID_ARG, "%s: NULL argument", algo);
    if (cfg->apply_at < 0 || cfg->apply_at > 2)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s only supports application on Event.INIT, Event.BEFORE_LOAD, and "
                                                "Event.AFTER_LOAD (apply_at %d)", algo, cfg->apply_at);
    lp_self *s = cm_alloc_zeroed(sizeof *s, 16);
    if (!s) return CM_ERR_OOM;
    s->cfg = *cfg;
    s->group = group;
    *out = (cm_algorithm_plugin){group ? &lpgn_vt : &lpln_vt, s};
    return CM_OK;
}

cm_status cm_low_precision_layernorm_new(const cm_low_precision_norm_config *cfg, cm_algorithm_plugin *out) {
    return lp_new(cfg, false, out);
}

cm_status cm_low_precision_groupnorm_new(const cm_low_precision_norm_config *cfg, cm_algorithm_plugin *out) {
    return lp_new(cfg, true, out);
}

static void cfg_default(void *c) { *(cm_low_precision_norm_config *)c = cm_low_precision_norm_config_default(); }
static cm_status make_ln(const void *c, cm_algorithm_plugin *out) { return lp_new(c, false, out); }
static cm_status make_gn(const void *c, cm_algorithm_plugin *out) { return lp_new(c, true, out); }

static const cmi_arg k_args[] = {
    {{"apply_at", CM_ALGO_ARG_CHOICE, "init", k_events, 3}, offsetof(cm_low_precision_norm_config, apply_at), false},
};

const cmi_algo_entry cmi_lp_layernorm_entry = {
    {"LowPrecisionLayerNorm", "low_precision_layernorm", true, 1}, &lpln_vt, sizeof(cm_low_precision_norm_config),
    cfg_default, k_args, 1, make_ln,
};

const cmi_algo_entry cmi_lp_groupnorm_entry = {
    {"LowPrecisionGroupNorm", "low_precision_groupnorm", true, 1}, &lpgn_vt, sizeof(cm_low_precision_norm_config),
    cfg_default, k_args, 1, make_gn,
};

/* ---- FusedLayerNorm ---- */

static const char k_fused_note[] =
    "FusedLayerNorm: built in — every LayerNorm here already runs the fused kernel (one pass forward, one backward; "
    "cm_layer_norm), so there is nothing to replace";

static bool fln_match(void *self, cm_event ev, const cm_state *st) { return ev == CM_EVENT_INIT; }

static cm_status fln_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    cmi_log_once(k_fused_note);
    return CM_OK;
}

static const cm_algorithm_i fln_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "FusedLayerNorm",
    .match = fln_match,
    .apply = fln_apply,
    .free = lp_free,
};

cm_status cm_fused_layernorm_new(cm_algorithm_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_fused_layernorm_new: out is NULL");
    void *s = cm_alloc_zeroed(16, 16);
    if (!s) return CM_ERR_OOM;
    *out = (cm_algorithm_plugin){&fln_vt, s};
    return CM_OK;
}

static void fln_default(void *c) {}
static cm_status make_fln(const void *c, cm_algorithm_plugin *out) { return cm_fused_layernorm_new(out); }

const cmi_algo_entry cmi_fused_layernorm_entry = {
    {"FusedLayerNorm", "fused_layernorm", false, 0}, &fln_vt, 1, fln_default, NULL, 0, make_fln,
};
