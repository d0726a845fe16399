/* XXH3 hashing (libxxhash) and monotonic clocks. */
#include <composer/base.h>

#include <time.h>
#include <xxhash.h>

uint64_t cm_hash64(const void *data, size_t n, uint64_t seed) { return XXH3_64bits_withSeed(data, n, seed); }

uint64_t cm_clock_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double cm_clock_s(void) { return (double)cm_clock_ns() * 1e-9; }
