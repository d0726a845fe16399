/* OptimizerMonitor: per-parameter gradient and parameter norms, the optimizer state's norms and
 * the update's, and the global gradient norm (Composer's OptimizerMonitor with its optimizers'
 * report_per_parameter_metrics). Reads the units' flat buffers — or, under a sharded strategy,
 * this rank's shard spans: each rank sums over its pieces of every parameter and the sums are
 * added over ranks before the norms and cosines are taken, so every rank logs the global values.
 * A model on a GPU is read through host copies of one unit's spans at a time. */
#include "cb_impl.h"
#include "tensor/tensor_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { OM_KEY = 256, OM_PER_PARAM = 8 };

typedef struct {
    cm_optimizer_monitor_config cfg;
    char *keys;              /* (cap_values, OM_KEY) key storage for one batch's values */
    cm_metric_value *values; /* (cap_values) */
    int64_t cap_values;
    float *host;             /* a model on a GPU: one unit's spans copied to the host, (5, host_cap) */
    int64_t host_cap;
} optimizer_monitor;

/* The optimizer state of one unit, found by the trainer's span naming. */
typedef struct {
    const float *m, *v, *buf; /* exp_avg, exp_avg_sq, momentum_buffer: (unit numel) or NULL */
    int64_t step;
} unit_state;

static const float *state_f32(const cm_optim *o, const char *unit, const char *key, int64_t numel) {
    char name[320];
    snprintf(name, sizeof name, "%s.%s", unit, key);
    cm_optim_state_entry e;
    if (cm_optim_state_find(o, name, &e) != CM_OK || e.dtype != CM_DTYPE_F32 || e.numel != numel) return NULL;
    return e.data;
}

/* numel: the elements the optimizer holds for the unit (all of it, or this rank's piece). */
static unit_state find_unit_state(const cm_optim *o, const cm_unit_info *u, int64_t numel) {
    unit_state us = {0};
    if (!o) return us;
    us.m = state_f32(o, u->name, "exp_avg", numel);
    us.v = state_f32(o, u->name, "exp_avg_sq", numel);
    us.buf = state_f32(o, u->name, "momentum_buffer", numel);
    char name[320];
    snprintf(name, sizeof name, "%s.step", u->name);
    cm_optim_state_entry e;
    if (cm_optim_state_find(o, name, &e) == CM_OK && e.dtype == CM_DTYPE_I64 && e.numel == 1)
        us.step = *(const int64_t *)e.data;
    return us;
}

/* Sums over one parameter's span. */
typedef struct {
    double gg, pp, mm, vv, uu, gu, gm;
} sums;

static sums span_sums(const float *g, const float *p, int64_t n) {
    double gg = 0, pp = 0;
#pragma omp parallel for schedule(static) reduction(+ : gg, pp) if (n > 65536)
    for (int64_t i = 0; i < n; i++) gg += (double)g[i] * g[i], pp += (double)p[i] * p[i];
    return (sums){.gg = gg, .pp = pp};
}

/* Adam kinds: the moments and Composer's step tensor u = (lr/bc1)·m/(sqrt(v)/sqrt(bc2) + eps) + c·p. */
static void adam_sums(sums *s, const float *g, const float *p, const float *m, const float *v, int64_t n,
                      double step_size, double sqrt_bc2, double eps, double c) {
    double mm = 0, vv = 0, uu = 0, gu = 0, gm = 0;
#pragma omp parallel for schedule(static) reduction(+ : mm, vv, uu, gu, gm) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
        const double u = step_size * m[i] / (sqrt((double)v[i]) / sqrt_bc2 + eps) + c * p[i];
        mm += (double)m[i] * m[i], vv += (double)v[i] * v[i];
        uu += u * u, gu += (double)g[i] * u, gm += (double)g[i] * m[i];
    }
    s->mm = mm, s->vv = vv, s->uu = uu, s->gu = gu, s->gm = gm;
}

static void momentum_sums(sums *s, const float *g, const float *b, int64_t n) {
    double mm = 0, gm = 0;
#pragma omp parallel for schedule(static) reduction(+ : mm, gm) if (n > 65536)
    for (int64_t i = 0; i < n; i++) mm += (double)b[i] * b[i], gm += (double)g[i] * b[i];
    s->mm = mm, s->gm = gm;
}

/* torch.nn.functional.cosine_similarity with its eps = 1e-8 */
static double cosine(double dot, double aa, double bb) { return dot / fmax(sqrt(aa) * sqrt(bb), 1e-8); }

static cm_status om_reserve(optimizer_monitor *om, int64_t n) {
    if (n <= om->cap_values) return CM_OK;
    cm_free(om->keys);
    cm_free(om->values);
    om->keys = cm_alloc((size_t)n * OM_KEY, 16);
    om->values = cm_alloc(sizeof *om->values * (size_t)n, 16);
    if (!om->keys || !om->values) {
        cm_free(om->keys), cm_free(om->values);
        om->keys = NULL, om->values = NULL, om->cap_values = 0;
        return CM_ERR_OOM;
    }
    om->cap_values = n;
    return CM_OK;
}

/* A model on a GPU: the unit's gradient, parameter and optimizer-state spans (held elements each)
 * copied to the host, and the pointers swapped for the copies, so the sums run as on the CPU. One
 * unit at a time: the copies cost the unit's size in device-to-host traffic per logged batch. */
static cm_status stage_unit(optimizer_monitor *om, cm_device dev, const float **g, const float **w, unit_state *us,
                            int64_t held) {
    if (held > om->host_cap) {
        cm_free(om->host);
        om->host_cap = 0;
        if (!(om->host = cm_alloc(sizeof(float) * 5 * (size_t)(held ? held : 1), 64)))
            return cm_set_error(CM_ERR_OOM, "OptimizerMonitor: out of memory for a host copy of %lld elements",
                                (long long)held);
        om->host_cap = held;
    }
    const float **spans[5] = {g, w, &us->m, &us->v, &us->buf};
    for (int k = 0; k < 5; k++) {
        if (!*spans[k]) continue;
        float *h = om->host + (size_t)k * (size_t)om->host_cap;
        cm_status s = cmi_dev_memcpy(h, CM_DEVICE_CPU, *spans[k], dev, sizeof(float) * (size_t)held);
        if (s) return s;
        *spans[k] = h;
    }
    return CM_OK;
}

static cm_status om_batch_end(optimizer_monitor *om, const cm_state *st, cm_logger *lg) {
    cm_model *model = cm_state_model(st);
    if (!model) return cm_set_error(CM_ERR_STATE, "OptimizerMonitor: the state has no model");
    cm_module *root = cm_model_module(model);
    if (!root || !cm_module_is_finalized(root))
        return cm_set_error(CM_ERR_STATE, "OptimizerMonitor: the model's module tree is not finalized");
    const cm_device dev = cm_module_device(root);
    const int64_t np = cm_module_n_params(root);
    cm_status s = om_reserve(om, np * OM_PER_PARAM + 1);
    if (s) return s;

    const cm_optim *opt = om->cfg.log_optimizer_metrics ? cm_state_optimizer(st) : NULL;
    const cm_optim_kind kind = opt ? cm_optim_get_kind(opt) : CM_OPTIM_SGD;
    const bool adam = opt && (kind == CM_OPTIM_ADAM || kind == CM_OPTIM_ADAMW || kind == CM_OPTIM_DECOUPLED_ADAMW);
    cm_optim_hparams hp = {0};
    /* Composer reads param_groups[0]'s hyperparameters for every parameter; so do we (spans do not
     * say which group they are in). */
    if (opt && cm_optim_n_groups(opt) > 0 && cm_optim_group_get(opt, 0, &hp) != CM_OK) opt = NULL;
    const double mult = cm_state_lr_multiplier(st), lr = hp.lr * mult;

    int n_sh = 0;
    const cm_shard_span *sh = cm_state_shard_spans(st, &n_sh);
    if (sh && n_sh != cm_module_n_units(root))
        return cm_set_error(CM_ERR_STATE, "OptimizerMonitor: %d shard spans for %d units", n_sh, cm_module_n_units(root));
    /* Pass 1: per parameter, the sums over the elements this rank holds (7 per parameter). */
    sums *acc = cm_alloc_zeroed(sizeof *acc * (size_t)(np > 0 ? np : 1), 16);
    bool *has_adam = cm_alloc_zeroed(sizeof *has_adam * (size_t)(np > 0 ? np : 1), 16);
    bool *has_mom = cm_alloc_zeroed(sizeof *has_mom * (size_t)(np > 0 ? np : 1), 16);
    if (!acc || !has_adam || !has_mom) {
        cm_free(acc), cm_free(has_adam), cm_free(has_mom);
        return cm_set_error(CM_ERR_OOM, "OptimizerMonitor: out of memory for %lld parameters", (long long)np);
    }
    int cached_unit = -1;
    unit_state us = {0};
    const float *ug = NULL, *uw = NULL; /* the cached unit's (or piece's) gradients and parameters */
    for (int64_t i = 0; i < np; i++) {
        const cm_param_info p = cm_module_param_info(root, i);
        if (!p.requires_grad || p.numel == 0) continue;
        const cm_unit_info *u = cm_module_unit(root, p.unit);
        if (!u || !u->grads) continue;
        /* [lo, hi) of the unit's elements: the parameter's, cut to this rank's piece */
        int64_t lo = p.offset, hi = p.offset + p.numel, base = 0, held = u->numel;
        const float *g = u->grads, *w = u->params;
        if (sh) {
            const cm_shard_span *sp = &sh[p.unit];
            lo = lo > sp->begin ? lo : sp->begin;
            hi = hi < sp->end ? hi : sp->end;
            base = sp->begin, held = sp->end - sp->begin;
            g = sp->grads, w = sp->params;
        }
        if (p.unit != cached_unit) {
            us = find_unit_state(opt, u, held), cached_unit = p.unit;
            ug = g, uw = w;
            if (dev != CM_DEVICE_CPU && (s = stage_unit(om, dev, &ug, &uw, &us, held))) {
                cm_free(acc), cm_free(has_adam), cm_free(has_mom);
                return s;
            }
        }
        g = ug, w = uw;
        has_adam[i] = adam && us.m && us.v && us.step > 0;
        has_mom[i] = !has_adam[i] && us.buf;
        if (hi <= lo || (sh && sh[p.unit].replica)) continue; /* nothing of it here (or another rank counts this
                                                                  replica's piece): zeros join the sums over ranks */
        const int64_t n = hi - lo, at = lo - base;
        sums sm = span_sums(g + at, w + at, n);
        if (opt && om->cfg.log_optimizer_metrics && has_adam[i]) {
            const double t = (double)us.step, bc1 = 1 - pow(hp.beta1, t), bc2 = 1 - pow(hp.beta2, t);
            /* The weight-decay part of the update (as the step applied it; see the header): */
            const double c = kind == CM_OPTIM_DECOUPLED_ADAMW ? hp.weight_decay * mult
                             : kind == CM_OPTIM_ADAMW          ? lr * hp.weight_decay
                                                               : 0.0;
            adam_sums(&sm, g + at, w + at, us.m + at, us.v + at, n, lr / bc1, sqrt(bc2), hp.eps, c);
        } else if (opt && om->cfg.log_optimizer_metrics && has_mom[i]) {
            momentum_sums(&sm, g + at, us.buf + at, n);
        }
        acc[i] = sm;
    }
    if (sh && (s = cm_state_all_reduce_sum(st, (double *)acc, (int)(np * (int64_t)(sizeof(sums) / sizeof(double)))))) {
        cm_free(acc), cm_free(has_adam), cm_free(has_mom);
        return s;
    }
    /* Pass 2: norms and cosines of the (global) sums. */
    int64_t k = 0;
    double global = 0;
#define OM_PUT(fmt, val)                                                        \
    do {                                                                        \
        char *key_ = om->keys + k * OM_KEY;                                     \
        snprintf(key_, OM_KEY, fmt, p.name);                                    \
        om->values[k++] = (cm_metric_value){key_, (val)};                        \
    } while (0)
    for (int64_t i = 0; i < np; i++) {
        const cm_param_info p = cm_module_param_info(root, i);
        if (!p.requires_grad || p.numel == 0) continue;
        const cm_unit_info *u = cm_module_unit(root, p.unit);
        if (!u || !u->grads) continue;
        const sums sm = acc[i];
        global += sm.gg;
        OM_PUT("l2_norm/grad/%s", sqrt(sm.gg));
        if (!om->cfg.log_optimizer_metrics) continue;
        OM_PUT("l2_norm/param/%s", sqrt(sm.pp));
        if (!opt) continue;
        if (has_adam[i]) {
            OM_PUT("l2_norm/moment/%s", sqrt(sm.mm));
            OM_PUT("l2_norm/second_moment_sqrt/%s", sqrt(sqrt(sm.vv)));
            OM_PUT("l2_norm/update/%s", sqrt(sm.uu));
            OM_PUT("cosine/update_grad/%s", cosine(sm.gu, sm.gg, sm.uu));
            OM_PUT("cosine/moment_grad/%s", cosine(sm.gm, sm.gg, sm.mm));
        } else if (has_mom[i]) {
            OM_PUT("l2_norm/moment/%s", sqrt(sm.mm));
            OM_PUT("cosine/moment_grad/%s", cosine(sm.gm, sm.gg, sm.mm));
        }
    }
#undef OM_PUT
    cm_free(acc), cm_free(has_adam), cm_free(has_mom);
    om->values[k++] = (cm_metric_value){"l2_norm/grad/global", sqrt(global)};
    return cm_logger_log_metrics(lg, om->values, (int)k);
}

static cm_status om_run_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    optimizer_monitor *om = self;
    if (ev != CM_EVENT_BATCH_END || cm_state_timestamp(st)->batch % om->cfg.batch_log_interval != 0) return CM_OK;
    return om_batch_end(om, st, lg);
}

static void om_free(void *self) {
    optimizer_monitor *om = self;
    if (!om) return;
    cm_free(om->keys);
    cm_free(om->values);
    cm_free(om->host);
    cm_free(om);
}

static const cm_callback_i optimizer_monitor_vt = {
    .abi = CM_CALLBACK_ABI,
    .name = "OptimizerMonitor",
    .run_event = om_run_event,
    .free = om_free,
};

cm_optimizer_monitor_config cm_optimizer_monitor_config_default(void) {
    return (cm_optimizer_monitor_config){.log_optimizer_metrics = true, .batch_log_interval = 1};
}

cm_status cm_optimizer_monitor_new(const cm_optimizer_monitor_config *cfg, cm_callback_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_optimizer_monitor_new: out is NULL");
    cm_optimizer_monitor_config c = cfg ? *cfg : cm_optimizer_monitor_config_default();
    if (c.batch_log_interval < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "OptimizerMonitor: batch_log_interval %d must be ≥ 1",
                            c.batch_log_interval);
    optimizer_monitor *om = cm_alloc_zeroed(sizeof *om, 16);
    if (!om) return CM_ERR_OOM;
    om->cfg = c;
    *out = (cm_callback_plugin){&optimizer_monitor_vt, om};
    return CM_OK;
}
