/* MLFlowLogger: Composer's MLFlowLogger over MLflow's REST API (FORMATS.md §8) — experiment by
 * name (or created), a run with Composer's tags, params once, metrics batched per flush interval
 * and chunked at the API's limits, FINISHED/FAILED at the end — sent from a worker thread. */
#include "loggers_impl.h"
#include "tracker.h"
#include "wire.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* MLflow's limits (mlflow/utils/validation.py) */
enum {
    MAX_METRICS_PER_BATCH = 1000,
    MAX_PARAMS_TAGS_PER_BATCH = 100,
    MAX_BATCH_BYTES = 1000000,
    MAX_ENTITY_KEY_LENGTH = 250,
    MAX_PARAM_VAL_LENGTH = 6000,
    MAX_TAG_VAL_LENGTH = 5000,
    MAX_EXPERIMENT_NAME_LENGTH = 500,
};

typedef struct {
    const char *key; /* the name sent (stable: owned by the intern table or the rename list) */
    double value;
    int64_t ts_ms, step;
} ml_metric;

typedef struct {
    char *key, *value;
} ml_kv;

/* Per interned metric name: what was sent last (Composer's duplicate rule) and its MLflow name. */
typedef struct {
    const char *out; /* the name sent (renamed), borrowed from the intern table or the rename list */
    double last_value;
    int64_t last_step;
    bool logged, valid;
} ml_name;

typedef struct {
    /* configuration (owned) */
    char *api; /* <tracking uri>/api/2.0/mlflow */
    char *experiment_name, *experiment_id_env, *run_id_env, *run_name_cfg, *run_group, *auth;
    ml_kv *tags, *rename;
    size_t n_tags, n_rename;
    char **ignore_m, **ignore_h;
    size_t n_ignore_m, n_ignore_h;
    bool rank_zero_only, resume;
    double flush_interval, close_timeout;
    int64_t dup_every, max_queued;
    cmi_http_opts http_opts;
    /* training thread */
    bool initialised, enabled, fit_open, closed;
    cmi_intern names;
    ml_name *info; /* (names.n) */
    int64_t info_cap;
    char *run_name, *composer_run_name, *user;
    /* shared with the worker (under w.mu) */
    cmi_worker w;
    ml_metric *q;
    int64_t qn, qcap;
    ml_kv *pq; /* params waiting */
    int64_t pqn, pqcap;
    const char *final_status; /* set at close: "FINISHED" or "FAILED" */
    cmi_health health;
    /* worker thread */
    cmi_http *http;
    bool setup_done, dead;
    char experiment_id[128], run_id[128];
    ml_kv *sent_params; /* the params the run has */
    int64_t n_sent_params, cap_sent_params;
    ml_metric *wq; /* the round's taken metrics */
    int64_t wqn, wqcap;
    ml_kv *wp;
    int64_t wpn, wpcap;
    cmi_buf body;
    cmi_http_reply reply;
} mlflow_logger;

cm_mlflow_logger_config cm_mlflow_logger_config_default(void) {
    return (cm_mlflow_logger_config){
        .rank_zero_only = true,
        .flush_interval = 10.0,
        .log_duplicated_metric_every_n_steps = 100,
        .max_retries = -1,
        .backoff_factor = -1,
        .backoff_jitter = -1,
        .request_timeout = 0,
        .close_timeout = 60.0,
        .max_queued = 100000,
    };
}

/* ---- names MLflow accepts (validation.py: ^[/\w.\- ]*$, no path tricks, <= 250) ---- */

static bool valid_name(const char *s, const char **why) {
    const size_t n = strlen(s);
    if (n == 0) return *why = "it is empty", false;
    if (n > MAX_ENTITY_KEY_LENGTH) return *why = "it is longer than 250 characters", false;
    for (const char *c = s; *c; c++)
        if (!(isalnum((unsigned char)*c) || *c == '_' || *c == '-' || *c == '.' || *c == ' ' || *c == '/'))
            return *why = "MLflow names may only contain letters, digits, _ - . space and /", false;
    /* posixpath.normpath(name) must be the name itself, not ".", not "..*", not "/..." */
    if (s[0] == '/') return *why = "it starts with '/'", false;
    if (strstr(s, "//")) return *why = "it has '//'", false;
    if (s[n - 1] == '/' && n > 1) return *why = "it ends with '/'", false;
    for (const char *seg = s; seg && *seg;) {
        const char *end = strchr(seg, '/');
        const size_t k = end ? (size_t)(end - seg) : strlen(seg);
        if ((k == 1 && seg[0] == '.') || (k == 2 && seg[0] == '.' && seg[1] == '.'))
            return *why = "it has a '.' or '..' path segment", false;
        seg = end ? end + 1 : NULL;
    }
    return true;
}

/* ---- JSON replies ---- */

static const char *json_str_at(const cJSON *o, const char *a, const char *b, const char *c) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b) x = cJSON_GetObjectItemCaseSensitive(x, b);
    if (c) x = cJSON_GetObjectItemCaseSensitive(x, c);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

/* The error_code of an MLflow error reply, or "". */
static void error_code(const cmi_http_reply *r, char *out, size_t cap) {
    out[0] = '\0';
    cJSON *j = cJSON_ParseWithLength((const char *)r->body.p, r->body.n);
    const char *code = j ? json_str_at(j, "error_code", NULL, NULL) : NULL;
    if (code) snprintf(out, cap, "%s", code);
    cJSON_Delete(j);
}

/* ---- requests (worker thread) ---- */

typedef enum { SENT, DOWN, REJECTED } outcome;

/* One request to <api>/<endpoint> (a GET's query is part of the endpoint). SENT: 2xx (reply in
 * lg->reply). DOWN: no good answer after the retries (the tracker is down; the caller keeps its
 * data). REJECTED: a 4xx (the data is bad or refused; reported once). While the server is down,
 * each round tries once; while closing, the retries apply again, up to the close's deadline. */
static outcome call(mlflow_logger *lg, const char *method, const char *endpoint, const char *body, size_t len,
                    bool quiet_404) {
    cmi_buf url = {0};
    cmi_buf_printf(&url, "%s/%s", lg->api, endpoint);
    int64_t retries = 0;
    const bool closing = cmi_http_deadline(lg->http) > 0;
    cm_status s = url.oom ? CM_ERR_OOM
                          : cmi_http_request(lg->http, method, cmi_buf_str(&url), body, len,
                                             lg->health.st.down && !closing, &lg->reply, &retries);
    cmi_worker_lock(&lg->w);
    lg->health.st.retries += retries;
    outcome o;
    if (s || cmi_http_retryable(lg->reply.status) || lg->reply.status == 0) {
        char what[700];
        snprintf(what, sizeof what, "the tracking server %s did not take %s %s: %s (after %d attempt%s)", lg->api,
                 method, endpoint, s == CM_ERR_OOM ? "out of memory" : lg->reply.error, lg->reply.attempts,
                 lg->reply.attempts == 1 ? "" : "s");
        lg->health.st.failed_requests++;
        cmi_health_down(&lg->health, "MLFlowLogger", what);
        o = DOWN;
    } else if (lg->reply.status >= 400) {
        if (!(quiet_404 && lg->reply.status == 404)) {
            char what[700];
            snprintf(what, sizeof what, "the tracking server refused %s %s: %s", method, endpoint, lg->reply.error);
            lg->health.st.failed_requests++;
            cmi_health_rejected(&lg->health, "MLFlowLogger", what);
        }
        cmi_health_up(&lg->health, "MLFlowLogger");
        o = REJECTED;
    } else {
        lg->health.st.requests++;
        cmi_health_up(&lg->health, "MLFlowLogger");
        o = SENT;
    }
    cmi_worker_unlock(&lg->w);
    cmi_buf_free(&url);
    return o;
}

static void put_tag(cmi_buf *b, bool *first, const char *k, const char *v) {
    if (!*first) cmi_buf_putc(b, ',');
    *first = false;
    cmi_buf_puts(b, "{\"key\":");
    cmi_json_str(b, k);
    cmi_buf_puts(b, ",\"value\":");
    cmi_json_str(b, v);
    cmi_buf_putc(b, '}');
}

/* The run's tags as a JSON array (the mlflow.* ones only for a new run, as mlflow.start_run). */
static void put_tags(mlflow_logger *lg, cmi_buf *b, bool system) {
    bool first = true;
    cmi_buf_putc(b, '[');
    if (system) {
        put_tag(b, &first, "mlflow.runName", lg->run_name);
        put_tag(b, &first, "mlflow.user", lg->user);
        put_tag(b, &first, "mlflow.source.name", "composer");
        put_tag(b, &first, "mlflow.source.type", "LOCAL");
    }
    put_tag(b, &first, "run_name", lg->composer_run_name);
    if (lg->run_group) put_tag(b, &first, "run_group", lg->run_group);
    for (size_t i = 0; i < lg->n_tags; i++) put_tag(b, &first, lg->tags[i].key, lg->tags[i].value);
    cmi_buf_putc(b, ']');
}

/* Records a param the run has (copies; on OOM it is forgotten: the server judges a resend). */
static void remember_param(mlflow_logger *lg, const char *k, const char *v) {
    for (int64_t j = 0; j < lg->n_sent_params; j++)
        if (!strcmp(lg->sent_params[j].key, k)) return;
    if (lg->n_sent_params == lg->cap_sent_params) {
        int64_t cap = lg->cap_sent_params ? 2 * lg->cap_sent_params : 32;
        ml_kv *ns = cm_alloc(sizeof *ns * (size_t)cap, 16);
        if (!ns) return;
        if (lg->n_sent_params) memcpy(ns, lg->sent_params, sizeof *ns * (size_t)lg->n_sent_params);
        cm_free(lg->sent_params);
        lg->sent_params = ns, lg->cap_sent_params = cap;
    }
    ml_kv kv = {cmi_strdup(k), cmi_strdup(v)};
    if (!kv.key || !kv.value) {
        cm_free(kv.key), cm_free(kv.value);
        return;
    }
    lg->sent_params[lg->n_sent_params++] = kv;
}

static const char *reply_id(mlflow_logger *lg, const char *a, const char *b, const char *c, char *out, size_t cap) {
    cJSON *j = cJSON_ParseWithLength((const char *)lg->reply.body.p, lg->reply.body.n);
    const char *id = j ? json_str_at(j, a, b, c) : NULL;
    if (id) snprintf(out, cap, "%s", id);
    cJSON_Delete(j);
    return id ? out : NULL;
}

/* Experiment and run. Returns false when it must be tried again later (down) or never (dead). */
static bool setup(mlflow_logger *lg) {
    cmi_buf *b = &lg->body;
    if (!lg->experiment_id[0]) {
        if (lg->experiment_id_env) {
            snprintf(lg->experiment_id, sizeof lg->experiment_id, "%s", lg->experiment_id_env);
        } else {
            for (int attempt = 0; attempt < 2 && !lg->experiment_id[0]; attempt++) {
                cmi_buf_reset(b);
                cmi_buf_puts(b, "experiments/get-by-name?experiment_name=");
                cmi_url_encode(b, lg->experiment_name);
                outcome o = call(lg, "GET", cmi_buf_str(b), NULL, 0, true);
                if (o == DOWN) return false;
                if (o == SENT) {
                    if (!reply_id(lg, "experiment", "experiment_id", NULL, lg->experiment_id, sizeof lg->experiment_id))
                        goto bad_reply;
                    break;
                }
                char code[64];
                error_code(&lg->reply, code, sizeof code);
                if (lg->reply.status != 404 || strcmp(code, "RESOURCE_DOES_NOT_EXIST") != 0) goto refused;
                cmi_buf_reset(b);
                cmi_buf_puts(b, "{\"name\":");
                cmi_json_str(b, lg->experiment_name);
                cmi_buf_putc(b, '}');
                o = call(lg, "POST", "experiments/create", cmi_buf_str(b), b->n, true);
                if (o == DOWN) return false;
                if (o == SENT) {
                    if (!reply_id(lg, "experiment_id", NULL, NULL, lg->experiment_id, sizeof lg->experiment_id))
                        goto bad_reply;
                    break;
                }
                error_code(&lg->reply, code, sizeof code);
                if (strcmp(code, "RESOURCE_ALREADY_EXISTS") != 0) goto refused;
                /* another process created it meanwhile: look it up again */
            }
            if (!lg->experiment_id[0]) goto refused;
        }
    }
    char run_id[128] = "";
    bool reused = false;
    if (lg->run_id_env) {
        snprintf(run_id, sizeof run_id, "%s", lg->run_id_env);
        reused = true;
    } else if (lg->resume) {
        cmi_buf_reset(b);
        cmi_buf_puts(b, "{\"experiment_ids\":[");
        cmi_json_str(b, lg->experiment_id);
        cmi_buf_puts(b, "],\"filter\":");
        cmi_buf tmp = {0}; /* Composer's filter (run names have no quotes: cm_run_name_check) */
        cmi_buf_printf(&tmp, "tags.run_name = \"%s\"", lg->composer_run_name);
        cmi_json_str(b, cmi_buf_str(&tmp));
        cmi_buf_free(&tmp);
        cmi_buf_puts(b, ",\"max_results\":1}");
        outcome o = call(lg, "POST", "runs/search", cmi_buf_str(b), b->n, false);
        if (o == DOWN) return false;
        if (o == REJECTED) goto refused;
        cJSON *j = cJSON_ParseWithLength((const char *)lg->reply.body.p, lg->reply.body.n);
        const cJSON *runs = j ? cJSON_GetObjectItemCaseSensitive(j, "runs") : NULL;
        const char *id = cJSON_IsArray(runs) && cJSON_GetArraySize(runs) > 0
                             ? json_str_at(cJSON_GetArrayItem(runs, 0), "info", "run_id", NULL)
                             : NULL;
        if (id) snprintf(run_id, sizeof run_id, "%s", id), reused = true;
        cJSON_Delete(j);
    }
    if (reused) {
        /* the params it has already: MLflow refuses to change one, and a refused log-batch loses
         * the whole request, so changed values are left out here (with a warning) instead */
        cmi_buf_reset(b);
        cmi_buf_puts(b, "runs/get?run_id=");
        cmi_url_encode(b, run_id);
        outcome o = call(lg, "GET", cmi_buf_str(b), NULL, 0, false);
        if (o == DOWN) return false;
        if (o == REJECTED) goto refused;
        cJSON *j = cJSON_ParseWithLength((const char *)lg->reply.body.p, lg->reply.body.n);
        const cJSON *run = j ? cJSON_GetObjectItemCaseSensitive(j, "run") : NULL;
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(run, "data"), "params");
        const cJSON *it;
        cJSON_ArrayForEach(it, ps) {
            const char *k = json_str_at(it, "key", NULL, NULL), *v = json_str_at(it, "value", NULL, NULL);
            if (k && v) remember_param(lg, k, v);
        }
        cJSON_Delete(j);
        /* as mlflow.start_run(run_id=...): the run is RUNNING again, with this session's tags */
        cmi_buf_reset(b);
        cmi_buf_puts(b, "{\"run_id\":");
        cmi_json_str(b, run_id);
        cmi_buf_puts(b, ",\"status\":\"RUNNING\"}");
        o = call(lg, "POST", "runs/update", cmi_buf_str(b), b->n, false);
        if (o == DOWN) return false;
        if (o == REJECTED) goto refused;
        cmi_buf_reset(b);
        cmi_buf_puts(b, "{\"run_id\":");
        cmi_json_str(b, run_id);
        cmi_buf_puts(b, ",\"tags\":");
        put_tags(lg, b, false);
        cmi_buf_putc(b, '}');
        o = call(lg, "POST", "runs/log-batch", cmi_buf_str(b), b->n, false);
        if (o == DOWN) return false;
        if (o == REJECTED) goto refused;
    } else {
        cmi_buf_reset(b);
        cmi_buf_puts(b, "{\"experiment_id\":");
        cmi_json_str(b, lg->experiment_id);
        cmi_buf_puts(b, ",\"user_id\":");
        cmi_json_str(b, lg->user);
        cmi_buf_puts(b, ",\"run_name\":");
        cmi_json_str(b, lg->run_name);
        cmi_buf_printf(b, ",\"start_time\":%lld,\"tags\":", (long long)(cmi_unix_time() * 1000));
        put_tags(lg, b, true);
        cmi_buf_putc(b, '}');
        if (b->oom) return false;
        outcome o = call(lg, "POST", "runs/create", cmi_buf_str(b), b->n, false);
        if (o == DOWN) return false;
        if (o == REJECTED) goto refused;
        if (!reply_id(lg, "run", "info", "run_id", run_id, sizeof run_id)) goto bad_reply;
    }
    cmi_worker_lock(&lg->w);
    snprintf(lg->run_id, sizeof lg->run_id, "%s", run_id);
    snprintf(lg->health.st.run_id, sizeof lg->health.st.run_id, "%s", run_id);
    cmi_worker_unlock(&lg->w);
    lg->setup_done = true;
    return true;
bad_reply: {
    char what[600];
    snprintf(what, sizeof what, "the tracking server %s answered with a body that is not MLflow's: %.200s", lg->api,
             cmi_buf_str(&lg->reply.body));
    cmi_worker_lock(&lg->w);
    cmi_health_rejected(&lg->health, "MLFlowLogger", what);
    cmi_worker_unlock(&lg->w);
}
refused:
    /* a refusal (bad credentials, a deleted experiment, ...) does not go away by retrying */
    lg->dead = true;
    return false;
}

/* Puts what the worker took and could not send back in front of the queue. */
static void requeue(mlflow_logger *lg, int64_t from_metric, int64_t from_param) {
    cmi_worker_lock(&lg->w);
    const int64_t nm = lg->wqn - from_metric;
    if (nm > 0) {
        bool ok = true;
        if (lg->qn + nm > lg->qcap) {
            int64_t cap = lg->qcap ? lg->qcap : 256;
            while (cap < lg->qn + nm) cap *= 2;
            ml_metric *q = cm_alloc(sizeof *q * (size_t)cap, 16);
            if (q) {
                if (lg->qn) memcpy(q, lg->q, sizeof *q * (size_t)lg->qn);
                cm_free(lg->q);
                lg->q = q, lg->qcap = cap;
            } else {
                lg->health.st.metrics_dropped += nm;
                ok = false;
            }
        }
        if (ok) {
            memmove(lg->q + nm, lg->q, sizeof *lg->q * (size_t)lg->qn);
            memcpy(lg->q, lg->wq + from_metric, sizeof *lg->q * (size_t)nm);
            lg->qn += nm;
        }
    }
    const int64_t np = lg->wpn - from_param;
    if (np > 0) {
        if (lg->pqn + np > lg->pqcap) {
            int64_t cap = lg->pqcap ? lg->pqcap : 16;
            while (cap < lg->pqn + np) cap *= 2;
            ml_kv *p = cm_alloc(sizeof *p * (size_t)cap, 16);
            if (p) {
                if (lg->pqn) memcpy(p, lg->pq, sizeof *p * (size_t)lg->pqn);
                cm_free(lg->pq);
                lg->pq = p, lg->pqcap = cap;
            }
        }
        if (lg->pqn + np <= lg->pqcap) {
            memmove(lg->pq + np, lg->pq, sizeof *lg->pq * (size_t)lg->pqn);
            memcpy(lg->pq, lg->wp + from_param, sizeof *lg->pq * (size_t)np);
            lg->pqn += np;
        } else {
            for (int64_t i = from_param; i < lg->wpn; i++) cm_free(lg->wp[i].key), cm_free(lg->wp[i].value);
        }
    }
    lg->health.st.metrics_queued = lg->qn;
    cmi_worker_unlock(&lg->w);
    lg->wqn = lg->wpn = 0;
}

/* Sends the taken params and metrics in log-batch requests within the limits. */
static void send_batches(mlflow_logger *lg) {
    cmi_buf *b = &lg->body;
    /* params: each key once; a changed value is left out (MLflow refuses to change a param) */
    int64_t pi = 0;
    while (pi < lg->wpn) {
        cmi_buf_reset(b);
        cmi_buf_puts(b, "{\"run_id\":");
        cmi_json_str(b, lg->run_id);
        cmi_buf_puts(b, ",\"params\":[");
        int k = 0;
        int64_t end = pi;
        for (; end < lg->wpn && k < MAX_PARAMS_TAGS_PER_BATCH; end++) {
            const ml_kv *p = &lg->wp[end];
            bool dup_in_batch = false;
            for (int64_t q = pi; q < end && !dup_in_batch; q++) dup_in_batch = !strcmp(lg->wp[q].key, p->key);
            if (dup_in_batch) break; /* the same key twice: the later one goes in the next request */
            int64_t j = 0;
            while (j < lg->n_sent_params && strcmp(lg->sent_params[j].key, p->key)) j++;
            if (j < lg->n_sent_params) {
                if (strcmp(lg->sent_params[j].value, p->value) != 0) {
                    cmi_worker_lock(&lg->w);
                    lg->health.st.reports++;
                    cmi_worker_unlock(&lg->w);
                    cm_log_msg(CM_LOG_WARN, "MLFlowLogger: hyperparameter '%s' changed from '%s' to '%.100s'; MLflow "
                                            "keeps a param's first value, so the new one is not sent",
                               p->key, lg->sent_params[j].value, p->value);
                }
                continue;
            }
            const size_t before = b->n;
            if (k) cmi_buf_putc(b, ',');
            cmi_buf_puts(b, "{\"key\":");
            cmi_json_str(b, p->key);
            cmi_buf_puts(b, ",\"value\":");
            cmi_json_str(b, p->value);
            cmi_buf_putc(b, '}');
            if (b->n + 2 > MAX_BATCH_BYTES && k > 0) {
                b->n = before;
                break;
            }
            k++;
        }
        cmi_buf_puts(b, "]}");
        if (k > 0) {
            if (b->oom) return requeue(lg, 0, pi);
            outcome o = call(lg, "POST", "runs/log-batch", cmi_buf_str(b), b->n, false);
            if (o == DOWN) return requeue(lg, 0, pi);
        }
        /* sent (or refused: reported, and not retried) — remembered as the run's either way */
        for (int64_t q = pi; q < end; q++) {
            remember_param(lg, lg->wp[q].key, lg->wp[q].value);
            cm_free(lg->wp[q].key), cm_free(lg->wp[q].value);
        }
        pi = end;
    }
    lg->wpn = 0;
    /* metrics */
    int64_t mi = 0;
    while (mi < lg->wqn) {
        cmi_buf_reset(b);
        cmi_buf_puts(b, "{\"run_id\":");
        cmi_json_str(b, lg->run_id);
        cmi_buf_puts(b, ",\"metrics\":[");
        int64_t end = mi;
        for (; end < lg->wqn && end - mi < MAX_METRICS_PER_BATCH; end++) {
            const ml_metric *m = &lg->wq[end];
            const size_t before = b->n;
            if (end > mi) cmi_buf_putc(b, ',');
            cmi_buf_puts(b, "{\"key\":");
            cmi_json_str(b, m->key);
            cmi_buf_puts(b, ",\"value\":");
            cmi_json_num(b, m->value, 0);
            cmi_buf_printf(b, ",\"timestamp\":%lld,\"step\":%lld}", (long long)m->ts_ms, (long long)m->step);
            if (b->n + 2 > MAX_BATCH_BYTES && end > mi) {
                b->n = before;
                break;
            }
        }
        cmi_buf_puts(b, "]}");
        if (b->oom) return requeue(lg, mi, 0);
        outcome o = call(lg, "POST", "runs/log-batch", cmi_buf_str(b), b->n, false);
        if (o == DOWN) return requeue(lg, mi, 0);
        cmi_worker_lock(&lg->w);
        if (o == SENT) lg->health.st.metrics_sent += end - mi;
        else lg->health.st.metrics_dropped += end - mi;
        cmi_worker_unlock(&lg->w);
        mi = end;
    }
    lg->wqn = 0;
}

/* Never sent: the server refused the run, or did not answer before the close's deadline. */
static void drop_left(mlflow_logger *lg) {
    cmi_worker_lock(&lg->w);
    lg->health.st.metrics_dropped += lg->wqn + lg->qn;
    lg->health.st.metrics_queued = 0;
    lg->qn = 0;
    for (int64_t i = 0; i < lg->wpn; i++) cm_free(lg->wp[i].key), cm_free(lg->wp[i].value);
    for (int64_t i = 0; i < lg->pqn; i++) cm_free(lg->pq[i].key), cm_free(lg->pq[i].value);
    lg->wqn = lg->wpn = lg->pqn = 0;
    cmi_worker_unlock(&lg->w);
}

/* At the end: how many values never reached the server, if any (one report). */
static void summary(mlflow_logger *lg) {
    cmi_worker_lock(&lg->w);
    const int64_t lost = lg->health.st.metrics_dropped;
    if (lost > 0) {
        lg->health.st.reports++;
        cm_log_msg(CM_LOG_WARN, "MLFlowLogger: %lld metric value%s could not be sent to %s (%s); a FileLogger's "
                                "metrics.jsonl has them",
                   (long long)lost, lost == 1 ? "" : "s", lg->api,
                   lg->health.st.last_error[0] ? lg->health.st.last_error : "the queue was full");
    }
    cmi_worker_unlock(&lg->w);
}

static void work(void *self, bool last) {
    mlflow_logger *lg = self;
    /* take the queues */
    cmi_worker_lock(&lg->w);
    ml_metric *tq = lg->wq;
    int64_t tcap = lg->wqcap;
    lg->wq = lg->q, lg->wqn = lg->qn, lg->wqcap = lg->qcap;
    lg->q = tq, lg->qn = 0, lg->qcap = tcap;
    ml_kv *tp = lg->wp;
    int64_t tpcap = lg->wpcap;
    lg->wp = lg->pq, lg->wpn = lg->pqn, lg->wpcap = lg->pqcap;
    lg->pq = tp, lg->pqn = 0, lg->pqcap = tpcap;
    lg->health.st.metrics_queued = 0;
    const char *final_status = lg->final_status;
    cmi_worker_unlock(&lg->w);

    if (!lg->dead && !lg->setup_done && !setup(lg)) {
        if (lg->dead || last) goto drop;
        return requeue(lg, 0, 0);
    }
    if (lg->dead) goto drop;
    send_batches(lg);
    if (!last) return;
    drop_left(lg); /* what the deadline cut off */
    if (final_status) {
        cmi_buf *b = &lg->body;
        cmi_buf_reset(b);
        cmi_buf_puts(b, "{\"run_id\":");
        cmi_json_str(b, lg->run_id);
        cmi_buf_printf(b, ",\"status\":\"%s\",\"end_time\":%lld}", final_status, (long long)(cmi_unix_time() * 1000));
        if (call(lg, "POST", "runs/update", cmi_buf_str(b), b->n, false) == SENT) {
            cmi_worker_lock(&lg->w);
            lg->health.st.finished = true;
            cmi_worker_unlock(&lg->w);
        }
    }
    summary(lg);
    return;
drop:
    drop_left(lg);
    if (last) summary(lg);
}

/* ---- the logger (training thread) ---- */

static cm_status ml_init(void *self, const cm_state *st) {
    mlflow_logger *lg = self;
    if (lg->initialised) return cm_set_error(CM_ERR_STATE, "MLFlowLogger: already initialised (one logger per trainer)");
    lg->initialised = true;
    const int rank = cm_state_rank(st);
    if (lg->rank_zero_only && rank != 0) return CM_OK;
    const char *trainer_name = cm_state_run_name(st);
    if (!trainer_name || !trainer_name[0]) trainer_name = "run";
    const char *rn_env = cmi_env("RUN_NAME"); /* Composer's tag: the platform's run name when set */
    lg->composer_run_name = cmi_strdup(rn_env ? rn_env : trainer_name);
    cmi_buf b = {0};
    cmi_buf_puts(&b, lg->run_name_cfg ? lg->run_name_cfg : trainer_name);
    if (!lg->rank_zero_only) cmi_buf_printf(&b, "-rank%d", rank);
    lg->run_name = b.oom ? NULL : cmi_strdup(cmi_buf_str(&b));
    cmi_buf_free(&b);
    const char *u = cmi_env("USER");
    lg->user = cmi_strdup(u ? u : "unknown");
    if (!lg->composer_run_name || !lg->run_name || !lg->user) return cm_set_error(CM_ERR_OOM, "MLFlowLogger: out of memory");
    cm_status s = cmi_http_new(&lg->http_opts, &lg->http);
    if (!s && lg->auth) s = cmi_http_add_header(lg->http, lg->auth);
    if (!s) s = cmi_worker_start(&lg->w, lg->flush_interval, work, lg);
    if (s) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "MLFlowLogger: %s", msg);
    }
    lg->enabled = true;
    cmi_worker_kick(&lg->w); /* create the run now, so it shows in MLflow from the start */
    return CM_OK;
}

/* The interned name's info slot (grown with the table); NULL on OOM. Under w.mu. */
static ml_name *name_info(mlflow_logger *lg, const char *name) {
    bool added;
    const int64_t k = cmi_intern_add(&lg->names, name, &added);
    if (k < 0) return NULL;
    if (lg->names.n > lg->info_cap) {
        int64_t cap = lg->info_cap ? 2 * lg->info_cap : 64;
        ml_name *ni = cm_alloc_zeroed(sizeof *ni * (size_t)cap, 16);
        if (!ni) return NULL;
        if (lg->info_cap) memcpy(ni, lg->info, sizeof *ni * (size_t)lg->info_cap);
        cm_free(lg->info);
        lg->info = ni, lg->info_cap = cap;
    }
    ml_name *in = &lg->info[k];
    if (added) {
        in->out = lg->names.names[k];
        for (size_t i = 0; i < lg->n_rename; i++)
            if (!strcmp(lg->rename[i].key, name)) in->out = lg->rename[i].value;
        const char *why = NULL;
        in->valid = valid_name(in->out, &why);
        if (!in->valid)
            cm_log_msg(CM_LOG_WARN, "MLFlowLogger: metric '%s' is not sent: %s (rename it with rename_metrics)", in->out,
                       why);
    }
    return in;
}

static cm_status ml_log_metrics(void *self, const cm_metric_value *v, int n, const cm_timestamp *ts) {
    mlflow_logger *lg = self;
    if (!lg->enabled || lg->closed) return CM_OK;
    const int64_t step = ts ? ts->batch : 0;
    const int64_t now_ms = (int64_t)(cmi_unix_time() * 1000);
    cmi_worker_lock(&lg->w);
    for (int i = 0; i < n; i++) {
        if (!v[i].name || !v[i].name[0]) continue;
        if (cmi_glob_any((const char *const *)lg->ignore_m, lg->n_ignore_m, v[i].name)) continue;
        ml_name *in = name_info(lg, v[i].name);
        if (!in) {
            lg->health.st.metrics_dropped++;
            continue;
        }
        if (!in->valid) continue;
        /* Composer: skip a value equal to the last one sent unless N steps have passed */
        if (in->logged && in->last_value == v[i].value && step < in->last_step + lg->dup_every) continue;
        in->logged = true, in->last_value = v[i].value, in->last_step = step;
        if (lg->qn >= lg->max_queued) {
            lg->health.st.metrics_dropped++;
            continue;
        }
        if (lg->qn == lg->qcap) {
            int64_t cap = lg->qcap ? 2 * lg->qcap : 256;
            ml_metric *q = cm_alloc(sizeof *q * (size_t)cap, 16);
            if (!q) {
                lg->health.st.metrics_dropped++;
                continue;
            }
            if (lg->qn) memcpy(q, lg->q, sizeof *q * (size_t)lg->qn);
            cm_free(lg->q);
            lg->q = q, lg->qcap = cap;
        }
        lg->q[lg->qn++] = (ml_metric){in->out, v[i].value, now_ms, step};
    }
    lg->health.st.metrics_queued = lg->qn;
    cmi_worker_unlock(&lg->w);
    return CM_OK;
}

/* Python's str() of the value, as mlflow.log_params writes it (cut at MLflow's 6000). */
static char *param_value(const cm_hparam *h) {
    char b[64];
    const char *s = b;
    if (h->kind == CM_HPARAM_STRING) s = h->string ? h->string : "None";
    else if (h->kind == CM_HPARAM_BOOL) s = h->number != 0 ? "True" : "False";
    else if (isnan(h->number)) s = "nan";
    else if (isinf(h->number)) s = h->number > 0 ? "inf" : "-inf";
    else if (h->number == floor(h->number) && fabs(h->number) < 9e15) snprintf(b, sizeof b, "%lld", (long long)h->number);
    else cm_format_double_shortest(h->number, b, sizeof b);
    const size_t n = strlen(s) < MAX_PARAM_VAL_LENGTH ? strlen(s) : MAX_PARAM_VAL_LENGTH;
    char *d = cm_alloc(n + 1, 8);
    if (d) memcpy(d, s, n), d[n] = '\0';
    return d;
}

static cm_status ml_log_hparams(void *self, const cm_hparam *h, int n) {
    mlflow_logger *lg = self;
    if (!lg->enabled || lg->closed) return CM_OK;
    cmi_worker_lock(&lg->w);
    cm_status s = CM_OK;
    for (int i = 0; i < n && !s; i++) {
        if (!h[i].key || cmi_glob_any((const char *const *)lg->ignore_h, lg->n_ignore_h, h[i].key)) continue;
        const char *why;
        if (!valid_name(h[i].key, &why)) {
            cm_log_msg(CM_LOG_WARN, "MLFlowLogger: hyperparameter '%s' is not sent: %s", h[i].key, why);
            continue;
        }
        if (lg->pqn == lg->pqcap) {
            int64_t cap = lg->pqcap ? 2 * lg->pqcap : 32;
            ml_kv *p = cm_alloc(sizeof *p * (size_t)cap, 16);
            if (!p) {
                s = cm_set_error(CM_ERR_OOM, "MLFlowLogger: out of memory for hyperparameters");
                break;
            }
            if (lg->pqn) memcpy(p, lg->pq, sizeof *p * (size_t)lg->pqn);
            cm_free(lg->pq);
            lg->pq = p, lg->pqcap = cap;
        }
        ml_kv kv = {cmi_strdup(h[i].key), param_value(&h[i])};
        if (!kv.key || !kv.value) {
            cm_free(kv.key), cm_free(kv.value);
            s = cm_set_error(CM_ERR_OOM, "MLFlowLogger: out of memory for hyperparameters");
            break;
        }
        lg->pq[lg->pqn++] = kv;
    }
    cmi_worker_unlock(&lg->w);
    return s;
}

static cm_status ml_run_event(void *self, cm_event ev, const cm_state *st) {
    mlflow_logger *lg = self;
    (void)st;
    if (ev == CM_EVENT_FIT_START) {
        lg->fit_open = true;
    } else if (ev == CM_EVENT_FIT_END) {
        lg->fit_open = false;
        if (lg->enabled && !lg->closed) cmi_worker_kick(&lg->w); /* the last values now, not an interval later */
    }
    return CM_OK;
}

static cm_status ml_flush(void *self) {
    mlflow_logger *lg = self;
    if (lg->enabled && !lg->closed) cmi_worker_kick(&lg->w); /* never waits: the close does, bounded */
    return CM_OK;
}

static void finish(mlflow_logger *lg, const char *status) {
    if (!lg->enabled || lg->closed) return;
    lg->closed = true;
    cmi_worker_lock(&lg->w);
    lg->final_status = status;
    cmi_worker_unlock(&lg->w);
    /* a last round sends what is left, then the status — all within close_timeout from now (a
     * request in flight included) */
    cmi_http_set_deadline(lg->http, cmi_unix_time() + (lg->close_timeout > 0 ? lg->close_timeout : 1e-3));
    cmi_worker_stop(&lg->w);
}

static cm_status ml_close(void *self, const cm_state *st) {
    mlflow_logger *lg = self;
    (void)st;
    /* a fit that started and did not reach FIT_END failed (an error, or an interruption) */
    finish(lg, lg->fit_open ? "FAILED" : "FINISHED");
    return CM_OK;
}

static void ml_free(void *self) {
    mlflow_logger *lg = self;
    finish(lg, "FAILED"); /* freed without a close: the run did not end normally */
    cmi_http_free(lg->http);
    cmi_http_reply_free(&lg->reply);
    cmi_buf_free(&lg->body);
    cmi_intern_free(&lg->names);
    cm_free(lg->info);
    for (int64_t i = 0; i < lg->pqn; i++) cm_free(lg->pq[i].key), cm_free(lg->pq[i].value);
    for (int64_t i = 0; i < lg->wpn; i++) cm_free(lg->wp[i].key), cm_free(lg->wp[i].value);
    for (int64_t i = 0; i < lg->n_sent_params; i++) cm_free(lg->sent_params[i].key), cm_free(lg->sent_params[i].value);
    cm_free(lg->pq), cm_free(lg->wp), cm_free(lg->sent_params), cm_free(lg->q), cm_free(lg->wq);
    for (size_t i = 0; i < lg->n_tags; i++) cm_free(lg->tags[i].key), cm_free(lg->tags[i].value);
    for (size_t i = 0; i < lg->n_rename; i++) cm_free(lg->rename[i].key), cm_free(lg->rename[i].value);
    cm_free(lg->tags), cm_free(lg->rename);
    for (size_t i = 0; i < lg->n_ignore_m; i++) cm_free(lg->ignore_m[i]);
    for (size_t i = 0; i < lg->n_ignore_h; i++) cm_free(lg->ignore_h[i]);
    cm_free(lg->ignore_m), cm_free(lg->ignore_h);
    cm_free(lg->api), cm_free(lg->experiment_name), cm_free(lg->experiment_id_env), cm_free(lg->run_id_env);
    cm_free(lg->run_name_cfg), cm_free(lg->run_group), cm_free(lg->auth);
    cm_free(lg->run_name), cm_free(lg->composer_run_name), cm_free(lg->user);
    cm_free((char *)lg->http_opts.ca_path), cm_free((char *)lg->http_opts.client_cert);
    cm_free(lg);
}

static const cm_logger_i mlflow_vt = {
    .abi = CM_LOGGER_ABI,
    .name = "MLFlowLogger",
    .init = ml_init,
    .log_hyperparameters = ml_log_hparams,
    .log_metrics = ml_log_metrics,
    .run_event = ml_run_event,
    .flush = ml_flush,
    .close = ml_close,
    .free = ml_free,
};

/* ---- construction ---- */

static cm_status env_number(const char *name, double def, double *out) {
    const char *v = cmi_env(name);
    if (!v) {
        *out = def;
        return CM_OK;
    }
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !(x >= 0) || !isfinite(x))
        return cm_set_error(CM_ERR_INVALID_ARG, "MLFlowLogger: %s='%s' is not a non-negative number", name, v);
    *out = x;
    return CM_OK;
}

static bool env_true(const char *name) {
    const char *v = cmi_env(name);
    return v && (!strcasecmp(v, "true") || !strcmp(v, "1"));
}

static cm_status copy_pairs(const char *what, const char *const *src, size_t n, ml_kv **out, size_t *n_out,
                            bool check_key, size_t max_value) {
    *out = NULL, *n_out = 0;
    if (n && !src) return cm_set_error(CM_ERR_INVALID_ARG, "MLFlowLogger: %s: %zu pairs but the list is NULL", what, n);
    if (!n) return CM_OK;
    ml_kv *p = cm_alloc_zeroed(sizeof *p * n, 16);
    if (!p) return cm_set_error(CM_ERR_OOM, "MLFlowLogger: out of memory");
    *out = p;
    for (size_t i = 0; i < n; i++) {
        if (!src[2 * i] || !src[2 * i + 1])
            return cm_set_error(CM_ERR_INVALID_ARG, "MLFlowLogger: %s[%zu] has a NULL %s", what, i,
                                src[2 * i] ? "value" : "name");
        const char *why;
        if (check_key && !valid_name(src[2 * i], &why))
            return cm_set_error(CM_ERR_INVALID_ARG, "MLFlowLogger: %s: '%s' is not a name MLflow accepts: %s", what,
                                src[2 * i], why);
        if (max_value && strlen(src[2 * i + 1]) > max_value)
            return cm_set_error(CM_ERR_INVALID_ARG, "MLFlowLogger: %s: the value of '%s' is longer than %zu characters",
                                what, src[2 * i], max_value);
        p[i].key = cmi_strdup(src[2 * i]);
        p[i].value = cmi_strdup(src[2 * i + 1]);
        (*n_out)++;
        if (!p[i].key || !p[i].value) return cm_set_error(CM_ERR_OOM, "MLFlowLogger: out of memory");
    }
    return CM_OK;
}

static cm_status copy_list(const char *what, const char *const *src, size_t n, char ***out, size_t *n_out) {
    *out = NULL, *n_out = 0;
    if (n && !src) return cm_set_error(CM_ERR_INVALID_ARG, "MLFlowLogger: %s: %zu entries but the list is NULL", what, n);
    if (!n) return CM_OK;
    char **p = cm_alloc_zeroed(sizeof *p * n, 16);
    if (!p) return cm_set_error(CM_ERR_OOM, "MLFlowLogger: out of memory");
    *out = p;
    for (size_t i = 0; i < n; i++) {
        if (!src[i]) return cm_set_error(CM_ERR_INVALID_ARG, "MLFlowLogger: %s[%zu] is NULL", what, i);
        if (!(p[i] = cmi_strdup(src[i]))) return cm_set_error(CM_ERR_OOM, "MLFlowLogger: out of memory");
        (*n_out)++;
    }
    return CM_OK;
}

/* "Authorization: Basic base64(user:pass)" into a. */
static void basic_auth(cmi_buf *a, const char *user, const char *pass) {
    static const char tb[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    cmi_buf up = {0};
    cmi_buf_printf(&up, "%s:%s", user, pass);
    cmi_buf_puts(a, "Authorization: Basic ");
    for (size_t i = 0; i < up.n; i += 3) {
        const uint32_t x = (uint32_t)up.p[i] << 16 | (i + 1 < up.n ? (uint32_t)up.p[i + 1] << 8 : 0) |
                           (i + 2 < up.n ? up.p[i + 2] : 0);
        cmi_buf_putc(a, tb[(x >> 18) & 63]);
        cmi_buf_putc(a, tb[(x >> 12) & 63]);
        cmi_buf_putc(a, i + 1 < up.n ? tb[(x >> 6) & 63] : '=');
        cmi_buf_putc(a, i + 2 < up.n ? tb[x & 63] : '=');
    }
    if (up.oom) a->oom = true;
    cmi_buf_free(&up);
}

static cm_status build(const cm_mlflow_logger_config *cfg, mlflow_logger *lg) {
    cm_status s;
    /* the tracking URI */
    const char *uri = cfg->tracking_uri && cfg->tracking_uri[0] ? cfg->tracking_uri : cmi_env("MLFLOW_TRACKING_URI");
    if (!uri)
        return cm_set_error(CM_ERR_INVALID_ARG, "MLFlowLogger: no tracking server: set tracking_uri (http://host:5000) "
                                                "or MLFLOW_TRACKING_URI");
    cmi_buf a = {0};
    if (!strcmp(uri, "databricks")) {
        const char *host = cmi_env("DATABRICKS_HOST"), *tok = cmi_env("DATABRICKS_TOKEN");
        if (!host)
            return cm_set_error(CM_ERR_INVALID_ARG, "MLFlowLogger: tracking_uri 'databricks' needs DATABRICKS_HOST (and "
                                                    "DATABRICKS_TOKEN)");
        uri = host;
        if (tok) cmi_buf_printf(&a, "Authorization: Bearer %s", tok);
    }
    if (strncmp(uri, "http://", 7) != 0 && strncmp(uri, "https://", 8) != 0) {
        cmi_buf_free(&a);
        return cm_set_error(CM_ERR_INVALID_ARG, "MLFlowLogger: tracking_uri '%s' is not an http(s) URL (the local "
                                                "file store, a path or file:, is not supported: run `mlflow server` "
                                                "and use http://host:5000)",
                            uri);
    }
    cmi_buf api = {0};
    cmi_buf_puts(&api, uri);
    while (api.n > 8 && api.p[api.n - 1] == '/') api.n--;
    cmi_buf_puts(&api, "/api/2.0/mlflow");
    lg->api = api.oom ? NULL : cmi_strdup(cmi_buf_str(&api));
    cmi_buf_free(&api);
    if (!lg->api) {
        cmi_buf_free(&a);
        return cm_set_error(CM_ERR_OOM, "MLFlowLogger: out of memory");
    }
    /* credentials (MLflow's rest_utils: a token wins over a user name and password) */
    const char *token = cmi_env("MLFLOW_TRACKING_TOKEN"), *user = cmi_env("MLFLOW_TRACKING_USERNAME"),
               *pass = cmi_env("MLFLOW_TRACKING_PASSWORD");
    if (token || (user && pass)) {
        cmi_buf_reset(&a);
        if (token) cmi_buf_printf(&a, "Authorization: Bearer %s", token);
        else basic_auth(&a, user, pass);
    }
    if (a.n) {
        lg->auth = a.oom ? NULL : cmi_strdup(cmi_buf_str(&a));
        cmi_buf_free(&a);
        if (!lg->auth) return cm_set_error(CM_ERR_OOM, "MLFlowLogger: out of memory");
    }
    cmi_buf_free(&a);
    /* the experiment and the run */
    const char *exp = cfg->experiment_name ? cfg->experiment_name : cmi_env("MLFLOW_EXPERIMENT_NAME");
    if (!exp) exp = "my-mlflow-experiment";
    if (!exp[0]) return cm_set_error(CM_ERR_INVALID_ARG, "MLFlowLogger: experiment_name is empty");
    if (strlen(exp) > MAX_EXPERIMENT_NAME_LENGTH)
        return cm_set_error(CM_ERR_INVALID_ARG, "MLFlowLogger: experiment_name is longer than %d characters",
                            MAX_EXPERIMENT_NAME_LENGTH);
    if (cfg->run_name && !cfg->run_name[0]) return cm_set_error(CM_ERR_INVALID_ARG, "MLFlowLogger: run_name is empty");
    if (!(lg->experiment_name = cmi_strdup(exp))) return cm_set_error(CM_ERR_OOM, "MLFlowLogger: out of memory");
    const char *eid = cmi_env("MLFLOW_EXPERIMENT_ID"), *rid = cmi_env("MLFLOW_RUN_ID");
    if ((eid && !(lg->experiment_id_env = cmi_strdup(eid))) || (rid && !(lg->run_id_env = cmi_strdup(rid))) ||
        (cfg->run_name && !(lg->run_name_cfg = cmi_strdup(cfg->run_name))) ||
        (cfg->run_group && !(lg->run_group = cmi_strdup(cfg->run_group))))
        return cm_set_error(CM_ERR_OOM, "MLFlowLogger: out of memory");
    if ((s = copy_pairs("tags", cfg->tags, cfg->n_tags, &lg->tags, &lg->n_tags, true, MAX_TAG_VAL_LENGTH)) ||
        (s = copy_pairs("rename_metrics", cfg->rename_metrics, cfg->n_rename, &lg->rename, &lg->n_rename, false, 0)) ||
        (s = copy_list("ignore_metrics", cfg->ignore_metrics, cfg->n_ignore_metrics, &lg->ignore_m, &lg->n_ignore_m)) ||
        (s = copy_list("ignore_hyperparameters", cfg->ignore_hyperparameters, cfg->n_ignore_hyperparameters,
                       &lg->ignore_h, &lg->n_ignore_h)))
        return s;
    for (size_t i = 0; i < lg->n_tags; i++)
        if (!strcmp(lg->tags[i].key, "run_name") || !strncmp(lg->tags[i].key, "mlflow.", 7))
            return cm_set_error(CM_ERR_INVALID_ARG, "MLFlowLogger: tags: '%s' is set by the logger (use %s)",
                                lg->tags[i].key, strncmp(lg->tags[i].key, "mlflow.", 7) ? "run_name" : "another name");
    /* intervals and HTTP settings */
    if (!(cfg->flush_interval > 0) || !isfinite(cfg->flush_interval))
        return cm_set_error(CM_ERR_INVALID_ARG, "MLFlowLogger: flush_interval must be > 0 seconds, got %g",
                            cfg->flush_interval);
    if (!(cfg->close_timeout >= 0) || !isfinite(cfg->close_timeout))
        return cm_set_error(CM_ERR_INVALID_ARG, "MLFlowLogger: close_timeout must be >= 0 seconds, got %g",
                            cfg->close_timeout);
    if (cfg->log_duplicated_metric_every_n_steps < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "MLFlowLogger: log_duplicated_metric_every_n_steps must be >= 0, got %lld",
                            (long long)cfg->log_duplicated_metric_every_n_steps);
    if (cfg->max_queued < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "MLFlowLogger: max_queued must be at least 1, got %lld",
                            (long long)cfg->max_queued);
    double retries, factor, jitter, timeout;
    if ((s = env_number("MLFLOW_HTTP_REQUEST_MAX_RETRIES", 7, &retries)) ||
        (s = env_number("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", 2, &factor)) ||
        (s = env_number("MLFLOW_HTTP_REQUEST_BACKOFF_JITTER", 1, &jitter)) ||
        (s = env_number("MLFLOW_HTTP_REQUEST_TIMEOUT", 120, &timeout)))
        return s;
    if (cfg->max_retries >= 0) retries = cfg->max_retries;
    if (cfg->backoff_factor >= 0) factor = cfg->backoff_factor;
    if (cfg->backoff_jitter >= 0) jitter = cfg->backoff_jitter;
    if (cfg->request_timeout > 0) timeout = cfg->request_timeout;
    if (retries > 100 || !(timeout > 0) || !isfinite(factor) || !isfinite(jitter))
        return cm_set_error(CM_ERR_INVALID_ARG, "MLFlowLogger: max_retries %g (at most 100), request_timeout %g (> 0) or "
                                                "backoff %g / %g out of range",
                            retries, timeout, factor, jitter);
    const char *ca = cmi_env("MLFLOW_TRACKING_SERVER_CERT_PATH"), *cc = cmi_env("MLFLOW_TRACKING_CLIENT_CERT_PATH");
    lg->http_opts = (cmi_http_opts){
        .who = "MLFlowLogger",
        .timeout_s = timeout,
        .max_retries = (int)retries,
        .backoff_factor = factor,
        .backoff_jitter = jitter,
        .insecure_tls = env_true("MLFLOW_TRACKING_INSECURE_TLS"),
        .ca_path = ca ? cmi_strdup(ca) : NULL,
        .client_cert = cc ? cmi_strdup(cc) : NULL,
    };
    if ((ca && !lg->http_opts.ca_path) || (cc && !lg->http_opts.client_cert))
        return cm_set_error(CM_ERR_OOM, "MLFlowLogger: out of memory");
    lg->rank_zero_only = cfg->rank_zero_only;
    lg->resume = cfg->resume;
    lg->flush_interval = cfg->flush_interval;
    lg->close_timeout = cfg->close_timeout;
    lg->dup_every = cfg->log_duplicated_metric_every_n_steps;
    lg->max_queued = cfg->max_queued;
    return CM_OK;
}

cm_status cm_mlflow_logger_new(const cm_mlflow_logger_config *cfg, cm_logger_plugin *out) {
    if (!cfg || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_mlflow_logger_new: cfg and out must not be NULL");
    *out = (cm_logger_plugin){0};
    mlflow_logger *lg = cm_alloc_zeroed(sizeof *lg, 64);
    if (!lg) return cm_set_error(CM_ERR_OOM, "cm_mlflow_logger_new: out of memory");
    cm_status s = build(cfg, lg);
    if (s) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        ml_free(lg);
        return cm_set_error(s, "%s", msg);
    }
    *out = (cm_logger_plugin){&mlflow_vt, lg};
    return CM_OK;
}

cm_status cm_mlflow_logger_stats(const cm_logger_plugin *p, cm_tracker_stats *out) {
    if (!p || p->vt != &mlflow_vt || !p->self || !out)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_mlflow_logger_stats: not an MLFlowLogger plugin (or out is NULL)");
    mlflow_logger *lg = p->self;
    const bool locked = lg->w.running;
    if (locked) cmi_worker_lock(&lg->w);
    *out = lg->health.st;
    if (locked) cmi_worker_unlock(&lg->w);
    return CM_OK;
}
