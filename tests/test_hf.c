/* Hugging Face pretrained folders (composer/hf.h) against the plain-torch reference
 * (tests/golden/gen_hf.py, hf_ref.py): the golden BERT MLM, sharded BERT classifier and GPT-2
 * folders give the reference's logits; heads are newly initialised or unused as transformers
 * announces them; load → save → load is identical; our saved folder gives our logits in the
 * reference; bad folders and configs are clear errors, and so is saving a model with ALiBi;
 * tokenizers come from the folder. */
#include "checkpoint/ckpt_impl.h"
#include "cmtest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GOLD "tests/golden/hf_logits.safetensors"
#define D_MLM "tests/golden/hf/bert-mlm"
#define D_CLS "tests/golden/hf/bert-cls"
#define D_GPT "tests/golden/hf/gpt2"

/* f32 sums over 32-266 terms, BLAS vs torch order */
#define ATOL 2e-5
#define RTOL 1e-4

static char *tmpdir(void) {
    char *d = strdup("/tmp/cmhf-XXXXXX");
    cr_assert(mkdtemp(d), "mkdtemp");
    return d;
}

static char *pjoin(const char *a, const char *b) {
    char *p = malloc(strlen(a) + strlen(b) + 2);
    sprintf(p, "%s/%s", a, b);
    return p;
}

/* A copy of a golden folder in a new temporary folder (the caller removes it). */
static char *copy_of(const char *src) {
    char *d = tmpdir();
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cp -r %s/. %s/", src, d);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    return d;
}

static cm_model *load(const char *dir, cm_hf_task task, int64_t num_labels, cm_hf_load_report *rep) {
    cm_hf_load_opts o = cm_hf_load_opts_default();
    o.task = task;
    o.num_labels = num_labels;
    o.seed = 7;
    cm_model *m = NULL;
    cr_assert_eq(cm_hf_load(dir, &o, &m, rep), CM_OK, "%s: %s", dir, cm_last_error());
    cm_module_train(cm_model_module(m), false);
    return m;
}

/* The model's logits for a golden batch ("bert." or "gpt2." inputs). */
static cm_tensor *logits_of(cm_model *m, cmt_golden *g, const char *prefix, cm_tape *tp) {
    const char *names[3] = {"input_ids", "attention_mask", "token_type_ids"};
    cm_tensor *f[3];
    int n = 0;
    for (int i = 0; i < 3; i++) {
        char k[64];
        snprintf(k, sizeof k, "%s.%s", prefix, names[i]);
        if (cmt_golden_has(g, k)) f[n++] = cmt_golden_on_tape(g, tp, k, false);
    }
    cm_model_batch b = {names, f, n, cm_tensor_dim(f[0], 0), 0};
    cm_tensor *out = cm_model_forward(m, tp, &b);
    cr_assert(out, "%s", cm_tape_error(tp));
    return out;
}

static void check_golden(const char *dir, cm_hf_task task, const char *prefix, const char *key) {
    cmt_golden *g = cmt_golden_open(GOLD);
    cm_hf_load_report rep;
    cm_model *m = load(dir, task, 0, &rep);
    cr_assert_eq(rep.n_new + rep.n_unused, 0, "%s: new [%s], unused [%s]", dir, rep.new_names, rep.unused_names);
    cm_tape *tp = cmt_tape();
    cm_tensor *out = logits_of(m, g, prefix, tp), *want = cmt_golden_get(g, key);
    cmt_assert_close(key, out, want, ATOL, RTOL);
    cm_tensor_free(want);
    cm_tape_free(tp);
    cm_model_free(m);
    cmt_golden_close(g);
}

Test(hf, bert_mlm_folder_gives_the_reference_logits) {
    check_golden(D_MLM, CM_HF_TASK_MASKED_LM, "bert", "bert-mlm.logits");
}

Test(hf, sharded_bert_classifier_with_three_labels_gives_the_reference_logits) {
    check_golden(D_CLS, CM_HF_TASK_SEQUENCE_CLASSIFICATION, "bert", "bert-cls.logits");
}

Test(hf, gpt2_folder_gives_the_reference_logits) { check_golden(D_GPT, CM_HF_TASK_CAUSAL_LM, "gpt2", "gpt2.logits"); }

Test(hf, config_fields_are_read) {
    cm_hf_load_report rep;
    cm_model *m = load(D_CLS, CM_HF_TASK_SEQUENCE_CLASSIFICATION, 0, &rep);
    const cm_bert_config *c = cm_bert_model_config(m);
    cr_assert_str_eq(rep.architecture, "BertForSequenceClassification");
    cr_assert_str_eq(rep.model_class, "BertForSequenceClassification");
    cr_assert_eq(c->num_labels, 3, "id2label has 3 entries, num_labels %lld", (long long)c->num_labels);
    cr_assert_eq(c->intermediate_size, 48);
    cr_assert_eq(c->hidden_act, CM_ACT_GELU_TANH);
    cr_assert_eq(c->hidden_size, 32);
    cr_assert_eq(c->max_position_embeddings, 32);
    cr_assert_float_eq(c->layer_norm_eps, 1e-12f, 1e-20);
    cr_assert_float_eq(c->hidden_dropout_prob, 0.1f, 1e-9);
    cr_assert_eq(c->classifier_dropout, -1.0f, "classifier_dropout null reads as -1");
    cm_model_free(m);
    m = load(D_GPT, CM_HF_TASK_CAUSAL_LM, 0, &rep);
    const cm_gpt2_config *g = cm_gpt2_model_config(m);
    cr_assert_eq(g->vocab_size, 266);
    cr_assert_eq(g->n_positions, 32);
    cr_assert_eq(g->n_layer, 2);
    cr_assert_eq(g->n_head, 4);
    cr_assert(g->tie_word_embeddings);
    cr_assert_eq(g->activation, CM_ACT_GELU_TANH);
    cm_model_free(m);
}

/* The classifier head is new when fine-tuning from an MLM folder (announced, as transformers
 * does); the body's weights are the folder's, and the MLM head's weights are unused. */
Test(hf, mlm_folder_for_classification_initialises_the_new_head) {
    cm_hf_load_report rep;
    cm_model *cls = load(D_MLM, CM_HF_TASK_SEQUENCE_CLASSIFICATION, 2, &rep);
    cr_assert_eq(rep.n_new, 4, "new: [%s]", rep.new_names);
    cr_assert_str_eq(rep.new_names, "bert.pooler.dense.weight, bert.pooler.dense.bias, classifier.weight, classifier.bias");
    cr_assert_eq(rep.n_unused, 5, "unused: [%s]", rep.unused_names);
    cr_assert(strstr(rep.unused_names, "cls.predictions.transform.dense.weight"), "%s", rep.unused_names);
    cr_assert(strstr(rep.unused_names, "cls.predictions.bias"), "%s", rep.unused_names);
    cm_model *mlm = load(D_MLM, CM_HF_TASK_MASKED_LM, 0, &rep);
    const char *same[] = {"bert.embeddings.word_embeddings.weight", "bert.encoder.layer.1.output.dense.weight",
                          "bert.encoder.layer.0.attention.self.query.bias"};
    for (int i = 0; i < 3; i++) {
        cm_tensor *a = cm_module_find_param(cm_model_module(cls), same[i]);
        cm_tensor *b = cm_module_find_param(cm_model_module(mlm), same[i]);
        cmt_assert_close(same[i], a, b, 0, 0);
    }
    /* the new classifier is initialised N(0, 0.02), not left at zero */
    cm_tensor *w = cm_module_find_param(cm_model_module(cls), "classifier.weight");
    double ss = 0;
    for (int64_t i = 0; i < cm_tensor_numel(w); i++) ss += cm_tensor_get_flat(w, i) * cm_tensor_get_flat(w, i);
    double sd = sqrt(ss / (double)cm_tensor_numel(w));
    cr_assert(sd > 0.01 && sd < 0.03, "classifier.weight std %g (want about 0.02)", sd);
    cm_model_free(cls);
    cm_model_free(mlm);
}

Test(hf, classifier_folder_for_mlm_initialises_the_mlm_head) {
    cm_hf_load_report rep;
    cm_model *m = load(D_CLS, CM_HF_TASK_MASKED_LM, 0, &rep);
    cr_assert_eq(rep.n_new, 5, "new: [%s]", rep.new_names);
    cr_assert(strstr(rep.new_names, "cls.predictions.bias"), "%s", rep.new_names);
    cr_assert_eq(rep.n_unused, 4, "unused: [%s]", rep.unused_names);
    cr_assert(strstr(rep.unused_names, "bert.pooler.dense.weight") && strstr(rep.unused_names, "classifier.bias"),
              "%s", rep.unused_names);
    cm_model_free(m);
}

Test(hf, pretrained_false_takes_the_config_alone) {
    cm_hf_load_opts o = cm_hf_load_opts_default();
    o.pretrained = false;
    cm_model *m;
    cr_assert_eq(cm_hf_load(D_MLM, &o, &m, NULL), CM_OK, "%s", cm_last_error());
    cm_model *p = load(D_MLM, CM_HF_TASK_MASKED_LM, 0, NULL);
    cm_tensor *a = cm_module_find_param(cm_model_module(m), "bert.encoder.layer.0.intermediate.dense.weight");
    cm_tensor *b = cm_module_find_param(cm_model_module(p), "bert.encoder.layer.0.intermediate.dense.weight");
    int same = 0;
    for (int64_t i = 0; i < cm_tensor_numel(a); i++) same += cm_tensor_get_flat(a, i) == cm_tensor_get_flat(b, i);
    cr_assert_lt(same, 5, "%d of %lld weights equal the folder's: were they loaded?", same, (long long)cm_tensor_numel(a));
    cm_model_free(m);
    cm_model_free(p);
}

Test(hf, config_overrides_replace_fields) {
    cm_hf_load_opts o = cm_hf_load_opts_default();
    o.config_overrides = "{\"hidden_dropout_prob\": 0.0, \"attention_probs_dropout_prob\": 0}";
    cm_model *m;
    cr_assert_eq(cm_hf_load(D_MLM, &o, &m, NULL), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_bert_model_config(m)->hidden_dropout_prob, 0.0f);
    cr_assert_eq(cm_bert_model_config(m)->attention_probs_dropout_prob, 0.0f);
    cm_model_free(m);
    o.config_overrides = "{\"hidden_size\": 64}"; /* the weights no longer fit */
    cr_assert_eq(cm_hf_load(D_MLM, &o, &m, NULL), CM_ERR_SHAPE);
    cr_assert(strstr(cm_last_error(), "has shape (100, 32) in the file but (100, 64) in the model"), "%s", cm_last_error());
    o.config_overrides = "[1]";
    cr_assert_eq(cm_hf_load(D_MLM, &o, &m, NULL), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "config_overrides"), "%s", cm_last_error());
}

/* ---- round trip and the reference reading our folders ---- */

static void params_equal(cm_model *a, cm_model *b) {
    cm_module *ra = cm_model_module(a), *rb = cm_model_module(b);
    cr_assert_eq(cm_module_n_params(ra), cm_module_n_params(rb));
    for (int64_t i = 0; i < cm_module_n_params(ra); i++) {
        cm_param_info pa = cm_module_param_info(ra, i), pb = cm_module_param_info(rb, i);
        cr_assert_str_eq(pa.name, pb.name);
        cr_assert_eq(pa.numel, pb.numel, "%s", pa.name);
        cr_assert(memcmp(cm_tensor_data(pa.tensor), cm_tensor_data(pb.tensor), sizeof(float) * (size_t)pa.numel) == 0,
                  "%s differs after the round trip", pa.name);
    }
}

static void round_trip(const char *src, cm_hf_task task) {
    cm_model *a = load(src, task, 0, NULL);
    cm_tokenizer *tok;
    cm_hf_tokenizer_info ti;
    cr_assert_eq(cm_hf_tokenizer_load(src, &tok, &ti), CM_OK, "%s", cm_last_error());
    char *d = tmpdir();
    cr_assert_eq(cm_hf_save(a, tok, &ti, d), CM_OK, "%s", cm_last_error());
    cm_hf_load_report rep;
    cm_model *b = load(d, task, 0, &rep);
    cr_assert_eq(rep.n_new + rep.n_unused, 0, "new [%s] unused [%s]", rep.new_names, rep.unused_names);
    params_equal(a, b);
    char *ja, *jb;
    cr_assert_eq(cm_hf_config_json(a, -1, &ja), CM_OK);
    cr_assert_eq(cm_hf_config_json(b, -1, &jb), CM_OK);
    cr_assert_str_eq(ja, jb);
    /* the tokenizer comes back the same */
    cm_tokenizer *t2;
    cm_hf_tokenizer_info ti2;
    cr_assert_eq(cm_hf_tokenizer_load(d, &t2, &ti2), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_tokenizer_vocab_size(t2), cm_tokenizer_vocab_size(tok));
    cr_assert_eq(ti2.model_max_length, ti.model_max_length);
    for (int s = 0; s < CM_TOKEN_SPECIAL_COUNT; s++)
        cr_assert_eq(cm_tokenizer_special(t2, s), cm_tokenizer_special(tok, s), "special %d", s);
    const char *text = "The worst movie, the best acting: it was not fun!";
    int32_t *i1, *i2;
    int64_t n1, n2;
    cr_assert_eq(cm_tokenizer_encode(tok, text, strlen(text), &i1, &n1), CM_OK);
    cr_assert_eq(cm_tokenizer_encode(t2, text, strlen(text), &i2, &n2), CM_OK);
    cr_assert_eq(n1, n2);
    cr_assert(memcmp(i1, i2, sizeof(int32_t) * (size_t)n1) == 0, "token ids differ after the round trip");
    cm_free(i1), cm_free(i2), cm_free(ja), cm_free(jb);
    cm_tokenizer_free(tok);
    cm_tokenizer_free(t2);
    cm_model_free(a);
    cm_model_free(b);
    cmi_remove_tree(d);
    free(d);
}

Test(hf, load_save_load_is_identical) {
    round_trip(D_MLM, CM_HF_TASK_MASKED_LM);
    round_trip(D_CLS, CM_HF_TASK_SEQUENCE_CLASSIFICATION);
    round_trip(D_GPT, CM_HF_TASK_CAUSAL_LM);
}

/* A GPT-2 whose attention has ALiBi on is not what its config.json says (transformers' GPT-2 has
 * no ALiBi): cm_hf_save refuses it and writes nothing; with ALiBi off again it saves. */
Test(hf, save_refuses_a_model_with_alibi) {
    cm_model *m = load(D_GPT, CM_HF_TASK_CAUSAL_LM, 0, NULL);
    cm_module *attn = cm_module_find(cm_model_module(m), "transformer.h.1.attn");
    cr_assert_not_null(attn, "%s", cm_last_error());
    cr_assert_eq(cm_nn_attention_set_alibi(attn, true), CM_OK, "%s", cm_last_error());
    char *d = tmpdir(), *p = pjoin(d, "config.json");
    cr_assert_eq(cm_hf_save(m, NULL, NULL, d), CM_ERR_UNSUPPORTED);
    cr_assert(strstr(cm_last_error(), "GPT2LMHeadModel cannot be written as a pretrained folder: its attention at "
                                      "'transformer.h.1.attn' uses ALiBi"),
              "%s", cm_last_error());
    cr_assert_not(cmt_exists(p), "a refused save wrote config.json");
    cr_assert_eq(cm_nn_attention_set_alibi(attn, false), CM_OK);
    cr_assert_eq(cm_hf_save(m, NULL, NULL, d), CM_OK, "%s", cm_last_error());
    cr_assert(cmt_exists(p));
    cmi_remove_tree(d);
    free(p), free(d);
    cm_model_free(m);
}

Test(hf, saved_mlm_folder_stores_tied_weights_once_as_save_pretrained_does) {
    cm_model *m = load(D_MLM, CM_HF_TASK_MASKED_LM, 0, NULL);
    char *d = tmpdir();
    cr_assert_eq(cm_hf_save(m, NULL, NULL, d), CM_OK, "%s", cm_last_error());
    char *p = pjoin(d, "model.safetensors");
    cm_safetensors *st;
    cr_assert_eq(cm_safetensors_open(p, &st), CM_OK, "%s", cm_last_error());
    cr_assert(cm_safetensors_find(st, "bert.embeddings.word_embeddings.weight"));
    cr_assert(cm_safetensors_find(st, "cls.predictions.bias"));
    cr_assert_null(cm_safetensors_find(st, "cls.predictions.decoder.weight"), "the tied decoder weight is stored once");
    cr_assert_null(cm_safetensors_find(st, "cls.predictions.decoder.bias"));
    cr_assert_str_eq(cm_safetensors_metadata_get(st, "format"), "pt");
    cm_safetensors_close(st);
    free(p);
    p = pjoin(d, "config.json");
    FILE *f = fopen(p, "r");
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    cr_assert(strstr(buf, "\"BertForMaskedLM\"") && strstr(buf, "\"layer_norm_eps\":\t1e-12") &&
                  strstr(buf, "\"hidden_dropout_prob\":\t0.1,"),
              "%s", buf);
    free(p);
    cm_model_free(m);
    cmi_remove_tree(d);
    free(d);
}

static bool have_torch(void) {
    /* find_spec looks torch up without importing it (the import alone takes seconds) */
    return access("/usr/bin/python3", X_OK) == 0 &&
           system("/usr/bin/python3 -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec(\"torch\") is None)'"
                  " 2>/dev/null") == 0;
}

/* Our folder, with every weight moved away from the golden one, and the logits we compute for
 * it: dir/model (the folder) and dir/expected.safetensors. */
static void save_with_logits(const char *src, cm_hf_task task, const char *prefix, const char *dir) {
    cmt_golden *g = cmt_golden_open(GOLD);
    cm_model *m = load(src, task, task == CM_HF_TASK_SEQUENCE_CLASSIFICATION ? 2 : 0, NULL);
    cm_module *root = cm_model_module(m);
    cm_rng rng = cm_rng_init(99, 0);
    for (int64_t i = 0; i < cm_module_n_params(root); i++) {
        cm_param_info pi = cm_module_param_info(root, i);
        float *d = cm_tensor_data(pi.tensor), noise[4096];
        for (int64_t k = 0; k < pi.numel; k += 4096) {
            size_t c = (size_t)(pi.numel - k < 4096 ? pi.numel - k : 4096);
            cm_rng_normal(&rng, noise, c, 0.0f, 0.05f);
            for (size_t j = 0; j < c; j++) d[k + (int64_t)j] += noise[j];
        }
    }
    cm_tape *tp = cmt_tape();
    cm_tensor *out = logits_of(m, g, prefix, tp);
    char *folder = pjoin(dir, "model");
    cm_tokenizer *tok;
    cm_hf_tokenizer_info ti;
    cr_assert_eq(cm_hf_tokenizer_load(src, &tok, &ti), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_hf_save(m, tok, &ti, folder), CM_OK, "%s", cm_last_error());
    /* a sentence's ids (no special tokens), for a check of the saved tokenizer files elsewhere */
    static const char sentence[] = "Hello world, the model loads: unaffable tokenizers!";
    int32_t *ids;
    int64_t n_ids;
    cr_assert_eq(cm_tokenizer_encode(tok, sentence, sizeof sentence - 1, &ids, &n_ids), CM_OK, "%s", cm_last_error());
    cm_tensor *sent;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_I64, 1, &n_ids, &sent), CM_OK);
    for (int64_t i = 0; i < n_ids; i++) ((int64_t *)cm_tensor_data(sent))[i] = ids[i];
    cm_free(ids);
    cm_tokenizer_free(tok);
    cm_safetensors_writer *w;
    cr_assert_eq(cm_safetensors_writer_new(&w), CM_OK);
    cr_assert_eq(cm_safetensors_writer_add(w, "sentence_ids", sent), CM_OK);
    const char *names[3] = {"input_ids", "attention_mask", "token_type_ids"};
    cm_tensor *keep[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) {
        char k[64];
        snprintf(k, sizeof k, "%s.%s", prefix, names[i]);
        if (!cmt_golden_has(g, k)) continue;
        keep[i] = cmt_golden_get(g, k);
        cr_assert_eq(cm_safetensors_writer_add(w, names[i], keep[i]), CM_OK);
    }
    cr_assert_eq(cm_safetensors_writer_add(w, "logits", out), CM_OK);
    char *exp = pjoin(dir, "expected.safetensors");
    cr_assert_eq(cm_safetensors_writer_write(w, exp), CM_OK, "%s", cm_last_error());
    cm_safetensors_writer_free(w);
    cm_tensor_free(sent);
    for (int i = 0; i < 3; i++) cm_tensor_free(keep[i]);
    free(exp);
    free(folder);
    cm_tape_free(tp);
    cm_model_free(m);
    cmt_golden_close(g);
}

/* The torch reference (strict about names: a wrong or missing name fails there) gives our logits
 * for our saved folders: BERT MLM, a BERT classifier with a new head, GPT-2. With CM_HF_KEEP_DIR
 * set, the three folders and their logits are also left in that folder (bert-mlm/, bert-cls/,
 * gpt2/), for the check with Hugging Face's own transformers where it is installed
 * (tests/hf_transformers_check.py; scripts/gpu-bundle carries them to the lent GPU machine). */
Test(hf, reference_gives_our_logits_for_our_saved_folders) {
    if (!have_torch()) cr_skip_test("/usr/bin/python3 with torch is not available (scripts/install-deps --golden)");
    const char *keep = getenv("CM_HF_KEEP_DIR");
    if (keep && !*keep) keep = NULL;
    static const char *const kept[3] = {"bert-mlm", "bert-cls", "gpt2"};
    char *d[3];
    for (int i = 0; i < 3; i++) {
        if (!keep) {
            d[i] = tmpdir();
            continue;
        }
        d[i] = pjoin(keep, kept[i]);
        cmi_remove_tree(d[i]);
        cr_assert_eq(cmi_mkdirs(d[i]), CM_OK, "%s", cm_last_error());
    }
    save_with_logits(D_MLM, CM_HF_TASK_MASKED_LM, "bert", d[0]);
    save_with_logits(D_MLM, CM_HF_TASK_SEQUENCE_CLASSIFICATION, "bert", d[1]);
    save_with_logits(D_GPT, CM_HF_TASK_CAUSAL_LM, "gpt2", d[2]);
    char cmd[4096];
    int n = snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/hf_ref_check.py");
    for (int i = 0; i < 3; i++)
        n += snprintf(cmd + n, sizeof cmd - (size_t)n, " %s/model %s/expected.safetensors", d[i], d[i]);
    int rc = system(cmd);
    cr_expect_eq(rc, 0, "%s failed (status %d)", cmd, rc);
    for (int i = 0; i < 3; i++) {
        if (!keep) cmi_remove_tree(d[i]);
        free(d[i]);
    }
}

/* ---- bad folders ---- */

static void expect_load_error(const char *dir, cm_hf_task task, cm_status want, const char *s1, const char *s2) {
    cm_hf_load_opts o = cm_hf_load_opts_default();
    o.task = task;
    cm_model *m = (cm_model *)1;
    cm_status st = cm_hf_load(dir, &o, &m, NULL);
    cr_assert_eq(st, want, "%s: status %d (want %d): %s", dir, st, want, cm_last_error());
    cr_assert_null(m, "*out is NULL on error");
    cr_assert(strstr(cm_last_error(), s1), "'%s' not in: %s", s1, cm_last_error());
    if (s2) cr_assert(strstr(cm_last_error(), s2), "'%s' not in: %s", s2, cm_last_error());
}

Test(hf, missing_folder_or_config_is_named) {
    expect_load_error("/nonexistent/bert", CM_HF_TASK_MASKED_LM, CM_ERR_NOT_FOUND, "/nonexistent/bert", "does not exist");
    char *d = copy_of(D_MLM);
    char *p = pjoin(d, "config.json");
    unlink(p);
    expect_load_error(d, CM_HF_TASK_MASKED_LM, CM_ERR_NOT_FOUND, "has no config.json", d);
    cmt_write_text(p, "{\"model_type\": \"bert\", \"hidden_size\": 32");
    expect_load_error(d, CM_HF_TASK_MASKED_LM, CM_ERR_FORMAT, "config.json", "not a JSON object");
    free(p);
    cmi_remove_tree(d);
    free(d);
}

Test(hf, unknown_architecture_field_or_value_is_named) {
    char *d = copy_of(D_MLM);
    char *p = pjoin(d, "config.json");
    cmt_write_text(p, "{\"architectures\": [\"RobertaForMaskedLM\"], \"model_type\": \"roberta\", \"vocab_size\": 100}");
    expect_load_error(d, CM_HF_TASK_MASKED_LM, CM_ERR_UNSUPPORTED, "model_type \"roberta\"", "RobertaForMaskedLM");
    cmt_write_text(p, "{\"architectures\": [\"BertForCausalLMish\"], \"model_type\": \"bert\"}");
    expect_load_error(d, CM_HF_TASK_MASKED_LM, CM_ERR_UNSUPPORTED, "architecture \"BertForCausalLMish\"", "BertForMaskedLM");
    cmt_write_text(p, "{\"model_type\": \"bert\", \"hidden_size\": 32, \"num_attention_heads\": 4, \"vocab_size\": 100,"
                  " \"max_position_embeddings\": 32, \"intermediate_size\": 64, \"num_hidden_layers\": 2,"
                  " \"rotary_dim\": 8}");
    expect_load_error(d, CM_HF_TASK_MASKED_LM, CM_ERR_UNSUPPORTED, "field \"rotary_dim\"", "not a BertConfig field");
    cmt_write_text(p, "{\"model_type\": \"bert\", \"position_embedding_type\": \"relative_key\"}");
    expect_load_error(d, CM_HF_TASK_MASKED_LM, CM_ERR_UNSUPPORTED, "position_embedding_type", "relative");
    cmt_write_text(p, "{\"model_type\": \"bert\", \"hidden_act\": \"quick_gelu\"}");
    expect_load_error(d, CM_HF_TASK_MASKED_LM, CM_ERR_UNSUPPORTED, "hidden_act", "quick_gelu");
    cmt_write_text(p, "{\"model_type\": \"bert\", \"is_decoder\": true}");
    expect_load_error(d, CM_HF_TASK_MASKED_LM, CM_ERR_UNSUPPORTED, "is_decoder", NULL);
    cmt_write_text(p, "{\"model_type\": \"bert\", \"pruned_heads\": {\"0\": [1]}}");
    expect_load_error(d, CM_HF_TASK_MASKED_LM, CM_ERR_UNSUPPORTED, "pruned_heads", "pruned heads");
    cmt_write_text(p, "{\"model_type\": \"bert\", \"cross_attention_hidden_size\": 64}");
    expect_load_error(d, CM_HF_TASK_MASKED_LM, CM_ERR_UNSUPPORTED, "cross_attention_hidden_size", "cross-attention");
    cmt_write_text(p, "{\"model_type\": \"bert\", \"hidden_size\": \"big\"}");
    expect_load_error(d, CM_HF_TASK_MASKED_LM, CM_ERR_FORMAT, "hidden_size", "integer");
    cmt_write_text(p, "{\"model_type\": \"bert\", \"hidden_size\": 30, \"num_attention_heads\": 4}");
    expect_load_error(d, CM_HF_TASK_MASKED_LM, CM_ERR_FORMAT, "hidden_size 30 is not a multiple of num_attention_heads", p);
    cmt_write_text(p, "{\"model_type\": \"bert\", \"problem_type\": \"multi_label_classification\"}");
    expect_load_error(d, CM_HF_TASK_SEQUENCE_CLASSIFICATION, CM_ERR_UNSUPPORTED, "problem_type", "multi-label");
    free(p);
    cmi_remove_tree(d);
    free(d);
    /* the wrong family for the task */
    expect_load_error(D_MLM, CM_HF_TASK_CAUSAL_LM, CM_ERR_INVALID_ARG, "causal_lm", "masked_lm");
    expect_load_error(D_GPT, CM_HF_TASK_MASKED_LM, CM_ERR_INVALID_ARG, "GPT-2", "causal_lm");
    /* GPT-2 fields */
    d = copy_of(D_GPT);
    p = pjoin(d, "config.json");
    cmt_write_text(p, "{\"model_type\": \"gpt2\", \"n_embd\": 32, \"n_head\": 4, \"n_inner\": 64}");
    expect_load_error(d, CM_HF_TASK_CAUSAL_LM, CM_ERR_UNSUPPORTED, "n_inner", "4 * n_embd");
    cmt_write_text(p, "{\"model_type\": \"gpt2\", \"scale_attn_by_inverse_layer_idx\": true}");
    expect_load_error(d, CM_HF_TASK_CAUSAL_LM, CM_ERR_UNSUPPORTED, "scale_attn_by_inverse_layer_idx", NULL);
    free(p);
    cmi_remove_tree(d);
    free(d);
}

/* Rewrites dir/model.safetensors from the golden MLM file, less `drop` and plus `extra`. */
static void rewrite_weights(const char *dir, const char *drop, const char *extra) {
    char *p = pjoin(dir, "model.safetensors");
    cm_safetensors *st;
    cr_assert_eq(cm_safetensors_open(D_MLM "/model.safetensors", &st), CM_OK);
    cm_safetensors_writer *w;
    cr_assert_eq(cm_safetensors_writer_new(&w), CM_OK);
    cm_tensor *ts[64];
    int n = 0;
    for (size_t i = 0; i < cm_safetensors_count(st); i++) {
        const char *name = cm_safetensors_at(st, i)->name;
        if (drop && !strcmp(name, drop)) continue;
        cr_assert_eq(cm_safetensors_load(st, name, CM_DTYPE_F32, &ts[n]), CM_OK);
        cr_assert_eq(cm_safetensors_writer_add(w, name, ts[n]), CM_OK);
        n++;
    }
    if (extra) {
        int64_t s = 3;
        cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 1, &s, &ts[n]), CM_OK);
        cr_assert_eq(cm_safetensors_writer_add(w, extra, ts[n]), CM_OK);
        n++;
    }
    cr_assert_eq(cm_safetensors_writer_write(w, p), CM_OK, "%s", cm_last_error());
    cm_safetensors_writer_free(w);
    for (int i = 0; i < n; i++) cm_tensor_free(ts[i]);
    cm_safetensors_close(st);
    free(p);
}

Test(hf, missing_unexpected_or_misshapen_weights_are_listed) {
    char *d = copy_of(D_MLM);
    rewrite_weights(d, "bert.encoder.layer.1.attention.self.key.weight", NULL);
    expect_load_error(d, CM_HF_TASK_MASKED_LM, CM_ERR_NOT_FOUND, "1 missing and 0 unexpected",
                      "bert.encoder.layer.1.attention.self.key.weight");
    rewrite_weights(d, NULL, "bert.encoder.layer.0.adapter.weight");
    expect_load_error(d, CM_HF_TASK_MASKED_LM, CM_ERR_NOT_FOUND, "0 missing and 1 unexpected",
                      "bert.encoder.layer.0.adapter.weight");
    /* config.json says 3 layers: layer 2's weights are missing */
    char *p = pjoin(d, "config.json");
    rewrite_weights(d, NULL, NULL);
    cm_hf_load_opts o = cm_hf_load_opts_default();
    o.config_overrides = "{\"num_hidden_layers\": 3}";
    cm_model *m;
    cr_assert_eq(cm_hf_load(d, &o, &m, NULL), CM_ERR_NOT_FOUND);
    cr_assert(strstr(cm_last_error(), "bert.encoder.layer.2.attention.self.query.weight"), "%s", cm_last_error());
    /* config.json's vocabulary disagrees with the weights */
    o.config_overrides = "{\"vocab_size\": 120}";
    cr_assert_eq(cm_hf_load(d, &o, &m, NULL), CM_ERR_SHAPE);
    cr_assert(strstr(cm_last_error(), "bert.embeddings.word_embeddings.weight") &&
                  strstr(cm_last_error(), "(100, 32) in the file but (120, 32)"),
              "%s", cm_last_error());
    free(p);
    cmi_remove_tree(d);
    free(d);
}

Test(hf, truncated_or_missing_weights_are_clear_errors) {
    char *d = copy_of(D_MLM);
    char *p = pjoin(d, "model.safetensors");
    cr_assert_eq(truncate(p, 50000), 0);
    expect_load_error(d, CM_HF_TASK_MASKED_LM, CM_ERR_FORMAT, "model.safetensors", NULL);
    unlink(p);
    expect_load_error(d, CM_HF_TASK_MASKED_LM, CM_ERR_NOT_FOUND, "no weights", "pretrained: false");
    char *bin = pjoin(d, "pytorch_model.bin");
    cmt_write_text(bin, "not really");
    expect_load_error(d, CM_HF_TASK_MASKED_LM, CM_ERR_NOT_FOUND, "pytorch_model.bin", "safetensors");
    free(bin);
    free(p);
    cmi_remove_tree(d);
    free(d);
    /* a shard listed in the index is missing */
    d = copy_of(D_CLS);
    p = pjoin(d, "model-00002-of-00002.safetensors");
    unlink(p);
    expect_load_error(d, CM_HF_TASK_SEQUENCE_CLASSIFICATION, CM_ERR_IO, "model-00002-of-00002.safetensors", NULL);
    free(p);
    cmi_remove_tree(d);
    free(d);
}

/* ---- tokenizers ---- */

static void encode(const cm_tokenizer *t, const char *text, int32_t *ids, int64_t *n) {
    cr_assert_eq(cm_tokenizer_encode_into(t, text, strlen(text), ids, 64, n), CM_OK, "%s", cm_last_error());
}

Test(hf, wordpiece_from_vocab_txt_and_from_tokenizer_json_agree) {
    cm_tokenizer *a, *b;
    cm_hf_tokenizer_info ia, ib;
    cr_assert_eq(cm_hf_tokenizer_load(D_MLM, &a, &ia), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_hf_tokenizer_load(D_CLS, &b, &ib), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_tokenizer_get_type(a), CM_TOKENIZER_WORDPIECE);
    cr_assert_eq(cm_tokenizer_get_type(b), CM_TOKENIZER_WORDPIECE);
    cr_assert_str_eq(ia.tokenizer_class, "BertTokenizer");
    cr_assert_str_eq(ib.tokenizer_class, "BertTokenizerFast");
    cr_assert_eq(ia.model_max_length, 32);
    cr_assert(ia.do_lower_case && ib.do_lower_case);
    cr_assert_eq(cm_tokenizer_special(a, CM_TOKEN_CLS), 3);
    cr_assert_eq(cm_tokenizer_special(a, CM_TOKEN_MASK), 5);
    cr_assert_eq(cm_tokenizer_special(b, CM_TOKEN_UNK), 2);
    int32_t x[64], y[64];
    int64_t nx, ny;
    encode(a, "The Movie was GOOD, not dull!", x, &nx);
    encode(b, "The Movie was GOOD, not dull!", y, &ny);
    cr_assert_eq(nx, 8, "%lld tokens", (long long)nx);
    cr_assert_eq(nx, ny);
    cr_assert(memcmp(x, y, sizeof(int32_t) * (size_t)nx) == 0);
    cm_tokenizer_free(a);
    cm_tokenizer_free(b);
}

Test(hf, tokenizer_config_is_honoured) {
    char *d = copy_of(D_MLM);
    char *p = pjoin(d, "tokenizer_config.json");
    cmt_write_text(p, "{\"do_lower_case\": false, \"strip_accents\": null, \"model_max_length\": 1e30,"
                  " \"cls_token\": {\"content\": \"[unused1]\", \"special\": true}}");
    cm_tokenizer *t;
    cm_hf_tokenizer_info ti;
    cr_assert_eq(cm_hf_tokenizer_load(d, &t, &ti), CM_OK, "%s", cm_last_error());
    cr_assert_not(ti.do_lower_case);
    cr_assert_eq(ti.model_max_length, -1, "1e30 is transformers' no limit");
    cr_assert_eq(cm_tokenizer_special(t, CM_TOKEN_CLS), cm_tokenizer_token_id(t, "[unused1]", 9));
    int32_t ids[64];
    int64_t n;
    encode(t, "GOOD", ids, &n);
    cr_assert_eq(ids[0], cm_tokenizer_token_id(t, "[UNK]", 5), "cased: 'GOOD' is not in the uncased vocabulary");
    cm_tokenizer_free(t);
    /* settings we do not implement, and special tokens outside the vocabulary */
    cmt_write_text(p, "{\"do_lower_case\": true, \"strip_accents\": false}");
    cr_assert_eq(cm_hf_tokenizer_load(d, &t, NULL), CM_ERR_UNSUPPORTED);
    cr_assert(strstr(cm_last_error(), "strip_accents"), "%s", cm_last_error());
    cmt_write_text(p, "{\"tokenize_chinese_chars\": false}");
    cr_assert_eq(cm_hf_tokenizer_load(d, &t, NULL), CM_ERR_UNSUPPORTED);
    cmt_write_text(p, "{\"mask_token\": \"<mask>\"}");
    cr_assert_eq(cm_hf_tokenizer_load(d, &t, NULL), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "mask_token \"<mask>\"") && strstr(cm_last_error(), "not in the vocabulary"), "%s",
              cm_last_error());
    unlink(p);
    char *v = pjoin(d, "vocab.txt");
    unlink(v);
    cr_assert_eq(cm_hf_tokenizer_load(d, &t, NULL), CM_ERR_NOT_FOUND);
    cr_assert(strstr(cm_last_error(), "vocab.txt") && strstr(cm_last_error(), "tokenizer.json"), "%s", cm_last_error());
    free(v);
    free(p);
    cmi_remove_tree(d);
    free(d);
}

Test(hf, gpt2_bpe_from_vocab_json_and_from_tokenizer_json_agree) {
    cm_tokenizer *a, *b;
    cr_assert_eq(cm_hf_tokenizer_load(D_GPT, &a, NULL), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_tokenizer_get_type(a), CM_TOKENIZER_GPT2);
    cr_assert_eq(cm_tokenizer_vocab_size(a), 266);
    cr_assert_eq(cm_tokenizer_special(a, CM_TOKEN_EOT), 265);
    /* the same vocabulary and merges as a fast tokenizer.json (merges in the newer pair form) */
    char *d = tmpdir();
    cm_hf_file *f;
    int n;
    cr_assert_eq(cm_hf_tokenizer_files(a, 32, &f, &n), CM_OK, "%s", cm_last_error());
    cr_assert_eq(n, 4);
    cr_assert_str_eq(f[0].name, "vocab.json");
    cr_assert_str_eq(f[1].name, "merges.txt");
    cr_assert(strstr(f[1].data, "#version: 0.2\nĠ t\nh e\nĠt he\n"), "%s", f[1].data);
    char *tj = malloc(f[0].len + 4096);
    sprintf(tj,
            "{\"version\": \"1.0\", \"added_tokens\": [{\"id\": 265, \"content\": \"<|endoftext|>\", \"special\": true}],"
            " \"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false,"
            " \"trim_offsets\": true, \"use_regex\": true}, \"model\": {\"type\": \"BPE\", \"dropout\": null,"
            " \"unk_token\": null, \"continuing_subword_prefix\": \"\", \"end_of_word_suffix\": \"\","
            " \"fuse_unk\": false, \"byte_fallback\": false, \"vocab\": %s, \"merges\": [[\"Ġ\", \"t\"], [\"h\", \"e\"],"
            " [\"Ġt\", \"he\"], [\"Ġ\", \"a\"], [\"i\", \"n\"], [\"Ġ\", \"s\"], [\"e\", \"r\"], [\"o\", \"n\"],"
            " [\"Ġ\", \"w\"]]}}",
            f[0].data);
    char *p = pjoin(d, "tokenizer.json");
    cmt_write_text(p, tj);
    cr_assert_eq(cm_hf_tokenizer_load(d, &b, NULL), CM_OK, "%s", cm_last_error());
    int32_t x[64], y[64];
    int64_t nx, ny;
    encode(a, "the the heat is in the winter", x, &nx);
    encode(b, "the the heat is in the winter", y, &ny);
    cr_assert_eq(nx, ny);
    cr_assert(memcmp(x, y, sizeof(int32_t) * (size_t)nx) == 0);
    cr_assert_eq(x[0], 't', "'the' starts the text without a space: bytes t, he");
    cr_assert_eq(x[2], 258, "' the' is one merged token (Ġthe, id 258), got %d", x[2]);
    cm_tokenizer_free(b);
    /* settings we do not implement */
    char *bad = malloc(strlen(tj) + 16);
    strcpy(bad, tj);
    char *ap = strstr(bad, "\"add_prefix_space\": false");
    memcpy(ap, "\"add_prefix_space\": true ", 25);
    cmt_write_text(p, bad);
    cr_assert_eq(cm_hf_tokenizer_load(d, &b, NULL), CM_ERR_UNSUPPORTED);
    cr_assert(strstr(cm_last_error(), "add_prefix_space"), "%s", cm_last_error());
    /* an added token's id that no integer holds (a fuzzer's find: converting it was undefined) */
    strcpy(bad, tj);
    char *id = strstr(bad, "\"id\": 265");
    memcpy(id, "\"id\":1e99", 9);
    cmt_write_text(p, bad);
    cr_assert_eq(cm_hf_tokenizer_load(d, &b, NULL), CM_ERR_UNSUPPORTED);
    cr_assert(strstr(cm_last_error(), "added token \"<|endoftext|>\" (id 1e+99)"), "%s", cm_last_error());
    cmt_write_text(p, "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}");
    cr_assert_eq(cm_hf_tokenizer_load(d, &b, NULL), CM_ERR_UNSUPPORTED);
    cr_assert(strstr(cm_last_error(), "Unigram"), "%s", cm_last_error());
    free(bad);
    free(tj);
    free(p);
    cm_hf_files_free(f, n);
    cm_tokenizer_free(a);
    cmi_remove_tree(d);
    free(d);
}
