/* The golden GPT-2 training run's pieces (tests/golden/gen_train_gpt2.py), shared by the CPU golden
 * test (test_golden_train_gpt2.c) and the GPU trainer tests (test_gpu_train.c). */
#include "cmgolden_gpt2.h"

#include <composer/zoo_gpt2.h>
#include <stdlib.h>
#include <string.h>

#define N_STEPS CMT_GOLDEN_GPT2_STEPS
#define B CMT_GOLDEN_GPT2_B
#define T CMT_GOLDEN_GPT2_T

/* ---------------------------------------------------------------------------------------------
 * The stored batches as a dataset: sample i is row i % B of batch i / B (loader unshuffled)
 * ------------------------------------------------------------------------------------------- */

typedef struct {
    int64_t ids[N_STEPS * B * T], labels[N_STEPS * B * T];
    cm_field_desc fields[2];
} gold_ds;

static int64_t g_len(void *self) { return (void)self, N_STEPS * B; }
static int g_nf(void *self) { return (void)self, 2; }
static const cm_field_desc *g_field(void *self, int i) { return &((gold_ds *)self)->fields[i]; }
/* As the token-file dataset (datasets.h): every position of the window is a token. */
static int64_t g_tok(void *self, int64_t i) { return (void)self, (void)i, T; }
static cm_status g_get(void *self, int64_t i, const cm_sample_ctx *ctx, void *const *out) {
    (void)ctx;
    gold_ds *d = self;
    memcpy(out[0], d->ids + i * T, sizeof(int64_t) * T);
    memcpy(out[1], d->labels + i * T, sizeof(int64_t) * T);
    return CM_OK;
}
static void g_close(void *self) { free(self); }
static const cm_dataset_i gold_vt = {CM_DATASET_ABI, "golden_gpt2_batches", g_len, g_nf, g_field, g_get, g_tok, g_close};

static void copy_i64(cmt_golden *g, const char *name, int64_t *dst) {
    cm_tensor *t = cmt_golden_get(g, name);
    cr_assert_eq(cm_tensor_numel(t), N_STEPS * B * T, "%s has %lld elements", name, (long long)cm_tensor_numel(t));
    memcpy(dst, cm_tensor_data(t), sizeof(int64_t) * N_STEPS * B * T);
    cm_tensor_free(t);
}

/* masked: the labels with -100; last_row_ignored: also every label of each batch's last row. */
cm_dataset *cmt_golden_gpt2_dataset(cmt_golden *g, bool masked, bool last_row_ignored) {
    gold_ds *d = calloc(1, sizeof *d);
    copy_i64(g, "input_ids", d->ids);
    copy_i64(g, masked ? "labels_masked" : "labels", d->labels);
    if (last_row_ignored)
        for (int s = 0; s < N_STEPS; s++)
            for (int t = 0; t < T; t++) d->labels[(s * B + B - 1) * T + t] = -100;
    d->fields[0] = (cm_field_desc){"input_ids", CM_DTYPE_I64, 1, {T}};
    d->fields[1] = (cm_field_desc){"labels", CM_DTYPE_I64, 1, {T}};
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_new(&gold_vt, d, &ds), CM_OK, "%s", cm_last_error());
    return ds;
}

/* The golden holds "init.<name>", "plain.final.<name>", ... : load one prefix as the weights. */
bool cmt_golden_gpt2_strip_prefix(const char *file_name, char *buf, size_t cap, void *data) {
    const char *pre = data;
    size_t n = strlen(pre);
    if (strncmp(file_name, pre, n)) return false;
    snprintf(buf, cap, "%s", file_name + n);
    return true;
}

cm_model *cmt_golden_gpt2_model(void) {
    cm_gpt2_config cfg;
    cr_assert_eq(cm_gpt2_config_preset("tiny", &cfg), CM_OK);
    cfg.vocab_size = 64, cfg.n_positions = T; /* C 32, L 2, H 4, dropout 0 from "tiny" */
    cm_model *m;
    cr_assert_eq(cm_gpt2_new(&cfg, NULL, &m), CM_OK, "%s", cm_last_error());
    return m;
}

/* Loads the parameters stored under `prefix` into m (strict: every parameter must be there). */
void cmt_golden_gpt2_load(cm_model *m, const char *prefix) {
    static const char *const others[] = {"init.*", "plain.*", "masked.*", "input_ids", "labels", "labels_masked", "lr"};
    const char *ign[8];
    int n_ign = 0;
    for (size_t i = 0; i < sizeof others / sizeof *others; i++)
        if (strncmp(others[i], prefix, strlen(prefix))) ign[n_ign++] = others[i];
    cm_load_opts o = cm_load_opts_default();
    o.rename = cmt_golden_gpt2_strip_prefix, o.rename_data = (void *)prefix;
    o.ignore = ign, o.n_ignore = n_ign;
    cm_load_report rep;
    cr_assert_eq(cm_gpt2_load_safetensors(m, CMT_GOLDEN_GPT2, &o, &rep), CM_OK, "%s", cm_last_error());
    cr_assert_eq(rep.n_loaded, cm_module_n_params(cm_model_module(m)), "loaded %lld of %lld parameters",
                 (long long)rep.n_loaded, (long long)cm_module_n_params(cm_model_module(m)));
}

/* AdamW with two groups: the parameters flagged no_decay (by default those with < 2 dims) get
 * weight decay 0, the rest 0.1. One span per parameter, named after it. */
cm_optim *cmt_golden_gpt2_adamw(cm_model *m) {
    cm_module *root = cm_model_module(m);
    const int64_t np = cm_module_n_params(root);
    cm_optim_span *spans[2] = {calloc((size_t)np, sizeof(cm_optim_span)), calloc((size_t)np, sizeof(cm_optim_span))};
    int n[2] = {0, 0};
    for (int64_t i = 0; i < np; i++) {
        cm_param_info p = cm_module_param_info(root, i);
        const cm_unit_info *u = cm_module_unit(root, p.unit);
        cr_assert_eq(p.no_decay, cm_tensor_ndim(p.tensor) < 2, "%s: no_decay %d with %d dims", p.name, p.no_decay,
                     cm_tensor_ndim(p.tensor));
        spans[p.no_decay][n[p.no_decay]++] = (cm_optim_span){p.name, u->params + p.offset, u->grads + p.offset, p.numel};
    }
    cr_assert_eq(n[0], 2 + 4 * 2, "decayed: wte, wpe and 4 Conv1D weights per block (got %d)", n[0]);
    cm_optim *o;
    cr_assert_eq(cm_optim_new(CM_OPTIM_ADAMW, &o), CM_OK);
    for (int g = 0; g < 2; g++) {
        cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_ADAMW);
        hp.lr = 1e-2, hp.beta1 = 0.9, hp.beta2 = 0.95, hp.eps = 1e-8, hp.weight_decay = g == 0 ? 0.1 : 0.0;
        cr_assert_eq(cm_optim_add_group(o, &hp, spans[g], n[g]), CM_OK, "%s", cm_last_error());
        free(spans[g]);
    }
    return o;
}

