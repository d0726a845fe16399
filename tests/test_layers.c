/* Layers: each forward against the raw op it wraps, train/eval behaviour (dropout, batch norm),
 * the attention paths (fused vs explicit, ALiBi), gradient checks through a tiny GPT block and BERT
 * layer, and the GPT-2 block and BERT layer against PyTorch (tests/golden/gen_blocks.py): weights
 * loaded by their Hugging Face names, outputs, input and parameter gradients compared.
 *
 * Tolerances: layer vs raw op are the same kernels (exact or 1e-6); PyTorch goldens atol 1e-5,
 * rtol 1e-4 (f32, C = 16, different summation orders); gradchecks eps 1e-2 (3e-3 for blocks with
 * layer norm), atol 1e-3, rtol 1e-2, as the op tests. */
#include "cmtest.h"
#include "tensor/tensor_impl.h"

#include <composer/nn.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define GOLDEN "tests/golden/blocks.safetensors"

static cm_tensor *fwd(cm_module *m, cm_tape *tp, cm_tensor *x) {
    cm_tensor *y = cm_module_forward(m, tp, x);
    cr_assert(y, "%s forward: %s", cm_module_type_name(m), cm_tape_error(tp));
    return y;
}

Test(layers, linear_and_conv1d_match_the_raw_op) {
    cm_tape *tp = cmt_tape();
    cm_rng rng = cm_rng_init(3, 0);
    cm_module *lin, *c1d;
    cr_assert_eq(cm_nn_linear_new(5, 7, true, &rng, &lin), CM_OK);
    cm_tensor *w = cm_module_param(lin, "weight"), *b = cm_module_param(lin, "bias");
    cr_assert(cm_tensor_dim(w, 0) == 7 && cm_tensor_dim(w, 1) == 5);
    /* PyTorch's init bound 1/sqrt(in) */
    for (int64_t i = 0; i < 35; i++) cr_assert(fabs(cm_tensor_get_flat(w, i)) <= 1 / sqrt(5.0));
    const int64_t xs[3] = {2, 3, 5};
    cm_tensor *x = cmt_randn(tp, 3, xs, 1, false);
    cmt_assert_close("Linear", fwd(lin, tp, x), cm_linear(tp, x, w, b), 0, 0);
    /* Conv1D stores (in, out): load the transpose of the Linear's weight, same output */
    cr_assert_eq(cm_nn_conv1d_new(5, 7, true, NULL, &c1d), CM_OK);
    cr_assert_str_eq(cm_module_type_name(c1d), "Conv1D");
    cm_tensor *wt = cm_module_param(c1d, "weight");
    cr_assert(cm_tensor_dim(wt, 0) == 5 && cm_tensor_dim(wt, 1) == 7);
    cm_tensor_copy(wt, cm_transpose(tp, w, 0, 1));
    cm_tensor_copy(cm_module_param(c1d, "bias"), b);
    cmt_assert_close("Conv1D", fwd(c1d, tp, x), cm_linear(tp, x, w, b), 1e-6, 1e-6);
    int64_t in, out;
    bool tr;
    cr_assert_eq(cm_nn_linear_dims(c1d, &in, &out, &tr), CM_OK);
    cr_assert(in == 5 && out == 7 && tr);
    cr_assert(cm_nn_is_linear(lin) && cm_nn_is_linear(c1d));
    cm_module *nl;
    cm_nn_linear_new(2, 2, false, NULL, &nl);
    cr_assert_null(cm_module_param(nl, "bias"));
    cr_assert_eq(cm_nn_linear_dims(nl ? NULL : nl, NULL, NULL, NULL), CM_ERR_INVALID_ARG);
    cm_module_free(nl);
    cm_module_free(lin);
    cm_module_free(c1d);
    cm_tape_free(tp);
}

Test(layers, embedding_norms_conv_pool_flatten_activation_match_raw_ops) {
    cm_tape *tp = cmt_tape();
    cm_rng rng = cm_rng_init(4, 0);
    cm_module *m;
    /* Embedding */
    cr_assert_eq(cm_nn_embedding_new(9, 4, &rng, &m), CM_OK);
    const int64_t is[2] = {2, 3};
    cm_tensor *ids = cmt_randint(tp, 2, is, 1, 0, 9);
    cmt_assert_close("Embedding", fwd(m, tp, ids), cm_embedding(tp, cm_module_param(m, "weight"), ids), 0, 0);
    cm_module_free(m);
    /* LayerNorm: weight 1, bias 0 at construction */
    cr_assert_eq(cm_nn_layer_norm_new(6, 1e-5f, true, &m), CM_OK);
    cr_assert_eq(cm_tensor_get_flat(cm_module_param(m, "weight"), 3), 1.0);
    cm_tensor_fill(cm_module_param(m, "bias"), 0.5);
    const int64_t xs[3] = {2, 3, 6};
    cm_tensor *x = cmt_randn(tp, 3, xs, 2, false);
    cmt_assert_close("LayerNorm", fwd(m, tp, x),
                     cm_layer_norm(tp, x, cm_module_param(m, "weight"), cm_module_param(m, "bias"), 1e-5f), 0, 0);
    cm_module_free(m);
    cr_assert_eq(cm_nn_layer_norm_new(6, 1e-5f, false, &m), CM_OK);
    cr_assert_eq(cm_module_n_own_params(m), 0);
    cmt_assert_close("LayerNorm (no affine)", fwd(m, tp, x), cm_layer_norm(tp, x, NULL, NULL, 1e-5f), 0, 0);
    cm_module_free(m);
    /* GroupNorm, Conv2d, pools, Flatten on an image batch */
    const int64_t ims[4] = {2, 4, 6, 6};
    cm_tensor *img = cmt_randn(tp, 4, ims, 3, false);
    cr_assert_eq(cm_nn_group_norm_new(2, 4, 1e-5f, true, &m), CM_OK);
    cmt_assert_close("GroupNorm", fwd(m, tp, img), cm_group_norm(tp, img, 2, cm_module_param(m, "weight"), cm_module_param(m, "bias"), 1e-5f), 0, 0);
    cm_module_free(m);
    cm_nn_conv2d_config cc = cm_nn_conv2d_config_default(4, 3, 3, 3);
    cc.opts.padding[0] = cc.opts.padding[1] = 1;
    cc.opts.stride[0] = 2;
    cr_assert_eq(cm_nn_conv2d_new(&cc, &rng, &m), CM_OK);
    cmt_assert_close("Conv2d", fwd(m, tp, img),
                     cm_conv2d(tp, img, cm_module_param(m, "weight"), cm_module_param(m, "bias"), &cc.opts), 0, 0);
    cm_module_free(m);
    cm_pool2d_opts po = cm_pool2d_opts_default(2, 2);
    cr_assert_eq(cm_nn_max_pool2d_new(&po, &m), CM_OK);
    cmt_assert_close("MaxPool2d", fwd(m, tp, img), cm_max_pool2d(tp, img, &po), 0, 0);
    cm_module_free(m);
    cr_assert_eq(cm_nn_avg_pool2d_new(&po, &m), CM_OK);
    cmt_assert_close("AvgPool2d", fwd(m, tp, img), cm_avg_pool2d(tp, img, &po), 0, 0);
    cm_module_free(m);
    cr_assert_eq(cm_nn_adaptive_avg_pool2d_new(1, 1, false, &m), CM_OK);
    cmt_assert_close("AdaptiveAvgPool2d", fwd(m, tp, img), cm_adaptive_avg_pool2d(tp, img, 1, 1, false), 0, 0);
    cm_module_free(m);
    cr_assert_eq(cm_nn_flatten_new(1, &m), CM_OK);
    cm_tensor *f = fwd(m, tp, img);
    cr_assert(cm_tensor_ndim(f) == 2 && cm_tensor_dim(f, 1) == 144);
    cm_module_free(m);
    cr_assert_eq(cm_nn_flatten_new(5, &m), CM_OK);
    cr_assert_null(cm_module_forward(m, tp, img));
    cr_assert(strstr(cm_tape_error(tp), "start_dim 5"), "%s", cm_tape_error(tp));
    cm_module_free(m);
    cm_tape_reset(tp);
    /* activations */
    x = cmt_randn(tp, 3, xs, 5, false);
    cm_tensor *want[7] = {cm_relu(tp, x), cm_gelu(tp, x, false), cm_gelu(tp, x, true), cm_silu(tp, x),
                          cm_tanh(tp, x), cm_sigmoid(tp, x), x};
    const char *names[7] = {"ReLU", "GELU", "NewGELU", "SiLU", "Tanh", "Sigmoid", "Identity"};
    for (int a = 0; a <= CM_ACT_IDENTITY; a++) {
        cr_assert_eq(cm_nn_activation_new((cm_activation)a, &m), CM_OK);
        cr_assert_str_eq(cm_module_type_name(m), names[a]);
        cmt_assert_close(names[a], fwd(m, tp, x), want[a], 0, 0);
        cm_module_free(m);
    }
    cm_tape_free(tp);
}

Test(layers, dropout_is_identity_in_eval_and_reproducible_in_training) {
    cm_tape *tp = cmt_tape();
    cm_module *d1, *d2;
    cr_assert_eq(cm_nn_dropout_new(0.5f, &d1), CM_OK);
    cr_assert_eq(cm_nn_dropout_new(0.5f, &d2), CM_OK);
    const int64_t xs[2] = {8, 16};
    cm_tensor *x = cmt_randn(tp, 2, xs, 1, false);
    cm_module_train(d1, false);
    cr_assert_eq(fwd(d1, tp, x), x, "eval: the input itself");
    cm_module_train(d1, true);
    cm_module_set_seed(d1, 42);
    cm_module_set_seed(d2, 42);
    cm_tensor *a = fwd(d1, tp, x), *b = fwd(d2, tp, x);
    cmt_assert_close("same seed and path, same mask", a, b, 0, 0);
    int zeros = 0;
    for (int64_t i = 0; i < 128; i++) zeros += cm_tensor_get_flat(a, i) == 0;
    cr_assert(zeros > 30 && zeros < 98, "%d of 128 dropped at p = 0.5", zeros);
    cm_tensor *a2 = fwd(d1, tp, x);
    bool differs = false;
    for (int64_t i = 0; i < 128; i++) differs |= cm_tensor_get_flat(a2, i) != cm_tensor_get_flat(a, i);
    cr_assert(differs, "the counter advances: the next call draws a new mask");
    cm_module_set_seed(d1, 42);
    cmt_assert_close("re-seeding restarts the stream", fwd(d1, tp, x), a, 0, 0);
    cr_assert_eq(cm_nn_dropout_rng(d1)->seed, 42u);
    cr_assert_null(cm_nn_dropout_rng(NULL));
    /* two dropouts in one tree draw from different streams (their paths) */
    cm_module *seq;
    cm_nn_sequential_new(&seq);
    cm_nn_sequential_append(seq, d1);
    cm_nn_sequential_append(seq, d2);
    cr_assert_eq(cm_module_finalize(seq), CM_OK);
    cm_module_set_seed(seq, 7);
    cr_assert_neq(cm_nn_dropout_rng(d1)->stream, cm_nn_dropout_rng(d2)->stream);
    cm_module_free(seq);
    cm_tape_free(tp);
}

Test(layers, batch_norm_updates_running_stats_in_training_and_uses_them_in_eval) {
    cm_tape *tp = cmt_tape();
    cm_module *bn;
    cr_assert_eq(cm_nn_batch_norm2d_new(3, NULL, &bn), CM_OK);
    const int64_t xs[4] = {4, 3, 5, 5};
    cm_tensor *x = cmt_rand_uniform(tp, 4, xs, 1, 1.0f, 3.0f, false);
    cm_tensor *rm = cm_module_buffer(bn, "running_mean"), *rv = cm_module_buffer(bn, "running_var");
    cm_tensor *nbt = cm_module_buffer(bn, "num_batches_tracked");
    cr_assert_eq(cm_tensor_get_flat(rv, 0), 1.0);
    cm_tensor *y = fwd(bn, tp, x);
    /* training: batch statistics, so the output has ~zero mean per channel; the running mean moved 10% */
    double m0 = 0;
    for (int64_t n = 0; n < 4; n++)
        for (int64_t i = 0; i < 25; i++) m0 += cm_tensor_get_flat(y, n * 75 + i);
    cr_assert(fabs(m0 / 100) < 1e-5, "channel 0 mean %g", m0 / 100);
    cr_assert(fabs(cm_tensor_get_flat(rm, 0) - 0.2) < 0.03, "running_mean %g ≈ 0.1·2", cm_tensor_get_flat(rm, 0));
    cr_assert_eq(cm_tensor_get_flat(nbt, 0), 1.0);
    /* eval: the running statistics, unchanged by the call */
    cm_module_train(bn, false);
    double rm_before = cm_tensor_get_flat(rm, 1);
    cm_batch_norm_opts o = cm_batch_norm_opts_default();
    o.training = false;
    cm_tensor *want = cm_batch_norm(tp, x, cm_module_param(bn, "weight"), cm_module_param(bn, "bias"), rm, rv, &o);
    cmt_assert_close("eval BatchNorm2d", fwd(bn, tp, x), want, 0, 0);
    cr_assert_eq(cm_tensor_get_flat(rm, 1), rm_before);
    cr_assert_eq(cm_tensor_get_flat(nbt, 0), 1.0);
    cm_module_free(bn);
    /* without running stats, eval normalises with the batch */
    cm_nn_batch_norm_config c = cm_nn_batch_norm_config_default();
    c.track_running_stats = false;
    c.affine = false;
    cr_assert_eq(cm_nn_batch_norm2d_new(3, &c, &bn), CM_OK);
    cr_assert_null(cm_module_buffer(bn, "running_mean"));
    cm_module_train(bn, false);
    o.training = true;
    cmt_assert_close("eval without running stats", fwd(bn, tp, x), cm_batch_norm(tp, x, NULL, NULL, NULL, NULL, &o), 0,
                     0);
    cm_module_free(bn);
    c.momentum = 2;
    cr_assert_eq(cm_nn_batch_norm2d_new(3, &c, &bn), CM_ERR_INVALID_ARG);
    cm_tape_free(tp);
}

/* cm_nn_batch_norm_add_relu: the fused op with the module's tensors and mode (the running
 * statistics and num_batches_tracked move as in its forward); another module type runs its
 * forward, the add and the ReLU. */
Test(layers, batch_norm_add_relu_uses_the_module_and_falls_back_for_other_modules) {
    cm_tape *tp = cmt_tape();
    cm_module *bn[2];
    for (int k = 0; k < 2; k++) cr_assert_eq(cm_nn_batch_norm2d_new(3, NULL, &bn[k]), CM_OK);
    const int64_t xs[4] = {4, 3, 5, 5};
    cm_tensor *x = cmt_randn(tp, 4, xs, 1, false), *res = cmt_randn(tp, 4, xs, 2, false);
    cm_tensor *want = cm_relu(tp, cm_add(tp, fwd(bn[0], tp, x), res));
    cm_tensor *got = cm_nn_batch_norm_add_relu(bn[1], tp, x, res);
    cr_assert(got, "%s", cm_tape_error(tp));
    cmt_assert_close("fused BatchNorm2d + add + ReLU", got, want, 1e-6, 1e-6);
    cmt_assert_close("running_mean", cm_module_buffer(bn[1], "running_mean"), cm_module_buffer(bn[0], "running_mean"), 0,
                     0);
    cr_assert_eq(cm_tensor_get_flat(cm_module_buffer(bn[1], "num_batches_tracked"), 0), 1.0);
    cm_module_train(bn[0], false), cm_module_train(bn[1], false);
    cmt_assert_close("eval, no residual", cm_nn_batch_norm_add_relu(bn[1], tp, x, NULL), cm_relu(tp, fwd(bn[0], tp, x)),
                     1e-6, 1e-6);
    cr_assert_eq(cm_tensor_get_flat(cm_module_buffer(bn[1], "num_batches_tracked"), 0), 1.0, "eval does not count");
    cm_module *gn;
    cr_assert_eq(cm_nn_group_norm_new(3, 3, 1e-5f, true, &gn), CM_OK);
    cmt_assert_close("another module: forward, add, ReLU", cm_nn_batch_norm_add_relu(gn, tp, x, res),
                     cm_relu(tp, cm_add(tp, fwd(gn, tp, x), res)), 0, 0);
    cm_module_free(gn);
    for (int k = 0; k < 2; k++) cm_module_free(bn[k]);
    cm_tape_free(tp);
}

/* ---- attention ---- */

static cm_module *attention(bool causal, bool alibi, float pdrop, int64_t C, int64_t H) {
    cm_nn_attention_config c = cm_nn_attention_config_default(C, H);
    c.causal = causal;
    c.alibi = alibi;
    c.attn_pdrop = pdrop;
    cm_rng rng = cm_rng_init(11, 0);
    cm_module *m;
    cr_assert_eq(cm_nn_attention_new(&c, &rng, &m), CM_OK, "%s", cm_last_error());
    return m;
}

/* The module's math spelled out with raw ops (q, k, v split from c_attn, ALiBi bias given). */
static cm_tensor *attention_ref(cm_tape *tp, cm_module *m, cm_tensor *x, int64_t H, bool causal, cm_tensor *bias,
                                cm_tensor *mask) {
    cm_tensor *w = cm_module_find_param(m, "c_attn.weight"), *b = cm_module_find_param(m, "c_attn.bias");
    const int64_t B = cm_tensor_dim(x, 0), T = cm_tensor_dim(x, 1), C = cm_tensor_dim(x, 2);
    cm_tensor *qkv = cm_add(tp, cm_matmul(tp, x, w), b);
    const int64_t s4[4] = {B, T, H, C / H}, s3[3] = {B, T, C};
    const int perm[4] = {0, 2, 1, 3};
    cm_tensor *hs[3];
    for (int i = 0; i < 3; i++)
        hs[i] = cm_permute(tp, cm_reshape(tp, cm_contiguous(tp, cm_narrow(tp, qkv, 2, i * C, C)), 4, s4), perm);
    cm_attention_opts o = cm_attention_opts_default();
    o.causal = causal;
    o.bias = bias;
    o.key_padding_mask = mask;
    cm_tensor *y = cm_reshape(tp, cm_contiguous(tp, cm_permute(tp, cm_attention(tp, hs[0], hs[1], hs[2], &o), perm)), 3, s3);
    return cm_add(tp, cm_matmul(tp, y, cm_module_find_param(m, "c_proj.weight")), cm_module_find_param(m, "c_proj.bias"));
}

Test(layers, attention_matches_raw_ops_with_mask_and_alibi) {
    cm_tape *tp = cmt_tape();
    const int64_t C = 12, H = 3, xs[3] = {2, 5, 12}, ms[2] = {2, 5};
    cm_tensor *x = cmt_randn(tp, 3, xs, 1, false);
    cm_tensor *mask = cm_full(tp, CM_DTYPE_I64, 2, ms, 1);
    cm_tensor_set(mask, (int64_t[]){1, 4}, 0);
    cm_tensor_set(mask, (int64_t[]){1, 3}, 0);
    for (int k = 0; k < 4; k++) {
        bool causal = k & 1, alibi = k & 2;
        cm_module *m = attention(causal, alibi, 0, C, H);
        cm_tensor *bias = NULL;
        if (alibi) {
            const int64_t bs[4] = {1, H, 5, 5};
            bias = cm_zeros(tp, CM_DTYPE_F32, 4, bs);
            float sl[3];
            cm_nn_alibi_slopes(H, sl);
            for (int h = 0; h < H; h++)
                for (int i = 0; i < 5; i++)
                    for (int j = 0; j < 5; j++) cm_tensor_set(bias, (int64_t[]){0, h, i, j}, -sl[h] * abs(i - j));
        }
        cm_tensor *in[2] = {x, mask};
        cm_tensor *y = cm_module_forward_n(m, tp, 2, in);
        cr_assert(y, "%s", cm_tape_error(tp));
        cmt_assert_close(causal ? "causal attention" : "attention", y, attention_ref(tp, m, x, H, causal, bias, mask),
                         1e-5, 1e-5);
        cm_module_free(m);
    }
    cm_tape_free(tp);
}

/* The fused path asks cm_attention for the (B, T, H, D) layout, so merging the heads is a view: the
 * module records no copy (a "contiguous" node would keep another (B, T, C) in the tape), also with
 * attention dropout fused. */
Test(layers, fused_attention_merges_heads_without_a_copy) {
    for (int drop = 0; drop < 2; drop++) {
        cm_tape *tp = cmt_tape();
        const int64_t xs[3] = {2, 5, 12};
        cm_tensor *x = cmt_randn(tp, 3, xs, 1, true);
        cm_module *m = attention(true, false, drop ? 0.1f : 0.0f, 12, 3);
        cm_module_train(m, true);
        cm_tensor *y = cm_module_forward(m, tp, x);
        cr_assert(y, "%s", cm_tape_error(tp));
        int n_attention = 0;
        for (cm_node *n = tp->last; n; n = n->prev) {
            cr_assert_str_neq(n->op, "contiguous", "drop %d: the attention module copied a tensor", drop);
            n_attention += strcmp(n->op, "attention") == 0;
        }
        cr_assert_eq(n_attention, 1, "drop %d: %d fused attention nodes", drop, n_attention);
        cr_assert_eq(cm_tape_backward(tp, cm_sum(tp, y, NULL, 0, false)), CM_OK, "%s", cm_tape_error(tp));
        cm_module_free(m);
        cm_tape_free(tp);
    }
}

Test(layers, alibi_slopes_follow_press_et_al) {
    float s[8];
    cm_nn_alibi_slopes(8, s);
    for (int i = 0; i < 8; i++) cr_assert_float_eq(s[i], powf(2.0f, -(float)(i + 1)), 1e-7, "head %d: %g", i, s[i]);
    cm_nn_alibi_slopes(6, s); /* 4 of the power-of-two series, then every other of 8's */
    const float want[6] = {0.25f, 0.0625f, 0.015625f, 0.00390625f, 0.5f, 0.125f};
    for (int i = 0; i < 6; i++) cr_assert_float_eq(s[i], want[i], 1e-7, "head %d: %g vs %g", i, s[i], want[i]);
}

Test(layers, explicit_attention_path_for_dropout_matches_the_fused_op) {
    /* p so small nothing is dropped: the explicit path (used when attention dropout is active) must equal
     * the fused one, including the causal mask, the padding mask and ALiBi */
    cm_tape *tp = cmt_tape();
    const int64_t xs[3] = {2, 4, 8}, ms[2] = {2, 4};
    cm_tensor *x = cmt_randn(tp, 3, xs, 5, false);
    cm_tensor *mask = cm_full(tp, CM_DTYPE_U8, 2, ms, 1);
    cm_tensor_set(mask, (int64_t[]){0, 1}, 0);
    cm_module *m = attention(true, true, 1e-9f, 8, 2);
    cm_tensor *in[2] = {x, mask};
    cm_tensor *y_train = cm_module_forward_n(m, tp, 2, in);
    cr_assert(y_train, "%s", cm_tape_error(tp));
    cm_module_train(m, false);
    cm_tensor *y_eval = cm_module_forward_n(m, tp, 2, in);
    cmt_assert_close("explicit vs fused", y_train, y_eval, 1e-5, 1e-5);
    /* with real dropout the outputs differ */
    cm_module_free(m);
    m = attention(false, false, 0.5f, 8, 2);
    cm_tensor *a = cm_module_forward(m, tp, x);
    cm_module_train(m, false);
    cm_tensor *b = cm_module_forward(m, tp, x);
    double diff = 0;
    for (int64_t i = 0; i < 64; i++) diff += fabs(cm_tensor_get_flat(a, i) - cm_tensor_get_flat(b, i));
    cr_assert(diff > 1e-3, "attention dropout had no effect");
    cm_module_free(m);
    cm_tape_free(tp);
}

Test(layers, attention_config_errors) {
    cm_nn_attention_config c = cm_nn_attention_config_default(10, 3);
    cm_module *m;
    cr_assert_eq(cm_nn_attention_new(&c, NULL, &m), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "multiple of n_heads"), "%s", cm_last_error());
    c = cm_nn_attention_config_default(8, 2);
    c.attn_pdrop = -1;
    cr_assert_eq(cm_nn_gpt_block_new(&c, 1, NULL, &m), CM_ERR_INVALID_ARG);
    c = cm_nn_attention_config_default(8, 2);
    c.mlp_ratio = 0;
    cr_assert_eq(cm_nn_bert_layer_new(&c, NULL, &m), CM_ERR_INVALID_ARG);
    cr_assert_null(m);
    cr_assert_eq(cm_nn_bert_layer_new(NULL, NULL, &m), CM_ERR_INVALID_ARG);
    /* a wrong input width is reported with the module path */
    cm_tape *tp = cmt_tape();
    c = cm_nn_attention_config_default(8, 2);
    cr_assert_eq(cm_nn_gpt_block_new(&c, 1, NULL, &m), CM_OK);
    const int64_t xs[3] = {1, 3, 6};
    cr_assert_null(cm_module_forward(m, tp, cmt_randn(tp, 3, xs, 1, false)));
    cr_assert(strstr(cm_tape_error(tp), "in module ln_1 (LayerNorm)"), "%s", cm_tape_error(tp));
    cm_tape_reset(tp);
    const int64_t ys[3] = {1, 3, 8}, bad_mask[2] = {1, 4};
    cm_tensor *in[2] = {cmt_randn(tp, 3, ys, 1, false), cm_full(tp, CM_DTYPE_I64, 2, bad_mask, 1)};
    cr_assert_null(cm_module_forward_n(m, tp, 2, in));
    cr_assert_eq(cm_tape_status(tp), CM_ERR_SHAPE, "%s", cm_tape_error(tp));
    cr_assert(strstr(cm_tape_error(tp), "attn"), "%s", cm_tape_error(tp));
    cm_module_free(m);
    cm_tape_free(tp);
}

/* ---- gradient checks through blocks ---- */

typedef struct {
    cm_module *m;
    cm_tensor *mask;
} blk_ctx;

static cm_tensor *call_block(cm_tape *tp, cm_tensor *const *in, void *vctx) {
    blk_ctx *c = vctx;
    cm_tensor *args[2] = {in[0], c->mask};
    return cm_module_forward_n(c->m, tp, 2, args);
}

Test(layers, gradcheck_through_a_tiny_gpt_block_and_bert_layer) {
    cm_tape *tp = cmt_tape();
    cm_nn_attention_config c = cm_nn_attention_config_default(8, 2);
    cm_rng rng = cm_rng_init(5, 0);
    cm_module *g, *b;
    cr_assert_eq(cm_nn_gpt_block_new(&c, 1, &rng, &g), CM_OK);
    cr_assert_eq(cm_module_finalize(g), CM_OK);
    /* larger weights than GPT-2's 0.02 so every path matters */
    const cm_unit_info *u = cm_module_unit(g, 0);
    cm_rng r2 = cm_rng_init(9, 1);
    cm_rng_normal(&r2, u->params, (size_t)u->numel, 0.0f, 0.3f);
    const int64_t xs[3] = {2, 3, 8};
    cm_tensor *x = cmt_randn(tp, 3, xs, 3, true);
    blk_ctx ctx = {g, NULL};
    cmt_gradcheck_opts o = {3e-3, 1e-3, 1e-2, 24};
    cm_tensor *in[2] = {x, NULL};
    cmt_gradcheck("GPT2Block: x", call_block, &ctx, 1, in, &o);
    cm_module_free(g);

    c.causal = false;
    c.act = CM_ACT_GELU;
    c.ln_eps = 1e-12f;
    cr_assert_eq(cm_nn_bert_layer_new(&c, &rng, &b), CM_OK);
    cr_assert_eq(cm_module_finalize(b), CM_OK);
    u = cm_module_unit(b, 0);
    cm_rng_normal(&r2, u->params, (size_t)u->numel, 0.0f, 0.3f);
    const int64_t ms[2] = {2, 3};
    cm_tensor *mask = cm_full(tp, CM_DTYPE_I64, 2, ms, 1);
    cm_tensor_set(mask, (int64_t[]){1, 2}, 0);
    blk_ctx bc = {b, mask};
    in[0] = x;
    cmt_gradcheck("BertLayer: x", call_block, &bc, 1, in, &o);
    cm_module_free(b);
    cm_tape_free(tp);
}

/* Forward with x fixed; the checked input is a parameter of the module. */
typedef struct {
    cm_module *m;
    cm_tensor *x, *mask;
} param_ctx;

static cm_tensor *call_block_param(cm_tape *tp, cm_tensor *const *in, void *vctx) {
    param_ctx *c = vctx;
    cm_tensor *args[2] = {c->x, c->mask};
    return cm_module_forward_n(c->m, tp, 2, args);
}

Test(layers, gradcheck_of_block_parameters) {
    cm_tape *tp = cmt_tape();
    cm_nn_attention_config c = cm_nn_attention_config_default(8, 2);
    cm_rng rng = cm_rng_init(6, 0);
    cm_module *g;
    cr_assert_eq(cm_nn_gpt_block_new(&c, 1, &rng, &g), CM_OK);
    cr_assert_eq(cm_module_finalize(g), CM_OK);
    const cm_unit_info *u = cm_module_unit(g, 0);
    cm_rng r2 = cm_rng_init(9, 2);
    cm_rng_normal(&r2, u->params, (size_t)u->numel, 0.0f, 0.3f);
    const int64_t xs[3] = {2, 3, 8};
    param_ctx pc = {g, cmt_randn(tp, 3, xs, 4, false), NULL};
    cmt_gradcheck_opts o = {3e-3, 1e-3, 1e-2, 16};
    const char *names[4] = {"attn.c_attn.weight", "attn.c_proj.bias", "mlp.c_fc.weight", "ln_2.weight"};
    for (int i = 0; i < 4; i++) {
        cm_tensor *in[1] = {cm_module_find_param(g, names[i])};
        cmt_gradcheck(names[i], call_block_param, &pc, 1, in, &o);
    }
    cm_module_free(g);
    cm_tape_free(tp);
}

/* ---- PyTorch goldens ---- */

/* Copies "<prefix>.<name>" from the golden file into every parameter of m (finalized); each
 * parameter must be there, so the names are Hugging Face's. */
static void load_by_name(cmt_golden *g, cm_module *m, const char *prefix) {
    for (int64_t i = 0; i < cm_module_n_params(m); i++) {
        cm_param_info p = cm_module_param_info(m, i);
        char key[256];
        snprintf(key, sizeof key, "%s.%s", prefix, p.name);
        cr_assert(cmt_golden_has(g, key), "golden has no tensor '%s': the name differs from Hugging Face's", key);
        cm_tensor *t = cmt_golden_get(g, key);
        cr_assert_eq(cm_tensor_copy(p.tensor, t), CM_OK, "%s: %s", key, cm_last_error());
        cm_tensor_free(t);
    }
}

static void check_block(cm_module *m, const char *tag, bool with_mask) {
    cmt_golden *g = cmt_golden_open(GOLDEN);
    cr_assert_eq(cm_module_finalize(m), CM_OK);
    load_by_name(g, m, tag);
    cm_module_train(m, false); /* no dropout (p = 0 anyway) */
    cm_tape *tp = cmt_tape();
    char key[256];
    snprintf(key, sizeof key, "%s.x", tag);
    cm_tensor *x = cmt_golden_on_tape(g, tp, key, true);
    cm_tensor *mask = NULL;
    if (with_mask) {
        snprintf(key, sizeof key, "%s.mask", tag);
        mask = cmt_golden_on_tape(g, tp, key, false);
    }
    cm_tensor *in[2] = {x, mask};
    cm_tensor *y = cm_module_forward_n(m, tp, 2, in);
    cr_assert(y, "%s", cm_tape_error(tp));
    snprintf(key, sizeof key, "%s.y", tag);
    cm_tensor *want = cmt_golden_get(g, key);
    cmt_assert_close(key, y, want, 1e-5, 1e-4);
    cm_tensor_free(want);
    snprintf(key, sizeof key, "%s.gout", tag);
    cm_tensor *gout = cmt_golden_get(g, key);
    cr_assert_eq(cm_tape_backward_with(tp, y, gout), CM_OK, "%s", cm_tape_error(tp));
    cm_tensor_free(gout);
    snprintf(key, sizeof key, "%s.dx", tag);
    want = cmt_golden_get(g, key);
    cmt_assert_close(key, cm_tensor_grad(x), want, 1e-5, 1e-4);
    cm_tensor_free(want);
    for (int64_t i = 0; i < cm_module_n_params(m); i++) {
        cm_param_info p = cm_module_param_info(m, i);
        snprintf(key, sizeof key, "%s.grad.%s", tag, p.name);
        want = cmt_golden_get(g, key);
        /* read the gradient from the flat buffer, where the optimizer will */
        cm_tensor *flat;
        cm_tensor_from_data(CM_DTYPE_F32, cm_tensor_ndim(p.tensor), cm_tensor_shape(p.tensor),
                            cm_module_unit(m, p.unit)->grads + p.offset, &flat);
        cmt_assert_close(key, flat, want, 1e-5, 1e-4);
        cm_tensor_free(flat);
        cm_tensor_free(want);
    }
    cm_tape_free(tp);
    cmt_golden_close(g);
}

Test(layers, gpt2_block_matches_pytorch) {
    cm_nn_attention_config c = cm_nn_attention_config_default(16, 4);
    cm_module *m;
    cr_assert_eq(cm_nn_gpt_block_new(&c, 1, NULL, &m), CM_OK);
    check_block(m, "gpt", false);
    cr_assert_eq(cm_module_n_params(m), 12);
    cm_module_free(m);
}

Test(layers, bert_layer_matches_pytorch) {
    cm_nn_attention_config c = cm_nn_attention_config_default(16, 4);
    c.causal = false;
    c.act = CM_ACT_GELU;
    c.ln_eps = 1e-12f;
    cm_module *m;
    cr_assert_eq(cm_nn_bert_layer_new(&c, NULL, &m), CM_OK);
    check_block(m, "bert", true);
    cr_assert_eq(cm_module_n_params(m), 16);
    cr_assert_str_eq(cm_module_param_info(m, 0).name, "attention.self.query.weight");
    cm_module_free(m);
}
