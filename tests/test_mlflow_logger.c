/* MLFlowLogger against a local MLflow test server (tests/trackers/mlflow_server.py) that
 * implements the REST endpoints of FORMATS.md §8 and checks every request against the protocol
 * (fields, types, names, the log-batch limits, params that never change): whole fits whose
 * experiment, run, tags, params, every metric (key, value, step) and final status are compared
 * with an InMemoryLogger of the same fit; chunking at the API's limits; retries on 429, 5xx and
 * timeouts; a server that stays down (reported once, training goes on, nothing waits) or comes
 * back (everything kept is sent); a failed fit (FAILED); Composer's options and the MLFLOW_*
 * environment variables. */
#include "cmtest.h"
#include "cmtrack.h"
#include "cmtrain.h"

#include "plugins/loggers/wire.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static cmt_server srv;

static void start(void) { srv = cmt_server_start("mlflow_server.py"); }
static void stop(void) { cmt_server_stop(&srv); }

TestSuite(mlflow_logger, .init = start, .fini = stop);

/* Settings that make the tests quick: a short flush interval, fast retries, no jitter, every
 * value sent (no duplicate skipping). */
static cm_mlflow_logger_config quick(void) {
    cm_mlflow_logger_config c = cm_mlflow_logger_config_default();
    c.tracking_uri = srv.url;
    c.flush_interval = 0.05;
    c.max_retries = 3;
    c.backoff_factor = 0.01;
    c.backoff_jitter = 0;
    c.request_timeout = 5;
    c.close_timeout = 10;
    c.log_duplicated_metric_every_n_steps = 0;
    return c;
}

static cm_logger_plugin make(const cm_mlflow_logger_config *c) {
    cm_logger_plugin p;
    cr_assert_eq(cm_mlflow_logger_new(c, &p), CM_OK, "%s", cm_last_error());
    return p;
}

static const cJSON *run_named(const cJSON *st, const char *name) {
    const cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(st, "runs")) {
        if (!strcmp(cmt_json_str(cJSON_GetObjectItem(r, "info"), "run_name"), name)) return r;
    }
    cr_assert_fail("no run named %s", name);
    return NULL;
}

static int count_requests(const cJSON *st, const char *endpoint) {
    int n = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(st, "requests")) {
        if (!strcmp(cmt_json_str(r, "endpoint"), endpoint)) n++;
    }
    return n;
}

static cm_tracker_stats stats_of(const cmt_track_rig *g, int index) {
    const cm_logger_plugin p = cm_engine_logger_plugin(cm_trainer_engine(g->tr), index);
    cm_tracker_stats s;
    cr_assert_eq(cm_mlflow_logger_stats(&p, &s), CM_OK);
    return s;
}

static double value_of(const cJSON *m) {
    const cJSON *v = cJSON_GetObjectItem(m, "value");
    if (cJSON_IsNumber(v)) return v->valuedouble;
    cr_assert(cJSON_IsString(v), "metric value is neither a number nor a string");
    return !strcmp(v->valuestring, "NaN") ? NAN : !strcmp(v->valuestring, "Infinity") ? INFINITY : -INFINITY;
}

/* ---- a whole fit ---- */

Test(mlflow_logger, a_fit_makes_the_experiment_and_run_and_sends_every_value) {
    cm_mlflow_logger_config c = quick();
    c.experiment_name = "exp-a";
    const char *tags[] = {"team", "ml", "purpose", "a test"};
    c.tags = tags, c.n_tags = 2;
    c.run_group = "g1";
    cm_in_memory_logger *mem;
    cm_logger_plugin p = make(&c);
    const double t0 = cmi_unix_time();
    cmt_track_rig g = cmt_track_rig_make(&(cmt_fit_opts){.run_name = "ml-run", .mem = &mem}, &p, 1);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_close(g.tr), CM_OK, "%s", cm_last_error());
    const double t1 = cmi_unix_time();
    const cm_tracker_stats s = stats_of(&g, 1);
    cJSON *st = cmt_server_state(&srv);
    cmt_assert_no_violations(st);
    /* the experiment, created after a 404 from get-by-name */
    const cJSON *reqs = cJSON_GetObjectItem(st, "requests");
    cr_assert_str_eq(cmt_json_str(cJSON_GetArrayItem(reqs, 0), "endpoint"), "experiments/get-by-name");
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(reqs, 0), "status")->valueint, 404);
    cr_assert_str_eq(cmt_json_str(cJSON_GetArrayItem(reqs, 1), "endpoint"), "experiments/create");
    cr_assert_str_eq(cmt_json_str(cJSON_GetArrayItem(reqs, 2), "endpoint"), "runs/create");
    cr_assert_str_eq(cmt_json_str(cJSON_GetArrayItem(reqs, cJSON_GetArraySize(reqs) - 1), "endpoint"), "runs/update",
                     "the status update is the last request");
    const cJSON *exps = cJSON_GetObjectItem(st, "experiments");
    cr_assert_eq(cJSON_GetArraySize(exps), 1);
    cr_assert_str_eq(cmt_json_str(exps->child, "name"), "exp-a");
    /* the run: name, Composer's tags, FINISHED with an end time */
    const cJSON *run = cmt_only_run(st), *info = cJSON_GetObjectItem(run, "info");
    const cJSON *data = cJSON_GetObjectItem(run, "data");
    cr_assert_str_eq(cmt_json_str(info, "run_name"), "ml-run");
    cr_assert_str_eq(cmt_json_str(info, "run_id"), s.run_id);
    cr_assert_str_eq(cmt_json_str(info, "status"), "FINISHED");
    const double end = cJSON_GetObjectItem(info, "end_time")->valuedouble / 1000;
    cr_assert(end >= t0 - 1 && end <= t1 + 1, "end_time %f not within the run", end);
    const cJSON *tg = cJSON_GetObjectItem(data, "tags");
    const char *want_tags[][2] = {{"run_name", "ml-run"},       {"team", "ml"},
                                  {"purpose", "a test"},        {"run_group", "g1"},
                                  {"mlflow.runName", "ml-run"}, {"mlflow.source.type", "LOCAL"},
                                  {"mlflow.source.name", "composer"}};
    for (size_t i = 0; i < sizeof want_tags / sizeof *want_tags; i++) {
        const char *v = cmt_json_str(tg, want_tags[i][0]);
        cr_assert(v && !strcmp(v, want_tags[i][1]), "tag %s = %s, want %s", want_tags[i][0], v ? v : "(none)",
                  want_tags[i][1]);
    }
    cr_assert_not_null(cmt_json_str(tg, "mlflow.user"));
    /* the trainer's hyperparameters as params, as Python's str() writes them */
    const cJSON *params = cJSON_GetObjectItem(data, "params");
    cr_assert_str_eq(cmt_json_str(params, "run_name"), "ml-run");
    cr_assert_str_eq(cmt_json_str(params, "max_duration"), "2ep");
    cr_assert_str_eq(cmt_json_str(params, "deterministic_mode"), "False");
    cr_assert_str_eq(cmt_json_str(params, "world_size"), "1");
    /* every value, in order, with its step and an exact value */
    const cJSON *ms = cJSON_GetObjectItem(data, "metrics");
    const int64_t n = cm_in_memory_logger_n(mem);
    cr_assert_gt(n, 20);
    cr_assert_eq(cJSON_GetArraySize(ms), n, "%d metrics on the server, %lld logged", cJSON_GetArraySize(ms),
                 (long long)n);
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, ms) {
        const cm_log_record *r = cm_in_memory_logger_record(mem, i++);
        cr_assert_str_eq(cmt_json_str(m, "key"), r->name);
        cr_assert_eq(cJSON_GetObjectItem(m, "step")->valuedouble, (double)r->batch, "%s: step", r->name);
        const double v = value_of(m);
        cr_assert(v == r->value || (isnan(v) && isnan(r->value)), "%s at %lld: %.17g != %.17g", r->name,
                  (long long)r->batch, v, r->value);
        const double ts = cJSON_GetObjectItem(m, "timestamp")->valuedouble / 1000;
        cr_assert(ts >= t0 - 1 && ts <= t1 + 1, "timestamp %f", ts);
    }
    cr_assert_eq(s.metrics_sent, n);
    cr_assert_eq(s.metrics_dropped, 0);
    cr_assert_eq(s.reports, 0);
    cr_assert(s.finished);
    cJSON_Delete(st);
    cmt_track_rig_free(&g);
}

Test(mlflow_logger, a_second_run_finds_the_experiment_by_name) {
    for (int k = 0; k < 2; k++) {
        cm_mlflow_logger_config c = quick();
        c.experiment_name = "shared";
        cm_logger_plugin p = make(&c);
        cmt_track_rig g = cmt_track_rig_make(&(cmt_fit_opts){.run_name = k ? "second" : "first", .max_duration = "2ba",
                                                 .no_eval = true},
                                 &p, 1);
        cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK);
        cmt_track_rig_free(&g); /* (closes through cm_trainer_free) */
    }
    cJSON *st = cmt_server_state(&srv);
    cmt_assert_no_violations(st);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(st, "experiments")), 1);
    cr_assert_eq(count_requests(st, "experiments/create"), 1);
    cr_assert_eq(count_requests(st, "experiments/get-by-name"), 2);
    cr_assert_str_eq(cmt_json_str(cJSON_GetObjectItem(run_named(st, "second"), "info"), "status"), "FINISHED");
    cr_assert_str_eq(cmt_json_str(cJSON_GetObjectItem(run_named(st, "first"), "info"), "experiment_id"),
                     cmt_json_str(cJSON_GetObjectItem(run_named(st, "second"), "info"), "experiment_id"));
    cJSON_Delete(st);
}

/* ---- limits ---- */

/* A callback logging `n_metrics` distinct metrics at every BATCH_END and `n_hparams`
 * hyperparameters at FIT_START. */
typedef struct {
    int n_metrics, n_hparams;
    char (*names)[32];
} flood;

static cm_status flood_run(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    flood *f = self;
    if (ev == CM_EVENT_FIT_START) {
        cm_hparam *h = calloc((size_t)f->n_hparams, sizeof *h);
        for (int i = 0; i < f->n_hparams; i++) h[i] = (cm_hparam){f->names[i], CM_HPARAM_NUMBER, i * 0.5, NULL};
        cm_status s = cm_logger_log_hyperparameters(lg, h, f->n_hparams);
        free(h);
        return s;
    }
    if (ev != CM_EVENT_BATCH_END) return CM_OK;
    cm_metric_value *v = calloc((size_t)f->n_metrics, sizeof *v);
    for (int i = 0; i < f->n_metrics; i++) v[i] = (cm_metric_value){f->names[i], i + 0.25 * (double)cm_state_timestamp(st)->batch};
    cm_status s = cm_logger_log_metrics(lg, v, f->n_metrics);
    free(v);
    return s;
}

static const cm_callback_i flood_vt = {.abi = CM_CALLBACK_ABI, .name = "Flood", .run_event = flood_run};

Test(mlflow_logger, log_batch_requests_stay_within_the_api_limits) {
    flood f = {2500, 250, calloc(2500, 32)};
    for (int i = 0; i < 2500; i++) snprintf(f.names[i], 32, "flood/m%04d", i);
    cm_callback_plugin cb = {&flood_vt, &f};
    cm_mlflow_logger_config c = quick();
    c.flush_interval = 30; /* one big send at the end: the chunking has everything at once */
    cm_logger_plugin p = make(&c);
    cmt_track_rig g = cmt_track_rig_make(&(cmt_fit_opts){.max_duration = "2ba", .no_eval = true, .callbacks = &cb,
                                             .n_callbacks = 1},
                             &p, 1);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK);
    cr_assert_eq(cm_trainer_close(g.tr), CM_OK);
    cJSON *st = cmt_server_state(&srv);
    cmt_assert_no_violations(st);
    int batches = 0, max_m = 0, max_p = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(st, "requests")) {
        if (strcmp(cmt_json_str(r, "endpoint"), "runs/log-batch")) continue;
        const cJSON *b = cJSON_GetObjectItem(r, "body");
        const int nm = cJSON_GetArraySize(cJSON_GetObjectItem(b, "metrics")),
                  np = cJSON_GetArraySize(cJSON_GetObjectItem(b, "params"));
        max_m = nm > max_m ? nm : max_m, max_p = np > max_p ? np : max_p;
        cr_assert_leq(nm + np, 1000);
        cr_assert_leq(cJSON_GetObjectItem(r, "raw_len")->valueint, 1000000);
        batches++;
    }
    cr_assert_eq(max_m, 1000, "the largest request had %d metrics", max_m);
    cr_assert_eq(max_p, 100, "the largest request had %d params", max_p);
    const cJSON *data = cJSON_GetObjectItem(cmt_only_run(st), "data");
    /* 2 batches x (2500 flood + the trainer's) metrics, 250 + 9 params */
    const int n_metrics = cJSON_GetArraySize(cJSON_GetObjectItem(data, "metrics"));
    cr_assert_geq(n_metrics, 5000);
    cr_assert_eq(stats_of(&g, 0).metrics_sent, n_metrics);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(data, "params")), 250 + 9);
    cr_assert_str_eq(cmt_json_str(cJSON_GetObjectItem(data, "params"), "flood/m0003"), "1.5");
    cr_assert_geq(batches, 6 + 3);
    cJSON_Delete(st);
    cmt_track_rig_free(&g);
    free(f.names);
}

/* ---- faults ---- */

Test(mlflow_logger, retries_429_5xx_and_timeouts_then_everything_arrives) {
    cmt_server_faults(&srv, "[{\"path\": \"runs/log-batch\", \"status\": 503, \"count\": 2},"
                            " {\"path\": \"runs/log-batch\", \"status\": 429, \"retry_after\": 0, \"count\": 1},"
                            " {\"path\": \"runs/log-batch\", \"delay\": 1.5, \"status\": 500, \"count\": 1},"
                            " {\"path\": \"runs/create\", \"status\": 502, \"count\": 1}]");
    cm_mlflow_logger_config c = quick();
    c.request_timeout = 0.5; /* the delayed request times out */
    c.max_retries = 6;
    cm_in_memory_logger *mem;
    cm_logger_plugin p = make(&c);
    cmt_track_rig g = cmt_track_rig_make(&(cmt_fit_opts){.mem = &mem, .max_duration = "1ep"}, &p, 1);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK);
    cr_assert_eq(cm_trainer_close(g.tr), CM_OK);
    const cm_tracker_stats s = stats_of(&g, 1);
    cJSON *st = cmt_server_state(&srv);
    cmt_assert_no_violations(st);
    const cJSON *run = cmt_only_run(st);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetObjectItem(run, "data"), "metrics")),
                 cm_in_memory_logger_n(mem));
    cr_assert_str_eq(cmt_json_str(cJSON_GetObjectItem(run, "info"), "status"), "FINISHED");
    cr_assert_eq(s.retries, 5, "retries: %lld", (long long)s.retries);
    cr_assert_eq(s.reports, 0, "a fault the retries absorbed is not reported: %s", s.last_error);
    cr_assert(!s.down);
    cJSON_Delete(st);
    cmt_track_rig_free(&g);
}

Test(mlflow_logger, a_server_that_stays_down_is_reported_once_and_never_stalls_training) {
    cmt_server_faults(&srv, "[{\"path\": \"*\", \"status\": 503, \"count\": 100000}]");
    cm_mlflow_logger_config c = quick();
    c.max_retries = 2;
    c.backoff_factor = 0.2; /* each failed round takes 0.2 + 0.4 s: longer than the fit */
    c.close_timeout = 1.0;
    cm_in_memory_logger *mem;
    cm_logger_plugin p = make(&c);
    cmt_track_rig g = cmt_track_rig_make(&(cmt_fit_opts){.mem = &mem, .max_duration = "2ep"}, &p, 1);
    cmt_stderr_begin();
    const double t0 = cmi_unix_time();
    cm_status fs = cm_trainer_fit(g.tr, NULL);
    const double t_fit = cmi_unix_time() - t0;
    cm_status cs = cm_trainer_close(g.tr);
    const double t_close = cmi_unix_time() - t0 - t_fit;
    char *err = cmt_stderr_end();
    cr_assert_eq(fs, CM_OK, "the fit failed: %s", cm_last_error());
    cr_assert_eq(cs, CM_OK, "closing failed: %s", cm_last_error());
    cr_assert_lt(t_close, c.close_timeout + 1.5, "the close took %.2f s (close_timeout %.1f)", t_close, c.close_timeout);
    const cm_tracker_stats s = stats_of(&g, 1);
    cr_assert_eq(cmt_count(err, "MLFlowLogger:"), 2, "want the down report and the end summary:\n%s", err);
    cr_assert(strstr(err, "did not take") && strstr(err, "HTTP 503") && strstr(err, "training goes on"), "%s", err);
    cr_assert(strstr(err, "could not be sent"), "%s", err);
    cr_assert_eq(s.reports, 2);
    cr_assert_eq(s.metrics_sent, 0);
    cr_assert_eq(s.metrics_dropped, cm_in_memory_logger_n(mem), "dropped %lld of %lld", (long long)s.metrics_dropped,
                 (long long)cm_in_memory_logger_n(mem));
    cr_assert(s.down && !s.finished);
    cr_assert(!s.run_id[0]);
    free(err);
    cmt_track_rig_free(&g);
}

/* Every request takes 5 s: the fit does not wait for any of them, and the close gives up on the
 * one in flight at close_timeout. */
Test(mlflow_logger, a_slow_server_never_stalls_a_training_step) {
    cmt_server_faults(&srv, "[{\"path\": \"*\", \"delay\": 5.0, \"count\": 100000}]");
    cm_mlflow_logger_config c = quick();
    c.request_timeout = 30;
    c.close_timeout = 1.0;
    cm_logger_plugin p = make(&c);
    cmt_track_rig g = cmt_track_rig_make(&(cmt_fit_opts){.max_duration = "2ep"}, &p, 1);
    cmt_stderr_begin();
    const double t0 = cmi_unix_time();
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK);
    const double t_fit = cmi_unix_time() - t0;
    cr_assert_eq(cm_trainer_close(g.tr), CM_OK);
    const double t_close = cmi_unix_time() - t0 - t_fit;
    char *err = cmt_stderr_end();
    cr_assert_lt(t_fit, 3.5, "the fit took %.2f s with a server answering in 5 s", t_fit);
    cr_assert_lt(t_close, 3.0, "the close took %.2f s with close_timeout 1 s", t_close);
    const cm_tracker_stats s = stats_of(&g, 0);
    cr_assert_eq(s.metrics_sent, 0);
    cr_assert_gt(s.metrics_dropped, 0);
    cr_assert(strstr(err, "cut off at the deadline"), "%s", err);
    free(err);
    cmt_track_rig_free(&g);
}

/* Driving the plugin by hand, to control time: the server fails the first requests, the logger
 * reports it once, keeps the values, and sends them all once it answers. */
Test(mlflow_logger, a_server_that_comes_back_gets_everything_that_was_kept) {
    /* down for the first two requests (the experiment lookup), then the first log-batch (the
     * params) goes through and the next two (metrics) fail */
    cmt_server_faults(&srv, "[{\"path\": \"*\", \"status\": 503, \"count\": 2},"
                            " {\"path\": \"runs/log-batch\", \"after\": 1, \"status\": 503, \"count\": 2}]");
    cm_mlflow_logger_config c = quick();
    c.max_retries = 0;
    cm_logger_plugin p = make(&c);
    cm_state *st0;
    cr_assert_eq(cm_state_new(&st0), CM_OK);
    cmt_stderr_begin();
    cr_assert_eq(p.vt->init(p.self, st0), CM_OK, "%s", cm_last_error());
    cm_hparam h = {"lr", CM_HPARAM_NUMBER, 0.5, NULL};
    cr_assert_eq(p.vt->log_hyperparameters(p.self, &h, 1), CM_OK);
    cm_timestamp ts = {0};
    for (int b = 0; b < 50; b++) {
        ts.batch = b;
        cm_metric_value v[2] = {{"loss/train/total", 1.0 / (b + 1)}, {"lr", 1e-3}};
        cr_assert_eq(p.vt->log_metrics(p.self, v, 2, &ts), CM_OK);
        usleep(10000);
    }
    cm_tracker_stats s;
    for (int i = 0; i < 300; i++) { /* up to 3 s for the rounds to catch up */
        cm_mlflow_logger_stats(&p, &s);
        if (s.metrics_sent == 100) break;
        usleep(10000);
    }
    cr_assert_eq(p.vt->close(p.self, st0), CM_OK);
    char *err = cmt_stderr_end();
    cm_mlflow_logger_stats(&p, &s);
    cr_assert_eq(s.metrics_sent, 100, "sent %lld of 100", (long long)s.metrics_sent);
    cr_assert_eq(s.metrics_dropped, 0);
    cr_assert_eq(s.reports, 1, "%s", err);
    cr_assert_eq(cmt_count(err, "[composer warn] MLFlowLogger:"), 1, "%s", err);
    cr_assert(s.finished && !s.down);
    cJSON *st = cmt_server_state(&srv);
    cmt_assert_no_violations(st);
    const cJSON *ms = cJSON_GetObjectItem(cJSON_GetObjectItem(cmt_only_run(st), "data"), "metrics");
    cr_assert_eq(cJSON_GetArraySize(ms), 100);
    for (int i = 0; i < 100; i++)
        cr_assert_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(ms, i), "step")->valueint, i / 2, "values out of order");
    const cJSON *params = cJSON_GetObjectItem(cJSON_GetObjectItem(cmt_only_run(st), "data"), "params");
    cr_assert_str_eq(cmt_json_str(params, "lr"), "0.5");
    /* the log-batch faults happened: two refused metric requests */
    int failed_batches = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(st, "requests")) {
        if (!strcmp(cmt_json_str(r, "endpoint"), "runs/log-batch") && cJSON_IsObject(cJSON_GetObjectItem(r, "fault")))
            failed_batches++;
    }
    cr_assert_eq(failed_batches, 2);
    cJSON_Delete(st);
    free(err);
    p.vt->free(p.self);
    cm_state_free(st0);
}

Test(mlflow_logger, a_refused_batch_is_reported_once_and_the_rest_is_sent) {
    cmt_server_faults(&srv, "[{\"path\": \"runs/log-batch\", \"status\": 400, \"count\": 1}]");
    cm_mlflow_logger_config c = quick();
    cm_logger_plugin p = make(&c);
    cm_state *st0;
    cr_assert_eq(cm_state_new(&st0), CM_OK);
    cmt_stderr_begin();
    cr_assert_eq(p.vt->init(p.self, st0), CM_OK);
    cm_timestamp ts = {0};
    cm_metric_value v = {"x", 1.0};
    cr_assert_eq(p.vt->log_metrics(p.self, &v, 1, &ts), CM_OK); /* the first batch: refused */
    cm_tracker_stats s;
    for (int i = 0; i < 300 && (cm_mlflow_logger_stats(&p, &s), s.metrics_dropped == 0); i++) usleep(10000);
    ts.batch = 1;
    v.value = 2.0;
    cr_assert_eq(p.vt->log_metrics(p.self, &v, 1, &ts), CM_OK);
    cr_assert_eq(p.vt->close(p.self, st0), CM_OK);
    char *err = cmt_stderr_end();
    cm_mlflow_logger_stats(&p, &s);
    cr_assert_eq(s.metrics_dropped, 1);
    cr_assert_eq(s.metrics_sent, 1);
    cr_assert_eq(s.reports, 2, "the refusal and the end summary:\n%s", err);
    cr_assert(strstr(err, "refused POST runs/log-batch") && strstr(err, "HTTP 400"), "%s", err);
    cr_assert(strstr(err, "1 metric value could not be sent"), "%s", err);
    cr_assert(s.finished);
    free(err);
    p.vt->free(p.self);
    cm_state_free(st0);
}

/* A fit that fails at batch 3: the run is marked FAILED. */
static cm_status fail_at_3(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    (void)self, (void)lg;
    if (ev == CM_EVENT_BATCH_END && cm_state_timestamp(st)->batch == 3)
        return cm_set_error(CM_ERR_INTERNAL, "injected failure");
    return CM_OK;
}
static const cm_callback_i fail_vt = {.abi = CM_CALLBACK_ABI, .name = "FailAt3", .run_event = fail_at_3};

Test(mlflow_logger, a_failed_fit_marks_the_run_failed) {
    cm_callback_plugin cb = {&fail_vt, NULL};
    cm_mlflow_logger_config c = quick();
    cm_logger_plugin p = make(&c);
    cmt_track_rig g = cmt_track_rig_make(&(cmt_fit_opts){.callbacks = &cb, .n_callbacks = 1}, &p, 1);
    cr_assert_neq(cm_trainer_fit(g.tr, NULL), CM_OK);
    cmt_track_rig_free(&g); /* the CLI frees without closing after a failed fit */
    cJSON *st = cmt_server_state(&srv);
    cmt_assert_no_violations(st);
    cr_assert_str_eq(cmt_json_str(cJSON_GetObjectItem(cmt_only_run(st), "info"), "status"), "FAILED");
    cJSON_Delete(st);
}

/* ---- Composer's options ---- */

Test(mlflow_logger, rename_ignore_and_invalid_names) {
    cm_mlflow_logger_config c = quick();
    const char *ren[] = {"bad=name", "good_name"};
    const char *ign[] = {"metrics/eval/*"};
    const char *ign_h[] = {"seed", "num_*"};
    c.rename_metrics = ren, c.n_rename = 1;
    c.ignore_metrics = ign, c.n_ignore_metrics = 1;
    c.ignore_hyperparameters = ign_h, c.n_ignore_hyperparameters = 2;
    cm_logger_plugin p = make(&c);
    cm_state *st0;
    cr_assert_eq(cm_state_new(&st0), CM_OK);
    cmt_stderr_begin();
    cr_assert_eq(p.vt->init(p.self, st0), CM_OK);
    cm_hparam h[] = {{"seed", CM_HPARAM_NUMBER, 7, NULL},
                     {"num_threads", CM_HPARAM_NUMBER, 2, NULL},
                     {"lr", CM_HPARAM_NUMBER, 3e-4, NULL},
                     {"amp", CM_HPARAM_BOOL, 1, NULL},
                     {"bad key!", CM_HPARAM_STRING, 0, "x"}};
    cr_assert_eq(p.vt->log_hyperparameters(p.self, h, 5), CM_OK);
    cm_timestamp ts = {.batch = 4};
    cm_metric_value v[] = {{"bad=name", 1}, {"a//b", 2}, {"metrics/eval/Accuracy", 3}, {"ok/x y-z.w_1", NAN},
                           {"inf", INFINITY}};
    cr_assert_eq(p.vt->log_metrics(p.self, v, 5, &ts), CM_OK);
    cr_assert_eq(p.vt->close(p.self, st0), CM_OK);
    char *err = cmt_stderr_end();
    cr_assert(strstr(err, "metric 'a//b' is not sent: it has '//'"), "%s", err);
    cr_assert(strstr(err, "hyperparameter 'bad key!' is not sent"), "%s", err);
    cJSON *st = cmt_server_state(&srv);
    cmt_assert_no_violations(st);
    const cJSON *data = cJSON_GetObjectItem(cmt_only_run(st), "data");
    const cJSON *ms = cJSON_GetObjectItem(data, "metrics");
    cr_assert_eq(cJSON_GetArraySize(ms), 3);
    cr_assert_str_eq(cmt_json_str(cJSON_GetArrayItem(ms, 0), "key"), "good_name");
    cr_assert_str_eq(cmt_json_str(cJSON_GetArrayItem(ms, 1), "key"), "ok/x y-z.w_1");
    cr_assert_str_eq(cmt_json_str(cJSON_GetArrayItem(ms, 1), "value_json"), "NaN", "NaN goes as the string \"NaN\"");
    cr_assert_str_eq(cmt_json_str(cJSON_GetArrayItem(ms, 2), "value_json"), "Infinity");
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(ms, 0), "step")->valueint, 4);
    const cJSON *params = cJSON_GetObjectItem(data, "params");
    cr_assert_eq(cJSON_GetArraySize(params), 2);
    cr_assert_str_eq(cmt_json_str(params, "lr"), "0.0003");
    cr_assert_str_eq(cmt_json_str(params, "amp"), "True");
    cJSON_Delete(st);
    free(err);
    p.vt->free(p.self);
    cm_state_free(st0);
}

Test(mlflow_logger, duplicate_values_are_sent_every_n_steps_as_composer_does) {
    cm_mlflow_logger_config c = quick();
    c.log_duplicated_metric_every_n_steps = 3;
    cm_logger_plugin p = make(&c);
    cm_state *st0;
    cr_assert_eq(cm_state_new(&st0), CM_OK);
    cr_assert_eq(p.vt->init(p.self, st0), CM_OK);
    cm_timestamp ts = {0};
    for (int b = 0; b < 10; b++) {
        ts.batch = b;
        cm_metric_value v[] = {{"const", 5.0}, {"changing", b == 4 ? 1.0 : 0.0}};
        cr_assert_eq(p.vt->log_metrics(p.self, v, 2, &ts), CM_OK);
    }
    cr_assert_eq(p.vt->close(p.self, st0), CM_OK);
    cJSON *st = cmt_server_state(&srv);
    const cJSON *ms = cJSON_GetObjectItem(cJSON_GetObjectItem(cmt_only_run(st), "data"), "metrics");
    char got[2][64] = {"", ""};
    const cJSON *m;
    cJSON_ArrayForEach(m, ms) {
        const int k = !strcmp(cmt_json_str(m, "key"), "const") ? 0 : 1;
        snprintf(got[k] + strlen(got[k]), 64 - strlen(got[k]), "%d ", cJSON_GetObjectItem(m, "step")->valueint);
    }
    cr_assert_str_eq(got[0], "0 3 6 9 ");
    cr_assert_str_eq(got[1], "0 3 4 5 8 ", "a changed value is sent at once; the same again after 3 steps");
    cJSON_Delete(st);
    p.vt->free(p.self);
    cm_state_free(st0);
}

Test(mlflow_logger, resume_reuses_the_run_tagged_with_the_run_name) {
    for (int k = 0; k < 2; k++) {
        cm_mlflow_logger_config c = quick();
        c.resume = k == 1;
        cm_logger_plugin p = make(&c);
        cmt_track_rig g = cmt_track_rig_make(&(cmt_fit_opts){.run_name = "resumable", .max_duration = "2ba", .no_eval = true},
                                 &p, 1);
        cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK);
        cmt_track_rig_free(&g);
    }
    cJSON *st = cmt_server_state(&srv);
    cmt_assert_no_violations(st);
    const cJSON *run = cmt_only_run(st);
    cr_assert_eq(count_requests(st, "runs/search"), 1);
    cr_assert_eq(count_requests(st, "runs/create"), 1);
    const cJSON *hist = cJSON_GetObjectItem(run, "status_history");
    char *h = cJSON_PrintUnformatted(hist);
    cr_assert_str_eq(h, "[\"RUNNING\",\"FINISHED\",\"RUNNING\",\"FINISHED\"]");
    free(h);
    cJSON_Delete(st);
}

Test(mlflow_logger, environment_variables_give_the_server_credentials_and_ids) {
    cJSON_Delete(cmt_server_call(&srv, "/_test/config", "{\"auth\": \"Bearer s3cret\"}"));
    setenv("MLFLOW_TRACKING_URI", srv.url, 1);
    setenv("MLFLOW_EXPERIMENT_NAME", "from-env", 1);
    setenv("MLFLOW_TRACKING_TOKEN", "s3cret", 1);
    cm_mlflow_logger_config c = quick();
    c.tracking_uri = NULL;
    cm_logger_plugin p = make(&c);
    cmt_track_rig g = cmt_track_rig_make(&(cmt_fit_opts){.run_name = "env1", .max_duration = "2ba", .no_eval = true}, &p, 1);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK);
    cr_assert_eq(cm_trainer_close(g.tr), CM_OK);
    cr_assert_eq(stats_of(&g, 0).reports, 0, "%s", stats_of(&g, 0).last_error);
    char run_id[sizeof ((cm_tracker_stats *)0)->run_id];
    snprintf(run_id, sizeof run_id, "%s", stats_of(&g, 0).run_id);
    cmt_track_rig_free(&g);
    /* Basic credentials, and a run and experiment given by id */
    unsetenv("MLFLOW_TRACKING_TOKEN");
    setenv("MLFLOW_TRACKING_USERNAME", "ann", 1);
    setenv("MLFLOW_TRACKING_PASSWORD", "pw:1", 1);
    cJSON_Delete(cmt_server_call(&srv, "/_test/config", "{\"auth\": \"Basic YW5uOnB3OjE=\"}"));
    setenv("MLFLOW_RUN_ID", run_id, 1);
    setenv("MLFLOW_EXPERIMENT_ID", "1", 1);
    p = make(&c);
    g = cmt_track_rig_make(&(cmt_fit_opts){.run_name = "env2", .max_duration = "2ba", .no_eval = true}, &p, 1);
    cmt_stderr_begin();
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK);
    cr_assert_eq(cm_trainer_close(g.tr), CM_OK);
    char *err = cmt_stderr_end();
    /* the run keeps its first params: the changed run_name is left out with a warning, the rest
     * of the request goes through */
    cr_assert_eq(stats_of(&g, 0).reports, 1, "%s", err);
    cr_assert(strstr(err, "hyperparameter 'run_name' changed from 'env1' to 'env2'"), "%s", err);
    cr_assert_eq(stats_of(&g, 0).failed_requests, 0, "%s", err);
    free(err);
    cmt_track_rig_free(&g);
    cJSON *st = cmt_server_state(&srv);
    cmt_assert_no_violations(st);
    cr_assert_str_eq(cmt_json_str(cJSON_GetObjectItem(st, "experiments")->child, "name"), "from-env");
    cr_assert_eq(count_requests(st, "experiments/get-by-name"), 1, "MLFLOW_EXPERIMENT_ID skips the lookup");
    cr_assert_eq(count_requests(st, "runs/create"), 1, "MLFLOW_RUN_ID reuses the run");
    const cJSON *run = cmt_only_run(st);
    cr_assert_str_eq(cmt_json_str(cJSON_GetObjectItem(cJSON_GetObjectItem(run, "data"), "tags"), "run_name"), "env2");
    cr_assert_str_eq(cmt_json_str(cJSON_GetObjectItem(cJSON_GetObjectItem(run, "data"), "params"), "run_name"), "env1");
    cJSON_Delete(st);
}

Test(mlflow_logger, wrong_credentials_are_reported_once_and_nothing_is_retried) {
    cJSON_Delete(cmt_server_call(&srv, "/_test/config", "{\"auth\": \"Bearer right\"}"));
    setenv("MLFLOW_TRACKING_TOKEN", "wrong", 1);
    cm_mlflow_logger_config c = quick();
    cm_logger_plugin p = make(&c);
    cmt_track_rig g = cmt_track_rig_make(&(cmt_fit_opts){.max_duration = "1ep"}, &p, 1);
    cmt_stderr_begin();
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK);
    cr_assert_eq(cm_trainer_close(g.tr), CM_OK);
    char *err = cmt_stderr_end();
    const cm_tracker_stats s = stats_of(&g, 0);
    cr_assert_eq(s.reports, 2, "the refusal, and the values not sent:\n%s", err);
    cr_assert(strstr(err, "HTTP 401"), "%s", err);
    cr_assert_eq(s.retries, 0);
    cJSON *st = cmt_server_state(&srv);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(st, "requests")), 1, "a refused credential is not retried");
    cJSON_Delete(st);
    free(err);
    cmt_track_rig_free(&g);
}

Test(mlflow_logger, only_rank_zero_logs_unless_asked) {
    cm_mlflow_logger_config c = quick();
    cm_logger_plugin p = make(&c);
    cmt_track_rig g = cmt_track_rig_make(&(cmt_fit_opts){.run_name = "rr", .max_duration = "2ba", .no_eval = true, .rank = 1,
                                             .world_size = 2},
                             &p, 1);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK);
    cmt_track_rig_free(&g);
    cJSON *st = cmt_server_state(&srv);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(st, "requests")), 0);
    cJSON_Delete(st);
    c.rank_zero_only = false;
    p = make(&c);
    g = cmt_track_rig_make(&(cmt_fit_opts){.run_name = "rr", .max_duration = "2ba", .no_eval = true, .rank = 1,
                                     .world_size = 2},
                     &p, 1);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK);
    cmt_track_rig_free(&g);
    st = cmt_server_state(&srv);
    cmt_assert_no_violations(st);
    cr_assert_str_eq(cmt_json_str(cJSON_GetObjectItem(cmt_only_run(st), "info"), "run_name"), "rr-rank1");
    cJSON_Delete(st);
}

Test(mlflow_logger, rejects_bad_configurations) {
    cm_logger_plugin p;
    cm_mlflow_logger_config c = cm_mlflow_logger_config_default();
    unsetenv("MLFLOW_TRACKING_URI");
    cr_assert_eq(cm_mlflow_logger_new(&c, &p), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "MLFLOW_TRACKING_URI"), "%s", cm_last_error());
    c.tracking_uri = "file:///tmp/mlruns";
    cr_assert_eq(cm_mlflow_logger_new(&c, &p), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "not an http(s) URL"), "%s", cm_last_error());
    c.tracking_uri = "databricks";
    unsetenv("DATABRICKS_HOST");
    cr_assert_eq(cm_mlflow_logger_new(&c, &p), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "DATABRICKS_HOST"), "%s", cm_last_error());
    c = quick();
    const char *bad_tags[] = {"a=b", "x"};
    c.tags = bad_tags, c.n_tags = 1;
    cr_assert_eq(cm_mlflow_logger_new(&c, &p), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "'a=b'"), "%s", cm_last_error());
    c = quick();
    c.flush_interval = 0;
    cr_assert_eq(cm_mlflow_logger_new(&c, &p), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "flush_interval"), "%s", cm_last_error());
    c = quick();
    c.experiment_name = "";
    cr_assert_eq(cm_mlflow_logger_new(&c, &p), CM_ERR_INVALID_ARG);
    c = quick();
    setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "many", 1);
    c.max_retries = -1;
    cr_assert_eq(cm_mlflow_logger_new(&c, &p), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "MLFLOW_HTTP_REQUEST_MAX_RETRIES='many'"), "%s", cm_last_error());
}
