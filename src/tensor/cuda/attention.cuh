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

__device__ __forceinline__ void at_philox(uint64_t seed, uint64_t stream, uint64_t counter, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = (uint32_t)stream,
             c3 = (uint32_t)(stream >> 32), k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        if (r) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0;
        c1 = (uint32_t)p1;
        c2 = n2;
        c3 = (uint32_t)p0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

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
    at_philox(a.seed, a.stream, ctr, w);
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
