/*
 * composer/dist.h — distributed training: the communicator, the launch environment and data
 * parallelism hooked into the Trainer: NO_SHARD (DDP), SHARD_GRAD_OP (ZeRO-2: gradients and
 * optimizer state sharded), FULL_SHARD (ZeRO-3: parameters sharded too, gathered on use), and
 * HYBRID_SHARD / _HYBRID_SHARD_ZERO2 (FULL_SHARD / SHARD_GRAD_OP within groups of ranks,
 * replicated across the groups, over sub-communicators: cm_comm_split).
 *
 * A communicator (cm_comm) is a vtable with two implementations: a single process (every
 * collective is a copy or a no-op) and MPI (CPU buffers). Every collective gets a sequence number
 * and runs under a timeout (dist_timeout, 300 s by default): a rank that waits longer reports the
 * collective's number and name and which ranks did not arrive, and the call returns
 * CM_ERR_TIMEOUT.
 * Blocking calls are the non-blocking ones plus cm_comm_wait.
 *
 * Ranks start with the launcher (`composer -n 4 ./train ARGS`, which wraps mpirun), or with
 * mpirun / srun directly. cm_comm_auto_new picks MPI when the process was started by one of them
 * and the single-process communicator otherwise — a single process never initialises MPI.
 *
 *     cm_comm *comm;
 *     cm_comm_config cc = cm_comm_config_default();             // timeout from CM_DIST_TIMEOUT or 300 s
 *     if (cm_comm_auto_new(&cc, &comm) != CM_OK) { fprintf(stderr, "%s\n", cm_last_error()); return 1; }
 *     cm_dist *dp;
 *     cm_dist_config dc = cm_dist_config_default();              // NO_SHARD
 *     dc.sharding = CM_SHARDING_FULL_SHARD;                      // or SHARD_GRAD_OP, or leave it
 *     cm_dist_new(comm, model, &dc, &dp);                        // broadcasts rank 0's parameters
 *     const cm_optim_span *sp; int nsp;
 *     cm_dist_optim_spans(dp, &sp, &nsp);                        // this rank's pieces under sharding
 *     cm_optim_add_group(opt, &hp, sp, nsp);                     // (opt from cm_optim_new)
 *     cm_dataloader_config lc = cm_dataloader_config_default();
 *     lc.rank = cm_comm_rank(comm); lc.world_size = cm_comm_size(comm);   // each rank its slice
 *     ...
 *     cm_trainer_config cfg = cm_trainer_config_default();
 *     cm_dist_trainer_hooks(dp, &cfg);                           // rank, world size, reductions
 *     cm_trainer_new(&cfg, &tr);
 *     cm_dist_attach(dp, tr);                                    // overlap collectives with backward
 *     cm_status s = cm_trainer_fit(tr, NULL);
 *     ...
 *     cm_trainer_free(tr); cm_dist_free(dp);
 *     cm_comm_free(comm);           // MPI_Finalize — or, after a failed collective, nothing: exit
 *     return s ? 1 : 0;             // nonzero and the launcher stops every other rank
 *
 * Failure model. Library code never aborts: a collective that times out returns CM_ERR_TIMEOUT,
 * one that fails in the transport CM_ERR_IO, and either marks the communicator failed (every
 * later call fails at once with CM_ERR_STATE and the first error). A failed MPI communicator is
 * not finalised by cm_comm_free (MPI_Finalize would wait for the missing rank); the program
 * should print the error and exit nonzero, and mpirun / srun then stop the other ranks. A rank
 * that fails on its own with a healthy communicator should likewise exit without cm_comm_free
 * (the others may be waiting for it in a collective; tools/cli_train.c shows both cases).
 * cm_comm_abort stops the whole job at once, for programs that prefer it.
 *
 * Threading: a communicator belongs to the thread that made it (MPI is initialised with
 * MPI_THREAD_FUNNELED); kernels may still use OpenMP threads between calls.
 */
#ifndef COMPOSER_DIST_H
#define COMPOSER_DIST_H

#include <composer/trainer.h>

#ifdef __cplusplus
extern "C" {
#endif

/* =============================================================================================
 * The launch environment
 * =========================================================================================== */

/* Where this process sits in the job, as the launcher or mpirun / srun told it. */
typedef struct cm_dist_env {
    int rank, world_size;             /* 0 and 1 for a plain process */
    int local_rank, local_world_size; /* on this node */
    int node_rank;
    const char *launcher;             /* "composer", "openmpi", "mpich", "slurm" or "none" (static) */
} cm_dist_env;

/* Reads the environment: RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE / NODE_RANK (set by
 * `composer -n`), else OpenMPI's OMPI_COMM_WORLD_*, MPICH's PMI_RANK / PMI_SIZE, Slurm's
 * SLURM_PROCID / SLURM_NTASKS. Never fails: a process started by hand is rank 0 of 1. */
cm_dist_env cm_dist_env_get(void);

/* Whether this process was started by a launcher that expects MPI (world size > 1 or an MPI /
 * PMI / PMIx variable present). */
bool cm_dist_launched(void);

/* =============================================================================================
 * The communicator
 * =========================================================================================== */

/* Element types of the collectives. CM_COMM_BF16 is bfloat16 held as its 16-bit pattern
 * (uint16_t, cm_f32_to_bf16): gathers and broadcasts move the patterns; a reduction (all_reduce,
 * reduce_scatter) widens every rank's element to f32, combines them in rank order (rank 0's
 * first: ((x0 + x1) + x2) + ... for a sum) and rounds the result once to bf16 (nearest even), so
 * the result is deterministic and does not depend on the transport's algorithm. It moves 2 bytes
 * an element where f32 moves 4 (FSDP mixed precision, cm_mixed_precision). */
typedef enum cm_comm_dtype {
    CM_COMM_F32,
    CM_COMM_F64,
    CM_COMM_I32,
    CM_COMM_I64,
    CM_COMM_U8,
    CM_COMM_BF16,
    CM_COMM_DTYPE_COUNT
} cm_comm_dtype;

typedef enum cm_reduce_op { CM_REDUCE_SUM, CM_REDUCE_MAX, CM_REDUCE_MIN, CM_REDUCE_OP_COUNT } cm_reduce_op;

/* The collectives, for sequence records and messages ("all_reduce", ...). */
#define CM_COLL_LIST(X)                        \
    X(CM_COLL_ALL_REDUCE, "all_reduce")        \
    X(CM_COLL_REDUCE_SCATTER, "reduce_scatter") \
    X(CM_COLL_ALL_GATHER, "all_gather")        \
    X(CM_COLL_BROADCAST, "broadcast")          \
    X(CM_COLL_BARRIER, "barrier")

typedef enum cm_coll {
#define CM_X_(name, str) name,
    CM_COLL_LIST(CM_X_)
#undef CM_X_
    CM_COLL_COUNT
} cm_coll;

const char *cm_coll_name(cm_coll c);          /* "all_reduce"; "?" out of range */
size_t cm_comm_dtype_size(cm_comm_dtype dt);  /* 0 out of range */

/* What a backend is asked to start: the collective, its sequence number (1, 2, ... per
 * communicator, the same on every rank for the same call) and its size. */
typedef struct cm_coll_info {
    cm_coll coll;
    uint64_t seq;
    int64_t count; /* elements per rank (all_reduce, broadcast: the buffer; reduce_scatter: the
                      received block; all_gather: the sent block) */
    cm_comm_dtype dtype;
} cm_coll_info;

#define CM_COMM_ABI 3 /* 2: the split slot; 3: CM_COMM_BF16, which a backend's reductions must combine as
                         its comment says */

/* A backend. The generic layer (cm_comm_*) checks arguments, numbers the collectives and runs
 * the timeouts; a backend only starts operations and tests them. Every start function returns a
 * backend request in *req (never NULL on success); test completes it: *done = true means the
 * request is finished and released. Required: all slots but describe_missing, abort and split. */
typedef struct cm_comm_i {
    int abi;          /* CM_COMM_ABI */
    const char *name; /* "single", "mpi" */
    int (*rank)(void *self);
    int (*size)(void *self);
    /* In place over buf (count elements). */
    cm_status (*iall_reduce)(void *self, const cm_coll_info *ci, void *buf, cm_reduce_op op, void **req);
    /* send: size × count elements; recv: count elements (this rank's block of the reduction). */
    cm_status (*ireduce_scatter)(void *self, const cm_coll_info *ci, const void *send, void *recv, cm_reduce_op op,
                                 void **req);
    /* send: count elements; recv: size × count elements in rank order. */
    cm_status (*iall_gather)(void *self, const cm_coll_info *ci, const void *send, void *recv, void **req);
    cm_status (*ibroadcast)(void *self, const cm_coll_info *ci, void *buf, int root, void **req);
    cm_status (*ibarrier)(void *self, const cm_coll_info *ci, void **req);
    cm_status (*test)(void *self, void *req, bool *done);
    /* Writes what the backend knows about collective `seq` that did not finish: which ranks have
     * not arrived and where they were last seen. Optional. */
    void (*describe_missing)(void *self, const cm_coll_info *ci, char *buf, size_t cap);
    /* Stops the whole job now with `code` (MPI_Abort). Optional; does not return when present. */
    void (*abort)(void *self, int code);
    /* Releases the backend; `failed` says a collective failed (do not finalise collectively). */
    void (*free)(void *self, bool failed);
    /* Makes the backend of a sub-communicator: the ranks that pass the same color, ranked by key
     * (ties by rank here), as MPI_Comm_split does. Collective over this backend's ranks; the
     * generic layer has checked the arguments and agreed on them with every rank (under the
     * timeout) before it calls this. The new backend is released with its own free. Optional:
     * NULL makes cm_comm_split return CM_ERR_UNSUPPORTED. */
    cm_status (*split)(void *self, int color, int key, const struct cm_comm_i **vt, void **out);
} cm_comm_i;

typedef struct cm_comm_config {
    /* Seconds a rank waits in one collective before giving up (dist_timeout). Default: the
     * environment variable CM_DIST_TIMEOUT if set, else 300. Must be > 0. */
    double timeout_s;
    /* MPI: tell peers which collective each rank enters (a few bytes to each peer per
     * collective), so a timeout can name the missing ranks. Default true. */
    bool heartbeats;
} cm_comm_config;

cm_comm_config cm_comm_config_default(void);

typedef struct cm_comm cm_comm;
typedef struct cm_comm_request cm_comm_request;

/* One process: rank 0 of 1. Never touches MPI. cfg NULL = defaults. Errors: CM_ERR_INVALID_ARG
 * (timeout <= 0), CM_ERR_OOM. */
cm_status cm_comm_single_new(const cm_comm_config *cfg, cm_comm **out);
/* MPI over MPI_COMM_WORLD: initialises MPI (MPI_THREAD_FUNNELED) unless it already is, and then
 * owns the finalisation. Errors: CM_ERR_INVALID_ARG, CM_ERR_IO (MPI_Init failed), CM_ERR_OOM. */
cm_status cm_comm_mpi_new(const cm_comm_config *cfg, cm_comm **out);
/* MPI when cm_dist_launched() or CM_DIST=mpi, the single process otherwise (CM_DIST=single
 * forces it). Also installs a "[rank N] " log prefix when the world has more than one rank. */
cm_status cm_comm_auto_new(const cm_comm_config *cfg, cm_comm **out);
/* A communicator over a custom backend (e.g. a test double); takes self on success. */
cm_status cm_comm_new(const cm_comm_i *vt, void *self, const cm_comm_config *cfg, cm_comm **out);
/* Releases the communicator: MPI_Finalize when it made MPI and nothing failed. NULL is a no-op.
 * Requests still pending are abandoned (wait for them first). */
void cm_comm_free(cm_comm *c);

/* A sub-communicator (MPI_Comm_split): every rank of c calls it; the ranks that pass the same
 * color (>= 0) form one new communicator each, ranked by key, then by their rank in c. It has
 * its own sequence numbers and c's timeout, and it is an ordinary cm_comm: the collectives, the
 * timeouts and their messages (which name ranks of the sub-communicator: its cm_comm_rank) work
 * as on c. Free it with cm_comm_free before c (freeing a sub-communicator never finalises MPI).
 * The colors and keys are exchanged first with an all_gather on c (under the timeout, so a rank
 * that never arrives is named), then the backend splits. HYBRID_SHARD's shard and replicate
 * groups are made this way (cm_dist_new). Errors: CM_ERR_INVALID_ARG (NULL, color < 0),
 * CM_ERR_UNSUPPORTED (the backend cannot split), c's errors, CM_ERR_OOM. */
cm_status cm_comm_split(cm_comm *c, int color, int key, cm_comm **out);

int cm_comm_rank(const cm_comm *c);
int cm_comm_size(const cm_comm *c);
const char *cm_comm_backend(const cm_comm *c);       /* "single", "mpi" */
double cm_comm_timeout(const cm_comm *c);
void cm_comm_set_timeout(cm_comm *c, double seconds); /* ignored unless > 0 */
uint64_t cm_comm_seq(const cm_comm *c);             /* collectives started so far */
/* CM_OK, or the status of the first failure (the message of cm_comm_error). */
cm_status cm_comm_status(const cm_comm *c);
const char *cm_comm_error(const cm_comm *c);

/* Collectives. All ranks must call them in the same order with the same counts and dtypes.
 * Blocking forms return when done; errors: CM_ERR_INVALID_ARG (NULL buffer with count > 0,
 * negative count, bad dtype / op / root), CM_ERR_TIMEOUT (waited longer than the timeout: the
 * message names the collective, its sequence number and the missing ranks), CM_ERR_IO (a
 * transport error), CM_ERR_STATE (the communicator failed before). Buffers may not overlap
 * except where in place. */
cm_status cm_comm_all_reduce(cm_comm *c, void *buf, int64_t count, cm_comm_dtype dt, cm_reduce_op op);
cm_status cm_comm_reduce_scatter(cm_comm *c, const void *send, void *recv, int64_t recv_count, cm_comm_dtype dt,
                                 cm_reduce_op op);
cm_status cm_comm_all_gather(cm_comm *c, const void *send, void *recv, int64_t send_count, cm_comm_dtype dt);
cm_status cm_comm_broadcast(cm_comm *c, void *buf, int64_t count, cm_comm_dtype dt, int root);
cm_status cm_comm_barrier(cm_comm *c);
/* all_gather runs in place when send is this rank's own block of recv (recv + rank · send_count). */
/* Shorthands for the common in-place sums. */
cm_status cm_comm_all_reduce_sum_f32(cm_comm *c, float *buf, int64_t count);
cm_status cm_comm_all_reduce_sum_f64(cm_comm *c, double *buf, int64_t count);

/* Non-blocking forms: start the collective and return a request (owned by the caller until
 * cm_comm_wait or a cm_comm_test that reports done releases it). Buffers must stay untouched
 * until then. Requests may be waited on in any order. */
cm_status cm_comm_iall_reduce(cm_comm *c, void *buf, int64_t count, cm_comm_dtype dt, cm_reduce_op op,
                              cm_comm_request **req);
cm_status cm_comm_ireduce_scatter(cm_comm *c, const void *send, void *recv, int64_t recv_count, cm_comm_dtype dt,
                                  cm_reduce_op op, cm_comm_request **req);
cm_status cm_comm_iall_gather(cm_comm *c, const void *send, void *recv, int64_t send_count, cm_comm_dtype dt,
                              cm_comm_request **req);
cm_status cm_comm_ibroadcast(cm_comm *c, void *buf, int64_t count, cm_comm_dtype dt, int root,
                             cm_comm_request **req);
cm_status cm_comm_ibarrier(cm_comm *c, cm_comm_request **req);
/* Waits for req (at most the timeout, counted from this call) and releases it, also on error. */
cm_status cm_comm_wait(cm_comm *c, cm_comm_request *req);
/* Progresses req without blocking; *done = true means it finished and was released. */
cm_status cm_comm_test(cm_comm *c, cm_comm_request *req, bool *done);

/* Stops every rank of the job now with `code` (0 becomes 1), after logging msg: MPI_Abort, which
 * does not return. For programs that want to end the job at the first error; the library never
 * calls it, and never exits: a backend that cannot stop the job (the single process, or an abort
 * that failed) returns CM_ERR_UNSUPPORTED, and the program ends itself with that code. Errors:
 * CM_ERR_INVALID_ARG (NULL), CM_ERR_UNSUPPORTED. */
cm_status cm_comm_abort(cm_comm *c, int code, const char *msg);

/* =============================================================================================
 * Data parallelism
 * =========================================================================================== */

#define CM_SHARDING_LIST(X)                          \
    X(CM_SHARDING_NO_SHARD, "NO_SHARD")              \
    X(CM_SHARDING_SHARD_GRAD_OP, "SHARD_GRAD_OP")    \
    X(CM_SHARDING_FULL_SHARD, "FULL_SHARD")          \
    X(CM_SHARDING_HYBRID_SHARD, "HYBRID_SHARD")      \
    X(CM_SHARDING_HYBRID_SHARD_ZERO2, "_HYBRID_SHARD_ZERO2")

typedef enum cm_sharding {
#define CM_X_(name, str) name,
    CM_SHARDING_LIST(CM_X_)
#undef CM_X_
    CM_SHARDING_COUNT
} cm_sharding;

const char *cm_sharding_name(cm_sharding s);                /* "NO_SHARD"; "?" out of range */
cm_status cm_sharding_parse(const char *s, cm_sharding *out); /* case-insensitive */

/* FULL_SHARD: when backward starts the all-gather of the unit it will need next (Composer's
 * fsdp_config backward_prefetch, PyTorch's BackwardPrefetch). */
#define CM_BACKWARD_PREFETCH_LIST(X)                   \
    X(CM_BACKWARD_PREFETCH_NONE, "NONE")               \
    X(CM_BACKWARD_PREFETCH_PRE, "BACKWARD_PRE")        \
    X(CM_BACKWARD_PREFETCH_POST, "BACKWARD_POST")

typedef enum cm_backward_prefetch {
#define CM_X_(name, str) name,
    CM_BACKWARD_PREFETCH_LIST(CM_X_)
#undef CM_X_
    CM_BACKWARD_PREFETCH_COUNT
} cm_backward_prefetch;

const char *cm_backward_prefetch_name(cm_backward_prefetch p);                /* "BACKWARD_PRE"; "?" out of range */
cm_status cm_backward_prefetch_parse(const char *s, cm_backward_prefetch *out); /* case-insensitive */

/* FSDP mixed precision (Composer's fsdp_config mixed_precision, PyTorch's MixedPrecision): the
 * dtypes data parallelism holds and moves things in. Each is CM_DTYPE_F32 (the default: no
 * change) or CM_DTYPE_BF16; CM_DTYPE_F16 is refused (there are no fp16 kernels, and amp_fp16 is
 * refused by the trainer too).
 *   param_dtype: the dtype of the unsharded parameters forward and backward read. The optimizer
 *     keeps stepping f32 master parameters (this rank's piece under sharding), and checkpoints
 *     hold those; with bf16, every read of a parameter on the trainer's tape sees the master
 *     rounded to bf16 (nearest even). The rounded values are held in the model's f32 flat
 *     buffers (kernels compute in f32 on them, or in bf16 under autocast, as before): the saving
 *     is in communication — FULL_SHARD's and SHARD_GRAD_OP's all-gathers move bf16, half the
 *     bytes (cm_dist_stats.gather_bytes) — not in the memory of a gathered unit. The gradient
 *     with respect to the rounded parameters is computed and accumulated in f32 (PyTorch keeps
 *     the unsharded gradient in param_dtype, one more rounding before an f32 reduction).
 *     Where the f32 masters sit at rest: FULL_SHARD, as always, in this rank's parameter chunk;
 *     SHARD_GRAD_OP in a chunk of their own (the model's buffers then hold the rounded values);
 *     NO_SHARD in the model's buffers, which hold the rounded copy only during a forward and
 *     backward (from the first read on the tape to sync_grads, or to the end of an evaluation:
 *     this needs cm_dist_attach). cm_dist_gather_params gathers the f32 masters.
 *   reduce_dtype: the dtype the gradient reductions run in (all-reduce, reduce-scatter, and
 *     HYBRID_SHARD's all-reduce over the replicate group). With bf16 each gradient bucket is
 *     rounded to bf16, reduced as CM_COMM_BF16 (half the bytes, cm_dist_stats.bytes; sums in f32
 *     in rank order, rounded once) and widened back to f32 for the optimizer; on one rank the
 *     rounding alone remains, so one rank is N ranks' degenerate case.
 *   buffer_dtype: the dtype buffers (BatchNorm running statistics) are held in: with bf16 every
 *     f32 buffer is rounded to bf16 when cm_dist_new starts, whenever an op on the tape reads it
 *     (so each update starts from the rounded value, as a bf16 buffer would) and at the end of
 *     each batch's backward (so checkpoints hold rounded values).
 *   keep_low_precision_grads: Composer's key; must be false here (the sharded gradient is cast
 *     to f32 for the optimizer, as PyTorch does with false).
 * Composer's policies as values: cm_mixed_precision_policy. Under precision fp32, DEFAULT and PURE
 * are f32 throughout; a bf16 param_dtype there still rounds the parameters (compute stays f32).
 * On a GPU (one process: NO_SHARD, or cpu_offload) the same, in device memory: under NO_SHARD the
 * masters are device buffers and the rounding runs on the device; under cpu_offload the masters
 * stay in host memory, each unit is uploaded as f32 and rounded on the GPU, and a bf16
 * reduce_dtype rounds each microbatch's gradient on the GPU before its download. */
typedef struct cm_mixed_precision {
    cm_dtype param_dtype, reduce_dtype, buffer_dtype;
    bool keep_low_precision_grads;
} cm_mixed_precision;

/* Composer's named policies for a run of `precision` (its autocast dtype: bf16 under amp_bf16,
 * f16 under amp_fp16, f32 under fp32): "FULL" (f32, f32, f32), "DEFAULT" (autocast, f32,
 * autocast), "PURE" (autocast ×3), case-insensitive; keep_low_precision_grads false. Errors:
 * CM_ERR_INVALID_ARG (NULL, an unknown name: "use FULL, DEFAULT or PURE"). */
cm_status cm_mixed_precision_policy(const char *name, cm_precision precision, cm_mixed_precision *out);

typedef struct cm_dist_config {
    cm_sharding sharding;    /* NO_SHARD (default), SHARD_GRAD_OP (ZeRO-2), FULL_SHARD (ZeRO-3),
                                HYBRID_SHARD, _HYBRID_SHARD_ZERO2 */
    bool sync_module_states; /* broadcast rank 0's parameters and buffers in cm_dist_new (default true) */
    bool overlap;            /* start each unit's all-reduce as soon as backward finished it (default true) */
    int max_resident_units;  /* FULL_SHARD: units whose parameters may be gathered at once (≥ 2; default 2) */
    /* HYBRID_SHARD / _HYBRID_SHARD_ZERO2: ranks in one shard group (data_parallel_shard_degree)
     * and shard groups (data_parallel_replicate_degree); 0 (default) = derived, see
     * cm_dist_hybrid_degrees. Ignored by the other strategies. */
    int shard_degree, replicate_degree;
    /* FULL_SHARD prefetch, Composer's keys and defaults (no effect under the other strategies).
     * The tape reads the units in the order the previous pass of the same kind (forward,
     * backward) read them; prefetch starts a unit's all-gather (non-blocking) ahead of its use,
     * and the fetch hook waits for it when the tape reads the unit. Values are the same bits with
     * or without prefetch: only the time a gather starts changes.
     *   backward_prefetch: BACKWARD_PRE starts the next unit's gather when backward enters the
     *     current unit (before its gradient computation), BACKWARD_POST once the current unit's
     *     gradient is final (needs cm_dist_attach: the tape's backward hook says when; without
     *     it, POST prefetches nothing), NONE gathers every unit when backward reads it.
     *     Default BACKWARD_POST. The first backward, with no previous one to follow, follows the
     *     reverse of the forward just run.
     *   forward_prefetch: entering a unit in forward starts the next unit's gather (default false).
     *   limit_all_gathers: at most 2 gathers in flight (the current unit's and the next one's),
     *     prefetching one unit ahead (default true); false prefetches up to max_resident_units
     *     units ahead, at most max_resident_units + 1 gathers in flight.
     * Memory: at most max_resident_units gathered units the tape uses (the least recently used
     * one is evicted, never one being gathered), plus the units in flight. */
    cm_backward_prefetch backward_prefetch;
    bool forward_prefetch;
    bool limit_all_gathers;
    /* FSDP mixed precision (see cm_mixed_precision); default f32 throughout (Composer's FULL). */
    cm_mixed_precision mixed_precision;
    /* Composer's fsdp_config cpu_offload (PyTorch's CPUOffload(offload_params=True)), for one
     * process training on a GPU (a communicator of size 1; default false): the parameters (the fp32
     * masters), their gradients and the optimizer state live in host memory (pinned), and each
     * wrap unit's parameters are uploaded to the GPU when the trainer's tape reads the unit and
     * released after, as FULL_SHARD gathers and releases them (max_resident_units, the prefetch
     * keys above: an upload of the next unit runs on a copy stream while the current one
     * computes). In backward a unit's gradient lives on the GPU from its first gradient until
     * the unit is final, then is downloaded, added into the host gradient and released. The
     * optimizer and gradient clipping run on the host (cm_dist_optim_spans, cm_state_shard_spans).
     * The sharding strategy has no further effect (one rank has nothing to shard). */
    bool cpu_offload;
} cm_dist_config;

cm_dist_config cm_dist_config_default(void);

/* Whether s is HYBRID_SHARD or _HYBRID_SHARD_ZERO2. */
bool cm_sharding_is_hybrid(cm_sharding s);

/* HYBRID_SHARD's layout for `world` ranks, `local_world` of them on each node, as Composer
 * derives it: *shard and *replicate are the configured degrees on input (0 = not given) and the
 * resolved ones on output. Neither given: shard = local_world (shard within a node), replicate
 * = world / local_world (one group per node). One given: the other is world / it. Both: their
 * product must be world. Errors (CM_ERR_INVALID_ARG, naming data_parallel_shard_degree,
 * data_parallel_replicate_degree and the world size): a degree < 0, a world size the given
 * degree does not divide, a product other than the world size. */
cm_status cm_dist_hybrid_degrees(int world, int local_world, int *shard, int *replicate);

typedef struct cm_dist cm_dist;

/* Data parallelism over `comm` for `model` (both borrowed; they must outlive the cm_dist). The
 * model's module tree must be finalized: each wrap unit's flat gradient buffer is one bucket.
 * SHARD_GRAD_OP (ZeRO-2) pads each unit's flat buffers to a multiple of the world size (moving
 * them: call it before making the optimizer and the trainer) and locks the model until
 * cm_dist_free; rank r then owns elements [r·chunk, (r+1)·chunk) ∩ [0, numel) of each unit,
 * chunk = ceil(numel / W): its optimizer holds just those (cm_dist_optim_spans), sync_grads
 * reduce-scatters the gradient into them and cm_dist_sync_params all-gathers the parameters after
 * the step. Under it, the model's flat gradient buffers hold only this rank's local gradient
 * after sync_grads: read the global one through the shard spans (cm_state_shard_spans).
 * FULL_SHARD (ZeRO-3) keeps, at rest, only this rank's chunk of each unit's parameters (the
 * master copy the optimizer updates, cm_shard_span.params); a unit's flat parameter buffer is
 * all-gathered the moment an op on the trainer's tape reads it (the fetch hook, which
 * cm_dist_trainer_hooks installs) — or started earlier and waited for then, with prefetch
 * (backward_prefetch, forward_prefetch, limit_all_gathers in cm_dist_config) — at most
 * max_resident_units units at a time (plus the units in flight), and its memory is
 * returned to the system when it is evicted and after every optimizer step (and made unreadable
 * until gathered again, so a stray read faults rather than seeing zeros). Code that reads the
 * model's parameters outside the trainer's tape (sampling text, exporting weights) calls
 * cm_dist_gather_params first — on every rank, since it is a collective. Gradients are sharded
 * as well: every microbatch's backward reduce-scatters each unit as soon as it is final (with
 * cm_dist_attach; otherwise once, in sync_grads), the chunks accumulate in this rank's gradient
 * shard, and a unit's full gradient buffer gives its pages back after each reduce-scatter. The
 * trainer runs the same number of microbatches on every rank (a rank with fewer rows runs
 * "phantom" microbatches that change nothing), since every forward and backward communicates.
 * HYBRID_SHARD (FULL_SHARD's semantics) and _HYBRID_SHARD_ZERO2 (SHARD_GRAD_OP's) shard within
 * groups of shard_degree ranks and replicate across replicate_degree groups (Composer's and
 * PyTorch's layout: shard group g is ranks [g·S, (g+1)·S), so a group is one node by default;
 * the ranks holding the same piece — one in each group — form a replicate group). Every piece,
 * chunk and collective above is then the shard group's (chunk = ceil(numel / S), "rank" its
 * rank in the group), and sync_grads, after the reduce-scatter in the shard group, all-reduces
 * each gradient chunk over the replicate group, so each rank again holds its piece of the
 * global batch's gradient. The two groups are sub-communicators of comm (cm_comm_split, made
 * here: a collective); the shard spans of the replicas (replicate-group rank > 0) are marked
 * cm_shard_span.replica, so sums over ranks and sharded checkpoints count each piece once.
 * cpu_offload (one process): the model must be finalized and still on the CPU (its unit buffers
 * become fixed-address GPU ranges whose memory is mapped while a unit is resident, its buffers
 * move to the GPU, and the trainer leaves it there: make the optimizer over cm_dist_optim_spans,
 * which are host memory); everything above about FULL_SHARD's residency, prefetch and gradient
 * shards holds with "upload" for "all-gather" and "download" for "reduce-scatter" (one rank: the
 * shard is the whole unit). It needs at least 2 wrap units (with one, the whole model would be
 * resident whenever it is used), CM_ERR_INVALID_ARG otherwise; CM_ERR_UNSUPPORTED on a
 * communicator of several ranks (not built) or without a GPU (cm_device_check's message);
 * CM_ERR_STATE when the model is already on the GPU.
 * A model on GPUs over several ranks (one process per GPU, each on its local rank's: the CUDA
 * backend picks it from the launcher's environment): NO_SHARD, moved there before or after this
 * call (the CLI and the trainer move it after). Each unit's gradient is downloaded into a pinned
 * host stage when it is final (the same backward hook and order as on the CPU; the copy stream
 * overlaps it with the rest of backward), all-reduced over the communicator (MPI) once its
 * download is done, and uploaded back in sync_grads — NCCL, which would reduce on the GPUs, is
 * not used. The sharded strategies with a model on a GPU are CM_ERR_UNSUPPORTED (their shards
 * live in host memory).
 * Errors: CM_ERR_INVALID_ARG (NULL; max_resident_units < 2 with FULL_SHARD or HYBRID_SHARD;
 * degrees that do not fit the world, see cm_dist_hybrid_degrees), CM_ERR_STATE (not finalized; a
 * sharded strategy on a model that an optimizer or trainer already locked), the communicator's
 * errors (the broadcast, the splits), CM_ERR_UNSUPPORTED (a hybrid strategy over a backend that
 * cannot split), CM_ERR_OOM. */
cm_status cm_dist_new(cm_comm *comm, cm_model *model, const cm_dist_config *cfg, cm_dist **out);
/* NULL is a no-op; waits for nothing: sync first. Under FULL_SHARD the model's flat parameter
 * buffers become ordinary memory again, and units that were not gathered hold NaN: call
 * cm_dist_gather_params first (on every rank) to keep using the model afterwards. Under
 * SHARD_GRAD_OP with a bf16 param_dtype the buffers hold the rounded values unless
 * cm_dist_gather_params put the f32 masters there; NO_SHARD puts its masters back itself. Under a hybrid
 * strategy it frees the two sub-communicators (no collective). With cpu_offload the model is left
 * on the CPU, holding the host master parameters (gradients zero). */
void cm_dist_free(cm_dist *d);

/* Fills cfg->dist: rank, world size, all_reduce_sum (losses, sample/token counts, metric sums)
 * and sync_grads (the gradient all-reduce); the tape's fetch hook under FULL_SHARD and under a
 * bf16 param_dtype or buffer_dtype (it rounds what the tape reads). The trainer weights every microbatch's loss by its
 * share of the global batch, so the summed gradients are exactly the full batch's. */
void cm_dist_trainer_hooks(cm_dist *d, cm_trainer_config *cfg);

/* The spans an optimizer over this rank's parameters should hold (cm_optim_add_group), in unit
 * order, named by unit: NO_SHARD gives every unit whole ({unit name, params, grads, numel});
 * SHARD_GRAD_OP and FULL_SHARD give this rank's piece of each unit ({unit name, span.params,
 * span.grads, end - begin}: see cm_shard_span), so optimizer state is sharded too. *out points
 * into d (valid while d lives). Make the optimizer after cm_dist_new and before the trainer.
 * Errors: CM_ERR_INVALID_ARG (NULL). */
cm_status cm_dist_optim_spans(cm_dist *d, const cm_optim_span **out, int *n);

/* Lets backward start each unit's gradient collective (all-reduce; reduce-scatter when sharded)
 * as soon as backward has finished the unit: during the last microbatch's backward, or every
 * microbatch's under FULL_SHARD (a hook on the trainer's tape, and a callback
 * "DistributedDataParallel" on its engine that unhooks it when the trainer is freed; either may
 * be freed first). Nothing starts during backward while the microbatch size is automatic (an
 * attempt may be thrown away). Optional: without it every bucket starts in sync_grads, after
 * backward (correct, not overlapped). Errors: CM_ERR_INVALID_ARG (NULL), CM_ERR_STATE (attached
 * already), the engine's errors. */
cm_status cm_dist_attach(cm_dist *d, cm_trainer *tr);

/* Makes the gradients the global batch's: starts the collective of every unit backward has not
 * started yet — an all-reduce (sum) of its flat gradient buffer, or under sharding a
 * reduce-scatter into this rank's gradient shard — then waits for all of them (FULL_SHARD: adds
 * the last microbatch's chunks into the shards and releases the full gradient pages). Errors: the
 * communicator's. */
cm_status cm_dist_sync_grads(cm_dist *d);

/* After an optimizer step under SHARD_GRAD_OP: all-gathers every unit (in place) so each rank's
 * model holds the updated parameters of every rank's piece. Nothing to do for NO_SHARD. The
 * trainer calls it through the sync_params hook after each step and after a checkpoint load.
 * Errors: the communicator's. */
cm_status cm_dist_sync_params(cm_dist *d);

/* FULL_SHARD: gathers every unit so the model's flat buffers hold all parameters (for sampling or
 * exporting weights); they stay valid until the next optimizer step or until the trainer's tape
 * evicts them. A collective: every rank calls it. Nothing to do for the other strategies, except
 * under a bf16 param_dtype (cm_mixed_precision), where the model's buffers may hold the rounded
 * copy: then it puts the f32 masters there (SHARD_GRAD_OP: an f32 all-gather of the master
 * chunks; NO_SHARD: the masters kept aside), and the fetch hook rounds a unit again when the
 * tape next reads it. Under FULL_SHARD it gathers the f32 masters too (PyTorch's
 * summon_full_params). Errors: the communicator's. With cpu_offload it uploads every
 * unit (the whole model on the GPU at once: CM_ERR_OOM where it does not fit); to read the weights
 * on the host, free the cm_dist instead (the model goes back to host memory with the master values). */
cm_status cm_dist_gather_params(cm_dist *d);

/* Where the time went, summed since cm_dist_new (or the last reset). */
typedef struct cm_dist_stats {
    int64_t n_syncs;         /* sync_grads calls */
    int64_t n_buckets_early; /* buckets started during backward */
    int64_t n_buckets_late;  /* buckets started in sync_grads */
    double bytes;            /* gradient bytes reduced (per rank: the buffers handed to all_reduce /
                                reduce_scatter; halved by a bf16 reduce_dtype) */
    double wait_s;           /* time blocked in sync_grads: communication not hidden */
    double hook_s;           /* time spent starting / progressing buckets during backward */
    int64_t n_gathers;       /* FULL_SHARD: unit all-gathers (blocking on a fetch, or prefetched) */
    int64_t n_prefetches;    /* FULL_SHARD: of those, started ahead of use by prefetch */
    int64_t n_prefetch_hits; /* FULL_SHARD: fetches that found their unit prefetched (waited for it, if at all) */
    int64_t n_prefetch_unused; /* FULL_SHARD: prefetched units never read before the step made them stale */
    int max_in_flight;       /* FULL_SHARD: the most unit gathers in flight at once */
    int max_gathered;        /* FULL_SHARD: the most units holding parameter pages at once (gathered or in flight) */
    double gather_s;         /* FULL_SHARD: time the fetch hook blocked in gathers or waiting for prefetched ones */
    double gather_bytes;     /* parameter bytes all-gathered into this rank (FULL_SHARD's unit gathers,
                                SHARD_GRAD_OP's after each step; halved by a bf16 param_dtype) */
} cm_dist_stats;

cm_dist_stats cm_dist_get_stats(const cm_dist *d);
void cm_dist_reset_stats(cm_dist *d);
cm_comm *cm_dist_comm(const cm_dist *d);
/* Under a hybrid strategy: the shard group's and the replicate group's communicators (owned by
 * d); otherwise the world's (cm_dist_comm) and NULL. */
cm_comm *cm_dist_shard_comm(const cm_dist *d);
cm_comm *cm_dist_replicate_comm(const cm_dist *d);

/* =============================================================================================
 * Launcher support (used by `composer -n`)
 * =========================================================================================== */

/* Expands {rank}, {local_rank}, {node_rank}, {world_size} in fmt into buf. Errors:
 * CM_ERR_INVALID_ARG (an unknown {name} or an unclosed brace, naming it; a result longer than
 * cap). */
cm_status cm_dist_format(const char *fmt, const cm_dist_env *env, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_DIST_H */
