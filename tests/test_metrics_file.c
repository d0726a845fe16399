/* JSON Lines metrics file (include/composer/report.h): exact bytes written, exact values read
 * back, a torn last line from a crash, and strict errors with file and line for anything else. */
#include "cmtest.h"

#include <composer/report.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_dir[64];

static void make_dir(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/cm_metrics_XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir), "mkdtemp failed");
}

static void remove_dir(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(metrics_file, .init = make_dir, .fini = remove_dir);

static void path_in_dir(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", g_dir, name); }

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static cm_metrics_file *open_ok(const char *path, bool append) {
    cm_metrics_file *f = NULL;
    cr_assert_eq(cm_metrics_file_open(path, append, &f), CM_OK, "open %s: %s", path, cm_last_error());
    return f;
}

static void write_ok(cm_metrics_file *f, int64_t batch, int64_t epoch, size_t n, const char *const *names,
                     const double *values) {
    cr_assert_eq(cm_metrics_file_write(f, batch, epoch, names, values, n), CM_OK, "write: %s", cm_last_error());
}

/* Collected records. */
typedef struct rec {
    int64_t line, batch, epoch;
    char name[64];
    double value;
} rec;

typedef struct recs {
    rec r[64];
    int n;
    int stop_after; /* > 0: return CM_ERR_STATE after this many */
} recs;

static cm_status collect(void *data, int64_t line, int64_t batch, int64_t epoch, const char *name, double value) {
    recs *rs = data;
    cr_assert(rs->n < 64);
    rec *r = &rs->r[rs->n++];
    r->line = line, r->batch = batch, r->epoch = epoch, r->value = value;
    snprintf(r->name, sizeof r->name, "%s", name);
    if (rs->stop_after && rs->n == rs->stop_after) return cm_set_error(CM_ERR_STATE, "stop requested");
    return CM_OK;
}

static void expect_rec(const rec *r, int64_t line, int64_t batch, int64_t epoch, const char *name, double value) {
    cr_assert_eq(r->line, line, "record '%s': line %lld, want %lld", r->name, (long long)r->line, (long long)line);
    cr_assert_eq(r->batch, batch, "record '%s': batch %lld, want %lld", r->name, (long long)r->batch,
                 (long long)batch);
    cr_assert_eq(r->epoch, epoch, "record '%s': epoch %lld, want %lld", r->name, (long long)r->epoch,
                 (long long)epoch);
    cr_assert_str_eq(r->name, name, "name '%s', want '%s'", r->name, name);
    bool same = isnan(value) ? isnan(r->value) : memcmp(&r->value, &value, sizeof value) == 0;
    cr_assert(same, "record '%s': value %.17g, want %.17g (bit-exact)", name, r->value, value);
}

static const char k_expected[] =
    "{\"batch\": 120, \"epoch\": 0, \"loss/train/total\": 1.93}\n"
    "{\"batch\": 121, \"epoch\": 0, \"loss/train/total\": 0.1, \"lr-AdamW/group0\": 6e-05, "
    "\"odd \\\"name\\\"\\\\\\n\\u0001\": -0, \"third\": 0.3333333333333333}\n"
    "{\"batch\": 122, \"epoch\": 1, \"loss/train/total\": \"NaN\", \"inf\": \"Infinity\", \"ninf\": \"-Infinity\"}\n"
    "{\"batch\": 123, \"epoch\": 1}\n";

static void write_sample(const char *path) {
    cm_metrics_file *f = open_ok(path, false);
    cr_assert_str_eq(cm_metrics_file_path(f), path);
    const char *n1[] = {"loss/train/total"};
    double v1[] = {1.93};
    write_ok(f, 120, 0, 1, n1, v1);
    /* Written and flushed at once: a crash now would keep the line. */
    cr_assert_str_eq(slurp(path), "{\"batch\": 120, \"epoch\": 0, \"loss/train/total\": 1.93}\n");
    const char *n2[] = {"loss/train/total", "lr-AdamW/group0", "odd \"name\"\\\n\x01", "third"};
    double v2[] = {0.1, 6e-5, -0.0, 1.0 / 3};
    write_ok(f, 121, 0, 4, n2, v2);
    const char *n3[] = {"loss/train/total", "inf", "ninf"};
    double v3[] = {NAN, INFINITY, -INFINITY};
    write_ok(f, 122, 1, 3, n3, v3);
    write_ok(f, 123, 1, 0, NULL, NULL);
    cr_assert_eq(cm_metrics_file_close(f), CM_OK, "close: %s", cm_last_error());
}

Test(metrics_file, writes_exact_json_lines_in_call_order) {
    char path[128];
    path_in_dir(path, sizeof path, "metrics.jsonl");
    write_sample(path);
    const char *got = slurp(path);
    cr_assert_str_eq(got, k_expected, "file bytes:\n%s\nwant:\n%s", got, k_expected);
}

Test(metrics_file, lines_are_standard_json_for_python) {
    if (system("command -v python3 >/dev/null 2>&1") != 0) cr_skip_test("python3 not installed");
    char path[128], cmd[512];
    path_in_dir(path, sizeof path, "metrics.jsonl");
    write_sample(path);
    /* Python's json module, refusing bare NaN/Infinity, reads every line with exact values. */
    char script[128];
    path_in_dir(script, sizeof script, "check.py");
    cmt_write_text(script, "import json, sys\n"
                 "def bare(c): sys.exit('bare constant ' + c)\n"
                 "rows = [json.loads(l, parse_constant=bare) for l in open(sys.argv[1])]\n"
                 "assert rows[0] == {'batch': 120, 'epoch': 0, 'loss/train/total': 1.93}, rows[0]\n"
                 "assert rows[1]['lr-AdamW/group0'] == 6e-05 and rows[1]['third'] == 1 / 3, rows[1]\n"
                 "assert list(rows[1])[4] == 'odd \"name\"\\\\\\n' + chr(1), list(rows[1])\n"
                 "assert float(rows[2]['inf']) == float('inf') and rows[3] == {'batch': 123, 'epoch': 1}\n");
    snprintf(cmd, sizeof cmd, "python3 '%s' '%s'", script, path);
    cr_assert_eq(system(cmd), 0, "python3 rejected the file:\n%s", slurp(path));
}

Test(metrics_file, reads_back_exact_values_in_file_order) {
    char path[128];
    path_in_dir(path, sizeof path, "metrics.jsonl");
    write_sample(path);
    recs rs = {0};
    cr_assert_eq(cm_metrics_file_read(path, collect, &rs), CM_OK, "read: %s", cm_last_error());
    cr_assert_eq(rs.n, 8, "records: %d, want 8", rs.n);
    expect_rec(&rs.r[0], 1, 120, 0, "loss/train/total", 1.93);
    expect_rec(&rs.r[1], 2, 121, 0, "loss/train/total", 0.1);
    expect_rec(&rs.r[2], 2, 121, 0, "lr-AdamW/group0", 6e-5);
    expect_rec(&rs.r[3], 2, 121, 0, "odd \"name\"\\\n\x01", -0.0);
    expect_rec(&rs.r[4], 2, 121, 0, "third", 1.0 / 3);
    expect_rec(&rs.r[5], 3, 122, 1, "loss/train/total", NAN);
    expect_rec(&rs.r[6], 3, 122, 1, "inf", INFINITY);
    expect_rec(&rs.r[7], 3, 122, 1, "ninf", -INFINITY);
}

Test(metrics_file, append_adds_lines_and_truncate_starts_over) {
    char path[128];
    path_in_dir(path, sizeof path, "m.jsonl");
    const char *n[] = {"loss"};
    double v = 2.5;
    cm_metrics_file *f = open_ok(path, true); /* append creates a missing file */
    write_ok(f, 1, 0, 1, n, &v);
    cm_metrics_file_close(f);
    f = open_ok(path, true);
    v = 2.0;
    write_ok(f, 2, 0, 1, n, &v);
    cm_metrics_file_close(f);
    cr_assert_str_eq(slurp(path), "{\"batch\": 1, \"epoch\": 0, \"loss\": 2.5}\n{\"batch\": 2, \"epoch\": 0, \"loss\": 2}\n");
    f = open_ok(path, false);
    cm_metrics_file_close(f);
    cr_assert_str_eq(slurp(path), "");
}

Test(metrics_file, append_cuts_a_torn_last_line_first) {
    char path[128];
    path_in_dir(path, sizeof path, "torn.jsonl");
    cmt_write_text(path, "{\"batch\": 1, \"epoch\": 0, \"loss\": 2.5}\n{\"batch\": 2, \"epo");
    cm_log_set_level(CM_LOG_ERROR); /* the warning is expected */
    cm_metrics_file *f = open_ok(path, true);
    cm_log_set_level(CM_LOG_INFO);
    const char *n[] = {"loss"};
    double v = 2.25;
    write_ok(f, 2, 0, 1, n, &v);
    cm_metrics_file_close(f);
    cr_assert_str_eq(slurp(path), "{\"batch\": 1, \"epoch\": 0, \"loss\": 2.5}\n{\"batch\": 2, \"epoch\": 0, \"loss\": 2.25}\n");
    /* A file that is one torn line becomes empty. */
    cmt_write_text(path, "{\"batch\": 1, \"ep");
    cm_log_set_level(CM_LOG_ERROR);
    f = open_ok(path, true);
    cm_log_set_level(CM_LOG_INFO);
    cm_metrics_file_close(f);
    cr_assert_str_eq(slurp(path), "");
}

Test(metrics_file, truncated_last_line_is_skipped_but_a_complete_one_without_newline_is_read) {
    char path[128];
    path_in_dir(path, sizeof path, "t.jsonl");
    cmt_write_text(path, "{\"batch\": 1, \"epoch\": 0, \"loss\": 2.5}\n\n{\"batch\": 2, \"epoch\": 0, \"loss\": 2.");
    recs rs = {0};
    cm_log_set_level(CM_LOG_ERROR);
    cm_status st = cm_metrics_file_read(path, collect, &rs);
    cm_log_set_level(CM_LOG_INFO);
    cr_assert_eq(st, CM_OK, "read: %s", cm_last_error());
    cr_assert_eq(rs.n, 1, "records %d, want 1", rs.n);
    expect_rec(&rs.r[0], 1, 1, 0, "loss", 2.5);

    cmt_write_text(path, "{\"batch\": 1, \"epoch\": 0, \"loss\": 2.5}\n{\"batch\": 2, \"epoch\": 0, \"loss\": 2}");
    rs = (recs){0};
    cr_assert_eq(cm_metrics_file_read(path, collect, &rs), CM_OK, "read: %s", cm_last_error());
    cr_assert_eq(rs.n, 2, "records %d, want 2", rs.n);
    expect_rec(&rs.r[1], 2, 2, 0, "loss", 2.0);
}

/* Reading `text` fails with CM_ERR_FORMAT and a message holding "<path>:<line>:" and `what`. */
static void expect_corrupt(const char *text, int line, const char *what) {
    char path[128], where[160];
    path_in_dir(path, sizeof path, "bad.jsonl");
    cmt_write_text(path, text);
    recs rs = {0};
    cm_status st = cm_metrics_file_read(path, collect, &rs);
    cr_assert_eq(st, CM_ERR_FORMAT, "'%s': status %s, want CM_ERR_FORMAT", text, cm_status_name(st));
    snprintf(where, sizeof where, "%s:%d:", path, line);
    cr_assert(strstr(cm_last_error(), where), "message '%s' lacks '%s'", cm_last_error(), where);
    cr_assert(strstr(cm_last_error(), what), "message '%s' lacks '%s'", cm_last_error(), what);
}

Test(metrics_file, corrupt_lines_are_errors_naming_file_and_line) {
    const char *good = "{\"batch\": 1, \"epoch\": 0, \"loss\": 2.5}\n";
    char text[512];
    snprintf(text, sizeof text, "%s{\"batch\": 2, \"epo\n%s", good, good);
    expect_corrupt(text, 2, "not valid JSON");
    snprintf(text, sizeof text, "%s%s[1, 2]\n", good, good);
    expect_corrupt(text, 3, "not a JSON object");
    expect_corrupt("{\"epoch\": 0, \"loss\": 1}\n", 1, "\"batch\"");
    expect_corrupt("{\"batch\": 1.5, \"epoch\": 0}\n", 1, "integers");
    expect_corrupt("{\"batch\": 1, \"epoch\": \"0\"}\n", 1, "integers");
    expect_corrupt("{\"batch\": 1, \"epoch\": 0, \"loss\": \"high\"}\n", 1, "\"loss\" is not a number");
    expect_corrupt("{\"batch\": 1, \"epoch\": 0, \"loss\": [1]}\n", 1, "\"loss\" is not a number");
    expect_corrupt("{\"batch\": 1, \"epoch\": 0, \"loss\": 1, \"loss\": 2}\n", 1, "\"loss\" appears twice");
    expect_corrupt("{\"batch\": 1, \"epoch\": 0} trailing\n", 1, "not valid JSON");
}

Test(metrics_file, null_reads_as_nan_and_a_callback_error_stops_reading) {
    char path[128];
    path_in_dir(path, sizeof path, "n.jsonl");
    cmt_write_text(path, "{\"batch\": 1, \"epoch\": 0, \"a\": null, \"b\": 1}\n{\"batch\": 2, \"epoch\": 0, \"a\": 3}\n");
    recs rs = {.stop_after = 2};
    cr_assert_eq(cm_metrics_file_read(path, collect, &rs), CM_ERR_STATE);
    cr_assert_str_eq(cm_last_error(), "stop requested");
    cr_assert_eq(rs.n, 2);
    expect_rec(&rs.r[0], 1, 1, 0, "a", NAN);
}

Test(metrics_file, bad_writes_and_paths_are_errors) {
    char path[128];
    path_in_dir(path, sizeof path, "w.jsonl");
    cm_metrics_file *f = open_ok(path, false);
    double v[2] = {1, 2};
    const char *dup[] = {"loss", "loss"};
    cr_assert_eq(cm_metrics_file_write(f, 1, 0, dup, v, 2), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "'loss' given twice"), "message: %s", cm_last_error());
    const char *reserved[] = {"batch"};
    cr_assert_eq(cm_metrics_file_write(f, 1, 0, reserved, v, 1), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "'batch'"), "message: %s", cm_last_error());
    const char *empty[] = {""};
    cr_assert_eq(cm_metrics_file_write(f, 1, 0, empty, v, 1), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_metrics_file_write(f, 1, 0, NULL, v, 1), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_metrics_file_close(f), CM_OK);
    cr_assert_str_eq(slurp(path), "", "a rejected write wrote something");
    cr_assert_eq(cm_metrics_file_close(NULL), CM_OK);

    cm_metrics_file *g = (cm_metrics_file *)1;
    cr_assert_eq(cm_metrics_file_open("/nonexistent-dir/m.jsonl", false, &g), CM_ERR_IO);
    cr_assert_null(g);
    cr_assert(strstr(cm_last_error(), "/nonexistent-dir/m.jsonl"), "message: %s", cm_last_error());
    recs rs = {0};
    cr_assert_eq(cm_metrics_file_read("/nonexistent-dir/m.jsonl", collect, &rs), CM_ERR_IO);
    cr_assert(strstr(cm_last_error(), "/nonexistent-dir/m.jsonl"), "message: %s", cm_last_error());
}

Test(metrics_file, write_failure_is_reported) {
    if (access("/dev/full", W_OK) != 0) cr_skip_test("/dev/full not available");
    cm_metrics_file *f = open_ok("/dev/full", false);
    const char *n[] = {"loss"};
    double v = 1;
    cr_assert_eq(cm_metrics_file_write(f, 1, 0, n, &v, 1), CM_ERR_IO);
    cr_assert(strstr(cm_last_error(), "/dev/full"), "message: %s", cm_last_error());
    cm_metrics_file_close(f);
}

/* cut removes whole lines from the middle and keeps the tail; offsets inside a line are refused
 * and leave the file as it was; writing goes on at the (new) end. */
Test(metrics_file, cut_removes_lines_between_two_offsets_and_keeps_the_tail) {
    char path[128];
    path_in_dir(path, sizeof path, "cut.jsonl");
    cm_metrics_file *f = open_ok(path, false);
    const char *names[] = {"x"};
    int64_t at[5];
    for (int b = 0; b < 4; b++) {
        at[b] = cm_metrics_file_size(f);
        double v = b;
        write_ok(f, b, 0, 1, names, &v);
    }
    at[4] = cm_metrics_file_size(f);
    cr_assert_eq(at[0], 0);
    cr_assert_eq(cm_metrics_file_cut(f, at[1] + 1, at[3]), CM_ERR_INVALID_ARG, "mid-line start refused");
    cr_assert_eq(cm_metrics_file_cut(f, at[1], at[4] + 1), CM_ERR_INVALID_ARG, "beyond the end refused");
    cr_assert_eq(cm_metrics_file_size(f), at[4], "a refused cut changes nothing");
    cr_assert_eq(cm_metrics_file_cut(f, at[1], at[3]), CM_OK, "%s", cm_last_error());
    double v = 9;
    write_ok(f, 9, 0, 1, names, &v);
    cr_assert_eq(cm_metrics_file_close(f), CM_OK);
    char *text = slurp(path);
    cr_assert_str_eq(text, "{\"batch\": 0, \"epoch\": 0, \"x\": 0}\n{\"batch\": 3, \"epoch\": 0, \"x\": 3}\n"
                           "{\"batch\": 9, \"epoch\": 0, \"x\": 9}\n");
}
