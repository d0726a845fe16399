/* Helpers for the tracker logger tests (TensorBoard, MLflow, W&B): temporary folders, running a
 * helper program and reading its output, a tiny trainer to fit with the loggers under test, and
 * the local test servers of tests/trackers/ (started on a free loopback port, stopped at the end).
 * Every function aborts the test on failure. */
#ifndef CMTRACK_H
#define CMTRACK_H

#include <composer/composer.h>
#include <composer/loggers.h>
#include <composer/trainer.h>

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <sys/types.h>

/* A fresh folder /tmp/cm-<tag>-XXXXXX; cmt_tmpdir_remove deletes it with its contents. */
typedef struct {
    char dir[96];
} cmt_tmpdir;
cmt_tmpdir cmt_tmpdir_make(const char *tag);
void cmt_tmpdir_remove(cmt_tmpdir *t);

/* cmt_slurp is in cmtest.h. */

/* Runs a shell command and returns its stdout (malloc'd); *rc gets its exit status. */
char *cmt_run(const char *cmd, int *rc);

/* A trainer over the synthetic classification data of cmtrain.h: 48 train samples in batches of
 * 8 (6 batches an epoch), and unless no_eval, 32 eval samples in batches of 16; an MLP 8-16-3. */
typedef struct {
    const char *max_duration; /* default "2ep" */
    const char *run_name;     /* NULL = generated */
    bool no_eval;
    int rank, world_size;     /* world_size > 1: a pretend rank with a no-op all-reduce */
    cm_in_memory_logger **mem; /* if set, an InMemoryLogger is added (first) and returned here */
    const cm_callback_plugin *callbacks;
    int n_callbacks;
} cmt_fit_opts;

typedef struct {
    cm_dataset *ds, *eds;
    cm_dataloader *dl, *edl;
    cm_model *model;
    cm_trainer *tr;
} cmt_track_rig;

/* Builds the trainer with the given loggers (taken). */
cmt_track_rig cmt_track_rig_make(const cmt_fit_opts *o, const cm_logger_plugin *loggers, int n);
/* Frees the trainer (closing the plugins if not closed), then the model and data. */
void cmt_track_rig_free(cmt_track_rig *g);

/* Captures what the process writes to stderr between begin and end (through a pipe, so file size
 * limits do not apply; keep it under 64 KiB). end returns it (malloc'd) and restores stderr. */
void cmt_stderr_begin(void);
char *cmt_stderr_end(void);
/* Asserts that x printed as compact JSON is `want`. */
void cmt_assert_json(const cJSON *x, const char *want);
/* How many times `needle` occurs in `hay`. */
int cmt_count(const char *hay, const char *needle);

/* ---- local test servers (tests/trackers/NAME_server.py) ---- */
typedef struct {
    pid_t pid;
    int port;
    char url[64]; /* "http://127.0.0.1:<port>" */
} cmt_server;

/* Starts /usr/bin/python3 tests/trackers/<script> --port 0 and waits for the port it prints. */
cmt_server cmt_server_start(const char *script);
/* Stops it (SIGTERM, then waits). */
void cmt_server_stop(cmt_server *s);
/* An HTTP request to the server's control API (/_test/...); returns the parsed JSON reply (free
 * with cJSON_Delete). body NULL = GET. */
cJSON *cmt_server_call(const cmt_server *s, const char *path, const char *body);
/* The server's recorded state (GET /_test/state; free with cJSON_Delete). */
cJSON *cmt_server_state(const cmt_server *s);
/* Adds fault rules (POST /_test/faults {"rules": rules_json}) to those the server already has. */
void cmt_server_faults(const cmt_server *s, const char *rules_json);
/* Fails the test, printing them, if the state lists protocol violations. */
void cmt_assert_no_violations(const cJSON *st);
/* The only run in the state's "runs" (fails the test unless there is exactly one). */
const cJSON *cmt_only_run(const cJSON *st);
/* o[k] if it is a string, else NULL. */
const char *cmt_json_str(const cJSON *o, const char *k);

#endif
