/* Devices: the public cm_device_* calls, device tensors, copies between devices, the tape's device
 * arena, and the list of ops the GPU path implements (an op outside it fails cleanly instead of
 * running its CPU loops over device memory). */
#include "tensor/backend.h"
#include "tensor/tensor_impl.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

cm_status cm_device_check(cm_device d) {
    if (d == CM_DEVICE_CPU) return CM_OK;
    if (d != CM_DEVICE_CUDA) return cm_set_error(CM_ERR_INVALID_ARG, "device %d is not valid", (int)d);
    const char *why = NULL;
    const cmi_backend *be = cmi_cuda_backend(&why);
    if (!be) return cm_set_error(CM_ERR_UNSUPPORTED, "device cuda is not available: %s", why);
    return be->init();
}

const char *cm_device_describe(cm_device d) {
    if (d == CM_DEVICE_CPU) return "cpu";
    const cmi_backend *be = cmi_backend_get(d);
    return be && be->init() == CM_OK ? be->describe() : "";
}

cm_status cm_device_synchronize(cm_device d) {
    if (d == CM_DEVICE_CPU) return CM_OK;
    cm_status s = cm_device_check(d);
    return s ? s : cmi_backend_get(d)->sync();
}

cm_status cm_device_memory_stats(cm_device d, cm_device_memory *out) {
    memset(out, 0, sizeof *out);
    if (d == CM_DEVICE_CPU) return CM_OK;
    cm_status s = cm_device_check(d);
    if (s) return s;
    cmi_backend_get(d)->mem_stats(out);
    return CM_OK;
}

void cm_device_reset_peak(cm_device d) {
    const cmi_backend *be = cmi_backend_get(d);
    if (be && be->init() == CM_OK) be->reset_peak();
}

void cm_device_set_memory_budget(cm_device d, size_t bytes) {
    const cmi_backend *be = cmi_backend_get(d);
    if (be && be->init() == CM_OK) be->set_budget(bytes);
}

/* ---- peak rates (data sheets, dense) ---- */

typedef struct {
    const char *match; /* substring of the device name */
    double bf16, tf32, f32;
} peak_row;

/* NVIDIA data sheets, dense (no 2:4 sparsity): the MFU denominators llm.c and PyTorch users use.
 * Order matters: the first row whose substring occurs in the name wins. */
static const peak_row k_peaks[] = {
    {"H200", 989.4e12, 494.7e12, 66.9e12},
    {"H100 PCIe", 756.0e12, 378.0e12, 51.2e12},
    {"H100 NVL", 835.0e12, 417.5e12, 60.0e12},
    {"H100", 989.4e12, 494.7e12, 66.9e12}, /* SXM ("NVIDIA H100 80GB HBM3") */
    {"A100", 312.0e12, 156.0e12, 19.5e12},
    {"L40S", 362.1e12, 183.0e12, 91.6e12},
    {"L4", 121.0e12, 60.0e12, 30.3e12},
    {"RTX 4090", 165.2e12, 82.6e12, 82.6e12},
};

cm_status cm_device_peak_flops(cm_device d, cm_dtype dt, double *out) {
    *out = 0;
    if (d == CM_DEVICE_CPU)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_device_peak_flops: the CPU's peak is measured (cm_peak_flops)");
    cm_status s = cm_device_check(d);
    if (s) return s;
    const char *name = cm_device_describe(d);
    for (size_t i = 0; i < sizeof k_peaks / sizeof k_peaks[0]; i++) {
        if (!strstr(name, k_peaks[i].match)) continue;
        *out = dt == CM_DTYPE_BF16 ? k_peaks[i].bf16 : dt == CM_DTYPE_F16 ? k_peaks[i].tf32 : k_peaks[i].f32;
        return CM_OK;
    }
    return cm_set_error(CM_ERR_NOT_FOUND, "no peak FLOP/s is known for '%s' (give SpeedMonitor's peak_flops, or "
                                          "CM_PEAK_FLOPS)", name);
}

/* ---- ops implemented on the GPU ---- */

static const char *const k_gpu_ops[] = {
    /* creation, views, copies (views.c, device.c) */
    "empty", "zeros", "arange", "clone", "contiguous", "reshape", "permute", "transpose", "narrow", "slice",
    "expand", "squeeze", "unsqueeze", "detach", "cast", "to_device",
    /* elementwise (elementwise.c) */
    "add", "sub", "mul", "div", "neg", "exp", "log", "sqrt", "abs", "relu", "gelu", "silu", "tanh", "sigmoid",
    "add_scalar", "mul_scalar", "pow", "clamp",
    /* reductions (reduce.c) */
    "sum", "mean", "max", "min", "var", "softmax", "log_softmax",
    /* GEMMs (matmul.c) */
    "matmul", "linear",
    /* losses, norms, dropout, fused activations, indexing */
    "cross_entropy", "linear_cross_entropy", "layer_norm", "dropout", "bias_gelu", "embedding", "index_select",
    "gather", "mse_loss", "group_norm",
    /* attention (attention.c) */
    "attention",
    /* vision: convolution, batch norm, pooling, concat (conv.c, norm.c, pool.c, index.c) */
    "conv2d", "batch_norm", "batch_norm_add_relu", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "concat", "stack",
    "resize_bilinear", "split",
};

bool cmi_op_on_device(const char *op, cm_device dev) {
    if (dev == CM_DEVICE_CPU) return true;
    for (size_t i = 0; i < sizeof k_gpu_ops / sizeof k_gpu_ops[0]; i++)
        if (strcmp(op, k_gpu_ops[i]) == 0) return true;
    return false;
}

/* ---- device memory for tensors ---- */

bool cmi_dev_fail(cm_tape *tp, cm_status s, const char *op) {
    if (s == CM_OK) return false;
    char msg[900];
    snprintf(msg, sizeof msg, "%s", cm_last_error());
    cmi_fail(tp, s, "%s: %s", op, msg);
    return true;
}

static void *arena_dev_alloc(void *ctx, size_t bytes) { return ((const cmi_backend *)ctx)->alloc(bytes); }
static void arena_dev_free(void *ctx, void *p) { ((const cmi_backend *)ctx)->free(p); }
static cm_status arena_dev_fill(void *ctx, void *p, int byte, size_t bytes) {
    return ((const cmi_backend *)ctx)->memset(p, byte, bytes);
}

/* The tape's device arena grows in place in one reserved range (the backend's virtual memory), so
 * the device memory behind it is its high-water mark; where the driver cannot reserve, it grows in
 * chunks from the caching allocator, said once. */
static void *arena_dev_reserve(void *ctx, size_t max_bytes, size_t *cap) {
    const cmi_backend *be = ctx;
    void *p = be->vm_reserve_growable(max_bytes, cap);
    static bool said;
    if (!p && !said) {
        said = true;
        cm_log_msg(CM_LOG_INFO, "%s: the tape's device memory grows in chunks of the caching allocator (%s)", be->name,
                   cm_last_error());
    }
    return p;
}
static cm_status arena_dev_commit(void *ctx, void *base, size_t bytes) {
    return ((const cmi_backend *)ctx)->vm_extend(base, bytes);
}
static void arena_dev_release(void *ctx, void *base) { ((const cmi_backend *)ctx)->vm_release(base); }

cm_arena *cmi_dev_arena(cm_tape *tp, cm_device dev) {
    if (dev == CM_DEVICE_CPU) return tp->arena;
    if (tp->dev_arena) return tp->dev_arena;
    const cmi_backend *be = cmi_backend_get(dev);
    if (!be || be->init() != CM_OK) return NULL;
    cm_arena_allocator al = {arena_dev_alloc, arena_dev_free, arena_dev_fill, (void *)be, 0, NULL, NULL, NULL};
    if (be->vm_reserve_growable && be->vm_extend && be->vm_release) {
        al.granule = be->vm_granularity();
        al.reserve = arena_dev_reserve, al.commit = arena_dev_commit, al.release = arena_dev_release;
    }
    if (cm_arena_new_with(tp->dev_budget, &al, &tp->dev_arena) != CM_OK) return NULL;
    cm_arena_set_poison(tp->dev_arena, tp->poison);
    return tp->dev_arena;
}

cm_status cm_tape_set_device(cm_tape *tp, cm_device dev) {
    cm_status s = cm_device_check(dev);
    if (s) return s;
    tp->default_dev = dev;
    return CM_OK;
}

cm_device cm_tape_device(const cm_tape *tp) { return tp->default_dev; }

cm_arena *cm_tape_device_arena(cm_tape *tp, cm_device dev) {
    return dev == CM_DEVICE_CPU ? tp->arena : tp->dev_arena;
}

void *cmi_dev_scratch(cm_tape *tp, size_t bytes) {
    if (tp->dev == CM_DEVICE_CPU) return cmi_scratch(tp, bytes);
    cm_arena *a = cmi_dev_arena(tp, tp->dev);
    void *p = a ? cm_arena_alloc(a, bytes ? bytes : 1) : NULL;
    if (!p) cmi_fail(tp, CM_ERR_OOM, "device scratch: %s", cm_last_error());
    return p;
}

cm_status cm_tensor_new_on(cm_device dev, cm_dtype dt, int ndim, const int64_t *shape, cm_tensor **out) {
    if (dev == CM_DEVICE_CPU) return cm_tensor_new(dt, ndim, shape, out);
    *out = NULL;
    cm_status s = cm_device_check(dev);
    if (s) return s;
    const cmi_backend *be = cmi_backend_get(dev);
    cm_tensor *t;
    if ((s = cm_tensor_from_data(dt, ndim, shape, (void *)1, &t))) return s; /* struct only */
    const size_t bytes = (size_t)cm_tensor_numel(t) * cm_dtype_size(dt);
    t->data = be->alloc(bytes ? bytes : 1);
    if (!t->data) {
        s = cm_last_status();
        cm_free(t);
        return s ? s : CM_ERR_OOM;
    }
    t->device = dev;
    t->flags |= CM_TF_OWNS_DATA;
    if ((s = be->memset(t->data, 0, bytes))) {
        cm_tensor_free(t);
        return s;
    }
    *out = t;
    return CM_OK;
}


cm_status cm_tensor_to_device(const cm_tensor *t, cm_device dev, cm_tensor **out) {
    cm_status s = cm_tensor_new_on(dev, t->dtype, t->ndim, t->shape, out);
    if (s) return s;
    if ((s = cm_tensor_copy(*out, t))) {
        cm_tensor_free(*out);
        *out = NULL;
    }
    return s;
}

/* ---- copies ---- */

/* dst and src on one device (the GPU): the backend's strided copy; src broadcast to dst's shape. */
static cm_status copy_same_device(cm_tensor *dst, const cm_tensor *src, const int64_t *sstride) {
    return cmi_backend_get(dst->device)->copy(dst->data, dst->dtype, dst->stride, src->data, src->dtype, sstride,
                                              dst->ndim, dst->shape);
}

/* A contiguous scratch tensor struct (not a tape tensor) with data on `dev`; freed by the caller
 * with free_tmp. */
static cm_status tmp_like(cm_device dev, cm_dtype dt, int ndim, const int64_t *shape, cm_tensor **out) {
    return dev == CM_DEVICE_CPU ? cm_tensor_new(dt, ndim, shape, out) : cm_tensor_new_on(dev, dt, ndim, shape, out);
}

cm_status cmi_copy_any(cm_tensor *dst, const cm_tensor *src, const int64_t *sstride) {
    if (dst->device == src->device) return copy_same_device(dst, src, sstride);
    /* Between devices: a contiguous buffer in dst's dtype and shape on src's side (the conversion
     * and broadcast happen there), one transfer, then a strided copy on dst's side if dst is not
     * contiguous. */
    const cm_device gpu = dst->device != CM_DEVICE_CPU ? dst->device : src->device;
    const cmi_backend *be = cmi_backend_get(gpu);
    const size_t bytes = (size_t)cm_tensor_numel(dst) * cm_dtype_size(dst->dtype);
    cm_status s = CM_OK;
    cm_tensor *stage = NULL, *land = NULL;
    const bool src_plain = src->dtype == dst->dtype && cmi_is_contig(src) &&
                           cm_tensor_numel(src) == cm_tensor_numel(dst);
    if (!src_plain) {
        if ((s = tmp_like(src->device, dst->dtype, dst->ndim, dst->shape, &stage))) return s;
        cm_tensor view = *src;
        memcpy(view.stride, sstride, sizeof(int64_t) * (size_t)dst->ndim);
        view.ndim = dst->ndim;
        memcpy(view.shape, dst->shape, sizeof(int64_t) * (size_t)dst->ndim);
        if (src->device == CM_DEVICE_CPU) s = cm_tensor_copy(stage, &view);
        else s = copy_same_device(stage, &view, sstride);
        if (s) goto done;
    }
    const void *from = stage ? stage->data : src->data;
    if (cmi_is_contig(dst)) {
        s = be->memcpy(dst->data, from, bytes, dst->device == CM_DEVICE_CPU ? CMI_D2H : CMI_H2D);
    } else {
        if ((s = tmp_like(dst->device, dst->dtype, dst->ndim, dst->shape, &land))) goto done;
        if ((s = be->memcpy(land->data, from, bytes, dst->device == CM_DEVICE_CPU ? CMI_D2H : CMI_H2D))) goto done;
        if (dst->device == CM_DEVICE_CPU) s = cm_tensor_copy(dst, land);
        else s = copy_same_device(dst, land, land->stride);
    }
done:
    cm_tensor_free(stage);
    cm_tensor_free(land);
    return s;
}

/* ---- cm_to_device ---- */

static cm_status to_device_backward(cm_tape *tp, cm_node *n, const cm_tensor *gout) {
    cm_tensor *t = n->in[0];
    /* the gradient comes back on t's device: a copy there, accumulated */
    const cm_device prev = tp->dev;
    tp->dev = t->device;
    cm_tensor *g = cmi_new(tp, CM_DTYPE_F32, gout->ndim, gout->shape);
    tp->dev = prev;
    if (!g) return cmi_status(tp);
    cm_status s = cmi_copy_any(g, gout, gout->stride);
    if (cmi_dev_fail(tp, s, "to_device backward")) return cmi_status(tp);
    tp->dev = t->device;
    s = cmi_accum(tp, t, g);
    tp->dev = prev;
    return s;
}

cm_tensor *cm_to_device(cm_tape *tp, cm_tensor *t, cm_device dev) {
    if (!tp) {
        cm_set_error(CM_ERR_INVALID_ARG, "to_device: tape is NULL");
        return NULL;
    }
    if (tp->status) return NULL;
    if (!t) {
        cmi_fail(tp, CM_ERR_INVALID_ARG, "to_device: input 0 is NULL");
        return NULL;
    }
    if (t->device == dev) return t;
    cm_status s = cm_device_check(dev);
    if (s) {
        cmi_dev_fail(tp, s, "to_device");
        return NULL;
    }
    tp->dev = t->device; /* the input is read where it is */
    if (!cmi_fetch(tp, 1, &t)) return NULL;
    tp->dev = dev;
    cm_tensor *out = cmi_new(tp, t->dtype, t->ndim, t->shape);
    if (!out) return NULL;
    s = cmi_copy_any(out, t, t->stride);
    if (cmi_dev_fail(tp, s, "to_device")) return NULL;
    if (cmi_needs_grad(tp, 1, &t) &&
        (t->dtype == CM_DTYPE_F32 || t->dtype == CM_DTYPE_BF16 || t->dtype == CM_DTYPE_F16)) {
        if (!cmi_record(tp, "to_device", out, 1, &t, to_device_backward, 0)) return NULL;
    }
    return out;
}
