/* GPT-2: configuration and presets, the module tree with Hugging Face's names, the cm_model
 * (fields, loss, metrics, FLOPs) and weights in and out. Generation is in generate.c. */
#include "zoo/gpt2_impl.h"

#include <composer/safetensors.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Configuration
 * ------------------------------------------------------------------------------------------- */

cm_gpt2_config cm_gpt2_config_default(void) {
    cm_gpt2_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 50257;
    c.n_positions = 1024;
    c.n_embd = 768;
    c.n_layer = 12;
    c.n_head = 12;
    c.embd_pdrop = c.attn_pdrop = c.resid_pdrop = 0.1f;
    c.layer_norm_eps = 1e-5f;
    c.activation = CM_ACT_GELU_TANH;
    c.tie_word_embeddings = true;
    c.bias = true;
    c.initializer_range = 0.02f;
    return c;
}

typedef struct {
    const char *name;
    int64_t V, P, C, L, H;
    float dropout; /* < 0: keep the default */
} preset;

static const preset presets[] = {
    {"gpt2", 50257, 1024, 768, 12, 12, -1},
    {"gpt2-medium", 50257, 1024, 1024, 24, 16, -1},
    {"gpt2-large", 50257, 1024, 1280, 36, 20, -1},
    {"gpt2-xl", 50257, 1024, 1600, 48, 25, -1},
    {"shakespeare-char", 65, 256, 384, 6, 6, 0.2f},
    {"tiny", 96, 32, 32, 2, 4, 0.0f},
};
#define N_PRESETS ((int)(sizeof presets / sizeof presets[0]))

const char *cm_gpt2_preset_names(void) { return "gpt2, gpt2-medium, gpt2-large, gpt2-xl, shakespeare-char, tiny"; }

cm_status cm_gpt2_config_preset(const char *name, cm_gpt2_config *out) {
    if (!name || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_gpt2_config_preset: NULL name or out");
    int best = 0, best_d = 1 << 30;
    for (int i = 0; i < N_PRESETS; i++) {
        if (!strcmp(name, presets[i].name)) {
            const preset *p = &presets[i];
            cm_gpt2_config c = cm_gpt2_config_default();
            c.vocab_size = p->V, c.n_positions = p->P, c.n_embd = p->C, c.n_layer = p->L, c.n_head = p->H;
            if (p->dropout >= 0) c.embd_pdrop = c.attn_pdrop = c.resid_pdrop = p->dropout;
            *out = c;
            return CM_OK;
        }
        int d = cm_edit_distance(name, presets[i].name);
        if (d < best_d) best_d = d, best = i;
    }
    return cm_set_error(CM_ERR_NOT_FOUND, "unknown GPT-2 preset '%s' (did you mean '%s'? presets: %s)", name,
                        presets[best].name, cm_gpt2_preset_names());
}

cm_status cm_gpt2_config_check(const cm_gpt2_config *c) {
    if (!c) return cm_set_error(CM_ERR_INVALID_ARG, "GPT-2 config is NULL");
    const struct {
        const char *name;
        int64_t v;
    } sizes[] = {{"vocab_size", c->vocab_size},
                 {"n_positions", c->n_positions},
                 {"n_embd", c->n_embd},
                 {"n_layer", c->n_layer},
                 {"n_head", c->n_head}};
    for (int i = 0; i < 5; i++)
        if (sizes[i].v < 1)
            return cm_set_error(CM_ERR_INVALID_ARG, "GPT-2 config: %s = %lld must be at least 1", sizes[i].name,
                                (long long)sizes[i].v);
    if (c->n_embd % c->n_head)
        return cm_set_error(CM_ERR_INVALID_ARG, "GPT-2 config: n_embd = %lld is not a multiple of n_head = %lld",
                            (long long)c->n_embd, (long long)c->n_head);
    const struct {
        const char *name;
        float p;
    } drops[] = {{"embd_pdrop", c->embd_pdrop}, {"attn_pdrop", c->attn_pdrop}, {"resid_pdrop", c->resid_pdrop}};
    for (int i = 0; i < 3; i++)
        if (!(drops[i].p >= 0 && drops[i].p <= 1))
            return cm_set_error(CM_ERR_INVALID_ARG, "GPT-2 config: %s = %g is not in [0, 1]", drops[i].name,
                                drops[i].p);
    if (!(c->layer_norm_eps >= 0) || !(c->initializer_range >= 0))
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "GPT-2 config: layer_norm_eps = %g and initializer_range = %g must be >= 0",
                            c->layer_norm_eps, c->initializer_range);
    if ((int)c->activation < 0 || c->activation > CM_ACT_IDENTITY)
        return cm_set_error(CM_ERR_INVALID_ARG, "GPT-2 config: unknown activation %d", (int)c->activation);
    return CM_OK;
}

int64_t cm_gpt2_config_n_params(const cm_gpt2_config *c, bool non_embedding) {
    if (!c || c->n_layer < 1 || c->n_embd < 1 || c->vocab_size < 1 || c->n_positions < 1) return -1;
    const int64_t V = c->vocab_size, P = c->n_positions, C = c->n_embd, L = c->n_layer;
    /* per block: 2 LayerNorms (4C), c_attn C·3C, c_proj C·C, c_fc C·4C, c_proj 4C·C; biases 9C */
    const int64_t block = 4 * C + 12 * C * C + (c->bias ? 9 * C : 0);
    int64_t n = V * C + P * C + L * block + 2 * C + (c->tie_word_embeddings ? 0 : V * C);
    return non_embedding ? n - P * C : n;
}

/* ---------------------------------------------------------------------------------------------
 * Modules
 * ------------------------------------------------------------------------------------------- */

static void free_self(void *self) { cm_free(self); }

int64_t gpt2_positions(const gpt2_body *b) {
    int64_t rows;
    return cm_nn_embedding_dims(b->wpe, &rows, NULL) == CM_OK ? rows : b->cfg.n_positions;
}

cm_tensor *gpt2_embed(cm_tape *tp, gpt2_body *b, cm_tensor *ids, int64_t pos0) {
    if (!ids || cm_tape_status(tp)) return NULL;
    char s[64];
    if (cm_tensor_ndim(ids) != 2) {
        cm_tape_fail(tp, CM_ERR_SHAPE, "GPT-2: input_ids %s must be (B, T)", cm_tensor_shape_str(ids, s, sizeof s));
        return NULL;
    }
    const int64_t T = cm_tensor_dim(ids, 1), P = gpt2_positions(b);
    if (pos0 + T > P) {
        cm_tape_fail(tp, CM_ERR_SHAPE,
                     "GPT-2: %lld positions do not fit the model's n_positions = %lld (input_ids %s): use shorter "
                     "sequences or a model with more positions",
                     (long long)(pos0 + T), (long long)P, cm_tensor_shape_str(ids, s, sizeof s));
        return NULL;
    }
    cm_tensor *tok = cm_module_forward(b->wte, tp, ids); /* (B, T, C) */
    cm_tensor *pos = cm_arange(tp, CM_DTYPE_I64, (double)pos0, (double)(pos0 + T), 1);
    cm_tensor *pe = cm_module_forward(b->wpe, tp, pos); /* (T, C) */
    return cm_add(tp, tok, pe);
}

/* GPT2Model: in[0] input_ids (B, T), in[1] optional attention mask (B, T) → hidden (B, T, C). */
static cm_tensor *body_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    gpt2_body *b = cm_module_self(m);
    cm_tensor *x = cm_module_forward(b->drop, tp, gpt2_embed(tp, b, in[0], 0));
    cm_tensor *args[3] = {x, n_in > 1 ? in[1] : NULL, NULL};
    for (int i = 0; x && i < cm_module_n_children(b->h); i++) {
        args[0] = x;
        x = cm_module_forward_n(cm_module_child_at(b->h, i), tp, 3, args);
    }
    return x ? cm_module_forward(b->ln_f, tp, x) : NULL;
}

static void body_desc(const cm_module *m, char *buf, size_t cap) {
    const cm_gpt2_config *c = cm_module_self(m);
    snprintf(buf, cap, "vocab=%lld, positions=%lld, n_embd=%lld, n_layer=%lld, n_head=%lld", (long long)c->vocab_size,
             (long long)c->n_positions, (long long)c->n_embd, (long long)c->n_layer, (long long)c->n_head);
}

static const cm_module_i body_vt = {CM_MODULE_ABI, "GPT2Model", body_fwd, free_self, body_desc};

/* GPT2LMHeadModel: logits (B, T, V). */
static cm_tensor *root_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    gpt2_root *r = cm_module_self(m);
    cm_tensor *h = cm_module_forward_n(r->transformer, tp, n_in, in);
    return h && !r->hidden_only ? cm_module_forward(r->lm_head, tp, h) : h;
}

static const cm_module_i root_vt = {CM_MODULE_ABI, "GPT2LMHeadModel", root_fwd, free_self, body_desc};

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* Adds a child the caller just made (made = the constructor's status); frees it if adding fails. */
static cm_status adopt(cm_module *parent, const char *name, cm_status made, cm_module *child, cm_module **slot) {
    if (made) return made;
    cm_status st = cm_module_add_child(parent, name, child, slot);
    if (st) cm_module_free(child);
    return st;
}

static cm_status build(const cm_gpt2_config *c, cm_module **out) {
    cm_status st;
    gpt2_root *r = cm_alloc_zeroed(sizeof *r, 8);
    if (!r) return CM_ERR_OOM;
    if ((st = cm_module_new(&root_vt, r, out))) {
        cm_free(r);
        return st;
    }
    r->cfg = *c;
    cm_module *root = *out, *mod = NULL;
    gpt2_body *b = cm_alloc_zeroed(sizeof *b, 8);
    if (!b) return CM_ERR_OOM;
    if ((st = cm_module_new(&body_vt, b, &mod))) {
        cm_free(b);
        return st;
    }
    b->cfg = *c;
    if ((st = adopt(root, "transformer", CM_OK, mod, &r->transformer))) return st;
    cm_module *tr = r->transformer;
    const int64_t V = c->vocab_size, P = c->n_positions, C = c->n_embd;
    st = cm_nn_embedding_new(V, C, NULL, &mod);
    if ((st = adopt(tr, "wte", st, mod, &b->wte))) return st;
    st = cm_nn_embedding_new(P, C, NULL, &mod);
    if ((st = adopt(tr, "wpe", st, mod, &b->wpe))) return st;
    st = cm_nn_dropout_new(c->embd_pdrop, &mod);
    if ((st = adopt(tr, "drop", st, mod, &b->drop))) return st;
    st = cm_nn_module_list_new(&mod);
    if ((st = adopt(tr, "h", st, mod, &b->h))) return st;
    cm_nn_attention_config ac = cm_nn_attention_config_default(C, c->n_head);
    ac.bias = c->bias;
    ac.attn_pdrop = c->attn_pdrop;
    ac.resid_pdrop = c->resid_pdrop;
    ac.ln_eps = c->layer_norm_eps;
    ac.act = c->activation;
    for (int64_t i = 0; i < c->n_layer; i++) {
        if ((st = cm_nn_gpt_block_new(&ac, (int)c->n_layer, NULL, &mod))) return st;
        if ((st = cm_nn_sequential_append(b->h, mod))) {
            cm_module_free(mod);
            return st;
        }
        if ((st = cm_module_set_wrap_unit(mod, NULL))) return st;
    }
    st = cm_nn_layer_norm_new(C, c->layer_norm_eps, true, &mod);
    if ((st = adopt(tr, "ln_f", st, mod, &b->ln_f))) return st;
    st = cm_nn_linear_new(C, V, false, NULL, &mod);
    if ((st = adopt(root, "lm_head", st, mod, &r->lm_head))) return st;
    if ((st = cm_module_set_wrap_unit(b->wte, "embeddings")) || (st = cm_module_set_wrap_unit(b->wpe, "embeddings")) ||
        (st = cm_module_set_wrap_unit(b->ln_f, NULL)))
        return st;
    if (c->tie_word_embeddings) {
        if ((st = cm_module_tie_param(r->lm_head, "weight", cm_module_param(b->wte, "weight")))) return st;
    } else if ((st = cm_module_set_wrap_unit(r->lm_head, NULL))) {
        return st;
    }
    return cm_module_finalize(root);
}

/* Hugging Face / nanoGPT initialisation, in parameter order so it is reproducible from rng. */
static void init_weights(cm_module *root, const cm_gpt2_config *c, cm_rng *rng) {
    const float std = c->initializer_range, proj_std = std / sqrtf(2.0f * (float)c->n_layer);
    for (int64_t i = 0; i < cm_module_n_params(root); i++) {
        cm_param_info p = cm_module_param_info(root, i);
        if (cm_tensor_ndim(p.tensor) != 2) continue; /* biases stay 0, LayerNorms 1 and 0 */
        cm_tensor_init_normal(p.tensor, rng, 0.0f, ends_with(p.name, "c_proj.weight") ? proj_std : std);
    }
}

cm_status cm_gpt2_module_new(const cm_gpt2_config *cfg, cm_rng *rng, cm_module **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_gpt2_module_new: out is NULL");
    *out = NULL;
    cm_status st = cm_gpt2_config_check(cfg);
    if (st) return st;
    if ((st = build(cfg, out))) {
        cm_module_free(*out);
        *out = NULL;
        return st;
    }
    if (rng) init_weights(*out, cfg, rng);
    return CM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * The model
 * ------------------------------------------------------------------------------------------- */

static cm_tensor *field(cm_tape *tp, const cm_model_batch *b, const char *name) {
    cm_tensor *t = cm_model_batch_field(b, name);
    if (!t) {
        char fl[256];
        size_t len = 0;
        fl[0] = '\0';
        for (int i = 0; i < b->n && len < sizeof fl; i++)
            len += (size_t)snprintf(fl + len, sizeof fl - len, "%s%s", i ? ", " : "", b->names[i] ? b->names[i] : "?");
        cm_tape_fail(tp, CM_ERR_NOT_FOUND, "GPT2LMHeadModel: the batch has no field '%s' (fields: %s)", name,
                     b->n ? fl : "none");
    }
    return t;
}

static cm_tensor *m_forward(void *self, cm_tape *tp, const cm_model_batch *b) {
    gpt2_model *g = self;
    cm_tensor *ids = field(tp, b, "input_ids");
    if (!ids) return NULL;
    cm_tensor *in[2] = {ids, cm_model_batch_field(b, "attention_mask")};
    gpt2_root *r = cm_module_self(g->root);
    /* fused loss: a forward that records gradients stops at ln_f (no (B, T, V) logits); one
     * without (evaluation, prediction) returns the logits as always */
    r->hidden_only = g->fused && cm_tape_grad_enabled(tp);
    cm_tensor *out = cm_module_forward_n(g->root, tp, in[1] ? 2 : 1, in);
    g->fused_h = r->hidden_only ? out : NULL;
    g->fused_ready = false; /* a new microbatch: its metrics wait for its loss */
    r->hidden_only = false;
    return out;
}

static cm_tensor *m_loss(void *self, cm_tape *tp, cm_tensor *logits, const cm_model_batch *b) {
    gpt2_model *g = self;
    cm_tensor *labels = field(tp, b, "labels");
    if (!labels) return NULL;
    char s1[64], s2[64];
    /* the hidden states (B, T, C) the last forward returned: lm_head + loss fused */
    if (g->fused && logits && logits == g->fused_h && cm_tensor_ndim(logits) == 3 &&
        cm_tensor_dim(logits, 2) == g->cfg.n_embd) {
        const gpt2_root *r = cm_module_self(g->root);
        cm_tensor *w = cm_module_param(r->lm_head, "weight"); // (V, C), wte's when tied
        if (cm_tensor_ndim(labels) != 2 || cm_tensor_dim(labels, 0) != cm_tensor_dim(logits, 0) ||
            cm_tensor_dim(labels, 1) != cm_tensor_dim(logits, 1)) {
            cm_tape_fail(tp, CM_ERR_SHAPE, "GPT2LMHeadModel: labels %s must be (B, T) for hidden states %s (B, T, C)",
                         cm_tensor_shape_str(labels, s1, sizeof s1), cm_tensor_shape_str(logits, s2, sizeof s2));
            return NULL;
        }
        cm_tensor *loss = cm_linear_cross_entropy(tp, logits, w, labels, NULL, g->chunk_rows);
        /* for the training metrics, which the trainer updates next (on a GPU this read waits for
         * the forward, as the metrics' own read would) */
        g->fused_ready = loss != NULL;
        if (loss) g->fused_mean = cm_tensor_get_flat(loss, 0);
        return loss;
    }
    if (cm_tensor_ndim(logits) != 3 || cm_tensor_ndim(labels) != 2 ||
        cm_tensor_dim(labels, 0) != cm_tensor_dim(logits, 0) || cm_tensor_dim(labels, 1) != cm_tensor_dim(logits, 1)) {
        cm_tape_fail(tp, CM_ERR_SHAPE, "GPT2LMHeadModel: labels %s must be (B, T) for logits %s (B, T, V)",
                     cm_tensor_shape_str(labels, s1, sizeof s1), cm_tensor_shape_str(logits, s2, sizeof s2));
        return NULL;
    }
    const int64_t V = cm_tensor_dim(logits, 2), N = cm_tensor_dim(logits, 0) * cm_tensor_dim(logits, 1);
    const int64_t ls[2] = {N, V}, ts[1] = {N};
    return cm_cross_entropy(tp, cm_reshape(tp, logits, 2, ls), cm_reshape(tp, labels, 1, ts), NULL);
}

/* Training metrics of the fused loss: LanguageCrossEntropy and LanguagePerplexity with the built-in
 * ones' state {Σ loss, counted targets}, read from the loss of the microbatch just computed (the
 * trainer updates metrics right after the loss) instead of from logits that were never made. */
static cm_status fused_metric_update(const void *self, cm_tensor *outputs, const cm_model_batch *b, double *state) {
    gpt2_model *g = (gpt2_model *)self;
    (void)outputs;
    cm_tensor *labels = cm_model_batch_field(b, "labels");
    if (!g->fused_ready)
        return cm_set_error(CM_ERR_STATE, "GPT2LMHeadModel: the fused loss's training metrics read the loss of the "
                                          "microbatch just computed, and there is none (call the loss first)");
    if (!labels) return cm_set_error(CM_ERR_NOT_FOUND, "GPT2LMHeadModel: training metrics: the batch has no 'labels'");
    const int64_t n = cm_tensor_numel(labels);
    int64_t counted = 0;
    for (int64_t i = 0; i < n; i++) counted += cm_tensor_get_flat(labels, i) != -100.0;
    state[0] += counted ? g->fused_mean * (double)counted : 0.0;
    state[1] += (double)counted;
    return CM_OK;
}
static double fused_ce_compute(const void *self, const double *state) {
    (void)self;
    return state[1] > 0 ? state[0] / state[1] : NAN;
}
static double fused_ppl_compute(const void *self, const double *state) { return exp(fused_ce_compute(self, state)); }
static const cm_metric_i fused_ce_vt = {CM_METRIC_ABI, "LanguageCrossEntropy", 2, fused_metric_update, fused_ce_compute};
static const cm_metric_i fused_ppl_vt = {CM_METRIC_ABI, "LanguagePerplexity", 2, fused_metric_update, fused_ppl_compute};

static int m_n_metrics(void *self, bool train) { return 2; }
static cm_metric m_metric(void *self, bool train, int i) {
    const gpt2_model *g = self;
    if (train && g->fused) return (cm_metric){i == 0 ? &fused_ce_vt : &fused_ppl_vt, self};
    return i == 0 ? cm_metric_cross_entropy("labels") : cm_metric_perplexity("labels");
}

static double m_flops(void *self, const cm_model_batch *b) {
    gpt2_model *g = self;
    cm_tensor *ids = cm_model_batch_field(b, "input_ids");
    const double T = ids && cm_tensor_ndim(ids) == 2 ? (double)cm_tensor_dim(ids, 1) : (double)g->cfg.n_positions;
    /* N leaves the position embedding out (as nanoGPT), whatever its size (ALiBi's is zero-filled) */
    const gpt2_root *r = cm_module_self(g->root);
    const gpt2_body *body = cm_module_self(r->transformer);
    const double N = (double)(cm_module_count_params(g->root, false) - cm_module_count_params(body->wpe, false));
    return 6.0 * N * T + 12.0 * (double)g->cfg.n_layer * (double)g->cfg.n_embd * T * T;
}

static cm_module *m_module(void *self) { return ((gpt2_model *)self)->root; }
static void m_free(void *self) {
    gpt2_model *g = self;
    cm_module_free(g->root);
    cm_free(g);
}

static const cm_model_i gpt2_vt = {CM_MODEL_ABI, "GPT2LMHeadModel", m_forward, m_loss, NULL, m_n_metrics,
                                   m_metric, m_flops, m_module, m_free};

cm_status cm_gpt2_new(const cm_gpt2_config *cfg, cm_rng *rng, cm_model **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_gpt2_new: out is NULL");
    *out = NULL;
    cm_module *root;
    cm_status st = cm_gpt2_module_new(cfg, rng, &root);
    if (st) return st;
    gpt2_model *g = cm_alloc_zeroed(sizeof *g, 8);
    if (!g) {
        cm_module_free(root);
        return CM_ERR_OOM;
    }
    g->cfg = *cfg;
    g->root = root;
    if ((st = cm_model_new(&gpt2_vt, g, out))) m_free(g);
    return st;
}

bool cm_model_is_gpt2(const cm_model *m) { return gpt2_root_of(m) != NULL; }

cm_status cm_gpt2_set_fused_linear_cross_entropy(cm_model *m, bool on, int64_t chunk_rows) {
    if (!gpt2_root_of(m))
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_gpt2_set_fused_linear_cross_entropy: the model is %s, not a GPT-2 made by cm_gpt2_new",
                            m ? cm_model_type_name(m) : "NULL");
    if (chunk_rows < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_gpt2_set_fused_linear_cross_entropy: chunk_rows %lld must be >= 0 (0: automatic)",
                            (long long)chunk_rows);
    gpt2_model *g = cm_model_self(m);
    g->fused = on;
    g->chunk_rows = chunk_rows;
    g->fused_h = NULL;
    g->fused_ready = false;
    return CM_OK;
}

gpt2_root *gpt2_root_of(const cm_model *m) {
    if (!m || strcmp(cm_model_type_name(m), "GPT2LMHeadModel")) return NULL;
    cm_module *root = cm_model_module(m);
    return root && cm_module_vtable(root) == &root_vt ? cm_module_self(root) : NULL;
}

const cm_gpt2_config *cm_gpt2_model_config(const cm_model *m) {
    gpt2_root *r = gpt2_root_of(m);
    return r ? &r->cfg : NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Weights
 * ------------------------------------------------------------------------------------------- */

typedef struct {
    const cm_load_opts *user;
} rename_ctx;

/* The caller's rename first, then "transformer." in front of GPT2Model names. */
static bool gpt2_rename(const char *file_name, char *buf, size_t cap, void *data) {
    const rename_ctx *rc = data;
    char tmp[512];
    const char *name = file_name;
    bool changed = false;
    if (rc->user->rename && rc->user->rename(file_name, tmp, sizeof tmp, rc->user->rename_data))
        name = tmp, changed = true;
    if (strncmp(name, "transformer.", 12) && strncmp(name, "lm_head.", 8)) {
        snprintf(buf, cap, "transformer.%s", name);
        return true;
    }
    if (changed) snprintf(buf, cap, "%s", name);
    return changed;
}

static const char *const mask_globs[2] = {"*.attn.bias", "*.attn.masked_bias"};

static cm_status has_wte(const char *path, bool *found);

cm_status cm_gpt2_load_safetensors(cm_model *m, const char *path, const cm_load_opts *opts, cm_load_report *report) {
    if (!gpt2_root_of(m))
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "cm_gpt2_load_safetensors: the model is %s, not a GPT-2 made by cm_gpt2_new",
                            m ? cm_model_type_name(m) : "NULL");
    if (!path) return cm_set_error(CM_ERR_INVALID_ARG, "cm_gpt2_load_safetensors: path is NULL");
    cm_load_opts user = opts ? *opts : cm_load_opts_default();
    /* A tied model takes wte from transformer.wte.weight when the file has it, whatever the order
     * of the file's names; a stored lm_head.weight is then redundant (HF state_dicts hold both). */
    bool skip_head = false;
    cm_status st;
    if (gpt2_root_of(m)->cfg.tie_word_embeddings && (st = has_wte(path, &skip_head))) return st;
    const int n_ignore = (user.n_ignore > 0 ? user.n_ignore : 0) + 2 + skip_head;
    const char **ignore = cm_alloc(sizeof(char *) * (size_t)n_ignore, 8);
    if (!ignore) return CM_ERR_OOM;
    int k = 0;
    for (int i = 0; i < user.n_ignore; i++) ignore[k++] = user.ignore[i];
    ignore[k++] = mask_globs[0];
    ignore[k++] = mask_globs[1];
    if (skip_head) ignore[k++] = "lm_head.weight";
    rename_ctx rc = {&user};
    cm_load_opts o = user;
    o.ignore = ignore;
    o.n_ignore = n_ignore;
    o.rename = gpt2_rename;
    o.rename_data = &rc;
    st = cm_module_load_safetensors(cm_model_module(m), path, &o, report);
    cm_free(ignore);
    return st;
}

cm_status cm_gpt2_save_safetensors(cm_model *m, const char *path) {
    return cm_gpt2_save_safetensors_with(m, path, NULL, 0);
}

cm_status cm_gpt2_save_safetensors_with(cm_model *m, const char *path, const char *const *meta, int n_meta) {
    if (!gpt2_root_of(m))
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "cm_gpt2_save_safetensors: the model is %s, not a GPT-2 made by cm_gpt2_new",
                            m ? cm_model_type_name(m) : "NULL");
    if (n_meta < 0 || n_meta > 8 || (n_meta > 0 && !meta))
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_gpt2_save_safetensors_with: %d metadata entries (0 to 8, meta set)",
                            n_meta);
    char h[32];
    snprintf(h, sizeof h, "%lld", (long long)cm_gpt2_model_config(m)->n_head);
    const char *all[2 * 9] = {CM_GPT2_N_HEAD_METADATA_KEY, h};
    for (int i = 0; i < 2 * n_meta; i++) all[2 + i] = meta[i];
    return cm_module_save_safetensors_with(cm_model_module(m), path, all, n_meta + 1);
}

/* ---- sizes from a checkpoint ---- */

typedef struct {
    cm_safetensors *file;
    cm_safetensors_index *idx;
} ckpt;

static size_t ck_count(const ckpt *c) {
    return c->file ? cm_safetensors_count(c->file) : cm_safetensors_index_count(c->idx);
}
static const char *ck_name(const ckpt *c, size_t i) {
    return c->file ? cm_safetensors_at(c->file, i)->name : cm_safetensors_index_name(c->idx, i);
}
/* The tensor called name or transformer.name (NULL if neither). */
static const cm_st_tensor *ck_find(ckpt *c, const char *name) {
    char full[256];
    snprintf(full, sizeof full, "transformer.%s", name);
    const char *cand[2] = {full, name};
    for (int k = 0; k < 2; k++) {
        if (c->file) {
            const cm_st_tensor *t = cm_safetensors_find(c->file, cand[k]);
            if (t) return t;
        } else {
            bool listed = false;
            for (size_t i = 0; i < cm_safetensors_index_count(c->idx) && !listed; i++)
                listed = !strcmp(cm_safetensors_index_name(c->idx, i), cand[k]);
            const cm_safetensors *f;
            const cm_st_tensor *t;
            if (listed && cm_safetensors_index_find(c->idx, cand[k], &f, &t) == CM_OK) return t;
        }
    }
    return NULL;
}

static cm_status has_wte(const char *path, bool *found) {
    ckpt c = {0};
    cm_status st = ends_with(path, ".safetensors") ? cm_safetensors_open(path, &c.file)
                                                   : cm_safetensors_index_open(path, &c.idx);
    if (st) return st;
    *found = ck_find(&c, "wte.weight") != NULL;
    cm_safetensors_close(c.file);
    cm_safetensors_index_close(c.idx);
    return CM_OK;
}

cm_status cm_gpt2_config_from_safetensors(const char *path, cm_gpt2_config *out) {
    if (!path || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_gpt2_config_from_safetensors: NULL argument");
    ckpt c = {0};
    cm_status st = ends_with(path, ".safetensors") ? cm_safetensors_open(path, &c.file)
                                                   : cm_safetensors_index_open(path, &c.idx);
    if (st) return st;
    cm_gpt2_config cfg = cm_gpt2_config_default();
    const cm_st_tensor *wte = ck_find(&c, "wte.weight"), *wpe = ck_find(&c, "wpe.weight");
    if (!wte || !wpe) {
        st = cm_set_error(CM_ERR_NOT_FOUND, "'%s' is not a GPT-2 checkpoint: it has no %s", path,
                          !wte ? "transformer.wte.weight (or wte.weight)" : "transformer.wpe.weight (or wpe.weight)");
        goto done;
    }
    if (wte->ndim != 2 || wpe->ndim != 2 || wte->shape[1] != wpe->shape[1] || wte->shape[1] < 1) {
        st = cm_set_error(CM_ERR_FORMAT, "'%s': wte and wpe must be 2-d with the same width", path);
        goto done;
    }
    cfg.vocab_size = wte->shape[0];
    cfg.n_positions = wpe->shape[0];
    cfg.n_embd = wte->shape[1];
    /* n_head: recorded by cm_gpt2_save_safetensors, else every released GPT-2's 64-wide heads */
    const char *hv = c.file ? cm_safetensors_metadata_get(c.file, CM_GPT2_N_HEAD_METADATA_KEY) : NULL;
    if (hv) {
        char *end;
        const long long h = strtoll(hv, &end, 10);
        if (end == hv || *end || h < 1 || cfg.n_embd % h) {
            st = cm_set_error(CM_ERR_FORMAT, "'%s': metadata %s = '%.40s' is not a head count dividing n_embd %lld", path,
                              CM_GPT2_N_HEAD_METADATA_KEY, hv, (long long)cfg.n_embd);
            goto done;
        }
        cfg.n_head = h;
    } else {
        cfg.n_head = cfg.n_embd % 64 == 0 ? cfg.n_embd / 64 : 1;
        cm_log_msg(CM_LOG_INFO, "'%s' does not record n_head: %lld (n_embd %lld in heads of 64, as every released GPT-2)",
                   path, (long long)cfg.n_head, (long long)cfg.n_embd);
    }
    int64_t max_layer = -1;
    for (size_t i = 0; i < ck_count(&c); i++) {
        const char *n = ck_name(&c, i);
        if (!strncmp(n, "transformer.", 12)) n += 12;
        long long k;
        if (sscanf(n, "h.%lld.", &k) == 1 && k > max_layer) max_layer = k;
    }
    if (max_layer < 0) {
        st = cm_set_error(CM_ERR_FORMAT, "'%s': no transformer blocks (h.0...) found", path);
        goto done;
    }
    cfg.n_layer = max_layer + 1;
    cfg.bias = ck_find(&c, "h.0.attn.c_attn.bias") != NULL;
    *out = cfg;
done:
    cm_safetensors_close(c.file);
    cm_safetensors_index_close(c.idx);
    return st;
}
