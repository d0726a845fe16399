/* The resumption check of tests/util/cmalgo.h on its own: a run with no algorithm and one with
 * GradientClipping resume exactly on every model family; a deliberately broken algorithm (state
 * it does not save) is caught, so the check can fail. */
#include "cmalgo.h"
#include "cmtest.h"

#include <stdlib.h>
#include <string.h>

static int no_algos(cm_algorithm_plugin *out, int cap, void *data) { return 0; }

static int clip(cm_algorithm_plugin *out, int cap, void *data) {
    cr_assert_eq(cm_grad_clip_new(CM_GRAD_CLIP_NORM, 0.5, &out[0]), CM_OK);
    return 1;
}

Test(algo_resumption, plain_runs_resume_exactly_on_every_family) {
    cmt_rig_fn rigs[] = {cmt_rig_mlp, cmt_rig_cnn, cmt_rig_resnet, cmt_rig_gpt2};
    for (int i = 0; i < 4; i++) {
        cmt_resumption_opts o = cmt_resumption_opts_default();
        o.label = "no algorithm";
        cmt_check_algorithm_resumption(rigs[i], NULL, i % 2 ? clip : no_algos, NULL, &o);
    }
}

/* An algorithm with hidden state that it does not checkpoint: it scales the gradients by a
 * factor that grows every batch. The resumed run restarts the factor, so its batch-2 checkpoint
 * differs — the check must notice. */
typedef struct {
    float factor;
} leaky;
static bool leaky_match(void *self, cm_event ev, const cm_state *st) { return ev == CM_EVENT_AFTER_TRAIN_BATCH; }
static cm_status leaky_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    leaky *l = self;
    cm_module *root = cm_model_module(cm_state_model(st));
    for (int u = 0; u < cm_module_n_units(root); u++) {
        const cm_unit_info *ui = cm_module_unit(root, u);
        for (int64_t k = 0; k < ui->numel; k++) ui->grads[k] *= l->factor;
    }
    l->factor *= 3;
    return CM_OK;
}
static void leaky_free(void *self) { free(self); }
static const cm_algorithm_i leaky_vt = {.abi = CM_ALGORITHM_ABI, .name = "Leaky", .match = leaky_match,
                                        .apply = leaky_apply, .free = leaky_free};
static int leaky_algos(cm_algorithm_plugin *out, int cap, void *data) {
    leaky *l = calloc(1, sizeof *l);
    l->factor = 1;
    out[0] = (cm_algorithm_plugin){&leaky_vt, l};
    return 1;
}

Test(algo_resumption, unsaved_state_is_caught) {
    cmt_resumption_opts o = cmt_resumption_opts_default();
    o.run.adam = false; /* SGD: the step is proportional to the scaled gradient */
    o.label = "leaky";
    char msg[3000];
    cr_assert(cmt_algorithm_resumption_differs(cmt_rig_mlp, NULL, leaky_algos, NULL, &o, msg, sizeof msg),
              "a resumed run that lost the algorithm's state was not told apart");
    cr_expect(strstr(msg, "model.safetensors") && strstr(msg, "batch 2"), "%s", msg);
}
