/* GyroDropout (Composer's GyroDropout): every Dropout becomes a GyroDropoutLayer that trains a
 * small set of subnetworks. As Composer's layer: sigma masks over the features are preselected
 * (feature kept when u > p), every iter_num = int(iters_per_epoch · max_epoch / sigma) · tau steps
 * tau of them are picked (with replacement), the batch's rows are split into tau equal groups that
 * use one picked mask each, and kept features are scaled by 1 / (1 - p). In eval it is the
 * identity. The input is (B, F) and B a multiple of tau (Composer's repeat_interleave).
 *
 * Differences from Composer, so resumption and microbatching are exact (Composer marks its
 * resumption test xfail): the masks and the picks are pure functions of (seed, the layer's path,
 * the mask / pick index) instead of torch's global generator; the step is the trainer's batch count
 * (set on BATCH_START) instead of a count of forward calls; and rows are grouped by their global
 * row in the batch (the tape's row context), so a microbatch uses the masks its rows would have in
 * the whole batch. The surgery runs on INIT (Composer's on FIT_START, after its optimizer exists);
 * FIT_START sets iter_num from the run's length (max_duration in ep or ba). */
#include "plugins/surgery/surgery_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    float p;
    int64_t sigma, tau;
    uint64_t seed, stream;
    int64_t iter_num; /* 0 until configured */
    int64_t step;     /* the trainer's batch count */
} gyro_s;

static cm_tensor *gyro_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    gyro_s *s = cm_module_self(m);
    cm_tensor *x = in[0];
    if (!cm_module_is_training(m) || !x) return x;
    char sh[64];
    if (cm_tensor_ndim(x) != 2) {
        cm_tape_fail(tp, CM_ERR_SHAPE, "GyroDropoutLayer: the input %s must be (B, F), as Composer's layer takes",
                     cm_tensor_shape_str(x, sh, sizeof sh));
        return NULL;
    }
    if (s->iter_num < 1) {
        cm_tape_fail(tp, CM_ERR_STATE, "GyroDropoutLayer: no schedule yet (the GyroDropout algorithm sets it on "
                                       "FIT_START; by hand: cm_gyro_dropout_set_schedule)");
        return NULL;
    }
    const int64_t B = cm_tensor_dim(x, 0), F = cm_tensor_dim(x, 1);
    int64_t first = 0, n = 0, total = B;
    if (!cm_tape_rows(tp, &first, &n, &total) || n != B) first = 0, total = B;
    if (total % s->tau) {
        cm_tape_fail(tp, CM_ERR_SHAPE, "GyroDropoutLayer: the batch of %lld rows is not a multiple of tau %lld (each of "
                     "the tau masks takes an equal share of the rows)", (long long)total, (long long)s->tau);
        return NULL;
    }
    const int64_t per = total / s->tau, q = s->step / s->iter_num;
    const int64_t shape[2] = {B, F};
    cm_tensor *mask = cm_empty_on(tp, CM_DEVICE_CPU, CM_DTYPE_F32, 2, shape); /* drawn on the host, then moved */
    if (!mask) return NULL;
    float *d = cm_tensor_data(mask);
    const float scale = 1.0f / (1.0f - s->p);
    for (int64_t r = 0; r < B; r++) {
        const int64_t j = (first + r) / per; /* which of the tau picks */
        const float u = cm_rng_uniform_at(s->seed, s->stream + 1, (uint64_t)(q * s->tau + j));
        int64_t pick = (int64_t)(u * (float)s->sigma);
        if (pick >= s->sigma) pick = s->sigma - 1;
        for (int64_t f = 0; f < F; f++)
            d[r * F + f] = cm_rng_uniform_at(s->seed, s->stream, (uint64_t)(pick * F + f)) > s->p ? scale : 0.0f;
    }
    return cm_mul(tp, x, cm_to_device(tp, mask, cm_tensor_device(x)));
}

static void gyro_desc(const cm_module *m, char *buf, size_t cap) {
    const gyro_s *s = cm_module_self(m);
    snprintf(buf, cap, "p=%g, sigma=%lld, tau=%lld", s->p, (long long)s->sigma, (long long)s->tau);
}

static void free_self(void *self) { cm_free(self); }

static const cm_module_i gyro_vt = {CM_MODULE_ABI, "GyroDropoutLayer", gyro_fwd, free_self, gyro_desc};

/* ---- the surgery ---- */

typedef struct {
    const cm_gyro_dropout_config *cfg;
    uint64_t seed;
    int64_t n;
} gd_ctx;

static bool gd_match(cm_module *m, const char *path, void *data) { return !strcmp(cm_module_type_name(m), "Dropout"); }

static cm_status gd_make(cm_module *old, const char *path, void *data, cm_module **out) {
    gd_ctx *c = data;
    gyro_s *s = cm_alloc_zeroed(sizeof *s, 8);
    if (!s) return CM_ERR_OOM;
    cm_status st = cm_module_new(&gyro_vt, s, out);
    if (st) {
        cm_free(s);
        return st;
    }
    s->p = (float)c->cfg->p, s->sigma = c->cfg->sigma, s->tau = c->cfg->tau;
    s->seed = c->seed;
    s->stream = cm_hash64(path, strlen(path), 0x4759524full /* "GYRO" */) & ~1ull; /* masks even, picks odd */
    c->n++;
    return CM_OK;
}

typedef struct {
    int64_t drop, gyro;
} gd_scan;

static bool scan_visit(cm_module *m, const char *path, int depth, void *data) {
    gd_scan *s = data;
    s->drop += !strcmp(cm_module_type_name(m), "Dropout");
    s->gyro += cm_module_vtable(m) == &gyro_vt;
    return true;
}

static cm_status check_cfg(const cm_gyro_dropout_config *c) {
    if (!c) return cm_set_error(CM_ERR_INVALID_ARG, "GyroDropout: config is NULL");
    if (!(c->p >= 0 && c->p < 1) || c->sigma < 1 || c->tau < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "GyroDropout: p %g must be in [0, 1), sigma %lld and tau %lld at least 1",
                            c->p, (long long)c->sigma, (long long)c->tau);
    return CM_OK;
}

cm_status cm_apply_gyro_dropout(cm_module *root, const cm_gyro_dropout_config *cfg, uint64_t seed, int64_t *n_replaced) {
    if (n_replaced) *n_replaced = 0;
    cm_status st = check_cfg(cfg);
    if (st || (st = cmi_surgery_check_unlocked(root, "GyroDropout", "cm_apply_gyro_dropout"))) return st;
    gd_scan sc = {0, 0};
    cm_module_visit(root, scan_visit, &sc);
    if (!sc.drop) return sc.gyro ? CM_OK : cmi_nothing_to_apply(root, "GyroDropout", "Dropout layers", "");
    gd_ctx c = {cfg, seed, 0};
    st = cm_module_replace(root, gd_match, gd_make, &c, NULL);
    if (n_replaced) *n_replaced = c.n;
    if (!st)
        cm_log_msg(CM_LOG_INFO, "GyroDropout: replaced %lld Dropout layers of %s with GyroDropoutLayer (p %g, sigma "
                                "%lld, tau %lld)", (long long)c.n, cm_module_type_name(root), cfg->p,
                   (long long)cfg->sigma, (long long)cfg->tau);
    return st;
}

typedef struct {
    int64_t ipe, me; /* iters_per_epoch, max_epoch (0: leave iter_num) */
    int64_t step;    /* < 0: leave step */
    int64_t n;
} sched_ctx;

static bool sched_visit(cm_module *m, const char *path, int depth, void *data) {
    sched_ctx *c = data;
    if (cm_module_vtable(m) != &gyro_vt) return true;
    gyro_s *s = cm_module_self(m);
    if (c->ipe > 0) {
        /* Composer: int(iters_per_epoch * max_epoch / sigma) * tau — 0 (a run shorter than sigma
         * batches) would divide by zero there; here the picks then change every step */
        const int64_t k = (int64_t)((double)c->ipe * (double)c->me / (double)s->sigma) * s->tau;
        s->iter_num = k > 0 ? k : 1;
    }
    if (c->step >= 0) s->step = c->step;
    c->n++;
    return true;
}

cm_status cm_gyro_dropout_set_schedule(cm_module *root, int64_t iters_per_epoch, int64_t max_epoch) {
    if (!root || iters_per_epoch < 1 || max_epoch < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_gyro_dropout_set_schedule: iters_per_epoch %lld and max_epoch %lld "
                                                "must be at least 1", (long long)iters_per_epoch, (long long)max_epoch);
    sched_ctx c = {iters_per_epoch, max_epoch, -1, 0};
    cm_module_visit(root, sched_visit, &c);
    return c.n ? CM_OK : cm_set_error(CM_ERR_STATE, "cm_gyro_dropout_set_schedule: the model has no GyroDropoutLayer");
}

cm_status cm_gyro_dropout_set_step(cm_module *root, int64_t step) {
    if (!root || step < 0) return cm_set_error(CM_ERR_INVALID_ARG, "cm_gyro_dropout_set_step: bad arguments");
    sched_ctx c = {0, 0, step, 0};
    cm_module_visit(root, sched_visit, &c);
    return c.n ? CM_OK : cm_set_error(CM_ERR_STATE, "cm_gyro_dropout_set_step: the model has no GyroDropoutLayer");
}

/* ---- the algorithm ---- */

typedef struct {
    cm_gyro_dropout_config cfg;
} gd_self;

static bool alg_match(void *self, cm_event ev, const cm_state *st) {
    return ev == CM_EVENT_INIT || ev == CM_EVENT_FIT_START || ev == CM_EVENT_BATCH_START;
}

static cm_status alg_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    gd_self *s = self;
    cm_module *root;
    cm_status r = cmi_state_root(st, "GyroDropout", &root);
    if (r) return r;
    if (ev == CM_EVENT_INIT) return cm_apply_gyro_dropout(root, &s->cfg, cm_state_seed(st), NULL);
    if (ev == CM_EVENT_BATCH_START) return cm_gyro_dropout_set_step(root, cm_state_timestamp(st)->batch);
    /* FIT_START: Composer's iters_per_epoch = the train loader's batches, max_epoch = the run's length */
    const int64_t ipe = cm_state_batches_per_epoch(st);
    const cm_time md = cm_state_max_duration(st);
    int64_t epochs;
    if (md.unit == CM_TIME_EPOCH)
        epochs = md.count;
    else if (md.unit == CM_TIME_BATCH && ipe > 0)
        epochs = (md.count + ipe - 1) / ipe;
    else
        return cm_set_error(CM_ERR_UNSUPPORTED, "GyroDropout: its schedule needs max_duration in ep or ba (got %s)",
                            cm_time_unit_name(md.unit));
    return cm_gyro_dropout_set_schedule(root, ipe > 0 ? ipe : 1, epochs > 0 ? epochs : 1);
}

static void alg_free(void *self) { cm_free(self); }

static const cm_algorithm_i gd_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "GyroDropout",
    .match = alg_match,
    .apply = alg_apply,
    .free = alg_free,
};

cm_gyro_dropout_config cm_gyro_dropout_config_default(void) { return (cm_gyro_dropout_config){0.5, 256, 16}; }

cm_status cm_gyro_dropout_new(const cm_gyro_dropout_config *cfg, cm_algorithm_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_gyro_dropout_new: out is NULL");
    cm_status st = check_cfg(cfg);
    if (st) return st;
    gd_self *s = cm_alloc_zeroed(sizeof *s, 16);
    if (!s) return CM_ERR_OOM;
    s->cfg = *cfg;
    *out = (cm_algorithm_plugin){&gd_vt, s};
    return CM_OK;
}

static void cfg_default(void *c) { *(cm_gyro_dropout_config *)c = cm_gyro_dropout_config_default(); }
static cm_status make(const void *c, cm_algorithm_plugin *out) { return cm_gyro_dropout_new(c, out); }

static const cmi_arg k_args[] = {
    {{"p", CM_ALGO_ARG_REAL, "0.5", NULL, 0}, offsetof(cm_gyro_dropout_config, p), false},
    {{"sigma", CM_ALGO_ARG_INT, "256", NULL, 0}, offsetof(cm_gyro_dropout_config, sigma), false},
    {{"tau", CM_ALGO_ARG_INT, "16", NULL, 0}, offsetof(cm_gyro_dropout_config, tau), false},
};

const cmi_algo_entry cmi_gyro_dropout_entry = {
    {"GyroDropout", "gyro_dropout", true, 3}, &gd_vt, sizeof(cm_gyro_dropout_config), cfg_default, k_args, 3, make,
};
