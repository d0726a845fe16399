/*
 * The backend comparison suite (ggml's test-backend-ops, for our ops): every op the GPU path
 * implements runs on the CPU and on the GPU from the same inputs — broadcast shapes, strided views,
 * odd sizes, empty tensors — and the forward results and every input gradient must agree within a
 * per-op bound on the normalised error ‖gpu − cpu‖ / ‖cpu‖ (NaN never passes; copies and casts
 * must match bit for bit).
 *
 * Where no GPU is usable (no CUDA in the build, no driver, no device) the whole program exits with
 * 77 and CTest reports it as skipped, not passed. Built with -DCM_CUDA=EMU the "GPU" is the CUDA
 * emulator: the same kernels, run on the CPU. The device is probed in a child process, since
 * Criterion forks a process per test and CUDA does not survive a fork.
 */
#include "cmtest.h"

#include "tensor/backend.h"
#include "tensor/tensor_impl.h"

#include <math.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------
 * Harness
 * ------------------------------------------------------------------------------------------- */

typedef cm_tensor *(*op_fn)(cm_tape *tp, cm_tensor *const *in, const void *arg);

/* IN_NORMAL: uniform in [-2, 2); IN_BF16: the same rounded to bf16 (exact in bf16, so an op that
 * rounds its inputs to bf16 sees the values the CPU sees) */
typedef enum { IN_NORMAL, IN_POSITIVE, IN_INDEX, IN_BF16 } in_kind;

typedef struct {
    int ndim;
    int64_t shape[CM_MAX_DIMS];
    in_kind kind;
    bool grad;
    cm_dtype dtype; /* 0 (f32) unless set */
    int64_t hi;     /* IN_INDEX: values in [0, hi) */
} in_spec;

/* ndim, kind, grad, then the dims (dtype f32, no index range) */
#define SPEC(nd, kind, grad, ...) {nd, {__VA_ARGS__}, kind, grad, CM_DTYPE_F32, 0}

static uint64_t g_seed = 1234;

/* A long-lived CPU tensor from the spec, with fresh random values. */
static cm_tensor *make_input(const in_spec *s) {
    cm_tensor *t;
    const cm_dtype dt = s->kind == IN_INDEX ? CM_DTYPE_I64 : s->dtype;
    cr_assert_eq(cm_tensor_new(dt, s->ndim, s->shape, &t), CM_OK, "%s", cm_last_error());
    const int64_t n = cm_tensor_numel(t);
    cm_rng rng = cm_rng_init(g_seed++, 7);
    for (int64_t i = 0; i < n; i++) {
        float u;
        cm_rng_uniform(&rng, &u, 1, 0.0f, 1.0f);
        double v;
        if (s->kind == IN_INDEX) v = floor(u * (double)s->hi);
        else if (s->kind == IN_POSITIVE) v = 0.2 + 2.0 * u;
        else v = 4.0 * u - 2.0;
        if (s->kind == IN_BF16) { /* round to nearest even at 8 bits of mantissa */
            const float f = (float)v;
            uint32_t b;
            memcpy(&b, &f, 4);
            b = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
            float r;
            memcpy(&r, &b, 4);
            v = r;
        }
        int64_t idx[CM_MAX_DIMS], r = i;
        for (int d = s->ndim - 1; d >= 0; d--) {
            idx[d] = s->shape[d] ? r % s->shape[d] : 0;
            r = s->shape[d] ? r / s->shape[d] : 0;
        }
        cm_tensor_set(t, idx, v);
    }
    if (s->grad) cr_assert_eq(cm_tensor_set_requires_grad(t, true), CM_OK);
    return t;
}

/* ‖a − b‖ / max(‖b‖, 1e-3·√n) over all elements (a and b CPU tensors of one shape); NaN if either
 * has a NaN the other does not, or if they differ in shape. */
static double nerr(const cm_tensor *a, const cm_tensor *b) {
    if (cm_tensor_ndim(a) != cm_tensor_ndim(b)) return NAN;
    for (int d = 0; d < cm_tensor_ndim(a); d++)
        if (cm_tensor_dim(a, d) != cm_tensor_dim(b, d)) return NAN;
    const int64_t n = cm_tensor_numel(a);
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double x = cm_tensor_get_flat(a, i), y = cm_tensor_get_flat(b, i);
        if (isnan(x) || isnan(y)) {
            if (isnan(x) && isnan(y)) continue;
            return NAN;
        }
        if (isinf(x) || isinf(y)) {
            if (x == y) continue;
            return INFINITY;
        }
        num += (x - y) * (x - y);
        den += y * y;
    }
    /* the reference's norm, but not below 1e-3 per element: a gradient that is zero up to rounding
     * (e.g. softmax over a single kept key) is compared in absolute terms */
    const double floor_ = 1e-3 * sqrt((double)(n ? n : 1));
    return sqrt(num) / (sqrt(den) > floor_ ? sqrt(den) : floor_);
}

static cm_tensor *to_cpu(const cm_tensor *t) {
    cm_tensor *c;
    cr_assert_eq(cm_tensor_to_device(t, CM_DEVICE_CPU, &c), CM_OK, "copy back: %s", cm_last_error());
    return c;
}

static cm_tape *poisoned_tape(cm_device dev) {
    cm_tape_config cfg = cm_tape_config_default();
    cfg.poison = true;
    cm_tape *tp;
    cr_assert_eq(cm_tape_new(&cfg, &tp), CM_OK);
    cr_assert_eq(cm_tape_set_device(tp, dev), CM_OK, "%s", cm_last_error());
    return tp;
}

/* Runs f on CPU and GPU copies of the inputs; compares outputs (tol_fwd) and input gradients
 * (tol_bwd) after backward with one random upstream gradient. */
static void check_op(const char *name, op_fn f, const void *arg, int n_in, const in_spec *specs, double tol_fwd,
                     double tol_bwd) {
    cm_tensor *cin[8], *gin[8];
    for (int i = 0; i < n_in; i++) {
        cin[i] = make_input(&specs[i]);
        cr_assert_eq(cm_tensor_to_device(cin[i], CM_DEVICE_CUDA, &gin[i]), CM_OK, "%s: %s", name, cm_last_error());
        cr_assert_eq(cm_tensor_device(gin[i]), CM_DEVICE_CUDA);
        if (specs[i].grad) cr_assert_eq(cm_tensor_set_requires_grad(gin[i], true), CM_OK);
    }
    cm_tape *tc = poisoned_tape(CM_DEVICE_CPU), *tg = poisoned_tape(CM_DEVICE_CUDA);
    cm_tensor *oc = f(tc, cin, arg), *og = f(tg, gin, arg);
    cr_assert(oc, "%s: cpu: %s", name, cm_tape_error(tc));
    cr_assert(og, "%s: gpu: %s", name, cm_tape_error(tg));
    cr_assert_eq(cm_tensor_device(og), CM_DEVICE_CUDA, "%s: the result is on %s", name,
                 cm_device_name(cm_tensor_device(og)));
    cr_assert_eq(cm_tensor_dtype(og), cm_tensor_dtype(oc), "%s: dtype %s vs %s", name,
                 cm_dtype_name(cm_tensor_dtype(og)), cm_dtype_name(cm_tensor_dtype(oc)));
    cm_tensor *ogc = to_cpu(og);
    const double ef = nerr(ogc, oc);
    cr_assert(ef <= tol_fwd, "%s: forward error %.3g > %.3g (shape %s)", name, ef, tol_fwd,
              cmi_shape_of(cm_tensor_ndim(oc), cm_tensor_shape(oc)));
    if (cm_tensor_requires_grad(oc)) {
        cr_assert(cm_tensor_requires_grad(og), "%s: the GPU result does not require grad", name);
        in_spec gs = {0};
        gs.ndim = cm_tensor_ndim(oc);
        memcpy(gs.shape, cm_tensor_shape(oc), sizeof(int64_t) * (size_t)gs.ndim);
        cm_tensor *gc = make_input(&gs), *gg;
        cr_assert_eq(cm_tensor_to_device(gc, CM_DEVICE_CUDA, &gg), CM_OK, "%s", cm_last_error());
        cr_assert_eq(cm_tape_backward_with(tc, oc, gc), CM_OK, "%s: cpu backward: %s", name, cm_tape_error(tc));
        cr_assert_eq(cm_tape_backward_with(tg, og, gg), CM_OK, "%s: gpu backward: %s", name, cm_tape_error(tg));
        for (int i = 0; i < n_in; i++) {
            if (!specs[i].grad) continue;
            cm_tensor *a = cm_tensor_grad(cin[i]), *b = cm_tensor_grad(gin[i]);
            cr_assert(a && b, "%s: input %d: gradient on cpu %s, on gpu %s", name, i, a ? "yes" : "no", b ? "yes" : "no");
            cr_assert_eq(cm_tensor_device(b), CM_DEVICE_CUDA);
            cm_tensor *bc = to_cpu(b);
            const double eb = nerr(bc, a);
            cr_assert(eb <= tol_bwd, "%s: gradient of input %d: error %.3g > %.3g (shape %s)", name, i, eb, tol_bwd,
                      cmi_shape_of(cm_tensor_ndim(a), cm_tensor_shape(a)));
            cm_tensor_free(bc);
        }
        cm_tensor_free(gc);
        cm_tensor_free(gg);
    }
    cm_tensor_free(ogc);
    cm_tape_free(tc);
    cm_tape_free(tg);
    for (int i = 0; i < n_in; i++) {
        cm_tensor_free(cin[i]);
        cm_tensor_free(gin[i]);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Op wrappers
 * ------------------------------------------------------------------------------------------- */

typedef struct {
    int op; /* 0 add, 1 sub, 2 mul, 3 div */
    int view; /* 0 none; 1: a transposed (last two dims); 2: b narrowed on its last dim from 1 */
} bin_arg;

static cm_tensor *f_binary(cm_tape *tp, cm_tensor *const *in, const void *varg) {
    const bin_arg *arg = varg;
    cm_tensor *a = in[0], *b = in[1];
    if (arg->view == 1) a = cm_transpose(tp, a, -1, -2);
    if (arg->view == 2) b = cm_narrow(tp, b, -1, 1, cm_tensor_dim(b, -1) - 1);
    switch (arg->op) {
    case 0: return cm_add(tp, a, b);
    case 1: return cm_sub(tp, a, b);
    case 2: return cm_mul(tp, a, b);
    default: return cm_div(tp, a, b);
    }
}

typedef struct {
    int op;
    float p0, p1;
    bool transpose;
} un_arg;

static cm_tensor *f_unary(cm_tape *tp, cm_tensor *const *in, const void *varg) {
    const un_arg *u = varg;
    cm_tensor *a = u->transpose ? cm_transpose(tp, in[0], 0, 1) : in[0];
    switch (u->op) {
    case 0: return cm_neg(tp, a);
    case 1: return cm_exp(tp, a);
    case 2: return cm_log(tp, a);
    case 3: return cm_sqrt(tp, a);
    case 4: return cm_abs(tp, a);
    case 5: return cm_relu(tp, a);
    case 6: return cm_gelu(tp, a, true);
    case 7: return cm_gelu(tp, a, false);
    case 8: return cm_silu(tp, a);
    case 9: return cm_tanh(tp, a);
    case 10: return cm_sigmoid(tp, a);
    case 11: return cm_add_scalar(tp, a, u->p0);
    case 12: return cm_mul_scalar(tp, a, u->p0);
    case 13: return cm_pow(tp, a, u->p0);
    default: return cm_clamp(tp, a, u->p0, u->p1);
    }
}

typedef struct {
    int op; /* 0 sum, 1 mean, 2 max, 3 min, 4 var */
    int n_axes;
    int axes[4];
    bool keepdim;
    bool transpose;
} red_arg;

static cm_tensor *f_reduce(cm_tape *tp, cm_tensor *const *in, const void *varg) {
    const red_arg *r = varg;
    cm_tensor *a = r->transpose ? cm_transpose(tp, in[0], 0, -1) : in[0];
    switch (r->op) {
    case 0: return cm_sum(tp, a, r->axes, r->n_axes, r->keepdim);
    case 1: return cm_mean(tp, a, r->axes, r->n_axes, r->keepdim);
    case 2: return cm_max(tp, a, r->axes, r->n_axes, r->keepdim);
    case 3: return cm_min(tp, a, r->axes, r->n_axes, r->keepdim);
    default: return cm_var(tp, a, r->axes, r->n_axes, 1, r->keepdim);
    }
}

typedef struct {
    int axis;
    bool log;
} sm_arg;

static cm_tensor *f_softmax(cm_tape *tp, cm_tensor *const *in, const void *varg) {
    const sm_arg *s = varg;
    return s->log ? cm_log_softmax(tp, in[0], s->axis) : cm_softmax(tp, in[0], s->axis);
}

/* A chain of views and layout ops, ending in a multiply so the gradient is not trivially 1. */
static cm_tensor *f_views(cm_tape *tp, cm_tensor *const *in, const void *varg) {
    const int which = *(const int *)varg;
    cm_tensor *x = in[0]; /* (4, 6, 10) */
    switch (which) {
    case 0: { /* narrow -> reshape -> permute -> contiguous */
        int64_t sh[4] = {4, 6, 2, 4};
        int perm[4] = {0, 2, 1, 3};
        x = cm_narrow(tp, x, 2, 1, 8);
        x = cm_reshape(tp, x, 4, sh);
        x = cm_permute(tp, x, perm);
        x = cm_contiguous(tp, x);
        break;
    }
    case 1: { /* slice with a step, unsqueeze, expand */
        int64_t sh[4] = {3, 4, 6, 4};
        x = cm_slice(tp, x, 2, 1, 9, 2);
        x = cm_unsqueeze(tp, x, 0);
        x = cm_expand(tp, x, 4, sh);
        break;
    }
    case 2: { /* transpose then reshape (a copy) then squeeze */
        int64_t sh[4] = {1, 10, 24, 1};
        x = cm_transpose(tp, x, 0, 2);
        x = cm_reshape(tp, x, 4, sh);
        x = cm_squeeze(tp, x, 3);
        x = cm_squeeze(tp, x, 0);
        break;
    }
    default: { /* cast round trip through bf16 and f16 */
        x = cm_cast(tp, x, CM_DTYPE_BF16);
        x = cm_cast(tp, x, CM_DTYPE_F32);
        x = cm_cast(tp, cm_cast(tp, x, CM_DTYPE_F16), CM_DTYPE_F32);
        break;
    }
    }
    return cm_mul(tp, x, x);
}

typedef struct {
    int ta, tb; /* 1: the operand is given transposed (a view) */
    bool bf16;  /* under bf16 autocast */
} mm_arg;

static cm_tensor *f_matmul(cm_tape *tp, cm_tensor *const *in, const void *varg) {
    const mm_arg *m = varg;
    cm_tensor *a = m->ta ? cm_transpose(tp, in[0], -1, -2) : in[0];
    cm_tensor *b = m->tb ? cm_transpose(tp, in[1], -1, -2) : in[1];
    if (m->bf16) cm_tape_set_autocast(tp, CM_DTYPE_BF16);
    cm_tensor *y = cm_matmul(tp, a, b);
    cm_tape_set_autocast(tp, CM_DTYPE_F32);
    return y;
}

typedef struct {
    bool bias, wt, bf16, rows3; /* wt: the weight is the transpose of a (in, out) tensor (GPT-2's Conv1D) */
} lin_arg;

static cm_tensor *f_linear(cm_tape *tp, cm_tensor *const *in, const void *varg) {
    const lin_arg *l = varg;
    cm_tensor *w = l->wt ? cm_transpose(tp, in[1], 0, 1) : in[1];
    if (l->bf16) cm_tape_set_autocast(tp, CM_DTYPE_BF16);
    cm_tensor *y = cm_linear(tp, in[0], w, l->bias ? in[2] : NULL);
    cm_tape_set_autocast(tp, CM_DTYPE_F32);
    return y;
}

typedef struct {
    int red;       /* CM_REDUCTION_* */
    float ls;      /* label smoothing */
    bool soft;     /* probability targets (softmax of in[1]) */
    bool ignore;   /* set a few targets to ignore_index */
    bool twice;    /* the loss of x added twice: the second backward adds to x's gradient */
} ce_arg;

/* A copy of a 1-D index target with positions 0 and 3 set to -100 (ignore_index); other ranks as
 * they are. A copy, so the test's input stays. */
static cm_tensor *ignore_0_and_3(cm_tape *tp, cm_tensor *t) {
    t = cm_clone_detached(tp, t);
    int64_t i0[1] = {0}, i3[1] = {3};
    if (t && cm_tensor_ndim(t) == 1) {
        cm_tensor_set(t, i0, -100);
        cm_tensor_set(t, i3, -100);
    }
    return t;
}

static cm_tensor *f_ce(cm_tape *tp, cm_tensor *const *in, const void *varg) {
    const ce_arg *c = varg;
    cm_cross_entropy_opts o = cm_cross_entropy_opts_default();
    o.reduction = (cm_reduction)c->red;
    o.label_smoothing = c->ls;
    cm_tensor *t = in[1];
    if (c->soft) t = cm_softmax(tp, t, 1);
    if (c->ignore) t = ignore_0_and_3(tp, t);
    cm_tensor *l = cm_cross_entropy(tp, in[0], t, &o);
    return c->twice ? cm_add(tp, l, cm_cross_entropy(tp, in[0], t, &o)) : l;
}

typedef struct {
    int red;       /* CM_REDUCTION_MEAN or _SUM */
    float ls;      /* label smoothing */
    bool ignore;   /* targets 0 and 3 ignored */
    bool bf16;     /* under autocast */
    int64_t chunk; /* rows per chunk (0 = automatic) */
} lce_arg;

static cm_tensor *f_lce(cm_tape *tp, cm_tensor *const *in, const void *varg) {
    const lce_arg *c = varg;
    cm_cross_entropy_opts o = cm_cross_entropy_opts_default();
    o.reduction = (cm_reduction)c->red;
    o.label_smoothing = c->ls;
    cm_tensor *t = c->ignore ? ignore_0_and_3(tp, in[2]) : in[2];
    if (c->bf16) cm_tape_set_autocast(tp, CM_DTYPE_BF16);
    cm_tensor *y = cm_linear_cross_entropy(tp, in[0], in[1], t, &o, c->chunk);
    cm_tape_set_autocast(tp, CM_DTYPE_F32);
    return y;
}

static cm_tensor *f_layer_norm(cm_tape *tp, cm_tensor *const *in, const void *varg) {
    const int affine = *(const int *)varg;
    return cm_layer_norm(tp, in[0], affine ? in[1] : NULL, affine ? in[2] : NULL, 1e-5f);
}

static cm_tensor *f_bias_gelu(cm_tape *tp, cm_tensor *const *in, const void *varg) {
    return cm_bias_gelu(tp, in[0], in[1], *(const bool *)varg);
}

static cm_tensor *f_embedding(cm_tape *tp, cm_tensor *const *in, const void *varg) {
    const int which = *(const int *)varg;
    if (which == 0) return cm_embedding(tp, in[0], in[1]);
    return cm_index_select(tp, in[0], 1, in[1]);
}

typedef struct {
    int64_t oh, ow;
    bool align, cl, transposed; /* transposed: x given with H and W swapped (a strided view) */
} resize_arg;

static cm_tensor *f_resize(cm_tape *tp, cm_tensor *const *in, const void *varg) {
    const resize_arg *r = varg;
    cm_tensor *x = r->transposed ? cm_transpose(tp, in[0], r->cl ? 1 : 2, r->cl ? 2 : 3) : in[0];
    return cm_resize_bilinear(tp, x, r->oh, r->ow, r->align, r->cl);
}

/* split of in[0] along *arg into pieces of 2, 0, rest - 3 and 1 (the gradient flows back through
 * narrow views), put back together in another order, one of them through a transposed input */
static cm_tensor *f_split(cm_tape *tp, cm_tensor *const *in, const void *varg) {
    const int axis = *(const int *)varg;
    cm_tensor *x = axis == 2 ? cm_transpose(tp, in[0], 1, 2) : in[0];
    const int64_t n = cm_tensor_dim(x, axis), sizes[4] = {2, 0, n - 3, 1};
    cm_tensor *p[4];
    if (cm_split(tp, x, axis, sizes, 4, p) != CM_OK) return NULL;
    cm_tensor *y = cm_concat(tp, (cm_tensor *const[]){p[3], p[1], p[0], p[2]}, 4, axis);
    return cm_mul(tp, y, y);
}

typedef struct {
    int64_t groups;
    bool affine, transposed; /* transposed: x given with its last two dims swapped (a strided view) */
} gn_arg;

/* in: x, weight, bias */
static cm_tensor *f_group_norm(cm_tape *tp, cm_tensor *const *in, const void *varg) {
    const gn_arg *g = varg;
    cm_tensor *x = g->transposed ? cm_transpose(tp, in[0], -1, -2) : in[0];
    return cm_group_norm(tp, x, g->groups, g->affine ? in[1] : NULL, g->affine ? in[2] : NULL, 1e-5f);
}

typedef struct {
    cm_reduction r;
    bool transposed; /* pred given as its (0, 1) transpose: a strided view */
} mse_arg;

static cm_tensor *f_mse(cm_tape *tp, cm_tensor *const *in, const void *varg) {
    const mse_arg *m = varg;
    cm_tensor *p = m->transposed ? cm_transpose(tp, in[0], 0, 1) : in[0];
    return cm_mse_loss(tp, p, in[1], m->r);
}

typedef struct {
    int axis;
    bool transposed; /* a given as its (0, 1) transpose: read through a strided view */
} gather_arg;

static cm_tensor *f_gather(cm_tape *tp, cm_tensor *const *in, const void *varg) {
    const gather_arg *g = varg;
    cm_tensor *a = g->transposed ? cm_transpose(tp, in[0], 0, 1) : in[0];
    return cm_gather(tp, a, g->axis, in[1]);
}

typedef struct {
    bool causal, bias, bias_grad, mask, bthd, dropout, permuted;
    int T, S, D;
} attn_arg;

/* in[0..2] = q, k, v as (B, T, H, D) when permuted (the GPT layout, read through a permute) else
 * (B, H, T, D); in[3] = bias (1, H, T, S); in[4] = a mask source (B, S) */
static cm_tensor *f_attention(cm_tape *tp, cm_tensor *const *in, const void *varg) {
    const attn_arg *a = varg;
    cm_tensor *q = in[0], *k = in[1], *v = in[2];
    if (a->permuted) {
        int perm[4] = {0, 2, 1, 3};
        q = cm_permute(tp, q, perm), k = cm_permute(tp, k, perm), v = cm_permute(tp, v, perm);
    }
    cm_attention_opts o = cm_attention_opts_default();
    o.causal = a->causal;
    o.out_bthd = a->bthd;
    if (a->bias) o.bias = in[3];
    cm_tensor *mask = NULL;
    if (a->mask) { /* keys whose source value is below -1 are padding (about a quarter) */
        const bool prev = cm_tape_set_grad_enabled(tp, false);
        cm_tensor *m = cm_clamp(tp, cm_add_scalar(tp, in[4], 2.0f), 0.0f, 2.0f);
        mask = cm_cast(tp, m, CM_DTYPE_U8);
        cm_tape_set_grad_enabled(tp, prev);
        o.key_padding_mask = mask;
    }
    cm_rng rng = cm_rng_init(5, 1);
    if (a->dropout) {
        o.dropout_p = 0.2f;
        o.rng = &rng;
    }
    return cm_attention(tp, q, k, v, &o);
}

typedef struct {
    int sh, sw, ph, pw, dh, dw, groups;
    bool cl, bias, bf16, out_bf16, x_bf16;
    bool mid; /* x made by an op first (its gradient is then written, not added to) */
} conv_arg;

static cm_tensor *f_conv(cm_tape *tp, cm_tensor *const *in, const void *varg) {
    const conv_arg *c = varg;
    cm_conv2d_opts o = cm_conv2d_opts_default();
    o.stride[0] = c->sh, o.stride[1] = c->sw, o.padding[0] = c->ph, o.padding[1] = c->pw;
    o.dilation[0] = c->dh, o.dilation[1] = c->dw, o.groups = c->groups, o.channels_last = c->cl;
    o.out_bf16 = c->out_bf16;
    if (c->bf16) cm_tape_set_autocast(tp, CM_DTYPE_BF16);
    cm_tensor *x = c->mid ? cm_mul_scalar(tp, in[0], 1.5f) : in[0];
    cm_tensor *y = cm_conv2d(tp, x, in[1], c->bias ? in[2] : NULL, &o);
    cm_tape_set_autocast(tp, CM_DTYPE_F32);
    return y;
}

typedef struct {
    bool training, cl, affine, fused, residual, bf16;
} bn_arg;

/* in: x, weight, bias, residual, running mean, running var */
static cm_tensor *f_bn(cm_tape *tp, cm_tensor *const *in, const void *varg) {
    const bn_arg *b = varg;
    cm_batch_norm_opts o = cm_batch_norm_opts_default();
    o.training = b->training, o.channels_last = b->cl, o.momentum = 0.3f;
    cm_tensor *w = b->affine ? in[1] : NULL, *bi = b->affine ? in[2] : NULL;
    cm_tensor *rm = b->training && !b->affine ? NULL : in[4], *rv = b->training && !b->affine ? NULL : in[5];
    if (!b->fused) return cm_batch_norm(tp, in[0], w, bi, rm, rv, &o);
    return cm_batch_norm_add_relu(tp, in[0], w, bi, rm, rv, b->residual ? in[3] : NULL, &o);
}

typedef struct {
    int kind; /* 0 max, 1 avg, 2 adaptive */
    int kh, kw, sh, sw, ph, pw;
    bool ceil_mode, include_pad, cl, transposed;
    int oh, ow;
} pool_arg;

static cm_tensor *f_pool(cm_tape *tp, cm_tensor *const *in, const void *varg) {
    const pool_arg *p = varg;
    cm_tensor *x = p->transposed ? cm_transpose(tp, in[0], 2, 3) : in[0];
    if (p->kind == 2) return cm_adaptive_avg_pool2d(tp, x, p->oh, p->ow, p->cl);
    cm_pool2d_opts o = cm_pool2d_opts_default(p->kh, p->kw);
    o.stride[0] = p->sh, o.stride[1] = p->sw, o.padding[0] = p->ph, o.padding[1] = p->pw;
    o.ceil_mode = p->ceil_mode, o.count_include_pad = p->include_pad, o.channels_last = p->cl;
    return p->kind == 0 ? cm_max_pool2d(tp, x, &o) : cm_avg_pool2d(tp, x, &o);
}

/* concat (axis in *arg, or stack when *arg >= 10: axis - 10) of in[0..2] with a transposed middle one */
static cm_tensor *f_join(cm_tape *tp, cm_tensor *const *in, const void *varg) {
    const int a = *(const int *)varg;
    cm_tensor *t[3] = {in[0], cm_contiguous(tp, cm_transpose(tp, cm_transpose(tp, in[1], 0, 2), 0, 2)), in[2]};
    cm_tensor *y = a >= 10 ? cm_stack(tp, t, 3, a - 10) : cm_concat(tp, t, 3, a);
    return cm_mul(tp, y, y);
}

/* ---------------------------------------------------------------------------------------------
 * Tests
 * ------------------------------------------------------------------------------------------- */

TestSuite(backend_ops, .timeout = 300);

Test(backend_ops, the_cuda_table_fills_every_slot) {
    const cmi_backend *be = cmi_backend_get(CM_DEVICE_CUDA);
    cr_assert(be);
    const void *const *slots = (const void *const *)((const char *)be + offsetof(cmi_backend, init));
    const size_t n = (sizeof(cmi_backend) - offsetof(cmi_backend, init)) / sizeof(void *);
    for (size_t i = 0; i < n; i++) cr_assert(slots[i], "backend slot %zu is NULL", i);
    cr_assert_str_neq(cm_device_describe(CM_DEVICE_CUDA), "");
}

Test(backend_ops, binary_ops_broadcast_and_read_views) {
    const struct {
        in_spec a, b;
        int view;
    } cases[] = {
        {SPEC(2, IN_NORMAL, true, 5, 7), SPEC(2, IN_NORMAL, true, 5, 7), 0},
        {SPEC(3, IN_NORMAL, true, 4, 5, 7), SPEC(1, IN_NORMAL, true, 7), 0},            /* row broadcast */
        {SPEC(3, IN_NORMAL, true, 4, 1, 7), SPEC(3, IN_NORMAL, true, 1, 5, 1), 0},      /* both stretch */
        {SPEC(2, IN_NORMAL, true, 7, 5), SPEC(2, IN_NORMAL, true, 5, 7), 1},            /* a transposed */
        {SPEC(2, IN_NORMAL, true, 5, 7), SPEC(2, IN_NORMAL, true, 5, 8), 2},            /* b narrowed */
        {SPEC(0, IN_NORMAL, true, 0), SPEC(2, IN_NORMAL, true, 3, 3), 0},               /* scalar */
        {SPEC(2, IN_NORMAL, true, 0, 7), SPEC(1, IN_NORMAL, true, 7), 0},               /* empty */
        {SPEC(4, IN_NORMAL, true, 2, 3, 33, 65), SPEC(2, IN_NORMAL, false, 33, 65), 0}, /* odd sizes */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int op = 0; op < 4; op++) {
            in_spec s[2] = {cases[c].a, cases[c].b};
            if (op == 3) s[1].kind = IN_POSITIVE; /* divide by values away from 0 */
            bin_arg arg = {op, cases[c].view};
            char name[64];
            snprintf(name, sizeof name, "binary op %d case %zu", op, c);
            check_op(name, f_binary, &arg, 2, s, 1e-6, 1e-6);
        }
}

Test(backend_ops, unary_ops_match_on_contiguous_and_transposed_inputs) {
    for (int op = 0; op <= 14; op++)
        for (int tr = 0; tr < 2; tr++) {
            un_arg u = {op, op == 13 ? 3.0f : op == 14 ? -0.5f : 0.75f, 0.8f, tr == 1};
            in_spec s = SPEC(2, (op == 2 || op == 3 || op == 13) ? IN_POSITIVE : IN_NORMAL, true, 37, 19);
            char name[64];
            snprintf(name, sizeof name, "unary op %d%s", op, tr ? " (transposed)" : "");
            check_op(name, f_unary, &u, 1, &s, 2e-6, 2e-6);
        }
}

Test(backend_ops, reductions_over_any_axes) {
    const red_arg args[] = {
        {0, 0, {0}, false, false},     {0, 1, {1}, false, false},   {0, 1, {-1}, true, false},
        {0, 2, {0, 2}, false, false},  {0, 1, {1}, false, true},    {1, 0, {0}, false, false},
        {1, 1, {2}, true, false},      {1, 2, {0, 1}, false, true}, {2, 1, {2}, false, false},
        {2, 1, {0}, true, true},       {2, 0, {0}, false, false},   {3, 1, {1}, false, false},
        {3, 2, {1, 2}, true, true},    {4, 1, {2}, false, false},   {4, 2, {0, 2}, true, false},
        {4, 0, {0}, false, true},
    };
    for (size_t i = 0; i < sizeof args / sizeof args[0]; i++) {
        in_spec s = SPEC(3, IN_NORMAL, true, 6, 9, 70);
        char name[64];
        snprintf(name, sizeof name, "reduction %zu (op %d)", i, args[i].op);
        check_op(name, f_reduce, &args[i], 1, &s, 1e-6, 1e-6);
    }
    /* a long group: the one-block-per-output path */
    red_arg full = {0, 0, {0}, false, false};
    in_spec big = SPEC(2, IN_NORMAL, true, 64, 130);
    check_op("full sum of 8320", f_reduce, &full, 1, &big, 1e-6, 1e-6);
    red_arg mx = {2, 1, {1}, false, false};
    in_spec wide = SPEC(2, IN_NORMAL, true, 3, 5000);
    check_op("max over 5000", f_reduce, &mx, 1, &wide, 0.0, 0.0);
}

Test(backend_ops, softmax_and_log_softmax_along_last_and_middle_axes) {
    for (int log = 0; log < 2; log++)
        for (int ax = 0; ax < 3; ax++) {
            sm_arg a = {ax == 2 ? -1 : ax, log == 1};
            in_spec s = SPEC(3, IN_NORMAL, true, 5, 33, 41);
            char name[64];
            snprintf(name, sizeof name, "%s axis %d", log ? "log_softmax" : "softmax", a.axis);
            check_op(name, f_softmax, &a, 1, &s, 1e-6, 1e-5);
        }
}

Test(backend_ops, matmul_batched_broadcast_and_transposed) {
    const struct {
        in_spec a, b;
        mm_arg m;
    } cases[] = {
        {SPEC(2, IN_NORMAL, true, 17, 23), SPEC(2, IN_NORMAL, true, 23, 9), {0, 0, false}},
        {SPEC(2, IN_NORMAL, true, 23, 17), SPEC(2, IN_NORMAL, true, 9, 23), {1, 1, false}},
        {SPEC(3, IN_NORMAL, true, 4, 17, 23), SPEC(2, IN_NORMAL, true, 23, 9), {0, 0, false}}, /* b broadcast */
        {SPEC(4, IN_NORMAL, true, 2, 3, 5, 7), SPEC(4, IN_NORMAL, true, 2, 1, 7, 6), {0, 0, false}},
        {SPEC(3, IN_NORMAL, true, 3, 7, 5), SPEC(3, IN_NORMAL, true, 3, 6, 7), {1, 1, false}},
        {SPEC(3, IN_NORMAL, true, 1, 8, 5), SPEC(3, IN_NORMAL, true, 4, 5, 6), {0, 0, false}}, /* a broadcast */
        {SPEC(2, IN_NORMAL, true, 33, 64), SPEC(2, IN_NORMAL, true, 64, 31), {0, 0, true}},    /* bf16 */
        {SPEC(3, IN_NORMAL, true, 2, 64, 33), SPEC(2, IN_NORMAL, true, 31, 64), {1, 1, true}},
        {SPEC(2, IN_NORMAL, true, 5, 0), SPEC(2, IN_NORMAL, true, 0, 4), {0, 0, false}},      /* K = 0 */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        in_spec s[2] = {cases[c].a, cases[c].b};
        char name[64];
        snprintf(name, sizeof name, "matmul case %zu", c);
        check_op(name, f_matmul, &cases[c].m, 2, s, 1e-6, 2e-6);
    }
}

Test(backend_ops, linear_with_bias_transposed_weights_and_autocast) {
    for (int v = 0; v < 16; v++) {
        lin_arg l = {v & 1, (v >> 1) & 1, (v >> 2) & 1, (v >> 3) & 1};
        in_spec s[3] = {l.rows3 ? (in_spec)SPEC(3, IN_NORMAL, true, 3, 11, 40) : (in_spec)SPEC(2, IN_NORMAL, true, 37, 40),
                        l.wt ? (in_spec)SPEC(2, IN_NORMAL, true, 40, 24) : (in_spec)SPEC(2, IN_NORMAL, true, 24, 40),
                        SPEC(1, IN_NORMAL, true, 24)};
        s[2].grad = l.bias; /* unused without a bias */
        char name[64];
        snprintf(name, sizeof name, "linear bias=%d wt=%d bf16=%d rows3=%d", l.bias, l.wt, l.bf16, l.rows3);
        check_op(name, f_linear, &l, 3, s, 1e-6, 2e-6);
    }
}

/* GEMMs large enough (M·N·K >= 2^26) that the CUDA backend pads their odd M, N and K with zeros
 * to multiples of a 16-byte vector so cuBLASLt can use its vectorised kernels (GPT-2's 50257-wide
 * LM head): forward and every gradient, with a bias, a transposed weight, bf16 autocast and a
 * strided batch, equal the CPU's. */
Test(backend_ops, large_gemms_with_odd_dimensions) {
    for (int v = 0; v < 4; v++) {
        lin_arg l = {true, v & 1, (v >> 1) & 1, true};
        /* R 666 (2 x 333), in 257, out 401: 68.6M multiply-adds in each of the three GEMMs */
        in_spec s[3] = {SPEC(3, IN_NORMAL, true, 2, 333, 257),
                        l.wt ? (in_spec)SPEC(2, IN_NORMAL, true, 257, 401) : (in_spec)SPEC(2, IN_NORMAL, true, 401, 257),
                        SPEC(1, IN_NORMAL, true, 401)};
        char name[64];
        snprintf(name, sizeof name, "large linear wt=%d bf16=%d", l.wt, l.bf16);
        check_op(name, f_linear, &l, 3, s, 1e-6, 2e-6);
    }
    /* the bf16 cases again with the device's dy block lowered from 256 MiB to 64 KiB: the backward in
     * 9 blocks of 74 rows — for wt=0 each rounded into rows padded to 408 and their weight
     * gradients summed in the padded scratch (matmul.c) */
    cmi_linear_dy_block_device = (size_t)64 << 10;
    for (int v = 0; v < 2; v++) {
        lin_arg l = {true, v & 1, true, true};
        in_spec s[3] = {SPEC(3, IN_NORMAL, true, 2, 333, 257),
                        l.wt ? (in_spec)SPEC(2, IN_NORMAL, true, 257, 401) : (in_spec)SPEC(2, IN_NORMAL, true, 401, 257),
                        SPEC(1, IN_NORMAL, true, 401)};
        char name[64];
        snprintf(name, sizeof name, "large linear in blocks wt=%d", l.wt);
        check_op(name, f_linear, &l, 3, s, 1e-6, 2e-6);
    }
    cmi_linear_dy_block_device = CMI_LINEAR_DY_BLOCK_DEVICE;
    const struct {
        in_spec a, b;
        mm_arg m;
    } cases[] = {
        {SPEC(3, IN_NORMAL, true, 2, 300, 257), SPEC(2, IN_NORMAL, true, 257, 901), {0, 0, false}},
        {SPEC(3, IN_NORMAL, true, 2, 257, 300), SPEC(2, IN_NORMAL, true, 901, 257), {1, 1, true}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        in_spec s[2] = {cases[c].a, cases[c].b};
        char name[64];
        snprintf(name, sizeof name, "large matmul case %zu", c);
        check_op(name, f_matmul, &cases[c].m, 2, s, 1e-6, 2e-6);
    }
}

Test(backend_ops, cross_entropy_with_every_option) {
    const struct {
        in_spec x, t;
        ce_arg a;
    } cases[] = {
        {SPEC(2, IN_NORMAL, true, 37, 11), {1, {37}, IN_INDEX, false, CM_DTYPE_F32, 11}, {CM_REDUCTION_MEAN, 0, 0, 0, 0}},
        {SPEC(2, IN_NORMAL, true, 37, 11), {1, {37}, IN_INDEX, false, CM_DTYPE_F32, 11}, {CM_REDUCTION_SUM, 0.1f, 0, 1, 0}},
        {SPEC(2, IN_NORMAL, true, 37, 11), {1, {37}, IN_INDEX, false, CM_DTYPE_F32, 11}, {CM_REDUCTION_NONE, 0.2f, 0, 1, 0}},
        {SPEC(3, IN_NORMAL, true, 4, 7, 9), {2, {4, 9}, IN_INDEX, false, CM_DTYPE_F32, 7}, {CM_REDUCTION_MEAN, 0.1f, 0, 0, 0}},
        {SPEC(3, IN_NORMAL, true, 4, 7, 9), {2, {4, 9}, IN_INDEX, false, CM_DTYPE_F32, 7}, {CM_REDUCTION_NONE, 0, 0, 0, 0}},
        {SPEC(2, IN_NORMAL, true, 6, 1500), {1, {6}, IN_INDEX, false, CM_DTYPE_F32, 1500}, {CM_REDUCTION_MEAN, 0.05f, 0, 0, 0}},
        /* (P, C) rows with C >= 256: the backward's row kernel, with ignored rows, NONE and SUM, and a
         * gradient added to (the loss of x twice) */
        {SPEC(2, IN_NORMAL, true, 7, 700), {1, {7}, IN_INDEX, false, CM_DTYPE_F32, 700}, {CM_REDUCTION_NONE, 0.1f, 0, 1, 0}},
        {SPEC(2, IN_NORMAL, true, 5, 257), {1, {5}, IN_INDEX, false, CM_DTYPE_F32, 257}, {CM_REDUCTION_SUM, 0, 0, 1, 1}},
        {SPEC(2, IN_NORMAL, true, 9, 13), SPEC(2, IN_NORMAL, true, 9, 13), {CM_REDUCTION_MEAN, 0.1f, 1, 0, 0}},
        {SPEC(3, IN_NORMAL, true, 2, 5, 3), SPEC(3, IN_NORMAL, true, 2, 5, 3), {CM_REDUCTION_NONE, 0, 1, 0, 0}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        in_spec s[2] = {cases[c].x, cases[c].t};
        char name[64];
        snprintf(name, sizeof name, "cross_entropy case %zu", c);
        check_op(name, f_ce, &cases[c].a, 2, s, 2e-6, 2e-6);
    }
}

Test(backend_ops, linear_cross_entropy_chunks_options_and_autocast) {
    const lce_arg args[] = {
        {CM_REDUCTION_MEAN, 0, false, false, 0}, {CM_REDUCTION_MEAN, 0.1f, true, false, 5},
        {CM_REDUCTION_SUM, 0, true, false, 1},   {CM_REDUCTION_MEAN, 0, true, true, 7},
        {CM_REDUCTION_SUM, 0.1f, false, true, 0},
    };
    for (size_t c = 0; c < sizeof args / sizeof args[0]; c++) {
        in_spec s[3] = {SPEC(2, IN_NORMAL, true, 37, 24), SPEC(2, IN_NORMAL, true, 301, 24),
                        {1, {37}, IN_INDEX, false, CM_DTYPE_F32, 301}};
        char name[64];
        snprintf(name, sizeof name, "linear_cross_entropy case %zu", c);
        check_op(name, f_lce, &args[c], 3, s, args[c].bf16 ? 1e-5 : 2e-6, args[c].bf16 ? 1e-4 : 2e-6);
    }
    /* (B, T, C) rows, several automatic chunks (on the CPU; a GPU takes them in one) */
    const lce_arg big = {CM_REDUCTION_MEAN, 0, true, false, 0};
    in_spec s[3] = {SPEC(3, IN_NORMAL, true, 3, 100, 16), SPEC(2, IN_NORMAL, true, 97, 16),
                    {2, {3, 100}, IN_INDEX, false, CM_DTYPE_F32, 97}};
    check_op("linear_cross_entropy rows 300", f_lce, &big, 3, s, 2e-6, 2e-6);
    /* the cases above have V = 301 and 97, which a GPU pads to whole 16-byte rows (loss.c); V = 96
     * is taken as it is */
    const lce_arg even = {CM_REDUCTION_MEAN, 0.1f, true, true, 5};
    in_spec s96[3] = {SPEC(2, IN_NORMAL, true, 37, 24), SPEC(2, IN_NORMAL, true, 96, 24),
                      {1, {37}, IN_INDEX, false, CM_DTYPE_F32, 96}};
    check_op("linear_cross_entropy V 96", f_lce, &even, 3, s96, 1e-5, 1e-4);
}

Test(backend_ops, cross_entropy_names_a_bad_target_on_both_devices) {
    int64_t xs[2] = {4, 5}, ts[1] = {4};
    cm_tensor *x, *t, *gx, *gt;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 2, xs, &x), CM_OK);
    cr_assert_eq(cm_tensor_new(CM_DTYPE_I64, 1, ts, &t), CM_OK);
    int64_t i2[1] = {2};
    cm_tensor_set(t, i2, 9);
    cr_assert_eq(cm_tensor_to_device(x, CM_DEVICE_CUDA, &gx), CM_OK);
    cr_assert_eq(cm_tensor_to_device(t, CM_DEVICE_CUDA, &gt), CM_OK);
    cm_tape *tc = poisoned_tape(CM_DEVICE_CPU), *tg = poisoned_tape(CM_DEVICE_CUDA);
    cr_assert_null(cm_cross_entropy(tc, x, t, NULL));
    cr_assert_null(cm_cross_entropy(tg, gx, gt, NULL));
    cr_assert_str_eq(cm_tape_error(tg), cm_tape_error(tc));
    cr_assert(strstr(cm_tape_error(tg), "target(2) = 9"), "%s", cm_tape_error(tg));
    cm_tape_free(tc);
    cm_tape_free(tg);
    cm_tensor_free(x);
    cm_tensor_free(t);
    cm_tensor_free(gx);
    cm_tensor_free(gt);
}

Test(backend_ops, layer_norm_rows_and_parameters) {
    const int64_t Cs[] = {1, 7, 64, 100, 768};
    for (int affine = 0; affine < 2; affine++)
        for (size_t i = 0; i < sizeof Cs / sizeof Cs[0]; i++) {
            in_spec s[3] = {SPEC(3, IN_NORMAL, true, 3, 23, Cs[i]), SPEC(1, IN_NORMAL, true, Cs[i]),
                            SPEC(1, IN_NORMAL, true, Cs[i])};
            s[1].grad = s[2].grad = affine;
            char name[64];
            snprintf(name, sizeof name, "layer_norm C=%lld affine=%d", (long long)Cs[i], affine);
            check_op(name, f_layer_norm, &affine, 3, s, 2e-6, 1e-5);
        }
}

Test(backend_ops, bias_gelu_both_forms) {
    for (int a = 0; a < 2; a++) {
        bool approx = a == 1;
        in_spec s[2] = {SPEC(3, IN_NORMAL, true, 5, 33, 70), SPEC(1, IN_NORMAL, true, 70)};
        check_op(approx ? "bias_gelu tanh" : "bias_gelu erf", f_bias_gelu, &approx, 2, s, 2e-6, 2e-6);
    }
}

Test(backend_ops, embedding_and_index_select_with_repeated_indices) {
    int w = 0;
    in_spec e[2] = {SPEC(2, IN_NORMAL, true, 50, 24), {3, {4, 9, 2}, IN_INDEX, false, CM_DTYPE_F32, 50}};
    check_op("embedding", f_embedding, &w, 2, e, 0.0, 1e-6);
    e[1].shape[0] = 1; /* 18 positions into 3 rows: many repeats */
    e[1].hi = 3;
    check_op("embedding repeats", f_embedding, &w, 2, e, 0.0, 1e-6);
    w = 1;
    in_spec x[2] = {SPEC(3, IN_NORMAL, true, 4, 6, 5), {1, {10}, IN_INDEX, false, CM_DTYPE_F32, 6}};
    check_op("index_select", f_embedding, &w, 2, x, 0.0, 1e-6);
}

Test(backend_ops, gather_along_every_axis_with_repeats_views_and_empty_indices) {
    /* a (5, 7, 6); idx smaller than a off the axis, larger along it (repeated indices) */
    const struct {
        gather_arg g;
        int64_t a[3], idx[3];
        bool bf16;
    } cases[] = {
        {{1, false}, {5, 7, 6}, {4, 9, 5}, false},
        {{2, false}, {5, 7, 6}, {5, 3, 11}, false},
        {{0, false}, {5, 7, 6}, {12, 7, 6}, false},
        {{0, true}, {7, 5, 6}, {9, 6, 3}, false}, /* a is the (5, 7, 6) transpose of (7, 5, 6) */
        {{2, true}, {7, 5, 6}, {5, 7, 13}, false},
        {{1, false}, {5, 7, 6}, {0, 4, 6}, false}, /* no indices */
        {{1, false}, {5, 7, 6}, {3, 10, 6}, true},  /* bf16 elements (2-byte copies; no gradient) */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int ax = cases[i].g.axis;
        in_spec s[2] = {SPEC(3, IN_NORMAL, !cases[i].bf16, cases[i].a[0], cases[i].a[1], cases[i].a[2]),
                        {3, {cases[i].idx[0], cases[i].idx[1], cases[i].idx[2]}, IN_INDEX, false, CM_DTYPE_F32, 0}};
        if (cases[i].bf16) s[0].dtype = CM_DTYPE_BF16;
        /* the gathered axis's size in the (possibly transposed) view */
        const int va = cases[i].g.transposed && ax < 2 ? 1 - ax : ax;
        s[1].hi = cases[i].a[va];
        char name[64];
        snprintf(name, sizeof name, "gather case %zu (axis %d)", i, ax);
        check_op(name, f_gather, &cases[i].g, 2, s, 0.0, 1e-6);
    }
}

Test(backend_ops, resize_bilinear_up_down_align_corners_layouts_and_views) {
    /* x (2, 3, 7, 9) or its channels-last/transposed forms */
    const resize_arg cases[] = {
        {14, 18, false, false, false}, {14, 18, true, false, false}, /* 2x up */
        {3, 4, false, false, false},   {3, 4, true, false, false},   /* down, non-integer ratios */
        {11, 5, false, true, false},   {10, 13, true, true, false},  /* channels-last */
        {1, 1, false, false, false},   {1, 1, true, false, false},   /* one pixel */
        {7, 9, false, false, true},    {5, 20, true, true, true},    /* same size; a transposed view */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const resize_arg *r = &cases[i];
        int64_t h = 7, w = 9;
        if (r->transposed) h = 9, w = 7; /* stored with H and W swapped */
        in_spec s = r->cl ? (in_spec)SPEC(4, IN_NORMAL, true, 2, h, w, 3) : (in_spec)SPEC(4, IN_NORMAL, true, 2, 3, h, w);
        char name[64];
        snprintf(name, sizeof name, "resize_bilinear case %zu", i);
        check_op(name, f_resize, r, 1, &s, 1e-6, 1e-6);
    }
    /* an input of one row and column, and an empty batch */
    const resize_arg up = {5, 6, false, false, false};
    in_spec one = SPEC(4, IN_NORMAL, true, 2, 3, 1, 1), empty = SPEC(4, IN_NORMAL, true, 0, 3, 4, 4);
    check_op("resize_bilinear from 1x1", f_resize, &up, 1, &one, 1e-6, 1e-6);
    check_op("resize_bilinear empty batch", f_resize, &up, 1, &empty, 1e-6, 1e-6);
}

Test(backend_ops, split_pieces_flow_gradients_back_through_views) {
    const int axes[] = {0, 1, 2};
    for (size_t i = 0; i < 3; i++) {
        in_spec s = SPEC(3, IN_NORMAL, true, 6, 7, 5);
        char name[32];
        snprintf(name, sizeof name, "split axis %d", axes[i]);
        check_op(name, f_split, &axes[i], 1, &s, 0.0, 1e-7);
    }
}

Test(backend_ops, group_norm_groups_layouts_and_parameters) {
    const struct {
        gn_arg g;
        int nd;
        int64_t x[4];
    } cases[] = {
        {{2, true, false}, 4, {3, 6, 5, 7}},
        {{3, false, false}, 4, {3, 6, 5, 7}},
        {{1, true, true}, 4, {2, 5, 9, 3}},   /* one group (layer norm over (C, H, W)), a view */
        {{5, true, false}, 3, {4, 5, 11}},    /* a group per channel (instance norm) */
        {{4, true, true}, 3, {2, 8, 33}},
        {{2, true, false}, 2, {7, 6}},        /* no spatial dims */
        {{8, true, false}, 4, {2, 32, 16, 16}}, /* rows longer than a block */
        {{2, true, false}, 4, {0, 4, 3, 3}},  /* an empty batch */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int64_t *x = cases[i].x;
        in_spec s[3] = {{cases[i].nd, {x[0], x[1], x[2], x[3]}, IN_NORMAL, true, CM_DTYPE_F32, 0},
                        SPEC(1, IN_NORMAL, true, x[1]), SPEC(1, IN_NORMAL, true, x[1])};
        if (cases[i].g.transposed) { /* the stored tensor is the transpose of the x the op sees */
            const int a = cases[i].nd - 1, b = cases[i].nd - 2;
            s[0].shape[a] = x[b], s[0].shape[b] = x[a];
        }
        s[1].grad = s[2].grad = cases[i].g.affine;
        char name[64];
        snprintf(name, sizeof name, "group_norm case %zu (groups %lld)", i, (long long)cases[i].g.groups);
        check_op(name, f_group_norm, &cases[i].g, 3, s, 2e-6, 1e-5);
    }
}

Test(backend_ops, mse_loss_every_reduction_on_views_and_empty_tensors) {
    const cm_reduction rs[] = {CM_REDUCTION_MEAN, CM_REDUCTION_SUM, CM_REDUCTION_NONE};
    for (size_t r = 0; r < 3; r++)
        for (int v = 0; v < 3; v++) {
            const mse_arg m = {rs[r], v == 1};
            /* 1155 elements (several blocks' partial sums), a transposed pred, an empty pair */
            in_spec s[2] = {SPEC(3, IN_NORMAL, true, 11, 15, 7), SPEC(3, IN_NORMAL, true, 15, 11, 7)};
            if (v == 0) s[0].shape[0] = 15, s[0].shape[1] = 11;
            if (v == 2) s[0].shape[0] = s[1].shape[0] = 0, s[0].shape[1] = s[1].shape[1] = 11;
            char name[64];
            snprintf(name, sizeof name, "mse_loss reduction %d view %d", (int)rs[r], v);
            check_op(name, f_mse, &m, 2, s, 1e-6, 1e-6);
        }
}

/* Dropout masks: the same seed gives the same mask on both devices, bit for bit — with and without
 * the tape's row context (the trainer's microbatch rows). */
Test(backend_ops, conv2d_layouts_strides_dilation_groups_and_bf16) {
    /* x (N, C, H, W) or (N, H, W, C), weight (Cout, Cin/g, kh, kw) */
    const struct {
        conv_arg a;
        int64_t N, Cin, H, W, Cout, kh, kw;
    } cases[] = {
        {{1, 1, 1, 1, 1, 1, 1, false, true, false, false, false, false}, 2, 3, 9, 11, 8, 3, 3},
        {{1, 1, 1, 1, 1, 1, 1, true, true, false, false, false, false}, 2, 3, 9, 11, 8, 3, 3},
        {{2, 2, 1, 1, 1, 1, 1, false, false, false, false, false, false}, 3, 8, 10, 10, 16, 3, 3},
        {{2, 1, 0, 2, 1, 2, 1, true, true, false, false, false, false}, 2, 5, 12, 9, 6, 3, 2},
        {{1, 1, 2, 2, 2, 2, 1, false, true, false, false, false, false}, 2, 4, 8, 8, 4, 3, 3},
        {{1, 1, 1, 1, 1, 1, 2, false, true, false, false, false, false}, 2, 6, 7, 7, 4, 3, 3},
        {{1, 1, 1, 1, 1, 1, 4, true, false, false, false, false, false}, 2, 8, 6, 6, 8, 3, 3},
        {{1, 1, 0, 0, 1, 1, 1, false, true, false, false, false, false}, 2, 16, 5, 5, 24, 1, 1},
        {{2, 2, 3, 3, 1, 1, 1, false, false, false, false, false, false}, 2, 3, 17, 17, 8, 7, 7},
        /* bf16 under autocast (f32 x and weight rounded inside), with f32 and bf16 results */
        {{1, 1, 1, 1, 1, 1, 1, false, true, true, false, false, false}, 2, 8, 8, 8, 16, 3, 3},
        {{1, 1, 1, 1, 1, 1, 1, true, false, true, true, false, false}, 2, 8, 8, 8, 16, 3, 3},
        {{2, 2, 1, 1, 1, 1, 2, false, true, true, true, false, false}, 2, 8, 9, 9, 8, 3, 3},
        /* explicit bf16 x and weight */
        {{1, 1, 1, 1, 1, 1, 1, true, true, false, false, true, false}, 2, 4, 6, 6, 8, 3, 3},
        /* an x made by an op: dx written fresh */
        {{2, 1, 1, 0, 1, 1, 1, false, true, false, false, false, true}, 3, 4, 7, 8, 6, 3, 3},
        {{1, 1, 1, 1, 1, 1, 2, true, false, true, true, false, true}, 2, 8, 6, 6, 8, 3, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const conv_arg *a = &cases[i].a;
        in_spec s[3] = {a->cl ? (in_spec)SPEC(4, IN_NORMAL, true, cases[i].N, cases[i].H, cases[i].W, cases[i].Cin)
                              : (in_spec)SPEC(4, IN_NORMAL, true, cases[i].N, cases[i].Cin, cases[i].H, cases[i].W),
                        SPEC(4, IN_NORMAL, true, cases[i].Cout, cases[i].Cin / a->groups, cases[i].kh, cases[i].kw),
                        SPEC(1, IN_NORMAL, true, cases[i].Cout)};
        s[2].grad = a->bias;
        if (a->x_bf16) s[0].dtype = s[1].dtype = CM_DTYPE_BF16;
        char name[96];
        snprintf(name, sizeof name, "conv2d case %zu (cl=%d groups=%d bf16=%d out_bf16=%d x_bf16=%d mid=%d)", i,
                 a->cl, a->groups, a->bf16, a->out_bf16, a->x_bf16, a->mid);
        /* bf16 products are exact in f32 and both sides round the same inputs: only the summation
         * order differs, except a bf16 result, where that can flip a rounding */
        check_op(name, f_conv, a, 3, s, a->out_bf16 ? 4e-3 : 2e-5, 4e-5);
    }
}

static void bn_case(const bn_arg *b, int64_t N, int64_t C, int64_t H, int64_t W) {
    const int64_t x4[4] = {N, b->cl ? H : C, b->cl ? W : H, b->cl ? C : W};
    in_spec s[6] = {SPEC(4, IN_NORMAL, true, x4[0], x4[1], x4[2], x4[3]), SPEC(1, IN_NORMAL, true, C),
                    SPEC(1, IN_NORMAL, true, C), SPEC(4, IN_NORMAL, true, x4[0], x4[1], x4[2], x4[3]),
                    SPEC(1, IN_NORMAL, false, C), SPEC(1, IN_POSITIVE, false, C)};
    s[1].grad = s[2].grad = b->affine;
    s[3].grad = b->residual;
    if (b->bf16) s[0].dtype = s[3].dtype = CM_DTYPE_BF16;
    char name[96];
    snprintf(name, sizeof name, "batch_norm training=%d cl=%d affine=%d fused=%d residual=%d bf16=%d (%lld, %lld)",
             b->training, b->cl, b->affine, b->fused, b->residual, b->bf16, (long long)N, (long long)C);
    check_op(name, f_bn, b, 6, s, b->bf16 ? 4e-3 : 2e-6, b->bf16 ? 4e-3 : 2e-5);
}

Test(backend_ops, batch_norm_training_eval_fused_relu_and_residual) {
    for (int v = 0; v < 64; v++) {
        bn_arg b = {v & 1, (v >> 1) & 1, (v >> 2) & 1, (v >> 3) & 1, (v >> 4) & 1, (v >> 5) & 1};
        if (b.residual && !b.fused) continue;
        bn_case(&b, 3, 5, 4, 6);
    }
    const bn_arg big = {true, false, true, true, true, false}, big_cl = {true, true, true, true, false, false};
    bn_case(&big, 8, 16, 32, 32); /* several blocks per channel */
    bn_case(&big_cl, 8, 64, 16, 16);
}

/* Column k of a (C, 2) tensor: a strided (C) view. */
static cm_tensor *col(cm_tape *tp, cm_tensor *r, int64_t k) { return cm_squeeze(tp, cm_narrow(tp, r, 1, k, 1), 1); }

Test(backend_ops, batch_norm_updates_running_statistics_alike) {
    for (int cl = 0; cl < 2; cl++) {
        in_spec xs = cl ? (in_spec)SPEC(4, IN_NORMAL, false, 4, 5, 6, 7) : (in_spec)SPEC(4, IN_NORMAL, false, 4, 7, 5, 6);
        in_spec rs = SPEC(2, IN_POSITIVE, false, 7, 2); /* running stats as strided columns */
        cm_tensor *x = make_input(&xs), *r = make_input(&rs), *xg, *rg;
        cr_assert_eq(cm_tensor_to_device(x, CM_DEVICE_CUDA, &xg), CM_OK);
        cr_assert_eq(cm_tensor_to_device(r, CM_DEVICE_CUDA, &rg), CM_OK);
        cm_tape *tc = poisoned_tape(CM_DEVICE_CPU), *tg = poisoned_tape(CM_DEVICE_CUDA);
        cm_batch_norm_opts o = cm_batch_norm_opts_default();
        o.channels_last = cl;
        o.momentum = 0.25f;
        for (int step = 0; step < 3; step++) {
            o.training = step < 2;
            cm_tensor *yc = cm_batch_norm(tc, x, NULL, NULL, col(tc, r, 0), col(tc, r, 1), &o);
            cm_tensor *yg = cm_batch_norm(tg, xg, NULL, NULL, col(tg, rg, 0), col(tg, rg, 1), &o);
            cr_assert(yc && yg, "%s / %s", cm_tape_error(tc), cm_tape_error(tg));
            cm_tensor *ygc = to_cpu(yg), *rgc = to_cpu(rg);
            cr_assert(nerr(ygc, yc) < 2e-6, "step %d: output error %g", step, nerr(ygc, yc));
            cr_assert(nerr(rgc, r) < 1e-6, "step %d: running statistics error %g", step, nerr(rgc, r));
            cm_tensor_free(ygc);
            cm_tensor_free(rgc);
            cm_tape_reset(tc);
            cm_tape_reset(tg);
        }
        cm_tape_free(tc);
        cm_tape_free(tg);
        cm_tensor_free(x);
        cm_tensor_free(xg);
        cm_tensor_free(r);
        cm_tensor_free(rg);
    }
}

Test(backend_ops, pooling_windows_padding_ceil_mode_and_views) {
    const pool_arg cases[] = {
        {0, 2, 2, 2, 2, 0, 0, false, true, false, false, 0, 0},
        {0, 3, 3, 2, 2, 1, 1, false, true, false, false, 0, 0}, /* the ResNet stem's */
        {0, 3, 2, 2, 1, 1, 1, true, true, true, false, 0, 0},
        {0, 3, 3, 2, 2, 1, 1, true, true, false, true, 0, 0},
        {1, 2, 2, 2, 2, 0, 0, false, true, false, false, 0, 0},
        {1, 3, 3, 2, 2, 1, 1, false, true, false, false, 0, 0},
        {1, 3, 3, 2, 2, 1, 1, true, false, true, false, 0, 0},
        {1, 3, 2, 1, 2, 1, 1, true, false, false, true, 0, 0},
        {2, 0, 0, 0, 0, 0, 0, false, false, false, false, 1, 1},
        {2, 0, 0, 0, 0, 0, 0, false, false, true, false, 3, 2},
        {2, 0, 0, 0, 0, 0, 0, false, false, false, true, 4, 5},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        in_spec s = SPEC(4, IN_NORMAL, true, 2, 3, 9, 11);
        char name[64];
        snprintf(name, sizeof name, "pool case %zu (kind %d)", i, cases[i].kind);
        check_op(name, f_pool, &cases[i], 1, &s, 1e-6, 1e-6);
    }
}

Test(backend_ops, concat_and_stack_send_each_input_its_slice) {
    const int axes[] = {0, 1, 2, 10, 12};
    for (size_t i = 0; i < sizeof axes / sizeof axes[0]; i++) {
        const bool stack = axes[i] >= 10;
        const int ax = stack ? axes[i] - 10 : axes[i];
        in_spec s[3] = {SPEC(3, IN_NORMAL, true, 3, 4, 5), SPEC(3, IN_NORMAL, true, 3, 4, 5), SPEC(3, IN_NORMAL, true, 3, 4, 5)};
        if (!stack) s[1].shape[ax] = 2, s[2].shape[ax] = 6;
        char name[48];
        snprintf(name, sizeof name, "%s axis %d", stack ? "stack" : "concat", ax);
        check_op(name, f_join, &axes[i], 3, s, 0.0, 1e-7);
    }
}

Test(backend_ops, dropout_masks_are_identical_on_cpu_and_gpu) {
    int64_t sh[3] = {6, 5, 13};
    for (int ctx = 0; ctx < 2; ctx++) {
        cm_tensor *x;
        cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 3, sh, &x), CM_OK);
        cr_assert_eq(cm_tensor_fill(x, 1.0), CM_OK);
        cm_tensor *gx;
        cr_assert_eq(cm_tensor_to_device(x, CM_DEVICE_CUDA, &gx), CM_OK);
        cr_assert_eq(cm_tensor_set_requires_grad(x, true), CM_OK);
        cr_assert_eq(cm_tensor_set_requires_grad(gx, true), CM_OK);
        cm_tape *tc = poisoned_tape(CM_DEVICE_CPU), *tg = poisoned_tape(CM_DEVICE_CUDA);
        if (ctx) { /* rows 2..8 of a batch of 16 */
            cm_tape_set_rows(tc, 2, 6, 16);
            cm_tape_set_rows(tg, 2, 6, 16);
        }
        cm_rng rc = cm_rng_init(99, 3), rg = cm_rng_init(99, 3);
        cm_tensor *yc = cm_dropout(tc, x, 0.3f, true, &rc), *yg = cm_dropout(tg, gx, 0.3f, true, &rg);
        cr_assert(yc && yg, "%s %s", cm_tape_error(tc), cm_tape_error(tg));
        cr_assert_eq(rc.counter, rg.counter, "rng counters %llu vs %llu", (unsigned long long)rc.counter,
                     (unsigned long long)rg.counter);
        cm_tensor *ygc = to_cpu(yg);
        int dropped = 0;
        for (int64_t i = 0; i < 6 * 5 * 13; i++) {
            cr_assert_eq(cm_tensor_get_flat(ygc, i), cm_tensor_get_flat(yc, i), "element %lld (row context %d)",
                         (long long)i, ctx);
            dropped += cm_tensor_get_flat(yc, i) == 0.0;
        }
        cr_assert(dropped > 40 && dropped < 200, "%d of 390 dropped at p 0.3", dropped);
        cr_assert_eq(cm_tape_backward_with(tc, yc, yc), CM_OK);
        cm_tensor *gyg = to_cpu(yg), *gyd;
        cr_assert_eq(cm_tensor_to_device(gyg, CM_DEVICE_CUDA, &gyd), CM_OK);
        cr_assert_eq(cm_tape_backward_with(tg, yg, gyd), CM_OK, "%s", cm_tape_error(tg));
        cm_tensor *g2 = to_cpu(cm_tensor_grad(gx));
        cr_assert_eq(nerr(g2, cm_tensor_grad(x)), 0.0);
        cm_tensor_free(g2);
        cm_tensor_free(gyg);
        cm_tensor_free(gyd);
        cm_tensor_free(ygc);
        cm_tape_free(tc);
        cm_tape_free(tg);
        cm_tensor_free(x);
        cm_tensor_free(gx);
    }
}

/* Every attention test's cases: B = 2, H = 3 (attn_specs). */
static const attn_arg k_attn_cases[] = {
    {false, false, false, false, false, false, false, 13, 13, 16},
    {true, false, false, false, false, false, false, 40, 40, 32},
    {true, false, false, false, true, false, true, 33, 33, 64},  /* GPT: permuted in, bthd out */
    {false, true, true, false, false, false, false, 9, 37, 8},   /* T != S, bias with a gradient */
    {true, true, false, true, false, false, false, 35, 35, 20},  /* causal + ALiBi-like bias + padding */
    {false, false, false, true, true, false, true, 7, 7, 128},
    {true, false, false, false, false, true, false, 34, 34, 16}, /* dropout */
    {false, true, true, true, false, true, true, 12, 12, 24},
    /* more than one 64-row tile each way (the tiled kernels' partial tiles and causal skips) */
    {true, false, false, false, true, false, true, 130, 130, 64},
    {false, true, true, true, false, true, false, 70, 100, 40},
    {true, true, false, true, true, true, true, 65, 129, 33},
    {true, false, false, false, true, true, true, 150, 150, 96}, /* D above 64, padded to 128 by the tensor cores */
};
#define N_ATTN_CASES (sizeof k_attn_cases / sizeof k_attn_cases[0])

/* The inputs of f_attention for case a: q, k, v of kind qkv (with gradients), the bias and the mask
 * source. */
static void attn_specs(const attn_arg *a, in_kind qkv, in_spec s[5]) {
    const int64_t B = 2, H = 3;
    for (int i = 0; i < 3; i++) {
        const int64_t N = i == 0 ? a->T : a->S;
        s[i] = a->permuted ? (in_spec)SPEC(4, qkv, true, B, N, H, a->D) : (in_spec)SPEC(4, qkv, true, B, H, N, a->D);
    }
    s[3] = (in_spec)SPEC(4, IN_NORMAL, a->bias_grad, 1, H, a->T, a->S);
    s[4] = (in_spec)SPEC(2, IN_NORMAL, false, B, a->S);
}

Test(backend_ops, attention_with_masks_bias_dropout_and_layouts) {
    const size_t n_cases = N_ATTN_CASES;
    /* every case through the tiled kernels (D <= 64) and, forced, through the row-wise ones */
    for (size_t c = 0; c < 2 * n_cases; c++) {
        const attn_arg *a = &k_attn_cases[c % n_cases];
        if (c == n_cases) setenv("CM_CUDA_ATTENTION", "rowwise", 1);
        in_spec s[5];
        attn_specs(a, IN_NORMAL, s);
        char name[80];
        snprintf(name, sizeof name, "attention case %zu (%s)", c % n_cases, c < n_cases ? "tiled" : "rowwise");
        check_op(name, f_attention, a, 5, s, 2e-6, 1e-5);
    }
    unsetenv("CM_CUDA_ATTENTION");
}

static cm_tensor *f_attention_autocast(cm_tape *tp, cm_tensor *const *in, const void *varg) {
    const cm_dtype prev = cm_tape_set_autocast(tp, CM_DTYPE_BF16);
    cm_tensor *out = f_attention(tp, in, varg);
    cm_tape_set_autocast(tp, prev);
    return out;
}

/* Under bf16 autocast a GPU with tensor cores runs attention_tc.cu: q, k, v, the probabilities, dO
 * and dS rounded to bf16, f32 scores, softmax and sums; the CPU stays f32. With q, k and v exact in
 * bf16 the difference is the rounding of P, dO and dS: on the emulator at most 1.0e-3 (forward)
 * and 3.5e-3 (gradients) over these cases, bounded at 3e-3 and 8e-3; a misplaced fragment, a lost
 * mask or dropout factor gives errors of order 0.1 to 1.
 * Every case of the f32 test above: head sizes 8 to 128 (each padding of the head dim to 16·KD). */
Test(backend_ops, attention_under_autocast_runs_on_the_tensor_cores) {
    const cmi_backend *be = cmi_backend_get(CM_DEVICE_CUDA);
    double mma_err;
    if (be->check_mma(&mma_err) == CM_ERR_UNSUPPORTED) cr_skip_test("no bf16 tensor cores here: %s", cm_last_error());
    for (size_t c = 0; c < N_ATTN_CASES; c++) {
        const attn_arg *a = &k_attn_cases[c];
        in_spec s[5];
        attn_specs(a, IN_BF16, s);
        char name[80];
        snprintf(name, sizeof name, "attention case %zu (tensor cores, D %d)", c, a->D);
        check_op(name, f_attention_autocast, a, 5, s, 3e-3, 8e-3);
    }
}

/* The autocast result is the tensor cores' (not the f32 kernels' quietly): it differs from the f32
 * kernels' by the roundings above, and CM_CUDA_ATTENTION=f32 brings the f32 result back. */
Test(backend_ops, attention_under_autocast_is_routed_to_the_tensor_cores) {
    const cmi_backend *be = cmi_backend_get(CM_DEVICE_CUDA);
    double mma_err;
    if (be->check_mma(&mma_err) == CM_ERR_UNSUPPORTED) cr_skip_test("no bf16 tensor cores here: %s", cm_last_error());
    const attn_arg a = {true, false, false, false, true, false, true, 70, 70, 64};
    in_spec s[3];
    for (int i = 0; i < 3; i++) s[i] = (in_spec)SPEC(4, IN_BF16, false, 2, 70, 3, 64);
    cm_tensor *in[5] = {0}, *r[3];
    for (int i = 0; i < 3; i++) {
        cm_tensor *c = make_input(&s[i]);
        cr_assert_eq(cm_tensor_to_device(c, CM_DEVICE_CUDA, &in[i]), CM_OK, "%s", cm_last_error());
        cm_tensor_free(c);
    }
    for (int k = 0; k < 3; k++) { /* f32 kernels, autocast, autocast with the f32 kernels forced */
        if (k == 2) setenv("CM_CUDA_ATTENTION", "f32", 1);
        cm_tape *tp = poisoned_tape(CM_DEVICE_CUDA);
        cm_tensor *o = k == 0 ? f_attention(tp, in, &a) : f_attention_autocast(tp, in, &a);
        cr_assert(o, "%s", cm_tape_error(tp));
        r[k] = to_cpu(o);
        cm_tape_free(tp);
    }
    unsetenv("CM_CUDA_ATTENTION");
    const double d_tc = nerr(r[1], r[0]), d_forced = nerr(r[2], r[0]);
    printf("attention under autocast vs f32 kernels: %.3g (tensor cores), %.3g (f32 forced)\n", d_tc, d_forced);
    cr_expect(d_tc > 1e-5 && d_tc < 6e-3, "tensor cores vs f32: %.3g, want the bf16 roundings' size", d_tc);
    cr_expect(d_forced == 0.0, "CM_CUDA_ATTENTION=f32 under autocast: %.3g from the f32 kernels", d_forced);
    for (int i = 0; i < 3; i++) cm_tensor_free(in[i]), cm_tensor_free(r[i]);
}

Test(backend_ops, view_chains_and_casts_send_gradients_back) {
    for (int w = 0; w < 4; w++) {
        in_spec s = SPEC(3, IN_NORMAL, true, 4, 6, 10);
        char name[64];
        snprintf(name, sizeof name, "view chain %d", w);
        /* exact, except that expand's gradient is a sum (in another order on the GPU) */
        check_op(name, f_views, &w, 1, &s, 0.0, w == 1 ? 1e-6 : 0.0);
    }
}

Test(backend_ops, copies_and_casts_are_bit_exact_across_devices) {
    const cm_dtype dts[] = {CM_DTYPE_F32, CM_DTYPE_BF16, CM_DTYPE_F16, CM_DTYPE_I32, CM_DTYPE_I64, CM_DTYPE_U8};
    int64_t sh[2] = {13, 9};
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 6; j++) {
            cm_tensor *src, *dst_cpu, *gsrc, *gdst;
            cr_assert_eq(cm_tensor_new(dts[i], 2, sh, &src), CM_OK);
            for (int64_t k = 0; k < 13 * 9; k++) {
                int64_t idx[2] = {k / 9, k % 9};
                const double v = dts[i] == CM_DTYPE_U8 ? (double)(k % 250) : (k - 60) * 1.37 + 0.001 * k;
                cm_tensor_set(src, idx, v);
            }
            cr_assert_eq(cm_tensor_new(dts[j], 2, sh, &dst_cpu), CM_OK);
            cr_assert_eq(cm_tensor_copy(dst_cpu, src), CM_OK);
            cr_assert_eq(cm_tensor_to_device(src, CM_DEVICE_CUDA, &gsrc), CM_OK, "%s", cm_last_error());
            cr_assert_eq(cm_tensor_new_on(CM_DEVICE_CUDA, dts[j], 2, sh, &gdst), CM_OK, "%s", cm_last_error());
            cr_assert_eq(cm_tensor_copy(gdst, gsrc), CM_OK, "%s", cm_last_error());
            cm_tensor *back = to_cpu(gdst);
            cr_assert_eq(memcmp(cm_tensor_data(back), cm_tensor_data(dst_cpu), cm_tensor_nbytes(back)), 0,
                         "cast %s -> %s differs between devices", cm_dtype_name(dts[i]), cm_dtype_name(dts[j]));
            /* a transposed view copied host -> device and back */
            cm_tensor_free(back);
            cm_tensor_free(src);
            cm_tensor_free(dst_cpu);
            cm_tensor_free(gsrc);
            cm_tensor_free(gdst);
        }
}

Test(backend_ops, strided_copies_between_host_and_device) {
    cm_tape *tc = poisoned_tape(CM_DEVICE_CPU);
    int64_t sh[3] = {3, 4, 5};
    cm_tensor *x;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 3, sh, &x), CM_OK);
    cr_assert_eq(cm_tensor_arange_fill(x, 0.5, 1.0), CM_OK);
    int perm[3] = {2, 0, 1};
    cm_tensor *xt = cm_permute(tc, x, perm); /* (5, 3, 4), strided */
    cr_assert(xt);
    int64_t tsh[3] = {5, 3, 4};
    cm_tensor *g;
    cr_assert_eq(cm_tensor_new_on(CM_DEVICE_CUDA, CM_DTYPE_BF16, 3, tsh, &g), CM_OK);
    cr_assert_eq(cm_tensor_copy(g, xt), CM_OK, "%s", cm_last_error()); /* strided host -> device, cast */
    for (int64_t i = 0; i < 60; i++)
        cr_assert_eq(cm_tensor_get_flat(g, i), cm_tensor_get_flat(xt, i), "element %lld", (long long)i);
    /* device -> host into a strided destination */
    cm_tensor *y;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 3, sh, &y), CM_OK);
    int inv[3] = {2, 0, 1};
    cm_tensor *yt = cm_permute(tc, y, inv); /* (5, 3, 4) view of y */
    cr_assert_eq(cm_tensor_copy(yt, g), CM_OK, "%s", cm_last_error());
    for (int64_t i = 0; i < 60; i++) cr_assert_eq(cm_tensor_get_flat(y, i), cm_tensor_get_flat(x, i));
    cm_tensor_free(x);
    cm_tensor_free(y);
    cm_tensor_free(g);
    cm_tape_free(tc);
}

static cm_tensor *f_to_device(cm_tape *tp, cm_tensor *const *in, const void *arg) {
    (void)arg;
    /* in[0] is on the tape's device; move it over and back, doing math on each side */
    const cm_device here = cm_tensor_device(in[0]);
    cm_tensor *x = cm_mul(tp, in[0], in[0]);
    x = cm_to_device(tp, x, CM_DEVICE_CPU);
    x = cm_exp(tp, x);
    x = cm_to_device(tp, x, here);
    return cm_mul_scalar(tp, x, 3.0f);
}

Test(backend_ops, to_device_is_differentiable_both_ways) {
    in_spec s = SPEC(2, IN_NORMAL, true, 7, 3);
    check_op("to_device round trip", f_to_device, NULL, 1, &s, 1e-6, 1e-6);
}

Test(backend_ops, creation_ops_follow_the_tape_device) {
    cm_tape *tg = poisoned_tape(CM_DEVICE_CUDA);
    int64_t sh[2] = {4, 3};
    cm_tensor *z = cm_zeros(tg, CM_DTYPE_F32, 2, sh), *f = cm_full(tg, CM_DTYPE_BF16, 2, sh, 2.5),
              *r = cm_arange(tg, CM_DTYPE_I64, 3, 30, 3);
    cr_assert(z && f && r, "%s", cm_tape_error(tg));
    cr_assert_eq(cm_tensor_device(z), CM_DEVICE_CUDA);
    cr_assert_eq(cm_tensor_device(r), CM_DEVICE_CUDA);
    for (int64_t i = 0; i < 12; i++) {
        cr_assert_eq(cm_tensor_get_flat(z, i), 0.0);
        cr_assert_eq(cm_tensor_get_flat(f, i), 2.5);
    }
    for (int64_t i = 0; i < 9; i++) cr_assert_eq(cm_tensor_get_flat(r, i), 3.0 * (double)(i + 1));
    cm_tape_free(tg);
}

Test(backend_ops, mixing_devices_in_one_op_names_both) {
    cm_tape *tp = poisoned_tape(CM_DEVICE_CPU);
    int64_t sh[1] = {4};
    cm_tensor *a, *b;
    cr_assert_eq(cm_tensor_new_on(CM_DEVICE_CUDA, CM_DTYPE_F32, 1, sh, &a), CM_OK);
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 1, sh, &b), CM_OK);
    cr_assert_null(cm_add(tp, a, b));
    cr_assert_eq(cm_tape_status(tp), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_tape_error(tp), "is on cpu") && strstr(cm_tape_error(tp), "runs on cuda"), "%s",
              cm_tape_error(tp));
    cm_tensor_free(a);
    cm_tensor_free(b);
    cm_tape_free(tp);
}

/* The gate that keeps an op without a GPU path (a private one, or a public one added later) from
 * running its CPU loops over device memory is cmi_begin's check of the op's name against the GPU
 * list (k_gpu_ops): exercised here with a name outside the list, as an op's first call. */
Test(backend_ops, an_op_without_a_gpu_path_fails_cleanly) {
    static const char *op = "cpu_only_op";
    cr_assert(!cmi_op_on_device(op, CM_DEVICE_CUDA));
    cr_assert(cmi_op_on_device(op, CM_DEVICE_CPU));
    int64_t xs[3] = {2, 4, 3};
    cm_tensor *x, *xc;
    cr_assert_eq(cm_tensor_new_on(CM_DEVICE_CUDA, CM_DTYPE_F32, 3, xs, &x), CM_OK);
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 3, xs, &xc), CM_OK);
    cm_tape *tp = poisoned_tape(CM_DEVICE_CPU);
    cr_assert_not(cmi_begin(tp, op, 1, &x));
    cr_assert_eq(cm_tape_status(tp), CM_ERR_UNSUPPORTED, "%s", cm_tape_error(tp));
    cr_assert(strstr(cm_tape_error(tp), "cpu_only_op: not implemented on cuda"), "%s", cm_tape_error(tp));
    cr_assert(strstr(cm_tape_error(tp), "cm_to_device"), "the error says how to go on: %s", cm_tape_error(tp));
    cm_tape_free(tp);
    /* the same op on a CPU input passes the gate */
    tp = poisoned_tape(CM_DEVICE_CPU);
    cr_assert(cmi_begin(tp, op, 1, &xc), "%s", cm_tape_error(tp));
    cm_tape_free(tp);
    /* the ops that used to lack a GPU path are on the list */
    const char *added[] = {"group_norm", "resize_bilinear", "gather", "split", "mse_loss"};
    for (size_t i = 0; i < sizeof added / sizeof added[0]; i++)
        cr_assert(cmi_op_on_device(added[i], CM_DEVICE_CUDA), "%s", added[i]);
    cm_tensor_free(x);
    cm_tensor_free(xc);
}

Test(backend_ops, the_device_arena_budget_is_an_out_of_memory_error) {
    cm_tape_config cfg = cm_tape_config_default();
    cfg.device_budget = (size_t)4 << 20;
    cm_tape *tp;
    cr_assert_eq(cm_tape_new(&cfg, &tp), CM_OK);
    cr_assert_eq(cm_tape_set_device(tp, CM_DEVICE_CUDA), CM_OK);
    int64_t sh[2] = {1024, 1024}; /* 4 MiB each */
    cm_tensor *a = cm_zeros(tp, CM_DTYPE_F32, 2, sh);
    cr_assert(a, "%s", cm_tape_error(tp));
    cr_assert_null(cm_zeros(tp, CM_DTYPE_F32, 2, sh));
    cr_assert_eq(cm_tape_status(tp), CM_ERR_OOM, "%s", cm_tape_error(tp));
    cm_tape_reset(tp); /* after a reset the memory is there again */
    cr_assert(cm_zeros(tp, CM_DTYPE_F32, 2, sh), "%s", cm_tape_error(tp));
    cm_tape_free(tp);
}

/* `requested` counts what the allocations asked for, rounded up to 512 bytes (PyTorch's
 * allocated_bytes, what torch.cuda.max_memory_allocated peaks), apart from the blocks serving them:
 * a freed 4 MiB block serves a 2.5 MiB request whole. */
Test(backend_ops, the_allocator_counts_requests_as_pytorch_does_and_blocks_apart) {
    cm_device_memory m0, m1, m2;
    cr_assert_eq(cm_device_memory_stats(CM_DEVICE_CUDA, &m0), CM_OK);
    int64_t sh[1] = {(3 << 18) + 1}; /* 3 MiB + 4 bytes: a 4 MiB block (2 MiB steps), 3 MiB + 512 asked */
    cm_tensor *t;
    cr_assert_eq(cm_tensor_new_on(CM_DEVICE_CUDA, CM_DTYPE_F32, 1, sh, &t), CM_OK);
    cr_assert_eq(cm_device_memory_stats(CM_DEVICE_CUDA, &m1), CM_OK);
    cr_assert_eq(m1.requested - m0.requested, ((size_t)3 << 20) + 512);
    const size_t block = m1.allocated - m0.allocated;
    cr_assert(block >= ((size_t)4 << 20) && block <= ((size_t)8 << 20), "block %zu", block);
    cr_assert_geq(m1.peak_requested, m1.requested);
    cm_tensor_free(t);
    sh[0] = 5 << 17; /* 2.5 MiB: the freed block (at most twice that) serves it */
    cr_assert_eq(cm_tensor_new_on(CM_DEVICE_CUDA, CM_DTYPE_F32, 1, sh, &t), CM_OK);
    cr_assert_eq(cm_device_memory_stats(CM_DEVICE_CUDA, &m2), CM_OK);
    cr_assert_eq(m2.requested - m0.requested, (size_t)5 << 19);
    cr_assert_eq(m2.allocated - m0.allocated, block, "the 4 MiB block was not reused whole");
    cr_assert_eq(m2.reserved, m1.reserved);
    cm_device_reset_peak(CM_DEVICE_CUDA);
    cr_assert_eq(cm_device_memory_stats(CM_DEVICE_CUDA, &m2), CM_OK);
    cr_assert(m2.peak_requested == m2.requested && m2.peak == m2.allocated);
    cm_tensor_free(t);
    cr_assert_eq(cm_device_memory_stats(CM_DEVICE_CUDA, &m2), CM_OK);
    cr_assert(m2.requested == m0.requested && m2.allocated == m0.allocated && m2.peak_requested >= (size_t)5 << 19);
}

/* The tape's device memory is its high-water mark: one growable range of virtual memory, mapped as
 * the arena's position passes its end. Before, the arena took chunks each as large as all before it
 * and a request that missed a chunk's tail skipped it: these three requests (the pattern of the
 * emulator's tiny GPT-2 step: the logits, then a small one) held chunks of 1, 24 and 25 MiB. */
Test(backend_ops, the_tapes_device_memory_is_its_high_water_mark) {
    const cmi_backend *be = cmi_backend_get(CM_DEVICE_CUDA);
    const size_t g = be->vm_granularity();
    cm_device_memory m0, m1, m2;
    cm_tape *tp;
    cr_assert_eq(cm_tape_new(NULL, &tp), CM_OK);
    cr_assert_eq(cm_device_memory_stats(CM_DEVICE_CUDA, &m0), CM_OK);
    const int64_t sizes[3] = {25, 6 << 20, 4096}; /* f32: 100 bytes, 24 MiB, 16 KiB */
    for (int step = 0; step < 2; step++) {
        for (int i = 0; i < 3; i++)
            cr_assert_not_null(cm_empty_on(tp, CM_DEVICE_CUDA, CM_DTYPE_F32, 1, &sizes[i]), "%s", cm_last_error());
        cr_assert_eq(cm_device_memory_stats(CM_DEVICE_CUDA, step ? &m2 : &m1), CM_OK);
        cm_tape_reset(tp);
    }
    const size_t used = ((size_t)24 << 20) + (16 << 10) + 128, held = m1.requested - m0.requested;
    cr_expect_geq(held, used);
    cr_expect_leq(held, (used + g - 1) / g * g + 16 * g, "%zu bytes held for %zu used (granule %zu)", held, used, g);
    cr_expect_lt(held, (size_t)40 << 20, "%zu bytes held for %zu used", held, used);
    cr_expect_eq(m2.requested, m1.requested, "the second step grows nothing");
    cr_expect_eq(m1.allocated - m0.allocated, held, "mapped as asked, no block rounding");
    cm_tape_free(tp);
    cr_assert_eq(cm_device_memory_stats(CM_DEVICE_CUDA, &m2), CM_OK);
    cr_expect_eq(m2.requested, m0.requested, "given back with the tape");
}

Test(backend_ops, the_caching_allocator_reuses_blocks_and_honours_its_budget) {
    cm_device_memory m0, m1, m2;
    cr_assert_eq(cm_device_memory_stats(CM_DEVICE_CUDA, &m0), CM_OK);
    int64_t sh[1] = {3 << 20}; /* 12 MiB */
    cm_tensor *t;
    cr_assert_eq(cm_tensor_new_on(CM_DEVICE_CUDA, CM_DTYPE_F32, 1, sh, &t), CM_OK);
    cr_assert_eq(cm_device_memory_stats(CM_DEVICE_CUDA, &m1), CM_OK);
    cr_assert_geq(m1.allocated - m0.allocated, (size_t)12 << 20);
    cm_tensor_free(t);
    cr_assert_eq(cm_tensor_new_on(CM_DEVICE_CUDA, CM_DTYPE_F32, 1, sh, &t), CM_OK);
    cr_assert_eq(cm_device_memory_stats(CM_DEVICE_CUDA, &m2), CM_OK);
    cr_assert_eq(m2.reserved, m1.reserved, "the freed block was not reused (%zu -> %zu reserved)", m1.reserved,
                 m2.reserved);
    cm_tensor_free(t);
    cr_assert_eq(cm_device_memory_stats(CM_DEVICE_CUDA, &m2), CM_OK);
    cm_device_set_memory_budget(CM_DEVICE_CUDA, m2.allocated + ((size_t)4 << 20));
    cm_status s = cm_tensor_new_on(CM_DEVICE_CUDA, CM_DTYPE_F32, 1, sh, &t);
    cr_assert_eq(s, CM_ERR_OOM, "a 12 MiB tensor under a 4 MiB budget: %s", cm_last_error());
    cr_assert(strstr(cm_last_error(), "out of memory"), "%s", cm_last_error());
    cm_device_set_memory_budget(CM_DEVICE_CUDA, 0);
}

/* ---------------------------------------------------------------------------------------------
 * main: skip (77) where no GPU can be used
 * ------------------------------------------------------------------------------------------- */

int main(int argc, char *argv[]) { return cmt_gpu_main(argc, argv, "test_backend_ops", true); }

/* The tensor cores' bf16 product with the fragment layout the kernels assume (common.cuh's
 * cmi_mma_16816): on a GPU the instruction itself, on the emulator its model of the layout. A
 * misread register order moves products to the wrong outputs: errors of the values' size. The same
 * call checks ldmatrix (cmi_ldsm_x4, plain and transposing) register by register. */
Test(backend_ops, tensor_core_mma_fragments_follow_the_documented_layout) {
    const cmi_backend *be = cmi_backend_get(CM_DEVICE_CUDA);
    cr_assert_not_null(be);
    cr_assert_not_null(be->check_mma, "the CUDA backend has a check_mma slot");
    double err = -1.0;
    cm_status st = be->check_mma(&err);
    if (st == CM_ERR_UNSUPPORTED) cr_skip_test("%s", cm_last_error());
    cr_assert_eq(st, CM_OK, "%s", cm_last_error());
    printf("tensor cores: bf16 m16n8k16 max relative error %.3g against the double reference\n", err);
    /* 16 exact bf16 products summed in f32: a few f32 roundings of the largest partial sum */
    cr_expect(err >= 0.0 && err < 1e-5, "mma m16n8k16 relative error %.3g, want < 1e-5", err);
}

/* The trainer's accuracy of a GPU's logits reads back each row's argmax (cmi_argmax_last): the
 * first maximum, a NaN being the maximum (the first NaN wins), as the CPU's scan — for rows short
 * (one thread a row), medium (a warp) and long (a block: 30522, a masked-LM head's), ties
 * included. */
Test(backend_ops, argmax_of_rows_equals_the_cpus_first_maximum) {
    const int64_t Cs[] = {1, 7, 64, 300, 4096, 30522};
    for (size_t k = 0; k < sizeof Cs / sizeof *Cs; k++) {
        const int64_t C = Cs[k], R = 9, sh[2] = {R, C};
        cm_tensor *x;
        cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 2, sh, &x), CM_OK);
        float *v = cm_tensor_data(x);
        for (int64_t i = 0; i < R * C; i++) v[i] = (float)((i * 7919) % 1009) * 0.01f - 5.0f;
        if (C > 2) {
            v[1 * C + C - 1] = 100.0f, v[1 * C + 2] = 100.0f; /* row 1: a tie, the earlier wins */
            v[2 * C + C / 2] = NAN, v[2 * C + C - 1] = NAN;   /* row 2: the first NaN wins */
            v[3 * C + C - 1] = 50.0f;                          /* row 3: the last column */
            for (int64_t c = 0; c < C; c++) v[4 * C + c] = 1.0f; /* row 4: all equal: column 0 */
        }
        int64_t want[9], got[9];
        cm_tape *tc = poisoned_tape(CM_DEVICE_CPU), *tg = poisoned_tape(CM_DEVICE_CUDA);
        cr_assert_eq(cmi_argmax_last(tc, x, want), CM_OK, "%s", cm_last_error());
        cm_tensor *gx;
        cr_assert_eq(cm_tensor_to_device(x, CM_DEVICE_CUDA, &gx), CM_OK, "%s", cm_last_error());
        cr_assert_eq(cmi_argmax_last(tg, gx, got), CM_OK, "%s", cm_last_error());
        for (int64_t r = 0; r < R; r++) cr_expect_eq(got[r], want[r], "C %lld row %lld: GPU %lld, CPU %lld", (long long)C,
                                                     (long long)r, (long long)got[r], (long long)want[r]);
        if (C > 2) {
            cr_expect(want[1] == 2 && want[2] == C / 2 && want[3] == C - 1 && want[4] == 0,
                      "C %lld: CPU picks %lld %lld %lld %lld", (long long)C, (long long)want[1], (long long)want[2],
                      (long long)want[3], (long long)want[4]);
        }
        cm_tensor_free(gx);
        cm_tensor_free(x);
        cm_tape_free(tc);
        cm_tape_free(tg);
    }
}
