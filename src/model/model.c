/* The model interface: checked calls into a cm_model_i, batch fields, the built-in metrics and
 * the ready-made classifier. */
#include "model_impl.h"
#include <composer/model.h>

#include "tensor/vexp.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

struct cm_model {
    const cm_model_i *vt;
    void *self;
};

cm_tensor *cm_model_batch_field(const cm_model_batch *b, const char *name) {
    if (!b || !name) return NULL;
    for (int i = 0; i < b->n; i++)
        if (b->names[i] && !strcmp(b->names[i], name)) return b->fields[i];
    return NULL;
}

/* "a, b, c" of the batch's field names into buf. */
static const char *field_list(const cm_model_batch *b, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; b && i < b->n && len < cap; i++) {
        int w = snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", b->names[i] ? b->names[i] : "(null)");
        if (w < 0) break;
        len += (size_t)w;
    }
    return b && b->n ? buf : "none";
}

/* ---- metrics ---- */

cm_status cm_metric_update(const cm_metric *mt, cm_tensor *outputs, const cm_model_batch *batch, double *state) {
    if (!mt || !mt->vt || !outputs || !batch || !state)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_metric_update: NULL argument (%s)",
                            mt && mt->vt ? mt->vt->name : "no metric");
    return mt->vt->update(mt->self, outputs, batch, state);
}

double cm_metric_compute(const cm_metric *mt, const double *state) {
    return mt && mt->vt && state ? mt->vt->compute(mt->self, state) : NAN;
}

/* Walks rows of logits (..., C) with their targets; calls fn(row pointer/stride, C, target). */
typedef void (*row_fn)(const float *row, int64_t stride, int64_t C, int64_t target, double *state);

static cm_status over_rows(const char *metric, const void *self, cm_tensor *logits, const cm_model_batch *b,
                           double *state, row_fn fn) {
    const char *field = self;
    cm_tensor *tgt = cm_model_batch_field(b, field);
    char fl[256], s1[64], s2[64];
    if (!tgt)
        return cm_set_error(CM_ERR_NOT_FOUND, "%s: the batch has no field '%s' (fields: %s)", metric, field,
                            field_list(b, fl, sizeof fl));
    const int nd = cm_tensor_ndim(logits);
    bool ok = cm_tensor_dtype(logits) == CM_DTYPE_F32 && nd >= 1 && cm_tensor_ndim(tgt) == nd - 1;
    for (int i = 0; ok && i < nd - 1; i++) ok = cm_tensor_dim(tgt, i) == cm_tensor_dim(logits, i);
    cm_dtype tdt = cm_tensor_dtype(tgt);
    if (!ok || !(tdt == CM_DTYPE_I32 || tdt == CM_DTYPE_I64 || tdt == CM_DTYPE_U8))
        return cm_set_error(CM_ERR_SHAPE,
                            "%s: outputs %s (%s) must be f32 logits (..., C) and '%s' %s (%s) integer targets (...)",
                            metric, cm_tensor_shape_str(logits, s1, sizeof s1), cm_dtype_name(cm_tensor_dtype(logits)),
                            field, cm_tensor_shape_str(tgt, s2, sizeof s2), cm_dtype_name(tdt));
    const int64_t C = cm_tensor_dim(logits, -1), rows = C ? cm_tensor_numel(logits) / C : 0;
    const int64_t cstride = cm_tensor_strides(logits)[nd - 1];
    const float *base = cm_tensor_data(logits);
    int64_t idx[CM_MAX_DIMS];
    for (int64_t r = 0; r < rows; r++) {
        int64_t t = (int64_t)cm_tensor_get_flat(tgt, r);
        if (t == -100) continue;
        if (t < 0 || t >= C)
            return cm_set_error(CM_ERR_INVALID_ARG, "%s: target %lld at position %lld is outside [0, %lld)", metric,
                                (long long)t, (long long)r, (long long)C);
        /* the row's first element: unravel r over the leading dims */
        int64_t rem = r, off = 0;
        for (int i = nd - 2; i >= 0; i--) {
            idx[i] = rem % cm_tensor_dim(logits, i);
            rem /= cm_tensor_dim(logits, i);
            off += idx[i] * cm_tensor_strides(logits)[i];
        }
        fn(base + off, cstride, C, t, state);
    }
    return CM_OK;
}

static void acc_row(const float *row, int64_t st, int64_t C, int64_t t, double *state) {
    int64_t best = 0; /* the first maximum; a NaN is the maximum (the first NaN wins), as torch.argmax */
    for (int64_t c = 1; c < C && !isnan(row[best * st]); c++)
        if (row[c * st] > row[best * st] || isnan(row[c * st])) best = c;
    state[0] += best == t;
    state[1] += 1;
}

static void ce_row(const float *row, int64_t st, int64_t C, int64_t t, double *state) {
    double mx = -INFINITY, s = 0;
    for (int64_t c = 0; c < C; c++) mx = fmax(mx, row[c * st]);
    for (int64_t c = 0; c < C; c++) s += exp(row[c * st] - mx);
    state[0] += mx + log(s) - row[t * st];
    state[1] += 1;
}

/* The fast paths of the accuracy and cross-entropy metrics: contiguous f32 logits (..., C) with
 * integer targets of the leading shape. Returns the labelled rows and their targets, idx[k] and
 * idx[rows + k] for k < *n (cm_free it), or NULL when the inputs are not that simple case, a target
 * is out of range or memory runs out: the general walk (over_rows) then handles them and reports
 * the errors. */
static int64_t *fast_rows(const char *field, cm_tensor *o, const cm_model_batch *b, int64_t *C_out, int64_t *n_out) {
    cm_tensor *tgt = cm_model_batch_field(b, field);
    const int nd = cm_tensor_ndim(o);
    if (!tgt || cm_tensor_dtype(o) != CM_DTYPE_F32 || !cm_tensor_is_contiguous(o) || nd < 1 ||
        cm_tensor_ndim(tgt) != nd - 1)
        return NULL;
    const cm_dtype tdt = cm_tensor_dtype(tgt);
    if (tdt != CM_DTYPE_I32 && tdt != CM_DTYPE_I64 && tdt != CM_DTYPE_U8) return NULL;
    for (int i = 0; i < nd - 1; i++)
        if (cm_tensor_dim(tgt, i) != cm_tensor_dim(o, i)) return NULL;
    const int64_t C = cm_tensor_dim(o, -1), rows = C ? cm_tensor_numel(o) / C : 0;
    if (rows == 0) return NULL;
    int64_t *idx = cm_alloc(sizeof(int64_t) * (size_t)(2 * rows), 16); /* (rows) row, (rows) target */
    if (!idx) return NULL;
    int64_t n = 0;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t t = (int64_t)cm_tensor_get_flat(tgt, r);
        if (t == -100) continue;
        if (t < 0 || t >= C) {
            cm_free(idx);
            return NULL;
        }
        idx[n] = r, idx[rows + n] = t, n++;
    }
    *C_out = C, *n_out = n;
    return idx;
}

/* Accuracy on fast_rows' case: rows in parallel, each row's argmax in two vectorisable passes (its
 * maximum and whether it has a NaN, then the first index holding that maximum, or the first NaN) —
 * the same pick as acc_row. The one-thread walk was 4 % of a BERT-Tiny masked-LM step (1229 rows
 * of 30522 logits). Returns false (nothing done) outside that case. */
static bool acc_fast(const char *field, cm_tensor *o, const cm_model_batch *b, double *state) {
    int64_t C, n;
    int64_t *idx = fast_rows(field, o, b, &C, &n);
    if (!idx) return false;
    const int64_t *tgt = idx + cm_tensor_numel(o) / C;
    const float *x = cm_tensor_data(o);
    int64_t hits = 0;
#pragma omp parallel for schedule(static) reduction(+ : hits) if (n * C >= 65536)
    for (int64_t k = 0; k < n; k++) {
        const float *row = x + idx[k] * C;
        float mx = row[0];
        int nan = 0;
#pragma omp simd reduction(max : mx) reduction(| : nan)
        for (int64_t c = 0; c < C; c++) {
            mx = row[c] > mx ? row[c] : mx;
            nan |= row[c] != row[c];
        }
        int64_t best = 0;
        if (nan) {
            while (row[best] == row[best]) best++;
        } else {
            while (row[best] != mx) best++;
        }
        hits += best == tgt[k];
    }
    state[0] += (double)hits;
    state[1] += (double)n;
    cm_free(idx);
    return true;
}

static cm_status acc_update(const void *self, cm_tensor *o, const cm_model_batch *b, double *state) {
    if (acc_fast(self, o, b, state)) return CM_OK;
    return over_rows("MulticlassAccuracy", self, o, b, state, acc_row);
}
/* Cross-entropy state on fast_rows' case: the general walk (one double exp per logit, one thread)
 * cost seconds per batch on GPT-2's (2048, 50257) logits, twice (cross-entropy and perplexity) —
 * more than the loss itself. Here rows run in parallel with float exp (cmi_vexpf, ≤ 3 ulp) summed
 * in double per 1024-wide block, and per-row results are added in row order, so the sum does not
 * depend on the thread count. Returns false (nothing done) outside that case. */
static bool ce_fast(const char *field, cm_tensor *o, const cm_model_batch *b, double *state) {
    int64_t C, n;
    int64_t *idx = fast_rows(field, o, b, &C, &n);
    if (!idx) return false;
    const int64_t *tgt = idx + cm_tensor_numel(o) / C;
    double *lse = cm_alloc(sizeof(double) * (size_t)(n ? n : 1), 16);
    if (!lse) {
        cm_free(idx);
        return false;
    }
    const float *x = cm_tensor_data(o);
#pragma omp parallel for schedule(static) if (n * C >= 65536)
    for (int64_t k = 0; k < n; k++) {
        const float *row = x + idx[k] * C;
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx) /* a NaN makes the sum below NaN whichever way it goes */
        for (int64_t c = 0; c < C; c++) mx = row[c] > mx ? row[c] : mx;
        lse[k] = (double)mx + log(cmi_sum_exp(row, C, 1, mx)) - (double)row[tgt[k]];
    }
    for (int64_t k = 0; k < n; k++) state[0] += lse[k];
    state[1] += (double)n;
    cm_free(idx);
    cm_free(lse);
    return true;
}

static cm_status ce_update(const void *self, cm_tensor *o, const cm_model_batch *b, double *state) {
    if (ce_fast(self, o, b, state)) return CM_OK;
    return over_rows("CrossEntropy", self, o, b, state, ce_row);
}
static double ratio(const void *self, const double *s) { return s[1] > 0 ? s[0] / s[1] : NAN; }
static double perplexity(const void *self, const double *s) { return s[1] > 0 ? exp(s[0] / s[1]) : NAN; }

static const cm_metric_i acc_vt = {CM_METRIC_ABI, "MulticlassAccuracy", 2, acc_update, ratio};
static const cm_metric_i lce_vt = {CM_METRIC_ABI, "LanguageCrossEntropy", 2, ce_update, ratio};
static const cm_metric_i ce_vt = {CM_METRIC_ABI, "CrossEntropy", 2, ce_update, ratio};
static const cm_metric_i ppl_vt = {CM_METRIC_ABI, "LanguagePerplexity", 2, ce_update, perplexity};

/* ---- sparse variants: logits (n, C) of the n targets that are not -100 ---- */

int64_t cmi_labelled(const cm_tensor *y, int64_t *rows, int64_t *vals) {
    int64_t k = 0;
    for (int64_t i = 0; i < cm_tensor_numel(y); i++) {
        const int64_t v = (int64_t)cm_tensor_get_flat(y, i);
        if (v == -100) continue;
        if (rows) rows[k] = i;
        if (vals) vals[k] = v;
        k++;
    }
    return k;
}

/* Sparse logits (n, C) against targets of two or more dims: the stock metric over the gathered
 * targets (n); anything else (dense logits) goes to the stock metric as it is. */
static cm_status sparse_update(const cm_metric_i *stock, const void *self, cm_tensor *o, const cm_model_batch *b,
                               double *state) {
    cm_tensor *y = cm_model_batch_field(b, self);
    if (!y || cm_tensor_ndim(o) != 2 || cm_tensor_ndim(y) < 2) return stock->update(self, o, b, state);
    if (cm_tensor_device(y) != CM_DEVICE_CPU || cm_tensor_device(o) != CM_DEVICE_CPU)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: logits and '%s' must be on the host (the trainer copies them)",
                            stock->name, (const char *)self);
    int64_t n = cmi_labelled(y, NULL, NULL);
    if (n != cm_tensor_dim(o, 0)) {
        char s1[64], s2[64];
        return cm_set_error(CM_ERR_SHAPE, "%s: sparse logits %s need one row per target of '%s' %s that is not -100 (%lld)",
                            stock->name, cm_tensor_shape_str(o, s1, sizeof s1), (const char *)self,
                            cm_tensor_shape_str(y, s2, sizeof s2), (long long)n);
    }
    cm_tensor *t;
    cm_status st = cm_tensor_new(CM_DTYPE_I64, 1, &n, &t);
    if (st != CM_OK) return st;
    cmi_labelled(y, NULL, cm_tensor_data(t));
    const char *names[1] = {self};
    cm_tensor *fields[1] = {t};
    cm_model_batch g = {names, fields, 1, b->n_samples, b->n_tokens};
    st = stock->update(self, o, &g, state);
    cm_tensor_free(t);
    return st;
}
static cm_status sparse_acc_update(const void *self, cm_tensor *o, const cm_model_batch *b, double *state) {
    return sparse_update(&acc_vt, self, o, b, state);
}
static cm_status sparse_ce_update(const void *self, cm_tensor *o, const cm_model_batch *b, double *state) {
    return sparse_update(&lce_vt, self, o, b, state);
}
static const cm_metric_i sparse_acc_vt = {CM_METRIC_ABI, "MulticlassAccuracy", 2, sparse_acc_update, ratio};
static const cm_metric_i sparse_lce_vt = {CM_METRIC_ABI, "LanguageCrossEntropy", 2, sparse_ce_update, ratio};

cmi_metric_kind cmi_metric_kind_of(const cm_metric *mt, const char **field, bool *sparse) {
    *field = NULL, *sparse = false;
    if (!mt || !mt->vt) return CMI_METRIC_OTHER;
    const cm_metric_i *v = mt->vt;
    cmi_metric_kind k = v == &lce_vt || v == &ce_vt || v == &ppl_vt || v == &sparse_lce_vt ? CMI_METRIC_CE
                        : v == &acc_vt || v == &sparse_acc_vt                             ? CMI_METRIC_ACC
                                                                                          : CMI_METRIC_OTHER;
    if (k != CMI_METRIC_OTHER) *field = mt->self, *sparse = v == &sparse_lce_vt || v == &sparse_acc_vt;
    return k;
}

cm_metric cm_metric_accuracy(const char *target_field) { return (cm_metric){&acc_vt, target_field}; }
cm_metric cm_metric_cross_entropy(const char *target_field) { return (cm_metric){&lce_vt, target_field}; }
cm_metric cm_metric_perplexity(const char *target_field) { return (cm_metric){&ppl_vt, target_field}; }
cm_metric cm_metric_sparse_accuracy(const char *target_field) { return (cm_metric){&sparse_acc_vt, target_field}; }
cm_metric cm_metric_sparse_cross_entropy(const char *target_field) {
    return (cm_metric){&sparse_lce_vt, target_field};
}

/* ---- models ---- */

cm_status cm_model_new(const cm_model_i *vt, void *self, cm_model **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_model_new: out is NULL");
    *out = NULL;
    if (!vt || vt->abi != CM_MODEL_ABI || !vt->forward || !vt->loss || !vt->module)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "cm_model_new: the vtable must have abi %d (got %d) and forward, loss and module slots",
                            CM_MODEL_ABI, vt ? vt->abi : -1);
    if ((vt->n_metrics == NULL) != (vt->metric == NULL))
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_model_new: %s: set both n_metrics and metric, or neither",
                            vt->type_name ? vt->type_name : "model");
    cm_model *m = cm_alloc_zeroed(sizeof *m, 8);
    if (!m) return CM_ERR_OOM;
    m->vt = vt, m->self = self;
    *out = m;
    return CM_OK;
}

void cm_model_free(cm_model *m) {
    if (!m) return;
    if (m->vt->free_self) m->vt->free_self(m->self);
    cm_free(m);
}

const char *cm_model_type_name(const cm_model *m) { return m && m->vt->type_name ? m->vt->type_name : "model"; }
cm_module *cm_model_module(const cm_model *m) { return m ? m->vt->module(m->self) : NULL; }
void *cm_model_self(const cm_model *m) { return m ? m->self : NULL; }

static cm_tensor *checked(cm_model *m, cm_tape *tp, const char *what, cm_tensor *y) {
    if (!y && cm_tape_status(tp) == CM_OK)
        cm_tape_fail(tp, CM_ERR_INTERNAL, "%s.%s returned NULL without recording an error", cm_model_type_name(m),
                     what);
    return y;
}

cm_tensor *cm_model_forward(cm_model *m, cm_tape *tp, const cm_model_batch *batch) {
    if (!tp || cm_tape_status(tp) != CM_OK) return NULL;
    if (!m || !batch) {
        cm_tape_fail(tp, CM_ERR_INVALID_ARG, "cm_model_forward: NULL model or batch");
        return NULL;
    }
    return checked(m, tp, "forward", m->vt->forward(m->self, tp, batch));
}

cm_tensor *cm_model_eval_forward(cm_model *m, cm_tape *tp, const cm_model_batch *batch) {
    if (!tp || cm_tape_status(tp) != CM_OK) return NULL;
    if (!m || !batch) {
        cm_tape_fail(tp, CM_ERR_INVALID_ARG, "cm_model_eval_forward: NULL model or batch");
        return NULL;
    }
    if (!m->vt->eval_forward) return cm_model_forward(m, tp, batch);
    return checked(m, tp, "eval_forward", m->vt->eval_forward(m->self, tp, batch));
}

cm_tensor *cm_model_loss(cm_model *m, cm_tape *tp, cm_tensor *outputs, const cm_model_batch *batch) {
    if (!tp || cm_tape_status(tp) != CM_OK || !outputs) return NULL;
    if (!m || !batch) {
        cm_tape_fail(tp, CM_ERR_INVALID_ARG, "cm_model_loss: NULL model or batch");
        return NULL;
    }
    cm_tensor *l = checked(m, tp, "loss", m->vt->loss(m->self, tp, outputs, batch));
    if (l && cm_tensor_numel(l) != 1) {
        char s[64];
        cm_tape_fail(tp, CM_ERR_SHAPE, "%s.loss returned %s; the loss must be a scalar", cm_model_type_name(m),
                     cm_tensor_shape_str(l, s, sizeof s));
        return NULL;
    }
    return l;
}

int cm_model_n_metrics(const cm_model *m, bool train) {
    return m && m->vt->n_metrics ? m->vt->n_metrics(m->self, train) : 0;
}

cm_metric cm_model_metric(const cm_model *m, bool train, int i) {
    if (!m || i < 0 || i >= cm_model_n_metrics(m, train)) return (cm_metric){NULL, NULL};
    return m->vt->metric(m->self, train, i);
}

double cm_model_flops_per_sample(const cm_model *m, const cm_model_batch *batch) {
    return m && m->vt->flops_per_sample ? m->vt->flops_per_sample(m->self, batch) : 0.0;
}

/* ---- the classifier ---- */

typedef struct {
    cm_module *net;
    char input[64], target[64];
    float label_smoothing;
    double flops;
} classifier;

cm_classifier_config cm_classifier_config_default(void) {
    return (cm_classifier_config){"input", "label", 0.0f, 0.0};
}

static cm_tensor *field_or_fail(cm_tape *tp, const cm_model_batch *b, const char *name) {
    cm_tensor *t = cm_model_batch_field(b, name);
    if (!t) {
        char fl[256];
        cm_tape_fail(tp, CM_ERR_NOT_FOUND, "ComposerClassifier: the batch has no field '%s' (fields: %s)", name,
                     field_list(b, fl, sizeof fl));
    }
    return t;
}

static cm_tensor *cls_forward(void *self, cm_tape *tp, const cm_model_batch *b) {
    classifier *c = self;
    cm_tensor *x = field_or_fail(tp, b, c->input);
    return x ? cm_module_forward(c->net, tp, x) : NULL;
}
static cm_tensor *cls_loss(void *self, cm_tape *tp, cm_tensor *out, const cm_model_batch *b) {
    classifier *c = self;
    cm_tensor *y = field_or_fail(tp, b, c->target);
    if (!y) return NULL;
    cm_cross_entropy_opts o = cm_cross_entropy_opts_default();
    o.label_smoothing = c->label_smoothing;
    return cm_cross_entropy(tp, out, y, &o);
}
static int cls_n_metrics(void *self, bool train) { return train ? 1 : 2; }
static cm_metric cls_metric(void *self, bool train, int i) {
    classifier *c = self;
    return (cm_metric){i == 0 ? &acc_vt : &ce_vt, c->target};
}
static double cls_flops(void *self, const cm_model_batch *b) { return ((classifier *)self)->flops; }
static cm_module *cls_module(void *self) { return ((classifier *)self)->net; }
static void cls_free(void *self) {
    classifier *c = self;
    cm_module_free(c->net);
    cm_free(c);
}

static const cm_model_i classifier_vt = {CM_MODEL_ABI, "ComposerClassifier", cls_forward, cls_loss, NULL,
                                         cls_n_metrics, cls_metric, cls_flops, cls_module, cls_free};

cm_status cm_model_classifier_new(cm_module *net, const cm_classifier_config *cfg, cm_model **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_model_classifier_new: out is NULL");
    *out = NULL;
    cm_classifier_config cc = cfg ? *cfg : cm_classifier_config_default();
    if (!net || cm_module_parent(net))
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_model_classifier_new: the network must be a root module (got %s)",
                            net ? "a module with a parent" : "NULL");
    if (!cc.input_field || !cc.input_field[0] || !cc.target_field || !cc.target_field[0] ||
        strlen(cc.input_field) >= 64 || strlen(cc.target_field) >= 64)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "cm_model_classifier_new: input_field and target_field must be names of 1 to 63 characters");
    if (!(cc.label_smoothing >= 0 && cc.label_smoothing <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_model_classifier_new: label_smoothing %g is not in [0, 1]",
                            cc.label_smoothing);
    cm_status st;
    if (!cm_module_is_finalized(net) && (st = cm_module_finalize(net))) return st;
    classifier *c = cm_alloc_zeroed(sizeof *c, 8);
    if (!c) return CM_ERR_OOM;
    c->net = net;
    snprintf(c->input, sizeof c->input, "%s", cc.input_field);
    snprintf(c->target, sizeof c->target, "%s", cc.target_field);
    c->label_smoothing = cc.label_smoothing;
    c->flops = cc.flops_per_sample;
    if ((st = cm_model_new(&classifier_vt, c, out))) {
        cm_free(c);
        return st;
    }
    return CM_OK;
}
