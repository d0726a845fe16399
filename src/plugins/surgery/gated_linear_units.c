/* GatedLinearUnits (Shazeer 2020; Composer's GatedLinearUnits): BERT's feed-forward block becomes a
 * gated linear unit. As Composer's surgery: every BertIntermediate becomes an Identity and every
 * BertOutput a BERTGatedFFOutput {gated_layer: Linear(C, F), non_gated_layer: Linear(C, F),
 * wo: Linear(F, C), dropout, layernorm: LayerNorm(C)} computing
 * layernorm(wo(dropout(act(gated_layer(h)) · non_gated_layer(h))) + residual), so BertLayer's
 * output(intermediate(h), h) is output(h, h). New layers get PyTorch's default init from
 * (seed, hash(path)). */
#include "plugins/surgery/surgery_impl.h"

#include <stdio.h>
#include <string.h>

static const char *const k_acts[] = {"relu", "gelu", "gelu_tanh", "silu", "tanh", "sigmoid", "identity"};
/* cm_activation values in k_acts' order */
static const cm_activation k_act_of[] = {CM_ACT_RELU, CM_ACT_GELU, CM_ACT_GELU_TANH, CM_ACT_SILU,
                                         CM_ACT_TANH, CM_ACT_SIGMOID, CM_ACT_IDENTITY};

typedef struct {
    cm_activation act;
    cm_module *gated_layer, *non_gated_layer, *wo, *dropout, *layernorm;
} glu_s;

/* in[0] the hidden states (B, T, C), in[1] the residual (B, T, C). */
static cm_tensor *glu_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    glu_s *s = cm_module_self(m);
    cm_tensor *res = n_in > 1 ? in[1] : NULL;
    if (!res) {
        cm_tape_fail(tp, CM_ERR_INVALID_ARG, "BERTGatedFFOutput: input 1 (the residual) is NULL");
        return NULL;
    }
    cm_tensor *h = cm_mul(tp, cm_nn_activate(tp, cm_module_forward(s->gated_layer, tp, in[0]), s->act),
                          cm_module_forward(s->non_gated_layer, tp, in[0]));
    h = cm_module_forward(s->wo, tp, cm_module_forward(s->dropout, tp, h));
    return cm_module_forward(s->layernorm, tp, cm_add(tp, h, res));
}

static void free_self(void *self) { cm_free(self); }

static const cm_module_i glu_vt = {CM_MODULE_ABI, "BERTGatedFFOutput", glu_fwd, free_self, NULL};

typedef struct {
    const cm_gated_linear_units_config *cfg;
    cm_activation act;
    uint64_t seed;
    int64_t n;
} glu_ctx;

static bool is_type(const cm_module *m, const char *t) { return m && !strcmp(cm_module_type_name(m), t); }

static bool glu_match(cm_module *m, const char *path, void *data) {
    return is_type(m, "BertIntermediate") || is_type(m, "BertOutput");
}

/* Adds a freshly made module as child `name` of m, or frees it. */
static cm_status adopt(cm_module *m, const char *name, cm_status made, cm_module *c, cm_module **slot) {
    if (made) return made;
    cm_status st = cm_module_add_child(m, name, c, slot);
    if (st) cm_module_free(c);
    return st;
}

static cm_status glu_make(cm_module *old, const char *path, void *data, cm_module **out) {
    glu_ctx *c = data;
    if (is_type(old, "BertIntermediate")) {
        c->n++;
        return cm_nn_activation_new(CM_ACT_IDENTITY, out);
    }
    /* BertOutput: dense (F → C), LayerNorm, dropout */
    int64_t F, C;
    float p, eps;
    cm_status st;
    if ((st = cm_nn_linear_dims(cm_module_child(old, "dense"), &F, &C, NULL)) ||
        (st = cm_nn_dropout_p_of(cm_module_child(old, "dropout"), &p)) ||
        (st = cm_nn_norm_config_of(cm_module_child(old, "LayerNorm"), NULL, NULL, &eps, NULL)))
        return st;
    glu_s *s = cm_alloc_zeroed(sizeof *s, 8);
    if (!s) return CM_ERR_OOM;
    if ((st = cm_module_new(&glu_vt, s, out))) {
        cm_free(s);
        return st;
    }
    s->act = c->act;
    char p0[512];
    snprintf(p0, sizeof p0, "%s.gated_layer", path);
    cm_rng r0 = cmi_surgery_rng(c->seed, p0);
    snprintf(p0, sizeof p0, "%s.non_gated_layer", path);
    cm_rng r1 = cmi_surgery_rng(c->seed, p0);
    snprintf(p0, sizeof p0, "%s.wo", path);
    cm_rng r2 = cmi_surgery_rng(c->seed, p0);
    cm_module *m = NULL;
    /* each constructor in a statement of its own: adopt reads m after it */
    st = cm_nn_linear_new(C, F, c->cfg->gated_layer_bias, &r0, &m);
    if (!(st = adopt(*out, "gated_layer", st, m, &s->gated_layer))) {
        st = cm_nn_linear_new(C, F, c->cfg->non_gated_layer_bias, &r1, &m);
        st = adopt(*out, "non_gated_layer", st, m, &s->non_gated_layer);
    }
    if (!st) {
        st = cm_nn_linear_new(F, C, true, &r2, &m);
        st = adopt(*out, "wo", st, m, &s->wo);
    }
    if (!st) {
        st = cm_nn_dropout_new(p, &m);
        st = adopt(*out, "dropout", st, m, &s->dropout);
    }
    if (!st) {
        st = cm_nn_layer_norm_new(C, eps, true, &m);
        st = adopt(*out, "layernorm", st, m, &s->layernorm);
    }
    if (st) {
        cm_module_free(*out);
        *out = NULL;
        return st;
    }
    c->n++;
    return CM_OK;
}

typedef struct {
    int64_t inter, out, done;
    bool mixed; /* BertIntermediate modules with different activations */
    cm_activation act;
} glu_scan;

static bool scan_visit(cm_module *m, const char *path, int depth, void *data) {
    glu_scan *s = data;
    if (is_type(m, "BertIntermediate")) {
        cm_nn_attention_config ac;
        if (!cm_nn_attention_config_of(m, &ac)) {
            if (s->inter && ac.act != s->act) s->mixed = true;
            s->act = ac.act;
        }
        s->inter++;
    }
    s->out += is_type(m, "BertOutput");
    s->done += is_type(m, "BERTGatedFFOutput");
    return true;
}

static cm_status check_cfg(const cm_gated_linear_units_config *c) {
    if (!c) return cm_set_error(CM_ERR_INVALID_ARG, "GatedLinearUnits: config is NULL");
    if (c->act_fn < -1 || c->act_fn >= (int)(sizeof k_acts / sizeof *k_acts))
        return cm_set_error(CM_ERR_INVALID_ARG, "GatedLinearUnits: act_fn %d is not valid", c->act_fn);
    return CM_OK;
}

cm_status cm_apply_gated_linear_units(cm_module *root, const cm_gated_linear_units_config *cfg, uint64_t seed,
                                      int64_t *n_replaced) {
    if (n_replaced) *n_replaced = 0;
    cm_status st = check_cfg(cfg);
    if (st || (st = cmi_surgery_check_unlocked(root, "GatedLinearUnits", "cm_apply_gated_linear_units"))) return st;
    glu_scan sc = {0, 0, 0, false, CM_ACT_GELU};
    cm_module_visit(root, scan_visit, &sc);
    if (!sc.inter && !sc.out) {
        if (sc.done) return CM_OK;
        return cmi_nothing_to_apply(root, "GatedLinearUnits", "BertIntermediate and BertOutput modules",
                                    "Gated Linear Units only has a surgery policy for BERT");
    }
    cm_activation act = cfg->act_fn >= 0 ? k_act_of[cfg->act_fn] : sc.act;
    if (cfg->act_fn < 0 && sc.mixed)
        return cm_set_error(CM_ERR_INVALID_ARG, "GatedLinearUnits: tried to get the activation function from the model, "
                                                "but multiple different functions are used; set act_fn");
    glu_ctx c = {cfg, act, seed, 0};
    st = cm_module_replace(root, glu_match, glu_make, &c, NULL);
    if (n_replaced) *n_replaced = c.n;
    if (!st)
        cm_log_msg(CM_LOG_INFO, "GatedLinearUnits: replaced %lld BertIntermediate and BertOutput modules of %s with a "
                                "gated linear unit", (long long)c.n, cm_module_type_name(root));
    return st;
}

/* ---- the algorithm ---- */

typedef struct {
    cm_gated_linear_units_config cfg;
} glu_self;

static bool alg_match(void *self, cm_event ev, const cm_state *st) { return ev == CM_EVENT_INIT; }

static cm_status alg_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    glu_self *s = self;
    cm_module *root;
    cm_status r = cmi_state_root(st, "GatedLinearUnits", &root);
    return r ? r : cm_apply_gated_linear_units(root, &s->cfg, cm_state_seed(st), NULL);
}

static void alg_free(void *self) { cm_free(self); }

static const cm_algorithm_i glu_alg_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "GatedLinearUnits",
    .match = alg_match,
    .apply = alg_apply,
    .free = alg_free,
};

cm_gated_linear_units_config cm_gated_linear_units_config_default(void) {
    return (cm_gated_linear_units_config){-1, false, false};
}

cm_status cm_gated_linear_units_new(const cm_gated_linear_units_config *cfg, cm_algorithm_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_gated_linear_units_new: out is NULL");
    cm_status st = check_cfg(cfg);
    if (st) return st;
    glu_self *s = cm_alloc_zeroed(sizeof *s, 16);
    if (!s) return CM_ERR_OOM;
    s->cfg = *cfg;
    *out = (cm_algorithm_plugin){&glu_alg_vt, s};
    return CM_OK;
}

static void cfg_default(void *c) { *(cm_gated_linear_units_config *)c = cm_gated_linear_units_config_default(); }
static cm_status make(const void *c, cm_algorithm_plugin *out) { return cm_gated_linear_units_new(c, out); }

static const cmi_arg k_args[] = {
    {{"act_fn", CM_ALGO_ARG_CHOICE, "null", k_acts, 7}, offsetof(cm_gated_linear_units_config, act_fn), true},
    {{"gated_layer_bias", CM_ALGO_ARG_BOOL, "false", NULL, 0}, offsetof(cm_gated_linear_units_config, gated_layer_bias),
     false},
    {{"non_gated_layer_bias", CM_ALGO_ARG_BOOL, "false", NULL, 0},
     offsetof(cm_gated_linear_units_config, non_gated_layer_bias), false},
};

const cmi_algo_entry cmi_glu_entry = {
    {"GatedLinearUnits", "gated_linear_units", true, 3}, &glu_alg_vt, sizeof(cm_gated_linear_units_config),
    cfg_default, k_args, 3, make,
};
