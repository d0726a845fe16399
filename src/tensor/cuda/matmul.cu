/* GEMMs through cuBLASLt (backend.h slot gemm): row-major C = op(A)·op(B) [+ bias] [+ C], f32 or
 * bf16 operands with f32 accumulation and an f32 result, optionally a strided batch.
 *
 * cuBLASLt is column-major: a row-major (M, N) matrix with leading dimension ldc is the column-major
 * (N, M) matrix Cᵀ with the same ld, and Cᵀ = op(B)ᵀ·op(A)ᵀ. So cuBLASLt's A is our B and its B is
 * our A, with m = N, n = M, k = K; a row-major operand that is not transposed is, read column-major,
 * exactly the transpose the product needs (op N), and a transposed one needs op T. The bias (one per
 * column of our C) is one per row of Cᵀ: the BIAS epilogue.
 *
 * f32 GEMMs run in full f32 (CUBLAS_COMPUTE_32F) unless CM_CUDA_TF32=1 asks for TF32 tensor cores
 * (PyTorch's torch.backends.cuda.matmul.allow_tf32 is off by default too). A 32 MiB workspace, the
 * size cuBLAS recommends for Hopper. Descriptors are made per call (tens of microseconds next to
 * GEMMs of a training step); the heuristic is told each pointer's actual alignment, so views at odd
 * offsets get an algorithm that can read them. */
#include "tensor/cuda/common.cuh"

#ifdef CMI_CUDA_EMU
#include "tensor/cuda/emu/cublaslt_emu.h"
#else
#include <cublasLt.h>
#include <dlfcn.h>
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <mutex>

/* cuBLASLt's entry points, called through this table. A CUDA build opens the library on the first
 * GEMM (dlopen) instead of linking it: linked, its static initialisers ran in every process that
 * loads the library, GPU or not — about 0.3 s and 200 MB of resident memory for every `composer`
 * command and every rank of a CPU run. On the emulator the table holds the emulated functions. */
#define LT_FUNCTIONS(X)                                                                                     \
    X(Create) X(Destroy) X(MatmulDescCreate) X(MatmulDescDestroy) X(MatmulDescSetAttribute)                 \
    X(MatrixLayoutCreate) X(MatrixLayoutDestroy) X(MatrixLayoutSetAttribute) X(MatmulPreferenceCreate)      \
    X(MatmulPreferenceDestroy) X(MatmulPreferenceSetAttribute) X(MatmulAlgoGetHeuristic) X(Matmul)
struct lt_api {
#define LT_MEMBER(f) decltype(&cublasLt##f) f;
    LT_FUNCTIONS(LT_MEMBER)
#undef LT_MEMBER
};
static lt_api g_api;
static const char *g_api_from = nullptr; /* the library opened, or the emulator */
static std::mutex g_api_mu;

#ifndef CMI_CUDA_EMU
/* CM_CUBLASLT_PATH when set (a cuBLASLt of the same major version elsewhere, such as a pip wheel's),
 * else the library the build was configured with (its soname) as the dynamic loader finds it, then
 * in the toolkit's folder found at configure time. *what names what was tried. */
#ifndef CMI_CUBLASLT_SONAME
#error "CMI_CUBLASLT_SONAME is set by CMakeLists.txt (libcublasLt.so.<CUDA major>)"
#endif
static void *lt_open(const char **what, char *err, size_t cap) {
    const char *env = getenv("CM_CUBLASLT_PATH");
    const char *where[2] = {CMI_CUBLASLT_SONAME, CMI_CUBLASLT_DIR "/" CMI_CUBLASLT_SONAME};
    int n = 2;
    if (env && env[0]) where[0] = env, n = 1;
    err[0] = '\0';
    *what = where[0];
    for (int i = 0; i < n; i++) {
        void *h = dlopen(where[i], RTLD_NOW | RTLD_LOCAL);
        if (h) {
            *what = where[i];
            return h;
        }
        const char *e = dlerror();
        if (!err[0]) snprintf(err, cap, "%s", e ? e : where[i]);
    }
    return nullptr;
}
#endif

extern "C" cm_status cmi_cuda_blas_load(const char **from) {
    std::lock_guard<std::mutex> lk(g_api_mu);
    if (!g_api_from) {
#ifdef CMI_CUDA_EMU
#define LT_SET(f) g_api.f = cublasLt##f;
        LT_FUNCTIONS(LT_SET)
#undef LT_SET
        g_api_from = "the CUDA emulator";
#else
        char err[512];
        const char *what = nullptr;
        void *h = lt_open(&what, err, sizeof err);
        if (!h)
            return cm_set_error(CM_ERR_DEVICE,
                                "cuda: cannot open cuBLASLt (%s): %s; install the CUDA toolkit's cuBLAS libraries, "
                                "add their folder to LD_LIBRARY_PATH or name the library in CM_CUBLASLT_PATH",
                                what, err);
        lt_api a;
#define LT_SYM(f)                                                                                                 \
        if (!(a.f = (decltype(a.f))dlsym(h, "cublasLt" #f))) {                                                    \
            dlclose(h);                                                                                           \
            return cm_set_error(CM_ERR_DEVICE, "cuda: %s has no cublasLt" #f " (this library was built against " \
                                               "%s)", what, CMI_CUBLASLT_SONAME);                                   \
        }
        LT_FUNCTIONS(LT_SYM)
#undef LT_SYM
        static char opened[512];
        snprintf(opened, sizeof opened, "%s", what);
        g_api = a; /* the handle stays open for the life of the process */
        g_api_from = opened;
#endif
    }
    if (from) *from = g_api_from;
    return CM_OK;
}

struct lt_state {
    cublasLtHandle_t h = nullptr;
    void *ws = nullptr;
    size_t ws_bytes = 0;
    bool tf32 = false;
};

/* cublasGetStatusString lives in libcublas, which we do not link (only cuBLASLt). */
static const char *lt_status_str(cublasStatus_t s) {
    switch ((int)s) {
    case 0: return "CUBLAS_STATUS_SUCCESS";
    case 1: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case 3: return "CUBLAS_STATUS_ALLOC_FAILED";
    case 7: return "CUBLAS_STATUS_INVALID_VALUE";
    case 8: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case 11: return "CUBLAS_STATUS_MAPPING_ERROR";
    case 13: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case 14: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case 15: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case 16: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_(unknown)";
    }
}

static lt_state g_lt;
static std::mutex g_lt_mu;

static cm_status lt_init(void) {
    std::lock_guard<std::mutex> lk(g_lt_mu);
    if (g_lt.h) return CM_OK;
    cm_status ls = cmi_cuda_blas_load(nullptr);
    if (ls) return ls;
    cublasStatus_t s = g_api.Create(&g_lt.h);
    if (s != CUBLAS_STATUS_SUCCESS)
        return cm_set_error(CM_ERR_DEVICE, "cuda: cublasLtCreate failed: %s", lt_status_str(s));
    g_lt.ws_bytes = (size_t)32 << 20;
    g_lt.ws = cmi_cuda_alloc(g_lt.ws_bytes);
    if (!g_lt.ws) {
        g_api.Destroy(g_lt.h);
        g_lt.h = nullptr;
        return cm_last_status();
    }
    const char *e = getenv("CM_CUDA_TF32");
    g_lt.tf32 = e && e[0] == '1';
    return CM_OK;
}

static uint32_t alignment_of(const void *p) {
    const uintptr_t u = (uintptr_t)p;
    uint32_t a = 256;
    while (a > 1 && (u % a)) a >>= 1;
    return a;
}

/* cuBLASLt's fast (tensor-core, vectorised) kernels read rows with 16-byte loads: a matrix whose
 * base, leading dimension or batch stride is not a multiple of 16 bytes gets an "align1" kernel
 * instead, and so does a GEMM whose M, N or K is not a multiple of a 16-byte vector (8 bf16, 4 f32),
 * since a row's last vector would straddle its end — on the H200, Turing-era cutlass_75 kernels for
 * GPT-2's LM head, whose 50257 columns make every row of the logits and of their gradient misaligned
 * and K of the input gradient odd (6.7 ms for the logits' GEMM, 0.3 ms a block of the input
 * gradient's, seen with ncu). Such an operand is copied into a scratch matrix whose rows are padded
 * to 16 bytes, and a large GEMM's odd dimensions are padded with zeros (zeros along K add nothing;
 * the extra rows and columns of C are computed and dropped); C is copied back afterwards. A pass
 * over memory, small next to the GEMM it speeds up. */
struct lt_mat {
    const void *p;
    int64_t ld, stride;   /* as the caller gave them */
    int64_t rows, cols;   /* stored row-major: rows x cols, row i at p + i·ld */
    int64_t prows = 0, pcols = 0; /* the padded problem's (>= rows, cols: zeros beyond them) */
    void *pad = nullptr;  /* the padded copy, or NULL */
    int64_t pld = 0, pstride = 0;
};

static bool lt_misaligned(const lt_mat &m, int64_t batch, size_t es) {
    return (uintptr_t)m.p % 16 || (m.ld * (int64_t)es) % 16 || (batch > 1 && (m.stride * (int64_t)es) % 16) ||
           m.prows != m.rows || m.pcols != m.cols;
}

/* Makes m's padded copy (prows x pcols, rows 16-byte aligned; copying the values in when `in`, with
 * zeros beyond rows x cols then: an operand's padding along K must add nothing, and C's is read when
 * the GEMM accumulates; a C the GEMM overwrites needs no fill). */
static cm_status lt_pad(lt_mat &m, int64_t batch, cm_dtype dt, bool in) {
    const size_t es = cm_dtype_size(dt);
    const int64_t q = 16 / (int64_t)es;
    m.pld = (m.pcols + q - 1) / q * q;
    m.pstride = m.prows * m.pld;
    m.pad = cmi_cuda_alloc((size_t)(batch * m.pstride) * es);
    if (!m.pad) return cm_last_status();
    if (in && (m.prows != m.rows || m.pcols != m.cols)) {
        const int64_t n = batch * m.pstride, one = 1;
        cm_status st = cmi_cuda_fill(m.pad, dt, 1, &n, &one, 0.0);
        if (st) return st;
    }
    if (!in) return CM_OK;
    const int64_t shape[3] = {batch, m.rows, m.cols}, dst[3] = {m.pstride, m.pld, 1}, src[3] = {m.stride, m.ld, 1};
    return cmi_cuda_copy(m.pad, dt, dst, m.p, dt, src, 3, shape);
}

/* A dimension worth padding: a large GEMM (the copies are small next to it) and a dimension long
 * enough that the padding adds little work. */
static int64_t lt_pad_dim(int64_t d, int64_t q, bool large) { return large && d >= 64 ? (d + q - 1) / q * q : d; }

/* Calls cublasLt<f>(...) through the table; a failure names the call, its status and the GEMM. */
#define LT_TRY(f, ...)                                                                                      \
    do {                                                                                                    \
        cublasStatus_t s_ = g_api.f(__VA_ARGS__);                                                           \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                  \
            st = cm_set_error(CM_ERR_DEVICE, "cuda: cublasLt" #f ": %s (GEMM M=%lld N=%lld K=%lld, %s)",    \
                              lt_status_str(s_), (long long)M, (long long)N, (long long)K, cm_dtype_name(dt)); \
            goto done;                                                                                      \
        }                                                                                                   \
    } while (0)

extern "C" cm_status cmi_cuda_gemm(cm_dtype dt, int64_t M, int64_t N, int64_t K, const void *a, int64_t lda, bool ta,
                                   const void *b, int64_t ldb, bool tb, const float *bias, bool acc, float *c,
                                   int64_t ldc, int64_t batch, int64_t sa, int64_t sb, int64_t sc) {
    if (M == 0 || N == 0 || batch == 0) return CM_OK;
    cm_status st = lt_init();
    if (st) return st;
    if (dt != CM_DTYPE_F32 && dt != CM_DTYPE_BF16)
        return cm_set_error(CM_ERR_DTYPE, "cuda gemm: dtype %s (f32 or bf16)", cm_dtype_name(dt));
    if (K == 0) { /* C = bias or 0 (acc: C += bias): no GEMM to run */
        for (int64_t i = 0; i < batch && st == CM_OK; i++) {
            float *ci = c + i * sc;
            int64_t shape[2] = {M, N}, dst[2] = {ldc, 1}, bst[2] = {0, 1};
            if (!acc) st = cmi_cuda_fill(ci, CM_DTYPE_F32, 2, shape, dst, 0.0);
            if (!st && bias) st = cmi_cuda_copy_add(ci, dst, bias, bst, 2, shape);
        }
        return st;
    }
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    /* the operands as stored (row-major): a is (M, K) or, transposed, (K, M); b (K, N) or (N, K) */
    lt_mat ma = {a, lda, sa, ta ? K : M, ta ? M : K}, mb = {b, ldb, sb, tb ? N : K, tb ? K : N},
           mc = {c, ldc, sc, M, N};
    const size_t es = cm_dtype_size(dt);
    const int64_t q = 16 / (int64_t)es;
    const bool large = (double)M * (double)N * (double)K >= 67108864.0;
    const int64_t Mp = lt_pad_dim(M, q, large), Np = lt_pad_dim(N, q, large), Kp = lt_pad_dim(K, q, large);
    float *bias_pad = nullptr;
    ma.prows = ta ? Kp : Mp, ma.pcols = ta ? Mp : Kp;
    mb.prows = tb ? Np : Kp, mb.pcols = tb ? Kp : Np;
    mc.prows = Mp, mc.pcols = Np;
    if (bias && Np != N) { /* the bias, one per column, with zeros for the padded columns */
        const int64_t n = Np, one = 1, shape[1] = {N}, st1[1] = {1};
        if (!(bias_pad = (float *)cmi_cuda_alloc(sizeof(float) * (size_t)Np))) {
            st = cm_last_status();
            goto done;
        }
        if ((st = cmi_cuda_fill(bias_pad, CM_DTYPE_F32, 1, &n, &one, 0.0))) goto done;
        if ((st = cmi_cuda_copy(bias_pad, CM_DTYPE_F32, st1, bias, CM_DTYPE_F32, st1, 1, shape))) goto done;
        bias = bias_pad;
    }
    if (lt_misaligned(ma, batch, es)) {
        if ((st = lt_pad(ma, batch, dt, true))) goto done;
        a = ma.pad, lda = ma.pld, sa = ma.pstride;
    }
    if (lt_misaligned(mb, batch, es)) {
        if ((st = lt_pad(mb, batch, dt, true))) goto done;
        b = mb.pad, ldb = mb.pld, sb = mb.pstride;
    }
    if (lt_misaligned(mc, batch, sizeof(float))) {
        if ((st = lt_pad(mc, batch, CM_DTYPE_F32, acc))) goto done;
        c = (float *)mc.pad, ldc = mc.pld, sc = mc.pstride;
    }
    {
    const cudaDataType_t ty = dt == CM_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t ct =
        dt == CM_DTYPE_F32 && g_lt.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cublasLtMatmulHeuristicResult_t heur[1];
    int found = 0;
    const float alpha = 1.0f, beta = acc ? 1.0f : 0.0f;
    /* column-major: m = N, n = M; cuBLASLt's A = our B (op T when tb), its B = our A (op T when ta) */
    const int32_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    /* (the padded problem; errors name the caller's M, N, K) */
    const uint64_t m = (uint64_t)Np, n = (uint64_t)Mp, k = (uint64_t)Kp;
    LT_TRY(MatmulDescCreate, &desc, ct, CUDA_R_32F);
    LT_TRY(MatmulDescSetAttribute, desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    LT_TRY(MatmulDescSetAttribute, desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    if (bias) {
        const uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
        const int32_t bt = CUDA_R_32F;
        LT_TRY(MatmulDescSetAttribute, desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
        LT_TRY(MatmulDescSetAttribute, desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
        LT_TRY(MatmulDescSetAttribute, desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
    }
    /* stored shapes: op N stores (rows, cols) = (m, k) for A and (k, n) for B; op T the transpose */
    LT_TRY(MatrixLayoutCreate, &la, ty, opa == CUBLAS_OP_N ? m : k, opa == CUBLAS_OP_N ? k : m, ldb);
    LT_TRY(MatrixLayoutCreate, &lb, ty, opb == CUBLAS_OP_N ? k : n, opb == CUBLAS_OP_N ? n : k, lda);
    LT_TRY(MatrixLayoutCreate, &lc, CUDA_R_32F, m, n, ldc);
    if (batch > 1) {
        const int32_t bc = (int32_t)batch;
        LT_TRY(MatrixLayoutSetAttribute, la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc);
        LT_TRY(MatrixLayoutSetAttribute, lb, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc);
        LT_TRY(MatrixLayoutSetAttribute, lc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc);
        LT_TRY(MatrixLayoutSetAttribute, la, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sb, sizeof sb);
        LT_TRY(MatrixLayoutSetAttribute, lb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sa, sizeof sa);
        LT_TRY(MatrixLayoutSetAttribute, lc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sc, sizeof sc);
    }
    LT_TRY(MatmulPreferenceCreate, &pref);
    {
        const uint64_t ws = g_lt.ws_bytes;
        const uint32_t al_a = alignment_of(b), al_b = alignment_of(a), al_c = alignment_of(c);
        LT_TRY(MatmulPreferenceSetAttribute, pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
        LT_TRY(MatmulPreferenceSetAttribute, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, 4);
        LT_TRY(MatmulPreferenceSetAttribute, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, 4);
        LT_TRY(MatmulPreferenceSetAttribute, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, 4);
        LT_TRY(MatmulPreferenceSetAttribute, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, 4);
    }
    LT_TRY(MatmulAlgoGetHeuristic, g_lt.h, desc, la, lb, lc, lc, pref, 1, heur, &found);
    if (found < 1) {
        st = cm_set_error(CM_ERR_DEVICE, "cuda: cuBLASLt has no algorithm for GEMM M=%lld N=%lld K=%lld (%s, lda %lld, "
                                         "ldb %lld, ldc %lld)",
                          (long long)M, (long long)N, (long long)K, cm_dtype_name(dt), (long long)lda, (long long)ldb,
                          (long long)ldc);
        goto done;
    }
    LT_TRY(Matmul, g_lt.h, desc, &alpha, b, la, a, lb, &beta, c, lc, c, lc, &heur[0].algo, g_lt.ws,
           g_lt.ws_bytes, cmi_cuda_stream());
    st = cmi_cuda_launched("gemm");
    if (!st && mc.pad) { /* the padded result's first M x N into the caller's C */
        const int64_t shape[3] = {batch, M, N}, dst[3] = {mc.stride, mc.ld, 1}, src[3] = {sc, ldc, 1};
        st = cmi_cuda_copy((void *)mc.p, CM_DTYPE_F32, dst, c, CM_DTYPE_F32, src, 3, shape);
    }
    }
done:
    if (pref) g_api.MatmulPreferenceDestroy(pref);
    if (lc) g_api.MatrixLayoutDestroy(lc);
    if (lb) g_api.MatrixLayoutDestroy(lb);
    if (la) g_api.MatrixLayoutDestroy(la);
    if (desc) g_api.MatmulDescDestroy(desc);
    if (ma.pad) cmi_cuda_free(ma.pad);
    if (mb.pad) cmi_cuda_free(mb.pad);
    if (mc.pad) cmi_cuda_free(mc.pad);
    if (bias_pad) cmi_cuda_free(bias_pad);
    return st;
}

/* ---- the tensor cores' fragment layout, checked (backend.h slot check_mma) ---- */

/* One warp: A (16x16) and B (16x8) as bf16 bits, C (16x8) f32, row-major; each lane gathers its
 * fragments by the layout cmi_mma_16816 documents and scatters its D back by it. */
__global__ void k_mma_check(const uint16_t *A, const uint16_t *B, const float *C, float *D) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    uint32_t a[4], b[2];
    float c[4], d[4];
    for (int i = 0; i < 4; i++) {
        const int row = g + (i & 1) * 8, col = 2 * t + (i >> 1) * 8;
        a[i] = (uint32_t)A[row * 16 + col] | ((uint32_t)A[row * 16 + col + 1] << 16);
    }
    for (int i = 0; i < 2; i++) {
        const int k = 2 * t + i * 8;
        b[i] = (uint32_t)B[k * 8 + g] | ((uint32_t)B[(k + 1) * 8 + g] << 16);
    }
    for (int i = 0; i < 4; i++) c[i] = C[(g + (i >> 1) * 8) * 8 + 2 * t + (i & 1)];
    cmi_mma_16816(d, a, b, c);
    for (int i = 0; i < 4; i++) D[(g + (i >> 1) * 8) * 8 + 2 * t + (i & 1)] = d[i];
}

/* One warp: the 16 x 16 bf16 tile T staged in shared memory with rows of 24 (as the attention
 * kernels pad theirs), read by cmi_ldsm_x4 and cmi_ldsm_x4_trans with lane l giving row l % 8 of
 * quadrant l / 8 (quadrant m at rows 8·(m % 2), columns 8·(m / 2)); each lane writes its 4 + 4
 * registers to R[8·lane ...]. */
__global__ void k_ldsm_check(const uint16_t *T, uint32_t *R) {
    __shared__ uint4 tile_[16 * 24 / 8]; /* 16-byte aligned rows */
    uint16_t *tile = (uint16_t *)tile_;
    const int lane = threadIdx.x & 31, m = lane >> 3;
    for (int e = lane; e < 256; e += 32) tile[e / 16 * 24 + e % 16] = T[e];
    __syncwarp();
    const uint16_t *row = tile + (8 * (m & 1) + (lane & 7)) * 24 + 8 * (m >> 1);
    uint32_t r[4], rt[4];
    cmi_ldsm_x4(r, row);
    cmi_ldsm_x4_trans(rt, row);
    for (int i = 0; i < 4; i++) R[8 * lane + i] = r[i], R[8 * lane + 4 + i] = rt[i];
}

/* The registers ldmatrix should give (common.cuh's description), against those it gave. */
static cm_status ldsm_compare(const uint16_t *T, const uint32_t *R) {
    for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < 8; i++) {
            const int m = i & 3, g = lane >> 2, t = lane & 3, r0 = 8 * (m & 1), c0 = 8 * (m >> 1);
            const bool tr = i >= 4;
            const uint32_t lo = tr ? T[(r0 + 2 * t) * 16 + c0 + g] : T[(r0 + g) * 16 + c0 + 2 * t];
            const uint32_t hi = tr ? T[(r0 + 2 * t + 1) * 16 + c0 + g] : T[(r0 + g) * 16 + c0 + 2 * t + 1];
            const uint32_t want = lo | hi << 16;
            if (R[8 * lane + i] != want)
                return cm_set_error(CM_ERR_INTERNAL,
                                    "cuda: ldmatrix%s gave lane %d register %d 0x%08x where the layout the attention "
                                    "kernels assume (common.cuh) says 0x%08x",
                                    tr ? ".trans" : "", lane, m, R[8 * lane + i], want);
        }
    return CM_OK;
}

extern "C" cm_status cmi_cuda_check_mma(double *max_rel_err) {
    cm_status st = CM_OK;
    void *dev = cmi_cuda_alloc(256 * 2 + 128 * 2 + 128 * 4 + 256 * 4); /* (brings the runtime up) */
    if (!dev) return cm_last_status();
    if (cmi_cuda_cc() < 80) {
        cmi_cuda_free(dev);
        return cm_set_error(CM_ERR_UNSUPPORTED, "cuda: bf16 mma needs compute capability 8.0 or later (this is %d.%d)",
                            cmi_cuda_cc() / 10, cmi_cuda_cc() % 10);
    }
    if (!cmi_cuda_kernel_has_mma((const void *)k_mma_check)) {
        cmi_cuda_free(dev);
        return cm_set_error(CM_ERR_UNSUPPORTED,
                            "cuda: this build's kernels were compiled for an architecture below sm_80 (no bf16 mma); "
                            "rebuild with -DCMAKE_CUDA_ARCHITECTURES=%d",
                            cmi_cuda_cc());
    }
    uint16_t ha[256], hb[128];
    float hc[128], hd[128];
    uint32_t x = 12345u;
    for (int i = 0; i < 256 + 128 + 128; i++) {
        x = x * 1664525u + 1013904223u;
        const float v = (float)((int)(x >> 9) % 2001 - 1000) / 250.0f; /* in [-4, 4], varied mantissas */
        uint32_t u;
        memcpy(&u, &v, 4);
        if (i < 256) ha[i] = (uint16_t)(u >> 16);
        else if (i < 384) hb[i - 256] = (uint16_t)(u >> 16);
        else hc[i - 384] = v;
    }
    uint16_t *dA = (uint16_t *)dev, *dB = dA + 256;
    float *dC = (float *)(dB + 128), *dD = dC + 128;
    cudaStream_t s = cmi_cuda_stream();
    cudaError_t e = cudaMemcpyAsync(dA, ha, sizeof ha, cudaMemcpyHostToDevice, s);
    if (e == cudaSuccess) e = cudaMemcpyAsync(dB, hb, sizeof hb, cudaMemcpyHostToDevice, s);
    if (e == cudaSuccess) e = cudaMemcpyAsync(dC, hc, sizeof hc, cudaMemcpyHostToDevice, s);
    if (e != cudaSuccess) st = cmi_cuda_fail(e, "cudaMemcpyAsync (mma check)");
    if (!st) {
        CMI_LAUNCH(k_mma_check, 1, 32, 0, s, dA, dB, dC, dD);
        st = cmi_cuda_launched("mma check");
    }
    if (!st && (e = cudaMemcpyAsync(hd, dD, sizeof hd, cudaMemcpyDeviceToHost, s)) != cudaSuccess)
        st = cmi_cuda_fail(e, "cudaMemcpyAsync (mma check)");
    if (!st && (e = cudaStreamSynchronize(s)) != cudaSuccess) st = cmi_cuda_fail(e, "cudaStreamSynchronize (mma check)");
    /* ldmatrix, plain and transposing, on the first 256 values of A as a 16 x 16 tile */
    uint32_t hr[256];
    if (!st) {
        CMI_LAUNCH(k_ldsm_check, 1, 32, 0, s, dA, (uint32_t *)dD);
        st = cmi_cuda_launched("ldmatrix check");
    }
    if (!st && (e = cudaMemcpyAsync(hr, dD, sizeof hr, cudaMemcpyDeviceToHost, s)) != cudaSuccess)
        st = cmi_cuda_fail(e, "cudaMemcpyAsync (ldmatrix check)");
    if (!st && (e = cudaStreamSynchronize(s)) != cudaSuccess) st = cmi_cuda_fail(e, "cudaStreamSynchronize (ldmatrix check)");
    cmi_cuda_free(dev);
    if (!st) st = ldsm_compare(ha, hr);
    if (st) return st;
    double err = 0.0, big = 0.0;
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) {
            double ref = hc[r * 8 + n];
            for (int k = 0; k < 16; k++) {
                uint32_t ua = (uint32_t)ha[r * 16 + k] << 16, ub = (uint32_t)hb[k * 8 + n] << 16;
                float fa, fb;
                memcpy(&fa, &ua, 4);
                memcpy(&fb, &ub, 4);
                ref += (double)fa * (double)fb;
            }
            err = fmax(err, fabs((double)hd[r * 8 + n] - ref));
            big = fmax(big, fabs(ref));
        }
    *max_rel_err = big > 0 ? err / big : err;
    return CM_OK;
}
