/* What the GPU attention kernels share (attention.cu: f32 on the CUDA cores; attention_tc.cu: bf16
 * on the tensor cores): the description of the scores, the dropout draw and the output layout. */
#pragma once

#include "tensor/cuda/common.cuh"

#include <math.h>

/* ---- the shared description of the scores ---- */

struct at_args {
    const float *q, *k, *v;
    int64_t qs[4], ks[4], vs[4]; /* strides of (B, H, N, D) */
    const float *bias;
    int64_t bst[4]; /* bias strides broadcast to (B, H, T, S) */
    const float *mrow; /* (B, S): 0 = padding, else a real key; or NULL */
    int64_t B, H, T, S, D;
    float scale;
    bool causal;
    float p, keep_scale; /* dropout */
    uint64_t seed, stream, counter;
    int64_t rows, row_first; /* rows > 0: the tape's row context over B */
    bool bthd;               /* out / dO layout (B, T, H, D), else (B, H, T, D) */
};

/* keep_scale for a kept probability, 0 for a dropped one, 1 without dropout. */
__device__ __forceinline__ float at_drop_factor(const at_args &a, int64_t b, int64_t h, int64_t i, int64_t j) {
    if (a.p <= 0.0f) return 1.0f;
    uint64_t ctr;
    int word;
    if (a.rows > 0) {
        const int64_t per_row = a.H * a.T * a.S, bpr = (per_row + 3) / 4, e = (h * a.T + i) * a.S + j;
        ctr = a.counter + (uint64_t)((a.row_first + b) * bpr + e / 4);
        word = (int)(e & 3);
    } else {
        const int64_t e = ((b * a.H + h) * a.T + i) * a.S + j;
        ctr = a.counter + (uint64_t)(e / 4);
        word = (int)(e & 3);
    }
    uint32_t w[4];
    cmi_philox(a.seed, a.stream, ctr, w);
    const bool dropped = (float)(w[word] >> 8) * (1.0f / 16777216.0f) < a.p;
    return dropped ? 0.0f : a.keep_scale;
}

/* The score of (i, j) from q·k (already scaled): + bias, -inf where masked or past the diagonal. */
__device__ __forceinline__ float at_score(const at_args &a, int64_t b, int64_t h, int64_t i, int64_t j, float qk) {
    if (j >= a.S || i >= a.T || (a.causal && j > i)) return -INFINITY;
    if (a.mrow && a.mrow[b * a.S + j] == 0.0f) return -INFINITY;
    float s = qk;
    if (a.bias) s += a.bias[b * a.bst[0] + h * a.bst[1] + i * a.bst[2] + j * a.bst[3]];
    return s;
}

__device__ __forceinline__ int64_t at_out_off(const at_args &a, int64_t b, int64_t h, int64_t i) {
    return a.bthd ? ((b * a.T + i) * a.H + h) * a.D : ((b * a.H + h) * a.T + i) * a.D;
}

/* The (b, h) slices a kernel reads: q, k and v at their strides and, when gout is given, the rows
 * of dO (row stride gs: H·D in the (B, T, H, D) layout, else D). */
struct at_slice {
    const float *q, *k, *v, *g;
    int64_t gs;
};
__device__ __forceinline__ at_slice at_slice_of(const at_args &a, const float *gout, int64_t b, int64_t h) {
    at_slice s;
    s.q = a.q + b * a.qs[0] + h * a.qs[1];
    s.k = a.k + b * a.ks[0] + h * a.ks[1];
    s.v = a.v + b * a.vs[0] + h * a.vs[1];
    s.g = gout ? gout + at_out_off(a, b, h, 0) : nullptr;
    s.gs = a.bthd ? a.H * a.D : a.D;
    return s;
}

/* Di = rowsum(dO ⊙ O) in f32 for the query rows [i0, i0 + n) of slice (b, h), a warp of the block
 * per row: into Ds[r] (0 past T) and Dsum (the keys' kernel reads it). Read Ds after a
 * __syncthreads. */
__device__ __forceinline__ void at_block_di(const at_args &a, const float *out, const float *gout, int64_t b,
                                            int64_t h, int64_t i0, int n, float *Ds, float *Dsum) {
    const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const int64_t bh = b * a.H + h;
    for (int rr = threadIdx.x >> 5; rr < n; rr += nw) {
        const int64_t i = i0 + rr;
        float di = 0.0f;
        if (i < a.T) {
            const float *orow = out + at_out_off(a, b, h, i), *grow = gout + at_out_off(a, b, h, i);
            for (int d = lane; d < a.D; d += 32) di += grow[d] * orow[d];
        }
        di = cmi_warp_sum(di);
        if (lane == 0) {
            Ds[rr] = di;
            if (i < a.T) Dsum[bh * a.T + i] = di;
        }
    }
}


static inline at_args make_args(const cmi_attn_desc *d) {
    at_args a;
    memset(&a, 0, sizeof a);
    a.q = d->q, a.k = d->k, a.v = d->v;
    memcpy(a.qs, d->qs, sizeof a.qs);
    memcpy(a.ks, d->ks, sizeof a.ks);
    memcpy(a.vs, d->vs, sizeof a.vs);
    a.bias = d->bias;
    memcpy(a.bst, d->bst, sizeof a.bst);
    a.mrow = d->mrow;
    a.B = d->B, a.H = d->H, a.T = d->T, a.S = d->S, a.D = d->D;
    a.scale = d->scale;
    a.causal = d->causal;
    a.p = d->dropout_p;
    a.keep_scale = d->keep_scale;
    a.seed = d->seed, a.stream = d->stream, a.counter = d->counter;
    a.rows = d->rows, a.row_first = d->row_first;
    a.bthd = d->bthd;
    return a;
}

/* The tensor-core path (attention_tc.cu). at_tc_usable: this device and head size can run it (sm_80+,
 * D <= 128, the shared memory granted; CM_CUDA_ATTENTION=f32 or rowwise say no). The entry points
 * take what cmi_cuda_attention / cmi_cuda_attention_bwd take; Dsum is (B, H, T) scratch. */
bool at_tc_usable(int64_t D);
cm_status at_tc_forward(const at_args &a, float *out, float *lse);
cm_status at_tc_backward(const at_args &a, const float *out, const float *gout, const float *lse, float *Dsum,
                         float *gq, bool q_fresh, bool run_kv, float *gk, bool k_fresh, float *gv, bool v_fresh,
                         float *dS);
