/*
 * composer/loggers.h — where a run's metrics go: the logger destinations of the Trainer, after
 * Composer's loggers, and the run folder they write into.
 *
 *  - ProgressBarLogger: a tqdm-style bar per train epoch and per evaluation on a terminal
 *      train Epoch 0:  45%|█████████▍           | 450/1000 [00:12<00:15, 36.20ba/s, loss/train/total=1.9312]
 *    and one clean line per interval when the stream is not a terminal (a log file, CI).
 *  - ConsoleLogger: Composer's console blocks, every log_interval and at each eval's end
 *      [batch=120/1000]:
 *      	 Train loss/train/total: 1.9312
 *    and the hyperparameters once, at the start of fit, as a YAML block.
 *  - FileLogger: the run folder <root>/<run_name>/ with metrics.jsonl (one JSON object per log
 *    call: {"batch": 120, "epoch": 0, "loss/train/total": 1.93}), log.txt (the ConsoleLogger's
 *    text) and, at the end of fit, loss.svg (train and eval loss curves).
 *  - Experiment trackers (the last section): TensorBoardLogger (tfevents files).
 *  - InMemoryLogger is in composer/trainer.h.
 *
 * All loggers of a run use the same folder: it is named after the state's run name
 * (cm_state_run_name; the trainer's run_name, or the one it generated), so FileLoggers — and
 * programs calling cm_run_folder_setup with that name — agree. config.yaml (the resolved
 * configuration) is written by whoever resolved it, with cm_run_folder_write_text.
 *
 *     cm_logger_plugin lg[2];
 *     cm_progress_bar_logger_config pc = cm_progress_bar_logger_config_default();
 *     cm_file_logger_config fc = cm_file_logger_config_default();   // runs/<run_name>/
 *     if (cm_progress_bar_logger_new(&pc, &lg[0]) != CM_OK || cm_file_logger_new(&fc, &lg[1]) != CM_OK)
 *         fprintf(stderr, "%s\n", cm_last_error());
 *     cm_trainer_config cfg = cm_trainer_config_default();
 *     cfg.run_name = "mnist-baseline";
 *     cfg.loggers = lg;  cfg.n_loggers = 2;                  // taken by cm_trainer_new on success
 *     ...
 *     cm_trainer *tr;
 *     if (cm_trainer_new(&cfg, &tr) != CM_OK)                // INIT creates runs/mnist-baseline/
 *         fprintf(stderr, "%s\n", cm_last_error());          // e.g. "... cannot create 'runs/...': ..."
 *     cm_run_folder_write_text(cm_file_logger_folder(&lg[1]), CM_RUN_FILE_CONFIG, yaml_text);
 *     cm_trainer_fit(tr, NULL);                               // FIT_END draws runs/mnist-baseline/loss.svg
 *     cm_trainer_free(tr);
 *
 * Metric names under "traces/" (algorithm traces) are left out by every logger here unless its
 * log_traces is set, as Composer does. Only rank 0 draws bars and writes files; the
 * ConsoleLogger prints on every rank (the hyperparameters on rank 0 only).
 *
 * Thread-safety: a logger belongs to its trainer's thread. The run folder functions are
 * thread-safe (distinct files).
 */
#ifndef COMPOSER_LOGGERS_H
#define COMPOSER_LOGGERS_H

#include <composer/report.h>
#include <composer/trainer.h>

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Run folder
 * ------------------------------------------------------------------------------------------- */

typedef struct cm_run_folder_config {
    const char *root;     /* the folder holding runs; NULL or "" = "runs" (CM_RUN_ROOT_DEFAULT) */
    const char *run_name; /* NULL = a generated Composer-style name ("1718000000-brave-otter") */
} cm_run_folder_config;

cm_run_folder_config cm_run_folder_config_default(void); /* root "runs", run_name NULL */

/* Creates <root>/<run_name>/ (like mkdir -p; an existing folder is reused with its files), checks
 * that it is writable, and returns its path in *out_path (the caller frees it with cm_free).
 * cfg NULL = defaults. Errors: CM_ERR_INVALID_ARG for a bad run name (cm_run_name_check) or NULL
 * out_path; CM_ERR_IO naming the folder and the system's reason (a file in the way, no
 * permission, not writable); CM_ERR_OOM. */
cm_status cm_run_folder_setup(const cm_run_folder_config *cfg, char **out_path);

/* Writes `text` to <dir>/<file> atomically (a temporary file in dir, then rename), replacing any
 * earlier version: for config.yaml (CM_RUN_FILE_CONFIG) and other small text files of a run.
 * `file` must be a plain name (no '/'). Errors: CM_ERR_INVALID_ARG (NULL, a bad file name),
 * CM_ERR_IO naming the path and the reason. */
cm_status cm_run_folder_write_text(const char *dir, const char *file, const char *text);

/* ---------------------------------------------------------------------------------------------
 * ProgressBarLogger
 * ------------------------------------------------------------------------------------------- */

/* Settings of a ProgressBarLogger; start from cm_progress_bar_logger_config_default(). The train
 * bar of each epoch ("train Epoch <e>") counts batches: its total is the batches per epoch, or
 * what is left of a max_duration in batches when that ends sooner; it shows the latest values of
 * the metrics logged under "loss/train". The eval bar ("<label>", e.g. "eval") runs from
 * EVAL_START to EVAL_END over the eval loader's batches and ends showing metrics/<label>/...
 * An evaluation in the middle of an epoch starts on a new line under the train bar. */
typedef struct cm_progress_bar_logger_config {
    FILE *stream;           /* NULL = stderr (Composer's default). Not closed by the logger. */
    cm_progress_mode mode;  /* CM_PROGRESS_AUTO: a redrawn bar on a terminal, else lines */
    int width;              /* columns; 0 = the terminal's */
    double line_every_frac; /* lines mode: a line per this fraction of an epoch (default 0.1) */
    double line_every_s;    /* lines mode: and at least one per this many seconds (default 60) */
    bool log_traces;        /* print "traces/..." metrics as "[trace]: name: value" lines */
    double (*clock)(void *clock_data); /* NULL = cm_clock_s; tests inject one */
    void *clock_data;
} cm_progress_bar_logger_config;

cm_progress_bar_logger_config cm_progress_bar_logger_config_default(void);

/* A new ProgressBarLogger as a plugin to register (cm_trainer_config.loggers or
 * cm_engine_add_logger; cm_logger_plugin_free if never registered). Errors: CM_ERR_INVALID_ARG
 * (NULL, a negative width or interval, a bad mode), CM_ERR_OOM. */
cm_status cm_progress_bar_logger_new(const cm_progress_bar_logger_config *cfg, cm_logger_plugin *out);

/* ---------------------------------------------------------------------------------------------
 * ConsoleLogger
 * ------------------------------------------------------------------------------------------- */

/* Settings of a ConsoleLogger; start from cm_console_logger_config_default(). Every log_interval
 * (at BATCH_END for batches, EPOCH_END for epochs; and always after the first batch and at the
 * end of fit) it prints the train metrics logged since the last block, latest value of each, in
 * first-logged order:
 *     [batch=120/1000]:
 *     	 Train time/batch: 119
 *     	 Train loss/train/total: 1.9312
 * At EVAL_END it prints the evaluation's metrics ("[Eval batch=8/8]:" then "\t Eval ..."). Values
 * use cm_format_metric ("1.9312", "6.0000e-04"); counts under time/ and trainer/ print as
 * integers. At the first FIT_START (or standalone eval or predict start) it prints the
 * hyperparameters: a line of 30 '*', "Config:", one "key: value" per line sorted by key (YAML),
 * and the '*' line again. */
typedef struct cm_console_logger_config {
    cm_time log_interval; /* batches or epochs; default 1ba */
    FILE *stream;         /* NULL = stderr (Composer's default). Not closed by the logger. */
    bool log_traces;      /* include "traces/..." metrics */
} cm_console_logger_config;

cm_console_logger_config cm_console_logger_config_default(void);

/* A new ConsoleLogger plugin. Errors: CM_ERR_INVALID_ARG (NULL, log_interval not in ba or ep or
 * not positive), CM_ERR_OOM. */
cm_status cm_console_logger_new(const cm_console_logger_config *cfg, cm_logger_plugin *out);

/* ---------------------------------------------------------------------------------------------
 * FileLogger
 * ------------------------------------------------------------------------------------------- */

/* Settings of a FileLogger; start from cm_file_logger_config_default(). At INIT it creates the
 * run folder — `folder` if set, else <root>/<cm_state_run_name(st)> — and opens its files there.
 *  - metrics.jsonl (CM_RUN_FILE_METRICS): one line per log call with "batch" and "epoch" first
 *    (the timestamp's), then the values in call order (cm_metrics_file; exact round-trip numbers,
 *    NaN as "NaN"). A name given twice in one call keeps the last value; a metric named "batch"
 *    or "epoch" is left out with a warning.
 *  - log.txt (CM_RUN_FILE_LOG): what a ConsoleLogger with the same log_interval would print.
 *  - loss.svg (CM_RUN_FILE_PLOT): at FIT_END, and at close when metrics came after the last
 *    plot, the curves of plot_patterns from metrics.jsonl (cm_svg_plot_metrics_file). A plot that
 *    cannot be drawn (no metric matched, a write error) is a warning: it does not fail the run. */
typedef struct cm_file_logger_config {
    const char *folder;        /* the run folder; NULL = <root>/<run name> (copied) */
    const char *root;          /* NULL or "" = "runs" (copied) */
    bool append;               /* add to existing metrics.jsonl / log.txt (a resumed run) instead
                                  of truncating them (default false, Composer's overwrite) */
    bool metrics_file;         /* write metrics.jsonl (default true) */
    bool text_log;             /* write log.txt (default true) */
    bool plot;                 /* write loss.svg (default true; needs metrics_file) */
    cm_time log_interval;      /* of log.txt, as the ConsoleLogger's (default 1ba) */
    int64_t flush_interval;    /* log.txt is flushed every this many batches (default 100; the
                                  metrics file flushes every line); also at epoch, eval and fit end */
    bool log_traces;           /* include "traces/..." metrics */
    const char *const *plot_patterns; /* fnmatch patterns of the plotted metrics; NULL = report.h's
                                         {"loss*", "metrics/eval*CrossEntropy*"} (copied) */
    size_t n_plot_patterns;
} cm_file_logger_config;

cm_file_logger_config cm_file_logger_config_default(void);

/* A new FileLogger plugin. Errors: CM_ERR_INVALID_ARG (NULL, a bad log_interval, flush_interval
 * < 1, plot_patterns NULL with n > 0), CM_ERR_OOM. Folder errors surface at INIT, from
 * cm_trainer_new: "plugin 'FileLogger' failed on INIT: ... '<path>': <reason>". */
cm_status cm_file_logger_new(const cm_file_logger_config *cfg, cm_logger_plugin *out);

/* The run folder of a FileLogger plugin after INIT (borrowed, valid while the plugin lives); NULL
 * before INIT, on ranks other than 0, or if `p` is not a FileLogger. */
const char *cm_file_logger_folder(const cm_logger_plugin *p);

/* ---------------------------------------------------------------------------------------------
 * Experiment trackers: TensorBoardLogger
 *
 * Composer's tracker loggers with Composer's argument names. None of them ever stops training:
 * a tracker that cannot be written is reported once as a warning, and the run goes on — a
 * FileLogger's metrics.jsonl keeps every value.
 * ------------------------------------------------------------------------------------------- */

/* Settings of a TensorBoardLogger; start from cm_tensorboard_logger_config_default(). At INIT it
 * creates <log_dir>/<run name>/ and the event file events.out.tfevents.<time>.<host>.<pid>.<n>
 * there (TensorBoard reads each subfolder of the logdir as a run: `tensorboard --logdir
 * tensorboard_logs`). It writes:
 *  - a scalar per logged metric (tag = the metric's name, step = the batch; values as float32,
 *    as TensorBoard stores them);
 *  - the hyperparameters as a text summary "hyperparameters/text_summary" (a Markdown table,
 *    sorted by key; written again when more arrive);
 *  - with histogram_interval > 0, every histogram_interval batches (at BATCH_END, after the
 *    optimizer step) a histogram per parameter ("parameters/<name>") and per gradient
 *    ("gradients/<name>") over TensorFlow's default buckets. NaN and infinite elements are left
 *    out of a histogram (and counted in a warning). Under SHARD_GRAD_OP / FULL_SHARD each rank
 *    histograms its shards and the counts are summed over the ranks, so every rank must run the
 *    logger (it does: all ranks get the plugin; only rank 0 writes with rank_zero_only).
 * The file is flushed every flush_interval batches, at EVAL_START, EVAL_END, EPOCH_END and
 * FIT_END, and at close. Files are checked with an independent reader (python3-protobuf) in the
 * tests: framing, CRCs, steps, tags and values. */
typedef struct cm_tensorboard_logger_config {
    const char *log_dir;        /* NULL or "" = "tensorboard_logs" (Composer's default); copied */
    int64_t flush_interval;     /* batches (default 100) */
    bool rank_zero_only;        /* only rank 0 writes (default true); else each rank its own file */
    bool log_traces;            /* include "traces/..." metrics (default false) */
    int64_t histogram_interval; /* batches between histograms; 0 = none (default) */
    bool histogram_params;      /* when histograms are on: of the parameters (default true) */
    bool histogram_grads;       /* and of their gradients (default true) */
} cm_tensorboard_logger_config;

cm_tensorboard_logger_config cm_tensorboard_logger_config_default(void);

/* A new TensorBoardLogger plugin. Errors: CM_ERR_INVALID_ARG (NULL, flush_interval < 1,
 * histogram_interval < 0, histograms on with neither params nor grads), CM_ERR_OOM. A folder or
 * file that cannot be created fails INIT (from cm_trainer_new) naming the path; a write error
 * later is a warning, once, and the logger stops writing. */
cm_status cm_tensorboard_logger_new(const cm_tensorboard_logger_config *cfg, cm_logger_plugin *out);

/* The event file of a TensorBoardLogger after INIT (borrowed, valid while the plugin lives); NULL
 * before INIT, on a rank that does not write, or if `p` is not a TensorBoardLogger. */
const char *cm_tensorboard_logger_file(const cm_logger_plugin *p);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_LOGGERS_H */
