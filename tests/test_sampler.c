/* The sampler: a bijection per epoch for many lengths and seeds, different orders per epoch and
 * seed, a uniform-looking first position, a pinned order (checkpoints depend on it), and the rank
 * slices of a global batch. */
#include "cmtest.h"

#include <stdlib.h>
#include <string.h>

Test(sampler, every_epoch_is_a_bijection_for_many_lengths_and_seeds) {
    const int64_t lens[] = {1, 2, 3, 7, 8, 9, 1000, 1024, (1 << 16) + 3};
    const uint64_t seeds[] = {0, 1, 42, 0xDEADBEEFCAFEull};
    const int64_t epochs[] = {0, 1, 17};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const int64_t n = lens[li];
        uint8_t *seen = malloc((size_t)n);
        for (size_t si = 0; si < sizeof seeds / sizeof seeds[0]; si++)
            for (size_t ei = 0; ei < sizeof epochs / sizeof epochs[0]; ei++) {
                cm_sampler s;
                cr_assert_eq(cm_sampler_init(&s, n, true, seeds[si]), CM_OK);
                memset(seen, 0, (size_t)n);
                for (int64_t p = 0; p < n; p++) {
                    int64_t i = cm_sampler_index(&s, epochs[ei], p);
                    cr_assert(i >= 0 && i < n, "len %lld seed %llu epoch %lld pos %lld: index %lld out of range",
                              (long long)n, (unsigned long long)seeds[si], (long long)epochs[ei], (long long)p,
                              (long long)i);
                    cr_assert_eq(seen[i], 0, "len %lld seed %llu epoch %lld: index %lld visited twice (pos %lld)",
                                 (long long)n, (unsigned long long)seeds[si], (long long)epochs[ei], (long long)i,
                                 (long long)p);
                    seen[i] = 1;
                }
            }
        free(seen);
    }
}

static int64_t n_fixed_differences(const cm_sampler *a, int64_t ea, const cm_sampler *b, int64_t eb) {
    int64_t d = 0;
    for (int64_t p = 0; p < a->len; p++) d += cm_sampler_index(a, ea, p) != cm_sampler_index(b, eb, p);
    return d;
}

Test(sampler, epochs_and_seeds_give_different_orders) {
    cm_sampler s, t;
    cm_sampler_init(&s, 1000, true, 7);
    cm_sampler_init(&t, 1000, true, 8);
    for (int64_t e = 0; e < 4; e++) {
        int64_t d = n_fixed_differences(&s, e, &s, e + 1);
        cr_assert_gt(d, 950, "epochs %lld and %lld agree at %lld of 1000 positions (want < 50)", (long long)e,
                     (long long)e + 1, 1000 - (long long)d);
        d = n_fixed_differences(&s, e, &t, e);
        cr_assert_gt(d, 950, "seeds 7 and 8 agree at %lld of 1000 positions in epoch %lld", 1000 - (long long)d,
                     (long long)e);
    }
    /* not the identity either */
    cm_sampler id;
    cm_sampler_init(&id, 1000, false, 7);
    cr_assert_gt(n_fixed_differences(&s, 0, &id, 0), 950);
}

Test(sampler, first_position_is_uniform_over_epochs) {
    /* chi-squared of the index at position 0 over 20000 epochs, 10 bins: 9 degrees of freedom,
     * P(chi2 > 30) ~ 4e-4 for a uniform draw. Also both orders of 2 appear about equally. */
    cm_sampler s;
    cm_sampler_init(&s, 10, true, 3);
    int64_t count[10] = {0};
    const int64_t E = 20000;
    for (int64_t e = 0; e < E; e++) count[cm_sampler_index(&s, e, 0)]++;
    double chi2 = 0;
    for (int i = 0; i < 10; i++) chi2 += (count[i] - E / 10.0) * (count[i] - E / 10.0) / (E / 10.0);
    cr_assert_lt(chi2, 30.0, "chi-squared %.1f over 10 bins (limit 30): the first index is not uniform", chi2);
    cm_sampler two;
    cm_sampler_init(&two, 2, true, 3);
    int64_t swapped = 0;
    for (int64_t e = 0; e < 2000; e++) swapped += cm_sampler_index(&two, e, 0) == 1;
    cr_assert(swapped > 850 && swapped < 1150, "len 2: swapped in %lld of 2000 epochs (want 850..1150)",
              (long long)swapped);
}

Test(sampler, order_is_pinned_because_checkpoints_resume_by_position) {
    /* If this changes, every saved dataloader position means different samples: bump a format
     * version instead of changing the permutation silently. */
    cm_sampler s;
    cm_sampler_init(&s, 10, true, 42);
    const int64_t want0[10] = {3, 1, 9, 0, 6, 5, 8, 2, 4, 7};
    const int64_t want1[10] = {5, 7, 8, 2, 0, 4, 3, 9, 6, 1};
    for (int p = 0; p < 10; p++) {
        cr_assert_eq(cm_sampler_index(&s, 0, p), want0[p], "epoch 0 pos %d: %lld, pinned %lld", p,
                     (long long)cm_sampler_index(&s, 0, p), (long long)want0[p]);
        cr_assert_eq(cm_sampler_index(&s, 1, p), want1[p], "epoch 1 pos %d: %lld, pinned %lld", p,
                     (long long)cm_sampler_index(&s, 1, p), (long long)want1[p]);
    }
}

Test(sampler, sequential_without_shuffle_and_out_of_range_is_minus_one) {
    cm_sampler s;
    cr_assert_eq(cm_sampler_init(&s, 5, false, 99), CM_OK);
    for (int64_t p = 0; p < 5; p++) cr_assert_eq(cm_sampler_index(&s, 3, p), p);
    cr_assert_eq(cm_sampler_index(&s, 0, 5), -1);
    cr_assert_eq(cm_sampler_index(&s, 0, -1), -1);
    cr_assert_eq(cm_sampler_index(&s, -1, 0), -1);
    cr_assert_eq(cm_sampler_init(&s, 0, true, 0), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "len 0"), "%s", cm_last_error());
}

Test(sampler, rank_slices_tile_the_batch_and_differ_by_at_most_one) {
    for (int64_t B = 0; B <= 40; B++)
        for (int N = 1; N <= 8; N++) {
            int64_t next = 0, lo = B, hi = 0;
            for (int r = 0; r < N; r++) {
                int64_t b, c;
                cm_data_rank_slice(B, r, N, &b, &c);
                cr_assert_eq(b, next, "B %lld N %d rank %d begins at %lld, expected %lld", (long long)B, N, r,
                             (long long)b, (long long)next);
                next = b + c;
                lo = c < lo ? c : lo;
                hi = c > hi ? c : hi;
                if (r > 0) {
                    int64_t pb, pc;
                    cm_data_rank_slice(B, r - 1, N, &pb, &pc);
                    cr_assert_geq(pc, c, "earlier ranks take the extra samples");
                }
            }
            cr_assert_eq(next, B, "B %lld N %d: slices cover %lld", (long long)B, N, (long long)next);
            cr_assert_leq(hi - lo, 1, "B %lld N %d: slice sizes %lld..%lld", (long long)B, N, (long long)lo,
                          (long long)hi);
        }
}
