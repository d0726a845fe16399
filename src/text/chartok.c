/* Character-level tokenizer: the vocabulary is the sorted set of code points of a text (nanoGPT's
 * shakespeare_char), id = rank. ASCII ids come from a table, others by binary search. */
#include "text/text_impl.h"
#include "text/unicode.h"

#include <stdlib.h>
#include <string.h>

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

cm_status cm_char_from_code_points_(const uint32_t *cps, int64_t n, cm_tokenizer **out) {
    cm_tokenizer *tok;
    cm_status st = cm_tokenizer_alloc_(CM_TOKENIZER_CHAR, &tok);
    if (st != CM_OK) return st;
    tok->cps = cm_alloc((size_t)n * sizeof(uint32_t), 16);
    if (!tok->cps || (st = cm_tokenizer_alloc_vocab_(tok, n)) != CM_OK || (st = cm_strmap_init(&tok->vocab, (size_t)n)) != CM_OK) {
        cm_tokenizer_free(tok);
        return CM_ERR_OOM;
    }
    memcpy(tok->cps, cps, (size_t)n * sizeof(uint32_t));
    for (int64_t i = 0; i < n && st == CM_OK; i++) {
        uint8_t u[4];
        int l = cm_utf8_encode(cps[i], u);
        tok->tok_start[i] = (uint32_t)tok->tok_bytes.n;
        tok->tok_len[i] = (uint32_t)l;
        st = cm_buf_append(&tok->tok_bytes, u, (size_t)l);
        if (st == CM_OK) st = cm_strmap_put(&tok->vocab, u, (size_t)l, (int32_t)i, NULL);
        if (cps[i] < 128) tok->ascii_id[cps[i]] = (int32_t)i;
    }
    if (st != CM_OK) {
        cm_tokenizer_free(tok);
        return st;
    }
    *out = tok;
    return CM_OK;
}

cm_status cm_tokenizer_char_new_from_text(const char *text, size_t len, cm_tokenizer **out) {
    if (!out || (!text && len)) return cm_set_error(CM_ERR_INVALID_ARG, "cm_tokenizer_char_new_from_text: NULL argument");
    *out = NULL;
    if (len == 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "char tokenizer: the text is empty, so there are no characters to build "
                                                "a vocabulary from");
    const uint8_t *t = (const uint8_t *)text;
    bool ascii[128] = {false};
    cm_ids other = {0}; /* non-ASCII code points seen (deduplicated below) */
    cm_status st = CM_OK;
    for (size_t i = 0; i < len && st == CM_OK;) {
        if (t[i] < 128) {
            ascii[t[i++]] = true;
            continue;
        }
        uint32_t cp;
        int l = cm_utf8_decode(t + i, len - i, &cp);
        if (cp == CM_UTF8_INVALID) {
            cm_free(other.p);
            return cm_set_error(CM_ERR_INVALID_ARG,
                                "char tokenizer: invalid UTF-8 byte 0x%02X at byte offset %zu (the text must be UTF-8)",
                                t[i], i);
        }
        st = cm_ids_push(&other, (int32_t)cp);
        i += (size_t)l;
    }
    /* sort + unique the non-ASCII code points */
    int64_t m = 0;
    if (st == CM_OK && other.n) {
        qsort(other.p, (size_t)other.n, sizeof(int32_t), cmp_i32);
        for (int64_t i = 0; i < other.n; i++)
            if (m == 0 || other.p[i] != other.p[m - 1]) other.p[m++] = other.p[i];
    }
    uint32_t *cps = st == CM_OK ? cm_alloc((size_t)(128 + m) * sizeof(uint32_t), 16) : NULL;
    if (!cps) {
        cm_free(other.p);
        return CM_ERR_OOM;
    }
    int64_t k = 0;
    for (uint32_t c = 0; c < 128; c++)
        if (ascii[c]) cps[k++] = c;
    for (int64_t i = 0; i < m; i++) cps[k++] = (uint32_t)other.p[i];
    cm_free(other.p);
    st = cm_char_from_code_points_(cps, k, out);
    cm_free(cps);
    return st;
}

static int32_t char_id(const cm_tokenizer *tok, uint32_t cp) {
    int64_t lo = 0, hi = tok->vocab_size;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (cp < tok->cps[mid]) hi = mid;
        else if (cp > tok->cps[mid]) lo = mid + 1;
        else return (int32_t)mid;
    }
    return -1;
}

cm_status cm_char_encode_(const cm_tokenizer *tok, const uint8_t *t, size_t len, cm_ids *out) {
    if (cm_ids_reserve(out, (int64_t)len) != CM_OK) return CM_ERR_OOM; /* at most one id per byte */
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int l = t[i] < 128 ? (cp = t[i], 1) : cm_utf8_decode(t + i, len - i, &cp);
        int32_t id = cp < 128 ? tok->ascii_id[cp] : cp == CM_UTF8_INVALID ? -1 : char_id(tok, cp);
        if (id < 0) {
            if (cp == CM_UTF8_INVALID)
                return cm_set_error(CM_ERR_INVALID_ARG, "char tokenizer: invalid UTF-8 byte 0x%02X at byte offset %zu",
                                    t[i], i);
            return cm_set_error(CM_ERR_INVALID_ARG,
                                "char tokenizer: character U+%04X ('%.*s') at byte offset %zu is not in the %lld-character "
                                "vocabulary (build the vocabulary from text that contains it)",
                                cp, l, (const char *)t + i, i, (long long)tok->vocab_size);
        }
        out->p[out->n++] = id;
        i += (size_t)l;
    }
    return CM_OK;
}
