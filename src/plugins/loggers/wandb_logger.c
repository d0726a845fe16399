/* WandBLogger: Composer's WandBLogger without the wandb client. Online, the HTTP protocol the
 * official client speaks (a GraphQL UpsertBucket mutation, then the run's file_stream endpoint for
 * the history and the summary), sent from a worker thread; offline, the client's run folder with
 * its transaction log (LevelDB-log framing around Record protos) for `wandb sync`. */
#include "loggers_impl.h"
#include "tracker.h"
#include "wb_store.h"
#include "wire.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* The mutation the client sends (core/api/graphql/mutation_run.graphql), as it sends it. */
static const char UPSERT_BUCKET[] =
    "mutation UpsertBucket($id: String, $name: String, $project: String, $entity: String, $groupName: String, "
    "$description: String, $displayName: String, $notes: String, $commit: String, $config: JSONString, $host: "
    "String, $debug: Boolean, $program: String, $repo: String, $jobType: String, $state: String, $sweep: String, "
    "$tags: [String!], $summaryMetrics: JSONString) { upsertBucket(input: {id: $id, name: $name, groupName: "
    "$groupName, modelName: $project, entityName: $entity, description: $description, displayName: $displayName, "
    "notes: $notes, config: $config, commit: $commit, host: $host, debug: $debug, jobProgram: $program, jobRepo: "
    "$repo, jobType: $jobType, state: $state, sweep: $sweep, tags: $tags, summaryMetrics: $summaryMetrics}) { "
    "bucket { id name displayName description config sweepName project { id name entity { id name } } "
    "historyLineCount } inserted } }";

enum {
    MAX_LINE_BYTES = (10 << 20) - (100 << 10), /* the back end's line limit (filestream.go) */
    MAX_REQUEST_BYTES = 10 << 20,
    HEARTBEAT_S = 30,
};

/* Record field numbers (wandb/proto/wandb_internal.proto) */
enum { REC_NUM = 1, REC_HISTORY = 2, REC_SUMMARY = 3, REC_CONFIG = 5, REC_RUN = 17, REC_EXIT = 18, REC_HEADER = 21 };
enum { ITEM_KEY = 1, ITEM_NESTED_KEY = 2, ITEM_VALUE_JSON = 16 };

/* ---- the logger ---- */

typedef struct {
    double last; /* the summary's value */
    bool has_last;
    int64_t row_gen, row_pos; /* its place in the current row (when row_gen is the row's) */
} wb_name;

typedef struct {
    /* configuration (owned) */
    char *base, *api_key_header, *project, *entity, *name_cfg, *group, *notes, *job_type, *id_cfg, *dir;
    char **tags;
    size_t n_tags;
    int mode;
    bool rank_zero_only;
    double flush_interval, close_timeout;
    int64_t max_queued;
    cmi_http_opts http_opts;
    /* training thread */
    bool initialised, enabled, fit_open, closed, warned_step;
    char run_id[160], display_name[256], host[256];
    double start_time;
    cmi_intern names;
    wb_name *info;
    int64_t info_cap;
    int64_t *row_idx; /* the current row: name indices and values */
    double *row_val;
    int64_t row_n, row_cap, row_gen, row_step;
    bool row_open;
    int64_t last_row_step; /* the last finished row's step (-1: none) */
    cmi_buf line;
    /* offline */
    char *run_dir, *store_path;
    cmi_wb_store store;
    int64_t rec_num;
    cmi_buf rec, sub;
    bool store_broken;
    /* shared with the worker (under w.mu) */
    cmi_worker w;
    char **q; /* history lines waiting */
    int64_t qn, qcap;
    char *config_json; /* {"k": {"value": v}, ...}; NULL = none yet */
    bool config_dirty;
    char *summary_json;
    int exit_code; /* -1 until close */
    cmi_health health;
    /* worker thread */
    cmi_http *http;
    bool upserted, dead, complete_sent;
    char *entity_srv, *project_srv; /* as the server named them */
    int64_t hist_offset;            /* history lines the server has */
    char **wq;
    int64_t wqn, wqcap;
    double last_request;
    cmi_buf body;
    cmi_http_reply reply;
} wandb_logger;

cm_wandb_logger_config cm_wandb_logger_config_default(void) {
    return (cm_wandb_logger_config){
        .mode = -1,
        .rank_zero_only = true,
        .flush_interval = 15.0,
        .max_retries = 7,
        .backoff_s = 2.0,
        .request_timeout = 180.0,
        .close_timeout = 60.0,
        .max_queued = 100000,
    };
}

/* ---- JSON values ---- */

/* A hyperparameter as JSON (numbers as numbers, NaN bare as wandb's JSON does). */
static void hp_json(cmi_buf *b, const cm_hparam *h) {
    if (h->kind == CM_HPARAM_STRING) cmi_json_str(b, h->string ? h->string : "");
    else if (h->kind == CM_HPARAM_BOOL) cmi_buf_puts(b, h->number != 0 ? "true" : "false");
    else if (h->number == floor(h->number) && fabs(h->number) < 9e15) cmi_json_int(b, (int64_t)h->number);
    else cmi_json_num(b, h->number, 1);
}

/* ---- requests (worker thread) ---- */

typedef enum { SENT, DOWN, REJECTED } outcome;

static outcome call(wandb_logger *lg, const char *url, const char *body, size_t len) {
    int64_t retries = 0;
    const bool closing = cmi_http_deadline(lg->http) > 0;
    cm_status s = cmi_http_request(lg->http, "POST", url, body, len, lg->health.st.down && !closing, &lg->reply,
                                   &retries);
    lg->last_request = cmi_unix_time();
    cmi_worker_lock(&lg->w);
    lg->health.st.retries += retries;
    outcome o;
    if (s || lg->reply.status == 0 || cmi_http_retryable(lg->reply.status)) {
        char what[700];
        snprintf(what, sizeof what, "the W&B server did not take POST %s: %s (after %d attempt%s)", url,
                 lg->reply.error, lg->reply.attempts, lg->reply.attempts == 1 ? "" : "s");
        lg->health.st.failed_requests++;
        cmi_health_down(&lg->health, "WandBLogger", what);
        o = DOWN;
    } else if (lg->reply.status >= 400) {
        char what[700];
        snprintf(what, sizeof what, "the W&B server refused POST %s: %s", url, lg->reply.error);
        lg->health.st.failed_requests++;
        cmi_health_rejected(&lg->health, "WandBLogger", what);
        cmi_health_up(&lg->health, "WandBLogger");
        o = REJECTED;
    } else {
        lg->health.st.requests++;
        cmi_health_up(&lg->health, "WandBLogger");
        o = SENT;
    }
    cmi_worker_unlock(&lg->w);
    return o;
}

static void put_var_str(cmi_buf *b, const char *name, const char *v) {
    cmi_buf_printf(b, ",\"%s\":", name);
    cmi_json_str(b, v); /* NULL writes null */
}

/* The UpsertBucket mutation: the run's metadata and, when there is one, its config. */
static outcome upsert(wandb_logger *lg, const char *config) {
    cmi_buf *b = &lg->body;
    cmi_buf_reset(b);
    cmi_buf_puts(b, "{\"query\":");
    cmi_json_str(b, UPSERT_BUCKET);
    cmi_buf_puts(b, ",\"variables\":{\"name\":");
    cmi_json_str(b, lg->run_id);
    put_var_str(b, "project", lg->project_srv ? lg->project_srv : lg->project);
    put_var_str(b, "entity", lg->entity_srv ? lg->entity_srv : lg->entity);
    put_var_str(b, "groupName", lg->group);
    put_var_str(b, "displayName", lg->display_name);
    put_var_str(b, "notes", lg->notes);
    put_var_str(b, "host", lg->host);
    put_var_str(b, "jobType", lg->job_type);
    put_var_str(b, "program", "composer");
    if (config) put_var_str(b, "config", config);
    cmi_buf_puts(b, ",\"tags\":");
    if (!lg->n_tags) cmi_buf_puts(b, "null"); /* (the client sends no list when there are no tags) */
    for (size_t i = 0; i < lg->n_tags; i++) {
        cmi_buf_putc(b, i ? ',' : '[');
        cmi_json_str(b, lg->tags[i]);
    }
    cmi_buf_puts(b, lg->n_tags ? "]" : "");
    cmi_buf_puts(b, "},\"operationName\":\"UpsertBucket\"}");
    if (b->oom) return DOWN;
    cmi_buf url = {0};
    cmi_buf_printf(&url, "%s/graphql", lg->base);
    outcome o = url.oom ? DOWN : call(lg, cmi_buf_str(&url), cmi_buf_str(b), b->n);
    cmi_buf_free(&url);
    if (o != SENT) return o;
    /* GraphQL answers errors with HTTP 200 and an "errors" list */
    cJSON *j = cJSON_ParseWithLength((const char *)lg->reply.body.p, lg->reply.body.n);
    const cJSON *errs = j ? cJSON_GetObjectItemCaseSensitive(j, "errors") : NULL;
    const cJSON *bucket = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "data"), "upsertBucket"), "bucket");
    const cJSON *project = cJSON_GetObjectItemCaseSensitive(bucket, "project");
    const cJSON *pname = cJSON_GetObjectItemCaseSensitive(project, "name");
    const cJSON *ename = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(project, "entity"), "name");
    if ((cJSON_IsArray(errs) && cJSON_GetArraySize(errs) > 0) || !cJSON_IsString(pname) || !cJSON_IsString(ename)) {
        char what[700];
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(errs, 0), "message");
        snprintf(what, sizeof what, "the W&B server refused the run (UpsertBucket): %.300s",
                 cJSON_IsString(msg) ? msg->valuestring : cmi_buf_str(&lg->reply.body));
        cmi_worker_lock(&lg->w);
        lg->health.st.failed_requests++;
        cmi_health_rejected(&lg->health, "WandBLogger", what);
        cmi_worker_unlock(&lg->w);
        cJSON_Delete(j);
        return REJECTED;
    }
    if (!lg->entity_srv) {
        lg->entity_srv = cmi_strdup(ename->valuestring);
        lg->project_srv = cmi_strdup(pname->valuestring);
    }
    cJSON_Delete(j);
    return lg->entity_srv && lg->project_srv ? SENT : DOWN;
}

/* Sends the taken history lines (from the server's offset), the summary and, when `complete`,
 * the end of the run, in file_stream requests under the size limit. The lines stay in wq until
 * sent. */
static outcome stream(wandb_logger *lg, const char *summary, bool complete, int exit_code) {
    cmi_buf url = {0};
    cmi_buf_printf(&url, "%s/files/", lg->base);
    cmi_url_encode(&url, lg->entity_srv);
    cmi_buf_putc(&url, '/');
    cmi_url_encode(&url, lg->project_srv);
    cmi_buf_putc(&url, '/');
    cmi_url_encode(&url, lg->run_id);
    cmi_buf_puts(&url, "/file_stream");
    if (url.oom) return DOWN;
    int64_t i = 0;
    bool summary_sent = !summary;
    outcome o = SENT;
    do {
        cmi_buf *b = &lg->body;
        cmi_buf_reset(b);
        cmi_buf_puts(b, "{\"files\":{");
        int64_t start = i;
        size_t size = 0;
        if (i < lg->wqn) {
            cmi_buf_printf(b, "\"wandb-history.jsonl\":{\"offset\":%lld,\"content\":[", (long long)lg->hist_offset);
            for (; i < lg->wqn; i++) {
                const size_t n = strlen(lg->wq[i]);
                if (i > start && size + n > MAX_REQUEST_BYTES / 2) break;
                if (i > start) cmi_buf_putc(b, ',');
                cmi_json_str(b, lg->wq[i]);
                size += n;
            }
            cmi_buf_puts(b, "]}");
        }
        const bool more = i < lg->wqn;
        if (!more && !summary_sent) {
            if (i > start) cmi_buf_putc(b, ',');
            cmi_buf_puts(b, "\"wandb-summary.json\":{\"offset\":0,\"content\":[");
            cmi_json_str(b, summary);
            cmi_buf_puts(b, "]}");
        }
        cmi_buf_putc(b, '}');
        if (!more && complete) cmi_buf_printf(b, ",\"complete\":true,\"exitcode\":%d", exit_code);
        cmi_buf_putc(b, '}');
        if (b->oom) {
            o = DOWN;
            break;
        }
        o = call(lg, cmi_buf_str(&url), cmi_buf_str(b), b->n);
        if (o == DOWN) break;
        const int64_t n_lines = i - start;
        cmi_worker_lock(&lg->w);
        if (o == SENT) {
            lg->health.st.metrics_sent += n_lines;
            if (!more && complete) lg->health.st.finished = true;
        } else {
            lg->health.st.metrics_dropped += n_lines;
        }
        cmi_worker_unlock(&lg->w);
        /* sent, or refused (reported; a resend would be refused again): the offset moves on */
        for (int64_t k = start; k < i; k++) cm_free(lg->wq[k]), lg->wq[k] = NULL;
        lg->hist_offset += n_lines;
        if (!more) summary_sent = true;
        if (o == REJECTED && complete && !more) break;
    } while (i < lg->wqn);
    /* what was not sent moves to the front of wq */
    int64_t k = 0;
    for (int64_t j = 0; j < lg->wqn; j++)
        if (lg->wq[j]) lg->wq[k++] = lg->wq[j];
    lg->wqn = k;
    cmi_buf_free(&url);
    return o;
}

static void drop_lines(wandb_logger *lg, char **lines, int64_t *n) {
    for (int64_t i = 0; i < *n; i++) cm_free(lines[i]);
    lg->health.st.metrics_dropped += *n;
    *n = 0;
}

static void summary_report(wandb_logger *lg) {
    cmi_worker_lock(&lg->w);
    const int64_t lost = lg->health.st.metrics_dropped;
    if (lost > 0) {
        lg->health.st.reports++;
        cm_log_msg(CM_LOG_WARN, "WandBLogger: %lld history row%s could not be sent to %s (%s); a FileLogger's "
                                "metrics.jsonl has them",
                   (long long)lost, lost == 1 ? "" : "s", lg->base,
                   lg->health.st.last_error[0] ? lg->health.st.last_error : "the queue was full");
    }
    cmi_worker_unlock(&lg->w);
}

static void work(void *self, bool last) {
    wandb_logger *lg = self;
    /* take the new lines (after the ones not sent yet) and the config and summary */
    cmi_worker_lock(&lg->w);
    if (lg->wqn + lg->qn > lg->wqcap) {
        int64_t cap = lg->wqcap ? lg->wqcap : 256;
        while (cap < lg->wqn + lg->qn) cap *= 2;
        char **nq = cm_alloc(sizeof *nq * (size_t)cap, 16);
        if (nq) {
            if (lg->wqn) memcpy(nq, lg->wq, sizeof *nq * (size_t)lg->wqn);
            cm_free(lg->wq);
            lg->wq = nq, lg->wqcap = cap;
        }
    }
    if (lg->wqn + lg->qn <= lg->wqcap) {
        if (lg->qn) memcpy(lg->wq + lg->wqn, lg->q, sizeof *lg->q * (size_t)lg->qn);
        lg->wqn += lg->qn;
        lg->qn = 0;
    }
    char *config = lg->config_dirty && lg->config_json ? cmi_strdup(lg->config_json) : NULL;
    const bool config_dirty = lg->config_dirty;
    lg->config_dirty = false;
    char *summary = lg->summary_json ? cmi_strdup(lg->summary_json) : NULL;
    const int exit_code = lg->exit_code;
    lg->health.st.metrics_queued = lg->wqn + lg->qn;
    cmi_worker_unlock(&lg->w);

    if (lg->dead) goto drop;
    if (!lg->upserted || config_dirty) {
        outcome o = upsert(lg, config);
        if (o == REJECTED) {
            lg->dead = true;
            goto drop;
        }
        if (o == DOWN) {
            if (config_dirty) {
                cmi_worker_lock(&lg->w);
                lg->config_dirty = true;
                cmi_worker_unlock(&lg->w);
            }
            if (last) goto drop;
            goto out;
        }
        lg->upserted = true;
    }
    const bool has_data = lg->wqn > 0 || (summary && last);
    if (has_data || last || cmi_unix_time() - lg->last_request >= HEARTBEAT_S) {
        /* (an empty request is the client's heartbeat: the run is alive) */
        outcome o = stream(lg, last ? summary : (lg->wqn ? summary : NULL), last, exit_code);
        if (last && o != SENT) goto drop;
    }
    if (last) summary_report(lg);
out:
    cm_free(config), cm_free(summary);
    return;
drop:
    cmi_worker_lock(&lg->w);
    drop_lines(lg, lg->wq, &lg->wqn);
    drop_lines(lg, lg->q, &lg->qn);
    lg->health.st.metrics_queued = 0;
    cmi_worker_unlock(&lg->w);
    if (last) summary_report(lg);
    cm_free(config), cm_free(summary);
}

/* ---- offline: records ---- */

static void rec_begin(wandb_logger *lg) {
    cmi_buf_reset(&lg->rec);
    cmi_pb_int64(&lg->rec, REC_NUM, ++lg->rec_num);
}

static void rec_end(wandb_logger *lg) {
    if (lg->store_broken) return;
    if (lg->rec.oom) lg->store.err = ENOMEM;
    else cmi_wb_store_write(&lg->store, lg->rec.p, lg->rec.n);
    if (lg->store.err) {
        lg->store_broken = true;
        lg->health.st.reports++;
        cm_log_msg(CM_LOG_WARN, "WandBLogger: writing '%s' failed: %s; the offline run stops here (training goes on)",
                   lg->store_path, strerror(lg->store.err));
    }
}

static void pb_item(cmi_buf *b, int field, const char *key, const char *value_json) {
    size_t m = cmi_pb_begin(b, field);
    cmi_pb_string(b, ITEM_KEY, key);
    cmi_pb_string(b, ITEM_VALUE_JSON, value_json);
    cmi_pb_end(b, m);
}

static cm_status offline_open(wandb_logger *lg, const cm_state *st) {
    time_t now = (time_t)lg->start_time;
    struct tm tm;
    localtime_r(&now, &tm);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%d_%H%M%S", &tm);
    cmi_buf p = {0};
    cmi_buf_printf(&p, "%s/wandb/offline-run-%s-%s", lg->dir, stamp, lg->run_id);
    if (p.oom || !(lg->run_dir = cmi_strdup(cmi_buf_str(&p)))) {
        cmi_buf_free(&p);
        return cm_set_error(CM_ERR_OOM, "WandBLogger: out of memory");
    }
    cm_status s = cmi_folder_make(lg->run_dir);
    if (s) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        cmi_buf_free(&p);
        return cm_set_error(s, "WandBLogger: the offline run folder: %s", msg);
    }
    cmi_buf_printf(&p, "/files");
    if (!p.oom && (s = cmi_folder_make(cmi_buf_str(&p)))) { /* where wandb keeps the run's files */
        cmi_buf_free(&p);
        return s;
    }
    cmi_buf_reset(&p);
    cmi_buf_printf(&p, "%s/run-%s.wandb", lg->run_dir, lg->run_id);
    lg->store_path = p.oom ? NULL : cmi_strdup(cmi_buf_str(&p));
    cmi_buf_free(&p);
    if (!lg->store_path) return cm_set_error(CM_ERR_OOM, "WandBLogger: out of memory");
    lg->store.f = fopen(lg->store_path, "wbx");
    if (!lg->store.f)
        return cm_set_error(CM_ERR_IO, "WandBLogger: cannot create '%s': %s", lg->store_path, strerror(errno));
    cmi_wb_store_header(&lg->store);
    /* Header, then Run */
    cmi_buf *r = &lg->rec, *sub = &lg->sub;
    rec_begin(lg);
    size_t h = cmi_pb_begin(r, REC_HEADER);
    size_t vi = cmi_pb_begin(r, 1);
    cmi_buf_reset(sub);
    cmi_buf_printf(sub, "composer-c %s", cm_version());
    cmi_pb_string(r, 1, cmi_buf_str(sub));
    cmi_pb_end(r, vi);
    cmi_pb_end(r, h);
    rec_end(lg);
    rec_begin(lg);
    size_t run = cmi_pb_begin(r, REC_RUN);
    cmi_pb_string(r, 1, lg->run_id);
    if (lg->entity) cmi_pb_string(r, 2, lg->entity);
    if (lg->project) cmi_pb_string(r, 3, lg->project);
    if (lg->group) cmi_pb_string(r, 6, lg->group);
    if (lg->job_type) cmi_pb_string(r, 7, lg->job_type);
    cmi_pb_string(r, 8, lg->display_name);
    if (lg->notes) cmi_pb_string(r, 9, lg->notes);
    for (size_t i = 0; i < lg->n_tags; i++) cmi_pb_string(r, 10, lg->tags[i]);
    cmi_pb_string(r, 13, lg->host);
    size_t ts = cmi_pb_begin(r, 17);
    const double secs = floor(lg->start_time);
    cmi_pb_int64(r, 1, (int64_t)secs);
    const int64_t nanos = (int64_t)((lg->start_time - secs) * 1e9);
    if (nanos) cmi_pb_int64(r, 2, nanos);
    cmi_pb_end(r, ts);
    cmi_pb_end(r, run);
    rec_end(lg);
    (void)st;
    if (fflush(lg->store.f) != 0 || lg->store_broken)
        return cm_set_error(CM_ERR_IO, "WandBLogger: writing '%s' failed: %s", lg->store_path,
                            strerror(lg->store.err ? lg->store.err : errno));
    cmi_worker_lock(&lg->w);
    snprintf(lg->health.st.run_id, sizeof lg->health.st.run_id, "%s", lg->run_id);
    cmi_worker_unlock(&lg->w);
    return CM_OK;
}

/* ---- rows (training thread) ---- */

static wb_name *name_info(wandb_logger *lg, const char *name, int64_t *idx) {
    bool added;
    const int64_t k = cmi_intern_add(&lg->names, name, &added);
    if (k < 0) return NULL;
    if (lg->names.n > lg->info_cap) {
        int64_t cap = lg->info_cap ? 2 * lg->info_cap : 64;
        wb_name *ni = cm_alloc_zeroed(sizeof *ni * (size_t)cap, 16);
        if (!ni) return NULL;
        if (lg->info_cap) memcpy(ni, lg->info, sizeof *ni * (size_t)lg->info_cap);
        cm_free(lg->info);
        lg->info = ni, lg->info_cap = cap;
    }
    if (added) lg->info[k].row_gen = -1;
    *idx = k;
    return &lg->info[k];
}

/* The summary line: the latest value of every key, and the run's time. */
static char *summary_line(wandb_logger *lg, double now) {
    cmi_buf b = {0};
    cmi_buf_putc(&b, '{');
    bool first = true;
    for (int64_t k = 0; k < lg->names.n; k++) {
        if (!lg->info[k].has_last) continue;
        if (!first) cmi_buf_putc(&b, ',');
        first = false;
        cmi_json_str(&b, lg->names.names[k]);
        cmi_buf_putc(&b, ':');
        cmi_json_num(&b, lg->info[k].last, 1);
    }
    const double rt = now - lg->start_time;
    cmi_buf_printf(&b, "%s\"_step\":%lld,\"_runtime\":", first ? "" : ",", (long long)(lg->last_row_step < 0 ? 0 : lg->last_row_step));
    cmi_json_num(&b, rt, 1);
    cmi_buf_puts(&b, ",\"_timestamp\":");
    cmi_json_num(&b, now, 1);
    cmi_buf_printf(&b, ",\"_wandb\":{\"runtime\":%lld}}", (long long)rt);
    char *s = b.oom ? NULL : cmi_strdup(cmi_buf_str(&b));
    cmi_buf_free(&b);
    return s;
}

/* Finishes the current row: a history line (online) or record (offline). */
static void finish_row(wandb_logger *lg) {
    if (!lg->row_open) return;
    lg->row_open = false;
    lg->row_gen++;
    const double now = cmi_unix_time(), rt = now - lg->start_time;
    const int64_t step = lg->row_step, n = lg->row_n;
    lg->last_row_step = step;
    lg->row_n = 0;
    if (lg->mode == CM_WANDB_OFFLINE) {
        if (lg->store_broken) return;
        cmi_buf *r = &lg->rec, *v = &lg->sub;
        rec_begin(lg);
        size_t h = cmi_pb_begin(r, REC_HISTORY);
        for (int64_t i = 0; i < n; i++) {
            cmi_buf_reset(v);
            cmi_json_num(v, lg->row_val[i], 1);
            pb_item(r, 1, lg->names.names[lg->row_idx[i]], cmi_buf_str(v));
        }
        cmi_buf_reset(v);
        cmi_json_int(v, step);
        pb_item(r, 1, "_step", cmi_buf_str(v));
        cmi_buf_reset(v);
        cmi_json_num(v, rt, 1);
        pb_item(r, 1, "_runtime", cmi_buf_str(v));
        cmi_buf_reset(v);
        cmi_json_num(v, now, 1);
        pb_item(r, 1, "_timestamp", cmi_buf_str(v));
        size_t hs = cmi_pb_begin(r, 2);
        if (step) cmi_pb_int64(r, 1, step);
        cmi_pb_end(r, hs);
        cmi_pb_end(r, h);
        rec_end(lg);
        if (!lg->store_broken) {
            cmi_worker_lock(&lg->w);
            lg->health.st.metrics_sent++;
            cmi_worker_unlock(&lg->w);
        }
        return;
    }
    cmi_buf *b = &lg->line;
    cmi_buf_reset(b);
    cmi_buf_putc(b, '{');
    for (int64_t i = 0; i < n; i++) {
        cmi_json_str(b, lg->names.names[lg->row_idx[i]]);
        cmi_buf_putc(b, ':');
        cmi_json_num(b, lg->row_val[i], 1);
        cmi_buf_putc(b, ',');
    }
    cmi_buf_printf(b, "\"_step\":%lld,\"_runtime\":", (long long)step);
    cmi_json_num(b, rt, 1);
    cmi_buf_puts(b, ",\"_timestamp\":");
    cmi_json_num(b, now, 1);
    cmi_buf_putc(b, '}');
    char *line = b->oom || b->n > MAX_LINE_BYTES ? NULL : cmi_strdup(cmi_buf_str(b));
    if (!b->oom && b->n > MAX_LINE_BYTES)
        cm_log_msg(CM_LOG_WARN, "WandBLogger: the history row of step %lld is %zu bytes, over W&B's %d; it is not "
                                "sent",
                   (long long)step, b->n, MAX_LINE_BYTES);
    char *sum = summary_line(lg, now);
    cmi_worker_lock(&lg->w);
    if (sum) cm_free(lg->summary_json), lg->summary_json = sum;
    if (!line || lg->qn >= lg->max_queued) {
        lg->health.st.metrics_dropped++;
        cm_free(line);
    } else {
        if (lg->qn == lg->qcap) {
            int64_t cap = lg->qcap ? 2 * lg->qcap : 256;
            char **nq = cm_alloc(sizeof *nq * (size_t)cap, 16);
            if (nq) {
                if (lg->qn) memcpy(nq, lg->q, sizeof *nq * (size_t)lg->qn);
                cm_free(lg->q);
                lg->q = nq, lg->qcap = cap;
            }
        }
        if (lg->qn < lg->qcap) lg->q[lg->qn++] = line;
        else lg->health.st.metrics_dropped++, cm_free(line);
    }
    lg->health.st.metrics_queued = lg->qn;
    cmi_worker_unlock(&lg->w);
}

static cm_status wb_log_metrics(void *self, const cm_metric_value *v, int n, const cm_timestamp *ts) {
    wandb_logger *lg = self;
    if (!lg->enabled || lg->closed) return CM_OK;
    const int64_t step = ts ? ts->batch : 0;
    if (lg->row_open && step > lg->row_step) finish_row(lg);
    const int64_t current = lg->row_open ? lg->row_step : lg->last_row_step + 1;
    if (step < current) {
        /* wandb: "Steps must be monotonically increasing, so this data will be ignored" */
        if (!lg->warned_step)
            cm_log_msg(CM_LOG_WARN, "WandBLogger: values logged at step %lld, below the current step %lld, are not "
                                    "sent (W&B steps only increase)",
                       (long long)step, (long long)current);
        lg->warned_step = true;
        return CM_OK;
    }
    if (!lg->row_open) {
        lg->row_open = true;
        lg->row_step = step;
    }
    for (int i = 0; i < n; i++) {
        if (!v[i].name || !v[i].name[0]) continue;
        int64_t k;
        wb_name *in = name_info(lg, v[i].name, &k);
        if (!in) return cm_set_error(CM_ERR_OOM, "WandBLogger: out of memory for metric names");
        in->last = v[i].value, in->has_last = true;
        if (in->row_gen == lg->row_gen) { /* logged again in this row: the latest wins */
            lg->row_val[in->row_pos] = v[i].value;
            continue;
        }
        if (lg->row_n == lg->row_cap) {
            int64_t cap = lg->row_cap ? 2 * lg->row_cap : 64;
            int64_t *ni = cm_alloc(sizeof *ni * (size_t)cap, 16);
            double *nv = cm_alloc(sizeof *nv * (size_t)cap, 16);
            if (!ni || !nv) {
                cm_free(ni), cm_free(nv);
                return cm_set_error(CM_ERR_OOM, "WandBLogger: out of memory for a history row");
            }
            if (lg->row_n) memcpy(ni, lg->row_idx, sizeof *ni * (size_t)lg->row_n);
            if (lg->row_n) memcpy(nv, lg->row_val, sizeof *nv * (size_t)lg->row_n);
            cm_free(lg->row_idx), cm_free(lg->row_val);
            lg->row_idx = ni, lg->row_val = nv, lg->row_cap = cap;
        }
        in->row_gen = lg->row_gen, in->row_pos = lg->row_n;
        lg->row_idx[lg->row_n] = k, lg->row_val[lg->row_n] = v[i].value;
        lg->row_n++;
    }
    return CM_OK;
}

static cm_status wb_log_hparams(void *self, const cm_hparam *h, int n) {
    wandb_logger *lg = self;
    if (!lg->enabled || lg->closed) return CM_OK;
    if (lg->mode == CM_WANDB_OFFLINE) {
        if (lg->store_broken) return CM_OK;
        cmi_buf *r = &lg->rec, *v = &lg->sub;
        rec_begin(lg);
        size_t c = cmi_pb_begin(r, REC_CONFIG);
        for (int i = 0; i < n; i++) {
            if (!h[i].key) continue;
            cmi_buf_reset(v);
            hp_json(v, &h[i]);
            pb_item(r, 1, h[i].key, cmi_buf_str(v));
        }
        cmi_pb_end(r, c);
        rec_end(lg);
        return CM_OK;
    }
    /* online: the config JSON, merged with what came before (wandb.config.update) */
    cJSON *cfg = NULL;
    cmi_worker_lock(&lg->w);
    if (lg->config_json) cfg = cJSON_Parse(lg->config_json);
    cmi_worker_unlock(&lg->w);
    if (!cfg) cfg = cJSON_CreateObject();
    cm_status s = CM_OK;
    cmi_buf v = {0};
    for (int i = 0; i < n && cfg && !s; i++) {
        if (!h[i].key) continue;
        cmi_buf_reset(&v);
        cmi_buf_puts(&v, "{\"value\":");
        hp_json(&v, &h[i]);
        cmi_buf_putc(&v, '}');
        cJSON *item = v.oom ? NULL : cJSON_Parse(cmi_buf_str(&v));
        if (!item) {
            /* (cJSON does not read a bare NaN: such a value goes as a string) */
            cmi_buf_reset(&v);
            cmi_buf_puts(&v, "{\"value\":");
            cmi_buf_printf(&v, "\"%s\"", isnan(h[i].number) ? "NaN" : h[i].number > 0 ? "Infinity" : "-Infinity");
            cmi_buf_putc(&v, '}');
            item = cJSON_Parse(cmi_buf_str(&v));
        }
        if (!item) s = cm_set_error(CM_ERR_OOM, "WandBLogger: out of memory for the config");
        else if (cJSON_HasObjectItem(cfg, h[i].key)) cJSON_ReplaceItemInObjectCaseSensitive(cfg, h[i].key, item);
        else cJSON_AddItemToObject(cfg, h[i].key, item);
    }
    cmi_buf_free(&v);
    char *txt = cfg && !s ? cJSON_PrintUnformatted(cfg) : NULL;
    cJSON_Delete(cfg);
    if (!txt) return s ? s : cm_set_error(CM_ERR_OOM, "WandBLogger: out of memory for the config");
    char *copy = cmi_strdup(txt);
    cJSON_free(txt);
    if (!copy) return cm_set_error(CM_ERR_OOM, "WandBLogger: out of memory for the config");
    cmi_worker_lock(&lg->w);
    cm_free(lg->config_json);
    lg->config_json = copy;
    lg->config_dirty = true;
    cmi_worker_unlock(&lg->w);
    cmi_worker_kick(&lg->w);
    return CM_OK;
}

static void random_id(char *out) {
    static const char chars[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    uint64_t x = cm_clock_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)out;
    FILE *f = fopen("/dev/urandom", "rb");
    if (f) {
        uint64_t r;
        if (fread(&r, sizeof r, 1, f) == 1) x ^= r;
        fclose(f);
    }
    for (int i = 0; i < 8; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        out[i] = chars[(x >> 33) % 36];
    }
    out[8] = '\0';
}

static cm_status wb_init(void *self, const cm_state *st) {
    wandb_logger *lg = self;
    if (lg->initialised) return cm_set_error(CM_ERR_STATE, "WandBLogger: already initialised (one logger per trainer)");
    lg->initialised = true;
    const int rank = cm_state_rank(st);
    if (lg->mode == CM_WANDB_DISABLED || (lg->rank_zero_only && rank != 0)) return CM_OK;
    const char *trainer_name = cm_state_run_name(st);
    if (!trainer_name || !trainer_name[0]) trainer_name = "run";
    const char *name = lg->name_cfg ? lg->name_cfg : trainer_name;
    if (lg->rank_zero_only) {
        snprintf(lg->display_name, sizeof lg->display_name, "%s", name);
    } else { /* Composer: <name>-rank<r>, grouped under the name */
        snprintf(lg->display_name, sizeof lg->display_name, "%s-rank%d", name, rank);
        if (!lg->group && !(lg->group = cmi_strdup(name))) return cm_set_error(CM_ERR_OOM, "WandBLogger: out of memory");
    }
    if (lg->id_cfg) snprintf(lg->run_id, sizeof lg->run_id, "%s", lg->id_cfg);
    else random_id(lg->run_id);
    if (lg->id_cfg && !lg->rank_zero_only)
        snprintf(lg->run_id + strlen(lg->run_id), sizeof lg->run_id - strlen(lg->run_id), "-rank%d", rank);
    if (gethostname(lg->host, sizeof lg->host - 1) != 0) snprintf(lg->host, sizeof lg->host, "localhost");
    lg->start_time = cmi_unix_time();
    lg->last_row_step = -1;
    lg->exit_code = -1;
    cm_status s;
    if (lg->mode == CM_WANDB_OFFLINE) {
        /* offline: the worker is only a lock (no thread); records go straight to the file */
        pthread_mutex_init(&lg->w.mu, NULL);
        if ((s = offline_open(lg, st))) {
            pthread_mutex_destroy(&lg->w.mu);
            return s;
        }
        lg->enabled = true;
        return CM_OK;
    }
    snprintf(lg->health.st.run_id, sizeof lg->health.st.run_id, "%s", lg->run_id); /* (no thread yet) */
    s = cmi_http_new(&lg->http_opts, &lg->http);
    if (!s) s = cmi_http_add_header(lg->http, lg->api_key_header);
    if (!s) s = cmi_worker_start(&lg->w, lg->flush_interval, work, lg);
    if (s) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "WandBLogger: %s", msg);
    }
    lg->enabled = true;
    cmi_worker_kick(&lg->w); /* create the run now */
    return CM_OK;
}

static cm_status wb_run_event(void *self, cm_event ev, const cm_state *st) {
    wandb_logger *lg = self;
    (void)st;
    if (ev == CM_EVENT_FIT_START) {
        lg->fit_open = true;
    } else if (ev == CM_EVENT_FIT_END) {
        lg->fit_open = false;
        if (lg->enabled && !lg->closed && lg->mode == CM_WANDB_ONLINE) cmi_worker_kick(&lg->w);
    }
    if (lg->enabled && lg->mode == CM_WANDB_OFFLINE && !lg->store_broken &&
        (ev == CM_EVENT_EPOCH_END || ev == CM_EVENT_EVAL_END || ev == CM_EVENT_FIT_END) && fflush(lg->store.f) != 0) {
        lg->store.err = errno;
        rec_end(lg); /* reports it */
    }
    return CM_OK;
}

static cm_status wb_flush(void *self) {
    wandb_logger *lg = self;
    if (lg->enabled && !lg->closed && lg->mode == CM_WANDB_ONLINE) cmi_worker_kick(&lg->w);
    return CM_OK;
}

static void finish(wandb_logger *lg, int exit_code) {
    if (!lg->enabled || lg->closed) return;
    lg->closed = true;
    finish_row(lg);
    if (lg->mode == CM_WANDB_OFFLINE) {
        const double now = cmi_unix_time();
        cmi_buf *r = &lg->rec, *v = &lg->sub;
        if (!lg->store_broken) {
            rec_begin(lg);
            size_t sm = cmi_pb_begin(r, REC_SUMMARY);
            for (int64_t k = 0; k < lg->names.n; k++) {
                if (!lg->info[k].has_last) continue;
                cmi_buf_reset(v);
                cmi_json_num(v, lg->info[k].last, 1);
                pb_item(r, 1, lg->names.names[k], cmi_buf_str(v));
            }
            cmi_buf_reset(v);
            cmi_json_int(v, lg->last_row_step < 0 ? 0 : lg->last_row_step);
            pb_item(r, 1, "_step", cmi_buf_str(v));
            cmi_buf_reset(v);
            cmi_json_num(v, now - lg->start_time, 1);
            pb_item(r, 1, "_runtime", cmi_buf_str(v));
            cmi_buf_reset(v);
            cmi_json_int(v, (int64_t)(now - lg->start_time));
            size_t it = cmi_pb_begin(r, 1); /* _wandb.runtime, as a nested key */
            cmi_pb_string(r, ITEM_NESTED_KEY, "_wandb");
            cmi_pb_string(r, ITEM_NESTED_KEY, "runtime");
            cmi_pb_string(r, ITEM_VALUE_JSON, cmi_buf_str(v));
            cmi_pb_end(r, it);
            cmi_pb_end(r, sm);
            rec_end(lg);
        }
        if (!lg->store_broken) {
            rec_begin(lg);
            size_t ex = cmi_pb_begin(r, REC_EXIT);
            if (exit_code) cmi_pb_int64(r, 1, exit_code);
            const int64_t runtime = (int64_t)(now - lg->start_time);
            if (runtime) cmi_pb_int64(r, 2, runtime);
            cmi_pb_end(r, ex);
            rec_end(lg);
        }
        const bool bad = fclose(lg->store.f) != 0;
        lg->store.f = NULL;
        if (bad && !lg->store_broken) {
            lg->store.err = errno ? errno : EIO;
            rec_end(lg);
        }
        cmi_worker_lock(&lg->w);
        lg->health.st.finished = !lg->store_broken;
        cmi_worker_unlock(&lg->w);
        return;
    }
    cmi_worker_lock(&lg->w);
    lg->exit_code = exit_code;
    cmi_worker_unlock(&lg->w);
    cmi_http_set_deadline(lg->http, cmi_unix_time() + (lg->close_timeout > 0 ? lg->close_timeout : 1e-3));
    cmi_worker_stop(&lg->w);
}

static cm_status wb_close(void *self, const cm_state *st) {
    wandb_logger *lg = self;
    (void)st;
    finish(lg, lg->fit_open ? 1 : 0);
    return CM_OK;
}

static void free_strs(char **v, int64_t n) {
    for (int64_t i = 0; i < n; i++) cm_free(v[i]);
    cm_free(v);
}

static void wb_free(void *self) {
    wandb_logger *lg = self;
    finish(lg, 1); /* freed without a close: the run did not end normally */
    if (lg->mode == CM_WANDB_OFFLINE && lg->enabled) pthread_mutex_destroy(&lg->w.mu);
    if (lg->store.f) fclose(lg->store.f);
    cmi_http_free(lg->http);
    cmi_http_reply_free(&lg->reply);
    cmi_buf_free(&lg->body), cmi_buf_free(&lg->line), cmi_buf_free(&lg->rec), cmi_buf_free(&lg->sub);
    cmi_intern_free(&lg->names);
    cm_free(lg->info), cm_free(lg->row_idx), cm_free(lg->row_val);
    free_strs(lg->q, lg->qn), free_strs(lg->wq, lg->wqn);
    cm_free(lg->config_json), cm_free(lg->summary_json), cm_free(lg->entity_srv), cm_free(lg->project_srv);
    cm_free(lg->run_dir), cm_free(lg->store_path);
    free_strs(lg->tags, (int64_t)lg->n_tags);
    cm_free(lg->base), cm_free(lg->api_key_header), cm_free(lg->project), cm_free(lg->entity), cm_free(lg->name_cfg);
    cm_free(lg->group), cm_free(lg->notes), cm_free(lg->job_type), cm_free(lg->id_cfg), cm_free(lg->dir);
    cm_free(lg);
}

static const cm_logger_i wandb_vt = {
    .abi = CM_LOGGER_ABI,
    .name = "WandBLogger",
    .init = wb_init,
    .log_hyperparameters = wb_log_hparams,
    .log_metrics = wb_log_metrics,
    .run_event = wb_run_event,
    .flush = wb_flush,
    .close = wb_close,
    .free = wb_free,
};

/* ---- construction ---- */

static cm_status dup_opt(const char *cfg, const char *env, char **out) {
    const char *v = cfg ? cfg : cmi_env(env);
    *out = NULL;
    if (v && !(*out = cmi_strdup(v))) return cm_set_error(CM_ERR_OOM, "WandBLogger: out of memory");
    return CM_OK;
}

static cm_status build(const cm_wandb_logger_config *cfg, wandb_logger *lg) {
    cm_status s;
    int mode = cfg->mode;
    if (mode < 0) {
        const char *m = cmi_env("WANDB_MODE");
        if (!m || !strcasecmp(m, "online") || !strcasecmp(m, "run")) mode = CM_WANDB_ONLINE;
        else if (!strcasecmp(m, "offline") || !strcasecmp(m, "dryrun")) mode = CM_WANDB_OFFLINE;
        else if (!strcasecmp(m, "disabled")) mode = CM_WANDB_DISABLED;
        else
            return cm_set_error(CM_ERR_INVALID_ARG, "WandBLogger: WANDB_MODE='%s' is not a mode (use online, offline or "
                                                    "disabled)",
                                m);
    } else if (mode > CM_WANDB_DISABLED) {
        return cm_set_error(CM_ERR_INVALID_ARG, "WandBLogger: mode %d is not a cm_wandb_mode", mode);
    }
    lg->mode = mode;
    if ((s = dup_opt(cfg->project, "WANDB_PROJECT", &lg->project)) ||
        (s = dup_opt(cfg->entity, "WANDB_ENTITY", &lg->entity)) || (s = dup_opt(cfg->name, "WANDB_NAME", &lg->name_cfg)) ||
        (s = dup_opt(cfg->group, "WANDB_RUN_GROUP", &lg->group)) || (s = dup_opt(cfg->notes, "WANDB_NOTES", &lg->notes)) ||
        (s = dup_opt(cfg->job_type, "WANDB_JOB_TYPE", &lg->job_type)) ||
        (s = dup_opt(cfg->id, "WANDB_RUN_ID", &lg->id_cfg)) || (s = dup_opt(cfg->dir, "WANDB_DIR", &lg->dir)))
        return s;
    if (!lg->dir && !(lg->dir = cmi_strdup("."))) return cm_set_error(CM_ERR_OOM, "WandBLogger: out of memory");
    if ((lg->project && !lg->project[0]) || (lg->entity && !lg->entity[0]) || (lg->name_cfg && !lg->name_cfg[0]))
        return cm_set_error(CM_ERR_INVALID_ARG, "WandBLogger: project, entity and name must not be empty (NULL = the "
                                                "default)");
    if (lg->id_cfg) {
        const char *id = lg->id_cfg;
        const size_t n = strlen(id);
        if (n == 0 || n > 128 || id[0] == ' ' || id[n - 1] == ' ' || strpbrk(id, ":;,#?/'"))
            return cm_set_error(CM_ERR_INVALID_ARG, "WandBLogger: run id '%s' is not one W&B accepts (not empty, at most "
                                                    "128 characters, no spaces around it, none of :;,#?/')",
                                id);
    }
    /* tags: the config's, else $WANDB_TAGS (comma-separated, as wandb reads it) */
    if (cfg->n_tags && !cfg->tags)
        return cm_set_error(CM_ERR_INVALID_ARG, "WandBLogger: n_tags is %zu but tags is NULL", cfg->n_tags);
    if (cfg->n_tags) {
        lg->tags = cm_alloc_zeroed(sizeof *lg->tags * cfg->n_tags, 16);
        if (!lg->tags) return cm_set_error(CM_ERR_OOM, "WandBLogger: out of memory");
        for (size_t i = 0; i < cfg->n_tags; i++, lg->n_tags++) {
            if (!cfg->tags[i]) return cm_set_error(CM_ERR_INVALID_ARG, "WandBLogger: tags[%zu] is NULL", i);
            if (!(lg->tags[i] = cmi_strdup(cfg->tags[i]))) return cm_set_error(CM_ERR_OOM, "WandBLogger: out of memory");
        }
    } else if (cmi_env("WANDB_TAGS")) {
        const char *t = cmi_env("WANDB_TAGS");
        size_t n = 1;
        for (const char *c = t; *c; c++) n += *c == ',';
        lg->tags = cm_alloc_zeroed(sizeof *lg->tags * n, 16);
        if (!lg->tags) return cm_set_error(CM_ERR_OOM, "WandBLogger: out of memory");
        for (const char *c = t; c;) {
            const char *e = strchr(c, ',');
            size_t len = e ? (size_t)(e - c) : strlen(c);
            while (len && *c == ' ') c++, len--;
            while (len && c[len - 1] == ' ') len--;
            if (len) {
                char *tag = cm_alloc(len + 1, 8);
                if (!tag) return cm_set_error(CM_ERR_OOM, "WandBLogger: out of memory");
                memcpy(tag, c, len), tag[len] = '\0';
                lg->tags[lg->n_tags++] = tag;
            }
            c = e ? e + 1 : NULL;
        }
    }
    if (!(cfg->flush_interval > 0) || !isfinite(cfg->flush_interval))
        return cm_set_error(CM_ERR_INVALID_ARG, "WandBLogger: flush_interval must be > 0 seconds, got %g",
                            cfg->flush_interval);
    if (!(cfg->close_timeout >= 0) || !isfinite(cfg->close_timeout) || !(cfg->request_timeout > 0) ||
        !(cfg->backoff_s >= 0) || cfg->max_retries < 0 || cfg->max_retries > 100)
        return cm_set_error(CM_ERR_INVALID_ARG, "WandBLogger: close_timeout %g (>= 0), request_timeout %g (> 0), backoff_s "
                                                "%g (>= 0) or max_retries %d (0 to 100) out of range",
                            cfg->close_timeout, cfg->request_timeout, cfg->backoff_s, cfg->max_retries);
    if (cfg->max_queued < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "WandBLogger: max_queued must be at least 1, got %lld",
                            (long long)cfg->max_queued);
    lg->rank_zero_only = cfg->rank_zero_only;
    lg->flush_interval = cfg->flush_interval;
    lg->close_timeout = cfg->close_timeout;
    lg->max_queued = cfg->max_queued;
    if (mode != CM_WANDB_ONLINE) return CM_OK;
    /* online: the server and the key */
    const char *base = cmi_env("WANDB_BASE_URL");
    if (!base) base = "https://api.wandb.ai";
    if (strncmp(base, "http://", 7) != 0 && strncmp(base, "https://", 8) != 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "WandBLogger: WANDB_BASE_URL='%s' is not an http(s) URL", base);
    const char *key = cmi_env("WANDB_API_KEY");
    if (!key)
        return cm_set_error(CM_ERR_INVALID_ARG, "WandBLogger: WANDB_API_KEY is not set (get a key at "
                                                "<base URL>/authorize, or log offline with mode: offline)");
    cmi_buf b = {0};
    cmi_buf_puts(&b, base);
    while (b.n > 8 && b.p[b.n - 1] == '/') b.n--;
    lg->base = b.oom ? NULL : cmi_strdup(cmi_buf_str(&b));
    /* HTTP Basic with the user "api" and the key as the password (credentials.go) */
    static const char tb[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    cmi_buf up = {0};
    cmi_buf_printf(&up, "api:%s", key);
    cmi_buf_reset(&b);
    cmi_buf_puts(&b, "Authorization: Basic ");
    for (size_t i = 0; i < up.n; i += 3) {
        const uint32_t x = (uint32_t)up.p[i] << 16 | (i + 1 < up.n ? (uint32_t)up.p[i + 1] << 8 : 0) |
                           (i + 2 < up.n ? up.p[i + 2] : 0);
        cmi_buf_putc(&b, tb[(x >> 18) & 63]);
        cmi_buf_putc(&b, tb[(x >> 12) & 63]);
        cmi_buf_putc(&b, i + 1 < up.n ? tb[(x >> 6) & 63] : '=');
        cmi_buf_putc(&b, i + 2 < up.n ? tb[x & 63] : '=');
    }
    lg->api_key_header = b.oom || up.oom ? NULL : cmi_strdup(cmi_buf_str(&b));
    cmi_buf_free(&b), cmi_buf_free(&up);
    if (!lg->base || !lg->api_key_header) return cm_set_error(CM_ERR_OOM, "WandBLogger: out of memory");
    lg->http_opts = (cmi_http_opts){
        .who = "WandBLogger",
        .timeout_s = cfg->request_timeout,
        .max_retries = cfg->max_retries,
        .backoff_factor = cfg->backoff_s,
        .backoff_jitter = 0,
    };
    return CM_OK;
}

cm_status cm_wandb_logger_new(const cm_wandb_logger_config *cfg, cm_logger_plugin *out) {
    if (!cfg || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_wandb_logger_new: cfg and out must not be NULL");
    *out = (cm_logger_plugin){0};
    wandb_logger *lg = cm_alloc_zeroed(sizeof *lg, 64);
    if (!lg) return cm_set_error(CM_ERR_OOM, "cm_wandb_logger_new: out of memory");
    cm_status s = build(cfg, lg);
    if (s) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        wb_free(lg);
        return cm_set_error(s, "%s", msg);
    }
    *out = (cm_logger_plugin){&wandb_vt, lg};
    return CM_OK;
}

cm_status cm_wandb_logger_stats(const cm_logger_plugin *p, cm_tracker_stats *out) {
    if (!p || p->vt != &wandb_vt || !p->self || !out)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_wandb_logger_stats: not a WandBLogger plugin (or out is NULL)");
    wandb_logger *lg = p->self;
    const bool locked = lg->enabled && (lg->mode == CM_WANDB_OFFLINE || lg->w.running);
    if (locked) cmi_worker_lock(&lg->w);
    *out = lg->health.st;
    if (locked) cmi_worker_unlock(&lg->w);
    return CM_OK;
}

const char *cm_wandb_logger_run_dir(const cm_logger_plugin *p) {
    if (!p || p->vt != &wandb_vt || !p->self) return NULL;
    return ((const wandb_logger *)p->self)->run_dir;
}
