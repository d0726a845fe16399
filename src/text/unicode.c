/* Unicode lookups over the generated tables, and the UTF-8 replacement rule. */
#include "text/unicode.h"

bool cm_uni_in(const cm_uni_range *r, size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid].lo) hi = mid;
        else if (cp > r[mid].hi) lo = mid + 1;
        else return true;
    }
    return false;
}

const cm_uni_fold *cm_uni_fold_find(uint32_t cp) {
    size_t lo = 0, hi = cm_uni_fold_map_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < cm_uni_fold_map[mid].cp) hi = mid;
        else if (cp > cm_uni_fold_map[mid].cp) lo = mid + 1;
        else return &cm_uni_fold_map[mid];
    }
    return NULL;
}

size_t cm_utf8_invalid_len(const uint8_t *s, size_t n) {
    uint8_t b0 = s[0];
    int len;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        len = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        len = 3;
        if (b0 == 0xE0) lo = 0xA0;
        if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        len = 4;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;
    } else {
        return 1; /* not a lead byte */
    }
    /* A valid lead followed by valid continuations that stop early (a wrong byte or the end):
     * the whole prefix is one ill-formed subpart. */
    size_t k = 1;
    while (k < (size_t)len && k < n && s[k] >= lo && s[k] <= hi) {
        lo = 0x80, hi = 0xBF;
        k++;
    }
    return k;
}
