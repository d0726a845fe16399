/* GPT-2 byte-level BPE (FORMATS.md §3): the byte alphabet, the pre-tokenisation regex written out
 * as a scanner, and merges by rank over token ids.
 *
 * Merges work on ids, not strings: every single byte is a token, and merging the pair (a, b)
 * yields the token spelled a+b, so vocab.bpe becomes a map (id_a, id_b) -> (rank, id_ab). */
#include "text/text_impl.h"
#include "text/unicode.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

/* ---- byte alphabet (bytes_to_unicode) ---- */

static void byte_alphabet(uint32_t byte_to_cp[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        byte_to_cp[b] = printable ? (uint32_t)b : 0x100u + (uint32_t)n++;
    }
}

/* Converts a byte-alphabet string to raw bytes in out (room for len bytes); returns the count or -1
 * when a character is outside the alphabet. */
static long unmap_bytes(const int16_t cp_to_byte[0x144], const uint8_t *s, size_t len, uint8_t *out) {
    long n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        i += (size_t)cm_utf8_decode(s + i, len - i, &cp);
        if (cp >= 0x144 || cp_to_byte[cp] < 0) return -1;
        out[n++] = (uint8_t)cp_to_byte[cp];
    }
    return n;
}

/* ---- loading ---- */

/* The encoder (token string -> id over the byte alphabet) from a parsed JSON object; `path` names
 * its source in messages. Does not take root. */
static cm_status encoder_from_json(cm_tokenizer *tok, const cJSON *root, const char *path,
                                   const int16_t cp_to_byte[0x144]) {
    cm_status st = CM_OK;
    int64_t max_id = -1, count = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (v < 0 || v > 10000000 || v != (double)(int64_t)v) {
            return cm_set_error(CM_ERR_FORMAT, "%s: token \"%.40s\" has id that is not an integer in [0, 1e7]",
                                path, e->string ? e->string : "");
        }
        if ((int64_t)v > max_id) max_id = (int64_t)v;
        count++;
    }
    if (count == 0) {
        return cm_set_error(CM_ERR_FORMAT, "%s has no tokens", path);
    }
    if ((st = cm_tokenizer_alloc_vocab_(tok, max_id + 1)) != CM_OK || (st = cm_strmap_init(&tok->vocab, (size_t)count)) != CM_OK) {
        return st;
    }
    uint8_t tmp[1024];
    for (const cJSON *e = root->child; e; e = e->next) {
        size_t klen = strlen(e->string);
        long n = klen <= sizeof tmp ? unmap_bytes(cp_to_byte, (const uint8_t *)e->string, klen, tmp) : -1;
        if (n <= 0) {
            return cm_set_error(CM_ERR_FORMAT,
                         "%s: token \"%.40s\" is empty, too long or has a character outside GPT-2's "
                         "byte alphabet",
                         path, e->string);
        }
        int32_t id = (int32_t)e->valuedouble, prev;
        if (tok->tok_len[id] != 0) {
            return cm_set_error(CM_ERR_FORMAT,
                                "%s: id %d is used by two tokens (\"%.40s\" is the second)", path, id,
                                e->string);
        }
        if ((st = cm_strmap_put(&tok->vocab, tmp, (size_t)n, id, &prev)) != CM_OK) break;
        if (prev >= 0) {
            return cm_set_error(CM_ERR_FORMAT, "%s: token \"%.40s\" appears twice (ids %d and %d)",
                                path, e->string, prev, id);
        }
        tok->tok_start[id] = (uint32_t)tok->tok_bytes.n;
        tok->tok_len[id] = (uint32_t)n;
        if ((st = cm_buf_append(&tok->tok_bytes, tmp, (size_t)n)) != CM_OK) break;
    }
    if (st != CM_OK) return st;
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        tok->byte_id[b] = cm_strmap_get(&tok->vocab, &byte, 1);
        if (tok->byte_id[b] < 0)
            return cm_set_error(CM_ERR_FORMAT, "%s lacks the single-byte token for byte 0x%02X", path, b);
    }
    tok->special[CM_TOKEN_EOT] = cm_strmap_get(&tok->vocab, "<|endoftext|>", 13);
    return CM_OK;
}

/* The merges from vocab.bpe's text ("#version" line, then "A B" per line, rank = order); `path`
 * names it in messages ("GPT-2 vocab.bpe '<path>'"). */
static cm_status merges_from_text(cm_tokenizer *tok, const uint8_t *data, size_t len, const char *path,
                                  const int16_t cp_to_byte[0x144]) {
    cm_status st = cm_pairmap_init(&tok->merges, 65536);
    if (st != CM_OK) return st;
    int32_t rank = 0;
    long line = 0;
    uint8_t a[1024], b[512]; /* a gets a's bytes then b's */
    for (size_t i = 0; i < len;) {
        size_t e = i;
        while (e < len && data[e] != '\n') e++;
        size_t le = e;
        if (le > i && data[le - 1] == '\r') le--;
        line++;
        const uint8_t *s = data + i;
        size_t n = le - i;
        i = e + 1;
        if (n == 0 || (line == 1 && s[0] == '#')) continue;
        const uint8_t *sp = memchr(s, ' ', n);
        long na = -1, nb = -1;
        if (sp && sp > s && (size_t)(sp - s) <= sizeof b && n - (size_t)(sp - s) - 1 <= sizeof b) {
            na = unmap_bytes(cp_to_byte, s, (size_t)(sp - s), a);
            nb = unmap_bytes(cp_to_byte, sp + 1, n - (size_t)(sp - s) - 1, b);
        }
        if (na <= 0 || nb <= 0) {
            return cm_set_error(CM_ERR_FORMAT,
                                "%s line %ld: expected two byte-alphabet tokens separated by one space, "
                                "got \"%.*s\"",
                                path, line, (int)(n > 60 ? 60 : n), (const char *)s);
        }
        int32_t ia = cm_strmap_get(&tok->vocab, a, (size_t)na), ib = cm_strmap_get(&tok->vocab, b, (size_t)nb);
        memcpy(a + na, b, (size_t)nb);
        int32_t iab = cm_strmap_get(&tok->vocab, a, (size_t)(na + nb));
        if (ia < 0 || ib < 0 || iab < 0) {
            return cm_set_error(CM_ERR_FORMAT,
                                "%s line %ld: merge \"%.*s\" uses a token missing from the vocabulary "
                                "(do the two files belong together?)",
                                path, line, (int)(n > 60 ? 60 : n), (const char *)s);
        }
        if ((st = cm_pairmap_put(&tok->merges, (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib, rank++, iab)) != CM_OK)
            return st;
    }
    if (rank == 0) return cm_set_error(CM_ERR_FORMAT, "%s has no merges", path);
    return CM_OK;
}

static void cp_to_byte_table(int16_t cp_to_byte[0x144]) {
    uint32_t byte_to_cp[256];
    byte_alphabet(byte_to_cp);
    for (int i = 0; i < 0x144; i++) cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) cp_to_byte[byte_to_cp[b]] = (int16_t)b;
}

void cm_gpt2_byte_alphabet_(uint32_t byte_to_cp[256]) { byte_alphabet(byte_to_cp); }

cm_status cm_gpt2_from_memory_(const cJSON *encoder, const char *encoder_what, const uint8_t *merges, size_t merges_len,
                               const char *merges_what, cm_tokenizer **out) {
    *out = NULL;
    int16_t cp_to_byte[0x144];
    cp_to_byte_table(cp_to_byte);
    cm_tokenizer *tok;
    cm_status st = cm_tokenizer_alloc_(CM_TOKENIZER_GPT2, &tok);
    if (st != CM_OK) return st;
    if (!cJSON_IsObject(encoder))
        st = cm_set_error(CM_ERR_FORMAT, "%s is not a JSON object (token string -> id); is it truncated?", encoder_what);
    if (st == CM_OK) st = encoder_from_json(tok, encoder, encoder_what, cp_to_byte);
    if (st == CM_OK) st = merges_from_text(tok, merges, merges_len, merges_what, cp_to_byte);
    if (st != CM_OK) {
        cm_tokenizer_free(tok);
        return st;
    }
    *out = tok;
    return CM_OK;
}

cm_status cm_tokenizer_gpt2_new(const char *encoder_json_path, const char *vocab_bpe_path, cm_tokenizer **out) {
    if (!out || !encoder_json_path || !vocab_bpe_path)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_tokenizer_gpt2_new: NULL argument");
    *out = NULL;
    uint8_t *enc = NULL, *bpe = NULL;
    size_t enc_len, bpe_len;
    cm_status st = cm_read_file_(encoder_json_path, "GPT-2 encoder.json", &enc, &enc_len);
    if (st == CM_OK) st = cm_read_file_(vocab_bpe_path, "GPT-2 vocab.bpe", &bpe, &bpe_len);
    cJSON *root = st == CM_OK ? cJSON_ParseWithLength((const char *)enc, enc_len) : NULL;
    cm_free(enc);
    size_t n1 = strlen(encoder_json_path) + 32, n2 = strlen(vocab_bpe_path) + 32;
    char *w1 = cm_alloc(n1, 8), *w2 = cm_alloc(n2, 8);
    if (st == CM_OK && (!w1 || !w2)) st = CM_ERR_OOM;
    cm_tokenizer *tok = NULL;
    if (st == CM_OK) {
        snprintf(w1, n1, "GPT-2 encoder.json '%s'", encoder_json_path);
        snprintf(w2, n2, "GPT-2 vocab.bpe '%s'", vocab_bpe_path);
        st = cm_gpt2_from_memory_(root, w1, bpe, bpe_len, w2, &tok);
    }
    cJSON_Delete(root);
    cm_free(bpe);
    cm_free(w1);
    cm_free(w2);
    if (st != CM_OK) return st;
    tok->path_a = cm_strdup_(encoder_json_path);
    tok->path_b = cm_strdup_(vocab_bpe_path);
    if (!tok->path_a || !tok->path_b) {
        cm_tokenizer_free(tok);
        return CM_ERR_OOM;
    }
    *out = tok;
    return CM_OK;
}

/* ---- pre-tokenisation ---- */

enum { CLS_O = 0, CLS_L = 1, CLS_N = 2, CLS_S = 3 };

static uint8_t g_ascii_cls[128];
static int g_ascii_ready;

static void init_ascii_cls(void) {
    if (__atomic_load_n(&g_ascii_ready, __ATOMIC_ACQUIRE)) return;
    uint8_t t[128];
    for (uint32_t c = 0; c < 128; c++)
        t[c] = CM_UNI_IS(letter, c) ? CLS_L : CM_UNI_IS(number, c) ? CLS_N : CM_UNI_IS(space, c) ? CLS_S : CLS_O;
    memcpy(g_ascii_cls, t, sizeof t); /* the same bytes from every thread that races here */
    __atomic_store_n(&g_ascii_ready, 1, __ATOMIC_RELEASE);
}

/* The class of the character at s[0..n) and its length in bytes; invalid UTF-8 bytes are "other". */
static inline int char_class(const uint8_t *s, size_t n, int *len) {
    if (s[0] < 0x80) {
        *len = 1;
        return g_ascii_cls[s[0]];
    }
    uint32_t cp;
    *len = cm_utf8_decode(s, n, &cp);
    if (cp == CM_UTF8_INVALID) return CLS_O;
    if (CM_UNI_IS(letter, cp)) return CLS_L;
    if (CM_UNI_IS(number, cp)) return CLS_N;
    if (CM_UNI_IS(space, cp)) return CLS_S;
    return CLS_O;
}

/* The end of the pre-token that starts at text[i] (i < len): the regex
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * with the first alternative that matches winning, greedy quantifiers. */
static size_t pretoken_end(const uint8_t *t, size_t len, size_t i) {
    if (t[i] == '\'' && i + 1 < len) {
        uint8_t c1 = t[i + 1];
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 2;
        if (i + 2 < len) {
            uint8_t c2 = t[i + 2];
            if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return i + 3;
        }
    }
    int l;
    int cls = char_class(t + i, len - i, &l);
    size_t j = i + (size_t)l; /* just past the first character of the run */
    if (t[i] == ' ' && j < len) {
        int l2;
        int cls2 = char_class(t + j, len - j, &l2);
        if (cls2 != CLS_S) { /* " ?X+" with the optional space taken */
            cls = cls2;
            j += (size_t)l2;
        }
    }
    if (cls != CLS_S) {
        while (j < len) {
            int l3;
            if (char_class(t + j, len - j, &l3) != cls) break;
            j += (size_t)l3;
        }
        return j;
    }
    /* whitespace: \s+(?!\S) then \s+ */
    size_t last = i, k = j;
    while (k < len) {
        int l4;
        if (char_class(t + k, len - k, &l4) != CLS_S) break;
        last = k;
        k += (size_t)l4;
    }
    if (k == len) return len;  /* the run reaches the end: keep it all */
    if (last > i) return last; /* give back the last whitespace character */
    return j;                  /* a single whitespace character before non-space: \s+ */
}

/* ---- BPE on one pre-token ---- */

/* Appends the ids of the pre-token s[0, n) (n >= 1) to out, using work (room for n ids). */
static cm_status bpe_word(const cm_tokenizer *tok, const uint8_t *s, size_t n, int32_t *w, cm_ids *out) {
    for (size_t k = 0; k < n; k++) w[k] = tok->byte_id[s[k]];
    size_t m = n;
    while (m > 1) {
        int32_t best = INT32_MAX, best_id = -1;
        int32_t ba = 0, bb = 0;
        for (size_t k = 0; k + 1 < m; k++) {
            const cm_pairmap_slot *p = cm_pairmap_get(&tok->merges, (uint64_t)(uint32_t)w[k] << 32 | (uint32_t)w[k + 1]);
            if (p && p->a < best) {
                best = p->a;
                best_id = p->b;
                ba = w[k];
                bb = w[k + 1];
            }
        }
        if (best_id < 0) break;
        size_t o = 0;
        for (size_t k = 0; k < m;) {
            if (k + 1 < m && w[k] == ba && w[k + 1] == bb) {
                w[o++] = best_id;
                k += 2;
            } else {
                w[o++] = w[k++];
            }
        }
        m = o;
    }
    return cm_ids_append(out, w, (int64_t)m);
}

/* Per-call cache of pre-token -> ids (so encode stays thread-safe). */
typedef struct bpe_cache {
    cm_strmap map;   /* pre-token bytes -> entry index */
    cm_ids spans;    /* entry e: ids pool [spans[2e], spans[2e] + spans[2e+1]) */
    cm_ids pool;
} bpe_cache;

#define CACHE_MIN_TEXT 512       /* shorter texts skip the cache */
#define CACHE_MAX_ENTRIES 500000 /* stop adding beyond this (memory bound on huge corpora) */

cm_status cm_gpt2_encode_(const cm_tokenizer *tok, const uint8_t *text, size_t len, cm_ids *out) {
    init_ascii_cls();
    bool use_cache = len >= CACHE_MIN_TEXT;
    bpe_cache c = {0};
    int32_t wbuf[64];
    int32_t *work = wbuf;
    size_t work_cap = 64;
    cm_status st = CM_OK;
    if (use_cache && (st = cm_strmap_init(&c.map, 4096)) != CM_OK) return st;
    for (size_t i = 0; i < len && st == CM_OK;) {
        size_t e = pretoken_end(text, len, i);
        const uint8_t *s = text + i;
        size_t n = e - i;
        i = e;
        if (n == 1) {
            st = cm_ids_push(out, tok->byte_id[s[0]]);
            continue;
        }
        if (use_cache) {
            int32_t ent = cm_strmap_get(&c.map, s, n);
            if (ent >= 0) {
                st = cm_ids_append(out, c.pool.p + c.spans.p[2 * ent], c.spans.p[2 * ent + 1]);
                continue;
            }
        }
        if (n > work_cap) {
            if (work != wbuf) cm_free(work);
            work_cap = n * 2;
            work = cm_alloc(work_cap * sizeof(int32_t), 64);
            if (!work) {
                work = wbuf;
                work_cap = 64;
                st = CM_ERR_OOM;
                break;
            }
        }
        int64_t before = out->n;
        if ((st = bpe_word(tok, s, n, work, out)) != CM_OK) break;
        if (use_cache && c.map.count < CACHE_MAX_ENTRIES && n <= 256) {
            int32_t span[2] = {(int32_t)c.pool.n, (int32_t)(out->n - before)};
            if ((st = cm_ids_append(&c.pool, out->p + before, out->n - before)) != CM_OK ||
                (st = cm_ids_append(&c.spans, span, 2)) != CM_OK ||
                (st = cm_strmap_put(&c.map, s, n, (int32_t)(c.spans.n / 2 - 1), NULL)) != CM_OK)
                break;
        }
    }
    if (work != wbuf) cm_free(work);
    if (use_cache) {
        cm_strmap_deinit(&c.map);
        cm_free(c.spans.p);
        cm_free(c.pool.p);
    }
    return st;
}
