/* Activation checkpointing (cm_tape_checkpoint, cm_module_checkpoint_policy): the same losses and
 * gradients, bit for bit in fp32 with dropout on, for GPT-2, BERT and ResNet; the same batch
 * norm running statistics; the same training under microbatching and amp_bf16; less activation
 * memory; policies and their errors. */
#include "cmtest.h"

#include <composer/zoo_bert.h>
#include <composer/zoo_gpt2.h>
#include <composer/zoo_vision.h>

#include <math.h>
#include <string.h>

/* ---- one forward + backward of a model, with or without checkpointing ---- */

typedef struct {
    float loss;
    float *grads;   /* every unit's flat gradient, concatenated */
    int64_t n_grads;
    float *bufs;    /* every f32 buffer after the step (running statistics) */
    int64_t n_bufs;
    int64_t nodes;  /* tape nodes after forward + loss */
    int64_t regions;
    size_t peak;    /* cm_tape_peak_bytes */
} step_out;

static void step_out_free(step_out *o) {
    cm_free(o->grads);
    cm_free(o->bufs);
}

typedef cm_model_batch (*batch_fn)(cm_tape *tp);

static float *snapshot_bufs(cm_module *root, int64_t *n) {
    int64_t total = 0;
    for (int64_t i = 0; i < cm_module_n_buffers(root); i++) {
        cm_tensor *t = cm_module_buffer_info(root, i).tensor;
        if (t && cm_tensor_dtype(t) == CM_DTYPE_F32) total += cm_tensor_numel(t);
    }
    float *v = cm_alloc(sizeof(float) * (size_t)(total + 1), 64);
    cr_assert(v);
    int64_t k = 0;
    for (int64_t i = 0; i < cm_module_n_buffers(root); i++) {
        cm_tensor *t = cm_module_buffer_info(root, i).tensor;
        if (!t || cm_tensor_dtype(t) != CM_DTYPE_F32) continue;
        memcpy(v + k, cm_tensor_data(t), sizeof(float) * (size_t)cm_tensor_numel(t));
        k += cm_tensor_numel(t);
    }
    *n = total;
    return v;
}

static void restore_bufs(cm_module *root, const float *v) {
    int64_t k = 0;
    for (int64_t i = 0; i < cm_module_n_buffers(root); i++) {
        cm_tensor *t = cm_module_buffer_info(root, i).tensor;
        if (!t || cm_tensor_dtype(t) != CM_DTYPE_F32) continue;
        memcpy(cm_tensor_data(t), v + k, sizeof(float) * (size_t)cm_tensor_numel(t));
        k += cm_tensor_numel(t);
    }
}

/* Seeds the dropout streams, runs forward, loss and backward on a fresh poisoned tape, and
 * returns what came out. */
static step_out run_step(cm_model *m, batch_fn make_batch, cm_dtype autocast) {
    cm_module *root = cm_model_module(m);
    cm_module_set_seed(root, 1234);
    cm_module_zero_grad(root);
    cm_tape *tp = cmt_tape();
    cm_tape_set_autocast(tp, autocast);
    cm_model_batch b = make_batch(tp);
    cm_tensor *out = cm_model_forward(m, tp, &b);
    cr_assert(out, "%s", cm_tape_error(tp));
    cm_tensor *loss = cm_model_loss(m, tp, out, &b);
    cr_assert(loss, "%s", cm_tape_error(tp));
    step_out o = {0};
    o.nodes = cm_tape_n_nodes(tp);
    o.regions = cm_tape_n_checkpoints(tp);
    o.loss = (float)cm_tensor_get_flat(loss, 0);
    cr_assert_eq(cm_tape_backward(tp, loss), CM_OK, "%s", cm_tape_error(tp));
    o.peak = cm_tape_peak_bytes(tp);
    for (int u = 0; u < cm_module_n_units(root); u++) o.n_grads += cm_module_unit(root, u)->numel;
    o.grads = cm_alloc(sizeof(float) * (size_t)o.n_grads, 64);
    cr_assert(o.grads);
    int64_t k = 0;
    for (int u = 0; u < cm_module_n_units(root); u++) {
        const cm_unit_info *ui = cm_module_unit(root, u);
        memcpy(o.grads + k, ui->grads, sizeof(float) * (size_t)ui->numel);
        k += ui->numel;
    }
    o.bufs = snapshot_bufs(root, &o.n_bufs);
    cm_tape_free(tp);
    return o;
}

static bool clear_fn(cm_module *m, const char *path, int depth, void *data) {
    (void)path, (void)depth, (void)data;
    cm_module_set_checkpointing(m, false);
    return true;
}

static void assert_bits(const char *what, const char *field, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t x, y;
        memcpy(&x, &a[i], 4);
        memcpy(&y, &b[i], 4);
        cr_assert_eq(x, y, "%s: %s[%lld] %.9g without checkpointing, %.9g with", what, field, (long long)i, a[i], b[i]);
    }
}

/* Runs the step without and with checkpointing (the policy's targets; n = 0: the default) from the
 * same buffers, and asserts the loss, every gradient and every f32 buffer are the same bits, that
 * the policy marked want_marked modules and that the checkpointed forward recorded that many
 * regions and no more nodes. Returns the two peaks (bytes) in peaks[0] (off) and peaks[1] (on). */
static void assert_same_bits(const char *what, cm_model *m, batch_fn make_batch, const cm_act_ckpt_target *targets,
                             int n_targets, int want_marked, cm_dtype autocast, size_t *peaks) {
    cm_module *root = cm_model_module(m);
    int64_t nb;
    float *bufs0 = snapshot_bufs(root, &nb);
    cm_module_visit(root, clear_fn, NULL);
    step_out ref = run_step(m, make_batch, autocast);
    cr_assert_eq(ref.regions, 0);
    restore_bufs(root, bufs0);
    int marked = -1;
    cr_assert_eq(cm_module_checkpoint_policy(root, targets, n_targets, &marked), CM_OK, "%s", cm_last_error());
    cr_assert_eq(marked, want_marked, "%s: %d modules marked, want %d", what, marked, want_marked);
    step_out ck = run_step(m, make_batch, autocast);
    cr_assert_eq(ck.regions, want_marked, "%s: %lld regions recorded, want %d", what, (long long)ck.regions,
                 want_marked);
    cr_assert_leq(ck.nodes, ref.nodes, "%s: %lld nodes with checkpointing, %lld without", what, (long long)ck.nodes,
                 (long long)ref.nodes);
    assert_bits(what, "loss", &ref.loss, &ck.loss, 1);
    cr_assert_eq(ref.n_grads, ck.n_grads);
    assert_bits(what, "gradient", ref.grads, ck.grads, ref.n_grads);
    assert_bits(what, "buffer", ref.bufs, ck.bufs, ref.n_bufs);
    if (peaks) peaks[0] = ref.peak, peaks[1] = ck.peak;
    cm_module_visit(root, clear_fn, NULL);
    restore_bufs(root, bufs0);
    cm_free(bufs0);
    step_out_free(&ref);
    step_out_free(&ck);
}

/* ---- the models ---- */

static cm_model *gpt2(int64_t layers, float pdrop) {
    cm_gpt2_config c;
    cr_assert_eq(cm_gpt2_config_preset("tiny", &c), CM_OK);
    c.n_layer = layers;
    c.embd_pdrop = c.attn_pdrop = c.resid_pdrop = pdrop;
    cm_rng rng = cm_rng_init(5, 0);
    cm_model *m;
    cr_assert_eq(cm_gpt2_new(&c, &rng, &m), CM_OK, "%s", cm_last_error());
    return m;
}

static int64_t g_B = 4, g_T = 16;
static cm_model_batch gpt_batch(cm_tape *tp) {
    static const char *names[2] = {"input_ids", "labels"};
    static cm_tensor *f[2];
    const int64_t s[2] = {g_B, g_T};
    f[0] = cmt_randint(tp, 2, s, 11, 0, 96);
    f[1] = cmt_randint(tp, 2, s, 12, 0, 96);
    return (cm_model_batch){names, f, 2, g_B, g_B * g_T};
}

Test(act_ckpt, gpt2_blocks_give_the_same_bits_with_dropout) {
    cm_model *m = gpt2(3, 0.1f);
    size_t peaks[2];
    assert_same_bits("GPT-2 default policy", m, gpt_batch, NULL, 0, 3, CM_DTYPE_F32, peaks);
    /* by type name, some blocks only; the attention inside a block */
    const cm_act_ckpt_target t1[1] = {{"gpt2block", "first-1,last-1"}};
    assert_same_bits("GPT-2 first-1,last-1", m, gpt_batch, t1, 1, 2, CM_DTYPE_F32, NULL);
    const cm_act_ckpt_target t2[1] = {{"GPT2Attention", "every-2"}};
    assert_same_bits("GPT-2 attention every-2", m, gpt_batch, t2, 1, 2, CM_DTYPE_F32, NULL);
    cm_model_free(m);
}

Test(act_ckpt, gpt2_under_autocast_gives_the_same_bits) {
    cm_model *m = gpt2(2, 0.1f);
    assert_same_bits("GPT-2 amp_bf16", m, gpt_batch, NULL, 0, 2, CM_DTYPE_BF16, NULL);
    cm_model_free(m);
}

Test(act_ckpt, checkpointing_cuts_the_activation_peak) {
    /* 6 blocks of a (4, 32, 32) activation stream: each block keeps ~20 such tensors without
     * checkpointing; with it, one per block plus one block's worth during forward and replay */
    cm_model *m = gpt2(6, 0.1f);
    g_T = 32;
    size_t peaks[2];
    assert_same_bits("GPT-2 6 blocks", m, gpt_batch, NULL, 0, 6, CM_DTYPE_F32, peaks);
    g_T = 16;
    cr_assert_lt((double)peaks[1], 0.6 * (double)peaks[0], "peak %zu bytes with checkpointing, %zu without", peaks[1],
                 peaks[0]);
    cm_model_free(m);
}

static cm_model_batch bert_batch(cm_tape *tp) {
    static const char *names[4] = {"input_ids", "attention_mask", "token_type_ids", "labels"};
    static cm_tensor *f[4];
    const int64_t s[2] = {3, 12};
    f[0] = cmt_randint(tp, 2, s, 21, 1, 100);
    f[1] = cmt_randint(tp, 2, s, 22, 0, 2);
    for (int64_t b = 0; b < 3; b++) cm_tensor_set(f[1], (int64_t[]){b, 0}, 1); /* no row fully masked */
    f[2] = cmt_randint(tp, 2, s, 23, 0, 2);
    f[3] = cmt_randint(tp, 2, s, 24, 0, 100);
    return (cm_model_batch){names, f, 4, 3, 36};
}

Test(act_ckpt, bert_layers_give_the_same_bits_with_dropout) {
    cm_bert_config c;
    cr_assert_eq(cm_bert_config_preset("test-tiny", &c), CM_OK);
    c.num_hidden_layers = 3;
    c.hidden_dropout_prob = c.attention_probs_dropout_prob = 0.1f;
    cm_rng rng = cm_rng_init(3, 0);
    cm_model *m;
    cr_assert_eq(cm_bert_mlm_new(&c, &rng, &m), CM_OK, "%s", cm_last_error());
    assert_same_bits("BERT default policy", m, bert_batch, NULL, 0, 3, CM_DTYPE_F32, NULL);
    const cm_act_ckpt_target t[1] = {{"BertSelfAttention", "range-1-3"}};
    assert_same_bits("BERT self-attention range-1-3", m, bert_batch, t, 1, 2, CM_DTYPE_F32, NULL);
    cm_model_free(m);
}

static cm_model_batch image_batch(cm_tape *tp) {
    static const char *names[2] = {"image", "label"};
    static cm_tensor *f[2];
    const int64_t xs[4] = {4, 3, 8, 8}, ys[1] = {4};
    f[0] = cmt_randn(tp, 4, xs, 31, false);
    f[1] = cmt_randint(tp, 1, ys, 32, 0, 10);
    return (cm_model_batch){names, f, 2, 4, 0};
}

Test(act_ckpt, resnet_stages_and_blocks_give_the_same_bits_and_running_statistics) {
    cm_resnet_config rc;
    cr_assert_eq(cm_resnet_config_preset("resnet20", &rc), CM_OK);
    rc.layers[0] = rc.layers[1] = rc.layers[2] = 2;
    cm_model *m;
    cr_assert_eq(cm_resnet_model_new(&rc, &m), CM_OK, "%s", cm_last_error());
    /* the stages (layer1..3) are the repeated wrap units */
    assert_same_bits("ResNet default policy (stages)", m, image_batch, NULL, 0, 3, CM_DTYPE_F32, NULL);
    const cm_act_ckpt_target t[1] = {{"BasicBlock", NULL}};
    assert_same_bits("ResNet blocks", m, image_batch, t, 1, 6, CM_DTYPE_F32, NULL);
    assert_same_bits("ResNet blocks amp_bf16", m, image_batch, t, 1, 6, CM_DTYPE_BF16, NULL);
    /* a convolution's bf16 output whose gradient batch norm writes in bf16: the checkpoint node
     * takes it in bf16 as the convolution does */
    const cm_act_ckpt_target tc[1] = {{"Conv2d", NULL}};
    assert_same_bits("ResNet convolutions amp_bf16", m, image_batch, tc, 1, 13, CM_DTYPE_BF16, NULL);
    cm_model_free(m);
}

/* ---- the tape's regions directly ---- */

typedef struct {
    cm_tensor *captured; /* a tensor made before the region that fn reads without it being an input */
    cm_rng *rng;
    int calls;
    bool change_on_replay;
} region_ctx;

/* y = dropout(tanh(x·w + c)) · w', with c captured */
static cm_tensor *region(cm_tape *tp, int n_in, cm_tensor *const *in, void *data) {
    region_ctx *c = data;
    c->calls++;
    cm_tensor *h = cm_add(tp, cm_matmul(tp, in[0], in[1]), c->captured);
    h = cm_dropout(tp, cm_tanh(tp, h), 0.3f, true, c->rng);
    if (c->change_on_replay && c->calls > 1) h = cm_narrow(tp, h, 0, 0, 1);
    return cm_mul(tp, h, n_in > 2 && in[2] ? in[2] : h);
}

static void region_grads(bool ckpt, float out[4][64], float *y0) {
    cm_tape *tp = cmt_tape();
    const int64_t xs[2] = {4, 5}, ws[2] = {5, 6}, w2s[2] = {6, 6}, cs[2] = {4, 6};
    cm_tensor *x0 = cmt_randn(tp, 2, xs, 1, true), *w = cmt_randn(tp, 2, ws, 2, true);
    cm_tensor *w2 = cmt_randn(tp, 2, w2s, 5, true);
    cm_tensor *c0 = cmt_randn(tp, 2, cs, 3, true), *s = cmt_randn(tp, 2, cs, 4, true);
    /* intermediates (with nodes) as inputs and capture, so their gradients flow on */
    cm_tensor *x = cm_mul_scalar(tp, x0, 1.5f), *c = cm_mul_scalar(tp, c0, 0.5f);
    cm_rng rng = cm_rng_init(9, 1);
    region_ctx rc = {c, &rng, 0, false};
    /* two regions in a row: the second's replay runs first and its memory is reused by the
     * first's, so a gradient of the first's output left in replay memory would be overwritten */
    cm_tensor *in[3] = {x, w, s};
    cm_tensor *y = ckpt ? cm_tape_checkpoint(tp, region, &rc, 3, in) : region(tp, 3, in, &rc);
    cm_tensor *in2[3] = {y, w2, s};
    y = ckpt ? cm_tape_checkpoint(tp, region, &rc, 3, in2) : region(tp, 3, in2, &rc);
    cr_assert(y, "%s", cm_tape_error(tp));
    cr_assert_eq(cm_tape_n_checkpoints(tp), ckpt ? 2 : 0);
    cr_assert_eq(rc.calls, 2);
    /* the output is used twice afterwards, and by a later op reading the captured tensor too */
    cm_tensor *loss = cm_sum(tp, cm_mul(tp, cm_add(tp, y, c), y), NULL, 0, false);
    const uint64_t counter = rng.counter;
    cr_assert_eq(cm_tape_backward(tp, loss), CM_OK, "%s", cm_tape_error(tp));
    cr_assert_eq(rc.calls, ckpt ? 4 : 2, "the regions ran %d times", rc.calls);
    cr_assert_eq(rng.counter, counter, "the generator ends where the forward left it");
    *y0 = (float)cm_tensor_get_flat(y, 0);
    cm_tensor *g[4] = {cm_tensor_grad(x0), cm_tensor_grad(w), cm_tensor_grad(c0), cm_tensor_grad(w2)};
    for (int k = 0; k < 4; k++) {
        cr_assert(g[k]);
        for (int64_t i = 0; i < cm_tensor_numel(g[k]); i++) out[k][i] = (float)cm_tensor_get_flat(g[k], i);
    }
    cm_tape_free(tp);
}

Test(act_ckpt, region_inputs_captured_tensors_and_dropout_get_the_same_gradients) {
    float a[4][64], b[4][64], ya, yb;
    region_grads(false, a, &ya);
    region_grads(true, b, &yb);
    assert_bits("region", "output", &ya, &yb, 1);
    assert_bits("region", "grad x", a[0], b[0], 20);
    assert_bits("region", "grad w", a[1], b[1], 30);
    assert_bits("region", "grad captured", a[2], b[2], 24);
    assert_bits("region", "grad w2", a[3], b[3], 36);
}

Test(act_ckpt, regions_without_a_graph_and_nested_regions_just_run) {
    cm_tape *tp = cmt_tape();
    const int64_t xs[2] = {4, 5}, ws[2] = {5, 6}, cs[2] = {4, 6};
    cm_tensor *x = cmt_randn(tp, 2, xs, 1, true), *w = cmt_randn(tp, 2, ws, 2, true);
    cm_rng rng = cm_rng_init(9, 1);
    region_ctx rc = {cmt_randn(tp, 2, cs, 3, false), &rng, 0, false};
    cm_tensor *in[3] = {x, w, NULL};
    /* gradients off: fn runs, nothing is recorded */
    bool prev = cm_tape_set_grad_enabled(tp, false);
    cr_assert(cm_tape_checkpoint(tp, region, &rc, 3, in));
    cr_assert_eq(cm_tape_n_checkpoints(tp), 0);
    cm_tape_set_grad_enabled(tp, prev);
    /* no input wants a gradient: the result needs none, nothing to recompute */
    cm_tensor *nx = cmt_randn(tp, 2, xs, 1, false), *nw = cmt_randn(tp, 2, ws, 2, false);
    cm_tensor *nin[3] = {nx, nw, NULL};
    cm_tensor *y = cm_tape_checkpoint(tp, region, &rc, 3, nin);
    cr_assert(y && !cm_tensor_requires_grad(y));
    cr_assert_eq(cm_tape_n_checkpoints(tp), 0);
    cm_tape_free(tp);
}

static cm_tensor *outer_region(cm_tape *tp, int n_in, cm_tensor *const *in, void *data) {
    cm_tensor *h = cm_tape_checkpoint(tp, region, data, n_in, in); /* part of this region */
    return cm_relu(tp, h);
}

Test(act_ckpt, a_region_inside_a_region_is_part_of_it) {
    cm_tape *tp = cmt_tape();
    const int64_t xs[2] = {4, 5}, ws[2] = {5, 6}, cs[2] = {4, 6};
    cm_tensor *x = cmt_randn(tp, 2, xs, 1, true), *w = cmt_randn(tp, 2, ws, 2, true);
    cm_rng rng = cm_rng_init(9, 1);
    region_ctx rc = {cmt_randn(tp, 2, cs, 3, false), &rng, 0, false};
    cm_tensor *in[3] = {x, w, NULL};
    cm_tensor *y = cm_tape_checkpoint(tp, outer_region, &rc, 3, in);
    cr_assert(y, "%s", cm_tape_error(tp));
    cr_assert_eq(cm_tape_n_checkpoints(tp), 1);
    cr_assert_eq(cm_tape_backward(tp, cm_sum(tp, y, NULL, 0, false)), CM_OK, "%s", cm_tape_error(tp));
    cr_assert_eq(rc.calls, 2);
    cm_tape_free(tp);
}

Test(act_ckpt, a_region_that_computes_something_else_on_replay_is_an_error) {
    cm_tape *tp = cmt_tape();
    const int64_t xs[2] = {4, 5}, ws[2] = {5, 6}, cs[2] = {4, 6};
    cm_tensor *x = cmt_randn(tp, 2, xs, 1, true), *w = cmt_randn(tp, 2, ws, 2, true);
    cm_rng rng = cm_rng_init(9, 1);
    region_ctx rc = {cmt_randn(tp, 2, cs, 3, false), &rng, 0, true};
    cm_tensor *in[3] = {x, w, NULL};
    cm_tensor *y = cm_tape_checkpoint(tp, region, &rc, 3, in);
    cr_assert(y);
    cr_assert_eq(cm_tape_backward(tp, cm_sum(tp, y, NULL, 0, false)), CM_ERR_STATE);
    cr_assert(strstr(cm_tape_error(tp), "replayed region gave (1, 6)") && strstr(cm_tape_error(tp), "(4, 6)"), "%s",
              cm_tape_error(tp));
    cr_assert_null(cm_tape_checkpoint(tp, region, &rc, 3, in), "a failed tape stays failed");
    cm_tape_free(tp);
    tp = cmt_tape();
    cmt_expect_error(tp, cm_tape_checkpoint(tp, NULL, NULL, 0, NULL), CM_ERR_INVALID_ARG, "fn is NULL", NULL);
    cm_tape_free(tp);
}

Test(act_ckpt, the_replay_counts_against_the_arena_budget) {
    cm_model *m = gpt2(4, 0.1f);
    cm_module *root = cm_model_module(m);
    cr_assert_eq(cm_module_checkpoint_policy(root, NULL, 0, NULL), CM_OK);
    /* the budget that fits the checkpointed step, measured, then a tenth less: out of memory */
    cm_tape *tp = cmt_tape();
    cm_model_batch b = gpt_batch(tp);
    cm_tensor *loss = cm_model_loss(m, tp, cm_model_forward(m, tp, &b), &b);
    cr_assert_eq(cm_tape_backward(tp, loss), CM_OK, "%s", cm_tape_error(tp));
    const size_t need = cm_tape_peak_bytes(tp);
    cm_tape_free(tp);
    cm_tape_config tc = cm_tape_config_default();
    tc.arena_budget = need - need / 10;
    cr_assert_eq(cm_tape_new(&tc, &tp), CM_OK);
    b = gpt_batch(tp);
    loss = cm_model_loss(m, tp, cm_model_forward(m, tp, &b), &b);
    cr_assert(loss, "the forward fits: %s", cm_tape_error(tp));
    cm_status s = cm_tape_backward(tp, loss);
    cr_assert_eq(s, CM_ERR_OOM, "a budget of %zu below the %zu needed: %s", tc.arena_budget, need, cm_tape_error(tp));
    cm_tape_free(tp);
    cm_model_free(m);
}

/* ---- policies ---- */

Test(act_ckpt, policy_errors_name_the_type_and_the_element) {
    cm_model *m = gpt2(4, 0.0f);
    cm_module *root = cm_model_module(m);
    int n = -1;
    const cm_act_ckpt_target bad_type[1] = {{"GPT2Blok", NULL}};
    cr_assert_eq(cm_module_checkpoint_policy(root, bad_type, 1, &n), CM_ERR_NOT_FOUND);
    cr_assert(strstr(cm_last_error(), "'GPT2Blok'") && strstr(cm_last_error(), "did you mean 'GPT2Block'"), "%s",
              cm_last_error());
    cr_assert_eq(n, 0);
    const cm_act_ckpt_target bad_el[1] = {{"GPT2Block", "first-2, lats-1"}};
    cr_assert_eq(cm_module_checkpoint_policy(root, bad_el, 1, &n), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "'lats-1'"), "%s", cm_last_error());
    const cm_act_ckpt_target nested[2] = {{"GPT2Block", "1"}, {"GPT2MLP", NULL}};
    cr_assert_eq(cm_module_checkpoint_policy(root, nested, 2, &n), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "transformer.h.1.mlp (GPT2MLP) would be checkpointed inside transformer.h.1"),
              "%s", cm_last_error());
    const cm_act_ckpt_target no_name[1] = {{"", NULL}};
    cr_assert_eq(cm_module_checkpoint_policy(root, no_name, 1, &n), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_module_checkpoint_policy(NULL, NULL, 0, &n), CM_ERR_INVALID_ARG);
    /* nothing was marked by the failures */
    for (int i = 0; i < 4; i++) {
        char path[32];
        snprintf(path, sizeof path, "transformer.h.%d", i);
        cr_assert(!cm_module_checkpointing(cm_module_find(root, path)), "%s was marked", path);
    }
    cm_model_free(m);
}

/* Appends the path of every module `is` holds for to a string: one visitor for both marks. */
typedef struct {
    bool (*is)(const cm_module *);
    char *out;
} collect_ctx;

static bool collect(cm_module *m, const char *path, int depth, void *data) {
    (void)depth;
    const collect_ctx *c = data;
    if (c->is(m)) {
        strcat(c->out, path);
        strcat(c->out, " ");
    }
    return true;
}

static void collect_marked(cm_module *root, char *out) {
    cm_module_visit(root, collect, &(collect_ctx){cm_module_checkpointing, out});
}

static void collect_offloaded(cm_module *root, char *out) {
    cm_module_visit(root, collect, &(collect_ctx){cm_module_activation_offload, out});
}

/* activation_cpu_offload picks its modules as checkpointing does, and the two policies replace each
 * other's marks: a module is never both (its forward would refuse it). */
Test(act_ckpt, the_offload_policy_marks_what_checkpointing_would_and_clears_it) {
    cm_model *m = gpt2(4, 0.0f);
    cm_module *root = cm_model_module(m);
    const cm_act_ckpt_target t[1] = {{"GPT2Block", "every-2"}};
    int n = 0;
    cr_assert_eq(cm_module_checkpoint_policy(root, NULL, 0, &n), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_module_activation_offload_policy(root, t, 1, &n), CM_OK, "%s", cm_last_error());
    cr_assert_eq(n, 2);
    char ck[512] = "", off[512] = "";
    collect_marked(root, ck);
    collect_offloaded(root, off);
    cr_assert_str_eq(ck, "", "checkpointing left on after the offload policy: %s", ck);
    cr_assert_str_eq(off, "transformer.h.0 transformer.h.2 ");
    cr_assert_eq(cm_module_checkpoint_policy(root, NULL, 0, &n), CM_OK, "%s", cm_last_error());
    off[0] = ck[0] = 0;
    collect_marked(root, ck);
    collect_offloaded(root, off);
    cr_assert_str_eq(ck, "transformer.h.0 transformer.h.1 transformer.h.2 transformer.h.3 ");
    cr_assert_str_eq(off, "", "offload left on after the checkpointing policy: %s", off);
    /* errors are the checkpointing policy's, nothing changed */
    const cm_act_ckpt_target bad[1] = {{"GPT2Blok", NULL}};
    cr_assert_eq(cm_module_activation_offload_policy(root, bad, 1, &n), CM_ERR_NOT_FOUND);
    cr_assert(strstr(cm_last_error(), "GPT2Block"), "%s", cm_last_error());
    ck[0] = 0;
    collect_marked(root, ck);
    cr_assert_str_eq(ck, "transformer.h.0 transformer.h.1 transformer.h.2 transformer.h.3 ");
    cm_model_free(m);
}

Test(act_ckpt, policy_block_lists_follow_llm_foundry) {
    cm_model *m = gpt2(7, 0.0f);
    cm_module *root = cm_model_module(m);
    const struct {
        const char *blocks;
        const char *want;
    } cases[] = {
        {"first-2", "0 1"},       {"last-2", "5 6"},     {"middle-3", "2 3 4"}, {"range-2-4", "2 3"},
        {"every-3", "0 3 6"},     {"1, 5", "1 5"},       {"first-9", "0 1 2 3 4 5 6"},
        {"first-1,last-1", "0 6"}, {"range-5-99", "5 6"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const cm_act_ckpt_target t[1] = {{"GPT2Block", cases[c].blocks}};
        int n;
        cr_assert_eq(cm_module_checkpoint_policy(root, t, 1, &n), CM_OK, "%s: %s", cases[c].blocks, cm_last_error());
        char got[512] = "", want[512] = "";
        collect_marked(root, got);
        for (const char *p = cases[c].want; *p;) {
            char id[8];
            int k = 0;
            while (*p && *p != ' ') id[k++] = *p++;
            id[k] = 0;
            while (*p == ' ') p++;
            strcat(want, "transformer.h.");
            strcat(want, id);
            strcat(want, " ");
        }
        cr_assert_str_eq(got, want, "%s", cases[c].blocks);
    }
    cm_model_free(m);
}
