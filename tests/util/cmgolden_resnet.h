/* The golden ResNet step (tests/golden/gen_resnet.py, tests/golden/resnet.safetensors): loads
 * PyTorch's state_dict of case `c` ("r20", "rn18", "rn50") into the ResNet of `rc`, runs one
 * train-mode step on device `dev` and checks PyTorch's logits, loss, every parameter gradient and
 * the BatchNorm running statistics, then an eval-mode forward with the updated statistics. Used by
 * test_golden_resnet (CPU) and test_gpu_train (GPU). Tolerances are test_golden_resnet.c's. */
#ifndef CMGOLDEN_RESNET_H
#define CMGOLDEN_RESNET_H

#include "cmtest.h"

#include <composer/zoo_vision.h>

#define CMT_GOLDEN_RESNET "tests/golden/resnet.safetensors"

void cmt_golden_resnet_check(cmt_golden *g, const char *c, const cm_resnet_config *rc, cm_device dev);
/* The golden ResNet-20: widths 4/8/16, PyTorch's weights loaded over no random init, NCHW or
 * channels-last inside. */
cm_resnet_config cmt_golden_resnet20(bool channels_last);

#endif
