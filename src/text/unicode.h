/* Private: Unicode property tables (generated into unicode_tables.c by tools/gen_unicode_tables.py)
 * and UTF-8 helpers shared by the tokenizers. */
#ifndef CM_TEXT_UNICODE_H
#define CM_TEXT_UNICODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cm_uni_range {
    uint32_t lo, hi; /* inclusive */
} cm_uni_range;

/* fold(cp) = NFD(lower(cp)) without Mn, as UTF-8 bytes cm_uni_fold_pool[off, off + len). */
typedef struct cm_uni_fold {
    uint32_t cp;
    uint32_t off, len;
} cm_uni_fold;

extern const char cm_uni_version[]; /* the Unicode version of the tables, e.g. "15.0.0" */

#define CM_UNI_TABLE(name)                   \
    extern const cm_uni_range cm_uni_##name[]; \
    extern const size_t cm_uni_##name##_n;
CM_UNI_TABLE(letter)   /* \p{L} */
CM_UNI_TABLE(number)   /* \p{N} */
CM_UNI_TABLE(space)    /* White_Space = the regex module's \s */
CM_UNI_TABLE(punct)    /* P* */
CM_UNI_TABLE(control)  /* C* */
CM_UNI_TABLE(zs)       /* Zs */
CM_UNI_TABLE(mn)       /* Mn */
CM_UNI_TABLE(cjk)      /* BERT's CJK blocks */
CM_UNI_TABLE(cased)    /* Cased (for Final_Sigma) */
CM_UNI_TABLE(case_ign) /* Case_Ignorable (for Final_Sigma) */
#undef CM_UNI_TABLE

extern const cm_uni_fold cm_uni_fold_map[];
extern const size_t cm_uni_fold_map_n;
extern const uint8_t cm_uni_fold_pool[];

/* Binary search of a sorted range table. */
bool cm_uni_in(const cm_uni_range *r, size_t n, uint32_t cp);
#define CM_UNI_IS(name, cp) cm_uni_in(cm_uni_##name, cm_uni_##name##_n, (cp))

/* The fold entry for cp, or NULL when fold(cp) == cp (or cp is Mn / a Hangul syllable). */
const cm_uni_fold *cm_uni_fold_find(uint32_t cp);

/* A code point that marks an invalid UTF-8 byte (never a real code point). */
#define CM_UTF8_INVALID 0xFFFFFFFFu

/* Decodes one code point at s[0..n) (n >= 1), strictly (no overlongs, surrogates or > U+10FFFF).
 * Returns the bytes used (1..4); on an invalid sequence returns 1 and sets *cp = CM_UTF8_INVALID. */
static inline int cm_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t b0 = s[0];
    if (b0 < 0x80) {
        *cp = b0;
        return 1;
    }
    int len;
    uint32_t c, lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        len = 2, c = b0 & 0x1F;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        len = 3, c = b0 & 0x0F;
        if (b0 == 0xE0) lo = 0xA0;
        if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        len = 4, c = b0 & 0x07;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;
    } else {
        *cp = CM_UTF8_INVALID;
        return 1;
    }
    if ((size_t)len > n) {
        *cp = CM_UTF8_INVALID;
        return 1;
    }
    for (int k = 1; k < len; k++) {
        uint8_t b = s[k];
        if (b < lo || b > hi) {
            *cp = CM_UTF8_INVALID;
            return 1;
        }
        lo = 0x80, hi = 0xBF;
        c = (c << 6) | (b & 0x3F);
    }
    *cp = c;
    return len;
}

/* Writes cp as UTF-8 into out (room for 4); returns the length. */
static inline int cm_utf8_encode(uint32_t cp, uint8_t *out) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the maximal ill-formed subpart at s[0..n) (Unicode §3.9, what Python's decoder replaces
 * with one U+FFFD under errors='replace'); call only where cm_utf8_decode reported invalid. */
size_t cm_utf8_invalid_len(const uint8_t *s, size_t n);

#endif
