/* `composer train` on streaming datasets from YAML: CIFAR-10 converted with `composer data convert`
 * straight into a bucket (s3rver on loopback), trained with the image fields, augmentation and
 * field names from YAML, and resumed mid-epoch from a checkpoint on a fresh cache: bit for bit the
 * uninterrupted run. `streams:` with choose/repeat sets the epoch; bad stream and field settings
 * are named. With a remote save_folder the run folder follows every checkpoint to the bucket.
 * Runs the built binary (CM_COMPOSER_BIN). */
#include "cms3.h"
#include "cmtest.h"

#include <composer/storage.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef CM_COMPOSER_BIN
#error "CM_COMPOSER_BIN must name the composer binary (tests/CMakeLists.txt sets it)"
#endif
#define DIR "build/test_cli_streaming"

static char out[1 << 16];

static int run(const char *args) {
    return cmt_run_capturef(out, sizeof out, "%s %s", CM_COMPOSER_BIN, args);
}

/* The "loss/train/total" values of metrics.jsonl lines from batch index `from` on (0-based: the
 * loss of the 5th batch is logged at batch 4), in order. */
static int losses_from(const char *path, int from, char vals[][64], int cap) {
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    char line[8192];
    int n = 0;
    while (fgets(line, sizeof line, f) && n < cap) {
        const char *b = strstr(line, "\"batch\": "), *l = strstr(line, "\"loss/train/total\": ");
        if (!b || !l || atoi(b + 9) < from) continue;
        snprintf(vals[n++], 64, "%.40s", l + 20);
    }
    fclose(f);
    return n;
}

static void setup(void) {
    cr_assert_eq(system("rm -rf " DIR " && mkdir -p " DIR), 0);
    setenv("CM_STORAGE_RETRY_BACKOFF_S", "0.05", 1);
}
TestSuite(cli_streaming, .init = setup);

Test(cli_streaming, cifar_from_a_bucket_resumes_mid_epoch_bit_for_bit, .timeout = 240) {
    cmt_s3 s3;
    cmt_s3_start(&s3, "bkt");
    char stage[300];
    snprintf(stage, sizeof stage, "%s/stage", s3.dir);
    cr_assert_eq(mkdir(stage, 0755), 0);
    setenv("TMPDIR", stage, 1);
    int rc = run("data convert --to mds ../shared/data/cifar10 --split test --limit 160 --size-limit 100kb "
                 "--compression zstd --hashes xxh64 -o s3://bkt/cifar");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "160 samples -> 5 MDS shards in s3://bkt/cifar"), "%s", out);
    /* 10 batches an epoch; checkpoints every 4 (mid-epoch), 14 batches in all */
    cmt_write_text(DIR "/cifar.yaml", "run_name: a\n"
                                      "run_root: " DIR "/runs\n"
                                      "max_duration: 14ba\n"
                                      "eval_interval: 0\n"
                                      "progress_bar: false\n"
                                      "seed: 17\n"
                                      "model: {name: cnn, preset: cifar10, channels: [4, 8], hidden: 16}\n"
                                      "train_loader:\n"
                                      "  batch_size: 16\n"
                                      "  dataset:\n"
                                      "    type: streaming\n"
                                      "    remote: s3://bkt/cifar\n"
                                      "    local: " DIR "/cache-a\n"
                                      "    shuffle: true\n"
                                      "    shuffle_block_size: 50\n"
                                      "    validate_hash: xxh64\n"
                                      "    image_h: 32\n"
                                      "    image_w: 32\n"
                                      "    image_c: 3\n"
                                      "    crop_padding: 4\n"
                                      "    hflip_p: 0.5\n"
                                      "    fields: {x: image, y: label}\n"
                                      "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n"
                                      "save_folder: " DIR "/ck-a\n"
                                      "save_interval: 4ba\n");
    rc = run("train " DIR "/cifar.yaml");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "160 train samples") && strstr(out, "trained 14 batches"), "%s", out);
    /* resumed from batch 4 on a fresh cache and a fresh save folder: the same weights, bit for bit */
    rc = run("train " DIR "/cifar.yaml run_name=b load_path=" DIR "/ck-a/ep0-ba4 train_loader.dataset.local=" DIR
             "/cache-b save_folder=" DIR "/ck-b");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "resumed from checkpoint") && strstr(out, "ep0-ba4") && strstr(out, "trained 14 batches"), "%s",
              out);
    size_t na, nb;
    char *a = cmt_read_file(DIR "/runs/a/model.safetensors", &na);
    char *b = cmt_read_file(DIR "/runs/b/model.safetensors", &nb);
    cr_assert(na == nb && memcmp(a, b, na) == 0, "the resumed run's weights differ from the uninterrupted run's");
    free(a), free(b);
    char la[16][64], lb[16][64];
    int n1 = losses_from(DIR "/runs/a/metrics.jsonl", 4, la, 16), n2 = losses_from(DIR "/runs/b/metrics.jsonl", 4, lb, 16);
    cr_assert_eq(n1, 10);
    cr_assert_eq(n2, 10, "the resumed run logged %d losses after batch 4", n2);
    for (int i = 0; i < 10; i++) cr_assert_str_eq(la[i], lb[i], "loss at batch %d", 5 + i);
    /* without the resume, another run's losses differ: the comparison can fail */
    rc = run("train " DIR "/cifar.yaml run_name=c max_duration=6ba save_folder=" DIR "/ck-c train_loader.dataset.shuffle_seed=5");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    int n3 = losses_from(DIR "/runs/c/metrics.jsonl", 4, lb, 16);
    cr_assert_eq(n3, 2);
    cr_assert(strcmp(la[0], lb[0]) || strcmp(la[1], lb[1]), "another shuffle seed gave the same losses");
    cr_assert_eq(cmt_s3_stat(&s3, "refused"), 0);
    unsetenv("TMPDIR");
    cmt_s3_stop(&s3);
}

Test(cli_streaming, streams_weights_set_the_epoch_and_bad_settings_are_named, .timeout = 120) {
    int rc = run("data convert --to mds ../shared/data/mnist -o " DIR "/m1 --limit 50 -q");
    cr_assert_eq(rc, 0, "%s", out);
    rc = run("data convert --to mds ../shared/data/mnist --split test -o " DIR "/m2 --limit 30 -q");
    cr_assert_eq(rc, 0, "%s", out);
    /* 20 of the first stream and twice the second: 80 samples an epoch, 5 batches of 16 */
    cmt_write_text(DIR "/mnist.yaml", "run_name: s\n"
                                      "run_root: " DIR "/runs\n"
                                      "max_duration: 1ep\n"
                                      "eval_interval: 0\n"
                                      "progress_bar: false\n"
                                      "model: {name: mlp, preset: mnist_small}\n"
                                      "train_loader:\n"
                                      "  batch_size: 16\n"
                                      "  dataset:\n"
                                      "    type: streaming\n"
                                      "    shuffle: true\n"
                                      "    image_h: 28\n"
                                      "    image_c: 1\n"
                                      "    fields: {x: image, y: label}\n"
                                      "    streams:\n"
                                      "      first: {local: " DIR "/m1, choose: 20}\n"
                                      "      second: {local: " DIR "/m2, repeat: 2}\n"
                                      "optimizer: {name: sgd, lr: 0.01}\n");
    rc = run("train " DIR "/mnist.yaml");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "80 train samples") || strstr(out, "trained 5 batches"), "%s", out);
    cr_assert(strstr(out, "trained 5 batches (80 samples"), "%s", out);
    /* the resolved config shows the normalisation defaults (MNIST's for one channel) */
    rc = run("train " DIR "/mnist.yaml --print-config");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "image_mean: [0.1307") && strstr(out, "image_std: [0.3081"), "%s", out);
    /* two weights on one stream */
    rc = run("train " DIR "/mnist.yaml train_loader.dataset.streams.first.repeat=2");
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "train_loader.dataset.streams.first") && strstr(out, "at most one of proportion, repeat and choose"),
              "%s", out);
    /* a misspelt stream key */
    rc = run("train " DIR "/mnist.yaml train_loader.dataset.streams.second.proportoin=0.5");
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "proportoin") && strstr(out, "did you mean"), "%s", out);
    /* relative and absolute weights mixed */
    rc = run("train " DIR "/mnist.yaml 'train_loader.dataset.streams.first={local: " DIR "/m1, proportion: 0.5}'");
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "cannot be mixed"), "%s", out);
    /* the model's field missing: what to map */
    rc = run("train " DIR "/mnist.yaml 'train_loader.dataset.fields={y: label}'");
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "reads the field 'image'") && strstr(out, "fields: {x: image, y: label}"), "%s", out);
    /* a column that is not there */
    rc = run("train " DIR "/mnist.yaml 'train_loader.dataset.fields={z: image}'");
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "cannot rename column 'z'"), "%s", out);
    /* image_std with a zero */
    rc = run("train " DIR "/mnist.yaml train_loader.dataset.image_std=[0]");
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "image_std") && strstr(out, "must be > 0"), "%s", out);
}

/* The proxy's request lines that contain `what`. */
static int count_lines(cmt_s3 *s3, const char *what) {
    static char buf[1 << 20];
    cmt_s3_ctl(s3, "stats", buf, sizeof buf);
    int n = 0;
    for (const char *p = buf; (p = strstr(p, what)); p++) n++;
    return n;
}

Test(cli_streaming, remote_save_folder_gets_the_run_folder_at_every_checkpoint, .timeout = 120) {
    cmt_s3 s3;
    cmt_s3_start(&s3, "bkt");
    char stage[300];
    snprintf(stage, sizeof stage, "%s/stage", s3.dir);
    cr_assert_eq(mkdir(stage, 0755), 0);
    setenv("TMPDIR", stage, 1);
    int rc = run("data convert --to mds ../shared/data/mnist -o " DIR "/m --limit 96 -q");
    cr_assert_eq(rc, 0, "%s", out);
    cmt_write_text(DIR "/up.yaml", "run_name: up\n"
                                   "run_root: " DIR "/runs\n"
                                   "max_duration: 6ba\n"
                                   "eval_interval: 0\n"
                                   "progress_bar: false\n"
                                   "model: {name: mlp, preset: mnist_small}\n"
                                   "train_loader:\n"
                                   "  batch_size: 16\n"
                                   "  dataset: {type: streaming, local: " DIR "/m, image_h: 28, image_c: 1, fields: {x: image, y: label}}\n"
                                   "optimizer: {name: sgd, lr: 0.01}\n"
                                   "save_folder: s3://bkt/live\n"
                                   "save_interval: 2ba\n");
    /* what a profiler would leave in a subfolder goes too */
    cr_assert_eq(system("mkdir -p " DIR "/runs/up/traces && echo '{}' > " DIR "/runs/up/traces/rank0.json"), 0);
    rc = run("train " DIR "/up.yaml");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert_eq(count_lines(&s3, "PUT /bkt/live/run/traces/rank0.json"), 4);
    /* checkpoints at 2, 4, 6: the run folder went up after each of them and once more at the end */
    cr_assert_eq(count_lines(&s3, "PUT /bkt/live/run/metrics.jsonl"), 4, "metrics.jsonl uploaded %d times",
                 count_lines(&s3, "PUT /bkt/live/run/metrics.jsonl"));
    cr_assert_eq(count_lines(&s3, "PUT /bkt/live/run/loss.svg"), 4);
    cr_assert_eq(count_lines(&s3, "PUT /bkt/live/run/log.txt"), 4);
    cr_assert_eq(count_lines(&s3, "PUT /bkt/live/run/model.safetensors"), 1, "the weights exist only at the end");
    /* the bucket holds the final metrics */
    cm_object_store *st;
    cr_assert_eq(cm_object_store_open("s3://bkt/live", NULL, &st), CM_OK, "%s", cm_last_error());
    char *m;
    size_t n;
    cr_assert_eq(cm_object_store_get(st, "run/metrics.jsonl", 1 << 20, &m, &n), CM_OK, "%s", cm_last_error());
    int lines = 0;
    for (char *p = m; (p = strstr(p, "loss/train/total")); p++) lines++;
    cr_assert_eq(lines, 6);
    cm_free(m);
    cm_object_store_close(st);
    cr_assert_eq(cmt_s3_stat(&s3, "refused"), 0);
    unsetenv("TMPDIR");
    cmt_s3_stop(&s3);
}
