/* The data spec: counting, transforming and splitting batches. Microbatches are views: each field
 * of a microbatch is a tensor over rows [i·m, i·m + rows) of the batch's (contiguous) tensor. */
#include <composer/data.h>

#include <string.h>

struct cm_data_spec {
    cm_dataloader *dl;
    cm_data_spec_config cfg;
    cm_batch *mbs; /* the last split's microbatches */
    int64_t n_mbs, cap_mbs;
};

cm_data_spec_config cm_data_spec_config_default(void) {
    cm_data_spec_config c = {0};
    return c;
}

cm_status cm_data_spec_new(cm_dataloader *dl, const cm_data_spec_config *cfg, cm_data_spec **out) {
    *out = NULL;
    cm_data_spec *sp = cm_alloc_zeroed(sizeof *sp, 16);
    if (!sp) return CM_ERR_OOM;
    sp->dl = dl;
    sp->cfg = cfg ? *cfg : cm_data_spec_config_default();
    *out = sp;
    return CM_OK;
}

static void release_mbs(cm_data_spec *sp) {
    for (int64_t i = 0; i < sp->n_mbs; i++)
        for (int f = 0; f < sp->mbs[i].n_fields; f++) {
            cm_tensor_free(sp->mbs[i].fields[f]);
            sp->mbs[i].fields[f] = NULL;
        }
    sp->n_mbs = 0;
}

void cm_data_spec_free(cm_data_spec *sp) {
    if (!sp) return;
    release_mbs(sp);
    cm_free(sp->mbs);
    cm_free(sp);
}

cm_dataloader *cm_data_spec_loader(const cm_data_spec *sp) { return sp->dl; }

cm_status cm_data_spec_next(cm_data_spec *sp, cm_batch **out) {
    *out = NULL;
    if (!sp->dl) return cm_set_error(CM_ERR_STATE, "data spec: no dataloader (made with cm_data_spec_new(NULL, ...))");
    cm_batch *b;
    cm_status st = cm_dataloader_next(sp->dl, &b);
    if (st != CM_OK || !b) return st;
    if (sp->cfg.batch_transform && (st = sp->cfg.batch_transform(b, sp->cfg.data)) != CM_OK)
        return cm_set_error(st, "batch transform (epoch %lld, step %lld): %s", (long long)b->epoch, (long long)b->step,
                            cm_last_error());
    *out = b;
    return CM_OK;
}

int64_t cm_data_spec_n_samples(const cm_data_spec *sp, const cm_batch *b) {
    return sp->cfg.count_samples ? sp->cfg.count_samples(b, sp->cfg.data) : b->n_samples;
}

int64_t cm_data_spec_n_tokens(const cm_data_spec *sp, const cm_batch *b) {
    return sp->cfg.count_tokens ? sp->cfg.count_tokens(b, sp->cfg.data) : b->n_tokens;
}

int64_t cm_data_spec_n_loss_tokens(const cm_data_spec *sp, const cm_batch *b) {
    if (sp->cfg.count_loss_tokens) return sp->cfg.count_loss_tokens(b, sp->cfg.data);
    const cm_tensor *y = cm_batch_field(b, "labels");
    if (!y || cm_tensor_ndim(y) < 2 || cm_tensor_device(y) != CM_DEVICE_CPU || !cm_tensor_is_contiguous(y) ||
        cm_tensor_dim(y, 0) != b->n_rows)
        return -1;
    const cm_dtype dt = cm_tensor_dtype(y);
    if (dt != CM_DTYPE_I32 && dt != CM_DTYPE_I64) return -1;
    const int64_t per_row = b->n_rows ? cm_tensor_numel(y) / b->n_rows : 0;
    int64_t n = 0;
    for (int64_t r = 0; r < b->n_rows; r++) {
        if (b->valid && !b->valid[r]) continue;
        if (dt == CM_DTYPE_I32) {
            const int32_t *p = (const int32_t *)cm_tensor_data(y) + r * per_row;
            for (int64_t j = 0; j < per_row; j++) n += p[j] != -100;
        } else {
            const int64_t *p = (const int64_t *)cm_tensor_data(y) + r * per_row;
            for (int64_t j = 0; j < per_row; j++) n += p[j] != -100;
        }
    }
    return n;
}

cm_status cm_data_spec_split(cm_data_spec *sp, const cm_batch *b, int64_t m, cm_batch **out, int64_t *n_out) {
    *out = NULL;
    *n_out = 0;
    release_mbs(sp);
    if (m < 1) return cm_set_error(CM_ERR_INVALID_ARG, "data spec: microbatch_size %lld (must be >= 1)", (long long)m);
    if (b->n_rows < 0 || b->n_fields < 0 || b->n_fields > CM_DATASET_MAX_FIELDS)
        return cm_set_error(CM_ERR_INVALID_ARG, "data spec: batch with %lld rows and %d fields", (long long)b->n_rows,
                            b->n_fields);
    for (int f = 0; f < b->n_fields; f++) {
        const cm_tensor *t = b->fields[f];
        if (!t || cm_tensor_ndim(t) < 1 || cm_tensor_dim(t, 0) != b->n_rows || !cm_tensor_is_contiguous(t))
            return cm_set_error(CM_ERR_INVALID_ARG,
                                "data spec: field %d ('%s') of the batch is %s; splitting needs a contiguous tensor "
                                "with n_rows = %lld rows",
                                f, b->names[f] ? b->names[f] : "?", !t ? "missing" : "not that", (long long)b->n_rows);
    }
    const int64_t n = (b->n_rows + m - 1) / m;
    if (n > sp->cap_mbs) {
        cm_batch *nb = cm_alloc_zeroed(sizeof(cm_batch) * (size_t)n, 64);
        if (!nb) return CM_ERR_OOM;
        cm_free(sp->mbs);
        sp->mbs = nb;
        sp->cap_mbs = n;
    }
    for (int64_t i = 0; i < n; i++) {
        const int64_t r0 = i * m, rows = (r0 + m <= b->n_rows) ? m : b->n_rows - r0;
        cm_batch *mb = &sp->mbs[i];
        *mb = *b;
        for (int f = 0; f < b->n_fields; f++) mb->fields[f] = NULL;
        sp->n_mbs = i + 1; /* so a failure below frees what exists */
        for (int f = 0; f < b->n_fields; f++) {
            const cm_tensor *t = b->fields[f];
            int64_t shape[CM_MAX_DIMS];
            const int nd = cm_tensor_ndim(t);
            memcpy(shape, cm_tensor_shape(t), sizeof(int64_t) * (size_t)nd);
            shape[0] = rows;
            const size_t row_bytes = b->n_rows ? cm_tensor_nbytes(t) / (size_t)b->n_rows : 0;
            char *base = (char *)cm_tensor_data(t) + (size_t)r0 * row_bytes;
            cm_status st = cm_tensor_from_data(cm_tensor_dtype(t), nd, shape, base, &mb->fields[f]);
            if (st != CM_OK) {
                release_mbs(sp);
                return st;
            }
        }
        mb->n_rows = rows;
        mb->indices = b->indices ? b->indices + r0 : NULL;
        mb->valid = b->valid ? b->valid + r0 : NULL;
        mb->row_tokens = b->row_tokens ? b->row_tokens + r0 : NULL;
        mb->n_samples = 0;
        mb->n_tokens = 0;
        for (int64_t j = 0; j < rows; j++) {
            const bool real = mb->valid ? mb->valid[j] != 0 : true;
            mb->n_samples += real;
            if (real && mb->row_tokens) mb->n_tokens += mb->row_tokens[j];
        }
        mb->n_padded = rows - mb->n_samples;
        mb->microbatch = i;
    }
    if (sp->cfg.microbatch_transform)
        for (int64_t i = 0; i < n; i++) {
            cm_status st = sp->cfg.microbatch_transform(&sp->mbs[i], sp->cfg.data);
            if (st != CM_OK) {
                cm_set_error(st, "microbatch transform (microbatch %lld of %lld, epoch %lld, step %lld): %s",
                             (long long)i, (long long)n, (long long)b->epoch, (long long)b->step, cm_last_error());
                release_mbs(sp);
                return st;
            }
        }
    *out = sp->mbs;
    *n_out = n;
    return CM_OK;
}
