/* Time and Timestamp (see include/composer/time.h): parsing, printing, arithmetic, and advancing
 * a timestamp. */
#include <composer/time.h>

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const unit_suffix[] = {
#define CM_X_(name, suffix, long_name) suffix,
    CM_TIME_UNIT_LIST(CM_X_)
#undef CM_X_
};
static const char *const unit_long[] = {
#define CM_X_(name, suffix, long_name) long_name,
    CM_TIME_UNIT_LIST(CM_X_)
#undef CM_X_
};
static const char *const unit_plural[] = {"epochs", "batches", "samples", "tokens", "fractions", "iterations",
                                          "seconds"};
_Static_assert(sizeof unit_plural / sizeof unit_plural[0] == CM_TIME_UNIT_COUNT, "plural table");
_Static_assert(sizeof unit_suffix / sizeof unit_suffix[0] == CM_TIME_UNIT_COUNT, "unit table");

#define UNIT_HELP "use ep, ba, sp, tok, dur, iter or sec, e.g. '10ba', '0.5dur', '1h30m'"

/* Whole-unit values must stay exact as doubles (the schedulers compute in double). */
#define MAX_COUNT_FROM_FLOAT 9007199254740992.0 /* 2^53 */

const char *cm_time_unit_name(cm_time_unit u) {
    return (unsigned)u < CM_TIME_UNIT_COUNT ? unit_suffix[u] : "?";
}

const char *cm_time_unit_long_name(cm_time_unit u) {
    return (unsigned)u < CM_TIME_UNIT_COUNT ? unit_long[u] : "?";
}

static bool unit_lookup(const char *s, size_t len, bool allow_long, cm_time_unit *out) {
    for (int u = 0; u < CM_TIME_UNIT_COUNT; u++) {
        if (strlen(unit_suffix[u]) == len && strncasecmp(s, unit_suffix[u], len) == 0) {
            *out = (cm_time_unit)u;
            return true;
        }
        if (allow_long && strlen(unit_long[u]) == len && strncasecmp(s, unit_long[u], len) == 0) {
            *out = (cm_time_unit)u;
            return true;
        }
    }
    return false;
}

cm_status cm_time_unit_parse(const char *s, cm_time_unit *out) {
    if (!s) return cm_set_error(CM_ERR_INVALID_ARG, "time unit: NULL string (" UNIT_HELP ")");
    if (!unit_lookup(s, strlen(s), true, out))
        return cm_set_error(CM_ERR_INVALID_ARG, "time unit '%s': unknown (use ep, ba, sp, tok, dur, iter or sec)", s);
    return CM_OK;
}

cm_time cm_time_make(int64_t count, cm_time_unit unit) {
    cm_time t = {unit, count, 0.0};
    if (unit == CM_TIME_DURATION) {
        t.count = 0;
        t.frac = (double)count;
    }
    return t;
}

cm_time cm_time_dur(double fraction) {
    cm_time t = {CM_TIME_DURATION, 0, fraction};
    return t;
}

double cm_time_value(cm_time t) { return t.unit == CM_TIME_DURATION ? t.frac : (double)t.count; }

/* "1d2h3m4s": whole numbers, each part at most once, in this order. Returns false when `s` is not
 * of this form (the caller then tries "<number><unit>"); sets *overflow when it is but too big. */
static bool parse_wallclock(const char *s, int64_t *seconds, bool *overflow) {
    static const char parts[] = "dhms";
    static const int64_t mult[] = {86400, 3600, 60, 1};
    int last = -1;
    int64_t total = 0;
    const char *p = s;
    *overflow = false;
    while (*p) {
        if (!isdigit((unsigned char)*p)) return false;
        int64_t v = 0;
        while (isdigit((unsigned char)*p)) {
            if (v > (INT64_MAX - 9) / 10) *overflow = true;
            else v = v * 10 + (*p - '0');
            p++;
        }
        const char *k = *p ? strchr(parts, tolower((unsigned char)*p)) : NULL;
        if (!k) return false;
        int idx = (int)(k - parts);
        if (idx <= last) return false;
        last = idx;
        p++;
        if (v > (INT64_MAX - total) / mult[idx]) *overflow = true;
        else total += v * mult[idx];
    }
    *seconds = total;
    return last >= 0;
}

cm_status cm_time_parse_named(const char *what, const char *s, cm_time *out) {
    if (!what) what = "time";
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "%s: NULL output", what);
    if (!s) return cm_set_error(CM_ERR_INVALID_ARG, "%s: NULL string (" UNIT_HELP ")", what);
    if (!*s) return cm_set_error(CM_ERR_INVALID_ARG, "%s '': empty (" UNIT_HELP ")", what);

    int64_t secs;
    bool overflow;
    if (parse_wallclock(s, &secs, &overflow)) {
        if (overflow) return cm_set_error(CM_ERR_INVALID_ARG, "%s '%s': wall-clock time too large", what, s);
        *out = cm_time_make(secs, CM_TIME_SECOND);
        return CM_OK;
    }

    /* <number><unit>: -?digits[.digits][e[+-]digits] */
    const char *p = s;
    bool negative = false, plain = true;
    if (*p == '-' || *p == '+') {
        negative = *p == '-';
        p++;
    }
    int digits = 0;
    while (isdigit((unsigned char)*p)) p++, digits++;
    if (*p == '.') {
        plain = false;
        p++;
        while (isdigit((unsigned char)*p)) p++, digits++;
    }
    if (digits > 0 && (*p == 'e' || *p == 'E')) {
        const char *q = p + 1;
        if (*q == '+' || *q == '-') q++;
        if (isdigit((unsigned char)*q)) {
            while (isdigit((unsigned char)*q)) q++;
            p = q;
            plain = false;
        }
    }
    const char *unit_s = p;
    size_t unit_len = strlen(unit_s);
    cm_time_unit unit;
    bool known = digits > 0 && unit_lookup(unit_s, unit_len, false, &unit);
    if (!known) {
        /* a known unit at the end means the number in front of it is the problem */
        size_t len = strlen(s);
        for (int u = 0; u < CM_TIME_UNIT_COUNT; u++) {
            size_t ul = strlen(unit_suffix[u]);
            if (len >= ul && strcasecmp(s + len - ul, unit_suffix[u]) == 0) {
                if (len == ul)
                    return cm_set_error(CM_ERR_INVALID_ARG, "%s '%s': no number before the unit (write e.g. '10%s')",
                                        what, s, unit_suffix[u]);
                return cm_set_error(CM_ERR_INVALID_ARG,
                                    "%s '%s': malformed number '%.*s' before '%s' (write e.g. '10%s' or '0.5dur')",
                                    what, s, (int)(len - ul), s, unit_suffix[u], unit_suffix[u]);
            }
        }
        if (digits == 0) return cm_set_error(CM_ERR_INVALID_ARG, "%s '%s': not a time (" UNIT_HELP ")", what, s);
    }
    if (unit_len == 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s '%s': no unit after the number (" UNIT_HELP ")", what, s);
    if (!known)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s '%s': unknown unit '%s' (" UNIT_HELP ")", what, s, unit_s);
    if (negative)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s '%s': negative; training time counts up from 0", what, s);

    size_t nlen = (size_t)(unit_s - s);
    char num[64];
    if (nlen >= sizeof num)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s '%s': number too long", what, s);
    memcpy(num, s, nlen);
    num[nlen] = '\0';

    if (unit == CM_TIME_DURATION) {
        double v = strtod(num, NULL);
        if (!isfinite(v)) return cm_set_error(CM_ERR_INVALID_ARG, "%s '%s': fraction out of range", what, s);
        *out = cm_time_dur(v);
        return CM_OK;
    }
    int64_t count;
    if (plain) {
        errno = 0;
        long long v = strtoll(num, NULL, 10);
        if (errno == ERANGE)
            return cm_set_error(CM_ERR_INVALID_ARG, "%s '%s': %s count out of range (at most %" PRId64 ")", what, s,
                                cm_time_unit_name(unit), INT64_MAX);
        count = (int64_t)v;
    } else {
        double v = strtod(num, NULL);
        if (!isfinite(v) || v > MAX_COUNT_FROM_FLOAT)
            return cm_set_error(CM_ERR_INVALID_ARG,
                                "%s '%s': %s count out of range (write it without a fraction or exponent, "
                                "or keep it under 2^53)",
                                what, s, cm_time_unit_name(unit));
        if (v != floor(v))
            return cm_set_error(CM_ERR_INVALID_ARG,
                                "%s '%s': '%s' counts whole %s, got %s (use a whole number, or a fraction of "
                                "the run such as '0.5dur')",
                                what, s, cm_time_unit_name(unit), unit_plural[unit], num);
        count = (int64_t)v;
    }
    *out = cm_time_make(count, unit);
    return CM_OK;
}

cm_status cm_time_parse(const char *s, cm_time *out) { return cm_time_parse_named("time", s, out); }

int cm_time_to_string(cm_time t, char *buf, size_t cap) {
    if (t.unit == CM_TIME_DURATION) {
        char tmp[CM_TIME_STR_MAX];
        /* the shortest precision that reads back to the same double */
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(tmp, sizeof tmp, "%.*g", prec, t.frac);
            if (strtod(tmp, NULL) == t.frac) break;
        }
        return snprintf(buf, cap, "%sdur", tmp);
    }
    return snprintf(buf, cap, "%" PRId64 "%s", t.count, cm_time_unit_name(t.unit));
}

static const char *tstr(cm_time t, char *buf) {
    cm_time_to_string(t, buf, CM_TIME_STR_MAX);
    return buf;
}

static cm_status same_unit(const char *op, cm_time a, cm_time b) {
    if ((unsigned)a.unit >= CM_TIME_UNIT_COUNT || (unsigned)b.unit >= CM_TIME_UNIT_COUNT)
        return cm_set_error(CM_ERR_INVALID_ARG, "time %s: unit out of range (%d, %d)", op, (int)a.unit, (int)b.unit);
    if (a.unit != b.unit) {
        char x[CM_TIME_STR_MAX], y[CM_TIME_STR_MAX];
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "time %s: %s and %s have different units (%s vs %s); convert one first", op,
                            tstr(a, x), tstr(b, y), cm_time_unit_long_name(a.unit), cm_time_unit_long_name(b.unit));
    }
    return CM_OK;
}

static cm_status add_signed(const char *op, cm_time a, cm_time b, int sign, cm_time *out) {
    cm_status st = same_unit(op, a, b);
    if (st != CM_OK) return st;
    if (a.unit == CM_TIME_DURATION) {
        *out = cm_time_dur(a.frac + sign * b.frac);
        return CM_OK;
    }
    int64_t r;
    bool ovf = sign > 0 ? __builtin_add_overflow(a.count, b.count, &r) : __builtin_sub_overflow(a.count, b.count, &r);
    if (ovf) {
        char x[CM_TIME_STR_MAX], y[CM_TIME_STR_MAX];
        return cm_set_error(CM_ERR_INVALID_ARG, "time %s: %s and %s overflow 64 bits", op, tstr(a, x), tstr(b, y));
    }
    *out = cm_time_make(r, a.unit);
    return CM_OK;
}

cm_status cm_time_add(cm_time a, cm_time b, cm_time *out) { return add_signed("add", a, b, 1, out); }
cm_status cm_time_sub(cm_time a, cm_time b, cm_time *out) { return add_signed("subtract", a, b, -1, out); }

cm_status cm_time_cmp(cm_time a, cm_time b, int *out) {
    cm_status st = same_unit("compare", a, b);
    if (st != CM_OK) return st;
    if (a.unit == CM_TIME_DURATION) *out = (a.frac > b.frac) - (a.frac < b.frac);
    else *out = (a.count > b.count) - (a.count < b.count);
    return CM_OK;
}

/* ---- Timestamp ---- */

void cm_timestamp_next_batch(cm_timestamp *ts, int64_t samples, int64_t tokens, double seconds) {
    ts->batch += 1;
    ts->batch_in_epoch += 1;
    ts->sample += samples;
    ts->sample_in_epoch += samples;
    ts->token += tokens;
    ts->token_in_epoch += tokens;
    ts->token_in_iteration += tokens;
    ts->total_wct += seconds;
    ts->iteration_wct += seconds;
    ts->epoch_wct += seconds;
    ts->batch_wct = seconds;
}

void cm_timestamp_next_epoch(cm_timestamp *ts, double seconds) {
    ts->epoch += 1;
    ts->epoch_in_iteration += 1;
    ts->batch_in_epoch = 0;
    ts->sample_in_epoch = 0;
    ts->token_in_epoch = 0;
    ts->total_wct += seconds;
    ts->iteration_wct += seconds;
    ts->epoch_wct = 0.0;
    ts->batch_wct = 0.0;
}

void cm_timestamp_next_iteration(cm_timestamp *ts, double seconds) {
    ts->iteration += 1;
    ts->epoch_in_iteration = 0;
    ts->token_in_iteration = 0;
    ts->batch_in_epoch = 0;
    ts->sample_in_epoch = 0;
    ts->token_in_epoch = 0;
    ts->total_wct += seconds;
    ts->iteration_wct = 0.0;
    ts->epoch_wct = 0.0;
    ts->batch_wct = 0.0;
}

cm_status cm_timestamp_get(const cm_timestamp *ts, cm_time_unit unit, cm_time *out) {
    int64_t v;
    switch (unit) {
    case CM_TIME_EPOCH: v = ts->epoch; break;
    case CM_TIME_BATCH: v = ts->batch; break;
    case CM_TIME_SAMPLE: v = ts->sample; break;
    case CM_TIME_TOKEN: v = ts->token; break;
    case CM_TIME_ITERATION: v = ts->iteration; break;
    case CM_TIME_SECOND: v = (int64_t)floor(ts->total_wct); break;
    case CM_TIME_DURATION:
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "timestamp: a fraction of the run (dur) needs the run's length; use cm_timestamp_elapsed "
                            "with max_duration");
    default: return cm_set_error(CM_ERR_INVALID_ARG, "timestamp: time unit %d out of range", (int)unit);
    }
    *out = cm_time_make(v, unit);
    return CM_OK;
}

cm_status cm_timestamp_cmp(const cm_timestamp *ts, cm_time t, int *out) {
    cm_time now;
    cm_status st = cm_timestamp_get(ts, t.unit, &now);
    if (st != CM_OK) return st;
    return cm_time_cmp(now, t, out);
}

cm_status cm_timestamp_elapsed(const cm_timestamp *ts, cm_time max_duration, int64_t batches_per_epoch,
                               double *out) {
    char buf[CM_TIME_STR_MAX];
    if (max_duration.unit == CM_TIME_DURATION)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "elapsed fraction: max_duration '%s' is itself a fraction; give it in ep, ba, sp, tok, "
                            "iter or sec",
                            tstr(max_duration, buf));
    if ((unsigned)max_duration.unit >= CM_TIME_UNIT_COUNT)
        return cm_set_error(CM_ERR_INVALID_ARG, "elapsed fraction: time unit %d out of range", (int)max_duration.unit);
    if (max_duration.count <= 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "elapsed fraction: max_duration '%s' must be > 0",
                            tstr(max_duration, buf));
    if (max_duration.unit == CM_TIME_EPOCH && batches_per_epoch > 0) {
        *out = (double)ts->batch / ((double)max_duration.count * (double)batches_per_epoch);
        return CM_OK;
    }
    if (max_duration.unit == CM_TIME_SECOND) {
        *out = ts->total_wct / (double)max_duration.count;
        return CM_OK;
    }
    cm_time now;
    cm_status st = cm_timestamp_get(ts, max_duration.unit, &now);
    if (st != CM_OK) return st;
    *out = (double)now.count / (double)max_duration.count;
    return CM_OK;
}
