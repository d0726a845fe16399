/* The dataset handle: validation of an implementation's vtable and fields, checked access. */
#include <composer/data.h>

#include <string.h>

struct cm_dataset {
    cm_dataset_i vt;
    void *self;
    int n_fields;
    size_t field_bytes[CM_DATASET_MAX_FIELDS];
    const cm_dataset_order_i *order;
};

cm_status cm_dataset_new(const cm_dataset_i *vt, void *self, cm_dataset **out) {
    *out = NULL;
    if (!vt || vt->abi != CM_DATASET_ABI)
        return cm_set_error(CM_ERR_INVALID_ARG, "dataset: vtable abi %d, expected %d (rebuild against this library)",
                            vt ? vt->abi : -1, CM_DATASET_ABI);
    const char *tn = vt->type_name ? vt->type_name : "dataset";
    if (!vt->len || !vt->n_fields || !vt->field || !vt->get)
        return cm_set_error(CM_ERR_INVALID_ARG, "dataset '%s': len, n_fields, field and get are required", tn);
    int nf = vt->n_fields(self);
    if (nf < 1 || nf > CM_DATASET_MAX_FIELDS)
        return cm_set_error(CM_ERR_INVALID_ARG, "dataset '%s': %d fields (must be 1..%d)", tn, nf,
                            CM_DATASET_MAX_FIELDS);
    cm_dataset *ds = cm_alloc_zeroed(sizeof *ds, 16);
    if (!ds) return CM_ERR_OOM;
    for (int f = 0; f < nf; f++) {
        const cm_field_desc *d = vt->field(self, f);
        if (!d || !d->name || cm_dtype_size(d->dtype) == 0 || d->ndim < 0 || d->ndim > CM_MAX_DIMS) {
            cm_free(ds);
            return cm_set_error(CM_ERR_INVALID_ARG, "dataset '%s': field %d has no name, a bad dtype or a bad ndim", tn,
                                f);
        }
        int64_t n = 1;
        for (int k = 0; k < d->ndim; k++) {
            if (d->shape[k] < 1) {
                cm_free(ds);
                return cm_set_error(CM_ERR_INVALID_ARG, "dataset '%s': field '%s' dim %d is %lld (must be >= 1)", tn,
                                    d->name, k, (long long)d->shape[k]);
            }
            n *= d->shape[k];
        }
        ds->field_bytes[f] = (size_t)n * cm_dtype_size(d->dtype);
    }
    ds->vt = *vt;
    ds->self = self;
    ds->n_fields = nf;
    *out = ds;
    return CM_OK;
}

void cm_dataset_free(cm_dataset *ds) {
    if (!ds) return;
    if (ds->vt.close) ds->vt.close(ds->self);
    cm_free(ds);
}

int64_t cm_dataset_len(const cm_dataset *ds) { return ds->vt.len(ds->self); }
int cm_dataset_n_fields(const cm_dataset *ds) { return ds->n_fields; }
const cm_field_desc *cm_dataset_field(const cm_dataset *ds, int i) {
    return (i >= 0 && i < ds->n_fields) ? ds->vt.field(ds->self, i) : NULL;
}
size_t cm_dataset_field_bytes(const cm_dataset *ds, int f) {
    return (f >= 0 && f < ds->n_fields) ? ds->field_bytes[f] : 0;
}
const char *cm_dataset_type_name(const cm_dataset *ds) { return ds->vt.type_name ? ds->vt.type_name : "dataset"; }

int cm_dataset_find_field(const cm_dataset *ds, const char *name) {
    for (int f = 0; f < ds->n_fields; f++)
        if (strcmp(ds->vt.field(ds->self, f)->name, name) == 0) return f;
    return -1;
}

cm_status cm_dataset_get(const cm_dataset *ds, int64_t index, const cm_sample_ctx *ctx, void *const *out) {
    int64_t n = ds->vt.len(ds->self);
    if (index < 0 || index >= n)
        return cm_set_error(CM_ERR_INVALID_ARG, "dataset '%s': sample index %lld is out of range [0, %lld)",
                            cm_dataset_type_name(ds), (long long)index, (long long)n);
    static const cm_sample_ctx k_default = {0, 0, false};
    return ds->vt.get(ds->self, index, ctx ? ctx : &k_default, out);
}

int64_t cm_dataset_n_tokens(const cm_dataset *ds, int64_t index) {
    return ds->vt.n_tokens ? ds->vt.n_tokens(ds->self, index) : 0;
}

cm_status cm_dataset_set_order(cm_dataset *ds, const cm_dataset_order_i *order) {
    if (!order || !order->batch_order || !order->epoch_size)
        return cm_set_error(CM_ERR_INVALID_ARG, "dataset '%s': an order needs batch_order and epoch_size",
                            cm_dataset_type_name(ds));
    ds->order = order;
    return CM_OK;
}

bool cm_dataset_has_order(const cm_dataset *ds) { return ds->order != NULL; }

cm_status cm_dataset_batch_order(const cm_dataset *ds, int64_t epoch, int64_t position, int64_t global_batch, int rank,
                                 int world_size, int64_t *ids, int64_t *n_rank, int64_t *n_global) {
    return ds->order->batch_order(ds->self, epoch, position, global_batch, rank, world_size, ids, n_rank, n_global);
}

int64_t cm_dataset_epoch_size(const cm_dataset *ds, int64_t global_batch, int world_size) {
    return ds->order->epoch_size(ds->self, global_batch, world_size);
}

void *cm_dataset_self(const cm_dataset *ds) { return ds->self; }
