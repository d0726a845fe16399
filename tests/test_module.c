/* The module tree: dotted names, flat packing (parameters and gradients alias their unit's flat
 * buffers), wrap units, counting, no-decay groups, freezing, weight tying, train/eval propagation,
 * locking, summaries, errors, and packing under failing allocations. */
#include "cmtest.h"
#include "tensor/tensor_impl.h"

#include <composer/nn.h>
#include <math.h>
#include <string.h>

/* Linear(4, 8) -> ReLU -> LayerNorm(8) -> Linear(8, 3) */
static cm_module *mlp(uint64_t seed) {
    cm_rng rng = cm_rng_init(seed, 0);
    cm_module *seq, *a, *b, *c, *d;
    cr_assert_eq(cm_nn_sequential_new(&seq), CM_OK);
    cr_assert_eq(cm_nn_linear_new(4, 8, true, &rng, &a), CM_OK);
    cr_assert_eq(cm_nn_activation_new(CM_ACT_RELU, &b), CM_OK);
    cr_assert_eq(cm_nn_layer_norm_new(8, 1e-5f, true, &c), CM_OK);
    cr_assert_eq(cm_nn_linear_new(8, 3, true, &rng, &d), CM_OK);
    cm_module *ch[4] = {a, b, c, d};
    for (int i = 0; i < 4; i++) cr_assert_eq(cm_nn_sequential_append(seq, ch[i]), CM_OK, "%s", cm_last_error());
    return seq;
}

/* A GPT-like tree: wte, wpe ("embeddings" unit), h (ModuleList of 2 blocks, each a unit), ln_f. */
static cm_module *tiny_gpt(void) {
    cm_rng rng = cm_rng_init(7, 0);
    cm_module *root, *wte, *wpe, *h, *ln_f;
    cr_assert_eq(cm_nn_module_list_new(&root), CM_OK);
    cr_assert_eq(cm_nn_embedding_new(11, 8, &rng, &wte), CM_OK);
    cr_assert_eq(cm_nn_embedding_new(6, 8, &rng, &wpe), CM_OK);
    cr_assert_eq(cm_nn_module_list_new(&h), CM_OK);
    cr_assert_eq(cm_nn_layer_norm_new(8, 1e-5f, true, &ln_f), CM_OK);
    cm_nn_attention_config cfg = cm_nn_attention_config_default(8, 2);
    for (int i = 0; i < 2; i++) {
        cm_module *blk;
        cr_assert_eq(cm_nn_gpt_block_new(&cfg, 2, &rng, &blk), CM_OK, "%s", cm_last_error());
        cr_assert_eq(cm_module_set_wrap_unit(blk, NULL), CM_OK);
        cr_assert_eq(cm_nn_sequential_append(h, blk), CM_OK);
    }
    cm_module_set_wrap_unit(wte, "embeddings");
    cm_module_set_wrap_unit(wpe, "embeddings");
    cr_assert_eq(cm_module_add_child(root, "wte", wte, NULL), CM_OK);
    cr_assert_eq(cm_module_add_child(root, "wpe", wpe, NULL), CM_OK);
    cr_assert_eq(cm_module_add_child(root, "h", h, NULL), CM_OK);
    cr_assert_eq(cm_module_add_child(root, "ln_f", ln_f, NULL), CM_OK);
    return root;
}

Test(module, dotted_names_follow_pytorch_order_and_hf_paths) {
    cm_module *g = tiny_gpt();
    cr_assert_eq(cm_module_finalize(g), CM_OK, "%s", cm_last_error());
    const char *want[] = {"wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.ln_1.bias", "h.0.attn.c_attn.weight",
                          "h.0.attn.c_attn.bias", "h.0.attn.c_proj.weight", "h.0.attn.c_proj.bias", "h.0.ln_2.weight",
                          "h.0.ln_2.bias", "h.0.mlp.c_fc.weight", "h.0.mlp.c_fc.bias", "h.0.mlp.c_proj.weight",
                          "h.0.mlp.c_proj.bias", "h.1.ln_1.weight"};
    for (int i = 0; i < (int)(sizeof want / sizeof want[0]); i++) {
        cm_param_info p = cm_module_param_info(g, i);
        cr_assert_str_eq(p.name, want[i], "param %d: '%s' vs expected '%s'", i, p.name, want[i]);
    }
    cr_assert_eq(cm_module_n_params(g), 2 + 12 * 2 + 2);
    cr_assert_str_eq(cm_module_param_info(g, cm_module_n_params(g) - 1).name, "ln_f.bias");
    /* lookup by path */
    cm_module *attn = cm_module_find(g, "h.1.attn");
    cr_assert(attn);
    cr_assert_str_eq(cm_module_type_name(attn), "GPT2Attention");
    cr_assert_str_eq(cm_module_name(attn), "attn");
    char path[128];
    cr_assert_str_eq(cm_module_path(cm_module_child(attn, "c_attn"), path, sizeof path), "h.1.attn.c_attn");
    cr_assert_eq(cm_module_find_param(g, "h.1.attn.c_attn.weight"), cm_module_param(cm_module_child(attn, "c_attn"), "weight"));
    cr_assert_eq(cm_module_find_param(attn, "c_attn.bias"), cm_module_param(cm_module_child(attn, "c_attn"), "bias"));
    cr_assert_null(cm_module_find_param(g, "h.1.attn.c_attn.nope"));
    cr_assert_null(cm_module_find(g, "h.7"));
    cr_assert_eq(cm_module_find(g, ""), g);
    cr_assert_eq(cm_module_param_index(g, "h.0.ln_1.bias"), 3);
    cr_assert_eq(cm_module_param_index(g, "nope"), -1);
    /* c_attn is a Conv1D: weight stored (in, out) = (8, 24), as Hugging Face */
    cm_tensor *w = cm_module_find_param(g, "h.0.attn.c_attn.weight");
    cr_assert(cm_tensor_dim(w, 0) == 8 && cm_tensor_dim(w, 1) == 24);
    cm_module_free(g);
}

Test(module, wrap_units_group_params_and_pack_contiguously) {
    cm_module *g = tiny_gpt();
    /* values before packing, to check they survive it */
    cm_tensor *w = cm_module_find_param(g, "h.1.mlp.c_fc.weight");
    float before[4];
    memcpy(before, cm_tensor_data(w), sizeof before);
    cr_assert_eq(cm_module_finalize(g), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_module_n_units(g), 4, "units: %d", cm_module_n_units(g));
    const char *names[4] = {"embeddings", "h.0", "h.1", "root"};
    int64_t total = 0;
    for (int u = 0; u < 4; u++) {
        const cm_unit_info *ui = cm_module_unit(g, u);
        cr_assert_str_eq(ui->name, names[u]);
        total += ui->numel;
    }
    cr_assert_eq(cm_module_unit(g, 0)->n_params, 2);
    cr_assert_eq(cm_module_unit(g, 1)->n_params, 12);
    cr_assert_eq(cm_module_unit(g, 3)->n_params, 2, "ln_f has no marked ancestor: unit 'root'");
    cr_assert_eq(total, cm_module_count_params(g, false));
    cr_assert_eq(cm_module_unit(g, 0)->numel, 11 * 8 + 6 * 8);
    /* every parameter is a view of its unit's span, its gradient the same span of the grads */
    int64_t next[4] = {0};
    for (int64_t i = 0; i < cm_module_n_params(g); i++) {
        cm_param_info p = cm_module_param_info(g, i);
        const cm_unit_info *ui = cm_module_unit(g, p.unit);
        cr_assert_eq(p.offset, next[p.unit], "%s: offset %lld, expected %lld (params packed in order)", p.name,
                     (long long)p.offset, (long long)next[p.unit]);
        next[p.unit] += p.numel;
        cr_assert_eq((float *)cm_tensor_data(p.tensor), ui->params + p.offset, "%s: data is not in the flat buffer",
                     p.name);
        cr_assert_eq((float *)cm_tensor_data(cm_tensor_grad(p.tensor)), ui->grads + p.offset,
                     "%s: grad is not in the flat grad buffer", p.name);
        cr_assert(p.requires_grad);
    }
    cr_assert_eq(cm_tensor_data(w), cm_module_find_param(g, "h.1.mlp.c_fc.weight")->data, "tensor identity kept");
    cmt_assert_close_f32("packed values", cm_tensor_data(w), before, 4, 0, 0);
    /* re-finalising re-packs and keeps values */
    cr_assert_eq(cm_module_finalize(g), CM_OK);
    cmt_assert_close_f32("re-packed values", cm_tensor_data(w), before, 4, 0, 0);
    cm_module_free(g);
}

/* Builds the same MLP from raw ops over copies of the parameters, for reference gradients. */
Test(module, backward_writes_gradients_into_the_flat_buffer) {
    cm_module *m = mlp(3);
    cr_assert_eq(cm_module_finalize(m), CM_OK);
    cm_tape *tp = cmt_tape();
    const int64_t xs[2] = {5, 4};
    cm_tensor *x = cmt_randn(tp, 2, xs, 11, false);
    cm_tensor *y = cm_module_forward(m, tp, x);
    cr_assert(y, "%s", cm_tape_error(tp));
    cr_assert_eq(cm_tape_backward(tp, cm_sum(tp, cm_mul(tp, y, y), NULL, 0, false)), CM_OK, "%s", cm_tape_error(tp));

    /* reference: the same math on tape copies of the parameters */
    cm_tape *rt = cmt_tape();
    const char *pn[6] = {"0.weight", "0.bias", "2.weight", "2.bias", "3.weight", "3.bias"};
    cm_tensor *p[6];
    for (int i = 0; i < 6; i++) {
        p[i] = cm_clone_detached(rt, cm_module_find_param(m, pn[i]));
        cm_tensor_set_requires_grad(p[i], true);
    }
    cm_tensor *h = cm_layer_norm(rt, cm_relu(rt, cm_linear(rt, x, p[0], p[1])), p[2], p[3], 1e-5f);
    cm_tensor *yr = cm_linear(rt, h, p[4], p[5]);
    cmt_assert_close("forward", y, yr, 1e-6, 1e-5);
    cr_assert_eq(cm_tape_backward(rt, cm_sum(rt, cm_mul(rt, yr, yr), NULL, 0, false)), CM_OK);
    double norm = 0;
    const cm_unit_info *u = cm_module_unit(m, 0);
    for (int64_t i = 0; i < u->numel; i++) norm += fabs(u->grads[i]);
    cr_assert(norm > 0, "the flat grad buffer is all zeros");
    for (int i = 0; i < 6; i++) {
        int64_t k = cm_module_param_index(m, pn[i]);
        cm_param_info pi = cm_module_param_info(m, k);
        cm_tensor *flat;
        cr_assert_eq(cm_tensor_from_data(CM_DTYPE_F32, cm_tensor_ndim(pi.tensor), cm_tensor_shape(pi.tensor),
                                         u->grads + pi.offset, &flat),
                     CM_OK);
        cmt_assert_close(pn[i], flat, cm_tensor_grad(p[i]), 1e-5, 1e-4);
        cm_tensor_free(flat);
    }
    /* zero_grad clears the flat buffer */
    cm_module_zero_grad(m);
    for (int64_t i = 0; i < u->numel; i++) cr_assert_eq(u->grads[i], 0.0f);
    cm_tape_free(rt);
    cm_tape_free(tp);
    cm_module_free(m);
}

Test(module, counting_and_no_decay_groups) {
    cm_module *m = mlp(1);
    /* 4·8+8 + 8+8 + 8·3+3 */
    cr_assert_eq(cm_module_count_params(m, false), 40 + 16 + 27);
    cr_assert_eq(cm_module_count_params(m, true), 83);
    cr_assert_eq(cm_module_finalize(m), CM_OK);
    /* default: biases and norm weights (1-D) are no-decay */
    int64_t idx[16];
    int64_t n = cm_module_select_params(m, (cm_param_pred)NULL, NULL, idx);
    cr_assert_eq(n, 0);
    for (int64_t i = 0; i < cm_module_n_params(m); i++) {
        cm_param_info p = cm_module_param_info(m, i);
        bool want = cm_tensor_ndim(p.tensor) < 2;
        cr_assert_eq(p.no_decay, want, "%s: no_decay %d, expected %d", p.name, p.no_decay, want);
    }
    int64_t matched = 0;
    cr_assert_eq(cm_module_set_no_decay(m, "3.weight", true, &matched), CM_OK);
    cr_assert_eq(matched, 1);
    cr_assert(cm_module_param_no_decay(m, cm_module_find_param(m, "3.weight")));
    cr_assert_eq(cm_module_set_no_decay(m, "*.bais", true, &matched), CM_ERR_NOT_FOUND);
    cr_assert(strstr(cm_last_error(), "*.bais"), "%s", cm_last_error());
    cr_assert_eq(matched, 0);
    cm_module_free(m);
}

static bool is_no_decay(const cm_param_info *p, void *data) { return p->no_decay == *(bool *)data; }

Test(module, select_params_builds_groups_by_predicate) {
    cm_module *g = tiny_gpt();
    cr_assert_eq(cm_module_finalize(g), CM_OK);
    int64_t idx[64], idx2[64];
    bool t = true, f = false;
    int64_t nd = cm_module_select_params(g, is_no_decay, &t, idx);
    int64_t d = cm_module_select_params(g, is_no_decay, &f, idx2);
    cr_assert_eq(nd + d, cm_module_n_params(g));
    /* decay: wte, wpe, 4 matrices per block */
    cr_assert_eq(d, 2 + 4 * 2, "decay group has %lld params", (long long)d);
    cr_assert_str_eq(cm_module_param_info(g, idx2[2]).name, "h.0.attn.c_attn.weight");
    cm_module_free(g);
}

Test(module, glob_matching) {
    cr_assert(cm_name_match("*.bias", "h.0.attn.c_attn.bias"));
    cr_assert(cm_name_match("h.*.ln_?.weight", "h.11.ln_2.weight"));
    cr_assert(!cm_name_match("h.*.ln_?.weight", "h.11.ln_f.bias"));
    cr_assert(cm_name_match("*", ""));
    cr_assert(cm_name_match("a*b*c", "aXXbYYc"));
    cr_assert(!cm_name_match("a*b*c", "aXXbYY"));
    cr_assert(!cm_name_match("wte.weight", "wte.weights"));
}

Test(module, frozen_params_get_no_gradient_and_the_unit_still_trains) {
    cm_module *m = mlp(5);
    cr_assert_eq(cm_module_finalize(m), CM_OK);
    int64_t n = 0;
    cr_assert_eq(cm_module_set_requires_grad(m, "0.*", false, &n), CM_OK);
    cr_assert_eq(n, 2);
    cr_assert_eq(cm_module_count_params(m, true), 83 - 40);
    cm_tape *tp = cmt_tape();
    const int64_t xs[2] = {3, 4};
    cm_tensor *y = cm_module_forward(m, tp, cmt_randn(tp, 2, xs, 2, false));
    cr_assert(y, "%s", cm_tape_error(tp));
    cr_assert_eq(cm_tape_backward(tp, cm_sum(tp, cm_mul(tp, y, y), NULL, 0, false)), CM_OK);
    for (int64_t i = 0; i < cm_module_n_params(m); i++) {
        cm_param_info p = cm_module_param_info(m, i);
        const float *g = cm_module_unit(m, p.unit)->grads + p.offset;
        double s = 0;
        for (int64_t k = 0; k < p.numel; k++) s += fabs(g[k]);
        bool frozen = !strncmp(p.name, "0.", 2);
        cr_assert_eq(p.requires_grad, !frozen);
        if (frozen)
            cr_assert_eq(s, 0.0, "%s is frozen but its gradient span sums to %g", p.name, s);
        else
            cr_assert(s > 0, "%s is trainable but got no gradient", p.name);
    }
    cr_assert_eq(cm_module_set_requires_grad(m, "0.weigth", true, NULL), CM_ERR_NOT_FOUND);
    cr_assert_eq(cm_module_set_requires_grad(m, NULL, true, &n), CM_OK);
    cr_assert_eq(n, 6);
    cm_tape_free(tp);
    cm_module_free(m);
}

Test(module, tied_parameter_is_packed_once_and_found_under_both_names) {
    cm_rng rng = cm_rng_init(1, 0);
    cm_module *root, *wte, *head;
    cr_assert_eq(cm_nn_module_list_new(&root), CM_OK);
    cr_assert_eq(cm_nn_embedding_new(10, 4, &rng, &wte), CM_OK);
    cr_assert_eq(cm_nn_linear_new(4, 10, false, &rng, &head), CM_OK);
    cr_assert_eq(cm_module_add_child(root, "wte", wte, NULL), CM_OK);
    cr_assert_eq(cm_module_add_child(root, "lm_head", head, NULL), CM_OK);
    cr_assert_eq(cm_module_tie_param(head, "weight", cm_module_param(wte, "weight")), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_module_finalize(root), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_module_n_params(root), 1);
    cr_assert_eq(cm_module_count_params(root, false), 40);
    cr_assert_eq(cm_module_find_param(root, "lm_head.weight"), cm_module_find_param(root, "wte.weight"));
    cr_assert_eq(cm_module_param_index(root, "lm_head.weight"), 0);
    /* both uses accumulate into the one flat gradient */
    cm_tape *tp = cmt_tape();
    const int64_t is[1] = {3};
    cm_tensor *ids = cmt_randint(tp, 1, is, 4, 0, 10);
    cm_tensor *logits = cm_module_forward(head, tp, cm_module_forward(wte, tp, ids));
    cr_assert(logits, "%s", cm_tape_error(tp));
    cr_assert_eq(cm_tape_backward(tp, cm_sum(tp, logits, NULL, 0, false)), CM_OK);
    /* d/dW of Σ (E[ids]·Wᵀ): every row gets Σ_t E[id_t] (from the head) plus, for looked-up rows, Σ_c W[c] */
    cm_tensor *W = cm_module_param(wte, "weight");
    const float *w = cm_tensor_data(W), *g = cm_module_unit(root, 0)->grads;
    for (int r = 0; r < 10; r++)
        for (int c = 0; c < 4; c++) {
            double want = 0;
            for (int t = 0; t < 3; t++) {
                int64_t id = (int64_t)cm_tensor_get_flat(ids, t);
                want += w[id * 4 + c];
                if (id == r)
                    for (int k = 0; k < 10; k++) want += w[k * 4 + c];
            }
            cr_assert(fabs(g[r * 4 + c] - want) < 1e-4, "grad[%d][%d] = %g, expected %g (tol 1e-4)", r, c,
                      g[r * 4 + c], want);
        }
    /* tying after finalize is refused */
    cr_assert_eq(cm_module_tie_param(head, "weight", W), CM_OK, "the same tie again is a no-op");
    cm_tensor *other;
    const int64_t s2[2] = {10, 4};
    cm_tensor_new(CM_DTYPE_F32, 2, s2, &other);
    cr_assert_eq(cm_module_tie_param(head, "weight", other), CM_ERR_STATE);
    cm_tensor_free(other);
    cm_tape_free(tp);
    cm_module_free(root);
}

Test(module, tie_to_a_tensor_outside_the_tree_fails_at_finalize) {
    cm_module *lin;
    cm_tensor *ext;
    const int64_t s[2] = {3, 2};
    cr_assert_eq(cm_nn_linear_new(2, 3, false, NULL, &lin), CM_OK);
    cm_tensor_new(CM_DTYPE_F32, 2, s, &ext);
    cr_assert_eq(cm_module_tie_param(lin, "weight", ext), CM_OK);
    cr_assert_eq(cm_module_finalize(lin), CM_ERR_STATE);
    cr_assert(strstr(cm_last_error(), "weight"), "%s", cm_last_error());
    const int64_t bad[2] = {2, 3};
    cm_tensor *ext2;
    cm_tensor_new(CM_DTYPE_F32, 2, bad, &ext2);
    cr_assert_eq(cm_module_tie_param(lin, "weight", ext2), CM_ERR_SHAPE);
    cr_assert_eq(cm_module_tie_param(lin, "nope", ext2), CM_ERR_NOT_FOUND);
    cm_module_free(lin);
    cm_tensor_free(ext);
    cm_tensor_free(ext2);
}

Test(module, train_and_eval_propagate_to_children) {
    cm_module *g = tiny_gpt();
    cr_assert(cm_module_is_training(cm_module_find(g, "h.1.attn.attn_dropout")));
    cm_module_train(g, false);
    cr_assert(!cm_module_is_training(g));
    cr_assert(!cm_module_is_training(cm_module_find(g, "h.1.attn.attn_dropout")));
    cm_module_train(cm_module_find(g, "h.0"), true);
    cr_assert(cm_module_is_training(cm_module_find(g, "h.0.mlp.dropout")));
    cr_assert(!cm_module_is_training(cm_module_find(g, "h.1.mlp.dropout")));
    cm_module_free(g);
}

Test(module, zero_grad_relinks_a_detached_gradient) {
    cm_module *m = mlp(2);
    cr_assert_eq(cm_module_finalize(m), CM_OK);
    cm_tensor *w = cm_module_find_param(m, "0.weight");
    cm_tensor_clear_grad(w);
    cr_assert_null(cm_tensor_grad(w));
    cm_module_zero_grad(m);
    cr_assert_eq((float *)cm_tensor_data(cm_tensor_grad(w)), cm_module_unit(m, 0)->grads);
    cm_module_free(m);
}

Test(module, lock_blocks_finalize_until_unlocked) {
    cm_module *m = mlp(2);
    cr_assert_eq(cm_module_lock(m), CM_ERR_STATE, "locking an unfinalized model");
    cr_assert_eq(cm_module_finalize(m), CM_OK);
    cr_assert_eq(cm_module_lock(m), CM_OK);
    cr_assert_eq(cm_module_lock(m), CM_OK);
    cr_assert(cm_module_is_locked(m));
    cr_assert_eq(cm_module_finalize(m), CM_ERR_STATE);
    cr_assert(strstr(cm_last_error(), "before creating the optimizer"), "%s", cm_last_error());
    cm_module *extra;
    cm_nn_activation_new(CM_ACT_TANH, &extra);
    cr_assert_eq(cm_nn_sequential_append(m, extra), CM_ERR_STATE);
    cm_module_unlock(m);
    cr_assert(cm_module_is_locked(m), "locks count");
    cm_module_unlock(m);
    cr_assert(!cm_module_is_locked(m));
    cr_assert_eq(cm_nn_sequential_append(m, extra), CM_OK);
    cr_assert_eq(cm_module_finalize(m), CM_OK);
    cm_module_free(m);
}

Test(module, construction_errors_name_the_problem) {
    cm_module *m = mlp(1), *lin, *lin2;
    cm_nn_linear_new(2, 2, true, NULL, &lin);
    cm_nn_linear_new(2, 2, true, NULL, &lin2);
    const int64_t s[1] = {2};
    cr_assert_eq(cm_module_add_param(lin, "bias", 1, s, true, NULL), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "already has a member called 'bias'"), "%s", cm_last_error());
    cr_assert_eq(cm_module_add_param(lin, "a.b", 1, s, true, NULL), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_module_add_child(m, "0", lin, NULL), CM_ERR_INVALID_ARG, "duplicate child name");
    cr_assert_eq(cm_module_add_child(m, "x", lin, NULL), CM_OK);
    cr_assert_eq(cm_module_add_child(lin2, "y", lin, NULL), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "already has a parent"), "%s", cm_last_error());
    cr_assert_eq(cm_module_add_child(lin, "z", m, NULL), CM_ERR_INVALID_ARG, "cycle");
    cr_assert_eq(cm_module_add_child(lin, "self", lin, NULL), CM_ERR_INVALID_ARG, "cycle");
    cm_module_free(lin); /* has a parent: logged and ignored */
    cm_module_free(lin2);
    cm_module_free(m);
    cm_module_i bad = {0, "X", NULL, NULL, NULL};
    cm_module *o;
    cr_assert_eq(cm_module_new(&bad, NULL, &o), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_nn_linear_new(0, 2, true, NULL, &o), CM_ERR_INVALID_ARG);
    cr_assert_null(o);
    cr_assert_eq(cm_nn_layer_norm_new(4, -1.0f, true, &o), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_nn_group_norm_new(3, 8, 1e-5f, true, &o), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "divisible"), "%s", cm_last_error());
    cr_assert_eq(cm_nn_dropout_new(1.5f, &o), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_nn_activation_new((cm_activation)99, &o), CM_ERR_INVALID_ARG);
}

Test(module, forward_errors_are_prefixed_with_the_module_path) {
    cm_module *m = mlp(1);
    cm_tape *tp = cmt_tape();
    const int64_t xs[2] = {3, 5}; /* in features should be 4 */
    cm_tensor *y = cm_module_forward(m, tp, cmt_randn(tp, 2, xs, 1, false));
    cr_assert_null(y);
    cr_assert_eq(cm_tape_status(tp), CM_ERR_SHAPE);
    cr_assert(!strncmp(cm_tape_error(tp), "in module 0 (Linear): linear:", 29), "%s", cm_tape_error(tp));
    cr_assert_str_eq(cm_last_error(), cm_tape_error(tp));
    cm_tape_reset(tp);
    cm_module *list;
    cm_nn_module_list_new(&list);
    cr_assert_null(cm_module_forward(list, tp, cmt_randn(tp, 2, xs, 1, false)));
    cr_assert(strstr(cm_tape_error(tp), "ModuleList") && strstr(cm_tape_error(tp), "no forward"), "%s",
              cm_tape_error(tp));
    cm_tape_reset(tp);
    cr_assert_null(cm_module_forward(m, tp, NULL));
    cr_assert(strstr(cm_tape_error(tp), "input 0 is NULL"), "%s", cm_tape_error(tp));
    cm_module_free(list);
    cm_tape_free(tp);
    cm_module_free(m);
}

Test(module, summary_prints_the_tree) {
    cm_module *g = tiny_gpt();
    char buf[8192];
    size_t n = cm_module_summary(g, buf, sizeof buf);
    cr_assert(n > 0 && n < sizeof buf);
    cr_assert(strstr(buf, "(c_attn): Conv1D(in=8, out=24, bias)"), "%s", buf);
    cr_assert(strstr(buf, "(wte): Embedding(11, 8)"), "%s", buf);
    cr_assert(strstr(buf, "    (0): GPT2Block(d_model=8, n_heads=2, causal"), "%s", buf);
    char small[16];
    cr_assert_eq(cm_module_summary(g, small, sizeof small), n, "returns the full length");
    cr_assert_eq(strlen(small), 15u);
    cm_module_free(g);
}

Test(module, finalize_under_failing_allocations_leaves_the_model_usable) {
    cm_module *m = mlp(9);
    float before[8];
    memcpy(before, cm_tensor_data(cm_module_find_param(m, "0.weight")), sizeof before);
    int failures = 0;
    for (int64_t n = 1; n < 200; n++) {
        cm_alloc_fail_at(n);
        cm_status st = cm_module_finalize(m);
        cm_alloc_fail_at(0);
        if (st == CM_OK) break;
        cr_assert_eq(st, CM_ERR_OOM, "allocation %lld: %s", (long long)n, cm_last_error());
        cr_assert(!cm_module_is_finalized(m));
        failures++;
        cmt_assert_close_f32("values after a failed finalize", cm_tensor_data(cm_module_find_param(m, "0.weight")),
                             before, 8, 0, 0);
    }
    cr_assert(failures > 3, "only %d allocations could fail", failures);
    cr_assert(cm_module_is_finalized(m));
    cmt_assert_close_f32("values after finalize", cm_tensor_data(cm_module_find_param(m, "0.weight")), before, 8, 0, 0);
    cm_module_free(m);
}

Test(module, adding_a_finalized_module_as_a_child_unpacks_it) {
    cm_module *m = mlp(4), *root;
    cr_assert_eq(cm_module_finalize(m), CM_OK);
    float before[4];
    memcpy(before, cm_tensor_data(cm_module_find_param(m, "3.weight")), sizeof before);
    cm_nn_module_list_new(&root);
    cr_assert_eq(cm_module_add_child(root, "net", m, NULL), CM_OK);
    cr_assert(!cm_module_is_finalized(m));
    cr_assert_eq(cm_module_finalize(root), CM_OK);
    cr_assert_eq(cm_module_param_index(root, "net.3.weight"), 4);
    cmt_assert_close_f32("moved values", cm_tensor_data(cm_module_find_param(root, "net.3.weight")), before, 4, 0, 0);
    cm_module_free(root);
}

Test(module, batch_norm_buffers_are_listed_with_pytorch_names) {
    cm_module *seq, *conv, *bn;
    cm_rng rng = cm_rng_init(0, 0);
    cm_nn_sequential_new(&seq);
    cm_nn_conv2d_config cc = cm_nn_conv2d_config_default(3, 4, 3, 3);
    cc.bias = false;
    cr_assert_eq(cm_nn_conv2d_new(&cc, &rng, &conv), CM_OK);
    cr_assert_eq(cm_nn_batch_norm2d_new(4, NULL, &bn), CM_OK);
    cm_nn_sequential_append(seq, conv);
    cm_nn_sequential_append(seq, bn);
    cr_assert_eq(cm_module_finalize(seq), CM_OK);
    cr_assert_eq(cm_module_n_buffers(seq), 3);
    cr_assert_str_eq(cm_module_buffer_info(seq, 0).name, "1.running_mean");
    cr_assert_str_eq(cm_module_buffer_info(seq, 1).name, "1.running_var");
    cr_assert_str_eq(cm_module_buffer_info(seq, 2).name, "1.num_batches_tracked");
    cr_assert_eq(cm_tensor_dtype(cm_module_buffer_info(seq, 2).tensor), CM_DTYPE_I64);
    cr_assert_eq(cm_module_find_buffer(seq, "1.running_var"), cm_module_buffer_info(seq, 1).tensor);
    cr_assert_eq(cm_module_n_params(seq), 3, "conv weight, bn weight and bias");
    cm_module_free(seq);
}
