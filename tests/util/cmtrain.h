/* Helpers for the trainer tests: a synthetic classification dataset, a small MLP classifier, and
 * loaders over them. Every function aborts the test on failure. */
#ifndef CMTRAIN_H
#define CMTRAIN_H

#include <composer/composer.h>
#include <composer/trainer.h>
#include <composer/algorithms.h>

/* Synthetic data: n samples; fields "input" f32 (d), "label" i64 () — the argmax of a fixed
 * random linear map of the input, so it can be learned — and "ntok" f32 () = the sample's token
 * count (1 + index % 5, also reported through n_tokens when `tokens` is set). `indices`, if not
 * NULL, maps the dataset's positions to the underlying sample indices (a subset view). */
cm_dataset *cmt_synth_dataset(int64_t n, int d, int classes, bool tokens, const int64_t *indices);

/* An MLP classifier d -> hidden -> (dropout p) -> classes, weights from `seed`. */
cm_model *cmt_mlp(int d, int hidden, int classes, float dropout, uint64_t seed);

/* A loader (train: shuffled with `seed`, drop_last; eval: cm_dataloader_config_eval). */
cm_dataloader *cmt_loader(cm_dataset *ds, int64_t batch, bool eval, uint64_t seed);

/* The values an in-memory logger recorded under `name`, by batch: v[0..cap) set to NaN, then
 * v[b] to the value logged at batch b (a batch at or beyond cap fails the test). Returns one past
 * the last batch logged (0 if none). */
int cmt_logged_by_batch(const cm_in_memory_logger *mem, const char *name, double *v, int cap);

/* The values two in-memory loggers recorded under `name` (cmt_logged_by_batch, batches < cap) are
 * logged at the same batches (at least one) and agree within atol + rtol·|a| (NaN only with NaN). */
void cmt_expect_logged_close(const cm_in_memory_logger *a, const cm_in_memory_logger *b, const char *name, int cap,
                             double atol, double rtol);

/* All parameters of a model, concatenated (caller frees with free()). */
float *cmt_params_copy(cm_model *m, int64_t *n);

#endif
