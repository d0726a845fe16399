/* Whole-file access for the dataset formats: read (with transparent gzip), map read-only, and
 * in-memory gunzip. Every error names the file. */
#include "data/formats.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* The largest decompressed file the readers accept (MNIST's biggest is 47 MB). */
#define CM_GUNZIP_MAX ((size_t)8 << 30)

static cm_status open_error(const char *path, int err) {
    if (err == ENOENT)
        return cm_set_error(CM_ERR_NOT_FOUND, "'%s': no such file (check the path and the data directory)", path);
    return cm_set_error(CM_ERR_IO, "'%s': cannot open: %s", path, strerror(err));
}

/* Opens `path` and returns its size; -1 with the error set. */
static int open_sized(const char *path, size_t *size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        open_error(path, errno);
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        cm_set_error(CM_ERR_IO, "'%s': cannot stat: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        cm_set_error(CM_ERR_IO, "'%s': not a regular file", path);
        close(fd);
        return -1;
    }
    *size = (size_t)st.st_size;
    return fd;
}

void cm_blob_release(cm_blob *b) {
    if (!b) return;
    if (b->kind == 1) cm_free(b->data);
    if (b->kind == 2 && b->data) munmap(b->data, b->size);
    b->data = NULL;
    b->size = 0;
    b->kind = 0;
}

cm_status cm_blob_map(const char *path, cm_blob *out) {
    memset(out, 0, sizeof *out);
    size_t size;
    int fd = open_sized(path, &size);
    if (fd < 0) return cm_last_status();
    if (size > 0) {
        void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int err = errno;
            close(fd);
            return cm_set_error(CM_ERR_IO, "'%s': cannot map %zu bytes: %s", path, size, strerror(err));
        }
        out->data = p;
        out->kind = 2;
    }
    out->size = size;
    close(fd);
    return CM_OK;
}

cm_status cm_gunzip(const uint8_t *in, size_t n, size_t max_out, const char *name, cm_blob *out) {
    memset(out, 0, sizeof *out);
    /* The trailer of the last member holds the size mod 2^32: a good first guess. */
    size_t cap = 1 << 16;
    if (n >= 18) {
        uint32_t isize = (uint32_t)in[n - 4] | (uint32_t)in[n - 3] << 8 | (uint32_t)in[n - 2] << 16 |
                         (uint32_t)in[n - 1] << 24;
        /* Deflate expands at most ~1032:1, so a larger claim is a corrupt trailer: don't trust it. */
        if (isize > cap && (uint64_t)isize <= (uint64_t)n * 1032 + 1024) cap = isize;
    }
    if (cap > max_out) cap = max_out > 0 ? max_out : 1;
    uint8_t *buf = cm_alloc(cap, 64);
    if (!buf) return cm_set_error(CM_ERR_OOM, "'%s': cannot allocate %zu bytes to decompress into", name, cap);
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) {
        cm_free(buf);
        return cm_set_error(CM_ERR_INTERNAL, "'%s': zlib inflateInit2 failed", name);
    }
    size_t len = 0, consumed = 0;
    cm_status st = CM_OK;
    for (;;) {
        if (len == cap) {
            if (cap >= max_out) {
                st = cm_set_error(CM_ERR_FORMAT, "'%s': decompresses to more than %zu bytes (corrupt or not a dataset file)",
                                  name, max_out);
                break;
            }
            size_t ncap = cap * 2 > max_out ? max_out : cap * 2;
            uint8_t *nb = cm_alloc(ncap, 64);
            if (!nb) {
                st = cm_set_error(CM_ERR_OOM, "'%s': cannot allocate %zu bytes to decompress into", name, ncap);
                break;
            }
            memcpy(nb, buf, len);
            cm_free(buf);
            buf = nb;
            cap = ncap;
        }
        /* zlib counts in uInt; feed and drain at most 1 GiB at a time. */
        size_t in_left = n - consumed, out_left = cap - len;
        zs.next_in = (Bytef *)(in + consumed);
        zs.avail_in = (uInt)(in_left > (1u << 30) ? (1u << 30) : in_left);
        zs.next_out = buf + len;
        zs.avail_out = (uInt)(out_left > (1u << 30) ? (1u << 30) : out_left);
        uInt avail_in0 = zs.avail_in, avail_out0 = zs.avail_out;
        int rc = inflate(&zs, Z_NO_FLUSH);
        consumed += avail_in0 - zs.avail_in;
        len += avail_out0 - zs.avail_out;
        if (rc == Z_STREAM_END) {
            /* Concatenated members are valid gzip; anything else after the end is not. */
            if (consumed == n) break;
            if (n - consumed >= 2 && in[consumed] == 0x1f && in[consumed + 1] == 0x8b) {
                inflateReset(&zs);
                continue;
            }
            st = cm_set_error(CM_ERR_FORMAT, "'%s': %zu bytes of trailing garbage after the gzip data", name, n - consumed);
            break;
        }
        if (rc == Z_OK) continue;
        if (rc == Z_BUF_ERROR && zs.avail_out == 0) continue; /* grow and go on */
        if (rc == Z_BUF_ERROR) { /* no progress possible: the input ended inside the stream */
            st = cm_set_error(CM_ERR_FORMAT, "'%s': gzip data is truncated (ends after %zu compressed bytes, %zu decompressed)",
                              name, n, len);
            break;
        }
        if (rc == Z_MEM_ERROR) {
            st = cm_set_error(CM_ERR_OOM, "'%s': zlib ran out of memory", name);
            break;
        }
        st = cm_set_error(CM_ERR_FORMAT, "'%s': corrupt gzip data at compressed byte %zu (zlib: %s)", name, consumed,
                          zs.msg ? zs.msg : "data error");
        break;
    }
    inflateEnd(&zs);
    if (st != CM_OK) {
        cm_free(buf);
        return st;
    }
    out->data = buf;
    out->size = len;
    out->kind = 1;
    return CM_OK;
}

cm_status cm_blob_read(const char *path, cm_blob *out) {
    cm_blob raw;
    cm_status st = cm_blob_map(path, &raw);
    if (st != CM_OK) return st;
    if (raw.size >= 2 && raw.data[0] == 0x1f && raw.data[1] == 0x8b) {
        st = cm_gunzip(raw.data, raw.size, CM_GUNZIP_MAX, path, out);
        cm_blob_release(&raw);
        return st;
    }
    *out = raw;
    return CM_OK;
}
