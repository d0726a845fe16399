/* ColOut (Composer's ColOut): random rows and columns dropped from the images (and, optionally,
 * from targets of the same size) — smaller images with most of their content. */
#include "plugins/data_algos/da_impl.h"

#include <math.h>
#include <stdlib.h>

#define TAG_COLOUT CMI_DA_TAG('C', 'O', 'L', 'O')

static int cmp_i64(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* sorted(randperm(n)[:k]) into idx (n entries of room). */
static void kept(cm_rng *rng, int64_t n, int64_t k, int64_t *idx) {
    cm_random_permutation(rng, n, idx);
    qsort(idx, (size_t)k, sizeof *idx, cmp_i64);
}

/* dst (..., kr, kc) = src (..., H, W) at rows ri, columns ci; one image of `lead` planes. */
static void gather(const char *src, char *dst, int64_t lead, int64_t H, int64_t W, const int64_t *ri, int64_t kr,
                   const int64_t *ci, int64_t kc, size_t es) {
    for (int64_t l = 0; l < lead; l++)
        for (int64_t r = 0; r < kr; r++) {
            const char *s = src + (size_t)((l * H + ri[r]) * W) * es;
            char *d = dst + (size_t)((l * kr + r) * kc) * es;
            for (int64_t c = 0; c < kc; c++) memcpy(d + (size_t)c * es, s + (size_t)ci[c] * es, es);
        }
}

static cm_status dropped(const cm_tensor *t, const int64_t *ri, int64_t kr, const int64_t *ci, int64_t kc,
                         cm_tensor **out) {
    const int nd = cm_tensor_ndim(t);
    int64_t shape[CM_MAX_DIMS];
    memcpy(shape, cm_tensor_shape(t), sizeof(int64_t) * (size_t)nd);
    const int64_t H = shape[nd - 2], W = shape[nd - 1];
    shape[nd - 2] = kr, shape[nd - 1] = kc;
    cm_status s = cmi_da_new_like(t, nd, shape, out);
    if (s) return s;
    gather(cm_tensor_data(t), cm_tensor_data(*out), H && W ? cm_tensor_numel(t) / (H * W) : 0, H, W, ri, kr, ci, kc,
           cm_dtype_size(cm_tensor_dtype(t)));
    return CM_OK;
}

cm_status cm_colout_batch(const cm_tensor *input, const cm_tensor *target, double p_row, double p_col, cm_rng *rng,
                          cm_tensor **out_input, cm_tensor **out_target) {
    if (!input || !rng || !out_input || (target && !out_target))
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_colout_batch: NULL input, rng or outputs");
    *out_input = NULL;
    if (out_target) *out_target = NULL;
    cm_status hs = cmi_da_check_host("cm_colout_batch", input, target, NULL);
    if (hs) return hs;
    char a[96], b[96];
    if (cm_tensor_ndim(input) < 2)
        return cm_set_error(CM_ERR_SHAPE, "cm_colout_batch: input %s must be images (..., H, W)", cmi_da_desc(input, a, sizeof a));
    if (!(p_row >= 0 && p_row <= 1) || !(p_col >= 0 && p_col <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_colout_batch: p_row %g and p_col %g must be in [0, 1]", p_row, p_col);
    const int64_t H = cm_tensor_dim(input, -2), W = cm_tensor_dim(input, -1);
    if (target && (cm_tensor_ndim(target) < 2 || cm_tensor_dim(target, -2) != H || cm_tensor_dim(target, -1) != W))
        return cm_set_error(CM_ERR_SHAPE, "cm_colout_batch: target %s must have the input's height and width (input %s)",
                            cmi_da_desc(target, a, sizeof a), cmi_da_desc(input, b, sizeof b));
    if (!cm_tensor_is_contiguous(input) || (target && !cm_tensor_is_contiguous(target)))
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_colout_batch: input and target must be contiguous");
    const int64_t kr = (int64_t)((1.0 - p_row) * (double)H), kc = (int64_t)((1.0 - p_col) * (double)W);
    int64_t *ri = cm_alloc(sizeof(int64_t) * (size_t)(H + W + 1), 16);
    if (!ri) return cm_set_error(CM_ERR_OOM, "cm_colout_batch: out of memory");
    int64_t *ci = ri + H;
    kept(rng, H, kr, ri);
    kept(rng, W, kc, ci);
    cm_status s = dropped(input, ri, kr, ci, kc, out_input);
    if (!s && target && (s = dropped(target, ri, kr, ci, kc, out_target))) {
        cm_tensor_free(*out_input);
        *out_input = NULL;
    }
    cm_free(ri);
    return s;
}

/* ---- the algorithm ---- */

typedef struct {
    cm_colout_config cfg;
    char *input_key, *target_key;
    cmi_da_owned owned;
} colout;

static bool cl_match(void *self, cm_event ev, const cm_state *st) { return ev == CM_EVENT_AFTER_DATALOADER; }

/* batch false: every sample its own rows and columns, from (seed, epoch, dataset index) */
static cm_status per_sample(colout *c, cm_state *st, const cm_batch *b, int fi) {
    cm_tensor *x = b->fields[fi], *y;
    const int64_t N = cm_tensor_dim(x, 0), H = cm_tensor_dim(x, -2), W = cm_tensor_dim(x, -1);
    const int64_t kr = (int64_t)((1.0 - c->cfg.p_row) * (double)H), kc = (int64_t)((1.0 - c->cfg.p_col) * (double)W);
    int64_t shape[CM_MAX_DIMS];
    memcpy(shape, cm_tensor_shape(x), sizeof(int64_t) * (size_t)cm_tensor_ndim(x));
    shape[cm_tensor_ndim(x) - 2] = kr, shape[cm_tensor_ndim(x) - 1] = kc;
    cm_status s = cmi_da_new_like(x, cm_tensor_ndim(x), shape, &y);
    if (s || (s = cmi_da_owned_add(&c->owned, y))) return s;
    int64_t *ri = cm_alloc(sizeof(int64_t) * (size_t)(H + W + 1), 16);
    if (!ri) return cm_set_error(CM_ERR_OOM, "ColOut: out of memory");
    int64_t *ci = ri + H;
    const size_t es = cm_dtype_size(cm_tensor_dtype(x));
    const int64_t lead = N ? cm_tensor_numel(x) / (N * H * W) : 0;
    for (int64_t i = 0; i < N; i++) {
        const int64_t index = b->indices && b->indices[i] >= 0 ? b->indices[i] : b->position + b->rank_offset + i;
        cm_rng rng = cmi_da_rng(cm_state_seed(st), TAG_COLOUT, 1, b->epoch, index);
        kept(&rng, H, kr, ri);
        kept(&rng, W, kc, ci);
        gather((const char *)cm_tensor_data(x) + (size_t)(i * lead * H * W) * es,
               (char *)cm_tensor_data(y) + (size_t)(i * lead * kr * kc) * es, lead, H, W, ri, kr, ci, kc, es);
    }
    cm_free(ri);
    return cm_state_set_batch_field(st, b->names[fi], y);
}

static cm_status cl_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    colout *c = self;
    const char *who = "ColOut";
    cmi_da_owned_clear(&c->owned);
    cm_batch *b = cm_state_batch(st);
    if (!b) return cm_set_error(CM_ERR_STATE, "%s: there is no batch", who);
    const int fi = cmi_da_field(b->names, b->n_fields, c->input_key, 0, who, "input_key");
    if (fi < 0) return cm_last_status();
    cm_tensor *x = b->fields[fi];
    char d[96], e[96];
    if (cm_tensor_ndim(x) != 4)
        return cm_set_error(CM_ERR_SHAPE, "%s: input '%s' is %s; ColOut drops rows and columns of images (N, C, H, W)", who,
                            b->names[fi], cmi_da_desc(x, d, sizeof d));
    if (!c->cfg.batch) return per_sample(c, st, b, fi);
    /* the target follows when asked to, or (auto) when it has the input's height and width */
    int ft = -1;
    if (c->cfg.resize_target != CM_RESIZE_TARGET_NO) {
        ft = cmi_da_field(b->names, b->n_fields, c->target_key, 1, who, "target_key");
        if (ft < 0) {
            if (c->cfg.resize_target == CM_RESIZE_TARGET_YES) return cm_last_status();
        } else {
            cm_tensor *y = b->fields[ft];
            const bool same = cm_tensor_ndim(y) > 2 && cm_tensor_dim(y, -2) == cm_tensor_dim(x, 2) &&
                              cm_tensor_dim(y, -1) == cm_tensor_dim(x, 3);
            if (!same && c->cfg.resize_target == CM_RESIZE_TARGET_YES)
                return cm_set_error(CM_ERR_SHAPE, "%s: resize_target is true but target '%s' %s does not have the input's "
                                                  "height and width (input %s)",
                                    who, b->names[ft], cmi_da_desc(y, d, sizeof d), cmi_da_desc(x, e, sizeof e));
            if (!same) ft = -1;
        }
    }
    cm_rng rng = cmi_da_rng(cm_state_seed(st), TAG_COLOUT, 0, cm_state_timestamp(st)->batch, 0);
    cm_tensor *nx, *ny = NULL;
    cm_status s = cm_colout_batch(x, ft >= 0 ? b->fields[ft] : NULL, c->cfg.p_row, c->cfg.p_col, &rng, &nx,
                                  ft >= 0 ? &ny : NULL);
    if (s) return s;
    if ((s = cmi_da_owned_add(&c->owned, nx)) || (s = cmi_da_owned_add(&c->owned, ny))) return s;
    if ((s = cm_state_set_batch_field(st, b->names[fi], nx))) return s;
    return ft >= 0 ? cm_state_set_batch_field(st, b->names[ft], ny) : CM_OK;
}

static void cl_free(void *self) {
    colout *c = self;
    if (!c) return;
    cmi_da_owned_clear(&c->owned);
    cm_free(c->input_key);
    cm_free(c->target_key);
    cm_free(c);
}

static const cm_algorithm_i colout_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "ColOut",
    .match = cl_match,
    .apply = cl_apply,
    .free = cl_free,
};

cm_colout_config cm_colout_config_default(void) {
    return (cm_colout_config){0.15, 0.15, true, CM_RESIZE_TARGET_AUTO, NULL, NULL};
}

cm_status cm_colout_new(const cm_colout_config *cfg, cm_algorithm_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_colout_new: out is NULL");
    const cm_colout_config c = cfg ? *cfg : cm_colout_config_default();
    if (!(c.p_col >= 0 && c.p_col <= 1)) return cm_set_error(CM_ERR_INVALID_ARG, "ColOut: p_col must be between 0 and 1 (got %g)", c.p_col);
    if (!(c.p_row >= 0 && c.p_row <= 1)) return cm_set_error(CM_ERR_INVALID_ARG, "ColOut: p_row must be between 0 and 1 (got %g)", c.p_row);
    if ((unsigned)c.resize_target > CM_RESIZE_TARGET_YES)
        return cm_set_error(CM_ERR_INVALID_ARG, "ColOut: resize_target %d must be auto, false or true", (int)c.resize_target);
    if (c.resize_target == CM_RESIZE_TARGET_YES && !c.batch)
        return cm_set_error(CM_ERR_UNSUPPORTED, "ColOut: resizing targets is not supported with batch false (as Composer)");
    colout *p = cm_alloc_zeroed(sizeof *p, 16);
    if (!p || !cmi_da_dup_key(c.input_key, &p->input_key) || !cmi_da_dup_key(c.target_key, &p->target_key)) {
        cl_free(p);
        return cm_set_error(CM_ERR_OOM, "ColOut: out of memory");
    }
    p->cfg = c;
    p->cfg.input_key = p->input_key, p->cfg.target_key = p->target_key;
    *out = (cm_algorithm_plugin){&colout_vt, p};
    return CM_OK;
}
