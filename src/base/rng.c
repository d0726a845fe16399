/* Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), keyed by
 * the 64-bit seed; the 128-bit counter is (counter, stream). Distributions on top of it. */
#include <composer/base.h>

#include <math.h>
#include <string.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static inline void philox_round(uint32_t c[4], const uint32_t k[2]) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * c[0];
    uint64_t p1 = (uint64_t)PHILOX_M1 * c[2];
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    uint32_t n0 = hi1 ^ c[1] ^ k[0];
    uint32_t n2 = hi0 ^ c[3] ^ k[1];
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
}

void cm_philox4x32_raw(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    uint32_t k[2] = {key[0], key[1]};
    for (int r = 0; r < 10; r++) {
        if (r) {
            k[0] += PHILOX_W0;
            k[1] += PHILOX_W1;
        }
        philox_round(c, k);
    }
    out[0] = c[0];
    out[1] = c[1];
    out[2] = c[2];
    out[3] = c[3];
}

void cm_philox4x32(uint64_t seed, uint64_t stream, uint64_t counter, uint32_t out[4]) {
    uint32_t ctr[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), (uint32_t)stream, (uint32_t)(stream >> 32)};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    cm_philox4x32_raw(ctr, key, out);
}

/* Philox of PB consecutive counters at once, lane-parallel (structure of arrays), so the compiler
 * turns each round into vector multiplies: out[j][i] is word j of counter `counter + i`, the same
 * words cm_philox4x32 gives. Dropout masks spent ~11% of an amp_bf16 GPT step in the scalar form. */
#define PB 16
static inline void philox_lanes(uint64_t seed, uint64_t stream, uint64_t counter, uint32_t out[4][PB]) {
    uint32_t c0[PB], c1[PB], c2[PB], c3[PB];
    for (int i = 0; i < PB; i++) {
        const uint64_t ctr = counter + (uint64_t)i;
        c0[i] = (uint32_t)ctr, c1[i] = (uint32_t)(ctr >> 32), c2[i] = (uint32_t)stream, c3[i] = (uint32_t)(stream >> 32);
    }
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        if (r) k0 += PHILOX_W0, k1 += PHILOX_W1;
        for (int i = 0; i < PB; i++) {
            const uint64_t p0 = (uint64_t)PHILOX_M0 * c0[i], p1 = (uint64_t)PHILOX_M1 * c2[i];
            const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[i] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3[i] ^ k1;
            c0[i] = n0, c1[i] = (uint32_t)p1, c2[i] = n2, c3[i] = (uint32_t)p0;
        }
    }
    memcpy(out[0], c0, sizeof c0), memcpy(out[1], c1, sizeof c1), memcpy(out[2], c2, sizeof c2);
    memcpy(out[3], c3, sizeof c3);
}

cm_rng cm_rng_init(uint64_t seed, uint64_t stream) {
    cm_rng r = {seed, stream, 0};
    return r;
}

static inline float u32_to_unit(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); } /* [0,1) */

float cm_rng_uniform_at(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t w[4];
    cm_philox4x32(seed, stream, index / 4, w);
    return u32_to_unit(w[index % 4]);
}

void cm_rng_uniform(cm_rng *rng, float *out, size_t n, float lo, float hi) {
    const float span = hi - lo;
    const size_t blocks = (n + 3) / 4;
#pragma omp parallel for if (blocks > 4096) schedule(static)
    for (size_t b = 0; b < blocks; b++) {
        uint32_t w[4];
        cm_philox4x32(rng->seed, rng->stream, rng->counter + b, w);
        for (size_t j = 0; j < 4 && b * 4 + j < n; j++) out[b * 4 + j] = lo + span * u32_to_unit(w[j]);
    }
    rng->counter += blocks;
}

/* Box-Muller: each block of four words gives four normals (cos and sin of two pairs). */
void cm_rng_normal(cm_rng *rng, float *out, size_t n, float mean, float std) {
    const size_t blocks = (n + 3) / 4;
#pragma omp parallel for if (blocks > 4096) schedule(static)
    for (size_t b = 0; b < blocks; b++) {
        uint32_t w[4];
        cm_philox4x32(rng->seed, rng->stream, rng->counter + b, w);
        float z[4];
        for (int p = 0; p < 2; p++) {
            double u1 = ((double)w[2 * p] + 1.0) * (1.0 / 4294967296.0); /* (0, 1] */
            double u2 = (double)w[2 * p + 1] * (1.0 / 4294967296.0);     /* [0, 1) */
            double r = sqrt(-2.0 * log(u1));
            z[2 * p] = (float)(r * cos(2.0 * M_PI * u2));
            z[2 * p + 1] = (float)(r * sin(2.0 * M_PI * u2));
        }
        for (size_t j = 0; j < 4 && b * 4 + j < n; j++) out[b * 4 + j] = mean + std * z[j];
    }
    rng->counter += blocks;
}

void cm_rng_bernoulli(cm_rng *rng, uint8_t *out, size_t n, float p) {
    const size_t blocks = (n + 3) / 4, groups = (blocks + PB - 1) / PB;
#pragma omp parallel for if (groups > 256) schedule(static)
    for (size_t g = 0; g < groups; g++) {
        uint32_t w[4][PB];
        philox_lanes(rng->seed, rng->stream, rng->counter + g * PB, w);
        const size_t first = g * PB * 4;
        if (first + PB * 4 <= n) {
            for (int i = 0; i < PB; i++)
                for (int j = 0; j < 4; j++) out[first + (size_t)i * 4 + (size_t)j] = u32_to_unit(w[j][i]) < p ? 1 : 0;
        } else {
            for (size_t k = first; k < n; k++) out[k] = u32_to_unit(w[(k - first) % 4][(k - first) / 4]) < p ? 1 : 0;
        }
    }
    rng->counter += blocks;
}

/* Each draw uses two words (a 64-bit value), so a block gives two integers. */
void cm_rng_randint(cm_rng *rng, int64_t *out, size_t n, int64_t lo, int64_t hi) {
    const uint64_t range = (uint64_t)(hi - lo);
    const size_t blocks = (n + 1) / 2;
#pragma omp parallel for if (blocks > 4096) schedule(static)
    for (size_t b = 0; b < blocks; b++) {
        uint32_t w[4];
        cm_philox4x32(rng->seed, rng->stream, rng->counter + b, w);
        for (size_t j = 0; j < 2 && b * 2 + j < n; j++) {
            uint64_t x = ((uint64_t)w[2 * j + 1] << 32) | w[2 * j];
            out[b * 2 + j] = lo + (int64_t)(uint64_t)(((unsigned __int128)x * range) >> 64);
        }
    }
    rng->counter += blocks;
}
