/* Streaming's sample order against vectors made with the real Streaming code and numpy 1.24.2:
 * ../shared/data/vectors/streaming_shuffle_partition_vectors.json (PRNG, 13 shuffles, partitions)
 * and tests/golden/streaming_order_vectors.json (tests/golden/gen_streaming_vectors.py: numpy's
 * integers/uniform/choice, py1b, more partitions incl. relaxed resumption, stream weighting and
 * whole epochs of a StreamingDataset with several streams). */
#include "cmtest.h"

#include <cjson/cJSON.h>
#include <composer/streaming.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/stream_order_impl.h"

static cJSON *load_json(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    b[n] = 0;
    cJSON *j = cJSON_Parse(b);
    free(b);
    cr_assert_not_null(j, "bad JSON in %s", path);
    return j;
}

static int64_t num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    cr_assert(cJSON_IsNumber(v) || cJSON_IsString(v), "missing %s", k);
    return cJSON_IsString(v) ? (int64_t)strtoull(v->valuestring, NULL, 10) : (int64_t)v->valuedouble;
}

static uint64_t u64s(const cJSON *v) { return strtoull(v->valuestring, NULL, 10); }

static int64_t *int_array(const cJSON *a, int64_t *n) {
    *n = cJSON_GetArraySize(a);
    int64_t *v = malloc(sizeof(int64_t) * (size_t)(*n + 1));
    for (int64_t i = 0; i < *n; i++) v[i] = (int64_t)cJSON_GetArrayItem(a, (int)i)->valuedouble;
    return v;
}

#define SHARED "../shared/data/vectors/streaming_shuffle_partition_vectors.json"
#define GOLDEN "tests/golden/streaming_order_vectors.json"

Test(streaming_order, pcg64_matches_numpy) {
    cJSON *j = load_json(SHARED);
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(j, "prng")) {
        uint64_t seed = (uint64_t)num(c, "seed");
        uint64_t st[4];
        cmi_seedseq_state(seed, 0, st);
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(c, "seedseq_state_u64x4");
        for (int i = 0; i < 4; i++)
            cr_assert_eq(st[i], u64s(cJSON_GetArrayItem(want, i)), "seed %llu state word %d", (unsigned long long)seed, i);
        cmi_pcg64 g;
        cmi_pcg64_seed(&g, seed, 0);
        const cJSON *outs = cJSON_GetObjectItemCaseSensitive(c, "first_5_next_uint64");
        for (int i = 0; i < 5; i++) cr_assert_eq(cmi_pcg64_next64(&g), u64s(cJSON_GetArrayItem(outs, i)));
        int64_t perm[10], n;
        for (int i = 0; i < 10; i++) perm[i] = i;
        cmi_pcg64_seed(&g, seed, 0); /* the permutation is of a fresh generator (checked with numpy) */
        cmi_pcg64_shuffle(&g, perm, 10);
        int64_t *w = int_array(cJSON_GetObjectItemCaseSensitive(c, "then_permutation_10"), &n);
        for (int i = 0; i < 10; i++) cr_assert_eq(perm[i], w[i], "seed %llu permutation[%d]", (unsigned long long)seed, i);
        free(w);
    }
    cJSON_Delete(j);
}

static void check_shuffles(const char *path) {
    cJSON *j = load_json(path);
    const cJSON *c;
    int count = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(j, "shuffle")) {
        int64_t ns, n;
        int64_t *sizes = int_array(cJSON_GetObjectItemCaseSensitive(c, "shard_sizes"), &ns);
        int64_t *want = int_array(cJSON_GetObjectItemCaseSensitive(c, "ids"), &n);
        int64_t *got = malloc(sizeof(int64_t) * (size_t)(n + 1));
        const char *algo = cJSON_GetObjectItemCaseSensitive(c, "algo")->valuestring;
        cr_assert_eq(cm_streaming_shuffle(algo, sizes, ns, num(c, "num_canonical_nodes"), (uint64_t)num(c, "seed"),
                                          num(c, "epoch"), num(c, "block_size"), got),
                     CM_OK, "%s", cm_last_error());
        for (int64_t i = 0; i < n; i++)
            cr_assert_eq(got[i], want[i], "%s case %d (%s, %lld shards, ncn %lld, seed %lld, epoch %lld, block %lld): "
                                          "ids[%lld] = %lld, Streaming %lld",
                         path, count, algo, (long long)ns, (long long)num(c, "num_canonical_nodes"),
                         (long long)num(c, "seed"), (long long)num(c, "epoch"), (long long)num(c, "block_size"),
                         (long long)i, (long long)got[i], (long long)want[i]);
        free(sizes);
        free(want);
        free(got);
        count++;
    }
    cr_assert_gt(count, 0);
    cJSON_Delete(j);
}

Test(streaming_order, shuffles_match_streaming) { check_shuffles(SHARED); }
Test(streaming_order, more_shuffles_match_streaming) { check_shuffles(GOLDEN); }

static void check_partitions(const char *path) {
    cJSON *j = load_json(path);
    const cJSON *c;
    int count = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(j, "partition")) {
        const char *algo = cJSON_GetObjectItemCaseSensitive(c, "algo")->valuestring;
        int64_t *out = NULL, shape[5];
        const cJSON *err = cJSON_GetObjectItemCaseSensitive(c, "error");
        if (err) {
            int64_t na;
            int64_t *a = int_array(cJSON_GetObjectItemCaseSensitive(c, "args"), &na);
            cr_assert_eq(na, 8);
            cr_assert_eq(cm_streaming_partition(algo, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], &out, shape),
                         CM_ERR_INVALID_ARG);
            cr_assert(strstr(cm_last_error(), err->valuestring), "message '%s', Streaming's '%s'", cm_last_error(),
                      err->valuestring);
            free(a);
            count++;
            continue;
        }
        const cJSON *ipn = cJSON_GetObjectItemCaseSensitive(c, "initial_physical_nodes");
        cr_assert_eq(cm_streaming_partition(algo, num(c, "num_samples"), num(c, "num_canonical_nodes"),
                                            num(c, "num_physical_nodes"), num(c, "ranks_per_node"),
                                            num(c, "workers_per_rank"), num(c, "batch_size"), num(c, "drop_first"),
                                            cJSON_IsNumber(ipn) ? (int64_t)ipn->valuedouble : 0, &out, shape),
                     CM_OK, "%s", cm_last_error());
        int64_t ns, n;
        int64_t *wshape = int_array(cJSON_GetObjectItemCaseSensitive(c, "shape"), &ns);
        int64_t *want = int_array(cJSON_GetObjectItemCaseSensitive(c, "ids"), &n);
        for (int d = 0; d < 5; d++) cr_assert_eq(shape[d], wshape[d], "%s partition %d: dim %d is %lld, Streaming %lld", path, count, d, (long long)shape[d], (long long)wshape[d]);
        for (int64_t i = 0; i < n; i++)
            cr_assert_eq(out[i], want[i], "%s partition %d: ids[%lld] = %lld, Streaming %lld", path, count, (long long)i,
                         (long long)out[i], (long long)want[i]);
        cm_free(out);
        free(wshape);
        free(want);
        count++;
    }
    cr_assert_gt(count, 0);
    cJSON_Delete(j);
}

Test(streaming_order, partitions_match_streaming) { check_partitions(SHARED); }
Test(streaming_order, more_partitions_match_streaming) { check_partitions(GOLDEN); }

Test(streaming_order, numpy_draws_match) {
    cJSON *j = load_json(GOLDEN);
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(j, "integers")) {
        cmi_pcg64 g;
        cmi_pcg64_seed(&g, (uint64_t)num(c, "seed"), 0);
        int64_t n;
        int64_t *want = int_array(cJSON_GetObjectItemCaseSensitive(c, "values"), &n);
        for (int64_t i = 0; i < n; i++) {
            int64_t v = cmi_pcg64_integers(&g, num(c, "low"), num(c, "high"));
            cr_assert_eq(v, want[i], "integers(%lld, %lld) draw %lld: %lld, numpy %lld", (long long)num(c, "low"),
                         (long long)num(c, "high"), (long long)i, (long long)v, (long long)want[i]);
        }
        free(want);
    }
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(j, "uniform")) {
        cmi_pcg64 g;
        cmi_pcg64_seed(&g, (uint64_t)num(c, "seed"), 0);
        const cJSON *v;
        double lo = cJSON_GetObjectItemCaseSensitive(c, "low")->valuedouble, hi = cJSON_GetObjectItemCaseSensitive(c, "high")->valuedouble;
        cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(c, "values")) {
            double got = cmi_pcg64_uniform(&g, lo, hi);
            cr_assert_eq(got, v->valuedouble, "uniform(%g, %g): %.17g, numpy %.17g", lo, hi, got, v->valuedouble);
        }
    }
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(j, "choice")) {
        cmi_pcg64 g;
        cmi_pcg64_seed(&g, (uint64_t)num(c, "seed"), 0);
        int64_t n;
        int64_t *want = int_array(cJSON_GetObjectItemCaseSensitive(c, "values"), &n);
        int64_t *got = malloc(sizeof(int64_t) * (size_t)(n + 1));
        cr_assert_eq(cmi_pcg64_choice(&g, num(c, "n"), n, got), CM_OK);
        for (int64_t i = 0; i < n; i++)
            cr_assert_eq(got[i], want[i], "choice(%lld, %lld)[%lld]: %lld, numpy %lld", (long long)num(c, "n"),
                         (long long)n, (long long)i, (long long)got[i], (long long)want[i]);
        /* and the next draw agrees too (the same number of draws was used) */
        cr_assert_eq((int64_t)cmi_pcg64_next64(&g), (int64_t)u64s(cJSON_GetObjectItemCaseSensitive(c, "next")));
        free(want);
        free(got);
    }
    cJSON_Delete(j);
}

Test(streaming_order, bad_arguments_are_named) {
    int64_t sizes[2] = {3, 4}, ids[7];
    cr_assert_eq(cm_streaming_shuffle("py3x", sizes, 2, 1, 0, 0, 10, ids), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "'py3x'") && strstr(cm_last_error(), "py1e"), "%s", cm_last_error());
    cr_assert_eq(cm_streaming_shuffle("py1e", sizes, 2, 8, 0, 0, 10, ids), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "num_canonical_nodes"), "%s", cm_last_error());
    int64_t *out, shape[5];
    cr_assert_eq(cm_streaming_partition("orig", 10, 3, 2, 1, 1, 1, 0, 0, &out, shape), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "divide"), "%s", cm_last_error());
    cr_assert_eq(cm_streaming_partition("fancy", 10, 1, 1, 1, 1, 1, 0, 0, &out, shape), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_streaming_partition("orig", 10, 1, 1, 1, 1, 1, 12, 0, &out, shape), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "Resuming further"), "%s", cm_last_error());
}
