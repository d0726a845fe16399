/* Shared by the vision zoo: "did you mean" for preset names, and the model wrapper that puts a
 * network behind model.h's classifier and reports FLOPs for each batch's image size. */
#include "zoo/zoo_vision_impl.h"

#include <stdio.h>
#include <string.h>

cm_status cmz_unknown_preset(const char *fn, const char *name, const char *const *names, int n) {
    char list[512];
    size_t len = 0;
    list[0] = '\0';
    int best = -1, best_d = 1 << 30;
    for (int i = 0; i < n; i++) {
        int w = snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "", names[i]);
        if (w > 0 && (size_t)w < sizeof list - len) len += (size_t)w;
        if (name) {
            int d = cm_edit_distance(name, names[i]);
            if (d < best_d) best_d = d, best = i;
        }
    }
    if (!name) return cm_set_error(CM_ERR_INVALID_ARG, "%s: preset name is NULL (valid: %s)", fn, list);
    /* a suggestion only when it is plausibly a typo: at most a third of the name differs */
    int slen = (int)strnlen(name, 63);
    if (best >= 0 && best_d <= (slen > 3 ? slen / 3 + 1 : 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: unknown preset '%s' (did you mean '%s'? valid: %s)", fn, name,
                            names[best], list);
    return cm_set_error(CM_ERR_INVALID_ARG, "%s: unknown preset '%s' (valid: %s)", fn, name, list);
}

cm_status cmz_fail_build(cm_module **m, cm_status st) {
    cm_module_free(*m);
    *m = NULL;
    return st;
}

/* ---- the model wrapper ---- */

typedef struct {
    cm_model *inner; /* the classifier; owns the network */
    cmz_flops_fn flops;
    void *cfg;
} vision_model;

static cm_tensor *vm_forward(void *self, cm_tape *tp, const cm_model_batch *b) {
    return cm_model_forward(((vision_model *)self)->inner, tp, b);
}
static cm_tensor *vm_loss(void *self, cm_tape *tp, cm_tensor *out, const cm_model_batch *b) {
    return cm_model_loss(((vision_model *)self)->inner, tp, out, b);
}
static cm_tensor *vm_eval_forward(void *self, cm_tape *tp, const cm_model_batch *b) {
    return cm_model_eval_forward(((vision_model *)self)->inner, tp, b);
}
static int vm_n_metrics(void *self, bool train) { return cm_model_n_metrics(((vision_model *)self)->inner, train); }
static cm_metric vm_metric(void *self, bool train, int i) {
    return cm_model_metric(((vision_model *)self)->inner, train, i);
}
/* Forward + backward ≈ 3 × forward (the backward computes gradients for inputs and weights). */
static double vm_flops(void *self, const cm_model_batch *b) {
    vision_model *v = self;
    cm_tensor *x = cm_model_batch_field(b, "image");
    if (!x || cm_tensor_ndim(x) != 4) return 0.0;
    return 3.0 * v->flops(v->cfg, cm_tensor_dim(x, 2), cm_tensor_dim(x, 3));
}
static cm_module *vm_module(void *self) { return cm_model_module(((vision_model *)self)->inner); }
static void vm_free(void *self) {
    vision_model *v = self;
    cm_model_free(v->inner);
    cm_free(v->cfg);
    cm_free(v);
}

static const cm_model_i vision_vt = {CM_MODEL_ABI, "ComposerClassifier", vm_forward, vm_loss, vm_eval_forward,
                                     vm_n_metrics, vm_metric, vm_flops, vm_module, vm_free};

cm_status cmz_vision_model_new(cm_module *net, cmz_flops_fn flops, const void *cfg, size_t cfg_bytes,
                               cm_model **out) {
    *out = NULL;
    vision_model *v = cm_alloc_zeroed(sizeof *v, 8);
    void *c = cm_alloc(cfg_bytes, 8);
    if (!v || !c) {
        cm_free(v);
        cm_free(c);
        cm_module_free(net);
        return CM_ERR_OOM;
    }
    memcpy(c, cfg, cfg_bytes);
    v->flops = flops, v->cfg = c;
    cm_classifier_config cc = cm_classifier_config_default();
    cc.input_field = "image";
    cc.target_field = "label";
    cm_status st = cm_model_classifier_new(net, &cc, &v->inner);
    if (st) {
        cm_module_free(net);
        vm_free(v);
        return st;
    }
    if ((st = cm_model_new(&vision_vt, v, out))) {
        vm_free(v);
        return st;
    }
    return CM_OK;
}
