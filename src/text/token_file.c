/* llm.c token files (header of 256 int32: magic 20240520, version 1 = uint16 / 2 = uint32 tokens,
 * token count; then the tokens, little-endian), written atomically. */
#include "text/text_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

cm_status cm_atomic_open_(const char *path, cm_atomic_file *af) {
    memset(af, 0, sizeof *af);
    af->fd = -1;
    size_t n = strlen(path);
    af->path = cm_strdup_(path);
    af->tmp = cm_alloc(n + 16, 1);
    if (!af->path || !af->tmp) {
        cm_atomic_abort_(af);
        return CM_ERR_OOM;
    }
    snprintf(af->tmp, n + 16, "%s.tmp.XXXXXX", path);
    af->fd = mkstemp(af->tmp);
    if (af->fd < 0) {
        cm_status st = cm_set_error(CM_ERR_IO, "cannot create '%s' (temporary file '%s'): %s", path, af->tmp, strerror(errno));
        af->tmp[0] = 0; /* nothing to remove */
        cm_atomic_abort_(af);
        return st;
    }
    return CM_OK;
}

cm_status cm_atomic_write_(cm_atomic_file *af, const void *data, size_t n) {
    const uint8_t *p = data;
    while (n > 0) {
        ssize_t w = write(af->fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            cm_status st = cm_set_error(CM_ERR_IO, "cannot write '%s': %s", af->path, w < 0 ? strerror(errno) : "no progress");
            cm_atomic_abort_(af);
            return st;
        }
        p += w;
        n -= (size_t)w;
    }
    return CM_OK;
}

cm_status cm_atomic_commit_(cm_atomic_file *af) {
    cm_status st = CM_OK;
    if (fsync(af->fd) != 0) st = cm_set_error(CM_ERR_IO, "cannot fsync '%s': %s", af->path, strerror(errno));
    int fd = af->fd;
    af->fd = -1;
    if (close(fd) != 0 && st == CM_OK) st = cm_set_error(CM_ERR_IO, "cannot close '%s': %s", af->path, strerror(errno));
    if (st == CM_OK && rename(af->tmp, af->path) != 0)
        st = cm_set_error(CM_ERR_IO, "cannot rename '%s' to '%s': %s", af->tmp, af->path, strerror(errno));
    if (st != CM_OK) {
        cm_atomic_abort_(af);
        return st;
    }
    /* make the rename durable */
    char *dir = cm_strdup_(af->path);
    if (dir) {
        char *slash = strrchr(dir, '/');
        if (slash) slash[slash == dir ? 1 : 0] = 0;
        int dfd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY);
        if (dfd >= 0) {
            (void)fsync(dfd); /* best effort: some file systems refuse fsync on directories */
            close(dfd);
        }
        cm_free(dir);
    }
    af->tmp[0] = 0;
    cm_atomic_abort_(af);
    return CM_OK;
}

void cm_atomic_abort_(cm_atomic_file *af) {
    if (af->fd >= 0) close(af->fd);
    if (af->tmp && af->tmp[0]) unlink(af->tmp);
    cm_free(af->path);
    cm_free(af->tmp);
    memset(af, 0, sizeof *af);
    af->fd = -1;
}

cm_status cm_write_file_atomic_(const char *path, const void *data, size_t len) {
    cm_atomic_file af;
    cm_status st = cm_atomic_open_(path, &af);
    if (st == CM_OK) st = cm_atomic_write_(&af, data, len);
    if (st == CM_OK) st = cm_atomic_commit_(&af);
    return st;
}

static void put_le32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}

cm_status cm_token_file_write(const char *path, const int32_t *ids, int64_t n, cm_token_width width) {
    if (!path || (n > 0 && !ids) || n < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_token_file_write: NULL path/ids or negative count");
    if (n > INT32_MAX)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "token file '%s': %lld tokens do not fit the header's int32 count (split into shards of at "
                            "most %d tokens)",
                            path, (long long)n, INT32_MAX);
    if (width != CM_TOKEN_WIDTH_AUTO && width != CM_TOKEN_WIDTH_U16 && width != CM_TOKEN_WIDTH_U32)
        return cm_set_error(CM_ERR_INVALID_ARG, "token file '%s': unknown token width %d", path, (int)width);
    int32_t max_id = -1;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0)
            return cm_set_error(CM_ERR_INVALID_ARG, "token file '%s': token %lld is negative (%d)", path, (long long)i,
                                ids[i]);
        if (ids[i] > max_id) max_id = ids[i];
    }
    if (width == CM_TOKEN_WIDTH_AUTO) width = max_id < 65536 ? CM_TOKEN_WIDTH_U16 : CM_TOKEN_WIDTH_U32;
    if (width == CM_TOKEN_WIDTH_U16 && max_id >= 65536)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "token file '%s': id %d does not fit uint16 tokens (use CM_TOKEN_WIDTH_U32 or AUTO)", path,
                            max_id);
    uint8_t header[CM_TOKEN_FILE_HEADER_INTS * 4] = {0};
    put_le32(header, CM_TOKEN_FILE_MAGIC);
    put_le32(header + 4, width == CM_TOKEN_WIDTH_U16 ? 1 : 2);
    put_le32(header + 8, (uint32_t)n);
    cm_atomic_file af;
    cm_status st = cm_atomic_open_(path, &af);
    if (st == CM_OK) st = cm_atomic_write_(&af, header, sizeof header);
    size_t bytes_per = width == CM_TOKEN_WIDTH_U16 ? 2 : 4;
    uint8_t chunk[1 << 16];
    size_t per_chunk = sizeof chunk / bytes_per;
    for (int64_t i = 0; i < n && st == CM_OK;) {
        size_t m = (size_t)(n - i) < per_chunk ? (size_t)(n - i) : per_chunk;
        for (size_t k = 0; k < m; k++) {
            uint32_t v = (uint32_t)ids[i + (int64_t)k];
            if (bytes_per == 2) chunk[2 * k] = (uint8_t)v, chunk[2 * k + 1] = (uint8_t)(v >> 8);
            else put_le32(chunk + 4 * k, v);
        }
        st = cm_atomic_write_(&af, chunk, m * bytes_per);
        i += (int64_t)m;
    }
    if (st == CM_OK) st = cm_atomic_commit_(&af);
    return st;
}
