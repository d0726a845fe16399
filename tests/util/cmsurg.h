/* Helpers for the surgery-algorithm tests: small models of every family the methods apply to, with
 * synthetic data, a trainer over them, and the checkpoint comparison of Composer's
 * test_algorithm_resumption.py (model, optimizer and the run's RNG/timestamp, bit for bit). Every
 * function aborts the test on failure. */
#ifndef CMSURG_H
#define CMSURG_H

#include <composer/composer.h>

/* The model families. */
typedef enum cmt_family {
    CMT_MLP = 0,      /* 8 → 16 → dropout 0.2 → 3 on "input" vectors */
    CMT_CNN,          /* MnistCNN, 1×8×8 images, channels 4/8, NCHW */
    CMT_RESNET,       /* CIFAR stem, basic blocks [1, 1, 1] of widths 4/8/16, NCHW, option-B shortcuts */
    CMT_RESNET_IMNET, /* ImageNet stem (maxpool) and bottleneck blocks [1, 1], widths 4/8, NCHW */
    CMT_GPT2,         /* the "tiny" GPT-2 (dropout 0.1), sequences of 8 tokens */
    CMT_BERT,         /* the test-tiny BERT classifier (dropout 0.1), sequences of 8 tokens */
    CMT_GROUPNORM,    /* Conv2d(1→8) GroupNorm(2, 8) ReLU AdaptiveAvgPool Flatten Linear on 1×8×8 images */
    CMT_FAMILY_COUNT,
} cmt_family;

const char *cmt_family_name(cmt_family f);

/* A fresh model (the same weights for the same family and seed) and a train loader of 4 batches
 * of 8 samples (shuffled with seed 7) over a dataset the caller frees after the loader. */
typedef struct cmt_srig {
    cmt_family family;
    cm_model *model;
    cm_dataset *ds;
    cm_dataloader *dl;
} cmt_srig;

cmt_srig cmt_srig_new(cmt_family f, uint64_t seed);
void cmt_srig_free(cmt_srig *r);

/* Options of cmt_strainer. */
typedef struct cmt_srun {
    const char *max_duration;  /* "3ba" */
    cm_precision precision;    /* fp32 */
    int64_t microbatch;        /* 0: whole batches */
    const char *save_folder;   /* NULL: none; else a checkpoint every batch ("ba{batch}") */
    const char *load_path;     /* NULL */
    const char *const *exclude; /* load_exclude_algorithms */
    int n_exclude;
    bool weights_only;         /* load_weights_only */
    bool own_optimizer;        /* make a DecoupledAdamW over the unit spans before the trainer (false:
                                  the trainer's DecoupledSGDW) */
    bool prepare;              /* with own_optimizer: cm_trainer_prepare_model first */
} cmt_srun;
cmt_srun cmt_srun_default(void);

/* A trainer over rig with algs (taken on success; n may be 0). *opt receives the optimizer made
 * here (or NULL): free it after the trainer. Returns NULL when cm_trainer_new fails (the status
 * in *status, the plugins then still the caller's). */
cm_trainer *cmt_strainer(cmt_srig *rig, cm_algorithm_plugin *algs, int n, const cmt_srun *o, cm_optim **opt,
                        cm_status *status);

/* Checkpoint directories hold the same state: model.safetensors and optimizer.safetensors
 * byte for byte, and the manifests' rng, timestamp (but its wall-clock fields) and algorithms. */
void cmt_assert_ckpts_equal(const char *a, const char *b, const char *label);
/* The two checkpoints' model weights differ (training changed something). */
void cmt_assert_weights_differ(const char *a, const char *b, const char *label);

/* A new empty temporary directory (free the string with free; cmt_rm_rf removes it). */
char *cmt_temp_dir(void);
void cmt_rm_rf(const char *path);

/* Lines logged while capturing (cm_log_msg at WARN and above), for checking warnings. */
void cmt_log_capture_start(void);
const char *cmt_log_capture_text(void); /* everything captured since the start */
void cmt_log_capture_stop(void);

#endif
