/* llm.c token files: a 256-int32 little-endian header (magic 20240520, version 1 = uint16 tokens or
 * 2 = uint32 tokens, token count) followed by the tokens, little-endian. Validation and the
 * window gather that language-model samples are made of. */
#include "data/formats.h"

#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "token files are read in place, which assumes a little-endian host"
#endif

static int32_t le32(const uint8_t *p) {
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

cm_status cm_tokfile_parse(const uint8_t *buf, size_t n, const char *name, cm_tokfile *out) {
    if (n < CM_TOKFILE_HEADER_BYTES)
        return cm_set_error(CM_ERR_FORMAT, "'%s': %zu bytes is shorter than the %d-byte token-file header "
                            "(256 int32; file truncated or not a token file)", name, n, CM_TOKFILE_HEADER_BYTES);
    int32_t magic = le32(buf), version = le32(buf + 4), count = le32(buf + 8);
    if (magic != CM_TOKFILE_MAGIC)
        return cm_set_error(CM_ERR_FORMAT, "'%s': bad magic %d (a token file starts with %d, llm.c's layout)", name,
                            magic, CM_TOKFILE_MAGIC);
    if (version != 1 && version != 2)
        return cm_set_error(CM_ERR_FORMAT, "'%s': unknown token-file version %d (1 = uint16 tokens, 2 = uint32 tokens)",
                            name, version);
    if (count < 0)
        return cm_set_error(CM_ERR_FORMAT, "'%s': negative token count %d in the header (corrupt header)", name, count);
    int width = version == 1 ? 2 : 4;
    size_t want = CM_TOKFILE_HEADER_BYTES + (size_t)count * (size_t)width;
    if (n < want)
        return cm_set_error(CM_ERR_FORMAT, "'%s': truncated: the header says %d tokens of %d bytes (%zu bytes in all), "
                            "the file has %zu", name, count, width, want, n);
    if (n > want)
        return cm_set_error(CM_ERR_FORMAT, "'%s': %zu trailing bytes after %d tokens of %d bytes (the header's count "
                            "does not match the file size)", name, n - want, count, width);
    out->version = version;
    out->width = width;
    out->n_tokens = count;
    out->tokens = buf + CM_TOKFILE_HEADER_BYTES;
    return CM_OK;
}

/* The widening copies: dst[j] = src[j], with the largest value seen returned for the range check.
 * Written as plain loops over restrict pointers so the compiler vectorises them. */
#define CM_WIDEN(NAME, SRC_T, DST_T)                                                      \
    static uint32_t NAME(DST_T *restrict dst, const SRC_T *restrict src, int64_t n) {    \
        uint32_t mx = 0;                                                                  \
        for (int64_t j = 0; j < n; j++) {                                                 \
            SRC_T v = src[j];                                                             \
            dst[j] = (DST_T)v;                                                            \
            mx = v > mx ? v : mx;                                                         \
        }                                                                                 \
        return mx;                                                                        \
    }
CM_WIDEN(widen_u16_i32, uint16_t, int32_t)
CM_WIDEN(widen_u16_i64, uint16_t, int64_t)
CM_WIDEN(widen_u32_i32, uint32_t, int32_t)
CM_WIDEN(widen_u32_i64, uint32_t, int64_t)
#undef CM_WIDEN

cm_status cm_tokfile_window(const cm_tokfile *tf, int64_t start, int64_t T, bool i64, int64_t vocab_size,
                            const char *name, void *input_ids, void *labels) {
    uint32_t mx;
    /* The file's token bytes are only 2- or 4-byte aligned relative to a page-aligned map (the
     * header is 1024 bytes), which is enough for direct typed loads. */
    if (tf->width == 2) {
        const uint16_t *src = (const uint16_t *)(const void *)tf->tokens + start;
        if (i64) {
            mx = widen_u16_i64(input_ids, src, T);
            uint32_t m2 = widen_u16_i64(labels, src + 1, T);
            mx = m2 > mx ? m2 : mx;
        } else {
            mx = widen_u16_i32(input_ids, src, T);
            uint32_t m2 = widen_u16_i32(labels, src + 1, T);
            mx = m2 > mx ? m2 : mx;
        }
    } else {
        const uint32_t *src = (const uint32_t *)(const void *)tf->tokens + start;
        if (i64) {
            mx = widen_u32_i64(input_ids, src, T);
            uint32_t m2 = widen_u32_i64(labels, src + 1, T);
            mx = m2 > mx ? m2 : mx;
        } else {
            mx = widen_u32_i32(input_ids, src, T);
            uint32_t m2 = widen_u32_i32(labels, src + 1, T);
            mx = m2 > mx ? m2 : mx;
        }
    }
    int64_t limit = vocab_size > 0 ? vocab_size : (i64 ? INT64_MAX : (int64_t)INT32_MAX + 1);
    if ((int64_t)mx < limit) return CM_OK;
    /* Slow path only on failure: find the first offending token for the message. */
    for (int64_t j = 0; j <= T; j++) {
        uint32_t v = tf->width == 2 ? ((const uint16_t *)(const void *)tf->tokens)[start + j]
                                    : ((const uint32_t *)(const void *)tf->tokens)[start + j];
        if ((int64_t)v >= limit) {
            if (vocab_size > 0)
                return cm_set_error(CM_ERR_FORMAT, "'%s': token %u at position %lld is >= the vocabulary size %lld "
                                    "(wrong vocab_size, or a file from another tokenizer)", name, v,
                                    (long long)(start + j), (long long)vocab_size);
            return cm_set_error(CM_ERR_FORMAT, "'%s': token %u at position %lld does not fit in int32 (ask for i64 ids)",
                                name, v, (long long)(start + j));
        }
    }
    return CM_OK;
}
