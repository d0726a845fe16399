#include "cmtrain.h"

#include "tensor/tensor_impl.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t n;
    int d, classes;
    bool tokens;
    int64_t *indices;
    cm_field_desc fields[3];
    float w[64 * 16]; /* (classes, d) */
} synth;

static int64_t s_len(void *self) { return ((synth *)self)->n; }
static int s_nf(void *self) { return 3; }
static const cm_field_desc *s_field(void *self, int i) { return &((synth *)self)->fields[i]; }
static int64_t s_tok(void *self, int64_t i) {
    synth *s = self;
    return 1 + (s->indices ? s->indices[i] : i) % 5;
}
static cm_status s_get(void *self, int64_t i, const cm_sample_ctx *ctx, void *const *out) {
    synth *s = self;
    int64_t idx = s->indices ? s->indices[i] : i;
    float *x = out[0];
    cm_rng r = cm_rng_init(1234, (uint64_t)idx);
    cm_rng_normal(&r, x, (size_t)s->d, 0, 1);
    int best = 0;
    float bv = -1e30f;
    for (int c = 0; c < s->classes; c++) {
        float v = 0;
        for (int k = 0; k < s->d; k++) v += s->w[c * s->d + k] * x[k];
        if (v > bv) bv = v, best = c;
    }
    *(int64_t *)out[1] = best;
    *(float *)out[2] = (float)(1 + idx % 5);
    return CM_OK;
}
static void s_close(void *self) {
    synth *s = self;
    free(s->indices);
    free(s);
}

static const cm_dataset_i synth_vt = {CM_DATASET_ABI, "synth", s_len, s_nf, s_field, s_get, NULL, s_close};
static const cm_dataset_i synth_tok_vt = {CM_DATASET_ABI, "synth", s_len, s_nf, s_field, s_get, s_tok, s_close};

cm_dataset *cmt_synth_dataset(int64_t n, int d, int classes, bool tokens, const int64_t *indices) {
    cr_assert(d <= 64 && classes <= 16);
    synth *s = calloc(1, sizeof *s);
    s->n = n, s->d = d, s->classes = classes, s->tokens = tokens;
    if (indices) {
        s->indices = malloc(sizeof(int64_t) * (size_t)n);
        memcpy(s->indices, indices, sizeof(int64_t) * (size_t)n);
    }
    s->fields[0] = (cm_field_desc){"input", CM_DTYPE_F32, 1, {d}};
    s->fields[1] = (cm_field_desc){"label", CM_DTYPE_I64, 0, {0}};
    s->fields[2] = (cm_field_desc){"ntok", CM_DTYPE_F32, 0, {0}};
    cm_rng r = cm_rng_init(99, 0);
    cm_rng_normal(&r, s->w, (size_t)(classes * d), 0, 1);
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_new(tokens ? &synth_tok_vt : &synth_vt, s, &ds), CM_OK, "%s", cm_last_error());
    return ds;
}

cm_model *cmt_mlp(int d, int hidden, int classes, float dropout, uint64_t seed) {
    cm_rng rng = cm_rng_init(seed, 0);
    cm_module *seq, *l1, *act, *l2;
    cr_assert_eq(cm_nn_sequential_new(&seq), CM_OK);
    cr_assert_eq(cm_nn_linear_new(d, hidden, true, &rng, &l1), CM_OK);
    cr_assert_eq(cm_nn_activation_new(CM_ACT_RELU, &act), CM_OK);
    cr_assert_eq(cm_nn_linear_new(hidden, classes, true, &rng, &l2), CM_OK);
    cm_nn_sequential_append(seq, l1);
    cm_nn_sequential_append(seq, act);
    if (dropout > 0) {
        cm_module *dr;
        cr_assert_eq(cm_nn_dropout_new(dropout, &dr), CM_OK);
        cm_nn_sequential_append(seq, dr);
    }
    cm_nn_sequential_append(seq, l2);
    cm_model *m;
    cr_assert_eq(cm_model_classifier_new(seq, NULL, &m), CM_OK, "%s", cm_last_error());
    return m;
}

cm_dataloader *cmt_loader(cm_dataset *ds, int64_t batch, bool eval, uint64_t seed) {
    cm_dataloader_config c = eval ? cm_dataloader_config_eval() : cm_dataloader_config_default();
    c.batch_size = batch;
    c.seed = seed;
    cm_dataloader *dl;
    cr_assert_eq(cm_dataloader_new(ds, &c, &dl), CM_OK, "%s", cm_last_error());
    return dl;
}

float *cmt_params_copy(cm_model *m, int64_t *n) {
    cm_module *root = cm_model_module(m);
    int64_t total = 0;
    for (int i = 0; i < cm_module_n_units(root); i++) total += cm_module_unit(root, i)->numel;
    float *p = malloc(sizeof(float) * (size_t)(total ? total : 1));
    int64_t off = 0;
    for (int i = 0; i < cm_module_n_units(root); i++) {
        const cm_unit_info *u = cm_module_unit(root, i);
        /* the unit may be on a GPU (cm_module_to_device): copied back */
        cr_assert_eq(cmi_dev_memcpy(p + off, CM_DEVICE_CPU, u->params, u->device, sizeof(float) * (size_t)u->numel),
                     CM_OK, "%s", cm_last_error());
        off += u->numel;
    }
    *n = total;
    return p;
}

int cmt_logged_by_batch(const cm_in_memory_logger *mem, const char *name, double *v, int cap) {
    for (int i = 0; i < cap; i++) v[i] = NAN;
    int n = 0;
    for (int64_t i = 0; i < cm_in_memory_logger_n(mem); i++) {
        const cm_log_record *rec = cm_in_memory_logger_record(mem, i);
        if (strcmp(rec->name, name)) continue;
        cr_assert(rec->batch >= 0 && rec->batch < cap, "%s logged at batch %lld, beyond the %d expected", name,
                  (long long)rec->batch, cap);
        v[rec->batch] = rec->value;
        if (rec->batch + 1 > n) n = (int)rec->batch + 1;
    }
    return n;
}

void cmt_expect_logged_close(const cm_in_memory_logger *a, const cm_in_memory_logger *b, const char *name, int cap,
                             double atol, double rtol) {
    double *va = malloc(sizeof(double) * (size_t)cap), *vb = malloc(sizeof(double) * (size_t)cap);
    cr_assert(va && vb);
    const int na = cmt_logged_by_batch(a, name, va, cap), nb = cmt_logged_by_batch(b, name, vb, cap);
    cr_assert(na > 0 && na == nb, "%s logged up to batch %d in one run and %d in the other", name, na, nb);
    for (int i = 0; i < na; i++)
        cr_expect(isnan(va[i]) == isnan(vb[i]) && (isnan(va[i]) || fabs(va[i] - vb[i]) <= atol + rtol * fabs(va[i])),
                  "%s batch %d: %.8g vs %.8g (atol %g, rtol %g)", name, i, vb[i], va[i], atol, rtol);
    free(va);
    free(vb);
}
