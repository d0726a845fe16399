/* The token-file dataset: language-model windows over memory-mapped llm.c token files — one file,
 * or every shard matching a glob pattern, as llm.c's loader takes them. */
#include <composer/datasets.h>

#include <glob.h>
#include <string.h>

#include "data/formats.h"

typedef struct tok_shard {
    cm_blob blob;
    cm_tokfile tf;
    char *path;
} tok_shard;

typedef struct tokens_ds {
    int n_shards;
    tok_shard *shards;
    int64_t *first; /* (n_shards + 1): index of each shard's first sample; first[n_shards] = len */
    int64_t T;
    int64_t vocab_size;
    bool i64;
    cm_field_desc fields[2];
} tokens_ds;

cm_tokens_config cm_tokens_config_default(void) {
    return (cm_tokens_config){.seq_len = 1024, .dtype = CM_DTYPE_I32, .vocab_size = 0};
}

static int64_t tok_len(void *self) {
    tokens_ds *d = self;
    return d->first[d->n_shards];
}
static int tok_n_fields(void *self) { return 2; }
static const cm_field_desc *tok_field(void *self, int i) { return &((tokens_ds *)self)->fields[i]; }
static int64_t tok_n_tokens(void *self, int64_t index) { return ((tokens_ds *)self)->T; }

static cm_status tok_get(void *self, int64_t index, const cm_sample_ctx *ctx, void *const *out) {
    tokens_ds *d = self;
    int lo = 0, hi = d->n_shards - 1; /* the last shard whose first sample is <= index */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (d->first[mid] <= index) lo = mid;
        else hi = mid - 1;
    }
    const tok_shard *s = &d->shards[lo];
    return cm_tokfile_window(&s->tf, (index - d->first[lo]) * d->T, d->T, d->i64, d->vocab_size, s->path, out[0],
                             out[1]);
}

static void tok_close(void *self) {
    tokens_ds *d = self;
    for (int i = 0; d->shards && i < d->n_shards; i++) {
        cm_blob_release(&d->shards[i].blob);
        cm_free(d->shards[i].path);
    }
    cm_free(d->shards);
    cm_free(d->first);
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

static cm_status open_shard(tok_shard *s, const char *path, int64_t T) {
    size_t plen = strlen(path);
    s->path = cm_alloc(plen + 1, 16);
    if (!s->path) return cm_set_error(CM_ERR_OOM, "tokens '%s': out of memory", path);
    memcpy(s->path, path, plen + 1);
    cm_status st = cm_blob_map(path, &s->blob);
    if (st == CM_OK) st = cm_tokfile_parse(s->blob.data, s->blob.size, path, &s->tf);
    if (st == CM_OK && s->tf.n_tokens - 1 < T) /* (written so a huge seq_len cannot overflow) */
        st = cm_set_error(CM_ERR_INVALID_ARG, "tokens '%s': seq_len %lld needs seq_len + 1 tokens per sample but the "
                          "file holds only %lld (use a shorter seq_len or a bigger file)", path, (long long)T,
                          (long long)s->tf.n_tokens);
    return st;
}

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

    /* A pattern expands to its matches in sorted order; a plain path is used as it is, so a
     * missing file is reported by name. */
    glob_t g;
    memset(&g, 0, sizeof g);
    bool is_pattern = strpbrk(path, "*?[") != NULL;
    size_t n_paths = 1;
    if (is_pattern) {
        int grc = glob(path, GLOB_ERR, NULL, &g);
        if (grc == GLOB_NOMATCH)
            return cm_set_error(CM_ERR_NOT_FOUND, "tokens '%s': the pattern matches no file", path);
        if (grc != 0) {
            globfree(&g);
            return cm_set_error(CM_ERR_IO, "tokens '%s': cannot expand the pattern (glob error %d)", path, grc);
        }
        if (g.gl_pathc > (size_t)INT32_MAX) {
            globfree(&g);
            return cm_set_error(CM_ERR_INVALID_ARG, "tokens '%s': too many matching files", path);
        }
        n_paths = g.gl_pathc;
    }
    cm_status st = CM_OK;
    tokens_ds *d = cm_alloc_zeroed(sizeof *d, 64);
    if (d) {
        d->shards = cm_alloc_zeroed(n_paths * sizeof *d->shards, 64);
        d->first = cm_alloc_zeroed((n_paths + 1) * sizeof *d->first, 64);
    }
    if (!d || !d->shards || !d->first) {
        if (d) tok_close(d);
        if (is_pattern) globfree(&g);
        return cm_set_error(CM_ERR_OOM, "tokens '%s': out of memory", path);
    }
    d->n_shards = (int)n_paths;
    for (size_t i = 0; i < n_paths && st == CM_OK; i++) {
        st = open_shard(&d->shards[i], is_pattern ? g.gl_pathv[i] : path, c.seq_len);
        if (st == CM_OK) d->first[i + 1] = d->first[i] + (d->shards[i].tf.n_tokens - 1) / c.seq_len;
    }
    if (is_pattern) globfree(&g);
    if (st != CM_OK) {
        tok_close(d);
        return st;
    }
    d->T = c.seq_len;
    d->vocab_size = c.vocab_size;
    d->i64 = c.dtype == CM_DTYPE_I64;
    d->fields[0] = (cm_field_desc){.name = "input_ids", .dtype = c.dtype, .ndim = 1, .shape = {c.seq_len}};
    d->fields[1] = (cm_field_desc){.name = "labels", .dtype = c.dtype, .ndim = 1, .shape = {c.seq_len}};
    st = cm_dataset_new(&k_tokens_vt, d, out);
    if (st != CM_OK) tok_close(d);
    return st;
}
