/* The loopback S3 server of the tests: s3rver behind tests/s3/s3proxy.py (see cms3.h). */
#define _GNU_SOURCE
#include "cms3.h"

#include <criterion/criterion.h>
#include <curl/curl.h>

#include <arpa/inet.h>
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

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof a;
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &l) == 0,
              "cannot find a free loopback port: %s", strerror(errno));
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

static void nap_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static pid_t spawn(const char *log, char *const argv[]) {
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
        /* s3rver's ListObjectsV2 continuation tokens use DES, which OpenSSL 3 keeps in its
         * legacy provider (without it every truncated listing is a 500) */
        setenv("NODE_OPTIONS", "--openssl-legacy-provider", 1);
        execv(argv[0], argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

static const char *s3rver_bin(void) {
    const char *e = getenv("CM_S3RVER");
    return e && e[0] ? e : CMT_S3RVER_DEFAULT;
}

static void start_server(cmt_s3 *s) {
    char data[300], log[300], port[16];
    snprintf(data, sizeof data, "%s/data", s->dir);
    snprintf(log, sizeof log, "%s/s3rver.log", s->dir);
    snprintf(port, sizeof port, "%d", s->server_port);
    mkdir(data, 0755);
    char *argv[] = {(char *)s3rver_bin(), "-d", data, "-a", "127.0.0.1", "-p", port, "--silent", "--configure-bucket",
                    s->bucket, NULL};
    s->server_pid = spawn(log, argv);
    for (int i = 0; i < 300; i++) { /* 15 s */
        if (port_open(s->server_port)) return;
        int st;
        if (waitpid(s->server_pid, &st, WNOHANG) == s->server_pid) break;
        nap_ms(50);
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "cat %s >&2", log);
    (void)!system(cmd);
    cr_assert_fail("s3rver did not start on port %d (log above)", s->server_port);
}

void cmt_s3_start(cmt_s3 *s, const char *bucket) {
    memset(s, 0, sizeof *s);
    cr_assert(access(s3rver_bin(), X_OK) == 0,
              "s3rver is not installed at %s: run scripts/install-deps (as root), or set CM_S3RVER", s3rver_bin());
    snprintf(s->dir, sizeof s->dir, "/tmp/cm-s3-XXXXXX");
    cr_assert(mkdtemp(s->dir), "mkdtemp: %s", strerror(errno));
    snprintf(s->bucket, sizeof s->bucket, "%s", bucket);
    s->server_port = free_port();
    start_server(s);
    char up[16], pf[300], log[300];
    snprintf(up, sizeof up, "%d", s->server_port);
    snprintf(pf, sizeof pf, "%s/proxy.port", s->dir);
    snprintf(log, sizeof log, "%s/proxy.log", s->dir);
    char *argv[] = {"/usr/bin/python3", "tests/s3/s3proxy.py", up, CMT_S3_ACCESS, CMT_S3_SECRET, pf, NULL};
    s->proxy_pid = spawn(log, argv);
    for (int i = 0; i < 200 && !s->port; i++) {
        FILE *f = fopen(pf, "r");
        if (f) {
            if (fscanf(f, "%d", &s->port) != 1) s->port = 0;
            fclose(f);
        }
        if (!s->port) nap_ms(25);
    }
    cr_assert(s->port > 0, "the S3 test proxy did not start (see %s)", log);
    snprintf(s->endpoint, sizeof s->endpoint, "http://127.0.0.1:%d", s->port);
    setenv("S3_ENDPOINT_URL", s->endpoint, 1);
    setenv("AWS_ACCESS_KEY_ID", CMT_S3_ACCESS, 1);
    setenv("AWS_SECRET_ACCESS_KEY", CMT_S3_SECRET, 1);
    setenv("AWS_REGION", "us-east-1", 1);
    unsetenv("AWS_SESSION_TOKEN");
}

static void reap(pid_t *pid) {
    if (*pid > 0) {
        kill(*pid, SIGKILL);
        waitpid(*pid, NULL, 0);
    }
    *pid = 0;
}

void cmt_s3_server_kill(cmt_s3 *s) { reap(&s->server_pid); }

void cmt_s3_server_restart(cmt_s3 *s) {
    reap(&s->server_pid);
    start_server(s);
}

void cmt_s3_stop(cmt_s3 *s) {
    reap(&s->proxy_pid);
    reap(&s->server_pid);
    if (s->dir[0]) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", s->dir);
        (void)!system(cmd);
    }
    s->dir[0] = 0;
}

typedef struct sink {
    char *buf;
    size_t cap, n;
} sink;

static size_t on_data(char *p, size_t size, size_t n, void *d) {
    sink *k = d;
    size_t m = size * n;
    size_t room = k->cap > k->n + 1 ? k->cap - k->n - 1 : 0;
    size_t c = m < room ? m : room;
    memcpy(k->buf + k->n, p, c);
    k->n += c;
    k->buf[k->n] = 0;
    return m;
}

void cmt_s3_ctl(cmt_s3 *s, const char *cmd, char *buf, size_t cap) {
    char url[512];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/__proxy/%s", s->port, cmd);
    char small[64];
    sink k = {buf ? buf : small, buf ? cap : sizeof small, 0};
    k.buf[0] = 0;
    CURL *h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &k);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    CURLcode rc = curl_easy_perform(h);
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(h);
    cr_assert(rc == CURLE_OK && code == 200, "S3 test proxy command '%s' failed: %s (HTTP %ld)", cmd,
              curl_easy_strerror(rc), code);
}

long cmt_s3_stat(cmt_s3 *s, const char *name) {
    static char buf[1 << 20];
    cmt_s3_ctl(s, "stats", buf, sizeof buf);
    char key[80];
    snprintf(key, sizeof key, "\"%s\": ", name);
    const char *p = strstr(buf, key);
    cr_assert(p, "proxy stats have no '%s': %.200s", name, buf);
    return strtol(p + strlen(key), NULL, 10);
}
