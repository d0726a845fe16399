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
 * are the A fragment of the next product as they stand (FlashAttention-2's register reuse).
 *
 * Data movement (since 2026-11-29; the first version staged f32 tiles itself and ran at 3-4 TFLOP/s
 * on the H200). q, k, v and dO are rounded to bf16 once per call into (b, h) slices padded with
 * zeros to whole tiles and DP = 16·KD columns (k_tc_stage; KD = 1, 2, 4, 8: D <= 128). Tiles go
 * from there to shared memory by cp.async, 16 bytes a copy, the other side's next tile on its way
 * while the current one is used (two buffers). Shared tiles are [row][d] with stride DP + 8 (16-byte
 * rows whose 8 rows of a fragment fall in 8 different bank groups); fragments come out by ldmatrix
 * — plain for A and for Bᵀ (the scores' K, Q, V, dO rows), transposing for the B of P·V, dS·K, Pᵀ·dO
 * and dSᵀ·Q, so no tile is stored transposed. Per score, what is not tensor-core work is
 * kept short: tiles inside the causal triangle without bias or padding skip the masking (tc_plain),
 * exponentials are __expf (ex2.approx: a few ulp, far below the bf16 rounding of P), and pairs are
 * rounded and packed by one cvt instruction. */
#include "tensor/cuda/attention.cuh"

#include <stdlib.h>

#define TC_N 64        /* rows of a block and of a tile */
#define TC_THREADS 128 /* 4 warps of 16 rows */

template <int KD> struct tc_geom {
    static constexpr int DP = 16 * KD;         /* the head dim, padded */
    static constexpr int LD = DP + 8;          /* stride (bf16) of a tile [row][d]: 16-byte rows, */
                                               /* a fragment's 8 rows in 8 bank groups */
    static constexpr int ROW = TC_N * LD;      /* bf16 elements of a tile */
    static constexpr size_t FWD_SMEM = (size_t)(5 * ROW) * 2;                          /* Q, K and V twice */
    static constexpr size_t BWDQ_SMEM = (size_t)(6 * ROW) * 2 + TC_N * sizeof(float);  /* Q, dO, K and V twice */
    static constexpr size_t BWDKV_SMEM = (size_t)(6 * ROW) * 2 + 4 * TC_N * sizeof(float); /* K, V, Q and dO twice */
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

/* Whether the 64 x 64 scores of query rows [i0, i0 + 64) and keys [j0, j0 + 64) need no masking:
 * every row and key inside T and S, no bias or padding mask, and under the causal mask every key
 * at or before every row — then at_score would only scale (FlashAttention masks only the tiles on
 * the boundary). The same for every thread of the block. */
__device__ __forceinline__ bool tc_plain(const at_args &a, int64_t i0, int64_t j0) {
    return !a.bias && !a.mrow && i0 + TC_N <= a.T && j0 + TC_N <= a.S && (!a.causal || j0 + TC_N - 1 <= i0);
}

/* ---- staging: q, k, v and dO as bf16, once per call ----
 * Each (b, h) slice of an (n, D) f32 operand (strides s0..s3 over b, h, row, d) becomes rows of DP
 * bf16 in dst[(bh·np + r)·DP + d], zeros past n rows (up to np, a whole number of tiles) and past D
 * columns. A tile is then 64 rows of DP·2 bytes that cp.async copies 16 bytes at a time with no
 * bounds checks, and every block reads its tiles already rounded (before this, each query block
 * read K and V as f32 and rounded them again). A thread makes 8 columns of one row. */
struct tc_src {
    const float *p;
    int64_t s0, s1, s2, s3, n;
};

__global__ void k_tc_stage(tc_src src, int64_t H, int64_t D, int64_t np, int dp, int64_t total, uint16_t *dst) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t c8 = e % (dp / 8), r = e / (dp / 8) % np, bh = e / (dp / 8) / np;
        const float *row = src.p + bh / H * src.s0 + bh % H * src.s1 + r * src.s2;
        float v[8];
        CMI_UNROLL
        for (int k = 0; k < 8; k++) {
            const int64_t d = 8 * c8 + k;
            v[k] = r < src.n && d < D ? row[d * src.s3] : 0.0f;
        }
        uint4 o;
        o.x = tc_pack(v[0], v[1]), o.y = tc_pack(v[2], v[3]), o.z = tc_pack(v[4], v[5]), o.w = tc_pack(v[6], v[7]);
        *(uint4 *)(dst + e * 8) = o;
    }
}

/* Rows [r0, r0 + 64) of a staged slice (row stride DP) into a shared tile (stride LD), as cp.async
 * copies in the calling thread's current group. */
template <int KD> __device__ __forceinline__ void tc_fetch(uint16_t *tile, const uint16_t *slice, int64_t r0) {
    constexpr int DP = tc_geom<KD>::DP, LD = tc_geom<KD>::LD, C = DP / 8;
    const uint16_t *src = slice + r0 * DP;
    for (int e = threadIdx.x; e < TC_N * C; e += TC_THREADS) cmi_cp_async16(tile + e / C * LD + e % C * 8, src + e * 8);
}

/* One step of the double buffer over the other side's tiles: the tile after [r0, r0 + 64), if one
 * starts before `end`, of two staged slices into buffers buf ^ 1 of A and B (their copies in a new
 * group); then this tile's copies waited for and the block synchronised. */
template <int KD>
__device__ __forceinline__ void tc_next(uint16_t *A, uint16_t *B, int buf, const uint16_t *sa, const uint16_t *sb,
                                        int64_t r0, int64_t end) {
    if (r0 + TC_N < end) {
        tc_fetch<KD>(A + (buf ^ 1) * tc_geom<KD>::ROW, sa, r0 + TC_N);
        tc_fetch<KD>(B + (buf ^ 1) * tc_geom<KD>::ROW, sb, r0 + TC_N);
        cmi_cp_async_commit();
        cmi_cp_async_wait<1>();
    } else {
        cmi_cp_async_wait<0>();
    }
    __syncthreads();
}

/* The A fragment (16 x 16) at rows [r0, r0 + 16), columns [c0, c0 + 16) of a tile: lanes 0-7 give
 * rows r0..r0+7 at c0 (a[0]), 8-15 rows r0+8.. at c0 (a[1]), 16-23 rows r0.. at c0+8 (a[2]),
 * 24-31 rows r0+8.. at c0+8 (a[3]) — cmi_mma_16816's A layout. */
template <int KD> __device__ __forceinline__ void tc_frag_a(uint32_t a[4], const uint16_t *tile, int r0, int c0) {
    const int lane = threadIdx.x & 31;
    cmi_ldsm_x4(a, tile + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * tc_geom<KD>::LD + c0 + (lane >> 4) * 8);
}

/* The B fragments (16 x 8, k x n) of two neighbouring column groups, n0 and n0 + 8, where B(k, n) is
 * tile[(n0 + n)·LD + k0 + k] (rows of the tile read as columns of B: Kᵀ for q·kᵀ): b0 for n0,
 * b1 for n0 + 8. Matrices: (n0, k0), (n0, k0 + 8), (n0 + 8, k0), (n0 + 8, k0 + 8). */
template <int KD>
__device__ __forceinline__ void tc_frag_bt(uint32_t b0[2], uint32_t b1[2], const uint16_t *tile, int n0, int k0) {
    const int lane = threadIdx.x & 31, m = lane >> 3;
    uint32_t r[4];
    cmi_ldsm_x4(r, tile + (n0 + (lane & 7) + (m >> 1) * 8) * tc_geom<KD>::LD + k0 + (m & 1) * 8);
    b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
}

/* The same where B(k, n) is tile[(k0 + k)·LD + n0 + n] (the tile as it stands: V for P·V, K for
 * dS·K, dO for Pᵀ·dO, Q for dSᵀ·Q), through the transposing load. Matrices: rows k0 and k0 + 8 at
 * column n0 (b0), then at n0 + 8 (b1). */
template <int KD>
__device__ __forceinline__ void tc_frag_b(uint32_t b0[2], uint32_t b1[2], const uint16_t *tile, int k0, int n0) {
    const int lane = threadIdx.x & 31, m = lane >> 3;
    uint32_t r[4];
    cmi_ldsm_x4_trans(r, tile + (k0 + (lane & 7) + (m & 1) * 8) * tc_geom<KD>::LD + n0 + (m >> 1) * 8);
    b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
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

/* acc[8][4] (16 rows x 64 columns) += A (rows [ra, ra + 16) of the tile At) · Bᵀ (rows [0, 64) of
 * the tile Bt), over the padded head dim. */
template <int KD>
__device__ __forceinline__ void tc_scores(float acc[8][4], const uint16_t *At, int ra, const uint16_t *Bt) {
    CMI_UNROLL
    for (int kk = 0; kk < KD; kk++) {
        uint32_t fa[4];
        tc_frag_a<KD>(fa, At, ra, 16 * kk);
        CMI_UNROLL
        for (int nt = 0; nt < 8; nt += 2) {
            uint32_t b0[2], b1[2];
            tc_frag_bt<KD>(b0, b1, Bt, 8 * nt, 16 * kk);
            cmi_mma_16816(acc[nt], fa, b0, acc[nt]);
            cmi_mma_16816(acc[nt + 1], fa, b1, acc[nt + 1]);
        }
    }
}

/* acc[2KD][4] (16 rows x DP) += C (16 x 64, as 8 C tiles, rounded to bf16) · the 64 rows of the
 * tile T ([row][d], read transposed). */
template <int KD>
__device__ __forceinline__ void tc_times_rows(float acc[2 * KD][4], const float c[8][4], const uint16_t *T) {
    CMI_UNROLL
    for (int kc = 0; kc < 4; kc++) {
        uint32_t fa[4];
        tc_c_to_a(fa, c[2 * kc], c[2 * kc + 1]);
        CMI_UNROLL
        for (int dt = 0; dt < 2 * KD; dt += 2) {
            uint32_t b0[2], b1[2];
            tc_frag_b<KD>(b0, b1, T, 16 * kc, 8 * dt);
            cmi_mma_16816(acc[dt], fa, b0, acc[dt]);
            cmi_mma_16816(acc[dt + 1], fa, b1, acc[dt + 1]);
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

/* The staged operands of one call: slices of np rows (a whole number of tiles, at least one) of DP
 * bf16 each, per (b, h). */
struct tc_staged {
    const uint16_t *q, *k, *v, *g;
    int64_t Tp, Sp;
};

template <int KD>
__global__ void __launch_bounds__(TC_THREADS) k_attention_fwd_tc(at_args a, tc_staged st, float *out, float *lse) {
    typedef tc_geom<KD> G;
    constexpr int DP = G::DP;
    CMI_DYN_SMEM(uint16_t, sm);
    uint16_t *Qs = sm, *Ks = Qs + G::ROW, *Vs = Ks + 2 * G::ROW; /* K and V: two buffers each */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t bh = blockIdx.y, b = bh / a.H, h = bh % a.H, i0 = (int64_t)blockIdx.x * TC_N;
    const uint16_t *ksl = st.k + bh * st.Sp * DP, *vsl = st.v + bh * st.Sp * DP;
    tc_fetch<KD>(Qs, st.q + bh * st.Tp * DP, i0);
    tc_fetch<KD>(Ks, ksl, 0);
    tc_fetch<KD>(Vs, vsl, 0);
    cmi_cp_async_commit();
    const int64_t ilast = (i0 + TC_N < a.T ? i0 + TC_N : a.T) - 1;
    const int64_t kend = a.causal ? (ilast + 1 < a.S ? ilast + 1 : a.S) : a.S;
    const int64_t ir[2] = {i0 + 16 * w + g, i0 + 16 * w + g + 8}; /* this lane's two query rows */
    float o[2 * KD][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    int buf = 0;
    for (int64_t j0 = 0; j0 < kend; j0 += TC_N, buf ^= 1) {
        tc_next<KD>(Ks, Vs, buf, ksl, vsl, j0, kend); /* the next K and V on their way while these are used */
        const uint16_t *Kb = Ks + buf * G::ROW, *Vb = Vs + buf * G::ROW;
        float s[8][4] = {};
        tc_scores<KD>(s, Qs, 16 * w, Kb);
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
        tc_times_rows<KD>(o, s, Vb); /* keys past kend have P = 0 and V rows of zeros past S */
        __syncthreads();             /* every warp is done with this buffer before it is fetched into */
    }
    cmi_cp_async_wait<0>();
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
    k_attention_bwd_q_tc(at_args a, tc_staged st, const float *out, const float *gout, const float *lse, float *Dsum,
                         float *gq, bool q_fresh, float *dS) {
    typedef tc_geom<KD> G;
    constexpr int DP = G::DP;
    CMI_DYN_SMEM(uint16_t, sm);
    uint16_t *Qs = sm, *Gs = Qs + G::ROW, *Ks = Gs + G::ROW, *Vs = Ks + 2 * G::ROW; /* K, V: two buffers */
    float *Ds = (float *)(Vs + 2 * G::ROW);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t bh = blockIdx.y, b = bh / a.H, h = bh % a.H, i0 = (int64_t)blockIdx.x * TC_N;
    const uint16_t *ksl = st.k + bh * st.Sp * DP, *vsl = st.v + bh * st.Sp * DP;
    tc_fetch<KD>(Qs, st.q + bh * st.Tp * DP, i0);
    tc_fetch<KD>(Gs, st.g + bh * st.Tp * DP, i0);
    tc_fetch<KD>(Ks, ksl, 0);
    tc_fetch<KD>(Vs, vsl, 0);
    cmi_cp_async_commit();
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
    int buf = 0;
    for (int64_t j0 = 0; j0 < kend; j0 += TC_N, buf ^= 1) {
        tc_next<KD>(Ks, Vs, buf, ksl, vsl, j0, kend);
        const uint16_t *Kb = Ks + buf * G::ROW, *Vb = Vs + buf * G::ROW;
        float s[8][4] = {}, dp[8][4] = {};
        tc_scores<KD>(s, Qs, 16 * w, Kb);  /* q·kᵀ */
        tc_scores<KD>(dp, Gs, 16 * w, Vb); /* dO·vᵀ */
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
        tc_times_rows<KD>(dq, s, Kb); /* dS·K */
        __syncthreads();
    }
    cmi_cp_async_wait<0>();
    const float sc2[2] = {a.scale, a.scale};
    tc_store<KD>(dq, sc2, a.D, q_fresh, [&](int r) { return ir[r] < a.T ? gq + (bh * a.T + ir[r]) * a.D : nullptr; });
}

/* ---- backward: key rows (dV = Pᵀ·dO, dK = scale·dSᵀ·Q; the scores recomputed as K·Qᵀ) ---- */

template <int KD>
__global__ void __launch_bounds__(TC_THREADS)
    k_attention_bwd_kv_tc(at_args a, tc_staged st, const float *lse, const float *Dsum, float *gk, bool k_fresh,
                          float *gv, bool v_fresh) {
    typedef tc_geom<KD> G;
    constexpr int DP = G::DP;
    CMI_DYN_SMEM(uint16_t, sm);
    uint16_t *Ks = sm, *Vs = Ks + G::ROW, *Qs = Vs + G::ROW, *Gs = Qs + 2 * G::ROW; /* Q, dO: two buffers */
    float *Lt = (float *)(Gs + 2 * G::ROW), *Dt = Lt + 2 * TC_N;                  /* lse, Di: two buffers */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t bh = blockIdx.y, b = bh / a.H, h = bh % a.H, j0 = (int64_t)blockIdx.x * TC_N;
    const uint16_t *qsl = st.q + bh * st.Tp * DP, *gsl = st.g + bh * st.Tp * DP;
    const int64_t jr[2] = {j0 + 16 * w + g, j0 + 16 * w + g + 8}; /* this lane's two key rows */
    const int64_t istart = a.causal ? j0 : 0; /* causal: only queries i >= j see key j */
    /* a query tile's rows of lse and Di, into buffer bf (plain loads: 512 bytes) */
    auto rows_of = [&](int64_t i0, int bf) {
        if (threadIdx.x < TC_N) {
            const int64_t ii = i0 + threadIdx.x;
            Lt[bf * TC_N + threadIdx.x] = ii < a.T ? lse[bh * a.T + ii] : INFINITY;
            Dt[bf * TC_N + threadIdx.x] = ii < a.T ? Dsum[bh * a.T + ii] : 0.0f;
        }
    };
    tc_fetch<KD>(Ks, st.k + bh * st.Sp * DP, j0);
    tc_fetch<KD>(Vs, st.v + bh * st.Sp * DP, j0);
    if (istart < a.T) { /* (causal keys past the last query see none) */
        tc_fetch<KD>(Qs, qsl, istart);
        tc_fetch<KD>(Gs, gsl, istart);
    }
    cmi_cp_async_commit();
    rows_of(istart, 0);
    float dk[2 * KD][4] = {}, dv[2 * KD][4] = {};
    int buf = 0;
    for (int64_t i0 = istart; i0 < a.T; i0 += TC_N, buf ^= 1) {
        if (i0 + TC_N < a.T) rows_of(i0 + TC_N, buf ^ 1);
        tc_next<KD>(Qs, Gs, buf, qsl, gsl, i0, a.T);
        const uint16_t *Qb = Qs + buf * G::ROW, *Gb = Gs + buf * G::ROW;
        const float *Lb = Lt + buf * TC_N, *Db = Dt + buf * TC_N;
        float s[8][4] = {}, dp[8][4] = {}; /* [key][query] */
        tc_scores<KD>(s, Ks, 16 * w, Qb);  /* k·qᵀ */
        tc_scores<KD>(dp, Vs, 16 * w, Gb); /* v·dOᵀ */
        const bool plain = tc_plain(a, i0, j0);
        CMI_UNROLL
        for (int nt = 0; nt < 8; nt++)
            CMI_UNROLL
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1, c = 8 * nt + 2 * t + (e & 1);
                const int64_t i = i0 + c, j = jr[r];
                const float li = Lb[c];
                const float sc = plain ? s[nt][e] * a.scale : at_score(a, b, h, i, j, s[nt][e] * a.scale);
                const float P = (sc == -INFINITY || li == INFINITY) ? 0.0f : __expf(sc - li);
                const float f = P != 0.0f ? at_drop_factor(a, b, h, i, j) : 0.0f;
                s[nt][e] = P * f;
                dp[nt][e] = P * (dp[nt][e] * f - Db[c]);
            }
        tc_times_rows<KD>(dv, s, Gb);  /* Pᵀ·dO */
        tc_times_rows<KD>(dk, dp, Qb); /* dSᵀ·Q */
        __syncthreads();
    }
    cmi_cp_async_wait<0>();
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

/* q, k, v (and dO for the backward) staged as bf16 (k_tc_stage) in one buffer of the caching
 * allocator, freed after the kernels are queued (stream order keeps it until they have run). */
struct tc_stage_buf {
    uint16_t *mem = nullptr;
    tc_staged st = {};
};

static int64_t tc_rows_padded(int64_t n) { return (n > 0 ? (n + TC_N - 1) / TC_N : 1) * TC_N; }

static cm_status tc_stage_one(const tc_src &src, const at_args &a, int64_t np, int dp, uint16_t *dst) {
    const int64_t total = a.B * a.H * np * (dp / 8);
    CMI_LAUNCH(k_tc_stage, cmi_cuda_grid(total, 256), 256, 0, cmi_cuda_stream(), src, a.H, a.D, np, dp, total, dst);
    return cmi_cuda_launched("attention (tensor cores): staging in bf16");
}

template <int KD> static cm_status tc_stage(const at_args &a, const float *gout, tc_stage_buf &sb) {
    constexpr int DP = tc_geom<KD>::DP;
    const int64_t Tp = tc_rows_padded(a.T), Sp = tc_rows_padded(a.S), bh = a.B * a.H;
    const size_t n = (size_t)(bh * DP) * (size_t)(Tp + 2 * Sp + (gout ? Tp : 0)); /* q, k, v, dO */
    sb.mem = (uint16_t *)cmi_cuda_alloc(n * sizeof(uint16_t));
    if (!sb.mem) return cm_last_status();
    uint16_t *q = sb.mem, *k = q + bh * Tp * DP, *v = k + bh * Sp * DP, *g = v + bh * Sp * DP;
    sb.st = tc_staged{q, k, v, gout ? g : nullptr, Tp, Sp};
    cm_status st = tc_stage_one(tc_src{a.q, a.qs[0], a.qs[1], a.qs[2], a.qs[3], a.T}, a, Tp, DP, q);
    if (!st) st = tc_stage_one(tc_src{a.k, a.ks[0], a.ks[1], a.ks[2], a.ks[3], a.S}, a, Sp, DP, k);
    if (!st) st = tc_stage_one(tc_src{a.v, a.vs[0], a.vs[1], a.vs[2], a.vs[3], a.S}, a, Sp, DP, v);
    if (!st && gout) {
        const tc_src gs = a.bthd ? tc_src{gout, a.T * a.H * a.D, a.D, a.H * a.D, 1, a.T}
                                 : tc_src{gout, a.H * a.T * a.D, a.T * a.D, a.D, 1, a.T};
        st = tc_stage_one(gs, a, Tp, DP, g);
    }
    return st;
}

template <int KD> static cm_status tc_forward(const at_args &a, float *out, float *lse) {
    tc_stage_buf sb;
    cm_status st = tc_stage<KD>(a, nullptr, sb);
    if (!st) {
        const dim3 grid((unsigned)((a.T + TC_N - 1) / TC_N), (unsigned)(a.B * a.H));
        CMI_LAUNCH(k_attention_fwd_tc<KD>, grid, TC_THREADS, tc_geom<KD>::FWD_SMEM, cmi_cuda_stream(), a, sb.st, out,
                   lse);
        st = cmi_cuda_launched("attention (tensor cores)");
    }
    cmi_cuda_free(sb.mem);
    return st;
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
    tc_stage_buf sb;
    cm_status st = tc_stage<KD>(a, gout, sb);
    if (!st) {
        const dim3 gq_grid((unsigned)((a.T + TC_N - 1) / TC_N), (unsigned)(a.B * a.H));
        CMI_LAUNCH(k_attention_bwd_q_tc<KD>, gq_grid, TC_THREADS, G::BWDQ_SMEM, s, a, sb.st, out, gout, lse, Dsum, gq,
                   q_fresh, dS);
        st = cmi_cuda_launched("attention backward (queries, tensor cores)");
    }
    if (!st && run_kv) {
        const dim3 gk_grid((unsigned)((a.S + TC_N - 1) / TC_N), (unsigned)(a.B * a.H));
        CMI_LAUNCH(k_attention_bwd_kv_tc<KD>, gk_grid, TC_THREADS, G::BWDKV_SMEM, s, a, sb.st, lse, Dsum, gk, k_fresh,
                   gv, v_fresh);
        st = cmi_cuda_launched("attention backward (keys, tensor cores)");
    }
    cmi_cuda_free(sb.mem);
    return st;
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
