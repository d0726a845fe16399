/* `composer train | eval | ckpt export --hf` with Hugging Face pretrained folders: fine-tuning a
 * classifier from an MLM folder (the new head announced), the hf_checkpointer folder and the
 * exported checkpoint loading back as the trained weights, masked-LM pretraining from a config
 * alone that resumes bit for bit, GPT-2 from a folder, evaluation with the folder's weights, ALiBi
 * pretraining fine-tuned from its Composer checkpoint (and refused as a folder), and the messages
 * of bad models, datasets and folders. Runs the built binary (CM_COMPOSER_BIN). */
#include "checkpoint/ckpt_impl.h"
#include "cmtest.h"
#include "cmtrain.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef CM_COMPOSER_BIN
#error "CM_COMPOSER_BIN must name the composer binary (tests/CMakeLists.txt sets it)"
#endif
#define DIR "build/test_cli_hf"

static int run(const char *args, char *out, size_t cap) {
    return cmt_run_capturef(out, cap, "CM_NUM_THREADS=1 %s %s", CM_COMPOSER_BIN, args);
}

/* The first 200 SST-2 training rows and 300 lines of tiny Shakespeare; a fine-tuning config on
 * the golden MLM folder (vocabulary of 100 tokens, hidden 32). */
static void setup(void) {
    cr_assert_eq(system("rm -rf " DIR " && mkdir -p " DIR), 0);
    cr_assert_eq(system("head -201 ../shared/data/sst2/train.tsv > " DIR "/sub.tsv"), 0);
    cr_assert_eq(system("head -300 ../shared/data/tinyshakespeare/input.txt > " DIR "/shake.txt"), 0);
    cmt_write_text(DIR "/cls.yaml", "run_name: cls\n"
                                    "run_root: " DIR "/runs\n"
                                    "seed: 5\n"
                                    "progress_bar: false\n"
                                    "model:\n"
                                    "  name: hf\n"
                                    "  pretrained_model_name_or_path: tests/golden/hf/bert-mlm\n"
                                    "  task: sequence_classification\n"
                                    "  num_labels: 2\n"
                                    "train_loader:\n"
                                    "  dataset: {type: tsv, path: " DIR "/sub.tsv, max_seq_len: 16}\n"
                                    "  batch_size: 8\n"
                                    "eval_loader:\n"
                                    "  dataset: {type: sst2, split: dev, max_seq_len: 32}\n"
                                    "  batch_size: 16\n"
                                    "eval_subset_num_batches: 2\n"
                                    "optimizer: {name: decoupled_adamw, lr: 1.0e-3}\n"
                                    "scheduler: {name: linear_decay_with_warmup, t_warmup: 1ba}\n"
                                    "max_duration: 4ba\n"
                                    "eval_interval: 4ba\n"
                                    "save_folder: " DIR "/ckpt\n"
                                    "save_interval: 2ba\n"
                                    "callbacks:\n"
                                    "  hf_checkpointer: {save_folder: " DIR "/runs/cls, huggingface_folder_name: final}\n");
    /* masked LM from a config alone: BERT-Tiny's config.json made smaller, bert-base's vocab.txt */
    cmt_write_text(DIR "/mlm.yaml", "run_name: mlm\n"
                                    "run_root: " DIR "/runs\n"
                                    "seed: 3\n"
                                    "progress_bar: false\n"
                                    "model:\n"
                                    "  name: hf\n"
                                    "  pretrained_model_name_or_path: examples/bert-tiny\n"
                                    "  pretrained: false\n"
                                    "  task: masked_lm\n"
                                    "  config_overrides: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1,"
                                    " max_position_embeddings: 64}\n"
                                    "tokenizer: {name: ../shared/data/bert}\n"
                                    "train_loader:\n"
                                    "  dataset:\n"
                                    "    type: text\n"
                                    "    path: [" DIR "/sub.tsv, " DIR "/shake.txt]\n"
                                    "    max_seq_len: 32\n"
                                    "    mlm_probability: 0.3\n"
                                    "  batch_size: 8\n"
                                    "  num_workers: 2\n"
                                    "optimizer: {name: decoupled_adamw, lr: 1.0e-3}\n"
                                    "max_duration: 4ba\n");
}

TestSuite(cli_hf, .init = setup, .timeout = 120);

/* All parameters of a pretrained folder's model, loaded as `task`. */
static float *folder_params(const char *dir, cm_hf_task task, int64_t *n) {
    cm_hf_load_opts o = cm_hf_load_opts_default();
    o.task = task;
    cm_model *m;
    cr_assert_eq(cm_hf_load(dir, &o, &m, NULL), CM_OK, "%s: %s", dir, cm_last_error());
    float *p = cmt_params_copy(m, n);
    cm_model_free(m);
    return p;
}

Test(cli_hf, finetune_from_a_folder_then_export_and_reload) {
    static char out[1 << 16];
    int rc = run("train " DIR "/cls.yaml", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "newly initialized: [bert.pooler.dense.weight, bert.pooler.dense.bias, classifier.weight, "
                          "classifier.bias]"),
              "transformers' announcement of the new head:\n%s", out);
    cr_assert(strstr(out, "were not used when initializing BertForSequenceClassification: [cls.predictions.bias"), "%s",
              out);
    cr_assert(strstr(out, "metrics/eval/MulticlassAccuracy") && strstr(out, "metrics/eval/CrossEntropy"), "%s", out);
    /* the hf_checkpointer's folder at the end, and the exported checkpoint of the same batch */
    cr_assert(cmt_nonempty(DIR "/runs/cls/huggingface/final/config.json"), "%s", out);
    cr_assert(cmt_nonempty(DIR "/runs/cls/huggingface/final/vocab.txt"));
    rc = run("ckpt export --hf " DIR "/ckpt -o " DIR "/exported", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    int64_t na, nb;
    float *a = folder_params(DIR "/runs/cls/huggingface/final", CM_HF_TASK_SEQUENCE_CLASSIFICATION, &na);
    float *b = folder_params(DIR "/exported", CM_HF_TASK_SEQUENCE_CLASSIFICATION, &nb);
    cr_assert_eq(na, nb);
    cr_assert(memcmp(a, b, sizeof(float) * (size_t)na) == 0, "the exported checkpoint (ba4) differs from the folder");
    /* ... and they are the trained weights, not the pretrained ones */
    int64_t nc;
    float *c = folder_params("tests/golden/hf/bert-mlm", CM_HF_TASK_SEQUENCE_CLASSIFICATION, &nc);
    int64_t same = 0;
    for (int64_t i = 0; i < nc && i < na; i++) same += a[i] == c[i];
    cr_assert_lt(same, na / 2, "%lld of %lld weights unchanged by training", (long long)same, (long long)na);
    cr_assert(cmt_nonempty(DIR "/exported/tokenizer_config.json"));
    cr_assert(cmt_nonempty(DIR "/exported/special_tokens_map.json"));
    free(a), free(b), free(c);
    /* a non-HF export of the same checkpoint still works */
    rc = run("ckpt export " DIR "/ckpt -o " DIR "/plain.safetensors", out, sizeof out);
    cr_assert_eq(rc, 0, "%s", out);
}

/* The seeds' workflow as the examples give it — pretrain (bert-mlm.yaml), adapt to the task's
 * sentences (bert-tapt.yaml), fine-tune (bert-sst2.yaml) — each from the folder the one before
 * wrote, on small data for two batches: the example files stay runnable as documented. */
Test(cli_hf, bert_examples_chain_pretrain_adapt_finetune) {
    static char out[1 << 16];
    const char *common = "max_duration=2ba eval_interval=0 train_loader.batch_size=4 "
                         "save_folder=null progress_bar=false run_root=" DIR "/runs";
    char args[2048];
    snprintf(args, sizeof args,
             "train examples/bert-mlm.yaml %s 'train_loader.dataset.path=[" DIR "/sub.tsv, " DIR "/shake.txt]' "
             "callbacks.hf_checkpointer.save_folder=" DIR "/ex-mlm",
             common);
    int rc = run(args, out, sizeof out);
    cr_assert_eq(rc, 0, "bert-mlm.yaml: exit %d:\n%s", rc, out);
    cr_assert(cmt_nonempty(DIR "/ex-mlm/huggingface/final/model.safetensors"), "%s", out);
    snprintf(args, sizeof args,
             "train examples/bert-tapt.yaml %s train_loader.dataset.path=" DIR "/sub.tsv "
             "model.pretrained_model_name_or_path=" DIR "/ex-mlm/huggingface/final "
             "callbacks.hf_checkpointer.save_folder=" DIR "/ex-tapt",
             common);
    rc = run(args, out, sizeof out);
    cr_assert_eq(rc, 0, "bert-tapt.yaml: exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "BertForMaskedLM"), "%s", out);
    cr_assert(cmt_nonempty(DIR "/ex-tapt/huggingface/final/model.safetensors"), "%s", out);
    snprintf(args, sizeof args,
             "train examples/bert-sst2.yaml %s 'train_loader.dataset={type: sst2, path: " DIR "/sub.tsv}' "
             "model.pretrained_model_name_or_path=" DIR "/ex-tapt/huggingface/final",
             common);
    rc = run(args, out, sizeof out);
    cr_assert_eq(rc, 0, "bert-sst2.yaml: exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "from the model checkpoint at " DIR "/ex-tapt/huggingface/final and are newly initialized: "
                          "[bert.pooler.dense.weight"),
              "fine-tuning did not start from the adapted folder:\n%s", out);
    /* the adapted weights are the ones fine-tuning starts from: they differ from the pretrained */
    int64_t na, nb;
    float *a = folder_params(DIR "/ex-mlm/huggingface/final", CM_HF_TASK_MASKED_LM, &na);
    float *b = folder_params(DIR "/ex-tapt/huggingface/final", CM_HF_TASK_MASKED_LM, &nb);
    cr_assert_eq(na, nb);
    cr_assert(memcmp(a, b, sizeof(float) * (size_t)na) != 0, "bert-tapt.yaml did not change the pretrained weights");
    free(a), free(b);
}

Test(cli_hf, eval_uses_the_folder_weights) {
    static char out[1 << 16];
    int rc = run("eval " DIR "/cls.yaml model.pretrained_model_name_or_path=tests/golden/hf/bert-cls model.num_labels=3",
                 out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "evaluated the pretrained folder") && strstr(out, "metrics/eval/MulticlassAccuracy"), "%s", out);
    cr_assert_null(strstr(out, "newly initialized"), "a complete classifier folder has no new head:\n%s", out);
}

/* Masks are a function of (seed, epoch, sample): a run resumed from its batch-2 checkpoint ends
 * with the same weights, bit for bit, as the run that did not stop. */
Test(cli_hf, mlm_pretraining_resumes_exactly) {
    static char out[1 << 16];
    int rc = run("train " DIR "/mlm.yaml", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "BertForMaskedLM"), "%s", out);
    rc = run("train " DIR "/mlm.yaml run_name=mlm-a max_duration=2ba save_folder=" DIR "/mlm-ckpt save_interval=2ba", out,
             sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    rc = run("train " DIR "/mlm.yaml run_name=mlm-b load_path=" DIR "/mlm-ckpt/ep0-ba2", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    char *x, *y;
    size_t nx, ny;
    x = cmt_read_file(DIR "/runs/mlm/model.safetensors", &nx);
    y = cmt_read_file(DIR "/runs/mlm-b/model.safetensors", &ny);
    cr_assert(nx == ny && memcmp(x, y, nx) == 0, "the resumed run's weights differ from the uninterrupted run's");
    free(x), free(y);
    /* the pretrained model exports as a folder that fine-tuning starts from */
    rc = run("ckpt export --hf " DIR "/mlm-ckpt -o " DIR "/mlm-hf", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(cmt_nonempty(DIR "/mlm-hf/vocab.txt") && cmt_nonempty(DIR "/mlm-hf/model.safetensors"));
    rc = run("train " DIR "/cls.yaml run_name=cls2 save_folder=null callbacks=null model.pretrained_model_name_or_path=" DIR
             "/mlm-hf max_duration=2ba eval_interval=2ba",
             out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "newly initialized: [bert.pooler.dense.weight"), "%s", out);
}

Test(cli_hf, gpt2_folder_trains_on_text_and_samples) {
    static char out[1 << 16];
    cmt_write_text(DIR "/gpt.yaml", "run_name: gpt\n"
                                    "run_root: " DIR "/runs\n"
                                    "progress_bar: false\n"
                                    "model: {name: hf, pretrained_model_name_or_path: tests/golden/hf/gpt2, task: causal_lm}\n"
                                    "train_loader:\n"
                                    "  dataset: {type: text, path: " DIR "/shake.txt, max_seq_len: 16}\n"
                                    "  batch_size: 4\n"
                                    "optimizer: {name: decoupled_adamw, lr: 1.0e-3}\n"
                                    "max_duration: 3ba\n"
                                    "sample: {prompt: 'the ', max_new_tokens: 8}\n");
    int rc = run("train " DIR "/gpt.yaml", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "GPT2LMHeadModel") && strstr(out, "--- sample (8 tokens"), "%s", out);
    /* generation from the run's weights with the folder's tokenizer */
    rc = run("generate --weights " DIR "/runs/gpt/model.safetensors --tokenizer tests/golden/hf/gpt2 --prompt 'the ' "
             "-n 6 --temperature 0",
             out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(!strncmp(out, "the ", 4), "the prompt comes first:\n%s", out);
}

static void expect_fail(const char *args, int want_rc, const char *s1, const char *s2) {
    static char out[1 << 16];
    int rc = run(args, out, sizeof out);
    cr_assert_eq(rc, want_rc, "%s: exit %d (want %d):\n%s", args, rc, want_rc, out);
    cr_assert(strstr(out, s1), "'%s' not in:\n%s", s1, out);
    if (s2) cr_assert(strstr(out, s2), "'%s' not in:\n%s", s2, out);
}

/* The numbers logged under `key` in a run folder's metrics.jsonl, in order (at most cap). */
static int logged(const char *run_name, const char *key, double *v, int cap) {
    char path[256], *data;
    size_t n;
    snprintf(path, sizeof path, DIR "/runs/%s/metrics.jsonl", run_name);
    data = cmt_read_file(path, &n);
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    int k = 0;
    for (const char *p = strstr(data, pat); p && k < cap; p = strstr(p + 1, pat)) v[k++] = strtod(p + strlen(pat), NULL);
    free(data);
    return k;
}

/* llm-foundry's allow_pad_trimming: batches cut to their longest row train and evaluate as the
 * batches padded to max_seq_len (the model masks the padding; dropout off, since its masks are
 * drawn for the shape) — a classifier on SST-2 rows padded to 32 (the dev set's rows too), and
 * masked-LM pretraining line by line, whose labels are cut with the ids. */
Test(cli_hf, allow_pad_trimming_trains_and_evaluates_as_padding_to_max_seq_len) {
    static char out[1 << 16];
    static const char *const cfgs[2][2] = {
        {"cls.yaml train_loader.dataset.max_seq_len=32 max_duration=6ba eval_interval=3ba save_folder=null callbacks=null"
         " model.config_overrides.hidden_dropout_prob=0 model.config_overrides.attention_probs_dropout_prob=0",
         " train_loader.dataset.allow_pad_trimming=true eval_loader.dataset.allow_pad_trimming=true"},
        {"mlm.yaml max_duration=6ba train_loader.dataset.line_by_line=true model.config_overrides.hidden_dropout_prob=0"
         " model.config_overrides.attention_probs_dropout_prob=0",
         " train_loader.dataset.allow_pad_trimming=true train_loader.dataset.pad_to_multiple_of=4"}};
    for (int i = 0; i < 2; i++) {
        char args[1024];
        double la[16], lb[16], ea[4], eb[4];
        snprintf(args, sizeof args, "train " DIR "/%s run_name=pad%d", cfgs[i][0], i);
        int rc = run(args, out, sizeof out);
        cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
        cr_assert(!strstr(out, "allow_pad_trimming"), "%s", out);
        snprintf(args, sizeof args, "train " DIR "/%s run_name=trim%d%s", cfgs[i][0], i, cfgs[i][1]);
        rc = run(args, out, sizeof out);
        cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
        cr_assert(strstr(out, "train_loader: each batch cut to its longest row, a multiple of"), "%s", out);
        char name[16];
        snprintf(name, sizeof name, "pad%d", i);
        const int na = logged(name, "loss/train/total", la, 16);
        snprintf(name, sizeof name, "trim%d", i);
        const int nb = logged(name, "loss/train/total", lb, 16);
        cr_assert(na == 6 && nb == 6, "6 losses each (%d, %d)", na, nb);
        for (int k = 0; k < na; k++)
            cr_assert(fabs(la[k] - lb[k]) <= 1e-5 * fabs(la[k]), "config %d batch %d: loss %.8f trimmed, %.8f padded", i,
                      k + 1, lb[k], la[k]);
        if (i == 0) {
            cr_assert(strstr(out, "eval_loader: each batch cut to its longest row, a multiple of 8"), "%s", out);
            const int ma = logged("pad0", "metrics/eval/CrossEntropy", ea, 4), mb = logged("trim0", "metrics/eval/CrossEntropy", eb, 4);
            cr_assert(ma == 2 && mb == 2, "two evaluations each (%d, %d)", ma, mb);
            for (int k = 0; k < ma; k++)
                cr_assert(fabs(ea[k] - eb[k]) <= 1e-5 * fabs(ea[k]), "evaluation %d: %.8f trimmed, %.8f padded", k + 1, eb[k],
                          ea[k]);
        }
    }
    /* bad values are named */
    expect_fail("train " DIR "/cls.yaml train_loader.dataset.pad_to_multiple_of=8", 2,
                "train_loader.dataset.pad_to_multiple_of: has no effect without", "allow_pad_trimming: true");
    expect_fail("train " DIR "/cls.yaml train_loader.dataset.allow_pad_trimming=true train_loader.dataset.pad_to_multiple_of=0",
                2, "train_loader.dataset.pad_to_multiple_of", "must be >= 1");
    /* a causal-LM text dataset is full rows of ids and labels: nothing to cut by */
    cmt_write_text(DIR "/gpt-trim.yaml", "run_root: " DIR "/runs\n"
                                         "model: {name: hf, pretrained_model_name_or_path: tests/golden/hf/gpt2, task: causal_lm}\n"
                                         "train_loader:\n"
                                         "  dataset: {type: text, path: " DIR "/shake.txt, max_seq_len: 16, allow_pad_trimming: true}\n"
                                         "  batch_size: 4\n"
                                         "max_duration: 1ba\n");
    expect_fail("train " DIR "/gpt-trim.yaml", 1, "train_loader.dataset.allow_pad_trimming", "'attention_mask' field");
}


/* MosaicBERT's pipeline: masked-LM pretraining with ALiBi, then fine-tuning from its Composer
 * checkpoint (load_weights_only, load_strict_model_weights: false): the checkpoint re-applies ALiBi
 * to the classifier and the body starts from the pretrained weights, the MLM head left out, the
 * pooler and classifier new. A pretrained folder has no way to say ALiBi (transformers' BERT has
 * none), so the HuggingFaceCheckpointer and `ckpt export --hf` refuse such a model, naming this way. */
Test(cli_hf, alibi_pretraining_fine_tunes_from_its_checkpoint_not_a_folder) {
    static char out[1 << 16];
    char args[2048];
    /* as the mlm-*.yaml recipes: rows keep their length (a classifier's batches cannot be reshaped) */
    const char *alibi = "'algorithms={alibi: {max_sequence_length: 32, train_sequence_length_scaling: 1.0}}'";
    /* refused before the first batch, nothing written */
    snprintf(args, sizeof args, "train " DIR "/mlm.yaml run_name=al-hf %s callbacks.hf_checkpointer.save_folder=" DIR "/al-hf",
             alibi);
    expect_fail(args, 1, "BertForMaskedLM cannot be written as a pretrained folder: its attention at",
                "uses ALiBi (the alibi algorithm)");
    expect_fail(args, 1, "load_weights_only=true load_strict_model_weights=false", NULL);
    cr_assert_not(cmt_exists(DIR "/al-hf/huggingface"), "a folder was written for an ALiBi model");
    /* gated linear units replace modules: refused, the module named */
    expect_fail("train " DIR "/mlm.yaml run_name=glu-hf 'algorithms={gated_linear_units: {}}' "
                "callbacks.hf_checkpointer.save_folder=" DIR "/glu-hf",
                1, "module 'bert.encoder.layer.0.intermediate' is of type Identity", "load_strict_model_weights=false");
    /* a low-precision LayerNorm changes no weight: written */
    int rc = run("train " DIR "/mlm.yaml run_name=lp-hf max_duration=1ba precision=amp_bf16 "
                 "'algorithms={low_precision_layernorm: {}}' callbacks.hf_checkpointer.save_folder=" DIR "/lp-hf",
                 out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(cmt_nonempty(DIR "/lp-hf/huggingface/ba1/model.safetensors"), "%s", out);
    /* pretraining with Composer checkpoints */
    snprintf(args, sizeof args, "train " DIR "/mlm.yaml run_name=al-mlm %s max_duration=2ba save_folder=" DIR
             "/al-ckpt save_interval=2ba", alibi);
    rc = run(args, out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    expect_fail("ckpt export --hf " DIR "/al-ckpt -o " DIR "/al-export", 1, "was trained with Alibi, model surgery",
                "load_path=" DIR "/al-ckpt/ep0-ba2 load_weights_only=true load_strict_model_weights=false");
    cr_assert_not(cmt_exists(DIR "/al-export"), "the refused export left a folder");
    /* inspect says what a load re-applies */
    rc = run("ckpt inspect " DIR "/al-ckpt", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "\nalgorithms  Alibi (required on load: max_sequence_length 32, "
                          "train_sequence_length_scaling 1)\n"),
              "%s", out);
    rc = run("ckpt export " DIR "/al-ckpt -o " DIR "/al-mlm.safetensors", out, sizeof out);
    cr_assert_eq(rc, 0, "the weights-only export: exit %d:\n%s", rc, out);
    /* the classifier of the same shape fine-tunes from the checkpoint; lr 0 keeps the loaded weights */
    cmt_write_text(DIR "/al-cls.yaml", "run_name: al-cls\n"
                                       "run_root: " DIR "/runs\n"
                                       "progress_bar: false\n"
                                       "model:\n"
                                       "  name: hf\n"
                                       "  pretrained_model_name_or_path: examples/bert-tiny\n"
                                       "  pretrained: false\n"
                                       "  task: sequence_classification\n"
                                       "  num_labels: 2\n"
                                       "  config_overrides: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1,"
                                       " max_position_embeddings: 64}\n"
                                       "tokenizer: {name: ../shared/data/bert}\n"
                                       "train_loader:\n"
                                       "  dataset: {type: tsv, path: " DIR "/sub.tsv, max_seq_len: 32}\n"
                                       "  batch_size: 8\n"
                                       "optimizer: {name: decoupled_adamw, lr: 0.0, weight_decay: 0.0}\n"
                                       "max_duration: 1ba\n"
                                       "load_path: " DIR "/al-ckpt/ep0-ba2\n"
                                       "load_weights_only: true\n");
    /* strict, the default: the missing and the unexpected are named, with the fix */
    expect_fail("train " DIR "/al-cls.yaml run_name=al-strict", 1, "Missing: [bert.pooler.dense.weight",
                "load_strict_model_weights = false");
    rc = run("train " DIR "/al-cls.yaml load_strict_model_weights=false", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    const char *w = strstr(out, "Automatically adding required_on_load algorithm Alibi");
    cr_assert(w, "ALiBi not re-applied:\n%s", out);
    cr_assert_null(strstr(w + 1, "Automatically adding"), "Composer's warning said twice:\n%s", out);
    cr_assert(strstr(out, "model tensors missing (bert.pooler.dense.weight") && strstr(out, "unexpected (cls.predictions"),
              "%s", out);
    cr_assert(strstr(out, "ALiBi: 1 attention modules of BertForSequenceClassification biased"), "%s", out);
    /* eval from the run folder: its config's load_path says what the body needs (ALiBi), so the
     * fine-tuned weights load into the model they were trained as */
    rc = run("eval " DIR "/runs/al-cls/config.yaml --weights " DIR "/runs/al-cls/model.safetensors "
             "'eval_loader={dataset: {type: tsv, path: " DIR "/sub.tsv, max_seq_len: 32}, batch_size: 8}'",
             out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "ALiBi: 1 attention modules of BertForSequenceClassification biased") &&
                  strstr(out, "metrics/eval/MulticlassAccuracy"),
              "%s", out);
    /* ALiBi's sequence-length scaling reshapes rows: a classifier's per-sample label cannot follow */
    expect_fail("train " DIR "/al-cls.yaml run_name=al-scaled load_strict_model_weights=false "
                "'algorithms={alibi: {max_sequence_length: 32, train_sequence_length_scaling: 0.5}}'",
                1, "'label' is (8,)", "needs train_sequence_length_scaling: 1.0");
    /* every body tensor is the pretrained one */
    cm_safetensors *a, *b;
    cr_assert_eq(cm_safetensors_open(DIR "/al-mlm.safetensors", &a), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_safetensors_open(DIR "/runs/al-cls/model.safetensors", &b), CM_OK, "%s", cm_last_error());
    int body = 0;
    for (size_t i = 0; i < cm_safetensors_count(a); i++) {
        const cm_st_tensor *x = cm_safetensors_at(a, i), *y;
        if (strncmp(x->name, "bert.", 5)) continue;
        cr_assert_not_null(y = cm_safetensors_find(b, x->name), "%s not in the fine-tuned model", x->name);
        cr_assert(x->nbytes == y->nbytes && memcmp(x->data, y->data, x->nbytes) == 0,
                  "%s differs from the pretrained checkpoint's", x->name);
        body++;
    }
    cr_assert_geq(body, 16, "only %d body tensors compared", body);
    cr_assert_not_null(cm_safetensors_find(b, "classifier.weight"));
    cm_safetensors_close(a), cm_safetensors_close(b);
}

Test(cli_hf, bad_models_datasets_and_folders_are_named) {
    expect_fail("train " DIR "/cls.yaml model.task=null", 2, "model.task: required", "sequence_classification");
    expect_fail("train " DIR "/cls.yaml model.task=sequence_clasification", 2, "did you mean 'sequence_classification'",
                NULL);
    expect_fail("train " DIR "/cls.yaml model.pretrained_model_name_or_path=" DIR, 1,
                "model.pretrained_model_name_or_path: '" DIR "' has no config.json", NULL);
    expect_fail("train " DIR "/cls.yaml model.pretrained_model_name_or_path=null", 2,
                "model.pretrained_model_name_or_path: required", NULL);
    expect_fail("train " DIR "/cls.yaml train_loader.dataset.type=text", 2, "text has no labels", "tsv");
    expect_fail("train " DIR "/cls.yaml train_loader.dataset.max_seq_len=64", 2,
                "max_seq_len: 64 is longer than the model's maximum of 32 positions", NULL);
    expect_fail("train " DIR "/cls.yaml model.config_overrides.rotary_dim=8", 1, "field \"rotary_dim\"",
                "with config_overrides");
    expect_fail("train " DIR "/cls.yaml train_loader.dataset.label_column=score", 1, "no column \"score\"", "sub.tsv");
    expect_fail("train " DIR "/cls.yaml train_loader.dataset.mlm_probability=0.2", 2, "mlm_probability", NULL);
    expect_fail("train " DIR "/mlm.yaml tokenizer.name=tests/golden/hf", 1, "tokenizer.name", "has no tokenizer");
    expect_fail("train " DIR "/mlm.yaml model.task=causal_lm", 2, "causal_lm is not implemented", "masked_lm");
    expect_fail("ckpt export --hf " DIR "/nonexistent -o " DIR "/x", 1, DIR "/nonexistent", NULL);
}
