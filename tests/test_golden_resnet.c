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
 * CM_GOLDEN_VERBOSE=1 prints each gradient's worst error relative to its largest value. The step
 * and its checks are tests/util/cmgolden_resnet.c; test_gpu_train runs the same on the GPU. */
#include "cmgolden_resnet.h"
#include "cmtest.h"
#include "tensor/dnnl_conv.h"

#include <composer/zoo_vision.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

Test(golden_resnet, resnet20_cifar_option_a_step_matches_pytorch) {
    cmt_golden *g = cmt_golden_open(CMT_GOLDEN_RESNET);
    const cm_resnet_config rc = cmt_golden_resnet20(false); /* NCHW (the default is channels-last: below) */
    cmt_golden_resnet_check(g, "r20", &rc, CM_DEVICE_CPU);
    cmt_golden_close(g);
}

Test(golden_resnet, resnet18_tree_step_matches_pytorch) {
    cmt_golden *g = cmt_golden_open(CMT_GOLDEN_RESNET);
    cm_resnet_config rc;
    cr_assert_eq(cm_resnet_config_preset("resnet18", &rc), CM_OK);
    const int64_t w[4] = {2, 4, 8, 16};
    memcpy(rc.widths, w, sizeof w);
    rc.num_classes = 7;
    cmt_golden_resnet_check(g, "rn18", &rc, CM_DEVICE_CPU); /* random init on: loading must overwrite all of it */
    cmt_golden_close(g);
}

Test(golden_resnet, resnet50_bottleneck_tree_step_matches_pytorch) {
    cmt_golden *g = cmt_golden_open(CMT_GOLDEN_RESNET);
    cm_resnet_config rc;
    cr_assert_eq(cm_resnet_config_preset("resnet50", &rc), CM_OK);
    const int64_t w[4] = {2, 4, 8, 16};
    const int layers[4] = {2, 1, 1, 1};
    memcpy(rc.widths, w, sizeof w);
    memcpy(rc.layers, layers, sizeof layers);
    rc.num_classes = 5;
    rc.channels_last = false; /* bottlenecks and option B in NCHW too (resnet18 runs the default) */
    cmt_golden_resnet_check(g, "rn50", &rc, CM_DEVICE_CPU);
    cmt_golden_close(g);
}

Test(golden_resnet, channels_last_resnet20_matches_pytorch_too) {
    cmt_golden *g = cmt_golden_open(CMT_GOLDEN_RESNET);
    cm_resnet_config rc;
    cr_assert_eq(cm_resnet_config_preset("resnet20", &rc), CM_OK);
    const int64_t w[3] = {4, 8, 16};
    memcpy(rc.widths, w, sizeof w);
    cr_assert(rc.channels_last, "presets are channels-last");
    cmt_golden_resnet_check(g, "r20", &rc, CM_DEVICE_CPU);
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
        cmt_golden *g = cmt_golden_open(CMT_GOLDEN_RESNET);
        const cm_resnet_config rc = cmt_golden_resnet20(cl);
        cmi_conv_stats_reset();
        cmt_golden_resnet_check(g, "r20", &rc, CM_DEVICE_CPU);
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
