/* The GPT-2 zoo model against PyTorch (tests/golden/gen_gpt2.py): a tiny GPT-2 (V 96, P 32, C 32,
 * L 2, H 4) whose weights come from a Hugging Face-style state_dict (with the attn.bias /
 * attn.masked_bias mask buffers and the tied lm_head.weight) gives the same logits, loss (labels
 * with -100) and every parameter gradient.
 *
 * Tolerances: f32 through 2 blocks with different summation orders: logits atol 2e-5 rtol 1e-4,
 * loss 1e-5, gradients atol 2e-6 rtol 1e-3 (the largest are ~1e-2). */
#include "cmtest.h"

#include <composer/zoo_gpt2.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define WEIGHTS "tests/golden/gpt2_tiny_hf.safetensors"
#define GOLDEN "tests/golden/gpt2.safetensors"

static cm_model *load_tiny(void) {
    cm_gpt2_config cfg;
    cr_assert_eq(cm_gpt2_config_preset("tiny", &cfg), CM_OK);
    cm_model *m;
    cr_assert_eq(cm_gpt2_new(&cfg, NULL, &m), CM_OK, "%s", cm_last_error());
    cm_load_report rep;
    cr_assert_eq(cm_gpt2_load_safetensors(m, WEIGHTS, NULL, &rep), CM_OK, "%s", cm_last_error());
    cr_assert_eq(rep.n_missing, 0, "missing: %s", rep.missing);
    cr_assert_eq(rep.n_unexpected, 0, "unexpected: %s", rep.unexpected);
    cr_assert_eq(rep.n_loaded, cm_module_n_params(cm_model_module(m)), "loaded %lld of %lld", (long long)rep.n_loaded,
                 (long long)cm_module_n_params(cm_model_module(m)));
    return m;
}

Test(golden_gpt2, logits_loss_and_every_gradient_match_pytorch) {
    cm_model *m = load_tiny();
    cm_module *root = cm_model_module(m);
    cmt_golden *g = cmt_golden_open(GOLDEN);
    cm_tape *tp = cmt_tape();
    cm_tensor *ids = cmt_golden_on_tape(g, tp, "input_ids", false);
    cm_tensor *labels = cmt_golden_on_tape(g, tp, "labels", false);
    const char *names[2] = {"input_ids", "labels"};
    cm_tensor *fields[2] = {ids, labels};
    cm_model_batch b = {names, fields, 2, cm_tensor_dim(ids, 0), cm_tensor_numel(ids)};
    cm_module_train(root, false); /* the golden has no dropout; the tiny preset has none either */
    cm_tensor *logits = cm_model_forward(m, tp, &b);
    cr_assert(logits, "%s", cm_tape_error(tp));
    cm_tensor *want = cmt_golden_get(g, "logits");
    cmt_assert_close("logits", logits, want, 2e-5, 1e-4);
    cm_tensor *loss = cm_model_loss(m, tp, logits, &b);
    cr_assert(loss, "%s", cm_tape_error(tp));
    cm_tensor *want_loss = cmt_golden_get(g, "loss");
    const double got_l = cm_tensor_get_flat(loss, 0), want_l = cm_tensor_get_flat(want_loss, 0);
    cr_assert(fabs(got_l - want_l) < 1e-5, "loss %.7f vs torch %.7f (tol 1e-5)", got_l, want_l);
    cr_assert_eq(cm_tape_backward(tp, loss), CM_OK, "%s", cm_tape_error(tp));
    int64_t n_checked = 0;
    for (int64_t i = 0; i < cm_module_n_params(root); i++) {
        cm_param_info p = cm_module_param_info(root, i);
        char key[256];
        snprintf(key, sizeof key, "grad.%s", p.name);
        cr_assert(cmt_golden_has(g, key), "the golden has no %s", key);
        cm_tensor *gw = cmt_golden_get(g, key);
        cmt_assert_close(p.name, cm_tensor_grad(p.tensor), gw, 2e-6, 1e-3);
        cm_tensor_free(gw);
        n_checked++;
    }
    cr_assert_eq(n_checked, 2 + 2 * 12 + 2, "every parameter of the tiny model (got %lld)", (long long)n_checked);
    /* the metrics agree with the loss */
    double st[2] = {0};
    cm_metric ce = cm_model_metric(m, false, 0), ppl = cm_model_metric(m, false, 1);
    cr_assert_eq(cm_metric_update(&ce, logits, &b, st), CM_OK, "%s", cm_last_error());
    cr_assert_eq(st[1], (double)(cm_tensor_numel(ids) - 3), "3 labels are -100: counted %g", st[1]);
    cr_assert(fabs(cm_metric_compute(&ce, st) - want_l) < 1e-5, "LanguageCrossEntropy %g vs %g",
              cm_metric_compute(&ce, st), want_l);
    cr_assert(fabs(cm_metric_compute(&ppl, st) - exp(want_l)) < 1e-3, "LanguagePerplexity %g vs %g",
              cm_metric_compute(&ppl, st), exp(want_l));
    cm_tensor_free(want);
    cm_tensor_free(want_loss);
    cm_tape_free(tp);
    cmt_golden_close(g);
    cm_model_free(m);
}

Test(golden_gpt2, saved_weights_reload_to_the_same_logits) {
    cm_model *m = load_tiny();
    char path[256];
    snprintf(path, sizeof path, "/tmp/cm_golden_gpt2_%d.safetensors", (int)getpid());
    cr_assert_eq(cm_gpt2_save_safetensors(m, path), CM_OK, "%s", cm_last_error());
    cm_gpt2_config cfg;
    cr_assert_eq(cm_gpt2_config_from_safetensors(path, &cfg), CM_OK, "%s", cm_last_error());
    cr_assert(cfg.vocab_size == 96 && cfg.n_positions == 32 && cfg.n_embd == 32 && cfg.n_layer == 2 && cfg.bias);
    cfg.n_head = 4;
    cfg.embd_pdrop = cfg.attn_pdrop = cfg.resid_pdrop = 0;
    cm_model *m2;
    cr_assert_eq(cm_gpt2_new(&cfg, NULL, &m2), CM_OK);
    cr_assert_eq(cm_gpt2_load_safetensors(m2, path, NULL, NULL), CM_OK, "%s", cm_last_error());
    cmt_golden *g = cmt_golden_open(GOLDEN);
    cm_tape *tp = cmt_tape();
    cm_tensor *ids = cmt_golden_on_tape(g, tp, "input_ids", false);
    cm_tensor *want = cmt_golden_get(g, "logits");
    cm_module_train(cm_model_module(m2), false);
    cmt_assert_close("reloaded logits", cm_module_forward(cm_model_module(m2), tp, ids), want, 2e-5, 1e-4);
    cm_tensor_free(want);
    cm_tape_free(tp);
    cmt_golden_close(g);
    remove(path);
    cm_model_free(m2);
    cm_model_free(m);
}
