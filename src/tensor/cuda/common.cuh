/*
 * Shared by the CUDA backend's files: CUDA (or the emulator's) headers, launch and error helpers,
 * the strided-index helpers kernels use, and bit-exact bf16/f16 conversions (the same rounding as
 * the CPU code, so a cast gives identical bits on both devices).
 *
 * Kernels are launched with CMI_LAUNCH(kernel, grid, block, smem, stream, args...) — <<<...>>> on
 * a GPU, the emulator's scheduler otherwise — and checked with cmi_cuda_launched("kernel"). Launch
 * shapes come from cmi_cuda_grid(n, block): enough blocks for n elements, capped (grid-stride loops
 * cover the rest).
 */
#pragma once

#ifdef CMI_CUDA_EMU
#include "tensor/cuda/emu/cuda_emu.h"
#else
#include <cuda_runtime.h>
#define CMI_LAUNCH(kernel, grid, block, smem, stream, ...) kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#define CMI_DYN_SMEM(T, name)                                 \
    extern __shared__ __align__(16) unsigned char cmi_smem_[]; \
    T *name = (T *)cmi_smem_
#endif

/* Unrolls the loop that follows on the GPU (small fixed-trip loops over register arrays, which
 * would otherwise live in local memory); nothing in the emulator. */
#ifdef CMI_CUDA_EMU
#define CMI_UNROLL
#else
#define CMI_UNROLL _Pragma("unroll")
#endif

#include <stdint.h>
#include <string.h>

#include "tensor/backend.h"

/* ---- errors (runtime.cu) ---- */

/* Records "what: CUDA error name (string)" as CM_ERR_DEVICE (CM_ERR_OOM for out-of-memory) and
 * returns the status. */
cm_status cmi_cuda_fail(cudaError_t e, const char *what);
/* After a launch: CM_OK, or the launch error naming the kernel. */
cm_status cmi_cuda_launched(const char *kernel);
#define CMI_CUDA_TRY(call)                                  \
    do {                                                    \
        cudaError_t e_ = (call);                            \
        if (e_ != cudaSuccess) return cmi_cuda_fail(e_, #call); \
    } while (0)

cudaStream_t cmi_cuda_stream(void);
/* The caching allocator (runtime.cu), for the backend's own buffers (cuBLASLt's workspace). */
void *cmi_cuda_alloc(size_t bytes);
void cmi_cuda_free(void *p);
/* dst[i] += src[i] over `shape`, both through strides (elementwise.cu). */
cm_status cmi_cuda_copy_add(float *dst, const int64_t *dstride, const float *src, const int64_t *sstride, int nd,
                            const int64_t *shape);
/* Blocks for n items at `block` threads each, at least 1, at most a few waves of the device. */
unsigned cmi_cuda_grid(int64_t n, int block);
int cmi_cuda_sm_count(void);
/* The device's compute capability as 10·major + minor (90 for Hopper), once the runtime is up (after
 * any allocation). */
int cmi_cuda_cc(void);

/* D = A·B + C on the tensor cores for the calling warp (all 32 lanes): PTX's
 * mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, sm_80 and later. With g = lane / 4 and
 * t = lane % 4, a[0..3] hold A (16x16, bf16 pairs) at (g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..),
 * (g+8, 2t+8..); b[0..1] hold B (16x8) at (2t..2t+1, g), (2t+8..2t+9, g); c and d hold C and D
 * (16x8 f32) at (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1); in each bf16 pair the lower index is
 * the lower half. The emulator models the instruction from this layout (cmi_emu_mma_16816). */
__device__ __forceinline__ void cmi_mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
#if defined(CMI_CUDA_EMU)
    cmi_emu_mma_16816(d, a, b, c);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
                   "f"(c[3]));
#else
    (void)a, (void)b;
    for (int i = 0; i < 4; i++) d[i] = c[i]; /* never run: callers check cmi_cuda_cc() >= 80 first */
    __trap();
#endif
}
/* Four 8x8 bf16 matrices from shared memory into the calling warp's registers (all 32 lanes):
 * PTX's ldmatrix.sync.aligned.m8n8.x4 (sm_75 and later). Lanes 8m..8m+7 give the addresses of
 * matrix m's rows 0..7 (16-byte aligned, 16 bytes each); with g = lane / 4 and t = lane % 4, r[m]
 * gets that matrix's row g, elements 2t and 2t+1 — for .trans (cmi_ldsm_x4_trans) the matrix's
 * column g, rows 2t and 2t+1, i.e. the transposed matrix's row g. The emulator models the
 * instruction from this description, each lane reading the addresses the others give (shuffles),
 * so a kernel that hands the wrong lane the wrong row is wrong there too. */
template <bool TRANS> __device__ __forceinline__ void cmi_ldsm_x4_(uint32_t r[4], const uint16_t *row) {
#if defined(CMI_CUDA_EMU)
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    cmi_emu_check_aligned(row, 16, "ldmatrix's row address");
    for (int m = 0; m < 4; m++) {
        if (TRANS) { /* column g of matrix m: rows 2t and 2t+1 */
            const uint16_t *r0 = __shfl_sync(0xffffffffu, row, 8 * m + 2 * t);
            const uint16_t *r1 = __shfl_sync(0xffffffffu, row, 8 * m + 2 * t + 1);
            r[m] = (uint32_t)r0[g] | (uint32_t)r1[g] << 16;
        } else { /* row g of matrix m: elements 2t and 2t+1 */
            const uint16_t *src = __shfl_sync(0xffffffffu, row, 8 * m + g);
            r[m] = (uint32_t)src[2 * t] | (uint32_t)src[2 * t + 1] << 16;
        }
    }
#else
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
#endif
}
__device__ __forceinline__ void cmi_ldsm_x4(uint32_t r[4], const uint16_t *row) { cmi_ldsm_x4_<false>(r, row); }
__device__ __forceinline__ void cmi_ldsm_x4_trans(uint32_t r[4], const uint16_t *row) { cmi_ldsm_x4_<true>(r, row); }

/* 16 bytes from global to shared memory without a trip through registers (cp.async.cg, sm_80),
 * in the calling thread's current group; cmi_cp_async_commit closes the group, cmi_cp_async_wait<N>
 * waits until at most N of this thread's groups are in flight (then a __syncthreads makes every
 * thread's copies visible to the block). The emulator copies at once or, with
 * CM_CUDA_EMU_CP_ASYNC=late, at the wait (emu/cuda_emu.cc). */
__device__ __forceinline__ void cmi_cp_async16(void *smem, const void *gmem) {
#if defined(CMI_CUDA_EMU)
    cmi_emu_cp_async16(smem, gmem);
#else
    const unsigned a = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(gmem));
#endif
}
__device__ __forceinline__ void cmi_cp_async_commit() {
#if defined(CMI_CUDA_EMU)
    cmi_emu_cp_async_commit();
#else
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N> __device__ __forceinline__ void cmi_cp_async_wait() {
#if defined(CMI_CUDA_EMU)
    cmi_emu_cp_async_wait(N);
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

/* Whether kernel f was compiled for the tensor cores' bf16 mma: from sm_80 (or compute_80 PTX) or
 * later. A build for an older architecture that a newer device runs by JIT reports the device's
 * compute capability but runs code where cmi_mma_16816 is a trap: ask the kernel, not the device. */
static inline bool cmi_cuda_kernel_has_mma(const void *f) {
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, f) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return fa.ptxVersion >= 80 && fa.binaryVersion >= 80;
}
/* Device scratch for a kernel's partial results: at least `bytes`, valid until the next call on
 * this thread (kernels run in stream order, so reuse is safe). NULL + CM_ERR_OOM. */
void *cmi_cuda_scratch(size_t bytes);

/* ---- strided indexing ---- */

#define CMI_CUDA_MAX_OPS 4

/* An iteration space of up to CM_MAX_DIMS dims with the strides of up to 4 operands, collapsed
 * (size-1 dims dropped, neighbours merged where every operand allows). Passed to kernels by value. */
struct cmi_iter {
    int nd;
    int64_t n;
    int64_t shape[CM_MAX_DIMS];
    int64_t stride[CMI_CUDA_MAX_OPS][CM_MAX_DIMS];
    bool contig[CMI_CUDA_MAX_OPS]; /* operand k is contiguous over the space (offset = index) */
    bool small;                    /* n < 2^32: indices unravel in 32-bit arithmetic (a 64-bit division
                                    * is a long software sequence on the GPU) */
};

/* Builds the iteration space; strides[k] may be NULL for a contiguous operand. */
cmi_iter cmi_iter_make(int nd, const int64_t *shape, int n_ops, const int64_t *const *strides);

__device__ __forceinline__ int64_t cmi_iter_off(const cmi_iter &it, int k, int64_t i) {
    if (it.contig[k]) return i;
    int64_t off = 0;
    if (it.small) {
        uint32_t u = (uint32_t)i;
        for (int d = it.nd - 1; d >= 0; d--) {
            const uint32_t n = (uint32_t)it.shape[d], q = u / n;
            off += (int64_t)(u - q * n) * it.stride[k][d];
            u = q;
        }
        return off;
    }
    for (int d = it.nd - 1; d >= 0; d--) {
        const int64_t q = i / it.shape[d];
        off += (i - q * it.shape[d]) * it.stride[k][d];
        i = q;
    }
    return off;
}

/* ---- dtype conversions, bit-exact with the CPU's (tensor_impl.h, tensor.c) ---- */

__host__ __device__ __forceinline__ float cmi_bits_to_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}
__host__ __device__ __forceinline__ uint32_t cmi_f32_to_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}
__host__ __device__ __forceinline__ float cmi_dbf16_to_f32(uint16_t h) { return cmi_bits_to_f32((uint32_t)h << 16); }
__host__ __device__ __forceinline__ uint16_t cmi_df32_to_bf16(float x) {
    const uint32_t u = cmi_f32_to_bits(x);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}
__host__ __device__ __forceinline__ uint16_t cmi_df32_to_f16(float x) {
    const uint32_t u = cmi_f32_to_bits(x), sign = (u >> 16) & 0x8000u, absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (absu < 0x38800000u) {
        if (absu < 0x33000000u) return (uint16_t)sign;
        const uint32_t e = absu >> 23, m = (absu & 0x7fffffu) | 0x800000u, shift = 126 - e;
        const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
        uint32_t r = m >> shift;
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = (absu - 0x38000000u) >> 13;
    const uint32_t rem = absu & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}
__host__ __device__ __forceinline__ float cmi_df16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0) {
        if (m == 0) {
            u = sign;
        } else {
            e = 113;
            while (!(m & 0x400u)) {
                m <<= 1;
                e--;
            }
            u = sign | (e << 23) | ((m & 0x3ffu) << 13);
        }
    } else if (e == 31) {
        u = sign | 0x7f800000u | (m << 13);
    } else {
        u = sign | ((e + 112) << 23) | (m << 13);
    }
    return cmi_bits_to_f32(u);
}

/* cmi_load / cmi_store of tensor.c: element i of a buffer of dtype dt, through double. */
__device__ __forceinline__ double cmi_dload(int dt, const void *p, int64_t i) {
    switch (dt) {
    case CM_DTYPE_F32: return ((const float *)p)[i];
    case CM_DTYPE_BF16: return cmi_dbf16_to_f32(((const uint16_t *)p)[i]);
    case CM_DTYPE_F16: return cmi_df16_to_f32(((const uint16_t *)p)[i]);
    case CM_DTYPE_I32: return ((const int32_t *)p)[i];
    case CM_DTYPE_I64: return (double)((const int64_t *)p)[i];
    case CM_DTYPE_U8: return ((const uint8_t *)p)[i];
    default: return 0.0;
    }
}
__device__ __forceinline__ void cmi_dstore(int dt, void *p, int64_t i, double v) {
    switch (dt) {
    case CM_DTYPE_F32: ((float *)p)[i] = (float)v; break;
    case CM_DTYPE_BF16: ((uint16_t *)p)[i] = cmi_df32_to_bf16((float)v); break;
    case CM_DTYPE_F16: ((uint16_t *)p)[i] = cmi_df32_to_f16((float)v); break;
    case CM_DTYPE_I32: ((int32_t *)p)[i] = (int32_t)(int64_t)v; break; /* wraps, as tensor.c */
    case CM_DTYPE_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case CM_DTYPE_U8: ((uint8_t *)p)[i] = (uint8_t)(int64_t)v; break; /* modulo 256, as tensor.c */
    default: break;
    }
}

/* ---- Philox-4x32-10, as src/base/rng.c (dropout draws the CPU's numbers) ---- */

__device__ __forceinline__ void cmi_philox(uint64_t seed, uint64_t stream, uint64_t counter, uint32_t out[4]) {
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

/* ---- warp reductions ---- */

template <class T> __device__ __forceinline__ T cmi_warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <class T> __device__ __forceinline__ T cmi_warp_max(T v) {
    for (int o = 16; o > 0; o >>= 1) {
        const T w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024) in a fixed order: every thread
 * gets the total. `sh` is 32 slots of shared memory. */
template <class T> __device__ __forceinline__ T cmi_block_sum(T v, T *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = cmi_warp_sum(v);
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : (T)0;
    return cmi_warp_sum(v);
}

/* The broadcast reduction behind cmi_cuda_accum (reduce.cu): dst at offsets kcstride of each kept
 * index += the double sum of src over the reduced dims. */
cm_status cmi_cuda_reduce_add(const cmi_red_plan *P, const float *src, float *dst);
/* The same where src is (P->n_red, P->n_out) row-major (every reduced dim before every kept one):
 * column sums in two deterministic passes, coalesced (reduce.cu). */
cm_status cmi_cuda_colsum_add(const cmi_red_plan *P, const float *src, float *dst);

/* ---- the kernels behind the backend table (one file per family; see backend.h for semantics) ---- */
extern "C" {
cm_status cmi_cuda_fill(void *, cm_dtype, int, const int64_t *, const int64_t *, double);
cm_status cmi_cuda_copy(void *, cm_dtype, const int64_t *, const void *, cm_dtype, const int64_t *, int,
                        const int64_t *);
cm_status cmi_cuda_arange(void *, cm_dtype, int64_t, double, double);
cm_status cmi_cuda_binary(cmi_bin_op, float *, const float *, const int64_t *, const float *, const int64_t *, int,
                          const int64_t *);
cm_status cmi_cuda_binary_bwd(cmi_bin_bwd_mode, float *, const float *, const float *, const int64_t *,
                              const float *, int, const int64_t *);
cm_status cmi_cuda_unary(cmi_un_op, float, float, float *, const float *, const int64_t *, int, const int64_t *);
cm_status cmi_cuda_unary_bwd(cmi_un_op, float, float, float *, const float *, const float *, const int64_t *,
                             const float *, int, const int64_t *);
cm_status cmi_cuda_add_scaled(float *, const float *, const int64_t *, float, int, const int64_t *);
cm_status cmi_cuda_accum(float *, const int64_t *, const float *, int, const int64_t *);
cm_status cmi_cuda_check_mma(double *max_rel_err);
cm_status cmi_cuda_reduce(cmi_red_kernel, const cmi_red_plan *, const float *, const double *, double, float *,
                          double *, int64_t *);
cm_status cmi_cuda_scatter_add(float *, const int64_t *, const float *, int64_t);
cm_status cmi_cuda_var_bwd(float *, const float *, const int64_t *, const float *, const int64_t *, const float *,
                           const int64_t *, float, int, const int64_t *);
cm_status cmi_cuda_softmax(const float *, float *, int64_t, int64_t, int64_t, bool);
cm_status cmi_cuda_softmax_bwd(const float *, const float *, float *, int64_t, int64_t, int64_t, bool);
cm_status cmi_cuda_f64_to_f32(float *, const double *, int64_t);
cm_status cmi_cuda_ce_check(const void *, cm_dtype, int64_t, int64_t, int64_t, int64_t *, int64_t *, int64_t *);
cm_status cmi_cuda_ce_fwd(const float *, const void *, cm_dtype, bool, int64_t, int64_t, int64_t, int64_t, int64_t,
                          float, bool, double, float *, float *);
cm_status cmi_cuda_ce_bwd(const float *, const void *, cm_dtype, bool, int64_t, int64_t, int64_t, int64_t, int64_t,
                          float, bool, double, const float *, const float *, float *, bool, float *);
cm_status cmi_cuda_layer_norm(const float *, const float *, const float *, float *, float *, float *, int64_t, int64_t,
                              float);
cm_status cmi_cuda_layer_norm_bwd(const float *, const float *, const float *, const float *, const float *, float *,
                                  bool, float *, float *, int64_t, int64_t);
cm_status cmi_cuda_bias_gelu(const float *, const float *, float *, int64_t, int64_t, bool);
cm_status cmi_cuda_bias_gelu_bwd(const float *, const float *, const float *, float *, bool, float *, int64_t, int64_t,
                                 bool);
cm_status cmi_cuda_dropout(const float *, float *, uint8_t *, int64_t, int64_t, int64_t, uint64_t, uint64_t, uint64_t,
                           float, float);
cm_status cmi_cuda_dropout_bwd(const float *, const uint8_t *, float *, int64_t, float, bool);
cm_status cmi_cuda_read_indices(int64_t *, const void *, cm_dtype, int64_t, int64_t, int64_t *, int64_t *);
cm_status cmi_cuda_select_rows(void *, const void *, const int64_t *, int64_t, int64_t, int64_t, int64_t, size_t);
cm_status cmi_cuda_select_rows_bwd(float *, const float *, const int64_t *, int64_t, int64_t, int64_t, int64_t);
cm_status cmi_cuda_gather(void *, const void *, const int64_t *, const int64_t *, int, const int64_t *, int, size_t);
cm_status cmi_cuda_gather_bwd(float *, const int64_t *, const float *, const int64_t *, int, const int64_t *, int);
cm_status cmi_cuda_mse(const float *, const float *, int64_t, bool, double, float *);
cm_status cmi_cuda_mse_bwd(const float *, const float *, const float *, int64_t, bool, double, float *, float *);
cm_status cmi_cuda_group_norm(const float *, const float *, const float *, float *, float *, float *, int64_t, int64_t,
                              int64_t, int64_t, float);
cm_status cmi_cuda_group_norm_bwd(const float *, const float *, const float *, const float *, const float *, float *,
                                  float *, float *, int64_t, int64_t, int64_t, int64_t);
cm_status cmi_cuda_resize(const cmi_resize_desc *, const float *, float *);
cm_status cmi_cuda_resize_bwd(const cmi_resize_desc *, const float *, float *);
cm_status cmi_cuda_attention(const cmi_attn_desc *, float *, float *);
cm_status cmi_cuda_attention_bwd(const cmi_attn_desc *, const float *, const float *, const float *, float *, bool,
                                 float *, bool, float *, bool, float *);
cm_status cmi_cuda_sgd_step(const cmi_sgd_args *);
cm_status cmi_cuda_adam_step(const cmi_adam_args *);
cm_status cmi_cuda_sumsq(const float *, int64_t, double *);
cm_status cmi_cuda_ema_update(void *, const void *, cm_dtype, int64_t, float, float);
cm_status cmi_cuda_swa_update(float *, const float *, int64_t, float);
cm_status cmi_cuda_sam_perturb(float *, const float *, int64_t, float);
cm_status cmi_cuda_conv(const cmi_conv_geom *, cm_dtype, cm_dtype, const void *, cm_dtype, const void *, const float *,
                        cm_dtype, void *);
cm_status cmi_cuda_conv_bwd(const cmi_conv_geom *, cm_dtype, cm_dtype, const void *, cm_dtype, const void *, cm_dtype,
                            const void *, float *, bool, float *, float *);
cm_status cmi_cuda_batch_norm(const cmi_bn_args *);
cm_status cmi_cuda_batch_norm_bwd(const cmi_bn_bwd_args *);
cm_status cmi_cuda_pool(const cmi_pool_desc *, const float *, float *, int32_t *);
cm_status cmi_cuda_pool_bwd(const cmi_pool_desc *, const float *, const int32_t *, float *);
cm_status cmi_cuda_gemm(cm_dtype, int64_t, int64_t, int64_t, const void *, int64_t, bool, const void *, int64_t, bool,
                        const float *, bool, float *, int64_t, int64_t, int64_t, int64_t, int64_t);
}
