/*
 * composer/model.h — the model interface the trainer drives, after Composer's ComposerModel:
 * forward(batch) → outputs, loss(outputs, batch) → scalar, eval_forward(batch) → outputs, the
 * metrics the model reports in training and in evaluation, and the FLOPs per sample (for MFU).
 * A model wraps a module tree (nn.h) and says how a batch's fields feed it.
 *
 * A batch reaches the model as a cm_model_batch: named field tensors whose first dim is the batch
 * (B, ...), plus the sample and token counts the trainer uses for time and for scaling the loss
 * of microbatches. The trainer fills it from whatever its loader produced.
 *
 *     cm_module *net = ...;                                    // (B, 1, 28, 28) -> (B, 10)
 *     cm_classifier_config cc = cm_classifier_config_default(); // "input" -> net, "label" targets
 *     cc.input_field = "image";
 *     cm_model *model;
 *     if (cm_model_classifier_new(net, &cc, &model) != CM_OK)  // takes net on success
 *         fprintf(stderr, "%s\n", cm_last_error());
 *     const char *names[2] = {"image", "label"};
 *     cm_tensor *fields[2] = {images, labels};
 *     cm_model_batch b = {names, fields, 2, 64, 0};
 *     cm_tensor *out = cm_model_forward(model, tp, &b);         // logits (64, 10)
 *     cm_tensor *loss = cm_model_loss(model, tp, out, &b);      // scalar
 *     cm_tape_backward(tp, loss);
 *     double acc_state[2] = {0};                                // a metric's running sums
 *     cm_metric acc = cm_model_metric(model, true, 0);          // MulticlassAccuracy
 *     cm_metric_update(&acc, out, &b, acc_state);
 *     printf("%s %.3f\n", acc.vt->name, cm_metric_compute(&acc, acc_state));
 *     cm_model_free(model);                                    // frees net too
 *
 * Threading: as the module tree — one thread at a time.
 */
#ifndef COMPOSER_MODEL_H
#define COMPOSER_MODEL_H

#include <composer/nn.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Batches
 * ------------------------------------------------------------------------------------------- */

/* Plain data; the arrays and tensors are borrowed for the duration of a call. */
typedef struct cm_model_batch {
    const char *const *names; /* n field names: "input_ids", "labels", "image", "label", ... */
    cm_tensor *const *fields; /* n tensors (B, ...) */
    int n;
    int64_t n_samples;        /* B (the trainer's sample count for this batch) */
    int64_t n_tokens;         /* tokens in the batch, 0 when not token-based */
} cm_model_batch;

/* The field called `name`, or NULL. */
cm_tensor *cm_model_batch_field(const cm_model_batch *b, const char *name);

/* ---------------------------------------------------------------------------------------------
 * Metrics: sums that aggregate by addition, so the trainer can accumulate them over batches and
 * all-reduce them over ranks, then compute the value once.
 * ------------------------------------------------------------------------------------------- */

#define CM_METRIC_ABI 1
#define CM_METRIC_MAX_STATE 8

typedef struct cm_metric_i {
    int abi;          /* CM_METRIC_ABI */
    const char *name; /* the logged name: "MulticlassAccuracy", "LanguageCrossEntropy", ... */
    int n_state;      /* sums in the state, 1..CM_METRIC_MAX_STATE */
    /* Adds this batch's contribution into state (n_state doubles). Errors with a message naming
     * the metric, the field and the shapes. */
    cm_status (*update)(const void *self, cm_tensor *outputs, const cm_model_batch *batch, double *state);
    /* The value from the summed state (NaN when nothing was counted). */
    double (*compute)(const void *self, const double *state);
} cm_metric_i;

/* A metric: its type and its configuration (borrowed; lives as long as the model). */
typedef struct cm_metric {
    const cm_metric_i *vt;
    const void *self;
} cm_metric;

/* Calls mt->vt->update after checking the arguments (CM_ERR_INVALID_ARG for NULLs). */
cm_status cm_metric_update(const cm_metric *mt, cm_tensor *outputs, const cm_model_batch *batch, double *state);
double cm_metric_compute(const cm_metric *mt, const double *state);

/* Built-in metrics over logits (..., C) (f32, any strides) and integer targets (...) from the
 * batch field `target_field` (a string that must outlive the metric), skipping targets equal to
 * -100, as Composer/torchmetrics:
 * - MulticlassAccuracy: state {correct, counted}; value correct / counted (argmax, first max wins).
 * - LanguageCrossEntropy: state {Σ loss, counted}; value the mean cross-entropy (nats).
 * - LanguagePerplexity: the same state; value exp(mean cross-entropy). */
cm_metric cm_metric_accuracy(const char *target_field);
cm_metric cm_metric_cross_entropy(const char *target_field);
cm_metric cm_metric_perplexity(const char *target_field);
/* The same for a head that runs only on the targeted positions (a masked-LM head on the masked
 * tokens): logits (n, C) whose rows are the n targets of `target_field` (two or more dims) that
 * are not -100, in row-major order; dense logits (..., C) matching the targets are taken as the
 * metrics above take them. Logged as MulticlassAccuracy / LanguageCrossEntropy. */
cm_metric cm_metric_sparse_accuracy(const char *target_field);
cm_metric cm_metric_sparse_cross_entropy(const char *target_field);

/* ---------------------------------------------------------------------------------------------
 * Models
 * ------------------------------------------------------------------------------------------- */

#define CM_MODEL_ABI 1

typedef struct cm_model_i {
    int abi;               /* CM_MODEL_ABI */
    const char *type_name; /* "GPT2LMHeadModel", "ComposerClassifier", ... */
    /* Outputs for the batch (logits, usually), on tp. NULL with the error on the tape. */
    cm_tensor *(*forward)(void *self, cm_tape *tp, const cm_model_batch *batch);
    /* The scalar loss from forward's outputs and the batch (the mean over the batch's samples or
     * tokens: the trainer rescales microbatches). */
    cm_tensor *(*loss)(void *self, cm_tape *tp, cm_tensor *outputs, const cm_model_batch *batch);
    /* Optional: outputs for evaluation metrics (e.g. without teacher forcing); NULL = forward. */
    cm_tensor *(*eval_forward)(void *self, cm_tape *tp, const cm_model_batch *batch);
    /* Optional: the metrics reported in training (train = true) and in evaluation. */
    int (*n_metrics)(void *self, bool train);
    cm_metric (*metric)(void *self, bool train, int i);
    /* Optional: FLOPs of forward + backward for one sample of this batch's shape (0 = unknown);
     * the trainer divides throughput by peak FLOPs for MFU. */
    double (*flops_per_sample)(void *self, const cm_model_batch *batch);
    /* The root of the module tree (parameters, surgery, train/eval, checkpoints). */
    cm_module *(*module)(void *self);
    /* Optional: frees self (and the module tree it owns). */
    void (*free_self)(void *self);
} cm_model_i;

typedef struct cm_model cm_model;

/* Wraps an implementation; on success the model owns `self`. Errors: CM_ERR_INVALID_ARG (wrong
 * abi; forward, loss or module missing), CM_ERR_OOM. */
cm_status cm_model_new(const cm_model_i *vt, void *self, cm_model **out);
void cm_model_free(cm_model *m); /* NULL is a no-op */

const char *cm_model_type_name(const cm_model *m);
cm_module *cm_model_module(const cm_model *m);
void *cm_model_self(const cm_model *m);

/* The calls, with checks: NULL when tp already failed, when the implementation returns NULL (its
 * error stays on the tape), or when it returns NULL without an error (an internal error naming the
 * model). cm_model_loss also checks the loss is a scalar (CM_ERR_SHAPE). cm_model_eval_forward
 * falls back to forward; it does not change train/eval mode or gradient recording: the trainer
 * puts the module in eval mode and turns gradients off around evaluation. */
cm_tensor *cm_model_forward(cm_model *m, cm_tape *tp, const cm_model_batch *batch);
cm_tensor *cm_model_loss(cm_model *m, cm_tape *tp, cm_tensor *outputs, const cm_model_batch *batch);
cm_tensor *cm_model_eval_forward(cm_model *m, cm_tape *tp, const cm_model_batch *batch);

int cm_model_n_metrics(const cm_model *m, bool train);        /* 0 when the model has none */
cm_metric cm_model_metric(const cm_model *m, bool train, int i); /* {NULL, NULL} if out of range */
double cm_model_flops_per_sample(const cm_model *m, const cm_model_batch *batch); /* 0 = unknown */

/* ---------------------------------------------------------------------------------------------
 * A ready-made classifier (Composer's ComposerClassifier)
 * ------------------------------------------------------------------------------------------- */

typedef struct cm_classifier_config {
    const char *input_field;  /* "input": the field fed to the network (string copied) */
    const char *target_field; /* "label": class indices (string copied) */
    float label_smoothing;    /* 0 */
    double flops_per_sample;  /* 0 = unknown */
} cm_classifier_config;
cm_classifier_config cm_classifier_config_default(void);

/* A model whose forward is net(batch[input_field]) → logits (B, C), whose loss is the
 * cross-entropy against batch[target_field], with MulticlassAccuracy in training and
 * MulticlassAccuracy and CrossEntropy (the mean cross-entropy, computed as LanguageCrossEntropy) in
 * evaluation. net is finalized if it is not yet. On success the model owns net. Errors: CM_ERR_INVALID_ARG (NULL net, net with a
 * parent, empty field names), cm_module_finalize's errors, CM_ERR_OOM. Missing fields at forward
 * time are CM_ERR_NOT_FOUND on the tape, naming the field and the batch's fields. */
cm_status cm_model_classifier_new(cm_module *net, const cm_classifier_config *cfg, cm_model **out);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_MODEL_H */
