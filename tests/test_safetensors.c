/* safetensors: the reference writer's byte-exact vectors, round trips of the shipped files and of a
 * file written from PyTorch, every validation rule of FORMATS.md §4.2 on corrupted files, dtype
 * conversions on load, atomic writes and their failures, injected allocation failures, and Hugging
 * Face sharded checkpoints. */
#define _GNU_SOURCE /* memmem */
#include "cmtest.h"

#include <composer/safetensors.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define VEC_ATTN0 "../shared/data/vectors/safetensors_attn0.safetensors"
#define VEC_MIXED "../shared/data/vectors/safetensors_mixed.safetensors"
#define GOLDEN_TORCH "tests/golden/safetensors_torch.safetensors"

/* ---- helpers ---- */

static unsigned char *slurp(const char *path, size_t *len) { return (unsigned char *)cmt_read_file(path, len); }

static void spit(const char *path, const void *data, size_t len) { cmt_write_file(path, data, len); }

static void assert_bytes_eq(const char *what, const unsigned char *got, size_t gl, const unsigned char *want,
                            size_t wl) {
    size_t k = 0;
    while (k < gl && k < wl && got[k] == want[k]) k++;
    cr_assert(gl == wl && k == wl, "%s: %zu bytes vs %zu expected; first difference at byte %zu (0x%02x vs 0x%02x)",
              what, gl, wl, k, k < gl ? got[k] : 0, k < wl ? want[k] : 0);
}

/* A file: 8-byte N = strlen(hdr), the header as given, then `dlen` data bytes (0, 1, 2, ...). */
static unsigned char *mk(const char *hdr, size_t dlen, size_t *len) {
    size_t n = strlen(hdr);
    unsigned char *b = malloc(8 + n + dlen + 1);
    uint64_t nn = n;
    memcpy(b, &nn, 8);
    memcpy(b + 8, hdr, n);
    for (size_t i = 0; i < dlen; i++) b[8 + n + i] = (unsigned char)i;
    *len = 8 + n + dlen;
    return b;
}

/* Opening buf must fail with `want`, and the message must contain every string given (NULL ends). */
static void expect_bad_buf(const unsigned char *buf, size_t len, cm_status want, ...) {
    cm_safetensors *st = (cm_safetensors *)0x1;
    cm_status s = cm_safetensors_open_memory(buf, len, "bad.safetensors", &st);
    cr_assert_eq(s, want, "expected %s, got %s: %s", cm_status_name(want), cm_status_name(s), cm_last_error());
    cr_assert_null(st, "out must be NULL on failure");
    const char *msg = cm_last_error();
    cr_assert(strstr(msg, "bad.safetensors"), "message does not name the file: %s", msg);
    va_list ap;
    va_start(ap, want);
    for (const char *want_s; (want_s = va_arg(ap, const char *));)
        cr_assert(strstr(msg, want_s), "message lacks '%s': %s", want_s, msg);
    va_end(ap);
}

/* A header (+ data bytes) must be rejected with a message containing the given strings. */
#define EXPECT_BAD(hdr, dlen, ...)                                   \
    do {                                                             \
        size_t len_;                                                 \
        unsigned char *b_ = mk(hdr, dlen, &len_);                    \
        expect_bad_buf(b_, len_, CM_ERR_FORMAT, __VA_ARGS__, NULL);  \
        free(b_);                                                    \
    } while (0)

static cm_safetensors *open_ok(const char *hdr, size_t dlen, unsigned char **keep) {
    size_t len;
    *keep = mk(hdr, dlen, &len);
    cm_safetensors *st;
    cr_assert_eq(cm_safetensors_open_memory(*keep, len, "ok.safetensors", &st), CM_OK, "%s", cm_last_error());
    return st;
}

/* Writes every tensor and metadata entry of st into a new writer (as a user re-saving a file would). */
static cm_safetensors_writer *writer_from(const cm_safetensors *st) {
    cm_safetensors_writer *w;
    cr_assert_eq(cm_safetensors_writer_new(&w), CM_OK);
    for (size_t i = 0; i < cm_safetensors_metadata_count(st); i++) {
        const char *k, *v;
        cr_assert_eq(cm_safetensors_metadata_at(st, i, &k, &v), CM_OK);
        cr_assert_eq(cm_safetensors_writer_add_metadata(w, k, v), CM_OK, "%s", cm_last_error());
    }
    for (size_t i = 0; i < cm_safetensors_count(st); i++) {
        const cm_st_tensor *t = cm_safetensors_at(st, i);
        cr_assert_eq(cm_safetensors_writer_add_raw(w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes), CM_OK,
                     "%s", cm_last_error());
    }
    return w;
}

static char g_tmpdir[64];

static void tmp_setup(void) {
    snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/cm_st_XXXXXX");
    cr_assert(mkdtemp(g_tmpdir), "mkdtemp: %s", strerror(errno));
}

static void tmp_teardown(void) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "chmod -R u+w %s; rm -rf %s", g_tmpdir, g_tmpdir);
    cr_assert_eq(system(cmd), 0);
}

static char *tmp_path(const char *name) {
    static char buf[4][256];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 256, "%s/%s", g_tmpdir, name);
    return p;
}

/* Number of entries in a folder other than . and .. (to prove no temporary file is left). */
static int count_entries(const char *dir) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls -A %s | wc -l", dir);
    FILE *f = popen(cmd, "r");
    int n = -1;
    cr_assert_eq(fscanf(f, "%d", &n), 1);
    pclose(f);
    return n;
}

/* ---- byte-exact vectors of the reference writer (FORMATS.md §4.3) ---- */

Test(vectors, empty_file_is_braces_padded_to_8) {
    cm_safetensors_writer *w;
    cr_assert_eq(cm_safetensors_writer_new(&w), CM_OK);
    void *buf;
    size_t len;
    cr_assert_eq(cm_safetensors_writer_serialize(w, &buf, &len), CM_OK);
    static const unsigned char want[16] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
    assert_bytes_eq("empty", buf, len, want, sizeof want);
    cr_assert_eq(cm_safetensors_writer_size(w), 16u);
    cm_safetensors *st;
    cr_assert_eq(cm_safetensors_open_memory(buf, len, NULL, &st), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_safetensors_count(st), 0u);
    cr_assert(!cm_safetensors_has_metadata(st));
    cm_safetensors_close(st);
    cm_free(buf);
    cm_safetensors_writer_free(w);
}

Test(vectors, metadata_only) {
    cm_safetensors_writer *w;
    cr_assert_eq(cm_safetensors_writer_new(&w), CM_OK);
    cr_assert_eq(cm_safetensors_writer_add_metadata(w, "framework", "pt"), CM_OK);
    void *buf;
    size_t len;
    cr_assert_eq(cm_safetensors_writer_serialize(w, &buf, &len), CM_OK);
    size_t wl;
    unsigned char *want = mk("{\"__metadata__\":{\"framework\":\"pt\"}}     ", 0, &wl);
    cr_assert_eq(wl, 48u);
    cr_assert_eq(want[0], 40);
    assert_bytes_eq("metadata only", buf, len, want, wl);
    cm_safetensors *st;
    cr_assert_eq(cm_safetensors_open_memory(buf, len, NULL, &st), CM_OK, "%s", cm_last_error());
    cr_assert(cm_safetensors_has_metadata(st));
    cr_assert_str_eq(cm_safetensors_metadata_get(st, "framework"), "pt");
    cr_assert_null(cm_safetensors_metadata_get(st, "other"));
    cm_safetensors_close(st);
    free(want);
    cm_free(buf);
    cm_safetensors_writer_free(w);
}

Test(vectors, attn0_matches_the_reference_bytes_and_the_shipped_file) {
    float v[6] = {0, 1, 2, 3, 4, 5};
    int64_t shape[4] = {1, 1, 2, 3};
    cm_tensor *t;
    cr_assert_eq(cm_tensor_from_data(CM_DTYPE_F32, 4, shape, v, &t), CM_OK);
    cm_safetensors_writer *w;
    cr_assert_eq(cm_safetensors_writer_new(&w), CM_OK);
    cr_assert_eq(cm_safetensors_writer_add(w, "attn0", t), CM_OK, "%s", cm_last_error());
    void *buf;
    size_t len;
    cr_assert_eq(cm_safetensors_writer_serialize(w, &buf, &len), CM_OK);
    size_t wl;
    unsigned char *want =
        mk("{\"attn0\":{\"dtype\":\"F32\",\"shape\":[1,1,2,3],\"data_offsets\":[0,24]}}       ", 0, &wl);
    cr_assert_eq(want[0], 72);
    cr_assert_eq(len, wl + 24);
    assert_bytes_eq("attn0 header", buf, wl, want, wl);
    cr_assert_eq(memcmp((unsigned char *)buf + wl, v, 24), 0, "attn0 data differs");
    size_t fl;
    unsigned char *file = slurp(VEC_ATTN0, &fl);
    assert_bytes_eq("attn0 vs " VEC_ATTN0, buf, len, file, fl);
    free(file);
    free(want);
    cm_free(buf);
    cm_safetensors_writer_free(w);
    cm_tensor_free(t);
}

/* ---- reading and round trips ---- */

Test(read, shipped_mixed_file_contents) {
    cm_safetensors *st;
    cr_assert_eq(cm_safetensors_open(VEC_MIXED, &st), CM_OK, "%s", cm_last_error());
    cr_assert_str_eq(cm_safetensors_path(st), VEC_MIXED);
    cr_assert_eq(cm_safetensors_count(st), 4u);
    cr_assert_eq(cm_safetensors_header_len(st), 256u);
    cr_assert_eq(cm_safetensors_file_len(st), 287u);
    /* file order is offset order: I64, F32, BF16, U8 (the reference's dtype-descending order) */
    const char *names[4] = {"z", "a", "b", "m"};
    cm_st_dtype dts[4] = {CM_ST_DTYPE_I64, CM_ST_DTYPE_F32, CM_ST_DTYPE_BF16, CM_ST_DTYPE_U8};
    for (size_t i = 0; i < 4; i++) {
        const cm_st_tensor *t = cm_safetensors_at(st, i);
        cr_assert_str_eq(t->name, names[i]);
        cr_assert_eq(t->dtype, dts[i], "%s: dtype %s", t->name, cm_st_dtype_name(t->dtype));
    }
    cr_assert_null(cm_safetensors_at(st, 4));
    cr_assert_str_eq(cm_safetensors_at_sorted(st, 0)->name, "a");
    cr_assert_str_eq(cm_safetensors_at_sorted(st, 3)->name, "z");
    const cm_st_tensor *b = cm_safetensors_find(st, "b");
    cr_assert_eq(b->ndim, 1);
    cr_assert_eq(b->shape[0], 2);
    cr_assert_eq(b->begin, 16u);
    cr_assert_eq(b->end, 20u);
    cr_assert_eq(b->nbytes, 4u);
    cr_assert_null(cm_safetensors_find(st, "nope"));
    cr_assert_eq(cm_last_status(), CM_ERR_NOT_FOUND);
    cr_assert(strstr(cm_last_error(), "nope") && strstr(cm_last_error(), VEC_MIXED), "%s", cm_last_error());
    cr_assert_str_eq(cm_safetensors_metadata_get(st, "format"), "pt");

    cm_tensor *x;
    cr_assert_eq(cm_safetensors_load(st, "z", CM_DTYPE_I64, &x), CM_OK, "%s", cm_last_error());
    cr_assert_eq(((int64_t *)cm_tensor_data(x))[0], -1);
    cm_tensor_free(x);
    cr_assert_eq(cm_safetensors_load(st, "b", CM_DTYPE_F32, &x), CM_OK, "%s", cm_last_error());
    cr_assert_eq(((float *)cm_tensor_data(x))[0], 1.0f);
    cr_assert_eq(((float *)cm_tensor_data(x))[1], 2.0f);
    cm_tensor_free(x);
    cr_assert_eq(cm_safetensors_load(st, "m", CM_DTYPE_U8, &x), CM_OK, "%s", cm_last_error());
    cr_assert_eq(memcmp(cm_tensor_data(x), "\1\2\3", 3), 0);
    cm_tensor_free(x);
    cm_safetensors_close(st);
}

Test(roundtrip, shipped_files_are_reproduced_byte_for_byte, .init = tmp_setup, .fini = tmp_teardown) {
    const char *files[2] = {VEC_ATTN0, VEC_MIXED};
    for (int f = 0; f < 2; f++) {
        size_t fl;
        unsigned char *want = slurp(files[f], &fl);
        cm_safetensors *st;
        cr_assert_eq(cm_safetensors_open(files[f], &st), CM_OK, "%s", cm_last_error());
        cm_safetensors_writer *w = writer_from(st);
        void *buf;
        size_t len;
        cr_assert_eq(cm_safetensors_writer_serialize(w, &buf, &len), CM_OK, "%s", cm_last_error());
        assert_bytes_eq(files[f], buf, len, want, fl);
        /* and through the atomic file writer */
        const char *out = tmp_path("rt.safetensors");
        cr_assert_eq(cm_safetensors_writer_write(w, out), CM_OK, "%s", cm_last_error());
        size_t gl;
        unsigned char *got = slurp(out, &gl);
        assert_bytes_eq(out, got, gl, want, fl);
        cr_assert_eq(count_entries(g_tmpdir), 1, "temporary file left behind");
        free(got);
        cm_free(buf);
        cm_safetensors_writer_free(w);
        cm_safetensors_close(st);
        free(want);
    }
}

/* The file tests/golden/gen_safetensors.py wrote from PyTorch tensors with tests/golden/stwrite.py. */
Test(torch, every_dtype_reads_back_with_the_expected_values) {
    cm_safetensors *st;
    cr_assert_eq(cm_safetensors_open(GOLDEN_TORCH, &st), CM_OK, "%s (regenerate with 'make golden')", cm_last_error());
    cr_assert_eq(cm_safetensors_count(st), 20u);
    cr_assert_str_eq(cm_safetensors_metadata_get(st, "format"), "pt");
    cr_assert_str_eq(cm_safetensors_metadata_get(st, "note"), "h\xc3\xa9llo \"world\"\n");
    cm_tensor *x;
    /* floating sources, loaded as f32 */
    struct { const char *name; cm_st_dtype dt; int64_t n; double a, b; } fl[] = {
        {"f64", CM_ST_DTYPE_F64, 6, 0.5, -1}, {"f32", CM_ST_DTYPE_F32, 12, 0.125, 0},
        {"f16", CM_ST_DTYPE_F16, 10, 0.25, -1.25}, {"bf16", CM_ST_DTYPE_BF16, 8, 1.5, -6},
    };
    for (size_t k = 0; k < sizeof fl / sizeof fl[0]; k++) {
        const cm_st_tensor *t = cm_safetensors_find(st, fl[k].name);
        cr_assert_not_null(t, "%s", cm_last_error());
        cr_assert_eq(t->dtype, fl[k].dt, "%s: dtype %s", fl[k].name, cm_st_dtype_name(t->dtype));
        cr_assert_eq(t->numel, fl[k].n);
        cr_assert_eq(cm_safetensors_load(st, fl[k].name, CM_DTYPE_F32, &x), CM_OK, "%s", cm_last_error());
        for (int64_t i = 0; i < fl[k].n; i++) {
            float got = ((float *)cm_tensor_data(x))[i], want = (float)(fl[k].a * (double)i + fl[k].b);
            cr_assert_eq(got, want, "%s[%lld]: %g vs %g (tolerance 0)", fl[k].name, (long long)i, got, want);
        }
        cm_tensor_free(x);
    }
    const cm_st_tensor *f64 = cm_safetensors_find(st, "f64");
    cr_assert(f64->ndim == 2 && f64->shape[0] == 2 && f64->shape[1] == 3);
    /* integers, loaded as i64 */
    struct { const char *name; cm_st_dtype dt; int n; int64_t v[6]; } in[] = {
        {"i64", CM_ST_DTYPE_I64, 6, {-(INT64_C(1) << 62), -1, 0, 1, (INT64_C(1) << 53) + 1, INT64_MAX}},
        {"i32", CM_ST_DTYPE_I32, 6, {-3, -2, -1, 0, 1, 2}},
        {"i16", CM_ST_DTYPE_I16, 3, {-32768, 0, 32767}},
        {"i8", CM_ST_DTYPE_I8, 3, {-128, 5, 127}},
        {"u8", CM_ST_DTYPE_U8, 6, {0, 51, 102, 153, 204, 255}},
        {"bool", CM_ST_DTYPE_BOOL, 4, {1, 0, 1, 1}},
    };
    for (size_t k = 0; k < sizeof in / sizeof in[0]; k++) {
        cr_assert_eq(cm_safetensors_find(st, in[k].name)->dtype, in[k].dt, "%s", in[k].name);
        cr_assert_eq(cm_safetensors_load(st, in[k].name, CM_DTYPE_I64, &x), CM_OK, "%s", cm_last_error());
        cr_assert_eq(cm_tensor_numel(x), in[k].n);
        for (int i = 0; i < in[k].n; i++)
            cr_assert_eq(((int64_t *)cm_tensor_data(x))[i], in[k].v[i], "%s[%d]: %lld vs %lld", in[k].name, i,
                         (long long)((int64_t *)cm_tensor_data(x))[i], (long long)in[k].v[i]);
        cm_tensor_free(x);
    }
    /* 0-d and zero-size tensors */
    const cm_st_tensor *sc = cm_safetensors_find(st, "scalar");
    cr_assert(sc->ndim == 0 && sc->numel == 1 && sc->nbytes == 4, "scalar: ndim %d numel %lld", sc->ndim,
              (long long)sc->numel);
    cr_assert_eq(cm_safetensors_load(st, "scalar", CM_DTYPE_F32, &x), CM_OK);
    cr_assert_eq(cm_tensor_ndim(x), 0);
    cr_assert_eq(*(float *)cm_tensor_data(x), 3.5f);
    cm_tensor_free(x);
    const cm_st_tensor *e = cm_safetensors_find(st, "empty_i64");
    cr_assert(e->ndim == 2 && e->shape[0] == 2 && e->shape[1] == 0 && e->numel == 0 && e->nbytes == 0);
    cr_assert_eq(cm_safetensors_load(st, "empty", CM_DTYPE_BF16, &x), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_tensor_numel(x), 0);
    cr_assert_eq(cm_tensor_dim(x, 1), 3);
    cm_tensor_free(x);
    /* non-ASCII names and names that needed escapes */
    cr_assert_eq(cm_safetensors_load(st, "\xc3\xbcn\xc3\xaf" "c\xc3\xb6" "d\xc3\xa9.weight", CM_DTYPE_F32, &x), CM_OK,
                 "%s", cm_last_error());
    cr_assert_eq(((float *)cm_tensor_data(x))[1], -2.0f);
    cm_tensor_free(x);
    cr_assert_not_null(cm_safetensors_find(st, "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e"), "%s", cm_last_error());
    cr_assert_not_null(cm_safetensors_find(st, "emoji_\xf0\x9f\x99\x82"), "%s", cm_last_error());
    cr_assert_not_null(cm_safetensors_find(st, "quo\"te\\back\ttab\x01"), "%s", cm_last_error());
    cm_safetensors_close(st);
}

Test(torch, bf16_and_f16_rounding_matches_torch) {
    cm_safetensors *st;
    cr_assert_eq(cm_safetensors_open(GOLDEN_TORCH, &st), CM_OK, "%s", cm_last_error());
    cm_tensor *r, *rb, *rh, *want_b, *want_h;
    cr_assert_eq(cm_safetensors_load(st, "randn_f32", CM_DTYPE_F32, &r), CM_OK);
    cr_assert_eq(cm_safetensors_load(st, "randn_f32", CM_DTYPE_BF16, &rb), CM_OK); /* converted by us */
    cr_assert_eq(cm_safetensors_load(st, "randn_f32", CM_DTYPE_F16, &rh), CM_OK);
    cr_assert_eq(cm_safetensors_load(st, "randn_bf16", CM_DTYPE_BF16, &want_b), CM_OK); /* rounded by torch */
    cr_assert_eq(cm_safetensors_load(st, "randn_f16", CM_DTYPE_F16, &want_h), CM_OK);
    cr_assert_eq(memcmp(cm_tensor_data(rb), cm_tensor_data(want_b), 128), 0, "f32 -> bf16 differs from torch");
    cr_assert_eq(memcmp(cm_tensor_data(rh), cm_tensor_data(want_h), 128), 0, "f32 -> f16 differs from torch");
    /* copy into an existing tensor converts to its dtype */
    int64_t n = 64;
    cm_tensor *dst;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 1, &n, &dst), CM_OK);
    cr_assert_eq(cm_safetensors_copy(st, "randn_bf16", dst), CM_OK, "%s", cm_last_error());
    for (int i = 0; i < 64; i++) {
        float got = ((float *)cm_tensor_data(dst))[i];
        float want = cm_bf16_to_f32(((uint16_t *)cm_tensor_data(want_b))[i]);
        float orig = ((float *)cm_tensor_data(r))[i];
        cr_assert_eq(got, want, "[%d]: %g vs %g", i, got, want);
        cr_assert(fabsf(got - orig) <= fabsf(orig) * 0x1p-8f, "[%d]: bf16 %g too far from %g", i, got, orig);
    }
    cm_tensor_free(dst);
    cm_tensor_free(r);
    cm_tensor_free(rb);
    cm_tensor_free(rh);
    cm_tensor_free(want_b);
    cm_tensor_free(want_h);
    cm_safetensors_close(st);
}

Test(torch, python_writer_and_ours_agree_byte_for_byte) {
    size_t fl;
    unsigned char *want = slurp(GOLDEN_TORCH, &fl);
    cm_safetensors *st;
    cr_assert_eq(cm_safetensors_open(GOLDEN_TORCH, &st), CM_OK, "%s", cm_last_error());
    cm_safetensors_writer *w = writer_from(st);
    void *buf;
    size_t len;
    cr_assert_eq(cm_safetensors_writer_serialize(w, &buf, &len), CM_OK, "%s", cm_last_error());
    assert_bytes_eq(GOLDEN_TORCH, buf, len, want, fl);
    cm_free(buf);
    cm_safetensors_writer_free(w);
    cm_safetensors_close(st);
    free(want);
}

/* The other golden files (written by the same Python writer) round-trip too. */
Test(roundtrip, golden_files_of_the_op_tests) {
    const char *files[] = {"tests/golden/matmul.safetensors", "tests/golden/norm.safetensors"};
    for (size_t f = 0; f < 2; f++) {
        size_t fl;
        unsigned char *want = slurp(files[f], &fl);
        cm_safetensors *st;
        cr_assert_eq(cm_safetensors_open(files[f], &st), CM_OK, "%s", cm_last_error());
        cm_safetensors_writer *w = writer_from(st);
        void *buf;
        size_t len;
        cr_assert_eq(cm_safetensors_writer_serialize(w, &buf, &len), CM_OK, "%s", cm_last_error());
        assert_bytes_eq(files[f], buf, len, want, fl);
        cm_free(buf);
        cm_safetensors_writer_free(w);
        cm_safetensors_close(st);
        free(want);
    }
}

Test(write, order_is_dtype_descending_then_name_bytes) {
    uint8_t u[2] = {1, 2};
    int64_t i64 = 7, two = 2, one = 1, four = 4;
    float f = 1;
    uint16_t h = 0x3c00;
    uint8_t b = 1, f4 = 0x21;
    cm_safetensors_writer *w;
    cr_assert_eq(cm_safetensors_writer_new(&w), CM_OK);
    cr_assert_eq(cm_safetensors_writer_add_raw(w, "u", CM_ST_DTYPE_U8, 1, &two, u, 2), CM_OK);
    cr_assert_eq(cm_safetensors_writer_add_raw(w, "B", CM_ST_DTYPE_BOOL, 1, &one, &b, 1), CM_OK);
    cr_assert_eq(cm_safetensors_writer_add_raw(w, "\xc3\xa9", CM_ST_DTYPE_F32, 0, NULL, &f, 4), CM_OK);
    cr_assert_eq(cm_safetensors_writer_add_raw(w, "Z", CM_ST_DTYPE_F32, 1, &one, &f, 4), CM_OK);
    cr_assert_eq(cm_safetensors_writer_add_raw(w, "a", CM_ST_DTYPE_I64, 0, NULL, &i64, 8), CM_OK);
    cr_assert_eq(cm_safetensors_writer_add_raw(w, "h", CM_ST_DTYPE_F16, 1, &one, &h, 2), CM_OK);
    cr_assert_eq(cm_safetensors_writer_add_raw(w, "p", CM_ST_DTYPE_F4, 1, &two, &f4, 1), CM_OK); /* packed */
    cr_assert_eq(cm_safetensors_writer_add_raw(w, "e", CM_ST_DTYPE_F32, 1, &four, NULL, 16), CM_ERR_INVALID_ARG);
    void *buf;
    size_t len;
    cr_assert_eq(cm_safetensors_writer_serialize(w, &buf, &len), CM_OK, "%s", cm_last_error());
    cm_safetensors *st;
    cr_assert_eq(cm_safetensors_open_memory(buf, len, NULL, &st), CM_OK, "%s", cm_last_error());
    const char *order[] = {"a", "Z", "\xc3\xa9", "h", "u", "p", "B"};
    for (size_t i = 0; i < 7; i++)
        cr_assert_str_eq(cm_safetensors_at(st, i)->name, order[i], "position %zu", i);
    cr_assert_eq(cm_safetensors_at(st, 2)->ndim, 0);
    /* raw UTF-8 in the header, not \u escapes */
    cr_assert(memmem(buf, len, "\"\xc3\xa9\":{", 5), "non-ASCII name was escaped");
    cm_safetensors_close(st);
    cm_free(buf);
    cm_safetensors_writer_free(w);
}

/* ---- conversions on load ---- */

Test(load, conversions_range_checks_and_refusals) {
    unsigned char *keep;
    /* I64 [3] = {1, 300, -5}; F32 [2]; U64 [1] = 2^63; F8_E4M3 [2]; 9-d U8 */
    char hdr[512];
    snprintf(hdr, sizeof hdr, "%s",
             "{\"i\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[0,24]},"
             "\"f\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[24,32]},"
             "\"u\":{\"dtype\":\"U64\",\"shape\":[1],\"data_offsets\":[32,40]},"
             "\"q\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[40,42]},"
             "\"d\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[42,43]}}");
    if (strlen(hdr) % 2 == 0) strcat(hdr, " "); /* odd header length: the data sits at odd addresses */
    cm_safetensors *st = open_ok(hdr, 43, &keep);
    size_t hl = (size_t)cm_safetensors_header_len(st);
    unsigned char *data = keep + 8 + hl;
    int64_t iv[3] = {1, 300, -5};
    float fv[2] = {1.5f, -2.25f};
    uint64_t uv = UINT64_C(1) << 63;
    memcpy(data, iv, 24);
    memcpy(data + 24, fv, 8);
    memcpy(data + 32, &uv, 8);
    cm_tensor *x;
    cr_assert_eq(cm_safetensors_load(st, "i", CM_DTYPE_I32, &x), CM_OK, "%s", cm_last_error());
    cr_assert_eq(((int32_t *)cm_tensor_data(x))[2], -5);
    cm_tensor_free(x);
    cr_assert_eq(cm_safetensors_load(st, "i", CM_DTYPE_F32, &x), CM_OK);
    cr_assert_eq(((float *)cm_tensor_data(x))[1], 300.0f);
    cm_tensor_free(x);
    cr_assert_eq(cm_safetensors_load(st, "i", CM_DTYPE_U8, &x), CM_ERR_INVALID_ARG);
    cr_assert_null(x);
    cr_assert(strstr(cm_last_error(), "element 1 (300)") && strstr(cm_last_error(), "u8"), "%s", cm_last_error());
    cr_assert_eq(cm_safetensors_load(st, "u", CM_DTYPE_I64, &x), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "9223372036854775808"), "%s", cm_last_error());
    cr_assert_eq(cm_safetensors_load(st, "f", CM_DTYPE_I64, &x), CM_ERR_DTYPE);
    cr_assert(strstr(cm_last_error(), "refusing") && strstr(cm_last_error(), "'f'"), "%s", cm_last_error());
    cr_assert_eq(cm_safetensors_load(st, "q", CM_DTYPE_I32, &x), CM_ERR_DTYPE);
    cr_assert(strstr(cm_last_error(), "F8_E4M3"), "%s", cm_last_error());
    cr_assert_eq(cm_safetensors_load(st, "d", CM_DTYPE_U8, &x), CM_ERR_SHAPE);
    cr_assert(strstr(cm_last_error(), "9 dims"), "%s", cm_last_error());
    cr_assert_eq(cm_safetensors_load(st, "missing", CM_DTYPE_U8, &x), CM_ERR_NOT_FOUND);
    /* copy: shape must match, destination contiguous */
    int64_t three = 3;
    cm_tensor *dst;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_I64, 1, &three, &dst), CM_OK);
    cr_assert_eq(cm_safetensors_copy(st, "f", dst), CM_ERR_SHAPE);
    cr_assert(strstr(cm_last_error(), "[2]") && strstr(cm_last_error(), "(3,)"), "%s", cm_last_error());
    cr_assert_eq(cm_safetensors_copy(st, "i", dst), CM_OK);
    cr_assert_eq(((int64_t *)cm_tensor_data(dst))[1], 300);
    cm_tensor_free(dst);
    /* "i" sits at an odd address: the loads above read it unaligned (UBSan would flag a misaligned
     * access) */
    cr_assert_eq((uintptr_t)cm_safetensors_find(st, "i")->data % 2, 1u, "test setup: expected an odd address");
    cm_safetensors_close(st);
    free(keep);
}

Test(load, float8_decodes_like_torch) {
    /* e4m3fn: 1, 448 (max), 2^-9 (smallest subnormal), -2, NaN, 0.875 (largest subnormal); e5m2: 1,
     * inf, 57344 (max), -2^-16 (smallest subnormal) */
    unsigned char *keep;
    cm_safetensors *st = open_ok("{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[6],\"data_offsets\":[0,6]},"
                                 "\"b\":{\"dtype\":\"F8_E5M2\",\"shape\":[4],\"data_offsets\":[6,10]},"
                                 "\"c\":{\"dtype\":\"F8_E8M0\",\"shape\":[1],\"data_offsets\":[10,11]}}",
                                 11, &keep);
    unsigned char *d = keep + 8 + cm_safetensors_header_len(st);
    const unsigned char bytes[10] = {0x38, 0x7E, 0x01, 0xC0, 0x7F, 0x07, 0x3C, 0x7C, 0x7B, 0x81};
    memcpy(d, bytes, 10);
    const float want[10] = {1, 448, 0x1p-9f, -2, NAN, 0.875f * 0x1p-6f, 1, INFINITY, 57344, -0x1p-16f};
    cm_tensor *x, *y;
    cr_assert_eq(cm_safetensors_load(st, "a", CM_DTYPE_F32, &x), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_safetensors_load(st, "b", CM_DTYPE_F32, &y), CM_OK, "%s", cm_last_error());
    for (int i = 0; i < 10; i++) {
        float got = i < 6 ? ((float *)cm_tensor_data(x))[i] : ((float *)cm_tensor_data(y))[i - 6];
        cr_assert(isnan(want[i]) ? isnan(got) : got == want[i], "[%d] byte 0x%02x: %g vs %g", i, bytes[i], got,
                  want[i]);
    }
    cm_tensor_free(x);
    cm_tensor_free(y);
    cr_assert_eq(cm_safetensors_load(st, "c", CM_DTYPE_F32, &x), CM_ERR_DTYPE);
    cr_assert(strstr(cm_last_error(), "F8_E8M0 has no conversion"), "%s", cm_last_error());
    cm_safetensors_close(st);
    free(keep);
}

/* ---- validation: every rule of FORMATS.md §4.2 ---- */

Test(validate, header_length_rules) {
    unsigned char b[16] = {0};
    for (size_t n = 0; n < 8; n++) expect_bad_buf(b, n, CM_ERR_FORMAT, "too small", "HeaderTooSmall", NULL);
    uint64_t big = 100000001;
    memcpy(b, &big, 8);
    expect_bad_buf(b, 16, CM_ERR_FORMAT, "100000001", "HeaderTooLarge", NULL);
    uint64_t huge = UINT64_MAX;
    memcpy(b, &huge, 8);
    expect_bad_buf(b, 16, CM_ERR_FORMAT, "HeaderTooLarge", NULL);
    uint64_t past = 9; /* 8 header bytes present */
    memcpy(b, &past, 8);
    expect_bad_buf(b, 16, CM_ERR_FORMAT, "past the end", "16 bytes", NULL);
    uint64_t zero = 0;
    memcpy(b, &zero, 8);
    expect_bad_buf(b, 8, CM_ERR_FORMAT, "does not start with '{'", "empty", NULL);
    /* exactly at the limit is allowed by the length rule (then fails later as JSON, not as too large) */
    uint64_t lim = 100000000;
    memcpy(b, &lim, 8);
    expect_bad_buf(b, 16, CM_ERR_FORMAT, "past the end", NULL);
}

Test(validate, header_text_rules) {
    EXPECT_BAD("[1,2]", 0, "does not start with '{'");
    EXPECT_BAD("  {}", 0, "does not start with '{'");
    EXPECT_BAD("{\"a\xff\":1}", 0, "not valid UTF-8", "0xff", "file byte 11");
    EXPECT_BAD("{\"\xc0\x80\":1}", 0, "not valid UTF-8");         /* overlong NUL */
    EXPECT_BAD("{\"\xed\xa0\x80\":1}", 0, "not valid UTF-8");     /* surrogate */
    EXPECT_BAD("{\"\xf4\x90\x80\x80\":1}", 0, "not valid UTF-8"); /* above U+10FFFF */
    EXPECT_BAD("{} x", 0, "after the header's closing '}'");
    static const unsigned char nul_pad[] = {5, 0, 0, 0, 0, 0, 0, 0, '{', '}', 0, ' ', ' '};
    expect_bad_buf(nul_pad, sizeof nul_pad, CM_ERR_FORMAT, "byte 0x00 after the header's closing '}'", NULL);
    EXPECT_BAD("{", 0, "expected a string");
    EXPECT_BAD("{\"a\"}", 0, "expected ':'");
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},}", 4, "expected a string");
    EXPECT_BAD("{\"a\":1}", 0, "tensor 'a'", "expected an object");
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[]}}", 0, "tensor 'a'", "missing field \"data_offsets\"");
    EXPECT_BAD("{\"a\":{\"shape\":[],\"data_offsets\":[0,4]}}", 4, "missing field \"dtype\"");
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4,8]}}", 8, "exactly two");
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4, "shape", "integer");
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "negative");
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", 4, "leading zero");
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1e0],\"data_offsets\":[0,4]}}", 4, "no fraction or exponent");
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,18446744073709551616]}}", 4,
               "larger than 2^64-1");
    EXPECT_BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[9223372036854775808,0],\"data_offsets\":[0,0]}}", 0,
               "larger than 2^63-1");
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":\"[1]\",\"data_offsets\":[0,4]}}", 4, "'[' starting the shape");
    EXPECT_BAD("{\"a\\x\":1}", 0, "invalid escape");
    EXPECT_BAD("{\"a\\ud800\":1}", 0, "high surrogate");
    EXPECT_BAD("{\"a\\udc00\":1}", 0, "lone low surrogate");
    EXPECT_BAD("{\"a\nb\":1}", 0, "raw control character 0x0a");
    EXPECT_BAD("{\"a\\u0000b\":{}}", 0, "U+0000");
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"x\":[[[", 0, "expected a value");
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"x\":tru}}", 0, "expected a JSON value");
}

Test(validate, duplicates_are_rejected) {
    EXPECT_BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
               "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
               2, "tensor 'a'", "appears twice");
    EXPECT_BAD("{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
               "duplicate key \"dtype\"");
    EXPECT_BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
               "duplicate key \"shape\"");
    EXPECT_BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"data_offsets\":[0,1]}}", 1,
               "duplicate key \"data_offsets\"");
    EXPECT_BAD("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate key \"__metadata__\"");
    EXPECT_BAD("{\"__metadata__\":{\"k\":\"1\",\"j\":\"2\",\"k\":\"3\"}}", 0, "duplicate key 'k' in __metadata__");
    /* the same name spelled with an escape is the same key */
    EXPECT_BAD("{\"ab\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},"
               "\"a\\u0062\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}",
               0, "'ab'", "appears twice");
}

Test(validate, metadata_must_map_strings_to_strings) {
    EXPECT_BAD("{\"__metadata__\":{\"epoch\":3}}", 0, "__metadata__ value for key 'epoch' is not a string");
    EXPECT_BAD("{\"__metadata__\":{\"k\":null}}", 0, "not a string");
    EXPECT_BAD("{\"__metadata__\":{\"k\":{\"x\":\"y\"}}}", 0, "not a string");
    EXPECT_BAD("{\"__metadata__\":[\"a\"]}", 0, "__metadata__ must be an object");
    EXPECT_BAD("{\"__metadata__\":\"pt\"}", 0, "__metadata__ must be an object");
    unsigned char *keep;
    cm_safetensors *st = open_ok("{\"__metadata__\":null}", 0, &keep); /* serde reads null as "none" */
    cr_assert(!cm_safetensors_has_metadata(st));
    cm_safetensors_close(st);
    free(keep);
    st = open_ok("{\"__metadata__\":{\"a\\n\":\"\\u00e9\\ud83d\\ude42\"}}", 0, &keep);
    cr_assert_str_eq(cm_safetensors_metadata_get(st, "a\n"), "\xc3\xa9\xf0\x9f\x99\x82");
    cm_safetensors_close(st);
    free(keep);
}

Test(validate, dtype_must_be_known) {
    EXPECT_BAD("{\"w\":{\"dtype\":\"F31\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'w'",
               "unknown dtype 'F31'", "BF16");
    EXPECT_BAD("{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype 'f32'");
    EXPECT_BAD("{\"w\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype must be a string");
    /* every known dtype is accepted, with its bit width */
    for (int d = 0; d < CM_ST_DTYPE_COUNT; d++) {
        char hdr[200];
        int bits = cm_st_dtype_bits((cm_st_dtype)d);
        snprintf(hdr, sizeof hdr, "{\"w\":{\"dtype\":\"%s\",\"shape\":[2,4],\"data_offsets\":[0,%d]}}",
                 cm_st_dtype_name((cm_st_dtype)d), bits);
        unsigned char *keep;
        cm_safetensors *st = open_ok(hdr, (size_t)bits, &keep);
        cr_assert_eq(cm_safetensors_at(st, 0)->dtype, (cm_st_dtype)d);
        cm_safetensors_close(st);
        free(keep);
        cm_st_dtype back;
        cr_assert_eq(cm_st_dtype_parse(cm_st_dtype_name((cm_st_dtype)d), &back), CM_OK);
        cr_assert_eq(back, (cm_st_dtype)d);
    }
}

Test(validate, offsets_must_tile_the_buffer) {
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 20, "tensor 'w'",
               "span 20 bytes but F32 shape [2, 3] needs 24 bytes", "TensorInvalidInfo");
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "tensor 'w'",
               "must start at 0");
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
               12, "tensor 'b'", "gap of 4 bytes after tensor 'a'");
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               8, "tensor 'b'", "overlap tensor 'a'");
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
               4, "overlap");
    EXPECT_BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4, "end before they begin");
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,0]}}", 0,
               "overflows", "ValidationOverflow");
    EXPECT_BAD("{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2, "not a whole number of bytes",
               "MisalignedSlice");
    EXPECT_BAD("{\"a\":{\"dtype\":\"F6_E2M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, "MisalignedSlice");
    EXPECT_BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 5, "1 trailing bytes");
    EXPECT_BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 3, "truncated", "need 4 data bytes");
    EXPECT_BAD("{}", 1, "1 trailing bytes", "MetadataIncompleteBuffer");
    /* valid: header order differs from offset order; zero-size tensors share an offset; packed F4;
     * unknown fields ignored; integers past 2^53 kept exactly; JSON whitespace padding */
    unsigned char *keep;
    cm_safetensors *st = open_ok("{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[4,6]},"
                                 "\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,4]},"
                                 "\"a\":{\"data_offsets\":[0,4],\"extra\":{\"k\":[1,-2.5e3,true,null,\"s\"]},"
                                 "\"dtype\":\"F4\",\"shape\":[8]},"
                                 "\"big\":{\"dtype\":\"U8\",\"shape\":[0,9007199254740993],\"data_offsets\":[6,6]}}"
                                 " \t\r\n  ",
                                 6, &keep);
    const char *order[] = {"a", "z", "b", "big"};
    for (size_t i = 0; i < 4; i++) cr_assert_str_eq(cm_safetensors_at(st, i)->name, order[i], "position %zu", i);
    cr_assert_eq(cm_safetensors_find(st, "big")->shape[1], INT64_C(9007199254740993));
    cr_assert_eq(cm_safetensors_find(st, "a")->nbytes, 4u);
    cr_assert_eq((const unsigned char *)cm_safetensors_find(st, "b")->data - keep,
                 (ptrdiff_t)(8 + cm_safetensors_header_len(st) + 4));
    cm_safetensors_close(st);
    free(keep);
}

/* Every prefix of a valid file is rejected cleanly (no crash, a format error naming the file). */
Test(validate, truncation_at_every_length_is_an_error) {
    const char *files[] = {VEC_MIXED, GOLDEN_TORCH};
    for (size_t f = 0; f < 2; f++) {
        size_t len;
        unsigned char *b = slurp(files[f], &len);
        for (size_t n = 0; n < len; n++) {
            unsigned char *cut = malloc(n ? n : 1); /* exact-size copy so ASan sees any over-read */
            memcpy(cut, b, n);
            cm_safetensors *st;
            cm_status s = cm_safetensors_open_memory(cut, n, "cut", &st);
            cr_assert_eq(s, CM_ERR_FORMAT, "%s cut to %zu bytes: %s (%s)", files[f], n, cm_status_name(s),
                         cm_last_error());
            free(cut);
        }
        free(b);
    }
}

/* Flipping any single byte of the header never crashes (most flips are errors). */
Test(validate, corrupted_header_bytes_never_crash) {
    size_t len;
    unsigned char *b = slurp(VEC_MIXED, &len);
    size_t hdr_end = 8 + 256;
    for (size_t i = 0; i < hdr_end; i++) {
        const unsigned char vals[] = {0x00, '"', '{', '}', '[', ']', ',', ':', '9', 0xff, 'A', ' ', '\\'};
        for (size_t v = 0; v < sizeof vals; v++) {
            unsigned char *c = malloc(len);
            memcpy(c, b, len);
            c[i] = vals[v];
            cm_safetensors *st;
            cm_status s = cm_safetensors_open_memory(c, len, "flip", &st);
            cr_assert(s == CM_OK || s == CM_ERR_FORMAT, "byte %zu = 0x%02x: %s", i, vals[v], cm_status_name(s));
            if (s == CM_OK) cm_safetensors_close(st);
            free(c);
        }
    }
    free(b);
}

Test(validate, errors_from_files_name_the_path, .init = tmp_setup, .fini = tmp_teardown) {
    size_t len;
    unsigned char *b = mk("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 7, &len);
    const char *p = tmp_path("short.safetensors");
    spit(p, b, len);
    cm_safetensors *st;
    cr_assert_eq(cm_safetensors_open(p, &st), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), p) && strstr(cm_last_error(), "truncated"), "%s", cm_last_error());
    spit(p, b, 3);
    cr_assert_eq(cm_safetensors_open(p, &st), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "HeaderTooSmall"), "%s", cm_last_error());
    spit(p, b, 0);
    cr_assert_eq(cm_safetensors_open(p, &st), CM_ERR_FORMAT);
    cr_assert_eq(cm_safetensors_open(tmp_path("missing.safetensors"), &st), CM_ERR_IO);
    cr_assert(strstr(cm_last_error(), "missing.safetensors") && strstr(cm_last_error(), "No such file"), "%s",
              cm_last_error());
    cr_assert_eq(cm_safetensors_open(g_tmpdir, &st), CM_ERR_IO);
    cr_assert(strstr(cm_last_error(), "not a regular file"), "%s", cm_last_error());
    free(b);
}

/* ---- writer errors ---- */

Test(write, bad_inputs_are_named) {
    cm_safetensors_writer *w;
    cr_assert_eq(cm_safetensors_writer_new(&w), CM_OK);
    int64_t two = 2, one = 1;
    float f[2] = {0};
    cr_assert_eq(cm_safetensors_writer_add_raw(w, "__metadata__", CM_ST_DTYPE_F32, 1, &one, f, 4), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "reserved"), "%s", cm_last_error());
    cr_assert_eq(cm_safetensors_writer_add_raw(w, "a\xff", CM_ST_DTYPE_F32, 1, &one, f, 4), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "UTF-8"), "%s", cm_last_error());
    cr_assert_eq(cm_safetensors_writer_add_raw(w, "w", CM_ST_DTYPE_F32, 1, &two, f, 4), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "4 bytes given but F32 needs 8"), "%s", cm_last_error());
    cr_assert_eq(cm_safetensors_writer_add_raw(w, "p", CM_ST_DTYPE_F4, 1, &one, f, 0), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "multiple of 8"), "%s", cm_last_error());
    int64_t neg = -1;
    cr_assert_eq(cm_safetensors_writer_add_raw(w, "n", CM_ST_DTYPE_F32, 1, &neg, f, 0), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_safetensors_writer_add_metadata(w, "k", "v"), CM_OK);
    cr_assert_eq(cm_safetensors_writer_add_metadata(w, "k", "v2"), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "'k' added twice"), "%s", cm_last_error());
    /* non-contiguous tensors are refused */
    cm_tape *tp = cmt_tape();
    int64_t s2[2] = {2, 3};
    cm_tensor *nc = cmt_randn_noncontig(tp, 2, s2, 1, false);
    cr_assert_eq(cm_safetensors_writer_add(w, "nc", nc), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "'nc' is not contiguous"), "%s", cm_last_error());
    cm_tape_free(tp);
    /* a name added twice is reported by the write */
    cr_assert_eq(cm_safetensors_writer_add_raw(w, "w", CM_ST_DTYPE_F32, 1, &one, f, 4), CM_OK);
    cr_assert_eq(cm_safetensors_writer_add_raw(w, "w", CM_ST_DTYPE_F16, 1, &one, f, 2), CM_OK);
    void *buf;
    size_t len;
    cr_assert_eq(cm_safetensors_writer_serialize(w, &buf, &len), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "'w' was added twice"), "%s", cm_last_error());
    cr_assert_eq(cm_safetensors_writer_write(w, "/tmp/never-written.safetensors"), CM_ERR_INVALID_ARG);
    cr_assert_eq(access("/tmp/never-written.safetensors", F_OK), -1);
    cm_safetensors_writer_free(w);
}

Test(write, unwritable_folder_is_an_io_error_naming_the_path, .init = tmp_setup, .fini = tmp_teardown) {
    cm_safetensors_writer *w;
    cr_assert_eq(cm_safetensors_writer_new(&w), CM_OK);
    float f = 1;
    cr_assert_eq(cm_safetensors_writer_add_raw(w, "x", CM_ST_DTYPE_F32, 0, NULL, &f, 4), CM_OK);
    const char *p = tmp_path("no/such/dir/x.safetensors");
    cr_assert_eq(cm_safetensors_writer_write(w, p), CM_ERR_IO);
    cr_assert(strstr(cm_last_error(), p) && strstr(cm_last_error(), "No such file"), "%s", cm_last_error());
    /* a regular file where a folder should be */
    spit(tmp_path("file"), "x", 1);
    p = tmp_path("file/x.safetensors");
    cr_assert_eq(cm_safetensors_writer_write(w, p), CM_ERR_IO);
    cr_assert(strstr(cm_last_error(), p) && strstr(cm_last_error(), "Not a directory"), "%s", cm_last_error());
    /* a read-only folder (root ignores permissions, so only checked as a normal user) */
    if (geteuid() != 0) {
        cr_assert_eq(mkdir(tmp_path("ro"), 0500), 0);
        p = tmp_path("ro/x.safetensors");
        cr_assert_eq(cm_safetensors_writer_write(w, p), CM_ERR_IO);
        cr_assert(strstr(cm_last_error(), p) && strstr(cm_last_error(), "Permission denied"), "%s", cm_last_error());
        cr_assert_eq(count_entries(tmp_path("ro")), 0);
    }
    /* a folder where the file should be: the rename fails, the temporary file is removed */
    cr_assert_eq(mkdir(tmp_path("isdir"), 0700), 0);
    cr_assert_eq(cm_safetensors_writer_write(w, tmp_path("isdir")), CM_ERR_IO);
    cr_assert(strstr(cm_last_error(), "renaming"), "%s", cm_last_error());
    cr_assert_eq(count_entries(g_tmpdir), geteuid() != 0 ? 3 : 2, "temporary file left behind");
    cm_safetensors_writer_free(w);
}

/* A full disk (simulated with a file-size limit: writes fail with EFBIG) leaves no partial file, and
 * an existing file at the path keeps its old contents. */
Test(write, full_disk_leaves_no_partial_file_and_keeps_the_old_one, .init = tmp_setup, .fini = tmp_teardown) {
    const char *p = tmp_path("model.safetensors");
    spit(p, "old contents", 12);
    static unsigned char big[1 << 16];
    int64_t n = sizeof big;
    cm_safetensors_writer *w;
    cr_assert_eq(cm_safetensors_writer_new(&w), CM_OK);
    cr_assert_eq(cm_safetensors_writer_add_raw(w, "big", CM_ST_DTYPE_U8, 1, &n, big, sizeof big), CM_OK);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {.rlim_cur = 4096, .rlim_max = RLIM_INFINITY};
    getrlimit(RLIMIT_FSIZE, &rl);
    struct rlimit small = {.rlim_cur = 4096, .rlim_max = rl.rlim_max};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &small), 0);
    cm_status s = cm_safetensors_writer_write(w, p);
    setrlimit(RLIMIT_FSIZE, &rl);
    cr_assert_eq(s, CM_ERR_IO, "%s", cm_last_error());
    cr_assert(strstr(cm_last_error(), p) && strstr(cm_last_error(), "full"), "%s", cm_last_error());
    cr_assert_eq(count_entries(g_tmpdir), 1, "a partial or temporary file was left");
    size_t len;
    unsigned char *old = slurp(p, &len);
    cr_assert(len == 12 && memcmp(old, "old contents", 12) == 0, "the old file was damaged");
    free(old);
    /* without the limit the same write succeeds and replaces the file */
    cr_assert_eq(cm_safetensors_writer_write(w, p), CM_OK, "%s", cm_last_error());
    cm_safetensors *st;
    cr_assert_eq(cm_safetensors_open(p, &st), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_safetensors_find(st, "big")->nbytes, sizeof big);
    cm_safetensors_close(st);
    cm_safetensors_writer_free(w);
}

/* ---- injected allocation failures: a clean CM_ERR_OOM at every point, no leak (ASan) ---- */

Test(alloc, every_failing_allocation_in_open_is_clean) {
    size_t len;
    unsigned char *b = slurp(GOLDEN_TORCH, &len);
    for (int by_path = 0; by_path < 2; by_path++) {
        for (int64_t n = 1; n < 10000; n++) {
            cm_alloc_fail_at(n);
            cm_safetensors *st = NULL;
            cm_status s = by_path ? cm_safetensors_open(GOLDEN_TORCH, &st)
                                  : cm_safetensors_open_memory(b, len, "mem", &st);
            int64_t made = cm_alloc_fail_at(0);
            cr_assert(s == CM_OK || s == CM_ERR_OOM, "n=%lld: %s (%s)", (long long)n, cm_status_name(s),
                      cm_last_error());
            if (s == CM_OK) {
                cm_tensor *x = NULL;
                cr_assert_eq(cm_safetensors_load(st, "f64", CM_DTYPE_F32, &x), CM_OK);
                cm_tensor_free(x);
            } else {
                cr_assert_null(st);
            }
            cm_safetensors_close(st);
            if (made < n) break;
            cr_assert(n < 9999, "the sweep did not end");
        }
    }
    free(b);
}

Test(alloc, every_failing_allocation_in_write_is_clean, .init = tmp_setup, .fini = tmp_teardown) {
    cm_safetensors *src;
    cr_assert_eq(cm_safetensors_open(GOLDEN_TORCH, &src), CM_OK, "%s", cm_last_error());
    const char *p = tmp_path("w.safetensors");
    for (int64_t n = 1; n < 10000; n++) {
        cm_alloc_fail_at(n);
        cm_safetensors_writer *w = NULL;
        cm_status s = cm_safetensors_writer_new(&w);
        for (size_t i = 0; s == CM_OK && i < cm_safetensors_metadata_count(src); i++) {
            const char *k, *v;
            cm_safetensors_metadata_at(src, i, &k, &v);
            s = cm_safetensors_writer_add_metadata(w, k, v);
        }
        for (size_t i = 0; s == CM_OK && i < cm_safetensors_count(src); i++) {
            const cm_st_tensor *t = cm_safetensors_at(src, i);
            s = cm_safetensors_writer_add_raw(w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes);
        }
        void *buf = NULL;
        size_t len;
        if (s == CM_OK) s = cm_safetensors_writer_serialize(w, &buf, &len);
        if (s == CM_OK) s = cm_safetensors_writer_write(w, p);
        int64_t made = cm_alloc_fail_at(0);
        cr_assert(s == CM_OK || s == CM_ERR_OOM, "n=%lld: %s (%s)", (long long)n, cm_status_name(s), cm_last_error());
        cm_free(buf);
        cm_safetensors_writer_free(w);
        cr_assert_leq(count_entries(g_tmpdir), 1, "n=%lld: temporary file left behind", (long long)n);
        if (made < n) break;
    }
    cm_safetensors_close(src);
}

/* ---- sharded checkpoints ---- */

static void write_shard(const char *path, const char *const *names, int n, float base) {
    cm_safetensors_writer *w;
    cr_assert_eq(cm_safetensors_writer_new(&w), CM_OK);
    static float vals[16][3];
    int64_t three = 3;
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < 3; k++) vals[i][k] = base + (float)(10 * i + k);
        cr_assert_eq(cm_safetensors_writer_add_raw(w, names[i], CM_ST_DTYPE_F32, 1, &three, vals[i], 12), CM_OK);
    }
    cr_assert_eq(cm_safetensors_writer_write(w, path), CM_OK, "%s", cm_last_error());
    cm_safetensors_writer_free(w);
}

static void write_text(const char *path, const char *text) { spit(path, text, strlen(text)); }

Test(index, sharded_checkpoint_opens_shards_lazily, .init = tmp_setup, .fini = tmp_teardown) {
    const char *s1[] = {"h.0.w", "wte"}, *s2[] = {"h.1.w", "ln_f"};
    write_shard(tmp_path("model-00001-of-00002.safetensors"), s1, 2, 100);
    write_shard(tmp_path("model-00002-of-00002.safetensors"), s2, 2, 200);
    write_text(tmp_path("model.safetensors.index.json"),
               "{\"metadata\":{\"total_size\":48},\"weight_map\":{"
               "\"wte\":\"model-00001-of-00002.safetensors\",\"h.0.w\":\"model-00001-of-00002.safetensors\","
               "\"h.1.w\":\"model-00002-of-00002.safetensors\",\"ln_f\":\"model-00002-of-00002.safetensors\"}}");
    for (int how = 0; how < 2; how++) {
        cm_safetensors_index *idx;
        cr_assert_eq(cm_safetensors_index_open(how ? tmp_path("model.safetensors.index.json") : g_tmpdir, &idx), CM_OK,
                     "%s", cm_last_error());
        cr_assert_eq(cm_safetensors_index_count(idx), 4u);
        cr_assert_str_eq(cm_safetensors_index_name(idx, 0), "h.0.w");
        cr_assert_str_eq(cm_safetensors_index_file(idx, 3), "model-00001-of-00002.safetensors"); /* wte */
        cr_assert_null(cm_safetensors_index_name(idx, 4));
        cm_tensor *x;
        cr_assert_eq(cm_safetensors_index_load(idx, "ln_f", CM_DTYPE_F32, &x), CM_OK, "%s", cm_last_error());
        cr_assert_eq(((float *)cm_tensor_data(x))[2], 212.0f);
        cm_tensor_free(x);
        const cm_safetensors *f;
        const cm_st_tensor *t;
        cr_assert_eq(cm_safetensors_index_find(idx, "h.0.w", &f, &t), CM_OK, "%s", cm_last_error());
        cr_assert(strstr(cm_safetensors_path(f), "model-00001-of-00002.safetensors"), "%s", cm_safetensors_path(f));
        cr_assert_str_eq(t->name, "h.0.w");
        cr_assert_eq(cm_safetensors_index_find(idx, "nope", &f, &t), CM_ERR_NOT_FOUND);
        cr_assert(strstr(cm_last_error(), "'nope'"), "%s", cm_last_error());
        cr_assert_null(f);
        cm_safetensors_index_close(idx);
    }
    /* a missing shard is reported when first needed, naming the file and the tensor */
    cr_assert_eq(unlink(tmp_path("model-00002-of-00002.safetensors")), 0);
    cm_safetensors_index *idx;
    cr_assert_eq(cm_safetensors_index_open(g_tmpdir, &idx), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_safetensors_index_find(idx, "wte", NULL, NULL), CM_OK);
    cr_assert_eq(cm_safetensors_index_find(idx, "ln_f", NULL, NULL), CM_ERR_IO);
    cr_assert(strstr(cm_last_error(), "model-00002-of-00002.safetensors") && strstr(cm_last_error(), "'ln_f'") &&
                  strstr(cm_last_error(), "No such file"),
              "%s", cm_last_error());
    cm_safetensors_index_close(idx);
    /* the map names a tensor its shard does not have */
    write_text(tmp_path("model.safetensors.index.json"),
               "{\"weight_map\":{\"ghost\":\"model-00001-of-00002.safetensors\"}}");
    cr_assert_eq(cm_safetensors_index_open(g_tmpdir, &idx), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_safetensors_index_find(idx, "ghost", NULL, NULL), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "'ghost'") && strstr(cm_last_error(), "no such tensor"), "%s", cm_last_error());
    cm_safetensors_index_close(idx);
}

Test(index, bad_index_files_are_rejected, .init = tmp_setup, .fini = tmp_teardown) {
    const char *p = tmp_path("model.safetensors.index.json");
    struct { const char *text, *want; cm_status s; } cases[] = {
        {"{\"weight_map\":", "not valid JSON", CM_ERR_FORMAT},
        {"{\"metadata\":{}}", "no \"weight_map\" object", CM_ERR_FORMAT},
        {"{\"weight_map\":{\"a\":3}}", "'a' is not a file name string", CM_ERR_FORMAT},
        {"{\"weight_map\":{\"a\":\"../x.safetensors\"}}", "not a relative path", CM_ERR_FORMAT},
        {"{\"weight_map\":{\"a\":\"/etc/x.safetensors\"}}", "not a relative path", CM_ERR_FORMAT},
        {"{\"weight_map\":{\"a\":\"x.safetensors\",\"a\":\"y.safetensors\"}}", "'a' is listed twice", CM_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_text(p, cases[i].text);
        cm_safetensors_index *idx = (cm_safetensors_index *)0x1;
        cr_assert_eq(cm_safetensors_index_open(p, &idx), cases[i].s, "case %zu: %s", i, cm_last_error());
        cr_assert_null(idx);
        cr_assert(strstr(cm_last_error(), cases[i].want) && strstr(cm_last_error(), p), "case %zu: %s", i,
                  cm_last_error());
    }
    unlink(p);
    cm_safetensors_index *idx;
    cr_assert_eq(cm_safetensors_index_open(g_tmpdir, &idx), CM_ERR_NOT_FOUND);
    cr_assert(strstr(cm_last_error(), "model.safetensors.index.json") && strstr(cm_last_error(), g_tmpdir), "%s",
              cm_last_error());
    cr_assert_eq(cm_safetensors_index_open(tmp_path("nope.json"), &idx), CM_ERR_IO);
}

Test(index, folder_with_a_single_model_file, .init = tmp_setup, .fini = tmp_teardown) {
    const char *names[] = {"b", "a"};
    write_shard(tmp_path("model.safetensors"), names, 2, 0);
    cm_safetensors_index *idx;
    cr_assert_eq(cm_safetensors_index_open(g_tmpdir, &idx), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_safetensors_index_count(idx), 2u);
    cr_assert_str_eq(cm_safetensors_index_name(idx, 0), "a");
    cm_tensor *x;
    cr_assert_eq(cm_safetensors_index_load(idx, "b", CM_DTYPE_F32, &x), CM_OK, "%s", cm_last_error());
    cr_assert_eq(((float *)cm_tensor_data(x))[1], 1.0f);
    cm_tensor_free(x);
    cm_safetensors_index_close(idx);
    /* allocation failures while opening an index */
    for (int64_t n = 1; n < 1000; n++) {
        cm_alloc_fail_at(n);
        cm_status s = cm_safetensors_index_open(g_tmpdir, &idx);
        int64_t made = cm_alloc_fail_at(0);
        cr_assert(s == CM_OK || s == CM_ERR_OOM, "n=%lld: %s", (long long)n, cm_last_error());
        if (s == CM_OK) cm_safetensors_index_close(idx);
        if (made < n) break;
    }
}
