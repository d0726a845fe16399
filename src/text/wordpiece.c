/* BERT WordPiece: the basic tokenizer of google-research/bert (as in HF's BertTokenizer) and greedy
 * longest-match-first WordPiece.
 *
 * Basic tokenizer, in BERT's order:
 *   1. clean: drop U+0000, U+FFFD and control characters (category C*, except \t \n \r); invalid
 *      UTF-8 counts as U+FFFD;
 *   2. split on whitespace (\t \n \r ' ' and Zs, plus U+2028/U+2029 which Python's str.split()
 *      also splits on) and put CJK ideographs in words of their own;
 *   3. per whitespace word, if lowercasing: str.lower() (with Python's Final_Sigma rule), NFD and
 *      drop Mn — done per character from the generated fold table, Hangul syllables decomposed
 *      algorithmically;
 *   4. split on punctuation (ASCII 33-47, 58-64, 91-96, 123-126, category P*).
 * Then each word of at most 100 characters is split greedily into the longest vocabulary pieces
 * ("##" marks a piece that continues a word); a word that cannot be split, or a longer one, is
 * [UNK]. */
#include "text/text_impl.h"
#include "text/unicode.h"

#include <stdio.h>
#include <string.h>

#define MAX_WORD_CHARS 100

cm_status cm_wordpiece_from_memory_(const uint8_t *data, size_t len, const char *what, bool lowercase,
                                    cm_tokenizer **out) {
    *out = NULL;
    int64_t lines = 0;
    for (size_t i = 0; i < len; i++) lines += data[i] == '\n';
    if (len > 0 && data[len - 1] != '\n') lines++;
    cm_tokenizer *tok = NULL;
    cm_status st = CM_OK;
    if (lines == 0) {
        st = cm_set_error(CM_ERR_FORMAT, "%s is empty", what);
    } else if ((st = cm_tokenizer_alloc_(CM_TOKENIZER_WORDPIECE, &tok)) == CM_OK &&
               (st = cm_tokenizer_alloc_vocab_(tok, lines)) == CM_OK) {
        st = cm_strmap_init(&tok->vocab, (size_t)lines);
    }
    int32_t id = 0;
    for (size_t i = 0; st == CM_OK && i < len; id++) {
        size_t e = i;
        while (e < len && data[e] != '\n') e++;
        size_t le = e > i && data[e - 1] == '\r' ? e - 1 : e;
        int32_t prev;
        if (le == i) {
            st = cm_set_error(CM_ERR_FORMAT, "%s line %d is empty (one token per line expected)", what, id + 1);
        } else if ((st = cm_strmap_put(&tok->vocab, data + i, le - i, id, &prev)) == CM_OK && prev >= 0) {
            st = cm_set_error(CM_ERR_FORMAT, "%s line %d repeats the token \"%.*s\" of line %d", what, id + 1,
                              (int)(le - i > 40 ? 40 : le - i), (const char *)data + i, prev + 1);
        } else if (st == CM_OK) {
            tok->tok_start[id] = (uint32_t)tok->tok_bytes.n;
            tok->tok_len[id] = (uint32_t)(le - i);
            st = cm_buf_append(&tok->tok_bytes, data + i, le - i);
        }
        i = e + 1;
    }
    if (st == CM_OK) {
        static const char *names[CM_TOKEN_SPECIAL_COUNT] = {NULL, "[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"};
        for (int s = 1; s < CM_TOKEN_SPECIAL_COUNT; s++)
            tok->special[s] = cm_strmap_get(&tok->vocab, names[s], strlen(names[s]));
        if (tok->special[CM_TOKEN_UNK] < 0)
            st = cm_set_error(CM_ERR_FORMAT, "%s has no [UNK] token; is it a BERT vocabulary?", what);
    }
    if (st != CM_OK) {
        cm_tokenizer_free(tok);
        return st;
    }
    tok->lowercase = lowercase;
    *out = tok;
    return CM_OK;
}

cm_status cm_tokenizer_wordpiece_new(const char *vocab_txt_path, bool lowercase, cm_tokenizer **out) {
    if (!vocab_txt_path || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_tokenizer_wordpiece_new: NULL argument");
    *out = NULL;
    uint8_t *data;
    size_t len;
    cm_status st = cm_read_file_(vocab_txt_path, "WordPiece vocab.txt", &data, &len);
    if (st != CM_OK) return st;
    size_t wn = strlen(vocab_txt_path) + 32;
    char *what = cm_alloc(wn, 8);
    cm_tokenizer *tok = NULL;
    if (!what) st = CM_ERR_OOM;
    else {
        snprintf(what, wn, "WordPiece vocab.txt '%s'", vocab_txt_path);
        st = cm_wordpiece_from_memory_(data, len, what, lowercase, &tok);
    }
    cm_free(what);
    cm_free(data);
    if (st != CM_OK) return st;
    if (!(tok->path_a = cm_strdup_(vocab_txt_path))) {
        cm_tokenizer_free(tok);
        return CM_ERR_OOM;
    }
    *out = tok;
    return CM_OK;
}

/* ---- encoding ---- */

typedef struct wp_state {
    const cm_tokenizer *tok;
    cm_ids *out;
    cm_ids token; /* code points of the current whitespace-separated token */
    cm_ids word;  /* code points of the current word (after folding, between punctuation) */
    cm_buf bytes; /* scratch: UTF-8 of the word */
    cm_ids offs;  /* byte offset of each character of the word in bytes, and the end */
    cm_ids pieces;
} wp_state;

static bool is_punct(uint32_t cp) {
    if ((cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) || (cp >= 123 && cp <= 126))
        return true;
    return cp >= 128 && CM_UNI_IS(punct, cp);
}

static bool is_split_space(uint32_t cp) {
    if (cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r') return true;
    if (cp < 128) return false;
    return cp == 0x2028 || cp == 0x2029 || CM_UNI_IS(zs, cp);
}

static bool is_control(uint32_t cp) {
    if (cp == '\t' || cp == '\n' || cp == '\r') return false;
    if (cp < 128) return cp < 32 || cp == 127;
    return CM_UNI_IS(control, cp);
}

/* WordPiece on the current word; appends its ids (or [UNK]) to out and clears the word. */
static cm_status flush_word(wp_state *s) {
    cm_ids *w = &s->word;
    if (w->n == 0) return CM_OK;
    const cm_tokenizer *tok = s->tok;
    cm_status st = CM_OK;
    if (w->n > MAX_WORD_CHARS) {
        w->n = 0;
        return cm_ids_push(s->out, tok->special[CM_TOKEN_UNK]);
    }
    s->bytes.n = 0;
    s->offs.n = 0;
    for (int64_t k = 0; k < w->n; k++) {
        uint8_t u[4];
        int l = cm_utf8_encode((uint32_t)w->p[k], u);
        if ((st = cm_ids_push(&s->offs, (int32_t)s->bytes.n)) != CM_OK ||
            (st = cm_buf_append(&s->bytes, u, (size_t)l)) != CM_OK)
            return st;
    }
    if ((st = cm_ids_push(&s->offs, (int32_t)s->bytes.n)) != CM_OK) return st;
    const uint8_t *chars = s->bytes.p;
    s->pieces.n = 0;
    int64_t n = w->n, start = 0;
    bool bad = false;
    while (start < n) {
        int64_t end = n;
        int32_t cur = -1;
        while (start < end) {
            const uint8_t *key = chars + s->offs.p[start];
            size_t klen = (size_t)(s->offs.p[end] - s->offs.p[start]);
            if (start == 0) {
                cur = cm_strmap_get(&tok->vocab, key, klen);
            } else {
                uint8_t stackbuf[256];
                uint8_t *kb = stackbuf;
                if (klen + 2 > sizeof stackbuf) {
                    kb = cm_alloc(klen + 2, 16);
                    if (!kb) return CM_ERR_OOM;
                }
                kb[0] = '#';
                kb[1] = '#';
                memcpy(kb + 2, key, klen);
                cur = cm_strmap_get(&tok->vocab, kb, klen + 2);
                if (kb != stackbuf) cm_free(kb);
            }
            if (cur >= 0) break;
            end--;
        }
        if (cur < 0) {
            bad = true;
            break;
        }
        if ((st = cm_ids_push(&s->pieces, cur)) != CM_OK) return st;
        start = end;
    }
    w->n = 0;
    if (bad) return cm_ids_push(s->out, tok->special[CM_TOKEN_UNK]);
    return cm_ids_append(s->out, s->pieces.p, s->pieces.n);
}

static cm_status add_char(wp_state *s, uint32_t cp) {
    if (is_punct(cp)) {
        cm_status st = flush_word(s);
        if (st == CM_OK) st = cm_ids_push(&s->word, (int32_t)cp);
        if (st == CM_OK) st = flush_word(s);
        return st;
    }
    return cm_ids_push(&s->word, (int32_t)cp);
}

/* Python's Final_Sigma: capital sigma at position k lowers to final sigma when a cased letter
 * precedes it and none follows (skipping case-ignorable characters both ways). */
static bool final_sigma(const cm_ids *t, int64_t k) {
    int64_t j = k - 1;
    while (j >= 0 && CM_UNI_IS(case_ign, (uint32_t)t->p[j])) j--;
    if (j < 0 || !CM_UNI_IS(cased, (uint32_t)t->p[j])) return false;
    j = k + 1;
    while (j < t->n && CM_UNI_IS(case_ign, (uint32_t)t->p[j])) j++;
    return j >= t->n || !CM_UNI_IS(cased, (uint32_t)t->p[j]);
}

/* Folds (if lowercasing), splits on punctuation and WordPieces the current token. */
static cm_status flush_token(wp_state *s) {
    cm_status st = CM_OK;
    const cm_ids *t = &s->token;
    for (int64_t k = 0; k < t->n && st == CM_OK; k++) {
        uint32_t cp = (uint32_t)t->p[k];
        if (!s->tok->lowercase || (cp < 128 && !(cp >= 'A' && cp <= 'Z'))) {
            st = add_char(s, cp);
        } else if (cp >= 'A' && cp <= 'Z') {
            st = add_char(s, cp + 32);
        } else if (cp >= 0xAC00 && cp <= 0xD7A3) { /* Hangul syllable: L V (T) jamo */
            uint32_t si = cp - 0xAC00;
            st = add_char(s, 0x1100 + si / 588);
            if (st == CM_OK) st = add_char(s, 0x1161 + (si % 588) / 28);
            if (st == CM_OK && si % 28) st = add_char(s, 0x11A7 + si % 28);
        } else if (cp == 0x03A3) {
            st = add_char(s, final_sigma(t, k) ? 0x03C2 : 0x03C3);
        } else if (CM_UNI_IS(mn, cp)) {
            /* accents are stripped */
        } else {
            const cm_uni_fold *f = cm_uni_fold_find(cp);
            if (!f) {
                st = add_char(s, cp);
            } else {
                const uint8_t *p = cm_uni_fold_pool + f->off;
                for (uint32_t i = 0; i < f->len && st == CM_OK;) {
                    uint32_t c;
                    i += (uint32_t)cm_utf8_decode(p + i, f->len - i, &c);
                    st = add_char(s, c);
                }
            }
        }
    }
    if (st == CM_OK) st = flush_word(s);
    s->token.n = 0;
    return st;
}

cm_status cm_wordpiece_encode_(const cm_tokenizer *tok, const uint8_t *text, size_t len, cm_ids *out) {
    wp_state s = {.tok = tok, .out = out};
    cm_status st = CM_OK;
    for (size_t i = 0; i < len && st == CM_OK;) {
        uint32_t cp;
        i += (size_t)cm_utf8_decode(text + i, len - i, &cp);
        if (cp == CM_UTF8_INVALID || cp == 0 || cp == 0xFFFD || is_control(cp)) continue;
        if (is_split_space(cp)) {
            st = flush_token(&s);
        } else if (cp >= 0x3400 && CM_UNI_IS(cjk, cp)) {
            st = flush_token(&s);
            if (st == CM_OK) st = cm_ids_push(&s.token, (int32_t)cp);
            if (st == CM_OK) st = flush_token(&s);
        } else {
            st = cm_ids_push(&s.token, (int32_t)cp);
        }
    }
    if (st == CM_OK) st = flush_token(&s);
    cm_free(s.token.p);
    cm_free(s.word.p);
    cm_buf_deinit(&s.bytes);
    cm_free(s.offs.p);
    cm_free(s.pieces.p);
    return st;
}
