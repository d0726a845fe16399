#include "synth.h"

#include <stdlib.h>

typedef struct synth {
    cm_field_desc fields[2];
    float w[DT_C * DT_D];
    int64_t n;
} synth;

static int64_t s_len(void *self) { return ((synth *)self)->n; }
static int s_nf(void *self) { return 2; }
static const cm_field_desc *s_field(void *self, int i) { return &((synth *)self)->fields[i]; }
static int64_t s_tok(void *self, int64_t i) { return 1 + i % 5; }
static cm_status s_get(void *self, int64_t i, const cm_sample_ctx *ctx, void *const *out) {
    synth *s = self;
    float *x = out[0];
    cm_rng r = cm_rng_init(1234, (uint64_t)i);
    cm_rng_normal(&r, x, DT_D, 0, 1);
    int best = 0;
    float bv = -1e30f;
    for (int c = 0; c < DT_C; c++) {
        float v = 0;
        for (int k = 0; k < DT_D; k++) v += s->w[c * DT_D + k] * x[k];
        if (v > bv) bv = v, best = c;
    }
    *(int64_t *)out[1] = best;
    return CM_OK;
}
static void s_close(void *self) { free(self); }
static const cm_dataset_i k_synth = {CM_DATASET_ABI, "synth", s_len, s_nf, s_field, s_get, s_tok, s_close};
static const cm_dataset_i k_synth_no_tokens = {CM_DATASET_ABI, "synth", s_len, s_nf, s_field, s_get, NULL, s_close};

cm_status dt_synth_new(int64_t n, bool tokens, cm_dataset **out) {
    synth *s = calloc(1, sizeof *s);
    if (!s) return cm_set_error(CM_ERR_OOM, "dt_synth_new: out of memory");
    s->n = n;
    s->fields[0] = (cm_field_desc){"input", CM_DTYPE_F32, 1, {DT_D}};
    s->fields[1] = (cm_field_desc){"label", CM_DTYPE_I64, 0, {0}};
    cm_rng wr = cm_rng_init(99, 0);
    cm_rng_normal(&wr, s->w, DT_C * DT_D, 0, 1);
    cm_status st = cm_dataset_new(tokens ? &k_synth : &k_synth_no_tokens, s, out);
    if (st) free(s);
    return st;
}

#define DT_TRY(call)                      \
    do {                                  \
        cm_status st_ = (call);           \
        if (st_ != CM_OK) return st_;     \
    } while (0)

cm_status dt_mlp_new(uint64_t stream, float dropout_p, cm_model **out) {
    enum { H = 16 };
    cm_rng rng = cm_rng_init(7, stream);
    cm_module *seq, *l[3], *a1, *a2;
    DT_TRY(cm_nn_sequential_new(&seq));
    DT_TRY(cm_nn_linear_new(DT_D, H, true, &rng, &l[0]));
    DT_TRY(cm_nn_activation_new(CM_ACT_RELU, &a1));
    DT_TRY(cm_nn_linear_new(H, H, true, &rng, &l[1]));
    DT_TRY(cm_nn_activation_new(CM_ACT_RELU, &a2));
    DT_TRY(cm_nn_linear_new(H, DT_C, true, &rng, &l[2]));
    cm_module *order[5] = {l[0], a1, l[1], a2, l[2]};
    for (int i = 0; i < 5; i++) {
        DT_TRY(cm_nn_sequential_append(seq, order[i]));
        if (dropout_p > 0 && (i == 1 || i == 3)) {
            cm_module *dr;
            DT_TRY(cm_nn_dropout_new(dropout_p, &dr));
            DT_TRY(cm_nn_sequential_append(seq, dr));
        }
    }
    for (int i = 0; i < 3; i++) DT_TRY(cm_module_set_wrap_unit(l[i], NULL));
    return cm_model_classifier_new(seq, NULL, out);
}
