/* Fused scaled dot-product attention on the GPU (backend.h slots attention, attention_bwd), with the
 * CPU op's semantics (attention.c): causal (top-left), an additive bias broadcast to (B, H, T, S), a
 * key padding mask, dropout on the probabilities, and rows whose keys are all masked giving zeros.
 *
 * Forward (FlashAttention's online softmax, in f32 on the CUDA cores): a block of 8 warps handles 8
 * query rows of one (b, h); key and value tiles of 32 rows are staged in shared memory, each lane
 * scores one key of the tile, and the warp keeps the running max, sum and output (lanes own columns
 * of D). The T×S matrix is never stored: the forward keeps the output and one log-sum-exp per query.
 *
 * Backward, two kernels so that nothing is accumulated with atomics (deterministic): one owns query
 * rows (dQ, and rowsum(dO ⊙ O) for the other), one owns key rows (dK, dV); each recomputes the scores
 * from q, k and the saved log-sum-exp. The dropout mask is not stored either: both recompute it from
 * the Philox counters, the same numbers cm_dropout draws for the (B, H, T, S) probabilities.
 *
 * D is limited to 128 (the tiles' shared memory); longer heads are an error from the op. */
#include "tensor/cuda/attention.cuh"

#include <math.h>
#include <stdlib.h>

#define AT_TILE 32
#define AT_WARPS 8
#define AT_DMAX 128
#define AT_DT (AT_DMAX / 32)

/* rows [r0, r0 + 32) of an (N, D) slice at `base` with strides (sn, sd) into tile[32][AT_DMAX + 1]
 * (zeros past n), by the whole block. */
__device__ __forceinline__ void at_load_tile(float (*tile)[AT_DMAX + 1], const float *base, int64_t sn, int64_t sd,
                                             int64_t r0, int64_t n, int64_t D) {
    for (int e = threadIdx.x; e < AT_TILE * AT_DMAX; e += blockDim.x) {
        const int r = e / AT_DMAX, d = e % AT_DMAX;
        if (d >= D) continue;
        tile[r][d] = r0 + r < n ? base[(r0 + r) * sn + d * sd] : 0.0f;
    }
}

/* ---- forward ---- */

__global__ void __launch_bounds__(AT_WARPS * 32) k_attention_fwd(at_args a, float *out, float *lse) {
    __shared__ float Ks[AT_TILE][AT_DMAX + 1], Vs[AT_TILE][AT_DMAX + 1], Qs[AT_WARPS][AT_DMAX];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t bh = blockIdx.y, b = bh / a.H, h = bh % a.H, i = blockIdx.x * (int64_t)AT_WARPS + w;
    const bool active = i < a.T;
    const at_slice sl = at_slice_of(a, nullptr, b, h);
    const float *qb = sl.q, *kb = sl.k, *vb = sl.v;
    for (int d = lane; d < a.D; d += 32) Qs[w][d] = active ? qb[i * a.qs[2] + d * a.qs[3]] : 0.0f;
    const int64_t ilast = (int64_t)blockIdx.x * AT_WARPS + AT_WARPS - 1;
    const int64_t kend = a.causal ? (ilast + 1 < a.S ? ilast + 1 : a.S) : a.S;
    float o[AT_DT] = {0.0f, 0.0f, 0.0f, 0.0f}, m = -INFINITY, l = 0.0f;
    for (int64_t j0 = 0; j0 < kend; j0 += AT_TILE) {
        __syncthreads();
        at_load_tile(Ks, kb, a.ks[2], a.ks[3], j0, a.S, a.D);
        at_load_tile(Vs, vb, a.vs[2], a.vs[3], j0, a.S, a.D);
        __syncthreads();
        if (!active) continue;
        const int64_t j = j0 + lane;
        float qk = 0.0f;
        for (int d = 0; d < a.D; d++) qk += Qs[w][d] * Ks[lane][d];
        const float s = at_score(a, b, h, i, j, qk * a.scale);
        const float mt = cmi_warp_max(s);
        if (mt == -INFINITY) continue; /* every key of the tile masked for this row */
        const float mn = fmaxf(m, mt), corr = m == -INFINITY ? 0.0f : expf(m - mn);
        const float e = s == -INFINITY ? 0.0f : expf(s - mn);
        l = l * corr + cmi_warp_sum(e);
        const float pe = e * (e != 0.0f ? at_drop_factor(a, b, h, i, j) : 1.0f);
        for (int t = 0; t < AT_DT; t++) o[t] *= corr;
        for (int jj = 0; jj < AT_TILE; jj++) {
            const float pj = __shfl_sync(0xffffffffu, pe, jj);
            for (int t = 0; t < AT_DT; t++) {
                const int d = lane + 32 * t;
                if (d < a.D) o[t] += pj * Vs[jj][d];
            }
        }
        m = mn;
    }
    if (!active) return;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    float *orow = out + at_out_off(a, b, h, i);
    for (int t = 0; t < AT_DT; t++) {
        const int d = lane + 32 * t;
        if (d < a.D) orow[d] = o[t] * inv;
    }
    if (lane == 0) lse[bh * a.T + i] = l > 0.0f ? m + logf(l) : INFINITY;
}

/* ---- backward: query rows (dQ, and Di = rowsum(dO ⊙ O)) ---- */

__global__ void __launch_bounds__(AT_WARPS * 32) k_attention_bwd_q(at_args a, const float *out, const float *gout,
                                                                   const float *lse, float *Dsum, float *gq,
                                                                   bool q_fresh, float *dS) {
    __shared__ float Ks[AT_TILE][AT_DMAX + 1], Vs[AT_TILE][AT_DMAX + 1], Qs[AT_WARPS][AT_DMAX],
        Gs[AT_WARPS][AT_DMAX];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t bh = blockIdx.y, b = bh / a.H, h = bh % a.H, i = blockIdx.x * (int64_t)AT_WARPS + w;
    const bool active = i < a.T;
    const at_slice sl = at_slice_of(a, nullptr, b, h);
    const float *qb = sl.q, *kb = sl.k, *vb = sl.v;
    float di = 0.0f;
    if (active) {
        const float *orow = out + at_out_off(a, b, h, i), *grow = gout + at_out_off(a, b, h, i);
        for (int d = lane; d < a.D; d += 32) {
            Qs[w][d] = qb[i * a.qs[2] + d * a.qs[3]];
            Gs[w][d] = grow[d];
            di += grow[d] * orow[d];
        }
    }
    di = cmi_warp_sum(di);
    if (active && lane == 0) Dsum[bh * a.T + i] = di;
    const float li = active ? lse[bh * a.T + i] : INFINITY;
    const int64_t ilast = (int64_t)blockIdx.x * AT_WARPS + AT_WARPS - 1;
    const int64_t kend = a.causal ? (ilast + 1 < a.S ? ilast + 1 : a.S) : a.S;
    float dq[AT_DT] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t j0 = 0; j0 < kend; j0 += AT_TILE) {
        __syncthreads();
        at_load_tile(Ks, kb, a.ks[2], a.ks[3], j0, a.S, a.D);
        at_load_tile(Vs, vb, a.vs[2], a.vs[3], j0, a.S, a.D);
        __syncthreads();
        if (!active) continue;
        const int64_t j = j0 + lane;
        float qk = 0.0f, gv = 0.0f;
        for (int d = 0; d < a.D; d++) {
            qk += Qs[w][d] * Ks[lane][d];
            gv += Gs[w][d] * Vs[lane][d];
        }
        const float s = at_score(a, b, h, i, j, qk * a.scale);
        const float P = (s == -INFINITY || li == INFINITY) ? 0.0f : expf(s - li);
        const float f = P != 0.0f ? at_drop_factor(a, b, h, i, j) : 0.0f;
        const float ds = P * (gv * f - di);
        if (dS && j < a.S) dS[(bh * a.T + i) * a.S + j] = ds;
        for (int jj = 0; jj < AT_TILE; jj++) {
            const float sj = __shfl_sync(0xffffffffu, ds, jj);
            for (int t = 0; t < AT_DT; t++) {
                const int d = lane + 32 * t;
                if (d < a.D) dq[t] += sj * Ks[jj][d];
            }
        }
    }
    if (!active) return;
    float *gr = gq + (bh * a.T + i) * a.D;
    for (int t = 0; t < AT_DT; t++) {
        const int d = lane + 32 * t;
        if (d < a.D) gr[d] = q_fresh ? a.scale * dq[t] : gr[d] + a.scale * dq[t];
    }
}

/* ---- backward: key rows (dK, dV) ---- */

__global__ void __launch_bounds__(AT_WARPS * 32) k_attention_bwd_kv(at_args a, const float *gout, const float *lse,
                                                                    const float *Dsum, float *gk, bool k_fresh,
                                                                    float *gv, bool v_fresh) {
    __shared__ float Qt[AT_TILE][AT_DMAX + 1], Gt[AT_TILE][AT_DMAX + 1], Kr[AT_WARPS][AT_DMAX],
        Vr[AT_WARPS][AT_DMAX], Lt[AT_TILE], Dt[AT_TILE];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t bh = blockIdx.y, b = bh / a.H, h = bh % a.H, j = blockIdx.x * (int64_t)AT_WARPS + w;
    const bool active = j < a.S;
    const at_slice sl = at_slice_of(a, gout, b, h);
    const float *qb = sl.q, *kb = sl.k, *vb = sl.v, *gb = sl.g; /* dO row i at gb + i·gstride */
    const int64_t gstride = sl.gs;
    for (int d = lane; d < a.D; d += 32) {
        Kr[w][d] = active ? kb[j * a.ks[2] + d * a.ks[3]] : 0.0f;
        Vr[w][d] = active ? vb[j * a.vs[2] + d * a.vs[3]] : 0.0f;
    }
    const int64_t jfirst = (int64_t)blockIdx.x * AT_WARPS;
    const int64_t istart = a.causal ? jfirst / AT_TILE * AT_TILE : 0; /* causal: queries i >= j only */
    float dk[AT_DT] = {0.0f, 0.0f, 0.0f, 0.0f}, dv[AT_DT] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t i0 = istart; i0 < a.T; i0 += AT_TILE) {
        __syncthreads();
        at_load_tile(Qt, qb, a.qs[2], a.qs[3], i0, a.T, a.D);
        at_load_tile(Gt, gb, gstride, 1, i0, a.T, a.D);
        if (threadIdx.x < AT_TILE) {
            const int64_t ii = i0 + threadIdx.x;
            Lt[threadIdx.x] = ii < a.T ? lse[bh * a.T + ii] : INFINITY;
            Dt[threadIdx.x] = ii < a.T ? Dsum[bh * a.T + ii] : 0.0f;
        }
        __syncthreads();
        if (!active) continue;
        const int64_t i = i0 + lane;
        float qk = 0.0f, gvv = 0.0f;
        for (int d = 0; d < a.D; d++) {
            qk += Qt[lane][d] * Kr[w][d];
            gvv += Gt[lane][d] * Vr[w][d];
        }
        const float s = at_score(a, b, h, i, j, qk * a.scale), li = Lt[lane];
        const float P = (s == -INFINITY || li == INFINITY) ? 0.0f : expf(s - li);
        const float f = P != 0.0f ? at_drop_factor(a, b, h, i, j) : 0.0f;
        const float pd = P * f, ds = P * (gvv * f - Dt[lane]);
        for (int ii = 0; ii < AT_TILE; ii++) {
            const float pi = __shfl_sync(0xffffffffu, pd, ii), si = __shfl_sync(0xffffffffu, ds, ii);
            for (int t = 0; t < AT_DT; t++) {
                const int d = lane + 32 * t;
                if (d < a.D) {
                    dv[t] += pi * Gt[ii][d];
                    dk[t] += si * Qt[ii][d];
                }
            }
        }
    }
    if (!active) return;
    float *kr = gk ? gk + (bh * a.S + j) * a.D : nullptr, *vr = gv ? gv + (bh * a.S + j) * a.D : nullptr;
    for (int t = 0; t < AT_DT; t++) {
        const int d = lane + 32 * t;
        if (d >= a.D) continue;
        if (kr) kr[d] = k_fresh ? a.scale * dk[t] : kr[d] + a.scale * dk[t];
        if (vr) vr[d] = v_fresh ? dv[t] : vr[d] + dv[t];
    }
}

/* ---- the tiled path (D <= 64): register-blocked, 64 x 64 tiles ----
 *
 * The kernels above give each warp one row and each lane one dot product: two shared-memory reads
 * per multiply-add, which left attention at 77% of GPT-2's step on an H200 (docs/GPU.md). Here a
 * block of 256 threads owns a 64 x 64 tile of the scores: thread (ty, tx) of a 16 x 16 grid
 * computes a 4 x 4 piece from float4 reads of tiles staged in shared memory — the row operand
 * transposed (a broadcast within the warp), the column operand contiguous — so each pair of
 * 128-bit reads feeds 16 multiply-adds. Softmax rows live in the 16 lanes of a half warp
 * (reductions by xor shuffles of 8, 4, 2, 1); the probabilities go through shared memory to the
 * second product (P·V, dS·K, Pᵀ·dO, dSᵀ·Q) with the same 4 x 4 blocking. Semantics, dropout
 * counters, the log-sum-exp and the two-kernel deterministic backward are the ones above; only the
 * order of the sums differs. Tiles take 68 KiB (forward), 102 KiB and 136 KiB (backward) of shared
 * memory: where the device cannot give that much to a block, the kernels above run instead. */

#define FT_N 64       /* rows of a tile, keys of a tile, and the largest D */
#define FT_LD 68      /* shared row stride in floats: rows stay 16-byte aligned, transposed stores spread */
#define FT_THREADS 256
#define FT_TILE_FLOATS (FT_N * FT_LD)

/* rows [r0, r0 + 64) of an (n, D) slice at `base` (strides sn, sd) into a shared tile, zero past n
 * and past D: row-major (dst[r * FT_LD + d]) or transposed (dst[d * FT_LD + r]). Consecutive
 * threads take consecutive d, so contiguous rows read coalesced. */
__device__ __forceinline__ void ft_load(float *dst, bool transposed, const float *base, int64_t sn, int64_t sd,
                                        int64_t r0, int64_t n, int64_t D) {
    for (int e = threadIdx.x; e < FT_N * FT_N; e += FT_THREADS) {
        const int r = e / FT_N, d = e % FT_N;
        const float v = d < D && r0 + r < n ? base[(r0 + r) * sn + d * sd] : 0.0f;
        if (transposed)
            dst[d * FT_LD + r] = v;
        else
            dst[r * FT_LD + d] = v;
    }
}

__device__ __forceinline__ float ft_max16(float v) {
    for (int o = 8; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float ft_sum16(float v) {
    for (int o = 8; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* acc[r][c] += Σ_k A[k][ra + r] · B[k][cb + c] over k < n: A and B shared tiles with stride FT_LD. */
__device__ __forceinline__ void ft_mma(float acc[4][4], const float *A, int ra, const float *B, int cb, int64_t n) {
    for (int64_t k = 0; k < n; k++) {
        const float4 x = *(const float4 *)&A[k * FT_LD + ra], y = *(const float4 *)&B[k * FT_LD + cb];
        const float xa[4] = {x.x, x.y, x.z, x.w}, ya[4] = {y.x, y.y, y.z, y.w};
        CMI_UNROLL
        for (int r = 0; r < 4; r++)
            CMI_UNROLL
            for (int c = 0; c < 4; c++) acc[r][c] += xa[r] * ya[c];
    }
}

#define FT_FWD_SMEM (4 * FT_TILE_FLOATS * sizeof(float))
#define FT_BWDQ_SMEM ((6 * FT_TILE_FLOATS + FT_N) * sizeof(float))
#define FT_BWDKV_SMEM ((8 * FT_TILE_FLOATS + 2 * FT_N) * sizeof(float))

__global__ void __launch_bounds__(FT_THREADS) k_attention_fwd_tiled(at_args a, float *out, float *lse) {
    CMI_DYN_SMEM(float, sm);
    float *Qt = sm, *Kt = Qt + FT_TILE_FLOATS, *Vs = Kt + FT_TILE_FLOATS, *Ps = Vs + FT_TILE_FLOATS;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int64_t bh = blockIdx.y, b = bh / a.H, h = bh % a.H, i0 = (int64_t)blockIdx.x * FT_N;
    const at_slice sl = at_slice_of(a, nullptr, b, h);
    const float *qb = sl.q, *kb = sl.k, *vb = sl.v;
    ft_load(Qt, true, qb, a.qs[2], a.qs[3], i0, a.T, a.D);
    const int64_t ilast = (i0 + FT_N < a.T ? i0 + FT_N : a.T) - 1;
    const int64_t kend = a.causal ? (ilast + 1 < a.S ? ilast + 1 : a.S) : a.S;
    float o[4][4] = {}, m[4], l[4] = {};
    CMI_UNROLL
    for (int r = 0; r < 4; r++) m[r] = -INFINITY;
    for (int64_t j0 = 0; j0 < kend; j0 += FT_N) {
        __syncthreads(); /* the previous tile's P and V are read */
        ft_load(Kt, true, kb, a.ks[2], a.ks[3], j0, a.S, a.D);
        ft_load(Vs, false, vb, a.vs[2], a.vs[3], j0, a.S, a.D);
        __syncthreads();
        float s[4][4] = {};
        ft_mma(s, Qt, ty * 4, Kt, tx * 4, a.D);
        CMI_UNROLL
        for (int r = 0; r < 4; r++) {
            const int64_t i = i0 + ty * 4 + r;
            float mt = -INFINITY;
            CMI_UNROLL
            for (int c = 0; c < 4; c++) {
                s[r][c] = at_score(a, b, h, i, j0 + tx * 4 + c, s[r][c] * a.scale);
                mt = fmaxf(mt, s[r][c]);
            }
            const float mn = fmaxf(m[r], ft_max16(mt));
            const float corr = m[r] == -INFINITY ? 0.0f : expf(m[r] - mn);
            float rs = 0.0f;
            CMI_UNROLL
            for (int c = 0; c < 4; c++) {
                const int64_t j = j0 + tx * 4 + c;
                const float e = s[r][c] == -INFINITY ? 0.0f : expf(s[r][c] - mn);
                rs += e;
                Ps[(tx * 4 + c) * FT_LD + ty * 4 + r] = e * (e != 0.0f ? at_drop_factor(a, b, h, i, j) : 1.0f);
                o[r][c] *= corr;
            }
            l[r] = l[r] * corr + rs; /* this thread's part of the row sum: reduced at the end */
            m[r] = mn;
        }
        __syncthreads();
        const int64_t nk = kend - j0 < FT_N ? kend - j0 : FT_N;
        ft_mma(o, Ps, ty * 4, Vs, tx * 4, nk);
    }
    CMI_UNROLL
    for (int r = 0; r < 4; r++) {
        const int64_t i = i0 + ty * 4 + r;
        const float lt = ft_sum16(l[r]);
        if (i >= a.T) continue;
        const float inv = lt > 0.0f ? 1.0f / lt : 0.0f;
        float *orow = out + at_out_off(a, b, h, i);
        CMI_UNROLL
        for (int c = 0; c < 4; c++)
            if (tx * 4 + c < a.D) orow[tx * 4 + c] = o[r][c] * inv;
        if (tx == 0) lse[bh * a.T + i] = lt > 0.0f ? m[r] + logf(lt) : INFINITY;
    }
}

/* Query rows: dQ = scale · dS·K with dS = P ⊙ (f·dO·Vᵀ − Di), and Di = rowsum(dO ⊙ O) for the keys'
 * kernel. */
__global__ void __launch_bounds__(FT_THREADS) k_attention_bwd_q_tiled(at_args a, const float *out, const float *gout,
                                                                      const float *lse, float *Dsum, float *gq,
                                                                      bool q_fresh, float *dS) {
    CMI_DYN_SMEM(float, sm);
    float *Qt = sm, *Gt = Qt + FT_TILE_FLOATS, *Kt = Gt + FT_TILE_FLOATS, *Vt = Kt + FT_TILE_FLOATS,
          *Ks = Vt + FT_TILE_FLOATS, *Ss = Ks + FT_TILE_FLOATS, *Ds = Ss + FT_TILE_FLOATS;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int64_t bh = blockIdx.y, b = bh / a.H, h = bh % a.H, i0 = (int64_t)blockIdx.x * FT_N;
    const at_slice sl = at_slice_of(a, gout, b, h);
    const float *qb = sl.q, *kb = sl.k, *vb = sl.v, *gb = sl.g;
    const int64_t gstride = sl.gs;
    ft_load(Qt, true, qb, a.qs[2], a.qs[3], i0, a.T, a.D);
    ft_load(Gt, true, gb, gstride, 1, i0, a.T, a.D);
    at_block_di(a, out, gout, b, h, i0, FT_N, Ds, Dsum); /* f32, from f32 dO and O */
    __syncthreads();
    float di[4], li[4];
    CMI_UNROLL
    for (int r = 0; r < 4; r++) {
        const int64_t i = i0 + ty * 4 + r;
        di[r] = Ds[ty * 4 + r];
        li[r] = i < a.T ? lse[bh * a.T + i] : INFINITY;
    }
    const int64_t ilast = (i0 + FT_N < a.T ? i0 + FT_N : a.T) - 1;
    const int64_t kend = a.causal ? (ilast + 1 < a.S ? ilast + 1 : a.S) : a.S;
    float dq[4][4] = {};
    for (int64_t j0 = 0; j0 < kend; j0 += FT_N) {
        __syncthreads(); /* the previous tile's dS and K are read */
        ft_load(Kt, true, kb, a.ks[2], a.ks[3], j0, a.S, a.D);
        ft_load(Vt, true, vb, a.vs[2], a.vs[3], j0, a.S, a.D);
        ft_load(Ks, false, kb, a.ks[2], a.ks[3], j0, a.S, a.D);
        __syncthreads();
        float s[4][4] = {}, g[4][4] = {};
        ft_mma(s, Qt, ty * 4, Kt, tx * 4, a.D);
        ft_mma(g, Gt, ty * 4, Vt, tx * 4, a.D);
        CMI_UNROLL
        for (int r = 0; r < 4; r++) {
            const int64_t i = i0 + ty * 4 + r;
            CMI_UNROLL
            for (int c = 0; c < 4; c++) {
                const int64_t j = j0 + tx * 4 + c;
                const float sc = at_score(a, b, h, i, j, s[r][c] * a.scale);
                const float P = (sc == -INFINITY || li[r] == INFINITY) ? 0.0f : expf(sc - li[r]);
                const float f = P != 0.0f ? at_drop_factor(a, b, h, i, j) : 0.0f;
                const float ds = P * (g[r][c] * f - di[r]);
                if (dS && i < a.T && j < a.S) dS[(bh * a.T + i) * a.S + j] = ds;
                Ss[(tx * 4 + c) * FT_LD + ty * 4 + r] = ds;
            }
        }
        __syncthreads();
        const int64_t nk = kend - j0 < FT_N ? kend - j0 : FT_N;
        ft_mma(dq, Ss, ty * 4, Ks, tx * 4, nk);
    }
    CMI_UNROLL
    for (int r = 0; r < 4; r++) {
        const int64_t i = i0 + ty * 4 + r;
        if (i >= a.T) continue;
        float *gr = gq + (bh * a.T + i) * a.D;
        CMI_UNROLL
        for (int c = 0; c < 4; c++) {
            const int d = tx * 4 + c;
            if (d < a.D) gr[d] = q_fresh ? a.scale * dq[r][c] : gr[d] + a.scale * dq[r][c];
        }
    }
}

/* Key rows: dV = Pᵀ_f·dO and dK = scale · dSᵀ·Q, the scores recomputed as (K·Qᵀ). */
__global__ void __launch_bounds__(FT_THREADS) k_attention_bwd_kv_tiled(at_args a, const float *gout, const float *lse,
                                                                       const float *Dsum, float *gk, bool k_fresh,
                                                                       float *gv, bool v_fresh) {
    CMI_DYN_SMEM(float, sm);
    float *Kt = sm, *Vt = Kt + FT_TILE_FLOATS, *Qt = Vt + FT_TILE_FLOATS, *Gt = Qt + FT_TILE_FLOATS,
          *Qs = Gt + FT_TILE_FLOATS, *Gs = Qs + FT_TILE_FLOATS, *Pt = Gs + FT_TILE_FLOATS, *St = Pt + FT_TILE_FLOATS,
          *Lt = St + FT_TILE_FLOATS, *Dt = Lt + FT_N;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int64_t bh = blockIdx.y, b = bh / a.H, h = bh % a.H, j0 = (int64_t)blockIdx.x * FT_N;
    const at_slice sl = at_slice_of(a, gout, b, h);
    const float *qb = sl.q, *kb = sl.k, *vb = sl.v, *gb = sl.g;
    const int64_t gstride = sl.gs;
    ft_load(Kt, true, kb, a.ks[2], a.ks[3], j0, a.S, a.D);
    ft_load(Vt, true, vb, a.vs[2], a.vs[3], j0, a.S, a.D);
    const int64_t istart = a.causal ? j0 : 0; /* causal: only queries i >= j see key j */
    float dk[4][4] = {}, dv[4][4] = {};
    for (int64_t i0 = istart; i0 < a.T; i0 += FT_N) {
        __syncthreads(); /* the previous tile's P, dS, Q and dO are read */
        ft_load(Qt, true, qb, a.qs[2], a.qs[3], i0, a.T, a.D);
        ft_load(Gt, true, gb, gstride, 1, i0, a.T, a.D);
        ft_load(Qs, false, qb, a.qs[2], a.qs[3], i0, a.T, a.D);
        ft_load(Gs, false, gb, gstride, 1, i0, a.T, a.D);
        if (threadIdx.x < FT_N) {
            const int64_t ii = i0 + threadIdx.x;
            Lt[threadIdx.x] = ii < a.T ? lse[bh * a.T + ii] : INFINITY;
            Dt[threadIdx.x] = ii < a.T ? Dsum[bh * a.T + ii] : 0.0f;
        }
        __syncthreads();
        float s[4][4] = {}, g[4][4] = {}; /* [key][query] */
        ft_mma(s, Kt, ty * 4, Qt, tx * 4, a.D);
        ft_mma(g, Vt, ty * 4, Gt, tx * 4, a.D);
        CMI_UNROLL
        for (int r = 0; r < 4; r++) {
            const int64_t j = j0 + ty * 4 + r;
            CMI_UNROLL
            for (int c = 0; c < 4; c++) {
                const int64_t i = i0 + tx * 4 + c;
                const float li = Lt[tx * 4 + c];
                const float sc = at_score(a, b, h, i, j, s[r][c] * a.scale);
                const float P = (sc == -INFINITY || li == INFINITY) ? 0.0f : expf(sc - li);
                const float f = P != 0.0f ? at_drop_factor(a, b, h, i, j) : 0.0f;
                Pt[(tx * 4 + c) * FT_LD + ty * 4 + r] = P * f;
                St[(tx * 4 + c) * FT_LD + ty * 4 + r] = P * (g[r][c] * f - Dt[tx * 4 + c]);
            }
        }
        __syncthreads();
        const int64_t nq = a.T - i0 < FT_N ? a.T - i0 : FT_N;
        ft_mma(dv, Pt, ty * 4, Gs, tx * 4, nq);
        ft_mma(dk, St, ty * 4, Qs, tx * 4, nq);
    }
    CMI_UNROLL
    for (int r = 0; r < 4; r++) {
        const int64_t j = j0 + ty * 4 + r;
        if (j >= a.S) continue;
        float *kr = gk ? gk + (bh * a.S + j) * a.D : nullptr, *vr = gv ? gv + (bh * a.S + j) * a.D : nullptr;
        CMI_UNROLL
        for (int c = 0; c < 4; c++) {
            const int d = tx * 4 + c;
            if (d >= a.D) continue;
            if (kr) kr[d] = k_fresh ? a.scale * dk[r][c] : kr[d] + a.scale * dk[r][c];
            if (vr) vr[d] = v_fresh ? dv[r][c] : vr[d] + dv[r][c];
        }
    }
}

/* Whether the tiled kernels run here: D fits and the device gives each block the shared memory
 * (asked once; a device that refuses keeps the kernels above). CM_CUDA_ATTENTION=rowwise forces
 * the kernels above (tests compare both paths). */
static bool ft_usable(int64_t D) {
    static int ok = -1;
    if (D > FT_N) return false;
    const char *env = getenv("CM_CUDA_ATTENTION");
    if (env && strcmp(env, "rowwise") == 0) return false;
    if (ok < 0) {
        ok = cudaFuncSetAttribute((const void *)k_attention_fwd_tiled, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)FT_FWD_SMEM) == cudaSuccess &&
             cudaFuncSetAttribute((const void *)k_attention_bwd_q_tiled, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)FT_BWDQ_SMEM) == cudaSuccess &&
             cudaFuncSetAttribute((const void *)k_attention_bwd_kv_tiled,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, (int)FT_BWDKV_SMEM) == cudaSuccess;
        if (!ok) (void)cudaGetLastError(); /* the refusal is not an error of the next launch */
    }
    return ok == 1;
}

/* ---- entry points ---- */

extern "C" cm_status cmi_cuda_attention(const cmi_attn_desc *d, float *out, float *lse) {
    if (d->D > AT_DMAX)
        return cm_set_error(CM_ERR_UNSUPPORTED, "attention on cuda: head dim D = %lld is above %d", (long long)d->D,
                            AT_DMAX);
    const at_args a = make_args(d);
    if (d->bf16 && at_tc_usable(d->D)) return at_tc_forward(a, out, lse);
    if (ft_usable(d->D)) {
        const dim3 grid((unsigned)((d->T + FT_N - 1) / FT_N), (unsigned)(d->B * d->H));
        CMI_LAUNCH(k_attention_fwd_tiled, grid, FT_THREADS, FT_FWD_SMEM, cmi_cuda_stream(), a, out, lse);
        return cmi_cuda_launched("attention");
    }
    const dim3 grid((unsigned)((d->T + AT_WARPS - 1) / AT_WARPS), (unsigned)(d->B * d->H));
    CMI_LAUNCH(k_attention_fwd, grid, AT_WARPS * 32, 0, cmi_cuda_stream(), a, out, lse);
    return cmi_cuda_launched("attention");
}

extern "C" cm_status cmi_cuda_attention_bwd(const cmi_attn_desc *d, const float *out, const float *gout,
                                            const float *lse, float *gq, bool q_fresh, float *gk, bool k_fresh,
                                            float *gv, bool v_fresh, float *dS) {
    if (d->D > AT_DMAX)
        return cm_set_error(CM_ERR_UNSUPPORTED, "attention on cuda: head dim D = %lld is above %d", (long long)d->D,
                            AT_DMAX);
    const at_args a = make_args(d);
    float *Dsum = (float *)cmi_cuda_scratch(sizeof(float) * (size_t)(d->B * d->H * d->T));
    if (!Dsum) return cm_last_status();
    cudaStream_t s = cmi_cuda_stream();
    float *qdst = gq;
    if (!qdst) { /* Dsum is still needed for dK and dV: run the query kernel into scratch dQ */
        if (!gk && !gv && !dS) return CM_OK;
        qdst = (float *)cmi_cuda_alloc(sizeof(float) * (size_t)(d->B * d->H * d->T * d->D + 1));
        if (!qdst) return cm_last_status();
    }
    if (d->bf16 && at_tc_usable(d->D)) {
        cm_status st = at_tc_backward(a, out, gout, lse, Dsum, qdst, gq ? q_fresh : true, gk || gv, gk, k_fresh, gv,
                                      v_fresh, dS);
        if (!gq) cmi_cuda_free(qdst); /* stream-ordered: the kernels are queued before it is reused */
        return st;
    }
    const bool tiled = ft_usable(d->D);
    const int64_t rows = tiled ? FT_N : AT_WARPS;
    const dim3 gq_grid((unsigned)((d->T + rows - 1) / rows), (unsigned)(d->B * d->H));
    if (tiled)
        CMI_LAUNCH(k_attention_bwd_q_tiled, gq_grid, FT_THREADS, FT_BWDQ_SMEM, s, a, out, gout, lse, Dsum, qdst,
                   gq ? q_fresh : true, dS);
    else
        CMI_LAUNCH(k_attention_bwd_q, gq_grid, AT_WARPS * 32, 0, s, a, out, gout, lse, Dsum, qdst, gq ? q_fresh : true,
                   dS);
    cm_status st = cmi_cuda_launched("attention backward (queries)");
    if (!gq) cmi_cuda_free(qdst);
    if (st || (!gk && !gv)) return st;
    const dim3 gk_grid((unsigned)((d->S + rows - 1) / rows), (unsigned)(d->B * d->H));
    if (tiled)
        CMI_LAUNCH(k_attention_bwd_kv_tiled, gk_grid, FT_THREADS, FT_BWDKV_SMEM, s, a, gout, lse, Dsum, gk, k_fresh,
                   gv, v_fresh);
    else
        CMI_LAUNCH(k_attention_bwd_kv, gk_grid, AT_WARPS * 32, 0, s, a, gout, lse, Dsum, gk, k_fresh, gv, v_fresh);
    return cmi_cuda_launched("attention backward (keys)");
}
