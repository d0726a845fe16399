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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    };
    std::vector<block> free_blocks; /* cached, not in use */
    std::vector<block> live;        /* in use */
    size_t allocated = 0, reserved = 0, peak = 0, budget = 0;
    /* scratch */
    void *scratch = nullptr;
    size_t scratch_bytes = 0;
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
        blk = state::block{p, want};
        s.reserved += want;
    }
    s.live.push_back(blk);
    s.allocated += blk.bytes;
    if (s.allocated > s.peak) s.peak = s.allocated;
    return blk.p;
}

void rt_free(void *p) {
    if (!p) return;
    state &s = S();
    std::lock_guard<std::mutex> lk(s.mu);
    for (size_t i = s.live.size(); i-- > 0;) {
        if (s.live[i].p != p) continue;
        s.allocated -= s.live[i].bytes;
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
    if (kind == CMI_D2H) CMI_CUDA_TRY(cudaStreamSynchronize(s.stream));
    return CM_OK;
}

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
    out->total = s.tried && !s.init_status ? s.prop.totalGlobalMem : 0;
}

void rt_reset_peak(void) {
    state &s = S();
    std::lock_guard<std::mutex> lk(s.mu);
    s.peak = s.allocated;
}

bool rt_owns(const void *p) {
    state &s = S();
    std::lock_guard<std::mutex> lk(s.mu);
    const char *c = (const char *)p;
    for (const state::block &b : s.live)
        if (c >= (const char *)b.p && c < (const char *)b.p + b.bytes) return true;
    return false;
}

void rt_set_budget(size_t bytes) {
    state &s = S();
    std::lock_guard<std::mutex> lk(s.mu);
    s.budget = bytes;
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
    b.fill = cmi_cuda_fill;
    b.copy = cmi_cuda_copy;
    b.arange = cmi_cuda_arange;
    b.binary = cmi_cuda_binary;
    b.binary_bwd = cmi_cuda_binary_bwd;
    b.unary = cmi_cuda_unary;
    b.unary_bwd = cmi_cuda_unary_bwd;
    b.add_scaled = cmi_cuda_add_scaled;
    b.accum = cmi_cuda_accum;
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
