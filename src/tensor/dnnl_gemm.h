/* bf16 GEMM (private to the tensor layer): oneDNN's matmul primitive on CPUs with native bf16
 * instructions (AVX512-BF16, AMX), and elsewhere the "widen" kernel: the bf16 operands are widened
 * to f32 (exactly: every bf16 is an f32) and multiplied by OpenBLAS's sgemm. Both accumulate in f32,
 * so the result differs only in summation order. On CPUs without native bf16, oneDNN either has no
 * bf16 matmul (AVX2) or emulates it several times slower than sgemm (AVX-512), which is why widening
 * is the default there. CM_BF16_GEMM=onednn|widen overrides the choice (benchmarks, tests). */
#ifndef CM_DNNL_GEMM_H
#define CM_DNNL_GEMM_H

#include "tensor/tensor_impl.h"

/* C (M, N) = op(A) (M, K) · op(B) (K, N) [+ bias (N)] [+ C when `accumulate`], accumulated in f32.
 * A and B are bf16 (raw uint16_t bits); C and bias are f32. Element (i, k) of op(A) is
 * a[ta ? k·lda + i : i·lda + k], likewise for B; C's rows are ldc apart. The primitive for a given
 * (M, N, K, leading dims, transposes, bias, accumulate) is created once and cached (thread-safe);
 * its scratchpad comes from the tape's arena. Errors (recorded on tp): CM_ERR_INTERNAL naming the
 * oneDNN status, CM_ERR_OOM. */
cm_status cmi_gemm_bf16(cm_tape *tp, int64_t M, int64_t N, int64_t K, const uint16_t *a, int64_t lda, bool ta,
                        const uint16_t *b, int64_t ldb, bool tb, const float *bias, bool accumulate, float *c,
                        int64_t ldc);

typedef enum { CMI_BF16_ONEDNN, CMI_BF16_WIDEN } cmi_bf16_kernel;

/* The kernel cmi_gemm_bf16 uses: CM_BF16_GEMM when set to "onednn" or "widen", otherwise oneDNN
 * when cmi_bf16_native() and widen when not. Read once; cmi_bf16_set_kernel changes it (tests). */
cmi_bf16_kernel cmi_bf16_get_kernel(void);
void cmi_bf16_set_kernel(cmi_bf16_kernel k);

/* True when oneDNN reports an ISA with bf16 dot-product instructions (avx512_core_bf16 or AMX). */
bool cmi_bf16_native(void);

/* f32 GEMM, row-major, as cblas_sgemm: C (M, N) = alpha · op(A) · op(B) + beta · C, op(X) = Xᵀ
 * when tX. Runs on OpenBLAS or on oneDNN's sgemm (dnnl_sgemm), whichever cmi_f32_get_kernel()
 * says. Inside an OpenMP parallel region both run single-threaded. Dimensions are 64-bit (the
 * OpenBLAS path fails loudly past INT_MAX: callers check with their own message first). */
void cmi_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *a, int64_t lda,
               const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

typedef enum { CMI_F32_OPENBLAS, CMI_F32_ONEDNN } cmi_f32_kernel;

/* The f32 GEMM kernel: CM_F32_GEMM when set to "openblas" or "onednn", otherwise oneDNN where its
 * ISA is AVX-512 or better and OpenBLAS elsewhere. Debian's OpenBLAS 0.3.21 runs its AVX2 (Haswell)
 * kernels on AMD Zen 4 (it predates Zen 4's AVX-512), where oneDNN's AVX-512 sgemm is 1.7-3.3x
 * faster on transformer shapes (bench/gemm); on AVX2 OpenBLAS is kept. Read once;
 * cmi_f32_set_kernel changes it (tests, benchmarks). */
cmi_f32_kernel cmi_f32_get_kernel(void);
void cmi_f32_set_kernel(cmi_f32_kernel k);
const char *cmi_f32_kernel_name(cmi_f32_kernel k); /* "openblas" / "onednn" */

/* oneDNN's effective ISA as a name ("avx2", "avx512_core_amx", ...), for messages and benchmarks. */
const char *cmi_dnnl_isa_name(void);

/* Number of primitives in the cache (for tests: repeated calls must not grow it). */
int cmi_gemm_bf16_cache_size(void);

#endif
