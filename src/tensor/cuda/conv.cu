/* Convolutions on the GPU (backend.h slots conv, conv_bwd), as im2col + cuBLASLt GEMMs, per group
 * and per chunk of images (the columns of a chunk stay under 256 MiB):
 *
 *   cols (n·P, K) = im2col(x), K = Cin/groups · kh · kw in the weight's own order (c, ki, kj)
 *   y' (n·P, Cout/g) = cols · W_gᵀ [+ bias]         (y' is y itself for channels-last f32 output)
 *   dW_g += dy'ᵀ · cols,   dcols = dy' · W_g,   dx (+)= col2im(dcols)
 *
 * with P = OH·OW and y' the output as (image, position, channel) rows: channels-last as it is,
 * NCHW through one permuting copy each way. A bf16 convolution (explicit bf16, or autocast) writes
 * bf16 columns (f32 x rounded on the way, as the CPU's oneDNN reorder does), a bf16 copy of an
 * f32 weight and of dy, and runs bf16 GEMMs with f32 accumulation; dx, dW and db are f32 (db sums
 * the bf16-rounded dy, as the CPU's widened path does). col2im gathers (each element of dx sums
 * the columns that read it): no atomics, the same result every run. */
#include "tensor/cuda/common.cuh"

__device__ __forceinline__ int64_t x_off(const cmi_conv_geom &g, int64_t n, int64_t c, int64_t h, int64_t w) {
    return g.cl ? ((n * g.H + h) * g.W + w) * g.Cin + c : ((n * g.Cin + c) * g.H + h) * g.W + w;
}

/* cols[(n·P + p)·K + (c·kh + ki)·kw + kj] = x[n, group·Cg + c, oh·sh - ph + ki·dh, ow·sw - pw + kj·dw]
 * (0 in the padding). T: float (f32 x) or uint16_t (bf16: x bf16, or f32 rounded). */
template <class T>
__global__ void k_im2col(T *cols, const void *x, bool xbf, cmi_conv_geom g, int64_t group) {
    const int64_t Cg = g.Cin / g.groups, K = Cg * g.kh * g.kw, P = g.OH * g.OW, total = g.N * P * K;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t k = e % K, np = e / K, p = np % P, n = np / P;
        const int64_t kj = k % g.kw, ki = (k / g.kw) % g.kh, c = k / (g.kw * g.kh);
        const int64_t oh = p / g.OW, ow = p % g.OW;
        const int64_t h = oh * g.sh - g.ph + ki * g.dh, w = ow * g.sw - g.pw + kj * g.dw;
        const bool in = h >= 0 && h < g.H && w >= 0 && w < g.W;
        const int64_t o = in ? x_off(g, n, group * Cg + c, h, w) : 0;
        if (sizeof(T) == 2) {
            uint16_t v = 0;
            if (in) v = xbf ? ((const uint16_t *)x)[o] : cmi_df32_to_bf16(((const float *)x)[o]);
            ((uint16_t *)cols)[e] = v;
        } else {
            ((float *)cols)[e] = in ? ((const float *)x)[o] : 0.0f;
        }
    }
}

/* dx[n, group·Cg + c, h, w] (+)= Σ dcols over the (oh, ow, ki, kj) that read (h, w). */
__global__ void k_col2im(float *dx, const float *dcols, cmi_conv_geom g, int64_t group, bool accumulate) {
    const int64_t Cg = g.Cin / g.groups, K = Cg * g.kh * g.kw, P = g.OH * g.OW, total = g.N * Cg * g.H * g.W;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t w = e % g.W, h = (e / g.W) % g.H, c = (e / (g.W * g.H)) % Cg, n = e / (g.W * g.H * Cg);
        float s = 0.0f;
        for (int64_t ki = 0; ki < g.kh; ki++) {
            const int64_t th = h + g.ph - ki * g.dh;
            if (th < 0 || th % g.sh) continue;
            const int64_t oh = th / g.sh;
            if (oh >= g.OH) continue;
            for (int64_t kj = 0; kj < g.kw; kj++) {
                const int64_t tw = w + g.pw - kj * g.dw;
                if (tw < 0 || tw % g.sw) continue;
                const int64_t ow = tw / g.sw;
                if (ow >= g.OW) continue;
                s += dcols[(n * P + oh * g.OW + ow) * K + (c * g.kh + ki) * g.kw + kj];
            }
        }
        const int64_t o = x_off(g, n, group * Cg + c, h, w);
        dx[o] = accumulate ? dx[o] + s : s;
    }
}

static cm_status im2col(void *cols, bool bf, const void *x, bool xbf, const cmi_conv_geom *g, int64_t group) {
    const int64_t total = g->N * g->OH * g->OW * (g->Cin / g->groups) * g->kh * g->kw;
    if (total == 0) return CM_OK;
    if (bf)
        CMI_LAUNCH(k_im2col<uint16_t>, cmi_cuda_grid(total, 256), 256, 0, cmi_cuda_stream(), (uint16_t *)cols, x, xbf,
                   *g, group);
    else
        CMI_LAUNCH(k_im2col<float>, cmi_cuda_grid(total, 256), 256, 0, cmi_cuda_stream(), (float *)cols, x, xbf, *g,
                   group);
    return cmi_cuda_launched("conv2d im2col");
}

static cm_status col2im(float *dx, const float *dcols, const cmi_conv_geom *g, int64_t group, bool accumulate) {
    const int64_t total = g->N * (g->Cin / g->groups) * g->H * g->W;
    if (total == 0) return CM_OK;
    CMI_LAUNCH(k_col2im, cmi_cuda_grid(total, 256), 256, 0, cmi_cuda_stream(), dx, dcols, *g, group, accumulate);
    return cmi_cuda_launched("conv2d col2im");
}

/* Device buffers of one call, freed together (the caching allocator; kernels queued on the stream
 * before a free still run before any later use of the memory). */
struct conv_bufs {
    void *p[6] = {};
    int n = 0;
    void *get(size_t bytes) {
        void *q = cmi_cuda_alloc(bytes ? bytes : 1);
        if (q) p[n++] = q;
        return q;
    }
    ~conv_bufs() {
        for (int i = 0; i < n; i++) cmi_cuda_free(p[i]);
    }
};

/* Images per chunk: the columns (and the f32 output or gradient rows beside them) under 256 MiB. */
static int64_t chunk_images(const cmi_conv_geom *g, int64_t K, size_t es) {
    const int64_t P = g->OH * g->OW;
    const int64_t per = P * (K * (int64_t)(es + 4) + g->Cout * 4) + 1;
    int64_t nb = ((int64_t)256 << 20) / per;
    if (nb < 1) nb = 1;
    return nb < g->N ? nb : g->N;
}

/* A bf16 copy of n f32 values (rounded) in b, or p itself when it is already bf16. */
static const void *as_bf16(conv_bufs &b, const void *p, cm_dtype st, int64_t n, cm_status *s) {
    if (st == CM_DTYPE_BF16) return p;
    void *q = b.get(2 * (size_t)n);
    if (!q) {
        *s = cm_last_status();
        return nullptr;
    }
    int64_t shape[1] = {n}, one[1] = {1};
    *s = cmi_cuda_copy(q, CM_DTYPE_BF16, one, p, CM_DTYPE_F32, one, 1, shape);
    return *s ? nullptr : q;
}

/* The (image, position, channel) rows y' of images [n0, n0 + m) <-> y in its layout: to_y copies
 * y' (f32) into y (ydt); otherwise y (ydt) into y' (rdt). */
static cm_status rows_copy(const cmi_conv_geom *g, int64_t n0, int64_t m, void *rows, cm_dtype rdt, void *y,
                           cm_dtype ydt, bool to_y) {
    const int64_t P = g->OH * g->OW, C = g->Cout;
    char *yb = (char *)y + (size_t)(n0 * P * C) * cm_dtype_size(ydt);
    if (g->cl) {
        int64_t shape[1] = {m * P * C}, one[1] = {1};
        return to_y ? cmi_cuda_copy(yb, ydt, one, rows, rdt, one, 1, shape)
                    : cmi_cuda_copy(rows, rdt, one, yb, ydt, one, 1, shape);
    }
    int64_t shape[3] = {m, C, P}, ys[3] = {C * P, P, 1}, rs[3] = {P * C, 1, C};
    return to_y ? cmi_cuda_copy(yb, ydt, ys, rows, rdt, rs, 3, shape) : cmi_cuda_copy(rows, rdt, rs, yb, ydt, ys, 3, shape);
}

extern "C" cm_status cmi_cuda_conv(const cmi_conv_geom *g, cm_dtype dt, cm_dtype xs, const void *x, cm_dtype ws,
                                   const void *w, const float *bias, cm_dtype ys, void *y) {
    const bool bf = dt == CM_DTYPE_BF16;
    const size_t es = bf ? 2 : 4, xes = cm_dtype_size(xs);
    const int64_t Cg = g->Cin / g->groups, Cog = g->Cout / g->groups, K = Cg * g->kh * g->kw, P = g->OH * g->OW;
    if (g->N == 0 || g->Cout == 0) return CM_OK;
    conv_bufs b;
    cm_status s = CM_OK;
    const void *wq = bf ? as_bf16(b, w, ws, g->Cout * K, &s) : w;
    if (s) return s;
    const bool direct = g->cl && ys == CM_DTYPE_F32; /* the GEMMs write y itself */
    const int64_t nb = chunk_images(g, K, es);
    void *cols = b.get((size_t)(nb * P * K) * es);
    float *rows = direct ? nullptr : (float *)b.get(sizeof(float) * (size_t)(nb * P * g->Cout));
    if (!cols || (!direct && !rows)) return cm_last_status();
    for (int64_t n0 = 0; n0 < g->N && !s; n0 += nb) {
        cmi_conv_geom c = *g;
        c.N = g->N - n0 < nb ? g->N - n0 : nb;
        const char *xc = (const char *)x + (size_t)(n0 * g->Cin * g->H * g->W) * xes;
        float *out = direct ? (float *)y + n0 * P * g->Cout : rows;
        for (int64_t grp = 0; grp < g->groups && !s; grp++) {
            s = im2col(cols, bf, xc, xs == CM_DTYPE_BF16, &c, grp);
            if (!s)
                s = cmi_cuda_gemm(dt, c.N * P, Cog, K, cols, K, false, (const char *)wq + (size_t)(grp * Cog * K) * es, K,
                                  true, bias ? bias + grp * Cog : nullptr, false, out + grp * Cog, g->Cout, 1, 0, 0, 0);
        }
        if (!s && !direct) s = rows_copy(g, n0, c.N, rows, CM_DTYPE_F32, y, ys, true);
    }
    return s;
}

extern "C" cm_status cmi_cuda_conv_bwd(const cmi_conv_geom *g, cm_dtype dt, cm_dtype xs, const void *x, cm_dtype ws,
                                       const void *w, cm_dtype dys, const void *dy, float *dx, bool dx_fresh, float *dW,
                                       float *db) {
    const bool bf = dt == CM_DTYPE_BF16;
    const size_t es = bf ? 2 : 4, xes = cm_dtype_size(xs);
    const int64_t Cg = g->Cin / g->groups, Cog = g->Cout / g->groups, K = Cg * g->kh * g->kw, P = g->OH * g->OW;
    if (g->N == 0 || g->Cout == 0 || (!dx && !dW && !db)) return CM_OK;
    conv_bufs b;
    cm_status s = CM_OK;
    const void *wq = dx && bf ? as_bf16(b, w, ws, g->Cout * K, &s) : w;
    if (s) return s;
    const int64_t nb = chunk_images(g, K, es);
    /* dy' in dt: dy itself for channels-last when already in dt, else a (permuting) copy per chunk */
    const bool dy_direct = g->cl && dys == dt;
    void *rows = dy_direct ? nullptr : b.get((size_t)(nb * P * g->Cout) * es);
    float *rows32 = db && bf ? (float *)b.get(sizeof(float) * (size_t)(nb * P * g->Cout)) : nullptr;
    void *cols = dW ? b.get((size_t)(nb * P * K) * es) : nullptr;
    float *dcols = dx ? (float *)b.get(sizeof(float) * (size_t)(nb * P * K)) : nullptr;
    if ((!dy_direct && !rows) || (db && bf && !rows32) || (dW && !cols) || (dx && !dcols)) return cm_last_status();
    for (int64_t n0 = 0; n0 < g->N && !s; n0 += nb) {
        cmi_conv_geom c = *g;
        c.N = g->N - n0 < nb ? g->N - n0 : nb;
        const int64_t R = c.N * P; /* rows of this chunk */
        const void *dyr = dy_direct ? (const char *)dy + (size_t)(n0 * P * g->Cout) * es : rows;
        if (!dy_direct) s = rows_copy(g, n0, c.N, rows, dt, (void *)dy, dys, false);
        if (!s && db) { /* db += Σ over rows of dy' (in f32: the bf16 values widened) */
            const float *r32 = (const float *)dyr;
            if (bf) {
                int64_t shape[1] = {R * g->Cout}, one[1] = {1};
                s = cmi_cuda_copy(rows32, CM_DTYPE_F32, one, dyr, CM_DTYPE_BF16, one, 1, shape);
                r32 = rows32;
            }
            int64_t shape[2] = {R, g->Cout}, dst[2] = {0, 1};
            if (!s) s = cmi_cuda_accum(db, dst, r32, 2, shape);
        }
        const char *xc = (const char *)x + (size_t)(n0 * g->Cin * g->H * g->W) * xes;
        float *dxc = dx ? dx + n0 * g->Cin * g->H * g->W : nullptr;
        for (int64_t grp = 0; grp < g->groups && !s; grp++) {
            const void *dyg = (const char *)dyr + (size_t)(grp * Cog) * es;
            if (dW) {
                s = im2col(cols, bf, xc, xs == CM_DTYPE_BF16, &c, grp);
                if (!s)
                    s = cmi_cuda_gemm(dt, Cog, K, R, dyg, g->Cout, true, cols, K, false, nullptr, true,
                                      dW + grp * Cog * K, K, 1, 0, 0, 0);
            }
            if (dx && !s) {
                s = cmi_cuda_gemm(dt, R, K, Cog, dyg, g->Cout, false, (const char *)wq + (size_t)(grp * Cog * K) * es, K,
                                  false, nullptr, false, dcols, K, 1, 0, 0, 0);
                if (!s) s = col2im(dxc, dcols, &c, grp, !dx_fresh);
            }
        }
    }
    return s;
}
