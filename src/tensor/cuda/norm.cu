/* Layer norm on the GPU (backend.h slots layer_norm, layer_norm_bwd), norm.c's formulas: one warp per
 * row for the statistics (two passes: mean, then squared deviations), and for the backward's dx; the
 * weight and bias gradients are column sums over rows, done as per-block partial sums in scratch and
 * then one pass over the blocks in order — deterministic, no atomics (llm.c's layernorm backward
 * became deterministic the same way). */
#include "tensor/cuda/common.cuh"

#include <math.h>

__global__ void k_layer_norm(const float *x, const float *w, const float *b, float *y, float *mean, float *rstd,
                             int64_t R, int64_t C, float eps) {
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t r = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); r < R; r += warps) {
        const float *xr = x + r * C;
        float s = 0.0f;
        for (int64_t c = lane; c < C; c += 32) s += xr[c];
        const float m = cmi_warp_sum(s) / (float)C;
        float v = 0.0f;
        for (int64_t c = lane; c < C; c += 32) v += (xr[c] - m) * (xr[c] - m);
        const float rs = 1.0f / sqrtf(cmi_warp_sum(v) / (float)C + eps);
        float *yr = y + r * C;
        for (int64_t c = lane; c < C; c += 32) {
            float o = (xr[c] - m) * rs;
            if (w) o *= w[c];
            if (b) o += b[c];
            yr[c] = o;
        }
        if (lane == 0) {
            mean[r] = m;
            rstd[r] = rs;
        }
    }
}

extern "C" cm_status cmi_cuda_layer_norm(const float *x, const float *w, const float *b, float *y, float *mean,
                                         float *rstd, int64_t R, int64_t C, float eps) {
    if (R == 0) return CM_OK;
    CMI_LAUNCH(k_layer_norm, cmi_cuda_grid(R, 8), 256, 0, cmi_cuda_stream(), x, w, b, y, mean, rstd, R, C, eps);
    return cmi_cuda_launched("layer_norm");
}

/* dx per row (one warp); with part != NULL, also this block's partial sums of g·xhat (part[0..C)) and
 * g (part[C..2C)) over the rows the block handled, written to part + blockIdx.x·2C. */
__global__ void k_layer_norm_bwd(const float *x, const float *w, const float *g, const float *mean, const float *rstd,
                                 float *gx, bool fresh, float *part, int64_t R, int64_t C, int64_t rows_per_block) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int64_t r0 = blockIdx.x * rows_per_block, r1 = r0 + rows_per_block < R ? r0 + rows_per_block : R;
    if (gx) {
        for (int64_t r = r0 + wid; r < r1; r += nw) {
            const float *xr = x + r * C, *gr = g + r * C;
            const float m = mean[r], rs = rstd[r];
            float a = 0.0f, c2 = 0.0f;
            for (int64_t c = lane; c < C; c += 32) {
                const float gw = w ? gr[c] * w[c] : gr[c];
                a += gw;
                c2 += gw * (xr[c] - m) * rs;
            }
            a = cmi_warp_sum(a) / (float)C;
            c2 = cmi_warp_sum(c2) / (float)C;
            float *dx = gx + r * C;
            for (int64_t c = lane; c < C; c += 32) {
                const float gw = w ? gr[c] * w[c] : gr[c];
                const float d = rs * (gw - a - (xr[c] - m) * rs * c2);
                dx[c] = fresh ? d : dx[c] + d;
            }
        }
    }
    if (part) {
        /* columns across the block's threads, rows of the block in order */
        float *pw = part + blockIdx.x * 2 * C, *pb = pw + C;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            float sw = 0.0f, sb = 0.0f;
            for (int64_t r = r0; r < r1; r++) {
                const float gv = g[r * C + c];
                sw += gv * (x[r * C + c] - mean[r]) * rstd[r];
                sb += gv;
            }
            pw[c] = sw;
            pb[c] = sb;
        }
    }
}

/* gw[c] += Σ_blocks part[blk][c]; gb[c] += Σ_blocks part[blk][C + c] (block order). */
__global__ void k_colsum_parts(const float *part, int64_t nblk, int64_t C, float *gw, float *gb) {
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < C; c += (int64_t)gridDim.x * blockDim.x) {
        float sw = 0.0f, sb = 0.0f;
        for (int64_t k = 0; k < nblk; k++) {
            sw += part[k * 2 * C + c];
            sb += part[k * 2 * C + C + c];
        }
        if (gw) gw[c] += sw;
        if (gb) gb[c] += sb;
    }
}

extern "C" cm_status cmi_cuda_layer_norm_bwd(const float *x, const float *w, const float *g, const float *mean,
                                             const float *rstd, float *gx, bool fresh, float *gw, float *gb, int64_t R,
                                             int64_t C) {
    if (R == 0 || C == 0) return CM_OK;
    const int64_t rows_per_block = 32;
    const int64_t nblk = (R + rows_per_block - 1) / rows_per_block;
    float *part = nullptr;
    if (gw || gb) {
        part = (float *)cmi_cuda_scratch(sizeof(float) * (size_t)(nblk * 2 * C));
        if (!part) return cm_last_status();
    }
    cudaStream_t s = cmi_cuda_stream();
    CMI_LAUNCH(k_layer_norm_bwd, (unsigned)nblk, 256, 0, s, x, w, g, mean, rstd, gx, fresh, part, R, C,
               rows_per_block);
    cm_status st = cmi_cuda_launched("layer_norm backward");
    if (st || !part) return st;
    CMI_LAUNCH(k_colsum_parts, cmi_cuda_grid(C, 256), 256, 0, s, part, nblk, C, gw, gb);
    return cmi_cuda_launched("layer_norm backward sums");
}
