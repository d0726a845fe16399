/* The CUDA emulator's runtime: block scheduler (threads as ucontext coroutines), device memory,
 * streams and events. See cuda_emu.h for what it is for and what it cannot show. Single OS thread at
 * a time: the tensor layer calls the backend from one thread per tape. */
#include "cuda_emu.h"

#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <mutex>
#include <vector>

thread_local uint3 threadIdx, blockIdx;
thread_local dim3 blockDim, gridDim;

namespace {

enum { TS_RUN, TS_BLOCK_BAR, TS_WARP_BAR, TS_DONE };

/* A cp.async copy not yet landed in shared memory (CM_CUDA_EMU_CP_ASYNC=late): the 16 bytes read
 * when it was issued, where they go, and the thread's group it belongs to. */
struct pending_copy {
    void *dst;
    unsigned char bytes[16];
    int group;
};

struct ethread {
    ucontext_t ctx;
    char *stack;
    int state;
    uint3 tid;
    int gen; /* warp-exchange generation (double buffer) */
    int bar_kind; /* for __syncthreads_or/and/count: the predicate posted */
    int pred;
    int cp_group; /* cp.async groups committed so far */
    std::vector<pending_copy> cp_pending;
};

constexpr size_t kStack = (size_t)256 << 10;

struct block_run {
    std::vector<ethread> th;
    ucontext_t sched;
    int cur = -1;
    int n = 0;
    const std::function<void()> *body = nullptr;
    uint64_t xbuf[2][1024]; /* warp exchange slots, by generation and linear thread id */
    uint32_t mbuf[2][1024][6]; /* mma fragments (a0-a3, b0-b1), by generation and thread id */
    int bar_result = 0;
    std::vector<char> smem;
};

thread_local block_run *g_run;
thread_local cudaError_t g_last = cudaSuccess;
std::mutex g_mem_mu;
struct region {
    char *p;
    size_t len;
};
std::vector<region> g_regions; /* live allocations */
std::vector<region> g_free;    /* freed pieces of the heap, for reuse */
size_t g_dev_used = 0;
/* Device memory is one reserved heap (PROT_NONE outside kernels and copies), carved by first fit:
 * opening and closing it is one mprotect each way instead of one per allocation (with hundreds of
 * allocations that was most of the emulator's time). */
char *g_heap = nullptr;
size_t g_heap_top = 0; /* bytes of the heap ever handed out (the part to open and close) */
bool g_protect_read = false, g_protect = true;
int g_kernel_depth = 0;

size_t dev_total() {
    static size_t total = 0;
    if (!total) {
        const char *e = getenv("CM_CUDA_EMU_MEM");
        total = e && *e ? (size_t)strtoull(e, nullptr, 10) : ((size_t)4 << 30);
    }
    return total;
}

bool protect_on() {
    if (!g_protect_read) {
        const char *e = getenv("CM_CUDA_EMU_PROTECT");
        g_protect = !(e && e[0] == '0');
        g_protect_read = true;
    }
    return g_protect;
}

/* Device memory accessible (open) or not, around kernels and copies. */
void set_access(bool open) {
    if (!protect_on()) return;
    std::lock_guard<std::mutex> lk(g_mem_mu);
    if (g_heap && g_heap_top) mprotect(g_heap, g_heap_top, open ? PROT_READ | PROT_WRITE : PROT_NONE);
}

struct access_scope {
    access_scope() {
        if (g_kernel_depth++ == 0) set_access(true);
    }
    ~access_scope() {
        if (--g_kernel_depth == 0) set_access(false);
    }
};


/* How the threads of a block are interleaved between barriers (CM_CUDA_EMU_SCHEDULE). A kernel
 * without a race computes the same in every schedule; one that reads shared memory another warp
 * writes (or overwrites what another warp still reads) without a barrier between gives a different
 * result in one of them — what compute-sanitizer's racecheck reports on a GPU.
 *   round          every thread runs until it blocks, in thread order, round after round (warps
 *                  advance together, one warp primitive at a time): the default
 *   warps          warp 0 runs to its next __syncthreads (or its end) before warp 1 starts, ...
 *   warps-reverse  the same from the last warp to the first, lanes in reverse order too */
enum { SCHED_ROUND, SCHED_WARPS, SCHED_WARPS_REVERSE };

int sched_mode() {
    static int mode = -1;
    if (mode < 0) {
        const char *e = getenv("CM_CUDA_EMU_SCHEDULE");
        if (!e || !*e || !strcmp(e, "round")) mode = SCHED_ROUND;
        else if (!strcmp(e, "warps")) mode = SCHED_WARPS;
        else if (!strcmp(e, "warps-reverse")) mode = SCHED_WARPS_REVERSE;
        else {
            fprintf(stderr, "cuda_emu: CM_CUDA_EMU_SCHEDULE=%s is not a schedule: round, warps or warps-reverse\n", e);
            abort();
        }
    }
    return mode;
}

/* When a cp.async copy lands (CM_CUDA_EMU_CP_ASYNC): early (at once, the default) or late (at the
 * issuing thread's cp.async.wait_group that requires it) — the two ends of what the hardware may
 * do. A kernel reading a tile before its wait is wrong only under late; one overwriting a buffer
 * other warps still read (no barrier before the next copy) is wrong under early with a warps
 * schedule. */
bool cp_async_late() {
    static int late = -1;
    if (late < 0) {
        const char *e = getenv("CM_CUDA_EMU_CP_ASYNC");
        if (!e || !*e || !strcmp(e, "early")) late = 0;
        else if (!strcmp(e, "late")) late = 1;
        else {
            fprintf(stderr, "cuda_emu: CM_CUDA_EMU_CP_ASYNC=%s is not a mode: early or late\n", e);
            abort();
        }
    }
    return late == 1;
}

void thread_entry() {
    block_run *r = g_run;
    (*r->body)();
    r->th[r->cur].state = TS_DONE;
    /* returns to uc_link (the scheduler) */
}

[[noreturn]] void deadlock(const char *what) {
    fprintf(stderr,
            "cuda_emu: deadlock in block (%u, %u, %u): %s (a barrier not reached by every thread of the "
            "block or warp; on a GPU this hangs or is undefined)\n",
            blockIdx.x, blockIdx.y, blockIdx.z, what);
    abort();
}

/* Yield to the scheduler with the given state. */
void wait_as(int state) {
    block_run *r = g_run;
    const int me = r->cur;
    r->th[me].state = state;
    swapcontext(&r->th[me].ctx, &r->sched);
    threadIdx = r->th[me].tid; /* restored by the scheduler too; kept explicit */
}

void run_block() {
    block_run *r = g_run;
    for (int i = 0; i < r->n; i++) {
        ethread &t = r->th[i];
        if (!t.stack) t.stack = (char *)malloc(kStack);
        if (!t.stack) {
            fprintf(stderr, "cuda_emu: out of memory for thread stacks\n");
            abort();
        }
        getcontext(&t.ctx);
        t.ctx.uc_stack.ss_sp = t.stack;
        t.ctx.uc_stack.ss_size = kStack;
        t.ctx.uc_link = &r->sched;
        makecontext(&t.ctx, thread_entry, 0);
        t.state = TS_RUN;
        t.gen = 0;
        t.cp_group = 0;
        t.cp_pending.clear();
        t.tid = uint3{(unsigned)(i % blockDim.x), (unsigned)((i / blockDim.x) % blockDim.y),
                      (unsigned)(i / (blockDim.x * blockDim.y))};
    }
    const int n_warps = (r->n + 31) / 32, mode = sched_mode();
    const bool rev = mode == SCHED_WARPS_REVERSE;
    /* runs warp w's runnable threads until each blocks; true when all its live threads then wait at
     * a warp primitive (released here: the greedy schedules keep the warp going) */
    auto run_warp = [&](int w, bool release) {
        const int lo = w * 32, hi = lo + 32 < r->n ? lo + 32 : r->n;
        for (int k = lo; k < hi; k++) {
            const int i = rev ? hi - 1 - (k - lo) : k;
            if (r->th[i].state != TS_RUN) continue;
            r->cur = i;
            threadIdx = r->th[i].tid;
            swapcontext(&r->sched, &r->th[i].ctx);
        }
        int waiting = 0, live = 0;
        for (int i = lo; i < hi; i++) {
            if (r->th[i].state == TS_DONE) continue;
            live++;
            if (r->th[i].state == TS_WARP_BAR) waiting++;
        }
        if (!release || !live || waiting != live) return false;
        for (int i = lo; i < hi; i++)
            if (r->th[i].state == TS_WARP_BAR) r->th[i].state = TS_RUN;
        return true;
    };
    for (;;) {
        if (mode == SCHED_ROUND)
            for (int w = 0; w < n_warps; w++) run_warp(w, false);
        else
            for (int k = 0; k < n_warps; k++)
                while (run_warp(rev ? n_warps - 1 - k : k, true)) {
                }
        bool all_done = true, released = false;
        for (int w = 0; w < n_warps; w++) {
            int lo = w * 32, hi = lo + 32 < r->n ? lo + 32 : r->n, waiting = 0, live = 0;
            for (int i = lo; i < hi; i++) {
                if (r->th[i].state == TS_DONE) continue;
                live++;
                if (r->th[i].state == TS_WARP_BAR) waiting++;
            }
            if (live && waiting == live) {
                for (int i = lo; i < hi; i++)
                    if (r->th[i].state == TS_WARP_BAR) r->th[i].state = TS_RUN;
                released = true;
            }
        }
        if (released) continue;
        int live = 0, at_block = 0, agg_or = 0, agg_and = 1, count = 0;
        for (int i = 0; i < r->n; i++) {
            const ethread &t = r->th[i];
            if (t.state == TS_DONE) continue;
            all_done = false;
            live++;
            if (t.state == TS_BLOCK_BAR) {
                at_block++;
                agg_or |= t.pred != 0;
                agg_and &= t.pred != 0;
                count += t.pred != 0;
            }
        }
        if (all_done) break;
        if (at_block == live) {
            for (int i = 0; i < r->n; i++) {
                ethread &t = r->th[i];
                if (t.state != TS_BLOCK_BAR) continue;
                t.state = TS_RUN;
                t.pred = t.bar_kind == 1 ? agg_or : t.bar_kind == 2 ? agg_and : t.bar_kind == 3 ? count : 0;
            }
            continue;
        }
        deadlock(at_block ? "__syncthreads() while other threads wait in a warp primitive or exited"
                          : "a warp primitive that the rest of the warp never reaches");
    }
}

int block_bar(int kind, int pred) {
    block_run *r = g_run;
    ethread &t = r->th[r->cur];
    t.bar_kind = kind;
    t.pred = pred;
    wait_as(TS_BLOCK_BAR);
    return g_run->th[g_run->cur].pred;
}

} // namespace

void __syncthreads() { block_bar(0, 0); }
int __syncthreads_or(int p) { return block_bar(1, p); }
int __syncthreads_and(int p) { return block_bar(2, p); }
int __syncthreads_count(int p) { return block_bar(3, p); }
void __syncwarp(unsigned) { wait_as(TS_WARP_BAR); }
void __threadfence() {}
void __threadfence_block() {}

int cmi_emu_lane() { return g_run->cur & 31; }

unsigned __activemask() {
    block_run *r = g_run;
    const int lo = r->cur & ~31;
    unsigned m = 0;
    for (int i = lo; i < lo + 32 && i < r->n; i++)
        if (r->th[i].state != TS_DONE) m |= 1u << (i - lo);
    return m;
}

uint64_t cmi_emu_warp_exchange(uint64_t v, int src_lane) {
    block_run *r = g_run;
    const int me = r->cur, g = r->th[me].gen & 1;
    r->th[me].gen++;
    r->xbuf[g][me] = v;
    wait_as(TS_WARP_BAR);
    const int src = (me & ~31) + src_lane;
    return (src_lane >= 0 && src_lane < 32 && src < r->n) ? r->xbuf[g][src] : v;
}

static float bf16_lo(uint32_t w) {
    const uint32_t u = (w & 0xFFFFu) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static float bf16_hi(uint32_t w) {
    const uint32_t u = w & 0xFFFF0000u;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void cmi_emu_mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    block_run *r = g_run;
    const int me = r->cur, g = r->th[me].gen & 1, lo = me & ~31;
    r->th[me].gen++;
    for (int i = 0; i < 4; i++) r->mbuf[g][me][i] = a[i];
    r->mbuf[g][me][4] = b[0];
    r->mbuf[g][me][5] = b[1];
    wait_as(TS_WARP_BAR);
    /* the whole A (16x16) and B (16x8) from the warp's fragments: lane L = 4 gL + tL holds
     * a: (gL, 2tL..+1), (gL+8, 2tL..+1), (gL, 2tL+8..+9), (gL+8, 2tL+8..+9); b: (2tL..+1, gL),
     * (2tL+8..+9, gL); the lower-index element in the lower half of each register */
    float A[16][16], B[16][8];
    for (int L = 0; L < 32; L++) {
        const uint32_t *f = r->mbuf[g][lo + L];
        const int gl = L >> 2, tl = L & 3;
        for (int i = 0; i < 4; i++) {
            const int row = gl + (i & 1) * 8, col = 2 * tl + (i >> 1) * 8;
            A[row][col] = bf16_lo(f[i]);
            A[row][col + 1] = bf16_hi(f[i]);
        }
        for (int i = 0; i < 2; i++) {
            B[2 * tl + i * 8][gl] = bf16_lo(f[4 + i]);
            B[2 * tl + i * 8 + 1][gl] = bf16_hi(f[4 + i]);
        }
    }
    /* this lane's D: (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1) */
    const int gm = (me - lo) >> 2, tm = (me - lo) & 3;
    for (int i = 0; i < 4; i++) {
        const int row = gm + (i >> 1) * 8, col = 2 * tm + (i & 1);
        float acc = c[i];
        for (int k = 0; k < 16; k++) acc += A[row][k] * B[k][col];
        d[i] = acc;
    }
}

unsigned cmi_emu_warp_ballot(int pred) {
    block_run *r = g_run;
    const int me = r->cur, g = r->th[me].gen & 1, lo = me & ~31;
    r->th[me].gen++;
    r->xbuf[g][me] = pred != 0;
    wait_as(TS_WARP_BAR);
    unsigned m = 0;
    for (int i = lo; i < lo + 32 && i < r->n; i++)
        if (r->th[i].state != TS_DONE && r->xbuf[g][i]) m |= 1u << (i - lo);
    return m;
}

void cmi_emu_check_aligned(const void *p, size_t align, const char *what) {
    if ((uintptr_t)p % align == 0) return;
    fprintf(stderr,
            "cuda_emu: misaligned address in block (%u, %u, %u), thread (%u, %u, %u): %s needs %zu-byte "
            "alignment, got %p (on a GPU: cudaErrorMisalignedAddress)\n",
            blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z, what, align, p);
    abort();
}

void cmi_emu_cp_async16(void *smem, const void *gmem) {
    cmi_emu_check_aligned(smem, 16, "cp.async's shared-memory destination");
    cmi_emu_check_aligned(gmem, 16, "cp.async's global source");
    if (!cp_async_late()) {
        memcpy(smem, gmem, 16);
        return;
    }
    ethread &t = g_run->th[g_run->cur];
    pending_copy c;
    c.dst = smem;
    memcpy(c.bytes, gmem, 16);
    c.group = t.cp_group;
    t.cp_pending.push_back(c);
}

void cmi_emu_cp_async_commit() { g_run->th[g_run->cur].cp_group++; }

void cmi_emu_cp_async_wait(int n) {
    ethread &t = g_run->th[g_run->cur];
    /* groups 0 .. cp_group-1 are committed; all but the newest n must have landed (copies issued
     * after the last commit belong to no committed group and wait for a later one) */
    const int done_below = t.cp_group - n;
    size_t keep = 0;
    for (size_t i = 0; i < t.cp_pending.size(); i++) {
        pending_copy &c = t.cp_pending[i];
        if (c.group < done_below) memcpy(c.dst, c.bytes, 16);
        else t.cp_pending[keep++] = c;
    }
    t.cp_pending.resize(keep);
}

void *cmi_emu_dyn_smem() { return g_run->smem.data(); }

void cmi_emu_launch(dim3 grid, dim3 block, size_t smem, const std::function<void()> &body) {
    const uint64_t nthreads = (uint64_t)block.x * block.y * block.z;
    if (nthreads == 0 || nthreads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
        grid.y > 65535 || grid.z > 65535 || smem > (size_t)227 << 10) {
        g_last = cudaErrorInvalidConfiguration;
        return;
    }
    access_scope open;
    if (g_run) {
        fprintf(stderr, "cuda_emu: a kernel launched another kernel (not supported)\n");
        abort();
    }
    block_run *prev = g_run;
    /* One scheduler per OS thread, kept with its thread stacks across launches (a stack per
     * emulated thread is 256 KiB: allocating them per launch dominated the run time). */
    static thread_local block_run *pool;
    if (!pool) pool = new block_run();
    block_run *r = pool;
    if (r->th.size() < nthreads) {
        const size_t old = r->th.size();
        r->th.resize(nthreads);
        for (size_t i = old; i < nthreads; i++) r->th[i].stack = nullptr;
    }
    r->n = (int)nthreads;
    r->body = &body;
    r->smem.assign(smem ? smem : 16, 0);
    g_run = r;
    const dim3 save_bd = blockDim, save_gd = gridDim;
    const uint3 save_bi = blockIdx, save_ti = threadIdx;
    blockDim = block;
    gridDim = grid;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = uint3{x, y, z};
                run_block();
            }
    g_run = prev;
    blockDim = save_bd;
    gridDim = save_gd;
    blockIdx = save_bi;
    threadIdx = save_ti;
}

/* ---- half ---- */

float cmi_emu_half2float(unsigned short h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0) {
        if (m == 0) u = sign;
        else {
            e = 113;
            while (!(m & 0x400u)) {
                m <<= 1;
                e--;
            }
            u = sign | (e << 23) | ((m & 0x3ffu) << 13);
        }
    } else if (e == 31) u = sign | 0x7f800000u | (m << 13);
    else u = sign | ((e + 112) << 23) | (m << 13);
    return __uint_as_float(u);
}

unsigned short cmi_emu_float2half(float x) {
    uint32_t u = __float_as_uint(x), sign = (u >> 16) & 0x8000u, absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return (unsigned short)(sign | 0x7e00u);
    if (absu >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);
    if (absu < 0x38800000u) {
        if (absu < 0x33000000u) return (unsigned short)sign;
        uint32_t e = absu >> 23, m = (absu & 0x7fffffu) | 0x800000u, shift = 126 - e;
        uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1), r = m >> shift;
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (unsigned short)(sign | r);
    }
    uint32_t r = (absu - 0x38000000u) >> 13, rem = absu & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (unsigned short)(sign | r);
}

/* ---- runtime ---- */

static cudaError_t set_err(cudaError_t e) {
    if (e != cudaSuccess) g_last = e;
    return e;
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotReady: return "device not ready";
    default: return "unknown error";
    }
}
const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    default: return "cudaErrorUnknown";
    }
}
cudaError_t cudaGetLastError() {
    cudaError_t e = g_last;
    g_last = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError() { return g_last; }
cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : set_err(cudaErrorInvalidDevice); }
cudaError_t cudaGetDevice(int *d) {
    *d = 0;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d) {
    if (d != 0) return set_err(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "CUDA emulator (CPU)");
    p->totalGlobalMem = dev_total();
    p->sharedMemPerBlock = 48 << 10;
    p->sharedMemPerBlockOptin = 227 << 10;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 2; /* small grids: the emulator runs every thread of every block */
    p->l2CacheSize = 1 << 20;
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int *v) {
    *v = 13000;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v) {
    *v = 13000;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
    *p = nullptr;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), len = ((bytes ? bytes : 1) + page - 1) / page * page;
    std::lock_guard<std::mutex> lk(g_mem_mu);
    if (g_dev_used + len > dev_total()) return set_err(cudaErrorMemoryAllocation);
    if (!g_heap) {
        void *h = mmap(nullptr, dev_total(), protect_on() ? PROT_NONE : PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (h == MAP_FAILED) return set_err(cudaErrorMemoryAllocation);
        g_heap = (char *)h;
    }
    char *m = nullptr;
    for (size_t i = 0; i < g_free.size(); i++) { /* first fit among freed pieces */
        if (g_free[i].len < len) continue;
        m = g_free[i].p;
        g_free[i].p += len;
        g_free[i].len -= len;
        if (!g_free[i].len) g_free.erase(g_free.begin() + (long)i);
        break;
    }
    if (!m) {
        if (g_heap_top + len > dev_total()) return set_err(cudaErrorMemoryAllocation);
        m = g_heap + g_heap_top;
        g_heap_top += len;
        /* new pages take the heap's current state: open inside a kernel or copy, else closed */
        if (protect_on()) mprotect(m, len, g_kernel_depth ? PROT_READ | PROT_WRITE : PROT_NONE);
    }
    g_regions.push_back(region{m, len});
    g_dev_used += len;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    std::lock_guard<std::mutex> lk(g_mem_mu);
    for (size_t i = 0; i < g_regions.size(); i++) {
        if (g_regions[i].p != p) continue;
        g_dev_used -= g_regions[i].len;
        g_free.push_back(g_regions[i]);
        g_regions.erase(g_regions.begin() + (long)i);
        return cudaSuccess;
    }
    return set_err(cudaErrorInvalidValue);
}

bool cmi_emu_is_device_ptr(const void *p) {
    std::lock_guard<std::mutex> lk(g_mem_mu);
    for (const region &r : g_regions)
        if ((const char *)p >= r.p && (const char *)p < r.p + r.len) return true;
    return false;
}

cudaError_t cudaMallocHost(void **p, size_t bytes) {
    *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    return *p ? cudaSuccess : set_err(cudaErrorMemoryAllocation);
}
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned) { return cudaMallocHost(p, bytes); }
cudaError_t cudaFreeHost(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    std::lock_guard<std::mutex> lk(g_mem_mu);
    *total = dev_total();
    *free_bytes = dev_total() - g_dev_used;
    return cudaSuccess;
}

/* Checks the direction of a copy against where the pointers live: the emulator catches a host
 * pointer passed as device memory and the other way round. */
static bool check_side(const void *p, bool device, size_t bytes) {
    if (!bytes) return true;
    return cmi_emu_is_device_ptr(p) == device;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    if (!bytes) return cudaSuccess;
    bool ok = true;
    switch (kind) {
    case cudaMemcpyHostToDevice: ok = check_side(dst, true, bytes) && check_side(src, false, bytes); break;
    case cudaMemcpyDeviceToHost: ok = check_side(dst, false, bytes) && check_side(src, true, bytes); break;
    case cudaMemcpyDeviceToDevice: ok = check_side(dst, true, bytes) && check_side(src, true, bytes); break;
    case cudaMemcpyHostToHost: ok = check_side(dst, false, bytes) && check_side(src, false, bytes); break;
    default: break;
    }
    if (!ok) {
        fprintf(stderr, "cuda_emu: cudaMemcpy of %zu bytes (kind %d) with a pointer on the wrong side\n", bytes,
                (int)kind);
        return set_err(cudaErrorInvalidValue);
    }
    access_scope open;
    memmove(dst, src, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
    return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemset(void *p, int v, size_t bytes) {
    if (bytes && !cmi_emu_is_device_ptr(p)) {
        fprintf(stderr, "cuda_emu: cudaMemset on a host pointer\n");
        return set_err(cudaErrorInvalidValue);
    }
    access_scope open;
    memset(p, v, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t) { return cudaMemset(p, v, bytes); }
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

struct cmi_emu_stream {
    int dummy;
};
struct cmi_emu_event {
    double t;
};

static double now_ms() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) {
    *s = new cmi_emu_stream();
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) { return cudaStreamCreate(s); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }
cudaError_t cudaEventCreate(cudaEvent_t *e) {
    *e = new cmi_emu_event();
    (*e)->t = now_ms();
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
    e->t = now_ms();
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    *ms = (float)(b->t - a->t);
    return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void *, cudaFuncAttribute, int v) {
    return v <= (227 << 10) ? cudaSuccess : set_err(cudaErrorInvalidValue);
}

cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *attr, const void *) {
    *attr = cudaFuncAttributes{90, 90, 0, 227 << 10};
    return cudaSuccess;
}

/* ---- cuBLASLt (cublaslt_emu.h) ---- */

#include "cublaslt_emu.h"

static size_t lt_esize(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

/* Element of a stored matrix as float. */
static float lt_load(cudaDataType_t t, const void *p, int64_t i) {
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    const unsigned short h = ((const unsigned short *)p)[i];
    return t == CUDA_R_16BF ? __uint_as_float((unsigned)h << 16) : cmi_emu_half2float(h);
}

static float tf32(float x) { /* round to nearest even on 10 mantissa bits, as the tensor cores read f32 */
    unsigned u = __float_as_uint(x);
    if ((u & 0x7f800000u) == 0x7f800000u) return x;
    u = (u + 0xfffu + ((u >> 13) & 1u)) & 0xffffe000u;
    return __uint_as_float(u);
}

cublasStatus_t cmi_emu_lt_check(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D) {
    const uint64_t m = D->rows, n = D->cols;
    const uint64_t am = d->ta == CUBLAS_OP_N ? A->rows : A->cols, ak = d->ta == CUBLAS_OP_N ? A->cols : A->rows;
    const uint64_t bk = d->tb == CUBLAS_OP_N ? B->rows : B->cols, bn = d->tb == CUBLAS_OP_N ? B->cols : B->rows;
    if (am != m || bn != n || ak != bk || C->rows != m || C->cols != n) {
        fprintf(stderr, "cublaslt_emu: dimensions do not match: D %llux%llu, op(A) %llux%llu, op(B) %llux%llu\n",
                (unsigned long long)m, (unsigned long long)n, (unsigned long long)am, (unsigned long long)ak,
                (unsigned long long)bk, (unsigned long long)bn);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const cublasLtMatrixLayout_t all[4] = {A, B, C, D};
    for (const cublasLtMatrixLayout_t l : all) {
        if (l->ld < (int64_t)(l->rows ? l->rows : 1)) {
            fprintf(stderr, "cublaslt_emu: leading dimension %lld < rows %llu\n", (long long)l->ld,
                    (unsigned long long)l->rows);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        if (l->batch != D->batch) return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (C->type != CUDA_R_32F || D->type != CUDA_R_32F || A->type != B->type) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (d->epilogue != CUBLASLT_EPILOGUE_DEFAULT && d->epilogue != CUBLASLT_EPILOGUE_BIAS)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (d->epilogue == CUBLASLT_EPILOGUE_BIAS && (!d->bias || d->bias_type != CUDA_R_32F))
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t Ad, const void *B, cublasLtMatrixLayout_t Bd, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cd, void *D, cublasLtMatrixLayout_t Dd,
                              const cublasLtMatmulAlgo_t *, void *, size_t, cudaStream_t) {
    cublasStatus_t s = cmi_emu_lt_check(d, Ad, Bd, Cd, Dd);
    if (s) return s;
    const int64_t m = (int64_t)Dd->rows, n = (int64_t)Dd->cols, k = (int64_t)(d->ta == CUBLAS_OP_N ? Ad->cols : Ad->rows);
    if (m && n && ((k && (!cmi_emu_is_device_ptr(A) || !cmi_emu_is_device_ptr(B))) || !cmi_emu_is_device_ptr(D) ||
                   !cmi_emu_is_device_ptr(C) || (d->bias && !cmi_emu_is_device_ptr(d->bias)))) {
        fprintf(stderr, "cublaslt_emu: a matrix pointer is not device memory\n");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const float al = *(const float *)alpha, be = *(const float *)beta;
    const bool tf = d->compute == CUBLAS_COMPUTE_32F_FAST_TF32 && Ad->type == CUDA_R_32F;
    access_scope open;
    for (int32_t bt = 0; bt < Dd->batch; bt++) {
        const char *a = (const char *)A + (size_t)(bt * Ad->batch_stride) * lt_esize(Ad->type);
        const char *b = (const char *)B + (size_t)(bt * Bd->batch_stride) * lt_esize(Bd->type);
        const float *c = (const float *)C + bt * Cd->batch_stride;
        float *dd = (float *)D + bt * Dd->batch_stride;
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < m; i++) {
                float acc = 0.0f;
                for (int64_t p = 0; p < k; p++) {
                    const int64_t ai = d->ta == CUBLAS_OP_N ? i + p * Ad->ld : p + i * Ad->ld;
                    const int64_t bi = d->tb == CUBLAS_OP_N ? p + j * Bd->ld : j + p * Bd->ld;
                    float x = lt_load(Ad->type, a, ai), y = lt_load(Bd->type, b, bi);
                    if (tf) x = tf32(x), y = tf32(y);
                    acc += x * y;
                }
                float v = al * acc + (be != 0.0f ? be * c[i + j * Cd->ld] : 0.0f);
                if (d->epilogue == CUBLASLT_EPILOGUE_BIAS) v += ((const float *)d->bias)[i];
                dd[i + j * Dd->ld] = v;
            }
    }
    return CUBLAS_STATUS_SUCCESS;
}
