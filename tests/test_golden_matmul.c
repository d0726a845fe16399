/* cm_matmul and cm_linear against PyTorch (tests/golden/gen_matmul.py): forward outputs and the
 * input gradients for a fixed upstream gradient, and a bf16 linear forward.
 *
 * Tolerances: f32 values are O(1) sums of ≤ 16 products, so torch and OpenBLAS differ only by
 * summation order: 1e-5 + 1e-5·|ref|. bf16: torch rounds its bf16 matmul result to bf16 (8 bits
 * of mantissa) before we compare, we keep f32 — results of size ~8 differ by up to ~2⁻⁹·8 ≈ 0.016,
 * so atol 5e-2 + rtol 1e-2. */
#include "cmtest.h"

#include <stdio.h>

#define GOLDEN "tests/golden/matmul.safetensors"

static void check_grad(cmt_golden *g, cm_tensor *t, const char *name) {
    char key[64];
    snprintf(key, sizeof key, "%s_grad", name);
    cm_tensor *want = cmt_golden_get(g, key);
    cr_assert(cm_tensor_grad(t), "%s has no gradient", name);
    cmt_assert_close(key, cm_tensor_grad(t), want, 1e-5, 1e-5);
    cm_tensor_free(want);
}

static void check_out_and_backward(cmt_golden *g, cm_tape *tp, cm_tensor *y, const char *prefix) {
    char key[64];
    cr_assert(y, "%s: %s", prefix, cm_tape_error(tp));
    snprintf(key, sizeof key, "%s_out", prefix);
    cm_tensor *want = cmt_golden_get(g, key);
    cmt_assert_close(key, y, want, 1e-5, 1e-5);
    cm_tensor_free(want);
    snprintf(key, sizeof key, "%s_gout", prefix);
    cm_tensor *gout = cmt_golden_on_tape(g, tp, key, false);
    cr_assert_eq(cm_tape_backward_with(tp, y, gout), CM_OK, "%s", cm_tape_error(tp));
}

Test(golden_matmul, matmul_2d_and_broadcast_batched_forward_and_grads) {
    cmt_golden *g = cmt_golden_open(GOLDEN);
    const char *pre[2] = {"mm2", "mmb"};
    for (int k = 0; k < 2; k++) {
        cm_tape *tp = cmt_tape();
        char an[32], bn[32];
        snprintf(an, sizeof an, "%s_a", pre[k]);
        snprintf(bn, sizeof bn, "%s_b", pre[k]);
        cm_tensor *a = cmt_golden_on_tape(g, tp, an, true), *b = cmt_golden_on_tape(g, tp, bn, true);
        check_out_and_backward(g, tp, cm_matmul(tp, a, b), pre[k]);
        check_grad(g, a, an);
        check_grad(g, b, bn);
        cm_tape_free(tp);
    }
    cmt_golden_close(g);
}

Test(golden_matmul, linear_with_and_without_bias_forward_and_grads) {
    cmt_golden *g = cmt_golden_open(GOLDEN);
    cm_tape *tp = cmt_tape();
    cm_tensor *x = cmt_golden_on_tape(g, tp, "lin_x", true), *w = cmt_golden_on_tape(g, tp, "lin_w", true);
    cm_tensor *b = cmt_golden_on_tape(g, tp, "lin_b", true);
    check_out_and_backward(g, tp, cm_linear(tp, x, w, b), "lin");
    check_grad(g, x, "lin_x");
    check_grad(g, w, "lin_w");
    check_grad(g, b, "lin_b");
    cm_tape_free(tp);
    tp = cmt_tape();
    x = cmt_golden_on_tape(g, tp, "linnb_x", true), w = cmt_golden_on_tape(g, tp, "linnb_w", true);
    check_out_and_backward(g, tp, cm_linear(tp, x, w, NULL), "linnb");
    check_grad(g, x, "linnb_x");
    check_grad(g, w, "linnb_w");
    cm_tape_free(tp);
    cmt_golden_close(g);
}

Test(golden_matmul, bf16_linear_forward_matches_torch_bf16) {
    cmt_golden *g = cmt_golden_open(GOLDEN);
    cm_tape *tp = cmt_tape();
    cm_tensor *x = cmt_golden_on_tape(g, tp, "bf16_x", false), *w = cmt_golden_on_tape(g, tp, "bf16_w", false);
    cm_tensor *b = cmt_golden_on_tape(g, tp, "bf16_b", false);
    cr_assert_eq(cm_tensor_dtype(x), CM_DTYPE_BF16);
    cm_tensor *y = cm_linear(tp, x, w, b);
    cr_assert(y, "%s", cm_tape_error(tp));
    cm_tensor *want = cmt_golden_get(g, "bf16_out");
    cmt_assert_close("bf16 linear", y, want, 5e-2, 1e-2);
    cm_tensor_free(want);
    cm_tape_free(tp);
    cmt_golden_close(g);
}
