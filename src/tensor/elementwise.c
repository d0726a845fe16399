/* Elementwise ops: broadcasting binary arithmetic, scalar ops, unary math and activations, and the
 * fused bias + GELU. Inputs may be any strided view; results are contiguous. */
#include "tensor/backend.h"
#include "tensor/tensor_impl.h"
#include "tensor/vexp.h"

#include <math.h>
#include <omp.h>

/* ------------------------------------------------------------------------------------------ */
/* Binary ops with broadcasting                                                                 */
/* ------------------------------------------------------------------------------------------ */

typedef enum { BIN_ADD = CMI_BIN_ADD, BIN_SUB = CMI_BIN_SUB, BIN_MUL = CMI_BIN_MUL, BIN_DIV = CMI_BIN_DIV } bin_op;
static const char *const k_bin_names[] = {"add", "sub", "mul", "div"};

static void bin_row(int64_t n, char *const *p, const int64_t *inner, void *ctx) {
    const bin_op op = *(const bin_op *)ctx;
    float *o = (float *)p[0];
    const float *a = (const float *)p[1], *b = (const float *)p[2];
    const int64_t sa = inner[1], sb = inner[2];
    if (sa == 1 && sb == 1) {
        switch (op) {
        case BIN_ADD: for (int64_t i = 0; i < n; i++) o[i] = a[i] + b[i]; break;
        case BIN_SUB: for (int64_t i = 0; i < n; i++) o[i] = a[i] - b[i]; break;
        case BIN_MUL: for (int64_t i = 0; i < n; i++) o[i] = a[i] * b[i]; break;
        case BIN_DIV: for (int64_t i = 0; i < n; i++) o[i] = a[i] / b[i]; break;
        }
        return;
    }
    switch (op) {
    case BIN_ADD: for (int64_t i = 0; i < n; i++) o[i] = a[i * sa] + b[i * sb]; break;
    case BIN_SUB: for (int64_t i = 0; i < n; i++) o[i] = a[i * sa] - b[i * sb]; break;
    case BIN_MUL: for (int64_t i = 0; i < n; i++) o[i] = a[i * sa] * b[i * sb]; break;
    case BIN_DIV: for (int64_t i = 0; i < n; i++) o[i] = a[i * sa] / b[i * sb]; break;
    }
}

/* Backward helper rows: t = g·x (mode 0), t = g/x (1), t = -g·o/x (2), t = -g (3). */
typedef struct {
    int mode;
} bwd_ctx;

static void bwd_row(int64_t n, char *const *p, const int64_t *inner, void *vctx) {
    const int mode = ((const bwd_ctx *)vctx)->mode;
    float *t = (float *)p[0];
    const float *g = (const float *)p[1], *x = (const float *)p[2], *o = (const float *)p[3];
    const int64_t sx = inner[2];
    switch (mode) {
    case 0: for (int64_t i = 0; i < n; i++) t[i] = g[i] * x[i * sx]; break;
    case 1: for (int64_t i = 0; i < n; i++) t[i] = g[i] / x[i * sx]; break;
    case 2: for (int64_t i = 0; i < n; i++) t[i] = -g[i] * o[i] / x[i * sx]; break;
    default: for (int64_t i = 0; i < n; i++) t[i] = -g[i]; break;
    }
}

/* tmp (gout's shape) = f(gout, x broadcast, out); then accumulate into `target`'s gradient. */
static cm_status bwd_apply(cm_tape *tp, int mode, const cm_tensor *gout, const cm_tensor *x, const cm_tensor *out,
                           cm_tensor *target) {
    cm_tensor *tmp = cmi_new(tp, CM_DTYPE_F32, gout->ndim, gout->shape);
    if (!tmp) return cmi_status(tp);
    const cmi_backend *be = cmi_be(tp);
    if (be) {
        int64_t sx[CM_MAX_DIMS];
        if (x) cmi_broadcast_strides(x, gout->ndim, gout->shape, sx);
        if (cmi_dev_fail(tp,
                         be->binary_bwd((cmi_bin_bwd_mode)mode, cmi_f32(tmp), cmi_f32(gout), x ? cmi_f32(x) : NULL,
                                        x ? sx : NULL, out ? cmi_f32(out) : NULL, gout->ndim, gout->shape),
                         "binary backward"))
            return cmi_status(tp);
        return cmi_accum(tp, target, tmp);
    }
    int64_t st[4][CM_MAX_DIMS];
    cmi_contig_strides(gout->ndim, gout->shape, st[0]);
    cmi_contig_strides(gout->ndim, gout->shape, st[1]);
    if (x) cmi_broadcast_strides(x, gout->ndim, gout->shape, st[2]);
    else memset(st[2], 0, sizeof st[2]);
    cmi_contig_strides(gout->ndim, gout->shape, st[3]);
    char *bases[4] = {(char *)tmp->data, (char *)gout->data, x ? (char *)x->data : (char *)gout->data,
                      out ? (char *)out->data : (char *)gout->data};
    size_t es[4] = {4, 4, 4, 4};
    bwd_ctx c = {mode};
    cmi_iterate(gout->ndim, gout->shape, 4, st, bases, es, true, bwd_row, &c);
    return cmi_accum(tp, target, tmp);
}

static cm_status bin_backward(cm_tape *tp, cm_node *n, const cm_tensor *g) {
    cm_tensor *a = n->in[0], *b = n->in[1];
    const bin_op op = (bin_op)n->i[0];
    const bool ga = cm_tensor_requires_grad(a), gb = cm_tensor_requires_grad(b);
    cm_status st = CM_OK;
    switch (op) {
    case BIN_ADD:
        if (ga) st = cmi_accum(tp, a, g);
        if (!st && gb) st = cmi_accum(tp, b, g);
        break;
    case BIN_SUB:
        if (ga) st = cmi_accum(tp, a, g);
        if (!st && gb) st = bwd_apply(tp, 3, g, NULL, NULL, b);
        break;
    case BIN_MUL:
        if (ga) st = bwd_apply(tp, 0, g, b, NULL, a);
        if (!st && gb) st = bwd_apply(tp, 0, g, a, NULL, b);
        break;
    case BIN_DIV:
        if (ga) st = bwd_apply(tp, 1, g, b, NULL, a);
        if (!st && gb) st = bwd_apply(tp, 2, g, b, n->out, b);
        break;
    }
    return st ? st : cmi_status(tp);
}

static cm_tensor *binary(cm_tape *tp, bin_op op, cm_tensor *a, cm_tensor *b) {
    const char *name = k_bin_names[op];
    cm_tensor *ins[2] = {a, b};
    if (!cmi_begin(tp, name, 2, ins)) return NULL;
    if (!cmi_check_f32(tp, name, "a", a) || !cmi_check_f32(tp, name, "b", b)) return NULL;
    int nd;
    int64_t shape[CM_MAX_DIMS];
    if (!cmi_broadcast_shapes(a->ndim, a->shape, b->ndim, b->shape, &nd, shape)) {
        cmi_fail(tp, CM_ERR_SHAPE, "%s: shapes %s and %s do not broadcast", name, cmi_shape(a), cmi_shape(b));
        return NULL;
    }
    cm_tensor *out = cmi_new(tp, CM_DTYPE_F32, nd, shape);
    if (!out) return NULL;
    int64_t st[3][CM_MAX_DIMS];
    memcpy(st[0], out->stride, sizeof(int64_t) * (size_t)nd);
    cmi_broadcast_strides(a, nd, shape, st[1]);
    cmi_broadcast_strides(b, nd, shape, st[2]);
    const cmi_backend *be = cmi_be(tp);
    if (be) {
        if (cmi_dev_fail(tp, be->binary((cmi_bin_op)op, cmi_f32(out), cmi_f32(a), st[1], cmi_f32(b), st[2], nd, shape),
                         name))
            return NULL;
    } else {
        char *bases[3] = {(char *)out->data, (char *)a->data, (char *)b->data};
        size_t es[3] = {4, 4, 4};
        cmi_iterate(nd, shape, 3, st, bases, es, true, bin_row, &op);
    }
    if (cmi_needs_grad(tp, 2, ins)) {
        cm_node *n = cmi_record(tp, name, out, 2, ins, bin_backward, 0);
        if (!n) return NULL;
        n->i[0] = op;
    }
    return out;
}

cm_tensor *cm_add(cm_tape *tp, cm_tensor *a, cm_tensor *b) { return binary(tp, BIN_ADD, a, b); }
cm_tensor *cm_sub(cm_tape *tp, cm_tensor *a, cm_tensor *b) { return binary(tp, BIN_SUB, a, b); }
cm_tensor *cm_mul(cm_tape *tp, cm_tensor *a, cm_tensor *b) { return binary(tp, BIN_MUL, a, b); }
cm_tensor *cm_div(cm_tape *tp, cm_tensor *a, cm_tensor *b) { return binary(tp, BIN_DIV, a, b); }

/* ------------------------------------------------------------------------------------------ */
/* Unary ops                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/* The backend's op numbers (backend.h), so a device kernel gets the same code. */
typedef enum {
    UN_NEG = CMI_UN_NEG, UN_EXP = CMI_UN_EXP, UN_LOG = CMI_UN_LOG, UN_SQRT = CMI_UN_SQRT, UN_ABS = CMI_UN_ABS,
    UN_RELU = CMI_UN_RELU, UN_GELU_TANH = CMI_UN_GELU_TANH, UN_GELU_ERF = CMI_UN_GELU_ERF, UN_SILU = CMI_UN_SILU,
    UN_TANH = CMI_UN_TANH, UN_SIGMOID = CMI_UN_SIGMOID, UN_ADD_S = CMI_UN_ADD_S, UN_MUL_S = CMI_UN_MUL_S,
    UN_POW = CMI_UN_POW, UN_CLAMP = CMI_UN_CLAMP, UN_COUNT = CMI_UN_COUNT
} un_op;
static const char *const k_un_names[] = {"neg",  "exp",     "log",        "sqrt",       "abs",
                                         "relu", "gelu",    "gelu",       "silu",       "tanh",
                                         "sigmoid", "add_scalar", "mul_scalar", "pow", "clamp"};
_Static_assert(sizeof(k_un_names) / sizeof(k_un_names[0]) == UN_COUNT, "unary op table out of sync");

typedef struct {
    un_op op;
    float p0, p1;
} un_ctx;

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

static inline float gelu_tanh(float x) {
    float u = GELU_K * (x + GELU_C * x * x * x);
    return 0.5f * x * (1.0f + cmi_vtanhf(u));
}
static inline float gelu_tanh_grad(float x) {
    float u = GELU_K * (x + GELU_C * x * x * x);
    float t = cmi_vtanhf(u);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_C * x * x);
}
/* x·Φ(x) and its derivative Φ(x) + x·φ(x), Φ through cmi_vnormcdf (vectorised; precise in the
 * negative tail, where ½(1 + erf(x/√2)) cancels) */
static inline float gelu_erf(float x) { return x * cmi_vnormcdf(x); }
static inline float gelu_erf_grad(float x) {
    return cmi_vnormcdf(x) + x * cmi_vnormpdf(x);
}
static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

static void un_fwd_row(int64_t n, char *const *p, const int64_t *inner, void *vctx) {
    const un_ctx *c = vctx;
    float *o = (float *)p[0];
    const float *a = (const float *)p[1];
    const int64_t s = inner[1];
    const float p0 = c->p0, p1 = c->p1;
    switch (c->op) {
    case UN_NEG: for (int64_t i = 0; i < n; i++) o[i] = -a[i * s]; break;
    case UN_EXP: for (int64_t i = 0; i < n; i++) o[i] = expf(a[i * s]); break;
    case UN_LOG: for (int64_t i = 0; i < n; i++) o[i] = logf(a[i * s]); break;
    case UN_SQRT: for (int64_t i = 0; i < n; i++) o[i] = sqrtf(a[i * s]); break;
    case UN_ABS: for (int64_t i = 0; i < n; i++) o[i] = fabsf(a[i * s]); break;
    case UN_RELU: for (int64_t i = 0; i < n; i++) o[i] = a[i * s] > 0.0f ? a[i * s] : 0.0f; break;
    case UN_GELU_TANH: for (int64_t i = 0; i < n; i++) o[i] = gelu_tanh(a[i * s]); break;
    case UN_GELU_ERF: for (int64_t i = 0; i < n; i++) o[i] = gelu_erf(a[i * s]); break;
    case UN_SILU: for (int64_t i = 0; i < n; i++) o[i] = a[i * s] * sigmoidf(a[i * s]); break;
    case UN_TANH: for (int64_t i = 0; i < n; i++) o[i] = tanhf(a[i * s]); break;
    case UN_SIGMOID: for (int64_t i = 0; i < n; i++) o[i] = sigmoidf(a[i * s]); break;
    case UN_ADD_S: for (int64_t i = 0; i < n; i++) o[i] = a[i * s] + p0; break;
    case UN_MUL_S: for (int64_t i = 0; i < n; i++) o[i] = a[i * s] * p0; break;
    case UN_POW:
        if (p0 == 2.0f) for (int64_t i = 0; i < n; i++) o[i] = a[i * s] * a[i * s];
        else for (int64_t i = 0; i < n; i++) o[i] = powf(a[i * s], p0);
        break;
    case UN_CLAMP: for (int64_t i = 0; i < n; i++) o[i] = fminf(fmaxf(a[i * s], p0), p1); break;
    default: break;
    }
}

/* ga[i] += g[i] · f'(a[i], out[i]) */
static void un_bwd_row(int64_t n, char *const *p, const int64_t *inner, void *vctx) {
    const un_ctx *c = vctx;
    float *ga = (float *)p[0];
    const float *g = (const float *)p[1], *a = (const float *)p[2], *o = (const float *)p[3];
    const int64_t s = inner[2];
    const float p0 = c->p0, p1 = c->p1;
    switch (c->op) {
    case UN_NEG: for (int64_t i = 0; i < n; i++) ga[i] -= g[i]; break;
    case UN_EXP: for (int64_t i = 0; i < n; i++) ga[i] += g[i] * o[i]; break;
    case UN_LOG: for (int64_t i = 0; i < n; i++) ga[i] += g[i] / a[i * s]; break;
    case UN_SQRT: for (int64_t i = 0; i < n; i++) ga[i] += g[i] * 0.5f / o[i]; break;
    case UN_ABS:
        for (int64_t i = 0; i < n; i++) ga[i] += a[i * s] > 0.0f ? g[i] : (a[i * s] < 0.0f ? -g[i] : 0.0f);
        break;
    case UN_RELU: for (int64_t i = 0; i < n; i++) ga[i] += a[i * s] > 0.0f ? g[i] : 0.0f; break;
    case UN_GELU_TANH: for (int64_t i = 0; i < n; i++) ga[i] += g[i] * gelu_tanh_grad(a[i * s]); break;
    case UN_GELU_ERF: for (int64_t i = 0; i < n; i++) ga[i] += g[i] * gelu_erf_grad(a[i * s]); break;
    case UN_SILU:
        for (int64_t i = 0; i < n; i++) {
            float x = a[i * s], sg = sigmoidf(x);
            ga[i] += g[i] * sg * (1.0f + x * (1.0f - sg));
        }
        break;
    case UN_TANH: for (int64_t i = 0; i < n; i++) ga[i] += g[i] * (1.0f - o[i] * o[i]); break;
    case UN_SIGMOID: for (int64_t i = 0; i < n; i++) ga[i] += g[i] * o[i] * (1.0f - o[i]); break;
    case UN_ADD_S: for (int64_t i = 0; i < n; i++) ga[i] += g[i]; break;
    case UN_MUL_S: for (int64_t i = 0; i < n; i++) ga[i] += g[i] * p0; break;
    case UN_POW:
        if (p0 == 2.0f) for (int64_t i = 0; i < n; i++) ga[i] += g[i] * 2.0f * a[i * s];
        else for (int64_t i = 0; i < n; i++) ga[i] += g[i] * p0 * powf(a[i * s], p0 - 1.0f);
        break;
    case UN_CLAMP:
        for (int64_t i = 0; i < n; i++) ga[i] += (a[i * s] >= p0 && a[i * s] <= p1) ? g[i] : 0.0f;
        break;
    default: break;
    }
}

static cm_status un_backward(cm_tape *tp, cm_node *n, const cm_tensor *g) {
    cm_tensor *a = n->in[0];
    cm_tensor *ga = cmi_grad(tp, a);
    if (!ga) return cmi_status(tp);
    un_ctx c = {(un_op)n->i[0], (float)n->f[0], (float)n->f[1]};
    const cmi_backend *be = cmi_be(tp);
    if (be)
        return cmi_dev_fail(tp,
                            be->unary_bwd((cmi_un_op)c.op, c.p0, c.p1, cmi_f32(ga), cmi_f32(g), cmi_f32(a), a->stride,
                                          cmi_f32(n->out), a->ndim, a->shape),
                            "unary backward")
                   ? cmi_status(tp)
                   : CM_OK;
    int64_t st[4][CM_MAX_DIMS];
    cmi_contig_strides(a->ndim, a->shape, st[0]);
    cmi_contig_strides(a->ndim, a->shape, st[1]);
    memcpy(st[2], a->stride, sizeof(int64_t) * (size_t)a->ndim);
    cmi_contig_strides(a->ndim, a->shape, st[3]);
    char *bases[4] = {(char *)ga->data, (char *)g->data, (char *)a->data, (char *)n->out->data};
    size_t es[4] = {4, 4, 4, 4};
    cmi_iterate(a->ndim, a->shape, 4, st, bases, es, true, un_bwd_row, &c);
    return cmi_status(tp);
}

static cm_tensor *unary(cm_tape *tp, un_op op, cm_tensor *a, float p0, float p1) {
    const char *name = k_un_names[op];
    if (!cmi_begin(tp, name, 1, &a)) return NULL;
    if (!cmi_check_f32(tp, name, "input", a)) return NULL;
    cm_tensor *out = cmi_new(tp, CM_DTYPE_F32, a->ndim, a->shape);
    if (!out) return NULL;
    un_ctx c = {op, p0, p1};
    const cmi_backend *be = cmi_be(tp);
    if (be) {
        if (cmi_dev_fail(tp, be->unary((cmi_un_op)op, p0, p1, cmi_f32(out), cmi_f32(a), a->stride, a->ndim, a->shape),
                         name))
            return NULL;
    } else {
        int64_t st[2][CM_MAX_DIMS];
        memcpy(st[0], out->stride, sizeof(int64_t) * (size_t)a->ndim);
        memcpy(st[1], a->stride, sizeof(int64_t) * (size_t)a->ndim);
        char *bases[2] = {(char *)out->data, (char *)a->data};
        size_t es[2] = {4, 4};
        cmi_iterate(a->ndim, a->shape, 2, st, bases, es, true, un_fwd_row, &c);
    }
    if (cmi_needs_grad(tp, 1, &a)) {
        cm_node *n = cmi_record(tp, name, out, 1, &a, un_backward, 0);
        if (!n) return NULL;
        n->i[0] = op;
        n->f[0] = p0;
        n->f[1] = p1;
    }
    return out;
}

cm_tensor *cm_neg(cm_tape *tp, cm_tensor *a) { return unary(tp, UN_NEG, a, 0, 0); }
cm_tensor *cm_exp(cm_tape *tp, cm_tensor *a) { return unary(tp, UN_EXP, a, 0, 0); }
cm_tensor *cm_log(cm_tape *tp, cm_tensor *a) { return unary(tp, UN_LOG, a, 0, 0); }
cm_tensor *cm_sqrt(cm_tape *tp, cm_tensor *a) { return unary(tp, UN_SQRT, a, 0, 0); }
cm_tensor *cm_abs(cm_tape *tp, cm_tensor *a) { return unary(tp, UN_ABS, a, 0, 0); }
cm_tensor *cm_relu(cm_tape *tp, cm_tensor *a) { return unary(tp, UN_RELU, a, 0, 0); }
cm_tensor *cm_gelu(cm_tape *tp, cm_tensor *a, bool approximate) {
    return unary(tp, approximate ? UN_GELU_TANH : UN_GELU_ERF, a, 0, 0);
}
cm_tensor *cm_silu(cm_tape *tp, cm_tensor *a) { return unary(tp, UN_SILU, a, 0, 0); }
cm_tensor *cm_tanh(cm_tape *tp, cm_tensor *a) { return unary(tp, UN_TANH, a, 0, 0); }
cm_tensor *cm_sigmoid(cm_tape *tp, cm_tensor *a) { return unary(tp, UN_SIGMOID, a, 0, 0); }
cm_tensor *cm_add_scalar(cm_tape *tp, cm_tensor *a, float s) { return unary(tp, UN_ADD_S, a, s, 0); }
cm_tensor *cm_mul_scalar(cm_tape *tp, cm_tensor *a, float s) { return unary(tp, UN_MUL_S, a, s, 0); }
cm_tensor *cm_pow(cm_tape *tp, cm_tensor *a, float e) { return unary(tp, UN_POW, a, e, 0); }
cm_tensor *cm_clamp(cm_tape *tp, cm_tensor *a, float lo, float hi) {
    if (tp && tp->status == CM_OK && lo > hi) {
        cmi_fail(tp, CM_ERR_INVALID_ARG, "clamp: lo %g is greater than hi %g", (double)lo, (double)hi);
        return NULL;
    }
    return unary(tp, UN_CLAMP, a, lo, hi);
}

/* ------------------------------------------------------------------------------------------ */
/* Fused bias + GELU: out = gelu(x + bias), x (..., C) made contiguous, bias (C)                */
/* ------------------------------------------------------------------------------------------ */

/* One row of bias_gelu's backward with derivative GRAD: dx = g·GRAD(x + b) written (fresh) or added
 * into gxr when there is one, and summed into gb_local when there is one. */
#define BIAS_GELU_BWD_ROW(GRAD)                                                                            \
    do {                                                                                                   \
        if (gxr && gb_local && fresh) {                                                                    \
            _Pragma("omp simd") for (int64_t c = 0; c < C; c++) {                                          \
                const float d = gr[c] * GRAD(xr[c] + bv[c]);                                               \
                gxr[c] = d;                                                                                \
                gb_local[c] += d;                                                                          \
            }                                                                                              \
        } else if (gxr && gb_local) {                                                                      \
            _Pragma("omp simd") for (int64_t c = 0; c < C; c++) {                                          \
                const float d = gr[c] * GRAD(xr[c] + bv[c]);                                               \
                gxr[c] += d;                                                                               \
                gb_local[c] += d;                                                                          \
            }                                                                                              \
        } else if (gxr && fresh) {                                                                         \
            _Pragma("omp simd") for (int64_t c = 0; c < C; c++) gxr[c] = gr[c] * GRAD(xr[c] + bv[c]);     \
        } else if (gxr) {                                                                                  \
            _Pragma("omp simd") for (int64_t c = 0; c < C; c++) gxr[c] += gr[c] * GRAD(xr[c] + bv[c]);    \
        } else if (gb_local) {                                                                             \
            _Pragma("omp simd") for (int64_t c = 0; c < C; c++) gb_local[c] += gr[c] * GRAD(xr[c] + bv[c]); \
        }                                                                                                  \
    } while (0)

static cm_status bias_gelu_backward(cm_tape *tp, cm_node *n, const cm_tensor *g) {
    cm_tensor *x = n->in[0], *b = n->in[1];
    const bool approx = n->i[0];
    const int64_t C = b->shape[0], rows = cm_tensor_numel(x) / (C ? C : 1);
    bool fresh = false; /* a gradient of x created now is written, not zeroed and added to */
    cm_tensor *gx = cmi_grad_for_write(tp, x, &fresh);
    cm_tensor *gb = cmi_grad(tp, b);
    if (cmi_status(tp)) return cmi_status(tp);
    const float *xv = cmi_f32(x), *bv = cmi_f32(b), *gv = cmi_f32(g);
    const cmi_backend *be = cmi_be(tp);
    if (be) {
        cmi_dev_fail(tp,
                     be->bias_gelu_bwd(xv, bv, gv, gx ? cmi_f32(gx) : NULL, fresh, gb ? cmi_f32(gb) : NULL, rows, C,
                                       approx),
                     "bias_gelu backward");
        return cmi_status(tp);
    }
    /* dx is needed for db too; write it into gx directly when we have it, else a scratch row. */
    float *gbv = gb ? cmi_f32(gb) : NULL;
    float *gxv = gx ? cmi_f32(gx) : NULL;
    const int nth = (rows * C >= CMI_PAR_MIN) ? cm_num_threads() : 1;
    float *partial = NULL; /* per-thread partial sums of db, from the arena */
    if (gbv) {
        partial = cmi_scratch(tp, sizeof(float) * (size_t)(C * nth));
        if (!partial) return cmi_status(tp);
        memset(partial, 0, sizeof(float) * (size_t)(C * nth));
    }
#pragma omp parallel num_threads(nth)
    {
        float *gb_local = partial ? partial + (int64_t)omp_get_thread_num() * C : NULL;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = xv + r * C, *gr = gv + r * C;
            float *gxr = gxv ? gxv + r * C : NULL;
            /* one branch-free loop per case, so GCC vectorises each (cmi_vtanhf, cmi_vnormcdf and
             * cmi_vnormpdf are inline) */
            if (approx) BIAS_GELU_BWD_ROW(gelu_tanh_grad);
            else BIAS_GELU_BWD_ROW(gelu_erf_grad);
        }
    }
    if (partial)
        for (int t = 0; t < nth; t++)
            for (int64_t c = 0; c < C; c++) gbv[c] += partial[(int64_t)t * C + c];
    return cmi_status(tp);
}

cm_tensor *cm_bias_gelu(cm_tape *tp, cm_tensor *x, cm_tensor *bias, bool approximate) {
    cm_tensor *ins[2] = {x, bias};
    if (!cmi_begin(tp, "bias_gelu", 2, ins)) return NULL;
    if (!cmi_check_f32(tp, "bias_gelu", "x", x) || !cmi_check_f32(tp, "bias_gelu", "bias", bias)) return NULL;
    if (bias->ndim != 1 || x->ndim < 1 || x->shape[x->ndim - 1] != bias->shape[0]) {
        cmi_fail(tp, CM_ERR_SHAPE, "bias_gelu: bias %s must be 1-d with the last dim of x %s", cmi_shape(bias),
                 cmi_shape(x));
        return NULL;
    }
    x = cm_contiguous(tp, x);
    bias = cm_contiguous(tp, bias);
    if (!x || !bias) return NULL;
    ins[0] = x;
    ins[1] = bias;
    cm_tensor *out = cmi_new(tp, CM_DTYPE_F32, x->ndim, x->shape);
    if (!out) return NULL;
    const int64_t C = bias->shape[0];
    int64_t rows = C ? cm_tensor_numel(x) / C : 0;
    const float *xv = cmi_f32(x), *bv = cmi_f32(bias);
    float *ov = cmi_f32(out);
    const cmi_backend *be = cmi_be(tp);
    if (be) {
        if (cmi_dev_fail(tp, be->bias_gelu(xv, bv, ov, rows, C, approximate), "bias_gelu")) return NULL;
        rows = 0; /* nothing left for the CPU loop */
    }
#pragma omp parallel for if (rows * C >= CMI_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        if (approximate) {
#pragma omp simd
            for (int64_t c = 0; c < C; c++) ov[r * C + c] = gelu_tanh(xv[r * C + c] + bv[c]);
        } else {
#pragma omp simd
            for (int64_t c = 0; c < C; c++) ov[r * C + c] = gelu_erf(xv[r * C + c] + bv[c]);
        }
    }
    if (cmi_needs_grad(tp, 2, ins)) {
        cm_node *n = cmi_record(tp, "bias_gelu", out, 2, ins, bias_gelu_backward, 0);
        if (!n) return NULL;
        n->i[0] = approximate;
    }
    return out;
}
