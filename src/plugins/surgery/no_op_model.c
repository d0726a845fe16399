/* NoOpModel (Composer's NoOpModel): replaces the model with NoOpModelClass — one parameter
 * "weights" = [1.5]; forward returns the batch's target times it, the loss is the mean squared
 * error against the target, eval_forward returns the target — to measure everything but the
 * model (the data pipeline, the trainer's overhead). The target is the batch field Composer's
 * (x, y) tuple would give as y: "label", "labels" or "target" if present, else the last field.
 * No metrics (Composer's BinaryAccuracy compares these outputs with the targets; not here). */
#include "plugins/surgery/surgery_impl.h"

#include <string.h>

static cm_tensor *target(cm_tape *tp, const cm_model_batch *b) {
    static const char *const names[] = {"label", "labels", "target"};
    for (int i = 0; i < 3; i++) {
        cm_tensor *t = cm_model_batch_field(b, names[i]);
        if (t) return t;
    }
    if (b->n < 1) {
        cm_tape_fail(tp, CM_ERR_NOT_FOUND, "NoOpModelClass: the batch has no fields");
        return NULL;
    }
    return b->fields[b->n - 1];
}

static cm_tensor *as_f32(cm_tape *tp, cm_tensor *t) {
    return t && cm_tensor_dtype(t) != CM_DTYPE_F32 ? cm_cast(tp, t, CM_DTYPE_F32) : t;
}

typedef struct {
    cm_module *root;
} noop_model;

static cm_tensor *nm_forward(void *self, cm_tape *tp, const cm_model_batch *b) {
    noop_model *m = self;
    return cm_mul(tp, as_f32(tp, target(tp, b)), cm_module_param(m->root, "weights"));
}

static cm_tensor *nm_loss(void *self, cm_tape *tp, cm_tensor *outputs, const cm_model_batch *b) {
    return cm_mse_loss(tp, outputs, as_f32(tp, target(tp, b)), CM_REDUCTION_MEAN);
}

static cm_tensor *nm_eval_forward(void *self, cm_tape *tp, const cm_model_batch *b) { return as_f32(tp, target(tp, b)); }

static cm_module *nm_module(void *self) { return ((noop_model *)self)->root; }

static void nm_free(void *self) {
    noop_model *m = self;
    cm_module_free(m->root);
    cm_free(m);
}

static const cm_model_i nm_vt = {
    .abi = CM_MODEL_ABI,
    .type_name = "NoOpModelClass",
    .forward = nm_forward,
    .loss = nm_loss,
    .eval_forward = nm_eval_forward,
    .module = nm_module,
    .free_self = nm_free,
};

static cm_tensor *root_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    return cm_mul(tp, as_f32(tp, in[0]), cm_module_param(m, "weights"));
}

static const cm_module_i root_vt = {CM_MODULE_ABI, "NoOpModelClass", root_fwd, NULL, NULL};

cm_status cm_no_op_model_new_model(cm_model **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_no_op_model_new_model: out is NULL");
    *out = NULL;
    noop_model *m = cm_alloc_zeroed(sizeof *m, 16);
    if (!m) return CM_ERR_OOM;
    const int64_t one = 1;
    cm_tensor *w;
    cm_status st = cm_module_new(&root_vt, NULL, &m->root);
    if (!st) st = cm_module_add_param(m->root, "weights", 1, &one, false, &w);
    if (!st) st = cm_tensor_fill(w, 1.5);
    if (!st) st = cm_module_finalize(m->root);
    if (!st) st = cm_model_new(&nm_vt, m, out);
    if (st) {
        cm_module_free(m->root);
        cm_free(m);
    }
    return st;
}

/* ---- the algorithm ---- */

typedef struct {
    char unused;
    cm_model *model; /* made on the first INIT; the state uses it until the trainer is freed */
} nm_self;

static bool alg_match(void *self, cm_event ev, const cm_state *st) { return ev == CM_EVENT_INIT; }

static cm_status alg_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    nm_self *s = self;
    if (cm_state_model(st) && cm_state_model(st) == s->model) return CM_OK; /* applied already */
    cm_status r;
    if (!s->model && (r = cm_no_op_model_new_model(&s->model))) return r;
    if ((r = cm_state_set_model(st, s->model))) return r;
    cm_log_msg(CM_LOG_INFO, "NoOpModel: replaced the model with a NoOpModel");
    return CM_OK;
}

static void alg_free(void *self) {
    nm_self *s = self;
    cm_model_free(s->model);
    cm_free(s);
}

static const cm_algorithm_i nm_alg_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "NoOpModel",
    .match = alg_match,
    .apply = alg_apply,
    .free = alg_free,
};

cm_status cm_no_op_model_new(cm_algorithm_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_no_op_model_new: out is NULL");
    nm_self *s = cm_alloc_zeroed(sizeof *s, 16);
    if (!s) return CM_ERR_OOM;
    *out = (cm_algorithm_plugin){&nm_alg_vt, s};
    return CM_OK;
}

static void cfg_default(void *c) {}
static cm_status make(const void *c, cm_algorithm_plugin *out) { return cm_no_op_model_new(out); }

const cmi_algo_entry cmi_no_op_model_entry = {
    {"NoOpModel", "no_op_model", true, 0}, &nm_alg_vt, 1, cfg_default, NULL, 0, make,
};
