/* Model surgery: replacing every matching module (fresh replacements and wrappers that adopt the
 * old module), the count, re-packing that preserves untouched parameters and re-links gradients,
 * slots so the parent's forward calls the replacement, and the errors: after an optimizer locked
 * the model, a failing make function, a tied parameter, a bad replacement. */
#include "cmtest.h"

#include <composer/nn.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* Linear(4, 8) -> Tanh -> LayerNorm(8) -> Linear(8, 3), finalized. */
static cm_module *mlp(void) {
    cm_rng rng = cm_rng_init(2, 0);
    cm_module *seq, *a, *b, *c, *d;
    cm_nn_sequential_new(&seq);
    cm_nn_linear_new(4, 8, true, &rng, &a);
    cm_nn_activation_new(CM_ACT_TANH, &b);
    cm_nn_layer_norm_new(8, 1e-5f, true, &c);
    cm_nn_linear_new(8, 3, true, &rng, &d);
    cm_nn_sequential_append(seq, a);
    cm_nn_sequential_append(seq, b);
    cm_nn_sequential_append(seq, c);
    cm_nn_sequential_append(seq, d);
    /* non-default LayerNorm values, to see them survive re-packing */
    cm_rng r2 = cm_rng_init(3, 0);
    cm_tensor_init_normal(cm_module_param(c, "weight"), &r2, 1.0f, 0.2f);
    cm_tensor_init_normal(cm_module_param(c, "bias"), &r2, 0.0f, 0.2f);
    cr_assert_eq(cm_module_finalize(seq), CM_OK);
    return seq;
}

/* "Scaled": 2 · base(x), adopting the replaced module as child "base". */
typedef struct {
    cm_module *base;
} scaled_s;

static cm_tensor *scaled_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    scaled_s *s = cm_module_self(m);
    return cm_mul_scalar(tp, cm_module_forward(s->base, tp, in[0]), 2.0f);
}
static void scaled_free(void *self) { cm_free(self); }
static const cm_module_i scaled_vt = {CM_MODULE_ABI, "Scaled", scaled_fwd, scaled_free, NULL};

typedef struct {
    const char *type; /* match modules of this type */
    int calls;        /* make calls */
    int fail_at;      /* make fails on this call (1-based; 0 = never) */
    char paths[8][64];
} sctx;

static bool match_type(cm_module *m, const char *path, void *data) {
    return !strcmp(cm_module_type_name(m), ((sctx *)data)->type);
}

static cm_status make_scaled(cm_module *old, const char *path, void *data, cm_module **out) {
    sctx *c = data;
    if (c->calls < 8) snprintf(c->paths[c->calls], 64, "%s", path);
    if (++c->calls == c->fail_at) return cm_set_error(CM_ERR_UNSUPPORTED, "make refuses '%s'", path);
    scaled_s *s = cm_alloc_zeroed(sizeof *s, 8);
    cm_status st = cm_module_new(&scaled_vt, s, out);
    if (st) {
        cm_free(s);
        return st;
    }
    if ((st = cm_module_add_child(*out, "base", old, &s->base))) cm_module_free(*out);
    return st;
}

Test(surgery, replace_every_linear_with_a_wrapper_and_repack) {
    cm_module *m = mlp();
    cm_tape *tp = cmt_tape();
    const int64_t xs[2] = {5, 4};
    cm_tensor *x = cmt_randn(tp, 2, xs, 1, false);
    cm_tensor *lnw = cm_module_find_param(m, "2.weight");
    float ln_before[8];
    memcpy(ln_before, cm_tensor_data(lnw), sizeof ln_before);
    /* expected: the same network with each Linear's output doubled */
    cm_tensor *h = cm_mul_scalar(tp, cm_linear(tp, x, cm_module_find_param(m, "0.weight"), cm_module_find_param(m, "0.bias")), 2);
    h = cm_layer_norm(tp, cm_tanh(tp, h), lnw, cm_module_find_param(m, "2.bias"), 1e-5f);
    cm_tensor *want = cm_clone_detached(
        tp, cm_mul_scalar(tp, cm_linear(tp, h, cm_module_find_param(m, "3.weight"), cm_module_find_param(m, "3.bias")), 2));

    sctx c = {"Linear", 0, 0, {{0}}};
    int64_t n = 0;
    cr_assert_eq(cm_module_replace(m, match_type, make_scaled, &c, &n), CM_OK, "%s", cm_last_error());
    cr_assert_eq(n, 2, "replaced %lld", (long long)n);
    cr_assert_str_eq(c.paths[0], "0");
    cr_assert_str_eq(c.paths[1], "3");
    cr_assert_str_eq(cm_module_type_name(cm_module_child_at(m, 0)), "Scaled");
    /* the tree was re-packed: new names, same count, values kept, views into the new flat buffer */
    cr_assert(cm_module_is_finalized(m));
    cr_assert_eq(cm_module_n_params(m), 6);
    cr_assert_str_eq(cm_module_param_info(m, 0).name, "0.base.weight");
    cr_assert_eq(cm_module_param_index(m, "3.base.bias"), 5);
    cr_assert_eq(cm_module_find_param(m, "2.weight"), lnw, "untouched parameters keep their tensor");
    cmt_assert_close_f32("untouched LayerNorm weight", cm_tensor_data(lnw), ln_before, 8, 0, 0);
    cm_param_info p = cm_module_param_info(m, 2);
    cr_assert_eq((float *)cm_tensor_data(p.tensor), cm_module_unit(m, 0)->params + p.offset);
    /* the Sequential's forward now goes through the wrappers */
    cm_tensor *y = cm_module_forward(m, tp, x);
    cr_assert(y, "%s", cm_tape_error(tp));
    cmt_assert_close("forward after surgery", y, want, 1e-6, 1e-5);
    /* gradients land in the new flat buffer */
    cr_assert_eq(cm_tape_backward(tp, cm_sum(tp, y, NULL, 0, false)), CM_OK);
    double s = 0;
    for (int64_t i = 0; i < cm_module_unit(m, 0)->numel; i++) s += fabs(cm_module_unit(m, 0)->grads[i]);
    cr_assert(s > 0);
    cr_assert_eq((float *)cm_tensor_data(cm_tensor_grad(p.tensor)), cm_module_unit(m, 0)->grads + p.offset);
    /* nothing left to match: a second pass replaces the wrappers' bases (they are Linear) only if asked */
    c = (sctx){"Nope", 0, 0, {{0}}};
    cr_assert_eq(cm_module_replace(m, match_type, make_scaled, &c, &n), CM_OK);
    cr_assert_eq(n, 0);
    cm_module_free(m);
    cm_tape_free(tp);
}

/* A fresh Linear (weights copied, transposed) for each Conv1D. */
static cm_status conv1d_to_linear(cm_module *old, const char *path, void *data, cm_module **out) {
    int64_t in, outf;
    bool tr;
    cm_status st = cm_nn_linear_dims(old, &in, &outf, &tr);
    if (st) return st;
    if ((st = cm_nn_linear_new(in, outf, true, NULL, out))) return st;
    cm_tape *tp;
    cm_tape_new(NULL, &tp);
    cm_tensor_copy(cm_module_param(*out, "weight"), cm_transpose(tp, cm_module_param(old, "weight"), 0, 1));
    cm_tensor_copy(cm_module_param(*out, "bias"), cm_module_param(old, "bias"));
    cm_tape_free(tp);
    return CM_OK;
}

static bool is_conv1d(cm_module *m, const char *path, void *data) {
    ++*(int *)data;
    return !strcmp(cm_module_type_name(m), "Conv1D");
}

Test(surgery, gpt_block_projections_replaced_keep_the_output) {
    cm_nn_attention_config cfg = cm_nn_attention_config_default(8, 2);
    cm_rng rng = cm_rng_init(1, 0);
    cm_module *g;
    cr_assert_eq(cm_nn_gpt_block_new(&cfg, 1, &rng, &g), CM_OK);
    cr_assert_eq(cm_module_finalize(g), CM_OK);
    cm_rng r2 = cm_rng_init(2, 0);
    cm_rng_normal(&r2, cm_module_unit(g, 0)->params, (size_t)cm_module_unit(g, 0)->numel, 0.0f, 0.3f);
    cm_tape *tp = cmt_tape();
    const int64_t xs[3] = {2, 3, 8};
    cm_tensor *x = cmt_randn(tp, 3, xs, 1, false);
    cm_tensor *y0 = cm_clone_detached(tp, cm_module_forward(g, tp, x));
    int visited = 0;
    int64_t n = 0;
    cr_assert_eq(cm_module_replace(g, is_conv1d, conv1d_to_linear, &visited, &n), CM_OK, "%s", cm_last_error());
    cr_assert_eq(n, 4, "c_attn, attn.c_proj, c_fc, mlp.c_proj: %lld", (long long)n);
    cr_assert_str_eq(cm_module_type_name(cm_module_find(g, "attn.c_attn")), "Linear");
    cr_assert_eq(cm_tensor_dim(cm_module_find_param(g, "attn.c_attn.weight"), 0), 24, "now (out, in)");
    cm_tensor *y1 = cm_module_forward(g, tp, x);
    cr_assert(y1, "%s", cm_tape_error(tp));
    cmt_assert_close("block output after surgery", y1, y0, 1e-5, 1e-5);
    cm_module_free(g);
    cm_tape_free(tp);
}

Test(surgery, after_the_optimizer_locked_the_model_is_a_clear_error) {
    cm_module *m = mlp();
    cr_assert_eq(cm_module_lock(m), CM_OK);
    sctx c = {"Linear", 0, 0, {{0}}};
    int64_t n = 5;
    cr_assert_eq(cm_module_replace(m, match_type, make_scaled, &c, &n), CM_ERR_STATE);
    cr_assert(strstr(cm_last_error(), "do model surgery before creating the optimizer"), "%s", cm_last_error());
    cr_assert_eq(n, 0);
    cr_assert_eq(c.calls, 0, "nothing was touched");
    cm_module_unlock(m);
    cr_assert_eq(cm_module_replace(m, match_type, make_scaled, &c, &n), CM_OK);
    cr_assert_eq(n, 2);
    cm_module_free(m);
}

Test(surgery, a_failing_make_stops_and_leaves_a_consistent_packed_tree) {
    cm_module *m = mlp();
    sctx c = {"Linear", 0, 2, {{0}}};
    int64_t n = 0;
    cr_assert_eq(cm_module_replace(m, match_type, make_scaled, &c, &n), CM_ERR_UNSUPPORTED);
    cr_assert(strstr(cm_last_error(), "make refuses '3'"), "%s", cm_last_error());
    cr_assert_eq(n, 1);
    cr_assert(cm_module_is_finalized(m));
    cr_assert_eq(cm_module_param_index(m, "0.base.weight"), 0);
    cr_assert_eq(cm_module_param_index(m, "3.weight"), 4, "the second Linear is still there");
    cm_tape *tp = cmt_tape();
    const int64_t xs[2] = {2, 4};
    cr_assert(cm_module_forward(m, tp, cmt_randn(tp, 2, xs, 1, false)), "%s", cm_tape_error(tp));
    cm_tape_free(tp);
    cm_module_free(m);
}

static cm_module *g_existing; /* what make_bad returns: NULL, or a module already in a tree */

static cm_status make_bad(cm_module *old, const char *path, void *data, cm_module **out) {
    *out = g_existing;
    return CM_OK;
}

Test(surgery, bad_replacements_and_arguments_are_refused) {
    cm_module *m = mlp();
    sctx c = {"Linear", 0, 0, {{0}}};
    cr_assert_eq(cm_module_replace(m, match_type, NULL, &c, NULL), CM_ERR_INVALID_ARG);
    g_existing = NULL;
    cr_assert_eq(cm_module_replace(m, cm_module_match_type, make_bad, NULL, NULL), CM_OK, "matches nothing");
    cr_assert_eq(cm_module_replace(m, match_type, make_bad, &c, NULL), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "returned no module"), "%s", cm_last_error());
    /* returning a module that is already in the tree */
    g_existing = cm_module_child_at(m, 2);
    cr_assert_eq(cm_module_replace(m, cm_module_match_type, make_bad, (void *)"Tanh", NULL), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "already has a parent"), "%s", cm_last_error());
    cr_assert_str_eq(cm_module_type_name(cm_module_child_at(m, 1)), "Tanh", "left in place");
    cr_assert_eq(cm_module_replace(cm_module_child_at(m, 0), match_type, make_scaled, &c, NULL), CM_ERR_INVALID_ARG,
                 "surgery on a non-root");
    cm_module_free(m);
}

Test(surgery, a_module_whose_parameter_is_tied_elsewhere_is_not_replaced) {
    cm_rng rng = cm_rng_init(1, 0);
    cm_module *root, *wte, *head;
    cm_nn_module_list_new(&root);
    cm_nn_embedding_new(10, 4, &rng, &wte);
    cm_nn_linear_new(4, 10, false, NULL, &head);
    cm_module_add_child(root, "wte", wte, NULL);
    cm_module_add_child(root, "lm_head", head, NULL);
    cr_assert_eq(cm_module_tie_param(head, "weight", cm_module_param(wte, "weight")), CM_OK);
    cr_assert_eq(cm_module_finalize(root), CM_OK);
    sctx c = {"Embedding", 0, 0, {{0}}};
    cr_assert_eq(cm_module_replace(root, match_type, make_scaled, &c, NULL), CM_ERR_STATE);
    cr_assert(strstr(cm_last_error(), "tied elsewhere"), "%s", cm_last_error());
    /* replacing the user of the tie is fine (the wrapper keeps the tied Linear as its base) */
    c = (sctx){"Linear", 0, 0, {{0}}};
    int64_t n = 0;
    cr_assert_eq(cm_module_replace(root, match_type, make_scaled, &c, &n), CM_OK, "%s", cm_last_error());
    cr_assert_eq(n, 1);
    cr_assert_eq(cm_module_find_param(root, "lm_head.base.weight"), cm_module_param(wte, "weight"));
    cr_assert_eq(cm_module_n_params(root), 1);
    cm_module_free(root);
}
