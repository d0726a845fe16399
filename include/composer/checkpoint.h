/*
 * composer/checkpoint.h — checkpoints: a directory that holds everything needed to continue a run
 * bit for bit, written transactionally, verified on load, found again by autoresume.
 *
 * Layout (format version 1):
 *
 *   <save_folder>/
 *     ep1-ba6/                     a checkpoint (name from save_filename)
 *       manifest.json              what and where: see below
 *       model.safetensors          parameters and persistent buffers, Hugging Face / PyTorch names,
 *                                  metadata {"format": "pt"}: any safetensors reader loads it
 *       optimizer.safetensors      optimizer state, torch's keys per flat span ("<unit>.exp_avg",
 *                                  "<unit>.step"); absent in a weights-only checkpoint
 *       algorithms.safetensors     the tensors of algorithms' state ("EMA/<param name>",
 *                                  "SWA/<param name>": cm_algorithm_i.tensors); present when an
 *                                  algorithm has some, absent in a weights-only checkpoint
 *     latest                       a text file: the name of the newest committed checkpoint
 *     .tmp-<pid>-<n>-ep1-ba6/      a save in progress (never read; removed when its writer is gone)
 *
 * A sharded checkpoint (saved by a run whose parameters are sharded: cm_trainer_dist.shard_spans)
 * holds, instead of the two files above, one pair per rank of the W that saved it:
 *
 *     model-rank<r>-of-<W>.safetensors      rank r's pieces of the parameters (1-D, f32), and on
 *                                           rank 0 the persistent buffers
 *     optimizer-rank<r>-of-<W>.safetensors  rank r's pieces of the optimizer state ("<unit>.exp_avg"
 *                                           is the (unit numel,) tensor; rank r holds its span's
 *                                           elements), and on rank 0 the replicated entries
 *                                           ("<unit>.step")
 *
 * (An f32 optimizer entry "<unit name>.<key>" whose length is this rank's span of that unit is a
 * piece of the unit's state; every other entry is replicated: rank 0's copy is saved, and every
 * rank loads it whole.)
 *
 * Every tensor entry of a sharded file carries, beside dtype / shape / nbytes / xxh3 of the
 * piece, "global_shape" (the whole tensor's, as a monolithic checkpoint would have it) and
 * "range": [begin, end), the piece's elements in the whole tensor flattened row-major. A rank's
 * span of a wrap unit covers contiguous elements of one or more parameters, so each parameter
 * has at most one piece per rank; the pieces of a tensor over all files must tile
 * [0, numel) exactly (checked at open: a gap or an overlap names the tensor and the elements).
 * The manifest's "layout" is "sharded" (or "monolithic"; absent in older checkpoints) and
 * "world_size" the number of ranks that saved it; every rank's files must be listed.
 *
 * manifest.json is one JSON object: format_version, library {version, git_commit}, created (UTC,
 * ISO 8601), run_name, world_size, layout, weights_only, config (the resolved trainer options), timestamp
 * (every cm_timestamp field), max_duration, schedulers, optimizer {kind, groups}, dataloaders
 * {train: {epoch, position}, <eval label>: {...}}, rng {seed, dropout: [{module, seed, stream,
 * counter}]}, trainer {microbatch_size, total_loss, ...}, algorithms / callbacks: [{name, state}],
 * loss_scaler (null: there is no fp16 loss scaling here), and files: {"model.safetensors":
 * {size, tensors: {name: {dtype, shape, nbytes, xxh3}}}, ...}. It ends with
 * `,"manifest_xxh3":"<16 hex digits>"}`: the XXH3-64 of every byte before that comma, so an
 * edited or torn manifest is detected as surely as a torn tensor.
 *
 * Saving (cm_trainer_config.save_folder): the files are written into a temporary directory inside
 * save_folder, fsync'ed, re-read and checked against their checksums, then the directory is
 * renamed into place and the folder fsync'ed; only then is the `latest` pointer replaced (write,
 * fsync, rename) and are old checkpoints rotated out (save_num_checkpoints_to_keep). A crash at
 * any instant leaves the previous checkpoints and pointer intact. An existing checkpoint of the
 * same name is replaced only with save_overwrite.
 *
 * Loading (load_path, autoresume): the manifest's own checksum, its format version, every file's
 * size and structure and every tensor's XXH3 are checked before anything in the trainer changes;
 * a failure names the checkpoint, the file and the tensor. Autoresume takes the newest complete
 * checkpoint in the folder (highest batch count; `latest` breaks ties and serves tools): a torn,
 * truncated or corrupt newer one is skipped with a warning that says why, and a missing or stale
 * pointer does not matter. If checkpoints exist but none is usable, autoresume fails rather than
 * silently starting over.
 *
 * Multi-rank runs (cm_trainer_dist.world_size > 1): a save is a collective — every rank calls it
 * at the same point (the trainer does; so must callers of cm_trainer_save_checkpoint) and every
 * rank gets the same outcome, a failure naming the rank it happened on. save_folder must be on a
 * file system every rank sees (the name is rank 0's). Replicated parameters (no shard spans:
 * NO_SHARD): rank 0 writes and commits a monolithic checkpoint exactly as one process would, the
 * others wait for its outcome. Sharded: rank 0 creates the temporary directory; every rank
 * writes its two files there, fsyncs them, re-reads them against the checksums it computed and
 * sends their description (or its error) to all ranks; rank 0 commits — manifest written last,
 * the directory read back (sizes, headers, tiling), renamed, pointer, rotation — only if every
 * rank succeeded, and removes the directory otherwise. A rank that dies makes the others fail
 * at the collective's timeout (or the launcher ends the job): either way the save is not
 * committed, and its directory is swept by the next save once its writer is gone. (The file
 * descriptions travel by all_gather, so every rank briefly holds all W of them: about 200 bytes
 * per piece. A gather-to-root hook would let only rank 0 hold them.)
 *
 * Loading on M ranks (any M, with any layout on either side): every rank opens the same
 * checkpoint (with autoresume, the one rank 0 chose), plans which elements of which tensors go
 * where on this rank — its spans' ranges when sharded, whole tensors when replicated — and
 * hashes each piece it reads from (a monolithic checkpoint is hashed whole). The optimizer
 * state, timestamp, dataloader positions (global sample positions), schedulers, RNG and plugin
 * state are the same on every rank. Only after every rank has checked its part do the ranks
 * agree and copy; then cm_trainer_dist.sync_params (when set and spans were written) refreshes
 * the model's buffers. A resume must keep the global batch size (the loader's batch_size is
 * global, so the number of ranks may change): a different one fails on every rank with both
 * sizes named, as do a missing or mismatched rank file, a missing tensor or a damaged piece.
 *
 * Background saves (save_async): at the save point the tensors are copied into one staging
 * buffer (bounded by save_async_max_bytes; a larger state is saved synchronously) and a thread
 * does the rest while training continues. One save runs at a time (a new save first waits for
 * the previous one), so the extra host memory is at most one snapshot. A failure is reported by
 * fit at the next batch, or by cm_trainer_close, with the checkpoint's path. In a multi-rank run
 * saves are synchronous (logged once): the save is a collective, and the communicator belongs to
 * the training thread.
 *
 * Remote checkpoints (save_folder, load_path = s3://BUCKET/PREFIX, gs://, oci://; see storage.h for
 * credentials and endpoints; file:// is a local folder): a save commits exactly as above into a
 * local staging folder, ${TMPDIR:-/tmp}/composer-checkpoints/<xxh3 of the URI> (shared by the ranks
 * of one machine), then rank 0 uploads it in the background — every file, the manifest last, so
 * a remote checkpoint is visible (to autoresume) only when complete —, then the latest pointer,
 * then rotates old checkpoints out remotely (manifest first) and locally. At most two committed
 * checkpoints wait for upload; a third save waits. fit returns only after every upload finished;
 * an upload that fails (after the store's retries) stops fit with an error naming the
 * checkpoint, its intact local copy and the URI. "Already exists" is decided remotely. Autoresume
 * lists the remote folder, checks each manifest (checksum, timestamp, every file present at its
 * size) and opens the newest lazily: a file is downloaded when a read first touches it, so each
 * rank downloads only the files holding its pieces (a monolithic checkpoint is verified whole on
 * rank 0 first; a sharded one piece by piece as the ranks read it).
 *
 * A checkpoint found damaged (autoresume skipped it) does not block the run when it reaches that
 * checkpoint's batch again: the damaged one is moved aside, never deleted — locally to
 * "<save_folder>/.corrupt-<time>-<n>-<name>", remotely under "<URI>/.corrupt-<name>-<time>/" —,
 * with a warning saying where, and the checkpoint is saved anew.
 *
 * Rotation (save_num_checkpoints_to_keep) deletes only checkpoints this trainer saved, after the
 * new one is committed; a checkpoint is first renamed to a hidden name, so a crash while deleting
 * never leaves a visible half-deleted checkpoint. Hidden leftovers of killed processes are
 * removed at the next save in the folder.
 *
 *     cm_checkpoint *ck;
 *     if (cm_checkpoint_open("runs/r1/ckpt/ep1-ba6", &ck) != CM_OK ||   // manifest, sizes, headers
 *         cm_checkpoint_verify(ck) != CM_OK) {                         // every tensor's XXH3
 *         fprintf(stderr, "%s\n", cm_last_error());
 *         cm_checkpoint_close(ck);
 *         return 1;
 *     }
 *     printf("batch %lld\n", (long long)cm_checkpoint_timestamp(ck)->batch);
 *     cm_checkpoint_export_model(ck, "model.safetensors");              // a verified copy
 *     cm_checkpoint_close(ck);
 *
 * Threading: a cm_checkpoint belongs to one thread at a time. The search functions are
 * thread-safe.
 */
#ifndef COMPOSER_CHECKPOINT_H
#define COMPOSER_CHECKPOINT_H

#include <composer/safetensors.h>
#include <composer/time.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The manifest format this library writes and reads. */
#define CM_CKPT_FORMAT_VERSION 1

#define CM_CKPT_MANIFEST "manifest.json"
#define CM_CKPT_MODEL_FILE "model.safetensors"
#define CM_CKPT_OPTIM_FILE "optimizer.safetensors"
#define CM_CKPT_ALGO_FILE "algorithms.safetensors"
#define CM_CKPT_LATEST_DEFAULT "latest"
#define CM_CKPT_FILENAME_DEFAULT "ep{epoch}-ba{batch}"

typedef struct cm_checkpoint cm_checkpoint;

/* Opens the checkpoint directory at `path` (or, when `path` is a folder with a `latest` pointer
 * and no manifest, the checkpoint the pointer names) and checks its structure: the manifest's
 * checksum and JSON, its format version, that every listed file exists with the listed size, is a
 * valid safetensors file and holds exactly the listed tensors with the listed dtypes and shapes,
 * and (sharded) that every rank's files are listed and every tensor's pieces tile it.
 * Tensor bytes are not hashed here (see cm_checkpoint_verify). On success *out owns read-only
 * mappings of the files (free with cm_checkpoint_close).
 * Errors: CM_ERR_NOT_FOUND (no such directory or no manifest.json: "not a checkpoint"),
 * CM_ERR_UNSUPPORTED (another format version: the message gives both versions and what to do),
 * CM_ERR_FORMAT (a torn, truncated or edited manifest or file; a missing or extra file or
 * tensor — naming the checkpoint, the file and the tensor), CM_ERR_IO, CM_ERR_OOM. */
cm_status cm_checkpoint_open(const char *path, cm_checkpoint **out);

/* Hashes every tensor and compares with the manifest. Errors: CM_ERR_FORMAT naming the
 * checkpoint, file and tensor whose bytes changed. */
cm_status cm_checkpoint_verify(cm_checkpoint *ck);

/* Unmaps and frees. NULL is a no-op. */
void cm_checkpoint_close(cm_checkpoint *ck);

/* The directory (as opened, after following a pointer). Borrowed until close. */
const char *cm_checkpoint_path(const cm_checkpoint *ck);
/* The manifest's text and its root object's fields. Borrowed until close. */
const char *cm_checkpoint_manifest(const cm_checkpoint *ck);
const char *cm_checkpoint_run_name(const cm_checkpoint *ck);
const cm_timestamp *cm_checkpoint_timestamp(const cm_checkpoint *ck);
bool cm_checkpoint_weights_only(const cm_checkpoint *ck);
/* XXH3-64 of the manifest's "config" object as written (two runs with the same options agree). */
uint64_t cm_checkpoint_config_digest(const cm_checkpoint *ck);
/* Whether the checkpoint is sharded (one model and one optimizer file per rank), and the number
 * of ranks that saved it. */
bool cm_checkpoint_sharded(const cm_checkpoint *ck);
int cm_checkpoint_world_size(const cm_checkpoint *ck);

/* One tensor as the manifest lists it. Strings borrowed until close. */
typedef struct cm_ckpt_tensor {
    const char *file; /* "model.safetensors" */
    const char *name; /* "0.weight" */
    cm_st_dtype dtype;
    int ndim;
    int64_t shape[CM_MAX_DIMS];
    uint64_t nbytes;
    uint64_t xxh3;
    /* The whole tensor this entry is a piece of, and the piece's element range [begin, end) in it
     * (row-major). Monolithic files: the tensor itself, [0, numel). */
    int global_ndim;
    int64_t global_shape[CM_MAX_DIMS];
    int64_t begin, end;
} cm_ckpt_tensor;

/* The number of tensors over all files, and tensor i (files in manifest order, tensors by name).
 * Errors: CM_ERR_INVALID_ARG for a bad index. */
size_t cm_checkpoint_n_tensors(const cm_checkpoint *ck);
cm_status cm_checkpoint_tensor(const cm_checkpoint *ck, size_t i, cm_ckpt_tensor *out);
/* The open file called `file` ("model.safetensors"), or NULL when the checkpoint has none. */
const cm_safetensors *cm_checkpoint_file(const cm_checkpoint *ck, const char *file);

/* Verifies the model tensors and writes model.safetensors to `out_path` (atomically, the same
 * bytes: any safetensors reader loads it). A sharded checkpoint's pieces are verified and
 * assembled into whole tensors with their global shapes (the same file a monolithic checkpoint
 * of the same state exports). A checkpoint trained with required-on-load surgery gets its record
 * in the file's metadata (CM_SURGERY_METADATA_KEY, composer/surgery_algorithms.h: the same
 * tensors, one more metadata entry), so eval and generate make that model again. Errors: cm_checkpoint_verify's, the writer's (CM_ERR_IO naming the
 * path), CM_ERR_OOM (a sharded export holds the whole model in memory). */
cm_status cm_checkpoint_export_model(cm_checkpoint *ck, const char *out_path);

/* Writes a human-readable summary (path, format, library, run, timestamp, config digest, the
 * algorithms it was trained with — surgery a load re-applies marked "required on load", with its
 * arguments — and the callbacks whose state it carries, files, tensors with dtype, shape and
 * bytes) into buf (cap bytes, always NUL-terminated); returns the
 * length the whole text needs, as snprintf. */
size_t cm_checkpoint_summary(const cm_checkpoint *ck, char *buf, size_t cap);

/* The same for a weights file (.safetensors: a run folder's model.safetensors, an export): path,
 * tensor count and data bytes, the surgery it records (CM_SURGERY_METADATA_KEY of
 * composer/surgery_algorithms.h) as "algorithms  Alibi (required on load: ...)", its other
 * metadata, and each tensor with dtype, shape and bytes, into *out (free with cm_free).
 * Errors: cm_safetensors_open's (CM_ERR_IO, CM_ERR_FORMAT naming the path), CM_ERR_OOM. */
cm_status cm_weights_summary(const char *path, char **out);

/* What a search for the newest complete checkpoint found. */
typedef struct cm_checkpoint_search {
    char path[4096];     /* the chosen checkpoint ("" when none) */
    int n_rejected;      /* unusable candidates (damaged checkpoints, a stale pointer) */
    char rejected[2048]; /* "<name>: <reason>; ..." (truncated with "...") */
} cm_checkpoint_search;

/* Finds the newest complete checkpoint in `folder`: every checkpoint directory (hidden names —
 * saves in progress — excluded) is opened, and they are tried from the highest batch count down
 * (ties: the one the pointer file `latest_name` names, NULL = "latest"); the first that opens and
 * verifies wins. Each unusable candidate (and a pointer naming a missing checkpoint) is logged
 * (warn) with its reason and listed in out->rejected. Folders with neither manifest.json nor
 * model.safetensors are not candidates. Errors: CM_ERR_NOT_FOUND when the folder does not exist
 * or holds no complete checkpoint (the message lists the rejected ones), CM_ERR_OOM. Thread-safe. */
cm_status cm_checkpoint_find_latest(const char *folder, const char *latest_name, cm_checkpoint_search *out);

/* Expands a save_filename pattern: {epoch}, {batch}, {sample}, {token}, {run_name} and {rank}
 * (Composer's placeholders) into buf (cap bytes). Errors: CM_ERR_INVALID_ARG for an unknown
 * placeholder, an unclosed brace, a '/' or a name that is empty, "." or "..", or too long. */
cm_status cm_checkpoint_format_name(const char *pattern, const cm_timestamp *ts, const char *run_name, int rank,
                                    char *buf, size_t cap);

/* The process exit status for a run that ended with `s`: 0 for CM_OK, 128 + signal for a run
 * interrupted by that signal (CM_ERR_INTERRUPTED; see cm_trainer_interrupted_signal in
 * trainer.h), 1 otherwise. */
int cm_exit_status(cm_status s, int signal);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_CHECKPOINT_H */
