/* Progress bar and format helpers (include/composer/report.h): exact strings, and the exact bytes a
 * bar writes for a scripted sequence on a fake clock, on a terminal and in lines mode. */
#include "cmtest.h"

#include <composer/report.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPECT_STR(got, want, what) \
    cr_assert_str_eq((got), (want), "%s: got \"%s\", want \"%s\"", (what), (got), (want))

/* ---- format helpers ------------------------------------------------------------------------ */

Test(format, duration_is_tqdm_interval) {
    char b[CM_FORMAT_MAX];
    struct { double s; const char *want; } cases[] = {
        {0, "00:00"}, {12.7, "00:12"}, {59.99, "00:59"}, {60, "01:00"}, {3599, "59:59"}, {3600, "1:00:00"},
        {3723, "1:02:03"}, {100000, "27:46:40"}, {-1, "?"}, {NAN, "?"}, {INFINITY, "?"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char what[64];
        snprintf(what, sizeof what, "duration(%g)", cases[i].s);
        EXPECT_STR(cm_format_duration(cases[i].s, b, sizeof b), cases[i].want, what);
    }
    /* Truncates to the buffer instead of overflowing. */
    char small[4];
    EXPECT_STR(cm_format_duration(3723, small, sizeof small), "1:0", "duration into 4 bytes");
}

Test(format, si_has_three_significant_digits_like_tqdm) {
    char b[CM_FORMAT_MAX];
    struct { double x; const char *want; } cases[] = {
        {0, "0.00"},       {0.5, "0.50"},     {9.994, "9.99"},  {9.996, "10.0"},  {12.3, "12.3"},
        {999, "999"},      {999.6, "1.00k"},  {1234, "1.23k"},  {4.5e6, "4.50M"}, {12345678, "12.3M"},
        {-1234, "-1.23k"}, {1e30, "1000000.0Y"}, {NAN, "nan"},  {-INFINITY, "-inf"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char what[64];
        snprintf(what, sizeof what, "si(%g)", cases[i].x);
        EXPECT_STR(cm_format_si(cases[i].x, b, sizeof b), cases[i].want, what);
    }
}

Test(format, rate_inverts_below_one_per_second) {
    char b[CM_FORMAT_MAX];
    EXPECT_STR(cm_format_rate(36.2, "ba", false, b, sizeof b), "36.20ba/s", "36.2 ba/s");
    EXPECT_STR(cm_format_rate(1.0, "ba", false, b, sizeof b), "1.00ba/s", "exactly one per second");
    EXPECT_STR(cm_format_rate(0.4, "ba", false, b, sizeof b), "2.50s/ba", "slow batches");
    EXPECT_STR(cm_format_rate(12345.678, "ba", false, b, sizeof b), "12345.68ba/s", "fast, no SI");
    EXPECT_STR(cm_format_rate(12345.678, "tok", true, b, sizeof b), "12.3ktok/s", "fast, SI");
    EXPECT_STR(cm_format_rate(0, "ba", false, b, sizeof b), "?ba/s", "unknown rate");
    EXPECT_STR(cm_format_rate(NAN, NULL, false, b, sizeof b), "?it/s", "NaN rate, default unit");
}

Test(format, metric_has_four_decimals_and_goes_scientific_for_tiny_values) {
    char b[CM_FORMAT_MAX];
    struct { double x; const char *want; } cases[] = {
        {1.93123, "1.9312"}, {6e-4, "6.0000e-04"}, {0.0, "0.0000"},  {-0.0, "0.0000"},     {0.01, "0.0100"},
        {1234.5, "1234.5000"}, {1.23456e7, "1.2346e+07"}, {-0.5, "-0.5000"}, {INFINITY, "inf"}, {NAN, "nan"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char what[64];
        snprintf(what, sizeof what, "metric(%g)", cases[i].x);
        EXPECT_STR(cm_format_metric(cases[i].x, b, sizeof b), cases[i].want, what);
    }
}

Test(format, shortest_double_round_trips_and_matches_python_repr_digits) {
    char b[40];
    struct { double x; const char *want; } cases[] = {
        {0.1, "0.1"},           {1.93, "1.93"},        {1e-5, "1e-05"},       {120, "120"},
        {-0.0, "-0"},           {6e-5, "6e-05"},       {1.0 / 3, "0.3333333333333333"},
        {1e300, "1e+300"},      {5e-324, "5e-324"},    {2.5e16, "2.5e+16"},   {9999999999999998.0, "9999999999999998"},
        {0.0001, "0.0001"},     {0.00012345, "0.00012345"}, {1.5e-7, "1.5e-07"}, {123456.789, "123456.789"},
        {NAN, "NaN"},           {INFINITY, "Infinity"}, {-INFINITY, "-Infinity"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int n = cm_format_double_shortest(cases[i].x, b, sizeof b);
        char what[64];
        snprintf(what, sizeof what, "shortest(%.17g)", cases[i].x);
        EXPECT_STR(b, cases[i].want, what);
        cr_assert_eq(n, (int)strlen(b), "%s: returned %d for \"%s\"", what, n, b);
    }
    /* Every value reads back exactly, across magnitudes. */
    for (int i = 0; i < 2000; i++) {
        uint32_t w[4];
        cm_philox4x32(7, 0, (uint64_t)i, w);
        uint64_t bits = ((uint64_t)w[0] << 32) | w[1];
        double x;
        memcpy(&x, &bits, sizeof x);
        if (!isfinite(x)) continue;
        cm_format_double_shortest(x, b, sizeof b);
        cr_assert_eq(strtod(b, NULL), x, "'%s' does not read back to %.17g", b, x);
        cr_assert(strlen(b) <= 24, "'%s' is longer than 24 bytes", b);
    }
}

/* ---- the bar --------------------------------------------------------------------------------- */

typedef struct fake_clock {
    double t;
} fake_clock;

static double fake_now(void *data) { return ((fake_clock *)data)->t; }

typedef struct capture {
    char *buf;
    size_t len;
    FILE *f;
} capture;

static void capture_open(capture *c) {
    c->buf = NULL;
    c->len = 0;
    c->f = open_memstream(&c->buf, &c->len);
    cr_assert_not_null(c->f);
}

static void capture_expect(capture *c, const char *want) {
    fflush(c->f);
    cr_assert_str_eq(c->buf, want, "bar output differs:\n got: \"%s\"\nwant: \"%s\"", c->buf, want);
}

static void capture_close(capture *c) {
    fclose(c->f);
    free(c->buf);
}

static cm_progress *bar_new(cm_progress_config *cfg) {
    cm_progress *p = NULL;
    cr_assert_eq(cm_progress_new(cfg, &p), CM_OK, "cm_progress_new: %s", cm_last_error());
    return p;
}

static void update1(cm_progress *p, int64_t n, const char *name, double v) {
    cr_assert_eq(cm_progress_update(p, n, &name, &v, 1), CM_OK, "update: %s", cm_last_error());
}

#define CR "\r"
#define EL "\x1b[K"

Test(progress, terminal_bar_redraws_one_line_with_eighths_and_metrics) {
    fake_clock clk = {0};
    capture cap;
    capture_open(&cap);
    cm_progress_config cfg = cm_progress_config_default();
    cfg.total = 8;
    cfg.desc = "train Epoch 0";
    cfg.stream = cap.f;
    cfg.mode = CM_PROGRESS_TTY;
    cfg.width = 100;
    cfg.smoothing = 0;
    cfg.clock = fake_now;
    cfg.clock_data = &clk;
    cm_progress *p = bar_new(&cfg);
    const char *l0 = CR "train Epoch 0:   0%|                         | 0/8 [00:00<?, ?ba/s]" EL;
    capture_expect(&cap, l0);

    clk.t = 0.5;
    update1(p, 2, "loss", 2.5);
    const char *l2 = CR "train Epoch 0:  25%|██████▎                  | 2/8 [00:00<00:01, 4.00ba/s, loss=2.5000]" EL;
    clk.t = 0.5625; /* under min_interval_s since the last redraw: nothing drawn */
    update1(p, 3, "loss", 2.0);
    clk.t = 1.0;
    update1(p, 4, "loss", 1.5);
    const char *l4 = CR "train Epoch 0:  50%|████████████▌            | 4/8 [00:01<00:01, 4.00ba/s, loss=1.5000]" EL;
    cm_progress_write(p, "eval: accuracy=0.9");
    clk.t = 2.0;
    update1(p, 8, "loss", 0.25);
    const char *l8 = CR "train Epoch 0: 100%|█████████████████████████| 8/8 [00:02<00:00, 4.00ba/s, loss=0.2500]" EL;
    cm_progress_finish(p);
    cm_progress_finish(p); /* idempotent */
    update1(p, 9, "loss", 0.1); /* ignored after finish */

    char want[4096];
    snprintf(want, sizeof want, "%s%s%s%s%s%s%s%s\n", l0, l2, l4, CR EL "eval: accuracy=0.9\n", l4, l8, l8, "");
    capture_expect(&cap, want);
    cm_progress_free(p);
    capture_close(&cap);
}

Test(progress, terminal_line_is_cut_to_the_width_and_the_bar_shrinks_first) {
    fake_clock clk = {4.0};
    cm_progress_config cfg = cm_progress_config_default();
    cfg.total = 1000;
    cfg.desc = "train Epoch 0";
    FILE *devnull = fopen("/dev/null", "w");
    cfg.stream = devnull;
    cfg.mode = CM_PROGRESS_LINES; /* draws nothing at creation; we only format */
    cfg.width = 60;
    cfg.smoothing = 0;
    cfg.clock = fake_now;
    cfg.clock_data = &clk;
    cm_progress *p = bar_new(&cfg);
    clk.t = 8.0;
    cr_assert_eq(cm_progress_set_metric(p, "loss/train/total", 1.93123), CM_OK);
    char line[512];
    cm_progress_format(p, true, line, sizeof line);
    /* 1 column of bar (tqdm's minimum), then the rest cut at 60 columns. */
    const char *want = "train Epoch 0:   0%| | 0/1000 [00:04<?, ?ba/s, loss/train/to";
    EXPECT_STR(line, want, "60-column line");
    cfg.width = 120;
    cm_progress_free(p);
    p = bar_new(&cfg);
    cm_progress_format(p, true, line, sizeof line);
    EXPECT_STR(line, "train Epoch 0:   0%|                         | 0/1000 [00:00<?, ?ba/s]", "bar capped at 25");
    cm_progress_free(p);
    fclose(devnull);
}

Test(progress, lines_mode_prints_one_clean_line_per_fraction_step) {
    fake_clock clk = {0};
    capture cap;
    capture_open(&cap);
    cm_progress_config cfg = cm_progress_config_default();
    cfg.total = 20;
    cfg.desc = "eval";
    cfg.stream = cap.f; /* a memstream is not a terminal: AUTO picks lines */
    cfg.line_every_frac = 0.25;
    cfg.line_every_s = 0;
    cfg.smoothing = 0;
    cfg.clock = fake_now;
    cfg.clock_data = &clk;
    cm_progress *p = bar_new(&cfg);
    capture_expect(&cap, "");
    for (int n = 1; n <= 20; n++) {
        clk.t = n * 0.25;
        if (n == 10) cr_assert_eq(cm_progress_set_metric(p, "acc", 0.5), CM_OK);
        cr_assert_eq(cm_progress_update(p, n, NULL, NULL, 0), CM_OK);
    }
    cm_progress_finish(p); /* the last line already shows 20/20: nothing more */
    capture_expect(&cap, "eval:  25% 5/20 [00:01<00:03, 4.00ba/s]\n"
                         "eval:  50% 10/20 [00:02<00:02, 4.00ba/s, acc=0.5000]\n"
                         "eval:  75% 15/20 [00:03<00:01, 4.00ba/s, acc=0.5000]\n"
                         "eval: 100% 20/20 [00:05<00:00, 4.00ba/s, acc=0.5000]\n");
    cr_assert_null(memchr(cap.buf, '\r', cap.len), "lines mode wrote a carriage return");
    cr_assert_null(memchr(cap.buf, 0x1b, cap.len), "lines mode wrote an escape code");
    cm_progress_free(p);
    capture_close(&cap);
}

Test(progress, lines_mode_with_unknown_total_prints_on_time_and_at_finish) {
    fake_clock clk = {0};
    capture cap;
    capture_open(&cap);
    cm_progress_config cfg = cm_progress_config_default();
    cfg.unit = "tok";
    cfg.unit_scale = true;
    cfg.stream = cap.f;
    cfg.mode = CM_PROGRESS_LINES;
    cfg.line_every_s = 10;
    cfg.smoothing = 0;
    cfg.clock = fake_now;
    cfg.clock_data = &clk;
    cm_progress *p = bar_new(&cfg);
    for (int i = 1; i <= 6; i++) {
        clk.t = 4.0 * i;
        cr_assert_eq(cm_progress_update(p, 5000 * i, NULL, NULL, 0), CM_OK);
    }
    clk.t = 26;
    cr_assert_eq(cm_progress_update(p, 32500, NULL, NULL, 0), CM_OK);
    cm_progress_write(p, "a message\n");
    cm_progress_finish(p);
    capture_expect(&cap, "15.0ktok [00:12, 1.25ktok/s]\n"
                         "30.0ktok [00:24, 1.25ktok/s]\n"
                         "a message\n"
                         "32.5ktok [00:26, 1.25ktok/s]\n");
    cm_progress_free(p);
    capture_close(&cap);
}

Test(progress, rate_is_an_exponential_moving_average_like_tqdm) {
    fake_clock clk = {0};
    cm_progress_config cfg = cm_progress_config_default();
    cfg.total = 100;
    FILE *devnull = fopen("/dev/null", "w");
    cfg.stream = devnull;
    cfg.mode = CM_PROGRESS_LINES;
    cfg.line_every_frac = 0;
    cfg.line_every_s = 0;
    cfg.smoothing = 0.75;
    cfg.clock = fake_now;
    cfg.clock_data = &clk;
    cm_progress *p = bar_new(&cfg);
    clk.t = 1;
    cm_progress_update(p, 10, NULL, NULL, 0); /* 10 ba in 1 s */
    clk.t = 3;
    cm_progress_update(p, 20, NULL, NULL, 0); /* then 10 ba in 2 s */
    char line[256];
    cm_progress_format(p, false, line, sizeof line);
    /* dn = .25·10 + .75·10 = 10, dt = .25·1 + .75·2 = 1.75: 5.71 ba/s (the plain average would say 6.67);
     * 80 left at 5.714/s = 14 s. */
    EXPECT_STR(line, " 20% 20/100 [00:03<00:14, 5.71ba/s]", "EMA rate");
    cm_progress_free(p);
    fclose(devnull);
}

Test(progress, leave_false_erases_the_finished_bar) {
    fake_clock clk = {0};
    capture cap;
    capture_open(&cap);
    cm_progress_config cfg = cm_progress_config_default();
    cfg.total = 2;
    cfg.stream = cap.f;
    cfg.mode = CM_PROGRESS_TTY;
    cfg.width = 60;
    cfg.leave = false;
    cfg.clock = fake_now;
    cfg.clock_data = &clk;
    cm_progress *p = bar_new(&cfg);
    cm_progress_free(p); /* free finishes */
    capture_expect(&cap, CR "  0%|                         | 0/2 [00:00<?, ?ba/s]" EL CR EL);
    capture_close(&cap);
}

Test(progress, bad_arguments_are_reported) {
    cm_progress_config cfg = cm_progress_config_default();
    cm_progress *p = (cm_progress *)1;
    cfg.total = -1;
    cr_assert_eq(cm_progress_new(&cfg, &p), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "total -1"), "message: %s", cm_last_error());
    cr_assert_null(p);
    cfg = cm_progress_config_default();
    cfg.smoothing = 2;
    cr_assert_eq(cm_progress_new(&cfg, &p), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "smoothing 2"), "message: %s", cm_last_error());
    cfg = cm_progress_config_default();
    cfg.min_interval_s = -1;
    cr_assert_eq(cm_progress_new(&cfg, &p), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_progress_new(NULL, &p), CM_ERR_INVALID_ARG);

    cfg = cm_progress_config_default();
    cfg.mode = CM_PROGRESS_LINES;
    FILE *devnull = fopen("/dev/null", "w");
    cfg.stream = devnull;
    cfg.total = 10;
    cfg.desc = "train";
    p = bar_new(&cfg);
    cr_assert_eq(cm_progress_update(p, 5, NULL, NULL, 0), CM_OK);
    cr_assert_eq(cm_progress_update(p, 4, NULL, NULL, 0), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "from 5 to 4"), "message: %s", cm_last_error());
    cr_assert_eq(cm_progress_update(p, 6, NULL, NULL, 2), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_progress_set_metric(p, NULL, 1), CM_ERR_INVALID_ARG);
    cm_progress_clear_metrics(p);
    cm_progress_free(p);
    fclose(devnull);
    cm_progress_free(NULL);
}

Test(progress, metrics_keep_first_set_order_and_latest_value) {
    fake_clock clk = {0};
    cm_progress_config cfg = cm_progress_config_default();
    cfg.total = 4;
    FILE *devnull = fopen("/dev/null", "w");
    cfg.stream = devnull;
    cfg.mode = CM_PROGRESS_LINES;
    cfg.clock = fake_now;
    cfg.clock_data = &clk;
    cm_progress *p = bar_new(&cfg);
    for (int i = 0; i < 20; i++) { /* grows past the first capacity */
        char name[16];
        snprintf(name, sizeof name, "m%d", i);
        cr_assert_eq(cm_progress_set_metric(p, name, i), CM_OK);
    }
    cm_progress_clear_metrics(p);
    cm_progress_set_metric(p, "lr", 6e-4);
    cm_progress_set_metric(p, "loss", 3.0);
    cm_progress_set_metric(p, "lr", 3e-4);
    char line[256];
    cm_progress_format(p, false, line, sizeof line);
    EXPECT_STR(line, "  0% 0/4 [00:00<?, ?ba/s, lr=3.0000e-04, loss=3.0000]", "metric order");
    cm_progress_free(p);
    fclose(devnull);
}

Test(progress, every_allocation_failure_is_reported_cleanly) {
    FILE *devnull = fopen("/dev/null", "w");
    int n;
    for (n = 1; n < 1000; n++) {
        cm_alloc_fail_at(n);
        cm_progress_config cfg = cm_progress_config_default();
        cfg.total = 10;
        cfg.stream = devnull;
        cfg.mode = CM_PROGRESS_TTY;
        cm_progress *p = NULL;
        cm_status st = cm_progress_new(&cfg, &p);
        for (int i = 0; st == CM_OK && i < 12; i++) {
            char name[16];
            snprintf(name, sizeof name, "m%d", i);
            st = cm_progress_set_metric(p, name, i);
        }
        cm_alloc_fail_at(0);
        cm_progress_free(p);
        if (st == CM_OK) break;
        cr_assert_eq(st, CM_ERR_OOM, "failing allocation %d: %s", n, cm_status_name(st));
    }
    cr_assert_gt(n, 3, "only %d allocations: the loop tested nothing", n);
    fclose(devnull);
}
