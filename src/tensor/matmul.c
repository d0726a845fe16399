/* Matrix multiplication (batched, broadcasting) and the linear layer, forward and backward.
 *
 * f32 × f32 runs on cmi_sgemm (OpenBLAS, or oneDNN's sgemm on AVX-512: see dnnl_gemm.h), bf16 × bf16
 * on oneDNN (dnnl_gemm.c) with f32 accumulation and an f32 result. A matrix whose last two dims are row-major or column-major
 * (a transposed view) goes to the GEMM as it is, with CblasTrans for the latter; only other layouts
 * are copied (cm_contiguous, so gradients still flow through the copy).
 *
 * bf16 backward: like autocast, the backward GEMMs run in bf16 too — the upstream gradient (f32)
 * is rounded to bf16 in arena scratch and multiplied with the saved bf16 operands, accumulating in
 * f32 straight into the f32 gradient buffers.
 *
 * Every GEMM in a backward pass accumulates into the gradient buffer with beta = 1 (the buffers
 * start at zero), so there are no temporaries and broadcast batch dims sum for free. */
#include "tensor/backend.h"
#include "tensor/dnnl_gemm.h"
#include "tensor/tensor_impl.h"

#include <cblas.h>
#include <limits.h>
#include <omp.h>

/* ------------------------------------------------------------------------------------------ */
/* Operands as the GEMM sees them                                                              */
/* ------------------------------------------------------------------------------------------ */

/* A matrix operand: element (i, j) of the logical matrix is at p[t ? j·ld + i : i·ld + j] (in
 * elements of the operand's dtype). bs: strides of the batch dims (0 where broadcast). */
typedef struct {
    char *p;
    int64_t ld;
    bool t;
    int64_t bs[CM_MAX_DIMS];
} mat;

static mat mat_trans(mat m) {
    m.t = !m.t;
    return m;
}

/* BLAS layout of a (rows, cols) matrix with strides (sr, sc): row-major with ld ≥ cols, or
 * column-major (a transposed view) with ld ≥ rows. False for anything else (broadcast or
 * interleaved strides), which the caller copies. Strides of size-1 dims do not matter. */
static bool mat_layout(int64_t rows, int64_t cols, int64_t sr, int64_t sc, int64_t *ld, bool *t) {
    const int64_t r1 = rows > 1 ? rows : 1, c1 = cols > 1 ? cols : 1;
    if ((sc == 1 || cols <= 1) && (rows <= 1 || sr >= c1)) {
        *t = false;
        *ld = rows <= 1 ? c1 : sr;
        return true;
    }
    if ((sr == 1 || rows <= 1) && (cols <= 1 || sc >= r1)) {
        *t = true;
        *ld = cols <= 1 ? r1 : sc;
        return true;
    }
    return false;
}

static bool last2_ok(const cm_tensor *x) {
    int64_t ld;
    bool t;
    const int nd = x->ndim;
    return mat_layout(x->shape[nd - 2], x->shape[nd - 1], x->stride[nd - 2], x->stride[nd - 1], &ld, &t);
}

/* True when all dims but the last fold into one row index with a single row stride (row-major
 * rows): x is then a (rows, cols) matrix with leading dim *ld — one GEMM over every row. */
static bool rows_fold(const cm_tensor *x, int64_t *rows, int64_t *ld) {
    const int nd = x->ndim;
    const int64_t cols = nd ? x->shape[nd - 1] : 1;
    if (nd && cols > 1 && x->stride[nd - 1] != 1) return false;
    int64_t r = 1, rs = -1, expect = 0;
    for (int d = nd - 2; d >= 0; d--) {
        r *= x->shape[d];
        if (x->shape[d] == 1) continue;
        if (rs < 0) {
            rs = x->stride[d];
            expect = rs * x->shape[d];
        } else if (x->stride[d] != expect) {
            return false;
        } else {
            expect *= x->shape[d];
        }
    }
    const int64_t c1 = cols > 1 ? cols : 1;
    if (r == 0 || rs < 0) rs = c1;
    if (rs < c1) return false;
    *rows = r;
    *ld = rs;
    return true;
}

/* ------------------------------------------------------------------------------------------ */
/* GEMM dispatch                                                                               */
/* ------------------------------------------------------------------------------------------ */

static bool fits_blas(cm_tape *tp, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc) {
    if (M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX) return true;
    cmi_fail(tp, CM_ERR_UNSUPPORTED, "matmul: GEMM of M=%lld N=%lld K=%lld exceeds the 32-bit BLAS interface",
             (long long)M, (long long)N, (long long)K);
    return false;
}

/* C (M, N), rows ldc apart, = op(A) (M, K) · op(B) (K, N) [+ bias (N)] [+ C when acc].
 * A and B have dtype dt (f32 or bf16); C and bias are f32. */
static cm_status gemm(cm_tape *tp, cm_dtype dt, int64_t M, int64_t N, int64_t K, const char *a, int64_t lda, bool ta,
                      const char *b, int64_t ldb, bool tb, const float *bias, bool acc, float *c, int64_t ldc) {
    if (M == 0 || N == 0) return CM_OK;
    const cmi_backend *be = cmi_be(tp);
    if (be)
        return cmi_dev_fail(tp, be->gemm(dt, M, N, K, a, lda, ta, b, ldb, tb, bias, acc, c, ldc, 1, 0, 0, 0), "matmul")
                   ? cmi_status(tp)
                   : CM_OK;
    if (K == 0 || (bias && dt == CM_DTYPE_F32)) {
        /* The bias goes into C first and the GEMM adds onto it (beta = 1): one pass over C. */
#pragma omp parallel for schedule(static) if (M * N > CMI_PAR_MIN)
        for (int64_t i = 0; i < M; i++) {
            float *row = c + i * ldc;
            if (!acc) memset(row, 0, sizeof(float) * (size_t)N);
            if (bias)
                for (int64_t j = 0; j < N; j++) row[j] += bias[j];
        }
        if (K == 0) return CM_OK;
        acc = true;
        bias = NULL;
    }
    if (dt == CM_DTYPE_BF16)
        return cmi_gemm_bf16(tp, M, N, K, (const uint16_t *)a, lda, ta, (const uint16_t *)b, ldb, tb, bias, acc, c, ldc);
    if (!fits_blas(tp, M, N, K, lda, ldb, ldc)) return cmi_status(tp);
    cmi_sgemm(ta, tb, M, N, K, 1.0f, (const float *)a, lda, (const float *)b, ldb, acc ? 1.0f : 0.0f, c, ldc);
    return CM_OK;
}

cm_status cmi_gemm(cm_tape *tp, cm_dtype dt, int64_t M, int64_t N, int64_t K, const char *a, int64_t lda, bool ta,
                   const char *b, int64_t ldb, bool tb, const float *bias, bool acc, float *c, int64_t ldc) {
    return gemm(tp, dt, M, N, K, a, lda, ta, b, ldb, tb, bias, acc, c, ldc);
}

/* Batched GEMM over the batch shape (nbd dims, nb entries): C_i = op(A_i)·op(B_i) (+ C_i when acc),
 * C_i at c + Σ idx·cbs. Small f32 problems run one GEMM per thread (OpenBLAS then runs
 * single-threaded inside our parallel region); that is only done when no two batch entries write
 * the same C (cbs has no 0 on a dim of size > 1). */
static cm_status gemm_batched(cm_tape *tp, cm_dtype dt, int nbd, const int64_t *bshape, int64_t nb, int64_t M,
                              int64_t N, int64_t K, const mat *A, const mat *B, float *c, int64_t ldc,
                              const int64_t *cbs, bool acc) {
    const size_t es = cm_dtype_size(dt);
    bool distinct = true;
    for (int d = 0; d < nbd; d++)
        if (bshape[d] > 1 && cbs[d] == 0) distinct = false;
    const int nt = cm_num_threads();
    const double work = (double)M * (double)N * (double)K;
    const bool par = dt == CM_DTYPE_F32 && distinct && nt > 1 && !omp_in_parallel() && !cmi_be(tp) &&
                     (nb >= 4 * nt || (nb >= nt && work < 2097152.0));
    if (nb == 0 || M == 0 || N == 0) return CM_OK;
    const cmi_backend *be = cmi_be(tp);
    if (be) {
        /* One strided-batched GEMM when every operand's batch offset is entry · stride, and no two
         * entries write the same C (they run concurrently); else one GEMM per entry, in order. */
        int64_t s3[3] = {0, 0, 0}, n1 = 0;
        bool uniform = distinct;
        for (int d = nbd - 1; d >= 0 && uniform; d--) {
            if (bshape[d] == 1) continue;
            const int64_t sd[3] = {A->bs[d], B->bs[d], cbs[d]};
            if (n1 == 0) {
                for (int k = 0; k < 3; k++) s3[k] = sd[k];
                n1 = bshape[d];
            } else {
                for (int k = 0; k < 3; k++)
                    if (sd[k] != s3[k] * n1) uniform = false;
                n1 *= bshape[d];
            }
        }
        if (uniform)
            return cmi_dev_fail(tp,
                                be->gemm(dt, M, N, K, A->p, A->ld, A->t, B->p, B->ld, B->t, NULL, acc, c, ldc, nb,
                                         s3[0], s3[1], s3[2]),
                                "matmul")
                       ? cmi_status(tp)
                       : CM_OK;
    }
    if (dt == CM_DTYPE_F32 && !be && !fits_blas(tp, M, N, K, A->ld, B->ld, ldc)) return cmi_status(tp);
    /* From here only the bf16 path can fail, and it never runs in parallel. */
    cm_status st = CM_OK;
#pragma omp parallel for schedule(dynamic, 1) if (par)
    for (int64_t i = 0; i < nb; i++) {
        if (!par && st) continue;
        int64_t oa = 0, ob = 0, oc = 0, rem = i;
        for (int d = nbd - 1; d >= 0; d--) {
            int64_t ix = rem % bshape[d];
            rem /= bshape[d];
            oa += ix * A->bs[d];
            ob += ix * B->bs[d];
            oc += ix * cbs[d];
        }
        cm_status s = gemm(tp, dt, M, N, K, A->p + oa * (int64_t)es, A->ld, A->t, B->p + ob * (int64_t)es, B->ld, B->t,
                           NULL, acc, c + oc, ldc);
        if (s && !par) st = s;
    }
    return st ? st : cmi_status(tp);
}

/* The upstream gradient rounded to bf16 in arena scratch, for the bf16 backward GEMMs. */
static const char *to_bf16(cm_tape *tp, const cm_tensor *g) {
    const int64_t n = cm_tensor_numel(g);
    uint16_t *h = cmi_dev_scratch(tp, sizeof(uint16_t) * (size_t)(n ? n : 1));
    if (!h) return NULL;
    const cmi_backend *be = cmi_be(tp);
    if (be) {
        if (cmi_dev_fail(tp, be->copy(h, CM_DTYPE_BF16, NULL, g->data, CM_DTYPE_F32, NULL, 1, &n), "matmul backward"))
            return NULL;
    } else {
        cmi_bf16_round(h, cmi_f32(g), n);
    }
    return (const char *)h;
}

/* Matching dtypes, f32 or bf16; the op name for messages. */
static bool check_pair(cm_tape *tp, const char *op, const char *na, const cm_tensor *a, const char *nb,
                       const cm_tensor *b) {
    if (a->dtype != b->dtype) {
        cmi_fail(tp, CM_ERR_DTYPE, "%s: dtypes differ: %s %s is %s, %s %s is %s (cast one with cm_cast)", op, na,
                 cmi_shape(a), cm_dtype_name(a->dtype), nb, cmi_shape(b), cm_dtype_name(b->dtype));
        return false;
    }
    if (a->dtype != CM_DTYPE_F32 && a->dtype != CM_DTYPE_BF16) {
        cmi_fail(tp, CM_ERR_DTYPE, "%s: dtype %s is not supported (f32 or bf16; cast with cm_cast)", op,
                 cm_dtype_name(a->dtype));
        return false;
    }
    return true;
}

/* ------------------------------------------------------------------------------------------ */
/* matmul: a (..., M, K) · b (..., K, N) → (..., M, N)                                         */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    int nbd;                        /* batch dims of the result */
    int64_t bshape[CM_MAX_DIMS];    /* batch shape (broadcast of a's and b's) */
    int64_t nb;                     /* batch entries */
    int64_t M, N, K;
    mat A, B;                       /* operands with broadcast batch strides */
    int64_t ga_bs[CM_MAX_DIMS];     /* batch strides into a's (contiguous) gradient, 0 where broadcast */
    int64_t gb_bs[CM_MAX_DIMS];
    bool fold;                      /* b has one batch entry and a's rows fold: one GEMM of nb·M rows */
} mm_plan;

/* Batch strides of t (batch dims = all but the last two) broadcast to the plan's batch shape;
 * `strides` are t's own or its contiguous gradient's. */
static void batch_strides(const cm_tensor *t, const int64_t *strides, int nbd, const int64_t *bshape, int64_t *out) {
    const int tb = t->ndim - 2, lead = nbd - tb;
    for (int d = 0; d < nbd; d++) {
        int s = d - lead;
        out[d] = (s < 0 || (t->shape[s] == 1 && bshape[d] != 1)) ? 0 : strides[s];
    }
}

/* Shapes must already be checked; both last-two layouts must pass mat_layout. */
static void mm_plan_make(const cm_tensor *a, const cm_tensor *b, mm_plan *p) {
    memset(p, 0, sizeof *p);
    const int na = a->ndim, nbn = b->ndim;
    cmi_broadcast_shapes(na - 2, a->shape, nbn - 2, b->shape, &p->nbd, p->bshape);
    p->nb = cmi_numel(p->nbd, p->bshape);
    p->M = a->shape[na - 2], p->K = a->shape[na - 1], p->N = b->shape[nbn - 1];
    mat_layout(p->M, p->K, a->stride[na - 2], a->stride[na - 1], &p->A.ld, &p->A.t);
    mat_layout(p->K, p->N, b->stride[nbn - 2], b->stride[nbn - 1], &p->B.ld, &p->B.t);
    p->A.p = a->data;
    p->B.p = b->data;
    batch_strides(a, a->stride, p->nbd, p->bshape, p->A.bs);
    batch_strides(b, b->stride, p->nbd, p->bshape, p->B.bs);
    int64_t gs[CM_MAX_DIMS];
    cmi_contig_strides(na, a->shape, gs);
    batch_strides(a, gs, p->nbd, p->bshape, p->ga_bs);
    cmi_contig_strides(nbn, b->shape, gs);
    batch_strides(b, gs, p->nbd, p->bshape, p->gb_bs);
    int64_t rows, ld;
    if (cmi_numel(nbn - 2, b->shape) == 1 && cmi_numel(na - 2, a->shape) == p->nb && !p->A.t && rows_fold(a, &rows, &ld)) {
        p->fold = true;
        p->A.ld = ld;
    }
}

static cm_status matmul_backward(cm_tape *tp, cm_node *n, const cm_tensor *gout) {
    cm_tensor *a = n->in[0], *b = n->in[1];
    cm_tensor *ga = cmi_grad(tp, a), *gb = cmi_grad(tp, b);
    if (!ga && !gb) return cmi_status(tp);
    mm_plan p;
    mm_plan_make(a, b, &p);
    const cm_dtype dt = a->dtype;
    mat G = {.p = (char *)gout->data, .ld = p.N, .t = false}; /* dC (batch, M, N), contiguous */
    /* the bf16 copy of dC is scratch for this call only (the gradients above were allocated before
     * the mark, so the rewind at the end frees nothing else) */
    cm_arena *arena = cmi_op_arena(tp);
    const size_t mark = cm_arena_mark(arena);
    if (dt == CM_DTYPE_BF16 && !(G.p = (char *)to_bf16(tp, gout))) return cmi_status(tp);
    cmi_contig_strides(p.nbd, p.bshape, G.bs);
    for (int d = 0; d < p.nbd; d++) G.bs[d] *= p.M * p.N;
    cm_status st = CM_OK;
    if (p.fold) {
        const int64_t R = p.nb * p.M; /* all rows of a */
        if (ga) /* dA (R, K) += dC (R, N) · Bᵀ */
            st = gemm(tp, dt, R, p.K, p.N, G.p, G.ld, false, p.B.p, p.B.ld, !p.B.t, NULL, true, cmi_f32(ga), p.K);
        if (!st && gb) /* dB (K, N) += Aᵀ (K, R) · dC (R, N) */
            st = gemm(tp, dt, p.K, p.N, R, p.A.p, p.A.ld, !p.A.t, G.p, G.ld, false, NULL, true, cmi_f32(gb), p.N);
        cm_arena_rewind(arena, mark);
        return st ? st : cmi_status(tp);
    }
    if (ga) { /* dA_i (M, K) += dC_i (M, N) · B_iᵀ, summed where a was broadcast */
        mat Bt = mat_trans(p.B);
        st = gemm_batched(tp, dt, p.nbd, p.bshape, p.nb, p.M, p.K, p.N, &G, &Bt, cmi_f32(ga), p.K, p.ga_bs, true);
    }
    if (!st && gb) { /* dB_i (K, N) += A_iᵀ (K, M) · dC_i (M, N) */
        mat At = mat_trans(p.A);
        st = gemm_batched(tp, dt, p.nbd, p.bshape, p.nb, p.K, p.N, p.M, &At, &G, cmi_f32(gb), p.N, p.gb_bs, true);
    }
    cm_arena_rewind(arena, mark);
    return st ? st : cmi_status(tp);
}

cm_tensor *cm_matmul(cm_tape *tp, cm_tensor *a, cm_tensor *b) {
    cm_tensor *ins[2] = {a, b};
    if (!cmi_begin(tp, "matmul", 2, ins)) return NULL;
    if (tp->autocast == CM_DTYPE_BF16) { /* mixed precision: recorded casts, so f32 leaves get f32 grads */
        if (a->dtype == CM_DTYPE_F32 && !(a = cm_cast(tp, a, CM_DTYPE_BF16))) return NULL;
        if (b->dtype == CM_DTYPE_F32 && !(b = cm_cast(tp, b, CM_DTYPE_BF16))) return NULL;
        ins[0] = a, ins[1] = b;
    }
    if (!check_pair(tp, "matmul", "a", a, "b", b)) return NULL;
    if (a->ndim < 2 || b->ndim < 2) {
        cmi_fail(tp, CM_ERR_SHAPE, "matmul: a %s and b %s need at least 2 dims each (unsqueeze a vector to (1, K) or (K, 1))",
                 cmi_shape(a), cmi_shape(b));
        return NULL;
    }
    if (a->shape[a->ndim - 1] != b->shape[b->ndim - 2]) {
        cmi_fail(tp, CM_ERR_SHAPE, "matmul: inner dims differ: a %s vs b %s", cmi_shape(a), cmi_shape(b));
        return NULL;
    }
    int nbd;
    int64_t shape[CM_MAX_DIMS];
    if (!cmi_broadcast_shapes(a->ndim - 2, a->shape, b->ndim - 2, b->shape, &nbd, shape)) {
        cmi_fail(tp, CM_ERR_SHAPE, "matmul: batch dims do not broadcast: a %s vs b %s", cmi_shape(a), cmi_shape(b));
        return NULL;
    }
    if (!last2_ok(a) && !(a = cm_contiguous(tp, a))) return NULL;
    if (!last2_ok(b) && !(b = cm_contiguous(tp, b))) return NULL;
    ins[0] = a, ins[1] = b;

    mm_plan p;
    mm_plan_make(a, b, &p);
    shape[nbd] = p.M;
    shape[nbd + 1] = p.N;
    cm_tensor *out = cmi_new(tp, CM_DTYPE_F32, nbd + 2, shape); // (..., M, N)
    if (!out) return NULL;
    cm_status st;
    if (p.fold)
        st = gemm(tp, a->dtype, p.nb * p.M, p.N, p.K, p.A.p, p.A.ld, false, p.B.p, p.B.ld, p.B.t, NULL, false,
                  cmi_f32(out), p.N);
    else {
        int64_t cbs[CM_MAX_DIMS];
        cmi_contig_strides(nbd, p.bshape, cbs);
        for (int d = 0; d < nbd; d++) cbs[d] *= p.M * p.N;
        st = gemm_batched(tp, a->dtype, nbd, p.bshape, p.nb, p.M, p.N, p.K, &p.A, &p.B, cmi_f32(out), p.N, cbs, false);
    }
    if (st) return NULL;
    if (cmi_needs_grad(tp, 2, ins) && !cmi_record(tp, "matmul", out, 2, ins, matmul_backward, 0)) return NULL;
    return out;
}

/* ------------------------------------------------------------------------------------------ */
/* linear: x (..., in) · wᵀ (in, out) + bias (out) → (..., out)                                 */
/* ------------------------------------------------------------------------------------------ */

/* x as a (rows, in) matrix: folded row-major rows, or a 2-D transposed view. */
static bool x_layout(const cm_tensor *x, int64_t *rows, int64_t *ld, bool *t) {
    if (rows_fold(x, rows, ld)) {
        *t = false;
        return true;
    }
    if (x->ndim == 2 && mat_layout(x->shape[0], x->shape[1], x->stride[0], x->stride[1], ld, t)) {
        *rows = x->shape[0];
        return true;
    }
    return false;
}

/* What linear's backward multiplies: the operands as the forward used them, their layouts, and
 * where the gradients go (the node's inputs: for a transposed weight view its (in, out) base).
 * Under autocast an f32 operand was multiplied as a bf16 copy in arena scratch, freed right after
 * the GEMM: the backward makes the copy again from the node's input (xd / wd NULL) rather than
 * keeping every copy to the end of the step (GPT-2 124M: ~400 MiB of weights and inputs). */
typedef struct {
    cm_dtype dt;
    const char *xd, *wd;
    int64_t R, in_f, out_f, xld, wld;
    bool xt, wt, wbase;
} linear_ctx;

/* The bf16 copy of an f32 operand (contiguous, same shape), unrecorded, in arena scratch. */
static const char *bf16_copy(cm_tape *tp, cm_tensor *t) {
    const bool prev = tp->grad_enabled;
    tp->grad_enabled = false;
    cm_tensor *c = cm_cast(tp, t, CM_DTYPE_BF16);
    tp->grad_enabled = prev;
    return c ? (const char *)c->data : NULL;
}

const char *cmi_bf16_copy(cm_tape *tp, cm_tensor *t) { return bf16_copy(tp, t); }

const char *cmi_dev_rows_padded(cm_tape *tp, const cm_tensor *t, cm_dtype dt, int64_t rows_to, const char *op) {
    const cmi_backend *be = cmi_be(tp);
    const int64_t rows = t->shape[0], cols = t->shape[1], n = rows * cols, npad = (rows_to - rows) * cols, one = 1;
    const size_t es = cm_dtype_size(dt);
    char *p = cmi_dev_scratch(tp, es * (size_t)(rows_to * cols));
    if (!p || cmi_dev_fail(tp, be->copy(p, dt, NULL, t->data, t->dtype, NULL, 1, &n), op) ||
        cmi_dev_fail(tp, be->fill(p + es * (size_t)n, dt, 1, &npad, &one, 0.0), op))
        return NULL;
    return p;
}

/* Under autocast: an operand linear can take (f32, copied to bf16, or bf16 already). */
static bool float_operand(cm_tape *tp, const char *name, const cm_tensor *t) {
    if (t->dtype == CM_DTYPE_F32 || t->dtype == CM_DTYPE_BF16) return true;
    cmi_fail(tp, CM_ERR_DTYPE, "linear: %s %s has dtype %s; under autocast x and w are f32 or bf16", name, cmi_shape(t),
             cm_dtype_name(t->dtype));
    return false;
}

size_t cmi_linear_dy_block_device = CMI_LINEAR_DY_BLOCK_DEVICE;

static cm_status linear_backward(cm_tape *tp, cm_node *n, const cm_tensor *gout) {
    const linear_ctx *c = n->ctx;
    const cm_dtype dt = c->dt;
    const int64_t R = c->R, in_f = c->in_f, out_f = c->out_f;
    /* a new gradient of x is written by the dx GEMM (beta 0) rather than zeroed and added to */
    bool gx_fresh = false;
    cm_tensor *gx = n->in[0] == n->in[1] || n->in[0] == n->in[2] ? cmi_grad(tp, n->in[0])
                                                                  : cmi_grad_for_write(tp, n->in[0], &gx_fresh);
    cm_tensor *gw = cmi_grad(tp, n->in[1]), *gb = cmi_grad(tp, n->in[2]);
    cm_arena *arena = cmi_op_arena(tp);
    const size_t mark = cm_arena_mark(arena); /* bf16 copies and dy are scratch, as in matmul_backward */
    const cmi_backend *be = cmi_be(tp);
    const char *xd = c->xd, *wd = c->wd;
    /* On a GPU, bf16 rows of out_f values that are not whole 16-byte vectors (GPT-2's LM head:
     * 50257) would have matmul.cu pad every block's GEMMs — a zero-filled copy of dy for each, of w
     * for the input gradient's, and of all of dw (f32), filled, copied in and copied back, for the
     * weight gradient's. Padded once here instead, to op columns (a multiple of 8): w's bf16 copy
     * gets op - out_f zero rows, each block of dy is rounded into rows op apart whose last columns
     * stay zero, and the blocks' weight gradients add up in an (op, in) f32 scratch whose first
     * out_f rows are added to w's gradient at the end. */
    const bool padv = be && dt == CM_DTYPE_BF16 && out_f % 8 && !c->wbase && cmi_is_contig(n->in[1]) &&
                      (double)R * (double)out_f * (double)in_f >= 67108864.0;
    const int64_t op = padv ? (out_f + 7) / 8 * 8 : out_f; /* dy's and w's row count as the GEMMs see them */
    if (gw && !xd && !(xd = bf16_copy(tp, n->in[0]))) return cmi_status(tp);
    if (gx && padv) {
        if (!(wd = cmi_dev_rows_padded(tp, n->in[1], CM_DTYPE_BF16, op, "linear backward"))) return cmi_status(tp);
    } else if (gx && !wd && !(wd = bf16_copy(tp, n->in[1]))) {
        return cmi_status(tp);
    }
    float *gwp = NULL; /* (op, in): the padded weight gradient */
    if (gw && padv && !(gwp = cmi_dev_scratch(tp, sizeof(float) * (size_t)(op * in_f)))) return cmi_status(tp);
    const size_t es = cm_dtype_size(dt);
    /* rows of dy per block: all of them in f32 (dy is read in place), a bounded bf16 copy otherwise
     * (on a GPU a larger one, in equal blocks: each block is two GEMMs, and the weight gradient's
     * GEMM reads and writes all of dw) */
    int64_t rb = R;
    const size_t dy_block = be ? cmi_linear_dy_block_device : CMI_LINEAR_DY_BLOCK;
    if (dt == CM_DTYPE_BF16 && out_f > 0 && (size_t)(R * out_f) * 2 > dy_block) {
        rb = (int64_t)(dy_block / (2 * (size_t)out_f));
        if (be && rb > 0) { /* as many blocks as that needs, of equal size */
            const int64_t nb = (R + rb - 1) / rb;
            rb = (R + nb - 1) / nb;
        }
        rb = rb < 64 ? 64 : rb;
    }
    uint16_t *dyb = NULL;
    if ((gx || gw) && dt == CM_DTYPE_BF16 && !(dyb = cmi_dev_scratch(tp, 2 * (size_t)((rb < R ? rb : R) * op + 1))))
        return cmi_status(tp);
    if (dyb && padv) { /* the padding columns, zero for every block */
        const int64_t n_ = (rb < R ? rb : R) * op, one = 1;
        if (cmi_dev_fail(tp, be->fill(dyb, CM_DTYPE_BF16, 1, &n_, &one, 0.0), "linear backward")) return cmi_status(tp);
    }
    cm_status st = CM_OK;
    for (int64_t r0 = 0; r0 < R && !st && (gx || gw); r0 += rb) {
        const int64_t m = R - r0 < rb ? R - r0 : rb;
        const float *g = cmi_f32(gout) + r0 * out_f;
        const char *dy = (const char *)g; // (m, out), or (m, op) padded
        if (dyb) {
            const int64_t cnt = m * out_f, shape[2] = {m, out_f}, dst[2] = {op, 1}, src[2] = {out_f, 1};
            if (be) {
                if (cmi_dev_fail(tp, padv ? be->copy(dyb, CM_DTYPE_BF16, dst, g, CM_DTYPE_F32, src, 2, shape)
                                          : be->copy(dyb, CM_DTYPE_BF16, NULL, g, CM_DTYPE_F32, NULL, 1, &cnt),
                                 "linear"))
                    return cmi_status(tp);
            } else {
                cmi_bf16_round(dyb, g, cnt);
            }
            dy = (const char *)dyb;
        }
        /* x's rows r0.. (element (i, k) of the (R, in) matrix is at i·ld + k, or k·ld + i transposed) */
        const char *xr = xd ? xd + (size_t)(r0 * (c->xt ? 1 : c->xld)) * es : NULL;
        if (gx && padv) /* dx (m, in) += dy (m, op) · w (op, in), w's copy contiguous */
            st = gemm(tp, dt, m, in_f, op, dy, op, false, wd, in_f, false, NULL, !gx_fresh, cmi_f32(gx) + r0 * in_f, in_f);
        else if (gx) /* dx (m, in) += dy (m, out) · w (out, in) */
            st = gemm(tp, dt, m, in_f, out_f, dy, out_f, false, wd, c->wld, c->wt, NULL, !gx_fresh, cmi_f32(gx) + r0 * in_f,
                      in_f);
        if (!st && gw && padv) /* dwp (op, in) (+)= dyᵀ (op, m) · x (m, in) */
            st = gemm(tp, dt, op, in_f, m, dy, op, true, xr, c->xld, c->xt, NULL, r0 > 0, gwp, in_f);
        else if (!st && gw && c->wbase) /* dwb (in, out) += xᵀ (in, m) · dy (m, out): the weight's transpose, directly */
            st = gemm(tp, dt, in_f, out_f, m, xr, c->xld, !c->xt, dy, out_f, false, NULL, true, cmi_f32(gw), out_f);
        else if (!st && gw) /* dw (out, in) += dyᵀ (out, m) · x (m, in) */
            st = gemm(tp, dt, out_f, in_f, m, dy, out_f, true, xr, c->xld, c->xt, NULL, true, cmi_f32(gw), in_f);
    }
    if (!st && gwp) { /* dw (out, in) += the padded gradient's first out_f rows */
        const int64_t one[1] = {1}, shape[1] = {out_f * in_f};
        if (cmi_dev_fail(tp, be->accum(cmi_f32(gw), one, gwp, 1, shape), "linear backward")) return cmi_status(tp);
    }
    if (!st && gb && be) { /* db (out) += column sums of dy */
        const int64_t shape[2] = {R, out_f}, dst[2] = {0, 1};
        if (cmi_dev_fail(tp, be->accum(cmi_f32(gb), dst, cmi_f32(gout), 2, shape), "linear backward"))
            return cmi_status(tp);
    } else if (!st && gb) { /* db (out) += column sums of dy, in f32 */
        const float *g = cmi_f32(gout);
        float *db = cmi_f32(gb);
        enum { CH = 64 };
#pragma omp parallel for schedule(static) if (R * out_f > CMI_PAR_MIN)
        for (int64_t j0 = 0; j0 < out_f; j0 += CH) {
            const int64_t w_ = out_f - j0 < CH ? out_f - j0 : CH;
            float acc[CH] = {0};
            for (int64_t i = 0; i < R; i++) {
                const float *row = g + i * out_f + j0;
                for (int64_t j = 0; j < w_; j++) acc[j] += row[j];
            }
            for (int64_t j = 0; j < w_; j++) db[j0 + j] += acc[j];
        }
    }
    cm_arena_rewind(arena, mark);
    return st ? st : cmi_status(tp);
}

cm_tensor *cm_linear(cm_tape *tp, cm_tensor *x, cm_tensor *w, cm_tensor *bias) {
    cm_tensor *ins[3] = {x, w, bias};
    if (!cmi_begin(tp, "linear", 2, ins) || !cmi_fetch(tp, 1, ins + 2)) return NULL;
    /* A weight that is a recorded transpose of a contiguous (in, out) tensor wb (GPT-2's Conv1D
     * stores its weight that way) is used through wb: the forward reads the same memory, the
     * backward writes wb's gradient with one GEMM instead of filling the view's (out, in) gradient
     * and adding it back transposed element by element (~7% of a char-GPT step), and autocast
     * casts wb (contiguous) instead of copying the transposed view. */
    cm_tensor *wb = cmi_transposed_base(w);
    cm_tensor *wsrc = wb ? wb : w; /* what gets the weight's gradient (and, under autocast, is cast) */
    /* Autocast: an f32 x or w is multiplied as a bf16 copy that is not recorded on the tape; the
     * node's inputs stay the f32 tensors, and the backward GEMMs accumulate (in f32) straight into
     * their gradients — no cast nodes, whose f32 gradient buffers and extra passes (a weight's cast
     * gradient is the size of the weight, every microbatch) cost memory and time. */
    const bool ac = tp->autocast == CM_DTYPE_BF16;
    const bool cast_x = ac && x->dtype == CM_DTYPE_F32, cast_w = ac && wsrc->dtype == CM_DTYPE_F32;
    if (ac) { /* each operand f32 (cast) or already bf16 */
        if (!float_operand(tp, "x", x) || !float_operand(tp, "w", w)) return NULL;
    } else if (!check_pair(tp, "linear", "x", x, "w", w)) {
        return NULL;
    }
    const cm_dtype dt = ac ? CM_DTYPE_BF16 : x->dtype;
    if (bias && bias->dtype != CM_DTYPE_F32) {
        cmi_fail(tp, CM_ERR_DTYPE, "linear: bias %s has dtype %s; the bias is f32 (also for bf16 x and w)",
                 cmi_shape(bias), cm_dtype_name(bias->dtype));
        return NULL;
    }
    if (w->ndim != 2 || x->ndim < 1) {
        cmi_fail(tp, CM_ERR_SHAPE, "linear: w %s must be 2-D (out, in) and x %s at least 1-D (..., in)", cmi_shape(w),
                 cmi_shape(x));
        return NULL;
    }
    const int64_t out_f = w->shape[0], in_f = w->shape[1];
    if (x->shape[x->ndim - 1] != in_f) {
        cmi_fail(tp, CM_ERR_SHAPE, "linear: in features differ: x %s vs w %s (w is (out, in))", cmi_shape(x),
                 cmi_shape(w));
        return NULL;
    }
    if (bias && (bias->ndim != 1 || bias->shape[0] != out_f)) {
        cmi_fail(tp, CM_ERR_SHAPE, "linear: bias %s must be (%lld) to match w %s", cmi_shape(bias), (long long)out_f,
                 cmi_shape(w));
        return NULL;
    }
    /* Operands multiplied as they are must have a GEMM layout (a recorded copy otherwise); a bf16
     * copy is contiguous, and wb's copy read through w's (transposed) strides. */
    int64_t R = cmi_numel(x->ndim - 1, x->shape), xld = in_f, wld = in_f;
    bool xt = false, wt = false;
    if (!cast_x && !x_layout(x, &R, &xld, &xt)) {
        if (!(x = cm_contiguous(tp, x))) return NULL;
        x_layout(x, &R, &xld, &xt);
    }
    if (!cast_w && !mat_layout(out_f, in_f, w->stride[0], w->stride[1], &wld, &wt)) {
        if (!(w = cm_contiguous(tp, w))) return NULL;
        mat_layout(out_f, in_f, w->stride[0], w->stride[1], &wld, &wt);
    }
    if (cast_w && wb) mat_layout(out_f, in_f, w->stride[0], w->stride[1], &wld, &wt);
    if (bias && !cmi_is_contig(bias) && !(bias = cm_contiguous(tp, bias))) return NULL;

    int64_t shape[CM_MAX_DIMS];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    shape[x->ndim - 1] = out_f;
    cm_tensor *y = cmi_new(tp, CM_DTYPE_F32, x->ndim, shape); // (..., out)
    if (!y) return NULL;
    cm_arena *arena = cmi_op_arena(tp);
    const size_t mark = cm_arena_mark(arena); /* the bf16 copies live until the GEMM is done */
    const char *xd = cast_x ? bf16_copy(tp, x) : (const char *)x->data;
    const char *wd = cast_w ? bf16_copy(tp, wsrc) : (const char *)w->data;
    if (!xd || !wd) return NULL;
    /* y (R, out) = x (R, in) · wᵀ (in, out) + bias: w's transpose is just the other BLAS flag */
    cm_status st = gemm(tp, dt, R, out_f, in_f, xd, xld, xt, wd, wld, !wt, bias ? cmi_f32(bias) : NULL, false,
                        cmi_f32(y), out_f);
    cm_arena_rewind(arena, mark);
    if (st) return NULL;
    ins[0] = x, ins[1] = wb ? wb : w, ins[2] = bias;
    if (cmi_needs_grad(tp, 3, ins)) {
        cm_node *nd = cmi_record(tp, "linear", y, 3, ins, linear_backward, sizeof(linear_ctx));
        if (!nd) return NULL;
        *(linear_ctx *)nd->ctx = (linear_ctx){dt, cast_x ? NULL : xd, cast_w ? NULL : wd, R, in_f, out_f,
                                              xld, wld, xt, wt, wb != NULL};
    }
    return y;
}
