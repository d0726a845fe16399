/*
 * composer/tensor.h — tensors, the autograd tape and the ops.
 *
 * A cm_tensor is an n-dimensional view (dtype, shape, strides) over memory. Long-lived tensors
 * (parameters, buffers, datasets) are made with cm_tensor_new / cm_tensor_from_data and freed by
 * the caller with cm_tensor_free. Everything an op produces lives in the arena of a cm_tape: ops
 * compute eagerly and, when gradients are on and an input requires them, record a backward node on
 * the tape. cm_tape_backward() runs the nodes in reverse; gradients accumulate into each leaf's
 * .grad. cm_tape_reset() forgets the nodes and rewinds the arena — every tensor the tape made is
 * gone after it, leaves and their gradients stay.
 *
 * Ops chain: an op returns NULL on failure and records the first error on the tape (and in
 * cm_last_error()); an op given a NULL input, or called on a tape that already failed, returns NULL
 * at once. Model code checks once, at the end.
 *
 *     cm_tape *tp;
 *     cm_tape_new(NULL, &tp);                                   // default config: no budget
 *     int64_t wshape[2] = {10, 784};
 *     cm_tensor *w;
 *     cm_tensor_new(CM_DTYPE_F32, 2, wshape, &w);
 *     cm_rng rng = cm_rng_init(0, 0);
 *     cm_tensor_init_kaiming_uniform(w, &rng, CM_FAN_IN, 0.0f);
 *     cm_tensor_set_requires_grad(w, true);
 *
 *     cm_tensor *logits = cm_linear(tp, x, w, NULL);           // x: (B, 784) -> (B, 10)
 *     cm_tensor *loss = cm_cross_entropy(tp, logits, labels, NULL);
 *     if (!loss || cm_tape_backward(tp, loss) != CM_OK)
 *         fprintf(stderr, "%s\n", cm_tape_error(tp));
 *     const float *dw = cm_tensor_data(cm_tensor_grad(w));      // (10, 784)
 *     cm_tape_reset(tp);                                        // next step
 *
 * Threading: a tape, and the tensors it made, belong to one thread at a time. Kernels use OpenMP
 * internally (cm_num_threads()).
 *
 * Dtypes: the math ops compute in f32. bf16 inputs are accepted by cm_matmul / cm_linear (oneDNN,
 * f32 accumulation, f32 result); integer tensors serve as indices; cm_cast converts between all
 * dtypes (its gradient converts back). Any other dtype gives CM_ERR_DTYPE naming the op.
 */
#ifndef COMPOSER_TENSOR_H
#define COMPOSER_TENSOR_H

#include <composer/base.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CM_MAX_DIMS 8

/* X-macro: name, enum suffix, element size in bytes. */
#define CM_DTYPE_LIST(X) \
    X(f32, F32, 4)       \
    X(bf16, BF16, 2)     \
    X(f16, F16, 2)       \
    X(i32, I32, 4)       \
    X(i64, I64, 8)       \
    X(u8, U8, 1)

typedef enum cm_dtype {
#define CM_X_(name, up, size) CM_DTYPE_##up,
    CM_DTYPE_LIST(CM_X_)
#undef CM_X_
    CM_DTYPE_COUNT
} cm_dtype;

const char *cm_dtype_name(cm_dtype dt);  /* "f32", "bf16", ... ("?" if out of range) */
size_t cm_dtype_size(cm_dtype dt);        /* bytes per element (0 if out of range) */
/* Parses "f32"/"float32", "bf16"/"bfloat16", "f16"/"float16", "i32"/"int32", "i64"/"int64",
 * "u8"/"uint8". CM_ERR_INVALID_ARG naming the accepted names otherwise. */
cm_status cm_dtype_parse(const char *s, cm_dtype *out);

/* Scalar conversions (round to nearest even). */
uint16_t cm_f32_to_bf16(float x);
float cm_bf16_to_f32(uint16_t x);
uint16_t cm_f32_to_f16(float x);
float cm_f16_to_f32(uint16_t x);

typedef struct cm_tensor cm_tensor;
typedef struct cm_tape cm_tape;

/* ---------------------------------------------------------------------------------------------
 * Devices
 *
 * Every tensor lives on a device: the CPU (host memory, the default) or the CUDA GPU of this
 * process (its current device; one GPU per process — ranks pick theirs by local rank). An op runs
 * on the device of its inputs and puts its result there; inputs on different devices are an error
 * naming both (move one with cm_to_device / cm_tensor_to_device). cm_tensor_data of a GPU tensor
 * is a device pointer: read it with cm_tensor_copy into a CPU tensor, or cm_tensor_get (one
 * element, slow). Ops not yet written for the GPU fail with CM_ERR_UNSUPPORTED naming the op and
 * the device, never by computing on the wrong memory.
 *
 * Builds: the CUDA backend is compiled in when CMake finds the CUDA toolkit (-DCM_CUDA=AUTO, the
 * default; ON requires it, OFF leaves it out). -DCM_CUDA=EMU builds it for the CUDA emulator,
 * which runs the same kernels on the CPU (tests of the kernels on machines without a GPU).
 * ------------------------------------------------------------------------------------------- */

typedef enum cm_device { CM_DEVICE_CPU = 0, CM_DEVICE_CUDA = 1, CM_DEVICE_COUNT } cm_device;

const char *cm_device_name(cm_device d); /* "cpu", "cuda" ("?" out of range) */
/* Parses "cpu", and "gpu", "cuda" or "cuda:0" as CM_DEVICE_CUDA. CM_ERR_INVALID_ARG otherwise. */
cm_status cm_device_parse(const char *s, cm_device *out);
/* CM_OK when tensors can live on d. For CUDA the error (CM_ERR_UNSUPPORTED) says which piece is
 * missing: a build without CUDA (rebuild with -DCM_CUDA=ON on a machine with the CUDA toolkit), no
 * NVIDIA driver, or no GPU visible (CUDA_VISIBLE_DEVICES). The first call initialises the device. */
cm_status cm_device_check(cm_device d);
/* A description of the device ("NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB)", "cpu"), or ""
 * if it is not available. The string is static. */
const char *cm_device_describe(cm_device d);
/* The dense peak FLOP/s of device d for computing in `dt` (bf16: the tensor cores; f32: the CUDA
 * cores' FMA rate; CM_DTYPE_F16 is read as TF32, the rate of f32 GEMMs on tensor cores), from a
 * table of NVIDIA data sheets looked up by the device's name: H100 SXM/PCIe/NVL, H200, A100, L40S,
 * L4, RTX 4090. Errors: CM_ERR_NOT_FOUND naming the device when it is not in the table (pass the
 * peak explicitly, e.g. SpeedMonitor's peak_flops), cm_device_check's; the CPU is
 * CM_ERR_INVALID_ARG (cm_peak_flops measures it). */
cm_status cm_device_peak_flops(cm_device d, cm_dtype dt, double *out);

/* Waits for all work queued on d (nothing to do on the CPU). Errors: CM_ERR_DEVICE naming the
 * failed kernel's error, if an earlier launch failed asynchronously. */
cm_status cm_device_synchronize(cm_device d);

/* Memory a device has handed out, in bytes: `allocated` the caching allocator's blocks in use by
 * live tensors and arenas' chunks (a cached block is reused for a request of at least half its
 * size, so a block may be up to twice what it serves), `reserved` held by the caching allocator
 * (allocated plus cached free blocks), `peak` the largest `allocated` since the last reset, `total`
 * the device's memory; `requested` what the live allocations asked for, each rounded up to 512
 * bytes, and `peak_requested` its largest since the last reset — PyTorch's allocated_bytes and
 * torch.cuda.max_memory_allocated(), the figures to compare with it. CPU: zeros. */
typedef struct cm_device_memory {
    size_t allocated, reserved, peak, total;
    size_t requested, peak_requested;
} cm_device_memory;
cm_status cm_device_memory_stats(cm_device d, cm_device_memory *out);
void cm_device_reset_peak(cm_device d);
/* The caching allocator's byte budget for d (0 = the device's memory): beyond it allocations fail
 * with CM_ERR_OOM as if the device were full (tests of automatic microbatching use it). */
void cm_device_set_memory_budget(cm_device d, size_t bytes);

/* ---------------------------------------------------------------------------------------------
 * Long-lived tensors
 * ------------------------------------------------------------------------------------------- */

/* A new contiguous tensor of zeros, owned by the caller (free with cm_tensor_free). ndim 0..8;
 * every dim ≥ 0. Errors: CM_ERR_INVALID_ARG (bad ndim or dims, naming them), CM_ERR_OOM. */
cm_status cm_tensor_new(cm_dtype dt, int ndim, const int64_t *shape, cm_tensor **out);

/* A contiguous tensor over caller memory (not copied, not freed by cm_tensor_free). `data` must
 * stay valid for the tensor's life and be aligned to the element size. */
cm_status cm_tensor_from_data(cm_dtype dt, int ndim, const int64_t *shape, void *data, cm_tensor **out);

/* A new contiguous tensor of zeros on device `dev` (cm_tensor_new's semantics otherwise). Errors as
 * cm_tensor_new, and cm_device_check's for an unavailable device; CM_ERR_OOM when the device's
 * memory (or its budget) is exhausted. */
cm_status cm_tensor_new_on(cm_device dev, cm_dtype dt, int ndim, const int64_t *shape, cm_tensor **out);
/* A long-lived contiguous copy of t (any strides) on `dev`, same dtype and shape; no gradient. */
cm_status cm_tensor_to_device(const cm_tensor *t, cm_device dev, cm_tensor **out);

/* Frees a tensor made by cm_tensor_new / cm_tensor_from_data, and its gradient. NULL is a no-op.
 * Tensors made by a tape must not be passed here (the tape owns them). */
void cm_tensor_free(cm_tensor *t);

/* ---------------------------------------------------------------------------------------------
 * Inspection (borrowed pointers; valid while the tensor lives)
 * ------------------------------------------------------------------------------------------- */

cm_dtype cm_tensor_dtype(const cm_tensor *t);
cm_device cm_tensor_device(const cm_tensor *t);
int cm_tensor_ndim(const cm_tensor *t);
const int64_t *cm_tensor_shape(const cm_tensor *t);
const int64_t *cm_tensor_strides(const cm_tensor *t); /* in elements */
int64_t cm_tensor_dim(const cm_tensor *t, int axis);  /* negative axes count from the end */
int64_t cm_tensor_numel(const cm_tensor *t);
size_t cm_tensor_nbytes(const cm_tensor *t);          /* numel × element size */
bool cm_tensor_is_contiguous(const cm_tensor *t);
/* Pointer to element (0, ..., 0). For a non-contiguous view, index with the strides. */
void *cm_tensor_data(const cm_tensor *t);
/* Writes "(2, 3, 4)" into buf (always NUL-terminated) and returns buf. */
char *cm_tensor_shape_str(const cm_tensor *t, char *buf, size_t cap);

/* Element access for tests and small tools (any dtype, any strides; value converted to/from
 * double). `index` has ndim entries. On a GPU tensor each call copies one element (slow). */
double cm_tensor_get(const cm_tensor *t, const int64_t *index);
void cm_tensor_set(cm_tensor *t, const int64_t *index, double v);
/* Element at flat position i of the row-major order of the view. */
double cm_tensor_get_flat(const cm_tensor *t, int64_t i);

/* An optional name used in error messages ("w1"); the string is copied. */
cm_status cm_tensor_set_name(cm_tensor *t, const char *name);
const char *cm_tensor_name(const cm_tensor *t); /* "" if none */

/* ---------------------------------------------------------------------------------------------
 * Gradients
 * ------------------------------------------------------------------------------------------- */

/* Marks a tensor as a leaf that wants a gradient. Only floating dtypes may require gradients
 * (CM_ERR_DTYPE otherwise). */
cm_status cm_tensor_set_requires_grad(cm_tensor *t, bool on);
bool cm_tensor_requires_grad(const cm_tensor *t);

/* The accumulated gradient (same shape as t, contiguous, always f32 — also for bf16/f16 tensors,
 * so master weights never lose precision), or NULL if none yet. (One exception, seen only by a
 * backward hook: during backward, the gradient of a bf16 convolution output written by batch
 * norm, and that of a bf16 batch norm output written by a bf16 convolution, is held in bf16 until
 * the producing node has run, as PyTorch's autocast holds it; it is dropped then, and with
 * retain_grads, or when another op also uses the tensor, it is f32.) For a
 * long-lived tensor the gradient is long-lived too (freed with the tensor); for a tape tensor it
 * lives in the tape's memory until cm_tape_reset — except that an intermediate tensor's gradient
 * (one made by an op) is dropped during backward once its node has run, unless the tape was made
 * with cm_tape_config.retain_grads (see there). */
cm_tensor *cm_tensor_grad(const cm_tensor *t);

/* Zeroes the gradient if there is one. */
void cm_tensor_zero_grad(cm_tensor *t);

/* Drops the gradient (freeing it if the library allocated it). */
void cm_tensor_clear_grad(cm_tensor *t);

/* Makes `grad` the gradient buffer of `t` (same shape, f32, contiguous; borrowed, not freed
 * with t). The flat-buffer layer uses this to put all gradients of a unit in one block. */
cm_status cm_tensor_set_grad(cm_tensor *t, cm_tensor *grad);

/* ---------------------------------------------------------------------------------------------
 * Non-differentiable in-place utilities on any tensor
 * ------------------------------------------------------------------------------------------- */

cm_status cm_tensor_fill(cm_tensor *t, double v);
/* Copies src into dst elementwise: src broadcasts to dst's shape, dtypes convert. Handles any
 * strides, and copies between devices (staging through a contiguous buffer when either side is
 * strided). Errors: CM_ERR_SHAPE naming both shapes; a device's errors. */
cm_status cm_tensor_copy(cm_tensor *dst, const cm_tensor *src);
/* dst[i] = start + i*step in row-major order. */
cm_status cm_tensor_arange_fill(cm_tensor *t, double start, double step);

/* Initialisers (f32 tensors; bf16/f16 are filled through f32). Each consumes rng counter values,
 * so the same rng state gives the same tensor. */
typedef enum cm_fan_mode { CM_FAN_IN = 0, CM_FAN_OUT = 1 } cm_fan_mode;
cm_status cm_tensor_init_uniform(cm_tensor *t, cm_rng *rng, float lo, float hi);
cm_status cm_tensor_init_normal(cm_tensor *t, cm_rng *rng, float mean, float std);
/* Normal(mean, std) redrawn (by inverse CDF) into [a, b], as torch.nn.init.trunc_normal_. */
cm_status cm_tensor_init_trunc_normal(cm_tensor *t, cm_rng *rng, float mean, float std, float a, float b);
/* Kaiming/He, as torch.nn.init.kaiming_*_ with nonlinearity 'leaky_relu' and slope `a`
 * (a = 0 is ReLU): gain = sqrt(2 / (1 + a²)), std = gain / sqrt(fan). fan from dims: for
 * (out, in, k...) fan_in = in × prod(k), fan_out = out × prod(k). */
cm_status cm_tensor_init_kaiming_uniform(cm_tensor *t, cm_rng *rng, cm_fan_mode mode, float a);
cm_status cm_tensor_init_kaiming_normal(cm_tensor *t, cm_rng *rng, cm_fan_mode mode, float a);
/* Xavier/Glorot: std = gain × sqrt(2 / (fan_in + fan_out)). */
cm_status cm_tensor_init_xavier_uniform(cm_tensor *t, cm_rng *rng, float gain);
cm_status cm_tensor_init_xavier_normal(cm_tensor *t, cm_rng *rng, float gain);

/* ---------------------------------------------------------------------------------------------
 * The tape
 * ------------------------------------------------------------------------------------------- */

typedef struct cm_tape_config {
    size_t arena_budget; /* bytes for activations, gradients and nodes per step; 0 = unlimited */
    bool poison;         /* fill new arena memory with NaN (tests) */
    /* Keep the gradient of every intermediate tensor (one made by an op) until the tape resets.
     * false (default): as PyTorch's non-leaf tensors, an intermediate's gradient is dropped
     * (cm_tensor_grad gives NULL) once the node that made it has run its backward, and its memory
     * is reused by the rest of the backward pass — backward then holds only the gradients still in
     * flight instead of one per activation. Leaves' gradients are always kept. */
    bool retain_grads;
    /* Bytes of GPU memory for the tape's tensors on the GPU per step (its device arena; 0 =
     * unlimited, i.e. what the device's caching allocator can give). Going over it is CM_ERR_OOM,
     * as for arena_budget, so automatic microbatching works the same on both devices. */
    size_t device_budget;
} cm_tape_config;

cm_tape_config cm_tape_config_default(void);

/* A new tape; cfg NULL means cm_tape_config_default(). Errors: CM_ERR_OOM. */
cm_status cm_tape_new(const cm_tape_config *cfg, cm_tape **out);
void cm_tape_free(cm_tape *tp);

/* Forgets every node and every tensor the tape made (their memory is reused), clears the
 * tape's error. Leaves and their gradients are untouched. */
void cm_tape_reset(cm_tape *tp);

/* Gradient recording. cm_tape_set_grad_enabled returns the previous setting, so a no-grad scope
 * is `bool prev = cm_tape_set_grad_enabled(tp, false); ...; cm_tape_set_grad_enabled(tp, prev);`.
 * Also sets training-mode-free: dropout and batch_norm take their mode as an argument. */
bool cm_tape_set_grad_enabled(cm_tape *tp, bool on);
bool cm_tape_grad_enabled(const cm_tape *tp);

/* Autocast for mixed precision. With CM_DTYPE_BF16, cm_matmul, cm_linear and cm_conv2d cast their
 * f32 inputs (a and b; x and w — not the bias) to bf16 and run the bf16 GEMM or convolution (f32
 * accumulation, f32 result); gradients flow back in f32 to the f32 tensors, such as master weights
 * (cm_matmul records cm_cast nodes; cm_linear makes its bf16 copies in scratch that is freed after
 * the GEMM, makes them again in backward, and accumulates its backward GEMMs straight into the f32
 * tensors' gradients, so autocast keeps no more memory than f32; cm_conv2d rounds x and w to bf16
 * inside the convolution and likewise gives their gradients straight to them). Every other op is
 * unaffected (attention, norms, softmax and losses stay f32).
 * CM_DTYPE_F32 turns it off (the default). Returns the previous setting; any other dtype is
 * ignored (the setting is unchanged). */
cm_dtype cm_tape_set_autocast(cm_tape *tp, cm_dtype dt);
cm_dtype cm_tape_autocast(const cm_tape *tp);

/* Back-propagates from a scalar `loss` (numel 1): gradients accumulate into every leaf that
 * requires one. Nodes stay recorded until cm_tape_reset (calling twice accumulates twice).
 * Errors: CM_ERR_SHAPE if loss is not a scalar, CM_ERR_STATE if loss does not require grad,
 * CM_ERR_OOM (arena budget) — and the tape's first error, if it already failed. */
cm_status cm_tape_backward(cm_tape *tp, cm_tensor *loss);
/* As above from any tensor with an explicit upstream gradient `grad` (same shape, f32). */
cm_status cm_tape_backward_with(cm_tape *tp, cm_tensor *out, const cm_tensor *grad);

/* A function backward calls as it goes: once with node NULL before the first node, then after
 * each node whose backward ran (`node` is the tape's private cm_node; src/tensor/tensor_impl.h
 * describes it). The distributed layer uses it to start a gradient bucket's all-reduce as soon as
 * backward has finished writing that bucket. NULL fn removes it; it survives cm_tape_reset. It must
 * not record on or reset the tape. */
typedef void (*cm_tape_backward_hook_fn)(cm_tape *tp, const void *node, void *data);
void cm_tape_set_backward_hook(cm_tape *tp, cm_tape_backward_hook_fn fn, void *data);

/* A function the tape calls around every op, for profiling (composer/profiler.h installs one on
 * the trainer's tape while it records): BEGIN when an op has checked its required inputs
 * (n_in, ins; out NULL), RECORDED when it has computed its output and recorded its backward node
 * (out, and every input in order, NULL entries allowed), and BACKWARD_BEGIN / BACKWARD_END around
 * each node's backward (the node's op, out and inputs). Ops that record no node (gradients off,
 * or no input requiring one) give BEGIN only. NULL fn removes it; it survives cm_tape_reset. It
 * must not record on, reset or fail the tape. */
typedef enum cm_tape_op_phase {
    CM_TAPE_OP_BEGIN = 0,
    CM_TAPE_OP_RECORDED = 1,
    CM_TAPE_OP_BACKWARD_BEGIN = 2,
    CM_TAPE_OP_BACKWARD_END = 3
} cm_tape_op_phase;
typedef void (*cm_tape_op_hook_fn)(cm_tape_op_phase phase, const char *op, const cm_tensor *out, int n_in,
                                   cm_tensor *const *ins, void *data);
void cm_tape_set_op_hook(cm_tape *tp, cm_tape_op_hook_fn fn, void *data);

/* A function every op calls on each tensor input before reading it (in forward, also with
 * gradients off), and backward calls on each input of a node before running the node's backward.
 * Returning an error fails the op (the tape records it). The distributed layer's FULL_SHARD uses
 * it to all-gather a wrap unit's parameters the moment something reads them — views of a
 * parameter included, since the hook sees the tensor's data address. NULL fn removes it; it
 * survives cm_tape_reset. It must not record on or reset the tape. */
typedef cm_status (*cm_tape_fetch_fn)(cm_tape *tp, const cm_tensor *t, void *data);
void cm_tape_set_fetch_hook(cm_tape *tp, cm_tape_fetch_fn fn, void *data);

/* Row context for random ops: the batch tensors of the coming forward hold, in their dim 0, the
 * global rows [first, first + n) of a global batch of `total` rows. Dropout then draws each row's
 * mask from numbers keyed by its global row (see cm_dropout), so the masks do not depend on how
 * the global batch is split into microbatches or over ranks — N ranks train exactly like one
 * process also with dropout. The trainer sets it for every microbatch. total 0 clears it (the
 * default: numbers drawn in sequence). Survives cm_tape_reset. */
void cm_tape_set_rows(cm_tape *tp, int64_t first, int64_t n, int64_t total);
/* The row context (false and zeros when none is set): for random modules of their own that key
 * their draws by global row as cm_dropout does. */
bool cm_tape_rows(const cm_tape *tp, int64_t *first, int64_t *n, int64_t *total);

/* Activation checkpointing: cm_tape_checkpoint(tp, fn, data, n_in, in) returns fn(tp, n_in, in, data)
 * but keeps, of everything fn computed, only its result. With gradients on it records one node;
 * its backward replays the region — runs fn again with gradients on, on the same inputs, then
 * backpropagates the node's upstream gradient through what the replay recorded — so the region's
 * activations exist only while it runs forward and while its backward runs. Gradients (to the
 * inputs, to parameters and to any tensor made before the call that fn reads) are those the
 * region gives without checkpointing, bit for bit: the forward runs fn exactly as it runs without
 * checkpointing, and the replay runs it again with the tape as it was — the generators of the
 * random ops (cm_dropout, cm_attention's dropout) back at the states they had, so the masks are
 * the same; the row context (cm_tape_set_rows) and autocast as they were. Generators end at the
 * states the forward left them in; batch norm does not update its running statistics again in a
 * replay (see cm_tape_replaying). The replay's memory comes from a second arena, reset after the
 * region's backward, which counts against what is left of arena_budget.
 * fn must compute the same thing when run again: read only `in`, long-lived tensors and tensors the
 * tape made before the call; draw random numbers only through the tape's random ops; keep no
 * pointer to what it makes; return one tensor it made (an input returned as is, or a result that
 * needs no gradient, is returned without checkpointing anything). Entries of `in` may be NULL
 * (optional inputs), and fn sees the same array again in backward (the tensors must stay valid
 * until the tape is reset, as every tape tensor does). With gradients off, or inside another
 * checkpointed region (regions do not nest: the inner one is part of the outer), it just calls fn.
 * Errors (NULL, tape error): fn's errors; CM_ERR_INVALID_ARG (fn NULL, n_in < 0); CM_ERR_OOM; in
 * backward CM_ERR_STATE when the replay gives another shape or dtype than the forward did. */
typedef cm_tensor *(*cm_tape_region_fn)(cm_tape *tp, int n_in, cm_tensor *const *in, void *data);
cm_tensor *cm_tape_checkpoint(cm_tape *tp, cm_tape_region_fn fn, void *data, int n_in, cm_tensor *const *in);
/* Activation offload (Composer's activation_cpu_offload, PyTorch's save_on_cpu): returns
 * fn(tp, n_in, in, data), and on a tape whose device is a GPU (cm_tape_set_device) keeps what the
 * region saved for backward in host memory between its forward and its backward. The region's GPU
 * tensors come from an arena of its own over fixed-address device ranges; after fn, its result is
 * copied out (one node passes the gradient back), the region's bytes are downloaded to pinned host
 * memory and its device memory is unmapped; backward maps and uploads them again before the first
 * node that reads them (the region recorded before it is prefetched on a copy stream) and unmaps
 * the regions it has finished. Every pointer stays valid (the addresses do not change), so the
 * results are the same bits as without it. fn follows cm_tape_checkpoint's rules for what it may
 * read and return. With gradients off, on a CPU tape, inside another offloaded region or inside a
 * checkpointed region it just calls fn. Errors (NULL, tape error): fn's; CM_ERR_INVALID_ARG (fn
 * NULL, n_in < 0); CM_ERR_OOM (device or pinned memory); CM_ERR_UNSUPPORTED (a backend without
 * fixed-address ranges). */
cm_tensor *cm_tape_offload(cm_tape *tp, cm_tape_region_fn fn, void *data, int n_in, cm_tensor *const *in);
/* Offloaded regions recorded since the tape was made, and the most device bytes their regions
 * held at once (the arena chunks mapped behind them: about one region in forward, two in backward). */
int64_t cm_tape_n_offloaded(const cm_tape *tp);
size_t cm_tape_offload_peak_bytes(const cm_tape *tp);
/* True while backward replays a checkpointed region: state that a forward updates once (batch
 * norm's running statistics, a module's counters) must be left alone then. */
bool cm_tape_replaying(const cm_tape *tp);
/* Checkpointed regions recorded since the last reset. */
int64_t cm_tape_n_checkpoints(const cm_tape *tp);
/* The most host bytes the tape's arenas have held at once since it was made (or since
 * cm_tape_reset_peak): its arena's peak, or, where larger, what it held during a checkpoint's
 * replay plus the most its replay arena held then. */
size_t cm_tape_peak_bytes(const cm_tape *tp);
void cm_tape_reset_peak(cm_tape *tp);
/* As cm_tape_reset, and gives the memory of its arenas and of its gradient pool back: the next
 * steps lay out their memory as on a new tape (the trainer's memory plan trims after its dry runs,
 * so the run's arena is the one a run without them would have). */
void cm_tape_trim(cm_tape *tp);
/* The byte budget of the tape's arena on dev (arena_budget for the CPU, device_budget for a GPU;
 * 0 = unlimited), and setting it (for the arena already made and the one made later; not while
 * backward replays a checkpointed region). */
size_t cm_tape_budget(const cm_tape *tp, cm_device dev);
void cm_tape_set_budget(cm_tape *tp, cm_device dev, size_t bytes);

cm_status cm_tape_status(const cm_tape *tp); /* CM_OK or the first error */
const char *cm_tape_error(const cm_tape *tp); /* "" or the first error's message */
/* Records an error on the tape (first one wins) and returns it; for model code that detects
 * a problem between ops. */
cm_status cm_tape_fail(cm_tape *tp, cm_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
cm_arena *cm_tape_arena(cm_tape *tp);
int64_t cm_tape_n_nodes(const cm_tape *tp);

/* The device on which the tape's creation ops (cm_empty, cm_zeros, cm_full, cm_arange) put their
 * tensors (CM_DEVICE_CPU by default; every other op follows its inputs). Survives cm_tape_reset.
 * The tape's GPU memory comes from a second arena on the device, with its own budget: see
 * cm_tape_config.device_budget. Errors: cm_device_check's. */
cm_status cm_tape_set_device(cm_tape *tp, cm_device dev);
cm_device cm_tape_device(const cm_tape *tp);
/* The arena holding the tape's tensors on dev (NULL for a device it has not used yet). */
cm_arena *cm_tape_device_arena(cm_tape *tp, cm_device dev);

/* ---------------------------------------------------------------------------------------------
 * Tape tensors (no gradient; the tape owns them until reset)
 * ------------------------------------------------------------------------------------------- */

cm_tensor *cm_empty(cm_tape *tp, cm_dtype dt, int ndim, const int64_t *shape); /* uninitialised */
/* cm_empty on `dev` whatever the tape's creation device (cm_tape_set_device): for small tensors
 * that model code fills on the host (index lists, masks) before moving them with cm_to_device.
 * Errors: cm_device_check's for dev, recorded on the tape. */
cm_tensor *cm_empty_on(cm_tape *tp, cm_device dev, cm_dtype dt, int ndim, const int64_t *shape);
cm_tensor *cm_zeros(cm_tape *tp, cm_dtype dt, int ndim, const int64_t *shape);
cm_tensor *cm_full(cm_tape *tp, cm_dtype dt, int ndim, const int64_t *shape, double v);
cm_tensor *cm_arange(cm_tape *tp, cm_dtype dt, double start, double end, double step); /* 1-D */
/* A copy of t (any tensor) on the tape, contiguous, without gradient history. */
cm_tensor *cm_clone_detached(cm_tape *tp, const cm_tensor *t);

/* ---------------------------------------------------------------------------------------------
 * Views and layout (differentiable; axes may be negative)
 * ------------------------------------------------------------------------------------------- */

/* A view with a new shape when t's strides allow it, else a contiguous copy. One entry may be -1
 * (inferred). Errors: CM_ERR_SHAPE when the element counts differ. */
cm_tensor *cm_reshape(cm_tape *tp, cm_tensor *t, int ndim, const int64_t *shape);
cm_tensor *cm_permute(cm_tape *tp, cm_tensor *t, const int *perm); /* perm has ndim entries */
cm_tensor *cm_transpose(cm_tape *tp, cm_tensor *t, int a, int b);
/* Elements [start, start+length) along axis (a view). */
cm_tensor *cm_narrow(cm_tape *tp, cm_tensor *t, int axis, int64_t start, int64_t length);
/* Elements start, start + step, ... below stop along axis (a view, as torch's t[start:stop:step] on
 * that axis): (stop - start + step - 1) / step of them. 0 <= start <= stop <= the axis' size and
 * step >= 1, else CM_ERR_INVALID_ARG naming the range or the step. */
cm_tensor *cm_slice(cm_tape *tp, cm_tensor *t, int axis, int64_t start, int64_t stop, int64_t step);
/* Broadcast to `shape` (size-1 dims stretch with stride 0; new leading dims allowed). */
cm_tensor *cm_expand(cm_tape *tp, cm_tensor *t, int ndim, const int64_t *shape);
cm_tensor *cm_squeeze(cm_tape *tp, cm_tensor *t, int axis); /* axis must have size 1 */
cm_tensor *cm_unsqueeze(cm_tape *tp, cm_tensor *t, int axis);
cm_tensor *cm_contiguous(cm_tape *tp, cm_tensor *t); /* t itself when already contiguous */
/* Converts dtype; the gradient converts back to t's dtype. Returns t itself if dt matches. */
cm_tensor *cm_cast(cm_tape *tp, cm_tensor *t, cm_dtype dt);
/* A tensor sharing t's memory with no gradient history. */
cm_tensor *cm_detach(cm_tape *tp, cm_tensor *t);
/* A contiguous copy of t on `dev` (t itself when it is there already); differentiable: the gradient
 * is copied back to t's device. This is how batches and results cross between host and GPU. */
cm_tensor *cm_to_device(cm_tape *tp, cm_tensor *t, cm_device dev);

/* ---------------------------------------------------------------------------------------------
 * Elementwise (f32; binary ops broadcast like NumPy)
 * ------------------------------------------------------------------------------------------- */

cm_tensor *cm_add(cm_tape *tp, cm_tensor *a, cm_tensor *b);
cm_tensor *cm_sub(cm_tape *tp, cm_tensor *a, cm_tensor *b);
cm_tensor *cm_mul(cm_tape *tp, cm_tensor *a, cm_tensor *b);
cm_tensor *cm_div(cm_tape *tp, cm_tensor *a, cm_tensor *b);
cm_tensor *cm_add_scalar(cm_tape *tp, cm_tensor *a, float s);
cm_tensor *cm_mul_scalar(cm_tape *tp, cm_tensor *a, float s);
cm_tensor *cm_pow(cm_tape *tp, cm_tensor *a, float exponent);
cm_tensor *cm_clamp(cm_tape *tp, cm_tensor *a, float lo, float hi); /* use ±INFINITY for one side */
cm_tensor *cm_neg(cm_tape *tp, cm_tensor *a);
cm_tensor *cm_exp(cm_tape *tp, cm_tensor *a);
cm_tensor *cm_log(cm_tape *tp, cm_tensor *a);
cm_tensor *cm_sqrt(cm_tape *tp, cm_tensor *a);
cm_tensor *cm_abs(cm_tape *tp, cm_tensor *a);
cm_tensor *cm_relu(cm_tape *tp, cm_tensor *a);
/* approximate = true: the tanh form (GPT-2's "gelu_new"); false: the exact erf form. */
cm_tensor *cm_gelu(cm_tape *tp, cm_tensor *a, bool approximate);
cm_tensor *cm_silu(cm_tape *tp, cm_tensor *a);
cm_tensor *cm_tanh(cm_tape *tp, cm_tensor *a);
cm_tensor *cm_sigmoid(cm_tape *tp, cm_tensor *a);
/* Fused gelu(x + bias): x (..., C), bias (C). One pass forward, one pass backward. */
cm_tensor *cm_bias_gelu(cm_tape *tp, cm_tensor *x, cm_tensor *bias, bool approximate);

/* ---------------------------------------------------------------------------------------------
 * Reductions. `axes` lists n_axes axes (negative allowed, no repeats); n_axes = 0 reduces all.
 * The result drops the reduced dims, or keeps them with size 1 when keepdim. `a` may be any
 * strided view (f32); sums accumulate in double. Errors: CM_ERR_INVALID_ARG for an axis out of
 * range, a repeated axis or n_axes outside 0..ndim (naming the axis and the shape);
 * CM_ERR_DTYPE for a non-f32 input.
 * ------------------------------------------------------------------------------------------- */

cm_tensor *cm_sum(cm_tape *tp, cm_tensor *a, const int *axes, int n_axes, bool keepdim); /* empty: 0 */
cm_tensor *cm_mean(cm_tape *tp, cm_tensor *a, const int *axes, int n_axes, bool keepdim); /* empty: NaN */
/* Max/min: the gradient goes to the first extreme element of each reduced group (row-major order
 * within the group). NaN propagates: a group holding NaN gives NaN, and its first NaN gets the
 * gradient. Reducing over an empty axis is CM_ERR_SHAPE. */
cm_tensor *cm_max(cm_tape *tp, cm_tensor *a, const int *axes, int n_axes, bool keepdim);
cm_tensor *cm_min(cm_tape *tp, cm_tensor *a, const int *axes, int n_axes, bool keepdim);
/* Variance with Bessel-style `correction` ≥ 0 (0: population, 1: sample), as torch.var:
 * Σ(x - mean)² / max(0, n - correction), so n ≤ correction gives inf (or NaN for 0/0), as torch.
 * Two passes in double. */
cm_tensor *cm_var(cm_tape *tp, cm_tensor *a, const int *axes, int n_axes, int correction, bool keepdim);

/* ---------------------------------------------------------------------------------------------
 * Linear algebra
 * ------------------------------------------------------------------------------------------- */

/* a (..., M, K) · b (..., K, N) → (..., M, N). Batch dims broadcast; b may be 2-D (then, when a's
 * rows are evenly strided, it is one GEMM over all of them). f32 × f32 uses OpenBLAS; bf16 × bf16
 * uses oneDNN (f32 accumulation), and the result is f32 either way. Transposed views (last two
 * strides swapped) are passed to the GEMM without copying; other layouts are copied first.
 * Gradients are f32; for bf16 inputs the backward GEMMs run in bf16 too (the upstream gradient is
 * rounded to bf16, as under autocast) with f32 accumulation. Errors: CM_ERR_SHAPE naming both
 * shapes (fewer than 2 dims, inner dims differ, batch dims do not broadcast); CM_ERR_DTYPE for
 * mixed dtypes or a dtype other than f32/bf16. */
cm_tensor *cm_matmul(cm_tape *tp, cm_tensor *a, cm_tensor *b);
/* y = x·wᵀ + b: x (..., in), w (out, in), bias (out) or NULL → (..., out). One GEMM over all rows
 * of x, the bias added in the same pass. x and w both f32 or both bf16; the bias is f32. Gradients
 * as cm_matmul; the bias gradient is summed in f32. Errors: CM_ERR_SHAPE naming the shapes,
 * CM_ERR_DTYPE. */
cm_tensor *cm_linear(cm_tape *tp, cm_tensor *x, cm_tensor *w, cm_tensor *bias);

/* ---------------------------------------------------------------------------------------------
 * Softmax and losses
 * ------------------------------------------------------------------------------------------- */

/* Along one axis (negative allowed), max-subtracted so large logits stay finite; a row that is all
 * -inf gives NaN, as torch. Any axis and any strides (a strided input is copied contiguous first);
 * the last axis is the fast path. The backward uses the saved output. Errors: CM_ERR_INVALID_ARG
 * (axis), CM_ERR_SHAPE (0-d input), CM_ERR_DTYPE. */
cm_tensor *cm_softmax(cm_tape *tp, cm_tensor *a, int axis);
cm_tensor *cm_log_softmax(cm_tape *tp, cm_tensor *a, int axis);

typedef enum cm_reduction { CM_REDUCTION_MEAN = 0, CM_REDUCTION_SUM = 1, CM_REDUCTION_NONE = 2 } cm_reduction;

typedef struct cm_cross_entropy_opts {
    int64_t ignore_index;  /* targets equal to it contribute nothing (default -100) */
    float label_smoothing; /* 0..1 (default 0) */
    cm_reduction reduction; /* mean over non-ignored targets (default), sum, or none */
} cm_cross_entropy_opts;
cm_cross_entropy_opts cm_cross_entropy_opts_default(void);

/* Fused log-softmax + negative log-likelihood, as torch.nn.functional.cross_entropy.
 * logits (N, C) or (N, C, d1, ...). target: class indices (i32/i64, u8 also accepted) of shape (N)
 * or (N, d1, ...), or probabilities (f32, same shape as logits). opts NULL = defaults.
 * Result: a scalar, or the per-element losses (N, d1, ...) with CM_REDUCTION_NONE.
 * - Index targets: loss = (1-ls)·(lse - x_t) + ls·(lse - mean_c x_c) (ls = label_smoothing);
 *   positions whose target is ignore_index contribute 0 and get no gradient; MEAN divides by the
 *   number of non-ignored targets — if every target is ignored the mean is 0/0 = NaN (as torch)
 *   while the gradient is zero.
 * - Probability targets p: loss = Σ_c ((1-ls)·p_c + ls/C)·(lse - x_c); MEAN divides by N·d1·...;
 *   ignore_index does not apply. If p requires grad it gets (1-ls)·(lse - x) per unit upstream.
 * The backward is fused (softmax - smoothed target, scaled) from the saved log-sum-exp; no (N, C)
 * buffer is kept. Errors: CM_ERR_SHAPE naming the shapes; CM_ERR_DTYPE; CM_ERR_INVALID_ARG for a
 * class index outside [0, C) that is not ignore_index (naming the value and its position, e.g.
 * "target(1, 2) = 7"), label_smoothing outside [0, 1] or an unknown reduction. */
cm_tensor *cm_cross_entropy(cm_tape *tp, cm_tensor *logits, cm_tensor *target, const cm_cross_entropy_opts *opts);
/* Cross-entropy of the logits x·wᵀ — cm_cross_entropy(cm_linear(x, w, NULL), target) — without
 * ever holding the (rows, V) logits or their gradient (Liger's FusedLinearCrossEntropy): the
 * logits are made chunk_rows rows at a time (0 = automatic: about the size of x, at least 256
 * rows), their losses summed and, when x or w needs a gradient, the chunk's softmax gradient
 * turned into its share of dx (rows, C) and dw (V, C) at once; the backward scales those by the
 * upstream gradient. Memory: dx + dw + one chunk instead of 2 × rows × V floats (GPT-2 at 8 × 1024
 * tokens: 3.3 GB of logits and gradient become 0.2 GB). No extra FLOPs.
 * x (..., C) and w (V, C): both f32 or both bf16 (under autocast each f32 or bf16, multiplied in
 * bf16 with f32 accumulation, as cm_linear); target (...) class indices. opts as cm_cross_entropy's
 * with MEAN or SUM (NONE is CM_ERR_UNSUPPORTED), index targets only (probability targets
 * CM_ERR_UNSUPPORTED). Results equal the unfused ops up to summation order (the GEMMs are split by
 * rows). Errors as cm_cross_entropy's; CM_ERR_SHAPE naming x, w and target. */
cm_tensor *cm_linear_cross_entropy(cm_tape *tp, cm_tensor *x, cm_tensor *w, cm_tensor *target,
                                   const cm_cross_entropy_opts *opts, int64_t chunk_rows);
/* Mean squared error (pred and target the same shape, f32, any strides); both get gradients.
 * MEAN of an empty tensor is NaN, as torch. Errors: CM_ERR_SHAPE naming both shapes. */
cm_tensor *cm_mse_loss(cm_tape *tp, cm_tensor *pred, cm_tensor *target, cm_reduction reduction);

/* ---------------------------------------------------------------------------------------------
 * Indexing and joining
 * ------------------------------------------------------------------------------------------- */

/* The index ops copy elements of any dtype (the result has a's dtype); gradients flow to float
 * inputs. Index tensors are i32, i64 or u8 of any strides; an index outside its range (negative
 * ones included) is CM_ERR_INVALID_ARG naming the value and its position in idx. */

/* weight (V, D), idx (...) → (..., D). Backward scatter-adds into weight's gradient (repeated
 * indices accumulate). An index outside [0, V) is CM_ERR_INVALID_ARG naming it. */
cm_tensor *cm_embedding(cm_tape *tp, cm_tensor *weight, cm_tensor *idx);
/* Select entries idx (1-D) along axis, as torch.index_select: the result has a's shape with
 * idx's length at axis. */
cm_tensor *cm_index_select(cm_tape *tp, cm_tensor *a, int axis, cm_tensor *idx);
/* out[i][j][k] = a[i][idx[i][j][k]][k] for axis 1, as torch.gather: idx has a's ndim and is no
 * larger than a in every dim but axis; the result has idx's shape. */
cm_tensor *cm_gather(cm_tape *tp, cm_tensor *a, int axis, cm_tensor *idx);
/* n ≥ 1 inputs of one dtype. concat: shapes equal except along axis. stack: shapes equal; the
 * result has a new dim of size n at axis (-1 appends). Errors name the offending input and both
 * shapes (CM_ERR_SHAPE) or dtypes (CM_ERR_DTYPE). */
cm_tensor *cm_concat(cm_tape *tp, cm_tensor *const *ts, int n, int axis);
cm_tensor *cm_stack(cm_tape *tp, cm_tensor *const *ts, int n, int axis);
/* Splits along axis into n pieces of sizes[i] (each ≥ 0, summing to the dim); writes n views
 * (cm_narrow) into out, or n NULLs on failure. Returns CM_OK or the error (also recorded on the
 * tape). */
cm_status cm_split(cm_tape *tp, cm_tensor *a, int axis, const int64_t *sizes, int n, cm_tensor **out);

/* ---------------------------------------------------------------------------------------------
 * Normalisation and dropout
 * ------------------------------------------------------------------------------------------- */

/* Over the last dim: x (..., C), weight and bias (C) or NULL; eps ≥ 0. Fused forward and
 * backward: the node saves only the per-row mean and 1/std. */
cm_tensor *cm_layer_norm(cm_tape *tp, cm_tensor *x, cm_tensor *weight, cm_tensor *bias, float eps);

/* x (N, C, ...) — or (N, ..., C) when channels_last. In training, normalises with the batch
 * statistics (biased variance) and updates running_mean/var (if given; both or neither; f32 (C),
 * any stride) in place: r = (1-momentum)·r + momentum·stat, the variance unbiased, as PyTorch —
 * also when gradients are disabled. Training needs more than one value per channel
 * (CM_ERR_SHAPE). In eval, uses the running statistics (required: CM_ERR_INVALID_ARG without them)
 * and is differentiable in x, weight and bias. weight/bias (C) or NULL. opts NULL = defaults.
 * x is f32 or bf16 (any other dtype: CM_ERR_DTYPE) and the output has x's dtype, as under PyTorch's
 * autocast: bf16 x gives the f32 result rounded to nearest even, so bf16 activations between a
 * ResNet's convolutions stay bf16 and batch norm reads half the bytes. Weight, bias, the running
 * and batch statistics and the arithmetic are f32 either way, and the gradients are f32 (those of
 * a bf16 x included, except that of a bf16 convolution's output, which its backward reads in bf16
 * anyway: written in bf16, see cm_tensor_grad; and a bf16 output's gradient may come in bf16 from
 * a bf16 convolution consuming it). Before its output is rounded, bf16 x gives what f32 x holding
 * the same values gives, to f32 round-off (the sums may run in another order). */
typedef struct cm_batch_norm_opts {
    bool training;  /* default true */
    float momentum; /* default 0.1 */
    float eps;      /* default 1e-5 */
    bool channels_last;
} cm_batch_norm_opts;
cm_batch_norm_opts cm_batch_norm_opts_default(void);
cm_tensor *cm_batch_norm(cm_tape *tp, cm_tensor *x, cm_tensor *weight, cm_tensor *bias, cm_tensor *running_mean,
                         cm_tensor *running_var, const cm_batch_norm_opts *opts);
/* relu(cm_batch_norm(x, ...) + residual) as one op — residual NULL: relu(cm_batch_norm(x, ...)) —
 * with the same values, running-statistics updates and gradients as the three ops (ReLU's gradient
 * is 0 where the output is 0, as cm_relu). It keeps only x and its output for backward instead of
 * three tensors, and makes one pass over memory instead of three: a ResNet basic block holds two
 * activation tensors fewer. residual: x's shape, any strides, f32 or bf16 whatever x's dtype
 * (CM_ERR_SHAPE / CM_ERR_DTYPE); its gradient is f32. The output has x's dtype, and with bf16 x the
 * ReLU's mask is taken from the bf16 output (a positive f32 rounds to a positive bf16, short of
 * underflow). */
cm_tensor *cm_batch_norm_add_relu(cm_tape *tp, cm_tensor *x, cm_tensor *weight, cm_tensor *bias,
                                  cm_tensor *running_mean, cm_tensor *running_var, cm_tensor *residual,
                                  const cm_batch_norm_opts *opts);
/* x (N, C, ...), C divisible by groups (CM_ERR_INVALID_ARG otherwise); weight/bias (C) or NULL. */
cm_tensor *cm_group_norm(cm_tape *tp, cm_tensor *x, int64_t groups, cm_tensor *weight, cm_tensor *bias, float eps);

/* Zeroes each element with probability p and scales the rest by 1/(1-p). The mask is a pure
 * function of (rng state, element index): element i (row-major order of a) is kept when the
 * uniform at block rng->counter + i/4, word i%4 (cm_rng_bernoulli's draw) is ≥ p, so it is
 * reproducible; rng->counter advances by ceil(numel / 4). With the tape's row context
 * (cm_tape_set_rows) and a's dim 0 equal to its row count n, row i instead draws from blocks
 * rng->counter + (first + i)·ceil(row / 4) (row = numel / n elements), and the counter advances by
 * total·ceil(row / 4): a row's mask depends on its global row, not on the split of the batch.
 * Identity (a itself, no rng use) when !training or p == 0; p == 1 gives zeros, as torch. p
 * outside [0, 1] is CM_ERR_INVALID_ARG. */
cm_tensor *cm_dropout(cm_tape *tp, cm_tensor *a, float p, bool training, cm_rng *rng);

/* ---------------------------------------------------------------------------------------------
 * Convolution, pooling, resizing (NCHW unless channels_last)
 * ------------------------------------------------------------------------------------------- */

typedef struct cm_conv2d_opts {
    int stride[2];   /* (h, w), default 1 */
    int padding[2];  /* default 0 */
    int dilation[2]; /* default 1 */
    int groups;      /* default 1 */
    bool channels_last; /* x and result are (N, H, W, C) instead of (N, C, H, W) */
    bool out_bf16;      /* a bf16 convolution (autocast, or bf16 x and weight) writes a bf16 result */
} cm_conv2d_opts;
cm_conv2d_opts cm_conv2d_opts_default(void);

/* x (N, Cin, H, W), weight (Cout, Cin/groups, kh, kw) in both layouts, bias (Cout) or NULL; opts
 * NULL = defaults. Output (N, Cout, OH, OW), OH = floor((H + 2p - d(kh-1) - 1) / s) + 1: f32, or
 * bf16 for a bf16 convolution with opts->out_bf16 (for a consumer that reads bf16, such as batch
 * norm: PyTorch's autocast keeps a ResNet's activations in bf16 the same way).
 * Dtypes: x and weight both f32, or both bf16; bias f32. Under the tape's bf16 autocast the
 * convolution is bf16 and x and weight may each be f32 or bf16: an f32 one is rounded to bf16
 * inside it (no cast nodes, gradients f32 straight to it). bf16 convolutions multiply the bf16
 * values and accumulate in f32; their backward rounds the upstream gradient to bf16 (like
 * linear's) and gives f32 gradients (also to bf16 tensors: gradients are always f32, except that
 * of a bf16 batch norm output used by this convolution only, written in bf16 during backward:
 * see cm_tensor_grad).
 * Kernels (chosen at run time; results agree to f32 rounding): oneDNN's direct convolution
 * primitives by default, or im2col + OpenBLAS with the environment variable CM_CONV=im2col; a
 * problem oneDNN has no implementation for runs on im2col. bf16 runs oneDNN's bf16 primitives
 * where the CPU has bf16 instructions (AVX512-BF16, AMX) and elsewhere widens the bf16 values to
 * f32 for the f32 kernel; CM_CONV_BF16=onednn|widen overrides that. On the oneDNN path a 3x3,
 * stride-1, pad-1, channels-last convolution runs on the library's own AVX512-BF16 kernels
 * (faster than oneDNN's on those shapes): forward (bf16 x, no bias), backward-data, and
 * backward-weights (no bias); CM_CONV_BF16_OWN=none, or a comma list of fwd, data, weights,
 * chooses which passes do. The variables are read once, at the first convolution.
 * Errors: CM_ERR_SHAPE naming the shapes and parameters when the output would be empty, Cin or
 * Cout is not divisible by groups, or weight/bias do not match; CM_ERR_INVALID_ARG for
 * stride/dilation < 1, padding < 0, groups < 1; CM_ERR_DTYPE for other dtypes or (outside autocast)
 * x and weight of different dtypes; CM_ERR_INTERNAL if oneDNN fails (the message names its status). */
cm_tensor *cm_conv2d(cm_tape *tp, cm_tensor *x, cm_tensor *weight, cm_tensor *bias, const cm_conv2d_opts *opts);

typedef struct cm_pool2d_opts {
    int kernel[2];
    int stride[2];  /* 0 = kernel size */
    int padding[2];
    bool count_include_pad; /* avg pool only; default true, as PyTorch */
    bool ceil_mode;
    bool channels_last;
} cm_pool2d_opts;
cm_pool2d_opts cm_pool2d_opts_default(int kh, int kw);

/* As F.max_pool2d / F.avg_pool2d (opts required). Padding is at most half the kernel, as PyTorch;
 * max pooling pads with -inf and sends the gradient to the first maximum of each window. With
 * ceil_mode a last window that would start in the right padding is dropped, as PyTorch. */
cm_tensor *cm_max_pool2d(cm_tape *tp, cm_tensor *x, const cm_pool2d_opts *opts);
cm_tensor *cm_avg_pool2d(cm_tape *tp, cm_tensor *x, const cm_pool2d_opts *opts);
/* Output (N, C, out_h, out_w) with PyTorch's adaptive windows. */
cm_tensor *cm_adaptive_avg_pool2d(cm_tape *tp, cm_tensor *x, int64_t out_h, int64_t out_w, bool channels_last);
/* Bilinear resize to (out_h, out_w), as F.interpolate(mode="bilinear"). */
cm_tensor *cm_resize_bilinear(cm_tape *tp, cm_tensor *x, int64_t out_h, int64_t out_w, bool align_corners,
                              bool channels_last);

/* ---------------------------------------------------------------------------------------------
 * Attention
 * ------------------------------------------------------------------------------------------- */

typedef struct cm_attention_opts {
    bool causal;          /* query i attends keys j <= i only (top-left aligned, as PyTorch's is_causal) */
    float scale;          /* 0 = 1/sqrt(D) */
    cm_tensor *bias;      /* optional f32 additive bias broadcastable to (B, H, T, S), e.g. ALiBi as
                             (1, H, T, S) or (H, 1, S); gets a gradient (summed over its broadcast dims) */
    cm_tensor *key_padding_mask; /* optional (B, S) u8/i32/i64: nonzero = a real key, 0 = padding */
    /* Dropout on the probabilities, fused (0 = none): each probability is zeroed with probability
     * dropout_p and the rest scaled by 1/(1 - dropout_p), with the mask drawn from `rng` exactly as
     * cm_dropout(tp, softmax(...), dropout_p, true, rng) draws it for the contiguous (B, H, T, S)
     * probabilities, so the fused and explicit forms agree. rng is required when dropout_p > 0. */
    float dropout_p;
    cm_rng *rng;
    /* The output's layout. false: (B, H, T, D) contiguous. true: (B, T, H, D) contiguous, i.e. the
     * heads already merged, so cm_reshape to (B, T, H·D) is a free view (no permute + copy). The
     * gradient flowing back is read in the same layout. */
    bool out_bthd;
} cm_attention_opts;
/* No mask, no bias, scale 1/sqrt(D), no dropout, output (B, H, T, D). */
cm_attention_opts cm_attention_opts_default(void);

/* Scaled dot-product attention: q (B, H, T, D), k and v (B, H, S, D) → (B, H, T, D) contiguous, or
 * (B, T, H, D) contiguous with opts->out_bthd.
 * softmax(q·kᵀ·scale + bias + masks)·v, computed per (b, h) in parallel with sgemm; opts may be NULL
 * (the defaults). The causal mask is top-left aligned: with T != S, query i still sees keys 0..i
 * (queries i >= S − 1 see every key; for decoding with a KV cache, where the T
 * queries are the last T of S positions, pass an explicit bias instead). A query row whose keys are
 * all masked outputs zeros and passes zero gradient (no NaN).
 * Memory: the attention probabilities P (B, H, T, S) are never kept. The backward recomputes them
 * block by block (one more q·kᵀ product and exp per score than the forward); what stays in the
 * tape's arena for it is the output, the padding mask as one float per (b, s), and with
 * dropout_p > 0 the dropout mask as one bit per probability (B·H·T·S / 8 bytes). q, k, v and bias
 * are read again in backward, so they must not change between the two.
 * q, k and v may be strided views; the usual cm_permute of a (B, T, H, D) tensor is read in place
 * (no copy); other layouts are made contiguous first.
 * Precision: the CPU computes in f32 whatever the tape's autocast. On a GPU (compute capability 8.0
 * or later, D <= 128) under bf16 autocast the products run on the tensor cores as PyTorch's autocast
 * attention does: q, k, v, the probabilities, the output's gradient and the score gradients are
 * rounded to bf16, the scores, softmax and every sum stay f32 (results agree with the CPU to bf16
 * precision); without autocast, or on an older GPU, the GPU computes in f32 as the CPU does.
 * CM_CUDA_ATTENTION=f32 keeps the f32 kernels under autocast.
 * Errors (NULL, tape error naming the shapes): CM_ERR_DTYPE if q, k, v or bias is not f32 or the
 * mask is not u8/i32/i64; CM_ERR_SHAPE if q, k, v are not 4-d, disagree in B, H or D, k and v differ
 * in S, bias does not broadcast to (B, H, T, S), the mask is not (B, S), or H·D >= 2^31 with
 * out_bthd; CM_ERR_INVALID_ARG if dropout_p is outside [0, 1] or rng is NULL with dropout_p > 0. */
cm_tensor *cm_attention(cm_tape *tp, cm_tensor *q, cm_tensor *k, cm_tensor *v, const cm_attention_opts *opts);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_TENSOR_H */
