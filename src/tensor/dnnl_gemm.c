/* bf16 × bf16 → f32 GEMM through oneDNN's matmul primitive, with a small cache of primitives.
 *
 * Creating a oneDNN primitive JIT-compiles a kernel (tens to hundreds of microseconds), so each
 * distinct problem — shape, leading dims, transposes, bias, accumulate — is created once and kept
 * for the life of the process. The cache is a fixed array under a mutex; entries are never evicted
 * (a running GEMM on another thread may hold one), and a problem arriving when it is full gets a
 * one-off primitive. Scratchpads are in user mode and come from the tape's arena, so executing a
 * cached primitive allocates nothing but three small memory objects. */
#include "tensor/dnnl_gemm.h"

#include <cblas.h>
#include <limits.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#define CACHE_CAP 256

typedef struct {
    int64_t m, n, k, lda, ldb, ldc;
    int32_t ta, tb, bias, acc;
} gemm_key;

typedef struct {
    gemm_key key;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t a_md, b_md, c_md, bias_md, scratch_md;
    size_t scratch_bytes;
} gemm_entry;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static gemm_entry g_cache[CACHE_CAP];
static int g_n_cached;
static dnnl_engine_t g_engine;
static _Thread_local dnnl_stream_t t_stream; /* CPU streams are cheap but not shareable between threads */

/* ------------------------------------------------------------------------------------------ */
/* Kernel choice                                                                               */
/* ------------------------------------------------------------------------------------------ */

static pthread_once_t g_kernel_once = PTHREAD_ONCE_INIT;
static _Atomic int g_kernel = -1;

bool cmi_bf16_native(void) {
    const unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    return (isa & (unsigned)dnnl_cpu_isa_avx512_core_bf16) == (unsigned)dnnl_cpu_isa_avx512_core_bf16;
}

const char *cmi_dnnl_isa_name(void) {
    switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "unknown";
    }
}

static void kernel_init(void) {
    const char *e = getenv("CM_BF16_GEMM");
    int k = cmi_bf16_native() ? CMI_BF16_ONEDNN : CMI_BF16_WIDEN;
    if (e && strcmp(e, "onednn") == 0) k = CMI_BF16_ONEDNN;
    else if (e && strcmp(e, "widen") == 0) k = CMI_BF16_WIDEN;
    else if (e && *e)
        cm_log_msg(CM_LOG_WARN, "CM_BF16_GEMM='%s' is not a bf16 GEMM kernel (use onednn or widen); using %s", e,
                    k == CMI_BF16_ONEDNN ? "onednn" : "widen");
    int expect = -1;
    atomic_compare_exchange_strong(&g_kernel, &expect, k);
}

cmi_bf16_kernel cmi_bf16_get_kernel(void) {
    pthread_once(&g_kernel_once, kernel_init);
    return (cmi_bf16_kernel)atomic_load(&g_kernel);
}

void cmi_bf16_set_kernel(cmi_bf16_kernel k) {
    pthread_once(&g_kernel_once, kernel_init);
    atomic_store(&g_kernel, (int)k);
}

/* f32 kernel choice and cmi_sgemm */

static pthread_once_t g_f32_once = PTHREAD_ONCE_INIT;
static _Atomic int g_f32_kernel = -1;

static void f32_kernel_init(void) {
    const char *e = getenv("CM_F32_GEMM");
    const unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    int k = (isa & (unsigned)dnnl_cpu_isa_avx512_core) == (unsigned)dnnl_cpu_isa_avx512_core ? CMI_F32_ONEDNN
                                                                                            : CMI_F32_OPENBLAS;
    if (e && strcmp(e, "onednn") == 0) k = CMI_F32_ONEDNN;
    else if (e && strcmp(e, "openblas") == 0) k = CMI_F32_OPENBLAS;
    else if (e && *e)
        cm_log_msg(CM_LOG_WARN, "CM_F32_GEMM='%s' is not an f32 GEMM kernel (use openblas or onednn); using %s", e,
                   cmi_f32_kernel_name((cmi_f32_kernel)k));
    int expect = -1;
    atomic_compare_exchange_strong(&g_f32_kernel, &expect, k);
}

cmi_f32_kernel cmi_f32_get_kernel(void) {
    pthread_once(&g_f32_once, f32_kernel_init);
    return (cmi_f32_kernel)atomic_load(&g_f32_kernel);
}

void cmi_f32_set_kernel(cmi_f32_kernel k) {
    pthread_once(&g_f32_once, f32_kernel_init);
    atomic_store(&g_f32_kernel, (int)k);
}

const char *cmi_f32_kernel_name(cmi_f32_kernel k) { return k == CMI_F32_ONEDNN ? "onednn" : "openblas"; }

void cmi_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *a, int64_t lda,
               const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    if (cmi_f32_get_kernel() == CMI_F32_ONEDNN) {
        /* dnnl_sgemm is row-major; it only fails on invalid arguments, which callers rule out */
        dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
        if (st == dnnl_success) return;
        cm_log_msg(CM_LOG_WARN, "dnnl_sgemm(M=%lld N=%lld K=%lld) failed (status %d); using OpenBLAS", (long long)M,
                   (long long)N, (long long)K, (int)st);
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K,
                alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

/* ------------------------------------------------------------------------------------------ */
/* Widen: bf16 → f32, then sgemm                                                               */
/* ------------------------------------------------------------------------------------------ */

/* The stored (rows, cols) matrix at p with leading dim ld, widened into a dense f32 (rows, cols). */
static void widen(const uint16_t *p, int64_t rows, int64_t cols, int64_t ld, float *out) {
    const bool par = rows * cols > CMI_PAR_MIN && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (par)
    for (int64_t i = 0; i < rows; i++) {
        const uint16_t *s = p + i * ld;
        uint32_t *d = (uint32_t *)(out + i * cols);
        for (int64_t j = 0; j < cols; j++) d[j] = (uint32_t)s[j] << 16;
    }
}

static cm_status gemm_widen(cm_tape *tp, int64_t M, int64_t N, int64_t K, const uint16_t *a, int64_t lda, bool ta,
                            const uint16_t *b, int64_t ldb, bool tb, const float *bias, bool acc, float *c,
                            int64_t ldc) {
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX || ldc > INT_MAX)
        return cmi_fail(tp, CM_ERR_UNSUPPORTED, "matmul (bf16): GEMM of M=%lld N=%lld K=%lld exceeds the 32-bit BLAS interface",
                        (long long)M, (long long)N, (long long)K);
    /* op(A) is stored as (M, K) rows, or as (K, M) rows when transposed; likewise B. */
    const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    /* The widened copies live only for this call: give their arena space back on return, so an
     * amp_bf16 step does not keep f32 copies of every GEMM operand until the tape resets (they were
     * most of the 2x RSS of amp_bf16 over fp32). Nothing else allocates from the arena in between,
     * and bf16 GEMMs never run inside a parallel region (gemm_batched), so the rewind is safe. */
    const size_t mark = cm_arena_mark(tp->arena);
    float *a32 = cmi_scratch(tp, sizeof(float) * (size_t)(ar * ac + 1));
    float *b32 = a32 ? cmi_scratch(tp, sizeof(float) * (size_t)(br * bc + 1)) : NULL;
    if (!b32) return cmi_status(tp);
    widen(a, ar, ac, lda, a32);
    widen(b, br, bc, ldb, b32);
    if (bias || !acc) {
        const bool par = M * N > CMI_PAR_MIN && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (par)
        for (int64_t i = 0; i < M; i++) {
            float *row = c + i * ldc;
            if (!acc) memset(row, 0, sizeof(float) * (size_t)N);
            if (bias)
                for (int64_t j = 0; j < N; j++) row[j] += bias[j];
        }
    }
    if (K > 0) cmi_sgemm(ta, tb, M, N, K, 1.0f, a32, ac ? ac : 1, b32, bc ? bc : 1, 1.0f, c, ldc);
    cm_arena_rewind(tp->arena, mark);
    return CM_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* oneDNN                                                                                      */
/* ------------------------------------------------------------------------------------------ */

int cmi_gemm_bf16_cache_size(void) {
    pthread_mutex_lock(&g_lock);
    int n = g_n_cached;
    pthread_mutex_unlock(&g_lock);
    return n;
}

static cm_status dnnl_fail(cm_tape *tp, const char *what, dnnl_status_t s, const gemm_key *k) {
    if (s == dnnl_unimplemented)
        return cmi_fail(tp, CM_ERR_UNSUPPORTED,
                        "matmul (bf16): oneDNN has no bf16 matmul for this CPU (ISA %s) for M=%lld N=%lld K=%lld; "
                        "unset CM_BF16_GEMM or set CM_BF16_GEMM=widen",
                        cmi_dnnl_isa_name(), (long long)k->m, (long long)k->n, (long long)k->k);
    return cmi_fail(tp, CM_ERR_INTERNAL,
                    "matmul (bf16): oneDNN %s failed with status %d for M=%lld N=%lld K=%lld (ta=%d tb=%d)", what, (int)s,
                    (long long)k->m, (long long)k->n, (long long)k->k, k->ta, k->tb);
}

static void md_2d(dnnl_memory_desc_t *md, int64_t rows, int64_t cols, int64_t ld, bool t, dnnl_data_type_t dt) {
    dnnl_dims_t dims = {rows, cols};
    dnnl_dims_t strides = {t ? 1 : ld, t ? ld : 1};
    dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides);
}

/* Builds the primitive for key k into e (not yet in the cache). Called with g_lock held. */
static cm_status build(cm_tape *tp, const gemm_key *k, gemm_entry *e) {
    dnnl_status_t s;
    if (!g_engine && (s = dnnl_engine_create(&g_engine, dnnl_cpu, 0)) != dnnl_success)
        return dnnl_fail(tp, "engine_create", s, k);
    memset(e, 0, sizeof *e);
    e->key = *k;
    md_2d(&e->a_md, k->m, k->k, k->lda, k->ta, dnnl_bf16);
    md_2d(&e->b_md, k->k, k->n, k->ldb, k->tb, dnnl_bf16);
    md_2d(&e->c_md, k->m, k->n, k->ldc, false, dnnl_f32);
    if (k->bias) md_2d(&e->bias_md, 1, k->n, k->n, false, dnnl_f32);
    dnnl_matmul_desc_t desc;
    if ((s = dnnl_matmul_desc_init(&desc, &e->a_md, &e->b_md, k->bias ? &e->bias_md : NULL, &e->c_md)) !=
        dnnl_success)
        return dnnl_fail(tp, "matmul_desc_init", s, k);
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    cm_status st = CM_OK;
    if ((s = dnnl_primitive_attr_create(&attr)) != dnnl_success) return dnnl_fail(tp, "attr_create", s, k);
    dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (k->acc) {
        if ((s = dnnl_post_ops_create(&po)) != dnnl_success || (s = dnnl_post_ops_append_sum(po, 1.0f)) != dnnl_success ||
            (s = dnnl_primitive_attr_set_post_ops(attr, po)) != dnnl_success) {
            st = dnnl_fail(tp, "post_ops (sum)", s, k);
            goto done;
        }
    }
    if ((s = dnnl_primitive_desc_create(&pd, &desc, attr, g_engine, NULL)) != dnnl_success) {
        st = dnnl_fail(tp, "primitive_desc_create", s, k);
        goto done;
    }
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    if (smd) e->scratch_md = *smd;
    e->scratch_bytes = smd ? dnnl_memory_desc_get_size(smd) : 0;
    if ((s = dnnl_primitive_create(&e->prim, pd)) != dnnl_success) st = dnnl_fail(tp, "primitive_create", s, k);
done:
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    return st;
}

cm_status cmi_gemm_bf16(cm_tape *tp, int64_t M, int64_t N, int64_t K, const uint16_t *a, int64_t lda, bool ta,
                        const uint16_t *b, int64_t ldb, bool tb, const float *bias, bool accumulate, float *c,
                        int64_t ldc) {
    if (cmi_bf16_get_kernel() == CMI_BF16_WIDEN)
        return gemm_widen(tp, M, N, K, a, lda, ta, b, ldb, tb, bias, accumulate, c, ldc);
    gemm_key k;
    memset(&k, 0, sizeof k); /* compared with memcmp: no stray padding bytes */
    k.m = M, k.n = N, k.k = K, k.lda = lda, k.ldb = ldb, k.ldc = ldc;
    k.ta = ta, k.tb = tb, k.bias = bias != NULL, k.acc = accumulate;

    gemm_entry local, *e = NULL;
    bool owned = false;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_n_cached; i++)
        if (memcmp(&g_cache[i].key, &k, sizeof k) == 0) {
            e = &g_cache[i];
            break;
        }
    if (!e) {
        gemm_entry *slot = g_n_cached < CACHE_CAP ? &g_cache[g_n_cached] : &local;
        cm_status st = build(tp, &k, slot);
        if (st) {
            pthread_mutex_unlock(&g_lock);
            return st;
        }
        if (slot == &local) owned = true;
        else g_n_cached++;
        e = slot;
    }
    pthread_mutex_unlock(&g_lock);

    dnnl_status_t s;
    cm_status st = CM_OK;
    if (!t_stream && (s = dnnl_stream_create(&t_stream, g_engine, dnnl_stream_default_flags)) != dnnl_success) {
        st = dnnl_fail(tp, "stream_create", s, &k);
        goto out;
    }
    void *scratch = NULL;
    if (e->scratch_bytes && !(scratch = cmi_scratch(tp, e->scratch_bytes))) {
        st = cmi_status(tp);
        goto out;
    }
    dnnl_memory_t mem[5] = {NULL};
    dnnl_exec_arg_t args[5];
    int nargs = 0;
    struct {
        int arg;
        const dnnl_memory_desc_t *md;
        const void *p;
    } ops[5] = {{DNNL_ARG_SRC, &e->a_md, a},
                {DNNL_ARG_WEIGHTS, &e->b_md, b},
                {DNNL_ARG_DST, &e->c_md, c},
                {DNNL_ARG_BIAS, &e->bias_md, bias},
                {DNNL_ARG_SCRATCHPAD, &e->scratch_md, scratch}};
    for (int i = 0; i < 5; i++) {
        if (!ops[i].p) continue;
        if ((s = dnnl_memory_create(&mem[nargs], ops[i].md, g_engine, (void *)ops[i].p)) != dnnl_success) {
            st = dnnl_fail(tp, "memory_create", s, &k);
            break;
        }
        args[nargs].arg = ops[i].arg;
        args[nargs].memory = mem[nargs];
        nargs++;
    }
    if (!st) {
        if ((s = dnnl_primitive_execute(e->prim, t_stream, nargs, args)) != dnnl_success ||
            (s = dnnl_stream_wait(t_stream)) != dnnl_success)
            st = dnnl_fail(tp, "execute", s, &k);
    }
    for (int i = 0; i < nargs; i++) dnnl_memory_destroy(mem[i]);
out:
    if (owned) dnnl_primitive_destroy(e->prim);
    return st;
}
