/* CutOut (DeVries and Taylor 2017, Composer's CutOut): square holes zeroed in every image of the
 * batch, the same holes for the whole batch. */
#include "plugins/data_algos/da_impl.h"

#include <math.h>

#define TAG_CUTOUT CMI_DA_TAG('C', 'O', 'U', 'T')

static int64_t clip64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }
static int64_t floordiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

cm_status cm_cutout_batch(cm_tensor *input, int num_holes, double length, bool uniform_sampling, cm_rng *rng) {
    if (!input || !rng) return cm_set_error(CM_ERR_INVALID_ARG, "cm_cutout_batch: NULL input or rng");
    cm_status hs = cmi_da_check_host("cm_cutout_batch", input, NULL);
    if (hs) return hs;
    char d[96];
    if (cm_tensor_ndim(input) < 2)
        return cm_set_error(CM_ERR_SHAPE, "cm_cutout_batch: input %s must be images (..., H, W)",
                            cmi_da_desc(input, d, sizeof d));
    if (!cm_tensor_is_contiguous(input)) return cm_set_error(CM_ERR_INVALID_ARG, "cm_cutout_batch: input must be contiguous");
    if (num_holes < 0 || !(length >= 0 && length <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_cutout_batch: num_holes %d must be >= 0 and length %g in [0, 1]",
                            num_holes, length);
    const int64_t H = cm_tensor_dim(input, -2), W = cm_tensor_dim(input, -1);
    if (H < 1 || W < 1) return CM_OK;
    const int64_t L = (int64_t)((double)(H < W ? H : W) * length), lead = cm_tensor_numel(input) / (H * W);
    const size_t es = cm_dtype_size(cm_tensor_dtype(input));
    char *x = cm_tensor_data(input);
    for (int h = 0; h < num_holes; h++) {
        int64_t y, xc;
        if (uniform_sampling) {
            y = cmi_da_randint(rng, floordiv(-L, 2), H + L / 2);
            xc = cmi_da_randint(rng, floordiv(-L, 2), W + L / 2);
        } else {
            y = cmi_da_randint(rng, 0, H);
            xc = cmi_da_randint(rng, 0, W);
        }
        const int64_t y1 = clip64(y - L / 2, 0, H), y2 = clip64(y + L / 2, 0, H);
        const int64_t x1 = clip64(xc - L / 2, 0, W), x2 = clip64(xc + L / 2, 0, W);
        if (x2 <= x1) continue;
        for (int64_t l = 0; l < lead; l++)
            for (int64_t r = y1; r < y2; r++) memset(x + ((size_t)((l * H + r) * W + x1)) * es, 0, (size_t)(x2 - x1) * es);
    }
    return CM_OK;
}

typedef struct {
    int num_holes;
    double length;
    bool uniform_sampling;
    char *input_key;
    cmi_da_owned owned;
} cutout;

static bool co_match(void *self, cm_event ev, const cm_state *st) { return ev == CM_EVENT_AFTER_DATALOADER; }

static cm_status co_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    cutout *c = self;
    const char *who = "CutOut";
    cmi_da_owned_clear(&c->owned);
    cm_batch *b = cm_state_batch(st);
    if (!b) return cm_set_error(CM_ERR_STATE, "%s: there is no batch", who);
    const int f = cmi_da_field(b->names, b->n_fields, c->input_key, 0, who, "input_key");
    if (f < 0) return cm_last_status();
    cm_tensor *x = b->fields[f], *y;
    char d[96];
    if (cm_tensor_ndim(x) != 3 && cm_tensor_ndim(x) != 4)
        return cm_set_error(CM_ERR_SHAPE, "%s: input '%s' is %s; CutOut cuts holes in images (N, C, H, W) or (N, H, W)",
                            who, b->names[f], cmi_da_desc(x, d, sizeof d));
    /* a copy: the loader's tensors are never written */
    cm_status s = cmi_da_new_like(x, cm_tensor_ndim(x), cm_tensor_shape(x), &y);
    if (s) return s;
    if ((s = cmi_da_owned_add(&c->owned, y))) return s;
    if ((s = cm_tensor_copy(y, x))) return s;
    /* the same holes on every rank: keyed by the batch alone */
    cm_rng rng = cmi_da_rng(cm_state_seed(st), TAG_CUTOUT, cm_state_timestamp(st)->batch, 0, 0);
    if ((s = cm_cutout_batch(y, c->num_holes, c->length, c->uniform_sampling, &rng))) return s;
    return cm_state_set_batch_field(st, b->names[f], y);
}

static void co_free(void *self) {
    cutout *c = self;
    if (!c) return;
    cmi_da_owned_clear(&c->owned);
    cm_free(c->input_key);
    cm_free(c);
}

static const cm_algorithm_i cutout_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "CutOut",
    .match = co_match,
    .apply = co_apply,
    .free = co_free,
};

cm_cutout_config cm_cutout_config_default(void) { return (cm_cutout_config){1, 0.5, false, NULL}; }

cm_status cm_cutout_new(const cm_cutout_config *cfg, cm_algorithm_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_cutout_new: out is NULL");
    const cm_cutout_config c = cfg ? *cfg : cm_cutout_config_default();
    if (c.num_holes < 0) return cm_set_error(CM_ERR_INVALID_ARG, "CutOut: num_holes %d must be >= 0", c.num_holes);
    if (!(c.length >= 0 && c.length <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "CutOut: length %g must be in [0, 1] (the side as a fraction of "
                                                "min(H, W))",
                            c.length);
    cutout *p = cm_alloc_zeroed(sizeof *p, 16);
    if (!p || !cmi_da_dup_key(c.input_key, &p->input_key)) {
        co_free(p);
        return cm_set_error(CM_ERR_OOM, "CutOut: out of memory");
    }
    p->num_holes = c.num_holes, p->length = c.length, p->uniform_sampling = c.uniform_sampling;
    *out = (cm_algorithm_plugin){&cutout_vt, p};
    return CM_OK;
}
