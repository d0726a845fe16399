/* TensorBoardLogger: the event writer against FORMATS.md's byte-exact reference vector, and whole
 * fits whose event files are read back by an independent reader (tests/trackers/tb_read.py:
 * Python's own CRC-32C and Debian's python3-protobuf with the transcribed event protos) — every
 * record's framing and CRCs, then every scalar's tag, step and value against an InMemoryLogger of
 * the same fit, the hyperparameter text, and histograms against the model's final parameters and
 * gradients. Also: flushing every flush_interval batches, ranks, INIT and write errors. */
#include "cmtest.h"
#include "cmtrack.h"
#include "cmtrain.h"

#include "plugins/loggers/tb_events.h"
#include "plugins/loggers/wire.h"

#include <composer/nn.h>

#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#define VECTOR "../shared/data/vectors/events.out.tfevents.1700000000.example"

/* Runs the reader on an events file and returns its JSON (the test fails on any reader error). */
static cJSON *read_events(const char *path) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/trackers/tb_read.py '%s'", path);
    int rc;
    char *out = cmt_run(cmd, &rc);
    cr_assert_eq(rc, 0, "tb_read.py failed on %s (its message is above)", path);
    cJSON *j = cJSON_Parse(out);
    cr_assert_not_null(j, "tb_read.py printed no JSON: %.200s", out);
    free(out);
    cr_assert(cJSON_IsArray(j));
    return j;
}

static double num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    cr_assert(cJSON_IsNumber(v), "'%s' is missing or not a number", key);
    return v->valuedouble;
}

static const char *str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* ---- the writer ------------------------------------------------------------------------------- */

Test(tb_events, crc32c_check_value_and_mask) {
    cr_assert_eq(cmi_crc32c(0, "123456789", 9), 0xE3069283u, "crc32c(123456789) = %#x", cmi_crc32c(0, "123456789", 9));
    /* continuing a CRC over a split buffer gives the whole one */
    cr_assert_eq(cmi_crc32c(cmi_crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
    const uint32_t c = 0xE3069283u;
    cr_assert_eq(cmi_crc32c_masked("123456789", 9), ((c >> 15) | (c << 17)) + 0xA282EAD8u);
}

Test(tb_events, writer_matches_the_reference_vector_byte_for_byte) {
    size_t vlen;
    char *want = cmt_slurp(VECTOR, &vlen);
    cr_assert_not_null(want, "missing %s", VECTOR);
    cmt_tmpdir t = cmt_tmpdir_make("tb");
    char path[256];
    snprintf(path, sizeof path, "%s/events", t.dir);
    cmi_tb_writer *w;
    cr_assert_eq(cmi_tb_open(path, 1700000000.0, &w), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cmi_tb_scalar(w, "loss/train", 2.5f, 0, 1700000000.5), CM_OK);
    cr_assert_eq(cmi_tb_scalar(w, "loss/train", 1.25f, 1, 1700000001.5), CM_OK);
    cr_assert_eq(cmi_tb_close(w), CM_OK);
    size_t glen;
    char *got = cmt_slurp(path, &glen);
    /* the vector's first three records: file_version and the two classic scalars (FORMATS §6.2) */
    cr_assert_eq(glen, 40u + 48u + 48u, "wrote %zu bytes", glen);
    cr_assert_geq(vlen, glen);
    for (size_t i = 0; i < glen; i++)
        cr_assert_eq((unsigned char)got[i], (unsigned char)want[i], "byte %zu: wrote %02x, the vector has %02x", i,
                     (unsigned char)got[i], (unsigned char)want[i]);
    free(got), free(want);
    cmt_tmpdir_remove(&t);
}

Test(tb_events, text_and_histogram_records_decode_with_protobuf) {
    cmt_tmpdir t = cmt_tmpdir_make("tb");
    char path[256];
    snprintf(path, sizeof path, "%s/events", t.dir);
    cmi_tb_writer *w;
    cr_assert_eq(cmi_tb_open(path, 1.0, &w), CM_OK);
    cr_assert_eq(cmi_tb_text(w, "notes", "| a \\| b |\nütf-8 ✓", 7, 2.0), CM_OK);
    /* values -2, 0, 0, 3.5, 1e30 (past 1e20: the DBL_MAX bucket) */
    const int nb = cmi_tb_n_buckets();
    double *counts = calloc((size_t)nb, sizeof *counts);
    const double xs[] = {-2, 0, 0, 3.5, 1e30};
    double sum = 0, sq = 0;
    for (int i = 0; i < 5; i++) counts[cmi_tb_bucket_of(xs[i])] += 1, sum += xs[i], sq += xs[i] * xs[i];
    cmi_tb_histo h = {-2, 1e30, 5, sum, sq, counts};
    cr_assert_eq(cmi_tb_histogram(w, "h", &h, 9, 3.0), CM_OK);
    memset(counts, 0, sizeof *counts * (size_t)nb);
    cmi_tb_histo empty = {0, 0, 0, 0, 0, counts};
    cr_assert_eq(cmi_tb_histogram(w, "empty", &empty, 10, 4.0), CM_OK);
    cr_assert_eq(cmi_tb_close(w), CM_OK);
    free(counts);
    cJSON *ev = read_events(path);
    cr_assert_eq(cJSON_GetArraySize(ev), 4);
    const cJSON *e1 = cJSON_GetArrayItem(ev, 1);
    cr_assert_eq(num(e1, "step"), 7);
    const cJSON *v = cJSON_GetArrayItem(cJSON_GetObjectItem(e1, "values"), 0);
    cr_assert_str_eq(str(v, "tag"), "notes/text_summary");
    cr_assert_str_eq(str(v, "plugin"), "text");
    cr_assert_str_eq(str(v, "text"), "| a \\| b |\nütf-8 ✓");
    const cJSON *e2 = cJSON_GetArrayItem(ev, 2);
    cr_assert_eq(num(e2, "step"), 9);
    const cJSON *hv = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(e2, "values"), 0), "histo");
    cr_assert_eq(num(hv, "num"), 5);
    cr_assert_eq(num(hv, "min"), -2);
    cr_assert_eq(num(hv, "max"), 1e30);
    /* non-empty buckets: [-2.x, -2) holds -2; [0, 1e-12) holds both zeros; 3.5; 1e30 in the last;
     * each run of empty buckets is one zero entry before them */
    const cJSON *lim = cJSON_GetObjectItem(hv, "bucket_limit"), *cnt = cJSON_GetObjectItem(hv, "bucket");
    double nonzero[4];
    int k = 0;
    for (int i = 0; i < cJSON_GetArraySize(cnt); i++) {
        const double c = cJSON_GetArrayItem(cnt, i)->valuedouble;
        if (i > 0 && c == 0) cr_assert_neq(cJSON_GetArrayItem(cnt, i - 1)->valuedouble, 0, "two empty entries in a row");
        if (c > 0) {
            cr_assert_lt(k, 4);
            nonzero[k++] = c;
            /* the value(s) counted lie in [previous limit, this limit) */
            const double hi = cJSON_GetArrayItem(lim, i)->valuedouble, lo = cJSON_GetArrayItem(lim, i - 1)->valuedouble;
            int inside = 0;
            for (int j = 0; j < 5; j++) inside += xs[j] >= lo && (xs[j] < hi || hi == cJSON_GetArrayItem(lim, cJSON_GetArraySize(lim) - 1)->valuedouble);
            cr_assert_eq(inside, (int)c, "bucket [%g, %g) counts %g values, %d lie in it", lo, hi, c, inside);
        }
    }
    cr_assert_eq(k, 4, "%d non-empty buckets, want 4", k);
    cr_assert_eq(nonzero[1], 2);
    const cJSON *e3 = cJSON_GetArrayItem(ev, 3);
    const cJSON *he = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(e3, "values"), 0), "histo");
    cr_assert_eq(num(he, "num"), 0);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(he, "bucket")), 1, "an empty histogram is one empty bucket");
    cJSON_Delete(ev);
    cmt_tmpdir_remove(&t);
}

/* ---- whole fits -------------------------------------------------------------------------------- */

static cm_logger_plugin tb_plugin(const char *log_dir, int64_t flush_interval, int64_t hist) {
    cm_tensorboard_logger_config c = cm_tensorboard_logger_config_default();
    c.log_dir = log_dir;
    c.flush_interval = flush_interval;
    c.histogram_interval = hist;
    cm_logger_plugin p;
    cr_assert_eq(cm_tensorboard_logger_new(&c, &p), CM_OK, "%s", cm_last_error());
    return p;
}

/* The logger's file, copied (the plugin goes with the trainer). */
static char *file_of(const cmt_track_rig *g, int index) {
    const cm_logger_plugin p = cm_engine_logger_plugin(cm_trainer_engine(g->tr), index);
    const char *f = cm_tensorboard_logger_file(&p);
    return f ? strdup(f) : NULL;
}

Test(tensorboard_logger, every_metric_is_a_scalar_with_its_step_and_value) {
    cmt_tmpdir t = cmt_tmpdir_make("tb");
    char logdir[256];
    snprintf(logdir, sizeof logdir, "%s/tb_logs", t.dir);
    cm_in_memory_logger *mem;
    cm_logger_plugin p = tb_plugin(logdir, 2, 0);
    const double t0 = cmi_unix_time();
    cmt_track_rig g = cmt_track_rig_make(&(cmt_fit_opts){.run_name = "tb-run", .mem = &mem}, &p, 1);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_close(g.tr), CM_OK, "%s", cm_last_error());
    const double t1 = cmi_unix_time();
    char *file = file_of(&g, 1);
    cr_assert_not_null(file);
    char prefix[300];
    snprintf(prefix, sizeof prefix, "%s/tb-run/events.out.tfevents.", logdir);
    cr_assert_eq(strncmp(file, prefix, strlen(prefix)), 0, "file '%s' is not under '%s'", file, prefix);
    cJSON *ev = read_events(file);
    const int n_ev = cJSON_GetArraySize(ev);
    const cJSON *e0 = cJSON_GetArrayItem(ev, 0);
    cr_assert_str_eq(str(e0, "file_version"), "brain.Event:2");
    /* every logged (non-trace) value, in order, as one scalar each; the hyperparameter text once */
    int64_t r = 0;
    const int64_t n_mem = cm_in_memory_logger_n(mem);
    int texts = 0;
    for (int i = 1; i < n_ev; i++) {
        const cJSON *e = cJSON_GetArrayItem(ev, i);
        const double wt = num(e, "wall_time");
        cr_assert(wt >= floor(t0) - 1 && wt <= t1 + 1, "wall_time %f is not within the fit [%f, %f]", wt, t0, t1);
        const cJSON *vals = cJSON_GetObjectItem(e, "values");
        cr_assert_eq(cJSON_GetArraySize(vals), 1, "one value per event");
        const cJSON *v = cJSON_GetArrayItem(vals, 0);
        if (str(v, "text")) {
            texts++;
            cr_assert_str_eq(str(v, "tag"), "hyperparameters/text_summary");
            const char *txt = str(v, "text");
            cr_assert(strstr(txt, "| key | value |\n|---|---|\n"), "not a Markdown table: %s", txt);
            cr_assert(strstr(txt, "| run_name | tb-run |\n"), "no run_name row: %s", txt);
            cr_assert(strstr(txt, "| max_duration | 2ep |\n"), "no max_duration row: %s", txt);
            cr_assert_lt(strstr(txt, "| max_duration"), strstr(txt, "| run_name"), "rows are not sorted: %s", txt);
            continue;
        }
        const cm_log_record *rec;
        while ((rec = cm_in_memory_logger_record(mem, r)) && strncmp(rec->name, "traces/", 7) == 0) r++;
        cr_assert_not_null(rec, "event %d (%s) has no logged value left to match", i, str(v, "tag"));
        cr_assert_str_eq(str(v, "tag"), rec->name, "event %d", i);
        cr_assert_eq(num(e, "step"), (double)rec->batch, "event %d (%s): step %g, logged at batch %lld", i, rec->name,
                     num(e, "step"), (long long)rec->batch);
        cr_assert_eq(num(v, "simple_value"), (double)(float)rec->value, "%s at %lld: %.9g != %.9g", rec->name,
                     (long long)rec->batch, num(v, "simple_value"), (double)(float)rec->value);
        r++;
    }
    while (cm_in_memory_logger_record(mem, r) && strncmp(cm_in_memory_logger_record(mem, r)->name, "traces/", 7) == 0) r++;
    cr_assert_eq(r, n_mem, "%lld of %lld logged values are in the file", (long long)r, (long long)n_mem);
    cr_assert_gt(n_mem, 20, "the fit logged only %lld values", (long long)n_mem);
    cr_assert_eq(texts, 1, "hyperparameter text events: %d", texts);
    cJSON_Delete(ev);
    free(file);
    cmt_track_rig_free(&g);
    cmt_tmpdir_remove(&t);
}

/* Histograms at batches 3 and 6 of a one-epoch fit; the ones at 6 describe the final model. */
Test(tensorboard_logger, histograms_describe_the_parameters_and_gradients) {
    cmt_tmpdir t = cmt_tmpdir_make("tb");
    cm_logger_plugin p = tb_plugin(t.dir, 100, 3);
    cmt_track_rig g = cmt_track_rig_make(&(cmt_fit_opts){.run_name = "hist", .max_duration = "1ep", .no_eval = true}, &p, 1);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_close(g.tr), CM_OK);
    char *file = file_of(&g, 0);
    cJSON *ev = read_events(file);
    cm_module *root = cm_model_module(g.model);
    const int64_t np = cm_module_n_params(root);
    int seen[2][3] = {{0}}; /* [kind][step 3 or 6 -> 1, 2] */
    int checked = 0;
    for (int i = 0; i < cJSON_GetArraySize(ev); i++) {
        const cJSON *e = cJSON_GetArrayItem(ev, i);
        const cJSON *v = cJSON_GetArrayItem(cJSON_GetObjectItem(e, "values"), 0);
        const cJSON *h = v ? cJSON_GetObjectItem(v, "histo") : NULL;
        if (!h) continue;
        const char *tag = str(v, "tag");
        const int kind = strncmp(tag, "parameters/", 11) == 0 ? 0 : strncmp(tag, "gradients/", 10) == 0 ? 1 : -1;
        cr_assert_neq(kind, -1, "histogram tag '%s'", tag);
        const int64_t step = (int64_t)num(e, "step");
        cr_assert(step == 3 || step == 6, "a histogram at step %lld", (long long)step);
        seen[kind][step / 3]++;
        if (step != 6) continue;
        /* the final values of that parameter (or its gradient) */
        const char *name = tag + (kind == 0 ? 11 : 10);
        int64_t idx = cm_module_param_index(root, name);
        cr_assert_geq(idx, 0, "no parameter '%s'", name);
        const cm_param_info pi = cm_module_param_info(root, idx);
        const cm_unit_info *u = cm_module_unit(root, pi.unit);
        const float *x = (kind == 0 ? u->params : u->grads) + pi.offset;
        double mn = INFINITY, mx = -INFINITY, s = 0, sq = 0;
        for (int64_t j = 0; j < pi.numel; j++) mn = fmin(mn, x[j]), mx = fmax(mx, x[j]), s += x[j], sq += (double)x[j] * x[j];
        cr_assert_eq(num(h, "num"), (double)pi.numel, "%s: num", tag);
        cr_assert_eq(num(h, "min"), mn, "%s: min %g != %g", tag, num(h, "min"), mn);
        cr_assert_eq(num(h, "max"), mx, "%s: max", tag);
        cr_assert_float_eq(num(h, "sum"), s, 1e-9 * (1 + fabs(s)), "%s: sum %.17g != %.17g", tag, num(h, "sum"), s);
        cr_assert_float_eq(num(h, "sum_squares"), sq, 1e-9 * (1 + sq), "%s: sum_squares", tag);
        /* each element in the bucket the decoded limits give it: [limit[i-1], limit[i]) */
        const cJSON *lim = cJSON_GetObjectItem(h, "bucket_limit"), *cnt = cJSON_GetObjectItem(h, "bucket");
        const int nb = cJSON_GetArraySize(lim);
        double *want = calloc((size_t)nb, sizeof *want);
        for (int64_t j = 0; j < pi.numel; j++) {
            int b = 0;
            while (b < nb - 1 && !(x[j] < cJSON_GetArrayItem(lim, b)->valuedouble)) b++;
            want[b] += 1;
        }
        for (int b = 0; b < nb; b++)
            cr_assert_eq(cJSON_GetArrayItem(cnt, b)->valuedouble, want[b], "%s: bucket %d below %g holds %g, want %g",
                         tag, b, cJSON_GetArrayItem(lim, b)->valuedouble, cJSON_GetArrayItem(cnt, b)->valuedouble,
                         want[b]);
        free(want);
        checked++;
    }
    for (int k = 0; k < 2; k++)
        for (int s = 1; s <= 2; s++)
            cr_assert_eq(seen[k][s], np, "%s histograms at step %d: %d, want %lld", k ? "gradient" : "parameter", 3 * s,
                         seen[k][s], (long long)np);
    cr_assert_eq(checked, 2 * np);
    cJSON_Delete(ev);
    free(file);
    cmt_track_rig_free(&g);
    cmt_tmpdir_remove(&t);
}

/* A callback that records the event file's size at each BATCH_START, i.e. after the loggers ran
 * on the previous BATCH_END: the file grows on disk only when the logger flushed. */
typedef struct {
    const cm_logger_plugin *tb;
    long sizes[16];
    int n;
} size_probe;

static cm_status probe_run(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    (void)st, (void)lg;
    size_probe *p = self;
    if (ev != CM_EVENT_BATCH_START || p->n >= 16) return CM_OK;
    struct stat sb;
    const char *f = cm_tensorboard_logger_file(p->tb);
    p->sizes[p->n++] = f && stat(f, &sb) == 0 ? (long)sb.st_size : -1;
    return CM_OK;
}

static const cm_callback_i probe_vt = {.abi = CM_CALLBACK_ABI, .name = "SizeProbe", .run_event = probe_run};

Test(tensorboard_logger, flushes_every_flush_interval_batches) {
    cmt_tmpdir t = cmt_tmpdir_make("tb");
    size_probe probe = {0};
    cm_callback_plugin cb = {&probe_vt, &probe};
    cm_logger_plugin p = tb_plugin(t.dir, 3, 0);
    cmt_track_rig g = cmt_track_rig_make(&(cmt_fit_opts){.max_duration = "1ep", .no_eval = true, .callbacks = &cb, .n_callbacks = 1},
                             &p, 1);
    /* the probe reads the plugin the trainer now holds */
    cm_logger_plugin held = cm_engine_logger_plugin(cm_trainer_engine(g.tr), 0);
    probe.tb = &held;
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_assert_eq(probe.n, 6);
    /* before batches 1..6: flushed at open (0), after batch 3 (3); not after 1, 2, 4, 5 */
    cr_assert_gt(probe.sizes[0], 0);
    cr_assert_eq(probe.sizes[1], probe.sizes[0], "flushed after batch 1 with flush_interval 3");
    cr_assert_eq(probe.sizes[2], probe.sizes[0], "flushed after batch 2 with flush_interval 3");
    cr_assert_gt(probe.sizes[3], probe.sizes[2], "not flushed after batch 3");
    cr_assert_eq(probe.sizes[4], probe.sizes[3], "flushed after batch 4");
    cr_assert_eq(probe.sizes[5], probe.sizes[3], "flushed after batch 5");
    cmt_track_rig_free(&g);
    cmt_tmpdir_remove(&t);
}

Test(tensorboard_logger, only_rank_zero_writes_unless_asked) {
    cmt_tmpdir t = cmt_tmpdir_make("tb");
    cm_logger_plugin p = tb_plugin(t.dir, 100, 0);
    cmt_track_rig g = cmt_track_rig_make(&(cmt_fit_opts){.run_name = "r1", .max_duration = "2ba", .no_eval = true, .rank = 1,
                                             .world_size = 2},
                             &p, 1);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK);
    cr_assert_null(file_of(&g, 0));
    char d[256];
    snprintf(d, sizeof d, "%s/r1", t.dir);
    struct stat sb;
    cr_assert_neq(stat(d, &sb), 0, "rank 1 created %s", d);
    cmt_track_rig_free(&g);

    cm_tensorboard_logger_config c = cm_tensorboard_logger_config_default();
    c.log_dir = t.dir;
    c.rank_zero_only = false;
    cr_assert_eq(cm_tensorboard_logger_new(&c, &p), CM_OK);
    g = cmt_track_rig_make(&(cmt_fit_opts){.run_name = "r1", .max_duration = "2ba", .no_eval = true, .rank = 1,
                                     .world_size = 2},
                     &p, 1);
    cr_assert_eq(cm_trainer_fit(g.tr, NULL), CM_OK);
    cr_assert_eq(cm_trainer_close(g.tr), CM_OK);
    char *f = file_of(&g, 0);
    cr_assert_not_null(f, "rank 1 wrote nothing with rank_zero_only false");
    cJSON *ev = read_events(f);
    cr_assert_gt(cJSON_GetArraySize(ev), 2);
    cJSON_Delete(ev);
    free(f);
    cmt_track_rig_free(&g);
    cmt_tmpdir_remove(&t);
}

Test(tensorboard_logger, a_log_dir_that_cannot_be_made_fails_init_naming_it) {
    cmt_tmpdir t = cmt_tmpdir_make("tb");
    char blocker[256];
    snprintf(blocker, sizeof blocker, "%s/file", t.dir);
    FILE *f = fopen(blocker, "w");
    fclose(f);
    char logdir[300];
    snprintf(logdir, sizeof logdir, "%s/sub", blocker);
    cm_logger_plugin p = tb_plugin(logdir, 100, 0);
    cm_dataset *ds = cmt_synth_dataset(16, 8, 3, false, NULL);
    cm_dataloader *dl = cmt_loader(ds, 8, false, 1);
    cm_model *m = cmt_mlp(8, 4, 3, 0, 1);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = m, c.train_dataloader = dl, c.loggers = &p, c.n_loggers = 1;
    cm_time_parse("1ep", &c.max_duration);
    cm_trainer *tr;
    cr_assert_eq(cm_trainer_new(&c, &tr), CM_ERR_IO);
    const char *msg = cm_last_error();
    cr_assert(strstr(msg, "TensorBoardLogger") && strstr(msg, blocker), "message: %s", msg);
    cm_logger_plugin_free(p); /* a failed cm_trainer_new gives the plugin back */
    cm_model_free(m), cm_dataloader_free(dl), cm_dataset_free(ds);
    cmt_tmpdir_remove(&t);
}

/* A full disk mid-run (a file size limit, with SIGXFSZ ignored, makes writes fail with EFBIG):
 * one warning, and the fit completes. */
Test(tensorboard_logger, a_write_error_is_reported_once_and_training_goes_on) {
    cmt_tmpdir t = cmt_tmpdir_make("tb");
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {600, RLIM_INFINITY};
    cm_logger_plugin p = tb_plugin(t.dir, 1, 0);
    cmt_track_rig g = cmt_track_rig_make(&(cmt_fit_opts){.max_duration = "2ep"}, &p, 1);
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
    cmt_stderr_begin();
    cm_status s = cm_trainer_fit(g.tr, NULL);
    if (!s) s = cm_trainer_close(g.tr);
    char *err = cmt_stderr_end();
    rl.rlim_cur = RLIM_INFINITY;
    setrlimit(RLIMIT_FSIZE, &rl);
    cr_assert_eq(s, CM_OK, "the fit failed: %s", cm_last_error());
    cr_assert_eq(cm_state_timestamp(cm_trainer_state(g.tr))->batch, 12);
    cr_assert_eq(cmt_count(err, "TensorBoardLogger:"), 1, "warnings:\n%s", err);
    cr_assert(strstr(err, "File too large") && strstr(err, "training goes on"), "%s", err);
    free(err);
    cmt_track_rig_free(&g);
    cmt_tmpdir_remove(&t);
}

Test(tensorboard_logger, rejects_bad_configurations) {
    cm_logger_plugin p;
    cm_tensorboard_logger_config c = cm_tensorboard_logger_config_default();
    cr_assert_eq(cm_tensorboard_logger_new(NULL, &p), CM_ERR_INVALID_ARG);
    c.flush_interval = 0;
    cr_assert_eq(cm_tensorboard_logger_new(&c, &p), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "flush_interval"), "%s", cm_last_error());
    c = cm_tensorboard_logger_config_default();
    c.histogram_interval = -1;
    cr_assert_eq(cm_tensorboard_logger_new(&c, &p), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "histogram_interval"), "%s", cm_last_error());
    c.histogram_interval = 5;
    c.histogram_params = c.histogram_grads = false;
    cr_assert_eq(cm_tensorboard_logger_new(&c, &p), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "histogram_params"), "%s", cm_last_error());
}
