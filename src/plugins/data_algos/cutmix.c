/* CutMix (Yun et al. 2019, Composer's CutMix): a box of every image replaced by the same box of a
 * partner image, targets mixed by the box's area, per microbatch. */
#include "plugins/data_algos/da_mix.h"

#include <math.h>

#define TAG_CUTMIX CMI_DA_TAG('C', 'M', 'I', 'X')

double cm_cutmix_draw_lambda(double alpha, cm_rng *rng) { return alpha > 0 ? cm_random_beta(rng, alpha, alpha) : 0.0; }

static int64_t clip64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }
/* Python's a // b for b > 0 */
static int64_t floordiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

cm_bbox cm_cutmix_draw_bbox(int64_t H, int64_t W, double lambda, bool uniform_sampling, cm_rng *rng) {
    /* Composer's _rand_bbox(W=shape[2], H=shape[3]): its "x" runs along dim 2 (our H) */
    const double cut = sqrt(1.0 - lambda);
    const int64_t cut_h = (int64_t)((double)H * cut), cut_w = (int64_t)((double)W * cut);
    int64_t cx, cy;
    if (uniform_sampling) {
        cx = cmi_da_randint(rng, floordiv(-cut_h, 2), H + cut_h / 2);
        cy = cmi_da_randint(rng, floordiv(-cut_w, 2), W + cut_w / 2);
    } else {
        cx = cmi_da_randint(rng, 0, H);
        cy = cmi_da_randint(rng, 0, W);
    }
    return (cm_bbox){clip64(cx - cut_h / 2, 0, H), clip64(cy - cut_w / 2, 0, W), clip64(cx + cut_h / 2, 0, H),
                     clip64(cy + cut_w / 2, 0, W)};
}

double cm_cutmix_adjusted_lambda(int64_t H, int64_t W, cm_bbox b) {
    return 1.0 - (double)((b.x2 - b.x1) * (b.y2 - b.y1)) / (double)(H * W);
}

cm_status cm_cutmix_batch(const cm_tensor *input, const int64_t *perm, cm_bbox box, cm_tensor *out) {
    cm_status s = cmi_da_check_pair("cm_cutmix_batch", input, out, perm);
    if (s) return s;
    char d[96];
    if (cm_tensor_ndim(input) != 4)
        return cm_set_error(CM_ERR_SHAPE, "cm_cutmix_batch: input %s must be images (N, C, H, W)",
                            cmi_da_desc(input, d, sizeof d));
    const int64_t N = cm_tensor_dim(input, 0), C = cm_tensor_dim(input, 1), H = cm_tensor_dim(input, 2),
                  W = cm_tensor_dim(input, 3);
    if (box.x1 < 0 || box.x1 > box.x2 || box.x2 > H || box.y1 < 0 || box.y1 > box.y2 || box.y2 > W)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_cutmix_batch: box rows [%lld, %lld) x columns [%lld, %lld) is not "
                                                "inside the %lld x %lld image",
                            (long long)box.x1, (long long)box.x2, (long long)box.y1, (long long)box.y2, (long long)H,
                            (long long)W);
    const size_t es = cm_dtype_size(cm_tensor_dtype(input)), img = (size_t)(C * H * W) * es;
    const char *x = cm_tensor_data(input);
    char *y = cm_tensor_data(out);
    memcpy(y, x, (size_t)N * img);
    const size_t len = (size_t)(box.y2 - box.y1) * es;
    for (int64_t i = 0; i < N && len; i++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t r = box.x1; r < box.x2; r++) {
                const size_t off = ((size_t)((c * H + r) * W + box.y1)) * es;
                memcpy(y + (size_t)i * img + off, x + (size_t)perm[i] * img + off, len);
            }
    return CM_OK;
}

/* ---- the algorithm ---- */

typedef struct {
    double alpha;
    bool interpolate_loss, uniform_sampling;
    char *input_key, *target_key;
    cmi_da_mix mix;
} cutmix;

static bool cx_match(void *self, cm_event ev, const cm_state *st) {
    const cutmix *m = self;
    return ev == CM_EVENT_BEFORE_FORWARD || ev == (m->interpolate_loss ? CM_EVENT_BEFORE_BACKWARD : CM_EVENT_BEFORE_LOSS);
}

static cm_status cx_forward(cutmix *m, cm_state *st) {
    const char *who = "CutMix";
    cm_tensor *x;
    cm_status s = cmi_da_mix_begin(&m->mix, st, who, m->input_key, m->target_key, &x);
    if (s) return s;
    char d[96];
    if (cm_tensor_ndim(x) != 4)
        return cm_set_error(CM_ERR_SHAPE, "%s: input '%s' is %s; CutMix cuts boxes out of images (N, C, H, W)", who,
                            m->mix.input_name, cmi_da_desc(x, d, sizeof d));
    const cm_timestamp *ts = cm_state_timestamp(st);
    cm_rng rng = cmi_da_rng(cm_state_seed(st), TAG_CUTMIX, ts->batch, cm_state_rank(st), cm_state_microbatch_index(st));
    /* Composer's order: the permutation, lambda, then the box */
    cm_random_permutation(&rng, m->mix.n, m->mix.perm);
    const double lambda = cm_cutmix_draw_lambda(m->alpha, &rng);
    m->mix.H = cm_tensor_dim(x, 2), m->mix.W = cm_tensor_dim(x, 3);
    m->mix.box = cm_cutmix_draw_bbox(m->mix.H, m->mix.W, lambda, m->uniform_sampling, &rng);
    m->mix.weight = cm_cutmix_adjusted_lambda(m->mix.H, m->mix.W, m->mix.box);
    m->mix.has_box = true;
    cm_tape *tp = cm_state_tape(st);
    cm_tensor *xc = cm_contiguous(tp, x); /* the output where the input is, whatever the tape's device */
    cm_tensor *y = xc ? cm_empty_on(tp, cm_tensor_device(xc), cm_tensor_dtype(x), 4, cm_tensor_shape(x)) : NULL;
    if (!y) return cm_tape_status(tp);
    if ((s = cm_cutmix_batch(xc, m->mix.perm, m->mix.box, y))) return s;
    return cm_state_set_batch_field(st, m->mix.input_name, y);
}

static cm_status cx_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    cutmix *m = self;
    if (ev == CM_EVENT_BEFORE_FORWARD) return cx_forward(m, st);
    if (ev == CM_EVENT_BEFORE_LOSS) return cmi_da_mix_targets(&m->mix, st, "CutMix");
    return cmi_da_mix_loss(&m->mix, st, "CutMix");
}

static void cx_free(void *self) {
    cutmix *m = self;
    if (!m) return;
    cmi_da_mix_deinit(&m->mix);
    cm_free(m->input_key);
    cm_free(m->target_key);
    cm_free(m);
}

static const cm_algorithm_i cutmix_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "CutMix",
    .match = cx_match,
    .apply = cx_apply,
    .free = cx_free,
};

cm_cutmix_config cm_cutmix_config_default(void) { return (cm_cutmix_config){1.0, false, false, NULL, NULL}; }

cm_status cm_cutmix_new(const cm_cutmix_config *cfg, cm_algorithm_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_cutmix_new: out is NULL");
    const cm_cutmix_config c = cfg ? *cfg : cm_cutmix_config_default();
    if (!(c.alpha >= 0) || !isfinite(c.alpha))
        return cm_set_error(CM_ERR_INVALID_ARG, "CutMix: alpha %g must be >= 0 and finite (Beta(alpha, alpha))", c.alpha);
    cutmix *m = cm_alloc_zeroed(sizeof *m, 16);
    if (!m || !cmi_da_dup_key(c.input_key, &m->input_key) || !cmi_da_dup_key(c.target_key, &m->target_key)) {
        cx_free(m);
        return cm_set_error(CM_ERR_OOM, "CutMix: out of memory");
    }
    m->alpha = c.alpha, m->interpolate_loss = c.interpolate_loss, m->uniform_sampling = c.uniform_sampling;
    *out = (cm_algorithm_plugin){&cutmix_vt, m};
    return CM_OK;
}
