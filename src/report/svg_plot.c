/* A small SVG line-plot writer: enough of matplotlib's look (tab10 colours, 1-2-5 ticks, light grid,
 * legend box) to draw training curves, with no dependency beyond stdio. */
#include <composer/report.h>

#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef struct series {
    char *name;
    double *x, *y;
    size_t n;
    cm_svg_plot_style style;
} series;

struct cm_svg_plot {
    char *title, *x_label, *y_label;
    int width, height;
    bool log_y, legend, grid;
    series *s;
    size_t n_series, cap_series;
};

static const char *const k_tab10[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

#define FONT "DejaVu Sans, Helvetica, Arial, sans-serif"
#define TICK_FONT_PX 11.0
#define CHAR_W (0.62 * TICK_FONT_PX) /* a generous average glyph width, to keep labels apart */
#define MAX_TICKS 64

static char *dup_str(const char *s) {
    if (!s) s = "";
    size_t n = strlen(s) + 1;
    char *d = cm_alloc(n, 16);
    if (d) memcpy(d, s, n);
    return d;
}

cm_svg_plot_config cm_svg_plot_config_default(void) {
    return (cm_svg_plot_config){.title = NULL,
                                .x_label = "batch",
                                .y_label = NULL,
                                .width = 800,
                                .height = 500,
                                .log_y = false,
                                .legend = true,
                                .grid = true};
}

cm_status cm_svg_plot_new(const cm_svg_plot_config *cfg, cm_svg_plot **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_svg_plot_new: out must not be NULL");
    *out = NULL;
    cm_svg_plot_config c = cfg ? *cfg : cm_svg_plot_config_default();
    if (c.width < 200 || c.height < 150)
        return cm_set_error(CM_ERR_INVALID_ARG, "svg plot: size %dx%d is too small (at least 200x150 pixels)", c.width,
                            c.height);
    cm_svg_plot *p = cm_alloc_zeroed(sizeof *p, 16);
    if (!p) return CM_ERR_OOM;
    p->title = dup_str(c.title);
    p->x_label = dup_str(c.x_label);
    p->y_label = dup_str(c.y_label);
    if (!p->title || !p->x_label || !p->y_label) {
        cm_svg_plot_free(p);
        return CM_ERR_OOM;
    }
    p->width = c.width;
    p->height = c.height;
    p->log_y = c.log_y;
    p->legend = c.legend;
    p->grid = c.grid;
    *out = p;
    return CM_OK;
}

void cm_svg_plot_free(cm_svg_plot *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n_series; i++) {
        cm_free(p->s[i].name);
        cm_free(p->s[i].x);
        cm_free(p->s[i].y);
    }
    cm_free(p->s);
    cm_free(p->title);
    cm_free(p->x_label);
    cm_free(p->y_label);
    cm_free(p);
}

cm_status cm_svg_plot_add_series(cm_svg_plot *p, const char *name, const double *x, const double *y, size_t n,
                                 cm_svg_plot_style style) {
    if (!p || !name || (n && (!x || !y)))
        return cm_set_error(CM_ERR_INVALID_ARG, "svg plot: add_series needs a plot, a name, and x and y when n > 0");
    if ((unsigned)style > CM_SVG_PLOT_LINE_MARKERS)
        return cm_set_error(CM_ERR_INVALID_ARG, "svg plot: series '%s': style %d is not a cm_svg_plot_style", name,
                            (int)style);
    if (p->n_series == p->cap_series) {
        size_t cap = p->cap_series ? 2 * p->cap_series : 8;
        series *ns = cm_alloc_zeroed(cap * sizeof *ns, 16);
        if (!ns) return CM_ERR_OOM;
        if (p->n_series) memcpy(ns, p->s, p->n_series * sizeof *ns);
        cm_free(p->s);
        p->s = ns;
        p->cap_series = cap;
    }
    series s = {.name = dup_str(name), .n = n, .style = style};
    s.x = cm_alloc((n ? n : 1) * sizeof(double), 64);
    s.y = cm_alloc((n ? n : 1) * sizeof(double), 64);
    if (!s.name || !s.x || !s.y) {
        cm_free(s.name);
        cm_free(s.x);
        cm_free(s.y);
        return CM_ERR_OOM;
    }
    if (n) {
        memcpy(s.x, x, n * sizeof(double));
        memcpy(s.y, y, n * sizeof(double));
    }
    p->s[p->n_series++] = s;
    return CM_OK;
}

/* ---- axes ---------------------------------------------------------------------------------- */

typedef struct axis {
    double lo, hi;        /* view limits (log10 of the values on a log axis) */
    bool log;
    double ticks[MAX_TICKS]; /* tick values (not log10) */
    char labels[MAX_TICKS][24];
    int n_ticks;
} axis;

static bool usable(double x, double y, bool log_y) { return isfinite(x) && isfinite(y) && (!log_y || y > 0); }

/* The smallest 1, 2 or 5 times a power of ten that is >= raw. */
static double nice_step(double raw) {
    double mag = pow(10.0, floor(log10(raw)));
    double m = raw / mag;
    double f = m <= 1.0 + 1e-9 ? 1 : m <= 2.0 + 1e-9 ? 2 : m <= 5.0 + 1e-9 ? 5 : 10;
    return f * mag;
}

static double next_nice(double step) {
    double mag = pow(10.0, floor(log10(step) + 1e-9));
    double m = step / mag;
    return (m < 1.5 ? 2 : m < 3.5 ? 5 : 10) * mag;
}

/* A tick label: as many decimals as the step needs; one k/M/G suffix for the whole axis when its
 * largest tick is big (so labels read 0, 2k, 4k ... 10k rather than 8000 next to 10k). */
static void tick_label(double v, double step, double max_abs, char *buf, size_t cap) {
    if (fabs(v) < step * 1e-6) v = 0; /* -0 and rounding noise */
    const char *suffix = "";
    double scale = 1;
    if (max_abs >= 1e10 && step >= 1e9 - 0.5) scale = 1e9, suffix = "G";
    else if (max_abs >= 1e7 && step >= 1e6 - 0.5) scale = 1e6, suffix = "M";
    else if (max_abs >= 1e4 && step >= 1e3 - 0.5) scale = 1e3, suffix = "k";
    if (v == 0) suffix = "";
    double s = step / scale;
    if (s < 1e-5 || max_abs / scale >= 1e15) {
        snprintf(buf, cap, "%.3g%s", v / scale, suffix);
        return;
    }
    int dec = s >= 1 ? 0 : (int)ceil(-log10(s) - 1e-9);
    snprintf(buf, cap, "%.*f%s", dec, v / scale, suffix);
}

/* Fills the ticks for `step`; returns the pixels the labels need (HUGE_VAL when too many). */
static double fill_ticks(axis *ax, double step, bool horizontal) {
    double k0 = ceil(ax->lo / step - 1e-9), k1 = floor(ax->hi / step + 1e-9);
    int n = (int)(k1 - k0) + 1;
    if (n > MAX_TICKS) return HUGE_VAL;
    size_t widest = 0;
    double max_abs = fmax(fabs(k0 * step), fabs(k1 * step));
    for (int i = 0; i < n; i++) {
        double v = (k0 + i) * step;
        ax->ticks[i] = v;
        tick_label(v, step, max_abs, ax->labels[i], sizeof ax->labels[i]);
        size_t w = strlen(ax->labels[i]);
        if (w > widest) widest = w;
    }
    ax->n_ticks = n;
    return horizontal ? (double)n * ((double)widest * CHAR_W + 12) : (double)n * (TICK_FONT_PX + 8);
}

static double prev_nice(double step) {
    double mag = pow(10.0, floor(log10(step) + 1e-9));
    double m = step / mag;
    return m < 1.5 ? 0.5 * mag : m < 3.5 ? mag : 2 * mag;
}

/* Linear ticks: a 1-2-5 step giving about `target` ticks, widened until the labels fit `room`
 * pixels, or narrowed once when that leaves fewer than three ticks and the narrower one fits. */
static void linear_ticks(axis *ax, double target, double room, bool horizontal) {
    double step = nice_step((ax->hi - ax->lo) / (target > 2 ? target : 2));
    for (int tries = 0; tries < 40; tries++) {
        double need = fill_ticks(ax, step, horizontal);
        if (need <= room || (need < HUGE_VAL && ax->n_ticks <= 2)) break;
        step = next_nice(step);
    }
    if (ax->n_ticks < 3) {
        double need = fill_ticks(ax, prev_nice(step), horizontal);
        if (!(need <= room)) fill_ticks(ax, step, horizontal);
    }
}

static void log_label(double v, char *buf, size_t cap) {
    if (v >= 1e-4 && v < 1e5) snprintf(buf, cap, "%g", v);
    else snprintf(buf, cap, "%.0e", v);
}

/* Log ticks: powers of ten (every k-th when there are many), with 2 and 5 between them when the
 * view spans under three decades, and every integer multiple when it spans less than one. */
static void log_ticks(axis *ax, double room) {
    int d0 = (int)floor(ax->lo), d1 = (int)ceil(ax->hi);
    double span = ax->hi - ax->lo;
    static const double m125[] = {1, 2, 5};
    static const double m19[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    const double *mult = m125;
    int n_mult = 3;
    if (span >= 3) mult = m125, n_mult = 1;
    else if (span < 0.8) mult = m19, n_mult = 9;
    int every = 1;
    for (;;) {
        int n = 0;
        for (int d = d0; d <= d1 && n < MAX_TICKS; d++) {
            if (n_mult == 1 && (d % every) != 0) continue;
            for (int i = 0; i < n_mult && n < MAX_TICKS; i++) {
                double v = mult[i] * pow(10.0, d);
                double lv = log10(v);
                if (lv < ax->lo - 1e-9 || lv > ax->hi + 1e-9) continue;
                ax->ticks[n] = v;
                log_label(v, ax->labels[n], sizeof ax->labels[n]);
                n++;
            }
        }
        ax->n_ticks = n;
        if ((double)n * (TICK_FONT_PX + 8) <= room || n <= 2 || every > 64) return;
        if (n_mult > 1) n_mult = n_mult == 9 ? 3 : 1, mult = m125;
        else every++;
    }
}

static void set_range(axis *ax, double lo, double hi, bool any) {
    if (!any) lo = 0, hi = ax->log ? 1 : 1;
    if (lo == hi) {
        double d = ax->log ? 0.5 : (lo == 0 ? 1 : fabs(lo) * 0.1);
        lo -= d, hi += d;
    } else {
        double m = 0.05 * (hi - lo);
        lo -= m, hi += m;
    }
    ax->lo = lo, ax->hi = hi;
}

/* ---- writing ------------------------------------------------------------------------------- */

/* Text content and attribute values: XML-escaped; control characters XML 1.0 forbids become '?'. */
static void put_text(FILE *f, const char *s) {
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        switch (*c) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default: fputc(*c < 0x20 && *c != '\t' ? '?' : *c, f);
        }
    }
}

typedef struct frame {
    double x0, x1, y0, y1; /* plot area in pixels (y0 top) */
    axis ax, ay;
} frame;

static double px(const frame *fr, double x) {
    return fr->x0 + (x - fr->ax.lo) / (fr->ax.hi - fr->ax.lo) * (fr->x1 - fr->x0);
}
static double py(const frame *fr, double y) {
    double v = fr->ay.log ? log10(y) : y;
    return fr->y1 - (v - fr->ay.lo) / (fr->ay.hi - fr->ay.lo) * (fr->y1 - fr->y0);
}

static void write_series(FILE *f, const cm_svg_plot *p, const frame *fr, const series *s, const char *color) {
    bool line = s->style != CM_SVG_PLOT_MARKERS, markers = s->style != CM_SVG_PLOT_LINE;
    if (line) {
        bool open = false, pen = false;
        for (size_t i = 0; i < s->n; i++) {
            if (!usable(s->x[i], s->y[i], p->log_y)) {
                pen = false;
                continue;
            }
            bool next_ok = i + 1 < s->n && usable(s->x[i + 1], s->y[i + 1], p->log_y);
            if (!pen && !next_ok) continue; /* an isolated point: drawn as a dot below */
            if (!open) {
                fprintf(f, "<path fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\" stroke-linejoin=\"round\" "
                           "stroke-linecap=\"round\" d=\"", color);
                open = true;
            }
            fprintf(f, "%s%.1f %.1f", pen ? " L" : (i ? " M" : "M"), px(fr, s->x[i]), py(fr, s->y[i]));
            pen = true;
        }
        if (open) fputs("\"/>\n", f);
        if (!markers) {
            for (size_t i = 0; i < s->n; i++) {
                if (!usable(s->x[i], s->y[i], p->log_y)) continue;
                bool prev_ok = i > 0 && usable(s->x[i - 1], s->y[i - 1], p->log_y);
                bool next_ok = i + 1 < s->n && usable(s->x[i + 1], s->y[i + 1], p->log_y);
                if (!prev_ok && !next_ok)
                    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2\" fill=\"%s\"/>\n", px(fr, s->x[i]),
                            py(fr, s->y[i]), color);
            }
        }
    }
    if (markers) {
        fprintf(f, "<g fill=\"%s\" stroke=\"white\" stroke-width=\"0.8\">\n", color);
        for (size_t i = 0; i < s->n; i++)
            if (usable(s->x[i], s->y[i], p->log_y))
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\"/>\n", px(fr, s->x[i]), py(fr, s->y[i]));
        fputs("</g>\n", f);
    }
}

/* Puts the legend in the corner that hides the fewest points (matplotlib's loc="best" in small),
 * preferring upper right, then upper left, lower left, lower right. Large series are sampled. */
static void legend_place(const cm_svg_plot *p, const frame *fr, double bw, double bh, double *bx, double *by) {
    double xl = fr->x0 + 10, xr = fr->x1 - 10 - bw, yt = fr->y0 + 10, yb = fr->y1 - 10 - bh;
    if (xr < xl) xr = xl;
    if (yb < yt) yb = yt;
    const double cx[4] = {xr, xl, xl, xr}, cy[4] = {yt, yt, yb, yb};
    int best = 0;
    size_t best_hits = (size_t)-1;
    for (int c = 0; c < 4; c++) {
        size_t hits = 0;
        for (size_t k = 0; k < p->n_series; k++) {
            const series *s = &p->s[k];
            size_t stride = s->n > 2000 ? s->n / 2000 : 1;
            for (size_t i = 0; i < s->n; i += stride) {
                if (!usable(s->x[i], s->y[i], p->log_y)) continue;
                double x = px(fr, s->x[i]), y = py(fr, s->y[i]);
                hits += x >= cx[c] - 4 && x <= cx[c] + bw + 4 && y >= cy[c] - 4 && y <= cy[c] + bh + 4;
            }
        }
        if (hits < best_hits) best = c, best_hits = hits;
    }
    *bx = cx[best];
    *by = cy[best];
}

cm_status cm_svg_plot_write(const cm_svg_plot *p, FILE *f) {
    if (!p || !f) return cm_set_error(CM_ERR_INVALID_ARG, "cm_svg_plot_write: plot and stream must not be NULL");
    /* Data ranges. */
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
    bool any = false;
    for (size_t k = 0; k < p->n_series; k++) {
        const series *s = &p->s[k];
        for (size_t i = 0; i < s->n; i++) {
            if (!usable(s->x[i], s->y[i], p->log_y)) continue;
            double yv = p->log_y ? log10(s->y[i]) : s->y[i];
            xmin = fmin(xmin, s->x[i]), xmax = fmax(xmax, s->x[i]);
            ymin = fmin(ymin, yv), ymax = fmax(ymax, yv);
            any = true;
        }
    }
    frame fr;
    memset(&fr, 0, sizeof fr);
    fr.ay.log = p->log_y;
    set_range(&fr.ax, xmin, xmax, any);
    set_range(&fr.ay, ymin, ymax, any);

    /* Layout: the left margin fits the widest y tick label and the rotated y label. */
    double W = p->width, H = p->height;
    double top = p->title[0] ? 44 : 18, bottom = p->x_label[0] ? 56 : 36, right = 24;
    double plot_h = H - top - bottom;
    if (fr.ay.log) log_ticks(&fr.ay, plot_h);
    else linear_ticks(&fr.ay, plot_h / 55, plot_h, false);
    size_t widest = 1;
    for (int i = 0; i < fr.ay.n_ticks; i++) {
        size_t w = strlen(fr.ay.labels[i]);
        if (w > widest) widest = w;
    }
    double left = 14 + (double)widest * CHAR_W + (p->y_label[0] ? 26 : 4);
    fr.x0 = left, fr.x1 = W - right, fr.y0 = top, fr.y1 = H - bottom;
    linear_ticks(&fr.ax, (fr.x1 - fr.x0) / 90, fr.x1 - fr.x0, true);

    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"" FONT "\">\n",
            p->width, p->height, p->width, p->height);
    fputs("<title>", f);
    put_text(f, p->title[0] ? p->title : "plot");
    fputs("</title>\n", f);
    fprintf(f, "<defs><clipPath id=\"plot-area\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>"
               "</clipPath></defs>\n",
            fr.x0, fr.y0, fr.x1 - fr.x0, fr.y1 - fr.y0);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");

    /* Grid and ticks. */
    fprintf(f, "<g class=\"grid\" stroke=\"#e5e5e5\" stroke-width=\"1\">\n");
    if (p->grid) {
        for (int i = 0; i < fr.ax.n_ticks; i++)
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", px(&fr, fr.ax.ticks[i]), fr.y0,
                    px(&fr, fr.ax.ticks[i]), fr.y1);
        for (int i = 0; i < fr.ay.n_ticks; i++)
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", fr.x0, py(&fr, fr.ay.ticks[i]),
                    fr.x1, py(&fr, fr.ay.ticks[i]));
    }
    fputs("</g>\n", f);
    fprintf(f, "<g class=\"x-ticks\" font-size=\"%g\" fill=\"#333\" text-anchor=\"middle\">\n", TICK_FONT_PX);
    for (int i = 0; i < fr.ax.n_ticks; i++) {
        double x = px(&fr, fr.ax.ticks[i]);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\"/>", x, fr.y1, x, fr.y1 + 4);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">", x, fr.y1 + 18);
        put_text(f, fr.ax.labels[i]);
        fputs("</text>\n", f);
    }
    fputs("</g>\n", f);
    fprintf(f, "<g class=\"y-ticks\" font-size=\"%g\" fill=\"#333\" text-anchor=\"end\">\n", TICK_FONT_PX);
    for (int i = 0; i < fr.ay.n_ticks; i++) {
        double y = py(&fr, fr.ay.ticks[i]);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\"/>", fr.x0 - 4, y, fr.x0, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">", fr.x0 - 7, y + TICK_FONT_PX * 0.35);
        put_text(f, fr.ay.labels[i]);
        fputs("</text>\n", f);
    }
    fputs("</g>\n", f);

    /* Series, clipped to the plot area. */
    fputs("<g class=\"series\" clip-path=\"url(#plot-area)\">\n", f);
    for (size_t k = 0; k < p->n_series; k++) write_series(f, p, &fr, &p->s[k], k_tab10[k % 10]);
    fputs("</g>\n", f);
    if (!any)
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"14\" fill=\"#888\" text-anchor=\"middle\">no data</text>\n",
                (fr.x0 + fr.x1) / 2, (fr.y0 + fr.y1) / 2);
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#444\" "
               "stroke-width=\"1\"/>\n",
            fr.x0, fr.y0, fr.x1 - fr.x0, fr.y1 - fr.y0);

    /* Title and axis labels. */
    if (p->title[0]) {
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"15\" font-weight=\"bold\" fill=\"#222\" "
                   "text-anchor=\"middle\">", (fr.x0 + fr.x1) / 2, top / 2 + 6);
        put_text(f, p->title);
        fputs("</text>\n", f);
    }
    if (p->x_label[0]) {
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" fill=\"#222\" text-anchor=\"middle\">",
                (fr.x0 + fr.x1) / 2, H - 14);
        put_text(f, p->x_label);
        fputs("</text>\n", f);
    }
    if (p->y_label[0]) {
        double cy = (fr.y0 + fr.y1) / 2;
        fprintf(f, "<text x=\"18\" y=\"%.1f\" font-size=\"13\" fill=\"#222\" text-anchor=\"middle\" "
                   "transform=\"rotate(-90 18 %.1f)\">", cy, cy);
        put_text(f, p->y_label);
        fputs("</text>\n", f);
    }

    /* Legend in the upper right. */
    if (p->legend && p->n_series) {
        size_t longest = 1;
        for (size_t k = 0; k < p->n_series; k++) {
            size_t w = strlen(p->s[k].name);
            if (w > longest) longest = w;
        }
        double row = 19, bw = 42 + (double)longest * 0.6 * 12, bh = 10 + row * (double)p->n_series;
        double bx, by;
        legend_place(p, &fr, bw, bh, &bx, &by);
        fprintf(f, "<g class=\"legend\" font-size=\"12\" fill=\"#222\">\n");
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" rx=\"4\" fill=\"white\" "
                   "fill-opacity=\"0.85\" stroke=\"#ccc\"/>\n", bx, by, bw, bh);
        for (size_t k = 0; k < p->n_series; k++) {
            const char *c = k_tab10[k % 10];
            double y = by + 5 + row * ((double)k + 0.5);
            if (p->s[k].style != CM_SVG_PLOT_MARKERS)
                fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>",
                        bx + 8, y, bx + 30, y, c);
            if (p->s[k].style != CM_SVG_PLOT_LINE)
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>", bx + 19, y, c);
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">", bx + 36, y + 4);
            put_text(f, p->s[k].name);
            fputs("</text>\n", f);
        }
        fputs("</g>\n", f);
    }
    fputs("</svg>\n", f);
    if (fflush(f) != 0 || ferror(f)) return cm_set_error(CM_ERR_IO, "svg plot: writing failed: %s", strerror(errno));
    return CM_OK;
}

cm_status cm_svg_plot_save(const cm_svg_plot *p, const char *path) {
    if (!p || !path) return cm_set_error(CM_ERR_INVALID_ARG, "cm_svg_plot_save: plot and path must not be NULL");
    size_t n = strlen(path) + 32;
    char *tmp = cm_alloc(n, 16);
    if (!tmp) return CM_ERR_OOM;
    snprintf(tmp, n, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        cm_status st = cm_set_error(CM_ERR_IO, "svg plot '%s': cannot create '%s': %s", path, tmp, strerror(errno));
        cm_free(tmp);
        return st;
    }
    cm_status st = cm_svg_plot_write(p, f);
    if (fclose(f) != 0 && st == CM_OK) st = cm_set_error(CM_ERR_IO, "svg plot '%s': %s", path, strerror(errno));
    if (st == CM_OK && rename(tmp, path) != 0)
        st = cm_set_error(CM_ERR_IO, "svg plot '%s': cannot move it into place: %s", path, strerror(errno));
    else if (st != CM_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", cm_last_error());
        st = cm_set_error(st, "svg plot '%s': %s", path, why);
    }
    if (st != CM_OK) unlink(tmp);
    cm_free(tmp);
    return st;
}

/* ---- metrics file to plot ------------------------------------------------------------------ */

typedef struct collect {
    const char *const *patterns;
    size_t n_patterns;
    series *s;
    size_t n, cap;
    size_t *caps;     /* point capacity per series */
    char *seen[8];    /* a few unmatched names, for the error message */
    int n_seen;
} collect;

static cm_status grow_points(series *s, size_t *cap) {
    if (s->n < *cap) return CM_OK;
    size_t nc = *cap ? 2 * *cap : 64;
    double *nx = cm_alloc(nc * sizeof *nx, 64), *ny = cm_alloc(nc * sizeof *ny, 64);
    if (!nx || !ny) {
        cm_free(nx);
        cm_free(ny);
        return CM_ERR_OOM;
    }
    if (s->n) {
        memcpy(nx, s->x, s->n * sizeof *nx);
        memcpy(ny, s->y, s->n * sizeof *ny);
    }
    cm_free(s->x);
    cm_free(s->y);
    s->x = nx, s->y = ny, *cap = nc;
    return CM_OK;
}

static cm_status on_record(void *data, int64_t line, int64_t batch, int64_t epoch, const char *name, double value) {
    (void)line, (void)epoch;
    collect *c = data;
    bool match = false;
    for (size_t i = 0; i < c->n_patterns && !match; i++) match = fnmatch(c->patterns[i], name, 0) == 0;
    if (!match) {
        if (c->n_seen < 8) {
            for (int i = 0; i < c->n_seen; i++)
                if (strcmp(c->seen[i], name) == 0) return CM_OK;
            if (!(c->seen[c->n_seen] = dup_str(name))) return CM_ERR_OOM;
            c->n_seen++;
        }
        return CM_OK;
    }
    size_t k = 0;
    while (k < c->n && strcmp(c->s[k].name, name) != 0) k++;
    if (k == c->n) {
        if (c->n == c->cap) {
            size_t cap = c->cap ? 2 * c->cap : 8;
            series *ns = cm_alloc_zeroed(cap * sizeof *ns, 16);
            size_t *ncaps = cm_alloc_zeroed(cap * sizeof *ncaps, 16);
            if (!ns || !ncaps) {
                cm_free(ns);
                cm_free(ncaps);
                return CM_ERR_OOM;
            }
            if (c->n) {
                memcpy(ns, c->s, c->n * sizeof *ns);
                memcpy(ncaps, c->caps, c->n * sizeof *ncaps);
            }
            cm_free(c->s);
            cm_free(c->caps);
            c->s = ns, c->caps = ncaps, c->cap = cap;
        }
        if (!(c->s[k].name = dup_str(name))) return CM_ERR_OOM;
        c->s[k].style = strstr(name, "eval") ? CM_SVG_PLOT_LINE_MARKERS : CM_SVG_PLOT_LINE;
        c->n++;
    }
    series *s = &c->s[k];
    double x = (double)batch;
    while (s->n > 0 && s->x[s->n - 1] >= x) s->n--; /* a resumed run re-logged these batches */
    cm_status st = grow_points(s, &c->caps[k]);
    if (st != CM_OK) return st;
    s->x[s->n] = x;
    s->y[s->n] = value;
    s->n++;
    return CM_OK;
}

cm_status cm_svg_plot_metrics_file(const char *jsonl_path, const char *svg_path, const char *const *patterns,
                                   size_t n, const cm_svg_plot_config *cfg) {
    if (!jsonl_path || !svg_path || (n && !patterns))
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "cm_svg_plot_metrics_file: jsonl_path, svg_path (and patterns when n > 0) must not be NULL");
    static const char *const k_default[] = {"loss*", "metrics/eval*CrossEntropy*"};
    if (!patterns || !n) patterns = k_default, n = 2;
    collect c = {.patterns = patterns, .n_patterns = n};
    cm_svg_plot *plot = NULL;
    cm_status st = cm_metrics_file_read(jsonl_path, on_record, &c);
    if (st == CM_OK && c.n == 0) {
        char pats[512] = "", names[512] = "";
        for (size_t i = 0; i < n; i++)
            snprintf(pats + strlen(pats), sizeof pats - strlen(pats), "%s'%s'", i ? ", " : "", patterns[i]);
        for (int i = 0; i < c.n_seen; i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s'%s'", i ? ", " : "", c.seen[i]);
        st = cm_set_error(CM_ERR_NOT_FOUND, "plot of '%s': no metric matches %s (the file has %s%s)", jsonl_path, pats,
                          c.n_seen ? names : "no metrics", c.n_seen == 8 ? ", ..." : "");
    }
    if (st == CM_OK) {
        cm_svg_plot_config pc = cfg ? *cfg : cm_svg_plot_config_default();
        if (!cfg) pc.title = "Loss", pc.y_label = "loss";
        st = cm_svg_plot_new(&pc, &plot);
    }
    for (size_t k = 0; st == CM_OK && k < c.n; k++)
        st = cm_svg_plot_add_series(plot, c.s[k].name, c.s[k].x, c.s[k].y, c.s[k].n, c.s[k].style);
    if (st == CM_OK) st = cm_svg_plot_save(plot, svg_path);
    cm_svg_plot_free(plot);
    for (size_t k = 0; k < c.n; k++) {
        cm_free(c.s[k].name);
        cm_free(c.s[k].x);
        cm_free(c.s[k].y);
    }
    cm_free(c.s);
    cm_free(c.caps);
    for (int i = 0; i < c.n_seen; i++) cm_free(c.seen[i]);
    return st;
}
