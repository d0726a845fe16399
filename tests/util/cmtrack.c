#define _GNU_SOURCE /* nftw */
#include "cmtrack.h"

#include "cmtrain.h"

#include <criterion/criterion.h>
#include <curl/curl.h>
#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb, (void)flag, (void)f;
    return remove(p);
}

cmt_tmpdir cmt_tmpdir_make(const char *tag) {
    cmt_tmpdir t;
    snprintf(t.dir, sizeof t.dir, "/tmp/cm-%s-XXXXXX", tag);
    cr_assert_not_null(mkdtemp(t.dir), "mkdtemp failed: %s", strerror(errno));
    return t;
}

void cmt_tmpdir_remove(cmt_tmpdir *t) { nftw(t->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

char *cmt_run(const char *cmd, int *rc) {
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p, "popen '%s' failed", cmd);
    size_t cap = 1 << 16, n = 0;
    char *s = malloc(cap);
    for (;;) {
        if (n + 1 >= cap) s = realloc(s, cap *= 2);
        size_t k = fread(s + n, 1, cap - n - 1, p);
        if (k == 0) break;
        n += k;
    }
    s[n] = '\0';
    int st = pclose(p);
    *rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    return s;
}

static int g_saved_stderr = -1, g_pipe_rd = -1;

void cmt_stderr_begin(void) {
    int fd[2];
    cr_assert_eq(pipe(fd), 0);
    fflush(stderr);
    g_saved_stderr = dup(2);
    dup2(fd[1], 2);
    close(fd[1]);
    g_pipe_rd = fd[0];
}

char *cmt_stderr_end(void) {
    fflush(stderr);
    dup2(g_saved_stderr, 2);
    close(g_saved_stderr);
    size_t cap = 1 << 16, n = 0;
    char *s = malloc(cap);
    ssize_t k;
    while ((k = read(g_pipe_rd, s + n, cap - n - 1)) > 0) n += (size_t)k;
    s[n] = '\0';
    close(g_pipe_rd);
    g_pipe_rd = g_saved_stderr = -1;
    return s;
}

void cmt_assert_json(const cJSON *x, const char *want) {
    char *got = x ? cJSON_PrintUnformatted(x) : NULL;
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", got ? got : "(missing)");
    cJSON_free(got);
    cr_assert_str_eq(copy, want);
}

int cmt_count(const char *hay, const char *needle) {
    int c = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) c++;
    return c;
}

static cm_status noop_reduce(double *v, int n, void *data) {
    (void)v, (void)n, (void)data;
    return CM_OK;
}

cmt_track_rig cmt_track_rig_make(const cmt_fit_opts *o, const cm_logger_plugin *loggers, int n) {
    cmt_track_rig g = {0};
    g.ds = cmt_synth_dataset(48, 8, 3, false, NULL);
    g.dl = cmt_loader(g.ds, 8, false, 7);
    if (!o->no_eval) {
        g.eds = cmt_synth_dataset(32, 8, 3, false, NULL);
        g.edl = cmt_loader(g.eds, 16, true, 0);
    }
    g.model = cmt_mlp(8, 16, 3, 0.0f, 3);
    cm_logger_plugin lg[8];
    int k = 0;
    if (o->mem) cr_assert_eq(cm_in_memory_logger_new(o->mem, &lg[k++]), CM_OK);
    cr_assert_leq(n + k, 8);
    for (int i = 0; i < n; i++) lg[k++] = loggers[i];
    cm_trainer_config c = cm_trainer_config_default();
    c.model = g.model;
    c.train_dataloader = g.dl;
    c.eval_dataloader = g.edl;
    cr_assert_eq(cm_time_parse(o->max_duration ? o->max_duration : "2ep", &c.max_duration), CM_OK);
    c.run_name = o->run_name;
    c.loggers = lg;
    c.n_loggers = k;
    c.callbacks = o->callbacks;
    c.n_callbacks = o->n_callbacks;
    if (o->world_size > 1) {
        c.dist.rank = o->rank;
        c.dist.world_size = o->world_size;
        c.dist.all_reduce_sum = noop_reduce;
    }
    cr_assert_eq(cm_trainer_new(&c, &g.tr), CM_OK, "%s", cm_last_error());
    return g;
}

void cmt_track_rig_free(cmt_track_rig *g) {
    cm_trainer_free(g->tr);
    cm_model_free(g->model);
    cm_dataloader_free(g->dl);
    cm_dataloader_free(g->edl);
    cm_dataset_free(g->ds);
    cm_dataset_free(g->eds);
    *g = (cmt_track_rig){0};
}

/* ---- test servers ---- */

cmt_server cmt_server_start(const char *script) {
    cmt_server s = {0};
    int fd[2];
    cr_assert_eq(pipe(fd), 0);
    char path[256];
    snprintf(path, sizeof path, "tests/trackers/%s", script);
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork failed");
    if (pid == 0) {
        /* the server goes with the test process, even one that crashes (else it would keep the
         * test's stderr open and hold up whoever reads it) */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        dup2(fd[1], 1);
        close(fd[0]), close(fd[1]);
        execl("/usr/bin/python3", "python3", path, "--port", "0", (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    FILE *f = fdopen(fd[0], "r");
    char line[128] = "";
    cr_assert_not_null(fgets(line, sizeof line, f), "test server %s printed no port (is /usr/bin/python3 there?)",
                       script);
    fclose(f);
    cr_assert_eq(sscanf(line, "PORT %d", &s.port), 1, "test server %s said '%s', not 'PORT <n>'", script, line);
    s.pid = pid;
    snprintf(s.url, sizeof s.url, "http://127.0.0.1:%d", s.port);
    return s;
}

void cmt_server_stop(cmt_server *s) {
    if (s->pid <= 0) return;
    kill(s->pid, SIGTERM);
    int st;
    waitpid(s->pid, &st, 0);
    s->pid = 0;
}

static size_t collect(char *p, size_t sz, size_t n, void *data) {
    char **buf = data;
    size_t old = *buf ? strlen(*buf) : 0;
    *buf = realloc(*buf, old + sz * n + 1);
    memcpy(*buf + old, p, sz * n);
    (*buf)[old + sz * n] = '\0';
    return sz * n;
}

cJSON *cmt_server_call(const cmt_server *s, const char *path, const char *body) {
    CURL *h = curl_easy_init();
    cr_assert_not_null(h);
    char url[256];
    snprintf(url, sizeof url, "%s%s", s->url, path);
    char *reply = NULL;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &reply);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 10L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    struct curl_slist *hd = NULL;
    if (body) {
        hd = curl_slist_append(hd, "Content-Type: application/json");
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    }
    CURLcode rc = curl_easy_perform(h);
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(hd);
    curl_easy_cleanup(h);
    cr_assert_eq(rc, CURLE_OK, "test server call %s failed: %s", path, curl_easy_strerror(rc));
    cr_assert_eq(code, 200, "test server call %s: HTTP %ld: %s", path, code, reply ? reply : "");
    cJSON *j = cJSON_Parse(reply ? reply : "");
    cr_assert_not_null(j, "test server call %s: not JSON: %s", path, reply ? reply : "");
    free(reply);
    return j;
}

cJSON *cmt_server_state(const cmt_server *s) { return cmt_server_call(s, "/_test/state", NULL); }

void cmt_server_faults(const cmt_server *s, const char *rules_json) {
    char body[2048];
    cr_assert_lt(strlen(rules_json), sizeof body - 16, "fault rules too long");
    snprintf(body, sizeof body, "{\"rules\": %s}", rules_json);
    cJSON_Delete(cmt_server_call(s, "/_test/faults", body));
}

void cmt_assert_no_violations(const cJSON *st) {
    const cJSON *v = cJSON_GetObjectItem(st, "violations");
    if (cJSON_GetArraySize(v) > 0) cr_assert_fail("the server saw protocol violations:\n%s", cJSON_Print(v));
}

const cJSON *cmt_only_run(const cJSON *st) {
    const cJSON *runs = cJSON_GetObjectItem(st, "runs");
    cr_assert_eq(cJSON_GetArraySize(runs), 1, "%d runs on the server", cJSON_GetArraySize(runs));
    return runs->child;
}

const char *cmt_json_str(const cJSON *o, const char *k) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}
