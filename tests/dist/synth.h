/* The synthetic classification set the distributed tests train on: sample i is an input of
 * DT_D normal values drawn from (seed 1234, stream i) and the label of the largest of DT_C fixed
 * random linear scores of it (a learnable task). */
#ifndef CM_TESTS_DIST_SYNTH_H
#define CM_TESTS_DIST_SYNTH_H

#include <composer/composer.h>

enum { DT_D = 12, DT_C = 4 };

/* n samples, fields "input" (DT_D,) f32 and "label" () i64; with tokens, sample i counts
 * 1 + i % 5 tokens (for token-weighted microbatches). */
cm_status dt_synth_new(int64_t n, bool tokens, cm_dataset **out);

/* The classifier both programs train: Linear(DT_D, 16), ReLU, Linear(16, 16), ReLU, Linear(16, DT_C),
 * each linear its own wrap unit (three gradient buckets); with dropout_p > 0 a Dropout after each
 * ReLU. Weights from (seed 7, stream). */
cm_status dt_mlp_new(uint64_t stream, float dropout_p, cm_model **out);

#endif
