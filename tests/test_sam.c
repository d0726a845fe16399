/* SAM: the two-pass update against Composer's SAMOptimizer (torch) — as plain functions and inside
 * the trainer — for interval 1 and 2; resumption is exact on every model family (the step counter
 * is checkpointed) and a lost counter is caught; fit twice; argument errors; two closure
 * algorithms refuse to compose. */
#include "cmalgo.h"
#include "cmtest.h"
#include "cmtrain.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static cmt_golden *golden(void) { return cmt_golden_open("tests/golden/train_algos.safetensors"); }

/* nn.Sequential(Linear(6, 8), ReLU, Linear(8, 3)) with the golden's initial weights. */
static cm_module *net(cmt_golden *g) {
    cm_module *s, *l0, *a1, *l2;
    cr_assert_eq(cm_nn_sequential_new(&s), CM_OK);
    cr_assert_eq(cm_nn_linear_new(6, 8, true, NULL, &l0), CM_OK);
    cr_assert_eq(cm_nn_activation_new(CM_ACT_RELU, &a1), CM_OK);
    cr_assert_eq(cm_nn_linear_new(8, 3, true, NULL, &l2), CM_OK);
    cm_nn_sequential_append(s, l0);
    cm_nn_sequential_append(s, a1);
    cm_nn_sequential_append(s, l2);
    cr_assert_eq(cm_module_finalize(s), CM_OK);
    for (int64_t i = 0; i < cm_module_n_params(s); i++) {
        cm_param_info p = cm_module_param_info(s, i);
        char key[96];
        snprintf(key, sizeof key, "sam.init.%s", p.name);
        cm_tensor *t = cmt_golden_get(g, key);
        memcpy(cm_tensor_data(p.tensor), cm_tensor_data(t), cm_tensor_nbytes(t));
        cm_tensor_free(t);
    }
    return s;
}

static cm_optim *sgd(cm_module *m) {
    const cm_unit_info *u = cm_module_unit(m, 0);
    cr_assert_eq(cm_module_n_units(m), 1);
    cm_optim_span sp = {u->name, u->params, u->grads, u->numel};
    cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_SGD);
    hp.lr = 0.1, hp.momentum = 0.9, hp.weight_decay = 1e-3;
    cm_optim *o;
    cr_assert_eq(cm_optim_new(CM_OPTIM_SGD, &o), CM_OK);
    cr_assert_eq(cm_optim_add_group(o, &hp, &sp, 1), CM_OK);
    return o;
}

static void expect_step(cmt_golden *g, cm_module *m, int interval, int k, const char *how) {
    for (int64_t i = 0; i < cm_module_n_params(m); i++) {
        cm_param_info p = cm_module_param_info(m, i);
        char key[96], what[160];
        snprintf(key, sizeof key, "sam.i%d.step%d.%s", interval, k, p.name);
        snprintf(what, sizeof what, "%s, interval %d, after step %d: %s", how, interval, k, p.name);
        cm_tensor *want = cmt_golden_get(g, key);
        cmt_assert_close(what, p.tensor, want, 2e-6, 1e-5);
        cm_tensor_free(want);
    }
}

/* The gradient of the mean cross-entropy of the golden batch at the current weights. */
static double grad(cm_module *m, cm_tensor *x, cm_tensor *y) {
    cm_module_zero_grad(m);
    cm_tape *tp;
    cm_tape_config tc = cm_tape_config_default();
    cr_assert_eq(cm_tape_new(&tc, &tp), CM_OK);
    cm_tensor *logits = cm_module_forward(m, tp, x);
    cm_tensor *loss = cm_cross_entropy(tp, logits, y, NULL);
    cr_assert(loss, "%s", cm_tape_error(tp));
    const double l = cm_tensor_get_flat(loss, 0);
    cr_assert_eq(cm_tape_backward(tp, loss), CM_OK);
    cm_tape_free(tp);
    return l;
}

Test(sam, two_pass_update_matches_composer_as_plain_functions) {
    cmt_golden *g = golden();
    cm_tensor *x = cmt_golden_get(g, "sam.x"), *y = cmt_golden_get(g, "sam.y");
    for (int interval = 1; interval <= 2; interval++) {
        cm_module *m = net(g);
        cm_optim *o = sgd(m);
        const cm_unit_info *u = cm_module_unit(m, 0);
        float *saved = malloc(sizeof(float) * (size_t)u->numel);
        float *params[1] = {u->params}, *sv[1] = {saved};
        const float *grads[1] = {u->grads};
        int64_t lens[1] = {u->numel};
        for (int k = 1; k <= 4; k++) {
            const double loss = grad(m, x, y);
            if (k % interval == 0) {
                double norm;
                cr_assert_eq(cm_sam_perturb(params, grads, sv, lens, 1, 0.5, 1e-12, &norm), CM_OK);
                cr_expect(norm > 0);
                grad(m, x, y);
                cm_sam_restore(params, (const float *const *)sv, lens, 1);
            }
            if (interval == 1) {
                char key[32];
                snprintf(key, sizeof key, "sam.i1.loss%d", k);
                cm_tensor *l = cmt_golden_get(g, key);
                cr_expect(fabs(loss - cm_tensor_get_flat(l, 0)) < 1e-6, "step %d loss %.9g vs %.9g", k, loss,
                          cm_tensor_get_flat(l, 0));
                cm_tensor_free(l);
            }
            cr_assert_eq(cm_optim_step(o, 1.0), CM_OK);
            expect_step(g, m, interval, k, "functional");
        }
        free(saved);
        cm_optim_free(o);
        cm_module_free(m);
    }
    cm_tensor_free(x);
    cm_tensor_free(y);
    cmt_golden_close(g);
}

/* ---- the same inside the trainer ---- */

typedef struct {
    cmt_golden *g;
} fixed;
static cm_field_desc k_fields[2] = {{"input", CM_DTYPE_F32, 1, {6}}, {"label", CM_DTYPE_I64, 0, {0}}};
static int64_t f_len(void *self) { return 8; }
static int f_nf(void *self) { return 2; }
static const cm_field_desc *f_field(void *self, int i) { return &k_fields[i]; }
static float g_x[48];
static int64_t g_y[8];
static cm_status f_get(void *self, int64_t i, const cm_sample_ctx *ctx, void *const *out) {
    memcpy(out[0], g_x + 6 * i, 6 * sizeof(float));
    *(int64_t *)out[1] = g_y[i];
    return CM_OK;
}
static const cm_dataset_i fixed_vt = {CM_DATASET_ABI, "fixed", f_len, f_nf, f_field, f_get, NULL, NULL};

static int sam_algos(cm_algorithm_plugin *out, int cap, void *data) {
    cm_sam_config c = cm_sam_config_default();
    if (data) c = *(cm_sam_config *)data;
    cr_assert_eq(cm_sam_new(&c, &out[0]), CM_OK, "%s", cm_last_error());
    return 1;
}

Test(sam, trainer_update_matches_composer) {
    cmt_golden *g = golden();
    cm_tensor *x = cmt_golden_get(g, "sam.x"), *y = cmt_golden_get(g, "sam.y");
    memcpy(g_x, cm_tensor_data(x), sizeof g_x);
    memcpy(g_y, cm_tensor_data(y), sizeof g_y);
    for (int interval = 1; interval <= 2; interval++) {
        cm_dataset *ds;
        cr_assert_eq(cm_dataset_new(&fixed_vt, NULL, &ds), CM_OK);
        cm_dataloader_config dc = cm_dataloader_config_default();
        dc.batch_size = 8, dc.shuffle = false;
        cm_dataloader *dl;
        cr_assert_eq(cm_dataloader_new(ds, &dc, &dl), CM_OK, "%s", cm_last_error());
        cm_module *m = net(g);
        cm_model *model;
        cr_assert_eq(cm_model_classifier_new(m, NULL, &model), CM_OK);
        cm_optim *o = sgd(m);
        cm_sam_config sc = cm_sam_config_default();
        sc.rho = 0.5, sc.interval = interval;
        cm_algorithm_plugin alg;
        sam_algos(&alg, 1, &sc);
        cm_in_memory_logger *mem;
        cm_logger_plugin mp;
        cm_in_memory_logger_new(&mem, &mp);
        cm_trainer_config tc = cm_trainer_config_default();
        tc.model = model, tc.train_dataloader = dl, tc.optimizer = o, tc.algorithms = &alg, tc.n_algorithms = 1;
        tc.loggers = &mp, tc.n_loggers = 1;
        tc.device_train_microbatch_size = 3; /* microbatches 3 + 3 + 2: the same gradient */
        cr_assert_eq(cm_time_parse("4ba", &tc.max_duration), CM_OK);
        cm_trainer *tr;
        cr_assert_eq(cm_trainer_new(&tc, &tr), CM_OK, "%s", cm_last_error());
        cr_assert_eq(cm_trainer_fit(tr, NULL), CM_OK, "%s", cm_last_error());
        expect_step(g, m, interval, 4, "trainer");
        if (interval == 1) { /* the logged loss is the first gradient's */
            for (int64_t i = 0, k = 1; i < cm_in_memory_logger_n(mem); i++) {
                const cm_log_record *r = cm_in_memory_logger_record(mem, i);
                if (strcmp(r->name, "loss/train/total")) continue;
                char key[32];
                snprintf(key, sizeof key, "sam.i1.loss%lld", (long long)k++);
                cm_tensor *l = cmt_golden_get(g, key);
                cr_expect(fabs(r->value - cm_tensor_get_flat(l, 0)) < 1e-6, "%s: %.9g vs %.9g", key, r->value,
                          cm_tensor_get_flat(l, 0));
                cm_tensor_free(l);
            }
        }
        cm_trainer_free(tr);
        cm_optim_free(o);
        cm_model_free(model);
        cm_dataloader_free(dl);
        cm_dataset_free(ds);
    }
    cm_tensor_free(x);
    cm_tensor_free(y);
    cmt_golden_close(g);
}

static int sam_clip_algos(cm_algorithm_plugin *out, int cap, void *data) {
    sam_algos(&out[0], 1, data);
    cr_assert_eq(cm_grad_clip_new(CM_GRAD_CLIP_NORM, 0.1, &out[1]), CM_OK);
    return 2;
}

/* ---- every family ---- */

static cmt_rig_fn k_rigs[] = {cmt_rig_mlp, cmt_rig_cnn, cmt_rig_resnet, cmt_rig_gpt2};

Test(sam, resumption_is_exact_on_every_family) {
    cm_sam_config c = cm_sam_config_default();
    c.interval = 2; /* resuming after an odd number of steps: the counter must come back */
    for (int i = 0; i < 4; i++) {
        cmt_resumption_opts o = cmt_resumption_opts_default();
        o.total_batches = 4, o.resume_batch = 1, o.label = "SAM (interval 2)";
        cmt_check_algorithm_resumption(k_rigs[i], NULL, sam_algos, &c, &o);
    }
    /* default interval, microbatches, GradientClipping inside the closure, bf16 */
    cmt_resumption_opts o = cmt_resumption_opts_default();
    o.label = "SAM (microbatched, bf16)";
    o.run.microbatch = 3, o.run.precision = CM_PRECISION_AMP_BF16;
    cmt_check_algorithm_resumption(cmt_rig_mlp, NULL, sam_clip_algos, NULL, &o);
}

Test(sam, a_lost_step_counter_is_caught) {
    cm_sam_config c = cm_sam_config_default();
    c.interval = 2, c.rho = 0.5;
    cmt_resumption_opts o = cmt_resumption_opts_default();
    o.total_batches = 3, o.resume_batch = 1, o.label = "SAM without its state";
    o.run.load_exclude_algorithms = "SAM";
    char msg[3000];
    cr_expect(cmt_algorithm_resumption_differs(cmt_rig_mlp, NULL, sam_algos, &c, &o, msg, sizeof msg),
              "a resumed SAM that restarted its counter was not told apart");
}

Test(sam, fit_twice_on_every_family) {
    cmt_run_opts o = cmt_run_opts_default();
    o.max_duration = "3ba";
    for (int i = 0; i < 4; i++) cmt_check_fit_twice(k_rigs[i], NULL, sam_algos, NULL, &o, "1ba", "SAM");
}

/* ---- errors ---- */

static int two_sams(cm_algorithm_plugin *out, int cap, void *data) {
    sam_algos(&out[0], 1, NULL);
    sam_algos(&out[1], 1, NULL);
    return 2;
}

Test(sam, bad_arguments_and_two_closure_algorithms) {
    cm_sam_config c = cm_sam_config_default();
    cr_expect_eq(c.rho, 0.05);
    cr_expect_eq(c.epsilon, 1e-12);
    cr_expect_eq(c.interval, 1);
    cm_algorithm_plugin p;
    c.rho = -0.1;
    cr_expect_eq(cm_sam_new(&c, &p), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "rho -0.1"), "%s", cm_last_error());
    c = cm_sam_config_default(), c.interval = 0;
    cr_expect_eq(cm_sam_new(&c, &p), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "interval 0"), "%s", cm_last_error());
    c = cm_sam_config_default(), c.epsilon = -1;
    cr_expect_eq(cm_sam_new(&c, &p), CM_ERR_INVALID_ARG);
    cmt_rig rig;
    cmt_rig_mlp(&rig, NULL);
    cmt_run_opts o = cmt_run_opts_default();
    cmt_run r;
    cr_expect_eq(cmt_run_try(&rig, two_sams, NULL, &o, &r), CM_ERR_STATE);
    cr_expect(strstr(cm_last_error(), "'SAM' already replaces the train step"), "%s", cm_last_error());
    cmt_rig_free(&rig);
    float w[2] = {1, 2}, gr[2] = {3, 4}, sv[2];
    float *pp[1] = {w}, *ss[1] = {sv};
    const float *gg[1] = {gr};
    int64_t len[1] = {2};
    double norm;
    cr_assert_eq(cm_sam_perturb(pp, gg, ss, len, 1, 0.5, 0, &norm), CM_OK);
    cr_expect_eq(norm, 5.0);
    cr_expect(w[0] == 1 + 3 * 0.1f && w[1] == 2 + 4 * 0.1f, "%.9g %.9g", w[0], w[1]);
    cm_sam_restore(pp, (const float *const *)ss, len, 1);
    cr_expect(w[0] == 1 && w[1] == 2);
    cr_expect_eq(cm_sam_perturb(pp, gg, ss, len, 1, NAN, 0, NULL), CM_ERR_INVALID_ARG);
}
