/* WandBLogger online against a local W&B test server (tests/trackers/wandb_server.py) that
 * implements the client's UpsertBucket mutation and the file_stream endpoint and checks every
 * request (the mutation's text and variable types, the config's {"value": v} form, history
 * offsets without gaps, increasing _step, the summary, complete/exitcode, the API key); offline,
 * the run folder's transaction log read back by tests/trackers/wandb_read.py (wandb's datastore.py
 * framing and the Record protos with python3-protobuf). Whole fits are compared with an
 * InMemoryLogger: one history row per step holding that step's values, the summary's latest
 * values, the config; plus retries, a server that is down or comes back, failed fits, steps that
 * go back, the WANDB_* variables and bad settings. */
#include "cmtest.h"
#include "cmtrack.h"
#include "cmtrain.h"

#include "plugins/loggers/wb_store.h"
#include "plugins/loggers/wire.h"

#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static cmt_server srv;

static void start(void) {
    srv = cmt_server_start("wandb_server.py");
    setenv("WANDB_API_KEY", "test-key", 1);
    setenv("WANDB_BASE_URL", srv.url, 1);
    const char *clear[] = {"WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_NAME", "WANDB_RUN_GROUP",
                           "WANDB_TAGS", "WANDB_NOTES", "WANDB_JOB_TYPE", "WANDB_RUN_ID", "WANDB_DIR"};
    for (size_t i = 0; i < sizeof clear / sizeof *clear; i++) unsetenv(clear[i]);
}
static void stop(void) { cmt_server_stop(&srv); }

TestSuite(wandb_logger, .init = start, .fini = stop);

static cm_wandb_logger_config quick(void) {
    cm_wandb_logger_config c = cm_wandb_logger_config_default();
    c.flush_interval = 0.05;
    c.max_retries = 3;
    c.backoff_s = 0.01;
    c.request_timeout = 5;
    c.close_timeout = 10;
    return c;
}

static cm_logger_plugin make(const cm_wandb_logger_config *c) {
    cm_logger_plugin p;
    cr_assert_eq(cm_wandb_logger_new(c, &p), CM_OK, "%s", cm_last_error());
    return p;
}

static double num_of(const cJSON *v) {
    if (cJSON_IsNumber(v)) return v->valuedouble;
    cr_assert(cJSON_IsString(v), "not a number");
    return !strcmp(v->valuestring, "NaN") ? NAN : !strcmp(v->valuestring, "Infinity") ? INFINITY : -INFINITY;
}

static cm_tracker_stats stats_of(const cmt_track_rig *g, int index) {
    const cm_logger_plugin p = cm_engine_logger_plugin(cm_trainer_engine(g->tr), index);
    cm_tracker_stats s;
    cr_assert_eq(cm_wandb_logger_stats(&p, &s), CM_OK);
    return s;
}

/* Checks rows (JSON objects with _step, in order) against the InMemoryLogger: one row per step
 * that had values, holding the latest value of each name logged at that step. `items` names the
 * member holding the values when the rows are wrapped (offline), NULL when the row is the object. */
static void check_rows(const cm_in_memory_logger *mem, const cJSON *rows, const char *items) {
    const int64_t n = cm_in_memory_logger_n(mem);
    int r = 0;
    for (int64_t i = 0; i < n;) {
        const int64_t step = cm_in_memory_logger_record(mem, i)->batch;
        const cJSON *row = cJSON_GetArrayItem(rows, r);
        cr_assert_not_null(row, "no row for step %lld (rows: %d)", (long long)step, cJSON_GetArraySize(rows));
        const cJSON *vals = items ? cJSON_GetObjectItem(row, items) : row;
        cr_assert_eq(num_of(cJSON_GetObjectItem(vals, "_step")), (double)step, "row %d", r);
        int names = 0;
        int64_t j = i;
        for (; j < n && cm_in_memory_logger_record(mem, j)->batch == step; j++) {
            const cm_log_record *rec = cm_in_memory_logger_record(mem, j);
            /* the latest value of that name at this step */
            int64_t k = j + 1;
            while (k < n && cm_in_memory_logger_record(mem, k)->batch == step &&
                   strcmp(cm_in_memory_logger_record(mem, k)->name, rec->name))
                k++;
            if (k < n && cm_in_memory_logger_record(mem, k)->batch == step) continue; /* logged again later */
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(vals, rec->name);
            cr_assert_not_null(v, "step %lld: no %s in the row", (long long)step, rec->name);
            const double got = num_of(v);
            cr_assert(got == rec->value || (isnan(got) && isnan(rec->value)), "step %lld %s: %.17g != %.17g",
                      (long long)step, rec->name, got, rec->value);
            names++;
        }
        int keys = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, vals) keys += x->string[0] != '_';
        cr_assert_eq(keys, names, "step %lld: the row has %d names, %d were logged", (long long)step, keys, names);
        for (const char *f = "_runtime"; f; f = strcmp(f, "_runtime") ? NULL : "_timestamp")
            cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(vals, f)), "step %lld: no %s", (long long)step, f);
        i = j;
        r++;
    }
    cr_assert_eq(cJSON_GetArraySize(rows), r, "%d rows, %d steps logged", cJSON_GetArraySize(rows), r);
}

/* ---- online ---- */

Test(wandb_logger, an_online_fit_upserts_the_run_and_streams_every_row) {
    cm_wandb_logger_config c = quick();
    c.project = "proj";
    c.group = "g1";
    const char *tags[] = {"a", "b c"};
    c.tags = tags, c.n_tags = 2;
    c.notes = "a test";
    cm_in_memory_logger *mem;
    cm_logger_plugin p = make(&c);
    cmt_track_rig g = cmt_track_rig_make(&(cmt_fit_opts){.run_name = "wb-run", .mem = &mem}, &p, 1);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_close(g.tr), CM_OK, "%s", cm_last_error());
    const cm_tracker_stats s = stats_of(&g, 1);
    cJSON *st = cmt_server_state(&srv);
    cmt_assert_no_violations(st);
    const cJSON *run = cmt_only_run(st);
    char key[256];
    snprintf(key, sizeof key, "test-entity/proj/%s", s.run_id);
    cr_assert_str_eq(run->string, key, "the run is under the viewer's entity, the project and the run id");
    regex_t re;
    regcomp(&re, "^[a-z0-9]{8}$", REG_EXTENDED | REG_NOSUB);
    cr_assert_eq(regexec(&re, s.run_id, 0, NULL, 0), 0, "run id '%s' is not 8 of [a-z0-9]", s.run_id);
    regfree(&re);
    cr_assert_str_eq(cmt_json_str(run, "displayName"), "wb-run");
    cr_assert_str_eq(cmt_json_str(run, "groupName"), "g1");
    cr_assert_str_eq(cmt_json_str(run, "notes"), "a test");
    cmt_assert_json(cJSON_GetObjectItem(run, "tags"), "[\"a\",\"b c\"]");
    cr_assert_not_null(cmt_json_str(run, "host"));
    /* the config: the trainer's hyperparameters as {"value": v} */
    const cJSON *cfg = cJSON_GetObjectItem(run, "config");
    cr_assert_str_eq(cmt_json_str(cJSON_GetObjectItem(cfg, "max_duration"), "value"), "2ep");
    cr_assert_str_eq(cmt_json_str(cJSON_GetObjectItem(cfg, "run_name"), "value"), "wb-run");
    cr_assert(cJSON_IsFalse(cJSON_GetObjectItem(cJSON_GetObjectItem(cfg, "deterministic_mode"), "value")));
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(cfg, "world_size"), "value")->valuedouble, 1);
    /* every row, the summary, the end */
    check_rows(mem, cJSON_GetObjectItem(run, "history"), NULL);
    const cJSON *sum = cJSON_GetObjectItem(run, "summary");
    double last;
    cr_assert_eq(cm_in_memory_logger_last(mem, "loss/train/total", &last), CM_OK);
    cr_assert_eq(num_of(cJSON_GetObjectItem(sum, "loss/train/total")), last);
    cr_assert_eq(num_of(cJSON_GetObjectItem(sum, "_step")),
                 (double)cm_in_memory_logger_record(mem, cm_in_memory_logger_n(mem) - 1)->batch);
    cr_assert(cJSON_IsObject(cJSON_GetObjectItem(sum, "_wandb")));
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(run, "complete")));
    cr_assert_eq(cJSON_GetObjectItem(run, "exitcode")->valueint, 0);
    cr_assert(s.finished && !s.down);
    cr_assert_eq(s.reports, 0, "%s", s.last_error);
    cr_assert_eq(s.metrics_sent, cJSON_GetArraySize(cJSON_GetObjectItem(run, "history")));
    cJSON_Delete(st);
    cmt_track_rig_free(&g);
}

Test(wandb_logger, retries_5xx_429_and_timeouts_then_everything_arrives) {
    cmt_server_faults(&srv, "[{\"path\": \"graphql\", \"status\": 503, \"count\": 2},"
                            " {\"path\": \"file_stream\", \"status\": 500, \"count\": 1},"
                            " {\"path\": \"file_stream\", \"status\": 429, \"retry_after\": 0, \"count\": 1},"
                            " {\"path\": \"file_stream\", \"delay\": 1.5, \"status\": 502, \"count\": 1}]");
    cm_wandb_logger_config c = quick();
    c.request_timeout = 0.5;
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
    check_rows(mem, cJSON_GetObjectItem(run, "history"), NULL);
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(run, "complete")));
    cr_assert_eq(s.retries, 5, "retries: %lld", (long long)s.retries);
    cr_assert_eq(s.reports, 0, "%s", s.last_error);
    cJSON_Delete(st);
    cmt_track_rig_free(&g);
}

Test(wandb_logger, a_server_that_stays_down_is_reported_once_and_training_goes_on) {
    cmt_server_faults(&srv, "[{\"path\": \"*\", \"status\": 503, \"count\": 100000}]");
    cm_wandb_logger_config c = quick();
    c.max_retries = 2;
    c.backoff_s = 0.2;
    c.close_timeout = 1;
    cm_logger_plugin p = make(&c);
    cmt_track_rig g = cmt_track_rig_make(&(cmt_fit_opts){.max_duration = "2ep"}, &p, 1);
    cmt_stderr_begin();
    const double t0 = cmi_unix_time();
    cm_status fs = cm_trainer_fit(g.tr, NULL);
    const double t_fit = cmi_unix_time() - t0;
    cm_status cs = cm_trainer_close(g.tr);
    const double t_close = cmi_unix_time() - t0 - t_fit;
    char *err = cmt_stderr_end();
    cr_assert_eq(fs, CM_OK);
    cr_assert_eq(cs, CM_OK);
    cr_assert_lt(t_close, 2.5, "the close took %.2f s", t_close);
    const cm_tracker_stats s = stats_of(&g, 0);
    cr_assert_eq(cmt_count(err, "WandBLogger:"), 2, "the down report and the end summary:\n%s", err);
    cr_assert(strstr(err, "did not take POST") && strstr(err, "HTTP 503") && strstr(err, "history rows could not be sent"),
              "%s", err);
    cr_assert_eq(s.metrics_sent, 0);
    cr_assert_gt(s.metrics_dropped, 10);
    cr_assert(!s.finished && s.down);
    free(err);
    cmt_track_rig_free(&g);
}

Test(wandb_logger, a_server_that_comes_back_gets_every_row_at_its_offset) {
    /* the run is created, then the first three file_stream requests fail */
    cmt_server_faults(&srv, "[{\"path\": \"file_stream\", \"status\": 503, \"count\": 3}]");
    cm_wandb_logger_config c = quick();
    c.max_retries = 0;
    cm_logger_plugin p = make(&c);
    cm_state *st0;
    cr_assert_eq(cm_state_new(&st0), CM_OK);
    cmt_stderr_begin();
    cr_assert_eq(p.vt->init(p.self, st0), CM_OK, "%s", cm_last_error());
    cm_timestamp ts = {0};
    for (int b = 0; b < 40; b++) {
        ts.batch = b;
        cm_metric_value v[2] = {{"loss", 1.0 / (b + 1)}, {"lr", b % 3 ? 1e-3 : NAN}};
        cr_assert_eq(p.vt->log_metrics(p.self, v, 2, &ts), CM_OK);
        usleep(15000);
    }
    cr_assert_eq(p.vt->close(p.self, st0), CM_OK);
    char *err = cmt_stderr_end();
    cm_tracker_stats s;
    cm_wandb_logger_stats(&p, &s);
    cJSON *st = cmt_server_state(&srv);
    cmt_assert_no_violations(st);
    const cJSON *hist = cJSON_GetObjectItem(cmt_only_run(st), "history");
    cr_assert_eq(cJSON_GetArraySize(hist), 40);
    for (int b = 0; b < 40; b++) {
        const cJSON *row = cJSON_GetArrayItem(hist, b);
        cr_assert_eq(cJSON_GetObjectItem(row, "_step")->valueint, b);
        cr_assert_eq(num_of(cJSON_GetObjectItem(row, "loss")), 1.0 / (b + 1));
        if (b % 3 == 0) cr_assert_str_eq(cmt_json_str(row, "lr"), "NaN", "NaN goes as NaN");
    }
    cr_assert_eq(s.reports, 1, "%s", err);
    cr_assert_eq(s.metrics_sent, 40);
    cr_assert(s.finished && !s.down);
    cJSON_Delete(st);
    free(err);
    p.vt->free(p.self);
    cm_state_free(st0);
}

static cm_status fail_at_3(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    (void)self, (void)lg;
    if (ev == CM_EVENT_BATCH_END && cm_state_timestamp(st)->batch == 3)
        return cm_set_error(CM_ERR_INTERNAL, "injected failure");
    return CM_OK;
}
static const cm_callback_i fail_vt = {.abi = CM_CALLBACK_ABI, .name = "FailAt3", .run_event = fail_at_3};

Test(wandb_logger, a_failed_fit_ends_the_run_with_exit_code_1) {
    cm_callback_plugin cb = {&fail_vt, NULL};
    cm_wandb_logger_config c = quick();
    cm_logger_plugin p = make(&c);
    cmt_track_rig g = cmt_track_rig_make(&(cmt_fit_opts){.callbacks = &cb, .n_callbacks = 1}, &p, 1);
    cr_assert_neq(cm_trainer_fit(g.tr, NULL), CM_OK);
    cmt_track_rig_free(&g);
    cJSON *st = cmt_server_state(&srv);
    cmt_assert_no_violations(st);
    const cJSON *run = cmt_only_run(st);
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(run, "complete")));
    cr_assert_eq(cJSON_GetObjectItem(run, "exitcode")->valueint, 1);
    cJSON_Delete(st);
}

Test(wandb_logger, a_wrong_api_key_is_reported_once_and_not_retried) {
    setenv("WANDB_API_KEY", "wrong", 1);
    cm_wandb_logger_config c = quick();
    cm_logger_plugin p = make(&c);
    cmt_track_rig g = cmt_track_rig_make(&(cmt_fit_opts){.max_duration = "1ep"}, &p, 1);
    cmt_stderr_begin();
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK);
    cr_assert_eq(cm_trainer_close(g.tr), CM_OK);
    char *err = cmt_stderr_end();
    const cm_tracker_stats s = stats_of(&g, 0);
    cr_assert(strstr(err, "refused POST") && strstr(err, "HTTP 401"), "%s", err);
    cr_assert_eq(s.retries, 0);
    cJSON *st = cmt_server_state(&srv);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(st, "requests")), 1);
    cJSON_Delete(st);
    free(err);
    cmt_track_rig_free(&g);
}

Test(wandb_logger, values_at_a_lower_step_are_dropped_with_one_warning) {
    cm_wandb_logger_config c = quick();
    cm_logger_plugin p = make(&c);
    cm_state *st0;
    cr_assert_eq(cm_state_new(&st0), CM_OK);
    cmt_stderr_begin();
    cr_assert_eq(p.vt->init(p.self, st0), CM_OK);
    const int64_t steps[] = {0, 0, 2, 1, 1, 5, 5, 5, 3};
    for (int i = 0; i < 9; i++) {
        cm_timestamp ts = {.batch = steps[i]};
        cm_metric_value v = {i % 2 ? "a" : "b", (double)i};
        cr_assert_eq(p.vt->log_metrics(p.self, &v, 1, &ts), CM_OK);
    }
    cr_assert_eq(p.vt->close(p.self, st0), CM_OK);
    char *err = cmt_stderr_end();
    cr_assert_eq(cmt_count(err, "below the current step"), 1, "%s", err);
    cJSON *st = cmt_server_state(&srv);
    cmt_assert_no_violations(st);
    const cJSON *hist = cJSON_GetObjectItem(cmt_only_run(st), "history");
    char *h = cJSON_PrintUnformatted(hist);
    /* rows 0 (b=0, a=1), 2 (b=2), 5 (a=5 then 7: the latest, b=6) */
    cr_assert_eq(cJSON_GetArraySize(hist), 3, "%s", h);
    cr_assert_eq(num_of(cJSON_GetObjectItem(cJSON_GetArrayItem(hist, 0), "a")), 1);
    cr_assert_eq(num_of(cJSON_GetObjectItem(cJSON_GetArrayItem(hist, 2), "b")), 6);
    cr_assert_eq(num_of(cJSON_GetObjectItem(cJSON_GetArrayItem(hist, 2), "a")), 7);
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(hist, 2), "_step")->valueint, 5);
    free(h);
    cJSON_Delete(st);
    free(err);
    p.vt->free(p.self);
    cm_state_free(st0);
}

Test(wandb_logger, environment_variables_name_the_run) {
    setenv("WANDB_PROJECT", "envproj", 1);
    setenv("WANDB_ENTITY", "team-x", 1);
    setenv("WANDB_RUN_GROUP", "sweep-1", 1);
    setenv("WANDB_TAGS", "x, y ,z", 1);
    setenv("WANDB_RUN_ID", "my-run_1", 1);
    setenv("WANDB_NAME", "pretty", 1);
    cm_wandb_logger_config c = quick();
    cm_logger_plugin p = make(&c);
    cmt_track_rig g = cmt_track_rig_make(&(cmt_fit_opts){.max_duration = "2ba", .no_eval = true}, &p, 1);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK);
    cmt_track_rig_free(&g);
    cJSON *st = cmt_server_state(&srv);
    cmt_assert_no_violations(st);
    const cJSON *run = cmt_only_run(st);
    cr_assert_str_eq(run->string, "team-x/envproj/my-run_1");
    cr_assert_str_eq(cmt_json_str(run, "displayName"), "pretty");
    cr_assert_str_eq(cmt_json_str(run, "groupName"), "sweep-1");
    cmt_assert_json(cJSON_GetObjectItem(run, "tags"), "[\"x\",\"y\",\"z\"]");
    cJSON_Delete(st);
}

Test(wandb_logger, only_rank_zero_logs_unless_asked) {
    cm_wandb_logger_config c = quick();
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
    const cJSON *run = cmt_only_run(st);
    cr_assert_str_eq(cmt_json_str(run, "displayName"), "rr-rank1");
    cr_assert_str_eq(cmt_json_str(run, "groupName"), "rr", "Composer groups the ranks' runs under the name");
    cJSON_Delete(st);
}

/* ---- offline ---- */

static cJSON *read_run(const char *run_dir, const char *run_id) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/trackers/wandb_read.py '%s/run-%s.wandb'", run_dir, run_id);
    int rc;
    char *out = cmt_run(cmd, &rc);
    cr_assert_eq(rc, 0, "wandb_read.py failed on %s (its message is above)", run_dir);
    cJSON *j = cJSON_Parse(out);
    cr_assert_not_null(j, "wandb_read.py printed no JSON: %.200s", out);
    free(out);
    return j;
}

Test(wandb_logger, offline_writes_a_run_folder_with_the_clients_transaction_log) {
    cmt_tmpdir t = cmt_tmpdir_make("wb");
    cm_wandb_logger_config c = quick();
    c.mode = CM_WANDB_OFFLINE;
    c.dir = t.dir;
    c.project = "proj";
    const char *tags[] = {"off"};
    c.tags = tags, c.n_tags = 1;
    unsetenv("WANDB_API_KEY"); /* not needed offline */
    cm_in_memory_logger *mem;
    cm_logger_plugin p = make(&c);
    cmt_track_rig g = cmt_track_rig_make(&(cmt_fit_opts){.run_name = "off-run", .mem = &mem}, &p, 1);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_close(g.tr), CM_OK);
    const cm_logger_plugin held = cm_engine_logger_plugin(cm_trainer_engine(g.tr), 1);
    const cm_tracker_stats s = stats_of(&g, 1);
    char want[512];
    snprintf(want, sizeof want, "^%s/wandb/offline-run-[0-9]{8}_[0-9]{6}-%s$", t.dir, s.run_id);
    regex_t re;
    regcomp(&re, want, REG_EXTENDED | REG_NOSUB);
    const char *dir = cm_wandb_logger_run_dir(&held);
    cr_assert(dir && regexec(&re, dir, 0, NULL, 0) == 0, "run folder %s does not match %s", dir, want);
    regfree(&re);
    cJSON *recs = read_run(dir, s.run_id);
    const int n = cJSON_GetArraySize(recs);
    for (int i = 0; i < n; i++)
        cr_assert_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(recs, i), "num")->valueint, i + 1, "record numbers");
    cr_assert(cJSON_IsObject(cJSON_GetObjectItem(cJSON_GetArrayItem(recs, 0), "header")), "the first record is Header");
    const cJSON *run = cJSON_GetObjectItem(cJSON_GetArrayItem(recs, 1), "run");
    cr_assert_not_null(run, "the second record is Run");
    cr_assert_str_eq(cmt_json_str(run, "run_id"), s.run_id);
    cr_assert_str_eq(cmt_json_str(run, "display_name"), "off-run");
    cr_assert_str_eq(cmt_json_str(run, "project"), "proj");
    cmt_assert_json(cJSON_GetObjectItem(run, "tags"), "[\"off\"]");
    cr_assert(fabs(cJSON_GetObjectItem(run, "start_time")->valuedouble - cmi_unix_time()) < 600);
    /* config, history rows, then summary and exit */
    cJSON *rows = cJSON_CreateArray();
    const cJSON *config = NULL, *summary = NULL, *ex = NULL;
    for (int i = 2; i < n; i++) {
        const cJSON *r = cJSON_GetArrayItem(recs, i);
        if (cJSON_GetObjectItem(r, "config")) config = cJSON_GetObjectItem(r, "config");
        if (cJSON_GetObjectItem(r, "summary")) summary = cJSON_GetObjectItem(r, "summary");
        if (cJSON_GetObjectItem(r, "exit")) {
            ex = cJSON_GetObjectItem(r, "exit");
            cr_assert_eq(i, n - 1, "Exit is the last record");
        }
        const cJSON *h = cJSON_GetObjectItem(r, "history");
        if (h) {
            cr_assert_eq(cJSON_GetObjectItem(h, "step")->valuedouble,
                         num_of(cJSON_GetObjectItem(cJSON_GetObjectItem(h, "items"), "_step")));
            cJSON_AddItemReferenceToArray(rows, (cJSON *)h);
        }
    }
    check_rows(mem, rows, "items");
    cr_assert_not_null(config);
    cr_assert_str_eq(cmt_json_str(config, "max_duration"), "2ep");
    cr_assert_not_null(summary);
    double last;
    cm_in_memory_logger_last(mem, "loss/train/total", &last);
    cr_assert_eq(num_of(cJSON_GetObjectItem(summary, "loss/train/total")), last);
    cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(summary, "_wandb/runtime")));
    cr_assert_not_null(ex);
    cr_assert_eq(cJSON_GetObjectItem(ex, "exit_code")->valueint, 0);
    cr_assert(s.finished);
    cr_assert_eq(s.metrics_sent, cJSON_GetArraySize(rows));
    cJSON *st = cmt_server_state(&srv);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(st, "requests")), 0, "offline sends nothing");
    cJSON_Delete(st);
    cJSON_Delete(rows);
    cJSON_Delete(recs);
    cmt_track_rig_free(&g);
    cmt_tmpdir_remove(&t);
}

/* A Record{num, config{update{key "k", value_json "\"xx...\""}}} of exactly `want` bytes. */
static void sized_record(cmi_buf *b, int64_t num, size_t want) {
    for (size_t len = want > 40 ? want - 40 : 1;; len++) {
        cmi_buf_reset(b);
        cmi_pb_int64(b, 1, num);
        size_t c = cmi_pb_begin(b, 5), u = cmi_pb_begin(b, 1);
        cmi_pb_string(b, 1, "k");
        char *v = malloc(len + 3);
        v[0] = '"', memset(v + 1, 'x', len), v[len + 1] = '"', v[len + 2] = '\0';
        cmi_pb_string(b, 16, v);
        free(v);
        cmi_pb_end(b, u), cmi_pb_end(b, c);
        if (b->n == want) return;
        cr_assert_lt(b->n, want + 8, "cannot make a record of %zu bytes", want);
    }
}

/* The framing at the block edges: a record ending 3 bytes before a block's end (the next record
 * starts after 3 zero bytes), one spanning three blocks (FIRST, MIDDLE, LAST), one ending exactly
 * at a block's end, and an empty FIRST piece (a record that starts with exactly a header's room). */
Test(wandb_logger, the_transaction_log_framing_at_block_edges_reads_back) {
    cmt_tmpdir t = cmt_tmpdir_make("wb");
    char path[256];
    snprintf(path, sizeof path, "%s/run-edges.wandb", t.dir);
    cmi_wb_store st = {fopen(path, "wb"), 0, 0};
    cr_assert_not_null(st.f);
    cmi_wb_store_header(&st);
    cmi_buf b = {0};
    const int B = CMI_WB_BLOCK_LEN, H = CMI_WB_HEADER_LEN;
    size_t sizes[8];
    int k = 0;
    /* 1: ends 3 bytes before the end of block 0 */
    sizes[k] = (size_t)(B - 3 - H - H);
    sized_record(&b, k + 1, sizes[k]), cmi_wb_store_write(&st, b.p, b.n), k++;
    cr_assert_eq(st.index, B - 3);
    /* 2: after 3 zero bytes, at the start of block 1; 3: spans blocks 1 to 3 */
    sizes[k] = 100;
    sized_record(&b, k + 1, sizes[k]), cmi_wb_store_write(&st, b.p, b.n), k++;
    cr_assert_eq(st.index, B + H + 100, "no padding before record 2: index %lld", (long long)st.index);
    sizes[k] = 70000;
    sized_record(&b, k + 1, sizes[k]), cmi_wb_store_write(&st, b.p, b.n), k++;
    /* 4: fills the rest of its block exactly */
    const int64_t left = B - st.index % B;
    sizes[k] = (size_t)(left - H);
    sized_record(&b, k + 1, sizes[k]), cmi_wb_store_write(&st, b.p, b.n), k++;
    cr_assert_eq(st.index % B, 0);
    /* 5: leaves exactly a header's room; 6: an empty FIRST piece there, then LAST */
    sizes[k] = (size_t)(B - 2 * H);
    sized_record(&b, k + 1, sizes[k]), cmi_wb_store_write(&st, b.p, b.n), k++;
    cr_assert_eq(B - st.index % B, H);
    sizes[k] = 100;
    sized_record(&b, k + 1, sizes[k]), cmi_wb_store_write(&st, b.p, b.n), k++;
    cr_assert_eq(st.index % B, H + 100, "record 6: index %lld", (long long)st.index); /* LAST in a new block */
    /* 7: after its FIRST piece, 4 bytes more than a block holds are left: MIDDLE, then a LAST of 4 */
    sizes[k] = (size_t)((B - st.index % B - H) + (B - H + 4));
    sized_record(&b, k + 1, sizes[k]), cmi_wb_store_write(&st, b.p, b.n), k++;
    cr_assert_eq(st.index % B, H + 4, "record 7: index %lld", (long long)st.index);
    cmi_buf_free(&b);
    cr_assert_eq(st.err, 0);
    cr_assert_eq(fclose(st.f), 0);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/trackers/wandb_read.py '%s'", path);
    int rc;
    char *out = cmt_run(cmd, &rc);
    cr_assert_eq(rc, 0, "wandb_read.py failed (its message is above)");
    cJSON *recs = cJSON_Parse(out);
    free(out);
    cr_assert_eq(cJSON_GetArraySize(recs), k);
    for (int i = 0; i < k; i++) {
        const cJSON *r = cJSON_GetArrayItem(recs, i);
        cr_assert_eq(cJSON_GetObjectItem(r, "num")->valueint, i + 1);
        const char *v = cmt_json_str(cJSON_GetObjectItem(r, "config"), "k");
        cr_assert_not_null(v, "record %d has no config value", i + 1);
        cr_assert_gt(strlen(v), sizes[i] - 40, "record %d lost data", i + 1);
    }
    cJSON_Delete(recs);
    cmt_tmpdir_remove(&t);
}

/* Rows bigger than a 32 KiB block are split into FIRST / MIDDLE / LAST records. */
Test(wandb_logger, offline_rows_larger_than_a_block_are_split_and_read_back) {
    cmt_tmpdir t = cmt_tmpdir_make("wb");
    cm_wandb_logger_config c = quick();
    c.mode = CM_WANDB_OFFLINE;
    c.dir = t.dir;
    c.id = "bigrows";
    cm_logger_plugin p = make(&c);
    cm_state *st0;
    cr_assert_eq(cm_state_new(&st0), CM_OK);
    cr_assert_eq(p.vt->init(p.self, st0), CM_OK, "%s", cm_last_error());
    enum { N = 3000 };
    static char names[N][24];
    static cm_metric_value v[N];
    for (int b = 0; b < 5; b++) {
        for (int i = 0; i < N; i++) {
            snprintf(names[i], sizeof names[i], "layer%04d/grad_norm", i);
            v[i] = (cm_metric_value){names[i], i * 0.001 + b};
        }
        cm_timestamp ts = {.batch = b};
        cr_assert_eq(p.vt->log_metrics(p.self, v, b == 2 ? 7 : N, &ts), CM_OK);
    }
    cr_assert_eq(p.vt->close(p.self, st0), CM_OK);
    cJSON *recs = read_run(cm_wandb_logger_run_dir(&p), "bigrows");
    int rows = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, recs) {
        const cJSON *h = cJSON_GetObjectItem(r, "history");
        if (!h) continue;
        const int want = rows == 2 ? 7 : N;
        cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(h, "keys")), want + 3, "row %d", rows);
        cr_assert_eq(num_of(cJSON_GetObjectItem(cJSON_GetObjectItem(h, "items"), "layer0002/grad_norm")), 0.002 + rows);
        rows++;
    }
    cr_assert_eq(rows, 5);
    cJSON_Delete(recs);
    p.vt->free(p.self);
    cm_state_free(st0);
    cmt_tmpdir_remove(&t);
}

Test(wandb_logger, offline_from_the_environment_and_a_failed_fit) {
    cmt_tmpdir t = cmt_tmpdir_make("wb");
    setenv("WANDB_MODE", "offline", 1);
    setenv("WANDB_DIR", t.dir, 1);
    cm_callback_plugin cb = {&fail_vt, NULL};
    cm_wandb_logger_config c = quick();
    cm_logger_plugin p = make(&c);
    cmt_track_rig g = cmt_track_rig_make(&(cmt_fit_opts){.callbacks = &cb, .n_callbacks = 1}, &p, 1);
    const cm_logger_plugin held = cm_engine_logger_plugin(cm_trainer_engine(g.tr), 0);
    char dir[512];
    snprintf(dir, sizeof dir, "%s", cm_wandb_logger_run_dir(&held));
    cr_assert_eq(strncmp(dir, t.dir, strlen(t.dir)), 0, "%s is not under WANDB_DIR", dir);
    const cm_tracker_stats s = stats_of(&g, 0);
    cr_assert_neq(cm_trainer_fit(g.tr, NULL), CM_OK);
    cmt_track_rig_free(&g);
    cJSON *recs = read_run(dir, s.run_id);
    const cJSON *ex = cJSON_GetObjectItem(cJSON_GetArrayItem(recs, cJSON_GetArraySize(recs) - 1), "exit");
    cr_assert_not_null(ex);
    cr_assert_eq(cJSON_GetObjectItem(ex, "exit_code")->valueint, 1);
    cJSON_Delete(recs);
    cmt_tmpdir_remove(&t);
}

Test(wandb_logger, disabled_logs_nothing) {
    cm_wandb_logger_config c = quick();
    c.mode = CM_WANDB_DISABLED;
    cm_logger_plugin p = make(&c);
    cmt_track_rig g = cmt_track_rig_make(&(cmt_fit_opts){.max_duration = "2ba"}, &p, 1);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK);
    cmt_track_rig_free(&g);
    cJSON *st = cmt_server_state(&srv);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(st, "requests")), 0);
    cJSON_Delete(st);
}

Test(wandb_logger, rejects_bad_configurations) {
    cm_logger_plugin p;
    cm_wandb_logger_config c = quick();
    unsetenv("WANDB_API_KEY");
    cr_assert_eq(cm_wandb_logger_new(&c, &p), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "WANDB_API_KEY"), "%s", cm_last_error());
    setenv("WANDB_API_KEY", "k", 1);
    c.id = "a/b";
    cr_assert_eq(cm_wandb_logger_new(&c, &p), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "run id 'a/b'"), "%s", cm_last_error());
    c = quick();
    setenv("WANDB_MODE", "sometimes", 1);
    cr_assert_eq(cm_wandb_logger_new(&c, &p), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "WANDB_MODE='sometimes'"), "%s", cm_last_error());
    unsetenv("WANDB_MODE");
    setenv("WANDB_BASE_URL", "api.wandb.ai", 1);
    cr_assert_eq(cm_wandb_logger_new(&c, &p), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "WANDB_BASE_URL"), "%s", cm_last_error());
    setenv("WANDB_BASE_URL", srv.url, 1);
    c.flush_interval = 0;
    cr_assert_eq(cm_wandb_logger_new(&c, &p), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "flush_interval"), "%s", cm_last_error());
}
