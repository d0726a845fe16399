/* Pooling on the GPU (backend.h slots pool, pool_bwd), pool.c's windows and divisors: one thread
 * per output in the forward; the backward gathers (one thread per element of x sums the outputs
 * whose windows hold it: for max pooling, those whose saved argmax is this element), so no atomics
 * and the same result every run. */
#include "tensor/cuda/common.cuh"

#include <math.h>

__device__ __forceinline__ void avg_window(int64_t i, int64_t s, int64_t p, int64_t k, int64_t in, int64_t *a,
                                           int64_t *b, int64_t *padded) {
    const int64_t st = i * s - p, en = st + k < in + p ? st + k : in + p;
    *padded = en - st;
    *a = st < 0 ? 0 : st;
    *b = en < in ? en : in;
}
__device__ __forceinline__ int64_t ad_start(int64_t i, int64_t in, int64_t out) { return (i * in) / out; }
__device__ __forceinline__ int64_t ad_end(int64_t i, int64_t in, int64_t out) { return ((i + 1) * in + out - 1) / out; }

__global__ void k_pool(cmi_pool_desc d, const float *x, float *y, int32_t *arg) {
    const int64_t total = d.N * d.C * d.OH * d.OW;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t j = e % d.OW, i = (e / d.OW) % d.OH, ch = (e / (d.OW * d.OH)) % d.C, n = e / (d.OW * d.OH * d.C);
        const float *xp = x + n * d.xs[0] + ch * d.xs[1];
        float out;
        if (d.kind == CMI_POOL_MAX) {
            const int64_t h0 = i * d.sh - d.ph, h1 = h0 + d.kh < d.H ? h0 + d.kh : d.H, hs = h0 < 0 ? 0 : h0;
            const int64_t w0 = j * d.sw - d.pw, w1 = w0 + d.kw < d.W ? w0 + d.kw : d.W, ws = w0 < 0 ? 0 : w0;
            float best = -INFINITY;
            int64_t bi = hs * d.W + ws;
            for (int64_t h = hs; h < h1; h++)
                for (int64_t w = ws; w < w1; w++) {
                    const float v = xp[h * d.xs[2] + w * d.xs[3]];
                    if (v > best || (isnan(v) && !isnan(best))) {
                        best = v;
                        bi = h * d.W + w;
                    }
                }
            out = best;
            if (arg) arg[e] = (int32_t)bi;
        } else {
            int64_t ha, hb, wa, wb, div;
            if (d.kind == CMI_POOL_AVG) {
                int64_t hp, wp;
                avg_window(i, d.sh, d.ph, d.kh, d.H, &ha, &hb, &hp);
                avg_window(j, d.sw, d.pw, d.kw, d.W, &wa, &wb, &wp);
                div = d.include_pad ? hp * wp : (hb - ha) * (wb - wa);
            } else {
                ha = ad_start(i, d.H, d.OH), hb = ad_end(i, d.H, d.OH);
                wa = ad_start(j, d.W, d.OW), wb = ad_end(j, d.W, d.OW);
                div = (hb - ha) * (wb - wa);
            }
            float s = 0.0f;
            for (int64_t h = ha; h < hb; h++)
                for (int64_t w = wa; w < wb; w++) s += xp[h * d.xs[2] + w * d.xs[3]];
            out = s / (float)div;
        }
        y[n * d.ys[0] + ch * d.ys[1] + i * d.ys[2] + j * d.ys[3]] = out;
    }
}

extern "C" cm_status cmi_cuda_pool(const cmi_pool_desc *d, const float *x, float *y, int32_t *arg) {
    const int64_t total = d->N * d->C * d->OH * d->OW;
    if (total == 0) return CM_OK;
    CMI_LAUNCH(k_pool, cmi_cuda_grid(total, 256), 256, 0, cmi_cuda_stream(), *d, x, y, arg);
    return cmi_cuda_launched("pool2d");
}

/* The outputs along one axis whose windows may hold position h: [*lo, *hi). */
__device__ __forceinline__ void out_range(int64_t h, int64_t s, int64_t p, int64_t k, int64_t out, int64_t *lo,
                                          int64_t *hi) {
    const int64_t a = h + p - k + 1; /* windows start at i·s - p <= h and end after h */
    int64_t l = a <= 0 ? 0 : (a + s - 1) / s, u = (h + p) / s + 1;
    if (u > out) u = out;
    *lo = l;
    *hi = u > l ? u : l;
}

__global__ void k_pool_bwd(cmi_pool_desc d, const float *gy, const int32_t *arg, float *gx) {
    const int64_t total = d.N * d.C * d.H * d.W;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t w = e % d.W, h = (e / d.W) % d.H, ch = (e / (d.W * d.H)) % d.C, n = e / (d.W * d.H * d.C);
        const float *gp = gy + n * d.ys[0] + ch * d.ys[1];
        float s = 0.0f;
        if (d.kind == CMI_POOL_ADAPTIVE) {
            int64_t i0 = (h - 1) * d.OH / d.H - 1, j0 = (w - 1) * d.OW / d.W - 1;
            for (int64_t i = i0 < 0 ? 0 : i0; i < d.OH && ad_start(i, d.H, d.OH) <= h; i++) {
                const int64_t ha = ad_start(i, d.H, d.OH), hb = ad_end(i, d.H, d.OH);
                if (hb <= h) continue;
                for (int64_t j = j0 < 0 ? 0 : j0; j < d.OW && ad_start(j, d.W, d.OW) <= w; j++) {
                    const int64_t wa = ad_start(j, d.W, d.OW), wb = ad_end(j, d.W, d.OW);
                    if (wb <= w) continue;
                    s += gp[i * d.ys[2] + j * d.ys[3]] / (float)((hb - ha) * (wb - wa));
                }
            }
        } else {
            int64_t il, ih, jl, jh;
            out_range(h, d.sh, d.ph, d.kh, d.OH, &il, &ih);
            out_range(w, d.sw, d.pw, d.kw, d.OW, &jl, &jh);
            const int32_t *ap = arg ? arg + (n * d.C + ch) * d.OH * d.OW : nullptr;
            for (int64_t i = il; i < ih; i++)
                for (int64_t j = jl; j < jh; j++) {
                    if (d.kind == CMI_POOL_MAX) {
                        if (ap[i * d.OW + j] == h * d.W + w) s += gp[i * d.ys[2] + j * d.ys[3]];
                    } else {
                        int64_t ha, hb, hp, wa, wb, wp;
                        avg_window(i, d.sh, d.ph, d.kh, d.H, &ha, &hb, &hp);
                        avg_window(j, d.sw, d.pw, d.kw, d.W, &wa, &wb, &wp);
                        if (h < ha || h >= hb || w < wa || w >= wb) continue;
                        const int64_t div = d.include_pad ? hp * wp : (hb - ha) * (wb - wa);
                        s += gp[i * d.ys[2] + j * d.ys[3]] / (float)div;
                    }
                }
        }
        gx[n * d.gxs[0] + ch * d.gxs[1] + h * d.gxs[2] + w * d.gxs[3]] += s;
    }
}

extern "C" cm_status cmi_cuda_pool_bwd(const cmi_pool_desc *d, const float *gy, const int32_t *arg, float *gx) {
    const int64_t total = d->N * d->C * d->H * d->W;
    if (total == 0) return CM_OK;
    CMI_LAUNCH(k_pool_bwd, cmi_cuda_grid(total, 256), 256, 0, cmi_cuda_stream(), *d, gy, arg, gx);
    return cmi_cuda_launched("pool2d backward");
}

/* ---- bilinear resize (backend.h slots resize, resize_bwd; pool.c's taps, computed on the host
 * as PyTorch's CPU kernel computes them and uploaded, so both devices use the same weights) ---- */

__global__ void k_resize(cmi_resize_desc d, const float *x, float *y) {
    const cmi_pool_desc &g = d.g;
    const int64_t total = g.N * g.C * g.OH * g.OW;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t j = e % g.OW, i = (e / g.OW) % g.OH, c = (e / (g.OW * g.OH)) % g.C, n = e / (g.OW * g.OH * g.C);
        const cmi_lin_tap a = d.th[i], b = d.tw[j];
        const float *xp = x + n * g.xs[0] + c * g.xs[1];
        const float *r0 = xp + a.i0 * g.xs[2], *r1 = xp + a.i1 * g.xs[2];
        y[n * g.ys[0] + c * g.ys[1] + i * g.ys[2] + j * g.ys[3]] =
            a.l0 * (b.l0 * r0[b.i0 * g.xs[3]] + b.l1 * r0[b.i1 * g.xs[3]]) +
            a.l1 * (b.l0 * r1[b.i0 * g.xs[3]] + b.l1 * r1[b.i1 * g.xs[3]]);
    }
}

extern "C" cm_status cmi_cuda_resize(const cmi_resize_desc *d, const float *x, float *y) {
    const int64_t total = d->g.N * d->g.C * d->g.OH * d->g.OW;
    if (total == 0) return CM_OK;
    CMI_LAUNCH(k_resize, cmi_cuda_grid(total, 256), 256, 0, cmi_cuda_stream(), *d, x, y);
    return cmi_cuda_launched("resize_bilinear");
}

/* The weight with which output coordinate o's taps read input coordinate v. */
__device__ __forceinline__ float tap_weight(const cmi_lin_tap &t, int64_t v) {
    return (t.i0 == v ? t.l0 : 0.0f) + (t.i1 == v ? t.l1 : 0.0f);
}

/* gx[n, c, h, w] += Σ over the output rows i reading h and columns j reading w of
 * wh(i, h)·ww(j, w)·gy[n, c, i, j]: a gather per input pixel, so no two threads write one element. */
__global__ void k_resize_bwd(cmi_resize_desc d, const float *gy, float *gx) {
    const cmi_pool_desc &g = d.g;
    const int64_t total = g.N * g.C * g.H * g.W;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t w = e % g.W, h = (e / g.W) % g.H, c = (e / (g.W * g.H)) % g.C, n = e / (g.W * g.H * g.C);
        const float *gp = gy + n * g.ys[0] + c * g.ys[1];
        float s = 0.0f;
        for (int64_t i = d.rh[2 * h]; i < d.rh[2 * h + 1]; i++) {
            const float wh = tap_weight(d.th[i], h);
            float row = 0.0f;
            for (int64_t j = d.rw[2 * w]; j < d.rw[2 * w + 1]; j++)
                row += tap_weight(d.tw[j], w) * gp[i * g.ys[2] + j * g.ys[3]];
            s += wh * row;
        }
        gx[n * g.gxs[0] + c * g.gxs[1] + h * g.gxs[2] + w * g.gxs[3]] += s;
    }
}

extern "C" cm_status cmi_cuda_resize_bwd(const cmi_resize_desc *d, const float *gy, float *gx) {
    const int64_t total = d->g.N * d->g.C * d->g.H * d->g.W;
    if (total == 0 || d->g.OH * d->g.OW == 0) return CM_OK;
    CMI_LAUNCH(k_resize_bwd, cmi_cuda_grid(total, 256), 256, 0, cmi_cuda_stream(), *d, gy, gx);
    return cmi_cuda_launched("resize_bilinear backward");
}
