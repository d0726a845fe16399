/* BERT from the zoo: Hugging Face's BertForMaskedLM / BertForSequenceClassification trees on top of
 * the nn layer's BertLayer, the model wrappers (batch fields, losses, metrics, FLOPs), weights in
 * and out with Hugging Face's conventions, and the MLM masking recipe. */
#include <composer/zoo_bert.h>
#include "model/model_impl.h"
#include <composer/safetensors.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- configuration ---- */

cm_bert_config cm_bert_config_default(void) {
    cm_bert_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 30522;
    c.hidden_size = 768;
    c.num_hidden_layers = 12;
    c.num_attention_heads = 12;
    c.intermediate_size = 3072;
    c.hidden_act = CM_ACT_GELU;
    c.hidden_dropout_prob = 0.1f;
    c.attention_probs_dropout_prob = 0.1f;
    c.max_position_embeddings = 512;
    c.type_vocab_size = 2;
    c.layer_norm_eps = 1e-12f;
    c.pad_token_id = 0;
    c.num_labels = 2;
    c.classifier_dropout = -1.0f;
    c.initializer_range = 0.02f;
    return c;
}

cm_status cm_bert_config_preset(const char *name, cm_bert_config *out) {
    if (!name || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_bert_config_preset: NULL argument");
    cm_bert_config c = cm_bert_config_default();
    if (!strcmp(name, "bert-base-uncased")) {
        /* the defaults */
    } else if (!strcmp(name, "bert-large-uncased")) {
        c.hidden_size = 1024, c.num_hidden_layers = 24, c.num_attention_heads = 16, c.intermediate_size = 4096;
    } else if (!strcmp(name, "bert-tiny")) {
        c.hidden_size = 128, c.num_hidden_layers = 2, c.num_attention_heads = 2, c.intermediate_size = 512;
    } else if (!strcmp(name, "test-tiny")) {
        c.vocab_size = 100, c.hidden_size = 32, c.num_hidden_layers = 2, c.num_attention_heads = 4;
        c.intermediate_size = 64, c.max_position_embeddings = 32;
    } else {
        return cm_set_error(CM_ERR_NOT_FOUND,
                            "unknown BERT preset '%s' (use bert-base-uncased, bert-large-uncased, bert-tiny or "
                            "test-tiny)",
                            name);
    }
    *out = c;
    return CM_OK;
}

static bool prob_ok(float p) { return p >= 0.0f && p <= 1.0f; }

cm_status cm_bert_config_check(const cm_bert_config *c) {
    if (!c) return cm_set_error(CM_ERR_INVALID_ARG, "BERT config is NULL");
#define POS(f)                                                                                                       \
    if (c->f < 1) return cm_set_error(CM_ERR_INVALID_ARG, "BERT config: " #f " %lld must be at least 1", (long long)c->f)
    POS(vocab_size);
    POS(hidden_size);
    POS(num_hidden_layers);
    POS(num_attention_heads);
    POS(intermediate_size);
    POS(max_position_embeddings);
    POS(type_vocab_size);
    POS(num_labels);
#undef POS
    if (c->hidden_size % c->num_attention_heads)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "BERT config: hidden_size %lld is not a multiple of num_attention_heads %lld",
                            (long long)c->hidden_size, (long long)c->num_attention_heads);
    if ((int)c->hidden_act < 0 || c->hidden_act > CM_ACT_IDENTITY)
        return cm_set_error(CM_ERR_INVALID_ARG, "BERT config: unknown hidden_act %d", (int)c->hidden_act);
    if (!prob_ok(c->hidden_dropout_prob) || !prob_ok(c->attention_probs_dropout_prob) ||
        !(prob_ok(c->classifier_dropout) || c->classifier_dropout < 0))
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "BERT config: hidden_dropout_prob %g, attention_probs_dropout_prob %g and "
                            "classifier_dropout %g must be in [0, 1] (classifier_dropout may be -1)",
                            c->hidden_dropout_prob, c->attention_probs_dropout_prob, c->classifier_dropout);
    if (!(c->layer_norm_eps >= 0) || !(c->initializer_range >= 0))
        return cm_set_error(CM_ERR_INVALID_ARG, "BERT config: layer_norm_eps %g and initializer_range %g must be >= 0",
                            c->layer_norm_eps, c->initializer_range);
    if (c->pad_token_id < -1 || c->pad_token_id >= c->vocab_size)
        return cm_set_error(CM_ERR_INVALID_ARG, "BERT config: pad_token_id %lld is outside [-1, vocab_size %lld)",
                            (long long)c->pad_token_id, (long long)c->vocab_size);
    return CM_OK;
}

int64_t cm_bert_count_params(const cm_bert_config *c, bool mlm) {
    if (!c || cm_bert_config_check(c) != CM_OK) return 0;
    const int64_t V = c->vocab_size, C = c->hidden_size, F = c->intermediate_size;
    int64_t n = (V + c->max_position_embeddings + c->type_vocab_size) * C + 2 * C; /* embeddings */
    n += c->num_hidden_layers * (4 * (C * C + C) + 2 * C * F + F + C + 4 * C);    /* layers */
    if (mlm) return n + C * C + C + 2 * C + V; /* transform + bias (decoder tied) */
    return n + C * C + C + C * c->num_labels + c->num_labels; /* pooler + classifier */
}

double cm_bert_flops_per_sequence(const cm_bert_config *c, bool mlm, int64_t L) {
    if (!c || L < 1) return 0.0;
    const double C = (double)c->hidden_size, F = (double)c->intermediate_size, T = (double)L;
    /* multiply-adds per token of one layer: q, k, v, output (4C²), the MLP (2CF), scores and the
     * weighted sum (2·T·C) */
    double per_tok = (double)c->num_hidden_layers * (4.0 * C * C + 2.0 * C * F + 2.0 * T * C);
    double macs = per_tok * T;
    if (mlm)
        macs += T * (C * C + C * (double)c->vocab_size);
    else
        macs += C * C + C * (double)c->num_labels;
    return 3.0 * 2.0 * macs;
}

/* ---- module types ---- */

static void free_self(void *self) { cm_free(self); }

typedef struct {
    cm_bert_config cfg;
    cm_module *a, *b, *c, *d, *e; /* per type: see each forward */
} node_s;

static cm_tensor *in_at(int n_in, cm_tensor *const *in, int i) { return i < n_in ? in[i] : NULL; }

/* BertEmbeddings: a = word_embeddings, b = position_embeddings, c = token_type_embeddings,
 * d = LayerNorm, e = dropout. in[0] input_ids (B, L), in[1] token_type_ids (B, L) or NULL. */
static cm_tensor *emb_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    node_s *s = cm_module_self(m);
    cm_tensor *ids = in[0], *tt = in_at(n_in, in, 1);
    char sh[64], sh2[64];
    if (cm_tensor_ndim(ids) != 2) {
        cm_tape_fail(tp, CM_ERR_SHAPE, "input_ids %s must be (B, L)", cm_tensor_shape_str(ids, sh, sizeof sh));
        return NULL;
    }
    const int64_t B = cm_tensor_dim(ids, 0), L = cm_tensor_dim(ids, 1);
    int64_t P = s->cfg.max_position_embeddings; /* the position embedding's rows (ALiBi may widen it) */
    if (cm_nn_embedding_dims(s->b, &P, NULL) != CM_OK) P = s->cfg.max_position_embeddings;
    if (L > P) {
        cm_tape_fail(tp, CM_ERR_SHAPE, "sequence length %lld is longer than max_position_embeddings %lld",
                     (long long)L, (long long)P);
        return NULL;
    }
    if (tt && (cm_tensor_ndim(tt) != 2 || cm_tensor_dim(tt, 0) != B || cm_tensor_dim(tt, 1) != L)) {
        cm_tape_fail(tp, CM_ERR_SHAPE, "token_type_ids %s must have input_ids' shape %s",
                     cm_tensor_shape_str(tt, sh, sizeof sh), cm_tensor_shape_str(ids, sh2, sizeof sh2));
        return NULL;
    }
    cm_tensor *w_word = cm_module_param(s->a, "weight");
    cm_tensor *word = cm_module_forward(s->a, tp, ids); /* (B, L, C) */
    if (!word) return NULL;
    /* nn.Embedding(padding_idx = pad_token_id): the [PAD] row is used as it is but gets no
     * gradient. word·keep + detach(word)·(1 - keep) equals word exactly (one term is 0). */
    const int64_t pad = s->cfg.pad_token_id;
    if (pad >= 0 && cm_tape_grad_enabled(tp) && cm_tensor_requires_grad(w_word)) {
        int64_t n = B * L, n_pad = 0;
        cm_tensor *hid = cm_to_device(tp, ids, CM_DEVICE_CPU); /* read on the host */
        if (!hid) return NULL;
        for (int64_t i = 0; i < n; i++) n_pad += (int64_t)cm_tensor_get_flat(hid, i) == pad;
        if (n_pad) { /* made on the host, then moved to the ids' device */
            int64_t ks[3] = {B, L, 1};
            cm_tensor *keep = cm_empty_on(tp, CM_DEVICE_CPU, CM_DTYPE_F32, 3, ks);
            cm_tensor *drop = cm_empty_on(tp, CM_DEVICE_CPU, CM_DTYPE_F32, 3, ks);
            if (!keep || !drop) return NULL;
            float *k = cm_tensor_data(keep), *d = cm_tensor_data(drop);
            for (int64_t i = 0; i < n; i++) {
                k[i] = (int64_t)cm_tensor_get_flat(hid, i) == pad ? 0.0f : 1.0f;
                d[i] = 1.0f - k[i];
            }
            const cm_device dev = cm_tensor_device(word);
            keep = cm_to_device(tp, keep, dev), drop = cm_to_device(tp, drop, dev);
            word = cm_add(tp, cm_mul(tp, word, keep), cm_mul(tp, cm_detach(tp, word), drop));
        }
    }
    cm_tensor *pos = cm_narrow(tp, cm_module_param(s->b, "weight"), 0, 0, L); /* (L, C), ids 0..L-1 */
    cm_tensor *type = tt ? cm_module_forward(s->c, tp, tt)                   /* (B, L, C) */
                         : cm_narrow(tp, cm_module_param(s->c, "weight"), 0, 0, 1); /* (1, C): all 0 */
    cm_tensor *x = cm_add(tp, cm_add(tp, word, pos), type);
    return cm_module_forward(s->e, tp, cm_module_forward(s->d, tp, x));
}

/* BertEncoder: a = layer (ModuleList). in[0] x (B, L, C), in[1] key padding mask or NULL. */
static cm_tensor *enc_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    node_s *s = cm_module_self(m);
    cm_tensor *x = in[0];
    for (int i = 0; x && i < cm_module_n_children(s->a); i++) {
        cm_tensor *l_in[2] = {x, in_at(n_in, in, 1)};
        x = cm_module_forward_n(cm_module_child_at(s->a, i), tp, 2, l_in);
    }
    return x;
}

/* BertPooler: a = dense. tanh(dense(x[:, 0])): (B, L, C) → (B, C). */
static cm_tensor *pool_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    node_s *s = cm_module_self(m);
    (void)n_in;
    cm_tensor *first = cm_squeeze(tp, cm_narrow(tp, in[0], 1, 0, 1), 1);
    return cm_tanh(tp, cm_module_forward(s->a, tp, first));
}

/* The key padding mask from attention_mask, or NULL when every token is real (the unmasked
 * attention is the faster path and gives the same result). */
static cm_tensor *padding_mask(cm_tape *tp, cm_tensor *am) {
    if (!am) return NULL;
    cm_tensor *h = cm_to_device(tp, am, CM_DEVICE_CPU); /* read on the host */
    if (!h) return am; /* the tape's error stops what follows */
    const int64_t n = cm_tensor_numel(h);
    for (int64_t i = 0; i < n; i++)
        if (cm_tensor_get_flat(h, i) == 0) return am;
    return NULL;
}

/* BertModel: a = embeddings, b = encoder (c = pooler, used by the classifier).
 * in[0] input_ids, in[1] attention_mask or NULL, in[2] token_type_ids or NULL → (B, L, C). */
static cm_tensor *model_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    node_s *s = cm_module_self(m);
    cm_tensor *e_in[2] = {in[0], in_at(n_in, in, 2)};
    cm_tensor *x = cm_module_forward_n(s->a, tp, 2, e_in);
    if (!x) return NULL;
    cm_tensor *am = in_at(n_in, in, 1);
    if (am && (cm_tensor_ndim(am) != 2 || cm_tensor_dim(am, 0) != cm_tensor_dim(in[0], 0) ||
               cm_tensor_dim(am, 1) != cm_tensor_dim(in[0], 1))) {
        char s1[64], s2[64];
        cm_tape_fail(tp, CM_ERR_SHAPE, "attention_mask %s must have input_ids' shape %s",
                     cm_tensor_shape_str(am, s1, sizeof s1), cm_tensor_shape_str(in[0], s2, sizeof s2));
        return NULL;
    }
    cm_tensor *x_in[2] = {x, padding_mask(tp, am)};
    return cm_module_forward_n(s->b, tp, 2, x_in);
}

/* BertPredictionHeadTransform: a = dense, b = LayerNorm; act between. */
static cm_tensor *transform_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    node_s *s = cm_module_self(m);
    (void)n_in;
    cm_tensor *h = cm_nn_activate(tp, cm_module_forward(s->a, tp, in[0]), s->cfg.hidden_act);
    return cm_module_forward(s->b, tp, h);
}

/* BertLMPredictionHead: a = transform, b = decoder (weight tied to the word embeddings, bias tied
 * to this module's "bias"). */
static cm_tensor *pred_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    node_s *s = cm_module_self(m);
    (void)n_in;
    return cm_module_forward(s->b, tp, cm_module_forward(s->a, tp, in[0]));
}

/* BertOnlyMLMHead: a = predictions. */
static cm_tensor *cls_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    node_s *s = cm_module_self(m);
    (void)n_in;
    return cm_module_forward(s->a, tp, in[0]);
}

/* BertForMaskedLM: a = bert, b = cls. Inputs as BertModel's → (B, L, V). */
static cm_tensor *mlm_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    node_s *s = cm_module_self(m);
    cm_tensor *b_in[3] = {in[0], in_at(n_in, in, 1), in_at(n_in, in, 2)};
    return cm_module_forward(s->b, tp, cm_module_forward_n(s->a, tp, 3, b_in));
}

/* BertForSequenceClassification: a = bert, b = dropout, c = classifier → (B, num_labels). */
static cm_tensor *seqcls_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    node_s *s = cm_module_self(m);
    cm_tensor *b_in[3] = {in[0], in_at(n_in, in, 1), in_at(n_in, in, 2)};
    cm_tensor *h = cm_module_forward_n(s->a, tp, 3, b_in);
    node_s *bs = cm_module_self(s->a);
    cm_tensor *pooled = cm_module_forward(bs->c, tp, h);
    return cm_module_forward(s->c, tp, cm_module_forward(s->b, tp, pooled));
}

static void bert_desc(const cm_module *m, char *buf, size_t cap) {
    const node_s *s = cm_module_self(m);
    snprintf(buf, cap, "vocab=%lld, hidden=%lld, layers=%lld, heads=%lld", (long long)s->cfg.vocab_size,
             (long long)s->cfg.hidden_size, (long long)s->cfg.num_hidden_layers, (long long)s->cfg.num_attention_heads);
}

static const cm_module_i emb_vt = {CM_MODULE_ABI, "BertEmbeddings", emb_fwd, free_self, NULL};
static const cm_module_i enc_vt = {CM_MODULE_ABI, "BertEncoder", enc_fwd, free_self, NULL};
static const cm_module_i pool_vt = {CM_MODULE_ABI, "BertPooler", pool_fwd, free_self, NULL};
static const cm_module_i model_vt = {CM_MODULE_ABI, "BertModel", model_fwd, free_self, bert_desc};
static const cm_module_i transform_vt = {CM_MODULE_ABI, "BertPredictionHeadTransform", transform_fwd, free_self,
                                         NULL};
static const cm_module_i pred_vt = {CM_MODULE_ABI, "BertLMPredictionHead", pred_fwd, free_self, NULL};
static const cm_module_i cls_vt = {CM_MODULE_ABI, "BertOnlyMLMHead", cls_fwd, free_self, NULL};
static const cm_module_i mlm_vt = {CM_MODULE_ABI, "BertForMaskedLM", mlm_fwd, free_self, bert_desc};
static const cm_module_i seqcls_vt = {CM_MODULE_ABI, "BertForSequenceClassification", seqcls_fwd, free_self,
                                      bert_desc};

/* ---- building ---- */

/* A new node module of type vt with state s (cfg copied). */
static cm_status node_new(const cm_module_i *vt, const cm_bert_config *cfg, node_s **s, cm_module **out) {
    *out = NULL;
    *s = cm_alloc_zeroed(sizeof **s, 8);
    if (!*s) return cm_set_error(CM_ERR_OOM, "BERT: out of memory for a %s", vt->type_name);
    (*s)->cfg = *cfg;
    cm_status st = cm_module_new(vt, *s, out);
    if (st) cm_free(*s);
    return st;
}

/* Adds a child the caller just made (made = the constructor's status); frees it if adding fails. */
static cm_status adopt(cm_module *parent, const char *name, cm_status made, cm_module *child, cm_module **slot) {
    if (made) return made;
    cm_status st = cm_module_add_child(parent, name, child, slot);
    if (st) cm_module_free(child);
    return st;
}

static cm_status add_node(cm_module *parent, const char *name, const cm_module_i *vt, const cm_bert_config *cfg,
                          node_s **s, cm_module **slot) {
    cm_module *c;
    cm_status st = node_new(vt, cfg, s, &c);
    return adopt(parent, name, st, c, slot);
}

static void init_normal(cm_tensor *w, cm_rng *rng, float std) {
    if (rng) cm_tensor_init_normal(w, rng, 0.0f, std);
}

static cm_status add_linear(cm_module *parent, const char *name, int64_t in, int64_t out, const cm_bert_config *cfg,
                            cm_rng *rng, cm_module **slot) {
    cm_module *c = NULL;
    cm_status st = cm_nn_linear_new(in, out, true, NULL, &c);
    if ((st = adopt(parent, name, st, c, slot))) return st;
    init_normal(cm_module_param(c, "weight"), rng, cfg->initializer_range);
    return CM_OK;
}

static cm_status add_ln(cm_module *parent, const cm_bert_config *cfg, cm_module **slot) {
    cm_module *c = NULL;
    cm_status st = cm_nn_layer_norm_new(cfg->hidden_size, cfg->layer_norm_eps, true, &c);
    return adopt(parent, "LayerNorm", st, c, slot);
}

static cm_status add_dropout(cm_module *parent, const char *name, float p, cm_module **slot) {
    cm_module *c = NULL;
    cm_status st = cm_nn_dropout_new(p, &c);
    return adopt(parent, name, st, c, slot);
}

static cm_status add_embedding(cm_module *parent, const char *name, int64_t num, const cm_bert_config *cfg,
                               cm_rng *rng, cm_module **slot) {
    cm_module *c = NULL;
    cm_status st = cm_nn_embedding_new(num, cfg->hidden_size, NULL, &c);
    if ((st = adopt(parent, name, st, c, slot))) return st;
    init_normal(cm_module_param(c, "weight"), rng, cfg->initializer_range);
    return CM_OK;
}

/* The nn layer takes the MLP size as a ratio of the width: find the float that gives exactly
 * intermediate_size. */
static cm_status layer_config(const cm_bert_config *cfg, cm_nn_attention_config *ac) {
    *ac = cm_nn_attention_config_default(cfg->hidden_size, cfg->num_attention_heads);
    ac->causal = false;
    ac->attn_pdrop = cfg->attention_probs_dropout_prob;
    ac->resid_pdrop = cfg->hidden_dropout_prob;
    ac->ln_eps = cfg->layer_norm_eps;
    ac->act = cfg->hidden_act;
    float r = (float)cfg->intermediate_size / (float)cfg->hidden_size;
    for (int i = 0; i < 8 && (int64_t)(r * (float)cfg->hidden_size) != cfg->intermediate_size; i++)
        r = nextafterf(r, (int64_t)(r * (float)cfg->hidden_size) < cfg->intermediate_size ? INFINITY : 0.0f);
    if ((int64_t)(r * (float)cfg->hidden_size) != cfg->intermediate_size)
        return cm_set_error(CM_ERR_INVALID_ARG, "BERT config: intermediate_size %lld cannot be built for hidden_size %lld",
                            (long long)cfg->intermediate_size, (long long)cfg->hidden_size);
    ac->mlp_ratio = r;
    return CM_OK;
}

/* The "bert" subtree (BertModel), with the pooler when with_pooler. */
static cm_status build_bert(cm_module *root, const cm_bert_config *cfg, bool with_pooler, cm_rng *rng,
                            cm_module **slot) {
    node_s *bs, *es, *ns, *ps;
    cm_status st;
    cm_nn_attention_config ac;
    if ((st = layer_config(cfg, &ac))) return st;
    if ((st = add_node(root, "bert", &model_vt, cfg, &bs, slot))) return st;
    cm_module *bert = *slot;
    if ((st = add_node(bert, "embeddings", &emb_vt, cfg, &es, &bs->a))) return st;
    cm_module *emb = bs->a;
    if ((st = add_embedding(emb, "word_embeddings", cfg->vocab_size, cfg, rng, &es->a)) ||
        (st = add_embedding(emb, "position_embeddings", cfg->max_position_embeddings, cfg, rng, &es->b)) ||
        (st = add_embedding(emb, "token_type_embeddings", cfg->type_vocab_size, cfg, rng, &es->c)) ||
        (st = add_ln(emb, cfg, &es->d)) || (st = add_dropout(emb, "dropout", cfg->hidden_dropout_prob, &es->e)))
        return st;
    if (rng && cfg->pad_token_id >= 0) { /* nn.Embedding's padding_idx row starts at zero */
        float *w = cm_tensor_data(cm_module_param(es->a, "weight"));
        memset(w + cfg->pad_token_id * cfg->hidden_size, 0, sizeof(float) * (size_t)cfg->hidden_size);
    }
    if ((st = cm_module_set_wrap_unit(emb, NULL))) return st;
    if ((st = add_node(bert, "encoder", &enc_vt, cfg, &ns, &bs->b))) return st;
    cm_module *list = NULL;
    st = cm_nn_module_list_new(&list);
    if ((st = adopt(bs->b, "layer", st, list, &ns->a))) return st;
    for (int64_t i = 0; i < cfg->num_hidden_layers; i++) {
        cm_module *layer = NULL;
        st = cm_nn_bert_layer_new(&ac, rng, &layer);
        if (!st && rng && cfg->initializer_range != 0.02f) { /* the layer initialises with 0.02 */
            static const char *const lin[6] = {"attention.self.query.weight", "attention.self.key.weight",
                                               "attention.self.value.weight", "attention.output.dense.weight",
                                               "intermediate.dense.weight",   "output.dense.weight"};
            for (int k = 0; k < 6; k++) init_normal(cm_module_find_param(layer, lin[k]), rng, cfg->initializer_range);
        }
        if (!st) st = cm_module_set_wrap_unit(layer, NULL);
        if (st) {
            cm_module_free(layer);
            return st;
        }
        if ((st = cm_nn_sequential_append(ns->a, layer))) {
            cm_module_free(layer);
            return st;
        }
    }
    if (with_pooler) {
        if ((st = add_node(bert, "pooler", &pool_vt, cfg, &ps, &bs->c)) ||
            (st = add_linear(bs->c, "dense", cfg->hidden_size, cfg->hidden_size, cfg, rng, &ps->a)) ||
            (st = cm_module_set_wrap_unit(bs->c, "head")))
            return st;
    }
    return CM_OK;
}

static cm_status build_mlm(const cm_bert_config *cfg, cm_rng *rng, cm_module **out) {
    node_s *rs, *cs, *pr, *ts;
    cm_status st = node_new(&mlm_vt, cfg, &rs, out);
    if (st) return st;
    cm_module *root = *out;
    if ((st = build_bert(root, cfg, false, rng, &rs->a))) goto fail;
    if ((st = add_node(root, "cls", &cls_vt, cfg, &cs, &rs->b))) goto fail;
    if ((st = add_node(rs->b, "predictions", &pred_vt, cfg, &pr, &cs->a))) goto fail;
    cm_module *pred = cs->a;
    const int64_t V = cfg->vocab_size, C = cfg->hidden_size;
    cm_tensor *bias = NULL;
    if ((st = cm_module_add_param(pred, "bias", 1, &V, true, &bias))) goto fail;
    if ((st = add_node(pred, "transform", &transform_vt, cfg, &ts, &pr->a)) ||
        (st = add_linear(pr->a, "dense", C, C, cfg, rng, &ts->a)) || (st = add_ln(pr->a, cfg, &ts->b)))
        goto fail;
    cm_module *dec = NULL;
    st = cm_nn_linear_new(C, V, true, NULL, &dec);
    if ((st = adopt(pred, "decoder", st, dec, &pr->b))) goto fail;
    node_s *bs = cm_module_self(rs->a), *es = cm_module_self(bs->a);
    if ((st = cm_module_tie_param(pr->b, "weight", cm_module_param(es->a, "weight"))) ||
        (st = cm_module_tie_param(pr->b, "bias", bias)))
        goto fail;
    if ((st = cm_module_set_wrap_unit(rs->b, "head"))) goto fail;
    return CM_OK;
fail:
    cm_module_free(*out);
    *out = NULL;
    return st;
}

static cm_status build_seqcls(const cm_bert_config *cfg, cm_rng *rng, cm_module **out) {
    node_s *rs;
    cm_status st = node_new(&seqcls_vt, cfg, &rs, out);
    if (st) return st;
    cm_module *root = *out;
    const float p = cfg->classifier_dropout >= 0 ? cfg->classifier_dropout : cfg->hidden_dropout_prob;
    if ((st = build_bert(root, cfg, true, rng, &rs->a)) || (st = add_dropout(root, "dropout", p, &rs->b)) ||
        (st = add_linear(root, "classifier", cfg->hidden_size, cfg->num_labels, cfg, rng, &rs->c)) ||
        (st = cm_module_set_wrap_unit(rs->c, "head")))
        goto fail;
    return CM_OK;
fail:
    cm_module_free(*out);
    *out = NULL;
    return st;
}

/* ---- the model wrappers ---- */

#define BERT_MAGIC 0x42455254u /* "BERT": marks a bert_model behind a cm_model */

typedef struct {
    uint32_t magic;
    cm_bert_config cfg;
    bool mlm;
    bool sparse; /* MLM: logits of the labelled positions only (cm_bert_mlm_sparse_logits) */
    cm_module *root;
} bert_model;

static cm_tensor *field(cm_tape *tp, const char *model, const cm_model_batch *b, const char *name) {
    cm_tensor *t = cm_model_batch_field(b, name);
    if (!t) {
        char fl[256];
        size_t len = 0;
        fl[0] = '\0';
        for (int i = 0; i < b->n && len < sizeof fl; i++) {
            int w = snprintf(fl + len, sizeof fl - len, "%s%s", i ? ", " : "", b->names[i] ? b->names[i] : "(null)");
            if (w < 0) break;
            len += (size_t)w;
        }
        cm_tape_fail(tp, CM_ERR_NOT_FOUND, "%s: the batch has no field '%s' (fields: %s)", model, name,
                     b->n ? fl : "none");
    }
    return t;
}

/* Sparse MLM: the batch's labels (B, L) when they fit input_ids (NULL otherwise: the dense path
 * then runs, and reports shape errors). */
static cm_tensor *mlm_labels(const bert_model *m, const cm_model_batch *b, cm_tensor *ids) {
    cm_tensor *y = m->mlm && m->sparse ? cm_model_batch_field(b, "labels") : NULL;
    if (!y || cm_tensor_ndim(y) != 2 || cm_tensor_ndim(ids) != 2 || cm_tensor_dim(y, 0) != cm_tensor_dim(ids, 0) ||
        cm_tensor_dim(y, 1) != cm_tensor_dim(ids, 1))
        return NULL;
    return y;
}

/* (n,) i64 on dev: the flat positions (rows) or the labels (!rows) of the labelled positions of
 * host labels yh; made on the host, then moved. */
static cm_tensor *labelled_on(cm_tape *tp, const cm_tensor *yh, int64_t n, bool rows, cm_device dev) {
    cm_tensor *t = cm_empty_on(tp, CM_DEVICE_CPU, CM_DTYPE_I64, 1, &n);
    if (!t) return NULL;
    cmi_labelled(yh, rows ? cm_tensor_data(t) : NULL, rows ? NULL : cm_tensor_data(t));
    return cm_to_device(tp, t, dev);
}

static cm_tensor *bm_forward(void *self, cm_tape *tp, const cm_model_batch *b) {
    bert_model *m = self;
    cm_tensor *ids = field(tp, cm_module_type_name(m->root), b, "input_ids");
    if (!ids) return NULL;
    cm_tensor *in[3] = {ids, cm_model_batch_field(b, "attention_mask"), cm_model_batch_field(b, "token_type_ids")};
    cm_tensor *y = mlm_labels(m, b, ids), *yh = y ? cm_to_device(tp, y, CM_DEVICE_CPU) : NULL;
    const int64_t n = yh ? cmi_labelled(yh, NULL, NULL) : 0;
    if (!n) return cm_module_forward_n(m->root, tp, 3, in);
    /* the encoder on every position, the head on the labelled ones: (n, C) → (n, V) */
    node_s *rs = cm_module_self(m->root);
    cm_tensor *h = cm_module_forward_n(rs->a, tp, 3, in); /* (B, L, C) */
    if (!h) return NULL;
    const int64_t flat[2] = {cm_tensor_dim(h, 0) * cm_tensor_dim(h, 1), cm_tensor_dim(h, 2)};
    cm_tensor *rows =
        cm_index_select(tp, cm_reshape(tp, h, 2, flat), 0, labelled_on(tp, yh, n, true, cm_tensor_device(h)));
    return cm_module_forward(rs->b, tp, rows);
}

static cm_tensor *bm_loss(void *self, cm_tape *tp, cm_tensor *out, const cm_model_batch *b) {
    bert_model *m = self;
    const char *name = cm_module_type_name(m->root);
    char s1[64], s2[64];
    if (m->mlm) {
        cm_tensor *y = field(tp, name, b, "labels");
        if (!y) return NULL;
        cm_tensor *ids = cm_model_batch_field(b, "input_ids");
        const bool sparse = ids && cm_tensor_ndim(out) == 2 && mlm_labels(m, b, ids);
        cm_tensor *yh = sparse ? cm_to_device(tp, y, CM_DEVICE_CPU) : NULL;
        const int64_t n = yh ? cmi_labelled(yh, NULL, NULL) : 0;
        if (n) {
            if (cm_tensor_dim(out, 0) != n) {
                cm_tape_fail(tp, CM_ERR_SHAPE, "%s: sparse logits %s for %lld labelled positions", name,
                             cm_tensor_shape_str(out, s1, sizeof s1), (long long)n);
                return NULL;
            }
            return cm_cross_entropy(tp, out, labelled_on(tp, yh, n, false, cm_tensor_device(out)), NULL);
        }
        const int64_t B = cm_tensor_dim(out, 0), L = cm_tensor_dim(out, 1), V = cm_tensor_dim(out, 2);
        if (cm_tensor_ndim(y) != 2 || cm_tensor_dim(y, 0) != B || cm_tensor_dim(y, 1) != L) {
            cm_tape_fail(tp, CM_ERR_SHAPE, "%s: labels %s must be (B, L) as the logits %s", name,
                         cm_tensor_shape_str(y, s1, sizeof s1), cm_tensor_shape_str(out, s2, sizeof s2));
            return NULL;
        }
        const int64_t ls[2] = {B * L, V}, ys[1] = {B * L};
        return cm_cross_entropy(tp, cm_reshape(tp, out, 2, ls), cm_reshape(tp, y, 1, ys), NULL);
    }
    cm_tensor *y = field(tp, name, b, "label");
    if (!y) return NULL;
    if (m->cfg.num_labels == 1) { /* regression, as Hugging Face's problem_type "regression" */
        if (cm_tensor_numel(y) != cm_tensor_dim(out, 0)) {
            cm_tape_fail(tp, CM_ERR_SHAPE, "%s: label %s must have one value per sample of the logits %s", name,
                         cm_tensor_shape_str(y, s1, sizeof s1), cm_tensor_shape_str(out, s2, sizeof s2));
            return NULL;
        }
        const int64_t n = cm_tensor_dim(out, 0);
        cm_tensor *target = cm_reshape(tp, cm_tensor_dtype(y) == CM_DTYPE_F32 ? y : cm_cast(tp, y, CM_DTYPE_F32), 1, &n);
        return cm_mse_loss(tp, cm_reshape(tp, out, 1, &n), target, CM_REDUCTION_MEAN);
    }
    return cm_cross_entropy(tp, out, y, NULL);
}

/* "CrossEntropy" for the classifier's evaluation (the built-in LanguageCrossEntropy's math). */
static cm_status ce_update(const void *self, cm_tensor *o, const cm_model_batch *b, double *state) {
    cm_metric m = cm_metric_cross_entropy(self);
    return m.vt->update(m.self, o, b, state);
}
static double ce_compute(const void *self, const double *state) {
    cm_metric m = cm_metric_cross_entropy(self);
    return m.vt->compute(m.self, state);
}
static const cm_metric_i ce_vt = {CM_METRIC_ABI, "CrossEntropy", 2, ce_update, ce_compute};

static int bm_n_metrics(void *self, bool train) {
    bert_model *m = self;
    if (m->mlm) return 2;
    if (m->cfg.num_labels == 1) return 0;
    return train ? 1 : 2;
}
static cm_metric bm_metric(void *self, bool train, int i) {
    bert_model *m = self;
    (void)train;
    /* the head's sparse logits (n, V) are the labelled positions' (dense ones are taken as well) */
    if (m->mlm) return i == 0 ? cm_metric_sparse_cross_entropy("labels") : cm_metric_sparse_accuracy("labels");
    return i == 0 ? cm_metric_accuracy("label") : (cm_metric){&ce_vt, "label"};
}
static double bm_flops(void *self, const cm_model_batch *b) {
    bert_model *m = self;
    cm_tensor *ids = cm_model_batch_field(b, "input_ids");
    if (!ids || cm_tensor_ndim(ids) != 2) return 0.0;
    const int64_t L = cm_tensor_dim(ids, 1);
    cm_tensor *y = mlm_labels(m, b, ids), *yh = NULL;
    if (y && cm_tensor_device(y) != CM_DEVICE_CPU && cm_tensor_to_device(y, CM_DEVICE_CPU, &yh) != CM_OK) y = NULL;
    const int64_t n = y ? cmi_labelled(yh ? yh : y, NULL, NULL) : 0;
    cm_tensor_free(yh);
    if (!n) return cm_bert_flops_per_sequence(&m->cfg, m->mlm, L);
    /* the head runs on n of the batch's B·L positions */
    const double C = (double)m->cfg.hidden_size, head = 6.0 * (C * C + C * (double)m->cfg.vocab_size) * (double)L;
    const double frac = (double)n / (double)cm_tensor_numel(ids);
    return cm_bert_flops_per_sequence(&m->cfg, true, L) - head * (1.0 - frac);
}
static cm_module *bm_module(void *self) { return ((bert_model *)self)->root; }
static void bm_free(void *self) {
    bert_model *m = self;
    cm_module_free(m->root);
    cm_free(m);
}

static const cm_model_i mlm_model_vt = {CM_MODEL_ABI, "BertForMaskedLM", bm_forward, bm_loss, NULL, bm_n_metrics,
                                        bm_metric, bm_flops, bm_module, bm_free};
static const cm_model_i seqcls_model_vt = {CM_MODEL_ABI, "BertForSequenceClassification", bm_forward, bm_loss, NULL,
                                           bm_n_metrics, bm_metric, bm_flops, bm_module, bm_free};

static cm_status make_model(const cm_bert_config *cfg, cm_rng *rng, bool mlm, cm_model **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_bert_%s_new: out is NULL", mlm ? "mlm" : "classifier");
    *out = NULL;
    cm_status st = cm_bert_config_check(cfg);
    if (st) return st;
    cm_module *root = NULL;
    if ((st = mlm ? build_mlm(cfg, rng, &root) : build_seqcls(cfg, rng, &root))) return st;
    if ((st = cm_module_finalize(root))) {
        cm_module_free(root);
        return st;
    }
    bert_model *m = cm_alloc_zeroed(sizeof *m, 8);
    if (!m) {
        cm_module_free(root);
        return cm_set_error(CM_ERR_OOM, "cm_bert_%s_new: out of memory", mlm ? "mlm" : "classifier");
    }
    m->magic = BERT_MAGIC, m->cfg = *cfg, m->mlm = mlm, m->root = root;
    if ((st = cm_model_new(mlm ? &mlm_model_vt : &seqcls_model_vt, m, out))) bm_free(m);
    return st;
}

cm_status cm_bert_mlm_new(const cm_bert_config *cfg, cm_rng *rng, cm_model **out) {
    return make_model(cfg, rng, true, out);
}
cm_status cm_bert_classifier_new(const cm_bert_config *cfg, cm_rng *rng, cm_model **out) {
    return make_model(cfg, rng, false, out);
}

static bert_model *as_bert(const cm_model *m) {
    if (!m) return NULL;
    const char *t = cm_model_type_name(m);
    if (strcmp(t, "BertForMaskedLM") && strcmp(t, "BertForSequenceClassification")) return NULL;
    /* the type name alone could be another model's: check the module tree's type and the mark */
    const cm_module_i *vt = cm_module_vtable(cm_model_module(m));
    bert_model *b = cm_model_self(m);
    return (vt == &mlm_vt || vt == &seqcls_vt) && b && b->magic == BERT_MAGIC ? b : NULL;
}

const cm_bert_config *cm_bert_model_config(const cm_model *m) {
    bert_model *b = as_bert(m);
    return b ? &b->cfg : NULL;
}

cm_status cm_bert_mlm_sparse_logits(cm_model *m, bool on) {
    bert_model *b = as_bert(m);
    if (!b || !b->mlm)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_bert_mlm_sparse_logits: %s is not a BertForMaskedLM zoo model",
                            m ? cm_model_type_name(m) : "NULL");
    b->sparse = on;
    return CM_OK;
}

/* ---- weights ---- */

typedef struct {
    const cm_load_opts *user;
} rename_ctx;

static bool starts_with(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

/* The user's renaming, then Hugging Face's: a bare BertModel's names get "bert.", and TF-era
 * LayerNorm.gamma / LayerNorm.beta become weight / bias. */
static bool hf_rename(const char *file_name, char *buf, size_t cap, void *data) {
    const rename_ctx *c = data;
    char tmp[512];
    const char *name = file_name;
    bool changed = false;
    if (c->user && c->user->rename && c->user->rename(file_name, tmp, sizeof tmp, c->user->rename_data)) {
        name = tmp;
        changed = true;
    }
    char out[600];
    if (starts_with(name, "embeddings.") || starts_with(name, "encoder.") || starts_with(name, "pooler.")) {
        snprintf(out, sizeof out, "bert.%s", name);
        changed = true;
    } else {
        snprintf(out, sizeof out, "%s", name);
    }
    size_t n = strlen(out);
    if (n >= 15 && !strcmp(out + n - 15, "LayerNorm.gamma")) {
        strcpy(out + n - 5, "weight");
        changed = true;
    } else if (n >= 14 && !strcmp(out + n - 14, "LayerNorm.beta")) {
        strcpy(out + n - 4, "bias");
        changed = true;
    }
    if (!changed) return false;
    snprintf(buf, cap, "%s", out);
    return true;
}

#define MAX_IGNORE 64

cm_status cm_bert_load_safetensors(cm_model *m, const char *path, const cm_load_opts *opts, cm_load_report *report) {
    bert_model *b = as_bert(m);
    if (!b) return cm_set_error(CM_ERR_INVALID_ARG, "cm_bert_load_safetensors: not a BERT zoo model (%s)",
                                m ? cm_model_type_name(m) : "NULL");
    if (!path) return cm_set_error(CM_ERR_INVALID_ARG, "cm_bert_load_safetensors: path is NULL");
    cm_load_opts user = opts ? *opts : cm_load_opts_default();
    if (user.n_ignore < 0 || user.n_ignore > MAX_IGNORE - 4 || (user.n_ignore && !user.ignore))
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_bert_load_safetensors: %d ignore patterns (at most %d)",
                            user.n_ignore, MAX_IGNORE - 4);
    const char *ign[MAX_IGNORE];
    int n = 0;
    for (int i = 0; i < user.n_ignore; i++) ign[n++] = user.ignore[i];
    ign[n++] = "bert.embeddings.position_ids";
    ign[n++] = "bert.embeddings.token_type_ids";
    rename_ctx rc = {&user};
    cm_load_opts o = user;
    o.ignore = ign, o.n_ignore = n;
    o.rename = hf_rename, o.rename_data = &rc;
    return cm_module_load_safetensors(b->root, path, &o, report);
}

cm_status cm_bert_save_safetensors(cm_model *m, const char *path) {
    bert_model *b = as_bert(m);
    if (!b) return cm_set_error(CM_ERR_INVALID_ARG, "cm_bert_save_safetensors: not a BERT zoo model (%s)",
                                m ? cm_model_type_name(m) : "NULL");
    if (!path) return cm_set_error(CM_ERR_INVALID_ARG, "cm_bert_save_safetensors: path is NULL");
    cm_safetensors_writer *w;
    cm_status st = cm_safetensors_writer_new(&w);
    if (st) return st;
    st = cm_safetensors_writer_add_metadata(w, "format", "pt");
    for (int64_t i = 0; !st && i < cm_module_n_params(b->root); i++) {
        cm_param_info pi = cm_module_param_info(b->root, i);
        st = cm_safetensors_writer_add(w, pi.name, pi.tensor);
    }
    for (int64_t i = 0; !st && i < cm_module_n_buffers(b->root); i++) {
        cm_buffer_info bi = cm_module_buffer_info(b->root, i);
        st = cm_safetensors_writer_add(w, bi.name, bi.tensor);
    }
    if (!st && b->mlm) { /* the tied aliases a strict torch load_state_dict expects */
        st = cm_safetensors_writer_add(w, "cls.predictions.decoder.weight",
                                       cm_module_find_param(b->root, "cls.predictions.decoder.weight"));
        if (!st)
            st = cm_safetensors_writer_add(w, "cls.predictions.decoder.bias",
                                           cm_module_find_param(b->root, "cls.predictions.bias"));
    }
    if (!st) st = cm_safetensors_writer_write(w, path);
    cm_safetensors_writer_free(w);
    return st;
}

/* ---- MLM masking ---- */

cm_bert_mlm_mask_config cm_bert_mlm_mask_config_default(void) {
    cm_bert_mlm_mask_config c;
    memset(&c, 0, sizeof c);
    c.mlm_probability = 0.15f;
    c.mask_replace_prob = 0.8f;
    c.random_replace_prob = 0.1f;
    c.mask_token_id = 103;
    c.vocab_size = 30522;
    for (int i = 0; i < 8; i++) c.special_ids[i] = -1;
    c.special_ids[0] = 101, c.special_ids[1] = 102, c.special_ids[2] = 0;
    return c;
}

cm_status cm_bert_mlm_mask_config_from_tokenizer(const cm_tokenizer *tok, uint64_t seed, cm_bert_mlm_mask_config *out) {
    if (!tok || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_bert_mlm_mask_config_from_tokenizer: NULL argument");
    int32_t mask = cm_tokenizer_special(tok, CM_TOKEN_MASK);
    if (mask < 0)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "cm_bert_mlm_mask_config_from_tokenizer: the %s tokenizer has no [MASK] token (use a "
                            "WordPiece vocabulary with [MASK])",
                            cm_tokenizer_type_name(tok));
    cm_bert_mlm_mask_config c = cm_bert_mlm_mask_config_default();
    c.mask_token_id = mask;
    c.vocab_size = cm_tokenizer_vocab_size(tok);
    c.seed = seed;
    const cm_token_special sp[4] = {CM_TOKEN_CLS, CM_TOKEN_SEP, CM_TOKEN_PAD, CM_TOKEN_UNK};
    for (int i = 0; i < 8; i++) c.special_ids[i] = -1;
    for (int i = 0, k = 0; i < 4; i++) {
        int32_t id = cm_tokenizer_special(tok, sp[i]);
        if (id >= 0) c.special_ids[k++] = id;
    }
    *out = c;
    return CM_OK;
}

static cm_status check_mask_cfg(const char *fn, const cm_bert_mlm_mask_config *c) {
    if (!c) return cm_set_error(CM_ERR_INVALID_ARG, "%s: config is NULL", fn);
    if (!prob_ok(c->mlm_probability) || !prob_ok(c->mask_replace_prob) || !prob_ok(c->random_replace_prob) ||
        c->mask_replace_prob + c->random_replace_prob > 1.0f + 1e-6f)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "%s: mlm_probability %g, mask_replace_prob %g and random_replace_prob %g must be in [0, 1] "
                            "and mask + random at most 1",
                            fn, c->mlm_probability, c->mask_replace_prob, c->random_replace_prob);
    if (c->vocab_size < 1 || c->mask_token_id < 0 || c->mask_token_id >= c->vocab_size)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: mask_token_id %d must be in [0, vocab_size %lld)", fn,
                            (int)c->mask_token_id, (long long)c->vocab_size);
    return CM_OK;
}

static float u01(uint32_t w) { return (float)(w >> 8) * (1.0f / 16777216.0f); }

/* Position i of a sequence: one Philox block (seed, sample, i) — word 0 selects, word 1 picks the
 * replacement, words 2-3 the random id. Returns the new id and sets *label. */
static int64_t mask_one(const cm_bert_mlm_mask_config *c, uint64_t sample, int64_t i, int64_t id, bool eligible,
                        int64_t *label) {
    *label = -100;
    if (!eligible) return id;
    for (int k = 0; k < 8; k++)
        if (c->special_ids[k] >= 0 && id == c->special_ids[k]) return id;
    uint32_t w[4];
    cm_philox4x32(c->seed, sample, (uint64_t)i, w);
    if (!(u01(w[0]) < c->mlm_probability)) return id;
    *label = id;
    float r = u01(w[1]);
    if (r < c->mask_replace_prob) return c->mask_token_id;
    if (r < c->mask_replace_prob + c->random_replace_prob) {
        uint64_t x = ((uint64_t)w[2] << 32) | w[3];
        return (int64_t)(((unsigned __int128)x * (uint64_t)c->vocab_size) >> 64);
    }
    return id;
}

cm_status cm_bert_mlm_mask(const cm_bert_mlm_mask_config *cfg, uint64_t sample_index, int64_t L, int32_t *ids,
                           const int32_t *attention_mask, int64_t *labels, int64_t *n_selected) {
    cm_status st = check_mask_cfg("cm_bert_mlm_mask", cfg);
    if (st) return st;
    if (L < 0 || (L > 0 && (!ids || !labels)))
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_bert_mlm_mask: L %lld must be >= 0 with ids and labels set",
                            (long long)L);
    int64_t n = 0;
    for (int64_t i = 0; i < L; i++) {
        ids[i] = (int32_t)mask_one(cfg, sample_index, i, ids[i], !attention_mask || attention_mask[i], &labels[i]);
        n += labels[i] != -100;
    }
    if (n_selected) *n_selected = n;
    return CM_OK;
}

cm_status cm_bert_mlm_mask_batch(const cm_bert_mlm_mask_config *cfg, uint64_t first_sample_index,
                                 cm_tensor *input_ids, const cm_tensor *attention_mask, cm_tensor *labels) {
    cm_status st = check_mask_cfg("cm_bert_mlm_mask_batch", cfg);
    if (st) return st;
    if (!input_ids || !labels)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_bert_mlm_mask_batch: input_ids and labels are required");
    char s1[64], s2[64];
    cm_dtype dt = cm_tensor_dtype(input_ids);
    if ((dt != CM_DTYPE_I32 && dt != CM_DTYPE_I64) || cm_tensor_dtype(labels) != CM_DTYPE_I64 ||
        (attention_mask && cm_tensor_dtype(attention_mask) != CM_DTYPE_I32))
        return cm_set_error(CM_ERR_DTYPE,
                            "cm_bert_mlm_mask_batch: input_ids must be i32 or i64 (got %s), labels i64 (got %s), "
                            "attention_mask i32 (got %s)",
                            cm_dtype_name(dt), cm_dtype_name(cm_tensor_dtype(labels)),
                            attention_mask ? cm_dtype_name(cm_tensor_dtype(attention_mask)) : "none");
    bool ok = cm_tensor_ndim(input_ids) == 2 && cm_tensor_is_contiguous(input_ids) && cm_tensor_is_contiguous(labels) &&
              cm_tensor_ndim(labels) == 2 && cm_tensor_dim(labels, 0) == cm_tensor_dim(input_ids, 0) &&
              cm_tensor_dim(labels, 1) == cm_tensor_dim(input_ids, 1);
    if (ok && attention_mask)
        ok = cm_tensor_ndim(attention_mask) == 2 && cm_tensor_is_contiguous(attention_mask) &&
             cm_tensor_dim(attention_mask, 0) == cm_tensor_dim(input_ids, 0) &&
             cm_tensor_dim(attention_mask, 1) == cm_tensor_dim(input_ids, 1);
    if (!ok)
        return cm_set_error(CM_ERR_SHAPE,
                            "cm_bert_mlm_mask_batch: input_ids %s, labels %s (and attention_mask) must be contiguous "
                            "(B, L) of the same shape",
                            cm_tensor_shape_str(input_ids, s1, sizeof s1), cm_tensor_shape_str(labels, s2, sizeof s2));
    const int64_t B = cm_tensor_dim(input_ids, 0), L = cm_tensor_dim(input_ids, 1);
    int64_t *lab = cm_tensor_data(labels);
    const int32_t *am = attention_mask ? cm_tensor_data(attention_mask) : NULL;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t i = 0; i < L; i++) {
            const int64_t k = b * L + i;
            const bool eligible = !am || am[k];
            if (dt == CM_DTYPE_I32) {
                int32_t *ids = cm_tensor_data(input_ids);
                ids[k] = (int32_t)mask_one(cfg, first_sample_index + (uint64_t)b, i, ids[k], eligible, &lab[k]);
            } else {
                int64_t *ids = cm_tensor_data(input_ids);
                ids[k] = mask_one(cfg, first_sample_index + (uint64_t)b, i, ids[k], eligible, &lab[k]);
            }
        }
    }
    return CM_OK;
}
