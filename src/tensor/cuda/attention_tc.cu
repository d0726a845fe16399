/* Attention on the tensor cores, under bf16 autocast (sm_80 and later): FlashAttention-2's kernels on
 * the bf16 mma (cmi_mma_16816, m16n8k16, f32 accumulation), with the semantics of the f32 kernels in
 * attention.cu — causal (top-left), additive bias, key padding mask, dropout from the same Philox
 * counters, fully masked rows giving zeros, one log-sum-exp per query, and a deterministic backward
 * in two kernels (query rows: dQ and Di = rowsum(dO ⊙ O); key rows: dK and dV), no atomics.
 *
 * What is rounded to bf16 (PyTorch's autocast SDPA in bf16 rounds the same operands): q, k and v as
 * they are staged, the probabilities before P·V (the forward's unnormalised exp(s − m), the
 * backward's exp(s − lse), after dropout), dO, and dS before dS·K and dSᵀ·Q. Scores, the softmax,
 * its row sums, Di and every accumulation stay f32. The CPU op computes in f32; the two agree to
 * bf16 precision (test_backend_ops states the bound).
 *
 * Layout. A block of 4 warps owns 64 rows (queries in the forward and dQ, keys in dK/dV); warp w
 * owns rows 16w..16w+15 and, per 64-wide tile of the other side, computes its 16 x 64 scores as 8
 * mma tiles of 16 x 8 over the head dim in steps of 16. With g = lane / 4 and t = lane % 4 a lane
 * holds scores (g, 8n + 2t, +1) and (g + 8, 8n + 2t, +1) of tile n (cmi_mma_16816's C layout), so a
 * row's max and sum need the 4 lanes of a quad (xor shuffles 1 and 2), and two neighbouring C tiles
 * are the A fragment of the next product as they stand (FlashAttention-2's register reuse). Operands
 * are staged in shared memory as bf16: row-major tiles [row][d] (stride DP + 8) feed A fragments and
 * Bᵀ reads; transposed tiles [d][row] (stride 72) feed the B fragments of P·V, dS·K, Pᵀ·dO and dSᵀ·Q.
 * The +8 padding puts the 8 rows a fragment read touches in distinct banks. The head dim is padded
 * with zeros to DP = 16·KD (KD = 1, 2, 4, 8: D <= 128). Per score, what is not tensor-core work is
 * kept short: tiles inside the causal triangle without bias or padding skip the masking (tc_plain),
 * exponentials are __expf (ex2.approx: a few ulp, far below the bf16 rounding of P), and pairs are
 * rounded and packed by one cvt instruction. */
#include "tensor/cuda/attention.cuh"

#include <stdlib.h>

#define TC_N 64        /* rows of a block and of a tile */
#define TC_THREADS 128 /* 4 warps of 16 rows */
#define TC_TLD 72      /* stride (bf16) of a transposed tile [d][row] */

template <int KD> struct tc_geom {
    static constexpr int DP = 16 * KD;         /* the head dim, padded */
    static constexpr int LD = DP + 8;          /* stride (bf16) of a row-major tile [row][d] */
    static constexpr int ROW = TC_N * LD;      /* bf16 elements of a row-major tile */
    static constexpr int TR = DP * TC_TLD;     /* of a transposed one */
    static constexpr size_t FWD_SMEM = (size_t)(2 * ROW + TR) * 2;
    static constexpr size_t BWDQ_SMEM = (size_t)(4 * ROW + TR) * 2 + TC_N * sizeof(float);
    static constexpr size_t BWDKV_SMEM = (size_t)(4 * ROW + 2 * TR) * 2 + 2 * TC_N * sizeof(float);
};

/* Two floats as a bf16 pair (the lower index in the lower half), rounded to nearest even: one cvt
 * on the GPU (the same bits as cmi_df32_to_bf16 except a NaN's payload), the bit-exact function on
 * the emulator. */
__device__ __forceinline__ uint32_t tc_pack(float lo, float hi) {
#if !defined(CMI_CUDA_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); /* the first source to the upper half */
    return r;
#else
    return (uint32_t)cmi_df32_to_bf16(lo) | (uint32_t)cmi_df32_to_bf16(hi) << 16;
#endif
}
__device__ __forceinline__ uint16_t tc_bf16(float x) { return (uint16_t)(tc_pack(x, 0.0f) & 0xffffu); }

/* Whether the 64 x 64 scores of query rows [i0, i0 + 64) and keys [j0, j0 + 64) need no masking:
 * every row and key inside T and S, no bias or padding mask, and under the causal mask every key
 * at or before every row — then at_score would only scale (FlashAttention masks only the tiles on
 * the boundary). The same for every thread of the block. */
__device__ __forceinline__ bool tc_plain(const at_args &a, int64_t i0, int64_t j0) {
    return !a.bias && !a.mrow && i0 + TC_N <= a.T && j0 + TC_N <= a.S && (!a.causal || j0 + TC_N - 1 <= i0);
}

/* Rows [r0, r0 + 64) of an (n, D) f32 slice at `base` (strides sn, sd), rounded to bf16, into a
 * shared tile: row-major (dst[r·LD + d]) or transposed (dst[d·TC_TLD + r]); zeros past n and from D
 * to DP. Consecutive threads take consecutive d, so a contiguous row reads coalesced. */
template <int KD>
__device__ __forceinline__ void tc_load(uint16_t *dst, bool transposed, const float *base, int64_t sn, int64_t sd,
                                        int64_t r0, int64_t n, int64_t D) {
    constexpr int DP = tc_geom<KD>::DP, LD = tc_geom<KD>::LD;
    if (sd == 1 && (D & 3) == 0 && (sn & 3) == 0 && ((uintptr_t)base & 15) == 0) { /* float4 reads */
        for (int e = threadIdx.x; e < TC_N * DP / 4; e += TC_THREADS) {
            const int r = e / (DP / 4), d = e % (DP / 4) * 4;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (d < D && r0 + r < n) v = *(const float4 *)(base + (r0 + r) * sn + d);
            if (transposed) {
                dst[d * TC_TLD + r] = tc_bf16(v.x);
                dst[(d + 1) * TC_TLD + r] = tc_bf16(v.y);
                dst[(d + 2) * TC_TLD + r] = tc_bf16(v.z);
                dst[(d + 3) * TC_TLD + r] = tc_bf16(v.w);
            } else {
                uint32_t *p = (uint32_t *)(dst + r * LD + d);
                p[0] = tc_pack(v.x, v.y);
                p[1] = tc_pack(v.z, v.w);
            }
        }
        return;
    }
    for (int e = threadIdx.x; e < TC_N * DP; e += TC_THREADS) {
        const int r = e / DP, d = e % DP;
        const float v = d < D && r0 + r < n ? base[(r0 + r) * sn + d * sd] : 0.0f;
        dst[transposed ? d * TC_TLD + r : r * LD + d] = tc_bf16(v);
    }
}

__device__ __forceinline__ uint32_t tc_ld32(const uint16_t *p) { return *(const uint32_t *)p; }

/* The A fragment (16 x 16) at rows [r0, r0 + 16), columns [c0, c0 + 16) of a bf16 tile (stride ld). */
__device__ __forceinline__ void tc_frag_a(uint32_t a[4], const uint16_t *tile, int ld, int r0, int c0) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint16_t *p = tile + (r0 + g) * ld + c0 + 2 * t;
    a[0] = tc_ld32(p);
    a[1] = tc_ld32(p + 8 * ld);
    a[2] = tc_ld32(p + 8);
    a[3] = tc_ld32(p + 8 * ld + 8);
}

/* The B fragment (16 x 8, k x n) whose element (k, n) is tile[(n0 + n)·ld + k0 + k]: rows of the
 * tile read as columns of B. */
__device__ __forceinline__ void tc_frag_b(uint32_t b[2], const uint16_t *tile, int ld, int n0, int k0) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint16_t *p = tile + (n0 + g) * ld + k0 + 2 * t;
    b[0] = tc_ld32(p);
    b[1] = tc_ld32(p + 8);
}

/* Two C tiles (16 x 8 each: columns [0, 8) and [8, 16)) as one A fragment (16 x 16), rounded. */
__device__ __forceinline__ void tc_c_to_a(uint32_t a[4], const float c0[4], const float c1[4]) {
    a[0] = tc_pack(c0[0], c0[1]);
    a[1] = tc_pack(c0[2], c0[3]);
    a[2] = tc_pack(c1[0], c1[1]);
    a[3] = tc_pack(c1[2], c1[3]);
}

/* Max and sum over the 4 lanes of a quad (the lanes that share a row). */
__device__ __forceinline__ float tc_quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float tc_quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* acc[8][4] (16 rows x 64 columns) += A (rows [16w, 16w + 16) of the row-major tile At) · Bᵀ (rows
 * [0, 64) of the row-major tile Bt), over the padded head dim. */
template <int KD>
__device__ __forceinline__ void tc_scores(float acc[8][4], const uint16_t *At, int ra, const uint16_t *Bt) {
    constexpr int LD = tc_geom<KD>::LD;
    CMI_UNROLL
    for (int kk = 0; kk < KD; kk++) {
        uint32_t fa[4];
        tc_frag_a(fa, At, LD, ra, 16 * kk);
        CMI_UNROLL
        for (int nt = 0; nt < 8; nt++) {
            uint32_t fb[2];
            tc_frag_b(fb, Bt, LD, 8 * nt, 16 * kk);
            cmi_mma_16816(acc[nt], fa, fb, acc[nt]);
        }
    }
}

/* acc[2KD][4] (16 rows x DP) += C (16 x 64, as 8 C tiles, rounded to bf16) · the 64 rows of the
 * transposed tile Tt ([d][row]). */
template <int KD>
__device__ __forceinline__ void tc_times_rows(float acc[2 * KD][4], const float c[8][4], const uint16_t *Tt) {
    CMI_UNROLL
    for (int kc = 0; kc < 4; kc++) {
        uint32_t fa[4];
        tc_c_to_a(fa, c[2 * kc], c[2 * kc + 1]);
        CMI_UNROLL
        for (int dt = 0; dt < 2 * KD; dt++) {
            uint32_t fb[2];
            tc_frag_b(fb, Tt, TC_TLD, 8 * dt, 16 * kc);
            cmi_mma_16816(acc[dt], fa, fb, acc[dt]);
        }
    }
}

/* Writes rows (r0 + g, r0 + g + 8) of a 16 x DP accumulator, scaled: row r at dst(r) (or nothing
 * where dst returns NULL), columns below D; fresh rows are written, others added to. */
template <int KD, class RowPtr>
__device__ __forceinline__ void tc_store(const float acc[2 * KD][4], const float scale[2], int64_t D, bool fresh,
                                         RowPtr dst) {
    const int lane = threadIdx.x & 31, t = lane & 3;
    CMI_UNROLL
    for (int r = 0; r < 2; r++) {
        float *row = dst(r);
        if (!row) continue;
        CMI_UNROLL
        for (int dt = 0; dt < 2 * KD; dt++)
            CMI_UNROLL
            for (int e = 0; e < 2; e++) {
                const int c = 8 * dt + 2 * t + e;
                if (c >= D) continue;
                const float v = scale[r] * acc[dt][2 * r + e];
                row[c] = fresh ? v : row[c] + v;
            }
    }
}

/* ---- forward ---- */

template <int KD> __global__ void __launch_bounds__(TC_THREADS) k_attention_fwd_tc(at_args a, float *out, float *lse) {
    typedef tc_geom<KD> G;
    CMI_DYN_SMEM(uint16_t, sm);
    uint16_t *Qs = sm, *Ks = Qs + G::ROW, *Vt = Ks + G::ROW;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t bh = blockIdx.y, b = bh / a.H, h = bh % a.H, i0 = (int64_t)blockIdx.x * TC_N;
    const at_slice sl = at_slice_of(a, nullptr, b, h);
    const float *qb = sl.q, *kb = sl.k, *vb = sl.v;
    tc_load<KD>(Qs, false, qb, a.qs[2], a.qs[3], i0, a.T, a.D);
    const int64_t ilast = (i0 + TC_N < a.T ? i0 + TC_N : a.T) - 1;
    const int64_t kend = a.causal ? (ilast + 1 < a.S ? ilast + 1 : a.S) : a.S;
    const int64_t ir[2] = {i0 + 16 * w + g, i0 + 16 * w + g + 8}; /* this lane's two query rows */
    float o[2 * KD][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    for (int64_t j0 = 0; j0 < kend; j0 += TC_N) {
        __syncthreads(); /* the previous tile's K and V are read */
        tc_load<KD>(Ks, false, kb, a.ks[2], a.ks[3], j0, a.S, a.D);
        tc_load<KD>(Vt, true, vb, a.vs[2], a.vs[3], j0, a.S, a.D);
        __syncthreads();
        float s[8][4] = {};
        tc_scores<KD>(s, Qs, 16 * w, Ks);
        float mt[2] = {-INFINITY, -INFINITY};
        const bool plain = tc_plain(a, i0, j0);
        CMI_UNROLL
        for (int nt = 0; nt < 8; nt++)
            CMI_UNROLL
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1;
                s[nt][e] = plain ? s[nt][e] * a.scale
                                 : at_score(a, b, h, ir[r], j0 + 8 * nt + 2 * t + (e & 1), s[nt][e] * a.scale);
                mt[r] = fmaxf(mt[r], s[nt][e]);
            }
        float corr[2];
        CMI_UNROLL
        for (int r = 0; r < 2; r++) {
            const float mn = fmaxf(m[r], tc_quad_max(mt[r]));
            corr[r] = m[r] == -INFINITY ? 0.0f : __expf(m[r] - mn);
            m[r] = mn;
            l[r] *= corr[r]; /* this lane's part of the row sum: the quad's parts are added at the end */
        }
        CMI_UNROLL
        for (int nt = 0; nt < 8; nt++)
            CMI_UNROLL
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1;
                const float ev = s[nt][e] == -INFINITY ? 0.0f : __expf(s[nt][e] - m[r]);
                l[r] += ev;
                s[nt][e] = ev != 0.0f ? ev * at_drop_factor(a, b, h, ir[r], j0 + 8 * nt + 2 * t + (e & 1)) : 0.0f;
            }
        CMI_UNROLL
        for (int dt = 0; dt < 2 * KD; dt++) {
            o[dt][0] *= corr[0], o[dt][1] *= corr[0];
            o[dt][2] *= corr[1], o[dt][3] *= corr[1];
        }
        tc_times_rows<KD>(o, s, Vt); /* keys past kend have P = 0 and V rows of zeros past S */
    }
    float inv[2];
    CMI_UNROLL
    for (int r = 0; r < 2; r++) {
        const float lt = tc_quad_sum(l[r]);
        inv[r] = lt > 0.0f ? 1.0f / lt : 0.0f;
        if (t == 0 && ir[r] < a.T) lse[bh * a.T + ir[r]] = lt > 0.0f ? m[r] + logf(lt) : INFINITY;
    }
    tc_store<KD>(o, inv, a.D, true, [&](int r) { return ir[r] < a.T ? out + at_out_off(a, b, h, ir[r]) : nullptr; });
}

/* ---- backward: query rows (dQ = scale·dS·K, and Di = rowsum(dO ⊙ O) for the keys' kernel) ---- */

template <int KD>
__global__ void __launch_bounds__(TC_THREADS)
    k_attention_bwd_q_tc(at_args a, const float *out, const float *gout, const float *lse, float *Dsum, float *gq,
                         bool q_fresh, float *dS) {
    typedef tc_geom<KD> G;
    CMI_DYN_SMEM(uint16_t, sm);
    uint16_t *Qs = sm, *Gs = Qs + G::ROW, *Ks = Gs + G::ROW, *Vs = Ks + G::ROW, *Kt = Vs + G::ROW;
    float *Ds = (float *)(Kt + G::TR);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t bh = blockIdx.y, b = bh / a.H, h = bh % a.H, i0 = (int64_t)blockIdx.x * TC_N;
    const at_slice sl = at_slice_of(a, gout, b, h);
    const float *qb = sl.q, *kb = sl.k, *vb = sl.v, *gb = sl.g;
    const int64_t gstride = sl.gs;
    tc_load<KD>(Qs, false, qb, a.qs[2], a.qs[3], i0, a.T, a.D);
    tc_load<KD>(Gs, false, gb, gstride, 1, i0, a.T, a.D);
    at_block_di(a, out, gout, b, h, i0, TC_N, Ds, Dsum); /* f32, from f32 dO and O */
    __syncthreads();
    const int64_t ir[2] = {i0 + 16 * w + g, i0 + 16 * w + g + 8};
    float di[2], li[2];
    CMI_UNROLL
    for (int r = 0; r < 2; r++) {
        di[r] = Ds[16 * w + g + 8 * r];
        li[r] = ir[r] < a.T ? lse[bh * a.T + ir[r]] : INFINITY;
    }
    const int64_t ilast = (i0 + TC_N < a.T ? i0 + TC_N : a.T) - 1;
    const int64_t kend = a.causal ? (ilast + 1 < a.S ? ilast + 1 : a.S) : a.S;
    float dq[2 * KD][4] = {};
    for (int64_t j0 = 0; j0 < kend; j0 += TC_N) {
        __syncthreads(); /* the previous tile's K is read */
        tc_load<KD>(Ks, false, kb, a.ks[2], a.ks[3], j0, a.S, a.D);
        tc_load<KD>(Vs, false, vb, a.vs[2], a.vs[3], j0, a.S, a.D);
        tc_load<KD>(Kt, true, kb, a.ks[2], a.ks[3], j0, a.S, a.D);
        __syncthreads();
        float s[8][4] = {}, dp[8][4] = {};
        tc_scores<KD>(s, Qs, 16 * w, Ks);  /* q·kᵀ */
        tc_scores<KD>(dp, Gs, 16 * w, Vs); /* dO·vᵀ */
        const bool plain = tc_plain(a, i0, j0);
        CMI_UNROLL
        for (int nt = 0; nt < 8; nt++)
            CMI_UNROLL
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1;
                const int64_t i = ir[r], j = j0 + 8 * nt + 2 * t + (e & 1);
                const float sc = plain ? s[nt][e] * a.scale : at_score(a, b, h, i, j, s[nt][e] * a.scale);
                const float P = (sc == -INFINITY || li[r] == INFINITY) ? 0.0f : __expf(sc - li[r]);
                const float f = P != 0.0f ? at_drop_factor(a, b, h, i, j) : 0.0f;
                const float ds = P * (dp[nt][e] * f - di[r]);
                if (dS && i < a.T && j < a.S) dS[(bh * a.T + i) * a.S + j] = ds;
                s[nt][e] = ds;
            }
        tc_times_rows<KD>(dq, s, Kt);
    }
    const float sc2[2] = {a.scale, a.scale};
    tc_store<KD>(dq, sc2, a.D, q_fresh, [&](int r) { return ir[r] < a.T ? gq + (bh * a.T + ir[r]) * a.D : nullptr; });
}

/* ---- backward: key rows (dV = Pᵀ·dO, dK = scale·dSᵀ·Q; the scores recomputed as K·Qᵀ) ---- */

template <int KD>
__global__ void __launch_bounds__(TC_THREADS)
    k_attention_bwd_kv_tc(at_args a, const float *gout, const float *lse, const float *Dsum, float *gk, bool k_fresh,
                          float *gv, bool v_fresh) {
    typedef tc_geom<KD> G;
    CMI_DYN_SMEM(uint16_t, sm);
    uint16_t *Ks = sm, *Vs = Ks + G::ROW, *Qs = Vs + G::ROW, *Gs = Qs + G::ROW, *Qt = Gs + G::ROW, *Gt = Qt + G::TR;
    float *Lt = (float *)(Gt + G::TR), *Dt = Lt + TC_N;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t bh = blockIdx.y, b = bh / a.H, h = bh % a.H, j0 = (int64_t)blockIdx.x * TC_N;
    const at_slice sl = at_slice_of(a, gout, b, h);
    const float *qb = sl.q, *kb = sl.k, *vb = sl.v, *gb = sl.g;
    const int64_t gstride = sl.gs;
    tc_load<KD>(Ks, false, kb, a.ks[2], a.ks[3], j0, a.S, a.D);
    tc_load<KD>(Vs, false, vb, a.vs[2], a.vs[3], j0, a.S, a.D);
    const int64_t jr[2] = {j0 + 16 * w + g, j0 + 16 * w + g + 8}; /* this lane's two key rows */
    const int64_t istart = a.causal ? j0 : 0; /* causal: only queries i >= j see key j */
    float dk[2 * KD][4] = {}, dv[2 * KD][4] = {};
    for (int64_t i0 = istart; i0 < a.T; i0 += TC_N) {
        __syncthreads(); /* the previous tile's Q, dO, lse and Di are read */
        tc_load<KD>(Qs, false, qb, a.qs[2], a.qs[3], i0, a.T, a.D);
        tc_load<KD>(Gs, false, gb, gstride, 1, i0, a.T, a.D);
        tc_load<KD>(Qt, true, qb, a.qs[2], a.qs[3], i0, a.T, a.D);
        tc_load<KD>(Gt, true, gb, gstride, 1, i0, a.T, a.D);
        if (threadIdx.x < TC_N) {
            const int64_t ii = i0 + threadIdx.x;
            Lt[threadIdx.x] = ii < a.T ? lse[bh * a.T + ii] : INFINITY;
            Dt[threadIdx.x] = ii < a.T ? Dsum[bh * a.T + ii] : 0.0f;
        }
        __syncthreads();
        float s[8][4] = {}, dp[8][4] = {}; /* [key][query] */
        tc_scores<KD>(s, Ks, 16 * w, Qs);  /* k·qᵀ */
        tc_scores<KD>(dp, Vs, 16 * w, Gs); /* v·dOᵀ */
        const bool plain = tc_plain(a, i0, j0);
        CMI_UNROLL
        for (int nt = 0; nt < 8; nt++)
            CMI_UNROLL
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1, c = 8 * nt + 2 * t + (e & 1);
                const int64_t i = i0 + c, j = jr[r];
                const float li = Lt[c];
                const float sc = plain ? s[nt][e] * a.scale : at_score(a, b, h, i, j, s[nt][e] * a.scale);
                const float P = (sc == -INFINITY || li == INFINITY) ? 0.0f : __expf(sc - li);
                const float f = P != 0.0f ? at_drop_factor(a, b, h, i, j) : 0.0f;
                s[nt][e] = P * f;
                dp[nt][e] = P * (dp[nt][e] * f - Dt[c]);
            }
        tc_times_rows<KD>(dv, s, Gt);  /* Pᵀ·dO */
        tc_times_rows<KD>(dk, dp, Qt); /* dSᵀ·Q */
    }
    const float one[2] = {1.0f, 1.0f}, sc2[2] = {a.scale, a.scale};
    if (gk)
        tc_store<KD>(dk, sc2, a.D, k_fresh,
                     [&](int r) { return jr[r] < a.S ? gk + (bh * a.S + jr[r]) * a.D : nullptr; });
    if (gv)
        tc_store<KD>(dv, one, a.D, v_fresh,
                     [&](int r) { return jr[r] < a.S ? gv + (bh * a.S + jr[r]) * a.D : nullptr; });
}

/* ---- dispatch ---- */

static int tc_kd(int64_t D) { return D <= 16 ? 1 : D <= 32 ? 2 : D <= 64 ? 4 : 8; }

/* Whether the kernels of one KD were compiled with the mma and get the shared memory they need,
 * asked once (where not, the f32 kernels run). */
template <int KD> static bool tc_grant() {
    static int ok = -1;
    if (ok < 0) {
        typedef tc_geom<KD> G;
        ok = cmi_cuda_kernel_has_mma((const void *)k_attention_fwd_tc<KD>) &&
             cudaFuncSetAttribute((const void *)k_attention_fwd_tc<KD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)G::FWD_SMEM) == cudaSuccess &&
             cudaFuncSetAttribute((const void *)k_attention_bwd_q_tc<KD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)G::BWDQ_SMEM) == cudaSuccess &&
             cudaFuncSetAttribute((const void *)k_attention_bwd_kv_tc<KD>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, (int)G::BWDKV_SMEM) == cudaSuccess;
        if (!ok) (void)cudaGetLastError(); /* the refusal is not an error of the next launch */
    }
    return ok == 1;
}

bool at_tc_usable(int64_t D) {
    if (D > 128 || cmi_cuda_cc() < 80) return false;
    const char *env = getenv("CM_CUDA_ATTENTION");
    if (env && (strcmp(env, "f32") == 0 || strcmp(env, "rowwise") == 0)) return false;
    switch (tc_kd(D)) {
    case 1: return tc_grant<1>();
    case 2: return tc_grant<2>();
    case 4: return tc_grant<4>();
    default: return tc_grant<8>();
    }
}

template <int KD> static cm_status tc_forward(const at_args &a, float *out, float *lse) {
    const dim3 grid((unsigned)((a.T + TC_N - 1) / TC_N), (unsigned)(a.B * a.H));
    CMI_LAUNCH(k_attention_fwd_tc<KD>, grid, TC_THREADS, tc_geom<KD>::FWD_SMEM, cmi_cuda_stream(), a, out, lse);
    return cmi_cuda_launched("attention (tensor cores)");
}

cm_status at_tc_forward(const at_args &a, float *out, float *lse) {
    switch (tc_kd(a.D)) {
    case 1: return tc_forward<1>(a, out, lse);
    case 2: return tc_forward<2>(a, out, lse);
    case 4: return tc_forward<4>(a, out, lse);
    default: return tc_forward<8>(a, out, lse);
    }
}

template <int KD>
static cm_status tc_backward(const at_args &a, const float *out, const float *gout, const float *lse, float *Dsum,
                             float *gq, bool q_fresh, bool run_kv, float *gk, bool k_fresh, float *gv, bool v_fresh,
                             float *dS) {
    typedef tc_geom<KD> G;
    cudaStream_t s = cmi_cuda_stream();
    const dim3 gq_grid((unsigned)((a.T + TC_N - 1) / TC_N), (unsigned)(a.B * a.H));
    CMI_LAUNCH(k_attention_bwd_q_tc<KD>, gq_grid, TC_THREADS, G::BWDQ_SMEM, s, a, out, gout, lse, Dsum, gq, q_fresh,
               dS);
    cm_status st = cmi_cuda_launched("attention backward (queries, tensor cores)");
    if (st || !run_kv) return st;
    const dim3 gk_grid((unsigned)((a.S + TC_N - 1) / TC_N), (unsigned)(a.B * a.H));
    CMI_LAUNCH(k_attention_bwd_kv_tc<KD>, gk_grid, TC_THREADS, G::BWDKV_SMEM, s, a, gout, lse, Dsum, gk, k_fresh, gv,
               v_fresh);
    return cmi_cuda_launched("attention backward (keys, tensor cores)");
}

cm_status at_tc_backward(const at_args &a, const float *out, const float *gout, const float *lse, float *Dsum,
                         float *gq, bool q_fresh, bool run_kv, float *gk, bool k_fresh, float *gv, bool v_fresh,
                         float *dS) {
    switch (tc_kd(a.D)) {
    case 1: return tc_backward<1>(a, out, gout, lse, Dsum, gq, q_fresh, run_kv, gk, k_fresh, gv, v_fresh, dS);
    case 2: return tc_backward<2>(a, out, gout, lse, Dsum, gq, q_fresh, run_kv, gk, k_fresh, gv, v_fresh, dS);
    case 4: return tc_backward<4>(a, out, gout, lse, Dsum, gq, q_fresh, run_kv, gk, k_fresh, gv, v_fresh, dS);
    default: return tc_backward<8>(a, out, gout, lse, Dsum, gq, q_fresh, run_kv, gk, k_fresh, gv, v_fresh, dS);
    }
}
