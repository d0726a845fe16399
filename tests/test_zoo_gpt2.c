/* The GPT-2 zoo model: presets and parameter counts, the module tree (Hugging Face names, wrap
 * units, the tied head, initialisation), the cm_model (fields, loss with ignore_index, metrics,
 * FLOPs, errors), gradient checks through the loss, weights in and out (round trip, strict errors
 * naming missing/unexpected keys, GPT2Model names, shape mismatches), dropout, a few training
 * steps, and generation (the KV cache equals recomputation token for token, greedy and sampled,
 * across the n_positions window; reproducible from the seed; top-k / top-p; stopping).
 *
 * Tolerances: gradchecks eps 3e-3, atol 1e-3, rtol 1e-2 (as the block gradchecks); a loss computed
 * by hand in double vs the f32 op 1e-5. */
#include "cmtest.h"
#include "tensor/tensor_impl.h"

#include <composer/safetensors.h>
#include <composer/zoo_gpt2.h>
#include <composer/zoo_vision.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void tmp_path(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "/tmp/cm_zoo_gpt2_%d_%s", (int)getpid(), name);
}

static cm_gpt2_config tiny_cfg(void) {
    cm_gpt2_config c;
    cr_assert_eq(cm_gpt2_config_preset("tiny", &c), CM_OK);
    return c;
}

/* A small model with larger-than-GPT-2 weights so every path matters in gradchecks. */
static cm_gpt2_config small_cfg(void) {
    cm_gpt2_config c = cm_gpt2_config_default();
    c.vocab_size = 11, c.n_positions = 8, c.n_embd = 8, c.n_layer = 2, c.n_head = 2;
    c.embd_pdrop = c.attn_pdrop = c.resid_pdrop = 0;
    c.initializer_range = 0.3f;
    return c;
}

static cm_model *new_model(const cm_gpt2_config *c, uint64_t seed) {
    cm_rng rng = cm_rng_init(seed, 0);
    cm_model *m;
    cr_assert_eq(cm_gpt2_new(c, &rng, &m), CM_OK, "%s", cm_last_error());
    return m;
}

/* ---- configuration ---- */

Test(zoo_gpt2, presets_have_the_published_parameter_counts) {
    const struct {
        const char *name;
        int64_t n;
    } want[] = {{"gpt2", 124439808}, {"gpt2-medium", 354823168}, {"gpt2-large", 774030080}, {"gpt2-xl", 1557611200}};
    for (int i = 0; i < 4; i++) {
        cm_gpt2_config c;
        cr_assert_eq(cm_gpt2_config_preset(want[i].name, &c), CM_OK);
        cr_assert_eq(cm_gpt2_config_n_params(&c, false), want[i].n, "%s: %lld parameters, want %lld", want[i].name,
                     (long long)cm_gpt2_config_n_params(&c, false), (long long)want[i].n);
        cr_assert_eq(cm_gpt2_config_n_params(&c, true), want[i].n - c.n_positions * c.n_embd);
    }
    cm_gpt2_config c = cm_gpt2_config_default();
    cr_assert_eq(cm_gpt2_config_n_params(&c, false), 124439808, "the default is gpt2");
    cr_assert(c.tie_word_embeddings && c.bias && c.activation == CM_ACT_GELU_TANH && c.layer_norm_eps == 1e-5f);
    cr_assert_eq(cm_gpt2_config_preset("shakespeare-char", &c), CM_OK);
    cr_assert(c.vocab_size == 65 && c.n_positions == 256 && c.n_embd == 384 && c.n_layer == 6 && c.n_head == 6);
    cr_assert(c.embd_pdrop == 0.2f && c.attn_pdrop == 0.2f && c.resid_pdrop == 0.2f);
    cr_assert_eq(cm_gpt2_config_n_params(&c, false), 10770816);
    c.tie_word_embeddings = false;
    cr_assert_eq(cm_gpt2_config_n_params(&c, false), 10770816 + 65 * 384, "untied adds V·C");
    c.bias = false;
    cr_assert_eq(cm_gpt2_config_n_params(&c, false), 10770816 + 65 * 384 - 6 * 9 * 384, "no biases");
    c.n_layer = 0;
    cr_assert_eq(cm_gpt2_config_n_params(&c, false), -1);
}

Test(zoo_gpt2, unknown_preset_names_the_closest_and_lists_all) {
    cm_gpt2_config c;
    cr_assert_eq(cm_gpt2_config_preset("gtp2-medum", &c), CM_ERR_NOT_FOUND);
    const char *e = cm_last_error();
    cr_assert(strstr(e, "'gtp2-medum'") && strstr(e, "did you mean 'gpt2-medium'") && strstr(e, "shakespeare-char") &&
                  strstr(e, "tiny"),
              "%s", e);
    cr_assert_eq(cm_gpt2_config_preset("shakespeare", &c), CM_ERR_NOT_FOUND);
    cr_assert(strstr(cm_last_error(), "did you mean 'shakespeare-char'"), "%s", cm_last_error());
    cr_assert_eq(cm_gpt2_config_preset(NULL, &c), CM_ERR_INVALID_ARG);
}

Test(zoo_gpt2, config_check_names_the_bad_field) {
    cm_gpt2_config c = tiny_cfg();
    c.n_head = 5;
    cr_assert_eq(cm_gpt2_config_check(&c), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "n_embd = 32") && strstr(cm_last_error(), "n_head = 5"), "%s", cm_last_error());
    c = tiny_cfg();
    c.attn_pdrop = 1.5f;
    cr_assert_eq(cm_gpt2_config_check(&c), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "attn_pdrop = 1.5"), "%s", cm_last_error());
    c = tiny_cfg();
    c.vocab_size = 0;
    cm_model *m = (cm_model *)1;
    cr_assert_eq(cm_gpt2_new(&c, NULL, &m), CM_ERR_INVALID_ARG);
    cr_assert_null(m);
    cr_assert(strstr(cm_last_error(), "vocab_size = 0"), "%s", cm_last_error());
}

/* ---- the module tree ---- */

Test(zoo_gpt2, tree_has_hugging_face_names_units_and_a_tied_head) {
    cm_gpt2_config c = tiny_cfg();
    cm_model *m = new_model(&c, 1);
    cm_module *root = cm_model_module(m);
    cr_assert_str_eq(cm_model_type_name(m), "GPT2LMHeadModel");
    cr_assert(cm_model_is_gpt2(m));
    cr_assert_eq(cm_gpt2_model_config(m)->n_embd, 32);
    cr_assert_eq(cm_module_count_params(root, false), cm_gpt2_config_n_params(&c, false));
    const char *first[] = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight",
                           "transformer.h.0.ln_1.bias", "transformer.h.0.attn.c_attn.weight",
                           "transformer.h.0.attn.c_attn.bias", "transformer.h.0.attn.c_proj.weight",
                           "transformer.h.0.attn.c_proj.bias", "transformer.h.0.ln_2.weight",
                           "transformer.h.0.ln_2.bias", "transformer.h.0.mlp.c_fc.weight",
                           "transformer.h.0.mlp.c_fc.bias", "transformer.h.0.mlp.c_proj.weight",
                           "transformer.h.0.mlp.c_proj.bias"};
    for (int i = 0; i < 14; i++) cr_assert_str_eq(cm_module_param_info(root, i).name, first[i]);
    const int64_t np = cm_module_n_params(root);
    cr_assert_eq(np, 2 + 2 * 12 + 2);
    cr_assert_str_eq(cm_module_param_info(root, np - 1).name, "transformer.ln_f.bias");
    /* Conv1D weights are stored (in, out) */
    cm_tensor *ca = cm_module_find_param(root, "transformer.h.1.attn.c_attn.weight");
    cr_assert(cm_tensor_dim(ca, 0) == 32 && cm_tensor_dim(ca, 1) == 96);
    /* lm_head.weight is wte's tensor, listed once */
    cr_assert_eq(cm_module_find_param(root, "lm_head.weight"), cm_module_find_param(root, "transformer.wte.weight"));
    cr_assert_eq(cm_module_param_index(root, "lm_head.weight"), 0);
    const char *units[] = {"embeddings", "transformer.h.0", "transformer.h.1", "transformer.ln_f"};
    cr_assert_eq(cm_module_n_units(root), 4);
    for (int i = 0; i < 4; i++) cr_assert_str_eq(cm_module_unit(root, i)->name, units[i]);
    cr_assert_eq(cm_module_unit(root, 0)->numel, (96 + 32) * 32);
    char buf[4096];
    cm_module_summary(root, buf, sizeof buf);
    cr_assert(strstr(buf, "GPT2Block") && strstr(buf, "lm_head"), "%s", buf);
    cm_model_free(m);

    /* untied: lm_head is its own parameter and unit */
    c.tie_word_embeddings = false;
    m = new_model(&c, 1);
    root = cm_model_module(m);
    cr_assert_neq(cm_module_find_param(root, "lm_head.weight"), cm_module_find_param(root, "transformer.wte.weight"));
    cr_assert_eq(cm_module_count_params(root, false), cm_gpt2_config_n_params(&c, false));
    cr_assert_str_eq(cm_module_unit(root, cm_module_n_units(root) - 1)->name, "lm_head");
    cm_model_free(m);
}

static void stats(const cm_tensor *t, double *mean, double *std) {
    double s = 0, s2 = 0;
    const int64_t n = cm_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        double v = cm_tensor_get_flat(t, i);
        s += v, s2 += v * v;
    }
    *mean = s / (double)n;
    *std = sqrt(s2 / (double)n - *mean * *mean);
}

Test(zoo_gpt2, initialisation_follows_gpt2) {
    cm_gpt2_config c = tiny_cfg();
    c.n_layer = 8; /* c_proj std = 0.02 / sqrt(16) = 0.005 */
    cm_model *m = new_model(&c, 7);
    cm_module *root = cm_model_module(m);
    const struct {
        const char *name;
        double std;
    } w[] = {{"transformer.wte.weight", 0.02},
             {"transformer.wpe.weight", 0.02},
             {"transformer.h.3.attn.c_attn.weight", 0.02},
             {"transformer.h.3.mlp.c_fc.weight", 0.02},
             {"transformer.h.3.attn.c_proj.weight", 0.005},
             {"transformer.h.3.mlp.c_proj.weight", 0.005}};
    for (int i = 0; i < 6; i++) {
        double mean, std;
        stats(cm_module_find_param(root, w[i].name), &mean, &std);
        cr_assert(fabs(std - w[i].std) < 0.12 * w[i].std && fabs(mean) < 0.15 * w[i].std,
                  "%s: mean %g std %g, want 0 and %g (10%%)", w[i].name, mean, std, w[i].std);
    }
    double mean, std;
    stats(cm_module_find_param(root, "transformer.h.2.mlp.c_fc.bias"), &mean, &std);
    cr_assert(mean == 0 && std == 0, "biases start at 0");
    stats(cm_module_find_param(root, "transformer.ln_f.weight"), &mean, &std);
    cr_assert(mean == 1 && std == 0, "LayerNorm weights start at 1");
    /* reproducible from the rng; NULL leaves zeros */
    cm_model *m2 = new_model(&c, 7), *z;
    cr_assert_eq(memcmp(cm_module_unit(root, 1)->params, cm_module_unit(cm_model_module(m2), 1)->params,
                        sizeof(float) * (size_t)cm_module_unit(root, 1)->numel),
                 0);
    cr_assert_eq(cm_gpt2_new(&c, NULL, &z), CM_OK);
    stats(cm_module_find_param(cm_model_module(z), "transformer.wte.weight"), &mean, &std);
    cr_assert(mean == 0 && std == 0);
    cm_model_free(z);
    cm_model_free(m2);
    cm_model_free(m);
}

/* ---- the model interface ---- */

typedef struct {
    const char *names[3];
    cm_tensor *fields[3];
    cm_model_batch b;
} batch;

static void make_batch(batch *bt, cm_tensor *ids, cm_tensor *labels) {
    bt->names[0] = "input_ids", bt->names[1] = "labels";
    bt->fields[0] = ids, bt->fields[1] = labels;
    bt->b = (cm_model_batch){bt->names, bt->fields, 2, cm_tensor_dim(ids, 0), cm_tensor_numel(ids)};
}

Test(zoo_gpt2, loss_ignores_minus_100_and_metrics_and_flops_are_reported) {
    cm_gpt2_config c = tiny_cfg();
    cm_model *m = new_model(&c, 2);
    cm_tape *tp = cmt_tape();
    const int64_t s[2] = {2, 5};
    cm_tensor *ids = cmt_randint(tp, 2, s, 1, 0, 96), *labels = cm_full(tp, CM_DTYPE_I64, 2, s, -100);
    cm_tensor_set(labels, (int64_t[]){1, 2}, 17);
    batch bt;
    make_batch(&bt, ids, labels);
    cm_tensor *logits = cm_model_forward(m, tp, &bt.b);
    cr_assert(logits, "%s", cm_tape_error(tp));
    cr_assert(cm_tensor_ndim(logits) == 3 && cm_tensor_dim(logits, 0) == 2 && cm_tensor_dim(logits, 1) == 5 &&
              cm_tensor_dim(logits, 2) == 96);
    cm_tensor *loss = cm_model_loss(m, tp, logits, &bt.b);
    cr_assert(loss, "%s", cm_tape_error(tp));
    /* only position (1, 2) counts: lse - x_17 in double */
    double mx = -INFINITY, se = 0;
    for (int64_t v = 0; v < 96; v++) mx = fmax(mx, cm_tensor_get(logits, (int64_t[]){1, 2, v}));
    for (int64_t v = 0; v < 96; v++) se += exp(cm_tensor_get(logits, (int64_t[]){1, 2, v}) - mx);
    double want = mx + log(se) - cm_tensor_get(logits, (int64_t[]){1, 2, 17});
    cr_assert(fabs(cm_tensor_get_flat(loss, 0) - want) < 1e-5, "loss %.7f vs %.7f (tol 1e-5)",
              cm_tensor_get_flat(loss, 0), want);
    /* every label ignored: NaN, as PyTorch */
    cm_tensor_set(labels, (int64_t[]){1, 2}, -100);
    cr_assert(isnan(cm_tensor_get_flat(cm_model_loss(m, tp, logits, &bt.b), 0)));
    cr_assert_eq(cm_model_n_metrics(m, true), 2);
    cr_assert_str_eq(cm_model_metric(m, true, 0).vt->name, "LanguageCrossEntropy");
    cr_assert_str_eq(cm_model_metric(m, false, 1).vt->name, "LanguagePerplexity");
    /* 6·N·T + 12·L·C·T², N without wpe */
    const double N = (double)cm_gpt2_config_n_params(&c, true), T = 5;
    const double flops = 6 * N * T + 12 * 2 * 32 * T * T;
    cr_assert(fabs(cm_model_flops_per_sample(m, &bt.b) - flops) < 1e-6 * flops, "flops %g vs %g",
              cm_model_flops_per_sample(m, &bt.b), flops);
    cm_tape_free(tp);
    cm_model_free(m);
}

/* cm_gpt2_set_fused_linear_cross_entropy: a forward with gradients stops at ln_f (B, T, C), the
 * loss and every parameter's gradient equal the unfused model's, forwards without gradients give
 * logits, and the training metrics read the fused loss (an error without one). */
static void fused_vs_unfused(bool tied);

Test(zoo_gpt2, fused_linear_cross_entropy_gives_the_same_loss_and_gradients) { fused_vs_unfused(true); }
Test(zoo_gpt2, fused_linear_cross_entropy_with_an_untied_lm_head) { fused_vs_unfused(false); }

static void fused_vs_unfused(bool tied) {
    cm_gpt2_config c = tiny_cfg();
    c.tie_word_embeddings = tied;
    cm_model *m[2] = {new_model(&c, 3), new_model(&c, 3)};
    cr_assert_eq(cm_gpt2_set_fused_linear_cross_entropy(m[1], true, 3), CM_OK, "%s", cm_last_error());
    const int64_t s[2] = {2, 7};
    double loss[2];
    float *grads[2];
    int64_t n = 0;
    for (int k = 0; k < 2; k++) {
        cm_tape *tp = cmt_tape();
        cm_tensor *ids = cmt_randint(tp, 2, s, 5, 0, 96), *labels = cmt_randint(tp, 2, s, 6, 0, 96);
        cm_tensor_set(labels, (int64_t[]){0, 3}, -100);
        batch bt;
        make_batch(&bt, ids, labels);
        cm_tensor *out = cm_model_forward(m[k], tp, &bt.b);
        cr_assert(out, "%s", cm_tape_error(tp));
        cr_assert_eq(cm_tensor_dim(out, 2), k ? 32 : 96, "model %d: outputs of width %lld", k,
                     (long long)cm_tensor_dim(out, 2));
        cm_tensor *l = cm_model_loss(m[k], tp, out, &bt.b);
        cr_assert(l && cm_tape_backward(tp, l) == CM_OK, "%s", cm_tape_error(tp));
        loss[k] = cm_tensor_get_flat(l, 0);
        for (int i = 0; i < 2; i++) {
            cm_metric mt = cm_model_metric(m[k], true, i);
            double st[CM_METRIC_MAX_STATE] = {0};
            cr_assert_eq(cm_metric_update(&mt, out, &bt.b, st), CM_OK, "%s", cm_last_error());
            cr_assert(fabs(st[0] / st[1] - loss[k]) < 1e-6 && st[1] == 13, "model %d: metric %g / %g vs loss %g", k,
                      st[0], st[1], loss[k]);
        }
        if (k) { /* a new forward without its loss: the training metric has nothing to read */
            cm_tensor *again = cm_model_forward(m[k], tp, &bt.b);
            cm_metric mt = cm_model_metric(m[k], true, 0);
            double st[CM_METRIC_MAX_STATE] = {0};
            cr_assert_eq(cm_metric_update(&mt, again, &bt.b, st), CM_ERR_STATE);
            cr_assert(strstr(cm_last_error(), "call the loss first"), "%s", cm_last_error());
        }
        cm_module *root = cm_model_module(m[k]);
        n = 0;
        for (int64_t i = 0; i < cm_module_n_params(root); i++) n += cm_module_param_info(root, i).numel;
        grads[k] = malloc(sizeof(float) * (size_t)n);
        int64_t off = 0;
        for (int64_t i = 0; i < cm_module_n_params(root); i++) {
            cm_param_info p = cm_module_param_info(root, i);
            cm_tensor *g = cm_tensor_grad(p.tensor);
            cr_assert(g, "%s has no gradient", p.name);
            memcpy(grads[k] + off, cm_tensor_data(g), sizeof(float) * (size_t)p.numel);
            off += p.numel;
        }
        /* without gradients: the logits, whatever the setting */
        const bool prev = cm_tape_set_grad_enabled(tp, false);
        cm_tensor *ev = cm_model_forward(m[k], tp, &bt.b);
        cm_tape_set_grad_enabled(tp, prev);
        cr_assert(ev && cm_tensor_dim(ev, 2) == 96, "%s", cm_tape_error(tp));
        cm_tape_free(tp);
    }
    cr_assert(fabs(loss[0] - loss[1]) <= 1e-6 * fabs(loss[0]), "fused loss %.8f vs %.8f", loss[1], loss[0]);
    cmt_assert_close_f32("gradients, fused vs unfused", grads[1], grads[0], n, 1e-7, 1e-5);
    free(grads[0]);
    free(grads[1]);
    cr_assert_eq(cm_gpt2_set_fused_linear_cross_entropy(m[1], true, -1), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "chunk_rows -1"), "%s", cm_last_error());
    cm_model *mlp = NULL;
    cm_mlp_config mc;
    cr_assert_eq(cm_mlp_config_preset("mnist", &mc), CM_OK);
    cr_assert_eq(cm_mlp_model_new(&mc, &mlp), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_gpt2_set_fused_linear_cross_entropy(mlp, true, 0), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "not a GPT-2"), "%s", cm_last_error());
    cm_model_free(mlp);
    cm_model_free(m[0]);
    cm_model_free(m[1]);
}

Test(zoo_gpt2, bad_batches_fail_with_named_errors) {
    cm_gpt2_config c = tiny_cfg();
    cm_model *m = new_model(&c, 2);
    cm_tape *tp = cmt_tape();
    const int64_t s[2] = {1, 4}, longer[2] = {1, 33};
    cm_tensor *ids = cmt_randint(tp, 2, s, 1, 0, 96);
    const char *names[1] = {"tokens"};
    cm_tensor *fields[1] = {ids};
    cm_model_batch b = {names, fields, 1, 1, 4};
    cr_assert_null(cm_model_forward(m, tp, &b));
    cmt_expect_error(tp, NULL, CM_ERR_NOT_FOUND, "'input_ids'", "tokens", NULL);
    cm_tape_reset(tp);
    batch bt;
    make_batch(&bt, cmt_randint(tp, 2, longer, 1, 0, 96), NULL);
    cr_assert_null(cm_model_forward(m, tp, &bt.b));
    cmt_expect_error(tp, NULL, CM_ERR_SHAPE, "33 positions", "n_positions = 32", NULL);
    cm_tape_reset(tp);
    make_batch(&bt, cmt_randint(tp, 2, s, 1, 96, 97), NULL);
    cr_assert_null(cm_model_forward(m, tp, &bt.b));
    cr_assert_eq(cm_tape_status(tp), CM_ERR_INVALID_ARG, "%s", cm_tape_error(tp));
    cm_tape_reset(tp);
    /* labels of the wrong shape */
    const int64_t ls[2] = {1, 3};
    make_batch(&bt, cmt_randint(tp, 2, s, 1, 0, 96), cmt_randint(tp, 2, ls, 1, 0, 96));
    cm_tensor *logits = cm_model_forward(m, tp, &bt.b);
    cr_assert_null(cm_model_loss(m, tp, logits, &bt.b));
    cmt_expect_error(tp, NULL, CM_ERR_SHAPE, "labels (1, 3)", "(1, 4, 96)", NULL);
    cm_tape_free(tp);
    cm_model_free(m);
}

Test(zoo_gpt2, attention_mask_field_hides_padded_keys) {
    cm_gpt2_config c = tiny_cfg();
    cm_model *m = new_model(&c, 3);
    cm_module_train(cm_model_module(m), false);
    cm_tape *tp = cmt_tape();
    const int64_t s[2] = {1, 6};
    cm_tensor *ids = cmt_randint(tp, 2, s, 4, 0, 96), *mask = cm_full(tp, CM_DTYPE_I64, 2, s, 1);
    batch bt;
    make_batch(&bt, ids, NULL);
    cm_tensor *plain = cm_model_forward(m, tp, &bt.b);
    bt.names[1] = "attention_mask", bt.fields[1] = mask;
    cmt_assert_close("all-ones mask changes nothing", cm_model_forward(m, tp, &bt.b), plain, 0, 0);
    /* a causal model never looks right, so padding at the end changes nothing before it */
    cm_tensor_set(mask, (int64_t[]){0, 5}, 0);
    cm_tensor *masked = cm_model_forward(m, tp, &bt.b);
    cmt_assert_close("prefix", cm_narrow(tp, masked, 1, 0, 5), cm_narrow(tp, plain, 1, 0, 5), 1e-6, 1e-6);
    cm_tape_free(tp);
    cm_model_free(m);
}

/* ---- gradients ---- */

typedef struct {
    cm_model *m;
    batch *bt;
} loss_ctx;

static cm_tensor *loss_of(cm_tape *tp, cm_tensor *const *in, void *vctx) {
    loss_ctx *c = vctx;
    return cm_model_loss(c->m, tp, cm_model_forward(c->m, tp, &c->bt->b), &c->bt->b);
}

Test(zoo_gpt2, gradcheck_through_the_loss) {
    cm_gpt2_config c = small_cfg();
    cm_model *m = new_model(&c, 4);
    cm_module *root = cm_model_module(m);
    cm_tape *tp = cmt_tape();
    const int64_t s[2] = {2, 6};
    cm_tensor *ids = cmt_randint(tp, 2, s, 5, 0, 11), *labels = cmt_randint(tp, 2, s, 6, 0, 11);
    cm_tensor_set(labels, (int64_t[]){0, 1}, -100);
    batch bt;
    make_batch(&bt, ids, labels);
    loss_ctx ctx = {m, &bt};
    cmt_gradcheck_opts o = {3e-3, 1e-3, 1e-2, 12};
    /* wte gets gradient from both the embedding and the tied head */
    const char *names[] = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.h.1.attn.c_attn.weight",
                           "transformer.h.0.mlp.c_proj.bias", "transformer.ln_f.weight"};
    for (int i = 0; i < 5; i++) {
        cm_tensor *in[1] = {cm_module_find_param(root, names[i])};
        cmt_gradcheck(names[i], loss_of, &ctx, 1, in, &o);
    }
    cm_tape_free(tp);
    cm_model_free(m);
}

Test(zoo_gpt2, dropout_is_active_in_training_and_reproducible_from_the_seed) {
    cm_gpt2_config c = tiny_cfg();
    c.embd_pdrop = c.attn_pdrop = c.resid_pdrop = 0.3f;
    cm_model *m = new_model(&c, 5);
    cm_module *root = cm_model_module(m);
    cm_tape *tp = cmt_tape();
    const int64_t s[2] = {2, 7};
    batch bt;
    make_batch(&bt, cmt_randint(tp, 2, s, 7, 0, 96), NULL);
    cm_module_set_seed(root, 11);
    cm_tensor *a = cm_model_forward(m, tp, &bt.b), *b = cm_model_forward(m, tp, &bt.b);
    cr_assert(a && b, "%s", cm_tape_error(tp));
    double diff = 0;
    for (int64_t i = 0; i < cm_tensor_numel(a); i++) diff += fabs(cm_tensor_get_flat(a, i) - cm_tensor_get_flat(b, i));
    cr_assert(diff > 0, "two training forwards draw different masks");
    cm_module_set_seed(root, 11);
    cmt_assert_close("same seed, same masks", cm_model_forward(m, tp, &bt.b), a, 0, 0);
    cm_module_train(root, false);
    cmt_assert_close("eval is deterministic", cm_model_forward(m, tp, &bt.b), cm_model_forward(m, tp, &bt.b), 0, 0);
    cm_tape_free(tp);
    cm_model_free(m);
}

Test(zoo_gpt2, a_few_sgd_steps_lower_the_loss) {
    cm_gpt2_config c = tiny_cfg();
    cm_model *m = new_model(&c, 6);
    cm_module *root = cm_model_module(m);
    cm_tape *tp = cmt_tape();
    const int64_t s[2] = {4, 16};
    cm_tensor *ids, *labels;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_I32, 2, s, &ids), CM_OK);
    cr_assert_eq(cm_tensor_new(CM_DTYPE_I32, 2, s, &labels), CM_OK);
    for (int64_t i = 0; i < 64; i++) { /* a learnable pattern: next = (tok * 7 + 3) % 96 */
        int32_t t = (int32_t)((i * 13) % 96);
        ((int32_t *)cm_tensor_data(ids))[i] = t;
        ((int32_t *)cm_tensor_data(labels))[i] = (t * 7 + 3) % 96;
    }
    batch bt;
    make_batch(&bt, ids, labels);
    double first = 0, last = 0;
    for (int step = 0; step < 30; step++) {
        cm_tape_reset(tp);
        cm_module_zero_grad(root);
        cm_tensor *loss = cm_model_loss(m, tp, cm_model_forward(m, tp, &bt.b), &bt.b);
        cr_assert(loss && cm_tape_backward(tp, loss) == CM_OK, "%s", cm_tape_error(tp));
        if (step == 0) first = cm_tensor_get_flat(loss, 0);
        last = cm_tensor_get_flat(loss, 0);
        for (int u = 0; u < cm_module_n_units(root); u++) {
            const cm_unit_info *ui = cm_module_unit(root, u);
            for (int64_t i = 0; i < ui->numel; i++) ui->params[i] -= 0.5f * ui->grads[i];
        }
    }
    cr_assert(first > 4.0 && last < first - 1.0, "loss %g -> %g after 30 steps", first, last);
    cm_tensor_free(ids);
    cm_tensor_free(labels);
    cm_tape_free(tp);
    cm_model_free(m);
}

/* ---- weights in and out ---- */

static void assert_same_params(cm_module *a, cm_module *b) {
    cr_assert_eq(cm_module_n_params(a), cm_module_n_params(b));
    for (int64_t i = 0; i < cm_module_n_params(a); i++) {
        cm_param_info pa = cm_module_param_info(a, i), pb = cm_module_param_info(b, i);
        cr_assert_str_eq(pa.name, pb.name);
        cmt_assert_close(pa.name, pa.tensor, pb.tensor, 0, 0);
    }
}

Test(zoo_gpt2, save_then_load_round_trips_with_hugging_face_names) {
    cm_gpt2_config c = tiny_cfg();
    cm_model *a = new_model(&c, 8), *b;
    char path[256];
    tmp_path(path, sizeof path, "rt.safetensors");
    cr_assert_eq(cm_gpt2_save_safetensors(a, path), CM_OK, "%s", cm_last_error());
    cm_safetensors *st;
    cr_assert_eq(cm_safetensors_open(path, &st), CM_OK);
    cr_assert_eq(cm_safetensors_count(st), (size_t)cm_module_n_params(cm_model_module(a)));
    cr_assert_not_null(cm_safetensors_find(st, "transformer.h.1.mlp.c_fc.weight"));
    cr_assert_null(cm_safetensors_find(st, "lm_head.weight"), "a tied head is not stored (as save_pretrained)");
    cr_assert_str_eq(cm_safetensors_metadata_get(st, "format"), "pt");
    cm_safetensors_close(st);
    cr_assert_eq(cm_gpt2_new(&c, NULL, &b), CM_OK);
    cm_load_report rep;
    cr_assert_eq(cm_gpt2_load_safetensors(b, path, NULL, &rep), CM_OK, "%s", cm_last_error());
    cr_assert_eq(rep.n_loaded, 28);
    assert_same_params(cm_model_module(a), cm_model_module(b));
    remove(path);
    cm_model_free(a);
    cm_model_free(b);
}

/* Writes a's parameters to path: names transformed by fn (NULL = dropped), plus `extra` names. */
typedef const char *(*name_fn)(const char *name, char *buf);
static void write_variant(cm_model *a, const char *path, name_fn fn, const char *const *extra, int n_extra) {
    cm_module *root = cm_model_module(a);
    cm_safetensors_writer *w;
    cr_assert_eq(cm_safetensors_writer_new(&w), CM_OK);
    char buf[256];
    for (int64_t i = 0; i < cm_module_n_params(root); i++) {
        cm_param_info p = cm_module_param_info(root, i);
        const char *name = fn(p.name, buf);
        if (name) cr_assert_eq(cm_safetensors_writer_add(w, name, p.tensor), CM_OK, "%s", cm_last_error());
    }
    cm_tensor *x;
    const int64_t one[1] = {3};
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 1, one, &x), CM_OK);
    for (int i = 0; i < n_extra; i++) cr_assert_eq(cm_safetensors_writer_add(w, extra[i], x), CM_OK);
    cr_assert_eq(cm_safetensors_writer_write(w, path), CM_OK, "%s", cm_last_error());
    cm_tensor_free(x);
    cm_safetensors_writer_free(w);
}

static const char *drop_some(const char *name, char *buf) {
    return strstr(name, "h.1.ln_2") || strstr(name, "wpe") ? NULL : name;
}
static const char *strip_prefix(const char *name, char *buf) {
    return strncmp(name, "transformer.", 12) ? name : name + 12;
}

Test(zoo_gpt2, strict_load_names_missing_and_unexpected_keys) {
    cm_gpt2_config c = tiny_cfg();
    cm_model *a = new_model(&c, 9), *b = new_model(&c, 10);
    char path[256];
    tmp_path(path, sizeof path, "strict.safetensors");
    const char *extra[2] = {"transformer.h.0.attn.rotary", "transformer.h.0.attn.bias"};
    write_variant(a, path, drop_some, extra, 2);
    float before = cm_module_unit(cm_model_module(b), 1)->params[0];
    cm_load_report rep;
    cr_assert_eq(cm_gpt2_load_safetensors(b, path, NULL, &rep), CM_ERR_NOT_FOUND);
    const char *e = cm_last_error();
    cr_assert(strstr(e, "transformer.wpe.weight") && strstr(e, "transformer.h.1.ln_2.weight") &&
                  strstr(e, "transformer.h.1.ln_2.bias") && strstr(e, "transformer.h.0.attn.rotary"),
              "%s", e);
    cr_assert_null(strstr(e, "attn.bias"), "the mask buffer is ignored: %s", e);
    cr_assert(rep.n_missing == 3 && rep.n_unexpected == 1, "missing %lld unexpected %lld", (long long)rep.n_missing,
              (long long)rep.n_unexpected);
    cr_assert_eq(cm_module_unit(cm_model_module(b), 1)->params[0], before, "a failed load changes nothing");
    /* non-strict loads the rest; the caller's ignore globs are honoured */
    cm_load_opts o = cm_load_opts_default();
    o.strict = false;
    cr_assert_eq(cm_gpt2_load_safetensors(b, path, &o, &rep), CM_OK, "%s", cm_last_error());
    cr_assert_eq(rep.n_loaded, 25);
    const char *ign[2] = {"*.rotary", "*h.1.ln_2.*"};
    o = cm_load_opts_default();
    o.ignore = ign, o.n_ignore = 2;
    cr_assert_eq(cm_gpt2_load_safetensors(b, path, &o, &rep), CM_ERR_NOT_FOUND);
    cr_assert(rep.n_missing == 1 && rep.n_unexpected == 0 && strstr(rep.missing, "wpe"), "%s", rep.missing);
    remove(path);
    cm_model_free(a);
    cm_model_free(b);
}

Test(zoo_gpt2, loads_gpt2model_names_and_infers_the_config) {
    cm_gpt2_config c = tiny_cfg();
    cm_model *a = new_model(&c, 11), *b;
    char path[256];
    tmp_path(path, sizeof path, "bare.safetensors");
    const char *extra[3] = {"h.0.attn.bias", "h.1.attn.masked_bias", "lm_head.weight"};
    write_variant(a, path, strip_prefix, extra, 2); /* as the hub's gpt2/model.safetensors */
    cm_gpt2_config inferred;
    cr_assert_eq(cm_gpt2_config_from_safetensors(path, &inferred), CM_OK, "%s", cm_last_error());
    cr_assert(inferred.vocab_size == 96 && inferred.n_positions == 32 && inferred.n_embd == 32);
    cr_assert(inferred.n_layer == 2 && inferred.bias && inferred.tie_word_embeddings);
    cr_assert_eq(inferred.n_head, 1, "no record: heads of 64, one for n_embd 32");
    cr_assert_eq(cm_gpt2_new(&c, NULL, &b), CM_OK);
    cr_assert_eq(cm_gpt2_load_safetensors(b, path, NULL, NULL), CM_OK, "%s", cm_last_error());
    assert_same_params(cm_model_module(a), cm_model_module(b));
    remove(path);
    cr_assert_eq(cm_gpt2_config_from_safetensors(path, &inferred), CM_ERR_IO);
    cm_model_free(a);
    cm_model_free(b);
}

/* n_head is the one size the shapes do not tell: cm_gpt2_save_safetensors records it. */
Test(zoo_gpt2, saved_files_record_n_head) {
    cm_gpt2_config c = tiny_cfg(); /* n_embd 32 in 4 heads: heads of 64 would say 1 */
    cr_assert_eq(c.n_head, 4);
    cm_model *a = new_model(&c, 13);
    char path[256];
    tmp_path(path, sizeof path, "heads.safetensors");
    cr_assert_eq(cm_gpt2_save_safetensors(a, path), CM_OK, "%s", cm_last_error());
    cm_gpt2_config inferred;
    cr_assert_eq(cm_gpt2_config_from_safetensors(path, &inferred), CM_OK, "%s", cm_last_error());
    cr_assert(inferred.n_head == 4 && inferred.n_embd == 32 && inferred.n_layer == 2, "n_head %lld",
              (long long)inferred.n_head);
    const char *bad[2] = {CM_GPT2_N_HEAD_METADATA_KEY, "5"};
    cr_assert_eq(cm_module_save_safetensors_with(cm_model_module(a), path, bad, 1), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_gpt2_config_from_safetensors(path, &inferred), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "gpt2_n_head = '5' is not a head count dividing n_embd 32"), "%s", cm_last_error());
    remove(path);
    cm_model_free(a);
}

Test(zoo_gpt2, a_size_mismatch_names_both_shapes) {
    cm_gpt2_config c = tiny_cfg();
    cm_model *a = new_model(&c, 12), *b;
    c.vocab_size = 65;
    cr_assert_eq(cm_gpt2_new(&c, NULL, &b), CM_OK);
    char path[256];
    tmp_path(path, sizeof path, "shape.safetensors");
    cr_assert_eq(cm_gpt2_save_safetensors(a, path), CM_OK);
    cr_assert_eq(cm_gpt2_load_safetensors(b, path, NULL, NULL), CM_ERR_SHAPE);
    cr_assert(strstr(cm_last_error(), "transformer.wte.weight") && strstr(cm_last_error(), "(96, 32)") &&
                  strstr(cm_last_error(), "(65, 32)"),
              "%s", cm_last_error());
    /* not a GPT-2 */
    cm_module *lin;
    cm_nn_linear_new(2, 2, true, NULL, &lin);
    cm_model *cls;
    cr_assert_eq(cm_model_classifier_new(lin, NULL, &cls), CM_OK);
    cr_assert_eq(cm_gpt2_load_safetensors(cls, path, NULL, NULL), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "ComposerClassifier"), "%s", cm_last_error());
    cr_assert_eq(cm_gpt2_save_safetensors(cls, path), CM_ERR_INVALID_ARG);
    cr_assert(!cm_model_is_gpt2(cls) && !cm_gpt2_model_config(cls));
    remove(path);
    cm_model_free(cls);
    cm_model_free(a);
    cm_model_free(b);
}

/* ---- generation ---- */

static void generate(cm_model *m, const int64_t *prompt, int64_t n_prompt, int64_t n_new,
                     const cm_gpt2_generate_config *gc, int64_t *out) {
    int64_t n_out = -1;
    cr_assert_eq(cm_gpt2_generate(m, prompt, n_prompt, n_new, gc, out, &n_out), CM_OK, "%s", cm_last_error());
    cr_assert_eq(n_out, n_new);
}

static void assert_same_tokens(const char *what, const int64_t *a, const int64_t *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(a[i], b[i], "%s: token %lld differs: %lld vs %lld", what, (long long)i, (long long)a[i],
                     (long long)b[i]);
}

Test(zoo_gpt2, kv_cache_equals_recomputation_token_for_token_across_the_window) {
    cm_gpt2_config c = tiny_cfg();
    c.initializer_range = 0.3f; /* confident, varied predictions */
    c.embd_pdrop = c.attn_pdrop = c.resid_pdrop = 0.1f;
    cm_model *m = new_model(&c, 13);
    const int64_t prompt[5] = {1, 50, 7, 90, 3};
    int64_t a[40], b[40];
    cm_gpt2_generate_config gc = cm_gpt2_generate_config_default();
    gc.temperature = 0;
    generate(m, prompt, 5, 40, &gc, a); /* 45 tokens: beyond n_positions = 32 */
    gc.use_cache = false;
    generate(m, prompt, 5, 40, &gc, b);
    assert_same_tokens("greedy, cache vs recompute", a, b, 40);
    bool varied = false;
    for (int i = 1; i < 40; i++) varied |= a[i] != a[0];
    cr_assert(varied, "the greedy continuation is not constant");
    cr_assert(cm_module_is_training(cm_model_module(m)), "the training mode is restored");
    /* sampled: the same draws with and without the cache */
    gc = cm_gpt2_generate_config_default();
    gc.temperature = 0.9f, gc.top_k = 10, gc.seed = 5;
    generate(m, prompt, 5, 40, &gc, a);
    gc.use_cache = false;
    generate(m, prompt, 5, 40, &gc, b);
    assert_same_tokens("top-k sampling, cache vs recompute", a, b, 40);
    /* a prompt longer than the window is cropped */
    int64_t long_prompt[40];
    for (int i = 0; i < 40; i++) long_prompt[i] = (i * 17) % 96;
    gc = cm_gpt2_generate_config_default();
    gc.temperature = 0;
    generate(m, long_prompt, 40, 3, &gc, a);
    generate(m, long_prompt + 8, 32, 3, &gc, b);
    assert_same_tokens("cropped prompt", a, b, 3);
    cm_model_free(m);
}

Test(zoo_gpt2, sampling_is_reproducible_from_the_seed) {
    cm_gpt2_config c = tiny_cfg();
    cm_model *m = new_model(&c, 14);
    const int64_t prompt[1] = {0};
    int64_t a[30], b[30], d[30];
    cm_gpt2_generate_config gc = cm_gpt2_generate_config_default();
    gc.seed = 77;
    generate(m, prompt, 1, 30, &gc, a);
    generate(m, prompt, 1, 30, &gc, b);
    assert_same_tokens("same seed", a, b, 30);
    gc.seed = 78;
    generate(m, prompt, 1, 30, &gc, d);
    int same = 0;
    for (int i = 0; i < 30; i++) same += a[i] == d[i];
    cr_assert(same < 10, "another seed gives another sample (%d of 30 equal)", same);
    /* top_k = 1 is greedy */
    gc.top_k = 1;
    generate(m, prompt, 1, 30, &gc, a);
    gc = cm_gpt2_generate_config_default();
    gc.temperature = 0;
    generate(m, prompt, 1, 30, &gc, b);
    assert_same_tokens("top_k 1 vs greedy", a, b, 30);
    cm_model_free(m);
}

static bool stop_after_3(int64_t tok, int64_t index, void *data) {
    int64_t *seen = data;
    seen[index] = tok;
    return index < 2;
}

Test(zoo_gpt2, generation_stops_at_eos_or_callback_and_checks_arguments) {
    cm_gpt2_config c = tiny_cfg();
    cm_model *m = new_model(&c, 15);
    const int64_t prompt[2] = {4, 5};
    int64_t out[10], ref[10], seen[10], n_out;
    cm_gpt2_generate_config gc = cm_gpt2_generate_config_default();
    gc.temperature = 0;
    generate(m, prompt, 2, 10, &gc, ref);
    gc.eos_token = ref[4];
    int64_t first = 0;
    while (ref[first] != ref[4]) first++;
    cr_assert_eq(cm_gpt2_generate(m, prompt, 2, 10, &gc, out, &n_out), CM_OK);
    cr_assert_eq(n_out, first + 1, "stops after the eos token: %lld tokens", (long long)n_out);
    gc.eos_token = -1;
    gc.on_token = stop_after_3, gc.data = seen;
    cr_assert_eq(cm_gpt2_generate(m, prompt, 2, 10, &gc, out, &n_out), CM_OK);
    cr_assert_eq(n_out, 3);
    assert_same_tokens("callback sees each token", seen, out, 3);
    cr_assert_eq(cm_gpt2_generate(m, prompt, 2, 0, &gc, out, &n_out), CM_OK);
    cr_assert_eq(n_out, 0);
    /* errors */
    const int64_t bad[2] = {4, 96};
    cr_assert_eq(cm_gpt2_generate(m, bad, 2, 3, NULL, out, &n_out), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "token 96 at position 1"), "%s", cm_last_error());
    cr_assert_eq(cm_gpt2_generate(m, prompt, 0, 3, NULL, out, &n_out), CM_ERR_INVALID_ARG);
    gc = cm_gpt2_generate_config_default();
    gc.top_p = 0;
    cr_assert_eq(cm_gpt2_generate(m, prompt, 2, 3, &gc, out, &n_out), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "top_p"), "%s", cm_last_error());
    gc = cm_gpt2_generate_config_default();
    gc.temperature = -1;
    cr_assert_eq(cm_gpt2_generate(m, prompt, 2, 3, &gc, out, &n_out), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_gpt2_generate(NULL, prompt, 2, 3, NULL, out, &n_out), CM_ERR_INVALID_ARG);
    cm_model_free(m);
}

Test(zoo_gpt2, sample_respects_temperature_top_k_and_top_p) {
    /* probabilities ∝ exp(logits): token 2 ≫ 0 > 1 ≫ others */
    float logits[6] = {2.0f, 1.5f, 4.0f, -3.0f, -3.0f, -3.0f};
    cm_rng rng = cm_rng_init(3, 0);
    cm_gpt2_generate_config gc = cm_gpt2_generate_config_default();
    int64_t tok, counts[6] = {0};
    gc.temperature = 0;
    cr_assert_eq(cm_gpt2_sample(logits, 6, &gc, &rng, &tok), CM_OK);
    cr_assert_eq(tok, 2);
    cr_assert_eq(rng.counter, 0, "greedy draws nothing");
    gc.temperature = 1, gc.top_k = 2;
    for (int i = 0; i < 400; i++) {
        cr_assert_eq(cm_gpt2_sample(logits, 6, &gc, &rng, &tok), CM_OK);
        counts[tok]++;
    }
    cr_assert(counts[0] > 20 && counts[2] > 250 && counts[1] + counts[3] + counts[4] + counts[5] == 0,
              "top-2 keeps tokens 2 and 0: counts %lld %lld %lld", (long long)counts[0], (long long)counts[1],
              (long long)counts[2]);
    /* top_p 0.8: p(2) ≈ 0.80 < 0.8·sum? p = [.11 .07 .82 ...] → token 2 alone reaches 0.8 */
    memset(counts, 0, sizeof counts);
    gc.top_k = 0, gc.top_p = 0.8f;
    for (int i = 0; i < 100; i++) {
        cm_gpt2_sample(logits, 6, &gc, &rng, &tok);
        counts[tok]++;
    }
    cr_assert_eq(counts[2], 100, "top_p keeps the smallest set reaching 0.8");
    /* a high temperature flattens: every token appears */
    memset(counts, 0, sizeof counts);
    gc.top_p = 1, gc.temperature = 50;
    for (int i = 0; i < 600; i++) {
        cm_gpt2_sample(logits, 6, &gc, &rng, &tok);
        counts[tok]++;
    }
    for (int i = 0; i < 6; i++)
        cr_assert(counts[i] > 50, "temperature 50: token %d drawn %lld times", i, (long long)counts[i]);
    logits[3] = NAN;
    cr_assert_eq(cm_gpt2_sample(logits, 6, &gc, &rng, &tok), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "NaN"), "%s", cm_last_error());
}

Test(zoo_gpt2, a_stored_lm_head_loads_into_the_tied_wte_and_wte_wins_when_both_are_stored) {
    cm_gpt2_config c = tiny_cfg();
    cm_model *a = new_model(&c, 16), *other = new_model(&c, 17), *b;
    cm_module *ra = cm_model_module(a);
    cm_tensor *other_wte = cm_module_find_param(cm_model_module(other), "transformer.wte.weight");
    char path[256];
    tmp_path(path, sizeof path, "head.safetensors");
    cm_safetensors_writer *w;
    for (int variant = 0; variant < 2; variant++) {
        cr_assert_eq(cm_safetensors_writer_new(&w), CM_OK);
        for (int64_t i = 0; i < cm_module_n_params(ra); i++) {
            cm_param_info p = cm_module_param_info(ra, i);
            /* variant 0: only lm_head.weight holds the embedding; 1: both, with different values */
            if (i == 0 && variant == 0)
                cr_assert_eq(cm_safetensors_writer_add(w, "lm_head.weight", p.tensor), CM_OK);
            else
                cr_assert_eq(cm_safetensors_writer_add(w, p.name, p.tensor), CM_OK);
        }
        if (variant == 1) cr_assert_eq(cm_safetensors_writer_add(w, "lm_head.weight", other_wte), CM_OK);
        cr_assert_eq(cm_safetensors_writer_write(w, path), CM_OK);
        cm_safetensors_writer_free(w);
        cr_assert_eq(cm_gpt2_new(&c, NULL, &b), CM_OK);
        cr_assert_eq(cm_gpt2_load_safetensors(b, path, NULL, NULL), CM_OK, "variant %d: %s", variant, cm_last_error());
        assert_same_params(ra, cm_model_module(b));
        cm_model_free(b);
    }
    remove(path);
    cm_model_free(a);
    cm_model_free(other);
}

Test(zoo_gpt2, out_of_memory_anywhere_fails_cleanly) {
    cm_gpt2_config c = tiny_cfg();
    c.n_layer = 1;
    int failures = 0;
    cm_model *m = NULL;
    for (int64_t n = 1; n < 5000; n++) {
        cm_rng rng = cm_rng_init(1, 0);
        cm_alloc_fail_at(n);
        cm_status st = cm_gpt2_new(&c, &rng, &m);
        cm_alloc_fail_at(0);
        if (st == CM_OK) break;
        cr_assert_eq(st, CM_ERR_OOM, "allocation %lld: %s", (long long)n, cm_last_error());
        cr_assert_null(m);
        failures++;
    }
    cr_assert(m && failures > 20, "only %d allocations could fail", failures);
    const int64_t prompt[2] = {1, 2};
    int64_t out[4], n_out, ref[4];
    cm_gpt2_generate_config gc = cm_gpt2_generate_config_default();
    gc.top_k = 5;
    cr_assert_eq(cm_gpt2_generate(m, prompt, 2, 4, &gc, ref, &n_out), CM_OK);
    failures = 0;
    for (int64_t n = 1; n < 5000; n++) {
        cm_alloc_fail_at(n);
        cm_status st = cm_gpt2_generate(m, prompt, 2, 4, &gc, out, &n_out);
        cm_alloc_fail_at(0);
        if (st == CM_OK) break;
        cr_assert_eq(st, CM_ERR_OOM, "allocation %lld: %s", (long long)n, cm_last_error());
        failures++;
    }
    cr_assert(failures > 3, "only %d allocations could fail", failures);
    assert_same_tokens("after the failures", out, ref, 4);
    char path[256];
    tmp_path(path, sizeof path, "oom.safetensors");
    cr_assert_eq(cm_gpt2_save_safetensors(m, path), CM_OK);
    cm_model *b;
    cr_assert_eq(cm_gpt2_new(&c, NULL, &b), CM_OK);
    failures = 0;
    for (int64_t n = 1; n < 5000; n++) {
        cm_alloc_fail_at(n);
        cm_status st = cm_gpt2_load_safetensors(b, path, NULL, NULL);
        cm_alloc_fail_at(0);
        if (st == CM_OK) break;
        cr_assert_eq(st, CM_ERR_OOM, "allocation %lld: %s", (long long)n, cm_last_error());
        failures++;
    }
    cr_assert(failures > 2, "only %d allocations could fail", failures);
    assert_same_params(cm_model_module(m), cm_model_module(b));
    remove(path);
    cm_model_free(b);
    cm_model_free(m);
}

/* Memory: a training forward + loss under bf16 autocast keeps no more tape than in f32 (linear's
 * bf16 copies are scratch, made again in backward; attention keeps no probabilities), and the
 * backward of both precisions needs the same gradient pool (the logits' reshape shares their
 * gradient). Same model, same batch, fresh tapes. */
Test(zoo_gpt2, autocast_keeps_no_more_tape_than_f32) {
    cm_gpt2_config c = tiny_cfg();
    c.embd_pdrop = c.attn_pdrop = c.resid_pdrop = 0.1f;
    cm_model *m = new_model(&c, 3);
    size_t used[2], pool[2];
    for (int amp = 0; amp < 2; amp++) {
        cm_tape *tp = cmt_tape();
        const int64_t s[2] = {4, 16};
        cm_tensor *ids = cmt_randint(tp, 2, s, 1, 0, 96), *labels = cmt_randint(tp, 2, s, 2, 0, 96);
        batch bt;
        make_batch(&bt, ids, labels);
        const size_t before = cm_arena_used(cm_tape_arena(tp));
        if (amp) cm_tape_set_autocast(tp, CM_DTYPE_BF16);
        cm_tensor *loss = cm_model_loss(m, tp, cm_model_forward(m, tp, &bt.b), &bt.b);
        cr_assert(loss, "%s", cm_tape_error(tp));
        used[amp] = cm_arena_used(cm_tape_arena(tp)) - before;
        cr_assert_eq(cm_tape_backward(tp, loss), CM_OK, "%s", cm_tape_error(tp));
        pool[amp] = 0;
        for (int i = 0; i < tp->n_gblocks; i++) pool[amp] += tp->gblocks[i].bytes;
        cm_tape_free(tp);
    }
    cr_assert_leq(used[1], used[0], "autocast forward kept %zu bytes, f32 %zu", used[1], used[0]);
    cr_assert_eq(pool[1], pool[0], "gradient pool: autocast %zu bytes, f32 %zu", pool[1], pool[0]);
    cm_model_free(m);
}
