/* The golden ResNet step on any device (cmgolden_resnet.h). */
#include "cmgolden_resnet.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* A CPU copy of t (to be freed), wherever t lives. */
static cm_tensor *host(const cm_tensor *t) {
    cm_tensor *h;
    cr_assert_eq(cm_tensor_to_device(t, CM_DEVICE_CPU, &h), CM_OK, "copy to the host: %s", cm_last_error());
    return h;
}

static cm_tensor *on(cm_tensor *t, cm_device dev) {
    if (dev == CM_DEVICE_CPU) return t;
    cm_tensor *d;
    cr_assert_eq(cm_tensor_to_device(t, dev, &d), CM_OK, "copy to %s: %s", cm_device_name(dev), cm_last_error());
    cm_tensor_free(t);
    return d;
}

static void close_to(const char *label, const cm_tensor *got, const cm_tensor *want, double atol, double rtol) {
    cm_tensor *h = host(got);
    cmt_assert_close(label, h, want, atol, rtol);
    cm_tensor_free(h);
}

void cmt_golden_resnet_check(cmt_golden *g, const char *c, const cm_resnet_config *rc, cm_device dev) {
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
    cr_assert_eq(cm_module_load_safetensors(net, CMT_GOLDEN_RESNET, &lo, &rep), CM_OK, "%s: %s", c, cm_last_error());
    cr_assert_eq(rep.n_missing, 0, "%s: names missing from PyTorch's state_dict: %s", c, rep.missing);
    cr_assert_eq(rep.n_loaded, cm_module_n_params(net) + cm_module_n_buffers(net), "%s: loaded %lld of %lld", c,
                 (long long)rep.n_loaded, (long long)(cm_module_n_params(net) + cm_module_n_buffers(net)));
    if (dev != CM_DEVICE_CPU)
        cr_assert_eq(cm_module_to_device(net, dev), CM_OK, "%s: to %s: %s", c, cm_device_name(dev), cm_last_error());

    cm_tape *tp = cmt_tape();
    cr_assert_eq(cm_tape_set_device(tp, dev), CM_OK, "%s", cm_last_error());
    cm_tensor *x = on(gold(g, c, "x"), dev), *y = on(gold(g, c, "y"), dev);
    const char *names[2] = {"image", "label"};
    cm_tensor *fields[2] = {x, y};
    cm_model_batch b = {names, fields, 2, cm_tensor_dim(x, 0), 0};
    cm_module_train(net, true);
    cm_tensor *logits = cm_model_forward(model, tp, &b);
    cr_assert(logits, "%s: %s", c, cm_tape_error(tp));
    cr_assert_eq(cm_tensor_device(logits), dev, "%s: logits on %s", c, cm_device_name(cm_tensor_device(logits)));
    char label[200];
    cm_tensor *want = gold(g, c, "logits");
    snprintf(label, sizeof label, "%s train logits", c);
    close_to(label, logits, want, 1e-4, 1e-4);
    cm_tensor_free(want);
    cm_tensor *loss = cm_model_loss(model, tp, logits, &b);
    cr_assert(loss, "%s: %s", c, cm_tape_error(tp));
    want = gold(g, c, "loss");
    snprintf(label, sizeof label, "%s loss", c);
    close_to(label, loss, want, 1e-4, 1e-4);
    cm_tensor_free(want);
    cr_assert_eq(cm_tape_backward(tp, loss), CM_OK, "%s: %s", c, cm_tape_error(tp));

    for (int64_t i = 0; i < cm_module_n_params(net); i++) {
        cm_param_info p = cm_module_param_info(net, i);
        snprintf(label, sizeof label, "g.%s", p.name);
        want = gold(g, c, label);
        snprintf(label, sizeof label, "%s gradient of %s", c, p.name);
        cr_assert(cm_tensor_grad(p.tensor), "%s: no gradient", label);
        cm_tensor *got = host(cm_tensor_grad(p.tensor));
        double mr = 0, md = 0;
        for (int64_t k = 0; k < cm_tensor_numel(want); k++) {
            double r = cm_tensor_get_flat(want, k);
            mr = fmax(mr, fabs(r)), md = fmax(md, fabs(cm_tensor_get_flat(got, k) - r));
        }
        if (getenv("CM_GOLDEN_VERBOSE")) printf("%-50s max|diff| / max|ref| = %.3g\n", label, md / mr);
        cmt_assert_close(label, got, want, 1e-4 * mr + 1e-8, 1e-3);
        cm_tensor_free(got);
        cm_tensor_free(want);
    }
    for (int64_t i = 0; i < cm_module_n_buffers(net); i++) {
        cm_buffer_info bi = cm_module_buffer_info(net, i);
        snprintf(label, sizeof label, "after.%s", bi.name);
        want = gold(g, c, label);
        snprintf(label, sizeof label, "%s %s after the train step", c, bi.name);
        close_to(label, bi.tensor, want, 1e-5, 1e-5);
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
    close_to(label, ev, want, 1e-4, 1e-4);
    cm_tensor_free(want);

    cm_tensor_free(x);
    cm_tensor_free(y);
    cm_tape_free(tp);
    cm_model_free(model);
}

cm_resnet_config cmt_golden_resnet20(bool channels_last) {
    cm_resnet_config rc;
    cr_assert_eq(cm_resnet_config_preset("resnet20", &rc), CM_OK);
    const int64_t w[3] = {4, 8, 16};
    memcpy(rc.widths, w, sizeof w);
    rc.random_init = false;
    rc.channels_last = channels_last;
    return rc;
}
