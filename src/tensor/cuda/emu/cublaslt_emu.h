/*
 * cublaslt_emu.h — the part of cuBLASLt's API that src/tensor/cuda/matmul.cu calls, implemented on
 * the CUDA emulator with cuBLASLt's documented semantics, so the calls (layouts, transposes, leading
 * dimensions, batches, the bias epilogue) are exercised without a GPU:
 *
 *   D = alpha · op(A) · op(B) + beta · C (+ bias broadcast along D's columns), column-major, per
 *   batch entry (batch count and strided offsets from each layout), A and B f32, bf16 or f16 (read
 *   exactly), C and D f32; compute in f32 (CUBLAS_COMPUTE_32F_FAST_TF32 rounds the inputs to TF32 as
 *   the tensor cores do).
 *
 * As the real library, it refuses layouts it could not run: a leading dimension smaller than the
 * stored rows, mismatched dimensions, C/D types other than f32, pointers that are not device memory.
 * cuBLASLt's algorithm choice and numerics of summation order are not modelled.
 */
#pragma once

#include "cuda_emu.h"

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;

typedef enum { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType_t;
typedef cudaDataType_t cudaDataType;
typedef enum { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77 } cublasComputeType_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;

typedef enum {
    CUBLASLT_MATMUL_DESC_TRANSA = 3,
    CUBLASLT_MATMUL_DESC_TRANSB = 4,
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 10,
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 11,
    CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26,
} cublasLtMatmulDescAttributes_t;

typedef enum {
    CUBLASLT_EPILOGUE_DEFAULT = 1,
    CUBLASLT_EPILOGUE_BIAS = 4,
} cublasLtEpilogue_t;

typedef enum {
    CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5,
    CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6,
} cublasLtMatrixLayoutAttribute_t;

typedef enum {
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 9,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 10,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 11,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 12,
} cublasLtMatmulPreferenceAttributes_t;

struct cmi_emu_lt_handle {
    int dummy;
};
struct cmi_emu_lt_desc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    cublasOperation_t ta, tb;
    cublasLtEpilogue_t epilogue;
    const void *bias;
    cudaDataType_t bias_type;
};
struct cmi_emu_lt_layout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;
    int64_t batch_stride;
};
struct cmi_emu_lt_pref {
    size_t workspace;
};
typedef cmi_emu_lt_handle *cublasLtHandle_t;
typedef cmi_emu_lt_desc *cublasLtMatmulDesc_t;
typedef cmi_emu_lt_layout *cublasLtMatrixLayout_t;
typedef cmi_emu_lt_pref *cublasLtMatmulPreference_t;
struct cublasLtMatmulAlgo_t {
    uint64_t data[8];
};
struct cublasLtMatmulHeuristicResult_t {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
};

static inline const char *cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_INTERNAL_ERROR";
    }
}

static inline cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = new cmi_emu_lt_handle();
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t c,
                                                      cudaDataType_t scale) {
    *d = new cmi_emu_lt_desc{c, scale, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, nullptr, CUDA_R_32F};
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a,
                                                            const void *buf, size_t n) {
    switch (a) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
        if (n != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        d->ta = (cublasOperation_t) * (const int32_t *)buf;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_TRANSB:
        if (n != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        d->tb = (cublasOperation_t) * (const int32_t *)buf;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        if (n != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        d->epilogue = (cublasLtEpilogue_t) * (const uint32_t *)buf;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        if (n != sizeof(void *)) return CUBLAS_STATUS_INVALID_VALUE;
        d->bias = *(const void *const *)buf;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
        if (n != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        d->bias_type = (cudaDataType_t) * (const int32_t *)buf;
        return CUBLAS_STATUS_SUCCESS;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
    }
}
static inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t t, uint64_t rows,
                                                        uint64_t cols, int64_t ld) {
    *l = new cmi_emu_lt_layout{t, rows, cols, ld, 1, 0};
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                              cublasLtMatrixLayoutAttribute_t a, const void *buf,
                                                              size_t n) {
    if (a == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT && n == sizeof(int32_t)) {
        l->batch = *(const int32_t *)buf;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (a == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET && n == sizeof(int64_t)) {
        l->batch_stride = *(const int64_t *)buf;
        return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}
static inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    *p = new cmi_emu_lt_pref{0};
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                                  cublasLtMatmulPreferenceAttributes_t a,
                                                                  const void *buf, size_t n) {
    if (a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES && n == sizeof(uint64_t)) {
        p->workspace = (size_t) * (const uint64_t *)buf;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (a >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && a <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES &&
        n == sizeof(uint32_t))
        return CUBLAS_STATUS_SUCCESS;
    return CUBLAS_STATUS_INVALID_VALUE;
}

/* The checks cuBLASLt makes before it picks an algorithm (emu/cuda_emu.cc). */
cublasStatus_t cmi_emu_lt_check(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D);

static inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d,
                                                            cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                                            cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D,
                                                            cublasLtMatmulPreference_t, int requested,
                                                            cublasLtMatmulHeuristicResult_t *res, int *count) {
    *count = 0;
    const cublasStatus_t s = cmi_emu_lt_check(d, A, B, C, D);
    if (s) return s;
    if (requested > 0) {
        memset(&res[0], 0, sizeof res[0]);
        res[0].state = CUBLAS_STATUS_SUCCESS;
        *count = 1;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t Adesc, const void *B, cublasLtMatrixLayout_t Bdesc,
                              const void *beta, const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo, void *ws,
                              size_t ws_bytes, cudaStream_t stream);
