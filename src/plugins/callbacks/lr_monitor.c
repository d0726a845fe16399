/* LRMonitor: the learning rate of each optimizer group at every batch end (Composer's LRMonitor). */
#include "cb_impl.h"

#include <stdio.h>

static const char *const class_names[] = {"SGD", "DecoupledSGDW", "Adam", "AdamW", "DecoupledAdamW"};
_Static_assert(sizeof class_names / sizeof *class_names == CM_OPTIM_KIND_COUNT, "optimizer class names");

const char *cm_optim_class_name(cm_optim_kind kind) {
    return (unsigned)kind < CM_OPTIM_KIND_COUNT ? class_names[kind] : "?";
}

static cm_status lr_run_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    if (ev != CM_EVENT_BATCH_END) return CM_OK;
    const cm_optim *o = cm_state_optimizer(st);
    if (!o) return cm_set_error(CM_ERR_STATE, "LRMonitor: the state has no optimizer");
    const char *cls = cm_optim_class_name(cm_optim_get_kind(o));
    const double mult = cm_state_lr_multiplier(st);
    for (int g = 0; g < cm_optim_n_groups(o); g++) {
        cm_optim_hparams hp;
        cm_status s = cm_optim_group_get(o, g, &hp);
        if (s) return s;
        char key[96];
        snprintf(key, sizeof key, "lr-%s/group%d", cls, g);
        if ((s = cm_logger_log_metric(lg, key, hp.lr * mult))) return s;
    }
    return CM_OK;
}

/* Stateless: self is a dummy allocation so the plugin has an owner like every other one. */
static void lr_free(void *self) { cm_free(self); }

static const cm_callback_i lr_monitor_vt = {
    .abi = CM_CALLBACK_ABI,
    .name = "LRMonitor",
    .run_event = lr_run_event,
    .free = lr_free,
};

cm_status cm_lr_monitor_new(cm_callback_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_lr_monitor_new: out is NULL");
    void *self = cm_alloc_zeroed(16, 16);
    if (!self) return CM_ERR_OOM;
    *out = (cm_callback_plugin){&lr_monitor_vt, self};
    return CM_OK;
}
