/* Private definitions of the nn layer: the module struct and the packing state. Not installed. */
#ifndef CM_NN_IMPL_H
#define CM_NN_IMPL_H

#include <composer/nn.h>

typedef struct cmn_param {
    char *name;
    cm_tensor *t;
    cm_tensor **slot;
    bool owned;    /* false: tied to another module's tensor */
    bool no_decay;
} cmn_param;

typedef struct cmn_buffer {
    char *name;
    cm_tensor *t;
    cm_tensor **slot;
    bool persistent;
} cmn_buffer;

typedef struct cmn_child {
    char *name;
    cm_module *m;
    cm_module **slot;
} cmn_child;

typedef struct cmn_pack cmn_pack;

struct cm_module {
    const cm_module_i *vt;
    void *self;
    cm_module *parent;
    const char *name; /* points at the parent's cmn_child.name ("" for a root) */
    cmn_child *children;
    int n_children, cap_children;
    cmn_param *params;
    int n_params, cap_params;
    cmn_buffer *buffers;
    int n_buffers, cap_buffers;
    char *unit;      /* wrap unit label, "" = use the path; NULL = inherit */
    bool training;
    bool checkpoint; /* activation checkpointing (cm_module_set_checkpointing) */
    bool act_offload; /* activation offload (cm_module_set_activation_offload) */
    cmn_pack *pack;  /* only on a finalized root */
    cm_module_forward_hook_fn fwd_hook; /* cm_module_set_forward_hook */
    void *fwd_hook_data;
    uint64_t layout_version; /* on a root: bumped by every (re-)packing and unpacking */
};

/* The root of m's tree. */
cm_module *cmn_root(const cm_module *m);

/* Called by cm_module_set_seed / finalize for each Dropout (layers.c). */
bool cmn_is_dropout(const cm_module *m);
/* Moves unit u's flat parameter and gradient buffers into new ones of `capacity` floats (≥ numel;
 * the tail is zero; both aligned to `align` bytes, at least 64), rebinding every
 * parameter and gradient view. Errors: CM_ERR_INVALID_ARG, CM_ERR_STATE (locked), CM_ERR_OOM
 * (nothing changed). */
cm_status cmn_unit_reserve(cm_module *root, int u, int64_t capacity, size_t align);
/* cm_module_zero_grad's re-linking without the memset: for gradient buffers known to be zero. */
void cmn_relink_grads(cm_module *root);
/* cpu_offload (src/dist/ddp.c): points unit u's parameters and gradient views at `params` and
 * `grads` (numel floats each, on dev, owned by the caller) without copying or freeing what they
 * pointed at before; returns the old buffers through old_params / old_grads (either may be NULL).
 * No checks beyond the unit index: the caller keeps the values and frees the old memory. */
void cmn_unit_rebind(cm_module *root, int u, float *params, float *grads, cm_device dev, float **old_params,
                     float **old_grads);
/* Moves the model's buffers (running statistics, masks) to dev and records dev as the device of
 * every unit, whose buffers the caller has rebound there (cmn_unit_rebind). CM_ERR_OOM etc. leave
 * the buffers where they were. */
cm_status cmn_buffers_to_device(cm_module *root, cm_device dev);
void cmn_dropout_seed(cm_module *m, uint64_t seed, uint64_t stream);
float cmn_dropout_p(const cm_module *m);

/* BatchNorm's num_batches_tracked += k on any device (a GPU counter: one element each way),
 * except while the tape replays a checkpointed region (counted once). nbt may be NULL. */
void cmn_count_batches(cm_tape *tp, cm_tensor *nbt, int64_t k);

/* Records an error on the tape unless it already failed; returns NULL (for `return cmn_fail(...)`). */
cm_tensor *cmn_fail(cm_tape *tp, cm_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
