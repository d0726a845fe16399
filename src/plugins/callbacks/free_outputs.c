/* FreeOutputs (Composer's): drops the state's outputs after the loss. */
#include "cb_impl.h"

static cm_status fo_run_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    if (ev == CM_EVENT_AFTER_LOSS) cm_state_free_outputs(st);
    return CM_OK;
}

static void fo_free(void *self) { cm_free(self); }

static const cm_callback_i free_outputs_vt = {
    .abi = CM_CALLBACK_ABI,
    .name = "FreeOutputs",
    .run_event = fo_run_event,
    .free = fo_free,
};

cm_status cm_free_outputs_new(cm_callback_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_free_outputs_new: out is NULL");
    void *self = cm_alloc_zeroed(16, 16);
    if (!self) return cm_set_error(CM_ERR_OOM, "FreeOutputs: out of memory");
    *out = (cm_callback_plugin){&free_outputs_vt, self};
    return CM_OK;
}
