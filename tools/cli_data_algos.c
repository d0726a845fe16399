/* `composer train`'s constructors of the data methods (composer/data_algos.h), one per registry
 * row in cli_plugins.c: Composer's snake_case names and argument names, Composer's defaults
 * (stored in the config, so --print-config shows them). A value a constructor refuses is reported
 * with the config origin of the algorithm's entry; unknown argument names are reported by the
 * config's final check with the closest valid one. */
#include "cli.h"

#include <composer/data_algos.h>

/* Keys are cut to their buffers on purpose (longer ones are not valid config paths). */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#define KEY(k) (snprintf(key, sizeof key, "%s." k, path), key)

/* The constructor's error, prefixed with where the algorithm's entry came from: a value it
 * refuses is a configuration error (CM_ERR_INVALID_ARG, the usage exit status). */
static cm_status made(cm_config *c, const char *path, cm_status s) {
    if (!s) return s;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", cm_last_error());
    const char *o = cm_config_origin(c, path);
    return cm_set_error(s == CM_ERR_OOM ? s : CM_ERR_INVALID_ARG, "%s%s%s: %s", o, *o ? ": " : "", path, msg);
}

/* input_key / target_key: a field name or position; absent = Composer's 0 / 1. */
static cm_status get_key(cm_config *c, const char *key, const char **out) {
    return cm_config_get_string(c, key, NULL, out);
}

static cm_status get_int(cm_config *c, const char *key, int64_t def, int64_t *out) {
    return cm_config_get_int(c, key, def, out);
}

/* algorithms.mixup: {alpha: 0.2, interpolate_loss: false, input_key, target_key} */
cm_status cli_make_mixup(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    char key[256];
    cm_mixup_config m = cm_mixup_config_default();
    cm_status s;
    if ((s = cm_config_get_double(c, KEY("alpha"), m.alpha, &m.alpha)) ||
        (s = cm_config_get_bool(c, KEY("interpolate_loss"), m.interpolate_loss, &m.interpolate_loss)) ||
        (s = get_key(c, KEY("input_key"), &m.input_key)) || (s = get_key(c, KEY("target_key"), &m.target_key)))
        return s;
    return made(c, path, cm_mixup_new(&m, &out->algorithm));
}

/* algorithms.cutmix: {alpha: 1.0, interpolate_loss: false, uniform_sampling: false, input_key, target_key} */
cm_status cli_make_cutmix(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    char key[256];
    cm_cutmix_config m = cm_cutmix_config_default();
    cm_status s;
    if ((s = cm_config_get_double(c, KEY("alpha"), m.alpha, &m.alpha)) ||
        (s = cm_config_get_bool(c, KEY("interpolate_loss"), m.interpolate_loss, &m.interpolate_loss)) ||
        (s = cm_config_get_bool(c, KEY("uniform_sampling"), m.uniform_sampling, &m.uniform_sampling)) ||
        (s = get_key(c, KEY("input_key"), &m.input_key)) || (s = get_key(c, KEY("target_key"), &m.target_key)))
        return s;
    return made(c, path, cm_cutmix_new(&m, &out->algorithm));
}

/* algorithms.cutout: {num_holes: 1, length: 0.5, uniform_sampling: false, input_key} */
cm_status cli_make_cutout(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    char key[256];
    cm_cutout_config m = cm_cutout_config_default();
    int64_t holes;
    cm_status s;
    if ((s = get_int(c, KEY("num_holes"), m.num_holes, &holes)) ||
        (s = cm_config_get_double(c, KEY("length"), m.length, &m.length)) ||
        (s = cm_config_get_bool(c, KEY("uniform_sampling"), m.uniform_sampling, &m.uniform_sampling)) ||
        (s = get_key(c, KEY("input_key"), &m.input_key)))
        return s;
    if (holes < 0 || holes > 1 << 20)
        return made(c, path, cm_set_error(CM_ERR_INVALID_ARG, "CutOut: num_holes %lld must be in [0, %d]",
                                          (long long)holes, 1 << 20));
    m.num_holes = (int)holes;
    return made(c, path, cm_cutout_new(&m, &out->algorithm));
}

/* algorithms.label_smoothing: {smoothing: 0.1, target_key} */
cm_status cli_make_label_smoothing(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    char key[256];
    cm_label_smoothing_config m = cm_label_smoothing_config_default();
    cm_status s;
    if ((s = cm_config_get_double(c, KEY("smoothing"), m.smoothing, &m.smoothing)) ||
        (s = get_key(c, KEY("target_key"), &m.target_key)))
        return s;
    return made(c, path, cm_label_smoothing_new(&m, &out->algorithm));
}

/* algorithms.progressive_resizing: {mode: resize | crop, initial_scale: 0.5, finetune_fraction: 0.2,
 * delay_fraction: 0.5, size_increment: 4, resize_targets: false, input_key, target_key} */
cm_status cli_make_progressive_resizing(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    char key[256];
    static const char *const modes[] = {"resize", "crop"};
    cm_progressive_resizing_config m = cm_progressive_resizing_config_default();
    int mode;
    cm_status s;
    if ((s = cm_config_get_choice(c, KEY("mode"), modes, 2, "resize", &mode)) ||
        (s = cm_config_get_double(c, KEY("initial_scale"), m.initial_scale, &m.initial_scale)) ||
        (s = cm_config_get_double(c, KEY("finetune_fraction"), m.finetune_fraction, &m.finetune_fraction)) ||
        (s = cm_config_get_double(c, KEY("delay_fraction"), m.delay_fraction, &m.delay_fraction)) ||
        (s = get_int(c, KEY("size_increment"), m.size_increment, &m.size_increment)) ||
        (s = cm_config_get_bool(c, KEY("resize_targets"), m.resize_targets, &m.resize_targets)) ||
        (s = get_key(c, KEY("input_key"), &m.input_key)) || (s = get_key(c, KEY("target_key"), &m.target_key)))
        return s;
    m.mode = (cm_resize_mode)mode;
    return made(c, path, cm_progressive_resizing_new(&m, &out->algorithm));
}

/* algorithms.seq_length_warmup: {duration: 0.3, min_seq_length: 8, max_seq_length: 1024,
 * step_size: 8, truncate: true, preserve_end_of_sequence: false} */
cm_status cli_make_seq_length_warmup(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    char key[256];
    cm_seq_length_warmup_config m = cm_seq_length_warmup_config_default();
    cm_status s;
    if ((s = cm_config_get_double(c, KEY("duration"), m.duration, &m.duration)) ||
        (s = get_int(c, KEY("min_seq_length"), m.min_seq_length, &m.min_seq_length)) ||
        (s = get_int(c, KEY("max_seq_length"), m.max_seq_length, &m.max_seq_length)) ||
        (s = get_int(c, KEY("step_size"), m.step_size, &m.step_size)) ||
        (s = cm_config_get_bool(c, KEY("truncate"), m.truncate, &m.truncate)) ||
        (s = cm_config_get_bool(c, KEY("preserve_end_of_sequence"), m.preserve_end_of_sequence,
                                &m.preserve_end_of_sequence)))
        return s;
    return made(c, path, cm_seq_length_warmup_new(&m, &out->algorithm));
}

/* algorithms.selective_backprop: {start: 0.5, end: 0.9, keep: 0.5, scale_factor: 1.0, interrupt: 2,
 * input_key, target_key} */
cm_status cli_make_selective_backprop(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    char key[256];
    cm_selective_backprop_config m = cm_selective_backprop_config_default();
    cm_status s;
    if ((s = cm_config_get_double(c, KEY("start"), m.start, &m.start)) ||
        (s = cm_config_get_double(c, KEY("end"), m.end, &m.end)) ||
        (s = cm_config_get_double(c, KEY("keep"), m.keep, &m.keep)) ||
        (s = cm_config_get_double(c, KEY("scale_factor"), m.scale_factor, &m.scale_factor)) ||
        (s = get_int(c, KEY("interrupt"), m.interrupt, &m.interrupt)) ||
        (s = get_key(c, KEY("input_key"), &m.input_key)) || (s = get_key(c, KEY("target_key"), &m.target_key)))
        return s;
    return made(c, path, cm_selective_backprop_new(&m, &out->algorithm));
}

/* algorithms.colout: {p_row: 0.15, p_col: 0.15, batch: true, resize_target: auto | true | false,
 * input_key, target_key} */
cm_status cli_make_colout(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    char key[256];
    static const char *const rt[] = {"auto", "false", "true"}; /* cm_resize_target's order */
    cm_colout_config m = cm_colout_config_default();
    int which;
    cm_status s;
    if ((s = cm_config_get_double(c, KEY("p_row"), m.p_row, &m.p_row)) ||
        (s = cm_config_get_double(c, KEY("p_col"), m.p_col, &m.p_col)) ||
        (s = cm_config_get_bool(c, KEY("batch"), m.batch, &m.batch)) ||
        (s = cm_config_get_choice(c, KEY("resize_target"), rt, 3, "auto", &which)) ||
        (s = get_key(c, KEY("input_key"), &m.input_key)) || (s = get_key(c, KEY("target_key"), &m.target_key)))
        return s;
    m.resize_target = (cm_resize_target)which;
    return made(c, path, cm_colout_new(&m, &out->algorithm));
}

/* ---- RandAugment and AugMix: the train dataset's u8 transform ----
 * Composer inserts them into the train dataset's transforms; here they go into the image
 * dataset's augmentation (cm_image_augment.u8_transform), which runs on the loader's workers on
 * the raw pixels. Their configs live as long as the process (one run per process). */

static cm_randaugment_config g_ra;
static cm_augmix_config g_am;
static bool g_ra_applied, g_am_applied;

static cm_status read_set(cm_config *c, const char *key, cm_augmentation_set *out) {
    static const char *const sets[] = {"all", "safe", "original"}; /* cm_augmentation_set's order */
    int which;
    cm_status s = cm_config_get_choice(c, key, sets, 3, "all", &which);
    if (!s) *out = (cm_augmentation_set)which;
    return s;
}

static cm_status read_randaugment(cm_config *c, const char *path, cm_randaugment_config *m) {
    char key[256];
    int64_t sev, depth;
    *m = cm_randaugment_config_default();
    cm_status s;
    if ((s = get_int(c, KEY("severity"), m->severity, &sev)) || (s = get_int(c, KEY("depth"), m->depth, &depth)) ||
        (s = read_set(c, KEY("augmentation_set"), &m->augmentation_set)))
        return s;
    m->severity = sev < -1 ? -1 : sev > 99 ? 99 : (int)sev, m->depth = depth < -1 ? -1 : depth > 1000 ? 1000 : (int)depth;
    cm_algorithm_plugin p; /* the plugin's checks, with Composer's messages */
    if ((s = made(c, path, cm_randaugment_new(m, NULL, &p)))) return s;
    cm_algorithm_plugin_free(p);
    return CM_OK;
}

static cm_status read_augmix(cm_config *c, const char *path, cm_augmix_config *m) {
    char key[256];
    int64_t sev, depth, width;
    *m = cm_augmix_config_default();
    cm_status s;
    if ((s = get_int(c, KEY("severity"), m->severity, &sev)) || (s = get_int(c, KEY("depth"), m->depth, &depth)) ||
        (s = get_int(c, KEY("width"), m->width, &width)) || (s = cm_config_get_double(c, KEY("alpha"), m->alpha, &m->alpha)) ||
        (s = read_set(c, KEY("augmentation_set"), &m->augmentation_set)))
        return s;
    m->severity = sev < -1 ? -1 : sev > 99 ? 99 : (int)sev, m->depth = depth < -1 ? -1 : depth > 1000 ? 1000 : (int)depth;
    m->width = width < 0 ? 0 : width > 1000 ? 1000 : (int)width;
    cm_algorithm_plugin p;
    if ((s = made(c, path, cm_augmix_new(m, NULL, &p)))) return s;
    cm_algorithm_plugin_free(p);
    return CM_OK;
}

cm_status cli_image_u8_transform(cm_config *c, cm_image_augment *aug) {
    const bool ra = cm_config_kind_of(c, "algorithms.randaugment") >= CM_CONFIG_NULL;
    const bool am = cm_config_kind_of(c, "algorithms.augmix") >= CM_CONFIG_NULL;
    if (ra && am) {
        const char *o = cm_config_origin(c, "algorithms.augmix");
        return cm_set_error(CM_ERR_INVALID_ARG, "%s%salgorithms: randaugment and augmix both augment the train images; "
                                                "keep one",
                            o, *o ? ": " : "");
    }
    cm_status s;
    if (ra) {
        if ((s = read_randaugment(c, "algorithms.randaugment", &g_ra))) return s;
        aug->u8_transform = cm_randaugment_transform, aug->u8_transform_data = &g_ra, g_ra_applied = true;
    } else if (am) {
        if ((s = read_augmix(c, "algorithms.augmix", &g_am))) return s;
        aug->u8_transform = cm_augmix_transform, aug->u8_transform_data = &g_am, g_am_applied = true;
    }
    return CM_OK;
}

/* algorithms.randaugment: {severity: 9, depth: 2, augmentation_set: all | safe | original} */
cm_status cli_make_randaugment(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    cm_randaugment_config m;
    cm_status s = read_randaugment(c, path, &m);
    if (s) return s;
    if (!g_ra_applied)
        return made(c, path, cm_set_error(CM_ERR_INVALID_ARG, "RandAugment augments images: the train dataset must be "
                                                              "mnist or cifar10"));
    out->none = true; /* the train dataset applies it */
    return CM_OK;
}

/* algorithms.augmix: {severity: 3, depth: -1, width: 3, alpha: 1.0, augmentation_set: all | safe | original} */
cm_status cli_make_augmix(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out) {
    (void)ctx;
    cm_augmix_config m;
    cm_status s = read_augmix(c, path, &m);
    if (s) return s;
    if (!g_am_applied)
        return made(c, path, cm_set_error(CM_ERR_INVALID_ARG, "AugMix augments images: the train dataset must be mnist "
                                                              "or cifar10"));
    out->none = true;
    return CM_OK;
}
