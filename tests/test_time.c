/* Time strings, Time arithmetic and Timestamp bookkeeping (include/composer/time.h). */
#include "cmtest.h"

#include <composer/time.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

static cm_time parse_ok(const char *s) {
    cm_time t;
    cr_assert_eq(cm_time_parse(s, &t), CM_OK, "parse '%s': %s", s, cm_last_error());
    return t;
}

static void expect_count(const char *s, int64_t count, cm_time_unit unit) {
    cm_time t = parse_ok(s);
    cr_assert_eq(t.unit, unit, "'%s': unit %s, want %s", s, cm_time_unit_name(t.unit), cm_time_unit_name(unit));
    cr_assert_eq(t.count, count, "'%s': count %lld, want %lld", s, (long long)t.count, (long long)count);
}

/* Parsing fails with CM_ERR_INVALID_ARG and a message holding each of the strings (NULL-ended). */
static void expect_parse_error(const char *s, ...) {
    cm_time t = cm_time_make(-77, CM_TIME_BATCH);
    cr_assert_eq(cm_time_parse(s, &t), CM_ERR_INVALID_ARG, "'%s' should not parse", s ? s : "(null)");
    cr_assert_eq(t.count, -77, "'%s': output written on error", s);
    va_list ap;
    va_start(ap, s);
    for (const char *want; (want = va_arg(ap, const char *));)
        cr_assert(strstr(cm_last_error(), want), "'%s': message '%s' lacks '%s'", s, cm_last_error(), want);
    va_end(ap);
}

Test(time, parses_every_unit_and_number_form) {
    expect_count("10ba", 10, CM_TIME_BATCH);
    expect_count("3ep", 3, CM_TIME_EPOCH);
    expect_count("128sp", 128, CM_TIME_SAMPLE);
    expect_count("3e4tok", 30000, CM_TIME_TOKEN);
    expect_count("1.5e2sp", 150, CM_TIME_SAMPLE);
    expect_count("2.0ba", 2, CM_TIME_BATCH);
    expect_count("7iter", 7, CM_TIME_ITERATION);
    expect_count("5400sec", 5400, CM_TIME_SECOND);
    expect_count("0ba", 0, CM_TIME_BATCH);
    expect_count("10BA", 10, CM_TIME_BATCH); /* units are case-insensitive, as in Composer */
    expect_count("9223372036854775807tok", INT64_MAX, CM_TIME_TOKEN);
    cm_time t = parse_ok("0.25dur");
    cr_assert_eq(t.unit, CM_TIME_DURATION);
    cr_assert_eq(t.frac, 0.25, "0.25dur -> %g", t.frac);
    t = parse_ok("1dur");
    cr_assert_eq(t.frac, 1.0);
    t = parse_ok("2.5e-1dur");
    cr_assert_eq(t.frac, 0.25);
    t = parse_ok(".5dur");
    cr_assert_eq(t.frac, 0.5);
}

Test(time, parses_wall_clock_forms_to_seconds) {
    expect_count("1h30m", 5400, CM_TIME_SECOND);
    expect_count("90s", 90, CM_TIME_SECOND);
    expect_count("2h", 7200, CM_TIME_SECOND);
    expect_count("90m", 5400, CM_TIME_SECOND);
    expect_count("1d2h3m4s", 86400 + 7200 + 180 + 4, CM_TIME_SECOND);
    expect_count("1h0m5s", 3605, CM_TIME_SECOND);
    expect_count("3H", 10800, CM_TIME_SECOND);
}

Test(time, bad_strings_get_errors_that_list_the_units) {
    expect_parse_error("3xx", "time '3xx'", "unknown unit 'xx'", "ep, ba, sp, tok, dur, iter or sec", "1h30m", NULL);
    expect_parse_error("10", "no unit", "ep, ba", NULL);
    expect_parse_error("ba", "no number", "10ba", NULL);
    expect_parse_error("", "empty", "ep, ba", NULL);
    expect_parse_error(NULL, "NULL", NULL);
    expect_parse_error("hello", "not a time", "ep, ba", NULL);
    expect_parse_error("1.5ba", "whole batches", "0.5dur", NULL);
    expect_parse_error("2.5e0ep", "whole epochs", NULL);
    expect_parse_error("-3ba", "negative", NULL);
    expect_parse_error("-0.5dur", "negative", NULL);
    expect_parse_error("10 ba", "malformed number '10 ' before 'ba'", NULL);
    expect_parse_error("1.2.3ba", "malformed number '1.2.3'", NULL);
    expect_parse_error("1e999dur", "out of range", NULL);
    expect_parse_error("1e20ba", "out of range", NULL);
    expect_parse_error("99999999999999999999ba", "out of range", NULL);
    expect_parse_error("1m30h", NULL);  /* parts out of order */
    expect_parse_error("1h1h", NULL);   /* a part twice */
    expect_parse_error("3e4", "no unit", NULL);
    expect_parse_error("..ba", "malformed number", NULL);
    /* the named form puts the config key first */
    cm_time t;
    cr_assert_eq(cm_time_parse_named("save_interval", "3xx", &t), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "save_interval '3xx': unknown unit 'xx' (use ep, ba, sp, tok, dur, iter or sec"),
              "%s", cm_last_error());
}

Test(time, to_string_round_trips) {
    const char *cases[] = {"10ba", "3ep", "128sp", "30000tok", "0.25dur", "7iter", "5400sec", "0.1dur", "1dur"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cm_time t = parse_ok(cases[i]), back;
        char buf[CM_TIME_STR_MAX];
        int len = cm_time_to_string(t, buf, sizeof buf);
        cr_assert_eq(len, (int)strlen(buf));
        cr_assert_str_eq(buf, cases[i]);
        cr_assert_eq(cm_time_parse(buf, &back), CM_OK, "%s", cm_last_error());
        cr_assert(back.unit == t.unit && back.count == t.count && back.frac == t.frac, "'%s' round trip", buf);
    }
    char buf[CM_TIME_STR_MAX];
    cm_time_to_string(cm_time_dur(1.0 / 3.0), buf, sizeof buf);
    cm_time back = parse_ok(buf);
    cr_assert_eq(back.frac, 1.0 / 3.0, "%s", buf);
    cm_time_to_string(parse_ok("1h30m"), buf, sizeof buf);
    cr_assert_str_eq(buf, "5400sec");
    /* truncation behaves like snprintf */
    char small[4];
    cr_assert_eq(cm_time_to_string(cm_time_make(12345, CM_TIME_BATCH), small, sizeof small), 7);
    cr_assert_str_eq(small, "123");
}

Test(time, arithmetic_and_comparison_within_one_unit) {
    cm_time r;
    cr_assert_eq(cm_time_add(parse_ok("3ba"), parse_ok("4ba"), &r), CM_OK);
    cr_assert(r.unit == CM_TIME_BATCH && r.count == 7, "3ba + 4ba = %lld", (long long)r.count);
    cr_assert_eq(cm_time_sub(parse_ok("3ba"), parse_ok("4ba"), &r), CM_OK);
    cr_assert_eq(r.count, -1);
    cr_assert_eq(cm_time_add(parse_ok("0.25dur"), parse_ok("0.5dur"), &r), CM_OK);
    cr_assert_eq(r.frac, 0.75);
    int c;
    cr_assert_eq(cm_time_cmp(parse_ok("3ep"), parse_ok("10ep"), &c), CM_OK);
    cr_assert_eq(c, -1);
    cr_assert_eq(cm_time_cmp(parse_ok("10ep"), parse_ok("10ep"), &c), CM_OK);
    cr_assert_eq(c, 0);
    cr_assert_eq(cm_time_cmp(parse_ok("0.5dur"), parse_ok("0.25dur"), &c), CM_OK);
    cr_assert_eq(c, 1);
    /* mixing units names both */
    cr_assert_eq(cm_time_add(parse_ok("3ep"), parse_ok("10ba"), &r), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "3ep") && strstr(cm_last_error(), "10ba") &&
                  strstr(cm_last_error(), "different units"),
              "%s", cm_last_error());
    cr_assert_eq(cm_time_cmp(parse_ok("3ep"), parse_ok("0.5dur"), &c), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "3ep") && strstr(cm_last_error(), "0.5dur"), "%s", cm_last_error());
    cr_assert_eq(cm_time_sub(parse_ok("1sec"), parse_ok("1iter"), &r), CM_ERR_INVALID_ARG);
    /* overflow is an error, not wraparound */
    cr_assert_eq(cm_time_add(cm_time_make(INT64_MAX, CM_TIME_TOKEN), parse_ok("1tok"), &r), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "overflow"), "%s", cm_last_error());
}

Test(time, unit_names_parse_both_ways) {
    cm_time_unit u;
    for (int i = 0; i < CM_TIME_UNIT_COUNT; i++) {
        cr_assert_eq(cm_time_unit_parse(cm_time_unit_name((cm_time_unit)i), &u), CM_OK);
        cr_assert_eq((int)u, i);
        cr_assert_eq(cm_time_unit_parse(cm_time_unit_long_name((cm_time_unit)i), &u), CM_OK);
        cr_assert_eq((int)u, i);
    }
    cr_assert_eq(cm_time_unit_parse("fortnight", &u), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "fortnight") && strstr(cm_last_error(), "ep, ba"), "%s", cm_last_error());
    cr_assert_str_eq(cm_time_unit_name((cm_time_unit)99), "?");
}

Test(timestamp, batches_epochs_and_iterations_advance_like_composer) {
    cm_timestamp ts = {0};
    cm_timestamp_next_batch(&ts, 32, 32 * 128, 0.5); /* global counts over all ranks */
    cm_timestamp_next_batch(&ts, 16, 16 * 128, 0.25);
    cr_assert(ts.batch == 2 && ts.batch_in_epoch == 2 && ts.sample == 48 && ts.sample_in_epoch == 48);
    cr_assert(ts.token == 48 * 128 && ts.token_in_epoch == 48 * 128 && ts.token_in_iteration == 48 * 128);
    cr_assert(ts.total_wct == 0.75 && ts.epoch_wct == 0.75 && ts.iteration_wct == 0.75 && ts.batch_wct == 0.25,
              "wct %g %g %g %g", ts.total_wct, ts.epoch_wct, ts.iteration_wct, ts.batch_wct);

    cm_timestamp_next_epoch(&ts, 0.125);
    cr_assert(ts.epoch == 1 && ts.epoch_in_iteration == 1);
    cr_assert(ts.batch == 2 && ts.sample == 48, "totals survive the epoch");
    cr_assert(ts.batch_in_epoch == 0 && ts.sample_in_epoch == 0 && ts.token_in_epoch == 0);
    cr_assert(ts.token_in_iteration == 48 * 128);
    cr_assert(ts.total_wct == 0.875 && ts.iteration_wct == 0.875 && ts.epoch_wct == 0 && ts.batch_wct == 0);

    cm_timestamp_next_batch(&ts, 8, 0, 1.0);
    cm_timestamp_next_iteration(&ts, 0.5);
    cr_assert(ts.iteration == 1 && ts.epoch == 1 && ts.batch == 3 && ts.sample == 56);
    cr_assert(ts.epoch_in_iteration == 0 && ts.token_in_iteration == 0 && ts.batch_in_epoch == 0 &&
              ts.sample_in_epoch == 0);
    cr_assert(ts.total_wct == 2.375 && ts.iteration_wct == 0 && ts.epoch_wct == 0 && ts.batch_wct == 0);
}

Test(timestamp, get_compare_and_elapsed_fraction) {
    cm_timestamp ts = {0};
    for (int i = 0; i < 150; i++) cm_timestamp_next_batch(&ts, 4, 40, 1.5);
    cm_timestamp_next_epoch(&ts, 0);
    cm_time t;
    cr_assert_eq(cm_timestamp_get(&ts, CM_TIME_BATCH, &t), CM_OK);
    cr_assert(t.unit == CM_TIME_BATCH && t.count == 150);
    cr_assert_eq(cm_timestamp_get(&ts, CM_TIME_SAMPLE, &t), CM_OK);
    cr_assert_eq(t.count, 600);
    cr_assert_eq(cm_timestamp_get(&ts, CM_TIME_TOKEN, &t), CM_OK);
    cr_assert_eq(t.count, 6000);
    cr_assert_eq(cm_timestamp_get(&ts, CM_TIME_EPOCH, &t), CM_OK);
    cr_assert_eq(t.count, 1);
    cr_assert_eq(cm_timestamp_get(&ts, CM_TIME_SECOND, &t), CM_OK);
    cr_assert_eq(t.count, 225);
    cr_assert_eq(cm_timestamp_get(&ts, CM_TIME_DURATION, &t), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "cm_timestamp_elapsed"), "%s", cm_last_error());

    int c;
    cr_assert_eq(cm_timestamp_cmp(&ts, parse_ok("150ba"), &c), CM_OK);
    cr_assert_eq(c, 0);
    cr_assert_eq(cm_timestamp_cmp(&ts, parse_ok("2ep"), &c), CM_OK);
    cr_assert_eq(c, -1);
    cr_assert_eq(cm_timestamp_cmp(&ts, parse_ok("3m"), &c), CM_OK); /* 225 s > 180 s */
    cr_assert_eq(c, 1);
    cr_assert_eq(cm_timestamp_cmp(&ts, parse_ok("0.5dur"), &c), CM_ERR_INVALID_ARG);

    double f;
    cr_assert_eq(cm_timestamp_elapsed(&ts, parse_ok("300ba"), 0, &f), CM_OK);
    cr_assert_eq(f, 0.5, "%g", f);
    cr_assert_eq(cm_timestamp_elapsed(&ts, parse_ok("4ep"), 0, &f), CM_OK); /* whole epochs, like Composer */
    cr_assert_eq(f, 0.25, "%g", f);
    cr_assert_eq(cm_timestamp_elapsed(&ts, parse_ok("4ep"), 100, &f), CM_OK); /* 150 of 400 batches */
    cr_assert_eq(f, 0.375, "%g", f);
    cr_assert_eq(cm_timestamp_elapsed(&ts, parse_ok("1h"), 0, &f), CM_OK);
    cr_assert_eq(f, 225.0 / 3600.0, "%g", f);
    cr_assert_eq(cm_timestamp_elapsed(&ts, parse_ok("1200tok"), 0, &f), CM_OK);
    cr_assert_eq(f, 5.0, "past the end: %g", f);
    cr_assert_eq(cm_timestamp_elapsed(&ts, parse_ok("0.5dur"), 0, &f), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "0.5dur"), "%s", cm_last_error());
    cr_assert_eq(cm_timestamp_elapsed(&ts, parse_ok("0ba"), 0, &f), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "> 0"), "%s", cm_last_error());
}
