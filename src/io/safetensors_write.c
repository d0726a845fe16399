/* The safetensors writer: reproduces the reference writer byte for byte (FORMATS.md §4.3) and
 * writes files atomically (temporary file, fsync, rename, fsync of the folder). */
#define _GNU_SOURCE /* qsort_r */
#include "io/safetensors_impl.h"
#include "tensor/backend.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct wentry {
    char *name;
    cm_st_dtype dt;
    int ndim;
    int64_t *shape; /* NULL for a scalar */
    const void *data;
    size_t nbytes;
} wentry;

struct cm_safetensors_writer {
    cm_st_buf ents;   /* wentry */
    cm_st_buf meta;   /* char * pairs: key, value */
    cm_st_buf copies; /* void *: host copies of tensors added from a GPU (cm_alloc) */
};

static size_t n_ents(const cm_safetensors_writer *w) { return w->ents.len / sizeof(wentry); }
static size_t n_meta(const cm_safetensors_writer *w) { return w->meta.len / (2 * sizeof(char *)); }

cm_status cm_safetensors_writer_new(cm_safetensors_writer **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_safetensors_writer_new: out is NULL");
    *out = cm_alloc_zeroed(sizeof **out, 16);
    return *out ? CM_OK : CM_ERR_OOM;
}

void cm_safetensors_writer_free(cm_safetensors_writer *w) {
    if (!w) return;
    wentry *e = (wentry *)w->ents.p;
    for (size_t i = 0; i < n_ents(w); i++) {
        cm_free(e[i].name);
        cm_free(e[i].shape);
    }
    char **m = (char **)w->meta.p;
    for (size_t i = 0; i < 2 * n_meta(w); i++) cm_free(m[i]);
    void **c = (void **)w->copies.p;
    for (size_t i = 0; i < w->copies.len / sizeof *c; i++) cm_free(c[i]);
    cm_st_buf_free(&w->copies);
    cm_st_buf_free(&w->ents);
    cm_st_buf_free(&w->meta);
    cm_free(w);
}

static cm_status check_text(const char *what, const char *s) {
    size_t bad;
    if (!s) return cm_set_error(CM_ERR_INVALID_ARG, "safetensors writer: %s is NULL", what);
    if (!cm_st_utf8_valid((const unsigned char *)s, strlen(s), &bad))
        return cm_set_error(CM_ERR_INVALID_ARG, "safetensors writer: %s '%.160s' is not valid UTF-8 (byte %zu)", what,
                            s, bad);
    return CM_OK;
}

cm_status cm_safetensors_writer_add_metadata(cm_safetensors_writer *w, const char *key, const char *value) {
    cm_status s;
    if ((s = check_text("metadata key", key)) != CM_OK || (s = check_text("metadata value", value)) != CM_OK)
        return s;
    char **m = (char **)w->meta.p;
    for (size_t i = 0; i < n_meta(w); i++)
        if (strcmp(m[2 * i], key) == 0)
            return cm_set_error(CM_ERR_INVALID_ARG, "safetensors writer: metadata key '%.160s' added twice", key);
    char *pair[2] = {cm_st_strdup(key), cm_st_strdup(value)};
    if (!pair[0] || !pair[1] || cm_st_buf_put(&w->meta, pair, sizeof pair) != CM_OK) {
        cm_free(pair[0]);
        cm_free(pair[1]);
        return cm_set_error(CM_ERR_OOM, "safetensors writer: out of memory adding metadata '%.160s'", key);
    }
    return CM_OK;
}

cm_status cm_safetensors_writer_add_raw(cm_safetensors_writer *w, const char *name, cm_st_dtype dt, int ndim,
                                        const int64_t *shape, const void *data, size_t nbytes) {
    cm_status s;
    if ((s = check_text("tensor name", name)) != CM_OK) return s;
    if (strcmp(name, "__metadata__") == 0)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "safetensors writer: '__metadata__' is reserved for the metadata map, not a tensor name");
    if ((unsigned)dt >= CM_ST_DTYPE_COUNT)
        return cm_set_error(CM_ERR_INVALID_ARG, "safetensors writer: tensor '%.160s': dtype %d is not a cm_st_dtype",
                            name, (int)dt);
    if (ndim < 0 || (ndim > 0 && !shape))
        return cm_set_error(CM_ERR_INVALID_ARG, "safetensors writer: tensor '%.160s': bad ndim %d or NULL shape", name,
                            ndim);
    uint64_t numel = 1, need;
    bool ok = true;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0)
            return cm_set_error(CM_ERR_INVALID_ARG, "safetensors writer: tensor '%.160s': dim %d is %lld (must be >= 0)",
                                name, d, (long long)shape[d]);
        ok = ok && !__builtin_mul_overflow(numel, (uint64_t)shape[d], &numel);
    }
    const char *why = "overflow";
    if (!ok || !cm_st_nbytes(dt, numel, &need, &why))
        return cm_set_error(CM_ERR_INVALID_ARG, "safetensors writer: tensor '%.160s': %s", name,
                            strcmp(why, "bits") == 0 ? "the bit count is not a multiple of 8 (packed sub-byte dtype)"
                                                     : "the byte size overflows 64 bits");
    if (need != nbytes)
        return cm_set_error(CM_ERR_INVALID_ARG, "safetensors writer: tensor '%.160s': %zu bytes given but %s needs %llu",
                            name, nbytes, cm_st_dtype_name(dt), (unsigned long long)need);
    if (nbytes && !data)
        return cm_set_error(CM_ERR_INVALID_ARG, "safetensors writer: tensor '%.160s': data is NULL", name);
    wentry e = {.dt = dt, .ndim = ndim, .data = data, .nbytes = nbytes};
    e.name = cm_st_strdup(name);
    if (ndim) {
        e.shape = cm_alloc((size_t)ndim * sizeof *e.shape, 16);
        if (e.shape) memcpy(e.shape, shape, (size_t)ndim * sizeof *e.shape);
    }
    if (!e.name || (ndim && !e.shape) || cm_st_buf_put(&w->ents, &e, sizeof e) != CM_OK) {
        cm_free(e.name);
        cm_free(e.shape);
        return cm_set_error(CM_ERR_OOM, "safetensors writer: out of memory adding tensor '%.160s'", name);
    }
    return CM_OK;
}

cm_status cm_safetensors_writer_add(cm_safetensors_writer *w, const char *name, const cm_tensor *t) {
    if (!t) return cm_set_error(CM_ERR_INVALID_ARG, "safetensors writer: tensor '%.160s' is NULL", name ? name : "");
    if (!cm_tensor_is_contiguous(t))
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "safetensors writer: tensor '%.160s' is not contiguous (pass cm_contiguous(tape, t))",
                            name ? name : "");
    const void *data = cm_tensor_data(t);
    const size_t nbytes = cm_tensor_nbytes(t);
    if (w && nbytes && cm_tensor_device(t) != CM_DEVICE_CPU) { /* the file is written from host memory */
        const cmi_backend *be = cmi_backend_get(cm_tensor_device(t));
        void *h = cm_alloc(nbytes, 64);
        cm_status s = !be ? cm_last_status() : !h ? CM_ERR_OOM : be->memcpy(h, data, nbytes, CMI_D2H);
        if (s == CM_OK && (s = cm_st_buf_put(&w->copies, &h, sizeof h)) != CM_OK) s = CM_ERR_OOM;
        if (s) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            cm_free(h);
            return cm_set_error(s, "safetensors writer: tensor '%.160s': copying it from %s: %s", name ? name : "",
                                cm_device_name(cm_tensor_device(t)), s == CM_ERR_OOM ? "out of memory" : msg);
        }
        data = h;
    }
    return cm_safetensors_writer_add_raw(w, name, cm_st_dtype_from_cm(cm_tensor_dtype(t)), cm_tensor_ndim(t),
                                         cm_tensor_shape(t), data, nbytes);
}

/* ---------------------------------------------------------------------------------------------
 * Serialization
 * ------------------------------------------------------------------------------------------- */

static int cmp_write_order(const void *a, const void *b, void *ctx) {
    const wentry *e = ctx, *x = &e[*(const size_t *)a], *y = &e[*(const size_t *)b];
    if (x->dt != y->dt) return x->dt > y->dt ? -1 : 1; /* dtype descending */
    return strcmp(x->name, y->name);                   /* then name, byte order */
}

static int cmp_name(const void *a, const void *b, void *ctx) {
    const wentry *e = ctx;
    return strcmp(e[*(const size_t *)a].name, e[*(const size_t *)b].name);
}

/* A JSON string as serde_json writes it: only '"', '\\' and control characters escaped. */
static cm_status put_json_string(cm_st_buf *b, const char *s) {
    static const char hex[] = "0123456789abcdef";
    cm_status st = cm_st_buf_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; st == CM_OK && *p; p++) {
        char esc[6];
        size_t k = 2;
        esc[0] = '\\';
        switch (*p) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        default:
            if (*p < 0x20) {
                memcpy(esc + 1, "u00", 3);
                esc[4] = hex[*p >> 4];
                esc[5] = hex[*p & 15];
                k = 6;
            } else {
                esc[0] = (char)*p;
                k = 1;
            }
        }
        st = cm_st_buf_put(b, esc, k);
    }
    return st == CM_OK ? cm_st_buf_put(b, "\"", 1) : st;
}

static cm_status put_u64(cm_st_buf *b, uint64_t v) {
    char tmp[24];
    int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    return cm_st_buf_put(b, tmp, (size_t)n);
}

/* Builds the padded header (without the 8-byte length) into *hdr and the write order into *order
 * (n_ents entries, cm_alloc'd). On failure nothing is left allocated. */
static cm_status build_header(const cm_safetensors_writer *w, cm_st_buf *hdr, size_t **order_out) {
    size_t n = n_ents(w), nm = n_meta(w);
    const wentry *e = (const wentry *)w->ents.p;
    size_t *order = cm_alloc((n ? n : 1) * sizeof *order, 16);
    if (!order) return CM_ERR_OOM;
    for (size_t i = 0; i < n; i++) order[i] = i;
    qsort_r(order, n, sizeof *order, cmp_name, (void *)e);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(e[order[i]].name, e[order[i - 1]].name) == 0) {
            cm_status s = cm_set_error(CM_ERR_INVALID_ARG, "safetensors writer: tensor name '%.160s' was added twice",
                                       e[order[i]].name);
            cm_free(order);
            return s;
        }
    }
    qsort_r(order, n, sizeof *order, cmp_write_order, (void *)e);

    cm_status s = cm_st_buf_put(hdr, "{", 1);
    char *const *m = (char *const *)w->meta.p;
    if (s == CM_OK && nm) {
        s = cm_st_buf_put(hdr, "\"__metadata__\":{", 16);
        for (size_t i = 0; s == CM_OK && i < nm; i++) {
            if (i) s = cm_st_buf_put(hdr, ",", 1);
            if (s == CM_OK) s = put_json_string(hdr, m[2 * i]);
            if (s == CM_OK) s = cm_st_buf_put(hdr, ":", 1);
            if (s == CM_OK) s = put_json_string(hdr, m[2 * i + 1]);
        }
        if (s == CM_OK) s = cm_st_buf_put(hdr, "}", 1);
    }
    uint64_t off = 0;
    for (size_t i = 0; s == CM_OK && i < n; i++) {
        const wentry *x = &e[order[i]];
        if (i || nm) s = cm_st_buf_put(hdr, ",", 1);
        if (s == CM_OK) s = put_json_string(hdr, x->name);
        if (s == CM_OK) s = cm_st_buf_put(hdr, ":{\"dtype\":\"", 11);
        if (s == CM_OK) s = cm_st_buf_put(hdr, cm_st_dtype_name(x->dt), strlen(cm_st_dtype_name(x->dt)));
        if (s == CM_OK) s = cm_st_buf_put(hdr, "\",\"shape\":[", 11);
        for (int d = 0; s == CM_OK && d < x->ndim; d++) {
            if (d) s = cm_st_buf_put(hdr, ",", 1);
            if (s == CM_OK) s = put_u64(hdr, (uint64_t)x->shape[d]);
        }
        if (s == CM_OK) s = cm_st_buf_put(hdr, "],\"data_offsets\":[", 18);
        if (s == CM_OK) s = put_u64(hdr, off);
        if (s == CM_OK) s = cm_st_buf_put(hdr, ",", 1);
        off += x->nbytes;
        if (s == CM_OK) s = put_u64(hdr, off);
        if (s == CM_OK) s = cm_st_buf_put(hdr, "]}", 2);
    }
    if (s == CM_OK) s = cm_st_buf_put(hdr, "}", 1);
    static const char spaces[8] = "        ";
    if (s == CM_OK) s = cm_st_buf_put(hdr, spaces, (8 - hdr->len % 8) % 8);
    if (s != CM_OK) {
        cm_free(order);
        cm_st_buf_free(hdr);
        return cm_set_error(CM_ERR_OOM, "safetensors writer: out of memory building the header");
    }
    *order_out = order;
    return CM_OK;
}

size_t cm_safetensors_writer_size(const cm_safetensors_writer *w) {
    cm_st_buf hdr = {0};
    size_t *order = NULL, total = 0;
    if (build_header(w, &hdr, &order) == CM_OK) {
        total = 8 + hdr.len;
        const wentry *e = (const wentry *)w->ents.p;
        for (size_t i = 0; i < n_ents(w); i++) total += e[i].nbytes;
    }
    cm_free(order);
    cm_st_buf_free(&hdr);
    return total;
}

cm_status cm_safetensors_writer_serialize(const cm_safetensors_writer *w, void **out, size_t *len) {
    if (!w || !out || !len) return cm_set_error(CM_ERR_INVALID_ARG, "cm_safetensors_writer_serialize: NULL argument");
    *out = NULL;
    *len = 0;
    cm_st_buf hdr = {0}, file = {0};
    size_t *order = NULL;
    cm_status s = build_header(w, &hdr, &order);
    const wentry *e = (const wentry *)w->ents.p;
    size_t total = 8 + hdr.len;
    for (size_t i = 0; s == CM_OK && i < n_ents(w); i++) total += e[i].nbytes;
    if (s == CM_OK) s = cm_st_buf_reserve(&file, total);
    if (s == CM_OK) {
        uint64_t n = hdr.len;
        cm_st_buf_put(&file, &n, 8); /* little-endian host */
        cm_st_buf_put(&file, hdr.p, hdr.len);
        for (size_t i = 0; i < n_ents(w); i++) cm_st_buf_put(&file, e[order[i]].data, e[order[i]].nbytes);
        *out = file.p;
        *len = file.len;
        file.p = NULL;
    }
    cm_free(order);
    cm_st_buf_free(&hdr);
    cm_st_buf_free(&file);
    return s;
}

/* ---------------------------------------------------------------------------------------------
 * Atomic file write
 * ------------------------------------------------------------------------------------------- */

static bool write_all(int fd, const void *data, size_t n, size_t *done) {
    const unsigned char *p = data;
    while (n) {
        ssize_t k = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (k < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        if (k == 0) {
            errno = ENOSPC;
            return false;
        }
        p += k;
        n -= (size_t)k;
        *done += (size_t)k;
    }
    return true;
}

cm_status cm_safetensors_writer_write(const cm_safetensors_writer *w, const char *path) {
    if (!w || !path) return cm_set_error(CM_ERR_INVALID_ARG, "cm_safetensors_writer_write: NULL argument");
    cm_st_buf hdr = {0};
    size_t *order = NULL;
    cm_status s = build_header(w, &hdr, &order);
    if (s != CM_OK) return s;
    const wentry *e = (const wentry *)w->ents.p;
    size_t total = 8 + hdr.len;
    for (size_t i = 0; i < n_ents(w); i++) total += e[i].nbytes;

    /* The temporary file sits next to the target so the rename stays within one file system. */
    static unsigned counter;
    size_t plen = strlen(path);
    char *tmp = cm_alloc(plen + 64, 16);
    int fd = -1;
    if (!tmp) {
        s = CM_ERR_OOM;
        goto out;
    }
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        snprintf(tmp, plen + 64, "%s.tmp-%ld-%u", path, (long)getpid(), __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        s = cm_set_error(CM_ERR_IO,
                         "safetensors: cannot write '%s': creating the temporary file '%s' failed: %s (does the folder "
                         "exist, and is it writable?)",
                         path, tmp, strerror(errno));
        goto out;
    }
    size_t done = 0;
    uint64_t n = hdr.len;
    bool ok = write_all(fd, &n, 8, &done) && write_all(fd, hdr.p, hdr.len, &done);
    for (size_t i = 0; ok && i < n_ents(w); i++) ok = write_all(fd, e[order[i]].data, e[order[i]].nbytes, &done);
    const char *step = "writing";
    if (ok && !(ok = fsync(fd) == 0)) step = "fsync of";
    int err = errno;
    if (close(fd) != 0 && ok) {
        ok = false;
        err = errno;
        step = "closing";
    }
    if (!ok) {
        unlink(tmp);
        s = cm_set_error(CM_ERR_IO, "safetensors: %s '%s' failed after %zu of %zu bytes: %s%s; nothing was written", step,
                         path, done, total, strerror(err),
                         err == ENOSPC || err == EDQUOT || err == EFBIG ? " (the disk or quota is full)" : "");
        goto out;
    }
    if (rename(tmp, path) != 0) {
        err = errno;
        unlink(tmp);
        s = cm_set_error(CM_ERR_IO, "safetensors: cannot write '%s': renaming '%s' onto it failed: %s", path, tmp,
                         strerror(err));
        goto out;
    }
    /* Make the rename durable: fsync the folder. */
    const char *slash = strrchr(path, '/');
    if (slash) {
        size_t dl = slash == path ? 1 : (size_t)(slash - path);
        memcpy(tmp, path, dl);
        tmp[dl] = 0;
    } else {
        strcpy(tmp, ".");
    }
    int dfd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        if (fsync(dfd) != 0 && errno != EINVAL && errno != EROFS) {
            err = errno;
            s = cm_set_error(CM_ERR_IO, "safetensors: '%s' was written but fsync of its folder '%s' failed: %s", path,
                             tmp, strerror(err));
        }
        close(dfd);
    }
out:
    cm_free(tmp);
    cm_free(order);
    cm_st_buf_free(&hdr);
    return s;
}
