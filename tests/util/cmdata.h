/* Helpers for the data methods' trainer tests (tests/test_data_algos_train.c): model families on
 * synthetic data — a CIFAR-style ResNet and the MNIST CNN on small images, an MLP on vectors,
 * the tiny GPT-2 on token sequences and a tiny BERT on masked-LM batches — a short fit under
 * given algorithms, fit-twice, and the resumption check of Composer's
 * tests/algorithms/test_algorithm_resumption.py (train saving after every batch, resume from the
 * checkpoint of batch 1, and require the later checkpoints of both runs to be bit for bit the
 * same). Every function aborts the test on failure. */
#ifndef CMDATA_H
#define CMDATA_H

#include <composer/composer.h>

typedef enum cda_family { CDA_RESNET, CDA_CNN, CDA_MLP, CDA_GPT2, CDA_BERT, CDA_FAMILY_COUNT } cda_family;
const char *cda_family_name(cda_family f);

/* A model and its train data, made fresh (two rigs of one family train identically). Images:
 * "image" f32 (3, 16, 16) for the ResNet (1, 12, 12 for the CNN), or u8 with u8_images; "label"
 * i64 among 4 classes. MLP: "input" f32 (8), "label". GPT-2: "input_ids", "labels" i32 (16).
 * BERT: "input_ids" i32, "attention_mask" i32 (rows padded at the end), "labels" i64 (-100 but for
 * the masked positions), length 16. 8 rows per batch, batches_per_epoch batches per epoch. */
typedef struct cda_rig {
    cda_family family;
    cm_model *model;
    cm_dataset *ds;
    cm_dataloader *dl;
} cda_rig;

typedef struct cda_rig_opts {
    int64_t batches_per_epoch; /* 3 */
    int64_t batch_size;        /* 8 */
    bool u8_images;            /* images as raw u8 pixels (RandAugment, AugMix) */
} cda_rig_opts;
cda_rig_opts cda_rig_opts_default(void);

cda_rig cda_rig_new(cda_family f, const cda_rig_opts *o);
void cda_rig_free(cda_rig *r);

/* Makes the algorithms of one run into out[0..] and returns how many (called once per trainer). */
typedef int (*cda_algos_fn)(cm_algorithm_plugin *out, int cap, void *data);

/* Every image data method at once (7: SelectiveBackprop over the whole run, ProgressiveResizing
 * from the start, ColOut, CutOut, MixUp, CutMix, LabelSmoothing with Composer's defaults), and
 * every token one (2: that SelectiveBackprop, SeqLengthWarmup 4 → 16 tokens over the run). */
int cda_image_methods(cm_algorithm_plugin *out, int cap, void *data);
int cda_token_methods(cm_algorithm_plugin *out, int cap, void *data);

typedef struct cda_run_opts {
    const char *max_duration;  /* "3ba" */
    int64_t microbatch;        /* device_train_microbatch_size; 0 = whole batch */
    cm_precision precision;
    const char *save_folder, *save_interval, *load_path;
    cda_rig_opts rig;
    cm_device device;          /* CPU (0); a GPU: the model moves there after surgery, before the optimizer */
} cda_run_opts;
cda_run_opts cda_run_opts_default(void);

typedef struct cda_run {
    cda_rig rig;
    cm_trainer *tr;
    cm_in_memory_logger *mem;
} cda_run;

/* A trainer (DecoupledSGDW lr 0.05, momentum 0.9; seed 17; run_name "cda") over a new rig. */
cda_run cda_run_new(cda_family f, cda_algos_fn algos, void *data, const cda_run_opts *o);
void cda_run_free(cda_run *r);

/* fit(1ba), then fit to max_duration: both succeed, every logged loss is finite, the weights
 * changed, and the trainer reached max_duration's batches. Returns nothing; aborts on failure. */
void cda_check_fit_twice(cda_family f, cda_algos_fn algos, void *data, const cda_run_opts *o, const char *label);

/* The resumption check: a run of total batches saving after each, a second run loading the first
 * run's checkpoint at batch `resume` and saving after each; every checkpoint after `resume` must
 * match (files byte for byte; manifests equal but for "created", the wall-clock times and the
 * manifest checksum). The weights at `resume` and at `total` must differ. */
void cda_check_resumption(cda_family f, cda_algos_fn algos, void *data, const cda_run_opts *o, int64_t total,
                          int64_t resume, const char *label);

/* Both runs bitwise equal in weights (e.g. an algorithm that must not change anything). */
float *cda_params(cm_model *m, int64_t *n);

#endif
