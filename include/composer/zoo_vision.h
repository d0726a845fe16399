/*
 * composer/zoo_vision.h — the vision models of the zoo: an MLP and a small CNN for MNIST, ResNets
 * for CIFAR (ResNet-20/32/44/56/110) and ImageNet-style ResNets (ResNet-18/34/50/101/152).
 *
 * Each model has a transparent config struct with cm_<model>_config_default(), named presets
 * (cm_<model>_config_preset("resnet56", &cfg)), a constructor for the bare network (a cm_module
 * tree, not yet finalized, so surgery can run first) and one for a ready model (cm_model, model.h):
 * a classifier whose forward reads the batch field "image" (B, C, H, W) f32 — as the MNIST and
 * CIFAR-10 datasets produce it — and returns logits (B, num_classes); its loss is the
 * cross-entropy against the field "label"; it reports MulticlassAccuracy in training and
 * MulticlassAccuracy and CrossEntropy in evaluation, and its FLOPs per sample (forward + backward
 * = 3 × the forward's multiply-adds × 2, counting convolutions and linear layers only) for the
 * batch's image size.
 *
 * Parameter names are PyTorch's for the same network, so weights move in and out by name with
 * cm_module_load_safetensors / cm_module_save_safetensors (nn.h): the ResNets use torchvision's
 * names (conv1, bn1, layer1.0.conv1, layer1.0.downsample.0, layer2.1.bn2.running_mean, fc), so a
 * torchvision ResNet-18/50 state_dict saved as safetensors loads unchanged; the CNN uses the names
 * of PyTorch's MNIST example (conv1, conv2, fc1, fc2); the MLP is an nn.Sequential (1.weight, ...).
 *
 *     cm_resnet_config rc;
 *     if (cm_resnet_config_preset("resnet56", &rc) != CM_OK)   // unknown names list the valid ones
 *         fprintf(stderr, "%s\n", cm_last_error());
 *     rc.zero_init_residual = true;
 *     cm_model *model;
 *     if (cm_resnet_model_new(&rc, &model) != CM_OK) fprintf(stderr, "%s\n", cm_last_error());
 *     cm_module *net = cm_model_module(model);                  // finalized: units stem, layer1..3, head
 *     const char *names[2] = {"image", "label"};
 *     cm_tensor *fields[2] = {images, labels};                  // (B, 3, 32, 32) f32, (B) i64
 *     cm_model_batch b = {names, fields, 2, B, 0};
 *     cm_tensor *logits = cm_model_forward(model, tp, &b);      // (B, 10)
 *     cm_tensor *loss = cm_model_loss(model, tp, logits, &b);
 *     cm_tape_backward(tp, loss);                               // gradients in the flat buffers
 *     cm_model_free(model);                                     // frees net too
 *
 * Threading: constructors are thread-safe (they touch only what they create); a model is used by
 * one thread at a time, as its module tree.
 */
#ifndef COMPOSER_ZOO_VISION_H
#define COMPOSER_ZOO_VISION_H

#include <composer/model.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * MLP
 * ------------------------------------------------------------------------------------------- */

#define CM_MLP_MAX_HIDDEN 8

/* A multi-layer perceptron on flattened images: nn.Sequential(Flatten, Linear, act, [Dropout],
 * Linear, act, [Dropout], ..., Linear) — module names are the indices ("1.weight" is the first
 * Linear's), as the same nn.Sequential in PyTorch. Linear layers use PyTorch's default init. */
typedef struct cm_mlp_config {
    int64_t in_features;                 /* 784 (C·H·W of the image) */
    int64_t hidden[CM_MLP_MAX_HIDDEN];   /* {256, 256} */
    int n_hidden;                        /* 2 (0 = logistic regression) */
    int64_t num_classes;                 /* 10 */
    cm_activation act;                   /* CM_ACT_RELU */
    float dropout;                       /* 0: no Dropout modules */
    uint64_t seed;                       /* 0: the initialisation's Philox seed */
    bool random_init;                    /* true; false leaves weights zero (to load them) */
} cm_mlp_config;

cm_mlp_config cm_mlp_config_default(void);
/* Presets: "mnist" (784-256-256-10, ReLU: the default), "mnist_small" (784-128-10),
 * "mnist_large" (784-512-512-10, dropout 0.2). Errors: CM_ERR_INVALID_ARG for an unknown name (the
 * message lists the valid names and suggests the closest), or NULL arguments. */
cm_status cm_mlp_config_preset(const char *name, cm_mlp_config *out);
/* The network ("Sequential"), not finalized; the caller owns it. Errors: CM_ERR_INVALID_ARG naming
 * the bad field (sizes < 1, n_hidden out of [0, CM_MLP_MAX_HIDDEN], dropout not in [0, 1)),
 * CM_ERR_OOM. */
cm_status cm_mlp_new(const cm_mlp_config *cfg, cm_module **out);
/* The classifier model over cm_mlp_new's network (see the overview); the caller frees it with
 * cm_model_free. Errors as cm_mlp_new. */
cm_status cm_mlp_model_new(const cm_mlp_config *cfg, cm_model **out);
/* Multiply-add FLOPs (2 per MAC) of one sample's forward pass. */
double cm_mlp_forward_flops(const cm_mlp_config *cfg);

/* ---------------------------------------------------------------------------------------------
 * CNN (PyTorch's MNIST example network)
 * ------------------------------------------------------------------------------------------- */

/* conv1 (in → c1, 3×3) - ReLU - conv2 (c1 → c2, 3×3) - ReLU - max pool 2 - dropout1 - flatten -
 * fc1 (c2·((H-4)/2)·((W-4)/2) → hidden) - ReLU - dropout2 - fc2 (hidden → classes); type
 * "MnistCNN", children conv1, conv2, dropout1, dropout2, fc1, fc2 as in
 * github.com/pytorch/examples mnist/main.py (whose log_softmax output is left out: the loss
 * takes logits). PyTorch's default init. (The PyTorch example reports about 99% MNIST test
 * accuracy after one epoch of Adadelta, lr 1.) */
typedef struct cm_cnn_config {
    int64_t in_channels;   /* 1 */
    int64_t image_h, image_w; /* 28, 28 (the fc1 size depends on them) */
    int64_t channels[2];   /* {32, 64} */
    int64_t hidden;        /* 128 */
    int64_t num_classes;   /* 10 */
    float dropout1, dropout2; /* 0.25, 0.5 */
    uint64_t seed;         /* 0 */
    bool random_init;      /* true */
} cm_cnn_config;

cm_cnn_config cm_cnn_config_default(void);
/* Presets: "mnist" (the default), "mnist_small" (channels 8/16, hidden 64), "cifar10" (3×32×32
 * input). Errors as cm_mlp_config_preset. */
cm_status cm_cnn_config_preset(const char *name, cm_cnn_config *out);
/* Errors: CM_ERR_INVALID_ARG naming the bad field (sizes < 1, an image smaller than 6×6,
 * dropouts not in [0, 1)), CM_ERR_OOM. The network expects inputs of the configured size. */
cm_status cm_cnn_new(const cm_cnn_config *cfg, cm_module **out);
cm_status cm_cnn_model_new(const cm_cnn_config *cfg, cm_model **out);
/* Forward FLOPs of one sample of h × w pixels (the configured size when h or w is 0). */
double cm_cnn_forward_flops(const cm_cnn_config *cfg, int64_t h, int64_t w);
/* Switches a MnistCNN network's activations between (N, C, H, W) and (N, H, W, C) (channels
 * last: the input is permuted once, the convolutions and the pool run channels-last, and the
 * pooled features are put back in (C, H, W) order for fc1, so the weights and the outputs are the
 * same). Convolutions replaced by modules of other types (surgery) are left to the caller.
 * Errors: CM_ERR_INVALID_ARG (net is not a MnistCNN). */
cm_status cm_cnn_set_channels_last(cm_module *net, bool on);
bool cm_cnn_is_channels_last(const cm_module *net);

/* ---------------------------------------------------------------------------------------------
 * ResNet
 * ------------------------------------------------------------------------------------------- */

typedef enum cm_resnet_block_kind {
    CM_RESNET_BASIC = 0,      /* two 3×3 convs (expansion 1): ResNet-18/34 and the CIFAR ResNets */
    CM_RESNET_BOTTLENECK = 1, /* 1×1, 3×3 (with the stride, as torchvision's "v1.5"), 1×1 ×4 */
} cm_resnet_block_kind;

typedef enum cm_resnet_stem {
    CM_RESNET_STEM_IMAGENET = 0, /* conv1 7×7 stride 2 pad 3, bn1, relu, maxpool 3×3 stride 2 pad 1 */
    CM_RESNET_STEM_CIFAR = 1,    /* conv1 3×3 stride 1 pad 1, bn1, relu (He et al. 2016 §4.2) */
} cm_resnet_stem;

/* The shortcut of a block whose stride or width changes (other blocks use the identity). */
typedef enum cm_resnet_shortcut {
    /* Option A (He et al. §4.2, the CIFAR ResNets' 0.27M parameters for ResNet-20): parameter-
     * free — the input subsampled by the stride, with the new channels zero (padded equally on
     * both sides, as the common PyTorch reimplementation's F.pad(x[:, :, ::2, ::2], (.., p, p))). */
    CM_RESNET_SHORTCUT_A = 0,
    /* Option B (torchvision): "downsample" = Sequential(0: 1×1 conv with the stride, no bias;
     * 1: BatchNorm2d). */
    CM_RESNET_SHORTCUT_B = 1,
} cm_resnet_shortcut;

#define CM_RESNET_MAX_STAGES 4

typedef struct cm_resnet_config {
    cm_resnet_block_kind block;      /* CM_RESNET_BASIC */
    cm_resnet_stem stem;             /* CM_RESNET_STEM_IMAGENET */
    cm_resnet_shortcut shortcut;     /* CM_RESNET_SHORTCUT_B */
    int n_stages;                    /* 4 (1..CM_RESNET_MAX_STAGES) */
    int layers[CM_RESNET_MAX_STAGES];    /* blocks per stage: {2, 2, 2, 2} */
    int64_t widths[CM_RESNET_MAX_STAGES]; /* planes per stage: {64, 128, 256, 512}; stage 1 keeps the
                                             stem's width (widths[0]), later stages stride 2 */
    int64_t in_channels;             /* 3 */
    int64_t num_classes;             /* 1000 */
    /* Zero the last BatchNorm's weight in each block (bn2 in a basic block, bn3 in a bottleneck),
     * so every residual branch starts as zero and each block as the identity (Goyal et al. 2017;
     * torchvision's zero_init_residual). false. */
    bool zero_init_residual;
    /* Activations (N, H, W, C) inside the network (the input stays (N, C, H, W): the network
     * permutes it once); weights keep PyTorch's layout, so checkpoints are the same. true (the
     * default, in every preset): oneDNN's convolutions then read and write the activations as
     * they are, where NCHW costs a layout reorder of every input, output and gradient (a quarter
     * of a ResNet-56 step's convolution time; docs/PERFORMANCE.md). false gives NCHW inside.
     * Under the tape's bf16 autocast (amp_bf16) the activations between convolutions are bf16,
     * as in PyTorch's autocast: convolutions write bf16 (cm_conv2d_opts.out_bf16), batch norm and
     * its fused add + ReLU read and write bf16; gradients, weights and statistics stay f32. */
    bool channels_last;
    float bn_eps;                    /* 1e-5 */
    float bn_momentum;               /* 0.1 */
    uint64_t seed;                   /* 0 */
    /* true: torchvision's init — convs kaiming_normal (fan_out, relu), BatchNorm weight 1 and
     * bias 0, fc PyTorch's Linear default. false: zeros (BatchNorm weights 1), to load weights. */
    bool random_init;
} cm_resnet_config;

/* ResNet-18 for ImageNet (1000 classes). */
cm_resnet_config cm_resnet_config_default(void);
/* Presets. ImageNet (BasicBlock/Bottleneck, option B, 1000 classes, torchvision's trees):
 * "resnet18" [2,2,2,2], "resnet34" [3,4,6,3], "resnet50" [3,4,6,3] bottleneck, "resnet101"
 * [3,4,23,3], "resnet152" [3,8,36,3]. CIFAR (He et al. §4.2: depth 6n+2, 3 stages of n basic
 * blocks with 16/32/64 planes, CIFAR stem, option-A shortcuts, 10 classes): "resnet20" (n=3),
 * "resnet32", "resnet44", "resnet56" (n=9), "resnet110". Errors: CM_ERR_INVALID_ARG for an unknown
 * name (listing the valid names and suggesting the closest) or NULL arguments. */
cm_status cm_resnet_config_preset(const char *name, cm_resnet_config *out);
/* The network (type "ResNet"): children conv1, bn1, relu, [maxpool], layer1..layerN
 * ("Sequential" of "BasicBlock"/"Bottleneck"), avgpool (global), fc; wrap units "stem" (conv1,
 * bn1), "layer1".."layerN" and "head" (fc). Input (B, in_channels, H, W) f32 of any size the
 * strides allow; output logits (B, num_classes). Not finalized; the caller owns it. Errors:
 * CM_ERR_INVALID_ARG naming the bad field (n_stages, layers or widths < 1, classes < 1, unknown
 * enum values, eps < 0, momentum not in [0, 1]; option A with a bottleneck block, which has no
 * parameter-free shortcut for its 4× expansion), CM_ERR_OOM. */
cm_status cm_resnet_new(const cm_resnet_config *cfg, cm_module **out);
cm_status cm_resnet_model_new(const cm_resnet_config *cfg, cm_model **out);
/* One residual block as cm_resnet_new builds it ("BasicBlock" or "Bottleneck" after cfg->block,
 * with cfg's shortcut, BatchNorm settings, layout, zero_init_residual and init, drawing from rng
 * when cfg->random_init): in_channels → planes·expansion channels, the spatial size divided by
 * stride (1 or 2). Children conv1, bn1, conv2, bn2, [conv3, bn3], [downsample]. Errors as
 * cm_resnet_new, and CM_ERR_INVALID_ARG for a stride other than 1 or 2 or an option-A shortcut
 * that would have to shrink the channels. */
cm_status cm_resnet_block_new(const cm_resnet_config *cfg, int64_t in_channels, int64_t planes, int stride,
                              cm_rng *rng, cm_module **out);
/* Stochastic depth on a residual block (Huang et al. 2016; the forward of Composer's
 * StochasticDepth): none, block (training: the whole residual branch is skipped with probability
 * drop_rate, one draw per forward — the block then returns x, or relu(shortcut(x)) when the
 * shortcut downsamples) or sample (training: each row's branch is multiplied by 0 with probability
 * drop_rate, else 1). In eval both scale the branch by 1 - drop_rate. The draws come from a
 * Dropout child "stochastic_depth" added on first use (no parameters): the trainer seeds it, gives
 * every microbatch of a batch the batch's counter and checkpoints it, so the draws are the same
 * with and without microbatching (block mode: one decision per batch) and after a resume. Adding it
 * needs an unlocked tree; changing the mode or rate later does not. Errors: CM_ERR_INVALID_ARG
 * (not a BasicBlock/Bottleneck, a bad mode, drop_rate outside [0, 1]), CM_ERR_STATE (locked when
 * the child must be added), CM_ERR_OOM. */
typedef enum cm_resnet_drop_mode {
    CM_RESNET_DROP_NONE = 0,
    CM_RESNET_DROP_BLOCK = 1,
    CM_RESNET_DROP_SAMPLE = 2,
} cm_resnet_drop_mode;
cm_status cm_resnet_block_set_drop(cm_module *block, cm_resnet_drop_mode mode, float drop_rate);
cm_status cm_resnet_block_drop(const cm_module *block, cm_resnet_drop_mode *mode, float *drop_rate);
/* Switches a ResNet network (cm_resnet_new's module) between (N, C, H, W) and (N, H, W, C)
 * activations (cfg.channels_last): the network's own input permutation, its blocks, and every
 * Conv2d, BatchNorm2d, pooling layer below it (cm_nn_set_channels_last). Weights and outputs are
 * the same either way. Modules below it of other types (replaced by surgery) are left alone.
 * Errors: CM_ERR_INVALID_ARG (not a ResNet). */
cm_status cm_resnet_set_channels_last(cm_module *net, bool on);
bool cm_resnet_is_channels_last(const cm_module *net);
/* Forward FLOPs of one sample of h × w pixels (2 per multiply-add of every conv and the fc;
 * BatchNorm, ReLU, pooling and additions are not counted, as the usual "GFLOPs" tables:
 * ResNet-50 at 224×224 is 2 × 4.09 G). 0 for an invalid configuration or size. */
double cm_resnet_forward_flops(const cm_resnet_config *cfg, int64_t h, int64_t w);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_ZOO_VISION_H */
