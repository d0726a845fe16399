/* Helpers for the algorithm tests: small model families with synthetic data (an MLP, the MNIST
 * CNN, a CIFAR-style ResNet, a tiny GPT-2), a short fit under algorithms, and the resumption check
 * of Composer's tests/algorithms/test_algorithm_resumption.py — train N batches saving a
 * checkpoint after every batch, train again from the checkpoint of batch k, and require every
 * later checkpoint of both runs to be bit for bit the same (every tensor of every file: model,
 * optimizer, algorithm state; the manifest's timestamp, RNG, data positions, schedulers and
 * plugin states). Every function aborts the test on failure. */
#ifndef CMALGO_H
#define CMALGO_H

#include <composer/composer.h>

/* A model and its training data. Made fresh by a rig function: two calls give the same initial
 * weights and the same batches. */
typedef struct cmt_rig {
    const char *family;  /* "mlp", "cnn", "resnet", "gpt2" */
    cm_model *model;
    cm_dataset *ds;
    cm_dataloader *dl;   /* train mode, shuffled, drop_last; batches_per_epoch batches */
    cm_dataset *eval_ds;
    cm_dataloader *eval_dl; /* eval mode over eval_ds */
    int64_t batches_per_epoch;
} cmt_rig;

typedef void (*cmt_rig_fn)(cmt_rig *out, void *data);
void cmt_rig_free(cmt_rig *r);

/* The families. data: NULL, or an int64_t * giving the batches per epoch (default 2). */
void cmt_rig_mlp(cmt_rig *out, void *data);    /* 8 → 16 → (dropout 0.1) → 3, synthetic vectors */
void cmt_rig_cnn(cmt_rig *out, void *data);    /* MnistCNN on 1×8×8 images, channels 4/8, dropout */
void cmt_rig_resnet(cmt_rig *out, void *data); /* CIFAR stem, 2 stages of 1 basic block, BatchNorm */
void cmt_rig_gpt2(cmt_rig *out, void *data);   /* the "tiny" preset, sequences of 8 tokens */

/* Fills out[0..] with the algorithms of one run and returns how many (at most cap). Called once
 * per trainer, so each run gets its own fresh plugins. */
typedef int (*cmt_algos_fn)(cm_algorithm_plugin *out, int cap, void *data);

typedef struct cmt_run_opts {
    const char *max_duration;   /* "2ba" */
    cm_precision precision;     /* fp32 */
    int64_t microbatch;         /* device_train_microbatch_size (0: whole batch) */
    bool eval;                  /* evaluate the eval loader every eval_interval */
    const char *eval_interval;  /* "1ep" */
    const char *save_folder;    /* NULL: no saving */
    const char *save_interval;  /* "1ba" */
    const char *load_path;      /* NULL: start fresh */
    bool adam;                  /* DecoupledAdamW lr 1e-2 (default); false: DecoupledSGDW lr 0.1, momentum 0.9 */
    bool schedule;              /* a step scheduler (gamma 0.5 every batch), as Composer's test's StepLR */
    const char *load_exclude_algorithms; /* one glob, or NULL */
    bool save_async;                     /* background checkpoint saves */
} cmt_run_opts;

cmt_run_opts cmt_run_opts_default(void);

/* A trainer over rig's model and loaders with the algorithms of make_algos (may be NULL), its
 * optimizer (owned by the returned trainer's caller through *opt) and an in-memory logger. */
typedef struct cmt_run {
    cm_trainer *tr;
    cm_optim *opt;
    cm_in_memory_logger *mem;
} cmt_run;
cmt_run cmt_run_new(cmt_rig *rig, cmt_algos_fn make_algos, void *algos_data, const cmt_run_opts *o);
/* The same without aborting: cm_trainer_new's status (the plugins are freed on failure and
 * cm_last_error() holds the message). */
cm_status cmt_run_try(cmt_rig *rig, cmt_algos_fn make_algos, void *algos_data, const cmt_run_opts *o, cmt_run *out);
void cmt_run_free(cmt_run *r);

/* Fits `fit_first` (a duration in ba, e.g. "1ba"), then fits again for the rest of max_duration
 * (in ba), and checks that both fits ran, the loss stayed finite and the weights changed. */
void cmt_check_fit_twice(cmt_rig_fn make_rig, void *rig_data, cmt_algos_fn make_algos, void *algos_data,
                         const cmt_run_opts *o, const char *fit_first, const char *label);

typedef struct cmt_resumption_opts {
    cmt_run_opts run;      /* save_folder and load_path are set by the check */
    int64_t total_batches; /* 2: the runs' length (max_duration = total_batches "ba") */
    int64_t resume_batch;  /* 1: the second run loads the first run's checkpoint of this batch */
    const char *label;     /* in messages */
} cmt_resumption_opts;

cmt_resumption_opts cmt_resumption_opts_default(void);

/* The check (see the overview). Also requires that the first run's model weights at
 * resume_batch and at total_batches differ (the runs trained something). Checkpoints are
 * written under a temporary folder that is removed afterwards. */
void cmt_check_algorithm_resumption(cmt_rig_fn make_rig, void *rig_data, cmt_algos_fn make_algos, void *algos_data,
                                    const cmt_resumption_opts *o);

/* The same check without aborting: true (and the first difference in msg) when any later
 * checkpoint differs. For tests that show the check can fail. */
bool cmt_algorithm_resumption_differs(cmt_rig_fn make_rig, void *rig_data, cmt_algos_fn make_algos, void *algos_data,
                                      const cmt_resumption_opts *o, char *msg, size_t cap);

/* Whether two checkpoint directories hold different state (writing the first difference into
 * msg): the same files with the same tensors, bit for bit, and manifests equal but for "created",
 * the manifest checksum and the wall-clock timestamp fields count as the same. The assert form
 * aborts the test with label and the difference. */
bool cmt_checkpoints_differ(const char *a, const char *b, char *msg, size_t cap);
void cmt_assert_checkpoints_equal(const char *a, const char *b, const char *label);

/* A fresh temporary directory (caller frees the string; cmt_rmtree removes the directory). */
char *cmt_tmpdir(void);
void cmt_rmtree(const char *path);

#endif
