/* ALiBi (Press et al. 2021; Composer's Alibi): attention with linear biases instead of position
 * embeddings. The attention modules of GPT-2 and BERT switch their bias on (cm_nn_attention_set_alibi:
 * scores get -slope_h·|i - j|, which after the causal mask and the softmax equals Composer's GPT-2
 * form slope_h·j), and the position embeddings are "removed" as Composer removes them: replaced by
 * a zero, frozen Embedding of max_sequence_length rows (zero_and_freeze_expand_position_embeddings),
 * which also sets the longest sequence the model takes. */
#include "plugins/surgery/surgery_impl.h"
#include "plugins/data_algos/da_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void cm_alibi_slopes(int64_t n_heads, float *slopes) { cm_nn_alibi_slopes(n_heads, slopes); }

void cm_alibi_bias(int64_t n_heads, int64_t T, float *bias) {
    float slopes[1024];
    const int64_t H = n_heads < 1024 ? n_heads : 1024;
    cm_nn_alibi_slopes(H, slopes);
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < T; i++)
            for (int64_t j = 0; j < T; j++) bias[(h * T + i) * T + j] = -slopes[h] * (float)(i > j ? i - j : j - i);
}

static bool is_type(const cm_module *m, const char *t) { return m && !strcmp(cm_module_type_name(m), t); }

static bool is_attention(const cm_module *m) { return is_type(m, "GPT2Attention") || is_type(m, "BertSelfAttention"); }

/* The position embedding of a GPT-2 body or BERT embeddings module. */
static bool is_pos_embedding(const cm_module *m) {
    const cm_module *p = cm_module_parent(m);
    return is_type(m, "Embedding") && ((is_type(p, "GPT2Model") && !strcmp(cm_module_name(m), "wpe")) ||
                                       (is_type(p, "BertEmbeddings") && !strcmp(cm_module_name(m), "position_embeddings")));
}

/* Already zeroed, frozen and max_seq long? */
static bool pos_done(cm_module *m, int64_t max_seq) {
    int64_t rows;
    cm_tensor *w = cm_module_param(m, "weight");
    if (cm_nn_embedding_dims(m, &rows, NULL) || rows != max_seq || !w || cm_tensor_requires_grad(w)) return false;
    cm_tensor *h = NULL; /* a model on a GPU (applied again on INIT after the move): read a host copy */
    if (cm_tensor_device(w) != CM_DEVICE_CPU && cm_tensor_to_device(w, CM_DEVICE_CPU, &h) != CM_OK) return false;
    const float *d = cm_tensor_data(h ? h : w);
    bool zero = true;
    for (int64_t i = 0, n = cm_tensor_numel(w); i < n && zero; i++) zero = d[i] == 0;
    cm_tensor_free(h);
    return zero;
}

typedef struct {
    int64_t max_seq;
    int64_t attn, attn_on, pos, pos_done, replaced;
} al_ctx;

static bool scan_visit(cm_module *m, const char *path, int depth, void *data) {
    al_ctx *c = data;
    if (is_attention(m)) {
        cm_nn_attention_config ac;
        c->attn++;
        if (!cm_nn_attention_config_of(m, &ac) && ac.alibi) c->attn_on++;
    }
    if (is_pos_embedding(m)) c->pos++, c->pos_done += pos_done(m, c->max_seq);
    return true;
}

static bool attn_visit(cm_module *m, const char *path, int depth, void *data) {
    if (is_attention(m)) cm_nn_attention_set_alibi(m, true);
    return true;
}

static bool pos_match(cm_module *m, const char *path, void *data) {
    return is_pos_embedding(m) && !pos_done(m, ((al_ctx *)data)->max_seq);
}

static cm_status pos_make(cm_module *old, const char *path, void *data, cm_module **out) {
    al_ctx *c = data;
    int64_t dim;
    cm_status st = cm_nn_embedding_dims(old, NULL, &dim);
    if (st || (st = cm_nn_embedding_new(c->max_seq, dim, NULL, out))) return st; /* NULL rng: zeros */
    if ((st = cm_module_set_requires_grad(*out, NULL, false, NULL))) {
        cm_module_free(*out);
        *out = NULL;
        return st;
    }
    c->replaced++;
    return CM_OK;
}

cm_status cm_apply_alibi(cm_module *root, int64_t max_sequence_length, int64_t *n_changed) {
    if (n_changed) *n_changed = 0;
    if (max_sequence_length < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "ALiBi: max_sequence_length %lld must be at least 1",
                            (long long)max_sequence_length);
    if (!root) return cm_set_error(CM_ERR_INVALID_ARG, "cm_apply_alibi: the model is NULL");
    al_ctx c = {max_sequence_length, 0, 0, 0, 0, 0};
    cm_module_visit(root, scan_visit, &c);
    if (!c.attn)
        return cmi_nothing_to_apply(root, "ALiBi",
                                    "GPT2Attention and BertSelfAttention modules (with position embeddings at "
                                    "GPT2Model.wpe or BertEmbeddings.position_embeddings)",
                                    "ALiBi supports the zoo's GPT-2 and BERT");
    cm_status st;
    if (c.pos_done < c.pos) {
        if ((st = cmi_surgery_check_unlocked(root, "ALiBi", "cm_apply_alibi"))) return st;
        if ((st = cm_module_replace(root, pos_match, pos_make, &c, NULL))) return st;
    }
    cm_module_visit(root, attn_visit, NULL);
    if (n_changed) *n_changed = (c.attn - c.attn_on) + c.replaced;
    if (!c.pos)
        cm_log_msg(CM_LOG_WARN, "ALiBi: %s has no position embedding it knows (GPT2Model.wpe, "
                                "BertEmbeddings.position_embeddings); only the attention bias was added",
                   cm_module_type_name(root));
    if ((c.attn - c.attn_on) + c.replaced)
        cm_log_msg(CM_LOG_INFO, "ALiBi: %lld attention modules of %s biased, %lld position embeddings zeroed and frozen "
                                "at %lld positions", (long long)c.attn, cm_module_type_name(root), (long long)c.pos,
                   (long long)max_sequence_length);
    return CM_OK;
}

/* ---- the algorithm ---- */

typedef struct {
    cm_alibi_config cfg;
    cmi_da_owned owned; /* the re-cut batch's tensors, until the next batch */
    cmi_da_rows rows;
} al_self;

static bool al_match(void *self, cm_event ev, const cm_state *st) {
    const al_self *s = self;
    return ev == CM_EVENT_INIT || (ev == CM_EVENT_AFTER_DATALOADER && s->cfg.train_sequence_length_scaling != 1);
}

/* Composer's reshape on AFTER_DATALOADER: every field (B, T) of the training batch becomes
 * (int(B / s), int(T · s)) — the same tokens in more, shorter rows (ALiBi extrapolates to the
 * full length at evaluation, which is not reshaped). Like torch's reshape, sizes whose product is
 * not B·T are an error. */
static cm_status al_reshape(al_self *s, cm_state *st, cm_logger *lg) {
    const double sc = s->cfg.train_sequence_length_scaling;
    cmi_da_owned_clear(&s->owned);
    cm_batch *b = cm_state_batch(st);
    if (!b) return cm_set_error(CM_ERR_STATE, "Alibi: there is no batch");
    int64_t T = 0;
    for (int i = 0; i < b->n_fields && !T; i++)
        if (cm_tensor_ndim(b->fields[i]) > 1) T = cm_tensor_dim(b->fields[i], 1);
    const int64_t B = b->n_rows, rows = (int64_t)((double)B / sc), L = (int64_t)((double)T * sc);
    if (!T || L < 1 || rows * L != B * T)
        return cm_set_error(CM_ERR_SHAPE,
                            "Alibi: train_sequence_length_scaling %g cannot reshape a batch of %lld rows of %lld "
                            "positions into %lld rows of %lld (int(B / s) x int(T · s) must hold the batch's %lld "
                            "positions): choose a scaling that divides both, or a batch size that it divides",
                            sc, (long long)B, (long long)T, (long long)rows, (long long)L, (long long)(B * T));
    cm_tensor *out[CM_DATASET_MAX_FIELDS];
    int64_t got;
    cm_status r = cm_set_batch_sequence_length(b->names, b->fields, b->n_fields, L, false, false, out, &got);
    if (r) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(r, "Alibi: train_sequence_length_scaling %g reshapes the training batch, but: %s (a batch "
                               "with per-sample fields, such as a classifier's label, needs "
                               "train_sequence_length_scaling: 1.0)",
                            sc, msg);
    }
    if ((r = cmi_da_set_recut_batch(st, b, out, got, L, false, &s->owned, &s->rows))) return r;
    const cm_metric_value v[] = {{"alibi/train_seq_len", (double)L}, {"alibi/train_bs", (double)got}};
    return cm_logger_log_metrics(lg, v, 2);
}

static cm_status al_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    al_self *s = self;
    if (ev == CM_EVENT_AFTER_DATALOADER) return al_reshape(s, st, lg);
    cm_module *root;
    cm_status r = cmi_state_root(st, "ALiBi", &root);
    return r ? r : cm_apply_alibi(root, s->cfg.max_sequence_length, NULL);
}

static void al_free(void *self) {
    al_self *s = self;
    if (!s) return;
    cmi_da_owned_clear(&s->owned);
    cmi_da_rows_free(&s->rows);
    cm_free(s);
}

static const cm_algorithm_i al_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "Alibi",
    .match = al_match,
    .apply = al_apply,
    .free = al_free,
};

cm_alibi_config cm_alibi_config_default(void) { return (cm_alibi_config){0, 0.25}; }

cm_status cm_alibi_new(const cm_alibi_config *cfg, cm_algorithm_plugin *out) {
    if (!out || !cfg) return cm_set_error(CM_ERR_INVALID_ARG, "cm_alibi_new: NULL argument");
    if (cfg->max_sequence_length < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "Alibi: max_sequence_length is required (at least 1; got %lld)",
                            (long long)cfg->max_sequence_length);
    if (!(cfg->train_sequence_length_scaling > 0 && cfg->train_sequence_length_scaling <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "Alibi: train_sequence_length_scaling %g must be in (0, 1]",
                            cfg->train_sequence_length_scaling);
    al_self *s = cm_alloc_zeroed(sizeof *s, 16);
    if (!s) return CM_ERR_OOM;
    s->cfg = *cfg;
    *out = (cm_algorithm_plugin){&al_vt, s};
    return CM_OK;
}

static void cfg_default(void *c) { *(cm_alibi_config *)c = cm_alibi_config_default(); }
static cm_status make(const void *c, cm_algorithm_plugin *out) { return cm_alibi_new(c, out); }

static const cmi_arg k_args[] = {
    {{"max_sequence_length", CM_ALGO_ARG_INT, NULL, NULL, 0}, offsetof(cm_alibi_config, max_sequence_length), false},
    {{"train_sequence_length_scaling", CM_ALGO_ARG_REAL, "0.25", NULL, 0},
     offsetof(cm_alibi_config, train_sequence_length_scaling), false},
};

const cmi_algo_entry cmi_alibi_entry = {
    {"Alibi", "alibi", true, 2}, &al_vt, sizeof(cm_alibi_config), cfg_default, k_args, 2, make,
};
