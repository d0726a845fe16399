/* The small CNN of PyTorch's MNIST example (github.com/pytorch/examples, mnist/main.py), with its
 * module names, so that example's state_dict loads by name. */
#include "zoo/zoo_vision_impl.h"

#include <stdio.h>
#include <string.h>

cm_cnn_config cm_cnn_config_default(void) {
    cm_cnn_config c;
    memset(&c, 0, sizeof c);
    c.in_channels = 1;
    c.image_h = c.image_w = 28;
    c.channels[0] = 32, c.channels[1] = 64;
    c.hidden = 128;
    c.num_classes = 10;
    c.dropout1 = 0.25f, c.dropout2 = 0.5f;
    c.random_init = true;
    return c;
}

cm_status cm_cnn_config_preset(const char *name, cm_cnn_config *out) {
    static const char *const names[] = {"mnist", "mnist_small", "cifar10"};
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_cnn_config_preset: out is NULL");
    cm_cnn_config c = cm_cnn_config_default();
    if (name && !strcmp(name, "mnist")) {
    } else if (name && !strcmp(name, "mnist_small")) {
        c.channels[0] = 8, c.channels[1] = 16, c.hidden = 64;
    } else if (name && !strcmp(name, "cifar10")) {
        c.in_channels = 3, c.image_h = c.image_w = 32;
    } else {
        return cmz_unknown_preset("cm_cnn_config_preset", name, names, 3);
    }
    *out = c;
    return CM_OK;
}

/* Spatial size after conv 3×3, conv 3×3 (no padding) and max pool 2. */
static int64_t pooled(int64_t n) { return (n - 4) / 2; }

static cm_status check_config(const char *fn, const cm_cnn_config *c) {
    if (!c) return cm_set_error(CM_ERR_INVALID_ARG, "%s: config is NULL", fn);
    if (c->in_channels < 1 || c->channels[0] < 1 || c->channels[1] < 1 || c->hidden < 1 || c->num_classes < 1)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "%s: in_channels %lld, channels (%lld, %lld), hidden %lld and num_classes %lld must be at "
                            "least 1",
                            fn, (long long)c->in_channels, (long long)c->channels[0], (long long)c->channels[1],
                            (long long)c->hidden, (long long)c->num_classes);
    if (c->image_h < 6 || c->image_w < 6)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: image %lldx%lld is too small (two 3x3 convs and a 2x2 pool need 6x6)",
                            fn, (long long)c->image_h, (long long)c->image_w);
    if (!(c->dropout1 >= 0 && c->dropout1 < 1) || !(c->dropout2 >= 0 && c->dropout2 < 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: dropout1 %g and dropout2 %g must be in [0, 1)", fn, c->dropout1,
                            c->dropout2);
    return CM_OK;
}

typedef struct {
    cm_cnn_config cfg;
    bool channels_last; /* cm_cnn_set_channels_last: (N, H, W, C) between the input and the flatten */
    cm_module *conv1, *conv2, *dropout1, *dropout2, *fc1, *fc2;
} cnn_s;

static cm_tensor *cnn_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    cnn_s *s = cm_module_self(m);
    cm_tensor *x = in[0]; /* (B, C, H, W) */
    const cm_cnn_config *c = &s->cfg;
    if (cm_tensor_ndim(x) != 4 || cm_tensor_dim(x, 1) != c->in_channels || cm_tensor_dim(x, 2) != c->image_h ||
        cm_tensor_dim(x, 3) != c->image_w) {
        cm_tape_fail(tp, CM_ERR_SHAPE, "MnistCNN: input must be (B, %lld, %lld, %lld) (a %d-d tensor was given; "
                     "fc1 is sized for the configured image)",
                     (long long)c->in_channels, (long long)c->image_h, (long long)c->image_w, cm_tensor_ndim(x));
        return NULL;
    }
    const bool cl = s->channels_last;
    if (cl) x = cm_contiguous(tp, cm_permute(tp, x, (const int[]){0, 2, 3, 1}));
    x = cm_relu(tp, cm_module_forward(s->conv1, tp, x));
    x = cm_relu(tp, cm_module_forward(s->conv2, tp, x));
    cm_pool2d_opts po = cm_pool2d_opts_default(2, 2);
    po.channels_last = cl;
    x = cm_module_forward(s->dropout1, tp, cm_max_pool2d(tp, x, &po));
    /* fc1 reads the features in PyTorch's (C, H, W) order */
    if (cl) x = cm_permute(tp, x, (const int[]){0, 3, 1, 2});
    if (!x) return NULL;
    x = cm_reshape(tp, x, 2, (const int64_t[]){cm_tensor_dim(x, 0), -1});
    x = cm_module_forward(s->dropout2, tp, cm_relu(tp, cm_module_forward(s->fc1, tp, x)));
    return cm_module_forward(s->fc2, tp, x);
}

static void cnn_desc(const cm_module *m, char *buf, size_t cap) {
    const cnn_s *s = cm_module_self(m);
    snprintf(buf, cap, "in=%lldx%lldx%lld, classes=%lld", (long long)s->cfg.in_channels, (long long)s->cfg.image_h,
             (long long)s->cfg.image_w, (long long)s->cfg.num_classes);
}
static void free_plain(void *self) { cm_free(self); }
static const cm_module_i cnn_vt = {CM_MODULE_ABI, "MnistCNN", cnn_fwd, free_plain, cnn_desc};

static cm_status adopt(cm_module *parent, const char *name, cm_status made, cm_module **child, cm_module **slot) {
    if (made) return made;
    cm_status st = cm_module_add_child(parent, name, *child, slot);
    if (st) cm_module_free(*child);
    return st;
}

cm_status cm_cnn_new(const cm_cnn_config *cfg, cm_module **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_cnn_new: out is NULL");
    *out = NULL;
    cm_status st = check_config("cm_cnn_new", cfg);
    if (st) return st;
    cnn_s *s = cm_alloc_zeroed(sizeof *s, 8);
    if (!s) return CM_ERR_OOM;
    cm_module *m, *c;
    if ((st = cm_module_new(&cnn_vt, s, &m))) {
        cm_free(s);
        return st;
    }
    s->cfg = *cfg;
    cm_rng rng_state = cm_rng_init(cfg->seed, 0), *rng = cfg->random_init ? &rng_state : NULL;
    cm_nn_conv2d_config c1 = cm_nn_conv2d_config_default(cfg->in_channels, cfg->channels[0], 3, 3);
    cm_nn_conv2d_config c2 = cm_nn_conv2d_config_default(cfg->channels[0], cfg->channels[1], 3, 3);
    const int64_t flat = cfg->channels[1] * pooled(cfg->image_h) * pooled(cfg->image_w);
    if ((st = adopt(m, "conv1", cm_nn_conv2d_new(&c1, rng, &c), &c, &s->conv1)) ||
        (st = adopt(m, "conv2", cm_nn_conv2d_new(&c2, rng, &c), &c, &s->conv2)) ||
        (st = adopt(m, "dropout1", cm_nn_dropout_new(cfg->dropout1, &c), &c, &s->dropout1)) ||
        (st = adopt(m, "dropout2", cm_nn_dropout_new(cfg->dropout2, &c), &c, &s->dropout2)) ||
        (st = adopt(m, "fc1", cm_nn_linear_new(flat, cfg->hidden, true, rng, &c), &c, &s->fc1)) ||
        (st = adopt(m, "fc2", cm_nn_linear_new(cfg->hidden, cfg->num_classes, true, rng, &c), &c, &s->fc2)))
        return cmz_fail_build(&m, st);
    *out = m;
    return CM_OK;
}

double cm_cnn_forward_flops(const cm_cnn_config *c, int64_t h, int64_t w) {
    if (!c) return 0.0;
    if (h <= 0 || w <= 0) h = c->image_h, w = c->image_w;
    if (h < 6 || w < 6) return 0.0;
    const double c0 = (double)c->in_channels, c1 = (double)c->channels[0], c2 = (double)c->channels[1];
    double macs = c0 * c1 * 9 * (h - 2) * (w - 2) + c1 * c2 * 9 * (h - 4) * (w - 4);
    macs += c2 * pooled(h) * pooled(w) * (double)c->hidden + (double)c->hidden * c->num_classes;
    return 2.0 * macs;
}

static double flops_cb(const void *cfg, int64_t h, int64_t w) { return cm_cnn_forward_flops(cfg, h, w); }

cm_status cm_cnn_model_new(const cm_cnn_config *cfg, cm_model **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_cnn_model_new: out is NULL");
    *out = NULL;
    cm_module *net;
    cm_status st = cm_cnn_new(cfg, &net);
    if (st) return st;
    return cmz_vision_model_new(net, flops_cb, cfg, sizeof *cfg, out);
}

cm_status cm_cnn_set_channels_last(cm_module *net, bool on) {
    if (!net || cm_module_vtable(net) != &cnn_vt)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_cnn_set_channels_last: the module is %s%s, not a MnistCNN",
                            net ? "a " : "", net ? cm_module_type_name(net) : "NULL");
    cnn_s *s = cm_module_self(net);
    s->channels_last = on;
    cm_module *convs[2] = {s->conv1, s->conv2};
    for (int i = 0; i < 2; i++)
        if (!strcmp(cm_module_type_name(convs[i]), "Conv2d")) cm_nn_set_channels_last(convs[i], on);
    return CM_OK;
}

bool cm_cnn_is_channels_last(const cm_module *net) {
    return net && cm_module_vtable(net) == &cnn_vt && ((const cnn_s *)cm_module_self(net))->channels_last;
}
