/* The golden BERTs (tests/golden/gen_bert.py): test-tiny BertForMaskedLM and
 * BertForSequenceClassification (3 labels) with torch's weights, and their padded batch in
 * tests/golden/bert.safetensors. Every function aborts the test on failure. */
#ifndef CMGOLDEN_BERT_H
#define CMGOLDEN_BERT_H

#include "cmtest.h"

#define CMT_GOLDEN_BERT "tests/golden/bert.safetensors"

/* The masked LM (in eval mode: dropout off, gradients still recorded) or the classifier (dropout
 * probabilities 0, in train mode), with tests/golden/bert_{mlm,cls}.safetensors loaded strictly. */
cm_model *cmt_golden_bert_model(bool mlm);

#endif
