/* StochasticDepth (Huang et al. 2016; Composer's StochasticDepth): residual blocks of a ResNet skip
 * their branch at random while training (the forward is the zoo's, cm_resnet_block_set_drop), with
 * per-block rates rising linearly with depth, and an optional warmup of the rate. */
#include "plugins/surgery/surgery_impl.h"

#include <composer/zoo_vision.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const k_targets[] = {"ResNetBottleneck", "ResNetBasicBlock"};
static const char *const k_target_types[] = {"Bottleneck", "BasicBlock"};
static const char *const k_methods[] = {"block", "sample"};
static const char *const k_dists[] = {"uniform", "linear"};

/* The rate of the i-th (0-based) of n target blocks. */
static float block_rate(double drop_rate, cm_drop_distribution dist, int64_t i, int64_t n) {
    return (float)(dist == CM_DROP_LINEAR ? (double)(i + 1) / (double)n * drop_rate : drop_rate);
}

typedef struct {
    const char *type;
    cm_resnet_drop_mode mode; /* CM_RESNET_DROP_NONE: only count / only change the rates */
    double drop_rate;
    cm_drop_distribution dist;
    int64_t n, i, already;
    bool set_mode;
    cm_status st;
} sd_ctx;

static bool count_visit(cm_module *m, const char *path, int depth, void *data) {
    sd_ctx *c = data;
    if (strcmp(cm_module_type_name(m), c->type)) return true;
    c->n++;
    cm_resnet_drop_mode mode;
    float r;
    if (!cm_resnet_block_drop(m, &mode, &r) && mode != CM_RESNET_DROP_NONE) c->already++;
    return true;
}

static bool set_visit(cm_module *m, const char *path, int depth, void *data) {
    sd_ctx *c = data;
    if (strcmp(cm_module_type_name(m), c->type)) return true;
    cm_resnet_drop_mode mode = c->mode;
    if (!c->set_mode) cm_resnet_block_drop(m, &mode, NULL);
    c->st = cm_resnet_block_set_drop(m, mode, block_rate(c->drop_rate, c->dist, c->i, c->n));
    c->i++;
    return c->st == CM_OK;
}

static cm_status check_args(cm_stochastic_depth_target target, cm_stochastic_method method, double drop_rate,
                            cm_drop_distribution dist) {
    if ((unsigned)target > CM_SD_RESNET_BASIC_BLOCK)
        return cm_set_error(CM_ERR_INVALID_ARG, "StochasticDepth: target_layer_name %d is not valid (ResNetBottleneck, "
                                                "ResNetBasicBlock)", (int)target);
    if ((unsigned)method > CM_STOCHASTIC_SAMPLE)
        return cm_set_error(CM_ERR_INVALID_ARG, "StochasticDepth: stochastic_method %d is not valid (block, sample)",
                            (int)method);
    if (!(drop_rate >= 0 && drop_rate <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "StochasticDepth: drop_rate must be between 0 and 1: %g", drop_rate);
    if ((unsigned)dist > CM_DROP_LINEAR)
        return cm_set_error(CM_ERR_INVALID_ARG, "StochasticDepth: drop_distribution %d is not valid (uniform, linear)",
                            (int)dist);
    return CM_OK;
}

cm_status cm_apply_stochastic_depth(cm_module *root, cm_stochastic_depth_target target, cm_stochastic_method method,
                                    double drop_rate, cm_drop_distribution dist, int64_t *n_blocks) {
    if (n_blocks) *n_blocks = 0;
    cm_status st = check_args(target, method, drop_rate, dist);
    if (st) return st;
    if (!root) return cm_set_error(CM_ERR_INVALID_ARG, "cm_apply_stochastic_depth: the model is NULL");
    sd_ctx c = {k_target_types[target], method == CM_STOCHASTIC_BLOCK ? CM_RESNET_DROP_BLOCK : CM_RESNET_DROP_SAMPLE,
                drop_rate, dist, 0, 0, 0, true, CM_OK};
    cm_module_visit(root, count_visit, &c);
    if (!c.n) {
        char looked[160];
        snprintf(looked, sizeof looked, "%s blocks (target_layer_name %s)", k_target_types[target], k_targets[target]);
        return cmi_nothing_to_apply(root, "StochasticDepth", looked,
                                    target == CM_SD_RESNET_BOTTLENECK
                                        ? "ResNet-18/34 and the CIFAR ResNets have BasicBlock: use ResNetBasicBlock"
                                        : "ResNet-50 and deeper have Bottleneck: use ResNetBottleneck");
    }
    if (c.already < c.n && (st = cmi_surgery_check_unlocked(root, "StochasticDepth", "cm_apply_stochastic_depth")))
        return st;
    cm_module_visit(root, set_visit, &c);
    if (c.st) return c.st;
    if (n_blocks) *n_blocks = c.n;
    if (c.already < c.n)
        cm_log_msg(CM_LOG_INFO, "StochasticDepth: %lld %s blocks of %s drop their branch (%s, drop_rate %g, %s)",
                   (long long)c.n, k_target_types[target], cm_module_type_name(root), k_methods[method], drop_rate,
                   k_dists[dist]);
    return CM_OK;
}

cm_status cm_stochastic_depth_set_rate(cm_module *root, cm_stochastic_depth_target target, double drop_rate,
                                       cm_drop_distribution dist, int64_t *n_blocks) {
    if (n_blocks) *n_blocks = 0;
    cm_status st = check_args(target, CM_STOCHASTIC_BLOCK, drop_rate, dist);
    if (st) return st;
    if (!root) return cm_set_error(CM_ERR_INVALID_ARG, "cm_stochastic_depth_set_rate: the model is NULL");
    sd_ctx c = {k_target_types[target], CM_RESNET_DROP_NONE, drop_rate, dist, 0, 0, 0, false, CM_OK};
    cm_module_visit(root, count_visit, &c);
    if (c.already < c.n)
        return cm_set_error(CM_ERR_STATE, "cm_stochastic_depth_set_rate: %lld of the %lld %s blocks have no stochastic "
                                          "depth (apply it first)", (long long)(c.n - c.already), (long long)c.n,
                            k_target_types[target]);
    cm_module_visit(root, set_visit, &c);
    if (n_blocks) *n_blocks = c.n;
    return c.st;
}

/* ---- the algorithm ---- */

cm_stochastic_depth_config cm_stochastic_depth_config_default(void) {
    cm_stochastic_depth_config c;
    memset(&c, 0, sizeof c);
    c.target_layer_name = -1; /* required */
    c.stochastic_method = CM_STOCHASTIC_BLOCK;
    c.drop_rate = 0.2;
    c.drop_distribution = CM_DROP_LINEAR;
    c.drop_warmup = cm_time_dur(0.0);
    return c;
}

static bool warmup_on(const cm_time *w) { return cm_time_value(*w) > 0; }

static cm_status check_cfg(const cm_stochastic_depth_config *c) {
    if (!c) return cm_set_error(CM_ERR_INVALID_ARG, "StochasticDepth: config is NULL");
    if (c->target_layer_name < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "StochasticDepth: target_layer_name is required (ResNetBottleneck or "
                                                "ResNetBasicBlock)");
    cm_status st = check_args((cm_stochastic_depth_target)c->target_layer_name,
                              (cm_stochastic_method)c->stochastic_method, c->drop_rate,
                              (cm_drop_distribution)c->drop_distribution);
    if (st) return st;
    const cm_time_unit u = c->drop_warmup.unit;
    if (u != CM_TIME_DURATION && u != CM_TIME_BATCH && u != CM_TIME_EPOCH && u != CM_TIME_SAMPLE && u != CM_TIME_TOKEN)
        return cm_set_error(CM_ERR_INVALID_ARG, "StochasticDepth: drop_warmup must be in dur, ep, ba, sp or tok (got %s)",
                            cm_time_unit_name(u));
    if (c->stochastic_method == CM_STOCHASTIC_SAMPLE && warmup_on(&c->drop_warmup))
        return cm_set_error(CM_ERR_INVALID_ARG, "StochasticDepth: drop_warmup can not be used with \"sample\" "
                                                "stochastic_method");
    return CM_OK;
}

typedef struct {
    cm_stochastic_depth_config cfg;
    int64_t n_layers; /* target blocks found on INIT */
} sd_self;

static bool sd_match(void *self, cm_event ev, const cm_state *st) {
    const sd_self *s = self;
    return ev == CM_EVENT_INIT || (ev == CM_EVENT_BATCH_START && warmup_on(&s->cfg.drop_warmup));
}

/* The fraction of drop_warmup elapsed at the state's timestamp (≥ 0, may exceed 1). */
static cm_status warmup_fraction(const sd_self *s, const cm_state *st, double *out) {
    const cm_time w = s->cfg.drop_warmup;
    if (w.unit == CM_TIME_DURATION) {
        double e;
        cm_status r = cm_state_elapsed(st, &e);
        if (r) return r;
        *out = e / w.frac;
        return CM_OK;
    }
    cm_time now;
    cm_status r = cm_timestamp_get(cm_state_timestamp(st), w.unit, &now);
    if (r) return r;
    *out = (double)now.count / (double)w.count;
    return CM_OK;
}

static cm_status sd_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    sd_self *s = self;
    cm_module *root;
    cm_status r = cmi_state_root(st, "StochasticDepth", &root);
    if (r) return r;
    const cm_stochastic_depth_target target = (cm_stochastic_depth_target)s->cfg.target_layer_name;
    if (ev == CM_EVENT_INIT) {
        if ((r = cm_apply_stochastic_depth(root, target, (cm_stochastic_method)s->cfg.stochastic_method,
                                           s->cfg.drop_rate, (cm_drop_distribution)s->cfg.drop_distribution,
                                           &s->n_layers)))
            return r;
        return cm_logger_log_metric(lg, "stochastic_depth/num_stochastic_layers", (double)s->n_layers);
    }
    /* BATCH_START with a warmup: the rate grows linearly to drop_rate over drop_warmup. Composer
     * stops updating the blocks once the warmup is over, so they keep the last warmup rate (just
     * under drop_rate); here they get drop_rate itself. */
    double f;
    if ((r = warmup_fraction(s, st, &f))) return r;
    const double rate = f < 1 ? f * s->cfg.drop_rate : s->cfg.drop_rate;
    if ((r = cm_stochastic_depth_set_rate(root, target, rate, (cm_drop_distribution)s->cfg.drop_distribution, NULL)))
        return r;
    return cm_logger_log_metric(lg, "stochastic_depth/drop_rate", rate);
}

static void sd_free(void *self) { cm_free(self); }

static const cm_algorithm_i sd_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "StochasticDepth",
    .match = sd_match,
    .apply = sd_apply,
    .free = sd_free,
};

cm_status cm_stochastic_depth_new(const cm_stochastic_depth_config *cfg, cm_algorithm_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_stochastic_depth_new: out is NULL");
    cm_status st = check_cfg(cfg);
    if (st) return st;
    sd_self *s = cm_alloc_zeroed(sizeof *s, 16);
    if (!s) return CM_ERR_OOM;
    s->cfg = *cfg;
    if (cfg->drop_rate == 0)
        cm_log_msg(CM_LOG_WARN, "StochasticDepth: drop_rate 0 has no effect");
    *out = (cm_algorithm_plugin){&sd_vt, s};
    return CM_OK;
}

static void cfg_default(void *c) { *(cm_stochastic_depth_config *)c = cm_stochastic_depth_config_default(); }
static cm_status make(const void *c, cm_algorithm_plugin *out) { return cm_stochastic_depth_new(c, out); }

static const cmi_arg k_args[] = {
    {{"target_layer_name", CM_ALGO_ARG_CHOICE, NULL, k_targets, 2}, offsetof(cm_stochastic_depth_config, target_layer_name),
     false},
    {{"stochastic_method", CM_ALGO_ARG_CHOICE, "block", k_methods, 2},
     offsetof(cm_stochastic_depth_config, stochastic_method), false},
    {{"drop_rate", CM_ALGO_ARG_REAL, "0.2", NULL, 0}, offsetof(cm_stochastic_depth_config, drop_rate), false},
    {{"drop_distribution", CM_ALGO_ARG_CHOICE, "linear", k_dists, 2},
     offsetof(cm_stochastic_depth_config, drop_distribution), false},
    {{"drop_warmup", CM_ALGO_ARG_TIME, "0dur", NULL, 0}, offsetof(cm_stochastic_depth_config, drop_warmup), false},
};

const cmi_algo_entry cmi_stochastic_depth_entry = {
    {"StochasticDepth", "stochastic_depth", true, (int)(sizeof k_args / sizeof *k_args)}, &sd_vt,
    sizeof(cm_stochastic_depth_config), cfg_default, k_args, (int)(sizeof k_args / sizeof *k_args), make,
};
