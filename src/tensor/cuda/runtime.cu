/*
 * The CUDA backend's runtime: device initialisation, the caching allocator, copies, the stream, error
 * reporting, and the backend table (cmi_cuda_backend) that the tensor layer calls.
 *
 * Caching allocator: blocks come from cudaMalloc and go back to a free list on free, never to
 * cudaFree while the process runs (so a training step, which frees and allocates the same sizes,
 * calls cudaMalloc only in its first steps). Requests are rounded up: to a power of two below 1 MiB,
 * to a multiple of 2 MiB above. A free block is reused when it is at least the request and at most
 * twice it. When cudaMalloc fails, every cached free block is released and the call retried once;
 * then it is an out-of-memory error (CM_ERR_OOM) naming the request and what is in use, which the
 * trainer's automatic microbatching catches. A budget (cm_device_set_memory_budget) makes the
 * allocator fail the same way before the device is full.
 */
#include "tensor/cuda/common.cuh"

#ifndef CMI_CUDA_EMU
#include <cuda.h> /* the virtual memory management types; the calls are looked up at run time */
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <mutex>
#include <vector>

namespace {

struct state {
    std::mutex mu;
    bool tried = false;
    cm_status init_status = CM_OK;
    char init_error[512] = "";
    char describe[1024] = "";
    cudaDeviceProp prop;
    int device = 0;
    cudaStream_t stream = 0;
    /* allocator */
    struct block {
        void *p;
        size_t bytes;
        size_t req; /* in use: the request it serves, rounded up to 512 bytes (PyTorch's measure) */
    };
    std::vector<block> free_blocks; /* cached, not in use */
    std::vector<block> live;        /* in use */
    size_t allocated = 0, reserved = 0, peak = 0, budget = 0;
    size_t requested = 0, peak_requested = 0; /* the live blocks' req */
    /* scratch */
    void *scratch = nullptr;
    size_t scratch_bytes = 0;
    /* fixed-address ranges (vm_*): reserved address space, memory mapped behind it or not */
    struct vrange {
        void *p;
        size_t bytes;
        bool mapped;
        unsigned long long handle; /* CUmemGenericAllocationHandle while mapped (a GPU) */
        /* a growable range (vm_extend): [0, extent) mapped, in pieces, each its own allocation */
        size_t extent;
        std::vector<std::pair<size_t, unsigned long long>> pieces; /* (offset, handle) */
    };
    std::vector<vrange> vranges;
    cudaStream_t copy_stream = 0; /* copies beside the compute stream (copy_start) */
    std::atomic<uint64_t> d2h_bytes{0}; /* bytes copied to the host (d2h_bytes) */
};

state &S() {
    static state s;
    return s;
}

size_t round_request(size_t bytes) {
    if (bytes == 0) bytes = 1;
    const size_t mib = (size_t)1 << 20, big = (size_t)2 << 20;
    if (bytes < mib) {
        size_t r = 512;
        while (r < bytes) r <<= 1;
        return r;
    }
    return (bytes + big - 1) / big * big;
}

cm_status do_init() {
    state &s = S();
    if (s.tried) {
        if (s.init_status) cm_set_error(s.init_status, "%s", s.init_error);
        return s.init_status;
    }
    s.tried = true;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        int drv = 0;
        cudaDriverGetVersion(&drv);
        const char *why = e == cudaErrorInsufficientDriver || drv == 0
                              ? "no NVIDIA driver is loaded (libcuda.so.1 not found or too old for this CUDA build)"
                          : e == cudaErrorNoDevice || n == 0
                              ? "no CUDA GPU is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)"
                              : cudaGetErrorString(e);
        snprintf(s.init_error, sizeof s.init_error, "device cuda is not available: %s (cudaGetDeviceCount: %s)",
                 why, cudaGetErrorName(e));
        cudaGetLastError();
        s.init_status = CM_ERR_UNSUPPORTED;
        cm_set_error(s.init_status, "%s", s.init_error);
        return s.init_status;
    }
    /* one GPU per process: the local rank's when launched by MPI, else 0 (CUDA_VISIBLE_DEVICES
     * narrows what the process sees) */
    const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (!lr) lr = getenv("LOCAL_RANK");
    s.device = lr ? atoi(lr) % n : 0;
    if ((e = cudaSetDevice(s.device)) != cudaSuccess || (e = cudaGetDeviceProperties(&s.prop, s.device)) ||
        (e = cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking))) {
        snprintf(s.init_error, sizeof s.init_error, "device cuda:%d could not be initialised: %s (%s)", s.device,
                 cudaGetErrorString(e), cudaGetErrorName(e));
        cudaGetLastError();
        s.init_status = CM_ERR_DEVICE;
        cm_set_error(s.init_status, "%s", s.init_error);
        return s.init_status;
    }
    snprintf(s.describe, sizeof s.describe, "%.200s (sm_%d%d, %d SMs, %.1f GiB)", s.prop.name, s.prop.major,
             s.prop.minor, s.prop.multiProcessorCount, (double)s.prop.totalGlobalMem / (double)((size_t)1 << 30));
    return CM_OK;
}

cm_status rt_init(void) {
    std::lock_guard<std::mutex> lk(S().mu);
    return do_init();
}

const char *rt_describe(void) { return rt_init() == CM_OK ? S().describe : ""; }

void release_cached(state &s) {
    for (const state::block &b : s.free_blocks) {
        cudaFree(b.p);
        s.reserved -= b.bytes;
    }
    s.free_blocks.clear();
}

void *rt_alloc(size_t bytes) {
    state &s = S();
    std::lock_guard<std::mutex> lk(s.mu);
    if (do_init()) return nullptr;
    const size_t want = round_request(bytes);
    if (s.budget && s.allocated + want > s.budget) {
        cm_set_error(CM_ERR_OOM,
                     "cuda: out of memory: %zu bytes requested with %zu of the %zu-byte budget in use "
                     "(cm_device_set_memory_budget)",
                     bytes, s.allocated, s.budget);
        return nullptr;
    }
    int best = -1;
    for (size_t i = 0; i < s.free_blocks.size(); i++) {
        const state::block &b = s.free_blocks[i];
        if (b.bytes >= want && b.bytes / 2 <= want && (best < 0 || b.bytes < s.free_blocks[(size_t)best].bytes))
            best = (int)i;
    }
    state::block blk;
    if (best >= 0) {
        blk = s.free_blocks[(size_t)best];
        s.free_blocks.erase(s.free_blocks.begin() + best);
    } else {
        void *p = nullptr;
        cudaError_t e = cudaMalloc(&p, want);
        if (e == cudaErrorMemoryAllocation && !s.free_blocks.empty()) {
            cudaGetLastError();
            cudaStreamSynchronize(s.stream); /* cached blocks may still be read by queued kernels */
            release_cached(s);
            e = cudaMalloc(&p, want);
        }
        if (e != cudaSuccess) {
            cudaGetLastError();
            size_t fr = 0, tot = 0;
            cudaMemGetInfo(&fr, &tot);
            cm_set_error(e == cudaErrorMemoryAllocation ? CM_ERR_OOM : CM_ERR_DEVICE,
                         "cuda: out of memory: cudaMalloc of %zu bytes failed (%s); this process has %zu bytes "
                         "allocated, %zu reserved; the device has %zu of %zu bytes free",
                         want, cudaGetErrorName(e), s.allocated, s.reserved, fr, tot);
            return nullptr;
        }
        blk = state::block{p, want, 0};
        s.reserved += want;
    }
    blk.req = (bytes + 511) / 512 * 512;
    s.live.push_back(blk);
    s.allocated += blk.bytes;
    s.requested += blk.req;
    if (s.allocated > s.peak) s.peak = s.allocated;
    if (s.requested > s.peak_requested) s.peak_requested = s.requested;
    return blk.p;
}

void rt_free(void *p) {
    if (!p) return;
    state &s = S();
    std::lock_guard<std::mutex> lk(s.mu);
    for (size_t i = s.live.size(); i-- > 0;) {
        if (s.live[i].p != p) continue;
        s.allocated -= s.live[i].bytes;
        s.requested -= s.live[i].req;
        s.free_blocks.push_back(s.live[i]);
        s.live.erase(s.live.begin() + (long)i);
        return;
    }
    fprintf(stderr, "composer: cuda free of %p, which the caching allocator did not hand out (ignored)\n", p);
}

cm_status rt_memcpy(void *dst, const void *src, size_t bytes, cmi_copy_kind kind) {
    if (!bytes) return CM_OK;
    state &s = S();
    const cudaMemcpyKind k = kind == CMI_H2D   ? cudaMemcpyHostToDevice
                             : kind == CMI_D2H ? cudaMemcpyDeviceToHost
                                               : cudaMemcpyDeviceToDevice;
    CMI_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, k, s.stream));
    if (kind == CMI_D2H) {
        CMI_CUDA_TRY(cudaStreamSynchronize(s.stream));
        s.d2h_bytes += bytes;
    }
    return CM_OK;
}

static uint64_t rt_d2h_bytes(void) { return S().d2h_bytes.load(); }

cm_status rt_memset(void *p, int byte, size_t bytes) {
    if (!bytes) return CM_OK;
    CMI_CUDA_TRY(cudaMemsetAsync(p, byte, bytes, S().stream));
    return CM_OK;
}

cm_status rt_sync(void) {
    if (rt_init()) return cm_last_status();
    CMI_CUDA_TRY(cudaStreamSynchronize(S().stream));
    return CM_OK;
}

void rt_mem_stats(cm_device_memory *out) {
    state &s = S();
    std::lock_guard<std::mutex> lk(s.mu);
    out->allocated = s.allocated;
    out->reserved = s.reserved;
    out->peak = s.peak;
    out->requested = s.requested;
    out->peak_requested = s.peak_requested;
    out->total = s.tried && !s.init_status ? s.prop.totalGlobalMem : 0;
}

void rt_reset_peak(void) {
    state &s = S();
    std::lock_guard<std::mutex> lk(s.mu);
    s.peak = s.allocated;
    s.peak_requested = s.requested;
}

bool rt_owns(const void *p) {
    state &s = S();
    std::lock_guard<std::mutex> lk(s.mu);
    const char *c = (const char *)p;
    for (const state::block &b : s.live)
        if (c >= (const char *)b.p && c < (const char *)b.p + b.bytes) return true;
    for (const state::vrange &v : s.vranges)
        if (c >= (const char *)v.p && c < (const char *)v.p + v.bytes) return true;
    return false;
}

void rt_set_budget(size_t bytes) {
    state &s = S();
    std::lock_guard<std::mutex> lk(s.mu);
    s.budget = bytes;
}


/* ---- fixed-address ranges: CUDA's virtual memory management (cuMemAddressReserve, cuMemCreate,
 * cuMemMap), whose driver calls are looked up at run time (cudaGetDriverEntryPointByVersion) so the
 * library still loads where no driver is. The emulator reserves an ordinary allocation and poisons
 * it (NaN bytes) when unmapped: a read of a released range shows as NaN there. Mapped bytes count
 * as allocated (peak, budget) as the caching allocator's blocks do. ---- */

#ifndef CMI_CUDA_EMU
struct drv_api {
    bool tried = false, ok = false;
    decltype(&cuMemAddressReserve) reserve = nullptr;
    decltype(&cuMemAddressFree) addr_free = nullptr;
    decltype(&cuMemCreate) create = nullptr;
    decltype(&cuMemRelease) release = nullptr;
    decltype(&cuMemMap) map = nullptr;
    decltype(&cuMemUnmap) unmap = nullptr;
    decltype(&cuMemSetAccess) set_access = nullptr;
    decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
};

template <typename F> bool drv_get(const char *name, F *out) {
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn) {
        cudaGetLastError();
        return false;
    }
    *out = (F)fn;
    return true;
}

drv_api &D() {
    static drv_api d;
    if (!d.tried) {
        d.tried = true;
        d.ok = drv_get("cuMemAddressReserve", &d.reserve) && drv_get("cuMemAddressFree", &d.addr_free) &&
               drv_get("cuMemCreate", &d.create) && drv_get("cuMemRelease", &d.release) && drv_get("cuMemMap", &d.map) &&
               drv_get("cuMemUnmap", &d.unmap) && drv_get("cuMemSetAccess", &d.set_access) &&
               drv_get("cuMemGetAllocationGranularity", &d.granularity);
    }
    return d;
}

CUmemAllocationProp vm_prop(int device) {
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = device;
    return p;
}

cm_status drv_fail(CUresult r, const char *what) {
    return cm_set_error(r == CUDA_ERROR_OUT_OF_MEMORY ? CM_ERR_OOM : CM_ERR_DEVICE, "cuda: %s failed (CUresult %d)",
                        what, (int)r);
}
#endif

size_t rt_vm_granularity(void) {
#ifdef CMI_CUDA_EMU
    return 4096; /* the emulator's page; a GPU's is 2 MiB */
#else
    state &s = S();
    drv_api &d = D();
    size_t g = 0;
    CUmemAllocationProp p = vm_prop(s.device);
    if (!d.ok || d.granularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || !g) return (size_t)2 << 20;
    return g;
#endif
}

/* Address space for `bytes` (a multiple of the granularity), recorded as a range: the driver's
 * reservation, or on the emulator an ordinary allocation, poisoned (NaN bytes) when `poison`. NULL
 * with the error recorded. */
void *vm_reserve_range(size_t bytes, bool poison) {
    void *p = nullptr;
#ifdef CMI_CUDA_EMU
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        cudaGetLastError();
        cm_set_error(CM_ERR_OOM, "cuda: reserving %zu bytes of address space failed", bytes);
        return nullptr;
    }
    if (poison) cudaMemset(p, 0xff, bytes);
#else
    (void)poison;
    drv_api &d = D();
    if (!d.ok) {
        cm_set_error(CM_ERR_UNSUPPORTED, "cuda: the driver has no virtual memory management calls "
                                         "(cuMemAddressReserve, cuMemMap: CUDA 10.2 or later)");
        return nullptr;
    }
    CUdeviceptr a = 0;
    CUresult r = d.reserve(&a, bytes, 0, 0, 0);
    if (r != CUDA_SUCCESS) {
        drv_fail(r, "cuMemAddressReserve");
        return nullptr;
    }
    p = (void *)a;
#endif
    state &s = S();
    std::lock_guard<std::mutex> lk(s.mu);
    s.vranges.push_back(state::vrange{p, bytes, false, 0, 0, {}});
    return p;
}

void *rt_vm_reserve(size_t bytes) {
    if (rt_init()) return nullptr;
    const size_t g = rt_vm_granularity();
    return vm_reserve_range((bytes ? bytes + g - 1 : g) / g * g, true);
}

state::vrange *find_vrange(state &s, const void *p) {
    for (state::vrange &v : s.vranges)
        if (v.p == p) return &v;
    return nullptr;
}

/* Under s.mu: device memory mapped behind [p + off, p + off + bytes) of a reserved range, counted
 * as allocated, requested and reserved (a mapping is asked for whole); *handle its allocation
 * (CUmemGenericAllocationHandle) on a GPU. CM_ERR_OOM when the budget or the device is full, the
 * cache's free blocks given back first, as rt_alloc does. */
cm_status vm_map_locked(state &s, void *p, size_t off, size_t bytes, unsigned long long *handle) {
    if (s.budget && s.allocated + bytes > s.budget)
        return cm_set_error(CM_ERR_OOM,
                            "cuda: out of memory: %zu bytes requested with %zu of the %zu-byte budget in use "
                            "(cm_device_set_memory_budget)",
                            bytes, s.allocated, s.budget);
    *handle = 0;
#ifndef CMI_CUDA_EMU
    drv_api &d = D();
    CUmemAllocationProp prop = vm_prop(s.device);
    CUmemGenericAllocationHandle h = 0;
    CUresult r = d.create(&h, bytes, &prop, 0);
    if (r == CUDA_ERROR_OUT_OF_MEMORY && !s.free_blocks.empty()) {
        cudaStreamSynchronize(s.stream);
        release_cached(s);
        r = d.create(&h, bytes, &prop, 0);
    }
    if (r != CUDA_SUCCESS) return drv_fail(r, "cuMemCreate");
    const CUdeviceptr at = (CUdeviceptr)p + off;
    if ((r = d.map(at, bytes, 0, h, 0)) != CUDA_SUCCESS) {
        d.release(h);
        return drv_fail(r, "cuMemMap");
    }
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if ((r = d.set_access(at, bytes, &acc, 1)) != CUDA_SUCCESS) {
        d.unmap(at, bytes);
        d.release(h);
        return drv_fail(r, "cuMemSetAccess");
    }
    *handle = (unsigned long long)h;
#else
    (void)p, (void)off;
#endif
    s.allocated += bytes;
    s.requested += bytes;
    s.reserved += bytes;
    if (s.allocated > s.peak) s.peak = s.allocated;
    if (s.requested > s.peak_requested) s.peak_requested = s.requested;
    return CM_OK;
}

/* A growable range: address space for `bytes` (0: as much as the device has; on the emulator an
 * eighth of its memory, which holds every reservation inside its own), mapped from its start by
 * rt_vm_extend. Unlike rt_vm_reserve's, the emulator does not poison the whole range up front (it
 * would touch all of it): parts never mapped read as whatever its heap held, released pieces as
 * NaN. */
void *rt_vm_reserve_growable(size_t bytes, size_t *cap) {
    *cap = 0;
    if (rt_init()) return nullptr;
    const size_t g = rt_vm_granularity();
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
        cudaGetLastError();
        tot = (size_t)80 << 30;
    }
#ifdef CMI_CUDA_EMU
    if (!bytes || bytes > tot / 8) bytes = tot / 8;
#else
    if (!bytes) bytes = tot;
#endif
    bytes = (bytes + g - 1) / g * g;
    void *p = vm_reserve_range(bytes, false);
    if (p) *cap = bytes;
    return p;
}

/* Maps device memory behind [extent, bytes) of a growable range, so [0, bytes) is usable (bytes a
 * multiple of the granularity; a smaller or equal size leaves it as it is). Counted as allocated,
 * requested and reserved, as rt_vm_map's ranges; CM_ERR_OOM when the budget or the device is full
 * (the cache's free blocks are given back first). */
cm_status rt_vm_extend(void *p, size_t bytes) {
    state &s = S();
    std::lock_guard<std::mutex> lk(s.mu);
    state::vrange *v = find_vrange(s, p);
    if (!v || v->mapped)
        return cm_set_error(CM_ERR_INTERNAL, "cuda: vm_extend of %p, which is not a growable range", p);
    if (bytes > v->bytes)
        return cm_set_error(CM_ERR_OOM, "cuda: out of memory: %zu bytes asked of a %zu-byte reserved range", bytes,
                            v->bytes);
    if (bytes <= v->extent) return CM_OK;
    unsigned long long handle = 0;
    cm_status st = vm_map_locked(s, p, v->extent, bytes - v->extent, &handle);
    if (st) return st;
    v->pieces.push_back({v->extent, handle});
    v->extent = bytes;
    return CM_OK;
}

cm_status rt_vm_map(void *p) {
    state &s = S();
    std::lock_guard<std::mutex> lk(s.mu);
    state::vrange *v = find_vrange(s, p);
    if (!v) return cm_set_error(CM_ERR_INTERNAL, "cuda: vm_map of %p, which is not a reserved range", p);
    if (v->mapped) return CM_OK;
    cm_status st = vm_map_locked(s, p, 0, v->bytes, &v->handle);
    if (!st) v->mapped = true;
    return st;
}

void rt_vm_unmap(void *p) {
    state &s = S();
    std::lock_guard<std::mutex> lk(s.mu);
    state::vrange *v = find_vrange(s, p);
    if (!v || (!v->mapped && !v->extent)) return;
    /* kernels and copies queued on either stream may still read it */
    cudaStreamSynchronize(s.stream);
    if (s.copy_stream) cudaStreamSynchronize(s.copy_stream);
    if (v->extent) { /* a growable range: its pieces */
#ifdef CMI_CUDA_EMU
        cudaMemset(p, 0xff, v->extent);
#else
        for (size_t i = 0; i < v->pieces.size(); i++) {
            const size_t end = i + 1 < v->pieces.size() ? v->pieces[i + 1].first : v->extent;
            D().unmap((CUdeviceptr)p + v->pieces[i].first, end - v->pieces[i].first);
            D().release((CUmemGenericAllocationHandle)v->pieces[i].second);
        }
#endif
        v->pieces.clear();
        s.allocated -= v->extent;
        s.requested -= v->extent;
        s.reserved -= v->extent;
        v->extent = 0;
        return;
    }
#ifdef CMI_CUDA_EMU
    cudaMemset(p, 0xff, v->bytes);
#else
    D().unmap((CUdeviceptr)p, v->bytes);
    D().release((CUmemGenericAllocationHandle)v->handle);
    v->handle = 0;
#endif
    v->mapped = false;
    s.allocated -= v->bytes;
    s.requested -= v->bytes;
    s.reserved -= v->bytes;
}

void rt_vm_release(void *p) {
    if (!p) return;
    rt_vm_unmap(p);
    state &s = S();
    std::lock_guard<std::mutex> lk(s.mu);
    for (size_t i = 0; i < s.vranges.size(); i++) {
        if (s.vranges[i].p != p) continue;
#ifdef CMI_CUDA_EMU
        cudaFree(p);
#else
        D().addr_free((CUdeviceptr)p, s.vranges[i].bytes);
#endif
        s.vranges.erase(s.vranges.begin() + (long)i);
        return;
    }
}

/* ---- pinned host memory and copies on the copy stream ---- */

void *rt_host_alloc(size_t bytes) {
    if (rt_init()) return nullptr;
    void *p = nullptr;
    cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cmi_cuda_fail(e, "cudaMallocHost");
        return nullptr;
    }
    return p;
}

void rt_host_free(void *p) {
    if (p) cudaFreeHost(p);
}

/* The copy waits for the work queued on the compute stream so far (it may read what kernels wrote),
 * then runs on the copy stream; *ev is recorded after it. */
cm_status rt_copy_start(void *dst, const void *src, size_t bytes, cmi_copy_kind kind, void **ev) {
    *ev = nullptr;
    state &s = S();
    if (rt_init()) return cm_last_status();
    if (!s.copy_stream) CMI_CUDA_TRY(cudaStreamCreateWithFlags(&s.copy_stream, cudaStreamNonBlocking));
    cudaEvent_t before, after;
    CMI_CUDA_TRY(cudaEventCreateWithFlags(&before, cudaEventDisableTiming));
    cudaError_t e = cudaEventRecord(before, s.stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(s.copy_stream, before, 0);
    cudaEventDestroy(before);
    if (e != cudaSuccess) return cmi_cuda_fail(e, "copy_start: ordering after the compute stream");
    const cudaMemcpyKind k = kind == CMI_H2D   ? cudaMemcpyHostToDevice
                             : kind == CMI_D2H ? cudaMemcpyDeviceToHost
                                               : cudaMemcpyDeviceToDevice;
    CMI_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, k, s.copy_stream));
    if (kind == CMI_D2H) s.d2h_bytes += bytes;
    CMI_CUDA_TRY(cudaEventCreateWithFlags(&after, cudaEventDisableTiming));
    if ((e = cudaEventRecord(after, s.copy_stream)) != cudaSuccess) {
        cudaEventDestroy(after);
        return cmi_cuda_fail(e, "copy_start: cudaEventRecord");
    }
    *ev = (void *)after;
    return CM_OK;
}

cm_status rt_copy_test(void *ev, bool *done) {
    const cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    *done = e == cudaSuccess;
    if (e == cudaSuccess || e == cudaErrorNotReady) {
        cudaGetLastError();
        return CM_OK;
    }
    return cmi_cuda_fail(e, "copy_test: cudaEventQuery");
}

cm_status rt_copy_join(void *ev) {
    const cudaError_t e = cudaStreamWaitEvent(S().stream, (cudaEvent_t)ev, 0);
    cudaEventDestroy((cudaEvent_t)ev);
    return e == cudaSuccess ? CM_OK : cmi_cuda_fail(e, "copy_join: cudaStreamWaitEvent");
}

cm_status rt_copy_wait(void *ev) {
    const cudaError_t e = cudaEventSynchronize((cudaEvent_t)ev);
    cudaEventDestroy((cudaEvent_t)ev);
    return e == cudaSuccess ? CM_OK : cmi_cuda_fail(e, "copy_wait: cudaEventSynchronize");
}

} // namespace

/* ---- helpers shared by the kernel files ---- */

cm_status cmi_cuda_fail(cudaError_t e, const char *what) {
    cudaGetLastError(); /* clear a non-sticky error so the next call starts clean */
    return cm_set_error(e == cudaErrorMemoryAllocation ? CM_ERR_OOM : CM_ERR_DEVICE, "cuda: %s: %s (%s)", what,
                        cudaGetErrorName(e), cudaGetErrorString(e));
}

cm_status cmi_cuda_launched(const char *kernel) {
    const cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return CM_OK;
    return cm_set_error(e == cudaErrorMemoryAllocation ? CM_ERR_OOM : CM_ERR_DEVICE, "cuda: kernel %s: %s (%s)",
                        kernel, cudaGetErrorName(e), cudaGetErrorString(e));
}

cudaStream_t cmi_cuda_stream(void) { return S().stream; }
void *cmi_cuda_alloc(size_t bytes) { return rt_alloc(bytes); }
void cmi_cuda_free(void *p) { rt_free(p); }

int cmi_cuda_cc(void) { return S().prop.major * 10 + S().prop.minor; }
int cmi_cuda_sm_count(void) { return S().prop.multiProcessorCount > 0 ? S().prop.multiProcessorCount : 1; }

unsigned cmi_cuda_grid(int64_t n, int block) {
    int64_t g = (n + block - 1) / block;
#ifdef CMI_CUDA_EMU
    const int64_t cap = 2; /* the emulator runs every thread: grid-stride loops do the rest */
#else
    const int64_t cap = (int64_t)cmi_cuda_sm_count() * 32;
#endif
    if (g > cap) g = cap;
    return g < 1 ? 1u : (unsigned)g;
}

void *cmi_cuda_scratch(size_t bytes) {
    state &s = S();
    if (s.scratch_bytes >= bytes && s.scratch) return s.scratch;
    if (s.scratch) rt_free(s.scratch);
    s.scratch = rt_alloc(bytes * 2);
    s.scratch_bytes = s.scratch ? bytes * 2 : 0;
    return s.scratch;
}

cmi_iter cmi_iter_make(int nd, const int64_t *shape, int n_ops, const int64_t *const *strides) {
    cmi_iter it;
    memset(&it, 0, sizeof it);
    it.n = 1;
    for (int d = 0; d < nd; d++) it.n *= shape[d];
    int64_t cs[CM_MAX_DIMS];
    {
        int64_t acc = 1;
        for (int d = nd - 1; d >= 0; d--) {
            cs[d] = acc;
            acc *= shape[d] > 0 ? shape[d] : 1;
        }
    }
    for (int k = 0; k < n_ops; k++) {
        bool c = true;
        if (strides && strides[k])
            for (int d = 0; d < nd; d++)
                if (shape[d] != 1 && strides[k][d] != cs[d]) c = false;
        it.contig[k] = c;
    }
    /* collapse: drop size-1 dims, merge d into the previous kept dim when all operands allow */
    int m = 0;
    for (int d = 0; d < nd; d++) {
        if (shape[d] == 1) continue;
        bool merge = m > 0;
        for (int k = 0; k < n_ops && merge; k++) {
            const int64_t sd = strides && strides[k] ? strides[k][d] : cs[d];
            if (it.stride[k][m - 1] != sd * shape[d]) merge = false;
        }
        if (merge) {
            it.shape[m - 1] *= shape[d];
            for (int k = 0; k < n_ops; k++) it.stride[k][m - 1] = strides && strides[k] ? strides[k][d] : cs[d];
        } else {
            it.shape[m] = shape[d];
            for (int k = 0; k < n_ops; k++) it.stride[k][m] = strides && strides[k] ? strides[k][d] : cs[d];
            m++;
        }
    }
    it.nd = m;
    it.small = it.n < ((int64_t)1 << 32);
    return it;
}

/* ---- the table ---- */

extern "C" {
/* Filled by name (a slot left out stays NULL, which tests/test_backend_ops.c checks). */
static cmi_backend make_table(void) {
    cmi_backend b;
    memset(&b, 0, sizeof b);
    b.name = "cuda";
    b.device = CM_DEVICE_CUDA;
    b.init = rt_init;
    b.describe = rt_describe;
    b.alloc = rt_alloc;
    b.free = rt_free;
    b.memcpy = rt_memcpy;
    b.memset = rt_memset;
    b.sync = rt_sync;
    b.mem_stats = rt_mem_stats;
    b.reset_peak = rt_reset_peak;
    b.set_budget = rt_set_budget;
    b.owns = rt_owns;
    b.d2h_bytes = rt_d2h_bytes;
    b.vm_granularity = rt_vm_granularity;
    b.vm_reserve = rt_vm_reserve;
    b.vm_map = rt_vm_map;
    b.vm_unmap = rt_vm_unmap;
    b.vm_release = rt_vm_release;
    b.vm_reserve_growable = rt_vm_reserve_growable;
    b.vm_extend = rt_vm_extend;
    b.host_alloc = rt_host_alloc;
    b.host_free = rt_host_free;
    b.copy_start = rt_copy_start;
    b.copy_test = rt_copy_test;
    b.copy_join = rt_copy_join;
    b.copy_wait = rt_copy_wait;
    b.fill = cmi_cuda_fill;
    b.copy = cmi_cuda_copy;
    b.arange = cmi_cuda_arange;
    b.binary = cmi_cuda_binary;
    b.binary_bwd = cmi_cuda_binary_bwd;
    b.unary = cmi_cuda_unary;
    b.unary_bwd = cmi_cuda_unary_bwd;
    b.add_scaled = cmi_cuda_add_scaled;
    b.accum = cmi_cuda_accum;
    b.check_mma = cmi_cuda_check_mma;
    b.reduce = cmi_cuda_reduce;
    b.scatter_add = cmi_cuda_scatter_add;
    b.var_bwd = cmi_cuda_var_bwd;
    b.softmax = cmi_cuda_softmax;
    b.softmax_bwd = cmi_cuda_softmax_bwd;
    b.f64_to_f32 = cmi_cuda_f64_to_f32;
    b.gemm = cmi_cuda_gemm;
    b.ce_check = cmi_cuda_ce_check;
    b.ce_fwd = cmi_cuda_ce_fwd;
    b.ce_bwd = cmi_cuda_ce_bwd;
    b.layer_norm = cmi_cuda_layer_norm;
    b.layer_norm_bwd = cmi_cuda_layer_norm_bwd;
    b.bias_gelu = cmi_cuda_bias_gelu;
    b.bias_gelu_bwd = cmi_cuda_bias_gelu_bwd;
    b.dropout = cmi_cuda_dropout;
    b.dropout_bwd = cmi_cuda_dropout_bwd;
    b.read_indices = cmi_cuda_read_indices;
    b.select_rows = cmi_cuda_select_rows;
    b.select_rows_bwd = cmi_cuda_select_rows_bwd;
    b.attention = cmi_cuda_attention;
    b.attention_bwd = cmi_cuda_attention_bwd;
    b.sgd_step = cmi_cuda_sgd_step;
    b.adam_step = cmi_cuda_adam_step;
    b.sumsq = cmi_cuda_sumsq;
    b.ema_update = cmi_cuda_ema_update;
    b.swa_update = cmi_cuda_swa_update;
    b.sam_perturb = cmi_cuda_sam_perturb;
    b.conv = cmi_cuda_conv;
    b.conv_bwd = cmi_cuda_conv_bwd;
    b.batch_norm = cmi_cuda_batch_norm;
    b.batch_norm_bwd = cmi_cuda_batch_norm_bwd;
    b.pool = cmi_cuda_pool;
    b.pool_bwd = cmi_cuda_pool_bwd;
    b.gather = cmi_cuda_gather;
    b.gather_bwd = cmi_cuda_gather_bwd;
    b.mse = cmi_cuda_mse;
    b.mse_bwd = cmi_cuda_mse_bwd;
    b.group_norm = cmi_cuda_group_norm;
    b.group_norm_bwd = cmi_cuda_group_norm_bwd;
    b.resize = cmi_cuda_resize;
    b.resize_bwd = cmi_cuda_resize_bwd;
    return b;
}

const cmi_backend *cmi_cuda_backend(const char **why) {
    static const cmi_backend table = make_table();
    if (why) *why = NULL;
    return &table;
}
}
