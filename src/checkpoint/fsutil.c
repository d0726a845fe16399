/* File-system helpers for checkpoints: durable writes (fsync of files and folders), whole-file
 * reads, mkdir -p and removal of a checkpoint directory. */
#define _GNU_SOURCE
#include "checkpoint/ckpt_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

char *cmi_path_join(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    char *p = cm_alloc(na + nb + 2, 1);
    if (!p) return NULL;
    memcpy(p, a, na);
    size_t k = na;
    if (na && a[na - 1] != '/') p[k++] = '/';
    memcpy(p + k, b, nb + 1);
    return p;
}

cm_status cmi_write_file_sync(const char *path, const void *data, size_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return cm_set_error(CM_ERR_IO, "cannot create '%s': %s", path, strerror(errno));
    const char *p = data;
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, p + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : ENOSPC;
            close(fd);
            return cm_set_error(CM_ERR_IO, "writing '%s' failed after %zu of %zu bytes: %s", path, done, n, strerror(e));
        }
        done += (size_t)w;
    }
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        return cm_set_error(CM_ERR_IO, "fsync of '%s' failed: %s", path, strerror(e));
    }
    if (close(fd) != 0) return cm_set_error(CM_ERR_IO, "closing '%s' failed: %s", path, strerror(errno));
    return CM_OK;
}

cm_status cmi_fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return cm_set_error(CM_ERR_IO, "cannot open folder '%s' to fsync it: %s", path, strerror(errno));
    cm_status s = CM_OK;
    if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS)
        s = cm_set_error(CM_ERR_IO, "fsync of folder '%s' failed: %s", path, strerror(errno));
    close(fd);
    return s;
}

static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 0;
    char *d = cm_alloc(n + 2, 1);
    if (!d) return NULL;
    if (!slash) {
        strcpy(d, ".");
    } else if (n == 0) {
        strcpy(d, "/");
    } else {
        memcpy(d, path, n);
        d[n] = 0;
    }
    return d;
}

cm_status cmi_write_file_atomic(const char *path, const void *data, size_t n) {
    size_t len = strlen(path) + 32;
    char *tmp = cm_alloc(len, 1);
    char *dir = dir_of(path);
    if (!tmp || !dir) {
        cm_free(tmp);
        cm_free(dir);
        return cm_set_error(CM_ERR_OOM, "writing '%s': out of memory", path);
    }
    snprintf(tmp, len, "%s.tmp-%ld", path, (long)getpid());
    cm_status s = cmi_write_file_sync(tmp, data, n);
    if (!s && rename(tmp, path) != 0) s = cm_set_error(CM_ERR_IO, "renaming '%s' to '%s' failed: %s", tmp, path, strerror(errno));
    if (s) unlink(tmp);
    if (!s) s = cmi_fsync_dir(dir);
    cm_free(tmp);
    cm_free(dir);
    return s;
}

cm_status cmi_read_file(const char *path, size_t max, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return cm_set_error(CM_ERR_NOT_FOUND, "'%s' does not exist", path);
        return cm_set_error(CM_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return cm_set_error(CM_ERR_IO, "'%s' is not a regular file", path);
    }
    if ((uint64_t)sb.st_size > max) {
        close(fd);
        return cm_set_error(CM_ERR_FORMAT, "'%s' has %lld bytes, more than the %zu allowed", path, (long long)sb.st_size,
                            max);
    }
    size_t n = (size_t)sb.st_size;
    char *buf = cm_alloc(n + 1, 1);
    if (!buf) {
        close(fd);
        return cm_set_error(CM_ERR_OOM, "reading '%s': out of memory", path);
    }
    size_t done = 0;
    while (done < n) {
        ssize_t r = read(fd, buf + done, n - done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        done += (size_t)r;
    }
    close(fd);
    if (done != n) {
        cm_free(buf);
        return cm_set_error(CM_ERR_IO, "reading '%s' failed after %zu of %zu bytes", path, done, n);
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return CM_OK;
}

bool cmi_remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (!d) return unlink(path) == 0 || errno == ENOENT;
    bool ok = true;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *p = cmi_path_join(path, e->d_name);
        if (!p) {
            ok = false;
            break;
        }
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
            ok &= cmi_remove_tree(p);
        else if (unlink(p) != 0 && errno != ENOENT)
            ok = false;
        cm_free(p);
    }
    closedir(d);
    if (rmdir(path) != 0 && errno != ENOENT) ok = false;
    return ok;
}

bool cmi_is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

cm_status cmi_mkdirs(const char *path) {
    size_t n = strlen(path);
    char *p = cm_alloc(n + 1, 1);
    if (!p) return cm_set_error(CM_ERR_OOM, "mkdir '%s': out of memory", path);
    memcpy(p, path, n + 1);
    cm_status s = CM_OK;
    for (size_t i = 1; i <= n && !s; i++) {
        if (p[i] != '/' && p[i] != 0) continue;
        char c = p[i];
        p[i] = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            s = cm_set_error(CM_ERR_IO, "cannot create folder '%s': %s", p, strerror(errno));
        else if (!cmi_is_dir(p))
            s = cm_set_error(CM_ERR_IO, "cannot create folder '%s': a file is in the way", p);
        p[i] = c;
    }
    cm_free(p);
    return s;
}
