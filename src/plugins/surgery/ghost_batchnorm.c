/* GhostBatchNorm (Hoffer et al. 2017; Composer's GhostBatchNorm): batch norm computes its training
 * statistics over "ghost" batches of ghost_batch_size rows, as Composer's _GhostBatchNorm: the
 * batch is split with torch.chunk into ceil(B / ghost_batch_size) chunks, each normalised by the
 * wrapped BatchNorm2d with its momentum divided by that count, and the chunks are concatenated.
 * Module tree as Composer's: GhostBatchNorm2d {batchnorm: the original BatchNorm2d}. */
#include "nn/nn_impl.h"
#include "plugins/surgery/surgery_impl.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    int64_t ghost_batch_size;
    cm_module *batchnorm;
} gbn_s;

cm_tensor *cm_ghost_batch_norm(cm_tape *tp, cm_module *bn, cm_tensor *x, int64_t ghost_batch_size) {
    if (!tp || cm_tape_status(tp) || !x) return NULL;
    int64_t C;
    cm_nn_batch_norm_config cfg;
    if (cm_nn_batch_norm2d_config_of(bn, &C, &cfg)) {
        cm_tape_fail(tp, CM_ERR_INVALID_ARG, "ghost batch norm: %s", cm_last_error());
        return NULL;
    }
    const int64_t B = cm_tensor_dim(x, 0);
    if (!cm_module_is_training(bn)) return cm_module_forward(bn, tp, x); /* running statistics: chunks change nothing */
    if (ghost_batch_size < 1 || B < ghost_batch_size) {
        cm_tape_fail(tp, CM_ERR_SHAPE, "GhostBatchNorm: worker batch size %lld < ghost_batch_size %lld (lower "
                     "ghost_batch_size, or give each microbatch at least that many rows)",
                     (long long)B, (long long)ghost_batch_size);
        return NULL;
    }
    const int64_t nchunks = (B + ghost_batch_size - 1) / ghost_batch_size;
    const int64_t size = (B + nchunks - 1) / nchunks; /* torch.chunk: equal chunks of ceil(B / n), the last shorter */
    cm_tensor *w = cm_module_param(bn, "weight"), *b = cm_module_param(bn, "bias");
    cm_tensor *rm = cm_module_buffer(bn, "running_mean"), *rv = cm_module_buffer(bn, "running_var");
    cm_tensor *nbt = cm_module_buffer(bn, "num_batches_tracked");
    cm_batch_norm_opts o = cm_batch_norm_opts_default();
    o.eps = cfg.eps;
    o.momentum = cfg.momentum / (float)nchunks; /* Composer's _scale_momentum */
    o.channels_last = cfg.channels_last;
    o.training = true;
    enum { MAXC = 1024 };
    cm_tensor *parts[MAXC];
    int n = 0;
    for (int64_t s = 0; s < B; s += size) {
        if (n == MAXC) {
            cm_tape_fail(tp, CM_ERR_UNSUPPORTED, "GhostBatchNorm: more than %d ghost batches in one batch", MAXC);
            return NULL;
        }
        const int64_t len = B - s < size ? B - s : size;
        parts[n++] = cm_batch_norm(tp, cm_narrow(tp, x, 0, s, len), w, b, rm, rv, &o);
    }
    cmn_count_batches(tp, nbt, n); /* one update per chunk, as torch counts */
    return n == 1 ? parts[0] : cm_concat(tp, parts, n, 0);
}

static cm_tensor *gbn_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    gbn_s *s = cm_module_self(m);
    return cm_ghost_batch_norm(tp, s->batchnorm, in[0], s->ghost_batch_size);
}

static void gbn_desc(const cm_module *m, char *buf, size_t cap) {
    snprintf(buf, cap, "ghost_batch_size=%lld", (long long)((const gbn_s *)cm_module_self(m))->ghost_batch_size);
}

static void free_self(void *self) { cm_free(self); }

static const cm_module_i gbn_vt = {CM_MODULE_ABI, "GhostBatchNorm2d", gbn_fwd, free_self, gbn_desc};

/* ---- the surgery ---- */

static bool is_type(const cm_module *m, const char *t) { return m && !strcmp(cm_module_type_name(m), t); }

static bool gbn_match(cm_module *m, const char *path, void *data) {
    return is_type(m, "BatchNorm2d") && !cmi_has_ancestor(m, "GhostBatchNorm2d");
}

typedef struct {
    int64_t ghost_batch_size, n;
} gbn_ctx;

static cm_status gbn_make(cm_module *old, const char *path, void *data, cm_module **out) {
    gbn_ctx *c = data;
    gbn_s *s = cm_alloc_zeroed(sizeof *s, 8);
    if (!s) return CM_ERR_OOM;
    cm_status st = cm_module_new(&gbn_vt, s, out);
    if (st) {
        cm_free(s);
        return st;
    }
    s->ghost_batch_size = c->ghost_batch_size;
    if ((st = cm_module_add_child(*out, "batchnorm", old, &s->batchnorm))) {
        cm_module_free(*out);
        *out = NULL;
        return st;
    }
    c->n++;
    return CM_OK;
}

typedef struct {
    int64_t eligible, done;
} gbn_scan;

static bool scan_visit(cm_module *m, const char *path, int depth, void *data) {
    gbn_scan *s = data;
    s->eligible += gbn_match(m, path, NULL);
    s->done += is_type(m, "GhostBatchNorm2d");
    return true;
}

cm_status cm_apply_ghost_batchnorm(cm_module *root, int64_t ghost_batch_size, int64_t *n_replaced) {
    if (n_replaced) *n_replaced = 0;
    if (ghost_batch_size < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "GhostBatchNorm: ghost_batch_size %lld must be at least 1",
                            (long long)ghost_batch_size);
    cm_status st = cmi_surgery_check_unlocked(root, "GhostBatchNorm", "cm_apply_ghost_batchnorm");
    if (st) return st;
    gbn_scan sc = {0, 0};
    cm_module_visit(root, scan_visit, &sc);
    if (!sc.eligible) return sc.done ? CM_OK : cmi_nothing_to_apply(root, "GhostBatchNorm", "BatchNorm2d layers", "");
    gbn_ctx c = {ghost_batch_size, 0};
    st = cm_module_replace(root, gbn_match, gbn_make, &c, NULL);
    if (n_replaced) *n_replaced = c.n;
    if (!st)
        cm_log_msg(CM_LOG_INFO, "GhostBatchNorm: applied to %s with ghost_batch_size=%lld: %lld GhostBatchNorm modules",
                   cm_module_type_name(root), (long long)ghost_batch_size, (long long)c.n);
    return st;
}

/* ---- the algorithm ---- */

typedef struct {
    cm_ghost_batchnorm_config cfg;
} gbn_self;

static bool alg_match(void *self, cm_event ev, const cm_state *st) { return ev == CM_EVENT_INIT; }

static cm_status alg_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    gbn_self *s = self;
    cm_module *root;
    cm_status r = cmi_state_root(st, "GhostBatchNorm", &root);
    if (r || (r = cm_apply_ghost_batchnorm(root, s->cfg.ghost_batch_size, NULL))) return r;
    const char *const t[1] = {"GhostBatchNorm2d"};
    cm_hparam h = {"GhostBatchNorm/num_new_modules", CM_HPARAM_NUMBER, (double)cmi_count_types(root, t, 1), NULL};
    return cm_logger_log_hyperparameters(lg, &h, 1);
}

static void alg_free(void *self) { cm_free(self); }

static const cm_algorithm_i gbn_alg_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "GhostBatchNorm",
    .match = alg_match,
    .apply = alg_apply,
    .free = alg_free,
};

cm_ghost_batchnorm_config cm_ghost_batchnorm_config_default(void) { return (cm_ghost_batchnorm_config){32}; }

cm_status cm_ghost_batchnorm_new(const cm_ghost_batchnorm_config *cfg, cm_algorithm_plugin *out) {
    if (!out || !cfg) return cm_set_error(CM_ERR_INVALID_ARG, "cm_ghost_batchnorm_new: NULL argument");
    if (cfg->ghost_batch_size < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "GhostBatchNorm: ghost_batch_size %lld must be at least 1",
                            (long long)cfg->ghost_batch_size);
    gbn_self *s = cm_alloc_zeroed(sizeof *s, 16);
    if (!s) return CM_ERR_OOM;
    s->cfg = *cfg;
    *out = (cm_algorithm_plugin){&gbn_alg_vt, s};
    return CM_OK;
}

static void cfg_default(void *c) { *(cm_ghost_batchnorm_config *)c = cm_ghost_batchnorm_config_default(); }
static cm_status make(const void *c, cm_algorithm_plugin *out) { return cm_ghost_batchnorm_new(c, out); }

static const cmi_arg k_args[] = {
    {{"ghost_batch_size", CM_ALGO_ARG_INT, "32", NULL, 0}, offsetof(cm_ghost_batchnorm_config, ghost_batch_size), false},
};

const cmi_algo_entry cmi_ghost_bn_entry = {
    {"GhostBatchNorm", "ghost_batchnorm", true, 1}, &gbn_alg_vt, sizeof(cm_ghost_batchnorm_config), cfg_default,
    k_args, 1, make,
};
