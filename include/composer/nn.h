/*
 * composer/nn.h — the module tree, named parameters in flat buffers, model surgery, and layers.
 *
 * A cm_module has a type name ("Linear"), an instance name (its name in its parent: "c_attn"),
 * children, parameters (f32 tensors that train) and buffers (tensors saved with the model but not
 * trained, such as batch norm's running statistics), a train/eval flag and a forward function.
 * Names form dotted paths from the root, equal to PyTorch's state_dict keys for the same tree —
 * the zoo builds trees whose paths are Hugging Face's names (transformer.h.0.attn.c_attn.weight,
 * bert.encoder.layer.0.attention.self.query.weight), so weights move in and out as safetensors.
 *
 * Flat buffers. cm_module_finalize(root) packs every parameter into one flat, contiguous f32
 * buffer per *wrap unit* and gives each unit a mirrored flat gradient buffer: a parameter becomes
 * a span [offset, offset + numel) of its unit's buffer (the cm_tensor keeps its identity; only its
 * memory moves), and its gradient is a view of the same span of the gradient buffer, so backward
 * writes straight into the flat gradient. Optimizers, clipping, all-reduce buckets, sharding and
 * checkpoint I/O then loop over flat spans. A module becomes the root of a unit with
 * cm_module_set_wrap_unit (a transformer block, a ResNet stage, "embeddings", "head"); parameters
 * belong to the unit of their nearest marked ancestor, or to the unit "root".
 *
 * Surgery. cm_module_replace swaps every module that matches a predicate for what a function
 * makes of it, then re-packs the flat buffers. It must run before the optimizer exists: an
 * optimizer calls cm_module_lock when it attaches, and surgery (or re-finalising) on a locked
 * tree fails with CM_ERR_STATE.
 *
 *     cm_rng rng = cm_rng_init(42, 0);
 *     cm_module *mlp, *fc1, *act, *fc2;
 *     cm_nn_sequential_new(&mlp);
 *     cm_nn_linear_new(784, 128, true, &rng, &fc1);
 *     cm_nn_activation_new(CM_ACT_RELU, &act);
 *     cm_nn_linear_new(128, 10, true, &rng, &fc2);
 *     cm_nn_sequential_append(mlp, fc1);                       // "0.weight", "0.bias"
 *     cm_nn_sequential_append(mlp, act);                       // "1" (no parameters)
 *     cm_nn_sequential_append(mlp, fc2);                       // "2.weight", "2.bias"
 *     if (cm_module_finalize(mlp) != CM_OK) fprintf(stderr, "%s\n", cm_last_error());
 *     cm_tensor *logits = cm_module_forward(mlp, tp, x);        // x (B, 784) -> (B, 10)
 *     ...                                                       // loss, cm_tape_backward
 *     const cm_unit_info *u = cm_module_unit(mlp, 0);           // u->params, u->grads: numel floats
 *     cm_module_free(mlp);                                      // frees the children too
 *
 * Forward convention. Every module's forward takes an array of inputs: in[0] is the main input;
 * attention modules and transformer blocks take an optional key padding mask in[1] ((B, S) u8/i32/
 * i64, nonzero = a real token) and an optional additive attention bias in[2] (broadcastable to
 * (B, H, T, S)). Ops chain as in tensor.h: a forward returns NULL and leaves the first error on the
 * tape, prefixed with the path and type of the innermost module that failed.
 *
 * Threading: a module tree belongs to one thread at a time (forward reads it; training-mode and
 * dropout counters change it).
 */
#ifndef COMPOSER_NN_H
#define COMPOSER_NN_H

#include <composer/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cm_module cm_module;

/* ---------------------------------------------------------------------------------------------
 * Writing a module type
 * ------------------------------------------------------------------------------------------- */

#define CM_MODULE_ABI 1

/* A module type. Static storage: modules keep a pointer to it. */
typedef struct cm_module_i {
    int abi;               /* CM_MODULE_ABI */
    const char *type_name; /* "Linear", "GPT2Block", ... (shown in errors and summaries) */
    /* The forward pass: n_in inputs (see the convention above; unused trailing inputs may be
     * NULL). Returns a tape tensor, or NULL with the error on the tape. NULL for containers
     * (ModuleList), whose cm_module_forward is an error. */
    cm_tensor *(*forward)(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in);
    /* Optional: frees the implementation state `self` (children, parameters and buffers are
     * freed by the tree, not here). */
    void (*free_self)(void *self);
    /* Optional: a short description of the configuration for cm_module_summary, e.g.
     * "in=768, out=2304, bias". */
    void (*describe)(const cm_module *m, char *buf, size_t cap);
} cm_module_i;

/* A new module with no name, children, parameters or buffers, in training mode. On success the
 * module owns `self` (vt->free_self frees it in cm_module_free); on failure nothing is taken.
 * Errors: CM_ERR_INVALID_ARG (NULL vt, wrong abi, no type name), CM_ERR_OOM. */
cm_status cm_module_new(const cm_module_i *vt, void *self, cm_module **out);

/* Frees the module, its children (recursively), parameters, buffers and flat buffers. NULL is a
 * no-op. Freeing a module that still has a parent is a caller error (logged, ignored): free the
 * root. */
void cm_module_free(cm_module *m);

void *cm_module_self(const cm_module *m);               /* the implementation state */
const cm_module_i *cm_module_vtable(const cm_module *m);
const char *cm_module_type_name(const cm_module *m);
/* The instance name: the name in the parent ("" for a root). Borrowed; valid while m lives in
 * its parent. */
const char *cm_module_name(const cm_module *m);
cm_module *cm_module_parent(const cm_module *m);        /* NULL for a root */
/* The dotted path from the root ("transformer.h.0.attn"; "" for the root) into buf (always
 * NUL-terminated, truncated if cap is short); returns buf. */
char *cm_module_path(const cm_module *m, char *buf, size_t cap);

/* Adds a parameter called `name` (no dots; unique among m's parameters, buffers and children):
 * a new f32 tensor of zeros that requires grad, owned by m. `slot`, if not NULL, receives the
 * tensor and is updated when the parameter is tied (cm_module_tie_param); the tensor itself keeps
 * its identity when the flat buffers are (re)packed, so pointers to it stay valid. no_decay:
 * the parameter's default no-weight-decay flag (see cm_param_info). Errors: CM_ERR_INVALID_ARG
 * (bad or duplicate name, bad shape), CM_ERR_STATE (m's tree is locked by an optimizer), CM_ERR_OOM.
 * In a finalized tree the new parameter joins the flat buffers at the next cm_module_finalize. */
cm_status cm_module_add_param(cm_module *m, const char *name, int ndim, const int64_t *shape, bool no_decay,
                              cm_tensor **slot);
/* Adds a buffer: a tensor of zeros of any dtype, owned by m, not trained. persistent buffers
 * are part of the state (cm_module_n_buffers lists them for checkpoints and safetensors);
 * non-persistent ones are scratch state (as PyTorch's persistent=False). Errors as
 * cm_module_add_param. */
cm_status cm_module_add_buffer(cm_module *m, const char *name, cm_dtype dt, int ndim, const int64_t *shape,
                               bool persistent, cm_tensor **slot);
/* Adds `child` under `name` (no dots, unique in m). On success m owns child; `slot`, if not NULL,
 * receives child and is updated when surgery replaces it — module implementations keep their
 * children in such slots. A child that was finalized on its own is unpacked (its parameters get
 * their own memory again; gradients are dropped). Errors: CM_ERR_INVALID_ARG (bad or duplicate
 * name, child already has a parent, child is m or an ancestor of m), CM_ERR_STATE (m's tree or
 * child is locked by an optimizer), CM_ERR_OOM. */
cm_status cm_module_add_child(cm_module *m, const char *name, cm_module *child, cm_module **slot);

/* Makes m's parameter `name` share `src`'s tensor (weight tying, e.g. GPT-2's lm_head.weight =
 * transformer.wte.weight): m's own tensor is freed, *slot of the parameter is repointed. The tied
 * parameter is found by cm_module_find_param under both names, but it is packed, counted and
 * listed once, under its owner's name. Shapes must match (CM_ERR_SHAPE). src must live in the same
 * tree as m by the time the tree is finalized (CM_ERR_STATE otherwise). Errors also:
 * CM_ERR_NOT_FOUND (no such parameter), CM_ERR_STATE (finalized tree). */
cm_status cm_module_tie_param(cm_module *m, const char *name, cm_tensor *src);

/* Sets the wrap unit of m and its subtree: unit_name NULL uses m's dotted path at packing time
 * (e.g. "transformer.h.3"); several modules may share a name ("embeddings"). Takes effect at the
 * next cm_module_finalize. Errors: CM_ERR_OOM. */
cm_status cm_module_set_wrap_unit(cm_module *m, const char *unit_name);

/* ---------------------------------------------------------------------------------------------
 * The tree
 * ------------------------------------------------------------------------------------------- */

int cm_module_n_children(const cm_module *m);
cm_module *cm_module_child_at(const cm_module *m, int i);       /* NULL if out of range */
cm_module *cm_module_child(const cm_module *m, const char *name); /* NULL if none */
/* The module at a dotted path below m ("h.0.attn"); "" is m itself. NULL if none. */
cm_module *cm_module_find(const cm_module *m, const char *path);
/* m's own parameter / buffer called `name` (no dots), or NULL. */
cm_tensor *cm_module_param(const cm_module *m, const char *name);
cm_tensor *cm_module_buffer(const cm_module *m, const char *name);
int cm_module_n_own_params(const cm_module *m);
/* m's own i-th parameter (NULL if out of range); *name (if not NULL) gets its short name. */
cm_tensor *cm_module_own_param_at(const cm_module *m, int i, const char **name);
/* The parameter (tied ones included) or buffer at a dotted path below m
 * ("h.0.attn.c_attn.weight"), or NULL. Works before and after finalize. */
cm_tensor *cm_module_find_param(const cm_module *m, const char *path);
cm_tensor *cm_module_find_buffer(const cm_module *m, const char *path);

/* Calls fn on m and every module below it, parents before children, in registration order, with
 * the dotted path relative to m and the depth (0 for m). fn returns false to stop the walk (the
 * function then returns false). fn must not change the tree. */
typedef bool (*cm_module_visit_fn)(cm_module *m, const char *path, int depth, void *data);
bool cm_module_visit(cm_module *m, cm_module_visit_fn fn, void *data);

/* Training mode for m and its whole subtree (dropout active, batch norm uses and updates batch
 * statistics). New modules are in training mode. */
void cm_module_train(cm_module *m, bool on);
bool cm_module_is_training(const cm_module *m);

/* Seeds every Dropout in the subtree: layer i draws from the Philox stream (seed,
 * hash(its dotted path)) and its counter restarts at 0, so masks depend on the seed, the layer's
 * name and how many elements it has dropped before — not on the thread or the rest of the model. */
void cm_module_set_seed(cm_module *m, uint64_t seed);

/* The forward pass: cm_module_forward(m, tp, x) is the one-input form, cm_module_forward_n passes
 * n_in inputs. Returns NULL (and leaves the error on the tape, prefixed "in module <path>
 * (<type>): ") when the module has no forward or the forward fails. NULL tp returns NULL. */
cm_tensor *cm_module_forward(cm_module *m, cm_tape *tp, cm_tensor *x);
cm_tensor *cm_module_forward_n(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in);

/* Activation checkpointing of one module, as Composer's `module._activation_checkpointing`: while
 * on, cm_module_forward of m with gradients on runs m's forward as a checkpointed region
 * (cm_tape_checkpoint): only m's inputs and output are kept, and backward runs m's forward again to
 * differentiate it. Losses and gradients are the same bits as without it. m's forward must meet
 * cm_tape_checkpoint's conditions (the zoo's modules do). Nothing changes with gradients off. */
void cm_module_set_checkpointing(cm_module *m, bool on);
bool cm_module_checkpointing(const cm_module *m);

/* Activation offload of one module (Composer's activation_cpu_offload): while on, cm_module_forward
 * of m with gradients on, on a tape whose device is a GPU, runs m's forward as an offloaded region
 * (cm_tape_offload): what m saves for backward waits in host memory until m's backward. The same
 * bits as without it. A module both checkpointed and offloaded is an error at its forward
 * (CM_ERR_UNSUPPORTED: a checkpointed module keeps only its input, nothing is left to offload). */
void cm_module_set_activation_offload(cm_module *m, bool on);
bool cm_module_activation_offload(const cm_module *m);

/* Which modules a policy checkpoints: those of type `type_name` (cm_module_type_name, compared
 * without case: "GPT2Block", "gpt2block"), and among them — numbered 0, 1, ... in the order
 * cm_module_visit meets them (a transformer's block index) — the ones `blocks` names: NULL or
 * "" for all, else a comma-separated list of block ids and ranges as llm-foundry's
 * activation_checkpointing_target writes them: "first-n", "last-k", "middle-m" (start
 * max(last/2 - m/2, 0), m of them), "range-i-j" ([i, j)), and one of our own, "every-k" (0, k,
 * 2k, ...); ranges are clipped to the blocks there are. */
typedef struct cm_act_ckpt_target {
    const char *type_name;
    const char *blocks;
} cm_act_ckpt_target;

/* Applies an activation checkpointing policy to the tree under root: clears every module's flag
 * (and its activation offload flag), then sets it on the modules the targets name (n targets). n = 0 is the default: the modules that
 * root a wrap unit (cm_module_set_wrap_unit) and whose type roots at least two different units —
 * the transformer blocks of GPT-2 and BERT, the stages of a ResNet — so each repeated unit is one
 * region. *n_marked (may be NULL) gets how many modules were marked. Errors, with nothing
 * changed: CM_ERR_NOT_FOUND (a type no module of the tree has, naming the closest type it has),
 * CM_ERR_INVALID_ARG (a bad blocks element, naming it; a NULL or empty type_name; a module marked
 * both as itself and inside a marked ancestor — each region has one granularity, as llm-foundry
 * requires). */
cm_status cm_module_checkpoint_policy(cm_module *root, const cm_act_ckpt_target *targets, int n, int *n_marked);

/* The same policy for activation offload (Composer's activation_cpu_offload picks its modules as
 * activation checkpointing does): clears every module's checkpointing and offload flags, then sets
 * offload on the modules cm_module_checkpoint_policy would checkpoint. Same arguments and errors. */
cm_status cm_module_activation_offload_policy(cm_module *root, const cm_act_ckpt_target *targets, int n, int *n_marked);

/* A function cm_module_forward(_n) calls after a module's forward succeeded, with its inputs and
 * output (tape tensors, valid until the tape is reset): ActivationMonitor's forward hooks, as
 * PyTorch's register_forward_hook. cm_module_set_forward_hook sets it on m and every module below
 * it now (modules added later have none); NULL fn removes it. The hook must not record on the tape
 * or change the tensors. Modules whose parent calls them without cm_module_forward (fused blocks)
 * are not seen. Not thread-safe with a forward in flight. */
typedef void (*cm_module_forward_hook_fn)(cm_module *m, int n_in, cm_tensor *const *in, cm_tensor *out, void *data);
void cm_module_set_forward_hook(cm_module *m, cm_module_forward_hook_fn fn, void *data);

/* Writes a PyTorch-style tree ("(c_attn): Linear(in=768, out=2304, bias)") into buf, always
 * NUL-terminated; returns the length the full text needs (as snprintf). */
size_t cm_module_summary(const cm_module *m, char *buf, size_t cap);

/* ---------------------------------------------------------------------------------------------
 * Packing, named parameters, units, counting, freezing
 * ------------------------------------------------------------------------------------------- */

/* Packs the tree under `root` (which must have no parent): lists every parameter (own ones
 * first, then children's, in registration order, as PyTorch's named_parameters) and buffer,
 * assigns each parameter a span in its unit's flat buffer, copies the values there, and links a
 * view of the same span of the unit's gradient buffer as its gradient (zeroed). Calling it again
 * (after surgery, or after adding modules) re-packs: values are preserved, gradients are reset to
 * zero. Dropout layers get their RNG stream from their path. Errors: CM_ERR_INVALID_ARG (root has
 * a parent), CM_ERR_STATE (locked by an optimizer; a tied parameter whose owner is not in the
 * tree), CM_ERR_OOM (the tree is unchanged). */
cm_status cm_module_finalize(cm_module *root);
bool cm_module_is_finalized(const cm_module *root);
/* A number that changes whenever the flat buffers of root's tree are (re-)packed or unpacked
 * (cm_module_finalize, surgery): spans taken from cm_module_unit (an optimizer's, say) stay valid
 * while it stays the same. 0 for a tree never finalized. */
uint64_t cm_module_layout_version(const cm_module *root);

/* Moves a finalized model's parameters, gradients and buffers (running statistics, counters, ...)
 * to device `dev`, keeping every tensor's identity (pointers to parameters stay valid; their data
 * and device change) and the values. Afterwards cm_unit_info.params/grads are device memory and
 * forward passes must be given inputs on `dev` (the trainer moves batches itself). Move the model
 * after finalize and surgery and before creating an optimizer or a trainer: re-finalizing and
 * surgery need the model on the CPU. Errors: CM_ERR_STATE (not finalized, or locked by an
 * optimizer), cm_device_check's, CM_ERR_OOM (the model is unchanged). */
cm_status cm_module_to_device(cm_module *root, cm_device dev);
/* The device of a finalized model's parameters (CM_DEVICE_CPU otherwise). */
cm_device cm_module_device(const cm_module *root);

/* One wrap unit: `numel` floats of parameters and of gradients, contiguous. Borrowed from the
 * root; valid until the next finalize/surgery or cm_module_free. */
typedef struct cm_unit_info {
    const char *name;    /* "transformer.h.0", "embeddings", "root" */
    float *params;       /* (numel) */
    float *grads;        /* (numel), mirrors params */
    int64_t numel;
    int64_t n_params;    /* parameters in this unit */
    cm_device device;    /* where params and grads live (cm_module_to_device) */
} cm_unit_info;

/* One named parameter, by value. name and tensor are borrowed from the root (valid until the
 * next finalize/surgery or cm_module_free). */
typedef struct cm_param_info {
    const char *name;    /* full dotted name: "transformer.h.0.attn.c_attn.weight" */
    cm_tensor *tensor;   /* f32; its data is params of its unit + offset */
    cm_module *module;   /* the module that owns it */
    int unit;            /* index of its unit */
    int64_t offset;      /* element offset in the unit's flat buffers */
    int64_t numel;
    bool requires_grad;  /* false when frozen (read live from the tensor) */
    bool no_decay;       /* excluded from weight decay: by default biases and norm weights (every
                            parameter with fewer than 2 dims); see cm_module_set_no_decay */
} cm_param_info;

/* A persistent buffer (batch norm's running_mean, running_var, num_batches_tracked). */
typedef struct cm_buffer_info {
    const char *name;    /* "layer1.0.bn1.running_mean" */
    cm_tensor *tensor;
    cm_module *module;
} cm_buffer_info;

/* Units, parameters and persistent buffers of a finalized root (0 / zeroed info when root is not
 * finalized or i is out of range). */
int cm_module_n_units(const cm_module *root);
const cm_unit_info *cm_module_unit(const cm_module *root, int i);
int64_t cm_module_n_params(const cm_module *root);
cm_param_info cm_module_param_info(const cm_module *root, int64_t i);
int64_t cm_module_n_buffers(const cm_module *root);
cm_buffer_info cm_module_buffer_info(const cm_module *root, int64_t i);
/* Index of the parameter called `name` (after finalize; tied names resolve to the owner), or -1. */
int64_t cm_module_param_index(const cm_module *root, const char *name);

/* Elements in the subtree's parameters (tied ones once); trainable_only counts only those that
 * require grad. Works before and after finalize. */
int64_t cm_module_count_params(const cm_module *m, bool trainable_only);

/* Does a dotted name match a glob? '*' matches any run of characters (dots included), '?' one
 * character; "*.bias", "transformer.h.*.ln_?.weight", "bert.embeddings.*". */
bool cm_name_match(const char *glob, const char *name);

/* Sets requires_grad on every parameter under m whose dotted name (relative to m) matches glob
 * (NULL = all): false freezes it (it gets no gradient; its span of the flat gradient stays 0 and
 * optimizers skip it). *n_matched (if not NULL) gets the count. Errors: CM_ERR_NOT_FOUND when
 * nothing matches (naming the glob: usually a typo). */
cm_status cm_module_set_requires_grad(cm_module *m, const char *glob, bool on, int64_t *n_matched);

/* Sets the no-weight-decay flag on every parameter under m matching glob (NULL = all); e.g.
 * cm_module_set_no_decay(m, "*wte.weight", true, NULL) for a no-decay embedding. Errors as
 * cm_module_set_requires_grad. */
cm_status cm_module_set_no_decay(cm_module *m, const char *glob, bool on, int64_t *n_matched);
bool cm_module_param_no_decay(const cm_module *m, const cm_tensor *param); /* false if not m's */

/* Parameter groups by predicate: writes the indices (into cm_module_param_info) of the params for
 * which pred returns true into idx (room for cm_module_n_params entries) and returns how many. */
typedef bool (*cm_param_pred)(const cm_param_info *p, void *data);
int64_t cm_module_select_params(const cm_module *root, cm_param_pred pred, void *data, int64_t *idx);

/* Zeroes every unit's flat gradient buffer (and re-links any parameter whose gradient was
 * detached from it, e.g. by cm_tensor_clear_grad). No-op before finalize. */
void cm_module_zero_grad(cm_module *root);

/* Locking: an optimizer calls cm_module_lock(root) when it attaches to the flat buffers and
 * cm_module_unlock when it is freed (the lock counts). While locked, surgery and finalize fail.
 * Errors: CM_ERR_STATE when root is not finalized. */
cm_status cm_module_lock(cm_module *root);
void cm_module_unlock(cm_module *root);
bool cm_module_is_locked(const cm_module *root);

/* ---------------------------------------------------------------------------------------------
 * Model surgery
 * ------------------------------------------------------------------------------------------- */

/* Decides whether a module (at `path` relative to the root) is replaced. */
typedef bool (*cm_module_match_fn)(cm_module *m, const char *path, void *data);
/* Makes the replacement for `old` (at `path`). Return CM_OK with *out a new parentless module,
 * or an error status (surgery stops and reports it). The replacement may adopt `old` as a child
 * (cm_module_add_child(new, "base", old, ...) — e.g. a LoRA wrapper); otherwise old is freed. */
typedef cm_status (*cm_module_make_fn)(cm_module *old, const char *path, void *data, cm_module **out);

/* Replaces every module below root (root itself is never matched) for which match returns true
 * with make's result, which takes the old module's name and place (and slot) in its parent; a
 * replaced module's subtree is not searched further. Then, if root was finalized, re-packs: the
 * values of untouched parameters are preserved and gradients are reset. *n_replaced (if not NULL)
 * gets the count. Errors: CM_ERR_STATE when root is locked — "surgery after the optimizer was
 * created: do model surgery before creating the optimizer" — or has a parent; make's error (the
 * modules replaced before it stay replaced, the tree stays consistent and packed); CM_ERR_OOM. */
cm_status cm_module_replace(cm_module *root, cm_module_match_fn match, cm_module_make_fn make, void *data,
                            int64_t *n_replaced);

/* A ready-made predicate: matches modules whose type name equals (const char *)data. */
bool cm_module_match_type(cm_module *m, const char *path, void *data);

/* ---------------------------------------------------------------------------------------------
 * Layers. Constructors take the RNG for their initialisation (advanced in place); rng NULL skips
 * random initialisation (weights stay zero, norm weights one) — for weights about to be loaded.
 * Each returns a new parentless module (free with cm_module_free, or give it to a parent).
 * Errors: CM_ERR_INVALID_ARG naming the bad size or option, CM_ERR_OOM.
 * ------------------------------------------------------------------------------------------- */

/* Linear (type "Linear"): y = x·Wᵀ + b, x (..., in) → (..., out). Parameters "weight" (out, in)
 * and "bias" (out), initialised as PyTorch: U(-1/sqrt(in), 1/sqrt(in)). */
cm_status cm_nn_linear_new(int64_t in, int64_t out, bool bias, cm_rng *rng, cm_module **m);
/* The same layer with its weight stored as (in, out) — Hugging Face's Conv1D (type "Conv1D"), as
 * GPT-2's c_attn, c_proj and c_fc: y = x·W + b. The math is the same GEMM (the transposed view
 * costs nothing), and the stored layout equals the checkpoint's, so no conversion at load time. */
cm_status cm_nn_conv1d_new(int64_t in, int64_t out, bool bias, cm_rng *rng, cm_module **m);
/* True for Linear and Conv1D modules; their sizes and whether the weight is stored (in, out). */
bool cm_nn_is_linear(const cm_module *m);
cm_status cm_nn_linear_dims(const cm_module *m, int64_t *in, int64_t *out, bool *transposed_weight);

/* Embedding ("Embedding"): idx (...) i32/i64 → (..., dim). Parameter "weight" (num, dim) ~ N(0, 1). */
cm_status cm_nn_embedding_new(int64_t num, int64_t dim, cm_rng *rng, cm_module **m);

/* LayerNorm ("LayerNorm") over the last dim; "weight" = 1 and "bias" = 0 (dim) when affine. */
cm_status cm_nn_layer_norm_new(int64_t dim, float eps, bool affine, cm_module **m);
/* GroupNorm ("GroupNorm"): x (N, C, ...), C divisible by groups. */
cm_status cm_nn_group_norm_new(int64_t groups, int64_t channels, float eps, bool affine, cm_module **m);

/* BatchNorm2d ("BatchNorm2d"): x (N, C, H, W) (or (N, H, W, C) with channels_last). Parameters
 * "weight", "bias" (C) when affine; persistent buffers "running_mean" (0), "running_var" (1) and
 * "num_batches_tracked" (i64 scalar) when track_running_stats — PyTorch's state_dict keys. In
 * training it normalises with batch statistics and updates the running ones; in eval it uses the
 * running ones (or batch statistics without tracking). */
typedef struct cm_nn_batch_norm_config {
    float eps;                /* 1e-5 */
    float momentum;           /* 0.1 */
    bool affine;              /* true */
    bool track_running_stats; /* true */
    bool channels_last;       /* false */
} cm_nn_batch_norm_config;
cm_nn_batch_norm_config cm_nn_batch_norm_config_default(void);
cm_status cm_nn_batch_norm2d_new(int64_t channels, const cm_nn_batch_norm_config *cfg, cm_module **m);
/* relu(bn(x) + residual) (residual NULL: relu(bn(x))) for a BatchNorm2d module bn, as the fused
 * cm_batch_norm_add_relu with bn's parameters, buffers, config and mode (num_batches_tracked
 * counts as in its forward). When bn is another module (replaced by surgery, say), its forward,
 * cm_add and cm_relu run as separate ops (on f32 copies of a bf16 output or residual: the result is
 * then f32). Errors are recorded on the tape (NULL returned). */
cm_tensor *cm_nn_batch_norm_add_relu(cm_module *bn, cm_tape *tp, cm_tensor *x, cm_tensor *residual);

/* Conv2d ("Conv2d"): "weight" (out, in/groups, kh, kw), "bias" (out); PyTorch's default init. */
typedef struct cm_nn_conv2d_config {
    int64_t in, out;
    int kernel[2];
    cm_conv2d_opts opts; /* stride, padding, dilation, groups, channels_last */
    bool bias;           /* true */
} cm_nn_conv2d_config;
cm_nn_conv2d_config cm_nn_conv2d_config_default(int64_t in, int64_t out, int kh, int kw);
cm_status cm_nn_conv2d_new(const cm_nn_conv2d_config *cfg, cm_rng *rng, cm_module **m);

/* Pooling ("MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d") and Flatten ("Flatten": dims
 * start_dim.. end merged, as nn.Flatten(start_dim)). No parameters. */
cm_status cm_nn_max_pool2d_new(const cm_pool2d_opts *opts, cm_module **m);
cm_status cm_nn_avg_pool2d_new(const cm_pool2d_opts *opts, cm_module **m);
cm_status cm_nn_adaptive_avg_pool2d_new(int64_t out_h, int64_t out_w, bool channels_last, cm_module **m);
cm_status cm_nn_flatten_new(int start_dim, cm_module **m);

/* Dropout ("Dropout"): identity in eval mode or when p = 0. Its RNG is (seed, stream, counter),
 * see cm_module_set_seed; the state can be read and restored for checkpoints. */
cm_status cm_nn_dropout_new(float p, cm_module **m);
cm_rng *cm_nn_dropout_rng(cm_module *m); /* NULL if m is not a Dropout */

typedef enum cm_activation {
    CM_ACT_RELU = 0,
    CM_ACT_GELU,      /* exact (erf) — BERT's "gelu" */
    CM_ACT_GELU_TANH, /* tanh approximation — GPT-2's "gelu_new" */
    CM_ACT_SILU,
    CM_ACT_TANH,
    CM_ACT_SIGMOID,
    CM_ACT_IDENTITY,
} cm_activation;
/* Activation ("ReLU", "GELU", "NewGELU", "SiLU", "Tanh", "Sigmoid", "Identity"). */
cm_status cm_nn_activation_new(cm_activation act, cm_module **m);
/* Applies an activation as an op (NULL + tape error for an unknown value). */
cm_tensor *cm_nn_activate(cm_tape *tp, cm_tensor *x, cm_activation act);

/* Sequential ("Sequential"): children "0", "1", ... applied in order to in[0]; the other inputs
 * are passed to every child (so a stack of transformer blocks shares the mask). ModuleList
 * ("ModuleList"): the same container without a forward (GPT-2's "h", BERT's "layer"). */
cm_status cm_nn_sequential_new(cm_module **m);
cm_status cm_nn_module_list_new(cm_module **m);
/* Appends child under the next index name. Errors as cm_module_add_child. */
cm_status cm_nn_sequential_append(cm_module *seq, cm_module *child);

/* ---------------------------------------------------------------------------------------------
 * Attention and transformer blocks
 * ------------------------------------------------------------------------------------------- */

typedef struct cm_nn_attention_config {
    int64_t d_model;    /* C */
    int64_t n_heads;    /* H; C divisible by H */
    bool causal;        /* GPT: true; BERT: false */
    bool bias;          /* biases on the projections (true) */
    bool alibi;         /* add ALiBi: bias[h, i, j] = -slope_h·|i - j|, slopes as Press et al. */
    float attn_pdrop;   /* dropout on the attention probabilities (0) */
    float resid_pdrop;  /* dropout after the output projection (0) */
    float mlp_ratio;    /* blocks: hidden size of the MLP = mlp_ratio·C (4) */
    float ln_eps;       /* blocks: layer norm eps (GPT-2 1e-5, BERT 1e-12) */
    cm_activation act;  /* blocks: MLP activation (GPT-2 GELU_TANH, BERT GELU) */
} cm_nn_attention_config;
/* GPT-2's defaults for d_model and n_heads: causal, bias, no ALiBi, no dropout, mlp_ratio 4,
 * ln_eps 1e-5, GELU_TANH. */
cm_nn_attention_config cm_nn_attention_config_default(int64_t d_model, int64_t n_heads);

/* Multi-head self-attention with a fused qkv projection, as GPT-2's attention ("GPT2Attention"):
 * children "c_attn" (Conv1D C → 3C, q|k|v), "c_proj" (Conv1D C → C), "attn_dropout",
 * "resid_dropout". Forward: in[0] x (B, T, C); in[1] key padding mask (B, T) or NULL; in[2] an
 * extra additive bias broadcastable to (B, H, T, T) or NULL → (B, T, C). Uses the fused
 * cm_attention unless attention dropout is active (training with attn_pdrop > 0), where it runs
 * the explicit softmax(q·kᵀ/√D + bias + masks)·v with dropout on the probabilities (a query row
 * with every key masked then gives NaN, where the fused op gives zeros). The children live in
 * slots that surgery updates, so a replaced projection is what the next forward calls. */
cm_status cm_nn_attention_new(const cm_nn_attention_config *cfg, cm_rng *rng, cm_module **m);

/* GPT-2 block, pre-LN ("GPT2Block"): children "ln_1", "attn" (as above), "ln_2", "mlp"
 * ("GPT2MLP": "c_fc" C → rC, "c_proj" rC → C, "dropout"). x + attn(ln_1(x)); then
 * h + mlp(ln_2(h)), mlp(x) = dropout(c_proj(act(c_fc(x)))) (the bias and GELU fused when c_fc is
 * a Linear/Conv1D). Inputs as the attention's. Initialised as GPT-2: weights N(0, 0.02), biases 0;
 * c_proj weights N(0, 0.02/sqrt(2·n_layer)) when n_layer > 0. */
cm_status cm_nn_gpt_block_new(const cm_nn_attention_config *cfg, int n_layer, cm_rng *rng, cm_module **m);

/* BERT layer, post-LN ("BertLayer"), with Hugging Face's tree:
 *   attention ("BertAttention"): self ("BertSelfAttention": query, key, value Linear C → C;
 *     dropout), output ("BertSelfOutput": dense C → C, LayerNorm, dropout)
 *   intermediate ("BertIntermediate": dense C → rC, then act)
 *   output ("BertOutput": dense rC → C, LayerNorm, dropout)
 * h = LN(x + dropout(dense(attn(x)))); out = LN(h + dropout(dense(act(dense(h))))). Bidirectional
 * unless cfg->causal. Inputs as the attention's (in[1] is the attention mask: 1 = token, 0 =
 * padding). Weights N(0, 0.02), biases 0, as BERT. */
cm_status cm_nn_bert_layer_new(const cm_nn_attention_config *cfg, cm_rng *rng, cm_module **m);

/* The ALiBi slopes for n_heads heads (Press et al.: 2^(-8i/n) for a power of two n, interleaved
 * otherwise), into slopes (n_heads). */
void cm_nn_alibi_slopes(int64_t n_heads, float *slopes);

/* ---------------------------------------------------------------------------------------------
 * Reading and retuning layers. Model surgery (composer/surgery_algorithms.h) reads a layer's
 * settings to build its replacement, and switches a few settings in place where no parameter
 * changes. Each fails with CM_ERR_INVALID_ARG naming the module's type when m is not one of the
 * types named (or NULL). Not thread-safe with a forward of the same tree.
 * ------------------------------------------------------------------------------------------- */

/* Conv2d: its configuration (sizes, kernel, opts, bias). */
cm_status cm_nn_conv2d_config_of(const cm_module *m, cm_nn_conv2d_config *out);
/* BatchNorm2d: channel count and configuration. Either out pointer may be NULL. */
cm_status cm_nn_batch_norm2d_config_of(const cm_module *m, int64_t *channels, cm_nn_batch_norm_config *out);
/* MaxPool2d and AvgPool2d: the pooling options. */
cm_status cm_nn_pool2d_opts_of(const cm_module *m, cm_pool2d_opts *out);
/* LayerNorm (groups 1) and GroupNorm: groups, normalised size (LayerNorm's dim, GroupNorm's
 * channels), eps and whether it has weight and bias. Any out pointer may be NULL. */
cm_status cm_nn_norm_config_of(const cm_module *m, int64_t *groups, int64_t *dim, float *eps, bool *affine);
/* Dropout: its probability. */
cm_status cm_nn_dropout_p_of(const cm_module *m, float *p);
/* Embedding: rows and width. Either pointer may be NULL. */
cm_status cm_nn_embedding_dims(const cm_module *m, int64_t *num, int64_t *dim);
/* The attention configuration of the transformer modules of this file: GPT2Attention, GPT2MLP,
 * GPT2Block and the BERT ones (BertLayer, BertAttention, BertSelfAttention, BertSelfOutput,
 * BertIntermediate, BertOutput). */
cm_status cm_nn_attention_config_of(const cm_module *m, cm_nn_attention_config *out);

/* Switches ALiBi on or off in a GPT2Attention or BertSelfAttention (cfg.alibi: the bias
 * -slope_h·|i - j| is added to the attention scores of every forward). No parameter changes. */
cm_status cm_nn_attention_set_alibi(cm_module *m, bool on);
/* Low-precision norms (Composer's LPLayerNorm / LPGroupNorm) for LayerNorm and GroupNorm: while
 * on, a forward on a tape with bf16 autocast (amp_bf16) rounds x, the weight and the bias to bf16
 * and rounds the result to bf16 (the values of PyTorch's bf16 layer_norm / group_norm on CUDA,
 * which compute in f32 between the two roundings); the tensors stay f32 (there is no bf16 norm
 * kernel here, so it saves no time) and gradients pass the roundings unchanged, as autocast's.
 * Without autocast the forward is the plain f32 one. */
cm_status cm_nn_norm_set_low_precision(cm_module *m, bool on);
bool cm_nn_norm_is_low_precision(const cm_module *m); /* false for other modules */
/* Weight standardization (Qiao et al. 2019; Composer's WeightStandardization) for a Conv2d: while
 * on, its forward convolves with cm_nn_standardize_weight(weight) — the stored weight stays the
 * parameter (and keeps its name), the gradient flows through the standardization. */
cm_status cm_nn_conv2d_set_weight_standardization(cm_module *m, bool on);
bool cm_nn_conv2d_weight_standardization(const cm_module *m); /* false for other modules */
/* (W - mean) / sqrt(var + 1e-10) over every dim but the first (biased variance), as Composer's
 * _standardize_weights: an op chain on the tape, differentiable in w. NULL + tape error for a
 * weight of fewer than 2 dims. */
cm_tensor *cm_nn_standardize_weight(cm_tape *tp, cm_tensor *w);
/* Switches the activation layout of Conv2d, BatchNorm2d, MaxPool2d, AvgPool2d and
 * AdaptiveAvgPool2d between (N, C, H, W) and (N, H, W, C) (channels_last). Weights keep their
 * layout. The caller makes the layers' inputs match (see cm_resnet_set_channels_last). */
cm_status cm_nn_set_channels_last(cm_module *m, bool on);
bool cm_nn_is_channels_last(const cm_module *m); /* false for other modules */

/* ---------------------------------------------------------------------------------------------
 * Weights in and out: safetensors files with the parameters' dotted names (Hugging Face names for
 * the zoo models), so weights move between this library, PyTorch and Hugging Face.
 * ------------------------------------------------------------------------------------------- */

typedef struct cm_load_opts {
    /* Strict (default): every parameter and persistent buffer of the model must be in the file
     * and every tensor of the file must belong to the model, else CM_ERR_NOT_FOUND listing the
     * missing and the unexpected names. Non-strict loads what matches and reports the rest. */
    bool strict;
    /* Glob patterns (cm_name_match) of names to skip on both sides, e.g. "*.attn.bias" for the
     * causal-mask buffers in Hugging Face GPT-2 files. */
    const char *const *ignore;
    int n_ignore;
    /* Optional renaming of the file's names before matching (e.g. strip a "model." prefix): write
     * the new name into buf (cap bytes) and return true, or return false to keep the name. */
    bool (*rename)(const char *file_name, char *buf, size_t cap, void *data);
    void *rename_data;
} cm_load_opts;

cm_load_opts cm_load_opts_default(void);

/* What a load did. The name lists hold the first names, comma-separated (truncated with ", ..."). */
typedef struct cm_load_report {
    int64_t n_loaded;
    int64_t n_missing;    /* model tensors absent from the file (not ignored) */
    int64_t n_unexpected; /* file tensors that match nothing in the model (not ignored) */
    char missing[512];
    char unexpected[512];
} cm_load_report;

/* Loads parameters and persistent buffers of the finalized `root` from `path`: a .safetensors
 * file, or a Hugging Face checkpoint folder / index JSON (sharded, see safetensors.h). Values are
 * converted to each tensor's dtype (F16/BF16/F64 files load into f32 parameters). Nothing is
 * changed unless every check passes (shapes are checked first, then values copied). Errors:
 * CM_ERR_STATE (root not finalized), CM_ERR_NOT_FOUND (strict and names missing/unexpected: the
 * message lists them), CM_ERR_SHAPE (a name whose shapes differ: both shapes named), the file's
 * errors (CM_ERR_IO, CM_ERR_FORMAT, CM_ERR_DTYPE). report may be NULL. */
cm_status cm_module_load_safetensors(cm_module *root, const char *path, const cm_load_opts *opts,
                                     cm_load_report *report);

/* Writes every parameter (tied ones once, under the owner's name) and persistent buffer of the
 * finalized `root` to `path` (atomically, see cm_safetensors_writer_write), with metadata
 * {"format": "pt"}, so torch's safetensors loader and Hugging Face read it. Errors: CM_ERR_STATE
 * (not finalized), the writer's errors (CM_ERR_IO naming the path, CM_ERR_OOM). */
cm_status cm_module_save_safetensors(cm_module *root, const char *path);

/* cm_module_save_safetensors with more "__metadata__" entries after {"format": "pt"}: meta holds
 * n_meta (key, value) pairs as 2 * n_meta strings (valid UTF-8; no key twice, "format" included);
 * e.g. the surgery record of composer/surgery_algorithms.h (CM_SURGERY_METADATA_KEY). n_meta 0
 * writes what cm_module_save_safetensors writes. Errors: as cm_module_save_safetensors, and
 * CM_ERR_INVALID_ARG (n_meta < 0, NULL meta with n_meta > 0, or the writer's: a NULL or invalid
 * string, a key twice). */
cm_status cm_module_save_safetensors_with(cm_module *root, const char *path, const char *const *meta, int n_meta);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_NN_H */
