/* Private pieces shared by the training-method algorithms (EMA, SWA, SAM, LayerFreezing): a copy
 * of a model's parameters and persistent buffers kept beside the model (EMA's average, SWA's
 * average), time strings checked with Composer's unit rules, and the refusal of sharded
 * strategies. Not installed. */
#ifndef CM_TRAIN_ALGOS_IMPL_H
#define CM_TRAIN_ALGOS_IMPL_H

#include <composer/composer.h>
#include <composer/train_algos.h>

/* One tensor of the model and its copy. */
typedef struct cmi_wentry {
    const char *name;   /* the model's dotted name (borrowed from the finalized root) */
    cm_tensor *t;       /* the model's tensor */
    bool is_param;
    bool tracked;       /* averaged and swapped (parameters: requires grad when the copy was made) */
    cm_dtype dtype;
    int ndim;
    int64_t shape[CM_MAX_DIMS];
    int64_t numel;
    void *copy;         /* (numel) in the copy's storage */
} cmi_wentry;

/* The copy lives on the model's device (dev): in host memory for a CPU model, in device memory
 * for a GPU one. The trainer moves the model to its device after INIT, where the algorithms make
 * their copies, so every use first calls cmi_wcopy_follow, which moves the copy (its values kept)
 * to wherever the model is now. */
typedef struct cmi_wcopy {
    cmi_wentry *e;
    int n;
    void *storage;
    cm_device dev; /* where storage is */
    void *tmp;     /* on a device: room for the largest entry (swaps) */
} cmi_wcopy;

/* Lists every parameter (and, with buffers, every persistent buffer) of the finalized root and
 * copies their values, on the model's device. Parameters that do not require grad are listed but
 * not tracked unless all_params. Errors: CM_ERR_STATE (not finalized, or tensors on two devices),
 * CM_ERR_OOM. */
cm_status cmi_wcopy_init(cmi_wcopy *w, cm_module *root, bool buffers, bool all_params);
void cmi_wcopy_free(cmi_wcopy *w);
/* Moves the copy to the model's current device, keeping its values (nothing when it is there).
 * Errors: CM_ERR_OOM (device memory), CM_ERR_DEVICE. */
cm_status cmi_wcopy_follow(cmi_wcopy *w);
/* Copies the model's current values into the copy (tracked entries; untracked ones too when all)
 * and recomputes which parameters are tracked (requires grad now) unless all_params. Follows the
 * model first. */
cm_status cmi_wcopy_refresh(cmi_wcopy *w, bool all_params);
/* Swaps the values of the model and the copy for tracked entries. Follows the model first. */
cm_status cmi_wcopy_swap(cmi_wcopy *w);
/* dst = src (bytes) where both are on the copy's device (model tensor to copy or back). */
cm_status cmi_wcopy_memcpy(const cmi_wcopy *w, void *dst, const void *src, size_t bytes);
/* cm_algorithm_i.tensors over the copy's entries (named as the model's tensors). */
int cmi_wcopy_tensors(const cmi_wcopy *w, cm_plugin_tensor *out, int cap);
/* The untracked parameters' names as a JSON array text into buf (as snprintf). */
size_t cmi_wcopy_untracked_json(const cmi_wcopy *w, char *buf, size_t cap);
/* Marks the parameters named in a JSON array as untracked, every other parameter as tracked.
 * Errors: CM_ERR_FORMAT (not an array of names, or a name the copy does not have). */
cm_status cmi_wcopy_set_untracked(cmi_wcopy *w, const void *cjson_array, const char *alg);

/* Parses a time argument of algorithm `alg`: "<alg>: <arg> '<s>': ..." on errors, and the unit
 * must be one of `units` (a CM_TIME_* bit set: 1u << unit), listed in the message by `allowed`. */
cm_status cmi_algo_time(const char *alg, const char *arg, const char *s, unsigned units, const char *allowed,
                        cm_time *out);
#define CMI_UNIT(u) (1u << (u))

/* CM_ERR_UNSUPPORTED when the state's parameters are sharded (SHARD_GRAD_OP, FULL_SHARD). */
cm_status cmi_algo_refuse_sharded(const char *alg, const cm_state *st);

/* The elapsed fraction of the run, or the timestamp in `unit`, compared with t: t ≤ now. */
bool cmi_time_reached(const cm_state *st, cm_time t);

#endif
