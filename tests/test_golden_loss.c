/* Cross-entropy, softmax / log_softmax along a middle axis and var against PyTorch
 * (tests/golden/gen_loss.py -> tests/golden/loss.safetensors): outputs, and input gradients for
 * the stored upstream gradient. Tolerance: atol 1e-5 + rtol 1e-4 — both sides compute in f32
 * (ours accumulates in double), values are O(1), so differences are a few ulps. */
#include "cmtest.h"

#include <stdio.h>

#define ATOL 1e-5
#define RTOL 1e-4

typedef enum { G_CE, G_SOFTMAX, G_LOG_SOFTMAX, G_VAR } g_kind;

typedef struct {
    const char *name;
    g_kind kind;
    const char *in2; /* second input name ("t" index target / "p" probabilities) or NULL */
    cm_cross_entropy_opts ce;
    int axes[2], n_axes, correction;
    bool keepdim;
} g_case;

static void check_case(cmt_golden *g, const g_case *c) {
    cm_tape *tp = cmt_tape();
    char key[96];
    snprintf(key, sizeof key, "%s.x", c->name);
    cm_tensor *x = cmt_golden_on_tape(g, tp, key, true);
    cm_tensor *b = NULL;
    if (c->in2) {
        snprintf(key, sizeof key, "%s.%s", c->name, c->in2);
        b = cmt_golden_on_tape(g, tp, key, c->in2[0] == 'p');
    }
    cm_tensor *y = NULL;
    switch (c->kind) {
    case G_CE: y = cm_cross_entropy(tp, x, b, &c->ce); break;
    case G_SOFTMAX: y = cm_softmax(tp, x, 1); break;
    case G_LOG_SOFTMAX: y = cm_log_softmax(tp, x, 1); break;
    case G_VAR: y = cm_var(tp, x, c->axes, c->n_axes, c->correction, c->keepdim); break;
    }
    cr_assert(y, "%s: %s", c->name, cm_tape_error(tp));
    snprintf(key, sizeof key, "%s.out", c->name);
    cm_tensor *want = cmt_golden_get(g, key);
    cmt_assert_close(key, y, want, ATOL, RTOL);
    snprintf(key, sizeof key, "%s.gout", c->name);
    cm_tensor *gout = cmt_golden_get(g, key);
    cr_assert_eq(cm_tape_backward_with(tp, y, gout), CM_OK, "%s: %s", c->name, cm_tape_error(tp));
    snprintf(key, sizeof key, "%s.grad_x", c->name);
    cm_tensor *gx = cmt_golden_get(g, key);
    cmt_assert_close(key, cm_tensor_grad(x), gx, ATOL, RTOL);
    if (c->in2 && c->in2[0] == 'p') {
        snprintf(key, sizeof key, "%s.grad_p", c->name);
        cm_tensor *gp = cmt_golden_get(g, key);
        cmt_assert_close(key, cm_tensor_grad(b), gp, ATOL, RTOL);
        cm_tensor_free(gp);
    }
    cm_tensor_free(want);
    cm_tensor_free(gout);
    cm_tensor_free(gx);
    cm_tape_free(tp);
}

static cm_cross_entropy_opts ce(int64_t ignore, float ls, cm_reduction r) {
    cm_cross_entropy_opts o = {ignore, ls, r};
    return o;
}

Test(golden_loss, cross_entropy_matches_torch) {
    cmt_golden *g = cmt_golden_open("tests/golden/loss.safetensors");
    const g_case cases[] = {
        {"ce_mean", G_CE, "t", ce(-100, 0.0f, CM_REDUCTION_MEAN), {0}, 0, 0, false},
        {"ce_ls_mean", G_CE, "t", ce(-100, 0.1f, CM_REDUCTION_MEAN), {0}, 0, 0, false},
        {"ce_ls_sum", G_CE, "t", ce(-100, 0.1f, CM_REDUCTION_SUM), {0}, 0, 0, false},
        {"ce_none", G_CE, "t", ce(-100, 0.0f, CM_REDUCTION_NONE), {0}, 0, 0, false},
        {"ce_nd", G_CE, "t", ce(3, 0.1f, CM_REDUCTION_MEAN), {0}, 0, 0, false}, /* i32 targets */
        {"ce_nd_none", G_CE, "t", ce(-100, 0.0f, CM_REDUCTION_NONE), {0}, 0, 0, false},
        {"ce_soft", G_CE, "p", ce(-100, 0.1f, CM_REDUCTION_MEAN), {0}, 0, 0, false},
        {"ce_soft_nd_none", G_CE, "p", ce(-100, 0.0f, CM_REDUCTION_NONE), {0}, 0, 0, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(g, &cases[i]);
    cmt_golden_close(g);
}

Test(golden_loss, softmax_and_log_softmax_middle_axis_match_torch) {
    cmt_golden *g = cmt_golden_open("tests/golden/loss.safetensors");
    const g_case cases[] = {
        {"softmax_mid", G_SOFTMAX, NULL, {0}, {0}, 0, 0, false},
        {"log_softmax_mid", G_LOG_SOFTMAX, NULL, {0}, {0}, 0, 0, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(g, &cases[i]);
    cmt_golden_close(g);
}

Test(golden_loss, var_with_correction_0_and_1_matches_torch) {
    cmt_golden *g = cmt_golden_open("tests/golden/loss.safetensors");
    const g_case cases[] = {
        {"var_c0", G_VAR, NULL, {0}, {1}, 1, 0, false},
        {"var_c1", G_VAR, NULL, {0}, {1}, 1, 1, false},
        {"var_c1_02_keep", G_VAR, NULL, {0}, {0, -1}, 2, 1, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(g, &cases[i]);
    cmt_golden_close(g);
}
