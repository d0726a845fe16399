/* The dataloader: a ring of prefetch slots filled by worker threads.
 *
 * The consumer (the trainer's thread, in cm_dataloader_next) schedules work: it walks a cursor
 * (epoch, position) ahead of its own state and gives each free slot the next item — one rank's
 * rows of one global batch, or an end-of-epoch marker. Workers claim chunks of rows from the
 * oldest slot that still has unclaimed rows, write the samples into the slot's buffers without
 * holding the lock, and mark the slot ready when its last chunk is in. Every row's content is a
 * function of (dataset, seed, epoch, index) alone and lands at a fixed place, so the result does
 * not depend on how rows were spread over threads. One mutex guards the slot bookkeeping; two
 * condition variables wake workers (new work, shutdown) and the consumer (a slot is ready, or a
 * cancelled slot has no worker left in it).
 *
 * Slot life: EMPTY -> FILLING (scheduled) -> READY (all rows in, or marker) -> held by the trainer
 * -> EMPTY at the next call. set_state and errors cancel every FILLING slot, wait until no worker
 * is inside one, and restart the cursor from the consumer's state. */
#include "data_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

typedef enum { SLOT_EMPTY, SLOT_FILLING, SLOT_READY, SLOT_CANCELLED } slot_state;

typedef struct item {
    bool end_of_epoch;
    int64_t epoch;
    int64_t position;     /* epoch position of the global batch's first sample */
    int64_t global_count; /* real samples in the global batch */
    int64_t rank_begin;   /* this rank's slice of the global batch */
    int64_t rank_count;
    int64_t rows; /* rank_count, plus padding in evaluation */
    cm_epoch_perm perm;
    const int64_t *ids; /* datasets with their own order: this rank's indices (the slot's order_ids) */
    cm_status order_err; /* the dataset's batch_order failed for this item */
} item;

typedef struct slot {
    item it;
    slot_state state;
    int64_t next_row; /* first row not yet claimed by a worker */
    int64_t done_rows;
    int busy; /* workers writing into this slot right now */
    /* the lowest failing row, if any */
    cm_status err;
    int64_t err_row, err_index;
    char err_msg[768];
    void *buf[CM_DATASET_MAX_FIELDS]; /* (cap_rows, per-sample bytes) */
    int64_t *indices;                 /* (cap_rows,) */
    uint8_t *valid;                   /* (cap_rows,) */
    int64_t *row_tokens;              /* (cap_rows,) */
    int64_t *order_ids;               /* (cap_rows,) for datasets with their own order */
    cm_tensor *views[CM_DATASET_MAX_FIELDS]; /* (view_rows, ...) over buf */
    int64_t view_rows;
    int64_t view_len; /* with trim_padding: the sequence fields' length in the views */
    cm_batch batch;
} slot;

struct cm_dataloader {
    const cm_dataset *ds;
    cm_dataloader_config cfg;
    cm_sampler sampler;
    int64_t len;
    int64_t cap_rows; /* ceil(B / world_size): the most rows a rank ever gets */
    int64_t chunk;    /* rows per worker claim */
    int n_fields;
    size_t fbytes[CM_DATASET_MAX_FIELDS];
    int n_slots;
    slot *slots;
    uint64_t head_seq;          /* the next item the consumer takes (slot head_seq % n_slots) */
    uint64_t sched_seq;         /* the next item to schedule */
    int held;                   /* the slot of the batch handed out, or -1 */
    cm_dataloader_state state;  /* where the consumer stands */
    cm_dataloader_state cursor; /* where scheduling stands (>= state) */
    bool ordered;               /* the dataset decides the order (cm_dataset_has_order) */
    /* trim_padding: the mask field, the dataset's length L, and which fields are (L, ...) */
    int mask_field;
    int64_t seq_len;
    bool is_seq[CM_DATASET_MAX_FIELDS];
    pthread_mutex_t mu;
    pthread_cond_t work_cv, ready_cv;
    bool stop;
    int n_threads;
    pthread_t *threads;
};

cm_dataloader_config cm_dataloader_config_default(void) {
    cm_dataloader_config c = {
        .batch_size = 32,
        .shuffle = true,
        .seed = 0,
        .drop_last = true,
        .num_workers = 0,
        .prefetch_depth = 2,
        .rank = 0,
        .world_size = 1,
        .mode = CM_DATA_TRAIN,
        .trim_padding = false,
        .pad_to_multiple_of = 8,
    };
    return c;
}

cm_dataloader_config cm_dataloader_config_eval(void) {
    cm_dataloader_config c = cm_dataloader_config_default();
    c.mode = CM_DATA_EVAL;
    c.shuffle = false;
    c.drop_last = false;
    return c;
}

cm_tensor *cm_batch_field(const cm_batch *b, const char *name) {
    for (int f = 0; f < b->n_fields; f++)
        if (b->names[f] && strcmp(b->names[f], name) == 0) return b->fields[f];
    return NULL;
}

static bool drops_last(const cm_dataloader *dl) { return dl->cfg.mode == CM_DATA_TRAIN && dl->cfg.drop_last; }

/* The item at the cursor from a dataset with its own order; advances the cursor past it. An error
 * is kept in the item (reported when the consumer reaches it). */
static void next_ordered_item(cm_dataloader *dl, item *it, int64_t *ids, char *msg, size_t msg_cap) {
    int64_t n_rank = 0, n_global = 0;
    it->ids = ids;
    cm_status st = cm_dataset_batch_order(dl->ds, it->epoch, it->position, dl->cfg.batch_size, dl->cfg.rank,
                                          dl->cfg.world_size, ids, &n_rank, &n_global);
    if (st) {
        it->order_err = st;
        snprintf(msg, msg_cap, "%s", cm_last_error());
        return;
    }
    if (n_global <= 0 || (drops_last(dl) && n_global < dl->cfg.batch_size)) {
        it->end_of_epoch = true;
        dl->cursor.epoch++;
        dl->cursor.position = 0;
        return;
    }
    it->global_count = n_global;
    it->rank_begin = -1;
    it->rank_count = n_rank;
    it->rows = n_rank;
    dl->cursor.position += n_global;
}

/* The item at the cursor; advances the cursor past it. */
static void next_item(cm_dataloader *dl, item *it, int64_t *ids, char *msg, size_t msg_cap) {
    const int64_t B = dl->cfg.batch_size, remaining = dl->len - dl->cursor.position;
    memset(it, 0, sizeof *it);
    it->epoch = dl->cursor.epoch;
    it->position = dl->cursor.position;
    if (dl->ordered) {
        next_ordered_item(dl, it, ids, msg, msg_cap);
        return;
    }
    if (remaining <= 0 || (drops_last(dl) && remaining < B)) {
        it->end_of_epoch = true;
        dl->cursor.epoch++;
        dl->cursor.position = 0;
        return;
    }
    it->global_count = remaining < B ? remaining : B;
    cm_data_rank_slice(it->global_count, dl->cfg.rank, dl->cfg.world_size, &it->rank_begin, &it->rank_count);
    const int64_t N = dl->cfg.world_size;
    it->rows = dl->cfg.mode == CM_DATA_EVAL ? (it->global_count + N - 1) / N : it->rank_count;
    cm_epoch_perm_init(&it->perm, &dl->sampler, it->epoch);
    dl->cursor.position += it->global_count;
}

/* Writes rows [r0, r1) of a slot. Called without the lock: each row's memory belongs to the one
 * thread that claimed it. Stops at the first failing row and reports it. */
static void fill_rows(const cm_dataloader *dl, slot *sl, int64_t r0, int64_t r1, cm_status *err, int64_t *err_row,
                      int64_t *err_index, char *msg, size_t msg_cap) {
    const item *it = &sl->it;
    const cm_sample_ctx ctx = {dl->cfg.seed, it->epoch, dl->cfg.mode == CM_DATA_TRAIN};
    *err = CM_OK;
    for (int64_t j = r0; j < r1; j++) {
        const bool real = j < it->rank_count;
        /* padding rows copy the global batch's first sample: it always exists */
        const int64_t pos = it->position + (real ? it->rank_begin + j : 0);
        const int64_t idx = it->ids ? it->ids[j] : cm_epoch_perm_index(&it->perm, pos);
        void *out[CM_DATASET_MAX_FIELDS];
        for (int f = 0; f < dl->n_fields; f++) out[f] = (char *)sl->buf[f] + (size_t)j * dl->fbytes[f];
        cm_status st = cm_dataset_get(dl->ds, idx, &ctx, out);
        if (st != CM_OK) {
            *err = st;
            *err_row = j;
            *err_index = idx;
            snprintf(msg, msg_cap, "%s", cm_last_error());
            return;
        }
        sl->indices[j] = real ? idx : -1;
        sl->valid[j] = real ? 1 : 0;
        sl->row_tokens[j] = real ? cm_dataset_n_tokens(dl->ds, idx) : 0;
    }
}

static void *worker_main(void *arg) {
    cm_dataloader *dl = arg;
    char msg[768];
    pthread_mutex_lock(&dl->mu);
    while (!dl->stop) {
        slot *sl = NULL;
        for (uint64_t q = dl->head_seq; q < dl->sched_seq; q++) {
            slot *c = &dl->slots[q % (uint64_t)dl->n_slots];
            if (c->state == SLOT_FILLING && c->next_row < c->it.rows) {
                sl = c;
                break;
            }
        }
        if (!sl) {
            pthread_cond_wait(&dl->work_cv, &dl->mu);
            continue;
        }
        const int64_t r0 = sl->next_row;
        const int64_t r1 = r0 + dl->chunk < sl->it.rows ? r0 + dl->chunk : sl->it.rows;
        sl->next_row = r1;
        sl->busy++;
        pthread_mutex_unlock(&dl->mu);

        cm_status err;
        int64_t err_row = 0, err_index = 0;
        fill_rows(dl, sl, r0, r1, &err, &err_row, &err_index, msg, sizeof msg);

        pthread_mutex_lock(&dl->mu);
        sl->busy--;
        sl->done_rows += r1 - r0;
        if (err != CM_OK && (sl->err == CM_OK || err_row < sl->err_row)) {
            sl->err = err;
            sl->err_row = err_row;
            sl->err_index = err_index;
            memcpy(sl->err_msg, msg, sizeof msg);
        }
        if (sl->state == SLOT_FILLING && sl->done_rows == sl->it.rows) {
            sl->state = SLOT_READY;
            pthread_cond_broadcast(&dl->ready_cv);
        } else if (sl->state == SLOT_CANCELLED && sl->busy == 0) {
            pthread_cond_broadcast(&dl->ready_cv);
        }
    }
    pthread_mutex_unlock(&dl->mu);
    return NULL;
}

static void slot_schedule(cm_dataloader *dl, slot *sl) {
    sl->err_msg[0] = '\0';
    next_item(dl, &sl->it, sl->order_ids, sl->err_msg, sizeof sl->err_msg);
    sl->next_row = 0;
    sl->done_rows = 0;
    sl->busy = 0;
    sl->err = CM_OK;
    sl->state = (sl->it.end_of_epoch || sl->it.rows == 0 || sl->it.order_err) ? SLOT_READY : SLOT_FILLING;
}

/* Fills every free slot with the next items. Lock held (or no workers). */
static void schedule_locked(cm_dataloader *dl) {
    bool added = false;
    for (;;) {
        uint64_t in_use = dl->sched_seq - dl->head_seq + (dl->held >= 0 ? 1u : 0u);
        if (in_use >= (uint64_t)dl->n_slots) break;
        slot *sl = &dl->slots[dl->sched_seq % (uint64_t)dl->n_slots];
        slot_schedule(dl, sl);
        dl->sched_seq++;
        added = true;
    }
    if (added && dl->n_threads > 0) pthread_cond_broadcast(&dl->work_cv);
}

/* Discards every scheduled item, waits until no worker writes into a slot, and restarts the
 * cursor from the consumer's state. Lock held (or no workers). */
static void reset_locked(cm_dataloader *dl) {
    for (int s = 0; s < dl->n_slots; s++) {
        slot *sl = &dl->slots[s];
        if (sl->state == SLOT_FILLING) {
            sl->state = SLOT_CANCELLED;
            sl->next_row = sl->it.rows;
        }
    }
    for (int s = 0; s < dl->n_slots; s++)
        while (dl->slots[s].busy > 0) pthread_cond_wait(&dl->ready_cv, &dl->mu);
    for (int s = 0; s < dl->n_slots; s++) dl->slots[s].state = SLOT_EMPTY;
    dl->held = -1;
    dl->head_seq = dl->sched_seq = 0;
    dl->cursor = dl->state;
}

static void lock(cm_dataloader *dl) {
    if (dl->n_threads > 0) pthread_mutex_lock(&dl->mu);
}
static void unlock(cm_dataloader *dl) {
    if (dl->n_threads > 0) pthread_mutex_unlock(&dl->mu);
}

static void free_views(slot *sl, int n_fields) {
    for (int f = 0; f < n_fields; f++) {
        cm_tensor_free(sl->views[f]);
        sl->views[f] = NULL;
    }
    sl->view_rows = -1;
}

/* trim_padding: the length the slot's rows are cut to — one past the last nonzero mask position
 * of any row, rounded up to pad_to_multiple_of, at most L — and the sequence fields' rows moved
 * together in place (row r's first L' positions to r·L' · bytes per position; a row never moves
 * past data not yet moved, since L' <= L). */
static int64_t trim_rows(cm_dataloader *dl, slot *sl, int64_t rows) {
    const int64_t L = dl->seq_len, m = dl->cfg.pad_to_multiple_of;
    const size_t mpos = dl->fbytes[dl->mask_field] / (size_t)L; /* mask bytes per position */
    int64_t longest = 0;
    for (int64_t r = 0; r < rows; r++) {
        const unsigned char *row = (const unsigned char *)sl->buf[dl->mask_field] + (size_t)r * dl->fbytes[dl->mask_field];
        for (int64_t t = L - 1; t >= longest; t--) {
            bool set = false;
            for (size_t k = 0; k < mpos && !set; k++) set = row[(size_t)t * mpos + k] != 0;
            if (set) {
                longest = t + 1;
                break;
            }
        }
    }
    int64_t cut = (longest + m - 1) / m * m;
    if (cut < 1) cut = m; /* every row empty: one multiple, as a collator padding nothing to m */
    if (cut > L) cut = L;
    if (cut == L) return L;
    for (int f = 0; f < dl->n_fields; f++) {
        if (!dl->is_seq[f]) continue;
        const size_t pos = dl->fbytes[f] / (size_t)L;
        char *buf = sl->buf[f];
        for (int64_t r = 1; r < rows; r++)
            memmove(buf + (size_t)(r * cut) * pos, buf + (size_t)(r * L) * pos, (size_t)cut * pos);
    }
    return cut;
}

/* Turns a ready slot into the batch the trainer sees. Without the lock: no worker touches a READY
 * slot. */
static cm_status finalize(cm_dataloader *dl, slot *sl) {
    const item *it = &sl->it;
    cm_batch *b = &sl->batch;
    const int64_t len = dl->cfg.trim_padding ? trim_rows(dl, sl, it->rows) : 0;
    if (sl->view_rows != it->rows || sl->view_len != len) {
        free_views(sl, dl->n_fields);
        for (int f = 0; f < dl->n_fields; f++) {
            const cm_field_desc *d = cm_dataset_field(dl->ds, f);
            int64_t shape[CM_MAX_DIMS + 1];
            shape[0] = it->rows;
            for (int k = 0; k < d->ndim; k++) shape[k + 1] = d->shape[k];
            if (dl->is_seq[f]) shape[1] = len; /* set only with trim_padding */
            if (d->ndim + 1 > CM_MAX_DIMS) {
                free_views(sl, dl->n_fields);
                return cm_set_error(CM_ERR_SHAPE,
                                    "dataloader: field '%s' has %d dims; a batch of it needs %d (at most %d)",
                                    d->name, d->ndim, d->ndim + 1, CM_MAX_DIMS);
            }
            if (cm_tensor_from_data(d->dtype, d->ndim + 1, shape, sl->buf[f], &sl->views[f]) != CM_OK) {
                cm_status st = cm_last_status();
                free_views(sl, dl->n_fields);
                return st;
            }
        }
        sl->view_rows = it->rows;
        sl->view_len = len;
    }
    memset(b, 0, sizeof *b);
    b->n_fields = dl->n_fields;
    for (int f = 0; f < dl->n_fields; f++) {
        b->names[f] = cm_dataset_field(dl->ds, f)->name;
        b->fields[f] = sl->views[f];
    }
    b->n_rows = it->rows;
    b->n_samples = it->rank_count;
    b->n_padded = it->rows - it->rank_count;
    b->indices = sl->indices;
    b->valid = sl->valid;
    b->row_tokens = sl->row_tokens;
    for (int64_t j = 0; j < it->rank_count; j++) b->n_tokens += sl->row_tokens[j];
    b->global_n_samples = it->global_count;
    if (it->rank_count == it->global_count) {
        b->global_n_tokens = b->n_tokens;
    } else if (dl->ordered) {
        int64_t *other = cm_alloc(sizeof(int64_t) * (size_t)dl->cap_rows, 64);
        if (!other) return CM_ERR_OOM;
        for (int r = 0; r < dl->cfg.world_size; r++) {
            int64_t nr = 0, ng = 0;
            cm_status st = r == dl->cfg.rank ? CM_OK
                                             : cm_dataset_batch_order(dl->ds, it->epoch, it->position, dl->cfg.batch_size,
                                                                      r, dl->cfg.world_size, other, &nr, &ng);
            if (st) {
                cm_free(other);
                return st;
            }
            if (r == dl->cfg.rank) b->global_n_tokens += b->n_tokens;
            else
                for (int64_t j = 0; j < nr; j++) b->global_n_tokens += cm_dataset_n_tokens(dl->ds, other[j]);
        }
        cm_free(other);
    } else {
        for (int64_t p = 0; p < it->global_count; p++)
            b->global_n_tokens += cm_dataset_n_tokens(dl->ds, cm_epoch_perm_index(&it->perm, it->position + p));
    }
    b->epoch = it->epoch;
    b->step = it->position / dl->cfg.batch_size;
    b->position = it->position;
    b->rank_offset = it->rank_begin >= 0 ? it->rank_begin : (int64_t)dl->cfg.rank * dl->cap_rows;
    b->microbatch = -1;
    return CM_OK;
}

cm_status cm_dataloader_next(cm_dataloader *dl, cm_batch **out) {
    *out = NULL;
    lock(dl);
    if (dl->held >= 0) {
        dl->slots[dl->held].state = SLOT_EMPTY;
        dl->held = -1;
    }
    schedule_locked(dl);
    const int s = (int)(dl->head_seq % (uint64_t)dl->n_slots);
    slot *sl = &dl->slots[s];
    if (dl->n_threads == 0 && sl->state == SLOT_FILLING) {
        fill_rows(dl, sl, 0, sl->it.rows, &sl->err, &sl->err_row, &sl->err_index, sl->err_msg, sizeof sl->err_msg);
        sl->state = SLOT_READY;
    }
    while (sl->state != SLOT_READY) pthread_cond_wait(&dl->ready_cv, &dl->mu);
    unlock(dl);

    if (sl->it.end_of_epoch) {
        lock(dl);
        sl->state = SLOT_EMPTY;
        dl->head_seq++;
        dl->state.epoch = sl->it.epoch + 1;
        dl->state.position = 0;
        unlock(dl);
        return CM_OK;
    }
    cm_status st = CM_OK;
    if (sl->it.order_err) {
        st = cm_set_error(sl->it.order_err, "dataloader: the order of epoch %lld at position %lld (rank %d) of dataset "
                                            "'%s' failed: %s",
                          (long long)sl->it.epoch, (long long)sl->it.position, dl->cfg.rank, cm_dataset_type_name(dl->ds),
                          sl->err_msg);
    } else if (sl->err != CM_OK) {
        const int64_t pos = sl->it.position + (sl->err_row < sl->it.rank_count && sl->it.rank_begin >= 0
                                                    ? sl->it.rank_begin + sl->err_row : 0);
        st = cm_set_error(sl->err,
                          "dataloader: sample %lld (epoch %lld, position %lld, row %lld of rank %d) of dataset '%s' "
                          "failed: %s",
                          (long long)sl->err_index, (long long)sl->it.epoch, (long long)pos, (long long)sl->err_row,
                          dl->cfg.rank, cm_dataset_type_name(dl->ds), sl->err_msg);
    } else {
        st = finalize(dl, sl);
    }
    lock(dl);
    if (st != CM_OK) {
        reset_locked(dl); /* the state stays at the failing batch; the next call retries it */
    } else {
        dl->head_seq++;
        dl->held = s;
        dl->state.epoch = sl->it.epoch;
        dl->state.position = sl->it.position + sl->it.global_count;
    }
    unlock(dl);
    if (st == CM_OK) *out = &sl->batch;
    return st;
}

cm_dataloader_state cm_dataloader_get_state(const cm_dataloader *dl) { return dl->state; }

cm_status cm_dataloader_set_state(cm_dataloader *dl, cm_dataloader_state st) {
    if (st.epoch < 0 || st.position < 0 || st.position > dl->len)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "dataloader: state (epoch %lld, position %lld) is out of range (epoch >= 0, 0 <= "
                            "position <= %lld, the dataset's length)",
                            (long long)st.epoch, (long long)st.position, (long long)dl->len);
    lock(dl);
    dl->state = st;
    reset_locked(dl);
    schedule_locked(dl); /* the workers start on the new position at once */
    unlock(dl);
    return CM_OK;
}

int64_t cm_dataloader_steps_per_epoch(const cm_dataloader *dl) {
    const int64_t B = dl->cfg.batch_size;
    return drops_last(dl) ? dl->len / B : (dl->len + B - 1) / B;
}

int64_t cm_dataloader_samples_per_epoch(const cm_dataloader *dl) {
    return drops_last(dl) ? dl->len / dl->cfg.batch_size * dl->cfg.batch_size : dl->len;
}

const cm_dataloader_config *cm_dataloader_get_config(const cm_dataloader *dl) { return &dl->cfg; }
const cm_dataset *cm_dataloader_dataset(const cm_dataloader *dl) { return dl->ds; }

static void free_slots(cm_dataloader *dl) {
    if (!dl->slots) return;
    for (int s = 0; s < dl->n_slots; s++) {
        slot *sl = &dl->slots[s];
        free_views(sl, dl->n_fields);
        for (int f = 0; f < dl->n_fields; f++) cm_free(sl->buf[f]);
        cm_free(sl->indices);
        cm_free(sl->valid);
        cm_free(sl->row_tokens);
        cm_free(sl->order_ids);
    }
    cm_free(dl->slots);
    dl->slots = NULL;
}

void cm_dataloader_free(cm_dataloader *dl) {
    if (!dl) return;
    if (dl->n_threads > 0) {
        pthread_mutex_lock(&dl->mu);
        dl->stop = true;
        for (int s = 0; s < dl->n_slots; s++) dl->slots[s].next_row = dl->slots[s].it.rows; /* no new claims */
        pthread_cond_broadcast(&dl->work_cv);
        pthread_mutex_unlock(&dl->mu);
        for (int t = 0; t < dl->n_threads; t++) pthread_join(dl->threads[t], NULL);
    }
    cm_free(dl->threads);
    free_slots(dl);
    pthread_cond_destroy(&dl->work_cv);
    pthread_cond_destroy(&dl->ready_cv);
    pthread_mutex_destroy(&dl->mu);
    cm_free(dl);
}

cm_status cm_dataloader_new(const cm_dataset *ds, const cm_dataloader_config *cfg_in, cm_dataloader **out) {
    *out = NULL;
    const cm_dataloader_config cfg = cfg_in ? *cfg_in : cm_dataloader_config_default();
    if (!ds) return cm_set_error(CM_ERR_INVALID_ARG, "dataloader: dataset is NULL");
    if (cfg.batch_size < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "dataloader: batch_size %lld (must be >= 1: the global batch)",
                            (long long)cfg.batch_size);
    if (cfg.num_workers < 0 || cfg.num_workers > 1024)
        return cm_set_error(CM_ERR_INVALID_ARG, "dataloader: num_workers %d (must be 0..1024; 0 = calling thread)",
                            cfg.num_workers);
    if (cfg.prefetch_depth < 1 || cfg.prefetch_depth > 1024)
        return cm_set_error(CM_ERR_INVALID_ARG, "dataloader: prefetch_depth %d (must be 1..1024)", cfg.prefetch_depth);
    if (cfg.world_size < 1 || cfg.rank < 0 || cfg.rank >= cfg.world_size)
        return cm_set_error(CM_ERR_INVALID_ARG, "dataloader: rank %d of world_size %d (need 0 <= rank < world_size)",
                            cfg.rank, cfg.world_size);
    if (cfg.mode != CM_DATA_TRAIN && cfg.mode != CM_DATA_EVAL)
        return cm_set_error(CM_ERR_INVALID_ARG, "dataloader: mode %d (use CM_DATA_TRAIN or CM_DATA_EVAL)",
                            (int)cfg.mode);
    const bool ordered = cm_dataset_has_order(ds);
    if (ordered && cfg.batch_size % cfg.world_size)
        return cm_set_error(CM_ERR_INVALID_ARG, "dataloader: dataset '%s' orders its samples per device: the global "
                                                "batch %lld must be a multiple of world_size %d",
                            cm_dataset_type_name(ds), (long long)cfg.batch_size, cfg.world_size);
    /* a dataset with its own order says how many positions an epoch has (repeats included) */
    const int64_t len = ordered ? cm_dataset_epoch_size(ds, cfg.batch_size, cfg.world_size) : cm_dataset_len(ds);
    if (len < 0) return cm_last_status() ? cm_last_status() : CM_ERR_INVALID_ARG;
    if (len < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "dataloader: dataset '%s' is empty", cm_dataset_type_name(ds));
    if (cfg.mode == CM_DATA_TRAIN && cfg.drop_last && len < cfg.batch_size)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "dataloader: dataset '%s' has %lld samples, fewer than one global batch of %lld; with "
                            "drop_last no batch would ever be produced (lower batch_size or set drop_last = false)",
                            cm_dataset_type_name(ds), (long long)len, (long long)cfg.batch_size);
    for (int f = 0; f < cm_dataset_n_fields(ds); f++)
        if (cm_dataset_field(ds, f)->ndim + 1 > CM_MAX_DIMS)
            return cm_set_error(CM_ERR_SHAPE, "dataloader: field '%s' has %d dims; a batch of it needs %d (at most %d)",
                                cm_dataset_field(ds, f)->name, cm_dataset_field(ds, f)->ndim,
                                cm_dataset_field(ds, f)->ndim + 1, CM_MAX_DIMS);

    int mask = -1;
    if (cfg.trim_padding) {
        if (cfg.pad_to_multiple_of < 1)
            return cm_set_error(CM_ERR_INVALID_ARG, "dataloader: pad_to_multiple_of %lld (must be >= 1; 1 cuts to the "
                                                    "longest row exactly)", (long long)cfg.pad_to_multiple_of);
        mask = cm_dataset_find_field(ds, "attention_mask");
        if (mask < 0 || cm_dataset_field(ds, mask)->ndim < 1 || cm_dataset_field(ds, mask)->shape[0] < 1)
            return cm_set_error(CM_ERR_NOT_FOUND, "dataloader: trim_padding cuts batches by their 'attention_mask' "
                                                  "field (per-sample shape (L, ...)); dataset '%s' has %s — turn "
                                                  "trim_padding off for it",
                                cm_dataset_type_name(ds), mask < 0 ? "none" : "one without a sequence dimension");
    }

    cm_dataloader *dl = cm_alloc_zeroed(sizeof *dl, 64);
    if (!dl) return CM_ERR_OOM;
    dl->ds = ds;
    dl->mask_field = mask;
    if (mask >= 0) {
        dl->seq_len = cm_dataset_field(ds, mask)->shape[0];
        for (int f = 0; f < cm_dataset_n_fields(ds); f++) {
            const cm_field_desc *d = cm_dataset_field(ds, f);
            dl->is_seq[f] = d->ndim >= 1 && d->shape[0] == dl->seq_len;
        }
    }
    dl->cfg = cfg;
    dl->len = len;
    dl->ordered = ordered;
    dl->held = -1;
    cm_sampler_init(&dl->sampler, len, cfg.shuffle, cfg.seed);
    dl->cap_rows = (cfg.batch_size + cfg.world_size - 1) / cfg.world_size;
    dl->chunk = cfg.num_workers > 0 ? dl->cap_rows / (4 * cfg.num_workers) : dl->cap_rows;
    if (dl->chunk < 1) dl->chunk = 1;
    dl->n_fields = cm_dataset_n_fields(ds);
    for (int f = 0; f < dl->n_fields; f++) dl->fbytes[f] = cm_dataset_field_bytes(ds, f);
    pthread_mutex_init(&dl->mu, NULL);
    pthread_cond_init(&dl->work_cv, NULL);
    pthread_cond_init(&dl->ready_cv, NULL);

    dl->n_slots = cfg.num_workers > 0 ? cfg.prefetch_depth + 1 : 1;
    dl->slots = cm_alloc_zeroed(sizeof(slot) * (size_t)dl->n_slots, 64);
    if (!dl->slots) goto oom;
    for (int s = 0; s < dl->n_slots; s++) {
        slot *sl = &dl->slots[s];
        sl->view_rows = -1;
        const size_t rows = (size_t)dl->cap_rows;
        for (int f = 0; f < dl->n_fields; f++)
            if (!(sl->buf[f] = cm_alloc(rows * dl->fbytes[f], 64))) goto oom;
        sl->indices = cm_alloc(rows * sizeof(int64_t), 64);
        sl->valid = cm_alloc(rows, 64);
        sl->row_tokens = cm_alloc(rows * sizeof(int64_t), 64);
        sl->order_ids = cm_alloc(rows * sizeof(int64_t), 64);
        if (!sl->indices || !sl->valid || !sl->row_tokens || !sl->order_ids) goto oom;
    }
    if (cfg.num_workers > 0) {
        dl->threads = cm_alloc(sizeof(pthread_t) * (size_t)cfg.num_workers, 16);
        if (!dl->threads) goto oom;
        pthread_mutex_lock(&dl->mu);
        schedule_locked(dl); /* start filling before the first call */
        pthread_mutex_unlock(&dl->mu);
        for (int t = 0; t < cfg.num_workers; t++) {
            int rc = pthread_create(&dl->threads[t], NULL, worker_main, dl);
            if (rc != 0) {
                cm_dataloader_free(dl);
                return cm_set_error(CM_ERR_INTERNAL, "dataloader: starting worker thread %d of %d failed: %s", t,
                                    cfg.num_workers, strerror(rc));
            }
            dl->n_threads = t + 1;
        }
    }
    *out = dl;
    return CM_OK;
oom:
    cm_dataloader_free(dl);
    return cm_set_error(CM_ERR_OOM, "dataloader: out of memory for %d prefetch slots of %lld rows",
                        cfg.num_workers > 0 ? cfg.prefetch_depth + 1 : 1,
                        (long long)((cfg.batch_size + cfg.world_size - 1) / cfg.world_size));
}
