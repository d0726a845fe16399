/* Private to the library: what the trainer needs to know of the built-in metrics. */
#ifndef CM_MODEL_IMPL_H
#define CM_MODEL_IMPL_H

#include <composer/model.h>

/* What a built-in metric computes, so the trainer can compute it where the logits are (a GPU)
 * instead of copying them to the host: CE (LanguageCrossEntropy, CrossEntropy, LanguagePerplexity:
 * state {Σ loss, counted}) or ACC (MulticlassAccuracy: state {correct, counted}); *field the
 * target field; *sparse for the cm_metric_sparse_* variants (logits of the non-ignored targets
 * only). CMI_METRIC_OTHER for every other metric. */
typedef enum { CMI_METRIC_OTHER, CMI_METRIC_CE, CMI_METRIC_ACC } cmi_metric_kind;
cmi_metric_kind cmi_metric_kind_of(const cm_metric *mt, const char **field, bool *sparse);

/* The entries of host integer targets y that are not -100, in row-major order: their flat
 * positions into rows and their values into vals (either may be NULL; both NULL counts them);
 * returns how many. A sparse metric's rows, a masked-LM head's gathers (bert.c). */
int64_t cmi_labelled(const cm_tensor *y, int64_t *rows, int64_t *vals);

#endif
