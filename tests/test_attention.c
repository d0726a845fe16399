/* cm_attention: forward against a naive double-precision reference written with loops, gradient
 * checks for q, k, v and bias (causal on/off, T != S, odd D, ALiBi-shaped biases, padding masks,
 * fully-masked rows, permuted and other strided inputs, causal row blocks (T > 64), the parallel
 * path), and the error cases.
 *
 * Tolerances: forward vs the double reference atol 2e-5 + rtol 1e-4 (f32 sgemm + expf over
 * D, S <= 24 terms). Gradchecks use central differences with eps 1e-2 and the defaults atol 1e-3,
 * rtol 1e-2: the truncation error eps²·f''' is ~1e-4 for these O(1) inputs, the f32 round-off of
 * L = Σ out·R divided by 2·eps is ~1e-5. */
#include "cmtest.h"
#include "tensor/tensor_impl.h"

#include <math.h>
#include <stdlib.h>

/* ---- naive reference (double, loops, any strides) ---- */

static double bias_at(const cm_tensor *bias, int64_t b, int64_t h, int64_t i, int64_t j) {
    const int64_t full[4] = {b, h, i, j};
    int64_t idx[CM_MAX_DIMS];
    const int nd = bias->ndim;
    for (int d = 0; d < nd; d++) {
        int64_t v = full[4 - nd + d];
        idx[d] = bias->shape[d] == 1 ? 0 : v;
    }
    return cm_tensor_get(bias, idx);
}

/* out: (B, H, T, D) doubles, contiguous. */
static void ref_attention(const cm_tensor *q, const cm_tensor *k, const cm_tensor *v, const cm_attention_opts *o,
                          double *out) {
    const int64_t B = q->shape[0], H = q->shape[1], T = q->shape[2], D = q->shape[3], S = k->shape[2];
    const double scale = o->scale != 0 ? o->scale : 1.0 / sqrt((double)D);
    double *l = malloc(sizeof(double) * (size_t)(S + 1));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < T; i++) {
                double mx = -INFINITY;
                for (int64_t j = 0; j < S; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < D; d++) {
                        int64_t qi[4] = {b, h, i, d}, ki[4] = {b, h, j, d};
                        s += cm_tensor_get(q, qi) * cm_tensor_get(k, ki);
                    }
                    s *= scale;
                    if (o->bias) s += bias_at(o->bias, b, h, i, j);
                    int64_t mi[2] = {b, j};
                    if (o->key_padding_mask && cm_tensor_get(o->key_padding_mask, mi) == 0) s = -INFINITY;
                    if (o->causal && j > i) s = -INFINITY;
                    l[j] = s;
                    if (s > mx) mx = s;
                }
                double sum = 0;
                for (int64_t j = 0; j < S; j++) {
                    l[j] = mx == -INFINITY ? 0 : exp(l[j] - mx);
                    sum += l[j];
                }
                for (int64_t d = 0; d < D; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j < S; j++) {
                        int64_t vi[4] = {b, h, j, d};
                        acc += l[j] * cm_tensor_get(v, vi);
                    }
                    out[((b * H + h) * T + i) * D + d] = sum > 0 ? acc / sum : 0.0;
                }
            }
    free(l);
}

static void assert_matches_ref(const char *what, cm_tensor *out, cm_tensor *q, cm_tensor *k, cm_tensor *v,
                               const cm_attention_opts *o) {
    cr_assert(out, "%s: %s", what, cm_last_error());
    const int64_t n = cm_tensor_numel(out);
    double *ref = malloc(sizeof(double) * (size_t)(n + 1));
    ref_attention(q, k, v, o, ref);
    for (int64_t i = 0; i < n; i++) {
        double x = cm_tensor_get_flat(out, i), tol = 2e-5 + 1e-4 * fabs(ref[i]);
        cr_assert(fabs(x - ref[i]) <= tol, "%s[%lld]: %.7g vs reference %.7g (|diff| %.3g > tol %.3g)", what,
                  (long long)i, x, ref[i], fabs(x - ref[i]), tol);
    }
    free(ref);
}

/* ---- cases ---- */

typedef struct {
    const char *name;
    int64_t B, H, T, S, D;
    bool causal;
    float scale;
    int bias_kind; /* 0 none, 1 full (B, H, T, S), 2 ALiBi (1, H, T, S), 3 (H, 1, S), 4 (T, S) */
    int mask_kind; /* 0 none, 1 u8 partial, 2 i64 with batch 0 fully masked, 3 i32 key 0 masked (+causal: row 0 empty) */
    int layout;    /* 0 contiguous, 1 q/k/v from cm_permute of (B, T, H, D), 2 last two dims swapped, 3 stride-2 D */
} att_case;

static const att_case k_cases[] = {
    {"plain", 2, 2, 4, 4, 8, false, 0, 0, 0, 0},
    {"causal", 2, 2, 5, 5, 8, true, 0, 0, 0, 0},
    {"t_ne_s", 1, 3, 3, 6, 5, false, 0, 0, 0, 0},
    {"causal_t_lt_s", 2, 1, 3, 6, 5, true, 0, 0, 0, 0},
    {"causal_t_gt_s", 1, 2, 6, 3, 7, true, 0.3f, 0, 0, 0},
    {"odd_d_full_bias", 2, 2, 4, 5, 3, false, 0, 1, 0, 0},
    {"alibi_causal", 1, 3, 5, 5, 6, true, 0, 2, 0, 0},
    {"alibi_h1s", 2, 3, 4, 6, 5, false, 0, 3, 0, 0},
    {"bias_ts", 2, 2, 3, 4, 4, false, 0.5f, 4, 0, 0},
    {"pad_u8", 2, 2, 4, 6, 5, false, 0, 0, 1, 0},
    {"pad_fully_masked_batch", 2, 2, 4, 5, 6, false, 0, 2, 2, 0},
    {"pad_causal_first_row_empty", 2, 2, 4, 4, 5, true, 0, 0, 3, 0},
    {"permuted_qkv", 2, 3, 5, 5, 4, true, 0, 0, 0, 1},
    {"permuted_t_ne_s_bias_mask", 2, 2, 3, 5, 6, false, 0, 2, 1, 1},
    {"swapped_last_dims", 2, 2, 4, 5, 6, false, 0, 3, 0, 2},
    {"strided_d_copy_path", 1, 2, 4, 3, 5, true, 0, 0, 1, 3},
    {"causal_row_blocks", 1, 2, 70, 70, 4, true, 0, 2, 1, 0},
    {"causal_row_blocks_t_gt_s", 1, 1, 135, 66, 3, true, 0, 1, 0, 1},
    {"row_blocks_noncausal", 1, 1, 66, 9, 5, false, 0, 4, 1, 0},
    {"parallel_size", 2, 3, 24, 20, 16, true, 0, 2, 1, 0},
};

typedef struct {
    const att_case *c;
    cm_tensor *mask;
    bool out_bthd;   /* ask for the (B, T, H, D) output layout */
    float dropout_p; /* > 0: fused dropout, the mask drawn from a generator made afresh per call */
} att_ctx;

/* in: q, k, v, bias (may be NULL). With layout 1 the inputs are (B, T, H, D) / (B, S, H, D) and are
 * permuted here, as GPT code does. */
static cm_tensor *call_attention(cm_tape *tp, cm_tensor *const *in, void *vctx) {
    const att_ctx *x = vctx;
    cm_attention_opts o = cm_attention_opts_default();
    o.causal = x->c->causal;
    o.scale = x->c->scale;
    o.bias = in[3];
    o.key_padding_mask = x->mask;
    o.out_bthd = x->out_bthd;
    cm_rng rng = cm_rng_init(17, 1);
    if (x->dropout_p > 0.0f) o.dropout_p = x->dropout_p, o.rng = &rng;
    cm_tensor *q = in[0], *k = in[1], *v = in[2];
    if (x->c->layout == 1) {
        const int perm[4] = {0, 2, 1, 3};
        q = cm_permute(tp, q, perm);
        k = cm_permute(tp, k, perm);
        v = cm_permute(tp, v, perm);
    }
    return cm_attention(tp, q, k, v, &o);
}

/* A leaf view whose last dim has stride 2: no unit-stride dim, so cm_attention must copy it. */
static cm_tensor *randn_stride2(cm_tape *tp, const int64_t *shape, uint64_t seed) {
    cm_tensor *src = cmt_randn(tp, 4, shape, seed, false);
    int64_t mshape[4] = {shape[0], shape[1], shape[2], 2 * shape[3]}, stride[4];
    cm_tensor *mem = cm_empty(tp, CM_DTYPE_F32, 4, mshape);
    cr_assert(mem);
    cmi_contig_strides(4, mshape, stride);
    stride[3] = 2;
    cm_tensor *view = cmi_view(tp, CM_DTYPE_F32, 4, shape, stride, mem->data);
    cr_assert_eq(cm_tensor_copy(view, src), CM_OK);
    cm_tensor_set_requires_grad(view, true);
    return view;
}

static cm_tensor *make_qkv(cm_tape *tp, const att_case *c, int64_t N, uint64_t seed) {
    const int64_t s[4] = {c->B, c->H, N, c->D}, sp[4] = {c->B, N, c->H, c->D};
    switch (c->layout) {
    case 1: return cmt_randn(tp, 4, sp, seed, true);
    case 2: return cmt_randn_noncontig(tp, 4, s, seed, true);
    case 3: return randn_stride2(tp, s, seed);
    default: return cmt_randn(tp, 4, s, seed, true);
    }
}

static cm_tensor *make_bias(cm_tape *tp, const att_case *c) {
    const int64_t H = c->H, T = c->T, S = c->S;
    switch (c->bias_kind) {
    case 1: {
        const int64_t s[4] = {c->B, H, T, S};
        return cmt_randn(tp, 4, s, 40, true);
    }
    case 2: { /* ALiBi: -m_h·|i − j| with m_h = 2^(-8(h+1)/H), plus noise so the gradient check sees variety */
        const int64_t s[4] = {1, H, T, S};
        cm_tensor *b = cmt_rand_uniform(tp, 4, s, 41, -0.1f, 0.1f, true);
        float *p = cm_tensor_data(b);
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < T; i++)
                for (int64_t j = 0; j < S; j++)
                    p[(h * T + i) * S + j] += -powf(2.0f, -8.0f * (float)(h + 1) / (float)H) * (float)llabs(i - j);
        return b;
    }
    case 3: {
        const int64_t s[3] = {H, 1, S};
        return cmt_randn(tp, 3, s, 42, true);
    }
    case 4: {
        const int64_t s[2] = {T, S};
        return cmt_randn(tp, 2, s, 43, true);
    }
    default: return NULL;
    }
}

static cm_tensor *make_mask(cm_tape *tp, const att_case *c) {
    const int64_t s[2] = {c->B, c->S};
    cm_tensor *m = NULL;
    switch (c->mask_kind) {
    case 1:
        m = cm_zeros(tp, CM_DTYPE_U8, 2, s);
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t j = 0; j < c->S; j++) {
                int64_t idx[2] = {b, j};
                cm_tensor_set(m, idx, (j + b) % 3 != 2); /* some padding in every row, never all */
            }
        break;
    case 2:
        m = cm_zeros(tp, CM_DTYPE_I64, 2, s);
        for (int64_t j = 0; j < c->S; j++) {
            int64_t idx[2] = {1, j};
            cm_tensor_set(m, idx, j < c->S - 1 ? 5 : 0); /* batch 0: all padding; batch 1: last key padding */
        }
        break;
    case 3:
        m = cm_zeros(tp, CM_DTYPE_I32, 2, s);
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t j = 0; j < c->S; j++) {
                int64_t idx[2] = {b, j};
                cm_tensor_set(m, idx, j != 0); /* key 0 padding: with causal, query 0 sees nothing */
            }
        break;
    default: break;
    }
    return m;
}

Test(attention, forward_matches_naive_reference) {
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        const att_case *c = &k_cases[i];
        cm_tape *tp = cmt_tape();
        cm_tensor *in[4] = {make_qkv(tp, c, c->T, 10 + i), make_qkv(tp, c, c->S, 20 + i), make_qkv(tp, c, c->S, 30 + i),
                            make_bias(tp, c)};
        att_ctx x = {c, make_mask(tp, c), false, 0.0f};
        cm_tensor *out = call_attention(tp, in, &x);
        cr_assert(out, "%s: %s", c->name, cm_tape_error(tp));
        cm_attention_opts o = {c->causal, c->scale, in[3], x.mask, 0.0f, NULL, false};
        if (c->layout == 1) {
            const int perm[4] = {0, 2, 1, 3};
            for (int j = 0; j < 3; j++) in[j] = cm_permute(tp, in[j], perm);
        }
        assert_matches_ref(c->name, out, in[0], in[1], in[2], &o);
        cm_tape_free(tp);
    }
}

/* The backward recomputes P block by block; every case is checked with both output layouts, and
 * with fused dropout (p = 0.2) on top of its causal mask, bias and padding mask. */
Test(attention, gradcheck_q_k_v_bias_all_cases) {
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++)
        for (int variant = 0; variant < 3; variant++) {
            const att_case *c = &k_cases[i];
            cm_tape *tp = cmt_tape();
            cm_tensor *in[4] = {make_qkv(tp, c, c->T, 10 + i), make_qkv(tp, c, c->S, 20 + i),
                                make_qkv(tp, c, c->S, 30 + i), make_bias(tp, c)};
            att_ctx x = {c, make_mask(tp, c), variant >= 1, variant == 2 ? 0.2f : 0.0f};
            cmt_gradcheck_opts go = cmt_gradcheck_defaults();
            go.max_checks = c->B * c->H * c->T * c->S * c->D > 20000 ? 48 : 0; /* all elements on the small cases */
            char name[96];
            snprintf(name, sizeof name, "%s%s%s", c->name, x.out_bthd ? " out_bthd" : "", x.dropout_p > 0 ? " dropout" : "");
            cmt_gradcheck(name, call_attention, &x, 4, in, &go);
            cm_tape_free(tp);
        }
}

/* out_bthd = true writes the (B, T, H, D) layout directly: exactly the permuted (B, H, T, D) result,
 * and (with the upstream gradient permuted to match) exactly the same gradients. */
Test(attention, out_bthd_is_the_permuted_output_with_the_same_gradients) {
    static const size_t which[] = {1, 6, 11, 13, 16, 17, 19}; /* causal, ALiBi, masks, permuted, row blocks, parallel */
    const int perm[4] = {0, 2, 1, 3};
    for (size_t w = 0; w < sizeof which / sizeof which[0]; w++)
        for (int dropout = 0; dropout < 2; dropout++) {
            const att_case *c = &k_cases[which[w]];
            cm_tensor *out[2], *grads[2][4];
            cm_tape *tps[2];
            for (int bthd = 0; bthd < 2; bthd++) {
                cm_tape *tp = tps[bthd] = cmt_tape();
                cm_tensor *in[4] = {make_qkv(tp, c, c->T, 10), make_qkv(tp, c, c->S, 20), make_qkv(tp, c, c->S, 30),
                                    make_bias(tp, c)};
                att_ctx x = {c, make_mask(tp, c), bthd == 1, dropout ? 0.3f : 0.0f};
                out[bthd] = call_attention(tp, in, &x);
                cr_assert(out[bthd], "%s: %s", c->name, cm_tape_error(tp));
                const int64_t bthd_shape[4] = {c->B, c->T, c->H, c->D};
                cm_tensor *g = cmt_randn(tp, 4, bthd_shape, 77, false); /* the same numbers in both runs */
                if (!bthd) g = cm_contiguous(tp, cm_permute(tp, g, perm));
                cr_assert_eq(cm_tape_backward_with(tp, out[bthd], g), CM_OK, "%s: %s", c->name, cm_tape_error(tp));
                for (int j = 0; j < 4; j++) grads[bthd][j] = in[j] ? cm_tensor_grad(in[j]) : NULL;
            }
            const int64_t *s0 = cm_tensor_shape(out[0]), *s1 = cm_tensor_shape(out[1]);
            cr_assert(s1[0] == c->B && s1[1] == c->T && s1[2] == c->H && s1[3] == c->D && s0[1] == c->H,
                      "%s: out_bthd shape", c->name);
            cr_assert(cm_tensor_is_contiguous(out[1]), "%s: the (B, T, H, D) output must be contiguous", c->name);
            cmt_assert_close(c->name, out[1], cm_permute(tps[0], out[0], perm), 0, 0);
            const char *names[4] = {"dq", "dk", "dv", "dbias"};
            for (int j = 0; j < 4; j++)
                if (grads[0][j]) cmt_assert_close(names[j], grads[1][j], grads[0][j], 0, 0);
            cm_tape_free(tps[0]);
            cm_tape_free(tps[1]);
        }
}

Test(attention, fully_masked_rows_give_zeros_and_zero_grad) {
    /* batch 0 has every key padded; with causal + key 0 padded, query 0 of every batch sees nothing */
    for (int kind = 2; kind <= 3; kind++) {
        const att_case c = {"masked", 2, 2, 4, 4, 5, kind == 3, 0, 0, kind, 0};
        cm_tape *tp = cmt_tape();
        cm_tensor *q = make_qkv(tp, &c, 4, 1), *k = make_qkv(tp, &c, 4, 2), *v = make_qkv(tp, &c, 4, 3);
        cm_attention_opts o = cm_attention_opts_default();
        o.causal = c.causal;
        o.key_padding_mask = make_mask(tp, &c);
        cm_tensor *out = cm_attention(tp, q, k, v, &o);
        cr_assert(out, "%s", cm_tape_error(tp));
        const int64_t s[4] = {2, 2, 4, 5};
        cm_tensor *g = cmt_randn(tp, 4, s, 9, false);
        cr_assert_eq(cm_tape_backward_with(tp, out, g), CM_OK, "%s", cm_tape_error(tp));
        const float *ov = cm_tensor_data(out), *gq = cm_tensor_data(cm_tensor_grad(q)),
                    *gk = cm_tensor_data(cm_tensor_grad(k)), *gv = cm_tensor_data(cm_tensor_grad(v));
        for (int64_t n = 0; n < 2 * 2 * 4 * 5; n++) {
            cr_assert(isfinite(ov[n]) && isfinite(gq[n]) && isfinite(gk[n]) && isfinite(gv[n]), "kind %d: NaN/inf at %lld",
                      kind, (long long)n);
            const int64_t b = n / 40, i = (n / 5) % 4;
            const bool empty_row = kind == 2 ? b == 0 : i == 0;
            if (empty_row) {
                cr_assert_eq(ov[n], 0.0f, "kind %d: out[%lld] = %g for a fully-masked row", kind, (long long)n, ov[n]);
                cr_assert_eq(gq[n], 0.0f, "kind %d: dq[%lld] = %g for a fully-masked row", kind, (long long)n, gq[n]);
            }
            /* padded keys receive no gradient: all of batch 0 (kind 2), key 0 (kind 3) */
            const bool padded_key = kind == 2 ? (b == 0 || i == 3) : i == 0;
            if (padded_key) {
                cr_assert_eq(gk[n], 0.0f, "kind %d: dk[%lld] = %g for a padded key", kind, (long long)n, gk[n]);
                cr_assert_eq(gv[n], 0.0f, "kind %d: dv[%lld] = %g for a padded key", kind, (long long)n, gv[n]);
            }
        }
        cm_tape_free(tp);
    }
}

Test(attention, permuted_inputs_are_read_in_place) {
    cm_tape *tp = cmt_tape();
    const int64_t s[4] = {2, 5, 3, 4};
    const int perm[4] = {0, 2, 1, 3};
    cm_tensor *x = cmt_randn(tp, 4, s, 1, true);
    cm_tensor *q = cm_permute(tp, x, perm), *k = cm_permute(tp, x, perm), *v = cm_permute(tp, x, perm);
    cr_assert(!cm_tensor_is_contiguous(q));
    cm_tensor *out = cm_attention(tp, q, k, v, NULL);
    cr_assert(out, "%s", cm_tape_error(tp));
    cm_node *n = tp->last;
    cr_assert_str_eq(n->op, "attention");
    cr_assert(n->in[0] == q && n->in[1] == k && n->in[2] == v, "permuted views were copied");
    /* a layout without a unit-stride dim goes through cm_contiguous */
    const int64_t s4[4] = {1, 2, 3, 4};
    cm_tensor *w = randn_stride2(tp, s4, 2);
    cr_assert(cm_attention(tp, w, w, w, NULL));
    cr_assert(tp->last->in[0] != w && cm_tensor_is_contiguous(tp->last->in[0]));
    cm_tape_free(tp);
}

Test(attention, shared_qkv_accumulates_all_three_gradients) {
    cm_tape *tp = cmt_tape();
    const int64_t s[4] = {1, 2, 4, 3};
    cm_tensor *x = cmt_randn(tp, 4, s, 3, true);
    const att_case c = {"shared", 1, 2, 4, 4, 3, true, 0, 0, 0, 0};
    att_ctx ctx = {&c, NULL, false, 0.0f};
    cm_tensor *in[4] = {x, x, x, NULL};
    cmt_gradcheck_opts go = cmt_gradcheck_defaults();
    go.max_checks = 0;
    cmt_gradcheck("shared", call_attention, &ctx, 4, in, &go);
    cm_tape_free(tp);
}

Test(attention, no_grad_path_matches_grad_path) {
    const att_case *c = &k_cases[sizeof k_cases / sizeof k_cases[0] - 1]; /* the parallel-size case */
    cm_tape *tp = cmt_tape();
    cm_tensor *in[4] = {make_qkv(tp, c, c->T, 1), make_qkv(tp, c, c->S, 2), make_qkv(tp, c, c->S, 3), make_bias(tp, c)};
    att_ctx x = {c, make_mask(tp, c), false, 0.0f};
    cm_tensor *a = call_attention(tp, in, &x);
    cm_tape_set_grad_enabled(tp, false);
    cm_tensor *b = call_attention(tp, in, &x);
    cr_assert(a && b, "%s", cm_tape_error(tp));
    cmt_assert_close("no-grad vs grad", b, a, 0, 0);
    cm_tape_free(tp);
}

/* ---- errors ---- */

static void expect_error(cm_tensor *q, cm_tensor *k, cm_tensor *v, const cm_attention_opts *o, cm_status want,
                         const char *s1, const char *s2) {
    cm_tape *tp = cmt_tape();
    cmt_expect_error(tp, cm_attention(tp, q, k, v, o), want, "attention", s1, s2, NULL);
    cm_tape_free(tp);
}

Test(attention, bad_inputs_name_the_shapes) {
    cm_tape *tp = cmt_tape();
    const int64_t sq[4] = {2, 3, 4, 8}, sk[4] = {2, 3, 5, 8}, sd[4] = {2, 3, 5, 7}, sh[4] = {2, 2, 5, 8},
                  sv6[4] = {2, 3, 6, 8}, s3[3] = {3, 4, 8};
    cm_tensor *q = cmt_randn(tp, 4, sq, 1, false), *k = cmt_randn(tp, 4, sk, 2, false), *v = cmt_randn(tp, 4, sk, 3, false);
    expect_error(q, cmt_randn(tp, 4, sd, 4, false), v, NULL, CM_ERR_SHAPE, "(2, 3, 4, 8)", "(2, 3, 5, 7)");
    expect_error(q, cmt_randn(tp, 4, sh, 5, false), v, NULL, CM_ERR_SHAPE, "(2, 2, 5, 8)", NULL);
    expect_error(q, k, cmt_randn(tp, 4, sv6, 6, false), NULL, CM_ERR_SHAPE, "(2, 3, 5, 8)", "(2, 3, 6, 8)");
    expect_error(cmt_randn(tp, 3, s3, 7, false), k, v, NULL, CM_ERR_SHAPE, "(3, 4, 8)", "4-d");
    expect_error(cm_zeros(tp, CM_DTYPE_I64, 4, sq), k, v, NULL, CM_ERR_DTYPE, "i64", NULL);
    expect_error(q, k, cm_zeros(tp, CM_DTYPE_BF16, 4, sk), NULL, CM_ERR_DTYPE, "bf16", NULL);

    cm_attention_opts o = cm_attention_opts_default();
    const int64_t bad_bias[4] = {1, 3, 5, 4}, bad_bias2[3] = {2, 1, 5};
    o.bias = cmt_randn(tp, 4, bad_bias, 8, false);
    expect_error(q, k, v, &o, CM_ERR_SHAPE, "(1, 3, 5, 4)", "(2, 3, 4, 5)");
    o.bias = cmt_randn(tp, 3, bad_bias2, 8, false);
    expect_error(q, k, v, &o, CM_ERR_SHAPE, "(2, 1, 5)", "(2, 3, 4, 5)");
    const int64_t ok_bias[2] = {4, 5};
    o.bias = cm_zeros(tp, CM_DTYPE_I32, 2, ok_bias);
    expect_error(q, k, v, &o, CM_ERR_DTYPE, "bias", "i32");

    o = cm_attention_opts_default();
    const int64_t bad_mask[2] = {2, 4}, ok_mask[2] = {2, 5};
    o.key_padding_mask = cm_zeros(tp, CM_DTYPE_U8, 2, bad_mask);
    expect_error(q, k, v, &o, CM_ERR_SHAPE, "(2, 4)", "(2, 5)");
    o.key_padding_mask = cm_zeros(tp, CM_DTYPE_F32, 2, ok_mask);
    expect_error(q, k, v, &o, CM_ERR_DTYPE, "key_padding_mask", "f32");

    /* chaining: a NULL input is an error, a failed tape keeps the first error */
    cr_assert_null(cm_attention(tp, NULL, k, v, NULL));
    cr_assert_null(cm_attention(tp, q, k, v, NULL));
    cr_assert_eq(cm_tape_status(tp), CM_ERR_INVALID_ARG);
    cm_tape_free(tp);
}

Test(attention, defaults) {
    cm_attention_opts o = cm_attention_opts_default();
    cr_assert(!o.causal && o.scale == 0.0f && !o.bias && !o.key_padding_mask);
}

/* Fused dropout on the probabilities gives the explicit form's result and gradients — matmul,
 * scale, causal mask, softmax, cm_dropout, matmul — with the same generator state, so the same
 * mask; T = 70 crosses a row block (64), and the gradcheck runs the fused form itself. */
typedef struct {
    bool fused;
    uint64_t seed;
} drop_ctx;

static cm_tensor *attention_with_dropout(cm_tape *tp, cm_tensor *const *in, void *vctx) {
    const drop_ctx *c = vctx;
    cm_rng rng = cm_rng_init(c->seed, 3);
    const float p = 0.3f;
    if (c->fused) {
        cm_attention_opts o = cm_attention_opts_default();
        o.causal = true, o.dropout_p = p, o.rng = &rng;
        return cm_attention(tp, in[0], in[1], in[2], &o);
    }
    const int64_t T = cm_tensor_dim(in[0], 2), D = cm_tensor_dim(in[0], 3);
    cm_tensor *sc = cm_mul_scalar(tp, cm_matmul(tp, in[0], cm_transpose(tp, in[1], -2, -1)), 1.0f / sqrtf((float)D));
    int64_t ms[2] = {T, T};
    cm_tensor *mask = cm_full(tp, CM_DTYPE_F32, 2, ms, 0.0);
    float *mv = cm_tensor_data(mask);
    for (int64_t i = 0; i < T; i++)
        for (int64_t j = i + 1; j < T; j++) mv[i * T + j] = -INFINITY;
    cm_tensor *pr = cm_dropout(tp, cm_softmax(tp, cm_add(tp, sc, mask), -1), p, true, &rng);
    return cm_matmul(tp, pr, in[2]);
}

Test(attention, fused_dropout_matches_explicit_dropout) {
    const int64_t s[4] = {2, 2, 70, 8};
    cm_tensor *g[2][3], *out[2];
    cm_tape *tps[2];
    for (int f = 0; f < 2; f++) {
        cm_tape *tp = tps[f] = cmt_tape();
        cm_tensor *in[3] = {cmt_randn(tp, 4, s, 1, true), cmt_randn(tp, 4, s, 2, true), cmt_randn(tp, 4, s, 3, true)};
        drop_ctx c = {f == 1, 99};
        out[f] = attention_with_dropout(tp, in, &c);
        cr_assert(out[f], "%s", cm_tape_error(tp));
        cm_tensor *w = cmt_randn(tp, 4, s, 4, false);
        cr_assert_eq(cm_tape_backward(tp, cm_sum(tp, cm_mul(tp, out[f], w), NULL, 0, false)), CM_OK, "%s",
                     cm_tape_error(tp));
        for (int j = 0; j < 3; j++) g[f][j] = cm_tensor_grad(in[j]);
    }
    int64_t zeros = 0;
    const float *o = cm_tensor_data(out[1]);
    for (int64_t i = 0; i < cm_tensor_numel(out[1]); i++) zeros += o[i] == 0.0f;
    cr_assert(zeros < cm_tensor_numel(out[1]) / 10, "dropout on P must not zero whole outputs (%lld zeros)",
              (long long)zeros);
    cmt_assert_close("fused vs explicit output", out[1], out[0], 1e-5, 1e-4);
    const char *names[3] = {"dq", "dk", "dv"};
    for (int j = 0; j < 3; j++) cmt_assert_close(names[j], g[1][j], g[0][j], 1e-5, 1e-4);
    cm_tape_free(tps[0]);
    cm_tape_free(tps[1]);

    cm_tape *tp = cmt_tape();
    const int64_t s2[4] = {1, 2, 67, 4};
    cm_tensor *in[3] = {cmt_randn(tp, 4, s2, 5, true), cmt_randn(tp, 4, s2, 6, true), cmt_randn(tp, 4, s2, 7, true)};
    drop_ctx c = {true, 7};
    cmt_gradcheck("fused attention dropout", attention_with_dropout, &c, 3, in, NULL);
    cm_attention_opts bad = cm_attention_opts_default();
    bad.dropout_p = 0.5f;
    cmt_expect_error(tp, cm_attention(tp, in[0], in[1], in[2], &bad), CM_ERR_INVALID_ARG, "rng is NULL", NULL);
    cm_tape_free(tp);
}

/* The fused mask is cm_dropout's, element for element, and the generator ends where cm_dropout
 * leaves it: with q = k = 0 every probability is 1/S, and with v (S, S) the identity, out = Pd shows
 * the mask itself (0 where dropped, keep_scale/S elsewhere). S = 13 puts rows at odd bit offsets;
 * the second pass runs under a tape row context (masks keyed by global row). */
Test(attention, dropout_mask_is_cm_dropouts_mask) {
    const int64_t B = 3, H = 2, T = 70, S = 13;
    const float p = 0.4f;
    for (int rows = 0; rows < 2; rows++) {
        cm_tape *tp = cmt_tape();
        if (rows) cm_tape_set_rows(tp, 5, B, 11);
        const int64_t sq[4] = {B, H, T, S}, sk[4] = {B, H, S, S};
        cm_tensor *q = cm_zeros(tp, CM_DTYPE_F32, 4, sq), *k = cm_zeros(tp, CM_DTYPE_F32, 4, sk),
                  *v = cm_zeros(tp, CM_DTYPE_F32, 4, sk);
        cr_assert(q && k && v);
        float *vv = cm_tensor_data(v);
        for (int64_t bh = 0; bh < B * H; bh++)
            for (int64_t j = 0; j < S; j++) vv[(bh * S + j) * S + j] = 1.0f;
        cm_tensor_set_requires_grad(q, true); /* the recorded path, the one that keeps the bits */
        cm_rng r1 = cm_rng_init(123, 4), r2 = r1;
        cm_attention_opts o = cm_attention_opts_default();
        o.dropout_p = p, o.rng = &r1;
        cm_tensor *out = cm_attention(tp, q, k, v, &o);
        cm_tensor *ref = cm_dropout(tp, cm_full(tp, CM_DTYPE_F32, 4, sq, 1.0), p, true, &r2);
        cr_assert(out && ref, "%s", cm_tape_error(tp));
        cr_assert_eq(r1.counter, r2.counter, "rows %d: rng counter %llu after attention, %llu after cm_dropout", rows,
                     (unsigned long long)r1.counter, (unsigned long long)r2.counter);
        const float *a = cm_tensor_data(out), *d = cm_tensor_data(ref);
        int64_t dropped = 0;
        for (int64_t e = 0; e < B * H * T * S; e++) {
            cr_assert_eq(a[e] == 0.0f, d[e] == 0.0f, "rows %d: element %lld dropped by %s only", rows, (long long)e,
                         a[e] == 0.0f ? "attention" : "cm_dropout");
            dropped += d[e] == 0.0f;
        }
        cr_assert(dropped > B * H * T * S / 4 && dropped < B * H * T * S / 2, "rows %d: %lld dropped of %lld", rows,
                  (long long)dropped, (long long)(B * H * T * S));
        cm_tape_free(tp);
    }
}

/* What a forward with grad leaves in the tape's arena does not grow with B·H·T·S beyond the
 * dropout mask's bit per probability: no P (B, H, T, S) floats, no byte mask. */
Test(attention, forward_keeps_no_probabilities) {
    const int64_t B = 2, H = 4, T = 256, S = 256, D = 16;
    cm_tape *tp = cmt_tape();
    cm_arena *a = cm_tape_arena(tp);
    /* The arena's first chunk is 32 MiB, so no allocation below skips the rest of a chunk (which
     * used() would count): used() counts only what was asked for. */
    cr_assert_eq(cm_arena_used(a), 0);
    cr_assert(cm_arena_alloc(a, (size_t)32 << 20));
    cm_tape_reset(tp);
    const int64_t s[4] = {B, T, H, D}, sm[2] = {B, S};
    const int perm[4] = {0, 2, 1, 3};
    cm_tensor *x[3];
    for (int j = 0; j < 3; j++) x[j] = cm_permute(tp, cmt_randn(tp, 4, s, 1 + (uint64_t)j, true), perm);
    cm_tensor *mask = cm_full(tp, CM_DTYPE_U8, 2, sm, 1.0);
    for (int out_bthd = 0; out_bthd < 2; out_bthd++) {
        cm_rng rng = cm_rng_init(1, 0);
        cm_attention_opts o = cm_attention_opts_default();
        o.causal = true, o.dropout_p = 0.1f, o.rng = &rng, o.key_padding_mask = mask, o.out_bthd = out_bthd;
        const size_t before = cm_arena_used(a);
        cm_tensor *out = cm_attention(tp, x[0], x[1], x[2], &o);
        cr_assert(out, "%s", cm_tape_error(tp));
        const size_t held = cm_arena_used(a) - before, out_bytes = sizeof(float) * (size_t)(B * H * T * D),
                     bits = (size_t)(B * H * T * S) / 8, probs = sizeof(float) * (size_t)(B * H * T * S),
                     bound = out_bytes + bits + 16384;
        cr_assert(held <= bound,
                  "out_bthd %d: the forward holds %zu bytes; want <= out %zu + mask bits %zu + 16 KiB = %zu (P alone "
                  "would be %zu)",
                  out_bthd, held, out_bytes, bits, bound, probs);
        cr_assert_eq(cm_tape_backward(tp, cm_sum(tp, out, NULL, 0, false)), CM_OK, "%s", cm_tape_error(tp));
    }
    /* without a gradient only the output stays (the mask draw and the blocks of P are scratch) */
    cm_tape_set_grad_enabled(tp, false);
    cm_rng rng = cm_rng_init(1, 0);
    cm_attention_opts o = cm_attention_opts_default();
    o.causal = true, o.dropout_p = 0.1f, o.rng = &rng, o.key_padding_mask = mask;
    const size_t before = cm_arena_used(a);
    cr_assert(cm_attention(tp, x[0], x[1], x[2], &o), "%s", cm_tape_error(tp));
    const size_t held = cm_arena_used(a) - before, out_bytes = sizeof(float) * (size_t)(B * H * T * D);
    cr_assert(held <= out_bytes + 1024, "no grad: the forward holds %zu bytes; want <= out %zu + 1 KiB", held,
              out_bytes);
    cm_tape_free(tp);
}
