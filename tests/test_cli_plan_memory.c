/* `composer train CONFIG --plan-memory`: prints the memory plan of the first batch (each component
 * in MiB, the microbatch size that fits arena_budget) and exits 0 without a run folder or a
 * checkpoint; a run with device_train_microbatch_size auto under the same budget uses that size on
 * the first try; a budget too small for one row, or not a byte size, is an error naming the key.
 * Runs the built binary (CM_COMPOSER_BIN) on a tiny GPT over token files the test writes, and on
 * examples/mnist.yaml. */
#include "cmtest.h"

#include <composer/tokenizer.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef CM_COMPOSER_BIN
#error "CM_COMPOSER_BIN must name the composer binary (tests/CMakeLists.txt sets it)"
#endif
#define DIR "build/test_cli_plan_memory"

static bool is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Token files from the first 20 kB of tiny Shakespeare and a config for a tiny GPT on them, with a
 * save folder (which --plan-memory must not make). */
static void setup(void) {
    cr_assert_eq(system("rm -rf " DIR " && mkdir -p " DIR "/data"), 0);
    cmt_char_token_files(DIR "/data", 20000, 0);
    FILE *f;
    f = fopen(DIR "/tiny.yaml", "w");
    fputs("run_name: tiny\n"
          "run_root: " DIR "/runs\n"
          "save_folder: " DIR "/ckpt\n"
          "save_interval: 1ba\n"
          "max_duration: 2ba\n"
          "eval_interval: 0\n"
          "progress_bar: false\n"
          "device_train_microbatch_size: auto\n"
          "model: {name: gpt2, preset: tiny, dropout: 0.1}\n"
          "train_loader:\n"
          "  dataset: {type: tokens, dir: " DIR "/data}\n"
          "  batch_size: 16\n"
          "optimizer: {name: decoupled_adamw, lr: 1.0e-3}\n"
          "sample: {max_new_tokens: 0}\n",
          f);
    fclose(f);
}

TestSuite(cli_plan_memory, .init = setup);

static char out[1 << 16];

static double field(const char *text, const char *key) {
    const char *p = strstr(text, key);
    cr_assert_not_null(p, "'%s' missing from:\n%s", key, text);
    return strtod(p + strlen(key), NULL);
}

Test(cli_plan_memory, prints_each_component_makes_no_run_folder_and_the_run_uses_its_size) {
    /* no budget: the whole batch; the plan's line gives a budget for about 5 rows */
    int rc = cmt_run_capture(CM_COMPOSER_BIN " train " DIR "/tiny.yaml --plan-memory", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    const char *parts[] = {"parameters", "gradients", "optimizer state", "activations", "workspace",
                           "arena budget", "microbatch size", "predicted peak", "MiB"};
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) cr_expect(strstr(out, parts[i]), "%s:\n%s", parts[i], out);
    cr_expect(strstr(out, "unlimited (arena_budget not set)"), "%s", out);
    cr_expect_eq(field(out, "microbatch size"), 16, "%s", out);
    const double peak16 = field(out, "predicted peak");
    cr_expect_gt(field(out, "parameters"), 0);
    cr_expect(!is_dir(DIR "/runs") && !is_dir(DIR "/ckpt"), "--plan-memory made a run or checkpoint folder");

    char cmd[512];
    const int budget_kb = (int)(peak16 * 1024 / 3); /* a third of the whole batch's arena */
    snprintf(cmd, sizeof cmd, CM_COMPOSER_BIN " train " DIR "/tiny.yaml --plan-memory arena_budget=%dkb", budget_kb);
    rc = cmt_run_capture(cmd, out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    const double planned = field(out, "microbatch size");
    cr_expect(planned >= 1 && planned < 16, "planned %g rows under %d KiB:\n%s", planned, budget_kb, out);
    cr_expect(strstr(out, "(arena_budget;"), "%s", out);
    cr_expect(!is_dir(DIR "/runs") && !is_dir(DIR "/ckpt"), "--plan-memory made a run or checkpoint folder");

    /* the run under the same budget: the plan's size on the first try (logged once) */
    snprintf(cmd, sizeof cmd, CM_COMPOSER_BIN " train " DIR "/tiny.yaml arena_budget=%dkb -q", budget_kb);
    rc = cmt_run_capture(cmd, out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    size_t len;
    char *metrics = cmt_slurp(DIR "/runs/tiny/metrics.jsonl", &len);
    cr_assert_not_null(metrics);
    int logged = 0;
    for (const char *p = metrics; (p = strstr(p, "\"trainer/device_train_microbatch_size\"")); p++) logged++;
    cr_expect_eq(logged, 1, "the size was logged %d times (an out-of-memory retry logs it again)", logged);
    cr_expect_eq(field(metrics, "\"trainer/device_train_microbatch_size\":"), planned);
    cr_expect_eq(field(metrics, "\"memory_plan/microbatch_size\":"), planned);
    cr_expect(strstr(metrics, "\"memory_plan/activations_per_row_mib\""), "the plan's components are logged");
    free(metrics);
}

/* A batch of one row has one dry run: the plan does not split it into 0 MiB a row and the rest. */
Test(cli_plan_memory, a_one_row_batch_says_its_peak_is_not_split) {
    int rc = cmt_run_capture(CM_COMPOSER_BIN " train " DIR "/tiny.yaml --plan-memory train_loader.batch_size=1", out,
                             sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_expect(strstr(out, "(cpu, 1 row a batch on this rank)") && strstr(out, "(one row a batch: its ") &&
                  strstr(out, "arena peak is counted as workspace)") && strstr(out, "1 microbatch (the one row)") &&
                  strstr(out, "1 row (1 microbatch a batch)") && !strstr(out, "MiB a row"),
              "%s", out);
    cr_expect_gt(field(out, "\n  workspace "), 0, "%s", out);
}

Test(cli_plan_memory, errors_name_the_budget_key) {
    int rc = cmt_run_capture(CM_COMPOSER_BIN " train " DIR "/tiny.yaml --plan-memory arena_budget=4kb", out, sizeof out);
    cr_expect_neq(rc, 0, "%s", out);
    cr_expect(strstr(out, "one row needs") && strstr(out, "raise arena_budget to at least"), "%s", out);
    rc = cmt_run_capture(CM_COMPOSER_BIN " train " DIR "/tiny.yaml arena_budget=4kb -q", out, sizeof out);
    cr_expect_neq(rc, 0, "%s", out);
    cr_expect(strstr(out, "raise arena_budget to at least"), "training: %s", out);
    rc = cmt_run_capture(CM_COMPOSER_BIN " train " DIR "/tiny.yaml --plan-memory arena_budget=lots", out, sizeof out);
    cr_expect_eq(rc, 2, "%s", out);
    cr_expect(strstr(out, "arena_budget") && strstr(out, "not a byte size"), "%s", out);
}

Test(cli_plan_memory, the_mnist_example_plans) {
    int rc = cmt_run_capture(CM_COMPOSER_BIN " train examples/mnist.yaml --plan-memory arena_budget=64mb", out,
                             sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_expect(strstr(out, "128 rows a batch"), "%s", out);
    const double m = field(out, "microbatch size");
    cr_expect(m >= 1 && m <= 128, "%s", out);
    cr_expect(strstr(out, "device_train_microbatch_size is 0"), "a fixed size is said: %s", out);
}

/* allow_pad_trimming: the first batch may be shorter than later ones, so the plan is made on its
 * rows padded to max_seq_len (64; these rows are cut to 16) — the same plan as without trimming (a plan of the cut rows would
 * see a fraction of the activations and pick a size the longer batches do not fit). */
Test(cli_plan_memory, a_trimmed_loader_is_planned_at_its_full_length) {
    /* short rows (at most 8 words): every batch is cut well below max_seq_len */
    cr_assert_eq(system("awk 'NR == 1 || NF <= 9' ../shared/data/sst2/train.tsv | head -201 > " DIR "/sub.tsv"), 0);
    FILE *f = fopen(DIR "/cls.yaml", "w");
    cr_assert_not_null(f);
    fputs("run_root: " DIR "/runs\n"
          "max_duration: 1ba\n"
          "device_train_microbatch_size: auto\n"
          "model: {name: hf, pretrained_model_name_or_path: examples/bert-tiny, pretrained: false,"
          " task: sequence_classification, num_labels: 2, config_overrides: {hidden_size: 32,"
          " intermediate_size: 64, num_hidden_layers: 1, max_position_embeddings: 64}}\n"
          "tokenizer: {name: ../shared/data/bert}\n"
          "train_loader:\n"
          "  dataset: {type: tsv, path: " DIR "/sub.tsv, max_seq_len: 64}\n"
          "  batch_size: 16\n",
          f);
    fclose(f);
#define TRIM_CFG CM_COMPOSER_BIN " train " DIR "/cls.yaml --plan-memory"
    int rc = cmt_run_capture(TRIM_CFG, out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    const double act = field(out, "activations"), peak = field(out, "predicted peak");
    rc = cmt_run_capture(TRIM_CFG " train_loader.dataset.allow_pad_trimming=true", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "each batch cut to its longest row"), "%s", out);
    cr_expect(fabs(field(out, "activations") - act) <= 0.01 * act && fabs(field(out, "predicted peak") - peak) <= 0.01 * peak,
              "activations %g MiB and peak %g MiB padded to 64; trimmed:\n%s", act, peak, out);
}

Test(cli_plan_memory, help_documents_the_flag_and_the_budget) {
    int rc = cmt_run_capture(CM_COMPOSER_BIN " train --help", out, sizeof out);
    cr_assert_eq(rc, 0);
    cr_expect(strstr(out, "--plan-memory") && strstr(out, "arena_budget") && strstr(out, "device_arena_budget"),
              "%s", out);
}
