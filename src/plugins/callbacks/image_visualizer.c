/* ImageVisualizer (Composer's, mode "input"): a PNG grid of a batch's images with the predicted
 * and target classes under each. */
#include "cb_impl.h"

#include <composer/report.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

typedef struct imgvis {
    cm_image_visualizer_config cfg;
    char *folder_fmt;
    char folder[1024];
    int64_t eval_batches; /* batches of the evaluation in progress */
} imgvis;

cm_image_visualizer_config cm_image_visualizer_config_default(void) {
    return (cm_image_visualizer_config){{CM_TIME_BATCH, 100, 0}, "input", 8, false, 0, 1, "{run_name}/images"};
}

static cm_status mkdirs(const char *path) {
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                return cm_set_error(CM_ERR_IO, "ImageVisualizer: cannot create '%s': %s", tmp, strerror(errno));
            *p = '/';
        }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return cm_set_error(CM_ERR_IO, "ImageVisualizer: cannot create '%s': %s", tmp, strerror(errno));
    return CM_OK;
}

/* The image grid: tiles of S·H × S·W with two class strips under each, 2-pixel white gaps. */
static cm_status render(imgvis *v, const cm_tensor *img, const cm_tensor *out, const cm_tensor *tgt, const char *label,
                        int64_t batch, cm_logger *lg) {
    const int nd = cm_tensor_ndim(img);
    const int64_t *sh = cm_tensor_shape(img);
    int64_t n, c, h, w;
    if (nd == 4) {
        n = sh[0];
        c = v->cfg.channels_last ? sh[3] : sh[1];
        h = v->cfg.channels_last ? sh[1] : sh[2];
        w = v->cfg.channels_last ? sh[2] : sh[3];
    } else if (nd == 3) {
        n = sh[0], c = 1, h = sh[1], w = sh[2];
    } else {
        n = c = h = w = 0;
    }
    char buf[64];
    if (n < 1 || (c != 1 && c != 3) || h < 1 || w < 1)
        return cm_set_error(CM_ERR_SHAPE, "ImageVisualizer: field %d %s is not a batch of images ((N, C, H, W)%s with "
                                          "C 1 or 3, or (N, H, W))",
                            v->cfg.input_key, cm_tensor_shape_str(img, buf, sizeof buf),
                            v->cfg.channels_last ? " read channels-last as (N, H, W, C)" : "");
    if (cm_tensor_ndim(out) != 2 || cm_tensor_shape(out)[0] != n)
        return cm_set_error(CM_ERR_SHAPE, "ImageVisualizer: the outputs %s are not (N, classes) logits for %lld images",
                            cm_tensor_shape_str(out, buf, sizeof buf), (long long)n);
    if (tgt && (cm_tensor_ndim(tgt) != 1 || cm_tensor_shape(tgt)[0] != n))
        return cm_set_error(CM_ERR_SHAPE, "ImageVisualizer: field %d %s is not (N) class targets", v->cfg.target_key,
                            cm_tensor_shape_str(tgt, buf, sizeof buf));
    const int64_t k = cm_tensor_shape(out)[1], m = n < v->cfg.num_images ? n : v->cfg.num_images;
    const int64_t s = h < 56 ? (56 + h - 1) / h : 1, th = s * h, tw = s * w;
    const int64_t strip = th / 8 > 3 ? th / 8 : 3, gap = 2;
    const int64_t cols = m < 8 ? m : 8, rows = (m + cols - 1) / cols;
    const int64_t cw = tw + gap, ch = th + 2 * strip + gap;
    const int64_t W = cols * cw + gap, H = rows * ch + gap;
    uint8_t *px = cm_alloc((size_t)(W * H * 3), 16);
    if (!px) return cm_set_error(CM_ERR_OOM, "ImageVisualizer: out of memory for a %lld x %lld image", (long long)W,
                                 (long long)H);
    memset(px, 255, (size_t)(W * H * 3));
    char preds[512] = "", tgts[512] = "";
    for (int64_t i = 0; i < m; i++) {
        const int64_t x0 = gap + (i % cols) * cw, y0 = gap + (i / cols) * ch;
        double lo = INFINITY, hi = -INFINITY;
        for (int64_t y = 0; y < h; y++)
            for (int64_t x = 0; x < w; x++)
                for (int64_t q = 0; q < c; q++) {
                    int64_t idx[4] = {i, q, y, x};
                    if (nd == 3) idx[1] = y, idx[2] = x;
                    else if (v->cfg.channels_last) idx[1] = y, idx[2] = x, idx[3] = q;
                    const double val = cm_tensor_get(img, idx);
                    if (val < lo) lo = val;
                    if (val > hi) hi = val;
                }
        const double span = hi > lo ? hi - lo : 1.0;
        for (int64_t y = 0; y < th; y++)
            for (int64_t x = 0; x < tw; x++)
                for (int64_t q = 0; q < 3; q++) {
                    const int64_t qq = c == 3 ? q : 0;
                    int64_t idx[4] = {i, qq, y / s, x / s};
                    if (nd == 3) idx[1] = y / s, idx[2] = x / s;
                    else if (v->cfg.channels_last) idx[1] = y / s, idx[2] = x / s, idx[3] = qq;
                    const double val = (cm_tensor_get(img, idx) - lo) / span * 255.0;
                    px[((y0 + y) * W + x0 + x) * 3 + q] = (uint8_t)lrint(val < 0 ? 0 : val > 255 ? 255 : val);
                }
        /* the predicted class (argmax of the logits) and the target, one cell per class */
        int64_t pred = 0;
        for (int64_t j = 1; j < k; j++) {
            const int64_t a[2] = {i, j}, b[2] = {i, pred};
            if (cm_tensor_get(out, a) > cm_tensor_get(out, b)) pred = j;
        }
        int64_t target = -1;
        if (tgt) {
            const int64_t a[1] = {i};
            target = (int64_t)cm_tensor_get(tgt, a);
        }
        for (int strip_i = 0; strip_i < 2; strip_i++) {
            const int64_t cls = strip_i == 0 ? pred : target;
            if (cls < 0 || cls >= k) continue;
            const uint8_t *col = strip_i == 1                ? (const uint8_t[3]){40, 90, 220}
                                 : (!tgt || cls == target) ? (const uint8_t[3]){30, 170, 60}
                                                           : (const uint8_t[3]){220, 40, 40};
            const int64_t xa = x0 + cls * tw / k, xb = x0 + (cls + 1) * tw / k;
            for (int64_t y = 0; y < strip; y++)
                for (int64_t x = xa; x < (xb > xa ? xb : xa + 1) && x < x0 + tw; x++)
                    memcpy(&px[((y0 + th + strip_i * strip + y) * W + x) * 3], col, 3);
        }
        snprintf(preds + strlen(preds), sizeof preds - strlen(preds), "%s%lld", i ? " " : "", (long long)pred);
        if (tgt) snprintf(tgts + strlen(tgts), sizeof tgts - strlen(tgts), "%s%lld", i ? " " : "", (long long)target);
    }
    cm_status st = mkdirs(v->folder);
    char path[1200];
    snprintf(path, sizeof path, "%s/%s_ba%lld.png", v->folder, label, (long long)batch);
    if (!st) st = cm_png_write(path, W, H, 3, px);
    cm_free(px);
    if (st) return st;
    char key[96], text[1200 + 2 * 512 + 64];
    snprintf(key, sizeof key, "Images/%c%s", label[0] >= 'a' && label[0] <= 'z' ? label[0] - 32 : label[0], label + 1);
    snprintf(text, sizeof text, "%s\npredictions: %s%s%s", path, preds, tgt ? "\ntargets: " : "", tgt ? tgts : "");
    return cm_logger_log_text(lg, key, text);
}

static cm_status iv_run_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    imgvis *v = self;
    const cm_timestamp *ts = cm_state_timestamp(st);
    if (ev == CM_EVENT_INIT) {
        /* the folder, with the run's name */
        size_t k = 0;
        for (const char *p = v->folder_fmt; *p && k + 1 < sizeof v->folder; p++) {
            if (!strncmp(p, "{run_name}", 10)) {
                k += (size_t)snprintf(v->folder + k, sizeof v->folder - k, "%s", cm_state_run_name(st));
                p += 9;
            } else {
                v->folder[k++] = *p;
            }
        }
        v->folder[k < sizeof v->folder ? k : sizeof v->folder - 1] = '\0';
        return CM_OK;
    }
    if (ev == CM_EVENT_EVAL_START) v->eval_batches = 0;
    bool due = false;
    if (ev == CM_EVENT_AFTER_FORWARD && cm_state_microbatch_index(st) == 0) {
        const cm_time iv = v->cfg.interval;
        due = iv.unit == CM_TIME_BATCH ? ts->batch % iv.count == 0
                                       : ts->batch_in_epoch == 0 && ts->epoch % iv.count == 0;
    } else if (ev == CM_EVENT_EVAL_AFTER_FORWARD) {
        due = v->eval_batches++ == 0;
    }
    if (!due || cm_state_rank(st) != 0) return CM_OK;
    const cm_model_batch *mb = cm_state_model_batch(st);
    cm_tensor *outs = cm_state_outputs(st);
    if (!mb || !outs) return CM_OK;
    if (v->cfg.input_key >= mb->n)
        return cm_set_error(CM_ERR_INVALID_ARG, "ImageVisualizer: input_key %d, but the batch has %d field(s)",
                            v->cfg.input_key, mb->n);
    const cm_tensor *tgt = v->cfg.target_key < mb->n ? mb->fields[v->cfg.target_key] : NULL;
    const char *label = ev == CM_EVENT_AFTER_FORWARD ? "train" : cm_state_dataloader_label(st);
    return render(v, mb->fields[v->cfg.input_key], outs, tgt, label, ts->batch, lg);
}

static void iv_free(void *self) {
    imgvis *v = self;
    cm_free(v->folder_fmt);
    cm_free(v);
}

static const cm_callback_i imgvis_vt = {
    .abi = CM_CALLBACK_ABI,
    .name = "ImageVisualizer",
    .run_event = iv_run_event,
    .free = iv_free,
};

cm_status cm_image_visualizer_new(const cm_image_visualizer_config *cfg, cm_callback_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_image_visualizer_new: out is NULL");
    *out = (cm_callback_plugin){0};
    const cm_image_visualizer_config c = cfg ? *cfg : cm_image_visualizer_config_default();
    if (c.mode && strcasecmp(c.mode, "input")) {
        if (!strcasecmp(c.mode, "segmentation"))
            return cm_set_error(CM_ERR_UNSUPPORTED, "ImageVisualizer: mode 'segmentation' is not supported (there is no "
                                                    "segmentation model here); use mode 'input'");
        return cm_set_error(CM_ERR_INVALID_ARG, "ImageVisualizer: mode '%s': use input", c.mode);
    }
    if ((c.interval.unit != CM_TIME_BATCH && c.interval.unit != CM_TIME_EPOCH) || c.interval.count < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "ImageVisualizer: interval must be a positive count of ba or ep");
    if (c.num_images < 1 || c.num_images > 1024)
        return cm_set_error(CM_ERR_INVALID_ARG, "ImageVisualizer: num_images %d must be 1..1024", c.num_images);
    if (c.input_key < 0 || c.target_key < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "ImageVisualizer: input_key and target_key are field indices (>= 0)");
    if (!c.folder || !c.folder[0]) return cm_set_error(CM_ERR_INVALID_ARG, "ImageVisualizer: folder is empty");
    imgvis *v = cm_alloc_zeroed(sizeof *v, 16);
    if (!v || !(v->folder_fmt = cbi_strdup(c.folder))) {
        cm_free(v);
        return cm_set_error(CM_ERR_OOM, "ImageVisualizer: out of memory");
    }
    v->cfg = c;
    v->cfg.folder = v->folder_fmt;
    v->cfg.mode = "input";
    *out = (cm_callback_plugin){&imgvis_vt, v};
    return CM_OK;
}
