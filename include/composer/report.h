/*
 * composer/report.h — reporting utilities for training runs: a terminal progress bar, a JSON Lines
 * metrics file, SVG line plots and the per-run output folder. They know nothing about the trainer:
 * loggers wrap them, and programs may use them directly.
 *
 *  - Progress bar (cm_progress): tqdm's look on a terminal, a single line redrawn in place
 *      train Epoch 0:  45%|█████████▍           | 450/1000 [00:12<00:15, 36.20ba/s, loss/train/total=1.9312]
 *    and, when the stream is not a terminal (a log file, a CI console), one clean line per interval
 *    (every 10% or every 60 s by default) with no carriage returns, no ANSI codes and no bar glyphs.
 *  - Metrics file (cm_metrics_file): one JSON object per line, flushed after each line:
 *      {"batch": 120, "epoch": 0, "loss/train/total": 1.93}
 *  - Plots (cm_svg_plot): a figure with title, axis labels, named series, 1-2-5 ticks, grid, legend,
 *    optional log-y, NaN gaps; written as a standalone SVG file. cm_svg_plot_metrics_file draws
 *    the loss curves of a metrics file in one call.
 *  - Run folder: runs/<run_name>/ holding config.yaml, log.txt, metrics.jsonl and loss.svg; names are
 *    generated like Composer's ("1718000000-brave-otter") when none is given.
 *
 *     char *dir;
 *     if (cm_run_folder_create("runs", NULL, &dir) != CM_OK) { fprintf(stderr, "%s\n", cm_last_error()); return 1; }
 *     char *mpath;
 *     cm_run_folder_path(dir, CM_RUN_FILE_METRICS, &mpath);
 *     cm_metrics_file *mf;
 *     cm_metrics_file_open(mpath, true, &mf);
 *     cm_progress_config pc = cm_progress_config_default();
 *     pc.total = 1000; pc.desc = "train Epoch 0";
 *     cm_progress *bar;
 *     cm_progress_new(&pc, &bar);
 *     for (int64_t b = 1; b <= 1000; b++) {
 *         double loss = 2.0 / (double)b;
 *         const char *names[] = {"loss/train/total"};
 *         cm_metrics_file_write(mf, b, 0, names, &loss, 1);
 *         cm_progress_update(bar, b, names, &loss, 1);
 *     }
 *     cm_progress_finish(bar);
 *     cm_progress_free(bar);
 *     cm_metrics_file_close(mf);
 *     char *svg;
 *     cm_run_folder_path(dir, CM_RUN_FILE_PLOT, &svg);
 *     cm_svg_plot_metrics_file(mpath, svg, NULL, 0, NULL);   // the loss and eval cross-entropy curves
 *     cm_free(svg); cm_free(mpath); cm_free(dir);
 *
 * Thread-safety: every object here is used from one thread at a time; distinct objects are
 * independent. The format helpers are thread-safe.
 */
#ifndef COMPOSER_REPORT_H
#define COMPOSER_REPORT_H

#include <composer/base.h>

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Format helpers (tqdm's and Composer's number formats)
 * ------------------------------------------------------------------------------------------- */

/* Room for any result of the format helpers below, NUL included (units are cut to 16 bytes). */
#define CM_FORMAT_MAX 64

/* A duration as tqdm prints it: "MM:SS" under an hour ("00:12", "59:59"), "H:MM:SS" from an hour
 * ("1:02:03", "27:46:40"); fractions of a second are dropped. Negative, NaN or infinite input gives
 * "?". Writes at most `cap` bytes (NUL included, truncating) and returns `buf`. */
char *cm_format_duration(double seconds, char *buf, size_t cap);

/* A number with an SI suffix and three significant digits, tqdm's format_sizeof: 0.5 -> "0.50",
 * 12.3 -> "12.3", 999 -> "999", 1234 -> "1.23k", 4.5e6 -> "4.50M", up to "Y". NaN -> "nan",
 * infinities -> "inf"/"-inf". Returns `buf`. */
char *cm_format_si(double x, char *buf, size_t cap);

/* A rate in units per second, as tqdm prints it but without tqdm's left padding: "36.20ba/s"; when
 * one unit takes more than a second the inverse, "2.50s/ba". With `si` the count is SI-formatted
 * ("1.23ktok/s"). A rate ≤ 0 or not finite is unknown: "?ba/s". `unit` NULL means "it". Returns `buf`. */
char *cm_format_rate(double units_per_s, const char *unit, bool si, char *buf, size_t cap);

/* A metric value as Composer's console logger prints floats: four decimals ("1.9312", "0.0100",
 * "1234.5000"), but scientific with four decimals where that would hide the digits or be too
 * long: non-zero |x| < 0.01 or |x| ≥ 1e6 ("6.0000e-04", "1.2346e+07"). Zero is "0.0000"; NaN is
 * "nan", infinities "inf"/"-inf". Returns `buf`. */
char *cm_format_metric(double x, char *buf, size_t cap);

/* The shortest decimal string that reads back (strtod) to exactly `x` — "0.1", "1.93", "1e-05",
 * "120", "-0", "6.0000000000000002e-05" when nothing shorter round-trips — in JSON number syntax
 * (which %g output is). NaN and infinities give "NaN", "Infinity", "-Infinity" (not JSON numbers:
 * the metrics file quotes them). Returns the length written (buf needs 25 bytes for any value). */
int cm_format_double_shortest(double x, char *buf, size_t cap);

/* ---------------------------------------------------------------------------------------------
 * Progress bar
 * ------------------------------------------------------------------------------------------- */

typedef struct cm_progress cm_progress;

typedef enum cm_progress_mode {
    CM_PROGRESS_AUTO = 0, /* a terminal bar when isatty(fileno(stream)), else lines */
    CM_PROGRESS_TTY = 1,  /* force the redrawn single-line bar */
    CM_PROGRESS_LINES = 2 /* force one plain line per interval */
} cm_progress_mode;

/* Settings of a progress bar. Start from cm_progress_config_default(). Strings are copied. */
typedef struct cm_progress_config {
    int64_t total;          /* units in the bar (batches in the epoch, or in the run); 0 = unknown:
                               no percentage, bar or ETA, just count, elapsed time and rate */
    const char *unit;       /* unit label, e.g. "ba" (default), "sp", "tok" */
    const char *desc;       /* the text before the colon, e.g. "train Epoch 0"; NULL or "" = none */
    FILE *stream;           /* where to draw; NULL = stderr. Not closed by the bar. */
    cm_progress_mode mode;  /* default CM_PROGRESS_AUTO */
    int width;              /* line width in columns; 0 = the terminal's (TIOCGWINSZ, re-read at each
                               redraw), else $COLUMNS, else 80. Terminal lines are cut to this width. */
    double min_interval_s;  /* terminal: least seconds between redraws (default 0.1); the final state
                               (n == total, or finish) is always drawn */
    double line_every_frac; /* lines mode: a line each time n crosses a multiple of this fraction of
                               total (default 0.1; 0 = off) */
    double line_every_s;    /* lines mode: also a line when this many seconds passed since the last
                               one (default 60; 0 = off) */
    double smoothing;       /* rate estimate: exponential moving average factor as tqdm's (default
                               0.3; 0 = the overall average n / elapsed) */
    bool unit_scale;        /* counts and rates with SI suffixes (1.23k) — for samples and tokens */
    bool leave;             /* keep the finished bar on the terminal (default true) or erase it */
    double (*clock)(void *clock_data); /* seconds, monotonic; NULL = cm_clock_s. Tests inject one. */
    void *clock_data;
} cm_progress_config;

cm_progress_config cm_progress_config_default(void);

/* Creates a bar and, on a terminal, draws it at 0. `total` < 0, a negative interval or width, or a
 * smoothing outside [0, 1] is CM_ERR_INVALID_ARG; CM_ERR_OOM. The caller frees with cm_progress_free. */
cm_status cm_progress_new(const cm_progress_config *cfg, cm_progress **out);

/* Frees the bar (finishing it first if cm_progress_finish was not called). NULL is a no-op. */
void cm_progress_free(cm_progress *p);

/* Sets (or replaces) named values shown after the rate as "name=value" (cm_format_metric), in the
 * order names were first set — like Composer's bar, which keeps the latest value of each metric.
 * Does not draw. CM_ERR_INVALID_ARG for a NULL name; CM_ERR_OOM. */
cm_status cm_progress_set_metric(cm_progress *p, const char *name, double value);

/* Removes every metric shown. */
void cm_progress_clear_metrics(cm_progress *p);

/* Records that `n_done` units are done (absolute, not an increment; it may only grow — a smaller
 * value is CM_ERR_INVALID_ARG), sets the `n` metrics given (names/values may be NULL when n is 0),
 * and draws if due: on a terminal when min_interval_s has passed since the last redraw or the bar
 * is complete; in lines mode when a fraction step or line_every_s was crossed. n_done may exceed
 * total (shown as is, 100%). Write errors on the stream are ignored (a progress bar never stops
 * training). */
cm_status cm_progress_update(cm_progress *p, int64_t n_done, const char *const *names, const double *values,
                             size_t n);

/* Prints a message line without garbling the bar (tqdm.write): on a terminal the bar is cleared, the
 * line printed, and the bar redrawn under it. A trailing newline in `msg` is not needed. */
void cm_progress_write(cm_progress *p, const char *msg);

/* Draws the final state and ends the line (a terminal bar stays on screen unless leave is false, in
 * which case it is erased); in lines mode prints a last line unless the last printed one already
 * shows the current count. Further updates are ignored. Idempotent. */
void cm_progress_finish(cm_progress *p);

/* Formats the bar as it would be drawn now into buf (no "\r" or escape codes), for `tty` the
 * terminal form with the bar and cut to the width, else the lines-mode form. Returns `buf`. Meant
 * for tests and for loggers that want the text. */
char *cm_progress_format(cm_progress *p, bool tty, char *buf, size_t cap);

/* ---------------------------------------------------------------------------------------------
 * Metrics file (JSON Lines)
 * ------------------------------------------------------------------------------------------- */

/* One JSON object per line: "batch" and "epoch" first (integers), then each metric in call order:
 *     {"batch": 120, "epoch": 0, "loss/train/total": 1.93, "lr-AdamW/group0": 6e-05}
 * Names are JSON-escaped. Numbers are the shortest decimal that reads back to the same double
 * (cm_format_double_shortest), so values survive the file exactly. NaN and infinities, which JSON
 * has no numbers for, are written as the strings "NaN", "Infinity" and "-Infinity" (Python's
 * float() parses them; a strict JSON reader still reads the line) — they tell a diverged loss from an
 * overflow, which null would not. Each line is written with one fwrite and flushed, so a crash
 * leaves only complete lines (plus at most one truncated last line, which the reader skips). */
typedef struct cm_metrics_file cm_metrics_file;

/* Opens `path` for writing: truncating it, or with `append` adding to its end (resuming a run).
 * When appending to a file whose last line is incomplete (a crash mid-write), that partial line is
 * cut off first, with a warning, so the file stays valid. Errors: CM_ERR_IO naming the path and
 * the system's reason; CM_ERR_INVALID_ARG for NULL. */
cm_status cm_metrics_file_open(const char *path, bool append, cm_metrics_file **out);

/* Writes one line. `n` may be 0 (then names/values may be NULL). A NULL or empty name, a name used
 * twice in the call, or a name "batch" or "epoch" is CM_ERR_INVALID_ARG (nothing written). A failed
 * write or flush is CM_ERR_IO naming the path. */
cm_status cm_metrics_file_write(cm_metrics_file *f, int64_t batch, int64_t epoch, const char *const *names,
                                const double *values, size_t n);

/* Flushes, closes and frees. Returns CM_ERR_IO (naming the path) if the final flush or close
 * failed; the object is freed either way. NULL is a no-op returning CM_OK. */
cm_status cm_metrics_file_close(cm_metrics_file *f);

/* The path the file was opened with (borrowed; valid until close). */
const char *cm_metrics_file_path(const cm_metrics_file *f);

/* The file's length in bytes now (every line is flushed as it is written): where the next line
 * goes. -1 (with an error set) if the system cannot say. */
int64_t cm_metrics_file_size(const cm_metrics_file *f);

/* Removes the bytes [from, to) — whole lines — from the file, keeping what follows `to`, and goes
 * on writing at the end: a resumed run drops the lines an interrupted run wrote after its last
 * checkpoint (from = the file's size when that checkpoint was saved) while keeping the lines it has
 * written itself since it opened the file (to = the size at open). CM_ERR_INVALID_ARG when not
 * 0 <= from <= to <= size, or when `from` or `to` is not at the start of a line (the file is then
 * unchanged); CM_ERR_IO naming the path on a read or write failure. */
cm_status cm_metrics_file_cut(cm_metrics_file *f, int64_t from, int64_t to);

/* Called once per metric of each line, in file order: `line` is 1-based, `value` may be NaN or
 * infinite (from "NaN"/"Infinity"/"-Infinity" or null, which reads as NaN). `name` is valid during
 * the call only. Return CM_OK to go on; any other status stops reading and is returned as is. */
typedef cm_status (*cm_metrics_record_fn)(void *data, int64_t line, int64_t batch, int64_t epoch, const char *name,
                                          double value);

/* Reads a metrics file. Strict: every line must be a JSON object with integer "batch" and "epoch"
 * and number (or the strings above, or null) values, no key twice; anything else is CM_ERR_FORMAT
 * with "<path>:<line>: <what is wrong>". Blank lines are skipped. A last line without its newline
 * that does not parse (a crash mid-write) is ignored with a warning (cm_log_msg); one that parses
 * is used. Missing or unreadable file: CM_ERR_IO naming the path. */
cm_status cm_metrics_file_read(const char *path, cm_metrics_record_fn fn, void *data);

/* ---------------------------------------------------------------------------------------------
 * SVG plots
 * ------------------------------------------------------------------------------------------- */

typedef struct cm_svg_plot cm_svg_plot;

typedef struct cm_svg_plot_config {
    const char *title;   /* NULL or "" = none */
    const char *x_label; /* default "batch" */
    const char *y_label; /* NULL or "" = none */
    int width, height;   /* pixels; defaults 800 x 500, at least 200 x 150 */
    bool log_y;          /* logarithmic y axis; values ≤ 0 become gaps */
    bool legend;         /* legend box in the corner hiding the fewest points, upper right first
                            (default true; drawn only with ≥ 1 series) */
    bool grid;           /* light grid lines at the ticks (default true) */
} cm_svg_plot_config;

cm_svg_plot_config cm_svg_plot_config_default(void);

typedef enum cm_svg_plot_style {
    CM_SVG_PLOT_LINE = 0,         /* a polyline; isolated points (NaN on both sides) drawn as dots */
    CM_SVG_PLOT_MARKERS = 1,      /* a circle per point */
    CM_SVG_PLOT_LINE_MARKERS = 2  /* both */
} cm_svg_plot_style;

/* A new, empty figure (strings copied). CM_ERR_INVALID_ARG for a size below the minimum; CM_ERR_OOM. */
cm_status cm_svg_plot_new(const cm_svg_plot_config *cfg, cm_svg_plot **out);
void cm_svg_plot_free(cm_svg_plot *p);

/* Adds a series (the name and the n points are copied). Colours follow matplotlib's tab10 cycle
 * in the order series are added. NaN or infinite x or y (and y ≤ 0 on a log axis) break the line:
 * a gap. Points need not be sorted; they are drawn in the order given. CM_ERR_INVALID_ARG for a NULL
 * name, or NULL x/y with n > 0; CM_ERR_OOM. */
cm_status cm_svg_plot_add_series(cm_svg_plot *p, const char *name, const double *x, const double *y, size_t n,
                                 cm_svg_plot_style style);

/* Writes the figure as a standalone SVG document (UTF-8, text XML-escaped) to `stream`. Axes span
 * the finite data with 5% margins, ticks are at 1-2-5 multiples (log-y: powers of ten, with 2 and
 * 5 between them when the range is under three decades), spaced so labels do not overlap. With no
 * finite point the axes are drawn empty with "no data". CM_ERR_IO if the stream reports an error. */
cm_status cm_svg_plot_write(const cm_svg_plot *p, FILE *stream);

/* Writes the SVG to `path` atomically (a temporary file in the same folder, then rename), so a
 * reader never sees half a plot. CM_ERR_IO naming the path. */
cm_status cm_svg_plot_save(const cm_svg_plot *p, const char *path);

/* Draws series of a metrics file (cm_metrics_file_read; batch on x) into an SVG at `svg_path`. Each
 * metric whose name matches one of the `n` glob patterns (fnmatch: '*' also matches '/') becomes a
 * series, in order of first appearance; names with "eval" in them are drawn with markers (they are
 * usually few points). patterns NULL = {"loss*", "metrics/eval*CrossEntropy*"}. When a batch goes
 * backwards within a series (a resumed run re-logging batches), the earlier points at or after it
 * are dropped, so the curve shows the run that continued. `cfg` NULL = defaults with title "Loss",
 * y label "loss". Errors: those of reading the file; CM_ERR_NOT_FOUND when no metric matches (the
 * message lists the patterns and some names found; no file is written); CM_ERR_IO writing. */
cm_status cm_svg_plot_metrics_file(const char *jsonl_path, const char *svg_path, const char *const *patterns,
                                   size_t n, const cm_svg_plot_config *cfg);

/* ---------------------------------------------------------------------------------------------
 * Run folder
 * ------------------------------------------------------------------------------------------- */

/* Standard file names inside a run folder. */
#define CM_RUN_FILE_CONFIG "config.yaml"   /* the resolved configuration */
#define CM_RUN_FILE_LOG "log.txt"          /* the console log */
#define CM_RUN_FILE_METRICS "metrics.jsonl" /* the metrics file */
#define CM_RUN_FILE_PLOT "loss.svg"         /* the loss curves */
#define CM_RUN_ROOT_DEFAULT "runs"

/* Room for any generated run name, NUL included. */
#define CM_RUN_NAME_MAX 64

/* A Composer-style run name "<unix_time>-<adjective>-<animal>" ("1718000000-brave-otter"), the
 * words picked by `entropy` (so all ranks agree when they share it). Writes at most `cap` bytes
 * (NUL included; CM_RUN_NAME_MAX is enough) and returns `buf`. */
char *cm_run_name_generate(int64_t unix_time, uint64_t entropy, char *buf, size_t cap);

/* Checks a run name: non-empty, at most 255 bytes, not "." or "..", no '/', no control characters.
 * CM_ERR_INVALID_ARG saying which rule is broken. */
cm_status cm_run_name_check(const char *name);

/* Creates (like mkdir -p) `<root>/<run_name>/` and returns its path in *out_path (the caller frees
 * it with cm_free). root NULL or "" = "runs". run_name NULL = a generated name from the current time
 * and /dev/urandom (rank 0 should generate and share it). An existing folder is reused as is (its
 * files are kept: autoresume needs them). Errors: CM_ERR_INVALID_ARG for a bad run name; CM_ERR_IO
 * naming the path that could not be created and why (e.g. a file in the way, no permission). */
cm_status cm_run_folder_create(const char *root, const char *run_name, char **out_path);

/* "<dir>/<file>" in a new string (the caller frees with cm_free); `file` is usually one of the
 * CM_RUN_FILE_* names. CM_ERR_INVALID_ARG for NULL; CM_ERR_OOM. */
cm_status cm_run_folder_path(const char *dir, const char *file, char **out_path);

/* ---------------------------------------------------------------------------------------------
 * PNG images
 * ------------------------------------------------------------------------------------------- */

/* Writes a width × height image of 8-bit pixels — channels 1 (gray) or 3 (RGB), rows top to
 * bottom, `pixels` holding width·height·channels bytes — as a PNG file (IHDR, one zlib-compressed
 * IDAT of filter-0 rows, IEND; CRC-32 on every chunk), through a temporary file renamed into
 * place. Errors: CM_ERR_INVALID_ARG (NULL, a side < 1 or > 65535, channels not 1 or 3), CM_ERR_IO
 * naming the path, CM_ERR_OOM. Thread-safe. */
cm_status cm_png_write(const char *path, int64_t width, int64_t height, int channels, const uint8_t *pixels);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_REPORT_H */
