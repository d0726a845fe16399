/* Indexing on the GPU (backend.h slots read_indices, select_rows, select_rows_bwd): embedding and
 * index_select. The backward adds each selected row's gradient into its source row; threads own
 * (outer, column) pairs and walk the selections in order, so repeated indices accumulate in a fixed
 * order without atomics (deterministic; the CPU partitions the same way). */
#include "tensor/cuda/common.cuh"

#include <stdlib.h>

__global__ void k_read_indices(int64_t *out, const void *idx, int dt, int64_t n, int64_t limit,
                               unsigned long long *bad) {
    unsigned long long b = ~0ull;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t v = dt == CM_DTYPE_I32 ? ((const int32_t *)idx)[i]
                          : dt == CM_DTYPE_U8 ? ((const uint8_t *)idx)[i]
                                               : ((const int64_t *)idx)[i];
        out[i] = v;
        if ((v < 0 || v >= limit) && (unsigned long long)i < b) b = (unsigned long long)i;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long w = __shfl_xor_sync(0xffffffffu, b, o);
        b = w < b ? w : b;
    }
    if ((threadIdx.x & 31) == 0 && b != ~0ull) atomicMin(bad, b);
}

extern "C" cm_status cmi_cuda_read_indices(int64_t *out, const void *idx, cm_dtype dt, int64_t n, int64_t limit,
                                           int64_t *bad, int64_t *bad_val) {
    *bad = -1;
    if (n <= 0) return CM_OK;
    unsigned long long *d = (unsigned long long *)cmi_cuda_scratch(sizeof(unsigned long long));
    if (!d) return cm_last_status();
    const unsigned long long init = ~0ull;
    cudaStream_t s = cmi_cuda_stream();
    CMI_CUDA_TRY(cudaMemcpyAsync(d, &init, sizeof init, cudaMemcpyHostToDevice, s));
    CMI_LAUNCH(k_read_indices, cmi_cuda_grid(n, 256), 256, 0, s, out, idx, (int)dt, n, limit, d);
    cm_status st = cmi_cuda_launched("indices");
    if (st) return st;
    unsigned long long h = 0;
    CMI_CUDA_TRY(cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, s));
    CMI_CUDA_TRY(cudaStreamSynchronize(s));
    if (h != ~0ull) {
        *bad = (int64_t)h;
        CMI_CUDA_TRY(cudaMemcpy(bad_val, out + h, sizeof(int64_t), cudaMemcpyDeviceToHost));
    }
    return CM_OK;
}

/* out (O, K, I) = a (O, A, I) rows idx[k]; copied in 4-byte words when the row allows, else bytes. */
template <class T>
__global__ void k_select(T *out, const T *a, const int64_t *idx, int64_t O, int64_t A, int64_t I, int64_t K) {
    const int64_t total = O * K * I;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = e % I, ok = e / I, k = ok % K, o = ok / K;
        out[e] = a[(o * A + idx[k]) * I + i];
    }
}

extern "C" cm_status cmi_cuda_select_rows(void *out, const void *a, const int64_t *idx, int64_t O, int64_t A,
                                          int64_t I, int64_t K, size_t es) {
    const int64_t total = O * K * I;
    if (total == 0) return CM_OK;
    cudaStream_t s = cmi_cuda_stream();
    const unsigned g = cmi_cuda_grid(total, 256);
    switch (es) {
    case 1: CMI_LAUNCH(k_select<uint8_t>, g, 256, 0, s, (uint8_t *)out, (const uint8_t *)a, idx, O, A, I, K); break;
    case 2: CMI_LAUNCH(k_select<uint16_t>, g, 256, 0, s, (uint16_t *)out, (const uint16_t *)a, idx, O, A, I, K); break;
    case 4: CMI_LAUNCH(k_select<uint32_t>, g, 256, 0, s, (uint32_t *)out, (const uint32_t *)a, idx, O, A, I, K); break;
    default: CMI_LAUNCH(k_select<uint64_t>, g, 256, 0, s, (uint64_t *)out, (const uint64_t *)a, idx, O, A, I, K); break;
    }
    return cmi_cuda_launched("select_rows");
}

/* ga[o, idx[k], i] += g[o, k, i]: thread per (o, i), k in order. */
/* The gradient of select_rows: ga[(o, idx[k], i)] += g[(o, k, i)] for k in order, as the CPU adds
 * them (the same bits). Run over the columns only (a thread per (o, i) walking all K rows), that is
 * a few blocks for an embedding (O = 1, I = C) and K serial steps each — milliseconds for GPT-2's
 * 8192 tokens. So the rows are bucketed first, as llm.c's encoder backward does: the indices are
 * copied to the host (K int64s), counting-sorted there (stable: each bucket keeps k ascending), and
 * a thread per (bucket, o, i) adds its bucket's rows in order. Deterministic, parallel over distinct
 * indices x columns; one small copy each way and one stream synchronisation per call. */
__global__ void k_select_bwd_buckets(float *ga, const float *g, const int64_t *perm, const int64_t *rows,
                                     const int64_t *first, int64_t U, int64_t O, int64_t A, int64_t I, int64_t K) {
    const int64_t total = U * O * I;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = e % I, uo = e / I, o = uo % O, u = uo / O;
        float *dst = ga + (o * A + rows[u]) * I + i;
        float acc = *dst;
        for (int64_t p = first[u]; p < first[u + 1]; p++) acc += g[(o * K + perm[p]) * I + i];
        *dst = acc;
    }
}

extern "C" cm_status cmi_cuda_select_rows_bwd(float *ga, const float *g, const int64_t *idx, int64_t O, int64_t A,
                                              int64_t I, int64_t K) {
    if (O * I == 0 || K == 0) return CM_OK;
    cudaStream_t s = cmi_cuda_stream();
    /* host: idx (K) | count (A + 1) ; upload: perm (K) | rows (U) | first (U + 1) */
    int64_t *h = (int64_t *)malloc(sizeof(int64_t) * (size_t)(K + A + 1 + K + K + K + 1));
    if (!h) return cm_set_error(CM_ERR_OOM, "select_rows backward: no host memory for %lld indices", (long long)K);
    int64_t *hidx = h, *count = hidx + K, *perm = count + A + 1, *rows = perm + K, *first = rows + K;
    cm_status st = CM_OK;
    int64_t U = 0;
    int64_t *d = nullptr;
    cudaError_t e = cudaMemcpyAsync(hidx, idx, sizeof(int64_t) * (size_t)K, cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) {
        st = cmi_cuda_fail(e, "select_rows backward: copying the indices to the host");
        goto out;
    }
    memset(count, 0, sizeof(int64_t) * (size_t)(A + 1));
    for (int64_t k = 0; k < K; k++) {
        if (hidx[k] < 0 || hidx[k] >= A) { /* read_indices checked them in the forward: a broken caller */
            st = cm_set_error(CM_ERR_INVALID_ARG, "select_rows backward: index %lld at %lld is outside [0, %lld)",
                              (long long)hidx[k], (long long)k, (long long)A);
            goto out;
        }
        count[hidx[k] + 1]++;
    }
    for (int64_t r = 0; r < A; r++) {
        if (count[r + 1]) {
            rows[U] = r;
            first[U] = count[r];
            U++;
        }
        count[r + 1] += count[r]; /* count[r] = where row r's bucket starts */
    }
    first[U] = K;
    for (int64_t k = 0; k < K; k++) perm[count[hidx[k]]++] = k;
    /* perm, rows and first are contiguous on the host apart from the gap between rows[U] and
     * rows[K]: close it, then one upload */
    memmove(rows + U, first, sizeof(int64_t) * (size_t)(U + 1));
    d = (int64_t *)cmi_cuda_scratch(sizeof(int64_t) * (size_t)(K + 2 * U + 1));
    if (!d) {
        st = cm_last_status();
        goto out;
    }
    e = cudaMemcpyAsync(d, perm, sizeof(int64_t) * (size_t)(K + 2 * U + 1), cudaMemcpyHostToDevice, s);
    /* (from pageable memory the call returns once the bytes are staged: h may be freed after it) */
    if (e != cudaSuccess) {
        st = cmi_cuda_fail(e, "select_rows backward: copying the buckets to the device");
        goto out;
    }
    CMI_LAUNCH(k_select_bwd_buckets, cmi_cuda_grid(U * O * I, 256), 256, 0, s, ga, g, d, d + K, d + K + U, U, O, A,
               I, K);
    st = cmi_cuda_launched("select_rows backward");
out:
    free(h);
    return st;
}

/* ---- gather (backend.h slots gather, gather_bwd) ---- */

/* The shape and strides of a gather passed by value: idx's shape, a's strides (sa), the contiguous
 * strides of a's shape (ga, for the gradient). */
struct gather_geom {
    int nd, axis;
    int64_t shape[CM_MAX_DIMS], sa[CM_MAX_DIMS], ga[CM_MAX_DIMS];
};

/* out[e] = a[the coordinates of e in idx's shape, axis replaced by idx[e]]. */
template <class T> __global__ void k_gather(T *out, const T *a, const int64_t *idx, gather_geom g, int64_t total) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = e, off = 0;
        for (int d = g.nd - 1; d >= 0; d--) {
            const int64_t q = r / g.shape[d], i = r - q * g.shape[d];
            off += (d == g.axis ? idx[e] : i) * g.sa[d];
            r = q;
        }
        out[e] = a[off];
    }
}

extern "C" cm_status cmi_cuda_gather(void *out, const void *a, const int64_t *sa, const int64_t *idx, int nd,
                                     const int64_t *shape, int axis, size_t es) {
    gather_geom g = {};
    g.nd = nd, g.axis = axis;
    int64_t total = 1;
    for (int d = 0; d < nd; d++) {
        g.shape[d] = shape[d];
        g.sa[d] = sa[d];
        total *= shape[d];
    }
    if (total == 0) return CM_OK;
    cudaStream_t s = cmi_cuda_stream();
    const unsigned gr = cmi_cuda_grid(total, 256);
    switch (es) {
    case 1: CMI_LAUNCH(k_gather<uint8_t>, gr, 256, 0, s, (uint8_t *)out, (const uint8_t *)a, idx, g, total); break;
    case 2: CMI_LAUNCH(k_gather<uint16_t>, gr, 256, 0, s, (uint16_t *)out, (const uint16_t *)a, idx, g, total); break;
    case 4: CMI_LAUNCH(k_gather<uint32_t>, gr, 256, 0, s, (uint32_t *)out, (const uint32_t *)a, idx, g, total); break;
    default: CMI_LAUNCH(k_gather<uint64_t>, gr, 256, 0, s, (uint64_t *)out, (const uint64_t *)a, idx, g, total); break;
    }
    return cmi_cuda_launched("gather");
}

/* One thread per line along the axis (a position of idx's shape without the axis coordinate):
 * lines differ in a coordinate that is not gathered, so they write disjoint elements of ga; each
 * walks its line in order, as the CPU does. */
__global__ void k_gather_bwd(float *ga, const float *g, const int64_t *idx, gather_geom G, int64_t lines) {
    const int64_t K = G.shape[G.axis];
    int64_t gstride = 1; /* the stride of the axis in g (contiguous, idx's shape) */
    for (int d = G.nd - 1; d > G.axis; d--) gstride *= G.shape[d];
    for (int64_t l = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; l < lines; l += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = l, off = 0, goff = 0, gs = 1;
        for (int d = G.nd - 1; d >= 0; d--) {
            if (d == G.axis) {
                gs *= G.shape[d];
                continue;
            }
            const int64_t q = r / G.shape[d], i = r - q * G.shape[d];
            off += i * G.ga[d];
            goff += i * gs;
            gs *= G.shape[d];
            r = q;
        }
        for (int64_t k = 0; k < K; k++) {
            const int64_t e = goff + k * gstride;
            ga[off + idx[e] * G.ga[G.axis]] += g[e];
        }
    }
}

extern "C" cm_status cmi_cuda_gather_bwd(float *ga, const int64_t *ashape, const float *g, const int64_t *idx, int nd,
                                         const int64_t *shape, int axis) {
    gather_geom G = {};
    G.nd = nd, G.axis = axis;
    int64_t total = 1, st = 1;
    for (int d = nd - 1; d >= 0; d--) {
        G.shape[d] = shape[d];
        G.ga[d] = st;
        st *= ashape[d];
        total *= shape[d];
    }
    if (total == 0) return CM_OK;
    const int64_t lines = total / shape[axis];
    CMI_LAUNCH(k_gather_bwd, cmi_cuda_grid(lines, 128), 128, 0, cmi_cuda_stream(), ga, g, idx, G, lines);
    return cmi_cuda_launched("gather backward");
}
