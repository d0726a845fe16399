/* Hugging Face sharded checkpoints: model.safetensors.index.json maps each tensor name to the shard
 * file holding it. Shards are opened on first use, under a lock. The index JSON is parsed with
 * cJSON (plain strings, no exact-integer needs); a tensor listed twice is caught by sorting. */
#define _GNU_SOURCE /* qsort_r */
#include "io/safetensors_impl.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"
#define INDEX_MAX_BYTES (1u << 30)

typedef struct ientry {
    char *name;
    size_t shard;
} ientry;

struct cm_safetensors_index {
    char *path; /* the index file (or the single shard) */
    char *dir;  /* folder of the shards, with a trailing '/' ("" for the current folder) */
    size_t n;
    ientry *ent; /* sorted by name */
    size_t n_shards;
    char **shard_name;
    cm_safetensors **shard; /* NULL until opened */
    pthread_mutex_t mu;
};

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

static char *join(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *s = cm_alloc(la + lb + 2, 16);
    if (!s) return NULL;
    memcpy(s, a, la);
    size_t k = la;
    if (la && a[la - 1] != '/') s[k++] = '/';
    memcpy(s + k, b, lb + 1);
    return s;
}

static int cmp_ent(const void *a, const void *b) {
    return strcmp(((const ientry *)a)->name, ((const ientry *)b)->name);
}

void cm_safetensors_index_close(cm_safetensors_index *idx) {
    if (!idx) return;
    for (size_t i = 0; i < idx->n; i++) cm_free(idx->ent[i].name);
    for (size_t i = 0; idx->shard_name && i < idx->n_shards; i++) {
        cm_free(idx->shard_name[i]);
        cm_safetensors_close(idx->shard[i]);
    }
    cm_free(idx->ent);
    cm_free(idx->shard_name);
    cm_free(idx->shard);
    cm_free(idx->path);
    cm_free(idx->dir);
    pthread_mutex_destroy(&idx->mu);
    cm_free(idx);
}

/* Reads a whole (small) file with the allocator hook, NUL-terminated. */
static cm_status slurp(const char *path, char **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return cm_set_error(CM_ERR_IO, "safetensors index '%s': cannot open: %s", path, strerror(errno));
    cm_st_buf b = {0};
    cm_status s = CM_OK;
    for (;;) {
        if ((s = cm_st_buf_reserve(&b, 1 << 16)) != CM_OK) break;
        size_t k = fread(b.p + b.len, 1, b.cap - b.len, f);
        b.len += k;
        if (b.len > INDEX_MAX_BYTES) {
            s = cm_set_error(CM_ERR_FORMAT, "safetensors index '%s': larger than %u bytes; not an index file", path,
                             INDEX_MAX_BYTES);
            break;
        }
        if (k == 0) break;
    }
    if (s == CM_OK && ferror(f)) s = cm_set_error(CM_ERR_IO, "safetensors index '%s': read error", path);
    fclose(f);
    if (s == CM_OK) s = cm_st_buf_put(&b, "", 1);
    if (s != CM_OK) {
        cm_st_buf_free(&b);
        return s;
    }
    *out = (char *)b.p;
    *len = b.len - 1;
    return CM_OK;
}

/* Shard file names come from the JSON: they must stay inside the checkpoint's folder. */
static bool safe_name(const char *s) {
    if (!*s || s[0] == '/') return false;
    for (const char *p = s; *p;) {
        const char *q = strchr(p, '/');
        size_t l = q ? (size_t)(q - p) : strlen(p);
        if (l == 2 && p[0] == '.' && p[1] == '.') return false;
        p += l;
        if (*p == '/') p++;
    }
    return true;
}

static cm_status index_from_json(cm_safetensors_index *idx, const char *text, size_t len) {
    cJSON *root = cJSON_ParseWithLength(text, len);
    cm_status s = CM_OK;
    if (!root) return cm_set_error(CM_ERR_FORMAT, "safetensors index '%s': not valid JSON", idx->path);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(root) || !cJSON_IsObject(wm)) {
        cJSON_Delete(root);
        return cm_set_error(CM_ERR_FORMAT, "safetensors index '%s': no \"weight_map\" object (is it an index file?)",
                            idx->path);
    }
    size_t n = (size_t)cJSON_GetArraySize(wm);
    idx->ent = cm_alloc_zeroed((n ? n : 1) * sizeof *idx->ent, 16);
    idx->shard_name = cm_alloc_zeroed((n ? n : 1) * sizeof *idx->shard_name, 16);
    idx->shard = cm_alloc_zeroed((n ? n : 1) * sizeof *idx->shard, 16);
    if (!idx->ent || !idx->shard_name || !idx->shard) {
        cJSON_Delete(root);
        return CM_ERR_OOM;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, wm) {
        if (!cJSON_IsString(it) || !it->valuestring) {
            s = cm_set_error(CM_ERR_FORMAT, "safetensors index '%s': weight_map entry '%.160s' is not a file name string",
                             idx->path, it->string);
            break;
        }
        if (!safe_name(it->valuestring)) {
            s = cm_set_error(CM_ERR_FORMAT,
                             "safetensors index '%s': weight_map entry '%.160s' names the file '%.200s', which is not "
                             "a relative path inside the checkpoint's folder",
                             idx->path, it->string, it->valuestring);
            break;
        }
        size_t k = 0;
        while (k < idx->n_shards && strcmp(idx->shard_name[k], it->valuestring) != 0) k++;
        if (k == idx->n_shards) {
            if (!(idx->shard_name[k] = cm_st_strdup(it->valuestring))) {
                s = CM_ERR_OOM;
                break;
            }
            idx->n_shards++;
        }
        if (!(idx->ent[idx->n].name = cm_st_strdup(it->string))) {
            s = CM_ERR_OOM;
            break;
        }
        idx->ent[idx->n++].shard = k;
    }
    cJSON_Delete(root);
    if (s != CM_OK) return s;
    qsort(idx->ent, idx->n, sizeof *idx->ent, cmp_ent);
    for (size_t i = 1; i < idx->n; i++)
        if (strcmp(idx->ent[i].name, idx->ent[i - 1].name) == 0)
            return cm_set_error(CM_ERR_FORMAT, "safetensors index '%s': tensor '%.160s' is listed twice in weight_map",
                                idx->path, idx->ent[i].name);
    return CM_OK;
}

/* A folder with a single model.safetensors: the one shard, opened now to learn the names. */
static cm_status index_single(cm_safetensors_index *idx) {
    cm_safetensors *st;
    cm_status s = cm_safetensors_open(idx->path, &st);
    if (s != CM_OK) return s;
    size_t n = cm_safetensors_count(st);
    idx->ent = cm_alloc_zeroed((n ? n : 1) * sizeof *idx->ent, 16);
    idx->shard_name = cm_alloc_zeroed(sizeof *idx->shard_name, 16);
    idx->shard = cm_alloc_zeroed(sizeof *idx->shard, 16);
    if (!idx->ent || !idx->shard_name || !idx->shard || !(idx->shard_name[0] = cm_st_strdup(SINGLE_NAME))) {
        cm_safetensors_close(st);
        return CM_ERR_OOM;
    }
    idx->n_shards = 1;
    idx->shard[0] = st;
    for (size_t i = 0; i < n; i++) {
        if (!(idx->ent[i].name = cm_st_strdup(cm_safetensors_at_sorted(st, i)->name))) return CM_ERR_OOM;
        idx->n = i + 1;
    }
    return CM_OK;
}

cm_status cm_safetensors_index_open(const char *path, cm_safetensors_index **out) {
    if (!out || !path) return cm_set_error(CM_ERR_INVALID_ARG, "cm_safetensors_index_open: NULL argument");
    *out = NULL;
    cm_safetensors_index *idx = cm_alloc_zeroed(sizeof *idx, 16);
    if (!idx) return CM_ERR_OOM;
    pthread_mutex_init(&idx->mu, NULL);
    cm_status s = CM_OK;
    bool single = false;
    if (is_dir(path)) {
        idx->path = join(path, INDEX_NAME);
        if (idx->path && !exists(idx->path)) {
            cm_free(idx->path);
            idx->path = join(path, SINGLE_NAME);
            if (idx->path && !exists(idx->path)) {
                s = cm_set_error(CM_ERR_NOT_FOUND, "safetensors checkpoint '%s': the folder has neither %s nor %s", path,
                                 INDEX_NAME, SINGLE_NAME);
                goto fail;
            }
            single = true;
        }
    } else {
        idx->path = cm_st_strdup(path);
    }
    if (!idx->path) {
        s = CM_ERR_OOM;
        goto fail;
    }
    const char *slash = strrchr(idx->path, '/');
    size_t dl = slash ? (size_t)(slash - idx->path) + 1 : 0;
    if (!(idx->dir = cm_alloc(dl + 1, 16))) {
        s = CM_ERR_OOM;
        goto fail;
    }
    memcpy(idx->dir, idx->path, dl);
    idx->dir[dl] = 0;
    if (single) {
        s = index_single(idx);
    } else {
        char *text = NULL;
        size_t len = 0;
        if ((s = slurp(idx->path, &text, &len)) == CM_OK) {
            s = index_from_json(idx, text, len);
            cm_free(text);
        }
    }
    if (s != CM_OK) goto fail;
    *out = idx;
    return CM_OK;
fail:
    cm_safetensors_index_close(idx);
    return s;
}

size_t cm_safetensors_index_count(const cm_safetensors_index *idx) { return idx->n; }

const char *cm_safetensors_index_name(const cm_safetensors_index *idx, size_t i) {
    return i < idx->n ? idx->ent[i].name : NULL;
}

const char *cm_safetensors_index_file(const cm_safetensors_index *idx, size_t i) {
    return i < idx->n ? idx->shard_name[idx->ent[i].shard] : NULL;
}

cm_status cm_safetensors_index_find(cm_safetensors_index *idx, const char *name, const cm_safetensors **file,
                                    const cm_st_tensor **t) {
    if (file) *file = NULL;
    if (t) *t = NULL;
    if (!name) return cm_set_error(CM_ERR_INVALID_ARG, "cm_safetensors_index_find: name is NULL");
    ientry key = {.name = (char *)name};
    const ientry *e = bsearch(&key, idx->ent, idx->n, sizeof *idx->ent, cmp_ent);
    if (!e)
        return cm_set_error(CM_ERR_NOT_FOUND, "safetensors checkpoint '%s': no tensor named '%.160s' (%zu tensors listed)",
                            idx->path, name, idx->n);
    const char *shard = idx->shard_name[e->shard];
    cm_status s = CM_OK;
    pthread_mutex_lock(&idx->mu);
    if (!idx->shard[e->shard]) {
        char *p = join(idx->dir[0] ? idx->dir : ".", shard);
        if (!p) s = CM_ERR_OOM;
        else {
            s = cm_safetensors_open(p, &idx->shard[e->shard]);
            if (s != CM_OK)
                s = cm_set_error(s, "safetensors checkpoint '%s': shard '%s' (holding tensor '%.160s'): %s", idx->path,
                                 shard, name, cm_last_error());
            cm_free(p);
        }
    }
    const cm_safetensors *st = idx->shard[e->shard];
    pthread_mutex_unlock(&idx->mu);
    if (s != CM_OK) return s;
    const cm_st_tensor *x = cm_safetensors_find(st, name);
    if (!x)
        return cm_set_error(CM_ERR_FORMAT,
                            "safetensors checkpoint '%s': weight_map puts tensor '%.160s' in shard '%s', but that file "
                            "has no such tensor",
                            idx->path, name, shard);
    if (file) *file = st;
    if (t) *t = x;
    return CM_OK;
}

cm_status cm_safetensors_index_load(cm_safetensors_index *idx, const char *name, cm_dtype dt, cm_tensor **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_safetensors_index_load: out is NULL");
    *out = NULL;
    const cm_safetensors *st;
    cm_status s = cm_safetensors_index_find(idx, name, &st, NULL);
    if (s != CM_OK) return s;
    return cm_safetensors_load(st, name, dt, out);
}
