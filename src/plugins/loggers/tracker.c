/* HTTP with retries (libcurl), the tracker worker thread and report-once bookkeeping. */
#include "tracker.h"

#include "loggers_impl.h"

#include <curl/curl.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* ---- HTTP ---- */

struct cmi_http {
    CURL *curl;
    struct curl_slist *headers;
    char *who, *ca_path, *client_cert;
    cmi_http_opts o;
    uint64_t jitter_state;
    double retry_after; /* seconds from the last answer's Retry-After, 0 if none */
    char user_agent[64];
    double deadline; /* atomic: 0 = none */
};

void cmi_http_set_deadline(cmi_http *h, double t) { __atomic_store(&h->deadline, &t, __ATOMIC_RELEASE); }

double cmi_http_deadline(cmi_http *h) {
    double t;
    __atomic_load(&h->deadline, &t, __ATOMIC_ACQUIRE);
    return t;
}

/* libcurl's progress callback: a nonzero return aborts the transfer (past the deadline). */
static int on_progress(void *data, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un) {
    (void)dt, (void)dn, (void)ut, (void)un;
    const double d = cmi_http_deadline(data);
    return d > 0 && cmi_unix_time() >= d;
}

static pthread_once_t g_curl_once = PTHREAD_ONCE_INIT;
static CURLcode g_curl_init = CURLE_OK;
static void curl_init_once(void) { g_curl_init = curl_global_init(CURL_GLOBAL_DEFAULT); }

cm_status cmi_http_new(const cmi_http_opts *opts, cmi_http **out) {
    *out = NULL;
    pthread_once(&g_curl_once, curl_init_once);
    if (g_curl_init != CURLE_OK)
        return cm_set_error(CM_ERR_IO, "%s: libcurl did not start: %s", opts->who, curl_easy_strerror(g_curl_init));
    cmi_http *h = cm_alloc_zeroed(sizeof *h, 16);
    if (!h) return cm_set_error(CM_ERR_OOM, "%s: out of memory", opts->who);
    h->o = *opts;
    h->who = cmi_strdup(opts->who);
    h->ca_path = opts->ca_path ? cmi_strdup(opts->ca_path) : NULL;
    h->client_cert = opts->client_cert ? cmi_strdup(opts->client_cert) : NULL;
    h->curl = curl_easy_init();
    h->jitter_state = (uint64_t)cm_clock_ns() | 1;
    snprintf(h->user_agent, sizeof h->user_agent, "composer-c/%s", cm_version());
    if (!h->who || (opts->ca_path && !h->ca_path) || (opts->client_cert && !h->client_cert) ||
        !(h->headers = curl_slist_append(NULL, "Content-Type: application/json")) || !h->curl) {
        cmi_http_free(h);
        return cm_set_error(CM_ERR_OOM, "%s: out of memory starting an HTTP client", opts->who);
    }
    h->o.who = h->who, h->o.ca_path = h->ca_path, h->o.client_cert = h->client_cert;
    *out = h;
    return CM_OK;
}

void cmi_http_free(cmi_http *h) {
    if (!h) return;
    if (h->curl) curl_easy_cleanup(h->curl);
    curl_slist_free_all(h->headers);
    cm_free(h->who), cm_free(h->ca_path), cm_free(h->client_cert);
    cm_free(h);
}

cm_status cmi_http_add_header(cmi_http *h, const char *header) {
    struct curl_slist *n = curl_slist_append(h->headers, header);
    if (!n) return cm_set_error(CM_ERR_OOM, "%s: out of memory for a header", h->who);
    h->headers = n;
    return CM_OK;
}

void cmi_http_reply_free(cmi_http_reply *r) { cmi_buf_free(&r->body); }

bool cmi_http_retryable(long status) { return status == 429 || (status >= 500 && status <= 599 && status != 501); }

static size_t on_body(char *p, size_t sz, size_t n, void *data) {
    cmi_buf *b = data;
    cmi_buf_put(b, p, sz * n);
    return b->oom ? 0 : sz * n;
}

static size_t on_header(char *p, size_t sz, size_t n, void *data) {
    cmi_http *h = data;
    const size_t len = sz * n;
    if (len > 12 && strncasecmp(p, "Retry-After:", 12) == 0) {
        char tmp[64];
        size_t k = len - 12 < sizeof tmp - 1 ? len - 12 : sizeof tmp - 1;
        memcpy(tmp, p + 12, k);
        tmp[k] = '\0';
        char *end;
        double v = strtod(tmp, &end);
        if (end != tmp && v >= 0) h->retry_after = v; /* (an HTTP date is ignored: the backoff applies) */
    }
    return len;
}

static double jitter(cmi_http *h) {
    h->jitter_state ^= h->jitter_state << 13, h->jitter_state ^= h->jitter_state >> 7,
        h->jitter_state ^= h->jitter_state << 17;
    return (double)(h->jitter_state >> 11) / 9007199254740992.0;
}

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

cm_status cmi_http_request(cmi_http *h, const char *method, const char *url, const char *body, size_t len,
                           bool no_retry, cmi_http_reply *reply, int64_t *retries) {
    cmi_buf_reset(&reply->body);
    reply->status = 0;
    reply->attempts = 0;
    reply->error[0] = '\0';
    const bool post = strcmp(method, "POST") == 0;
    char errbuf[CURL_ERROR_SIZE];
    for (int attempt = 0;; attempt++) {
        double timeout = h->o.timeout_s;
        const double deadline = cmi_http_deadline(h);
        if (deadline > 0) {
            const double left = deadline - cmi_unix_time();
            if (left <= 0.05) {
                if (!reply->error[0]) snprintf(reply->error, sizeof reply->error, "no time left before the deadline");
                return cm_set_error(CM_ERR_TIMEOUT, "%s: %s %s: %s", h->who, method, url, reply->error);
            }
            if (left < timeout) timeout = left;
        }
        CURL *c = h->curl;
        curl_easy_reset(c);
        cmi_buf_reset(&reply->body);
        h->retry_after = 0;
        errbuf[0] = '\0';
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(timeout * 1000));
        curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)(fmin(timeout, 30.0) * 1000));
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, h->headers);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &reply->body);
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(c, CURLOPT_HEADERDATA, h);
        curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
        curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(c, CURLOPT_XFERINFODATA, h);
        curl_easy_setopt(c, CURLOPT_USERAGENT, h->user_agent);
        curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
        if (h->o.insecure_tls) {
            curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 0L);
            curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 0L);
        }
        if (h->o.ca_path) curl_easy_setopt(c, CURLOPT_CAINFO, h->o.ca_path);
        if (h->o.client_cert) curl_easy_setopt(c, CURLOPT_SSLCERT, h->o.client_cert);
        if (post) {
            curl_easy_setopt(c, CURLOPT_POST, 1L);
            curl_easy_setopt(c, CURLOPT_POSTFIELDS, body ? body : "");
            curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(body ? len : 0));
        } else {
            curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
        }
        CURLcode rc = curl_easy_perform(c);
        reply->attempts++;
        long status = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        if (rc == CURLE_OK) {
            reply->status = status;
            if (!cmi_http_retryable(status)) {
                if (status >= 400) {
                    const char *b = cmi_buf_str(&reply->body);
                    snprintf(reply->error, sizeof reply->error, "HTTP %ld: %.200s", status, b);
                }
                return CM_OK;
            }
            snprintf(reply->error, sizeof reply->error, "HTTP %ld: %.200s", status, cmi_buf_str(&reply->body));
        } else {
            reply->status = 0;
            if (rc == CURLE_ABORTED_BY_CALLBACK)
                snprintf(reply->error, sizeof reply->error, "cut off at the deadline (close_timeout)");
            else
                snprintf(reply->error, sizeof reply->error, "%s", errbuf[0] ? errbuf : curl_easy_strerror(rc));
        }
        if (no_retry || attempt >= h->o.max_retries) break;
        double wait = h->o.backoff_factor * pow(2.0, attempt) + h->o.backoff_jitter * jitter(h);
        if (h->retry_after > wait) wait = h->retry_after;
        if (wait > 120) wait = 120;
        const double dl = cmi_http_deadline(h);
        if (dl > 0 && cmi_unix_time() + wait >= dl) break;
        if (retries) (*retries)++;
        sleep_s(wait);
    }
    if (reply->status) return CM_OK; /* an answer, if a bad one (the caller reads the status) */
    return cm_set_error(CM_ERR_IO, "%s: %s %s: %s (after %d attempt%s)", h->who, method, url, reply->error,
                        reply->attempts, reply->attempts == 1 ? "" : "s");
}

void cmi_url_encode(cmi_buf *b, const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if ((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-' ||
            *p == '.' || *p == '_' || *p == '~')
            cmi_buf_putc(b, *p);
        else
            cmi_buf_printf(b, "%%%02X", *p);
    }
}

/* ---- worker ---- */

static void *worker_main(void *arg) {
    cmi_worker *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        if (!w->stop && !w->kick) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            const double t = (double)until.tv_sec + until.tv_nsec * 1e-9 + w->interval_s;
            until.tv_sec = (time_t)t;
            until.tv_nsec = (long)((t - floor(t)) * 1e9);
            while (!w->stop && !w->kick) {
                if (pthread_cond_timedwait(&w->cv, &w->mu, &until) == ETIMEDOUT) break;
            }
        }
        const bool last = w->stop;
        w->kick = false;
        w->in_round = true;
        pthread_mutex_unlock(&w->mu);
        w->work(w->self, last);
        pthread_mutex_lock(&w->mu);
        w->in_round = false;
        w->rounds++;
        pthread_cond_broadcast(&w->done_cv);
        if (last) break;
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

cm_status cmi_worker_start(cmi_worker *w, double interval_s, void (*work)(void *, bool), void *self) {
    *w = (cmi_worker){.interval_s = interval_s > 0 ? interval_s : 1.0, .work = work, .self = self};
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    pthread_cond_init(&w->done_cv, NULL);
    int e = pthread_create(&w->thread, NULL, worker_main, w);
    if (e) {
        pthread_cond_destroy(&w->cv), pthread_cond_destroy(&w->done_cv);
        pthread_mutex_destroy(&w->mu);
        return cm_set_error(CM_ERR_IO, "cannot start the sending thread: %s", strerror(e));
    }
    w->running = true;
    return CM_OK;
}

void cmi_worker_lock(cmi_worker *w) { pthread_mutex_lock(&w->mu); }
void cmi_worker_unlock(cmi_worker *w) { pthread_mutex_unlock(&w->mu); }

void cmi_worker_kick(cmi_worker *w) {
    if (!w->running) return;
    pthread_mutex_lock(&w->mu);
    w->kick = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void cmi_worker_flush(cmi_worker *w) {
    if (!w->running) return;
    pthread_mutex_lock(&w->mu);
    /* a round in progress may have taken its data before ours was queued: wait for the next one
     * (the kick makes the worker start it as soon as the current one ends) */
    const int64_t target = w->rounds + (w->in_round ? 2 : 1);
    w->kick = true;
    pthread_cond_signal(&w->cv);
    while (w->rounds < target) pthread_cond_wait(&w->done_cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

void cmi_worker_stop(cmi_worker *w) {
    if (!w->running) return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    w->running = false;
    pthread_cond_destroy(&w->cv), pthread_cond_destroy(&w->done_cv);
    pthread_mutex_destroy(&w->mu);
}

/* ---- health ---- */

void cmi_health_down(cmi_health *h, const char *who, const char *what) {
    h->st.down = true;
    snprintf(h->st.last_error, sizeof h->st.last_error, "%s", what);
    if (h->reported_down) return;
    h->reported_down = true;
    h->st.reports++;
    cm_log_msg(CM_LOG_WARN, "%s: %s; what is logged is kept (up to the queue's bound) and sent when it answers; "
                            "training goes on (a FileLogger's metrics.jsonl has every value)",
               who, what);
}

void cmi_health_up(cmi_health *h, const char *who) {
    if (!h->st.down) return;
    h->st.down = false;
    cm_log_msg(CM_LOG_INFO, "%s: the server answers again; sending what was kept", who);
}

void cmi_health_rejected(cmi_health *h, const char *who, const char *what) {
    snprintf(h->st.last_error, sizeof h->st.last_error, "%s", what);
    if (h->reported_rejected) return;
    h->reported_rejected = true;
    h->st.reports++;
    cm_log_msg(CM_LOG_WARN, "%s: %s; training goes on (a FileLogger's metrics.jsonl has every value)", who, what);
}

const char *cmi_env(const char *name) {
    const char *v = getenv(name);
    return v && v[0] ? v : NULL;
}
