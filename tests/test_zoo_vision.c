/* The vision zoo: presets and their parameter counts against torchvision / PyTorch (counted with
 * the generator's hand-written torch ResNets and torchvision's published numbers), torchvision's
 * parameter names and order, wrap units, FLOPs against a torch forward-hook count, output shapes,
 * bad configs and inputs, a gradient check through each kind of residual block, zero-init
 * residuals, train/eval behaviour, save/load by name, and the activation memory of ResNet-56.
 *
 * Tolerances: gradchecks with the defaults (eps 1e-2, atol 1e-3, rtol 1e-2), on blocks whose ReLUs
 * are swapped for SiLU by surgery (no kinks);
 * channels-last vs NCHW 1e-5 (the same math in another memory order); save/load exact. */
#include "cmtest.h"

#include <composer/zoo_vision.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static cm_module *resnet_net(const char *preset, bool init) {
    cm_resnet_config rc;
    cr_assert_eq(cm_resnet_config_preset(preset, &rc), CM_OK, "%s", cm_last_error());
    rc.random_init = init;
    cm_module *m;
    cr_assert_eq(cm_resnet_new(&rc, &m), CM_OK, "%s: %s", preset, cm_last_error());
    cr_assert_eq(cm_module_finalize(m), CM_OK, "%s", cm_last_error());
    return m;
}

static cm_tensor *fwd(cm_module *m, cm_tape *tp, cm_tensor *x) {
    cm_tensor *y = cm_module_forward(m, tp, x);
    cr_assert(y, "%s forward: %s", cm_module_type_name(m), cm_tape_error(tp));
    return y;
}

/* ---- presets, counts, names ---- */

Test(zoo_vision, resnet_presets_have_the_reference_parameter_counts) {
    /* ImageNet: torchvision's numbers. CIFAR: option A (no shortcut parameters), counted with the
     * torch ResNets of tests/golden/gen_resnet.py; 101/152 (44,549,160 and 60,192,808 parameters)
     * are left out to keep the test small. */
    static const struct {
        const char *name;
        int64_t params, tensors, buffers;
    } k[] = {{"resnet18", 11689512, 62, 60},   {"resnet34", 21797672, 110, 108}, {"resnet50", 25557032, 161, 159},
             {"resnet20", 269722, 59, 57},     {"resnet32", 464154, 95, 93},     {"resnet44", 658586, 131, 129},
             {"resnet56", 853018, 167, 165},   {"resnet110", 1727962, 329, 327}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        cm_module *m = resnet_net(k[i].name, false);
        cr_assert_eq(cm_module_count_params(m, false), k[i].params, "%s: %lld parameters, expected %lld", k[i].name,
                     (long long)cm_module_count_params(m, false), (long long)k[i].params);
        cr_assert_eq(cm_module_n_params(m), k[i].tensors, "%s: %lld parameter tensors, expected %lld", k[i].name,
                     (long long)cm_module_n_params(m), (long long)k[i].tensors);
        cr_assert_eq(cm_module_n_buffers(m), k[i].buffers, "%s: %lld buffers, expected %lld", k[i].name,
                     (long long)cm_module_n_buffers(m), (long long)k[i].buffers);
        cm_module_free(m);
    }
    /* option B on the CIFAR net adds two 1x1 projections with batch norms: 272,474 */
    cm_resnet_config rc;
    cm_resnet_config_preset("resnet20", &rc);
    rc.shortcut = CM_RESNET_SHORTCUT_B;
    rc.random_init = false;
    cm_module *m;
    cr_assert_eq(cm_resnet_new(&rc, &m), CM_OK);
    cr_assert_eq(cm_module_count_params(m, false), 272474, "resnet20 option B: %lld",
                 (long long)cm_module_count_params(m, false));
    cr_assert(cm_module_find_param(m, "layer2.0.downsample.0.weight"));
    cm_module_free(m);
}

Test(zoo_vision, resnet_names_order_and_units_follow_torchvision) {
    cm_module *m = resnet_net("resnet50", false);
    cr_assert_str_eq(cm_module_param_info(m, 0).name, "conv1.weight");
    cr_assert_str_eq(cm_module_param_info(m, 1).name, "bn1.weight");
    cr_assert_str_eq(cm_module_param_info(m, 3).name, "layer1.0.conv1.weight");
    cr_assert_str_eq(cm_module_param_info(m, 12).name, "layer1.0.downsample.0.weight");
    cr_assert_str_eq(cm_module_param_info(m, cm_module_n_params(m) - 1).name, "fc.bias");
    cr_assert_str_eq(cm_module_buffer_info(m, 0).name, "bn1.running_mean");
    const char *must[] = {"layer4.2.conv3.weight", "layer4.2.bn3.weight", "layer3.5.bn2.bias",
                          "layer2.0.downsample.1.weight", "fc.weight"};
    for (size_t i = 0; i < sizeof must / sizeof must[0]; i++)
        cr_assert(cm_module_find_param(m, must[i]), "resnet50 has no parameter %s", must[i]);
    cr_assert(cm_module_find_buffer(m, "layer2.0.downsample.1.num_batches_tracked"));
    cr_assert_null(cm_module_find_param(m, "layer1.1.downsample.0.weight"), "identity blocks have no projection");
    cr_assert_eq(cm_tensor_dim(cm_module_find_param(m, "layer2.0.conv2.weight"), 0), 128);
    /* the stride sits on the 3x3 conv (v1.5) */
    cr_assert_str_eq(cm_module_type_name(cm_module_find(m, "layer2.0")), "Bottleneck");
    const char *units[] = {"stem", "layer1", "layer2", "layer3", "layer4", "head"};
    cr_assert_eq(cm_module_n_units(m), 6, "units: %d", cm_module_n_units(m));
    int64_t total = 0;
    for (int i = 0; i < 6; i++) {
        const cm_unit_info *u = cm_module_unit(m, i);
        bool found = false;
        for (int j = 0; j < 6; j++) found |= !strcmp(u->name, units[j]);
        cr_assert(found, "unexpected unit '%s'", u->name);
        total += u->numel;
        if (!strcmp(u->name, "stem")) cr_assert_eq(u->numel, 64 * 3 * 49 + 2 * 64, "stem: %lld", (long long)u->numel);
        if (!strcmp(u->name, "head")) cr_assert_eq(u->numel, 2048 * 1000 + 1000);
    }
    cr_assert_eq(total, 25557032);
    cm_module_free(m);

    /* CIFAR: no maxpool, 3x3 stem, option A has no downsample modules */
    m = resnet_net("resnet20", false);
    cr_assert_null(cm_module_child(m, "maxpool"));
    cr_assert_eq(cm_tensor_dim(cm_module_find_param(m, "conv1.weight"), 3), 3);
    cr_assert_null(cm_module_find(m, "layer2.0.downsample"));
    cr_assert_eq(cm_module_n_units(m), 5);
    cm_module_free(m);
}

Test(zoo_vision, mlp_and_cnn_presets_and_names) {
    cm_cnn_config cc;
    cr_assert_eq(cm_cnn_config_preset("mnist", &cc), CM_OK);
    cm_module *m;
    cr_assert_eq(cm_cnn_new(&cc, &m), CM_OK, "%s", cm_last_error());
    /* PyTorch's MNIST example: 320 + 18,496 + 1,179,776 + 1,290 */
    cr_assert_eq(cm_module_count_params(m, false), 1199882, "%lld", (long long)cm_module_count_params(m, false));
    const char *names[] = {"conv1.weight", "conv1.bias", "conv2.weight", "fc1.weight", "fc2.bias"};
    for (int i = 0; i < 5; i++) cr_assert(cm_module_find_param(m, names[i]), "no %s", names[i]);
    cr_assert_eq(cm_tensor_dim(cm_module_find_param(m, "fc1.weight"), 1), 9216);
    cm_module_free(m);
    cr_assert_eq(cm_cnn_config_preset("cifar10", &cc), CM_OK);
    cr_assert_eq(cm_cnn_new(&cc, &m), CM_OK);
    cr_assert_eq(cm_tensor_dim(cm_module_find_param(m, "fc1.weight"), 1), 64 * 14 * 14);
    cm_module_free(m);

    cm_mlp_config mc;
    cr_assert_eq(cm_mlp_config_preset("mnist", &mc), CM_OK);
    cr_assert_eq(cm_mlp_new(&mc, &m), CM_OK);
    cr_assert_eq(cm_module_count_params(m, false), 784 * 256 + 256 + 256 * 256 + 256 + 2570);
    cr_assert(cm_module_find_param(m, "1.weight") && cm_module_find_param(m, "3.weight") &&
              cm_module_find_param(m, "5.bias"));
    cm_module_free(m);
    cr_assert_eq(cm_mlp_config_preset("mnist_large", &mc), CM_OK);
    cr_assert_eq(cm_mlp_new(&mc, &m), CM_OK); /* Flatten, (Linear, ReLU, Dropout) x2, Linear */
    cr_assert_eq(cm_module_n_children(m), 8);
    cr_assert_str_eq(cm_module_type_name(cm_module_child(m, "3")), "Dropout");
    cm_module_free(m);
    mc.n_hidden = 0; /* logistic regression */
    cr_assert_eq(cm_mlp_new(&mc, &m), CM_OK);
    cr_assert_eq(cm_module_count_params(m, false), 7850);
    cm_module_free(m);
}

Test(zoo_vision, unknown_presets_list_the_valid_names_and_suggest_the_closest) {
    cm_resnet_config rc;
    cr_assert_eq(cm_resnet_config_preset("resnet21", &rc), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "'resnet21'") && strstr(cm_last_error(), "did you mean 'resnet20'") &&
                  strstr(cm_last_error(), "resnet152"),
              "%s", cm_last_error());
    cr_assert_eq(cm_resnet_config_preset("ResNet-50", &rc), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "did you mean 'resnet50'"), "%s", cm_last_error());
    cr_assert_eq(cm_resnet_config_preset("banana", &rc), CM_ERR_INVALID_ARG);
    cr_assert(!strstr(cm_last_error(), "did you mean") && strstr(cm_last_error(), "resnet18"), "%s", cm_last_error());
    cr_assert_eq(cm_resnet_config_preset(NULL, &rc), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_resnet_config_preset("resnet18", NULL), CM_ERR_INVALID_ARG);
    cm_cnn_config cc;
    cr_assert_eq(cm_cnn_config_preset("mnsit", &cc), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "did you mean 'mnist'") && strstr(cm_last_error(), "cifar10"), "%s",
              cm_last_error());
    cm_mlp_config mc;
    cr_assert_eq(cm_mlp_config_preset("mnist_smal", &mc), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "did you mean 'mnist_small'"), "%s", cm_last_error());
}

Test(zoo_vision, bad_configs_name_the_field) {
    cm_module *m = (cm_module *)1;
    cm_resnet_config rc = cm_resnet_config_default();
    rc.block = CM_RESNET_BOTTLENECK;
    rc.shortcut = CM_RESNET_SHORTCUT_A;
    cr_assert_eq(cm_resnet_new(&rc, &m), CM_ERR_INVALID_ARG);
    cr_assert_null(m);
    cr_assert(strstr(cm_last_error(), "SHORTCUT_B"), "%s", cm_last_error());
    rc = cm_resnet_config_default();
    rc.n_stages = 0;
    cr_assert_eq(cm_resnet_new(&rc, &m), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "n_stages 0"), "%s", cm_last_error());
    rc = cm_resnet_config_default();
    rc.widths[2] = 0;
    cr_assert_eq(cm_resnet_new(&rc, &m), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "stage 3"), "%s", cm_last_error());
    rc = cm_resnet_config_default();
    rc.bn_momentum = 2;
    cr_assert_eq(cm_resnet_new(&rc, &m), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "bn_momentum"), "%s", cm_last_error());
    rc = cm_resnet_config_default();
    cr_assert_eq(cm_resnet_block_new(&rc, 16, 16, 3, NULL, &m), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "stride 3"), "%s", cm_last_error());
    rc.shortcut = CM_RESNET_SHORTCUT_A;
    cr_assert_eq(cm_resnet_block_new(&rc, 32, 16, 1, NULL, &m), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "shrink"), "%s", cm_last_error());
    cr_assert_eq(cm_resnet_new(NULL, &m), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_resnet_new(&rc, NULL), CM_ERR_INVALID_ARG);

    cm_cnn_config cc = cm_cnn_config_default();
    cc.image_h = 5;
    cr_assert_eq(cm_cnn_new(&cc, &m), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "too small"), "%s", cm_last_error());
    cc = cm_cnn_config_default();
    cc.dropout2 = 1;
    cr_assert_eq(cm_cnn_new(&cc, &m), CM_ERR_INVALID_ARG);
    cm_mlp_config mc = cm_mlp_config_default();
    mc.n_hidden = CM_MLP_MAX_HIDDEN + 1;
    cr_assert_eq(cm_mlp_new(&mc, &m), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "n_hidden"), "%s", cm_last_error());
    mc = cm_mlp_config_default();
    mc.hidden[1] = -3;
    cr_assert_eq(cm_mlp_new(&mc, &m), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "hidden[1]"), "%s", cm_last_error());
    cm_model *model = (cm_model *)1;
    cr_assert_eq(cm_mlp_model_new(&mc, &model), CM_ERR_INVALID_ARG);
    cr_assert_null(model);
}

/* ---- FLOPs and the model interface ---- */

Test(zoo_vision, flops_match_a_torch_forward_hook_count) {
    /* multiply-adds of every Conv2d and Linear counted by forward hooks on the torch ResNets */
    cm_resnet_config rc;
    cm_resnet_config_preset("resnet18", &rc);
    cr_assert_eq(cm_resnet_forward_flops(&rc, 224, 224), 2.0 * 1814073344, "%.0f", cm_resnet_forward_flops(&rc, 224, 224));
    cr_assert_eq(cm_resnet_forward_flops(&rc, 37, 45), 2.0 * 90475456, "%.0f", cm_resnet_forward_flops(&rc, 37, 45));
    cm_resnet_config_preset("resnet50", &rc);
    cr_assert_eq(cm_resnet_forward_flops(&rc, 224, 224), 2.0 * 4089184256, "%.0f", cm_resnet_forward_flops(&rc, 224, 224));
    cm_resnet_config_preset("resnet20", &rc);
    cr_assert_eq(cm_resnet_forward_flops(&rc, 32, 32), 2.0 * 40551040);
    cm_resnet_config_preset("resnet56", &rc);
    cr_assert_eq(cm_resnet_forward_flops(&rc, 32, 32), 2.0 * 125485696);
    cr_assert_eq(cm_resnet_forward_flops(&rc, 0, 32), 0.0);
    cr_assert_eq(cm_resnet_forward_flops(NULL, 32, 32), 0.0);
    cm_cnn_config cc = cm_cnn_config_default();
    const double cnn = 2.0 * (32.0 * 9 * 26 * 26 + 32.0 * 64 * 9 * 24 * 24 + 9216.0 * 128 + 1280);
    cr_assert_eq(cm_cnn_forward_flops(&cc, 0, 0), cnn, "%.0f vs %.0f", cm_cnn_forward_flops(&cc, 0, 0), cnn);
    cm_mlp_config mc = cm_mlp_config_default();
    cr_assert_eq(cm_mlp_forward_flops(&mc), 2.0 * (784 * 256 + 256 * 256 + 2560));
}

Test(zoo_vision, models_forward_loss_metrics_and_flops_per_sample) {
    cm_resnet_config rc;
    cm_resnet_config_preset("resnet20", &rc);
    cm_model *model;
    cr_assert_eq(cm_resnet_model_new(&rc, &model), CM_OK, "%s", cm_last_error());
    cr_assert_str_eq(cm_model_type_name(model), "ComposerClassifier");
    cr_assert(cm_module_is_finalized(cm_model_module(model)));
    cm_tape *tp = cmt_tape();
    const int64_t xs[4] = {3, 3, 32, 32}, ys[1] = {3};
    cm_tensor *x = cmt_randn(tp, 4, xs, 1, false), *y = cmt_randint(tp, 1, ys, 2, 0, 10);
    const char *names[2] = {"image", "label"};
    cm_tensor *fields[2] = {x, y};
    cm_model_batch b = {names, fields, 2, 3, 0};
    cm_tensor *out = cm_model_forward(model, tp, &b);
    cr_assert(out, "%s", cm_tape_error(tp));
    cr_assert(cm_tensor_ndim(out) == 2 && cm_tensor_dim(out, 0) == 3 && cm_tensor_dim(out, 1) == 10);
    cm_tensor *loss = cm_model_loss(model, tp, out, &b);
    cr_assert(loss, "%s", cm_tape_error(tp));
    /* He init with zero-mean batch norms: logits are near zero, loss near log(10) */
    cr_assert(fabs(cm_tensor_get_flat(loss, 0) - log(10.0)) < 1.5, "loss %g", cm_tensor_get_flat(loss, 0));
    cr_assert_eq(cm_tape_backward(tp, loss), CM_OK, "%s", cm_tape_error(tp));
    cr_assert_eq(cm_model_n_metrics(model, true), 1);
    cr_assert_eq(cm_model_n_metrics(model, false), 2);
    cr_assert_str_eq(cm_model_metric(model, true, 0).vt->name, "MulticlassAccuracy");
    cr_assert_str_eq(cm_model_metric(model, false, 1).vt->name, "CrossEntropy");
    cr_assert_eq(cm_model_flops_per_sample(model, &b), 3 * 2.0 * 40551040);
    cr_assert(cm_model_eval_forward(model, tp, &b));
    /* FLOPs follow the batch's image size (progressive resizing) and are unknown without one */
    const int64_t xs2[4] = {1, 3, 16, 16};
    fields[0] = cmt_randn(tp, 4, xs2, 1, false);
    cr_assert_eq(cm_model_flops_per_sample(model, &b), 3 * cm_resnet_forward_flops(&rc, 16, 16));
    cm_model_batch nob = {names + 1, fields + 1, 1, 3, 0};
    cr_assert_eq(cm_model_flops_per_sample(model, &nob), 0.0);
    cr_assert_null(cm_model_forward(model, tp, &nob));
    cr_assert(strstr(cm_tape_error(tp), "'image'"), "%s", cm_tape_error(tp));
    cm_tape_free(tp);
    cm_model_free(model);

    /* CNN and MLP on MNIST-shaped batches */
    cm_cnn_config cc;
    cm_cnn_config_preset("mnist_small", &cc);
    cr_assert_eq(cm_cnn_model_new(&cc, &model), CM_OK);
    tp = cmt_tape();
    const int64_t ms[4] = {4, 1, 28, 28}, ls[1] = {4};
    fields[0] = cmt_randn(tp, 4, ms, 3, false);
    fields[1] = cmt_randint(tp, 1, ls, 4, 0, 10);
    b.n_samples = 4;
    out = cm_model_forward(model, tp, &b);
    cr_assert(out && cm_tensor_dim(out, 0) == 4 && cm_tensor_dim(out, 1) == 10, "%s", cm_tape_error(tp));
    cr_assert_eq(cm_tape_backward(tp, cm_model_loss(model, tp, out, &b)), CM_OK, "%s", cm_tape_error(tp));
    cr_assert_eq(cm_model_flops_per_sample(model, &b), 3 * cm_cnn_forward_flops(&cc, 28, 28));
    cm_model_free(model);
    cm_mlp_config mc = cm_mlp_config_default();
    cr_assert_eq(cm_mlp_model_new(&mc, &model), CM_OK);
    out = cm_model_forward(model, tp, &b);
    cr_assert(out && cm_tensor_dim(out, 1) == 10, "%s", cm_tape_error(tp));
    cr_assert_eq(cm_model_flops_per_sample(model, &b), 3 * cm_mlp_forward_flops(&mc));
    cm_model_free(model);
    cm_tape_free(tp);
}

Test(zoo_vision, wrong_input_shapes_are_shape_errors_naming_the_expected_shape) {
    cm_cnn_config cc;
    cm_cnn_config_preset("mnist_small", &cc);
    cm_module *m;
    cr_assert_eq(cm_cnn_new(&cc, &m), CM_OK);
    cm_tape *tp = cmt_tape();
    const int64_t xs[4] = {2, 1, 32, 32};
    cr_assert_null(cm_module_forward(m, tp, cmt_randn(tp, 4, xs, 1, false)));
    cmt_expect_error(tp, NULL, CM_ERR_SHAPE, "MnistCNN", "(B, 1, 28, 28)", NULL);
    cm_module_free(m);
    cm_tape_free(tp);
    m = resnet_net("resnet20", false);
    tp = cmt_tape();
    const int64_t gs[4] = {2, 1, 32, 32};
    cr_assert_null(cm_module_forward(m, tp, cmt_randn(tp, 4, gs, 1, false)));
    cmt_expect_error(tp, NULL, CM_ERR_SHAPE, "(2, 1, 32, 32)", "(B, 3, H, W)", NULL);
    cm_module_free(m);
    cm_tape_free(tp);
}

/* ---- blocks: gradients, zero init ---- */

typedef struct {
    cm_module *block;
} block_ctx;

static cm_tensor *block_fn(cm_tape *tp, cm_tensor *const *in, void *ctx) {
    return cm_module_forward(((block_ctx *)ctx)->block, tp, in[0]);
}

typedef struct {
    cm_tensor *params[32];
    int n;
    cm_rng rng;
} collect_ctx;

/* Lists every parameter; randomises batch norm weights and biases away from 1 and 0. */
static bool collect(cm_module *m, const char *path, int depth, void *data) {
    collect_ctx *c = data;
    bool bn = !strcmp(cm_module_type_name(m), "BatchNorm2d");
    for (int i = 0; i < cm_module_n_own_params(m) && c->n < 32; i++) {
        const char *nm;
        cm_tensor *t = cm_module_own_param_at(m, i, &nm);
        if (bn && !strcmp(nm, "weight")) cm_tensor_init_uniform(t, &c->rng, 0.5f, 1.5f);
        if (bn && !strcmp(nm, "bias")) cm_tensor_init_normal(t, &c->rng, 0.0f, 0.2f);
        c->params[c->n++] = t;
    }
    return true;
}

static cm_status make_silu(cm_module *old, const char *path, void *data, cm_module **out) {
    return cm_nn_activation_new(CM_ACT_SILU, out);
}

/* Checks d/dx and d/d(every parameter) of one block in training mode (batch statistics). */
static void gradcheck_block(const char *name, const cm_resnet_config *rc, int64_t in_c, int64_t planes, int stride) {
    cm_rng rng = cm_rng_init(5, 0);
    block_ctx ctx;
    cr_assert_eq(cm_resnet_block_new(rc, in_c, planes, stride, &rng, &ctx.block), CM_OK, "%s: %s", name,
                 cm_last_error());
    /* ReLU's kinks make central differences unreliable when a step crosses one (with batch
     * statistics every element moves); swap in SiLU by surgery — the block calls its "relu" slot,
     * so this also checks that surgery reaches the forward — and check the rest exactly */
    int64_t n_rep = 0;
    cr_assert_eq(cm_module_replace(ctx.block, cm_module_match_type, make_silu, (void *)"ReLU", &n_rep), CM_OK, "%s",
                 cm_last_error());
    cr_assert_eq(n_rep, 1, "%s: replaced %lld ReLU modules", name, (long long)n_rep);
    collect_ctx cc = {.n = 1, .rng = cm_rng_init(11, 0)};
    cm_module_visit(ctx.block, collect, &cc);
    cm_tape *tp = cmt_tape();
    const int64_t xs[4] = {2, in_c, 6, 6}, xl[4] = {2, 6, 6, in_c};
    cc.params[0] = cmt_randn(tp, 4, rc->channels_last ? xl : xs, 9, true);
    cmt_gradcheck_opts o = cmt_gradcheck_defaults();
    o.max_checks = 8;
    cmt_gradcheck(name, block_fn, &ctx, cc.n, cc.params, &o);
    cm_tape_free(tp);
    cm_module_free(ctx.block);
}

Test(zoo_vision, gradients_through_each_kind_of_residual_block) {
    cm_resnet_config rc = cm_resnet_config_default();
    cr_assert(rc.channels_last, "the default is channels-last");
    rc.channels_last = false;
    gradcheck_block("basic, identity shortcut", &rc, 3, 3, 1);
    gradcheck_block("basic, projection (B) stride 2", &rc, 2, 4, 2);
    rc.shortcut = CM_RESNET_SHORTCUT_A;
    gradcheck_block("basic, zero-padding (A) stride 2", &rc, 2, 4, 2);
    rc.channels_last = true;
    gradcheck_block("basic, option A, channels last", &rc, 2, 4, 2);
    rc = cm_resnet_config_default();
    rc.block = CM_RESNET_BOTTLENECK;
    rc.channels_last = false; /* channels-last bottlenecks: channels_last_gives_the_same_logits_and_gradients */
    gradcheck_block("bottleneck, projection stride 2", &rc, 4, 2, 2);
    gradcheck_block("bottleneck, identity", &rc, 8, 2, 1);
}

Test(zoo_vision, zero_init_residual_makes_blocks_start_as_identity) {
    cm_resnet_config rc;
    cm_resnet_config_preset("resnet20", &rc);
    rc.zero_init_residual = true;
    cm_module *m;
    cr_assert_eq(cm_resnet_new(&rc, &m), CM_OK);
    for (int s = 1; s <= 3; s++)
        for (int b = 0; b < 3; b++) {
            char nm[64];
            snprintf(nm, sizeof nm, "layer%d.%d.bn2.weight", s, b);
            cm_tensor *w = cm_module_find_param(m, nm);
            for (int64_t i = 0; i < cm_tensor_numel(w); i++)
                cr_assert_eq(cm_tensor_get_flat(w, i), 0.0, "%s[%lld] = %g", nm, (long long)i, cm_tensor_get_flat(w, i));
            snprintf(nm, sizeof nm, "layer%d.%d.bn1.weight", s, b);
            cr_assert_eq(cm_tensor_get_flat(cm_module_find_param(m, nm), 0), 1.0, "%s", nm);
        }
    /* the residual branch is zero: layer1 (identity shortcuts) maps a non-negative input to itself
     * (channels-last inside: (N, H, W, C)) */
    cm_tape *tp = cmt_tape();
    const int64_t xs[4] = {2, 8, 8, 16};
    cm_tensor *x = cm_relu(tp, cmt_randn(tp, 4, xs, 3, false));
    cmt_assert_close("layer1 with zero-init residuals", fwd(cm_module_child(m, "layer1"), tp, x), x, 0, 0);
    cm_tape_free(tp);
    cm_module_free(m);
    cm_resnet_config_preset("resnet50", &rc);
    rc.zero_init_residual = true;
    rc.random_init = false;
    cr_assert_eq(cm_resnet_new(&rc, &m), CM_OK);
    cr_assert_eq(cm_tensor_get_flat(cm_module_find_param(m, "layer3.4.bn3.weight"), 7), 0.0);
    cr_assert_eq(cm_tensor_get_flat(cm_module_find_param(m, "layer3.4.bn2.weight"), 7), 1.0);
    cr_assert_eq(cm_tensor_get_flat(cm_module_find_param(m, "layer3.0.downsample.1.weight"), 7), 1.0);
    cm_module_free(m);
}

Test(zoo_vision, init_follows_torchvision) {
    cm_module *m = resnet_net("resnet20", true);
    /* kaiming normal, fan_out, ReLU gain: std sqrt(2 / (out·9)) */
    cm_tensor *w = cm_module_find_param(m, "layer3.1.conv1.weight"); /* (64, 64, 3, 3) */
    double s2 = 0;
    for (int64_t i = 0; i < cm_tensor_numel(w); i++) s2 += cm_tensor_get_flat(w, i) * cm_tensor_get_flat(w, i);
    double std = sqrt(s2 / (double)cm_tensor_numel(w)), want = sqrt(2.0 / (64 * 9));
    cr_assert(fabs(std - want) < 0.03 * want, "conv std %g, expected %g (3%%)", std, want);
    cm_tensor *fw = cm_module_find_param(m, "fc.weight");
    for (int64_t i = 0; i < cm_tensor_numel(fw); i++)
        cr_assert(fabs(cm_tensor_get_flat(fw, i)) <= 1 / sqrt(64.0), "fc weight beyond PyTorch's bound 1/sqrt(64)");
    cr_assert_eq(cm_tensor_get_flat(cm_module_find_param(m, "layer2.0.bn1.weight"), 3), 1.0);
    cr_assert_eq(cm_tensor_get_flat(cm_module_find_param(m, "layer2.0.bn1.bias"), 3), 0.0);
    /* the seed decides the weights */
    cm_module *same = resnet_net("resnet20", true);
    cmt_assert_close("same seed", cm_module_find_param(same, "conv1.weight"), cm_module_find_param(m, "conv1.weight"),
                     0, 0);
    cm_resnet_config rc;
    cm_resnet_config_preset("resnet20", &rc);
    rc.seed = 1;
    cm_module *other;
    cr_assert_eq(cm_resnet_new(&rc, &other), CM_OK);
    cr_assert_neq(cm_tensor_get_flat(cm_module_find_param(other, "conv1.weight"), 0),
                  cm_tensor_get_flat(cm_module_find_param(m, "conv1.weight"), 0));
    cm_module_free(other);
    cm_module_free(same);
    cm_module_free(m);
}

/* ---- train/eval, layouts, save/load ---- */

static cm_resnet_config tiny_resnet18(void) {
    cm_resnet_config rc;
    cm_resnet_config_preset("resnet18", &rc);
    const int64_t w[4] = {4, 8, 8, 16};
    memcpy(rc.widths, w, sizeof w);
    rc.num_classes = 6;
    return rc;
}

Test(zoo_vision, train_mode_updates_batch_norm_statistics_and_eval_mode_does_not) {
    cm_resnet_config rc = tiny_resnet18();
    cm_module *m;
    cr_assert_eq(cm_resnet_new(&rc, &m), CM_OK);
    cr_assert_eq(cm_module_finalize(m), CM_OK);
    cm_tape *tp = cmt_tape();
    const int64_t xs[4] = {4, 3, 40, 40}, one[4] = {1, 3, 40, 40};
    cm_tensor *x = cmt_randn(tp, 4, xs, 1, false);
    cm_tensor *rm = cm_module_find_buffer(m, "layer2.0.bn1.running_mean");
    cm_tensor *nb = cm_module_find_buffer(m, "layer2.0.bn1.num_batches_tracked");
    cr_assert_eq(cm_tensor_get_flat(rm, 0), 0.0);
    cm_tensor *train_out = fwd(m, tp, x);
    cr_assert_neq(cm_tensor_get_flat(rm, 0), 0.0, "running_mean did not move in training");
    cr_assert_eq(cm_tensor_get_flat(nb, 0), 1.0);
    /* in training a sample's output depends on its batch (batch statistics) */
    cm_tensor *x0 = cm_narrow(tp, x, 0, 0, 1);
    cm_tensor *alone = fwd(m, tp, cm_contiguous(tp, x0));
    cr_assert(fabs(cm_tensor_get_flat(alone, 0) - cm_tensor_get_flat(train_out, 0)) > 1e-4);
    cm_module_train(m, false);
    cr_assert(!cm_module_is_training(cm_module_find(m, "layer3.1.bn2")));
    double before = cm_tensor_get_flat(rm, 0);
    cm_tensor *ev = fwd(m, tp, x);
    cr_assert_eq(cm_tensor_get_flat(rm, 0), before, "eval changed running_mean");
    cr_assert_eq(cm_tensor_get_flat(nb, 0), 2.0, "eval counted a batch");
    /* in eval a sample's output does not depend on the rest of the batch */
    cm_tensor *ev0 = fwd(m, tp, cmt_randn(tp, 4, one, 1, false));
    (void)ev0;
    cmt_assert_close("eval: sample alone vs in a batch", fwd(m, tp, cm_contiguous(tp, x0)), cm_narrow(tp, ev, 0, 0, 1),
                     1e-5, 1e-5);
    cm_tape_free(tp);
    cm_module_free(m);

    /* dropout in the CNN: active in training, off in eval */
    cm_cnn_config cc;
    cm_cnn_config_preset("mnist_small", &cc);
    cr_assert_eq(cm_cnn_new(&cc, &m), CM_OK);
    tp = cmt_tape();
    const int64_t ms[4] = {2, 1, 28, 28};
    x = cmt_randn(tp, 4, ms, 1, false);
    cm_tensor *a = fwd(m, tp, x), *b = fwd(m, tp, x);
    bool differ = false;
    for (int64_t i = 0; i < cm_tensor_numel(a); i++) differ |= cm_tensor_get_flat(a, i) != cm_tensor_get_flat(b, i);
    cr_assert(differ, "two training forwards gave the same output: dropout is not active");
    cm_module_train(m, false);
    cmt_assert_close("eval is deterministic", fwd(m, tp, x), fwd(m, tp, x), 0, 0);
    cm_tape_free(tp);
    cm_module_free(m);
}

/* Basic blocks (ResNet-18) and bottlenecks (ResNet-50), both with option-B projections. */
Test(zoo_vision, channels_last_gives_the_same_logits_and_gradients) {
    for (int bott = 0; bott < 2; bott++) {
        cm_resnet_config rc = tiny_resnet18();
        if (bott) {
            cr_assert_eq(cm_resnet_config_preset("resnet50", &rc), CM_OK);
            const int64_t w[4] = {2, 4, 4, 8};
            const int layers[4] = {1, 1, 1, 1};
            memcpy(rc.widths, w, sizeof w);
            memcpy(rc.layers, layers, sizeof layers);
            rc.num_classes = 6;
        }
        cm_module *a, *b;
        rc.channels_last = false;
        cr_assert_eq(cm_resnet_new(&rc, &a), CM_OK);
        rc.channels_last = true;
        cr_assert_eq(cm_resnet_new(&rc, &b), CM_OK);
        cr_assert_eq(cm_module_finalize(a), CM_OK);
        cr_assert_eq(cm_module_finalize(b), CM_OK);
        cm_tape *tp = cmt_tape(), *tp2 = cmt_tape();
        const int64_t xs[4] = {2, 3, 33, 29};
        cm_tensor *x = cmt_randn(tp, 4, xs, 4, false);
        cm_tensor *ya = fwd(a, tp, x), *yb = fwd(b, tp2, x);
        cmt_assert_close(bott ? "channels_last logits (bottleneck)" : "channels_last logits", yb, ya, 1e-5, 1e-4);
        cr_assert_eq(cm_tape_backward(tp, cm_sum(tp, ya, NULL, 0, false)), CM_OK);
        cr_assert_eq(cm_tape_backward(tp2, cm_sum(tp2, yb, NULL, 0, false)), CM_OK);
        const char *names[2][5] = {
            {"conv1.weight", "layer1.0.conv1.weight", "layer2.0.downsample.0.weight", "layer4.1.bn2.weight", NULL},
            {"conv1.weight", "layer1.0.conv3.weight", "layer2.0.downsample.0.weight", "layer2.0.conv2.weight",
             "layer4.0.bn3.weight"}};
        for (int i = 0; i < 5 && names[bott][i]; i++) {
            cm_tensor *ga = cm_tensor_grad(cm_module_find_param(a, names[bott][i]));
            cm_tensor *gb = cm_tensor_grad(cm_module_find_param(b, names[bott][i]));
            cmt_assert_close(names[bott][i], gb, ga, 1e-4, 1e-3);
        }
        cm_tape_free(tp);
        cm_tape_free(tp2);
        cm_module_free(a);
        cm_module_free(b);
    }
}

/* Under bf16 autocast a ResNet keeps PyTorch's autocast activations: the convolutions write bf16,
 * batch norm and its fused add + ReLU read and write bf16 (gradients stay f32); only the option-A
 * shortcut and the pooling take an f32 copy. Against the f32 model on the same weights and
 * batch: logits within bf16 noise and parameter gradients pointing the same way (cosine
 * similarity), for option A (CIFAR) and bottleneck blocks (option B), NCHW and channels-last, and
 * with SiLU swapped in by surgery (batch norm, add and activation then run as separate ops on an
 * f32 copy of batch norm's bf16 output); and the fused nets' tape arena peak (activations kept for
 * backward) below f32's. Measured: cosines 0.92-1.0
 * (with f32 activations and only the convolutions in bf16, as before: 0.84-1.0 on narrower
 * blocks, 0.96-1.0 on ResNet-20), arena 0.6x (ResNet-20) and 0.73x (the small bottleneck net,
 * where the stem and fc weigh more) of f32's. */
static double cosine(const cm_tensor *a, const cm_tensor *b) {
    double ab = 0, aa = 0, bb = 0;
    for (int64_t i = 0; i < cm_tensor_numel(a); i++) {
        const double x = cm_tensor_get_flat(a, i), y = cm_tensor_get_flat(b, i);
        ab += x * y, aa += x * x, bb += y * y;
    }
    return aa == 0 && bb == 0 ? 1.0 : ab / sqrt(aa * bb + 1e-300);
}

Test(zoo_vision, autocast_keeps_bf16_activations_and_tracks_the_f32_model) {
    for (int kind = 0; kind < 3; kind++) /* ResNet-20, bottleneck, ResNet-20 with SiLU (unfused path) */
        for (int cl = 0; cl < 2; cl++) {
            cm_resnet_config rc;
            cr_assert_eq(cm_resnet_config_preset(kind == 1 ? "resnet50" : "resnet20", &rc), CM_OK);
            if (kind == 1) {
                const int64_t w[4] = {16, 16, 32, 32};
                const int layers[4] = {1, 1, 1, 1};
                memcpy(rc.widths, w, sizeof w);
                memcpy(rc.layers, layers, sizeof layers);
                rc.num_classes = 6;
            }
            rc.random_init = true;
            rc.channels_last = cl;
            cm_module *m;
            cr_assert_eq(cm_resnet_new(&rc, &m), CM_OK, "%s", cm_last_error());
            if (kind == 2) { /* batch norm, add and activation as separate ops, bf16 out of batch norm */
                int64_t n_rep = 0;
                cr_assert_eq(cm_module_replace(m, cm_module_match_type, make_silu, (void *)"ReLU", &n_rep), CM_OK);
                cr_assert(n_rep > 0);
            }
            cr_assert_eq(cm_module_finalize(m), CM_OK);
            const int64_t xs[4] = {8, 3, 32, 32};
            cm_tensor *g[2][4];
            cm_tensor *logits[2];
            size_t peak[2];
            const char *names[4] = {"conv1.weight", kind == 1 ? "layer1.0.conv3.weight" : "layer1.0.conv1.weight",
                                    kind == 1 ? "layer2.0.downsample.0.weight" : "layer3.0.conv2.weight", "fc.weight"};
            cm_tape *tps[2];
            for (int amp = 0; amp < 2; amp++) {
                cm_tape *tp = tps[amp] = cmt_tape();
                cm_tensor *x = cmt_randn(tp, 4, xs, 11, false);
                cm_module_zero_grad(m);
                if (amp) cm_tape_set_autocast(tp, CM_DTYPE_BF16);
                cm_arena_reset_peak(cm_tape_arena(tp));
                if (amp) { /* the first convolution's output is bf16 */
                    cm_tensor *c1 = fwd(cm_module_find(m, "conv1"), tp,
                                        cl ? cm_contiguous(tp, cm_permute(tp, x, (const int[]){0, 2, 3, 1})) : x);
                    cr_assert_eq(cm_tensor_dtype(c1), CM_DTYPE_BF16, "conv1 under autocast writes bf16");
                    cm_tape_reset(tp);
                    cm_arena_reset_peak(cm_tape_arena(tp));
                    x = cmt_randn(tp, 4, xs, 11, false);
                }
                logits[amp] = fwd(m, tp, x);
                cr_assert_eq(cm_tensor_dtype(logits[amp]), CM_DTYPE_F32);
                cr_assert_eq(cm_tape_backward(tp, cm_sum(tp, cm_mul(tp, logits[amp], logits[amp]), NULL, 0, false)),
                             CM_OK, "%s", cm_tape_error(tp));
                peak[amp] = cm_arena_peak(cm_tape_arena(tp));
                for (int i = 0; i < 4; i++)
                    g[amp][i] = cm_clone_detached(tp, cm_tensor_grad(cm_module_find_param(m, names[i])));
            }
            char what[96];
            snprintf(what, sizeof what, "%s %s amp logits", kind == 1 ? "bottleneck" : kind ? "resnet20-silu" : "resnet20",
                     cl ? "NHWC" : "NCHW");
            cmt_assert_close(what, logits[1], logits[0], 0.05, 0.05);
            for (int i = 0; i < 4; i++) {
                const double c = cosine(g[1][i], g[0][i]);
                cr_assert(c > 0.88, "%s: grad %s cosine %.4f against f32", what, names[i], c);
            }
            /* the unfused path (kind 2) keeps an f32 copy of each batch norm output: no saving */
            if (kind < 2)
                cr_assert((double)peak[1] < 0.8 * (double)peak[0], "%s: arena peak %.2f MB against f32 %.2f MB", what,
                          peak[1] / 1e6, peak[0] / 1e6);
            cm_tape_free(tps[0]);
            cm_tape_free(tps[1]);
            cm_module_free(m);
        }
}

Test(zoo_vision, weights_round_trip_through_safetensors_by_name) {
    char path[128];
    snprintf(path, sizeof path, "/tmp/cm_zoo_vision_%d.safetensors", (int)getpid());
    cm_resnet_config rc;
    cm_resnet_config_preset("resnet20", &rc);
    cm_model *src, *dst;
    cr_assert_eq(cm_resnet_model_new(&rc, &src), CM_OK);
    cm_tape *tp = cmt_tape();
    const int64_t xs[4] = {2, 3, 32, 32};
    cm_tensor *x = cmt_randn(tp, 4, xs, 7, false);
    fwd(cm_model_module(src), tp, x); /* a training forward moves the running statistics */
    cr_assert_eq(cm_module_save_safetensors(cm_model_module(src), path), CM_OK, "%s", cm_last_error());
    rc.seed = 99;
    cr_assert_eq(cm_resnet_model_new(&rc, &dst), CM_OK);
    cr_assert_eq(cm_module_load_safetensors(cm_model_module(dst), path, NULL, NULL), CM_OK, "%s", cm_last_error());
    cm_module_train(cm_model_module(src), false);
    cm_module_train(cm_model_module(dst), false);
    cmt_assert_close("eval logits after the round trip", fwd(cm_model_module(dst), tp, x),
                     fwd(cm_model_module(src), tp, x), 0, 0);
    cr_assert_eq(cm_tensor_get_flat(cm_module_find_buffer(cm_model_module(dst), "bn1.num_batches_tracked"), 0), 1.0);
    cm_model_free(dst);
    /* a ResNet with other widths refuses the file, naming a tensor and both shapes */
    rc.widths[0] = 8;
    cr_assert_eq(cm_resnet_model_new(&rc, &dst), CM_OK);
    cr_assert_eq(cm_module_load_safetensors(cm_model_module(dst), path, NULL, NULL), CM_ERR_SHAPE);
    cr_assert(strstr(cm_last_error(), "conv1.weight"), "%s", cm_last_error());
    cm_model_free(dst);
    cm_model_free(src);
    cm_tape_free(tp);
    unlink(path);
}

Test(zoo_vision, resnet56_activations_stay_in_a_modest_arena) {
    /* forward + backward of ResNet-56 at 32x32: the tape's arena holds activations, saved
     * statistics and activation gradients. Measured about 6.6 MB per sample; the bound catches a
     * layer that saves far more than it needs (e.g. a copy per op). */
    cm_model *model;
    cm_resnet_config rc;
    cm_resnet_config_preset("resnet56", &rc);
    cr_assert_eq(cm_resnet_model_new(&rc, &model), CM_OK);
    cm_tape *tp = cmt_tape();
    const int64_t B = 4, xs[4] = {B, 3, 32, 32}, ys[1] = {B};
    const char *names[2] = {"image", "label"};
    cm_tensor *fields[2] = {cmt_randn(tp, 4, xs, 1, false), cmt_randint(tp, 1, ys, 2, 0, 10)};
    cm_model_batch b = {names, fields, 2, B, 0};
    cm_arena_reset_peak(cm_tape_arena(tp));
    cm_tensor *out = cm_model_forward(model, tp, &b);
    cr_assert_eq(cm_tape_backward(tp, cm_model_loss(model, tp, out, &b)), CM_OK, "%s", cm_tape_error(tp));
    double per_sample = (double)cm_arena_peak(cm_tape_arena(tp)) / (double)B;
    cr_assert(per_sample < 20e6, "ResNet-56 needs %.1f MB of arena per sample (bound 20 MB)", per_sample / 1e6);
    cm_tape_free(tp);
    cm_model_free(model);
}

Test(zoo_vision, constructors_fail_cleanly_at_every_allocation) {
    /* every allocation of a small option-A ResNet, a bottleneck ResNet with projections and the
     * models around them fails in turn: CM_ERR_OOM, nothing returned, nothing leaked (ASan) */
    cm_resnet_config a, b;
    cm_resnet_config_preset("resnet20", &a);
    const int64_t wa[3] = {2, 4, 4};
    const int la[3] = {1, 1, 1};
    memcpy(a.widths, wa, sizeof wa);
    memcpy(a.layers, la, sizeof la);
    cm_resnet_config_preset("resnet50", &b);
    const int64_t wb[4] = {1, 2, 2, 2};
    const int lb[4] = {2, 1, 1, 1};
    memcpy(b.widths, wb, sizeof wb);
    memcpy(b.layers, lb, sizeof lb);
    const cm_resnet_config *cfgs[2] = {&a, &b};
    cm_cnn_config cc;
    cm_cnn_config_preset("mnist_small", &cc);
    cm_mlp_config mc = cm_mlp_config_default();
    for (int which = 0; which < 4; which++) {
        int failures = 0;
        for (int64_t n = 1; n < 5000; n++) {
            cm_model *model = (cm_model *)1;
            cm_alloc_fail_at(n);
            cm_status st = which < 2 ? cm_resnet_model_new(cfgs[which], &model)
                           : which == 2 ? cm_cnn_model_new(&cc, &model)
                                        : cm_mlp_model_new(&mc, &model);
            cm_alloc_fail_at(0);
            if (st == CM_OK) {
                cm_model_free(model);
                break;
            }
            cr_assert_eq(st, CM_ERR_OOM, "model %d, allocation %lld: %s", which, (long long)n, cm_last_error());
            cr_assert_null(model);
            failures++;
        }
        cr_assert(failures > 10, "model %d: only %d allocations could fail", which, failures);
    }
}
