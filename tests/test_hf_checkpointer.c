/* The HuggingFaceCheckpointer with the trainer: pretrained folders written at its interval and at
 * the end (not twice for one batch), its state in every checkpoint, and cm_hf_export_checkpoint
 * writing the same folder from a checkpoint — and refusing checkpoints without that state. */
#include "checkpoint/ckpt_impl.h"
#include "cmtest.h"
#include "cmtrain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MLM "tests/golden/hf/bert-mlm"

static char *tmpdir(void) {
    char *d = strdup("/tmp/cmhfck-XXXXXX");
    cr_assert(mkdtemp(d), "mkdtemp");
    return d;
}

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static float *folder_params(const char *dir, int64_t *n) {
    cm_hf_load_opts o = cm_hf_load_opts_default();
    cm_model *m;
    cr_assert_eq(cm_hf_load(dir, &o, &m, NULL), CM_OK, "%s: %s", dir, cm_last_error());
    float *p = cmt_params_copy(m, n);
    cm_model_free(m);
    return p;
}

Test(hf_checkpointer, writes_folders_at_its_interval_and_exports_checkpoints) {
    char *d = tmpdir(), path[1024];
    /* a masked-LM run of 5 batches over a few lines of text, from the golden folder */
    snprintf(path, sizeof path, "%s/text.txt", d);
    FILE *f = fopen(path, "w");
    for (int i = 0; i < 40; i++) fprintf(f, "the movie was %s and the plot was %s\n", i % 2 ? "good" : "bad", i % 3 ? "fun" : "dull");
    fclose(f);
    cm_tokenizer *tok;
    cm_hf_tokenizer_info ti;
    cr_assert_eq(cm_hf_tokenizer_load(MLM, &tok, &ti), CM_OK, "%s", cm_last_error());
    cm_model *model;
    cm_hf_load_opts o = cm_hf_load_opts_default();
    cr_assert_eq(cm_hf_load(MLM, &o, &model, NULL), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_bert_mlm_sparse_logits(model, true), CM_OK);
    cm_text_config tc = cm_text_config_default();
    tc.max_len = 16;
    const char *paths[1] = {path};
    cm_dataset *text, *ds;
    cr_assert_eq(cm_dataset_text_new(paths, 1, tok, &tc, &text), CM_OK, "%s", cm_last_error());
    cm_bert_mlm_mask_config mc;
    cr_assert_eq(cm_bert_mlm_mask_config_from_tokenizer(tok, 0, &mc), CM_OK);
    cr_assert_eq(cm_bert_mlm_dataset_new(text, &mc, &ds), CM_OK, "%s", cm_last_error());
    cm_dataloader *dl = cmt_loader(ds, 4, false, 1);

    cm_callback_plugin cb;
    cm_hf_checkpointer_config hc = cm_hf_checkpointer_config_default();
    char hfdir[256], ckdir[256];
    snprintf(hfdir, sizeof hfdir, "%s/hf", d);
    snprintf(ckdir, sizeof ckdir, "%s/ckpt", d);
    hc.model = model, hc.tokenizer = tok, hc.model_max_length = ti.model_max_length;
    hc.save_folder = hfdir;
    hc.save_interval = cm_time_make(2, CM_TIME_BATCH);
    cr_assert_eq(cm_hf_checkpointer_new(&hc, &cb), CM_OK, "%s", cm_last_error());
    cm_trainer_config c = cm_trainer_config_default();
    c.model = model, c.train_dataloader = dl; /* the default optimizer: DecoupledSGDW(lr 0.1) */
    c.max_duration = cm_time_make(5, CM_TIME_BATCH);
    c.callbacks = &cb, c.n_callbacks = 1;
    c.save_folder = ckdir;
    c.save_interval = cm_time_make(2, CM_TIME_BATCH);
    c.progress_bar = false;
    cm_trainer *tr;
    cr_assert_eq(cm_trainer_new(&c, &tr), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_fit(tr, NULL), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_close(tr), CM_OK, "%s", cm_last_error());
    const char *want[3] = {"ba2", "ba4", "ba5"}, *not_want[2] = {"ba1", "ba3"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/huggingface/%s", hfdir, want[i]);
        cr_assert(is_dir(path), "%s was not written", path);
    }
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/huggingface/%s", hfdir, not_want[i]);
        cr_assert_not(is_dir(path), "%s was written off the interval", path);
    }
    /* the last folder holds the trained weights */
    int64_t n, n2;
    float *now = cmt_params_copy(model, &n);
    snprintf(path, sizeof path, "%s/huggingface/ba5", hfdir);
    float *ba5 = folder_params(path, &n2);
    cr_assert_eq(n, n2);
    cr_assert(memcmp(now, ba5, sizeof(float) * (size_t)n) == 0, "ba5 is not the model at the end");
    /* the checkpoint of batch 4 exports as the folder written at batch 4 */
    char ck4[512], out[512];
    snprintf(ck4, sizeof ck4, "%s/ep0-ba4", ckdir);
    snprintf(out, sizeof out, "%s/exported", d);
    cr_assert_eq(cm_hf_export_checkpoint(ck4, out), CM_OK, "%s", cm_last_error());
    snprintf(path, sizeof path, "%s/huggingface/ba4", hfdir);
    float *a = folder_params(path, &n), *b = folder_params(out, &n2);
    cr_assert_eq(n, n2);
    cr_assert(memcmp(a, b, sizeof(float) * (size_t)n) == 0, "export of ep0-ba4 differs from the folder of ba4");
    int differ = 0;
    for (int64_t i = 0; i < n; i++) differ += a[i] != ba5[i];
    cr_assert_gt(differ, 100, "batch 4 and batch 5 weights are the same: is anything training?");
    snprintf(path, sizeof path, "%s/vocab.txt", out);
    cr_assert(access(path, F_OK) == 0, "the tokenizer was not exported");
    free(a), free(b), free(now), free(ba5);
    cm_trainer_free(tr);
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
    cm_model_free(model);
    cm_tokenizer_free(tok);
    cmi_remove_tree(d);
    free(d);
}

Test(hf_checkpointer, export_refuses_a_checkpoint_without_a_pretrained_folder_behind_it) {
    char *d = tmpdir(), ck[512], out[512];
    cm_dataset *ds = cmt_synth_dataset(64, 8, 3, false, NULL);
    cm_dataloader *dl = cmt_loader(ds, 8, false, 1);
    cm_model *m = cmt_mlp(8, 16, 3, 0.0f, 1);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = m, c.train_dataloader = dl;
    c.max_duration = cm_time_make(2, CM_TIME_BATCH);
    snprintf(ck, sizeof ck, "%s/ckpt", d);
    c.save_folder = ck;
    c.save_interval = cm_time_make(2, CM_TIME_BATCH);
    c.progress_bar = false;
    cm_trainer *tr;
    cr_assert_eq(cm_trainer_new(&c, &tr), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_fit(tr, NULL), CM_OK, "%s", cm_last_error());
    cm_trainer_free(tr);
    snprintf(out, sizeof out, "%s/hf", d);
    cr_assert_eq(cm_hf_export_checkpoint(ck, out), CM_ERR_NOT_FOUND);
    cr_assert(strstr(cm_last_error(), "no HuggingFaceCheckpointer state") &&
                  strstr(cm_last_error(), "composer ckpt export -o model.safetensors"),
              "%s", cm_last_error());
    cr_assert_not(is_dir(out), "a failed export left %s", out);
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
    cm_model_free(m);
    cmi_remove_tree(d);
    free(d);
}

Test(hf_checkpointer, bad_settings_are_named) {
    cm_callback_plugin cb;
    cm_hf_checkpointer_config hc = cm_hf_checkpointer_config_default();
    cr_assert_eq(cm_hf_checkpointer_new(&hc, &cb), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "BERT or GPT-2"), "%s", cm_last_error());
    cm_model *m;
    cr_assert_eq(cm_hf_load(MLM, NULL, &m, NULL), CM_OK, "%s", cm_last_error());
    hc.model = m;
    hc.save_folder = "/tmp/unused";
    hc.save_interval = cm_time_make(10, CM_TIME_SECOND);
    cr_assert_eq(cm_hf_checkpointer_new(&hc, &cb), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "save_interval"), "%s", cm_last_error());
    hc.save_interval = cm_time_make(1, CM_TIME_EPOCH);
    hc.huggingface_folder_name = "ba{nope}";
    cr_assert_eq(cm_hf_checkpointer_new(&hc, &cb), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "huggingface_folder_name 'ba{nope}'"), "%s", cm_last_error());
    cm_model_free(m);
}
