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
                const float gw = w ? __fmul_rn(gr[c], w[c]) : gr[c]; /* rounded, never fused into gw - a */
                a += gw;
                c2 += gw * (xr[c] - m) * rs;
            }
            a = cmi_warp_sum(a) / (float)C;
            c2 = cmi_warp_sum(c2) / (float)C;
            float *dx = gx + r * C;
            for (int64_t c = lane; c < C; c += 32) {
                const float gw = w ? __fmul_rn(gr[c], w[c]) : gr[c]; /* rounded, never fused into gw - a */
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

/* ---- batch norm (backend.h slots batch_norm, batch_norm_bwd; norm.c's formulas) ----
 * Per-channel sums over the (O, C, I) view: a grid of (C, splits) blocks, each summing a slice of
 * one channel's O·I values (f32 per thread, the block's total in double) into partials, then one
 * thread per channel adds its partials in order (double): deterministic, no atomics. */

__device__ __forceinline__ float bn_ld(const void *p, int64_t i, bool bf) {
    return bf ? cmi_dbf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* Element j (of O·I) of channel c in the (O, C, I) layout. */
__device__ __forceinline__ int64_t bn_elem(int64_t j, int64_t c, int64_t C, int64_t I) {
    return I == 1 ? j * C + c : ((j / I) * C + c) * I + j % I;
}

/* The backward's masked upstream gradient gz at element e (norm.c's sum_value). */
__device__ __forceinline__ float bn_gz(const cmi_bn_bwd_args &a, int64_t e, int64_t c, float xv) {
    const float gv = bn_ld(a.g, e, a.gbf);
    if (a.zq) return (xv - a.mean[c]) * a.zq[c] + a.zq[a.C + c] > 0.0f ? gv : 0.0f;
    if (a.y) return bn_ld(a.y, e, a.bf) > 0.0f ? gv : 0.0f;
    return gv;
}

/* fwd (ba != NULL): v = x - shift[c]; bwd: v = gz (and gr (+)= gz). part[(c·splits + s)·2 + {0, 1}]
 * = Σ v, Σ (x - m)·v over this block's slice (m = shift forward, mean backward). */
__global__ void k_bn_sums(cmi_bn_args fa, cmi_bn_bwd_args bwa, bool fwd,
                          const float *shift, double *part, int64_t splits) {
    __shared__ double sh[32];
    const int64_t c = blockIdx.x / splits, sp = blockIdx.x % splits;
    const int64_t C = fwd ? fa.C : bwa.C, I = fwd ? fa.I : bwa.I, M = (fwd ? fa.O : bwa.O) * I;
    const int64_t per = (M + splits - 1) / splits, j0 = sp * per, j1 = j0 + per < M ? j0 + per : M;
    const float m = fwd ? shift[c] : bwa.mean[c];
    float f1 = 0.0f, f2 = 0.0f;
    for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
        const int64_t e = bn_elem(j, c, C, I);
        const float xv = bn_ld(fwd ? fa.x : bwa.x, e, fwd ? fa.bf : bwa.bf);
        float v;
        if (fwd) {
            v = xv - m;
        } else {
            v = bn_gz(bwa, e, c, xv);
            if (bwa.gr) bwa.gr[e] = bwa.gr_fresh ? v : bwa.gr[e] + v;
        }
        f1 += v;
        f2 += (xv - m) * v;
    }
    const double d1 = cmi_block_sum((double)f1, sh), d2 = cmi_block_sum((double)f2, sh);
    if (threadIdx.x == 0) {
        part[(c * splits + sp) * 2] = d1;
        part[(c * splits + sp) * 2 + 1] = d2;
    }
}

/* Forward statistics per channel from the partials: mean, rstd, running stats, Q and R. */
__global__ void k_bn_finish(cmi_bn_args a, const float *shift, const double *part, int64_t splits) {
    const int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (c >= a.C) return;
    const double M = (double)(a.O * a.I);
    if (a.training) {
        double s1 = 0, s2 = 0;
        for (int64_t k = 0; k < splits; k++) {
            s1 += part[(c * splits + k) * 2];
            s2 += part[(c * splits + k) * 2 + 1];
        }
        double var = (s2 - s1 * s1 / M) / M;
        const float mean = (float)((double)shift[c] + s1 / M);
        if (var < 0) var = 0;
        a.mean[c] = mean;
        a.rstd[c] = (float)(1.0 / sqrt(var + (double)a.eps));
        if (a.rm) {
            float *rm = a.rm + c * a.rms, *rv = a.rv + c * a.rvs;
            *rm = (1.0f - a.momentum) * *rm + a.momentum * mean;
            *rv = (1.0f - a.momentum) * *rv + a.momentum * (float)(var * M / (M - 1));
        }
    } else {
        a.mean[c] = a.rm[c * a.rms];
        a.rstd[c] = 1.0f / sqrtf(a.rv[c * a.rvs] + a.eps);
    }
    a.q[c] = a.rstd[c] * (a.w ? a.w[c] : 1.0f);
    a.r[c] = a.b ? a.b[c] : 0.0f;
}

/* y = (x - mean)·Q + R [+ res] [ReLU] (norm.c's chan_affine). */
__global__ void k_bn_affine(cmi_bn_args a) {
    const int64_t n = a.O * a.C * a.I;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t c = (e / a.I) % a.C;
        float y = (bn_ld(a.x, e, a.bf) - a.mean[c]) * a.q[c] + a.r[c];
        if (a.res) y += bn_ld(a.res, e, a.rbf);
        if (a.relu) y = y > 0.0f ? y : 0.0f;
        if (a.bf) ((uint16_t *)a.y)[e] = cmi_df32_to_bf16(y);
        else ((float *)a.y)[e] = y;
    }
}

/* Blocks per channel: enough to fill the device with a few thousand values each. */
static int64_t bn_splits(int64_t C, int64_t M) {
    int64_t s = (M + 4095) / 4096;
    const int64_t cap = (4 * (int64_t)cmi_cuda_sm_count() + C - 1) / C;
    if (s > cap) s = cap;
    return s < 1 ? 1 : s;
}

extern "C" cm_status cmi_cuda_batch_norm(const cmi_bn_args *a) {
    const int64_t C = a->C, M = a->O * a->I;
    if (C == 0) return CM_OK;
    cudaStream_t st = cmi_cuda_stream();
    const int64_t splits = bn_splits(C, M);
    double *part = nullptr;
    float *shift = nullptr;
    if (a->training) {
        char *buf = (char *)cmi_cuda_scratch(sizeof(double) * (size_t)(2 * C * splits) + sizeof(float) * (size_t)C);
        if (!buf) return cm_last_status();
        part = (double *)buf;
        shift = (float *)(buf + sizeof(double) * (size_t)(2 * C * splits));
        /* the shift: each channel's first value, x[(0·C + c)·I] (as f32) */
        int64_t shape[1] = {C}, one[1] = {1}, xs[1] = {a->I};
        cm_status s = cmi_cuda_copy(shift, CM_DTYPE_F32, one, a->x, a->bf ? CM_DTYPE_BF16 : CM_DTYPE_F32, xs, 1, shape);
        if (s) return s;
        CMI_LAUNCH(k_bn_sums, (unsigned)(C * splits), 256, 0, st, *a, cmi_bn_bwd_args{},
                   true, shift, part, splits);
        if ((s = cmi_cuda_launched("batch_norm statistics"))) return s;
    }
    CMI_LAUNCH(k_bn_finish, cmi_cuda_grid(C, 128), 128, 0, st, *a, shift, part, splits);
    cm_status s = cmi_cuda_launched("batch_norm statistics (finish)");
    if (s || M == 0) return s;
    CMI_LAUNCH(k_bn_affine, cmi_cuda_grid(a->O * C * a->I, 256), 256, 0, st, *a);
    return cmi_cuda_launched("batch_norm");
}

/* Backward coefficients per channel (norm.c's batch_norm_backward): gw, gb and P, Q, R. */
__global__ void k_bn_coef(cmi_bn_bwd_args a, const double *part, int64_t splits, float *coef) {
    const int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (c >= a.C) return;
    double sg = 0, sgx = 0;
    for (int64_t k = 0; k < splits; k++) {
        sg += part[(c * splits + k) * 2];
        sgx += part[(c * splits + k) * 2 + 1];
    }
    const double M = (double)(a.O * a.I);
    const float rs = a.rstd[c], wc = a.w ? a.w[c] : 1.0f;
    const double sum_gxhat = sgx * rs;
    if (a.gw) a.gw[c] += (float)sum_gxhat;
    if (a.gb) a.gb[c] += (float)sg;
    const float P = wc * rs;
    coef[c] = P;
    coef[a.C + c] = a.training ? (float)(-(double)P * rs * sum_gxhat / M) : 0.0f;
    coef[2 * a.C + c] = a.training ? (float)(-(double)P * sg / M) : 0.0f;
}

__global__ void k_bn_dx(cmi_bn_bwd_args a, const float *coef) {
    const int64_t n = a.O * a.C * a.I;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t c = (e / a.I) % a.C;
        const float xv = bn_ld(a.x, e, a.bf);
        const float d = bn_gz(a, e, c, xv) * coef[c] + (xv - a.mean[c]) * coef[a.C + c] + coef[2 * a.C + c];
        a.gx[e] = a.gx_fresh ? d : a.gx[e] + d;
    }
}

extern "C" cm_status cmi_cuda_batch_norm_bwd(const cmi_bn_bwd_args *a) {
    const int64_t C = a->C, M = a->O * a->I;
    if (C == 0 || M == 0) return CM_OK;
    cudaStream_t st = cmi_cuda_stream();
    const int64_t splits = bn_splits(C, M);
    char *buf = (char *)cmi_cuda_scratch(sizeof(double) * (size_t)(2 * C * splits) + sizeof(float) * (size_t)(3 * C));
    if (!buf) return cm_last_status();
    double *part = (double *)buf;
    float *coef = (float *)(buf + sizeof(double) * (size_t)(2 * C * splits));
    CMI_LAUNCH(k_bn_sums, (unsigned)(C * splits), 256, 0, st, cmi_bn_args{}, *a, false,
               (const float *)nullptr, part, splits);
    cm_status s = cmi_cuda_launched("batch_norm backward sums");
    if (s) return s;
    CMI_LAUNCH(k_bn_coef, cmi_cuda_grid(C, 128), 128, 0, st, *a, part, splits, coef);
    if ((s = cmi_cuda_launched("batch_norm backward coefficients")) || !a->gx) return s;
    CMI_LAUNCH(k_bn_dx, cmi_cuda_grid(a->O * C * a->I, 256), 256, 0, st, *a, coef);
    return cmi_cuda_launched("batch_norm backward");
}

/* ---- group norm (backend.h slots group_norm, group_norm_bwd; norm.c's formulas) ----
 * x (N, C, S) contiguous: row r = (n, g) is the C/G·S values of its channels, one block per row
 * (the statistics and dx need the whole row); the weight and bias gradients are per-channel sums
 * over (N, S), one block per channel in double. Fixed reduction orders: no atomics. */

__global__ void k_group_norm(const float *x, const float *w, const float *b, float *y, float *mean, float *rstd,
                             int64_t R, int64_t C, int64_t S, int64_t G, float eps) {
    __shared__ float sh[32];
    const int64_t cpg = C / G, L = cpg * S;
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        const float *xr = x + r * L;
        float s = 0.0f;
        for (int64_t i = threadIdx.x; i < L; i += blockDim.x) s += xr[i];
        const float m = cmi_block_sum(s, sh) / (float)L;
        float v = 0.0f;
        for (int64_t i = threadIdx.x; i < L; i += blockDim.x) v += (xr[i] - m) * (xr[i] - m);
        const float rs = 1.0f / sqrtf(cmi_block_sum(v, sh) / (float)L + eps);
        const int64_t c0 = (r % G) * cpg;
        float *yr = y + r * L;
        for (int64_t i = threadIdx.x; i < L; i += blockDim.x) {
            const int64_t c = c0 + i / S;
            const float q = rs * (w ? w[c] : 1.0f), b0 = b ? b[c] : 0.0f;
            yr[i] = (xr[i] - m) * q + b0;
        }
        if (threadIdx.x == 0) {
            mean[r] = m;
            rstd[r] = rs;
        }
    }
}

extern "C" cm_status cmi_cuda_group_norm(const float *x, const float *w, const float *b, float *y, float *mean,
                                         float *rstd, int64_t N, int64_t C, int64_t S, int64_t G, float eps) {
    const int64_t R = N * G;
    if (R == 0) return CM_OK;
    CMI_LAUNCH(k_group_norm, cmi_cuda_grid(R, 1), 256, 0, cmi_cuda_stream(), x, w, b, y, mean, rstd, R, C, S, G, eps);
    return cmi_cuda_launched("group_norm");
}

/* dx per row: rstd · (g·w - mean(g·w) - xhat · mean(g·w·xhat)). */
__global__ void k_group_norm_bwd_x(const float *x, const float *w, const float *g, const float *mean,
                                   const float *rstd, float *gx, int64_t R, int64_t C, int64_t S, int64_t G) {
    __shared__ float sh[32];
    const int64_t cpg = C / G, L = cpg * S;
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        const float *xr = x + r * L, *gr = g + r * L;
        const float m = mean[r], rs = rstd[r];
        const int64_t c0 = (r % G) * cpg;
        float a = 0.0f, c2 = 0.0f;
        for (int64_t i = threadIdx.x; i < L; i += blockDim.x) {
            const float gw = __fmul_rn(gr[i], w ? w[c0 + i / S] : 1.0f); /* rounded, never fused into gw - a */
            a += gw;
            c2 += gw * (xr[i] - m);
        }
        a = cmi_block_sum(a, sh) / (float)L;
        c2 = cmi_block_sum(c2, sh) * rs / (float)L;
        float *dx = gx + r * L;
        for (int64_t i = threadIdx.x; i < L; i += blockDim.x) {
            const float gw = __fmul_rn(gr[i], w ? w[c0 + i / S] : 1.0f); /* rounded, never fused into gw - a */
            dx[i] += rs * (gw - a - (xr[i] - m) * rs * c2);
        }
    }
}

/* gw[c] += Σ_n rstd·Σ_s g·(x - mean), gb[c] += Σ_{n,s} g: one block per channel, in double. */
__global__ void k_group_norm_bwd_wb(const float *x, const float *g, const float *mean, const float *rstd, float *gw,
                                    float *gb, int64_t N, int64_t C, int64_t S, int64_t G) {
    __shared__ double sh[32];
    const int64_t cpg = C / G;
    for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
        double dw = 0.0, db = 0.0;
        for (int64_t e = threadIdx.x; e < N * S; e += blockDim.x) {
            const int64_t n = e / S, i = e - n * S, r = n * G + c / cpg, at = (n * C + c) * S + i;
            dw += (double)g[at] * (x[at] - mean[r]) * rstd[r];
            db += g[at];
        }
        dw = cmi_block_sum(dw, sh);
        db = cmi_block_sum(db, sh);
        if (threadIdx.x == 0) {
            if (gw) gw[c] += (float)dw;
            if (gb) gb[c] += (float)db;
        }
    }
}

extern "C" cm_status cmi_cuda_group_norm_bwd(const float *x, const float *w, const float *g, const float *mean,
                                             const float *rstd, float *gx, float *gw, float *gb, int64_t N, int64_t C,
                                             int64_t S, int64_t G) {
    const int64_t R = N * G;
    cudaStream_t s = cmi_cuda_stream();
    if (gx && R > 0 && S > 0) {
        CMI_LAUNCH(k_group_norm_bwd_x, cmi_cuda_grid(R, 1), 256, 0, s, x, w, g, mean, rstd, gx, R, C, S, G);
        cm_status st = cmi_cuda_launched("group_norm backward");
        if (st) return st;
    }
    if ((gw || gb) && C > 0) {
        CMI_LAUNCH(k_group_norm_bwd_wb, cmi_cuda_grid(C, 1), 256, 0, s, x, g, mean, rstd, gw, gb, N, C, S, G);
        return cmi_cuda_launched("group_norm parameter gradients");
    }
    return CM_OK;
}
