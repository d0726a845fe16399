/* The golden GPT-2 training run's pieces (tests/golden/gen_train_gpt2.py): a tiny GPT-2 (V 64, P 16,
 * C 32, L 2, H 4, no dropout), its 5 stored batches of (4, 16) tokens as a dataset, loading weights
 * stored under a prefix ("init.", "plain.final.", ...) and the two-group AdamW of the reference.
 * Every function aborts the test on failure. */
#ifndef CMGOLDEN_GPT2_H
#define CMGOLDEN_GPT2_H

#include "cmtest.h"

#define CMT_GOLDEN_GPT2 "tests/golden/train_gpt2.safetensors"
#define CMT_GOLDEN_GPT2_STEPS 5
#define CMT_GOLDEN_GPT2_B 4
#define CMT_GOLDEN_GPT2_T 16

/* The stored batches: sample i is row i % B of batch i / B (load it unshuffled). masked: the labels
 * with -100; last_row_ignored: also every label of each batch's last row. */
cm_dataset *cmt_golden_gpt2_dataset(cmt_golden *g, bool masked, bool last_row_ignored);
/* A cm_load_opts.rename that keeps the golden's names starting with the prefix in `data`, without it. */
bool cmt_golden_gpt2_strip_prefix(const char *file_name, char *buf, size_t cap, void *data);
/* The tiny GPT-2 (random weights: load some). */
cm_model *cmt_golden_gpt2_model(void);
/* Loads the parameters stored under `prefix` (strict: every parameter must be there). */
void cmt_golden_gpt2_load(cm_model *m, const char *prefix);
/* AdamW (lr 1e-2, betas (0.9, 0.95), eps 1e-8) in two groups: weight decay 0.1 on the >= 2-D
 * parameters, 0 on the rest; one span per parameter over the model's unit buffers (on whatever
 * device the model is). */
cm_optim *cmt_golden_gpt2_adamw(cm_model *m);

#endif
