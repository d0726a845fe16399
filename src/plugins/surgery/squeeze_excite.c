/* SqueezeExcite (Hu et al. 2018; Composer's SqueezeExcite): after each wide enough convolution, a
 * channel gate computed from the globally pooled activations. Composer's module tree and names:
 * SqueezeExciteConv2d {conv, se: SqueezeExcite2d {pool_and_mlp: Sequential(0 AdaptiveAvgPool2d(1),
 * 1 Flatten, 2 Linear(C, L, no bias), 3 ReLU, 4 Linear(L, C, no bias), 5 Sigmoid)}}. */
#include "plugins/surgery/surgery_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int64_t cm_squeeze_excite_latent(double latent_channels, int64_t num_features) {
    return latent_channels >= 1 ? (int64_t)latent_channels : (int64_t)(latent_channels * (double)num_features);
}

/* ---- SqueezeExcite2d ---- */

typedef struct {
    int64_t c, latent;
    cm_module *pool_and_mlp;
} se2d_s;

static cm_tensor *as_f32(cm_tape *tp, cm_tensor *t) {
    return t && cm_tensor_dtype(t) != CM_DTYPE_F32 ? cm_cast(tp, t, CM_DTYPE_F32) : t;
}

/* input (N, C, H, W) or (N, H, W, C) (the pool's layout) → input · gate, the gate (N, C) broadcast
 * over H and W. */
static cm_tensor *se2d_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    se2d_s *s = cm_module_self(m);
    cm_tensor *x = as_f32(tp, in[0]);
    if (!x) return NULL;
    cm_tensor *g = cm_module_forward(s->pool_and_mlp, tp, x); /* (N, C) */
    if (!g) return NULL;
    const bool cl = cm_nn_is_channels_last(cm_module_child(s->pool_and_mlp, "0"));
    const int64_t N = cm_tensor_dim(x, 0), shape[4] = {N, cl ? 1 : s->c, 1, cl ? s->c : 1};
    return cm_mul(tp, x, cm_reshape(tp, g, 4, shape));
}

static void se_desc(const cm_module *m, char *buf, size_t cap) {
    const se2d_s *s = cm_module_self(m);
    snprintf(buf, cap, "num_features=%lld, latent_channels=%lld", (long long)s->c, (long long)s->latent);
}

static void free_self(void *self) { cm_free(self); }

static const cm_module_i se2d_vt = {CM_MODULE_ABI, "SqueezeExcite2d", se2d_fwd, free_self, se_desc};

/* Adds a freshly made module (made = its constructor's status) to the Sequential, or frees it. */
static cm_status append(cm_module *seq, cm_status made, cm_module *child) {
    if (made) return made;
    cm_status st = cm_nn_sequential_append(seq, child);
    if (st) cm_module_free(child);
    return st;
}

cm_status cm_squeeze_excite2d_new(int64_t num_features, double latent_channels, bool channels_last, cm_rng *rng,
                                  cm_module **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_squeeze_excite2d_new: out is NULL");
    *out = NULL;
    const int64_t L = cm_squeeze_excite_latent(latent_channels, num_features);
    if (num_features < 1 || L < 1 || !(latent_channels > 0) || !isfinite(latent_channels))
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "SqueezeExcite2d: latent_channels %g of %lld features gives %lld latent channels (needs "
                            "at least 1: a count >= 1, or a fraction of the features)",
                            latent_channels, (long long)num_features, (long long)L);
    se2d_s *s = cm_alloc_zeroed(sizeof *s, 8);
    if (!s) return CM_ERR_OOM;
    cm_status st = cm_module_new(&se2d_vt, s, out);
    if (st) {
        cm_free(s);
        return st;
    }
    s->c = num_features, s->latent = L;
    cm_module *seq = NULL, *c;
    if ((st = cm_nn_sequential_new(&seq))) goto fail;
    if ((st = cm_module_add_child(*out, "pool_and_mlp", seq, &s->pool_and_mlp))) {
        cm_module_free(seq);
        goto fail;
    }
    st = cm_nn_adaptive_avg_pool2d_new(1, 1, channels_last, &c);
    if ((st = append(seq, st, c))) goto fail;
    st = cm_nn_flatten_new(1, &c);
    if ((st = append(seq, st, c))) goto fail;
    st = cm_nn_linear_new(num_features, L, false, rng, &c);
    if ((st = append(seq, st, c))) goto fail;
    st = cm_nn_activation_new(CM_ACT_RELU, &c);
    if ((st = append(seq, st, c))) goto fail;
    st = cm_nn_linear_new(L, num_features, false, rng, &c);
    if ((st = append(seq, st, c))) goto fail;
    st = cm_nn_activation_new(CM_ACT_SIGMOID, &c);
    if ((st = append(seq, st, c))) goto fail;
    return CM_OK;
fail:
    cm_module_free(*out);
    *out = NULL;
    return st;
}

/* ---- SqueezeExciteConv2d ---- */

typedef struct {
    cm_module *conv, *se;
} seconv_s;

static cm_tensor *seconv_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    seconv_s *s = cm_module_self(m);
    return cm_module_forward(s->se, tp, cm_module_forward(s->conv, tp, in[0]));
}

static const cm_module_i seconv_vt = {CM_MODULE_ABI, "SqueezeExciteConv2d", seconv_fwd, free_self, NULL};

bool cmi_se_set_channels_last(cm_module *m, bool on) {
    if (cm_module_vtable(m) != &se2d_vt) return false;
    se2d_s *s = cm_module_self(m);
    cm_nn_set_channels_last(cm_module_child(s->pool_and_mlp, "0"), on);
    return true;
}

/* ---- the surgery ---- */

typedef struct {
    const cm_squeeze_excite_config *cfg;
    uint64_t seed;
    int64_t n;
} se_ctx;

static bool is_type(const cm_module *m, const char *t) { return m && !strcmp(cm_module_type_name(m), t); }

static bool se_match(cm_module *m, const char *path, void *data) {
    const se_ctx *c = data;
    cm_nn_conv2d_config cc;
    if (!is_type(m, "Conv2d") || cmi_has_ancestor(m, "SqueezeExciteConv2d") || cm_nn_conv2d_config_of(m, &cc))
        return false;
    return (cc.in < cc.out ? cc.in : cc.out) >= c->cfg->min_channels;
}

static cm_status se_make(cm_module *old, const char *path, void *data, cm_module **out) {
    se_ctx *c = data;
    cm_nn_conv2d_config cc;
    cm_status st = cm_nn_conv2d_config_of(old, &cc);
    if (st) return st;
    seconv_s *s = cm_alloc_zeroed(sizeof *s, 8);
    if (!s) return CM_ERR_OOM;
    if ((st = cm_module_new(&seconv_vt, s, out))) {
        cm_free(s);
        return st;
    }
    char p[512];
    snprintf(p, sizeof p, "%s.se", path);
    cm_rng rng = cmi_surgery_rng(c->seed, p);
    cm_module *se = NULL;
    if ((st = cm_squeeze_excite2d_new(cc.out, c->cfg->latent_channels, cc.opts.channels_last, &rng, &se)) ||
        (st = cm_module_add_child(*out, "se", se, &s->se))) {
        cm_module_free(se);
        cm_module_free(*out);
        *out = NULL;
        return st;
    }
    /* the old convolution becomes the child "conv" (adopted: its weights stay) */
    if ((st = cm_module_add_child(*out, "conv", old, &s->conv))) {
        cm_module_free(*out);
        *out = NULL;
        return st;
    }
    c->n++;
    return CM_OK;
}

typedef struct {
    const cm_squeeze_excite_config *cfg;
    int64_t eligible, done, convs;
} se_scan;

static bool scan_visit(cm_module *m, const char *path, int depth, void *data) {
    se_scan *s = data;
    se_ctx c = {s->cfg, 0, 0};
    if (se_match(m, path, &c)) s->eligible++;
    if (is_type(m, "SqueezeExciteConv2d")) s->done++;
    if (is_type(m, "Conv2d")) s->convs++;
    return true;
}

cm_squeeze_excite_config cm_squeeze_excite_config_default(void) { return (cm_squeeze_excite_config){64, 128}; }

static cm_status check_cfg(const cm_squeeze_excite_config *c) {
    if (!c) return cm_set_error(CM_ERR_INVALID_ARG, "SqueezeExcite: config is NULL");
    if (!(c->latent_channels > 0) || !isfinite(c->latent_channels))
        return cm_set_error(CM_ERR_INVALID_ARG, "SqueezeExcite: latent_channels %g must be > 0 (a count, or a fraction "
                                                "of the channels when < 1)", c->latent_channels);
    if (c->min_channels < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "SqueezeExcite: min_channels %lld must be >= 0", (long long)c->min_channels);
    return CM_OK;
}

cm_status cm_apply_squeeze_excite(cm_module *root, const cm_squeeze_excite_config *cfg, uint64_t seed,
                                  int64_t *n_added) {
    if (n_added) *n_added = 0;
    cm_status st = check_cfg(cfg);
    if (st || (st = cmi_surgery_check_unlocked(root, "SqueezeExcite", "cm_apply_squeeze_excite"))) return st;
    se_scan sc = {cfg, 0, 0, 0};
    cm_module_visit(root, scan_visit, &sc);
    if (!sc.eligible) {
        if (sc.done) return CM_OK;
        char hint[160];
        snprintf(hint, sizeof hint, "min_channels is %lld and the model has %lld Conv2d layer%s", (long long)cfg->min_channels,
                 (long long)sc.convs, sc.convs == 1 ? "" : "s");
        return cmi_nothing_to_apply(root, "SqueezeExcite",
                                    "Conv2d layers with at least min_channels input and output channels", hint);
    }
    se_ctx c = {cfg, seed, 0};
    st = cm_module_replace(root, se_match, se_make, &c, NULL);
    if (n_added) *n_added = c.n;
    if (!st)
        cm_log_msg(CM_LOG_INFO, "SqueezeExcite: applied to %s with latent_channels=%g, min_channels=%lld: %lld "
                                "SqueezeExcite layers added", cm_module_type_name(root), cfg->latent_channels,
                   (long long)cfg->min_channels, (long long)c.n);
    return st;
}

/* ---- the algorithm ---- */

typedef struct {
    cm_squeeze_excite_config cfg;
} se_self;

static bool se_alg_match(void *self, cm_event ev, const cm_state *st) { return ev == CM_EVENT_INIT; }

static cm_status se_alg_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    se_self *s = self;
    cm_module *root;
    cm_status r = cmi_state_root(st, "SqueezeExcite", &root);
    if (r || (r = cm_apply_squeeze_excite(root, &s->cfg, cm_state_seed(st), NULL))) return r;
    const char *const t[1] = {"SqueezeExciteConv2d"};
    cm_hparam h = {"squeeze_excite/num_squeeze_excite_layers", CM_HPARAM_NUMBER, (double)cmi_count_types(root, t, 1),
                   NULL};
    return cm_logger_log_hyperparameters(lg, &h, 1);
}

static void se_alg_free(void *self) { cm_free(self); }

static const cm_algorithm_i se_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "SqueezeExcite",
    .match = se_alg_match,
    .apply = se_alg_apply,
    .free = se_alg_free,
};

cm_status cm_squeeze_excite_new(const cm_squeeze_excite_config *cfg, cm_algorithm_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_squeeze_excite_new: out is NULL");
    cm_status st = check_cfg(cfg);
    if (st) return st;
    se_self *s = cm_alloc_zeroed(sizeof *s, 16);
    if (!s) return CM_ERR_OOM;
    s->cfg = *cfg;
    *out = (cm_algorithm_plugin){&se_vt, s};
    return CM_OK;
}

static void cfg_default(void *c) { *(cm_squeeze_excite_config *)c = cm_squeeze_excite_config_default(); }
static cm_status make(const void *c, cm_algorithm_plugin *out) { return cm_squeeze_excite_new(c, out); }

static const cmi_arg k_args[] = {
    {{"latent_channels", CM_ALGO_ARG_REAL, "64", NULL, 0}, offsetof(cm_squeeze_excite_config, latent_channels), false},
    {{"min_channels", CM_ALGO_ARG_INT, "128", NULL, 0}, offsetof(cm_squeeze_excite_config, min_channels), false},
};

const cmi_algo_entry cmi_squeeze_excite_entry = {
    {"SqueezeExcite", "squeeze_excite", true, (int)(sizeof k_args / sizeof *k_args)}, &se_vt,
    sizeof(cm_squeeze_excite_config), cfg_default, k_args, (int)(sizeof k_args / sizeof *k_args), make,
};
