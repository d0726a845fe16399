/* Optimizer updates and gradient norms over flat f32 spans on the GPU (backend.h slots sgd_step,
 * adam_step, sumsq), with optim.c's update rules term for term, so an f32 step gives the CPU's
 * values up to rounding of the same operations. The sum of squares is reduced in double, in a fixed
 * order (per-block partials, then one block), so clipping is deterministic. */
#include "tensor/cuda/common.cuh"

#include <math.h>

__global__ void k_sgd(float *p, float *b, const float *g, int64_t n, float l2, float mom, float omd, float keep,
                      float neg_lr, bool has_mom, bool first, bool nesterov, bool decay, bool use_l2) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float pi = p[i], d = g[i];
        if (use_l2) d = d + l2 * pi;
        if (has_mom) {
            const float bi = first ? d : b[i] * mom + omd * d;
            b[i] = bi;
            d = nesterov ? d + mom * bi : bi;
        }
        if (decay) pi = pi * keep;
        p[i] = pi + neg_lr * d;
    }
}

extern "C" cm_status cmi_cuda_sgd_step(const cmi_sgd_args *a) {
    if (a->n <= 0) return CM_OK;
    CMI_LAUNCH(k_sgd, cmi_cuda_grid(a->n, 256), 256, 0, cmi_cuda_stream(), a->p, a->b, a->g, a->n, a->l2, a->mom,
               a->one_minus_damp, a->keep, a->neg_lr, a->has_mom, a->first, a->nesterov, a->decay, a->use_l2);
    return cmi_cuda_launched("sgd step");
}

__global__ void k_adam(float *p, float *m, float *v, float *vmax, const float *g, int64_t n, float keep, float l2,
                       float b1, float omb1, float b2, float omb2, float neg_step, float bc2_sqrt, float eps, bool decay,
                       bool use_l2, bool amsgrad) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float pi = p[i], gi = g[i];
        if (use_l2) gi = gi + l2 * pi;
        if (decay) pi = pi * keep;
        const float mi = m[i] * b1 + omb1 * gi, vi = v[i] * b2 + omb2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float vd = vi;
        if (amsgrad) {
            vd = fmaxf(vmax[i], vi);
            vmax[i] = vd;
        }
        const float denom = sqrtf(vd) / bc2_sqrt + eps;
        p[i] = pi + neg_step * (mi / denom);
    }
}

extern "C" cm_status cmi_cuda_adam_step(const cmi_adam_args *a) {
    if (a->n <= 0) return CM_OK;
    CMI_LAUNCH(k_adam, cmi_cuda_grid(a->n, 256), 256, 0, cmi_cuda_stream(), a->p, a->m, a->v, a->vmax, a->g, a->n,
               a->keep, a->l2, a->b1, a->omb1, a->b2, a->omb2, a->neg_step, a->bc2_sqrt, a->eps, a->decay, a->use_l2,
               a->amsgrad);
    return cmi_cuda_launched("adam step");
}

__global__ void k_sumsq_part(const float *x, int64_t n, double *part) {
    __shared__ double sh[32];
    double s = 0.0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        s += (double)x[i] * (double)x[i];
    s = cmi_block_sum(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void k_sum_parts(const double *part, int n, double *out) {
    __shared__ double sh[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += part[i];
    s = cmi_block_sum(s, sh);
    if (threadIdx.x == 0) out[0] = s;
}

extern "C" cm_status cmi_cuda_sumsq(const float *x, int64_t n, double *out) {
    *out = 0.0;
    if (n <= 0) return CM_OK;
    const unsigned g = cmi_cuda_grid(n, 256);
    double *part = (double *)cmi_cuda_scratch(sizeof(double) * (g + 1));
    if (!part) return cm_last_status();
    cudaStream_t s = cmi_cuda_stream();
    CMI_LAUNCH(k_sumsq_part, g, 256, 0, s, x, n, part);
    CMI_LAUNCH(k_sum_parts, 1, 256, 0, s, part, (int)g, part + g);
    cm_status st = cmi_cuda_launched("sum of squares");
    if (st) return st;
    CMI_CUDA_TRY(cudaMemcpyAsync(out, part + g, sizeof(double), cudaMemcpyDeviceToHost, s));
    CMI_CUDA_TRY(cudaStreamSynchronize(s));
    return CM_OK;
}

/* ---- EMA, SWA and SAM over flat spans (backend.h slots ema_update, swa_update, sam_perturb):
 * ema.c's, swa.c's and sam.c's loops with every operation rounded on its own (__f*_rn are never
 * contracted into a fused multiply-add), so the GPU gives the CPU's bits. ---- */

__global__ void k_ema_f32(float *ema, const float *model, int64_t n, float s, float oms) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        ema[i] = __fadd_rn(__fmul_rn(ema[i], s), __fmul_rn(model[i], oms));
}

__global__ void k_ema_i64(int64_t *ema, const int64_t *model, int64_t n, float s, float oms) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        ema[i] = (int64_t)__fadd_rn(__fmul_rn((float)ema[i], s), __fmul_rn((float)model[i], oms));
}

extern "C" cm_status cmi_cuda_ema_update(void *ema, const void *model, cm_dtype dt, int64_t n, float s, float oms) {
    if (n <= 0) return CM_OK;
    if (dt != CM_DTYPE_F32 && dt != CM_DTYPE_I64)
        return cm_set_error(CM_ERR_DTYPE, "ema update: %s tensors are not averaged", cm_dtype_name(dt));
    const unsigned g = cmi_cuda_grid(n, 256);
    if (dt == CM_DTYPE_F32) CMI_LAUNCH(k_ema_f32, g, 256, 0, cmi_cuda_stream(), (float *)ema, (const float *)model, n, s, oms);
    else CMI_LAUNCH(k_ema_i64, g, 256, 0, cmi_cuda_stream(), (int64_t *)ema, (const int64_t *)model, n, s, oms);
    return cmi_cuda_launched("ema update");
}

__global__ void k_swa(float *avg, const float *model, int64_t n, float d) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        avg[i] = __fadd_rn(avg[i], __fdiv_rn(__fsub_rn(model[i], avg[i]), d));
}

extern "C" cm_status cmi_cuda_swa_update(float *avg, const float *model, int64_t n, float d) {
    if (n <= 0) return CM_OK;
    CMI_LAUNCH(k_swa, cmi_cuda_grid(n, 256), 256, 0, cmi_cuda_stream(), avg, model, n, d);
    return cmi_cuda_launched("swa update");
}

__global__ void k_sam_perturb(float *p, const float *g, int64_t n, float scale) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = __fadd_rn(p[i], __fmul_rn(g[i], scale));
}

extern "C" cm_status cmi_cuda_sam_perturb(float *p, const float *g, int64_t n, float scale) {
    if (n <= 0) return CM_OK;
    CMI_LAUNCH(k_sam_perturb, cmi_cuda_grid(n, 256), 256, 0, cmi_cuda_stream(), p, g, n, scale);
    return cmi_cuda_launched("sam perturb");
}
