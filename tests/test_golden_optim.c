/* Optimizer steps against PyTorch (tests/golden/gen_optim.py -> tests/golden/optim.safetensors):
 * torch.optim.SGD / Adam / AdamW and Composer's DecoupledSGDW / DecoupledAdamW, two spans
 * p0 (4, 5) and p1 (7,), five steps with fixed gradients and a changing lr multiplier, one and
 * two parameter groups. Parameters are compared after every step, the optimizer state
 * (momentum_buffer, exp_avg, exp_avg_sq, max_exp_avg_sq) after the last.
 *
 * Tolerance: atol 1e-6 + rtol 1e-6. Both sides update in f32 with the same scalars (computed in
 * double, rounded to f32 once); the only differences are the order of rounding inside an element
 * (fused multiply-add or not, division vs reciprocal), a few ulps (1 ulp of 1.0 is 1.2e-7) per
 * step, over five steps on values of order 1. */
#include "cmtest.h"

#include <composer/optim.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#define ATOL 1e-6
#define RTOL 1e-6
#define STEPS 5
static const double MULTS[STEPS] = {1.0, 0.5, 0.3, 0.9, 0.1};
static const char *const PNAMES[2] = {"p0", "p1"};

typedef struct {
    const char *name;
    cm_optim_kind kind;
    int n_groups;                /* 1: both spans in group 0; 2: p0 in group 0, p1 in group 1 */
    cm_optim_hparams hp[2];
} g_case;

static cm_optim_hparams sgd(double lr, double mom, double damp, bool nesterov, double wd) {
    cm_optim_hparams h = cm_optim_hparams_default(CM_OPTIM_SGD);
    h.lr = lr;
    h.momentum = mom;
    h.dampening = damp;
    h.nesterov = nesterov;
    h.weight_decay = wd;
    return h;
}

static cm_optim_hparams adam(double lr, double b1, double b2, double eps, double wd, bool amsgrad) {
    cm_optim_hparams h = cm_optim_hparams_default(CM_OPTIM_ADAM);
    h.lr = lr;
    h.beta1 = b1;
    h.beta2 = b2;
    h.eps = eps;
    h.weight_decay = wd;
    h.amsgrad = amsgrad;
    return h;
}

static void run_case(cmt_golden *g, const g_case *c) {
    char key[128];
    float *param[2], *grad[2];
    int64_t n[2];
    cm_tensor *init[2];
    for (int p = 0; p < 2; p++) {
        snprintf(key, sizeof key, "init.%s", PNAMES[p]);
        init[p] = cmt_golden_get(g, key);
        n[p] = cm_tensor_numel(init[p]);
        param[p] = cm_alloc(sizeof(float) * (size_t)n[p], 64);
        grad[p] = cm_alloc(sizeof(float) * (size_t)n[p], 64);
        memcpy(param[p], cm_tensor_data(init[p]), sizeof(float) * (size_t)n[p]);
        cm_tensor_free(init[p]);
    }
    cm_optim_span spans[2] = {{"p0", param[0], grad[0], n[0]}, {"p1", param[1], grad[1], n[1]}};
    cm_optim *opt;
    cr_assert_eq(cm_optim_new(c->kind, &opt), CM_OK, "%s", cm_last_error());
    if (c->n_groups == 1) {
        cr_assert_eq(cm_optim_add_group(opt, &c->hp[0], spans, 2), CM_OK, "%s: %s", c->name, cm_last_error());
    } else {
        cr_assert_eq(cm_optim_add_group(opt, &c->hp[0], &spans[0], 1), CM_OK, "%s: %s", c->name, cm_last_error());
        cr_assert_eq(cm_optim_add_group(opt, &c->hp[1], &spans[1], 1), CM_OK, "%s: %s", c->name, cm_last_error());
    }
    for (int s = 0; s < STEPS; s++) {
        for (int p = 0; p < 2; p++) {
            snprintf(key, sizeof key, "grad.%d.%s", s, PNAMES[p]);
            cm_tensor *gt = cmt_golden_get(g, key);
            memcpy(grad[p], cm_tensor_data(gt), sizeof(float) * (size_t)n[p]);
            cm_tensor_free(gt);
        }
        cr_assert_eq(cm_optim_step(opt, MULTS[s]), CM_OK, "%s", cm_last_error());
        for (int p = 0; p < 2; p++) {
            snprintf(key, sizeof key, "%s.step%d.%s", c->name, s + 1, PNAMES[p]);
            cm_tensor *want = cmt_golden_get(g, key);
            cmt_assert_close_f32(key, param[p], cm_tensor_data(want), n[p], ATOL, RTOL);
            cm_tensor_free(want);
        }
    }
    /* the state torch keeps, under the same keys */
    static const char *const keys[] = {"momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    int checked = 0;
    for (int p = 0; p < 2; p++) {
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            snprintf(key, sizeof key, "%s.%s.%s", c->name, keys[k], PNAMES[p]);
            char ours[64];
            snprintf(ours, sizeof ours, "%s.%s", PNAMES[p], keys[k]);
            cm_optim_state_entry e;
            bool have = cm_optim_state_find(opt, ours, &e) == CM_OK;
            cr_assert_eq(have, cmt_golden_has(g, key), "%s: state '%s' present here %d, in torch %d", c->name, ours,
                         have, cmt_golden_has(g, key));
            if (!have) continue;
            cm_tensor *want = cmt_golden_get(g, key);
            cr_assert_eq(e.numel, cm_tensor_numel(want), "%s: %s numel", c->name, ours);
            cmt_assert_close_f32(key, e.data, cm_tensor_data(want), e.numel, ATOL, RTOL);
            cm_tensor_free(want);
            checked++;
        }
        snprintf(key, sizeof key, "%s.step", PNAMES[p]);
        cm_optim_state_entry e;
        cr_assert_eq(cm_optim_state_find(opt, key, &e), CM_OK, "%s", cm_last_error());
        cr_assert_eq(*(int64_t *)e.data, STEPS, "%s: %s = %lld, want %d", c->name, key, (long long)*(int64_t *)e.data,
                     STEPS);
    }
    cm_optim_free(opt);
    for (int p = 0; p < 2; p++) {
        cm_free(param[p]);
        cm_free(grad[p]);
    }
    (void)checked;
}

Test(golden_optim, sgd_variants_match_torch) {
    cmt_golden *g = cmt_golden_open("tests/golden/optim.safetensors");
    const g_case cases[] = {
        {"sgd_plain", CM_OPTIM_SGD, 1, {sgd(0.1, 0, 0, false, 0)}},
        {"sgd_wd", CM_OPTIM_SGD, 1, {sgd(0.1, 0, 0, false, 0.01)}},
        {"sgd_momentum", CM_OPTIM_SGD, 1, {sgd(0.1, 0.9, 0, false, 0)}},
        {"sgd_dampening", CM_OPTIM_SGD, 1, {sgd(0.1, 0.9, 0.3, false, 0.01)}},
        {"sgd_nesterov", CM_OPTIM_SGD, 1, {sgd(0.1, 0.9, 0, true, 0.01)}},
        {"sgd_groups", CM_OPTIM_SGD, 2, {sgd(0.1, 0.9, 0, false, 0), sgd(0.05, 0.5, 0, false, 0.1)}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(g, &cases[i]);
    cmt_golden_close(g);
}

Test(golden_optim, adam_and_adamw_match_torch) {
    cmt_golden *g = cmt_golden_open("tests/golden/optim.safetensors");
    const g_case cases[] = {
        {"adam", CM_OPTIM_ADAM, 1, {adam(1e-2, 0.9, 0.999, 1e-8, 0, false)}},
        {"adam_wd", CM_OPTIM_ADAM, 1, {adam(1e-2, 0.9, 0.999, 1e-8, 0.1, false)}},
        {"adam_amsgrad", CM_OPTIM_ADAM, 1, {adam(1e-2, 0.8, 0.99, 1e-8, 0.01, true)}},
        {"adamw", CM_OPTIM_ADAMW, 1, {adam(1e-2, 0.9, 0.999, 1e-8, 0.1, false)}},
        {"adamw_amsgrad", CM_OPTIM_ADAMW, 1, {adam(1e-2, 0.9, 0.999, 1e-8, 0.1, true)}},
        {"adamw_groups", CM_OPTIM_ADAMW, 2,
         {adam(1e-2, 0.9, 0.999, 1e-8, 0.1, false), adam(3e-3, 0.9, 0.999, 1e-3, 0.0, false)}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(g, &cases[i]);
    cmt_golden_close(g);
}

Test(golden_optim, composer_decoupled_optimizers_match_reference) {
    cmt_golden *g = cmt_golden_open("tests/golden/optim.safetensors");
    const g_case cases[] = {
        {"decoupled_sgdw", CM_OPTIM_DECOUPLED_SGDW, 1, {sgd(0.1, 0.9, 0, false, 0.01)}},
        {"decoupled_sgdw_nesterov", CM_OPTIM_DECOUPLED_SGDW, 1, {sgd(0.1, 0.9, 0, true, 0.05)}},
        {"decoupled_adamw", CM_OPTIM_DECOUPLED_ADAMW, 1, {adam(1e-2, 0.9, 0.95, 1e-8, 0.01, false)}},
        {"decoupled_adamw_amsgrad", CM_OPTIM_DECOUPLED_ADAMW, 1, {adam(1e-2, 0.9, 0.95, 1e-8, 0.05, true)}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(g, &cases[i]);
    cmt_golden_close(g);
}
