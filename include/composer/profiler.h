/*
 * composer/profiler.h — Composer's profiler: a schedule that picks the batches to record, markers
 * any plugin or user code can open, trace handlers that write what was recorded, and a per-op
 * summary table at the end.
 *
 * What a profiled batch records (every event has the rank as pid and the OS thread as tid):
 *  - every engine event pair as a duration slice named "event/<pair>" (Composer's canonical name:
 *    BATCH_START..BATCH_END is "event/batch", BEFORE_FORWARD..AFTER_FORWARD "event/forward", then
 *    "event/dataloader" (the time waiting for data), "event/train_batch", "event/loss",
 *    "event/backward", "event/eval", "event/eval_batch", "event/epoch", "event/fit", ...) with args
 *    {epoch, batch};
 *  - each algorithm, callback and logger call: "algorithm/<Name>/event/<event>",
 *    "callback/<Name>/event/<event>", "logger/<Name>/event/<event>";
 *  - the optimizer step ("optimizer/step") and checkpoint saves ("checkpoint/save" with its phases
 *    "checkpoint/snapshot", "checkpoint/write", "checkpoint/commit"; a background save records on
 *    its own thread);
 *  - every op on the autograd tape, forward (name = the op, "linear") and backward
 *    ("linear_backward"), with args {shapes, dtypes, flops}; the FLOPs are counted for the GEMM-like
 *    ops as torch.profiler's with_flops does (cm_op_flops), 0 for the rest. The times are the
 *    host's: for ops on a GPU, which run asynchronously, they are the launches;
 *  - each collective (all_reduce, reduce_scatter, all_gather, broadcast, barrier) as an async span
 *    "collective/<kind>" from its start to its completion with args {seq, bytes, dtype}; in the
 *    merged trace each also gets {last_rank, waited_us}: which rank arrived last at that collective
 *    and how long this rank waited for it;
 *  - system counters sampled by a thread every sys_prof_stats_thread_interval_seconds: "cpu"
 *    {cpu_percent} (the machine) and "cpu/process" {cpu_percent} (this process, 100 = one core),
 *    "memory/process" {rss_bytes} and "memory/virtual" {used_bytes, available_bytes},
 *    "disk/<device>" {read_bytes, write_bytes} and "network/<nic>" {bytes_sent, bytes_recv}
 *    (cumulative counters of /proc, as Composer's SystemProfiler records psutil's).
 *
 * The schedule (Composer's cyclic_schedule) is a pure function of the batch's index in its epoch:
 * skip the first skip_first batches of every epoch, then cycles of `wait` batches skipped, `warmup`
 * batches recorded (WARMUP: in the trace, not in the op table) and `active` batches recorded, the
 * last of them ACTIVE_AND_SAVE (also the epoch's last batch, so an epoch shorter than a cycle still
 * saves), `repeat` cycles per epoch (0 = until the epoch ends). A cycle's trace is written when
 * its last batch is done — after that batch's evaluation and checkpoint, so they are in it — or
 * when fit ends mid-cycle. In the epoch a run resumes in, skip_first counts from the resumption
 * batch, so a resumed run starts a fresh cycle there (Composer does this too, but in every later
 * epoch as well, which skips those batches again each epoch; here later epochs count from 0).
 *
 *     cm_json_trace_handler_config jc = cm_json_trace_handler_config_default();
 *     jc.folder = "runs/my-run/traces";                       // ep0-ba5-rank0.json, merged_trace.json
 *     cm_trace_handler th;
 *     cm_profiler_config pc = cm_profiler_config_default();  // cyclic_schedule(0, 0, 1, 4, 1)
 *     pc.schedule.wait = 1;
 *     pc.summary_stream = stdout;                             // the op table at the end
 *     cm_profiler *prof;
 *     cm_callback_plugin pp;
 *     if (cm_json_trace_handler_new(&jc, &th) != CM_OK) ...;
 *     pc.trace_handlers = &th; pc.n_trace_handlers = 1;       // taken on success
 *     if (cm_profiler_new(&pc, &prof, &pp) != CM_OK) ...;
 *     cfg.callbacks = &pp; cfg.n_callbacks = 1;               // register it first among callbacks
 *     ...                                                     // cm_trainer_new, cm_trainer_fit
 *     cm_marker *m;                                           // in a plugin: cm_profiler_of(state)
 *     cm_profiler_marker(prof, "my/section", NULL, &m);
 *     cm_marker_start(m); ... cm_marker_finish(m);
 *
 * Cost: with no profiler, or outside recorded batches, every hook is one load and a branch (the
 * bench/profiler program measures a training step both ways). A recorded batch pays about a
 * microsecond per event (an op, a plugin call) and the memory of its events until its cycle is
 * written.
 *
 * One profiler records at a time in a process (the hooks in the tensor, dist and checkpoint
 * layers are process-wide); a second profiled trainer fails on INIT with CM_ERR_STATE.
 *
 * Threading: the profiler and its markers belong to the trainer's thread, except that recording
 * (markers, hooks) is thread-safe: a marker may be used from another thread (one thread at a time
 * per marker), and the sampling thread and background checkpoint saves record on their own tids.
 */
#ifndef COMPOSER_PROFILER_H
#define COMPOSER_PROFILER_H

#include <composer/trainer.h>

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* =============================================================================================
 * Actions and the cyclic schedule
 * =========================================================================================== */

#define CM_PROFILER_ACTION_LIST(X)                       \
    X(SKIP, "skip")                                      \
    X(WARMUP, "warmup")                                  \
    X(ACTIVE, "active")                                  \
    X(ACTIVE_AND_SAVE, "active_and_save")

typedef enum cm_profiler_action {
#define CM_X_(name, str) CM_PROFILER_ACTION_##name,
    CM_PROFILER_ACTION_LIST(CM_X_)
#undef CM_X_
    CM_PROFILER_ACTION_COUNT
} cm_profiler_action;

const char *cm_profiler_action_name(cm_profiler_action a); /* "active_and_save"; "?" out of range */

/* A set of actions, for markers: CM_PROFILER_ACTIONS(WARMUP) | CM_PROFILER_ACTIONS(ACTIVE). */
#define CM_PROFILER_ACTIONS(name) (1u << CM_PROFILER_ACTION_##name)
/* Composer's default for markers: record on WARMUP, ACTIVE and ACTIVE_AND_SAVE. */
#define CM_PROFILER_ACTIONS_RECORDING \
    (CM_PROFILER_ACTIONS(WARMUP) | CM_PROFILER_ACTIONS(ACTIVE) | CM_PROFILER_ACTIONS(ACTIVE_AND_SAVE))

/* Composer's cyclic_schedule(skip_first, wait, warmup, active, repeat), per epoch. */
typedef struct cm_cyclic_schedule {
    int64_t skip_first; /* default 0 */
    int64_t wait;       /* default 0 */
    int64_t warmup;     /* default 1 */
    int64_t active;     /* default 4; at least 1 */
    int64_t repeat;     /* default 1; 0 = cycles until the epoch ends */
} cm_cyclic_schedule;

cm_cyclic_schedule cm_cyclic_schedule_default(void);
/* CM_ERR_INVALID_ARG naming the field: a negative count, or active < 1. */
cm_status cm_cyclic_schedule_check(const cm_cyclic_schedule *s);

/* The action for the batch with index `batch_in_epoch` (0-based) of an epoch of `dataloader_len`
 * batches (-1: unknown; an index at or past it is SKIP), counting cycles from batch `start` of the
 * epoch (0, or the batch a run resumed at in its first epoch). A pure function. */
cm_profiler_action cm_cyclic_schedule_action(const cm_cyclic_schedule *s, int64_t batch_in_epoch,
                                             int64_t dataloader_len, int64_t start);

/* =============================================================================================
 * Trace handlers: what happens to a recorded cycle
 * =========================================================================================== */

/* One event of a cycle, in Chrome's trace event terms (FORMATS.md section 7). */
typedef struct cm_trace_event {
    char ph;          /* 'B', 'E', 'X', 'i', 'C', 'b', 'e' */
    const char *name; /* borrowed for the call */
    const char *cat;  /* comma-separated categories; may be "" */
    int64_t ts_ns;    /* wall-clock nanoseconds of this rank (see clock_sync_ns) */
    int64_t dur_ns;   /* 'X' */
    int pid;          /* the global rank */
    int tid;          /* the OS thread id */
    uint64_t id;      /* 'b' / 'e' */
    const char *args; /* the text of a JSON object, or NULL */
} cm_trace_event;

/* A thread's display name ("Training Loop", "System Profiler"). */
typedef struct cm_trace_thread {
    int tid;
    const char *name;
} cm_trace_thread;

/* The run a handler belongs to, given at INIT. barrier() waits for every rank (all ranks call the
 * handler at the same points); it is valid until the handler is closed. */
typedef struct cm_trace_run {
    const char *run_name; /* borrowed for the call */
    int rank, world_size;
    cm_status (*barrier)(void *data);
    void *barrier_data;
} cm_trace_run;

/* A finished cycle (everything borrowed for the call). */
typedef struct cm_trace_cycle {
    const cm_trace_event *events; /* in recording order; slices nest on every thread */
    int64_t n_events;
    const cm_trace_thread *threads;
    int n_threads;
    int64_t cycle;                 /* 0, 1, ... over the profiler's life */
    const cm_timestamp *timestamp; /* when the cycle ended (Composer's file name fields) */
    int64_t clock_sync_ns;         /* this rank's clock when every rank passed the cycle's barrier */
    int64_t clock_sync_error_ns;   /* the time two barriers took: a bound on the error */
    int64_t dropped;               /* events lost to out-of-memory */
} cm_trace_cycle;

#define CM_TRACE_HANDLER_ABI 1

typedef struct cm_trace_handler_i {
    int abi;          /* CM_TRACE_HANDLER_ABI */
    const char *name; /* "JSONTraceHandler" */
    cm_status (*init)(void *self, const cm_trace_run *run); /* optional */
    cm_status (*save)(void *self, const cm_trace_cycle *cycle);
    cm_status (*close)(void *self); /* optional */
    void (*free)(void *self);
} cm_trace_handler_i;

typedef struct cm_trace_handler {
    const cm_trace_handler_i *vt;
    void *self;
} cm_trace_handler;

void cm_trace_handler_free(cm_trace_handler h); /* calls vt->free(self) if both are set */

/* JSONTraceHandler (Composer's): Chrome Trace Event JSON, one file per rank per cycle, written
 * as Composer does ("[\n", events separated by ",\n", "\n]\n"), starting with the metadata events
 * process_name ("Rank N training loop process"), thread_name ("Training Loop", ...),
 * thread_sort_index, global_rank, process_sort_index, wall_clock_base_us, clock_sync_timestamp_us,
 * clock_sync_error_bound and cycle. Times (ts, and the clock sync) are microseconds since
 * wall_clock_base_us (a whole second of the wall clock, fixed per rank), so a reader's doubles
 * keep them to the nanosecond; add the base for wall-clock time. After each cycle every rank has written its file and rank 0
 * merges all ranks' files of every cycle so far into merged_trace_filename (cm_trace_merge).
 * Paths are formatted with {run_name}, {rank}, {world_size} and, in filename, {epoch}, {batch},
 * {sample}, {token}. */
typedef struct cm_json_trace_handler_config {
    const char *folder;                /* copied; default "{run_name}/traces" */
    const char *filename;              /* copied; default "ep{epoch}-ba{batch}-rank{rank}.json" */
    const char *merged_trace_filename; /* copied; default "merged_trace.json" in folder; NULL = no merging */
    bool overwrite;                    /* default false: the folder must be empty (or absent) at INIT */
    int num_traces_to_keep;            /* -1 (default) = all; n >= 0: this rank's n newest stay on disk */
} cm_json_trace_handler_config;

cm_json_trace_handler_config cm_json_trace_handler_config_default(void);

/* Errors: CM_ERR_INVALID_ARG (an empty folder or filename, a filename without {rank} —
 * ranks would overwrite each other —, num_traces_to_keep < -1), CM_ERR_OOM. On INIT: CM_ERR_IO
 * naming the folder (cannot create it; not empty without overwrite), CM_ERR_INVALID_ARG (an
 * unknown placeholder). On save: CM_ERR_IO naming the file. */
cm_status cm_json_trace_handler_new(const cm_json_trace_handler_config *cfg, cm_trace_handler *out);

/* Merges trace files (a JSON array or an object with traceEvents, each from one rank, as the
 * JSONTraceHandler writes them) into one at `output`: each event's pid becomes the file's
 * global_rank; its ts is shifted by (the clock_sync_timestamp_us of the lowest rank's file of the
 * same cycle) − (its file's), so all ranks share rank 0's clock; the metadata events come first,
 * then every other event in time order (stable: events of equal time keep their order); and each
 * collective (cat "collective", args.seq) gets args last_rank and waited_us from the corrected
 * start times of that collective on every rank; async ids become rank · 2^32 + id, so the
 * ranks' spans stay apart. Written atomically (temporary file, rename).
 * Errors: CM_ERR_IO naming a file, CM_ERR_FORMAT naming a file that is not a trace or lacks
 * global_rank, CM_ERR_INVALID_ARG (n < 1), CM_ERR_OOM. */
cm_status cm_trace_merge(const char *const *inputs, int n, const char *output);

/* =============================================================================================
 * The profiler
 * =========================================================================================== */

typedef struct cm_profiler_config {
    cm_cyclic_schedule schedule;
    const cm_trace_handler *trace_handlers; /* taken on success */
    int n_trace_handlers;
    bool record_ops;                /* every op on the tape, with FLOPs; default true */
    /* Composer's SystemProfiler arguments and defaults */
    bool sys_prof_cpu;              /* default true */
    bool sys_prof_memory;           /* default false */
    bool sys_prof_disk;             /* default false */
    bool sys_prof_net;              /* default false */
    double sys_prof_stats_thread_interval_seconds; /* default 0.5 */
    /* The op table (cm_profiler_op_table) is printed here when the profiler closes, if any op was
     * recorded in an ACTIVE batch; NULL (default) = not printed. */
    FILE *summary_stream;
    int summary_row_limit;          /* rows of the printed table; default 20; 0 = all */
} cm_profiler_config;

cm_profiler_config cm_profiler_config_default(void);

typedef struct cm_profiler cm_profiler;

/* A profiler (*handle) and the callback plugin that runs it (register it with the trainer, first
 * among the callbacks; the trainer takes it). The handle stays valid while the engine that owns
 * the plugin lives, or until cm_callback_plugin_free when it is never registered. Errors:
 * CM_ERR_INVALID_ARG (a bad schedule, a trace handler vtable without abi/name/save/free, a
 * non-positive or non-finite interval), CM_ERR_OOM. On INIT: CM_ERR_STATE if another profiler is
 * recording in this process, a trace handler's init errors. */
cm_status cm_profiler_new(const cm_profiler_config *cfg, cm_profiler **handle, cm_callback_plugin *plugin);

/* The profiler of the trainer whose state this is (Composer's state.profiler), NULL when it has
 * none. Valid from INIT until the trainer closes. */
cm_profiler *cm_profiler_of(const cm_state *st);

/* The action of the batch in progress (SKIP between batches that are not recorded). */
cm_profiler_action cm_profiler_action_now(const cm_profiler *p);
/* Cycles written so far. */
int64_t cm_profiler_n_cycles(const cm_profiler *p);

/* ---- markers (Composer's Marker) ---- */

typedef struct cm_marker cm_marker;

typedef struct cm_marker_config {
    unsigned actions;              /* the actions it records on; default CM_PROFILER_ACTIONS_RECORDING */
    bool record_instant_on_start;  /* default false */
    bool record_instant_on_finish; /* default false */
    const char *categories;        /* comma-separated; copied; default "" */
} cm_marker_config;

cm_marker_config cm_marker_config_default(void);

/* The marker called `name`: made on first use, the same one afterwards (its categories updated
 * when cfg is given). cfg NULL = defaults. Owned by the profiler. Errors: CM_ERR_INVALID_ARG
 * (empty name, actions with no valid bit), CM_ERR_OOM. */
cm_status cm_profiler_marker(cm_profiler *p, const char *name, const cm_marker_config *cfg, cm_marker **out);

/* A duration: start records a begin slice when the profiler's current action is in the marker's
 * actions; finish records its end (only if the begin was recorded). Errors: CM_ERR_STATE (start
 * of a started marker, finish of one not started), naming the marker. */
cm_status cm_marker_start(cm_marker *m);
cm_status cm_marker_finish(cm_marker *m);
/* An instant event, and a counter event with one track per series. */
void cm_marker_instant(cm_marker *m);
void cm_marker_counter(cm_marker *m, const char *const *series, const double *values, int n);

/* ---- the op table (torch.profiler's key_averages) ---- */

/* One op's totals over the ACTIVE and ACTIVE_AND_SAVE batches (WARMUP is left out). */
typedef struct cm_op_stat {
    const char *name; /* "linear", "linear_backward" */
    int64_t calls;
    double total_s;   /* from the op's start to its end */
    double self_s;    /* minus the ops it ran inside (a cast inside a matmul) */
    double flops;     /* cm_op_flops summed */
} cm_op_stat;

/* The ops seen so far, by self time, largest first (borrowed until the next recorded batch). */
int cm_profiler_n_op_stats(const cm_profiler *p);
const cm_op_stat *cm_profiler_op_stat(const cm_profiler *p, int i); /* NULL out of range */

/* The table as text (snprintf-style: returns the length needed): columns Name, Self ms, Self %,
 * Total ms, Calls, Avg us, GFLOP, GFLOP/s; at most row_limit rows (0 = all), then the totals. */
size_t cm_profiler_op_table(const cm_profiler *p, int row_limit, char *buf, size_t cap);

/* The floating-point operations of one op on the tape, as the profiler counts them: for matmul
 * 2·numel(out)·K; linear 2·rows·in·out; conv2d 2·numel(out)·(weight numel / out channels);
 * attention 4·B·H·T·S·D (the causal mask not discounted, as torch's counter); backward: the
 * forward count for each of those inputs that requires a gradient (2× for attention when any
 * does); 0 for every other op (elementwise, norms, losses, views), as torch.profiler's with_flops.
 * `ins` as recorded by the op (its inputs in order; NULL entries allowed). */
double cm_op_flops(const char *op, bool backward, const cm_tensor *out, int n_in, cm_tensor *const *ins);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_PROFILER_H */
