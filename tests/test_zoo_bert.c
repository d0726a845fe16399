/* The BERT zoo models: configs and presets, parameter counts and Hugging Face names, the padding
 * mask, gradients through the loss, weights in and out (strictness, Hugging Face's conventions),
 * the model interface (fields, metrics, FLOPs) and MLM masking. PyTorch goldens are in
 * test_golden_bert.c. */
#include "cmtest.h"

#include <composer/zoo_bert.h>

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* A very small BERT for the unit tests: vocab 20, hidden 8, 2 heads, 1 layer. */
static cm_bert_config small(void) {
    cm_bert_config c;
    cr_assert_eq(cm_bert_config_preset("test-tiny", &c), CM_OK);
    c.vocab_size = 20, c.hidden_size = 8, c.num_attention_heads = 2, c.num_hidden_layers = 1;
    c.intermediate_size = 16, c.max_position_embeddings = 12, c.num_labels = 3;
    c.hidden_dropout_prob = c.attention_probs_dropout_prob = 0.0f;
    return c;
}

static cm_model *make(bool mlm, const cm_bert_config *c, uint64_t seed) {
    cm_rng rng = cm_rng_init(seed, 0);
    cm_model *m;
    cm_status st = mlm ? cm_bert_mlm_new(c, &rng, &m) : cm_bert_classifier_new(c, &rng, &m);
    cr_assert_eq(st, CM_OK, "%s", cm_last_error());
    return m;
}

/* Scales every weight up (0.02 is too small for the paths to matter in a test). */
static void roughen(cm_model *m, uint64_t seed) {
    cm_module *r = cm_model_module(m);
    cm_rng rng = cm_rng_init(seed, 7);
    for (int i = 0; i < cm_module_n_units(r); i++) {
        const cm_unit_info *u = cm_module_unit(r, i);
        cm_rng_normal(&rng, u->params, (size_t)u->numel, 0.0f, 0.3f);
    }
}

/* (B, L) i32 tape tensor from values. */
static cm_tensor *i32(cm_tape *tp, int64_t B, int64_t L, const int32_t *v) {
    const int64_t s[2] = {B, L};
    cm_tensor *t = cm_empty(tp, CM_DTYPE_I32, 2, s);
    memcpy(cm_tensor_data(t), v, sizeof(int32_t) * (size_t)(B * L));
    return t;
}

static void tmp_path(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "/tmp/cm_zoo_bert_%d_%s", (int)getpid(), name);
}

/* ---- configs ---- */

Test(zoo_bert, presets_have_hugging_face_sizes_and_unknown_names_are_listed) {
    cm_bert_config c;
    cr_assert_eq(cm_bert_config_preset("bert-base-uncased", &c), CM_OK);
    cr_assert(c.vocab_size == 30522 && c.hidden_size == 768 && c.num_hidden_layers == 12 &&
              c.num_attention_heads == 12 && c.intermediate_size == 3072 && c.max_position_embeddings == 512 &&
              c.type_vocab_size == 2 && c.pad_token_id == 0 && c.hidden_act == CM_ACT_GELU);
    cr_assert_float_eq(c.layer_norm_eps, 1e-12f, 1e-18f);
    cr_assert_eq(cm_bert_config_preset("bert-large-uncased", &c), CM_OK);
    cr_assert(c.hidden_size == 1024 && c.num_hidden_layers == 24 && c.num_attention_heads == 16 &&
              c.intermediate_size == 4096);
    cr_assert_eq(cm_bert_config_preset("bert-tiny", &c), CM_OK);
    cr_assert(c.hidden_size == 128 && c.num_hidden_layers == 2 && c.num_attention_heads == 2 &&
              c.intermediate_size == 512);
    cr_assert_eq(cm_bert_config_preset("bert-huge", &c), CM_ERR_NOT_FOUND);
    cr_assert(strstr(cm_last_error(), "bert-huge") && strstr(cm_last_error(), "bert-base-uncased") &&
                  strstr(cm_last_error(), "test-tiny"),
              "%s", cm_last_error());
    cr_assert_eq(cm_bert_config_preset(NULL, &c), CM_ERR_INVALID_ARG);
}

Test(zoo_bert, bad_configs_are_rejected_naming_the_field) {
    cm_bert_config c = small();
    cm_model *m = (cm_model *)1;
    c.num_attention_heads = 3;
    cr_assert_eq(cm_bert_mlm_new(&c, NULL, &m), CM_ERR_INVALID_ARG);
    cr_assert_null(m);
    cr_assert(strstr(cm_last_error(), "num_attention_heads 3"), "%s", cm_last_error());
    c = small();
    c.vocab_size = 0;
    cr_assert_eq(cm_bert_classifier_new(&c, NULL, &m), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "vocab_size"), "%s", cm_last_error());
    c = small();
    c.pad_token_id = 20;
    cr_assert_eq(cm_bert_config_check(&c), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "pad_token_id 20"), "%s", cm_last_error());
    c = small();
    c.hidden_dropout_prob = 1.5f;
    cr_assert_eq(cm_bert_config_check(&c), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_bert_mlm_new(NULL, NULL, &m), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_bert_mlm_new(&c, NULL, NULL), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_bert_count_params(&c, true), 0);
}

/* ---- structure ---- */

Test(zoo_bert, parameter_counts_match_the_formula_and_bert_base) {
    cm_bert_config c = cm_bert_config_default();
    cr_assert_eq(cm_bert_count_params(&c, false), 109483778, "BertForSequenceClassification: %lld",
                 (long long)cm_bert_count_params(&c, false));
    cr_assert_eq(cm_bert_count_params(&c, true), 109514298, "BertForMaskedLM: %lld",
                 (long long)cm_bert_count_params(&c, true));
    const char *presets[2] = {"bert-tiny", "test-tiny"};
    for (int p = 0; p < 2; p++) {
        cr_assert_eq(cm_bert_config_preset(presets[p], &c), CM_OK);
        for (int mlm = 0; mlm < 2; mlm++) {
            cm_model *m;
            cr_assert_eq(mlm ? cm_bert_mlm_new(&c, NULL, &m) : cm_bert_classifier_new(&c, NULL, &m), CM_OK);
            int64_t built = cm_module_count_params(cm_model_module(m), false);
            cr_assert_eq(built, cm_bert_count_params(&c, mlm), "%s %s: built %lld, formula %lld", presets[p],
                         mlm ? "mlm" : "cls", (long long)built, (long long)cm_bert_count_params(&c, mlm));
            cm_model_free(m);
        }
    }
}

Test(zoo_bert, modules_carry_hugging_face_names_units_and_the_tied_decoder) {
    cm_bert_config c = small();
    c.num_hidden_layers = 2;
    cm_model *m = make(true, &c, 1);
    cm_module *r = cm_model_module(m);
    cr_assert_str_eq(cm_model_type_name(m), "BertForMaskedLM");
    const char *names[] = {"bert.embeddings.word_embeddings.weight",
                           "bert.embeddings.position_embeddings.weight",
                           "bert.embeddings.token_type_embeddings.weight",
                           "bert.embeddings.LayerNorm.bias",
                           "bert.encoder.layer.1.attention.self.query.weight",
                           "bert.encoder.layer.1.attention.self.value.bias",
                           "bert.encoder.layer.0.attention.output.dense.weight",
                           "bert.encoder.layer.0.attention.output.LayerNorm.weight",
                           "bert.encoder.layer.0.intermediate.dense.weight",
                           "bert.encoder.layer.0.output.dense.bias",
                           "bert.encoder.layer.0.output.LayerNorm.weight",
                           "cls.predictions.bias",
                           "cls.predictions.transform.dense.weight",
                           "cls.predictions.transform.LayerNorm.bias"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        cr_assert(cm_module_param_index(r, names[i]) >= 0, "no parameter '%s'", names[i]);
    /* the decoder is the word embedding matrix and its bias is cls.predictions.bias */
    cr_assert_eq(cm_module_find_param(r, "cls.predictions.decoder.weight"),
                 cm_module_find_param(r, "bert.embeddings.word_embeddings.weight"));
    cr_assert_eq(cm_module_find_param(r, "cls.predictions.decoder.bias"), cm_module_find_param(r, "cls.predictions.bias"));
    cr_assert_null(cm_module_find_param(r, "bert.pooler.dense.weight"));
    /* units: embeddings, each layer, head */
    cr_assert_eq(cm_module_n_units(r), 4);
    const char *units[4] = {"bert.embeddings", "bert.encoder.layer.0", "bert.encoder.layer.1", "head"};
    for (int i = 0; i < 4; i++) {
        bool found = false;
        for (int k = 0; k < 4; k++) found |= !strcmp(cm_module_unit(r, k)->name, units[i]);
        cr_assert(found, "no unit '%s'", units[i]);
    }
    /* init: LayerNorm 1/0, biases 0, weights ~ N(0, 0.02), the [PAD] row 0 */
    cm_tensor *w = cm_module_find_param(r, "bert.embeddings.word_embeddings.weight");
    double ss = 0;
    for (int64_t i = 0; i < cm_tensor_numel(w); i++) ss += cm_tensor_get_flat(w, i) * cm_tensor_get_flat(w, i);
    double sd = sqrt(ss / (double)(cm_tensor_numel(w) - c.hidden_size));
    cr_assert(sd > 0.015 && sd < 0.025, "word embedding std %g (want about 0.02)", sd);
    for (int64_t i = 0; i < c.hidden_size; i++) cr_assert_eq(cm_tensor_get_flat(w, i), 0.0, "[PAD] row not zero");
    cr_assert_eq(cm_tensor_get_flat(cm_module_find_param(r, "cls.predictions.transform.LayerNorm.weight"), 3), 1.0);
    cr_assert_eq(cm_tensor_get_flat(cm_module_find_param(r, "bert.encoder.layer.0.output.dense.bias"), 3), 0.0);
    cm_model_free(m);

    m = make(false, &c, 1);
    r = cm_model_module(m);
    cr_assert_str_eq(cm_model_type_name(m), "BertForSequenceClassification");
    cr_assert(cm_module_param_index(r, "bert.pooler.dense.weight") >= 0);
    cr_assert(cm_module_param_index(r, "classifier.bias") >= 0);
    cr_assert_eq(cm_tensor_dim(cm_module_find_param(r, "classifier.weight"), 0), 3);
    cr_assert_not_null(cm_bert_model_config(m));
    cr_assert_eq(cm_bert_model_config(m)->num_labels, 3);
    cm_model_free(m);
}

/* ---- forward ---- */

Test(zoo_bert, padding_does_not_change_the_cls_output) {
    cm_bert_config c = small();
    cm_model *m = make(false, &c, 2);
    roughen(m, 2);
    cm_tape *tp = cmt_tape();
    /* row 0: 4 real tokens then padding; row 1: the same 4 tokens and different "padding" */
    const int32_t ids[2 * 7] = {1, 5, 9, 2, 0, 0, 0, /**/ 1, 5, 9, 2, 7, 3, 11};
    const int32_t am[2 * 7] = {1, 1, 1, 1, 0, 0, 0, /**/ 1, 1, 1, 1, 0, 0, 0};
    const int32_t tt[2 * 7] = {0, 0, 1, 1, 0, 0, 0, /**/ 0, 0, 1, 1, 1, 1, 0};
    const char *names[3] = {"input_ids", "attention_mask", "token_type_ids"};
    cm_tensor *f[3] = {i32(tp, 2, 7, ids), i32(tp, 2, 7, am), i32(tp, 2, 7, tt)};
    cm_model_batch b = {names, f, 3, 2, 0};
    cm_tensor *y = cm_model_forward(m, tp, &b);
    cr_assert(y, "%s", cm_tape_error(tp));
    cr_assert_eq(cm_tensor_dim(y, 1), 3);
    /* Masked keys get exactly zero weight, so the rows differ only by where they sit in each GEMM:
     * BLAS microkernels may sum a row in a different order at a tile edge (seen with OpenBLAS on
     * AVX2), a few ulps. A leak of the different padding tokens moves the logits by ~1e-1. */
    for (int k = 0; k < 3; k++) {
        const double r0 = cm_tensor_get_flat(y, k), r1 = cm_tensor_get_flat(y, 3 + k);
        cr_assert(fabs(r0 - r1) <= 1e-6 * fmax(1.0, fabs(r0)), "logit %d: %.9g vs %.9g (tolerance 1e-6): padding leaked",
                  k, r0, r1);
    }
    /* the unpadded sequence alone gives the same logits */
    const int32_t ids4[4] = {1, 5, 9, 2}, tt4[4] = {0, 0, 1, 1};
    cm_tensor *f4[2] = {i32(tp, 1, 4, ids4), i32(tp, 1, 4, tt4)};
    const char *names4[2] = {"input_ids", "token_type_ids"};
    cm_model_batch b4 = {names4, f4, 2, 1, 0};
    cm_tensor *y4 = cm_model_forward(m, tp, &b4);
    cr_assert(y4, "%s", cm_tape_error(tp));
    for (int k = 0; k < 3; k++)
        cr_assert_float_eq(cm_tensor_get_flat(y, k), cm_tensor_get_flat(y4, k), 1e-5, "logit %d: %g padded vs %g alone",
                           k, cm_tensor_get_flat(y, k), cm_tensor_get_flat(y4, k));
    /* without the mask the padding does change it (the mask is what hides it) */
    cm_model_batch nb = {names, (cm_tensor *[3]){f[0], NULL, f[2]}, 3, 2, 0};
    cm_tensor *yn = cm_model_forward(m, tp, &nb);
    cr_assert(yn, "%s", cm_tape_error(tp));
    cr_assert(fabs(cm_tensor_get_flat(yn, 0) - cm_tensor_get_flat(y, 0)) > 1e-4, "mask had no effect");
    cm_tape_free(tp);
    cm_model_free(m);
}

Test(zoo_bert, bad_batches_fail_on_the_tape_with_names_and_shapes) {
    cm_bert_config c = small();
    cm_model *m = make(true, &c, 3);
    cm_tape *tp = cmt_tape();
    const int32_t v[13] = {0};
    const char *names[1] = {"tokens"};
    cm_tensor *f[1] = {i32(tp, 1, 13, v)};
    cm_model_batch b = {names, f, 1, 1, 0};
    cmt_expect_error(tp, cm_model_forward(m, tp, &b), CM_ERR_NOT_FOUND, "input_ids", "tokens", NULL);
    cm_tape_reset(tp);
    names[0] = "input_ids";
    f[0] = i32(tp, 1, 13, v);
    cmt_expect_error(tp, cm_model_forward(m, tp, &b), CM_ERR_SHAPE, "13", "max_position_embeddings 12", NULL);
    cm_tape_reset(tp);
    const char *n2[2] = {"input_ids", "attention_mask"};
    cm_tensor *f2[2] = {i32(tp, 1, 4, v), i32(tp, 1, 5, v)};
    cm_model_batch b2 = {n2, f2, 2, 1, 0};
    cmt_expect_error(tp, cm_model_forward(m, tp, &b2), CM_ERR_SHAPE, "attention_mask", NULL);
    cm_tape_reset(tp);
    /* MLM loss needs "labels" (B, L) */
    f2[1] = i32(tp, 1, 4, v);
    cm_tensor *y = cm_model_forward(m, tp, &b2);
    cr_assert(y, "%s", cm_tape_error(tp));
    cmt_expect_error(tp, cm_model_loss(m, tp, y, &b2), CM_ERR_NOT_FOUND, "labels", NULL);
    cm_tape_reset(tp);
    const char *n3[2] = {"input_ids", "labels"};
    cm_tensor *f3[2] = {i32(tp, 1, 4, v), i32(tp, 1, 3, v)};
    cm_model_batch b3 = {n3, f3, 2, 1, 0};
    y = cm_model_forward(m, tp, &b3);
    cmt_expect_error(tp, cm_model_loss(m, tp, y, &b3), CM_ERR_SHAPE, "labels", NULL);
    cm_tape_free(tp);
    cm_model_free(m);
}

Test(zoo_bert, metrics_flops_and_regression) {
    cm_bert_config c = small();
    cm_model *m = make(true, &c, 4);
    cr_assert_eq(cm_model_n_metrics(m, true), 2);
    cr_assert_str_eq(cm_model_metric(m, false, 0).vt->name, "LanguageCrossEntropy");
    cr_assert_str_eq(cm_model_metric(m, false, 1).vt->name, "MulticlassAccuracy");
    cm_tape *tp = cmt_tape();
    const int32_t ids[5] = {1, 2, 3, 4, 5};
    const char *names[1] = {"input_ids"};
    cm_tensor *f[1] = {i32(tp, 1, 5, ids)};
    cm_model_batch b = {names, f, 1, 1, 5};
    double want = cm_bert_flops_per_sequence(&c, true, 5);
    const double C = 8, F = 16, T = 5, V = 20;
    cr_assert_float_eq(want, 6.0 * (T * (4 * C * C + 2 * C * F + 2 * T * C) + T * (C * C + C * V)), 1e-6);
    cr_assert_float_eq(cm_model_flops_per_sample(m, &b), want, 1e-6);
    cm_model_free(m);

    m = make(false, &c, 4);
    cr_assert_eq(cm_model_n_metrics(m, true), 1);
    cr_assert_eq(cm_model_n_metrics(m, false), 2);
    cr_assert_str_eq(cm_model_metric(m, false, 1).vt->name, "CrossEntropy");
    cm_model_free(m);

    /* num_labels = 1: the loss is the MSE against label (as f32) */
    c.num_labels = 1;
    m = make(false, &c, 4);
    cr_assert_eq(cm_model_n_metrics(m, false), 0);
    const int32_t ids2[6] = {1, 2, 3, 4, 5, 6};
    const int64_t ls[1] = {2};
    cm_tensor *lab = cm_full(tp, CM_DTYPE_I64, 1, ls, 1.0);
    const char *n2[2] = {"input_ids", "label"};
    cm_tensor *f2[2] = {i32(tp, 2, 3, ids2), lab};
    cm_model_batch b2 = {n2, f2, 2, 2, 0};
    cm_tensor *y = cm_model_forward(m, tp, &b2);
    cm_tensor *loss = cm_model_loss(m, tp, y, &b2);
    cr_assert(loss, "%s", cm_tape_error(tp));
    double e0 = cm_tensor_get_flat(y, 0) - 1, e1 = cm_tensor_get_flat(y, 1) - 1;
    cr_assert_float_eq(cm_tensor_get_flat(loss, 0), (e0 * e0 + e1 * e1) / 2, 1e-6);
    cm_model_free(m);
    cm_tape_free(tp);
}

/* ---- gradients ---- */

typedef struct {
    cm_model *m;
    cm_model_batch *b;
} loss_ctx;

static cm_tensor *model_loss(cm_tape *tp, cm_tensor *const *in, void *vctx) {
    (void)in; /* the checked tensor is a parameter the model reads */
    loss_ctx *c = vctx;
    cm_tensor *y = cm_model_forward(c->m, tp, c->b);
    return cm_model_loss(c->m, tp, y, c->b);
}

Test(zoo_bert, gradcheck_of_both_losses_through_parameters) {
    cm_bert_config c = small();
    c.pad_token_id = -1; /* with padding_idx the [PAD] row's gradient is 0 by design, not the derivative */
    cm_tape *tp = cmt_tape();
    const int32_t ids[2 * 5] = {1, 5, 0, 9, 2, /**/ 1, 7, 3, 0, 0};
    const int32_t am[2 * 5] = {1, 1, 1, 1, 1, /**/ 1, 1, 1, 0, 0};
    const int32_t tt[2 * 5] = {0, 0, 0, 1, 1, /**/ 0, 1, 1, 0, 0};
    const int64_t ls[2] = {2, 5}, cs[1] = {2};
    cm_tensor *labels = cm_full(tp, CM_DTYPE_I64, 2, ls, -100);
    int64_t *l = cm_tensor_data(labels);
    l[1] = 4, l[3] = 17, l[6] = 0;
    cm_tensor *label = cm_full(tp, CM_DTYPE_I64, 1, cs, 2);
    cm_tensor_set(label, (int64_t[]){0}, 1);
    const char *names[5] = {"input_ids", "attention_mask", "token_type_ids", "labels", "label"};
    cm_tensor *f[5] = {i32(tp, 2, 5, ids), i32(tp, 2, 5, am), i32(tp, 2, 5, tt), labels, label};
    cm_model_batch b = {names, f, 5, 2, 0};
    cmt_gradcheck_opts o = {3e-3, 1e-3, 2e-2, 40};
    for (int mlm = 0; mlm < 2; mlm++) {
        cm_model *m = make(mlm, &c, 5);
        roughen(m, 5);
        cm_module *r = cm_model_module(m);
        loss_ctx ctx = {m, &b};
        const char *p_cls[3] = {"bert.pooler.dense.weight", "bert.encoder.layer.0.attention.self.key.weight",
                                "bert.embeddings.token_type_embeddings.weight"};
        const char *p_mlm[3] = {"bert.embeddings.word_embeddings.weight", "cls.predictions.bias",
                                "bert.encoder.layer.0.output.LayerNorm.weight"};
        for (int i = 0; i < 3; i++) {
            const char *pn = mlm ? p_mlm[i] : p_cls[i];
            cm_tensor *in[1] = {cm_module_find_param(r, pn)};
            cmt_gradcheck(pn, model_loss, &ctx, 1, in, &o);
        }
        cm_model_free(m);
    }
    cm_tape_free(tp);
}

/* ---- weights ---- */

static void assert_same_params(cm_module *a, cm_module *b) {
    cr_assert_eq(cm_module_n_params(a), cm_module_n_params(b));
    for (int64_t i = 0; i < cm_module_n_params(a); i++) {
        cm_param_info pa = cm_module_param_info(a, i), pb = cm_module_param_info(b, i);
        cr_assert_str_eq(pa.name, pb.name);
        cmt_assert_close(pa.name, pa.tensor, pb.tensor, 0, 0);
    }
}

Test(zoo_bert, save_then_load_round_trips_with_the_tied_aliases) {
    cm_bert_config c = small();
    char path[256];
    tmp_path(path, sizeof path, "mlm.safetensors");
    cm_model *a = make(true, &c, 6), *b = make(true, &c, 7);
    roughen(a, 6);
    cr_assert_eq(cm_bert_save_safetensors(a, path), CM_OK, "%s", cm_last_error());
    cm_safetensors *st;
    cr_assert_eq(cm_safetensors_open(path, &st), CM_OK);
    /* torch's strict load_state_dict wants the aliases; no position_ids (a non-persistent buffer) */
    cr_assert_not_null(cm_safetensors_find(st, "cls.predictions.decoder.weight"));
    cr_assert_not_null(cm_safetensors_find(st, "cls.predictions.decoder.bias"));
    cr_assert_not_null(cm_safetensors_find(st, "bert.embeddings.word_embeddings.weight"));
    cr_assert_eq((int64_t)cm_safetensors_count(st), cm_module_n_params(cm_model_module(a)) + 2);
    cr_assert_str_eq(cm_safetensors_metadata_get(st, "format"), "pt");
    cm_safetensors_close(st);
    cm_load_report rep;
    cr_assert_eq(cm_bert_load_safetensors(b, path, NULL, &rep), CM_OK, "%s", cm_last_error());
    cr_assert_eq(rep.n_missing + rep.n_unexpected, 0);
    assert_same_params(cm_model_module(a), cm_model_module(b));
    cm_model_free(b);

    /* the classifier too */
    cm_model *ca = make(false, &c, 8), *cb = make(false, &c, 9);
    cr_assert_eq(cm_bert_save_safetensors(ca, path), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_bert_load_safetensors(cb, path, NULL, NULL), CM_OK, "%s", cm_last_error());
    assert_same_params(cm_model_module(ca), cm_model_module(cb));

    /* strict: the MLM file into the classifier names the missing and the unexpected keys */
    cr_assert_eq(cm_bert_save_safetensors(a, path), CM_OK);
    cr_assert_eq(cm_bert_load_safetensors(cb, path, NULL, &rep), CM_ERR_NOT_FOUND);
    cr_assert(strstr(cm_last_error(), "bert.pooler.dense.weight") && strstr(cm_last_error(), "classifier.weight") &&
                  strstr(cm_last_error(), "cls.predictions.bias"),
              "%s", cm_last_error());
    cr_assert_eq(rep.n_missing, 4, "missing: %s", rep.missing);
    cr_assert(strstr(rep.unexpected, "cls.predictions.transform.dense.weight"), "%s", rep.unexpected);
    assert_same_params(cm_model_module(ca), cm_model_module(cb)); /* nothing changed */
    /* the body loads when the heads are ignored */
    const char *skip[2] = {"cls.*", "classifier.*"};
    cm_load_opts lo = cm_load_opts_default();
    lo.ignore = skip, lo.n_ignore = 2, lo.strict = false;
    cr_assert_eq(cm_bert_load_safetensors(cb, path, &lo, &rep), CM_OK, "%s", cm_last_error());
    cr_assert_eq(rep.n_missing, 2, "missing: %s", rep.missing); /* the pooler */
    cmt_assert_close("word embeddings", cm_module_find_param(cm_model_module(cb), "bert.embeddings.word_embeddings.weight"),
                     cm_module_find_param(cm_model_module(a), "bert.embeddings.word_embeddings.weight"), 0, 0);

    /* a different size: the shape error names the tensor and both shapes */
    cm_bert_config c2 = small();
    c2.vocab_size = 21;
    cm_model *d = make(true, &c2, 1);
    cr_assert_eq(cm_bert_load_safetensors(d, path, NULL, NULL), CM_ERR_SHAPE);
    cr_assert(strstr(cm_last_error(), "word_embeddings") && strstr(cm_last_error(), "(21, 8)"), "%s", cm_last_error());
    cm_model_free(d);
    /* not a BERT model, and a missing file */
    cm_module *lin;
    cr_assert_eq(cm_nn_linear_new(2, 2, true, NULL, &lin), CM_OK);
    cm_model *other;
    cr_assert_eq(cm_model_classifier_new(lin, NULL, &other), CM_OK);
    cr_assert_eq(cm_bert_load_safetensors(other, path, NULL, NULL), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_bert_save_safetensors(other, path), CM_ERR_INVALID_ARG);
    cr_assert_null(cm_bert_model_config(other));
    cm_model_free(other);
    cr_assert_eq(cm_bert_load_safetensors(a, "/nonexistent/model.safetensors", NULL, NULL), CM_ERR_IO);
    cm_model_free(a);
    cm_model_free(ca);
    cm_model_free(cb);
    unlink(path);
}

/* A checkpoint with TF-era names (LayerNorm.gamma/beta), a bare BertModel prefix (no "bert."),
 * position_ids and only the decoder's name for the tied bias loads strictly. */
Test(zoo_bert, hugging_face_naming_variants_load) {
    cm_bert_config c = small();
    cm_model *a = make(true, &c, 10), *b = make(true, &c, 11);
    roughen(a, 10);
    cm_module *r = cm_model_module(a);
    cm_safetensors_writer *w;
    cr_assert_eq(cm_safetensors_writer_new(&w), CM_OK);
    char names[64][160];
    int n = 0;
    for (int64_t i = 0; i < cm_module_n_params(r); i++) {
        cm_param_info p = cm_module_param_info(r, i);
        const char *nm = p.name;
        char *o = names[n++];
        if (!strncmp(nm, "bert.", 5)) nm += 5; /* a bare BertModel's names */
        if (!strcmp(nm, "cls.predictions.bias")) nm = "cls.predictions.decoder.bias";
        snprintf(o, 160, "%s", nm);
        size_t len = strlen(o);
        if (len > 16 && !strcmp(o + len - 16, "LayerNorm.weight")) strcpy(o + len - 6, "gamma");
        if (len > 14 && !strcmp(o + len - 14, "LayerNorm.bias")) strcpy(o + len - 4, "beta");
        cr_assert_eq(cm_safetensors_writer_add(w, o, p.tensor), CM_OK);
    }
    cr_assert(strstr(names[3], "embeddings.LayerNorm.gamma"), "%s", names[3]);
    const int64_t ps[2] = {1, 12};
    cm_tensor *pos;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_I64, 2, ps, &pos), CM_OK);
    cr_assert_eq(cm_safetensors_writer_add(w, "bert.embeddings.position_ids", pos), CM_OK);
    char path[256];
    tmp_path(path, sizeof path, "hf.safetensors");
    cr_assert_eq(cm_safetensors_writer_write(w, path), CM_OK, "%s", cm_last_error());
    cm_safetensors_writer_free(w);
    cm_tensor_free(pos);
    cm_load_report rep;
    cr_assert_eq(cm_bert_load_safetensors(b, path, NULL, &rep), CM_OK, "%s", cm_last_error());
    cr_assert_eq(rep.n_loaded, cm_module_n_params(r));
    assert_same_params(r, cm_model_module(b));
    /* the plain loader (no conventions) reports them */
    cr_assert_eq(cm_module_load_safetensors(cm_model_module(b), path, NULL, NULL), CM_ERR_NOT_FOUND);
    cr_assert(strstr(cm_last_error(), "position_ids"), "%s", cm_last_error());
    cm_model_free(a);
    cm_model_free(b);
    unlink(path);
}

/* ---- MLM masking ---- */

Test(zoo_bert, mlm_masking_follows_the_80_10_10_recipe_deterministically) {
    cm_bert_mlm_mask_config mc = cm_bert_mlm_mask_config_default();
    mc.seed = 77;
    enum { L = 128, N = 200 };
    int32_t ids[L], orig[L], am[L];
    int64_t labels[L];
    int64_t selected = 0, eligible = 0, to_mask = 0, to_random = 0, kept = 0;
    for (int s = 0; s < N; s++) {
        for (int i = 0; i < L; i++) {
            orig[i] = i == 0 ? 101 : i == 99 ? 102 : i >= 100 ? 0 : 1000 + (s * 7 + i * 13) % 20000;
            am[i] = i < 100;
        }
        memcpy(ids, orig, sizeof ids);
        int64_t n;
        cr_assert_eq(cm_bert_mlm_mask(&mc, (uint64_t)s, L, ids, am, labels, &n), CM_OK, "%s", cm_last_error());
        int64_t cnt = 0;
        for (int i = 0; i < L; i++) {
            if (labels[i] == -100) {
                cr_assert_eq(ids[i], orig[i], "unselected position %d changed", i);
                continue;
            }
            cnt++;
            cr_assert(i > 0 && i < 99, "special or padded position %d selected", i);
            cr_assert_eq(labels[i], orig[i]);
            if (ids[i] == 103) to_mask++;
            else if (ids[i] == orig[i]) kept++;
            else to_random++;
            cr_assert(ids[i] >= 0 && ids[i] < 30522);
        }
        cr_assert_eq(cnt, n);
        selected += n;
        eligible += 98;
        /* deterministic: the same (seed, sample) masks the same way */
        int32_t again[L];
        int64_t lab2[L];
        memcpy(again, orig, sizeof again);
        cm_bert_mlm_mask(&mc, (uint64_t)s, L, again, am, lab2, NULL);
        cr_assert_arr_eq(again, ids, sizeof again);
        cr_assert_arr_eq(lab2, labels, sizeof lab2);
    }
    double rate = (double)selected / (double)eligible;
    cr_assert(rate > 0.14 && rate < 0.16, "selected %.4f of tokens (want 0.15)", rate);
    double pm = (double)to_mask / (double)selected, pr = (double)to_random / (double)selected,
           pk = (double)kept / (double)selected;
    cr_assert(pm > 0.77 && pm < 0.83 && pr > 0.08 && pr < 0.12 && pk > 0.08 && pk < 0.12,
              "[MASK] %.3f random %.3f kept %.3f (want 0.8 / 0.1 / 0.1)", pm, pr, pk);
}

Test(zoo_bert, mlm_mask_batch_equals_the_row_form_and_checks_arguments) {
    cm_bert_mlm_mask_config mc = cm_bert_mlm_mask_config_default();
    mc.seed = 3, mc.mlm_probability = 0.5f;
    const int64_t s[2] = {3, 16};
    cm_tensor *ids, *lab, *am;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_I32, 2, s, &ids), CM_OK);
    cr_assert_eq(cm_tensor_new(CM_DTYPE_I64, 2, s, &lab), CM_OK);
    cr_assert_eq(cm_tensor_new(CM_DTYPE_I32, 2, s, &am), CM_OK);
    int32_t *d = cm_tensor_data(ids), *a = cm_tensor_data(am);
    for (int i = 0; i < 48; i++) d[i] = 2000 + i, a[i] = (i % 16) < 12;
    int32_t row[16];
    int64_t rl[16];
    memcpy(row, d + 16, sizeof row);
    cr_assert_eq(cm_bert_mlm_mask_batch(&mc, 10, ids, am, lab), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_bert_mlm_mask(&mc, 11, 16, row, a + 16, rl, NULL), CM_OK);
    cr_assert_arr_eq(row, d + 16, sizeof row, "row 1 uses sample index 11");
    cr_assert_arr_eq(rl, (int64_t *)cm_tensor_data(lab) + 16, sizeof rl);
    /* errors */
    cm_bert_mlm_mask_config bad = mc;
    bad.mask_replace_prob = 0.95f;
    cr_assert_eq(cm_bert_mlm_mask(&bad, 0, 16, row, NULL, rl, NULL), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "mask + random"), "%s", cm_last_error());
    bad = mc;
    bad.mask_token_id = 40000;
    cr_assert_eq(cm_bert_mlm_mask(&bad, 0, 16, row, NULL, rl, NULL), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_bert_mlm_mask(&mc, 0, 16, NULL, NULL, rl, NULL), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_bert_mlm_mask_batch(&mc, 0, ids, NULL, ids), CM_ERR_DTYPE);
    const int64_t s2[2] = {3, 15};
    cm_tensor *lab2;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_I64, 2, s2, &lab2), CM_OK);
    cr_assert_eq(cm_bert_mlm_mask_batch(&mc, 0, ids, NULL, lab2), CM_ERR_SHAPE);
    cr_assert(strstr(cm_last_error(), "(3, 15)"), "%s", cm_last_error());
    cm_tensor_free(lab2);
    cm_tensor_free(ids);
    cm_tensor_free(lab);
    cm_tensor_free(am);
}
