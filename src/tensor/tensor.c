/* The tensor object: creation, inspection, element access, names, gradients of leaves. */
#include "tensor/backend.h"
#include "tensor/tensor_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

/* ---- dtypes ---- */

static const char *const k_dtype_names[] = {
#define CM_X_(name, up, size) #name,
    CM_DTYPE_LIST(CM_X_)
#undef CM_X_
};
static const size_t k_dtype_sizes[] = {
#define CM_X_(name, up, size) size,
    CM_DTYPE_LIST(CM_X_)
#undef CM_X_
};
_Static_assert(sizeof(k_dtype_names) / sizeof(k_dtype_names[0]) == CM_DTYPE_COUNT, "dtype table out of sync");

const char *cm_dtype_name(cm_dtype dt) { return (unsigned)dt < CM_DTYPE_COUNT ? k_dtype_names[dt] : "?"; }
size_t cm_dtype_size(cm_dtype dt) { return (unsigned)dt < CM_DTYPE_COUNT ? k_dtype_sizes[dt] : 0; }

cm_status cm_dtype_parse(const char *s, cm_dtype *out) {
    static const struct { const char *a, *b; cm_dtype dt; } k[] = {
        {"f32", "float32", CM_DTYPE_F32}, {"bf16", "bfloat16", CM_DTYPE_BF16}, {"f16", "float16", CM_DTYPE_F16},
        {"i32", "int32", CM_DTYPE_I32},   {"i64", "int64", CM_DTYPE_I64},      {"u8", "uint8", CM_DTYPE_U8},
    };
    for (size_t i = 0; s && i < sizeof k / sizeof k[0]; i++) {
        if (strcasecmp(s, k[i].a) == 0 || strcasecmp(s, k[i].b) == 0) {
            *out = k[i].dt;
            return CM_OK;
        }
    }
    return cm_set_error(CM_ERR_INVALID_ARG, "dtype '%s' is not known (use f32, bf16, f16, i32, i64 or u8)",
                        s ? s : "(null)");
}

uint16_t cm_f32_to_bf16(float x) { return cmi_f32_to_bf16(x); }

float cm_bf16_to_f32(uint16_t x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* IEEE half conversions in software (round to nearest even; no F16C requirement). */
uint16_t cm_f32_to_f16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);          /* NaN */
    if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);         /* overflow -> inf */
    if (absu < 0x38800000u) {                                           /* subnormal or zero */
        if (absu < 0x33000000u) return (uint16_t)sign;                  /* < half of min subnormal */
        uint32_t e = absu >> 23, m = (absu & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* value = m·2^(e-150); half's subnormal unit is 2^-24 */
        uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
        uint32_t r = m >> shift;
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((absu - 0x38000000u) >> 13);
    uint32_t rem = absu & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}

float cm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0) {
        if (m == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            e = 113;
            while (!(m & 0x400u)) {
                m <<= 1;
                e--;
            }
            u = sign | (e << 23) | ((m & 0x3ffu) << 13);
        }
    } else if (e == 31) {
        u = sign | 0x7f800000u | (m << 13);
    } else {
        u = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

double cmi_load(cm_dtype dt, const void *p) {
    switch (dt) {
    case CM_DTYPE_F32: return *(const float *)p;
    case CM_DTYPE_BF16: return cm_bf16_to_f32(*(const uint16_t *)p);
    case CM_DTYPE_F16: return cm_f16_to_f32(*(const uint16_t *)p);
    case CM_DTYPE_I32: return *(const int32_t *)p;
    case CM_DTYPE_I64: return (double)*(const int64_t *)p;
    case CM_DTYPE_U8: return *(const uint8_t *)p;
    default: return NAN;
    }
}

void cmi_store(cm_dtype dt, void *p, double v) {
    switch (dt) {
    case CM_DTYPE_F32: *(float *)p = (float)v; break;
    case CM_DTYPE_BF16: *(uint16_t *)p = cm_f32_to_bf16((float)v); break;
    case CM_DTYPE_F16: *(uint16_t *)p = cm_f32_to_f16((float)v); break;
    case CM_DTYPE_I32: *(int32_t *)p = (int32_t)(int64_t)v; break; /* wraps, as on the GPU (cuda/common.cuh) */
    case CM_DTYPE_I64: *(int64_t *)p = (int64_t)v; break;
    case CM_DTYPE_U8: *(uint8_t *)p = (uint8_t)(int64_t)v; break; /* -1.5 -> 255, as PyTorch on the CPU */
    default: break;
    }
}

/* ---- shapes ---- */

int64_t cmi_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

void cmi_contig_strides(int ndim, const int64_t *shape, int64_t *stride) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        stride[i] = s;
        s *= shape[i] > 0 ? shape[i] : 1;
    }
}

bool cmi_is_contig(const cm_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) return false;
        s *= t->shape[i];
    }
    return true;
}

const char *cmi_shape_of(int ndim, const int64_t *shape) {
    static _Thread_local char ring[8][160];
    static _Thread_local int k;
    char *buf = ring[k++ & 7];
    size_t off = 0;
    off += (size_t)snprintf(buf + off, 160 - off, "(");
    for (int i = 0; i < ndim && off < 150; i++)
        off += (size_t)snprintf(buf + off, 160 - off, i ? ", %lld" : "%lld", (long long)shape[i]);
    snprintf(buf + off, 160 - off, "%s", ndim == 1 ? ",)" : ")");
    return buf;
}

const char *cmi_shape(const cm_tensor *t) { return t ? cmi_shape_of(t->ndim, t->shape) : "(null)"; }

char *cm_tensor_shape_str(const cm_tensor *t, char *buf, size_t cap) {
    if (cap == 0) return buf;
    snprintf(buf, cap, "%s", cmi_shape(t));
    return buf;
}

/* ---- long-lived tensors ---- */

static cm_status check_shape(int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > CM_MAX_DIMS)
        return cm_set_error(CM_ERR_INVALID_ARG, "tensor: ndim %d is out of range (0..%d)", ndim, CM_MAX_DIMS);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return cm_set_error(CM_ERR_INVALID_ARG, "tensor: dim %d of shape %s is negative", i,
                                cmi_shape_of(ndim, shape));
    return CM_OK;
}

static cm_status tensor_struct(cm_dtype dt, int ndim, const int64_t *shape, cm_tensor **out) {
    *out = NULL;
    if ((unsigned)dt >= CM_DTYPE_COUNT) return cm_set_error(CM_ERR_DTYPE, "tensor: dtype %d is not valid", (int)dt);
    cm_status st = check_shape(ndim, shape);
    if (st) return st;
    cm_tensor *t = cm_alloc_zeroed(sizeof *t, 16);
    if (!t) return CM_ERR_OOM;
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    cmi_contig_strides(ndim, shape, t->stride);
    *out = t;
    return CM_OK;
}

cm_status cm_tensor_new(cm_dtype dt, int ndim, const int64_t *shape, cm_tensor **out) {
    cm_tensor *t;
    cm_status st = tensor_struct(dt, ndim, shape, &t);
    if (st) return st;
    size_t bytes = (size_t)cmi_numel(ndim, shape) * cm_dtype_size(dt);
    t->data = cm_alloc_zeroed(bytes ? bytes : 1, 64);
    if (!t->data) {
        cm_free(t);
        return CM_ERR_OOM;
    }
    t->flags |= CM_TF_OWNS_DATA;
    *out = t;
    return CM_OK;
}

cm_status cm_tensor_from_data(cm_dtype dt, int ndim, const int64_t *shape, void *data, cm_tensor **out) {
    if (!data && cmi_numel(ndim, shape) > 0) {
        *out = NULL;
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_tensor_from_data: data is NULL");
    }
    cm_status st = tensor_struct(dt, ndim, shape, out);
    if (st) return st;
    (*out)->data = data;
    return CM_OK;
}

void cm_tensor_clear_grad(cm_tensor *t) {
    if (!t || !t->grad) return;
    if (t->flags & CM_TF_OWNS_GRAD) cm_tensor_free(t->grad);
    t->grad = NULL;
    t->flags &= ~(uint32_t)CM_TF_OWNS_GRAD;
}

void cm_tensor_free(cm_tensor *t) {
    if (!t) return;
    if (t->flags & CM_TF_TAPE) {
        cm_log_msg(CM_LOG_ERROR, "cm_tensor_free: tensor %s belongs to a tape (ignored; cm_tape_reset frees it)",
               cmi_shape(t));
        return;
    }
    cm_tensor_clear_grad(t);
    if (t->flags & CM_TF_OWNS_DATA) {
        if (t->device == CM_DEVICE_CPU) cm_free(t->data);
        else cmi_dev_free_data(t);
    }
    cm_free(t->name);
    cm_free(t);
}

/* ---- inspection ---- */

cm_dtype cm_tensor_dtype(const cm_tensor *t) { return t->dtype; }
cm_device cm_tensor_device(const cm_tensor *t) { return t->device; }
int cm_tensor_ndim(const cm_tensor *t) { return t->ndim; }
const int64_t *cm_tensor_shape(const cm_tensor *t) { return t->shape; }
const int64_t *cm_tensor_strides(const cm_tensor *t) { return t->stride; }
int64_t cm_tensor_dim(const cm_tensor *t, int axis) {
    if (axis < 0) axis += t->ndim;
    return (axis >= 0 && axis < t->ndim) ? t->shape[axis] : -1;
}
int64_t cm_tensor_numel(const cm_tensor *t) { return cmi_numel(t->ndim, t->shape); }
size_t cm_tensor_nbytes(const cm_tensor *t) { return (size_t)cm_tensor_numel(t) * cm_dtype_size(t->dtype); }
bool cm_tensor_is_contiguous(const cm_tensor *t) { return cmi_is_contig(t); }
void *cm_tensor_data(const cm_tensor *t) { return t ? t->data : NULL; }

static void *elem_ptr(const cm_tensor *t, const int64_t *index) {
    int64_t off = 0;
    for (int i = 0; i < t->ndim; i++) off += index[i] * t->stride[i];
    return (char *)t->data + off * (int64_t)cm_dtype_size(t->dtype);
}

double cm_tensor_get(const cm_tensor *t, const int64_t *index) {
    if (t->device == CM_DEVICE_CPU) return cmi_load(t->dtype, elem_ptr(t, index));
    uint64_t buf = 0; /* one element copied back */
    if (cmi_backend_get(t->device)->memcpy(&buf, elem_ptr(t, index), cm_dtype_size(t->dtype), CMI_D2H)) return NAN;
    return cmi_load(t->dtype, &buf);
}

void cm_tensor_set(cm_tensor *t, const int64_t *index, double v) {
    if (t->device == CM_DEVICE_CPU) {
        cmi_store(t->dtype, elem_ptr(t, index), v);
        return;
    }
    uint64_t buf = 0;
    cmi_store(t->dtype, &buf, v);
    cmi_backend_get(t->device)->memcpy(elem_ptr(t, index), &buf, cm_dtype_size(t->dtype), CMI_H2D);
}

double cm_tensor_get_flat(const cm_tensor *t, int64_t i) {
    int64_t idx[CM_MAX_DIMS];
    for (int d = t->ndim - 1; d >= 0; d--) {
        idx[d] = t->shape[d] ? i % t->shape[d] : 0;
        i = t->shape[d] ? i / t->shape[d] : 0;
    }
    return cm_tensor_get(t, idx);
}

cm_status cm_tensor_set_name(cm_tensor *t, const char *name) {
    if (t->flags & CM_TF_TAPE) return cm_set_error(CM_ERR_STATE, "cm_tensor_set_name: tape tensors have no names");
    size_t n = strlen(name);
    char *c = cm_alloc(n + 1, 8);
    if (!c) return CM_ERR_OOM;
    memcpy(c, name, n + 1);
    cm_free(t->name);
    t->name = c;
    return CM_OK;
}

const char *cm_tensor_name(const cm_tensor *t) { return t->name ? t->name : ""; }

/* ---- gradients of leaves ---- */

cm_status cm_tensor_set_requires_grad(cm_tensor *t, bool on) {
    if (on && t->dtype != CM_DTYPE_F32 && t->dtype != CM_DTYPE_BF16 && t->dtype != CM_DTYPE_F16)
        return cm_set_error(CM_ERR_DTYPE, "requires_grad: tensor %s has dtype %s; only floating tensors have gradients",
                            cmi_shape(t), cm_dtype_name(t->dtype));
    if (on) t->flags |= CM_TF_REQUIRES_GRAD;
    else t->flags &= ~(uint32_t)CM_TF_REQUIRES_GRAD;
    return CM_OK;
}

bool cm_tensor_requires_grad(const cm_tensor *t) { return t && (t->flags & CM_TF_REQUIRES_GRAD); }
cm_tensor *cm_tensor_grad(const cm_tensor *t) { return t ? t->grad : NULL; }

void cm_tensor_zero_grad(cm_tensor *t) {
    if (!t || !t->grad) return;
    if (t->grad->device == CM_DEVICE_CPU) memset(t->grad->data, 0, cm_tensor_nbytes(t->grad));
    else cmi_backend_get(t->grad->device)->memset(t->grad->data, 0, cm_tensor_nbytes(t->grad));
}

cm_status cm_tensor_set_grad(cm_tensor *t, cm_tensor *grad) {
    if (grad && grad->device != t->device)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_tensor_set_grad: gradient is on %s but the tensor %s is on %s",
                            cm_device_name(grad->device), cmi_shape(t), cm_device_name(t->device));
    if (grad) {
        if (grad->dtype != CM_DTYPE_F32 || !cmi_is_contig(grad) || grad->ndim != t->ndim ||
            memcmp(grad->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim) != 0)
            return cm_set_error(CM_ERR_SHAPE,
                                "cm_tensor_set_grad: gradient %s %s must be f32, contiguous and of shape %s",
                                cmi_shape(grad), cm_dtype_name(grad->dtype), cmi_shape(t));
    }
    cm_tensor_clear_grad(t);
    t->grad = grad;
    return CM_OK;
}
