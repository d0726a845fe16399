/* Private helpers of the model-surgery algorithms (src/plugins/surgery): the registry rows each
 * algorithm file defines, argument tables that parse and print a config struct, and the small
 * tools every surgery shares (finding modules by type, refusing a locked model, seeding new
 * layers, the "no module to apply to" error). Not installed. */
#ifndef CM_SURGERY_IMPL_H
#define CM_SURGERY_IMPL_H

#include <composer/surgery_algorithms.h>

#include <stddef.h>

/* One argument of a config struct: its public description and where it lives in the struct.
 * Kinds and their C types: BOOL bool, INT int64_t, REAL double, CHOICE int (index into choices;
 * -1 for the "null" choice when null_ok), TIME cm_time. */
typedef struct cmi_arg {
    cm_algo_arg pub;
    size_t offset;
    bool null_ok; /* CHOICE: JSON null / YAML null is allowed (stored as -1) */
} cmi_arg;

/* A registry row: the algorithm's description, its config (size, defaults, argument table) and
 * how to make the plugin from a config. The plugin's self must start with its config struct, so
 * the arguments of a live plugin can be printed. */
typedef struct cmi_algo_entry {
    cm_algorithm_info info;
    const cm_algorithm_i *vt;
    size_t cfg_size;
    void (*cfg_default)(void *cfg);
    const cmi_arg *args;
    int n_args;
    cm_status (*make)(const void *cfg, cm_algorithm_plugin *out);
} cmi_algo_entry;

/* The rows, one per algorithm file. */
extern const cmi_algo_entry cmi_alibi_entry, cmi_blurpool_entry, cmi_channels_last_entry, cmi_factorize_entry,
    cmi_glu_entry, cmi_ghost_bn_entry, cmi_gyro_dropout_entry, cmi_lp_groupnorm_entry, cmi_lp_layernorm_entry,
    cmi_no_op_model_entry, cmi_squeeze_excite_entry, cmi_stochastic_depth_entry, cmi_weight_std_entry,
    cmi_fused_layernorm_entry;

/* Writes cfg's arguments as one JSON object (keys in table order) into buf; returns the length
 * needed without the NUL, as snprintf. */
size_t cmi_args_to_json(const cmi_arg *args, int n, const void *cfg, char *buf, size_t cap);

/* "<Name>: the model's parameters are locked ..." when root is locked (an optimizer or data
 * parallelism made over the flat buffers): surgery would re-pack them under their feet. */
cm_status cmi_surgery_check_unlocked(const cm_module *root, const char *algo, const char *fn);

/* Whether a module of type `type` is above m (its wrapper was applied already, maybe with other
 * wrappers in between: SqueezeExciteConv2d{conv: BlurConv2d{conv}}). */
bool cmi_has_ancestor(const cm_module *m, const char *type);

/* Modules below root (root included) whose type name is one of types[0..n): their count. */
int64_t cmi_count_types(cm_module *root, const char *const *types, int n);

/* The error for a model that has none of the modules a method changes:
 * "<algo>: the model (<root type>) has nothing to apply to: it looked for <looked_for>; <hint>"
 * (CM_ERR_UNSUPPORTED). */
cm_status cmi_nothing_to_apply(const cm_module *root, const char *algo, const char *looked_for, const char *hint);

/* The RNG a new layer at `path` is initialised from: Philox (seed, hash(path)), so surgery draws
 * the same weights whatever else the model holds and in whatever order layers are visited. */
cm_rng cmi_surgery_rng(uint64_t seed, const char *path);

/* The root of the state's model ("<algo>: the state has no model" otherwise). */
cm_status cmi_state_root(const cm_state *st, const char *algo, cm_module **out);

/* Switches the layout of one module if it has one: the nn layers (cm_nn_set_channels_last) and
 * the modules of these files (BlurConv2d, BlurMaxPool2d, SqueezeExciteConv2d). */
void cmi_surgery_set_channels_last(cm_module *m, bool on);
bool cmi_blurpool_set_channels_last(cm_module *m, bool on); /* true if m is one of blurpool.c's */
bool cmi_se_set_channels_last(cm_module *m, bool on);       /* true if m is squeeze_excite.c's */

/* Logs "<what>" once per process (keyed by the string's address). */
void cmi_log_once(const char *what);

#endif
