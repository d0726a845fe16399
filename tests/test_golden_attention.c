/* cm_attention against PyTorch (tests/golden/gen_attention.py: explicit softmax(q·kᵀ·scale + bias +
 * mask)·v math): forward and dq, dk, dv, dbias for a fixed upstream gradient, for the non-causal,
 * causal (T == S and T < S), ALiBi and key-padding cases.
 * Tolerance atol 1e-5 + rtol 1e-4: both sides are f32 with different summation orders over at most
 * S = 7 keys and D = 8 features, so differences are a few ulps of O(1) values. */
#include "cmtest.h"

#include <stdio.h>

#define GOLDEN "tests/golden/attention.safetensors"

static void run_case(cmt_golden *g, const char *name, bool causal, float scale) {
    char key[64];
#define KEY(s) (snprintf(key, sizeof key, "%s.%s", name, s), key)
    cm_tape *tp = cmt_tape();
    cm_tensor *q = cmt_golden_on_tape(g, tp, KEY("q"), true);
    cm_tensor *k = cmt_golden_on_tape(g, tp, KEY("k"), true);
    cm_tensor *v = cmt_golden_on_tape(g, tp, KEY("v"), true);
    cm_attention_opts o = cm_attention_opts_default();
    o.causal = causal;
    o.scale = scale;
    if (cmt_golden_has(g, KEY("bias"))) o.bias = cmt_golden_on_tape(g, tp, KEY("bias"), true);
    if (cmt_golden_has(g, KEY("mask"))) o.key_padding_mask = cmt_golden_on_tape(g, tp, KEY("mask"), false);
    cm_tensor *out = cm_attention(tp, q, k, v, &o);
    cr_assert(out, "%s: %s", name, cm_tape_error(tp));
    cm_tensor *gout = cmt_golden_on_tape(g, tp, KEY("gout"), false);
    cr_assert_eq(cm_tape_backward_with(tp, out, gout), CM_OK, "%s: %s", name, cm_tape_error(tp));

    const double atol = 1e-5, rtol = 1e-4;
    struct {
        const char *what;
        const cm_tensor *got;
    } checks[] = {{"out", out},
                  {"dq", cm_tensor_grad(q)},
                  {"dk", cm_tensor_grad(k)},
                  {"dv", cm_tensor_grad(v)},
                  {"dbias", o.bias ? cm_tensor_grad(o.bias) : NULL}};
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++) {
        if (!checks[i].got) continue;
        cm_tensor *want = cmt_golden_get(g, KEY(checks[i].what));
        cmt_assert_close(key, checks[i].got, want, atol, rtol);
        cm_tensor_free(want);
    }
#undef KEY
    cm_tape_free(tp);
}

Test(golden_attention, plain) {
    cmt_golden *g = cmt_golden_open(GOLDEN);
    run_case(g, "plain", false, 0);
    cmt_golden_close(g);
}

Test(golden_attention, causal) {
    cmt_golden *g = cmt_golden_open(GOLDEN);
    run_case(g, "causal", true, 0);
    run_case(g, "causal_t_lt_s", true, 0.25f);
    cmt_golden_close(g);
}

Test(golden_attention, alibi_bias_with_gradient) {
    cmt_golden *g = cmt_golden_open(GOLDEN);
    run_case(g, "alibi", true, 0);
    cmt_golden_close(g);
}

Test(golden_attention, key_padding_mask) {
    cmt_golden *g = cmt_golden_open(GOLDEN);
    run_case(g, "pad", false, 0);
    cmt_golden_close(g);
}
