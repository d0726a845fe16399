/* Text datasets for the language models (tokenizer.h): a TSV with named columns for sequence
 * classification, and plain text / TSV sentences for masked-LM (Hugging Face run_mlm's
 * group_texts and line_by_line layouts) and causal-LM training. Everything is tokenised when the
 * dataset opens; get() copies (and pads) from one pool of ids, so it is thread-safe. */
#include "text/text_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Reading TSV files: a header of column names, tab-separated fields, no quoting (GLUE's files)
 * ------------------------------------------------------------------------------------------- */

typedef struct line {
    const char *s;
    size_t n;
    long no; /* 1-based line number */
} line;

/* The next line of data[*pos, len) (without "\n" / "\r\n"); false at the end. */
static bool next_line(const char *data, size_t len, size_t *pos, long *no, line *out) {
    if (*pos >= len) return false;
    const char *s = data + *pos;
    const char *nl = memchr(s, '\n', len - *pos);
    size_t n = nl ? (size_t)(nl - s) : len - *pos;
    *pos += n + 1;
    if (n > 0 && s[n - 1] == '\r') n--;
    out->s = s, out->n = n, out->no = ++*no;
    return true;
}

/* Field k of a tab-separated line (its start and length); false when the line has fewer fields. */
static bool field_at(const line *l, int k, const char **s, size_t *n) {
    const char *p = l->s, *end = l->s + l->n;
    for (int i = 0; i < k; i++) {
        const char *t = memchr(p, '\t', (size_t)(end - p));
        if (!t) return false;
        p = t + 1;
    }
    const char *t = memchr(p, '\t', (size_t)(end - p));
    *s = p;
    *n = (size_t)((t ? t : end) - p);
    return true;
}

static int excerpt(size_t n) { return n > 60 ? 60 : (int)n; }

/* The column called name in the header line (or -1), and the column count. */
static int column_of(const line *h, const char *name, int *n_cols) {
    int found = -1, k = 0;
    const char *s;
    size_t n;
    while (field_at(h, k, &s, &n)) {
        if (name && n == strlen(name) && !memcmp(s, name, n)) found = k;
        k++;
    }
    *n_cols = k;
    return found;
}

/* ---------------------------------------------------------------------------------------------
 * Padded sequences: [CLS] text [SEP] of each sample in a pool, padded in get
 * ------------------------------------------------------------------------------------------- */

typedef struct padded {
    int64_t max_len, n, cap;
    int32_t pad;
    bool with_label;
    int64_t *start; /* (n) offset of sample i in pool */
    int32_t *len;   /* (n) real tokens of sample i */
    int64_t *label; /* (n) when with_label */
    cm_ids pool;
    cm_field_desc fields[4];
} padded;

enum { P_IDS, P_MASK, P_TYPES, P_LABEL };

static int64_t pad_len(void *self) { return ((padded *)self)->n; }
static int pad_n_fields(void *self) { return ((padded *)self)->with_label ? 4 : 3; }
static const cm_field_desc *pad_field(void *self, int i) { return &((padded *)self)->fields[i]; }
static int64_t pad_n_tokens(void *self, int64_t i) { return ((padded *)self)->len[i]; }

static cm_status pad_get(void *self, int64_t i, const cm_sample_ctx *ctx, void *const *out) {
    (void)ctx;
    const padded *d = self;
    int32_t *ids = out[P_IDS], *mask = out[P_MASK], *types = out[P_TYPES];
    const int64_t n = d->len[i];
    memcpy(ids, d->pool.p + d->start[i], (size_t)n * sizeof(int32_t));
    for (int64_t k = n; k < d->max_len; k++) ids[k] = d->pad;
    for (int64_t k = 0; k < d->max_len; k++) mask[k] = k < n;
    memset(types, 0, (size_t)d->max_len * sizeof(int32_t));
    if (d->with_label) memcpy(out[P_LABEL], &d->label[i], sizeof(int64_t));
    return CM_OK;
}

static void pad_close(void *self) {
    padded *d = self;
    if (!d) return;
    cm_free(d->start);
    cm_free(d->len);
    cm_free(d->label);
    cm_free(d->pool.p);
    cm_free(d);
}

static const cm_dataset_i k_tsv_vt = {.abi = CM_DATASET_ABI, .type_name = "tsv", .len = pad_len,
                                      .n_fields = pad_n_fields, .field = pad_field, .get = pad_get,
                                      .n_tokens = pad_n_tokens, .close = pad_close};
static const cm_dataset_i k_lines_vt = {.abi = CM_DATASET_ABI, .type_name = "text", .len = pad_len,
                                        .n_fields = pad_n_fields, .field = pad_field, .get = pad_get,
                                        .n_tokens = pad_n_tokens, .close = pad_close};

static cm_status padded_new(int64_t max_len, int32_t pad, bool with_label, padded **out) {
    padded *d = cm_alloc_zeroed(sizeof *d, 64);
    if (!d) return CM_ERR_OOM;
    d->max_len = max_len, d->pad = pad, d->with_label = with_label;
    static const char *const names[4] = {"input_ids", "attention_mask", "token_type_ids", "label"};
    for (int f = 0; f < 4; f++) {
        d->fields[f].name = names[f];
        d->fields[f].dtype = f == P_LABEL ? CM_DTYPE_I64 : CM_DTYPE_I32;
        d->fields[f].ndim = f == P_LABEL ? 0 : 1;
        d->fields[f].shape[0] = f == P_LABEL ? 0 : max_len;
    }
    *out = d;
    return CM_OK;
}

/* Grows *p from n to cap elements of `elem` bytes (the allocator has no realloc). */
static cm_status grow(void **p, size_t elem, int64_t n, int64_t cap) {
    void *q = cm_alloc(elem * (size_t)cap, 64);
    if (!q) return CM_ERR_OOM;
    if (n) memcpy(q, *p, elem * (size_t)n);
    cm_free(*p);
    *p = q;
    return CM_OK;
}

static cm_status padded_add(padded *d, const int32_t *ids, int64_t n, int64_t label) {
    if (d->n == d->cap) {
        int64_t cap = d->cap ? 2 * d->cap : 1024;
        if (grow((void **)&d->start, sizeof(int64_t), d->n, cap) != CM_OK ||
            grow((void **)&d->len, sizeof(int32_t), d->n, cap) != CM_OK ||
            grow((void **)&d->label, sizeof(int64_t), d->n, cap) != CM_OK)
            return CM_ERR_OOM;
        d->cap = cap;
    }
    d->start[d->n] = d->pool.n;
    d->len[d->n] = (int32_t)n;
    d->label[d->n] = label;
    d->n++;
    return cm_ids_append(&d->pool, ids, n);
}

static bool has_bert_specials(const cm_tokenizer *tok) {
    return tok->special[CM_TOKEN_CLS] >= 0 && tok->special[CM_TOKEN_SEP] >= 0 && tok->special[CM_TOKEN_PAD] >= 0;
}

/* ---------------------------------------------------------------------------------------------
 * TSV classification
 * ------------------------------------------------------------------------------------------- */

cm_tsv_config cm_tsv_config_default(void) {
    cm_tsv_config c;
    memset(&c, 0, sizeof c);
    c.max_len = 128;
    c.text_column = "sentence";
    c.label_column = "label";
    return c;
}

static cm_status parse_label(const char *s, size_t n, int64_t *out) {
    if (n == 0 || n > 18) return CM_ERR_FORMAT;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return CM_ERR_FORMAT;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return CM_OK;
}

cm_status cm_dataset_tsv_new(const char *path, const cm_tokenizer *tok, const cm_tsv_config *cfg, cm_dataset **out) {
    if (!path || !tok || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_dataset_tsv_new: NULL argument");
    *out = NULL;
    cm_tsv_config c = cfg ? *cfg : cm_tsv_config_default();
    if (c.max_len < 3 || c.max_len > (1 << 20))
        return cm_set_error(CM_ERR_INVALID_ARG, "TSV '%s': max_len %lld must be in [3, 1048576] ([CLS], a token, [SEP])",
                            path, (long long)c.max_len);
    if (!c.text_column) return cm_set_error(CM_ERR_INVALID_ARG, "TSV '%s': text_column is required", path);
    if (c.num_labels < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "TSV '%s': num_labels %lld must be >= 0", path, (long long)c.num_labels);
    if (!has_bert_specials(tok))
        return cm_set_error(CM_ERR_INVALID_ARG, "TSV '%s': the %s tokenizer lacks [CLS], [SEP] or [PAD] (use a BERT "
                                                "WordPiece vocabulary)", path, cm_tokenizer_type_name(tok));
    uint8_t *raw;
    size_t len;
    cm_status st = cm_read_file_(path, "TSV", &raw, &len);
    if (st != CM_OK) return st;
    const char *data = (const char *)raw;
    padded *d = NULL;
    int32_t *buf = cm_alloc(sizeof(int32_t) * (size_t)c.max_len, 64);
    if (!buf) st = CM_ERR_OOM;
    if (st == CM_OK) st = padded_new(c.max_len, tok->special[CM_TOKEN_PAD], c.label_column != NULL, &d);
    size_t pos = 0;
    long no = 0;
    line l = {NULL, 0, 0};
    int text_col = -1, label_col = -1, n_cols = 0;
    if (st == CM_OK && !next_line(data, len, &pos, &no, &l))
        st = cm_set_error(CM_ERR_FORMAT, "TSV '%s' is empty (expected a header line naming the columns)", path);
    if (st == CM_OK && memchr(l.s, 0, l.n))
        st = cm_set_error(CM_ERR_FORMAT, "TSV '%s' line 1 contains a NUL byte; is it a text file?", path);
    if (st == CM_OK) {
        text_col = column_of(&l, c.text_column, &n_cols);
        if (c.label_column) label_col = column_of(&l, c.label_column, &n_cols);
        if (text_col < 0 || (c.label_column && label_col < 0))
            st = cm_set_error(CM_ERR_FORMAT,
                              "TSV '%s' line 1: the header \"%.*s\" has no column \"%s\" (text_column / label_column "
                              "name the header's columns)",
                              path, excerpt(l.n), l.s, text_col < 0 ? c.text_column : c.label_column);
    }
    while (st == CM_OK && next_line(data, len, &pos, &no, &l)) {
        if (l.n == 0) continue;
        const char *ts, *ls = NULL;
        size_t tn, ln = 0;
        if (memchr(l.s, 0, l.n)) {
            st = cm_set_error(CM_ERR_FORMAT, "TSV '%s' line %ld contains a NUL byte; is it a text file?", path, l.no);
            break;
        }
        if (!field_at(&l, text_col, &ts, &tn) || (label_col >= 0 && !field_at(&l, label_col, &ls, &ln))) {
            st = cm_set_error(CM_ERR_FORMAT, "TSV '%s' line %ld has fewer than the header's %d fields: \"%.*s\" (is the "
                                             "file truncated?)",
                              path, l.no, n_cols, excerpt(l.n), l.s);
            break;
        }
        int64_t label = -1;
        if (label_col >= 0 && (parse_label(ls, ln, &label) != CM_OK || (c.num_labels > 0 && label >= c.num_labels))) {
            char range[48] = "";
            if (c.num_labels > 0) snprintf(range, sizeof range, " in [0, %lld)", (long long)c.num_labels);
            st = cm_set_error(CM_ERR_FORMAT, "TSV '%s' line %ld: label \"%.*s\" in column \"%s\" is not an integer%s", path,
                              l.no, excerpt(ln), ls, c.label_column, range);
            break;
        }
        int64_t real;
        st = cm_tokenizer_encode_pair(tok, ts, tn, NULL, 0, c.max_len, buf, NULL, NULL, &real);
        if (st != CM_OK) {
            cm_set_error(st, "TSV '%s' line %ld: %s", path, l.no, cm_last_error());
            break;
        }
        st = padded_add(d, buf, real, label);
    }
    if (st == CM_OK && d->n == 0)
        st = cm_set_error(CM_ERR_FORMAT, "TSV '%s' has a header but no rows; is the file truncated?", path);
    cm_free(buf);
    cm_free(raw);
    if (st == CM_OK) st = cm_dataset_new(&k_tsv_vt, d, out);
    if (st != CM_OK) pad_close(d);
    return st;
}

/* ---------------------------------------------------------------------------------------------
 * Text for language modelling
 * ------------------------------------------------------------------------------------------- */

cm_text_config cm_text_config_default(void) {
    cm_text_config c;
    memset(&c, 0, sizeof c);
    c.max_len = 128;
    c.layout = CM_TEXT_BLOCKS;
    c.text_column = "sentence";
    return c;
}

/* Blocks of one token stream: BLOCKS (max_len ids, all real) or CAUSAL (max_len + 1 ids: inputs and
 * shifted labels). */
typedef struct blocks {
    cm_text_layout layout;
    int64_t max_len, n;
    cm_ids stream;
    cm_field_desc fields[3];
} blocks;

static int64_t blk_len(void *self) { return ((blocks *)self)->n; }
static int blk_n_fields(void *self) { return ((blocks *)self)->layout == CM_TEXT_CAUSAL ? 2 : 3; }
static const cm_field_desc *blk_field(void *self, int i) { return &((blocks *)self)->fields[i]; }
static int64_t blk_n_tokens(void *self, int64_t i) {
    (void)i;
    return ((blocks *)self)->max_len;
}

static cm_status blk_get(void *self, int64_t i, const cm_sample_ctx *ctx, void *const *out) {
    (void)ctx;
    const blocks *d = self;
    const int64_t L = d->max_len;
    if (d->layout == CM_TEXT_CAUSAL) { /* window i: tokens [i·L, i·L + L], the last predicted */
        memcpy(out[0], d->stream.p + i * L, sizeof(int32_t) * (size_t)L);
        memcpy(out[1], d->stream.p + i * L + 1, sizeof(int32_t) * (size_t)L);
        return CM_OK;
    }
    memcpy(out[0], d->stream.p + i * L, sizeof(int32_t) * (size_t)L);
    int32_t *mask = out[1];
    for (int64_t k = 0; k < L; k++) mask[k] = 1;
    memset(out[2], 0, sizeof(int32_t) * (size_t)L);
    return CM_OK;
}

static void blk_close(void *self) {
    blocks *d = self;
    if (!d) return;
    cm_free(d->stream.p);
    cm_free(d);
}

static const cm_dataset_i k_blocks_vt = {.abi = CM_DATASET_ABI, .type_name = "text", .len = blk_len,
                                         .n_fields = blk_n_fields, .field = blk_field, .get = blk_get,
                                         .n_tokens = blk_n_tokens, .close = blk_close};

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* What each text becomes, by layout. */
typedef struct sink {
    const cm_tokenizer *tok;
    cm_text_layout layout;
    int64_t max_len;
    padded *lines; /* CM_TEXT_LINES */
    blocks *blk;   /* CM_TEXT_BLOCKS, CM_TEXT_CAUSAL */
    int32_t *buf;  /* (max_len) */
} sink;

/* One text (a line, a TSV row, or a whole file for CAUSAL). */
static cm_status add_text(sink *k, const char *s, size_t n) {
    const cm_tokenizer *tok = k->tok;
    if (k->layout == CM_TEXT_LINES) {
        int64_t real;
        cm_status st = cm_tokenizer_encode_pair(tok, s, n, NULL, 0, k->max_len, k->buf, NULL, NULL, &real);
        return st == CM_OK ? padded_add(k->lines, k->buf, real, -1) : st;
    }
    int32_t *ids = NULL;
    int64_t m = 0;
    cm_ids *stream = &k->blk->stream;
    cm_status st = cm_tokenizer_encode(tok, s, n, &ids, &m);
    if (k->layout == CM_TEXT_BLOCKS) { /* [CLS] text [SEP], as run_mlm's tokenizer call makes each text */
        if (st == CM_OK) st = cm_ids_push(stream, tok->special[CM_TOKEN_CLS]);
        if (st == CM_OK) st = cm_ids_append(stream, ids, m);
        if (st == CM_OK) st = cm_ids_push(stream, tok->special[CM_TOKEN_SEP]);
    } else { /* causal: the document, then <|endoftext|> as a separator */
        if (st == CM_OK) st = cm_ids_append(stream, ids, m);
        if (st == CM_OK && tok->special[CM_TOKEN_EOT] >= 0) st = cm_ids_push(stream, tok->special[CM_TOKEN_EOT]);
    }
    cm_free(ids);
    return st;
}

/* The texts of one file into the sink. */
static cm_status add_file(sink *k, const char *path, const char *text_column, int64_t *n_texts) {
    uint8_t *raw;
    size_t len;
    cm_status st = cm_read_file_(path, "text", &raw, &len);
    if (st != CM_OK) return st;
    const char *data = (const char *)raw;
    if (memchr(data, 0, len)) {
        cm_free(raw);
        return cm_set_error(CM_ERR_FORMAT, "text file '%s' contains a NUL byte; is it a text file?", path);
    }
    size_t pos = 0;
    long no = 0;
    line l = {NULL, 0, 0};
    if (ends_with(path, ".tsv")) {
        int col = -1, n_cols = 0;
        if (!next_line(data, len, &pos, &no, &l)) st = cm_set_error(CM_ERR_FORMAT, "TSV '%s' is empty", path);
        else if ((col = column_of(&l, text_column, &n_cols)) < 0)
            st = cm_set_error(CM_ERR_FORMAT, "TSV '%s' line 1: the header \"%.*s\" has no column \"%s\" (text_column)",
                              path, excerpt(l.n), l.s, text_column ? text_column : "(none)");
        while (st == CM_OK && next_line(data, len, &pos, &no, &l)) {
            const char *s;
            size_t n;
            if (l.n == 0) continue;
            if (!field_at(&l, col, &s, &n)) {
                st = cm_set_error(CM_ERR_FORMAT, "TSV '%s' line %ld has fewer than the header's %d fields", path, l.no,
                                  n_cols);
                break;
            }
            st = add_text(k, s, n);
            (*n_texts)++;
        }
    } else if (k->layout == CM_TEXT_CAUSAL) {
        st = add_text(k, data, len);
        (*n_texts)++;
    } else {
        while (st == CM_OK && next_line(data, len, &pos, &no, &l)) {
            bool blank = true;
            for (size_t i = 0; i < l.n && blank; i++) blank = l.s[i] == ' ' || l.s[i] == '\t';
            if (blank) continue;
            st = add_text(k, l.s, l.n);
            (*n_texts)++;
        }
    }
    if (st != CM_OK && st != CM_ERR_OOM && !strstr(cm_last_error(), path)) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        cm_set_error(st, "text file '%s' line %ld: %s", path, no, msg);
    }
    cm_free(raw);
    return st;
}

cm_status cm_dataset_text_new(const char *const *paths, int n_paths, const cm_tokenizer *tok, const cm_text_config *cfg,
                              cm_dataset **out) {
    if (!paths || n_paths < 1 || !tok || !out)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_dataset_text_new: NULL argument or no paths");
    *out = NULL;
    cm_text_config c = cfg ? *cfg : cm_text_config_default();
    if ((unsigned)c.layout > CM_TEXT_CAUSAL)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_dataset_text_new: unknown layout %d", (int)c.layout);
    const int64_t min_len = c.layout == CM_TEXT_CAUSAL ? 1 : 3;
    if (c.max_len < min_len || c.max_len > (1 << 20))
        return cm_set_error(CM_ERR_INVALID_ARG, "text dataset '%s': max_len %lld must be in [%lld, 1048576]", paths[0],
                            (long long)c.max_len, (long long)min_len);
    if (c.layout != CM_TEXT_CAUSAL && !has_bert_specials(tok))
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "text dataset '%s': masked-LM layouts need [CLS], [SEP] and [PAD], which the %s tokenizer "
                            "lacks (use a BERT WordPiece vocabulary, or the causal layout)",
                            paths[0], cm_tokenizer_type_name(tok));
    sink k = {tok, c.layout, c.max_len, NULL, NULL, NULL};
    cm_status st = CM_OK;
    if (c.layout == CM_TEXT_LINES) {
        st = padded_new(c.max_len, tok->special[CM_TOKEN_PAD], false, &k.lines);
        if (st == CM_OK && !(k.buf = cm_alloc(sizeof(int32_t) * (size_t)c.max_len, 64))) st = CM_ERR_OOM;
    } else {
        k.blk = cm_alloc_zeroed(sizeof *k.blk, 64);
        if (!k.blk) st = CM_ERR_OOM;
        else k.blk->layout = c.layout, k.blk->max_len = c.max_len;
    }
    int64_t n_texts = 0;
    for (int i = 0; st == CM_OK && i < n_paths; i++) {
        if (!paths[i]) st = cm_set_error(CM_ERR_INVALID_ARG, "cm_dataset_text_new: path %d is NULL", i);
        else st = add_file(&k, paths[i], c.text_column, &n_texts);
    }
    cm_free(k.buf);
    const cm_dataset_i *vt = c.layout == CM_TEXT_LINES ? &k_lines_vt : &k_blocks_vt;
    void *self = c.layout == CM_TEXT_LINES ? (void *)k.lines : (void *)k.blk;
    if (st == CM_OK && c.layout == CM_TEXT_LINES && k.lines->n == 0)
        st = cm_set_error(CM_ERR_FORMAT, "text dataset '%s'%s has no text", paths[0], n_paths > 1 ? " (and the rest)" : "");
    if (st == CM_OK && c.layout != CM_TEXT_LINES) {
        blocks *b = k.blk;
        /* group_texts drops the remainder; causal windows need one more token than they predict */
        const int64_t usable = b->stream.n - (c.layout == CM_TEXT_CAUSAL ? 1 : 0);
        b->n = usable > 0 ? usable / c.max_len : 0;
        if (b->n == 0)
            st = cm_set_error(CM_ERR_FORMAT,
                              "text dataset '%s'%s: %lld tokens make no block of max_len %lld%s (use more text or a "
                              "shorter max_seq_len)",
                              paths[0], n_paths > 1 ? " (and the rest)" : "", (long long)b->stream.n, (long long)c.max_len,
                              c.layout == CM_TEXT_CAUSAL ? " + 1" : "");
        static const char *const mnames[3] = {"input_ids", "attention_mask", "token_type_ids"};
        static const char *const cnames[2] = {"input_ids", "labels"};
        for (int f = 0; f < 3; f++) {
            b->fields[f].name = c.layout == CM_TEXT_CAUSAL ? (f < 2 ? cnames[f] : NULL) : mnames[f];
            b->fields[f].dtype = CM_DTYPE_I32;
            b->fields[f].ndim = 1;
            b->fields[f].shape[0] = c.max_len;
        }
    }
    if (st == CM_OK) st = cm_dataset_new(vt, self, out);
    if (st != CM_OK) {
        if (c.layout == CM_TEXT_LINES) pad_close(k.lines);
        else blk_close(k.blk);
    }
    return st;
}
