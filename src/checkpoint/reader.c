/* Reading checkpoints: open (manifest checksum, version, files, sizes, tensor lists), verify
 * (every tensor's XXH3), export, summary; the search for the newest complete checkpoint; save
 * name patterns; exit statuses. */
#define _GNU_SOURCE
#include "checkpoint/ckpt_impl.h"
#include "tensor/tensor_impl.h"

#include <composer/surgery_algorithms.h>

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CMI_MANIFEST_MAX (64u << 20)
#define CMI_MAX_FILES (2 * CMI_CK_MAX_WORLD + 2)


typedef struct ck_file {
    char *name;
    char *path;
    cm_safetensors *st;
    uint64_t size;
    int kind; /* CMI_CK_KIND_MODEL / _OPTIM */
    size_t t0, t1; /* its tensors: ck->tensors[t0, t1) */
    bool pending;  /* listed but not local yet (a lazy open): fetched on first use */
} ck_file;

struct cm_checkpoint {
    char *path;
    char *text;
    size_t len;
    cJSON *root;
    const char *run_name;
    cm_timestamp ts;
    bool weights_only;
    uint64_t config_digest;
    ck_file *files;
    int n_files;
    cm_ckpt_tensor *tensors;
    size_t n_tensors;
    bool sharded;
    int world_size;
    int *tkind;                /* (n_tensors) the kind of each piece's file */
    const cm_st_tensor **tst;  /* (n_tensors) each piece in its open file */
    size_t *order;             /* (n_tensors) pieces sorted by (kind, name, begin) */
    unsigned char *verified;   /* (n_tensors) piece hashed and found intact */
    cmi_ck_fetch_fn fetch;     /* a lazy open: brings a missing file (NULL: every file must be there) */
    void *fetch_data;
};

void cm_checkpoint_close(cm_checkpoint *ck) {
    if (!ck) return;
    for (int i = 0; i < ck->n_files; i++) {
        cm_safetensors_close(ck->files[i].st);
        cm_free(ck->files[i].name);
        cm_free(ck->files[i].path);
    }
    cm_free(ck->files);
    cJSON_Delete(ck->root);
    cm_free(ck->text);
    cm_free(ck->tensors);
    cm_free(ck->tkind);
    cm_free(ck->tst);
    cm_free(ck->order);
    cm_free(ck->verified);
    cm_free(ck->path);
    cm_free(ck);
}

/* A name a checkpoint may use for itself or its files: no '/', not hidden, not empty. */
static bool plain_name(const char *s) {
    return s && s[0] && s[0] != '.' && !strchr(s, '/') && strlen(s) < 256;
}

static cm_status fail(cm_checkpoint *ck, cm_status s) {
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", cm_last_error());
    cm_checkpoint_close(ck);
    return cm_set_error(s, "%s", msg);
}

/* Reads the pointer file: the checkpoint name it holds (trimmed). */
static cm_status read_pointer(const char *folder, const char *latest_name, char *name, size_t cap) {
    char *pp = cmi_path_join(folder, latest_name ? latest_name : CM_CKPT_LATEST_DEFAULT);
    if (!pp) return CM_ERR_OOM;
    char *txt;
    size_t n;
    cm_status s = cmi_read_file(pp, 4096, &txt, &n);
    if (s) {
        cm_free(pp);
        return s;
    }
    while (n && (txt[n - 1] == '\n' || txt[n - 1] == '\r' || txt[n - 1] == ' ')) txt[--n] = 0;
    if (!plain_name(txt) || n >= cap) s = cm_set_error(CM_ERR_FORMAT, "pointer '%s' holds '%.80s', not a checkpoint name", pp, txt);
    else memcpy(name, txt, n + 1);
    cm_free(txt);
    cm_free(pp);
    return s;
}

/* The kind of a checkpoint file from its name: optimizer state, algorithm state or model. */
static int file_kind(const char *name) {
    if (!strncmp(name, "optimizer", 9)) return CMI_CK_KIND_OPTIM;
    if (!strncmp(name, "algorithms", 10)) return CMI_CK_KIND_ALGO;
    return CMI_CK_KIND_MODEL;
}

/* The number of elements of a shape; -1 for a negative dimension or an overflow. */
static int64_t prod(const int64_t *shape, int ndim) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 0 || __builtin_mul_overflow(n, shape[d], &n)) return -1;
    return n;
}

/* A JSON number that is a whole count in [0, 2^53] (larger doubles are not exact, and converting
 * an out-of-range double to an integer is undefined). */
static bool json_count(const cJSON *e, int64_t *out) { return cmi_json_whole(e, 0, INT64_MAX, out); }

static int piece_cmp_ck(const cm_checkpoint *ck, size_t x, size_t y) {
    if (ck->tkind[x] != ck->tkind[y]) return ck->tkind[x] < ck->tkind[y] ? -1 : 1;
    int c = strcmp(ck->tensors[x].name, ck->tensors[y].name);
    if (c) return c;
    if (ck->tensors[x].begin != ck->tensors[y].begin) return ck->tensors[x].begin < ck->tensors[y].begin ? -1 : 1;
    return 0;
}

/* Sorts piece indices by (kind, name, begin): insertion into a merge sort, reentrant. */
static void sort_pieces(const cm_checkpoint *ck, size_t *v, size_t *tmp, size_t n) {
    if (n < 2) return;
    size_t h = n / 2;
    sort_pieces(ck, v, tmp, h);
    sort_pieces(ck, v + h, tmp, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = piece_cmp_ck(ck, v[i], v[j]) <= 0 ? v[i++] : v[j++];
    while (i < h) tmp[k++] = v[i++];
    while (j < n) tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof *v);
}

/* Every logical tensor's pieces must tile [0, numel) of its global shape, with one dtype. */
static cm_status check_tiling(cm_checkpoint *ck, const char *path) {
    size_t n = ck->n_tensors;
    ck->order = cm_alloc(sizeof *ck->order * (n ? n : 1), 16);
    size_t *tmp = cm_alloc(sizeof *tmp * (n ? n : 1), 16);
    ck->verified = cm_alloc_zeroed(n ? n : 1, 16);
    if (!ck->order || !tmp || !ck->verified) {
        cm_free(tmp);
        return cm_set_error(CM_ERR_OOM, "checkpoint '%s': out of memory", path);
    }
    for (size_t i = 0; i < n; i++) ck->order[i] = i;
    sort_pieces(ck, ck->order, tmp, n);
    cm_free(tmp);
    for (size_t i = 0; i < n;) {
        const cm_ckpt_tensor *f = &ck->tensors[ck->order[i]];
        const int64_t total = prod(f->global_shape, f->global_ndim);
        int64_t at = 0;
        size_t j = i;
        for (; j < n; j++) {
            const cm_ckpt_tensor *t = &ck->tensors[ck->order[j]];
            if (ck->tkind[ck->order[j]] != ck->tkind[ck->order[i]] || strcmp(t->name, f->name)) break;
            bool same = t->dtype == f->dtype && t->global_ndim == f->global_ndim;
            for (int d = 0; same && d < t->global_ndim; d++) same = t->global_shape[d] == f->global_shape[d];
            if (!same)
                return cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': the pieces of tensor '%s' ('%s' and '%s') disagree "
                                                   "on its dtype or global shape",
                                    path, f->name, f->file, t->file);
            if (t->begin != at)
                return cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': tensor '%s' has %s elements [%lld, %lld) (next "
                                                   "piece in '%s' starts at %lld): a rank file is missing or does not "
                                                   "match the others",
                                    path, f->name, t->begin > at ? "no piece holding" : "two pieces holding",
                                    (long long)(t->begin > at ? at : t->begin), (long long)(t->begin > at ? t->begin : at),
                                    t->file, (long long)t->begin);
            at = t->end;
        }
        if (at != total)
            return cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': tensor '%s' has %lld elements but its pieces hold only "
                                               "[0, %lld): a rank file is missing or does not match the others",
                                path, f->name, (long long)total, (long long)at);
        i = j;
    }
    return CM_OK;
}

static cm_status parse_file_list(cm_checkpoint *ck, const char *path, const cJSON *files, size_t total,
                                 unsigned char *seen);

static cm_status parse_files(cm_checkpoint *ck, const char *path) {
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(ck->root, "files");
    if (!cJSON_IsObject(files))
        return cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': the manifest has no \"files\" object", path);
    size_t total = 0;
    int nf = 0;
    const cJSON *f;
    cJSON_ArrayForEach(f, files) {
        const cJSON *ts = cJSON_GetObjectItemCaseSensitive(f, "tensors");
        if (!cJSON_IsObject(ts))
            return cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': file entry '%s' has no \"tensors\" object", path,
                                f->string);
        total += (size_t)cJSON_GetArraySize(ts);
        nf++;
    }
    if (nf > CMI_MAX_FILES)
        return cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': more than %d files listed", path, CMI_MAX_FILES);
    unsigned char *seen = cm_alloc_zeroed(ck->sharded ? 2 * (size_t)ck->world_size : 1, 16); /* (rank, kind) listed */
    if (!seen) return cm_set_error(CM_ERR_OOM, "checkpoint '%s': out of memory", path);
    cm_status s = parse_file_list(ck, path, files, total, seen);
    cm_free(seen);
    return s;
}

/* Opens a listed file and checks it against the manifest: its size, a valid safetensors file
 * holding exactly the listed tensors with the listed dtypes and shapes. */
static cm_status attach_file(cm_checkpoint *ck, ck_file *cf) {
    const char *path = ck->path;
    struct stat sb;
    if (stat(cf->path, &sb) != 0)
        return cm_set_error(CM_ERR_FORMAT, "checkpoint '%s' is incomplete: '%s' is missing (%s)", path, cf->name,
                            strerror(errno));
    if ((uint64_t)sb.st_size != cf->size)
        return cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': '%s' has %lld bytes but the manifest says %" PRIu64
                                           " (truncated or overwritten)",
                            path, cf->name, (long long)sb.st_size, cf->size);
    cm_status s = cm_safetensors_open(cf->path, &cf->st);
    if (s) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': '%s' is damaged: %s", path, cf->name, msg);
    }
    if (cf->t1 - cf->t0 != cm_safetensors_count(cf->st))
        return cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': '%s' holds %zu tensors but the manifest lists %zu", path,
                            cf->name, cm_safetensors_count(cf->st), cf->t1 - cf->t0);
    for (size_t i = cf->t0; i < cf->t1; i++) {
        const cm_ckpt_tensor *ct = &ck->tensors[i];
        const cm_st_tensor *ft = cm_safetensors_find(cf->st, ct->name);
        bool same = ft && ft->dtype == ct->dtype && ft->ndim == ct->ndim && ft->nbytes == ct->nbytes;
        for (int d = 0; same && d < ct->ndim; d++) same = ft->shape[d] == ct->shape[d];
        if (!same)
            return cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': tensor '%s' in '%s' %s", path, ct->name, cf->name,
                                ft ? "differs from the manifest (dtype, shape or size)" : "is missing");
        ck->tst[i] = ft;
    }
    cf->pending = false;
    return CM_OK;
}

/* A lazy open's missing file: fetched, then checked like any other. */
static cm_status ensure_file(cm_checkpoint *ck, ck_file *cf) {
    if (!cf->pending) return CM_OK;
    cm_status s = ck->fetch(ck->fetch_data, ck->path, cf->name);
    if (s) return s;
    return attach_file(ck, cf);
}

static ck_file *file_of(cm_checkpoint *ck, size_t tensor) {
    for (int i = 0; i < ck->n_files; i++)
        if (tensor >= ck->files[i].t0 && tensor < ck->files[i].t1) return &ck->files[i];
    return NULL;
}

static cm_status parse_file_list(cm_checkpoint *ck, const char *path, const cJSON *files, size_t total,
                                 unsigned char *seen) {
    const cJSON *f;
    const int nf = cJSON_GetArraySize(files);
    ck->tensors = cm_alloc_zeroed(sizeof *ck->tensors * (total ? total : 1), 16);
    ck->tkind = cm_alloc_zeroed(sizeof *ck->tkind * (total ? total : 1), 16);
    ck->tst = cm_alloc_zeroed(sizeof *ck->tst * (total ? total : 1), 16);
    ck->files = cm_alloc_zeroed(sizeof *ck->files * (size_t)(nf ? nf : 1), 16);
    if (!ck->tensors || !ck->tkind || !ck->tst || !ck->files)
        return cm_set_error(CM_ERR_OOM, "checkpoint '%s': out of memory", path);
    cJSON_ArrayForEach(f, files) {
        if (!plain_name(f->string))
            return cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': file name '%.80s' is not a plain name", path, f->string);
        ck_file *cf = &ck->files[ck->n_files++];
        cf->name = cm_alloc(strlen(f->string) + 1, 1);
        cf->path = cmi_path_join(path, f->string);
        if (!cf->name || !cf->path) return cm_set_error(CM_ERR_OOM, "checkpoint '%s': out of memory", path);
        strcpy(cf->name, f->string);
        cf->kind = file_kind(cf->name);
        if (ck->sharded) {
            int r, w, k = 0;
            char kind[16];
            if (sscanf(cf->name, "%15[a-z]-rank%d-of-%d.safetensors%n", kind, &r, &w, &k) != 3 ||
                cf->name[k] || (strcmp(kind, "model") && strcmp(kind, "optimizer")) || w != ck->world_size || r < 0 ||
                r >= w)
                return cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': file '%s' is not a rank file of this %d-rank "
                                                   "checkpoint (model-rank<r>-of-%d.safetensors or optimizer-...)",
                                    path, cf->name, ck->world_size, ck->world_size);
            seen[2 * r + cf->kind] = 1;
        }
        int64_t size;
        if (!cmi_json_get_i64(f, "size", &size) || size < 0)
            return cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': file '%s' has no valid size in the manifest", path,
                                cf->name);
        cf->size = (uint64_t)size;
        const cJSON *tl = cJSON_GetObjectItemCaseSensitive(f, "tensors");
        const cJSON *t;
        cf->t0 = ck->n_tensors;
        cJSON_ArrayForEach(t, tl) {
            ck->tkind[ck->n_tensors] = cf->kind;
            cm_ckpt_tensor *ct = &ck->tensors[ck->n_tensors++];
            ct->file = cf->name;
            ct->name = t->string;
            const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
            const cJSON *sh = cJSON_GetObjectItemCaseSensitive(t, "shape");
            const cJSON *gs = cJSON_GetObjectItemCaseSensitive(t, "global_shape");
            const cJSON *rg = cJSON_GetObjectItemCaseSensitive(t, "range");
            int64_t nb;
            uint64_t h = 0;
            const cJSON *hx = cJSON_GetObjectItemCaseSensitive(t, "xxh3");
            char *end = NULL;
            if (cJSON_IsString(hx)) h = strtoull(hx->valuestring, &end, 16);
            if (!cJSON_IsString(dt) || cm_st_dtype_parse(dt->valuestring, &ct->dtype) || !cJSON_IsArray(sh) ||
                cJSON_GetArraySize(sh) > CM_MAX_DIMS || !cmi_json_get_i64(t, "nbytes", &nb) || nb < 0 || !end ||
                *end || strlen(hx->valuestring) != 16 || (gs && (!cJSON_IsArray(gs) || cJSON_GetArraySize(gs) > CM_MAX_DIMS)) ||
                (rg && (!cJSON_IsArray(rg) || cJSON_GetArraySize(rg) != 2)) || (!gs != !rg) || (ck->sharded && !gs))
                return cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': the manifest entry of tensor '%s' in '%s' is "
                                                   "malformed (dtype, shape, nbytes, xxh3%s needed)",
                                    path, ct->name, cf->name, ck->sharded ? ", global_shape, range" : "");
            ct->nbytes = (uint64_t)nb;
            ct->xxh3 = h;
            ct->ndim = cJSON_GetArraySize(sh);
            for (int d = 0; d < ct->ndim; d++)
                if (!json_count(cJSON_GetArrayItem(sh, d), &ct->shape[d])) ct->shape[d] = -1;
            const int64_t numel = prod(ct->shape, ct->ndim);
            if (numel < 0)
                return cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': tensor '%s' in '%s' has a malformed shape", path,
                                    ct->name, cf->name);
            if (gs) {
                ct->global_ndim = cJSON_GetArraySize(gs);
                bool ok = true;
                for (int d = 0; d < ct->global_ndim; d++) ok = ok && json_count(cJSON_GetArrayItem(gs, d), &ct->global_shape[d]);
                ok = ok && json_count(cJSON_GetArrayItem(rg, 0), &ct->begin) && json_count(cJSON_GetArrayItem(rg, 1), &ct->end);
                const int64_t gtotal = ok ? prod(ct->global_shape, ct->global_ndim) : -1;
                if (!ok || gtotal < 0 || ct->end < ct->begin || ct->end > gtotal || ct->end - ct->begin != numel)
                    return cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': tensor '%s' in '%s': its range [%lld, %lld) "
                                                       "does not fit its global shape or its %lld elements",
                                        path, ct->name, cf->name, (long long)ct->begin, (long long)ct->end,
                                        (long long)numel);
            } else {
                ct->global_ndim = ct->ndim;
                memcpy(ct->global_shape, ct->shape, sizeof ct->shape);
                ct->begin = 0;
                ct->end = numel;
            }
            if (cm_st_dtype_bits(ct->dtype) % 8)
                return cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': tensor '%s' has the packed dtype %s", path,
                                    ct->name, cm_st_dtype_name(ct->dtype));
        }
        cf->t1 = ck->n_tensors;
        struct stat sb;
        if (ck->fetch && stat(cf->path, &sb) != 0) {
            cf->pending = true; /* fetched when a read first needs it */
            continue;
        }
        cm_status s = attach_file(ck, cf);
        if (s) return s;
    }
    if (ck->sharded) {
        /* every rank's files are listed: a missing one is named, not just a gap */
        const bool wo = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(ck->root, "weights_only"));
        for (int r = 0; r < ck->world_size; r++)
            for (int k = 0; k < (wo ? 1 : 2); k++) {
                char want[96];
                snprintf(want, sizeof want, "%s-rank%d-of-%d.safetensors", k ? "optimizer" : "model", r, ck->world_size);
                if (!seen[2 * r + k])
                    return cm_set_error(CM_ERR_FORMAT, "checkpoint '%s' (saved by %d ranks) does not list '%s': it is "
                                                       "incomplete",
                                        path, ck->world_size, want);
            }
    }
    return check_tiling(ck, path);
}

static cm_status open_impl(const char *path, cmi_ck_fetch_fn fetch, void *fetch_data, cm_checkpoint **out) {
    if (!path || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_checkpoint_open: NULL %s", path ? "out" : "path");
    *out = NULL;
    cm_checkpoint *ck = cm_alloc_zeroed(sizeof *ck, 16);
    if (!ck) return cm_set_error(CM_ERR_OOM, "cm_checkpoint_open: out of memory");
    ck->fetch = fetch;
    ck->fetch_data = fetch_data;
    if (!cmi_is_dir(path)) {
        cm_checkpoint_close(ck);
        struct stat fb;
        if (stat(path, &fb) == 0 && S_ISREG(fb.st_mode)) {
            /* a pointer file (`latest`, as a user passes Composer's latest-rank0.pt): the checkpoint it names */
            char dir[4096], name[256];
            const char *slash = strrchr(path, '/');
            snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
            if (slash == path) snprintf(dir, sizeof dir, "/");
            cm_status s = read_pointer(dir, slash ? slash + 1 : path, name, sizeof name);
            if (s) {
                char msg[1024];
                snprintf(msg, sizeof msg, "%s", cm_last_error());
                return cm_set_error(CM_ERR_NOT_FOUND, "checkpoint '%s' is a file, not a checkpoint folder or a pointer "
                                                      "to one (%s)", path, msg);
            }
            char *p2 = cmi_path_join(dir, name);
            if (!p2) return CM_ERR_OOM;
            s = cmi_is_dir(p2) ? cm_checkpoint_open(p2, out)
                               : cm_set_error(CM_ERR_NOT_FOUND, "'%s' names '%s', which does not exist", path, name);
            cm_free(p2);
            return s;
        }
        return cm_set_error(CM_ERR_NOT_FOUND, "checkpoint '%s' does not exist (or is not a folder)", path);
    }
    char *mp = cmi_path_join(path, CM_CKPT_MANIFEST);
    if (!mp) return fail(ck, CM_ERR_OOM);
    struct stat sb;
    if (stat(mp, &sb) != 0) {
        /* a save folder: follow its pointer */
        char name[256];
        cm_free(mp);
        if (read_pointer(path, NULL, name, sizeof name) == CM_OK) {
            char *p2 = cmi_path_join(path, name);
            cm_checkpoint_close(ck);
            if (!p2) return CM_ERR_OOM;
            cm_status s = cmi_is_dir(p2) ? cm_checkpoint_open(p2, out)
                                         : cm_set_error(CM_ERR_NOT_FOUND, "'%s/latest' names '%s', which does not exist",
                                                        path, name);
            cm_free(p2);
            return s;
        }
        cm_checkpoint_close(ck);
        return cm_set_error(CM_ERR_NOT_FOUND, "'%s' is not a checkpoint: it has no %s (and no latest pointer)", path,
                            CM_CKPT_MANIFEST);
    }
    ck->path = cm_alloc(strlen(path) + 1, 1);
    if (!ck->path) {
        cm_free(mp);
        return fail(ck, CM_ERR_OOM);
    }
    strcpy(ck->path, path);
    cm_status s = cmi_read_file(mp, CMI_MANIFEST_MAX, &ck->text, &ck->len);
    if (!s) {
        char label[4200];
        snprintf(label, sizeof label, "checkpoint '%s': %s", path, CM_CKPT_MANIFEST);
        s = cmi_manifest_parse(ck->text, ck->len, label, &ck->root);
    }
    cm_free(mp);
    if (s) return fail(ck, s == CM_ERR_NOT_FOUND ? CM_ERR_FORMAT : s);

    int64_t ver;
    if (!cmi_json_get_i64(ck->root, "format_version", &ver)) {
        cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': the manifest has no format_version", path);
        return fail(ck, CM_ERR_FORMAT);
    }
    if (ver != CM_CKPT_FORMAT_VERSION) {
        const cJSON *lib = cJSON_GetObjectItemCaseSensitive(ck->root, "library");
        const cJSON *lv = cJSON_GetObjectItemCaseSensitive(lib, "version");
        const char *wrote = cJSON_IsString(lv) ? lv->valuestring : "?";
        if (ver > CM_CKPT_FORMAT_VERSION)
            cm_set_error(CM_ERR_UNSUPPORTED, "checkpoint '%s' has format version %lld (written by composer %s); this "
                                             "library (composer %s) reads version %d: upgrade composer to load it",
                         path, (long long)ver, wrote, cm_version(), CM_CKPT_FORMAT_VERSION);
        else
            cm_set_error(CM_ERR_UNSUPPORTED, "checkpoint '%s' has the old format version %lld (written by composer "
                                             "%s); this library (composer %s) reads version %d: load it with the "
                                             "composer that wrote it and export the weights (composer ckpt export), "
                                             "then start from them",
                         path, (long long)ver, wrote, cm_version(), CM_CKPT_FORMAT_VERSION);
        return fail(ck, CM_ERR_UNSUPPORTED);
    }
    const cJSON *rn = cJSON_GetObjectItemCaseSensitive(ck->root, "run_name");
    ck->run_name = cJSON_IsString(rn) ? rn->valuestring : "";
    if (!cmi_timestamp_from_json(cJSON_GetObjectItemCaseSensitive(ck->root, "timestamp"), &ck->ts)) {
        cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': the manifest's timestamp is missing or malformed", path);
        return fail(ck, CM_ERR_FORMAT);
    }
    ck->weights_only = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(ck->root, "weights_only"));
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(ck->root, "config");
    char *ct = cfg ? cJSON_PrintUnformatted(cfg) : NULL;
    ck->config_digest = ct ? cm_hash64(ct, strlen(ct), 0) : 0;
    cJSON_free(ct);
    const cJSON *lay = cJSON_GetObjectItemCaseSensitive(ck->root, "layout");
    int64_t ws = 1;
    if (lay && (!cJSON_IsString(lay) || (strcmp(lay->valuestring, "sharded") && strcmp(lay->valuestring, "monolithic")))) {
        cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': layout must be \"monolithic\" or \"sharded\"", path);
        return fail(ck, CM_ERR_FORMAT);
    }
    ck->sharded = lay && !strcmp(lay->valuestring, "sharded");
    /* provenance for a monolithic checkpoint; the number of rank files for a sharded one */
    if (cJSON_GetObjectItemCaseSensitive(ck->root, "world_size") &&
        (!cmi_json_get_i64(ck->root, "world_size", &ws) || ws < 1 || ws > (ck->sharded ? CMI_CK_MAX_WORLD : INT32_MAX))) {
        cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': world_size must be in [1, %d]", path,
                     ck->sharded ? CMI_CK_MAX_WORLD : INT32_MAX);
        return fail(ck, CM_ERR_FORMAT);
    }
    if (ck->sharded && !cJSON_GetObjectItemCaseSensitive(ck->root, "world_size")) {
        cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': a sharded checkpoint needs world_size", path);
        return fail(ck, CM_ERR_FORMAT);
    }
    ck->world_size = (int)ws;
    if ((s = parse_files(ck, path))) return fail(ck, s);
    bool has_model = false;
    for (int i = 0; i < ck->n_files; i++) has_model |= !strcmp(ck->files[i].name, CM_CKPT_MODEL_FILE);
    if (!ck->sharded && !has_model) {
        cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': the manifest lists no %s", path, CM_CKPT_MODEL_FILE);
        return fail(ck, CM_ERR_FORMAT);
    }
    *out = ck;
    return CM_OK;
}

cm_status cm_checkpoint_open(const char *path, cm_checkpoint **out) { return open_impl(path, NULL, NULL, out); }

cm_status cmi_checkpoint_open_lazy(const char *path, cmi_ck_fetch_fn fetch, void *data, cm_checkpoint **out) {
    return open_impl(path, fetch, data, out);
}

/* Hashes tensor i (its bytes ft) against the manifest and marks it verified. */
static cm_status verify_one(cm_checkpoint *ck, size_t i, const cm_st_tensor *ft) {
    const cm_ckpt_tensor *t = &ck->tensors[i];
    const uint64_t h = cm_hash64(ft->data, ft->nbytes, 0);
    if (h != t->xxh3)
        return cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': tensor '%s' in '%s' is corrupt (XXH3 %016" PRIx64
                                           ", the manifest says %016" PRIx64 ")",
                            ck->path, t->name, t->file, h, t->xxh3);
    ck->verified[i] = 1;
    return CM_OK;
}

cm_status cm_checkpoint_verify(cm_checkpoint *ck) {
    if (!ck) return cm_set_error(CM_ERR_INVALID_ARG, "cm_checkpoint_verify: NULL checkpoint");
    for (int i = 0; i < ck->n_files; i++) {
        cm_status s = ensure_file(ck, &ck->files[i]);
        if (s) return s;
    }
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const cm_ckpt_tensor *t = &ck->tensors[i];
        const cm_st_tensor *ft = cm_safetensors_find(cm_checkpoint_file(ck, t->file), t->name);
        if (!ft) return cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': tensor '%s' vanished", ck->path, t->name);
        cm_status s = verify_one(ck, i, ft);
        if (s) return s;
    }
    return CM_OK;
}

bool cm_checkpoint_sharded(const cm_checkpoint *ck) { return ck && ck->sharded; }
int cm_checkpoint_world_size(const cm_checkpoint *ck) { return ck ? ck->world_size : 0; }

/* ---- logical tensors: the pieces of one name, in element order ---- */

static bool find_group(const cm_checkpoint *ck, int kind, const char *name, size_t *lo, size_t *hi) {
    size_t a = 0, b = ck->n_tensors;
    while (a < b) { /* first piece with (kind, name) >= the key */
        size_t m = (a + b) / 2, i = ck->order[m];
        int c = ck->tkind[i] != kind ? (ck->tkind[i] < kind ? -1 : 1) : strcmp(ck->tensors[i].name, name);
        if (c < 0) a = m + 1;
        else b = m;
    }
    size_t e = a;
    while (e < ck->n_tensors && ck->tkind[ck->order[e]] == kind && !strcmp(ck->tensors[ck->order[e]].name, name)) e++;
    *lo = a, *hi = e;
    return e > a;
}

bool cmi_ck_find(const cm_checkpoint *ck, int kind, const char *name, cmi_ck_global *out) {
    size_t lo, hi;
    if (!find_group(ck, kind, name, &lo, &hi)) return false;
    const cm_ckpt_tensor *t = &ck->tensors[ck->order[lo]];
    out->name = t->name;
    out->dtype = t->dtype;
    out->ndim = t->global_ndim;
    memcpy(out->shape, t->global_shape, sizeof out->shape);
    out->numel = prod(t->global_shape, t->global_ndim);
    out->n_pieces = (int)(hi - lo);
    return true;
}

bool cmi_ck_has_kind(const cm_checkpoint *ck, int kind) {
    for (int i = 0; i < ck->n_files; i++)
        if (ck->files[i].kind == kind) return true;
    return false;
}

size_t cmi_ck_n_global(const cm_checkpoint *ck, int kind) {
    size_t n = 0;
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const size_t x = ck->order[i];
        if (ck->tkind[x] != kind) continue;
        n += i == 0 || ck->tkind[ck->order[i - 1]] != kind || strcmp(ck->tensors[ck->order[i - 1]].name, ck->tensors[x].name);
    }
    return n;
}

const char *cmi_ck_global_name(const cm_checkpoint *ck, int kind, size_t k) {
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const size_t x = ck->order[i];
        if (ck->tkind[x] != kind) continue;
        if (i == 0 || ck->tkind[ck->order[i - 1]] != kind || strcmp(ck->tensors[ck->order[i - 1]].name, ck->tensors[x].name)) {
            if (k == 0) return ck->tensors[x].name;
            k--;
        }
    }
    return NULL;
}

cm_status cmi_ck_read_range(cm_checkpoint *ck, int kind, const char *name, int64_t a, int64_t b, void *dst) {
    size_t lo, hi;
    if (!find_group(ck, kind, name, &lo, &hi))
        return cm_set_error(CM_ERR_NOT_FOUND, "checkpoint '%s' has no %s tensor '%s'", ck->path,
                            kind == CMI_CK_KIND_OPTIM ? "optimizer" : kind == CMI_CK_KIND_ALGO ? "algorithm" : "model",
                            name);
    const cm_ckpt_tensor *f = &ck->tensors[ck->order[lo]];
    const int64_t total = prod(f->global_shape, f->global_ndim);
    if (a < 0 || b < a || b > total)
        return cm_set_error(CM_ERR_INVALID_ARG, "checkpoint '%s': elements [%lld, %lld) of '%s' are outside its %lld",
                            ck->path, (long long)a, (long long)b, name, (long long)total);
    const size_t es = (size_t)cm_st_dtype_bits(f->dtype) / 8;
    for (size_t k = lo; k < hi; k++) {
        const size_t i = ck->order[k];
        const cm_ckpt_tensor *t = &ck->tensors[i];
        const int64_t x = t->begin > a ? t->begin : a, y = t->end < b ? t->end : b;
        if (x >= y) continue;
        if (!ck->tst[i]) {
            ck_file *cf = file_of(ck, i);
            cm_status s = cf ? ensure_file(ck, cf) : cm_set_error(CM_ERR_INTERNAL, "checkpoint: a piece without a file");
            if (s) return s;
        }
        const cm_st_tensor *ft = ck->tst[i];
        if (!ck->verified[i]) {
            cm_status s = verify_one(ck, i, ft);
            if (s) return s;
        }
        if (dst) { /* dst may be GPU memory (a model moved to a device): copied there */
            char *d = (char *)dst + (size_t)(x - a) * es;
            cm_status s = cmi_dev_memcpy(d, cmi_ptr_device(d), (const char *)ft->data + (size_t)(x - t->begin) * es,
                                         CM_DEVICE_CPU, (size_t)(y - x) * es);
            if (s) return s;
        }
    }
    return CM_OK;
}

const char *cm_checkpoint_path(const cm_checkpoint *ck) { return ck->path; }
const char *cm_checkpoint_manifest(const cm_checkpoint *ck) { return ck->text; }
const char *cm_checkpoint_run_name(const cm_checkpoint *ck) { return ck->run_name; }
const cm_timestamp *cm_checkpoint_timestamp(const cm_checkpoint *ck) { return &ck->ts; }
bool cm_checkpoint_weights_only(const cm_checkpoint *ck) { return ck->weights_only; }
uint64_t cm_checkpoint_config_digest(const cm_checkpoint *ck) { return ck->config_digest; }
size_t cm_checkpoint_n_tensors(const cm_checkpoint *ck) { return ck->n_tensors; }

cm_status cm_checkpoint_tensor(const cm_checkpoint *ck, size_t i, cm_ckpt_tensor *out) {
    if (!ck || i >= ck->n_tensors)
        return cm_set_error(CM_ERR_INVALID_ARG, "checkpoint tensor %zu: out of range (%zu tensors)", i,
                            ck ? ck->n_tensors : 0);
    *out = ck->tensors[i];
    return CM_OK;
}

const cm_safetensors *cm_checkpoint_file(const cm_checkpoint *ck, const char *file) {
    for (int i = 0; ck && file && i < ck->n_files; i++)
        if (!strcmp(ck->files[i].name, file)) return ck->files[i].st;
    return NULL;
}

/* cJSON item of the manifest root, for the trainer's loader. */
const cJSON *cmi_checkpoint_root(const cm_checkpoint *ck);
const cJSON *cmi_checkpoint_root(const cm_checkpoint *ck) { return ck->root; }

static cm_status export_model(cm_checkpoint *ck, const char *out_path, const char *rec);

/* The surgery record (surgery_algorithms.h, CM_SURGERY_METADATA_KEY) of the manifest's
 * required-on-load algorithms: *out NULL when there are none, else cJSON_free it. */
static cm_status required_record(const cm_checkpoint *ck, char **out) {
    *out = NULL;
    cJSON *arr = cJSON_CreateArray();
    const cJSON *it;
    bool ok = arr != NULL;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(ck->root, "algorithms")) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name"),
                    *hp = cJSON_GetObjectItemCaseSensitive(it, "hparams");
        if (!ok || !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "required_on_load")) || !cJSON_IsString(name) ||
            !cJSON_IsObject(hp))
            continue;
        cJSON *o = cJSON_CreateObject(), *h = NULL;
        if (!o || !cJSON_AddItemToArray(arr, o)) {
            cJSON_Delete(o);
            ok = false;
        } else if (!cJSON_AddStringToObject(o, "name", name->valuestring) || !(h = cJSON_Duplicate(hp, true)) ||
                   !cJSON_AddItemToObject(o, "hparams", h)) {
            cJSON_Delete(h);
            ok = false;
        }
    }
    if (ok && cJSON_GetArraySize(arr) > 0) ok = (*out = cJSON_PrintUnformatted(arr)) != NULL;
    cJSON_Delete(arr);
    return ok ? CM_OK : cm_set_error(CM_ERR_OOM, "export: out of memory");
}

cm_status cm_checkpoint_export_model(cm_checkpoint *ck, const char *out_path) {
    if (!ck || !out_path) return cm_set_error(CM_ERR_INVALID_ARG, "cm_checkpoint_export_model: NULL argument");
    char *rec = NULL;
    cm_status rs = required_record(ck, &rec);
    if (rs) return rs;
    rs = export_model(ck, out_path, rec);
    cJSON_free(rec);
    return rs;
}

/* The model's tensors to out_path, with the surgery record `rec` (NULL: none) in the metadata. */
static cm_status export_model(cm_checkpoint *ck, const char *out_path, const char *rec) {
    if (ck->sharded) {
        /* assemble every model tensor from its pieces (each piece verified) into one file */
        const size_t n = cmi_ck_n_global(ck, CMI_CK_KIND_MODEL);
        void **bufs = cm_alloc_zeroed(sizeof *bufs * (n ? n : 1), 16);
        cm_safetensors_writer *w = NULL;
        cm_status s = bufs ? cm_safetensors_writer_new(&w) : CM_ERR_OOM;
        if (!s) s = cm_safetensors_writer_add_metadata(w, "format", "pt");
        if (!s && rec) s = cm_safetensors_writer_add_metadata(w, CM_SURGERY_METADATA_KEY, rec);
        for (size_t k = 0; !s && k < n; k++) {
            cmi_ck_global g;
            const char *name = cmi_ck_global_name(ck, CMI_CK_KIND_MODEL, k);
            cmi_ck_find(ck, CMI_CK_KIND_MODEL, name, &g);
            const size_t nb = (size_t)g.numel * (size_t)(cm_st_dtype_bits(g.dtype) / 8);
            if (!(bufs[k] = cm_alloc(nb ? nb : 1, 64))) {
                s = cm_set_error(CM_ERR_OOM, "export: out of memory for '%s' (%zu bytes)", name, nb);
                break;
            }
            if ((s = cmi_ck_read_range(ck, CMI_CK_KIND_MODEL, name, 0, g.numel, bufs[k]))) break;
            s = cm_safetensors_writer_add_raw(w, name, g.dtype, g.ndim, g.shape, bufs[k], nb);
        }
        if (!s) s = cm_safetensors_writer_write(w, out_path);
        cm_safetensors_writer_free(w);
        for (size_t k = 0; bufs && k < n; k++) cm_free(bufs[k]);
        cm_free(bufs);
        if (s == CM_ERR_OOM && !strstr(cm_last_error(), "export")) cm_set_error(s, "export: out of memory");
        return s;
    }
    const cm_safetensors *st = cm_checkpoint_file(ck, CM_CKPT_MODEL_FILE);
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const cm_ckpt_tensor *t = &ck->tensors[i];
        if (strcmp(t->file, CM_CKPT_MODEL_FILE)) continue;
        const cm_st_tensor *ft = cm_safetensors_find(st, t->name);
        if (cm_hash64(ft->data, ft->nbytes, 0) != t->xxh3)
            return cm_set_error(CM_ERR_FORMAT, "export: checkpoint '%s': tensor '%s' is corrupt (checksum mismatch)",
                                ck->path, t->name);
    }
    if (rec) { /* the tensors again, in file order, with the record added to the metadata */
        cm_safetensors_writer *w;
        cm_status s = cm_safetensors_writer_new(&w);
        if (!s) s = cm_safetensors_writer_add_metadata(w, "format", "pt");
        if (!s) s = cm_safetensors_writer_add_metadata(w, CM_SURGERY_METADATA_KEY, rec);
        for (size_t i = 0; !s && i < cm_safetensors_count(st); i++) {
            const cm_st_tensor *t = cm_safetensors_at(st, i);
            s = cm_safetensors_writer_add_raw(w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes);
        }
        if (!s) s = cm_safetensors_writer_write(w, out_path);
        cm_safetensors_writer_free(w);
        return s;
    }
    /* the same bytes: the file was written by the reference-exact writer */
    char *src;
    size_t n;
    char *sp = cmi_path_join(ck->path, CM_CKPT_MODEL_FILE);
    if (!sp) return CM_ERR_OOM;
    cm_status s = cmi_read_file(sp, SIZE_MAX, &src, &n);
    cm_free(sp);
    if (s) return s;
    s = cmi_write_file_atomic(out_path, src, n);
    cm_free(src);
    return s;
}

/* ---- summary ---- */

typedef struct sbuf {
    char *p;
    size_t cap, len;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->len < b->cap ? b->p + b->len : NULL, b->len < b->cap ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (k > 0) b->len += (size_t)k;
}

/* "2, 3, 4": a shape for the summaries. */
static void shape_text(int ndim, const int64_t *shape, char *out, size_t cap) {
    size_t o = 0;
    out[0] = 0;
    for (int d = 0; d < ndim && o < cap; d++)
        o += (size_t)snprintf(out + o, cap - o, "%s%lld", d ? ", " : "", (long long)shape[d]);
}

/* " (required on load: name value, ...)" of a method's recorded arguments. */
static void sb_required(sbuf *b, const cJSON *hp) {
    const cJSON *h;
    sb_printf(b, " (required on load");
    int j = 0;
    cJSON_ArrayForEach(h, hp) {
        char *hv = cJSON_PrintUnformatted(h);
        sb_printf(b, "%s%s %s", j++ ? ", " : ": ", h->string, hv ? hv : "?");
        cJSON_free(hv);
    }
    sb_printf(b, ")");
}

cm_status cm_weights_summary(const char *path, char **out) {
    if (!path || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_weights_summary: NULL argument");
    *out = NULL;
    cm_safetensors *st;
    cm_status s = cm_safetensors_open(path, &st);
    if (s) return s;
    sbuf b = {NULL, 0, 0};
    char *text = NULL;
    for (int pass = 0; pass < 2; pass++) { /* measure, then write */
        if (pass) {
            if (!(text = cm_alloc(b.len + 1, 1))) {
                cm_safetensors_close(st);
                return cm_set_error(CM_ERR_OOM, "summary of '%s': out of memory", path);
            }
            b = (sbuf){text, b.len + 1, 0};
        }
        const size_t n = cm_safetensors_count(st);
        uint64_t data = 0;
        for (size_t i = 0; i < n; i++) data += cm_safetensors_at(st, i)->nbytes;
        sb_printf(&b, "weights     %s\n", path);
        sb_printf(&b, "file        safetensors, %zu tensors, %" PRIu64 " bytes of data\n", n, data);
        /* the surgery the weights were trained with (surgery_algorithms.h), then other metadata */
        const char *rec = cm_safetensors_metadata_get(st, CM_SURGERY_METADATA_KEY);
        cJSON *arr = rec ? cJSON_Parse(rec) : NULL, *e;
        sb_printf(&b, "algorithms ");
        int k = 0;
        cJSON_ArrayForEach(e, arr) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
            sb_printf(&b, "%s%s", k++ ? ", " : " ", cJSON_IsString(nm) ? nm->valuestring : "?");
            sb_required(&b, cJSON_GetObjectItemCaseSensitive(e, "hparams"));
        }
        cJSON_Delete(arr);
        sb_printf(&b, "%s\n", k ? "" : rec ? " (unreadable record)" : " no surgery recorded");
        for (size_t i = 0; i < cm_safetensors_metadata_count(st); i++) {
            const char *key, *val;
            if (cm_safetensors_metadata_at(st, i, &key, &val) || !strcmp(key, CM_SURGERY_METADATA_KEY)) continue;
            sb_printf(&b, "metadata    %s: %.200s\n", key, val);
        }
        int wn = 0;
        for (size_t i = 0; i < n; i++) {
            const int c = (int)strlen(cm_safetensors_at(st, i)->name);
            wn = c > wn ? c : wn;
        }
        for (size_t i = 0; i < n; i++) {
            const cm_st_tensor *t = cm_safetensors_at(st, i);
            char shape[160];
            shape_text(t->ndim, t->shape, shape, sizeof shape);
            sb_printf(&b, "  %-*s  %-4s (%s) %zu bytes\n", wn, t->name, cm_st_dtype_name(t->dtype), shape, t->nbytes);
        }
    }
    cm_safetensors_close(st);
    *out = text;
    return CM_OK;
}

size_t cm_checkpoint_summary(const cm_checkpoint *ck, char *buf, size_t cap) {
    sbuf b = {buf, cap, 0};
    if (buf && cap) buf[0] = 0;
    const cJSON *lib = cJSON_GetObjectItemCaseSensitive(ck->root, "library");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(lib, "version"), *g = cJSON_GetObjectItemCaseSensitive(lib, "git_commit");
    const cJSON *cr = cJSON_GetObjectItemCaseSensitive(ck->root, "created");
    sb_printf(&b, "checkpoint  %s\nformat      %d (composer %s, commit %s), created %s\n", ck->path, CM_CKPT_FORMAT_VERSION,
              cJSON_IsString(v) ? v->valuestring : "?", cJSON_IsString(g) ? g->valuestring : "?",
              cJSON_IsString(cr) ? cr->valuestring : "?");
    sb_printf(&b, "run         %s%s\n", ck->run_name, ck->weights_only ? " (weights only)" : "");
    sb_printf(&b, "step        epoch %lld, batch %lld (batch %lld of the epoch), samples %lld, tokens %lld\n",
              (long long)ck->ts.epoch, (long long)ck->ts.batch, (long long)ck->ts.batch_in_epoch,
              (long long)ck->ts.sample, (long long)ck->ts.token);
    sb_printf(&b, "config      xxh3 %016" PRIx64 "\n", ck->config_digest);
    sb_printf(&b, "layout      %s, saved by %d rank%s\n", ck->sharded ? "sharded" : "monolithic", ck->world_size,
              ck->world_size == 1 ? "" : "s");
    /* what the run was trained with: the algorithms (the surgery a load re-applies marked, with
     * its arguments) and the callbacks whose state the checkpoint carries */
    static const char *const lists[] = {"algorithms", "callbacks"};
    for (int l = 0; l < 2; l++) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(ck->root, lists[l]), *e;
        if (!cJSON_IsArray(arr)) continue;
        sb_printf(&b, "%-11s", lists[l]);
        int k = 0;
        cJSON_ArrayForEach(e, arr) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
            sb_printf(&b, "%s%s", k++ ? ", " : " ", cJSON_IsString(nm) ? nm->valuestring : "?");
            if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "required_on_load")))
                sb_required(&b, cJSON_GetObjectItemCaseSensitive(e, "hparams"));
        }
        sb_printf(&b, "%s\n", k ? "" : " none");
    }
    for (int i = 0; i < ck->n_files; i++) {
        size_t n = 0;
        for (size_t k = 0; k < ck->n_tensors; k++) n += !strcmp(ck->tensors[k].file, ck->files[i].name);
        sb_printf(&b, "file        %s: %" PRIu64 " bytes, %zu tensors\n", ck->files[i].name, ck->files[i].size, n);
    }
    int wf = 0, wn = 0; /* column widths: the longest file and tensor names */
    for (size_t k = 0; k < ck->n_tensors; k++) {
        int a = (int)strlen(ck->tensors[k].file), c = (int)strlen(ck->tensors[k].name);
        wf = a > wf ? a : wf;
        wn = c > wn ? c : wn;
    }
    for (size_t k = 0; k < ck->n_tensors; k++) {
        const cm_ckpt_tensor *t = &ck->tensors[k];
        char shape[160];
        shape_text(t->ndim, t->shape, shape, sizeof shape);
        if (ck->sharded) {
            char gshape[160];
            shape_text(t->global_ndim, t->global_shape, gshape, sizeof gshape);
            sb_printf(&b, "  %-*s  %-*s  %-4s [%lld, %lld) of (%s) %" PRIu64 " bytes\n", wf, t->file, wn, t->name,
                      cm_st_dtype_name(t->dtype), (long long)t->begin, (long long)t->end, gshape, t->nbytes);
            continue;
        }
        sb_printf(&b, "  %-*s  %-*s  %-4s (%s) %" PRIu64 " bytes\n", wf, t->file, wn, t->name, cm_st_dtype_name(t->dtype),
                  shape, t->nbytes);
    }
    return b.len;
}

/* ---- search ---- */

typedef struct cand {
    char name[256];
    int64_t batch, epoch;
    bool pointed;
} cand;

static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->batch != y->batch) return x->batch > y->batch ? -1 : 1;
    if (x->epoch != y->epoch) return x->epoch > y->epoch ? -1 : 1;
    if (x->pointed != y->pointed) return x->pointed ? -1 : 1;
    return -strcmp(x->name, y->name);
}

static void reject(cm_checkpoint_search *out, const char *name, const char *why) {
    cm_log_msg(CM_LOG_WARN, "checkpoint search: skipping '%s': %s", name, why);
    out->n_rejected++;
    size_t n = strlen(out->rejected);
    if (n + 4 >= sizeof out->rejected) return;
    int k = snprintf(out->rejected + n, sizeof out->rejected - n, "%s%s: %s", n ? "; " : "", name, why);
    if (k < 0 || (size_t)k >= sizeof out->rejected - n) strcpy(out->rejected + sizeof out->rejected - 4, "...");
}

cm_status cm_checkpoint_find_latest(const char *folder, const char *latest_name, cm_checkpoint_search *out) {
    if (!folder || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_checkpoint_find_latest: NULL argument");
    memset(out, 0, sizeof *out);
    DIR *d = opendir(folder);
    if (!d) return cm_set_error(CM_ERR_NOT_FOUND, "no checkpoint in '%s': %s", folder, strerror(errno));
    char pointed[256] = "";
    cm_status ps = read_pointer(folder, latest_name, pointed, sizeof pointed);
    if (ps && ps != CM_ERR_NOT_FOUND) reject(out, latest_name ? latest_name : CM_CKPT_LATEST_DEFAULT, cm_last_error());
    cand *cs = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    cm_status s = CM_OK;
    while ((e = readdir(d))) {
        if (!plain_name(e->d_name)) continue; /* ".", "..", ".tmp-*" saves in progress */
        char *p = cmi_path_join(folder, e->d_name);
        if (!p) {
            s = CM_ERR_OOM;
            break;
        }
        bool dir = cmi_is_dir(p);
        cm_checkpoint *ck = NULL;
        cm_status os = dir ? cm_checkpoint_open(p, &ck) : CM_OK;
        cm_free(p);
        if (!dir) continue;
        if (os) {
            /* a folder that never was a checkpoint (no manifest, no model file) is not a candidate */
            char *mp = cmi_path_join(folder, e->d_name), *m1 = mp ? cmi_path_join(mp, CM_CKPT_MANIFEST) : NULL,
                 *m2 = mp ? cmi_path_join(mp, CM_CKPT_MODEL_FILE) : NULL;
            const bool looks = m1 && m2 && (access(m1, F_OK) == 0 || access(m2, F_OK) == 0);
            cm_free(mp);
            cm_free(m1);
            cm_free(m2);
            if (looks) reject(out, e->d_name, cm_last_error());
            continue;
        }
        if (n == cap) {
            int nc = cap ? 2 * cap : 8;
            cand *ncs = cm_alloc(sizeof *ncs * (size_t)nc, 16);
            if (!ncs) {
                cm_checkpoint_close(ck);
                s = CM_ERR_OOM;
                break;
            }
            if (cs) memcpy(ncs, cs, sizeof *cs * (size_t)n);
            cm_free(cs);
            cs = ncs, cap = nc;
        }
        snprintf(cs[n].name, sizeof cs[n].name, "%s", e->d_name);
        cs[n].batch = ck->ts.batch;
        cs[n].epoch = ck->ts.epoch;
        cs[n].pointed = !strcmp(e->d_name, pointed);
        n++;
        cm_checkpoint_close(ck);
    }
    closedir(d);
    if (s) {
        cm_free(cs);
        return cm_set_error(s, "checkpoint search in '%s': out of memory", folder);
    }
    if (pointed[0] && !ps) {
        bool seen = false;
        for (int i = 0; i < n; i++) seen |= cs[i].pointed;
        char *pp = cmi_path_join(folder, pointed);
        if (!seen && pp && !cmi_is_dir(pp)) reject(out, pointed, "named by the latest pointer but missing");
        cm_free(pp);
    }
    if (n) qsort(cs, (size_t)n, sizeof *cs, cand_cmp);
    for (int i = 0; i < n; i++) {
        char *p = cmi_path_join(folder, cs[i].name);
        if (!p) break;
        cm_checkpoint *ck;
        cm_status vs = cm_checkpoint_open(p, &ck);
        if (!vs) vs = cm_checkpoint_verify(ck);
        cm_checkpoint_close(ck);
        if (!vs) {
            snprintf(out->path, sizeof out->path, "%s", p);
            cm_free(p);
            cm_free(cs);
            return CM_OK;
        }
        reject(out, cs[i].name, cm_last_error());
        cm_free(p);
    }
    cm_free(cs);
    return cm_set_error(CM_ERR_NOT_FOUND, "no complete checkpoint in '%s'%s%s", folder, out->n_rejected ? "; rejected: " : "",
                        out->rejected);
}

/* ---- names ---- */

cm_status cm_checkpoint_format_name(const char *pattern, const cm_timestamp *ts, const char *run_name, int rank,
                                    char *buf, size_t cap) {
    if (!pattern || !ts || !buf || cap == 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_checkpoint_format_name: NULL argument");
    size_t o = 0;
    for (const char *p = pattern; *p;) {
        char piece[300];
        if (*p == '{') {
            const char *end = strchr(p, '}');
            if (!end) return cm_set_error(CM_ERR_INVALID_ARG, "save_filename '%s': unclosed '{'", pattern);
            size_t k = (size_t)(end - p - 1);
#define IS(w) (k == strlen(w) && !strncmp(p + 1, w, k))
            if (IS("epoch")) snprintf(piece, sizeof piece, "%lld", (long long)ts->epoch);
            else if (IS("batch")) snprintf(piece, sizeof piece, "%lld", (long long)ts->batch);
            else if (IS("sample")) snprintf(piece, sizeof piece, "%lld", (long long)ts->sample);
            else if (IS("token")) snprintf(piece, sizeof piece, "%lld", (long long)ts->token);
            else if (IS("rank")) snprintf(piece, sizeof piece, "%d", rank);
            else if (IS("run_name")) snprintf(piece, sizeof piece, "%s", run_name ? run_name : "");
            else
                return cm_set_error(CM_ERR_INVALID_ARG, "save_filename '%s': unknown placeholder '{%.*s}' (use {epoch}, "
                                                        "{batch}, {sample}, {token}, {run_name} or {rank})",
                                    pattern, (int)k, p + 1);
#undef IS
            p = end + 1;
        } else {
            piece[0] = *p++;
            piece[1] = 0;
        }
        size_t k = strlen(piece);
        if (o + k + 1 > cap || o + k > 255)
            return cm_set_error(CM_ERR_INVALID_ARG, "save_filename '%s': the name is too long", pattern);
        memcpy(buf + o, piece, k);
        o += k;
    }
    buf[o] = 0;
    if (!plain_name(buf))
        return cm_set_error(CM_ERR_INVALID_ARG, "save_filename '%s' gives '%s': a checkpoint name must be non-empty, "
                                                "have no '/' and not start with '.'", pattern, buf);
    return CM_OK;
}

int cm_exit_status(cm_status s, int signal) {
    if (s == CM_OK) return 0;
    if (s == CM_ERR_INTERRUPTED && signal > 0 && signal < 128) return 128 + signal;
    return 1;
}
