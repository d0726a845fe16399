/* LayerFreezing: the schedule and depth against Composer's functions; freezing a model under AdamW
 * and SGD equals torch with the parameters removed from the optimizer's group; the layer lists of
 * the zoo models are Composer's; in the trainer, frozen layers stop moving and stop getting
 * gradients, the metrics are logged, resumption is exact (after freezing happened) on every model
 * family, and fit works twice; argument errors. */
#include "cmalgo.h"
#include "cmtest.h"
#include "cmtrain.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static cmt_golden *golden(void) { return cmt_golden_open("tests/golden/train_algos.safetensors"); }

Test(layer_freezing, schedule_and_depth_match_composer) {
    cmt_golden *g = golden();
    cm_tensor *rows = cmt_golden_get(g, "lf.schedule"), *depths = cmt_golden_get(g, "lf.schedule_depths");
    const int64_t n = cm_tensor_dim(rows, 0);
    const float *r = cm_tensor_data(rows);
    const int64_t *d = cm_tensor_data(depths);
    /* the generator's grid, as the same decimals (the file's f32 copies of them are rounded) */
    const double curs[8] = {0.0, 0.25, 0.5, 0.5000001, 0.6, 0.75, 0.9, 1.0}, starts[3] = {0.0, 0.5, 0.9},
                 levels[3] = {1.0, 0.5, 0.3};
    cr_assert_eq(n, 8 * 3 * 3);
    for (int64_t i = 0; i < n; i++) {
        const double cur = curs[i / 9], start = starts[(i / 3) % 3], level = levels[i % 3];
        cr_assert(r[6 * i] == (float)cur && r[6 * i + 1] == (float)start && r[6 * i + 2] == (float)level, "row %lld",
                  (long long)i);
        const double f = cm_layer_freezing_schedule(cur, start, level);
        cr_expect(fabs(f - r[6 * i + 3]) <= 1e-6 * fmax(1, fabs(f)), "row %lld: fraction %.9g vs %.9g", (long long)i, f,
                  r[6 * i + 3]);
        cr_expect_eq((int64_t)(f * 2), d[2 * i], "row %lld: depth of 3 layers", (long long)i);
        cr_expect_eq((int64_t)(f * 15), d[2 * i + 1], "row %lld: depth of 16 layers (fraction %.17g)", (long long)i, f);
    }
    cm_tensor_free(rows);
    cm_tensor_free(depths);
    cmt_golden_close(g);
}

/* nn.Sequential(Linear(4, 6), ReLU, Linear(6, 5), ReLU, Linear(5, 3)) */
static cm_module *seq5(void) {
    cm_module *s, *l0, *a1, *l2, *a3, *l4;
    cr_assert_eq(cm_nn_sequential_new(&s), CM_OK);
    cr_assert_eq(cm_nn_linear_new(4, 6, true, NULL, &l0), CM_OK);
    cr_assert_eq(cm_nn_activation_new(CM_ACT_RELU, &a1), CM_OK);
    cr_assert_eq(cm_nn_linear_new(6, 5, true, NULL, &l2), CM_OK);
    cr_assert_eq(cm_nn_activation_new(CM_ACT_RELU, &a3), CM_OK);
    cr_assert_eq(cm_nn_linear_new(5, 3, true, NULL, &l4), CM_OK);
    cm_module *ms[5] = {l0, a1, l2, a3, l4};
    for (int i = 0; i < 5; i++) cm_nn_sequential_append(s, ms[i]);
    cr_assert_eq(cm_module_finalize(s), CM_OK);
    return s;
}

static void trajectory(const char *opt_name, cm_optim_kind kind) {
    cmt_golden *g = golden();
    cm_module *m = seq5();
    char key[128];
    for (int64_t i = 0; i < cm_module_n_params(m); i++) {
        cm_param_info p = cm_module_param_info(m, i);
        snprintf(key, sizeof key, "lf.%s.init.%s", opt_name, p.name);
        cm_tensor *t = cmt_golden_get(g, key);
        memcpy(cm_tensor_data(p.tensor), cm_tensor_data(t), cm_tensor_nbytes(t));
        cm_tensor_free(t);
    }
    const cm_unit_info *u = cm_module_unit(m, 0);
    cm_optim_span sp = {u->name, u->params, u->grads, u->numel};
    cm_optim_hparams hp = cm_optim_hparams_default(kind);
    hp.lr = 0.1;
    if (kind == CM_OPTIM_SGD) hp.momentum = 0.9, hp.weight_decay = 0.05;
    else hp.weight_decay = 0.1;
    cm_optim *o;
    cr_assert_eq(cm_optim_new(kind, &o), CM_OK);
    cr_assert_eq(cm_optim_add_group(o, &hp, &sp, 1), CM_OK);
    for (int k = 0; k < 5; k++) {
        if (k == 2) {
            int64_t depth;
            double pct;
            cr_assert_eq(cm_freeze_layers(m, o, 0.75, 0.5, 1.0, &depth, &pct), CM_OK, "%s", cm_last_error());
            cr_expect_eq(depth, 1);
            cr_expect_eq(pct, 0.5);
            cr_expect(!cm_tensor_requires_grad(cm_module_find_param(m, "0.weight")));
            cr_expect(!cm_tensor_requires_grad(cm_module_find_param(m, "0.bias")));
            cr_expect(cm_tensor_requires_grad(cm_module_find_param(m, "2.weight")));
            cr_expect_eq(cm_optim_n_excluded(o), 4 * 6 + 6);
        }
        for (int64_t i = 0; i < cm_module_n_params(m); i++) { /* every gradient given: exclusion must ignore them */
            cm_param_info p = cm_module_param_info(m, i);
            snprintf(key, sizeof key, "lf.grad%d.%s", k, p.name);
            cm_tensor *t = cmt_golden_get(g, key);
            memcpy(u->grads + p.offset, cm_tensor_data(t), cm_tensor_nbytes(t));
            cm_tensor_free(t);
        }
        cr_assert_eq(cm_optim_step(o, 1.0), CM_OK);
    }
    for (int64_t i = 0; i < cm_module_n_params(m); i++) {
        cm_param_info p = cm_module_param_info(m, i);
        snprintf(key, sizeof key, "lf.%s.final.%s", opt_name, p.name);
        cm_tensor *want = cmt_golden_get(g, key);
        char what[160];
        snprintf(what, sizeof what, "%s %s", opt_name, p.name);
        cmt_assert_close(what, p.tensor, want, 1e-6, 1e-5);
        cm_tensor_free(want);
    }
    cm_optim_free(o);
    cm_module_free(m);
    cmt_golden_close(g);
}

Test(layer_freezing, frozen_layers_leave_the_optimizer_as_in_torch) {
    trajectory("adamw", CM_OPTIM_ADAMW);
    trajectory("sgd", CM_OPTIM_SGD);
}

static void expect_layers(cmt_rig_fn make, const char *const *want, int n_want) {
    cmt_rig rig;
    make(&rig, NULL);
    cm_module *root = cm_model_module(rig.model);
    cm_module *layers[64];
    const int64_t n = cm_layer_freezing_layers(root, layers, 64);
    cr_assert_eq(n, n_want, "%s: %lld layers, want %d", rig.family, (long long)n, n_want);
    for (int64_t i = 0; i < n; i++) {
        char path[256];
        cm_module_path(layers[i], path, sizeof path);
        cr_expect_str_eq(path, want[i], "%s: layer %lld", rig.family, (long long)i);
    }
    cmt_rig_free(&rig);
}

Test(layer_freezing, layer_lists_follow_torch_module_order) {
    const char *cnn[] = {"conv1", "conv2", "fc1", "fc2"}; /* dropouts have no parameters */
    expect_layers(cmt_rig_cnn, cnn, 4);
    const char *resnet[] = {"conv1",         "bn1",          "layer1.0.conv1", "layer1.0.bn1",
                            "layer1.0.conv2", "layer1.0.bn2", "layer2.0.conv1", "layer2.0.bn1",
                            "layer2.0.conv2", "layer2.0.bn2", "layer2.0.downsample.0", "layer2.0.downsample.1",
                            "fc"};
    expect_layers(cmt_rig_resnet, resnet, 13);
    /* Hugging Face's GPT2LMHeadModel: wte, wpe, per block ln_1, attn.c_attn, attn.c_proj, ln_2,
     * mlp.c_fc, mlp.c_proj; ln_f; lm_head (tied to wte, so never frozen on its own) */
    const char *gpt[] = {"transformer.wte",           "transformer.wpe",           "transformer.h.0.ln_1",
                         "transformer.h.0.attn.c_attn", "transformer.h.0.attn.c_proj", "transformer.h.0.ln_2",
                         "transformer.h.0.mlp.c_fc",  "transformer.h.0.mlp.c_proj", "transformer.h.1.ln_1",
                         "transformer.h.1.attn.c_attn", "transformer.h.1.attn.c_proj", "transformer.h.1.ln_2",
                         "transformer.h.1.mlp.c_fc",  "transformer.h.1.mlp.c_proj", "transformer.ln_f",
                         "lm_head"};
    expect_layers(cmt_rig_gpt2, gpt, 16);
}

/* ---- in the trainer ---- */

typedef struct lf_case {
    double freeze_start, freeze_level;
} lf_case;

static int lf_algos(cm_algorithm_plugin *out, int cap, void *data) {
    cm_layer_freezing_config c = cm_layer_freezing_config_default();
    c.freeze_start = 0.0; /* freeze from the first epoch end on */
    if (data) c.freeze_start = ((lf_case *)data)->freeze_start, c.freeze_level = ((lf_case *)data)->freeze_level;
    cr_assert_eq(cm_layer_freezing_new(&c, &out[0]), CM_OK, "%s", cm_last_error());
    return 1;
}

/* A callback checking, at every BATCH_END, that the parameters of frozen layers kept the values
 * they had when they froze, have no gradient, and that the others moved. */
typedef struct frozen_watch {
    cm_module *layers[64];
    int64_t n_layers;
    float *snap;        /* the parameters at the last EPOCH_END */
    int64_t n;
    int64_t frozen_seen; /* the most layers seen frozen */
    int failures;
    char msg[200];
} frozen_watch;

static cm_status fw_run(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    frozen_watch *w = self;
    cm_module *root = cm_model_module(cm_state_model(st));
    if (ev == CM_EVENT_INIT) {
        w->n_layers = cm_layer_freezing_layers(root, w->layers, 64);
        return CM_OK;
    }
    if (ev != CM_EVENT_BATCH_END && ev != CM_EVENT_EPOCH_END) return CM_OK;
    int64_t n = 0;
    float *now = cmt_params_copy(cm_state_model(st), &n);
    if (ev == CM_EVENT_BATCH_END && w->snap) {
        for (int64_t l = 0; l < w->n_layers - 1; l++) {
            for (int k = 0; k < cm_module_n_own_params(w->layers[l]); k++) {
                cm_tensor *t = cm_module_own_param_at(w->layers[l], k, NULL);
                if (cm_tensor_requires_grad(t)) continue;
                /* frozen: the same values as at the epoch end, a zero gradient */
                const float *g = cm_tensor_data(cm_tensor_grad(t));
                for (int64_t e = 0; e < cm_tensor_numel(t); e++)
                    if (g[e] != 0 && !w->failures++) snprintf(w->msg, sizeof w->msg, "layer %lld: a frozen gradient", (long long)l);
            }
        }
        /* compare every element of frozen layers via their unit offsets */
        for (int64_t i = 0; i < cm_module_n_params(root); i++) {
            cm_param_info p = cm_module_param_info(root, i);
            if (p.requires_grad) continue;
            int64_t off = 0;
            for (int u = 0; u < p.unit; u++) off += cm_module_unit(root, u)->numel;
            if (memcmp(now + off + p.offset, w->snap + off + p.offset, sizeof(float) * (size_t)p.numel) && !w->failures++)
                snprintf(w->msg, sizeof w->msg, "frozen parameter '%s' moved", p.name);
        }
    }
    if (ev == CM_EVENT_EPOCH_END) {
        free(w->snap);
        w->snap = now, w->n = n;
        int64_t frozen = 0;
        for (int64_t l = 0; l < w->n_layers; l++)
            if (!cm_tensor_requires_grad(cm_module_own_param_at(w->layers[l], 0, NULL))) frozen = l + 1;
        if (frozen > w->frozen_seen) w->frozen_seen = frozen;
        return CM_OK;
    }
    free(now);
    return CM_OK;
}
static void fw_free(void *self) {}
static const cm_callback_i fw_vt = {CM_CALLBACK_ABI, "FrozenWatch", fw_run, NULL, NULL, NULL, fw_free};

Test(layer_freezing, frozen_layers_stop_moving_in_the_trainer_and_metrics_are_logged) {
    cmt_rig rig;
    cmt_rig_cnn(&rig, NULL);
    cmt_run_opts o = cmt_run_opts_default();
    o.max_duration = "4ep"; /* 8 batches; epoch ends at 1/4, 1/2, 3/4, 1 of training */
    cmt_run r = cmt_run_new(&rig, lf_algos, NULL, &o);
    frozen_watch w = {0};
    /* callbacks registered after new miss INIT: fill the layer list by hand */
    w.n_layers = cm_layer_freezing_layers(cm_model_module(rig.model), w.layers, 64);
    cr_assert_eq(cm_engine_add_callback(cm_trainer_engine(r.tr), (cm_callback_plugin){&fw_vt, &w}), CM_OK);
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_expect_eq(w.failures, 0, "%s", w.msg);
    /* depths int(d · 3) at d = 1/4, 1/2, 3/4, 1: 0, 1, 2, 3 → conv1, conv2 and fc1 frozen, fc2 never */
    cr_expect_eq(w.frozen_seen, 3);
    cr_expect_eq(cm_in_memory_logger_count(r.mem, "layer_freezing/layers_frozen"), 4);
    double v;
    cr_assert_eq(cm_in_memory_logger_last(r.mem, "layer_freezing/layers_frozen", &v), CM_OK);
    cr_expect_eq(v, 3);
    cr_assert_eq(cm_in_memory_logger_last(r.mem, "layer_freezing/percentage_frozen", &v), CM_OK);
    cr_expect_eq(v, 1.0);
    cr_expect(cm_tensor_requires_grad(cm_module_find_param(cm_model_module(rig.model), "fc2.weight")));
    cr_expect(!cm_tensor_requires_grad(cm_module_find_param(cm_model_module(rig.model), "fc1.bias")));
    free(w.snap);
    cmt_run_free(&r);
    cmt_rig_free(&rig);
}

static cmt_rig_fn k_rigs[] = {cmt_rig_mlp, cmt_rig_cnn, cmt_rig_resnet, cmt_rig_gpt2};

Test(layer_freezing, resumption_after_freezing_is_exact_on_every_family) {
    /* 3 epochs of 2 batches; freezing at the epoch ends (1/3, 2/3); resume mid-epoch 1, after the
     * first freeze: the checkpoint must freeze the layers again */
    for (int i = 0; i < 4; i++) {
        cmt_resumption_opts o = cmt_resumption_opts_default();
        o.total_batches = 6, o.resume_batch = 3, o.label = "LayerFreezing";
        cmt_check_algorithm_resumption(k_rigs[i], NULL, lf_algos, NULL, &o);
    }
    /* SGD with momentum: a frozen layer that stayed in the optimizer would still move */
    cmt_resumption_opts o = cmt_resumption_opts_default();
    o.total_batches = 6, o.resume_batch = 3, o.label = "LayerFreezing (SGD)", o.run.adam = false;
    cmt_check_algorithm_resumption(cmt_rig_resnet, NULL, lf_algos, NULL, &o);
}

Test(layer_freezing, resumption_without_refreezing_is_caught) {
    /* excluding the algorithm from the load restarts it unfrozen: the check must see it */
    cmt_resumption_opts o = cmt_resumption_opts_default();
    o.total_batches = 6, o.resume_batch = 3, o.label = "LayerFreezing, state not loaded";
    o.run.load_exclude_algorithms = "LayerFreezing";
    char msg[3000];
    cr_expect(cmt_algorithm_resumption_differs(cmt_rig_cnn, NULL, lf_algos, NULL, &o, msg, sizeof msg),
              "a resumed run that did not freeze again was not told apart");
}

Test(layer_freezing, fit_twice_on_every_family) {
    cmt_run_opts o = cmt_run_opts_default();
    o.max_duration = "4ba";
    for (int i = 0; i < 4; i++) cmt_check_fit_twice(k_rigs[i], NULL, lf_algos, NULL, &o, "3ba", "LayerFreezing");
}

Test(layer_freezing, bad_arguments_and_foreign_optimizers) {
    cm_layer_freezing_config c = cm_layer_freezing_config_default();
    cr_expect_eq(c.freeze_start, 0.5);
    cr_expect_eq(c.freeze_level, 1.0);
    cm_algorithm_plugin p;
    c.freeze_start = 1.0;
    cr_expect_eq(cm_layer_freezing_new(&c, &p), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "freeze_start 1"), "%s", cm_last_error());
    c = cm_layer_freezing_config_default(), c.freeze_level = -0.1;
    cr_expect_eq(cm_layer_freezing_new(&c, &p), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "freeze_level -0.1"), "%s", cm_last_error());
    /* an optimizer over other buffers than the model's: the parameter is named */
    cm_module *m = seq5();
    float w[4], gr[4];
    cm_optim_span sp = {"other", w, gr, 4};
    cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_ADAM);
    cm_optim *o;
    cr_assert_eq(cm_optim_new(CM_OPTIM_ADAM, &o), CM_OK);
    cr_assert_eq(cm_optim_add_group(o, &hp, &sp, 1), CM_OK);
    cr_expect_eq(cm_freeze_layers(m, o, 1.0, 0.0, 1.0, NULL, NULL), CM_ERR_NOT_FOUND);
    cr_expect(strstr(cm_last_error(), "'0.weight'"), "%s", cm_last_error());
    cr_expect(cm_tensor_requires_grad(cm_module_find_param(m, "0.weight")), "a refused freeze changed the model");
    /* without an optimizer: only the flags */
    cr_expect_eq(cm_freeze_layers(m, NULL, 1.0, 0.0, 1.0, NULL, NULL), CM_OK);
    cr_expect(!cm_tensor_requires_grad(cm_module_find_param(m, "2.bias")));
    cr_expect(cm_tensor_requires_grad(cm_module_find_param(m, "4.weight")), "the last layer froze");
    cr_expect_eq(cm_layer_freezing_freeze(m, NULL, -1), CM_ERR_INVALID_ARG);
    cm_optim_free(o);
    cm_module_free(m);
}
