/* The microbatch-level plumbing of MixUp and CutMix (da_mix.h). */
#include "plugins/data_algos/da_mix.h"

cm_status cmi_da_mix_begin(cmi_da_mix *m, cm_state *st, const char *who, const char *input_key, const char *target_key,
                           cm_tensor **x) {
    const cm_model_batch *mb = cm_state_model_batch(st);
    if (!mb) return cm_set_error(CM_ERR_STATE, "%s: there is no batch", who);
    const int fi = cmi_da_field(mb->names, mb->n, input_key, 0, who, "input_key");
    if (fi < 0) return cm_last_status();
    const int ft = cmi_da_field(mb->names, mb->n, target_key, 1, who, "target_key");
    if (ft < 0) return cm_last_status();
    m->input_name = mb->names[fi], m->target_name = mb->names[ft];
    *x = mb->fields[fi];
    m->n = cm_tensor_dim(*x, 0);
    m->has_box = false;
    if (m->n > m->cap) {
        int64_t *p = cm_alloc(sizeof(int64_t) * (size_t)m->n, 16);
        if (!p) return cm_set_error(CM_ERR_OOM, "%s: out of memory", who);
        cm_free(m->perm);
        m->perm = p, m->cap = m->n;
    }
    return CM_OK;
}

/* target[perm] on the tape (rows gathered), contiguous, on the host (a GPU's target is copied). */
static cm_tensor *permuted(cm_tape *tp, cm_tensor *t, const int64_t *perm, int64_t n) {
    cm_tensor *c = cm_contiguous(tp, cm_to_device(tp, t, CM_DEVICE_CPU));
    cm_tensor *o = c ? cm_empty_on(tp, CM_DEVICE_CPU, cm_tensor_dtype(t), cm_tensor_ndim(t), cm_tensor_shape(t)) : NULL;
    if (!o) return NULL;
    const size_t row = n ? cm_tensor_nbytes(c) / (size_t)n : 0;
    for (int64_t i = 0; i < n; i++)
        memcpy((char *)cm_tensor_data(o) + (size_t)i * row, (const char *)cm_tensor_data(c) + (size_t)perm[i] * row, row);
    return o;
}

static cm_tensor *current(cm_state *st, const char *name) {
    return cm_model_batch_field(cm_state_model_batch(st), name);
}

/* A target with the input's height and width (segmentation): Composer pastes the partner's box. */
static bool is_spatial(const cmi_da_mix *m, const cm_tensor *y) {
    return m->has_box && cm_tensor_ndim(y) > 2 && cm_tensor_dim(y, -2) == m->H && cm_tensor_dim(y, -1) == m->W;
}

cm_status cmi_da_mix_targets(cmi_da_mix *m, cm_state *st, const char *who) {
    cm_tape *tp = cm_state_tape(st);
    cm_tensor *y = current(st, m->target_name), *out = cm_state_outputs(st);
    char a[96], b[96];
    if (!y) return cm_set_error(CM_ERR_STATE, "%s: the target field '%s' is gone", who, m->target_name);
    if (cm_tensor_dim(y, 0) != m->n)
        return cm_set_error(CM_ERR_SHAPE, "%s: target '%s' %s does not have the input's %lld rows", who, m->target_name,
                            cmi_da_desc(y, a, sizeof a), (long long)m->n);
    /* the targets are mixed on the host (a GPU run's are copied back), then go where they were */
    const cm_device dev = cm_tensor_device(y);
    if (is_spatial(m, y)) {
        cm_tensor *yc = cm_contiguous(tp, cm_to_device(tp, y, CM_DEVICE_CPU));
        cm_tensor *yp = yc ? permuted(tp, yc, m->perm, m->n) : NULL;
        cm_tensor *o = yp ? cm_clone_detached(tp, yc) : NULL;
        if (!o) return cm_tape_status(tp);
        const int64_t lead = cm_tensor_numel(o) / (m->H * m->W);
        const size_t es = cm_dtype_size(cm_tensor_dtype(o));
        for (int64_t l = 0; l < lead; l++)
            for (int64_t r = m->box.x1; r < m->box.x2; r++)
                memcpy((char *)cm_tensor_data(o) + ((size_t)(l * m->H + r) * (size_t)m->W + (size_t)m->box.y1) * es,
                       (const char *)cm_tensor_data(yp) + ((size_t)(l * m->H + r) * (size_t)m->W + (size_t)m->box.y1) * es,
                       (size_t)(m->box.y2 - m->box.y1) * es);
        o = cm_to_device(tp, o, dev);
        return o ? cm_state_set_batch_field(st, m->target_name, o) : cm_tape_status(tp);
    }
    if (!out || cm_tensor_ndim(out) != 2 || cm_tensor_dim(out, 0) != m->n)
        return cm_set_error(CM_ERR_SHAPE, "%s: the outputs %s are not class logits (N, C) for the %lld samples; %s mixes "
                                          "class targets (N) or (N, C)%s",
                            who, out ? cmi_da_desc(out, a, sizeof a) : "(none)", (long long)m->n, who,
                            m->has_box ? " or targets with the input's height and width" : "");
    const int64_t shape[2] = {m->n, cm_tensor_dim(out, 1)};
    cm_tensor *t = cm_empty_on(tp, CM_DEVICE_CPU, CM_DTYPE_F32, 2, shape), *yh = cm_to_device(tp, y, CM_DEVICE_CPU);
    if (!t || !yh) return cm_tape_status(tp);
    cm_status s = cm_mix_targets(yh, m->perm, m->weight, shape[1], t);
    if (s) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "%s: target '%s' %s with outputs %s: %s", who, m->target_name, cmi_da_desc(y, a, sizeof a),
                            cmi_da_desc(out, b, sizeof b), msg);
    }
    t = cm_to_device(tp, t, dev);
    return t ? cm_state_set_batch_field(st, m->target_name, t) : cm_tape_status(tp);
}

cm_status cmi_da_mix_loss(cmi_da_mix *m, cm_state *st, const char *who) {
    cm_tape *tp = cm_state_tape(st);
    const cm_model_batch *mb = cm_state_model_batch(st);
    cm_tensor *y = current(st, m->target_name), *loss = cm_state_loss(st);
    if (!y || !loss) return cm_set_error(CM_ERR_STATE, "%s: no target '%s' or no loss to interpolate", who, m->target_name);
    if (is_spatial(m, y))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: cannot interpolate the loss when the target has the input's height "
                                                "and width (set interpolate_loss false)",
                            who);
    cm_tensor *yp = cm_to_device(tp, permuted(tp, y, m->perm, m->n), cm_tensor_device(y));
    if (!yp) return cm_tape_status(tp);
    /* the model's loss with the partners' targets in place of the target field */
    cm_tensor *fields[CM_DATASET_MAX_FIELDS];
    for (int i = 0; i < mb->n; i++) fields[i] = strcmp(mb->names[i], m->target_name) ? mb->fields[i] : yp;
    const cm_model_batch b2 = {mb->names, fields, mb->n, mb->n_samples, mb->n_tokens};
    cm_tensor *l2 = cm_model_loss(cm_state_model(st), tp, cm_state_outputs(st), &b2);
    cm_tensor *mixed = l2 ? cm_add(tp, cm_mul_scalar(tp, loss, (float)m->weight), cm_mul_scalar(tp, l2, (float)(1.0 - m->weight)))
                          : NULL;
    if (!mixed) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cm_tape_error(tp));
        return cm_set_error(cm_tape_status(tp) ? cm_tape_status(tp) : CM_ERR_INTERNAL,
                            "%s: the loss with the permuted targets: %s", who, msg);
    }
    cm_state_set_loss(st, mixed);
    return CM_OK;
}

void cmi_da_mix_deinit(cmi_da_mix *m) {
    cm_free(m->perm);
    m->perm = NULL, m->cap = m->n = 0;
}
