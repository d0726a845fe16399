#include "cmgolden_bert.h"

#include <composer/zoo_bert.h>
#include <stdio.h>

cm_model *cmt_golden_bert_model(bool mlm) {
    cm_bert_config cfg;
    cr_assert_eq(cm_bert_config_preset("test-tiny", &cfg), CM_OK);
    cfg.num_labels = 3;
    if (!mlm) cfg.hidden_dropout_prob = cfg.attention_probs_dropout_prob = 0.0f; /* train mode, p = 0 */
    cm_model *model;
    cr_assert_eq(mlm ? cm_bert_mlm_new(&cfg, NULL, &model) : cm_bert_classifier_new(&cfg, NULL, &model), CM_OK, "%s",
                 cm_last_error());
    if (mlm) cm_module_train(cm_model_module(model), false); /* eval mode: dropout off, gradients still recorded */
    char path[128];
    snprintf(path, sizeof path, "tests/golden/bert_%s.safetensors", mlm ? "mlm" : "cls");
    cm_load_report rep;
    cr_assert_eq(cm_bert_load_safetensors(model, path, NULL, &rep), CM_OK, "%s", cm_last_error());
    cr_assert_eq(rep.n_missing + rep.n_unexpected, 0, "missing [%s] unexpected [%s]", rep.missing, rep.unexpected);
    return model;
}
