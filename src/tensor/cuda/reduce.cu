/* CUDA reductions (backend.h slots reduce, scatter_add, softmax, softmax_bwd, and the broadcast
 * reduction behind accum). Deterministic: every output is reduced by one thread (up to 64 elements),
 * one warp (up to 4095) or one block (longer groups) in a fixed order — no atomics — so a run repeats bit for bit. */
#include "tensor/cuda/common.cuh"

#include <math.h>

__device__ __forceinline__ int64_t unravel(int64_t i, int n, const int64_t *shape, const int64_t *stride) {
    int64_t off = 0;
    for (int d = n - 1; d >= 0; d--) {
        const int64_t q = i / shape[d];
        off += (i - q * shape[d]) * stride[d];
        i = q;
    }
    return off;
}

/* ---- generic reduction ---- */

struct racc {
    double s;
    float best;
    int64_t arg;
};

__device__ __forceinline__ bool better(int k, float v, float best) {
    if (k == CMI_RED_MAX) return v > best || (isnan(v) && !isnan(best));
    return v < best || (isnan(v) && !isnan(best));
}

/* Merge b into a; on a tie (or two NaNs) the earlier element (smaller arg) wins, as the CPU's
 * row-major scan keeps the first. */
__device__ __forceinline__ void merge(int k, racc &a, const racc &b) {
    if (k == CMI_RED_SUM || k == CMI_RED_SQDEV) {
        a.s += b.s;
        return;
    }
    if (better(k, b.best, a.best)) a = b;
    else if (!better(k, a.best, b.best) && b.arg < a.arg) a = b;
}

__device__ __forceinline__ racc shfl_racc(const racc &a, int o) {
    racc r;
    r.s = __shfl_xor_sync(0xffffffffu, a.s, o);
    r.best = __shfl_xor_sync(0xffffffffu, a.best, o);
    r.arg = __shfl_xor_sync(0xffffffffu, a.arg, o);
    return r;
}

/* One group (output o): this thread's share of the elements, lane-strided. */
__device__ __forceinline__ racc reduce_part(int k, const cmi_red_plan &P, const float *x, int64_t o, double mean,
                                            int64_t start, int64_t step) {
    racc a;
    a.s = 0.0;
    a.best = k == CMI_RED_MAX ? -INFINITY : INFINITY;
    a.arg = INT64_MAX;
    const float *base = x + unravel(o, P.nk, P.kshape, P.kstride);
    for (int64_t r = start; r < P.n_red; r += step) {
        const float v = base[unravel(r, P.nr, P.rshape, P.rstride)];
        if (k == CMI_RED_SUM) a.s += v;
        else if (k == CMI_RED_SQDEV) {
            const double d = (double)v - mean;
            a.s += d * d;
        } else if (better(k, v, a.best) || a.arg == INT64_MAX) {
            a.best = v;
            a.arg = r;
        }
    }
    return a;
}

/* Writes the result of output o. mode 0: out[o] (and sums/idx); mode 1: accumulate the sum into
 * dst at the offset of o through P.kcstride (accum). */
__device__ __forceinline__ void finish(int k, int mode, const cmi_red_plan &P, int64_t o, const racc &a, double scale,
                                       float *out, double *sums, int64_t *idx) {
    if (mode == 1) {
        out[unravel(o, P.nk, P.kshape, P.kcstride)] += (float)a.s;
        return;
    }
    if (k == CMI_RED_SUM || k == CMI_RED_SQDEV) {
        out[o] = (float)(a.s * scale);
        if (sums) sums[o] = a.s * scale;
    } else {
        out[o] = P.n_red ? a.best : (k == CMI_RED_MAX ? -INFINITY : INFINITY);
        if (idx)
            idx[o] = unravel(o, P.nk, P.kshape, P.kcstride) +
                     (P.n_red ? unravel(a.arg, P.nr, P.rshape, P.rcstride) : 0);
    }
}

/* One thread per output, for short groups (a broadcast gradient summed over a few rows, or no
 * reduction at all: accum of a same-shape gradient): neighbouring threads read neighbouring
 * outputs' elements, and no lane idles, as it would with a warp per output. */
__global__ void k_reduce_thread(int k, int mode, cmi_red_plan P, const float *x, const double *mean, double scale,
                                float *out, double *sums, int64_t *idx) {
    for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < P.n_out; o += (int64_t)gridDim.x * blockDim.x)
        finish(k, mode, P, o, reduce_part(k, P, x, o, mean ? mean[o] : 0.0, 0, 1), scale, out, sums, idx);
}

/* One warp per output (8 warps per block). */
__global__ void k_reduce_warp(int k, int mode, cmi_red_plan P, const float *x, const double *mean, double scale,
                              float *out, double *sums, int64_t *idx) {
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t o = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); o < P.n_out; o += warps) {
        racc a = reduce_part(k, P, x, o, mean ? mean[o] : 0.0, lane, 32);
        for (int s = 16; s > 0; s >>= 1) {
            const racc b = shfl_racc(a, s);
            merge(k, a, b);
        }
        if (lane == 0) finish(k, mode, P, o, a, scale, out, sums, idx);
    }
}

/* One block per output, for long groups. */
__global__ void k_reduce_block(int k, int mode, cmi_red_plan P, const float *x, const double *mean, double scale,
                               float *out, double *sums, int64_t *idx) {
    __shared__ racc part[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int64_t o = blockIdx.x; o < P.n_out; o += gridDim.x) {
        racc a = reduce_part(k, P, x, o, mean ? mean[o] : 0.0, threadIdx.x, blockDim.x);
        for (int s = 16; s > 0; s >>= 1) {
            const racc b = shfl_racc(a, s);
            merge(k, a, b);
        }
        __syncthreads();
        if (lane == 0) part[w] = a;
        __syncthreads();
        if (w == 0) {
            a = part[lane < nw ? lane : 0];
            if (lane >= nw) {
                a.s = 0.0;
                a.arg = INT64_MAX;
                a.best = k == CMI_RED_MAX ? -INFINITY : INFINITY;
            }
            for (int s = 16; s > 0; s >>= 1) {
                const racc b = shfl_racc(a, s);
                merge(k, a, b);
            }
            if (lane == 0) finish(k, mode, P, o, a, scale, out, sums, idx);
        }
    }
}

static cm_status launch_reduce(int k, int mode, const cmi_red_plan *P, const float *x, const double *mean,
                               double scale, float *out, double *sums, int64_t *idx) {
    if (P->n_out == 0) return CM_OK;
    cudaStream_t s = cmi_cuda_stream();
    if (P->n_red >= 4096) {
        const unsigned g = (unsigned)(P->n_out < (int64_t)cmi_cuda_sm_count() * 64 ? P->n_out
                                                                                   : (int64_t)cmi_cuda_sm_count() * 64);
        CMI_LAUNCH(k_reduce_block, g, 256, 0, s, k, mode, *P, x, mean, scale, out, sums, idx);
    } else if (P->n_red <= 64) {
        CMI_LAUNCH(k_reduce_thread, cmi_cuda_grid(P->n_out, 256), 256, 0, s, k, mode, *P, x, mean, scale, out, sums, idx);
    } else {
        CMI_LAUNCH(k_reduce_warp, cmi_cuda_grid(P->n_out, 8), 256, 0, s, k, mode, *P, x, mean, scale, out, sums, idx);
    }
    return cmi_cuda_launched("reduce");
}

extern "C" cm_status cmi_cuda_reduce(cmi_red_kernel k, const cmi_red_plan *P, const float *x, const double *mean,
                                     double scale, float *out, double *sums, int64_t *idx) {
    return launch_reduce((int)k, 0, P, x, mean, scale, out, sums, idx);
}

cm_status cmi_cuda_reduce_add(const cmi_red_plan *P, const float *src, float *dst) {
    return launch_reduce(CMI_RED_SUM, 1, P, src, NULL, 1.0, dst, NULL, NULL);
}

/* Column sums of src (R, C) row-major into dst (through the kept dims' strides): pass 1, blocks of
 * 256 columns × a chunk of rows, each thread summing its column down the chunk (neighbouring threads
 * read neighbouring floats) into part[chunk][c], in double; pass 2, a thread per column adds its
 * chunks in order. Fixed order, no atomics: a run repeats bit for bit. */
__global__ void k_colsum_chunks(const float *src, int64_t R, int64_t C, int64_t rows_per, double *part) {
    const int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int64_t r0 = blockIdx.y * rows_per, r1 = r0 + rows_per < R ? r0 + rows_per : R;
    double s = 0.0;
    for (int64_t r = r0; r < r1; r++) s += src[r * C + c];
    part[blockIdx.y * C + c] = s;
}

__global__ void k_colsum_finish(const double *part, int64_t nch, cmi_red_plan P, float *dst) {
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < P.n_out; c += (int64_t)gridDim.x * blockDim.x) {
        double s = 0.0;
        for (int64_t k = 0; k < nch; k++) s += part[k * P.n_out + c];
        dst[unravel(c, P.nk, P.kshape, P.kcstride)] += (float)s;
    }
}

cm_status cmi_cuda_colsum_add(const cmi_red_plan *P, const float *src, float *dst) {
    const int64_t R = P->n_red, C = P->n_out;
    if (R == 0 || C == 0) return CM_OK;
    /* enough chunks for about 4 blocks a multiprocessor, each at least 32 rows */
    const int64_t colblk = (C + 255) / 256, want = 4 * (int64_t)cmi_cuda_sm_count();
    int64_t nch = (want + colblk - 1) / colblk;
    if (nch > (R + 31) / 32) nch = (R + 31) / 32;
    if (nch < 1) nch = 1;
    const int64_t rows_per = (R + nch - 1) / nch;
    nch = (R + rows_per - 1) / rows_per;
    double *part = (double *)cmi_cuda_scratch(sizeof(double) * (size_t)(nch * C));
    if (!part) return cm_last_status();
    cudaStream_t s = cmi_cuda_stream();
    CMI_LAUNCH(k_colsum_chunks, dim3((unsigned)colblk, (unsigned)nch), 256, 0, s, src, R, C, rows_per, part);
    cm_status st = cmi_cuda_launched("column sums");
    if (st) return st;
    CMI_LAUNCH(k_colsum_finish, cmi_cuda_grid(C, 256), 256, 0, s, part, nch, *P, dst);
    return cmi_cuda_launched("column sums");
}

__global__ void k_scatter_add(float *ga, const int64_t *idx, const float *g, int64_t n) {
    for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < n; o += (int64_t)gridDim.x * blockDim.x)
        ga[idx[o]] += g[o];
}

extern "C" cm_status cmi_cuda_scatter_add(float *ga, const int64_t *idx, const float *g, int64_t n) {
    if (n <= 0) return CM_OK;
    CMI_LAUNCH(k_scatter_add, cmi_cuda_grid(n, 256), 256, 0, cmi_cuda_stream(), ga, idx, g, n);
    return cmi_cuda_launched("scatter_add");
}

/* ---- softmax / log_softmax (reduce.c's formulas) ---- */

/* Rows (inner == 1): one warp per row. */
__global__ void k_softmax_rows(const float *x, float *y, int64_t outer, int64_t L, bool log_out) {
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t o = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); o < outer; o += warps) {
        const float *xr = x + o * L;
        float *yr = y + o * L;
        float mx = -INFINITY;
        for (int64_t l = lane; l < L; l += 32) mx = fmaxf(mx, xr[l]);
        mx = cmi_warp_max(mx);
        if (mx == -INFINITY) mx = 0.0f;
        double sum = 0.0;
        for (int64_t l = lane; l < L; l += 32) sum += (double)expf(xr[l] - mx);
        sum = cmi_warp_sum(sum);
        if (log_out) {
            const float lse = mx + (float)log(sum);
            for (int64_t l = lane; l < L; l += 32) yr[l] = xr[l] - lse;
        } else {
            const float inv = (float)(1.0 / sum);
            for (int64_t l = lane; l < L; l += 32) yr[l] = expf(xr[l] - mx) * inv;
        }
    }
}

/* Columns (inner > 1): one thread per (outer, j) column, walking L with stride inner. */
__global__ void k_softmax_cols(const float *x, float *y, int64_t outer, int64_t L, int64_t inner, bool log_out) {
    const int64_t n = outer * inner;
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < n; c += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = c / inner, j = c - o * inner;
        const float *xc = x + o * L * inner + j;
        float *yc = y + o * L * inner + j;
        float mx = -INFINITY;
        for (int64_t l = 0; l < L; l++) mx = fmaxf(mx, xc[l * inner]);
        if (mx == -INFINITY) mx = 0.0f;
        float sum = 0.0f;
        for (int64_t l = 0; l < L; l++) sum += expf(xc[l * inner] - mx);
        if (log_out) {
            const float lse = mx + logf(sum);
            for (int64_t l = 0; l < L; l++) yc[l * inner] = xc[l * inner] - lse;
        } else {
            const float inv = 1.0f / sum;
            for (int64_t l = 0; l < L; l++) yc[l * inner] = expf(xc[l * inner] - mx) * inv;
        }
    }
}

extern "C" cm_status cmi_cuda_softmax(const float *x, float *y, int64_t outer, int64_t L, int64_t inner,
                                      bool log_out) {
    if (outer * L * inner == 0) return CM_OK;
    cudaStream_t s = cmi_cuda_stream();
    if (inner == 1) CMI_LAUNCH(k_softmax_rows, cmi_cuda_grid(outer, 8), 256, 0, s, x, y, outer, L, log_out);
    else CMI_LAUNCH(k_softmax_cols, cmi_cuda_grid(outer * inner, 256), 256, 0, s, x, y, outer, L, inner, log_out);
    return cmi_cuda_launched("softmax");
}

__global__ void k_softmax_bwd_rows(const float *y, const float *g, float *gx, int64_t outer, int64_t L, bool log_out) {
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t o = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); o < outer; o += warps) {
        const float *yr = y + o * L, *gr = g + o * L;
        float *gxr = gx + o * L;
        double dot = 0.0;
        for (int64_t l = lane; l < L; l += 32) dot += log_out ? (double)gr[l] : (double)gr[l] * yr[l];
        const float d = (float)cmi_warp_sum(dot);
        for (int64_t l = lane; l < L; l += 32)
            gxr[l] += log_out ? gr[l] - expf(yr[l]) * d : yr[l] * (gr[l] - d);
    }
}

__global__ void k_softmax_bwd_cols(const float *y, const float *g, float *gx, int64_t outer, int64_t L, int64_t inner,
                                   bool log_out) {
    const int64_t n = outer * inner;
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < n; c += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = c / inner, j = c - o * inner, off = o * L * inner + j;
        float dot = 0.0f;
        for (int64_t l = 0; l < L; l++) dot += log_out ? g[off + l * inner] : g[off + l * inner] * y[off + l * inner];
        for (int64_t l = 0; l < L; l++) {
            const int64_t q = off + l * inner;
            gx[q] += log_out ? g[q] - expf(y[q]) * dot : y[q] * (g[q] - dot);
        }
    }
}

extern "C" cm_status cmi_cuda_softmax_bwd(const float *y, const float *g, float *gx, int64_t outer, int64_t L,
                                          int64_t inner, bool log_out) {
    if (outer * L * inner == 0) return CM_OK;
    cudaStream_t s = cmi_cuda_stream();
    if (inner == 1) CMI_LAUNCH(k_softmax_bwd_rows, cmi_cuda_grid(outer, 8), 256, 0, s, y, g, gx, outer, L, log_out);
    else
        CMI_LAUNCH(k_softmax_bwd_cols, cmi_cuda_grid(outer * inner, 256), 256, 0, s, y, g, gx, outer, L, inner,
                   log_out);
    return cmi_cuda_launched("softmax_bwd");
}
