/* Time to quality from a metrics file: targets, quality-against-clock curves, seed statistics and
 * speed-ups (composer/time_to_target.h). */
#include <composer/report.h>
#include <composer/time_to_target.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Targets
 * ------------------------------------------------------------------------------------------- */

/* The rule of Composer's stoppers (callbacks.h cm_comp_for_metric; the report layer sits below the
 * plugins, so it is restated here and a test keeps the two in agreement). */
static cm_target_dir dir_for_name(const char *name) {
    static const char *const lower_is_better[] = {"loss", "error", "perplexity", "crossentropy", "cross_entropy"};
    char low[CM_TARGET_METRIC_MAX];
    size_t n = 0;
    for (; name[n] && n + 1 < sizeof low; n++)
        low[n] = (char)(name[n] >= 'A' && name[n] <= 'Z' ? name[n] - 'A' + 'a' : name[n]);
    low[n] = 0;
    for (size_t i = 0; i < sizeof lower_is_better / sizeof *lower_is_better; i++)
        if (strstr(low, lower_is_better[i])) return CM_TARGET_AT_MOST;
    return CM_TARGET_AT_LEAST;
}

cm_status cm_target_parse(const char *spec, cm_target *out) {
    if (!spec || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_target_parse: spec or out is NULL");
    static const char *const hint = " (write METRIC=VALUE, METRIC<=VALUE or METRIC>=VALUE, e.g. "
                                    "metrics/eval/MulticlassAccuracy=0.85)";
    const char *eq = strchr(spec, '=');
    if (!eq) return cm_set_error(CM_ERR_INVALID_ARG, "target '%s': no '=', '<=' or '>='%s", spec, hint);
    size_t name_len = (size_t)(eq - spec);
    cm_target t = {.dir_forced = false};
    if (name_len > 0 && (spec[name_len - 1] == '<' || spec[name_len - 1] == '>')) {
        t.dir = spec[name_len - 1] == '<' ? CM_TARGET_AT_MOST : CM_TARGET_AT_LEAST;
        t.dir_forced = true;
        name_len--;
    }
    while (name_len > 0 && (spec[name_len - 1] == ' ' || spec[name_len - 1] == '\t')) name_len--;
    if (name_len == 0) return cm_set_error(CM_ERR_INVALID_ARG, "target '%s': the metric's name is empty%s", spec, hint);
    if (name_len >= sizeof t.metric)
        return cm_set_error(CM_ERR_INVALID_ARG, "target '%s': the metric's name is longer than %d bytes", spec,
                            CM_TARGET_METRIC_MAX - 1);
    memcpy(t.metric, spec, name_len);
    t.metric[name_len] = 0;
    const char *v = eq + 1;
    while (*v == ' ' || *v == '\t') v++;
    char *end;
    errno = 0;
    t.value = strtod(v, &end);
    while (end && (*end == ' ' || *end == '\t')) end++;
    if (end == v || *end || errno == ERANGE || !isfinite(t.value))
        return cm_set_error(CM_ERR_INVALID_ARG, "target '%s': value '%s' is not a finite number%s", spec, v, hint);
    if (!t.dir_forced) t.dir = dir_for_name(t.metric);
    *out = t;
    return CM_OK;
}

bool cm_target_reached(const cm_target *t, double value) {
    if (!t || isnan(value)) return false;
    return t->dir == CM_TARGET_AT_MOST ? value <= t->value : value >= t->value;
}

/* ---------------------------------------------------------------------------------------------
 * Curves
 * ------------------------------------------------------------------------------------------- */

struct cm_quality_curve {
    int64_t n, cap;
    int64_t *batch;
    double *seconds, *value;
    double end_seconds;
    int64_t end_batch;
};

/* Reading state: the clock at each batch seen so far (batches only grow within a kept stretch). */
typedef struct {
    const char *metric, *clock_key;
    double scale;
    cm_quality_curve *c;
    int64_t *clk_batch;
    double *clk_sec;
    int64_t n_clk, cap_clk;
    int64_t metric_before_clock_line; /* first line logging the metric with no clock yet (0 = none) */
    char seen[512];                   /* some metric names, for the not-found message */
    size_t seen_len;
    int n_seen;
} reader;

/* Moves the first n elements of *p into a new array of cap elements. */
static cm_status resize(void **p, int64_t n, int64_t cap, size_t elem) {
    void *np = cm_alloc((size_t)cap * elem, 64);
    if (!np) return cm_set_error(CM_ERR_OOM, "time to target: out of memory for %lld points", (long long)cap);
    if (*p) memcpy(np, *p, (size_t)n * elem);
    cm_free(*p);
    *p = np;
    return CM_OK;
}

static int64_t next_cap(int64_t cap) { return cap ? cap * 2 : 64; }

static cm_status curve_push(cm_quality_curve *c, int64_t batch, double sec, double value) {
    /* a batch going backwards: a resumed run re-logs; keep the run that continued */
    while (c->n > 0 && c->batch[c->n - 1] >= batch) c->n--;
    if (c->n == c->cap) {
        const int64_t cap = next_cap(c->cap);
        cm_status s;
        if ((s = resize((void **)&c->batch, c->n, cap, sizeof(int64_t))) ||
            (s = resize((void **)&c->seconds, c->n, cap, sizeof(double))) ||
            (s = resize((void **)&c->value, c->n, cap, sizeof(double))))
            return s;
        c->cap = cap;
    }
    c->batch[c->n] = batch;
    c->seconds[c->n] = sec;
    c->value[c->n] = value;
    c->n++;
    return CM_OK;
}

/* The clock at `batch`: the reading logged at it, else the latest one before it; NaN if none. */
static double clock_at(const reader *r, int64_t batch) {
    for (int64_t i = r->n_clk - 1; i >= 0; i--)
        if (r->clk_batch[i] <= batch) return r->clk_sec[i];
    return NAN;
}

static cm_status on_record(void *data, int64_t line, int64_t batch, int64_t epoch, const char *name, double value) {
    (void)epoch;
    reader *r = data;
    if (!strcmp(name, r->clock_key)) {
        while (r->n_clk > 0 && r->clk_batch[r->n_clk - 1] > batch) r->n_clk--; /* resumed: re-logged */
        if (r->n_clk > 0 && r->clk_batch[r->n_clk - 1] == batch) {
            r->clk_sec[r->n_clk - 1] = value * r->scale;
        } else {
            if (r->n_clk == r->cap_clk) {
                const int64_t cap = next_cap(r->cap_clk);
                cm_status s;
                if ((s = resize((void **)&r->clk_batch, r->n_clk, cap, sizeof(int64_t))) ||
                    (s = resize((void **)&r->clk_sec, r->n_clk, cap, sizeof(double))))
                    return s;
                r->cap_clk = cap;
            }
            r->clk_batch[r->n_clk] = batch;
            r->clk_sec[r->n_clk] = value * r->scale;
            r->n_clk++;
        }
        r->c->end_seconds = value * r->scale;
        r->c->end_batch = batch;
        return CM_OK;
    }
    if (!strcmp(name, r->metric)) {
        const double sec = clock_at(r, batch);
        if (isnan(sec)) {
            if (!r->metric_before_clock_line) r->metric_before_clock_line = line;
            return CM_OK;
        }
        return curve_push(r->c, batch, sec, value);
    }
    if (r->n_seen < 8 && !strstr(r->seen, name) && r->seen_len + strlen(name) + 3 < sizeof r->seen) {
        r->seen_len += (size_t)snprintf(r->seen + r->seen_len, sizeof r->seen - r->seen_len, "%s%s",
                                        r->n_seen ? ", " : "", name);
        r->n_seen++;
    }
    return CM_OK;
}

cm_status cm_quality_curve_read(const char *jsonl_path, const char *metric, const char *clock_key, double clock_scale,
                                cm_quality_curve **out) {
    if (!jsonl_path || !metric || !clock_key || !out)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_quality_curve_read: a NULL argument");
    if (!(clock_scale > 0) || !isfinite(clock_scale))
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_quality_curve_read: clock_scale %g must be positive and finite",
                            clock_scale);
    *out = NULL;
    cm_quality_curve *c = cm_alloc_zeroed(sizeof *c, 16);
    if (!c) return cm_set_error(CM_ERR_OOM, "cm_quality_curve_read: out of memory");
    c->end_seconds = NAN;
    c->end_batch = -1;
    reader r = {.metric = metric, .clock_key = clock_key, .scale = clock_scale, .c = c};
    cm_status s = cm_metrics_file_read(jsonl_path, on_record, &r);
    if (!s && c->n == 0 && r.metric_before_clock_line)
        s = cm_set_error(CM_ERR_NOT_FOUND,
                         "%s:%lld: '%s' is logged before any '%s' (the run's clock, which callbacks.speed_monitor "
                         "logs at every batch end): there is no time to put it at",
                         jsonl_path, (long long)r.metric_before_clock_line, metric, clock_key);
    else if (!s && c->n == 0 && r.n_clk == 0)
        s = cm_set_error(CM_ERR_NOT_FOUND,
                         "%s: neither '%s' nor the clock '%s' is logged (add callbacks.speed_monitor: {time_unit: "
                         "seconds}); metrics logged: %s",
                         jsonl_path, metric, clock_key, r.n_seen ? r.seen : "none");
    else if (!s && c->n == 0)
        s = cm_set_error(CM_ERR_NOT_FOUND, "%s: '%s' is never logged (metrics logged: %s)", jsonl_path, metric,
                         r.n_seen ? r.seen : "none besides the clock");
    cm_free(r.clk_batch);
    cm_free(r.clk_sec);
    if (s) {
        cm_quality_curve_free(c);
        return s;
    }
    *out = c;
    return CM_OK;
}

void cm_quality_curve_free(cm_quality_curve *c) {
    if (!c) return;
    cm_free(c->batch);
    cm_free(c->seconds);
    cm_free(c->value);
    cm_free(c);
}

int64_t cm_quality_curve_n(const cm_quality_curve *c) { return c ? c->n : 0; }

void cm_quality_curve_point(const cm_quality_curve *c, int64_t i, int64_t *batch, double *seconds, double *value) {
    const bool ok = c && i >= 0 && i < c->n;
    if (batch) *batch = ok ? c->batch[i] : -1;
    if (seconds) *seconds = ok ? c->seconds[i] : NAN;
    if (value) *value = ok ? c->value[i] : NAN;
}

double cm_quality_curve_end_seconds(const cm_quality_curve *c) { return c ? c->end_seconds : NAN; }
int64_t cm_quality_curve_end_batch(const cm_quality_curve *c) { return c ? c->end_batch : -1; }

void cm_quality_curve_time_to_target(const cm_quality_curve *c, const cm_target *t, cm_target_hit *out) {
    cm_target_hit h = {.reached = false, .batch = -1, .seconds = NAN, .final = NAN, .best = NAN};
    for (int64_t i = 0; c && t && i < c->n; i++) {
        const double v = c->value[i];
        if (!isnan(v) && (isnan(h.best) || (t->dir == CM_TARGET_AT_MOST ? v < h.best : v > h.best))) h.best = v;
        if (!h.reached && cm_target_reached(t, v)) {
            h.reached = true;
            h.batch = c->batch[i];
            h.seconds = c->seconds[i];
        }
    }
    if (c && c->n) h.final = c->value[c->n - 1];
    *out = h;
}

/* ---------------------------------------------------------------------------------------------
 * Statistics
 * ------------------------------------------------------------------------------------------- */

cm_sample_stats cm_sample_stats_of(const double *x, int64_t n) {
    cm_sample_stats s = {.n = n > 0 ? n : 0, .mean = NAN, .std = NAN, .min = NAN, .max = NAN};
    if (!x || n <= 0) return s;
    double sum = 0, lo = x[0], hi = x[0];
    for (int64_t i = 0; i < n; i++) {
        sum += x[i];
        if (isnan(x[i])) lo = hi = NAN;
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
    }
    s.mean = sum / (double)n;
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (x[i] - s.mean) * (x[i] - s.mean);
    s.std = n > 1 ? sqrt(ss / (double)(n - 1)) : (isnan(s.mean) ? NAN : 0.0);
    s.min = lo;
    s.max = hi;
    return s;
}

cm_status cm_speedup_compute(const double *baseline, const double *recipe, int64_t n, cm_speedup *out) {
    if (!baseline || !recipe || !out || n < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_speedup_compute: NULL times or n = %lld < 1", (long long)n);
    double ratios[256];
    if (n > (int64_t)(sizeof ratios / sizeof *ratios))
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_speedup_compute: %lld seeds; at most %zu", (long long)n,
                            sizeof ratios / sizeof *ratios);
    double sb = 0, sr = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!(baseline[i] > 0) || !isfinite(baseline[i]) || !(recipe[i] > 0) || !isfinite(recipe[i]))
            return cm_set_error(CM_ERR_INVALID_ARG,
                                "cm_speedup_compute: seed %lld: times %g (baseline) and %g (recipe) must be positive "
                                "and finite (a run that did not reach the target has no time to compare)",
                                (long long)i, baseline[i], recipe[i]);
        sb += baseline[i];
        sr += recipe[i];
        ratios[i] = baseline[i] / recipe[i];
    }
    out->ratio = sb / sr;
    out->per_seed = cm_sample_stats_of(ratios, n);
    return CM_OK;
}
