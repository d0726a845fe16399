/* The surgery algorithms' math against PyTorch with Composer's formulas
 * (tests/golden/gen_surgery.py): BlurPool's filter (blur_2d at strides 1 and 2 with its gradient,
 * blurmax_pool2d, BlurConv2d in both orders, NCHW and channels-last), GhostBatchNorm's output,
 * gradients and running statistics, SqueezeExcite2d's output and gradients, a Bottleneck and a
 * BasicBlock under StochasticDepth in eval, ALiBi's slopes and biases (and a BertSelfAttention and
 * a causal GPT2Attention forward with them), and the low-precision norms under autocast.
 *
 * Tolerances: f32 results 1e-5 abs + 1e-5 rel (a few f32 roundings in another summation order);
 * the low-precision norms one bf16 rounding step (2^-8 relative + 1e-6: an f32 sum in another order
 * can land a result on the other side of a rounding boundary). */
#include "cmtest.h"

#include <composer/composer.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *k_path = "tests/golden/surgery.safetensors";

/* data: {file prefix, module prefix}: "<file prefix>X" loads into "<module prefix>X". */
static bool strip_prefix(const char *file_name, char *buf, size_t cap, void *data) {
    const char *const *pre = data;
    size_t n = strlen(pre[0]);
    if (strncmp(file_name, pre[0], n)) return false;
    snprintf(buf, cap, "%s%s", pre[1], file_name + n);
    return true;
}

/* Loads "<prefix><name>" tensors of the golden file into root by name; every parameter and
 * persistent buffer must be found. */
static void load_weights_into(cm_module *root, const char *prefix, const char *module_prefix) {
    const char *pre[2] = {prefix, module_prefix};
    cm_load_opts lo = cm_load_opts_default();
    lo.strict = false;
    lo.rename = strip_prefix;
    lo.rename_data = pre;
    cm_load_report rep;
    cr_assert_eq(cm_module_load_safetensors(root, k_path, &lo, &rep), CM_OK, "%s: %s", prefix, cm_last_error());
    if (!module_prefix[0]) cr_assert_eq(rep.n_missing, 0, "%s: missing %s", prefix, rep.missing);
}
static void load_weights(cm_module *root, const char *prefix) { load_weights_into(root, prefix, ""); }

/* (N, C, H, W) → (N, H, W, C) contiguous, and back. */
static cm_tensor *to_nhwc(cm_tape *tp, cm_tensor *x) { return cm_contiguous(tp, cm_permute(tp, x, (const int[]){0, 2, 3, 1})); }
static cm_tensor *to_nchw(cm_tape *tp, cm_tensor *x) { return cm_contiguous(tp, cm_permute(tp, x, (const int[]){0, 3, 1, 2})); }

Test(golden_surgery, blur_2d_matches_composer_at_both_strides_and_layouts) {
    cmt_golden *g = cmt_golden_open(k_path);
    cm_tape *tp = cmt_tape();
    cm_tensor *x = cmt_golden_on_tape(g, tp, "blur.x", true);
    cm_tensor *s1 = cm_blur_2d(tp, x, NULL, 1, false, false), *s2 = cm_blur_2d(tp, x, NULL, 2, false, false);
    cr_assert(s1 && s2, "%s", cm_tape_error(tp));
    cmt_assert_close("blur stride 1", s1, cmt_golden_on_tape(g, tp, "blur.s1", false), 1e-5, 1e-5);
    cmt_assert_close("blur stride 2", s2, cmt_golden_on_tape(g, tp, "blur.s2", false), 1e-5, 1e-5);
    cr_assert_eq(cm_tape_backward_with(tp, s2, cmt_golden_on_tape(g, tp, "blur.gout", false)), CM_OK);
    cmt_assert_close("blur dx", cm_tensor_grad(x), cmt_golden_on_tape(g, tp, "blur.dx", false), 1e-5, 1e-5);
    /* channels-last: the same numbers */
    cm_tensor *xl = to_nhwc(tp, cmt_golden_on_tape(g, tp, "blur.x", false));
    cmt_assert_close("blur stride 2, channels last", to_nchw(tp, cm_blur_2d(tp, xl, NULL, 2, true, false)),
                     cmt_golden_on_tape(g, tp, "blur.s2", false), 1e-5, 1e-5);
    cm_tensor *m = cmt_golden_on_tape(g, tp, "blurmax.x", false);
    cm_pool2d_opts po = cm_pool2d_opts_default(3, 3);
    po.stride[0] = po.stride[1] = 2, po.padding[0] = po.padding[1] = 1;
    cmt_assert_close("blurmax k3 s2 p1", cm_blurmax_pool2d(tp, m, &po, NULL),
                     cmt_golden_on_tape(g, tp, "blurmax.k3s2p1", false), 1e-5, 1e-5);
    po.channels_last = true;
    cmt_assert_close("blurmax k3 s2 p1, channels last", to_nchw(tp, cm_blurmax_pool2d(tp, to_nhwc(tp, m), &po, NULL)),
                     cmt_golden_on_tape(g, tp, "blurmax.k3s2p1", false), 1e-5, 1e-5);
    po = cm_pool2d_opts_default(2, 2);
    cmt_assert_close("blurmax k2 s2", cm_blurmax_pool2d(tp, m, &po, NULL), cmt_golden_on_tape(g, tp, "blurmax.k2s2p0", false),
                     1e-5, 1e-5);
    float f[9];
    cm_blur_filter_default(f);
    cr_expect(f[4] == 0.25f && f[0] == 0.0625f && f[1] == 0.125f, "the filter is [1 2 1; 2 4 2; 1 2 1] / 16");
    cm_tape_free(tp);
    cmt_golden_close(g);
}

/* Sequential(Conv2d(4, 6, 3, stride 2, padding 1)) with the golden weights, blurred. */
static void check_blurconv(cmt_golden *g, bool blur_first, bool channels_last) {
    cm_nn_conv2d_config cc = cm_nn_conv2d_config_default(4, 6, 3, 3);
    cc.opts.stride[0] = cc.opts.stride[1] = 2, cc.opts.padding[0] = cc.opts.padding[1] = 1;
    cc.opts.channels_last = channels_last;
    cm_module *seq, *conv;
    cm_nn_sequential_new(&seq);
    cr_assert_eq(cm_nn_conv2d_new(&cc, NULL, &conv), CM_OK);
    cm_nn_sequential_append(seq, conv);
    cr_assert_eq(cm_module_finalize(seq), CM_OK);
    cm_tensor *w = cmt_golden_get(g, "bconv.w"), *b = cmt_golden_get(g, "bconv.b");
    cm_tensor_copy(cm_module_find_param(seq, "0.weight"), w);
    cm_tensor_copy(cm_module_find_param(seq, "0.bias"), b);
    cm_blurpool_config bc = cm_blurpool_config_default();
    bc.blur_first = blur_first, bc.min_channels = 4;
    int64_t nc, np;
    cr_assert_eq(cm_apply_blurpool(seq, &bc, &nc, &np), CM_OK, "%s", cm_last_error());
    cr_assert_eq(nc, 1);
    cr_assert_eq(np, 0);
    cr_assert_str_eq(cm_module_type_name(cm_module_child_at(seq, 0)), "BlurConv2d");
    cr_assert(cm_module_find_param(seq, "0.conv.weight") && cm_module_find_buffer(seq, "0.blur_filter"),
              "Composer's names: conv.weight, blur_filter");
    cm_tape *tp = cmt_tape();
    cm_tensor *x = cmt_golden_on_tape(g, tp, "bconv.x", false);
    cm_tensor *y = cm_module_forward(seq, tp, channels_last ? to_nhwc(tp, x) : x);
    cr_assert(y, "%s", cm_tape_error(tp));
    if (channels_last) y = to_nchw(tp, y);
    char what[64];
    snprintf(what, sizeof what, "BlurConv2d blur_first=%d channels_last=%d", blur_first, channels_last);
    cmt_assert_close(what, y, cmt_golden_on_tape(g, tp, blur_first ? "bconv.first" : "bconv.after", false), 1e-5, 1e-5);
    cm_tape_free(tp);
    cm_tensor_free(w);
    cm_tensor_free(b);
    cm_module_free(seq);
}

Test(golden_surgery, blurconv2d_in_both_orders_matches_composer) {
    cmt_golden *g = cmt_golden_open(k_path);
    for (int i = 0; i < 4; i++) check_blurconv(g, i & 1, i & 2);
    cmt_golden_close(g);
}

Test(golden_surgery, ghost_batchnorm_statistics_outputs_and_gradients_match_composer) {
    cmt_golden *g = cmt_golden_open(k_path);
    cm_module *seq, *bn;
    cm_nn_sequential_new(&seq);
    cr_assert_eq(cm_nn_batch_norm2d_new(3, NULL, &bn), CM_OK);
    cm_nn_sequential_append(seq, bn);
    cr_assert_eq(cm_module_finalize(seq), CM_OK);
    const char *from[4] = {"gbn.w", "gbn.b", "gbn.rm0", "gbn.rv0"};
    cm_tensor *to[4] = {cm_module_find_param(seq, "0.weight"), cm_module_find_param(seq, "0.bias"),
                        cm_module_find_buffer(seq, "0.running_mean"), cm_module_find_buffer(seq, "0.running_var")};
    for (int i = 0; i < 4; i++) {
        cm_tensor *t = cmt_golden_get(g, from[i]);
        cm_tensor_copy(to[i], t);
        cm_tensor_free(t);
    }
    int64_t n;
    cr_assert_eq(cm_apply_ghost_batchnorm(seq, 4, &n), CM_OK, "%s", cm_last_error());
    cr_assert_eq(n, 1);
    cr_assert(cm_module_find_param(seq, "0.batchnorm.weight"), "Composer's name: batchnorm.weight");
    cm_tape *tp = cmt_tape();
    cm_tensor *x = cmt_golden_on_tape(g, tp, "gbn.x", true);
    cm_tensor *y = cm_module_forward(seq, tp, x);
    cr_assert(y, "%s", cm_tape_error(tp));
    cmt_assert_close("ghost bn y", y, cmt_golden_on_tape(g, tp, "gbn.y", false), 1e-5, 1e-5);
    cr_assert_eq(cm_tape_backward_with(tp, y, cmt_golden_on_tape(g, tp, "gbn.gout", false)), CM_OK);
    cmt_assert_close("ghost bn dx", cm_tensor_grad(x), cmt_golden_on_tape(g, tp, "gbn.dx", false), 1e-5, 1e-4);
    cmt_assert_close("ghost bn dw", cm_tensor_grad(cm_module_find_param(seq, "0.batchnorm.weight")),
                     cmt_golden_on_tape(g, tp, "gbn.dw", false), 1e-5, 1e-4);
    cmt_assert_close("ghost bn db", cm_tensor_grad(cm_module_find_param(seq, "0.batchnorm.bias")),
                     cmt_golden_on_tape(g, tp, "gbn.db", false), 1e-5, 1e-4);
    cmt_assert_close("running mean (momentum / 3, three chunks)", cm_module_find_buffer(seq, "0.batchnorm.running_mean"),
                     cmt_golden_on_tape(g, tp, "gbn.rm", false), 1e-6, 1e-5);
    cmt_assert_close("running var", cm_module_find_buffer(seq, "0.batchnorm.running_var"),
                     cmt_golden_on_tape(g, tp, "gbn.rv", false), 1e-6, 1e-5);
    cmt_assert_close("num_batches_tracked", cm_module_find_buffer(seq, "0.batchnorm.num_batches_tracked"),
                     cmt_golden_on_tape(g, tp, "gbn.nbt", false), 0, 0);
    /* eval: the running statistics, for any batch size (Composer would refuse 5 < 4? no: 5 >= 4) */
    cm_module_train(seq, false);
    cmt_assert_close("ghost bn eval", cm_module_forward(seq, tp, cmt_golden_on_tape(g, tp, "gbn.xe", false)),
                     cmt_golden_on_tape(g, tp, "gbn.ye", false), 1e-5, 1e-5);
    /* training on fewer rows than a ghost batch: Composer's error */
    cm_module_train(seq, true);
    const int64_t small[4] = {3, 3, 2, 2};
    cm_tensor *r = cm_module_forward(seq, tp, cmt_randn(tp, 4, small, 1, false));
    cmt_expect_error(tp, r, CM_ERR_SHAPE, "worker batch size 3 < ghost_batch_size 4", NULL);
    cm_tape_free(tp);
    cm_module_free(seq);
    cmt_golden_close(g);
}

static void check_se(cmt_golden *g, bool channels_last) {
    cm_module *se;
    cr_assert_eq(cm_squeeze_excite2d_new(6, 3, channels_last, NULL, &se), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_module_finalize(se), CM_OK);
    cm_tensor *w1 = cm_module_find_param(se, "pool_and_mlp.2.weight"), *w2 = cm_module_find_param(se, "pool_and_mlp.4.weight");
    cr_assert(w1 && w2, "Composer's names pool_and_mlp.2.weight, pool_and_mlp.4.weight");
    cm_tensor *t = cmt_golden_get(g, "se.w1");
    cm_tensor_copy(w1, t);
    cm_tensor_free(t);
    t = cmt_golden_get(g, "se.w2");
    cm_tensor_copy(w2, t);
    cm_tensor_free(t);
    cm_tape *tp = cmt_tape();
    cm_tensor *x = cmt_golden_on_tape(g, tp, "se.x", true);
    cm_tensor *y = cm_module_forward(se, tp, channels_last ? to_nhwc(tp, x) : x);
    cr_assert(y, "%s", cm_tape_error(tp));
    if (channels_last) y = to_nchw(tp, y);
    cmt_assert_close("SqueezeExcite2d y", y, cmt_golden_on_tape(g, tp, "se.y", false), 1e-5, 1e-5);
    cr_assert_eq(cm_tape_backward_with(tp, y, cmt_golden_on_tape(g, tp, "se.gout", false)), CM_OK);
    cmt_assert_close("SqueezeExcite2d dx", cm_tensor_grad(x), cmt_golden_on_tape(g, tp, "se.dx", false), 1e-5, 1e-5);
    cmt_assert_close("SqueezeExcite2d dW1", cm_tensor_grad(w1), cmt_golden_on_tape(g, tp, "se.dw1", false), 1e-5, 1e-5);
    cmt_assert_close("SqueezeExcite2d dW2", cm_tensor_grad(w2), cmt_golden_on_tape(g, tp, "se.dw2", false), 1e-5, 1e-5);
    cm_tape_free(tp);
    cm_module_free(se);
}

Test(golden_surgery, squeeze_excite_matches_composer) {
    cmt_golden *g = cmt_golden_open(k_path);
    check_se(g, false);
    check_se(g, true);
    cr_expect_eq(cm_squeeze_excite_latent(64, 256), 64);
    cr_expect_eq(cm_squeeze_excite_latent(0.125, 256), 32);
    cr_expect_eq(cm_squeeze_excite_latent(0.3, 10), 3, "truncated, as int() in Composer");
    cmt_golden_close(g);
}

static void check_sd_block(cmt_golden *g, const char *tag, cm_resnet_block_kind kind, int64_t in, int64_t planes) {
    cm_resnet_config rc = cm_resnet_config_default();
    rc.block = kind;
    rc.channels_last = false;
    rc.random_init = false;
    cm_module *blk;
    cr_assert_eq(cm_resnet_block_new(&rc, in, planes, 2, NULL, &blk), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_module_finalize(blk), CM_OK);
    char pre[16];
    snprintf(pre, sizeof pre, "%s.w.", tag);
    load_weights(blk, pre);
    cm_tensor *rate = cmt_golden_get(g, strcmp(tag, "sdb") ? "sdk.rate" : "sdb.rate");
    const float p = (float)cm_tensor_get_flat(rate, 0);
    cm_tensor_free(rate);
    cm_module_train(blk, false);
    for (int mode = CM_RESNET_DROP_BLOCK; mode <= CM_RESNET_DROP_SAMPLE; mode++) {
        cr_assert_eq(cm_resnet_block_set_drop(blk, (cm_resnet_drop_mode)mode, p), CM_OK, "%s", cm_last_error());
        cm_tape *tp = cmt_tape();
        char k[32], what[96];
        snprintf(k, sizeof k, "%s.x", tag);
        cm_tensor *y = cm_module_forward(blk, tp, cmt_golden_on_tape(g, tp, k, false));
        cr_assert(y, "%s", cm_tape_error(tp));
        snprintf(k, sizeof k, "%s.y", tag);
        snprintf(what, sizeof what, "%s eval under stochastic depth (%s)", tag, mode == CM_RESNET_DROP_BLOCK ? "block" : "sample");
        cmt_assert_close(what, y, cmt_golden_on_tape(g, tp, k, false), 1e-5, 1e-5);
        cm_tape_free(tp);
    }
    cm_module_free(blk);
}

Test(golden_surgery, stochastic_depth_in_eval_matches_composer) {
    cmt_golden *g = cmt_golden_open(k_path);
    check_sd_block(g, "sdb", CM_RESNET_BOTTLENECK, 8, 4);
    check_sd_block(g, "sdk", CM_RESNET_BASIC, 4, 8);
    cmt_golden_close(g);
}

Test(golden_surgery, alibi_slopes_bias_and_attention_match_composer) {
    cmt_golden *g = cmt_golden_open(k_path);
    const int hs[8] = {1, 2, 4, 6, 8, 12, 16, 25};
    for (int i = 0; i < 8; i++) {
        float s[32];
        cm_alibi_slopes(hs[i], s);
        char k[32];
        snprintf(k, sizeof k, "alibi.slopes%d", hs[i]);
        cm_tensor *want = cmt_golden_get(g, k);
        cmt_assert_close_f32(k, s, cm_tensor_data(want), hs[i], 1e-7, 1e-6);
        cm_tensor_free(want);
    }
    float bias[6 * 5 * 5];
    cm_alibi_bias(6, 5, bias);
    cm_tensor *want = cmt_golden_get(g, "alibi.bert_bias_h6_t5");
    cmt_assert_close_f32("BERT alibi bias", bias, cm_tensor_data(want), 150, 1e-7, 1e-6);
    cm_tensor_free(want);

    /* BertSelfAttention with ALiBi on */
    cm_nn_attention_config ac = cm_nn_attention_config_default(12, 4);
    ac.causal = false;
    cm_module *layer;
    cr_assert_eq(cm_nn_bert_layer_new(&ac, NULL, &layer), CM_OK);
    cr_assert_eq(cm_module_finalize(layer), CM_OK);
    cm_module *self = cm_module_find(layer, "attention.self");
    const char *names[3] = {"query", "key", "value"};
    for (int i = 0; i < 3; i++)
        for (int wb = 0; wb < 2; wb++) {
            char k[64], p[64];
            snprintf(k, sizeof k, "alibi.bert.w.%s.%s", names[i], wb ? "bias" : "weight");
            snprintf(p, sizeof p, "%s.%s", names[i], wb ? "bias" : "weight");
            cm_tensor *t = cmt_golden_get(g, k);
            cm_tensor_copy(cm_module_find_param(self, p), t);
            cm_tensor_free(t);
        }
    cr_assert_eq(cm_nn_attention_set_alibi(self, true), CM_OK);
    cm_tape *tp = cmt_tape();
    cmt_assert_close("BertSelfAttention with ALiBi", cm_module_forward(self, tp, cmt_golden_on_tape(g, tp, "alibi.bert.x", false)),
                     cmt_golden_on_tape(g, tp, "alibi.bert.y", false), 1e-5, 1e-5);

    /* GPT2Attention (causal) with ALiBi: Composer adds slope·j; ours -slope·|i-j| gives the same */
    cm_nn_attention_config gc = cm_nn_attention_config_default(12, 4);
    cm_module *attn;
    cr_assert_eq(cm_nn_attention_new(&gc, NULL, &attn), CM_OK);
    cr_assert_eq(cm_module_finalize(attn), CM_OK);
    const char *gp[4] = {"c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias"};
    for (int i = 0; i < 4; i++) {
        char k[64];
        snprintf(k, sizeof k, "alibi.gpt.w.%s", gp[i]);
        cm_tensor *t = cmt_golden_get(g, k);
        cm_tensor_copy(cm_module_find_param(attn, gp[i]), t);
        cm_tensor_free(t);
    }
    cr_assert_eq(cm_nn_attention_set_alibi(attn, true), CM_OK);
    cmt_assert_close("GPT2Attention with ALiBi", cm_module_forward(attn, tp, cmt_golden_on_tape(g, tp, "alibi.gpt.x", false)),
                     cmt_golden_on_tape(g, tp, "alibi.gpt.y", false), 1e-5, 1e-5);
    cm_nn_attention_set_alibi(attn, false);
    cm_tensor *plain = cm_module_forward(attn, tp, cmt_golden_on_tape(g, tp, "alibi.gpt.x", false));
    cm_tensor *with = cmt_golden_on_tape(g, tp, "alibi.gpt.y", false);
    double d = 0;
    for (int64_t i = 0; i < cm_tensor_numel(with); i++) d = fmax(d, fabs(cm_tensor_get_flat(plain, i) - cm_tensor_get_flat(with, i)));
    cr_assert(d > 1e-3, "without the bias the output differs (max |diff| %g)", d);
    cm_tape_free(tp);
    cm_module_free(attn);
    cm_module_free(layer);
    cmt_golden_close(g);
}

/* |a - b| <= one bf16 step of b, elementwise. */
static void assert_bf16_close(const char *what, const cm_tensor *a, const cm_tensor *b) {
    for (int64_t i = 0; i < cm_tensor_numel(b); i++) {
        const double x = cm_tensor_get_flat(a, i), y = cm_tensor_get_flat(b, i);
        cr_assert(fabs(x - y) <= ldexp(fabs(y), -8) + 1e-6, "%s[%lld]: %.9g vs %.9g", what, (long long)i, x, y);
    }
}

Test(golden_surgery, low_precision_norms_match_lp_layernorm_under_autocast) {
    cmt_golden *g = cmt_golden_open(k_path);
    for (int gn = 0; gn < 2; gn++) {
        const char *tag = gn ? "lpgn" : "lpln";
        cm_module *m, *root;
        cm_nn_sequential_new(&root);
        cr_assert_eq(gn ? cm_nn_group_norm_new(3, 6, 1e-5f, true, &m) : cm_nn_layer_norm_new(10, 1e-5f, true, &m), CM_OK);
        cm_nn_sequential_append(root, m);
        cr_assert_eq(cm_module_finalize(root), CM_OK);
        char k[32];
        snprintf(k, sizeof k, "%s.w", tag);
        cm_tensor *t = cmt_golden_get(g, k);
        cm_tensor_copy(cm_module_param(m, "weight"), t);
        cm_tensor_free(t);
        snprintf(k, sizeof k, "%s.b", tag);
        t = cmt_golden_get(g, k);
        cm_tensor_copy(cm_module_param(m, "bias"), t);
        cm_tensor_free(t);
        int64_t n = -1;
        cr_assert_eq(gn ? cm_apply_low_precision_groupnorm(root, CM_PRECISION_AMP_BF16, &n)
                        : cm_apply_low_precision_layernorm(root, CM_PRECISION_AMP_BF16, &n),
                     CM_OK, "%s", cm_last_error());
        cr_assert_eq(n, 1);
        cr_assert(cm_nn_norm_is_low_precision(m));
        cm_tape *tp = cmt_tape();
        snprintf(k, sizeof k, "%s.x", tag);
        cm_tensor *x = cmt_golden_on_tape(g, tp, k, true);
        cm_tape_set_autocast(tp, CM_DTYPE_BF16);
        cm_tensor *y = cm_module_forward(root, tp, x);
        cr_assert(y, "%s", cm_tape_error(tp));
        snprintf(k, sizeof k, "%s.y", tag);
        cm_tensor *want = cmt_golden_on_tape(g, tp, k, false);
        assert_bf16_close(tag, y, want);
        /* the values are bf16 ones */
        for (int64_t i = 0; i < cm_tensor_numel(y); i++) {
            const float v = (float)cm_tensor_get_flat(y, i);
            uint32_t u;
            memcpy(&u, &v, 4);
            cr_assert_eq(u & 0xffffu, 0, "%s[%lld] = %.9g is not a bf16 value", tag, (long long)i, v);
        }
        cr_assert_eq(cm_tape_backward(tp, cm_sum(tp, y, NULL, 0, false)), CM_OK, "%s", cm_tape_error(tp));
        cr_assert(cm_tensor_grad(x) && cm_tensor_grad(cm_module_param(m, "weight")), "gradients pass the roundings");
        /* without autocast: the f32 norm */
        cm_tape_set_autocast(tp, CM_DTYPE_F32);
        cm_tensor *yf = cm_module_forward(root, tp, x);
        cm_tensor *ref = gn ? cm_group_norm(tp, x, 3, cm_module_param(m, "weight"), cm_module_param(m, "bias"), 1e-5f)
                            : cm_layer_norm(tp, x, cm_module_param(m, "weight"), cm_module_param(m, "bias"), 1e-5f);
        cmt_assert_close("f32 without autocast", yf, ref, 0, 0);
        cm_tape_free(tp);
        cm_module_free(root);
    }
    cmt_golden_close(g);
}

Test(golden_surgery, weight_standardization_matches_composer) {
    cmt_golden *g = cmt_golden_open(k_path);
    cm_tape *tp = cmt_tape();
    cmt_assert_close("standardized weight", cm_nn_standardize_weight(tp, cmt_golden_on_tape(g, tp, "ws.w", false)),
                     cmt_golden_on_tape(g, tp, "ws.std", false), 1e-5, 1e-5);
    cm_nn_conv2d_config cc = cm_nn_conv2d_config_default(4, 6, 3, 3);
    cc.bias = false, cc.opts.padding[0] = cc.opts.padding[1] = 1;
    cm_module *seq, *conv;
    cm_nn_sequential_new(&seq);
    cr_assert_eq(cm_nn_conv2d_new(&cc, NULL, &conv), CM_OK);
    cm_nn_sequential_append(seq, conv);
    cr_assert_eq(cm_module_finalize(seq), CM_OK);
    cm_tensor *w = cmt_golden_get(g, "ws.w");
    cm_tensor_copy(cm_module_param(conv, "weight"), w);
    cm_tensor_free(w);
    int64_t n;
    cr_assert_eq(cm_apply_weight_standardization(seq, 0, &n), CM_OK, "%s", cm_last_error());
    cr_assert_eq(n, 1);
    cm_tensor *x = cmt_golden_on_tape(g, tp, "ws.x", true);
    cm_tensor *y = cm_module_forward(seq, tp, x);
    cr_assert(y, "%s", cm_tape_error(tp));
    cmt_assert_close("conv with the standardized weight", y, cmt_golden_on_tape(g, tp, "ws.y", false), 1e-5, 1e-5);
    cr_assert_eq(cm_tape_backward_with(tp, y, cmt_golden_on_tape(g, tp, "ws.gout", false)), CM_OK);
    cmt_assert_close("dx", cm_tensor_grad(x), cmt_golden_on_tape(g, tp, "ws.dx", false), 1e-5, 1e-5);
    cmt_assert_close("dW through the standardization", cm_tensor_grad(cm_module_param(conv, "weight")),
                     cmt_golden_on_tape(g, tp, "ws.dw", false), 1e-4, 1e-4);
    cm_apply_weight_standardization(seq, 1, &n);
    cr_expect_eq(n, 0, "n_last_layers_ignore 1 leaves the only conv... (already on: it stays on)");
    cm_tape_free(tp);
    cm_module_free(seq);
    cmt_golden_close(g);
}

/* a (r, k) · b (k, c) into out (r, c). */
static void matmul_f32(const float *a, const float *b, int64_t r, int64_t k, int64_t c, float *out) {
    for (int64_t i = 0; i < r; i++)
        for (int64_t j = 0; j < c; j++) {
            double s = 0;
            for (int64_t t = 0; t < k; t++) s += (double)a[i * k + t] * b[t * c + j];
            out[i * c + j] = (float)s;
        }
}

Test(golden_surgery, factorize_starts_from_composers_svd_initialisation) {
    cmt_golden *g = cmt_golden_open(k_path);
    /* a Linear(20, 12): module1 (12, 5) · module0 (5, 20) = the rank-5 SVD product (transposed:
     * Composer factors the (in, out) matrix) */
    cm_module *seq, *lin;
    cm_nn_sequential_new(&seq);
    cr_assert_eq(cm_nn_linear_new(20, 12, true, NULL, &lin), CM_OK);
    cm_nn_sequential_append(seq, lin);
    cr_assert_eq(cm_module_finalize(seq), CM_OK);
    cm_tensor *w = cmt_golden_get(g, "fac.lw");
    cm_tensor_copy(cm_module_param(lin, "weight"), w);
    cm_factorize_config fc = cm_factorize_config_default();
    fc.factorize_convs = false, fc.min_features = 0, fc.latent_features = 5;
    int64_t nc, nl;
    cr_assert_eq(cm_apply_factorization(seq, &fc, &nc, &nl), CM_OK, "%s", cm_last_error());
    cr_assert_eq(nl, 1);
    cr_assert_str_eq(cm_module_type_name(cm_module_child_at(seq, 0)), "FactorizedLinear");
    float eff[12 * 20], want[12 * 20];
    matmul_f32(cm_tensor_data(cm_module_find_param(seq, "0.module1.weight")),
               cm_tensor_data(cm_module_find_param(seq, "0.module0.weight")), 12, 5, 20, eff);
    cm_tensor *prod = cmt_golden_get(g, "fac.lprod5"); /* (20, 12) */
    for (int i = 0; i < 12; i++)
        for (int j = 0; j < 20; j++) want[i * 20 + j] = (float)cm_tensor_get_flat(prod, j * 12 + i);
    cmt_assert_close_f32("rank-5 linear", eff, want, 240, 1e-5, 1e-5);
    float p[12 * 12], q[12 * 20], sv[12];
    cr_assert_eq(cm_factorize_svd(cm_tensor_data(w), 12, 20, 12, p, q, sv), CM_OK);
    cm_tensor *s = cmt_golden_get(g, "fac.ls");
    cmt_assert_close_f32("singular values", sv, cm_tensor_data(s), 12, 1e-5, 1e-5);
    matmul_f32(p, q, 12, 12, 20, eff);
    cmt_assert_close_f32("full rank: the weight itself", eff, cm_tensor_data(w), 240, 1e-5, 1e-5);
    cm_tensor_free(s), cm_tensor_free(prod), cm_tensor_free(w);
    cm_module_free(seq);

    /* a Conv2d(6, 8, 3×3) at rank 3: the factorized convolution's output is Composer's */
    cm_nn_conv2d_config cc = cm_nn_conv2d_config_default(6, 8, 3, 3);
    cc.opts.padding[0] = cc.opts.padding[1] = 1;
    cm_module *conv;
    cm_nn_sequential_new(&seq);
    cr_assert_eq(cm_nn_conv2d_new(&cc, NULL, &conv), CM_OK);
    cm_nn_sequential_append(seq, conv);
    cr_assert_eq(cm_module_finalize(seq), CM_OK);
    w = cmt_golden_get(g, "fac.cw");
    cm_tensor *b = cmt_golden_get(g, "fac.cb");
    cm_tensor_copy(cm_module_param(conv, "weight"), w);
    cm_tensor_copy(cm_module_param(conv, "bias"), b);
    fc = cm_factorize_config_default();
    fc.factorize_linears = false, fc.min_channels = 0, fc.latent_channels = 3;
    cr_assert_eq(cm_apply_factorization(seq, &fc, &nc, &nl), CM_OK, "%s", cm_last_error());
    cr_assert_eq(nc, 1);
    cr_assert(cm_module_find_param(seq, "0.module0.weight") && cm_module_find_param(seq, "0.module1.bias"),
              "Composer's names module0 / module1");
    cm_tape *tp = cmt_tape();
    cmt_assert_close("rank-3 convolution", cm_module_forward(seq, tp, cmt_golden_on_tape(g, tp, "fac.cx", false)),
                     cmt_golden_on_tape(g, tp, "fac.cy", false), 1e-4, 1e-4);
    cm_tape_free(tp);
    cm_tensor_free(w), cm_tensor_free(b);
    cm_module_free(seq);
    /* Composer's rules */
    cr_expect_eq(cm_factorize_latent_size(0.25, 512, 256), 64);
    cr_expect_eq(cm_factorize_latent_size(0.001, 512, 256), 1);
    cr_expect_eq(cm_factorize_latent_size(128, 512, 256), 128);
    cr_expect_eq(cm_factorize_max_rank(256, 256, 9), 230, "ceil(2304·256/2560 - 1)");
    cr_expect_eq(cm_factorize_max_rank(512, 512, 1), 255, "divides evenly: one lower");
    cmt_golden_close(g);
}

Test(golden_surgery, gated_linear_units_output_matches_composer) {
    cmt_golden *g = cmt_golden_open(k_path);
    cm_nn_attention_config ac = cm_nn_attention_config_default(8, 2);
    ac.causal = false, ac.mlp_ratio = 2, ac.ln_eps = 1e-12f, ac.act = CM_ACT_GELU;
    cm_module *layer;
    cr_assert_eq(cm_nn_bert_layer_new(&ac, NULL, &layer), CM_OK);
    cr_assert_eq(cm_module_finalize(layer), CM_OK);
    cm_gated_linear_units_config gc = cm_gated_linear_units_config_default();
    int64_t n;
    cr_assert_eq(cm_apply_gated_linear_units(layer, &gc, 1, &n), CM_OK, "%s", cm_last_error());
    cr_assert_eq(n, 2, "intermediate and output");
    cr_assert_str_eq(cm_module_type_name(cm_module_child(layer, "intermediate")), "Identity");
    cm_module *out = cm_module_child(layer, "output");
    cr_assert_str_eq(cm_module_type_name(out), "BERTGatedFFOutput");
    load_weights_into(layer, "glu.w.", "output.");
    cm_tape *tp = cmt_tape();
    cm_tensor *h = cmt_golden_on_tape(g, tp, "glu.h", true);
    cm_tensor *in[2] = {h, h};
    cm_tensor *y = cm_module_forward_n(out, tp, 2, in);
    cr_assert(y, "%s", cm_tape_error(tp));
    cmt_assert_close("BERTGatedFFOutput", y, cmt_golden_on_tape(g, tp, "glu.y", false), 1e-5, 1e-5);
    cr_assert_eq(cm_tape_backward_with(tp, y, cmt_golden_on_tape(g, tp, "glu.gout", false)), CM_OK);
    cmt_assert_close("dh (both paths)", cm_tensor_grad(h), cmt_golden_on_tape(g, tp, "glu.dh", false), 1e-5, 1e-4);
    cm_tape_free(tp);
    cm_module_free(layer);
    cmt_golden_close(g);
}
