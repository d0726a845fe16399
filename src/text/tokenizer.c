/* The tokenizer object: what all three kinds share — queries, encode/decode dispatch, BERT pair
 * encoding, and tokenizer.json save/load. */
#include "text/text_impl.h"
#include "text/unicode.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <string.h>

cm_status cm_tokenizer_alloc_(cm_tokenizer_type type, cm_tokenizer **out) {
    cm_tokenizer *tok = cm_alloc_zeroed(sizeof *tok, 64);
    if (!tok) return CM_ERR_OOM;
    tok->type = type;
    for (int i = 0; i < CM_TOKEN_SPECIAL_COUNT; i++) tok->special[i] = -1;
    for (int i = 0; i < 128; i++) tok->ascii_id[i] = -1;
    *out = tok;
    return CM_OK;
}

cm_status cm_tokenizer_alloc_vocab_(cm_tokenizer *tok, int64_t vocab_size) {
    tok->vocab_size = vocab_size;
    tok->tok_start = cm_alloc_zeroed((size_t)vocab_size * sizeof(uint32_t), 64);
    tok->tok_len = cm_alloc_zeroed((size_t)vocab_size * sizeof(uint32_t), 64);
    return tok->tok_start && tok->tok_len ? CM_OK : CM_ERR_OOM;
}

void cm_tokenizer_free(cm_tokenizer *tok) {
    if (!tok) return;
    cm_free(tok->tok_start);
    cm_free(tok->tok_len);
    cm_buf_deinit(&tok->tok_bytes);
    cm_strmap_deinit(&tok->vocab);
    cm_pairmap_deinit(&tok->merges);
    cm_free(tok->path_a);
    cm_free(tok->path_b);
    cm_free(tok->cps);
    cm_free(tok);
}

cm_tokenizer_type cm_tokenizer_get_type(const cm_tokenizer *tok) { return tok->type; }

const char *cm_tokenizer_type_name(const cm_tokenizer *tok) {
    switch (tok->type) {
    case CM_TOKENIZER_GPT2: return "gpt2";
    case CM_TOKENIZER_WORDPIECE: return "wordpiece";
    case CM_TOKENIZER_CHAR: return "char";
    }
    return "?";
}

int64_t cm_tokenizer_vocab_size(const cm_tokenizer *tok) { return tok->vocab_size; }

int32_t cm_tokenizer_special(const cm_tokenizer *tok, cm_token_special which) {
    if ((int)which < 0 || which >= CM_TOKEN_SPECIAL_COUNT) return -1;
    return tok->special[which];
}

int32_t cm_tokenizer_token_id(const cm_tokenizer *tok, const char *token, size_t len) {
    return cm_strmap_get(&tok->vocab, token, len);
}

const char *cm_tokenizer_token_bytes(const cm_tokenizer *tok, int32_t id, size_t *len) {
    if (id < 0 || id >= tok->vocab_size) return NULL;
    if (len) *len = tok->tok_len[id];
    return (const char *)tok->tok_bytes.p + tok->tok_start[id];
}

/* ---- encode / decode ---- */

static cm_status encode_ids(const cm_tokenizer *tok, const char *text, size_t len, cm_ids *v) {
    if (!text && len) return cm_set_error(CM_ERR_INVALID_ARG, "cm_tokenizer_encode: text is NULL but len is %zu", len);
    const uint8_t *t = (const uint8_t *)text;
    switch (tok->type) {
    case CM_TOKENIZER_GPT2: return cm_gpt2_encode_(tok, t, len, v);
    case CM_TOKENIZER_WORDPIECE: return cm_wordpiece_encode_(tok, t, len, v);
    case CM_TOKENIZER_CHAR: return cm_char_encode_(tok, t, len, v);
    }
    return cm_set_error(CM_ERR_INTERNAL, "tokenizer: unknown type %d", (int)tok->type);
}

cm_status cm_tokenizer_encode(const cm_tokenizer *tok, const char *text, size_t len, int32_t **ids, int64_t *n) {
    if (!tok || !ids || !n) return cm_set_error(CM_ERR_INVALID_ARG, "cm_tokenizer_encode: NULL argument");
    *ids = NULL;
    *n = 0;
    cm_ids v = {0};
    cm_status st = cm_ids_append(&v, NULL, 0); /* never NULL on success, even when empty */
    if (st == CM_OK) st = encode_ids(tok, text, len, &v);
    if (st != CM_OK) {
        cm_free(v.p);
        return st;
    }
    *ids = v.p;
    *n = v.n;
    return CM_OK;
}

cm_status cm_tokenizer_encode_into(const cm_tokenizer *tok, const char *text, size_t len, int32_t *ids, int64_t cap,
                                   int64_t *n) {
    if (!tok || !n || (cap > 0 && !ids) || cap < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_tokenizer_encode_into: NULL argument or negative capacity");
    int32_t *all;
    int64_t count;
    cm_status st = cm_tokenizer_encode(tok, text, len, &all, &count);
    if (st != CM_OK) return st;
    int64_t m = count < cap ? count : cap;
    if (m > 0) memcpy(ids, all, (size_t)m * sizeof(int32_t));
    cm_free(all);
    *n = count;
    return CM_OK;
}

/* Appends src[0, n) to out with invalid UTF-8 replaced by U+FFFD, one per maximal ill-formed
 * subpart (Python's bytes.decode('utf-8', errors='replace')). */
static cm_status append_repaired(cm_buf *out, const uint8_t *src, size_t n) {
    static const uint8_t fffd[3] = {0xEF, 0xBF, 0xBD};
    for (size_t i = 0; i < n;) {
        size_t j = i;
        uint32_t cp;
        while (j < n) { /* the longest valid stretch */
            int l = src[j] < 0x80 ? 1 : cm_utf8_decode(src + j, n - j, &cp);
            if (src[j] >= 0x80 && cp == CM_UTF8_INVALID) break;
            j += (size_t)l;
        }
        if (cm_buf_append(out, src + i, j - i) != CM_OK) return CM_ERR_OOM;
        if (j < n) {
            if (cm_buf_append(out, fffd, 3) != CM_OK) return CM_ERR_OOM;
            j += cm_utf8_invalid_len(src + j, n - j);
        }
        i = j;
    }
    return CM_OK;
}

cm_status cm_tokenizer_decode(const cm_tokenizer *tok, const int32_t *ids, int64_t n, char **text, size_t *len) {
    if (!tok || !text || (n > 0 && !ids) || n < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_tokenizer_decode: NULL argument or negative count");
    *text = NULL;
    if (len) *len = 0;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tok->vocab_size)
            return cm_set_error(CM_ERR_INVALID_ARG, "decode: id %d at position %lld is outside the %s vocabulary [0, %lld)",
                                ids[i], (long long)i, cm_tokenizer_type_name(tok), (long long)tok->vocab_size);
    cm_buf raw = {0}, out = {0};
    cm_status st = CM_OK;
    for (int64_t i = 0; i < n && st == CM_OK; i++) {
        const uint8_t *b = tok->tok_bytes.p + tok->tok_start[ids[i]];
        size_t bl = tok->tok_len[ids[i]];
        if (tok->type == CM_TOKENIZER_WORDPIECE) {
            if (bl >= 2 && b[0] == '#' && b[1] == '#' && i > 0) {
                b += 2;
                bl -= 2;
            } else if (i > 0) {
                st = cm_buf_append(&raw, " ", 1);
            }
        }
        if (st == CM_OK) st = cm_buf_append(&raw, b, bl);
    }
    if (st == CM_OK) st = append_repaired(&out, raw.p ? raw.p : (const uint8_t *)"", raw.n);
    if (st == CM_OK) st = cm_buf_append(&out, "", 1);
    cm_buf_deinit(&raw);
    if (st != CM_OK) {
        cm_buf_deinit(&out);
        return st;
    }
    *text = (char *)out.p;
    if (len) *len = out.n - 1;
    return CM_OK;
}

/* ---- BERT pairs ---- */

cm_status cm_tokenizer_encode_pair(const cm_tokenizer *tok, const char *a, size_t a_len, const char *b, size_t b_len,
                                   int64_t max_len, int32_t *input_ids, int32_t *token_type_ids,
                                   int32_t *attention_mask, int64_t *n_real) {
    if (!tok || !input_ids) return cm_set_error(CM_ERR_INVALID_ARG, "cm_tokenizer_encode_pair: NULL argument");
    int32_t cls = tok->special[CM_TOKEN_CLS], sep = tok->special[CM_TOKEN_SEP], pad = tok->special[CM_TOKEN_PAD];
    if (cls < 0 || sep < 0 || pad < 0)
        return cm_set_error(CM_ERR_UNSUPPORTED,
                            "encode_pair: the %s tokenizer lacks [CLS], [SEP] or [PAD] (use a BERT WordPiece vocabulary)",
                            cm_tokenizer_type_name(tok));
    int64_t n_special = b ? 3 : 2;
    if (max_len < n_special)
        return cm_set_error(CM_ERR_INVALID_ARG, "encode_pair: max_len %lld leaves no room for the %lld special tokens",
                            (long long)max_len, (long long)n_special);
    cm_ids va = {0}, vb = {0};
    cm_status st = encode_ids(tok, a, a_len, &va);
    if (st == CM_OK && b) st = encode_ids(tok, b, b_len, &vb);
    if (st != CM_OK) {
        cm_free(va.p);
        cm_free(vb.p);
        return st;
    }
    int64_t na = va.n, nb = vb.n;
    while (na + nb + n_special > max_len) { /* longest_first */
        if (na > nb) na--;
        else nb--;
    }
    int64_t k = 0;
    input_ids[k++] = cls;
    for (int64_t i = 0; i < na; i++) input_ids[k++] = va.p[i];
    input_ids[k++] = sep;
    int64_t first_end = k;
    if (b) {
        for (int64_t i = 0; i < nb; i++) input_ids[k++] = vb.p[i];
        input_ids[k++] = sep;
    }
    int64_t real = k;
    while (k < max_len) input_ids[k++] = pad;
    for (int64_t i = 0; i < max_len; i++) {
        if (token_type_ids) token_type_ids[i] = i >= first_end && i < real ? 1 : 0;
        if (attention_mask) attention_mask[i] = i < real ? 1 : 0;
    }
    if (n_real) *n_real = real;
    cm_free(va.p);
    cm_free(vb.p);
    return CM_OK;
}

/* ---- tokenizer.json ---- */

cm_status cm_tokenizer_save(const cm_tokenizer *tok, const char *path) {
    if (!tok || !path) return cm_set_error(CM_ERR_INVALID_ARG, "cm_tokenizer_save: NULL argument");
    if (tok->type != CM_TOKENIZER_CHAR && (!tok->path_a || (tok->type == CM_TOKENIZER_GPT2 && !tok->path_b)))
        return cm_set_error(CM_ERR_UNSUPPORTED,
                            "tokenizer save '%s': this %s tokenizer was not made from vocabulary files (it came from a "
                            "tokenizer.json), so it has no paths to record; write its files with cm_hf_tokenizer_save",
                            path, cm_tokenizer_type_name(tok));
    cJSON *o = cJSON_CreateObject();
    bool ok = o && cJSON_AddStringToObject(o, "type", cm_tokenizer_type_name(tok));
    switch (tok->type) {
    case CM_TOKENIZER_GPT2:
        ok = ok && cJSON_AddStringToObject(o, "encoder_json", tok->path_a) &&
             cJSON_AddStringToObject(o, "vocab_bpe", tok->path_b) &&
             cJSON_AddNumberToObject(o, "vocab_size", (double)tok->vocab_size) &&
             cJSON_AddNumberToObject(o, "eot", tok->special[CM_TOKEN_EOT]);
        break;
    case CM_TOKENIZER_WORDPIECE:
        ok = ok && cJSON_AddStringToObject(o, "vocab_txt", tok->path_a) &&
             cJSON_AddBoolToObject(o, "lowercase", tok->lowercase) &&
             cJSON_AddNumberToObject(o, "vocab_size", (double)tok->vocab_size);
        break;
    case CM_TOKENIZER_CHAR: {
        ok = ok && cJSON_AddNumberToObject(o, "vocab_size", (double)tok->vocab_size);
        cJSON *arr = ok ? cJSON_AddArrayToObject(o, "code_points") : NULL;
        ok = ok && arr;
        for (int64_t i = 0; ok && i < tok->vocab_size; i++) {
            cJSON *num = cJSON_CreateNumber(tok->cps[i]);
            ok = num && cJSON_AddItemToArray(arr, num);
        }
        break;
    }
    }
    char *s = ok ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    if (!s) return cm_set_error(CM_ERR_OOM, "tokenizer save '%s': out of memory building the JSON", path);
    size_t n = strlen(s);
    s[n] = '\n'; /* replace the NUL: the file ends with a newline */
    cm_status st = cm_write_file_atomic_(path, s, n + 1);
    cJSON_free(s);
    return st;
}

static const char *json_str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

cm_status cm_tokenizer_load(const char *path, cm_tokenizer **out) {
    if (!path || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_tokenizer_load: NULL argument");
    *out = NULL;
    uint8_t *data;
    size_t len;
    cm_status st = cm_read_file_(path, "tokenizer description", &data, &len);
    if (st != CM_OK) return st;
    cJSON *o = cJSON_ParseWithLength((const char *)data, len);
    cm_free(data);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return cm_set_error(CM_ERR_FORMAT, "tokenizer description '%s' is not a JSON object; is it truncated?", path);
    }
    const char *type = json_str(o, "type");
    cm_tokenizer *tok = NULL;
    if (!type) {
        st = cm_set_error(CM_ERR_FORMAT, "tokenizer description '%s' has no string field \"type\" (gpt2, wordpiece or char)",
                          path);
    } else if (strcmp(type, "gpt2") == 0) {
        const char *enc = json_str(o, "encoder_json"), *bpe = json_str(o, "vocab_bpe");
        st = enc && bpe ? cm_tokenizer_gpt2_new(enc, bpe, &tok)
                        : cm_set_error(CM_ERR_FORMAT, "tokenizer description '%s': type gpt2 needs string fields "
                                                      "\"encoder_json\" and \"vocab_bpe\"",
                                       path);
    } else if (strcmp(type, "wordpiece") == 0) {
        const char *voc = json_str(o, "vocab_txt");
        const cJSON *lc = cJSON_GetObjectItemCaseSensitive(o, "lowercase");
        st = voc && cJSON_IsBool(lc) ? cm_tokenizer_wordpiece_new(voc, cJSON_IsTrue(lc), &tok)
                                     : cm_set_error(CM_ERR_FORMAT, "tokenizer description '%s': type wordpiece needs "
                                                                   "\"vocab_txt\" (string) and \"lowercase\" (bool)",
                                                    path);
    } else if (strcmp(type, "char") == 0) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "code_points");
        int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : 0;
        uint32_t *cps = n > 0 ? cm_alloc((size_t)n * sizeof(uint32_t), 16) : NULL;
        if (n == 0) {
            st = cm_set_error(CM_ERR_FORMAT, "tokenizer description '%s': type char needs a non-empty array \"code_points\"",
                              path);
        } else if (!cps) {
            st = CM_ERR_OOM;
        } else {
            int i = 0;
            for (const cJSON *e = arr->child; e; e = e->next, i++) {
                double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
                if (v < 0 || v > 0x10FFFF || v != (double)(uint32_t)v || (v >= 0xD800 && v <= 0xDFFF) ||
                    (i > 0 && (uint32_t)v <= cps[i - 1])) {
                    st = cm_set_error(CM_ERR_FORMAT,
                                      "tokenizer description '%s': code_points[%d] is not a Unicode scalar value greater "
                                      "than the one before",
                                      path, i);
                    break;
                }
                cps[i] = (uint32_t)v;
            }
            if (st == CM_OK) st = cm_char_from_code_points_(cps, n, &tok);
        }
        cm_free(cps);
    } else {
        st = cm_set_error(CM_ERR_FORMAT, "tokenizer description '%s': unknown type \"%s\" (use gpt2, wordpiece or char)",
                          path, type);
    }
    const cJSON *vs = cJSON_GetObjectItemCaseSensitive(o, "vocab_size");
    if (st == CM_OK && cJSON_IsNumber(vs) && vs->valuedouble != (double)tok->vocab_size) {
        st = cm_set_error(CM_ERR_FORMAT,
                          "tokenizer description '%s' says vocab_size %.0f but its %s vocabulary has %lld tokens (were "
                          "the vocabulary files replaced?)",
                          path, vs->valuedouble, type, (long long)tok->vocab_size);
    }
    cJSON_Delete(o);
    if (st != CM_OK) {
        cm_tokenizer_free(tok);
        return st;
    }
    *out = tok;
    return CM_OK;
}
