/* Private pieces of the checkpoint layer: file-system helpers, manifest JSON helpers, and the
 * trainer's saver (options, the background writer, rotation). Not installed. */
#ifndef CM_CKPT_IMPL_H
#define CM_CKPT_IMPL_H

#include <composer/checkpoint.h>
#include <composer/storage.h>

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdatomic.h>

#include "base/json.h"
#include "trainer/trainer_impl.h"

/* ---- file system (fsutil.c) ---- */

/* "<a>/<b>" into a new cm_alloc string (NULL + CM_ERR_OOM). */
char *cmi_path_join(const char *a, const char *b);
/* Writes `n` bytes to `path` (created or truncated, mode 0644) and fsyncs it. CM_ERR_IO naming the
 * path, the step and strerror. */
cm_status cmi_write_file_sync(const char *path, const void *data, size_t n);
/* Atomically replaces `path` with `n` bytes: "<path>.tmp-<pid>", fsync, rename, fsync of the folder. */
cm_status cmi_write_file_atomic(const char *path, const void *data, size_t n);
/* fsyncs a directory (errors EINVAL/EROFS are ignored: file systems that cannot). */
cm_status cmi_fsync_dir(const char *path);
/* Reads a whole file into a new NUL-terminated cm_alloc buffer. CM_ERR_NOT_FOUND if absent,
 * CM_ERR_IO otherwise; refuses files above max bytes (CM_ERR_FORMAT). */
cm_status cmi_read_file(const char *path, size_t max, char **out, size_t *len);
/* rm -rf of a directory we created (files and sub-directories). Best effort; returns false on a
 * failure (errno kept). */
bool cmi_remove_tree(const char *path);
/* mkdir -p. CM_ERR_IO naming the component that failed. */
cm_status cmi_mkdirs(const char *path);
bool cmi_is_dir(const char *path);

/* ---- manifest (manifest.c) ---- */

/* The manifest's closing: `,"manifest_xxh3":"<16 hex>"}` + newline. */
#define CMI_MANIFEST_KEY "\"manifest_xxh3\""

/* Serializes `root` (formatted) with the trailing checksum field. *out is cm_alloc'ed. */
cm_status cmi_manifest_serialize(const cJSON *root, char **out, size_t *len);
/* Checks the trailing checksum and parses. `label` names the file in messages. */
cm_status cmi_manifest_parse(const char *text, size_t len, const char *label, cJSON **out);

cJSON *cmi_json_u64(uint64_t v); /* a decimal string: JSON numbers lose bits above 2^53 */
bool cmi_json_get_u64(const cJSON *o, const char *key, uint64_t *out);
bool cmi_json_get_i64(const cJSON *o, const char *key, int64_t *out);
bool cmi_json_get_double(const cJSON *o, const char *key, double *out); /* null reads as NaN */
cJSON *cmi_timestamp_to_json(const cm_timestamp *ts);
bool cmi_timestamp_from_json(const cJSON *o, cm_timestamp *ts);

/* ---- lazy opening (reader.c): a checkpoint whose files come from an object store ---- */

/* Brings file `file` of the checkpoint directory `dir` (downloads it to "<dir>/<file>"). */
typedef cm_status (*cmi_ck_fetch_fn)(void *data, const char *dir, const char *file);
/* cm_checkpoint_open, except that listed files missing from `path` are fetched through `fetch`
 * when first read (cmi_ck_read_range fetches only the files holding the pieces it reads;
 * cm_checkpoint_verify fetches all), then checked like the others. The manifest must be there. */
cm_status cmi_checkpoint_open_lazy(const char *path, cmi_ck_fetch_fn fetch, void *data, cm_checkpoint **out);

/* ---- remote checkpoints (remote.c) ---- */

typedef struct cmi_remote cmi_remote;
/* The staging folder of a remote save_folder: ${TMPDIR:-/tmp}/composer-checkpoints/<xxh3(uri)>. */
char *cmi_remote_default_local(const char *uri);
/* Opens the store for `uri` (errors name save_folder). uploader: this rank uploads (rank 0). */
cm_status cmi_remote_new(const char *uri, const char *local, const char *latest, int keep, bool uploader,
                         cmi_remote **out);
/* Uploads what is queued, stops the thread, frees. */
void cmi_remote_free(cmi_remote *r);
const char *cmi_remote_uri(const cmi_remote *r);
const char *cmi_remote_local(const cmi_remote *r);
/* Queues "<local>/<name>" (committed) for upload: files, manifest last, pointer, rotation.
 * Blocks while 2 uploads are pending. Returns an earlier upload's failure. */
cm_status cmi_remote_enqueue(cmi_remote *r, const char *name, bool update_pointer);
/* The first upload failure so far (CM_OK: none), its message set. Thread-safe. */
cm_status cmi_remote_failure(cmi_remote *r);
/* Waits until every queued upload is done; the first failure. */
cm_status cmi_remote_drain(cmi_remote *r);
bool cmi_remote_exists(cmi_remote *r, const char *name);
bool cmi_remote_was_rejected(cmi_remote *r, const char *name);
/* Autoresume: the newest complete remote checkpoint, opened (manifest fetched into the staging
 * folder) and, when monolithic, verified; out->path is its local directory. Damaged ones are
 * skipped (and set aside when saved again). CM_ERR_NOT_FOUND when there is none. */
cm_status cmi_remote_find_latest(cmi_remote *r, cm_checkpoint_search *out);
/* Fetches the manifest of remote checkpoint `name` and opens it lazily. */
cm_status cmi_remote_open(cmi_remote *r, const char *name, cm_checkpoint **out);
/* Opens a checkpoint directory of the staging folder lazily (its manifest is there). */
cm_status cmi_remote_open_path(cmi_remote *r, const char *path, cm_checkpoint **out);

/* ---- sharded pieces (reader.c) ---- */

#define CMI_CK_MAX_WORLD 65536 /* ranks a sharded checkpoint may have */
enum { CMI_CK_KIND_MODEL = 0, CMI_CK_KIND_OPTIM = 1, CMI_CK_KIND_ALGO = 2 };

/* A tensor as a whole, over all its pieces. name borrowed until close. */
typedef struct cmi_ck_global {
    const char *name;
    cm_st_dtype dtype;
    int ndim;
    int64_t shape[CM_MAX_DIMS];
    int64_t numel;
    int n_pieces;
} cmi_ck_global;

/* The tensor `name` among the model (kind 0) or optimizer (kind 1) tensors. */
bool cmi_ck_find(const cm_checkpoint *ck, int kind, const char *name, cmi_ck_global *out);
/* Whether the checkpoint has a file of this kind (an optimizer file: not weights-only). */
bool cmi_ck_has_kind(const cm_checkpoint *ck, int kind);
/* The number of distinct tensors of a kind, and the k-th name (sorted). */
size_t cmi_ck_n_global(const cm_checkpoint *ck, int kind);
const char *cmi_ck_global_name(const cm_checkpoint *ck, int kind, size_t k);
/* Copies elements [a, b) of the flattened tensor into dst (NULL: only check), from the pieces
 * that overlap; each piece it touches is hashed once (per open) and compared with the manifest.
 * Errors: CM_ERR_NOT_FOUND, CM_ERR_INVALID_ARG (range), CM_ERR_FORMAT (a corrupt piece, named). */
cm_status cmi_ck_read_range(cm_checkpoint *ck, int kind, const char *name, int64_t a, int64_t b, void *dst);

/* Rank r's piece [begin, end) of a flat buffer of numel elements over w ranks: chunk =
 * ceil(numel / w), begin = min(r * chunk, numel), end = min(begin + chunk, numel) (the layout of
 * cm_shard_span). */
void cmi_shard_range(int64_t numel, int w, int r, int64_t *begin, int64_t *end);

/* ---- the trainer's saver (trainer_ckpt.c) ---- */

/* One tensor to write: borrowed name, bytes (borrowed or in the job's staging copy). */
typedef struct cmi_ck_tensor {
    const char *name;
    cm_st_dtype dtype;
    int ndim;
    int64_t shape[CM_MAX_DIMS];
    const void *data;
    size_t nbytes;
    cm_device device; /* where data lives; GPU tensors are copied into the job's host staging */
    /* a piece of a larger tensor (sharded files): elements [begin, end) of global_shape */
    bool piece;
    int gndim;
    int64_t gshape[CM_MAX_DIMS];
    int64_t begin, end;
} cmi_ck_tensor;

#define CMI_CK_MAX_FILES 3

/* One save: what to write and where. Owned by the saver while it runs. */
typedef struct cmi_ck_job {
    char *folder;   /* where the checkpoint directory goes */
    char *name;     /* its name inside folder */
    bool overwrite;
    bool update_pointer; /* write the latest pointer and rotate */
    bool upload;         /* a save into a remote save_folder: queue the upload once committed */
    cJSON *manifest;     /* without "files" (added when hashed) */
    char fnames[CMI_CK_MAX_FILES][64];
    cmi_ck_tensor *tensors[CMI_CK_MAX_FILES];
    int n_tensors[CMI_CK_MAX_FILES];
    int n_files;
    void *staging; /* the async snapshot (owned) */
    size_t staging_bytes;
    char *names;   /* the algorithm tensors' "<name>/<tensor>" names (owned) */
} cmi_ck_job;

typedef struct cmi_ckpt {
    /* options (copied) */
    char *save_folder; /* NULL = no saving */
    char *save_filename, *save_latest_filename;
    cm_time save_interval;
    bool save_overwrite, save_weights_only, save_async, handle_signals, autoresume;
    int keep;
    size_t async_max_bytes;
    char *load_path;
    bool load_weights_only, load_strict;
    char **ignore_keys, **exclude_algs;
    int n_ignore_keys, n_exclude_algs;
    cJSON *config_json; /* the resolved options for manifests */
    cmi_remote *remote;      /* save_folder is an object store (save_folder above: the local staging) */
    cmi_remote *load_remote; /* load_path is on an object store */
    int rank;

    /* saving */
    int64_t last_saved_batch;    /* ts.batch of the last save (-1 none) */
    int64_t last_saved_epoch;
    char **kept;                 /* committed checkpoints of this trainer, oldest first */
    int n_kept, cap_kept;
    char *last_path;             /* the last committed checkpoint */
    char *resumed_from;          /* what autoresume / load_path loaded */
    char *pending;               /* what cmi_ckpt_prepare_load chose to load (NULL: nothing) */
    struct cmi_remote *pending_via; /* the store to read it through (borrowed: remote or load_remote; NULL local) */
    bool warned_async_size;

    /* the background writer */
    pthread_t thread;
    bool running;
    atomic_bool done;
    cmi_ck_job *job;
    cm_status job_status;
    char job_msg[1536];
} cmi_ckpt;

cm_status cmi_ckpt_validate(const cm_trainer_config *c);
cm_status cmi_ckpt_new(cm_trainer *tr, const cm_trainer_config *c);
void cmi_ckpt_free(cm_trainer *tr);
/* Between BEFORE_LOAD and AFTER_LOAD: cmi_ckpt_prepare_load decides which checkpoint to load
 * (autoresume, else load_path) and applies the required-on-load algorithms it names, before the
 * trainer makes its optimizer and locks the model; cmi_ckpt_load_start then loads it. */
cm_status cmi_ckpt_prepare_load(cm_trainer *tr);
cm_status cmi_ckpt_load_start(cm_trainer *tr);
/* Which checkpoint autoresume (in save_folder, with the pointer file latest) or load_path names:
 * *out is a new string or NULL (nothing to load). dist_tr: a trainer whose rank 0 chooses for
 * every rank, or NULL (each process chooses for itself). */
cm_status cmi_ckpt_resolve(cm_trainer *dist_tr, bool autoresume, const char *save_folder, const char *latest,
                           const char *load_path, char **out);
/* Composer's required-on-load rule (required_algorithms.c): the required_on_load methods checkpoint
 * `path` lists that the engine lacks (and exclude, glob patterns, does not name) are made from the
 * recorded arguments, registered after the engine's algorithms and applied on INIT to st's model,
 * in the passes' order; *n_added gets how many. Composer's warnings (added, excluded, other
 * arguments, not re-creatable) are logged when `warn` (cm_trainer_prepare_model's pass, which the
 * trainer repeats, is quiet). Errors (nothing registered then): the checkpoint's open errors;
 * CM_ERR_STATE when the passes order one before an algorithm of the engine's own (which ran
 * already); the method's error when one fails to apply (Composer's messages). */
cm_status cmi_apply_required_algorithms(cm_engine *e, cm_state *st, const char *path, struct cmi_remote *via,
                                        const char *const *exclude, int n_exclude, bool warn, int *n_added);
/* After BATCH_CHECKPOINT / EPOCH_CHECKPOINT: reports an earlier background failure, then saves
 * if the interval (or the end of training) says so. prev: the timestamp before the batch/epoch. */
cm_status cmi_ckpt_on_event(cm_trainer *tr, cm_event ev, const cm_timestamp *prev);
/* Whether cmi_ckpt_on_event will save at this event (cm_state_checkpoint_due). */
bool cmi_ckpt_due(const cm_trainer *tr, cm_event ev, const cm_timestamp *prev);
/* Saves now into save_folder (a no-op without one, or when this batch is already saved). */
cm_status cmi_ckpt_save_now(cm_trainer *tr);
/* Waits for a background save and returns its failure. */
cm_status cmi_ckpt_wait(cm_trainer *tr);
/* The end of fit: waits for the background save and every upload; all ranks agree on the outcome. */
cm_status cmi_ckpt_finish(cm_trainer *tr, bool collective);
bool cmi_ckpt_handles_signals(const cm_trainer *tr);

/* ---- multi-rank checkpoints (collective.c) ---- */

/* Whether the trainer runs on more than one rank (checkpoints are then collective). */
bool cmi_multi(const cm_trainer *tr);
/* Every rank passes its status (and cm_last_error when it failed); every rank gets the same
 * answer: CM_OK, or the lowest failing rank's status with "<what>: rank r of W: <its message>".
 * A failed collective returns its own error. One process: returns mine. */
cm_status cmi_dist_agree(cm_trainer *tr, cm_status mine, const char *what);
/* n bytes from rank 0 to every rank. */
cm_status cmi_dist_bcast(cm_trainer *tr, void *buf, size_t n);
/* Every rank contributes a status and a text (its file list, or its error); every rank receives
 * all of them (texts[r] NUL-terminated; free both with cmi_dist_gather_free). */
cm_status cmi_dist_gather(cm_trainer *tr, cm_status mine, const char *text, cm_status **status, char ***texts);
void cmi_dist_gather_free(cm_status *status, char **texts);

/* This rank's pieces under sharding: parameters (through the shard spans), optimizer state
 * (pieces of "<unit>.<key>" over the unit's elements; replicated entries on rank 0), persistent
 * buffers (rank 0), into job->tensors[0] (model) and [1] (optimizer, unless weights_only).
 * Spans marked replica (HYBRID_SHARD's other shard groups) add nothing: their rank files are
 * written and listed, empty of those pieces, so every piece is in the checkpoint exactly once. */
cm_status cmi_shard_job_tensors(cm_trainer *tr, cmi_ck_job *job, bool weights_only);

/* A load, planned and checked before anything changes, then applied (memcpy only). */
typedef struct cmi_ld_op {
    int kind;
    const char *name;
    int64_t a, b;
    void *dst;
} cmi_ld_op;
typedef struct cmi_ld_plan {
    cmi_ld_op *ops;
    int n, cap;
    bool wrote_spans;            /* sync_params must run after the copy */
    int64_t n_missing, n_unexpected;
    char missing[512], unexpected[512];
} cmi_ld_plan;
/* Plans the model (and, unless weights_only, the optimizer) and checks every range it reads
 * (hashes of the pieces touched). Errors name the checkpoint and the tensor. */
cm_status cmi_ld_plan_build(cm_trainer *tr, cm_checkpoint *c, bool weights_only, cmi_ld_plan *p);
/* Adds one copy to a plan after checking the range it reads (the pieces' hashes). */
cm_status cmi_ld_plan_add(cmi_ld_plan *p, cm_checkpoint *c, int kind, const char *name, int64_t a, int64_t b, void *dst);
/* The checkpoint name of algorithm i's tensor `tensor`: "<name>/<tensor>", or "<name>#<k>/<tensor>"
 * for the k-th (k ≥ 1) registered algorithm of the same name. Returns the length, as snprintf. */
int cmi_algo_tensor_name(cm_engine *e, int i, const char *tensor, char *buf, size_t cap);
void cmi_ld_plan_apply(cm_checkpoint *c, const cmi_ld_plan *p);
void cmi_ld_plan_free(cmi_ld_plan *p);

/* Test hook: called at named points of a collective save ("shard_written": after this rank's
 * files are written and verified). A status other than CM_OK fails the save on this rank. */
extern cm_status (*cmi_ckpt_fault_hook)(const char *point, int rank);

/* The job's work, on whichever thread: hash, write into a temporary directory, verify, commit,
 * point, rotate. */
cm_status cmi_ck_job_run(cmi_ckpt *ck, cmi_ck_job *job);
void cmi_ck_job_free(cmi_ck_job *job);

#endif
