/* Private to the data layer: a sampler's per-epoch permutation with its round keys computed once,
 * so the loader's lookups skip the key derivation. */
#ifndef CM_DATA_IMPL_H
#define CM_DATA_IMPL_H

#include <composer/data.h>

#define CM_SAMPLER_ROUNDS 8

typedef struct cm_epoch_perm {
    int64_t len;
    bool shuffle;
    int lo_bits, hi_bits; /* the Feistel halves: k = lo_bits + hi_bits = ceil(log2(len)) */
    uint64_t keys[CM_SAMPLER_ROUNDS];
} cm_epoch_perm;

/* The permutation of `epoch` (>= 0) of a sampler. */
void cm_epoch_perm_init(cm_epoch_perm *p, const cm_sampler *s, int64_t epoch);
/* The index at position 0 <= pos < p->len. */
int64_t cm_epoch_perm_index(const cm_epoch_perm *p, int64_t pos);

#endif
