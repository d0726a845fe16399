/* MixUp (Zhang et al. 2017, Composer's MixUp): convex combinations of pairs of samples and of
 * their targets, per microbatch. Shared with CutMix: the microbatch-level plumbing (fields of the
 * model batch, permuted targets, interpolated loss) in cmi_da_mix_*. */
#include "plugins/data_algos/da_impl.h"
#include "plugins/data_algos/da_mix.h"

#include <math.h>

#define TAG_MIXUP CMI_DA_TAG('M', 'I', 'X', 'U')

double cm_mixup_draw_mixing(double alpha, cm_rng *rng) {
    if (!(alpha > 0)) return 0.0;
    const double z = cm_random_beta(rng, alpha, alpha);
    return fmin(z, 1.0 - z);
}

static cm_status check_perm(const char *who, const int64_t *perm, int64_t n) {
    if (!perm) return cm_set_error(CM_ERR_INVALID_ARG, "%s: perm is NULL", who);
    for (int64_t i = 0; i < n; i++)
        if (perm[i] < 0 || perm[i] >= n)
            return cm_set_error(CM_ERR_INVALID_ARG, "%s: perm[%lld] = %lld is outside [0, %lld)", who, (long long)i,
                                (long long)perm[i], (long long)n);
    return CM_OK;
}

cm_status cmi_da_check_pair(const char *who, const cm_tensor *in, const cm_tensor *out, const int64_t *perm) {
    if (!in || !out) return cm_set_error(CM_ERR_INVALID_ARG, "%s: NULL input or out", who);
    cm_status hs = cmi_da_check_host(who, in, out, NULL);
    if (hs) return hs;
    if (in == out || cm_tensor_data(in) == cm_tensor_data(out))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: input and out are the same memory (use a separate output)", who);
    char a[96], b[96];
    bool same = cm_tensor_ndim(in) == cm_tensor_ndim(out) && cm_tensor_ndim(in) >= 1 &&
                cm_tensor_dtype(in) == cm_tensor_dtype(out);
    for (int d = 0; same && d < cm_tensor_ndim(in); d++) same = cm_tensor_dim(in, d) == cm_tensor_dim(out, d);
    if (!same)
        return cm_set_error(CM_ERR_SHAPE, "%s: input %s and out %s must have one shape (N, ...) and dtype", who,
                            cmi_da_desc(in, a, sizeof a), cmi_da_desc(out, b, sizeof b));
    if (!cm_tensor_is_contiguous(in) || !cm_tensor_is_contiguous(out))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: input and out must be contiguous", who);
    return check_perm(who, perm, cm_tensor_dim(in, 0));
}

cm_status cm_mixup_batch(const cm_tensor *input, const int64_t *perm, double mixing, cm_tensor *out) {
    cm_status s = cmi_da_check_pair("cm_mixup_batch", input, out, perm);
    if (s) return s;
    if (cm_tensor_dtype(input) != CM_DTYPE_F32)
        return cm_set_error(CM_ERR_DTYPE, "cm_mixup_batch: input is %s; mixing needs f32",
                            cm_dtype_name(cm_tensor_dtype(input)));
    const int64_t N = cm_tensor_dim(input, 0), row = N ? cm_tensor_numel(input) / N : 0;
    const float *x = cm_tensor_data(input);
    float *y = cm_tensor_data(out);
    const float a = (float)(1.0 - mixing), b = (float)mixing;
#pragma omp parallel for schedule(static) if (N * row > 65536)
    for (int64_t i = 0; i < N; i++) {
        const float *xi = x + i * row, *xp = x + perm[i] * row;
        float *yi = y + i * row;
        for (int64_t k = 0; k < row; k++) yi[k] = a * xi[k] + b * xp[k];
    }
    return CM_OK;
}

/* ---- the algorithm ---- */

typedef struct {
    double alpha;
    bool interpolate_loss;
    char *input_key, *target_key;
    cmi_da_mix mix;
} mixup;

static bool mu_match(void *self, cm_event ev, const cm_state *st) {
    const mixup *m = self;
    return ev == CM_EVENT_BEFORE_FORWARD || ev == (m->interpolate_loss ? CM_EVENT_BEFORE_BACKWARD : CM_EVENT_BEFORE_LOSS);
}

static cm_status mu_forward(mixup *m, cm_state *st) {
    const char *who = "MixUp";
    cm_tensor *x;
    cm_status s = cmi_da_mix_begin(&m->mix, st, who, m->input_key, m->target_key, &x);
    if (s) return s;
    char d[96];
    if (cm_tensor_dtype(x) != CM_DTYPE_F32)
        return cm_set_error(CM_ERR_DTYPE, "%s: input '%s' is %s; MixUp mixes f32 inputs (images, features), not token "
                                          "ids or raw pixels",
                            who, m->mix.input_name, cmi_da_desc(x, d, sizeof d));
    const cm_timestamp *ts = cm_state_timestamp(st);
    cm_rng rng = cmi_da_rng(cm_state_seed(st), TAG_MIXUP, ts->batch, cm_state_rank(st), cm_state_microbatch_index(st));
    m->mix.weight = 1.0 - cm_mixup_draw_mixing(m->alpha, &rng); /* Composer draws mixing, then the permutation */
    cm_random_permutation(&rng, m->mix.n, m->mix.perm);
    cm_tape *tp = cm_state_tape(st);
    cm_tensor *xc = cm_contiguous(tp, x); /* the output where the input is, whatever the tape's device */
    cm_tensor *y =
        xc ? cm_empty_on(tp, cm_tensor_device(xc), CM_DTYPE_F32, cm_tensor_ndim(x), cm_tensor_shape(x)) : NULL;
    if (!y) return cm_tape_status(tp);
    if ((s = cm_mixup_batch(xc, m->mix.perm, 1.0 - m->mix.weight, y))) return s;
    return cm_state_set_batch_field(st, m->mix.input_name, y);
}

static cm_status mu_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    mixup *m = self;
    if (ev == CM_EVENT_BEFORE_FORWARD) return mu_forward(m, st);
    if (ev == CM_EVENT_BEFORE_LOSS) return cmi_da_mix_targets(&m->mix, st, "MixUp");
    return cmi_da_mix_loss(&m->mix, st, "MixUp");
}

static void mu_free(void *self) {
    mixup *m = self;
    if (!m) return;
    cmi_da_mix_deinit(&m->mix);
    cm_free(m->input_key);
    cm_free(m->target_key);
    cm_free(m);
}

static const cm_algorithm_i mixup_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "MixUp",
    .match = mu_match,
    .apply = mu_apply,
    .free = mu_free,
};

cm_mixup_config cm_mixup_config_default(void) { return (cm_mixup_config){0.2, false, NULL, NULL}; }

cm_status cm_mixup_new(const cm_mixup_config *cfg, cm_algorithm_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_mixup_new: out is NULL");
    const cm_mixup_config c = cfg ? *cfg : cm_mixup_config_default();
    if (!(c.alpha >= 0) || !isfinite(c.alpha))
        return cm_set_error(CM_ERR_INVALID_ARG, "MixUp: alpha %g must be >= 0 and finite (Beta(alpha, alpha))", c.alpha);
    mixup *m = cm_alloc_zeroed(sizeof *m, 16);
    if (!m || !cmi_da_dup_key(c.input_key, &m->input_key) || !cmi_da_dup_key(c.target_key, &m->target_key)) {
        mu_free(m);
        return cm_set_error(CM_ERR_OOM, "MixUp: out of memory");
    }
    m->alpha = c.alpha, m->interpolate_loss = c.interpolate_loss;
    *out = (cm_algorithm_plugin){&mixup_vt, m};
    return CM_OK;
}
