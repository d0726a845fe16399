/* ProgressiveResizing (fast.ai's progressive resizing, Composer's ProgressiveResizing): smaller
 * images early in training, growing to full size before a final fine-tuning stretch. */
#include "plugins/data_algos/da_impl.h"

#include <math.h>
#include <strings.h>

#define TAG_PRESIZE CMI_DA_TAG('P', 'R', 'S', 'Z')

static const char *const mode_names[] = {
#define CM_X_(name, str) str,
    CM_RESIZE_MODE_LIST(CM_X_)
#undef CM_X_
};
_Static_assert(sizeof mode_names / sizeof *mode_names == CM_RESIZE_MODE_COUNT, "resize mode table");

const char *cm_resize_mode_name(cm_resize_mode m) { return (unsigned)m < CM_RESIZE_MODE_COUNT ? mode_names[m] : "?"; }

cm_status cm_resize_mode_parse(const char *s, cm_resize_mode *out) {
    for (int i = 0; s && i < CM_RESIZE_MODE_COUNT; i++)
        if (!strcmp(s, mode_names[i])) {
            *out = (cm_resize_mode)i;
            return CM_OK;
        }
    return cm_set_error(CM_ERR_INVALID_ARG, "mode '%s' is not supported (use 'resize' or 'crop')", s ? s : "(null)");
}

double cm_progressive_resizing_scale(const cm_progressive_resizing_config *c, double e) {
    double frac = 0.0;
    if (e >= c->delay_fraction) {
        const double span = 1.0 - c->finetune_fraction - c->delay_fraction;
        /* a ramp of length 0 is already done (Composer divides by zero there) */
        frac = span > 0 ? fmin((e - c->delay_fraction) / span, 1.0) : 1.0;
    }
    return c->initial_scale + (1.0 - c->initial_scale) * frac;
}

double cm_progressive_resizing_pinned_scale(double scale, int64_t width, int64_t inc) {
    if (inc < 1 || width < 1) return scale;
    /* Python's round() rounds halves to even, as nearbyint in the default rounding mode */
    return nearbyint((double)width * scale / (double)inc) * (double)inc / (double)width;
}

/* ---- resize_batch ---- */

/* torch's nearest source index: floorf(dst·(float)(1/s)), clamped (output = input: identity;
 * output = 2·input: dst >> 1, as torch's shortcuts). */
static void nearest_index(int64_t *idx, int64_t out, int64_t in, double s) {
    const float scale = (float)(1.0 / s);
    for (int64_t i = 0; i < out; i++) {
        int64_t v = out == in ? i : out == 2 * in ? i >> 1 : (int64_t)floorf((float)i * scale);
        idx[i] = v < in - 1 ? v : in - 1;
    }
}

/* t (..., H, W) -> out (..., oh, ow) reading rows ri[] and columns ci[] (any dtype, contiguous). */
static cm_status gather_hw(const cm_tensor *t, const int64_t *ri, int64_t oh, const int64_t *ci, int64_t ow,
                           cm_tensor **out) {
    const int nd = cm_tensor_ndim(t);
    int64_t shape[CM_MAX_DIMS];
    memcpy(shape, cm_tensor_shape(t), sizeof(int64_t) * (size_t)nd);
    const int64_t H = shape[nd - 2], W = shape[nd - 1];
    shape[nd - 2] = oh, shape[nd - 1] = ow;
    cm_status s = cmi_da_new_like(t, nd, shape, out);
    if (s) return s;
    const int64_t lead = H && W ? cm_tensor_numel(t) / (H * W) : 0;
    const size_t es = cm_dtype_size(cm_tensor_dtype(t));
    const char *x = cm_tensor_data(t);
    char *y = cm_tensor_data(*out);
#pragma omp parallel for schedule(static) if (lead * oh * ow > 65536)
    for (int64_t l = 0; l < lead; l++)
        for (int64_t r = 0; r < oh; r++) {
            const char *src = x + (size_t)((l * H + ri[r]) * W) * es;
            char *dst = y + (size_t)((l * oh + r) * ow) * es;
            if (es == 4)
                for (int64_t c = 0; c < ow; c++) ((uint32_t *)dst)[c] = ((const uint32_t *)src)[ci[c]];
            else
                for (int64_t c = 0; c < ow; c++) memcpy(dst + (size_t)c * es, src + (size_t)ci[c] * es, es);
        }
    return CM_OK;
}

static cm_status copy_of(const cm_tensor *t, cm_tensor **out) {
    cm_status s = cmi_da_new_like(t, cm_tensor_ndim(t), cm_tensor_shape(t), out);
    return s ? s : cm_tensor_copy(*out, t);
}

/* Resize or crop t (..., H, W) by scale s; the crop at (top, left) scaled to t's size from the
 * input's (h_in, w_in) as Composer's _make_crop_pair does. */
static cm_status resize_one(const cm_tensor *t, double s, cm_resize_mode mode, int64_t top, int64_t left, int64_t h_in,
                            int64_t w_in, cm_tensor **out) {
    const int64_t H = cm_tensor_dim(t, -2), W = cm_tensor_dim(t, -1);
    int64_t oh, ow;
    if (mode == CM_RESIZE_MODE_RESIZE)
        oh = (int64_t)((double)H * s), ow = (int64_t)((double)W * s);
    else
        oh = (int64_t)(s * (double)H), ow = (int64_t)(s * (double)W);
    char d[96];
    if (oh < 1 || ow < 1)
        return cm_set_error(CM_ERR_SHAPE, "resize_batch: scale %g leaves nothing of %s", s, cmi_da_desc(t, d, sizeof d));
    int64_t *ri = cm_alloc(sizeof(int64_t) * (size_t)(oh + ow), 16);
    if (!ri) return cm_set_error(CM_ERR_OOM, "resize_batch: out of memory");
    int64_t *ci = ri + oh;
    if (mode == CM_RESIZE_MODE_RESIZE) {
        nearest_index(ri, oh, H, s);
        nearest_index(ci, ow, W, s);
    } else {
        const int64_t ty = (int64_t)((double)H / (double)h_in * (double)top);
        const int64_t tx = (int64_t)((double)W / (double)w_in * (double)left);
        for (int64_t i = 0; i < oh; i++) ri[i] = ty + i < H ? ty + i : H - 1;
        for (int64_t i = 0; i < ow; i++) ci[i] = tx + i < W ? tx + i : W - 1;
    }
    cm_status st = gather_hw(t, ri, oh, ci, ow, out);
    cm_free(ri);
    return st;
}

cm_status cm_resize_batch(const cm_tensor *input, const cm_tensor *target, double s, cm_resize_mode mode,
                          bool resize_targets, cm_rng *rng, cm_tensor **out_input, cm_tensor **out_target) {
    if (!input || !out_input || !out_target || (resize_targets && !target) || (mode == CM_RESIZE_MODE_CROP && !rng))
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_resize_batch: NULL input, target (with resize_targets), rng (crop) "
                                                "or outputs");
    *out_input = *out_target = NULL;
    cm_status hs = cmi_da_check_host("cm_resize_batch", input, target, NULL);
    if (hs) return hs;
    char d[96];
    if (cm_tensor_ndim(input) != 4)
        return cm_set_error(CM_ERR_SHAPE, "cm_resize_batch: input %s must be images (N, C, H, W)",
                            cmi_da_desc(input, d, sizeof d));
    if (resize_targets && cm_tensor_ndim(target) <= 2)
        return cm_set_error(CM_ERR_SHAPE, "cm_resize_batch: target %s cannot be resized (resize_targets needs (N, H, W) "
                                          "or (N, C, H, W))",
                            cmi_da_desc(target, d, sizeof d));
    if (!(s > 0) || !isfinite(s) || (unsigned)mode >= CM_RESIZE_MODE_COUNT)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_resize_batch: scale_factor %g must be > 0 and the mode valid", s);
    if (!cm_tensor_is_contiguous(input) || (target && !cm_tensor_is_contiguous(target)))
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_resize_batch: input and target must be contiguous");
    cm_status st;
    if (s >= 1) {
        if ((st = copy_of(input, out_input))) return st;
        if (target && (st = copy_of(target, out_target))) {
            cm_tensor_free(*out_input);
            *out_input = NULL;
        }
        return st;
    }
    const int64_t H = cm_tensor_dim(input, 2), W = cm_tensor_dim(input, 3);
    int64_t top = 0, left = 0;
    if (mode == CM_RESIZE_MODE_CROP) {
        const int64_t hc = (int64_t)(s * (double)H), wc = (int64_t)(s * (double)W);
        top = H - hc > 0 ? cmi_da_randint(rng, 0, H - hc) : 0;
        left = W - wc > 0 ? cmi_da_randint(rng, 0, W - wc) : 0;
    }
    if ((st = resize_one(input, s, mode, top, left, H, W, out_input))) return st;
    if (target) {
        st = resize_targets ? resize_one(target, s, mode, top, left, H, W, out_target) : copy_of(target, out_target);
        if (st) {
            cm_tensor_free(*out_input);
            *out_input = NULL;
        }
    }
    return st;
}

/* ---- the algorithm ---- */

typedef struct {
    cm_progressive_resizing_config cfg;
    char *input_key, *target_key;
    cmi_da_owned owned;
    double last_scale;
    int64_t last_h, last_w;
} presize;

static bool pr_match(void *self, cm_event ev, const cm_state *st) { return ev == CM_EVENT_AFTER_DATALOADER; }

static cm_status pr_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    presize *p = self;
    const char *who = "ProgressiveResizing";
    cmi_da_owned_clear(&p->owned);
    cm_batch *b = cm_state_batch(st);
    if (!b) return cm_set_error(CM_ERR_STATE, "%s: there is no batch", who);
    const int fi = cmi_da_field(b->names, b->n_fields, p->input_key, 0, who, "input_key");
    if (fi < 0) return cm_last_status();
    int ft = -1;
    if (p->cfg.resize_targets && (ft = cmi_da_field(b->names, b->n_fields, p->target_key, 1, who, "target_key")) < 0)
        return cm_last_status();
    cm_tensor *x = b->fields[fi];
    char d[96];
    if (cm_tensor_ndim(x) != 4)
        return cm_set_error(CM_ERR_SHAPE, "%s: input '%s' is %s; ProgressiveResizing resizes images (N, C, H, W)", who,
                            b->names[fi], cmi_da_desc(x, d, sizeof d));
    double e;
    cm_status s = cm_state_elapsed(st, &e);
    if (s) return s;
    const double scale = cm_progressive_resizing_scale(&p->cfg, e);
    const double pinned = cm_progressive_resizing_pinned_scale(scale, cm_tensor_dim(x, 3), p->cfg.size_increment);
    cm_tensor *nx = x;
    if (pinned < 1) {
        if (!(pinned > 0))
            return cm_set_error(CM_ERR_INVALID_ARG, "%s: scale %g pinned to a multiple of size_increment %lld of width "
                                                    "%lld is 0 (lower size_increment or raise initial_scale)",
                                who, scale, (long long)p->cfg.size_increment, (long long)cm_tensor_dim(x, 3));
        cm_rng rng = cmi_da_rng(cm_state_seed(st), TAG_PRESIZE, cm_state_timestamp(st)->batch, 0, 0);
        cm_tensor *ny = NULL;
        s = cm_resize_batch(x, ft >= 0 ? b->fields[ft] : NULL, pinned, p->cfg.mode, p->cfg.resize_targets, &rng, &nx, &ny);
        if (s) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            return cm_set_error(s, "%s: %s", who, msg);
        }
        if ((s = cmi_da_owned_add(&p->owned, nx)) || (s = cmi_da_owned_add(&p->owned, ny))) return s;
        if ((s = cm_state_set_batch_field(st, b->names[fi], nx))) return s;
        if (ft >= 0 && (s = cm_state_set_batch_field(st, b->names[ft], ny))) return s;
    }
    p->last_scale = scale, p->last_h = cm_tensor_dim(nx, 2), p->last_w = cm_tensor_dim(nx, 3);
    const cm_metric_value v[] = {{"progressive_resizing/height", (double)p->last_h},
                                 {"progressive_resizing/width", (double)p->last_w},
                                 {"progressive_resizing/scale_factor", scale}};
    return cm_logger_log_metrics(lg, v, 3);
}

static size_t pr_save(void *self, char *buf, size_t cap) {
    const presize *p = self;
    return (size_t)snprintf(buf, cap, "{\"scale_factor\":%.17g,\"height\":%lld,\"width\":%lld}", p->last_scale,
                            (long long)p->last_h, (long long)p->last_w);
}

static cm_status pr_load(void *self, const char *json, size_t len) {
    presize *p = self;
    static const char *const keys[] = {"scale_factor", "height", "width"};
    double v[3];
    cm_status s = cmi_da_load_numbers("ProgressiveResizing", json, len, keys, v, 3);
    if (!s) p->last_scale = v[0], p->last_h = (int64_t)v[1], p->last_w = (int64_t)v[2];
    return s;
}

static void pr_free(void *self) {
    presize *p = self;
    if (!p) return;
    cmi_da_owned_clear(&p->owned);
    cm_free(p->input_key);
    cm_free(p->target_key);
    cm_free(p);
}

static const cm_algorithm_i presize_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "ProgressiveResizing",
    .match = pr_match,
    .apply = pr_apply,
    .save = pr_save,
    .load = pr_load,
    .free = pr_free,
};

cm_progressive_resizing_config cm_progressive_resizing_config_default(void) {
    return (cm_progressive_resizing_config){CM_RESIZE_MODE_RESIZE, 0.5, 0.2, 0.5, 4, false, NULL, NULL};
}

cm_status cm_progressive_resizing_new(const cm_progressive_resizing_config *cfg, cm_algorithm_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_progressive_resizing_new: out is NULL");
    const cm_progressive_resizing_config c = cfg ? *cfg : cm_progressive_resizing_config_default();
    const char *who = "ProgressiveResizing";
    if ((unsigned)c.mode >= CM_RESIZE_MODE_COUNT)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: mode %d is not supported (resize or crop)", who, (int)c.mode);
    if (!(c.initial_scale >= 0 && c.initial_scale <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: initial_scale must be between 0 and 1: %g", who, c.initial_scale);
    if (!(c.finetune_fraction >= 0 && c.finetune_fraction <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: finetune_fraction must be between 0 and 1: %g", who,
                            c.finetune_fraction);
    if (!(c.delay_fraction >= 0 && c.delay_fraction <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: delay_fraction must be between 0 and 1: %g", who, c.delay_fraction);
    if (!(c.delay_fraction + c.finetune_fraction <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: delay_fraction + finetune_fraction must be at most 1: %g", who,
                            c.delay_fraction + c.finetune_fraction);
    if (c.size_increment < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: size_increment %lld must be >= 1 (1: no alignment)", who,
                            (long long)c.size_increment);
    presize *p = cm_alloc_zeroed(sizeof *p, 16);
    if (!p || !cmi_da_dup_key(c.input_key, &p->input_key) || !cmi_da_dup_key(c.target_key, &p->target_key)) {
        pr_free(p);
        return cm_set_error(CM_ERR_OOM, "%s: out of memory", who);
    }
    p->cfg = c;
    p->cfg.input_key = p->input_key, p->cfg.target_key = p->target_key;
    p->last_scale = 1.0;
    *out = (cm_algorithm_plugin){&presize_vt, p};
    return CM_OK;
}
