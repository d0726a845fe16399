/* Private helpers of the data methods (composer/data_algos.h): keyed random streams, batch-field
 * lookup by key, tensors a plugin owns until its next apply, and small tensor utilities. */
#ifndef CM_DA_IMPL_H
#define CM_DA_IMPL_H

#include <composer/data_algos.h>

#include <stdio.h>
#include <string.h>

/* The stream of one draw site: Philox keyed by the run's seed, with a stream from (method tag, a,
 * b, c) — e.g. (MIXUP, batch, rank, microbatch). The counter starts at 0. */
cm_rng cmi_da_rng(uint64_t seed, uint64_t tag, int64_t a, int64_t b, int64_t c);
/* Tags ("MIXU", "CMIX", ...) so methods never share a stream. */
#define CMI_DA_TAG(a, b, c, d) ((uint64_t)(a) << 24 | (uint64_t)(b) << 16 | (uint64_t)(c) << 8 | (uint64_t)(d))

/* A double uniform in [0, 1) with 53 random bits (one Philox block); an integer uniform in
 * [lo, hi) (hi > lo), as numpy's randint(lo, hi). */
double cmi_da_u01(cm_rng *rng);
int64_t cmi_da_randint(cm_rng *rng, int64_t lo, int64_t hi);
/* A Gamma(a, 1) draw, a > 0 (Marsaglia–Tsang; the a < 1 boost). */
double cmi_da_gamma(cm_rng *rng, double a);

/* The index of the field `key` among names[0, n) (NULL key: position `pos`), or -1 with the
 * error "<algo>: ... for <role> (fields: ...)". */
int cmi_da_field(const char *const *names, int n, const char *key, int pos, const char *algo, const char *role);

/* Tensors a plugin hands to the trainer: valid until the plugin's next apply, or its free. */
typedef struct cmi_da_owned {
    cm_tensor *t[2 * CM_DATASET_MAX_FIELDS];
    int n;
} cmi_da_owned;
void cmi_da_owned_clear(cmi_da_owned *o);
/* Takes t (NULL is ignored); CM_ERR_INTERNAL when full (t is then freed). */
cm_status cmi_da_owned_add(cmi_da_owned *o, cm_tensor *t);

/* The per-row arrays (indices, row_tokens, valid) of a batch a method re-cut, grown as needed and
 * owned by the method until its free (cmi_da_rows_free). */
typedef struct cmi_da_rows {
    int64_t *a;
    int64_t cap;
} cmi_da_rows;
void cmi_da_rows_free(cmi_da_rows *r);
/* Makes out[0, b->n_fields) — b's fields re-cut to `rows` rows of L positions by
 * cm_set_batch_sequence_length — the state's batch: each row keeps b's dataset index when
 * keep_indices (truncated rows), else -1 (rows re-cut across samples); L tokens a row where b
 * counts tokens; every row valid. The tensors go to `owned` (on failure the rest are freed). */
cm_status cmi_da_set_recut_batch(cm_state *st, const cm_batch *b, cm_tensor **out, int64_t rows, int64_t L,
                                 bool keep_indices, cmi_da_owned *owned, cmi_da_rows *arr);

/* CM_ERR_UNSUPPORTED unless every non-NULL tensor of the list (ending with NULL) lives on the CPU:
 * the data methods read and write host memory (no GPU kernels of theirs yet). */
cm_status cmi_da_check_host(const char *who, const cm_tensor *t, ...);

/* A copy of a key string (NULL stays NULL); false on out of memory. */
bool cmi_da_dup_key(const char *key, char **out);

/* "(4, 3, 32, 32) f32" into buf. */
const char *cmi_da_desc(const cm_tensor *t, char *buf, size_t cap);

/* A new contiguous tensor with src's dtype and the given shape. */
cm_status cmi_da_new_like(const cm_tensor *src, int ndim, const int64_t *shape, cm_tensor **out);

/* The class index at row i of an integer target tensor (contiguous or not). */
int64_t cmi_da_class_at(const cm_tensor *t, int64_t i);
bool cmi_da_is_index_dtype(cm_dtype dt);

/* Validates and reads a small JSON object of numbers saved by a plugin: for each of the n keys
 * (all required) its value into vals. CM_ERR_FORMAT naming the algorithm and the key. */
cm_status cmi_da_load_numbers(const char *algo, const char *json, size_t len, const char *const *keys, double *vals,
                              int n);

#endif
