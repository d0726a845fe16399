/* RandAugment (Cubuk et al. 2019) and AugMix (Hendrycks et al. 2020), Composer's: chains of the
 * Pillow operations of composer/algorithms/utils/augmentation_primitives.py, each drawing its
 * strength from the severity, on u8 images; per sample, keyed by (seed, epoch, dataset index). */
/* Pillow and numpy round every product and sum: no fused multiply-adds here (the compiler would
 * contract a·b + c under -march=native, and a pixel would differ by one in a few hundred). */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "plugins/data_algos/da_impl.h"

#include <composer/datasets.h>
#include <math.h>

#define TAG_RANDAUG CMI_DA_TAG('R', 'A', 'U', 'G')
#define TAG_AUGMIX CMI_DA_TAG('A', 'M', 'I', 'X')

static const char *const op_names[] = {
#define CM_X_(name, str) str,
    CM_AUGMENT_OP_LIST(CM_X_)
#undef CM_X_
};
_Static_assert(sizeof op_names / sizeof *op_names == CM_AUGMENT_OP_COUNT, "augment op table");

static const char *const set_names[] = {
#define CM_X_(name, str) str,
    CM_AUGMENTATION_SET_LIST(CM_X_)
#undef CM_X_
};
_Static_assert(sizeof set_names / sizeof *set_names == CM_AUGMENTATION_SET_COUNT, "augmentation set table");

const char *cm_augment_op_name(cm_augment_op op) { return (unsigned)op < CM_AUGMENT_OP_COUNT ? op_names[op] : "?"; }
const char *cm_augmentation_set_name(cm_augmentation_set s) {
    return (unsigned)s < CM_AUGMENTATION_SET_COUNT ? set_names[s] : "?";
}

cm_status cm_augmentation_set_parse(const char *s, cm_augmentation_set *out) {
    for (int i = 0; s && i < CM_AUGMENTATION_SET_COUNT; i++)
        if (!strcmp(s, set_names[i])) {
            *out = (cm_augmentation_set)i;
            return CM_OK;
        }
    return cm_set_error(CM_ERR_INVALID_ARG, "augmentation_set '%s' is not one of all, safe, original", s ? s : "(null)");
}

int cm_augmentation_set_ops(cm_augmentation_set set, cm_augment_op *ops) {
    /* Composer's augmentation_sets: 'safe' leaves out what ImageNet-C / CIFAR-10-C test; 'original'
     * has the _original enhancements of google-research/augmix */
    static const cm_augment_op all[] = {CM_AUGMENT_AUTOCONTRAST, CM_AUGMENT_EQUALIZE,    CM_AUGMENT_POSTERIZE,
                                        CM_AUGMENT_ROTATE,       CM_AUGMENT_SOLARIZE,    CM_AUGMENT_SHEAR_X,
                                        CM_AUGMENT_SHEAR_Y,      CM_AUGMENT_TRANSLATE_X, CM_AUGMENT_TRANSLATE_Y,
                                        CM_AUGMENT_COLOR,        CM_AUGMENT_CONTRAST,    CM_AUGMENT_BRIGHTNESS,
                                        CM_AUGMENT_SHARPNESS};
    static const cm_augment_op orig[] = {CM_AUGMENT_COLOR_ORIGINAL, CM_AUGMENT_CONTRAST_ORIGINAL,
                                         CM_AUGMENT_BRIGHTNESS_ORIGINAL, CM_AUGMENT_SHARPNESS_ORIGINAL};
    int n = 0;
    if ((unsigned)set >= CM_AUGMENTATION_SET_COUNT) return 0;
    for (int i = 0; i < 9; i++) ops[n++] = all[i];
    if (set == CM_AUGMENTATION_SET_ALL)
        for (int i = 9; i < 13; i++) ops[n++] = all[i];
    if (set == CM_AUGMENTATION_SET_ORIGINAL)
        for (int i = 0; i < 4; i++) ops[n++] = orig[i];
    return n;
}

/* ---- Composer's level sampling ---- */

static double uniform(cm_rng *rng, double lo, double hi) { return lo + (hi - lo) * cmi_da_u01(rng); }
/* _sample_level: uniform(0.1, n) */
static double sample_level(cm_rng *rng, double n) { return uniform(rng, 0.1, n); }
/* _int_parameter / _float_parameter */
static int64_t int_parameter(double level, double maxval) { return (int64_t)(level * maxval / 10.0); }
static double float_parameter(double level, double maxval) { return level * maxval / 10.0; }
/* _symmetric_sample: uniform over [1, level] or [1 - 0.09·level, 1], each half the time */
static double symmetric_sample(cm_rng *rng, double level) {
    if (cmi_da_u01(rng) > 0.5) return uniform(rng, 1.0, level);
    return uniform(rng, 1.0 - 0.09 * level, 1.0);
}

cm_status cm_augment_op_apply(cm_augment_op op, double severity, cm_rng *rng, const uint8_t *in, int64_t C, int64_t H,
                              int64_t W, uint8_t *out) {
    if (!rng) return cm_set_error(CM_ERR_INVALID_ARG, "augment op: NULL generator");
    switch (op) {
    case CM_AUGMENT_AUTOCONTRAST: return cm_pil_autocontrast(in, C, H, W, out);
    case CM_AUGMENT_EQUALIZE: return cm_pil_equalize(in, C, H, W, out);
    case CM_AUGMENT_POSTERIZE:
        return cm_pil_posterize(in, C, H, W, (int)(4 - int_parameter(sample_level(rng, severity), 4)), out);
    case CM_AUGMENT_ROTATE: {
        int64_t deg = int_parameter(sample_level(rng, severity), 30);
        if (cmi_da_u01(rng) > 0.5) deg = -deg;
        return cm_pil_rotate(in, C, H, W, (double)deg, out);
    }
    case CM_AUGMENT_SOLARIZE:
        return cm_pil_solarize(in, C, H, W, (int)(256 - int_parameter(sample_level(rng, severity), 256)), out);
    case CM_AUGMENT_SHEAR_X:
    case CM_AUGMENT_SHEAR_Y: {
        double level = float_parameter(sample_level(rng, severity), 0.3);
        if (cmi_da_u01(rng) > 0.5) level = -level;
        const double a[6] = {1, op == CM_AUGMENT_SHEAR_X ? level : 0, 0, op == CM_AUGMENT_SHEAR_Y ? level : 0, 1, 0};
        return cm_pil_affine(in, C, H, W, a, out);
    }
    case CM_AUGMENT_TRANSLATE_X:
    case CM_AUGMENT_TRANSLATE_Y: {
        const bool x = op == CM_AUGMENT_TRANSLATE_X;
        int64_t level = int_parameter(sample_level(rng, severity), (double)(x ? W : H) / 3.0);
        if (cmi_da_u01(rng) > 0.5) level = -level;
        const double a[6] = {1, 0, x ? (double)level : 0, 0, 1, x ? 0 : (double)level};
        return cm_pil_affine(in, C, H, W, a, out);
    }
    case CM_AUGMENT_COLOR: return cm_pil_color(in, C, H, W, symmetric_sample(rng, severity), out);
    case CM_AUGMENT_CONTRAST: return cm_pil_contrast(in, C, H, W, symmetric_sample(rng, severity), out);
    case CM_AUGMENT_BRIGHTNESS: {
        double f = symmetric_sample(rng, severity);
        if (f > 1) f *= 0.75;
        return cm_pil_brightness(in, C, H, W, f, out);
    }
    case CM_AUGMENT_SHARPNESS: return cm_pil_sharpness(in, C, H, W, symmetric_sample(rng, severity), out);
    case CM_AUGMENT_COLOR_ORIGINAL:
        return cm_pil_color(in, C, H, W, float_parameter(sample_level(rng, severity), 1.8) + 0.1, out);
    case CM_AUGMENT_CONTRAST_ORIGINAL:
        return cm_pil_contrast(in, C, H, W, float_parameter(sample_level(rng, severity), 1.8) + 0.1, out);
    case CM_AUGMENT_BRIGHTNESS_ORIGINAL:
        return cm_pil_brightness(in, C, H, W, float_parameter(sample_level(rng, severity), 1.8) + 0.1, out);
    case CM_AUGMENT_SHARPNESS_ORIGINAL:
        return cm_pil_sharpness(in, C, H, W, float_parameter(sample_level(rng, severity), 1.8) + 0.1, out);
    default: return cm_set_error(CM_ERR_INVALID_ARG, "augment op %d is not valid", (int)op);
    }
}

/* One chain of `depth` random operations of the set from `in` into `out` (tmp: room for one image). */
static cm_status chain(cm_augmentation_set set, int depth, double severity, cm_rng *rng, const uint8_t *in, int64_t C,
                       int64_t H, int64_t W, uint8_t *out, uint8_t *tmp) {
    cm_augment_op ops[CM_AUGMENT_OP_COUNT];
    const int n = cm_augmentation_set_ops(set, ops);
    const size_t bytes = (size_t)(C * H * W);
    memcpy(out, in, bytes);
    for (int d = 0; d < depth; d++) {
        const cm_augment_op op = ops[cmi_da_randint(rng, 0, n)]; /* np.random.choice(augmentation_set) */
        memcpy(tmp, out, bytes);
        cm_status s = cm_augment_op_apply(op, severity, rng, tmp, C, H, W, out);
        if (s) return s;
    }
    return CM_OK;
}

static cm_status check_image(const char *who, const uint8_t *in, int64_t C, int64_t H, int64_t W, const uint8_t *out) {
    if (!in || !out) return cm_set_error(CM_ERR_INVALID_ARG, "%s: NULL image", who);
    if ((C != 1 && C != 3) || H < 1 || W < 1)
        return cm_set_error(CM_ERR_SHAPE, "%s: the image is (%lld, %lld, %lld); it augments u8 images (C, H, W) with C = 1 "
                                          "or 3",
                            who, (long long)C, (long long)H, (long long)W);
    return CM_OK;
}

/* ---- RandAugment ---- */

cm_randaugment_config cm_randaugment_config_default(void) { return (cm_randaugment_config){9, 2, CM_AUGMENTATION_SET_ALL}; }

static cm_status ra_check(const cm_randaugment_config *c) {
    if (c->severity < 0 || c->severity > 10)
        return cm_set_error(CM_ERR_INVALID_ARG, "RandAugment: severity %d must satisfy 0 <= severity <= 10", c->severity);
    if (c->depth < 0) return cm_set_error(CM_ERR_INVALID_ARG, "RandAugment: depth %d must be >= 0", c->depth);
    if ((unsigned)c->augmentation_set >= CM_AUGMENTATION_SET_COUNT)
        return cm_set_error(CM_ERR_INVALID_ARG, "RandAugment: augmentation_set %d is not all, safe or original",
                            (int)c->augmentation_set);
    return CM_OK;
}

cm_status cm_randaugment_image(const cm_randaugment_config *cfg, cm_rng *rng, const uint8_t *in, int64_t C, int64_t H,
                               int64_t W, uint8_t *out) {
    const cm_randaugment_config c = cfg ? *cfg : cm_randaugment_config_default();
    cm_status s = check_image("randaugment_image", in, C, H, W, out);
    if (!s) s = ra_check(&c);
    if (s) return s;
    if (!rng) return cm_set_error(CM_ERR_INVALID_ARG, "randaugment_image: NULL generator");
    const size_t n = (size_t)(C * H * W);
    uint8_t *orig = cm_alloc(2 * n, 16); /* a copy of the input (out may be in) and a scratch image */
    if (!orig) return cm_set_error(CM_ERR_OOM, "randaugment_image: out of memory");
    memcpy(orig, in, n);
    s = chain(c.augmentation_set, c.depth, (double)c.severity, rng, orig, C, H, W, out, orig + n);
    cm_free(orig);
    return s;
}

/* ---- AugMix ---- */

cm_augmix_config cm_augmix_config_default(void) { return (cm_augmix_config){3, -1, 3, 1.0, CM_AUGMENTATION_SET_ALL}; }

static cm_status am_check(const cm_augmix_config *c) {
    if (c->severity < 0 || c->severity > 10)
        return cm_set_error(CM_ERR_INVALID_ARG, "AugMix: severity %d must satisfy 0 <= severity <= 10", c->severity);
    if (c->width < 1) return cm_set_error(CM_ERR_INVALID_ARG, "AugMix: width %d must be >= 1", c->width);
    if (!(c->alpha > 0) || !isfinite(c->alpha))
        return cm_set_error(CM_ERR_INVALID_ARG, "AugMix: alpha %g must be > 0 (Dirichlet and Beta parameters)", c->alpha);
    if ((unsigned)c->augmentation_set >= CM_AUGMENTATION_SET_COUNT)
        return cm_set_error(CM_ERR_INVALID_ARG, "AugMix: augmentation_set %d is not all, safe or original",
                            (int)c->augmentation_set);
    return CM_OK;
}

cm_status cm_augmix_combine(const uint8_t *in, const uint8_t *const *chains, const float *weights, int width,
                            float mixing, int64_t n, uint8_t *out) {
    if (!in || !chains || !weights || !out || width < 1 || n < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "augmix_combine: NULL arguments or width %d < 1", width);
    /* numpy in f32: comb = Σ w_i·chain_i; mixed = (1 - m)·img + m·comb; np.uint8 truncates */
    const float a = 1.0f - mixing;
    for (int64_t k = 0; k < n; k++) {
        float comb = 0.0f;
        for (int i = 0; i < width; i++) comb += weights[i] * (float)chains[i][k];
        const float v = a * (float)in[k] + mixing * comb;
        out[k] = (uint8_t)(v <= 0.0f ? 0 : v >= 255.0f ? 255 : v);
    }
    return CM_OK;
}

cm_status cm_augmix_image(const cm_augmix_config *cfg, cm_rng *rng, const uint8_t *in, int64_t C, int64_t H, int64_t W,
                          uint8_t *out) {
    const cm_augmix_config c = cfg ? *cfg : cm_augmix_config_default();
    cm_status s = check_image("augmix_image", in, C, H, W, out);
    if (!s) s = am_check(&c);
    if (s) return s;
    if (!rng) return cm_set_error(CM_ERR_INVALID_ARG, "augmix_image: NULL generator");
    const int64_t n = C * H * W;
    uint8_t *buf = cm_alloc((size_t)(n * (c.width + 2)), 16);
    float *w = cm_alloc(sizeof(float) * (size_t)c.width, 16);
    const uint8_t **chains = cm_alloc(sizeof(*chains) * (size_t)c.width, 16);
    if (!buf || !w || !chains) {
        cm_free(buf), cm_free(w), cm_free(chains);
        return cm_set_error(CM_ERR_OOM, "augmix_image: out of memory");
    }
    uint8_t *orig = buf + n * c.width, *tmp = orig + n;
    memcpy(orig, in, (size_t)n); /* in may be out */
    /* chain_weights ~ Dirichlet([alpha]·width) — Gamma(alpha) draws normalised — and mixing_weight
     * ~ Beta(alpha, alpha), both rounded to f32 as Composer's astype(np.float32) */
    double total = 0;
    for (int i = 0; i < c.width; i++) {
        const double gi = cmi_da_gamma(rng, c.alpha);
        w[i] = (float)gi;
        total += gi;
    }
    for (int i = 0; i < c.width; i++) w[i] = total > 0 ? (float)((double)w[i] / total) : 1.0f / (float)c.width;
    const float mixing = (float)cm_random_beta(rng, c.alpha, c.alpha);
    for (int i = 0; i < c.width && !s; i++) {
        const int d = c.depth > 0 ? c.depth : (int)cmi_da_randint(rng, 1, 4);
        s = chain(c.augmentation_set, d, (double)c.severity, rng, orig, C, H, W, buf + n * i, tmp);
        chains[i] = buf + n * i;
    }
    if (!s) s = cm_augmix_combine(orig, chains, w, c.width, mixing, n, out);
    cm_free(buf), cm_free(w), cm_free(chains);
    return s;
}

/* ---- the dataset form ---- */

cm_status cm_randaugment_transform(uint8_t *img, int64_t C, int64_t H, int64_t W, uint64_t seed, int64_t epoch,
                                   int64_t index, const void *data) {
    cm_rng rng = cmi_da_rng(seed, TAG_RANDAUG, epoch, index, 0);
    return cm_randaugment_image(data, &rng, img, C, H, W, img);
}

cm_status cm_augmix_transform(uint8_t *img, int64_t C, int64_t H, int64_t W, uint64_t seed, int64_t epoch,
                              int64_t index, const void *data) {
    cm_rng rng = cmi_da_rng(seed, TAG_AUGMIX, epoch, index, 0);
    return cm_augmix_image(data, &rng, img, C, H, W, img);
}

/* ---- the plugins ---- */

typedef struct {
    bool augmix;
    cm_randaugment_config ra;
    cm_augmix_config am;
    char *input_key;
    cmi_da_owned owned;
} augment_plugin;

static bool ap_match(void *self, cm_event ev, const cm_state *st) { return ev == CM_EVENT_AFTER_DATALOADER; }

static cm_status ap_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    augment_plugin *a = self;
    const char *who = a->augmix ? "AugMix" : "RandAugment";
    cmi_da_owned_clear(&a->owned);
    cm_batch *b = cm_state_batch(st);
    if (!b) return cm_set_error(CM_ERR_STATE, "%s: there is no batch", who);
    const int f = cmi_da_field(b->names, b->n_fields, a->input_key, 0, who, "input_key");
    if (f < 0) return cm_last_status();
    cm_tensor *x = b->fields[f], *y;
    char d[96];
    if (cm_tensor_ndim(x) != 4 || cm_tensor_dtype(x) != CM_DTYPE_U8 || (cm_tensor_dim(x, 1) != 1 && cm_tensor_dim(x, 1) != 3))
        return cm_set_error(cm_tensor_dtype(x) != CM_DTYPE_U8 ? CM_ERR_DTYPE : CM_ERR_SHAPE,
                            "%s: input '%s' is %s; %s augments u8 images (N, C, H, W) with C = 1 or 3 before "
                            "normalisation: give the dataset's augment.u8_transform cm_%s_transform (what `composer "
                            "train` does), or train on raw_u8 pixels",
                            who, b->names[f], cmi_da_desc(x, d, sizeof d), who, a->augmix ? "augmix" : "randaugment");
    cm_status s = cmi_da_new_like(x, 4, cm_tensor_shape(x), &y);
    if (s || (s = cmi_da_owned_add(&a->owned, y)) || (s = cm_tensor_copy(y, x))) return s;
    const int64_t N = cm_tensor_dim(x, 0), C = cm_tensor_dim(x, 1), H = cm_tensor_dim(x, 2), W = cm_tensor_dim(x, 3);
    uint8_t *p = cm_tensor_data(y);
    for (int64_t i = 0; i < N && !s; i++) {
        const int64_t index = b->indices && b->indices[i] >= 0 ? b->indices[i] : b->position + b->rank_offset + i;
        s = a->augmix ? cm_augmix_transform(p + i * C * H * W, C, H, W, cm_state_seed(st), b->epoch, index, &a->am)
                      : cm_randaugment_transform(p + i * C * H * W, C, H, W, cm_state_seed(st), b->epoch, index, &a->ra);
    }
    return s ? s : cm_state_set_batch_field(st, b->names[f], y);
}

static void ap_free(void *self) {
    augment_plugin *a = self;
    if (!a) return;
    cmi_da_owned_clear(&a->owned);
    cm_free(a->input_key);
    cm_free(a);
}

static const cm_algorithm_i randaugment_vt = {
    .abi = CM_ALGORITHM_ABI, .name = "RandAugment", .match = ap_match, .apply = ap_apply, .free = ap_free};
static const cm_algorithm_i augmix_vt = {
    .abi = CM_ALGORITHM_ABI, .name = "AugMix", .match = ap_match, .apply = ap_apply, .free = ap_free};

static cm_status plugin_new(bool augmix, const void *cfg, const char *input_key, cm_algorithm_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "%s: out is NULL", augmix ? "cm_augmix_new" : "cm_randaugment_new");
    augment_plugin *a = cm_alloc_zeroed(sizeof *a, 16);
    if (!a || !cmi_da_dup_key(input_key, &a->input_key)) {
        ap_free(a);
        return cm_set_error(CM_ERR_OOM, "%s: out of memory", augmix ? "AugMix" : "RandAugment");
    }
    a->augmix = augmix;
    a->ra = augmix || !cfg ? cm_randaugment_config_default() : *(const cm_randaugment_config *)cfg;
    a->am = !augmix || !cfg ? cm_augmix_config_default() : *(const cm_augmix_config *)cfg;
    cm_status s = augmix ? am_check(&a->am) : ra_check(&a->ra);
    if (s) {
        ap_free(a);
        return s;
    }
    *out = (cm_algorithm_plugin){augmix ? &augmix_vt : &randaugment_vt, a};
    return CM_OK;
}

cm_status cm_randaugment_new(const cm_randaugment_config *cfg, const char *input_key, cm_algorithm_plugin *out) {
    return plugin_new(false, cfg, input_key, out);
}

cm_status cm_augmix_new(const cm_augmix_config *cfg, const char *input_key, cm_algorithm_plugin *out) {
    return plugin_new(true, cfg, input_key, out);
}
