/* A minimal PNG writer (report.h): 8-bit gray or RGB, no interlace, filter 0, zlib. */
#include <composer/report.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

static void be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

/* length, type, data, CRC-32 of type + data */
static bool chunk(FILE *f, const char *type, const uint8_t *data, size_t n) {
    uint8_t hdr[8];
    be32(hdr, (uint32_t)n);
    memcpy(hdr + 4, type, 4);
    uLong crc = crc32(0L, (const Bytef *)type, 4);
    if (n) crc = crc32(crc, data, (uInt)n);
    uint8_t tail[4];
    be32(tail, (uint32_t)crc);
    return fwrite(hdr, 1, 8, f) == 8 && (!n || fwrite(data, 1, n, f) == n) && fwrite(tail, 1, 4, f) == 4;
}

cm_status cm_png_write(const char *path, int64_t width, int64_t height, int channels, const uint8_t *pixels) {
    if (!path || !pixels) return cm_set_error(CM_ERR_INVALID_ARG, "cm_png_write: NULL path or pixels");
    if (width < 1 || height < 1 || width > 65535 || height > 65535 || (channels != 1 && channels != 3))
        return cm_set_error(CM_ERR_INVALID_ARG, "PNG '%s': %lld x %lld with %d channel(s): sides must be 1..65535 and "
                                                "channels 1 (gray) or 3 (RGB)",
                            path, (long long)width, (long long)height, channels);
    const size_t row = (size_t)width * (size_t)channels, raw_n = (row + 1) * (size_t)height;
    uint8_t *raw = cm_alloc(raw_n, 16);
    uLongf zn = compressBound((uLong)raw_n);
    uint8_t *z = cm_alloc(zn, 16);
    if (!raw || !z) {
        cm_free(raw), cm_free(z);
        return cm_set_error(CM_ERR_OOM, "PNG '%s': out of memory", path);
    }
    for (int64_t y = 0; y < height; y++) {
        raw[(size_t)y * (row + 1)] = 0; /* filter type 0: none */
        memcpy(raw + (size_t)y * (row + 1) + 1, pixels + (size_t)y * row, row);
    }
    int zr = compress2(z, &zn, raw, (uLong)raw_n, 6);
    cm_free(raw);
    if (zr != Z_OK) {
        cm_free(z);
        return cm_set_error(CM_ERR_OOM, "PNG '%s': zlib failed (%d)", path, zr);
    }
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        cm_free(z);
        return cm_set_error(CM_ERR_IO, "PNG: cannot write '%s': %s", tmp, strerror(errno));
    }
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    uint8_t ihdr[13];
    be32(ihdr, (uint32_t)width), be32(ihdr + 4, (uint32_t)height);
    ihdr[8] = 8;                           /* bit depth */
    ihdr[9] = channels == 3 ? 2 : 0;       /* colour type: truecolour or greyscale */
    ihdr[10] = ihdr[11] = ihdr[12] = 0;    /* deflate, adaptive filtering, no interlace */
    bool ok = fwrite(sig, 1, 8, f) == 8 && chunk(f, "IHDR", ihdr, 13) && chunk(f, "IDAT", z, zn) &&
              chunk(f, "IEND", NULL, 0);
    cm_free(z);
    if (fclose(f) != 0) ok = false;
    if (!ok || rename(tmp, path) != 0) {
        cm_status s = cm_set_error(CM_ERR_IO, "PNG: writing '%s' failed: %s", path, strerror(errno));
        unlink(tmp);
        return s;
    }
    return CM_OK;
}
