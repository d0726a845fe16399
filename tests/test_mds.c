/* MDS shards: the reference datasets from MosaicML Streaming's layout (FORMATS §5), byte-identical
 * rewriting of them, every encoding both ways against an independent Python reader/writer
 * (tests/mds_ref.py), the compressions and hashes, and the faults (corrupt, truncated and missing
 * shards, bad index.json, bad values). */
#include "cmtest.h"

#include <composer/streaming.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define REF_RAW "../shared/data/vectors/mds_example_raw"
#define REF_ZSTD "../shared/data/vectors/mds_example_zstd"
#define PY "/usr/bin/python3 tests/mds_ref.py"

static uint8_t *slurp(const char *path, size_t *len) { return (uint8_t *)cmt_read_file(path, len); }

static void spit(const char *path, const void *d, size_t n) { cmt_write_file(path, d, n); }

static void assert_same_file(const char *a, const char *b) {
    size_t na, nb;
    uint8_t *pa = slurp(a, &na), *pb = slurp(b, &nb);
    cr_assert_eq(na, nb, "%s has %zu bytes, %s has %zu", a, na, b, nb);
    for (size_t i = 0; i < na; i++) cr_assert_eq(pa[i], pb[i], "%s and %s differ at byte %zu", a, b, i);
    free(pa);
    free(pb);
}

static char *tmpdir(void) {
    static char dirs[16][40];
    static int n;
    char *d = dirs[n++ % 16];
    snprintf(d, 40, "/tmp/cm_mds_XXXXXX");
    cr_assert_not_null(mkdtemp(d));
    return d;
}

static void copy_dir(const char *from, const char *to) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cp %s/* %s/ && chmod u+w %s/*", from, to, to);
    cr_assert_eq(system(cmd), 0);
}

Test(mds, encoding_parse_matches_streaming) {
    cm_mds_encoding e;
    cr_assert_eq(cm_mds_encoding_parse("ndarray:uint8:2,3", &e), CM_OK, "%s", cm_last_error());
    cr_assert_eq(e.kind, CM_MDS_NDARRAY);
    cr_assert_eq(e.dtype, CM_MDS_DT_U8);
    cr_assert_eq(e.ndim, 2);
    cr_assert_eq(e.size, 6);
    cr_assert_eq(cm_mds_encoding_parse("ndarray:int32", &e), CM_OK);
    cr_assert(e.ndim == -1 && e.size == -1 && e.dtype == CM_MDS_DT_I32);
    cr_assert_eq(cm_mds_encoding_parse("ndarray", &e), CM_OK);
    cr_assert(e.dtype == CM_MDS_DT_NONE && e.size == -1);
    cr_assert_eq(cm_mds_encoding_parse("int", &e), CM_OK);
    cr_assert(e.kind == CM_MDS_INT && e.size == 8);
    cr_assert_eq(cm_mds_encoding_parse("float16", &e), CM_OK);
    cr_assert_eq(e.size, 2);
    cr_assert_eq(cm_mds_encoding_parse("jpegarray", &e), CM_OK);
    cr_assert_eq(e.kind, CM_MDS_JPEG_ARRAY);
    cr_assert_eq(cm_mds_encoding_parse("list[png]", &e), CM_OK);
    cr_assert_eq(e.kind, CM_MDS_LIST_PNG);
    cr_assert_eq(cm_mds_encoding_parse("ndarray:bool", &e), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "dtype"), "%s", cm_last_error());
    cr_assert_eq(cm_mds_encoding_parse("ndarray:uint8:2,0", &e), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_mds_encoding_parse("str:3", &e), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_mds_encoding_parse("text", &e), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "'text'") && strstr(cm_last_error(), "str_decimal"), "%s", cm_last_error());
}

/* Reads every sample of the reference datasets: the raw and the zstd forms hold the same values,
 * and spot values are those Streaming's writer was given. */
Test(mds, reads_the_reference_datasets) {
    cm_mds_reader *raw, *z;
    cr_assert_eq(cm_mds_reader_open(REF_RAW, NULL, &raw), CM_OK, "%s", cm_last_error());
    cm_mds_reader_config rc = cm_mds_reader_config_default();
    rc.validate_hash = "xxh3_64";
    cr_assert_eq(cm_mds_reader_open(REF_ZSTD, &rc, &z), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_mds_reader_len(raw), 10);
    cr_assert_eq(cm_mds_reader_n_shards(raw), 2);
    cr_assert_eq(cm_mds_reader_n_columns(raw), 5);
    cr_assert_str_eq(cm_mds_reader_column_name(raw, 3), "tokens");
    for (int64_t i = 0; i < 10; i++) {
        cm_mds_sample a, b;
        cr_assert_eq(cm_mds_reader_get(raw, i, &a), CM_OK, "%s", cm_last_error());
        cr_assert_eq(cm_mds_reader_get(z, i, &b), CM_OK, "%s", cm_last_error());
        for (int c = 0; c < 5; c++) {
            cr_assert_eq(a.values[c].size, b.values[c].size);
            cr_assert_eq(memcmp(a.values[c].data, b.values[c].data, a.values[c].size), 0, "sample %lld col %d", (long long)i, c);
        }
        /* any: float16 (2, i+1); img: uint8 (2,3) = i..i+5; text; tokens: int32 (i+1,) = 7k; y = i - 3 */
        cr_assert_eq(a.values[0].dtype, CM_MDS_DT_F16);
        cr_assert(a.values[0].ndim == 2 && a.values[0].shape[0] == 2 && a.values[0].shape[1] == i + 1);
        for (int k = 0; k < 6; k++) cr_assert_eq(((const uint8_t *)a.values[1].data)[k], i + k);
        char want[32];
        snprintf(want, sizeof want, "sample %lld \xc3\xa9", (long long)i);
        cr_assert_eq(a.values[2].size, strlen(want));
        cr_assert_eq(memcmp(a.values[2].data, want, strlen(want)), 0);
        cr_assert(a.values[3].ndim == 1 && a.values[3].shape[0] == i + 1 && a.values[3].dtype == CM_MDS_DT_I32);
        for (int k = 0; k <= i; k++) {
            int32_t t;
            memcpy(&t, (const char *)a.values[3].data + 4 * k, 4);
            cr_assert_eq(t, 7 * k);
        }
        int64_t y;
        memcpy(&y, a.values[4].data, 8);
        cr_assert_eq(y, i - 3);
        cm_mds_sample_release(&a);
        cm_mds_sample_release(&b);
    }
    cm_mds_reader_free(raw);
    cm_mds_reader_free(z);
}

/* Writing the reference samples again with the same columns, size_limit and hashes gives the same
 * bytes: shards, offsets, config JSON, index.json, sha1 and xxh3_64 hex digests. With zstd:7 the
 * raw_data entries equal the reference's and the compressed shards decompress to them. */
static void rewrite_reference(const char *out, const char *compression) {
    cm_mds_reader *r;
    cr_assert_eq(cm_mds_reader_open(REF_RAW, NULL, &r), CM_OK, "%s", cm_last_error());
    /* the caller's column order differs from index.json's: the writer sorts */
    cm_mds_column cols[] = {{"y", "int"}, {"text", "str"}, {"tokens", "ndarray:int32"}, {"any", "ndarray"},
                            {"img", "ndarray:uint8:2,3"}};
    const int map[5] = {4, 2, 3, 0, 1}; /* cols[k] is reader column map[k] */
    cm_mds_writer_config wc = cm_mds_writer_config_default();
    const char *hashes[] = {"sha1", "xxh3_64"};
    wc.hashes = hashes;
    wc.n_hashes = 2;
    wc.size_limit = 1000;
    wc.compression = compression;
    cm_mds_writer *w;
    cr_assert_eq(cm_mds_writer_new(out, cols, 5, &wc, &w), CM_OK, "%s", cm_last_error());
    for (int64_t i = 0; i < cm_mds_reader_len(r); i++) {
        cm_mds_sample s;
        cr_assert_eq(cm_mds_reader_get(r, i, &s), CM_OK);
        cm_mds_value v[5];
        for (int k = 0; k < 5; k++) v[k] = s.values[map[k]];
        cr_assert_eq(cm_mds_writer_write(w, v), CM_OK, "%s", cm_last_error());
        cm_mds_sample_release(&s);
    }
    cr_assert_eq(cm_mds_writer_finish(w), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_mds_writer_n_shards(w), 2);
    cm_mds_writer_free(w);
    cm_mds_reader_free(r);
}

Test(mds, writer_reproduces_the_reference_bytes) {
    char *d = tmpdir();
    rewrite_reference(d, NULL);
    char a[256], b[256];
    const char *files[] = {"index.json", "shard.00000.mds", "shard.00001.mds"};
    for (int f = 0; f < 3; f++) {
        snprintf(a, sizeof a, "%s/%s", d, files[f]);
        snprintf(b, sizeof b, "%s/%s", REF_RAW, files[f]);
        assert_same_file(a, b);
    }
}

Test(mds, zstd_writer_matches_the_reference_raw_entries) {
    char *d = tmpdir();
    rewrite_reference(d, "zstd:7");
    char p[256];
    size_t n1, n2;
    snprintf(p, sizeof p, "%s/index.json", d);
    char *mine = (char *)slurp(p, &n1);
    char *ref = (char *)slurp(REF_ZSTD "/index.json", &n2);
    /* the raw_data objects (sizes and hashes of the decompressed shards) are identical */
    for (const char *q = ref; (q = strstr(q, "\"raw_data\": ")); q++) {
        const char *end = strchr(q, '}');
        cr_assert(strstr(mine, "\"raw_data\""));
        char obj[400];
        snprintf(obj, sizeof obj, "%.*s", (int)(end - q + 2), q);
        cr_assert(strstr(mine, obj), "missing %s in %s", obj, mine);
    }
    free(mine);
    free(ref);
    /* and the dataset reads back with hash validation of the compressed files */
    cm_mds_reader_config rc = cm_mds_reader_config_default();
    rc.validate_hash = "sha1";
    cm_mds_reader *r;
    cr_assert_eq(cm_mds_reader_open(d, &rc, &r), CM_OK, "%s", cm_last_error());
    cm_mds_sample s;
    cr_assert_eq(cm_mds_reader_get(r, 9, &s), CM_OK, "%s", cm_last_error());
    cm_mds_sample_release(&s);
    cm_mds_reader_free(r);
}

/* ---- the sample set of tests/mds_ref.py, built in C --------------------------------------- */

static uint16_t half_of_small(double v) { /* exact for the small multiples of 1/4 used here */
    if (v == 0) return 0;
    uint16_t sign = v < 0 ? 0x8000 : 0;
    if (v < 0) v = -v;
    int e = 0;
    while (v >= 2) v /= 2, e++;
    while (v < 1) v *= 2, e--;
    return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | (uint16_t)((v - 1) * 1024 + 0.5));
}

typedef struct refsample {
    uint8_t b[8];
    char s[64], si[32], sf[32], sd[32], js[96];
    int64_t i, i64;
    uint8_t u8;
    uint16_t u16, f16;
    uint32_t u32;
    uint64_t u64;
    int8_t i8;
    int16_t i16;
    int32_t i32;
    float f32;
    double f64;
    uint8_t nd[8 * 300];
    int16_t ndt[64];
    uint8_t nds[6];
    uint8_t pil[5 * 7 * 4];
    const char *pil_mode;
    cm_mds_value v[32];
} refsample;

static const cm_mds_dtype k_nd_dtypes[] = {CM_MDS_DT_U8,  CM_MDS_DT_I8,  CM_MDS_DT_U16, CM_MDS_DT_I16,
                                           CM_MDS_DT_F16, CM_MDS_DT_U32, CM_MDS_DT_I32, CM_MDS_DT_F32,
                                           CM_MDS_DT_U64, CM_MDS_DT_I64, CM_MDS_DT_F64};

static void image_px(int i, int h, int w, int c, uint8_t *out) {
    for (int k = 0; k < h * w * c; k++) out[k] = (uint8_t)(((int64_t)k * 37 + i * 11) % 251);
}

/* Columns C can write (no PNG/JPEG encoder here): all but png, jpg, jpx, lpng, ja. */
static const cm_mds_column k_ref_cols[] = {
    {"b", "bytes"},       {"s", "str"},           {"i", "int"},         {"u8", "uint8"},    {"u16", "uint16"},
    {"u32", "uint32"},    {"u64", "uint64"},      {"i8", "int8"},       {"i16", "int16"},   {"i32", "int32"},
    {"i64", "int64"},     {"f16", "float16"},     {"f32", "float32"},   {"f64", "float64"}, {"si", "str_int"},
    {"sf", "str_float"},  {"sd", "str_decimal"},  {"js", "json"},       {"nd", "ndarray"},  {"ndt", "ndarray:int16"},
    {"nds", "ndarray:uint8:2,3"}, {"pil", "pil"},
};
#define N_REF_COLS ((int)(sizeof k_ref_cols / sizeof k_ref_cols[0]))

static void ref_sample(int i, refsample *r) {
    memset(r, 0, sizeof *r);
    cm_mds_value *v = r->v;
    int n = i % 7;
    for (int k = 0; k < n; k++) r->b[k] = (uint8_t)((i * 13 + k) % 256);
    v[0] = (cm_mds_value){.data = r->b, .size = (size_t)n};
    snprintf(r->s, sizeof r->s, "sample %d \xc3\xa9\xe6\xbc\xa2", i);
    v[1] = (cm_mds_value){.data = r->s, .size = strlen(r->s)};
    r->i = (int64_t)i * 1000003 - 7;
    v[2] = (cm_mds_value){.data = &r->i, .size = 8};
    r->u8 = (uint8_t)(i % 256);
    r->u16 = (uint16_t)((i * 3001) % 65536);
    r->u32 = (uint32_t)((uint32_t)i * 2654435761u);
    r->u64 = (uint64_t)i * 11400714819323198485ull;
    r->i8 = (int8_t)((i * 5) % 256 - 128);
    r->i16 = (int16_t)(i * 301 - 3000);
    r->i32 = i * 100003 - 1000000;
    r->i64 = -((int64_t)i * 1000000000000ll) - 1;
    r->f16 = half_of_small(i * 0.5 - 3.25);
    r->f32 = (float)(i * 1.25 - 10.5);
    r->f64 = i / 3.0;
    v[3] = (cm_mds_value){.data = &r->u8, .size = 1};
    v[4] = (cm_mds_value){.data = &r->u16, .size = 2};
    v[5] = (cm_mds_value){.data = &r->u32, .size = 4};
    v[6] = (cm_mds_value){.data = &r->u64, .size = 8};
    v[7] = (cm_mds_value){.data = &r->i8, .size = 1};
    v[8] = (cm_mds_value){.data = &r->i16, .size = 2};
    v[9] = (cm_mds_value){.data = &r->i32, .size = 4};
    v[10] = (cm_mds_value){.data = &r->i64, .size = 8};
    v[11] = (cm_mds_value){.data = &r->f16, .size = 2};
    v[12] = (cm_mds_value){.data = &r->f32, .size = 4};
    v[13] = (cm_mds_value){.data = &r->f64, .size = 8};
    snprintf(r->si, sizeof r->si, "%d", i * 12345 - 99999);
    snprintf(r->sf, sizeof r->sf, "%d.%d", i, (i * 7) % 10);
    snprintf(r->sd, sizeof r->sd, "%d.%02d", i, i % 100);
    snprintf(r->js, sizeof r->js, "{\"i\": %d, \"name\": \"x%d\", \"v\": [%d, %d]}", i, i, i, 2 * i);
    v[14] = (cm_mds_value){.data = r->si, .size = strlen(r->si)};
    v[15] = (cm_mds_value){.data = r->sf, .size = strlen(r->sf)};
    v[16] = (cm_mds_value){.data = r->sd, .size = strlen(r->sd)};
    v[17] = (cm_mds_value){.data = r->js, .size = strlen(r->js)};
    /* nd: (arange(prod) * (i+1) % 97).astype(dt).reshape(shape) */
    static const int64_t shapes[4][3] = {{3}, {2, 5}, {1, 300}, {4, 1, 2}};
    static const int ndims[4] = {1, 2, 2, 3};
    cm_mds_dtype dt = k_nd_dtypes[i % 11];
    cm_mds_value *nd = &v[18];
    nd->dtype = dt;
    nd->ndim = ndims[i % 4];
    int64_t numel = 1;
    for (int d = 0; d < nd->ndim; d++) numel *= (nd->shape[d] = shapes[i % 4][d]);
    size_t isz = cm_mds_dtype_size(dt);
    for (int64_t k = 0; k < numel; k++) {
        int64_t val = k * (i + 1) % 97;
        uint8_t *p = r->nd + k * (int64_t)isz;
        switch (dt) {
        case CM_MDS_DT_F16: { uint16_t h = half_of_small((double)val); memcpy(p, &h, 2); break; }
        case CM_MDS_DT_F32: { float f = (float)val; memcpy(p, &f, 4); break; }
        case CM_MDS_DT_F64: { double f = (double)val; memcpy(p, &f, 8); break; }
        default: memcpy(p, &val, isz); break; /* little-endian: the low bytes */
        }
    }
    nd->data = r->nd;
    nd->size = (size_t)numel * isz;
    for (int k = 0; k <= i; k++) r->ndt[k] = (int16_t)(k - 5);
    v[19] = (cm_mds_value){.data = r->ndt, .size = 2 * (size_t)(i + 1), .dtype = CM_MDS_DT_I16, .ndim = 1, .shape = {i + 1}};
    for (int k = 0; k < 6; k++) r->nds[k] = (uint8_t)(k + i);
    v[20] = (cm_mds_value){.data = r->nds, .size = 6, .dtype = CM_MDS_DT_U8, .ndim = 2, .shape = {2, 3}};
    static const char *modes[3] = {"L", "RGB", "RGBA"};
    int ch = (int[]){1, 3, 4}[i % 3];
    r->pil_mode = modes[i % 3];
    image_px(i, 5, 7, ch, r->pil);
    v[21] = (cm_mds_value){.data = r->pil, .size = (size_t)(5 * 7 * ch), .ndim = 2, .shape = {5, 7}, .mode = r->pil_mode};
}

static void run_py(const char *args) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, PY " %s", args);
    cr_assert_eq(system(cmd), 0, "'%s' failed", cmd);
}

/* C writes, the independent Python reader checks every value, compression and hash. */
static void c_writes_python_reads(const char *compression) {
    char *d = tmpdir();
    cm_mds_writer_config wc = cm_mds_writer_config_default();
    const char *hashes[] = {"md5", "sha1", "xxh64"};
    wc.hashes = hashes;
    wc.n_hashes = 3;
    wc.size_limit = 3000;
    wc.compression = compression;
    wc.exist_ok = true;
    cm_mds_writer *w;
    cr_assert_eq(cm_mds_writer_new(d, k_ref_cols, N_REF_COLS, &wc, &w), CM_OK, "%s", cm_last_error());
    refsample *r = malloc(sizeof *r);
    for (int i = 0; i < 23; i++) {
        ref_sample(i, r);
        cr_assert_eq(cm_mds_writer_write(w, r->v), CM_OK, "sample %d: %s", i, cm_last_error());
    }
    free(r);
    cr_assert_eq(cm_mds_writer_finish(w), CM_OK, "%s", cm_last_error());
    cr_assert_gt(cm_mds_writer_n_shards(w), 2, "the size limit should cut several shards");
    cm_mds_writer_free(w);
    char args[300];
    snprintf(args, sizeof args, "check %s", d);
    run_py(args);
}

Test(mds, python_reads_what_c_writes_raw) { c_writes_python_reads(NULL); }
Test(mds, python_reads_what_c_writes_gz) { c_writes_python_reads("gz:6"); }
Test(mds, python_reads_what_c_writes_bz2) { c_writes_python_reads("bz2"); }
Test(mds, python_reads_what_c_writes_zstd) { c_writes_python_reads("zstd:19"); }
Test(mds, python_reads_what_c_writes_snappy) { c_writes_python_reads("snappy"); }

/* Python writes (with PIL's PNG and JPEG encoders), C reads and checks every value. */
static void python_writes_c_reads(const char *compression) {
    char *d = tmpdir();
    char args[300];
    snprintf(args, sizeof args, "write %s %s", d, compression);
    run_py(args);
    cm_mds_reader_config rc = cm_mds_reader_config_default();
    rc.validate_hash = "md5";
    cm_mds_reader *rd;
    cr_assert_eq(cm_mds_reader_open(d, &rc, &rd), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_mds_reader_len(rd), 23);
    cr_assert_gt(cm_mds_reader_n_shards(rd), 1);
    refsample *r = malloc(sizeof *r);
    for (int i = 0; i < 23; i++) {
        ref_sample(i, r);
        cm_mds_sample s;
        cr_assert_eq(cm_mds_reader_get(rd, i, &s), CM_OK, "%s", cm_last_error());
        for (int k = 0; k < N_REF_COLS; k++) {
            int c = cm_mds_reader_find_column(rd, k_ref_cols[k].name);
            cr_assert_geq(c, 0);
            const cm_mds_value *got = &s.values[c], *want = &r->v[k];
            cr_assert_eq(got->size, want->size, "sample %d column %s: %zu bytes, want %zu", i, k_ref_cols[k].name,
                         got->size, want->size);
            cr_assert_eq(memcmp(got->data, want->data, want->size), 0, "sample %d column %s", i, k_ref_cols[k].name);
            if (want->ndim > 0 && k != 21) {
                cr_assert_eq(got->dtype, want->dtype, "sample %d column %s dtype", i, k_ref_cols[k].name);
                cr_assert_eq(got->ndim, want->ndim);
                for (int dd = 0; dd < want->ndim; dd++) cr_assert_eq(got->shape[dd], want->shape[dd]);
            }
        }
        /* pil: decoded to RGB equals the pixels (gray replicated, alpha dropped) */
        int cp = cm_mds_reader_find_column(rd, "pil");
        cr_assert_str_eq(s.values[cp].mode, r->pil_mode);
        uint8_t rgb[5 * 7 * 3];
        cr_assert_eq(cm_mds_image_decode(CM_MDS_PIL, &s.values[cp], 5, 7, 3, rgb), CM_OK, "%s", cm_last_error());
        int ch = (int[]){1, 3, 4}[i % 3];
        for (int p = 0; p < 35; p++)
            for (int q = 0; q < 3; q++) cr_assert_eq(rgb[3 * p + q], r->pil[p * ch + (ch == 1 ? 0 : q)]);
        /* png: lossless, equals the formula */
        int cg = cm_mds_reader_find_column(rd, "png");
        int pc = i % 2 ? 3 : 1;
        uint8_t px[6 * 4 * 3], want[6 * 4 * 3];
        cr_assert_eq(cm_mds_image_decode(CM_MDS_PNG, &s.values[cg], 6, 4, pc, px), CM_OK, "%s", cm_last_error());
        image_px(i, 6, 4, pc, want);
        cr_assert_eq(memcmp(px, want, (size_t)(24 * pc)), 0, "sample %d png pixels", i);
        /* jpeg: libjpeg's decode equals PIL's (stored by Python in column jpx) */
        int cj = cm_mds_reader_find_column(rd, "jpg"), cx = cm_mds_reader_find_column(rd, "jpx");
        uint8_t jp[8 * 16 * 3];
        cr_assert_eq(cm_mds_image_decode(CM_MDS_JPEG, &s.values[cj], 8, 16, 3, jp), CM_OK, "%s", cm_last_error());
        cr_assert_eq(s.values[cx].size, sizeof jp);
        for (size_t p = 0; p < sizeof jp; p++) {
            int dlt = jp[p] - ((const uint8_t *)s.values[cx].data)[p];
            cr_assert(dlt >= -1 && dlt <= 1, "sample %d jpeg byte %zu: libjpeg %d, PIL %d", i, p, jp[p],
                      ((const uint8_t *)s.values[cx].data)[p]);
        }
        cr_assert_eq(cm_mds_image_decode(CM_MDS_JPEG, &s.values[cj], 8, 15, 3, jp), CM_ERR_FORMAT);
        cr_assert(strstr(cm_last_error(), "8x16"), "%s", cm_last_error());
        /* list[png] and jpeg_array */
        int cl = cm_mds_reader_find_column(rd, "lpng"), ca = cm_mds_reader_find_column(rd, "ja");
        cr_assert_eq(s.values[cl].n_items, i % 3);
        for (int64_t it = 0; it < s.values[cl].n_items; it++) {
            cm_mds_value e;
            cr_assert_eq(cm_mds_list_item(CM_MDS_LIST_PNG, &s.values[cl], it, &e), CM_OK, "%s", cm_last_error());
            uint8_t p9[27], w9[27];
            cr_assert_eq(cm_mds_image_decode(CM_MDS_PNG, &e, 3, 3, 3, p9), CM_OK, "%s", cm_last_error());
            image_px(i + (int)it, 3, 3, 3, w9);
            cr_assert_eq(memcmp(p9, w9, 27), 0);
        }
        cr_assert_eq(s.values[ca].n_items, 1 + i % 2);
        cm_mds_value e;
        cr_assert_eq(cm_mds_list_item(CM_MDS_JPEG_ARRAY, &s.values[ca], s.values[ca].n_items - 1, &e), CM_OK);
        uint8_t g[64];
        cr_assert_eq(cm_mds_image_decode(CM_MDS_JPEG, &e, 8, 8, 1, g), CM_OK, "%s", cm_last_error());
        cr_assert_eq(cm_mds_list_item(CM_MDS_JPEG_ARRAY, &s.values[ca], 5, &e), CM_ERR_INVALID_ARG);
        cm_mds_sample_release(&s);
    }
    free(r);
    cm_mds_reader_free(rd);
}

Test(mds, c_reads_what_python_writes_raw) { python_writes_c_reads("none"); }
Test(mds, c_reads_what_python_writes_gz) { python_writes_c_reads("gz"); }
Test(mds, c_reads_what_python_writes_bz2) { python_writes_c_reads("bz2:9"); }
Test(mds, c_reads_what_python_writes_zstd) { python_writes_c_reads("zstd"); }

Test(mds, brotli_and_every_hash_round_trip) {
    char *d = tmpdir();
    cm_mds_writer_config wc = cm_mds_writer_config_default();
    const char *hashes[] = {"blake2b", "blake2s", "md5", "sha1", "sha256", "sha3_256", "sha512",
                            "xxh128", "xxh32", "xxh3_128", "xxh3_64", "xxh64"};
    wc.hashes = hashes;
    wc.n_hashes = 12;
    wc.compression = "br:5";
    cm_mds_writer *w;
    cr_assert_eq(cm_mds_writer_new(d, k_ref_cols, N_REF_COLS, &wc, &w), CM_OK, "%s", cm_last_error());
    refsample *r = malloc(sizeof *r);
    for (int i = 0; i < 5; i++) {
        ref_sample(i, r);
        cr_assert_eq(cm_mds_writer_write(w, r->v), CM_OK, "%s", cm_last_error());
    }
    cr_assert_eq(cm_mds_writer_finish(w), CM_OK);
    cm_mds_writer_free(w);
    for (int h = 0; h < 12; h++) {
        cm_mds_reader_config rc = cm_mds_reader_config_default();
        rc.validate_hash = hashes[h];
        cm_mds_reader *rd;
        cr_assert_eq(cm_mds_reader_open(d, &rc, &rd), CM_OK, "%s", cm_last_error());
        cm_mds_sample s;
        cr_assert_eq(cm_mds_reader_get(rd, 4, &s), CM_OK, "%s: %s", hashes[h], cm_last_error());
        ref_sample(4, r);
        cr_assert_eq(memcmp(s.values[cm_mds_reader_find_column(rd, "js")].data, r->js, strlen(r->js)), 0);
        cm_mds_sample_release(&s);
        cm_mds_reader_free(rd);
    }
    free(r);
    /* the hex digests are the canonical ones (empty input: xxhash's and hashlib's published values) */
    char p[256];
    snprintf(p, sizeof p, "%s/e", d);
    spit(p, "", 0);
    cm_mds_column col = {"x", "bytes"};
    char *d2 = tmpdir();
    wc = cm_mds_writer_config_default();
    const char *h2[] = {"md5", "xxh32", "xxh64"};
    wc.hashes = h2;
    wc.n_hashes = 3;
    cr_assert_eq(cm_mds_writer_new(d2, &col, 1, &wc, &w), CM_OK);
    cm_mds_value empty = {.data = "", .size = 0};
    cr_assert_eq(cm_mds_writer_write(w, &empty), CM_OK);
    cr_assert_eq(cm_mds_writer_finish(w), CM_OK);
    cm_mds_writer_free(w);
    size_t n;
    snprintf(p, sizeof p, "%s/shard.00000.mds", d2);
    uint8_t *raw = slurp(p, &n);
    free(raw);
    /* a 1-sample shard of one empty bytes value: check the digests with the tools on this machine */
    char cmd[600];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c \"import hashlib,json,sys; d=open('%s','rb').read(); "
             "ix=json.load(open('%s/index.json')); h=ix['shards'][0]['raw_data']['hashes']; "
             "sys.exit(0 if h['md5']==hashlib.md5(d).hexdigest() else 1)\"", p, d2);
    cr_assert_eq(system(cmd), 0, "md5 hexdigest differs from hashlib's");
}

/* ---- faults -------------------------------------------------------------------------------- */

static cm_status get_all(const char *dir, const char *hash) {
    cm_mds_reader_config rc = cm_mds_reader_config_default();
    rc.validate_hash = hash;
    cm_mds_reader *r;
    cm_status st = cm_mds_reader_open(dir, &rc, &r);
    if (st) return st;
    for (int64_t i = 0; i < cm_mds_reader_len(r) && !st; i++) {
        cm_mds_sample s;
        st = cm_mds_reader_get(r, i, &s);
        cm_mds_sample_release(&s);
    }
    cm_mds_reader_free(r);
    return st;
}

Test(mds, a_corrupt_shard_is_a_hash_error_naming_it) {
    char *d = tmpdir();
    copy_dir(REF_RAW, d);
    char p[256];
    snprintf(p, sizeof p, "%s/shard.00001.mds", d);
    size_t n;
    uint8_t *b = slurp(p, &n);
    b[n - 3] ^= 0x20; /* a byte of the last sample's text */
    spit(p, b, n);
    free(b);
    cr_assert_eq(get_all(d, "sha1"), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "shard.00001.mds") && strstr(cm_last_error(), "sha1 checksum failure"), "%s",
              cm_last_error());
    cr_assert_eq(get_all(d, "xxh3_64"), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "xxh3_64"), "%s", cm_last_error());
    cr_assert_eq(get_all(d, NULL), CM_OK, "without validate_hash a flipped text byte is not detectable");
    cr_assert_eq(get_all(d, "md5"), CM_ERR_INVALID_ARG, "md5 is not among the dataset's hashes");
    cr_assert(strstr(cm_last_error(), "md5"), "%s", cm_last_error());
}

Test(mds, a_truncated_shard_is_an_error_naming_it) {
    char *d = tmpdir();
    copy_dir(REF_RAW, d);
    char p[256];
    snprintf(p, sizeof p, "%s/shard.00000.mds", d);
    size_t n;
    uint8_t *b = slurp(p, &n);
    spit(p, b, n - 10);
    free(b);
    cr_assert_eq(get_all(d, NULL), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "shard.00000.mds") && strstr(cm_last_error(), "truncated"), "%s", cm_last_error());
    /* a truncated compressed shard too */
    char *z = tmpdir();
    copy_dir(REF_ZSTD, z);
    snprintf(p, sizeof p, "%s/shard.00001.mds.zstd", z);
    b = slurp(p, &n);
    spit(p, b, n / 2);
    free(b);
    cr_assert_eq(get_all(z, NULL), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "shard.00001.mds.zstd"), "%s", cm_last_error());
    /* a missing shard */
    snprintf(p, sizeof p, "%s/shard.00001.mds.zstd", z);
    unlink(p);
    cr_assert_eq(get_all(z, NULL), CM_ERR_NOT_FOUND);
    cr_assert(strstr(cm_last_error(), "shard.00001.mds"), "%s", cm_last_error());
}

Test(mds, corrupt_offsets_and_sizes_are_caught_without_a_hash) {
    char *d = tmpdir();
    copy_dir(REF_RAW, d);
    char p[256];
    snprintf(p, sizeof p, "%s/shard.00000.mds", d);
    size_t n;
    uint8_t *b = slurp(p, &n);
    b[8] ^= 0x01; /* offsets[1] */
    spit(p, b, n);
    free(b);
    cm_status st = get_all(d, NULL);
    cr_assert_eq(st, CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "shard.00000.mds"), "%s", cm_last_error());
}

Test(mds, bad_index_json_is_a_clear_error) {
    char *d = tmpdir();
    char p[256];
    cr_assert_eq(get_all(d, NULL), CM_ERR_NOT_FOUND);
    cr_assert(strstr(cm_last_error(), "index.json"), "%s", cm_last_error());
    snprintf(p, sizeof p, "%s/index.json", d);
    spit(p, "{\"shards\": [", 12);
    cr_assert_eq(get_all(d, NULL), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "not valid JSON"), "%s", cm_last_error());
    const char *v3 = "{\"shards\": [], \"version\": 3}";
    spit(p, v3, strlen(v3));
    cr_assert_eq(get_all(d, NULL), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "version"), "%s", cm_last_error());
    const char *csv = "{\"shards\": [{\"format\": \"csv\", \"version\": 2}], \"version\": 2}";
    spit(p, csv, strlen(csv));
    cr_assert_eq(get_all(d, NULL), CM_ERR_UNSUPPORTED);
    cr_assert(strstr(cm_last_error(), "'csv'"), "%s", cm_last_error());
    const char *bad = "{\"shards\": [{\"column_encodings\": [\"int\"], \"column_names\": [\"y\"], \"column_sizes\": [4], "
                      "\"compression\": null, \"format\": \"mds\", \"hashes\": [], \"raw_data\": {\"basename\": "
                      "\"shard.00000.mds\", \"bytes\": 10, \"hashes\": {}}, \"samples\": 1, \"size_limit\": null, "
                      "\"version\": 2, \"zip_data\": null}], \"version\": 2}";
    spit(p, bad, strlen(bad));
    cr_assert_eq(get_all(d, NULL), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "column_size"), "%s", cm_last_error());
}

Test(mds, writer_rejects_bad_input_and_writes_nothing_wrong) {
    char *d = tmpdir();
    cm_mds_writer *w;
    cm_mds_writer_config wc = cm_mds_writer_config_default();
    cm_mds_column dup[] = {{"a", "int"}, {"a", "str"}};
    cr_assert_eq(cm_mds_writer_new(d, dup, 2, &wc, &w), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "'a' is given twice"), "%s", cm_last_error());
    const char *unsorted[] = {"sha1", "md5"};
    wc.hashes = unsorted;
    wc.n_hashes = 2;
    cm_mds_column one[] = {{"x", "ndarray:uint8:4"}, {"t", "str"}, {"n", "str_int"}};
    cr_assert_eq(cm_mds_writer_new(d, one, 3, &wc, &w), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "sorted"), "%s", cm_last_error());
    wc.n_hashes = 0;
    wc.compression = "zstd:23";
    cr_assert_eq(cm_mds_writer_new(d, one, 3, &wc, &w), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "zstd:23"), "%s", cm_last_error());
    wc.compression = "lz4";
    cr_assert_eq(cm_mds_writer_new(d, one, 3, &wc, &w), CM_ERR_INVALID_ARG);
    wc.compression = NULL;
    wc.size_limit = (int64_t)1 << 32;
    cr_assert_eq(cm_mds_writer_new(d, one, 3, &wc, &w), CM_ERR_INVALID_ARG);
    wc.size_limit = 1 << 20;
    cr_assert_eq(cm_mds_writer_new(d, one, 3, &wc, &w), CM_OK, "%s", cm_last_error());
    uint8_t px[5] = {1, 2, 3, 4, 5};
    cm_mds_value v[3] = {{.data = px, .size = 4, .dtype = CM_MDS_DT_U8, .ndim = 1, .shape = {4}},
                         {.data = "ok", .size = 2},
                         {.data = "12", .size = 2}};
    cr_assert_eq(cm_mds_writer_write(w, v), CM_OK, "%s", cm_last_error());
    v[0].shape[0] = 5, v[0].size = 5;
    cr_assert_eq(cm_mds_writer_write(w, v), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "'x'") && strstr(cm_last_error(), "shape"), "%s", cm_last_error());
    v[0].shape[0] = 4, v[0].size = 4, v[0].dtype = CM_MDS_DT_I8;
    cr_assert_eq(cm_mds_writer_write(w, v), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "expected uint8, got int8"), "%s", cm_last_error());
    v[0].dtype = CM_MDS_DT_U8;
    v[1] = (cm_mds_value){.data = "\xff\xfe", .size = 2};
    cr_assert_eq(cm_mds_writer_write(w, v), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "UTF-8"), "%s", cm_last_error());
    v[1] = (cm_mds_value){.data = "ok", .size = 2};
    v[2] = (cm_mds_value){.data = "012", .size = 3};
    cr_assert_eq(cm_mds_writer_write(w, v), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "'n'"), "%s", cm_last_error());
    v[2] = (cm_mds_value){.data = "-3", .size = 2};
    cr_assert_eq(cm_mds_writer_write(w, v), CM_OK);
    cr_assert_eq(cm_mds_writer_n_samples(w), 2, "failed writes add no samples");
    cr_assert_eq(cm_mds_writer_finish(w), CM_OK);
    cr_assert_eq(cm_mds_writer_write(w, v), CM_ERR_STATE);
    cm_mds_writer_free(w);
    cr_assert_eq(get_all(d, NULL), CM_OK, "%s", cm_last_error());
    /* the directory now holds a dataset: a new writer refuses it unless exist_ok */
    cr_assert_eq(cm_mds_writer_new(d, one, 3, &wc, &w), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "exist_ok"), "%s", cm_last_error());
    wc.exist_ok = true;
    cr_assert_eq(cm_mds_writer_new(d, one, 3, &wc, &w), CM_OK);
    cm_mds_writer_free(w); /* abandoned: no index.json */
    cr_assert_eq(get_all(d, NULL), CM_ERR_NOT_FOUND);
}

Test(mds, size_limit_cuts_shards_as_streaming) {
    /* Streaming: flush before a record when size_limit < shard_size + len(record) + 4, where
     * shard_size starts at 8 + len(config); records of 8 bytes here. */
    char *d = tmpdir();
    cm_mds_column col = {"y", "int"};
    cm_mds_writer_config wc = cm_mds_writer_config_default();
    cm_mds_writer *w;
    /* config = {"column_encodings": ["int"], ..., "version": 2}: measure it from a 1-shard write */
    wc.size_limit = 0;
    cr_assert_eq(cm_mds_writer_new(d, &col, 1, &wc, &w), CM_OK);
    for (int64_t i = 0; i < 5; i++) cr_assert_eq(cm_mds_writer_write(w, &(cm_mds_value){.data = &i, .size = 8}), CM_OK);
    cr_assert_eq(cm_mds_writer_finish(w), CM_OK);
    cr_assert_eq(cm_mds_writer_n_shards(w), 1);
    cm_mds_writer_free(w);
    char p[256];
    snprintf(p, sizeof p, "%s/shard.00000.mds", d);
    size_t n;
    uint8_t *b = slurp(p, &n);
    uint32_t off0;
    memcpy(&off0, b + 4, 4);
    free(b);
    const int64_t cfg_null = off0 - 4 - 4 * 6; /* with "size_limit": null */
    /* a limit that fits exactly 3 records: 8 + cfg + 3 * 12, where cfg prints the limit itself */
    for (int digits = 2; digits < 6; digits++) {
        int64_t lim = 8 + cfg_null - 4 + digits + 3 * 12;
        if (snprintf(p, sizeof p, "%lld", (long long)lim) == digits) wc.size_limit = lim;
    }
    wc.exist_ok = true;
    cr_assert_eq(cm_mds_writer_new(d, &col, 1, &wc, &w), CM_OK);
    for (int64_t i = 0; i < 7; i++) cr_assert_eq(cm_mds_writer_write(w, &(cm_mds_value){.data = &i, .size = 8}), CM_OK);
    cr_assert_eq(cm_mds_writer_finish(w), CM_OK);
    cr_assert_eq(cm_mds_writer_n_shards(w), 3, "7 records at 3 per shard");
    cm_mds_writer_free(w);
    snprintf(p, sizeof p, "%s/shard.00000.mds", d);
    struct stat stt;
    cr_assert_eq(stat(p, &stt), 0);
    cr_assert_eq(stt.st_size, wc.size_limit, "a full raw shard is exactly Streaming's running size");
}
