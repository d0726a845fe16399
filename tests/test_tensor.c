/* The tensor object, views, copies, casts, initialisers and the tape's autograd mechanics. */
#include "cmtest.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/backend.h"
#include "tensor/tensor_impl.h"

Test(tensor, new_validates_shape_and_dtype) {
    cm_tensor *t = NULL;
    int64_t bad[2] = {2, -1};
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 2, bad, &t), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "(2, -1)"), "%s", cm_last_error());
    cr_assert_null(t);
    int64_t s[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 9, s, &t), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_tensor_new((cm_dtype)99, 1, s, &t), CM_ERR_DTYPE);
    int64_t ok[3] = {2, 3, 4};
    cr_assert_eq(cm_tensor_new(CM_DTYPE_BF16, 3, ok, &t), CM_OK);
    cr_assert_eq(cm_tensor_numel(t), 24);
    cr_assert_eq(cm_tensor_nbytes(t), 48);
    cr_assert_eq(cm_tensor_strides(t)[0], 12);
    cr_assert_eq(cm_tensor_dim(t, -1), 4);
    cr_assert(cm_tensor_is_contiguous(t));
    cr_assert_eq(cm_tensor_get_flat(t, 5), 0.0, "new tensors are zero");
    char buf[32];
    cr_assert_str_eq(cm_tensor_shape_str(t, buf, sizeof buf), "(2, 3, 4)");
    cr_assert_eq(cm_tensor_set_name(t, "w1"), CM_OK);
    cr_assert_str_eq(cm_tensor_name(t), "w1");
    cm_tensor_free(t);
    cm_tensor_free(NULL);
    /* requires_grad only on floating tensors */
    cr_assert_eq(cm_tensor_new(CM_DTYPE_I64, 1, ok, &t), CM_OK);
    cr_assert_eq(cm_tensor_set_requires_grad(t, true), CM_ERR_DTYPE);
    cm_tensor_free(t);
}

Test(dtype, names_parse_and_sizes) {
    cm_dtype d;
    cr_assert_eq(cm_dtype_parse("bfloat16", &d), CM_OK);
    cr_assert_eq(d, CM_DTYPE_BF16);
    cr_assert_eq(cm_dtype_parse("f32", &d), CM_OK);
    cr_assert_eq(d, CM_DTYPE_F32);
    cr_assert_eq(cm_dtype_parse("float128", &d), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "float128"));
    cr_assert_str_eq(cm_dtype_name(CM_DTYPE_I32), "i32");
    cr_assert_eq(cm_dtype_size(CM_DTYPE_I64), 8);
    cr_assert_eq(cm_dtype_size(CM_DTYPE_U8), 1);
}

/* The row rounding (cmi_bf16_round16, vcvtneps2bf16 where the build has AVX512-BF16), the
 * parallel cmi_bf16_round and cm_cast give cm_f32_to_bf16's result for every high half with low halves around
 * the rounding points: zeros, denormals (which the instruction alone flushes) next to normals in one
 * vector, ties, infinities, quiet and signalling NaNs; an odd length runs the tail. */
Test(dtype, bf16_row_rounding_equals_the_scalar_rounding_everywhere) {
    const uint32_t lows[6] = {0x0000, 0x7fff, 0x8000, 0x8001, 0xffff, 0x1234};
    const int64_t n = 65536 * 6 + 5;
    float *s = malloc(sizeof(float) * (size_t)n);
    uint16_t *d = malloc(sizeof(uint16_t) * (size_t)n);
    cr_assert(s && d);
    for (int64_t i = 0; i < n; i++) {
        const uint32_t u = ((uint32_t)(i / 6 % 65536) << 16) | lows[i % 6];
        memcpy(&s[i], &u, 4);
    }
    cm_tape *tp = cmt_tape();
    cm_tensor *t = cm_zeros(tp, CM_DTYPE_F32, 1, &n);
    cr_assert(t, "%s", cm_tape_error(tp));
    memcpy(cm_tensor_data(t), s, sizeof(float) * (size_t)n);
    const char *names[3] = {"cmi_bf16_round", "cmi_bf16_round16", "cm_cast"};
    for (int pass = 0; pass < 3; pass++) {
        const uint16_t *got = d;
        memset(d, 0xa5, sizeof(uint16_t) * (size_t)n);
        if (pass == 0) cmi_bf16_round(d, s, n);
        else if (pass == 1) cmi_bf16_round16(d, s, n - n % 16);
        else {
            cm_tensor *b = cm_cast(tp, t, CM_DTYPE_BF16);
            cr_assert(b, "%s", cm_tape_error(tp));
            got = cm_tensor_data(b);
        }
        for (int64_t i = 0; i < (pass == 1 ? n - n % 16 : n); i++) {
            uint32_t u;
            memcpy(&u, &s[i], 4);
            cr_assert_eq(got[i], cm_f32_to_bf16(s[i]), "%s: %08x -> %04x, want %04x", names[pass], u, got[i],
                         cm_f32_to_bf16(s[i]));
        }
    }
    cm_tape_free(tp);
    free(s), free(d);
}

Test(dtype, bf16_and_f16_conversions_round_to_nearest_even) {
    cr_assert_eq(cm_f32_to_bf16(1.0f), 0x3f80);
    cr_assert_eq(cm_bf16_to_f32(0x3f80), 1.0f);
    /* 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (1.0) */
    cr_assert_eq(cm_f32_to_bf16(1.00390625f), 0x3f80);
    cr_assert_eq(cm_f32_to_bf16(1.01171875f), 0x3f82, "1+3·2^-8 ties up to even");
    cr_assert(isnan(cm_bf16_to_f32(cm_f32_to_bf16(NAN))));
    cr_assert(isinf(cm_bf16_to_f32(cm_f32_to_bf16(INFINITY))));
    /* f16 known encodings */
    cr_assert_eq(cm_f32_to_f16(1.0f), 0x3c00);
    cr_assert_eq(cm_f32_to_f16(-2.0f), 0xc000);
    cr_assert_eq(cm_f32_to_f16(65504.0f), 0x7bff);
    cr_assert_eq(cm_f32_to_f16(65520.0f), 0x7c00, "rounds to inf");
    cr_assert_eq(cm_f32_to_f16(5.960464477539063e-08f), 0x0001, "smallest subnormal");
    cr_assert_eq(cm_f32_to_f16(6.103515625e-05f), 0x0400, "smallest normal");
    cr_assert_eq(cm_f32_to_f16(1.0f + 1.0f / 2048.0f), 0x3c00, "tie to even");
    cr_assert(isnan(cm_f16_to_f32(cm_f32_to_f16(NAN))));
    /* every f16 round-trips through f32 */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue; /* NaNs */
        float f = cm_f16_to_f32((uint16_t)h);
        cr_assert_eq(cm_f32_to_f16(f), h, "f16 %04x -> %g -> %04x", h, (double)f, cm_f32_to_f16(f));
    }
}

static cm_tensor *view_chain(cm_tape *tp, cm_tensor *const *in, void *ctx) {
    int which = *(int *)ctx;
    cm_tensor *x = in[0]; /* (2, 3, 4) */
    switch (which) {
    case 0: { int64_t s[2] = {4, -1}; return cm_reshape(tp, x, 2, s); }
    case 1: { int p[3] = {2, 0, 1}; return cm_permute(tp, x, p); }
    case 2: return cm_transpose(tp, x, 0, -1);
    case 3: return cm_narrow(tp, x, 2, 1, 2);
    case 4: { int64_t s[4] = {5, 2, 3, 4}; return cm_expand(tp, x, 4, s); }
    case 5: return cm_squeeze(tp, cm_unsqueeze(tp, x, 1), 1);
    case 6: { /* views of views, then reshape of a non-contiguous view (forces a copy) */
        int64_t s[1] = {-1};
        return cm_reshape(tp, cm_narrow(tp, cm_transpose(tp, x, 1, 2), 1, 1, 3), 1, s);
    }
    case 7: return cm_contiguous(tp, cm_transpose(tp, x, 0, 2));
    case 8: { /* expand then mul: the stride-0 gradient must sum */
        int64_t s[3] = {2, 3, 4};
        cm_tensor *row = cm_narrow(tp, x, 1, 0, 1); /* (2, 1, 4) */
        return cm_mul(tp, cm_expand(tp, row, 3, s), x);
    }
    case 10: { /* reshapes of a non-contiguous view that need no copy: split, then merge a contiguous run */
        int64_t s4[4] = {2, 2, 2, 2}, s2[2] = {2, 8};
        return cm_reshape(tp, cm_reshape(tp, cm_narrow(tp, x, 1, 1, 2), 4, s4), 2, s2);
    }
    case 11: return cm_slice(tp, x, 2, 1, 4, 2); /* elements 1 and 3 of the last axis */
    case 12: /* a slice of a slice (recorded against x) of a transpose */
        return cm_slice(tp, cm_slice(tp, cm_transpose(tp, x, 1, 2), 1, 0, 4, 3), 2, 1, 3, 1);
    default: return cm_cast(tp, cm_cast(tp, x, CM_DTYPE_BF16), CM_DTYPE_F32);
    }
}

Test(views, every_view_op_gradchecks_on_contiguous_and_strided_inputs) {
    const int64_t s[3] = {2, 3, 4};
    for (int which = 0; which <= 12; which++) {
        cm_tape *tp = cmt_tape();
        cm_tensor *x = cmt_randn(tp, 3, s, 1 + which, true);
        cm_tensor *in[1] = {x};
        cmt_gradcheck_opts o = cmt_gradcheck_defaults();
        if (which == 9) { /* through bf16: the forward is quantised, the gradient is the identity */
            o.eps = 0.25;
            o.atol = 0.05;
            o.rtol = 0.05;
        }
        cmt_gradcheck("view", view_chain, &which, 1, in, &o);
        if (which != 9) {
            cm_tensor *xn = cmt_randn_noncontig(tp, 3, s, 1 + which, true);
            cm_tensor *in2[1] = {xn};
            cmt_gradcheck("view(strided)", view_chain, &which, 1, in2, NULL);
        }
        cm_tape_free(tp);
    }
}

/* cm_slice picks start, start + step, ... below stop (torch's t[start:stop:step]) on any axis, of
 * contiguous and strided tensors and of bf16 ones, as a view of t's memory; its gradient lands on
 * exactly those elements. */
Test(views, slice_takes_every_step_th_element_and_its_gradient_lands_there) {
    const int64_t s[3] = {3, 7, 5};
    const int64_t cases[][4] = {{0, 0, 3, 2}, {1, 1, 7, 3}, {2, 0, 5, 2}, {1, 2, 3, 1}, {1, 6, 7, 4}, {2, 4, 4, 1}};
    for (int k = 0; k < 6; k++)
        for (int kind = 0; kind < 3; kind++) { /* contiguous f32, strided f32, bf16 */
            cm_tape *tp = cmt_tape();
            const int axis = (int)cases[k][0];
            const int64_t start = cases[k][1], stop = cases[k][2], step = cases[k][3];
            cm_tensor *x = kind == 1 ? cmt_randn_noncontig(tp, 3, s, 7, true) : cmt_randn(tp, 3, s, 7, true);
            cm_tensor *xs = kind == 2 ? cm_cast(tp, x, CM_DTYPE_BF16) : x;
            cm_tensor *y = cm_slice(tp, xs, axis, start, stop, step);
            cr_assert(y, "%s", cm_tape_error(tp));
            const int64_t len = (stop - start + step - 1) / step;
            cr_assert_eq(cm_tensor_dim(y, axis), len, "case %d: %lld elements along axis %d, want %lld", k,
                         (long long)cm_tensor_dim(y, axis), axis, (long long)len);
            cr_assert_eq(cm_tensor_dtype(y), cm_tensor_dtype(xs));
            cr_assert(len == 0 || (const char *)cm_tensor_data(y) >= (const char *)cm_tensor_data(xs), "a view");
            const int64_t n = cm_tensor_numel(y);
            cm_tensor *g = cm_full(tp, CM_DTYPE_F32, 3, cm_tensor_shape(y), 1.0f);
            for (int64_t e = 0; e < n; e++) ((float *)cm_tensor_data(g))[e] = (float)(e + 1); /* contiguous */
            if (n) cr_assert_eq(cm_tape_backward_with(tp, y, g), CM_OK, "%s", cm_tape_error(tp));
            cm_tensor *gx = cm_tensor_grad(x);
            int64_t e = 0;
            for (int64_t i = 0; i < s[0]; i++)
                for (int64_t j = 0; j < s[1]; j++)
                    for (int64_t l = 0; l < s[2]; l++) {
                        const int64_t idx[3] = {i, j, l}, a = idx[axis];
                        const bool picked = a >= start && a < stop && (a - start) % step == 0;
                        const float want_g = picked ? (float)(++e) : 0.0f;
                        const int64_t fx = (i * s[1] + j) * s[2] + l;
                        if (picked) {
                            const float got = cm_tensor_get_flat(y, e - 1), want = cm_tensor_get_flat(xs, fx);
                            cr_assert_eq(got, want, "case %d kind %d: y[%lld] = %g, want x[%lld,%lld,%lld] = %g", k,
                                         kind, (long long)(e - 1), (double)got, (long long)i, (long long)j,
                                         (long long)l, (double)want);
                        }
                        if (n)
                            cr_assert_eq(cm_tensor_get_flat(gx, fx), want_g, "case %d kind %d: grad x[%lld,%lld,%lld] "
                                         "= %g, want %g", k, kind, (long long)i, (long long)j, (long long)l,
                                         (double)cm_tensor_get_flat(gx, fx), (double)want_g);
                    }
            cr_assert_eq(e, n, "case %d: %lld picked, %lld in the slice", k, (long long)e, (long long)n);
            cm_tape_free(tp);
        }
}

/* A view of a view of a contiguous tensor is recorded against that tensor (one gradient add for the
 * chain), unless the tape retains gradients, which promises the intermediate views' gradients. */
Test(views, view_chains_send_their_gradient_to_the_contiguous_base) {
    for (int retain = 0; retain < 2; retain++) {
        cm_tape_config cfg = cm_tape_config_default();
        cfg.retain_grads = retain;
        cm_tape *tp;
        cr_assert_eq(cm_tape_new(&cfg, &tp), CM_OK);
        const int64_t s[3] = {2, 3, 12}, s4[4] = {2, 3, 2, 2};
        cm_tensor *x = cmt_randn(tp, 3, s, 1, true);
        cm_tensor *base = cm_mul_scalar(tp, x, 2.0);                 /* a tape tensor with a node */
        cm_tensor *nar = cm_narrow(tp, base, 2, 4, 4);                 /* (2, 3, 4) */
        cm_tensor *v = cm_permute(tp, cm_reshape(tp, nar, 4, s4), (const int[]){0, 2, 1, 3});
        cr_assert(v, "%s", cm_tape_error(tp));
        if (!retain) cr_assert_eq(v->node->in[0], base, "the permute is recorded against the contiguous base");
        else cr_assert_neq(v->node->in[0], base, "with retain_grads the chain is kept");
        cm_tensor *g = cmt_randn(tp, 4, cm_tensor_shape(v), 2, false);
        cr_assert_eq(cm_tape_backward_with(tp, v, g), CM_OK, "%s", cm_tape_error(tp));
        /* d x = 2 · g scattered back into columns 4..7 */
        cm_tensor *gx = cm_tensor_grad(x);
        for (int64_t b = 0; b < 2; b++)
            for (int64_t t = 0; t < 3; t++)
                for (int64_t c = 0; c < 12; c++) {
                    double want = 0;
                    if (c >= 4 && c < 8) {
                        const int64_t h = (c - 4) / 2, d = (c - 4) % 2; /* v[b, h, t, d] */
                        want = 2.0 * cm_tensor_get(g, (const int64_t[]){b, h, t, d});
                    }
                    cr_assert_float_eq(cm_tensor_get(gx, (const int64_t[]){b, t, c}), want, 1e-6, "retain %d", retain);
                }
        if (retain) cr_assert(cm_tensor_grad(nar), "retain_grads keeps the intermediate view's gradient");
        cm_tape_free(tp);
    }
}

typedef struct {
    cm_tensor *v, *y;
    bool shared;
} alias_probe;
static void alias_hook(cm_tape *tp, const void *node, void *data) {
    (void)tp, (void)node;
    alias_probe *p = data;
    if (p->v->grad && p->y->grad && p->v->grad->data == p->y->grad->data) p->shared = true;
}

/* A view that covers its whole base in the same order (reshape of a contiguous tensor) gets the
 * base's gradient buffer itself instead of its own plus an add — when the base has no gradient yet
 * (else it must not be clobbered) and not under retain_grads. Partial or reordering views never
 * alias. Gradients are checked against the analytic ones in every case. */
Test(views, whole_base_views_share_the_base_gradient) {
    const int64_t s[2] = {64, 1024}, s3[3] = {8, 8, 1024}; /* 256 KiB: pooled gradients */
    for (int mode = 0; mode < 3; mode++) { /* 0: alias, 1: base consumed later too, 2: retain_grads */
        cm_tape_config cfg = cm_tape_config_default();
        cfg.retain_grads = mode == 2;
        cfg.poison = true;
        cm_tape *tp;
        cr_assert_eq(cm_tape_new(&cfg, &tp), CM_OK);
        cm_tensor *x = cmt_randn(tp, 2, s, 1, true);
        cm_tensor *y = cm_mul_scalar(tp, x, 2.0f); /* a tape tensor with a node */
        cm_tensor *v = cm_reshape(tp, y, 3, s3);
        cr_assert_eq(cmi_view_alias_base(v), y);
        cr_assert_null(cmi_view_alias_base(cm_narrow(tp, y, 1, 0, 512)), "a part of the base never aliases");
        cr_assert_null(cmi_view_alias_base(cm_transpose(tp, y, 0, 1)), "a reordering view never aliases");
        cm_tensor *loss = cm_sum(tp, cm_mul_scalar(tp, v, 3.0f), NULL, 0, false); /* d loss / d x = 6 */
        if (mode == 1) /* recorded after v's consumer: runs first in backward, y has a gradient by then */
            loss = cm_add(tp, loss, cm_sum(tp, cm_mul_scalar(tp, y, 5.0f), NULL, 0, false)); /* + 10 */
        cr_assert(loss, "%s", cm_tape_error(tp));
        alias_probe probe = {v, y, false};
        cm_tape_set_backward_hook(tp, alias_hook, &probe);
        cr_assert_eq(cm_tape_backward(tp, loss), CM_OK, "%s", cm_tape_error(tp));
        cr_assert_eq(probe.shared, mode == 0, "mode %d: v's gradient %s y's", mode, probe.shared ? "was" : "was not");
        const float want = mode == 1 ? 16.0f : 6.0f;
        cm_tensor *gx = cm_tensor_grad(x);
        for (int64_t i = 0; i < cm_tensor_numel(gx); i += 97)
            cr_assert_float_eq(cm_tensor_get_flat(gx, i), want, 1e-5, "mode %d, dx[%lld]", mode, (long long)i);
        cm_tape_free(tp);
    }
}

/* cm_reshape is a view wherever the strides allow (PyTorch's rule), and copies only where not. */
Test(views, reshape_of_a_strided_tensor_is_a_view_when_the_strides_allow) {
    cm_tape *tp = cmt_tape();
    const int64_t s[3] = {2, 3, 4};
    cm_tensor *x = cm_reshape(tp, cm_arange(tp, CM_DTYPE_F32, 0, 24, 1), 3, s);
    cm_tensor *nar = cm_narrow(tp, x, 1, 1, 2); /* (2, 2, 4), strides (12, 4, 1) */
    const int64_t s4[4] = {2, 2, 2, 2}, s2[2] = {2, 8}, s1[1] = {16};
    cm_tensor *v4 = cm_reshape(tp, nar, 4, s4), *v2 = cm_reshape(tp, nar, 2, s2), *c1 = cm_reshape(tp, nar, 1, s1);
    cr_assert(v4 && v2 && c1, "%s", cm_tape_error(tp));
    cr_assert_eq(cm_tensor_data(v4), cm_tensor_data(nar), "split of the last dim: a view");
    cr_assert_eq(cm_tensor_data(v2), cm_tensor_data(nar), "merge of the contiguous run (2, 4): a view");
    cr_assert_eq(cm_tensor_strides(v2)[0], 12);
    cr_assert_neq(cm_tensor_data(c1), cm_tensor_data(nar), "merging across the gap needs a copy");
    for (int64_t i = 0; i < 16; i++) {
        const double want = 12 * (i / 8) + 4 + i % 8; /* element (b, j, k) of nar is 12 b + 4 (j + 1) + k */
        cr_assert_eq(cm_tensor_get_flat(c1, i), want, "copy element %lld", (long long)i);
        cr_assert_eq(cm_tensor_get_flat(v2, i), want, "view element %lld", (long long)i);
    }
    cm_tape_free(tp);
}

Test(views, values_and_strides) {
    cm_tape *tp = cmt_tape();
    int64_t s[2] = {3, 4};
    cm_tensor *x = cm_reshape(tp, cm_arange(tp, CM_DTYPE_F32, 0, 12, 1), 2, s);
    cm_tensor *t = cm_transpose(tp, x, 0, 1);
    cr_assert(!cm_tensor_is_contiguous(t));
    cr_assert_eq(cm_tensor_data(t), cm_tensor_data(x), "transpose is a view");
    int64_t idx[2] = {3, 1};
    cr_assert_eq(cm_tensor_get(t, idx), 7.0);
    cm_tensor *n = cm_narrow(tp, x, 1, 1, 2);
    int64_t i2[2] = {2, 1};
    cr_assert_eq(cm_tensor_get(n, i2), 10.0);
    int64_t es[3] = {2, 3, 4};
    cm_tensor *e = cm_expand(tp, x, 3, es);
    cr_assert_eq(cm_tensor_strides(e)[0], 0);
    int64_t i3[3] = {1, 2, 3};
    cr_assert_eq(cm_tensor_get(e, i3), 11.0);
    cm_tensor *c = cm_contiguous(tp, t);
    cr_assert(cm_tensor_is_contiguous(c));
    const float want[4] = {0, 4, 8, 1};
    cmt_assert_close_f32("contiguous(transpose)", cm_tensor_data(c), want, 4, 0, 0);
    cr_assert_eq(cm_contiguous(tp, x), x, "contiguous of a contiguous tensor is itself");
    cm_tape_free(tp);
}

Test(views, errors_name_the_shapes) {
    cm_tape *tp = cmt_tape();
    int64_t s[2] = {3, 4}, bad[2] = {5, 5}, e[2] = {3, 5};
    cm_tensor *x = cmt_randn(tp, 2, s, 1, false);
    cr_assert_null(cm_reshape(tp, x, 2, bad));
    cr_assert(strstr(cm_tape_error(tp), "(3, 4)") && strstr(cm_tape_error(tp), "(5, 5)"), "%s", cm_tape_error(tp));
    cm_tape_reset(tp);
    x = cmt_randn(tp, 2, s, 1, false);
    cr_assert_null(cm_expand(tp, x, 2, e));
    cr_assert_eq(cm_tape_status(tp), CM_ERR_SHAPE);
    cm_tape_reset(tp);
    x = cmt_randn(tp, 2, s, 1, false);
    cr_assert_null(cm_narrow(tp, x, 1, 3, 2));
    cr_assert(strstr(cm_tape_error(tp), "[3, 5)"), "%s", cm_tape_error(tp));
    cm_tape_reset(tp);
    x = cmt_randn(tp, 2, s, 1, false);
    cr_assert_null(cm_slice(tp, x, 1, 0, 4, 0));
    cr_assert(strstr(cm_tape_error(tp), "slice") && strstr(cm_tape_error(tp), "step 0"), "%s", cm_tape_error(tp));
    cm_tape_reset(tp);
    x = cmt_randn(tp, 2, s, 1, false);
    cr_assert_null(cm_slice(tp, x, 1, 2, 5, 2));
    cr_assert(strstr(cm_tape_error(tp), "[2, 5)") && strstr(cm_tape_error(tp), "(3, 4)"), "%s", cm_tape_error(tp));
    cm_tape_reset(tp);
    x = cmt_randn(tp, 2, s, 1, false);
    cr_assert_null(cm_slice(tp, x, 0, 2, 1, 1));
    cr_assert_eq(cm_tape_status(tp), CM_ERR_INVALID_ARG);
    cm_tape_reset(tp);
    x = cmt_randn(tp, 2, s, 1, false);
    cr_assert_null(cm_squeeze(tp, x, 0));
    cm_tape_reset(tp);
    x = cmt_randn(tp, 2, s, 1, false);
    int p[2] = {0, 0};
    cr_assert_null(cm_permute(tp, x, p));
    cr_assert(strstr(cm_tape_error(tp), "twice"), "%s", cm_tape_error(tp));
    cm_tape_reset(tp);
    x = cmt_randn(tp, 2, s, 1, false);
    cr_assert_null(cm_transpose(tp, x, 0, 2));
    cr_assert(strstr(cm_tape_error(tp), "axis 2"), "%s", cm_tape_error(tp));
    cm_tape_free(tp);
}

Test(copy, broadcast_dtype_conversion_and_fill) {
    cm_tape *tp = cmt_tape();
    int64_t s[2] = {2, 3}, r[1] = {3};
    cm_tensor *row = cm_arange(tp, CM_DTYPE_F32, 1, 4, 1);
    cm_tensor *dst = cm_empty(tp, CM_DTYPE_I32, 2, s);
    cr_assert_eq(cm_tensor_copy(dst, row), CM_OK);
    const int32_t *d = cm_tensor_data(dst);
    cr_assert(d[0] == 1 && d[2] == 3 && d[3] == 1 && d[5] == 3);
    cm_tensor *small = cm_empty(tp, CM_DTYPE_F32, 1, r);
    cr_assert_eq(cm_tensor_copy(small, dst), CM_ERR_SHAPE, "a (2,3) source does not fit a (3,) destination");
    cm_tensor *bf = cm_empty(tp, CM_DTYPE_BF16, 2, s);
    cr_assert_eq(cm_tensor_fill(bf, 1.5), CM_OK);
    cr_assert_eq(cm_tensor_get_flat(bf, 4), 1.5);
    cm_tensor *u8 = cm_full(tp, CM_DTYPE_U8, 2, s, 200);
    cr_assert_eq(cm_tensor_get_flat(u8, 5), 200.0);
    cm_tensor *ar = cm_arange(tp, CM_DTYPE_I64, 10, 0, -3);
    cr_assert_eq(cm_tensor_numel(ar), 4);
    cr_assert_eq(cm_tensor_get_flat(ar, 3), 1.0);
    cr_assert_null(cm_arange(tp, CM_DTYPE_F32, 0, 1, 0));
    cm_tape_free(tp);
}

Test(cast, roundtrips_and_gradient_is_f32) {
    cm_tape *tp = cmt_tape();
    int64_t s[1] = {5};
    cm_tensor *x = cmt_randn(tp, 1, s, 3, true);
    cm_tensor *b = cm_cast(tp, x, CM_DTYPE_BF16);
    cr_assert_eq(cm_tensor_dtype(b), CM_DTYPE_BF16);
    cm_tensor *h = cm_cast(tp, x, CM_DTYPE_F16);
    cm_tensor *i = cm_cast(tp, x, CM_DTYPE_I32);
    cr_assert(b && h && i);
    cr_assert(!cm_tensor_requires_grad(i), "integer results carry no gradient");
    for (int k = 0; k < 5; k++) {
        double v = cm_tensor_get_flat(x, k);
        cr_assert(fabs(cm_tensor_get_flat(b, k) - v) <= fabs(v) / 128, "bf16 %g vs %g", cm_tensor_get_flat(b, k), v);
        cr_assert(fabs(cm_tensor_get_flat(h, k) - v) <= fabs(v) / 1024, "f16");
        cr_assert_eq(cm_tensor_get_flat(i, k), (double)(int32_t)v);
    }
    cm_tensor *back = cm_cast(tp, b, CM_DTYPE_F32);
    cm_tensor *g = cm_full(tp, CM_DTYPE_F32, 1, s, 2.0);
    cr_assert_eq(cm_tape_backward_with(tp, back, g), CM_OK, "%s", cm_tape_error(tp));
    cm_tensor *gx = cm_tensor_grad(x);
    cr_assert_eq(cm_tensor_dtype(gx), CM_DTYPE_F32);
    for (int k = 0; k < 5; k++) cr_assert_eq(cm_tensor_get_flat(gx, k), 2.0);
    cm_tape_free(tp);
}

Test(autograd, leaf_gradients_accumulate_and_survive_reset) {
    cm_tape *tp = cmt_tape();
    int64_t s[2] = {2, 2};
    cm_tensor *w;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 2, s, &w), CM_OK);
    cm_tensor_fill(w, 3.0);
    cm_tensor_set_requires_grad(w, true);
    for (int step = 0; step < 2; step++) {
        cm_tensor *y = cm_mul(tp, w, w); /* dy/dw = 2w = 6 */
        cm_tensor *g = cm_full(tp, CM_DTYPE_F32, 2, s, 1.0);
        cr_assert_eq(cm_tape_backward_with(tp, y, g), CM_OK, "%s", cm_tape_error(tp));
        cm_tape_reset(tp);
    }
    cm_tensor *gw = cm_tensor_grad(w);
    cr_assert_not_null(gw);
    cr_assert_eq(cm_tensor_get_flat(gw, 3), 12.0, "two backward passes accumulate");
    cm_tensor_zero_grad(w);
    cr_assert_eq(cm_tensor_get_flat(gw, 0), 0.0);
    /* an external gradient buffer (flat-buffer layout) is used in place */
    float buf[4] = {1, 1, 1, 1};
    cm_tensor *ext;
    cr_assert_eq(cm_tensor_from_data(CM_DTYPE_F32, 2, s, buf, &ext), CM_OK);
    cr_assert_eq(cm_tensor_set_grad(w, ext), CM_OK);
    cm_tensor *y = cm_mul_scalar(tp, w, 0.5f);
    cm_tensor *g = cm_full(tp, CM_DTYPE_F32, 2, s, 1.0);
    cr_assert_eq(cm_tape_backward_with(tp, y, g), CM_OK);
    cr_assert_eq(buf[2], 1.5f);
    int64_t wrong[2] = {4, 1};
    cm_tensor *bad;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 2, wrong, &bad), CM_OK);
    cr_assert_eq(cm_tensor_set_grad(w, bad), CM_ERR_SHAPE);
    cm_tensor_free(bad);
    cm_tensor_free(w);
    cm_tensor_free(ext);
    cm_tape_free(tp);
}

Test(autograd, no_grad_scope_detach_and_backward_errors) {
    cm_tape *tp = cmt_tape();
    int64_t s[1] = {3};
    cm_tensor *x = cmt_randn(tp, 1, s, 1, true);
    bool prev = cm_tape_set_grad_enabled(tp, false);
    cr_assert(prev);
    cm_tensor *y = cm_exp(tp, x);
    cr_assert(!cm_tensor_requires_grad(y), "no node is recorded with grad disabled");
    cr_assert_eq(cm_tape_n_nodes(tp), 0);
    cm_tape_set_grad_enabled(tp, prev);
    cm_tensor *d = cm_detach(tp, x);
    cr_assert(!cm_tensor_requires_grad(d));
    cr_assert_eq(cm_tensor_data(d), cm_tensor_data(x));
    cr_assert_eq(cm_tape_backward(tp, cm_exp(tp, d)), CM_ERR_SHAPE, "a (3,) loss is not a scalar");
    cr_assert(strstr(cm_tape_error(tp), "(3,)"), "%s", cm_tape_error(tp));
    cm_tape_reset(tp);
    int64_t one[1] = {1};
    cm_tensor *c = cm_full(tp, CM_DTYPE_F32, 1, one, 2.0);
    cr_assert_eq(cm_tape_backward(tp, c), CM_ERR_STATE, "a constant does not require grad");
    cm_tape_reset(tp);
    cr_assert_null(cm_exp(tp, NULL));
    cr_assert_eq(cm_tape_status(tp), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_tape_backward(tp, c), CM_ERR_INVALID_ARG, "backward reports the tape's first error");
    cr_assert_eq(cm_tape_fail(tp, CM_ERR_IO, "later"), CM_ERR_INVALID_ARG, "first error wins");
    cm_tape_free(tp);
}

Test(autograd, shared_subexpression_gets_both_gradients) {
    cm_tape *tp = cmt_tape();
    int64_t s[1] = {4};
    cm_tensor *x = cmt_randn(tp, 1, s, 5, true);
    cm_tensor *a = cm_exp(tp, x);
    cm_tensor *y = cm_add(tp, cm_mul(tp, a, a), a); /* d/dx = (2a + 1)·a */
    cm_tensor *g = cm_full(tp, CM_DTYPE_F32, 1, s, 1.0);
    cr_assert_eq(cm_tape_backward_with(tp, y, g), CM_OK);
    for (int k = 0; k < 4; k++) {
        double av = exp(cm_tensor_get_flat(x, k));
        cr_assert_float_eq(cm_tensor_get_flat(cm_tensor_grad(x), k), (2 * av + 1) * av, 1e-4 * (1 + av * av));
    }
    cm_tape_free(tp);
}

Test(init, distributions_follow_torch_formulas) {
    int64_t s[2] = {256, 512}; /* fan_in 512, fan_out 256 */
    cm_tensor *w;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 2, s, &w), CM_OK);
    cm_rng rng = cm_rng_init(1, 0);
    const float *v = cm_tensor_data(w);
    int64_t n = cm_tensor_numel(w);
    double bound = sqrt(6.0 / 512);
    cr_assert_eq(cm_tensor_init_kaiming_uniform(w, &rng, CM_FAN_IN, 0.0f), CM_OK);
    double mx = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(v[i])), s2 += (double)v[i] * v[i];
    cr_assert(mx <= bound && mx > 0.99 * bound, "kaiming_uniform bound %g, max %g", bound, mx);
    cr_assert_eq(cm_tensor_init_kaiming_normal(w, &rng, CM_FAN_OUT, 0.0f), CM_OK);
    s2 = 0;
    for (int64_t i = 0; i < n; i++) s2 += (double)v[i] * v[i];
    cr_assert(fabs(sqrt(s2 / n) - sqrt(2.0 / 256)) < 0.01 * sqrt(2.0 / 256) * 3, "kaiming_normal std %g", sqrt(s2 / n));
    cr_assert_eq(cm_tensor_init_xavier_normal(w, &rng, 1.0f), CM_OK);
    s2 = 0;
    for (int64_t i = 0; i < n; i++) s2 += (double)v[i] * v[i];
    cr_assert(fabs(sqrt(s2 / n) - sqrt(2.0 / 768)) < 0.03 * sqrt(2.0 / 768), "xavier_normal std %g", sqrt(s2 / n));
    cr_assert_eq(cm_tensor_init_trunc_normal(w, &rng, 0.0f, 1.0f, -2.0f, 2.0f), CM_OK);
    double m = 0;
    s2 = 0;
    for (int64_t i = 0; i < n; i++) {
        cr_assert(v[i] >= -2.0f && v[i] <= 2.0f, "trunc_normal out of range: %g", (double)v[i]);
        m += v[i], s2 += (double)v[i] * v[i];
    }
    /* std of N(0,1) truncated to [-2, 2] is 0.8796 */
    cr_assert(fabs(m / n) < 0.01 && fabs(sqrt(s2 / n) - 0.8796) < 0.01, "trunc_normal mean %g std %g", m / n,
              sqrt(s2 / n));
    /* reproducible from the same rng state */
    cm_rng r1 = cm_rng_init(9, 1), r2 = cm_rng_init(9, 1);
    cm_tensor *w2;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_BF16, 2, s, &w2), CM_OK);
    cm_tensor_init_normal(w, &r1, 0, 0.02f);
    cm_tensor_init_normal(w2, &r2, 0, 0.02f);
    for (int64_t i = 0; i < 100; i++)
        cr_assert(fabs(cm_tensor_get_flat(w2, i) - cm_tensor_get_flat(w, i)) <= fabs(cm_tensor_get_flat(w, i)) / 128 + 1e-12, "bf16 init via f32 [%lld]: %g vs %g", (long long)i, cm_tensor_get_flat(w2, i), cm_tensor_get_flat(w, i));
    int64_t s1[1] = {5};
    cm_tensor *b;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 1, s1, &b), CM_OK);
    cr_assert_eq(cm_tensor_init_xavier_uniform(b, &rng, 1.0f), CM_ERR_SHAPE, "fans need 2 dims");
    cm_tensor_free(b);
    cm_tensor_free(w);
    cm_tensor_free(w2);
}

/* ---- the fetch hook (FULL_SHARD gathers parameters through it) ---- */

typedef struct {
    const cm_tensor *watch[4]; /* long-lived tensors whose reads are counted */
    int seen[4];
    const void *lo, *hi;       /* the watched memory: views inside it count for watch[0] */
    int fail_after;            /* fail on this call (0: never) */
    int calls;
} fetch_log;

static cm_status log_fetch(cm_tape *tp, const cm_tensor *t, void *data) {
    fetch_log *f = data;
    f->calls++;
    if (f->fail_after && f->calls == f->fail_after) return cm_set_error(CM_ERR_IO, "simulated gather failure");
    for (int i = 0; i < 4; i++)
        if (f->watch[i] == t) f->seen[i]++;
    const char *p = cm_tensor_data(t);
    if (t != f->watch[0] && p >= (const char *)f->lo && p < (const char *)f->hi) f->seen[0]++;
    return CM_OK;
}

Test(fetch_hook, sees_required_optional_view_and_backward_reads) {
    cm_tape *tp = cmt_tape();
    const int64_t sx[2] = {3, 4}, sw[2] = {5, 4}, sb[1] = {5}, sg[1] = {5};
    cm_tensor *x = cmt_randn(tp, 2, sx, 1, false);
    cm_tensor *w, *b, *g;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 2, sw, &w), CM_OK);
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 1, sb, &b), CM_OK);
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 1, sg, &g), CM_OK);
    cm_tensor_fill(w, 0.1f), cm_tensor_fill(b, 0.2f), cm_tensor_fill(g, 1.0f);
    cm_tensor_set_requires_grad(w, true);
    cm_tensor_set_requires_grad(b, true);
    cm_tensor_set_requires_grad(g, true);
    fetch_log f = {{w, b, g, NULL}, {0}, cm_tensor_data(w), (const char *)cm_tensor_data(w) + 20 * sizeof(float), 0, 0};
    cm_tape_set_fetch_hook(tp, log_fetch, &f);
    cm_tensor *y = cm_linear(tp, x, w, b);                 /* w required, b optional */
    y = cm_layer_norm(tp, y, g, NULL, 1e-5f);             /* g optional */
    cm_tensor *wt = cm_transpose(tp, w, 0, 1);            /* a view of w: (4, 5) */
    cm_tensor *z = cm_matmul(tp, x, wt);                  /* reads the view: counts for w */
    cm_tensor *loss = cm_sum(tp, cm_add(tp, y, z), NULL, 0, false);
    cr_assert(loss, "%s", cm_tape_error(tp));
    const int fw_w = f.seen[0], fw_b = f.seen[1], fw_g = f.seen[2];
    cr_assert(fw_w >= 3, "forward reads of w (linear, transpose, matmul of the view): %d", fw_w);
    cr_assert(fw_b >= 1 && fw_g >= 1, "optional inputs fetched: bias %d, norm weight %d", fw_b, fw_g);
    cr_assert_eq(cm_tape_backward(tp, loss), CM_OK, "%s", cm_tape_error(tp));
    cr_assert(f.seen[0] > fw_w && f.seen[1] > fw_b && f.seen[2] > fw_g,
              "backward fetches every node's inputs first: w %d->%d, b %d->%d, g %d->%d", fw_w, f.seen[0], fw_b,
              f.seen[1], fw_g, f.seen[2]);
    /* a failing hook fails the op, with its message */
    cm_tape_reset(tp);
    f.fail_after = f.calls + 2;
    cr_assert_null(cm_linear(tp, x, w, b));
    cr_assert_eq(cm_tape_status(tp), CM_ERR_IO);
    cr_assert(strstr(cm_tape_error(tp), "simulated gather failure"), "%s", cm_tape_error(tp));
    cm_tape_set_fetch_hook(tp, NULL, NULL);
    cm_tensor_free(w), cm_tensor_free(b), cm_tensor_free(g);
    cm_tape_free(tp);
}

/* With a row context, a row's dropout mask depends on its global row only: the batch as one call
 * or as two halves (each from the batch's starting counter) gives the same mask, and the counter
 * ends one whole batch further. Without it, numbers are drawn in sequence (the old rule). */
Test(dropout, row_context_makes_masks_independent_of_the_split) {
    const int64_t full[2] = {6, 5}, half[2] = {3, 5};
    cm_tape *tp = cmt_tape();
    cm_tensor *ones = cm_full(tp, CM_DTYPE_F32, 2, full, 1.0);
    cm_tensor *h1 = cm_full(tp, CM_DTYPE_F32, 2, half, 1.0), *h2 = cm_full(tp, CM_DTYPE_F32, 2, half, 1.0);
    cm_rng r = cm_rng_init(9, 4);
    cm_tape_set_rows(tp, 0, 6, 6);
    cm_tensor *y = cm_dropout(tp, ones, 0.5f, true, &r);
    cr_assert(y, "%s", cm_tape_error(tp));
    const uint64_t after_whole = r.counter;
    cr_assert_eq(after_whole, 6 * 2, "the counter moves one global batch of ceil(5/4) blocks per row: %llu",
                 (unsigned long long)after_whole);
    cm_rng r2 = cm_rng_init(9, 4);
    cm_tape_set_rows(tp, 0, 3, 6);
    cm_tensor *y1 = cm_dropout(tp, h1, 0.5f, true, &r2);
    r2.counter = 0; /* the trainer restores the batch's starting counter for each microbatch */
    cm_tape_set_rows(tp, 3, 3, 6);
    cm_tensor *y2 = cm_dropout(tp, h2, 0.5f, true, &r2);
    cr_assert(y1 && y2, "%s", cm_tape_error(tp));
    cr_assert_eq(r2.counter, after_whole);
    int kept = 0;
    for (int64_t i = 0; i < 30; i++) {
        const float whole = cm_tensor_get_flat(y, i), split = cm_tensor_get_flat(i < 15 ? y1 : y2, i % 15);
        cr_assert_eq(whole, split, "element %lld: %g whole vs %g split", (long long)i, whole, split);
        kept += whole != 0.0f;
    }
    cr_assert(kept > 5 && kept < 25, "p 0.5 kept %d of 30", kept);
    /* no context: in sequence, ceil(30 / 4) blocks */
    cm_tape_set_rows(tp, 0, 0, 0);
    cm_rng r3 = cm_rng_init(9, 4);
    cr_assert(cm_dropout(tp, ones, 0.5f, true, &r3));
    cr_assert_eq(r3.counter, 8);
    cm_tape_free(tp);
}

/* Intermediate gradients are dropped once consumed and their (pooled, >= 64 KiB) memory is reused
 * later in the same backward and in the next step; the leaf gradient is unchanged by that, and
 * retain_grads keeps every intermediate's gradient as before. */
Test(autograd, intermediate_gradients_are_freed_and_reused_unless_retained) {
    for (int retain = 0; retain < 2; retain++) {
        cm_tape_config tc = cm_tape_config_default();
        tc.retain_grads = retain;
        tc.poison = true; /* a reused block that is not zeroed would show up as NaN */
        cm_tape *tp;
        cr_assert_eq(cm_tape_new(&tc, &tp), CM_OK);
        int64_t s[1] = {40000}; /* 160 KB: pooled */
        cm_tensor *x;
        cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 1, s, &x), CM_OK);
        float *xv = cm_tensor_data(x);
        for (int64_t i = 0; i < s[0]; i++) xv[i] = 0.25f * (float)(i % 7) - 0.5f;
        cm_tensor_set_requires_grad(x, true);
        for (int step = 0; step < 3; step++) {
            /* a chain with a shared subexpression: y = (a·a + a)·2, a = exp(x); dy/dx = (4a + 2)·a */
            cm_tensor *a = cm_exp(tp, x);
            cm_tensor *sq = cm_mul(tp, a, a);
            cm_tensor *y = cm_mul_scalar(tp, cm_add(tp, sq, a), 2.0f);
            cr_assert_eq(cm_tape_backward(tp, cm_sum(tp, y, NULL, 0, false)), CM_OK, "%s", cm_tape_error(tp));
            if (retain) cr_assert_not_null(cm_tensor_grad(a), "retain_grads keeps the intermediate's gradient");
            else cr_assert_null(cm_tensor_grad(a), "the intermediate's gradient is dropped after its node ran");
            cr_assert_not_null(cm_tensor_grad(x), "the leaf keeps its gradient");
            for (int64_t i = 0; i < s[0]; i += 997) {
                const double av = exp(cm_tensor_get_flat(x, i));
                const double want = (step + 1) * (4 * av + 2) * av, got = cm_tensor_get_flat(cm_tensor_grad(x), i);
                cr_assert(fabs(got - want) <= 1e-5 * fabs(want), "step %d, dx[%lld] = %.7g, want %.7g (rel 1e-5)",
                          step, (long long)i, got, want);
            }
            cm_tape_reset(tp);
        }
        cm_tensor_free(x);
        cm_tape_free(tp);
    }
}

/* An intermediate gradient that grows from step to step (BERT's sparse masked-LM logits have one
 * row per masked token) gets a new pool block at each new maximum; the blocks it outgrows are
 * given back then, so the pool holds one such block, not one per maximum. A counting allocator
 * sees the blocks: of the gradient sizes asked for, only the last stays allocated. */
#define GP_MAX 64
static struct {
    void *p;
    size_t bytes;
} g_gp_live[GP_MAX];
static void *gp_alloc(size_t bytes, size_t align, void *data) {
    (void)data;
    void *p = NULL;
    if (posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, bytes ? bytes : 1)) return NULL;
    for (int i = 0; i < GP_MAX; i++)
        if (!g_gp_live[i].p) {
            g_gp_live[i].p = p, g_gp_live[i].bytes = bytes;
            break;
        }
    return p;
}
static void gp_free(void *p, void *data) {
    (void)data;
    for (int i = 0; p && i < GP_MAX; i++)
        if (g_gp_live[i].p == p) g_gp_live[i].p = NULL;
    free(p);
}
static int gp_live_of(size_t bytes) {
    int n = 0;
    for (int i = 0; i < GP_MAX; i++) n += g_gp_live[i].p && g_gp_live[i].bytes == bytes;
    return n;
}

Test(autograd, a_growing_gradient_leaves_no_outgrown_pool_blocks) {
    memset(g_gp_live, 0, sizeof g_gp_live);
    cm_allocator_i hooks = {CM_ALLOCATOR_ABI, gp_alloc, gp_free, NULL};
    cm_set_allocator(&hooks);
    cm_tape *tp;
    cm_tape_config tc = cm_tape_config_default();
    cr_assert_eq(cm_tape_new(&tc, &tp), CM_OK);
    const int64_t C = 256; /* rows of 1 KiB: 64 rows and more are pooled */
    size_t sizes[8];
    for (int step = 0; step < 8; step++) {
        const int64_t s[2] = {100 + 10 * step, C}; /* each a new maximum, within twice the last */
        sizes[step] = (size_t)(s[0] * C) * sizeof(float);
        cm_tensor *x = cm_full(tp, CM_DTYPE_F32, 2, s, 0.5f);
        cm_tensor_set_requires_grad(x, true);
        cm_tensor *y = cm_mul_scalar(tp, x, 3.0f); /* an intermediate with a pooled gradient */
        cr_assert_eq(cm_tape_backward(tp, cm_sum(tp, cm_mul(tp, y, y), NULL, 0, false)), CM_OK, "%s",
                     cm_tape_error(tp));
        cr_assert_eq(cm_tensor_get_flat(cm_tensor_grad(x), 7), 9.0f, "d(9x²)/dx at 0.5");
        cm_tape_reset(tp);
    }
    int outgrown = 0;
    for (int step = 0; step < 7; step++) outgrown += gp_live_of(sizes[step]);
    const int last = gp_live_of(sizes[7]);
    cm_tape_free(tp);
    cm_set_allocator(NULL);
    cr_assert_eq(outgrown, 0, "%d outgrown gradient blocks still allocated", outgrown);
    /* y·y's gradient is still held while y's is made: two blocks of the size */
    cr_assert_eq(last, 2, "the largest gradients' blocks are pooled (%d allocated)", last);
    for (int i = 0; i < GP_MAX; i++) cr_assert_null(g_gp_live[i].p, "everything is given back when the tape goes");
}

/* ---- first gradients of intermediates are written, not zeroed and added to ---- */

typedef struct {
    int which;
    bool flag;
} fresh_ctx;

static cm_tensor *fresh_op(cm_tape *tp, cm_tensor *const *in, void *vctx) {
    const fresh_ctx *c = vctx;
    switch (c->which) {
    case 0: return cm_layer_norm(tp, in[0], in[1], in[2], 1e-5f);
    case 1: {
        cm_rng r = cm_rng_init(7, 1);
        return cm_dropout(tp, in[0], 0.3f, true, &r);
    }
    case 2: return cm_bias_gelu(tp, in[0], in[1], c->flag);
    case 3: return cm_add(tp, in[0], in[1]); /* same shapes, or in[1] broadcast */
    case 4: {
        cm_cross_entropy_opts o = cm_cross_entropy_opts_default();
        o.reduction = c->flag ? CM_REDUCTION_NONE : CM_REDUCTION_MEAN;
        o.label_smoothing = c->flag ? 0.1f : 0.0f;
        return cm_cross_entropy(tp, in[0], in[1], &o);
    }
    default: { /* which 5: q, k, v; 6: in[0] as all three; 7: in[0] as q, in[1] as k and v */
        cm_attention_opts o = cm_attention_opts_default();
        o.causal = c->flag;
        cm_rng r = cm_rng_init(9, 2);
        if (c->flag) o.dropout_p = 0.2f, o.rng = &r;
        if (c->which == 6) return cm_attention(tp, in[0], in[0], in[0], &o);
        if (c->which == 7) return cm_attention(tp, in[0], in[1], in[1], &o);
        return cm_attention(tp, in[0], in[1], in[2], &o);
    }
    }
}

Test(tape, ops_write_the_first_gradient_of_an_intermediate_input) {
    cm_tape *tp = cmt_tape();
    const int64_t s2[2] = {6, 40}, c40 = 40, s3[3] = {3, 5, 40}, row[1] = {40};
    fresh_ctx c = {0, false};
    cm_tensor *ln[3] = {cmt_randn(tp, 2, s2, 1, true), cmt_randn(tp, 1, &c40, 2, true), cmt_randn(tp, 1, &c40, 3, true)};
    cmt_check_fresh_grads("layer_norm", fresh_op, &c, 3, ln, 1e-5, 1e-5);
    c.which = 1;
    cm_tensor *dr[1] = {cmt_randn(tp, 3, s3, 4, true)};
    cmt_check_fresh_grads("dropout", fresh_op, &c, 1, dr, 1e-6, 1e-6);
    c.which = 2;
    cm_tensor *bg[2] = {cmt_randn(tp, 3, s3, 5, true), cmt_randn(tp, 1, row, 6, true)};
    for (int approx = 0; approx < 2; approx++) {
        c.flag = approx;
        cmt_check_fresh_grads(approx ? "bias_gelu (tanh)" : "bias_gelu (erf)", fresh_op, &c, 2, bg, 1e-6, 1e-5);
    }
    c.which = 3;
    cm_tensor *ad[2] = {cmt_randn(tp, 3, s3, 7, true), cmt_randn(tp, 3, s3, 8, true)};
    cmt_check_fresh_grads("add (residual)", fresh_op, &c, 2, ad, 0, 0);
    cm_tensor *adb[2] = {cmt_randn(tp, 3, s3, 7, true), cmt_randn(tp, 1, row, 8, true)};
    cmt_check_fresh_grads("add (broadcast)", fresh_op, &c, 2, adb, 1e-6, 1e-6);
    /* cross-entropy: index targets with ignored positions (their rows must still be zeros), and
     * per-position losses with label smoothing; (N, C, S) logits too */
    c.which = 4;
    const int64_t ns[1] = {8}, lg[2] = {8, 11}, lg3[3] = {2, 11, 4}, t3[2] = {2, 4};
    cm_tensor *tgt = cmt_randint(tp, 1, ns, 9, 0, 11);
    cm_tensor_set(tgt, (const int64_t[]){2}, -100);
    cm_tensor_set(tgt, (const int64_t[]){5}, -100);
    cm_tensor *tgt3 = cmt_randint(tp, 2, t3, 10, 0, 11);
    cm_tensor_set(tgt3, (const int64_t[]){0, 3}, -100);
    for (int k = 0; k < 2; k++) {
        c.flag = k;
        cm_tensor *ce[2] = {cmt_randn(tp, 2, lg, 11, true), tgt};
        cmt_check_fresh_grads("cross_entropy", fresh_op, &c, 2, ce, 1e-6, 1e-5);
        cm_tensor *ce3[2] = {cmt_randn(tp, 3, lg3, 12, true), tgt3};
        cmt_check_fresh_grads("cross_entropy (N, C, S)", fresh_op, &c, 2, ce3, 1e-6, 1e-5);
    }
    /* attention: dQ written block by block, dK and dV by the first block (the rest zeroed); causal
     * with dropout too */
    c.which = 5;
    const int64_t qs[4] = {2, 2, 70, 4}; /* T 70: two row blocks of ROW_BLOCK (64) */
    cm_tensor *at[3] = {cmt_randn(tp, 4, qs, 13, true), cmt_randn(tp, 4, qs, 14, true), cmt_randn(tp, 4, qs, 15, true)};
    for (int k = 0; k < 2; k++) {
        c.flag = k;
        c.which = 5;
        cmt_check_fresh_grads(k ? "attention (causal, dropout)" : "attention", fresh_op, &c, 3, at, 1e-5, 1e-4);
        /* one tensor as q, k and v (its gradient takes all three parts), and as k and v */
        c.which = 6;
        cmt_check_fresh_grads(k ? "attention q = k = v (causal, dropout)" : "attention q = k = v", fresh_op, &c, 1,
                              at, 1e-5, 1e-4);
        c.which = 7;
        cmt_check_fresh_grads(k ? "attention k = v (causal, dropout)" : "attention k = v", fresh_op, &c, 2, at, 1e-5,
                              1e-4);
    }
    cm_tape_free(tp);
}

Test(tape, empty_on_makes_its_tensor_on_the_device_asked_and_leaves_the_tapes_device) {
    cm_tape *tp = cmt_tape();
    const int64_t n = 3;
    cm_tensor *h = cm_empty_on(tp, CM_DEVICE_CPU, CM_DTYPE_I64, 1, &n);
    cr_assert(h, "%s", cm_tape_error(tp));
    cr_assert_eq(cm_tensor_device(h), CM_DEVICE_CPU);
    cr_assert_eq(cm_tensor_dtype(h), CM_DTYPE_I64);
    if (cm_device_check(CM_DEVICE_CUDA) == CM_OK) { /* a GPU or the emulator */
        cm_tensor *d = cm_empty_on(tp, CM_DEVICE_CUDA, CM_DTYPE_F32, 1, &n);
        cr_assert(d, "%s", cm_tape_error(tp));
        cr_assert_eq(cm_tensor_device(d), CM_DEVICE_CUDA);
        cr_assert_eq(cm_tape_device(tp), CM_DEVICE_CPU);
        cr_assert_eq(cm_tape_set_device(tp, CM_DEVICE_CUDA), CM_OK);
        h = cm_empty_on(tp, CM_DEVICE_CPU, CM_DTYPE_F32, 1, &n);
        cr_assert(h, "%s", cm_tape_error(tp));
        cr_assert_eq(cm_tensor_device(h), CM_DEVICE_CPU);
        cr_assert_eq(cm_tape_device(tp), CM_DEVICE_CUDA);
        cr_assert_eq(cm_tensor_device(cm_empty(tp, CM_DTYPE_F32, 1, &n)), CM_DEVICE_CUDA);
    } else { /* no GPU: the tape records why, and keeps its device */
        cr_assert_null(cm_empty_on(tp, CM_DEVICE_CUDA, CM_DTYPE_F32, 1, &n));
        cr_assert_neq(cm_tape_status(tp), CM_OK);
        cr_assert(strstr(cm_tape_error(tp), "empty_on") && strstr(cm_tape_error(tp), "CUDA"), "%s", cm_tape_error(tp));
        cr_assert_eq(cm_tape_device(tp), CM_DEVICE_CPU);
    }
    cm_tape_free(tp);
}

/* Whether this process has a file whose path contains `name` mapped. */
static bool mapped(const char *name) {
    char *maps = cmt_read_file("/proc/self/maps", NULL);
    const bool found = strstr(maps, name) != NULL;
    free(maps);
    return found;
}

/* cuBLASLt is opened on the first GEMM, not at program start: a process that never uses the GPU never
 * runs its initialisers (0.3 s and 200 MB per process when it was linked). Opening it needs no GPU,
 * so a CUDA build checks here that every entry point resolves. */
Test(device, cublaslt_is_opened_on_first_use_not_at_start) {
    cr_assert_not(mapped("libcublasLt"), "libcublasLt is mapped before any GPU use");
    const char *from = "unset";
    cm_status s = cmi_cuda_blas_load(&from);
    if (s == CM_ERR_UNSUPPORTED) { /* a build without CUDA */
        cr_assert_null(from);
        return;
    }
    cr_assert_eq(s, CM_OK, "%s", cm_last_error());
    cr_assert_not_null(from);
    if (strcmp(from, "the CUDA emulator") == 0) {
        cr_assert_not(mapped("libcublasLt"));
        return;
    }
    cr_assert(strstr(from, "libcublasLt.so."), "opened %s", from);
    cr_assert(mapped("libcublasLt"), "%s opened but not mapped", from);
    const char *again = NULL;
    cr_assert_eq(cmi_cuda_blas_load(&again), CM_OK);
    cr_assert_str_eq(again, from);
}

/* CM_CUBLASLT_PATH names the library to open instead; a path that is not there, or a library that
 * is not cuBLASLt, is an error naming it and the fix, and a later call can still succeed. */
Test(device, a_cublaslt_that_cannot_be_opened_is_named) {
    const char *from = NULL;
    setenv("CM_CUBLASLT_PATH", "/nonexistent/libcublasLt.so.13", 1);
    cm_status s = cmi_cuda_blas_load(&from);
    if (s == CM_ERR_UNSUPPORTED) return; /* a build without CUDA */
    if (s == CM_OK) {                    /* the emulator opens nothing */
        cr_assert_str_eq(from, "the CUDA emulator");
        return;
    }
    cr_assert_eq(s, CM_ERR_DEVICE);
    cr_assert(strstr(cm_last_error(), "/nonexistent/libcublasLt.so.13"), "%s", cm_last_error());
    cr_assert(strstr(cm_last_error(), "CM_CUBLASLT_PATH"), "%s", cm_last_error());
    cr_assert_not(mapped("libcublasLt"));
    setenv("CM_CUBLASLT_PATH", "libz.so.1", 1); /* opens, but has no cuBLASLt in it */
    cr_assert_eq(cmi_cuda_blas_load(&from), CM_ERR_DEVICE);
    cr_assert(strstr(cm_last_error(), "libz.so.1 has no cublasLtCreate"), "%s", cm_last_error());
    unsetenv("CM_CUBLASLT_PATH");
    cr_assert_eq(cmi_cuda_blas_load(&from), CM_OK, "%s", cm_last_error());
    cr_assert(mapped("libcublasLt"));
}
