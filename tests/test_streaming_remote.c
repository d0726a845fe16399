/* The streaming dataset on remote storage: shards fetched on demand from a real S3-compatible
 * server (s3rver on loopback behind tests/s3/s3proxy.py, which checks every signature and
 * injects faults) give the same batches as local files, are prefetched ahead of the order,
 * fetched once each, retried through 500s, connections cut mid-download and a server that stops
 * and comes back; a corrupt remote shard is an error naming it; a cache whose shards are all
 * held by other readers, and a full disk, are clear errors that lose nothing. (Ranks in separate
 * processes sharing one cache: tests/dist/run.sh streaming_shared_cache.) */
#define _GNU_SOURCE
#include "cms3.h"
#include "cmtest.h"

#include <composer/storage.h>
#include <composer/streaming.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char g_dirs[16][48];
static int g_n_dirs;

static char *mktmp(void) {
    cr_assert_lt(g_n_dirs, 16);
    char *d = g_dirs[g_n_dirs++];
    snprintf(d, 48, "/tmp/cm_strr_XXXXXX");
    cr_assert_not_null(mkdtemp(d));
    return d;
}

/* Removes the test's temporary folders (left in place when a test fails, for a look). */
static void rm_tmps(void) {
    for (int i = 0; i < g_n_dirs; i++) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "rm -rf %.48s", g_dirs[i]);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dirs[i]);
    }
    g_n_dirs = 0;
}

static void nap_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* n samples: "y" = i (int), "tokens" = 5 int32 from i; shards of at most size_limit bytes. */
static int write_ds(const char *dir, int64_t n, int64_t size_limit, const char *compression) {
    cm_mds_column cols[] = {{"y", "int"}, {"tokens", "ndarray:int32:5"}};
    cm_mds_writer_config wc = cm_mds_writer_config_default();
    wc.size_limit = size_limit;
    wc.compression = compression;
    const char *h[] = {"sha1"};
    wc.hashes = h;
    wc.n_hashes = 1;
    wc.exist_ok = true;
    cm_mds_writer *w;
    cr_assert_eq(cm_mds_writer_new(dir, cols, 2, &wc, &w), CM_OK, "%s", cm_last_error());
    for (int64_t i = 0; i < n; i++) {
        int32_t t[5];
        for (int q = 0; q < 5; q++) t[q] = (int32_t)(i * 7 + q);
        cm_mds_value v[2] = {{.data = &i, .size = 8}, {.data = t, .size = 20, .dtype = CM_MDS_DT_I32, .ndim = 1, .shape = {5}}};
        cr_assert_eq(cm_mds_writer_write(w, v), CM_OK, "%s", cm_last_error());
    }
    cr_assert_eq(cm_mds_writer_finish(w), CM_OK, "%s", cm_last_error());
    int shards = cm_mds_writer_n_shards(w);
    cm_mds_writer_free(w);
    return shards;
}

/* Uploads every file of `dir` to `uri`. */
static void upload_dir(const char *dir, const char *uri) {
    cm_object_store *st;
    cr_assert_eq(cm_object_store_open(uri, NULL, &st), CM_OK, "%s", cm_last_error());
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        cr_assert_eq(cm_object_store_upload(st, e->d_name, p), CM_OK, "%s", cm_last_error());
    }
    closedir(d);
    cm_object_store_close(st);
}

/* Files in dir whose name contains `part` (".part-": a download in progress or left behind). */
static int count_files(const char *dir, const char *part) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += strstr(e->d_name, part) != NULL;
    closedir(d);
    return n;
}

static cm_dataset *open_ds(const char *remote, const char *local, int64_t B, int64_t predownload, int retries) {
    cm_streaming_config cfg = cm_streaming_config_default();
    cfg.remote = remote;
    cfg.local = local;
    cfg.batch_size = B;
    cfg.predownload = predownload;
    cfg.download_retry = retries;
    cfg.validate_hash = "sha1";
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_streaming_new(&cfg, 0, 1, &ds), CM_OK, "%s", cm_last_error());
    return ds;
}

/* The epoch's "y" values in order; returns how many. */
static int64_t read_epoch(cm_dataset *ds, int64_t B, int64_t *ys, cm_status *err) {
    cm_dataloader_config lc = cm_dataloader_config_default();
    lc.batch_size = B;
    lc.shuffle = false;
    lc.drop_last = false;
    cm_dataloader *dl;
    cr_assert_eq(cm_dataloader_new(ds, &lc, &dl), CM_OK, "%s", cm_last_error());
    int64_t n = 0;
    cm_batch *b;
    cm_status st;
    while ((st = cm_dataloader_next(dl, &b)) == CM_OK && b) {
        const int64_t *y = cm_tensor_data(cm_batch_field(b, "y"));
        const int32_t *t = cm_tensor_data(cm_batch_field(b, "tokens"));
        for (int64_t q = 0; q < b->n_rows; q++) {
            cr_assert_eq(t[q * 5 + 4], (int32_t)(y[q] * 7 + 4), "sample %lld: tokens do not belong to it", (long long)y[q]);
            ys[n++] = y[q];
        }
    }
    cm_dataloader_free(dl);
    if (err) *err = st;
    else cr_assert_eq(st, CM_OK, "%s", cm_last_error());
    return n;
}

/* GETs of keys containing `key` that the proxy saw. */
static int count_gets(cmt_s3 *s3, const char *key) {
    static char buf[1 << 20];
    cmt_s3_ctl(s3, "stats", buf, sizeof buf);
    int n = 0;
    for (const char *p = buf; (p = strstr(p, "\"GET /")); p++) {
        const char *end = strchr(p + 1, '"');
        if (end && memmem(p, (size_t)(end - p), key, strlen(key))) n++;
    }
    return n;
}

static cmt_s3 g_s3;
static void s3_setup(void) {
    cmt_s3_start(&g_s3, "bkt");
    setenv("CM_STORAGE_RETRY_BACKOFF_S", "0.05", 1);
}
static void s3_teardown(void) {
    cmt_s3_stop(&g_s3);
    rm_tmps();
}

Test(streaming_remote, s3_equals_local_each_shard_fetched_once_and_prefetched_ahead, .init = s3_setup, .fini = s3_teardown,
     .timeout = 120) {
    char *src = mktmp(), *cache = mktmp();
    const int n_shards = write_ds(src, 300, 2000, "zstd");
    cr_assert_geq(n_shards, 5, "%d shards", n_shards);
    upload_dir(src, "s3://bkt/data/mds");
    /* one batch of 4 needs only shard 0; the prefetcher fetches the rest of the epoch ahead */
    cm_dataset *ds = open_ds("s3://bkt/data/mds", cache, 4, 300, 2);
    cm_dataloader_config lc = cm_dataloader_config_default();
    lc.batch_size = 4;
    lc.shuffle = false;
    lc.num_workers = 0;
    cm_dataloader *dl;
    cr_assert_eq(cm_dataloader_new(ds, &lc, &dl), CM_OK, "%s", cm_last_error());
    cm_batch *b;
    cr_assert_eq(cm_dataloader_next(dl, &b), CM_OK, "%s", cm_last_error());
    for (int i = 0; i < 250 && cm_streaming_n_fetched(ds) < n_shards; i++) nap_ms(20);
    cr_assert_eq(cm_streaming_n_fetched(ds), n_shards, "after one batch, %lld of %d shards fetched: nothing was "
                 "prefetched ahead of the order", (long long)cm_streaming_n_fetched(ds), n_shards);
    cm_dataloader_free(dl);
    /* the whole epoch equals the local dataset's */
    int64_t a[300], l[300];
    cr_assert_eq(read_epoch(ds, 4, a, NULL), 300);
    cm_dataset_free(ds);
    cm_dataset *loc = open_ds(NULL, src, 4, -1, 2);
    cr_assert_eq(read_epoch(loc, 4, l, NULL), 300);
    cm_dataset_free(loc);
    for (int i = 0; i < 300; i++) cr_assert_eq(a[i], l[i], "position %d: s3 %lld, local %lld", i, (long long)a[i], (long long)l[i]);
    /* each shard was downloaded once; the raw shards are cached and the compressed ones dropped */
    for (int k = 0; k < n_shards; k++) {
        char key[64];
        snprintf(key, sizeof key, "/mds/shard.%05d.mds.zstd", k);
        cr_assert_eq(count_gets(&g_s3, key), 1, "%s fetched %d times", key, count_gets(&g_s3, key));
    }
    cr_assert_eq(count_files(cache, ".mds.zstd"), 0);
    cr_assert_eq(count_files(cache, ".part-"), 0);
    /* a second dataset on the warm cache fetches nothing */
    ds = open_ds("s3://bkt/data/mds", cache, 4, 300, 2);
    cr_assert_eq(read_epoch(ds, 4, a, NULL), 300);
    cr_assert_eq(cm_streaming_n_fetched(ds), 0);
    cm_dataset_free(ds);
    cr_assert_eq(cmt_s3_stat(&g_s3, "refused"), 0);
    /* without `local`, a temporary folder of the remote's own (Streaming's default) */
    char tmpdir[300];
    snprintf(tmpdir, sizeof tmpdir, "%s/tmp", g_s3.dir);
    mkdir(tmpdir, 0755);
    setenv("TMPDIR", tmpdir, 1);
    ds = open_ds("s3://bkt/data/mds", NULL, 4, 0, 2);
    cr_assert_eq(read_epoch(ds, 4, a, NULL), 300);
    cr_assert_eq(cm_streaming_n_fetched(ds), n_shards);
    cm_dataset_free(ds);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "ls %s/composer-streaming/*/shard.00000.mds >/dev/null", tmpdir);
    cr_assert_eq(system(cmd), 0, "no cache under $TMPDIR/composer-streaming");
}

/* Reads an epoch on a thread of its own (the main thread restarts the server: a process started
 * by a thread dies with that thread, PR_SET_PDEATHSIG). No assertions off the main thread. */
typedef struct reader {
    cm_dataset *ds;
    int64_t *ys, n;
    cm_status st;
    char msg[1024];
} reader;

static void *reader_main(void *arg) {
    reader *r = arg;
    cm_dataloader_config lc = cm_dataloader_config_default();
    lc.batch_size = 8;
    lc.shuffle = false;
    lc.drop_last = false;
    cm_dataloader *dl;
    if ((r->st = cm_dataloader_new(r->ds, &lc, &dl))) return NULL;
    cm_batch *b;
    while ((r->st = cm_dataloader_next(dl, &b)) == CM_OK && b) {
        const int64_t *y = cm_tensor_data(cm_batch_field(b, "y"));
        for (int64_t q = 0; q < b->n_rows; q++) r->ys[r->n++] = y[q];
    }
    if (r->st) snprintf(r->msg, sizeof r->msg, "%s", cm_last_error());
    cm_dataloader_free(dl);
    return NULL;
}

Test(streaming_remote, s3_faults_are_retried_and_exhausted_retries_name_the_shard, .init = s3_setup,
     .fini = s3_teardown, .timeout = 120) {
    char *src = mktmp(), *cache = mktmp();
    const int n_shards = write_ds(src, 120, 2000, NULL);
    cr_assert_eq(n_shards, 3);
    upload_dir(src, "s3://bkt/ds");
    cm_dataset *loc = open_ds(NULL, src, 8, -1, 2);
    int64_t want[120], got[120];
    cr_assert_eq(read_epoch(loc, 8, want, NULL), 120);
    cm_dataset_free(loc);
    /* 500s on two shard downloads, a 503, a connection cut mid-body, and the server stopping
     * while a download is in flight (held in the proxy), back a second later */
    cm_dataset *ds = open_ds("s3://bkt/ds", cache, 8, 0, 8);
    cmt_s3_ctl(&g_s3, "fail?status=500&count=2&match=GET%20/bkt/ds/shard.00000", NULL, 0);
    cmt_s3_ctl(&g_s3, "cut?after=700&count=1&match=GET%20/bkt/ds/shard.00001", NULL, 0);
    cmt_s3_ctl(&g_s3, "fail?status=503&count=1&match=GET%20/bkt/ds/shard.00001", NULL, 0); /* on the resumed GET */
    cmt_s3_ctl(&g_s3, "delay?seconds=0.5&count=1&match=GET%20/bkt/ds/shard.00002", NULL, 0);
    reader rd = {ds, got, 0, CM_OK, ""};
    pthread_t th;
    pthread_create(&th, NULL, reader_main, &rd);
    for (int i = 0; i < 500 && count_gets(&g_s3, "/ds/shard.00002") == 0; i++) nap_ms(10);
    cr_assert_eq(count_gets(&g_s3, "/ds/shard.00002"), 1, "the download of shard 2 never started (%d GETs)", count_gets(&g_s3, "/ds/shard.00002"));
    cmt_s3_server_kill(&g_s3);
    nap_ms(1000);
    cmt_s3_server_restart(&g_s3);
    pthread_join(th, NULL);
    cr_assert_eq(rd.st, CM_OK, "%s", rd.msg);
    cr_assert_eq(rd.n, 120);
    for (int i = 0; i < 120; i++) cr_assert_eq(got[i], want[i], "position %d", i);
    cr_assert_eq(cm_streaming_n_fetched(ds), n_shards);
    cr_assert_geq(cmt_s3_stat(&g_s3, "faults"), 5, "the injected faults were not all hit");
    cr_assert_geq(count_gets(&g_s3, "/ds/shard.00002"), 2, "shard 2's download was not retried after the server stopped");
    cr_assert_eq(count_files(cache, ".part-"), 0, "a partial download was left in the cache");
    cm_dataset_free(ds);
    /* the server gone for good: a clear error naming the shard's URI, nothing partial cached */
    char *cache2 = mktmp();
    ds = open_ds("s3://bkt/ds", cache2, 8, 0, 2);
    cmt_s3_server_kill(&g_s3);
    cm_status st;
    read_epoch(ds, 8, got, &st);
    cr_assert_eq(st, CM_ERR_IO, "%s", cm_last_error());
    cr_assert(strstr(cm_last_error(), "s3://bkt/ds/shard.00000.mds"), "%s", cm_last_error());
    cr_assert_eq(count_files(cache2, ".mds") - count_files(cache2, ".mds.lock"), 0, "a shard was left in the cache");
    cr_assert_eq(count_files(cache2, ".part-"), 0, "a partial download was left in the cache");
    cm_dataset_free(ds);
    cmt_s3_server_restart(&g_s3);
}

Test(streaming_remote, s3_corrupt_or_truncated_shard_is_an_error_naming_it_and_is_fetched_anew, .init = s3_setup,
     .fini = s3_teardown, .timeout = 120) {
    char *src = mktmp(), *cache = mktmp(), *zsrc = mktmp(), *zcache = mktmp();
    write_ds(src, 60, 800, NULL);
    write_ds(zsrc, 60, 800, "zstd");
    upload_dir(src, "s3://bkt/raw");
    upload_dir(zsrc, "s3://bkt/zip");
    /* a flipped byte in a raw shard on the bucket: the hash names it and where it came from */
    char p[400];
    snprintf(p, sizeof p, "%s/shard.00001.mds", src);
    char bad[400];
    snprintf(bad, sizeof bad, "%s/bad.mds", cache);
    char cmd[2000];
    snprintf(cmd, sizeof cmd, "cp %s %s && printf 'X' | dd of=%s bs=1 seek=200 conv=notrunc 2>/dev/null", p, bad, bad);
    cr_assert_eq(system(cmd), 0);
    cm_object_store *st;
    cr_assert_eq(cm_object_store_open("s3://bkt", NULL, &st), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_object_store_upload(st, "raw/shard.00001.mds", bad), CM_OK, "%s", cm_last_error());
    unlink(bad);
    cm_dataset *ds = open_ds("s3://bkt/raw", cache, 10, 0, 2);
    int64_t got[60];
    cm_status s;
    read_epoch(ds, 10, got, &s);
    cr_assert_eq(s, CM_ERR_FORMAT, "%s", cm_last_error());
    cr_assert(strstr(cm_last_error(), "shard.00001.mds") && strstr(cm_last_error(), "checksum") &&
                  strstr(cm_last_error(), "s3://bkt/raw/shard.00001.mds"),
              "%s", cm_last_error());
    snprintf(p, sizeof p, "%s/shard.00001.mds", cache);
    cr_assert_neq(access(p, F_OK), 0, "the corrupt copy was kept in the cache");
    /* repaired on the bucket: the same dataset fetches it anew and reads everything */
    snprintf(p, sizeof p, "%s/shard.00001.mds", src);
    cr_assert_eq(cm_object_store_upload(st, "raw/shard.00001.mds", p), CM_OK, "%s", cm_last_error());
    cr_assert_eq(read_epoch(ds, 10, got, NULL), 60);
    for (int i = 0; i < 60; i++) cr_assert_eq(got[i], i);
    cm_dataset_free(ds);
    /* a truncated compressed shard: its size names it */
    snprintf(p, sizeof p, "%s/shard.00002.mds.zstd", zsrc);
    snprintf(bad, sizeof bad, "%s/short.zstd", zcache);
    snprintf(cmd, sizeof cmd, "head -c 100 %s > %s", p, bad);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(cm_object_store_upload(st, "zip/shard.00002.mds.zstd", bad), CM_OK, "%s", cm_last_error());
    unlink(bad);
    ds = open_ds("s3://bkt/zip", zcache, 10, 0, 2);
    read_epoch(ds, 10, got, &s);
    cr_assert_eq(s, CM_ERR_FORMAT, "%s", cm_last_error());
    cr_assert(strstr(cm_last_error(), "shard.00002.mds.zstd") && strstr(cm_last_error(), "100 bytes"), "%s", cm_last_error());
    cr_assert_eq(count_files(zcache, ".zstd"), 0, "the truncated download was kept");
    cm_dataset_free(ds);
    cm_object_store_close(st);
}

/* ---- the cache, without a server (file:// remote) --------------------------------------------- */

/* Holds a shared lock on the lock file of every shard present in `cache`, as readers in other
 * processes mapping them would. */
static int hold_all(const char *cache, int *fds) {
    int n = 0;
    DIR *d = opendir(cache);
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (strncmp(e->d_name, "shard.", 6) || l < 4 || strcmp(e->d_name + l - 4, ".mds")) continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s.lock", cache, e->d_name);
        fds[n] = open(p, O_RDWR | O_CREAT, 0666);
        cr_assert_geq(fds[n], 0);
        cr_assert_eq(flock(fds[n], LOCK_SH), 0);
        n++;
    }
    closedir(d);
    return n;
}

Test(streaming_remote, full_cache_with_every_shard_held_is_a_clear_error_then_recovers) {
    char *src = mktmp(), *cache = mktmp();
    const int n_shards = write_ds(src, 120, 800, NULL);
    cr_assert_geq(n_shards, 6);
    struct stat sb;
    char p[400];
    int64_t biggest = 0;
    for (int k = 0; k < n_shards; k++) {
        snprintf(p, sizeof p, "%s/shard.%05d.mds", src, k);
        cr_assert_eq(stat(p, &sb), 0);
        if (sb.st_size > biggest) biggest = sb.st_size;
    }
    snprintf(p, sizeof p, "%s/index.json", src);
    stat(p, &sb);
    char url[300];
    snprintf(url, sizeof url, "file://%s", src);
    cm_streaming_config cfg = cm_streaming_config_default();
    cfg.remote = url;
    cfg.local = cache;
    cfg.batch_size = 4;
    cfg.predownload = 0;
    cfg.cache_limit = sb.st_size + 4 * biggest + 100; /* room for four shards */
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_streaming_new(&cfg, 0, 1, &ds), CM_OK, "%s", cm_last_error());
    int64_t y;
    int32_t t[5];
    void *out[2] = {t, &y};
    /* fill the cache: the samples of shards 0..3 */
    for (int64_t i = 0; i < 120 && cm_streaming_n_fetched(ds) < 4; i++)
        cr_assert_eq(cm_dataset_get(ds, i, NULL, out), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_streaming_n_fetched(ds), 4);
    /* every cached shard held by other readers: after a bounded wait, a clear error, nothing lost */
    int fds[64];
    const int held = hold_all(cache, fds);
    cr_assert_eq(held, 4);
    int64_t last = 119;
    double t0 = cm_clock_s();
    cm_status st = cm_dataset_get(ds, last, NULL, out);
    double waited = cm_clock_s() - t0;
    cr_assert_eq(st, CM_ERR_IO, "%s", cm_last_error());
    cr_assert(strstr(cm_last_error(), "is full") && strstr(cm_last_error(), "held by readers") &&
                  strstr(cm_last_error(), "cache_limit") && strstr(cm_last_error(), cache),
              "%s", cm_last_error());
    cr_assert(waited >= 1.5 && waited < 10, "waited %.2f s", waited);
    cr_assert_eq(cm_streaming_n_evicted(ds), 0);
    cr_assert_eq(count_files(cache, ".part-"), 0);
    /* one released: it is evicted and the read goes on */
    flock(fds[0], LOCK_UN);
    cr_assert_eq(cm_dataset_get(ds, last, NULL, out), CM_OK, "%s", cm_last_error());
    cr_assert_eq(y, last);
    cr_assert_eq(cm_streaming_n_evicted(ds), 1);
    cr_assert_leq(cm_streaming_cache_usage(ds), cfg.cache_limit);
    for (int k = 0; k < held; k++) close(fds[k]);
    cm_dataset_free(ds);
    rm_tmps();
}

Test(streaming_remote, full_disk_while_fetching_is_a_clear_error_and_leaves_nothing_partial) {
    char *src = mktmp(), *cache = mktmp();
    write_ds(src, 60, 800, NULL);
    char url[300];
    snprintf(url, sizeof url, "file://%s", src);
    cm_dataset *ds = open_ds(url, cache, 4, 0, 2); /* index.json is fetched before the disk fills */
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl, old;
    getrlimit(RLIMIT_FSIZE, &old);
    rl = old;
    rl.rlim_cur = 600; /* smaller than any shard */
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
    int64_t y;
    int32_t t[5];
    void *out[2] = {t, &y};
    cm_status st = cm_dataset_get(ds, 0, NULL, out);
    setrlimit(RLIMIT_FSIZE, &old);
    cr_assert_eq(st, CM_ERR_IO, "%s", cm_last_error());
    cr_assert(strstr(cm_last_error(), cache), "the message names the cache file: %s", cm_last_error());
    cr_assert_eq(count_files(cache, ".part-"), 0, "a partial download was left");
    char p[400];
    snprintf(p, sizeof p, "%s/shard.00000.mds", cache);
    cr_assert_neq(access(p, F_OK), 0, "a partial shard was left under its name");
    /* room again: the same dataset goes on */
    cr_assert_eq(cm_dataset_get(ds, 0, NULL, out), CM_OK, "%s", cm_last_error());
    cr_assert_eq(y, 0);
    cm_dataset_free(ds);
    rm_tmps();
}
