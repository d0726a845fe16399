/* Private to the library: what the trainer needs to know of the built-in metrics. */
#ifndef CM_MODEL_IMPL_H
#define CM_MODEL_IMPL_H

#include <composer/model.h>

/* The target field of a built-in cross-entropy metric (LanguageCrossEntropy, CrossEntropy,
 * LanguagePerplexity: state {Σ loss, counted}), or NULL for any other metric. */
const char *cmi_metric_ce_target(const cm_metric *mt);

#endif
