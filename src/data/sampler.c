/* The sampler: a keyed bijection of [0, len) per epoch, evaluated pointwise.
 *
 * Domain 2^k with k = ceil(log2(len)). Each of the 8 rounds splits x into hi (hi_bits, the upper
 * part) and lo (lo_bits = k / 2) and maps it to (lo << hi_bits) | (hi ^ F(key_r, lo)), which is
 * invertible (lo is read back from the top bits, then hi = rest ^ F(key_r, lo)); the halves
 * rotate, so after a few rounds every output bit depends on every input bit. Positions that land
 * at or past len are walked through the permutation again until they fall inside (cycle-walking):
 * the restriction of a permutation to [0, len) that way is again a permutation, and since
 * 2^k < 2·len a lookup takes fewer than two passes on average. */
#include "data_impl.h"

static inline uint64_t mix64(uint64_t z) { /* the splitmix64 / murmur3 finaliser */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

cm_status cm_sampler_init(cm_sampler *s, int64_t len, bool shuffle, uint64_t seed) {
    if (len < 1) return cm_set_error(CM_ERR_INVALID_ARG, "sampler: len %lld (must be >= 1)", (long long)len);
    s->len = len;
    s->shuffle = shuffle;
    s->seed = seed;
    return CM_OK;
}

void cm_epoch_perm_init(cm_epoch_perm *p, const cm_sampler *s, int64_t epoch) {
    p->len = s->len;
    p->shuffle = s->shuffle;
    int k = 0;
    while (k < 63 && ((int64_t)1 << k) < s->len) k++;
    p->lo_bits = k / 2;
    p->hi_bits = k - k / 2;
    /* "cm-sampl" separates this key stream from any other use of (seed, epoch). */
    uint64_t words[2] = {s->seed, (uint64_t)epoch};
    uint64_t base = cm_hash64(words, sizeof words, 0x636d2d73616d706cull);
    for (int r = 0; r < CM_SAMPLER_ROUNDS; r++) p->keys[r] = mix64(base + (uint64_t)(r + 1) * 0x9E3779B97F4A7C15ull);
}

static inline uint64_t feistel(const cm_epoch_perm *p, uint64_t x) {
    const int lb = p->lo_bits, hb = p->hi_bits;
    const uint64_t lo_mask = ((uint64_t)1 << lb) - 1, hi_mask = ((uint64_t)1 << hb) - 1;
    for (int r = 0; r < CM_SAMPLER_ROUNDS; r++) {
        uint64_t hi = x >> lb, lo = x & lo_mask;
        uint64_t f = mix64(lo ^ p->keys[r]) & hi_mask;
        x = (lo << hb) | (hi ^ f);
    }
    return x;
}

int64_t cm_epoch_perm_index(const cm_epoch_perm *p, int64_t pos) {
    if (!p->shuffle) return pos;
    uint64_t x = (uint64_t)pos;
    do x = feistel(p, x);
    while (x >= (uint64_t)p->len);
    return (int64_t)x;
}

int64_t cm_sampler_index(const cm_sampler *s, int64_t epoch, int64_t position) {
    if (epoch < 0 || position < 0 || position >= s->len) return -1;
    if (!s->shuffle) return position;
    cm_epoch_perm p;
    cm_epoch_perm_init(&p, s, epoch);
    return cm_epoch_perm_index(&p, position);
}

void cm_data_rank_slice(int64_t global_count, int rank, int world_size, int64_t *begin, int64_t *count) {
    int64_t base = global_count / world_size, extra = global_count % world_size;
    *count = base + (rank < extra ? 1 : 0);
    *begin = (int64_t)rank * base + (rank < extra ? rank : extra);
}
