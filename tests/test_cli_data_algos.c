/* The data methods from YAML (`composer train`, tools/cli_data_algos.c): Composer's snake_case
 * names and argument names under algorithms:, their defaults in the printed config, training runs
 * that log the methods' metrics, and the messages for typos in names and arguments, bad values
 * and a method on a model it cannot apply to. Runs the built binary (CM_COMPOSER_BIN). */
#include "cmtest.h"

#include <composer/tokenizer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CM_COMPOSER_BIN
#error "CM_COMPOSER_BIN must name the composer binary (tests/CMakeLists.txt sets it)"
#endif
#define DIR "build/test_cli_data_algos"

static char out[1 << 16];

static int run(const char *args) {
    return cmt_run_capturef(out, sizeof out, "%s %s", CM_COMPOSER_BIN, args);
}

static int count_lines(const char *file, const char *needle) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "grep -c '%s' %s", needle, file);
    FILE *p = popen(cmd, "r");
    int n = 0;
    if (fscanf(p, "%d", &n) != 1) n = 0;
    pclose(p);
    return n;
}

/* A token file of a noisy counting sequence (vocabulary 96, the tiny GPT's) and two configs: a tiny
 * GPT on it, and a small ResNet on a few CIFAR-10 batches. */
static void setup(void) {
    cr_assert_eq(system("rm -rf " DIR " && mkdir -p " DIR "/data"), 0);
    int32_t ids[4000];
    for (int i = 0; i < 4000; i++) ids[i] = (int32_t)((3 * i + (i % 7 == 0)) % 96);
    cr_assert_eq(cm_token_file_write(DIR "/data/train.bin", ids, 4000, CM_TOKEN_WIDTH_AUTO), CM_OK);
    cr_assert_eq(cm_token_file_write(DIR "/data/val.bin", ids, 1000, CM_TOKEN_WIDTH_AUTO), CM_OK);
    FILE *f = fopen(DIR "/gpt.yaml", "w");
    fputs("run_name: gpt\nrun_root: " DIR "/runs\nmax_duration: 3ba\neval_interval: 0\nprogress_bar: false\n"
          "model: {name: gpt2, preset: tiny}\n"
          "train_loader: {dataset: {type: tokens, dir: " DIR "/data}, batch_size: 4, num_workers: 0}\n"
          "optimizer: {name: decoupled_adamw, lr: 1.0e-3}\n"
          "sample: {max_new_tokens: 4}\n",
          f);
    fclose(f);
    f = fopen(DIR "/resnet.yaml", "w");
    fputs("run_name: resnet\nrun_root: " DIR "/runs\nmax_duration: 3ba\neval_interval: 0\nprogress_bar: false\n"
          "model: {name: resnet, preset: resnet20}\n"
          "train_loader: {dataset: {type: cifar10, dir: ../shared/data/cifar10}, batch_size: 8, num_workers: 0}\n"
          "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n",
          f);
    fclose(f);
}

TestSuite(cli_data_algos, .init = setup);

Test(cli_data_algos, defaults_are_composers_and_printed) {
    int rc = run("train " DIR "/resnet.yaml --print-config 'algorithms={mixup: {}, cutmix: {}, cutout: {}, colout: {}, "
                 "label_smoothing: {}, progressive_resizing: {}, selective_backprop: {}}'");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    const char *want[] = {"  mixup:\n    alpha: 0.2\n    interpolate_loss: false\n",
                          "  cutmix:\n    alpha: 1.0\n    interpolate_loss: false\n    uniform_sampling: false\n",
                          "  cutout:\n    num_holes: 1\n    length: 0.5\n    uniform_sampling: false\n",
                          "  colout:\n    p_row: 0.15\n    p_col: 0.15\n    batch: true\n    resize_target: auto\n",
                          "  label_smoothing:\n    smoothing: 0.1\n",
                          "  progressive_resizing:\n    mode: resize\n    initial_scale: 0.5\n    finetune_fraction: 0.2\n"
                          "    delay_fraction: 0.5\n    size_increment: 4\n    resize_targets: false\n",
                          "  selective_backprop:\n    start: 0.5\n    end: 0.9\n    keep: 0.5\n    scale_factor: 1.0\n"
                          "    interrupt: 2\n"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) cr_expect(strstr(out, want[i]), "lacks:\n%s\nin:\n%s", want[i], out);
    rc = run("train " DIR "/gpt.yaml --print-config algorithms.seq_length_warmup={}");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_expect(strstr(out, "  seq_length_warmup:\n    duration: 0.3\n    min_seq_length: 8\n    max_seq_length: 1024\n"
                          "    step_size: 8\n    truncate: true\n    preserve_end_of_sequence: false\n"),
              "%s", out);
}

Test(cli_data_algos, image_methods_train_a_resnet_from_yaml) {
    int rc = run("train " DIR "/resnet.yaml 'algorithms={selective_backprop: {start: 0, end: 1, interrupt: 0}, "
                 "progressive_resizing: {delay_fraction: 0, finetune_fraction: 0, size_increment: 8}, cutout: {length: 0.25}, "
                 "mixup: {alpha: 0.4}, label_smoothing: {smoothing: 0.1}}'");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "trained 3 batches"), "%s", out);
    cr_expect_eq(count_lines(DIR "/runs/resnet/metrics.jsonl", "progressive_resizing/width"), 3, "%s", out);
    rc = run("train " DIR "/resnet.yaml run_name=resnet2 'algorithms={cutmix: {uniform_sampling: true}, colout: "
             "{batch: false}}'");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "trained 3 batches"), "%s", out);
}

Test(cli_data_algos, randaugment_and_augmix_augment_the_train_images) {
    int rc = run("train " DIR "/resnet.yaml run_name=ra --print-config algorithms.randaugment={}");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_expect(strstr(out, "  randaugment:\n    severity: 9\n    depth: 2\n    augmentation_set: all\n"), "%s", out);
    rc = run("train " DIR "/resnet.yaml run_name=am --print-config algorithms.augmix={}");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_expect(strstr(out, "  augmix:\n    severity: 3\n    depth: -1\n    width: 3\n    alpha: 1.0\n"
                          "    augmentation_set: all\n"),
              "%s", out);
    rc = run("train " DIR "/resnet.yaml run_name=ra 'algorithms.randaugment={severity: 5, augmentation_set: safe}'");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "trained 3 batches"), "%s", out);
    rc = run("train " DIR "/resnet.yaml run_name=am 'algorithms.augmix={width: 2, alpha: 0.5}'");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "trained 3 batches"), "%s", out);
    /* not on token data; not both */
    rc = run("train " DIR "/gpt.yaml run_name=ragpt --print-config algorithms.randaugment={}");
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_expect(strstr(out, "algorithms.randaugment: RandAugment augments images: the train dataset must be mnist or "
                          "cifar10"),
              "%s", out);
    rc = run("train " DIR "/resnet.yaml --print-config 'algorithms={randaugment: {}, augmix: {}}'");
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_expect(strstr(out, "randaugment and augmix both augment the train images; keep one"), "%s", out);
}

Test(cli_data_algos, seq_length_warmup_trains_a_gpt_from_yaml) {
    int rc = run("train " DIR "/gpt.yaml 'algorithms.seq_length_warmup={duration: 1.0, min_seq_length: 8, "
                 "max_seq_length: 32, step_size: 8}'");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "trained 3 batches"), "%s", out);
    cr_expect_eq(count_lines(DIR "/runs/gpt/metrics.jsonl", "seq_length_warmup/curr_seq_len"), 3, "%s", out);
    /* a method on a model it cannot apply to says what it looked for */
    rc = run("train " DIR "/resnet.yaml run_name=resnet3 algorithms.seq_length_warmup={}");
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_expect(strstr(out, "SeqLengthWarmup: the train dataset ('cifar10') has no 'input_ids' field") &&
                  strstr(out, "image, label"),
              "%s", out);
    rc = run("train " DIR "/gpt.yaml run_name=gpt2 algorithms.mixup={}");
    cr_assert_eq(rc, 1, "exit %d:\n%s", rc, out);
    cr_expect(strstr(out, "MixUp: input 'input_ids'") && strstr(out, "f32 inputs"), "%s", out);
}

Test(cli_data_algos, typos_and_bad_values_name_the_key_and_suggest) {
    struct {
        const char *args;
        int rc;
        const char *want;
    } cases[] = {
        {"algorithms.mix_up={}", 2, "unknown algorithms 'mix_up' (did you mean 'mixup'?"},
        {"algorithms.labelsmoothing={}", 2, "did you mean 'label_smoothing'?"},
        {"algorithms.mixup.alhpa=0.3", 2, "unknown key 'algorithms.mixup.alhpa' (did you mean 'algorithms.mixup.alpha'?)"},
        {"algorithms.cutout.num_hole=2", 2, "did you mean 'algorithms.cutout.num_holes'?"},
        {"algorithms.progressive_resizing.finetune_frac=0.1", 2,
         "did you mean 'algorithms.progressive_resizing.finetune_fraction'?"},
        {"algorithms.selective_backprop.kep=0.3", 2, "did you mean 'algorithms.selective_backprop.keep'?"},
        {"algorithms.progressive_resizing.mode=bilinear", 2,
         "algorithms.progressive_resizing.mode: unknown value 'bilinear'"},
        {"algorithms.colout.resize_target=maybe", 2, "algorithms.colout.resize_target: unknown value 'maybe'"},
        {"algorithms.mixup.alpha=-1", 2, "algorithms.mixup: MixUp: alpha -1 must be >= 0"},
        {"algorithms.label_smoothing.smoothing=2", 2, "algorithms.label_smoothing: LabelSmoothing: smoothing 2"},
        {"algorithms.cutout.num_holes=-2", 2, "CutOut: num_holes -2"},
        {"algorithms.colout={batch: false, resize_target: true}", 2, "not supported with batch false"},
        {"algorithms.progressive_resizing={delay_fraction: 0.9}", 2,
         "delay_fraction + finetune_fraction must be at most 1"},
        {"algorithms.selective_backprop.keep=many", 2, "algorithms.selective_backprop.keep: 'many' is not a number"},
        {"algorithms.randaugment.severty=3", 2, "did you mean 'algorithms.randaugment.severity'?"},
        {"algorithms.randaugment.augmentation_set=most", 2,
         "algorithms.randaugment.augmentation_set: unknown value 'most'"},
        {"algorithms.randaugment.severity=11", 2, "RandAugment: severity 11 must satisfy 0 <= severity <= 10"},
        {"algorithms.augmix.width=0", 2, "AugMix: width 0 must be >= 1"},
        /* every algorithm's arguments are checked, GradientClipping's too */
        {"algorithms.gradient_clipping.clipping_tpe=norm", 2,
         "did you mean 'algorithms.gradient_clipping.clipping_type'?"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char args[512];
        snprintf(args, sizeof args, "train " DIR "/resnet.yaml --print-config '%s'", cases[i].args);
        int rc = run(args);
        cr_expect_eq(rc, cases[i].rc, "%s: exit %d, want %d:\n%s", cases[i].args, rc, cases[i].rc, out);
        cr_expect(strstr(out, cases[i].want), "%s: output lacks '%s':\n%s", cases[i].args, cases[i].want, out);
    }
    /* file positions: the typo's line in the YAML file */
    FILE *f = fopen(DIR "/typo.yaml", "w");
    fputs("max_duration: 2ba\nmodel: {name: resnet, preset: resnet20}\n"
          "train_loader: {dataset: {type: cifar10}, batch_size: 8}\n"
          "algorithms:\n  mixup:\n    alpah: 0.2\n",
          f);
    fclose(f);
    int rc = run("train " DIR "/typo.yaml --print-config");
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_expect(strstr(out, DIR "/typo.yaml:6:5: unknown key 'algorithms.mixup.alpah' (did you mean "
                          "'algorithms.mixup.alpha'?)"),
              "%s", out);
}
