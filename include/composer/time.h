/*
 * composer/time.h — training time, as Composer counts it: Time (an amount in one unit) and
 * Timestamp (how far a run has come, in every unit at once).
 *
 * A cm_time is a value with a unit: epochs "ep", batches "ba", samples "sp", tokens "tok",
 * iterations "iter", wall-clock seconds "sec", or a fraction of the whole run "dur". Strings
 * follow Composer: "<number><unit>", where the number may have a fraction or an exponent
 * ("10ba", "3ep", "0.25dur", "3e4tok", "1.5e2sp"), and wall-clock times may also be written as
 * days/hours/minutes/seconds ("1h30m", "90s", "2h", "1d2h3m4s"). Units are case-insensitive.
 * Every unit except dur counts whole things, so "1.5ba" is an error; "dur" takes any fraction
 * ≥ 0. Times compare, add and subtract only within one unit: mixing units is an error that names
 * both. Times are small plain values: pass and return them by value.
 *
 * A cm_timestamp is transparent plain data. Zero-initialise it (`cm_timestamp ts = {0};`) at the
 * start of training and advance it with cm_timestamp_next_batch / _next_epoch / _next_iteration.
 * Samples and tokens count across all ranks: pass the global batch's totals.
 *
 *     cm_time max_dur, warm;
 *     if (cm_time_parse("2ep", &max_dur) != CM_OK || cm_time_parse("0.1dur", &warm) != CM_OK)
 *         fprintf(stderr, "error: %s\n", cm_last_error());
 *     cm_timestamp ts = {0};
 *     cm_timestamp_next_batch(&ts, 64, 64 * 512, 0.25);   // 64 samples, 32768 tokens, 0.25 s
 *     double frac;
 *     cm_timestamp_elapsed(&ts, max_dur, 100, &frac);      // 100 batches per epoch -> 1/200
 *     char buf[CM_TIME_STR_MAX];
 *     cm_time_to_string(cm_time_make(10, CM_TIME_BATCH), buf, sizeof buf);   // "10ba"
 *
 * Differences from Composer, on purpose:
 *  - Wall-clock strings accept any whole number per part and a day part ("90m", "1d2h"); Composer
 *    goes through strptime and rejects minutes or seconds ≥ 60.
 *  - Negative numbers are rejected when parsing (Composer's regex allows "-3ba").
 */
#ifndef COMPOSER_TIME_H
#define COMPOSER_TIME_H

#include <composer/base.h>

#ifdef __cplusplus
extern "C" {
#endif

/* X-macro list: enum name, suffix, long name. Generates the enum and the name tables. */
#define CM_TIME_UNIT_LIST(X)                           \
    X(CM_TIME_EPOCH, "ep", "epoch")                    \
    X(CM_TIME_BATCH, "ba", "batch")                    \
    X(CM_TIME_SAMPLE, "sp", "sample")                  \
    X(CM_TIME_TOKEN, "tok", "token")                   \
    X(CM_TIME_DURATION, "dur", "duration")             \
    X(CM_TIME_ITERATION, "iter", "iteration")          \
    X(CM_TIME_SECOND, "sec", "second")

typedef enum cm_time_unit {
#define CM_X_(name, suffix, long_name) name,
    CM_TIME_UNIT_LIST(CM_X_)
#undef CM_X_
    CM_TIME_UNIT_COUNT
} cm_time_unit;

/* An amount of training time. For every unit but CM_TIME_DURATION the amount is `count` (a whole
 * number) and `frac` is 0; for CM_TIME_DURATION it is `frac` (fraction of the run) and `count`
 * is 0. Build with cm_time_make / cm_time_dur / cm_time_parse rather than by hand. */
typedef struct cm_time {
    cm_time_unit unit;
    int64_t count;
    double frac;
} cm_time;

/* Room for any cm_time_to_string result, NUL included. */
#define CM_TIME_STR_MAX 48

/* The unit's suffix ("ba") and long name ("batch"); "?" for values out of range. */
const char *cm_time_unit_name(cm_time_unit u);
const char *cm_time_unit_long_name(cm_time_unit u);

/* Parses a suffix ("ba") or long name ("batch"), case-insensitive. CM_ERR_INVALID_ARG otherwise,
 * with a message that lists the units. */
cm_status cm_time_unit_parse(const char *s, cm_time_unit *out);

/* A time of `count` in an integer unit. For CM_TIME_DURATION use cm_time_dur. */
cm_time cm_time_make(int64_t count, cm_time_unit unit);
/* A fraction of the run ("0.25dur" is cm_time_dur(0.25)). */
cm_time cm_time_dur(double fraction);

/* The amount as a double: `count` for integer units, `frac` for duration. */
double cm_time_value(cm_time t);

/* Parses a time string (see the overview). Errors (CM_ERR_INVALID_ARG, `out` untouched) name the
 * string and the fix: unknown unit (the message lists ep, ba, sp, tok, dur, iter, sec with
 * examples), missing or malformed number, a fraction or an out-of-range value in an integer unit,
 * a negative value, a NULL string. Thread-safe. */
cm_status cm_time_parse(const char *s, cm_time *out);

/* Same, but error messages start with `what` (e.g. "save_interval") instead of "time", so a
 * config error reads "save_interval '3xx': unknown unit 'xx' (...)". */
cm_status cm_time_parse_named(const char *what, const char *s, cm_time *out);

/* Writes the canonical string ("10ba", "0.25dur", "5400sec") into buf (cap bytes, NUL included;
 * CM_TIME_STR_MAX always suffices). Returns the length it needed, like snprintf. Parsing the
 * result gives the same time back (duration uses the shortest round-trip form, "%.17g"). */
int cm_time_to_string(cm_time t, char *buf, size_t cap);

/* a + b and a - b in one unit. Different units: CM_ERR_INVALID_ARG naming both times. Integer
 * overflow: CM_ERR_INVALID_ARG. The result of a subtraction may be negative. */
cm_status cm_time_add(cm_time a, cm_time b, cm_time *out);
cm_status cm_time_sub(cm_time a, cm_time b, cm_time *out);

/* Compares a and b in one unit: *out is -1, 0 or 1. Different units: CM_ERR_INVALID_ARG naming
 * both times. */
cm_status cm_time_cmp(cm_time a, cm_time b, int *out);

/* ---------------------------------------------------------------------------------------------
 * Timestamp
 * ------------------------------------------------------------------------------------------- */

/* How far training has come. Counts are totals since the start of training unless named
 * *_in_epoch / *_in_iteration. Samples and tokens are global (summed over ranks). Wall-clock
 * fields are seconds: total_wct since the start, iteration_wct / epoch_wct within the current
 * iteration / epoch, batch_wct of the last batch. A zeroed struct is the start of training. The
 * trainer counts, as Composer does, the time from one batch's end to the next (data loading,
 * algorithms, the step, checkpoints) and pauses the clock while it evaluates. */
typedef struct cm_timestamp {
    int64_t iteration;
    int64_t epoch;
    int64_t batch;
    int64_t sample;
    int64_t token;
    int64_t epoch_in_iteration;
    int64_t token_in_iteration;
    int64_t batch_in_epoch;
    int64_t sample_in_epoch;
    int64_t token_in_epoch;
    double total_wct;
    double iteration_wct;
    double epoch_wct;
    double batch_wct;
} cm_timestamp;

/* Advances past one trained batch of `samples` samples and `tokens` tokens (global totals over
 * all ranks) that took `seconds`: batch and batch_in_epoch +1; sample, sample_in_epoch, token,
 * token_in_epoch, token_in_iteration grow; total/iteration/epoch wall-clock grow; batch_wct is
 * set to `seconds`. Matches Composer's Timestamp.to_next_batch. */
void cm_timestamp_next_batch(cm_timestamp *ts, int64_t samples, int64_t tokens, double seconds);

/* Advances to the next epoch: epoch and epoch_in_iteration +1; batch/sample/token_in_epoch, epoch
 * and batch wall-clock reset to 0; `seconds` (time since the last batch) is added to the total
 * and iteration wall-clock. Matches Composer's Timestamp.to_next_epoch. */
void cm_timestamp_next_epoch(cm_timestamp *ts, double seconds);

/* Advances to the next iteration: iteration +1; epoch_in_iteration, token_in_iteration, the
 * *_in_epoch counts and the iteration/epoch/batch wall-clock reset to 0; `seconds` is added to
 * total_wct. Matches Composer's Timestamp.to_next_iteration. */
void cm_timestamp_next_iteration(cm_timestamp *ts, double seconds);

/* The timestamp's total in `unit` (epoch, batch, sample, token, iteration; "sec" gives whole
 * seconds of total_wct, rounded down, as Composer does). CM_TIME_DURATION needs the run's length:
 * CM_ERR_INVALID_ARG pointing to cm_timestamp_elapsed. */
cm_status cm_timestamp_get(const cm_timestamp *ts, cm_time_unit unit, cm_time *out);

/* Compares the timestamp with a time in its unit (ts.get(t.unit) vs t): *out is -1, 0 or 1.
 * So "has training reached 3ep" is cmp ≥ 0. Duration: CM_ERR_INVALID_ARG as for _get. */
cm_status cm_timestamp_cmp(const cm_timestamp *ts, cm_time t, int *out);

/* The fraction of `max_duration` elapsed: ts.get(max_duration.unit) / max_duration (may exceed
 * 1 after the end). For a max_duration in epochs and batches_per_epoch > 0, the fraction is
 * counted in batches (batch / (epochs · batches_per_epoch)), so it moves every batch rather than
 * jumping at epoch ends (Composer's State.get_elapsed_duration counts whole epochs; pass
 * batches_per_epoch = 0 for that). For a max_duration in sec the fraction uses total_wct
 * unrounded. Errors (CM_ERR_INVALID_ARG): max_duration in dur, or ≤ 0. */
cm_status cm_timestamp_elapsed(const cm_timestamp *ts, cm_time max_duration, int64_t batches_per_epoch,
                               double *out);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_TIME_H */
