/* The token-file dataset: language-model windows over a memory-mapped llm.c token file. */
#include <composer/datasets.h>

#include <string.h>

#include "data/formats.h"

typedef struct tokens_ds {
    cm_blob blob;
    cm_tokfile tf;
    char *path;
    int64_t T;
    int64_t n_samples;
    int64_t vocab_size;
    bool i64;
    cm_field_desc fields[2];
} tokens_ds;

cm_tokens_config cm_tokens_config_default(void) {
    return (cm_tokens_config){.seq_len = 1024, .dtype = CM_DTYPE_I32, .vocab_size = 0};
}

static int64_t tok_len(void *self) { return ((tokens_ds *)self)->n_samples; }
static int tok_n_fields(void *self) { return 2; }
static const cm_field_desc *tok_field(void *self, int i) { return &((tokens_ds *)self)->fields[i]; }
static int64_t tok_n_tokens(void *self, int64_t index) { return ((tokens_ds *)self)->T; }

static cm_status tok_get(void *self, int64_t index, const cm_sample_ctx *ctx, void *const *out) {
    tokens_ds *d = self;
    return cm_tokfile_window(&d->tf, index * d->T, d->T, d->i64, d->vocab_size, d->path, out[0], out[1]);
}

static void tok_close(void *self) {
    tokens_ds *d = self;
    cm_blob_release(&d->blob);
    cm_free(d->path);
    cm_free(d);
}

static const cm_dataset_i k_tokens_vt = {
    .abi = CM_DATASET_ABI,
    .type_name = "tokens",
    .len = tok_len,
    .n_fields = tok_n_fields,
    .field = tok_field,
    .get = tok_get,
    .n_tokens = tok_n_tokens,
    .close = tok_close,
};

cm_status cm_dataset_tokens_new(const char *path, const cm_tokens_config *cfg, cm_dataset **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_dataset_tokens_new: out is NULL");
    *out = NULL;
    if (!path) return cm_set_error(CM_ERR_INVALID_ARG, "cm_dataset_tokens_new: path is NULL");
    cm_tokens_config c = cfg ? *cfg : cm_tokens_config_default();
    if (c.seq_len < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "tokens '%s': seq_len %lld must be >= 1", path, (long long)c.seq_len);
    if (c.dtype != CM_DTYPE_I32 && c.dtype != CM_DTYPE_I64)
        return cm_set_error(CM_ERR_INVALID_ARG, "tokens '%s': dtype %s is not an id type (use i32 or i64)", path,
                            cm_dtype_name(c.dtype));
    if (c.vocab_size < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "tokens '%s': vocab_size %lld must be >= 0 (0 = no check)", path,
                            (long long)c.vocab_size);
    tokens_ds *d = cm_alloc_zeroed(sizeof *d, 64);
    size_t plen = strlen(path);
    char *pcopy = cm_alloc(plen + 1, 16);
    if (!d || !pcopy) {
        cm_free(d);
        cm_free(pcopy);
        return cm_set_error(CM_ERR_OOM, "tokens '%s': out of memory", path);
    }
    memcpy(pcopy, path, plen + 1);
    d->path = pcopy;
    cm_status st = cm_blob_map(path, &d->blob);
    if (st == CM_OK) st = cm_tokfile_parse(d->blob.data, d->blob.size, path, &d->tf);
    if (st == CM_OK && d->tf.n_tokens < c.seq_len + 1)
        st = cm_set_error(CM_ERR_INVALID_ARG, "tokens '%s': seq_len %lld needs %lld tokens per sample but the file "
                          "holds only %lld (use a shorter seq_len or a bigger file)", path, (long long)c.seq_len,
                          (long long)c.seq_len + 1, (long long)d->tf.n_tokens);
    if (st != CM_OK) {
        tok_close(d);
        return st;
    }
    d->T = c.seq_len;
    d->n_samples = (d->tf.n_tokens - 1) / c.seq_len;
    d->vocab_size = c.vocab_size;
    d->i64 = c.dtype == CM_DTYPE_I64;
    d->fields[0] = (cm_field_desc){.name = "input_ids", .dtype = c.dtype, .ndim = 1, .shape = {c.seq_len}};
    d->fields[1] = (cm_field_desc){.name = "labels", .dtype = c.dtype, .ndim = 1, .shape = {c.seq_len}};
    st = cm_dataset_new(&k_tokens_vt, d, out);
    if (st != CM_OK) tok_close(d);
    return st;
}
