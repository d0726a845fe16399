/* Private machinery of the network trackers (MLflow, W&B): HTTP requests through libcurl with
 * retries and exponential backoff on 429, 5xx and network errors (honouring Retry-After), a
 * background worker thread that wakes every flush interval (or when kicked) to send what the
 * training thread queued, and the "report once" bookkeeping behind cm_tracker_stats. */
#ifndef CM_LOGGERS_TRACKER_H
#define CM_LOGGERS_TRACKER_H

#include <composer/loggers.h>

#include "wire.h"

#include <pthread.h>
#include <stdbool.h>

/* ---- HTTP ---- */

typedef struct cmi_http_opts {
    const char *who;        /* "MLFlowLogger": prefixes messages */
    double timeout_s;       /* per attempt (connect + transfer) */
    int max_retries;        /* attempts after the first one */
    double backoff_factor;  /* wait before retry k: factor·2^(k-1) s (+ jitter·U[0,1)), at most 120 s */
    double backoff_jitter;
    bool insecure_tls;      /* do not verify the server's certificate */
    const char *ca_path;    /* a CA bundle for the server's certificate (NULL = the system's) */
    const char *client_cert; /* a client certificate (PEM, with its key), NULL = none */
} cmi_http_opts;

typedef struct cmi_http cmi_http;

/* A client; opts' strings are copied. Errors: CM_ERR_OOM, CM_ERR_IO (libcurl failed to start). */
cm_status cmi_http_new(const cmi_http_opts *opts, cmi_http **out);
void cmi_http_free(cmi_http *h);
/* Adds a header sent with every request ("Authorization: Bearer ..."); copied. */
cm_status cmi_http_add_header(cmi_http *h, const char *header);

typedef struct cmi_http_reply {
    long status;  /* the HTTP status of the last attempt (0: no answer) */
    cmi_buf body; /* its body (NUL-terminated through cmi_buf_str) */
    int attempts;
    char error[320]; /* why the last attempt failed ("" on success) */
} cmi_http_reply;
void cmi_http_reply_free(cmi_http_reply *r);

/* One request: method "GET" or "POST" (body JSON with Content-Type: application/json). Retries
 * network errors, 429 and 5xx (except 501) up to max_retries with backoff, not at all when
 * `no_retry`, and never past the client's deadline (cmi_http_set_deadline: a transfer in flight
 * is cut off then). *retries counts the repeated attempts. Returns CM_OK when an answer came (any
 * status: check reply->status), CM_ERR_IO (or CM_ERR_TIMEOUT past the deadline) when none did,
 * with reply->error saying why. One thread at a time per client. */
cm_status cmi_http_request(cmi_http *h, const char *method, const char *url, const char *body, size_t len,
                           bool no_retry, cmi_http_reply *reply, int64_t *retries);
/* Sets the time (cmi_unix_time() seconds; 0 = none) after which requests give up, also one in
 * flight. Any thread may call it. */
void cmi_http_set_deadline(cmi_http *h, double t);
double cmi_http_deadline(cmi_http *h);

/* Whether a status is worth retrying (429, 5xx but 501) — the policy cmi_http_request applies. */
bool cmi_http_retryable(long status);

/* URL-encodes s into b (RFC 3986 unreserved characters kept). */
void cmi_url_encode(cmi_buf *b, const char *s);

/* ---- the worker thread ---- */

typedef struct cmi_worker {
    pthread_t thread;
    pthread_mutex_t mu; /* also guards the logger's queued data */
    pthread_cond_t cv, done_cv;
    bool running, stop, kick, in_round;
    int64_t rounds; /* work() calls finished */
    double interval_s;
    /* On the worker thread, without mu held: one round of sending; `last` on the final round
     * (after cmi_worker_stop). */
    void (*work)(void *self, bool last);
    void *self;
} cmi_worker;

cm_status cmi_worker_start(cmi_worker *w, double interval_s, void (*work)(void *, bool), void *self);
void cmi_worker_lock(cmi_worker *w);
void cmi_worker_unlock(cmi_worker *w);
/* Asks for a round now (mu must NOT be held). */
void cmi_worker_kick(cmi_worker *w);
/* Kicks and waits until a round that started after the kick has finished. */
void cmi_worker_flush(cmi_worker *w);
/* Stops the thread after a final round (work(self, true)) and joins it. Idempotent. */
void cmi_worker_stop(cmi_worker *w);

/* ---- report-once bookkeeping (guarded by the worker's mu) ---- */

typedef struct cmi_health {
    cm_tracker_stats st;
    bool reported_down, reported_rejected;
} cmi_health;

/* The tracker stopped answering: the first time, a warning (counted in st.reports); `what` says
 * what failed and why. */
void cmi_health_down(cmi_health *h, const char *who, const char *what);
/* It answered again after being down: an info line (not a report). */
void cmi_health_up(cmi_health *h, const char *who);
/* A request the server rejected (4xx): a warning the first time. */
void cmi_health_rejected(cmi_health *h, const char *who, const char *what);

/* An environment variable that is set and not empty, else NULL. */
const char *cmi_env(const char *name);

#endif
