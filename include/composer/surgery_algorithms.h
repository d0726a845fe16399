/*
 * composer/surgery_algorithms.h — Composer's model-surgery methods: each as a plain function over
 * a module tree (the functional form, usable without a trainer) and as an algorithm plugin with
 * Composer's class name, argument names and defaults (a config struct and _default()), plus the
 * registry that makes them by name — from YAML (`algorithms: {blurpool: {min_channels: 16}}`)
 * and from a checkpoint that names them.
 *
 * Surgery runs on INIT, before the optimizer exists: the trainer fires INIT before it makes its
 * optimizer and locks the model (composer/trainer.h), the methods replace or retune modules
 * (cm_module_replace), and the flat parameter buffers are re-packed. Methods that add layers draw
 * their initial weights from Philox (seed, hash(the layer's path)), with the trainer's seed.
 * Every method is idempotent: applying it to a model it was already applied to changes nothing
 * (so a model may be prepared first, see cm_trainer_prepare_model). A method given a model with
 * none of the modules it changes fails with CM_ERR_UNSUPPORTED naming what it looked for (Composer
 * warns and goes on).
 *
 * When an optimizer or data parallelism is made before the trainer (the `composer` CLI does, and
 * so may a program), their spans point into the flat buffers that surgery would re-pack: call
 * cm_trainer_prepare_model(&cfg) first (it runs the surgery of cfg's algorithms and the surgery a
 * checkpoint to load requires), then make them, then cm_trainer_new(&cfg).
 *
 * Required on load (Composer's required_on_load): a checkpoint lists the algorithms it was trained
 * with and the arguments of those that change the model's structure. Loading it (load_path,
 * autoresume) re-creates and applies the ones the trainer was not given, before any weight is
 * read, with Composer's warnings and errors (see cm_trainer_new). These are Alibi, BlurPool,
 * Factorize, GatedLinearUnits, GhostBatchNorm, GyroDropout, LowPrecisionGroupNorm,
 * LowPrecisionLayerNorm, NoOpModel, SqueezeExcite and StochasticDepth (Composer's list), and
 * WeightStandardization (see its section). ChannelsLast and FusedLayerNorm change no numbers.
 *
 * The methods and the differences from Composer are summed up in docs/SURGERY.md.
 *
 *     cm_blurpool_config bc = cm_blurpool_config_default();     // Composer's defaults
 *     cm_algorithm_plugin algs[2];
 *     cm_blurpool_new(&bc, &algs[0]);
 *     cm_algorithm_new_from_json("SqueezeExcite", "{\"min_channels\": 64}", &algs[1]);
 *     cfg.algorithms = algs; cfg.n_algorithms = 2;               // applied on INIT
 *
 *     int64_t n_conv, n_pool;                                    // or by hand, no trainer:
 *     cm_apply_blurpool(cm_model_module(model), &bc, &n_conv, &n_pool);
 *
 * Threading: the plugins belong to their trainer's thread; the functional forms change the tree
 * they are given (one thread at a time, as the tree); the registry functions are thread-safe.
 */
#ifndef COMPOSER_SURGERY_ALGORITHMS_H
#define COMPOSER_SURGERY_ALGORITHMS_H

#include <composer/trainer.h>

#ifdef __cplusplus
extern "C" {
#endif

/* =============================================================================================
 * The registry
 * =========================================================================================== */

/* How an argument is written (in YAML and in a checkpoint's JSON): a bool, an integer, a real, one
 * of a list of names, or a Time string ("0.25dur", "100ba"; a bare number is a fraction of the
 * run, as Composer's float). */
typedef enum cm_algo_arg_kind {
    CM_ALGO_ARG_BOOL = 0,
    CM_ALGO_ARG_INT,
    CM_ALGO_ARG_REAL,
    CM_ALGO_ARG_CHOICE,
    CM_ALGO_ARG_TIME,
} cm_algo_arg_kind;

/* One constructor argument, by Composer's name. */
typedef struct cm_algo_arg {
    const char *name;            /* "min_channels" */
    cm_algo_arg_kind kind;
    const char *def;             /* the default as text ("16", "true", "block", "0dur", "null");
                                    NULL: required */
    const char *const *choices;  /* CHOICE: the names */
    int n_choices;
} cm_algo_arg;

/* One method of this header. Static storage. */
typedef struct cm_algorithm_info {
    const char *name;            /* Composer's class name: "BlurPool" (the plugin's vtable name) */
    const char *key;             /* composer.algorithms' registry name: "blurpool" (YAML) */
    bool required_on_load;       /* Composer's Algorithm.required_on_load() */
    int n_args;
} cm_algorithm_info;

int cm_algorithm_info_count(void);
const cm_algorithm_info *cm_algorithm_info_at(int i); /* NULL out of range */
/* Argument i of a method (constructor order); NULL out of range or for an info not from here. */
const cm_algo_arg *cm_algorithm_info_arg(const cm_algorithm_info *info, int i);
/* By class name or registry key (exact); NULL when unknown. */
const cm_algorithm_info *cm_algorithm_info_find(const char *name);
/* The method a plugin is (by its vtable); NULL for other plugins. */
const cm_algorithm_info *cm_algorithm_info_of(const cm_algorithm_i *vt);

/* Makes a method by class name or key from its arguments as a JSON object (NULL or "{}": the
 * defaults; JSON null for an argument: its default). Errors: CM_ERR_NOT_FOUND (unknown name: the
 * closest and the list), CM_ERR_FORMAT (not a JSON object), CM_ERR_INVALID_ARG (an unknown
 * argument with the closest valid one, a value of the wrong kind or out of range, a required
 * argument missing — each named), CM_ERR_OOM. */
cm_status cm_algorithm_new_from_json(const char *name, const char *json, cm_algorithm_plugin *out);

/* The arguments of a live plugin of this header as a JSON object, every argument written
 * (Composer's repr, as checkpoints record it) into buf (cap bytes, NUL-terminated); returns the
 * length needed without the NUL, as snprintf; 0 (and "" in buf) for other plugins. */
size_t cm_algorithm_hparams_json(cm_algorithm_plugin p, char *buf, size_t cap);

/* Runs, on cfg->model and before anything else holds its flat buffers, the model surgery that
 * cm_trainer_new(cfg) would run: the INIT of cfg->algorithms that are methods of this header (in
 * the engine's order, with cfg->seed and cfg->precision), then the required-on-load methods of the
 * checkpoint cfg would load (autoresume, else load_path) that cfg does not name, unless excluded by
 * load_exclude_algorithms. Nothing is registered or kept: cm_trainer_new(cfg) afterwards applies
 * the same methods again, which then change nothing (the required-on-load warnings are said then,
 * once, not here). The model must be finalized and not locked.
 * Errors: CM_ERR_INVALID_ARG (NULL cfg or model), CM_ERR_STATE (the model is locked: make the
 * optimizer and data parallelism after this call), the methods' errors, the checkpoint's errors
 * (a missing load_path: CM_ERR_NOT_FOUND), the required-on-load errors of cm_trainer_new. Not
 * collective: each rank runs it on its own model. */
cm_status cm_trainer_prepare_model(const cm_trainer_config *cfg);

/* ---- Weights files that record their surgery ----
 * Weights written after surgery load only into a model with the same surgery, and some load into
 * a plain model as well and give other numbers there (ALiBi's: the same tensors, another
 * attention). So the weights files written from a trained model — the run folder's
 * model.safetensors of `composer train`, `composer ckpt export` (cm_checkpoint_export_model) —
 * record the required-on-load methods the model was trained with in their "__metadata__", under
 * CM_SURGERY_METADATA_KEY, as a checkpoint's manifest lists them: a JSON array
 * [{"name": "Alibi", "hparams": {...}}, ...]. A model without such surgery writes no key (the
 * file is byte-for-byte what it was). `composer eval`, `generate` and train's `load_path: X.safetensors`
 * re-apply what a file records before its weights load (cm_algorithms_add_recorded). */
#define CM_SURGERY_METADATA_KEY "composer_required_on_load"

/* The required-on-load methods among e's algorithms (registration order: the trainer's own, then
 * those a checkpoint made it add) as that JSON array in *out (free with cm_free), or *out NULL when
 * there are none. Errors: CM_ERR_INVALID_ARG (NULL e or out), CM_ERR_INTERNAL (a method's
 * arguments are not JSON), CM_ERR_OOM. */
cm_status cm_engine_required_on_load_json(const cm_engine *e, char **out);

/* Appends to algs[0 .. *n) the required-on-load methods `json` (such an array, read from `source`,
 * named in messages) lists and no entry of algs is (by class name), each made from its recorded
 * arguments and announced with Composer's warning ("Automatically adding required_on_load
 * algorithm ..."); methods matching a pattern of `exclude` (load_exclude_algorithms, cm_name_match)
 * are left out, said at INFO. A method algs has with other arguments stays as given, with
 * Composer's warning about the discrepancy; one that cannot be made from its record (unknown
 * to this version) is warned about and skipped, as Composer does. The caller owns the appended
 * plugins. json NULL or "" adds nothing. n_added may be NULL.
 * Errors: CM_ERR_INVALID_ARG (NULL algs or n, *n outside [0, cap], more than cap entries in all:
 * nothing appended), CM_ERR_FORMAT (json is not an array of {"name", "hparams"} objects, naming
 * source), CM_ERR_OOM. */
cm_status cm_algorithms_add_recorded(const char *json, const char *source, const char *const *exclude, int n_exclude,
                                     cm_algorithm_plugin *algs, int *n, int cap, int *n_added);

/* =============================================================================================
 * BlurPool (Zhang 2019; Composer's BlurPool, "blurpool"): anti-aliasing before subsampling
 * =========================================================================================== */

/* Strided Conv2d layers with at least min_channels input channels become BlurConv2d (child
 * "conv", persistent buffer "blur_filter" (C, 1, 3, 3)); every MaxPool2d becomes BlurMaxPool2d
 * (buffer "filt2d" (1, 1, 3, 3)). The filter is [1 2 1; 2 4 2; 1 2 1] / 16 per channel with
 * "same" padding. blur_first: blur the input at stride 1, then the convolution with its stride;
 * false: the convolution at stride 1, then the blur with the stride (4× the convolution's work
 * for stride 2, as the paper). A BlurMaxPool2d takes the max at stride 1, then blurs with the
 * pool's stride. Required on load. */
typedef struct cm_blurpool_config {
    bool replace_convs;    /* true */
    bool replace_maxpools; /* true */
    bool blur_first;       /* true */
    int64_t min_channels;  /* 16: convolutions with fewer input channels (a stem) are left alone */
} cm_blurpool_config;

cm_blurpool_config cm_blurpool_config_default(void);
/* The algorithm (INIT). Errors: CM_ERR_INVALID_ARG (both replace_* false, min_channels < 0),
 * CM_ERR_OOM. On INIT it logs the hyperparameters blurpool/num_blurconv_layers and
 * blurpool/num_blurpool_layers. */
cm_status cm_blurpool_new(const cm_blurpool_config *cfg, cm_algorithm_plugin *out);
/* The surgery on a model's root; *n_blurconv / *n_blurpool (may be NULL) get the layers added.
 * Errors: the config's; CM_ERR_STATE (locked); CM_ERR_UNSUPPORTED (nothing to blur, naming what
 * it looked for; a model blurred already is left as it is); CM_ERR_OOM. */
cm_status cm_apply_blurpool(cm_module *root, const cm_blurpool_config *cfg, int64_t *n_blurconv, int64_t *n_blurpool);

/* The math as ops (recorded on the tape, differentiable in x; NULL with the error on the tape):
 * blur_2d: x (N, C, H, W) (or (N, H, W, C) with channels_last) filtered per channel by filter
 * ((C or 1, 1, kh, kw), odd kh and kw; NULL: the 3×3 filter above) with padding kh/2, kw/2 and
 * the stride; a map smaller than the filter is returned as it is (Composer's blur_2d).
 * out_bf16: a bf16 convolution writes a bf16 result (cm_conv2d_opts.out_bf16).
 * blurmax_pool2d: max pooling with opts at stride 1, then blur_2d with opts' stride (equal strides
 * only). cm_blur_filter_default writes the 9 filter values. */
cm_tensor *cm_blur_2d(cm_tape *tp, cm_tensor *x, cm_tensor *filter, int stride, bool channels_last, bool out_bf16);
cm_tensor *cm_blurmax_pool2d(cm_tape *tp, cm_tensor *x, const cm_pool2d_opts *opts, cm_tensor *filter);
void cm_blur_filter_default(float *out);

/* =============================================================================================
 * Alibi (Press et al. 2021; Composer's Alibi, "alibi"): attention with linear biases
 * =========================================================================================== */

/* Every GPT2Attention and BertSelfAttention adds -slope_h·|i - j| to its scores
 * (cm_nn_attention_set_alibi; slopes as Press et al., cm_nn_alibi_slopes), and the position
 * embeddings (GPT2Model.wpe, BertEmbeddings.position_embeddings) become zero, frozen Embeddings of
 * max_sequence_length rows — Composer's zero_and_freeze_expand_position_embeddings, which keeps
 * the state names — so the model takes sequences up to max_sequence_length. Composer's GPT-2 form
 * adds slope_h·j under the causal mask: the same probabilities (a constant per query row). The
 * GPT-2 generation's KV cache adds no bias, so generation recomputes the context each step.
 * Required on load. */
typedef struct cm_alibi_config {
    int64_t max_sequence_length;          /* required (>= 1) */
    double train_sequence_length_scaling; /* 0.25 (Composer's default); in (0, 1]: on
                                             AFTER_DATALOADER every training batch field (B, T, ...)
                                             is reshaped to (int(B / s), int(T · s), ...) — shorter
                                             rows, the same tokens; evaluation is not reshaped.
                                             Sizes that do not reshape exactly are CM_ERR_SHAPE. The
                                             rows' dataset indices become -1 (they mix samples) */
} cm_alibi_config;

cm_alibi_config cm_alibi_config_default(void); /* max_sequence_length 0 (must be set), scaling 0.25 */
/* The algorithm ("Alibi", INIT; AFTER_DATALOADER when the scaling is not 1, logging
 * alibi/train_seq_len and alibi/train_bs). Errors: CM_ERR_INVALID_ARG (max_sequence_length < 1,
 * scaling outside (0, 1]), CM_ERR_OOM. */
cm_status cm_alibi_new(const cm_alibi_config *cfg, cm_algorithm_plugin *out);
/* The surgery; *n_changed (may be NULL) gets the attention modules switched plus the embeddings
 * replaced (0 when applied already). Errors: CM_ERR_INVALID_ARG, CM_ERR_STATE (an embedding to
 * replace in a locked model), CM_ERR_UNSUPPORTED (no GPT2Attention or BertSelfAttention, naming
 * what it looked for), CM_ERR_OOM. */
cm_status cm_apply_alibi(cm_module *root, int64_t max_sequence_length, int64_t *n_changed);
/* The slopes (n_heads) and the bias (n_heads, T, T): bias[h][i][j] = -slope_h·|i - j| (heads past
 * 1024 are not written). */
void cm_alibi_slopes(int64_t n_heads, float *slopes);
void cm_alibi_bias(int64_t n_heads, int64_t T, float *bias);

/* =============================================================================================
 * ChannelsLast (Composer's ChannelsLast, "channels_last")
 * =========================================================================================== */

/* The model's convolutional activations in (N, H, W, C): the zoo's ResNet and MnistCNN networks
 * switch their layout (cm_resnet_set_channels_last, cm_cnn_set_channels_last), with the layers
 * other surgery put in them. No parameter changes. The zoo's ResNets are channels-last already by
 * default (cm_resnet_config.channels_last). Not required on load (weights keep their layout). */
cm_status cm_channels_last_new(cm_algorithm_plugin *out);
/* *n_changed (may be NULL): networks switched (0 when they were channels-last already). Errors:
 * CM_ERR_INVALID_ARG (NULL), CM_ERR_UNSUPPORTED (no ResNet or MnistCNN, naming what it looked
 * for). */
cm_status cm_apply_channels_last(cm_module *root, int64_t *n_changed);

/* =============================================================================================
 * StochasticDepth (Huang et al. 2016; Composer's StochasticDepth, "stochastic_depth")
 * =========================================================================================== */

typedef enum cm_stochastic_depth_target {
    CM_SD_RESNET_BOTTLENECK = 0, /* "ResNetBottleneck" (Composer's only target): Bottleneck blocks */
    CM_SD_RESNET_BASIC_BLOCK = 1, /* "ResNetBasicBlock": BasicBlock (ResNet-18/34, the CIFAR ResNets) */
} cm_stochastic_depth_target;
typedef enum cm_stochastic_method { CM_STOCHASTIC_BLOCK = 0, CM_STOCHASTIC_SAMPLE = 1 } cm_stochastic_method;
typedef enum cm_drop_distribution { CM_DROP_UNIFORM = 0, CM_DROP_LINEAR = 1 } cm_drop_distribution;

/* The target blocks drop their residual branch while training (cm_resnet_block_set_drop: block
 * mode skips the whole branch of a forward, sample mode the branch of single rows; eval scales the
 * branch by 1 - rate). Block i of n (model order) gets drop_rate·(i+1)/n with the linear
 * distribution, drop_rate with the uniform one. With a drop_warmup the rates grow linearly from 0
 * over that time (set on every BATCH_START; logged as stochastic_depth/drop_rate) — Composer then
 * leaves them at the last warmup value, just under drop_rate; here they reach drop_rate. The draws
 * are keyed by (seed, block, batch): the same with microbatching and after a resume (Composer marks
 * its resumption test xfail for this method). Required on load. */
typedef struct cm_stochastic_depth_config {
    int target_layer_name; /* a cm_stochastic_depth_target; required (-1 in the default) */
    int stochastic_method; /* a cm_stochastic_method: block */
    double drop_rate;      /* 0.2, in [0, 1] */
    int drop_distribution; /* a cm_drop_distribution: linear */
    cm_time drop_warmup;   /* 0dur: none; in dur, ep, ba, sp or tok; not with sample */
} cm_stochastic_depth_config;

cm_stochastic_depth_config cm_stochastic_depth_config_default(void);
/* The algorithm ("StochasticDepth": INIT, and BATCH_START with a warmup). Errors:
 * CM_ERR_INVALID_ARG (no target, a bad enum, drop_rate outside [0, 1], a warmup in another unit
 * or with sample), CM_ERR_OOM. */
cm_status cm_stochastic_depth_new(const cm_stochastic_depth_config *cfg, cm_algorithm_plugin *out);
/* The surgery; *n_blocks (may be NULL) gets the target blocks. Seed the model afterwards
 * (cm_module_set_seed; the trainer does). Errors: bad arguments (CM_ERR_INVALID_ARG),
 * CM_ERR_STATE (locked), CM_ERR_UNSUPPORTED (no target block, naming the type it looked for). */
cm_status cm_apply_stochastic_depth(cm_module *root, cm_stochastic_depth_target target, cm_stochastic_method method,
                                    double drop_rate, cm_drop_distribution dist, int64_t *n_blocks);
/* Sets the rates of blocks that have stochastic depth (the warmup's update). Works on a locked
 * model. Errors: CM_ERR_INVALID_ARG, CM_ERR_STATE (target blocks without stochastic depth). */
cm_status cm_stochastic_depth_set_rate(cm_module *root, cm_stochastic_depth_target target, double drop_rate,
                                       cm_drop_distribution dist, int64_t *n_blocks);

/* =============================================================================================
 * SqueezeExcite (Hu et al. 2018; Composer's SqueezeExcite, "squeeze_excite")
 * =========================================================================================== */

/* Each Conv2d with at least min_channels input and output channels becomes a SqueezeExciteConv2d
 * {conv: the convolution, se: SqueezeExcite2d}: out = y · sigmoid(W2·relu(W1·mean_hw(y))) with
 * y = conv(x), W1 (L, C) and W2 (C, L) bias-free Linears under se.pool_and_mlp.2 / .4 (Composer's
 * names), initialised as PyTorch's Linear from (seed, hash(path)). L = latent_channels when it is
 * at least 1, else latent_channels·C (truncated, as Composer). Required on load. */
typedef struct cm_squeeze_excite_config {
    double latent_channels; /* 64 */
    int64_t min_channels;   /* 128 */
} cm_squeeze_excite_config;

cm_squeeze_excite_config cm_squeeze_excite_config_default(void);
cm_status cm_squeeze_excite_new(const cm_squeeze_excite_config *cfg, cm_algorithm_plugin *out);
/* *n_added (may be NULL): SqueezeExcite layers added. Errors: CM_ERR_INVALID_ARG (latent_channels
 * <= 0, min_channels < 0, a latent size below 1), CM_ERR_STATE (locked), CM_ERR_UNSUPPORTED (no
 * wide enough Conv2d, naming the rule), CM_ERR_OOM. */
cm_status cm_apply_squeeze_excite(cm_module *root, const cm_squeeze_excite_config *cfg, uint64_t seed,
                                  int64_t *n_added);
/* The module alone (type "SqueezeExcite2d"): num_features channels in the layout of channels_last;
 * rng NULL leaves the Linears zero. */
cm_status cm_squeeze_excite2d_new(int64_t num_features, double latent_channels, bool channels_last, cm_rng *rng,
                                  cm_module **out);
int64_t cm_squeeze_excite_latent(double latent_channels, int64_t num_features);

/* =============================================================================================
 * GhostBatchNorm (Hoffer et al. 2017; Composer's GhostBatchNorm, "ghost_batchnorm")
 * =========================================================================================== */

/* Every BatchNorm2d becomes GhostBatchNorm2d {batchnorm: the original}: in training the batch (a
 * microbatch, on this rank) is cut by torch.chunk into ceil(B / ghost_batch_size) chunks, each
 * normalised with its own statistics and updating the running ones with momentum / chunks
 * (num_batches_tracked counts every chunk), as Composer's _GhostBatchNorm. A batch with fewer rows
 * than ghost_batch_size is an error in training (Composer also refuses it in eval; here eval uses
 * the running statistics, which chunks do not change). Required on load. */
typedef struct cm_ghost_batchnorm_config {
    int64_t ghost_batch_size; /* 32 */
} cm_ghost_batchnorm_config;

cm_ghost_batchnorm_config cm_ghost_batchnorm_config_default(void);
cm_status cm_ghost_batchnorm_new(const cm_ghost_batchnorm_config *cfg, cm_algorithm_plugin *out);
/* Errors: CM_ERR_INVALID_ARG (ghost_batch_size < 1), CM_ERR_STATE (locked), CM_ERR_UNSUPPORTED (no
 * BatchNorm2d), CM_ERR_OOM. */
cm_status cm_apply_ghost_batchnorm(cm_module *root, int64_t ghost_batch_size, int64_t *n_replaced);
/* The math as ops: x through the BatchNorm2d module bn as described (in eval: bn as it is). */
cm_tensor *cm_ghost_batch_norm(cm_tape *tp, cm_module *bn, cm_tensor *x, int64_t ghost_batch_size);

/* =============================================================================================
 * LowPrecisionLayerNorm / LowPrecisionGroupNorm (Composer's, "low_precision_layernorm",
 * "low_precision_groupnorm") and FusedLayerNorm ("fused_layernorm")
 * =========================================================================================== */

/* Under amp_bf16 every LayerNorm (GroupNorm) computes on bf16 values (cm_nn_norm_set_low_precision:
 * x, weight and bias rounded to bf16, the result rounded to bf16, as Composer's LPLayerNorm under
 * autocast; the kernel is f32 here, so it gives PyTorch's numbers, not its speed). With another
 * precision it warns and changes nothing (Composer's NoEffectWarning). No parameter changes, so
 * apply_at may be init, before_load or after_load. The engine runs LowPrecisionLayerNorm after
 * every other algorithm of an event (after GatedLinearUnits adds its LayerNorms). Required on
 * load. */
typedef struct cm_low_precision_norm_config {
    int apply_at; /* 0 init (default), 1 before_load, 2 after_load */
} cm_low_precision_norm_config;

cm_low_precision_norm_config cm_low_precision_norm_config_default(void);
cm_status cm_low_precision_layernorm_new(const cm_low_precision_norm_config *cfg, cm_algorithm_plugin *out);
cm_status cm_low_precision_groupnorm_new(const cm_low_precision_norm_config *cfg, cm_algorithm_plugin *out);
/* *n_changed: norms switched. Errors: CM_ERR_INVALID_ARG (NULL), CM_ERR_UNSUPPORTED (no LayerNorm /
 * GroupNorm, with an amp precision). */
cm_status cm_apply_low_precision_layernorm(cm_module *root, cm_precision precision, int64_t *n_changed);
cm_status cm_apply_low_precision_groupnorm(cm_module *root, cm_precision precision, int64_t *n_changed);

/* FusedLayerNorm (Composer's, replacing LayerNorms with Apex's fused kernel): accepted and a
 * no-op — every LayerNorm here already is the fused kernel (cm_layer_norm). It logs that once. */
cm_status cm_fused_layernorm_new(cm_algorithm_plugin *out);

/* =============================================================================================
 * WeightStandardization (Qiao et al. 2019; Composer's WeightStandardization,
 * "weight_standardization")
 * =========================================================================================== */

/* Every Conv2d but the last n_last_layers_ignore (model order) convolves with its weight
 * standardized per output channel, (W - mean) / sqrt(var + 1e-10) (cm_nn_standardize_weight):
 * switched in place (cm_nn_conv2d_set_weight_standardization), the parameter keeps its name.
 * Composer's parametrization renames the weight, so there a checkpoint cannot load without the
 * method; here it is required on load instead (Composer does not mark it so). */
typedef struct cm_weight_standardization_config {
    int64_t n_last_layers_ignore; /* 0 */
} cm_weight_standardization_config;

cm_weight_standardization_config cm_weight_standardization_config_default(void);
cm_status cm_weight_standardization_new(const cm_weight_standardization_config *cfg, cm_algorithm_plugin *out);
/* *n_standardized: the Conv2d layers standardized. Errors: CM_ERR_INVALID_ARG (a negative count),
 * CM_ERR_UNSUPPORTED (no Conv2d). Works on a locked model (nothing is re-packed). */
cm_status cm_apply_weight_standardization(cm_module *root, int64_t n_last_layers_ignore, int64_t *n_standardized);

/* =============================================================================================
 * GatedLinearUnits (Shazeer 2020; Composer's GatedLinearUnits, "gated_linear_units")
 * =========================================================================================== */

/* BERT's feed-forward blocks become gated linear units, as Composer's surgery: every
 * BertIntermediate becomes an Identity and every BertOutput a BERTGatedFFOutput {gated_layer
 * Linear(C, F), non_gated_layer Linear(C, F), wo Linear(F, C), dropout, layernorm LayerNorm(C)}:
 * layernorm(wo(dropout(act(gated_layer(h)) · non_gated_layer(h))) + h). New layers: PyTorch's
 * default init from (seed, hash(path)); dropout p and LayerNorm eps from the replaced BertOutput.
 * act_fn: the BertIntermediate's activation when not set (Composer's act_fn=None), an error when
 * they differ. Required on load. */
typedef struct cm_gated_linear_units_config {
    int act_fn;                /* -1 (null: the model's), or 0 relu, 1 gelu, 2 gelu_tanh, 3 silu, 4 tanh,
                                  5 sigmoid, 6 identity (the YAML/JSON names) */
    bool gated_layer_bias;     /* false */
    bool non_gated_layer_bias; /* false */
} cm_gated_linear_units_config;

cm_gated_linear_units_config cm_gated_linear_units_config_default(void);
cm_status cm_gated_linear_units_new(const cm_gated_linear_units_config *cfg, cm_algorithm_plugin *out);
/* *n_replaced: modules replaced (two per layer). Errors: CM_ERR_INVALID_ARG (a bad act_fn; mixed
 * activations without act_fn), CM_ERR_STATE (locked), CM_ERR_UNSUPPORTED (no BertIntermediate /
 * BertOutput), CM_ERR_OOM. */
cm_status cm_apply_gated_linear_units(cm_module *root, const cm_gated_linear_units_config *cfg, uint64_t seed,
                                      int64_t *n_replaced);

/* =============================================================================================
 * Factorize (Composer's Factorize, "factorize")
 * =========================================================================================== */

/* Conv2d layers (groups 1) with min(in, out) >= min_channels become FactorizedConv2d {module0:
 * Conv2d(in, k, its kernel, stride and padding, no bias), module1: Conv2d(k, out, 1×1, bias)}, and
 * Linear layers with min(in, out) >= min_features FactorizedLinear {module0: Linear(in, k, no
 * bias), module1: Linear(k, out)}, when the latent size k (latent_* if >= 1, else that fraction of
 * min(in, out), at least 1) is at most Composer's break-even rank ceil(fan_in·out / (fan_in + out)
 * - 1) with fan_in = in·kh·kw. Composer re-initialises the pair randomly; here it starts as the
 * best rank-k approximation of the original (cm_factorize_svd of the weight as (out, fan_in);
 * module1 takes the original bias), so nothing is lost that rank k can keep. GPT-2's projections
 * are Conv1D, which Composer does not factorize either. Required on load. */
typedef struct cm_factorize_config {
    bool factorize_convs;   /* true */
    bool factorize_linears; /* true */
    int64_t min_channels;   /* 256 */
    double latent_channels; /* 0.25 */
    int64_t min_features;   /* 256 */
    double latent_features; /* 128 */
} cm_factorize_config;

cm_factorize_config cm_factorize_config_default(void);
cm_status cm_factorize_new(const cm_factorize_config *cfg, cm_algorithm_plugin *out);
/* *n_convs / *n_linears: layers factorized. Errors: CM_ERR_INVALID_ARG (both factorize_* false, a
 * size <= 0), CM_ERR_STATE (locked), CM_ERR_UNSUPPORTED (nothing wide enough, naming the rules and
 * what the model has), CM_ERR_INTERNAL (LAPACK failed), CM_ERR_OOM. */
cm_status cm_apply_factorization(cm_module *root, const cm_factorize_config *cfg, int64_t *n_convs, int64_t *n_linears);
/* The best rank-k factors of w (rows, cols), row-major: w ≈ p (rows, k) · q (k, cols) with
 * p = U_k √S_k and q = √S_k V_kᵀ (Composer's _svd_initialize); s_out (min(rows, cols)), if not NULL,
 * gets every singular value, largest first. LAPACK's dgesdd in double. Errors: CM_ERR_INVALID_ARG
 * (k outside [1, min(rows, cols)]), CM_ERR_UNSUPPORTED (over 2^30 elements), CM_ERR_INTERNAL,
 * CM_ERR_OOM. */
cm_status cm_factorize_svd(const float *w, int64_t rows, int64_t cols, int64_t k, float *p, float *q, float *s_out);
/* Composer's _clean_latent_size and _max_rank_with_possible_speedup. */
int64_t cm_factorize_latent_size(double latent, int64_t in, int64_t out);
int64_t cm_factorize_max_rank(int64_t in, int64_t out, int64_t kernel_numel);

/* =============================================================================================
 * GyroDropout (Composer's GyroDropout, "gyro_dropout")
 * =========================================================================================== */

/* Every Dropout becomes a GyroDropoutLayer (see gyro_dropout.c for the math): sigma preselected
 * feature masks, tau of them picked every iter_num = int(iters_per_epoch · max_epoch / sigma) · tau
 * steps, one per equal group of rows, kept features scaled by 1/(1-p). Inputs (B, F) with B a
 * multiple of tau. The masks are pure functions of (seed, layer, index) and the step is the
 * trainer's batch count, so runs resume exactly and microbatches see their rows' masks (Composer
 * draws from torch's global generator and counts forward calls; its resumption test is xfail).
 * The surgery runs on INIT (Composer's on FIT_START); FIT_START sets the schedule from the train
 * loader's length and max_duration (ep, or ba rounded up to epochs; Composer reads max_duration's
 * number as epochs whatever its unit); BATCH_START sets the step. Required on load. */
typedef struct cm_gyro_dropout_config {
    double p;      /* 0.5, in [0, 1) */
    int64_t sigma; /* 256 */
    int64_t tau;   /* 16 */
} cm_gyro_dropout_config;

cm_gyro_dropout_config cm_gyro_dropout_config_default(void);
cm_status cm_gyro_dropout_new(const cm_gyro_dropout_config *cfg, cm_algorithm_plugin *out);
/* The surgery (masks from seed). Errors: CM_ERR_INVALID_ARG, CM_ERR_STATE (locked),
 * CM_ERR_UNSUPPORTED (no Dropout). */
cm_status cm_apply_gyro_dropout(cm_module *root, const cm_gyro_dropout_config *cfg, uint64_t seed, int64_t *n_replaced);
/* The schedule and the step of every GyroDropoutLayer under root (by hand, without the
 * algorithm). Errors: CM_ERR_INVALID_ARG, CM_ERR_STATE (no GyroDropoutLayer). */
cm_status cm_gyro_dropout_set_schedule(cm_module *root, int64_t iters_per_epoch, int64_t max_epoch);
cm_status cm_gyro_dropout_set_step(cm_module *root, int64_t step);

/* =============================================================================================
 * NoOpModel (Composer's NoOpModel, "no_op_model")
 * =========================================================================================== */

/* On INIT the trainer's model is replaced (cm_state_set_model) by a NoOpModelClass: one
 * parameter "weights" = [1.5]; forward = the batch's target (the field "label", "labels" or
 * "target", else the last field; as f32) × weights; loss = mean squared error against the target;
 * eval_forward = the target; no metrics. For measuring everything but the model. The plugin owns
 * the new model. With an optimizer in the config it is an error (made over the old parameters).
 * Required on load. */
cm_status cm_no_op_model_new(cm_algorithm_plugin *out);
/* The NoOpModelClass model alone (caller frees it with cm_model_free). */
cm_status cm_no_op_model_new_model(cm_model **out);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_SURGERY_ALGORITHMS_H */
