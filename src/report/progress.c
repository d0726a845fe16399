/* Progress bar: tqdm's line on a terminal (redrawn with "\r" and erase-to-end-of-line), plain lines
 * elsewhere. The bar is capped at 25 columns like Composer's ProgressBarLogger ('{bar:25}'), and the
 * whole line is cut to the terminal width so a redraw never wraps (a wrapped line cannot be
 * returned to with "\r"). */
#include <composer/report.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define BAR_MAX 25
#define BAR_MIN 1 /* like tqdm: the metrics matter more than the bar */
#define LINE_MAX_BYTES 4096

struct cm_progress {
    int64_t total;
    char *unit, *desc;
    FILE *stream;
    bool tty;
    int width_cfg;
    double min_interval, line_frac, line_s, smoothing;
    bool unit_scale, leave;
    double (*clock)(void *);
    void *clock_data;

    double t0, t_last_draw, t_last_line, t_last_ema;
    int64_t n, n_last_ema, n_last_line; /* n_last_line: -1 until a line was printed */
    double ema_dn, ema_dt;
    bool have_ema, drawn_complete, finished;

    char **names;
    double *values;
    size_t n_metrics, cap_metrics;
};

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = cm_alloc(n, 16);
    if (d) memcpy(d, s, n);
    return d;
}

static double default_clock(void *data) {
    (void)data;
    return cm_clock_s();
}

cm_progress_config cm_progress_config_default(void) {
    return (cm_progress_config){
        .total = 0,
        .unit = "ba",
        .desc = NULL,
        .stream = NULL,
        .mode = CM_PROGRESS_AUTO,
        .width = 0,
        .min_interval_s = 0.1,
        .line_every_frac = 0.1,
        .line_every_s = 60.0,
        .smoothing = 0.3,
        .unit_scale = false,
        .leave = true,
        .clock = NULL,
        .clock_data = NULL,
    };
}

static double now(const cm_progress *p) { return p->clock(p->clock_data); }

static void draw(cm_progress *p);

cm_status cm_progress_new(const cm_progress_config *cfg, cm_progress **out) {
    if (!cfg || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_progress_new: cfg and out must not be NULL");
    *out = NULL;
    if (cfg->total < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "progress bar: total %lld is negative (use 0 for unknown)",
                            (long long)cfg->total);
    if (cfg->width < 0 || !(cfg->min_interval_s >= 0) || !(cfg->line_every_frac >= 0) ||
        !(cfg->line_every_s >= 0))
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "progress bar: width %d, min_interval_s %g, line_every_frac %g and line_every_s %g "
                            "must all be >= 0",
                            cfg->width, cfg->min_interval_s, cfg->line_every_frac, cfg->line_every_s);
    if (!(cfg->smoothing >= 0 && cfg->smoothing <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "progress bar: smoothing %g is outside [0, 1]", cfg->smoothing);
    if ((unsigned)cfg->mode > CM_PROGRESS_LINES)
        return cm_set_error(CM_ERR_INVALID_ARG, "progress bar: mode %d is not a cm_progress_mode", (int)cfg->mode);
    cm_progress *p = cm_alloc_zeroed(sizeof *p, 16);
    if (!p) return CM_ERR_OOM;
    p->unit = dup_str(cfg->unit ? cfg->unit : "it");
    p->desc = dup_str(cfg->desc ? cfg->desc : "");
    if (!p->unit || !p->desc) {
        cm_progress_free(p);
        return CM_ERR_OOM;
    }
    p->total = cfg->total;
    p->stream = cfg->stream ? cfg->stream : stderr;
    if (cfg->mode == CM_PROGRESS_AUTO) {
        int fd = fileno(p->stream);
        p->tty = fd >= 0 && isatty(fd);
    } else {
        p->tty = cfg->mode == CM_PROGRESS_TTY;
    }
    p->width_cfg = cfg->width;
    p->min_interval = cfg->min_interval_s;
    p->line_frac = cfg->line_every_frac;
    p->line_s = cfg->line_every_s;
    p->smoothing = cfg->smoothing;
    p->unit_scale = cfg->unit_scale;
    p->leave = cfg->leave;
    p->clock = cfg->clock ? cfg->clock : default_clock;
    p->clock_data = cfg->clock_data;
    p->t0 = p->t_last_draw = p->t_last_line = p->t_last_ema = now(p);
    p->n_last_line = -1;
    if (p->tty) draw(p);
    *out = p;
    return CM_OK;
}

void cm_progress_free(cm_progress *p) {
    if (!p) return;
    if (p->unit && p->desc && !p->finished) cm_progress_finish(p);
    cm_progress_clear_metrics(p);
    cm_free(p->names);
    cm_free(p->values);
    cm_free(p->unit);
    cm_free(p->desc);
    cm_free(p);
}

cm_status cm_progress_set_metric(cm_progress *p, const char *name, double value) {
    if (!p || !name) return cm_set_error(CM_ERR_INVALID_ARG, "cm_progress_set_metric: bar and name must not be NULL");
    for (size_t i = 0; i < p->n_metrics; i++) {
        if (strcmp(p->names[i], name) == 0) {
            p->values[i] = value;
            return CM_OK;
        }
    }
    if (p->n_metrics == p->cap_metrics) {
        size_t cap = p->cap_metrics ? 2 * p->cap_metrics : 8;
        char **nn = cm_alloc(cap * sizeof *nn, 16);
        double *nv = cm_alloc(cap * sizeof *nv, 16);
        if (!nn || !nv) {
            cm_free(nn);
            cm_free(nv);
            return CM_ERR_OOM;
        }
        if (p->n_metrics) {
            memcpy(nn, p->names, p->n_metrics * sizeof *nn);
            memcpy(nv, p->values, p->n_metrics * sizeof *nv);
        }
        cm_free(p->names);
        cm_free(p->values);
        p->names = nn;
        p->values = nv;
        p->cap_metrics = cap;
    }
    char *d = dup_str(name);
    if (!d) return CM_ERR_OOM;
    p->names[p->n_metrics] = d;
    p->values[p->n_metrics] = value;
    p->n_metrics++;
    return CM_OK;
}

void cm_progress_clear_metrics(cm_progress *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n_metrics; i++) cm_free(p->names[i]);
    p->n_metrics = 0;
}

/* ---- formatting ---------------------------------------------------------------------------- */

typedef struct sbuf {
    char *buf;
    size_t cap, len;
} sbuf;

static void sb_add(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(sbuf *b, const char *fmt, ...) {
    if (b->len + 1 >= b->cap) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->buf + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (k > 0) b->len += (size_t)k;
    if (b->len >= b->cap) b->len = b->cap - 1;
}

/* Display columns of a UTF-8 string: one per code point (the bar glyphs and common text are narrow). */
static size_t columns(const char *s) {
    size_t c = 0;
    for (; *s; s++) c += ((unsigned char)*s & 0xC0) != 0x80;
    return c;
}

/* Cuts a UTF-8 string to at most `cols` code points, at a code point boundary. */
static void cut_columns(char *s, size_t cols) {
    size_t c = 0;
    for (char *q = s; *q; q++) {
        if (((unsigned char)*q & 0xC0) != 0x80) {
            if (c == cols) {
                *q = '\0';
                return;
            }
            c++;
        }
    }
}

static double rate_now(const cm_progress *p, double elapsed) {
    if (p->smoothing > 0 && p->have_ema && p->ema_dt > 0) return p->ema_dn / p->ema_dt;
    return elapsed > 0 && p->n > 0 ? (double)p->n / elapsed : 0.0;
}

static int terminal_width(const cm_progress *p) {
    if (p->width_cfg > 0) return p->width_cfg;
    int fd = fileno(p->stream);
    struct winsize ws;
    if (fd >= 0 && isatty(fd) && ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
    const char *env = getenv("COLUMNS");
    if (env) {
        long c = strtol(env, NULL, 10);
        if (c > 0 && c < 100000) return (int)c;
    }
    return 80;
}

static void fmt_count(const cm_progress *p, int64_t n, char *buf, size_t cap) {
    if (p->unit_scale) cm_format_si((double)n, buf, cap);
    else snprintf(buf, cap, "%lld", (long long)n);
}

char *cm_progress_format(cm_progress *p, bool tty, char *buf, size_t cap) {
    if (!cap) return buf;
    buf[0] = '\0';
    if (!p) return buf;
    double elapsed = now(p) - p->t0;
    if (elapsed < 0) elapsed = 0;
    double rate = rate_now(p, elapsed);
    char el[CM_FORMAT_MAX], rem[CM_FORMAT_MAX], rt[CM_FORMAT_MAX], nf[CM_FORMAT_MAX], tf[CM_FORMAT_MAX];
    cm_format_duration(elapsed, el, sizeof el);
    cm_format_rate(rate, p->unit, p->unit_scale, rt, sizeof rt);
    fmt_count(p, p->n, nf, sizeof nf);

    char post[LINE_MAX_BYTES];
    sbuf ps = {post, sizeof post, 0};
    post[0] = '\0';
    for (size_t i = 0; i < p->n_metrics; i++) {
        char v[CM_FORMAT_MAX];
        sb_add(&ps, ", %s=%s", p->names[i], cm_format_metric(p->values[i], v, sizeof v));
    }
    const char *colon = p->desc[0] ? ": " : "";

    sbuf out = {buf, cap, 0};
    if (p->total <= 0) {
        sb_add(&out, "%s%s%s%s [%s, %s%s]", p->desc, colon, nf, p->unit, el, rt, post);
    } else {
        double frac = (double)p->n / (double)p->total;
        if (frac > 1) frac = 1;
        fmt_count(p, p->total, tf, sizeof tf);
        if (p->n >= p->total) cm_format_duration(0, rem, sizeof rem);
        else if (rate > 0) cm_format_duration((double)(p->total - p->n) / rate, rem, sizeof rem);
        else snprintf(rem, sizeof rem, "?");
        if (!tty) {
            sb_add(&out, "%s%s%3.0f%% %s/%s [%s<%s, %s%s]", p->desc, colon, frac * 100, nf, tf, el, rem, rt, post);
        } else {
            char left[LINE_MAX_BYTES], right[LINE_MAX_BYTES];
            sbuf ls = {left, sizeof left, 0}, rs = {right, sizeof right, 0};
            left[0] = right[0] = '\0';
            sb_add(&ls, "%s%s%3.0f%%|", p->desc, colon, frac * 100);
            sb_add(&rs, "| %s/%s [%s<%s, %s%s]", nf, tf, el, rem, rt, post);
            int width = terminal_width(p);
            long room = (long)width - (long)columns(left) - (long)columns(right);
            int nbars = room > BAR_MAX ? BAR_MAX : room < BAR_MIN ? BAR_MIN : (int)room;
            /* tqdm's bar: full blocks, then one partial block in eighths, then spaces. */
            static const char *const eighths[] = {" ", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
            int64_t ticks = (int64_t)(frac * nbars * 8);
            int full = (int)(ticks / 8), part = (int)(ticks % 8);
            sb_add(&out, "%s", left);
            for (int i = 0; i < full; i++) sb_add(&out, "█");
            if (full < nbars) {
                sb_add(&out, "%s", eighths[part]);
                for (int i = full + 1; i < nbars; i++) sb_add(&out, " ");
            }
            sb_add(&out, "%s", right);
            cut_columns(buf, (size_t)width);
        }
    }
    return buf;
}

/* ---- drawing ------------------------------------------------------------------------------- */

static void draw(cm_progress *p) {
    char line[LINE_MAX_BYTES];
    cm_progress_format(p, true, line, sizeof line);
    fprintf(p->stream, "\r%s\x1b[K", line);
    fflush(p->stream);
    p->t_last_draw = now(p);
    if (p->total > 0 && p->n >= p->total) p->drawn_complete = true;
}

static void print_line(cm_progress *p) {
    char line[LINE_MAX_BYTES];
    cm_progress_format(p, false, line, sizeof line);
    fprintf(p->stream, "%s\n", line);
    fflush(p->stream);
    p->t_last_line = now(p);
    p->n_last_line = p->n;
}

/* Which fraction step n is in: floor(n / (frac * total)), with a little slack for rounding so that
 * 300 of 1000 at 0.1 is step 3, not 2.9999. */
static int64_t frac_step(const cm_progress *p, int64_t n) {
    return (int64_t)floor((double)n / (double)p->total / p->line_frac + 1e-9);
}

cm_status cm_progress_update(cm_progress *p, int64_t n_done, const char *const *names, const double *values,
                             size_t n) {
    if (!p) return cm_set_error(CM_ERR_INVALID_ARG, "cm_progress_update: bar is NULL");
    if (n && (!names || !values))
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_progress_update: %zu metrics but names or values is NULL", n);
    if (n_done < p->n)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "progress bar '%s': n_done went back from %lld to %lld (it counts units done, not an "
                            "increment)",
                            p->desc, (long long)p->n, (long long)n_done);
    for (size_t i = 0; i < n; i++) {
        cm_status st = cm_progress_set_metric(p, names[i], values[i]);
        if (st != CM_OK) return st;
    }
    if (p->finished) return CM_OK;
    int64_t prev = p->n;
    p->n = n_done;
    double t = now(p);
    bool complete = p->total > 0 && p->n >= p->total;
    /* Fold the progress since the last sample into the rate average, at most once per interval. */
    double dt = t - p->t_last_ema;
    if (dt > 0 && (dt >= p->min_interval || complete)) {
        double dn = (double)(p->n - p->n_last_ema), beta = 1.0 - p->smoothing;
        if (!p->have_ema) {
            p->ema_dn = dn;
            p->ema_dt = dt;
            p->have_ema = true;
        } else {
            p->ema_dn = beta * p->ema_dn + (1 - beta) * dn;
            p->ema_dt = beta * p->ema_dt + (1 - beta) * dt;
        }
        p->n_last_ema = p->n;
        p->t_last_ema = t;
    }
    if (p->tty) {
        if (t - p->t_last_draw >= p->min_interval || (complete && !p->drawn_complete)) draw(p);
    } else {
        bool due = false;
        if (p->line_frac > 0 && p->total > 0 && frac_step(p, p->n) > frac_step(p, prev)) due = true;
        if (p->line_s > 0 && t - p->t_last_line >= p->line_s) due = true;
        if (due) print_line(p);
    }
    return CM_OK;
}

void cm_progress_write(cm_progress *p, const char *msg) {
    if (!p || !msg) return;
    size_t len = strlen(msg);
    bool nl = len && msg[len - 1] == '\n';
    if (p->tty) {
        fprintf(p->stream, "\r\x1b[K%s%s", msg, nl ? "" : "\n");
        if (!p->finished) draw(p);
        else fflush(p->stream);
    } else {
        fprintf(p->stream, "%s%s", msg, nl ? "" : "\n");
        fflush(p->stream);
    }
}

void cm_progress_finish(cm_progress *p) {
    if (!p || p->finished) return;
    if (p->tty) {
        if (p->leave) {
            draw(p);
            fputc('\n', p->stream);
        } else {
            fputs("\r\x1b[K", p->stream);
        }
        fflush(p->stream);
    } else if (p->n_last_line != p->n) {
        print_line(p);
    }
    p->finished = true;
}
