/* GradientClipping: norm, value and adaptive against hand computation; the module form over flat
 * units; the algorithm inside the trainer (a callback after it sees clipped gradients); errors. */
#include "cmtest.h"
#include "cmtrain.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

Test(grad_clip, norm_scales_by_max_over_total_across_spans) {
    float a[3] = {3, 0, 0}, b[2] = {0, 4}; /* total norm 5 */
    float *g[2] = {a, b};
    int64_t len[2] = {3, 2};
    double total;
    cr_assert_eq(cm_grad_clip_norm(g, len, 2, 1.0, &total), CM_OK);
    cr_expect_float_eq(total, 5.0, 1e-12);
    const double c = 1.0 / (5.0 + 1e-6);
    cr_expect(fabs(a[0] - 3 * c) < 1e-7 && fabs(b[1] - 4 * c) < 1e-7, "got %g %g want %g %g", a[0], b[1], 3 * c, 4 * c);
    /* under the threshold: unchanged */
    float d[2] = {0.3f, 0.4f};
    float *g2[1] = {d};
    int64_t l2[1] = {2};
    cr_assert_eq(cm_grad_clip_norm(g2, l2, 1, 1.0, &total), CM_OK);
    cr_expect(d[0] == 0.3f && d[1] == 0.4f);
    cr_expect_eq(cm_grad_clip_norm(g2, l2, 1, 0.0, NULL), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "threshold 0"), "%s", cm_last_error());
    cr_expect_eq(cm_grad_clip_norm(g2, l2, 1, NAN, NULL), CM_ERR_INVALID_ARG);
}

Test(grad_clip, value_clamps_each_element) {
    float a[5] = {-3, -0.5f, 0, 0.5f, 3};
    float *g[1] = {a};
    int64_t len[1] = {5};
    cr_assert_eq(cm_grad_clip_value(g, len, 1, 1.0), CM_OK);
    const float want[5] = {-1, -0.5f, 0, 0.5f, 1};
    for (int i = 0; i < 5; i++) cr_expect_eq(a[i], want[i], "element %d: %g vs %g", i, a[i], want[i]);
    cr_expect_eq(cm_grad_clip_value(g, len, 1, -1), CM_ERR_INVALID_ARG);
}

/* Hand computation of Composer's AGC for one unit. */
static void agc_unit(const float *w, float *g, int64_t n, int64_t stride, double thr) {
    double wn = 0, gn = 0;
    for (int64_t k = 0; k < n; k++) wn += (double)w[k * stride] * w[k * stride], gn += (double)g[k * stride] * g[k * stride];
    double mx = fmax(sqrt(wn), 1e-6) * thr, gnorm = sqrt(gn);
    if (gnorm > mx)
        for (int64_t k = 0; k < n; k++) g[k * stride] *= (float)(mx / fmax(gnorm, 1e-6));
}

static void fill(float *p, int64_t n, uint64_t seed) {
    cm_rng r = cm_rng_init(seed, 0);
    cm_rng_normal(&r, p, (size_t)n, 0, 1);
}

Test(grad_clip, adaptive_matches_unitwise_norms_for_1_to_4_dims) {
    const double thr = 0.3;
    /* 1-D: the whole tensor */
    float w1[6], g1[6], h1[6];
    fill(w1, 6, 1), fill(g1, 6, 2);
    memcpy(h1, g1, sizeof g1);
    int64_t s1[1] = {6};
    cr_assert_eq(cm_grad_clip_adaptive(w1, g1, 1, s1, thr), CM_OK);
    agc_unit(w1, h1, 6, 1, thr);
    cmt_assert_close_f32("1-d", g1, h1, 6, 1e-7, 1e-6);
    /* 2-D (out, in): each row */
    float w2[12], g2[12], h2[12];
    fill(w2, 12, 3), fill(g2, 12, 4);
    for (int i = 0; i < 4; i++) g2[i] *= 0.01f; /* row 0 stays under the threshold */
    memcpy(h2, g2, sizeof g2);
    int64_t s2[2] = {3, 4};
    cr_assert_eq(cm_grad_clip_adaptive(w2, g2, 2, s2, thr), CM_OK);
    for (int r = 0; r < 3; r++) agc_unit(w2 + 4 * r, h2 + 4 * r, 4, 1, thr);
    cmt_assert_close_f32("2-d", g2, h2, 12, 1e-7, 1e-6);
    cr_expect(memcmp(g2, h2, 4 * sizeof(float)) == 0);
    /* 3-D (a, b, c): norm over dim 1 for each (a, c) */
    float w3[24], g3[24], h3[24];
    fill(w3, 24, 5), fill(g3, 24, 6);
    memcpy(h3, g3, sizeof g3);
    int64_t s3[3] = {2, 3, 4};
    cr_assert_eq(cm_grad_clip_adaptive(w3, g3, 3, s3, thr), CM_OK);
    for (int a = 0; a < 2; a++)
        for (int c = 0; c < 4; c++) agc_unit(w3 + a * 12 + c, h3 + a * 12 + c, 3, 4, thr);
    cmt_assert_close_f32("3-d", g3, h3, 24, 1e-7, 1e-6);
    /* 4-D (out, in, kh, kw): each output filter */
    float w4[2 * 2 * 3 * 3], g4[36], h4[36];
    fill(w4, 36, 7), fill(g4, 36, 8);
    memcpy(h4, g4, sizeof g4);
    int64_t s4[4] = {2, 2, 3, 3};
    cr_assert_eq(cm_grad_clip_adaptive(w4, g4, 4, s4, thr), CM_OK);
    for (int o = 0; o < 2; o++) agc_unit(w4 + 18 * o, h4 + 18 * o, 18, 1, thr);
    cmt_assert_close_f32("4-d", g4, h4, 36, 1e-7, 1e-6);
    int64_t s5[5] = {1, 1, 1, 1, 1};
    cr_expect_eq(cm_grad_clip_adaptive(w1, g1, 5, s5, thr), CM_ERR_SHAPE);
    cr_expect_eq(cm_grad_clip_adaptive(w1, g1, 1, s1, 0), CM_ERR_INVALID_ARG);
}

Test(grad_clip, module_form_uses_every_unit) {
    cm_model *m = cmt_mlp(4, 5, 3, 0, 1);
    cm_module *root = cm_model_module(m);
    const cm_unit_info *u = cm_module_unit(root, 0);
    for (int64_t i = 0; i < u->numel; i++) u->grads[i] = 1.0f;
    double total;
    cr_assert_eq(cm_grad_clip_module(root, CM_GRAD_CLIP_NORM, 1.0, &total), CM_OK);
    cr_expect_float_eq(total, sqrt((double)u->numel), 1e-9);
    cr_expect(fabs(u->grads[0] - 1.0 / (sqrt((double)u->numel) + 1e-6)) < 1e-7);
    cr_assert_eq(cm_grad_clip_module(root, CM_GRAD_CLIP_VALUE, 0.01, NULL), CM_OK);
    cr_expect_eq(u->grads[u->numel - 1], 0.01f);
    cr_assert_eq(cm_grad_clip_module(root, CM_GRAD_CLIP_ADAPTIVE, 0.01, NULL), CM_OK);
    cr_expect_eq(cm_grad_clip_module(NULL, CM_GRAD_CLIP_NORM, 1, NULL), CM_ERR_STATE);
    cm_grad_clip_type t;
    cr_expect_eq(cm_grad_clip_type_parse("Adaptive", &t), CM_OK);
    cr_expect_eq(t, CM_GRAD_CLIP_ADAPTIVE);
    cr_expect_eq(cm_grad_clip_type_parse("l2", &t), CM_ERR_INVALID_ARG);
    cr_expect_str_eq(cm_grad_clip_type_name(CM_GRAD_CLIP_VALUE), "value");
    cm_model_free(m);
}

/* A callback on AFTER_TRAIN_BATCH runs after the algorithms: it sees the clipped gradients. */
typedef struct {
    double max_norm_seen;
    int calls;
} probe;
static cm_status probe_run(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    if (ev != CM_EVENT_AFTER_TRAIN_BATCH) return CM_OK;
    probe *p = self;
    cm_module *root = cm_model_module(cm_state_model(st));
    double ss = 0;
    for (int i = 0; i < cm_module_n_units(root); i++) {
        const cm_unit_info *u = cm_module_unit(root, i);
        for (int64_t k = 0; k < u->numel; k++) ss += (double)u->grads[k] * u->grads[k];
    }
    p->max_norm_seen = fmax(p->max_norm_seen, sqrt(ss));
    p->calls++;
    return CM_OK;
}
static const cm_callback_i probe_vt = {CM_CALLBACK_ABI, "Probe", probe_run, NULL, NULL, NULL, NULL};

Test(grad_clip, algorithm_clips_before_the_optimizer_step_in_the_trainer) {
    cm_dataset *ds = cmt_synth_dataset(32, 8, 3, false, NULL);
    cm_dataloader *dl = cmt_loader(ds, 8, false, 0);
    cm_model *m = cmt_mlp(8, 16, 3, 0, 3);
    cm_algorithm_plugin clip;
    cr_expect_eq(cm_grad_clip_new(CM_GRAD_CLIP_NORM, 0, &clip), CM_ERR_INVALID_ARG);
    cr_expect_eq(cm_grad_clip_new(CM_GRAD_CLIP_TYPE_COUNT, 1, &clip), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_grad_clip_new(CM_GRAD_CLIP_NORM, 0.05, &clip), CM_OK);
    probe pr = {0};
    cm_callback_plugin cb = {&probe_vt, &pr};
    cm_trainer_config c = cm_trainer_config_default();
    c.model = m;
    c.train_dataloader = dl;
    c.max_duration = cm_time_make(4, CM_TIME_BATCH);
    c.algorithms = &clip;
    c.n_algorithms = 1;
    c.callbacks = &cb;
    c.n_callbacks = 1;
    cm_trainer *tr;
    cr_assert_eq(cm_trainer_new(&c, &tr), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_fit(tr, NULL), CM_OK, "%s", cm_last_error());
    cr_expect_eq(pr.calls, 4);
    cr_expect_leq(pr.max_norm_seen, 0.05 + 1e-6, "gradient norm after clipping %g", pr.max_norm_seen);
    cr_expect_eq(cm_engine_n_applied(cm_trainer_engine(tr), 0), 4);
    cr_expect_str_eq(cm_algorithm_name(cm_engine_algorithm(cm_trainer_engine(tr), 0)), "GradientClipping");
    cm_trainer_free(tr);
    cm_model_free(m);
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
}
