/* ResNets: torchvision's ImageNet trees (BasicBlock / Bottleneck, option-B projection shortcuts)
 * and He et al.'s CIFAR ResNets (3×3 stem, 3 stages, option-A zero-padding shortcuts), one builder
 * for both. Blocks and the root keep their children in slots, so surgery (a conv swapped for
 * another module) changes what the next forward calls. */
#include "zoo/zoo_vision_impl.h"

#include <stdio.h>
#include <string.h>

/* ---- configs and presets ---- */

cm_resnet_config cm_resnet_config_default(void) {
    cm_resnet_config c;
    memset(&c, 0, sizeof c);
    c.block = CM_RESNET_BASIC;
    c.stem = CM_RESNET_STEM_IMAGENET;
    c.shortcut = CM_RESNET_SHORTCUT_B;
    c.n_stages = 4;
    const int layers[4] = {2, 2, 2, 2};
    const int64_t widths[4] = {64, 128, 256, 512};
    memcpy(c.layers, layers, sizeof layers);
    memcpy(c.widths, widths, sizeof widths);
    c.in_channels = 3;
    c.num_classes = 1000;
    c.bn_eps = 1e-5f;
    c.bn_momentum = 0.1f;
    c.random_init = true;
    c.channels_last = true;
    return c;
}

typedef struct {
    const char *name;
    bool cifar;
    cm_resnet_block_kind block;
    int layers[4];
} resnet_preset;

static const resnet_preset k_presets[] = {
    {"resnet18", false, CM_RESNET_BASIC, {2, 2, 2, 2}},       {"resnet34", false, CM_RESNET_BASIC, {3, 4, 6, 3}},
    {"resnet50", false, CM_RESNET_BOTTLENECK, {3, 4, 6, 3}},  {"resnet101", false, CM_RESNET_BOTTLENECK, {3, 4, 23, 3}},
    {"resnet152", false, CM_RESNET_BOTTLENECK, {3, 8, 36, 3}}, {"resnet20", true, CM_RESNET_BASIC, {3, 3, 3, 0}},
    {"resnet32", true, CM_RESNET_BASIC, {5, 5, 5, 0}},        {"resnet44", true, CM_RESNET_BASIC, {7, 7, 7, 0}},
    {"resnet56", true, CM_RESNET_BASIC, {9, 9, 9, 0}},        {"resnet110", true, CM_RESNET_BASIC, {18, 18, 18, 0}},
};
#define N_PRESETS ((int)(sizeof k_presets / sizeof k_presets[0]))

cm_status cm_resnet_config_preset(const char *name, cm_resnet_config *out) {
    const char *names[N_PRESETS];
    for (int i = 0; i < N_PRESETS; i++) names[i] = k_presets[i].name;
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_resnet_config_preset: out is NULL");
    for (int i = 0; name && i < N_PRESETS; i++) {
        const resnet_preset *p = &k_presets[i];
        if (strcmp(name, p->name)) continue;
        cm_resnet_config c = cm_resnet_config_default();
        c.block = p->block;
        memcpy(c.layers, p->layers, sizeof c.layers);
        if (p->cifar) {
            c.stem = CM_RESNET_STEM_CIFAR;
            c.shortcut = CM_RESNET_SHORTCUT_A;
            c.n_stages = 3;
            const int64_t w[4] = {16, 32, 64, 0};
            memcpy(c.widths, w, sizeof w);
            c.num_classes = 10;
        }
        *out = c;
        return CM_OK;
    }
    return cmz_unknown_preset("cm_resnet_config_preset", name, names, N_PRESETS);
}

static cm_status check_config(const char *fn, const cm_resnet_config *c) {
    if (!c) return cm_set_error(CM_ERR_INVALID_ARG, "%s: config is NULL", fn);
    if ((unsigned)c->block > CM_RESNET_BOTTLENECK || (unsigned)c->stem > CM_RESNET_STEM_CIFAR ||
        (unsigned)c->shortcut > CM_RESNET_SHORTCUT_B)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: unknown enum value (block %d, stem %d, shortcut %d)", fn,
                            (int)c->block, (int)c->stem, (int)c->shortcut);
    if (c->n_stages < 1 || c->n_stages > CM_RESNET_MAX_STAGES)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: n_stages %d must be in [1, %d]", fn, c->n_stages,
                            CM_RESNET_MAX_STAGES);
    for (int s = 0; s < c->n_stages; s++)
        if (c->layers[s] < 1 || c->widths[s] < 1)
            return cm_set_error(CM_ERR_INVALID_ARG, "%s: stage %d has %d blocks of width %lld (both must be at least 1)",
                                fn, s + 1, c->layers[s], (long long)c->widths[s]);
    if (c->in_channels < 1 || c->num_classes < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: in_channels %lld and num_classes %lld must be at least 1", fn,
                            (long long)c->in_channels, (long long)c->num_classes);
    if (!(c->bn_eps >= 0) || !(c->bn_momentum >= 0 && c->bn_momentum <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: bn_eps %g must be at least 0 and bn_momentum %g in [0, 1]", fn,
                            c->bn_eps, c->bn_momentum);
    if (c->block == CM_RESNET_BOTTLENECK && c->shortcut == CM_RESNET_SHORTCUT_A)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "%s: option-A (zero-padding) shortcuts are for basic blocks; bottleneck blocks need "
                            "projections (use CM_RESNET_SHORTCUT_B)",
                            fn);
    return CM_OK;
}

/* ---- layers with torchvision's init ---- */

static cm_status make_conv(const cm_resnet_config *c, int64_t in, int64_t out, int k, int stride, cm_rng *rng,
                           cm_module **m) {
    cm_nn_conv2d_config cc = cm_nn_conv2d_config_default(in, out, k, k);
    cc.bias = false;
    cc.opts.stride[0] = cc.opts.stride[1] = stride;
    cc.opts.padding[0] = cc.opts.padding[1] = k / 2;
    cc.opts.channels_last = c->channels_last;
    cc.opts.out_bf16 = true; /* under autocast: bf16 activations into batch norm, as PyTorch's */
    cm_status st = cm_nn_conv2d_new(&cc, NULL, m);
    if (!st && rng) st = cm_tensor_init_kaiming_normal(cm_module_param(*m, "weight"), rng, CM_FAN_OUT, 0.0f);
    return st ? cmz_fail_build(m, st) : CM_OK;
}

static cm_status make_bn(const cm_resnet_config *c, int64_t ch, bool zero_weight, cm_module **m) {
    cm_nn_batch_norm_config bc = cm_nn_batch_norm_config_default();
    bc.eps = c->bn_eps;
    bc.momentum = c->bn_momentum;
    bc.channels_last = c->channels_last;
    cm_status st = cm_nn_batch_norm2d_new(ch, &bc, m);
    if (!st && zero_weight) st = cm_tensor_fill(cm_module_param(*m, "weight"), 0.0);
    return st ? cmz_fail_build(m, st) : CM_OK;
}

/* Adds a freshly made child (or frees it and passes the error on). */
static cm_status adopt(cm_module *parent, const char *name, cm_status made, cm_module **child, cm_module **slot) {
    if (made) return made;
    cm_status st = cm_module_add_child(parent, name, *child, slot);
    if (st) cm_module_free(*child);
    return st;
}

/* ---- blocks ---- */

typedef struct {
    bool bottleneck, channels_last;
    int stride;
    int64_t in, out;         /* channels in and out */
    bool pad_shortcut;       /* option A: subsample and zero-pad instead of downsample */
    cm_module *conv1, *bn1, *conv2, *bn2, *conv3, *bn3, *relu, *downsample;
    /* stochastic depth (cm_resnet_block_set_drop): the mode, the rate and the generator, a
     * Dropout child "stochastic_depth" whose (seed, stream, counter) the trainer seeds, resets per
     * batch and checkpoints like any dropout's */
    cm_resnet_drop_mode drop_mode;
    float drop_rate;
    cm_module *drop_rng;
} block_s;

/* t in f32: under autocast the activations between convolutions are bf16 (the convolutions write
 * bf16 for batch norm, which keeps x's dtype); the few ops that take f32 only get an f32 copy. */
static cm_tensor *as_f32(cm_tape *tp, cm_tensor *t) {
    return t && cm_tensor_dtype(t) != CM_DTYPE_F32 ? cm_cast(tp, t, CM_DTYPE_F32) : t;
}

/* Option A: x[:, :, ::s, ::s] (a strided view) with (out - in) zero channels split around it, in x's
 * dtype (bf16 under autocast: batch norm takes a bf16 residual). */
static cm_tensor *pad_shortcut(cm_tape *tp, const block_s *b, cm_tensor *x) {
    if (!x) return NULL;
    const int ha = b->channels_last ? 1 : 2, axis = b->channels_last ? 3 : 1;
    if (b->stride > 1) {
        x = cm_slice(tp, x, ha, 0, cm_tensor_dim(x, ha), b->stride);
        if (x) x = cm_slice(tp, x, ha + 1, 0, cm_tensor_dim(x, ha + 1), b->stride);
    }
    if (!x || b->out == b->in) return x;
    const int64_t lo = (b->out - b->in) / 2, hi = b->out - b->in - lo;
    int64_t shape[4];
    for (int i = 0; i < 4; i++) shape[i] = cm_tensor_dim(x, i);
    cm_tensor *parts[3];
    int n = 0;
    const cm_dtype dt = cm_tensor_dtype(x);
    if (lo > 0) shape[axis] = lo, parts[n++] = cm_zeros(tp, dt, 4, shape);
    parts[n++] = x;
    shape[axis] = hi, parts[n++] = cm_zeros(tp, dt, 4, shape);
    return cm_concat(tp, parts, n, axis);
}

/* relu(bn(x) + residual) through the block's (or stem's) relu module: fused into one op
 * (cm_nn_batch_norm_add_relu) while that module is a plain ReLU, else bn, add and the module. */
static cm_tensor *bn_add_relu(cm_module *relu, cm_module *bn, cm_tape *tp, cm_tensor *x, cm_tensor *residual) {
    if (strcmp(cm_module_type_name(relu), "ReLU") == 0) return cm_nn_batch_norm_add_relu(bn, tp, x, residual);
    cm_tensor *y = as_f32(tp, cm_module_forward(bn, tp, x));
    return cm_module_forward(relu, tp, residual ? cm_add(tp, y, as_f32(tp, residual)) : y);
}

/* The block with stochastic depth (Huang et al. 2016; Composer's block_stochastic_forward and
 * sample_stochastic_forward). Training, block mode: one draw u per forward; u < drop_rate drops
 * the residual branch: the output is relu(shortcut(x)) with a downsampling shortcut, else x.
 * Training, sample mode: the branch of each row is kept (×1) or dropped (×0) with probability
 * drop_rate, drawn per global row (cm_dropout's row keying), before the shortcut is added. Eval:
 * the branch is scaled by 1 - drop_rate. */
static cm_tensor *block_drop_fwd(cm_module *m, cm_tape *tp, cm_tensor *x) {
    block_s *b = cm_module_self(m);
    cm_rng *rng = cm_nn_dropout_rng(b->drop_rng);
    const bool training = cm_module_is_training(m), project = b->downsample || b->pad_shortcut;
    if (!rng) return cm_tape_fail(tp, CM_ERR_STATE, "stochastic depth without its generator"), NULL;
    if (training && b->drop_mode == CM_RESNET_DROP_BLOCK) {
        float u;
        cm_rng_uniform(rng, &u, 1, 0.0f, 1.0f);
        if (u < b->drop_rate) {
            if (!project) return x;
            cm_tensor *sc = b->downsample ? cm_module_forward(b->downsample, tp, x) : pad_shortcut(tp, b, x);
            return cm_relu(tp, as_f32(tp, sc));
        }
    }
    cm_tensor *h = bn_add_relu(b->relu, b->bn1, tp, cm_module_forward(b->conv1, tp, x), NULL);
    cm_module *last = b->bn2;
    h = cm_module_forward(b->conv2, tp, h);
    if (b->bottleneck) {
        h = cm_module_forward(b->conv3, tp, bn_add_relu(b->relu, b->bn2, tp, h, NULL));
        last = b->bn3;
    }
    cm_tensor *sc = b->downsample ? cm_module_forward(b->downsample, tp, x) : b->pad_shortcut ? pad_shortcut(tp, b, x) : x;
    if (!h || !sc) return NULL;
    if (training && b->drop_mode == CM_RESNET_DROP_BLOCK) return bn_add_relu(b->relu, last, tp, h, sc);
    cm_tensor *y = as_f32(tp, cm_module_forward(last, tp, h)); /* the residual branch */
    if (!training) {
        y = cm_mul_scalar(tp, y, 1.0f - b->drop_rate);
    } else if (b->drop_rate > 0) {
        /* 0/1 per row: dropout of ones gives 0 or 1/(1 - p); the clamp makes the kept rows 1 */
        const int64_t ms[4] = {cm_tensor_dim(x, 0), 1, 1, 1};
        cm_tensor *mask = cm_clamp(tp, cm_dropout(tp, cm_full(tp, CM_DTYPE_F32, 4, ms, 1.0), b->drop_rate, true, rng),
                                   0.0f, 1.0f);
        y = cm_mul(tp, y, mask);
    }
    return cm_module_forward(b->relu, tp, cm_add(tp, y, as_f32(tp, sc)));
}

static cm_tensor *block_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    block_s *b = cm_module_self(m);
    cm_tensor *x = in[0];
    if (b->drop_mode != CM_RESNET_DROP_NONE) return block_drop_fwd(m, tp, x);
    cm_tensor *h = bn_add_relu(b->relu, b->bn1, tp, cm_module_forward(b->conv1, tp, x), NULL);
    cm_module *last = b->bn2;
    h = cm_module_forward(b->conv2, tp, h);
    if (b->bottleneck) {
        h = cm_module_forward(b->conv3, tp, bn_add_relu(b->relu, b->bn2, tp, h, NULL));
        last = b->bn3;
    }
    cm_tensor *sc = b->downsample ? cm_module_forward(b->downsample, tp, x) : b->pad_shortcut ? pad_shortcut(tp, b, x) : x;
    if (!h || !sc) return NULL;
    return bn_add_relu(b->relu, last, tp, h, sc);
}

static void block_desc(const cm_module *m, char *buf, size_t cap) {
    const block_s *b = cm_module_self(m);
    char drop[64] = "";
    if (b->drop_mode != CM_RESNET_DROP_NONE)
        snprintf(drop, sizeof drop, ", stochastic_depth=%s %g", b->drop_mode == CM_RESNET_DROP_BLOCK ? "block" : "sample",
                 b->drop_rate);
    snprintf(buf, cap, "in=%lld, out=%lld, stride=%d%s%s", (long long)b->in, (long long)b->out, b->stride,
             b->pad_shortcut ? ", shortcut=A" : "", drop);
}

static void free_plain(void *self) { cm_free(self); }

static const cm_module_i basic_vt = {CM_MODULE_ABI, "BasicBlock", block_fwd, free_plain, block_desc};
static const cm_module_i bottleneck_vt = {CM_MODULE_ABI, "Bottleneck", block_fwd, free_plain, block_desc};

cm_status cm_resnet_block_new(const cm_resnet_config *cfg, int64_t in_channels, int64_t planes, int stride,
                              cm_rng *rng, cm_module **out) {
    static const char fn[] = "cm_resnet_block_new";
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "%s: out is NULL", fn);
    *out = NULL;
    cm_status st = check_config(fn, cfg);
    if (st) return st;
    const bool bott = cfg->block == CM_RESNET_BOTTLENECK;
    const int64_t out_ch = bott ? 4 * planes : planes;
    if (in_channels < 1 || planes < 1 || (stride != 1 && stride != 2))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: in_channels %lld and planes %lld must be at least 1, stride %d 1 or 2",
                            fn, (long long)in_channels, (long long)planes, stride);
    const bool project = stride != 1 || in_channels != out_ch;
    if (project && cfg->shortcut == CM_RESNET_SHORTCUT_A && out_ch < in_channels)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "%s: an option-A shortcut cannot shrink %lld channels to %lld (use CM_RESNET_SHORTCUT_B)",
                            fn, (long long)in_channels, (long long)out_ch);
    cm_rng *r = cfg->random_init ? rng : NULL;
    block_s *b = cm_alloc_zeroed(sizeof *b, 8);
    if (!b) return CM_ERR_OOM;
    cm_module *m;
    if ((st = cm_module_new(bott ? &bottleneck_vt : &basic_vt, b, &m))) {
        cm_free(b);
        return st;
    }
    b->bottleneck = bott, b->channels_last = cfg->channels_last, b->stride = stride;
    b->in = in_channels, b->out = out_ch;
    b->pad_shortcut = project && cfg->shortcut == CM_RESNET_SHORTCUT_A;
    const bool zi = cfg->zero_init_residual;
    cm_module *c;
    if (bott) {
        /* torchvision v1.5: the stride sits on the 3×3 conv */
        if ((st = adopt(m, "conv1", make_conv(cfg, in_channels, planes, 1, 1, r, &c), &c, &b->conv1)) ||
            (st = adopt(m, "bn1", make_bn(cfg, planes, false, &c), &c, &b->bn1)) ||
            (st = adopt(m, "conv2", make_conv(cfg, planes, planes, 3, stride, r, &c), &c, &b->conv2)) ||
            (st = adopt(m, "bn2", make_bn(cfg, planes, false, &c), &c, &b->bn2)) ||
            (st = adopt(m, "conv3", make_conv(cfg, planes, out_ch, 1, 1, r, &c), &c, &b->conv3)) ||
            (st = adopt(m, "bn3", make_bn(cfg, out_ch, zi, &c), &c, &b->bn3)))
            return cmz_fail_build(&m, st);
    } else {
        if ((st = adopt(m, "conv1", make_conv(cfg, in_channels, planes, 3, stride, r, &c), &c, &b->conv1)) ||
            (st = adopt(m, "bn1", make_bn(cfg, planes, false, &c), &c, &b->bn1)) ||
            (st = adopt(m, "conv2", make_conv(cfg, planes, planes, 3, 1, r, &c), &c, &b->conv2)) ||
            (st = adopt(m, "bn2", make_bn(cfg, planes, zi, &c), &c, &b->bn2)))
            return cmz_fail_build(&m, st);
    }
    if ((st = adopt(m, "relu", cm_nn_activation_new(CM_ACT_RELU, &c), &c, &b->relu))) return cmz_fail_build(&m, st);
    if (project && cfg->shortcut == CM_RESNET_SHORTCUT_B) {
        cm_module *ds, *conv, *bn;
        if ((st = adopt(m, "downsample", cm_nn_sequential_new(&ds), &ds, &b->downsample)) ||
            (st = make_conv(cfg, in_channels, out_ch, 1, stride, r, &conv)) ||
            (st = adopt(ds, "0", CM_OK, &conv, NULL)) || (st = make_bn(cfg, out_ch, false, &bn)) ||
            (st = adopt(ds, "1", CM_OK, &bn, NULL)))
            return cmz_fail_build(&m, st);
    }
    *out = m;
    return CM_OK;
}

/* ---- the network ---- */

typedef struct {
    cm_resnet_config cfg;
    cm_module *conv1, *bn1, *relu, *maxpool, *layers[CM_RESNET_MAX_STAGES], *avgpool, *fc;
} resnet_s;

static cm_tensor *resnet_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    resnet_s *s = cm_module_self(m);
    cm_tensor *x = in[0];
    if (cm_tensor_ndim(x) != 4 || cm_tensor_dim(x, 1) != s->cfg.in_channels) {
        char shape[96] = "(";
        for (int i = 0; i < cm_tensor_ndim(x); i++) {
            size_t l = strlen(shape);
            snprintf(shape + l, sizeof shape - l, "%s%lld", i ? ", " : "", (long long)cm_tensor_dim(x, i));
        }
        cm_tape_fail(tp, CM_ERR_SHAPE, "ResNet: input %s) must be (B, %lld, H, W)", shape,
                     (long long)s->cfg.in_channels);
        return NULL;
    }
    if (s->cfg.channels_last) x = cm_contiguous(tp, cm_permute(tp, x, (const int[]){0, 2, 3, 1}));
    x = bn_add_relu(s->relu, s->bn1, tp, cm_module_forward(s->conv1, tp, x), NULL);
    if (s->maxpool) x = cm_module_forward(s->maxpool, tp, as_f32(tp, x));
    for (int i = 0; i < s->cfg.n_stages; i++) x = cm_module_forward(s->layers[i], tp, x);
    x = cm_module_forward(s->avgpool, tp, as_f32(tp, x)); /* (B, C, 1, 1) or (B, 1, 1, C) */
    if (!x) return NULL;
    x = cm_reshape(tp, x, 2, (const int64_t[]){cm_tensor_dim(x, 0), -1});
    return cm_module_forward(s->fc, tp, x);
}

static void resnet_desc(const cm_module *m, char *buf, size_t cap) {
    const resnet_s *s = cm_module_self(m);
    snprintf(buf, cap, "%s, stem=%s, shortcut=%s, classes=%lld%s",
             s->cfg.block == CM_RESNET_BOTTLENECK ? "bottleneck" : "basic",
             s->cfg.stem == CM_RESNET_STEM_CIFAR ? "cifar" : "imagenet", s->cfg.shortcut == CM_RESNET_SHORTCUT_A ? "A" : "B",
             (long long)s->cfg.num_classes, s->cfg.channels_last ? ", channels_last" : "");
}

static const cm_module_i resnet_vt = {CM_MODULE_ABI, "ResNet", resnet_fwd, free_plain, resnet_desc};

cm_status cm_resnet_new(const cm_resnet_config *cfg, cm_module **out) {
    static const char fn[] = "cm_resnet_new";
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "%s: out is NULL", fn);
    *out = NULL;
    cm_status st = check_config(fn, cfg);
    if (st) return st;
    resnet_s *s = cm_alloc_zeroed(sizeof *s, 8);
    if (!s) return CM_ERR_OOM;
    cm_module *m;
    if ((st = cm_module_new(&resnet_vt, s, &m))) {
        cm_free(s);
        return st;
    }
    s->cfg = *cfg;
    cm_rng rng_state = cm_rng_init(cfg->seed, 0), *rng = cfg->random_init ? &rng_state : NULL;
    const bool cifar = cfg->stem == CM_RESNET_STEM_CIFAR;
    const int64_t stem_w = cfg->widths[0];
    cm_module *c;
    if ((st = adopt(m, "conv1", make_conv(cfg, cfg->in_channels, stem_w, cifar ? 3 : 7, cifar ? 1 : 2, rng, &c), &c,
                    &s->conv1)) ||
        (st = adopt(m, "bn1", make_bn(cfg, stem_w, false, &c), &c, &s->bn1)) ||
        (st = adopt(m, "relu", cm_nn_activation_new(CM_ACT_RELU, &c), &c, &s->relu)))
        return cmz_fail_build(&m, st);
    if (!cifar) {
        cm_pool2d_opts po = cm_pool2d_opts_default(3, 3);
        po.stride[0] = po.stride[1] = 2;
        po.padding[0] = po.padding[1] = 1;
        po.channels_last = cfg->channels_last;
        if ((st = adopt(m, "maxpool", cm_nn_max_pool2d_new(&po, &c), &c, &s->maxpool))) return cmz_fail_build(&m, st);
    }
    int64_t ch = stem_w;
    for (int i = 0; i < cfg->n_stages; i++) {
        char name[16];
        snprintf(name, sizeof name, "layer%d", i + 1);
        cm_module *stage;
        if ((st = adopt(m, name, cm_nn_sequential_new(&stage), &stage, &s->layers[i])))
            return cmz_fail_build(&m, st);
        for (int j = 0; j < cfg->layers[i]; j++) {
            cm_module *blk;
            snprintf(name, sizeof name, "%d", j);
            if ((st = cm_resnet_block_new(cfg, ch, cfg->widths[i], i > 0 && j == 0 ? 2 : 1, rng, &blk)) ||
                (st = adopt(stage, name, CM_OK, &blk, NULL)))
                return cmz_fail_build(&m, st);
            ch = cfg->block == CM_RESNET_BOTTLENECK ? 4 * cfg->widths[i] : cfg->widths[i];
        }
        if ((st = cm_module_set_wrap_unit(stage, NULL))) return cmz_fail_build(&m, st);
    }
    if ((st = adopt(m, "avgpool", cm_nn_adaptive_avg_pool2d_new(1, 1, cfg->channels_last, &c), &c, &s->avgpool)) ||
        (st = adopt(m, "fc", cm_nn_linear_new(ch, cfg->num_classes, true, rng, &c), &c, &s->fc)) ||
        (st = cm_module_set_wrap_unit(s->conv1, "stem")) || (st = cm_module_set_wrap_unit(s->bn1, "stem")) ||
        (st = cm_module_set_wrap_unit(s->fc, "head")))
        return cmz_fail_build(&m, st);
    *out = m;
    return CM_OK;
}

/* ---- stochastic depth ---- */

cm_status cm_resnet_block_set_drop(cm_module *block, cm_resnet_drop_mode mode, float drop_rate) {
    const cm_module_i *vt = block ? cm_module_vtable(block) : NULL;
    if (vt != &basic_vt && vt != &bottleneck_vt)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_resnet_block_set_drop: the module is %s%s, not a BasicBlock or "
                                                "Bottleneck", block ? "a " : "", block ? cm_module_type_name(block) : "NULL");
    if ((unsigned)mode > CM_RESNET_DROP_SAMPLE || !(drop_rate >= 0 && drop_rate <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_resnet_block_set_drop: mode %d must be none, block or sample and "
                                                "drop_rate %g in [0, 1]", (int)mode, drop_rate);
    block_s *b = cm_module_self(block);
    if (mode != CM_RESNET_DROP_NONE && !b->drop_rng) {
        cm_module *d;
        cm_status st = cm_nn_dropout_new(0.0f, &d);
        if (st || (st = adopt(block, "stochastic_depth", CM_OK, &d, &b->drop_rng))) return st;
        /* its stream, as finalize gives one: (0, hash(path)); the trainer reseeds it with its seed */
        char path[512];
        cm_module_path(b->drop_rng, path, sizeof path);
        *cm_nn_dropout_rng(b->drop_rng) = cm_rng_init(0, cm_hash64(path, strlen(path), 0));
    }
    b->drop_mode = mode;
    b->drop_rate = drop_rate;
    return CM_OK;
}

cm_status cm_resnet_block_drop(const cm_module *block, cm_resnet_drop_mode *mode, float *drop_rate) {
    const cm_module_i *vt = block ? cm_module_vtable(block) : NULL;
    if (vt != &basic_vt && vt != &bottleneck_vt)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_resnet_block_drop: the module is %s%s, not a BasicBlock or "
                                                "Bottleneck", block ? "a " : "", block ? cm_module_type_name(block) : "NULL");
    const block_s *b = cm_module_self(block);
    if (mode) *mode = b->drop_mode;
    if (drop_rate) *drop_rate = b->drop_rate;
    return CM_OK;
}

/* ---- switching the layout ---- */

static bool set_layout(cm_module *m, const char *path, int depth, void *data) {
    const bool on = *(const bool *)data;
    const cm_module_i *vt = cm_module_vtable(m);
    if (vt == &basic_vt || vt == &bottleneck_vt)
        ((block_s *)cm_module_self(m))->channels_last = on;
    else if (vt == &resnet_vt)
        ((resnet_s *)cm_module_self(m))->cfg.channels_last = on;
    else {
        static const char *const layered[] = {"Conv2d", "BatchNorm2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d"};
        for (int i = 0; i < 5; i++)
            if (!strcmp(cm_module_type_name(m), layered[i])) cm_nn_set_channels_last(m, on);
    }
    return true;
}

cm_status cm_resnet_set_channels_last(cm_module *net, bool on) {
    if (!net || cm_module_vtable(net) != &resnet_vt)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_resnet_set_channels_last: the module is %s%s, not a ResNet",
                            net ? "a " : "", net ? cm_module_type_name(net) : "NULL");
    cm_module_visit(net, set_layout, &on);
    return CM_OK;
}

bool cm_resnet_is_channels_last(const cm_module *net) {
    return net && cm_module_vtable(net) == &resnet_vt && ((const resnet_s *)cm_module_self(net))->cfg.channels_last;
}

/* ---- FLOPs ---- */

static int64_t conv_out(int64_t h, int k, int s, int p) { return h + 2 * p < k ? 0 : (h + 2 * p - k) / s + 1; }

double cm_resnet_forward_flops(const cm_resnet_config *c, int64_t h, int64_t w) {
    if (!c || h < 1 || w < 1 || c->n_stages < 1 || c->n_stages > CM_RESNET_MAX_STAGES) return 0.0;
    const bool cifar = c->stem == CM_RESNET_STEM_CIFAR, bott = c->block == CM_RESNET_BOTTLENECK;
    double macs = 0;
    int64_t ch = c->widths[0];
    if (cifar) {
        macs += (double)c->in_channels * ch * 9 * h * w;
    } else {
        h = conv_out(h, 7, 2, 3), w = conv_out(w, 7, 2, 3);
        macs += (double)c->in_channels * ch * 49 * h * w;
        h = conv_out(h, 3, 2, 1), w = conv_out(w, 3, 2, 1);
    }
    for (int i = 0; i < c->n_stages; i++) {
        const int64_t p = c->widths[i], o = bott ? 4 * p : p;
        for (int j = 0; j < c->layers[i]; j++) {
            const int s = i > 0 && j == 0 ? 2 : 1;
            const int64_t ho = conv_out(h, 3, s, 1), wo = conv_out(w, 3, s, 1);
            if (bott)
                macs += (double)ch * p * h * w + (double)p * p * 9 * ho * wo + (double)p * o * ho * wo;
            else
                macs += (double)ch * p * 9 * ho * wo + (double)p * p * 9 * ho * wo;
            if ((s != 1 || ch != o) && c->shortcut == CM_RESNET_SHORTCUT_B) macs += (double)ch * o * ho * wo;
            ch = o, h = ho, w = wo;
        }
    }
    if (h < 1 || w < 1) return 0.0;
    macs += (double)ch * c->num_classes;
    return 2.0 * macs;
}

static double flops_cb(const void *cfg, int64_t h, int64_t w) { return cm_resnet_forward_flops(cfg, h, w); }

cm_status cm_resnet_model_new(const cm_resnet_config *cfg, cm_model **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_resnet_model_new: out is NULL");
    *out = NULL;
    cm_module *net;
    cm_status st = cm_resnet_new(cfg, &net);
    if (st) return st;
    return cmz_vision_model_new(net, flops_cb, cfg, sizeof *cfg, out);
}
