/* SelectiveBackprop (Jiang et al. 2019, Composer's SelectiveBackprop): an extra forward without
 * gradients ranks the batch's samples by loss, and the step trains on a loss-weighted draw of
 * them. */
#include "plugins/data_algos/da_impl.h"

#include <math.h>
#include <stdlib.h>

#define TAG_SB CMI_DA_TAG('S', 'B', 'P', 'R')

bool cm_should_selective_backprop(double elapsed, int64_t batch_in_epoch, double start, double end, int64_t interrupt) {
    const bool in_interval = elapsed >= start && elapsed < end;
    const bool step = interrupt == 0 || (batch_in_epoch + 1) % interrupt != 0;
    return in_interval && step;
}

typedef struct {
    float loss;
    int64_t row;
} ranked;

static int by_loss(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    /* NaN (a row with nothing to score) sorts last, as torch.argsort puts it */
    const float lx = isnan(x->loss) ? INFINITY : x->loss, ly = isnan(y->loss) ? INFINITY : y->loss;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x->row < y->row ? -1 : x->row > y->row; /* ties: by row, so the order is total */
}

cm_status cm_select_using_loss(const float *losses, int64_t n, double keep, const double *u, cm_rng *rng,
                               int64_t *select, int64_t *n_select) {
    if (!losses || n < 1 || !select || !n_select || (!u && !rng) || !(keep > 0 && keep <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "select_using_loss: need n >= 1 losses (%lld), keep in (0, 1] (%g), "
                                                "outputs and uniforms or a generator",
                            (long long)n, keep);
    ranked *r = cm_alloc(sizeof *r * (size_t)n, 16);
    double *p = cm_alloc(sizeof(double) * (size_t)n, 16);
    if (!r || !p) {
        cm_free(r);
        cm_free(p);
        return cm_set_error(CM_ERR_OOM, "select_using_loss: out of memory");
    }
    for (int64_t i = 0; i < n; i++) r[i] = (ranked){losses[i], i};
    qsort(r, (size_t)n, sizeof *r, by_loss);
    /* percs = arange(0.5, N, 1) / N; probs = percs^(1/keep - 1) (numpy normalises them; the draw
     * below normalises the remaining mass at every step, so the scale does not matter) */
    for (int64_t i = 0; i < n; i++) p[i] = pow(((double)i + 0.5) / (double)n, 1.0 / keep - 1.0);
    const int64_t k = (int64_t)(keep * (double)n);
    for (int64_t j = 0; j < k; j++) {
        const double uj = u ? u[j] : cmi_da_u01(rng);
        double total = 0;
        for (int64_t i = 0; i < n; i++) total += p[i];
        /* numpy: cdf = cumsum(p) / cdf[-1]; index = searchsorted(cdf, u, 'right') */
        double cum = 0;
        int64_t pick = -1, last = -1;
        for (int64_t i = 0; i < n && pick < 0; i++) {
            if (p[i] <= 0) continue;
            cum += p[i];
            last = i;
            if (cum / total > uj) pick = i;
        }
        if (pick < 0) pick = last; /* u rounding to the top of the cdf */
        select[j] = r[pick].row;
        p[pick] = 0;
    }
    *n_select = k;
    cm_free(r);
    cm_free(p);
    return CM_OK;
}

cm_status cm_interpolate_bilinear(const cm_tensor *x, double s, cm_tensor **out) {
    if (!x || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_interpolate_bilinear: NULL input or out");
    cm_status hs = cmi_da_check_host("cm_interpolate_bilinear", x, NULL);
    if (hs) return hs;
    char d[96];
    if (cm_tensor_ndim(x) != 4) return cm_set_error(CM_ERR_SHAPE, "cm_interpolate_bilinear: %s is not (N, C, H, W)", cmi_da_desc(x, d, sizeof d));
    if (cm_tensor_dtype(x) != CM_DTYPE_F32 || !cm_tensor_is_contiguous(x))
        return cm_set_error(CM_ERR_DTYPE, "cm_interpolate_bilinear: %s must be f32 and contiguous", cmi_da_desc(x, d, sizeof d));
    const int64_t N = cm_tensor_dim(x, 0), C = cm_tensor_dim(x, 1), H = cm_tensor_dim(x, 2), W = cm_tensor_dim(x, 3);
    const int64_t oh = (int64_t)((double)H * s), ow = (int64_t)((double)W * s);
    if (!(s > 0 && s <= 1) || oh < 1 || ow < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_interpolate_bilinear: scale %g must be in (0, 1] and leave a non-empty "
                                                "image of %s",
                            s, cmi_da_desc(x, d, sizeof d));
    const int64_t shape[4] = {N, C, oh, ow};
    cm_status st = cm_tensor_new(CM_DTYPE_F32, 4, shape, out);
    if (st) return st;
    int64_t *i0 = cm_alloc(sizeof(int64_t) * 2 * (size_t)(oh + ow), 16);
    double *l1 = cm_alloc(sizeof(double) * (size_t)(oh + ow), 16);
    if (!i0 || !l1) {
        cm_free(i0), cm_free(l1), cm_tensor_free(*out);
        *out = NULL;
        return cm_set_error(CM_ERR_OOM, "cm_interpolate_bilinear: out of memory");
    }
    /* torch's source index src = scale·(dst + 0.5) - 0.5 with scale = (float)(1/s), the rest in
     * double (measured against torch 1.13: within 1.2e-7 this way, 1e-6 when all in f32), clamped
     * at 0; the pair (i, i + 1 unless i is the last) weighted (1 - λ, λ) */
    const double scale = (double)(float)(1.0 / s);
    for (int64_t k = 0; k < oh + ow; k++) {
        const bool row = k < oh;
        const int64_t dst = row ? k : k - oh, in = row ? H : W;
        double src = scale * ((double)dst + 0.5) - 0.5;
        if (src < 0) src = 0;
        int64_t a = (int64_t)src;
        if (a > in - 1) a = in - 1;
        double lam = src - (double)a;
        lam = lam < 0 ? 0 : lam > 1 ? 1 : lam;
        i0[2 * k] = a, i0[2 * k + 1] = a < in - 1 ? a + 1 : a;
        l1[k] = lam;
    }
    const float *xp = cm_tensor_data(x);
    float *yp = cm_tensor_data(*out);
#pragma omp parallel for schedule(static) if (N * C * oh * ow > 65536)
    for (int64_t nc = 0; nc < N * C; nc++) {
        const float *img = xp + nc * H * W;
        for (int64_t r = 0; r < oh; r++) {
            const float *r0 = img + i0[2 * r] * W, *r1 = img + i0[2 * r + 1] * W;
            const double h1 = l1[r], h0 = 1.0 - h1;
            for (int64_t c = 0; c < ow; c++) {
                const int64_t k = oh + c, c0 = i0[2 * k], c1 = i0[2 * k + 1];
                const double w1 = l1[k], w0 = 1.0 - w1;
                yp[(nc * oh + r) * ow + c] = (float)(h0 * (w0 * r0[c0] + w1 * r0[c1]) + h1 * (w0 * r1[c0] + w1 * r1[c1]));
            }
        }
    }
    cm_free(i0);
    cm_free(l1);
    return CM_OK;
}

/* ---- the algorithm ---- */

typedef struct {
    cm_selective_backprop_config cfg;
    char *input_key, *target_key;
    cmi_da_owned owned;
    int64_t *arrays, cap; /* (4·cap): selection, indices, row_tokens, valid bytes */
    float *losses;
} sbp;

static bool sb_match(void *self, cm_event ev, const cm_state *st) {
    const sbp *b = self;
    if (ev != CM_EVENT_AFTER_DATALOADER || !(b->cfg.keep < 1)) return false;
    double e;
    if (cm_state_elapsed(st, &e)) return false;
    return cm_should_selective_backprop(e, cm_state_timestamp(st)->batch_in_epoch, b->cfg.start, b->cfg.end,
                                        b->cfg.interrupt);
}

static cm_status grow(sbp *b, int64_t n) {
    if (n <= b->cap) return CM_OK;
    int64_t *a = cm_alloc(sizeof(int64_t) * 4 * (size_t)n, 16);
    float *l = cm_alloc(sizeof(float) * (size_t)n, 16);
    if (!a || !l) {
        cm_free(a), cm_free(l);
        return cm_set_error(CM_ERR_OOM, "SelectiveBackprop: out of memory");
    }
    cm_free(b->arrays), cm_free(b->losses);
    b->arrays = a, b->losses = l, b->cap = n;
    return CM_OK;
}

/* Each row's loss: forward of chunks of the microbatch size without gradients, then the model's
 * own loss of every row (its outputs and fields narrowed to it). On a model on a GPU the chunk's
 * fields go there first, and the chunk's row losses come back in one copy. */
static cm_status row_losses(sbp *b, cm_state *st, const cm_batch *bt, int fi, cm_tensor *small) {
    cm_model *m = cm_state_model(st);
    cm_tape *tp = cm_state_tape(st);
    const cm_device dev = cm_module_device(cm_model_module(m));
    const int64_t n = bt->n_rows, mbs = cm_state_microbatch_size(st) > 0 ? cm_state_microbatch_size(st) : n;
    const bool prev = cm_tape_set_grad_enabled(tp, false);
    cm_status s = CM_OK;
    cm_tensor *fields[CM_DATASET_MAX_FIELDS], *row[CM_DATASET_MAX_FIELDS];
    for (int64_t r0 = 0; r0 < n && !s; r0 += mbs) {
        const int64_t len = r0 + mbs <= n ? mbs : n - r0, one_shape[1] = {1};
        for (int f = 0; f < bt->n_fields; f++)
            fields[f] = cm_to_device(tp, cm_narrow(tp, f == fi && small ? small : bt->fields[f], 0, r0, len), dev);
        const cm_model_batch mb = {bt->names, fields, bt->n_fields, len, 0};
        cm_tensor *out = cm_model_forward(m, tp, &mb);
        cm_tensor **ls = out ? cm_arena_alloc(cm_tape_arena(tp), sizeof(cm_tensor *) * (size_t)len) : NULL;
        if (out && !ls) cm_tape_fail(tp, CM_ERR_OOM, "out of memory for %lld row losses", (long long)len);
        for (int64_t i = 0; ls && i < len; i++) {
            for (int f = 0; f < bt->n_fields; f++) row[f] = cm_narrow(tp, fields[f], 0, i, 1);
            const cm_model_batch one = {bt->names, row, bt->n_fields, 1, 0};
            ls[i] = cm_reshape(tp, cm_model_loss(m, tp, cm_narrow(tp, out, 0, i, 1), &one), 1, one_shape);
            if (!ls[i]) ls = NULL;
        }
        /* the losses are f32 scalars (the trainer's contract): (len,) on the host */
        cm_tensor *all = ls ? cm_contiguous(tp, cm_to_device(tp, cm_concat(tp, ls, (int)len, 0), CM_DEVICE_CPU)) : NULL;
        if (all && cm_tensor_dtype(all) != CM_DTYPE_F32) {
            cm_tape_fail(tp, CM_ERR_DTYPE, "the model's loss is %s, not f32", cm_dtype_name(cm_tensor_dtype(all)));
            all = NULL;
        }
        if (all) memcpy(b->losses + r0, cm_tensor_data(all), sizeof(float) * (size_t)len);
        if (!all) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", cm_tape_error(tp));
            s = cm_set_error(cm_tape_status(tp) ? cm_tape_status(tp) : CM_ERR_INTERNAL,
                             "SelectiveBackprop: the selection forward (rows %lld..%lld): %s", (long long)r0,
                             (long long)(r0 + len), msg);
        }
        cm_tape_reset(tp);
    }
    cm_tape_set_grad_enabled(tp, prev);
    return s;
}

static cm_status sb_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    sbp *b = self;
    const char *who = "SelectiveBackprop";
    cmi_da_owned_clear(&b->owned);
    cm_batch *bt = cm_state_batch(st);
    if (!bt) return cm_set_error(CM_ERR_STATE, "%s: there is no batch", who);
    int n_spans = 0;
    if (cm_state_world_size(st) > 1 && cm_state_shard_spans(st, &n_spans))
        return cm_set_error(CM_ERR_UNSUPPORTED, "%s: the selection forward under a sharded strategy on %d ranks is not "
                                                "supported (use sharding_strategy NO_SHARD)",
                            who, cm_state_world_size(st));
    const int fi = cmi_da_field(bt->names, bt->n_fields, b->input_key, 0, who, "input_key");
    if (fi < 0) return cm_last_status();
    if (cmi_da_field(bt->names, bt->n_fields, b->target_key, 1, who, "target_key") < 0) return cm_last_status();
    const int64_t n = bt->n_rows;
    if (n < 1) return CM_OK;
    cm_status s = grow(b, n);
    if (s) return s;
    cm_tensor *small = NULL;
    if (b->cfg.scale_factor < 1) {
        char d[96];
        cm_tensor *x = bt->fields[fi];
        if (cm_tensor_ndim(x) != 4 || cm_tensor_dtype(x) != CM_DTYPE_F32)
            return cm_set_error(CM_ERR_SHAPE, "%s: scale_factor %g downscales images (N, C, H, W) f32, but input '%s' is %s",
                                who, b->cfg.scale_factor, bt->names[fi], cmi_da_desc(x, d, sizeof d));
        if ((s = cm_interpolate_bilinear(x, b->cfg.scale_factor, &small))) return s;
        if ((s = cmi_da_owned_add(&b->owned, small))) return s;
    }
    if ((s = row_losses(b, st, bt, fi, small))) return s;
    cm_rng rng = cmi_da_rng(cm_state_seed(st), TAG_SB, cm_state_timestamp(st)->batch, cm_state_rank(st), 0);
    int64_t *sel = b->arrays, k;
    if ((s = cm_select_using_loss(b->losses, n, b->cfg.keep, NULL, &rng, sel, &k))) return s;
    /* the batch becomes the selected rows of every field, in draw order */
    cm_batch nb = *bt;
    for (int f = 0; f < bt->n_fields; f++) {
        cm_tensor *src = bt->fields[f], *dst;
        int64_t shape[CM_MAX_DIMS];
        memcpy(shape, cm_tensor_shape(src), sizeof(int64_t) * (size_t)cm_tensor_ndim(src));
        shape[0] = k;
        if ((s = cmi_da_new_like(src, cm_tensor_ndim(src), shape, &dst)) || (s = cmi_da_owned_add(&b->owned, dst))) return s;
        const size_t row = cm_tensor_nbytes(src) / (size_t)n;
        for (int64_t j = 0; j < k; j++)
            memcpy((char *)cm_tensor_data(dst) + (size_t)j * row, (const char *)cm_tensor_data(src) + (size_t)sel[j] * row,
                   row);
        nb.fields[f] = dst;
    }
    int64_t *idx = b->arrays + b->cap, *tok = b->arrays + 2 * b->cap;
    uint8_t *valid = (uint8_t *)(b->arrays + 3 * b->cap);
    nb.n_tokens = 0;
    for (int64_t j = 0; j < k; j++) {
        idx[j] = bt->indices ? bt->indices[sel[j]] : -1;
        tok[j] = bt->row_tokens ? bt->row_tokens[sel[j]] : 0;
        valid[j] = 1;
        nb.n_tokens += tok[j];
    }
    nb.n_rows = nb.n_samples = k, nb.n_padded = 0;
    nb.indices = idx, nb.row_tokens = tok, nb.valid = valid;
    return cm_state_set_batch(st, &nb);
}

static void sb_free(void *self) {
    sbp *b = self;
    if (!b) return;
    cmi_da_owned_clear(&b->owned);
    cm_free(b->arrays);
    cm_free(b->losses);
    cm_free(b->input_key);
    cm_free(b->target_key);
    cm_free(b);
}

static const cm_algorithm_i sbp_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "SelectiveBackprop",
    .match = sb_match,
    .apply = sb_apply,
    .free = sb_free,
};

cm_selective_backprop_config cm_selective_backprop_config_default(void) {
    return (cm_selective_backprop_config){0.5, 0.9, 0.5, 1.0, 2, NULL, NULL};
}

cm_status cm_selective_backprop_new(const cm_selective_backprop_config *cfg, cm_algorithm_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_selective_backprop_new: out is NULL");
    const cm_selective_backprop_config c = cfg ? *cfg : cm_selective_backprop_config_default();
    const char *who = "SelectiveBackprop";
    if (!(c.start >= 0 && c.start <= 1) || !(c.end >= 0 && c.end <= 1) || !(c.start <= c.end))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: start %g and end %g must be fractions of the run with start <= end",
                            who, c.start, c.end);
    if (!(c.keep > 0 && c.keep <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: keep %g must be in (0, 1]", who, c.keep);
    if (!(c.scale_factor > 0 && c.scale_factor <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: scale_factor must be <= 1 (and > 0), got %g", who, c.scale_factor);
    if (c.interrupt < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: interrupt %lld must be >= 0 (0: never)", who, (long long)c.interrupt);
    sbp *b = cm_alloc_zeroed(sizeof *b, 16);
    if (!b || !cmi_da_dup_key(c.input_key, &b->input_key) || !cmi_da_dup_key(c.target_key, &b->target_key)) {
        sb_free(b);
        return cm_set_error(CM_ERR_OOM, "%s: out of memory", who);
    }
    b->cfg = c;
    b->cfg.input_key = b->input_key, b->cfg.target_key = b->target_key;
    *out = (cm_algorithm_plugin){&sbp_vt, b};
    return CM_OK;
}
