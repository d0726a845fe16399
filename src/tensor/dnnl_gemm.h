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

/* oneDNN's effective ISA as a name ("avx2", "avx512_core_amx", ...), for messages and benchmarks. */
const char *cmi_dnnl_isa_name(void);

/* Number of primitives in the cache (for tests: repeated calls must not grow it). */
int cmi_gemm_bf16_cache_size(void);

#endif
