/* cm_matmul and cm_linear: forward values against a naive double-precision reference, gradient
 * checks (2-D, batched, broadcast batch, transposed views, other strided views, linear with and
 * without bias), bf16 against an f32 reference, the oneDNN primitive cache, and the errors.
 *
 * Tolerances: matmul and linear are linear in each input, so central differences are exact up to
 * f32 round-off for any step; eps = 0.1 keeps that round-off (≈1e-6·|L| / 0.2) far below
 * atol 1e-3 + rtol 1e-3. f32 forward vs the double reference: 1e-4 + 1e-4·|ref| (K ≤ 40, values
 * N(0,1)). bf16: see bf16_* tests. */
#include "cmtest.h"

#include <math.h>

#include "tensor/dnnl_gemm.h"
#include "tensor/tensor_impl.h"

static cmt_gradcheck_opts opts(void) {
    cmt_gradcheck_opts o = cmt_gradcheck_defaults();
    o.eps = 0.1;
    o.atol = 1e-3;
    o.rtol = 1e-3;
    return o;
}

static cm_tensor *call_matmul(cm_tape *tp, cm_tensor *const *in, void *ctx) { return cm_matmul(tp, in[0], in[1]); }
static cm_tensor *call_linear(cm_tape *tp, cm_tensor *const *in, void *ctx) {
    return cm_linear(tp, in[0], in[1], in[2]);
}

/* out[..., i, j] = Σ_k a[..., i, k]·b[..., k, j] in double, batch dims broadcast (aligned right). */
static cm_tensor *ref_matmul(cm_tape *tp, const cm_tensor *a, const cm_tensor *b) {
    const int na = a->ndim, nb = b->ndim, nbd = (na > nb ? na : nb) - 2;
    int64_t shape[CM_MAX_DIMS];
    for (int d = 0; d < nbd; d++) {
        int da = d - (nbd - (na - 2)), db = d - (nbd - (nb - 2));
        int64_t sa = da >= 0 ? a->shape[da] : 1, sb = db >= 0 ? b->shape[db] : 1;
        shape[d] = sa > sb ? sa : sb;
    }
    const int64_t M = a->shape[na - 2], K = a->shape[na - 1], N = b->shape[nb - 1];
    shape[nbd] = M, shape[nbd + 1] = N;
    cm_tensor *out = cm_empty(tp, CM_DTYPE_F32, nbd + 2, shape);
    cr_assert(out);
    int64_t nbatch = cmi_numel(nbd, shape);
    for (int64_t bi = 0; bi < nbatch; bi++) {
        int64_t ia[CM_MAX_DIMS], ib[CM_MAX_DIMS], io[CM_MAX_DIMS], rem = bi;
        for (int d = nbd - 1; d >= 0; d--) {
            io[d] = rem % shape[d];
            rem /= shape[d];
        }
        for (int d = 0; d < na - 2; d++) ia[d] = a->shape[d] == 1 ? 0 : io[d + nbd - (na - 2)];
        for (int d = 0; d < nb - 2; d++) ib[d] = b->shape[d] == 1 ? 0 : io[d + nbd - (nb - 2)];
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++) {
                    ia[na - 2] = i, ia[na - 1] = k, ib[nb - 2] = k, ib[nb - 1] = j;
                    s += cm_tensor_get(a, ia) * cm_tensor_get(b, ib);
                }
                io[nbd] = i, io[nbd + 1] = j;
                cm_tensor_set(out, io, s);
            }
    }
    return out;
}

/* Checks forward values against the reference, then the gradients. */
static void check_matmul(const char *name, cm_tensor *a, cm_tensor *b) {
    cm_tape *tp = cmt_tape();
    cm_tensor *o = cm_matmul(tp, a, b);
    cr_assert(o, "%s: %s", name, cm_tape_error(tp));
    cmt_assert_close(name, o, ref_matmul(tp, a, b), 1e-4, 1e-4);
    cm_tape_free(tp);
    cm_tensor *in[2] = {a, b};
    cmt_gradcheck_opts o2 = opts();
    cmt_gradcheck(name, call_matmul, NULL, 2, in, &o2);
}

Test(matmul, gradcheck_2d_including_degenerate_dims) {
    static const int64_t s[][4] = {{3, 4, 4, 5}, {1, 7, 7, 1}, {5, 1, 1, 3}, {6, 33, 33, 9}};
    cm_tape *tp = cmt_tape();
    for (int i = 0; i < 4; i++) {
        cm_tensor *a = cmt_randn(tp, 2, s[i], 10 + i, true), *b = cmt_randn(tp, 2, s[i] + 2, 20 + i, true);
        check_matmul("matmul 2d", a, b);
    }
    cm_tape_free(tp);
}

Test(matmul, gradcheck_batched_and_broadcast_batch) {
    cm_tape *tp = cmt_tape();
    struct {
        int na;
        int64_t sa[4];
        int nb;
        int64_t sb[4];
    } cs[] = {
        {3, {2, 3, 4}, 3, {2, 4, 5}},       /* plain batch */
        {4, {2, 1, 3, 4}, 3, {3, 4, 5}},    /* broadcast both ways + missing leading dim */
        {2, {3, 4}, 3, {2, 4, 5}},          /* a 2-D against batched b: dA sums over the batch */
        {3, {2, 3, 4}, 2, {4, 5}},          /* b 2-D: one folded GEMM over all rows of a */
        {4, {2, 2, 3, 4}, 3, {1, 4, 5}},    /* b with a size-1 batch: folded too */
        {3, {1, 3, 4}, 3, {5, 4, 2}},       /* a broadcast over b's batch */
        {3, {16, 2, 3}, 3, {16, 3, 2}},     /* many small GEMMs: one per thread */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        cm_tensor *a = cmt_randn(tp, cs[i].na, cs[i].sa, 30 + i, true);
        cm_tensor *b = cmt_randn(tp, cs[i].nb, cs[i].sb, 40 + i, true);
        check_matmul("matmul batched", a, b);
    }
    cm_tape_free(tp);
}

Test(matmul, transposed_views_go_to_blas_without_a_copy) {
    cm_tape *tp = cmt_tape();
    const int64_t sa[3] = {2, 3, 4}, sb[3] = {2, 4, 5}, sb2[2] = {4, 5};
    cm_tensor *a = cmt_randn_noncontig(tp, 3, sa, 1, true), *b = cmt_randn_noncontig(tp, 3, sb, 2, true);
    cm_tensor *b2 = cmt_randn_noncontig(tp, 2, sb2, 3, true);
    check_matmul("matmul a^T b^T batched", a, b);
    check_matmul("matmul a^T, b 2-D^T", a, b2);
    cm_tensor *ac = cmt_randn(tp, 3, sa, 4, true);
    check_matmul("matmul a, b 2-D^T (folded)", ac, b2);
    /* one node on the tape: no cm_contiguous copy was recorded */
    cm_tape *t2 = cmt_tape();
    cr_assert(cm_matmul(t2, a, b));
    cr_assert_eq(cm_tape_n_nodes(t2), 1, "transposed views were copied (%lld nodes)", (long long)cm_tape_n_nodes(t2));
    cm_tape_free(t2);
    cm_tape_free(tp);
}

Test(matmul, other_strided_views_are_copied_and_still_get_gradients) {
    cm_tape *tp = cmt_tape();
    /* a permuted batch (B, H, T, D) view of (B, T, H, D) memory: batch strides only, no copy;
     * a narrowed last dim with stride 2 (every other column): not a BLAS layout, copied. */
    const int64_t s4[4] = {2, 3, 2, 4}, sb[3] = {2, 4, 3}, wide[2] = {3, 10};
    cm_tensor *base = cmt_randn(tp, 4, s4, 5, true);
    cm_tape *vt = cmt_tape();
    int perm[4] = {0, 2, 1, 3};
    cm_tensor *a = cm_permute(vt, base, perm); /* (2, 2, 3, 4) */
    cm_tensor *b = cmt_randn(tp, 3, sb, 6, true);
    cm_tensor *o = cm_matmul(vt, a, b);
    cr_assert(o);
    cmt_assert_close("permuted batch", o, ref_matmul(vt, a, b), 1e-4, 1e-4);
    cm_tape_free(vt);
    cm_tensor *w = cmt_randn(tp, 2, wide, 7, false);
    int64_t st[2] = {10, 2}, sh[2] = {3, 5};
    cm_tensor *odd = cmi_view(tp, CM_DTYPE_F32, 2, sh, st, w->data); /* (3, 5) with column stride 2 */
    cm_tensor_set_requires_grad(odd, true);
    const int64_t s54[2] = {5, 4};
    cm_tensor *c = cmt_randn(tp, 2, s54, 8, true);
    check_matmul("matmul column-strided a", odd, c);
    cm_tape_free(tp);
}

Test(matmul, zero_sized_dims) {
    cm_tape *tp = cmt_tape();
    const int64_t sa[2] = {3, 0}, sb[2] = {0, 4}, sm[2] = {0, 2}, sn[2] = {2, 4};
    cm_tensor *o = cm_matmul(tp, cm_zeros(tp, CM_DTYPE_F32, 2, sa), cm_zeros(tp, CM_DTYPE_F32, 2, sb));
    cr_assert(o, "%s", cm_tape_error(tp));
    for (int i = 0; i < 12; i++) cr_assert_eq(cm_tensor_get_flat(o, i), 0.0, "K = 0 gives zeros");
    cm_tensor *o2 = cm_matmul(tp, cm_zeros(tp, CM_DTYPE_F32, 2, sm), cm_zeros(tp, CM_DTYPE_F32, 2, sn));
    cr_assert(o2 && cm_tensor_numel(o2) == 0);
    cm_tape_free(tp);
}

/* ------------------------------------------------------------------------------------------ */

/* y = x·wᵀ + bias in double. */
static cm_tensor *ref_linear(cm_tape *tp, const cm_tensor *x, const cm_tensor *w, const cm_tensor *bias) {
    int64_t shape[CM_MAX_DIMS];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    const int64_t out_f = w->shape[0], in_f = w->shape[1];
    shape[x->ndim - 1] = out_f;
    cm_tensor *y = cm_empty(tp, CM_DTYPE_F32, x->ndim, shape);
    const int64_t R = cm_tensor_numel(x) / (in_f ? in_f : 1);
    for (int64_t r = 0; r < R; r++)
        for (int64_t o = 0; o < out_f; o++) {
            double s = bias ? cm_tensor_get_flat(bias, o) : 0;
            for (int64_t i = 0; i < in_f; i++) {
                int64_t wi[2] = {o, i};
                s += cm_tensor_get_flat(x, r * in_f + i) * cm_tensor_get(w, wi);
            }
            ((float *)y->data)[r * out_f + o] = (float)s;
        }
    return y;
}

static void check_linear(const char *name, cm_tensor *x, cm_tensor *w, cm_tensor *bias) {
    cm_tape *tp = cmt_tape();
    cm_tensor *y = cm_linear(tp, x, w, bias);
    cr_assert(y, "%s: %s", name, cm_tape_error(tp));
    cmt_assert_close(name, y, ref_linear(tp, x, w, bias), 1e-4, 1e-4);
    cm_tape_free(tp);
    cm_tensor *in[3] = {x, w, bias};
    cmt_gradcheck_opts o = opts();
    cmt_gradcheck(name, call_linear, NULL, 3, in, &o);
}

Test(linear, gradcheck_with_and_without_bias_2d_and_3d) {
    cm_tape *tp = cmt_tape();
    const int64_t x2[2] = {5, 7}, x3[3] = {2, 3, 7}, x1[1] = {7}, ws[2] = {4, 7}, bs[1] = {4};
    cm_tensor *w = cmt_randn(tp, 2, ws, 2, true), *b = cmt_randn(tp, 1, bs, 3, true);
    check_linear("linear 2d bias", cmt_randn(tp, 2, x2, 1, true), w, b);
    check_linear("linear 2d no bias", cmt_randn(tp, 2, x2, 4, true), w, NULL);
    check_linear("linear 3d bias", cmt_randn(tp, 3, x3, 5, true), w, b);
    check_linear("linear 1d x", cmt_randn(tp, 1, x1, 6, true), w, b);
    /* only w and bias need grads (a frozen input) */
    check_linear("linear x frozen", cmt_randn(tp, 3, x3, 7, false), w, b);
    cm_tape_free(tp);
}

static cm_tensor *call_linear_tbase(cm_tape *tp, cm_tensor *const *in, void *ctx) {
    return cm_linear(tp, in[0], cm_transpose(tp, in[1], 0, 1), in[2]);
}

/* A weight given as the recorded transpose of a contiguous (in, out) tensor (GPT-2's Conv1D) is
 * differentiated through that tensor directly (cmi_transposed_base): same values and gradients as
 * the reference (bf16 autocast: bf16.linear_weight_as_transpose_of_an_in_out_tensor). */
Test(linear, weight_as_transpose_of_an_in_out_tensor) {
    cm_tape *tp = cmt_tape();
    const int64_t xs[3] = {2, 3, 7}, wbs[2] = {7, 4}, bs[1] = {4};
    cm_tensor *x = cmt_randn(tp, 3, xs, 1, true), *wb = cmt_randn(tp, 2, wbs, 2, true), *b = cmt_randn(tp, 1, bs, 3, true);
    cm_tensor *w = cm_transpose(tp, wb, 0, 1);
    cr_assert_eq(cmi_transposed_base(w), wb, "the transpose of a contiguous leaf is recognised");
    cr_assert_null(cmi_transposed_base(cm_narrow(tp, cm_transpose(tp, wb, 0, 1), 1, 0, 5)), "a narrowed one is not");
    cm_tensor *y = cm_linear(tp, x, w, b);
    cr_assert(y, "%s", cm_tape_error(tp));
    cmt_assert_close("linear through wbᵀ", y, ref_linear(tp, x, w, b), 1e-4, 1e-4);
    cm_tensor *in[3] = {x, wb, b};
    cmt_gradcheck_opts o = opts();
    cmt_gradcheck("linear through wbᵀ", call_linear_tbase, NULL, 3, in, &o);
    cm_tensor *in_nob[3] = {x, wb, NULL};
    cmt_gradcheck("linear through wbᵀ, no bias", call_linear_tbase, NULL, 3, in_nob, &o);

    cm_tape_free(tp);
}

Test(linear, transposed_and_strided_inputs) {
    cm_tape *tp = cmt_tape();
    const int64_t x2[2] = {6, 5}, x3[3] = {2, 3, 5}, ws[2] = {3, 5}, bs[1] = {3};
    cm_tensor *b = cmt_randn(tp, 1, bs, 3, true);
    cm_tensor *xt = cmt_randn_noncontig(tp, 2, x2, 1, true); /* column-major x: CblasTrans */
    cm_tensor *wt = cmt_randn_noncontig(tp, 2, ws, 2, true); /* w stored (in, out) */
    check_linear("linear x^T w^T", xt, wt, b);
    cm_tensor *x3t = cmt_randn_noncontig(tp, 3, x3, 4, true); /* 3-D, last two swapped: copied */
    check_linear("linear 3-D strided x", x3t, wt, NULL);
    cm_tensor *bn = cmt_randn_noncontig(tp, 1, bs, 5, true); /* bias with stride 2 */
    check_linear("linear strided bias", cmt_randn(tp, 2, x2, 6, true), wt, bn);
    cm_tape_free(tp);
}

/* ------------------------------------------------------------------------------------------ */
/* bf16                                                                                         */
/* ------------------------------------------------------------------------------------------ */

/* The values of t rounded to bf16, as an f32 tensor (so the f32 reference sees the same inputs). */
static cm_tensor *round_bf16(cm_tape *tp, cm_tensor *t) {
    cm_tensor *h = cm_cast(tp, t, CM_DTYPE_BF16);
    cm_tensor *f = cm_empty(tp, CM_DTYPE_F32, t->ndim, t->shape);
    cr_assert(h && f);
    cm_tensor_copy(f, h);
    return f;
}

/* bf16 forward: inputs are exact in bf16 and products accumulate in f32, so it matches the f32
 * GEMM of the rounded inputs to f32 round-off: 1e-4 + 1e-4·|ref|. bf16 backward rounds the
 * upstream gradient to bf16 (relative error ≤ 2⁻⁹ per term), so a sum of K terms of size ~1 is
 * off by up to about 2⁻⁹·√K·3: atol 2e-2, rtol 1e-2 at K ≤ 40. */
static void check_bf16_vs_f32(const char *name, int na, const int64_t *sa, int nb, const int64_t *sb, bool linear,
                              bool transpose_b) {
    cm_tape *tp = cmt_tape();
    cm_tensor *a32 = round_bf16(tp, cmt_randn(tp, na, sa, 11, false));
    int64_t sbt[CM_MAX_DIMS]; /* b's memory shape: (..., N, K) when it is used as a transposed view */
    memcpy(sbt, sb, sizeof(int64_t) * (size_t)nb);
    if (transpose_b) sbt[nb - 2] = sb[nb - 1], sbt[nb - 1] = sb[nb - 2];
    cm_tensor *b32 = round_bf16(tp, cmt_randn(tp, nb, sbt, 12, false));
    cm_tensor_set_requires_grad(a32, true);
    cm_tensor_set_requires_grad(b32, true);
    /* bf16 leaves with their own (f32) gradients */
    cm_tensor *a16 = cm_cast(tp, a32, CM_DTYPE_BF16), *b16 = cm_cast(tp, b32, CM_DTYPE_BF16);
    cm_tape *t2 = cmt_tape();
    cm_tensor *ah = cm_clone_detached(t2, a16), *bh = cm_clone_detached(t2, b16);
    cm_tensor_set_requires_grad(ah, true);
    cm_tensor_set_requires_grad(bh, true);
    cm_tensor *ao = ah, *bo = bh, *ar = a32, *br = b32;
    if (transpose_b) {
        bo = cm_transpose(t2, bh, -1, -2);
        br = cm_transpose(tp, b32, -1, -2);
    }
    cm_tensor *bias = NULL;
    if (linear) {
        int64_t nout = br->shape[0];
        bias = cmt_randn(tp, 1, &nout, 13, true);
    }
    cm_tensor *y16 = linear ? cm_linear(t2, ao, bo, bias) : cm_matmul(t2, ao, bo);
    cr_assert(y16, "%s: %s", name, cm_tape_error(t2));
    cr_assert_eq(cm_tensor_dtype(y16), CM_DTYPE_F32);
    cm_tensor *y32 = linear ? cm_linear(tp, ar, br, bias) : cm_matmul(tp, ar, br);
    cr_assert(y32);
    cmt_assert_close(name, y16, y32, 1e-4, 1e-4);
    cm_tensor *g = cmt_randn(tp, y32->ndim, y32->shape, 14, false);
    cr_assert_eq(cm_tape_backward_with(tp, y32, g), CM_OK, "%s", cm_tape_error(tp));
    cm_tensor *gbias32 = NULL;
    if (bias) {
        gbias32 = cm_clone_detached(tp, cm_tensor_grad(bias));
        cm_tensor_zero_grad(bias);
    }
    cr_assert_eq(cm_tape_backward_with(t2, y16, g), CM_OK, "%s", cm_tape_error(t2));
    cr_assert_eq(cm_tensor_dtype(cm_tensor_grad(ah)), CM_DTYPE_F32);
    cmt_assert_close("bf16 grad a", cm_tensor_grad(ah), cm_tensor_grad(a32), 2e-2, 1e-2);
    cmt_assert_close("bf16 grad b", cm_tensor_grad(bh), cm_tensor_grad(b32), 2e-2, 1e-2);
    if (bias) cmt_assert_close("bf16 grad bias (f32 path)", cm_tensor_grad(bias), gbias32, 1e-5, 1e-5);
    cm_tape_free(t2);
    cm_tape_free(tp);
}

static void check_bf16_all(void) {
    const int64_t a2[2] = {9, 40}, b2[2] = {40, 11}, a3[3] = {3, 5, 8}, b3[3] = {3, 8, 6}, w[2] = {12, 40};
    const int64_t a4[4] = {2, 1, 4, 8}, b4[3] = {3, 8, 5}, x3[3] = {2, 3, 40};
    check_bf16_vs_f32("bf16 matmul 2d", 2, a2, 2, b2, false, false);
    check_bf16_vs_f32("bf16 matmul 2d, b transposed view", 2, a2, 2, b2, false, true);
    check_bf16_vs_f32("bf16 matmul batched", 3, a3, 3, b3, false, false);
    check_bf16_vs_f32("bf16 matmul broadcast batch", 4, a4, 3, b4, false, false);
    check_bf16_vs_f32("bf16 matmul folded", 3, x3, 2, b2, false, false);
    check_bf16_vs_f32("bf16 linear", 2, a2, 2, w, true, false);
    check_bf16_vs_f32("bf16 linear 3-D x", 3, x3, 2, w, true, false);
}

/* Under bf16 autocast a weight given as the transpose of a contiguous (in, out) f32 tensor wb is
 * cast as wb (contiguous) and used transposed; values and gradients against f32 on the same
 * bf16-rounded values, tolerances as check_bf16_vs_f32 (K = 40). */
Test(bf16, linear_weight_as_transpose_of_an_in_out_tensor) {
    cm_tape *tp = cmt_tape();
    const int64_t xs[3] = {2, 3, 40}, wbs[2] = {40, 12}, bs[1] = {12}, ys[3] = {2, 3, 12};
    cm_tensor *x = round_bf16(tp, cmt_randn(tp, 3, xs, 1, false)), *wb = round_bf16(tp, cmt_randn(tp, 2, wbs, 2, false));
    cm_tensor *b = cmt_randn(tp, 1, bs, 3, true), *g = cmt_randn(tp, 3, ys, 4, false);
    cm_tensor_set_requires_grad(x, true);
    cm_tensor_set_requires_grad(wb, true);
    cm_tensor *y32 = cm_linear(tp, x, cm_transpose(tp, wb, 0, 1), b);
    cr_assert_eq(cm_tape_backward_with(tp, y32, g), CM_OK, "%s", cm_tape_error(tp));
    cm_tensor *gx32 = cm_clone_detached(tp, cm_tensor_grad(x)), *gw32 = cm_clone_detached(tp, cm_tensor_grad(wb));
    cm_tensor *gb32 = cm_clone_detached(tp, cm_tensor_grad(b));
    cm_tensor_zero_grad(x), cm_tensor_zero_grad(wb), cm_tensor_zero_grad(b);
    cm_tape_set_autocast(tp, CM_DTYPE_BF16);
    const int64_t nodes = tp->n_nodes;
    cm_tensor *y16 = cm_linear(tp, x, cm_transpose(tp, wb, 0, 1), b);
    cr_assert(y16, "%s", cm_tape_error(tp));
    cmt_assert_close("bf16 linear through wbᵀ", y16, y32, 1e-4, 1e-4);
    /* the bf16 copies are not on the tape: the transpose view and the linear node, whose inputs are
     * the f32 tensors that receive the gradients */
    cr_assert_eq(tp->n_nodes, nodes + 2, "recorded %lld nodes", (long long)(tp->n_nodes - nodes));
    cr_assert(y16->node && strcmp(y16->node->op, "linear") == 0 && y16->node->in[0] == x && y16->node->in[1] == wb);
    cr_assert_eq(cm_tape_backward_with(tp, y16, g), CM_OK, "%s", cm_tape_error(tp));
    cr_assert_eq(cm_tensor_dtype(cm_tensor_grad(wb)), CM_DTYPE_F32);
    cmt_assert_close("bf16 grad x", cm_tensor_grad(x), gx32, 2e-2, 1e-2);
    cmt_assert_close("bf16 grad wb", cm_tensor_grad(wb), gw32, 2e-2, 1e-2);
    cmt_assert_close("bf16 grad bias", cm_tensor_grad(b), gb32, 1e-5, 1e-5);
    cm_tape_free(tp);
}

/* Autocast linear keeps no bf16 copies: x and w are copied into scratch for the forward GEMM and
 * again for the backward, so the forward leaves only y (and the node) in the arena. */
Test(bf16, autocast_linear_keeps_no_bf16_copies_on_the_tape) {
    cm_tape *tp = cmt_tape();
    const int64_t xs[2] = {64, 96}, ws[2] = {80, 96}, bs[1] = {80}, ys[2] = {64, 80};
    cm_tensor *x = round_bf16(tp, cmt_randn(tp, 2, xs, 1, false)), *w = round_bf16(tp, cmt_randn(tp, 2, ws, 2, false));
    cm_tensor *b = cmt_randn(tp, 1, bs, 3, true), *g = round_bf16(tp, cmt_randn(tp, 2, ys, 4, false));
    cm_tensor_set_requires_grad(x, true);
    cm_tensor_set_requires_grad(w, true);
    cm_tensor *y32 = cm_linear(tp, x, w, b);
    cr_assert_eq(cm_tape_backward_with(tp, y32, g), CM_OK, "%s", cm_tape_error(tp));
    cm_tensor *gx32 = cm_clone_detached(tp, cm_tensor_grad(x)), *gw32 = cm_clone_detached(tp, cm_tensor_grad(w));
    cm_tensor_zero_grad(x), cm_tensor_zero_grad(w), cm_tensor_zero_grad(b);
    cm_tape_set_autocast(tp, CM_DTYPE_BF16);
    const size_t before = cm_arena_used(cm_tape_arena(tp));
    cm_tensor *y = cm_linear(tp, x, w, b);
    cr_assert(y, "%s", cm_tape_error(tp));
    const size_t grew = cm_arena_used(cm_tape_arena(tp)) - before, ybytes = sizeof(float) * 64 * 80;
    cr_assert(grew >= ybytes && grew < ybytes + 4096, "the forward kept %zu bytes for a %zu-byte output", grew, ybytes);
    cr_assert_eq(cm_tape_backward_with(tp, y, g), CM_OK, "%s", cm_tape_error(tp));
    /* the f32 reference used the same bf16-rounded x, w and dy: only the summation order differs */
    cmt_assert_close("y", y, y32, 1e-4, 1e-4);
    cmt_assert_close("grad x", cm_tensor_grad(x), gx32, 1e-4, 1e-4);
    cmt_assert_close("grad w", cm_tensor_grad(w), gw32, 1e-4, 1e-4);
    cm_tape_free(tp);
}

/* An upstream gradient wider than CMI_LINEAR_DY_BLOCK in bf16 is rounded and multiplied in row
 * blocks; the gradients match f32 on the same bf16-rounded x, w and dy (so only the f32 summation
 * order differs: dx sums 50000 products of magnitude ~1), for a plain and a transposed
 * (Conv1D-style) weight. */
Test(bf16, autocast_linear_backward_in_row_blocks_matches_f32) {
    const int64_t R = 520, in_f = 32, out_f = 50000;
    cr_assert_gt((size_t)(R * out_f) * 2, CMI_LINEAR_DY_BLOCK, "the shape must need more than one block");
    for (int tw = 0; tw < 2; tw++) {
        cm_tape *tp = cmt_tape();
        const int64_t xs[2] = {R, in_f}, ws[2] = {out_f, in_f}, wts[2] = {in_f, out_f}, ys[2] = {R, out_f};
        cm_tensor *x = round_bf16(tp, cmt_randn(tp, 2, xs, 1, false));
        cm_tensor *w = round_bf16(tp, cmt_randn(tp, 2, tw ? wts : ws, 2, false));
        cm_tensor *g = round_bf16(tp, cmt_randn(tp, 2, ys, 4, false));
        cm_tensor_set_requires_grad(x, true);
        cm_tensor_set_requires_grad(w, true);
        cm_tensor *y32 = cm_linear(tp, x, tw ? cm_transpose(tp, w, 0, 1) : w, NULL);
        cr_assert_eq(cm_tape_backward_with(tp, y32, g), CM_OK, "%s", cm_tape_error(tp));
        cm_tensor *gx32 = cm_clone_detached(tp, cm_tensor_grad(x)), *gw32 = cm_clone_detached(tp, cm_tensor_grad(w));
        cm_tensor_zero_grad(x), cm_tensor_zero_grad(w);
        cm_tape_set_autocast(tp, CM_DTYPE_BF16);
        cm_tensor *y = cm_linear(tp, x, tw ? cm_transpose(tp, w, 0, 1) : w, NULL);
        cr_assert(y, "%s", cm_tape_error(tp));
        cr_assert_eq(cm_tape_backward_with(tp, y, g), CM_OK, "%s", cm_tape_error(tp));
        cmt_assert_close(tw ? "grad x (wᵀ)" : "grad x", cm_tensor_grad(x), gx32, 2e-3, 1e-4);
        cmt_assert_close(tw ? "grad w (wᵀ)" : "grad w", cm_tensor_grad(w), gw32, 2e-3, 1e-4);
        cm_tape_free(tp);
    }
}

/* linear writes a new gradient of an intermediate x with the dx GEMM (beta 0) instead of zeroing
 * it and adding: on a poisoning tape (new arena memory is NaN) a row it missed shows up. Against
 * the same op on a leaf (zeroed, added to): grad x0 = 2 · grad x; f32, autocast, 3-D x. */
Test(bf16, linear_writes_a_fresh_input_gradient) {
    for (int amp = 0; amp < 2; amp++) {
        cm_tape_config tc = cm_tape_config_default();
        tc.poison = true;
        cm_tape *tp;
        cr_assert_eq(cm_tape_new(&tc, &tp), CM_OK);
        const int64_t xs[3] = {3, 5, 24}, ws[2] = {10, 24}, bs[1] = {10}, ys[3] = {3, 5, 10};
        cm_tensor *x0 = cmt_randn(tp, 3, xs, 1, true), *w = cmt_randn(tp, 2, ws, 2, true);
        cm_tensor *b = cmt_randn(tp, 1, bs, 3, true), *g = cmt_randn(tp, 3, ys, 4, false);
        if (amp) cm_tape_set_autocast(tp, CM_DTYPE_BF16);
        cm_tensor *xl = cm_clone_detached(tp, cm_mul_scalar(tp, x0, 2.0f));
        cm_tensor_set_requires_grad(xl, true);
        cr_assert_eq(cm_tape_backward_with(tp, cm_linear(tp, xl, w, b), g), CM_OK, "%s", cm_tape_error(tp));
        cm_tensor *want = cm_mul_scalar(tp, cm_tensor_grad(xl), 2.0f);
        cm_tensor *y = cm_linear(tp, cm_mul_scalar(tp, x0, 2.0f), w, b);
        cr_assert(y, "%s", cm_tape_error(tp));
        cr_assert_eq(cm_tape_backward_with(tp, y, g), CM_OK, "%s", cm_tape_error(tp));
        cmt_assert_close(amp ? "grad x (autocast)" : "grad x", cm_tensor_grad(x0), want, 1e-5, 1e-5);
        cm_tape_free(tp);
    }
}

/* The widening kernel (bf16 → f32, sgemm) runs on every CPU. */
Test(bf16, widen_kernel_matches_f32_reference) {
    cmi_bf16_set_kernel(CMI_BF16_WIDEN);
    check_bf16_all();
}

/* oneDNN's bf16 matmul exists only on AVX-512 CPUs (native on AVX512-BF16/AMX, emulated on plain
 * AVX-512); elsewhere forcing it is a clear error that names the ISA and the fix. */
Test(bf16, onednn_kernel_matches_f32_reference_or_names_the_isa) {
    cmi_bf16_set_kernel(CMI_BF16_ONEDNN);
    const int64_t sa[2] = {4, 8}, sb[2] = {8, 3};
    cm_tape *tp = cmt_tape();
    cm_tensor *a = cm_cast(tp, cmt_randn(tp, 2, sa, 1, false), CM_DTYPE_BF16);
    cm_tensor *b = cm_cast(tp, cmt_randn(tp, 2, sb, 2, false), CM_DTYPE_BF16);
    cm_tensor *y = cm_matmul(tp, a, b);
    if (!y) {
        cr_log_info("oneDNN has no bf16 matmul on ISA %s: checking the error only", cmi_dnnl_isa_name());
        cmt_expect_error(tp, y, CM_ERR_UNSUPPORTED, "no bf16 matmul for this CPU", "CM_BF16_GEMM=widen", NULL);
        cm_tape_free(tp);
        return;
    }
    cm_tape_free(tp);
    check_bf16_all();
}

/* Without native bf16 instructions the default is the widening kernel (oneDNN is absent or several
 * times slower there); with them, oneDNN. */
Test(bf16, default_kernel_follows_the_isa) {
    const char *env = getenv("CM_BF16_GEMM");
    if (env && *env) cr_skip_test("CM_BF16_GEMM=%s overrides the default", env);
    cr_assert_eq(cmi_bf16_get_kernel(), cmi_bf16_native() ? CMI_BF16_ONEDNN : CMI_BF16_WIDEN, "ISA %s",
                 cmi_dnnl_isa_name());
}

Test(bf16, primitives_are_cached) {
    cmi_bf16_set_kernel(CMI_BF16_ONEDNN);
    cm_tape *tp = cmt_tape();
    const int64_t sa[2] = {7, 13}, sb[2] = {13, 3};
    cm_tensor *a = cm_cast(tp, cmt_randn(tp, 2, sa, 1, false), CM_DTYPE_BF16);
    cm_tensor *b = cm_cast(tp, cmt_randn(tp, 2, sb, 2, false), CM_DTYPE_BF16);
    if (!cm_matmul(tp, a, b)) {
        cm_tape_free(tp);
        cr_skip_test("oneDNN has no bf16 matmul on ISA %s, so there are no primitives to cache", cmi_dnnl_isa_name());
    }
    int n = cmi_gemm_bf16_cache_size();
    for (int i = 0; i < 5; i++) cr_assert(cm_matmul(tp, a, b));
    cr_assert_eq(cmi_gemm_bf16_cache_size(), n, "repeated calls created primitives: %d -> %d", n,
                 cmi_gemm_bf16_cache_size());
    cm_tape_free(tp);
}

/* ------------------------------------------------------------------------------------------ */
/* f32 GEMM kernels                                                                             */
/* ------------------------------------------------------------------------------------------ */

/* Both f32 kernels against a double reference: every transpose pair, alpha/beta, leading dims wider
 * than the matrices, and inside a parallel region (where both run single-threaded). Tolerance as for
 * the f32 matmul above (K ≤ 70, N(0, 1) values: 1e-4 + 1e-4·|ref|). */
Test(f32_gemm, both_kernels_match_a_double_reference) {
    const cmi_f32_kernel saved = cmi_f32_get_kernel();
    const int64_t M = 37, N = 29, K = 70, pad = 5;
    float *a = malloc(sizeof(float) * (size_t)((M + pad) * (K + pad)));
    float *b = malloc(sizeof(float) * (size_t)((K + pad) * (N + pad)));
    float *c0 = malloc(sizeof(float) * (size_t)(M * (N + pad)));
    float *c = malloc(sizeof(float) * (size_t)(M * (N + pad)));
    cm_rng r = cm_rng_init(7, 0);
    cm_rng_normal(&r, a, (size_t)((M + pad) * (K + pad)), 0, 1);
    cm_rng_normal(&r, b, (size_t)((K + pad) * (N + pad)), 0, 1);
    cm_rng_normal(&r, c0, (size_t)(M * (N + pad)), 0, 1);
    for (int kern = 0; kern < 2; kern++) {
        cmi_f32_set_kernel(kern ? CMI_F32_ONEDNN : CMI_F32_OPENBLAS);
        for (int t = 0; t < 8; t++) {
            const bool ta = t & 1, tb = t & 2, par = t & 4;
            const int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
            const float alpha = 0.75f, beta = -0.5f;
            memcpy(c, c0, sizeof(float) * (size_t)(M * ldc));
            if (par) {
#pragma omp parallel num_threads(2)
                {
#pragma omp single
                    cmi_sgemm(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
                }
            } else {
                cmi_sgemm(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
            }
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) {
                    double ref = 0;
                    for (int64_t k = 0; k < K; k++)
                        ref += (double)(ta ? a[k * lda + i] : a[i * lda + k]) * (tb ? b[j * ldb + k] : b[k * ldb + j]);
                    ref = alpha * ref + beta * (double)c0[i * ldc + j];
                    cr_assert(fabs(c[i * ldc + j] - ref) <= 1e-4 + 1e-4 * fabs(ref),
                              "%s ta %d tb %d par %d: C[%lld, %lld] = %g, reference %g", cmi_f32_kernel_name(kern),
                              ta, tb, par, (long long)i, (long long)j, c[i * ldc + j], ref);
                }
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = N; j < ldc; j++)
                    cr_assert_eq(c[i * ldc + j], c0[i * ldc + j], "%s wrote past N into the row padding",
                                 cmi_f32_kernel_name(kern));
        }
    }
    cmi_f32_set_kernel(saved);
    free(a), free(b), free(c0), free(c);
}

/* oneDNN's sgemm where its ISA has AVX-512, OpenBLAS elsewhere, unless CM_F32_GEMM says. */
Test(f32_gemm, default_kernel_follows_the_isa) {
    const char *env = getenv("CM_F32_GEMM");
    if (env && *env) cr_skip_test("CM_F32_GEMM=%s overrides the default", env);
    const bool avx512 = strncmp(cmi_dnnl_isa_name(), "avx512_core", 11) == 0;
    cr_assert_eq(cmi_f32_get_kernel(), avx512 ? CMI_F32_ONEDNN : CMI_F32_OPENBLAS, "ISA %s", cmi_dnnl_isa_name());
}

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                       */
/* ------------------------------------------------------------------------------------------ */

static void expect_error(cm_tape *tp, cm_tensor *r, cm_status st, const char *s1, const char *s2) {
    cmt_expect_error(tp, r, st, s1, s2, NULL);
}

Test(matmul, errors_name_the_shapes_and_dtypes) {
    const int64_t s23[2] = {2, 3}, s45[2] = {4, 5}, s235[3] = {2, 3, 5}, s354[3] = {3, 5, 4}, s3[1] = {3};
    cm_tape *tp = cmt_tape();
    expect_error(tp, cm_matmul(tp, cmt_randn(tp, 2, s23, 1, false), cmt_randn(tp, 2, s45, 2, false)), CM_ERR_SHAPE,
                 "matmul: inner dims differ: a (2, 3) vs b (4, 5)", NULL);
    cm_tape_free(tp);
    tp = cmt_tape();
    expect_error(tp, cm_matmul(tp, cmt_randn(tp, 3, s235, 1, false), cmt_randn(tp, 3, s354, 2, false)), CM_ERR_SHAPE,
                 "batch dims do not broadcast", "(2, 3, 5)");
    cm_tape_free(tp);
    tp = cmt_tape();
    expect_error(tp, cm_matmul(tp, cmt_randn(tp, 1, s3, 1, false), cmt_randn(tp, 2, s23, 2, false)), CM_ERR_SHAPE,
                 "at least 2 dims", "(3,)");
    cm_tape_free(tp);
    tp = cmt_tape();
    cm_tensor *a = cmt_randn(tp, 2, s23, 1, false);
    const int64_t s34[2] = {3, 4};
    cm_tensor *b16 = cm_cast(tp, cmt_randn(tp, 2, s34, 2, false), CM_DTYPE_BF16);
    expect_error(tp, cm_matmul(tp, a, b16), CM_ERR_DTYPE, "matmul: dtypes differ", "bf16");
    cm_tape_free(tp);
    tp = cmt_tape();
    cm_tensor *i1 = cm_zeros(tp, CM_DTYPE_I64, 2, s23), *i2 = cm_zeros(tp, CM_DTYPE_I64, 2, s34);
    expect_error(tp, cm_matmul(tp, i1, i2), CM_ERR_DTYPE, "matmul: dtype i64", NULL);
    cm_tape_free(tp);
    /* chaining: a NULL input keeps the first error */
    tp = cmt_tape();
    a = cmt_randn(tp, 2, s23, 1, false);
    cr_assert_null(cm_matmul(tp, cm_matmul(tp, a, a), a));
    cr_assert(strstr(cm_tape_error(tp), "inner dims differ"), "%s", cm_tape_error(tp));
    cm_tape_free(tp);
}

Test(linear, errors_name_the_shapes_and_dtypes) {
    const int64_t x[2] = {2, 3}, w[2] = {4, 5}, w3[3] = {1, 4, 3}, good_w[2] = {4, 3}, bad_b[1] = {5};
    cm_tape *tp = cmt_tape();
    expect_error(tp, cm_linear(tp, cmt_randn(tp, 2, x, 1, false), cmt_randn(tp, 2, w, 2, false), NULL), CM_ERR_SHAPE,
                 "linear: in features differ: x (2, 3) vs w (4, 5)", NULL);
    cm_tape_free(tp);
    tp = cmt_tape();
    expect_error(tp, cm_linear(tp, cmt_randn(tp, 2, x, 1, false), cmt_randn(tp, 3, w3, 2, false), NULL), CM_ERR_SHAPE,
                 "must be 2-D", "(1, 4, 3)");
    cm_tape_free(tp);
    tp = cmt_tape();
    expect_error(tp,
                 cm_linear(tp, cmt_randn(tp, 2, x, 1, false), cmt_randn(tp, 2, good_w, 2, false),
                           cmt_randn(tp, 1, bad_b, 3, false)),
                 CM_ERR_SHAPE, "bias (5,)", "(4, 3)");
    cm_tape_free(tp);
    tp = cmt_tape();
    cm_tensor *x16 = cm_cast(tp, cmt_randn(tp, 2, x, 1, false), CM_DTYPE_BF16);
    expect_error(tp, cm_linear(tp, x16, cmt_randn(tp, 2, good_w, 2, false), NULL), CM_ERR_DTYPE, "linear: dtypes differ",
                 "f32");
    cm_tape_free(tp);
    tp = cmt_tape();
    const int64_t nb[1] = {4};
    cm_tensor *w16 = cm_cast(tp, cmt_randn(tp, 2, good_w, 2, false), CM_DTYPE_BF16);
    cm_tensor *b16 = cm_cast(tp, cmt_randn(tp, 1, nb, 3, false), CM_DTYPE_BF16);
    x16 = cm_cast(tp, cmt_randn(tp, 2, x, 1, false), CM_DTYPE_BF16);
    expect_error(tp, cm_linear(tp, x16, w16, b16), CM_ERR_DTYPE, "bias (4,) has dtype bf16", NULL);
    cm_tape_free(tp);
}
