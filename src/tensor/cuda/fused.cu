/* Fused bias + GELU and dropout on the GPU (backend.h slots bias_gelu, bias_gelu_bwd, dropout,
 * dropout_bwd).
 *
 * Dropout draws its mask from the same Philox-4x32-10 stream as the CPU (src/base/rng.c): element
 * i of a row segment starting at counter c is dropped when the uniform from block c + i/4, word
 * i % 4 is below p, with the row context's per-row counters (cmi_dropout_mask) — so a seed gives the
 * same mask on both devices, bit for bit. */
#include "tensor/cuda/common.cuh"

#include <math.h>

#define GELU_K 0.7978845608028654f
#define GELU_C 0.044715f

__device__ __forceinline__ float gelu_f(float x, bool approx) {
    if (approx) return 0.5f * x * (1.0f + tanhf(GELU_K * (x + GELU_C * x * x * x)));
    return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
}
__device__ __forceinline__ float gelu_df(float x, bool approx) {
    if (approx) {
        const float t = tanhf(GELU_K * (x + GELU_C * x * x * x));
        return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_C * x * x);
    }
    return 0.5f * (1.0f + erff(x * 0.7071067811865476f)) + x * 0.3989422804014327f * expf(-0.5f * x * x);
}

__global__ void k_bias_gelu(const float *x, const float *b, float *y, int64_t n, int64_t C, bool approx) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = gelu_f(x[i] + b[i % C], approx);
}

extern "C" cm_status cmi_cuda_bias_gelu(const float *x, const float *b, float *y, int64_t rows, int64_t C, bool approx) {
    const int64_t n = rows * C;
    if (n == 0) return CM_OK;
    CMI_LAUNCH(k_bias_gelu, cmi_cuda_grid(n, 256), 256, 0, cmi_cuda_stream(), x, b, y, n, C, approx);
    return cmi_cuda_launched("bias_gelu");
}

/* gx = g·gelu'(x + b) (written or added); per block of rows, partial column sums of it for gb. A
 * block is rows_per_block rows of 256 columns (blockIdx.y: which 256), a thread one column of them:
 * GPT-2's 8192 x 3072 is 3072 blocks. (The H200 profile: 220 µs for that shape, against 39 µs for
 * PyTorch's GELU backward, when a block took all columns of its rows — 256 blocks, a quarter of
 * the GPU's threads, each thread 12 columns one after another.) The pointers do not alias (gx is
 * x's gradient, g the output's), so a thread keeps several rows' loads in flight. */
__global__ void k_bias_gelu_bwd(const float *__restrict__ x, const float *__restrict__ b, const float *__restrict__ g,
                                float *__restrict__ gx, bool fresh, float *__restrict__ part, int64_t rows, int64_t C,
                                int64_t rows_per_block, bool approx) {
    const int64_t r0 = blockIdx.x * rows_per_block, r1 = r0 + rows_per_block < rows ? r0 + rows_per_block : rows;
    for (int64_t c = blockIdx.y * (int64_t)blockDim.x + threadIdx.x; c < C; c += (int64_t)gridDim.y * blockDim.x) {
        float acc = 0.0f;
        const float bc = b[c];
#if !defined(CMI_CUDA_EMU)
#pragma unroll 8
#endif
        for (int64_t r = r0; r < r1; r++) {
            const int64_t i = r * C + c;
            const float d = g[i] * gelu_df(x[i] + bc, approx);
            if (gx) gx[i] = fresh ? d : gx[i] + d;
            acc += d;
        }
        if (part) part[blockIdx.x * C + c] = acc;
    }
}

__global__ void k_colsum(const float *part, int64_t nblk, int64_t C, float *out) {
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < C; c += (int64_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int64_t k = 0; k < nblk; k++) s += part[k * C + c];
        out[c] += s;
    }
}

extern "C" cm_status cmi_cuda_bias_gelu_bwd(const float *x, const float *b, const float *g, float *gx, bool fresh,
                                            float *gb, int64_t rows, int64_t C, bool approx) {
    if (rows == 0 || C == 0) return CM_OK;
    const int64_t rpb = 32, nblk = (rows + rpb - 1) / rpb;
    float *part = nullptr;
    if (gb && !(part = (float *)cmi_cuda_scratch(sizeof(float) * (size_t)(nblk * C)))) return cm_last_status();
    cudaStream_t s = cmi_cuda_stream();
    const int64_t cblk = (C + 255) / 256;
    const dim3 grid((unsigned)nblk, (unsigned)(cblk < 65535 ? cblk : 65535));
    CMI_LAUNCH(k_bias_gelu_bwd, grid, 256, 0, s, x, b, g, gx, fresh, part, rows, C, rpb, approx);
    cm_status st = cmi_cuda_launched("bias_gelu backward");
    if (st || !gb) return st;
    CMI_LAUNCH(k_colsum, cmi_cuda_grid(C, 256), 256, 0, s, part, nblk, C, gb);
    return cmi_cuda_launched("bias_gelu backward sums");
}

/* One thread per block of 4 elements of a row segment. rows 0: the whole tensor is one segment at
 * `counter`; else row i's segment starts at counter + (row_first + i)·ceil(per_row / 4). */
__global__ void k_dropout(const float *x, float *y, uint8_t *drop, int64_t numel, int64_t rows, int64_t row_first,
                          uint64_t seed, uint64_t stream, uint64_t counter, float p, float scale) {
    const int64_t per_row = rows ? numel / rows : numel, nseg = rows ? rows : 1, bpr = (per_row + 3) / 4,
                  total = nseg * bpr;
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t seg = t / bpr, blk = t - seg * bpr;
        const uint64_t ctr = counter + (uint64_t)(rows ? (row_first + seg) * bpr : 0) + (uint64_t)blk;
        uint32_t w[4];
        cmi_philox(seed, stream, ctr, w);
        for (int j = 0; j < 4; j++) {
            const int64_t k = blk * 4 + j;
            if (k >= per_row) break;
            const int64_t e = seg * per_row + k;
            const bool d = (float)(w[j] >> 8) * (1.0f / 16777216.0f) < p;
            drop[e] = d ? 1 : 0;
            y[e] = d ? 0.0f : x[e] * scale;
        }
    }
}

extern "C" cm_status cmi_cuda_dropout(const float *x, float *y, uint8_t *drop, int64_t numel, int64_t rows,
                                      int64_t row_first, uint64_t seed, uint64_t stream, uint64_t counter, float p,
                                      float scale) {
    if (numel == 0) return CM_OK;
    const int64_t per_row = rows ? numel / rows : numel, total = (rows ? rows : 1) * ((per_row + 3) / 4);
    CMI_LAUNCH(k_dropout, cmi_cuda_grid(total, 256), 256, 0, cmi_cuda_stream(), x, y, drop, numel, rows, row_first,
               seed, stream, counter, p, scale);
    return cmi_cuda_launched("dropout");
}

__global__ void k_dropout_bwd(const float *g, const uint8_t *drop, float *gx, int64_t n, float scale, bool fresh) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float d = drop[i] ? 0.0f : g[i] * scale;
        gx[i] = fresh ? d : gx[i] + d;
    }
}

extern "C" cm_status cmi_cuda_dropout_bwd(const float *g, const uint8_t *drop, float *gx, int64_t n, float scale,
                                          bool fresh) {
    if (n == 0) return CM_OK;
    CMI_LAUNCH(k_dropout_bwd, cmi_cuda_grid(n, 256), 256, 0, cmi_cuda_stream(), g, drop, gx, n, scale, fresh);
    return cmi_cuda_launched("dropout backward");
}
