/* conv2d, pooling and bilinear resize against PyTorch (tests/golden/gen_conv.py): forward values
 * and input gradients for a fixed upstream gradient, including channels-last cases.
 *
 * Tolerances: conv sums <= 54 products (forward) and <= 130 (weight gradient) of N(0,1) values in
 * f32, with a different summation order than PyTorch: 2e-4 abs + 1e-4 rel. Max pooling picks
 * values, so it must match exactly. Average/adaptive pooling and bilinear resize: 1e-5 abs +
 * 1e-5 rel (short f32 sums; the bilinear weights are computed in float as PyTorch does). */
#include "cmtest.h"

#include <stdio.h>

static const char *k_path = "tests/golden/conv.safetensors";

typedef struct {
    const char *name;
    int stride[2], padding[2], dilation[2], groups;
    bool channels_last;
} conv_case;

/* Must match CONV in gen_conv.py. */
static const conv_case k_conv[] = {
    {"c_basic", {1, 1}, {1, 1}, {1, 1}, 1, false}, {"c_s2p1", {2, 2}, {1, 1}, {1, 1}, 1, false},
    {"c_dil2", {1, 1}, {2, 2}, {2, 2}, 1, false},  {"c_groups", {1, 2}, {1, 0}, {1, 1}, 2, false},
    {"c_dw", {2, 1}, {1, 1}, {1, 1}, 6, false},    {"c_1x1", {1, 1}, {0, 0}, {1, 1}, 1, false},
    {"c_cl", {2, 2}, {1, 1}, {1, 1}, 2, true},     {"c_cl_1x1", {1, 1}, {0, 0}, {1, 1}, 1, true},
};

static cm_tensor *get(cmt_golden *g, cm_tape *tp, const char *pre, const char *what, bool grad) {
    char key[64];
    snprintf(key, sizeof key, "%s.%s", pre, what);
    return cmt_golden_on_tape(g, tp, key, grad);
}

static void check(cmt_golden *g, cm_tape *tp, const char *pre, const char *what, const cm_tensor *got, double atol,
                  double rtol) {
    char label[64];
    snprintf(label, sizeof label, "%s.%s", pre, what);
    cr_assert(got, "%s: no result (%s)", label, cm_tape_error(tp));
    cmt_assert_close(label, got, get(g, tp, pre, what, false), atol, rtol);
}

Test(golden_conv, conv2d_forward_and_gradients_match_pytorch) {
    cmt_golden *g = cmt_golden_open(k_path);
    for (size_t k = 0; k < sizeof k_conv / sizeof k_conv[0]; k++) {
        const conv_case *c = &k_conv[k];
        char bkey[64];
        snprintf(bkey, sizeof bkey, "%s.b", c->name);
        cm_tape *tp = cmt_tape();
        cm_tensor *x = get(g, tp, c->name, "x", true), *w = get(g, tp, c->name, "w", true);
        cm_tensor *b = cmt_golden_has(g, bkey) ? get(g, tp, c->name, "b", true) : NULL;
        cm_conv2d_opts o = cm_conv2d_opts_default();
        for (int i = 0; i < 2; i++)
            o.stride[i] = c->stride[i], o.padding[i] = c->padding[i], o.dilation[i] = c->dilation[i];
        o.groups = c->groups;
        o.channels_last = c->channels_last;
        cm_tensor *y = cm_conv2d(tp, x, w, b, &o);
        check(g, tp, c->name, "y", y, 2e-4, 1e-4);
        cr_assert_eq(cm_tape_backward_with(tp, y, get(g, tp, c->name, "gout", false)), CM_OK, "%s",
                     cm_tape_error(tp));
        check(g, tp, c->name, "dx", cm_tensor_grad(x), 2e-4, 1e-4);
        check(g, tp, c->name, "dw", cm_tensor_grad(w), 2e-4, 1e-4);
        if (b) check(g, tp, c->name, "db", cm_tensor_grad(b), 2e-4, 1e-4);
        cm_tape_free(tp);
    }
    cmt_golden_close(g);
}

typedef struct {
    const char *name; /* without the max/avg prefix */
    int k[2], s[2], p[2];
    bool ceil, incl, cl;
} pool_case;

/* Must match POOL in gen_conv.py. */
static const pool_case k_pool[] = {
    {"p_k2", {2, 2}, {2, 2}, {0, 0}, false, true, false},
    {"p_k3s2p1", {3, 3}, {2, 2}, {1, 1}, false, true, false},
    {"p_ceil", {3, 2}, {2, 2}, {1, 1}, true, true, false},
    {"p_ceil_excl", {3, 2}, {2, 2}, {1, 1}, true, false, false},
    {"p_ceil_edge", {2, 2}, {2, 2}, {1, 1}, true, true, false},
    {"p_cl", {3, 3}, {2, 1}, {1, 1}, true, false, true},
};

typedef struct {
    const char *name;
    int kind; /* 0 max, 1 avg, 2 adaptive, 3 bilinear */
    cm_pool2d_opts o;
    int64_t oh, ow;
    bool align, cl;
} one_case;

static void run_one(cmt_golden *g, const one_case *c) {
    cm_tape *tp = cmt_tape();
    cm_tensor *x = get(g, tp, c->name, "x", true), *y = NULL;
    switch (c->kind) {
    case 0: y = cm_max_pool2d(tp, x, &c->o); break;
    case 1: y = cm_avg_pool2d(tp, x, &c->o); break;
    case 2: y = cm_adaptive_avg_pool2d(tp, x, c->oh, c->ow, c->cl); break;
    default: y = cm_resize_bilinear(tp, x, c->oh, c->ow, c->align, c->cl); break;
    }
    const double tol = c->kind == 0 ? 0.0 : 1e-5;
    check(g, tp, c->name, "y", y, tol, tol);
    cr_assert_eq(cm_tape_backward_with(tp, y, get(g, tp, c->name, "gout", false)), CM_OK, "%s", cm_tape_error(tp));
    check(g, tp, c->name, "dx", cm_tensor_grad(x), tol, tol);
    cm_tape_free(tp);
}

Test(golden_conv, max_and_avg_pool_match_pytorch) {
    cmt_golden *g = cmt_golden_open(k_path);
    for (size_t k = 0; k < sizeof k_pool / sizeof k_pool[0]; k++)
        for (int kind = 0; kind < 2; kind++) {
            const pool_case *p = &k_pool[k];
            char name[48];
            snprintf(name, sizeof name, "%s%s", kind ? "avg" : "max", p->name);
            one_case c = {name, kind, cm_pool2d_opts_default(p->k[0], p->k[1]), 0, 0, false, p->cl};
            for (int i = 0; i < 2; i++) c.o.stride[i] = p->s[i], c.o.padding[i] = p->p[i];
            c.o.ceil_mode = p->ceil, c.o.count_include_pad = p->incl, c.o.channels_last = p->cl;
            run_one(g, &c);
        }
    cmt_golden_close(g);
}

Test(golden_conv, adaptive_pool_and_bilinear_match_pytorch) {
    cmt_golden *g = cmt_golden_open(k_path);
    /* Must match ADAPT and RESIZE in gen_conv.py. */
    const one_case cs[] = {
        {.name = "a_down", .kind = 2, .oh = 3, .ow = 4, .align = false, .cl = false},
        {.name = "a_global", .kind = 2, .oh = 1, .ow = 1, .align = false, .cl = false},
        {.name = "a_up", .kind = 2, .oh = 5, .ow = 7, .align = false, .cl = false},
        {.name = "a_cl", .kind = 2, .oh = 4, .ow = 3, .align = false, .cl = true},
        {.name = "r_up", .kind = 3, .oh = 9, .ow = 7, .align = false, .cl = false},
        {.name = "r_up_ac", .kind = 3, .oh = 9, .ow = 7, .align = true, .cl = false},
        {.name = "r_down", .kind = 3, .oh = 4, .ow = 3, .align = false, .cl = false},
        {.name = "r_down_ac", .kind = 3, .oh = 4, .ow = 1, .align = true, .cl = false},
        {.name = "r_cl", .kind = 3, .oh = 8, .ow = 4, .align = false, .cl = true},
    };
    for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) run_one(g, &cs[k]);
    cmt_golden_close(g);
}
