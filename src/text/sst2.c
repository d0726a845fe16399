/* SST-2 (GLUE TSV) as a sequence classification dataset: parsed and tokenised at open, so get is a
 * copy. Samples are stored compactly (the real tokens of each, in one pool); get pads them. */
#include "text/text_impl.h"

#include <stdlib.h>
#include <string.h>

typedef struct sst2 {
    char *name;
    int64_t max_len, n;
    int32_t pad;
    int64_t *start; /* (n) offset of sample i's ids in pool */
    int32_t *len;   /* (n) real tokens of sample i ([CLS] ... [SEP]) */
    int64_t *label; /* (n) 0/1, or -1 for the unlabelled test split */
    cm_ids pool;
    cm_field_desc fields[4];
} sst2;

enum { F_IDS, F_MASK, F_TYPES, F_LABEL };

static int64_t sst2_len(void *self) { return ((sst2 *)self)->n; }
static int sst2_n_fields(void *self) { return 4; }
static const cm_field_desc *sst2_field(void *self, int i) { return &((sst2 *)self)->fields[i]; }
static int64_t sst2_n_tokens(void *self, int64_t i) { return ((sst2 *)self)->len[i]; }

static cm_status sst2_get(void *self, int64_t i, const cm_sample_ctx *ctx, void *const *out) {
    const sst2 *d = self;
    int32_t *ids = out[F_IDS], *mask = out[F_MASK], *types = out[F_TYPES];
    int64_t n = d->len[i];
    memcpy(ids, d->pool.p + d->start[i], (size_t)n * sizeof(int32_t));
    for (int64_t k = n; k < d->max_len; k++) ids[k] = d->pad;
    for (int64_t k = 0; k < d->max_len; k++) mask[k] = k < n;
    memset(types, 0, (size_t)d->max_len * sizeof(int32_t));
    memcpy(out[F_LABEL], &d->label[i], sizeof(int64_t));
    return CM_OK;
}

static void sst2_close(void *self) {
    sst2 *d = self;
    if (!d) return;
    cm_free(d->name);
    cm_free(d->start);
    cm_free(d->len);
    cm_free(d->label);
    cm_free(d->pool.p);
    cm_free(d);
}

static const cm_dataset_i k_sst2_vt = {
    .abi = CM_DATASET_ABI,
    .type_name = "sst2",
    .len = sst2_len,
    .n_fields = sst2_n_fields,
    .field = sst2_field,
    .get = sst2_get,
    .n_tokens = sst2_n_tokens,
    .close = sst2_close,
};

static bool line_is(const char *s, size_t n, const char *want) { return n == strlen(want) && memcmp(s, want, n) == 0; }

/* A printable excerpt of a line for messages. */
static int excerpt_len(size_t n) { return n > 60 ? 60 : (int)n; }

cm_status cm_dataset_sst2_new_from_memory(const char *data, size_t len, const char *name, const cm_tokenizer *tok,
                                          int64_t max_len, cm_dataset **out) {
    if (!out || !tok || (!data && len)) return cm_set_error(CM_ERR_INVALID_ARG, "cm_dataset_sst2_new: NULL argument");
    *out = NULL;
    if (!name) name = "<memory>";
    if (max_len < 3 || max_len > (1 << 20))
        return cm_set_error(CM_ERR_INVALID_ARG, "SST-2 '%s': max_len %lld must be in [3, 1048576] ([CLS], a token, [SEP])",
                            name, (long long)max_len);
    if (tok->special[CM_TOKEN_CLS] < 0 || tok->special[CM_TOKEN_SEP] < 0 || tok->special[CM_TOKEN_PAD] < 0)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "SST-2 '%s': the %s tokenizer lacks [CLS], [SEP] or [PAD] (use a BERT WordPiece vocabulary)",
                            name, cm_tokenizer_type_name(tok));
    size_t max_lines = 1;
    for (size_t i = 0; i < len; i++) max_lines += data[i] == '\n';
    sst2 *d = cm_alloc_zeroed(sizeof *d, 64);
    int32_t *buf = cm_alloc((size_t)max_len * sizeof(int32_t), 64);
    cm_status st = CM_OK;
    if (!d || !buf || !(d->name = cm_strdup_(name)) || !(d->start = cm_alloc(max_lines * sizeof(int64_t), 64)) ||
        !(d->len = cm_alloc(max_lines * sizeof(int32_t), 64)) || !(d->label = cm_alloc(max_lines * sizeof(int64_t), 64)))
        st = CM_ERR_OOM;
    if (st == CM_OK) {
        d->max_len = max_len;
        d->pad = tok->special[CM_TOKEN_PAD];
        const char *names[4] = {"input_ids", "attention_mask", "token_type_ids", "label"};
        for (int f = 0; f < 4; f++) {
            d->fields[f].name = names[f];
            d->fields[f].dtype = f == F_LABEL ? CM_DTYPE_I64 : CM_DTYPE_I32;
            d->fields[f].ndim = f == F_LABEL ? 0 : 1;
            d->fields[f].shape[0] = f == F_LABEL ? 0 : max_len;
        }
    }
    bool labelled = false;
    long line = 0;
    for (size_t i = 0; i < len && st == CM_OK;) {
        const char *s = data + i;
        const char *nl = memchr(s, '\n', len - i);
        size_t n = nl ? (size_t)(nl - s) : len - i;
        i += n + 1;
        line++;
        if (n > 0 && s[n - 1] == '\r') n--;
        if (memchr(s, 0, n)) {
            st = cm_set_error(CM_ERR_FORMAT, "SST-2 '%s' line %ld contains a NUL byte; is this a text TSV file?", name, line);
            break;
        }
        if (line == 1) {
            if (line_is(s, n, "sentence\tlabel")) labelled = true;
            else if (line_is(s, n, "index\tsentence")) labelled = false;
            else
                st = cm_set_error(CM_ERR_FORMAT,
                                  "SST-2 '%s' line 1: header \"%.*s\" is not \"sentence<TAB>label\" (train/dev) or "
                                  "\"index<TAB>sentence\" (test)",
                                  name, excerpt_len(n), s);
            continue;
        }
        if (n == 0) continue;
        const char *sent;
        size_t sent_n;
        int64_t label = -1;
        if (labelled) {
            const char *tab = NULL;
            for (size_t k = n; k-- > 0;)
                if (s[k] == '\t') {
                    tab = s + k;
                    break;
                }
            const char *lab = tab ? tab + 1 : NULL;
            size_t lab_n = tab ? n - (size_t)(lab - s) : 0;
            if (!tab) {
                st = cm_set_error(CM_ERR_FORMAT,
                                  "SST-2 '%s' line %ld: expected \"sentence<TAB>label\" but found no tab in \"%.*s\" (is "
                                  "the file truncated?)",
                                  name, line, excerpt_len(n), s);
                break;
            }
            if (!(lab_n == 1 && (lab[0] == '0' || lab[0] == '1'))) {
                st = cm_set_error(CM_ERR_FORMAT, "SST-2 '%s' line %ld: label \"%.*s\" is not 0 or 1", name, line,
                                  excerpt_len(lab_n), lab);
                break;
            }
            label = lab[0] - '0';
            sent = s;
            sent_n = (size_t)(tab - s);
        } else {
            const char *tab = memchr(s, '\t', n);
            bool ok = tab && tab > s;
            for (const char *p = s; ok && p < tab; p++) ok = *p >= '0' && *p <= '9';
            if (!ok) {
                st = cm_set_error(CM_ERR_FORMAT,
                                  "SST-2 '%s' line %ld: expected \"index<TAB>sentence\" with a numeric index, got \"%.*s\"",
                                  name, line, excerpt_len(n), s);
                break;
            }
            sent = tab + 1;
            sent_n = n - (size_t)(sent - s);
        }
        int64_t real;
        st = cm_tokenizer_encode_pair(tok, sent, sent_n, NULL, 0, max_len, buf, NULL, NULL, &real);
        if (st != CM_OK) {
            cm_set_error(st, "SST-2 '%s' line %ld: %s", name, line, cm_last_error());
            break;
        }
        d->start[d->n] = d->pool.n;
        d->len[d->n] = (int32_t)real;
        d->label[d->n] = label;
        d->n++;
        st = cm_ids_append(&d->pool, buf, real);
    }
    if (st == CM_OK && line == 0)
        st = cm_set_error(CM_ERR_FORMAT, "SST-2 '%s' is empty (expected a header line \"sentence<TAB>label\")", name);
    else if (st == CM_OK && d->n == 0)
        st = cm_set_error(CM_ERR_FORMAT, "SST-2 '%s' has a header but no samples; is the file truncated?", name);
    cm_free(buf);
    if (st == CM_OK) st = cm_dataset_new(&k_sst2_vt, d, out);
    if (st != CM_OK) {
        sst2_close(d);
        return st;
    }
    return CM_OK;
}

cm_status cm_dataset_sst2_new(const char *tsv_path, const cm_tokenizer *tok, int64_t max_len, cm_dataset **out) {
    if (!tsv_path || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_dataset_sst2_new: NULL argument");
    *out = NULL;
    uint8_t *data;
    size_t len;
    cm_status st = cm_read_file_(tsv_path, "SST-2 TSV", &data, &len);
    if (st != CM_OK) return st;
    st = cm_dataset_sst2_new_from_memory((const char *)data, len, tsv_path, tok, max_len, out);
    cm_free(data);
    return st;
}
