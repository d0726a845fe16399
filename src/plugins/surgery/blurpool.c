/* BlurPool (Zhang 2019, Composer's BlurPool): strided convolutions and max pools get a 3×3 binomial
 * low-pass filter, [1 2 1; 2 4 2; 1 2 1] / 16, applied per channel (a depthwise convolution with
 * "same" padding). Module types and state names as Composer's: BlurConv2d (child "conv", buffer
 * "blur_filter" (C, 1, 3, 3)) and BlurMaxPool2d (buffer "filt2d" (1, 1, 3, 3)). */
#include "plugins/surgery/surgery_impl.h"

#include <stdio.h>
#include <string.h>

static const float k_filter[9] = {1 / 16.f, 2 / 16.f, 1 / 16.f, 2 / 16.f, 4 / 16.f, 2 / 16.f, 1 / 16.f, 2 / 16.f, 1 / 16.f};

void cm_blur_filter_default(float *out) { memcpy(out, k_filter, sizeof k_filter); }

static int channel_axis(bool channels_last) { return channels_last ? 3 : 1; }

cm_tensor *cm_blur_2d(cm_tape *tp, cm_tensor *x, cm_tensor *filter, int stride, bool channels_last, bool out_bf16) {
    if (!tp || cm_tape_status(tp) || !x) return NULL;
    if (cm_tensor_ndim(x) != 4) {
        char s[64];
        cm_tape_fail(tp, CM_ERR_SHAPE, "blur_2d: x %s must be 4-d", cm_tensor_shape_str(x, s, sizeof s));
        return NULL;
    }
    if (stride < 1) {
        cm_tape_fail(tp, CM_ERR_INVALID_ARG, "blur_2d: stride %d must be at least 1", stride);
        return NULL;
    }
    const int64_t C = cm_tensor_dim(x, channel_axis(channels_last));
    if (!filter) {
        const int64_t s4[4] = {1, 1, 3, 3};
        filter = cm_empty_on(tp, CM_DEVICE_CPU, CM_DTYPE_F32, 4, s4);
        if (!filter) return NULL;
        memcpy(cm_tensor_data(filter), k_filter, sizeof k_filter);
        filter = cm_to_device(tp, filter, cm_tensor_device(x));
    }
    if (cm_tensor_ndim(filter) != 4 || (cm_tensor_dim(filter, 0) != C && cm_tensor_dim(filter, 0) != 1) ||
        cm_tensor_dim(filter, 1) != 1 || cm_tensor_dim(filter, 2) % 2 == 0 || cm_tensor_dim(filter, 3) % 2 == 0) {
        char s[64];
        cm_tape_fail(tp, CM_ERR_SHAPE, "blur_2d: the filter %s must be (C or 1, 1, kh, kw) with odd kh, kw (C = %lld)",
                     cm_tensor_shape_str(filter, s, sizeof s), (long long)C);
        return NULL;
    }
    const int64_t kh = cm_tensor_dim(filter, 2), kw = cm_tensor_dim(filter, 3);
    /* Composer's dynamic path: a map smaller than the filter (with padding) is returned as is */
    const int64_t H = cm_tensor_dim(x, channels_last ? 1 : 2), W = cm_tensor_dim(x, channels_last ? 2 : 3);
    if (H + 2 * (kh / 2) < kh || W + 2 * (kw / 2) < kw) return x;
    if (cm_tensor_dim(filter, 0) != C) {
        const int64_t e4[4] = {C, 1, kh, kw};
        filter = cm_contiguous(tp, cm_expand(tp, filter, 4, e4));
    }
    cm_conv2d_opts o = cm_conv2d_opts_default();
    o.stride[0] = o.stride[1] = stride;
    o.padding[0] = (int)(kh / 2), o.padding[1] = (int)(kw / 2);
    o.groups = (int)C;
    o.channels_last = channels_last;
    o.out_bf16 = out_bf16;
    return cm_conv2d(tp, x, filter, NULL, &o);
}

cm_tensor *cm_blurmax_pool2d(cm_tape *tp, cm_tensor *x, const cm_pool2d_opts *opts, cm_tensor *filter) {
    if (!tp || cm_tape_status(tp) || !x) return NULL;
    if (!opts) {
        cm_tape_fail(tp, CM_ERR_INVALID_ARG, "blurmax_pool2d: opts is NULL");
        return NULL;
    }
    cm_pool2d_opts o = *opts;
    const int sh = o.stride[0] ? o.stride[0] : o.kernel[0], sw = o.stride[1] ? o.stride[1] : o.kernel[1];
    if (sh != sw) {
        cm_tape_fail(tp, CM_ERR_UNSUPPORTED, "blurmax_pool2d: strides (%d, %d) differ; the blur takes one stride", sh, sw);
        return NULL;
    }
    o.stride[0] = o.stride[1] = 1;
    cm_tensor *m = cm_max_pool2d(tp, x, &o);
    return cm_blur_2d(tp, m, filter, sh, o.channels_last, false);
}

/* ---- BlurConv2d ---- */

typedef struct {
    bool blur_first, channels_last, out_bf16;
    int blur_stride;
    cm_module *conv;
    cm_tensor *blur_filter; /* (C, 1, 3, 3): C = in_channels (blur first) or out_channels */
} blurconv_s;

static cm_tensor *blurconv_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    blurconv_s *s = cm_module_self(m);
    if (s->blur_first) {
        /* the blur writes bf16 for a bf16 input (an activation under autocast): the convolution
         * after it rounds to bf16 anyway */
        const bool bf = cm_tensor_dtype(in[0]) == CM_DTYPE_BF16;
        return cm_module_forward(s->conv, tp, cm_blur_2d(tp, in[0], s->blur_filter, 1, s->channels_last, bf));
    }
    return cm_blur_2d(tp, cm_module_forward(s->conv, tp, in[0]), s->blur_filter, s->blur_stride, s->channels_last,
                      s->out_bf16);
}

static void blurconv_desc(const cm_module *m, char *buf, size_t cap) {
    const blurconv_s *s = cm_module_self(m);
    snprintf(buf, cap, "blur_first=%s, blur_stride=%d", s->blur_first ? "true" : "false", s->blur_stride);
}

static void free_self(void *self) { cm_free(self); }

static const cm_module_i blurconv_vt = {CM_MODULE_ABI, "BlurConv2d", blurconv_fwd, free_self, blurconv_desc};

static cm_status fill_filter(cm_tensor *t, int64_t c) {
    float *d = cm_tensor_data(t);
    for (int64_t i = 0; i < c; i++) memcpy(d + 9 * i, k_filter, sizeof k_filter);
    return CM_OK;
}

/* A BlurConv2d from a Conv2d: the convolution's weights are kept; with blur_first its stride
 * stays (the blur runs at stride 1 before it), else it runs at stride 1 and the blur takes the
 * stride. With blur_first the old module itself becomes the child (adopted: surgery keeps it). */
static cm_status blurconv_from(cm_module *conv, bool blur_first, cm_module **out) {
    cm_nn_conv2d_config cc;
    cm_status st = cm_nn_conv2d_config_of(conv, &cc);
    if (st) return st;
    blurconv_s *s = cm_alloc_zeroed(sizeof *s, 8);
    if (!s) return CM_ERR_OOM;
    if ((st = cm_module_new(&blurconv_vt, s, out))) {
        cm_free(s);
        return st;
    }
    s->blur_first = blur_first;
    s->channels_last = cc.opts.channels_last;
    s->out_bf16 = cc.opts.out_bf16;
    s->blur_stride = blur_first ? 1 : cc.opts.stride[0];
    const int64_t C = blur_first ? cc.in : cc.out, fs[4] = {C, 1, 3, 3};
    cm_module *c = conv;
    if ((st = cm_module_add_buffer(*out, "blur_filter", CM_DTYPE_F32, 4, fs, true, &s->blur_filter))) goto fail;
    fill_filter(s->blur_filter, C);
    if (!blur_first) {
        cm_nn_conv2d_config c1 = cc;
        c1.opts.stride[0] = c1.opts.stride[1] = 1;
        if ((st = cm_nn_conv2d_new(&c1, NULL, &c))) goto fail;
        cm_tensor_copy(cm_module_param(c, "weight"), cm_module_param(conv, "weight"));
        if (cc.bias) cm_tensor_copy(cm_module_param(c, "bias"), cm_module_param(conv, "bias"));
    }
    if ((st = cm_module_add_child(*out, "conv", c, &s->conv))) {
        if (c != conv) cm_module_free(c);
        goto fail;
    }
    return CM_OK;
fail:
    cm_module_free(*out);
    *out = NULL;
    return st;
}

/* ---- BlurMaxPool2d ---- */

typedef struct {
    cm_pool2d_opts o;
    cm_tensor *filt2d; /* (1, 1, 3, 3) */
} blurpool_s;

static cm_tensor *blurpool_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    blurpool_s *s = cm_module_self(m);
    return cm_blurmax_pool2d(tp, in[0], &s->o, s->filt2d);
}

static void blurpool_desc(const cm_module *m, char *buf, size_t cap) {
    const blurpool_s *s = cm_module_self(m);
    snprintf(buf, cap, "kernel_size=(%d, %d), stride=(%d, %d), padding=(%d, %d), ceil_mode=%s", s->o.kernel[0],
             s->o.kernel[1], s->o.stride[0], s->o.stride[1], s->o.padding[0], s->o.padding[1],
             s->o.ceil_mode ? "true" : "false");
}

static const cm_module_i blurpool_vt = {CM_MODULE_ABI, "BlurMaxPool2d", blurpool_fwd, free_self, blurpool_desc};

static cm_status blurpool_from(cm_module *pool, cm_module **out) {
    cm_pool2d_opts o;
    cm_status st = cm_nn_pool2d_opts_of(pool, &o);
    if (st) return st;
    for (int i = 0; i < 2; i++)
        if (!o.stride[i]) o.stride[i] = o.kernel[i];
    if (o.stride[0] != o.stride[1])
        return cm_set_error(CM_ERR_UNSUPPORTED, "BlurPool: a max pool with strides (%d, %d) cannot be blurred with "
                                                "one stride", o.stride[0], o.stride[1]);
    blurpool_s *s = cm_alloc_zeroed(sizeof *s, 8);
    if (!s) return CM_ERR_OOM;
    if ((st = cm_module_new(&blurpool_vt, s, out))) {
        cm_free(s);
        return st;
    }
    s->o = o;
    const int64_t fs[4] = {1, 1, 3, 3};
    if ((st = cm_module_add_buffer(*out, "filt2d", CM_DTYPE_F32, 4, fs, true, &s->filt2d))) {
        cm_module_free(*out);
        *out = NULL;
        return st;
    }
    fill_filter(s->filt2d, 1);
    return CM_OK;
}

bool cmi_blurpool_set_channels_last(cm_module *m, bool on) {
    const cm_module_i *vt = cm_module_vtable(m);
    if (vt == &blurconv_vt)
        ((blurconv_s *)cm_module_self(m))->channels_last = on;
    else if (vt == &blurpool_vt)
        ((blurpool_s *)cm_module_self(m))->o.channels_last = on;
    else
        return false;
    return true;
}

/* ---- the surgery ---- */

typedef struct {
    const cm_blurpool_config *cfg;
    int64_t n_conv, n_pool;
} bp_ctx;

static bool is_type(const cm_module *m, const char *t) { return m && !strcmp(cm_module_type_name(m), t); }

static bool conv_eligible(cm_module *m, const cm_blurpool_config *cfg) {
    cm_nn_conv2d_config cc;
    if (!is_type(m, "Conv2d") || cmi_has_ancestor(m, "BlurConv2d")) return false;
    if (cm_nn_conv2d_config_of(m, &cc)) return false;
    const int stride = cc.opts.stride[0] > cc.opts.stride[1] ? cc.opts.stride[0] : cc.opts.stride[1];
    return stride > 1 && cc.in >= cfg->min_channels;
}

static bool bp_match(cm_module *m, const char *path, void *data) {
    const bp_ctx *c = data;
    return (c->cfg->replace_convs && conv_eligible(m, c->cfg)) || (c->cfg->replace_maxpools && is_type(m, "MaxPool2d"));
}

static cm_status bp_make(cm_module *old, const char *path, void *data, cm_module **out) {
    bp_ctx *c = data;
    if (is_type(old, "MaxPool2d")) {
        cm_status st = blurpool_from(old, out);
        if (!st) c->n_pool++;
        return st;
    }
    cm_nn_conv2d_config cc;
    cm_nn_conv2d_config_of(old, &cc);
    if (c->cfg->blur_first && cc.opts.stride[0] != cc.opts.stride[1]) {
        /* blur_first keeps the conv's strides as they are; the other order needs one stride */
    } else if (!c->cfg->blur_first && cc.opts.stride[0] != cc.opts.stride[1]) {
        return cm_set_error(CM_ERR_UNSUPPORTED, "BlurPool: '%s' has strides (%d, %d); blur_first false needs equal "
                                                "strides", path, cc.opts.stride[0], cc.opts.stride[1]);
    }
    cm_status st = blurconv_from(old, c->cfg->blur_first, out);
    if (!st) c->n_conv++;
    return st;
}

typedef struct {
    const cm_blurpool_config *cfg;
    int64_t eligible, done;
} bp_scan;

static bool bp_scan_visit(cm_module *m, const char *path, int depth, void *data) {
    bp_scan *s = data;
    if (bp_match(m, path, &(bp_ctx){s->cfg, 0, 0})) s->eligible++;
    if (is_type(m, "BlurConv2d") || is_type(m, "BlurMaxPool2d")) s->done++;
    return true;
}

cm_blurpool_config cm_blurpool_config_default(void) { return (cm_blurpool_config){true, true, true, 16}; }

static cm_status check_cfg(const cm_blurpool_config *c) {
    if (!c) return cm_set_error(CM_ERR_INVALID_ARG, "BlurPool: config is NULL");
    if (!c->replace_convs && !c->replace_maxpools)
        return cm_set_error(CM_ERR_INVALID_ARG, "BlurPool: replace_convs and replace_maxpools are both false: it would "
                                                "not change the model (set one of them)");
    if (c->min_channels < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "BlurPool: min_channels %lld must be >= 0", (long long)c->min_channels);
    return CM_OK;
}

cm_status cm_apply_blurpool(cm_module *root, const cm_blurpool_config *cfg, int64_t *n_blurconv, int64_t *n_blurpool) {
    if (n_blurconv) *n_blurconv = 0;
    if (n_blurpool) *n_blurpool = 0;
    cm_status st = check_cfg(cfg);
    if (st) return st;
    if ((st = cmi_surgery_check_unlocked(root, "BlurPool", "cm_apply_blurpool"))) return st;
    bp_scan sc = {cfg, 0, 0};
    cm_module_visit(root, bp_scan_visit, &sc);
    if (!sc.eligible) {
        if (sc.done) return CM_OK; /* applied already */
        char looked[256];
        snprintf(looked, sizeof looked, "%s%s%s", cfg->replace_convs ? "" : "",
                 cfg->replace_convs ? "Conv2d layers with a stride above 1 and at least min_channels input channels"
                                    : "",
                 cfg->replace_maxpools ? (cfg->replace_convs ? " and MaxPool2d layers" : "MaxPool2d layers") : "");
        char hint[96];
        snprintf(hint, sizeof hint, "min_channels is %lld", (long long)cfg->min_channels);
        return cmi_nothing_to_apply(root, "BlurPool", looked, cfg->replace_convs ? hint : "");
    }
    bp_ctx c = {cfg, 0, 0};
    st = cm_module_replace(root, bp_match, bp_make, &c, NULL);
    if (n_blurconv) *n_blurconv = c.n_conv;
    if (n_blurpool) *n_blurpool = c.n_pool;
    if (!st)
        cm_log_msg(CM_LOG_INFO, "BlurPool: applied to %s: %lld BlurConv2d and %lld BlurMaxPool2d layers added",
                   cm_module_type_name(root), (long long)c.n_conv, (long long)c.n_pool);
    return st;
}

/* ---- the algorithm ---- */

typedef struct {
    cm_blurpool_config cfg; /* first: the registry prints it */
} bp_self;

static bool bp_alg_match(void *self, cm_event ev, const cm_state *st) { return ev == CM_EVENT_INIT; }

static cm_status bp_alg_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    bp_self *s = self;
    cm_module *root;
    cm_status r = cmi_state_root(st, "BlurPool", &root);
    if (r) return r;
    int64_t nc, np;
    if ((r = cm_apply_blurpool(root, &s->cfg, &nc, &np))) return r;
    const char *const types[2] = {"BlurConv2d", "BlurMaxPool2d"};
    cm_hparam h[2] = {{"blurpool/num_blurconv_layers", CM_HPARAM_NUMBER, (double)cmi_count_types(root, types, 1), NULL},
                      {"blurpool/num_blurpool_layers", CM_HPARAM_NUMBER, (double)cmi_count_types(root, types + 1, 1),
                       NULL}};
    return cm_logger_log_hyperparameters(lg, h, 2);
}

static void bp_alg_free(void *self) { cm_free(self); }

static const cm_algorithm_i bp_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "BlurPool",
    .match = bp_alg_match,
    .apply = bp_alg_apply,
    .free = bp_alg_free,
};

cm_status cm_blurpool_new(const cm_blurpool_config *cfg, cm_algorithm_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_blurpool_new: out is NULL");
    cm_status st = check_cfg(cfg);
    if (st) return st;
    bp_self *s = cm_alloc_zeroed(sizeof *s, 16);
    if (!s) return CM_ERR_OOM;
    s->cfg = *cfg;
    *out = (cm_algorithm_plugin){&bp_vt, s};
    return CM_OK;
}

static void cfg_default(void *c) { *(cm_blurpool_config *)c = cm_blurpool_config_default(); }
static cm_status make(const void *c, cm_algorithm_plugin *out) { return cm_blurpool_new(c, out); }

static const cmi_arg k_args[] = {
    {{"replace_convs", CM_ALGO_ARG_BOOL, "true", NULL, 0}, offsetof(cm_blurpool_config, replace_convs), false},
    {{"replace_maxpools", CM_ALGO_ARG_BOOL, "true", NULL, 0}, offsetof(cm_blurpool_config, replace_maxpools), false},
    {{"blur_first", CM_ALGO_ARG_BOOL, "true", NULL, 0}, offsetof(cm_blurpool_config, blur_first), false},
    {{"min_channels", CM_ALGO_ARG_INT, "16", NULL, 0}, offsetof(cm_blurpool_config, min_channels), false},
};

const cmi_algo_entry cmi_blurpool_entry = {
    {"BlurPool", "blurpool", true, (int)(sizeof k_args / sizeof *k_args)}, &bp_vt, sizeof(cm_blurpool_config), cfg_default, k_args,
    (int)(sizeof k_args / sizeof *k_args), make,
};
