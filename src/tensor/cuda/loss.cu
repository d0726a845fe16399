/* Fused softmax + cross-entropy on the GPU (backend.h slots ce_check, ce_fwd, ce_bwd), loss.c's
 * formulas: one warp (C < 1024) or one block per position p, whose C logits lie at stride S. The
 * forward keeps the log-sum-exp per position; the backward recomputes softmax from it and never
 * stores an (N, C) probability tensor. The total over positions is summed in a fixed order. */
#include "tensor/cuda/common.cuh"

#include <math.h>

__device__ __forceinline__ int64_t load_idx(int dt, const void *p, int64_t i) {
    return dt == CM_DTYPE_I32 ? ((const int32_t *)p)[i]
           : dt == CM_DTYPE_U8 ? ((const uint8_t *)p)[i]
                                : ((const int64_t *)p)[i];
}

/* ---- index check: count of non-ignored targets and the first bad position ---- */

__global__ void k_ce_check(const void *t, int dt, int64_t P, int64_t C, int64_t ignore, unsigned long long *count,
                           unsigned long long *bad) {
    __shared__ unsigned long long sh[32];
    unsigned long long c = 0, b = ~0ull;
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < P; p += (int64_t)gridDim.x * blockDim.x) {
        const int64_t v = load_idx(dt, t, p);
        if (v == ignore) continue;
        c++;
        if ((v < 0 || v >= C) && (unsigned long long)p < b) b = (unsigned long long)p;
    }
    c = cmi_block_sum(c, sh);
    /* min over the block by shuffles */
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long w = __shfl_xor_sync(0xffffffffu, b, o);
        b = w < b ? w : b;
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = b;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (unsigned w = 1; w < (blockDim.x + 31) / 32; w++) b = sh[w] < b ? sh[w] : b;
        b = sh[0] < b ? sh[0] : b;
        atomicAdd(count, c);
        atomicMin(bad, b);
    }
}

extern "C" cm_status cmi_cuda_ce_check(const void *target, cm_dtype dt, int64_t P, int64_t C, int64_t ignore,
                                       int64_t *count, int64_t *bad, int64_t *bad_val) {
    *count = 0;
    *bad = -1;
    if (P <= 0) return CM_OK;
    unsigned long long *d = (unsigned long long *)cmi_cuda_scratch(2 * sizeof(unsigned long long));
    if (!d) return cm_last_status();
    const unsigned long long init[2] = {0ull, ~0ull};
    CMI_CUDA_TRY(cudaMemcpyAsync(d, init, sizeof init, cudaMemcpyHostToDevice, cmi_cuda_stream()));
    CMI_LAUNCH(k_ce_check, cmi_cuda_grid(P, 256), 256, 0, cmi_cuda_stream(), target, (int)dt, P, C, ignore, d, d + 1);
    cm_status s = cmi_cuda_launched("ce_check");
    if (s) return s;
    unsigned long long h[2];
    CMI_CUDA_TRY(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, cmi_cuda_stream()));
    CMI_CUDA_TRY(cudaStreamSynchronize(cmi_cuda_stream()));
    *count = (int64_t)h[0];
    if (h[1] != ~0ull) {
        *bad = (int64_t)h[1];
        const size_t es = cm_dtype_size(dt);
        int64_t v = 0;
        unsigned char raw[8] = {0};
        CMI_CUDA_TRY(cudaMemcpy(raw, (const char *)target + (size_t)h[1] * es, es, cudaMemcpyDeviceToHost));
        if (dt == CM_DTYPE_I32) {
            int32_t x;
            memcpy(&x, raw, 4);
            v = x;
        } else if (dt == CM_DTYPE_U8) {
            v = raw[0];
        } else {
            memcpy(&v, raw, 8);
        }
        *bad_val = v;
    }
    return CM_OK;
}

/* ---- forward ---- */

/* The position's log-sum-exp and loss, by the calling group of `width` threads (lane 0 .. width-1). */
template <int WIDTH>
__device__ __forceinline__ void ce_position(const float *xr, int64_t C, int64_t S, const void *t, int tdt, bool soft,
                                            const float *tr, int64_t p, int64_t ignore, float eps, int lane,
                                            float *sh, float *lse_out, double *loss_out) {
    float mx = -INFINITY;
    for (int64_t k = lane; k < C; k += WIDTH) mx = fmaxf(mx, xr[k * S]);
    if (WIDTH == 32) mx = cmi_warp_max(mx);
    else {
        mx = cmi_warp_max(mx);
        __syncthreads();
        if ((lane & 31) == 0) sh[lane >> 5] = mx;
        __syncthreads();
        mx = (lane & 31) < WIDTH / 32 ? sh[lane & 31] : -INFINITY;
        mx = cmi_warp_max(mx);
    }
    if (mx == -INFINITY) mx = 0.0f;
    double se = 0.0, sx = 0.0, st = 0.0;
    const float u = eps / (float)C;
    for (int64_t k = lane; k < C; k += WIDTH) {
        const float x = xr[k * S];
        se += (double)expf(x - mx);
        if (!soft && eps > 0.0f) sx += x;
        if (soft) st += ((1.0 - eps) * tr[k * S] + u) * (double)x; /* Σ target_k·x_k; the lse part below */
    }
    double ts = 0.0; /* soft: Σ smoothed targets */
    if (soft)
        for (int64_t k = lane; k < C; k += WIDTH) ts += (1.0 - eps) * tr[k * S] + u;
    if (WIDTH == 32) {
        se = cmi_warp_sum(se);
        sx = cmi_warp_sum(sx);
        st = cmi_warp_sum(st);
        ts = cmi_warp_sum(ts);
    } else {
        double *dsh = (double *)sh;
        se = cmi_block_sum(se, dsh);
        sx = cmi_block_sum(sx, dsh);
        st = cmi_block_sum(st, dsh);
        ts = cmi_block_sum(ts, dsh);
    }
    const float l = mx + (float)log(se);
    if (lane != 0) return;
    *lse_out = l;
    double loss;
    if (!soft) {
        const int64_t tv = load_idx(tdt, t, p);
        if (tv == ignore) loss = 0.0;
        else {
            loss = (1.0 - eps) * ((double)l - xr[tv * S]);
            if (eps > 0.0f) loss += eps * ((double)l - sx / (double)C);
        }
    } else {
        loss = ts * (double)l - st;
    }
    *loss_out = loss;
}

__global__ void k_ce_fwd_warp(const float *x, const void *t, int tdt, bool soft, int64_t N, int64_t C, int64_t S,
                              int64_t ldn, int64_t ignore, float eps, float *lse, double *loss) {
    const int lane = threadIdx.x & 31;
    const int64_t P = N * S, warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t p = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); p < P; p += warps) {
        const int64_t off = (p / S) * ldn + p % S, toff = (p / S) * C * S + p % S;
        ce_position<32>(x + off, C, S, t, tdt, soft, soft ? (const float *)t + toff : nullptr, p, ignore, eps, lane,
                        nullptr, lse + p, loss + p);
    }
}

__global__ void k_ce_fwd_block(const float *x, const void *t, int tdt, bool soft, int64_t N, int64_t C, int64_t S,
                               int64_t ldn, int64_t ignore, float eps, float *lse, double *loss) {
    __shared__ double sh[32];
    const int64_t P = N * S;
    for (int64_t p = blockIdx.x; p < P; p += gridDim.x) {
        const int64_t off = (p / S) * ldn + p % S, toff = (p / S) * C * S + p % S;
        ce_position<256>(x + off, C, S, t, tdt, soft, soft ? (const float *)t + toff : nullptr, p, ignore, eps,
                         threadIdx.x, (float *)sh, lse + p, loss + p);
    }
}

/* out[0] = (float)(Σ loss / denom), one block, fixed order. */
__global__ void k_sum_losses(const double *loss, int64_t P, double denom, float *out) {
    __shared__ double sh[32];
    double s = 0.0;
    for (int64_t p = threadIdx.x; p < P; p += blockDim.x) s += loss[p];
    s = cmi_block_sum(s, sh);
    if (threadIdx.x == 0) out[0] = (float)(s / denom);
}

__global__ void k_losses_to_f32(const double *loss, int64_t P, float *out) {
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < P; p += (int64_t)gridDim.x * blockDim.x)
        out[p] = (float)loss[p];
}

extern "C" cm_status cmi_cuda_ce_fwd(const float *x, const void *target, cm_dtype tdt, bool soft, int64_t N, int64_t C,
                                     int64_t S, int64_t ldn, int64_t ignore, float eps, bool none, double denom,
                                     float *out, float *lse) {
    const int64_t P = N * S;
    if (P == 0) {
        if (!none) return cmi_cuda_fill(out, CM_DTYPE_F32, 0, nullptr, nullptr, 0.0 / denom);
        return CM_OK;
    }
    double *loss = (double *)cmi_cuda_scratch(sizeof(double) * (size_t)P);
    if (!loss) return cm_last_status();
    cudaStream_t s = cmi_cuda_stream();
    if (C >= 1024)
        CMI_LAUNCH(k_ce_fwd_block, (unsigned)(P < 65535 ? P : 65535), 256, 0, s, x, target, (int)tdt, soft, N, C, S,
                   ldn, ignore, eps, lse, loss);
    else
        CMI_LAUNCH(k_ce_fwd_warp, cmi_cuda_grid(P, 8), 256, 0, s, x, target, (int)tdt, soft, N, C, S, ldn, ignore, eps,
                   lse, loss);
    cm_status st = cmi_cuda_launched("cross_entropy");
    if (st) return st;
    if (none) CMI_LAUNCH(k_losses_to_f32, cmi_cuda_grid(P, 256), 256, 0, s, loss, P, out);
    else CMI_LAUNCH(k_sum_losses, 1, 1024, 0, s, loss, P, denom, out);
    return cmi_cuda_launched("cross_entropy sum");
}

/* ---- backward ---- */

__global__ void k_ce_bwd(const float *x, const void *t, int tdt, bool soft, int64_t N, int64_t C, int64_t S,
                         int64_t ldn, int64_t ignore, float eps, bool none, double denom, const float *g,
                         const float *lse, float *gl, bool fresh, float *gt) {
    const int64_t P = N * S, total = P * C;
    const float u = eps / (float)C;
    const float g_all = none ? 0.0f : (float)((double)g[0] / denom);
    /* one thread per (position, class): element e = p·C + k in position order */
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        /* off: the logit (and its gradient) in x's layout; toff: the soft target, contiguous */
        const int64_t p = e / C, k = e - p * C, off = (p / S) * ldn + p % S + k * S,
                      toff = (p / S) * C * S + p % S + k * S;
        const float w = none ? g[p] : g_all, xv = x[off], l = lse[p];
        if (!soft) {
            if (!gl) continue;
            const int64_t tv = load_idx(tdt, t, p);
            float d;
            if (tv == ignore) d = 0.0f;
            else {
                d = w * (expf(xv - l) - u);
                if (k == tv) d -= w * (1.0f - eps);
            }
            gl[off] = fresh ? d : gl[off] + d;
        } else {
            const float *tr = (const float *)t;
            if (gl) {
                /* Σ_k smoothed target = (1-eps)·Σ t + eps; recomputed per element (C reads) only when the
                 * targets may not sum to one — the usual soft target does; kept exact as the CPU. */
                float tsum = 0.0f;
                const int64_t base = (p / S) * C * S + p % S;
                for (int64_t j = 0; j < C; j++) tsum += (1.0f - eps) * tr[base + j * S] + u;
                const float d = w * (expf(xv - l) * tsum - ((1.0f - eps) * tr[toff] + u));
                gl[off] = fresh ? d : gl[off] + d;
            }
            if (gt) gt[toff] += w * (1.0f - eps) * (l - xv);
        }
    }
}

/* The usual case, (P, C) logits (S == 1) with class indices: a block per position, its threads along
 * the classes — the same arithmetic as k_ce_bwd without its three 64-bit divisions per element
 * (GPT-2's 8192 x 50257 logits: 412 M elements a step) and with the target read once per row. */
__global__ void k_ce_bwd_rows(const float *x, const void *t, int tdt, int64_t P, int64_t C, int64_t ldn, int64_t ignore,
                              float eps, bool none, double denom, const float *g, const float *lse, float *gl,
                              bool fresh) {
    const float u = eps / (float)C;
    const float g_all = none ? 0.0f : (float)((double)g[0] / denom);
    for (int64_t p = blockIdx.x; p < P; p += gridDim.x) {
        const float w = none ? g[p] : g_all, l = lse[p];
        const int64_t tv = load_idx(tdt, t, p);
        const float *xr = x + p * ldn;
        float *gr = gl + p * ldn;
        for (int64_t k = threadIdx.x; k < C; k += blockDim.x) {
            float d;
            if (tv == ignore) d = 0.0f;
            else {
                d = w * (expf(xr[k] - l) - u);
                if (k == tv) d -= w * (1.0f - eps);
            }
            gr[k] = fresh ? d : gr[k] + d;
        }
    }
}

extern "C" cm_status cmi_cuda_ce_bwd(const float *x, const void *target, cm_dtype tdt, bool soft, int64_t N,
                                     int64_t C, int64_t S, int64_t ldn, int64_t ignore, float eps, bool none,
                                     double denom, const float *g, const float *lse, float *gl, bool fresh,
                                     float *gt) {
    const int64_t total = N * S * C;
    if (total == 0) return CM_OK;
    if (S == 1 && !soft && gl && C >= 256) {
        CMI_LAUNCH(k_ce_bwd_rows, (unsigned)(N < 65535 ? N : 65535), 256, 0, cmi_cuda_stream(), x, target, (int)tdt, N,
                   C, ldn, ignore, eps, none, denom, g, lse, gl, fresh);
        return cmi_cuda_launched("cross_entropy backward");
    }
    CMI_LAUNCH(k_ce_bwd, cmi_cuda_grid(total, 256), 256, 0, cmi_cuda_stream(), x, target, (int)tdt, soft, N, C, S,
               ldn, ignore, eps, none, denom, g, lse, gl, fresh, gt);
    return cmi_cuda_launched("cross_entropy backward");
}

/* ---- mean squared error (backend.h slots mse, mse_bwd; loss.c's formulas) ----
 * The reduced forms sum (p - t)² in double as per-block partials, then one block adds the
 * partials in order and writes the result: deterministic, no atomics, no wait for the host. */

__global__ void k_mse_none(const float *p, const float *t, int64_t n, float *out) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = (p[i] - t[i]) * (p[i] - t[i]);
}

__global__ void k_mse_part(const float *p, const float *t, int64_t n, double *part) {
    __shared__ double sh[32];
    double s = 0.0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const double d = (double)p[i] - t[i];
        s += d * d;
    }
    s = cmi_block_sum(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void k_mse_finish(const double *part, int n, double denom, float *out) {
    __shared__ double sh[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += part[i];
    s = cmi_block_sum(s, sh);
    if (threadIdx.x == 0) out[0] = (float)(s / denom);
}

extern "C" cm_status cmi_cuda_mse(const float *p, const float *t, int64_t n, bool none, double denom, float *out) {
    cudaStream_t s = cmi_cuda_stream();
    if (none) {
        if (n == 0) return CM_OK;
        CMI_LAUNCH(k_mse_none, cmi_cuda_grid(n, 256), 256, 0, s, p, t, n, out);
        return cmi_cuda_launched("mse_loss");
    }
    /* n = 0 still writes out[0]: 0, or NaN for a mean (0 / 0, as torch) */
    const unsigned g = n ? cmi_cuda_grid(n, 256) : 1;
    double *part = (double *)cmi_cuda_scratch(sizeof(double) * g);
    if (!part) return cm_last_status();
    CMI_LAUNCH(k_mse_part, g, 256, 0, s, p, t, n, part);
    cm_status st = cmi_cuda_launched("mse_loss partial sums");
    if (st) return st;
    CMI_LAUNCH(k_mse_finish, 1, 256, 0, s, part, (int)g, denom, out);
    return cmi_cuda_launched("mse_loss sum");
}

__global__ void k_mse_bwd(const float *p, const float *t, const float *g, int64_t n, bool none, double denom, float *gp,
                          float *gt) {
    const float k = none ? 0.0f : (float)(2.0 * (double)g[0] / denom);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float d = (none ? 2.0f * g[i] : k) * (p[i] - t[i]);
        if (gp) gp[i] += d;
        if (gt) gt[i] -= d;
    }
}

extern "C" cm_status cmi_cuda_mse_bwd(const float *p, const float *t, const float *g, int64_t n, bool none,
                                      double denom, float *gp, float *gt) {
    if (n == 0 || (!gp && !gt)) return CM_OK;
    CMI_LAUNCH(k_mse_bwd, cmi_cuda_grid(n, 256), 256, 0, cmi_cuda_stream(), p, t, g, n, none, denom, gp, gt);
    return cmi_cuda_launched("mse_loss backward");
}
