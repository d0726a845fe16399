/*
 * trainer_mnist — the Trainer on MNIST: an MLP classifier, DecoupledAdamW with a cosine schedule,
 * GradientClipping, microbatches, evaluation every epoch, metrics read back from an
 * InMemoryLogger.
 *
 *     build/examples/trainer_mnist [DATA_DIR] [MAX_DURATION] [PRECISION]
 *         (defaults: ../shared/data/mnist, 1ep, fp32; e.g. "300ba" amp_bf16)
 */
#include <composer/composer.h>
#include <composer/algorithms.h>
#include <composer/trainer.h>

#include <stdio.h>

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

    /* (B, 1, 28, 28) -> flatten -> 256 -> ReLU -> 10 */
    cm_rng rng = cm_rng_init(cfg.seed, 0);
    cm_module *net, *flat, *fc1, *act, *fc2;
    CHECK(cm_nn_sequential_new(&net));
    CHECK(cm_nn_flatten_new(1, &flat));
    CHECK(cm_nn_linear_new(784, 256, true, &rng, &fc1));
    CHECK(cm_nn_activation_new(CM_ACT_RELU, &act));
    CHECK(cm_nn_linear_new(256, 10, true, &rng, &fc2));
    cm_nn_sequential_append(net, flat);
    cm_nn_sequential_append(net, fc1);
    cm_nn_sequential_append(net, act);
    cm_nn_sequential_append(net, fc2);
    cm_classifier_config cc = cm_classifier_config_default();
    cc.input_field = "image";
    cm_model *model;
    CHECK(cm_model_classifier_new(net, &cc, &model));

    cm_module *root = cm_model_module(model);
    const cm_unit_info *u = cm_module_unit(root, 0);
    cm_optim *opt;
    cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_DECOUPLED_ADAMW);
    hp.lr = 2e-3;
    CHECK(cm_optim_new(CM_OPTIM_DECOUPLED_ADAMW, &opt));
    CHECK(cm_optim_add_group(opt, &hp, &(cm_optim_span){u->name, u->params, u->grads, u->numel}, 1));
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
    printf("%s: %lld batches in %.1f s, last train loss %.4f, test accuracy %.4f\n",
           cm_precision_name(cfg.precision), (long long)cm_state_timestamp(cm_trainer_state(tr))->batch,
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
