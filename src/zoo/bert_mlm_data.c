/* The masked-LM dataset (zoo_bert.h): another dataset's samples with their input_ids masked by
 * cm_bert_mlm_mask and "labels" added, the masks a pure function of (seed, epoch, sample). */
#include <composer/zoo_bert.h>

#include <string.h>

typedef struct mlm_ds {
    cm_dataset *inner;
    cm_bert_mlm_mask_config cfg;
    int n_inner;    /* fields of the inner dataset; "labels" is field n_inner */
    int f_ids, f_mask;
    int64_t L;
    cm_field_desc fields[CM_DATASET_MAX_FIELDS];
} mlm_ds;

static int64_t m_len(void *self) { return cm_dataset_len(((mlm_ds *)self)->inner); }
static int m_n_fields(void *self) { return ((mlm_ds *)self)->n_inner + 1; }
static const cm_field_desc *m_field(void *self, int i) { return &((mlm_ds *)self)->fields[i]; }
static int64_t m_n_tokens(void *self, int64_t i) { return cm_dataset_n_tokens(((mlm_ds *)self)->inner, i); }

/* The masking seed of an epoch: training draws new masks every epoch (as the collator re-masks
 * each time it sees a sample); evaluation keeps epoch 0's, so every evaluation scores the same
 * masked positions. */
static uint64_t epoch_seed(const mlm_ds *d, const cm_sample_ctx *ctx) {
    uint64_t key[3] = {d->cfg.seed, ctx ? ctx->seed : 0, ctx && ctx->training ? (uint64_t)ctx->epoch : 0};
    return cm_hash64(key, sizeof key, 0x6d6c6d6d61736bULL /* "mlmmask" */);
}

static cm_status m_get(void *self, int64_t index, const cm_sample_ctx *ctx, void *const *out) {
    const mlm_ds *d = self;
    cm_status st = cm_dataset_get(d->inner, index, ctx, out);
    if (st != CM_OK) return st;
    cm_bert_mlm_mask_config c = d->cfg;
    c.seed = epoch_seed(d, ctx);
    return cm_bert_mlm_mask(&c, (uint64_t)index, d->L, out[d->f_ids], d->f_mask >= 0 ? out[d->f_mask] : NULL,
                            out[d->n_inner], NULL);
}

static void m_close(void *self) {
    mlm_ds *d = self;
    if (!d) return;
    cm_dataset_free(d->inner);
    cm_free(d);
}

static const cm_dataset_i k_mlm_vt = {.abi = CM_DATASET_ABI, .type_name = "mlm", .len = m_len, .n_fields = m_n_fields,
                                      .field = m_field, .get = m_get, .n_tokens = m_n_tokens, .close = m_close};

cm_status cm_bert_mlm_dataset_new(cm_dataset *inner, const cm_bert_mlm_mask_config *cfg, cm_dataset **out) {
    if (!inner || !cfg || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_bert_mlm_dataset_new: NULL argument");
    *out = NULL;
    /* the masking config is checked on a zero-length sequence */
    cm_status st = cm_bert_mlm_mask(cfg, 0, 0, NULL, NULL, NULL, NULL);
    if (st != CM_OK) return st;
    const int n = cm_dataset_n_fields(inner);
    const int f_ids = cm_dataset_find_field(inner, "input_ids"), f_mask = cm_dataset_find_field(inner, "attention_mask");
    if (f_ids < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "masked LM: the %s dataset has no \"input_ids\" field to mask",
                            cm_dataset_type_name(inner));
    if (cm_dataset_find_field(inner, "labels") >= 0 || n >= CM_DATASET_MAX_FIELDS)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "masked LM: the %s dataset already has a \"labels\" field, or no room for one (%d fields)",
                            cm_dataset_type_name(inner), n);
    const cm_field_desc *fi = cm_dataset_field(inner, f_ids);
    const cm_field_desc *fm = f_mask >= 0 ? cm_dataset_field(inner, f_mask) : NULL;
    if (fi->dtype != CM_DTYPE_I32 || fi->ndim != 1 ||
        (fm && (fm->dtype != CM_DTYPE_I32 || fm->ndim != 1 || fm->shape[0] != fi->shape[0])))
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "masked LM: the %s dataset's input_ids (and attention_mask) must be i32 sequences of one "
                            "length",
                            cm_dataset_type_name(inner));
    mlm_ds *d = cm_alloc_zeroed(sizeof *d, 64);
    if (!d) return CM_ERR_OOM;
    d->cfg = *cfg, d->n_inner = n, d->f_ids = f_ids, d->f_mask = f_mask, d->L = fi->shape[0];
    for (int i = 0; i < n; i++) d->fields[i] = *cm_dataset_field(inner, i);
    d->fields[n].name = "labels";
    d->fields[n].dtype = CM_DTYPE_I64;
    d->fields[n].ndim = 1;
    d->fields[n].shape[0] = d->L;
    d->inner = inner;
    st = cm_dataset_new(&k_mlm_vt, d, out);
    if (st != CM_OK) {
        d->inner = NULL; /* not taken on failure */
        m_close(d);
    }
    return st;
}
