/* The byte-level helpers of MDS: a growable buffer with a JSON writer that prints as Python's
 * json.dumps, Streaming's compressions (zstd, gzip, bz2, snappy, brotli) and hashes (hashlib's
 * names through OpenSSL, xxhash's through libxxhash), file helpers. */
#include "mds_impl.h"

#include <brotli/decode.h>
#include <brotli/encode.h>
#include <bzlib.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <snappy-c.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zlib.h>
#include <zstd.h>

/* ---- JSON text ------------------------------------------------------------------------- */

/* Decodes one UTF-8 code point at s (len bytes left); returns its length, or 0 if invalid. */
int cmi_utf8_decode(const uint8_t *s, size_t len, uint32_t *cp) {
    uint8_t c = s[0];
    int n;
    uint32_t v, min;
    if (c < 0x80) {
        *cp = c;
        return 1;
    } else if ((c & 0xE0) == 0xC0) {
        n = 2, v = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        n = 3, v = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        n = 4, v = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if ((size_t)n > len) return 0;
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return n;
}

void cmi_buf_json_str(cmi_buf *b, const char *s) {
    const uint8_t *p = (const uint8_t *)s;
    size_t len = strlen(s);
    cmi_buf_put(b, "\"", 1);
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int n = cmi_utf8_decode(p + i, len - i, &cp);
        if (n == 0) {
            cp = 0xFFFD;
            n = 1;
        }
        i += (size_t)n;
        switch (cp) {
        case '"': cmi_buf_puts(b, "\\\""); continue;
        case '\\': cmi_buf_puts(b, "\\\\"); continue;
        case '\n': cmi_buf_puts(b, "\\n"); continue;
        case '\r': cmi_buf_puts(b, "\\r"); continue;
        case '\t': cmi_buf_puts(b, "\\t"); continue;
        case '\b': cmi_buf_puts(b, "\\b"); continue;
        case '\f': cmi_buf_puts(b, "\\f"); continue;
        default: break;
        }
        if (cp >= 0x20 && cp < 0x7F) {
            char ch = (char)cp;
            cmi_buf_put(b, &ch, 1);
        } else if (cp < 0x10000) {
            cmi_buf_printf(b, "\\u%04x", cp);
        } else {
            uint32_t v = cp - 0x10000;
            cmi_buf_printf(b, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
        }
    }
    cmi_buf_put(b, "\"", 1);
}

/* ---- compression ------------------------------------------------------------------------- */

bool cmi_mds_compression_parse(const char *s, cmi_zfamily *fam, int *level, const char **ext) {
    *fam = CMI_Z_NONE;
    *level = 0;
    *ext = NULL;
    if (!s || !*s) return true;
    static const struct {
        const char *name;
        cmi_zfamily fam;
        int lo, hi, def; /* lo > hi: takes no level */
    } k[] = {
        {"br", CMI_Z_BR, 0, 11, 11},   {"bz2", CMI_Z_BZ2, 1, 9, 9},   {"gz", CMI_Z_GZ, 0, 9, 9},
        {"snappy", CMI_Z_SNAPPY, 1, 0, 0}, {"zstd", CMI_Z_ZSTD, 1, 22, 3},
    };
    const char *colon = strchr(s, ':');
    size_t nlen = colon ? (size_t)(colon - s) : strlen(s);
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        if (strlen(k[i].name) != nlen || strncmp(s, k[i].name, nlen) != 0) continue;
        int lv = k[i].def;
        if (colon) {
            if (k[i].lo > k[i].hi) return false; /* snappy:N is not a Streaming compression */
            const char *d = colon + 1;
            if (!*d || strlen(d) > 2) return false;
            for (const char *q = d; *q; q++)
                if (*q < '0' || *q > '9') return false;
            lv = atoi(d);
            if (lv < k[i].lo || lv > k[i].hi) return false;
        }
        *fam = k[i].fam;
        *level = lv;
        *ext = k[i].name;
        return true;
    }
    return false;
}

static cm_status zfail(const char *what, const char *name) {
    return cm_set_error(CM_ERR_FORMAT, "%s: %s", name, what);
}

cm_status cmi_mds_compress(cmi_zfamily fam, int level, const uint8_t *in, size_t n, cmi_buf *out) {
    memset(out, 0, sizeof *out);
    switch (fam) {
    case CMI_Z_ZSTD: {
        size_t cap = ZSTD_compressBound(n);
        if (!cmi_buf_reserve(out, cap)) return CM_ERR_OOM;
        size_t r = ZSTD_compress(out->p, cap, in, n, level);
        if (ZSTD_isError(r)) return cm_set_error(CM_ERR_INTERNAL, "zstd: %s", ZSTD_getErrorName(r));
        out->n = r;
        return CM_OK;
    }
    case CMI_Z_GZ: {
        z_stream z;
        memset(&z, 0, sizeof z);
        /* windowBits 31: a gzip wrapper, as Python's gzip.compress writes */
        if (deflateInit2(&z, level, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY) != Z_OK)
            return cm_set_error(CM_ERR_INTERNAL, "gzip: deflateInit2 failed");
        size_t cap = deflateBound(&z, (uLong)n) + 32;
        if (!cmi_buf_reserve(out, cap)) {
            deflateEnd(&z);
            return CM_ERR_OOM;
        }
        z.next_in = (Bytef *)in;
        z.avail_in = (uInt)n;
        z.next_out = out->p;
        z.avail_out = (uInt)cap;
        int rc = deflate(&z, Z_FINISH);
        out->n = cap - z.avail_out;
        deflateEnd(&z);
        if (rc != Z_STREAM_END) return cm_set_error(CM_ERR_INTERNAL, "gzip: deflate failed (%d)", rc);
        return CM_OK;
    }
    case CMI_Z_BZ2: {
        unsigned int cap = (unsigned int)(n + n / 100 + 600);
        if (!cmi_buf_reserve(out, cap)) return CM_ERR_OOM;
        int rc = BZ2_bzBuffToBuffCompress((char *)out->p, &cap, (char *)in, (unsigned int)n, level, 0, 0);
        if (rc != BZ_OK) return cm_set_error(CM_ERR_INTERNAL, "bz2: compression failed (%d)", rc);
        out->n = cap;
        return CM_OK;
    }
    case CMI_Z_SNAPPY: {
        size_t cap = snappy_max_compressed_length(n);
        if (!cmi_buf_reserve(out, cap)) return CM_ERR_OOM;
        if (snappy_compress((const char *)in, n, (char *)out->p, &cap) != SNAPPY_OK)
            return cm_set_error(CM_ERR_INTERNAL, "snappy: compression failed");
        out->n = cap;
        return CM_OK;
    }
    case CMI_Z_BR: {
        size_t cap = BrotliEncoderMaxCompressedSize(n);
        if (!cap) cap = n + 1024;
        if (!cmi_buf_reserve(out, cap)) return CM_ERR_OOM;
        if (!BrotliEncoderCompress(level, BROTLI_DEFAULT_WINDOW, BROTLI_MODE_GENERIC, n, in, &cap, out->p))
            return cm_set_error(CM_ERR_INTERNAL, "brotli: compression failed");
        out->n = cap;
        return CM_OK;
    }
    case CMI_Z_NONE: cmi_buf_put(out, in, n); return out->oom ? CM_ERR_OOM : CM_OK;
    }
    return cm_set_error(CM_ERR_INTERNAL, "compress: unknown family %d", (int)fam);
}

cm_status cmi_mds_decompress(cmi_zfamily fam, const uint8_t *in, size_t n, size_t raw_size, const char *name,
                             uint8_t **out) {
    *out = NULL;
    uint8_t *o = cm_alloc(raw_size ? raw_size : 1, 64);
    if (!o) return CM_ERR_OOM;
    char msg[160];
    msg[0] = '\0';
    size_t got = 0;
    switch (fam) {
    case CMI_Z_ZSTD: {
        unsigned long long fsz = ZSTD_getFrameContentSize(in, n);
        if (fsz != ZSTD_CONTENTSIZE_UNKNOWN && fsz != ZSTD_CONTENTSIZE_ERROR && fsz != raw_size) {
            snprintf(msg, sizeof msg, "the zstd frame holds %llu bytes, index.json says %zu", fsz, raw_size);
            break;
        }
        size_t r = ZSTD_decompress(o, raw_size, in, n);
        if (ZSTD_isError(r)) snprintf(msg, sizeof msg, "corrupt zstd data (%s)", ZSTD_getErrorName(r));
        else got = r;
        break;
    }
    case CMI_Z_GZ: {
        z_stream z;
        memset(&z, 0, sizeof z);
        if (inflateInit2(&z, 47) != Z_OK) {
            snprintf(msg, sizeof msg, "inflateInit2 failed");
            break;
        }
        z.next_in = (Bytef *)in;
        z.avail_in = (uInt)n;
        z.next_out = o;
        z.avail_out = (uInt)raw_size;
        int rc;
        for (;;) { /* several gzip members, as Python's gzip.decompress allows */
            rc = inflate(&z, Z_NO_FLUSH);
            if (rc == Z_STREAM_END && z.avail_in > 0) {
                if (inflateReset(&z) != Z_OK) break;
                continue;
            }
            break;
        }
        got = raw_size - z.avail_out;
        if (rc != Z_STREAM_END) snprintf(msg, sizeof msg, "corrupt or truncated gzip data (zlib %d)", rc);
        else if (z.avail_in > 0) snprintf(msg, sizeof msg, "more gzip data than index.json's raw size");
        inflateEnd(&z);
        break;
    }
    case CMI_Z_BZ2: {
        unsigned int cap = (unsigned int)raw_size;
        int rc = BZ2_bzBuffToBuffDecompress((char *)o, &cap, (char *)in, (unsigned int)n, 0, 0);
        if (rc == BZ_OUTBUFF_FULL) snprintf(msg, sizeof msg, "more bz2 data than index.json's raw size");
        else if (rc != BZ_OK) snprintf(msg, sizeof msg, "corrupt or truncated bz2 data (%d)", rc);
        else got = cap;
        break;
    }
    case CMI_Z_SNAPPY: {
        size_t len;
        if (snappy_uncompressed_length((const char *)in, n, &len) != SNAPPY_OK) {
            snprintf(msg, sizeof msg, "corrupt snappy data");
            break;
        }
        if (len != raw_size) {
            snprintf(msg, sizeof msg, "the snappy data holds %zu bytes, index.json says %zu", len, raw_size);
            break;
        }
        if (snappy_uncompress((const char *)in, n, (char *)o, &len) != SNAPPY_OK) snprintf(msg, sizeof msg, "corrupt snappy data");
        else got = len;
        break;
    }
    case CMI_Z_BR: {
        size_t len = raw_size;
        BrotliDecoderResult rc = BrotliDecoderDecompress(n, in, &len, o);
        if (rc != BROTLI_DECODER_RESULT_SUCCESS) snprintf(msg, sizeof msg, "corrupt or truncated brotli data");
        else got = len;
        break;
    }
    case CMI_Z_NONE:
        if (n != raw_size) snprintf(msg, sizeof msg, "size %zu, expected %zu", n, raw_size);
        else memcpy(o, in, n), got = n;
        break;
    }
    if (!msg[0] && got != raw_size)
        snprintf(msg, sizeof msg, "decompressed to %zu bytes, index.json says %zu", got, raw_size);
    if (msg[0]) {
        cm_free(o);
        return zfail(msg, name);
    }
    *out = o;
    return CM_OK;
}

/* ---- hashes ------------------------------------------------------------------------------- */

static const char *const k_evp_hashes[][2] = {
    {"md5", "MD5"},           {"sha1", "SHA1"},         {"sha224", "SHA224"},     {"sha256", "SHA256"},
    {"sha384", "SHA384"},     {"sha512", "SHA512"},     {"sha3_224", "SHA3-224"}, {"sha3_256", "SHA3-256"},
    {"sha3_384", "SHA3-384"}, {"sha3_512", "SHA3-512"}, {"blake2b", "BLAKE2B-512"}, {"blake2s", "BLAKE2S-256"},
};
static const char *const k_xxh[] = {"xxh32", "xxh64", "xxh3_64", "xxh128", "xxh3_128"};

const char *cmi_mds_hash_names(void) {
    return "md5, sha1, sha224, sha256, sha384, sha512, sha3_224, sha3_256, sha3_384, sha3_512, blake2b, blake2s, "
           "xxh32, xxh64, xxh3_64, xxh128, xxh3_128";
}

bool cmi_mds_hash_known(const char *algo) {
    for (size_t i = 0; i < sizeof k_evp_hashes / sizeof k_evp_hashes[0]; i++)
        if (strcmp(algo, k_evp_hashes[i][0]) == 0) return true;
    for (size_t i = 0; i < sizeof k_xxh / sizeof k_xxh[0]; i++)
        if (strcmp(algo, k_xxh[i]) == 0) return true;
    return false;
}

static void hexify(const uint8_t *d, size_t n, char *hex) {
    static const char k[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        hex[2 * i] = k[d[i] >> 4];
        hex[2 * i + 1] = k[d[i] & 15];
    }
    hex[2 * n] = '\0';
}

cm_status cmi_mds_hash(const char *algo, const void *data, size_t n, char *hex) {
    /* xxhash's hexdigest is the canonical (big-endian) form of the value */
    if (strcmp(algo, "xxh32") == 0) {
        XXH32_canonical_t c;
        XXH32_canonicalFromHash(&c, XXH32(data, n, 0));
        hexify(c.digest, sizeof c.digest, hex);
        return CM_OK;
    }
    if (strcmp(algo, "xxh64") == 0) {
        XXH64_canonical_t c;
        XXH64_canonicalFromHash(&c, XXH64(data, n, 0));
        hexify(c.digest, sizeof c.digest, hex);
        return CM_OK;
    }
    if (strcmp(algo, "xxh3_64") == 0) {
        XXH64_canonical_t c;
        XXH64_canonicalFromHash(&c, XXH3_64bits(data, n));
        hexify(c.digest, sizeof c.digest, hex);
        return CM_OK;
    }
    if (strcmp(algo, "xxh128") == 0 || strcmp(algo, "xxh3_128") == 0) {
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits(data, n));
        hexify(c.digest, sizeof c.digest, hex);
        return CM_OK;
    }
    for (size_t i = 0; i < sizeof k_evp_hashes / sizeof k_evp_hashes[0]; i++) {
        if (strcmp(algo, k_evp_hashes[i][0]) != 0) continue;
        EVP_MD *md = EVP_MD_fetch(NULL, k_evp_hashes[i][1], NULL);
        uint8_t d[EVP_MAX_MD_SIZE];
        unsigned int dn = 0;
        int ok = md && EVP_Digest(data, n, d, &dn, md, NULL);
        EVP_MD_free(md);
        if (!ok) return cm_set_error(CM_ERR_INTERNAL, "hash %s: OpenSSL could not compute it", algo);
        hexify(d, dn, hex);
        return CM_OK;
    }
    return cm_set_error(CM_ERR_INVALID_ARG, "unknown hash '%s' (use one of %s)", algo, cmi_mds_hash_names());
}

/* ---- files -------------------------------------------------------------------------------- */

char *cmi_mds_strdup(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *p = cm_alloc(n, 8);
    if (p) memcpy(p, s, n);
    return p;
}

char *cmi_mds_path2(const char *a, const char *b) {
    if (!a || !*a) return cmi_mds_strdup(b);
    size_t na = strlen(a), nb = strlen(b);
    bool slash = a[na - 1] != '/';
    char *p = cm_alloc(na + nb + 2, 8);
    if (!p) return NULL;
    memcpy(p, a, na);
    if (slash) p[na++] = '/';
    memcpy(p + na, b, nb + 1);
    return p;
}

cm_status cmi_mds_mkdir_p(const char *path) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return cm_set_error(CM_ERR_INVALID_ARG, "path too long: %s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return cm_set_error(CM_ERR_IO, "cannot create directory '%s': %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST)
        return cm_set_error(CM_ERR_IO, "cannot create directory '%s': %s", buf, strerror(errno));
    return CM_OK;
}

cm_status cmi_mds_write_atomic(const char *path, const void *data, size_t n) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return cm_set_error(CM_ERR_IO, "cannot write '%s': %s", tmp, strerror(errno));
    const uint8_t *p = data;
    size_t left = n;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            unlink(tmp);
            return cm_set_error(CM_ERR_IO, "cannot write '%s': %s", path, w < 0 ? strerror(e) : "short write");
        }
        p += w;
        left -= (size_t)w;
    }
    if (close(fd) != 0 || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return cm_set_error(CM_ERR_IO, "cannot write '%s': %s", path, strerror(e));
    }
    return CM_OK;
}

bool cmi_mds_parse_bytes(const char *s, int64_t *out) {
    static const char *const units[] = {"kb", "mb", "gb", "tb", "pb", "eb"};
    char buf[64];
    size_t n = 0;
    for (; *s == ' ' || *s == '\t'; s++) {}
    for (; *s && n + 1 < sizeof buf; s++) buf[n++] = (char)(*s >= 'A' && *s <= 'Z' ? *s - 'A' + 'a' : *s);
    while (n && (buf[n - 1] == ' ' || buf[n - 1] == '\t')) n--;
    buf[n] = '\0';
    if (!n) return false;
    for (int u = 0; u < 6; u++) {
        size_t ul = 2;
        if (n > ul && strcmp(buf + n - ul, units[u]) == 0) {
            buf[n - ul] = '\0';
            char *end;
            double v = strtod(buf, &end);
            if (end == buf || *end || v < 0) return false;
            double m = (double)(1ull << (10 * (u + 1)));
            if (v * m > 9.2e18) return false;
            *out = (int64_t)(v * m);
            return true;
        }
    }
    if (buf[n - 1] == 'b') buf[--n] = '\0';
    if (!n) return false;
    for (size_t i = 0; i < n; i++)
        if (buf[i] < '0' || buf[i] > '9') return false;
    if (n > 18) return false;
    *out = strtoll(buf, NULL, 10);
    return true;
}
