/* Multi-head attention, the GPT-2 block (pre-LN) and the BERT layer (post-LN), with Hugging Face's
 * module trees. Children live in slots that surgery updates, so a replaced projection (LoRA, a
 * quantised Linear, ...) is what the next forward calls. */
#include "nn/nn_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

cm_nn_attention_config cm_nn_attention_config_default(int64_t d_model, int64_t n_heads) {
    cm_nn_attention_config c;
    memset(&c, 0, sizeof c);
    c.d_model = d_model;
    c.n_heads = n_heads;
    c.causal = true;
    c.bias = true;
    c.mlp_ratio = 4.0f;
    c.ln_eps = 1e-5f;
    c.act = CM_ACT_GELU_TANH;
    return c;
}

static cm_status check_cfg(const char *fn, const cm_nn_attention_config *c) {
    if (!c) return cm_set_error(CM_ERR_INVALID_ARG, "%s: config is NULL", fn);
    if (c->d_model < 1 || c->n_heads < 1 || c->d_model % c->n_heads)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: d_model %lld must be a positive multiple of n_heads %lld", fn,
                            (long long)c->d_model, (long long)c->n_heads);
    if (!(c->attn_pdrop >= 0 && c->attn_pdrop <= 1) || !(c->resid_pdrop >= 0 && c->resid_pdrop <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: attn_pdrop %g and resid_pdrop %g must be in [0, 1]", fn,
                            c->attn_pdrop, c->resid_pdrop);
    if (!(c->mlp_ratio > 0) || (int64_t)(c->mlp_ratio * (float)c->d_model) < 1 || !(c->ln_eps >= 0))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: mlp_ratio %g must be positive and ln_eps %g at least 0", fn,
                            c->mlp_ratio, c->ln_eps);
    if ((int)c->act < 0 || c->act > CM_ACT_IDENTITY)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: unknown activation %d", fn, (int)c->act);
    return CM_OK;
}

void cm_nn_alibi_slopes(int64_t n_heads, float *slopes) {
    /* Press et al.: for a power of two n, slope_i = 2^(-8(i+1)/n); otherwise the slopes of the
     * closest smaller power of two p, followed by every other slope of 2p. */
    int64_t p = 1;
    while (p * 2 <= n_heads) p *= 2;
    for (int64_t i = 0; i < p && i < n_heads; i++) slopes[i] = (float)pow(2.0, -8.0 * (double)(i + 1) / (double)p);
    for (int64_t i = p, j = 0; i < n_heads; i++, j += 2)
        slopes[i] = (float)pow(2.0, -8.0 * (double)(j + 1) / (double)(2 * p));
}

/* A tape tensor made on the CPU, whatever the tape's creation device (the masks below are filled
 * by host loops, then moved to the device of the activations with cm_to_device). */
static cm_tensor *host_empty(cm_tape *tp, int ndim, const int64_t *shape) {
    return cm_empty_on(tp, CM_DEVICE_CPU, CM_DTYPE_F32, ndim, shape);
}

/* (1, H, T, T) with -slope_h·|i - j| (no gradient), on the CPU. */
static cm_tensor *alibi_bias(cm_tape *tp, int64_t H, int64_t T) {
    int64_t shape[4] = {1, H, T, T};
    cm_tensor *b = host_empty(tp, 4, shape);
    float *slopes = b ? cm_arena_alloc(cm_tape_arena(tp), sizeof(float) * (size_t)H) : NULL;
    if (!b || !slopes) return cmn_fail(tp, CM_ERR_OOM, "attention: out of memory for the ALiBi bias");
    cm_nn_alibi_slopes(H, slopes);
    float *d = cm_tensor_data(b);
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < T; i++)
            for (int64_t j = 0; j < T; j++) d[(h * T + i) * T + j] = -slopes[h] * (float)(i > j ? i - j : j - i);
    return b;
}

/* Additive mask (B or 1, 1, T, T): -inf where causal hides a key or the key is padding. */
static cm_tensor *mask_bias(cm_tape *tp, int64_t B, int64_t T, bool causal, cm_tensor *kpm) {
    if (kpm && (cm_tensor_ndim(kpm) != 2 || cm_tensor_dim(kpm, 0) != B || cm_tensor_dim(kpm, 1) != T)) {
        char s[64];
        return cmn_fail(tp, CM_ERR_SHAPE, "attention: the key padding mask %s must be (B, T) = (%lld, %lld)",
                        cm_tensor_shape_str(kpm, s, sizeof s), (long long)B, (long long)T);
    }
    int64_t nb = kpm ? B : 1, shape[4] = {nb, 1, T, T};
    if (kpm && cm_tensor_device(kpm) != CM_DEVICE_CPU) kpm = cm_to_device(tp, kpm, CM_DEVICE_CPU); /* read once */
    cm_tensor *m = host_empty(tp, 4, shape);
    if (!m) return NULL;
    float *d = cm_tensor_data(m);
    for (int64_t b = 0; b < nb; b++) {
        float *row0 = d + b * T * T; /* row 0 holds the padding part, then each row copies it */
        for (int64_t j = 0; j < T; j++) row0[j] = kpm && cm_tensor_get_flat(kpm, b * T + j) == 0 ? -INFINITY : 0.0f;
        for (int64_t i = T - 1; i >= 0; i--) {
            float *row = row0 + i * T;
            if (i) memcpy(row, row0, sizeof(float) * (size_t)T);
            if (causal)
                for (int64_t j = i + 1; j < T; j++) row[j] = -INFINITY;
        }
    }
    return m;
}

/* q, k, v (B, T, C) (any strides) → (B, T, C): heads split, attention, heads merged. attn_drop is
 * the dropout on the probabilities (may be NULL). */
static cm_tensor *attn_core(cm_tape *tp, cm_tensor *q, cm_tensor *k, cm_tensor *v, int64_t H, bool causal, bool alibi,
                            cm_tensor *kpm, cm_tensor *bias, cm_module *attn_drop) {
    if (!q || !k || !v) return NULL;
    if (cm_tensor_ndim(q) != 3) {
        char s[64];
        return cmn_fail(tp, CM_ERR_SHAPE, "attention: x must be (B, T, C); the projection gave %s",
                        cm_tensor_shape_str(q, s, sizeof s));
    }
    const int64_t B = cm_tensor_dim(q, 0), T = cm_tensor_dim(q, 1), C = cm_tensor_dim(q, 2), D = C / H;
    const int64_t s4[4] = {B, T, H, D}, s3[3] = {B, T, C};
    const int perm[4] = {0, 2, 1, 3};
    cm_tensor *qh = cm_permute(tp, cm_reshape(tp, q, 4, s4), perm); /* (B, H, T, D) */
    cm_tensor *kh = cm_permute(tp, cm_reshape(tp, k, 4, s4), perm);
    cm_tensor *vh = cm_permute(tp, cm_reshape(tp, v, 4, s4), perm);
    if (alibi) {
        cm_tensor *ab = cm_to_device(tp, alibi_bias(tp, H, T), cm_tensor_device(q));
        bias = bias ? cm_add(tp, bias, ab) : ab;
    }
    /* dropout on the probabilities: a plain Dropout runs fused inside cm_attention (same mask from
     * the module's generator as the explicit form); a replacement module needs the probabilities
     * explicitly */
    const bool drop = attn_drop && cm_module_is_training(attn_drop) &&
                      (!cmn_is_dropout(attn_drop) || cmn_dropout_p(attn_drop) > 0.0f);
    if (!drop || cmn_is_dropout(attn_drop)) {
        cm_attention_opts o = cm_attention_opts_default();
        o.causal = causal;
        o.bias = bias;
        o.key_padding_mask = kpm;
        o.out_bthd = true; /* heads merged by the op: the reshape below is a view, not a copy */
        if (drop) {
            o.dropout_p = cmn_dropout_p(attn_drop);
            o.rng = cm_nn_dropout_rng(attn_drop);
        }
        return cm_reshape(tp, cm_attention(tp, qh, kh, vh, &o), 3, s3); /* (B, T, H, D) → (B, T, C) */
    }
    /* explicit path: dropout on the probabilities */
    cm_tensor *sc = cm_mul_scalar(tp, cm_matmul(tp, qh, cm_transpose(tp, kh, -2, -1)), 1.0f / sqrtf((float)D));
    if (bias) sc = cm_add(tp, sc, bias);
    if (causal || kpm) sc = cm_add(tp, sc, cm_to_device(tp, mask_bias(tp, B, T, causal, kpm), cm_tensor_device(q)));
    cm_tensor *pr = cm_module_forward(attn_drop, tp, cm_softmax(tp, sc, -1)); /* (B, H, T, T) */
    cm_tensor *y = cm_matmul(tp, pr, vh);                                     /* (B, H, T, D) */
    return cm_reshape(tp, cm_permute(tp, y, perm), 3, s3);                     /* (B, T, C), a copy */
}

static cm_tensor *input(int n_in, cm_tensor *const *in, int i) { return i < n_in ? in[i] : NULL; }

/* Initialises a Linear/Conv1D child: weight N(0, std), bias 0. */
static void init_proj(cm_module *lin, cm_rng *rng, float std) {
    if (!rng) return;
    cm_tensor_init_normal(cm_module_param(lin, "weight"), rng, 0.0f, std);
}

static void free_self(void *self) { cm_free(self); }

static cm_status fail_build(cm_module **m, cm_status st) {
    cm_module_free(*m);
    *m = NULL;
    return st;
}

static cm_status new_mod(const cm_module_i *vt, size_t bytes, void **self, cm_module **out) {
    *out = NULL;
    *self = cm_alloc_zeroed(bytes, 8);
    if (!*self) return CM_ERR_OOM;
    cm_status st = cm_module_new(vt, *self, out);
    if (st) cm_free(*self);
    return st;
}

static void attn_desc(const cm_module *m, char *buf, size_t cap);

/* ---- GPT2Attention ---- */

typedef struct {
    cm_nn_attention_config cfg;
    cm_module *c_attn, *c_proj, *attn_dropout, *resid_dropout;
} gattn_s;

static cm_tensor *gattn_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    gattn_s *s = m->self;
    const int64_t C = s->cfg.d_model;
    cm_tensor *qkv = cm_module_forward(s->c_attn, tp, in[0]); /* (B, T, 3C) */
    if (!qkv) return NULL;
    if (cm_tensor_ndim(qkv) != 3 || cm_tensor_dim(qkv, 2) != 3 * C) {
        char sh[64];
        return cmn_fail(tp, CM_ERR_SHAPE, "c_attn gave %s; expected (B, T, 3·%lld) from x (B, T, %lld)",
                        cm_tensor_shape_str(qkv, sh, sizeof sh), (long long)C, (long long)C);
    }
    cm_tensor *q = cm_narrow(tp, qkv, 2, 0, C), *k = cm_narrow(tp, qkv, 2, C, C), *v = cm_narrow(tp, qkv, 2, 2 * C, C);
    cm_tensor *y = attn_core(tp, q, k, v, s->cfg.n_heads, s->cfg.causal, s->cfg.alibi, input(n_in, in, 1),
                             input(n_in, in, 2), s->attn_dropout);
    if (!y) return NULL;
    return cm_module_forward(s->resid_dropout, tp, cm_module_forward(s->c_proj, tp, y));
}

static const cm_module_i gattn_vt = {CM_MODULE_ABI, "GPT2Attention", gattn_fwd, free_self, attn_desc};

static void attn_desc(const cm_module *m, char *buf, size_t cap) {
    const cm_nn_attention_config *c = m->self; /* every attention state struct starts with its config */
    snprintf(buf, cap, "d_model=%lld, n_heads=%lld%s%s", (long long)c->d_model, (long long)c->n_heads,
             c->causal ? ", causal" : "", c->alibi ? ", alibi" : "");
}

static cm_status gattn_make(const cm_nn_attention_config *cfg, float proj_std, cm_rng *rng, cm_module **m) {
    gattn_s *s;
    cm_module *c = NULL;
    cm_status st = new_mod(&gattn_vt, sizeof *s, (void **)&s, m);
    if (st) return st;
    s->cfg = *cfg;
    const int64_t C = cfg->d_model;
    if ((st = cm_nn_conv1d_new(C, 3 * C, cfg->bias, NULL, &c)) ||
        (st = cm_module_add_child(*m, "c_attn", c, &s->c_attn)))
        goto fail;
    init_proj(c, rng, 0.02f);
    if ((st = cm_nn_conv1d_new(C, C, cfg->bias, NULL, &c)) || (st = cm_module_add_child(*m, "c_proj", c, &s->c_proj)))
        goto fail;
    init_proj(c, rng, proj_std);
    if ((st = cm_nn_dropout_new(cfg->attn_pdrop, &c)) ||
        (st = cm_module_add_child(*m, "attn_dropout", c, &s->attn_dropout)))
        goto fail;
    if ((st = cm_nn_dropout_new(cfg->resid_pdrop, &c)) ||
        (st = cm_module_add_child(*m, "resid_dropout", c, &s->resid_dropout)))
        goto fail;
    return CM_OK;
fail:
    if (c && !cm_module_parent(c)) cm_module_free(c);
    return fail_build(m, st);
}

cm_status cm_nn_attention_new(const cm_nn_attention_config *cfg, cm_rng *rng, cm_module **m) {
    if (!m) return cm_set_error(CM_ERR_INVALID_ARG, "cm_nn_attention_new: out is NULL");
    *m = NULL;
    cm_status st = check_cfg("cm_nn_attention_new", cfg);
    return st ? st : gattn_make(cfg, 0.02f, rng, m);
}

/* ---- GPT2MLP, GPT2Block ---- */

typedef struct {
    cm_nn_attention_config cfg;
    cm_module *c_fc, *c_proj, *dropout;
} mlp_s;

/* act(dense(x)); the bias and GELU fused when dense is a plain Linear/Conv1D with a bias. */
static cm_tensor *dense_act(cm_tape *tp, cm_module *dense, cm_activation act, cm_tensor *x) {
    cm_tensor *b = cm_nn_is_linear(dense) ? cm_module_param(dense, "bias") : NULL;
    if (b && (act == CM_ACT_GELU || act == CM_ACT_GELU_TANH)) {
        bool tr = false;
        cm_nn_linear_dims(dense, NULL, NULL, &tr);
        cm_tensor *w = cm_module_param(dense, "weight");
        cm_tensor *h = cm_linear(tp, x, tr ? cm_transpose(tp, w, 0, 1) : w, NULL);
        return cm_bias_gelu(tp, h, b, act == CM_ACT_GELU_TANH);
    }
    return cm_nn_activate(tp, cm_module_forward(dense, tp, x), act);
}

static cm_tensor *mlp_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    mlp_s *s = m->self;
    cm_tensor *h = dense_act(tp, s->c_fc, s->cfg.act, in[0]);
    return cm_module_forward(s->dropout, tp, cm_module_forward(s->c_proj, tp, h));
}
static const cm_module_i mlp_vt = {CM_MODULE_ABI, "GPT2MLP", mlp_fwd, free_self, NULL};

typedef struct {
    cm_nn_attention_config cfg;
    cm_module *ln_1, *attn, *ln_2, *mlp;
} gblock_s;

static cm_tensor *gblock_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    gblock_s *s = m->self;
    cm_tensor *x = in[0];
    cm_tensor *a_in[3] = {cm_module_forward(s->ln_1, tp, x), input(n_in, in, 1), input(n_in, in, 2)};
    if (!a_in[0]) return NULL;
    cm_tensor *h = cm_add(tp, x, cm_module_forward_n(s->attn, tp, 3, a_in)); /* (B, T, C) */
    return cm_add(tp, h, cm_module_forward(s->mlp, tp, cm_module_forward(s->ln_2, tp, h)));
}
static const cm_module_i gblock_vt = {CM_MODULE_ABI, "GPT2Block", gblock_fwd, free_self, attn_desc};

cm_status cm_nn_gpt_block_new(const cm_nn_attention_config *cfg, int n_layer, cm_rng *rng, cm_module **m) {
    if (!m) return cm_set_error(CM_ERR_INVALID_ARG, "cm_nn_gpt_block_new: out is NULL");
    *m = NULL;
    cm_status st = check_cfg("cm_nn_gpt_block_new", cfg);
    if (st) return st;
    gblock_s *s;
    if ((st = new_mod(&gblock_vt, sizeof *s, (void **)&s, m))) return st;
    s->cfg = *cfg;
    const int64_t C = cfg->d_model, F = (int64_t)(cfg->mlp_ratio * (float)C);
    const float proj_std = n_layer > 0 ? 0.02f / sqrtf(2.0f * (float)n_layer) : 0.02f;
    cm_module *c = NULL, *mlp = NULL;
    mlp_s *ms = NULL;
    if ((st = cm_nn_layer_norm_new(C, cfg->ln_eps, true, &c)) || (st = cm_module_add_child(*m, "ln_1", c, &s->ln_1)))
        goto fail;
    c = NULL;
    if ((st = gattn_make(cfg, proj_std, rng, &c)) || (st = cm_module_add_child(*m, "attn", c, &s->attn))) goto fail;
    c = NULL;
    if ((st = cm_nn_layer_norm_new(C, cfg->ln_eps, true, &c)) || (st = cm_module_add_child(*m, "ln_2", c, &s->ln_2)))
        goto fail;
    c = NULL;
    if ((st = new_mod(&mlp_vt, sizeof *ms, (void **)&ms, &mlp)) || (st = cm_module_add_child(*m, "mlp", mlp, &s->mlp)))
        goto fail;
    ms->cfg = *cfg;
    if ((st = cm_nn_conv1d_new(C, F, cfg->bias, NULL, &c)) || (st = cm_module_add_child(mlp, "c_fc", c, &ms->c_fc)))
        goto fail;
    init_proj(c, rng, 0.02f);
    c = NULL;
    if ((st = cm_nn_conv1d_new(F, C, cfg->bias, NULL, &c)) ||
        (st = cm_module_add_child(mlp, "c_proj", c, &ms->c_proj)))
        goto fail;
    init_proj(c, rng, proj_std);
    c = NULL;
    if ((st = cm_nn_dropout_new(cfg->resid_pdrop, &c)) || (st = cm_module_add_child(mlp, "dropout", c, &ms->dropout)))
        goto fail;
    return CM_OK;
fail:
    if (c && !cm_module_parent(c)) cm_module_free(c);
    if (mlp && !cm_module_parent(mlp)) cm_module_free(mlp);
    return fail_build(m, st);
}

/* ---- BERT ---- */

typedef struct {
    cm_nn_attention_config cfg;
    cm_module *a, *b, *c, *d; /* per type: see the constructors */
} bert_s;

/* BertSelfAttention: a = query, b = key, c = value, d = dropout (on the probabilities) */
static cm_tensor *bself_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    bert_s *s = m->self;
    cm_tensor *x = in[0];
    return attn_core(tp, cm_module_forward(s->a, tp, x), cm_module_forward(s->b, tp, x),
                     cm_module_forward(s->c, tp, x), s->cfg.n_heads, s->cfg.causal, s->cfg.alibi, input(n_in, in, 1),
                     input(n_in, in, 2), s->d);
}
/* BertSelfOutput / BertOutput: a = dense, b = LayerNorm, c = dropout; in[1] is the residual */
static cm_tensor *bout_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    bert_s *s = m->self;
    cm_tensor *res = input(n_in, in, 1);
    if (!res) return cmn_fail(tp, CM_ERR_INVALID_ARG, "input 1 (the residual) is NULL");
    cm_tensor *h = cm_module_forward(s->c, tp, cm_module_forward(s->a, tp, in[0]));
    return cm_module_forward(s->b, tp, cm_add(tp, h, res));
}
/* BertAttention: a = self, b = output */
static cm_tensor *battn_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    bert_s *s = m->self;
    cm_tensor *a_in[3] = {in[0], input(n_in, in, 1), input(n_in, in, 2)};
    cm_tensor *o_in[2] = {cm_module_forward_n(s->a, tp, 3, a_in), in[0]};
    return o_in[0] ? cm_module_forward_n(s->b, tp, 2, o_in) : NULL;
}
/* BertIntermediate: a = dense */
static cm_tensor *binter_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    bert_s *s = m->self;
    return dense_act(tp, s->a, s->cfg.act, in[0]);
}
/* BertLayer: a = attention, b = intermediate, c = output */
static cm_tensor *blayer_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    bert_s *s = m->self;
    cm_tensor *a_in[3] = {in[0], input(n_in, in, 1), input(n_in, in, 2)};
    cm_tensor *h = cm_module_forward_n(s->a, tp, 3, a_in);
    if (!h) return NULL;
    cm_tensor *o_in[2] = {cm_module_forward(s->b, tp, h), h};
    return o_in[0] ? cm_module_forward_n(s->c, tp, 2, o_in) : NULL;
}

static const cm_module_i bself_vt = {CM_MODULE_ABI, "BertSelfAttention", bself_fwd, free_self, attn_desc};
static const cm_module_i bselfout_vt = {CM_MODULE_ABI, "BertSelfOutput", bout_fwd, free_self, NULL};
static const cm_module_i battn_vt = {CM_MODULE_ABI, "BertAttention", battn_fwd, free_self, NULL};
static const cm_module_i binter_vt = {CM_MODULE_ABI, "BertIntermediate", binter_fwd, free_self, NULL};
static const cm_module_i bout_vt = {CM_MODULE_ABI, "BertOutput", bout_fwd, free_self, NULL};
static const cm_module_i blayer_vt = {CM_MODULE_ABI, "BertLayer", blayer_fwd, free_self, attn_desc};

/* Adds a child the caller just made (made = the constructor's status); frees it if adding fails.
 * Call the constructor in a statement of its own: argument evaluation order is unspecified. */
static cm_status adopt(cm_module *parent, const char *name, cm_status made, cm_module *child, cm_module **slot) {
    if (made) return made;
    cm_status st = cm_module_add_child(parent, name, child, slot);
    if (st) cm_module_free(child);
    return st;
}

static cm_status bert_linear(cm_module *parent, const char *name, int64_t in, int64_t out, bool bias, cm_rng *rng,
                             cm_module **slot) {
    cm_module *c = NULL;
    cm_status st = cm_nn_linear_new(in, out, bias, NULL, &c);
    if ((st = adopt(parent, name, st, c, slot))) return st;
    init_proj(c, rng, 0.02f);
    return CM_OK;
}

static cm_status bert_node(cm_module *parent, const char *name, const cm_module_i *vt, const cm_nn_attention_config *cfg,
                           cm_module **slot, bert_s **s) {
    cm_module *c = NULL;
    cm_status st = new_mod(vt, sizeof **s, (void **)s, &c);
    if (!st) (*s)->cfg = *cfg;
    return adopt(parent, name, st, c, slot);
}

/* dense (in → out), LayerNorm, dropout under `parent` (state s): BertSelfOutput / BertOutput */
static cm_status bert_out(cm_module *p, bert_s *s, int64_t in, int64_t out, cm_rng *rng) {
    cm_module *c = NULL;
    cm_status st;
    if ((st = bert_linear(p, "dense", in, out, s->cfg.bias, rng, &s->a))) return st;
    st = cm_nn_layer_norm_new(out, s->cfg.ln_eps, true, &c);
    if ((st = adopt(p, "LayerNorm", st, c, &s->b))) return st;
    st = cm_nn_dropout_new(s->cfg.resid_pdrop, &c);
    return adopt(p, "dropout", st, c, &s->c);
}

cm_status cm_nn_bert_layer_new(const cm_nn_attention_config *cfg, cm_rng *rng, cm_module **m) {
    if (!m) return cm_set_error(CM_ERR_INVALID_ARG, "cm_nn_bert_layer_new: out is NULL");
    *m = NULL;
    cm_status st = check_cfg("cm_nn_bert_layer_new", cfg);
    if (st) return st;
    bert_s *L, *A, *S, *SO, *I, *O;
    if ((st = new_mod(&blayer_vt, sizeof *L, (void **)&L, m))) return st;
    L->cfg = *cfg;
    const int64_t C = cfg->d_model, F = (int64_t)(cfg->mlp_ratio * (float)C);
    cm_module *attn, *self, *d = NULL;
    if ((st = bert_node(*m, "attention", &battn_vt, cfg, &L->a, &A))) goto fail;
    attn = L->a;
    if ((st = bert_node(attn, "self", &bself_vt, cfg, &A->a, &S))) goto fail;
    self = A->a;
    if ((st = bert_linear(self, "query", C, C, cfg->bias, rng, &S->a)) ||
        (st = bert_linear(self, "key", C, C, cfg->bias, rng, &S->b)) ||
        (st = bert_linear(self, "value", C, C, cfg->bias, rng, &S->c)))
        goto fail;
    st = cm_nn_dropout_new(cfg->attn_pdrop, &d);
    if ((st = adopt(self, "dropout", st, d, &S->d))) goto fail;
    if ((st = bert_node(attn, "output", &bselfout_vt, cfg, &A->b, &SO)) || (st = bert_out(A->b, SO, C, C, rng)))
        goto fail;
    if ((st = bert_node(*m, "intermediate", &binter_vt, cfg, &L->b, &I)) ||
        (st = bert_linear(L->b, "dense", C, F, cfg->bias, rng, &I->a)))
        goto fail;
    if ((st = bert_node(*m, "output", &bout_vt, cfg, &L->c, &O)) || (st = bert_out(L->c, O, F, C, rng))) goto fail;
    return CM_OK;
fail:
    return fail_build(m, st);
}

/* ---- reading and retuning ---- */

static bool is_attention_family(const cm_module *m) {
    const cm_module_i *vt = m ? m->vt : NULL;
    return vt == &gattn_vt || vt == &mlp_vt || vt == &gblock_vt || vt == &bself_vt || vt == &bselfout_vt ||
           vt == &battn_vt || vt == &binter_vt || vt == &bout_vt || vt == &blayer_vt;
}

cm_status cm_nn_attention_config_of(const cm_module *m, cm_nn_attention_config *out) {
    if (!is_attention_family(m) || !out)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_nn_attention_config_of: the module is %s%s, not a GPT-2 or BERT "
                                                "transformer module", m ? "a " : "", m ? m->vt->type_name : "NULL");
    *out = *(const cm_nn_attention_config *)m->self; /* every state struct here starts with its config */
    return CM_OK;
}

cm_status cm_nn_attention_set_alibi(cm_module *m, bool on) {
    if (!m || (m->vt != &gattn_vt && m->vt != &bself_vt))
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_nn_attention_set_alibi: the module is %s%s, not a GPT2Attention "
                                                "or BertSelfAttention", m ? "a " : "", m ? m->vt->type_name : "NULL");
    ((cm_nn_attention_config *)m->self)->alibi = on;
    return CM_OK;
}
