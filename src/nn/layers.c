/* The basic layers: Linear/Conv1D, Embedding, norms, Conv2d, pooling, Flatten, Dropout,
 * activations, Sequential and ModuleList. Each is a small state struct, a forward over the tensor
 * ops, and a constructor that registers parameters and buffers by their PyTorch names. */
#include "nn/nn_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Allocates a zeroed state struct and wraps it in a module. */
static cm_status new_mod(const cm_module_i *vt, size_t bytes, void **self, cm_module **out) {
    *out = NULL;
    *self = cm_alloc_zeroed(bytes ? bytes : 1, 8);
    if (!*self) return CM_ERR_OOM;
    cm_status st = cm_module_new(vt, *self, out);
    if (st) cm_free(*self);
    return st;
}

static void free_self(void *self) { cm_free(self); }

/* Frees a half-built module and passes the status on. */
static cm_status fail_build(cm_module **m, cm_status st) {
    cm_module_free(*m);
    *m = NULL;
    return st;
}

/* ---- Linear / Conv1D ---- */

typedef struct {
    int64_t in, out;
    bool transposed; /* weight stored (in, out) */
    cm_tensor *weight, *bias;
} linear_s;

static cm_tensor *linear_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    linear_s *s = m->self;
    cm_tensor *w = s->transposed ? cm_transpose(tp, s->weight, 0, 1) : s->weight; /* (out, in) */
    return cm_linear(tp, in[0], w, s->bias);
}

static void linear_desc(const cm_module *m, char *buf, size_t cap) {
    const linear_s *s = m->self;
    snprintf(buf, cap, "in=%lld, out=%lld%s", (long long)s->in, (long long)s->out, s->bias ? ", bias" : "");
}

static const cm_module_i linear_vt = {CM_MODULE_ABI, "Linear", linear_fwd, free_self, linear_desc};
static const cm_module_i conv1d_vt = {CM_MODULE_ABI, "Conv1D", linear_fwd, free_self, linear_desc};

static cm_status linear_make(int64_t in, int64_t out, bool bias, bool transposed, cm_rng *rng, cm_module **m) {
    if (!m) return cm_set_error(CM_ERR_INVALID_ARG, "cm_nn_linear_new: out is NULL");
    *m = NULL;
    if (in < 1 || out < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_nn_%s_new: in (%lld) and out (%lld) must be at least 1",
                            transposed ? "conv1d" : "linear", (long long)in, (long long)out);
    linear_s *s;
    cm_status st = new_mod(transposed ? &conv1d_vt : &linear_vt, sizeof *s, (void **)&s, m);
    if (st) return st;
    s->in = in, s->out = out, s->transposed = transposed;
    int64_t ws[2] = {transposed ? in : out, transposed ? out : in};
    if ((st = cm_module_add_param(*m, "weight", 2, ws, false, &s->weight))) return fail_build(m, st);
    if (bias && (st = cm_module_add_param(*m, "bias", 1, &out, true, &s->bias))) return fail_build(m, st);
    if (rng) {
        float bound = 1.0f / sqrtf((float)in);
        cm_tensor_init_uniform(s->weight, rng, -bound, bound);
        if (bias) cm_tensor_init_uniform(s->bias, rng, -bound, bound);
    }
    return CM_OK;
}

cm_status cm_nn_linear_new(int64_t in, int64_t out, bool bias, cm_rng *rng, cm_module **m) {
    return linear_make(in, out, bias, false, rng, m);
}
cm_status cm_nn_conv1d_new(int64_t in, int64_t out, bool bias, cm_rng *rng, cm_module **m) {
    return linear_make(in, out, bias, true, rng, m);
}

bool cm_nn_is_linear(const cm_module *m) { return m && (m->vt == &linear_vt || m->vt == &conv1d_vt); }

cm_status cm_nn_linear_dims(const cm_module *m, int64_t *in, int64_t *out, bool *transposed_weight) {
    if (!cm_nn_is_linear(m))
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_nn_linear_dims: module is a %s, not a Linear or Conv1D",
                            m ? m->vt->type_name : "NULL");
    const linear_s *s = m->self;
    if (in) *in = s->in;
    if (out) *out = s->out;
    if (transposed_weight) *transposed_weight = s->transposed;
    return CM_OK;
}

/* ---- Embedding ---- */

typedef struct {
    int64_t num, dim;
    cm_tensor *weight;
} emb_s;

static cm_tensor *emb_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    return cm_embedding(tp, ((emb_s *)m->self)->weight, in[0]);
}
static void emb_desc(const cm_module *m, char *buf, size_t cap) {
    const emb_s *s = m->self;
    snprintf(buf, cap, "%lld, %lld", (long long)s->num, (long long)s->dim);
}
static const cm_module_i emb_vt = {CM_MODULE_ABI, "Embedding", emb_fwd, free_self, emb_desc};

cm_status cm_nn_embedding_new(int64_t num, int64_t dim, cm_rng *rng, cm_module **m) {
    if (!m) return cm_set_error(CM_ERR_INVALID_ARG, "cm_nn_embedding_new: out is NULL");
    *m = NULL;
    if (num < 1 || dim < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_nn_embedding_new: num (%lld) and dim (%lld) must be at least 1",
                            (long long)num, (long long)dim);
    emb_s *s;
    cm_status st = new_mod(&emb_vt, sizeof *s, (void **)&s, m);
    if (st) return st;
    s->num = num, s->dim = dim;
    int64_t ws[2] = {num, dim};
    if ((st = cm_module_add_param(*m, "weight", 2, ws, false, &s->weight))) return fail_build(m, st);
    if (rng) cm_tensor_init_normal(s->weight, rng, 0.0f, 1.0f);
    return CM_OK;
}

/* ---- LayerNorm, GroupNorm ---- */

typedef struct {
    int64_t dim, groups;
    float eps;
    bool low_precision; /* cm_nn_norm_set_low_precision */
    cm_tensor *weight, *bias;
} norm_s;

/* t rounded to bf16 and widened back (a recorded cast pair: the gradient passes unchanged). */
static cm_tensor *bf16_round(cm_tape *tp, cm_tensor *t) {
    return t ? cm_cast(tp, cm_cast(tp, t, CM_DTYPE_BF16), CM_DTYPE_F32) : NULL;
}

/* The norm's inputs and parameters, rounded to bf16 when the module is low-precision and the tape
 * autocasts to bf16; *lp tells whether they were. */
static void lp_inputs(const norm_s *s, cm_tape *tp, cm_tensor **x, cm_tensor **w, cm_tensor **b, bool *lp) {
    *w = s->weight, *b = s->bias;
    *lp = s->low_precision && cm_tape_autocast(tp) == CM_DTYPE_BF16;
    if (!*lp) return;
    *x = bf16_round(tp, *x);
    *w = bf16_round(tp, *w);
    *b = bf16_round(tp, *b);
}

static cm_tensor *ln_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    norm_s *s = m->self;
    cm_tensor *x = in[0], *w, *b;
    bool lp;
    lp_inputs(s, tp, &x, &w, &b, &lp);
    cm_tensor *y = cm_layer_norm(tp, x, w, b, s->eps);
    return lp ? bf16_round(tp, y) : y;
}
static cm_tensor *gn_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    norm_s *s = m->self;
    cm_tensor *x = in[0], *w, *b;
    bool lp;
    lp_inputs(s, tp, &x, &w, &b, &lp);
    cm_tensor *y = cm_group_norm(tp, x, s->groups, w, b, s->eps);
    return lp ? bf16_round(tp, y) : y;
}
static void ln_desc(const cm_module *m, char *buf, size_t cap) {
    const norm_s *s = m->self;
    snprintf(buf, cap, "%lld, eps=%g%s%s", (long long)s->dim, s->eps, s->weight ? "" : ", affine=false",
             s->low_precision ? ", low_precision" : "");
}
static void gn_desc(const cm_module *m, char *buf, size_t cap) {
    const norm_s *s = m->self;
    snprintf(buf, cap, "%lld, %lld, eps=%g%s%s", (long long)s->groups, (long long)s->dim, s->eps,
             s->weight ? "" : ", affine=false", s->low_precision ? ", low_precision" : "");
}
static const cm_module_i ln_vt = {CM_MODULE_ABI, "LayerNorm", ln_fwd, free_self, ln_desc};
static const cm_module_i gn_vt = {CM_MODULE_ABI, "GroupNorm", gn_fwd, free_self, gn_desc};

static cm_status norm_make(const cm_module_i *vt, int64_t groups, int64_t dim, float eps, bool affine, cm_module **m) {
    const char *fn = vt == &ln_vt ? "cm_nn_layer_norm_new" : "cm_nn_group_norm_new";
    if (!m) return cm_set_error(CM_ERR_INVALID_ARG, "%s: out is NULL", fn);
    *m = NULL;
    if (dim < 1 || !(eps >= 0) || groups < 1 || dim % groups)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "%s: size %lld must be at least 1 (and divisible by groups %lld), eps %g at least 0", fn,
                            (long long)dim, (long long)groups, eps);
    norm_s *s;
    cm_status st = new_mod(vt, sizeof *s, (void **)&s, m);
    if (st) return st;
    s->dim = dim, s->groups = groups, s->eps = eps;
    if (affine) {
        if ((st = cm_module_add_param(*m, "weight", 1, &dim, true, &s->weight)) ||
            (st = cm_module_add_param(*m, "bias", 1, &dim, true, &s->bias)))
            return fail_build(m, st);
        cm_tensor_fill(s->weight, 1.0);
    }
    return CM_OK;
}

cm_status cm_nn_layer_norm_new(int64_t dim, float eps, bool affine, cm_module **m) {
    return norm_make(&ln_vt, 1, dim, eps, affine, m);
}
cm_status cm_nn_group_norm_new(int64_t groups, int64_t channels, float eps, bool affine, cm_module **m) {
    return norm_make(&gn_vt, groups, channels, eps, affine, m);
}

/* ---- BatchNorm2d ---- */

typedef struct {
    int64_t c;
    cm_nn_batch_norm_config cfg;
    cm_tensor *weight, *bias, *running_mean, *running_var, *num_batches_tracked;
} bn_s;

cm_nn_batch_norm_config cm_nn_batch_norm_config_default(void) {
    return (cm_nn_batch_norm_config){1e-5f, 0.1f, true, true, false};
}

/* The op options of a BatchNorm2d module: its config and mode. */
static cm_batch_norm_opts bn_opts(const cm_module *m) {
    const bn_s *s = m->self;
    cm_batch_norm_opts o = cm_batch_norm_opts_default();
    o.eps = s->cfg.eps;
    o.momentum = s->cfg.momentum;
    o.channels_last = s->cfg.channels_last;
    /* without running stats, eval also normalises with the batch statistics (as PyTorch) */
    o.training = m->training || !s->running_mean;
    return o;
}

/* batch_norm(x) [+ residual, then ReLU when fused] with the module's tensors; counts the batch. */
static cm_tensor *bn_apply(cm_module *m, cm_tape *tp, cm_tensor *x, cm_tensor *residual, bool fused) {
    bn_s *s = m->self;
    const cm_batch_norm_opts o = bn_opts(m);
    cm_tensor *y = fused ? cm_batch_norm_add_relu(tp, x, s->weight, s->bias, s->running_mean, s->running_var,
                                                  residual, &o)
                         : cm_batch_norm(tp, x, s->weight, s->bias, s->running_mean, s->running_var, &o);
    if (y && m->training) cmn_count_batches(tp, s->num_batches_tracked, 1);
    return y;
}

void cmn_count_batches(cm_tape *tp, cm_tensor *nbt, int64_t k) {
    if (!nbt || cm_tape_replaying(tp)) return; /* once, not again in a replay */
    const int64_t i0[1] = {0};
    if (cm_tensor_device(nbt) == CM_DEVICE_CPU)
        ((int64_t *)cm_tensor_data(nbt))[0] += k;
    else /* a counter on the GPU: one element each way */
        cm_tensor_set(nbt, i0, cm_tensor_get(nbt, i0) + (double)k);
}

static cm_tensor *bn_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    return bn_apply(m, tp, in[0], NULL, false);
}
static void bn_desc(const cm_module *m, char *buf, size_t cap) {
    const bn_s *s = m->self;
    snprintf(buf, cap, "%lld, eps=%g, momentum=%g%s%s", (long long)s->c, s->cfg.eps, s->cfg.momentum,
             s->cfg.affine ? "" : ", affine=false", s->cfg.track_running_stats ? "" : ", track_running_stats=false");
}
static const cm_module_i bn_vt = {CM_MODULE_ABI, "BatchNorm2d", bn_fwd, free_self, bn_desc};

cm_tensor *cm_nn_batch_norm_add_relu(cm_module *bn, cm_tape *tp, cm_tensor *x, cm_tensor *residual) {
    if (!bn || bn->vt != &bn_vt) { /* not a BatchNorm2d (or NULL: cm_module_forward names that) */
        /* the elementwise ops take f32: a bf16 output or residual (under autocast) is widened */
        cm_tensor *y = cm_module_forward(bn, tp, x);
        if (y && cm_tensor_dtype(y) != CM_DTYPE_F32) y = cm_cast(tp, y, CM_DTYPE_F32);
        if (residual && cm_tensor_dtype(residual) != CM_DTYPE_F32) residual = cm_cast(tp, residual, CM_DTYPE_F32);
        if (residual) y = cm_add(tp, y, residual);
        return cm_relu(tp, y);
    }
    if (!tp || cm_tape_status(tp) != CM_OK) return NULL;
    return bn_apply(bn, tp, x, residual, true);
}

cm_status cm_nn_batch_norm2d_new(int64_t channels, const cm_nn_batch_norm_config *cfg, cm_module **m) {
    if (!m) return cm_set_error(CM_ERR_INVALID_ARG, "cm_nn_batch_norm2d_new: out is NULL");
    *m = NULL;
    cm_nn_batch_norm_config c = cfg ? *cfg : cm_nn_batch_norm_config_default();
    if (channels < 1 || !(c.eps >= 0) || !(c.momentum >= 0 && c.momentum <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "cm_nn_batch_norm2d_new: channels %lld must be at least 1, eps %g at least 0, momentum "
                            "%g in [0, 1]",
                            (long long)channels, c.eps, c.momentum);
    bn_s *s;
    cm_status st = new_mod(&bn_vt, sizeof *s, (void **)&s, m);
    if (st) return st;
    s->c = channels, s->cfg = c;
    if (c.affine) {
        if ((st = cm_module_add_param(*m, "weight", 1, &channels, true, &s->weight)) ||
            (st = cm_module_add_param(*m, "bias", 1, &channels, true, &s->bias)))
            return fail_build(m, st);
        cm_tensor_fill(s->weight, 1.0);
    }
    if (c.track_running_stats) {
        if ((st = cm_module_add_buffer(*m, "running_mean", CM_DTYPE_F32, 1, &channels, true, &s->running_mean)) ||
            (st = cm_module_add_buffer(*m, "running_var", CM_DTYPE_F32, 1, &channels, true, &s->running_var)) ||
            (st = cm_module_add_buffer(*m, "num_batches_tracked", CM_DTYPE_I64, 0, NULL, true,
                                       &s->num_batches_tracked)))
            return fail_build(m, st);
        cm_tensor_fill(s->running_var, 1.0);
    }
    return CM_OK;
}

/* ---- Conv2d ---- */

typedef struct {
    cm_nn_conv2d_config cfg;
    bool weight_standardization; /* cm_nn_conv2d_set_weight_standardization */
    cm_tensor *weight, *bias;
} conv_s;

cm_tensor *cm_nn_standardize_weight(cm_tape *tp, cm_tensor *w) {
    if (!tp || cm_tape_status(tp) || !w) return NULL;
    const int nd = cm_tensor_ndim(w);
    if (nd < 2) return cmn_fail(tp, CM_ERR_SHAPE, "weight standardization: a %d-d weight has no fan-in dims", nd);
    int axes[CM_MAX_DIMS];
    for (int i = 1; i < nd; i++) axes[i - 1] = i;
    /* torch.var_mean(W, dim=1.., keepdim=True, unbiased=False): (W - mean) / sqrt(var + 1e-10) */
    cm_tensor *mean = cm_mean(tp, w, axes, nd - 1, true);
    cm_tensor *var = cm_var(tp, w, axes, nd - 1, 0, true);
    return cm_div(tp, cm_sub(tp, w, mean), cm_sqrt(tp, cm_add_scalar(tp, var, 1e-10f)));
}

cm_nn_conv2d_config cm_nn_conv2d_config_default(int64_t in, int64_t out, int kh, int kw) {
    cm_nn_conv2d_config c;
    memset(&c, 0, sizeof c);
    c.in = in, c.out = out, c.kernel[0] = kh, c.kernel[1] = kw;
    c.opts = cm_conv2d_opts_default();
    c.bias = true;
    return c;
}

static cm_tensor *conv_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    conv_s *s = m->self;
    cm_tensor *w = s->weight_standardization ? cm_nn_standardize_weight(tp, s->weight) : s->weight;
    return cm_conv2d(tp, in[0], w, s->bias, &s->cfg.opts);
}
static void conv_desc(const cm_module *m, char *buf, size_t cap) {
    const conv_s *s = m->self;
    const cm_conv2d_opts *o = &s->cfg.opts;
    snprintf(buf, cap, "%lld, %lld, kernel_size=(%d, %d), stride=(%d, %d), padding=(%d, %d)%s%s", (long long)s->cfg.in,
             (long long)s->cfg.out, s->cfg.kernel[0], s->cfg.kernel[1], o->stride[0], o->stride[1], o->padding[0],
             o->padding[1], s->cfg.bias ? "" : ", bias=false", s->weight_standardization ? ", weight_standardization" : "");
}
static const cm_module_i conv_vt = {CM_MODULE_ABI, "Conv2d", conv_fwd, free_self, conv_desc};

cm_status cm_nn_conv2d_new(const cm_nn_conv2d_config *cfg, cm_rng *rng, cm_module **m) {
    if (!m || !cfg) return cm_set_error(CM_ERR_INVALID_ARG, "cm_nn_conv2d_new: NULL argument");
    *m = NULL;
    const int g = cfg->opts.groups;
    if (cfg->in < 1 || cfg->out < 1 || cfg->kernel[0] < 1 || cfg->kernel[1] < 1 || g < 1 || cfg->in % g ||
        cfg->out % g)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "cm_nn_conv2d_new: in %lld, out %lld and kernel (%d, %d) must be at least 1, and in and "
                            "out divisible by groups %d",
                            (long long)cfg->in, (long long)cfg->out, cfg->kernel[0], cfg->kernel[1], g);
    conv_s *s;
    cm_status st = new_mod(&conv_vt, sizeof *s, (void **)&s, m);
    if (st) return st;
    s->cfg = *cfg;
    int64_t ws[4] = {cfg->out, cfg->in / g, cfg->kernel[0], cfg->kernel[1]};
    if ((st = cm_module_add_param(*m, "weight", 4, ws, false, &s->weight))) return fail_build(m, st);
    if (cfg->bias && (st = cm_module_add_param(*m, "bias", 1, &cfg->out, true, &s->bias))) return fail_build(m, st);
    if (rng) {
        float bound = 1.0f / sqrtf((float)(ws[1] * ws[2] * ws[3]));
        cm_tensor_init_uniform(s->weight, rng, -bound, bound);
        if (s->bias) cm_tensor_init_uniform(s->bias, rng, -bound, bound);
    }
    return CM_OK;
}

/* ---- pooling, Flatten ---- */

typedef struct {
    cm_pool2d_opts o;
    int64_t oh, ow;
    bool channels_last;
    int start_dim;
} pool_s;

static cm_tensor *maxpool_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    return cm_max_pool2d(tp, in[0], &((pool_s *)m->self)->o);
}
static cm_tensor *avgpool_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    return cm_avg_pool2d(tp, in[0], &((pool_s *)m->self)->o);
}
static cm_tensor *adapt_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    pool_s *s = m->self;
    return cm_adaptive_avg_pool2d(tp, in[0], s->oh, s->ow, s->channels_last);
}
static cm_tensor *flatten_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    pool_s *s = m->self;
    cm_tensor *x = in[0];
    int nd = cm_tensor_ndim(x), sd = s->start_dim < 0 ? s->start_dim + nd : s->start_dim;
    if (sd < 0 || sd >= nd)
        return cmn_fail(tp, CM_ERR_SHAPE, "Flatten: start_dim %d is out of range for a %d-d input", s->start_dim,
                        nd);
    int64_t shape[CM_MAX_DIMS];
    for (int i = 0; i < sd; i++) shape[i] = cm_tensor_dim(x, i);
    shape[sd] = -1;
    return cm_reshape(tp, x, sd + 1, shape);
}
static void pool_desc(const cm_module *m, char *buf, size_t cap) {
    const pool_s *s = m->self;
    snprintf(buf, cap, "kernel_size=(%d, %d), stride=(%d, %d), padding=(%d, %d)", s->o.kernel[0], s->o.kernel[1],
             s->o.stride[0], s->o.stride[1], s->o.padding[0], s->o.padding[1]);
}
static void adapt_desc(const cm_module *m, char *buf, size_t cap) {
    const pool_s *s = m->self;
    snprintf(buf, cap, "output_size=(%lld, %lld)", (long long)s->oh, (long long)s->ow);
}
static void flatten_desc(const cm_module *m, char *buf, size_t cap) {
    snprintf(buf, cap, "start_dim=%d", ((const pool_s *)m->self)->start_dim);
}
static const cm_module_i maxpool_vt = {CM_MODULE_ABI, "MaxPool2d", maxpool_fwd, free_self, pool_desc};
static const cm_module_i avgpool_vt = {CM_MODULE_ABI, "AvgPool2d", avgpool_fwd, free_self, pool_desc};
static const cm_module_i adapt_vt = {CM_MODULE_ABI, "AdaptiveAvgPool2d", adapt_fwd, free_self, adapt_desc};
static const cm_module_i flatten_vt = {CM_MODULE_ABI, "Flatten", flatten_fwd, free_self, flatten_desc};

static cm_status pool_make(const cm_module_i *vt, const cm_pool2d_opts *opts, cm_module **m) {
    if (!m || !opts) return cm_set_error(CM_ERR_INVALID_ARG, "cm_nn_%s_new: NULL argument", vt->type_name);
    *m = NULL;
    if (opts->kernel[0] < 1 || opts->kernel[1] < 1 || opts->stride[0] < 0 || opts->stride[1] < 0 ||
        opts->padding[0] < 0 || opts->padding[1] < 0)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "%s: kernel (%d, %d) must be at least 1, stride and padding at least 0", vt->type_name,
                            opts->kernel[0], opts->kernel[1]);
    pool_s *s;
    cm_status st = new_mod(vt, sizeof *s, (void **)&s, m);
    if (st) return st;
    s->o = *opts;
    for (int i = 0; i < 2; i++)
        if (!s->o.stride[i]) s->o.stride[i] = s->o.kernel[i];
    return CM_OK;
}

cm_status cm_nn_max_pool2d_new(const cm_pool2d_opts *opts, cm_module **m) { return pool_make(&maxpool_vt, opts, m); }
cm_status cm_nn_avg_pool2d_new(const cm_pool2d_opts *opts, cm_module **m) { return pool_make(&avgpool_vt, opts, m); }

cm_status cm_nn_adaptive_avg_pool2d_new(int64_t out_h, int64_t out_w, bool channels_last, cm_module **m) {
    if (!m) return cm_set_error(CM_ERR_INVALID_ARG, "cm_nn_adaptive_avg_pool2d_new: out is NULL");
    *m = NULL;
    if (out_h < 1 || out_w < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_nn_adaptive_avg_pool2d_new: output size (%lld, %lld) must be "
                                                "at least 1",
                            (long long)out_h, (long long)out_w);
    pool_s *s;
    cm_status st = new_mod(&adapt_vt, sizeof *s, (void **)&s, m);
    if (st) return st;
    s->oh = out_h, s->ow = out_w, s->channels_last = channels_last;
    return CM_OK;
}

cm_status cm_nn_flatten_new(int start_dim, cm_module **m) {
    if (!m) return cm_set_error(CM_ERR_INVALID_ARG, "cm_nn_flatten_new: out is NULL");
    pool_s *s;
    cm_status st = new_mod(&flatten_vt, sizeof *s, (void **)&s, m);
    if (st) return st;
    s->start_dim = start_dim;
    return CM_OK;
}

/* ---- Dropout ---- */

typedef struct {
    float p;
    cm_rng rng;
} drop_s;

static cm_tensor *drop_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    drop_s *s = m->self;
    return cm_dropout(tp, in[0], s->p, m->training, &s->rng);
}
static void drop_desc(const cm_module *m, char *buf, size_t cap) {
    snprintf(buf, cap, "p=%g", ((const drop_s *)m->self)->p);
}
static const cm_module_i drop_vt = {CM_MODULE_ABI, "Dropout", drop_fwd, free_self, drop_desc};

cm_status cm_nn_dropout_new(float p, cm_module **m) {
    if (!m) return cm_set_error(CM_ERR_INVALID_ARG, "cm_nn_dropout_new: out is NULL");
    *m = NULL;
    if (!(p >= 0 && p <= 1)) return cm_set_error(CM_ERR_INVALID_ARG, "cm_nn_dropout_new: p = %g is not in [0, 1]", p);
    drop_s *s;
    cm_status st = new_mod(&drop_vt, sizeof *s, (void **)&s, m);
    if (st) return st;
    s->p = p;
    s->rng = cm_rng_init(0, 0);
    return CM_OK;
}

bool cmn_is_dropout(const cm_module *m) { return m && m->vt == &drop_vt; }
void cmn_dropout_seed(cm_module *m, uint64_t seed, uint64_t stream) {
    ((drop_s *)m->self)->rng = cm_rng_init(seed, stream);
}
float cmn_dropout_p(const cm_module *m) { return ((const drop_s *)m->self)->p; }
cm_rng *cm_nn_dropout_rng(cm_module *m) { return cmn_is_dropout(m) ? &((drop_s *)m->self)->rng : NULL; }

/* ---- activations ---- */

cm_tensor *cm_nn_activate(cm_tape *tp, cm_tensor *x, cm_activation act) {
    switch (act) {
    case CM_ACT_RELU: return cm_relu(tp, x);
    case CM_ACT_GELU: return cm_gelu(tp, x, false);
    case CM_ACT_GELU_TANH: return cm_gelu(tp, x, true);
    case CM_ACT_SILU: return cm_silu(tp, x);
    case CM_ACT_TANH: return cm_tanh(tp, x);
    case CM_ACT_SIGMOID: return cm_sigmoid(tp, x);
    case CM_ACT_IDENTITY: return x;
    }
    return cmn_fail(tp, CM_ERR_INVALID_ARG, "activation: unknown cm_activation %d", (int)act);
}

static cm_tensor *act_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    return cm_nn_activate(tp, in[0], *(cm_activation *)m->self);
}
#define ACT_VT(id, name) {CM_MODULE_ABI, name, act_fwd, free_self, NULL}
static const cm_module_i act_vts[] = {ACT_VT(RELU, "ReLU"), ACT_VT(GELU, "GELU"), ACT_VT(GELU_TANH, "NewGELU"),
                                      ACT_VT(SILU, "SiLU"), ACT_VT(TANH, "Tanh"), ACT_VT(SIGMOID, "Sigmoid"),
                                      ACT_VT(IDENTITY, "Identity")};
_Static_assert(sizeof act_vts / sizeof act_vts[0] == CM_ACT_IDENTITY + 1, "one vtable per cm_activation");

cm_status cm_nn_activation_new(cm_activation act, cm_module **m) {
    if (!m) return cm_set_error(CM_ERR_INVALID_ARG, "cm_nn_activation_new: out is NULL");
    *m = NULL;
    if ((int)act < 0 || act > CM_ACT_IDENTITY)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_nn_activation_new: unknown cm_activation %d", (int)act);
    cm_activation *s;
    cm_status st = new_mod(&act_vts[act], sizeof *s, (void **)&s, m);
    if (st) return st;
    *s = act;
    return CM_OK;
}

/* ---- Sequential, ModuleList ---- */

static cm_tensor *seq_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    cm_tensor *args[8] = {0};
    int n = n_in < 8 ? n_in : 8;
    memcpy(args, in, sizeof(cm_tensor *) * (size_t)n);
    for (int i = 0; i < m->n_children; i++)
        if (!(args[0] = cm_module_forward_n(m->children[i].m, tp, n, args))) return NULL;
    return args[0];
}
static const cm_module_i seq_vt = {CM_MODULE_ABI, "Sequential", seq_fwd, NULL, NULL};
static const cm_module_i list_vt = {CM_MODULE_ABI, "ModuleList", NULL, NULL, NULL};

cm_status cm_nn_sequential_new(cm_module **m) { return cm_module_new(&seq_vt, NULL, m); }
cm_status cm_nn_module_list_new(cm_module **m) { return cm_module_new(&list_vt, NULL, m); }

cm_status cm_nn_sequential_append(cm_module *seq, cm_module *child) {
    if (!seq) return cm_set_error(CM_ERR_INVALID_ARG, "cm_nn_sequential_append: container is NULL");
    char name[24];
    snprintf(name, sizeof name, "%d", seq->n_children);
    return cm_module_add_child(seq, name, child, NULL);
}

/* ---- reading and retuning layers ---- */

static cm_status not_a(const cm_module *m, const char *fn, const char *want) {
    return cm_set_error(CM_ERR_INVALID_ARG, "%s: the module is %s%s, not a %s", fn, m ? "a " : "",
                        m ? m->vt->type_name : "NULL", want);
}

cm_status cm_nn_conv2d_config_of(const cm_module *m, cm_nn_conv2d_config *out) {
    if (!m || m->vt != &conv_vt || !out) return not_a(m, "cm_nn_conv2d_config_of", "Conv2d");
    *out = ((const conv_s *)m->self)->cfg;
    return CM_OK;
}

cm_status cm_nn_batch_norm2d_config_of(const cm_module *m, int64_t *channels, cm_nn_batch_norm_config *out) {
    if (!m || m->vt != &bn_vt) return not_a(m, "cm_nn_batch_norm2d_config_of", "BatchNorm2d");
    const bn_s *s = m->self;
    if (channels) *channels = s->c;
    if (out) *out = s->cfg;
    return CM_OK;
}

cm_status cm_nn_pool2d_opts_of(const cm_module *m, cm_pool2d_opts *out) {
    if (!m || (m->vt != &maxpool_vt && m->vt != &avgpool_vt) || !out)
        return not_a(m, "cm_nn_pool2d_opts_of", "MaxPool2d or AvgPool2d");
    *out = ((const pool_s *)m->self)->o;
    return CM_OK;
}

cm_status cm_nn_norm_config_of(const cm_module *m, int64_t *groups, int64_t *dim, float *eps, bool *affine) {
    if (!m || (m->vt != &ln_vt && m->vt != &gn_vt)) return not_a(m, "cm_nn_norm_config_of", "LayerNorm or GroupNorm");
    const norm_s *s = m->self;
    if (groups) *groups = s->groups;
    if (dim) *dim = s->dim;
    if (eps) *eps = s->eps;
    if (affine) *affine = s->weight != NULL;
    return CM_OK;
}

cm_status cm_nn_dropout_p_of(const cm_module *m, float *p) {
    if (!cmn_is_dropout(m) || !p) return not_a(m, "cm_nn_dropout_p_of", "Dropout");
    *p = cmn_dropout_p(m);
    return CM_OK;
}

cm_status cm_nn_embedding_dims(const cm_module *m, int64_t *num, int64_t *dim) {
    if (!m || m->vt != &emb_vt) return not_a(m, "cm_nn_embedding_dims", "Embedding");
    const emb_s *s = m->self;
    if (num) *num = s->num;
    if (dim) *dim = s->dim;
    return CM_OK;
}

cm_status cm_nn_norm_set_low_precision(cm_module *m, bool on) {
    if (!m || (m->vt != &ln_vt && m->vt != &gn_vt)) return not_a(m, "cm_nn_norm_set_low_precision", "LayerNorm or GroupNorm");
    ((norm_s *)m->self)->low_precision = on;
    return CM_OK;
}

bool cm_nn_norm_is_low_precision(const cm_module *m) {
    return m && (m->vt == &ln_vt || m->vt == &gn_vt) && ((const norm_s *)m->self)->low_precision;
}

cm_status cm_nn_set_channels_last(cm_module *m, bool on) {
    if (m && m->vt == &conv_vt) {
        ((conv_s *)m->self)->cfg.opts.channels_last = on;
    } else if (m && m->vt == &bn_vt) {
        ((bn_s *)m->self)->cfg.channels_last = on;
    } else if (m && (m->vt == &maxpool_vt || m->vt == &avgpool_vt)) {
        ((pool_s *)m->self)->o.channels_last = on;
    } else if (m && m->vt == &adapt_vt) {
        ((pool_s *)m->self)->channels_last = on;
    } else {
        return not_a(m, "cm_nn_set_channels_last", "Conv2d, BatchNorm2d, MaxPool2d, AvgPool2d or AdaptiveAvgPool2d");
    }
    return CM_OK;
}

bool cm_nn_is_channels_last(const cm_module *m) {
    if (!m) return false;
    if (m->vt == &conv_vt) return ((const conv_s *)m->self)->cfg.opts.channels_last;
    if (m->vt == &bn_vt) return ((const bn_s *)m->self)->cfg.channels_last;
    if (m->vt == &maxpool_vt || m->vt == &avgpool_vt) return ((const pool_s *)m->self)->o.channels_last;
    if (m->vt == &adapt_vt) return ((const pool_s *)m->self)->channels_last;
    return false;
}

cm_status cm_nn_conv2d_set_weight_standardization(cm_module *m, bool on) {
    if (!m || m->vt != &conv_vt) return not_a(m, "cm_nn_conv2d_set_weight_standardization", "Conv2d");
    ((conv_s *)m->self)->weight_standardization = on;
    return CM_OK;
}

bool cm_nn_conv2d_weight_standardization(const cm_module *m) {
    return m && m->vt == &conv_vt && ((const conv_s *)m->self)->weight_standardization;
}
