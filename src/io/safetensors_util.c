/* Small helpers shared by the safetensors reader, writer and index: dtype table, UTF-8 check,
 * a growable buffer over the allocator hook, checked byte sizes. */
#include "io/safetensors_impl.h"

#include <string.h>

static const char *const k_names[] = {
#define CM_X_(name, bits) #name,
    CM_ST_DTYPE_LIST(CM_X_)
#undef CM_X_
};
static const int k_bits[] = {
#define CM_X_(name, bits) bits,
    CM_ST_DTYPE_LIST(CM_X_)
#undef CM_X_
};
_Static_assert(sizeof k_names / sizeof k_names[0] == CM_ST_DTYPE_COUNT, "safetensors dtype table out of sync");
_Static_assert(CM_ST_DTYPE_COUNT == 22, "the reference has 22 dtypes (FORMATS.md §4.1)");

const char *cm_st_dtype_name(cm_st_dtype dt) { return (unsigned)dt < CM_ST_DTYPE_COUNT ? k_names[dt] : "?"; }
int cm_st_dtype_bits(cm_st_dtype dt) { return (unsigned)dt < CM_ST_DTYPE_COUNT ? k_bits[dt] : 0; }

cm_status cm_st_dtype_parse(const char *s, cm_st_dtype *out) {
    for (int i = 0; s && i < CM_ST_DTYPE_COUNT; i++) {
        if (strcmp(s, k_names[i]) == 0) {
            *out = (cm_st_dtype)i;
            return CM_OK;
        }
    }
    return cm_set_error(CM_ERR_INVALID_ARG,
                        "safetensors dtype '%s' is not known (use one of BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, "
                        "F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, I16, U16, F16, BF16, I32, U32, F32, "
                        "C64, F64, I64, U64; names are case-sensitive)",
                        s ? s : "(null)");
}

bool cm_st_dtype_to_cm(cm_st_dtype dt, cm_dtype *out) {
    cm_dtype d;
    switch (dt) {
    case CM_ST_DTYPE_F32: d = CM_DTYPE_F32; break;
    case CM_ST_DTYPE_BF16: d = CM_DTYPE_BF16; break;
    case CM_ST_DTYPE_F16: d = CM_DTYPE_F16; break;
    case CM_ST_DTYPE_I32: d = CM_DTYPE_I32; break;
    case CM_ST_DTYPE_I64: d = CM_DTYPE_I64; break;
    case CM_ST_DTYPE_U8: d = CM_DTYPE_U8; break;
    default: return false;
    }
    if (out) *out = d;
    return true;
}

cm_st_dtype cm_st_dtype_from_cm(cm_dtype dt) {
    switch (dt) {
    case CM_DTYPE_F32: return CM_ST_DTYPE_F32;
    case CM_DTYPE_BF16: return CM_ST_DTYPE_BF16;
    case CM_DTYPE_F16: return CM_ST_DTYPE_F16;
    case CM_DTYPE_I32: return CM_ST_DTYPE_I32;
    case CM_DTYPE_I64: return CM_ST_DTYPE_I64;
    case CM_DTYPE_U8: return CM_ST_DTYPE_U8;
    default: return CM_ST_DTYPE_COUNT;
    }
}

bool cm_st_utf8_valid(const unsigned char *s, size_t n, size_t *bad) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;      /* no overlong forms */
            else if (c == 0xED) hi = 0x9F; /* no surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;      /* no overlong forms */
            else if (c == 0xF4) hi = 0x8F; /* nothing above U+10FFFF */
        } else {
            if (bad) *bad = i;
            return false;
        }
        if (n - i < len || s[i + 1] < lo || s[i + 1] > hi) {
            if (bad) *bad = i;
            return false;
        }
        for (size_t k = 2; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) {
                if (bad) *bad = i;
                return false;
            }
        }
        i += len;
    }
    return true;
}

cm_status cm_st_buf_reserve(cm_st_buf *b, size_t more) {
    if (b->cap - b->len >= more) return CM_OK;
    if (more > SIZE_MAX / 2 - b->len) return cm_set_error(CM_ERR_OOM, "out of memory: buffer of %zu bytes", more);
    size_t cap = b->cap ? b->cap : 64;
    while (cap - b->len < more) cap *= 2;
    unsigned char *p = cm_alloc(cap, 16);
    if (!p) return CM_ERR_OOM;
    if (b->len) memcpy(p, b->p, b->len);
    cm_free(b->p);
    b->p = p;
    b->cap = cap;
    return CM_OK;
}

cm_status cm_st_buf_put(cm_st_buf *b, const void *data, size_t n) {
    cm_status s = cm_st_buf_reserve(b, n);
    if (s != CM_OK) return s;
    if (n) memcpy(b->p + b->len, data, n);
    b->len += n;
    return CM_OK;
}

void cm_st_buf_free(cm_st_buf *b) {
    cm_free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

bool cm_st_nbytes(cm_st_dtype dt, uint64_t numel, uint64_t *nbytes, const char **why) {
    uint64_t bits = (uint64_t)cm_st_dtype_bits(dt), nbits;
    if (__builtin_mul_overflow(numel, bits, &nbits)) {
        if (why) *why = "overflow";
        return false;
    }
    if (nbits % 8) {
        if (why) *why = "bits";
        return false;
    }
    *nbytes = nbits / 8;
    return true;
}

char *cm_st_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = cm_alloc(n, 8);
    if (d) memcpy(d, s, n);
    return d;
}
