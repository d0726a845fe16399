/* LabelSmoothing (Szegedy et al. 2016, Composer's LabelSmoothing): targets shrunk towards the
 * uniform distribution for the loss, restored after it. */
#include "plugins/data_algos/da_impl.h"

#include <math.h>

cm_status cm_smooth_labels(const cm_tensor *logits, const cm_tensor *target, double smoothing, cm_tensor *out) {
    if (!logits || !target || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_smooth_labels: NULL logits, target or out");
    cm_status hs = cmi_da_check_host("cm_smooth_labels", target, out, NULL); /* of the logits, only the shape */
    if (hs) return hs;
    char d[96];
    if (cm_tensor_ndim(logits) != 2)
        return cm_set_error(CM_ERR_SHAPE, "cm_smooth_labels: logits %s must be (N, C)", cmi_da_desc(logits, d, sizeof d));
    if (!(smoothing >= 0 && smoothing <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_smooth_labels: smoothing %g must be in [0, 1]", smoothing);
    const int64_t C = cm_tensor_dim(logits, 1);
    cm_status s = cm_mix_targets(target, NULL, 1.0, C, out);
    if (s) return s;
    /* Composer: target·(1 - smoothing) + smoothing / C, in f32 as torch */
    float *o = cm_tensor_data(out);
    const float a = (float)(1.0 - smoothing), b = (float)(smoothing / (double)C);
    for (int64_t i = 0; i < cm_tensor_numel(out); i++) o[i] = o[i] * a + b;
    return CM_OK;
}

typedef struct {
    double smoothing;
    char *target_key;
    const char *name;  /* the target field this microbatch (borrowed from the batch) */
    cm_tensor *orig;   /* its tensor before BEFORE_LOSS */
} label_smoothing;

static bool ls_match(void *self, cm_event ev, const cm_state *st) {
    return ev == CM_EVENT_BEFORE_LOSS || ev == CM_EVENT_AFTER_LOSS;
}

static cm_status ls_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    label_smoothing *l = self;
    const char *who = "LabelSmoothing";
    if (ev == CM_EVENT_AFTER_LOSS) {
        if (!l->orig) return CM_OK;
        cm_status s = cm_state_set_batch_field(st, l->name, l->orig);
        l->orig = NULL;
        return s;
    }
    const cm_model_batch *mb = cm_state_model_batch(st);
    if (!mb) return cm_set_error(CM_ERR_STATE, "%s: there is no batch", who);
    const int f = cmi_da_field(mb->names, mb->n, l->target_key, 1, who, "target_key");
    if (f < 0) return cm_last_status();
    cm_tensor *y = mb->fields[f], *out = cm_state_outputs(st);
    char a[96], b[96];
    if (!out || cm_tensor_ndim(out) != 2 || cm_tensor_dtype(out) != CM_DTYPE_F32 || cm_tensor_dim(out, 0) != cm_tensor_dim(y, 0))
        return cm_set_error(CM_ERR_SHAPE, "%s: the outputs %s are not class logits (N, C) for target '%s' %s; "
                                          "LabelSmoothing applies to classifiers",
                            who, out ? cmi_da_desc(out, a, sizeof a) : "(none)", mb->names[f], cmi_da_desc(y, b, sizeof b));
    cm_tape *tp = cm_state_tape(st);
    /* smoothed on the host (a GPU run's target is copied back), then moved to the logits' device */
    cm_tensor *t = cm_empty_on(tp, CM_DEVICE_CPU, CM_DTYPE_F32, 2, cm_tensor_shape(out));
    cm_tensor *yh = cm_to_device(tp, y, CM_DEVICE_CPU);
    if (!t || !yh) return cm_tape_status(tp);
    cm_status s = cm_smooth_labels(out, yh, l->smoothing, t);
    if (s) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "%s: target '%s': %s", who, mb->names[f], msg);
    }
    if (!(t = cm_to_device(tp, t, cm_tensor_device(out)))) return cm_tape_status(tp);
    l->name = mb->names[f], l->orig = y;
    return cm_state_set_batch_field(st, l->name, t);
}

static void ls_free(void *self) {
    label_smoothing *l = self;
    if (!l) return;
    cm_free(l->target_key);
    cm_free(l);
}

static const cm_algorithm_i label_smoothing_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "LabelSmoothing",
    .match = ls_match,
    .apply = ls_apply,
    .free = ls_free,
};

cm_label_smoothing_config cm_label_smoothing_config_default(void) { return (cm_label_smoothing_config){0.1, NULL}; }

cm_status cm_label_smoothing_new(const cm_label_smoothing_config *cfg, cm_algorithm_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_label_smoothing_new: out is NULL");
    const cm_label_smoothing_config c = cfg ? *cfg : cm_label_smoothing_config_default();
    if (!(c.smoothing >= 0 && c.smoothing <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "LabelSmoothing: smoothing %g must be in [0, 1] (0: none, 1: uniform "
                                                "targets)",
                            c.smoothing);
    label_smoothing *l = cm_alloc_zeroed(sizeof *l, 16);
    if (!l || !cmi_da_dup_key(c.target_key, &l->target_key)) {
        ls_free(l);
        return cm_set_error(CM_ERR_OOM, "LabelSmoothing: out of memory");
    }
    l->smoothing = c.smoothing;
    *out = (cm_algorithm_plugin){&label_smoothing_vt, l};
    return CM_OK;
}
