/* Private: numpy's default_rng (SeedSequence + PCG64) reproduced bit for bit, and the pieces of
 * Streaming's epoch order built on it (FORMATS §5.4-5.8). */
#ifndef CM_STREAM_ORDER_IMPL_H
#define CM_STREAM_ORDER_IMPL_H

#include <composer/streaming.h>

typedef struct cmi_pcg64 {
    unsigned __int128 state, inc;
    bool has32;
    uint32_t buf32;
} cmi_pcg64;

/* numpy.random.default_rng(seed) for a non-negative seed below 2^128 (hi:lo). */
void cmi_pcg64_seed(cmi_pcg64 *g, uint64_t seed_lo, uint64_t seed_hi);
/* SeedSequence(seed).generate_state(4, uint64). */
void cmi_seedseq_state(uint64_t seed_lo, uint64_t seed_hi, uint64_t out[4]);
uint64_t cmi_pcg64_next64(cmi_pcg64 *g);
uint32_t cmi_pcg64_next32(cmi_pcg64 *g);
double cmi_pcg64_double(cmi_pcg64 *g);
/* Generator.shuffle of n values (Fisher-Yates with random_interval), and Generator.permutation. */
void cmi_pcg64_shuffle(cmi_pcg64 *g, int64_t *a, int64_t n);
/* Generator.integers(low, high) for int64 (high exclusive, high > low). */
int64_t cmi_pcg64_integers(cmi_pcg64 *g, int64_t low, int64_t high);
/* Generator.uniform(low, high) (one value). */
double cmi_pcg64_uniform(cmi_pcg64 *g, double low, double high);
/* Generator.choice(n, k, replace=False) into out (k values, in numpy's order). Errors: k > n. */
cm_status cmi_pcg64_choice(cmi_pcg64 *g, int64_t n, int64_t k, int64_t *out);

/* The index of a shuffle algorithm among naive, py1b, py1br, py1e, py1s, py2s; -1 if unknown. */
int cmi_shuffle_algo(const char *algo);

#endif
