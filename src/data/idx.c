/* The IDX format (MNIST and friends): header validation on memory. See docs FORMATS §1. */
#include "data/formats.h"

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static int idx_elem_size(int type) {
    switch (type) {
    case 0x08: case 0x09: return 1;
    case 0x0B: return 2;
    case 0x0C: case 0x0D: return 4;
    case 0x0E: return 8;
    default: return 0;
    }
}

cm_status cm_idx_parse(const uint8_t *buf, size_t n, const char *name, cm_idx *out) {
    if (n < 4)
        return cm_set_error(CM_ERR_FORMAT, "'%s': %zu bytes is shorter than the 4-byte IDX header (file truncated?)",
                            name, n);
    uint32_t magic = be32(buf);
    if (buf[0] != 0 || buf[1] != 0)
        return cm_set_error(CM_ERR_FORMAT, "'%s': bad IDX magic 0x%08x (an IDX file starts with two zero bytes; "
                            "a gzip file that was not decompressed starts with 0x1f8b)", name, magic);
    int type = buf[2], ndim = buf[3];
    int es = idx_elem_size(type);
    if (es == 0)
        return cm_set_error(CM_ERR_FORMAT, "'%s': bad IDX magic 0x%08x: unknown element type 0x%02x "
                            "(known: 0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64)", name, magic, type);
    if (ndim < 1 || ndim > CM_IDX_MAX_DIMS)
        return cm_set_error(CM_ERR_FORMAT, "'%s': bad IDX magic 0x%08x: %d dimensions (must be 1..%d)", name, magic,
                            ndim, CM_IDX_MAX_DIMS);
    size_t header = 4 + 4 * (size_t)ndim;
    if (n < header)
        return cm_set_error(CM_ERR_FORMAT, "'%s': truncated IDX header: %d dimensions need %zu bytes, the file has %zu",
                            name, ndim, header, n);
    uint64_t numel = 1;
    bool overflow = false;
    for (int d = 0; d < ndim; d++) {
        out->dims[d] = be32(buf + 4 + 4 * d);
        overflow |= __builtin_mul_overflow(numel, (uint64_t)out->dims[d], &numel);
    }
    uint64_t bytes;
    overflow |= __builtin_mul_overflow(numel, (uint64_t)es, &bytes);
    if (overflow || bytes > SIZE_MAX - header)
        return cm_set_error(CM_ERR_FORMAT, "'%s': IDX dimensions overflow 64-bit sizes (corrupt header)", name);
    size_t want = header + (size_t)bytes;
    if (n < want)
        return cm_set_error(CM_ERR_FORMAT, "'%s': truncated: the IDX header (dims %u%s...) needs %zu bytes, the file has %zu",
                            name, out->dims[0], ndim > 1 ? " x " : "", want, n);
    if (n > want)
        return cm_set_error(CM_ERR_FORMAT, "'%s': %zu trailing bytes after the IDX data (header needs %zu bytes, file has %zu)",
                            name, n - want, want, n);
    out->magic = magic;
    out->type = type;
    out->elem_size = es;
    out->ndim = ndim;
    out->numel = numel;
    out->data = buf + header;
    return CM_OK;
}
