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
 *  - Experiment trackers (the last section): TensorBoardLogger (tfevents files), MLFlowLogger (an
 *    MLflow tracking server's REST API) and WandBLogger (Weights & Biases, online or offline).
 *    MLflow and W&B were verified against their protocols with test servers, not live services.
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
 * Experiment trackers: TensorBoardLogger, MLFlowLogger, WandBLogger
 *
 * Composer's tracker loggers with Composer's argument names. None of them ever stops training:
 * a tracker that cannot be written or reached is retried (the network ones), then reported once
 * as a warning, and the run goes on — a FileLogger's metrics.jsonl keeps every value. The
 * network loggers (MLflow, W&B online) send from a thread of their own through a bounded queue,
 * so a slow or absent server never stalls a training step; what is queued is sent when the
 * logger closes (cm_trainer_close, or cm_trainer_free), within close_timeout.
 *
 * The MLflow and W&B loggers were verified against the HTTP protocols their official clients
 * speak (MLflow's REST API; W&B's GraphQL UpsertBucket and file_stream endpoints), with test
 * servers that implement and check those endpoints (tests/trackers/) — NOT against a live MLflow
 * or W&B service. The offline W&B folder was read back with a reader written from the wandb
 * client's source, not with `wandb sync` itself.
 *
 * Thread-safety: as every logger, a tracker belongs to its trainer's thread; the *_stats getters
 * may be called from any thread.
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

/* What a network tracker (MLflow, W&B) has done so far, for tests, dashboards and end-of-run
 * summaries (cm_mlflow_logger_stats, cm_wandb_logger_stats). */
typedef struct cm_tracker_stats {
    int64_t requests;        /* requests the server accepted */
    int64_t retries;         /* attempts repeated after a 429, a 5xx or a network error */
    int64_t failed_requests; /* requests given up on (no good answer after the retries) or rejected (4xx) */
    int64_t metrics_sent;    /* metric values the server accepted */
    int64_t metrics_dropped; /* values not sent: rejected, over the queue bound, or unsent at close */
    int64_t metrics_queued;  /* values waiting to be sent */
    int reports;             /* warnings printed about the tracker (each kind of trouble once) */
    bool down;               /* the last attempt got no good answer */
    bool finished;           /* the run was marked finished (or failed) on the server */
    char run_id[160];        /* the tracker's id of the run; "" until it exists */
    char last_error[512];    /* the last failure; "" if none */
} cm_tracker_stats;

/* Settings of an MLFlowLogger; start from cm_mlflow_logger_config_default(). Composer's
 * MLFlowLogger over MLflow's REST API (../shared/FORMATS.md §8) with libcurl:
 *  - the experiment: $MLFLOW_EXPERIMENT_ID if set, else experiment_name looked up
 *    (experiments/get-by-name) or created (experiments/create);
 *  - the run: $MLFLOW_RUN_ID if set; with resume, the run of the experiment tagged
 *    run_name=<the trainer's run name> (runs/search) if there is one; else runs/create with the
 *    run name, the start time and the tags mlflow.runName, mlflow.user ($USER),
 *    mlflow.source.name, mlflow.source.type=LOCAL, run_name (the trainer's run name, for resume),
 *    run_group if set, and `tags`;
 *  - hyperparameters as params, each key once (MLflow refuses to change a param: a later
 *    different value is left out with a warning); metrics with step = the batch and their
 *    wall-clock time, batched every flush_interval seconds into runs/log-batch requests within
 *    the API's limits (1000 metrics, 100 params, 1000 items, 1 MB); a value equal to the one sent
 *    for the same name less than log_duplicated_metric_every_n_steps steps before is skipped
 *    (Composer's rule); names MLflow would refuse (characters outside [A-Za-z0-9_-. /], paths
 *    like "a//b", longer than 250) are left out with a warning naming them (rename_metrics can
 *    give them a valid name);
 *  - at close, runs/update with status FINISHED, or FAILED when a fit started and did not reach
 *    FIT_END (an error or an interruption), and the end time.
 * Sending happens on a thread of the logger, never on the training thread. Requests are retried
 * on network errors, 429 and 5xx with exponential backoff (MLflow's client settings). While the
 * server is away the values wait in a queue of at most max_queued values (newer ones are dropped
 * when it is full, and counted); the first failure is reported once, the training goes on. At
 * close the logger spends at most close_timeout seconds sending what is left.
 * Environment: MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME, MLFLOW_EXPERIMENT_ID, MLFLOW_RUN_ID,
 * MLFLOW_TRACKING_TOKEN (Bearer) or MLFLOW_TRACKING_USERNAME / _PASSWORD (Basic),
 * MLFLOW_TRACKING_INSECURE_TLS, MLFLOW_TRACKING_SERVER_CERT_PATH, MLFLOW_TRACKING_CLIENT_CERT_PATH,
 * MLFLOW_HTTP_REQUEST_MAX_RETRIES / _BACKOFF_FACTOR / _BACKOFF_JITTER / _TIMEOUT.
 * Verified against the protocol with a test server (tests/trackers/mlflow_server.py), not against
 * a live MLflow service. Not supported: the local file store (tracking URIs that are paths or
 * file:), artifacts, models, system metrics. */
typedef struct cm_mlflow_logger_config {
    const char *tracking_uri;    /* http(s)://host[:port][/prefix]; "databricks" = $DATABRICKS_HOST with
                                    $DATABRICKS_TOKEN; NULL = $MLFLOW_TRACKING_URI (required then) */
    const char *experiment_name; /* NULL = $MLFLOW_EXPERIMENT_NAME or "my-mlflow-experiment" */
    const char *run_name;        /* NULL = the trainer's run name */
    const char *const *tags;     /* n_tags (key, value) pairs: tags[2i] = tags[2i+1] */
    size_t n_tags;
    const char *run_group;       /* adds the tag run_group (NULL = none) */
    bool rank_zero_only;         /* only rank 0 logs (default true); else one run per rank, named
                                    <run_name>-rank<r> */
    double flush_interval;       /* seconds between sends (default 10, Composer's) */
    const char *const *rename_metrics; /* n_rename (from, to) pairs: exact names */
    size_t n_rename;
    const char *const *ignore_metrics; /* fnmatch patterns of metrics not sent */
    size_t n_ignore_metrics;
    const char *const *ignore_hyperparameters; /* fnmatch patterns of hyperparameters not sent */
    size_t n_ignore_hyperparameters;
    bool resume;                 /* reuse the run tagged with this run name (default false) */
    int64_t log_duplicated_metric_every_n_steps; /* default 100 (Composer's) */
    int max_retries;             /* -1 = $MLFLOW_HTTP_REQUEST_MAX_RETRIES or 7 */
    double backoff_factor;       /* < 0 = $MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR or 2 (seconds) */
    double backoff_jitter;       /* < 0 = $MLFLOW_HTTP_REQUEST_BACKOFF_JITTER or 1 (seconds) */
    double request_timeout;      /* <= 0 = $MLFLOW_HTTP_REQUEST_TIMEOUT or 120 (seconds) */
    double close_timeout;        /* seconds the close may spend sending (default 60) */
    int64_t max_queued;          /* values kept while the server is away (default 100000) */
} cm_mlflow_logger_config;

cm_mlflow_logger_config cm_mlflow_logger_config_default(void);

/* A new MLFlowLogger plugin. Strings are copied. Errors: CM_ERR_INVALID_ARG naming the setting:
 * NULL, no tracking URI (and no $MLFLOW_TRACKING_URI), a URI that is not http(s) (or
 * "databricks" without $DATABRICKS_HOST), an empty experiment name, bad intervals, counts or
 * timeouts, NULL entries in the lists, a tag or param name MLflow would refuse, a non-numeric
 * MLFLOW_HTTP_REQUEST_* variable; CM_ERR_OOM. Nothing is sent before INIT. */
cm_status cm_mlflow_logger_new(const cm_mlflow_logger_config *cfg, cm_logger_plugin *out);

/* A snapshot of what the logger has done (thread-safe: the sending thread updates it). Errors:
 * CM_ERR_INVALID_ARG if `p` is not an MLFlowLogger or out is NULL. */
cm_status cm_mlflow_logger_stats(const cm_logger_plugin *p, cm_tracker_stats *out);

/* How a WandBLogger runs (wandb.init's mode). */
typedef enum cm_wandb_mode {
    CM_WANDB_ONLINE = 0,  /* send to the server as the run goes */
    CM_WANDB_OFFLINE = 1, /* write a run folder to upload later with `wandb sync` */
    CM_WANDB_DISABLED = 2 /* log nothing */
} cm_wandb_mode;

/* Settings of a WandBLogger; start from cm_wandb_logger_config_default(). Composer's WandBLogger
 * (wandb.init's project, entity, name, group, tags, notes, job_type, mode, dir, id) without the
 * wandb client: the logger speaks the HTTP protocol the official client speaks.
 *  - Online: a GraphQL UpsertBucket mutation (POST <base>/graphql, the API key as HTTP Basic
 *    "api:<key>") creates the run — name = the run id, displayName, project, entity, group, tags,
 *    notes, jobType, host, and the config ({"<hyperparameter>": {"value": v}}, sent again when
 *    hyperparameters arrive) — then POST <base>/files/<entity>/<project>/<run id>/file_stream
 *    sends the history ("wandb-history.jsonl": one JSON line per step with the step's values,
 *    "_step", "_runtime", "_timestamp"; lines appended at their offsets) and the summary
 *    ("wandb-summary.json": the latest value of each key) every flush_interval seconds, and at
 *    close {"complete": true, "exitcode": 0 (or 1 when a fit started and did not end)}.
 *  - Offline: <dir>/wandb/offline-run-<YYYYMMDD_HHMMSS>-<run id>/run-<run id>.wandb, the
 *    client's transaction log: the LevelDB-log framing with wandb's ":W&B" header and CRC-32
 *    (wandb/sdk/internal/datastore.py) around Record protos (wandb_internal.proto) — Header, Run
 *    (id, entity, project, display name, group, tags, notes, job type, host, start time), Config
 *    when hyperparameters arrive, a History record per step, and at close Summary and Exit.
 *    `wandb sync <that folder>` is meant to upload it; the tests read it with a reader written
 *    from datastore.py and the protos, not with `wandb sync` itself.
 * Steps are the batch (Composer's step); values logged at one step go into one history row;
 * a step lower than the current one is dropped with a warning (as wandb does). Names are sent as
 * they are. Sending happens on a thread of the logger, with retries on network errors, 429 and
 * 5xx (backoff from 2 s up to 60 s, wandb's); a server that is away is reported once, rows wait
 * in a queue of at most max_queued rows, and the close spends at most close_timeout seconds.
 * Environment (as wandb's): WANDB_API_KEY (required online), WANDB_BASE_URL (default
 * https://api.wandb.ai), WANDB_MODE, WANDB_PROJECT, WANDB_ENTITY, WANDB_NAME, WANDB_RUN_GROUP,
 * WANDB_TAGS (comma-separated), WANDB_NOTES, WANDB_JOB_TYPE, WANDB_RUN_ID, WANDB_DIR; settings
 * in the config win over the environment. Verified against the protocol with a test server
 * (tests/trackers/wandb_server.py), not against the live W&B service. Not supported: artifacts
 * (log_artifacts), media, system metrics, console capture, resuming a run. */
typedef struct cm_wandb_logger_config {
    const char *project, *entity; /* NULL = $WANDB_PROJECT / $WANDB_ENTITY, else the server's default
                                     (the API key's entity; project "uncategorized") */
    const char *name;             /* display name; NULL = $WANDB_NAME or the trainer's run name */
    const char *group;            /* NULL = $WANDB_RUN_GROUP */
    const char *const *tags;      /* n_tags strings; none = $WANDB_TAGS */
    size_t n_tags;
    const char *notes, *job_type; /* NULL = $WANDB_NOTES / $WANDB_JOB_TYPE */
    const char *id;               /* the run id; NULL = $WANDB_RUN_ID or 8 random [a-z0-9] */
    int mode;                     /* a cm_wandb_mode; -1 = $WANDB_MODE ("online", "offline",
                                     "disabled"/"dryrun" as wandb reads it) or online */
    const char *dir;              /* the folder holding wandb/ (offline); NULL = $WANDB_DIR or "." */
    bool rank_zero_only;          /* only rank 0 logs (default true); else <name>-rank<r>, grouped */
    double flush_interval;        /* seconds between file_stream requests (default 15, wandb's) */
    int max_retries;              /* per request (default 7) */
    double backoff_s;             /* the first retry's wait, doubling up to 60 s (default 2) */
    double request_timeout;       /* seconds (default 180, wandb's) */
    double close_timeout;         /* seconds the close may spend sending (default 60) */
    int64_t max_queued;           /* history rows kept while the server is away (default 100000) */
} cm_wandb_logger_config;

cm_wandb_logger_config cm_wandb_logger_config_default(void);

/* A new WandBLogger plugin. Strings are copied. Errors: CM_ERR_INVALID_ARG naming the setting
 * (NULL, no WANDB_API_KEY online, a base URL that is not http(s), a bad mode or run id (wandb's
 * rule: letters, digits, '-' and '_', at most 128), bad intervals or counts, NULL tags);
 * CM_ERR_OOM. The offline folder is created at INIT (an error there fails INIT naming it). */
cm_status cm_wandb_logger_new(const cm_wandb_logger_config *cfg, cm_logger_plugin *out);

/* A snapshot of what the logger has done (thread-safe). Offline: run_id is set at INIT and
 * metrics_sent counts the values written to the run folder. Errors: CM_ERR_INVALID_ARG if `p` is
 * not a WandBLogger or out is NULL. */
cm_status cm_wandb_logger_stats(const cm_logger_plugin *p, cm_tracker_stats *out);

/* The offline run folder after INIT (borrowed, valid while the plugin lives); NULL online, before
 * INIT or on a rank that does not log. */
const char *cm_wandb_logger_run_dir(const cm_logger_plugin *p);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_LOGGERS_H */
