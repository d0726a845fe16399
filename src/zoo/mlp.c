/* The MLP of the zoo: nn.Sequential(Flatten, Linear, act, [Dropout], ..., Linear), with the
 * indices as names, as the same nn.Sequential in PyTorch. */
#include "zoo/zoo_vision_impl.h"

#include <string.h>

cm_mlp_config cm_mlp_config_default(void) {
    cm_mlp_config c;
    memset(&c, 0, sizeof c);
    c.in_features = 784;
    c.hidden[0] = c.hidden[1] = 256;
    c.n_hidden = 2;
    c.num_classes = 10;
    c.act = CM_ACT_RELU;
    c.random_init = true;
    return c;
}

cm_status cm_mlp_config_preset(const char *name, cm_mlp_config *out) {
    static const char *const names[] = {"mnist", "mnist_small", "mnist_large"};
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_mlp_config_preset: out is NULL");
    cm_mlp_config c = cm_mlp_config_default();
    if (name && !strcmp(name, "mnist")) {
    } else if (name && !strcmp(name, "mnist_small")) {
        c.hidden[0] = 128, c.n_hidden = 1;
    } else if (name && !strcmp(name, "mnist_large")) {
        c.hidden[0] = c.hidden[1] = 512, c.dropout = 0.2f;
    } else {
        return cmz_unknown_preset("cm_mlp_config_preset", name, names, 3);
    }
    *out = c;
    return CM_OK;
}

static cm_status check_config(const char *fn, const cm_mlp_config *c) {
    if (!c) return cm_set_error(CM_ERR_INVALID_ARG, "%s: config is NULL", fn);
    if (c->n_hidden < 0 || c->n_hidden > CM_MLP_MAX_HIDDEN)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: n_hidden %d must be in [0, %d]", fn, c->n_hidden, CM_MLP_MAX_HIDDEN);
    if (c->in_features < 1 || c->num_classes < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: in_features %lld and num_classes %lld must be at least 1", fn,
                            (long long)c->in_features, (long long)c->num_classes);
    for (int i = 0; i < c->n_hidden; i++)
        if (c->hidden[i] < 1)
            return cm_set_error(CM_ERR_INVALID_ARG, "%s: hidden[%d] = %lld must be at least 1", fn, i,
                                (long long)c->hidden[i]);
    if (!(c->dropout >= 0 && c->dropout < 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: dropout %g must be in [0, 1)", fn, c->dropout);
    if ((unsigned)c->act > CM_ACT_IDENTITY)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: unknown activation %d", fn, (int)c->act);
    return CM_OK;
}

/* Appends a made module to the Sequential (freeing it on failure). */
static cm_status append(cm_module *seq, cm_status made, cm_module **child) {
    if (made) return made;
    cm_status st = cm_nn_sequential_append(seq, *child);
    if (st) cm_module_free(*child);
    return st;
}

cm_status cm_mlp_new(const cm_mlp_config *cfg, cm_module **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_mlp_new: out is NULL");
    *out = NULL;
    cm_status st = check_config("cm_mlp_new", cfg);
    if (st) return st;
    cm_rng rng_state = cm_rng_init(cfg->seed, 0), *rng = cfg->random_init ? &rng_state : NULL;
    cm_module *m, *c;
    if ((st = cm_nn_sequential_new(&m))) return st;
    if ((st = append(m, cm_nn_flatten_new(1, &c), &c))) return cmz_fail_build(&m, st);
    int64_t in = cfg->in_features;
    for (int i = 0; i < cfg->n_hidden; i++) {
        if ((st = append(m, cm_nn_linear_new(in, cfg->hidden[i], true, rng, &c), &c)) ||
            (st = append(m, cm_nn_activation_new(cfg->act, &c), &c)) ||
            (cfg->dropout > 0 && (st = append(m, cm_nn_dropout_new(cfg->dropout, &c), &c))))
            return cmz_fail_build(&m, st);
        in = cfg->hidden[i];
    }
    if ((st = append(m, cm_nn_linear_new(in, cfg->num_classes, true, rng, &c), &c))) return cmz_fail_build(&m, st);
    *out = m;
    return CM_OK;
}

double cm_mlp_forward_flops(const cm_mlp_config *c) {
    if (!c || c->n_hidden < 0 || c->n_hidden > CM_MLP_MAX_HIDDEN) return 0.0;
    double macs = 0;
    int64_t in = c->in_features;
    for (int i = 0; i < c->n_hidden; i++) macs += (double)in * c->hidden[i], in = c->hidden[i];
    return 2.0 * (macs + (double)in * c->num_classes);
}

static double flops_cb(const void *cfg, int64_t h, int64_t w) { return cm_mlp_forward_flops(cfg); }

cm_status cm_mlp_model_new(const cm_mlp_config *cfg, cm_model **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_mlp_model_new: out is NULL");
    *out = NULL;
    cm_module *net;
    cm_status st = cm_mlp_new(cfg, &net);
    if (st) return st;
    return cmz_vision_model_new(net, flops_cb, cfg, sizeof *cfg, out);
}
