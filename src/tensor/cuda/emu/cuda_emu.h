/*
 * cuda_emu.h — the subset of CUDA that our kernels use, run on the CPU, so the CUDA backend's kernels
 * and their host code are tested on machines without a GPU (CI, and most sessions here).
 *
 * Built with -DCM_CUDA=EMU, the .cu files under src/tensor/cuda/ are compiled as C++ by the host
 * compiler with this header force-included instead of CUDA's. What it gives:
 *   - kernels launched with CMI_LAUNCH run block by block; the threads of a block run as
 *     coroutines, so __syncthreads() and the warp primitives (__shfl_*_sync, __ballot_sync, ...) have
 *     their CUDA meaning: every thread of the block (warp) reaches the barrier before any passes it.
 *     A barrier that some threads never reach is reported (a deadlock on a GPU) and aborts.
 *   - __shared__ storage is static: one block runs at a time, so it is the block's shared memory
 *     (it keeps the previous block's values, as real shared memory keeps garbage).
 *   - device memory (cudaMalloc) is host memory that is inaccessible (PROT_NONE) outside kernels and
 *     cudaMemcpy/cudaMemset: host code that reads or writes device memory by mistake crashes here as it
 *     would on a GPU, instead of passing silently.
 *   - streams and events exist as handles; everything runs synchronously, in order.
 *   - CM_CUDA_EMU_SCHEDULE (round | warps | warps-reverse) orders the threads between barriers and
 *     CM_CUDA_EMU_CP_ASYNC (early | late) says when cp.async copies land: a kernel with a race
 *     between warps computes differently in one of them (emu/cuda_emu.cc), the test finds it.
 * What it cannot show: races between blocks, races that no schedule here exposes, memory coalescing,
 * occupancy, resource limits other than the block size, and the real cuBLASLt (emu/cublaslt_emu.h
 * implements the documented semantics of the calls we make).
 */
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

#define CMI_CUDA_EMU 1

/* ---- qualifiers ---- */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __constant__ static
#define __launch_bounds__(...)
#define __grid_constant__

/* ---- thread coordinates ---- */
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
    unsigned int x, y, z;
};
extern thread_local uint3 threadIdx, blockIdx;
extern thread_local dim3 blockDim, gridDim;
constexpr int warpSize = 32;

/* ---- barriers and warp primitives (emu/cuda_emu.cc) ---- */
void __syncthreads();
int __syncthreads_or(int pred);
int __syncthreads_and(int pred);
int __syncthreads_count(int pred);
void __syncwarp(unsigned mask = 0xffffffffu);
void __threadfence();
void __threadfence_block();
unsigned __activemask();
/* Exchange of up to 8 bytes within the calling warp: every thread posts v, then reads the value of
 * lane src (the caller's own when src is out of range, as CUDA). */
uint64_t cmi_emu_warp_exchange(uint64_t v, int src_lane);
/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 for the calling warp: every lane posts its
 * fragments (a: 4 registers of 2 bf16, b: 2, c: 4 floats) laid out as the PTX ISA documents them,
 * and gets its 4 floats of D = A·B + C (products summed over k in order, in f32). */
void cmi_emu_mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]);
unsigned cmi_emu_warp_ballot(int pred);
int cmi_emu_lane();
/* cp.async (common.cuh's cmi_cp_async16 / _commit / _wait): the copy lands at once or, with
 * CM_CUDA_EMU_CP_ASYNC=late, at the wait that requires it (emu/cuda_emu.cc) */
void cmi_emu_cp_async16(void *smem, const void *gmem);
/* An address an instruction needs aligned to `align` bytes (ldmatrix's rows, cp.async's 16 bytes):
 * a misaligned one is reported with the instruction's name and aborts, as the GPU stops the kernel
 * with "misaligned address". */
void cmi_emu_check_aligned(const void *p, size_t align, const char *what);
void cmi_emu_cp_async_commit();
void cmi_emu_cp_async_wait(int n);

template <class T> static inline T cmi_emu_shfl(T v, int src) {
    static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof(T));
    u = cmi_emu_warp_exchange(u, src);
    T r;
    memcpy(&r, &u, sizeof(T));
    return r;
}
template <class T> static inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
    const int lane = cmi_emu_lane();
    return cmi_emu_shfl(v, (lane & ~(width - 1)) + (src & (width - 1)));
}
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
    const int lane = cmi_emu_lane();
    int src = lane ^ mask;
    if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
    return cmi_emu_shfl(v, src);
}
template <class T> static inline T __shfl_down_sync(unsigned, T v, unsigned d, int width = 32) {
    const int lane = cmi_emu_lane();
    int src = lane + (int)d;
    if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
    return cmi_emu_shfl(v, src);
}
template <class T> static inline T __shfl_up_sync(unsigned, T v, unsigned d, int width = 32) {
    const int lane = cmi_emu_lane();
    int src = lane - (int)d;
    if (src < (lane & ~(width - 1))) src = lane;
    return cmi_emu_shfl(v, src);
}
static inline unsigned __ballot_sync(unsigned, int pred) { return cmi_emu_warp_ballot(pred); }
static inline int __any_sync(unsigned m, int pred) { return __ballot_sync(m, pred) != 0; }
static inline int __all_sync(unsigned m, int pred) {
    return __ballot_sync(m, pred) == __ballot_sync(m, 1);
}

/* ---- atomics: one emulated thread runs at a time, so plain read-modify-writes are atomic ---- */
template <class T> static inline T atomicAdd(T *p, T v) {
    T o = *p;
    *p = o + v;
    return o;
}
template <class T> static inline T atomicMax(T *p, T v) {
    T o = *p;
    if (v > o) *p = v;
    return o;
}
template <class T> static inline T atomicMin(T *p, T v) {
    T o = *p;
    if (v < o) *p = v;
    return o;
}
template <class T> static inline T atomicExch(T *p, T v) {
    T o = *p;
    *p = v;
    return o;
}
template <class T> static inline T atomicCAS(T *p, T cmp, T v) {
    T o = *p;
    if (o == cmp) *p = v;
    return o;
}
static inline unsigned atomicInc(unsigned *p, unsigned limit) {
    unsigned o = *p;
    *p = o >= limit ? 0 : o + 1;
    return o;
}

/* ---- math intrinsics (glibc declares __expf and __logf but does not export them to link against:
 * the GPU's approximate forms are the accurate functions here) ---- */
#define __expf(x) expf(x)
#define __logf(x) logf(x)
static inline float __fdividef(float a, float b) { return a / b; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float __frcp_rn(float x) { return 1.0f / x; }
/* IEEE single operations rounded once each (never fused into a multiply-add) */
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
static inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
static inline int __float_as_int(float f) {
    int i;
    memcpy(&i, &f, 4);
    return i;
}
static inline unsigned __float_as_uint(float f) {
    unsigned i;
    memcpy(&i, &f, 4);
    return i;
}
static inline float __uint_as_float(unsigned i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
template <class T> static inline T __ldg(const T *p) { return *p; }

/* ---- vector types, aligned as CUDA's (a __shared__ array of them is as aligned as on a GPU) ---- */
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(4) ushort2 {
    unsigned short x, y;
};
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return uint3{x, y, z}; }

/* ---- bf16 / fp16 (bit-exact conversions, round to nearest even) ---- */
struct __nv_bfloat16 {
    unsigned short x;
};
struct __half {
    unsigned short x;
};
static inline float __bfloat162float(__nv_bfloat16 h) { return __uint_as_float((unsigned)h.x << 16); }
static inline __nv_bfloat16 __float2bfloat16(float f) {
    unsigned u = __float_as_uint(f);
    __nv_bfloat16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) r.x = (unsigned short)((u >> 16) | 0x40u);
    else r.x = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return r;
}
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
float cmi_emu_half2float(unsigned short h);
unsigned short cmi_emu_float2half(float f);
static inline float __half2float(__half h) { return cmi_emu_half2float(h.x); }
static inline __half __float2half(float f) { return __half{cmi_emu_float2half(f)}; }
static inline __half __float2half_rn(float f) { return __float2half(f); }

/* ---- runtime API (emu/cuda_emu.cc) ---- */
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorNoDevice = 100,
    cudaErrorInsufficientDriver = 35,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotReady = 600,
} cudaError_t;
typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
} cudaMemcpyKind;
typedef struct cmi_emu_stream *cudaStream_t;
typedef struct cmi_emu_event *cudaEvent_t;
typedef enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 } cudaFuncAttribute;
#define cudaStreamNonBlocking 0x01
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault 0
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    size_t sharedMemPerBlockOptin;
    int regsPerBlock;
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int major, minor;
    int multiProcessorCount;
    int l2CacheSize;
    int clockRate;
    int memoryClockRate;
    int memoryBusWidth;
};

const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d);
cudaError_t cudaDriverGetVersion(int *v);
cudaError_t cudaRuntimeGetVersion(int *v);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s = 0);
cudaError_t cudaMemset(void *p, int v, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s = 0);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t cudaFuncSetAttribute(const void *f, cudaFuncAttribute a, int v);
/* What the emulator says of any kernel: compiled for (and run as) sm_90. */
struct cudaFuncAttributes {
    int ptxVersion, binaryVersion, numRegs, maxDynamicSharedSizeBytes;
};
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *attr, const void *f);

/* Runs body once per thread of every block of the grid (see the top of this file). Checks the
 * configuration as a GPU would (block of 1..1024 threads, dims within limits, dynamic shared memory
 * within 227 KiB) and records cudaErrorInvalidConfiguration otherwise. */
void cmi_emu_launch(dim3 grid, dim3 block, size_t smem, const std::function<void()> &body);
/* The dynamic shared memory of the running block (smem bytes of the launch). */
void *cmi_emu_dyn_smem();
/* Memory the emulated device allocated: accessible during kernels and copies only. Tests can turn
 * the protection off (CM_CUDA_EMU_PROTECT=0) to debug. */
bool cmi_emu_is_device_ptr(const void *p);

#define CMI_LAUNCH(kernel, grid, block, smem, stream, ...) \
    ((void)(stream), cmi_emu_launch((grid), (block), (smem), [=]() { kernel(__VA_ARGS__); }))
#define CMI_DYN_SMEM(T, name) T *name = (T *)cmi_emu_dyn_smem()
