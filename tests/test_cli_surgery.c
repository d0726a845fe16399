/* The surgery methods from YAML (`composer train`): Composer's registry names and argument names
 * under algorithms:, the surgery applied before data parallelism and the optimizer, a checkpoint's
 * surgery re-applied when a run resumes without the algorithms block, FusedLayerNorm accepted, and
 * typos in names, arguments and choices answered with the closest valid one. Runs the built binary
 * (CM_COMPOSER_BIN). */
#include "cmtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CM_COMPOSER_BIN
#error "CM_COMPOSER_BIN must name the composer binary (tests/CMakeLists.txt sets it)"
#endif
#define DIR "build/test_cli_surgery"

static char out[1 << 16];

static int run(const char *args) {
    return cmt_run_capturef(out, sizeof out, "CM_NUM_THREADS=2 %s %s", CM_COMPOSER_BIN, args);
}

static void setup(void) {
    cr_assert_eq(system("rm -rf " DIR " && mkdir -p " DIR), 0);
    cmt_write_text(DIR "/resnet.yaml",
                   "run_root: " DIR "/runs\n"
                   "max_duration: 3ba\n"
                   "eval_interval: 0\n"
                   "progress_bar: false\n"
                   "model: {name: resnet, preset: resnet20}\n"
                   "train_loader: {dataset: {type: cifar10, dir: ../shared/data/cifar10}, batch_size: 16}\n"
                   "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n"
                   "algorithms:\n"
                   "  blurpool: {min_channels: 16}\n"
                   "  squeeze_excite: {latent_channels: 0.25, min_channels: 32}\n"
                   "  stochastic_depth: {target_layer_name: ResNetBasicBlock, drop_rate: 0.1}\n"
                   "  ghost_batchnorm: {ghost_batch_size: 8}\n"
                   "  channels_last: {}\n");
}

TestSuite(cli_surgery, .init = setup);

Test(cli_surgery, resnet_trains_with_the_methods_and_resumes_without_the_block) {
    int rc = run("train " DIR "/resnet.yaml run_name=r1 save_folder=" DIR "/ck save_interval=3ba");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "trained 3 batches"), "%s", out);
    cr_assert(strstr(out, "BlurPool: applied to ResNet: 2 BlurConv2d"), "%s", out);
    cr_assert(strstr(out, "SqueezeExcite: applied to ResNet"), "%s", out);
    /* the resolved config shows every argument with its default */
    rc = run("train " DIR "/resnet.yaml --print-config");
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "blur_first: true") && strstr(out, "stochastic_method: block") &&
                  strstr(out, "drop_distribution: linear") && strstr(out, "drop_warmup: 0dur"),
              "%s", out);
    /* resume the checkpoint with no algorithms: its surgery is re-applied before its weights load */
    rc = run("train " DIR "/resnet.yaml run_name=r2 algorithms= load_path=" DIR "/ck/ep0-ba3 max_duration=4ba");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "Automatically adding required_on_load algorithm BlurPool") &&
                  strstr(out, "Automatically adding required_on_load algorithm StochasticDepth"),
              "%s", out);
    cr_assert(strstr(out, "trained 4 batches"), "%s", out);
    /* the run folder's weights record the same surgery: as load_path of a config without
     * algorithms they load after it is re-applied (SqueezeExcite adds parameters: loaded into the
     * plain ResNet first, the load would name them unexpected) */
    rc = run("train " DIR "/resnet.yaml run_name=r4 algorithms= load_path=" DIR "/runs/r1/model.safetensors "
             "max_duration=1ba");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "Automatically adding required_on_load algorithm SqueezeExcite, which was enabled when "
                          "training the loaded weights") &&
                  strstr(out, "trained 1 batches"),
              "%s", out);
    /* excluding one makes the weights' names disagree: the load names them */
    rc = run("train " DIR "/resnet.yaml run_name=r3 algorithms= load_path=" DIR "/ck/ep0-ba3 max_duration=4ba "
             "load_exclude_algorithms=[SqueezeExcite]");
    cr_assert_eq(rc, 1, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "se.pool_and_mlp"), "%s", out);
}

Test(cli_surgery, gpt2_with_alibi_and_low_precision_layernorm_under_amp) {
    cr_assert_eq(system("mkdir -p " DIR "/tok && printf 'hello world, the quick brown fox jumps over the lazy dog. ' > "
                        DIR "/tok/a.txt && for i in 1 2 3 4 5 6; do cat " DIR "/tok/a.txt " DIR "/tok/a.txt > " DIR
                        "/tok/b.txt; mv " DIR "/tok/b.txt " DIR "/tok/a.txt; done"),
                 0);
    int rc = run("data tokenize --tokenizer char " DIR "/tok/a.txt -o " DIR "/tok");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cmt_write_text(DIR "/gpt.yaml", "run_root: " DIR "/runs\n"
                                    "run_name: g1\n"
                                    "max_duration: 3ba\n"
                                    "eval_interval: 0\n"
                                    "progress_bar: false\n"
                                    "precision: amp_bf16\n"
                                    "model: {name: gpt2, preset: tiny}\n"
                                    "train_loader: {dataset: {type: tokens, dir: " DIR "/tok}, batch_size: 4}\n"
                                    "sample: {max_new_tokens: 4}\n"
                                    "algorithms:\n"
                                    "  low_precision_layernorm: {}\n"
                                    "  alibi: {max_sequence_length: 64, train_sequence_length_scaling: 1}\n"
                                    "  fused_layernorm: {}\n");
    rc = run("train " DIR "/gpt.yaml");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "trained 3 batches"), "%s", out);
    cr_assert(strstr(out, "ALiBi: 2 attention modules") && strstr(out, "LowPrecisionLayerNorm: 5 LayerNorm layers") &&
                  strstr(out, "FusedLayerNorm: built in"),
              "%s", out);
}

Test(cli_surgery, typos_get_the_closest_valid_name) {
    int rc = run("train " DIR "/resnet.yaml algorithms.blurpol={}");
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "unknown algorithms 'blurpol' (did you mean 'blurpool'?"), "%s", out);
    rc = run("train " DIR "/resnet.yaml algorithms.blurpool.min_channel=8");
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "unknown key 'algorithms.blurpool.min_channel' (did you mean 'algorithms.blurpool.min_channels'?"),
              "%s", out);
    /* the same for every plugin (an entry's arguments used to be marked read as a whole) */
    rc = run("train " DIR "/resnet.yaml algorithms.gradient_clipping.clipping_treshold=2");
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "(did you mean 'algorithms.gradient_clipping.clipping_threshold'?)"), "%s", out);
    rc = run("train " DIR "/resnet.yaml callbacks.speed_monitor.window_sise=2");
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "(did you mean 'callbacks.speed_monitor.window_size'?)"), "%s", out);
    rc = run("train " DIR "/resnet.yaml algorithms.channels_last.enabled=true");
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "unknown key 'algorithms.channels_last.enabled'"), "%s", out);
    rc = run("train " DIR "/resnet.yaml algorithms.stochastic_depth.target_layer_name=ResNetBotleneck");
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "algorithms.stochastic_depth.target_layer_name") && strstr(out, "ResNetBottleneck"), "%s", out);
    rc = run("train " DIR "/resnet.yaml algorithms.stochastic_depth={}");
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "algorithms.stochastic_depth.target_layer_name: required"), "%s", out);
    rc = run("train " DIR "/resnet.yaml algorithms.ghost_batchnorm.ghost_batch_size=zero");
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "algorithms.ghost_batchnorm.ghost_batch_size") && strstr(out, "integer"), "%s", out);
    /* a method on a model it cannot apply to names what it looked for */
    rc = run("train " DIR "/resnet.yaml 'algorithms={alibi: {max_sequence_length: 8, train_sequence_length_scaling: 1}}'");
    cr_assert_eq(rc, 1, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "ALiBi: the model (ResNet) has nothing to apply to: it looked for GPT2Attention"), "%s", out);
}
