/* The optimizer object (include/composer/optim.h): defaults, validation, groups, state entries
 * for checkpoints, decoupled weight decay semantics, skipped spans, the parallel path, and
 * allocation failures. The update math itself is checked against torch in test_golden_optim.c. */
#include "cmtest.h"

#include <composer/optim.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

static cm_optim *make(cm_optim_kind kind, const cm_optim_hparams *hp, const cm_optim_span *spans, int n) {
    cm_optim *o;
    cr_assert_eq(cm_optim_new(kind, &o), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_optim_add_group(o, hp, spans, n), CM_OK, "%s", cm_last_error());
    return o;
}

static void fill(float *x, int64_t n, uint64_t seed) {
    cm_rng r = cm_rng_init(seed, 0);
    cm_rng_normal(&r, x, (size_t)n, 0.0f, 1.0f);
}

Test(optim, defaults_follow_torch_and_composer) {
    cm_optim_hparams h = cm_optim_hparams_default(CM_OPTIM_SGD);
    cr_assert(isnan(h.lr) && h.momentum == 0 && h.weight_decay == 0 && !h.nesterov);
    h = cm_optim_hparams_default(CM_OPTIM_ADAM);
    cr_assert(h.lr == 1e-3 && h.beta1 == 0.9 && h.beta2 == 0.999 && h.eps == 1e-8 && h.weight_decay == 0);
    h = cm_optim_hparams_default(CM_OPTIM_ADAMW);
    cr_assert(h.lr == 1e-3 && h.weight_decay == 1e-2 && h.beta2 == 0.999);
    h = cm_optim_hparams_default(CM_OPTIM_DECOUPLED_ADAMW);
    cr_assert(h.lr == 1e-3 && h.weight_decay == 1e-5 && h.beta1 == 0.9 && h.beta2 == 0.95 && !h.amsgrad);
    cm_optim_kind k;
    for (int i = 0; i < CM_OPTIM_KIND_COUNT; i++) {
        cr_assert_eq(cm_optim_kind_parse(cm_optim_kind_name((cm_optim_kind)i), &k), CM_OK);
        cr_assert_eq((int)k, i);
    }
    cr_assert_eq(cm_optim_kind_parse("AdamW", &k), CM_OK);
    cr_assert_eq(k, CM_OPTIM_ADAMW);
    cr_assert_eq(cm_optim_kind_parse("lion", &k), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "lion") && strstr(cm_last_error(), "decoupled_adamw"), "%s", cm_last_error());
    cm_optim_free(NULL);
}

Test(optim, bad_hyperparameters_and_spans_are_rejected_and_nothing_is_added) {
    float w[4] = {0}, g[4] = {0};
    cm_optim_span sp = {"w", w, g, 4};
    cm_optim *o;
    cr_assert_eq(cm_optim_new(CM_OPTIM_SGD, &o), CM_OK);
    struct {
        cm_optim_hparams hp;
        const char *want;
    } bad[8];
    int nb = 0;
    bad[nb].hp = cm_optim_hparams_default(CM_OPTIM_SGD), bad[nb++].want = "lr is not set";
    bad[nb].hp = cm_optim_hparams_default(CM_OPTIM_SGD), bad[nb].hp.lr = -1, bad[nb++].want = "lr = -1";
    bad[nb].hp = cm_optim_hparams_default(CM_OPTIM_SGD), bad[nb].hp.lr = 0.1, bad[nb].hp.nesterov = true,
    bad[nb++].want = "nesterov needs momentum > 0";
    bad[nb].hp = cm_optim_hparams_default(CM_OPTIM_SGD), bad[nb].hp.lr = 0.1, bad[nb].hp.nesterov = true,
    bad[nb].hp.momentum = 0.9, bad[nb].hp.dampening = 0.1, bad[nb++].want = "dampening = 0";
    bad[nb].hp = cm_optim_hparams_default(CM_OPTIM_SGD), bad[nb].hp.lr = 0.1, bad[nb].hp.weight_decay = -0.1,
    bad[nb++].want = "weight_decay = -0.1";
    bad[nb].hp = cm_optim_hparams_default(CM_OPTIM_SGD), bad[nb].hp.lr = 0.1, bad[nb].hp.momentum = INFINITY,
    bad[nb++].want = "momentum = inf";
    for (int i = 0; i < nb; i++) {
        cr_assert_eq(cm_optim_add_group(o, &bad[i].hp, &sp, 1), CM_ERR_INVALID_ARG, "case %d", i);
        cr_assert(strstr(cm_last_error(), bad[i].want) && strstr(cm_last_error(), "group 0"), "case %d: '%s' lacks '%s'",
                  i, cm_last_error(), bad[i].want);
    }
    cm_optim_hparams ok = cm_optim_hparams_default(CM_OPTIM_SGD);
    ok.lr = 0.1;
    cm_optim_span nullp = {"x", NULL, g, 4};
    cr_assert_eq(cm_optim_add_group(o, &ok, &nullp, 1), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "NULL param"), "%s", cm_last_error());
    cm_optim_span neg = {"x", w, g, -1};
    cr_assert_eq(cm_optim_add_group(o, &ok, &neg, 1), CM_ERR_INVALID_ARG);
    cm_optim_span twice[2] = {{"w", w, g, 2}, {"w", w + 2, g + 2, 2}};
    cr_assert_eq(cm_optim_add_group(o, &ok, twice, 2), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "'w' is already used"), "%s", cm_last_error());
    cr_assert_eq(cm_optim_n_groups(o), 0);
    cr_assert_eq(cm_optim_n_state(o), 0);
    /* a name clash with an earlier group */
    cr_assert_eq(cm_optim_add_group(o, &ok, &sp, 1), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_optim_add_group(o, &ok, &sp, 1), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_optim_n_groups(o), 1);
    cm_optim_free(o);

    cr_assert_eq(cm_optim_new(CM_OPTIM_ADAM, &o), CM_OK);
    cm_optim_hparams a = cm_optim_hparams_default(CM_OPTIM_ADAM);
    a.beta2 = 1.0;
    cr_assert_eq(cm_optim_add_group(o, &a, &sp, 1), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "beta2 = 1 must be in [0, 1)"), "%s", cm_last_error());
    a = cm_optim_hparams_default(CM_OPTIM_ADAM);
    a.eps = -1;
    cr_assert_eq(cm_optim_add_group(o, &a, &sp, 1), CM_ERR_INVALID_ARG);
    cm_optim_free(o);
    cr_assert_eq(cm_optim_new((cm_optim_kind)42, &o), CM_ERR_INVALID_ARG);
}

Test(optim, state_entries_are_named_like_torch_state_dict) {
    float w[3] = {0}, g[3] = {0}, b[2] = {0}, gb[2] = {0};
    cm_optim_span sp[2] = {{"blocks.0.w", w, g, 3}, {NULL, b, gb, 2}};
    cm_optim_hparams h = cm_optim_hparams_default(CM_OPTIM_ADAMW);
    h.amsgrad = true;
    cm_optim *o = make(CM_OPTIM_ADAMW, &h, sp, 2);
    const char *want[] = {"blocks.0.w.step", "blocks.0.w.exp_avg", "blocks.0.w.exp_avg_sq", "blocks.0.w.max_exp_avg_sq",
                          "span1.step",      "span1.exp_avg",      "span1.exp_avg_sq",      "span1.max_exp_avg_sq"};
    cr_assert_eq(cm_optim_n_state(o), 8);
    for (int i = 0; i < 8; i++) {
        cm_optim_state_entry e;
        cr_assert_eq(cm_optim_state_get(o, i, &e), CM_OK);
        cr_assert_str_eq(e.name, want[i]);
        bool is_step = strstr(e.name, ".step") != NULL;
        cr_assert_eq(e.dtype, is_step ? CM_DTYPE_I64 : CM_DTYPE_F32, "%s", e.name);
        cr_assert_eq(e.numel, is_step ? 1 : (i < 4 ? 3 : 2), "%s", e.name);
    }
    cm_optim_state_entry e;
    cr_assert_eq(cm_optim_state_get(o, 8, &e), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_optim_state_find(o, "blocks.0.w.momentum_buffer", &e), CM_ERR_NOT_FOUND);
    cr_assert(strstr(cm_last_error(), "blocks.0.w.momentum_buffer"), "%s", cm_last_error());
    cm_optim_free(o);

    cm_optim_hparams s = cm_optim_hparams_default(CM_OPTIM_SGD);
    s.lr = 0.1;
    o = make(CM_OPTIM_SGD, &s, sp, 1); /* no momentum: only the step count */
    cr_assert_eq(cm_optim_n_state(o), 1);
    cm_optim_free(o);
    s.momentum = 0.9;
    o = make(CM_OPTIM_DECOUPLED_SGDW, &s, sp, 1);
    cr_assert_eq(cm_optim_n_state(o), 2);
    cr_assert_eq(cm_optim_state_find(o, "blocks.0.w.momentum_buffer", &e), CM_OK);
    cm_optim_free(o);
}

Test(optim, decoupled_decay_follows_the_schedule_not_the_lr) {
    /* With zero gradients the Adam update is 0 and only the decay moves p:
     *   AdamW:          p · (1 - lr·mult·wd)
     *   DecoupledAdamW: p · (1 - (lr·mult / initial_lr)·wd) = p · (1 - mult·wd) */
    float w[2] = {2.0f, -4.0f}, g[2] = {0, 0};
    cm_optim_span sp = {"w", w, g, 2};
    cm_optim_hparams h = cm_optim_hparams_default(CM_OPTIM_DECOUPLED_ADAMW);
    h.lr = 1e-3;
    h.weight_decay = 0.1;
    cm_optim *o = make(CM_OPTIM_DECOUPLED_ADAMW, &h, &sp, 1);
    cr_assert_eq(cm_optim_step(o, 0.5), CM_OK);
    cr_assert_eq(w[0], 2.0f * (float)(1 - 0.5 * 0.1), "%.9g", w[0]);
    /* changing the group's lr (like group['lr'] in torch) scales the decay by lr / initial_lr */
    cm_optim_hparams cur;
    cr_assert_eq(cm_optim_group_get(o, 0, &cur), CM_OK);
    cur.lr = 5e-4;
    cr_assert_eq(cm_optim_group_set(o, 0, &cur), CM_OK, "%s", cm_last_error());
    float before = w[1];
    cr_assert_eq(cm_optim_step(o, 1.0), CM_OK);
    cr_assert_eq(w[1], before * (float)(1 - (5e-4 / 1e-3) * 0.1), "%.9g", w[1]);
    cm_optim_free(o);

    w[0] = 2.0f;
    h = cm_optim_hparams_default(CM_OPTIM_ADAMW);
    h.lr = 1e-3;
    h.weight_decay = 0.1;
    o = make(CM_OPTIM_ADAMW, &h, &sp, 1);
    cr_assert_eq(cm_optim_step(o, 0.5), CM_OK);
    cr_assert_eq(w[0], 2.0f * (float)(1 - 1e-3 * 0.5 * 0.1), "%.9g", w[0]);
    cm_optim_free(o);

    /* DecoupledSGDW likewise: p · (1 - mult·wd) - lr·mult·g */
    float p[1] = {1.0f}, gp[1] = {1.0f};
    cm_optim_span s1 = {"p", p, gp, 1};
    h = cm_optim_hparams_default(CM_OPTIM_DECOUPLED_SGDW);
    h.lr = 0.1;
    h.weight_decay = 0.01;
    o = make(CM_OPTIM_DECOUPLED_SGDW, &h, &s1, 1);
    cr_assert_eq(cm_optim_step(o, 0.5), CM_OK);
    float want = 1.0f * (float)(1 - 0.5 * 0.01) + (float)(-0.05) * 1.0f;
    cr_assert(fabsf(p[0] - want) <= 1e-7f, "%.9g vs %.9g", p[0], want);
    cm_optim_free(o);
}

Test(optim, spans_without_gradient_are_skipped_and_zero_grad_clears) {
    float w[3] = {1, 2, 3}, v[2] = {4, 5}, gv[2] = {1, 1};
    cm_optim_span sp[2] = {{"frozen", w, NULL, 3}, {"v", v, gv, 2}};
    cm_optim_hparams h = cm_optim_hparams_default(CM_OPTIM_ADAM);
    cm_optim *o = make(CM_OPTIM_ADAM, &h, sp, 2);
    cr_assert_eq(cm_optim_step(o, 1.0), CM_OK);
    cr_assert(w[0] == 1 && w[1] == 2 && w[2] == 3, "frozen span moved");
    cr_assert(v[0] < 4, "trained span did not move: %g", v[0]);
    cm_optim_state_entry e;
    cr_assert_eq(cm_optim_state_find(o, "frozen.step", &e), CM_OK);
    cr_assert_eq(*(int64_t *)e.data, 0);
    cr_assert_eq(cm_optim_state_find(o, "v.step", &e), CM_OK);
    cr_assert_eq(*(int64_t *)e.data, 1);
    cm_optim_zero_grad(o);
    cr_assert(gv[0] == 0 && gv[1] == 0);
    /* a bad multiplier changes nothing */
    float keep = v[0];
    cr_assert_eq(cm_optim_step(o, NAN), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "multiplier"), "%s", cm_last_error());
    cr_assert_eq(cm_optim_step(o, -1), CM_ERR_INVALID_ARG);
    cr_assert_eq(v[0], keep);
    cr_assert_eq(cm_optim_group_get(o, 1, &h), CM_ERR_INVALID_ARG);
    h.amsgrad = true; /* would add state */
    cr_assert_eq(cm_optim_group_set(o, 0, &h), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "max_exp_avg_sq"), "%s", cm_last_error());
    cm_optim_free(o);
}

/* Runs `steps` AdamW-with-amsgrad steps on n parameters split into spans of `chunk` elements. */
static void run_split(float *w, int64_t n, int64_t chunk, int steps, cm_optim_kind kind) {
    int ns = (int)((n + chunk - 1) / chunk);
    cm_optim_span *sp = cm_alloc(sizeof *sp * (size_t)ns, 16);
    float *g = cm_alloc(sizeof(float) * (size_t)n, 64);
    char(*names)[16] = cm_alloc(16 * (size_t)ns, 16);
    for (int i = 0; i < ns; i++) {
        snprintf(names[i], 16, "s%d", i);
        int64_t off = i * chunk;
        sp[i] = (cm_optim_span){names[i], w + off, g + off, off + chunk <= n ? chunk : n - off};
    }
    cm_optim_hparams h = cm_optim_hparams_default(kind);
    if (kind == CM_OPTIM_SGD) {
        h.lr = 0.1;
        h.momentum = 0.9;
        h.nesterov = true;
        h.weight_decay = 1e-4;
    } else {
        h.amsgrad = true;
    }
    cm_optim *o = make(kind, &h, sp, ns);
    for (int s = 0; s < steps; s++) {
        fill(g, n, 100 + (uint64_t)s);
        cr_assert_eq(cm_optim_step(o, 1.0 - 0.1 * s), CM_OK);
    }
    cm_optim_free(o);
    cm_free(names);
    cm_free(g);
    cm_free(sp);
}

Test(optim, large_spans_on_threads_equal_small_spans_on_one) {
    const int64_t n = 100003; /* above the threshold for threads, odd so the tail is exercised */
    cm_optim_kind kinds[2] = {CM_OPTIM_ADAMW, CM_OPTIM_SGD};
    for (int k = 0; k < 2; k++) {
        float *a = cm_alloc(sizeof(float) * n, 64), *b = cm_alloc(sizeof(float) * n, 64);
        fill(a, n, 7);
        memcpy(b, a, sizeof(float) * n);
        run_split(a, n, n, 3, kinds[k]);    /* one span, threaded */
        run_split(b, n, 1000, 3, kinds[k]); /* 101 spans, each on one thread */
        cr_assert_eq(memcmp(a, b, sizeof(float) * n), 0, "%s: threaded and serial updates differ",
                     cm_optim_kind_name(kinds[k]));
        cm_free(a);
        cm_free(b);
    }
}

Test(optim, resuming_from_copied_state_continues_bit_for_bit) {
    enum { N = 37 };
    float wa[N], wb[N], g[N], gb[N];
    fill(wa, N, 1);
    cm_optim_hparams h = cm_optim_hparams_default(CM_OPTIM_DECOUPLED_ADAMW);
    h.amsgrad = true;
    h.weight_decay = 1e-2;
    cm_optim_span sa = {"w", wa, g, N}, sb = {"w", wb, gb, N};
    cm_optim *a = make(CM_OPTIM_DECOUPLED_ADAMW, &h, &sa, 1);
    for (int s = 0; s < 3; s++) {
        fill(g, N, 50 + (uint64_t)s);
        cr_assert_eq(cm_optim_step(a, 1.0), CM_OK);
    }
    /* "checkpoint": parameters and every state entry into a fresh optimizer */
    memcpy(wb, wa, sizeof wa);
    cm_optim *b = make(CM_OPTIM_DECOUPLED_ADAMW, &h, &sb, 1);
    cr_assert_eq(cm_optim_n_state(a), cm_optim_n_state(b));
    for (int i = 0; i < cm_optim_n_state(a); i++) {
        cm_optim_state_entry ea, eb;
        cr_assert_eq(cm_optim_state_get(a, i, &ea), CM_OK);
        cr_assert_eq(cm_optim_state_find(b, ea.name, &eb), CM_OK, "%s", cm_last_error());
        memcpy(eb.data, ea.data, (size_t)ea.numel * cm_dtype_size(ea.dtype));
    }
    for (int s = 3; s < 6; s++) {
        fill(g, N, 50 + (uint64_t)s);
        memcpy(gb, g, sizeof g);
        cr_assert_eq(cm_optim_step(a, 0.5), CM_OK);
        cr_assert_eq(cm_optim_step(b, 0.5), CM_OK);
    }
    cr_assert_eq(memcmp(wa, wb, sizeof wa), 0, "resumed run differs");
    cm_optim_free(a);
    cm_optim_free(b);
}

Test(optim, allocation_failures_leave_the_optimizer_unchanged) {
    float w[8] = {0}, g[8] = {0}, v[8] = {0}, gv[8] = {0};
    cm_optim_span first = {"w", w, g, 8};
    cm_optim_span sp[2] = {{"v", v, gv, 8}, {"u", w, g, 8}};
    cm_optim_hparams h = cm_optim_hparams_default(CM_OPTIM_ADAM);
    h.amsgrad = true;
    cm_optim *o = make(CM_OPTIM_ADAM, &h, &first, 1);
    int failures = 0;
    for (int64_t n = 1; n < 100; n++) {
        cm_alloc_fail_at(n);
        cm_status st = cm_optim_add_group(o, &h, sp, 2);
        cm_alloc_fail_at(0);
        if (st == CM_OK) break;
        failures++;
        cr_assert_eq(st, CM_ERR_OOM, "allocation %lld: %s", (long long)n, cm_status_name(st));
        cr_assert_eq(cm_optim_n_groups(o), 1);
        cr_assert_eq(cm_optim_n_state(o), 4);
        cr_assert_eq(cm_optim_step(o, 1.0), CM_OK);
    }
    cr_assert_gt(failures, 5, "only %d allocations failed", failures);
    cr_assert_eq(cm_optim_n_groups(o), 2);
    cr_assert_eq(cm_optim_n_state(o), 12);
    cm_optim_free(o);
    cm_optim *p;
    cm_alloc_fail_at(1);
    cr_assert_eq(cm_optim_new(CM_OPTIM_SGD, &p), CM_ERR_OOM);
    cm_alloc_fail_at(0);
}

/* ---- cm_optim_assign: part of a span stepped with another group's hyperparameters ---- */

/* The pieces of a 100-element span after the assignments in assigned_pieces_equal_separate_spans:
 * {lo, hi, group}, group -1 = excluded. */
static const int pieces[][3] = {{0, 10, 0},  {10, 20, 1}, {20, 40, 2}, {40, 45, 0}, {45, 50, 2}, {50, 60, 0},
                                {60, 70, -1}, {70, 80, 0}, {80, 85, 1}, {85, 90, 2}, {90, 100, 1}};

Test(optim, assigned_pieces_step_exactly_like_separate_spans_in_their_groups) {
    enum { N = 100 };
    const cm_optim_kind kinds[] = {CM_OPTIM_DECOUPLED_ADAMW, CM_OPTIM_ADAMW, CM_OPTIM_ADAM, CM_OPTIM_SGD,
                                   CM_OPTIM_DECOUPLED_SGDW};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        const cm_optim_kind kind = kinds[k];
        cm_optim_hparams hp[3];
        for (int i = 0; i < 3; i++) hp[i] = cm_optim_hparams_default(kind);
        hp[0].lr = 1e-2, hp[0].weight_decay = 1e-2, hp[0].momentum = 0.9;
        hp[1].lr = 1e-3, hp[1].weight_decay = 0, hp[1].beta1 = 0.8, hp[1].momentum = 0.5;
        hp[2].lr = 5e-2, hp[2].weight_decay = 0.1, hp[2].eps = 1e-4, hp[2].momentum = 0.7, hp[2].nesterov = true;
        float wa[N], wb[N], ga[N], gb[N];
        fill(wa, N, 3);
        memcpy(wb, wa, sizeof wa);
        cm_optim_span whole = {"w", wa, ga, N};
        cm_optim *a = make(kind, &hp[0], &whole, 1);
        cr_assert_eq(cm_optim_add_group(a, &hp[1], NULL, 0), CM_OK, "%s", cm_last_error());
        cr_assert_eq(cm_optim_add_group(a, &hp[2], NULL, 0), CM_OK, "%s", cm_last_error());
        const int n_state = cm_optim_n_state(a);
        cr_assert_eq(cm_optim_assign(a, 1, wa + 10, 20), CM_OK, "%s", cm_last_error());
        cr_assert_eq(cm_optim_assign(a, 2, wa + 20, 30), CM_OK); /* overlaps the end of [10, 30) */
        cr_assert_eq(cm_optim_assign(a, 0, wa + 40, 5), CM_OK);  /* back to the span's own group */
        cr_assert_eq(cm_optim_assign(a, 1, wa + 80, 15), CM_OK);
        cr_assert_eq(cm_optim_assign(a, 2, wa + 85, 5), CM_OK);  /* inside [80, 95): splits it */
        cr_assert_eq(cm_optim_assign(a, 1, wa + 98, 2), CM_OK);  /* neighbours in one group merge */
        cr_assert_eq(cm_optim_assign(a, 1, wa + 95, 3), CM_OK);
        cr_assert_eq(cm_optim_assign(a, 1, wa + 62, 3), CM_OK);  /* excluded below: exclusion wins */
        cr_assert_eq(cm_optim_exclude(a, wa + 60, 10), CM_OK);
        cr_assert_eq(cm_optim_n_assigned(a), 10 + 20 + 5 + 5 + 5 + 5 + 5 + 3, "%s", cm_optim_kind_name(kind));
        cr_assert_eq(cm_optim_n_state(a), n_state, "assignments must not change the checkpoint's entries");

        cm_optim *b;
        cr_assert_eq(cm_optim_new(kind, &b), CM_OK);
        for (int g = 0; g < 3; g++) {
            cm_optim_span sp[8];
            int n = 0;
            char names[8][16];
            for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++)
                if (pieces[i][2] == g) {
                    snprintf(names[n], sizeof names[n], "p%zu", i);
                    sp[n] = (cm_optim_span){names[n], wb + pieces[i][0], gb + pieces[i][0], pieces[i][1] - pieces[i][0]};
                    n++;
                }
            cr_assert_eq(cm_optim_add_group(b, &hp[g], sp, n), CM_OK, "%s", cm_last_error());
        }
        for (int s = 0; s < 4; s++) {
            fill(ga, N, 100 + (uint64_t)s);
            memcpy(gb, ga, sizeof ga);
            const double mult = 1.0 - 0.2 * s;
            cr_assert_eq(cm_optim_step(a, mult), CM_OK, "%s", cm_last_error());
            cr_assert_eq(cm_optim_step(b, mult), CM_OK, "%s", cm_last_error());
        }
        for (int i = 0; i < N; i++)
            cr_assert_eq(wa[i], wb[i], "%s: element %d: %.9g assigned vs %.9g as its own span",
                         cm_optim_kind_name(kind), i, wa[i], wb[i]);
        float w0[N];
        fill(w0, N, 3);
        cr_assert_eq(memcmp(wa + 60, w0 + 60, 10 * sizeof(float)), 0, "excluded elements changed");
        cr_assert_neq(memcmp(wa + 10, w0 + 10, 10 * sizeof(float)), 0, "assigned elements did not move");
        cm_optim_free(a);
        cm_optim_free(b);
    }
}

Test(optim, assign_refuses_what_it_cannot_do_and_names_it) {
    float w[20], g[20], other[4];
    fill(w, 20, 1);
    cm_optim_hparams h = cm_optim_hparams_default(CM_OPTIM_ADAMW), ams = h;
    ams.amsgrad = true;
    cm_optim_span sp = {"blocks.0", w, g, 20};
    cm_optim *o = make(CM_OPTIM_ADAMW, &h, &sp, 1);
    cr_assert_eq(cm_optim_assign(o, 1, w, 5), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "group 1 out of range"), "%s", cm_last_error());
    cr_assert_eq(cm_optim_add_group(o, &ams, NULL, 0), CM_OK);
    cr_assert_eq(cm_optim_assign(o, 1, w, 5), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "max_exp_avg_sq") && strstr(cm_last_error(), "blocks.0"), "%s", cm_last_error());
    cr_assert_eq(cm_optim_add_group(o, &h, NULL, 0), CM_OK);
    cr_assert_eq(cm_optim_assign(o, 2, other, 4), CM_ERR_NOT_FOUND);
    cr_assert_eq(cm_optim_assign(o, 2, w + 18, 4), CM_ERR_NOT_FOUND, "a range past the span's end");
    cr_assert_eq(cm_optim_assign(o, 2, w, -1), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_optim_assign(o, 2, w + 3, 0), CM_OK);
    cr_assert_eq(cm_optim_n_assigned(o), 0);
    cm_optim_free(o);

    cm_optim_hparams s0 = cm_optim_hparams_default(CM_OPTIM_SGD), s1;
    s0.lr = 0.1, s1 = s0, s1.momentum = 0.9;
    cm_optim_span ss = {"w", w, g, 20};
    o = make(CM_OPTIM_SGD, &s0, &ss, 1);
    cr_assert_eq(cm_optim_add_group(o, &s1, NULL, 0), CM_OK);
    cr_assert_eq(cm_optim_assign(o, 1, w, 5), CM_ERR_INVALID_ARG, "momentum against none");
    cr_assert(strstr(cm_last_error(), "momentum_buffer"), "%s", cm_last_error());
    cm_optim_free(o);
}
