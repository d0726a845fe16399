/* ChannelsLast (Composer's ChannelsLast): the model's convolutional activations in (N, H, W, C)
 * layout, which oneDNN's convolutions read and write without a reorder. Composer converts the
 * model with model.to(memory_format=torch.channels_last); here the networks of the zoo switch their
 * layout (the ResNets, the MNIST CNN), with the layers surgery put in them. No parameter changes,
 * so it also works on a locked model. */
#include "plugins/surgery/surgery_impl.h"

#include <composer/zoo_vision.h>
#include <string.h>

typedef struct {
    int64_t nets, switched, convs;
} cl_scan;

static bool is_net(const cm_module *m) {
    const char *t = cm_module_type_name(m);
    return !strcmp(t, "ResNet") || !strcmp(t, "MnistCNN");
}

static bool net_is_cl(const cm_module *m) { return cm_resnet_is_channels_last(m) || cm_cnn_is_channels_last(m); }

static bool scan_visit(cm_module *m, const char *path, int depth, void *data) {
    cl_scan *s = data;
    if (is_net(m)) s->nets++, s->switched += net_is_cl(m);
    if (!strcmp(cm_module_type_name(m), "Conv2d")) s->convs++;
    return true;
}

static bool flip_ours(cm_module *m, const char *path, int depth, void *data) {
    cmi_surgery_set_channels_last(m, true);
    return true;
}

static bool switch_nets(cm_module *m, const char *path, int depth, void *data) {
    if (!is_net(m) || net_is_cl(m)) return true;
    if (!strcmp(cm_module_type_name(m), "ResNet"))
        cm_resnet_set_channels_last(m, true);
    else
        cm_cnn_set_channels_last(m, true);
    cm_module_visit(m, flip_ours, NULL);
    (*(int64_t *)data)++;
    return true;
}

cm_status cm_apply_channels_last(cm_module *root, int64_t *n_changed) {
    if (n_changed) *n_changed = 0;
    if (!root) return cm_set_error(CM_ERR_INVALID_ARG, "cm_apply_channels_last: the model is NULL");
    cl_scan sc = {0, 0, 0};
    cm_module_visit(root, scan_visit, &sc);
    if (!sc.nets)
        return cmi_nothing_to_apply(root, "ChannelsLast", "a ResNet or MnistCNN network (the networks that can switch "
                                                          "their activations to (N, H, W, C))",
                                    sc.convs ? "this model's Conv2d layers sit in a network without a layout switch"
                                             : "it has no Conv2d layers");
    int64_t n = 0;
    cm_module_visit(root, switch_nets, &n);
    if (n_changed) *n_changed = n;
    static const char k_already[] = "ChannelsLast: the model's networks are channels-last already (the zoo's ResNets "
                                    "are by default): nothing to switch";
    if (n)
        cm_log_msg(CM_LOG_INFO, "ChannelsLast: %s: %lld network%s switched to channels-last", cm_module_type_name(root),
                   (long long)n, n == 1 ? "" : "s");
    else
        cmi_log_once(k_already);
    return CM_OK;
}

/* ---- the algorithm ---- */

typedef struct {
    char unused; /* no arguments */
} cl_self;

static bool cl_match(void *self, cm_event ev, const cm_state *st) { return ev == CM_EVENT_INIT; }

static cm_status cl_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    cm_module *root;
    cm_status s = cmi_state_root(st, "ChannelsLast", &root);
    return s ? s : cm_apply_channels_last(root, NULL);
}

static void cl_free(void *self) { cm_free(self); }

static const cm_algorithm_i cl_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "ChannelsLast",
    .match = cl_match,
    .apply = cl_apply,
    .free = cl_free,
};

cm_status cm_channels_last_new(cm_algorithm_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_channels_last_new: out is NULL");
    cl_self *s = cm_alloc_zeroed(sizeof *s, 16);
    if (!s) return CM_ERR_OOM;
    *out = (cm_algorithm_plugin){&cl_vt, s};
    return CM_OK;
}

static void cfg_default(void *c) {}
static cm_status make(const void *c, cm_algorithm_plugin *out) { return cm_channels_last_new(out); }

const cmi_algo_entry cmi_channels_last_entry = {
    {"ChannelsLast", "channels_last", false, 0}, &cl_vt, 1, cfg_default, NULL, 0, make,
};
