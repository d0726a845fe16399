/* Samples per second of the streaming dataset (streaming.h) through the dataloader: the CIFAR-10
 * test split as MDS shards ("x" pil, "y" int, 4 MB shards), read into normalised f32 images as a
 * training run would, from
 *   local      the shards read in place (compressed ones are decompressed beside themselves on
 *              the first read, as Streaming does, so with zstd this row includes that cost)
 *   s3 cold    a loopback S3 server (s3rver, started here) into an empty cache
 *   s3 warm    the same again, every shard already cached
 *   file cold  a file:// remote into an empty cache (the copy-through cost without HTTP)
 * Usage (from the repository root): bench_streaming [samples=10000] [compression=none|zstd] [workers=2]
 * s3rver comes from scripts/install-deps (CM_S3RVER overrides its path); without it the S3 rows
 * are skipped. Prints a table and appends to bench/results/streaming.tsv. On a shared machine the
 * figures are only indicative. */
#define _GNU_SOURCE
#include <composer/composer.h>
#include <composer/storage.h>
#include <composer/streaming.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(call)                                                                        \
    do {                                                                                   \
        if ((call) != CM_OK) {                                                             \
            fprintf(stderr, "bench_streaming: %s failed: %s\n", #call, cm_last_error()); \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &l)) return -1;
    close(fd);
    return ntohs(a.sin_port);
}

static bool port_open(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    bool ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* s3rver on a free loopback port with bucket "bench"; its pid, or -1 when it is not installed. */
static pid_t start_s3rver(const char *dir, int *port) {
    const char *bin = getenv("CM_S3RVER");
    if (!bin || !*bin) bin = "/usr/local/lib/composer-test-tools/node_modules/.bin/s3rver";
    if (access(bin, X_OK) != 0) return -1;
    *port = free_port();
    char data[600], ps[16];
    snprintf(data, sizeof data, "%s/s3data", dir);
    mkdir(data, 0755);
    snprintf(ps, sizeof ps, "%d", *port);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
        setenv("NODE_OPTIONS", "--openssl-legacy-provider", 1);
        execl(bin, bin, "-d", data, "-a", "127.0.0.1", "-p", ps, "--silent", "--configure-bucket", "bench", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 300 && !port_open(*port); i++) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (!port_open(*port)) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    char ep[64];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", *port);
    setenv("S3_ENDPOINT_URL", ep, 1);
    setenv("AWS_ACCESS_KEY_ID", "S3RVER", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "S3RVER", 1);
    setenv("AWS_REGION", "us-east-1", 1);
    return pid;
}

static void rm_rf(const char *dir) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "bench_streaming: could not remove %s\n", dir);
}

/* One epoch through the loader; returns samples/s and the shards the dataset fetched. */
static double epoch_rate(const char *remote, const char *local, int workers, int64_t *fetched, int64_t *n_out) {
    cm_streaming_config sc = cm_streaming_config_default();
    sc.remote = remote;
    sc.local = local;
    sc.batch_size = 256;
    sc.image_h = sc.image_w = 32;
    sc.image_c = 3;
    cm_cifar10_config cc = cm_cifar10_config_default();
    for (int c = 0; c < 3; c++) sc.image_mean[c] = cc.mean[c], sc.image_std[c] = cc.std[c];
    cm_streaming_rename rn[2] = {{"x", "image"}, {"y", "label"}};
    sc.renames = rn, sc.n_renames = 2;
    const double t0 = cm_clock_s();
    cm_dataset *ds;
    CHECK(cm_dataset_streaming_new(&sc, 0, 1, &ds));
    cm_dataloader_config lc = cm_dataloader_config_default();
    lc.batch_size = 256;
    lc.drop_last = false;
    lc.num_workers = workers;
    lc.prefetch_depth = 4;
    cm_dataloader *dl;
    CHECK(cm_dataloader_new(ds, &lc, &dl));
    int64_t n = 0;
    cm_batch *b;
    for (;;) {
        CHECK(cm_dataloader_next(dl, &b));
        if (!b) break;
        n += b->n_samples;
    }
    const double secs = cm_clock_s() - t0;
    *fetched = cm_streaming_n_fetched(ds);
    *n_out = n;
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
    return (double)n / secs;
}

int main(int argc, char **argv) {
    const int64_t samples = argc > 1 ? atoll(argv[1]) : 10000;
    const char *compression = argc > 2 && strcmp(argv[2], "none") ? argv[2] : NULL;
    const int workers = argc > 3 ? atoi(argv[3]) : 2;
    char root[] = "/tmp/cm-bench-streaming-XXXXXX";
    if (!mkdtemp(root)) return fprintf(stderr, "bench_streaming: mkdtemp: %s\n", strerror(errno)), 1;
    char src[600], cache[600];
    snprintf(src, sizeof src, "%s/mds", root);

    /* the dataset */
    cm_cifar10_config cc = cm_cifar10_config_default();
    cc.raw_u8 = true;
    cm_dataset *cifar;
    CHECK(cm_dataset_cifar10_new("../shared/data/cifar10", CM_SPLIT_TEST, &cc, &cifar));
    cm_mds_column cols[] = {{"x", "pil"}, {"y", "int"}};
    cm_mds_writer_config wc = cm_mds_writer_config_default();
    wc.size_limit = 4 << 20;
    wc.compression = compression;
    cm_mds_writer *w;
    CHECK(cm_mds_writer_new(src, cols, 2, &wc, &w));
    const int64_t n = samples < cm_dataset_len(cifar) ? samples : cm_dataset_len(cifar);
    for (int64_t i = 0; i < n; i++) {
        uint8_t chw[3072], hwc[3072];
        int64_t y;
        void *out[2] = {chw, &y};
        CHECK(cm_dataset_get(cifar, i, NULL, out));
        for (int c = 0; c < 3; c++)
            for (int p = 0; p < 1024; p++) hwc[p * 3 + c] = chw[c * 1024 + p];
        cm_mds_value v[2] = {{.data = hwc, .size = 3072, .ndim = 2, .shape = {32, 32}, .mode = "RGB"}, {.data = &y, .size = 8}};
        CHECK(cm_mds_writer_write(w, v));
    }
    CHECK(cm_mds_writer_finish(w));
    const int shards = cm_mds_writer_n_shards(w);
    cm_mds_writer_free(w);
    cm_dataset_free(cifar);

    int port = 0;
    pid_t srv = start_s3rver(root, &port);
    if (srv > 0) {
        cm_object_store *st;
        CHECK(cm_object_store_open("s3://bench/cifar", NULL, &st));
        DIR *d = opendir(src);
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char p[1000];
            snprintf(p, sizeof p, "%s/%s", src, e->d_name);
            CHECK(cm_object_store_upload(st, e->d_name, p));
        }
        closedir(d);
        cm_object_store_close(st);
    } else {
        fprintf(stderr, "bench_streaming: s3rver is not installed (scripts/install-deps): the S3 rows are skipped\n");
    }

    char date[32], host[64];
    time_t t = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S", localtime(&t));
    gethostname(host, sizeof host);
    host[63] = 0;
    FILE *f = fopen("bench/results/streaming.tsv", "a");
    if (f && ftell(f) == 0) fprintf(f, "date\thost\tsource\tsamples\tshards\tcompression\tworkers\tfetched\tsamples_per_s\n");
    printf("streaming dataset, CIFAR-10 test split as MDS (%lld samples, %d shards of <= 4 MB, %s), batch 256, %d "
           "workers, f32 normalised images\n\n%-10s %10s %10s\n",
           (long long)n, shards, compression ? compression : "uncompressed", workers, "source", "fetched", "samples/s");
    struct {
        const char *name, *remote;
        bool fresh;
    } rows[] = {{"local", NULL, false}, {"s3 cold", "s3://bench/cifar", true}, {"s3 warm", "s3://bench/cifar", false},
                {"file cold", NULL, true}};
    char file_uri[700];
    snprintf(file_uri, sizeof file_uri, "file://%s", src);
    rows[3].remote = file_uri;
    for (int r = 0; r < 4; r++) {
        if (r >= 1 && r <= 2 && srv <= 0) continue;
        snprintf(cache, sizeof cache, "%s/cache%d", root, r == 3 ? 3 : 1);
        if (rows[r].fresh) rm_rf(cache);
        int64_t fetched, got;
        double rate = epoch_rate(rows[r].remote, rows[r].remote ? cache : src, workers, &fetched, &got);
        if (got != n) return fprintf(stderr, "bench_streaming: read %lld of %lld samples\n", (long long)got, (long long)n), 1;
        printf("%-10s %10lld %10.0f\n", rows[r].name, (long long)fetched, rate);
        if (f)
            fprintf(f, "%s\t%s\t%s\t%lld\t%d\t%s\t%d\t%lld\t%.0f\n", date, host, rows[r].name, (long long)n, shards,
                    compression ? compression : "none", workers, (long long)fetched, rate);
    }
    if (f) fclose(f);
    if (srv > 0) {
        kill(srv, SIGKILL);
        waitpid(srv, NULL, 0);
    }
    rm_rf(root);
    return 0;
}
