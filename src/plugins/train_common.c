/* Shared pieces of the training-method algorithms: the weight copy (EMA's and SWA's averages),
 * Composer's time-argument checks, the refusal of sharded strategies. */
#include "plugins/train_algos_impl.h"
#include "tensor/tensor_impl.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

void cmi_wcopy_free(cmi_wcopy *w) {
    cm_free(w->e);
    cmi_dev_free(w->dev, w->storage);
    cmi_dev_free(w->dev, w->tmp);
    memset(w, 0, sizeof *w);
}

static size_t entry_bytes(const cmi_wentry *e) { return (size_t)e->numel * cm_dtype_size(e->dtype); }
static size_t entry_room(const cmi_wentry *e) { return (entry_bytes(e) + 63) & ~(size_t)63; }

/* The device of the model's tensors (all on one, as cm_module_to_device leaves them). */
static cm_device model_device(const cmi_wcopy *w) { return w->n ? cm_tensor_device(w->e[0].t) : CM_DEVICE_CPU; }

/* Storage for the copy on dev (zeroed), and on a device the swap room; pointers set. */
static cm_status place(cmi_wcopy *w, cm_device dev, void **storage, void **tmp) {
    size_t bytes = 0, most = 0;
    for (int i = 0; i < w->n; i++) {
        bytes += entry_room(&w->e[i]);
        if (entry_bytes(&w->e[i]) > most) most = entry_bytes(&w->e[i]);
    }
    *tmp = NULL;
    *storage = cmi_dev_alloc(dev, bytes ? bytes : 64, true);
    if (*storage && dev != CM_DEVICE_CPU) *tmp = cmi_dev_alloc(dev, most ? most : 64, false);
    if (!*storage || (dev != CM_DEVICE_CPU && !*tmp)) {
        cmi_dev_free(dev, *storage);
        return cm_set_error(CM_ERR_OOM, "out of %s memory for a copy of the model (%zu bytes)", cm_device_name(dev),
                            bytes);
    }
    return CM_OK;
}

cm_status cmi_wcopy_init(cmi_wcopy *w, cm_module *root, bool buffers, bool all_params) {
    memset(w, 0, sizeof *w);
    if (!root || !cm_module_is_finalized(root))
        return cm_set_error(CM_ERR_STATE, "the model's module tree is not finalized");
    const int64_t np = cm_module_n_params(root), nb = buffers ? cm_module_n_buffers(root) : 0;
    w->e = cm_alloc_zeroed(sizeof *w->e * (size_t)(np + nb + 1), 16);
    if (!w->e) return cm_set_error(CM_ERR_OOM, "out of memory for a copy of the model's %lld tensors", (long long)(np + nb));
    for (int64_t i = 0; i < np + nb; i++) {
        cmi_wentry *e = &w->e[w->n++];
        if (i < np) {
            cm_param_info pi = cm_module_param_info(root, i);
            e->name = pi.name, e->t = pi.tensor, e->is_param = true;
        } else {
            cm_buffer_info bi = cm_module_buffer_info(root, i - np);
            e->name = bi.name, e->t = bi.tensor;
        }
        e->dtype = cm_tensor_dtype(e->t);
        e->ndim = cm_tensor_ndim(e->t);
        memcpy(e->shape, cm_tensor_shape(e->t), sizeof(int64_t) * (size_t)e->ndim);
        e->numel = cm_tensor_numel(e->t);
        cm_status s = CM_OK;
        if (!cm_tensor_is_contiguous(e->t))
            s = cm_set_error(CM_ERR_STATE, "tensor '%s' of the model is not contiguous", e->name);
        else if (cm_tensor_device(e->t) != cm_tensor_device(w->e[0].t))
            s = cm_set_error(CM_ERR_STATE, "tensor '%s' of the model is on %s but '%s' is on %s", e->name,
                             cm_device_name(cm_tensor_device(e->t)), w->e[0].name,
                             cm_device_name(cm_tensor_device(w->e[0].t)));
        if (s) {
            cmi_wcopy_free(w);
            return s;
        }
    }
    w->dev = model_device(w);
    cm_status s = place(w, w->dev, &w->storage, &w->tmp);
    if (s) {
        cmi_wcopy_free(w);
        return s;
    }
    char *p = w->storage;
    for (int i = 0; i < w->n; i++) {
        w->e[i].copy = p;
        p += entry_room(&w->e[i]);
    }
    if ((s = cmi_wcopy_refresh(w, all_params))) cmi_wcopy_free(w);
    return s;
}

cm_status cmi_wcopy_follow(cmi_wcopy *w) {
    const cm_device to = model_device(w);
    if (to == w->dev) return CM_OK;
    void *storage, *tmp;
    cm_status s = place(w, to, &storage, &tmp);
    if (s) return s;
    char *p = storage;
    for (int i = 0; i < w->n && !s; i++) {
        s = cmi_dev_memcpy(p, to, w->e[i].copy, w->dev, entry_bytes(&w->e[i]));
        p += entry_room(&w->e[i]);
    }
    if (s) {
        cmi_dev_free(to, storage);
        cmi_dev_free(to, tmp);
        return s;
    }
    cmi_dev_free(w->dev, w->storage);
    cmi_dev_free(w->dev, w->tmp);
    w->storage = storage, w->tmp = tmp, w->dev = to;
    p = storage;
    for (int i = 0; i < w->n; i++) {
        w->e[i].copy = p;
        p += entry_room(&w->e[i]);
    }
    return CM_OK;
}

cm_status cmi_wcopy_memcpy(const cmi_wcopy *w, void *dst, const void *src, size_t bytes) {
    return cmi_dev_memcpy(dst, w->dev, src, w->dev, bytes);
}

cm_status cmi_wcopy_refresh(cmi_wcopy *w, bool all_params) {
    cm_status s = cmi_wcopy_follow(w);
    for (int i = 0; i < w->n && !s; i++) {
        cmi_wentry *e = &w->e[i];
        e->tracked = !e->is_param || all_params || cm_tensor_requires_grad(e->t);
        s = cmi_wcopy_memcpy(w, e->copy, cm_tensor_data(e->t), entry_bytes(e));
    }
    return s;
}

cm_status cmi_wcopy_swap(cmi_wcopy *w) {
    cm_status s = cmi_wcopy_follow(w);
    for (int i = 0; i < w->n && !s; i++) {
        cmi_wentry *e = &w->e[i];
        if (!e->tracked) continue;
        const size_t nb = entry_bytes(e);
        unsigned char *a = cm_tensor_data(e->t), *b = e->copy;
        if (w->dev != CM_DEVICE_CPU) { /* through the swap room, in the device's stream order */
            if (!(s = cmi_wcopy_memcpy(w, w->tmp, a, nb)) && !(s = cmi_wcopy_memcpy(w, a, b, nb)))
                s = cmi_wcopy_memcpy(w, b, w->tmp, nb);
            continue;
        }
        for (size_t k = 0; k < nb; k++) {
            unsigned char t = a[k];
            a[k] = b[k];
            b[k] = t;
        }
    }
    return s;
}

int cmi_wcopy_tensors(const cmi_wcopy *w, cm_plugin_tensor *out, int cap) {
    for (int i = 0; i < w->n && i < cap; i++) {
        const cmi_wentry *e = &w->e[i];
        out[i] = (cm_plugin_tensor){e->name, e->dtype, e->ndim, {0}, e->copy};
        memcpy(out[i].shape, e->shape, sizeof(int64_t) * (size_t)e->ndim);
    }
    return w->n;
}

size_t cmi_wcopy_untracked_json(const cmi_wcopy *w, char *buf, size_t cap) {
    /* measured first, then written when it fits (snprintf semantics) */
    size_t need = 2;
    int k = 0;
    for (int i = 0; i < w->n; i++)
        if (w->e[i].is_param && !w->e[i].tracked) need += strlen(w->e[i].name) + 2 + (k++ ? 2 : 0);
    if (!buf || cap == 0) return need;
    if (need + 1 > cap) {
        buf[0] = 0;
        return need;
    }
    char *p = buf;
    *p++ = '[';
    k = 0;
    for (int i = 0; i < w->n; i++)
        if (w->e[i].is_param && !w->e[i].tracked) {
            if (k++) *p++ = ',', *p++ = ' ';
            *p++ = '"';
            const size_t l = strlen(w->e[i].name);
            memcpy(p, w->e[i].name, l);
            p += l;
            *p++ = '"';
        }
    *p++ = ']';
    *p = 0;
    return need;
}

cm_status cmi_wcopy_set_untracked(cmi_wcopy *w, const void *cjson_array, const char *alg) {
    const cJSON *arr = cjson_array;
    if (!cJSON_IsArray(arr)) return cm_set_error(CM_ERR_FORMAT, "%s: 'untracked' is not a list of names", alg);
    for (int i = 0; i < w->n; i++) w->e[i].tracked = true;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        bool found = false;
        for (int i = 0; cJSON_IsString(it) && i < w->n && !found; i++)
            if (w->e[i].is_param && !strcmp(w->e[i].name, it->valuestring)) w->e[i].tracked = false, found = true;
        if (!found)
            return cm_set_error(CM_ERR_FORMAT, "%s: the saved state names a parameter '%s' this model does not have", alg,
                                cJSON_IsString(it) ? it->valuestring : "?");
    }
    return CM_OK;
}

cm_status cmi_algo_time(const char *alg, const char *arg, const char *s, unsigned units, const char *allowed,
                        cm_time *out) {
    char what[128];
    snprintf(what, sizeof what, "%s: %s", alg, arg);
    cm_status st = cm_time_parse_named(what, s, out);
    if (st) return st;
    if (!(units & CMI_UNIT(out->unit)))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s '%s': the unit must be %s (as in Composer)", what, s, allowed);
    return CM_OK;
}

cm_status cmi_algo_refuse_sharded(const char *alg, const cm_state *st) {
    int n = 0;
    if (cm_state_shard_spans(st, &n) && n > 0)
        return cm_set_error(CM_ERR_UNSUPPORTED, "%s needs every parameter on every rank, and under a sharded strategy a "
                                                "rank holds pieces of them (use sharding_strategy NO_SHARD)", alg);
    return CM_OK;
}

bool cmi_time_reached(const cm_state *st, cm_time t) {
    if (t.unit == CM_TIME_DURATION) {
        double el;
        if (cm_state_elapsed(st, &el)) return false;
        return t.frac <= el + 1e-12;
    }
    cm_time now;
    if (cm_timestamp_get(cm_state_timestamp(st), t.unit, &now)) return false;
    return t.count <= now.count;
}
