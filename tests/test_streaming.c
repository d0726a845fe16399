/* The streaming dataset in the dataloader: whole epochs equal Streaming's (several streams,
 * weights, shuffles, resumption points; tests/golden/streaming_order_vectors.json), resumption on
 * another number of ranks without replay (1 -> 3, 4 -> 2), a remote gives the same batches as
 * local files, the cache (shared by ranks, evicting under cache_limit, full), hash errors. */
#include "cmtest.h"

#include <cjson/cJSON.h>
#include <composer/streaming.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define GOLDEN "tests/golden/streaming_order_vectors.json"

static char *mktmp(void) {
    static char dirs[32][48];
    static int n;
    char *d = dirs[n++ % 32];
    snprintf(d, 48, "/tmp/cm_strm_XXXXXX");
    cr_assert_not_null(mkdtemp(d));
    return d;
}

/* Writes an MDS dataset whose shards hold exactly `sizes` samples; sample i has "y" = base + i
 * (int) and "tokens" = ndarray:int32 of 5 values base+i .. . Returns total samples. */
static int64_t write_shards(const char *dir, const int64_t *sizes, int n, int64_t base, const char *compression) {
    cm_mds_column cols[] = {{"y", "int"}, {"tokens", "ndarray:int32"}};
    char index[1 << 16];
    size_t at = (size_t)snprintf(index, sizeof index, "{\"shards\": [");
    int64_t id = base;
    for (int s = 0; s < n; s++) {
        char sub[300];
        snprintf(sub, sizeof sub, "%s/.part%d", dir, s);
        cm_mds_writer_config wc = cm_mds_writer_config_default();
        wc.size_limit = 0;
        wc.compression = compression;
        const char *h[] = {"sha1"};
        wc.hashes = h;
        wc.n_hashes = 1;
        cm_mds_writer *w;
        cr_assert_eq(cm_mds_writer_new(sub, cols, 2, &wc, &w), CM_OK, "%s", cm_last_error());
        for (int64_t k = 0; k < sizes[s]; k++, id++) {
            int32_t t[5];
            for (int q = 0; q < 5; q++) t[q] = (int32_t)(id + q);
            cm_mds_value v[2] = {{.data = &id, .size = 8}, {.data = t, .size = 20, .dtype = CM_MDS_DT_I32, .ndim = 1, .shape = {5}}};
            cr_assert_eq(cm_mds_writer_write(w, v), CM_OK, "%s", cm_last_error());
        }
        cr_assert_eq(cm_mds_writer_finish(w), CM_OK);
        cm_mds_writer_free(w);
        /* move the shard to its place and take its index entry with the new name */
        char p[400], q[400], cmd[900];
        const char *ext = compression ? (strncmp(compression, "zstd", 4) == 0 ? ".zstd" : ".gz") : "";
        snprintf(p, sizeof p, "%s/shard.00000.mds%s", sub, ext);
        snprintf(q, sizeof q, "%s/shard.%05d.mds%s", dir, s, ext);
        cr_assert_eq(rename(p, q), 0);
        snprintf(p, sizeof p, "%s/index.json", sub);
        FILE *f = fopen(p, "rb");
        char ix[8192];
        size_t n_ix = fread(ix, 1, sizeof ix - 1, f);
        fclose(f);
        ix[n_ix] = 0;
        char *b = strstr(ix, "[{") + 1, *e = strstr(ix, "}], \"version\"") + 1;
        *e = 0;
        char name[32];
        snprintf(name, sizeof name, "shard.%05d", s);
        for (char *x = b; (x = strstr(x, "shard.00000")); x += 11) memcpy(x, name, 11);
        at += (size_t)snprintf(index + at, sizeof index - at, "%s%s", s ? ", " : "", b);
        snprintf(cmd, sizeof cmd, "rm -rf %s", sub);
        cr_assert_eq(system(cmd), 0);
    }
    snprintf(index + at, sizeof index - at, "], \"version\": 2}");
    char p[400];
    snprintf(p, sizeof p, "%s/index.json", dir);
    FILE *f = fopen(p, "wb");
    fputs(index, f);
    fclose(f);
    return id - base;
}

static cJSON *load_json(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    b[n] = 0;
    cJSON *j = cJSON_Parse(b);
    free(b);
    return j;
}

static const char *opt_s(const cJSON *o, const char *k, const char *d) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : d;
}
static int64_t opt_i(const cJSON *o, const char *k, int64_t d) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? (int64_t)v->valuedouble : d;
}

/* Every rank's batches of one epoch, read through the dataloader, equal Streaming's partition
 * of that epoch (generate_work_random_batching) for the same configuration. */
Test(streaming, epochs_match_streaming) {
    cJSON *j = load_json(GOLDEN);
    const cJSON *c;
    int count = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(j, "epochs")) {
        const cJSON *streams = cJSON_GetObjectItemCaseSensitive(c, "streams"),
                    *sizes = cJSON_GetObjectItemCaseSensitive(c, "shard_sizes"),
                    *opts = cJSON_GetObjectItemCaseSensitive(c, "options");
        int ns = cJSON_GetArraySize(streams);
        cm_stream_config sc[8];
        int64_t base = 0;
        for (int k = 0; k < ns; k++) {
            const cJSON *st = cJSON_GetArrayItem(streams, k), *sz = cJSON_GetArrayItem(sizes, k);
            int64_t v[16];
            int n = cJSON_GetArraySize(sz);
            for (int q = 0; q < n; q++) v[q] = (int64_t)cJSON_GetArrayItem(sz, q)->valuedouble;
            char *d = mktmp();
            base += write_shards(d, v, n, base, NULL);
            const cJSON *pr = cJSON_GetObjectItemCaseSensitive(st, "proportion"), *rp = cJSON_GetObjectItemCaseSensitive(st, "repeat"),
                        *ch = cJSON_GetObjectItemCaseSensitive(st, "choose");
            sc[k] = (cm_stream_config){.local = d, .proportion = pr ? pr->valuedouble : -1, .repeat = rp ? rp->valuedouble : -1,
                                       .choose = ch ? (int64_t)ch->valuedouble : -1};
        }
        const int P = (int)opt_i(c, "nodes", 1), R = (int)opt_i(c, "ranks_per_node", 1), world = P * R;
        const int64_t B = opt_i(c, "batch_size", 1), epoch = opt_i(c, "epoch", 0), sie = opt_i(c, "sample_in_epoch", 0);
        int64_t nids;
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(c, "ids"), *shape = cJSON_GetObjectItemCaseSensitive(c, "shape");
        nids = cJSON_GetArraySize(ids);
        const int64_t nb = (int64_t)cJSON_GetArrayItem(shape, 3)->valuedouble;
        for (int r = 0; r < world; r++) {
            cm_streaming_config cfg = cm_streaming_config_default();
            cfg.streams = sc;
            cfg.n_streams = ns;
            cfg.batch_size = B;
            cfg.ranks_per_node = R;
            const cJSON *sh = cJSON_GetObjectItemCaseSensitive(opts, "shuffle");
            cfg.shuffle = sh ? cJSON_IsTrue(sh) : true;
            cfg.shuffle_algo = opt_s(opts, "shuffle_algo", "py1e");
            cfg.shuffle_block_size = opt_i(opts, "shuffle_block_size", 0);
            cfg.num_canonical_nodes = opt_i(opts, "num_canonical_nodes", 0);
            cfg.initial_physical_nodes = opt_i(opts, "initial_physical_nodes", 0);
            cfg.epoch_size = opt_i(opts, "epoch_size", 0);
            cfg.sampling_method = opt_s(opts, "sampling_method", "balanced");
            cfg.sampling_granularity = opt_i(opts, "sampling_granularity", 1);
            cm_dataset *ds;
            cr_assert_eq(cm_dataset_streaming_new(&cfg, r, world, &ds), CM_OK, "case %d: %s", count, cm_last_error());
            cm_dataloader_config lc = cm_dataloader_config_default();
            lc.batch_size = B * world;
            lc.drop_last = false;
            lc.rank = r;
            lc.world_size = world;
            lc.num_workers = r % 2; /* threads or not: the same batches */
            cm_dataloader *dl;
            cr_assert_eq(cm_dataloader_new(ds, &lc, &dl), CM_OK, "%s", cm_last_error());
            cr_assert_eq(cm_dataloader_set_state(dl, (cm_dataloader_state){epoch, sie}), CM_OK, "%s", cm_last_error());
            /* expected: this rank's row of the (P, R, 1, nb, B) array, -1 skipped */
            int64_t k = 0;
            cm_batch *b;
            while (cm_dataloader_next(dl, &b) == CM_OK && b) {
                const int64_t *y = cm_tensor_data(cm_batch_field(b, "y"));
                for (int64_t q = 0; q < b->n_rows; q++) {
                    while (k < nb * B && (int64_t)cJSON_GetArrayItem(ids, (int)(r * nb * B + k))->valuedouble < 0) k++;
                    cr_assert_lt(k, nb * B, "case %d rank %d: more samples than Streaming gives", count, r);
                    int64_t want = (int64_t)cJSON_GetArrayItem(ids, (int)(r * nb * B + k))->valuedouble;
                    cr_assert_eq(y[q], want, "case %d rank %d position %lld: sample %lld, Streaming %lld", count, r,
                                 (long long)k, (long long)y[q], (long long)want);
                    cr_assert_eq(b->indices[q], want);
                    k++;
                }
            }
            while (k < nb * B && (int64_t)cJSON_GetArrayItem(ids, (int)(r * nb * B + k))->valuedouble < 0) k++;
            cr_assert_eq(k, nb * B, "case %d rank %d: %lld of %lld positions seen", count, r, (long long)k, (long long)(nb * B));
            cm_dataloader_free(dl);
            cm_dataset_free(ds);
        }
        (void)nids;
        count++;
    }
    cr_assert_eq(count, 9);
    cJSON_Delete(j);
}

/* One rank group's loaders; returns each global step's sorted sample ids, steps x G. */
typedef struct group {
    int world;
    cm_dataset *ds[8];
    cm_dataloader *dl[8];
} group;

static void group_open(group *g, const char *local, const char *remote, int world, int64_t B, int64_t cache_limit) {
    g->world = world;
    for (int r = 0; r < world; r++) {
        cm_streaming_config cfg = cm_streaming_config_default();
        cfg.local = local;
        cfg.remote = remote;
        cfg.shuffle = true;
        cfg.shuffle_block_size = 40;
        cfg.batch_size = B / world;
        cfg.cache_limit = cache_limit;
        cfg.validate_hash = "sha1";
        cr_assert_eq(cm_dataset_streaming_new(&cfg, r, world, &g->ds[r]), CM_OK, "%s", cm_last_error());
        cm_dataloader_config lc = cm_dataloader_config_default();
        lc.batch_size = B;
        lc.rank = r;
        lc.world_size = world;
        lc.num_workers = 1;
        cr_assert_eq(cm_dataloader_new(g->ds[r], &lc, &g->dl[r]), CM_OK, "%s", cm_last_error());
    }
}

static void group_close(group *g) {
    for (int r = 0; r < g->world; r++) {
        cm_dataloader_free(g->dl[r]);
        cm_dataset_free(g->ds[r]);
    }
}

static int cmp64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Runs `steps` global steps (or to the end of the epoch); out gets each step's G ids, sorted. */
static int group_run(group *g, int steps, int64_t G, int64_t *out) {
    int s = 0;
    for (; s < steps; s++) {
        int64_t n = 0;
        bool end = false;
        for (int r = 0; r < g->world; r++) {
            cm_batch *b;
            cr_assert_eq(cm_dataloader_next(g->dl[r], &b), CM_OK, "%s", cm_last_error());
            if (!b) {
                end = true;
                continue;
            }
            const int64_t *y = cm_tensor_data(cm_batch_field(b, "y"));
            for (int64_t q = 0; q < b->n_rows; q++) out[s * G + n++] = y[q];
        }
        if (end) break;
        cr_assert_eq(n, G);
        qsort(out + s * G, (size_t)G, sizeof(int64_t), cmp64);
    }
    return s;
}

static void resume_across_world_sizes(int w1, int w2) {
    char *d = mktmp();
    const int64_t sizes[] = {40, 33, 50, 21};
    write_shards(d, sizes, 4, 0, NULL);
    const int64_t G = 12; /* divisible by 1, 2, 3, 4 */
    int64_t full[20 * 12], part[20 * 12];
    group g;
    group_open(&g, d, NULL, 1, G, 0);
    int n_full = group_run(&g, 20, G, full);
    group_close(&g);
    cr_assert_eq(n_full, 144 / 12);
    /* w1 ranks for 5 steps, state saved, w2 ranks resume from it */
    group_open(&g, d, NULL, w1, G, 0);
    int a = group_run(&g, 5, G, part);
    cm_dataloader_state st = cm_dataloader_get_state(g.dl[0]);
    for (int r = 1; r < w1; r++) cr_assert_eq(cm_dataloader_get_state(g.dl[r]).position, st.position);
    group_close(&g);
    cr_assert_eq(st.position, 5 * G);
    group_open(&g, d, NULL, w2, G, 0);
    for (int r = 0; r < w2; r++) cr_assert_eq(cm_dataloader_set_state(g.dl[r], st), CM_OK);
    int b = group_run(&g, 20, G, part + a * G);
    group_close(&g);
    cr_assert_eq(a + b, n_full, "%d + %d steps, uninterrupted %d", a, b, n_full);
    for (int64_t k = 0; k < n_full * G; k++)
        cr_assert_eq(part[k], full[k], "step %lld: sample %lld, uninterrupted 1-rank run %lld", (long long)(k / G),
                     (long long)part[k], (long long)full[k]);
}

Test(streaming, resume_1_to_3_ranks_without_replay) { resume_across_world_sizes(1, 3); }
Test(streaming, resume_4_to_2_ranks_without_replay) { resume_across_world_sizes(4, 2); }

Test(streaming, remote_equals_local_and_ranks_share_the_cache) {
    char *remote = mktmp(), *cache = mktmp(), *plain = mktmp();
    const int64_t sizes[] = {40, 33, 50, 21};
    write_shards(remote, sizes, 4, 0, "zstd:3");
    write_shards(plain, sizes, 4, 0, NULL);
    int64_t a[20 * 12], b[20 * 12];
    group g;
    char url[300];
    snprintf(url, sizeof url, "file://%s", remote);
    group_open(&g, cache, url, 3, 12, 0);
    int na = group_run(&g, 20, 12, a);
    int64_t fetched = 0;
    for (int r = 0; r < 3; r++) fetched += cm_streaming_n_fetched(g.ds[r]);
    cr_assert_eq(fetched, 4, "3 ranks on one cache fetch each of the 4 shards once, not %lld times", (long long)fetched);
    group_close(&g);
    group_open(&g, plain, NULL, 3, 12, 0);
    int nb = group_run(&g, 20, 12, b);
    group_close(&g);
    cr_assert_eq(na, nb);
    for (int k = 0; k < na * 12; k++) cr_assert_eq(a[k], b[k]);
    /* the cache holds raw shards; the compressed ones were removed (keep_zip false) */
    char p[400];
    struct stat stt;
    snprintf(p, sizeof p, "%s/shard.00002.mds", cache);
    cr_assert_eq(stat(p, &stt), 0);
    snprintf(p, sizeof p, "%s/shard.00002.mds.zstd", cache);
    cr_assert_neq(stat(p, &stt), 0);
}

Test(streaming, cache_limit_evicts_lru_shards_and_too_small_a_limit_is_refused) {
    char *remote = mktmp(), *cache = mktmp();
    const int64_t sizes[] = {40, 40, 40, 40, 40, 40};
    write_shards(remote, sizes, 6, 0, NULL);
    struct stat stt;
    char p[400];
    snprintf(p, sizeof p, "%s/shard.00000.mds", remote);
    stat(p, &stt);
    const int64_t shard = stt.st_size;
    snprintf(p, sizeof p, "%s/index.json", remote);
    stat(p, &stt);
    const int64_t limit = stt.st_size + 4 * shard + 10;
    int64_t a[20 * 12], b[20 * 12];
    group g;
    group_open(&g, cache, remote, 1, 12, limit);
    int na = group_run(&g, 20, 12, a);
    cr_assert_leq(cm_streaming_cache_usage(g.ds[0]), limit, "usage %lld over the limit %lld",
                  (long long)cm_streaming_cache_usage(g.ds[0]), (long long)limit);
    cr_assert_gt(cm_streaming_n_evicted(g.ds[0]), 0, "6 shards in room for 4: some were evicted");
    group_close(&g);
    group_open(&g, remote, NULL, 1, 12, 0);
    int nb = group_run(&g, 20, 12, b);
    group_close(&g);
    cr_assert_eq(na, nb);
    for (int k = 0; k < na * 12; k++) cr_assert_eq(a[k], b[k], "eviction changed the data");
    /* a cache_limit below Streaming's minimum is refused up front */
    cm_streaming_config cfg = cm_streaming_config_default();
    cfg.local = mktmp();
    cfg.remote = remote;
    cfg.batch_size = 4;
    cfg.cache_limit = 3 * shard;
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_streaming_new(&cfg, 0, 1, &ds), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "cache_limit"), "%s", cm_last_error());
    /* a cache filled by someone else's files: nothing to evict, a clear error */
    char *full = mktmp();
    cfg.local = full;
    cfg.cache_limit = limit;
    cr_assert_eq(cm_dataset_streaming_new(&cfg, 0, 1, &ds), CM_OK, "%s", cm_last_error());
    /* files that are not this dataset's shards do not count against cache_limit (Streaming counts its own) */
    snprintf(p, sizeof p, "%s/other.bin", full);
    FILE *f = fopen(p, "wb");
    cr_assert_eq(fseek(f, limit, SEEK_SET), 0);
    fputc(0, f);
    fclose(f);
    int64_t y;
    int32_t t[5];
    void *out[2] = {t, &y};
    cm_status st = cm_dataset_get(ds, 0, NULL, out);
    cr_assert_eq(st, CM_OK, "%s", cm_last_error());
    cm_dataset_free(ds);
}

Test(streaming, a_corrupt_remote_shard_is_a_hash_error_naming_it) {
    char *remote = mktmp(), *cache = mktmp();
    const int64_t sizes[] = {10, 10};
    write_shards(remote, sizes, 2, 0, "zstd:3");
    char p[400];
    snprintf(p, sizeof p, "%s/shard.00001.mds.zstd", remote);
    FILE *f = fopen(p, "r+b");
    fseek(f, 20, SEEK_SET);
    int ch = fgetc(f);
    fseek(f, 20, SEEK_SET);
    fputc(ch ^ 0x55, f);
    fclose(f);
    cm_streaming_config cfg = cm_streaming_config_default();
    cfg.local = cache;
    cfg.remote = remote;
    cfg.batch_size = 20;
    cfg.validate_hash = "sha1";
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_streaming_new(&cfg, 0, 1, &ds), CM_OK, "%s", cm_last_error());
    cm_dataloader_config lc = cm_dataloader_config_default();
    lc.batch_size = 20;
    cm_dataloader *dl;
    cr_assert_eq(cm_dataloader_new(ds, &lc, &dl), CM_OK);
    cm_batch *b;
    cr_assert_eq(cm_dataloader_next(dl, &b), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "shard.00001.mds.zstd") && strstr(cm_last_error(), "checksum"), "%s", cm_last_error());
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
}

Test(streaming, text_fields_and_bad_config) {
    char *d = mktmp();
    const int64_t sizes[] = {7};
    write_shards(d, sizes, 1, 100, NULL);
    cm_streaming_config cfg = cm_streaming_config_default();
    cfg.local = d;
    cfg.batch_size = 1;
    cfg.max_seq_len = 6;
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_streaming_new(&cfg, 0, 1, &ds), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_dataset_find_field(ds, "input_ids"), 0, "columns in index.json order: tokens, then y");
    cr_assert_eq(cm_dataset_find_field(ds, "labels"), 1);
    cr_assert_eq(cm_dataset_find_field(ds, "y"), 2);
    int64_t y, ids[6], labels[6];
    void *out[3] = {ids, labels, &y};
    cr_assert_eq(cm_dataset_get(ds, 3, NULL, out), CM_OK, "%s", cm_last_error());
    cr_assert_eq(y, 103);
    for (int t = 0; t < 5; t++) cr_assert_eq(ids[t], 103 + t);
    cr_assert_eq(ids[5], 0, "padded");
    for (int t = 0; t < 4; t++) cr_assert_eq(labels[t], 104 + t);
    cr_assert_eq(labels[4], -100, "no next token");
    cm_dataset_free(ds);
    cfg.shuffle_algo = "py9";
    cr_assert_eq(cm_dataset_streaming_new(&cfg, 0, 1, &ds), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "py9"), "%s", cm_last_error());
    cfg.shuffle_algo = "py1e";
    cfg.local = "/nonexistent/cm";
    cr_assert_eq(cm_dataset_streaming_new(&cfg, 0, 1, &ds), CM_ERR_NOT_FOUND);
    cr_assert(strstr(cm_last_error(), "index.json"), "%s", cm_last_error());
    cfg.local = d;
    cfg.batch_size = 0;
    cr_assert_eq(cm_dataset_streaming_new(&cfg, 0, 1, &ds), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "batch_size"), "%s", cm_last_error());
}
