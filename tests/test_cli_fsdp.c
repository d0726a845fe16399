/* `composer train` with Composer's / llm-foundry's fsdp_config keys: activation checkpointing from
 * YAML trains the same bits as without it, the offload note on a CPU run, what is refused (with
 * the key's file:line) and --help. Runs the built binary (CM_COMPOSER_BIN). */
#include "cmtest.h"
#include <math.h>

#include <composer/tokenizer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef CM_COMPOSER_BIN
#error "CM_COMPOSER_BIN must name the composer binary (tests/CMakeLists.txt sets it)"
#endif
#define DIR "build/test_cli_fsdp"

static int run(const char *args, char *out, size_t cap) {
    return cmt_run_capturef(out, cap, "%s %s", CM_COMPOSER_BIN, args);
}

/* The base of every config: a tiny GPT (2 blocks) with dropout on, 3 batches, no eval. */
#define BASE                                                  \
    "run_root: " DIR "/runs\n"                                \
    "max_duration: 3ba\n"                                     \
    "eval_interval: 0\n"                                      \
    "progress_bar: false\n"                                   \
    "model: {name: gpt2, preset: tiny, dropout: 0.1}\n"       \
    "train_loader:\n"                                         \
    "  dataset: {type: tokens, dir: " DIR "/data}\n"          \
    "  batch_size: 4\n"                                       \
    "optimizer: {name: decoupled_adamw, lr: 1.0e-3}\n"        \
    "sample: {max_new_tokens: 4}\n"

static void setup(void) {
    cr_assert_eq(system("rm -rf " DIR " && mkdir -p " DIR "/data"), 0);
    cmt_char_token_files(DIR "/data", 20000, 2000);
    cmt_write_text(DIR "/plain.yaml", BASE);
    /* ours (parallelism.fsdp), default policy: every GPT2Block */
    cmt_write_text(DIR "/ckpt.yaml", BASE "parallelism:\n"
                                          "  fsdp:\n"
                                          "    activation_checkpointing: true\n"
                                          "    activation_checkpointing_reentrant: false\n"
                                          "    verbose: true\n");
    /* llm-foundry's top-level block and its map form of the target */
    cmt_write_text(DIR "/foundry.yaml", BASE "fsdp_config:\n"
                                             "  sharding_strategy: FULL_SHARD\n"
                                             "  mixed_precision: FULL\n"
                                             "  activation_checkpointing: true\n"
                                             "  activation_checkpointing_target:\n"
                                             "    GPT2Block: [last-1]\n"
                                             "  limit_all_gathers: true\n"
                                             "  use_orig_params: true\n"
                                             "  forward_prefetch: true\n"
                                             "  backward_prefetch: BACKWARD_PRE\n"
                                             "  sync_module_states: true\n"
                                             "  state_dict_type: full\n"
                                             "  verbose: true\n");
}

TestSuite(cli_fsdp, .init = setup);

static char out[1 << 16];

/* The "loss/train/total" values of a run's metrics.jsonl, in order, as written (the shortest
 * decimal that reads back to the same double: equal text is equal bits). */
static void losses(const char *run_name, char *buf, size_t cap) {
    char path[256];
    snprintf(path, sizeof path, DIR "/runs/%s/metrics.jsonl", run_name);
    size_t len;
    char *m = cmt_read_file(path, &len);
    size_t used = 0;
    buf[0] = 0;
    int n = 0;
    for (const char *p = m; (p = strstr(p, "\"loss/train/total\": ")); n++) {
        p += strlen("\"loss/train/total\": ");
        const size_t k = strcspn(p, ",}");
        used += (size_t)snprintf(buf + used, cap - used, "%.*s ", (int)k, p);
    }
    free(m);
    cr_assert_eq(n, 3, "%s: %d train losses, want 3", path, n);
}

static void same_file(const char *a, const char *b) {
    size_t la, lb;
    char *x = cmt_read_file(a, &la), *y = cmt_read_file(b, &lb);
    cr_assert(la == lb && memcmp(x, y, la) == 0, "%s and %s differ (%zu and %zu bytes)", a, b, la, lb);
    free(x), free(y);
}

Test(cli_fsdp, activation_checkpointing_from_yaml_trains_the_same_bits) {
    int rc = run("train " DIR "/plain.yaml run_name=plain", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    rc = run("train " DIR "/ckpt.yaml run_name=ckpt", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    /* the policy marked both blocks (verbose lists them), so the equality below is not vacuous */
    cr_assert(strstr(out, "activation checkpointed: transformer.h.0 (GPT2Block)") &&
                  strstr(out, "activation checkpointed: transformer.h.1 (GPT2Block)"),
              "both blocks should be checkpointed:\n%s", out);
    rc = run("train " DIR "/foundry.yaml run_name=foundry", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "activation checkpointed: transformer.h.1 (GPT2Block)") &&
                  !strstr(out, "activation checkpointed: transformer.h.0"),
              "last-1 should checkpoint block 1 only:\n%s", out);
    char a[512], b[512], c[512];
    losses("plain", a, sizeof a);
    losses("ckpt", b, sizeof b);
    losses("foundry", c, sizeof c);
    cr_assert_str_eq(b, a, "losses with activation checkpointing %s, without %s", b, a);
    cr_assert_str_eq(c, a, "losses with block 1 checkpointed %s, without %s", c, a);
    /* and the trained weights (so every gradient) are the same bytes */
    same_file(DIR "/runs/ckpt/model.safetensors", DIR "/runs/plain/model.safetensors");
    same_file(DIR "/runs/foundry/model.safetensors", DIR "/runs/plain/model.safetensors");
    /* the same under amp_bf16 with microbatches of 2 rows */
    rc = run("train " DIR "/plain.yaml run_name=plain_mb precision=amp_bf16 device_train_microbatch_size=2", out,
             sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    rc = run("train " DIR "/ckpt.yaml run_name=ckpt_mb precision=amp_bf16 device_train_microbatch_size=2 "
             "parallelism.fsdp.mixed_precision=FULL",
             out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    losses("plain_mb", a, sizeof a);
    losses("ckpt_mb", b, sizeof b);
    cr_assert_str_eq(b, a, "amp_bf16, microbatches of 2: losses with activation checkpointing %s, without %s", b, a);
    same_file(DIR "/runs/ckpt_mb/model.safetensors", DIR "/runs/plain_mb/model.safetensors");
    /* the resolved config keeps what was written, under the section it was written in */
    size_t len;
    char *cfg = cmt_read_file(DIR "/runs/foundry/config.yaml", &len);
    cr_assert(strstr(cfg, "fsdp_config:") && strstr(cfg, "activation_checkpointing: true") && !strstr(cfg, "parallelism"),
              "%s", cfg);
    free(cfg);
}

/* mixed_precision on one process: unset with the block given is Composer's DEFAULT (the losses of
 * an explicit DEFAULT, bit for bit), which is not FULL's (the policy is applied, not ignored);
 * without a block nothing changes (FULL); composer eval applies it too; the same on a GPU run
 * (where one is), with cpu_offload too. */
Test(cli_fsdp, mixed_precision_default_is_composers_default_and_applies_on_one_process) {
    const char *runs[][2] = {
        {"mp_unset", "parallelism.fsdp.verbose=false"},
        {"mp_default", "parallelism.fsdp.mixed_precision=DEFAULT"},
        {"mp_full", "parallelism.fsdp.mixed_precision=FULL"},
        {"mp_pure", "parallelism.fsdp.mixed_precision=PURE"},
        {"mp_none", ""},
    };
    char l[5][512];
    for (int i = 0; i < 5; i++) {
        char args[512];
        snprintf(args, sizeof args, "train " DIR "/plain.yaml run_name=%s precision=amp_bf16 %s", runs[i][0], runs[i][1]);
        int rc = run(args, out, sizeof out);
        cr_assert_eq(rc, 0, "%s: exit %d:\n%s", runs[i][0], rc, out);
        losses(runs[i][0], l[i], sizeof l[i]);
    }
    cr_assert_str_eq(l[0], l[1], "unset %s, DEFAULT %s", l[0], l[1]);
    cr_assert_str_eq(l[2], l[4], "FULL %s, no block %s", l[2], l[4]);
    cr_assert(strcmp(l[1], l[2]) != 0, "DEFAULT and FULL trained the same losses %s", l[1]);
    cr_assert(strcmp(l[3], l[1]) != 0, "PURE and DEFAULT trained the same losses %s", l[1]);
    /* composer eval reads the parameters as training does: DEFAULT's metrics are not FULL's */
    cmt_write_text(DIR "/ev.yaml", "model: {name: gpt2, preset: tiny}\n"
                                   "eval_loader: {dataset: {type: tokens, dir: " DIR "/data}, batch_size: 4}\n"
                                   "eval_subset_num_batches: 2\nprecision: amp_bf16\nparallelism: {fsdp: {verbose: false}}\n");
    char ev[2][4096];
    for (int i = 0; i < 2; i++) {
        int rc = run(i ? "eval " DIR "/ev.yaml --weights " DIR "/runs/mp_full/model.safetensors "
                         "parallelism.fsdp.mixed_precision=FULL"
                       : "eval " DIR "/ev.yaml --weights " DIR "/runs/mp_full/model.safetensors",
                     out, sizeof out);
        cr_assert_eq(rc, 0, "eval: exit %d:\n%s", rc, out);
        const char *m = strstr(out, "LanguageCrossEntropy");
        cr_assert_not_null(m, "%s", out);
        snprintf(ev[i], sizeof ev[i], "%s", m);
    }
    cr_assert(strcmp(ev[0], ev[1]) != 0, "eval under DEFAULT (unset) and FULL printed the same metrics: %s", ev[0]);
    /* on a GPU run the same: unset is DEFAULT (the losses of an explicit DEFAULT), not FULL's;
     * with cpu_offload too (the uploaded units rounded on the GPU), and PURE is not DEFAULT there.
     * Without a GPU the run fails at once saying what is missing. */
    const bool gpu = cm_device_check(CM_DEVICE_CUDA) == CM_OK;
    const char *gruns[][2] = {
        {"mp_gpu_unset", "parallelism.fsdp.verbose=false"},
        {"mp_gpu_default", "parallelism.fsdp.mixed_precision=DEFAULT"},
        {"mp_gpu_full", "parallelism.fsdp.mixed_precision=FULL"},
        {"mp_off_unset", "parallelism.fsdp.cpu_offload=true"},
        {"mp_off_default", "parallelism.fsdp.cpu_offload=true parallelism.fsdp.mixed_precision=DEFAULT"},
        {"mp_off_full", "parallelism.fsdp.cpu_offload=true parallelism.fsdp.mixed_precision=FULL"},
        {"mp_off_pure", "parallelism.fsdp.cpu_offload=true parallelism.fsdp.mixed_precision=PURE"},
    };
    enum { NG = sizeof gruns / sizeof *gruns };
    char g[NG][512];
    for (int i = 0; i < NG; i++) {
        char args[512];
        snprintf(args, sizeof args, "train " DIR "/plain.yaml run_name=%s device=gpu precision=amp_bf16 %s", gruns[i][0],
                 gruns[i][1]);
        int rc = run(args, out, sizeof out);
        if (!gpu) {
            cr_assert_eq(rc, 1, "%s without a GPU: exit %d:\n%s", gruns[i][0], rc, out);
            cr_assert(strstr(out, "device gpu:") && strstr(out, "not available"), "%s", out);
            continue;
        }
        cr_assert_eq(rc, 0, "%s: exit %d:\n%s", gruns[i][0], rc, out);
        losses(gruns[i][0], g[i], sizeof g[i]);
    }
    if (gpu) {
        cr_assert_str_eq(g[0], g[1], "on the gpu: unset %s, DEFAULT %s", g[0], g[1]);
        cr_assert(strcmp(g[1], g[2]) != 0, "on the gpu DEFAULT and FULL trained the same losses %s", g[1]);
        cr_assert_str_eq(g[3], g[4], "cpu_offload: unset %s, DEFAULT %s", g[3], g[4]);
        cr_assert(strcmp(g[4], g[5]) != 0, "cpu_offload: DEFAULT and FULL trained the same losses %s", g[4]);
        cr_assert(strcmp(g[6], g[4]) != 0, "cpu_offload: PURE and DEFAULT trained the same losses %s", g[4]);
    }
}

Test(cli_fsdp, offload_on_a_cpu_run_is_noted_once) {
    int rc = run("train " DIR "/plain.yaml run_name=offload parallelism.fsdp.cpu_offload=true "
                 "parallelism.fsdp.activation_cpu_offload=true",
                 out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    int n = 0;
    for (const char *p = out; (p = strstr(p, "nothing to offload to")); p++) n++;
    cr_assert_eq(n, 1, "the offload note %d times, want once:\n%s", n, out);
    /* activation offload with activation checkpointing on a GPU run is refused before anything is
     * built, naming the key (a checkpointed block keeps only its input: nothing to offload) */
    rc = run("train " DIR "/plain.yaml run_name=offload_gpu device=gpu parallelism.fsdp.activation_cpu_offload=true "
             "parallelism.fsdp.activation_checkpointing=true",
             out, sizeof out);
    cr_assert_eq(rc, 1, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "parallelism.fsdp.activation_cpu_offload") && strstr(out, "activation_checkpointing") &&
                  strstr(out, "nothing left to offload"),
              "%s", out);
}

/* The "loss/train/total" values of a run's metrics.jsonl (3 of them). */
static void loss_values(const char *run_name, double v[3]) {
    char buf[256];
    losses(run_name, buf, sizeof buf);
    char *p = buf;
    for (int i = 0; i < 3; i++) v[i] = strtod(p, &p);
}

/* cpu_offload on a GPU run (one process) trains the plain GPU run's losses (up to the host
 * optimizer's rounding: 1e-5 relative), writes the weights and samples from them; activation_cpu_offload
 * trains its losses bit for bit; without a GPU it fails at once saying what is missing. */
Test(cli_fsdp, cpu_offload_on_a_gpu_run_trains_as_the_plain_gpu_run, .timeout = 900) {
    const bool gpu = cm_device_check(CM_DEVICE_CUDA) == CM_OK;
    int rc = run("train " DIR "/plain.yaml run_name=offload_gpu device=gpu fsdp_config.cpu_offload=true "
                 "fsdp_config.verbose=true",
                 out, sizeof out);
    if (!gpu) {
        cr_assert_eq(rc, 1, "exit %d:\n%s", rc, out);
        cr_assert(strstr(out, "device gpu:") && strstr(out, "not available"), "%s", out);
        return;
    }
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "trained 3 batches"), "%s", out);
    cr_assert(strstr(out, "fsdp_config.cpu_offload: parameters, gradients and optimizer state in host memory"), "%s", out);
    long long uploads = 0;
    for (const char *u = out; (u = strstr(u, "fsdp_config.cpu_offload: ")) && !uploads; u++)
        if (sscanf(u, "fsdp_config.cpu_offload: %lld unit uploads", &uploads) != 1) uploads = 0;
    cr_assert_gt(uploads, 0, "the run uploaded units (verbose):\n%s", out);
    struct stat st;
    cr_assert(stat(DIR "/runs/offload_gpu/model.safetensors", &st) == 0 && stat(DIR "/runs/offload_gpu/sample.txt", &st) == 0,
              "%s", out);
    rc = run("train " DIR "/plain.yaml run_name=plain_gpu device=gpu", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    double a[3], b[3];
    loss_values("offload_gpu", a);
    loss_values("plain_gpu", b);
    for (int i = 0; i < 3; i++)
        cr_expect(fabs(a[i] - b[i]) <= 1e-5 * fabs(b[i]), "batch %d: loss %.8f offloaded, %.8f plain (rel tol 1e-5)", i,
                  a[i], b[i]);
    cr_expect(a[2] != b[0], "the runs trained");
    /* the memory plan counts what the device holds: no optimizer state, a few units */
    rc = run("train " DIR "/plain.yaml run_name=offload_plan device=gpu fsdp_config.cpu_offload=true --plan-memory", out,
             sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "optimizer state           0.00 MiB"), "%s", out);
    /* activation offload: the same bits as the plain GPU run */
    rc = run("train " DIR "/plain.yaml run_name=act_gpu device=gpu fsdp_config.activation_cpu_offload=true "
             "fsdp_config.verbose=true",
             out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "activation offloaded: transformer.h.0 (GPT2Block)") &&
                  strstr(out, "activation offloaded: transformer.h.1 (GPT2Block)"),
              "%s", out);
    char ta[256], tb[256];
    losses("act_gpu", ta, sizeof ta);
    losses("plain_gpu", tb, sizeof tb);
    cr_expect_str_eq(ta, tb, "activation offload changes no bit of the losses");
    /* the weights it wrote: the same tensors (the safetensors header: names, dtypes, shapes) */
    size_t la, lb;
    char *x = cmt_read_file(DIR "/runs/offload_gpu/model.safetensors", &la);
    char *y = cmt_read_file(DIR "/runs/plain_gpu/model.safetensors", &lb);
    cr_assert(la == lb && la > 8, "%zu and %zu bytes", la, lb);
    uint64_t hl = 0;
    memcpy(&hl, x, 8);
    cr_assert(hl < la && !memcmp(x, y, 8 + (size_t)hl), "the safetensors headers differ");
    free(x), free(y);
}

/* Each bad config: the YAML text after BASE, the exit status, and what the message must hold. */
typedef struct bad_case {
    const char *yaml;
    int rc;
    const char *want1, *want2;
} bad_case;

Test(cli_fsdp, bad_values_name_the_key_and_its_line) {
    /* BASE is 10 lines: the block starts on line 11, its first key on line 12 */
    static const bad_case cases[] = {
        {"fsdp_config:\n  activation_checkpointing: maybe\n", 2, "bad.yaml:12:",
         "fsdp_config.activation_checkpointing"},
        {"fsdp_config:\n  activation_checkpointing: true\n  activation_checkpointing_target: GPT2Blok\n", 2,
         "bad.yaml:13:", "did you mean 'GPT2Block'"},
        {"fsdp_config:\n  activation_checkpointing: true\n  activation_checkpointing_target: {GPT2Block: first-x}\n",
         2, "bad.yaml:13:", "'first-x' is not a block id"},
        {"fsdp_config:\n  activation_checkpoint: true\n", 2, "bad.yaml:12:",
         "did you mean 'fsdp_config.activation_checkpointing'"},
        {"fsdp_config:\n  mixed_precision: {param_dtype: bfloat8}\n", 2, "bad.yaml:12:",
         "fsdp_config.mixed_precision.param_dtype: unknown dtype 'bfloat8' (use fp32"},
        {"precision: amp_bf16\nfsdp_config:\n  mixed_precision: {reduce_dtype: fp16}\n", 1, "bad.yaml:13:",
         "fsdp_config.mixed_precision.reduce_dtype: 'fp16': fp16 is not built"},
        {"fsdp_config:\n  mixed_precision: {param_dtype: bf16, keep_low_precision_grads: sometimes}\n", 2,
         "bad.yaml:12:", "fsdp_config.mixed_precision.keep_low_precision_grads"},
        {"fsdp_config:\n  mixed_precision: {param_dtype: bf16, keep_low_precision_grads: true}\n", 1, "bad.yaml:12:",
         "keep_low_precision_grads: true is not built"},
        {"fsdp_config:\n  mixed_precision: [bf16]\n", 2, "bad.yaml:12:", "expected FULL, DEFAULT, PURE or"},
        {"fsdp_config:\n  mixed_precision: HALF\n", 2, "bad.yaml:12:", "FULL, DEFAULT, PURE"},
        /* HYBRID_SHARD's degrees against the world (one process here) */
        {"fsdp_config:\n  sharding_strategy: HYBRID_SHARD\n  data_parallel_shard_degree: 2\n", 2, "bad.yaml:13:",
         "data_parallel_shard_degree 2 does not divide the world size 1, so data_parallel_replicate_degree cannot"},
        {"fsdp_config:\n  sharding_strategy: _HYBRID_SHARD_ZERO2\n  data_parallel_shard_degree: 1\n"
         "  data_parallel_replicate_degree: 2\n", 2, "bad.yaml:13:",
         "data_parallel_shard_degree 1 x data_parallel_replicate_degree 2 = 2 is not the world size 1"},
        {"fsdp_config:\n  sharding_strategy: HYBRID_SHARD\n  data_parallel_replicate_degree: 0\n", 2, "bad.yaml:13:",
         "fsdp_config.data_parallel_replicate_degree: 0: a number of ranks >= 1 (or -1"},
        {"fsdp_config:\n  sharding_strategy: FULL_SHARD\n  data_parallel_shard_degree: 4\n", 2, "bad.yaml:13:",
         "applies to sharding_strategy HYBRID_SHARD or _HYBRID_SHARD_ZERO2 only (FULL_SHARD shards over every rank)"},
        {"fsdp_config:\n  sharding_strategy: HYBRID_SHRAD\n", 2, "bad.yaml:12:", "did you mean 'HYBRID_SHARD'"},
        {"fsdp_config:\n  backward_prefetch: BACKWARD_PRR\n", 2, "bad.yaml:12:", "did you mean 'BACKWARD_PRE'"},
        {"fsdp_config:\n  state_dict_type: local\n", 2, "bad.yaml:12:", "full, sharded"},
        {"fsdp_config: {verbose: true}\nparallelism:\n  fsdp: {verbose: true}\n", 2, "bad.yaml:11:",
         "given twice"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char text[2048];
        snprintf(text, sizeof text, "%s%s", BASE, cases[i].yaml);
        cmt_write_text(DIR "/bad.yaml", text);
        int rc = run("train " DIR "/bad.yaml run_name=bad", out, sizeof out);
        cr_assert_eq(rc, cases[i].rc, "case %zu: exit %d, want %d:\n%s", i, rc, cases[i].rc, out);
        cr_assert(strstr(out, cases[i].want1) && strstr(out, cases[i].want2), "case %zu: want '%s' and '%s' in:\n%s",
                  i, cases[i].want1, cases[i].want2, out);
    }
}

Test(cli_fsdp, one_process_notes_what_sharded_checkpoints_become_and_an_empty_block_is_none) {
    int rc = run("train " DIR "/plain.yaml run_name=sdt parallelism.fsdp.state_dict_type=sharded "
                 "parallelism.fsdp.sharding_strategy=FULL_SHARD save_folder=" DIR "/ck save_interval=3ba",
                 out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "state_dict_type: sharded: one process:"), "%s", out);
    /* an empty block (`fsdp_config:`, null) is no block */
    cmt_write_text(DIR "/empty.yaml", BASE "fsdp_config:\n");
    rc = run("train " DIR "/empty.yaml run_name=empty", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    rc = run("ckpt inspect " DIR "/ck/ep0-ba3", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "layout      monolithic"), "%s", out);
}

Test(cli_fsdp, hybrid_shard_on_one_process_is_one_group_of_one_and_minus_one_derives) {
    /* Composer's spelling of "derive it": -1; one process has nothing to shard and says so */
    cmt_write_text(DIR "/hy.yaml", BASE "fsdp_config:\n  sharding_strategy: HYBRID_SHARD\n  data_parallel_shard_degree: -1\n"
                                        "  data_parallel_replicate_degree: 1\n");
    int rc = run("train " DIR "/hy.yaml run_name=hy", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "one process: fsdp_config.sharding_strategy HYBRID_SHARD has nothing to shard"), "%s", out);
}

Test(cli_fsdp, help_lists_every_key) {
    int rc = run("train --help", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    static const char *const keys[] = {
        "fsdp_config",       "sharding_strategy",      "activation_checkpointing_target",
        "activation_checkpointing_reentrant", "activation_cpu_offload", "cpu_offload", "mixed_precision",
        "sync_module_states", "state_dict_type",        "verbose", "use_orig_params", "limit_all_gathers",
        "backward_prefetch",  "forward_prefetch", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2", "data_parallel_shard_degree",
        "data_parallel_replicate_degree"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        cr_assert(strstr(out, keys[i]), "--help does not list %s:\n%s", keys[i], out);
}
