/* Fused scaled dot-product attention with a hand-written backward.
 *
 * Forward, per (b, h) in parallel (OpenMP over B·H, single-threaded sgemm inside), in blocks of
 * query rows (a causal block skips the keys after its last row), in per-thread (RB, S) scratch:
 *   L = q·kᵀ·scale + bias (+ -inf where masked)            // (RB, S)
 *   P = softmax_rows(L)       (rows with every key masked → all zeros)
 *   out = P·v                                               // (RB, D), into (B, H, T, D) or (B, T, H, D)
 * P is not kept: the backward recomputes each block with the same function (softmax_block), which
 * costs one q·kᵀ product and an exp per score and saves the B·H·T·S floats a kept P would hold
 * until the end of the step (24 MiB per GPT-2 124M layer at B = 8, T = 256). The dropout mask is
 * kept as bits (1/32 of P).
 *
 * Backward, per (b, h) and row block, after recomputing P:
 *   dV += Pᵀ·dO;  dP = dO·Vᵀ;  dL = P ⊙ (dP − rowsum(dO ⊙ O));
 *   dQ += dL·K·scale;  dK += dLᵀ·Q·scale;  dBias += dL summed over bias's broadcast dims.
 *
 * q, k and v may be strided views: a (N, D) slice whose rows or columns are unit-stride (e.g.
 * cm_permute of a (B, T, H, D) tensor) is handed to sgemm as is through lda/ldb and a transpose
 * flag; anything else is made contiguous first (a recorded op, so gradients still flow). */
#include "tensor/backend.h"
#include "tensor/dnnl_gemm.h"
#include "tensor/tensor_impl.h"
#include "tensor/vexp.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <omp.h>

cm_attention_opts cm_attention_opts_default(void) {
    cm_attention_opts o = {false, 0.0f, NULL, NULL, 0.0f, NULL, false};
    return o;
}

/* How one (N, D) slice of a (B, H, N, D) tensor is handed to sgemm (row-major): element (n, d) of
 * slice (b, h) is at base[b·sb + h·sh + n·ld + d] (tr == CblasNoTrans) or
 * base[b·sb + h·sh + d·ld + n] (tr == CblasTrans). */
typedef struct {
    const float *base;
    int64_t sb, sh;
    CBLAS_TRANSPOSE tr;
    int ld;
} mat_ref;

/* False when t's strides cannot be expressed as a (possibly transposed) sgemm operand. */
static bool mat_ref_of(const cm_tensor *t, mat_ref *m) {
    const int64_t N = t->shape[2], D = t->shape[3];
    m->base = cmi_f32(t);
    m->sb = t->stride[0];
    m->sh = t->stride[1];
    /* Size-1 dims have meaningless strides: normalise them to what each layout needs. */
    const int64_t rn = N == 1 ? D : t->stride[2], cn = D == 1 ? 1 : t->stride[3];
    if (cn == 1 && rn >= (D > 1 ? D : 1) && rn <= INT_MAX) {
        m->tr = CblasNoTrans;
        m->ld = (int)rn;
        return true;
    }
    const int64_t rt = N == 1 ? 1 : t->stride[2], ct = D == 1 ? N : t->stride[3];
    if (rt == 1 && ct >= (N > 1 ? N : 1) && ct <= INT_MAX) {
        m->tr = CblasTrans;
        m->ld = (int)ct;
        return true;
    }
    return false;
}

static inline const float *mat_at(const mat_ref *m, int64_t b, int64_t h) { return m->base + b * m->sb + h * m->sh; }
static inline CBLAS_TRANSPOSE flip(CBLAS_TRANSPOSE t) { return t == CblasNoTrans ? CblasTrans : CblasNoTrans; }

/* cblas_sgemm's row-major argument list, on the library's f32 GEMM (cmi_sgemm). */
static inline void att_sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha, const float *a,
                             int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    cmi_sgemm(ta == CblasTrans, tb == CblasTrans, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
}
/* Row n of slice (b, h): the operand pointer for a gemm over rows n.. */
static inline const float *mat_row(const mat_ref *m, int64_t b, int64_t h, int64_t n) {
    return mat_at(m, b, h) + n * (m->tr == CblasNoTrans ? m->ld : 1);
}

/* Query rows are processed in blocks of ROW_BLOCK. With a causal mask a block [i0, i1) only touches
 * keys [0, min(i1, S)), which skips ~3/8 of the flops at T = S = 256 (measured 1.5x faster forward +
 * backward at B=8, H=6, T=256, D=64, one thread); without one, the block size makes no measurable
 * difference and keeps the (block, S) slice of P in cache between the softmax and P·v. */
#define ROW_BLOCK 64
static inline int64_t row_block(int64_t T) { return T > ROW_BLOCK ? ROW_BLOCK : (T > 0 ? T : 1); }

static inline bool mask_keep(const cm_tensor *m, int64_t b, int64_t s) {
    const char *p = (const char *)m->data + (b * m->stride[0] + s * m->stride[1]) * (int64_t)cm_dtype_size(m->dtype);
    switch (m->dtype) {
    case CM_DTYPE_U8: return *(const uint8_t *)p != 0;
    case CM_DTYPE_I32: return *(const int32_t *)p != 0;
    default: return *(const int64_t *)p != 0;
    }
}

/* The padding mask as an additive (B, S) row: 0 for a kept key, -inf for padding. */
static float *mask_rows(cm_tape *tp, const cm_tensor *m) {
    const int64_t B = m->shape[0], S = m->shape[1];
    float *r = cmi_scratch(tp, sizeof(float) * (size_t)(B * S + 1));
    if (!r) return NULL;
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++) r[b * S + s] = mask_keep(m, b, s) ? 0.0f : -INFINITY;
    return r;
}

/* What the scores are made of; the forward fills it and the node keeps it for the backward, which
 * recomputes P from it. */
typedef struct {
    mat_ref q, k;
    float scale;
    bool causal;
    int64_t S, D;
    const float *bias;  /* or NULL */
    int64_t bst[4];     /* bias's strides broadcast to (B, H, T, S) */
    const float *mrows; /* (B, S) additive padding mask (0 / -inf), or NULL */
} score_src;

/* P (m, S) = softmax_rows(scale·q·kᵀ + bias + masks) for the query rows [i0, i0 + m) of slice
 * (b, h), with keys [0, kn) computed (kn < S only under the causal mask, which skips the rest).
 * Columns past the causal diagonal are 0; a row whose keys are all masked is all zeros (so it passes
 * zero gradient). The forward and the backward both call this with the same blocks, so the
 * backward's P is the forward's. */
static void softmax_block(const score_src *c, int64_t b, int64_t h, int64_t i0, int64_t m, int64_t kn, float *P) {
    const int64_t S = c->S;
    /* L (m, kn) = scale·q·kᵀ */
    att_sgemm(c->q.tr, flip(c->k.tr), (int)m, (int)kn, (int)c->D, c->scale, mat_row(&c->q, b, h, i0), c->q.ld,
              mat_at(&c->k, b, h), c->k.ld, 0.0f, P, (int)S);
    for (int64_t r = 0; r < m; r++) {
        const int64_t i = i0 + r;
        float *row = P + r * S;
        if (c->bias) {
            const float *br = c->bias + b * c->bst[0] + h * c->bst[1] + i * c->bst[2];
            const int64_t sj = c->bst[3];
            for (int64_t j = 0; j < kn; j++) row[j] += br[j * sj];
        }
        if (c->mrows) {
            const float *mr = c->mrows + b * S;
            for (int64_t j = 0; j < kn; j++) row[j] += mr[j];
        }
        /* top-left causal: query i sees keys 0..i; keys >= kn were never computed */
        const int64_t jn = c->causal && i + 1 < kn ? i + 1 : kn;
        for (int64_t j = jn; j < S; j++) row[j] = 0.0f;
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < jn; j++) mx = row[j] > mx ? row[j] : mx;
        if (mx == -INFINITY) { /* every key masked: zeros, and zero gradient through P */
            memset(row, 0, sizeof(float) * (size_t)jn);
            continue;
        }
        /* cmi_vexpf (as cm_softmax): libm's expf stays scalar, and the backward pays this loop again */
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < jn; j++) {
            const float e = cmi_vexpf(row[j] - mx);
            row[j] = e;
            sum += e;
        }
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < jn; j++) row[j] *= inv;
    }
}

/* The dropout mask as bits: bit e % 8 of byte e / 8 is 1 where probability e of the flat
 * (B, H, T, S) index is dropped. One bit per probability instead of a byte: 0.75 MiB instead of
 * 6 MiB per GPT-2 124M layer at B = 8, T = 256. The kernels read bytes, unpacked per row block. */
static void pack_bits(const uint8_t *bytes, int64_t n, uint8_t *bits) {
    const int64_t nb = (n + 7) / 8;
#pragma omp parallel for schedule(static) if (n >= CMI_PAR_MIN)
    for (int64_t w = 0; w < nb; w++) {
        const int64_t e0 = w * 8, e1 = e0 + 8 < n ? e0 + 8 : n;
        unsigned x = 0;
        for (int64_t e = e0; e < e1; e++) x |= (unsigned)(bytes[e] != 0) << (e - e0);
        bits[w] = (uint8_t)x;
    }
}

/* out[j] = bit e0 + j of the mask for j in [0, n). */
static void unpack_bits(const uint8_t *bits, int64_t e0, int64_t n, uint8_t *out) {
    int64_t j = 0;
    for (; j < n && ((e0 + j) & 7); j++) out[j] = (bits[(e0 + j) >> 3] >> ((e0 + j) & 7)) & 1u;
    const uint8_t *src = bits + ((e0 + j) >> 3);
    for (; j + 8 <= n; j += 8, src++) {
        const unsigned x = *src;
        for (int t = 0; t < 8; t++) out[j + t] = (x >> t) & 1u;
    }
    for (; j < n; j++) out[j] = (bits[(e0 + j) >> 3] >> ((e0 + j) & 7)) & 1u;
}

/* The mask of m rows of a (T, S) slice, starting at flat index e0, keys [0, kn): drop (m, kn) bytes. */
static void unpack_block(const uint8_t *bits, int64_t e0, int64_t S, int64_t m, int64_t kn, uint8_t *drop) {
    for (int64_t i = 0; i < m; i++) unpack_bits(bits, e0 + i * S, kn, drop + i * kn);
}

typedef struct {
    score_src src;
    const uint8_t *drop;  /* dropout mask bits over (B, H, T, S), or NULL without dropout */
    float keep_scale;     /* 1/(1 - dropout_p) */
    bool bthd;            /* out (and its gradient) is (B, T, H, D), else (B, H, T, D) */
} attn_ctx;

/* Pd (m, kn) = P ⊙ keep · keep_scale for m rows of P (m, S), drop (m, ldd) bytes (1 = dropped): the
 * probabilities after dropout, into a dense scratch block. */
static void apply_dropout(const float *P, const uint8_t *drop, int64_t ldd, int64_t S, int64_t m, int64_t kn,
                          float keep_scale, float *Pd) {
    for (int64_t i = 0; i < m; i++) {
        const float *pr = P + i * S;
        const uint8_t *dr = drop + i * ldd;
        float *o = Pd + i * kn;
        for (int64_t j = 0; j < kn; j++) o[j] = dr[j] ? 0.0f : pr[j] * keep_scale;
    }
}

/* Where slice (b, h) of the output starts and its row stride: (B, H, T, D) or (B, T, H, D). */
static inline int64_t out_base(bool bthd, int64_t b, int64_t h, int64_t H, int64_t T, int64_t D) {
    return bthd ? b * T * H * D + h * D : (b * H + h) * T * D;
}

/* ------------------------------------------------------------------------------------------ */
/* Backward                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* Per (b, h) and row block: P recomputed by softmax_block (one more q·kᵀ and exp than a kept P),
 * then as the forward would have kept it. Scratch (per thread, (RB, S) each: P, dL, Pd) is rewound at
 * the end; only the gradients (and dL (B, H, T, S) when bias needs its gradient) stay. */
static cm_status attention_backward(cm_tape *tp, cm_node *n, const cm_tensor *gout) {
    const attn_ctx *c = n->ctx;
    cm_tensor *q = n->in[0], *k = n->in[1], *v = n->in[2], *bias = n->in[3];
    const int64_t B = q->shape[0], H = q->shape[1], T = q->shape[2], D = q->shape[3], S = k->shape[2];
    /* Gradients created now are written instead of zeroed and added to: dQ's row blocks are each
     * written once (beta 0); dK and dV add up over the row blocks, so the first block writes the
     * keys it covers (beta 0) and zeroes the rest (causal: keys no query of it sees) */
    bool q_fresh = false, k_fresh = false, v_fresh = false;
    cm_tensor *gq = cmi_grad_for_write(tp, q, &q_fresh), *gk = cmi_grad_for_write(tp, k, &k_fresh),
              *gv = cmi_grad_for_write(tp, v, &v_fresh);
    /* q, k or v passed twice share one gradient, which the other's GEMMs add to: zero it and add */
    if (q_fresh && (q == k || q == v)) memset(gq->data, 0, cm_tensor_nbytes(gq)), q_fresh = false;
    if (k_fresh && k == v) memset(gk->data, 0, cm_tensor_nbytes(gk)), k_fresh = false;
    const bool want_bias = bias && cm_tensor_requires_grad(bias);
    if (cmi_status(tp)) return cmi_status(tp);
    if (want_bias) cmi_grad(tp, bias); /* exists (zeros) even when nothing below touches it */
    if (T == 0 || S == 0 || D == 0 || B * H == 0) { /* every gradient is zero */
        if (q_fresh) memset(gq->data, 0, cm_tensor_nbytes(gq));
        if (k_fresh) memset(gk->data, 0, cm_tensor_nbytes(gk));
        if (v_fresh) memset(gv->data, 0, cm_tensor_nbytes(gv));
        return cmi_status(tp);
    }
    mat_ref mq, mk, mv;
    if (!mat_ref_of(q, &mq) || !mat_ref_of(k, &mk) || !mat_ref_of(v, &mv))
        return cmi_fail(tp, CM_ERR_STATE, "attention backward: saved q/k/v lost their layout");
    const int64_t BH = B * H, TS = T * S, RB = row_block(T);
    const int nth = (BH > 1 && BH * TS * D >= CMI_PAR_MIN) ? cm_num_threads() : 1;
    /* dL: the full (B, H, T, S) tensor when bias needs its gradient (allocated before the mark: it
     * outlives this call), else one (RB, S) block per thread. */
    float *dL_all = NULL;
    cm_tensor *dL_t = NULL;
    if (want_bias) {
        int64_t shp[4] = {B, H, T, S};
        dL_t = cmi_new(tp, CM_DTYPE_F32, 4, shp);
        if (!dL_t) return cmi_status(tp);
        dL_all = cmi_f32(dL_t);
    }
    const size_t mark = cm_arena_mark(tp->arena); /* everything below is scratch for this call */
    const size_t blk = (size_t)(RB * S);
    if (!want_bias && !(dL_all = cmi_scratch(tp, sizeof(float) * blk * (size_t)nth))) return cmi_status(tp);
    float *P_all = cmi_scratch(tp, sizeof(float) * blk * (size_t)nth); /* (nth, RB, S) recomputed P */
    if (!P_all) return cmi_status(tp);
    /* With dropout, O = Pd·V where Pd = P ⊙ keep · ks, so dV = Pdᵀ·dO, dPd = dO·Vᵀ, dP = dPd ⊙ keep · ks,
     * and rowsum(dP ⊙ P) = rowsum(dPd ⊙ Pd) = rowsum(dO ⊙ O): the softmax step is unchanged.
     * Pd is rebuilt per row block from P and the mask (unpacked to bytes) in per-thread scratch. */
    const uint8_t *drop = c->drop;
    const float ks = c->keep_scale;
    float *pd_all = NULL;
    uint8_t *db_all = NULL; /* (nth, RB, S) the block's mask as bytes */
    if (drop && (!(pd_all = cmi_scratch(tp, sizeof(float) * blk * (size_t)nth)) ||
                 !(db_all = cmi_scratch(tp, blk * (size_t)nth))))
        return cmi_status(tp);
    score_src src = c->src;
    src.q = mq, src.k = mk; /* the same layouts the forward used, at the inputs' current addresses */
    src.bias = bias ? cmi_f32(bias) : NULL;
    const float *Ov = cmi_f32(n->out), *gOv = cmi_f32(gout); /* both contiguous in out's layout */
    float *gqv = gq ? cmi_f32(gq) : NULL, *gkv = gk ? cmi_f32(gk) : NULL, *gvv = gv ? cmi_f32(gv) : NULL;
    const float scale = src.scale;
    const bool need_dL = gq || gk || want_bias;
    const int iS = (int)S, iD = (int)D, ldo = (int)(c->bthd ? H * D : D);

#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1)
    for (int64_t bh = 0; bh < BH; bh++) {
        const int64_t b = bh / H, h = bh % H, ob = out_base(c->bthd, b, h, H, T, D);
        const int64_t th = omp_get_thread_num();
        const float *O = Ov + ob;   // (T, D), row stride ldo
        const float *gO = gOv + ob; // (T, D), row stride ldo
        float *P = P_all + th * (int64_t)blk; // (RB, S)
        for (int64_t i0 = 0; i0 < T; i0 += RB) {
            const int64_t i1 = i0 + RB < T ? i0 + RB : T, kn = src.causal && i1 < S ? i1 : S; /* keys [0, kn) */
            const int m = (int)(i1 - i0), kk = (int)kn;
            const float beta_k = k_fresh && i0 == 0 ? 0.0f : 1.0f, beta_v = v_fresh && i0 == 0 ? 0.0f : 1.0f;
            if (i0 == 0 && kn < S) { /* keys the first block does not reach: its GEMMs leave them */
                if (k_fresh) memset(gkv + (bh * S + kn) * D, 0, sizeof(float) * (size_t)((S - kn) * D));
                if (v_fresh) memset(gvv + (bh * S + kn) * D, 0, sizeof(float) * (size_t)((S - kn) * D));
            }
            softmax_block(&src, b, h, i0, m, kn, P);
            const float *gOb = gO + i0 * ldo; // (m, D)
            float *dLb = want_bias ? dL_all + bh * TS + i0 * S : dL_all + th * (int64_t)blk; // (m, S)
            uint8_t *db = NULL; // (m, kn) 1 = dropped
            if (drop) unpack_block(drop, bh * TS + i0 * S, S, m, kn, db = db_all + th * (int64_t)blk);
            /* dV (kn, D) += Pdᵀ·dO (Pd = P without dropout) */
            if (gvv) {
                const float *A = P;
                int lda = iS;
                if (db) {
                    float *Pd = pd_all + th * (int64_t)blk;
                    apply_dropout(P, db, kn, S, m, kn, ks, Pd);
                    A = Pd, lda = kk;
                }
                att_sgemm(CblasTrans, CblasNoTrans, kk, iD, m, 1.0f, A, lda, gOb, ldo, beta_v, gvv + bh * S * D, iD);
            }
            if (!need_dL) continue;
            /* dP (m, kn) = dO·Vᵀ */
            att_sgemm(CblasNoTrans, flip(mv.tr), m, kk, iD, 1.0f, gOb, ldo, mat_at(&mv, b, h), mv.ld, 0.0f, dLb, iS);
            /* dL = P ⊙ (dP − rowsum(dO ⊙ O)); zero where P is zero (masked keys, fully-masked rows) */
            for (int64_t r = 0; r < m; r++) {
                const float *pr = P + r * S, *orow = O + (i0 + r) * ldo, *grow = gO + (i0 + r) * ldo;
                float *dr = dLb + r * S;
                float rs = 0.0f;
                for (int64_t d = 0; d < D; d++) rs += grow[d] * orow[d];
                if (db) { /* dP = dPd ⊙ keep · ks */
                    const uint8_t *mr = db + r * kn;
                    for (int64_t j = 0; j < kn; j++) dr[j] = pr[j] * ((mr[j] ? 0.0f : dr[j] * ks) - rs);
                } else {
                    for (int64_t j = 0; j < kn; j++) dr[j] = pr[j] * (dr[j] - rs);
                }
                for (int64_t j = kn; j < S; j++) dr[j] = 0.0f; /* read by the bias reduction */
            }
            /* dQ (m, D) += scale·dL·K;  dK (kn, D) += scale·dLᵀ·Q */
            if (gqv)
                att_sgemm(CblasNoTrans, mk.tr, m, iD, kk, scale, dLb, iS, mat_at(&mk, b, h), mk.ld, q_fresh ? 0.0f : 1.0f,
                          gqv + (bh * T + i0) * D, iD);
            if (gkv)
                att_sgemm(CblasTrans, mq.tr, kk, iD, m, scale, dLb, iS, mat_row(&mq, b, h, i0), mq.ld, beta_k,
                          gkv + bh * S * D, iD);
        }
    }
    cm_arena_rewind(tp->arena, mark);
    if (want_bias) return cmi_accum(tp, bias, dL_t); /* sums over bias's broadcast dims */
    return cmi_status(tp);
}

/* ------------------------------------------------------------------------------------------ */
/* On a GPU: the backend's fused kernels (cuda/attention.cu) read q, k, v through any strides and  */
/* keep one log-sum-exp per query; the backward recomputes the scores (and the dropout mask, from  */
/* its Philox counters).                                                                        */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    cmi_attn_desc d; /* pointers refreshed from the node's inputs in backward */
    float *lse;      /* (B, H, T) */
} attn_dev_ctx;

static cm_status attention_dev_backward(cm_tape *tp, cm_node *n, const cm_tensor *gout) {
    attn_dev_ctx *c = n->ctx;
    cm_tensor *q = n->in[0], *k = n->in[1], *v = n->in[2], *bias = n->in[3];
    const cmi_backend *be = cmi_be(tp);
    bool q_fresh = false, k_fresh = false, v_fresh = false;
    cm_tensor *gq = cmi_grad_for_write(tp, q, &q_fresh), *gk = cmi_grad_for_write(tp, k, &k_fresh),
              *gv = cmi_grad_for_write(tp, v, &v_fresh);
    if (cmi_status(tp)) return cmi_status(tp);
    /* q, k or v passed twice share one gradient that both kernels add to: zero it first */
    if (q_fresh && (q == k || q == v)) {
        if (cmi_dev_fail(tp, be->memset(gq->data, 0, cm_tensor_nbytes(gq)), "attention backward")) return tp->status;
        q_fresh = false;
    }
    if (k_fresh && k == v) {
        if (cmi_dev_fail(tp, be->memset(gk->data, 0, cm_tensor_nbytes(gk)), "attention backward")) return tp->status;
        k_fresh = false;
    }
    const bool want_bias = bias && cm_tensor_requires_grad(bias);
    cmi_attn_desc d = c->d;
    d.q = cmi_f32(q), d.k = cmi_f32(k), d.v = cmi_f32(v), d.bias = bias ? cmi_f32(bias) : NULL;
    if (d.T * d.S * d.D == 0 || d.B * d.H == 0) { /* every gradient is zero */
        cm_tensor *gs[3] = {q_fresh ? gq : NULL, k_fresh ? gk : NULL, v_fresh ? gv : NULL};
        for (int i = 0; i < 3; i++)
            if (gs[i] && cmi_dev_fail(tp, be->memset(gs[i]->data, 0, cm_tensor_nbytes(gs[i])), "attention backward"))
                return tp->status;
        if (want_bias) cmi_grad(tp, bias);
        return cmi_status(tp);
    }
    cm_tensor *dS = NULL;
    if (want_bias) {
        const int64_t shp[4] = {d.B, d.H, d.T, d.S};
        if (!(dS = cmi_zeros(tp, CM_DTYPE_F32, 4, shp))) return cmi_status(tp);
    }
    if (cmi_dev_fail(tp,
                     be->attention_bwd(&d, cmi_f32(n->out), cmi_f32(gout), c->lse, gq ? cmi_f32(gq) : NULL, q_fresh,
                                       gk ? cmi_f32(gk) : NULL, k_fresh, gv ? cmi_f32(gv) : NULL, v_fresh,
                                       dS ? cmi_f32(dS) : NULL),
                     "attention backward"))
        return tp->status;
    if (want_bias) return cmi_accum(tp, bias, dS); /* sums over bias's broadcast dims */
    return cmi_status(tp);
}

static cm_tensor *attention_dev(cm_tape *tp, cm_tensor *q, cm_tensor *k, cm_tensor *v, const cm_attention_opts *o,
                                const int64_t *bst) {
    const cmi_backend *be = cmi_be(tp);
    const int64_t B = q->shape[0], H = q->shape[1], T = q->shape[2], D = q->shape[3], S = k->shape[2];
    cmi_attn_desc d;
    memset(&d, 0, sizeof d);
    d.q = cmi_f32(q), d.k = cmi_f32(k), d.v = cmi_f32(v);
    memcpy(d.qs, q->stride, sizeof d.qs);
    memcpy(d.ks, k->stride, sizeof d.ks);
    memcpy(d.vs, v->stride, sizeof d.vs);
    if (o->bias) {
        d.bias = cmi_f32(o->bias);
        memcpy(d.bst, bst, sizeof d.bst);
    }
    if (o->key_padding_mask) { /* as f32 (B, S): nonzero = a real key */
        const bool prev = tp->grad_enabled;
        tp->grad_enabled = false;
        cm_tensor *m = cm_cast(tp, cm_contiguous(tp, o->key_padding_mask), CM_DTYPE_F32);
        tp->grad_enabled = prev;
        if (!m) return NULL;
        d.mrow = cmi_f32(m);
    }
    d.B = B, d.H = H, d.T = T, d.S = S, d.D = D;
    d.scale = o->scale != 0.0f ? o->scale : (D > 0 ? 1.0f / sqrtf((float)D) : 1.0f);
    d.causal = o->causal;
    d.dropout_p = o->dropout_p;
    d.keep_scale = o->dropout_p < 1.0f ? 1.0f / (1.0f - o->dropout_p) : 0.0f;
    d.bthd = o->out_bthd;
    d.bf16 = tp->autocast == CM_DTYPE_BF16; /* the tensor cores, where the device has them (attention_tc.cu) */
    if (o->dropout_p > 0.0f) {
        /* cmi_dropout_mask's numbers for the (B, H, T, S) probabilities, rows = the batch dim */
        const int64_t numel = B * H * T * S;
        const bool by_row = tp->row_total > 0 && B == tp->row_n && B > 0;
        const int64_t blocks = by_row ? (numel / B + 3) / 4 : (numel + 3) / 4;
        cmi_rng_note(tp, o->rng);
        d.seed = o->rng->seed, d.stream = o->rng->stream, d.counter = o->rng->counter;
        d.rows = by_row ? B : 0;
        d.row_first = by_row ? tp->row_first : 0;
        o->rng->counter += (uint64_t)(by_row ? tp->row_total * blocks : blocks);
    }
    const int64_t oshape[4] = {B, o->out_bthd ? T : H, o->out_bthd ? H : T, D};
    cm_tensor *out = cmi_new(tp, CM_DTYPE_F32, 4, oshape);
    float *lse = cmi_dev_scratch(tp, sizeof(float) * (size_t)(B * H * T + 1)); // (B, H, T)
    if (!out || !lse) return NULL;
    cm_status st;
    if (T * S * D == 0 || B * H == 0) st = be->memset(out->data, 0, cm_tensor_nbytes(out));
    else st = be->attention(&d, cmi_f32(out), lse);
    if (cmi_dev_fail(tp, st, "attention")) return NULL;
    cm_tensor *ins[4] = {q, k, v, o->bias};
    if (cmi_needs_grad(tp, 4, ins)) {
        cm_node *n = cmi_record(tp, "attention", out, 4, ins, attention_dev_backward, sizeof(attn_dev_ctx));
        if (!n) return NULL;
        attn_dev_ctx *c = n->ctx;
        c->d = d;
        c->lse = lse;
    }
    return out;
}

/* ------------------------------------------------------------------------------------------ */
/* Forward                                                                                      */
/* ------------------------------------------------------------------------------------------ */

static bool check_qkv(cm_tape *tp, cm_tensor *q, cm_tensor *k, cm_tensor *v) {
    if (!cmi_check_f32(tp, "attention", "q", q) || !cmi_check_f32(tp, "attention", "k", k) ||
        !cmi_check_f32(tp, "attention", "v", v))
        return false;
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4) {
        cmi_fail(tp, CM_ERR_SHAPE,
                 "attention: q %s, k %s and v %s must be 4-d: q (B, H, T, D), k and v (B, H, S, D) "
                 "(permute (B, T, H, D) to (B, H, T, D) first)",
                 cmi_shape(q), cmi_shape(k), cmi_shape(v));
        return false;
    }
    if (q->shape[0] != k->shape[0] || q->shape[1] != k->shape[1] || q->shape[3] != k->shape[3] ||
        k->shape[0] != v->shape[0] || k->shape[1] != v->shape[1] || k->shape[3] != v->shape[3]) {
        cmi_fail(tp, CM_ERR_SHAPE, "attention: q %s, k %s and v %s must agree in B, H and D (dims 0, 1 and 3)",
                 cmi_shape(q), cmi_shape(k), cmi_shape(v));
        return false;
    }
    if (k->shape[2] != v->shape[2]) {
        cmi_fail(tp, CM_ERR_SHAPE, "attention: k %s and v %s must have the same number of keys S (dim 2)",
                 cmi_shape(k), cmi_shape(v));
        return false;
    }
    for (int d = 2; d < 4; d++)
        if (q->shape[d] > INT_MAX / 2 || k->shape[d] > INT_MAX / 2) {
            cmi_fail(tp, CM_ERR_SHAPE, "attention: q %s / k %s: T, S and D must each be below 2^30", cmi_shape(q),
                     cmi_shape(k));
            return false;
        }
    return true;
}

cm_tensor *cm_attention(cm_tape *tp, cm_tensor *q, cm_tensor *k, cm_tensor *v, const cm_attention_opts *opts) {
    cm_tensor *qkv[3] = {q, k, v};
    if (!cmi_begin(tp, "attention", 3, qkv)) return NULL;
    const cm_attention_opts o = opts ? *opts : cm_attention_opts_default();
    if (!check_qkv(tp, q, k, v)) return NULL;
    const int64_t B = q->shape[0], H = q->shape[1], T = q->shape[2], D = q->shape[3], S = k->shape[2];
    const int64_t full[4] = {B, H, T, S};
    int64_t bst[CM_MAX_DIMS] = {0};
    cm_tensor *bias = o.bias, *mask = o.key_padding_mask;
    if (bias) {
        if (!cmi_check_f32(tp, "attention", "bias", bias)) return NULL;
        int nd;
        int64_t bs[CM_MAX_DIMS];
        if (bias->ndim > 4 || !cmi_broadcast_shapes(bias->ndim, bias->shape, 4, full, &nd, bs) ||
            memcmp(bs, full, sizeof full) != 0) {
            cmi_fail(tp, CM_ERR_SHAPE,
                     "attention: bias %s does not broadcast to the scores' shape (B, H, T, S) = %s "
                     "(e.g. ALiBi as (1, H, T, S) or (H, 1, S))",
                     cmi_shape(bias), cmi_shape_of(4, full));
            return NULL;
        }
        cmi_broadcast_strides(bias, 4, full, bst);
    }
    if (mask) {
        if (mask->dtype != CM_DTYPE_U8 && mask->dtype != CM_DTYPE_I32 && mask->dtype != CM_DTYPE_I64) {
            cmi_fail(tp, CM_ERR_DTYPE, "attention: key_padding_mask %s has dtype %s; it must be u8, i32 or i64",
                     cmi_shape(mask), cm_dtype_name(mask->dtype));
            return NULL;
        }
        if (mask->ndim != 2 || mask->shape[0] != B || mask->shape[1] != S) {
            int64_t want[2] = {B, S};
            cmi_fail(tp, CM_ERR_SHAPE, "attention: key_padding_mask %s must be (B, S) = %s for k %s", cmi_shape(mask),
                     cmi_shape_of(2, want), cmi_shape(k));
            return NULL;
        }
    }
    if (cmi_be(tp)) {
        if (!(o.dropout_p >= 0.0f && o.dropout_p <= 1.0f)) {
            cmi_fail(tp, CM_ERR_INVALID_ARG, "attention: dropout_p %g must be in [0, 1]", (double)o.dropout_p);
            return NULL;
        }
        if (o.dropout_p > 0.0f && !o.rng) {
            cmi_fail(tp, CM_ERR_INVALID_ARG, "attention: rng is NULL (dropout_p %g > 0 needs a generator)",
                     (double)o.dropout_p);
            return NULL;
        }
        if (bias && !cmi_fetch(tp, 1, &bias)) return NULL;
        if (mask && !cmi_fetch(tp, 1, &mask)) return NULL;
        return attention_dev(tp, q, k, v, &o, bst);
    }
    /* Layouts sgemm cannot take are copied (a recorded op: gradients flow back through it). */
    mat_ref mq, mk, mv;
    if (!mat_ref_of(q, &mq) && (!(q = cm_contiguous(tp, q)) || !mat_ref_of(q, &mq))) return NULL;
    if (!mat_ref_of(k, &mk) && (!(k = cm_contiguous(tp, k)) || !mat_ref_of(k, &mk))) return NULL;
    if (!mat_ref_of(v, &mv) && (!(v = cm_contiguous(tp, v)) || !mat_ref_of(v, &mv))) return NULL;
    if (o.out_bthd && H * D > INT_MAX) {
        cmi_fail(tp, CM_ERR_SHAPE, "attention: q %s: H·D must be below 2^31 with out_bthd", cmi_shape(q));
        return NULL;
    }
    if (!(o.dropout_p >= 0.0f && o.dropout_p <= 1.0f)) {
        cmi_fail(tp, CM_ERR_INVALID_ARG, "attention: dropout_p %g must be in [0, 1]", (double)o.dropout_p);
        return NULL;
    }
    if (o.dropout_p > 0.0f && !o.rng) {
        cmi_fail(tp, CM_ERR_INVALID_ARG, "attention: rng is NULL (dropout_p %g > 0 needs a generator)",
                 (double)o.dropout_p);
        return NULL;
    }

    const int64_t oshape[4] = {B, o.out_bthd ? T : H, o.out_bthd ? H : T, D};
    cm_tensor *out = cmi_new(tp, CM_DTYPE_F32, 4, oshape); // (B, H, T, D) or (B, T, H, D)
    if (!out) return NULL;
    cm_tensor *ins[4] = {q, k, v, bias};
    const bool grad = cmi_needs_grad(tp, 4, ins);
    const float scale = o.scale != 0.0f ? o.scale : (D > 0 ? 1.0f / sqrtf((float)D) : 1.0f);
    const int64_t BH = B * H, TS = T * S, RB = row_block(T);
    const int nth = (BH > 1 && BH * TS * D >= CMI_PAR_MIN) ? cm_num_threads() : 1;
    score_src src = {mq, mk, scale, o.causal, S, D, bias ? cmi_f32(bias) : NULL, {0, 0, 0, 0}, NULL};
    memcpy(src.bst, bst, sizeof src.bst);
    /* What the backward needs stays in the arena: the padding mask's (B, S) rows and the dropout
     * mask's bits. Everything after the mark is scratch for this call. */
    if (grad && mask && !(src.mrows = mask_rows(tp, mask))) return NULL;
    const float keep_scale = o.dropout_p < 1.0f ? 1.0f / (1.0f - o.dropout_p) : 0.0f;
    uint8_t *bits = NULL; /* kept for the backward */
    if (o.dropout_p > 0.0f && grad && !(bits = cmi_scratch(tp, (size_t)((BH * TS + 7) / 8) + 1))) return NULL;
    const size_t mark = cm_arena_mark(tp->arena);
    if (!grad && mask && !(src.mrows = mask_rows(tp, mask))) return NULL;
    uint8_t *drop = NULL; /* (B, H, T, S) one byte per probability, 1 = dropped: this call only */
    if (o.dropout_p > 0.0f) {
        /* drawn as cm_dropout draws it for the contiguous (B, H, T, S) probabilities (keyed by global
         * row under the tape's row context) */
        if (!(drop = cmi_scratch(tp, (size_t)(BH * TS) + 1))) return NULL;
        cmi_rng_note(tp, o.rng);
        cmi_dropout_mask(tp, o.rng, drop, B, BH * TS, o.dropout_p); /* rows: the batch dim */
        if (bits) pack_bits(drop, BH * TS, bits);
    }
    const size_t blk = (size_t)(RB * S);
    float *ov = cmi_f32(out);
    if (T * S * D == 0) {
        /* No keys (every row masked), no queries, or D == 0: the result is all zeros. */
        memset(ov, 0, sizeof(float) * (size_t)(B * H * T * D));
    } else {
        float *P_all = cmi_scratch(tp, sizeof(float) * blk * (size_t)nth); /* (nth, RB, S) */
        float *pd_all = drop ? cmi_scratch(tp, sizeof(float) * blk * (size_t)nth) : NULL;
        if (!P_all || (drop && !pd_all)) return NULL;
        const int iS = (int)S, iD = (int)D, ldo = (int)(o.out_bthd ? H * D : D);
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1)
        for (int64_t bh = 0; bh < BH; bh++) {
            const int64_t b = bh / H, h = bh % H, th = omp_get_thread_num();
            float *P = P_all + th * (int64_t)blk; // (RB, S)
            float *O = ov + out_base(o.out_bthd, b, h, H, T, D); // (T, D), row stride ldo
            for (int64_t i0 = 0; i0 < T; i0 += RB) {
                const int64_t i1 = i0 + RB < T ? i0 + RB : T, kn = o.causal && i1 < S ? i1 : S; /* keys [0, kn) */
                const int m = (int)(i1 - i0), kk = (int)kn;
                softmax_block(&src, b, h, i0, m, kn, P);
                /* out (m, D) = Pd·v (Pd = P after dropout) */
                const float *A = P;
                int lda = iS;
                if (drop) {
                    float *Pd = pd_all + th * (int64_t)blk;
                    apply_dropout(P, drop + bh * TS + i0 * S, S, S, m, kn, keep_scale, Pd);
                    A = Pd, lda = kk;
                }
                att_sgemm(CblasNoTrans, mv.tr, m, iD, kk, 1.0f, A, lda, mat_at(&mv, b, h), mv.ld, 0.0f, O + i0 * ldo,
                          ldo);
            }
        }
    }
    cm_arena_rewind(tp->arena, mark);
    if (grad) {
        cm_node *n = cmi_record(tp, "attention", out, 4, ins, attention_backward, sizeof(attn_ctx));
        if (!n) return NULL;
        attn_ctx *c = n->ctx;
        c->src = src;
        c->drop = bits;
        c->keep_scale = keep_scale;
        c->bthd = o.out_bthd;
    }
    return out;
}
