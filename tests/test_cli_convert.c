/* `composer data convert --to mds` end to end: token files, MNIST, CIFAR-10 and SST-2 TSV become
 * MDS shards that the streaming dataset reads back sample for sample equal to the source dataset
 * (token windows, normalised and augmented images bit for bit, tokenised sentences); the raw
 * sentences and labels are in the shards too; bad commands get clear messages and exit codes.
 * Runs the built binary (CM_COMPOSER_BIN). */
#include "cmtest.h"

#include <composer/streaming.h>
#include <composer/tokenizer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef CM_COMPOSER_BIN
#error "CM_COMPOSER_BIN must name the composer binary (tests/CMakeLists.txt sets it)"
#endif
#define DIR "build/test_cli_convert"

static char out[1 << 16];

static int run(const char *args) {
    return cmt_run_capturef(out, sizeof out, "%s %s", CM_COMPOSER_BIN, args);
}

static void setup(void) { cr_assert_eq(system("rm -rf " DIR " && mkdir -p " DIR), 0); }
TestSuite(cli_convert, .init = setup);

static cm_dataset *open_mds(const char *dir, cm_streaming_config *cfg) {
    cfg->local = dir;
    cfg->batch_size = 1;
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_streaming_new(cfg, 0, 1, &ds), CM_OK, "%s", cm_last_error());
    return ds;
}

Test(cli_convert, token_file_windows_read_back_as_the_token_dataset) {
    /* a char-tokenized piece of tiny Shakespeare as an llm.c token file */
    FILE *f = fopen("../shared/data/tinyshakespeare/input.txt", "rb");
    cr_assert_not_null(f);
    static char text[20000];
    size_t len = fread(text, 1, sizeof text, f);
    fclose(f);
    cm_tokenizer *tok;
    cr_assert_eq(cm_tokenizer_char_new_from_text(text, len, &tok), CM_OK);
    int32_t *ids;
    int64_t n;
    cr_assert_eq(cm_tokenizer_encode(tok, text, len, &ids, &n), CM_OK);
    cr_assert_eq(cm_token_file_write(DIR "/train.bin", ids, n, CM_TOKEN_WIDTH_AUTO), CM_OK);
    cm_free(ids);
    cm_tokenizer_free(tok);
    int rc = run("data convert --to mds " DIR "/train.bin -o " DIR "/tok --seq-len 64 --size-limit 20kb --compression zstd:5 "
                 "--hashes xxh64");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "(tokens)") && strstr(out, "MDS shards"), "%s", out);
    cm_tokens_config tc = cm_tokens_config_default();
    tc.seq_len = 64;
    cm_dataset *src;
    cr_assert_eq(cm_dataset_tokens_new(DIR "/train.bin", &tc, &src), CM_OK, "%s", cm_last_error());
    cm_streaming_config sc = cm_streaming_config_default();
    sc.max_seq_len = 64;
    sc.validate_hash = "xxh64";
    cm_dataset *ds = open_mds(DIR "/tok", &sc);
    cr_assert_eq(cm_dataset_len(ds), cm_dataset_len(src));
    cr_assert_gt(cm_dataset_len(ds), 300);
    for (int64_t i = 0; i < cm_dataset_len(ds); i++) {
        int32_t a_in[64], a_lab[64];
        int64_t b_in[64], b_lab[64];
        void *oa[2] = {a_in, a_lab}, *ob[2] = {b_in, b_lab};
        cr_assert_eq(cm_dataset_get(src, i, NULL, oa), CM_OK);
        cr_assert_eq(cm_dataset_get(ds, i, NULL, ob), CM_OK, "%s", cm_last_error());
        for (int t = 0; t < 64; t++) {
            cr_assert_eq(b_in[t], a_in[t], "sample %lld input_ids[%d]: mds %lld, token file %d", (long long)i, t,
                         (long long)b_in[t], a_in[t]);
            cr_assert_eq(b_lab[t], a_lab[t], "sample %lld labels[%d]: mds %lld, token file %d", (long long)i, t,
                         (long long)b_lab[t], a_lab[t]);
        }
    }
    cm_dataset_free(ds);
    cm_dataset_free(src);
    /* a second conversion into the same folder is refused without --exist-ok */
    rc = run("data convert --to mds " DIR "/train.bin -o " DIR "/tok");
    cr_assert_eq(rc, 1, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "exist_ok") || strstr(out, "not empty"), "%s", out);
    rc = run("data convert --to mds " DIR "/train.bin -o " DIR "/tok --exist-ok --limit 10 -q");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert_eq(out[0], 0, "-q printed: %s", out);
}

/* The converted images, read with the cifar10/mnist datasets' normalisation (and augmentation),
 * equal those datasets' "image" bit for bit, and the labels. */
static void check_images(const char *mds, cm_dataset *src, int64_t C, int64_t HW, const float *mean, const float *std,
                         const cm_image_augment *aug) {
    cm_streaming_rename rn[2] = {{"x", "image"}, {"y", "label"}};
    cm_streaming_config sc = cm_streaming_config_default();
    sc.image_h = sc.image_w = HW;
    sc.image_c = C;
    for (int c = 0; c < C; c++) sc.image_mean[c] = mean[c], sc.image_std[c] = std[c];
    if (aug) sc.image_augment = *aug;
    sc.renames = rn;
    sc.n_renames = 2;
    cm_dataset *ds = open_mds(mds, &sc);
    cr_assert_eq(cm_dataset_find_field(ds, "image"), 0);
    cr_assert_eq(cm_dataset_find_field(ds, "label"), 1);
    const cm_field_desc *d = cm_dataset_field(ds, 0);
    cr_assert(d->dtype == CM_DTYPE_F32 && d->ndim == 3 && d->shape[0] == C && d->shape[1] == HW && d->shape[2] == HW);
    const int64_t n = cm_dataset_len(ds);
    float a[3 * 32 * 32], b[3 * 32 * 32];
    const cm_sample_ctx ctx = {77, 3, true};
    for (int64_t i = 0; i < n; i++) {
        int64_t la, lb;
        void *oa[2] = {a, &la}, *ob[2] = {b, &lb};
        cr_assert_eq(cm_dataset_get(src, i, aug ? &ctx : NULL, oa), CM_OK);
        cr_assert_eq(cm_dataset_get(ds, i, aug ? &ctx : NULL, ob), CM_OK, "%s", cm_last_error());
        cr_assert_eq(lb, la, "sample %lld: label %lld, source %lld", (long long)i, (long long)lb, (long long)la);
        cr_assert_eq(memcmp(a, b, sizeof(float) * (size_t)(C * HW * HW)), 0, "sample %lld: the image differs", (long long)i);
    }
    cm_dataset_free(ds);
}

Test(cli_convert, mnist_and_cifar10_read_back_bit_for_bit_as_their_datasets) {
    int rc = run("data convert --to mds ../shared/data/mnist -o " DIR "/mnist --split test --limit 300 --hashes sha1");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "(mnist): 300 samples"), "%s", out);
    cm_mnist_config mc = cm_mnist_config_default();
    cm_dataset *src;
    cr_assert_eq(cm_dataset_mnist_new("../shared/data/mnist", CM_SPLIT_TEST, &mc, &src), CM_OK, "%s", cm_last_error());
    check_images(DIR "/mnist", src, 1, 28, &mc.mean, &mc.std, NULL);
    cm_dataset_free(src);

    rc = run("data convert --to mds ../shared/data/cifar10 -o file://" DIR "/cifar --limit 200 --size-limit 200kb "
             "--compression zstd");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "(cifar10): 200 samples -> 4 MDS shards"), "%s", out);
    cm_cifar10_config cc = cm_cifar10_config_default();
    cr_assert_eq(cm_dataset_cifar10_new("../shared/data/cifar10", CM_SPLIT_TRAIN, &cc, &src), CM_OK, "%s", cm_last_error());
    check_images(DIR "/cifar", src, 3, 32, cc.mean, cc.std, NULL);
    cm_dataset_free(src);
    /* with the CIFAR recipe's random crop and flip, for training: the same draws */
    cc.augment = cm_image_augment_default();
    cr_assert_eq(cm_dataset_cifar10_new("../shared/data/cifar10", CM_SPLIT_TRAIN, &cc, &src), CM_OK, "%s", cm_last_error());
    check_images(DIR "/cifar", src, 3, 32, cc.mean, cc.std, &cc.augment);
    cm_dataset_free(src);
    /* raw u8 (H, W, C) without normalisation: the pixels as stored */
    cm_streaming_config sc = cm_streaming_config_default();
    sc.image_h = sc.image_w = 32;
    sc.image_c = 3;
    cm_dataset *ds = open_mds(DIR "/cifar", &sc);
    cr_assert_eq(cm_dataset_field(ds, 0)->dtype, CM_DTYPE_U8);
    cc = cm_cifar10_config_default();
    cc.raw_u8 = true;
    cr_assert_eq(cm_dataset_cifar10_new("../shared/data/cifar10", CM_SPLIT_TRAIN, &cc, &src), CM_OK);
    uint8_t chw[3072], hwc[3072];
    int64_t la, lb;
    void *oa[2] = {chw, &la}, *ob[2] = {hwc, &lb};
    cr_assert_eq(cm_dataset_get(src, 123, NULL, oa), CM_OK);
    cr_assert_eq(cm_dataset_get(ds, 123, NULL, ob), CM_OK, "%s", cm_last_error());
    for (int c = 0; c < 3; c++)
        for (int p = 0; p < 1024; p++) cr_assert_eq(hwc[p * 3 + c], chw[c * 1024 + p], "channel %d pixel %d", c, p);
    cm_dataset_free(ds);
    cm_dataset_free(src);
    /* bad image settings are refused with the key named */
    sc.image_augment = cm_image_augment_default();
    cr_assert_eq(cm_dataset_streaming_new(&sc, 0, 1, &ds), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "image_augment") && strstr(cm_last_error(), "image_std"), "%s", cm_last_error());
    sc = cm_streaming_config_default();
    sc.local = DIR "/cifar";
    sc.batch_size = 1;
    sc.image_h = sc.image_w = 32;
    sc.image_c = 3;
    sc.image_std[0] = 1;
    cr_assert_eq(cm_dataset_streaming_new(&sc, 0, 1, &ds), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "image_std[1]"), "%s", cm_last_error());
    cm_streaming_rename bad[1] = {{"z", "image"}};
    sc.image_std[1] = sc.image_std[2] = 1;
    sc.renames = bad;
    sc.n_renames = 1;
    cr_assert_eq(cm_dataset_streaming_new(&sc, 0, 1, &ds), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "'z'") && strstr(cm_last_error(), "x, y"), "%s", cm_last_error());
    cm_streaming_rename dup[1] = {{"x", "y"}};
    sc.renames = dup;
    cr_assert_eq(cm_dataset_streaming_new(&sc, 0, 1, &ds), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "two fields would be called 'y'"), "%s", cm_last_error());
}

Test(cli_convert, sst2_tsv_reads_back_as_the_sst2_dataset_with_its_sentences) {
    int rc = run("data convert --to mds ../shared/data/sst2/dev.tsv -o " DIR "/sst2 --tokenizer ../shared/data/bert/vocab.txt "
                 "--max-len 24 --size-limit 50kb");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "(tsv): 872 samples"), "%s", out);
    cm_tokenizer *tok;
    cr_assert_eq(cm_tokenizer_wordpiece_new("../shared/data/bert/vocab.txt", true, &tok), CM_OK);
    cm_dataset *src;
    cr_assert_eq(cm_dataset_sst2_new("../shared/data/sst2/dev.tsv", tok, 24, &src), CM_OK, "%s", cm_last_error());
    cm_streaming_config sc = cm_streaming_config_default();
    cm_dataset *ds = open_mds(DIR "/sst2", &sc);
    cr_assert_eq(cm_dataset_len(ds), 872);
    /* the same fields, dtypes and shapes as the sst2 dataset (in index.json's column order) */
    static const char *names[4] = {"input_ids", "attention_mask", "token_type_ids", "label"};
    int map[4];
    for (int f = 0; f < 4; f++) {
        map[f] = cm_dataset_find_field(ds, names[f]);
        cr_assert_geq(map[f], 0, "no field %s", names[f]);
        const cm_field_desc *a = cm_dataset_field(src, f), *b = cm_dataset_field(ds, map[f]);
        cr_assert(a->dtype == b->dtype && a->ndim == b->ndim && a->shape[0] == b->shape[0], "field %s", names[f]);
    }
    cm_mds_reader *rd;
    cr_assert_eq(cm_mds_reader_open(DIR "/sst2", NULL, &rd), CM_OK, "%s", cm_last_error());
    const int sent_col = cm_mds_reader_find_column(rd, "sentence");
    cr_assert_geq(sent_col, 0);
    FILE *f = fopen("../shared/data/sst2/dev.tsv", "r");
    char line[4096];
    cr_assert_not_null(fgets(line, sizeof line, f)); /* header */
    for (int64_t i = 0; i < 872; i++) {
        int32_t a[3][24], b[3][24];
        int64_t la, lb;
        void *oa[4] = {a[0], a[1], a[2], &la}, *ob[4];
        ob[map[0]] = b[0], ob[map[1]] = b[1], ob[map[2]] = b[2], ob[map[3]] = &lb;
        cr_assert_eq(cm_dataset_get(src, i, NULL, oa), CM_OK);
        cr_assert_eq(cm_dataset_get(ds, i, NULL, ob), CM_OK, "%s", cm_last_error());
        cr_assert_eq(memcmp(a, b, sizeof a), 0, "sample %lld: token fields differ", (long long)i);
        cr_assert_eq(la, lb);
        /* the sentence as written in the file */
        cr_assert_not_null(fgets(line, sizeof line, f));
        char *tab = strrchr(line, '\t');
        cm_mds_sample s;
        cr_assert_eq(cm_mds_reader_get(rd, i, &s), CM_OK);
        cr_assert_eq(s.values[sent_col].size, (size_t)(tab - line));
        cr_assert_eq(memcmp(s.values[sent_col].data, line, (size_t)(tab - line)), 0, "sample %lld sentence", (long long)i);
        cr_assert_eq(atoi(tab + 1), (int)la);
        cm_mds_sample_release(&s);
    }
    fclose(f);
    cm_mds_reader_free(rd);
    cm_dataset_free(ds);
    cm_dataset_free(src);
    cm_tokenizer_free(tok);
    /* the unlabelled test layout: idx and label -1 */
    rc = run("data convert --to mds ../shared/data/sst2/test.tsv -o " DIR "/sst2test");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    sc = cm_streaming_config_default();
    ds = open_mds(DIR "/sst2test", &sc);
    cr_assert_eq(cm_dataset_len(ds), 1821);
    int64_t idx, lab;
    void *o2[2] = {&idx, &lab};
    cr_assert_eq(cm_dataset_get(ds, 5, NULL, o2), CM_OK, "%s", cm_last_error());
    cr_assert_eq(idx, 5);
    cr_assert_eq(lab, -1);
    cm_dataset_free(ds);
}

Test(cli_convert, bad_commands_get_clear_messages) {
    int rc = run("data convert ../shared/data/mnist -o " DIR "/x");
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "missing --to"), "%s", out);
    rc = run("data convert --to mdss ../shared/data/mnist -o " DIR "/x");
    cr_assert_eq(rc, 2);
    cr_assert(strstr(out, "did you mean 'mds'"), "%s", out);
    rc = run("data convert --to mds --from cifar ../shared/data/mnist -o " DIR "/x");
    cr_assert_eq(rc, 2);
    cr_assert(strstr(out, "did you mean 'cifar10'"), "%s", out);
    rc = run("data convert --to mds /nonexistent/data -o " DIR "/x");
    cr_assert_eq(rc, 1);
    cr_assert(strstr(out, "/nonexistent/data") && strstr(out, "does not exist"), "%s", out);
    rc = run("data convert --to mds ../shared/data -o " DIR "/x");
    cr_assert_eq(rc, 2);
    cr_assert(strstr(out, "cannot tell what INPUT") && strstr(out, "--from"), "%s", out);
    rc = run("data convert --to mds ../shared/data/mnist -o " DIR "/x --size-limit 12parsecs");
    cr_assert_eq(rc, 2);
    cr_assert(strstr(out, "--size-limit '12parsecs'"), "%s", out);
    rc = run("data convert --to mds ../shared/data/mnist -o " DIR "/x --compression lz77");
    cr_assert_eq(rc, 1);
    cr_assert(strstr(out, "lz77"), "%s", out);
    rc = run("data convert --to mds ../shared/data/mnist -o " DIR "/x --tokenizer v.txt");
    cr_assert_eq(rc, 2);
    cr_assert(strstr(out, "--tokenizer is for tsv"), "%s", out);
    /* a truncated token file is named, and no index.json makes a half dataset look whole */
    FILE *f = fopen(DIR "/bad.bin", "wb");
    int32_t hdr[256] = {CM_TOKEN_FILE_MAGIC, 1, 1000};
    fwrite(hdr, 4, 256, f);
    fwrite(hdr, 1, 100, f);
    fclose(f);
    rc = run("data convert --to mds " DIR "/bad.bin -o " DIR "/bad");
    cr_assert_eq(rc, 1, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "bad.bin"), "%s", out);
    cr_assert_neq(access(DIR "/bad/index.json", F_OK), 0, "a failed conversion wrote index.json");
    /* a TSV with a bad line names it */
    f = fopen(DIR "/bad.tsv", "w");
    fputs("sentence\tlabel\nfine\t1\nno label here\n", f);
    fclose(f);
    rc = run("data convert --to mds " DIR "/bad.tsv -o " DIR "/badtsv");
    cr_assert_eq(rc, 1, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "bad.tsv' line 3"), "%s", out);
}
