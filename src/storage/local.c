/* The local-folder backend: objects are files under the store's folder; writes go to a hidden
 * temporary file, fsync, rename, so a reader never sees a partial object. */
#define _GNU_SOURCE
#include "storage/storage_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct local_store {
    char *dir; /* without a trailing '/' ("/" stays "/") */
} local_store;

static atomic_int g_tmp_ctr;

static char *join(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    char *p = cm_alloc(na + nb + 2, 1);
    if (!p) return NULL;
    memcpy(p, a, na);
    size_t k = na;
    if (na && a[na - 1] != '/' && nb) p[k++] = '/';
    memcpy(p + k, b, nb + 1);
    return p;
}

/* mkdir -p of the folder holding `path`. */
static cm_status mkdirs_parent(const char *path, const char *uri) {
    char *d = cm_alloc(strlen(path) + 1, 1);
    if (!d) return CM_ERR_OOM;
    strcpy(d, path);
    char *slash = strrchr(d, '/');
    if (!slash || slash == d) {
        cm_free(d);
        return CM_OK;
    }
    *slash = 0;
    for (char *p = d + 1;; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (mkdir(d, 0755) != 0 && errno != EEXIST) {
                cm_status s = cm_set_error(CM_ERR_IO, "'%s': cannot create the folder '%s': %s", uri, d, strerror(errno));
                cm_free(d);
                return s;
            }
            *p = c;
            if (!c) break;
        }
    }
    struct stat sb;
    cm_status s = stat(d, &sb) == 0 && S_ISDIR(sb.st_mode)
                      ? CM_OK
                      : cm_set_error(CM_ERR_IO, "'%s': '%s' is not a folder", uri, d);
    cm_free(d);
    return s;
}

/* "<dir>/.<base>.part-<pid>-<n>" beside `path`. */
static char *tmp_beside(const char *path) {
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path + 1) : 0;
    size_t n = strlen(path) + 48;
    char *t = cm_alloc(n, 1);
    if (!t) return NULL;
    snprintf(t, n, "%.*s.%s.part-%ld-%d", (int)dl, path, path + dl, (long)getpid(), atomic_fetch_add(&g_tmp_ctr, 1));
    return t;
}

static cm_status write_all(int fd, const void *data, size_t n, const char *what) {
    const char *p = data;
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, p + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return cm_set_error(CM_ERR_IO, "writing '%s' failed after %zu of %zu bytes: %s", what, done, n,
                                strerror(w < 0 ? errno : ENOSPC));
        done += (size_t)w;
    }
    return CM_OK;
}

/* Writes dst atomically from either a buffer (src_fd < 0) or a file descriptor. */
static cm_status write_atomic(const char *dst, const char *uri, const void *data, size_t n, int src_fd,
                              atomic_llong *counter) {
    cm_status s = mkdirs_parent(dst, uri);
    if (s) return s == CM_ERR_OOM ? cm_set_error(s, "object store: out of memory") : s;
    char *tmp = tmp_beside(dst);
    if (!tmp) return cm_set_error(CM_ERR_OOM, "object store: out of memory");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        s = cm_set_error(CM_ERR_IO, "'%s': cannot create '%s': %s", uri, tmp, strerror(errno));
        cm_free(tmp);
        return s;
    }
    if (src_fd < 0) {
        s = write_all(fd, data, n, tmp);
        if (!s) atomic_fetch_add(counter, (long long)n);
    } else {
        char *buf = cm_alloc(1 << 20, 64);
        if (!buf) s = cm_set_error(CM_ERR_OOM, "object store: out of memory");
        while (!s) {
            ssize_t r = read(src_fd, buf, 1 << 20);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) {
                s = cm_set_error(CM_ERR_IO, "'%s': reading the source failed: %s", uri, strerror(errno));
                break;
            }
            if (r == 0) break;
            s = write_all(fd, buf, (size_t)r, tmp);
            if (!s) atomic_fetch_add(counter, (long long)r);
        }
        cm_free(buf);
    }
    if (!s && fsync(fd) != 0) s = cm_set_error(CM_ERR_IO, "'%s': fsync of '%s' failed: %s", uri, tmp, strerror(errno));
    if (close(fd) != 0 && !s) s = cm_set_error(CM_ERR_IO, "'%s': closing '%s' failed: %s", uri, tmp, strerror(errno));
    if (!s && rename(tmp, dst) != 0)
        s = cm_set_error(CM_ERR_IO, "'%s': cannot rename '%s' to '%s': %s", uri, tmp, dst, strerror(errno));
    if (s) unlink(tmp);
    cm_free(tmp);
    return s;
}

static cm_status open_src(const char *path, const char *what, int *fd) {
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd >= 0) {
        struct stat sb;
        if (fstat(*fd, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            close(*fd);
            *fd = -1;
            return cm_set_error(CM_ERR_IO, "'%s' is a folder, not an object", what);
        }
        return CM_OK;
    }
    if (errno == ENOENT) return cm_set_error(CM_ERR_NOT_FOUND, "'%s' does not exist", what);
    return cm_set_error(CM_ERR_IO, "cannot open '%s': %s", what, strerror(errno));
}

static cm_status l_upload(cm_object_store *st, const char *key, const char *uri, const char *local_path) {
    local_store *ls = st->impl;
    char *dst = join(ls->dir, key);
    if (!dst) return cm_set_error(CM_ERR_OOM, "object store: out of memory");
    char *rs = realpath(local_path, NULL), *rd = realpath(dst, NULL);
    bool same = rs && rd && !strcmp(rs, rd);
    free(rs), free(rd);
    cm_status s = CM_OK;
    if (!same) {
        int fd;
        s = open_src(local_path, local_path, &fd);
        if (!s) {
            s = write_atomic(dst, uri, NULL, 0, fd, &st->n_up);
            close(fd);
        }
    }
    atomic_fetch_add(&st->n_requests, 1);
    cm_free(dst);
    return s;
}

static cm_status l_put(cm_object_store *st, const char *key, const char *uri, const void *data, size_t n) {
    local_store *ls = st->impl;
    char *dst = join(ls->dir, key);
    if (!dst) return cm_set_error(CM_ERR_OOM, "object store: out of memory");
    cm_status s = write_atomic(dst, uri, data, n, -1, &st->n_up);
    atomic_fetch_add(&st->n_requests, 1);
    cm_free(dst);
    return s;
}

static cm_status l_download(cm_object_store *st, const char *key, const char *uri, const char *local_path) {
    local_store *ls = st->impl;
    char *src = join(ls->dir, key);
    if (!src) return cm_set_error(CM_ERR_OOM, "object store: out of memory");
    int fd;
    cm_status s = open_src(src, uri, &fd);
    if (!s) {
        s = write_atomic(local_path, uri, NULL, 0, fd, &st->n_down);
        close(fd);
    }
    atomic_fetch_add(&st->n_requests, 1);
    cm_free(src);
    return s;
}

static cm_status l_get(cm_object_store *st, const char *key, const char *uri, size_t max, char **out, size_t *len) {
    local_store *ls = st->impl;
    char *src = join(ls->dir, key);
    if (!src) return cm_set_error(CM_ERR_OOM, "object store: out of memory");
    int fd;
    cm_status s = open_src(src, uri, &fd);
    cm_free(src);
    atomic_fetch_add(&st->n_requests, 1);
    if (s) return s;
    struct stat sb;
    if (fstat(fd, &sb) != 0) s = cm_set_error(CM_ERR_IO, "'%s': stat failed: %s", uri, strerror(errno));
    else if ((uint64_t)sb.st_size > max)
        s = cm_set_error(CM_ERR_FORMAT, "'%s' has %lld bytes, more than the %zu expected", uri, (long long)sb.st_size, max);
    char *buf = s ? NULL : cm_alloc((size_t)sb.st_size + 1, 1);
    if (!s && !buf) s = cm_set_error(CM_ERR_OOM, "object store: out of memory");
    size_t got = 0;
    while (!s && got < (size_t)sb.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) s = cm_set_error(CM_ERR_IO, "'%s': read failed: %s", uri, r < 0 ? strerror(errno) : "short file");
        else got += (size_t)r;
    }
    close(fd);
    if (s) {
        cm_free(buf);
        return s;
    }
    buf[got] = 0;
    atomic_fetch_add(&st->n_down, (long long)got);
    *out = buf;
    *len = got;
    return CM_OK;
}

static cm_status l_get_size(cm_object_store *st, const char *key, const char *uri, uint64_t *size) {
    local_store *ls = st->impl;
    char *p = join(ls->dir, key);
    if (!p) return cm_set_error(CM_ERR_OOM, "object store: out of memory");
    struct stat sb;
    int rc = stat(p, &sb), e = errno;
    cm_free(p);
    atomic_fetch_add(&st->n_requests, 1);
    if (rc != 0)
        return e == ENOENT || e == ENOTDIR ? cm_set_error(CM_ERR_NOT_FOUND, "'%s' does not exist", uri)
                                           : cm_set_error(CM_ERR_IO, "'%s': stat failed: %s", uri, strerror(e));
    if (!S_ISREG(sb.st_mode)) return cm_set_error(CM_ERR_NOT_FOUND, "'%s' is not an object (a folder?)", uri);
    *size = (uint64_t)sb.st_size;
    return CM_OK;
}

static bool is_tmp_name(const char *name) { return name[0] == '.' && strstr(name, ".part-") != NULL; }

/* Walks dir/rel recursively, adding regular files whose key starts with prefix. */
static cm_status walk(const char *root, const char *rel, const char *prefix, const char *uri, cm_object_list *out) {
    char *path = rel[0] ? join(root, rel) : join(root, "");
    if (!path) return cm_set_error(CM_ERR_OOM, "object listing: out of memory");
    DIR *d = opendir(path);
    if (!d) {
        int e = errno;
        cm_free(path);
        if (e == ENOENT || e == ENOTDIR) return CM_OK;
        return cm_set_error(CM_ERR_IO, "listing '%s': cannot open '%s': %s", uri, rel[0] ? rel : root, strerror(e));
    }
    cm_status s = CM_OK;
    struct dirent *e;
    while (!s && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || is_tmp_name(e->d_name)) continue;
        char *k = rel[0] ? join(rel, e->d_name) : join("", e->d_name);
        char *full = k ? join(root, k) : NULL;
        struct stat sb;
        if (!k || !full) {
            s = cm_set_error(CM_ERR_OOM, "object listing: out of memory");
        } else if (stat(full, &sb) == 0) {
            size_t kl = strlen(k), pl = strlen(prefix);
            if (S_ISDIR(sb.st_mode)) {
                /* descend only where keys below can still match the prefix */
                if (strncmp(k, prefix, kl < pl ? kl : pl) == 0) s = walk(root, k, prefix, uri, out);
            } else if (S_ISREG(sb.st_mode) && strncmp(k, prefix, pl) == 0) {
                s = cmi_object_list_add(out, k, (uint64_t)sb.st_size);
            }
        }
        cm_free(k);
        cm_free(full);
    }
    closedir(d);
    cm_free(path);
    return s;
}

static cm_status l_list(cm_object_store *st, const char *prefix, const char *uri, cm_object_list *out) {
    local_store *ls = st->impl;
    atomic_fetch_add(&st->n_requests, 1);
    return walk(ls->dir, "", prefix, uri, out);
}

static cm_status l_del(cm_object_store *st, const char *key, const char *uri) {
    local_store *ls = st->impl;
    char *p = join(ls->dir, key);
    if (!p) return cm_set_error(CM_ERR_OOM, "object store: out of memory");
    int rc = unlink(p), e = errno;
    cm_free(p);
    atomic_fetch_add(&st->n_requests, 1);
    if (rc != 0 && e != ENOENT && e != ENOTDIR) return cm_set_error(CM_ERR_IO, "deleting '%s' failed: %s", uri, strerror(e));
    return CM_OK;
}

static void l_close(cm_object_store *st) {
    local_store *ls = st->impl;
    if (!ls) return;
    cm_free(ls->dir);
    cm_free(ls);
    st->impl = NULL;
}

static const cmi_store_i k_local = {
    /* .name = */ "local",
    /* .upload = */ l_upload,
    /* .put = */ l_put,
    /* .download = */ l_download,
    /* .get = */ l_get,
    /* .get_size = */ l_get_size,
    /* .list = */ l_list,
    /* .del = */ l_del,
    /* .close = */ l_close,
};

cm_status cmi_local_open(cm_object_store *st, const char *dir) {
    local_store *ls = cm_alloc_zeroed(sizeof *ls, 16);
    if (!ls) return CM_ERR_OOM;
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    ls->dir = cm_alloc(n + 1, 1);
    if (!ls->dir) {
        cm_free(ls);
        return CM_ERR_OOM;
    }
    memcpy(ls->dir, dir, n);
    ls->dir[n] = 0;
    st->impl = ls;
    st->vt = &k_local;
    return CM_OK;
}
