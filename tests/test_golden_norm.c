/* Layer, batch and group norm against PyTorch (tests/golden/gen_norm.py): outputs, input gradients
 * for a fixed upstream gradient, and batch norm's running statistics after one training step.
 *
 * Tolerances: outputs and dx atol 2e-5 + rtol 1e-4 (f32, O(1) values, different summation order);
 * dw/db sum up to 480 products, so atol 1e-4 + rtol 1e-4; running stats 1e-6 + 1e-5. */
#include "cmtest.h"

#include <stdio.h>

#define GOLDEN "tests/golden/norm.safetensors"

typedef struct {
    cmt_golden *g;
    cm_tape *tp;
    const char *tag;
} ctx;

static cm_tensor *get(ctx *c, const char *name, bool grad) {
    char key[64];
    snprintf(key, sizeof key, "%s.%s", c->tag, name);
    return cmt_golden_on_tape(c->g, c->tp, key, grad);
}

static void expect(ctx *c, const char *name, const cm_tensor *have, double atol, double rtol) {
    char key[64];
    snprintf(key, sizeof key, "%s.%s", c->tag, name);
    cr_assert(have, "%s: missing (%s)", key, cm_tape_error(c->tp));
    cm_tensor *want = cmt_golden_get(c->g, key);
    cmt_assert_close(key, have, want, atol, rtol);
    cm_tensor_free(want);
}

/* Backward from y with the stored upstream gradient, then compare y, dx, dw, db. */
static void check_grads(ctx *c, cm_tensor *y, cm_tensor *x, cm_tensor *w, cm_tensor *b) {
    cr_assert(y, "%s: forward failed: %s", c->tag, cm_tape_error(c->tp));
    expect(c, "y", y, 2e-5, 1e-4);
    cr_assert_eq(cm_tape_backward_with(c->tp, y, get(c, "gout", false)), CM_OK, "%s", cm_tape_error(c->tp));
    expect(c, "dx", cm_tensor_grad(x), 2e-5, 1e-4);
    expect(c, "dw", cm_tensor_grad(w), 1e-4, 1e-4);
    expect(c, "db", cm_tensor_grad(b), 1e-4, 1e-4);
}

Test(golden_norm, layer_norm_matches_pytorch) {
    ctx c = {cmt_golden_open(GOLDEN), cmt_tape(), "ln"};
    cm_tensor *x = get(&c, "x", true), *w = get(&c, "w", true), *b = get(&c, "b", true);
    check_grads(&c, cm_layer_norm(c.tp, x, w, b, 1e-5f), x, w, b);
    cm_tape_free(c.tp);
    cmt_golden_close(c.g);
}

static void bn_train_case(const char *tag) {
    ctx c = {cmt_golden_open(GOLDEN), cmt_tape(), tag};
    cm_tensor *x = get(&c, "x", true), *w = get(&c, "w", true), *b = get(&c, "b", true);
    char key[64];
    snprintf(key, sizeof key, "%s.rm0", tag);
    cm_tensor *rm = cmt_golden_get(c.g, key);
    snprintf(key, sizeof key, "%s.rv0", tag);
    cm_tensor *rv = cmt_golden_get(c.g, key);
    cm_batch_norm_opts o = cm_batch_norm_opts_default(); /* training, momentum 0.1, eps 1e-5 */
    check_grads(&c, cm_batch_norm(c.tp, x, w, b, rm, rv, &o), x, w, b);
    expect(&c, "rm", rm, 1e-6, 1e-5);
    expect(&c, "rv", rv, 1e-6, 1e-5);
    cm_tensor_free(rm);
    cm_tensor_free(rv);
    cm_tape_free(c.tp);
    cmt_golden_close(c.g);
}

Test(golden_norm, batch_norm_training_step_nchw_matches_pytorch) { bn_train_case("bn4"); }
Test(golden_norm, batch_norm_training_step_2d_matches_pytorch) { bn_train_case("bn2"); }

Test(golden_norm, batch_norm_eval_matches_pytorch) {
    ctx c = {cmt_golden_open(GOLDEN), cmt_tape(), "bne"};
    cm_tensor *x = get(&c, "x", true), *w = get(&c, "w", true), *b = get(&c, "b", true);
    cm_tensor *rm = get(&c, "rm", false), *rv = get(&c, "rv", false);
    cm_batch_norm_opts o = cm_batch_norm_opts_default();
    o.training = false;
    check_grads(&c, cm_batch_norm(c.tp, x, w, b, rm, rv, &o), x, w, b);
    expect(&c, "rm", rm, 0, 0); /* eval leaves the running stats alone */
    expect(&c, "rv", rv, 0, 0);
    cm_tape_free(c.tp);
    cmt_golden_close(c.g);
}

Test(golden_norm, group_norm_matches_pytorch) {
    ctx c = {cmt_golden_open(GOLDEN), cmt_tape(), "gn"};
    cm_tensor *x = get(&c, "x", true), *w = get(&c, "w", true), *b = get(&c, "b", true);
    check_grads(&c, cm_group_norm(c.tp, x, 3, w, b, 1e-5f), x, w, b);
    cm_tape_free(c.tp);
    cmt_golden_close(c.g);
}

Test(golden_norm, batch_norm_channels_last_matches_pytorch_nchw) {
    /* The NCHW case permuted to (N, H, W, C) must give the permuted results. */
    ctx c = {cmt_golden_open(GOLDEN), cmt_tape(), "bn4"};
    cm_tensor *x = get(&c, "x", true), *w = get(&c, "w", true), *b = get(&c, "b", true);
    const int to_cl[4] = {0, 2, 3, 1}, to_nchw[4] = {0, 3, 1, 2};
    cm_tensor *xcl = cm_contiguous(c.tp, cm_permute(c.tp, x, to_cl));
    cm_batch_norm_opts o = cm_batch_norm_opts_default();
    o.channels_last = true;
    cm_tensor *y = cm_permute(c.tp, cm_batch_norm(c.tp, xcl, w, b, NULL, NULL, &o), to_nchw);
    check_grads(&c, cm_contiguous(c.tp, y), x, w, b);
    cm_tape_free(c.tp);
    cmt_golden_close(c.g);
}
