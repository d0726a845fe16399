/* Private definitions of the trainer layer: the state, the engine's plugin lists and the logging
 * handle. Not installed. */
#ifndef CM_TRAINER_IMPL_H
#define CM_TRAINER_IMPL_H

#include <composer/trainer.h>

/* Computed metric values of one loader label. */
typedef struct cm_metric_set {
    char label[64];
    int n;
    cm_metric *metrics;  /* (n) from the model */
    double *sums;        /* (n · CM_METRIC_MAX_STATE) running sums */
    double *values;      /* (n) last computed values */
    bool computed;
    bool off;            /* the training set with compute_training_metrics false: n is 0 */
} cm_metric_set;

struct cm_state {
    bool owned_by_user; /* made by cm_state_new */
    char run_name[128];
    uint64_t seed;
    int rank, world_size;
    const cm_trainer_dist *dist; /* the trainer's hooks (NULL for a state from cm_state_new) */
    bool progress_bar;

    cm_model *model;
    bool model_settable; /* the surgery window (INIT to the checkpoint's required algorithms): cm_state_set_model */
    cm_optim *optimizer;
    cm_sched_config *schedulers;
    int n_schedulers;
    double ssr;
    double lr_multiplier;

    cm_dataloader *train_dl;
    cm_dataloader *dl; /* being iterated now */
    char dl_label[64];
    int64_t dl_len; /* batches the current loop runs (Composer's state.dataloader_len); -1 unknown */
    int64_t batches_per_epoch;

    cm_timestamp ts;
    cm_time max_duration;
    cm_precision precision;
    int64_t microbatch_size, n_microbatches, microbatch_index;
    bool microbatch_auto; /* device_train_microbatch_size is "auto" */

    cm_batch *batch;
    cm_model_batch mbatch;
    bool has_mbatch;
    const char *mb_names[CM_DATASET_MAX_FIELDS];
    cm_tensor *mb_fields[CM_DATASET_MAX_FIELDS];
    cm_tensor *outputs, *loss;
    cm_tape *tape;
    double total_loss;
    bool stop;
    bool rollback; /* cm_state_rollback: abandon this batch and go back to the last checkpoint */

    cm_metric_set *metric_sets; /* [0] = "train", then one per evaluator */
    int n_metric_sets;

    /* What algorithms may change (cm_state_set_batch, cm_state_set_batch_field): the event the
     * engine is running (CM_EVENT_COUNT outside events), the trainer (NULL for a state from
     * cm_state_new) and whether the train batch was replaced since the loader gave it. */
    cm_event event;
    struct cm_trainer *trainer;
    bool batch_dirty;
    bool checkpoint_due;   /* during BATCH/EPOCH_CHECKPOINT: a save follows (cm_state_checkpoint_due) */
    double lr_override;    /* NaN: the schedulers set the lr multiplier */
    /* an algorithm's train step (cm_state_set_train_step); NULL: the default */
    cm_train_step_fn step_fn;
    void *step_data;
    const char *step_name;
};

/* A configured evaluator. */
typedef struct evaluator_rt {
    char label[64];
    cm_dataloader *dl;
    int64_t subset;
    cm_time interval;
    int set; /* index into the state's metric sets */
} evaluator_rt;

struct cm_trainer {
    cm_state st;
    cm_engine *engine;
    cm_tape *tape;
    cm_data_spec *spec;
    cm_optim *own_optim;
    evaluator_rt *evals;
    int n_evals;
    int64_t mb_config; /* 0 whole batch, > 0 rows, CM_MICROBATCH_AUTO */
    bool tokens_weighting;
    bool warned_no_loss_tokens; /* the empty-microbatch warning was given */
    bool deterministic;
    cm_device device; /* cm_trainer_config.device */
    int n_threads;
    cm_trainer_dist dist;
    bool closed, locked, iteration_open;
    int64_t last_eval_batch; /* ts.batch at the last evaluation during fit (-1: none) */
    struct cmi_ckpt *ckpt;   /* checkpoint options and saver (src/checkpoint); NULL = none */
    int interrupted_signal;  /* the signal that stopped the last fit (0: none) */
    int stop_signal;         /* during fit: the preemption signal all ranks agreed to stop on (0: none) */
    bool signals_on;         /* during fit: SIGTERM/SIGINT handlers are installed (handle_signals) */
    /* FULL_SHARD: a one-row batch of the train dataset's sample 0, for the phantom microbatches
     * of a rank whose slice of a batch is empty (made on first use) */
    cm_batch phantom;
    bool has_phantom;
    /* the model's dropout generators and their counters at the start of the batch: every
     * microbatch starts from them (its rows are keyed by global row, cm_tape_set_rows) */
    cm_rng **drop_rngs;
    uint64_t *drop_base;
    int n_drop;
    int64_t *mb_counts; /* (world_size) every rank's microbatch count, made on first use */
    int n_user_algs;    /* the algorithms of the config; those after them the trainer made (required on load) */
    /* The train batch as algorithms see and change it on AFTER_DATALOADER: a copy of the loader's
     * (fields, rows and counts may be replaced; see cm_state_set_batch). */
    cm_batch work;
    double *count_buf; /* (5 + world_size) the per-batch count reduce, made on first use */
    bool dry;          /* cm_state_dry_run in progress: no events, metrics or loss logging */
    bool record_pass;   /* this gradient computation records the batch's loss and train metrics */
    /* the pre-flight memory plan (memory_plan.c) */
    bool plan_memory;   /* cm_trainer_config.plan_memory */
    bool probing;       /* a plan's dry microbatch: no events, but the train metrics (restored after) */
    bool has_plan;
    cm_memory_plan plan; /* the plan fit made before its first step */
};

/* Whether max_duration is reached; whether interval iv is crossed between two timestamps (ep
 * intervals only at epoch ends, the others only at batch ends). */
bool cmi_fit_done(const cm_trainer *tr);
bool cmi_interval_hit(const cm_trainer *tr, cm_time iv, const cm_timestamp *prev, const cm_timestamp *now,
                      bool epoch_end);

/* One real microbatch of the batch (trainer.c): forward, loss, metrics, backward of the loss × its
 * share of global_w; *oom when the tape ran out of its budget. */
/* What a batch weighs under accumulate_train_batch_on_tokens: its loss-generating tokens
 * (cm_data_spec_n_loss_tokens), or the tokens the spec counts when it does not know them. */
double cmi_loss_tokens(const cm_trainer *tr, const cm_batch *b);
cm_status cmi_run_one(cm_trainer *tr, cm_batch *mb, int64_t i, int64_t first_row, double global_w, bool *oom,
                      double *loss_sum);
/* Copies the model's persistent buffers into *out (allocated), or back from it with restore. */
cm_status cmi_snapshot_buffers(cm_module *root, char **out, bool restore);
/* fit's first automatic batch: plans the microbatch size on b (sets the state's size, logs the
 * plan; memory_plan.c). */
cm_status cmi_memory_plan_first(cm_trainer *tr, cm_batch *b, double global_w);

/* Points the state's model batch at a loader batch (names, fields, counts). */
void cmi_state_set_batch(cm_state *st, cm_batch *b, int64_t n_samples, int64_t n_tokens);
void cmi_state_clear_batch(cm_state *st);

/* Metric sets: allocate for the model's train (label "train") or eval metrics. */
cm_status cmi_metric_set_init(cm_metric_set *ms, const cm_model *model, bool train, const char *label);
void cmi_metric_set_deinit(cm_metric_set *ms);
void cmi_metric_set_reset(cm_metric_set *ms);

/* Loads checkpoint `path` mid-fit, whole (as a resume, whatever load_weights_only says), for a
 * rollback (checkpoint/trainer_ckpt.c). */
cm_status cmi_ckpt_rollback_load(cm_trainer *tr, const char *path);

/* Drops the engine's plugins without freeing them (cm_trainer_new failing after registration:
 * the caller keeps its plugins). */
void cmi_engine_release(cm_engine *e);
/* Every registered algorithm in the order the passes give for event ev, matching or not (Composer
 * orders its state.algorithms so when it adds a checkpoint's required algorithms): into out (room
 * for cm_engine_n_algorithms). Returns the count, or -1 (error set) for a bad pass. */
int cmi_engine_order_all(cm_engine *e, cm_event ev, cm_algorithm **out);
/* Unregisters the last n algorithms, freeing their plugins (ones the trainer made itself). */
void cmi_engine_pop_algorithms(cm_engine *e, int n);

#endif
