/* BERT zoo models against PyTorch (tests/golden/gen_bert.py): a tiny BertForMaskedLM and
 * BertForSequenceClassification load Hugging Face-named weights (with the tied aliases and the
 * position_ids buffer torch writes), run a padded batch, and their logits, loss and every
 * parameter gradient match torch's. */
#include "cmgolden_bert.h"
#include "cmtest.h"

#include <composer/zoo_bert.h>

#include <stdio.h>
#include <string.h>

#define GOLDEN CMT_GOLDEN_BERT

/* f32 everywhere, sums over 32-100 terms: agreement to ~1e-6 relative is expected; the bounds
 * leave room for the different summation orders of BLAS and torch. */
#define LOGIT_ATOL 2e-5
#define LOGIT_RTOL 1e-4
#define GRAD_ATOL 2e-6
#define GRAD_RTOL 1e-3

static void run(bool mlm) {
    const char *tag = mlm ? "mlm" : "cls";
    cmt_golden *g = cmt_golden_open(GOLDEN);
    cm_model *model = cmt_golden_bert_model(mlm);
    cm_module *root = cm_model_module(model);
    cr_assert_eq(cm_module_count_params(root, false), mlm ? 22660 : 22595, "torch counts %d parameters",
                 mlm ? 22660 : 22595);

    const char *names[5] = {"input_ids", "attention_mask", "token_type_ids", "labels", "label"};
    cm_tensor *fields[5];
    for (int i = 0; i < 5; i++) fields[i] = cmt_golden_get(g, names[i]);
    cm_model_batch b = {names, fields, 5, 3, 0};

    cm_tape *tp = cmt_tape();
    cm_tensor *logits = cm_model_forward(model, tp, &b);
    cr_assert(logits, "%s", cm_tape_error(tp));
    cm_tensor *loss = cm_model_loss(model, tp, logits, &b);
    cr_assert(loss, "%s", cm_tape_error(tp));
    char key[256];
    snprintf(key, sizeof key, "%s.logits", tag);
    cm_tensor *want = cmt_golden_get(g, key);
    cmt_assert_close(key, logits, want, LOGIT_ATOL, LOGIT_RTOL);
    cm_tensor_free(want);
    snprintf(key, sizeof key, "%s.loss", tag);
    want = cmt_golden_get(g, key);
    cr_assert_float_eq(cm_tensor_get_flat(loss, 0), cm_tensor_get_flat(want, 0), 1e-5, "%s: %.8f vs torch %.8f (tol 1e-5)",
                       key, cm_tensor_get_flat(loss, 0), cm_tensor_get_flat(want, 0));
    cm_tensor_free(want);

    cr_assert_eq(cm_tape_backward(tp, loss), CM_OK, "%s", cm_tape_error(tp));
    int64_t n_checked = 0;
    for (int64_t i = 0; i < cm_module_n_params(root); i++) {
        cm_param_info p = cm_module_param_info(root, i);
        snprintf(key, sizeof key, "%s.grad.%s", tag, p.name);
        cr_assert(cmt_golden_has(g, key), "torch has no parameter '%s'", key);
        want = cmt_golden_get(g, key);
        cmt_assert_close(key, cm_tensor_grad(p.tensor), want, GRAD_ATOL, GRAD_RTOL);
        cm_tensor_free(want);
        n_checked++;
    }
    /* every torch parameter was checked: torch lists tied parameters once, as we do */
    cr_assert_eq(n_checked, mlm ? 5 + 2 * 16 + 5 : 5 + 2 * 16 + 4, "checked %lld gradients", (long long)n_checked);

    for (int i = 0; i < 5; i++) cm_tensor_free(fields[i]);
    cm_tape_free(tp);
    cm_model_free(model);
    cmt_golden_close(g);
}

Test(golden_bert, masked_lm_logits_loss_and_every_gradient_match_torch) { run(true); }

Test(golden_bert, classifier_logits_loss_and_every_gradient_match_torch) { run(false); }

Test(golden_bert, parameter_counts_of_bert_base_match_torch) {
    cmt_golden *g = cmt_golden_open(GOLDEN);
    cm_bert_config c = cm_bert_config_default();
    cm_tensor *cls = cmt_golden_get(g, "count.cls"), *mlm = cmt_golden_get(g, "count.mlm");
    cr_assert_eq(cm_bert_count_params(&c, false), (int64_t)cm_tensor_get_flat(cls, 0), "%lld vs torch %lld",
                 (long long)cm_bert_count_params(&c, false), (long long)cm_tensor_get_flat(cls, 0));
    cr_assert_eq(cm_bert_count_params(&c, false), 109483778);
    cr_assert_eq(cm_bert_count_params(&c, true), (int64_t)cm_tensor_get_flat(mlm, 0), "%lld vs torch %lld",
                 (long long)cm_bert_count_params(&c, true), (long long)cm_tensor_get_flat(mlm, 0));
    cm_tensor_free(cls);
    cm_tensor_free(mlm);
    cmt_golden_close(g);
}
