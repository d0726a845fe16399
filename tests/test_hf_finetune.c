/* Fine-tuning from a pretrained folder beats the same run from random weights: the golden
 * BertModel body (tests/golden/gen_hf_sst2.py: trained by the torch reference, saved without
 * pooler or classifier, F16, bare BertModel names) is loaded for sequence_classification — a new
 * pooler and classifier — and fine-tuned for 40 batches of SST-2 with DecoupledAdamW; its dev
 * accuracy must be well above chance and far above the identical run whose weights are not
 * loaded (pretrained: false). If loading silently skipped the body, the two runs would be the
 * same. A few seconds of training each. */
#include "cmtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BODY "tests/golden/hf/bert-sst2-body"
#define SST2 "../shared/data/sst2"

static cm_optim *adamw(cm_model *m, double lr) {
    cm_module *root = cm_model_module(m);
    int n = cm_module_n_units(root);
    cm_optim_span spans[16];
    cr_assert_leq(n, 16);
    for (int i = 0; i < n; i++) {
        const cm_unit_info *u = cm_module_unit(root, i);
        spans[i] = (cm_optim_span){u->name, u->params, u->grads, u->numel};
    }
    cm_optim *o;
    cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_DECOUPLED_ADAMW);
    hp.lr = lr;
    cr_assert_eq(cm_optim_new(CM_OPTIM_DECOUPLED_ADAMW, &o), CM_OK);
    cr_assert_eq(cm_optim_add_group(o, &hp, spans, n), CM_OK, "%s", cm_last_error());
    return o;
}

/* SST-2 dev accuracy after fine-tuning from the body (or from random weights). */
static double finetune(bool pretrained, cm_dataset *train, cm_dataset *dev, int64_t *n_new) {
    cm_hf_load_opts o = cm_hf_load_opts_default();
    o.task = CM_HF_TASK_SEQUENCE_CLASSIFICATION;
    o.num_labels = 2;
    o.pretrained = pretrained;
    o.seed = 11;
    cm_model *m;
    cm_hf_load_report rep;
    cr_assert_eq(cm_hf_load(BODY, &o, &m, &rep), CM_OK, "%s", cm_last_error());
    *n_new = rep.n_new;
    cm_dataloader_config lc = cm_dataloader_config_default();
    lc.batch_size = 32;
    lc.seed = 3;
    cm_dataloader *tl, *el;
    cr_assert_eq(cm_dataloader_new(train, &lc, &tl), CM_OK, "%s", cm_last_error());
    cm_dataloader_config ec = cm_dataloader_config_eval();
    ec.batch_size = 256;
    cr_assert_eq(cm_dataloader_new(dev, &ec, &el), CM_OK, "%s", cm_last_error());
    cm_optim *opt = adamw(m, 2e-3);
    cm_sched_config sc = cm_sched_config_default(CM_SCHED_LINEAR_WITH_WARMUP);
    cr_assert_eq(cm_time_parse("4ba", &sc.t_warmup), CM_OK);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = m, c.train_dataloader = tl, c.eval_dataloader = el, c.optimizer = opt;
    c.schedulers = &sc, c.n_schedulers = 1;
    c.max_duration = cm_time_make(40, CM_TIME_BATCH);
    c.eval_interval = cm_time_make(40, CM_TIME_BATCH);
    c.seed = 5;
    c.progress_bar = false;
    cm_trainer *tr;
    cr_assert_eq(cm_trainer_new(&c, &tr), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_fit(tr, NULL), CM_OK, "%s", cm_last_error());
    double acc;
    cr_assert_eq(cm_state_metric(cm_trainer_state(tr), "eval", "MulticlassAccuracy", &acc), CM_OK, "%s",
                 cm_last_error());
    cm_trainer_free(tr);
    cm_optim_free(opt);
    cm_dataloader_free(tl);
    cm_dataloader_free(el);
    cm_model_free(m);
    return acc;
}

Test(hf_finetune, pretrained_body_beats_random_weights_on_sst2, .timeout = 600) {
    cm_tokenizer *tok;
    cm_hf_tokenizer_info ti;
    cr_assert_eq(cm_hf_tokenizer_load(BODY, &tok, &ti), CM_OK, "%s", cm_last_error());
    cr_assert_eq(ti.model_max_length, 64);
    /* 40 batches of 32 draw from the first 4000 training rows (tokenising all 67k costs more than
     * the fine-tuning) */
    cm_dataset *train, *dev;
    char path[] = "/tmp/cmhfft-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0, "mkstemp");
    close(fd);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "head -4001 %s/train.tsv > %s", SST2, path);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    cr_assert_eq(cm_dataset_sst2_new(path, tok, 48, &train), CM_OK, "%s", cm_last_error());
    unlink(path);
    cr_assert_eq(cm_dataset_sst2_new(SST2 "/dev.tsv", tok, 64, &dev), CM_OK, "%s", cm_last_error());
    int64_t new_p, new_r;
    const double pre = finetune(true, train, dev, &new_p);
    const double rnd = finetune(false, train, dev, &new_r);
    cr_assert_eq(new_p, 4, "the body has no pooler or classifier: 4 new tensors, got %lld", (long long)new_p);
    cr_log_info("SST-2 dev accuracy after 40 batches: %.4f from the pretrained body, %.4f from random weights", pre, rnd);
    cr_assert_gt(pre, 0.70, "fine-tuned from the pretrained body: dev accuracy %.4f (want > 0.70; chance 0.51)", pre);
    cr_assert_gt(pre - rnd, 0.08, "pretrained %.4f vs random %.4f: the pretrained weights gave less than 8 points", pre,
                 rnd);
    cm_dataset_free(train);
    cm_dataset_free(dev);
    cm_tokenizer_free(tok);
}
