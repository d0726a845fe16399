/* `composer train | eval | generate` end to end on a tiny GPT over a token file the test writes
 * (and a few MNIST batches): the run folder's files, the metrics, generation from the saved
 * weights, evaluation, --print-config, and the messages and exit codes of bad keys and values.
 * Runs the built binary (CM_COMPOSER_BIN). */
#include "cms3.h"
#include "cmtest.h"

#include <composer/safetensors.h>
#include <composer/surgery_algorithms.h>
#include <composer/tokenizer.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef CM_COMPOSER_BIN
#error "CM_COMPOSER_BIN must name the composer binary (tests/CMakeLists.txt sets it)"
#endif
#define DIR "build/test_cli_train"

static int run(const char *args, char *out, size_t cap) {
    return cmt_run_capturef(out, cap, "%s %s", CM_COMPOSER_BIN, args);
}

/* A char tokenizer and train/val token files from the first 40 kB of tiny Shakespeare, and a
 * config training a tiny GPT for 5 batches on them. */
static void setup(void) {
    cr_assert_eq(system("rm -rf " DIR " && mkdir -p " DIR "/data"), 0);
    cmt_char_token_files(DIR "/data", 40000, 4000);
    FILE *f;
    f = fopen(DIR "/tiny.yaml", "w");
    fputs("run_name: tiny\n"
          "run_root: " DIR "/runs\n"
          "max_duration: 5ba\n"
          "eval_interval: 5ba\n"
          "eval_subset_num_batches: 2\n"
          "progress_bar: false\n"
          "model: {name: gpt2, preset: tiny}\n"
          "train_loader:\n"
          "  dataset: {type: tokens, dir: " DIR "/data}\n"
          "  batch_size: 4\n"
          "eval_loader:\n"
          "  dataset: {type: tokens, dir: " DIR "/data}\n"
          "  batch_size: 4\n"
          "optimizer: {name: decoupled_adamw, lr: 1.0e-3}\n"
          "scheduler: {name: cosine_with_warmup, t_warmup: 2ba}\n"
          "algorithms:\n"
          "  gradient_clipping: {clipping_type: norm, clipping_threshold: 1.0}\n"
          "sample: {max_new_tokens: 16}\n",
          f);
    fclose(f);
}

TestSuite(cli_train, .init = setup);

static char out[1 << 16];

/* A tensor of a run folder's model.safetensors, as f32 (the caller frees). */
static cm_tensor *weight(const char *run_name, const char *name) {
    char path[256];
    snprintf(path, sizeof path, DIR "/runs/%s/model.safetensors", run_name);
    cm_safetensors *st;
    cr_assert_eq(cm_safetensors_open(path, &st), CM_OK, "%s", cm_last_error());
    cm_tensor *t;
    cr_assert_eq(cm_safetensors_load(st, name, CM_DTYPE_F32, &t), CM_OK, "%s", cm_last_error());
    cm_safetensors_close(st);
    return t;
}

static bool same_weight(const char *run_a, const char *run_b, const char *name) {
    cm_tensor *a = weight(run_a, name), *b = weight(run_b, name);
    bool same = cm_tensor_numel(a) == cm_tensor_numel(b) &&
                memcmp(cm_tensor_data(a), cm_tensor_data(b), sizeof(float) * (size_t)cm_tensor_numel(a)) == 0;
    cm_tensor_free(a);
    cm_tensor_free(b);
    return same;
}

Test(cli_train, train_writes_the_run_folder_then_generate_and_eval_use_it) {
    int rc = run("train " DIR "/tiny.yaml", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "trained 5 batches"), "%s", out);
    cr_assert(strstr(out, "metrics/eval/LanguageCrossEntropy"), "%s", out);
    const char *files[] = {"config.yaml", "log.txt", "metrics.jsonl", "loss.svg", "model.safetensors",
                           "tokenizer.json", "sample.txt"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char p[256];
        snprintf(p, sizeof p, DIR "/runs/tiny/%s", files[i]);
        cr_assert(cmt_nonempty(p), "%s missing or empty; output:\n%s", p, out);
    }
    /* the metrics file has the train loss and the eval metrics */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "grep -c loss/train/total " DIR "/runs/tiny/metrics.jsonl");
    FILE *p = popen(cmd, "r");
    int lines = 0;
    cr_assert_eq(fscanf(p, "%d", &lines), 1);
    pclose(p);
    cr_assert_eq(lines, 5, "%d train-loss lines, want 5", lines);

    /* checkpoints: save every 2 batches, then autoresume the same run to 7 batches */
    rc = run("train " DIR "/tiny.yaml run_name=tiny_ck save_folder=" DIR "/ck save_interval=2ba max_duration=4ba "
             "eval_interval=0",
             out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(cmt_nonempty(DIR "/ck/ep0-ba4/manifest.json"), "no checkpoint at batch 4:\n%s", out);
    rc = run("train " DIR "/tiny.yaml run_name=tiny_ck save_folder=" DIR "/ck save_interval=2ba max_duration=7ba "
             "eval_interval=0 autoresume=true",
             out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "trained 7 batches"), "resumed run should end at batch 7:\n%s", out);
    rc = run("ckpt verify " DIR "/ck/ep0-ba4", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);

    /* callbacks from the registry log their metrics into the same file */
    rc = run("train " DIR "/tiny.yaml run_name=tiny_cb callbacks.lr_monitor={} callbacks.speed_monitor.window_size=1 "
             "callbacks.speed_monitor.peak_flops=1e12",
             out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    snprintf(cmd, sizeof cmd, "grep -c 'lr-DecoupledAdamW/group0' " DIR "/runs/tiny_cb/metrics.jsonl");
    p = popen(cmd, "r");
    lines = 0;
    cr_assert_eq(fscanf(p, "%d", &lines), 1);
    pclose(p);
    cr_assert_eq(lines, 5, "%d LRMonitor lines, want 5", lines);
    snprintf(cmd, sizeof cmd, "grep -c 'throughput/samples_per_sec' " DIR "/runs/tiny_cb/metrics.jsonl");
    p = popen(cmd, "r");
    lines = 0;
    cr_assert_eq(fscanf(p, "%d", &lines), 1);
    pclose(p);
    cr_assert_geq(lines, 3, "%d SpeedMonitor lines, want >= 3 (window 1)", lines);

    /* the resolved config trains the same model again (a round trip through config.yaml) */
    rc = run("train " DIR "/runs/tiny/config.yaml --print-config", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);

    /* generate: the prompt and 20 new characters */
    rc = run("generate --weights " DIR "/runs/tiny/model.safetensors --prompt ab --max-new-tokens 20 --seed 3", out,
             sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert_eq(strlen(out), 2 + 20 + 1, "output '%s' (%zu bytes), want the prompt + 20 chars + newline", out,
                 strlen(out));
    cr_assert_eq(strncmp(out, "ab", 2), 0, "%s", out);
    char again[256];
    rc = run("generate -w " DIR "/runs/tiny/model.safetensors -p ab -n 20 --seed 3", again, sizeof again);
    cr_assert_str_eq(again, out, "same seed, same text");
    /* without the run's config: shapes from the weights (tiny has 4 heads of 8: --n-head) */
    rc = run("generate --weights " DIR "/runs/tiny/model.safetensors --config /nonexistent.yaml", again, sizeof again);
    cr_assert_neq(rc, 0);
    cr_assert(strstr(again, "/nonexistent.yaml"), "%s", again);

    /* missing weights are named as such (not as a missing tokenizer.json next to them) */
    rc = run("generate --weights /missing.safetensors", again, sizeof again);
    cr_assert_eq(rc, 1, "exit %d:\n%s", rc, again);
    cr_assert(strstr(again, "--weights '/missing.safetensors': no such file"), "%s", again);
    cr_assert_null(strstr(again, "tokenizer"), "%s", again);

    /* eval on the config's eval set */
    rc = run("eval " DIR "/tiny.yaml --weights " DIR "/runs/tiny/model.safetensors eval_subset_num_batches=1", out,
             sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "metrics/eval/LanguageCrossEntropy: "), "%s", out);
    cr_assert(strstr(out, "metrics/eval/LanguagePerplexity: "), "%s", out);
    cr_assert(strstr(out, "on 4 samples"), "one batch of 4 evaluated: %s", out);
    rc = run("eval " DIR "/tiny.yaml --weights " DIR "/nothing.safetensors", out, sizeof out);
    cr_assert_eq(rc, 1, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "nothing.safetensors"), "%s", out);
}

/* Weights trained with model surgery (ALiBi) are evaluated and sampled from as the model they were
 * trained as: the run folder's config, or the checkpoint's required_on_load, re-applies it before
 * they load (without it eval gave another loss and generate another text, silently). */
/* `composer eval` of weights recording ALiBi, with tiny.yaml (no ALiBi): the method is added
 * (the warning `added`) and the loss is the training's (`trained`). */
static void evals_with_alibi_added(const char *weights, const char *trained, const char *added) {
    char args[512];
    snprintf(args, sizeof args, "eval " DIR "/tiny.yaml --weights %s", weights);
    const int rc = run(args, out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, added) && strstr(out, trained), "want '%s':\n%s", trained, out);
}

Test(cli_train, eval_and_generate_apply_the_surgery_the_weights_were_trained_with) {
    char args[1024], trained[128];
    snprintf(args, sizeof args,
             "train " DIR "/tiny.yaml run_name=tiny_al save_folder=" DIR "/ck_al save_interval=5ba "
             "'algorithms={alibi: {max_sequence_length: 32, train_sequence_length_scaling: 1.0}}' optimizer.lr=1.0e-2");
    int rc = run(args, out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    /* the eval loss and perplexity at the end of training (5 batches: without ALiBi's bias the
     * same weights give a loss 0.001 away, so both lines are compared, every digit) */
    const char *m = strstr(out, "metrics/eval/LanguageCrossEntropy: ");
    cr_assert(m && strstr(m, "\n  metrics/eval/LanguagePerplexity: "), "%s", out);
    const char *p = strchr(m, '\n') + 1;
    snprintf(trained, sizeof trained, "%.*s", (int)(p - m + strcspn(p, "\n")), m);
    /* eval from the run folder: its config.yaml re-applies ALiBi; the loss at the end of training */
    rc = run("eval " DIR "/runs/tiny_al/config.yaml --weights " DIR "/runs/tiny_al/model.safetensors", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, trained), "want '%s':\n%s", trained, out);
    /* a checkpoint as the weights, with a config that does not name ALiBi: required on load */
    rc = run("eval " DIR "/tiny.yaml --weights " DIR "/ck_al", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "Automatically adding required_on_load algorithm Alibi") && strstr(out, trained),
              "want '%s':\n%s", trained, out);
    /* generate: the run's own sample again (its prompt, seed 42, temperature and top_k) */
    size_t n;
    char *sample = cmt_read_file(DIR "/runs/tiny_al/sample.txt", &n);
    rc = run("generate -w " DIR "/runs/tiny_al/model.safetensors -n 16", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    const size_t len = strlen(out); /* the sample is the text's last line, as generate prints it (sample.txt ends so) */
    cr_assert(n > 1 && len >= n && !memcmp(out + len - n, sample, n), "want '%s':\n%s", sample, out);

    /* the weights file records the surgery (surgery_algorithms.h); a run without any records nothing */
    cm_safetensors *st;
    cr_assert_eq(cm_safetensors_open(DIR "/runs/tiny_al/model.safetensors", &st), CM_OK, "%s", cm_last_error());
    const char *rec = cm_safetensors_metadata_get(st, CM_SURGERY_METADATA_KEY);
    cr_assert(rec && strstr(rec, "\"name\":\"Alibi\"") && strstr(rec, "\"max_sequence_length\":32") &&
                  !strstr(rec, "GradientClipping"),
              "record: %s", rec ? rec : "(none)");
    cr_assert_str_eq(cm_safetensors_metadata_get(st, "format"), "pt");
    cm_safetensors_close(st);
    rc = run("train " DIR "/tiny.yaml run_name=tiny_pl max_duration=1ba", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert_eq(cm_safetensors_open(DIR "/runs/tiny_pl/model.safetensors", &st), CM_OK, "%s", cm_last_error());
    cr_assert_null(cm_safetensors_metadata_get(st, CM_SURGERY_METADATA_KEY));
    cm_safetensors_close(st);
    /* ckpt inspect reads weights files too, the record included */
    rc = run("ckpt inspect " DIR "/runs/tiny_al/model.safetensors", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "algorithms  Alibi (required on load: max_sequence_length 32, ") &&
                  strstr(out, "metadata    format: pt\n") &&
                  strstr(out, "  transformer.wte.weight              F32  (58, 32) 7424 bytes\n"),
              "%s", out);
    rc = run("ckpt inspect " DIR "/runs/tiny_pl/model.safetensors", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "algorithms  no surgery recorded\n"), "%s", out);
    /* so the weights alone, with a config that does not name ALiBi, evaluate as trained */
    static const char added[] = "Automatically adding required_on_load algorithm Alibi, which was enabled when training "
                                "the loaded weights";
    evals_with_alibi_added(DIR "/runs/tiny_al/model.safetensors", trained, added);
    /* and without it when asked (load_exclude_algorithms): another model, another loss */
    rc = run("eval " DIR "/tiny.yaml --weights " DIR "/runs/tiny_al/model.safetensors 'load_exclude_algorithms=[Alibi]'",
             out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(!strstr(out, added) && !strstr(out, trained) && strstr(out, "metrics/eval/LanguageCrossEntropy: "), "%s",
              out);
    /* generate from the file alone (no config.yaml next to it; n_head and ALiBi from its metadata): the run's sample */
    cr_assert_eq(system("rm -rf " DIR "/bare && mkdir -p " DIR "/bare && cp " DIR "/runs/tiny_al/model.safetensors " DIR
                        "/bare/"),
                 0);
    rc = run("generate -w " DIR "/bare/model.safetensors --tokenizer " DIR "/runs/tiny_al/tokenizer.json -n 16", out,
             sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    const size_t len2 = strlen(out);
    cr_assert(strstr(out, added) && len2 >= n && !memcmp(out + len2 - n, sample, n), "want '%s':\n%s", sample, out);
    free(sample);
    /* ckpt export records what the checkpoint requires on load */
    rc = run("ckpt export " DIR "/ck_al -o " DIR "/al.safetensors", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    evals_with_alibi_added(DIR "/al.safetensors", trained, added);
    /* train's load_path: the weights start a run of the model they were trained as (which records it again) */
    rc = run("train " DIR "/tiny.yaml run_name=tiny_al2 max_duration=1ba load_path=" DIR "/runs/tiny_al/model.safetensors",
             out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, added), "%s", out);
    cr_assert_eq(cm_safetensors_open(DIR "/runs/tiny_al2/model.safetensors", &st), CM_OK, "%s", cm_last_error());
    rec = cm_safetensors_metadata_get(st, CM_SURGERY_METADATA_KEY);
    cr_assert(rec && strstr(rec, "\"name\":\"Alibi\""), "record: %s", rec ? rec : "(none)");
    cm_safetensors_close(st);
}

/* llm-foundry's list of eval loaders: each labelled, evaluated at every evaluation and logged as
 * metrics/eval/<label>/...; one of them alone gives the numbers it gives as the only loader. */
Test(cli_train, a_list_of_labelled_eval_loaders_logs_each) {
    const char *two = "'eval_loader=[{label: val, dataset: {type: tokens, dir: " DIR "/data, split: val}, batch_size: 4}, "
                      "{label: head, dataset: {type: tokens, dir: " DIR "/data}, batch_size: 4}]'";
    char args[1024];
    snprintf(args, sizeof args, "train " DIR "/tiny.yaml run_name=tiny_ev %s", two);
    int rc = run(args, out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    const char *v = strstr(out, "  metrics/eval/val/LanguageCrossEntropy: "), *h = strstr(out, "metrics/eval/head/");
    cr_assert(v && h && strstr(out, "(+ eval sets)"), "%s", out);
    char val[128]; /* "LanguageCrossEntropy: X" */
    v += strlen("  metrics/eval/val/");
    snprintf(val, sizeof val, "%.*s", (int)strcspn(v, "\n"), v);
    char *mj = cmt_read_file(DIR "/runs/tiny_ev/metrics.jsonl", NULL);
    cr_assert(strstr(mj, "\"metrics/eval/head/LanguageCrossEntropy\"") && strstr(mj, "\"metrics/eval/val/"), "%s", mj);
    free(mj);
    /* the same run with the val loader alone, unlabelled: the same numbers under metrics/eval/ */
    rc = run("train " DIR "/tiny.yaml run_name=tiny_ev1", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, val), "want '%s':\n%s", val, out);
    /* eval evaluates every loader */
    snprintf(args, sizeof args, "eval " DIR "/tiny.yaml -w " DIR "/runs/tiny_ev/model.safetensors %s", two);
    rc = run(args, out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "metrics/eval/val/LanguageCrossEntropy") && strstr(out, "metrics/eval/head/"), "%s", out);
    /* bad lists are named */
    static const struct {
        const char *ovr, *want;
    } bad[] = {
        {"'eval_loader=[{dataset: {type: tokens, dir: " DIR "/data}}]'", "eval_loader.0.label: required in a list"},
        {"'eval_loader=[{label: a, dataset: {type: tokens, dir: " DIR "/data}}, {label: a, dataset: {type: tokens, dir: " DIR
         "/data}}]'",
         "'a' labels two eval loaders (0 and 1)"},
        {"'eval_loader=[{label: a/b, dataset: {type: tokens, dir: " DIR "/data}}]'", "'a/b': letters, digits"},
        {"'eval_loader=[]'", "a list of 1 to 8 loaders"},
        {"'eval_loader=[3]'", "eval_loader.0: expected {label: NAME"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(args, sizeof args, "train " DIR "/tiny.yaml --print-config %s", bad[i].ovr);
        rc = run(args, out, sizeof out);
        cr_assert_eq(rc, 2, "%s: exit %d:\n%s", bad[i].ovr, rc, out);
        cr_assert(strstr(out, bad[i].want), "%s: want '%s':\n%s", bad[i].ovr, bad[i].want, out);
    }
}

Test(cli_train, autoresume_continues_the_run_folder_logs) {
    cr_assert_eq(system("rm -rf " DIR "/runs/ar " DIR "/ck-ar"), 0);
    const char *base = "train " DIR "/tiny.yaml run_name=ar save_folder=" DIR "/ck-ar autoresume=true eval_interval=0";
    char args[512];
    snprintf(args, sizeof args, "%s max_duration=3ba", base);
    int rc = run(args, out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    snprintf(args, sizeof args, "%s max_duration=5ba", base);
    rc = run(args, out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "resumed from checkpoint"), "%s", out);
    /* metrics.jsonl holds batches 1-3 of the first run and 4-5 of the resumed one */
    FILE *f = fopen(DIR "/runs/ar/metrics.jsonl", "r");
    cr_assert_not_null(f);
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f)) n += strstr(line, "\"loss/train/total\"") != NULL;
    fclose(f);
    cr_assert_eq(n, 5, "%d train losses in metrics.jsonl, want 5 (3 + 2 resumed)", n);
}

/* save_folder on s3 (s3rver on loopback): checkpoints and, at the end, the run folder go to the
 * bucket; a second run on a "fresh machine" (no staging folder) resumes from it. */
Test(cli_train, s3_save_folder_uploads_checkpoints_and_the_run_folder, .timeout = 120) {
    cmt_s3 s3;
    cmt_s3_start(&s3, "bkt");
    char stage[300], env[400];
    snprintf(stage, sizeof stage, "%s/stage", s3.dir);
    snprintf(env, sizeof env, "mkdir -p %s", stage);
    cr_assert_eq(system(env), 0);
    setenv("TMPDIR", stage, 1);
    cr_assert_eq(system("rm -rf " DIR "/runs/s3"), 0);
    const char *base = "train " DIR "/tiny.yaml run_name=s3 save_folder=s3://bkt/cli save_interval=2ba autoresume=true "
                       "eval_interval=0";
    char args[512];
    snprintf(args, sizeof args, "%s max_duration=3ba", base);
    int rc = run(args, out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "run folder uploaded to s3://bkt/cli/run/"), "%s", out);
    cm_object_store *st;
    cr_assert_eq(cm_object_store_open("s3://bkt/cli", NULL, &st), CM_OK, "%s", cm_last_error());
    const char *want[] = {"ep0-ba2/manifest.json", "ep0-ba3/manifest.json", "latest",         "run/config.yaml",
                          "run/log.txt",           "run/metrics.jsonl",     "run/loss.svg",   "run/model.safetensors"};
    for (int i = 0; i < 8; i++) {
        uint64_t n;
        cr_assert_eq(cm_object_store_get_size(st, want[i], &n), CM_OK, "%s: %s", want[i], cm_last_error());
    }
    snprintf(env, sizeof env, "rm -rf %s/composer-checkpoints", stage);
    cr_assert_eq(system(env), 0);
    snprintf(args, sizeof args, "%s max_duration=5ba", base);
    rc = run(args, out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "resumed from checkpoint") && strstr(out, "ep0-ba3"), "%s", out);
    uint64_t n;
    cr_assert_eq(cm_object_store_get_size(st, "ep0-ba5/manifest.json", &n), CM_OK, "%s", cm_last_error());
    cm_object_store_close(st);
    cr_assert_eq(cmt_s3_stat(&s3, "refused"), 0);
    cmt_s3_stop(&s3);
}

/* device: gpu trains where a GPU can be used (a CUDA build on a machine with one, or the CUDA
 * emulator), and elsewhere fails at once saying which piece is missing. */
Test(cli_train, device_gpu_trains_or_says_what_is_missing, .timeout = 900) {
    const bool gpu = cm_device_check(CM_DEVICE_CUDA) == CM_OK;
    int rc = run("train " DIR "/tiny.yaml run_name=tiny_gpu device=gpu max_duration=2ba eval_interval=0", out,
                 sizeof out);
    if (gpu) {
        cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
        cr_assert(strstr(out, "trained 2 batches"), "%s", out);
        cr_assert(cmt_nonempty(DIR "/runs/tiny_gpu/model.safetensors") && cmt_nonempty(DIR "/runs/tiny_gpu/sample.txt"),
                  "%s", out);
    } else {
        cr_assert_eq(rc, 1, "exit %d:\n%s", rc, out);
        cr_assert(strstr(out, "device gpu:") && strstr(out, "not available"), "%s", out);
    }
    rc = run("train " DIR "/tiny.yaml device=tpu", out, sizeof out);
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "device") && strstr(out, "gpu"), "the error names the choices: %s", out);

    /* generate --device gpu: the CPU's text for the same seed (logits come back to the host and
     * are sampled there), or the same clear error; eval device=gpu: the CPU's metrics */
    rc = run("train " DIR "/tiny.yaml run_name=tiny_gen max_duration=2ba eval_interval=0", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    char cpu[256], dev[256];
    rc = run("generate -w " DIR "/runs/tiny_gen/model.safetensors -p ab -n 24 --seed 5", cpu, sizeof cpu);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, cpu);
    rc = run("generate -w " DIR "/runs/tiny_gen/model.safetensors -p ab -n 24 --seed 5 --device gpu", dev, sizeof dev);
    if (gpu) {
        cr_assert_eq(rc, 0, "exit %d:\n%s", rc, dev);
        cr_expect_str_eq(dev, cpu, "GPU generation differs from the CPU's");
    } else {
        cr_assert_eq(rc, 1, "exit %d:\n%s", rc, dev);
        cr_assert(strstr(dev, "--device gpu:") && strstr(dev, "not available"), "%s", dev);
    }
    rc = run("generate -w " DIR "/runs/tiny_gen/model.safetensors --device tpu", dev, sizeof dev);
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, dev);
    cr_assert(strstr(dev, "--device 'tpu': cpu or gpu"), "%s", dev);
    if (gpu) {
        static char ev_cpu[1 << 14];
        rc = run("eval " DIR "/tiny.yaml --weights " DIR "/runs/tiny_gen/model.safetensors eval_subset_num_batches=2",
                 ev_cpu, sizeof ev_cpu);
        cr_assert_eq(rc, 0, "exit %d:\n%s", rc, ev_cpu);
        rc = run("eval " DIR "/tiny.yaml --weights " DIR "/runs/tiny_gen/model.safetensors eval_subset_num_batches=2 "
                 "device=gpu",
                 out, sizeof out);
        cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
        double a, b;
        const char *k = "metrics/eval/LanguageCrossEntropy: ";
        cr_assert(strstr(ev_cpu, k) && strstr(out, k), "%s\n%s", ev_cpu, out);
        a = atof(strstr(ev_cpu, k) + strlen(k)), b = atof(strstr(out, k) + strlen(k));
        cr_expect(fabs(a - b) <= 1e-4 * fabs(a), "eval CE CPU %g vs GPU %g", a, b);
        /* optimizer.param_groups and disable_grad on the GPU: the CPU's run (the groups' pieces
         * are stepped by the backend's kernels at offsets into the unit buffers) */
        const char *pg = "max_duration=3ba eval_interval=0 optimizer.weight_decay=0.1 optimizer.disable_grad=wpe "
                         "\"optimizer.param_groups=[{param_str_match: attn, lr: 3.0e-3, weight_decay: 0}]\"";
        char args[512];
        for (int d = 0; d < 2; d++) {
            snprintf(args, sizeof args, "train " DIR "/tiny.yaml run_name=pg_%s %s %s", d ? "gpu" : "cpu", pg,
                     d ? "device=gpu" : "");
            rc = run(args, out, sizeof out);
            cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
        }
        cr_assert(same_weight("pg_cpu", "pg_gpu", "transformer.wpe.weight"), "a frozen parameter moved on the GPU");
        const char *names[] = {"transformer.h.0.attn.c_attn.weight", "transformer.h.1.mlp.c_fc.weight"};
        for (int i = 0; i < 2; i++) {
            cm_tensor *x = weight("pg_cpu", names[i]), *y = weight("pg_gpu", names[i]);
            const float *xa = cm_tensor_data(x), *ya = cm_tensor_data(y);
            double worst = 0;
            for (int64_t j = 0; j < cm_tensor_numel(x); j++) worst = fmax(worst, fabs((double)xa[j] - ya[j]));
            cr_expect(worst <= 1e-4, "%s: GPU differs from CPU by %g", names[i], worst);
            cm_tensor_free(x);
            cm_tensor_free(y);
        }
    }
}

Test(cli_train, print_config_shows_defaults_and_overrides) {
    int rc = run("train " DIR "/tiny.yaml --print-config optimizer.lr=3e-4 model.n_layer=1", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "  lr: 3e-4\n"), "%s", out);
    cr_assert(strstr(out, "  n_layer: 1\n"), "%s", out);
    cr_assert(strstr(out, "  n_embd: 32\n"), "default from the preset missing:\n%s", out);
    cr_assert(strstr(out, "  betas: [0.9, 0.95]\n"), "%s", out);
    cr_assert(strstr(out, "precision: fp32\n"), "%s", out);
}

Test(cli_train, bad_keys_and_values_name_the_key_and_suggest) {
    struct {
        const char *args;
        int rc;
        const char *want;
    } cases[] = {
        {"optimizer.lrr=0.1", 2, "unknown key 'optimizer.lrr' (did you mean 'optimizer.lr'?)"},
        {"max_duraton=5ba", 2, "unknown key 'max_duraton' (did you mean 'max_duration'?)"},
        {"max_duration=20xx", 2, "max_duration: '20xx' is not a time"},
        {"model.n_layer=two", 2, "model.n_layer: 'two' is not an integer"},
        {"optimizer.name=adamm", 2, "did you mean 'adam"},
        {"model.name=gpt3", 2, "did you mean 'gpt2'?"},
        {"precision=fp8", 2, "precision: unknown value 'fp8'"},
        {"algorithms.gradient_clip={}", 2, "unknown algorithms 'gradient_clip' (did you mean 'gradient_clipping'?"},
        {"callbacks.speed_monitr={}", 2, "unknown callbacks 'speed_monitr' (did you mean 'speed_monitor'?"},
        {"callbacks.early_stopper.comp=bigger", 2, "callbacks.early_stopper.comp"},
        {"autoresume=true", 2, "autoresume: needs save_folder"},
        {"save_interval=3xx", 2, "save_interval: '3xx' is not a time"},
        {"scheduler.t_warmupp=3ba", 2, "did you mean 'scheduler.t_warmup'?"},
        {"model.preset=gpt2-tiny", 2, "model.preset"},
        {"train_loader.dataset.dir=/nonexistent", 1, "/nonexistent/train.bin"},
        {"seed.x=1", 2, "override 'seed.x=1'"},
        {"max_duration", 2, "overrides are key.path=value"},
        {"device_train_microbatch_size=-3", 2, "device_train_microbatch_size: '-3' must be a number of rows"},
        {"device_train_microbatch_size=autoo", 2, "'autoo' is not an integer"},
        {"parallelism.fsdp.sharding_strategy=NO_SHRAD", 2,
         "parallelism.fsdp.sharding_strategy: unknown value 'NO_SHRAD' (did you mean 'NO_SHARD'? use one of NO_SHARD, "
         "SHARD_GRAD_OP, FULL_SHARD, HYBRID_SHARD, _HYBRID_SHARD_ZERO2)"},
        {"dist_timeout=-1", 2, "dist_timeout: -1 must be > 0"},
        {"dist_timeout=soon", 2, "dist_timeout: 'soon' is not a number"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char args[512];
        snprintf(args, sizeof args, "train " DIR "/tiny.yaml --print-config '%s'", cases[i].args);
        int rc = run(args, out, sizeof out);
        cr_assert_eq(rc, cases[i].rc, "%s: exit %d, want %d:\n%s", cases[i].args, rc, cases[i].rc, out);
        cr_assert(strstr(out, cases[i].want), "%s: output lacks '%s':\n%s", cases[i].args, cases[i].want, out);
    }
    /* a missing token file names the tokenizer the model's vocabulary was made for */
    static const struct {
        const char *vocab, *want;
    } tok[] = {{"50257", "--tokenizer gpt2 "}, {"65", "--tokenizer char "}};
    for (size_t i = 0; i < 2; i++) {
        char args[512];
        snprintf(args, sizeof args,
                 "train " DIR "/tiny.yaml --print-config train_loader.dataset.dir=" DIR "/shakespeare_x "
                 "model.vocab_size=%s",
                 tok[i].vocab);
        int rc = run(args, out, sizeof out);
        cr_assert_eq(rc, 1, "vocab %s: exit %d:\n%s", tok[i].vocab, rc, out);
        cr_assert(strstr(out, tok[i].want) && strstr(out, "-o " DIR "/shakespeare_x)"), "vocab %s:\n%s", tok[i].vocab,
                  out);
    }
    /* file positions in messages */
    FILE *f = fopen(DIR "/typo.yaml", "w");
    fputs("max_duration: 5ba\nmodel: {name: gpt2, preset: tiny}\ntrain_loader:\n  dataset: {type: tokens, dir: " DIR
          "/data}\n  batch_sise: 4\n",
          f);
    fclose(f);
    int rc = run("train " DIR "/typo.yaml --print-config", out, sizeof out);
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, DIR "/typo.yaml:5:3: unknown key 'train_loader.batch_sise' (did you mean "
                          "'train_loader.batch_size'?)"),
              "%s", out);
    rc = run("train " DIR "/missing.yaml", out, sizeof out);
    cr_assert_eq(rc, 1, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "missing.yaml"), "%s", out);
}

Test(cli_train, help_lists_the_keys) {
    int rc = run("train --help", out, sizeof out);
    cr_assert_eq(rc, 0);
    const char *keys[] = {"max_duration", "eval_interval", "device_train_microbatch_size", "global_train_batch_size",
                          "gradient_clipping", "optimizer:", "scheduler:", "--print-config", "load_path",
                          "parallelism.fsdp.sharding_strategy", "dist_timeout", "composer -n N train"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) cr_assert(strstr(out, keys[i]), "help lacks %s", keys[i]);
    rc = run("--help", out, sizeof out);
    cr_assert(strstr(out, "train") && strstr(out, "generate") && strstr(out, "eval"), "%s", out);
}

Test(cli_train, mnist_mlp_trains_a_few_batches) {
    FILE *f = fopen(DIR "/mnist.yaml", "w");
    fputs("run_name: mnist\nrun_root: " DIR "/runs\nmax_duration: 3ba\neval_interval: 0\nprogress_bar: false\n"
          "model: {name: mlp, preset: mnist_small}\n"
          "train_loader: {dataset: {type: mnist, dir: ../shared/data/mnist}, batch_size: 64}\n"
          "eval_loader: {dataset: {type: mnist}, batch_size: 500}\n"
          "eval_subset_num_batches: 1\n"
          "optimizer: {name: sgd, lr: 0.1, momentum: 0.9}\n",
          f);
    fclose(f);
    int rc = run("train " DIR "/mnist.yaml", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "trained 3 batches"), "%s", out);
    cr_assert(cmt_nonempty(DIR "/runs/mnist/model.safetensors"));
    rc = run("eval " DIR "/mnist.yaml --weights " DIR "/runs/mnist/model.safetensors", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "metrics/eval/MulticlassAccuracy"), "%s", out);
    /* one process has nothing to shard: a sharded strategy trains as is, and says so */
    rc = run("train " DIR "/mnist.yaml parallelism.fsdp.sharding_strategy=full_shard run_name=mnist-fs", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "FULL_SHARD has nothing to shard") && strstr(out, "trained 3 batches"), "%s", out);
    rc = run("train " DIR "/mnist.yaml optimizer.lr=", out, sizeof out);
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "optimizer.lr: required for sgd"), "%s", out);
    rc = run("train " DIR "/mnist.yaml model.fused_linear_cross_entropy=true", out, sizeof out);
    cr_assert_neq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "model.fused_linear_cross_entropy: applies to GPT models"), "%s", out);
}

/* model.fused_linear_cross_entropy: the same training losses and metrics as without it. */
Test(cli_train, fused_linear_cross_entropy_trains_the_same_run) {
    double v[2][4];
    for (int k = 0; k < 2; k++) {
        char args[512];
        snprintf(args, sizeof args,
                 "train " DIR "/tiny.yaml run_name=tiny_fused%d max_duration=3ba eval_interval=0 "
                 "compute_training_metrics=true %s",
                 k, k ? "model.fused_linear_cross_entropy=true" : "");
        int rc = run(args, out, sizeof out);
        cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
        char cmd[512];
        snprintf(cmd, sizeof cmd,
                 "grep -o '\"loss/train/total\": *[-0-9.e]*\\|\"metrics/train/LanguageCrossEntropy\": *[-0-9.e]*' "
                 DIR "/runs/tiny_fused%d/metrics.jsonl | sed 's/.*: *//' | head -4",
                 k);
        FILE *p = popen(cmd, "r");
        for (int i = 0; i < 4; i++) cr_assert_eq(fscanf(p, "%lf", &v[k][i]), 1, "run %d: value %d missing", k, i);
        pclose(p);
    }
    for (int i = 0; i < 4; i++)
        cr_expect(fabs(v[0][i] - v[1][i]) <= 1e-5 * fabs(v[0][i]), "value %d: fused %.8g vs unfused %.8g", i, v[1][i],
                  v[0][i]);
}

/* EarlyStopper from YAML: with a learning rate of 0 the eval loss moves only by the decoupled
 * weight decay (1e-8 a batch), below min_delta, so with patience 2ba (eval every batch) the run
 * stops after batch 4 of 20. */
Test(cli_train, early_stopper_from_yaml_stops_the_run) {
    int rc = run("train " DIR "/tiny.yaml run_name=es max_duration=20ba eval_interval=1ba eval_subset_num_batches=1 "
                 "optimizer.lr=0 algorithms=null "
                 "'callbacks.early_stopper={monitor: LanguageCrossEntropy, dataloader_label: eval, patience: 2ba, "
                 "min_delta: 0.01}'",
                 out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "trained 4 batches"), "the stopper ends the run at batch 4:\n%s", out);
    /* its arguments are checked by name */
    rc = run("train " DIR "/tiny.yaml --print-config "
             "'callbacks.early_stopper={monitor: LanguageCrossEntropy, patiense: 2ba}'",
             out, sizeof out);
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "unknown key 'callbacks.early_stopper.patiense' (did you mean "
                          "'callbacks.early_stopper.patience'?)"),
              "%s", out);
}

/* Every callback and the profiler are reachable from YAML; bad names and values get the closest
 * valid spelling. */
Test(cli_train, callbacks_and_profiler_from_yaml) {
    int rc = run("train " DIR "/tiny.yaml run_name=cbs max_duration=3ba eval_interval=3ba "
                 "'callbacks={nan_monitor: {on_nan: error}, system_metrics_monitor: {}, free_outputs: {}, "
                 "activation_monitor: {interval: 2ba}, generate: {prompts: [\"ab\"], interval: 2ba, max_new_tokens: 4}, "
                 "memory_snapshot: {skip_batches: 1, interval: 1ba}, oom_observer: {}, export_for_inference: {}}' "
                 "'loggers={file: {flush_interval: 1}}' 'profiler={schedule: {warmup: 0, active: 2}}'",
                 out, sizeof out);
    /* the GPT is not a Sequential: the C export refuses it by name at the end of fit */
    cr_assert_eq(rc, 1, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "ExportForInference") && strstr(out, "Sequential"), "%s", out);
    rc = run("train " DIR "/tiny.yaml run_name=cbs2 max_duration=3ba eval_interval=3ba "
             "'callbacks={nan_monitor: {on_nan: rollback}, system_metrics_monitor: {}, "
             "activation_monitor: {interval: 2ba}, generate: {prompts: [\"ab\"], interval: 2ba, max_new_tokens: 4}, "
             "memory_snapshot: {skip_batches: 1, interval: 1ba}, "
             "checkpoint_saver: {folder: \"" DIR "/ck-{run_name}\", save_interval: 1ba, num_checkpoints_to_keep: 1}}' "
             "'profiler={schedule: {warmup: 0, active: 2}}'",
             out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(cmt_nonempty(DIR "/runs/cbs2/traces/ep0-ba2-rank0.json"), "profiler trace missing:\n%s", out);
    cr_assert(cmt_nonempty(DIR "/runs/cbs2/memory_traces/rank0.2.memory_snapshot.json"), "memory snapshot missing");
    cr_assert(cmt_nonempty(DIR "/ck-cbs2/ep0-ba3/manifest.json"), "CheckpointSaver's checkpoint missing");
    cr_assert(!cmt_nonempty(DIR "/ck-cbs2/ep0-ba2/manifest.json"), "num_checkpoints_to_keep 1 kept ep0-ba2");
    cr_assert(strstr(out, "Self time total"), "the op table is printed:\n%s", out);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "grep -c '^\\[text\\] generate/0' " DIR "/runs/cbs2/log.txt");
    FILE *p = popen(cmd, "r");
    int n = 0;
    cr_assert_eq(fscanf(p, "%d", &n), 1);
    pclose(p);
    cr_assert_eq(n, 1, "one generation (at batch 2) in log.txt, found %d", n);
    snprintf(cmd, sizeof cmd, "grep -c 'activations/max/' " DIR "/runs/cbs2/metrics.jsonl");
    p = popen(cmd, "r");
    cr_assert_eq(fscanf(p, "%d", &n), 1);
    pclose(p);
    cr_assert_geq(n, 1, "ActivationMonitor's metrics in metrics.jsonl");
    struct {
        const char *args;
        const char *want;
    } bad[] = {
        {"callbacks.nan_monitr={}", "did you mean 'nan_monitor'?"},
        {"callbacks.nan_monitor.on_nan=rolback", "did you mean 'rollback'?"},
        {"profiler.schedule.warmpu=1", "did you mean 'profiler.schedule.warmup'?"},
        {"profiler.schedule.active=0", "profiler.schedule: cyclic_schedule: active 0 must be >= 1"},
        {"profiler.json_trace_handler.filename=trace.json", "has no {rank}"},
        {"callbacks.generate.interval=2ba", "callbacks.generate.prompts: required"},
        {"callbacks.image_visualizer.mode=segmentation", "segmentation' is not supported"},
        {"callbacks.load_checkpoint.event=before_lod", "before_lod"},
        {"callbacks.export_for_inference.save_format=onnx", "needs PyTorch"},
        {"loggers.file.filename=x.txt", "loggers.file.filename: the run's files are"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char args[512];
        snprintf(args, sizeof args, "train " DIR "/tiny.yaml --print-config '%s'", bad[i].args);
        rc = run(args, out, sizeof out);
        cr_assert_eq(rc, 2, "%s: exit %d:\n%s", bad[i].args, rc, out);
        cr_assert(strstr(out, bad[i].want), "%s: output lacks '%s':\n%s", bad[i].args, bad[i].want, out);
    }
}

/* examples/mnist-composer.yaml — Composer's training script as a config — trains end to end
 * (a few batches here): its callbacks log, the file logger writes, a checkpoint is saved. */
Test(cli_train, the_composer_script_example_trains) {
    cr_assert_eq(system("rm -rf " DIR "/runs/mnist-composer " DIR "/ck-mc"), 0);
    int rc = run("train examples/mnist-composer.yaml run_root=" DIR "/runs max_duration=6ba eval_subset_num_batches=1 "
                 "save_folder=" DIR "/ck-mc save_interval=3ba model.preset=mnist_small progress_bar=false "
                 "callbacks.speed_monitor.window_size=2",
                 out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "trained 6 batches"), "%s", out);
    cr_assert(cmt_nonempty(DIR "/ck-mc/ep0-ba6/manifest.json"), "no checkpoint:\n%s", out);
    const char *keys[] = {"throughput/samples_per_sec", "lr-DecoupledAdamW/group0", "memory/rss_bytes",
                          "metrics/eval/MulticlassAccuracy"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "grep -c '%s' " DIR "/runs/mnist-composer/metrics.jsonl", keys[i]);
        FILE *p = popen(cmd, "r");
        int n = 0;
        cr_assert_eq(fscanf(p, "%d", &n), 1);
        pclose(p);
        cr_assert_geq(n, 1, "%s missing from metrics.jsonl", keys[i]);
    }
}

/* llm-foundry's optimizer.param_groups and optimizer.disable_grad: a group holding every
 * parameter is the optimizer with the group's values; a frozen parameter keeps its initial value
 * bit for bit under decoupled weight decay (it leaves the optimizer, as torch skips a parameter
 * without a gradient); a group at lr 0 and weight_decay 0 does not move; resuming a run with groups
 * continues it exactly; bad groups are errors naming the key. */
Test(cli_train, optimizer_param_groups_and_disable_grad) {
    const char *base = "train " DIR "/tiny.yaml max_duration=4ba eval_interval=0 optimizer.weight_decay=0.1";
    char args[1024];
    int rc;
    const char *runs[][2] = {
        {"pg-plain", "optimizer.lr=2.0e-3"},
        {"pg-all", "\"optimizer.param_groups=[{param_str_match: '.', lr: 2.0e-3}]\""},
        {"pg-init", "optimizer.lr=0 optimizer.weight_decay=0"},
        {"pg-frozen", "optimizer.disable_grad=wpe \"optimizer.param_groups=[{param_str_match: 'ln_f', lr: 0, "
                      "weight_decay: 0}, {param_str_match: 'no_such_layer'}]\""},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        snprintf(args, sizeof args, "%s run_name=%s %s", base, runs[i][0], runs[i][1]);
        rc = run(args, out, sizeof out);
        cr_assert_eq(rc, 0, "%s: exit %d:\n%s", runs[i][0], rc, out);
        if (i == 3) {
            cr_assert(strstr(out, "optimizer.disable_grad 'wpe': 1 parameter (1024 values) frozen") &&
                          strstr(out, "optimizer.param_groups.0 'ln_f': 2 parameters") &&
                          strstr(out, "optimizer.param_groups.1: no parameter name matches 'no_such_layer'"),
                      "%s", out);
        }
    }
    cr_assert(system("cmp -s " DIR "/runs/pg-plain/model.safetensors " DIR "/runs/pg-all/model.safetensors") == 0,
              "a group of every parameter at lr 2e-3 differs from optimizer.lr=2e-3");
    cr_assert(!same_weight("pg-plain", "pg-init", "transformer.h.0.attn.c_attn.weight"), "the runs did not train");
    cr_assert(same_weight("pg-frozen", "pg-init", "transformer.wpe.weight"), "disable_grad: wpe moved");
    cr_assert(same_weight("pg-frozen", "pg-init", "transformer.ln_f.weight"), "a group at lr 0 moved");
    cr_assert(same_weight("pg-frozen", "pg-init", "transformer.ln_f.bias"), "a group at lr 0 moved");
    cr_assert(!same_weight("pg-frozen", "pg-init", "transformer.h.0.attn.c_attn.weight"), "the default group froze");

    /* resumed = uninterrupted, with a group and a frozen parameter */
    const char *keys = "optimizer.disable_grad=[wpe] \"optimizer.param_groups=[{param_str_match: '[.]h[.]1[.]', lr: "
                       "3.0e-3, betas: [0.8, 0.9]}]\"";
    cr_assert_eq(system("rm -rf " DIR "/ck-pg"), 0);
    snprintf(args, sizeof args, "%s run_name=pg-whole %s", base, keys);
    rc = run(args, out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    snprintf(args, sizeof args, "%s run_name=pg-half %s max_duration=2ba save_folder=" DIR "/ck-pg save_interval=2ba",
             base, keys);
    rc = run(args, out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    snprintf(args, sizeof args, "%s run_name=pg-resumed %s load_path=" DIR "/ck-pg/ep0-ba2", base, keys);
    rc = run(args, out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(system("cmp -s " DIR "/runs/pg-whole/model.safetensors " DIR "/runs/pg-resumed/model.safetensors") == 0,
              "the resumed run with param_groups differs from the uninterrupted one");
    cr_assert(!same_weight("pg-whole", "pg-plain", "transformer.h.1.mlp.c_fc.weight"));

    const struct {
        const char *arg, *want1, *want2;
    } bads[] = {
        {"\"optimizer.param_groups=[{param_str_match: '(', lr: 1.0e-3}]\"", "optimizer.param_groups.0.param_str_match",
         "not a regular expression"},
        {"\"optimizer.param_groups=[{lr: 1.0e-3}]\"", "optimizer.param_groups.0", "param_str_match is required"},
        {"\"optimizer.param_groups={param_str_match: ln_f}\"", "optimizer.param_groups", "expected a list"},
        {"\"optimizer.param_groups=[{param_str_match: ln_f, lrr: 0}]\"", "optimizer.param_groups.0.lrr",
         "optimizer.param_groups.0.lr"},
        {"\"optimizer.param_groups=[{param_str_match: ln_f, amsgrad: true}]\"", "optimizer.param_groups.0",
         "max_exp_avg_sq"},
        {"\"optimizer.param_groups=[{param_str_match: ln_f, eps: -1}]\"", "optimizer.param_groups.0", "eps"},
        {"\"optimizer.disable_grad={a: b}\"", "optimizer.disable_grad", "a list of them"},
        {"\"optimizer.param_groups=[{param_str_match: 'h[.]\\\\d[.]', lr: 0}]\"",
         "optimizer.param_groups.0.param_str_match", "write [0-9]"},
        {"\"optimizer.disable_grad=['attn.+?bias']\"", "optimizer.disable_grad.0", "lazy quantifier +?"},
        {"\"optimizer.disable_grad=['(?:wte)']\"", "optimizer.disable_grad.0", "not a regular expression"},
        {"\"optimizer.disable_grad=['wte[']\"", "optimizer.disable_grad.0", "not a regular expression"},
    };
    for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++) {
        snprintf(args, sizeof args, "%s run_name=pg-bad %s", base, bads[i].arg);
        rc = run(args, out, sizeof out);
        cr_assert_neq(rc, 0, "%s was accepted:\n%s", bads[i].arg, out);
        cr_assert(strstr(out, bads[i].want1) && strstr(out, bads[i].want2), "%s:\n%s", bads[i].arg, out);
    }
}
