/* The dataset formats: llm.c token files, MNIST IDX (real data and generated corrupt files) and
 * CIFAR-10 binary batches (generated), including every way a file can be wrong. */
#define _GNU_SOURCE
#include "cmtest.h"

#include <composer/datasets.h>
#include <ftw.h>
#include <math.h>
#include <sys/stat.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#define MNIST_DIR "../shared/data/mnist"

/* ---- helpers ---------------------------------------------------------------------------- */

static char g_dir[64];

static void make_tmpdir(void) {
    strcpy(g_dir, "/tmp/cm_datasets_XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir), "mkdtemp failed");
}
static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}
static void remove_tmpdir(void) {
    if (g_dir[0]) nftw(g_dir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
    g_dir[0] = 0;
}

static const char *tmp_path(const char *name) {
    static char buf[4][256];
    static int k;
    char *p = buf[k++ & 3];
    snprintf(p, 256, "%s/%s", g_dir, name);
    return p;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot create %s", path);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

static void write_gz(const char *path, const void *data, size_t n) {
    gzFile g = gzopen(path, "wb");
    cr_assert_not_null(g, "cannot create %s", path);
    cr_assert_eq(gzwrite(g, data, (unsigned)n), (int)n);
    gzclose(g);
}

/* Checks a failure: status, and a message containing the file name and each fragment. */
static void expect_fail(cm_status got, cm_status want, const char *file, const char *frag1, const char *frag2) {
    const char *msg = cm_last_error();
    cr_assert_eq(got, want, "status %s, want %s (message: %s)", cm_status_name(got), cm_status_name(want), msg);
    if (file) cr_assert(strstr(msg, file), "message does not name '%s': %s", file, msg);
    if (frag1) cr_assert(strstr(msg, frag1), "message lacks '%s': %s", frag1, msg);
    if (frag2) cr_assert(strstr(msg, frag2), "message lacks '%s': %s", frag2, msg);
}

/* A token file image: header + tokens (values t(i) = (i * 7919 + 3) mod modulus). */
static uint8_t *token_file(int version, int32_t count, uint32_t modulus, size_t *size) {
    int w = version == 1 ? 2 : 4;
    *size = 1024 + (size_t)count * (size_t)w;
    uint8_t *b = calloc(1, *size);
    int32_t hdr[3] = {20240520, version, count};
    memcpy(b, hdr, sizeof hdr);
    for (int32_t i = 0; i < count; i++) {
        uint32_t v = (uint32_t)(((uint64_t)i * 7919 + 3) % modulus);
        if (w == 2) {
            uint16_t s = (uint16_t)v;
            memcpy(b + 1024 + 2 * (size_t)i, &s, 2);
        } else {
            memcpy(b + 1024 + 4 * (size_t)i, &v, 4);
        }
    }
    return b;
}
static int64_t tok_at(int64_t i, uint32_t modulus) { return (int64_t)(((uint64_t)i * 7919 + 3) % modulus); }

/* ---- token files ------------------------------------------------------------------------ */

static void check_token_windows(int version, uint32_t modulus, cm_dtype dt) {
    make_tmpdir();
    size_t size;
    const int32_t count = 1001;
    uint8_t *b = token_file(version, count, modulus, &size);
    const char *path = tmp_path("toks.bin");
    write_bytes(path, b, size);
    free(b);
    cm_tokens_config cfg = cm_tokens_config_default();
    cfg.seq_len = 16;
    cfg.dtype = dt;
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_tokens_new(path, &cfg, &ds), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_dataset_len(ds), (count - 1) / 16, "len %lld, want %d", (long long)cm_dataset_len(ds),
                 (count - 1) / 16);
    cr_assert_str_eq(cm_dataset_type_name(ds), "tokens");
    cr_assert_eq(cm_dataset_n_fields(ds), 2);
    cr_assert_str_eq(cm_dataset_field(ds, 0)->name, "input_ids");
    cr_assert_str_eq(cm_dataset_field(ds, 1)->name, "labels");
    cr_assert_eq(cm_dataset_field(ds, 0)->dtype, dt);
    cr_assert_eq(cm_dataset_field(ds, 1)->shape[0], 16);
    cr_assert_eq(cm_dataset_n_tokens(ds, 3), 16);
    int64_t in64[16], lab64[16];
    int32_t in32[16], lab32[16];
    for (int64_t i = 0; i < cm_dataset_len(ds); i++) {
        void *out[2] = {dt == CM_DTYPE_I64 ? (void *)in64 : (void *)in32, dt == CM_DTYPE_I64 ? (void *)lab64 : (void *)lab32};
        cr_assert_eq(cm_dataset_get(ds, i, NULL, out), CM_OK, "%s", cm_last_error());
        for (int j = 0; j < 16; j++) {
            int64_t gi = dt == CM_DTYPE_I64 ? in64[j] : in32[j];
            int64_t gl = dt == CM_DTYPE_I64 ? lab64[j] : lab32[j];
            cr_assert_eq(gi, tok_at(i * 16 + j, modulus), "sample %lld input %d: %lld, want %lld", (long long)i, j,
                         (long long)gi, (long long)tok_at(i * 16 + j, modulus));
            cr_assert_eq(gl, tok_at(i * 16 + j + 1, modulus), "sample %lld label %d: %lld, want %lld", (long long)i, j,
                         (long long)gl, (long long)tok_at(i * 16 + j + 1, modulus));
        }
    }
    cm_dataset_free(ds);
    remove_tmpdir();
}

Test(tokens, uint16_file_gives_exact_shifted_windows_as_i32) { check_token_windows(1, 50257, CM_DTYPE_I32); }
Test(tokens, uint16_file_gives_exact_shifted_windows_as_i64) { check_token_windows(1, 65536, CM_DTYPE_I64); }
Test(tokens, uint32_file_gives_exact_shifted_windows_as_i32) { check_token_windows(2, 200003, CM_DTYPE_I32); }
Test(tokens, uint32_file_gives_exact_shifted_windows_as_i64) { check_token_windows(2, 4000000007u, CM_DTYPE_I64); }

Test(tokens, length_counts_whole_windows_and_the_last_window_may_end_at_the_last_token) {
    make_tmpdir();
    size_t size;
    uint8_t *b = token_file(1, 9, 100, &size); /* 9 tokens, T = 4: windows [0,5) and [4,9) */
    write_bytes(tmp_path("t.bin"), b, size);
    free(b);
    cm_tokens_config cfg = {.seq_len = 4, .dtype = CM_DTYPE_I32};
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_tokens_new(tmp_path("t.bin"), &cfg, &ds), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_dataset_len(ds), 2);
    int32_t in[4], lab[4];
    void *out[2] = {in, lab};
    cr_assert_eq(cm_dataset_get(ds, 1, NULL, out), CM_OK);
    cr_assert_eq(lab[3], tok_at(8, 100), "last label %d, want token 8 = %lld", lab[3], (long long)tok_at(8, 100));
    cr_assert_eq(cm_dataset_get(ds, 2, NULL, out), CM_ERR_INVALID_ARG);
    cm_dataset_free(ds);
    /* exactly seq_len + 1 tokens: one sample */
    b = token_file(2, 5, 100, &size);
    write_bytes(tmp_path("t5.bin"), b, size);
    free(b);
    cr_assert_eq(cm_dataset_tokens_new(tmp_path("t5.bin"), &cfg, &ds), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_dataset_len(ds), 1);
    cm_dataset_free(ds);
    remove_tmpdir();
}

Test(tokens, a_glob_pattern_opens_every_shard_in_sorted_order) {
    make_tmpdir();
    /* shards of 21, 9 and 40 tokens at T = 4: 5, 2 and 9 samples; a non-matching file is ignored */
    const int32_t counts[3] = {21, 9, 40};
    const char *names[3] = {"shard_000.bin", "shard_001.bin", "shard_002.bin"};
    for (int s = 0; s < 3; s++) {
        size_t size;
        uint8_t *b = token_file(s == 1 ? 2 : 1, counts[s], 1000 + (uint32_t)s, &size);
        write_bytes(tmp_path(names[s]), b, size);
        free(b);
    }
    write_bytes(tmp_path("other.bin"), "x", 1);
    cm_tokens_config cfg = {.seq_len = 4, .dtype = CM_DTYPE_I64};
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_tokens_new(tmp_path("shard_*.bin"), &cfg, &ds), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_dataset_len(ds), 16, "len %lld, want 5 + 2 + 9", (long long)cm_dataset_len(ds));
    int64_t in[4], lab[4], idx = 0;
    for (int s = 0; s < 3; s++)
        for (int64_t i = 0; i < (counts[s] - 1) / 4; i++, idx++) {
            cr_assert_eq(cm_dataset_get(ds, idx, NULL, (void *[]){in, lab}), CM_OK, "%s", cm_last_error());
            for (int j = 0; j < 4; j++) {
                cr_assert_eq(in[j], tok_at(i * 4 + j, 1000 + (uint32_t)s), "sample %lld (shard %d) input %d",
                             (long long)idx, s, j);
                cr_assert_eq(lab[j], tok_at(i * 4 + j + 1, 1000 + (uint32_t)s), "sample %lld (shard %d) label %d",
                             (long long)idx, s, j);
            }
        }
    cm_dataset_free(ds);
    expect_fail(cm_dataset_tokens_new(tmp_path("nothing_*.bin"), &cfg, &ds), CM_ERR_NOT_FOUND, "nothing_*.bin",
                "matches no file", NULL);
    /* one bad shard fails the whole set, by name */
    write_bytes(tmp_path("shard_003.bin"), "\x01\x02", 2);
    expect_fail(cm_dataset_tokens_new(tmp_path("shard_*.bin"), &cfg, &ds), CM_ERR_FORMAT, "shard_003.bin", NULL, NULL);
    remove_tmpdir();
}

Test(tokens, seq_len_longer_than_the_file_names_file_count_and_seq_len) {
    make_tmpdir();
    size_t size;
    uint8_t *b = token_file(1, 100, 100, &size);
    write_bytes(tmp_path("short.bin"), b, size);
    free(b);
    cm_tokens_config cfg = {.seq_len = 100, .dtype = CM_DTYPE_I32};
    cm_dataset *ds = (cm_dataset *)1;
    expect_fail(cm_dataset_tokens_new(tmp_path("short.bin"), &cfg, &ds), CM_ERR_INVALID_ARG, "short.bin", "seq_len 100",
                "only 100");
    cr_assert_null(ds);
    cfg.seq_len = INT64_MAX;
    expect_fail(cm_dataset_tokens_new(tmp_path("short.bin"), &cfg, &ds), CM_ERR_INVALID_ARG, "short.bin", "only 100",
                NULL);
    remove_tmpdir();
}

Test(tokens, every_corruption_gets_an_error_naming_the_file) {
    make_tmpdir();
    size_t size;
    uint8_t *good = token_file(1, 64, 1000, &size); /* 1024 + 128 bytes */
    const char *p = tmp_path("bad.bin");
    cm_tokens_config cfg = {.seq_len = 8, .dtype = CM_DTYPE_I32};
    cm_dataset *ds;
    /* truncated at several points: inside the header and inside the tokens */
    size_t cuts[] = {0, 3, 12, 1000, 1023, 1024, 1025, 1024 + 64, size - 1};
    for (size_t k = 0; k < sizeof cuts / sizeof *cuts; k++) {
        write_bytes(p, good, cuts[k]);
        cm_status st = cm_dataset_tokens_new(p, &cfg, &ds);
        cr_assert_eq(st, CM_ERR_FORMAT, "cut at %zu: %s (%s)", cuts[k], cm_status_name(st), cm_last_error());
        cr_assert(strstr(cm_last_error(), p), "cut at %zu: message does not name the file: %s", cuts[k],
                  cm_last_error());
        cr_assert(strstr(cm_last_error(), cuts[k] < 1024 ? "shorter than the 1024-byte" : "truncated"),
                  "cut at %zu: %s", cuts[k], cm_last_error());
    }
    /* trailing bytes */
    uint8_t *big = calloc(1, size + 6);
    memcpy(big, good, size);
    write_bytes(p, big, size + 6);
    expect_fail(cm_dataset_tokens_new(p, &cfg, &ds), CM_ERR_FORMAT, p, "6 trailing bytes", NULL);
    /* header count larger than the file (a count mismatch from the other side) */
    int32_t c = 65;
    memcpy(big, good, size);
    memcpy(big + 8, &c, 4);
    write_bytes(p, big, size);
    expect_fail(cm_dataset_tokens_new(p, &cfg, &ds), CM_ERR_FORMAT, p, "65 tokens", "truncated");
    c = -5;
    memcpy(big + 8, &c, 4);
    write_bytes(p, big, size);
    expect_fail(cm_dataset_tokens_new(p, &cfg, &ds), CM_ERR_FORMAT, p, "negative token count -5", NULL);
    /* wrong magic, unknown version */
    memcpy(big, good, size);
    int32_t m = 20240521;
    memcpy(big, &m, 4);
    write_bytes(p, big, size);
    expect_fail(cm_dataset_tokens_new(p, &cfg, &ds), CM_ERR_FORMAT, p, "bad magic 20240521", "20240520");
    memcpy(big, good, size);
    int32_t v = 3;
    memcpy(big + 4, &v, 4);
    write_bytes(p, big, size);
    expect_fail(cm_dataset_tokens_new(p, &cfg, &ds), CM_ERR_FORMAT, p, "version 3", NULL);
    /* an MNIST file is not a token file */
    expect_fail(cm_dataset_tokens_new(MNIST_DIR "/t10k-labels-idx1-ubyte.gz", &cfg, &ds), CM_ERR_FORMAT,
                "t10k-labels-idx1-ubyte.gz", "bad magic", NULL);
    /* missing */
    expect_fail(cm_dataset_tokens_new(tmp_path("nope.bin"), &cfg, &ds), CM_ERR_NOT_FOUND, "nope.bin", "no such file",
                NULL);
    free(big);
    free(good);
    remove_tmpdir();
}

Test(tokens, bad_configuration_is_rejected) {
    cm_dataset *ds;
    cm_tokens_config cfg = cm_tokens_config_default();
    cr_assert_eq(cfg.seq_len, 1024);
    cr_assert_eq(cfg.dtype, CM_DTYPE_I32);
    cfg.seq_len = 0;
    expect_fail(cm_dataset_tokens_new("x.bin", &cfg, &ds), CM_ERR_INVALID_ARG, "x.bin", "seq_len 0", NULL);
    cfg = cm_tokens_config_default();
    cfg.dtype = CM_DTYPE_F32;
    expect_fail(cm_dataset_tokens_new("x.bin", &cfg, &ds), CM_ERR_INVALID_ARG, "x.bin", "f32", "i32 or i64");
    cfg = cm_tokens_config_default();
    cfg.vocab_size = -1;
    expect_fail(cm_dataset_tokens_new("x.bin", &cfg, &ds), CM_ERR_INVALID_ARG, "x.bin", "vocab_size -1", NULL);
}

Test(tokens, out_of_vocabulary_and_out_of_int32_tokens_fail_in_get_naming_file_and_position) {
    make_tmpdir();
    size_t size;
    uint8_t *b = token_file(2, 33, 1000, &size);
    uint32_t big = 3000000000u; /* > INT32_MAX */
    memcpy(b + 1024 + 4 * 21, &big, 4);
    write_bytes(tmp_path("v.bin"), b, size);
    free(b);
    cm_tokens_config cfg = {.seq_len = 8, .dtype = CM_DTYPE_I32, .vocab_size = 0};
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_tokens_new(tmp_path("v.bin"), &cfg, &ds), CM_OK, "%s", cm_last_error());
    int32_t in[8], lab[8];
    void *out[2] = {in, lab};
    cr_assert_eq(cm_dataset_get(ds, 0, NULL, out), CM_OK);
    expect_fail(cm_dataset_get(ds, 2, NULL, out), CM_ERR_FORMAT, "v.bin", "position 21", "i64");
    cm_dataset_free(ds);
    cfg.dtype = CM_DTYPE_I64;
    cfg.vocab_size = 500; /* tokens run to 999 */
    cr_assert_eq(cm_dataset_tokens_new(tmp_path("v.bin"), &cfg, &ds), CM_OK, "%s", cm_last_error());
    int64_t in64[8], lab64[8];
    void *out64[2] = {in64, lab64};
    cm_status st = CM_OK;
    int64_t i = 0;
    for (; i < cm_dataset_len(ds) && st == CM_OK; i++) st = cm_dataset_get(ds, i, NULL, out64);
    expect_fail(st, CM_ERR_FORMAT, "v.bin", "vocabulary size 500", NULL);
    cm_dataset_free(ds);
    remove_tmpdir();
}

/* ---- MNIST (real data) ------------------------------------------------------------------ */

static uint64_t checksum_u8(const uint8_t *p, int n, uint64_t *plain_sum) {
    uint64_t s = 0, w = 0;
    for (int i = 0; i < n; i++) {
        s += p[i];
        w += (uint64_t)(i + 1) * p[i];
    }
    *plain_sum = s;
    return w;
}

Test(mnist, real_train_and_test_splits_have_the_known_counts_labels_and_pixels) {
    struct { cm_data_split split; int64_t n; int64_t labels[5]; uint64_t sum, wsum; } want[2] = {
        {CM_SPLIT_TRAIN, 60000, {5, 0, 4, 1, 9}, 27525, 11220489},
        {CM_SPLIT_TEST, 10000, {7, 2, 1, 0, 4}, 18454, 7715336},
    };
    for (int s = 0; s < 2; s++) {
        cm_mnist_config cfg = cm_mnist_config_default();
        cfg.raw_u8 = true;
        cm_dataset *ds;
        cr_assert_eq(cm_dataset_mnist_new(MNIST_DIR, want[s].split, &cfg, &ds), CM_OK, "%s", cm_last_error());
        cr_assert_eq(cm_dataset_len(ds), want[s].n, "len %lld, want %lld", (long long)cm_dataset_len(ds),
                     (long long)want[s].n);
        cr_assert_eq(cm_dataset_field(ds, 0)->dtype, CM_DTYPE_U8);
        uint8_t img[784];
        int64_t label;
        void *out[2] = {img, &label};
        for (int i = 0; i < 5; i++) {
            cr_assert_eq(cm_dataset_get(ds, i, NULL, out), CM_OK);
            cr_assert_eq(label, want[s].labels[i], "split %d label %d: %lld, want %lld", s, i, (long long)label,
                         (long long)want[s].labels[i]);
        }
        cr_assert_eq(cm_dataset_get(ds, 0, NULL, out), CM_OK);
        uint64_t sum, wsum = checksum_u8(img, 784, &sum);
        cr_assert_eq(sum, want[s].sum, "split %d image 0 pixel sum %llu, want %llu", s, (unsigned long long)sum,
                     (unsigned long long)want[s].sum);
        cr_assert_eq(wsum, want[s].wsum, "split %d image 0 weighted sum %llu, want %llu", s, (unsigned long long)wsum,
                     (unsigned long long)want[s].wsum);
        if (s == 0) cr_assert_eq(img[5 * 28 + 13], 0x12, "pixel (5, 13) = %u, want 18", img[5 * 28 + 13]);
        cm_dataset_free(ds);
    }
}

Test(mnist, f32_images_are_normalised_with_the_configured_mean_and_std) {
    cm_mnist_config raw = cm_mnist_config_default();
    raw.raw_u8 = true;
    cm_mnist_config norm = cm_mnist_config_default();
    cr_assert_float_eq(norm.mean, 0.1307f, 1e-7);
    cr_assert_float_eq(norm.std, 0.3081f, 1e-7);
    cm_mnist_config custom = cm_mnist_config_default();
    custom.mean = 0.5f;
    custom.std = 0.25f;
    cm_dataset *dr, *dn, *dc;
    cr_assert_eq(cm_dataset_mnist_new(MNIST_DIR, CM_SPLIT_TEST, &raw, &dr), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_dataset_mnist_new(MNIST_DIR, CM_SPLIT_TEST, &norm, &dn), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_dataset_mnist_new(MNIST_DIR, CM_SPLIT_TEST, NULL, &dc), CM_OK, "%s", cm_last_error());
    cm_dataset_free(dc);
    cr_assert_eq(cm_dataset_mnist_new(MNIST_DIR, CM_SPLIT_TEST, &custom, &dc), CM_OK, "%s", cm_last_error());
    const cm_field_desc *f = cm_dataset_field(dn, 0);
    cr_assert(f->dtype == CM_DTYPE_F32 && f->ndim == 3 && f->shape[0] == 1 && f->shape[1] == 28 && f->shape[2] == 28);
    cr_assert_eq(cm_dataset_field(dn, 1)->dtype, CM_DTYPE_I64);
    cr_assert_eq(cm_dataset_field(dn, 1)->ndim, 0);
    uint8_t px[784];
    float a[784], b[784];
    int64_t l1, l2, l3;
    for (int64_t i = 0; i < 10000; i += 997) {
        cr_assert_eq(cm_dataset_get(dr, i, NULL, (void *[]){px, &l1}), CM_OK);
        cr_assert_eq(cm_dataset_get(dn, i, NULL, (void *[]){a, &l2}), CM_OK);
        cr_assert_eq(cm_dataset_get(dc, i, NULL, (void *[]){b, &l3}), CM_OK);
        cr_assert(l1 == l2 && l2 == l3);
        for (int k = 0; k < 784; k++) {
            float wa = ((float)px[k] / 255.0f - 0.1307f) / 0.3081f, wb = ((float)px[k] / 255.0f - 0.5f) / 0.25f;
            cr_assert(fabsf(a[k] - wa) <= 1e-6f, "sample %lld px %d: %g, want %g (tol 1e-6)", (long long)i, k, a[k], wa);
            cr_assert(fabsf(b[k] - wb) <= 1e-6f, "sample %lld px %d: %g, want %g (tol 1e-6)", (long long)i, k, b[k], wb);
        }
    }
    cm_dataset_free(dr);
    cm_dataset_free(dn);
    cm_dataset_free(dc);
}

/* ---- MNIST (generated files) ------------------------------------------------------------ */

/* An IDX image file of n 28x28 images (pixel = (i + k) & 255) and labels i % 10. */
static uint8_t *idx_images(uint32_t n, uint32_t h, uint32_t w, size_t *size) {
    *size = 16 + (size_t)n * h * w;
    uint8_t *b = calloc(1, *size);
    uint8_t hdr[16] = {0, 0, 8, 3, (uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8), (uint8_t)n,
                       0, 0, 0, (uint8_t)h, 0, 0, 0, (uint8_t)w};
    memcpy(b, hdr, 16);
    for (size_t k = 0; k < (size_t)n * h * w; k++) b[16 + k] = (uint8_t)((k / (h * w) + k) & 255);
    return b;
}
static uint8_t *idx_labels(uint32_t n, size_t *size) {
    *size = 8 + n;
    uint8_t *b = calloc(1, *size);
    uint8_t hdr[8] = {0, 0, 8, 1, (uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8), (uint8_t)n};
    memcpy(b, hdr, 8);
    for (uint32_t i = 0; i < n; i++) b[8 + i] = (uint8_t)(i % 10);
    return b;
}

Test(mnist, uncompressed_files_are_used_when_the_gz_is_absent) {
    make_tmpdir();
    size_t si, sl;
    uint8_t *im = idx_images(7, 28, 28, &si), *lb = idx_labels(7, &sl);
    write_bytes(tmp_path("t10k-images-idx3-ubyte"), im, si);
    write_bytes(tmp_path("t10k-labels-idx1-ubyte"), lb, sl);
    /* and gzip'd train files, to check both forms */
    write_gz(tmp_path("train-images-idx3-ubyte.gz"), im, si);
    write_gz(tmp_path("train-labels-idx1-ubyte.gz"), lb, sl);
    cm_mnist_config cfg = cm_mnist_config_default();
    cfg.raw_u8 = true;
    for (int s = 0; s < 2; s++) {
        cm_dataset *ds;
        cr_assert_eq(cm_dataset_mnist_new(g_dir, s ? CM_SPLIT_TEST : CM_SPLIT_TRAIN, &cfg, &ds), CM_OK, "%s",
                     cm_last_error());
        cr_assert_eq(cm_dataset_len(ds), 7);
        uint8_t px[784];
        int64_t lab;
        cr_assert_eq(cm_dataset_get(ds, 6, NULL, (void *[]){px, &lab}), CM_OK);
        cr_assert_eq(lab, 6);
        cr_assert_eq(memcmp(px, im + 16 + 6 * 784, 784), 0, "image 6 differs from the file");
        cm_dataset_free(ds);
    }
    free(im);
    free(lb);
    remove_tmpdir();
}

/* Writes a test split from the given images/labels bytes (gzip'd when gz) and expects failure. */
static void mnist_expect(const uint8_t *im, size_t si, const uint8_t *lb, size_t sl, bool gz, cm_status want,
                         const char *file, const char *frag1, const char *frag2) {
    unlink(tmp_path("t10k-images-idx3-ubyte"));
    unlink(tmp_path("t10k-labels-idx1-ubyte"));
    unlink(tmp_path("t10k-images-idx3-ubyte.gz"));
    unlink(tmp_path("t10k-labels-idx1-ubyte.gz"));
    if (gz) {
        if (im) write_gz(tmp_path("t10k-images-idx3-ubyte.gz"), im, si);
        if (lb) write_gz(tmp_path("t10k-labels-idx1-ubyte.gz"), lb, sl);
    } else {
        if (im) write_bytes(tmp_path("t10k-images-idx3-ubyte"), im, si);
        if (lb) write_bytes(tmp_path("t10k-labels-idx1-ubyte"), lb, sl);
    }
    cm_dataset *ds = (cm_dataset *)1;
    expect_fail(cm_dataset_mnist_new(g_dir, CM_SPLIT_TEST, NULL, &ds), want, file, frag1, frag2);
    cr_assert_null(ds);
}

Test(mnist, every_corruption_gets_an_error_naming_the_file) {
    make_tmpdir();
    size_t si, sl;
    uint8_t *im = idx_images(5, 28, 28, &si), *lb = idx_labels(5, &sl);
    /* missing files */
    mnist_expect(NULL, 0, NULL, 0, false, CM_ERR_NOT_FOUND, "t10k-images-idx3-ubyte", "neither", NULL);
    mnist_expect(im, si, NULL, 0, true, CM_ERR_NOT_FOUND, "t10k-labels-idx1-ubyte", "neither", NULL);
    /* truncated at several points, raw and gzip'd */
    size_t cuts[] = {0, 2, 4, 10, 16, 17, si - 1};
    for (size_t k = 0; k < sizeof cuts / sizeof *cuts; k++) {
        mnist_expect(im, cuts[k], lb, sl, false, CM_ERR_FORMAT, "t10k-images-idx3-ubyte", NULL, NULL);
        mnist_expect(im, cuts[k], lb, sl, true, CM_ERR_FORMAT, "t10k-images-idx3-ubyte.gz", NULL, NULL);
    }
    mnist_expect(im, si, lb, sl - 1, false, CM_ERR_FORMAT, "t10k-labels-idx1-ubyte", "truncated", NULL);
    /* a truncated gzip stream (the compressed bytes cut short) */
    {
        uLongf clen = compressBound(si) + 64;
        uint8_t *gzb = malloc(clen);
        z_stream zs = {0};
        deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
        zs.next_in = im;
        zs.avail_in = (uInt)si;
        zs.next_out = gzb;
        zs.avail_out = (uInt)clen;
        cr_assert_eq(deflate(&zs, Z_FINISH), Z_STREAM_END);
        size_t glen = zs.total_out;
        deflateEnd(&zs);
        write_bytes(tmp_path("t10k-labels-idx1-ubyte"), lb, sl);
        for (int cut = 1; cut <= 3; cut++) {
            write_bytes(tmp_path("t10k-images-idx3-ubyte.gz"), gzb, glen * (size_t)cut / 4);
            cm_dataset *ds;
            expect_fail(cm_dataset_mnist_new(g_dir, CM_SPLIT_TEST, NULL, &ds), CM_ERR_FORMAT,
                        "t10k-images-idx3-ubyte.gz", "gzip", NULL);
        }
        /* flipped bytes inside the deflate data */
        gzb[glen / 2] ^= 0xff;
        gzb[glen / 2 + 1] ^= 0x55;
        write_bytes(tmp_path("t10k-images-idx3-ubyte.gz"), gzb, glen);
        cm_dataset *ds;
        cm_status st = cm_dataset_mnist_new(g_dir, CM_SPLIT_TEST, NULL, &ds);
        cr_assert_eq(st, CM_ERR_FORMAT, "%s: %s", cm_status_name(st), cm_last_error());
        cr_assert(strstr(cm_last_error(), "t10k-images-idx3-ubyte.gz"), "%s", cm_last_error());
        free(gzb);
    }
    /* trailing bytes */
    uint8_t *big = calloc(1, si + 3);
    memcpy(big, im, si);
    mnist_expect(big, si + 3, lb, sl, true, CM_ERR_FORMAT, "t10k-images-idx3-ubyte.gz", "3 trailing bytes", NULL);
    /* wrong magic: labels where images belong, images where labels belong, garbage */
    mnist_expect(lb, sl, lb, sl, true, CM_ERR_FORMAT, "t10k-images-idx3-ubyte.gz", "0x00000801", "0x00000803");
    mnist_expect(im, si, im, si, false, CM_ERR_FORMAT, "t10k-labels-idx1-ubyte", "0x00000803", "0x00000801");
    memcpy(big, im, si);
    big[0] = 0x12;
    mnist_expect(big, si, lb, sl, false, CM_ERR_FORMAT, "t10k-images-idx3-ubyte", "bad IDX magic 0x12000803", NULL);
    memcpy(big, im, si);
    big[2] = 0x07;
    mnist_expect(big, si, lb, sl, false, CM_ERR_FORMAT, "t10k-images-idx3-ubyte", "unknown element type 0x07", NULL);
    /* wrong image size */
    size_t s27;
    uint8_t *im27 = idx_images(5, 27, 28, &s27);
    mnist_expect(im27, s27, lb, sl, true, CM_ERR_FORMAT, "t10k-images-idx3-ubyte.gz", "N x 28 x 28", NULL);
    free(im27);
    /* image/label count mismatch */
    size_t sl4;
    uint8_t *lb4 = idx_labels(4, &sl4);
    mnist_expect(im, si, lb4, sl4, true, CM_ERR_FORMAT, "t10k-images-idx3-ubyte.gz", "5 images", "4 labels");
    free(lb4);
    /* a label outside 0..9 */
    lb[8 + 3] = 12;
    mnist_expect(im, si, lb, sl, true, CM_ERR_FORMAT, "t10k-labels-idx1-ubyte.gz", "label 12 at index 3", NULL);
    /* no samples */
    size_t s0, sl0;
    uint8_t *im0 = idx_images(0, 28, 28, &s0), *lb0 = idx_labels(0, &sl0);
    mnist_expect(im0, s0, lb0, sl0, false, CM_ERR_FORMAT, "t10k-images-idx3-ubyte", "no images", NULL);
    free(im0);
    free(lb0);
    free(big);
    free(im);
    free(lb);
    remove_tmpdir();
}

Test(mnist, bad_arguments_are_rejected) {
    cm_dataset *ds;
    expect_fail(cm_dataset_mnist_new(MNIST_DIR, (cm_data_split)7, NULL, &ds), CM_ERR_INVALID_ARG, NULL, "split 7",
                NULL);
    cm_mnist_config cfg = cm_mnist_config_default();
    cfg.std = 0;
    expect_fail(cm_dataset_mnist_new(MNIST_DIR, CM_SPLIT_TEST, &cfg, &ds), CM_ERR_INVALID_ARG, NULL, "std 0", NULL);
    cfg = cm_mnist_config_default();
    cfg.augment.crop_padding = -1;
    expect_fail(cm_dataset_mnist_new(MNIST_DIR, CM_SPLIT_TEST, &cfg, &ds), CM_ERR_INVALID_ARG, NULL, "crop_padding",
                NULL);
    cfg = cm_mnist_config_default();
    cfg.augment.hflip_p = 1.5f;
    expect_fail(cm_dataset_mnist_new(MNIST_DIR, CM_SPLIT_TEST, &cfg, &ds), CM_ERR_INVALID_ARG, NULL, "hflip_p", NULL);
}

/* ---- CIFAR-10 (generated files) --------------------------------------------------------- */

#define REC 3073
/* Record r of the global sequence: label (r * 3) % 10, pixel k of channel c = (r + 5c + k) & 255. */
static void cifar_record(int64_t r, uint8_t *rec) {
    rec[0] = (uint8_t)((r * 3) % 10);
    for (int c = 0; c < 3; c++)
        for (int k = 0; k < 1024; k++) rec[1 + c * 1024 + k] = (uint8_t)((r + 5 * c + k) & 255);
}
/* Writes data_batch_1..5.bin with the given record counts (and test_batch.bin with 3) into dir. */
static void write_cifar(const char *dir, const int counts[5]) {
    int64_t r = 0;
    uint8_t *buf = malloc(REC * 8);
    char path[512];
    for (int f = 0; f <= 5; f++) {
        int n = f < 5 ? counts[f] : 3;
        for (int i = 0; i < n; i++) cifar_record(f < 5 ? r + i : 1000 + i, buf + (size_t)i * REC);
        if (f < 5) {
            snprintf(path, sizeof path, "%s/data_batch_%d.bin", dir, f + 1);
            r += n;
        } else {
            snprintf(path, sizeof path, "%s/test_batch.bin", dir);
        }
        write_bytes(path, buf, (size_t)n * REC);
    }
    free(buf);
}

Test(cifar10, generated_batches_concatenate_in_order_with_exact_pixels_and_labels) {
    make_tmpdir();
    const int counts[5] = {2, 3, 1, 2, 2};
    write_cifar(g_dir, counts);
    cm_cifar10_config raw = cm_cifar10_config_default();
    raw.raw_u8 = true;
    cm_dataset *dr, *dn, *dt;
    cr_assert_eq(cm_dataset_cifar10_new(g_dir, CM_SPLIT_TRAIN, &raw, &dr), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_dataset_cifar10_new(g_dir, CM_SPLIT_TRAIN, NULL, &dn), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_dataset_cifar10_new(g_dir, CM_SPLIT_TEST, &raw, &dt), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_dataset_len(dr), 10, "len %lld, want 10", (long long)cm_dataset_len(dr));
    cr_assert_eq(cm_dataset_len(dt), 3);
    cr_assert_str_eq(cm_dataset_type_name(dr), "cifar10");
    const cm_field_desc *f = cm_dataset_field(dn, 0);
    cr_assert(f->dtype == CM_DTYPE_F32 && f->ndim == 3 && f->shape[0] == 3 && f->shape[1] == 32 && f->shape[2] == 32);
    uint8_t rec[REC], px[3072];
    float img[3072];
    int64_t lab, lab2;
    const float mean[3] = {0.4914f, 0.4822f, 0.4465f}, std[3] = {0.2470f, 0.2435f, 0.2616f};
    for (int64_t i = 0; i < 10; i++) {
        cifar_record(i, rec);
        cr_assert_eq(cm_dataset_get(dr, i, NULL, (void *[]){px, &lab}), CM_OK, "%s", cm_last_error());
        cr_assert_eq(cm_dataset_get(dn, i, NULL, (void *[]){img, &lab2}), CM_OK);
        cr_assert_eq(lab, rec[0], "sample %lld label %lld, want %u", (long long)i, (long long)lab, rec[0]);
        cr_assert_eq(lab2, rec[0]);
        cr_assert_eq(memcmp(px, rec + 1, 3072), 0, "sample %lld pixels differ", (long long)i);
        for (int k = 0; k < 3072; k++) {
            int c = k / 1024;
            float w = ((float)rec[1 + k] / 255.0f - mean[c]) / std[c];
            cr_assert(fabsf(img[k] - w) <= 1e-6f, "sample %lld px %d: %g, want %g", (long long)i, k, img[k], w);
        }
    }
    cifar_record(1002, rec);
    cr_assert_eq(cm_dataset_get(dt, 2, NULL, (void *[]){px, &lab}), CM_OK);
    cr_assert_eq(memcmp(px, rec + 1, 3072), 0, "test sample 2 pixels differ");
    cm_dataset_free(dr);
    cm_dataset_free(dn);
    cm_dataset_free(dt);
    remove_tmpdir();
}

Test(cifar10, the_archive_subfolder_is_found_from_its_parent) {
    make_tmpdir();
    const int counts[5] = {1, 1, 1, 1, 1};
    mkdir(tmp_path("cifar-10-batches-bin"), 0755);
    write_cifar(tmp_path("cifar-10-batches-bin"), counts);
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_cifar10_new(g_dir, CM_SPLIT_TRAIN, NULL, &ds), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_dataset_len(ds), 5);
    cm_dataset_free(ds);
    remove_tmpdir();
}

Test(cifar10, every_corruption_gets_an_error_naming_the_file) {
    make_tmpdir();
    const int counts[5] = {2, 2, 2, 2, 2};
    write_cifar(g_dir, counts);
    cm_dataset *ds = (cm_dataset *)1;
    uint8_t buf[REC * 2];
    for (int64_t i = 0; i < 2; i++) cifar_record(i, buf + i * REC);
    /* truncated at several points */
    size_t cuts[] = {1, 100, REC - 1, REC + 1, 2 * REC - 1};
    for (size_t k = 0; k < sizeof cuts / sizeof *cuts; k++) {
        write_bytes(tmp_path("data_batch_3.bin"), buf, cuts[k]);
        expect_fail(cm_dataset_cifar10_new(g_dir, CM_SPLIT_TRAIN, NULL, &ds), CM_ERR_FORMAT, "data_batch_3.bin",
                    "not a whole number of 3073-byte records", NULL);
        cr_assert_null(ds);
    }
    write_bytes(tmp_path("data_batch_3.bin"), buf, 0);
    expect_fail(cm_dataset_cifar10_new(g_dir, CM_SPLIT_TRAIN, NULL, &ds), CM_ERR_FORMAT, "data_batch_3.bin", "empty",
                NULL);
    unlink(tmp_path("data_batch_3.bin"));
    expect_fail(cm_dataset_cifar10_new(g_dir, CM_SPLIT_TRAIN, NULL, &ds), CM_ERR_NOT_FOUND, "data_batch_3.bin",
                "does not exist", NULL);
    unlink(tmp_path("test_batch.bin"));
    expect_fail(cm_dataset_cifar10_new(g_dir, CM_SPLIT_TEST, NULL, &ds), CM_ERR_NOT_FOUND, "test_batch.bin", NULL,
                NULL);
    /* a bad label byte is caught when the record is read */
    buf[REC] = 11;
    write_bytes(tmp_path("data_batch_3.bin"), buf, 2 * REC);
    cr_assert_eq(cm_dataset_cifar10_new(g_dir, CM_SPLIT_TRAIN, NULL, &ds), CM_OK, "%s", cm_last_error());
    float img[3072];
    int64_t lab;
    cr_assert_eq(cm_dataset_get(ds, 4, NULL, (void *[]){img, &lab}), CM_OK);
    expect_fail(cm_dataset_get(ds, 5, NULL, (void *[]){img, &lab}), CM_ERR_FORMAT, "data_batch_3.bin",
                "record 1 (sample 5) has label 11", NULL);
    cm_dataset_free(ds);
    cm_cifar10_config cfg = cm_cifar10_config_default();
    cfg.std[2] = -1;
    expect_fail(cm_dataset_cifar10_new(g_dir, CM_SPLIT_TRAIN, &cfg, &ds), CM_ERR_INVALID_ARG, NULL, "std[2]", NULL);
    remove_tmpdir();
}

/* ---- thread-safety and determinism across threads ---------------------------------------- */

typedef struct worker_arg {
    cm_dataset *ds;
    int tid, n_threads;
    int64_t n;
    uint64_t *hashes; /* per sample */
} worker_arg;

static void *worker(void *p) {
    worker_arg *a = p;
    float img[784];
    int64_t lab;
    cm_sample_ctx ctx = {.seed = 9, .epoch = 3, .training = true};
    /* each thread walks its share backwards, so the call order differs from the serial pass */
    for (int64_t i = a->n - 1 - a->tid; i >= 0; i -= a->n_threads) {
        if (cm_dataset_get(a->ds, i, &ctx, (void *[]){img, &lab}) != CM_OK) return (void *)1;
        a->hashes[i] = cm_hash64(img, sizeof img, (uint64_t)lab);
    }
    return NULL;
}

Test(mnist, concurrent_augmented_gets_equal_the_serial_results) {
    cm_mnist_config cfg = cm_mnist_config_default();
    cfg.augment = cm_image_augment_default();
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_mnist_new(MNIST_DIR, CM_SPLIT_TEST, &cfg, &ds), CM_OK, "%s", cm_last_error());
    const int64_t n = 2000;
    uint64_t *serial = calloc(n, 8), *par = calloc(n, 8);
    worker_arg one = {ds, 0, 1, n, serial};
    cr_assert_null(worker(&one));
    pthread_t th[4];
    worker_arg args[4];
    for (int t = 0; t < 4; t++) {
        args[t] = (worker_arg){ds, t, 4, n, par};
        pthread_create(&th[t], NULL, worker, &args[t]);
    }
    for (int t = 0; t < 4; t++) {
        void *rc;
        pthread_join(th[t], &rc);
        cr_assert_null(rc, "thread %d failed", t);
    }
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(serial[i], par[i], "sample %lld differs between serial and 4-thread runs", (long long)i);
    free(serial);
    free(par);
    cm_dataset_free(ds);
}

/* ---- out of memory ---------------------------------------------------------------------- */

/* Fails the 1st, 2nd, ... allocation of each constructor until it succeeds: every failure must be
 * CM_ERR_OOM with nothing leaked (the sanitizer build checks) and no dataset returned. */
Test(datasets, every_allocation_failure_in_a_constructor_is_reported_and_leaks_nothing) {
    make_tmpdir();
    size_t size;
    uint8_t *b = token_file(1, 50, 100, &size);
    write_bytes(tmp_path("tok_a.bin"), b, size);
    write_bytes(tmp_path("tok_b.bin"), b, size);
    free(b);
    const int counts[5] = {1, 1, 1, 1, 1};
    write_cifar(g_dir, counts);
    size_t si, sl;
    uint8_t *im = idx_images(3, 28, 28, &si), *lb = idx_labels(3, &sl);
    write_gz(tmp_path("t10k-images-idx3-ubyte.gz"), im, si);
    write_gz(tmp_path("t10k-labels-idx1-ubyte.gz"), lb, sl);
    free(im);
    free(lb);
    cm_tokens_config tc = {.seq_len = 4, .dtype = CM_DTYPE_I32};
    for (int which = 0; which < 3; which++) {
        int n = 1;
        for (;; n++) {
            cm_alloc_fail_at(n);
            cm_dataset *ds = (cm_dataset *)1;
            cm_status st = which == 0   ? cm_dataset_tokens_new(tmp_path("tok_*.bin"), &tc, &ds)
                           : which == 1 ? cm_dataset_mnist_new(g_dir, CM_SPLIT_TEST, NULL, &ds)
                                        : cm_dataset_cifar10_new(g_dir, CM_SPLIT_TRAIN, NULL, &ds);
            cm_alloc_fail_at(0);
            if (st == CM_OK) {
                cm_dataset_free(ds);
                break;
            }
            cr_assert_eq(st, CM_ERR_OOM, "constructor %d, failing allocation %d: %s (%s)", which, n,
                         cm_status_name(st), cm_last_error());
            cr_assert_null(ds);
            cr_assert_lt(n, 100, "constructor %d never succeeds", which);
        }
        cr_assert_gt(n, 2, "constructor %d made only %d allocations: the sweep tested nothing", which, n - 1);
    }
    remove_tmpdir();
}
