/* The S3 backend (AWS S3 and the S3-compatible GCS, OCI, R2, MinIO): requests over libcurl,
 * signed with SigV4 (sigv4.c), retried with exponential backoff on transient failures;
 * multipart uploads with parts in parallel; downloads resumed with ranged GETs pinned to the
 * object's ETag; ListObjectsV2 followed over every page. */
#define _GNU_SOURCE
#include "storage/storage_impl.h"

#include <curl/curl.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Test hook: the max-keys of each ListObjectsV2 page (0 = the server's default, 1000), so tests
 * can make a listing span several pages. */
int cmi_s3_list_max_keys = 0;

#define EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define ERR_BODY_MAX 8192

typedef struct s3_store {
    char scheme[8];
    char bucket[256];
    char proto[8];       /* "http" / "https" */
    char host[512];      /* host[:port] the requests go to (with the bucket in virtual-host style) */
    char base_path[1300]; /* the endpoint's own path ("" usually), then "/BUCKET" in path style */
    char region[64];
    char *access, *secret, *token;
    char cred_vars[96]; /* "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY", for messages */
} s3_store;

static pthread_once_t g_curl_once = PTHREAD_ONCE_INIT;
static CURLcode g_curl_init_rc;
static void curl_init_once(void) { g_curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

static atomic_int g_tmp_ctr;

/* ---------------------------------------------------------------------------------------------
 * One request
 * ------------------------------------------------------------------------------------------- */

typedef struct membuf {
    char *p;
    size_t n, cap, max;
    bool over;
} membuf;

static bool mb_add(membuf *b, const void *d, size_t n) {
    if (b->n + n > b->max) {
        b->over = true;
        return false;
    }
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 1024;
        while (nc < b->n + n + 1) nc *= 2;
        char *np = cm_alloc(nc, 1);
        if (!np) return false;
        if (b->p) memcpy(np, b->p, b->n);
        cm_free(b->p);
        b->p = np, b->cap = nc;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

typedef struct s3_req {
    const char *method;   /* GET PUT POST HEAD DELETE */
    const char *key;      /* full key; NULL: the bucket itself */
    const char *query;    /* encoded, without '?'; NULL = none */
    const void *body;     /* PUT/POST body (NULL = none) */
    size_t body_len;
    const char *range;    /* "bytes=a-" */
    const char *if_match; /* an ETag */
    int out_fd;           /* 2xx body appended here when >= 0 */
    membuf *out_mem;      /* else here (NULL: discarded) */
} s3_req;

typedef struct s3_resp {
    long code;
    CURLcode cc;
    char curl_err[CURL_ERROR_SIZE];
    char etag[160];
    bool have_len;
    uint64_t content_length;
    bool have_range;
    uint64_t range_start, range_total;
    membuf err; /* a non-2xx body (the XML error) */
    uint64_t written;
    bool write_failed;
    int write_errno;
} s3_resp;

typedef struct io_ctx {
    CURL *h;
    const s3_req *rq;
    s3_resp *rs;
    size_t body_off;
} io_ctx;

static size_t on_read(char *buf, size_t size, size_t nitems, void *data) {
    io_ctx *c = data;
    size_t left = c->rq->body_len - c->body_off, n = size * nitems;
    if (n > left) n = left;
    memcpy(buf, (const char *)c->rq->body + c->body_off, n);
    c->body_off += n;
    return n;
}

static int on_seek(void *data, curl_off_t off, int origin) {
    io_ctx *c = data; /* curl rewinds the body to resend it on a new connection */
    if (origin != SEEK_SET || off < 0 || (size_t)off > c->rq->body_len) return CURL_SEEKFUNC_CANTSEEK;
    c->body_off = (size_t)off;
    return CURL_SEEKFUNC_OK;
}

static size_t on_write(char *ptr, size_t size, size_t nmemb, void *data) {
    io_ctx *c = data;
    size_t n = size * nmemb;
    long code = 0;
    curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &code);
    if (code < 200 || code >= 300) {
        mb_add(&c->rs->err, ptr, n); /* an over-long error body is cut, not a failure */
        return n;
    }
    if (c->rq->out_fd >= 0) {
        size_t done = 0;
        while (done < n) {
            ssize_t w = write(c->rq->out_fd, ptr + done, n - done);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                c->rs->write_failed = true;
                c->rs->write_errno = w < 0 ? errno : ENOSPC;
                return 0;
            }
            done += (size_t)w;
            c->rs->written += (uint64_t)w;
        }
        return n;
    }
    if (c->rq->out_mem && !mb_add(c->rq->out_mem, ptr, n)) {
        c->rs->write_failed = true;
        c->rs->write_errno = c->rq->out_mem->over ? EFBIG : ENOMEM;
        return 0;
    }
    c->rs->written += n;
    return n;
}

static bool hdr_is(const char *line, size_t n, const char *name, const char **val, size_t *vlen) {
    size_t k = strlen(name);
    if (n <= k || strncasecmp(line, name, k) != 0 || line[k] != ':') return false;
    const char *v = line + k + 1;
    const char *e = line + n;
    while (v < e && (*v == ' ' || *v == '\t')) v++;
    while (e > v && (e[-1] == '\r' || e[-1] == '\n' || e[-1] == ' ')) e--;
    *val = v, *vlen = (size_t)(e - v);
    return true;
}

static size_t on_header(char *buf, size_t size, size_t nitems, void *data) {
    io_ctx *c = data;
    size_t n = size * nitems;
    const char *v;
    size_t vl;
    char tmp[160];
    if (n >= 5 && !strncmp(buf, "HTTP/", 5)) { /* a new response (after a 100 Continue): start over */
        c->rs->have_len = c->rs->have_range = false;
        c->rs->etag[0] = 0;
    } else if (hdr_is(buf, n, "etag", &v, &vl)) {
        snprintf(c->rs->etag, sizeof c->rs->etag, "%.*s", (int)vl, v);
    } else if (hdr_is(buf, n, "content-length", &v, &vl)) {
        snprintf(tmp, sizeof tmp, "%.*s", (int)vl, v);
        c->rs->content_length = strtoull(tmp, NULL, 10);
        c->rs->have_len = true;
    } else if (hdr_is(buf, n, "content-range", &v, &vl)) { /* bytes a-b/total */
        snprintf(tmp, sizeof tmp, "%.*s", (int)vl, v);
        unsigned long long a, b, t;
        if (sscanf(tmp, "bytes %llu-%llu/%llu", &a, &b, &t) == 3) {
            c->rs->have_range = true;
            c->rs->range_start = a;
            c->rs->range_total = t;
        }
    }
    return n;
}

/* The text between <tag> and </tag> (first match after *from), XML-unescaped, into out. */
static bool xml_get(const char *xml, const char *tag, char *out, size_t cap, const char **after) {
    char open[64], close[64];
    snprintf(open, sizeof open, "<%s>", tag);
    snprintf(close, sizeof close, "</%s>", tag);
    const char *a = strstr(xml, open);
    if (!a) return false;
    a += strlen(open);
    const char *b = strstr(a, close);
    if (!b) return false;
    size_t o = 0;
    for (const char *p = a; p < b && o + 1 < cap;) {
        if (*p == '&') {
            static const struct {
                const char *e;
                char c;
            } ents[] = {{"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
            bool done = false;
            for (size_t i = 0; i < sizeof ents / sizeof *ents && !done; i++)
                if (!strncmp(p, ents[i].e, strlen(ents[i].e))) out[o++] = ents[i].c, p += strlen(ents[i].e), done = true;
            if (!done && p[1] == '#') {
                char *end;
                unsigned long cp = p[2] == 'x' ? strtoul(p + 3, &end, 16) : strtoul(p + 2, &end, 10);
                if (*end == ';' && cp < 0x80) {
                    out[o++] = (char)cp;
                    p = end + 1;
                    done = true;
                } else if (*end == ';' && cp < 0x800 && o + 2 < cap) {
                    out[o++] = (char)(0xC0 | (cp >> 6)), out[o++] = (char)(0x80 | (cp & 0x3F));
                    p = end + 1;
                    done = true;
                } else if (*end == ';' && cp < 0x10000 && o + 3 < cap) {
                    out[o++] = (char)(0xE0 | (cp >> 12)), out[o++] = (char)(0x80 | ((cp >> 6) & 0x3F)),
                    out[o++] = (char)(0x80 | (cp & 0x3F));
                    p = end + 1;
                    done = true;
                }
            }
            if (!done) out[o++] = *p++;
        } else {
            out[o++] = *p++;
        }
    }
    out[o] = 0;
    if (after) *after = b + strlen(close);
    return true;
}

typedef enum { RK_OK = 0, RK_TRANSIENT = 1, RK_PERMANENT = 2 } r_kind;

/* The request URL's path (encoded) and full URL. */
static bool build_path(const s3_store *s, const char *key, char *path, size_t cap) {
    size_t bl = strlen(s->base_path);
    if (bl + 2 > cap) return false;
    memcpy(path, s->base_path, bl + 1);
    path[bl] = '/';
    path[bl + 1] = 0;
    if (key && !cmi_uri_encode(key, true, path + bl + 1, cap - bl - 1)) return false;
    return true;
}

/* Sends one request (no retry). Returns RK_OK for a 2xx (or 206) response, else sets the error
 * (naming uri) and returns whether a retry may help. */
static r_kind perform(cm_object_store *st, CURL *h, const s3_req *rq, s3_resp *rs, const char *uri) {
    s3_store *s = st->impl;
    memset(rs, 0, sizeof *rs);
    rs->err.max = ERR_BODY_MAX;
    char path[4096], url[5120];
    if (!build_path(s, rq->key, path, sizeof path)) {
        cm_set_error(CM_ERR_INVALID_ARG, "'%s': the key is too long", uri);
        return RK_PERMANENT;
    }
    snprintf(url, sizeof url, "%s://%s%s%s%s", s->proto, s->host, path, rq->query && rq->query[0] ? "?" : "",
             rq->query ? rq->query : "");
    char payload[65];
    if (rq->body && rq->body_len) cmi_sha256_hex(rq->body, rq->body_len, payload);
    else memcpy(payload, EMPTY_SHA256, 65);
    char amz_date[20];
    time_t now = time(NULL);
    struct tm tmv;
    gmtime_r(&now, &tmv);
    strftime(amz_date, sizeof amz_date, "%Y%m%dT%H%M%SZ", &tmv);
    cmi_sigv4_header sh[8];
    int nh = 0;
    sh[nh++] = (cmi_sigv4_header){"host", s->host};
    sh[nh++] = (cmi_sigv4_header){"x-amz-content-sha256", payload};
    sh[nh++] = (cmi_sigv4_header){"x-amz-date", amz_date};
    if (s->token && s->token[0]) sh[nh++] = (cmi_sigv4_header){"x-amz-security-token", s->token};
    if (rq->range) sh[nh++] = (cmi_sigv4_header){"range", rq->range};
    if (rq->if_match) sh[nh++] = (cmi_sigv4_header){"if-match", rq->if_match};
    char auth[1024];
    cmi_sigv4_request sr = {rq->method, path, rq->query, sh, nh, payload, s->region, "s3", amz_date, s->access, s->secret};
    if (cmi_sigv4_sign(&sr, auth, sizeof auth, NULL, 0, NULL, 0) != CM_OK) return RK_PERMANENT;

    struct curl_slist *hl = NULL;
    char line[4096];
    for (int i = 0; i < nh; i++) {
        snprintf(line, sizeof line, "%s: %s", sh[i].name, sh[i].value);
        hl = curl_slist_append(hl, line);
    }
    snprintf(line, sizeof line, "Authorization: %s", auth);
    hl = curl_slist_append(hl, line);
    hl = curl_slist_append(hl, "Expect:"); /* no 100-continue round trip */
    if (rq->body && !strcmp(rq->method, "POST")) hl = curl_slist_append(hl, "Content-Type: application/xml");

    curl_easy_reset(h);
    io_ctx io = {h, rq, rs, 0};
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, rs->curl_err);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &io);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &io);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)(st->cfg.connect_timeout_s * 1000));
    long stall = (long)(st->cfg.timeout_s + 0.999);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, stall < 1 ? 1L : stall);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "composer-c");
    if (!strcmp(rq->method, "HEAD")) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (!strcmp(rq->method, "PUT")) {
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(h, CURLOPT_READDATA, &io);
        curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, on_seek);
        curl_easy_setopt(h, CURLOPT_SEEKDATA, &io);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)rq->body_len);
    } else if (!strcmp(rq->method, "POST")) {
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, rq->body ? (const char *)rq->body : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)rq->body_len);
    } else if (strcmp(rq->method, "GET")) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, rq->method);
    }
    atomic_fetch_add(&st->n_requests, 1);
    rs->cc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &rs->code);
    curl_slist_free_all(hl);
    atomic_fetch_add(&st->n_up, (long long)io.body_off);
    atomic_fetch_add(&st->n_down, (long long)rs->written);

    if (rs->write_failed) {
        cm_set_error(rs->write_errno == EFBIG ? CM_ERR_FORMAT : CM_ERR_IO, "%s '%s': %s", rq->method, uri,
                     rs->write_errno == EFBIG ? "the object is larger than expected" : strerror(rs->write_errno));
        return RK_PERMANENT;
    }
    if (rs->cc != CURLE_OK) {
        /* no complete response: refused, reset, timed out, cut short — the server may come back */
        const bool transient = rs->cc == CURLE_COULDNT_CONNECT || rs->cc == CURLE_OPERATION_TIMEDOUT ||
                               rs->cc == CURLE_RECV_ERROR || rs->cc == CURLE_SEND_ERROR ||
                               rs->cc == CURLE_GOT_NOTHING || rs->cc == CURLE_PARTIAL_FILE ||
                               rs->cc == CURLE_COULDNT_RESOLVE_HOST || rs->cc == CURLE_SSL_CONNECT_ERROR ||
                               rs->cc == CURLE_HTTP2 || rs->cc == CURLE_HTTP2_STREAM || rs->cc == CURLE_SEND_FAIL_REWIND;
        cm_set_error(CM_ERR_IO, "%s '%s' (%s://%s): %s", rq->method, uri, s->proto, s->host,
                     rs->curl_err[0] ? rs->curl_err : curl_easy_strerror(rs->cc));
        return transient ? RK_TRANSIENT : RK_PERMANENT;
    }
    if (rs->code >= 200 && rs->code < 300) return RK_OK;
    char code[128] = "", msg[512] = "";
    if (rs->err.p) {
        xml_get(rs->err.p, "Code", code, sizeof code, NULL);
        xml_get(rs->err.p, "Message", msg, sizeof msg, NULL);
    }
    const long c = rs->code;
    const bool transient = c >= 500 || c == 408 || c == 429 || !strcmp(code, "SlowDown") ||
                           !strcmp(code, "RequestTimeout") || !strcmp(code, "InternalError");
    const char *hint = "";
    if (c == 403)
        hint = !strcmp(code, "SignatureDoesNotMatch") ? " (check the secret key: %s)"
               : !strcmp(code, "InvalidAccessKeyId")  ? " (check the access key: %s)"
                                                      : " (check the credentials and the bucket's permissions: %s)";
    char hbuf[1400] = "";
    if (hint[0]) snprintf(hbuf, sizeof hbuf, hint, s->cred_vars);
    cm_status status = CM_ERR_IO;
    if (c == 404) {
        status = CM_ERR_NOT_FOUND;
        if (!strcmp(code, "NoSuchBucket") || (!rq->key && !code[0]))
            snprintf(hbuf, sizeof hbuf, " (bucket '%s' does not exist at %s://%s)", s->bucket, s->proto, s->host);
        else if (!code[0])
            snprintf(code, sizeof code, "NoSuchKey");
    }
    cm_set_error(status, "%s '%s': HTTP %ld%s%s%s%s%s", rq->method, uri, c, code[0] ? " " : "", code,
                 msg[0] ? ": " : "", msg, hbuf);
    return transient ? RK_TRANSIENT : RK_PERMANENT;
}

/* Sleeps before retry `attempt` (1-based) and logs it; false when retries are used up. */
static bool retry_wait(cm_object_store *st, int attempt, const char *what) {
    if (attempt > st->cfg.max_retries) return false;
    double w = st->cfg.retry_backoff_s;
    for (int i = 1; i < attempt; i++) w *= 2;
    if (w > 30) w = 30;
    /* jitter in [0.5, 1) x: ranks retrying at once spread out */
    uint64_t r = cm_hash64(&attempt, sizeof attempt, cm_clock_ns());
    w *= 0.5 + 0.5 * (double)(r >> 11) / (double)(1ull << 53);
    cm_log_msg(CM_LOG_WARN, "storage: %s; retry %d of %d in %.2f s", what, attempt, st->cfg.max_retries, w);
    atomic_fetch_add(&st->n_retries, 1);
    if (w > 0) {
        struct timespec ts = {(time_t)w, (long)((w - (double)(time_t)w) * 1e9)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    return true;
}

/* A request with retries (bodies in memory; out_mem reset before each try). */
static cm_status request(cm_object_store *st, CURL *h, const s3_req *rq, s3_resp *rs, const char *uri) {
    for (int attempt = 1;; attempt++) {
        if (rq->out_mem) rq->out_mem->n = 0, rq->out_mem->over = false;
        r_kind k = perform(st, h, rq, rs, uri);
        cm_free(rs->err.p);
        rs->err.p = NULL;
        if (k == RK_OK) return CM_OK;
        if (k == RK_PERMANENT) return cm_last_status();
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        if (!retry_wait(st, attempt, msg)) {
            return cm_set_error(CM_ERR_IO, "%s (gave up after %d retries)", msg, st->cfg.max_retries);
        }
    }
}

static CURL *new_handle(void) {
    pthread_once(&g_curl_once, curl_init_once);
    if (g_curl_init_rc != CURLE_OK) {
        cm_set_error(CM_ERR_IO, "libcurl failed to initialise: %s", curl_easy_strerror(g_curl_init_rc));
        return NULL;
    }
    CURL *h = curl_easy_init();
    if (!h) cm_set_error(CM_ERR_OOM, "libcurl: cannot create a handle");
    return h;
}

/* ---------------------------------------------------------------------------------------------
 * Operations
 * ------------------------------------------------------------------------------------------- */

static cm_status s3_put(cm_object_store *st, const char *key, const char *uri, const void *data, size_t n) {
    CURL *h = new_handle();
    if (!h) return cm_last_status();
    s3_resp rs;
    s3_req rq = {"PUT", key, NULL, data, n, NULL, NULL, -1, NULL};
    cm_status s = request(st, h, &rq, &rs, uri);
    curl_easy_cleanup(h);
    return s;
}

static cm_status s3_get_size(cm_object_store *st, const char *key, const char *uri, uint64_t *size) {
    CURL *h = new_handle();
    if (!h) return cm_last_status();
    s3_resp rs;
    s3_req rq = {"HEAD", key, NULL, NULL, 0, NULL, NULL, -1, NULL};
    cm_status s = request(st, h, &rq, &rs, uri);
    curl_easy_cleanup(h);
    if (s) return s;
    if (!rs.have_len) return cm_set_error(CM_ERR_IO, "HEAD '%s': the response has no Content-Length", uri);
    *size = rs.content_length;
    return CM_OK;
}

static cm_status s3_get(cm_object_store *st, const char *key, const char *uri, size_t max, char **out, size_t *len) {
    CURL *h = new_handle();
    if (!h) return cm_last_status();
    membuf mb = {NULL, 0, 0, max, false};
    s3_resp rs;
    s3_req rq = {"GET", key, NULL, NULL, 0, NULL, NULL, -1, &mb};
    cm_status s = request(st, h, &rq, &rs, uri);
    curl_easy_cleanup(h);
    if (s == CM_ERR_FORMAT) s = cm_set_error(CM_ERR_FORMAT, "'%s' is larger than the %zu bytes expected", uri, max);
    if (s) {
        cm_free(mb.p);
        return s;
    }
    if (!mb.p && !(mb.p = cm_alloc(1, 1))) return cm_set_error(CM_ERR_OOM, "object store: out of memory");
    mb.p[mb.n] = 0;
    *out = mb.p;
    *len = mb.n;
    return CM_OK;
}

static cm_status s3_del(cm_object_store *st, const char *key, const char *uri) {
    CURL *h = new_handle();
    if (!h) return cm_last_status();
    s3_resp rs;
    s3_req rq = {"DELETE", key, NULL, NULL, 0, NULL, NULL, -1, NULL};
    cm_status s = request(st, h, &rq, &rs, uri);
    curl_easy_cleanup(h);
    if (s == CM_ERR_NOT_FOUND && strstr(cm_last_error(), "NoSuchKey")) return CM_OK; /* already gone */
    return s;
}

/* mkdir -p of the folder holding path. */
static cm_status mkdirs_parent(const char *path) {
    char d[4096];
    snprintf(d, sizeof d, "%s", path);
    char *slash = strrchr(d, '/');
    if (!slash || slash == d) return CM_OK;
    *slash = 0;
    for (char *p = d + 1;; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (mkdir(d, 0755) != 0 && errno != EEXIST)
                return cm_set_error(CM_ERR_IO, "cannot create the folder '%s': %s", d, strerror(errno));
            *p = c;
            if (!c) break;
        }
    }
    return CM_OK;
}

static cm_status s3_download(cm_object_store *st, const char *key, const char *uri, const char *local_path) {
    cm_status s = mkdirs_parent(local_path);
    if (s) return s;
    size_t tl = strlen(local_path) + 48;
    char *tmp = cm_alloc(tl, 1);
    if (!tmp) return cm_set_error(CM_ERR_OOM, "object store: out of memory");
    {
        const char *slash = strrchr(local_path, '/');
        size_t dl = slash ? (size_t)(slash - local_path + 1) : 0;
        snprintf(tmp, tl, "%.*s.%s.part-%ld-%d", (int)dl, local_path, local_path + dl, (long)getpid(),
                 atomic_fetch_add(&g_tmp_ctr, 1));
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        s = cm_set_error(CM_ERR_IO, "downloading '%s': cannot create '%s': %s", uri, tmp, strerror(errno));
        cm_free(tmp);
        return s;
    }
    CURL *h = new_handle();
    s = h ? CM_OK : cm_last_status();
    uint64_t have = 0, total = 0;
    bool know_total = false;
    char etag[160] = "";
    for (int attempt = 1; !s;) {
        char range[64];
        snprintf(range, sizeof range, "bytes=%" PRIu64 "-", have);
        s3_req rq = {"GET", key, NULL, NULL, 0, have ? range : NULL, have && etag[0] ? etag : NULL, fd, NULL};
        s3_resp rs;
        r_kind k = perform(st, h, &rq, &rs, uri);
        cm_free(rs.err.p);
        if (k == RK_OK) {
            if (have && rs.code == 200) { /* the range was ignored: the whole object came again */
                if (ftruncate(fd, 0) != 0 || lseek(fd, 0, SEEK_SET) != 0) {
                    s = cm_set_error(CM_ERR_IO, "downloading '%s': cannot restart '%s': %s", uri, tmp, strerror(errno));
                    break;
                }
                /* its bytes were appended after ours: rewrite them from the start on the next try */
                have = 0;
                continue;
            }
            if (rs.code == 206 && (!rs.have_range || rs.range_start != have)) {
                s = cm_set_error(CM_ERR_IO, "downloading '%s': asked for bytes from %" PRIu64 ", the server sent another range",
                                 uri, have);
                break;
            }
            if (!know_total) {
                total = rs.code == 206 && rs.have_range ? rs.range_total : have + rs.content_length;
                know_total = rs.have_len || rs.have_range;
            }
            have += rs.written;
            if (!etag[0]) snprintf(etag, sizeof etag, "%s", rs.etag);
            if (know_total && have != total) {
                s = cm_set_error(CM_ERR_IO, "downloading '%s': got %" PRIu64 " of %" PRIu64 " bytes", uri, have, total);
                break;
            }
            break;
        }
        /* keep what arrived; a resumed GET asks only for the rest */
        have += rs.written;
        if (rs.written && !etag[0]) snprintf(etag, sizeof etag, "%s", rs.etag);
        if (!know_total && rs.have_len && rs.code >= 200 && rs.code < 300) {
            total = (rs.code == 206 && rs.have_range) ? rs.range_total : (have - rs.written) + rs.content_length;
            know_total = true;
        }
        if (rs.code == 412 || (rs.code == 416 && !(know_total && have == total))) {
            /* the object changed under us (ETag) or our offset is past its end: start over */
            if (ftruncate(fd, 0) != 0 || lseek(fd, 0, SEEK_SET) != 0) {
                s = cm_set_error(CM_ERR_IO, "downloading '%s': cannot restart '%s': %s", uri, tmp, strerror(errno));
                break;
            }
            have = 0, etag[0] = 0, know_total = false;
            k = RK_TRANSIENT;
        } else if (rs.code == 416) {
            break; /* everything had arrived */
        }
        if (k == RK_PERMANENT) {
            s = cm_last_status();
            break;
        }
        char msg[1024];
        snprintf(msg, sizeof msg, "%s (%" PRIu64 " bytes kept)", cm_last_error(), have);
        if (!retry_wait(st, attempt++, msg)) {
            s = cm_set_error(CM_ERR_IO, "%s (gave up after %d retries)", msg, st->cfg.max_retries);
            break;
        }
    }
    if (h) curl_easy_cleanup(h);
    if (!s && fsync(fd) != 0) s = cm_set_error(CM_ERR_IO, "downloading '%s': fsync of '%s' failed: %s", uri, tmp, strerror(errno));
    if (close(fd) != 0 && !s) s = cm_set_error(CM_ERR_IO, "downloading '%s': closing '%s' failed: %s", uri, tmp, strerror(errno));
    if (!s && rename(tmp, local_path) != 0)
        s = cm_set_error(CM_ERR_IO, "downloading '%s': cannot rename '%s' to '%s': %s", uri, tmp, local_path, strerror(errno));
    if (s) unlink(tmp);
    cm_free(tmp);
    return s;
}

/* ---- multipart upload ---- */

typedef struct mp_ctx {
    cm_object_store *st;
    const char *key, *uri, *local_path;
    char upload_id[512];  /* encoded for the query */
    int fd;
    uint64_t size;
    size_t part_size;
    int n_parts;
    char (*etags)[160];
    atomic_int next;
    atomic_bool failed;
    pthread_mutex_t mu;
    cm_status status;
    char msg[1536];
} mp_ctx;

static void mp_fail(mp_ctx *c, cm_status s, const char *msg) {
    pthread_mutex_lock(&c->mu);
    if (!atomic_load(&c->failed)) {
        c->status = s;
        snprintf(c->msg, sizeof c->msg, "%s", msg);
        atomic_store(&c->failed, true);
    }
    pthread_mutex_unlock(&c->mu);
}

static void *mp_worker(void *arg) {
    mp_ctx *c = arg;
    CURL *h = new_handle();
    char *buf = cm_alloc(c->part_size ? c->part_size : 1, 64);
    if (!h || !buf) {
        mp_fail(c, CM_ERR_OOM, "multipart upload: out of memory");
        goto out;
    }
    for (;;) {
        if (atomic_load(&c->failed)) break;
        int i = atomic_fetch_add(&c->next, 1);
        if (i >= c->n_parts) break;
        uint64_t off = (uint64_t)i * c->part_size;
        size_t n = (size_t)((c->size - off) < c->part_size ? (c->size - off) : c->part_size);
        size_t got = 0;
        while (got < n) {
            ssize_t r = pread(c->fd, buf + got, n - got, (off_t)(off + got));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            got += (size_t)r;
        }
        if (got != n) {
            char m[512];
            snprintf(m, sizeof m, "uploading '%s': reading part %d of '%s' failed (the file changed?)", c->uri, i + 1,
                     c->local_path);
            mp_fail(c, CM_ERR_IO, m);
            break;
        }
        char q[700];
        snprintf(q, sizeof q, "partNumber=%d&uploadId=%s", i + 1, c->upload_id);
        s3_req rq = {"PUT", c->key, q, buf, n, NULL, NULL, -1, NULL};
        s3_resp rs;
        if (request(c->st, h, &rq, &rs, c->uri) != CM_OK) {
            char m[1400];
            snprintf(m, sizeof m, "part %d of %d: %s", i + 1, c->n_parts, cm_last_error());
            mp_fail(c, cm_last_status(), m);
            break;
        }
        if (!rs.etag[0]) {
            mp_fail(c, CM_ERR_IO, "multipart upload: a part's response has no ETag");
            break;
        }
        snprintf(c->etags[i], sizeof c->etags[i], "%s", rs.etag);
    }
out:
    cm_free(buf);
    if (h) curl_easy_cleanup(h);
    return NULL;
}

static cm_status multipart(cm_object_store *st, const char *key, const char *uri, const char *local_path, int fd,
                           uint64_t size) {
    CURL *h = new_handle();
    if (!h) return cm_last_status();
    membuf mb = {NULL, 0, 0, 1 << 20, false};
    s3_resp rs;
    s3_req init = {"POST", key, "uploads=", NULL, 0, NULL, NULL, -1, &mb};
    cm_status s = request(st, h, &init, &rs, uri);
    mp_ctx c;
    memset(&c, 0, sizeof c);
    char raw_id[400];
    if (!s && (!mb.p || !xml_get(mb.p, "UploadId", raw_id, sizeof raw_id, NULL) || !raw_id[0]))
        s = cm_set_error(CM_ERR_IO, "uploading '%s': the server did not start a multipart upload (no UploadId)", uri);
    cm_free(mb.p);
    if (s) {
        curl_easy_cleanup(h);
        return s;
    }
    cmi_uri_encode(raw_id, false, c.upload_id, sizeof c.upload_id);
    c.st = st, c.key = key, c.uri = uri, c.local_path = local_path, c.fd = fd, c.size = size;
    c.part_size = st->cfg.part_size;
    c.n_parts = (int)((size + c.part_size - 1) / c.part_size);
    c.etags = cm_alloc_zeroed(sizeof *c.etags * (size_t)c.n_parts, 16);
    pthread_mutex_init(&c.mu, NULL);
    if (!c.etags) {
        mp_fail(&c, CM_ERR_OOM, "multipart upload: out of memory");
    } else {
        int nt = st->cfg.max_concurrency < c.n_parts ? st->cfg.max_concurrency : c.n_parts;
        pthread_t th[64];
        if (nt > 64) nt = 64;
        int started = 0;
        for (int i = 0; i < nt; i++) {
            if (pthread_create(&th[i], NULL, mp_worker, &c) != 0) break;
            started++;
        }
        if (!started) mp_worker(&c); /* no thread: upload the parts here */
        for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    }
    if (!atomic_load(&c.failed)) {
        /* complete: the parts in order with their ETags */
        membuf x = {NULL, 0, 0, (size_t)c.n_parts * 256 + 256, false};
        bool ok = mb_add(&x, "<CompleteMultipartUpload>", 25);
        for (int i = 0; ok && i < c.n_parts; i++) {
            char part[300];
            int k = snprintf(part, sizeof part, "<Part><PartNumber>%d</PartNumber><ETag>%s</ETag></Part>", i + 1,
                             c.etags[i]);
            ok = mb_add(&x, part, (size_t)k);
        }
        ok = ok && mb_add(&x, "</CompleteMultipartUpload>", 26);
        membuf resp = {NULL, 0, 0, 1 << 20, false};
        char q[600];
        snprintf(q, sizeof q, "uploadId=%s", c.upload_id);
        s3_req done = {"POST", key, q, x.p, x.n, NULL, NULL, -1, &resp};
        s = ok ? request(st, h, &done, &rs, uri) : cm_set_error(CM_ERR_OOM, "multipart upload: out of memory");
        /* S3 can answer 200 with an error in the body */
        char code[128], msg[512] = "";
        if (!s && resp.p && strstr(resp.p, "<Error>") && xml_get(resp.p, "Code", code, sizeof code, NULL)) {
            xml_get(resp.p, "Message", msg, sizeof msg, NULL);
            s = cm_set_error(CM_ERR_IO, "completing the multipart upload of '%s': %s: %s", uri, code, msg);
        }
        cm_free(x.p);
        cm_free(resp.p);
    } else {
        s = cm_set_error(c.status ? c.status : CM_ERR_IO, "uploading '%s' (multipart, %d parts): %s", uri, c.n_parts, c.msg);
    }
    if (s) {
        /* abort, so the parts do not linger (best effort: the first error is the one reported) */
        char keep[2048];
        snprintf(keep, sizeof keep, "%s", cm_last_error());
        cm_status ks = cm_last_status();
        char q[600];
        snprintf(q, sizeof q, "uploadId=%s", c.upload_id);
        s3_req ab = {"DELETE", key, q, NULL, 0, NULL, NULL, -1, NULL};
        r_kind k = perform(st, h, &ab, &rs, uri);
        cm_free(rs.err.p);
        if (k != RK_OK) cm_log_msg(CM_LOG_WARN, "storage: aborting the multipart upload of '%s' failed: %s", uri, cm_last_error());
        s = cm_set_error(ks, "%s", keep);
    }
    pthread_mutex_destroy(&c.mu);
    cm_free(c.etags);
    curl_easy_cleanup(h);
    return s;
}

static cm_status s3_upload(cm_object_store *st, const char *key, const char *uri, const char *local_path) {
    int fd = open(local_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return cm_set_error(errno == ENOENT ? CM_ERR_NOT_FOUND : CM_ERR_IO, "uploading '%s' to '%s': cannot open it: %s",
                            local_path, uri, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return cm_set_error(CM_ERR_IO, "uploading '%s' to '%s': not a regular file", local_path, uri);
    }
    const uint64_t size = (uint64_t)sb.st_size;
    cm_status s;
    if (size >= st->cfg.multipart_threshold && size > st->cfg.part_size) {
        s = multipart(st, key, uri, local_path, fd, size);
    } else {
        char *buf = cm_alloc(size ? size : 1, 64);
        s = buf ? CM_OK : cm_set_error(CM_ERR_OOM, "uploading '%s': cannot hold its %" PRIu64 " bytes", local_path, size);
        size_t got = 0;
        while (!s && got < size) {
            ssize_t r = pread(fd, buf + got, size - got, (off_t)got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) s = cm_set_error(CM_ERR_IO, "uploading '%s': read failed: %s", local_path, r < 0 ? strerror(errno) : "short file");
            else got += (size_t)r;
        }
        if (!s) s = s3_put(st, key, uri, buf, size);
        cm_free(buf);
    }
    close(fd);
    return s;
}

static cm_status s3_list(cm_object_store *st, const char *prefix, const char *uri, cm_object_list *out) {
    CURL *h = new_handle();
    if (!h) return cm_last_status();
    cm_status s = CM_OK;
    char token[2048] = "";
    size_t pl = strlen(prefix);
    char *ep = cm_alloc(3 * pl + 1, 1);
    char *q = cm_alloc(3 * pl + 3 * sizeof token + 128, 1);
    if (!ep || !q) s = cm_set_error(CM_ERR_OOM, "object listing: out of memory");
    if (!s) cmi_uri_encode(prefix, false, ep, 3 * pl + 1);
    for (int page = 0; !s; page++) {
        char et[3 * sizeof token + 1], mk[32] = "";
        cmi_uri_encode(token, false, et, sizeof et);
        if (cmi_s3_list_max_keys > 0) snprintf(mk, sizeof mk, "&max-keys=%d", cmi_s3_list_max_keys);
        sprintf(q, "list-type=2%s%s%s&prefix=%s", token[0] ? "&continuation-token=" : "", token[0] ? et : "", mk, ep);
        membuf mb = {NULL, 0, 0, 64u << 20, false};
        s3_resp rs;
        s3_req rq = {"GET", NULL, q, NULL, 0, NULL, NULL, -1, &mb};
        if ((s = request(st, h, &rq, &rs, uri))) {
            cm_free(mb.p);
            break;
        }
        const char *p = mb.p ? mb.p : "";
        char key[2048], size[64], trunc[16] = "";
        const char *contents;
        while (!s && (contents = strstr(p, "<Contents>"))) {
            const char *end = strstr(contents, "</Contents>");
            if (!end) break;
            size_t n = (size_t)(end - contents);
            char *one = cm_alloc(n + 1, 1);
            if (!one) {
                s = cm_set_error(CM_ERR_OOM, "object listing: out of memory");
                break;
            }
            memcpy(one, contents, n);
            one[n] = 0;
            if (xml_get(one, "Key", key, sizeof key, NULL) && xml_get(one, "Size", size, sizeof size, NULL))
                s = cmi_object_list_add(out, key, strtoull(size, NULL, 10));
            cm_free(one);
            p = end + 11;
        }
        bool more = mb.p && xml_get(mb.p, "IsTruncated", trunc, sizeof trunc, NULL) && !strcmp(trunc, "true");
        token[0] = 0;
        if (more && !xml_get(mb.p, "NextContinuationToken", token, sizeof token, NULL))
            s = s ? s : cm_set_error(CM_ERR_IO, "listing '%s': a truncated page without NextContinuationToken", uri);
        cm_free(mb.p);
        if (!more || page > 1000000) break;
    }
    cm_free(ep);
    cm_free(q);
    curl_easy_cleanup(h);
    return s;
}

static void s3_close(cm_object_store *st) {
    s3_store *s = st->impl;
    if (!s) return;
    cm_free(s->access);
    cm_free(s->secret);
    cm_free(s->token);
    cm_free(s);
    st->impl = NULL;
}

static const cmi_store_i k_s3 = {
    /* .name = */ "s3",
    /* .upload = */ s3_upload,
    /* .put = */ s3_put,
    /* .download = */ s3_download,
    /* .get = */ s3_get,
    /* .get_size = */ s3_get_size,
    /* .list = */ s3_list,
    /* .del = */ s3_del,
    /* .close = */ s3_close,
};

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && v[0] ? v : NULL;
}

static char *dup_str(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s);
    char *p = cm_alloc(n + 1, 1);
    if (p) memcpy(p, s, n + 1);
    return p;
}

cm_status cmi_s3_open(cm_object_store *st, const char *scheme, const char *bucket) {
    s3_store *s = cm_alloc_zeroed(sizeof *s, 16);
    if (!s) return CM_ERR_OOM;
    st->impl = s;
    st->vt = &k_s3;
    snprintf(s->scheme, sizeof s->scheme, "%s", scheme);
    snprintf(s->bucket, sizeof s->bucket, "%s", bucket);
    const bool gs = !strcmp(scheme, "gs"), oci = !strcmp(scheme, "oci");
    const cm_object_store_config *c = &st->cfg;
    /* credentials */
    const char *ak = c->access_key_id, *sk = c->secret_access_key, *tok = c->session_token;
    if (gs) {
        snprintf(s->cred_vars, sizeof s->cred_vars, "GCS_KEY / GCS_SECRET (HMAC keys)");
        if (!ak) ak = env("GCS_KEY");
        if (!sk) sk = env("GCS_SECRET");
    } else {
        snprintf(s->cred_vars, sizeof s->cred_vars, "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY");
        if (!ak) ak = env("AWS_ACCESS_KEY_ID");
        if (!sk) sk = env("AWS_SECRET_ACCESS_KEY");
        if (!tok) tok = env("AWS_SESSION_TOKEN");
    }
    if (!ak || !sk)
        return cm_set_error(CM_ERR_INVALID_ARG, "'%s': no credentials: set %s%s", st->uri, s->cred_vars,
                            oci ? " (an OCI customer secret key)" : "");
    if (!(s->access = dup_str(ak)) || !(s->secret = dup_str(sk)) || (tok && !(s->token = dup_str(tok))))
        return CM_ERR_OOM;
    /* region */
    const char *region = c->region;
    if (!region) region = gs ? "auto" : NULL;
    if (!region && oci) region = env("OCI_REGION");
    if (!region) region = env("AWS_REGION");
    if (!region) region = env("AWS_DEFAULT_REGION");
    if (!region) region = "us-east-1";
    snprintf(s->region, sizeof s->region, "%s", region);
    /* endpoint */
    const char *ep = c->endpoint_url;
    char made[512];
    if (!ep && !gs) ep = env("S3_ENDPOINT_URL");
    if (!ep && gs) ep = "https://storage.googleapis.com";
    if (!ep && oci) {
        const char *ns = env("OCI_NAMESPACE"), *r = env("OCI_REGION");
        if (!ns || !r)
            return cm_set_error(CM_ERR_INVALID_ARG, "'%s': no OCI endpoint: set S3_ENDPOINT_URL, or OCI_NAMESPACE and "
                                                    "OCI_REGION (https://<namespace>.compat.objectstorage.<region>."
                                                    "oraclecloud.com)", st->uri);
        snprintf(made, sizeof made, "https://%s.compat.objectstorage.%s.oraclecloud.com", ns, r);
        ep = made;
    }
    const bool custom = ep != NULL;
    if (!ep) {
        snprintf(made, sizeof made, "https://s3.%s.amazonaws.com", s->region);
        ep = made;
    }
    const char *hs = strstr(ep, "://");
    if (!hs || (strncmp(ep, "http://", 7) && strncmp(ep, "https://", 8)) || !hs[3])
        return cm_set_error(CM_ERR_INVALID_ARG, "'%s': endpoint '%s' is not an http:// or https:// URL (S3_ENDPOINT_URL)",
                            st->uri, ep);
    snprintf(s->proto, sizeof s->proto, "%.*s", (int)(hs - ep), ep);
    const char *host = hs + 3, *pth = strchr(host, '/');
    size_t hl = pth ? (size_t)(pth - host) : strlen(host);
    char hostonly[400];
    snprintf(hostonly, sizeof hostonly, "%.*s", (int)(hl < sizeof hostonly - 1 ? hl : sizeof hostonly - 1), host);
    /* drop a default port: the Host header must be what a server expects to sign */
    size_t hol = strlen(hostonly);
    if ((!strcmp(s->proto, "https") && hol > 4 && !strcmp(hostonly + hol - 4, ":443")) ||
        (!strcmp(s->proto, "http") && hol > 3 && !strcmp(hostonly + hol - 3, ":80")))
        *strrchr(hostonly, ':') = 0;
    char bpath[400] = "";
    if (pth) {
        snprintf(bpath, sizeof bpath, "%s", pth);
        size_t bl = strlen(bpath);
        while (bl && bpath[bl - 1] == '/') bpath[--bl] = 0;
    }
    bool path_style;
    if (c->addressing == CM_S3_ADDRESSING_PATH) path_style = true;
    else if (c->addressing == CM_S3_ADDRESSING_VIRTUAL) path_style = false;
    else path_style = custom || strchr(bucket, '.') != NULL;
    if (path_style) {
        snprintf(s->host, sizeof s->host, "%s", hostonly);
        char eb[800];
        cmi_uri_encode(bucket, false, eb, sizeof eb);
        snprintf(s->base_path, sizeof s->base_path, "%s/%s", bpath, eb);
    } else {
        snprintf(s->host, sizeof s->host, "%s.%s", bucket, hostonly);
        snprintf(s->base_path, sizeof s->base_path, "%s", bpath);
    }
    return CM_OK;
}
