/* Composer's learning-rate schedulers as pure functions of training time (see
 * include/composer/optim.h for the formulas and the time conversions). */
#include <composer/optim.h>

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static const char *const kind_names[] = {
#define CM_X_(name, str) str,
    CM_SCHED_KIND_LIST(CM_X_)
#undef CM_X_
};
_Static_assert(sizeof kind_names / sizeof kind_names[0] == CM_SCHED_KIND_COUNT, "scheduler name table");

/* Composer's class names and llm-foundry's aliases. */
static const struct {
    const char *name;
    cm_sched_kind kind;
} kind_aliases[] = {
    {"StepScheduler", CM_SCHED_STEP},
    {"MultiStepScheduler", CM_SCHED_MULTISTEP},
    {"ConstantScheduler", CM_SCHED_CONSTANT},
    {"LinearScheduler", CM_SCHED_LINEAR},
    {"ExponentialScheduler", CM_SCHED_EXPONENTIAL},
    {"CosineAnnealingScheduler", CM_SCHED_COSINE_ANNEALING},
    {"CosineAnnealingWarmRestartsScheduler", CM_SCHED_COSINE_ANNEALING_WARM_RESTARTS},
    {"PolynomialScheduler", CM_SCHED_POLYNOMIAL},
    {"MultiStepWithWarmupScheduler", CM_SCHED_MULTISTEP_WITH_WARMUP},
    {"ConstantWithWarmupScheduler", CM_SCHED_CONSTANT_WITH_WARMUP},
    {"LinearWithWarmupScheduler", CM_SCHED_LINEAR_WITH_WARMUP},
    {"CosineAnnealingWithWarmupScheduler", CM_SCHED_COSINE_ANNEALING_WITH_WARMUP},
    {"PolynomialWithWarmupScheduler", CM_SCHED_POLYNOMIAL_WITH_WARMUP},
    {"cosine_with_warmup", CM_SCHED_COSINE_ANNEALING_WITH_WARMUP},
    {"linear_decay_with_warmup", CM_SCHED_LINEAR_WITH_WARMUP},
};

const char *cm_sched_kind_name(cm_sched_kind k) {
    return (unsigned)k < CM_SCHED_KIND_COUNT ? kind_names[k] : "?";
}

cm_status cm_sched_kind_parse(const char *s, cm_sched_kind *out) {
    if (s) {
        for (int k = 0; k < CM_SCHED_KIND_COUNT; k++)
            if (strcasecmp(s, kind_names[k]) == 0) {
                *out = (cm_sched_kind)k;
                return CM_OK;
            }
        for (size_t i = 0; i < sizeof kind_aliases / sizeof kind_aliases[0]; i++)
            if (strcasecmp(s, kind_aliases[i].name) == 0) {
                *out = kind_aliases[i].kind;
                return CM_OK;
            }
    }
    char list[1024];
    size_t len = 0;
    for (int k = 0; k < CM_SCHED_KIND_COUNT; k++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", k ? ", " : "", kind_names[k]);
    return cm_set_error(CM_ERR_INVALID_ARG, "scheduler '%s': unknown (use one of %s)", s ? s : "(null)", list);
}

cm_sched_config cm_sched_config_default(cm_sched_kind kind) {
    cm_sched_config c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.t_max = cm_time_dur(1.0);
    c.t_warmup = cm_time_make(0, CM_TIME_BATCH);
    c.step_size = cm_time_make(0, CM_TIME_BATCH);
    c.decay_period = cm_time_make(1, CM_TIME_EPOCH);
    c.t_0 = cm_time_make(0, CM_TIME_BATCH);
    c.gamma = kind == CM_SCHED_EXPONENTIAL ? 1.0 : 0.1;
    c.alpha = 1.0;
    c.alpha_i = 1.0;
    c.alpha_f = 0.0;
    c.power = kind == CM_SCHED_POLYNOMIAL_WITH_WARMUP ? 2.0 : 1.0;
    c.t_mult = 1.0;
    c.scale_warmup = false;
    return c;
}

cm_sched_clock cm_sched_clock_default(void) {
    cm_sched_clock c;
    memset(&c, 0, sizeof c);
    c.max_duration = cm_time_make(1, CM_TIME_EPOCH);
    c.batches_per_epoch = 0;
    c.ssr = 1.0;
    return c;
}

static const char *tstr(cm_time t, char *buf) {
    cm_time_to_string(t, buf, CM_TIME_STR_MAX);
    return buf;
}

static cm_status check_time(const cm_sched_config *c, const char *field, cm_time t) {
    char b[CM_TIME_STR_MAX];
    if ((unsigned)t.unit >= CM_TIME_UNIT_COUNT)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s scheduler: %s has time unit %d out of range",
                            cm_sched_kind_name(c->kind), field, (int)t.unit);
    if (t.unit == CM_TIME_SECOND)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "%s scheduler: %s '%s' is wall-clock time, which cannot drive a schedule (use ep, ba, "
                            "sp, tok, iter or dur)",
                            cm_sched_kind_name(c->kind), field, tstr(t, b));
    if (cm_time_value(t) < 0 || !isfinite(cm_time_value(t)))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s scheduler: %s '%s' must be a finite time ≥ 0",
                            cm_sched_kind_name(c->kind), field, tstr(t, b));
    return CM_OK;
}

static cm_status check_num(const cm_sched_config *c, const char *field, double v) {
    if (!isfinite(v))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s scheduler: %s = %g must be finite", cm_sched_kind_name(c->kind),
                            field, v);
    return CM_OK;
}

#define TRY(x)                                                                                                    \
    do {                                                                                                          \
        cm_status st_ = (x);                                                                                      \
        if (st_ != CM_OK) return st_;                                                                             \
    } while (0)

static bool has_warmup(cm_sched_kind k) {
    return k == CM_SCHED_MULTISTEP_WITH_WARMUP || k == CM_SCHED_CONSTANT_WITH_WARMUP ||
           k == CM_SCHED_LINEAR_WITH_WARMUP || k == CM_SCHED_COSINE_ANNEALING_WITH_WARMUP ||
           k == CM_SCHED_POLYNOMIAL_WITH_WARMUP;
}

cm_status cm_sched_validate(const cm_sched_config *c) {
    if (!c) return cm_set_error(CM_ERR_INVALID_ARG, "scheduler: NULL config");
    if ((unsigned)c->kind >= CM_SCHED_KIND_COUNT)
        return cm_set_error(CM_ERR_INVALID_ARG, "scheduler: kind %d out of range", (int)c->kind);
    char b[CM_TIME_STR_MAX];
    const char *name = cm_sched_kind_name(c->kind);
    switch (c->kind) {
    case CM_SCHED_STEP:
        TRY(check_time(c, "step_size", c->step_size));
        if (cm_time_value(c->step_size) <= 0)
            return cm_set_error(CM_ERR_INVALID_ARG, "step scheduler: step_size '%s' must be > 0 (e.g. '10ep')",
                                tstr(c->step_size, b));
        TRY(check_num(c, "gamma", c->gamma));
        break;
    case CM_SCHED_MULTISTEP:
    case CM_SCHED_MULTISTEP_WITH_WARMUP:
        if (c->n_milestones < 0 || c->n_milestones > CM_SCHED_MAX_MILESTONES)
            return cm_set_error(CM_ERR_INVALID_ARG, "%s scheduler: n_milestones = %d must be in [0, %d]", name,
                                c->n_milestones, CM_SCHED_MAX_MILESTONES);
        for (int i = 0; i < c->n_milestones; i++) {
            char field[32];
            snprintf(field, sizeof field, "milestones[%d]", i);
            TRY(check_time(c, field, c->milestones[i]));
        }
        TRY(check_num(c, "gamma", c->gamma));
        break;
    case CM_SCHED_CONSTANT:
    case CM_SCHED_CONSTANT_WITH_WARMUP:
        TRY(check_time(c, "t_max", c->t_max));
        TRY(check_num(c, "alpha", c->alpha));
        break;
    case CM_SCHED_LINEAR:
    case CM_SCHED_LINEAR_WITH_WARMUP:
        TRY(check_time(c, "t_max", c->t_max));
        TRY(check_num(c, "alpha_i", c->alpha_i));
        TRY(check_num(c, "alpha_f", c->alpha_f));
        break;
    case CM_SCHED_EXPONENTIAL:
        TRY(check_time(c, "decay_period", c->decay_period));
        if (cm_time_value(c->decay_period) <= 0)
            return cm_set_error(CM_ERR_INVALID_ARG, "exponential scheduler: decay_period '%s' must be > 0",
                                tstr(c->decay_period, b));
        TRY(check_num(c, "gamma", c->gamma));
        break;
    case CM_SCHED_COSINE_ANNEALING:
    case CM_SCHED_COSINE_ANNEALING_WITH_WARMUP:
        TRY(check_time(c, "t_max", c->t_max));
        TRY(check_num(c, "alpha_f", c->alpha_f));
        break;
    case CM_SCHED_COSINE_ANNEALING_WARM_RESTARTS:
        TRY(check_time(c, "t_0", c->t_0));
        if (cm_time_value(c->t_0) <= 0)
            return cm_set_error(CM_ERR_INVALID_ARG,
                                "cosine_annealing_warm_restarts scheduler: t_0 '%s' must be > 0 (e.g. '10ep')",
                                tstr(c->t_0, b));
        if (!(c->t_mult > 0) || !isfinite(c->t_mult))
            return cm_set_error(CM_ERR_INVALID_ARG, "cosine_annealing_warm_restarts scheduler: t_mult = %g must be > 0",
                                c->t_mult);
        TRY(check_num(c, "alpha_f", c->alpha_f));
        break;
    case CM_SCHED_POLYNOMIAL:
    case CM_SCHED_POLYNOMIAL_WITH_WARMUP:
        TRY(check_time(c, "t_max", c->t_max));
        TRY(check_num(c, "power", c->power));
        TRY(check_num(c, "alpha_f", c->alpha_f));
        break;
    default: break;
    }
    if (has_warmup(c->kind)) TRY(check_time(c, "t_warmup", c->t_warmup));
    return CM_OK;
}

/* ⌊y⌋, except that y within 1e-9 relative below an integer counts as that integer (products such
 * as 0.29 · 100 = 28.999999999999996 mean 29). */
static int64_t floor_tol(double y) {
    double r = floor(y + 1e-9 * fmax(1.0, fabs(y)));
    return (int64_t)r;
}

/* Composer's _convert_time: a scheduler argument into ba (from ep / dur-of-ep) or the unit of
 * max_duration (from dur) or its own unit, scaled by `ssr` (dur is not: max_duration is). */
static cm_status convert(const cm_sched_config *c, const char *field, cm_time x, const cm_sched_clock *clk,
                         double ssr, cm_time *out) {
    char b[CM_TIME_STR_MAX], b2[CM_TIME_STR_MAX];
    const char *name = cm_sched_kind_name(c->kind);
    cm_time md = clk->max_duration;
    if (x.unit == CM_TIME_DURATION) {
        if (md.unit == CM_TIME_EPOCH) {
            if (clk->batches_per_epoch <= 0)
                return cm_set_error(CM_ERR_INVALID_ARG,
                                    "%s scheduler: %s '%s' of max_duration '%s' needs batches_per_epoch (the "
                                    "dataloader length), which is unknown",
                                    name, field, tstr(x, b), tstr(md, b2));
            *out = cm_time_make(floor_tol(x.frac * (double)clk->batches_per_epoch * (double)md.count), CM_TIME_BATCH);
            return CM_OK;
        }
        *out = cm_time_make(floor_tol(x.frac * (double)md.count), md.unit);
        return CM_OK;
    }
    if (x.unit == CM_TIME_EPOCH) {
        if (clk->batches_per_epoch <= 0)
            return cm_set_error(CM_ERR_INVALID_ARG,
                                "%s scheduler: %s '%s' in epochs needs batches_per_epoch (the dataloader length), "
                                "which is unknown",
                                name, field, tstr(x, b));
        x = cm_time_make(x.count * clk->batches_per_epoch, CM_TIME_BATCH);
    }
    *out = ssr == 1.0 ? x : cm_time_make(floor_tol((double)x.count * ssr), x.unit);
    return CM_OK;
}

/* The clock's time in `unit`, as a double. */
static double now_in(const cm_sched_clock *clk, cm_time_unit unit) {
    cm_time t;
    if (cm_timestamp_get(&clk->now, unit, &t) != CM_OK) return 0.0; /* unreachable: unit is never dur */
    return (double)t.count;
}

static double cosine_anneal(double x, double alpha_f) {
    x = fmin(fmax(x, 0.0), 1.0);
    return alpha_f + (1.0 - alpha_f) * (1.0 + cos(x * M_PI)) / 2.0;
}

static double frac_of(double t, double t_max) { return t_max > 0 ? fmin(1.0, t / t_max) : 1.0; }

static cm_status multistep(const cm_sched_config *c, const cm_sched_clock *clk, double *out) {
    double f = 1.0;
    for (int i = 0; i < c->n_milestones; i++) {
        cm_time m = {0};
        TRY(convert(c, "milestone", c->milestones[i], clk, clk->ssr, &m));
        if (now_in(clk, m.unit) >= (double)m.count) f *= c->gamma;
    }
    *out = f;
    return CM_OK;
}

static cm_status warm_restarts(const cm_sched_config *c, const cm_sched_clock *clk, double *out) {
    cm_time t0 = {0};
    TRY(convert(c, "t_0", c->t_0, clk, clk->ssr, &t0));
    double t = now_in(clk, t0.unit);
    int64_t len = t0.count, end = t0.count;
    while ((double)end <= t) {
        if (len == 0)
            return cm_set_error(CM_ERR_INVALID_ARG,
                                "cosine_annealing_warm_restarts scheduler: the restart interval decayed to 0 "
                                "(t_0 %" PRId64 "%s, t_mult %g); use t_mult ≥ 1 or a longer t_0",
                                t0.count, cm_time_unit_name(t0.unit), c->t_mult);
        int64_t next = floor_tol(c->t_mult * (double)len);
        if (next == len) { /* the cycle length no longer changes: jump over the remaining whole cycles */
            int64_t k = (int64_t)((t - (double)end) / (double)len) + 1;
            end += k * len;
            break;
        }
        len = next;
        end += len;
    }
    double start = (double)(end - len);
    *out = cosine_anneal(len > 0 ? (t - start) / (double)len : 1.0, c->alpha_f);
    return CM_OK;
}

/* The shared part of the warmup schedulers: is t inside the warmup (then *out is set), and the
 * post-warmup fraction τ_w otherwise. */
static cm_status warmup(const cm_sched_config *c, const cm_sched_clock *clk, double peak, bool need_t_max,
                        bool *in_warmup, double *tau_w, double *out) {
    char b[CM_TIME_STR_MAX], b2[CM_TIME_STR_MAX], b3[CM_TIME_STR_MAX];
    const char *name = cm_sched_kind_name(c->kind);
    cm_time tw = {0};
    TRY(convert(c, "t_warmup", c->t_warmup, clk, c->scale_warmup ? clk->ssr : 1.0, &tw));
    cm_time tm = tw;
    if (need_t_max) {
        TRY(convert(c, "t_max", c->t_max, clk, clk->ssr, &tm));
        if (tm.unit != tw.unit)
            return cm_set_error(CM_ERR_INVALID_ARG,
                                "%s scheduler: t_warmup '%s' and t_max '%s' convert to different units (%s vs %s); "
                                "give them in the same unit",
                                name, tstr(c->t_warmup, b), tstr(c->t_max, b2), cm_time_unit_name(tw.unit),
                                cm_time_unit_name(tm.unit));
        /* the schedule must cover the run (Composer's _raise_if_max_duration_exceeds_t_max) */
        cm_time md = clk->max_duration;
        if (md.unit == CM_TIME_EPOCH && tm.unit == CM_TIME_BATCH && clk->batches_per_epoch > 0)
            md = cm_time_make(md.count * clk->batches_per_epoch, CM_TIME_BATCH);
        if (md.unit == tm.unit && tm.count < md.count)
            return cm_set_error(CM_ERR_INVALID_ARG,
                                "%s scheduler: t_max '%s' (%s after conversion) is shorter than max_duration '%s'; "
                                "the schedule would end before training does (use t_max '1dur')",
                                name, tstr(c->t_max, b), tstr(tm, b2), tstr(clk->max_duration, b3));
    }
    double t = now_in(clk, tw.unit);
    if (t < (double)tw.count) {
        *in_warmup = true;
        *out = 0.0 + fmin(1.0, t / (double)tw.count) * (peak - 0.0);
        return CM_OK;
    }
    *in_warmup = false;
    double frac = tm.count > tw.count ? (t - (double)tw.count) / (double)(tm.count - tw.count) : 0.0;
    *tau_w = fmin(1.0, frac);
    return CM_OK;
}

cm_status cm_sched_multiplier(const cm_sched_config *c, const cm_sched_clock *clk, double *out) {
    TRY(cm_sched_validate(c));
    if (!clk || !out) return cm_set_error(CM_ERR_INVALID_ARG, "scheduler: NULL clock or output");
    char b[CM_TIME_STR_MAX];
    if (!(clk->ssr > 0) || !isfinite(clk->ssr))
        return cm_set_error(CM_ERR_INVALID_ARG, "scheduler: scale_schedule_ratio = %g must be > 0", clk->ssr);
    if ((unsigned)clk->max_duration.unit >= CM_TIME_UNIT_COUNT || clk->max_duration.unit == CM_TIME_DURATION)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "scheduler: max_duration '%s' must be in ep, ba, sp, tok, iter or sec, not a fraction",
                            tstr(clk->max_duration, b));

    double ssr = clk->ssr, a = 1.0;
    cm_time x = {0};
    switch (c->kind) {
    case CM_SCHED_STEP: {
        TRY(convert(c, "step_size", c->step_size, clk, ssr, &x));
        if (x.count <= 0)
            return cm_set_error(CM_ERR_INVALID_ARG, "step scheduler: step_size '%s' is 0 after conversion",
                                tstr(c->step_size, b));
        a = pow(c->gamma, floor(now_in(clk, x.unit) / (double)x.count));
        break;
    }
    case CM_SCHED_MULTISTEP: TRY(multistep(c, clk, &a)); break;
    case CM_SCHED_CONSTANT:
        TRY(convert(c, "t_max", c->t_max, clk, ssr, &x));
        a = now_in(clk, x.unit) < (double)x.count ? c->alpha : 1.0;
        break;
    case CM_SCHED_LINEAR:
        TRY(convert(c, "t_max", c->t_max, clk, ssr, &x));
        a = c->alpha_i + frac_of(now_in(clk, x.unit), (double)x.count) * (c->alpha_f - c->alpha_i);
        break;
    case CM_SCHED_EXPONENTIAL:
        TRY(convert(c, "decay_period", c->decay_period, clk, ssr, &x));
        if (x.count <= 0)
            return cm_set_error(CM_ERR_INVALID_ARG, "exponential scheduler: decay_period '%s' is 0 after conversion",
                                tstr(c->decay_period, b));
        a = pow(c->gamma, now_in(clk, x.unit) / (double)x.count);
        break;
    case CM_SCHED_COSINE_ANNEALING:
        TRY(convert(c, "t_max", c->t_max, clk, ssr, &x));
        a = cosine_anneal(frac_of(now_in(clk, x.unit), (double)x.count), c->alpha_f);
        break;
    case CM_SCHED_COSINE_ANNEALING_WARM_RESTARTS: TRY(warm_restarts(c, clk, &a)); break;
    case CM_SCHED_POLYNOMIAL: {
        TRY(convert(c, "t_max", c->t_max, clk, ssr, &x));
        double coeff = pow(1.0 - frac_of(now_in(clk, x.unit), (double)x.count), c->power);
        a = c->alpha_f + coeff * (1.0 - c->alpha_f);
        break;
    }
    case CM_SCHED_MULTISTEP_WITH_WARMUP: {
        bool in;
        double tau;
        TRY(warmup(c, clk, 1.0, false, &in, &tau, &a));
        if (!in) TRY(multistep(c, clk, &a));
        break;
    }
    case CM_SCHED_CONSTANT_WITH_WARMUP:
    case CM_SCHED_LINEAR_WITH_WARMUP: {
        bool constant = c->kind == CM_SCHED_CONSTANT_WITH_WARMUP;
        double ai = constant ? c->alpha : c->alpha_i, af = constant ? c->alpha : c->alpha_f;
        bool in;
        double tau;
        TRY(warmup(c, clk, ai, true, &in, &tau, &a));
        if (!in) a = ai + tau * (af - ai);
        break;
    }
    case CM_SCHED_COSINE_ANNEALING_WITH_WARMUP: {
        bool in;
        double tau;
        TRY(warmup(c, clk, 1.0, true, &in, &tau, &a));
        if (!in) a = cosine_anneal(tau, c->alpha_f);
        break;
    }
    case CM_SCHED_POLYNOMIAL_WITH_WARMUP: {
        bool in;
        double tau;
        TRY(warmup(c, clk, 1.0, true, &in, &tau, &a));
        if (!in) a = c->alpha_f + pow(1.0 - tau, c->power) * (1.0 - c->alpha_f);
        break;
    }
    default: return cm_set_error(CM_ERR_INVALID_ARG, "scheduler: kind %d out of range", (int)c->kind);
    }
    *out = a;
    return CM_OK;
}

cm_status cm_sched_multiplier_product(const cm_sched_config *cfgs, int n, const cm_sched_clock *clock, double *out) {
    if (n < 0 || (n > 0 && !cfgs) || !out)
        return cm_set_error(CM_ERR_INVALID_ARG, "schedulers: bad list (%d configs at %p)", n, (const void *)cfgs);
    double prod = 1.0;
    for (int i = 0; i < n; i++) {
        double a;
        cm_status st = cm_sched_multiplier(&cfgs[i], clock, &a);
        if (st != CM_OK) return cm_set_error(st, "scheduler %d of %d: %s", i, n, cm_last_error());
        prod *= a;
    }
    *out = prod;
    return CM_OK;
}
