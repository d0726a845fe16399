/* SeqLengthWarmup (Li et al. 2021, Composer's SeqLengthWarmup): short sequences early in
 * training, growing in steps to the full length; a dry run at full length first, so memory is
 * claimed up front. */
#include "plugins/data_algos/da_impl.h"

#include <math.h>

int64_t cm_seq_length_warmup_length(const cm_seq_length_warmup_config *c, int64_t batch, int64_t total) {
    const int64_t warm = (int64_t)((double)total * c->duration); /* int(steps · duration) */
    if (warm <= 0) return c->max_seq_length;
    int64_t updates = (c->max_seq_length - c->min_seq_length) / c->step_size;
    if (updates < 1) updates = 1;
    int64_t every = warm / updates;
    if (every < 1) every = 1;
    int64_t len = c->step_size * (batch / every) + c->min_seq_length;
    if (len < c->min_seq_length) len = c->min_seq_length;
    return len < c->max_seq_length ? len : c->max_seq_length;
}

static void free_all(cm_tensor **out, int n) {
    for (int i = 0; i < n; i++) {
        cm_tensor_free(out[i]);
        out[i] = NULL;
    }
}

/* Rows of (B, T, ...) cut to (B, L, ...): row r's first L positions. */
static void cut_rows(const cm_tensor *t, int64_t L, cm_tensor *o) {
    const int64_t B = cm_tensor_dim(t, 0), T = cm_tensor_dim(t, 1);
    const size_t pos = B && T ? cm_tensor_nbytes(t) / (size_t)(B * T) : 0; /* bytes per position */
    for (int64_t r = 0; r < B; r++)
        memcpy((char *)cm_tensor_data(o) + (size_t)(r * L) * pos, (const char *)cm_tensor_data(t) + (size_t)(r * T) * pos,
               (size_t)L * pos);
}

cm_status cm_set_batch_sequence_length(const char *const *names, cm_tensor *const *fields, int n, int64_t L,
                                       bool truncate, bool preserve_eos, cm_tensor **out, int64_t *out_rows) {
    const char *who = "set_batch_sequence_length";
    if (n < 0 || (n > 0 && (!names || !fields || !out)) || L < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: need n >= 0 named fields, outputs and a length >= 1 (got %lld)", who,
                            (long long)L);
    char d[96];
    for (int i = 0; i < n; i++) {
        out[i] = NULL;
        if (!names[i] || !fields[i]) return cm_set_error(CM_ERR_INVALID_ARG, "%s: field %d is NULL", who, i);
        if (!cm_tensor_is_contiguous(fields[i]))
            return cm_set_error(CM_ERR_INVALID_ARG, "%s: field '%s' must be contiguous", who, names[i]);
        cm_status hs = cmi_da_check_host(who, fields[i], NULL);
        if (hs) return hs;
    }
    /* the batch's length: dim 1 of its first field with more than one dim, as Composer */
    int64_t T = 0, B = n ? cm_tensor_dim(fields[0], 0) : 0;
    for (int i = 0; i < n && !T; i++)
        if (cm_tensor_ndim(fields[i]) > 1) T = cm_tensor_dim(fields[i], 1);
    cm_status s = CM_OK;
    if (L >= T) {
        for (int i = 0; i < n && !s; i++)
            if (!(s = cmi_da_new_like(fields[i], cm_tensor_ndim(fields[i]), cm_tensor_shape(fields[i]), &out[i])))
                s = cm_tensor_copy(out[i], fields[i]);
        if (s) free_all(out, n);
        if (!s && out_rows) *out_rows = B;
        return s;
    }
    if (truncate) {
        int mask = -1;
        for (int i = 0; i < n; i++) {
            if (cm_tensor_ndim(fields[i]) < 2)
                return cm_set_error(CM_ERR_SHAPE, "%s: every field must be sequence-shaped (B, T, ...) to truncate; "
                                                  "'%s' is %s",
                                    who, names[i], cmi_da_desc(fields[i], d, sizeof d));
            if (cm_tensor_dim(fields[i], 0) != B || cm_tensor_dim(fields[i], 1) != T)
                return cm_set_error(CM_ERR_SHAPE, "%s: field '%s' %s is not (%lld, %lld, ...) like the others", who,
                                    names[i], cmi_da_desc(fields[i], d, sizeof d), (long long)B, (long long)T);
            if (!strcmp(names[i], "attention_mask")) mask = i;
        }
        if (preserve_eos && mask < 0)
            return cm_set_error(CM_ERR_NOT_FOUND, "%s: preserve_end_of_sequence needs an 'attention_mask' field", who);
        for (int i = 0; i < n && !s; i++) {
            int64_t shape[CM_MAX_DIMS];
            memcpy(shape, cm_tensor_shape(fields[i]), sizeof(int64_t) * (size_t)cm_tensor_ndim(fields[i]));
            shape[1] = L;
            if ((s = cmi_da_new_like(fields[i], cm_tensor_ndim(fields[i]), shape, &out[i]))) break;
            cut_rows(fields[i], L, out[i]);
            if (!preserve_eos) continue;
            /* each row's last real token (by the mask) moves to its truncated position */
            const size_t pos = cm_tensor_nbytes(fields[i]) / (size_t)(B * T);
            for (int64_t r = 0; r < B; r++) {
                int64_t real = 0;
                for (int64_t t = 0; t < T; t++) real += cm_tensor_get_flat(fields[mask], r * T + t) != 0;
                const int64_t eos = real - 1, to = eos < L - 1 ? eos : L - 1;
                if (eos < 0) continue; /* an empty row: Composer indexes position -1, the row's last */
                memcpy((char *)cm_tensor_data(out[i]) + (size_t)(r * L + to) * pos,
                       (const char *)cm_tensor_data(fields[i]) + (size_t)(r * T + eos) * pos, pos);
            }
        }
        if (s) free_all(out, n);
        if (!s && out_rows) *out_rows = B;
        return s;
    }
    /* reshape: the batch's tokens re-cut into rows of L */
    int ids = -1;
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], "input_ids")) ids = i;
    if (ids < 0) return cm_set_error(CM_ERR_NOT_FOUND, "%s: truncate false needs an 'input_ids' field", who);
    const int nd = cm_tensor_ndim(fields[ids]);
    for (int i = 0; i < n; i++) {
        bool same = cm_tensor_ndim(fields[i]) == nd;
        for (int k = 0; same && k < nd; k++) same = cm_tensor_dim(fields[i], k) == cm_tensor_dim(fields[ids], k);
        if (!same)
            return cm_set_error(CM_ERR_SHAPE, "%s: with truncate false every field must have input_ids' shape; '%s' is %s",
                                who, names[i], cmi_da_desc(fields[i], d, sizeof d));
    }
    const int64_t rows = cm_tensor_numel(fields[ids]) / L;
    for (int i = 0; i < n && !s; i++) {
        const int64_t shape[2] = {rows, L};
        if ((s = cmi_da_new_like(fields[i], 2, shape, &out[i]))) break;
        memcpy(cm_tensor_data(out[i]), cm_tensor_data(fields[i]), cm_tensor_nbytes(out[i]));
    }
    if (s) free_all(out, n);
    if (!s && out_rows) *out_rows = rows;
    return s;
}

void cmi_da_rows_free(cmi_da_rows *r) {
    cm_free(r->a);
    r->a = NULL, r->cap = 0;
}

cm_status cmi_da_set_recut_batch(cm_state *st, const cm_batch *b, cm_tensor **out, int64_t rows, int64_t L,
                                 bool keep_indices, cmi_da_owned *owned, cmi_da_rows *arr) {
    cm_status s = CM_OK;
    for (int i = 0; i < b->n_fields; i++)
        if ((s = cmi_da_owned_add(owned, out[i]))) {
            for (int j = i + 1; j < b->n_fields; j++) cm_tensor_free(out[j]);
            return s;
        }
    if (rows > arr->cap) { /* (3·cap): indices, row_tokens, and valid bytes */
        int64_t *a = cm_alloc(sizeof(int64_t) * 3 * (size_t)rows, 16);
        if (!a) return cm_set_error(CM_ERR_OOM, "re-cutting a batch to %lld rows: out of memory", (long long)rows);
        cm_free(arr->a);
        arr->a = a, arr->cap = rows;
    }
    cm_batch nb = *b;
    for (int i = 0; i < b->n_fields; i++) nb.fields[i] = out[i];
    int64_t *idx = arr->a, *tok = arr->a + rows;
    uint8_t *valid = (uint8_t *)(arr->a + 2 * rows);
    const bool counts_tokens = b->row_tokens && b->n_tokens > 0;
    nb.n_tokens = 0;
    for (int64_t r = 0; r < rows; r++) {
        idx[r] = keep_indices && b->indices ? b->indices[r] : -1;
        tok[r] = counts_tokens ? L : 0;
        valid[r] = 1;
        nb.n_tokens += tok[r];
    }
    nb.n_rows = nb.n_samples = rows, nb.n_padded = 0;
    nb.indices = idx, nb.row_tokens = tok, nb.valid = valid;
    return cm_state_set_batch(st, &nb);
}

/* ---- the algorithm ---- */

typedef struct {
    cm_seq_length_warmup_config cfg;
    bool activated; /* the dry run at full length happened in this trainer (not checkpointed, as Composer) */
    cmi_da_owned owned;
    cmi_da_rows rows;
    int64_t last_len, last_bs;
} slw;

static bool sw_match(void *self, cm_event ev, const cm_state *st) {
    return ev == CM_EVENT_INIT || ev == CM_EVENT_AFTER_DATALOADER;
}

static cm_status sw_init(cm_state *st) {
    cm_dataloader *dl = cm_state_train_dataloader(st);
    if (!dl) return CM_OK; /* no training here; checked again on the batches */
    const cm_dataset *ds = cm_dataloader_dataset(dl);
    const int f = cm_dataset_find_field(ds, "input_ids");
    if (f >= 0 && cm_dataset_field(ds, f)->ndim >= 1) return CM_OK;
    char list[256] = "";
    for (int i = 0; i < cm_dataset_n_fields(ds); i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", cm_dataset_field(ds, i)->name);
    return cm_set_error(CM_ERR_INVALID_ARG, "SeqLengthWarmup: the train dataset ('%s') has no 'input_ids' field of "
                                            "sequences (fields: %s); it applies to token models (GPT-2, BERT)",
                        cm_dataset_type_name(ds), list);
}

/* The first dry run: the batch cut to max_seq_length (Composer's _activate_model). */
static cm_status activate(slw *w, cm_state *st, cm_batch *b) {
    cm_tensor *cut[CM_DATASET_MAX_FIELDS];
    int64_t rows;
    cm_status s = cm_set_batch_sequence_length(b->names, b->fields, b->n_fields, w->cfg.max_seq_length, true, false, cut,
                                               &rows);
    if (s) return s;
    cm_batch a = *b;
    for (int i = 0; i < b->n_fields; i++) a.fields[i] = cut[i];
    s = cm_state_dry_run(st, &a);
    free_all(cut, b->n_fields);
    w->activated = true;
    return s;
}

static cm_status sw_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    slw *w = self;
    const char *who = "SeqLengthWarmup";
    if (ev == CM_EVENT_INIT) return sw_init(st);
    cmi_da_owned_clear(&w->owned);
    cm_batch *b = cm_state_batch(st);
    if (!b) return cm_set_error(CM_ERR_STATE, "%s: there is no batch", who);
    cm_status s;
    if (!w->activated && (s = activate(w, st, b))) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "%s: the full-length pass: %s", who, msg);
    }
    const cm_time md = cm_state_max_duration(st);
    int64_t total;
    if (md.unit == CM_TIME_EPOCH)
        total = cm_state_batches_per_epoch(st) * md.count;
    else if (md.unit == CM_TIME_BATCH)
        total = md.count;
    else
        return cm_set_error(CM_ERR_UNSUPPORTED, "%s: max_duration must be in epochs or batches (ep, ba) to schedule the "
                                                "warmup, as Composer",
                            who);
    const int64_t L = cm_seq_length_warmup_length(&w->cfg, cm_state_timestamp(st)->batch, total);
    cm_tensor *out[CM_DATASET_MAX_FIELDS];
    int64_t rows;
    s = cm_set_batch_sequence_length(b->names, b->fields, b->n_fields, L, w->cfg.truncate,
                                     w->cfg.preserve_end_of_sequence, out, &rows);
    if (s) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "%s: %s", who, msg);
    }
    int64_t T = 0;
    for (int i = 0; i < b->n_fields && !T; i++)
        if (cm_tensor_ndim(b->fields[i]) > 1) T = cm_tensor_dim(b->fields[i], 1);
    if (L < T) {
        if ((s = cmi_da_set_recut_batch(st, b, out, rows, L, w->cfg.truncate, &w->owned, &w->rows))) return s;
    } else {
        free_all(out, b->n_fields); /* full length: the batch as it is */
    }
    w->last_len = L, w->last_bs = rows;
    const cm_metric_value v[] = {{"seq_length_warmup/curr_seq_len", (double)L}, {"seq_length_warmup/curr_bs", (double)rows}};
    return cm_logger_log_metrics(lg, v, 2);
}

static size_t sw_save(void *self, char *buf, size_t cap) {
    const slw *w = self;
    return (size_t)snprintf(buf, cap, "{\"curr_seq_len\":%lld,\"curr_bs\":%lld}", (long long)w->last_len,
                            (long long)w->last_bs);
}

static cm_status sw_load(void *self, const char *json, size_t len) {
    slw *w = self;
    static const char *const keys[] = {"curr_seq_len", "curr_bs"};
    double v[2];
    cm_status s = cmi_da_load_numbers("SeqLengthWarmup", json, len, keys, v, 2);
    if (!s) w->last_len = (int64_t)v[0], w->last_bs = (int64_t)v[1];
    return s;
}

static void sw_free(void *self) {
    slw *w = self;
    if (!w) return;
    cmi_da_owned_clear(&w->owned);
    cmi_da_rows_free(&w->rows);
    cm_free(w);
}

static const cm_algorithm_i slw_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "SeqLengthWarmup",
    .match = sw_match,
    .apply = sw_apply,
    .save = sw_save,
    .load = sw_load,
    .free = sw_free,
};

cm_seq_length_warmup_config cm_seq_length_warmup_config_default(void) {
    return (cm_seq_length_warmup_config){0.3, 8, 1024, 8, true, false};
}

cm_status cm_seq_length_warmup_new(const cm_seq_length_warmup_config *cfg, cm_algorithm_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_seq_length_warmup_new: out is NULL");
    const cm_seq_length_warmup_config c = cfg ? *cfg : cm_seq_length_warmup_config_default();
    const char *who = "SeqLengthWarmup";
    if (!(c.duration >= 0 && c.duration <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: duration must be between 0 and 1, got: %g", who, c.duration);
    if (c.min_seq_length < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: min_seq_length %lld must be >= 1", who, (long long)c.min_seq_length);
    if (c.max_seq_length < c.min_seq_length)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: max_seq_length=%lld must be greater than min_seq_length=%lld", who,
                            (long long)c.max_seq_length, (long long)c.min_seq_length);
    if (c.step_size < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: step_size %lld must be >= 1", who, (long long)c.step_size);
    slw *w = cm_alloc_zeroed(sizeof *w, 16);
    if (!w) return cm_set_error(CM_ERR_OOM, "%s: out of memory", who);
    w->cfg = c;
    w->last_len = c.max_seq_length;
    *out = (cm_algorithm_plugin){&slw_vt, w};
    return CM_OK;
}
