/* Events and precisions (names from the X-macro lists), and the state's getters. */
#include "trainer/trainer_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* ---- events ---- */

enum { KIND_NONE, KIND_BEFORE, KIND_AFTER };

static const char *const event_names[] = {
#define CM_X_(name, value, kind) #name,
    CM_EVENT_LIST(CM_X_)
#undef CM_X_
};
static const char *const event_values[] = {
#define CM_X_(name, value, kind) value,
    CM_EVENT_LIST(CM_X_)
#undef CM_X_
};
static const unsigned char event_kinds[] = {
#define CM_X_(name, value, kind) KIND_##kind,
    CM_EVENT_LIST(CM_X_)
#undef CM_X_
};
_Static_assert(sizeof event_names / sizeof *event_names == CM_EVENT_COUNT, "event name table");
_Static_assert(sizeof event_kinds == CM_EVENT_COUNT, "event kind table");

const char *cm_event_name(cm_event ev) { return (unsigned)ev < CM_EVENT_COUNT ? event_names[ev] : "?"; }
const char *cm_event_value(cm_event ev) { return (unsigned)ev < CM_EVENT_COUNT ? event_values[ev] : "?"; }
bool cm_event_is_before(cm_event ev) { return (unsigned)ev < CM_EVENT_COUNT && event_kinds[ev] == KIND_BEFORE; }
bool cm_event_is_after(cm_event ev) { return (unsigned)ev < CM_EVENT_COUNT && event_kinds[ev] == KIND_AFTER; }

cm_status cm_event_parse(const char *s, cm_event *out) {
    for (int i = 0; s && i < CM_EVENT_COUNT; i++) {
        if (!strcasecmp(s, event_names[i]) || !strcasecmp(s, event_values[i])) {
            *out = (cm_event)i;
            return CM_OK;
        }
    }
    return cm_set_error(CM_ERR_INVALID_ARG, "event '%s' is not one of Composer's events (e.g. 'batch_end', "
                                            "'AFTER_TRAIN_BATCH'; see CM_EVENT_LIST in composer/trainer.h)",
                        s ? s : "(null)");
}

/* ---- precision ---- */

static const char *const precision_names[] = {
#define CM_X_(name, str) str,
    CM_PRECISION_LIST(CM_X_)
#undef CM_X_
};
_Static_assert(sizeof precision_names / sizeof *precision_names == CM_PRECISION_COUNT, "precision table");

const char *cm_precision_name(cm_precision p) {
    return (unsigned)p < CM_PRECISION_COUNT ? precision_names[p] : "?";
}

cm_status cm_precision_parse(const char *s, cm_precision *out) {
    for (int i = 0; s && i < CM_PRECISION_COUNT; i++) {
        if (!strcasecmp(s, precision_names[i])) {
            *out = (cm_precision)i;
            return CM_OK;
        }
    }
    return cm_set_error(CM_ERR_INVALID_ARG, "precision '%s' is not known (use fp32, amp_bf16 or amp_fp16)",
                        s ? s : "(null)");
}

/* ---- the state ---- */

cm_status cm_state_new(cm_state **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_state_new: out is NULL");
    cm_state *st = cm_alloc_zeroed(sizeof *st, 16);
    if (!(*out = st)) return CM_ERR_OOM;
    st->owned_by_user = true;
    snprintf(st->run_name, sizeof st->run_name, "state");
    st->world_size = 1;
    st->ssr = 1.0;
    st->lr_multiplier = 1.0;
    st->total_loss = NAN;
    st->event = CM_EVENT_COUNT;
    st->lr_override = NAN;
    return CM_OK;
}

void cm_state_free(cm_state *st) {
    if (st && st->owned_by_user) cm_free(st);
}

cm_model *cm_state_model(const cm_state *st) { return st->model; }

cm_status cm_state_set_model(cm_state *st, cm_model *model) {
    if (!st || !model) return cm_set_error(CM_ERR_INVALID_ARG, "cm_state_set_model: NULL %s", st ? "model" : "state");
    if (!st->model_settable && !st->owned_by_user)
        return cm_set_error(CM_ERR_STATE, "cm_state_set_model: the model can only be replaced on INIT (and while a "
                                          "checkpoint's required algorithms are applied), before the trainer makes its "
                                          "optimizer");
    if (!cm_module_is_finalized(cm_model_module(model)))
        return cm_set_error(CM_ERR_STATE, "cm_state_set_model: the new model's module is not finalized");
    st->model = model;
    return CM_OK;
}
cm_optim *cm_state_optimizer(const cm_state *st) { return st->optimizer; }
int cm_state_n_schedulers(const cm_state *st) { return st->n_schedulers; }
const cm_sched_config *cm_state_scheduler(const cm_state *st, int i) {
    return i >= 0 && i < st->n_schedulers ? &st->schedulers[i] : NULL;
}
double cm_state_lr_multiplier(const cm_state *st) { return st->lr_multiplier; }
cm_dataloader *cm_state_train_dataloader(const cm_state *st) { return st->train_dl; }
cm_dataloader *cm_state_dataloader(const cm_state *st) { return st->dl; }
const char *cm_state_dataloader_label(const cm_state *st) { return st->dl_label; }
int64_t cm_state_batches_per_epoch(const cm_state *st) { return st->batches_per_epoch; }
int64_t cm_state_dataloader_len(const cm_state *st) { return st->dl ? st->dl_len : -1; }
cm_batch *cm_state_batch(const cm_state *st) { return st->batch; }
const cm_model_batch *cm_state_model_batch(const cm_state *st) { return st->has_mbatch ? &st->mbatch : NULL; }
cm_tensor *cm_state_outputs(const cm_state *st) { return st->outputs; }
cm_tensor *cm_state_loss(const cm_state *st) { return st->loss; }
void cm_state_set_outputs(cm_state *st, cm_tensor *outputs) { st->outputs = outputs; }
void cm_state_set_loss(cm_state *st, cm_tensor *loss) { st->loss = loss; }
cm_tape *cm_state_tape(const cm_state *st) { return st->tape; }
double cm_state_total_loss(const cm_state *st) { return st->total_loss; }
const cm_timestamp *cm_state_timestamp(const cm_state *st) { return &st->ts; }
cm_time cm_state_max_duration(const cm_state *st) { return st->max_duration; }
cm_precision cm_state_precision(const cm_state *st) { return st->precision; }
int64_t cm_state_microbatch_size(const cm_state *st) { return st->microbatch_size; }
bool cm_state_microbatch_auto(const cm_state *st) { return st->microbatch_auto; }
int64_t cm_state_n_microbatches(const cm_state *st) { return st->n_microbatches; }
int64_t cm_state_microbatch_index(const cm_state *st) { return st->microbatch_index; }
int cm_state_rank(const cm_state *st) { return st->rank; }
int cm_state_world_size(const cm_state *st) { return st->world_size; }

cm_status cm_state_all_reduce_sum(const cm_state *st, double *values, int n) {
    if (!st || (n > 0 && !values) || n < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_state_all_reduce_sum: NULL state or values, or n %d < 0", n);
    if (!st->dist || !st->dist->all_reduce_sum || st->world_size <= 1 || n == 0) return CM_OK;
    return st->dist->all_reduce_sum(values, n, st->dist->data);
}

const cm_shard_span *cm_state_shard_spans(const cm_state *st, int *n) {
    if (n) *n = 0;
    if (!st || !st->dist || st->dist->n_shard_spans <= 0) return NULL;
    if (n) *n = st->dist->n_shard_spans;
    return st->dist->shard_spans;
}
uint64_t cm_state_seed(const cm_state *st) { return st->seed; }
const char *cm_state_run_name(const cm_state *st) { return st->run_name; }
bool cm_state_progress_bar(const cm_state *st) { return st->progress_bar; }

cm_status cm_state_elapsed(const cm_state *st, double *out) {
    if (st->max_duration.count == 0)
        return cm_set_error(CM_ERR_STATE, "elapsed duration: max_duration is not set yet");
    return cm_timestamp_elapsed(&st->ts, st->max_duration, st->batches_per_epoch, out);
}

void cm_state_stop_training(const cm_state *st) {
    /* The one documented change through a const state: a request the loop reads after the batch. */
    ((cm_state *)st)->stop = true;
}
bool cm_state_stop_requested(const cm_state *st) { return st->stop; }
void cm_state_rollback(const cm_state *st) {
    /* the second documented change through a const state, read by the loop after the microbatches */
    ((cm_state *)st)->rollback = true;
}
bool cm_state_rollback_requested(const cm_state *st) { return st->rollback; }
void cm_state_free_outputs(const cm_state *st) { ((cm_state *)st)->outputs = NULL; }

bool cm_state_checkpoint_due(const cm_state *st) { return st && st->checkpoint_due; }

cm_status cm_state_set_lr_multiplier_override(cm_state *st, double multiplier) {
    if (!st) return cm_set_error(CM_ERR_INVALID_ARG, "cm_state_set_lr_multiplier_override: NULL state");
    if (!isnan(multiplier) && (!(multiplier >= 0) || !isfinite(multiplier)))
        return cm_set_error(CM_ERR_INVALID_ARG, "learning-rate multiplier override %g: must be finite and >= 0 (or NaN "
                                                "to hand the schedule back to the schedulers)",
                            multiplier);
    st->lr_override = multiplier;
    return CM_OK;
}

double cm_state_lr_multiplier_override(const cm_state *st) { return st ? st->lr_override : NAN; }

cm_status cm_state_set_train_step(cm_state *st, const char *name, cm_train_step_fn fn, void *data) {
    if (!st) return cm_set_error(CM_ERR_INVALID_ARG, "cm_state_set_train_step: NULL state");
    if (fn && st->step_fn && (st->step_fn != fn || st->step_data != data))
        return cm_set_error(CM_ERR_STATE, "train step '%s' cannot be installed: '%s' already replaces the train step "
                                          "(two algorithms that run the batch's closure themselves do not compose)",
                            name ? name : "?", st->step_name ? st->step_name : "?");
    st->step_fn = fn;
    st->step_data = fn ? data : NULL;
    st->step_name = fn ? (name ? name : "custom train step") : NULL;
    return CM_OK;
}

static const cm_metric_set *find_set(const cm_state *st, const char *label) {
    for (int i = 0; label && i < st->n_metric_sets; i++)
        if (!strcmp(st->metric_sets[i].label, label)) return &st->metric_sets[i];
    return NULL;
}

int cm_state_n_metric_labels(const cm_state *st) {
    return st ? st->n_metric_sets : 0;
}

const char *cm_state_metric_label_at(const cm_state *st, int i) {
    return st && i >= 0 && i < st->n_metric_sets ? st->metric_sets[i].label : NULL;
}

int cm_state_n_metrics(const cm_state *st, const char *label) {
    const cm_metric_set *ms = find_set(st, label);
    return ms && ms->computed ? ms->n : 0;
}

cm_status cm_state_metric_at(const cm_state *st, const char *label, int i, const char **name, double *value) {
    const cm_metric_set *ms = find_set(st, label);
    if (!ms || !ms->computed || i < 0 || i >= ms->n)
        return cm_set_error(CM_ERR_NOT_FOUND, "metric %d of '%s': not computed (the label has %d computed metrics)", i,
                            label ? label : "(null)", ms && ms->computed ? ms->n : 0);
    if (name) *name = ms->metrics[i].vt->name;
    if (value) *value = ms->values[i];
    return CM_OK;
}

cm_status cm_state_metric(const cm_state *st, const char *label, const char *name, double *out) {
    const cm_metric_set *ms = find_set(st, label);
    for (int i = 0; ms && ms->computed && name && i < ms->n; i++) {
        if (!strcmp(ms->metrics[i].vt->name, name)) {
            *out = ms->values[i];
            return CM_OK;
        }
    }
    if (ms && ms->off)
        return cm_set_error(CM_ERR_NOT_FOUND,
                            "metric '%s' of '%s' is not computed: training metrics are off (compute_training_metrics "
                            "false, Composer's default); set compute_training_metrics: true",
                            name ? name : "(null)", label);
    return cm_set_error(CM_ERR_NOT_FOUND, "metric '%s' of '%s' has not been computed%s", name ? name : "(null)",
                        label ? label : "(null)", ms ? "" : " (no such loader label)");
}

void cmi_state_set_batch(cm_state *st, cm_batch *b, int64_t n_samples, int64_t n_tokens) {
    st->batch = b;
    for (int i = 0; i < b->n_fields; i++) st->mb_names[i] = b->names[i], st->mb_fields[i] = b->fields[i];
    st->mbatch = (cm_model_batch){st->mb_names, st->mb_fields, b->n_fields, n_samples, n_tokens};
    st->has_mbatch = true;
}

void cmi_state_clear_batch(cm_state *st) {
    st->batch = NULL;
    st->has_mbatch = false;
    st->outputs = st->loss = NULL;
}

cm_status cmi_metric_set_init(cm_metric_set *ms, const cm_model *model, bool train, const char *label) {
    memset(ms, 0, sizeof *ms);
    snprintf(ms->label, sizeof ms->label, "%s", label);
    ms->n = cm_model_n_metrics(model, train);
    if (ms->n <= 0) {
        ms->n = 0;
        return CM_OK;
    }
    ms->metrics = cm_alloc_zeroed(sizeof *ms->metrics * (size_t)ms->n, 16);
    ms->sums = cm_alloc_zeroed(sizeof(double) * CM_METRIC_MAX_STATE * (size_t)ms->n, 16);
    ms->values = cm_alloc_zeroed(sizeof(double) * (size_t)ms->n, 16);
    if (!ms->metrics || !ms->sums || !ms->values) {
        cmi_metric_set_deinit(ms);
        return CM_ERR_OOM;
    }
    for (int i = 0; i < ms->n; i++) {
        ms->metrics[i] = cm_model_metric(model, train, i);
        const cm_metric_i *vt = ms->metrics[i].vt;
        if (!vt || vt->abi != CM_METRIC_ABI || !vt->name || !vt->update || !vt->compute || vt->n_state < 1 ||
            vt->n_state > CM_METRIC_MAX_STATE) {
            cmi_metric_set_deinit(ms);
            return cm_set_error(CM_ERR_INVALID_ARG,
                                "%s: %s metric %d has a bad vtable (abi %d, name, update, compute, n_state 1..%d needed)",
                                cm_model_type_name(model), train ? "train" : "eval", i, vt ? vt->abi : -1,
                                CM_METRIC_MAX_STATE);
        }
    }
    return CM_OK;
}

void cmi_metric_set_deinit(cm_metric_set *ms) {
    cm_free(ms->metrics);
    cm_free(ms->sums);
    cm_free(ms->values);
    ms->metrics = NULL, ms->sums = ms->values = NULL;
    ms->n = 0;
}

void cmi_metric_set_reset(cm_metric_set *ms) {
    if (ms->n) memset(ms->sums, 0, sizeof(double) * CM_METRIC_MAX_STATE * (size_t)ms->n);
}

/* ---- changes algorithms may make to the batch ---- */

cm_event cm_state_event(const cm_state *st) { return st->event; }

static bool in_microbatch_event(cm_event ev) {
    return ev == CM_EVENT_BEFORE_FORWARD || ev == CM_EVENT_AFTER_FORWARD || ev == CM_EVENT_BEFORE_LOSS ||
           ev == CM_EVENT_AFTER_LOSS || ev == CM_EVENT_BEFORE_BACKWARD;
}

/* The working train batch on AFTER_DATALOADER, or NULL (and the error) elsewhere. */
static cm_batch *batch_level(cm_state *st, const char *what) {
    if (!st->trainer || st->event != CM_EVENT_AFTER_DATALOADER || st->batch != &st->trainer->work) {
        cm_set_error(CM_ERR_STATE, "%s: the train batch can be replaced only on AFTER_DATALOADER during fit (now: %s)",
                     what, st->event < CM_EVENT_COUNT ? cm_event_name(st->event) : "outside events");
        return NULL;
    }
    return &st->trainer->work;
}

static cm_status check_rows(const char *what, const char *name, const cm_tensor *t, int64_t rows) {
    char sh[64];
    if (cm_tensor_ndim(t) < 1 || cm_tensor_dim(t, 0) != rows)
        return cm_set_error(CM_ERR_SHAPE, "%s: field '%s' %s must have the batch's %lld rows in dim 0", what, name,
                            cm_tensor_shape_str(t, sh, sizeof sh), (long long)rows);
    return CM_OK;
}

cm_status cm_state_set_batch_field(cm_state *st, const char *name, cm_tensor *t) {
    const char *what = "cm_state_set_batch_field";
    if (!st || !name || !t) return cm_set_error(CM_ERR_INVALID_ARG, "%s: NULL state, name or tensor", what);
    if (!st->has_mbatch) return cm_set_error(CM_ERR_STATE, "%s: there is no batch now", what);
    int f = -1;
    for (int i = 0; i < st->mbatch.n; i++)
        if (!strcmp(st->mb_names[i], name)) f = i;
    if (f < 0) {
        char list[512] = "";
        for (int i = 0; i < st->mbatch.n; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", st->mb_names[i]);
        return cm_set_error(CM_ERR_NOT_FOUND, "%s: the batch has no field '%s' (fields: %s)", what, name, list);
    }
    cm_status s;
    if (st->trainer && in_microbatch_event(st->event)) {
        if ((s = check_rows(what, name, t, cm_tensor_dim(st->mb_fields[f], 0)))) return s;
        st->mb_fields[f] = t; /* what the model sees for the rest of the microbatch */
        return CM_OK;
    }
    cm_batch *w = batch_level(st, what);
    if (!w) return CM_ERR_STATE;
    if (!cm_tensor_is_contiguous(t)) return cm_set_error(CM_ERR_INVALID_ARG, "%s: field '%s' must be contiguous", what, name);
    if ((s = check_rows(what, name, t, w->n_rows))) return s;
    w->fields[f] = st->mb_fields[f] = t;
    st->batch_dirty = true;
    return CM_OK;
}

cm_status cm_state_set_batch(cm_state *st, const cm_batch *b) {
    const char *what = "cm_state_set_batch";
    if (!st || !b) return cm_set_error(CM_ERR_INVALID_ARG, "%s: NULL state or batch", what);
    cm_batch *w = batch_level(st, what);
    if (!w) return CM_ERR_STATE;
    if (b->n_fields < 1 || b->n_fields > CM_DATASET_MAX_FIELDS || b->n_rows < 0 || b->n_samples < 0 ||
        b->n_padded < 0 || b->n_samples + b->n_padded != b->n_rows || b->n_tokens < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: %d fields (1..%d), %lld rows = %lld samples + %lld padded, %lld "
                                                "tokens: inconsistent counts",
                            what, b->n_fields, CM_DATASET_MAX_FIELDS, (long long)b->n_rows, (long long)b->n_samples,
                            (long long)b->n_padded, (long long)b->n_tokens);
    for (int i = 0; i < b->n_fields; i++) {
        if (!b->names[i] || !b->fields[i]) return cm_set_error(CM_ERR_INVALID_ARG, "%s: field %d has no name or tensor", what, i);
        if (!cm_tensor_is_contiguous(b->fields[i]))
            return cm_set_error(CM_ERR_INVALID_ARG, "%s: field '%s' must be contiguous", what, b->names[i]);
        cm_status s = check_rows(what, b->names[i], b->fields[i], b->n_rows);
        if (s) return s;
    }
    /* where the batch sits in the run stays the loader's; the trainer recomputes the global counts */
    cm_batch keep = *w;
    *w = *b;
    w->epoch = keep.epoch, w->step = keep.step, w->position = keep.position, w->microbatch = -1;
    w->rank_offset = keep.rank_offset, w->global_n_samples = keep.global_n_samples;
    w->global_n_tokens = keep.global_n_tokens;
    cmi_state_set_batch(st, w, b->n_samples, b->n_tokens);
    st->batch_dirty = true;
    return CM_OK;
}
