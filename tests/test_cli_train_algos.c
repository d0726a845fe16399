/* The training methods from YAML (`composer train`): ema, swa, sam and layer_freezing with
 * Composer's argument names train a tiny GPT together, resume from their checkpoints, and show
 * their resolved arguments (defaults included) in the printed config; unknown names and
 * arguments get the closest valid one; bad values name the key and where it came from. Runs the
 * built binary (CM_COMPOSER_BIN). */
#include "cmtest.h"

#include <composer/tokenizer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef CM_COMPOSER_BIN
#error "CM_COMPOSER_BIN must name the composer binary (tests/CMakeLists.txt sets it)"
#endif
#define DIR "build/test_cli_train_algos"

static int run(const char *args, char *out, size_t cap) {
    return cmt_run_capturef(out, cap, "%s %s", CM_COMPOSER_BIN, args);
}

/* Token files from the first 20 kB of tiny Shakespeare and a config that trains a tiny GPT for
 * 6 batches with all four methods (and clipping). */
static void setup(void) {
    cr_assert_eq(system("rm -rf " DIR " && mkdir -p " DIR "/data"), 0);
    cmt_char_token_files(DIR "/data", 20000, 2000);
    FILE *f;
    f = fopen(DIR "/algos.yaml", "w");
    fputs("run_name: algos\n"
          "run_root: " DIR "/runs\n"
          "max_duration: 6ba\n"
          "eval_interval: 3ba\n"
          "eval_subset_num_batches: 1\n"
          "progress_bar: false\n"
          "model: {name: gpt2, preset: tiny}\n"
          "train_loader:\n"
          "  dataset: {type: tokens, dir: " DIR "/data}\n"
          "  batch_size: 4\n"
          "eval_loader:\n"
          "  dataset: {type: tokens, dir: " DIR "/data}\n"
          "  batch_size: 4\n"
          "optimizer: {name: decoupled_adamw, lr: 1.0e-3}\n"
          "algorithms:\n"
          "  gradient_clipping: {clipping_type: norm, clipping_threshold: 1.0}\n"
          "  ema: {half_life: 50ba}\n"
          "  swa: {swa_start: 0.25dur, swa_end: 0.75dur, update_interval: 1ba, schedule_swa_lr: true,\n"
          "        swa_lr: 1.0e-4}\n"
          "  sam: {rho: 0.05}\n"
          "  layer_freezing: {freeze_start: 0.0}\n"
          "sample: {max_new_tokens: 4}\n",
          f);
    fclose(f);
}

TestSuite(cli_train_algos, .init = setup);

static char out[1 << 16];

Test(cli_train_algos, the_four_methods_train_resume_and_print_their_arguments) {
    int rc = run("train " DIR "/algos.yaml", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "trained 6 batches"), "%s", out);
    /* every argument resolved, defaults included, under Composer's names */
    rc = run("train " DIR "/algos.yaml --print-config", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    const char *keys[] = {"half_life: 50ba", "ema_start: 0.0dur", "swa_end: 0.75dur", "anneal_strategy: linear",
                          "anneal_steps: 10", "rho: 0.05", "epsilon: 1", "interval: 1", "freeze_level: 1"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        cr_expect(strstr(out, keys[i]), "the printed config lacks '%s':\n%s", keys[i], out);
    /* checkpoints every 2 batches to 4, then autoresume to 6: the methods' state comes back */
    rc = run("train " DIR "/algos.yaml run_name=algos_ck save_folder=" DIR "/ck save_interval=2ba max_duration=4ba "
             "eval_interval=0",
             out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    rc = run("train " DIR "/algos.yaml run_name=algos_ck save_folder=" DIR "/ck save_interval=2ba max_duration=6ba "
             "eval_interval=0 autoresume=true",
             out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "trained 6 batches") && strstr(out, "resumed"), "%s", out);
    struct stat sb;
    cr_expect(stat(DIR "/ck/ep0-ba4/algorithms.safetensors", &sb) == 0, "no algorithm state in the checkpoint");
    /* smoothing instead of half_life, with Composer's explicit null */
    rc = run("train " DIR "/algos.yaml max_duration=2ba eval_interval=0 'algorithms.ema={half_life: null, smoothing: 0.9}'",
             out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
}

Test(cli_train_algos, typos_and_bad_values_name_the_key_and_suggest) {
    struct {
        const char *args;
        int rc;
        const char *want;
    } cases[] = {
        {"algorithms.emma={}", 2, "unknown algorithms 'emma' (did you mean 'ema'?"},
        {"algorithms.layer_freezin={}", 2, "(did you mean 'layer_freezing'?"},
        {"algorithms.ema.half_lif=10ba", 2, "unknown key 'algorithms.ema.half_lif' (did you mean 'algorithms.ema.half_life'?)"},
        {"algorithms.swa.swa_strat=0.5dur", 2, "(did you mean 'algorithms.swa.swa_start'?)"},
        {"algorithms.sam.roh=0.1", 2, "(did you mean 'algorithms.sam.rho'?)"},
        {"algorithms.layer_freezing.freeze_lvl=0.5", 2, "(did you mean 'algorithms.layer_freezing.freeze_level'?)"},
        {"algorithms.ema.smoothing=0.9", 2, "algorithms.ema: EMA: give only one of half_life and smoothing (set half_life to null"},
        {"algorithms.ema.half_life=10sp", 2, "half_life '10sp': the unit must be ba or ep"},
        {"algorithms.swa.anneal_strategy=cosh", 2, "anneal_strategy 'cosh' must be one of linear, cos"},
        {"algorithms.swa.swa_end=0.1dur", 2, "swa_end '0.1dur' must come after swa_start '0.25dur'"},
        {"algorithms.swa.anneal_steps=ten", 2, "algorithms.swa.anneal_steps: 'ten' is not an integer"},
        {"algorithms.sam.rho=-1", 2, "SAM: rho -1 must be non-negative"},
        {"algorithms.sam.interval=0", 2, "interval 0 must be at least 1"},
        {"algorithms.layer_freezing.freeze_start=1.5", 2, "freeze_start 1.5 must be in [0, 1)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char args[512];
        snprintf(args, sizeof args, "train " DIR "/algos.yaml --print-config '%s'", cases[i].args);
        int rc = run(args, out, sizeof out);
        cr_expect_eq(rc, cases[i].rc, "%s: exit %d, want %d:\n%s", cases[i].args, rc, cases[i].rc, out);
        cr_expect(strstr(out, cases[i].want), "%s: output lacks '%s':\n%s", cases[i].args, cases[i].want, out);
    }
    /* the file position of a bad value */
    FILE *f = fopen(DIR "/bad.yaml", "w");
    fputs("max_duration: 2ba\nmodel: {name: gpt2, preset: tiny}\ntrain_loader:\n  dataset: {type: tokens, dir: " DIR
          "/data}\n  batch_size: 4\nalgorithms:\n  sam:\n    rho: -0.5\n",
          f);
    fclose(f);
    int rc = run("train " DIR "/bad.yaml --print-config", out, sizeof out);
    cr_expect_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_expect(strstr(out, "bad.yaml:8:") && strstr(out, "algorithms.sam") && strstr(out, "rho -0.5"), "%s", out);
}
