/* cm_object_store: URI parsing, options, the key prefix, and the calls that dispatch to a backend
 * (local.c, s3.c). */
#define _GNU_SOURCE
#include "storage/storage_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

cm_object_store_config cm_object_store_config_default(void) {
    cm_object_store_config c;
    memset(&c, 0, sizeof c);
    c.multipart_threshold = (size_t)64 << 20;
    c.part_size = (size_t)16 << 20;
    c.max_concurrency = 4;
    c.max_retries = 5;
    c.retry_backoff_s = 0.5;
    c.timeout_s = 60;
    c.connect_timeout_s = 10;
    c.addressing = CM_S3_ADDRESSING_AUTO;
    /* operators (and tests) tune the retry policy of every store without code */
    const char *v;
    if ((v = getenv("CM_STORAGE_MAX_RETRIES")) && *v) c.max_retries = atoi(v);
    if ((v = getenv("CM_STORAGE_RETRY_BACKOFF_S")) && *v) c.retry_backoff_s = atof(v);
    if ((v = getenv("CM_STORAGE_TIMEOUT_S")) && *v) c.timeout_s = atof(v);
    return c;
}

static const char *const k_schemes[] = {"s3", "gs", "oci", "file"};

bool cm_storage_is_uri(const char *path) {
    if (!path) return false;
    const char *p = strstr(path, "://");
    if (!p || p == path) return false;
    for (const char *q = path; q < p; q++)
        if (!((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') || *q == '+' ||
              *q == '-' || *q == '.'))
            return false;
    return true;
}

bool cm_storage_is_remote(const char *path) { return cm_storage_is_uri(path) && strncmp(path, "file://", 7) != 0; }

static char *dup_str(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s);
    char *p = cm_alloc(n + 1, 1);
    if (p) memcpy(p, s, n + 1);
    return p;
}

void cm_object_store_close(cm_object_store *st) {
    if (!st) return;
    if (st->vt && st->vt->close) st->vt->close(st);
    cm_free(st->uri);
    cm_free(st->prefix);
    cm_free((char *)st->cfg.endpoint_url);
    cm_free((char *)st->cfg.region);
    cm_free((char *)st->cfg.access_key_id);
    cm_free((char *)st->cfg.secret_access_key);
    cm_free((char *)st->cfg.session_token);
    cm_free(st);
}

cm_status cm_object_store_open(const char *uri, const cm_object_store_config *cfg, cm_object_store **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_object_store_open: out is NULL");
    *out = NULL;
    if (!uri || !uri[0]) return cm_set_error(CM_ERR_INVALID_ARG, "cm_object_store_open: empty URI");
    cm_object_store *st = cm_alloc_zeroed(sizeof *st, 64);
    if (!st) return CM_ERR_OOM;
    st->cfg = cfg ? *cfg : cm_object_store_config_default();
    const cm_object_store_config d = cm_object_store_config_default();
    if (!st->cfg.multipart_threshold) st->cfg.multipart_threshold = d.multipart_threshold;
    if (!st->cfg.part_size) st->cfg.part_size = d.part_size;
    if (st->cfg.max_concurrency < 1) st->cfg.max_concurrency = 1;
    if (st->cfg.max_retries < 0) st->cfg.max_retries = 0;
    if (!(st->cfg.timeout_s > 0)) st->cfg.timeout_s = d.timeout_s;
    if (!(st->cfg.connect_timeout_s > 0)) st->cfg.connect_timeout_s = d.connect_timeout_s;
    /* own copies of the strings */
    const char *src[5] = {st->cfg.endpoint_url, st->cfg.region, st->cfg.access_key_id, st->cfg.secret_access_key,
                          st->cfg.session_token};
    st->cfg.endpoint_url = st->cfg.region = st->cfg.access_key_id = st->cfg.secret_access_key =
        st->cfg.session_token = NULL;
    char *cp[5];
    bool oom = false;
    for (int i = 0; i < 5; i++) oom |= (cp[i] = dup_str(src[i])) == NULL && src[i];
    st->cfg.endpoint_url = cp[0], st->cfg.region = cp[1], st->cfg.access_key_id = cp[2],
    st->cfg.secret_access_key = cp[3], st->cfg.session_token = cp[4];
    size_t n = strlen(uri);
    while (n > 1 && uri[n - 1] == '/' && !(n >= 3 && !strncmp(uri + n - 3, "://", 3))) n--;
    st->uri = cm_alloc(n + 1, 1);
    if (oom || !st->uri) {
        cm_object_store_close(st);
        return cm_set_error(CM_ERR_OOM, "cm_object_store_open: out of memory");
    }
    memcpy(st->uri, uri, n);
    st->uri[n] = 0;
    cm_status s;
    if (!cm_storage_is_uri(st->uri)) {
        s = cmi_local_open(st, st->uri);
    } else {
        const char *sep = strstr(st->uri, "://");
        size_t sl = (size_t)(sep - st->uri);
        char scheme[16];
        snprintf(scheme, sizeof scheme, "%.*s", (int)(sl < 15 ? sl : 15), st->uri);
        const char *rest = sep + 3;
        if (!strcmp(scheme, "file")) {
            if (rest[0] != '/')
                s = cm_set_error(CM_ERR_INVALID_ARG, "'%s': a file:// URI needs an absolute path (file:///abs/dir)", uri);
            else
                s = cmi_local_open(st, rest);
        } else if (!strcmp(scheme, "s3") || !strcmp(scheme, "gs") || !strcmp(scheme, "oci")) {
            const char *slash = strchr(rest, '/');
            size_t bl = slash ? (size_t)(slash - rest) : strlen(rest);
            char bucket[256];
            if (bl == 0 || bl >= sizeof bucket) {
                s = cm_set_error(CM_ERR_INVALID_ARG, "'%s': no bucket name (use %s://BUCKET/PREFIX)", uri, scheme);
            } else {
                memcpy(bucket, rest, bl);
                bucket[bl] = 0;
                const char *pre = slash ? slash + 1 : "";
                size_t pl = strlen(pre);
                st->prefix = cm_alloc(pl + 2, 1);
                if (!st->prefix) {
                    s = CM_ERR_OOM;
                } else {
                    memcpy(st->prefix, pre, pl + 1);
                    if (pl) strcat(st->prefix, "/");
                    st->remote = true;
                    s = cmi_s3_open(st, scheme, bucket);
                }
            }
        } else {
            const char *best = cm_closest_name(scheme, k_schemes, 4);
            s = cm_set_error(CM_ERR_INVALID_ARG, "'%s': unknown storage scheme '%s://'%s%s%s (use s3://, gs://, oci://, "
                                                 "file:// or a local path)",
                             uri, scheme, best ? " (did you mean '" : "", best ? best : "", best ? "://'?)" : "");
        }
    }
    if (!s && !st->prefix && !(st->prefix = dup_str(""))) s = CM_ERR_OOM;
    if (s) {
        cm_object_store_close(st);
        return s == CM_ERR_OOM ? cm_set_error(s, "cm_object_store_open: out of memory") : s;
    }
    *out = st;
    return CM_OK;
}

const char *cm_object_store_uri(const cm_object_store *st) { return st ? st->uri : NULL; }
bool cm_object_store_is_remote(const cm_object_store *st) { return st && st->remote; }

cm_object_store_stats cm_object_store_get_stats(const cm_object_store *st) {
    cm_object_store_stats s = {0, 0, 0, 0};
    if (!st) return s;
    cm_object_store *m = (cm_object_store *)st;
    s.requests = atomic_load(&m->n_requests);
    s.retries = atomic_load(&m->n_retries);
    s.bytes_up = atomic_load(&m->n_up);
    s.bytes_down = atomic_load(&m->n_down);
    return s;
}

/* The full key and the object's URI, checked: keys are relative, '/'-separated, without empty,
 * "." or ".." segments (a local store must not escape its folder). */
static cm_status full_key(const cm_object_store *st, const char *key, bool allow_empty, char **fk, char **uri) {
    *fk = *uri = NULL;
    if (!st || !key) return cm_set_error(CM_ERR_INVALID_ARG, "object store: NULL store or key");
    if (!key[0] && !allow_empty) return cm_set_error(CM_ERR_INVALID_ARG, "object store '%s': empty key", st->uri);
    if (key[0] == '/') return cm_set_error(CM_ERR_INVALID_ARG, "object store '%s': key '%s' starts with '/' (keys are relative to the store)", st->uri, key);
    for (const char *p = key; *p;) {
        const char *e = strchr(p, '/');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if ((l == 0 && e) || (l == 1 && p[0] == '.') || (l == 2 && p[0] == '.' && p[1] == '.'))
            return cm_set_error(CM_ERR_INVALID_ARG, "object store '%s': key '%s' has an empty, '.' or '..' segment",
                                st->uri, key);
        p += l + (e ? 1 : 0);
    }
    size_t pl = strlen(st->prefix), kl = strlen(key), ul = strlen(st->uri);
    *fk = cm_alloc(pl + kl + 1, 1);
    *uri = cm_alloc(ul + kl + 2, 1);
    if (!*fk || !*uri) {
        cm_free(*fk), cm_free(*uri);
        *fk = *uri = NULL;
        return cm_set_error(CM_ERR_OOM, "object store: out of memory");
    }
    memcpy(*fk, st->prefix, pl);
    memcpy(*fk + pl, key, kl + 1);
    snprintf(*uri, ul + kl + 2, "%s%s%s", st->uri, kl && st->uri[ul - 1] != '/' ? "/" : "", key);
    return CM_OK;
}

#define WITH_KEY(allow_empty, call)                       \
    char *fk, *uri;                                       \
    cm_status s = full_key(st, key, allow_empty, &fk, &uri); \
    if (s) return s;                                      \
    s = call;                                             \
    cm_free(fk);                                          \
    cm_free(uri);                                         \
    return s

cm_status cm_object_store_upload(cm_object_store *st, const char *key, const char *local_path) {
    if (!local_path) return cm_set_error(CM_ERR_INVALID_ARG, "cm_object_store_upload: local_path is NULL");
    WITH_KEY(false, st->vt->upload(st, fk, uri, local_path));
}

cm_status cm_object_store_put(cm_object_store *st, const char *key, const void *data, size_t n) {
    if (!data && n) return cm_set_error(CM_ERR_INVALID_ARG, "cm_object_store_put: data is NULL");
    WITH_KEY(false, st->vt->put(st, fk, uri, data ? data : "", n));
}

cm_status cm_object_store_download(cm_object_store *st, const char *key, const char *local_path) {
    if (!local_path) return cm_set_error(CM_ERR_INVALID_ARG, "cm_object_store_download: local_path is NULL");
    WITH_KEY(false, st->vt->download(st, fk, uri, local_path));
}

cm_status cm_object_store_get(cm_object_store *st, const char *key, size_t max_bytes, char **out, size_t *len) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_object_store_get: out is NULL");
    *out = NULL;
    size_t dummy;
    WITH_KEY(false, st->vt->get(st, fk, uri, max_bytes, out, len ? len : &dummy));
}

cm_status cm_object_store_get_size(cm_object_store *st, const char *key, uint64_t *size) {
    if (!size) return cm_set_error(CM_ERR_INVALID_ARG, "cm_object_store_get_size: size is NULL");
    WITH_KEY(false, st->vt->get_size(st, fk, uri, size));
}

cm_status cm_object_store_delete(cm_object_store *st, const char *key) { WITH_KEY(false, st->vt->del(st, fk, uri)); }

cm_status cmi_object_list_add(cm_object_list *l, const char *key, uint64_t size) {
    if (l->n == 0 || (l->n >= 16 && (l->n & (l->n - 1)) == 0)) { /* capacity 16, then doubled when full */
        size_t nc = l->n ? 2 * l->n : 16;
        cm_object_info *ni = cm_alloc(sizeof *ni * nc, 16);
        if (!ni) return cm_set_error(CM_ERR_OOM, "object listing: out of memory");
        if (l->items) memcpy(ni, l->items, sizeof *ni * l->n);
        cm_free(l->items);
        l->items = ni;
    }
    if (!(l->items[l->n].key = dup_str(key))) return cm_set_error(CM_ERR_OOM, "object listing: out of memory");
    l->items[l->n++].size = size;
    return CM_OK;
}

void cm_object_list_free(cm_object_list *l) {
    if (!l) return;
    for (size_t i = 0; i < l->n; i++) cm_free(l->items[i].key);
    cm_free(l->items);
    l->items = NULL;
    l->n = 0;
}

static int info_cmp(const void *a, const void *b) {
    return strcmp(((const cm_object_info *)a)->key, ((const cm_object_info *)b)->key);
}

cm_status cm_object_store_list(cm_object_store *st, const char *prefix, cm_object_list *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_object_store_list: out is NULL");
    memset(out, 0, sizeof *out);
    const char *key = prefix ? prefix : "";
    if (!st) return cm_set_error(CM_ERR_INVALID_ARG, "cm_object_store_list: store is NULL");
    if (key[0] == '/')
        return cm_set_error(CM_ERR_INVALID_ARG, "object store '%s': prefix '%s' starts with '/'", st->uri, key);
    size_t pl = strlen(st->prefix), kl = strlen(key);
    char *fk = cm_alloc(pl + kl + 1, 1), *uri = cm_alloc(strlen(st->uri) + kl + 2, 1);
    if (!fk || !uri) {
        cm_free(fk), cm_free(uri);
        return cm_set_error(CM_ERR_OOM, "object listing: out of memory");
    }
    memcpy(fk, st->prefix, pl);
    memcpy(fk + pl, key, kl + 1);
    sprintf(uri, "%s%s%s", st->uri, kl ? "/" : "", key);
    cm_object_list l = {0};
    cm_status s = st->vt->list(st, fk, uri, &l);
    cm_free(fk);
    cm_free(uri);
    if (s) {
        cm_object_list_free(&l);
        return s;
    }
    /* keys relative to the store */
    for (size_t i = 0; i < l.n; i++) {
        char *k = l.items[i].key;
        if (strncmp(k, st->prefix, pl) == 0 && pl) memmove(k, k + pl, strlen(k + pl) + 1);
    }
    if (l.n) qsort(l.items, l.n, sizeof *l.items, info_cmp);
    *out = l;
    return CM_OK;
}
