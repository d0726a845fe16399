/* The vision zoo's ResNets against PyTorch (tests/golden/gen_resnet.py): a CIFAR ResNet-20
 * (option-A shortcuts, widths reduced to 4/8/16), an ImageNet-stem ResNet-18 tree (widths 2..16)
 * and a bottleneck ResNet-50-style tree ([2,1,1,1], widths 2..16). Each loads PyTorch's
 * state_dict by name, then one train-mode step must give PyTorch's logits, loss, every parameter
 * gradient and the BatchNorm running statistics (momentum 0.1, num_batches_tracked + 1), and an
 * eval-mode forward with the updated statistics PyTorch's eval logits.
 *
 * Tolerances: up to 20 layers of f32 convolutions and batch norms with a different summation
 * order than PyTorch's. Logits and loss: 1e-4 abs + 1e-4 rel. Gradients: 1e-3 rel + an absolute
 * 1e-4 × the largest |gradient| of the same tensor — batch norm's backward subtracts sums of
 * similar size per channel, so the error scales with the tensor's gradients, not with each
 * element (measured worst: 1.2e-5 × the largest, ResNet-50's conv1).
 * Running statistics: 1e-5 abs + 1e-5 rel (means and variances of the same activations).
 * CM_GOLDEN_VERBOSE=1 prints each gradient's worst error relative to its largest value. */
#include "cmtest.h"
#include "tensor/dnnl_conv.h"

#include <composer/zoo_vision.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *k_path = "tests/golden/resnet.safetensors";

/* Strips "<case>.w." so the state_dict names match; other file names stay and are unexpected. */
static bool strip_prefix(const char *file_name, char *buf, size_t cap, void *data) {
    const char *pre = data;
    size_t n = strlen(pre);
    if (strncmp(file_name, pre, n)) return false;
    snprintf(buf, cap, "%s", file_name + n);
    return true;
}

static cm_tensor *gold(cmt_golden *g, const char *c, const char *what) {
    char key[256];
    snprintf(key, sizeof key, "%s.%s", c, what);
    return cmt_golden_get(g, key);
}

static void check_case(cmt_golden *g, const char *c, const cm_resnet_config *rc) {
    cm_model *model;
    cr_assert_eq(cm_resnet_model_new(rc, &model), CM_OK, "%s: %s", c, cm_last_error());
    cm_module *net = cm_model_module(model);

    char pre[32];
    snprintf(pre, sizeof pre, "%s.w.", c);
    cm_load_opts lo = cm_load_opts_default();
    lo.strict = false;
    lo.rename = strip_prefix;
    lo.rename_data = pre;
    cm_load_report rep;
    cr_assert_eq(cm_module_load_safetensors(net, k_path, &lo, &rep), CM_OK, "%s: %s", c, cm_last_error());
    cr_assert_eq(rep.n_missing, 0, "%s: names missing from PyTorch's state_dict: %s", c, rep.missing);
    cr_assert_eq(rep.n_loaded, cm_module_n_params(net) + cm_module_n_buffers(net), "%s: loaded %lld of %lld", c,
                 (long long)rep.n_loaded, (long long)(cm_module_n_params(net) + cm_module_n_buffers(net)));

    cm_tape *tp = cmt_tape();
    cm_tensor *x = gold(g, c, "x"), *y = gold(g, c, "y");
    const char *names[2] = {"image", "label"};
    cm_tensor *fields[2] = {x, y};
    cm_model_batch b = {names, fields, 2, cm_tensor_dim(x, 0), 0};
    cm_module_train(net, true);
    cm_tensor *logits = cm_model_forward(model, tp, &b);
    cr_assert(logits, "%s: %s", c, cm_tape_error(tp));
    char label[200];
    cm_tensor *want = gold(g, c, "logits");
    snprintf(label, sizeof label, "%s train logits", c);
    cmt_assert_close(label, logits, want, 1e-4, 1e-4);
    cm_tensor_free(want);
    cm_tensor *loss = cm_model_loss(model, tp, logits, &b);
    cr_assert(loss, "%s: %s", c, cm_tape_error(tp));
    want = gold(g, c, "loss");
    snprintf(label, sizeof label, "%s loss", c);
    cmt_assert_close(label, loss, want, 1e-4, 1e-4);
    cm_tensor_free(want);
    cr_assert_eq(cm_tape_backward(tp, loss), CM_OK, "%s: %s", c, cm_tape_error(tp));

    for (int64_t i = 0; i < cm_module_n_params(net); i++) {
        cm_param_info p = cm_module_param_info(net, i);
        snprintf(label, sizeof label, "g.%s", p.name);
        want = gold(g, c, label);
        snprintf(label, sizeof label, "%s gradient of %s", c, p.name);
        cr_assert(cm_tensor_grad(p.tensor), "%s: no gradient", label);
        double mr = 0, md = 0;
        for (int64_t k = 0; k < cm_tensor_numel(want); k++) {
            double r = cm_tensor_get_flat(want, k);
            mr = fmax(mr, fabs(r)), md = fmax(md, fabs(cm_tensor_get_flat(cm_tensor_grad(p.tensor), k) - r));
        }
        if (getenv("CM_GOLDEN_VERBOSE")) printf("%-50s max|diff| / max|ref| = %.3g\n", label, md / mr);
        cmt_assert_close(label, cm_tensor_grad(p.tensor), want, 1e-4 * mr + 1e-8, 1e-3);
        cm_tensor_free(want);
    }
    for (int64_t i = 0; i < cm_module_n_buffers(net); i++) {
        cm_buffer_info bi = cm_module_buffer_info(net, i);
        snprintf(label, sizeof label, "after.%s", bi.name);
        want = gold(g, c, label);
        snprintf(label, sizeof label, "%s %s after the train step", c, bi.name);
        cmt_assert_close(label, bi.tensor, want, 1e-5, 1e-5);
        cm_tensor_free(want);
    }

    cm_tape_reset(tp);
    cm_module_train(net, false);
    bool prev = cm_tape_set_grad_enabled(tp, false);
    cm_tensor *ev = cm_model_eval_forward(model, tp, &b);
    cm_tape_set_grad_enabled(tp, prev);
    cr_assert(ev, "%s: %s", c, cm_tape_error(tp));
    want = gold(g, c, "eval_logits");
    snprintf(label, sizeof label, "%s eval logits", c);
    cmt_assert_close(label, ev, want, 1e-4, 1e-4);
    cm_tensor_free(want);

    cm_tensor_free(x);
    cm_tensor_free(y);
    cm_tape_free(tp);
    cm_model_free(model);
}

/* The golden ResNet-20: widths 4/8/16, PyTorch's weights loaded over no random init, NCHW or
 * channels-last inside. */
static cm_resnet_config resnet20_golden(bool channels_last) {
    cm_resnet_config rc;
    cr_assert_eq(cm_resnet_config_preset("resnet20", &rc), CM_OK);
    const int64_t w[3] = {4, 8, 16};
    memcpy(rc.widths, w, sizeof w);
    rc.random_init = false;
    rc.channels_last = channels_last;
    return rc;
}

Test(golden_resnet, resnet20_cifar_option_a_step_matches_pytorch) {
    cmt_golden *g = cmt_golden_open(k_path);
    const cm_resnet_config rc = resnet20_golden(false); /* NCHW (the default is channels-last: below) */
    check_case(g, "r20", &rc);
    cmt_golden_close(g);
}

Test(golden_resnet, resnet18_tree_step_matches_pytorch) {
    cmt_golden *g = cmt_golden_open(k_path);
    cm_resnet_config rc;
    cr_assert_eq(cm_resnet_config_preset("resnet18", &rc), CM_OK);
    const int64_t w[4] = {2, 4, 8, 16};
    memcpy(rc.widths, w, sizeof w);
    rc.num_classes = 7;
    check_case(g, "rn18", &rc); /* random init on: loading must overwrite all of it */
    cmt_golden_close(g);
}

Test(golden_resnet, resnet50_bottleneck_tree_step_matches_pytorch) {
    cmt_golden *g = cmt_golden_open(k_path);
    cm_resnet_config rc;
    cr_assert_eq(cm_resnet_config_preset("resnet50", &rc), CM_OK);
    const int64_t w[4] = {2, 4, 8, 16};
    const int layers[4] = {2, 1, 1, 1};
    memcpy(rc.widths, w, sizeof w);
    memcpy(rc.layers, layers, sizeof layers);
    rc.num_classes = 5;
    rc.channels_last = false; /* bottlenecks and option B in NCHW too (resnet18 runs the default) */
    check_case(g, "rn50", &rc);
    cmt_golden_close(g);
}

Test(golden_resnet, channels_last_resnet20_matches_pytorch_too) {
    cmt_golden *g = cmt_golden_open(k_path);
    cm_resnet_config rc;
    cr_assert_eq(cm_resnet_config_preset("resnet20", &rc), CM_OK);
    const int64_t w[3] = {4, 8, 16};
    memcpy(rc.widths, w, sizeof w);
    cr_assert(rc.channels_last, "presets are channels-last");
    check_case(g, "r20", &rc);
    cmt_golden_close(g);
}

/* The same ResNet-20 step with every 3x3 stride-1 convolution on oneDNN's f32 Winograd kernel
 * (CMI_CONV_ALGO_WINOGRAD; the auto choice takes it only from 32 channels, so the reduced widths
 * here would not): the trained model matches PyTorch's (direct convolutions) within the same
 * tolerances, NCHW and channels-last (measured worst gradient error 4.3e-6 x the largest; 1.5e-6
 * with direct convolutions). */
Test(golden_resnet, resnet20_with_winograd_convolutions_matches_pytorch) {
    if (!cmi_conv_winograd_f32_available()) cr_skip_test("oneDNN has f32 Winograd kernels on AVX-512 only");
    cmi_conv_set_algo(CMI_CONV_ALGO_WINOGRAD);
    for (int cl = 0; cl < 2; cl++) {
        cmt_golden *g = cmt_golden_open(k_path);
        const cm_resnet_config rc = resnet20_golden(cl);
        cmi_conv_stats_reset();
        check_case(g, "r20", &rc);
        cmi_conv_stats st;
        cmi_conv_stats_get(&st);
        /* 17 stride-1 3x3 convolutions (stem + 18 block convolutions - 2 stride-2), train + eval
         * forward; the stem's input gradient is not wanted */
        const int64_t want[CMI_CONV_N_PASSES] = {34, 16, 17};
        for (int p = 0; p < CMI_CONV_N_PASSES; p++)
            cr_assert_eq(st.winograd[p], want[p], "%s pass %d: %lld on Winograd (want %lld)", cl ? "NHWC" : "NCHW", p,
                         (long long)st.winograd[p], (long long)want[p]);
        cmt_golden_close(g);
    }
    cmi_conv_set_algo(CMI_CONV_ALGO_AUTO);
}
