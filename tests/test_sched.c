/* Composer's schedulers (include/composer/optim.h): every formula at t = 0, at its boundaries
 * (milestones, t_warmup, t_max, past t_max), with scale_schedule_ratio ≠ 1 and scale_warmup both
 * ways, against values worked out by hand in the comments. */
#include "cmtest.h"

#include <composer/optim.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#define TOL 1e-12

static cm_time T(const char *s) {
    cm_time t;
    cr_assert_eq(cm_time_parse(s, &t), CM_OK, "%s", cm_last_error());
    return t;
}

/* The clock after `batch` batches of a run of max_dur, with bpe batches per epoch (0: unknown). */
static cm_sched_clock clock_at(int64_t batch, const char *max_dur, int64_t bpe, double ssr) {
    cm_sched_clock c = cm_sched_clock_default();
    c.now.batch = batch;
    c.now.batch_in_epoch = bpe > 0 ? batch % bpe : batch;
    c.now.epoch = bpe > 0 ? batch / bpe : 0;
    c.now.sample = batch * 8;
    c.max_duration = T(max_dur);
    c.batches_per_epoch = bpe;
    c.ssr = ssr;
    return c;
}

static double alpha(const cm_sched_config *cfg, int64_t batch, const char *max_dur, int64_t bpe, double ssr) {
    cm_sched_clock c = clock_at(batch, max_dur, bpe, ssr);
    double a = -1;
    cr_assert_eq(cm_sched_multiplier(cfg, &c, &a), CM_OK, "%s at %lld ba: %s", cm_sched_kind_name(cfg->kind),
                 (long long)batch, cm_last_error());
    return a;
}

#define EXPECT_ALPHA(cfg, batch, max_dur, bpe, ssr, want)                                                         \
    do {                                                                                                          \
        double got_ = alpha(cfg, batch, max_dur, bpe, ssr), want_ = (want);                                       \
        cr_assert(fabs(got_ - want_) <= TOL, "%s at %lldba (max %s, bpe %d, ssr %g): %.17g, want %.17g (tol %g)", \
                  cm_sched_kind_name((cfg)->kind), (long long)(batch), max_dur, (int)(bpe), (double)(ssr), got_,  \
                  want_, TOL);                                                                                    \
    } while (0)

static void expect_error(const cm_sched_config *cfg, cm_sched_clock c, const char *want1, const char *want2) {
    double a = -7;
    cr_assert_eq(cm_sched_multiplier(cfg, &c, &a), CM_ERR_INVALID_ARG, "%s should fail", cm_sched_kind_name(cfg->kind));
    cr_assert_eq(a, -7, "output written on error");
    cr_assert(strstr(cm_last_error(), want1), "message '%s' lacks '%s'", cm_last_error(), want1);
    if (want2) cr_assert(strstr(cm_last_error(), want2), "message '%s' lacks '%s'", cm_last_error(), want2);
}

Test(sched, step_decays_at_each_step_size) {
    cm_sched_config c = cm_sched_config_default(CM_SCHED_STEP);
    c.step_size = T("10ba");
    c.gamma = 0.5;
    EXPECT_ALPHA(&c, 0, "100ba", 0, 1, 1.0);
    EXPECT_ALPHA(&c, 9, "100ba", 0, 1, 1.0);
    EXPECT_ALPHA(&c, 10, "100ba", 0, 1, 0.5);
    EXPECT_ALPHA(&c, 25, "100ba", 0, 1, 0.25);
    EXPECT_ALPHA(&c, 19, "200ba", 0, 2, 1.0); /* ssr 2: step every 20 */
    EXPECT_ALPHA(&c, 20, "200ba", 0, 2, 0.5);
    c.step_size = T("1ep"); /* epochs become batches: 7 per epoch */
    EXPECT_ALPHA(&c, 6, "10ep", 7, 1, 1.0);
    EXPECT_ALPHA(&c, 7, "10ep", 7, 1, 0.5);
    EXPECT_ALPHA(&c, 13, "10ep", 7, 1, 0.5);
    EXPECT_ALPHA(&c, 14, "10ep", 7, 1, 0.25);
}

Test(sched, multistep_counts_reached_milestones) {
    cm_sched_config c = cm_sched_config_default(CM_SCHED_MULTISTEP);
    c.milestones[0] = T("10ba");
    c.milestones[1] = T("30ba");
    c.n_milestones = 2;
    EXPECT_ALPHA(&c, 0, "100ba", 0, 1, 1.0);
    EXPECT_ALPHA(&c, 9, "100ba", 0, 1, 1.0);
    EXPECT_ALPHA(&c, 10, "100ba", 0, 1, 0.1);
    EXPECT_ALPHA(&c, 29, "100ba", 0, 1, 0.1);
    EXPECT_ALPHA(&c, 30, "100ba", 0, 1, 0.1 * 0.1);
    EXPECT_ALPHA(&c, 4, "50ba", 0, 0.5, 1.0); /* ssr 0.5: milestones 5, 15 */
    EXPECT_ALPHA(&c, 5, "50ba", 0, 0.5, 0.1);
    EXPECT_ALPHA(&c, 15, "50ba", 0, 0.5, 0.1 * 0.1);
    c.milestones[1] = T("2ep"); /* 2 epochs of 5 batches = 10ba, as is milestone 0 */
    EXPECT_ALPHA(&c, 9, "4ep", 5, 1, 1.0);
    EXPECT_ALPHA(&c, 10, "4ep", 5, 1, 0.1 * 0.1);
    c.milestones[1] = T("800sp"); /* other units compare with their own counter: 8 samples per batch */
    EXPECT_ALPHA(&c, 99, "200ba", 0, 1, 0.1);
    EXPECT_ALPHA(&c, 100, "200ba", 0, 1, 0.1 * 0.1);
}

Test(sched, constant_holds_alpha_until_t_max) {
    cm_sched_config c = cm_sched_config_default(CM_SCHED_CONSTANT);
    EXPECT_ALPHA(&c, 0, "100ba", 0, 1, 1.0); /* defaults: alpha 1 */
    c.alpha = 0.5;
    c.t_max = T("0.5dur");
    EXPECT_ALPHA(&c, 0, "100ba", 0, 1, 0.5);
    EXPECT_ALPHA(&c, 49, "100ba", 0, 1, 0.5);
    EXPECT_ALPHA(&c, 50, "100ba", 0, 1, 1.0);
    EXPECT_ALPHA(&c, 9, "2ep", 10, 1, 0.5); /* 0.5dur of 2ep x 10ba = 10ba */
    EXPECT_ALPHA(&c, 10, "2ep", 10, 1, 1.0);
    /* 0.29 * 100 is 28.999999999999996 in double: Composer truncates to 28, we read 29 */
    c.t_max = T("0.29dur");
    EXPECT_ALPHA(&c, 28, "100ba", 0, 1, 0.5);
    EXPECT_ALPHA(&c, 29, "100ba", 0, 1, 1.0);
}

Test(sched, linear_interpolates_and_clamps) {
    cm_sched_config c = cm_sched_config_default(CM_SCHED_LINEAR);
    EXPECT_ALPHA(&c, 50, "100ba", 0, 1, 0.5); /* defaults: 1 -> 0 over 1dur */
    c.alpha_f = 0.2;
    EXPECT_ALPHA(&c, 0, "100ba", 0, 1, 1.0);
    EXPECT_ALPHA(&c, 50, "100ba", 0, 1, 1.0 + 0.5 * (0.2 - 1.0));
    EXPECT_ALPHA(&c, 100, "100ba", 0, 1, 0.2);
    EXPECT_ALPHA(&c, 150, "100ba", 0, 1, 0.2);
    c.t_max = T("40ba");
    EXPECT_ALPHA(&c, 40, "200ba", 0, 2, 1.0 + 0.5 * (0.2 - 1.0)); /* ssr 2: t_max 80ba */
    c.t_max = T("0ba");                                            /* zero length: finished */
    EXPECT_ALPHA(&c, 0, "100ba", 0, 1, 0.2);
}

Test(sched, exponential_decays_by_gamma_per_period) {
    cm_sched_config c = cm_sched_config_default(CM_SCHED_EXPONENTIAL);
    c.gamma = 0.5;
    EXPECT_ALPHA(&c, 0, "10ep", 10, 1, 1.0);
    EXPECT_ALPHA(&c, 5, "10ep", 10, 1, sqrt(0.5));
    EXPECT_ALPHA(&c, 10, "10ep", 10, 1, 0.5);
    EXPECT_ALPHA(&c, 30, "10ep", 10, 1, 0.125);
    EXPECT_ALPHA(&c, 30, "10ep", 10, 3, 0.5); /* ssr 3: period 30ba */
    expect_error(&c, clock_at(3, "100ba", 0, 1), "batches_per_epoch", "1ep");
}

Test(sched, cosine_annealing_follows_half_cosine) {
    cm_sched_config c = cm_sched_config_default(CM_SCHED_COSINE_ANNEALING);
    c.alpha_f = 0.1;
    EXPECT_ALPHA(&c, 0, "100ba", 0, 1, 1.0);
    EXPECT_ALPHA(&c, 25, "100ba", 0, 1, 0.1 + 0.9 * (1 + cos(M_PI / 4)) / 2);
    EXPECT_ALPHA(&c, 50, "100ba", 0, 1, 0.55);
    EXPECT_ALPHA(&c, 100, "100ba", 0, 1, 0.1);
    EXPECT_ALPHA(&c, 200, "100ba", 0, 1, 0.1);
    c.t_max = T("1ep"); /* a sub-run cosine in epochs, stretched by ssr 2: 20ba */
    EXPECT_ALPHA(&c, 10, "40ba", 10, 2, 0.55);
}

Test(sched, warm_restarts_restart_at_growing_cycles) {
    cm_sched_config c = cm_sched_config_default(CM_SCHED_COSINE_ANNEALING_WARM_RESTARTS);
    c.t_0 = T("10ba");
    c.t_mult = 2; /* cycles [0, 10), [10, 30), [30, 70) */
    EXPECT_ALPHA(&c, 0, "100ba", 0, 1, 1.0);
    EXPECT_ALPHA(&c, 5, "100ba", 0, 1, 0.5);
    EXPECT_ALPHA(&c, 9, "100ba", 0, 1, (1 + cos(0.9 * M_PI)) / 2);
    EXPECT_ALPHA(&c, 10, "100ba", 0, 1, 1.0);
    EXPECT_ALPHA(&c, 20, "100ba", 0, 1, 0.5);
    EXPECT_ALPHA(&c, 30, "100ba", 0, 1, 1.0);
    EXPECT_ALPHA(&c, 50, "100ba", 0, 1, 0.5);
    EXPECT_ALPHA(&c, 10, "200ba", 0, 2, 0.5); /* ssr 2: first cycle 20ba */
    c.t_mult = 1;
    c.alpha_f = 0.2;
    EXPECT_ALPHA(&c, 1000005, "2000000ba", 0, 1, 0.6); /* a long run: equal cycles without a long loop */
    EXPECT_ALPHA(&c, 1000000, "2000000ba", 0, 1, 1.0);
    c.t_mult = 0.5;
    c.alpha_f = 0;
    c.t_0 = T("4ba"); /* cycles 4, 2, 1, then 0: an error, as in Composer */
    EXPECT_ALPHA(&c, 6, "100ba", 0, 1, 1.0);
    expect_error(&c, clock_at(7, "100ba", 0, 1), "decayed to 0", NULL);
}

Test(sched, polynomial_decays_as_a_power_and_clamps) {
    cm_sched_config c = cm_sched_config_default(CM_SCHED_POLYNOMIAL);
    c.power = 2;
    EXPECT_ALPHA(&c, 0, "100ba", 0, 1, 1.0);
    EXPECT_ALPHA(&c, 50, "100ba", 0, 1, 0.25);
    EXPECT_ALPHA(&c, 100, "100ba", 0, 1, 0.0);
    EXPECT_ALPHA(&c, 150, "100ba", 0, 1, 0.0); /* clamped (unclamped would give 0.25) */
    c.alpha_f = 0.1;
    EXPECT_ALPHA(&c, 50, "100ba", 0, 1, 0.1 + 0.25 * 0.9);
    c.power = 0.5;
    EXPECT_ALPHA(&c, 75, "100ba", 0, 1, 0.1 + 0.5 * 0.9);
}

Test(sched, cosine_with_warmup_ramps_then_anneals) {
    cm_sched_config c = cm_sched_config_default(CM_SCHED_COSINE_ANNEALING_WITH_WARMUP);
    c.t_warmup = T("10ba");
    EXPECT_ALPHA(&c, 0, "110ba", 0, 1, 0.0);
    EXPECT_ALPHA(&c, 5, "110ba", 0, 1, 0.5);
    EXPECT_ALPHA(&c, 9, "110ba", 0, 1, 0.9);
    EXPECT_ALPHA(&c, 10, "110ba", 0, 1, 1.0);
    EXPECT_ALPHA(&c, 60, "110ba", 0, 1, 0.5);
    EXPECT_ALPHA(&c, 110, "110ba", 0, 1, 0.0);
    EXPECT_ALPHA(&c, 200, "110ba", 0, 1, 0.0);
    /* ssr 2 (the trainer has scaled max_duration to 220ba); warmup not scaled: 10ba */
    EXPECT_ALPHA(&c, 5, "220ba", 0, 2, 0.5);
    EXPECT_ALPHA(&c, 10, "220ba", 0, 2, 1.0);
    EXPECT_ALPHA(&c, 115, "220ba", 0, 2, 0.5);
    /* scale_warmup: warmup 20ba, and the whole curve is the ssr-1 curve stretched by 2 */
    c.scale_warmup = true;
    EXPECT_ALPHA(&c, 10, "220ba", 0, 2, 0.5);
    EXPECT_ALPHA(&c, 19, "220ba", 0, 2, 0.95);
    EXPECT_ALPHA(&c, 20, "220ba", 0, 2, 1.0);
    for (int k = 0; k <= 110; k++) {
        double a1 = alpha(&c, k, "110ba", 0, 1), a2 = alpha(&c, 2 * k, "220ba", 0, 2);
        cr_assert(fabs(a1 - a2) <= TOL, "alpha_2(%d) = %.17g != alpha_1(%d) = %.17g", 2 * k, a2, k, a1);
    }
    /* warmup in dur: 0.1 of 10ep x 10ba = 10ba */
    c.scale_warmup = false;
    c.t_warmup = T("0.1dur");
    EXPECT_ALPHA(&c, 5, "10ep", 10, 1, 0.5);
    EXPECT_ALPHA(&c, 55, "10ep", 10, 1, 0.5);
}

Test(sched, linear_and_constant_with_warmup) {
    cm_sched_config c = cm_sched_config_default(CM_SCHED_LINEAR_WITH_WARMUP);
    c.t_warmup = T("10ba");
    c.alpha_i = 0.8;
    c.alpha_f = 0.2;
    EXPECT_ALPHA(&c, 0, "110ba", 0, 1, 0.0);
    EXPECT_ALPHA(&c, 5, "110ba", 0, 1, 0.4); /* the warmup climbs to alpha_i */
    EXPECT_ALPHA(&c, 10, "110ba", 0, 1, 0.8);
    EXPECT_ALPHA(&c, 60, "110ba", 0, 1, 0.8 + 0.5 * (0.2 - 0.8));
    EXPECT_ALPHA(&c, 110, "110ba", 0, 1, 0.2);
    EXPECT_ALPHA(&c, 500, "110ba", 0, 1, 0.2);

    cm_sched_config k = cm_sched_config_default(CM_SCHED_CONSTANT_WITH_WARMUP);
    k.t_warmup = T("10ba");
    k.alpha = 0.5;
    EXPECT_ALPHA(&k, 0, "110ba", 0, 1, 0.0);
    EXPECT_ALPHA(&k, 5, "110ba", 0, 1, 0.25);
    EXPECT_ALPHA(&k, 10, "110ba", 0, 1, 0.5);
    EXPECT_ALPHA(&k, 110, "110ba", 0, 1, 0.5);
    EXPECT_ALPHA(&k, 1000, "110ba", 0, 1, 0.5); /* stays alpha after t_max, as Composer computes */
}

Test(sched, polynomial_and_multistep_with_warmup) {
    cm_sched_config p = cm_sched_config_default(CM_SCHED_POLYNOMIAL_WITH_WARMUP);
    p.t_warmup = T("10ba"); /* power defaults to 2 */
    EXPECT_ALPHA(&p, 5, "110ba", 0, 1, 0.5);
    EXPECT_ALPHA(&p, 10, "110ba", 0, 1, 1.0);
    EXPECT_ALPHA(&p, 60, "110ba", 0, 1, 0.25);
    EXPECT_ALPHA(&p, 110, "110ba", 0, 1, 0.0);
    p.scale_warmup = true; /* ssr 0.5: warmup 5ba, t_max 55ba */
    EXPECT_ALPHA(&p, 2, "55ba", 0, 0.5, 0.4);
    EXPECT_ALPHA(&p, 30, "55ba", 0, 0.5, 0.25);

    cm_sched_config m = cm_sched_config_default(CM_SCHED_MULTISTEP_WITH_WARMUP);
    m.t_warmup = T("10ba");
    m.milestones[0] = T("5ba"); /* inside the warmup: takes effect once the warmup ends */
    m.milestones[1] = T("50ba");
    m.n_milestones = 2;
    m.gamma = 0.5;
    EXPECT_ALPHA(&m, 0, "100ba", 0, 1, 0.0);
    EXPECT_ALPHA(&m, 5, "100ba", 0, 1, 0.5);
    EXPECT_ALPHA(&m, 9, "100ba", 0, 1, 0.9);
    EXPECT_ALPHA(&m, 10, "100ba", 0, 1, 0.5);
    EXPECT_ALPHA(&m, 50, "100ba", 0, 1, 0.25);
    /* ssr 2 without scale_warmup: warmup 10ba, milestones 10ba and 100ba */
    EXPECT_ALPHA(&m, 9, "200ba", 0, 2, 0.9);
    EXPECT_ALPHA(&m, 10, "200ba", 0, 2, 0.5);
    EXPECT_ALPHA(&m, 99, "200ba", 0, 2, 0.5);
    EXPECT_ALPHA(&m, 100, "200ba", 0, 2, 0.25);
    m.scale_warmup = true; /* warmup 20ba */
    EXPECT_ALPHA(&m, 10, "200ba", 0, 2, 0.5);
    EXPECT_ALPHA(&m, 19, "200ba", 0, 2, 0.95);
    EXPECT_ALPHA(&m, 20, "200ba", 0, 2, 0.5);
}

Test(sched, several_schedulers_multiply) {
    cm_sched_config cs[2] = {cm_sched_config_default(CM_SCHED_STEP), cm_sched_config_default(CM_SCHED_LINEAR)};
    cs[0].step_size = T("10ba");
    cs[0].gamma = 0.5;
    cm_sched_clock c = clock_at(25, "100ba", 0, 1);
    double a;
    cr_assert_eq(cm_sched_multiplier_product(cs, 2, &c, &a), CM_OK, "%s", cm_last_error());
    cr_assert(fabs(a - 0.25 * 0.75) <= TOL, "%.17g", a);
    cr_assert_eq(cm_sched_multiplier_product(cs, 0, &c, &a), CM_OK);
    cr_assert_eq(a, 1.0);
    cs[1].t_max = T("1sec");
    cr_assert_eq(cm_sched_multiplier_product(cs, 2, &c, &a), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "scheduler 1 of 2") && strstr(cm_last_error(), "wall-clock"), "%s",
              cm_last_error());
}

Test(sched, multiplier_is_taken_at_the_batch_being_trained) {
    /* Linear 1 -> 0 over 4ba with SGD (lr 1, gradient 1): the four updates use α(0..3) = 1, 0.75,
     * 0.5, 0.25 (Composer's would use α(0), α(0), α(1), α(2)). */
    cm_sched_config lin = cm_sched_config_default(CM_SCHED_LINEAR);
    lin.t_max = T("4ba");
    cm_sched_clock clk = clock_at(0, "4ba", 0, 1);
    float p = 0, g = 1;
    cm_optim *o;
    cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_SGD);
    hp.lr = 1;
    cm_optim_span sp = {"p", &p, &g, 1};
    cr_assert_eq(cm_optim_new(CM_OPTIM_SGD, &o), CM_OK);
    cr_assert_eq(cm_optim_add_group(o, &hp, &sp, 1), CM_OK, "%s", cm_last_error());
    const float after[4] = {-1.0f, -1.75f, -2.25f, -2.5f};
    for (int k = 0; k < 4; k++) {
        double a;
        cr_assert_eq(clk.now.batch, k);
        cr_assert_eq(cm_sched_multiplier(&lin, &clk, &a), CM_OK, "%s", cm_last_error());
        cr_assert_eq(cm_optim_step(o, a), CM_OK);
        cr_assert_eq(p, after[k], "after update %d: %g, want %g", k, p, after[k]);
        cm_timestamp_next_batch(&clk.now, 8, 0, 0.0);
    }
    cm_optim_free(o);
}

Test(sched, bad_configs_and_clocks_are_errors) {
    cm_sched_config c = cm_sched_config_default(CM_SCHED_STEP); /* step_size left at 0 */
    expect_error(&c, clock_at(0, "10ba", 0, 1), "step_size '0ba'", "> 0");
    c.step_size = T("3ba");
    c.gamma = NAN;
    expect_error(&c, clock_at(0, "10ba", 0, 1), "gamma", "finite");

    cm_sched_config cw = cm_sched_config_default(CM_SCHED_COSINE_ANNEALING_WITH_WARMUP);
    cw.t_warmup = T("64sp");
    expect_error(&cw, clock_at(0, "10ba", 0, 1), "different units", "64sp");
    cw.t_warmup = T("2ba");
    cw.t_max = T("5ba");
    expect_error(&cw, clock_at(0, "10ba", 0, 1), "shorter than max_duration", "10ba");
    expect_error(&cw, clock_at(0, "1ep", 10, 1), "shorter than max_duration", "1ep"); /* 5ba < 1ep of 10ba */
    cw.t_max = T("1dur");
    expect_error(&cw, clock_at(0, "2ep", 0, 1), "batches_per_epoch", NULL);
    expect_error(&cw, clock_at(0, "10ba", 0, 0), "scale_schedule_ratio", NULL);
    cm_sched_clock bad = clock_at(0, "10ba", 0, 1);
    bad.max_duration = cm_time_dur(1.0);
    expect_error(&cw, bad, "max_duration '1dur'", NULL);
    cw.t_warmup = T("1h");
    expect_error(&cw, clock_at(0, "10ba", 0, 1), "t_warmup '3600sec'", "wall-clock");

    cm_sched_config m = cm_sched_config_default(CM_SCHED_MULTISTEP);
    m.n_milestones = CM_SCHED_MAX_MILESTONES + 1;
    expect_error(&m, clock_at(0, "10ba", 0, 1), "n_milestones", NULL);
    m.n_milestones = 1;
    m.milestones[0] = cm_time_make(-3, CM_TIME_BATCH);
    expect_error(&m, clock_at(0, "10ba", 0, 1), "milestones[0] '-3ba'", NULL);
    cm_sched_config w = cm_sched_config_default(CM_SCHED_COSINE_ANNEALING_WARM_RESTARTS);
    w.t_0 = T("5ba");
    w.t_mult = 0;
    expect_error(&w, clock_at(0, "10ba", 0, 1), "t_mult", NULL);
    cm_sched_config k = cm_sched_config_default((cm_sched_kind)99);
    expect_error(&k, clock_at(0, "10ba", 0, 1), "kind 99", NULL);
    cr_assert_eq(cm_sched_validate(NULL), CM_ERR_INVALID_ARG);
}

Test(sched, kind_names_parse_with_composer_and_foundry_aliases) {
    cm_sched_kind k;
    for (int i = 0; i < CM_SCHED_KIND_COUNT; i++) {
        cr_assert_eq(cm_sched_kind_parse(cm_sched_kind_name((cm_sched_kind)i), &k), CM_OK);
        cr_assert_eq((int)k, i);
    }
    cr_assert_eq(cm_sched_kind_parse("CosineAnnealingWithWarmupScheduler", &k), CM_OK);
    cr_assert_eq(k, CM_SCHED_COSINE_ANNEALING_WITH_WARMUP);
    cr_assert_eq(cm_sched_kind_parse("cosine_with_warmup", &k), CM_OK);
    cr_assert_eq(k, CM_SCHED_COSINE_ANNEALING_WITH_WARMUP);
    cr_assert_eq(cm_sched_kind_parse("linear_decay_with_warmup", &k), CM_OK);
    cr_assert_eq(k, CM_SCHED_LINEAR_WITH_WARMUP);
    cr_assert_eq(cm_sched_kind_parse("onecycle", &k), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "onecycle") && strstr(cm_last_error(), "polynomial_with_warmup"), "%s",
              cm_last_error());
}
