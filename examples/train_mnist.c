/*
 * train_mnist — the library API end to end, without the CLI: a model from the zoo (PyTorch's
 * MNIST example CNN, or the MLP), the MNIST datasets and dataloaders, and the Trainer with
 * DecoupledAdamW, a cosine schedule with warmup, GradientClipping, microbatches and evaluation
 * every epoch; the test accuracy is read back from an InMemoryLogger. (examples/mnist.yaml is the
 * same run as a config for `composer train`.)
 *
 *     build/examples/train_mnist [DATA_DIR] [MAX_DURATION] [PRECISION] [cnn|mlp]
 *         (defaults: ../shared/data/mnist, 1ep, fp32, cnn; e.g. "300ba" amp_bf16 mlp)
 */
#include <composer/composer.h>
#include <composer/algorithms.h>
#include <composer/trainer.h>
#include <composer/zoo_vision.h>

#include <stdio.h>
#include <string.h>

#define CHECK(call)                                                    \
    do {                                                               \
        if ((call) != CM_OK) {                                         \
            fprintf(stderr, "error: %s\n", cm_last_error());           \
            return 1;                                                  \
        }                                                              \
    } while (0)

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "../shared/data/mnist";
    cm_trainer_config cfg = cm_trainer_config_default();
    CHECK(cm_time_parse_named("max_duration", argc > 2 ? argv[2] : "1ep", &cfg.max_duration));
    if (argc > 3) CHECK(cm_precision_parse(argv[3], &cfg.precision));

    cm_dataset *train_ds, *test_ds;
    CHECK(cm_dataset_mnist_new(dir, CM_SPLIT_TRAIN, NULL, &train_ds));
    CHECK(cm_dataset_mnist_new(dir, CM_SPLIT_TEST, NULL, &test_ds));
    cm_dataloader_config lc = cm_dataloader_config_default();
    lc.batch_size = 128, lc.seed = cfg.seed, lc.num_workers = 1;
    cm_dataloader *train, *test;
    CHECK(cm_dataloader_new(train_ds, &lc, &train));
    cm_dataloader_config ec = cm_dataloader_config_eval();
    ec.batch_size = 1000;
    CHECK(cm_dataloader_new(test_ds, &ec, &test));

    /* the model: (B, 1, 28, 28) -> logits (B, 10) */
    bool mlp = argc > 4 && strcmp(argv[4], "mlp") == 0;
    cm_model *model;
    if (mlp) {
        cm_mlp_config mc;
        CHECK(cm_mlp_config_preset("mnist", &mc));
        mc.seed = cfg.seed;
        CHECK(cm_mlp_model_new(&mc, &model));
    } else {
        cm_cnn_config cc;
        CHECK(cm_cnn_config_preset("mnist", &cc));
        cc.seed = cfg.seed;
        CHECK(cm_cnn_model_new(&cc, &model));
    }

    /* DecoupledAdamW over the model's flat parameter buffers (one span per wrap unit) */
    cm_module *root = cm_model_module(model);
    cm_optim_span spans[16];
    int n_spans = cm_module_n_units(root);
    if (n_spans > 16) n_spans = 16;
    for (int i = 0; i < n_spans; i++) {
        const cm_unit_info *u = cm_module_unit(root, i);
        spans[i] = (cm_optim_span){u->name, u->params, u->grads, u->numel};
    }
    cm_optim *opt;
    cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_DECOUPLED_ADAMW);
    hp.lr = 2e-3;
    hp.weight_decay = 1e-4;
    CHECK(cm_optim_new(CM_OPTIM_DECOUPLED_ADAMW, &opt));
    CHECK(cm_optim_add_group(opt, &hp, spans, n_spans));
    cm_sched_config cos = cm_sched_config_default(CM_SCHED_COSINE_ANNEALING_WITH_WARMUP);
    CHECK(cm_time_parse("50ba", &cos.t_warmup));

    cm_algorithm_plugin clip;
    CHECK(cm_grad_clip_new(CM_GRAD_CLIP_NORM, 1.0, &clip));
    cm_in_memory_logger *mem;
    cm_logger_plugin memp;
    CHECK(cm_in_memory_logger_new(&mem, &memp));

    cfg.model = model;
    cfg.train_dataloader = train;
    cfg.eval_dataloader = test;
    cfg.optimizer = opt;
    cfg.schedulers = &cos, cfg.n_schedulers = 1;
    cfg.device_train_microbatch_size = 64;
    cfg.algorithms = &clip, cfg.n_algorithms = 1;
    cfg.loggers = &memp, cfg.n_loggers = 1;
    cm_trainer *tr;
    CHECK(cm_trainer_new(&cfg, &tr));
    double t0 = cm_clock_s();
    CHECK(cm_trainer_fit(tr, NULL));
    double loss, acc;
    CHECK(cm_in_memory_logger_last(mem, "loss/train/total", &loss));
    CHECK(cm_in_memory_logger_last(mem, "metrics/eval/MulticlassAccuracy", &acc));
    printf("%s %s: %lld batches in %.1f s, last train loss %.4f, test accuracy %.4f\n",
           mlp ? "mlp" : "cnn", cm_precision_name(cfg.precision), (long long)cm_state_timestamp(cm_trainer_state(tr))->batch,
           cm_clock_s() - t0, loss, acc);
    cm_trainer_free(tr);
    cm_optim_free(opt);
    cm_model_free(model);
    cm_dataloader_free(train);
    cm_dataloader_free(test);
    cm_dataset_free(train_ds);
    cm_dataset_free(test_ds);
    return 0;
}
