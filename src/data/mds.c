/* MDS: column encodings, index.json, shards, the writer and the local reader.
 *
 * The layouts follow MosaicML Streaming (streaming/base/format/mds/{encodings,writer,reader}.py,
 * format/base/{writer,reader}.py): a shard is u32 n, u32 offsets[n + 1] (absolute), the writer's
 * config as JSON, then the records; a record is a u32 size for every variable-size column (in
 * column order) followed by every column's bytes. Columns are sorted by name. Both JSON texts are
 * Python's json.dumps(obj, sort_keys=True), which cmi_buf_json_str and the emitters below
 * reproduce byte for byte. */
#define _GNU_SOURCE /* nftw */
#include "mds_impl.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/json.h"
#include "formats.h"

/* ---- encodings ---------------------------------------------------------------------------- */

static const struct {
    const char *name;
    cm_mds_dtype dt;
} k_kinds[CM_MDS_KIND_COUNT] = {
#define CM_X_(e, name, dt) {name, dt},
    CM_MDS_KIND_LIST(CM_X_)
#undef CM_X_
};
_Static_assert(sizeof k_kinds / sizeof k_kinds[0] == CM_MDS_KIND_COUNT, "one row per MDS kind");

static const struct {
    cm_mds_dtype dt;
    const char *name;
    size_t size;
} k_dtypes[] = {
    {CM_MDS_DT_U8, "uint8", 1},    {CM_MDS_DT_I8, "int8", 1},     {CM_MDS_DT_U16, "uint16", 2},
    {CM_MDS_DT_I16, "int16", 2},   {CM_MDS_DT_F16, "float16", 2}, {CM_MDS_DT_U32, "uint32", 4},
    {CM_MDS_DT_I32, "int32", 4},   {CM_MDS_DT_F32, "float32", 4}, {CM_MDS_DT_U64, "uint64", 8},
    {CM_MDS_DT_I64, "int64", 8},   {CM_MDS_DT_F64, "float64", 8},
};

const char *cm_mds_dtype_name(cm_mds_dtype dt) {
    for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0]; i++)
        if (k_dtypes[i].dt == dt) return k_dtypes[i].name;
    return NULL;
}

size_t cm_mds_dtype_size(cm_mds_dtype dt) {
    for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0]; i++)
        if (k_dtypes[i].dt == dt) return k_dtypes[i].size;
    return 0;
}

static bool dtype_from_name(const char *s, size_t n, cm_mds_dtype *out) {
    for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0]; i++)
        if (strlen(k_dtypes[i].name) == n && strncmp(k_dtypes[i].name, s, n) == 0) {
            *out = k_dtypes[i].dt;
            return true;
        }
    return false;
}

static cm_status bad_encoding(const char *text, const char *why) {
    return cm_set_error(CM_ERR_INVALID_ARG,
                        "MDS encoding '%s': %s (encodings: bytes, str, int, uint8, uint16, uint32, uint64, int8, int16, "
                        "int32, int64, float16, float32, float64, str_int, str_float, str_decimal, pil, jpeg, "
                        "jpeg_array, png, list[pil], list[jpeg], list[png], pkl, json, "
                        "ndarray[:dtype[:d0,d1,...]])",
                        text, why);
}

cm_status cm_mds_encoding_parse(const char *text, cm_mds_encoding *out) {
    memset(out, 0, sizeof *out);
    out->ndim = -1;
    out->size = -1;
    if (!text) return bad_encoding("(null)", "no encoding");
    const char *colon = strchr(text, ':');
    size_t nlen = colon ? (size_t)(colon - text) : strlen(text);
    int kind = -1;
    for (int k = 0; k < CM_MDS_KIND_COUNT; k++)
        if (strlen(k_kinds[k].name) == nlen && strncmp(text, k_kinds[k].name, nlen) == 0) kind = k;
    if (nlen == 9 && strncmp(text, "jpegarray", 9) == 0) kind = CM_MDS_JPEG_ARRAY;
    if (kind < 0) return bad_encoding(text, "unknown encoding");
    out->kind = (cm_mds_kind)kind;
    out->dtype = k_kinds[kind].dt;
    if (out->dtype != CM_MDS_DT_NONE) out->size = (int64_t)cm_mds_dtype_size(out->dtype);
    if (!colon) return CM_OK;
    if (kind != CM_MDS_NDARRAY) return bad_encoding(text, "only ndarray takes arguments after ':'");
    const char *args = colon + 1;
    if (!*args) return CM_OK; /* "ndarray:" is the dynamic form, as Python's split gives [] */
    const char *c2 = strchr(args, ':');
    size_t dlen = c2 ? (size_t)(c2 - args) : strlen(args);
    if (!dtype_from_name(args, dlen, &out->dtype))
        return bad_encoding(text, "the ndarray dtype must be uint8, int8, uint16, int16, float16, uint32, int32, "
                                  "float32, uint64, int64 or float64");
    if (!c2) return CM_OK;
    const char *sh = c2 + 1;
    int nd = 0;
    int64_t numel = 1;
    for (;;) {
        char *end;
        if (*sh < '0' || *sh > '9') return bad_encoding(text, "the shape must be dims >= 1 separated by commas");
        errno = 0;
        long long d = strtoll(sh, &end, 10);
        if (errno || d < 1) return bad_encoding(text, "every dim of the shape must be >= 1");
        if (nd == CM_MDS_MAX_NDIM) return bad_encoding(text, "more dims than this library supports (16)");
        out->shape[nd++] = d;
        if (numel > INT64_MAX / d) return bad_encoding(text, "the shape is too large");
        numel *= d;
        if (*end == '\0') break;
        if (*end != ',') return bad_encoding(text, "the shape must be dims >= 1 separated by commas");
        sh = end + 1;
    }
    out->ndim = nd;
    out->size = numel * (int64_t)cm_mds_dtype_size(out->dtype);
    return CM_OK;
}

/* PIL modes and the bytes per pixel of their tobytes() ("1" is packed: 0 here, see pil_row_bytes).
 * Read values point `mode` at these literals, so it stays valid and terminated. */
static const struct {
    const char *m;
    int bpp;
} k_pil_modes[] = {{"1", 0},     {"L", 1},    {"P", 1},     {"LA", 2},    {"PA", 2},    {"La", 2},  {"RGB", 3},
                   {"YCbCr", 3}, {"LAB", 3},  {"HSV", 3},   {"RGBA", 4},  {"RGBa", 4},  {"RGBX", 4}, {"CMYK", 4},
                   {"I", 4},     {"F", 4},    {"I;16", 2},  {"I;16B", 2}, {"I;16L", 2}};

static int pil_mode_find(const char *m, size_t n) {
    for (size_t i = 0; i < sizeof k_pil_modes / sizeof k_pil_modes[0]; i++)
        if (strlen(k_pil_modes[i].m) == n && memcmp(k_pil_modes[i].m, m, n) == 0) return (int)i;
    return -1;
}

static size_t pil_row_bytes(int mode, int64_t w) {
    if (mode == 0) return (size_t)((w + 7) / 8);
    return (size_t)w * (size_t)k_pil_modes[mode].bpp;
}

/* Reads a pil value's header: width, height, mode; the pixels follow. */
static cm_status pil_parse(const uint8_t *p, size_t n, cm_mds_value *v, const char *what) {
    if (n < 12) return cm_set_error(CM_ERR_FORMAT, "%s: a pil value of %zu bytes (the header alone is 12)", what, n);
    uint32_t w, h, ml;
    memcpy(&w, p, 4);
    memcpy(&h, p + 4, 4);
    memcpy(&ml, p + 8, 4);
    if (ml == 0 || 12 + (size_t)ml > n)
        return cm_set_error(CM_ERR_FORMAT, "%s: a pil value with a mode of %u bytes in %zu", what, ml, n);
    int mode = pil_mode_find((const char *)p + 12, ml);
    if (mode < 0)
        return cm_set_error(CM_ERR_UNSUPPORTED, "%s: a pil image of mode '%.*s', which this library does not know",
                            what, (int)(ml > 16 ? 16 : ml), (const char *)p + 12);
    size_t rb = pil_row_bytes(mode, w);
    size_t px = n - 12 - ml;
    if (rb * (size_t)h != px)
        return cm_set_error(CM_ERR_FORMAT, "%s: a pil image %ux%u of mode %s needs %zu bytes of pixels, it has %zu",
                            what, w, h, k_pil_modes[mode].m, rb * (size_t)h, px);
    v->data = p + 12 + ml;
    v->size = px;
    v->ndim = 2;
    v->shape[0] = h;
    v->shape[1] = w;
    v->mode = k_pil_modes[mode].m;
    return CM_OK;
}

/* Decodes a list header: (placeholder u32 for list[...]), count, sizes. */
static cm_status list_parse(cm_mds_kind kind, const uint8_t *p, size_t n, int64_t *count, size_t *hdr,
                            const char *what) {
    size_t o = kind == CM_MDS_JPEG_ARRAY ? 0 : 4;
    if (n < o + 4) return cm_set_error(CM_ERR_FORMAT, "%s: a list value of %zu bytes has no count", what, n);
    uint32_t c;
    memcpy(&c, p + o, 4);
    o += 4;
    if ((n - o) / 4 < c) return cm_set_error(CM_ERR_FORMAT, "%s: a list of %u elements in %zu bytes", what, c, n);
    uint64_t total = 0;
    for (uint32_t i = 0; i < c; i++) {
        uint32_t s;
        memcpy(&s, p + o + 4 * (size_t)i, 4);
        total += s;
    }
    if (o + 4 * (size_t)c + total != n)
        return cm_set_error(CM_ERR_FORMAT, "%s: a list whose element sizes add up to %llu of its %zu bytes", what,
                            (unsigned long long)(o + 4 * (size_t)c + total), n);
    *count = c;
    *hdr = o + 4 * (size_t)c;
    return CM_OK;
}

cm_status cm_mds_list_item(cm_mds_kind kind, const cm_mds_value *list, int64_t i, cm_mds_value *item) {
    memset(item, 0, sizeof *item);
    if (kind != CM_MDS_LIST_PIL && kind != CM_MDS_LIST_JPEG && kind != CM_MDS_LIST_PNG && kind != CM_MDS_JPEG_ARRAY)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_mds_list_item: encoding %s is not a list", k_kinds[kind].name);
    int64_t count;
    size_t hdr;
    cm_status st = list_parse(kind, list->data, list->size, &count, &hdr, "list");
    if (st) return st;
    if (i < 0 || i >= count)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_mds_list_item: element %lld of a list of %lld", (long long)i,
                            (long long)count);
    const uint8_t *p = list->data;
    size_t off = hdr, o0 = kind == CM_MDS_JPEG_ARRAY ? 4 : 8;
    uint32_t s = 0;
    for (int64_t k = 0; k <= i; k++) {
        memcpy(&s, p + o0 + 4 * (size_t)k, 4);
        if (k < i) off += s;
    }
    item->data = p + off;
    item->size = s;
    if (kind == CM_MDS_LIST_PIL) {
        st = pil_parse(p + off, s, item, "list[pil] element");
        if (st) return st;
    }
    return CM_OK;
}

/* ---- index.json --------------------------------------------------------------------------- */

static void file_free(cmi_mds_file *f) {
    cm_free(f->basename);
    for (int i = 0; i < f->n_hashes; i++) {
        cm_free(f->hash_names[i]);
        cm_free(f->hash_values[i]);
    }
    memset(f, 0, sizeof *f);
}

void cmi_mds_index_free(cmi_mds_index *ix) {
    if (!ix) return;
    for (int s = 0; s < ix->n_shards; s++) {
        file_free(&ix->shards[s].raw);
        file_free(&ix->shards[s].zip);
    }
    cm_free(ix->shards);
    for (int c = 0; c < ix->n_columns; c++) {
        cm_free(ix->column_names[c]);
        cm_free(ix->column_enc_text[c]);
    }
    cm_free(ix->path);
    memset(ix, 0, sizeof *ix);
}

const char *cmi_mds_file_hash(const cmi_mds_file *f, const char *algo) {
    for (int i = 0; i < f->n_hashes; i++)
        if (strcmp(f->hash_names[i], algo) == 0) return f->hash_values[i];
    return NULL;
}

static cm_status ixerr(const char *path, int s, const char *fmt, const char *arg) {
    char what[512];
    snprintf(what, sizeof what, fmt, arg);
    return cm_set_error(CM_ERR_FORMAT, "%s: shard %d: %s", path, s, what);
}

static bool json_int(const cJSON *o, const char *key, int64_t *out) {
    return cmi_json_whole(cJSON_GetObjectItemCaseSensitive(o, key), 0, INT64_MAX, out);
}

static cm_status parse_file(const cJSON *o, const char *path, int s, const char *key, cmi_mds_file *f) {
    if (!cJSON_IsObject(o)) return ixerr(path, s, "'%s' is not an object", key);
    const cJSON *bn = cJSON_GetObjectItemCaseSensitive(o, "basename");
    if (!cJSON_IsString(bn) || !*bn->valuestring || strchr(bn->valuestring, '/') || strcmp(bn->valuestring, "..") == 0)
        return ixerr(path, s, "'%s.basename' is missing or not a plain file name", key);
    if (!json_int(o, "bytes", &f->bytes)) return ixerr(path, s, "'%s.bytes' is missing or not a byte count", key);
    if (!(f->basename = cmi_mds_strdup(bn->valuestring))) return CM_ERR_OOM;
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(o, "hashes");
    if (h && !cJSON_IsObject(h)) return ixerr(path, s, "'%s.hashes' is not an object", key);
    const cJSON *e;
    cJSON_ArrayForEach(e, h) {
        if (!cJSON_IsString(e)) return ixerr(path, s, "'%s.hashes' holds a value that is not a string", key);
        if (f->n_hashes == CMI_MDS_MAX_HASHES) return ixerr(path, s, "'%s.hashes' has too many entries", key);
        f->hash_names[f->n_hashes] = cmi_mds_strdup(e->string);
        f->hash_values[f->n_hashes] = cmi_mds_strdup(e->valuestring);
        if (!f->hash_names[f->n_hashes] || !f->hash_values[f->n_hashes]) return CM_ERR_OOM;
        f->n_hashes++;
    }
    return CM_OK;
}

static cm_status parse_shard(const cJSON *sh, const char *path, int s, cmi_mds_index *ix) {
    cmi_mds_shard_info *si = &ix->shards[s];
    if (!cJSON_IsObject(sh)) return ixerr(path, s, "%s", "not an object");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(sh, "format");
    if (!cJSON_IsString(fmt)) return ixerr(path, s, "%s", "no 'format'");
    if (strcmp(fmt->valuestring, "mds") != 0)
        return cm_set_error(CM_ERR_UNSUPPORTED, "%s: shard %d has format '%s'; only 'mds' is read here (convert the "
                                                "dataset to MDS)", path, s, fmt->valuestring);
    int64_t ver;
    if (!json_int(sh, "version", &ver) || ver != 2) return ixerr(path, s, "%s", "'version' is not 2");
    if (!json_int(sh, "samples", &si->samples)) return ixerr(path, s, "%s", "'samples' is missing or negative");
    const cJSON *comp = cJSON_GetObjectItemCaseSensitive(sh, "compression");
    int level;
    const char *ext;
    if (comp && !cJSON_IsNull(comp)) {
        if (!cJSON_IsString(comp) || !cmi_mds_compression_parse(comp->valuestring, &si->zfam, &level, &ext))
            return ixerr(path, s, "unknown compression '%s' (Streaming's are br, bz2, gz, snappy, zstd[:level])",
                         cJSON_IsString(comp) ? comp->valuestring : "?");
    }
    cm_status st = parse_file(cJSON_GetObjectItemCaseSensitive(sh, "raw_data"), path, s, "raw_data", &si->raw);
    if (st) return st;
    const cJSON *zd = cJSON_GetObjectItemCaseSensitive(sh, "zip_data");
    if (zd && !cJSON_IsNull(zd)) {
        if ((st = parse_file(zd, path, s, "zip_data", &si->zip))) return st;
        si->has_zip = true;
        if (si->zfam == CMI_Z_NONE) return ixerr(path, s, "%s", "has zip_data but no compression");
    } else if (si->zfam != CMI_Z_NONE) {
        return ixerr(path, s, "%s", "has a compression but no zip_data");
    }
    if (si->raw.bytes > UINT32_MAX) return ixerr(path, s, "%s", "a raw shard of 4 GiB or more (offsets are u32)");
    /* columns: every shard must agree with the first */
    const cJSON *encs = cJSON_GetObjectItemCaseSensitive(sh, "column_encodings");
    const cJSON *names = cJSON_GetObjectItemCaseSensitive(sh, "column_names");
    const cJSON *sizes = cJSON_GetObjectItemCaseSensitive(sh, "column_sizes");
    int nc = cJSON_GetArraySize(encs);
    if (!cJSON_IsArray(encs) || !cJSON_IsArray(names) || !cJSON_IsArray(sizes) || nc < 1 ||
        cJSON_GetArraySize(names) != nc || cJSON_GetArraySize(sizes) != nc)
        return ixerr(path, s, "%s", "column_encodings, column_names and column_sizes must be arrays of one length");
    if (nc > CM_MDS_MAX_COLUMNS) return ixerr(path, s, "%s", "more than 64 columns");
    if (s > 0 && nc != ix->n_columns) return ixerr(path, s, "%s", "its columns differ from shard 0's");
    for (int c = 0; c < nc; c++) {
        const cJSON *e = cJSON_GetArrayItem(encs, c), *n = cJSON_GetArrayItem(names, c), *z = cJSON_GetArrayItem(sizes, c);
        if (!cJSON_IsString(e) || !cJSON_IsString(n)) return ixerr(path, s, "%s", "a column name or encoding is not a string");
        if (s > 0) {
            if (strcmp(e->valuestring, ix->column_enc_text[c]) || strcmp(n->valuestring, ix->column_names[c]))
                return ixerr(path, s, "column '%s' differs from shard 0's columns", n->valuestring);
            continue;
        }
        cm_mds_encoding enc;
        if (cm_mds_encoding_parse(e->valuestring, &enc) != CM_OK) {
            char msg[600];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            return cm_set_error(CM_ERR_FORMAT, "%s: column '%s': %s", path, n->valuestring, msg);
        }
        bool fixed = enc.size >= 0;
        int64_t zsize;
        if (fixed ? !(cmi_json_whole(z, 0, INT64_MAX, &zsize) && zsize == enc.size) : !cJSON_IsNull(z))
            return ixerr(path, s, "column '%s' has a column_size that disagrees with its encoding", n->valuestring);
        ix->columns[c] = enc;
        if (!(ix->column_names[c] = cmi_mds_strdup(n->valuestring)) || !(ix->column_enc_text[c] = cmi_mds_strdup(e->valuestring)))
            return CM_ERR_OOM;
        ix->n_columns = c + 1;
    }
    return CM_OK;
}

cm_status cmi_mds_index_parse(const char *text, size_t len, const char *path, cmi_mds_index *ix) {
    memset(ix, 0, sizeof *ix);
    ix->index_bytes = (int64_t)len;
    if (!(ix->path = cmi_mds_strdup(path))) return CM_ERR_OOM;
    cJSON *root = cJSON_ParseWithLength(text, len);
    cm_status st = CM_OK;
    if (!root) {
        st = cm_set_error(CM_ERR_FORMAT, "%s: not valid JSON (empty or corrupt index: rewrite or download it again)", path);
        goto done;
    }
    int64_t ver;
    if (!json_int(root, "version", &ver) || ver != 2) {
        st = cm_set_error(CM_ERR_FORMAT, "%s: unsupported streaming data version (expected 2)", path);
        goto done;
    }
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(root, "shards");
    int n = cJSON_GetArraySize(shards);
    if (!cJSON_IsArray(shards) || n < 1) {
        st = cm_set_error(CM_ERR_FORMAT, "%s: 'shards' is missing or empty", path);
        goto done;
    }
    if (!(ix->shards = cm_alloc_zeroed(sizeof *ix->shards * (size_t)n, 16))) {
        st = CM_ERR_OOM;
        goto done;
    }
    ix->n_shards = n;
    for (int s = 0; s < n; s++) {
        if ((st = parse_shard(cJSON_GetArrayItem(shards, s), path, s, ix))) goto done;
        ix->shards[s].sample_offset = ix->n_samples;
        ix->n_samples += ix->shards[s].samples;
    }
done:
    cJSON_Delete(root);
    if (st) cmi_mds_index_free(ix);
    return st;
}

int cmi_mds_index_locate(const cmi_mds_index *ix, int64_t index, int64_t *local) {
    int lo = 0, hi = ix->n_shards - 1;
    while (lo < hi) { /* the last shard whose offset <= index (empty shards are skipped) */
        int mid = (lo + hi + 1) / 2;
        if (ix->shards[mid].sample_offset <= index) lo = mid;
        else hi = mid - 1;
    }
    while (lo > 0 && ix->shards[lo].samples == 0) lo--;
    *local = index - ix->shards[lo].sample_offset;
    return lo;
}

/* ---- shards ------------------------------------------------------------------------------- */

cm_status cmi_mds_check_hash(const cmi_mds_file *f, const char *algo, const void *data, size_t n, const char *path) {
    const char *want = cmi_mds_file_hash(f, algo);
    if (!want)
        return cm_set_error(CM_ERR_INVALID_ARG, "shard '%s': validate_hash '%s' is not among the hashes index.json "
                                                "records for it (use one of those, or none)", path, algo);
    char got[160];
    cm_status st = cmi_mds_hash(algo, data, n, got);
    if (st) return st;
    if (strcmp(got, want) != 0)
        return cm_set_error(CM_ERR_FORMAT, "shard '%s': %s checksum failure: the file hashes to %s, index.json says %s "
                                           "(the file is corrupt or truncated: delete it so it is fetched again, or "
                                           "rewrite the dataset)", path, algo, got, want);
    return CM_OK;
}

cm_status cmi_mds_shard_check(const cmi_mds_index *ix, int s, const uint8_t *d, size_t size, const char *path) {
    const cmi_mds_shard_info *si = &ix->shards[s];
    if ((int64_t)size != si->raw.bytes)
        return cm_set_error(CM_ERR_FORMAT, "shard '%s' has %zu bytes, index.json says %lld (truncated or corrupt: "
                                           "delete it so it is fetched again)", path, size, (long long)si->raw.bytes);
    if (size < 8) return cm_set_error(CM_ERR_FORMAT, "shard '%s': %zu bytes cannot hold a sample table", path, size);
    uint32_t n;
    memcpy(&n, d, 4);
    if ((int64_t)n != si->samples)
        return cm_set_error(CM_ERR_FORMAT, "shard '%s' holds %u samples, index.json says %lld (corrupt shard)", path, n,
                            (long long)si->samples);
    if ((size - 4) / 4 < (size_t)n + 1)
        return cm_set_error(CM_ERR_FORMAT, "shard '%s': the offsets of %u samples do not fit its %zu bytes", path, n, size);
    uint32_t prev;
    memcpy(&prev, d + 4, 4);
    if (prev < 4 + 4 * ((size_t)n + 1) || prev > size)
        return cm_set_error(CM_ERR_FORMAT, "shard '%s': sample 0 starts at %u, inside the header or past the end", path, prev);
    for (uint32_t i = 1; i <= n; i++) {
        uint32_t o;
        memcpy(&o, d + 4 + 4 * (size_t)i, 4);
        if (o < prev || o > size)
            return cm_set_error(CM_ERR_FORMAT, "shard '%s': offset %u of sample %u is out of order or past the end (%zu)",
                                path, o, i, size);
        prev = o;
    }
    if (prev != size)
        return cm_set_error(CM_ERR_FORMAT, "shard '%s': the samples end at %u, the file at %zu", path, prev, size);
    return CM_OK;
}

static cm_status read_whole(const char *path, uint8_t **out, size_t *n) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return cm_set_error(errno == ENOENT ? CM_ERR_NOT_FOUND : CM_ERR_IO, "cannot open shard '%s': %s", path, strerror(errno));
    struct stat stt;
    if (fstat(fileno(f), &stt) != 0) {
        fclose(f);
        return cm_set_error(CM_ERR_IO, "cannot stat '%s': %s", path, strerror(errno));
    }
    size_t sz = (size_t)stt.st_size;
    uint8_t *b = cm_alloc(sz ? sz : 1, 64);
    if (!b) {
        fclose(f);
        return CM_ERR_OOM;
    }
    size_t got = fread(b, 1, sz, f);
    fclose(f);
    if (got != sz) {
        cm_free(b);
        return cm_set_error(CM_ERR_IO, "cannot read '%s'", path);
    }
    *out = b;
    *n = sz;
    return CM_OK;
}

void cmi_mds_shard_unref(cmi_mds_open_shard *sh) {
    if (!sh || __atomic_sub_fetch(&sh->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    if (sh->mapped) {
        cm_blob b = {sh->data, sh->size, 2};
        cm_blob_release(&b);
    } else {
        cm_free(sh->data);
    }
    cm_free(sh->path);
    cm_free(sh);
}

cm_status cmi_mds_shard_load(const cmi_mds_index *ix, int s, const char *dir, const char *validate_hash,
                             cmi_mds_open_shard **out) {
    *out = NULL;
    const cmi_mds_shard_info *si = &ix->shards[s];
    cmi_mds_open_shard *sh = cm_alloc_zeroed(sizeof *sh, 16);
    if (!sh) return CM_ERR_OOM;
    sh->refs = 1;
    cm_status st = CM_OK;
    char *raw = cmi_mds_path2(dir, si->raw.basename);
    if (!raw) {
        cm_free(sh);
        return CM_ERR_OOM;
    }
    struct stat stt;
    if (stat(raw, &stt) == 0 || !si->has_zip) {
        cm_blob b;
        if ((st = cm_blob_map(raw, &b))) {
            if (st == CM_ERR_NOT_FOUND)
                cm_set_error(st, "shard '%s' is missing (no remote to fetch it from, or it was evicted)", raw);
            goto fail;
        }
        sh->data = b.data;
        sh->size = b.size;
        sh->mapped = b.kind == 2;
        if (!sh->mapped) { /* cm_blob_map of an empty file: nothing mapped */
            sh->data = NULL;
        }
        sh->path = raw;
        raw = NULL;
        if ((int64_t)sh->size == si->raw.bytes && validate_hash &&
            (st = cmi_mds_check_hash(&si->raw, validate_hash, sh->data, sh->size, sh->path)))
            goto fail;
    } else {
        char *zp = cmi_mds_path2(dir, si->zip.basename);
        if (!zp) {
            st = CM_ERR_OOM;
            goto fail;
        }
        uint8_t *z = NULL;
        size_t zn = 0;
        st = read_whole(zp, &z, &zn);
        if (!st && (int64_t)zn != si->zip.bytes)
            st = cm_set_error(CM_ERR_FORMAT, "shard '%s' has %zu bytes, index.json says %lld (truncated or corrupt: "
                                             "delete it so it is fetched again)", zp, zn, (long long)si->zip.bytes);
        if (!st && validate_hash) st = cmi_mds_check_hash(&si->zip, validate_hash, z, zn, zp);
        if (!st) st = cmi_mds_decompress(si->zfam, z, zn, (size_t)si->raw.bytes, zp, &sh->data);
        cm_free(z);
        sh->size = (size_t)si->raw.bytes;
        sh->path = zp;
        if (st) goto fail;
    }
    if ((st = cmi_mds_shard_check(ix, s, sh->data, sh->size, sh->path))) goto fail;
    memcpy(&sh->n, sh->data, 4);
    cm_free(raw);
    *out = sh;
    return CM_OK;
fail:
    cm_free(raw);
    cmi_mds_shard_unref(sh);
    return st;
}

static cm_status rec_err(const cmi_mds_open_shard *sh, int64_t local, const char *col, const char *why) {
    return cm_set_error(CM_ERR_FORMAT, "shard '%s', sample %lld, column '%s': %s (corrupt shard)", sh->path,
                        (long long)local, col, why);
}

cm_status cmi_mds_shard_sample(const cmi_mds_index *ix, const cmi_mds_open_shard *sh, int64_t local, cm_mds_sample *out) {
    uint32_t b, e;
    memcpy(&b, sh->data + 4 + 4 * (size_t)local, 4);
    memcpy(&e, sh->data + 8 + 4 * (size_t)local, 4);
    const uint8_t *rec = sh->data + b;
    size_t n = e - b, idx = 0;
    uint32_t sizes[CM_MDS_MAX_COLUMNS];
    out->n_columns = ix->n_columns;
    for (int c = 0; c < ix->n_columns; c++) {
        if (ix->columns[c].size >= 0) {
            sizes[c] = (uint32_t)ix->columns[c].size;
            continue;
        }
        if (idx + 4 > n) return rec_err(sh, local, ix->column_names[c], "the record ends inside its size table");
        memcpy(&sizes[c], rec + idx, 4);
        idx += 4;
    }
    for (int c = 0; c < ix->n_columns; c++) {
        const cm_mds_encoding *enc = &ix->columns[c];
        cm_mds_value *v = &out->values[c];
        memset(v, 0, sizeof *v);
        if (sizes[c] > n - idx) return rec_err(sh, local, ix->column_names[c], "its bytes run past the record");
        const uint8_t *p = rec + idx;
        size_t sz = sizes[c];
        idx += sz;
        v->data = p;
        v->size = sz;
        v->dtype = enc->dtype;
        switch (enc->kind) {
        case CM_MDS_NDARRAY: {
            size_t o = 0;
            cm_mds_dtype dt = enc->dtype;
            if (dt == CM_MDS_DT_NONE) {
                if (sz < 1) return rec_err(sh, local, ix->column_names[c], "an ndarray without its dtype byte");
                dt = (cm_mds_dtype)p[o++];
                if (!cm_mds_dtype_size(dt)) return rec_err(sh, local, ix->column_names[c], "an unknown ndarray dtype code");
            }
            int64_t numel = 1;
            if (enc->ndim < 0) {
                if (o + 1 > sz) return rec_err(sh, local, ix->column_names[c], "an ndarray without its shape byte");
                int nd = p[o] >> 2, w = 1 << (p[o] & 3);
                o++;
                if (nd < 1) return rec_err(sh, local, ix->column_names[c], "an ndarray with 0 dims");
                if (nd > CM_MDS_MAX_NDIM)
                    return cm_set_error(CM_ERR_UNSUPPORTED, "shard '%s', sample %lld, column '%s': an ndarray of %d dims "
                                                            "(at most %d are supported)", sh->path, (long long)local,
                                        ix->column_names[c], nd, CM_MDS_MAX_NDIM);
                if (o + (size_t)nd * (size_t)w > sz) return rec_err(sh, local, ix->column_names[c], "a truncated ndarray shape");
                for (int k = 0; k < nd; k++) {
                    uint64_t d = 0;
                    memcpy(&d, p + o, (size_t)w);
                    o += (size_t)w;
                    if (d < 1 || d > (uint64_t)INT64_MAX / 2) return rec_err(sh, local, ix->column_names[c], "an ndarray dim of 0");
                    v->shape[k] = (int64_t)d;
                    if (numel > INT64_MAX / (int64_t)d) return rec_err(sh, local, ix->column_names[c], "an ndarray too large");
                    numel *= (int64_t)d;
                }
                v->ndim = nd;
            } else {
                v->ndim = enc->ndim;
                for (int k = 0; k < enc->ndim; k++) {
                    v->shape[k] = enc->shape[k];
                    numel *= enc->shape[k];
                }
            }
            if ((uint64_t)numel * cm_mds_dtype_size(dt) != sz - o)
                return rec_err(sh, local, ix->column_names[c], "its ndarray values do not match its shape and dtype");
            v->dtype = dt;
            v->data = p + o;
            v->size = sz - o;
            break;
        }
        case CM_MDS_PIL: {
            char what[300];
            snprintf(what, sizeof what, "shard '%s', sample %lld, column '%s'", sh->path, (long long)local,
                     ix->column_names[c]);
            cm_status st = pil_parse(p, sz, v, what);
            if (st) return st;
            break;
        }
        case CM_MDS_LIST_PIL:
        case CM_MDS_LIST_JPEG:
        case CM_MDS_LIST_PNG:
        case CM_MDS_JPEG_ARRAY: {
            char what[300];
            snprintf(what, sizeof what, "shard '%s', sample %lld, column '%s'", sh->path, (long long)local,
                     ix->column_names[c]);
            size_t hdr;
            cm_status st = list_parse(enc->kind, p, sz, &v->n_items, &hdr, what);
            if (st) return st;
            break;
        }
        default:
            if (enc->size >= 0) {
                v->ndim = 0;
            }
            break;
        }
    }
    if (idx != n) return rec_err(sh, local, ix->column_names[ix->n_columns - 1], "the record has bytes after its last column");
    return CM_OK;
}

/* ---- reader ------------------------------------------------------------------------------- */

struct cm_mds_reader {
    cmi_mds_index ix;
    char *dir;
    char *validate_hash;
    pthread_mutex_t mu;
    cmi_mds_open_shard **open; /* (n_shards,) */
};

cm_mds_reader_config cm_mds_reader_config_default(void) {
    cm_mds_reader_config c = {NULL, false};
    return c;
}

static cm_status load_index_file(const char *path, cmi_mds_index *ix) {
    uint8_t *text;
    size_t n;
    cm_status st = read_whole(path, &text, &n);
    if (st) {
        if (st == CM_ERR_NOT_FOUND)
            cm_set_error(st, "no MDS dataset at '%s' (index.json is missing: write the dataset first, or check "
                             "local/remote and split)", path);
        return st;
    }
    st = cmi_mds_index_parse((const char *)text, n, path, ix);
    cm_free(text);
    return st;
}

cm_status cm_mds_reader_open(const char *dir, const cm_mds_reader_config *cfg, cm_mds_reader **out) {
    *out = NULL;
    cm_mds_reader_config c = cfg ? *cfg : cm_mds_reader_config_default();
    if (c.validate_hash && !*c.validate_hash) c.validate_hash = NULL;
    if (c.validate_hash && !cmi_mds_hash_known(c.validate_hash))
        return cm_set_error(CM_ERR_INVALID_ARG, "validate_hash '%s' is not a hash Streaming names (use one of %s)",
                            c.validate_hash, cmi_mds_hash_names());
    cm_mds_reader *r = cm_alloc_zeroed(sizeof *r, 16);
    if (!r) return CM_ERR_OOM;
    char *ip = cmi_mds_path2(dir, "index.json");
    cm_status st = ip ? load_index_file(ip, &r->ix) : CM_ERR_OOM;
    cm_free(ip);
    if (st) {
        cm_free(r);
        return st;
    }
    for (int k = 0; k < r->ix.n_columns; k++)
        if (r->ix.columns[k].kind == CM_MDS_PKL && !c.allow_unsafe_types) {
            st = cm_set_error(CM_ERR_INVALID_ARG, "%s: column '%s' contains an unsafe type: pkl (set allow_unsafe_types "
                                                  "to read its bytes anyway)", r->ix.path, r->ix.column_names[k]);
            goto fail;
        }
    if (c.validate_hash)
        for (int s = 0; s < r->ix.n_shards; s++) {
            const cmi_mds_file *f = r->ix.shards[s].has_zip ? &r->ix.shards[s].zip : &r->ix.shards[s].raw;
            if (!cmi_mds_file_hash(f, c.validate_hash)) {
                st = cm_set_error(CM_ERR_INVALID_ARG, "%s: validate_hash '%s' is not among the hashes recorded for "
                                                      "shard '%s' (provide one of those, or none)",
                                  r->ix.path, c.validate_hash, f->basename);
                goto fail;
            }
        }
    r->dir = cmi_mds_strdup(dir);
    r->validate_hash = c.validate_hash ? cmi_mds_strdup(c.validate_hash) : NULL;
    r->open = cm_alloc_zeroed(sizeof *r->open * (size_t)r->ix.n_shards, 16);
    if (!r->dir || !r->open || (c.validate_hash && !r->validate_hash)) {
        st = CM_ERR_OOM;
        goto fail;
    }
    pthread_mutex_init(&r->mu, NULL);
    *out = r;
    return CM_OK;
fail:
    cmi_mds_index_free(&r->ix);
    cm_free(r->dir);
    cm_free(r->validate_hash);
    cm_free(r->open);
    cm_free(r);
    return st;
}

void cm_mds_reader_free(cm_mds_reader *r) {
    if (!r) return;
    for (int s = 0; s < r->ix.n_shards; s++) cmi_mds_shard_unref(r->open[s]);
    cm_free(r->open);
    pthread_mutex_destroy(&r->mu);
    cmi_mds_index_free(&r->ix);
    cm_free(r->dir);
    cm_free(r->validate_hash);
    cm_free(r);
}

int64_t cm_mds_reader_len(const cm_mds_reader *r) { return r->ix.n_samples; }
int cm_mds_reader_n_shards(const cm_mds_reader *r) { return r->ix.n_shards; }
int cm_mds_reader_n_columns(const cm_mds_reader *r) { return r->ix.n_columns; }
const char *cm_mds_reader_column_name(const cm_mds_reader *r, int i) {
    return i >= 0 && i < r->ix.n_columns ? r->ix.column_names[i] : NULL;
}
const cm_mds_encoding *cm_mds_reader_column_encoding(const cm_mds_reader *r, int i) {
    return i >= 0 && i < r->ix.n_columns ? &r->ix.columns[i] : NULL;
}
int cm_mds_reader_find_column(const cm_mds_reader *r, const char *name) {
    for (int i = 0; i < r->ix.n_columns; i++)
        if (strcmp(r->ix.column_names[i], name) == 0) return i;
    return -1;
}

cm_status cm_mds_reader_get(cm_mds_reader *r, int64_t index, cm_mds_sample *out) {
    memset(out, 0, sizeof *out);
    if (index < 0 || index >= r->ix.n_samples)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: sample %lld is out of range [0, %lld)", r->ix.path, (long long)index,
                            (long long)r->ix.n_samples);
    int64_t local;
    int s = cmi_mds_index_locate(&r->ix, index, &local);
    pthread_mutex_lock(&r->mu);
    cm_status st = CM_OK;
    if (!r->open[s]) st = cmi_mds_shard_load(&r->ix, s, r->dir, r->validate_hash, &r->open[s]);
    cmi_mds_open_shard *sh = r->open[s];
    if (!st) __atomic_add_fetch(&sh->refs, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_unlock(&r->mu);
    if (st) return st;
    if ((st = cmi_mds_shard_sample(&r->ix, sh, local, out))) {
        cmi_mds_shard_unref(sh);
        memset(out, 0, sizeof *out);
        return st;
    }
    out->ref_ = sh;
    return CM_OK;
}

void cm_mds_sample_release(cm_mds_sample *s) {
    if (!s) return;
    cmi_mds_shard_unref(s->ref_);
    s->ref_ = NULL;
}

/* ---- writer ------------------------------------------------------------------------------- */

typedef struct wcol {
    char *name;
    char *enc_text;
    cm_mds_encoding enc;
    int user_index; /* position in the caller's column list */
} wcol;

struct cm_mds_writer {
    char *out;
    int n_columns;
    wcol cols[CM_MDS_MAX_COLUMNS]; /* sorted by name */
    char *compression;
    cmi_zfamily zfam;
    int zlevel;
    const char *zext;
    int n_hashes;
    char *hashes[CMI_MDS_MAX_HASHES];
    int64_t size_limit;
    cmi_buf config;   /* the shard's config JSON */
    cmi_buf samples;  /* the records of the current shard, back to back */
    cmi_buf sizes;    /* (n,) u32 record sizes of the current shard */
    int64_t shard_size;
    int64_t n_in_shard, n_total;
    cmi_buf index_shards; /* the JSON objects of the shards written so far, comma-separated */
    int n_shards;
    bool finished;
};

cm_mds_writer_config cm_mds_writer_config_default(void) {
    cm_mds_writer_config c = {NULL, NULL, 0, (int64_t)1 << 26, false};
    return c;
}

int64_t cm_mds_writer_n_samples(const cm_mds_writer *w) { return w->n_total; }
int cm_mds_writer_n_shards(const cm_mds_writer *w) { return w->n_shards; }

static void json_str_list(cmi_buf *b, char *const *v, int n) {
    cmi_buf_puts(b, "[");
    for (int i = 0; i < n; i++) {
        if (i) cmi_buf_puts(b, ", ");
        cmi_buf_json_str(b, v[i]);
    }
    cmi_buf_puts(b, "]");
}

/* The keys every shard object shares, up to (not including) "raw_data" / after "samples". */
static void emit_columns_and_compression(cmi_buf *b, const cm_mds_writer *w) {
    char *names[CM_MDS_MAX_COLUMNS], *encs[CM_MDS_MAX_COLUMNS];
    for (int c = 0; c < w->n_columns; c++) {
        names[c] = w->cols[c].name;
        encs[c] = w->cols[c].enc_text;
    }
    cmi_buf_puts(b, "\"column_encodings\": ");
    json_str_list(b, encs, w->n_columns);
    cmi_buf_puts(b, ", \"column_names\": ");
    json_str_list(b, names, w->n_columns);
    cmi_buf_puts(b, ", \"column_sizes\": [");
    for (int c = 0; c < w->n_columns; c++) {
        if (c) cmi_buf_puts(b, ", ");
        if (w->cols[c].enc.size >= 0) cmi_buf_printf(b, "%lld", (long long)w->cols[c].enc.size);
        else cmi_buf_puts(b, "null");
    }
    cmi_buf_puts(b, "], \"compression\": ");
    if (w->compression) cmi_buf_json_str(b, w->compression);
    else cmi_buf_puts(b, "null");
    cmi_buf_puts(b, ", \"format\": \"mds\", \"hashes\": ");
    json_str_list(b, w->hashes, w->n_hashes);
}

static void emit_size_limit(cmi_buf *b, const cm_mds_writer *w) {
    if (w->size_limit) cmi_buf_printf(b, "%lld", (long long)w->size_limit);
    else cmi_buf_puts(b, "null");
}

static cm_status emit_file(cmi_buf *b, const cm_mds_writer *w, const char *basename, const uint8_t *data, size_t n) {
    cmi_buf_puts(b, "{\"basename\": ");
    cmi_buf_json_str(b, basename);
    cmi_buf_printf(b, ", \"bytes\": %zu, \"hashes\": {", n);
    for (int h = 0; h < w->n_hashes; h++) {
        char hex[160];
        cm_status st = cmi_mds_hash(w->hashes[h], data, n, hex);
        if (st) return st;
        if (h) cmi_buf_puts(b, ", ");
        cmi_buf_json_str(b, w->hashes[h]);
        cmi_buf_puts(b, ": ");
        cmi_buf_json_str(b, hex);
    }
    cmi_buf_puts(b, "}}");
    return CM_OK;
}

static cm_status flush_shard(cm_mds_writer *w) {
    if (w->n_in_shard == 0) return CM_OK; /* Streaming would write an empty shard here; nothing to read in it */
    const uint32_t n = (uint32_t)w->n_in_shard;
    cmi_buf raw = {0};
    cmi_buf_u32(&raw, n);
    uint32_t off = (uint32_t)(4 + 4 * ((size_t)n + 1) + w->config.n);
    const uint32_t *sz = (const uint32_t *)w->sizes.p;
    cmi_buf_u32(&raw, off);
    for (uint32_t i = 0; i < n; i++) {
        off += sz[i];
        cmi_buf_u32(&raw, off);
    }
    cmi_buf_put(&raw, w->config.p, w->config.n);
    cmi_buf_put(&raw, w->samples.p, w->samples.n);
    if (raw.oom) {
        cmi_buf_free(&raw);
        return cm_set_error(CM_ERR_OOM, "MDS writer: out of memory for a shard of %zu bytes", w->samples.n);
    }
    char raw_name[64], zip_name[80];
    snprintf(raw_name, sizeof raw_name, "shard.%05d.mds", w->n_shards);
    cmi_buf zip = {0};
    cmi_buf obj = {0};
    cm_status st = CM_OK;
    if (w->zfam != CMI_Z_NONE) {
        snprintf(zip_name, sizeof zip_name, "%s.%s", raw_name, w->zext);
        if ((st = cmi_mds_compress(w->zfam, w->zlevel, raw.p, raw.n, &zip))) goto done;
    }
    cmi_buf_puts(&obj, "{");
    emit_columns_and_compression(&obj, w);
    cmi_buf_puts(&obj, ", \"raw_data\": ");
    if ((st = emit_file(&obj, w, raw_name, raw.p, raw.n))) goto done;
    cmi_buf_printf(&obj, ", \"samples\": %u, \"size_limit\": ", n);
    emit_size_limit(&obj, w);
    cmi_buf_puts(&obj, ", \"version\": 2, \"zip_data\": ");
    if (w->zfam != CMI_Z_NONE) {
        if ((st = emit_file(&obj, w, zip_name, zip.p, zip.n))) goto done;
    } else {
        cmi_buf_puts(&obj, "null");
    }
    cmi_buf_puts(&obj, "}");
    if (obj.oom) {
        st = CM_ERR_OOM;
        goto done;
    }
    {
        char *path = cmi_mds_path2(w->out, w->zfam != CMI_Z_NONE ? zip_name : raw_name);
        if (!path) {
            st = CM_ERR_OOM;
            goto done;
        }
        st = w->zfam != CMI_Z_NONE ? cmi_mds_write_atomic(path, zip.p, zip.n) : cmi_mds_write_atomic(path, raw.p, raw.n);
        cm_free(path);
        if (st) goto done;
    }
    if (w->n_shards) cmi_buf_puts(&w->index_shards, ", ");
    cmi_buf_put(&w->index_shards, obj.p, obj.n);
    if (w->index_shards.oom) {
        st = CM_ERR_OOM;
        goto done;
    }
    w->n_shards++;
    w->n_in_shard = 0;
    w->samples.n = 0;
    w->sizes.n = 0;
    w->shard_size = 8 + (int64_t)w->config.n;
done:
    cmi_buf_free(&raw);
    cmi_buf_free(&zip);
    cmi_buf_free(&obj);
    return st;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    if (ftw->level == 0) return 0;
    return remove(path);
}

static int cmp_wcol(const void *a, const void *b) {
    /* Python sorts str by code point: for UTF-8 that is byte order */
    return strcmp(((const wcol *)a)->name, ((const wcol *)b)->name);
}

cm_status cm_mds_writer_new(const char *out, const cm_mds_column *columns, int n_columns,
                            const cm_mds_writer_config *cfg, cm_mds_writer **wp) {
    *wp = NULL;
    cm_mds_writer_config c = cfg ? *cfg : cm_mds_writer_config_default();
    if (!out || !*out) return cm_set_error(CM_ERR_INVALID_ARG, "MDS writer: no output directory");
    if (n_columns < 1 || n_columns > CM_MDS_MAX_COLUMNS)
        return cm_set_error(CM_ERR_INVALID_ARG, "MDS writer: %d columns (must be 1..%d)", n_columns, CM_MDS_MAX_COLUMNS);
    if (c.size_limit < 0 || c.size_limit >= ((int64_t)1 << 32))
        return cm_set_error(CM_ERR_INVALID_ARG, "MDS writer: size_limit %lld must be in [0, 2^32) (sample offsets are "
                                                "u32; 0 puts everything in one shard)", (long long)c.size_limit);
    cmi_zfamily fam;
    int level;
    const char *ext;
    if (!cmi_mds_compression_parse(c.compression, &fam, &level, &ext))
        return cm_set_error(CM_ERR_INVALID_ARG, "MDS writer: invalid compression '%s' (use br[:0-11], bz2[:1-9], "
                                                "gz[:0-9], snappy or zstd[:1-22])", c.compression);
    if (c.n_hashes < 0 || c.n_hashes > CMI_MDS_MAX_HASHES)
        return cm_set_error(CM_ERR_INVALID_ARG, "MDS writer: %d hashes (at most %d)", c.n_hashes, CMI_MDS_MAX_HASHES);
    for (int h = 0; h < c.n_hashes; h++) {
        if (!c.hashes[h] || !cmi_mds_hash_known(c.hashes[h]))
            return cm_set_error(CM_ERR_INVALID_ARG, "MDS writer: invalid hash '%s' (use %s)", c.hashes[h] ? c.hashes[h] : "(null)",
                                cmi_mds_hash_names());
        if (h && strcmp(c.hashes[h - 1], c.hashes[h]) >= 0)
            return cm_set_error(CM_ERR_INVALID_ARG, "MDS writer: hashes must be unique and in sorted order ('%s' then "
                                                    "'%s')", c.hashes[h - 1], c.hashes[h]);
    }
    cm_mds_writer *w = cm_alloc_zeroed(sizeof *w, 16);
    if (!w) return CM_ERR_OOM;
    cm_status st = CM_OK;
    w->n_columns = n_columns;
    for (int i = 0; i < n_columns; i++) {
        wcol *k = &w->cols[i];
        if (!columns[i].name || !*columns[i].name) {
            st = cm_set_error(CM_ERR_INVALID_ARG, "MDS writer: column %d has no name", i);
            goto fail;
        }
        if ((st = cm_mds_encoding_parse(columns[i].encoding, &k->enc))) {
            char msg[700];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            st = cm_set_error(st, "MDS writer: column '%s': %s", columns[i].name, msg);
            goto fail;
        }
        k->name = cmi_mds_strdup(columns[i].name);
        k->enc_text = cmi_mds_strdup(columns[i].encoding);
        k->user_index = i;
        if (!k->name || !k->enc_text) {
            st = CM_ERR_OOM;
            goto fail;
        }
    }
    qsort(w->cols, (size_t)n_columns, sizeof w->cols[0], cmp_wcol);
    for (int i = 1; i < n_columns; i++)
        if (strcmp(w->cols[i - 1].name, w->cols[i].name) == 0) {
            st = cm_set_error(CM_ERR_INVALID_ARG, "MDS writer: column '%s' is given twice", w->cols[i].name);
            goto fail;
        }
    w->zfam = fam;
    w->zlevel = level;
    w->zext = ext;
    if (c.compression && *c.compression && !(w->compression = cmi_mds_strdup(c.compression))) {
        st = CM_ERR_OOM;
        goto fail;
    }
    w->n_hashes = c.n_hashes;
    for (int h = 0; h < c.n_hashes; h++)
        if (!(w->hashes[h] = cmi_mds_strdup(c.hashes[h]))) {
            st = CM_ERR_OOM;
            goto fail;
        }
    w->size_limit = c.size_limit;
    if (!(w->out = cmi_mds_strdup(out))) {
        st = CM_ERR_OOM;
        goto fail;
    }
    /* the output directory: new, or emptied with exist_ok */
    DIR *d = opendir(out);
    if (d) {
        struct dirent *e;
        bool empty = true;
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = false;
        closedir(d);
        if (!empty && !c.exist_ok) {
            st = cm_set_error(CM_ERR_INVALID_ARG, "MDS writer: directory '%s' exists and is not empty (set exist_ok to "
                                                  "replace its contents, or pick a new directory)", out);
            goto fail;
        }
        if (!empty && nftw(out, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) {
            st = cm_set_error(CM_ERR_IO, "MDS writer: cannot empty '%s': %s", out, strerror(errno));
            goto fail;
        }
    } else if ((st = cmi_mds_mkdir_p(out))) {
        goto fail;
    }
    /* the config JSON every shard carries (Writer.get_config + MDSWriter.get_config, sorted) */
    cmi_buf_puts(&w->config, "{");
    emit_columns_and_compression(&w->config, w);
    cmi_buf_puts(&w->config, ", \"size_limit\": ");
    emit_size_limit(&w->config, w);
    cmi_buf_puts(&w->config, ", \"version\": 2}");
    if (w->config.oom) {
        st = CM_ERR_OOM;
        goto fail;
    }
    w->shard_size = 8 + (int64_t)w->config.n;
    *wp = w;
    return CM_OK;
fail:
    cm_mds_writer_free(w);
    return st;
}

void cm_mds_writer_free(cm_mds_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n_columns; i++) {
        cm_free(w->cols[i].name);
        cm_free(w->cols[i].enc_text);
    }
    for (int h = 0; h < w->n_hashes; h++) cm_free(w->hashes[h]);
    cm_free(w->compression);
    cm_free(w->out);
    cmi_buf_free(&w->config);
    cmi_buf_free(&w->samples);
    cmi_buf_free(&w->sizes);
    cmi_buf_free(&w->index_shards);
    cm_free(w);
}

static bool valid_utf8(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = cmi_utf8_decode(p + i, n - i, &cp);
        if (!k) return false;
        i += (size_t)k;
    }
    return true;
}

/* Text checks for the str_* encodings: what Python's str() of an int, a float or a Decimal can be. */
static bool text_is_int(const char *s, size_t n) {
    size_t i = 0;
    if (i < n && s[i] == '-') i++;
    if (i == n) return false;
    if (s[i] == '0' && n - i > 1) return false;
    for (; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return false;
    return true;
}

static bool text_is_float(const char *s, size_t n, bool decimal) {
    char buf[128];
    if (n == 0 || n >= sizeof buf) return false;
    memcpy(buf, s, n);
    buf[n] = '\0';
    const char *p = buf;
    if (*p == '-' || (decimal && *p == '+')) p++;
    if (!decimal && (!strcmp(p, "inf") || !strcmp(p, "nan"))) return true;
    if (decimal && (!strcmp(p, "Infinity") || !strcmp(p, "NaN") || !strcmp(p, "sNaN"))) return true;
    bool digits = false;
    for (; *p >= '0' && *p <= '9'; p++) digits = true;
    if (*p == '.')
        for (p++; *p >= '0' && *p <= '9'; p++) digits = true;
    if (!digits) return false;
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-') p++;
        if (!(*p >= '0' && *p <= '9')) return false;
        while (*p >= '0' && *p <= '9') p++;
    }
    return *p == '\0';
}

static cm_status werr(const wcol *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static cm_status werr(const wcol *k, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return cm_set_error(CM_ERR_INVALID_ARG, "MDS writer: column '%s' (%s): %s", k->name, k->enc_text, msg);
}

static bool is_jpeg(const cm_mds_value *v) {
    const uint8_t *p = v->data;
    return v->size >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF;
}
static bool is_png(const cm_mds_value *v) {
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    return v->size >= 8 && memcmp(v->data, sig, 8) == 0;
}

static cm_status encode_pil(const wcol *k, const cm_mds_value *v, cmi_buf *b) {
    if (!v->mode || !*v->mode) return werr(k, "a pil value needs its PIL mode (\"L\", \"RGB\", ...)");
    if (v->ndim != 2 || v->shape[0] < 1 || v->shape[1] < 1 || v->shape[0] > UINT32_MAX || v->shape[1] > UINT32_MAX)
        return werr(k, "a pil value needs shape (height, width)");
    int mode = pil_mode_find(v->mode, strlen(v->mode));
    if (mode < 0) return werr(k, "PIL mode '%s' is not one this writer knows the pixel size of", v->mode);
    size_t rb = pil_row_bytes(mode, v->shape[1]);
    if (rb * (size_t)v->shape[0] != v->size)
        return werr(k, "a %lldx%lld %s image has %zu bytes of pixels, not %zu", (long long)v->shape[1],
                    (long long)v->shape[0], v->mode, rb * (size_t)v->shape[0], v->size);
    cmi_buf_u32(b, (uint32_t)v->shape[1]);
    cmi_buf_u32(b, (uint32_t)v->shape[0]);
    cmi_buf_u32(b, (uint32_t)strlen(v->mode));
    cmi_buf_puts(b, v->mode);
    cmi_buf_put(b, v->data, v->size);
    return CM_OK;
}

/* Appends the encoded bytes of one value to b. */
static cm_status encode_value(const wcol *k, const cm_mds_value *v, cmi_buf *b) {
    const cm_mds_encoding *e = &k->enc;
    if (!v->data && v->size && e->kind != CM_MDS_LIST_PIL && e->kind != CM_MDS_LIST_JPEG && e->kind != CM_MDS_LIST_PNG &&
        e->kind != CM_MDS_JPEG_ARRAY)
        return werr(k, "no data for %zu bytes", v->size);
    switch (e->kind) {
    case CM_MDS_BYTES:
    case CM_MDS_PKL: cmi_buf_put(b, v->data, v->size); return CM_OK;
    case CM_MDS_STR:
        if (!valid_utf8(v->data, v->size)) return werr(k, "the text is not valid UTF-8");
        cmi_buf_put(b, v->data, v->size);
        return CM_OK;
    case CM_MDS_JSON: {
        cJSON *j = cJSON_ParseWithLength(v->data, v->size);
        if (!j) return werr(k, "the text is not valid JSON");
        cJSON_Delete(j);
        cmi_buf_put(b, v->data, v->size);
        return CM_OK;
    }
    case CM_MDS_STR_INT:
        if (!text_is_int(v->data, v->size)) return werr(k, "'%.*s' is not an int as Python's str() writes it", (int)(v->size > 64 ? 64 : v->size), (const char *)v->data);
        cmi_buf_put(b, v->data, v->size);
        return CM_OK;
    case CM_MDS_STR_FLOAT:
    case CM_MDS_STR_DECIMAL:
        if (!text_is_float(v->data, v->size, e->kind == CM_MDS_STR_DECIMAL))
            return werr(k, "'%.*s' is not a %s as Python's str() writes it", (int)(v->size > 64 ? 64 : v->size),
                        (const char *)v->data, e->kind == CM_MDS_STR_DECIMAL ? "Decimal" : "float");
        cmi_buf_put(b, v->data, v->size);
        return CM_OK;
    case CM_MDS_JPEG:
        if (!is_jpeg(v)) return werr(k, "the bytes are not a JPEG file (no FF D8 FF)");
        cmi_buf_put(b, v->data, v->size);
        return CM_OK;
    case CM_MDS_PNG:
        if (!is_png(v)) return werr(k, "the bytes are not a PNG file (no PNG signature)");
        cmi_buf_put(b, v->data, v->size);
        return CM_OK;
    case CM_MDS_PIL: return encode_pil(k, v, b);
    case CM_MDS_LIST_PIL:
    case CM_MDS_LIST_JPEG:
    case CM_MDS_LIST_PNG:
    case CM_MDS_JPEG_ARRAY: {
        if (v->n_items < 0 || v->n_items > UINT32_MAX || (v->n_items && !v->items)) return werr(k, "a list needs items and n_items");
        if (e->kind != CM_MDS_JPEG_ARRAY) cmi_buf_u32(b, 0); /* Streaming's reserved placeholder */
        cmi_buf_u32(b, (uint32_t)v->n_items);
        size_t size_at = b->n;
        for (int64_t i = 0; i < v->n_items; i++) cmi_buf_u32(b, 0);
        for (int64_t i = 0; i < v->n_items; i++) {
            const cm_mds_value *it = &v->items[i];
            size_t before = b->n;
            if (e->kind == CM_MDS_LIST_PIL) {
                cm_status st = encode_pil(k, it, b);
                if (st) return st;
            } else {
                if (e->kind == CM_MDS_LIST_PNG && !is_png(it)) return werr(k, "element %lld is not a PNG file", (long long)i);
                if (e->kind == CM_MDS_LIST_JPEG && !is_jpeg(it)) return werr(k, "element %lld is not a JPEG file", (long long)i);
                cmi_buf_put(b, it->data, it->size);
            }
            if (b->oom) return CM_ERR_OOM;
            uint32_t s = (uint32_t)(b->n - before);
            memcpy(b->p + size_at + 4 * (size_t)i, &s, 4);
        }
        return CM_OK;
    }
    case CM_MDS_NDARRAY: {
        size_t isz = cm_mds_dtype_size(v->dtype);
        if (!isz) return werr(k, "ndarray dtype %d is not one of MDS's (cm_mds_dtype)", (int)v->dtype);
        if (e->dtype != CM_MDS_DT_NONE && e->dtype != v->dtype)
            return werr(k, "wrong dtype: expected %s, got %s", cm_mds_dtype_name(e->dtype), cm_mds_dtype_name(v->dtype));
        if (v->ndim < 1) return werr(k, "an ndarray needs at least one dim (scalars have their own encodings)");
        if (v->ndim > CM_MDS_MAX_NDIM) return werr(k, "%d dims (at most %d)", v->ndim, CM_MDS_MAX_NDIM);
        int64_t numel = 1, mx = 0;
        for (int d = 0; d < v->ndim; d++) {
            if (v->shape[d] < 1) return werr(k, "dim %d is %lld: arrays with 0 elements cannot be encoded", d, (long long)v->shape[d]);
            numel *= v->shape[d];
            if (v->shape[d] > mx) mx = v->shape[d];
        }
        if ((size_t)numel * isz != v->size)
            return werr(k, "%lld elements of %s need %zu bytes, the value has %zu", (long long)numel,
                        cm_mds_dtype_name(v->dtype), (size_t)numel * isz, v->size);
        if (e->ndim >= 0) {
            bool same = e->ndim == v->ndim;
            for (int d = 0; same && d < v->ndim; d++) same = e->shape[d] == v->shape[d];
            if (!same) return werr(k, "wrong shape: the encoding fixes it");
        }
        if (e->dtype == CM_MDS_DT_NONE) {
            uint8_t code = (uint8_t)v->dtype;
            cmi_buf_put(b, &code, 1);
        }
        if (e->ndim < 0) {
            int wc = mx < (1 << 8) ? 0 : mx < (1 << 16) ? 1 : mx < ((int64_t)1 << 32) ? 2 : 3;
            uint8_t byte = (uint8_t)((v->ndim << 2) | wc);
            cmi_buf_put(b, &byte, 1);
            for (int d = 0; d < v->ndim; d++) cmi_buf_put(b, &v->shape[d], (size_t)1 << wc);
        }
        cmi_buf_put(b, v->data, v->size);
        return CM_OK;
    }
    default: /* fixed-size scalars */
        if (v->size != (size_t)e->size)
            return werr(k, "a %s value is %lld bytes, got %zu", k->enc_text, (long long)e->size, v->size);
        cmi_buf_put(b, v->data, v->size);
        return CM_OK;
    }
}

cm_status cm_mds_writer_write(cm_mds_writer *w, const cm_mds_value *values) {
    if (w->finished) return cm_set_error(CM_ERR_STATE, "MDS writer: write after finish");
    cmi_buf head = {0}, body = {0};
    cm_status st = CM_OK;
    for (int c = 0; c < w->n_columns; c++) {
        const wcol *k = &w->cols[c];
        size_t before = body.n;
        if ((st = encode_value(k, &values[k->user_index], &body))) goto done;
        if (body.oom) {
            st = CM_ERR_OOM;
            goto done;
        }
        size_t len = body.n - before;
        if (len > UINT32_MAX) {
            st = werr(k, "a value of %zu bytes (at most 4 GiB)", len);
            goto done;
        }
        if (k->enc.size < 0) cmi_buf_u32(&head, (uint32_t)len);
    }
    {
        const int64_t rec = (int64_t)(head.n + body.n);
        if (w->size_limit && w->size_limit < w->shard_size + rec + 4 && (st = flush_shard(w))) goto done;
        if (w->shard_size + rec + 4 > (int64_t)UINT32_MAX) {
            st = cm_set_error(CM_ERR_INVALID_ARG, "MDS writer: a shard would pass 4 GiB (set size_limit)");
            goto done;
        }
        uint32_t r32 = (uint32_t)rec;
        cmi_buf_put(&w->samples, head.p, head.n);
        cmi_buf_put(&w->samples, body.p, body.n);
        cmi_buf_put(&w->sizes, &r32, 4);
        if (w->samples.oom || w->sizes.oom) {
            st = cm_set_error(CM_ERR_OOM, "MDS writer: out of memory for the current shard");
            goto done;
        }
        w->shard_size += rec + 4;
        w->n_in_shard++;
        w->n_total++;
    }
done:
    cmi_buf_free(&head);
    cmi_buf_free(&body);
    return st;
}

cm_status cm_mds_writer_finish(cm_mds_writer *w) {
    if (w->finished) return cm_set_error(CM_ERR_STATE, "MDS writer: finish called twice");
    cm_status st = flush_shard(w);
    if (st) return st;
    cmi_buf ix = {0};
    cmi_buf_puts(&ix, "{\"shards\": [");
    cmi_buf_put(&ix, w->index_shards.p, w->index_shards.n);
    cmi_buf_puts(&ix, "], \"version\": 2}");
    char *path = cmi_mds_path2(w->out, "index.json");
    if (ix.oom || !path) st = CM_ERR_OOM;
    else st = cmi_mds_write_atomic(path, ix.p, ix.n);
    cm_free(path);
    cmi_buf_free(&ix);
    if (!st) w->finished = true;
    return st;
}
