/* SVG plots (include/composer/report.h): well-formed XML (a small checker here, and xmllint when
 * installed), series paths and legend labels, 1-2-5 ticks, log-y, NaN gaps, and the metrics-file
 * convenience. */
#include "cmtest.h"

#include <composer/report.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_dir[64];

static void make_dir(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/cm_svg_XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir), "mkdtemp failed");
}

static void remove_dir(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(svg_plot, .init = make_dir, .fini = remove_dir);

/* ---- a tiny XML well-formedness checker ------------------------------------------------------ */

static bool name_char(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == ':' || c == '.'; }

/* Text and attribute values: no '<', and '&' only as a known entity or a numeric reference. */
static const char *check_chars(const char *s, const char *end, char quote) {
    for (const char *c = s; c < end; c++) {
        if (*c == '<') return "'<' in text or attribute";
        if (quote && *c == quote) return "quote inside attribute";
        if ((unsigned char)*c < 0x20 && *c != '\n' && *c != '\t' && *c != '\r') return "control character";
        if (*c == '&') {
            static const char *const ents[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;", "&#"};
            bool ok = false;
            for (size_t i = 0; i < 6 && !ok; i++) ok = strncmp(c, ents[i], strlen(ents[i])) == 0;
            if (!ok) return "bare '&'";
        }
    }
    return NULL;
}

/* Returns NULL when `doc` is well-formed with a single <svg> root, else what is wrong. */
static const char *xml_check(const char *doc) {
    char stack[64][32];
    int depth = 0, roots = 0;
    const char *p = doc;
    if (strncmp(p, "<?xml", 5) == 0) {
        p = strstr(p, "?>");
        if (!p) return "unterminated XML declaration";
        p += 2;
    }
    while (*p) {
        const char *lt = strchr(p, '<');
        const char *text_end = lt ? lt : p + strlen(p);
        const char *err = check_chars(p, text_end, 0);
        if (err) return err;
        if (!lt) break;
        if (depth == 0)
            for (const char *c = p; c < lt; c++)
                if (*c != ' ' && *c != '\n') return "text outside the root element";
        p = lt + 1;
        if (strncmp(p, "!--", 3) == 0) {
            p = strstr(p, "-->");
            if (!p) return "unterminated comment";
            p += 3;
            continue;
        }
        bool closing = *p == '/';
        if (closing) p++;
        const char *n0 = p;
        while (name_char(*p)) p++;
        size_t nl = (size_t)(p - n0);
        if (nl == 0 || nl >= 32) return "bad element name";
        if (closing) {
            if (*p != '>') return "junk in closing tag";
            if (depth == 0 || strlen(stack[depth - 1]) != nl || strncmp(stack[depth - 1], n0, nl) != 0)
                return "mismatched closing tag";
            depth--;
            p++;
            continue;
        }
        /* Attributes. */
        for (;;) {
            while (*p == ' ' || *p == '\n') p++;
            if (*p == '>' || (p[0] == '/' && p[1] == '>')) break;
            const char *a0 = p;
            while (name_char(*p)) p++;
            if (p == a0 || *p != '=' || (p[1] != '"' && p[1] != '\'')) return "bad attribute";
            char q = p[1];
            const char *v0 = p + 2, *v1 = strchr(v0, q);
            if (!v1) return "unterminated attribute";
            if ((err = check_chars(v0, v1, q))) return err;
            p = v1 + 1;
            if (*p != ' ' && *p != '>' && *p != '/' && *p != '\n') return "no space between attributes";
        }
        if (depth == 0) {
            roots++;
            if (nl != 3 || strncmp(n0, "svg", 3) != 0) return "root element is not <svg>";
        }
        if (*p == '/') {
            p += 2;
            continue;
        }
        if (depth == 64) return "too deep";
        memcpy(stack[depth], n0, nl);
        stack[depth][nl] = '\0';
        depth++;
        p++;
    }
    if (depth != 0) return "unclosed element";
    if (roots != 1) return "not exactly one root element";
    return NULL;
}

Test(svg_plot, the_xml_checker_itself_rejects_broken_documents) {
    cr_assert_null(xml_check("<?xml version=\"1.0\"?>\n<svg a=\"1\"><g><text>a &amp; b</text></g><rect/></svg>\n"));
    cr_assert_not_null(xml_check("<svg><g></svg>"));
    cr_assert_not_null(xml_check("<svg><text>a & b</text></svg>"));
    cr_assert_not_null(xml_check("<svg><text>a < b</text></svg>"));
    cr_assert_not_null(xml_check("<svg a=\"x\"y\"></svg>"));
    cr_assert_not_null(xml_check("<svg></svg><svg></svg>"));
}

/* ---- helpers ---------------------------------------------------------------------------------- */

static char *render(const cm_svg_plot *p) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    cr_assert_eq(cm_svg_plot_write(p, f), CM_OK, "write: %s", cm_last_error());
    fclose(f);
    const char *err = xml_check(buf);
    cr_assert_null(err, "SVG is not well-formed XML: %s\n%s", err, buf);
    return buf;
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* The tick labels of the group `cls` ("x-ticks" or "y-ticks"), joined with spaces. */
static void tick_labels(const char *svg, const char *cls, char *out, size_t cap) {
    char key[64];
    snprintf(key, sizeof key, "class=\"%s\"", cls);
    const char *g = strstr(svg, key);
    cr_assert_not_null(g, "no %s group", cls);
    const char *end = strstr(g, "</g>");
    out[0] = '\0';
    for (const char *t = g; (t = strstr(t, "<text")) && t < end;) {
        t = strchr(t, '>') + 1;
        const char *te = strstr(t, "</text>");
        snprintf(out + strlen(out), cap - strlen(out), "%s%.*s", out[0] ? " " : "", (int)(te - t), t);
        t = te;
    }
}

/* The i-th path's d attribute inside the series group. */
static void series_path(const char *svg, int i, char *out, size_t cap) {
    const char *g = strstr(svg, "class=\"series\"");
    cr_assert_not_null(g);
    const char *p = g;
    for (int k = 0; k <= i; k++) {
        p = strstr(p, "<path");
        cr_assert_not_null(p, "series path %d missing", i);
        p += 5;
    }
    const char *d = strstr(p, " d=\"") + 4;
    const char *e = strchr(d, '"');
    snprintf(out, cap, "%.*s", (int)(e - d), d);
}

static cm_svg_plot *plot_new(const cm_svg_plot_config *cfg) {
    cm_svg_plot *p = NULL;
    cr_assert_eq(cm_svg_plot_new(cfg, &p), CM_OK, "new: %s", cm_last_error());
    return p;
}

/* ---- tests ------------------------------------------------------------------------------------ */

Test(svg_plot, is_well_formed_with_series_paths_escaped_legend_and_title) {
    cm_svg_plot_config cfg = cm_svg_plot_config_default();
    cfg.title = "Loss <GPT> & \"friends\"";
    cfg.y_label = "loss";
    cm_svg_plot *p = plot_new(&cfg);
    double x[50], a[50], b[50];
    for (int i = 0; i < 50; i++) x[i] = 20.0 * i, a[i] = 5.0 * exp(-i / 10.0) + 1, b[i] = a[i] + 0.3;
    cr_assert_eq(cm_svg_plot_add_series(p, "loss/train/total", x, a, 50, CM_SVG_PLOT_LINE), CM_OK);
    cr_assert_eq(cm_svg_plot_add_series(p, "loss/eval/<total>", x, b, 50, CM_SVG_PLOT_LINE_MARKERS), CM_OK);
    char *svg = render(p);
    cr_assert(strstr(svg, "Loss &lt;GPT&gt; &amp; &quot;friends&quot;"), "escaped title missing");
    cr_assert(strstr(svg, ">loss/train/total</text>"), "legend label 1 missing");
    cr_assert(strstr(svg, ">loss/eval/&lt;total&gt;</text>"), "legend label 2 missing (escaped)");
    cr_assert_eq(count(svg, "<path"), 2, "paths: %d, want 2", count(svg, "<path"));
    cr_assert(strstr(svg, "stroke=\"#1f77b4\""), "first tab10 colour missing");
    cr_assert(strstr(svg, "stroke=\"#ff7f0e\""), "second tab10 colour missing");
    cr_assert_eq(count(svg, "r=\"3.5\""), 50 + 1, "markers: %d, want 50 + 1 in the legend", count(svg, "r=\"3.5\""));
    char d[8192];
    series_path(svg, 0, d, sizeof d);
    cr_assert_eq(count(d, "M"), 1, "one unbroken line: %s", d);
    cr_assert_eq(count(d, " L"), 49, "49 segments: %s", d);
    free(svg);

    /* xmllint (libxml2-utils) is the reference when installed. */
    if (system("command -v xmllint >/dev/null 2>&1") == 0) {
        char path[128], cmd[256];
        snprintf(path, sizeof path, "%s/plot.svg", g_dir);
        cr_assert_eq(cm_svg_plot_save(p, path), CM_OK, "save: %s", cm_last_error());
        snprintf(cmd, sizeof cmd, "xmllint --noout '%s'", path);
        cr_assert_eq(system(cmd), 0, "xmllint rejected %s", path);
    }
    cm_svg_plot_free(p);
}

Test(svg_plot, linear_ticks_are_nice_numbers_that_do_not_overlap) {
    cm_svg_plot *p = plot_new(NULL);
    double x[] = {0, 1000}, y[] = {1.2, 5.8};
    cm_svg_plot_add_series(p, "s", x, y, 2, CM_SVG_PLOT_LINE);
    char *svg = render(p);
    char xs[512], ys[512];
    tick_labels(svg, "x-ticks", xs, sizeof xs);
    tick_labels(svg, "y-ticks", ys, sizeof ys);
    cr_assert_str_eq(xs, "0 200 400 600 800 1000", "x ticks: %s", xs);
    cr_assert_str_eq(ys, "1 2 3 4 5 6", "y ticks: %s", ys);
    free(svg);
    cm_svg_plot_free(p);

    /* A narrow plot with big numbers: fewer ticks, one suffix for the axis. */
    cm_svg_plot_config cfg = cm_svg_plot_config_default();
    cfg.width = 300;
    p = plot_new(&cfg);
    double bx[] = {0, 123456}, by[] = {0.001, 0.0042};
    cm_svg_plot_add_series(p, "s", bx, by, 2, CM_SVG_PLOT_LINE);
    svg = render(p);
    tick_labels(svg, "x-ticks", xs, sizeof xs);
    tick_labels(svg, "y-ticks", ys, sizeof ys);
    cr_assert_str_eq(xs, "0 50k 100k", "narrow x ticks: %s", xs);
    cr_assert_str_eq(ys, "0.0010 0.0015 0.0020 0.0025 0.0030 0.0035 0.0040", "small y ticks: %s", ys);
    free(svg);
    cm_svg_plot_free(p);
}

Test(svg_plot, log_y_uses_decades_and_drops_non_positive_values) {
    cm_svg_plot_config cfg = cm_svg_plot_config_default();
    cfg.log_y = true;
    cm_svg_plot *p = plot_new(&cfg);
    double x[] = {0, 1, 2, 3, 4, 5}, y[] = {1000, 100, 0, 10, 1, 0.01};
    cm_svg_plot_add_series(p, "s", x, y, 6, CM_SVG_PLOT_LINE);
    char *svg = render(p);
    char ys[512], d[2048];
    tick_labels(svg, "y-ticks", ys, sizeof ys);
    cr_assert_str_eq(ys, "0.01 0.1 1 10 100 1000", "log ticks: %s", ys);
    series_path(svg, 0, d, sizeof d);
    cr_assert_eq(count(d, "M"), 2, "0 on a log axis breaks the line: %s", d);
    cr_assert_eq(count(d, " L"), 3, "segments: %s", d);
    free(svg);
    cm_svg_plot_free(p);

    /* Under three decades: 1-2-5 ticks. */
    p = plot_new(&cfg);
    double y2[] = {0.15, 8};
    cm_svg_plot_add_series(p, "s", x, y2, 2, CM_SVG_PLOT_LINE);
    svg = render(p);
    tick_labels(svg, "y-ticks", ys, sizeof ys);
    cr_assert_str_eq(ys, "0.2 0.5 1 2 5", "1-2-5 log ticks: %s", ys);
    free(svg);
    cm_svg_plot_free(p);
}

Test(svg_plot, nan_breaks_lines_and_isolated_points_become_dots) {
    cm_svg_plot *p = plot_new(NULL);
    double x[] = {0, 1, 2, 3, 4, 5, 6, 7}, y[] = {1, 2, NAN, 3, 4, NAN, 5, NAN};
    cm_svg_plot_add_series(p, "gappy", x, y, 8, CM_SVG_PLOT_LINE);
    char *svg = render(p);
    char d[2048];
    series_path(svg, 0, d, sizeof d);
    cr_assert_eq(count(d, "M"), 2, "two runs: %s", d);
    cr_assert_eq(count(d, " L"), 2, "two segments: %s", d);
    cr_assert_eq(count(svg, "r=\"2\""), 1, "the lone point at x=6 is a dot");
    cr_assert_null(strstr(svg, "nan"), "NaN leaked into coordinates");
    free(svg);
    cm_svg_plot_free(p);
}

Test(svg_plot, empty_plot_says_no_data) {
    cm_svg_plot *p = plot_new(NULL);
    double x[] = {NAN}, y[] = {1};
    cm_svg_plot_add_series(p, "nothing", x, y, 1, CM_SVG_PLOT_MARKERS);
    char *svg = render(p);
    cr_assert(strstr(svg, ">no data</text>"), "no 'no data' text");
    free(svg);
    cm_svg_plot_free(p);
}

Test(svg_plot, bad_arguments_and_paths_are_errors) {
    cm_svg_plot_config cfg = cm_svg_plot_config_default();
    cfg.width = 100;
    cm_svg_plot *p = (cm_svg_plot *)1;
    cr_assert_eq(cm_svg_plot_new(&cfg, &p), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "100x500"), "message: %s", cm_last_error());
    cr_assert_null(p);
    p = plot_new(NULL);
    double v = 1;
    cr_assert_eq(cm_svg_plot_add_series(p, NULL, &v, &v, 1, CM_SVG_PLOT_LINE), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_svg_plot_add_series(p, "s", NULL, &v, 1, CM_SVG_PLOT_LINE), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_svg_plot_add_series(p, "s", &v, &v, 1, (cm_svg_plot_style)7), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_svg_plot_save(p, "/nonexistent-dir/plot.svg"), CM_ERR_IO);
    cr_assert(strstr(cm_last_error(), "/nonexistent-dir/plot.svg"), "message: %s", cm_last_error());
    cm_svg_plot_free(p);
    cm_svg_plot_free(NULL);
}

static void write_metrics(const char *path, bool resume) {
    cm_metrics_file *f;
    cr_assert_eq(cm_metrics_file_open(path, false, &f), CM_OK, "%s", cm_last_error());
    const char *tn[] = {"loss/train/total", "lr-AdamW/group0"};
    const char *en[] = {"loss/eval/total", "metrics/eval/LanguageCrossEntropy", "metrics/eval/Accuracy"};
    for (int b = 1; b <= 40; b++) {
        double tv[] = {3.0 / b + 1, 6e-4};
        cr_assert_eq(cm_metrics_file_write(f, b, 0, tn, tv, 2), CM_OK);
        if (b % 10 == 0) {
            double ev[] = {3.0 / b + 1.2, 3.0 / b + 1.1, 0.5};
            cr_assert_eq(cm_metrics_file_write(f, b, 0, en, ev, 3), CM_OK);
        }
        if (resume && b == 30) { /* crashed at 30, resumed from the checkpoint at 20 */
            for (int r = 21; r <= 30; r++) {
                double rv[] = {3.0 / r + 1, 6e-4};
                cr_assert_eq(cm_metrics_file_write(f, r, 0, tn, rv, 2), CM_OK);
            }
        }
    }
    cm_metrics_file_close(f);
}

Test(svg_plot, metrics_file_plot_draws_matching_series) {
    char jsonl[128], svgp[128];
    snprintf(jsonl, sizeof jsonl, "%s/metrics.jsonl", g_dir);
    snprintf(svgp, sizeof svgp, "%s/loss.svg", g_dir);
    write_metrics(jsonl, true);
    cr_assert_eq(cm_svg_plot_metrics_file(jsonl, svgp, NULL, 0, NULL), CM_OK, "plot: %s", cm_last_error());
    char *svg = cmt_read_file(svgp, NULL);
    cr_assert_null(xml_check(svg), "not well-formed: %s", xml_check(svg));
    cr_assert(strstr(svg, ">Loss</text>"), "default title missing");
    cr_assert(strstr(svg, ">loss/train/total</text>"));
    cr_assert(strstr(svg, ">loss/eval/total</text>"));
    cr_assert(strstr(svg, ">metrics/eval/LanguageCrossEntropy</text>"));
    cr_assert_null(strstr(svg, "Accuracy"), "Accuracy does not match the default patterns");
    cr_assert_null(strstr(svg, "lr-AdamW"), "lr does not match the default patterns");
    char d[8192];
    series_path(svg, 0, d, sizeof d);
    /* The re-logged batches 21..30 replace the first ones: 40 points, one line. */
    cr_assert_eq(count(d, " L"), 39, "train points after resume: %d segments, want 39", count(d, " L"));
    /* Eval series have markers: 4 points each, 2 series, + 2 legend markers. */
    cr_assert_eq(count(svg, "r=\"3.5\""), 10, "eval markers: %d", count(svg, "r=\"3.5\""));
    free(svg);

    /* Explicit patterns and config. */
    const char *pats[] = {"metrics/eval/Acc*"};
    cm_svg_plot_config cfg = cm_svg_plot_config_default();
    cfg.title = "Accuracy";
    cr_assert_eq(cm_svg_plot_metrics_file(jsonl, svgp, pats, 1, &cfg), CM_OK, "plot: %s", cm_last_error());
    svg = cmt_read_file(svgp, NULL);
    cr_assert(strstr(svg, ">metrics/eval/Accuracy</text>"));
    cr_assert_null(strstr(svg, "loss/train/total"));
    free(svg);
}

Test(svg_plot, metrics_file_plot_without_a_match_lists_the_names) {
    char jsonl[128], svgp[128];
    snprintf(jsonl, sizeof jsonl, "%s/metrics.jsonl", g_dir);
    snprintf(svgp, sizeof svgp, "%s/none.svg", g_dir);
    write_metrics(jsonl, false);
    const char *pats[] = {"loss/trian/*"};
    cr_assert_eq(cm_svg_plot_metrics_file(jsonl, svgp, pats, 1, NULL), CM_ERR_NOT_FOUND);
    const char *msg = cm_last_error();
    cr_assert(strstr(msg, "'loss/trian/*'") && strstr(msg, "'loss/train/total'"), "message: %s", msg);
    cr_assert_neq(access(svgp, F_OK), 0, "a plot was written");
    cr_assert_eq(cm_svg_plot_metrics_file("/nonexistent-dir/m.jsonl", svgp, NULL, 0, NULL), CM_ERR_IO);
}

Test(svg_plot, every_allocation_failure_is_reported_cleanly) {
    char jsonl[128], svgp[128];
    snprintf(jsonl, sizeof jsonl, "%s/metrics.jsonl", g_dir);
    snprintf(svgp, sizeof svgp, "%s/oom.svg", g_dir);
    write_metrics(jsonl, true);
    /* Fail the 1st, 2nd, ... allocation until the call gets through: each failure must come back
     * as CM_ERR_OOM with nothing leaked (the sanitizer build checks leaks). */
    int n;
    for (n = 1; n < 10000; n++) {
        cm_alloc_fail_at(n);
        cm_status st = cm_svg_plot_metrics_file(jsonl, svgp, NULL, 0, NULL);
        cm_alloc_fail_at(0);
        if (st == CM_OK) break;
        cr_assert_eq(st, CM_ERR_OOM, "failing allocation %d: %s (%s)", n, cm_status_name(st), cm_last_error());
    }
    cr_assert_gt(n, 5, "only %d allocations: the loop tested nothing", n);
    cr_assert_lt(n, 10000);
}
