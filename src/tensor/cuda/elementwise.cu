/* CUDA kernels for copies, fills and elementwise math (backend.h slots fill, copy, arange, binary,
 * binary_bwd, unary, unary_bwd, add_scaled, accum, var_bwd, f64_to_f32). Each kernel walks a
 * collapsed iteration space (cmi_iter) with a grid-stride loop; operands that are contiguous over
 * the space skip the index arithmetic. */
#include "tensor/cuda/common.cuh"

#define BLOCK 256

/* ---- fill / copy / arange ---- */

__global__ void k_fill(void *dst, int dt, cmi_iter it, double v) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < it.n; i += (int64_t)gridDim.x * blockDim.x)
        cmi_dstore(dt, dst, cmi_iter_off(it, 0, i), v);
}

extern "C" cm_status cmi_cuda_fill(void *dst, cm_dtype dt, int nd, const int64_t *shape, const int64_t *stride,
                                   double v) {
    const int64_t *st[1] = {stride};
    const cmi_iter it = cmi_iter_make(nd, shape, 1, st);
    if (it.n == 0) return CM_OK;
    CMI_LAUNCH(k_fill, cmi_cuda_grid(it.n, BLOCK), BLOCK, 0, cmi_cuda_stream(), dst, (int)dt, it, v);
    return cmi_cuda_launched("fill");
}

/* Same dtype: element bits copied (exact for every dtype). */
template <class T> __global__ void k_copy_same(T *dst, const T *src, cmi_iter it) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < it.n; i += (int64_t)gridDim.x * blockDim.x)
        dst[cmi_iter_off(it, 0, i)] = src[cmi_iter_off(it, 1, i)];
}

/* Floating to floating: through float (what the double path gives for these, faster). */
__device__ __forceinline__ float load_float(int dt, const void *p, int64_t i) {
    return dt == CM_DTYPE_F32    ? ((const float *)p)[i]
           : dt == CM_DTYPE_BF16 ? cmi_dbf16_to_f32(((const uint16_t *)p)[i])
                                 : cmi_df16_to_f32(((const uint16_t *)p)[i]);
}
__device__ __forceinline__ void store_float(int dt, void *p, int64_t i, float v) {
    if (dt == CM_DTYPE_F32) ((float *)p)[i] = v;
    else if (dt == CM_DTYPE_BF16) ((uint16_t *)p)[i] = cmi_df32_to_bf16(v);
    else ((uint16_t *)p)[i] = cmi_df32_to_f16(v);
}
__global__ void k_copy_float(void *dst, int ddt, const void *src, int sdt, cmi_iter it) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < it.n; i += (int64_t)gridDim.x * blockDim.x)
        store_float(ddt, dst, cmi_iter_off(it, 0, i), load_float(sdt, src, cmi_iter_off(it, 1, i)));
}
__global__ void k_copy_any(void *dst, int ddt, const void *src, int sdt, cmi_iter it) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < it.n; i += (int64_t)gridDim.x * blockDim.x)
        cmi_dstore(ddt, dst, cmi_iter_off(it, 0, i), cmi_dload(sdt, src, cmi_iter_off(it, 1, i)));
}

/* Rows of a 2-D copy whose rows are contiguous in both (a padded operand, a slice of columns): a
 * block row per matrix row, no index arithmetic per element. */
template <class T>
__global__ void k_copy_rows(T *dst, int64_t dld, const T *src, int64_t sld, int64_t rows, int64_t cols) {
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
        for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < cols; c += (int64_t)gridDim.x * blockDim.x)
            dst[r * dld + c] = src[r * sld + c];
}

/* Contiguous f32 -> bf16 and bf16 -> f32 (autocast's casts of activations, weights and gradients),
 * four elements a thread: 16-byte f32 and 8-byte bf16 accesses. The same rounding as k_copy_float. */
__global__ void k_f32_to_bf16_x4(uint2 *dst, const float4 *src, int64_t n4) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        const float4 v = src[i];
        uint2 o;
        o.x = (uint32_t)cmi_df32_to_bf16(v.x) | ((uint32_t)cmi_df32_to_bf16(v.y) << 16);
        o.y = (uint32_t)cmi_df32_to_bf16(v.z) | ((uint32_t)cmi_df32_to_bf16(v.w) << 16);
        dst[i] = o;
    }
}
__global__ void k_bf16_to_f32_x4(float4 *dst, const uint2 *src, int64_t n4) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        const uint2 v = src[i];
        dst[i] = make_float4(cmi_dbf16_to_f32((uint16_t)(v.x & 0xFFFFu)), cmi_dbf16_to_f32((uint16_t)(v.x >> 16)),
                             cmi_dbf16_to_f32((uint16_t)(v.y & 0xFFFFu)), cmi_dbf16_to_f32((uint16_t)(v.y >> 16)));
    }
}

static bool is_float(cm_dtype d) { return d == CM_DTYPE_F32 || d == CM_DTYPE_BF16 || d == CM_DTYPE_F16; }

/* The fast paths of cmi_cuda_copy; false: none applies. */
static bool copy_fast(void *dst, cm_dtype ddt, const void *src, cm_dtype sdt, const cmi_iter &it, cm_status *st) {
    cudaStream_t s = cmi_cuda_stream();
    const size_t es = cm_dtype_size(ddt);
    if (it.contig[0] && it.contig[1]) {
        if (ddt == sdt) {
            cudaError_t e = cudaMemcpyAsync(dst, src, (size_t)it.n * es, cudaMemcpyDeviceToDevice, s);
            *st = e == cudaSuccess ? CM_OK : cmi_cuda_fail(e, "cudaMemcpyAsync (copy)");
            return true;
        }
        const bool down = ddt == CM_DTYPE_BF16 && sdt == CM_DTYPE_F32, up = ddt == CM_DTYPE_F32 && sdt == CM_DTYPE_BF16;
        const uintptr_t fa = (uintptr_t)(down ? src : dst), ba = (uintptr_t)(down ? dst : src);
        if ((down || up) && it.n % 4 == 0 && fa % 16 == 0 && ba % 8 == 0) {
            const int64_t n4 = it.n / 4;
            if (down) CMI_LAUNCH(k_f32_to_bf16_x4, cmi_cuda_grid(n4, BLOCK), BLOCK, 0, s, (uint2 *)dst, (const float4 *)src, n4);
            else CMI_LAUNCH(k_bf16_to_f32_x4, cmi_cuda_grid(n4, BLOCK), BLOCK, 0, s, (float4 *)dst, (const uint2 *)src, n4);
            *st = cmi_cuda_launched("copy");
            return true;
        }
        return false;
    }
    if (ddt == sdt && it.nd == 2 && it.stride[0][1] == 1 && it.stride[1][1] == 1 && (es == 2 || es == 4)) {
        const int64_t rows = it.shape[0], cols = it.shape[1];
        const unsigned gx = (unsigned)((cols + BLOCK - 1) / BLOCK < 64 ? (cols + BLOCK - 1) / BLOCK : 64);
        const dim3 g(gx, (unsigned)(rows < 65535 ? rows : 65535));
        if (es == 2)
            CMI_LAUNCH(k_copy_rows<uint16_t>, g, BLOCK, 0, s, (uint16_t *)dst, it.stride[0][0], (const uint16_t *)src,
                       it.stride[1][0], rows, cols);
        else
            CMI_LAUNCH(k_copy_rows<uint32_t>, g, BLOCK, 0, s, (uint32_t *)dst, it.stride[0][0], (const uint32_t *)src,
                       it.stride[1][0], rows, cols);
        *st = cmi_cuda_launched("copy");
        return true;
    }
    return false;
}

extern "C" cm_status cmi_cuda_copy(void *dst, cm_dtype ddt, const int64_t *dstride, const void *src, cm_dtype sdt,
                                   const int64_t *sstride, int nd, const int64_t *shape) {
    const int64_t *st[2] = {dstride, sstride};
    const cmi_iter it = cmi_iter_make(nd, shape, 2, st);
    if (it.n == 0) return CM_OK;
    cm_status fst;
    if (copy_fast(dst, ddt, src, sdt, it, &fst)) return fst;
    const unsigned g = cmi_cuda_grid(it.n, BLOCK);
    cudaStream_t s = cmi_cuda_stream();
    if (ddt == sdt) {
        switch (cm_dtype_size(ddt)) {
        case 1: CMI_LAUNCH(k_copy_same<uint8_t>, g, BLOCK, 0, s, (uint8_t *)dst, (const uint8_t *)src, it); break;
        case 2: CMI_LAUNCH(k_copy_same<uint16_t>, g, BLOCK, 0, s, (uint16_t *)dst, (const uint16_t *)src, it); break;
        case 4: CMI_LAUNCH(k_copy_same<uint32_t>, g, BLOCK, 0, s, (uint32_t *)dst, (const uint32_t *)src, it); break;
        default: CMI_LAUNCH(k_copy_same<uint64_t>, g, BLOCK, 0, s, (uint64_t *)dst, (const uint64_t *)src, it); break;
        }
    } else if (is_float(ddt) && is_float(sdt)) {
        CMI_LAUNCH(k_copy_float, g, BLOCK, 0, s, dst, (int)ddt, src, (int)sdt, it);
    } else {
        CMI_LAUNCH(k_copy_any, g, BLOCK, 0, s, dst, (int)ddt, src, (int)sdt, it);
    }
    return cmi_cuda_launched("copy");
}

__global__ void k_arange(void *dst, int dt, int64_t n, double start, double step) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        cmi_dstore(dt, dst, i, start + (double)i * step);
}

extern "C" cm_status cmi_cuda_arange(void *dst, cm_dtype dt, int64_t n, double start, double step) {
    if (n <= 0) return CM_OK;
    CMI_LAUNCH(k_arange, cmi_cuda_grid(n, BLOCK), BLOCK, 0, cmi_cuda_stream(), dst, (int)dt, n, start, step);
    return cmi_cuda_launched("arange");
}

/* ---- binary ---- */

__global__ void k_binary(int op, float *out, const float *a, const float *b, cmi_iter it) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < it.n; i += (int64_t)gridDim.x * blockDim.x) {
        const float x = a[cmi_iter_off(it, 1, i)], y = b[cmi_iter_off(it, 2, i)];
        out[i] = op == CMI_BIN_ADD ? x + y : op == CMI_BIN_SUB ? x - y : op == CMI_BIN_MUL ? x * y : x / y;
    }
}

extern "C" cm_status cmi_cuda_binary(cmi_bin_op op, float *out, const float *a, const int64_t *sa, const float *b,
                                     const int64_t *sb, int nd, const int64_t *shape) {
    const int64_t *st[3] = {NULL, sa, sb};
    const cmi_iter it = cmi_iter_make(nd, shape, 3, st);
    if (it.n == 0) return CM_OK;
    CMI_LAUNCH(k_binary, cmi_cuda_grid(it.n, BLOCK), BLOCK, 0, cmi_cuda_stream(), (int)op, out, a, b, it);
    return cmi_cuda_launched("binary");
}

__global__ void k_binary_bwd(int mode, float *t, const float *g, const float *x, const float *o, cmi_iter it) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < it.n; i += (int64_t)gridDim.x * blockDim.x) {
        switch (mode) {
        case CMI_BWD_MUL: t[i] = g[i] * x[cmi_iter_off(it, 2, i)]; break;
        case CMI_BWD_DIV: t[i] = g[i] / x[cmi_iter_off(it, 2, i)]; break;
        case CMI_BWD_DIV_B: t[i] = -g[i] * o[i] / x[cmi_iter_off(it, 2, i)]; break;
        default: t[i] = -g[i]; break;
        }
    }
}

extern "C" cm_status cmi_cuda_binary_bwd(cmi_bin_bwd_mode mode, float *t, const float *g, const float *x,
                                         const int64_t *sx, const float *o, int nd, const int64_t *shape) {
    int64_t zero[CM_MAX_DIMS] = {0};
    const int64_t *st[3] = {NULL, NULL, x ? sx : zero};
    const cmi_iter it = cmi_iter_make(nd, shape, 3, st);
    if (it.n == 0) return CM_OK;
    CMI_LAUNCH(k_binary_bwd, cmi_cuda_grid(it.n, BLOCK), BLOCK, 0, cmi_cuda_stream(), (int)mode, t, g, x ? x : g,
               o ? o : g, it);
    return cmi_cuda_launched("binary_bwd");
}

/* ---- unary (the same formulas as elementwise.c) ---- */

#define GELU_K 0.7978845608028654f
#define GELU_C 0.044715f

__device__ __forceinline__ float d_gelu_tanh(float x) {
    const float u = GELU_K * (x + GELU_C * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}
__device__ __forceinline__ float d_gelu_tanh_grad(float x) {
    const float u = GELU_K * (x + GELU_C * x * x * x), t = tanhf(u);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_C * x * x);
}
__device__ __forceinline__ float d_gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f)); }
__device__ __forceinline__ float d_gelu_erf_grad(float x) {
    return 0.5f * (1.0f + erff(x * 0.7071067811865476f)) + x * 0.3989422804014327f * expf(-0.5f * x * x);
}
__device__ __forceinline__ float d_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float un_f(int op, float x, float p0, float p1) {
    switch (op) {
    case CMI_UN_NEG: return -x;
    case CMI_UN_EXP: return expf(x);
    case CMI_UN_LOG: return logf(x);
    case CMI_UN_SQRT: return sqrtf(x);
    case CMI_UN_ABS: return fabsf(x);
    case CMI_UN_RELU: return x > 0.0f ? x : 0.0f;
    case CMI_UN_GELU_TANH: return d_gelu_tanh(x);
    case CMI_UN_GELU_ERF: return d_gelu_erf(x);
    case CMI_UN_SILU: return x * d_sigmoid(x);
    case CMI_UN_TANH: return tanhf(x);
    case CMI_UN_SIGMOID: return d_sigmoid(x);
    case CMI_UN_ADD_S: return x + p0;
    case CMI_UN_MUL_S: return x * p0;
    case CMI_UN_POW: return p0 == 2.0f ? x * x : powf(x, p0);
    case CMI_UN_CLAMP: return fminf(fmaxf(x, p0), p1);
    default: return x;
    }
}

/* g·f'(a) given a and the forward output o */
__device__ __forceinline__ float un_df(int op, float g, float a, float o, float p0, float p1) {
    switch (op) {
    case CMI_UN_NEG: return -g;
    case CMI_UN_EXP: return g * o;
    case CMI_UN_LOG: return g / a;
    case CMI_UN_SQRT: return g * 0.5f / o;
    case CMI_UN_ABS: return a > 0.0f ? g : (a < 0.0f ? -g : 0.0f);
    case CMI_UN_RELU: return a > 0.0f ? g : 0.0f;
    case CMI_UN_GELU_TANH: return g * d_gelu_tanh_grad(a);
    case CMI_UN_GELU_ERF: return g * d_gelu_erf_grad(a);
    case CMI_UN_SILU: {
        const float sg = d_sigmoid(a);
        return g * sg * (1.0f + a * (1.0f - sg));
    }
    case CMI_UN_TANH: return g * (1.0f - o * o);
    case CMI_UN_SIGMOID: return g * o * (1.0f - o);
    case CMI_UN_ADD_S: return g;
    case CMI_UN_MUL_S: return g * p0;
    case CMI_UN_POW: return p0 == 2.0f ? g * 2.0f * a : g * p0 * powf(a, p0 - 1.0f);
    case CMI_UN_CLAMP: return (a >= p0 && a <= p1) ? g : 0.0f;
    default: return 0.0f;
    }
}

__global__ void k_unary(int op, float p0, float p1, float *out, const float *a, cmi_iter it) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < it.n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = un_f(op, a[cmi_iter_off(it, 1, i)], p0, p1);
}

extern "C" cm_status cmi_cuda_unary(cmi_un_op op, float p0, float p1, float *out, const float *a,
                                    const int64_t *sa, int nd, const int64_t *shape) {
    const int64_t *st[2] = {NULL, sa};
    const cmi_iter it = cmi_iter_make(nd, shape, 2, st);
    if (it.n == 0) return CM_OK;
    CMI_LAUNCH(k_unary, cmi_cuda_grid(it.n, BLOCK), BLOCK, 0, cmi_cuda_stream(), (int)op, p0, p1, out, a, it);
    return cmi_cuda_launched("unary");
}

__global__ void k_unary_bwd(int op, float p0, float p1, float *ga, const float *g, const float *a, const float *o,
                            cmi_iter it) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < it.n; i += (int64_t)gridDim.x * blockDim.x)
        ga[i] += un_df(op, g[i], a[cmi_iter_off(it, 2, i)], o[i], p0, p1);
}

extern "C" cm_status cmi_cuda_unary_bwd(cmi_un_op op, float p0, float p1, float *ga, const float *g, const float *a,
                                        const int64_t *sa, const float *out, int nd, const int64_t *shape) {
    const int64_t *st[3] = {NULL, NULL, sa};
    const cmi_iter it = cmi_iter_make(nd, shape, 3, st);
    if (it.n == 0) return CM_OK;
    CMI_LAUNCH(k_unary_bwd, cmi_cuda_grid(it.n, BLOCK), BLOCK, 0, cmi_cuda_stream(), (int)op, p0, p1, ga, g, a, out,
               it);
    return cmi_cuda_launched("unary_bwd");
}

/* ---- accumulation ---- */

__global__ void k_add_scaled(float *dst, const float *src, float scale, cmi_iter it) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < it.n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] += scale * src[cmi_iter_off(it, 1, i)];
}

extern "C" cm_status cmi_cuda_add_scaled(float *dst, const float *src, const int64_t *sstride, float scale, int nd,
                                         const int64_t *shape) {
    const int64_t *st[2] = {NULL, sstride};
    const cmi_iter it = cmi_iter_make(nd, shape, 2, st);
    if (it.n == 0) return CM_OK;
    CMI_LAUNCH(k_add_scaled, cmi_cuda_grid(it.n, BLOCK), BLOCK, 0, cmi_cuda_stream(), dst, src, scale, it);
    return cmi_cuda_launched("add_scaled");
}

extern "C" cm_status cmi_cuda_accum(float *dst, const int64_t *dstride, const float *src, int nd,
                                    const int64_t *shape) {
    /* A reduction of src over the dims where dst has stride 0, added into dst: plan it as a
     * reduction whose kept dims are dst's (reduce.cu does the summing in a fixed order). */
    bool any_reduced = false;
    for (int d = 0; d < nd; d++)
        if (dstride[d] == 0 && shape[d] > 1) any_reduced = true;
    if (!any_reduced) {
        /* plain elementwise add; dst strided, src contiguous: swap roles through a transposed
         * iteration (dst written through its strides) */
        int64_t cs[CM_MAX_DIMS], acc = 1;
        for (int d = nd - 1; d >= 0; d--) {
            cs[d] = acc;
            acc *= shape[d] > 0 ? shape[d] : 1;
        }
        bool dst_contig = true;
        for (int d = 0; d < nd; d++)
            if (shape[d] != 1 && dstride[d] != cs[d]) dst_contig = false;
        if (dst_contig) return cmi_cuda_add_scaled(dst, src, NULL, 1.0f, nd, shape);
        /* a strided dst (the gradients of q, k and v into their fused projection's): elementwise
         * through dst's strides, not a reduction of one element per output */
        return cmi_cuda_copy_add(dst, dstride, src, NULL, nd, shape);
    }
    cmi_red_plan P;
    memset(&P, 0, sizeof P);
    int64_t cs[CM_MAX_DIMS], acc = 1;
    for (int d = nd - 1; d >= 0; d--) {
        cs[d] = acc;
        acc *= shape[d] > 0 ? shape[d] : 1;
    }
    P.n_out = P.n_red = 1;
    for (int d = 0; d < nd; d++) {
        const bool red = dstride[d] == 0;
        if (red) P.n_red *= shape[d];
        else P.n_out *= shape[d];
        if (shape[d] == 1) continue;
        int *cnt = red ? &P.nr : &P.nk;
        int64_t *sh = red ? P.rshape : P.kshape, *st = red ? P.rstride : P.kstride,
                *ds = red ? P.rcstride : P.kcstride;
        sh[*cnt] = shape[d];
        st[*cnt] = cs[d];                /* src is contiguous */
        ds[*cnt] = red ? 0 : dstride[d]; /* where the output goes (kept dims only) */
        (*cnt)++;
    }
    if (P.nr == 0) {
        P.rshape[0] = 1;
        P.nr = 1;
    }
    /* every reduced dim before every kept one (a bias's gradient: dy (rows, C) summed over rows):
     * src is then (n_red, n_out) row-major, summed down its columns */
    bool rows_then_cols = true, seen_kept = false;
    for (int d = 0; d < nd; d++) {
        if (shape[d] == 1) continue;
        if (dstride[d] != 0) seen_kept = true;
        else if (seen_kept) rows_then_cols = false;
    }
    if (rows_then_cols && P.n_red >= 64 && P.n_out > 1) return cmi_cuda_colsum_add(&P, src, dst);
    return cmi_cuda_reduce_add(&P, src, dst);
}

__global__ void k_add_strided(float *dst, const float *src, cmi_iter it) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < it.n; i += (int64_t)gridDim.x * blockDim.x)
        dst[cmi_iter_off(it, 0, i)] += src[cmi_iter_off(it, 1, i)];
}

cm_status cmi_cuda_copy_add(float *dst, const int64_t *dstride, const float *src, const int64_t *sstride, int nd,
                            const int64_t *shape) {
    const int64_t *st[2] = {dstride, sstride};
    const cmi_iter it = cmi_iter_make(nd, shape, 2, st);
    if (it.n == 0) return CM_OK;
    CMI_LAUNCH(k_add_strided, cmi_cuda_grid(it.n, BLOCK), BLOCK, 0, cmi_cuda_stream(), dst, src, it);
    return cmi_cuda_launched("add_strided");
}

__global__ void k_var_bwd(float *ga, const float *g, const float *x, const float *m, float scale, cmi_iter it) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < it.n; i += (int64_t)gridDim.x * blockDim.x)
        ga[i] += scale * g[cmi_iter_off(it, 1, i)] * (x[cmi_iter_off(it, 2, i)] - m[cmi_iter_off(it, 3, i)]);
}

extern "C" cm_status cmi_cuda_var_bwd(float *ga, const float *g, const int64_t *sg, const float *x,
                                      const int64_t *sx, const float *m, const int64_t *sm, float scale, int nd,
                                      const int64_t *shape) {
    const int64_t *st[4] = {NULL, sg, sx, sm};
    const cmi_iter it = cmi_iter_make(nd, shape, 4, st);
    if (it.n == 0) return CM_OK;
    CMI_LAUNCH(k_var_bwd, cmi_cuda_grid(it.n, BLOCK), BLOCK, 0, cmi_cuda_stream(), ga, g, x, m, scale, it);
    return cmi_cuda_launched("var_bwd");
}

__global__ void k_f64_to_f32(float *out, const double *in, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = (float)in[i];
}

extern "C" cm_status cmi_cuda_f64_to_f32(float *out, const double *in, int64_t n) {
    if (n <= 0) return CM_OK;
    CMI_LAUNCH(k_f64_to_f32, cmi_cuda_grid(n, BLOCK), BLOCK, 0, cmi_cuda_stream(), out, in, n);
    return cmi_cuda_launched("f64_to_f32");
}
