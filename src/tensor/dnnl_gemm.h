/* bf16 GEMM through oneDNN's matmul primitive (private to the tensor layer). */
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

/* Number of primitives in the cache (for tests: repeated calls must not grow it). */
int cmi_gemm_bf16_cache_size(void);

#endif
