/*
 * composer/time_to_target.h — time to quality, the way Composer measures its speed-ups: the
 * wall-clock training time at which a run's quality metric first reaches a target, read from the
 * run's metrics file (composer/report.h), and the mean, spread and speed-up over seeds. The
 * `composer recipe compare` command is built on it; programs may use it on any metrics.jsonl.
 *
 * A run's clock is a metric logged at every batch end — SpeedMonitor's "wall_clock/train"
 * (composer/callbacks.h), the timestamp's total_wct: training time with evaluation paused. The
 * quality metric is usually an evaluation metric, logged at the batch it was computed after; its
 * time is the clock at that batch.
 *
 *     cm_target t;
 *     if (cm_target_parse("metrics/eval/LanguageCrossEntropy<=1.9", &t) != CM_OK) { ... }
 *     cm_quality_curve *c;
 *     if (cm_quality_curve_read("runs/gpt/metrics.jsonl", t.metric, "wall_clock/train", 1.0, &c)) { ... }
 *     cm_target_hit hit;
 *     cm_quality_curve_time_to_target(c, &t, &hit);
 *     if (hit.reached) printf("reached at batch %lld after %.1f s\n", (long long)hit.batch, hit.seconds);
 *     cm_quality_curve_free(c);
 *
 * Thread-safety: a curve is used from one thread at a time; the other functions are thread-safe.
 */
#ifndef COMPOSER_TIME_TO_TARGET_H
#define COMPOSER_TIME_TO_TARGET_H

#include <composer/base.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Which way a metric improves. */
typedef enum cm_target_dir {
    CM_TARGET_AT_MOST = 0, /* reached when value <= target (losses, cross-entropy, perplexity, error) */
    CM_TARGET_AT_LEAST = 1 /* reached when value >= target (accuracy, F1, ...) */
} cm_target_dir;

/* Room for a metric name in a target, NUL included. */
#define CM_TARGET_METRIC_MAX 160

typedef struct cm_target {
    char metric[CM_TARGET_METRIC_MAX]; /* the metric's name in the metrics file */
    double value;
    cm_target_dir dir;
    bool dir_forced; /* written with <= or >= rather than decided from the name */
} cm_target;

/* Parses "METRIC=VALUE", "METRIC<=VALUE" or "METRIC>=VALUE". With '=' the direction follows the
 * metric's name as Composer's stoppers decide it (callbacks.h cm_comp_for_metric): at most for names
 * containing loss, error, perplexity or cross-entropy, at least for everything else; '<=' / '>='
 * force it. VALUE is a finite number. Errors: CM_ERR_INVALID_ARG naming the spec and what is wrong
 * (no operator, an empty name, a name longer than CM_TARGET_METRIC_MAX - 1, a value that is not a
 * finite number). */
cm_status cm_target_parse(const char *spec, cm_target *out);

/* Whether `value` reaches the target (NaN never does). */
bool cm_target_reached(const cm_target *t, double value);

/* The quality of one run against its clock: the metric's points in file order (batch, the clock at
 * that batch in seconds, value), and the run's last clock reading. Opaque; read with the getters. */
typedef struct cm_quality_curve cm_quality_curve;

/* Reads `metric` and the clock metric `clock_key` from a metrics file (cm_metrics_file_read). Each
 * point of `metric` gets the clock logged at the same batch (the latest one logged at or before it
 * when that batch has none); clock values are multiplied by `clock_scale` (1 for seconds, 3600
 * when the clock was logged in hours). A batch that goes backwards (a resumed run re-logging
 * batches) drops the earlier points at or after it, as the plots do. Errors: those of reading the
 * file; CM_ERR_NOT_FOUND when the file never logs `metric` (naming some metrics it does log) or
 * logs it before any clock reading (naming `clock_key` and callbacks.speed_monitor, which logs it);
 * CM_ERR_INVALID_ARG for NULL arguments or a scale that is not positive and finite; CM_ERR_OOM.
 * The caller frees the curve with cm_quality_curve_free. */
cm_status cm_quality_curve_read(const char *jsonl_path, const char *metric, const char *clock_key, double clock_scale,
                                cm_quality_curve **out);
void cm_quality_curve_free(cm_quality_curve *c);

/* The number of points, and point i (0 <= i < n; any of the outputs may be NULL). */
int64_t cm_quality_curve_n(const cm_quality_curve *c);
void cm_quality_curve_point(const cm_quality_curve *c, int64_t i, int64_t *batch, double *seconds, double *value);
/* The last clock reading of the run in seconds (where it stopped), and its batch. */
double cm_quality_curve_end_seconds(const cm_quality_curve *c);
int64_t cm_quality_curve_end_batch(const cm_quality_curve *c);

/* Where a curve first reaches a target. When not reached, batch is -1 and seconds NaN; `final` is
 * the last point's value either way (NaN for an empty curve), `best` the best value seen. */
typedef struct cm_target_hit {
    bool reached;
    int64_t batch;
    double seconds;
    double final, best;
} cm_target_hit;

void cm_quality_curve_time_to_target(const cm_quality_curve *c, const cm_target *t, cm_target_hit *out);

/* Summary of n samples: mean, sample standard deviation (n - 1 in the denominator; 0 for one
 * sample), min and max. n = 0 gives NaN everywhere. NaN samples are not skipped: they make the
 * summary NaN. */
typedef struct cm_sample_stats {
    int64_t n;
    double mean, std, min, max;
} cm_sample_stats;

cm_sample_stats cm_sample_stats_of(const double *x, int64_t n);

/* The speed-up of a recipe over a baseline from their times to target over the same seeds:
 * `ratio` = mean(baseline) / mean(recipe), and the per-seed ratios baseline[i] / recipe[i]
 * summarised in `per_seed` (their spread is the speed-up's spread). Every time must be a positive
 * finite number (a run that never reached the target has no time: leave it out, and say so, rather
 * than pass a bound). Errors: CM_ERR_INVALID_ARG for n < 1, NULL, or a time that is not positive
 * and finite, naming its index. */
typedef struct cm_speedup {
    double ratio;
    cm_sample_stats per_seed;
} cm_speedup;

cm_status cm_speedup_compute(const double *baseline, const double *recipe, int64_t n, cm_speedup *out);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_TIME_TO_TARGET_H */
