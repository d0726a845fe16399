/* Tape tensor creation, copies, dtype casts and the differentiable view ops. */
#include "tensor/backend.h"
#include "tensor/tensor_impl.h"

#include <math.h>

/* ---- creation ---- */

cm_tensor *cm_empty(cm_tape *tp, cm_dtype dt, int ndim, const int64_t *shape) {
    if (!cmi_begin(tp, "empty", 0, NULL)) return NULL;
    return cmi_new(tp, dt, ndim, shape);
}

cm_tensor *cm_empty_on(cm_tape *tp, cm_device dev, cm_dtype dt, int ndim, const int64_t *shape) {
    if (!tp || tp->status != CM_OK) return cm_empty(tp, dt, ndim, shape); /* its error */
    const cm_device dd = tp->default_dev;
    if (dev != dd && cm_tape_set_device(tp, dev) != CM_OK) {
        cmi_fail(tp, cm_last_status(), "empty_on: %s", cm_last_error());
        return NULL;
    }
    cm_tensor *t = cm_empty(tp, dt, ndim, shape);
    tp->default_dev = dd;
    return t;
}

cm_tensor *cm_zeros(cm_tape *tp, cm_dtype dt, int ndim, const int64_t *shape) {
    if (!cmi_begin(tp, "zeros", 0, NULL)) return NULL;
    return cmi_zeros(tp, dt, ndim, shape);
}

cm_tensor *cm_full(cm_tape *tp, cm_dtype dt, int ndim, const int64_t *shape, double v) {
    cm_tensor *t = cm_empty(tp, dt, ndim, shape);
    if (t && cmi_dev_fail(tp, cm_tensor_fill(t, v), "full")) return NULL;
    return t;
}

cm_tensor *cm_arange(cm_tape *tp, cm_dtype dt, double start, double end, double step) {
    if (!cmi_begin(tp, "arange", 0, NULL)) return NULL;
    if (step == 0 || !isfinite(start) || !isfinite(end) || !isfinite(step)) {
        cmi_fail(tp, CM_ERR_INVALID_ARG, "arange: start %g, end %g, step %g must be finite with step != 0", start, end,
                 step);
        return NULL;
    }
    double n = ceil((end - start) / step);
    int64_t shape[1] = {n > 0 ? (int64_t)n : 0};
    cm_tensor *t = cmi_new(tp, dt, 1, shape);
    if (t && cmi_dev_fail(tp, cm_tensor_arange_fill(t, start, step), "arange")) return NULL;
    return t;
}

cm_tensor *cm_clone_detached(cm_tape *tp, const cm_tensor *src) {
    if (!cmi_begin(tp, "clone", 1, (cm_tensor *const *)&src)) return NULL;
    cm_tensor *t = cmi_new(tp, src->dtype, src->ndim, src->shape);
    if (t && cmi_dev_fail(tp, cm_tensor_copy(t, src), "clone")) return NULL;
    return t;
}

/* ---- non-differentiable utilities ---- */

typedef struct {
    cm_dtype dd, ds;
} copy_ctx;

static void copy_row(int64_t n, char *const *p, const int64_t *inner, void *vctx) {
    const copy_ctx *c = vctx;
    const size_t ed = cm_dtype_size(c->dd), es = cm_dtype_size(c->ds);
    if (c->dd == c->ds && inner[0] == 1 && inner[1] == 1) {
        memcpy(p[0], p[1], (size_t)n * ed);
        return;
    }
    if (c->dd == CM_DTYPE_F32 && c->ds == CM_DTYPE_F32) {
        float *d = (float *)p[0];
        const float *s = (const float *)p[1];
        for (int64_t i = 0; i < n; i++) d[i * inner[0]] = s[i * inner[1]];
        return;
    }
    if (c->dd == CM_DTYPE_BF16 && c->ds == CM_DTYPE_F32) {
        uint16_t *d = (uint16_t *)p[0];
        const float *s = (const float *)p[1];
        if (inner[0] == 1 && inner[1] == 1)
            cmi_bf16_round_n(d, s, n);
        else
            for (int64_t i = 0; i < n; i++) d[i * inner[0]] = cmi_f32_to_bf16(s[i * inner[1]]);
        return;
    }
    if (c->dd == CM_DTYPE_F32 && c->ds == CM_DTYPE_BF16) {
        float *d = (float *)p[0];
        const uint16_t *s = (const uint16_t *)p[1];
        if (inner[0] == 1 && inner[1] == 1)
            for (int64_t i = 0; i < n; i++) d[i] = cmi_bf16_to_f32(s[i]);
        else
            for (int64_t i = 0; i < n; i++) d[i * inner[0]] = cmi_bf16_to_f32(s[i * inner[1]]);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        cmi_store(c->dd, p[0] + i * inner[0] * (int64_t)ed, cmi_load(c->ds, p[1] + i * inner[1] * (int64_t)es));
}

cm_status cm_tensor_copy(cm_tensor *dst, const cm_tensor *src) {
    int nd;
    int64_t shape[CM_MAX_DIMS];
    if (!cmi_broadcast_shapes(dst->ndim, dst->shape, src->ndim, src->shape, &nd, shape) || nd != dst->ndim ||
        memcmp(shape, dst->shape, sizeof(int64_t) * (size_t)nd) != 0)
        return cm_set_error(CM_ERR_SHAPE, "copy: source %s does not broadcast to destination %s", cmi_shape(src),
                            cmi_shape(dst));
    int64_t st[2][CM_MAX_DIMS];
    memcpy(st[0], dst->stride, sizeof(int64_t) * (size_t)nd);
    cmi_broadcast_strides(src, nd, shape, st[1]);
    if (dst->device != CM_DEVICE_CPU || src->device != CM_DEVICE_CPU) return cmi_copy_any(dst, src, st[1]);
    char *bases[2] = {(char *)dst->data, (char *)src->data};
    size_t es[2] = {cm_dtype_size(dst->dtype), cm_dtype_size(src->dtype)};
    copy_ctx c = {dst->dtype, src->dtype};
    /* Rows may only run in parallel when dst has no stride-0 (overlapping) dims. */
    bool overlap = false;
    for (int i = 0; i < nd; i++)
        if (dst->stride[i] == 0 && dst->shape[i] > 1) overlap = true;
    cmi_iterate(nd, shape, 2, st, bases, es, !overlap, copy_row, &c);
    return CM_OK;
}

typedef struct {
    cm_dtype dt;
    double v;
} fill_ctx;

static void fill_row(int64_t n, char *const *p, const int64_t *inner, void *vctx) {
    const fill_ctx *c = vctx;
    if (c->dt == CM_DTYPE_F32) {
        float *d = (float *)p[0];
        const float v = (float)c->v;
        for (int64_t i = 0; i < n; i++) d[i * inner[0]] = v;
        return;
    }
    const size_t es = cm_dtype_size(c->dt);
    for (int64_t i = 0; i < n; i++) cmi_store(c->dt, p[0] + i * inner[0] * (int64_t)es, c->v);
}

cm_status cm_tensor_fill(cm_tensor *t, double v) {
    if (t->device != CM_DEVICE_CPU)
        return cmi_backend_get(t->device)->fill(t->data, t->dtype, t->ndim, t->shape, t->stride, v);
    int64_t st[1][CM_MAX_DIMS];
    memcpy(st[0], t->stride, sizeof(int64_t) * (size_t)t->ndim);
    char *bases[1] = {(char *)t->data};
    size_t es[1] = {cm_dtype_size(t->dtype)};
    fill_ctx c = {t->dtype, v};
    cmi_iterate(t->ndim, t->shape, 1, st, bases, es, false, fill_row, &c);
    return CM_OK;
}

cm_status cm_tensor_arange_fill(cm_tensor *t, double start, double step) {
    int64_t n = cm_tensor_numel(t);
    if (t->device != CM_DEVICE_CPU) {
        if (!cmi_is_contig(t))
            return cm_set_error(CM_ERR_UNSUPPORTED, "arange_fill: a strided %s tensor on %s (fill a contiguous one)",
                                cmi_shape(t), cm_device_name(t->device));
        return cmi_backend_get(t->device)->arange(t->data, t->dtype, n, start, step);
    }
    int64_t idx[CM_MAX_DIMS] = {0};
    for (int64_t i = 0; i < n; i++) {
        cm_tensor_set(t, idx, start + (double)i * step);
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d]) break;
            idx[d] = 0;
        }
    }
    return CM_OK;
}

/* ---- differentiable views ---- */

/* Backward of any view: gout has the view's shape; scatter it back through the same strides into
 * a contiguous gradient of the base. n->i[0] = element offset of the view in its base. */
typedef struct {
    int ndim;
    int64_t stride[CM_MAX_DIMS];
    int64_t offset;
} view_ctx;

static void add_row(int64_t n, char *const *p, const int64_t *inner, void *ctx) {
    (void)ctx;
    float *dst = (float *)p[0];
    const float *src = (const float *)p[1];
    if (inner[0] == 1 && inner[1] == 1) /* the common case, kept apart so it vectorises */
        for (int64_t i = 0; i < n; i++) dst[i] += src[i];
    else
        for (int64_t i = 0; i < n; i++) dst[i * inner[0]] += src[i * inner[1]];
}

static cm_status view_backward(cm_tape *tp, cm_node *n, const cm_tensor *gout) {
    cm_tensor *base = n->in[0];
    cm_tensor *gb = cmi_grad(tp, base);
    if (!gb) return cmi_status(tp);
    if ((gout->flags & CM_TF_GRAD_ALIAS) && gout->data == gb->data) return CM_OK; /* already there */
    const view_ctx *c = n->ctx;
    /* The view's strides in terms of the base's *contiguous* gradient layout. */
    cm_tensor gv = *gout;
    gv.data = cmi_f32(gb) + c->offset;
    memcpy(gv.stride, c->stride, sizeof c->stride);
    gv.flags = 0;
    /* gv += gout through the strides. Views made by expand overlap (a stride 0 on a dim of size > 1),
     * so they go serial; every other view op (narrow, permute, reshape, [un]squeeze) maps distinct
     * elements to distinct base elements, so rows may run in parallel. */
    const cmi_backend *be = cmi_be(tp);
    if (be) /* dims with stride 0 (expand) are summed over, the rest added through the strides */
        return cmi_dev_fail(tp, be->accum(cmi_f32(&gv), gv.stride, cmi_f32(gout), gout->ndim, gout->shape),
                            "view backward")
                   ? cmi_status(tp)
                   : CM_OK;
    int64_t st[2][CM_MAX_DIMS];
    memcpy(st[0], gv.stride, sizeof(int64_t) * (size_t)gv.ndim);
    cmi_contig_strides(gout->ndim, gout->shape, st[1]);
    bool distinct = true;
    for (int d = 0; d < gv.ndim; d++)
        if (gv.shape[d] > 1 && gv.stride[d] == 0) distinct = false;
    char *bases[2] = {(char *)gv.data, (char *)gout->data};
    size_t es[2] = {4, 4};
    cmi_iterate(gout->ndim, gout->shape, 2, st, bases, es, distinct, add_row, NULL);
    return CM_OK;
}

cm_tensor *cmi_view_alias_base(const cm_tensor *t) {
    if (!t || !t->node || t->node->backward != view_backward || t->node->n_in != 1) return NULL;
    cm_tensor *b = t->node->in[0];
    const view_ctx *c = t->node->ctx;
    if (!b || c->offset != 0 || c->ndim != t->ndim || cm_tensor_numel(b) != cm_tensor_numel(t)) return NULL;
    int64_t want = 1; /* c->stride maps the view into b's contiguous gradient: it must be t's own order */
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && c->stride[d] != want) return NULL;
        want *= t->shape[d];
    }
    return b;
}

cm_tensor *cmi_transposed_base(const cm_tensor *w) {
    if (!w || w->ndim != 2 || !w->node || w->node->backward != view_backward || w->node->n_in != 1) return NULL;
    cm_tensor *b = w->node->in[0];
    const view_ctx *c = w->node->ctx;
    if (!b || b->ndim != 2 || !cmi_is_contig(b) || b->dtype != w->dtype || b->data != w->data || c->offset != 0 ||
        b->shape[0] != w->shape[1] || b->shape[1] != w->shape[0] || w->stride[0] != 1 || w->stride[1] != b->shape[1])
        return NULL;
    return b;
}

/* Makes a view of t with (ndim, shape, stride) starting `offset` elements after t's data, and
 * records the view node. t's gradient is contiguous whatever t's memory layout, so each view op
 * also describes the view in that layout (grad_stride, grad_offset) for view_backward. */
static cm_tensor *make_view(cm_tape *tp, const char *op, cm_tensor *t, int ndim, const int64_t *shape,
                            const int64_t *stride, int64_t offset, const int64_t *grad_stride, int64_t grad_offset) {
    const int64_t es = (int64_t)cm_dtype_size(t->dtype);
    cm_tensor *v = cmi_view(tp, t->dtype, ndim, shape, stride, (char *)t->data + offset * es);
    if (!v) return NULL;
    if (cmi_needs_grad(tp, 1, &t)) {
        /* A view of a view of a contiguous tensor b is recorded against b itself: b's gradient has
         * b's memory layout, so the view's memory strides and offset are its gradient mapping too.
         * A chain such as narrow → reshape → permute (GPT attention's q, k, v) then sends its
         * gradient to b in one strided add instead of filling and adding back every intermediate
         * view's gradient. Not with retain_grads, which promises those gradients. */
        cm_tensor *b = t->node && t->node->backward == view_backward && t->node->n_in == 1 ? t->node->in[0] : NULL;
        const char *bd = b ? (const char *)b->data : NULL;
        if (b && !tp->retain_grads && b->dtype == t->dtype && cmi_is_contig(b) && (const char *)t->data >= bd &&
            (const char *)t->data < bd + cm_tensor_nbytes(b)) {
            cm_node *n = cmi_record(tp, op, v, 1, &b, view_backward, sizeof(view_ctx));
            if (!n) return NULL;
            view_ctx *c = n->ctx;
            c->ndim = ndim;
            memcpy(c->stride, stride, sizeof(int64_t) * (size_t)ndim);
            c->offset = ((const char *)v->data - bd) / es;
            return v;
        }
        cm_node *n = cmi_record(tp, op, v, 1, &t, view_backward, sizeof(view_ctx));
        if (!n) return NULL;
        view_ctx *c = n->ctx;
        c->ndim = ndim;
        memcpy(c->stride, grad_stride, sizeof(int64_t) * (size_t)ndim);
        c->offset = grad_offset;
    }
    return v;
}

cm_tensor *cm_contiguous(cm_tape *tp, cm_tensor *t) {
    if (!cmi_begin(tp, "contiguous", 1, &t)) return NULL;
    if (cmi_is_contig(t)) return t;
    cm_tensor *out = cmi_new(tp, t->dtype, t->ndim, t->shape);
    if (!out) return NULL;
    if (cmi_dev_fail(tp, cm_tensor_copy(out, t), "contiguous")) return NULL;
    if (cmi_needs_grad(tp, 1, &t)) {
        /* The gradient of t is contiguous in t's shape, so this is an identity in gradient space. */
        int64_t gs[CM_MAX_DIMS];
        cmi_contig_strides(t->ndim, t->shape, gs);
        cm_node *n = cmi_record(tp, "contiguous", out, 1, &t, view_backward, sizeof(view_ctx));
        if (!n) return NULL;
        view_ctx *c = n->ctx;
        c->ndim = t->ndim;
        memcpy(c->stride, gs, sizeof gs);
        c->offset = 0;
    }
    return out;
}

/* The strides of t (n > 0 elements) seen with `shape`, when that needs no copy: each run of t's dims
 * that is contiguous in memory may be split or merged freely (PyTorch's computeStride). False when
 * the new shape crosses a gap between such runs — e.g. (B, T, C) narrowed from (B, T, 3C) reshapes to
 * (B, T, H, C/H) as a view, but not to (B·T, C). */
static bool view_strides(const cm_tensor *t, int ndim, const int64_t *shape, int64_t *stride) {
    if (t->ndim == 0) {
        for (int i = 0; i < ndim; i++) stride[i] = 1;
        return true;
    }
    int view_d = ndim - 1;
    int64_t chunk_stride = t->stride[t->ndim - 1], tensor_numel = 1, view_numel = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        tensor_numel *= t->shape[d];
        if (d == 0 || (t->shape[d - 1] != 1 && t->stride[d - 1] != tensor_numel * chunk_stride)) {
            while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
                stride[view_d] = view_numel * chunk_stride;
                view_numel *= shape[view_d];
                view_d--;
            }
            if (view_numel != tensor_numel) return false;
            if (d > 0) {
                chunk_stride = t->stride[d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    return view_d == -1;
}

cm_tensor *cm_reshape(cm_tape *tp, cm_tensor *t, int ndim, const int64_t *shape_in) {
    if (!cmi_begin(tp, "reshape", 1, &t)) return NULL;
    if (ndim < 0 || ndim > CM_MAX_DIMS) {
        cmi_fail(tp, CM_ERR_INVALID_ARG, "reshape: ndim %d is out of range (0..%d)", ndim, CM_MAX_DIMS);
        return NULL;
    }
    int64_t shape[CM_MAX_DIMS];
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < ndim; i++) {
        shape[i] = shape_in[i];
        if (shape[i] == -1) {
            if (infer >= 0) {
                cmi_fail(tp, CM_ERR_INVALID_ARG, "reshape: more than one -1 in the new shape");
                return NULL;
            }
            infer = i;
        } else if (shape[i] < 0) {
            cmi_fail(tp, CM_ERR_INVALID_ARG, "reshape: dim %d of the new shape is %lld", i, (long long)shape[i]);
            return NULL;
        } else {
            known *= shape[i];
        }
    }
    int64_t n = cm_tensor_numel(t);
    if (infer >= 0) shape[infer] = known ? n / known : 0;
    if (cmi_numel(ndim, shape) != n) {
        cmi_fail(tp, CM_ERR_SHAPE, "reshape: cannot reshape %s (%lld elements) to %s", cmi_shape(t), (long long)n,
                 cmi_shape_of(ndim, shape_in));
        return NULL;
    }
    int64_t stride[CM_MAX_DIMS], gstride[CM_MAX_DIMS];
    cmi_contig_strides(ndim, shape, gstride); /* t's gradient is contiguous: the view's is, in t's order */
    if (n > 0 && view_strides(t, ndim, shape, stride))
        return make_view(tp, "reshape", t, ndim, shape, stride, 0, gstride, 0);
    cm_tensor *src = cmi_is_contig(t) ? t : cm_contiguous(tp, t);
    if (!src) return NULL;
    return make_view(tp, "reshape", src, ndim, shape, gstride, 0, gstride, 0);
}

cm_tensor *cm_permute(cm_tape *tp, cm_tensor *t, const int *perm) {
    if (!cmi_begin(tp, "permute", 1, &t)) return NULL;
    int seen[CM_MAX_DIMS] = {0};
    int64_t shape[CM_MAX_DIMS], stride[CM_MAX_DIMS], gstride[CM_MAX_DIMS], gbase[CM_MAX_DIMS];
    cmi_contig_strides(t->ndim, t->shape, gbase);
    for (int i = 0; i < t->ndim; i++) {
        int p = perm[i];
        if (!cmi_axis(tp, "permute", t->ndim, &p)) return NULL;
        if (seen[p]++) {
            cmi_fail(tp, CM_ERR_INVALID_ARG, "permute: axis %d appears twice in the permutation", perm[i]);
            return NULL;
        }
        shape[i] = t->shape[p];
        stride[i] = t->stride[p];
        gstride[i] = gbase[p];
    }
    return make_view(tp, "permute", t, t->ndim, shape, stride, 0, gstride, 0);
}

cm_tensor *cm_transpose(cm_tape *tp, cm_tensor *t, int a, int b) {
    if (!cmi_begin(tp, "transpose", 1, &t)) return NULL;
    if (!cmi_axis(tp, "transpose", t->ndim, &a) || !cmi_axis(tp, "transpose", t->ndim, &b)) return NULL;
    int perm[CM_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) perm[i] = i;
    perm[a] = b;
    perm[b] = a;
    return cm_permute(tp, t, perm);
}

/* Elements start, start + step, ... below stop along axis, a view for narrow (step 1) and slice. */
static cm_tensor *strided_range(cm_tape *tp, const char *op, cm_tensor *t, int axis, int64_t start, int64_t stop,
                                int64_t step) {
    if (!cmi_begin(tp, op, 1, &t)) return NULL;
    if (!cmi_axis(tp, op, t->ndim, &axis)) return NULL;
    if (step < 1) {
        cmi_fail(tp, CM_ERR_INVALID_ARG, "%s: step %lld must be >= 1", op, (long long)step);
        return NULL;
    }
    if (start < 0 || stop < start || stop > t->shape[axis]) {
        cmi_fail(tp, CM_ERR_INVALID_ARG, "%s: range [%lld, %lld) is outside axis %d of %s", op, (long long)start,
                 (long long)stop, axis, cmi_shape(t));
        return NULL;
    }
    int64_t shape[CM_MAX_DIMS], stride[CM_MAX_DIMS], gstride[CM_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    memcpy(stride, t->stride, sizeof stride);
    shape[axis] = (stop - start + step - 1) / step;
    cmi_contig_strides(t->ndim, t->shape, gstride);
    const int64_t offset = start * t->stride[axis], goffset = start * gstride[axis];
    stride[axis] *= step;
    gstride[axis] *= step;
    return make_view(tp, op, t, t->ndim, shape, stride, offset, gstride, goffset);
}

cm_tensor *cm_narrow(cm_tape *tp, cm_tensor *t, int axis, int64_t start, int64_t length) {
    return strided_range(tp, "narrow", t, axis, start, start + length, 1);
}

cm_tensor *cm_slice(cm_tape *tp, cm_tensor *t, int axis, int64_t start, int64_t stop, int64_t step) {
    return strided_range(tp, "slice", t, axis, start, stop, step);
}

cm_tensor *cm_expand(cm_tape *tp, cm_tensor *t, int ndim, const int64_t *shape) {
    if (!cmi_begin(tp, "expand", 1, &t)) return NULL;
    if (ndim < t->ndim || ndim > CM_MAX_DIMS) {
        cmi_fail(tp, CM_ERR_SHAPE, "expand: cannot expand %s to %s", cmi_shape(t), cmi_shape_of(ndim, shape));
        return NULL;
    }
    int64_t stride[CM_MAX_DIMS], gstride[CM_MAX_DIMS], gbase[CM_MAX_DIMS];
    cmi_contig_strides(t->ndim, t->shape, gbase);
    for (int i = 0; i < ndim; i++) {
        int it = i - (ndim - t->ndim);
        if (it < 0) {
            stride[i] = gstride[i] = 0;
        } else if (t->shape[it] == shape[i]) {
            stride[i] = t->stride[it];
            gstride[i] = gbase[it];
        } else if (t->shape[it] == 1) {
            stride[i] = gstride[i] = 0;
        } else {
            cmi_fail(tp, CM_ERR_SHAPE, "expand: cannot expand %s to %s (dim %d is %lld, not 1)", cmi_shape(t),
                     cmi_shape_of(ndim, shape), it, (long long)t->shape[it]);
            return NULL;
        }
    }
    return make_view(tp, "expand", t, ndim, shape, stride, 0, gstride, 0);
}

cm_tensor *cm_squeeze(cm_tape *tp, cm_tensor *t, int axis) {
    if (!cmi_begin(tp, "squeeze", 1, &t)) return NULL;
    if (!cmi_axis(tp, "squeeze", t->ndim, &axis)) return NULL;
    if (t->shape[axis] != 1) {
        cmi_fail(tp, CM_ERR_SHAPE, "squeeze: axis %d of %s has size %lld, not 1", axis, cmi_shape(t),
                 (long long)t->shape[axis]);
        return NULL;
    }
    int64_t shape[CM_MAX_DIMS], stride[CM_MAX_DIMS], gstride[CM_MAX_DIMS], gbase[CM_MAX_DIMS];
    cmi_contig_strides(t->ndim, t->shape, gbase);
    int k = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (i == axis) continue;
        shape[k] = t->shape[i];
        stride[k] = t->stride[i];
        gstride[k] = gbase[i];
        k++;
    }
    return make_view(tp, "squeeze", t, t->ndim - 1, shape, stride, 0, gstride, 0);
}

cm_tensor *cm_unsqueeze(cm_tape *tp, cm_tensor *t, int axis) {
    if (!cmi_begin(tp, "unsqueeze", 1, &t)) return NULL;
    if (t->ndim >= CM_MAX_DIMS) {
        cmi_fail(tp, CM_ERR_INVALID_ARG, "unsqueeze: %s already has %d dims", cmi_shape(t), CM_MAX_DIMS);
        return NULL;
    }
    if (!cmi_axis(tp, "unsqueeze", t->ndim + 1, &axis)) return NULL;
    int64_t shape[CM_MAX_DIMS], stride[CM_MAX_DIMS], gstride[CM_MAX_DIMS], gbase[CM_MAX_DIMS];
    cmi_contig_strides(t->ndim, t->shape, gbase);
    int k = 0;
    for (int i = 0; i <= t->ndim; i++) {
        if (i == axis) {
            shape[i] = 1;
            stride[i] = gstride[i] = 0;
            continue;
        }
        shape[i] = t->shape[k];
        stride[i] = t->stride[k];
        gstride[i] = gbase[k];
        k++;
    }
    return make_view(tp, "unsqueeze", t, t->ndim + 1, shape, stride, 0, gstride, 0);
}

cm_tensor *cm_detach(cm_tape *tp, cm_tensor *t) {
    if (!cmi_begin(tp, "detach", 1, &t)) return NULL;
    return cmi_view(tp, t->dtype, t->ndim, t->shape, t->stride, t->data);
}

/* Cast: gradients are f32 for every dtype, so the backward is an identity accumulate. */
static cm_status cast_backward(cm_tape *tp, cm_node *n, const cm_tensor *gout) {
    return cmi_accum(tp, n->in[0], gout);
}

cm_tensor *cm_cast(cm_tape *tp, cm_tensor *t, cm_dtype dt) {
    if (!cmi_begin(tp, "cast", 1, &t)) return NULL;
    if ((unsigned)dt >= CM_DTYPE_COUNT) {
        cmi_fail(tp, CM_ERR_DTYPE, "cast: dtype %d is not valid", (int)dt);
        return NULL;
    }
    if (t->dtype == dt) return t;
    cm_tensor *out = cmi_new(tp, dt, t->ndim, t->shape);
    if (!out) return NULL;
    if (cmi_dev_fail(tp, cm_tensor_copy(out, t), "cast")) return NULL;
    bool floating = dt == CM_DTYPE_F32 || dt == CM_DTYPE_BF16 || dt == CM_DTYPE_F16;
    if (floating && cmi_needs_grad(tp, 1, &t)) {
        if (!cmi_record(tp, "cast", out, 1, &t, cast_backward, 0)) return NULL;
    }
    return out;
}
