/* The pre-flight memory plan of automatic microbatching (trainer.h, cm_memory_plan): a dry run of
 * 1 and 2 rows of the first batch measures the tape arena's peak; the slope is the activation
 * bytes a row adds, the rest the fixed workspace; the largest microbatch that keeps the line under
 * the budget less the margin is chosen, and the out-of-memory search stays the fallback. */
#include "tensor/tensor_impl.h"
#include "trainer/trainer_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define MIB (1024.0 * 1024.0)

/* Parameters and gradients this rank holds: the model's flat buffers, or its pieces of them under
 * a sharded strategy (the full gradient buffer stays under SHARD_GRAD_OP: backward accumulates
 * into it before the reduce-scatter). */
static void model_bytes(const cm_trainer *tr, size_t *params, size_t *grads) {
    cm_module *root = cm_model_module(tr->st.model);
    size_t full = 0, shard = 0;
    for (int u = 0; u < cm_module_n_units(root); u++) full += sizeof(float) * (size_t)cm_module_unit(root, u)->numel;
    for (int i = 0; i < tr->dist.n_shard_spans; i++)
        shard += sizeof(float) * (size_t)(tr->dist.shard_spans[i].end - tr->dist.shard_spans[i].begin);
    const bool sharded = tr->dist.n_shard_spans > 0;
    *params = tr->dist.params_sharded ? shard : full;
    *grads = sharded ? shard + (tr->dist.params_sharded ? 0 : full) : full;
    if (tr->device != CM_DEVICE_CPU && sharded && cmi_ptr_device(tr->dist.shard_spans[0].params) == CM_DEVICE_CPU) {
        /* cpu_offload: the shards are in host memory; the device holds the units resident and in
         * flight (2 + 2 at the defaults) and the gradients of the units backward is in (2) */
        size_t unit = 0;
        for (int u = 0; u < cm_module_n_units(root); u++) {
            const size_t b = sizeof(float) * (size_t)cm_module_unit(root, u)->numel;
            if (b > unit) unit = b;
        }
        *params = 4 * unit;
        *grads = 2 * unit;
    }
}

/* The optimizer state, but on a GPU run not the moments kept in host memory (cpu_offload). */
static size_t optimizer_bytes(const cm_optim *o, cm_device dev) {
    size_t n = 0;
    for (int i = 0; o && i < cm_optim_n_state(o); i++) {
        cm_optim_state_entry e;
        if (cm_optim_state_get(o, i, &e) == CM_OK && !(dev != CM_DEVICE_CPU && e.dtype == CM_DTYPE_F32 && e.device == CM_DEVICE_CPU))
            n += (size_t)e.numel * (e.dtype == CM_DTYPE_I64 ? 8 : 4);
    }
    return n;
}

static size_t tape_peak(cm_trainer *tr) {
    if (tr->device == CM_DEVICE_CPU) return cm_tape_peak_bytes(tr->tape);
    cm_arena *a = cm_tape_device_arena(tr->tape, tr->device);
    return a ? cm_arena_peak(a) : 0;
}

static void tape_reset_peak(cm_trainer *tr) {
    cm_tape_reset_peak(tr->tape);
    cm_arena *a = tr->device == CM_DEVICE_CPU ? NULL : cm_tape_device_arena(tr->tape, tr->device);
    if (a) cm_arena_reset_peak(a);
}

/* One dry microbatch of the first `rows` rows of b on new arena chunks: its arena peak. An
 * out-of-memory error (over the lifted budget) is CM_OK with *peak past twice the budget. */
static cm_status probe(cm_trainer *tr, cm_batch *b, int64_t rows, double global_w, size_t *peak) {
    cm_batch *mbs;
    int64_t n_mb;
    cm_status s = cm_data_spec_split(tr->spec, b, rows, &mbs, &n_mb);
    if (s) return s;
    cm_tape_trim(tr->tape); /* the layout a run of this size alone would grow */
    tape_reset_peak(tr);
    bool oom = false;
    double loss = 0;
    s = cmi_run_one(tr, &mbs[0], 0, b->rank_offset, global_w, &oom, &loss);
    *peak = tape_peak(tr);
    const size_t lifted = cm_tape_budget(tr->tape, tr->device);
    if (s && oom && lifted) { /* over the lifted budget (without one, the machine's memory: an error) */
        *peak = (lifted > *peak ? lifted : *peak) + 1;
        s = CM_OK;
    }
    cm_tape_reset(tr->tape);
    cm_tape_set_rows(tr->tape, 0, 0, 0);
    return s;
}

/* The model's flat gradients into buf, or back from it (host memory). */
static void copy_unit_grads(cm_module *root, float *buf, bool back) {
    if (!buf) return;
    int64_t off = 0;
    for (int u = 0; u < cm_module_n_units(root); u++) {
        const cm_unit_info *ui = cm_module_unit(root, u);
        const size_t nb = sizeof(float) * (size_t)ui->numel;
        if (back) memcpy(ui->grads, buf + off, nb);
        else memcpy(buf + off, ui->grads, nb);
        off += ui->numel;
    }
}

/* The measured points of a plan: (rows, arena peak), by rows. */
typedef struct plan_pts {
    int64_t m[12];
    size_t peak[12];
    int n;
} plan_pts;

static void pts_add(plan_pts *q, int64_t m, size_t peak) {
    if (q->n == 12) return;
    int i = q->n++;
    while (i > 0 && q->m[i - 1] > m) q->m[i] = q->m[i - 1], q->peak[i] = q->peak[i - 1], i--;
    q->m[i] = m, q->peak[i] = peak;
}

/* The peak at m rows on the polyline through the points (the last segment extended past them):
 * the segment's slope and the arena bytes at 0 rows are returned too. */
static double pts_at(const plan_pts *q, int64_t m, double *slope, double *at0) {
    int j = 1;
    while (j < q->n - 1 && q->m[j] < m) j++;
    const double m0 = (double)q->m[j - 1], p0 = (double)q->peak[j - 1], m1 = (double)q->m[j], p1 = (double)q->peak[j];
    const double k = p1 > p0 ? (p1 - p0) / (m1 - m0) : 0.0;
    if (slope) *slope = k;
    if (at0) *at0 = p0 - k * m0;
    return p0 + k * ((double)m - m0);
}

/* Probes of growing sizes until the largest size that fits `usable` is measured: the first line
 * (through 1 and 2 rows) names a candidate, which is measured (with the budget lifted to twice
 * itself, so a candidate somewhat over it is measured too), and the polyline through every point
 * names the next, between the largest size that fit and the smallest that did not (at least one
 * row over the largest that fit, so the answer is always a size that fit next to one that did not,
 * or the batch). Gradients of
 * 64 KiB or more come from the tape's heap pool instead of the arena, so the arena grows faster a
 * row at larger sizes than from 1 to 2 rows: the measured candidate corrects the line. */
static cm_status measure(cm_trainer *tr, cm_batch *b, double global_w, cm_memory_plan *p, plan_pts *q) {
    const int64_t rows = b->n_rows;
    size_t peak;
    cm_tape_set_budget(tr->tape, tr->device, 0);
    cm_status s = probe(tr, b, 1, global_w, &p->peak_1);
    if (!s && rows >= 2) s = probe(tr, b, 2, global_w, &p->peak_2);
    if (s) return s;
    p->n_probes = rows >= 2 ? 2 : 1;
    pts_add(q, 1, p->peak_1);
    if (rows >= 2) pts_add(q, 2, p->peak_2);
    if (p->budget && p->peak_1 > p->budget) return CM_OK; /* not even one row: the caller's error */
    const size_t usable = p->usable ? p->usable : (size_t)-1;
    int64_t lo = 1, hi = rows; /* lo measured to fit (1: it fits the budget itself); above hi does not */
    if (rows >= 2 && p->peak_2 <= usable) lo = 2;
    if (rows >= 2 && p->peak_2 > usable) hi = 1;
    cm_tape_set_budget(tr->tape, tr->device, p->budget ? 2 * p->budget : 0);
    for (int it = 0; it < 6 && lo < hi; it++) {
        int64_t m = hi;
        if (p->usable) {
            double k, at0;
            pts_at(q, hi, &k, &at0);
            const double fit = k > 0 ? ((double)usable - at0) / k : (double)hi;
            m = fit >= (double)hi ? hi : (int64_t)floor(fit);
        }
        /* the line says lo is the largest: one row more is measured before believing it (a line
         * steeper at small sizes than later would stop the plan early) */
        if (m <= lo) m = lo + 1;
        if ((s = probe(tr, b, m, global_w, &peak))) return s;
        p->n_probes++;
        pts_add(q, m, peak);
        if (peak <= usable) lo = m;
        else hi = m - 1;
    }
    p->fit_size = lo;
    /* evened out over the same number of microbatches: a smaller size, measured too (the arena's
     * chunks make the peak bumpy, so an interpolation can be 10% short); kept if it fits */
    const int64_t n_split = (rows + lo - 1) / lo, even = (rows + n_split - 1) / n_split;
    p->microbatch_size = lo;
    if (even < lo) {
        bool have = false;
        for (int i = 0; i < q->n; i++)
            if (q->m[i] == even) have = true, peak = q->peak[i];
        if (!have) {
            if ((s = probe(tr, b, even, global_w, &peak))) return s;
            p->n_probes++;
            pts_add(q, even, peak);
        }
        if (peak <= usable) p->microbatch_size = even;
    }
    return CM_OK;
}

/* With trim_padding (allow_pad_trimming) a batch is only as long as its longest row, and the first
 * batch may be shorter than later ones: the plan runs on the same rows as the dataset pads them
 * (to its full length, the longest any batch can be), so the size it picks fits every batch.
 * *full is b with the sequence fields replaced by owned[] (freed by the caller), or b itself when
 * nothing was cut or b is not the loader's batch (a transform changed its fields). */
static cm_status untrimmed(cm_trainer *tr, const cm_batch *b, cm_batch *full, cm_tensor **owned) {
    *full = *b;
    for (int f = 0; f < CM_DATASET_MAX_FIELDS; f++) owned[f] = NULL;
    const cm_dataloader *dl = tr->st.train_dl;
    const cm_dataloader_config *c = dl ? cm_dataloader_get_config(dl) : NULL;
    if (!c || !c->trim_padding || b->n_rows < 1 || !b->indices || b->indices[0] < 0) return CM_OK;
    const cm_dataset *ds = cm_dataloader_dataset(dl);
    if (cm_dataset_n_fields(ds) != b->n_fields) return CM_OK;
    bool cut = false;
    for (int f = 0; f < b->n_fields; f++) {
        const cm_field_desc *d = cm_dataset_field(ds, f);
        if (!b->names[f] || strcmp(b->names[f], d->name) || cm_tensor_ndim(b->fields[f]) != d->ndim + 1) return CM_OK;
        if (d->ndim >= 1 && cm_tensor_dim(b->fields[f], 1) < d->shape[0]) cut = true;
    }
    if (!cut) return CM_OK;
    for (int f = 0; f < b->n_fields; f++) {
        const cm_field_desc *d = cm_dataset_field(ds, f);
        int64_t shape[CM_MAX_DIMS] = {b->n_rows};
        memcpy(shape + 1, d->shape, sizeof(int64_t) * (size_t)d->ndim);
        if (cm_tensor_new(d->dtype, d->ndim + 1, shape, &owned[f]) != CM_OK) return cm_last_status();
        full->fields[f] = owned[f];
    }
    const cm_sample_ctx ctx = {c->seed, b->epoch, c->mode == CM_DATA_TRAIN};
    for (int64_t r = 0; r < b->n_rows; r++) {
        void *out[CM_DATASET_MAX_FIELDS];
        for (int f = 0; f < b->n_fields; f++)
            out[f] = (char *)cm_tensor_data(owned[f]) + (size_t)r * cm_dataset_field_bytes(ds, f);
        cm_status s = cm_dataset_get(ds, b->indices[r] >= 0 ? b->indices[r] : b->indices[0], &ctx, out);
        if (s) return s;
    }
    return CM_OK;
}

/* Plans on batch b (this rank's rows), leaving no trace: batch-norm statistics, dropout counters
 * and the state's batch are put back. The gradients: fit plans just before a gradient pass, which
 * zeroes them anyway; standalone (keep_grads) they are copied back on the CPU, and zeroed on a GPU
 * or under a distributed zero_grad hook. The probes update the train metrics'
 * running sums as a real microbatch does (their memory counts), which every gradient pass resets
 * before its first microbatch; the computed values are untouched. */
static cm_status plan_batch(cm_trainer *tr, cm_batch *b, double global_w, bool keep_grads, cm_memory_plan *p) {
    cm_state *st = &tr->st;
    cm_module *root = cm_model_module(st->model);
    memset(p, 0, sizeof *p);
    p->device = tr->device;
    p->budget_key = tr->device == CM_DEVICE_CPU ? "arena_budget" : "device_arena_budget";
    p->budget = cm_tape_budget(tr->tape, tr->device);
    p->usable = p->budget ? (size_t)((double)p->budget * (1.0 - CM_MEMORY_PLAN_MARGIN)) : 0;
    p->batch_rows = b->n_rows;
    model_bytes(tr, &p->parameters, &p->gradients);
    p->optimizer_state = optimizer_bytes(st->optimizer, tr->device);
    if (b->n_rows < 1) return cm_set_error(CM_ERR_STATE, "memory plan: the batch has no rows on this rank");

    /* what the dry run may touch */
    uint64_t *counters = cm_alloc(sizeof(uint64_t) * (size_t)(tr->n_drop + 1), 16);
    char *bufs = NULL;
    const bool copy_grads = keep_grads && tr->device == CM_DEVICE_CPU && !tr->dist.zero_grad;
    float *grads = copy_grads ? cm_alloc(p->gradients + sizeof(float), 64) : NULL;
    if (!counters || (copy_grads && !grads) || cmi_snapshot_buffers(root, &bufs, false)) {
        cm_free(counters), cm_free(grads);
        return cm_set_error(CM_ERR_OOM, "memory plan: out of memory");
    }
    copy_unit_grads(root, grads, false);
    for (int k = 0; k < tr->n_drop; k++) counters[k] = tr->drop_rngs[k]->counter;
    const bool dry = tr->dry, record = tr->record_pass, training = cm_module_is_training(root);
    const int64_t mb_index = st->microbatch_index, n_mb = st->n_microbatches;
    const int64_t ns = cm_data_spec_n_samples(tr->spec, b), nt = cm_data_spec_n_tokens(tr->spec, b);

    tr->dry = tr->probing = tr->record_pass = true;
    cm_module_train(root, true);
    plan_pts q = {{0}, {0}, 0};
    cm_batch full;
    cm_tensor *owned[CM_DATASET_MAX_FIELDS];
    cm_status s = untrimmed(tr, b, &full, owned);
    if (!s) s = measure(tr, &full, global_w, p, &q);
    for (int f = 0; f < CM_DATASET_MAX_FIELDS; f++) cm_tensor_free(owned[f]);
    cm_tape_set_budget(tr->tape, tr->device, p->budget);
    char msg[1024] = "";
    if (s) snprintf(msg, sizeof msg, "%s", cm_last_error());

    /* undo: the run starts from fresh chunks, as without the plan (and reports its own peak) */
    cm_tape_trim(tr->tape);
    tape_reset_peak(tr);
    cm_tape_set_rows(tr->tape, 0, 0, 0);
    tr->dry = dry, tr->probing = false, tr->record_pass = record;
    cm_module_train(root, training);
    cm_status z = CM_OK;
    if (grads) {
        copy_unit_grads(root, grads, true);
    } else if (keep_grads) {
        z = tr->dist.zero_grad ? tr->dist.zero_grad(st, tr->dist.data) : (cm_module_zero_grad(root), CM_OK);
    }
    for (int k = 0; k < tr->n_drop; k++) tr->drop_rngs[k]->counter = counters[k];
    cmi_snapshot_buffers(root, &bufs, true);
    st->microbatch_index = mb_index, st->n_microbatches = n_mb;
    cmi_state_set_batch(st, b, ns, nt);
    st->outputs = st->loss = NULL;
    cm_free(bufs), cm_free(counters), cm_free(grads);
    if (s) return cm_set_error(s, "memory plan (a dry run of 1 and 2 rows): %s", msg);
    if (z) return z;

    if (p->budget && p->peak_1 > p->budget) {
        const double need = (double)p->peak_1 / MIB;
        return cm_set_error(CM_ERR_OOM,
                            "automatic microbatching: one row needs %.2f MiB of the tape's arena (measured by the "
                            "memory plan's dry run of one row), more than %s (%.2f MiB): raise %s to at least %.2f MiB "
                            "(%.0f%% more leaves the plan its safety margin)",
                            need, p->budget_key, (double)p->budget / MIB, p->budget_key, need,
                            100.0 * CM_MEMORY_PLAN_MARGIN);
    }
    /* the chosen size was measured (measure) */
    double k, at0;
    const double at = pts_at(&q, p->microbatch_size, &k, &at0);
    p->predicted_peak = (size_t)(at > 0 ? at : 0);
    for (int i = 0; i < q.n; i++)
        if (q.m[i] == p->microbatch_size) p->predicted_peak = q.peak[i]; /* measured */
    /* activations a row and workspace: the segment of the polyline at the chosen size */
    p->per_row = (size_t)k;
    p->workspace = at0 > 0 ? (size_t)at0 : 0;
    return CM_OK;
}

int cm_memory_plan_format(const cm_memory_plan *p, char *buf, size_t cap) {
    if (!p || !buf) return 0;
    const int64_t n_mb = p->microbatch_size > 0 ? (p->batch_rows + p->microbatch_size - 1) / p->microbatch_size : 0;
    char budget[96];
    if (p->budget)
        snprintf(budget, sizeof budget, "%.2f MiB (%s; %.2f MiB usable after the %.0f%% margin)",
                 (double)p->budget / MIB, p->budget_key, (double)p->usable / MIB, 100.0 * CM_MEMORY_PLAN_MARGIN);
    else
        snprintf(budget, sizeof budget, "unlimited (%s not set)", p->budget_key);
    /* a batch of one row has one dry run: its peak is not split into rows and workspace */
    char act[160], probes[160];
    if (p->batch_rows >= 2) {
        snprintf(act, sizeof act, "%10.2f MiB a row (arena peak: %.2f MiB at 1 row, %.2f MiB at 2)", (double)p->per_row / MIB,
                 (double)p->peak_1 / MIB, (double)p->peak_2 / MIB);
        snprintf(probes, sizeof probes, "%10d microbatches (1, 2 rows, then candidates: %lld rows the largest measured to fit)",
                 p->n_probes, (long long)p->fit_size);
    } else {
        snprintf(act, sizeof act, "%10s (one row a batch: its %.2f MiB arena peak is counted as workspace)", "-",
                 (double)p->peak_1 / MIB);
        snprintf(probes, sizeof probes, "%10d microbatch (the one row)", p->n_probes);
    }
    return snprintf(buf, cap,
                    "memory plan (%s, %lld row%s a batch on this rank):\n"
                    "  parameters          %10.2f MiB\n"
                    "  gradients           %10.2f MiB\n"
                    "  optimizer state     %10.2f MiB\n"
                    "  activations         %s\n"
                    "  workspace           %10.2f MiB\n"
                    "  arena budget        %s\n"
                    "  dry runs            %s\n"
                    "  microbatch size     %10lld row%s (%lld microbatch%s a batch)\n"
                    "  predicted peak      %10.2f MiB of arena, %.2f MiB with parameters, gradients and "
                    "optimizer state\n",
                    cm_device_name(p->device), (long long)p->batch_rows, p->batch_rows == 1 ? "" : "s",
                    (double)p->parameters / MIB,
                    (double)p->gradients / MIB, (double)p->optimizer_state / MIB, act, (double)p->workspace / MIB,
                    budget, probes, (long long)p->microbatch_size, p->microbatch_size == 1 ? "" : "s", (long long)n_mb,
                    n_mb == 1 ? "" : "es",
                    (double)p->predicted_peak / MIB,
                    (double)(p->predicted_peak + p->parameters + p->gradients + p->optimizer_state) / MIB);
}

/* The plan's figures as metrics (memory_plan/<component>_mib, memory_plan/microbatch_size). */
static cm_status log_plan(cm_trainer *tr, const cm_memory_plan *p) {
    const cm_metric_value v[] = {
        {"memory_plan/parameters_mib", (double)p->parameters / MIB},
        {"memory_plan/gradients_mib", (double)p->gradients / MIB},
        {"memory_plan/optimizer_state_mib", (double)p->optimizer_state / MIB},
        {"memory_plan/activations_per_row_mib", (double)p->per_row / MIB},
        {"memory_plan/workspace_mib", (double)p->workspace / MIB},
        {"memory_plan/budget_mib", (double)p->budget / MIB},
        {"memory_plan/predicted_peak_mib", (double)p->predicted_peak / MIB},
        {"memory_plan/microbatch_size", (double)p->microbatch_size},
    };
    return cm_logger_log_metrics(cm_engine_logger(tr->engine), v, (int)(sizeof v / sizeof *v));
}

cm_status cmi_memory_plan_first(cm_trainer *tr, cm_batch *b, double global_w) {
    cm_state *st = &tr->st;
    cm_status s = plan_batch(tr, b, global_w, false, &tr->plan);
    char msg[1536] = "";
    if (s) snprintf(msg, sizeof msg, "%s", cm_last_error());
    /* several ranks: all go on or all stop (the others would wait in the next collective) */
    if (tr->dist.world_size > 1 && tr->dist.all_reduce_sum) {
        double failed = s ? 1.0 : 0.0;
        cm_status r = tr->dist.all_reduce_sum(&failed, 1, tr->dist.data);
        if (r) return r;
        if (!s && failed > 0)
            return cm_set_error(CM_ERR_STATE, "memory plan: %g other rank(s) failed to plan (their output has the error)",
                                failed);
    }
    if (s) return cm_set_error(s, "%s", msg);
    tr->has_plan = true;
    st->microbatch_size = tr->plan.microbatch_size;
    if (st->rank == 0) {
        char text[1536];
        cm_memory_plan_format(&tr->plan, text, sizeof text);
        size_t n = strlen(text);
        if (n && text[n - 1] == '\n') text[n - 1] = '\0';
        cm_log_msg(CM_LOG_INFO, "trainer: %s", text);
    }
    return log_plan(tr, &tr->plan);
}

const cm_memory_plan *cm_trainer_memory_plan(const cm_trainer *tr) { return tr && tr->has_plan ? &tr->plan : NULL; }

cm_status cm_trainer_plan_memory(cm_trainer *tr, cm_memory_plan *out) {
    if (!tr || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_trainer_plan_memory: NULL %s", tr ? "out" : "trainer");
    if (tr->closed) return cm_set_error(CM_ERR_STATE, "cm_trainer_plan_memory: the trainer is closed");
    cm_state *st = &tr->st;
    if (!st->train_dl || !tr->spec)
        return cm_set_error(CM_ERR_STATE, "cm_trainer_plan_memory: there is no train_dataloader to plan a batch of");
    const cm_dataloader_state at = cm_dataloader_get_state(st->train_dl);
    cm_batch *lb = NULL;
    cm_status s = cm_data_spec_next(tr->spec, &lb);
    if (!s && !lb) {
        /* at the end of an epoch: the next epoch's first batch */
        if (!(s = cm_dataloader_set_state(st->train_dl, (cm_dataloader_state){at.epoch + 1, 0})))
            s = cm_data_spec_next(tr->spec, &lb);
        if (!s && !lb) s = cm_set_error(CM_ERR_STATE, "cm_trainer_plan_memory: the train loader gives no batch");
    }
    if (!s) {
        tr->work = *lb;
        cm_batch *b = &tr->work;
        double counts[2] = {(double)cm_data_spec_n_samples(tr->spec, b), cmi_loss_tokens(tr, b)};
        const double w = tr->tokens_weighting ? counts[1] : counts[0];
        for (int k = 0; k < tr->n_drop; k++) tr->drop_base[k] = tr->drop_rngs[k]->counter;
        s = plan_batch(tr, b, w > 0 ? w : 1.0, true, out);
        cmi_state_clear_batch(st);
    }
    char msg[1536] = "";
    if (s) snprintf(msg, sizeof msg, "%s", cm_last_error());
    cm_status r = cm_dataloader_set_state(st->train_dl, at);
    if (s) return cm_set_error(s, "%s", msg);
    return r;
}
