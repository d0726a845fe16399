/* Time to quality (composer/time_to_target.h): targets and their direction (in agreement with
 * Composer's stoppers), the first crossing of a target in a metrics file at the clock of its batch,
 * never reached, NaN, resumed runs, a missing clock, seed statistics and speed-ups on hand-computed
 * numbers; and the trainer's wall-clock as Composer counts it (data-side work in, evaluation out),
 * which time to target is measured on. */
#include "cmtest.h"
#include "cmtrain.h"

#include <composer/callbacks.h>
#include <composer/time_to_target.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define DIR "build/test_time_to_target"

static void setup(void) { cr_assert_eq(system("rm -rf " DIR " && mkdir -p " DIR), 0); }

/* ---------------------------------------------------------------------------------------------
 * Targets
 * ------------------------------------------------------------------------------------------- */

Test(target, equals_sign_takes_the_direction_from_the_name_as_composers_stoppers_do) {
    const char *names[] = {"metrics/eval/MulticlassAccuracy", "metrics/eval/LanguageCrossEntropy",
                           "loss/train/total",                "metrics/eval/LanguagePerplexity",
                           "metrics/eval/BinaryF1Score",       "metrics/eval/error_rate",
                           "metrics/eval/cross_entropy",       "metrics/train/Accuracy"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char spec[256];
        snprintf(spec, sizeof spec, "%s=0.5", names[i]);
        cm_target t;
        cr_assert_eq(cm_target_parse(spec, &t), CM_OK, "%s: %s", spec, cm_last_error());
        cr_expect_str_eq(t.metric, names[i]);
        cr_expect_eq(t.value, 0.5);
        cr_expect(!t.dir_forced);
        const cm_target_dir want = cm_comp_for_metric(names[i]) == CM_COMP_LESS ? CM_TARGET_AT_MOST : CM_TARGET_AT_LEAST;
        cr_expect_eq(t.dir, want, "%s: direction %d, Composer's stoppers say %d", names[i], t.dir, want);
    }
    cm_target t;
    cr_assert_eq(cm_target_parse("metrics/eval/MulticlassAccuracy=0.85", &t), CM_OK);
    cr_expect_eq(t.dir, CM_TARGET_AT_LEAST);
    cr_assert_eq(cm_target_parse("loss/train/total=1.5", &t), CM_OK);
    cr_expect_eq(t.dir, CM_TARGET_AT_MOST);
}

Test(target, less_equal_and_greater_equal_force_the_direction) {
    cm_target t;
    cr_assert_eq(cm_target_parse("metrics/eval/MulticlassAccuracy<=0.2", &t), CM_OK);
    cr_expect_str_eq(t.metric, "metrics/eval/MulticlassAccuracy");
    cr_expect(t.dir == CM_TARGET_AT_MOST && t.dir_forced && t.value == 0.2);
    cr_assert_eq(cm_target_parse("loss/train/total >= 3", &t), CM_OK);
    cr_expect_str_eq(t.metric, "loss/train/total");
    cr_expect(t.dir == CM_TARGET_AT_LEAST && t.dir_forced && t.value == 3);
    /* reached is inclusive, NaN never reaches */
    cr_expect(cm_target_reached(&t, 3.0) && cm_target_reached(&t, 4.0) && !cm_target_reached(&t, 2.999));
    cr_expect(!cm_target_reached(&t, NAN));
    cr_assert_eq(cm_target_parse("x<=1", &t), CM_OK);
    cr_expect(cm_target_reached(&t, 1.0) && !cm_target_reached(&t, 1.0000001) && !cm_target_reached(&t, NAN));
}

Test(target, bad_specs_are_named_with_the_fix) {
    struct {
        const char *spec, *want;
    } cases[] = {
        {"metrics/eval/MulticlassAccuracy", "no '=', '<=' or '>='"},
        {"=0.85", "the metric's name is empty"},
        {"<=0.85", "the metric's name is empty"},
        {"metrics/eval/MulticlassAccuracy=", "is not a finite number"},
        {"metrics/eval/MulticlassAccuracy=high", "value 'high' is not a finite number"},
        {"metrics/eval/MulticlassAccuracy=0.85x", "is not a finite number"},
        {"metrics/eval/MulticlassAccuracy=nan", "is not a finite number"},
        {"metrics/eval/MulticlassAccuracy=inf", "is not a finite number"},
        {"metrics/eval/MulticlassAccuracy=1e999", "is not a finite number"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cm_target t;
        cr_expect_eq(cm_target_parse(cases[i].spec, &t), CM_ERR_INVALID_ARG, "'%s' was accepted", cases[i].spec);
        cr_expect(strstr(cm_last_error(), cases[i].want) && strstr(cm_last_error(), cases[i].spec),
                  "'%s': message lacks '%s' or the spec: %s", cases[i].spec, cases[i].want, cm_last_error());
    }
    char longname[400];
    memset(longname, 'a', 300);
    strcpy(longname + 300, "=1");
    cm_target t;
    cr_expect_eq(cm_target_parse(longname, &t), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "longer than"), "%s", cm_last_error());
}

/* ---------------------------------------------------------------------------------------------
 * Curves from metrics files
 * ------------------------------------------------------------------------------------------- */

/* A metrics file as a run writes it: the clock at every batch end, eval lines after some. */
typedef struct {
    int64_t batch;
    const char *name;
    double value;
} rec;

static void write_file(const char *path, const rec *r, size_t n) {
    cm_metrics_file *f;
    cr_assert_eq(cm_metrics_file_open(path, false, &f), CM_OK, "%s", cm_last_error());
    for (size_t i = 0; i < n; i++) {
        const char *names[] = {r[i].name};
        cr_assert_eq(cm_metrics_file_write(f, r[i].batch, 0, names, &r[i].value, 1), CM_OK, "%s", cm_last_error());
    }
    cr_assert_eq(cm_metrics_file_close(f), CM_OK);
}

#define CLK "wall_clock/train"
#define ACC "metrics/eval/MulticlassAccuracy"
#define CE "metrics/eval/LanguageCrossEntropy"

TestSuite(curve, .init = setup);

Test(curve, the_first_crossing_is_timed_at_its_batch_clock_not_a_later_one) {
    /* clock 0.5 s per batch; accuracy at batches 2, 4, 6, 8: 0.5, 0.85 (exactly the target), 0.8, 0.9 */
    rec r[] = {{1, CLK, 0.5}, {1, "loss/train/total", 2.0}, {2, CLK, 1.0}, {2, ACC, 0.5},  {3, CLK, 1.5},
               {4, CLK, 2.0}, {4, ACC, 0.85},               {5, CLK, 2.5}, {6, CLK, 3.0},  {6, ACC, 0.8},
               {7, CLK, 3.5}, {8, CLK, 4.0},                {8, ACC, 0.9}, {9, CLK, 4.25}};
    write_file(DIR "/a.jsonl", r, sizeof r / sizeof *r);
    cm_quality_curve *c;
    cr_assert_eq(cm_quality_curve_read(DIR "/a.jsonl", ACC, CLK, 1.0, &c), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_quality_curve_n(c), 4);
    const int64_t wb[] = {2, 4, 6, 8};
    const double ws[] = {1.0, 2.0, 3.0, 4.0}, wv[] = {0.5, 0.85, 0.8, 0.9};
    for (int i = 0; i < 4; i++) {
        int64_t b;
        double s, v;
        cm_quality_curve_point(c, i, &b, &s, &v);
        cr_expect(b == wb[i] && s == ws[i] && v == wv[i], "point %d: (%lld, %g, %g), want (%lld, %g, %g)", i,
                  (long long)b, s, v, (long long)wb[i], ws[i], wv[i]);
    }
    cr_expect_eq(cm_quality_curve_end_seconds(c), 4.25);
    cr_expect_eq(cm_quality_curve_end_batch(c), 9);
    cm_target t;
    cm_target_parse(ACC "=0.85", &t);
    cm_target_hit h;
    cm_quality_curve_time_to_target(c, &t, &h);
    cr_expect(h.reached && h.batch == 4 && h.seconds == 2.0, "hit: reached %d batch %lld at %g s", h.reached,
              (long long)h.batch, h.seconds);
    cr_expect(h.final == 0.9 && h.best == 0.9, "final %g best %g", h.final, h.best);
    /* a stricter target: the last point */
    cm_target_parse(ACC "=0.88", &t);
    cm_quality_curve_time_to_target(c, &t, &h);
    cr_expect(h.reached && h.batch == 8 && h.seconds == 4.0);
    /* never reached: no batch, no time; the final and best values still reported */
    cm_target_parse(ACC "=0.95", &t);
    cm_quality_curve_time_to_target(c, &t, &h);
    cr_expect(!h.reached && h.batch == -1 && isnan(h.seconds) && h.final == 0.9 && h.best == 0.9);
    /* forced the other way: at most 0.6 is reached at once (0.5 at batch 2) */
    cm_target_parse(ACC "<=0.6", &t);
    cm_quality_curve_time_to_target(c, &t, &h);
    cr_expect(h.reached && h.batch == 2 && h.seconds == 1.0 && h.best == 0.5);
    cm_quality_curve_free(c);
}

Test(curve, losses_go_down_nan_never_counts_and_a_missing_batch_clock_takes_the_last_before) {
    /* eval at batch 3 has no clock of its own (its clock line is missing): the one of batch 2 */
    rec r[] = {{1, CLK, 10}, {2, CLK, 20}, {2, CE, 3.0}, {3, CE, NAN}, {4, CLK, 40}, {4, CE, 1.9}, {5, CLK, 50}};
    write_file(DIR "/b.jsonl", r, sizeof r / sizeof *r);
    cm_quality_curve *c;
    cr_assert_eq(cm_quality_curve_read(DIR "/b.jsonl", CE, CLK, 1.0, &c), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_quality_curve_n(c), 3);
    double s;
    cm_quality_curve_point(c, 1, NULL, &s, NULL);
    cr_expect_eq(s, 20.0);
    cm_target t;
    cm_target_parse(CE "=2.0", &t);
    cr_expect_eq(t.dir, CM_TARGET_AT_MOST);
    cm_target_hit h;
    cm_quality_curve_time_to_target(c, &t, &h);
    cr_expect(h.reached && h.batch == 4 && h.seconds == 40.0, "batch %lld at %g", (long long)h.batch, h.seconds);
    cr_expect_eq(h.best, 1.9);
    cm_quality_curve_free(c);
    /* the clock in hours, scaled to seconds */
    cr_assert_eq(cm_quality_curve_read(DIR "/b.jsonl", CE, CLK, 3600.0, &c), CM_OK);
    cm_quality_curve_time_to_target(c, &t, &h);
    cr_expect_eq(h.seconds, 40.0 * 3600);
    cm_quality_curve_free(c);
}

Test(curve, a_resumed_run_keeps_the_run_that_continued) {
    /* batches 1-4, then resumed from batch 2: the first run's eval at 4 (0.9, reached) is gone */
    rec r[] = {{1, CLK, 1}, {2, CLK, 2}, {2, ACC, 0.5}, {3, CLK, 3}, {4, CLK, 4}, {4, ACC, 0.9},
               {3, CLK, 13}, {4, CLK, 14}, {4, ACC, 0.7}, {5, CLK, 15}, {6, CLK, 16}, {6, ACC, 0.91}};
    write_file(DIR "/c.jsonl", r, sizeof r / sizeof *r);
    cm_quality_curve *c;
    cr_assert_eq(cm_quality_curve_read(DIR "/c.jsonl", ACC, CLK, 1.0, &c), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_quality_curve_n(c), 3);
    cm_target t;
    cm_target_parse(ACC "=0.9", &t);
    cm_target_hit h;
    cm_quality_curve_time_to_target(c, &t, &h);
    cr_expect(h.reached && h.batch == 6 && h.seconds == 16.0, "batch %lld at %g", (long long)h.batch, h.seconds);
    double s;
    cm_quality_curve_point(c, 1, NULL, &s, NULL);
    cr_expect_eq(s, 14.0, "the eval at batch 4 of the continued run is timed by its own clock, got %g", s);
    cm_quality_curve_free(c);
}

Test(curve, no_clock_or_no_metric_is_an_error_that_says_what_to_add) {
    rec noclock[] = {{1, "loss/train/total", 2}, {2, ACC, 0.5}};
    write_file(DIR "/d.jsonl", noclock, 2);
    cm_quality_curve *c = (cm_quality_curve *)1;
    cr_expect_eq(cm_quality_curve_read(DIR "/d.jsonl", ACC, CLK, 1.0, &c), CM_ERR_NOT_FOUND);
    cr_expect_null(c);
    cr_expect(strstr(cm_last_error(), "d.jsonl:2") && strstr(cm_last_error(), "speed_monitor"), "%s", cm_last_error());
    rec nometric[] = {{1, CLK, 1}, {1, "loss/train/total", 2}, {2, "metrics/eval/MulticlassAccuracy", 0.5}};
    write_file(DIR "/e.jsonl", nometric, 3);
    cr_expect_eq(cm_quality_curve_read(DIR "/e.jsonl", "metrics/eval/Accuracy", CLK, 1.0, &c), CM_ERR_NOT_FOUND);
    cr_expect(strstr(cm_last_error(), "'metrics/eval/Accuracy' is never logged") &&
                  strstr(cm_last_error(), "metrics/eval/MulticlassAccuracy"),
              "%s", cm_last_error());
    rec nothing[] = {{1, "loss/train/total", 2}};
    write_file(DIR "/f.jsonl", nothing, 1);
    cr_expect_eq(cm_quality_curve_read(DIR "/f.jsonl", ACC, CLK, 1.0, &c), CM_ERR_NOT_FOUND);
    cr_expect(strstr(cm_last_error(), "speed_monitor") && strstr(cm_last_error(), "loss/train/total"), "%s",
              cm_last_error());
    cr_expect_eq(cm_quality_curve_read(DIR "/missing.jsonl", ACC, CLK, 1.0, &c), CM_ERR_IO);
    cr_expect(strstr(cm_last_error(), "missing.jsonl"), "%s", cm_last_error());
    cr_expect_eq(cm_quality_curve_read(DIR "/f.jsonl", ACC, CLK, 0.0, &c), CM_ERR_INVALID_ARG);
}

/* ---------------------------------------------------------------------------------------------
 * Statistics and speed-ups
 * ------------------------------------------------------------------------------------------- */

Test(stats, mean_sample_std_min_max_by_hand) {
    const double x[] = {2, 4, 4, 4, 5, 5, 7, 9};
    cm_sample_stats s = cm_sample_stats_of(x, 8);
    cr_expect(s.n == 8 && s.mean == 5 && s.min == 2 && s.max == 9);
    cr_expect(fabs(s.std - sqrt(32.0 / 7.0)) < 1e-15, "std %.17g, want sqrt(32/7) (n - 1)", s.std);
    s = cm_sample_stats_of(x + 6, 1);
    cr_expect(s.mean == 7 && s.std == 0 && s.min == 7 && s.max == 7);
    s = cm_sample_stats_of(x, 0);
    cr_expect(s.n == 0 && isnan(s.mean) && isnan(s.std));
}

Test(stats, speedup_is_the_ratio_of_means_with_the_per_seed_spread) {
    const double base[] = {10, 20}, rec_[] = {5, 5};
    cm_speedup sp;
    cr_assert_eq(cm_speedup_compute(base, rec_, 2, &sp), CM_OK, "%s", cm_last_error());
    cr_expect_eq(sp.ratio, 3.0, "30 s / 10 s");
    cr_expect(sp.per_seed.mean == 3.0 && sp.per_seed.min == 2.0 && sp.per_seed.max == 4.0);
    cr_expect(fabs(sp.per_seed.std - sqrt(2.0)) < 1e-15, "per-seed ratios 2 and 4: std %.17g", sp.per_seed.std);
    const double bad[] = {5, NAN};
    cr_expect_eq(cm_speedup_compute(base, bad, 2, &sp), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "seed 1") && strstr(cm_last_error(), "did not reach"), "%s", cm_last_error());
    const double zero[] = {0, 1};
    cr_expect_eq(cm_speedup_compute(zero, rec_, 2, &sp), CM_ERR_INVALID_ARG);
    cr_expect_eq(cm_speedup_compute(base, rec_, 0, &sp), CM_ERR_INVALID_ARG);
}

/* ---------------------------------------------------------------------------------------------
 * The trainer's wall-clock, which time to target is read from
 * ------------------------------------------------------------------------------------------- */

typedef struct {
    double after_dataloader_s, eval_s;
    int batches, evals;
} sleeper;

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    nanosleep(&ts, NULL);
}

static cm_status sleeper_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    (void)st, (void)lg;
    sleeper *z = self;
    if (ev == CM_EVENT_AFTER_DATALOADER) sleep_s(z->after_dataloader_s), z->batches++;
    if (ev == CM_EVENT_EVAL_START) sleep_s(z->eval_s), z->evals++;
    return CM_OK;
}

static const cm_callback_i k_sleeper = {CM_CALLBACK_ABI, "Sleeper", sleeper_event, NULL, NULL, NULL, NULL};

Test(trainer_clock, counts_data_side_work_and_pauses_during_evaluation) {
    sleeper z = {.after_dataloader_s = 0.03, .eval_s = 1.0};
    cm_callback_plugin cb = {&k_sleeper, &z};
    cm_dataset *ds = cmt_synth_dataset(48, 8, 3, false, NULL), *eds = cmt_synth_dataset(16, 8, 3, false, NULL);
    cm_dataloader *dl = cmt_loader(ds, 8, false, 7), *edl = cmt_loader(eds, 16, true, 0);
    cm_model *m = cmt_mlp(8, 16, 3, 0, 3);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = m;
    c.train_dataloader = dl;
    c.eval_dataloader = edl;
    cr_assert_eq(cm_time_parse("6ba", &c.max_duration), CM_OK);
    cr_assert_eq(cm_time_parse("2ba", &c.eval_interval), CM_OK);
    c.callbacks = &cb;
    c.n_callbacks = 1;
    cm_trainer *tr;
    cr_assert_eq(cm_trainer_new(&c, &tr), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_fit(tr, NULL), CM_OK, "%s", cm_last_error());
    const double wct = cm_state_timestamp(cm_trainer_state(tr))->total_wct;
    cr_assert_eq(z.batches, 6);
    cr_assert_eq(z.evals, 3);
    /* 6 × 30 ms of AFTER_DATALOADER work is training time; the second of each evaluation is not
     * (the evaluations after batches 2 and 4 would add two seconds; any one of them, one; the bound
     * leaves a loaded machine 0.8 s for six steps of a tiny MLP) */
    cr_expect(wct >= 6 * 0.03, "total_wct %.3f s leaves out the %.2f s spent on AFTER_DATALOADER", wct, 6 * 0.03);
    cr_expect(wct < 1.0, "total_wct %.3f s counts evaluation time (1 s per evaluation)", wct);
    cm_trainer_free(tr);
    cm_model_free(m);
    cm_dataloader_free(dl);
    cm_dataloader_free(edl);
    cm_dataset_free(ds);
    cm_dataset_free(eds);
}
