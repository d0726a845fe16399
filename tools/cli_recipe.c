/* `composer recipe compare`: time to a target quality for a baseline and recipes over seeds — the
 * number behind Composer's speed-up claims — with the Pareto picture (quality against training
 * time) and the numbers as TSV and JSON.
 *
 *   composer recipe compare BASELINE.yaml RECIPE.yaml [...] --target METRIC=VALUE [--seeds 3]
 *            [--budget 30m] [--no-stop] [-o DIR] [key.path=value ...]
 *
 * Each config trains once per seed as a child `composer train` (this binary), seeds interleaved
 * (seed 1 of every config, then seed 2, ...) so a shared machine's load falls on every config
 * alike. The children log SpeedMonitor's wall_clock/train in seconds (the timestamp's training
 * time, evaluation paused); a ThresholdStopper ends each run once its eval metric reaches the
 * target; --budget ends it from outside. Then composer/time_to_target.h reads every metrics.jsonl. */
#include "cli.h"

#include <composer/time_to_target.h>

/* Paths are built from -o DIR (checked to leave room), a config's label (cut to 63 bytes) and a
 * seed: they fit their PATH_MAX buffers, which gcc cannot see. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONFIGS 16
#define MAX_SEEDS 64
#define MAX_OVERRIDES 64
#define CLOCK_KEY "wall_clock/train"

static const char *g_target, *g_seeds, *g_budget, *g_out, *g_no_stop, *g_quiet;

static const cli_flag k_compare_flags[] = {
    {"--target", "-t", "METRIC=VALUE",
     "the quality to reach, e.g. metrics/eval/MulticlassAccuracy=0.85; '<=' or '>=' force the direction",
     &g_target},
    {"--seeds", NULL, "N|S1,S2,..", "N seeds (1..N) or a list of seeds (one seed: 42,); default 3", &g_seeds},
    {"--budget", NULL, "TIME", "wall-clock limit of each run (90s, 30m, 1h30m); default none", &g_budget},
    {"--output", "-o", "DIR", "where the runs, results and plot go; default runs/recipe-compare", &g_out},
    {"--no-stop", NULL, NULL, "train every run to its max_duration (whole curves) instead of stopping at the target",
     &g_no_stop},
    {"--quiet", "-q", NULL, "print only the summary", &g_quiet},
    {NULL, NULL, NULL, NULL, NULL},
};

static void compare_usage(FILE *f, const char *prog) {
    fprintf(f,
            "usage: %s BASELINE.yaml [RECIPE.yaml ...] --target METRIC=VALUE [options] [key.path=value ...]\n\n"
            "Trains each config once per seed (composer train with seed=S) and reports the training time at\n"
            "which METRIC first reaches VALUE: per seed, mean and spread, the final quality, and each recipe's\n"
            "speed-up over the baseline (the first config): mean baseline time / mean recipe time, with the\n"
            "spread of the per-seed ratios. Direction: at most VALUE for names with loss, error, perplexity or\n"
            "cross-entropy, at least VALUE otherwise (accuracy); METRIC<=VALUE or METRIC>=VALUE force it.\n"
            "A metrics/train/... target turns compute_training_metrics on (off by default, as in Composer).\n\n"
            "Time is the run's training wall-clock as Composer counts it (wall_clock/train of SpeedMonitor:\n"
            "data loading, algorithms and steps, with evaluation paused), at the evaluation that reached the\n"
            "target. A run stops at the target (ThresholdStopper), at its max_duration, or at --budget\n"
            "(whole process time; then it has no time to target). key.path=value overrides apply to every\n"
            "config, as in composer train.\n\n"
            "DIR gets runs/<config>-seed<S>/ (each run's folder), logs/ (each run's console), runs.tsv\n"
            "(one row per run), curves.tsv (every quality point against time), results.json (runs and\n"
            "summary) and pareto.svg (quality against training time for every run, the target dashed).\n\n"
            "options:\n",
            prog);
    cli_print_flags(f, k_compare_flags);
    fprintf(f, "  %-28s %s\n", "-h, --help", "show this help");
}

typedef struct run_result {
    int config, seed_index;
    int64_t seed;
    char name[96];
    char dir[PATH_MAX], log[PATH_MAX];
    bool budget_stopped;
    int exit_code;
    double process_seconds;
    cm_quality_curve *curve;
    cm_target_hit hit;
} run_result;

typedef struct config_info {
    const char *path;
    char label[64];
} config_info;

/* ---------------------------------------------------------------------------------------------
 * Arguments
 * ------------------------------------------------------------------------------------------- */

static int parse_seeds(const char *prog, const char *s, int64_t *seeds, int *n) {
    *n = 0;
    if (!strchr(s, ',')) {
        char *end;
        errno = 0;
        long long k = strtoll(s, &end, 10);
        if (errno || end == s || *end || k < 1 || k > MAX_SEEDS) {
            fprintf(stderr, "%s: --seeds '%s' must be a count from 1 to %d, or a list of seeds like 17,42,1337\n", prog,
                    s, MAX_SEEDS);
            return EXIT_USAGE;
        }
        for (int i = 0; i < (int)k; i++) seeds[(*n)++] = i + 1;
        return 0;
    }
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (errno || end == p || (*end && *end != ',') || v < 0 || *n >= MAX_SEEDS) {
            fprintf(stderr, "%s: --seeds '%s': each seed is a whole number >= 0, at most %d of them, e.g. 17,42,1337\n",
                    prog, s, MAX_SEEDS);
            return EXIT_USAGE;
        }
        for (int i = 0; i < *n; i++)
            if (seeds[i] == v) {
                fprintf(stderr, "%s: --seeds '%s': seed %lld is listed twice\n", prog, s, v);
                return EXIT_USAGE;
            }
        seeds[(*n)++] = v;
        p = *end ? end + 1 : end;
    }
    return 0;
}

/* "90s", "30m", "1h30m" (Time strings in seconds), and "30min". */
static int parse_budget(const char *prog, const char *s, double *out) {
    char buf[64];
    size_t len = strlen(s);
    if (len >= 3 && len < sizeof buf && !strcmp(s + len - 3, "min")) {
        snprintf(buf, sizeof buf, "%.*sm", (int)(len - 3), s);
        s = buf;
    }
    cm_time t;
    if (cm_time_parse(s, &t) != CM_OK || t.unit != CM_TIME_SECOND || t.count <= 0) {
        fprintf(stderr, "%s: --budget '%s' is not a wall-clock time (use e.g. 90s, 30m, 30min, 1h30m)\n", prog,
                g_budget);
        return EXIT_USAGE;
    }
    *out = (double)t.count;
    return 0;
}

static bool is_override(const char *a) { return strchr(a, '=') != NULL; }

static void label_of(const char *path, char *out, size_t cap) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t n = strlen(b);
    if (n > 5 && !strcmp(b + n - 5, ".yaml")) n -= 5;
    else if (n > 4 && !strcmp(b + n - 4, ".yml")) n -= 4;
    if (n >= cap) n = cap - 1;
    memcpy(out, b, n);
    out[n] = 0;
}

/* ---------------------------------------------------------------------------------------------
 * Children
 * ------------------------------------------------------------------------------------------- */

typedef struct child_args {
    const char *argv[MAX_OVERRIDES + 32];
    char owned[16][PATH_MAX + 64];
    int n, n_owned;
} child_args;

static void add(child_args *a, const char *s) { a->argv[a->n++] = s; }
static void addf(child_args *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void addf(child_args *a, const char *fmt, ...) {
    char *buf = a->owned[a->n_owned++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof a->owned[0], fmt, ap);
    va_end(ap);
    add(a, buf);
}

/* The overrides that make a config a measured run of the comparison. */
static void measured_args(child_args *a, const char *self, const char *config, const char *const *ovr, int n_ovr,
                          const char *out, const char *name, int64_t seed, const cm_target *t, bool stop) {
    add(a, self);
    add(a, "train");
    add(a, config);
    for (int i = 0; i < n_ovr; i++) add(a, ovr[i]);
    addf(a, "seed=%lld", (long long)seed);
    addf(a, "run_root=%s/runs", out);
    addf(a, "run_name=%s", name);
    add(a, "progress_bar=false");
    add(a, "callbacks.speed_monitor.time_unit=seconds");
    add(a, "callbacks.speed_monitor.peak_flops=-1"); /* no MFU: it would measure the peak in every run */
    /* a training-metric target needs the training metrics, which are off by default (as Composer's) */
    if (!strncmp(t->metric, "metrics/train/", 14)) add(a, "compute_training_metrics=true");
    /* metrics/<label>/<Name>; a label may hold a slash (eval/<label> of a list of eval loaders) */
    const char *slash = strchr(t->metric, '/');
    const char *slash2 = strrchr(t->metric, '/');
    if (stop && !strncmp(t->metric, "metrics/", 8) && slash2 > slash && slash2[1]) {
        /* ThresholdStopper compares strictly: a threshold one ulp short of the target stops on
         * reaching it (>= or <=), as the analysis counts it */
        const double th = nextafter(t->value, t->dir == CM_TARGET_AT_MOST ? INFINITY : -INFINITY);
        addf(a, "callbacks.threshold_stopper.monitor=%s", slash2 + 1);
        addf(a, "callbacks.threshold_stopper.dataloader_label=%.*s", (int)(slash2 - slash - 1), slash + 1);
        addf(a, "callbacks.threshold_stopper.threshold=%.17g", th);
        addf(a, "callbacks.threshold_stopper.comp=%s", t->dir == CM_TARGET_AT_MOST ? "less" : "greater");
    }
    a->argv[a->n] = NULL;
}

/* Starts argv with stdout and stderr going to `log`; returns the pid, or -1 (message printed). */
static pid_t spawn(const char *prog, const char *const *argv, const char *log) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "%s: cannot create '%s': %s\n", prog, log, strerror(errno));
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "%s: fork: %s\n", prog, strerror(errno));
        close(fd);
        return -1;
    }
    if (pid == 0) {
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        execv(argv[0], (char *const *)argv);
        fprintf(stderr, "cannot run '%s': %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fd);
    return pid;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Waits for pid; past `budget` seconds (0 = none) sends SIGTERM, then SIGKILL 10 s later. Returns
 * the exit status (128 + signal for a signal) and whether the budget ended it. */
static int wait_child(pid_t pid, double budget, bool *budget_stopped, double *seconds) {
    const double t0 = cm_clock_s();
    bool termed = false, killed = false;
    int st = 0;
    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) return 1;
        const double el = cm_clock_s() - t0;
        if (budget > 0 && !termed && el >= budget) {
            kill(pid, SIGTERM);
            termed = true;
        }
        if (termed && !killed && el >= budget + 10) {
            kill(pid, SIGKILL);
            killed = true;
        }
        sleep_s(0.02);
    }
    *seconds = cm_clock_s() - t0;
    *budget_stopped = termed;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* Prints the last lines of a log to stderr. */
static void print_tail(const char *path, int lines) {
    FILE *f = fopen(path, "rb");
    if (!f) return;
    static char buf[1 << 14];
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    long from = len > (long)sizeof buf - 1 ? len - (long)sizeof buf + 1 : 0;
    fseek(f, from, SEEK_SET);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = buf + n;
    for (int k = 0; p > buf && k <= lines;)
        if (*--p == '\n' && p + 1 < buf + n) k++;
    if (*p == '\n') p++;
    fprintf(stderr, "%s", p);
    if (n && buf[n - 1] != '\n') fputc('\n', stderr);
}

/* ---------------------------------------------------------------------------------------------
 * Reports
 * ------------------------------------------------------------------------------------------- */

static void fmt_num(double v, char *buf, size_t cap) {
    if (isnan(v)) snprintf(buf, cap, "-");
    else snprintf(buf, cap, "%.4g", v);
}

static const char *stop_reason(const run_result *r) {
    if (r->budget_stopped) return "budget";
    if (r->hit.reached) return "target";
    return "max_duration";
}

typedef struct summary {
    int reached, n;
    cm_sample_stats time, final;
    bool has_speedup;
    cm_speedup speedup;
    char why_no_speedup[160];
} summary;

static void summarise(const run_result *runs, int n_runs, int n_cfg, int n_seeds, summary *sm) {
    for (int c = 0; c < n_cfg; c++) {
        double t[MAX_SEEDS], f[MAX_SEEDS];
        int nt = 0, nf = 0;
        sm[c] = (summary){.n = n_seeds};
        for (int i = 0; i < n_runs; i++) {
            const run_result *r = &runs[i];
            if (r->config != c) continue;
            if (r->hit.reached) t[nt++] = r->hit.seconds;
            if (!isnan(r->hit.final)) f[nf++] = r->hit.final;
        }
        sm[c].reached = nt;
        sm[c].time = cm_sample_stats_of(t, nt);
        sm[c].final = cm_sample_stats_of(f, nf);
    }
    for (int c = 1; c < n_cfg; c++) {
        if (sm[0].reached < n_seeds || sm[c].reached < n_seeds) {
            snprintf(sm[c].why_no_speedup, sizeof sm[c].why_no_speedup, "%s reached the target in %d of %d seeds",
                     sm[0].reached < n_seeds ? "the baseline" : "the recipe",
                     sm[0].reached < n_seeds ? sm[0].reached : sm[c].reached, n_seeds);
            continue;
        }
        double b[MAX_SEEDS], r[MAX_SEEDS];
        for (int s = 0; s < n_seeds; s++)
            for (int i = 0; i < n_runs; i++) {
                if (runs[i].seed_index != s) continue;
                if (runs[i].config == 0) b[s] = runs[i].hit.seconds;
                if (runs[i].config == c) r[s] = runs[i].hit.seconds;
            }
        if (cm_speedup_compute(b, r, n_seeds, &sm[c].speedup) == CM_OK) sm[c].has_speedup = true;
        else snprintf(sm[c].why_no_speedup, sizeof sm[c].why_no_speedup, "%s", cm_last_error());
    }
}

static void json_escape(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, double v) {
    char b[32];
    if (!isfinite(v)) fputs("null", f);
    else {
        cm_format_double_shortest(v, b, sizeof b);
        fputs(b, f);
    }
}

static void json_stats(FILE *f, const cm_sample_stats *s) {
    fprintf(f, "{\"n\": %lld, \"mean\": ", (long long)s->n);
    json_num(f, s->mean);
    fputs(", \"std\": ", f);
    json_num(f, s->std);
    fputs(", \"min\": ", f);
    json_num(f, s->min);
    fputs(", \"max\": ", f);
    json_num(f, s->max);
    fputc('}', f);
}

static int write_reports(const char *prog, const char *out, const cm_target *t, const config_info *cfg, int n_cfg,
                         const run_result *runs, int n_runs, const summary *sm, double budget, bool stop) {
    char path[PATH_MAX];
    /* runs.tsv */
    snprintf(path, sizeof path, "%s/runs.tsv", out);
    FILE *f = fopen(path, "w");
    if (!f) goto io;
    fprintf(f, "config\tseed\treached\tbatch_to_target\tseconds_to_target\tfinal\tbest\tend_batch\tend_seconds\t"
               "stopped_by\tprocess_seconds\trun_folder\n");
    for (int i = 0; i < n_runs; i++) {
        const run_result *r = &runs[i];
        fprintf(f, "%s\t%lld\t%s\t%lld\t%.17g\t%.17g\t%.17g\t%lld\t%.17g\t%s\t%.3f\t%s\n", cfg[r->config].label,
                (long long)r->seed, r->hit.reached ? "yes" : "no", (long long)r->hit.batch, r->hit.seconds, r->hit.final,
                r->hit.best, (long long)cm_quality_curve_end_batch(r->curve), cm_quality_curve_end_seconds(r->curve),
                stop_reason(r), r->process_seconds, r->dir);
    }
    if (fclose(f) != 0) goto io;
    /* curves.tsv */
    snprintf(path, sizeof path, "%s/curves.tsv", out);
    if (!(f = fopen(path, "w"))) goto io;
    fprintf(f, "config\tseed\tbatch\tseconds\t%s\n", t->metric);
    for (int i = 0; i < n_runs; i++)
        for (int64_t k = 0; k < cm_quality_curve_n(runs[i].curve); k++) {
            int64_t b;
            double s, v;
            cm_quality_curve_point(runs[i].curve, k, &b, &s, &v);
            fprintf(f, "%s\t%lld\t%lld\t%.17g\t%.17g\n", cfg[runs[i].config].label, (long long)runs[i].seed,
                    (long long)b, s, v);
        }
    if (fclose(f) != 0) goto io;
    /* results.json */
    snprintf(path, sizeof path, "%s/results.json", out);
    if (!(f = fopen(path, "w"))) goto io;
    fputs("{\"target\": {\"metric\": ", f);
    json_escape(f, t->metric);
    fprintf(f, ", \"op\": \"%s\", \"value\": ", t->dir == CM_TARGET_AT_MOST ? "<=" : ">=");
    json_num(f, t->value);
    fputs("},\n \"clock\": \"" CLOCK_KEY "\", \"budget_seconds\": ", f);
    json_num(f, budget > 0 ? budget : NAN);
    fprintf(f, ", \"stop_at_target\": %s,\n \"runs\": [\n", stop ? "true" : "false");
    for (int i = 0; i < n_runs; i++) {
        const run_result *r = &runs[i];
        fputs("  {\"config\": ", f);
        json_escape(f, cfg[r->config].label);
        fprintf(f, ", \"seed\": %lld, \"reached\": %s, \"batch_to_target\": ", (long long)r->seed,
                r->hit.reached ? "true" : "false");
        if (r->hit.reached) fprintf(f, "%lld", (long long)r->hit.batch);
        else fputs("null", f);
        fputs(", \"seconds_to_target\": ", f);
        json_num(f, r->hit.seconds);
        fputs(", \"final\": ", f);
        json_num(f, r->hit.final);
        fputs(", \"best\": ", f);
        json_num(f, r->hit.best);
        fprintf(f, ", \"end_batch\": %lld, \"end_seconds\": ", (long long)cm_quality_curve_end_batch(r->curve));
        json_num(f, cm_quality_curve_end_seconds(r->curve));
        fprintf(f, ", \"stopped_by\": \"%s\", \"run_folder\": ", stop_reason(r));
        json_escape(f, r->dir);
        fprintf(f, "}%s\n", i + 1 < n_runs ? "," : "");
    }
    fputs(" ],\n \"summary\": [\n", f);
    for (int c = 0; c < n_cfg; c++) {
        fputs("  {\"config\": ", f);
        json_escape(f, cfg[c].label);
        fputs(", \"path\": ", f);
        json_escape(f, cfg[c].path);
        fprintf(f, ", \"reached\": %d, \"seeds\": %d, \"seconds_to_target\": ", sm[c].reached, sm[c].n);
        json_stats(f, &sm[c].time);
        fputs(", \"final\": ", f);
        json_stats(f, &sm[c].final);
        if (c == 0) fputs(", \"speedup\": null", f);
        else if (sm[c].has_speedup) {
            fputs(", \"speedup\": {\"ratio_of_means\": ", f);
            json_num(f, sm[c].speedup.ratio);
            fputs(", \"per_seed\": ", f);
            json_stats(f, &sm[c].speedup.per_seed);
            fputc('}', f);
        } else {
            fputs(", \"speedup\": null, \"no_speedup_because\": ", f);
            json_escape(f, sm[c].why_no_speedup);
        }
        fprintf(f, "}%s\n", c + 1 < n_cfg ? "," : "");
    }
    fputs(" ]\n}\n", f);
    if (fclose(f) != 0) goto io;

    /* pareto.svg: one series per config (its seeds' curves joined with gaps, so one colour and one
     * legend entry per config), and the target as a dashed-looking two-point line */
    cm_svg_plot_config pc = cm_svg_plot_config_default();
    char title[256];
    snprintf(title, sizeof title, "%s vs training time (target %s %g)", t->metric,
             t->dir == CM_TARGET_AT_MOST ? "<=" : ">=", t->value);
    pc.title = title;
    pc.x_label = "training wall-clock (s)";
    pc.y_label = t->metric;
    cm_svg_plot *plot;
    if (cm_svg_plot_new(&pc, &plot) != CM_OK) goto lib;
    double xmax = 0;
    for (int c = 0; c < n_cfg; c++) {
        size_t cap = 0;
        for (int i = 0; i < n_runs; i++)
            if (runs[i].config == c) cap += (size_t)cm_quality_curve_n(runs[i].curve) + 1;
        double *x = malloc((cap ? cap : 1) * sizeof *x), *y = malloc((cap ? cap : 1) * sizeof *y);
        size_t k = 0;
        for (int i = 0; x && y && i < n_runs; i++) {
            if (runs[i].config != c) continue;
            if (k) x[k] = y[k] = NAN, k++;
            for (int64_t j = 0; j < cm_quality_curve_n(runs[i].curve); j++, k++) {
                cm_quality_curve_point(runs[i].curve, j, NULL, &x[k], &y[k]);
                if (x[k] > xmax) xmax = x[k];
            }
        }
        cm_status s = x && y ? cm_svg_plot_add_series(plot, cfg[c].label, x, y, k, CM_SVG_PLOT_LINE_MARKERS)
                             : cm_set_error(CM_ERR_OOM, "out of memory for the plot");
        free(x);
        free(y);
        if (s) {
            cm_svg_plot_free(plot);
            goto lib;
        }
    }
    char tname[64];
    snprintf(tname, sizeof tname, "target %g", t->value);
    const double tx[2] = {0, xmax > 0 ? xmax : 1}, ty[2] = {t->value, t->value};
    snprintf(path, sizeof path, "%s/pareto.svg", out);
    cm_status s = cm_svg_plot_add_series(plot, tname, tx, ty, 2, CM_SVG_PLOT_LINE);
    if (!s) s = cm_svg_plot_save(plot, path);
    cm_svg_plot_free(plot);
    if (s) goto lib;
    return 0;
io:
    fprintf(stderr, "%s: writing '%s': %s\n", prog, path, strerror(errno));
    return 1;
lib:
    fprintf(stderr, "%s: drawing the plot: %s\n", prog, cm_last_error());
    return 1;
}

static void print_tables(const cm_target *t, const config_info *cfg, int n_cfg, const run_result *runs, int n_runs,
                         const summary *sm, bool quiet) {
    printf("\ntarget: %s %s %g (time: %s, training wall-clock with evaluation paused)\n", t->metric,
           t->dir == CM_TARGET_AT_MOST ? "<=" : ">=", t->value, CLOCK_KEY);
    if (!quiet) {
        printf("\n%-24s %6s %12s %8s %10s %10s %12s\n", "config", "seed", "to target", "batch", "final", "best",
               "stopped by");
        for (int i = 0; i < n_runs; i++) {
            const run_result *r = &runs[i];
            char ts[32], fin[32], best[32];
            if (r->hit.reached) snprintf(ts, sizeof ts, "%.1f s", r->hit.seconds);
            else snprintf(ts, sizeof ts, "not reached");
            fmt_num(r->hit.final, fin, sizeof fin);
            fmt_num(r->hit.best, best, sizeof best);
            printf("%-24s %6lld %12s %8lld %10s %10s %12s\n", cfg[r->config].label, (long long)r->seed, ts,
                   (long long)(r->hit.reached ? r->hit.batch : cm_quality_curve_end_batch(r->curve)), fin, best,
                   stop_reason(r));
        }
    }
    printf("\n%-24s %8s %22s %18s %14s %s\n", "config", "reached", "time to target (s)", "min .. max", "final (mean)",
           "speed-up vs baseline");
    for (int c = 0; c < n_cfg; c++) {
        char reached[16], tt[48], mm[48], fin[32], sp[200];
        snprintf(reached, sizeof reached, "%d/%d", sm[c].reached, sm[c].n);
        if (sm[c].reached) {
            snprintf(tt, sizeof tt, "%.1f ± %.1f", sm[c].time.mean, sm[c].time.std);
            snprintf(mm, sizeof mm, "%.1f .. %.1f", sm[c].time.min, sm[c].time.max);
        } else {
            snprintf(tt, sizeof tt, "-");
            snprintf(mm, sizeof mm, "-");
        }
        fmt_num(sm[c].final.mean, fin, sizeof fin);
        if (c == 0) snprintf(sp, sizeof sp, "(baseline)");
        else if (sm[c].has_speedup)
            snprintf(sp, sizeof sp, "%.2fx (per seed %.2f ± %.2f, %.2f .. %.2f)", sm[c].speedup.ratio,
                     sm[c].speedup.per_seed.mean, sm[c].speedup.per_seed.std, sm[c].speedup.per_seed.min,
                     sm[c].speedup.per_seed.max);
        else snprintf(sp, sizeof sp, "none: %s", sm[c].why_no_speedup);
        printf("%-24s %8s %22s %18s %14s %s\n", cfg[c].label, reached, tt, mm, fin, sp);
    }
}

/* ---------------------------------------------------------------------------------------------
 * The command
 * ------------------------------------------------------------------------------------------- */

int cmd_recipe_compare(const char *prog, int argc, char **argv) {
    g_target = g_budget = g_no_stop = g_quiet = NULL;
    g_seeds = "3";
    g_out = "runs/recipe-compare";
    const char *pos[MAX_CONFIGS + MAX_OVERRIDES];
    int n_pos;
    int rc = cli_parse_flags(prog, k_compare_flags, argc, argv, pos, MAX_CONFIGS + MAX_OVERRIDES, &n_pos,
                             compare_usage);
    if (rc) return rc < 0 ? 0 : rc;
    config_info cfg[MAX_CONFIGS];
    const char *ovr[MAX_OVERRIDES];
    int n_cfg = 0, n_ovr = 0;
    for (int i = 0; i < n_pos; i++) {
        if (is_override(pos[i])) {
            if (n_ovr == MAX_OVERRIDES) {
                fprintf(stderr, "%s: more than %d key=value overrides\n", prog, MAX_OVERRIDES);
                return EXIT_USAGE;
            }
            ovr[n_ovr++] = pos[i];
            continue;
        }
        if (n_cfg == MAX_CONFIGS) {
            fprintf(stderr, "%s: more than %d configs; compare fewer at a time\n", prog, MAX_CONFIGS);
            return EXIT_USAGE;
        }
        struct stat st;
        if (stat(pos[i], &st) != 0 || !S_ISREG(st.st_mode)) {
            fprintf(stderr, "%s: config '%s' is not a readable file%s\n", prog, pos[i],
                    pos[i][0] == '-' ? "" : " (a key=value override needs its '=')");
            return EXIT_USAGE;
        }
        cfg[n_cfg].path = pos[i];
        label_of(pos[i], cfg[n_cfg].label, sizeof cfg[n_cfg].label);
        for (int j = 0; j < n_cfg; j++) /* two configs with one file name: number the later one */
            if (!strcmp(cfg[j].label, cfg[n_cfg].label)) {
                size_t l = strlen(cfg[n_cfg].label);
                snprintf(cfg[n_cfg].label + (l < 56 ? l : 56), 8, "-%d", n_cfg + 1);
            }
        n_cfg++;
    }
    if (n_cfg == 0) {
        fprintf(stderr, "%s: missing BASELINE.yaml (and the recipes to compare with it); see '%s --help'\n", prog, prog);
        return EXIT_USAGE;
    }
    if (!g_target) {
        fprintf(stderr, "%s: missing --target METRIC=VALUE (e.g. --target metrics/eval/MulticlassAccuracy=0.85)\n",
                prog);
        return EXIT_USAGE;
    }
    cm_target target;
    if (cm_target_parse(g_target, &target) != CM_OK) {
        fprintf(stderr, "%s: --target: %s\n", prog, cm_last_error());
        return EXIT_USAGE;
    }
    int64_t seeds[MAX_SEEDS];
    int n_seeds;
    if ((rc = parse_seeds(prog, g_seeds, seeds, &n_seeds))) return rc;
    double budget = 0;
    if (g_budget && (rc = parse_budget(prog, g_budget, &budget))) return rc;
    const bool stop = !g_no_stop, quiet = g_quiet != NULL;
    if (strlen(g_out) > PATH_MAX - 256) {
        fprintf(stderr, "%s: -o DIR is longer than %d bytes\n", prog, PATH_MAX - 256);
        return EXIT_USAGE;
    }

    char self[PATH_MAX];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) {
        fprintf(stderr, "%s: cannot find this program's path (/proc/self/exe): %s\n", prog, strerror(errno));
        return 1;
    }
    self[sl] = 0;
    char logs[PATH_MAX];
    snprintf(logs, sizeof logs, "%s/logs", g_out);
    int err = cli_mkdirs(logs);
    if (err) {
        fprintf(stderr, "%s: cannot create '%s': %s\n", prog, logs, strerror(err));
        return 1;
    }

    /* Check every config with the measured overrides before spending time on any run: a typo in
     * the last recipe should not wait for the baseline's seeds. */
    for (int c = 0; c < n_cfg; c++) {
        child_args a = {.n = 0};
        measured_args(&a, self, cfg[c].path, ovr, n_ovr, g_out, "check", seeds[0], &target, stop);
        add(&a, "--print-config"); /* over the NULL measured_args ended argv with */
        a.argv[a.n] = NULL;
        char log[PATH_MAX];
        snprintf(log, sizeof log, "%s/%s.check.txt", logs, cfg[c].label);
        pid_t pid = spawn(prog, a.argv, log);
        if (pid < 0) return 1;
        bool b;
        double secs;
        int code = wait_child(pid, 0, &b, &secs);
        if (code != 0) {
            fprintf(stderr, "%s: config '%s' does not load (composer train --print-config, exit %d):\n", prog,
                    cfg[c].path, code);
            print_tail(log, 12);
            return code == EXIT_USAGE ? EXIT_USAGE : 1;
        }
    }

    run_result *runs = calloc((size_t)(n_cfg * n_seeds), sizeof *runs);
    summary *sm = calloc((size_t)n_cfg, sizeof *sm);
    if (!runs || !sm) {
        free(runs);
        free(sm);
        fprintf(stderr, "%s: out of memory\n", prog);
        return 1;
    }
    int n_runs = 0;
    rc = 0;
    if (!quiet)
        printf("%d config%s x %d seed%s, target %s %s %g%s%s\n", n_cfg, n_cfg > 1 ? "s" : "", n_seeds,
               n_seeds > 1 ? "s" : "", target.metric, target.dir == CM_TARGET_AT_MOST ? "<=" : ">=", target.value,
               budget > 0 ? ", budget " : "", budget > 0 ? g_budget : "");
    for (int s = 0; s < n_seeds && !rc; s++)
        for (int c = 0; c < n_cfg && !rc; c++) {
            run_result *r = &runs[n_runs];
            *r = (run_result){.config = c, .seed_index = s, .seed = seeds[s]};
            snprintf(r->name, sizeof r->name, "%s-seed%lld", cfg[c].label, (long long)seeds[s]);
            snprintf(r->dir, sizeof r->dir, "%s/runs/%s", g_out, r->name);
            snprintf(r->log, sizeof r->log, "%s/%s.txt", logs, r->name);
            char stale[PATH_MAX + 32];
            snprintf(stale, sizeof stale, "%s/%s", r->dir, CM_RUN_FILE_METRICS);
            unlink(stale); /* a folder left by an earlier comparison must not lend this run its curve */
            child_args a = {.n = 0};
            measured_args(&a, self, cfg[c].path, ovr, n_ovr, g_out, r->name, seeds[s], &target, stop);
            if (!quiet) {
                printf("[%d/%d] %s seed %lld ... ", n_runs + 1, n_cfg * n_seeds, cfg[c].label, (long long)seeds[s]);
                fflush(stdout);
            }
            pid_t pid = spawn(prog, a.argv, r->log);
            if (pid < 0) {
                rc = 1;
                break;
            }
            r->exit_code = wait_child(pid, budget, &r->budget_stopped, &r->process_seconds);
            n_runs++;
            if (r->exit_code != 0 && !r->budget_stopped) {
                if (!quiet) printf("failed\n");
                fprintf(stderr, "%s: %s seed %lld failed (exit %d); its console (%s) ends:\n", prog, cfg[c].path,
                        (long long)seeds[s], r->exit_code, r->log);
                print_tail(r->log, 12);
                rc = 1;
                break;
            }
            cm_status cs = cm_quality_curve_read(stale, target.metric, CLOCK_KEY, 1.0, &r->curve);
            if (cs == CM_ERR_NOT_FOUND && r->budget_stopped) {
                /* the budget ended it before its first evaluation: no curve, not reached */
                r->curve = NULL;
            } else if (cs != CM_OK) {
                if (!quiet) printf("no curve\n");
                fprintf(stderr, "%s: %s seed %lld: %s\n", prog, cfg[c].path, (long long)seeds[s], cm_last_error());
                rc = 1;
                break;
            }
            cm_quality_curve_time_to_target(r->curve, &target, &r->hit);
            if (!quiet) {
                if (r->hit.reached)
                    printf("reached at batch %lld, %.1f s of training (%s)\n", (long long)r->hit.batch, r->hit.seconds,
                           stop_reason(r));
                else
                    printf("not reached (best %.4g, stopped by %s after %.1f s)\n", r->hit.best, stop_reason(r),
                           r->process_seconds);
            }
        }
    if (!rc) {
        summarise(runs, n_runs, n_cfg, n_seeds, sm);
        print_tables(&target, cfg, n_cfg, runs, n_runs, sm, quiet);
        rc = write_reports(prog, g_out, &target, cfg, n_cfg, runs, n_runs, sm, budget, stop);
        if (!rc)
            printf("\nwrote %s/runs.tsv, curves.tsv, results.json and pareto.svg; the runs are in %s/runs/\n", g_out,
                   g_out);
    }
    for (int i = 0; i < n_runs; i++) cm_quality_curve_free(runs[i].curve);
    free(runs);
    free(sm);
    return rc;
}
