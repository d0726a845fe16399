/*
 * Private definitions of the tensor layer: the tensor and node structs and the helpers every op
 * file uses. Not installed.
 *
 * How an op is written (see elementwise.c for the simplest ones):
 *
 *   cm_tensor *cm_foo(cm_tape *tp, cm_tensor *a, cm_tensor *b) {
 *       cm_tensor *ins[2] = {a, b};
 *       if (!cmi_begin(tp, "foo", 2, ins)) return NULL;         // earlier error or NULL input
 *       if (!cmi_check_f32(tp, "foo", "a", a)) return NULL;      // dtype errors name the op
 *       ... shape checks: return cmi_fail(tp, CM_ERR_SHAPE, "foo: ... %s", cmi_shape(a)), NULL;
 *       cm_tensor *out = cmi_new(tp, CM_DTYPE_F32, nd, shape);  // contiguous, in the arena
 *       if (!out) return NULL;
 *       ... compute (inputs may be strided: use cmi_iterate or cm_contiguous first) ...
 *       if (cmi_needs_grad(tp, 2, ins)) {
 *           cm_node *n = cmi_record(tp, "foo", out, 2, ins, foo_backward, sizeof(foo_ctx));
 *           if (!n) return NULL;
 *           ... save what backward needs in n->ctx / n->i / n->f ...
 *       }
 *       return out;
 *   }
 *
 *   static cm_status foo_backward(cm_tape *tp, cm_node *n, const cm_tensor *gout) {
 *       // gout: f32, contiguous, the shape of n->out
 *       cm_tensor *ga = cmi_grad(tp, n->in[0]);  // NULL if in[0] needs no grad (or on OOM)
 *       if (ga) { ... accumulate (+=) into cmi_f32(ga) ... }
 *       return cmi_status(tp);
 *   }
 *
 * Gradients are f32, contiguous, with the tensor's shape; a backward function *adds* into them
 * (cmi_grad zero-initialises on first use). The one exception, private to the tensor layer: a
 * bf16 gradient written by cmi_grad_for_write_as for a producer that takes it (n->bf16_gout).
 * Backward functions run after every node recorded later on the tape, so n->out's gradient is
 * complete when it runs.
 */
#ifndef CM_TENSOR_IMPL_H
#define CM_TENSOR_IMPL_H

#include <composer/tensor.h>

#include <stdarg.h>
#if defined(__AVX512BF16__) && defined(__AVX512DQ__)
#include <immintrin.h>
#endif
#include <string.h>

enum {
    CM_TF_REQUIRES_GRAD = 1u << 0,
    CM_TF_TAPE = 1u << 1,      /* struct (and data, unless a view) lives in a tape arena */
    CM_TF_OWNS_DATA = 1u << 2, /* long-lived: `data` was cm_alloc'ed and is freed with the tensor */
    CM_TF_OWNS_GRAD = 1u << 3, /* long-lived: `grad` was allocated by the library */
    CM_TF_GRAD_ALIAS = 1u << 4, /* on a gradient: it is its view's base's gradient, reshaped (cmi_grad) */
};

typedef struct cm_node cm_node;

struct cm_tensor {
    cm_dtype dtype;
    cm_device device;            /* where data lives (device.c) */
    int ndim;
    int64_t shape[CM_MAX_DIMS];
    int64_t stride[CM_MAX_DIMS]; /* in elements */
    void *data;                  /* element (0, ..., 0) */
    uint32_t flags;
    cm_tensor *grad;             /* f32, contiguous, same shape */
    cm_node *node;               /* the node that produced it (NULL for leaves and no-grad results) */
    char *name;                  /* long-lived tensors only */
};

typedef cm_status (*cm_backward_fn)(cm_tape *tp, cm_node *n, const cm_tensor *gout);

struct cm_node {
    const char *op;
    cm_backward_fn backward;
    cm_tensor *out;
    int n_in;
    cm_tensor **in; /* n_in inputs (entries may be NULL for optional ones) */
    void *ctx;      /* ctx_bytes of op-specific state in the arena (zeroed) */
    int64_t i[8];   /* small integer arguments */
    double f[4];    /* small float arguments */
    cm_node *prev;  /* the node recorded before this one */
    bool bf16_gout; /* its backward takes a bf16 upstream gradient too (see cmi_grad_for_write_as) */
    bool inner;     /* recorded inside a checkpointed region or its replay (checkpoint.c) */
};

/* A generator a checkpointed region drew from, and its state before the region's first draw. */
struct cmi_rng_note {
    cm_rng *rng;
    cm_rng before;
};

struct cm_tape {
    cm_arena *arena;
    cm_node *last;
    int64_t n_nodes;
    bool grad_enabled;
    cm_dtype autocast; /* CM_DTYPE_F32 (off) or CM_DTYPE_BF16: matmul/linear cast f32 inputs */
    cm_status status;
    char error[1024];
    cm_tape_backward_hook_fn bw_hook; /* see cm_tape_set_backward_hook */
    void *bw_hook_data;
    cm_tape_fetch_fn fetch;           /* see cm_tape_set_fetch_hook */
    void *fetch_data;
    cm_tape_op_hook_fn op_hook;       /* see cm_tape_set_op_hook */
    void *op_hook_data;
    int64_t row_first, row_n, row_total; /* see cm_tape_set_rows (row_total 0: none) */
    /* Gradient buffers of large intermediate tensors (tape.c): heap blocks reused across
     * backward passes and steps. A block is handed out by cmi_grad and returned when the node that
     * produced the tensor has run its backward (its gradient is dead then), so backward holds only
     * the gradients still in flight, not every activation's gradient until reset. */
    struct cmi_gblock {
        void *p;
        size_t bytes;
        bool in_use;
        cm_device device; /* where p lives (GPU blocks come from the device's caching allocator) */
    } *gblocks;
    int n_gblocks, cap_gblocks;
    bool retain_grads; /* cm_tape_config.retain_grads */
    /* Devices (device.c). `dev` is the device of the op being built or run: cmi_begin sets it from
     * the op's inputs (all on one device), backward from each node's output; cmi_new allocates
     * there. Creation ops with no inputs use default_dev (cm_tape_set_device). */
    cm_device dev, default_dev;
    cm_arena *dev_arena;  /* the tape's GPU memory (lazily made), rewound with the host arena */
    size_t dev_budget;
    bool poison;
    bool in_backward;
    /* Activation checkpointing (checkpoint.c). ckpt_depth > 0 inside a checkpointed region's
     * forward or its replay (nodes recorded then are `inner`; a cm_tape_checkpoint there runs its
     * function directly). While `replaying`, the tape allocates from its replay arenas, swapped
     * with the main ones (cmi_swap_arenas): alt_arena / alt_dev_arena hold the other pair. */
    int ckpt_depth;
    bool replaying;
    cm_arena *alt_arena, *alt_dev_arena;
    struct cmi_rng_note *notes; /* generators drawn from in the current region (heap, reused) */
    int n_notes, cap_notes;
    cm_tensor **outer;          /* tensors from outside the region it reads (heap, reused) */
    int n_outer, cap_outer;
    int64_t n_ckpt;             /* checkpointed regions recorded since the last reset */
    size_t ckpt_peak;           /* the most both arenas held at once during a replay */
    /* Activation offload (offload.c): the regions recorded since the last reset are aoff[0, n_aoff)
     * of a pool of n_aoff_pool kept across steps; in_aoff while one records. */
    struct cmi_aoff_region **aoff;
    int n_aoff, n_aoff_pool;
    bool in_aoff;
    int64_t n_aoff_regions;     /* offloaded regions recorded since the tape was made */
    size_t aoff_mapped, aoff_mapped_peak; /* device bytes behind the regions: now, the most at once */
    size_t aoff_max_used;                 /* the most bytes one region has held (a new region's first chunk) */
};

/* ---- devices (device.c) ---- */

struct cmi_backend;
/* The backend of the device the current op runs on (NULL on the CPU): an op's device path is
 * `if (be) { be->kernel(...) } else { CPU loops }`. */
const struct cmi_backend *cmi_backend_get(cm_device d);
static inline const struct cmi_backend *cmi_be(const cm_tape *tp) {
    return tp->dev == CM_DEVICE_CPU ? NULL : cmi_backend_get(tp->dev);
}
/* Whether op (the name given to cmi_begin) has a path on dev. */
bool cmi_op_on_device(const char *op, cm_device dev);
/* When s is an error: records it on the tape as "op: <cm_last_error()>" and returns true. */
bool cmi_dev_fail(cm_tape *tp, cm_status s, const char *op);
/* The tape's arena on dev (its host arena for the CPU), made on first use; NULL if the device
 * cannot be used. */
cm_arena *cmi_dev_arena(cm_tape *tp, cm_device dev);
/* The column of the first maximum of each row of x (contiguous f32 (..., C), on any device; NaN
 * propagates, the first NaN wins) into out (host, numel / C entries): one download of the indices
 * instead of the rows (the trainer's accuracy of a GPU's logits). Device scratch from the tape's
 * arena, rewound before returning. Errors: CM_ERR_INVALID_ARG naming x, a device's errors. */
cm_status cmi_argmax_last(cm_tape *tp, const cm_tensor *x, int64_t *out);
/* Scratch memory on the current op's device (cmi_scratch on the CPU). NULL + tape error on OOM. */
void *cmi_dev_scratch(cm_tape *tp, size_t bytes);
/* The arena the current op's tensors and device scratch come from (the device arena on a GPU), for
 * ops that mark and rewind their scratch. */
static inline cm_arena *cmi_op_arena(cm_tape *tp) {
    return tp->dev == CM_DEVICE_CPU ? tp->arena : cmi_dev_arena(tp, tp->dev);
}
/* Raw memory on any device, for the layers above (flat parameter buffers, optimizer state):
 * cm_alloc(_zeroed) on the CPU, the device's caching allocator elsewhere (NULL + cm_set_error). */
void *cmi_dev_alloc(cm_device d, size_t bytes, bool zero);
void cmi_dev_free(cm_device d, void *p);
cm_status cmi_dev_memcpy(void *dst, cm_device dd, const void *src, cm_device sd, size_t bytes);
cm_status cmi_dev_memset(cm_device d, void *p, int v, size_t bytes);
/* The device whose memory p points into (CM_DEVICE_CPU for host memory and NULL): flat spans
 * handed to the optimizer and clipping are told apart this way. */
cm_device cmi_ptr_device(const void *p);
/* Frees the device data of a long-lived tensor (cm_tensor_free). */
void cmi_dev_free_data(cm_tensor *t);
/* dst = src read through strides sstride (src broadcast to dst's shape), any devices and dtypes:
 * one backend copy on a GPU, or a staged transfer between host and GPU. */
cm_status cmi_copy_any(cm_tensor *dst, const cm_tensor *src, const int64_t *sstride);

/* ---- op plumbing ---- */

/* False when the tape already failed or one of the n required inputs is NULL (recording
 * CM_ERR_INVALID_ARG "op: input k is NULL" if the tape had no error yet). */
bool cmi_begin(cm_tape *tp, const char *op, int n, cm_tensor *const *ins);
/* Activation offload (offload.c): frees the regions' pool (cm_tape_free, cm_tape_trim); unmaps the
 * regions of the pass (cm_tape_reset); before node n's backward, brings back the offloaded region
 * its output or inputs lie in (false + tape error on failure). */
void cmi_aoff_free(cm_tape *tp);
void cmi_aoff_reset(cm_tape *tp);
bool cmi_aoff_before_node(cm_tape *tp, const cm_node *n);

/* Before an op reads optional inputs (a bias, a norm's weight): runs the tape's fetch hook on
 * each non-NULL one (cmi_begin does it for the required inputs). False + tape error if it fails. */
bool cmi_fetch(cm_tape *tp, int n, cm_tensor *const *ts);
/* The dropout mask of a contiguous tensor of `numel` elements whose dim 0 has `rows` rows:
 * drop[i] = 1 where element i is dropped (probability p), from rng. With the tape's row context
 * (cm_tape_set_rows) and rows equal to its row count, each row's numbers come from its own block
 * range, keyed by its global row (rng's counter + global row · ceil(numel/rows / 4)), and the
 * counter advances by the whole global batch's blocks: the mask of a row does not depend on how
 * the batch is split. Otherwise the numbers are drawn in sequence and the counter advances by
 * ceil(numel / 4). */
void cmi_dropout_mask(const cm_tape *tp, cm_rng *rng, uint8_t *drop, int64_t rows, int64_t numel, float p);
/* Before an op draws from rng: inside a checkpointed region, remembers rng's state so the replay
 * draws the same numbers (checkpoint.c). */
void cmi_rng_note(cm_tape *tp, cm_rng *rng);
/* Records the first error on the tape and in cm_last_error(); returns s. */
cm_status cmi_fail(cm_tape *tp, cm_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
cm_status cmi_failv(cm_tape *tp, cm_status s, const char *fmt, va_list ap);
static inline cm_status cmi_status(const cm_tape *tp) { return tp->status; }
/* Records an error if t is not f32: "op: 'name' has dtype bf16; this op needs f32 (cast with cm_cast)". */
bool cmi_check_f32(cm_tape *tp, const char *op, const char *name, const cm_tensor *t);
/* Same for integer index tensors (i32, i64, u8 accepted). */
bool cmi_check_index(cm_tape *tp, const char *op, const char *name, const cm_tensor *t);
/* Normalises a possibly negative axis; records CM_ERR_INVALID_ARG and returns false if out of range. */
bool cmi_axis(cm_tape *tp, const char *op, int ndim, int *axis);

/* "(2, 3, 4)" in a thread-local ring of 8 buffers: valid for the next 7 calls on this thread. */
const char *cmi_shape(const cm_tensor *t);
const char *cmi_shape_of(int ndim, const int64_t *shape);

/* ---- allocation ---- */

/* A contiguous tensor in the tape's arena (data uninitialised; NaN when the tape poisons).
 * NULL + tape error on OOM. */
cm_tensor *cmi_new(cm_tape *tp, cm_dtype dt, int ndim, const int64_t *shape);
cm_tensor *cmi_zeros(cm_tape *tp, cm_dtype dt, int ndim, const int64_t *shape);
/* A view struct in the arena sharing `data`. */
cm_tensor *cmi_view(cm_tape *tp, cm_dtype dt, int ndim, const int64_t *shape, const int64_t *stride, void *data);
/* b when w is exactly bᵀ, recorded on the tape as a view (cm_transpose/cm_permute) of the contiguous
 * 2-D tensor b; NULL otherwise (also when w has no node, i.e. needs no gradient). Lets an op read
 * and differentiate b directly instead of going through the view's transposed gradient. */
cm_tensor *cmi_transposed_base(const cm_tensor *w);
/* Scratch memory from the arena (NULL + tape error on OOM). */
void *cmi_scratch(cm_tape *tp, size_t bytes);

/* ---- autograd ---- */

bool cmi_needs_grad(const cm_tape *tp, int n, cm_tensor *const *ins);
/* Records a node producing `out` from the n inputs (copied; NULL entries allowed) and marks out as
 * requiring grad. ctx_bytes of zeroed context. NULL + tape error on OOM. */
cm_node *cmi_record(cm_tape *tp, const char *op, cm_tensor *out, int n, cm_tensor *const *ins, cm_backward_fn fn,
                    size_t ctx_bytes);
/* The gradient buffer of t, created as zeros on first use (arena for tape tensors, heap for
 * long-lived ones). NULL when t is NULL or does not require grad, or on OOM (tape error set). */
cm_tensor *cmi_grad(cm_tape *tp, cm_tensor *t);
/* As cmi_grad, but a gradient it creates now is left uninitialised and *fresh is set: the caller
 * must then write every element (instead of adding). *fresh is false for one that existed or that
 * had to be zeroed anyway (long-lived leaves, retain_grads, views sharing their base's). */
cm_tensor *cmi_grad_for_write(cm_tape *tp, cm_tensor *t, bool *fresh);
/* As cmi_grad_for_write, but a gradient created now has dtype dt (CM_DTYPE_BF16) when t is bf16 and
 * was produced by a node whose backward takes a bf16 upstream gradient (n->bf16_gout: a bf16
 * convolution, which rounds its upstream gradient to bf16 anyway, so the producer's rounding pass
 * disappears into the consumer's write; batch norm with a bf16 output, which reads it widened,
 * so the gradient crosses memory in half the bytes) — PyTorch's autocast keeps such gradients in
 * bf16 too. Callers: batch norm for its bf16 x, bf16 convolutions for their bf16 x. Otherwise (and with retain_grads) exactly cmi_grad_for_write: the caller checks the
 * returned dtype. Any later cmi_grad / cmi_accum of t, and a backward without bf16_gout reaching
 * it, first turns a bf16 gradient into an f32 one (promotes it), so other consumers still see
 * f32. */
cm_tensor *cmi_grad_for_write_as(cm_tape *tp, cm_tensor *t, cm_dtype dt, bool *fresh);
/* The base of t when t is a recorded view that covers all of it in its element order (a reshape
 * of a contiguous tensor, [un]squeeze): t's gradient can then be the base's, reshaped. Else NULL. */
cm_tensor *cmi_view_alias_base(const cm_tensor *t);
/* Adds g (f32, contiguous, shape broadcast-compatible: t's shape after broadcasting) into t's
 * gradient, summing over broadcast dims. No-op if t needs no grad. */
cm_status cmi_accum(cm_tape *tp, cm_tensor *t, const cm_tensor *g);

/* Runs the backward of the nodes from `last` back along prev to NULL, each whose output has a
 * gradient; with `hooks` the backward hook too (the tape's own chain; a replayed region's nodes
 * run without it). Intermediate gradients are released as their producers run. */
cm_status cmi_run_backward(cm_tape *tp, cm_node *last, bool hooks);
/* A heap block of at least `bytes` on dev from the tape's gradient pool (NULL on OOM), and its
 * return. */
void *cmi_gpool_take(cm_tape *tp, size_t bytes, cm_device dev);
void cmi_gpool_give(cm_tape *tp, void *p);
/* Exchanges the tape's arenas with its alternate pair (checkpoint.c's replay arenas). */
void cmi_swap_arenas(cm_tape *tp);

/* GEMMs for ops outside matmul.c (matmul.c): C (M, N), rows ldc apart, = op(A) (M, K) · op(B) (K, N)
 * [+ bias (N)] [+ C when acc], A and B of dtype dt (f32 or bf16), C f32; on the tape's device.
 * Errors are recorded on the tape. cmi_bf16_copy: an unrecorded bf16 copy of t (contiguous) in
 * arena scratch, as autocast multiplies an f32 operand; NULL + tape error on failure. */
cm_status cmi_gemm(cm_tape *tp, cm_dtype dt, int64_t M, int64_t N, int64_t K, const char *a, int64_t lda, bool ta,
                   const char *b, int64_t ldb, bool tb, const float *bias, bool acc, float *c, int64_t ldc);
const char *cmi_bf16_copy(cm_tape *tp, cm_tensor *t);
/* A contiguous (rows, cols) device matrix t as dt in device scratch, followed by rows_to - rows rows
 * of zeros: an operand padded to whole 16-byte rows for cuBLASLt once, where matmul.cu would pad
 * it for every GEMM (linear's backward, linear_cross_entropy). NULL + tape error on failure. */
const char *cmi_dev_rows_padded(cm_tape *tp, const cm_tensor *t, cm_dtype dt, int64_t rows_to, const char *op);

static inline float *cmi_f32(const cm_tensor *t) { return (float *)t->data; }

/* memset / memcpy split over the threads when large (one core does not reach the memory
 * bandwidth two do; the other thread would wait in the OpenMP pool meanwhile). */
void cmi_parallel_memset(void *p, int v, size_t bytes);
void cmi_parallel_memcpy(void *dst, const void *src, size_t bytes);
/* d[i] = s[i] rounded to bf16 (cmi_f32_to_bf16) / widened to f32 (exact), i < n; in parallel when
 * large. */
void cmi_bf16_round(uint16_t *d, const float *s, int64_t n);
void cmi_bf16_widen(float *d, const uint16_t *s, int64_t n);

/* cm_f32_to_bf16 (round to nearest even, NaN stays a quiet NaN) written without a branch, so loops
 * over it vectorise (the out-of-line call was 6% of an amp_bf16 GPT step). */
static inline uint16_t cmi_f32_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}
/* d[i] = cmi_f32_to_bf16(s[i]) for i < n, n a multiple of 16, serially (for rows inside parallel
 * loops). Built with AVX512-BF16 (-march=native on such a CPU) it runs vcvtneps2bf16, which rounds
 * the same way except that it flushes denormal inputs to zero: lanes holding one (vfpclassps) are
 * redone by the formula, so the result is the formula's for every input. */
static inline void cmi_bf16_round16(uint16_t *restrict d, const float *restrict s, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
#if defined(__AVX512BF16__) && defined(__AVX512DQ__)
        const __m512 v = _mm512_loadu_ps(s + i);
        _mm256_storeu_si256((__m256i *)(d + i), (__m256i)_mm512_cvtneps_pbh(v));
        const unsigned den = _mm512_fpclass_ps_mask(v, 0x20); /* denormal inputs */
        if (__builtin_expect(den != 0, 0))
            for (int l = 0; l < 16; l++)
                if (den >> l & 1u) d[i + l] = cmi_f32_to_bf16(s[i + l]);
#else
        for (int l = 0; l < 16; l++) d[i + l] = cmi_f32_to_bf16(s[i + l]);
#endif
    }
}

/* cmi_bf16_round16 for any n: the multiple-of-16 part, then the rest by the formula. */
static inline void cmi_bf16_round_n(uint16_t *restrict d, const float *restrict s, int64_t n) {
    const int64_t n16 = n - n % 16;
    cmi_bf16_round16(d, s, n16);
    for (int64_t i = n16; i < n; i++) d[i] = cmi_f32_to_bf16(s[i]);
}

static inline float cmi_bf16_to_f32(uint16_t x) {
    const uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- shapes and iteration ---- */

int64_t cmi_numel(int ndim, const int64_t *shape);
void cmi_contig_strides(int ndim, const int64_t *shape, int64_t *stride);
bool cmi_is_contig(const cm_tensor *t);
/* Broadcasts two shapes (NumPy rules). False if incompatible. */
bool cmi_broadcast_shapes(int na, const int64_t *sa, int nb, const int64_t *sb, int *nout, int64_t *sout);
/* Strides of t viewed as broadcast to (ndim, shape): 0 on stretched or new leading dims. */
void cmi_broadcast_strides(const cm_tensor *t, int ndim, const int64_t *shape, int64_t *stride);

/* Calls fn once per innermost row of an n-d iteration space with n_ops operands (at most 4).
 * strides[k] gives operand k's strides in elements; bases[k] its element (0,...,0); esize[k] its
 * element size. Dims are collapsed where possible; rows run in parallel (OpenMP) when the space is
 * large and `parallel` is set — only when no two rows write the same memory. fn gets the row
 * length, the row start pointers and the inner strides in elements. */
typedef void (*cmi_row_fn)(int64_t n, char *const *ptrs, const int64_t *inner, void *ctx);
void cmi_iterate(int ndim, const int64_t *shape, int n_ops, int64_t (*strides)[CM_MAX_DIMS], char *const *bases,
                 const size_t *esize, bool parallel, cmi_row_fn fn, void *ctx);

/* Conversions between element types (used by copy and cast). */
double cmi_load(cm_dtype dt, const void *p);
void cmi_store(cm_dtype dt, void *p, double v);

/* Threshold (elements) above which simple kernels go parallel. */
#define CMI_PAR_MIN 32768

/* linear's bf16 backward rounds the upstream gradient to bf16 and multiplies it in row blocks of
 * at most this many bytes (GPT-2's lm_head gradient, 2048 × 50257, would be 196 MiB at once). */
#define CMI_LINEAR_DY_BLOCK ((size_t)48 << 20)
#define CMI_LINEAR_DY_BLOCK_DEVICE ((size_t)256 << 20)
/* The device's block, CMI_LINEAR_DY_BLOCK_DEVICE unless a test lowers it (test_backend_ops runs the
 * blocked backward on shapes the CUDA emulator can take); read by linear's backward only. */
extern size_t cmi_linear_dy_block_device;

#endif
