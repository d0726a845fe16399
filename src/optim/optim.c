/* Optimizers over flat f32 spans: torch's SGD / Adam / AdamW and Composer's DecoupledSGDW /
 * DecoupledAdamW (update rules in include/composer/optim.h). Scalars are computed in double and
 * applied in f32, as torch does; the element loops are OpenMP-parallel over large spans and
 * vectorised. Spans in GPU memory (a model moved with cm_module_to_device) are updated there by the
 * backend's kernels, with the same formulas; their state lives on the GPU too. */
#include <composer/optim.h>

#include "tensor/backend.h"
#include "tensor/tensor_impl.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Spans shorter than this run on one thread: below it the fork/join costs more than it saves. */
#define PAR_MIN 32768
#define NAME_MAX_LEN 256

static const char *const kind_names[] = {
#define CM_X_(name, str) str,
    CM_OPTIM_KIND_LIST(CM_X_)
#undef CM_X_
};
_Static_assert(sizeof kind_names / sizeof kind_names[0] == CM_OPTIM_KIND_COUNT, "optimizer name table");

const char *cm_optim_kind_name(cm_optim_kind k) {
    return (unsigned)k < CM_OPTIM_KIND_COUNT ? kind_names[k] : "?";
}

cm_status cm_optim_kind_parse(const char *s, cm_optim_kind *out) {
    if (s)
        for (int k = 0; k < CM_OPTIM_KIND_COUNT; k++)
            if (strcasecmp(s, kind_names[k]) == 0) {
                *out = (cm_optim_kind)k;
                return CM_OK;
            }
    return cm_set_error(CM_ERR_INVALID_ARG,
                        "optimizer '%s': unknown (use sgd, decoupled_sgdw, adam, adamw or decoupled_adamw)",
                        s ? s : "(null)");
}

static bool is_sgd(cm_optim_kind k) { return k == CM_OPTIM_SGD || k == CM_OPTIM_DECOUPLED_SGDW; }

cm_optim_hparams cm_optim_hparams_default(cm_optim_kind kind) {
    cm_optim_hparams h;
    memset(&h, 0, sizeof h);
    h.beta1 = 0.9;
    h.beta2 = 0.999;
    h.eps = 1e-8;
    switch (kind) {
    case CM_OPTIM_SGD:
    case CM_OPTIM_DECOUPLED_SGDW: h.lr = NAN; break;
    case CM_OPTIM_ADAM: h.lr = 1e-3; break;
    case CM_OPTIM_ADAMW:
        h.lr = 1e-3;
        h.weight_decay = 1e-2;
        break;
    case CM_OPTIM_DECOUPLED_ADAMW:
        h.lr = 1e-3;
        h.beta2 = 0.95;
        h.weight_decay = 1e-5;
        break;
    default: break;
    }
    return h;
}

/* ---- the object ---- */

enum { E_STEP, E_MOM, E_EXP_AVG, E_EXP_AVG_SQ, E_MAX_EXP_AVG_SQ, E_COUNT };
static const char *const entry_keys[E_COUNT] = {"step", "momentum_buffer", "exp_avg", "exp_avg_sq",
                                                "max_exp_avg_sq"};

typedef struct span {
    char *name;
    float *param, *grad; /* borrowed, (n,) */
    int64_t n;
    int64_t step;
    float *buf[E_COUNT]; /* owned, (n,) or NULL; buf[E_STEP] unused */
    char *entry_name[E_COUNT];
    int64_t *excl;       /* (2·n_excl) sorted, disjoint element ranges [lo, hi) that steps skip */
    int n_excl, cap_excl;
    int64_t *asg;        /* (3·n_asg) sorted, disjoint (lo, hi, group) ranges stepped with another group's */
    int n_asg;           /* hyperparameters (cm_optim_assign) */
    int group;           /* the group the span was added to */
    cm_device device;    /* of param, grad and buf (found from the param pointer) */
} span;

typedef struct group {
    cm_optim_hparams hp;
    double initial_lr;
    int first, count; /* spans [first, first + count) */
} group;

struct cm_optim {
    cm_optim_kind kind;
    group *groups;
    int n_groups;
    span *spans;
    int n_spans;
    cm_optim_state_entry *entries;
    int n_entries;
};

cm_status cm_optim_new(cm_optim_kind kind, cm_optim **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "optimizer: NULL output");
    if ((unsigned)kind >= CM_OPTIM_KIND_COUNT)
        return cm_set_error(CM_ERR_INVALID_ARG, "optimizer: kind %d out of range", (int)kind);
    cm_optim *o = cm_alloc_zeroed(sizeof *o, 16);
    if (!o) return cm_last_status();
    o->kind = kind;
    *out = o;
    return CM_OK;
}

static void span_release(span *s) {
    cm_free(s->name);
    cm_free(s->excl);
    cm_free(s->asg);
    for (int e = 0; e < E_COUNT; e++) {
        cmi_dev_free(s->device, s->buf[e]);
        cm_free(s->entry_name[e]);
    }
}

void cm_optim_free(cm_optim *o) {
    if (!o) return;
    for (int i = 0; i < o->n_spans; i++) span_release(&o->spans[i]);
    cm_free(o->spans);
    cm_free(o->groups);
    cm_free(o->entries);
    cm_free(o);
}

cm_optim_kind cm_optim_get_kind(const cm_optim *o) { return o->kind; }
int cm_optim_n_groups(const cm_optim *o) { return o->n_groups; }

static cm_status check_hparams(cm_optim_kind kind, const cm_optim_hparams *h, const char *where) {
    const char *k = cm_optim_kind_name(kind);
    if (!h) return cm_set_error(CM_ERR_INVALID_ARG, "%s %s: NULL hyperparameters", k, where);
    if (isnan(h->lr))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s %s: lr is not set (%s needs an explicit learning rate, e.g. 0.1)",
                            k, where, k);
    if (!(h->lr >= 0) || !isfinite(h->lr))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s %s: lr = %g must be finite and ≥ 0", k, where, h->lr);
    if (!(h->weight_decay >= 0) || !isfinite(h->weight_decay))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s %s: weight_decay = %g must be finite and ≥ 0", k, where,
                            h->weight_decay);
    if (is_sgd(kind)) {
        if (!(h->momentum >= 0) || !isfinite(h->momentum))
            return cm_set_error(CM_ERR_INVALID_ARG, "%s %s: momentum = %g must be finite and ≥ 0", k, where,
                                h->momentum);
        if (!isfinite(h->dampening))
            return cm_set_error(CM_ERR_INVALID_ARG, "%s %s: dampening = %g must be finite", k, where, h->dampening);
        if (h->nesterov && (h->momentum <= 0 || h->dampening != 0))
            return cm_set_error(CM_ERR_INVALID_ARG,
                                "%s %s: nesterov needs momentum > 0 and dampening = 0 (got momentum %g, dampening %g)",
                                k, where, h->momentum, h->dampening);
    } else {
        if (!(h->beta1 >= 0 && h->beta1 < 1))
            return cm_set_error(CM_ERR_INVALID_ARG, "%s %s: beta1 = %g must be in [0, 1)", k, where, h->beta1);
        if (!(h->beta2 >= 0 && h->beta2 < 1))
            return cm_set_error(CM_ERR_INVALID_ARG, "%s %s: beta2 = %g must be in [0, 1)", k, where, h->beta2);
        if (!(h->eps >= 0) || !isfinite(h->eps))
            return cm_set_error(CM_ERR_INVALID_ARG, "%s %s: eps = %g must be finite and ≥ 0", k, where, h->eps);
    }
    return CM_OK;
}

static bool uses(cm_optim_kind kind, const cm_optim_hparams *h, int e) {
    switch (e) {
    case E_STEP: return true;
    case E_MOM: return is_sgd(kind) && h->momentum != 0;
    case E_EXP_AVG:
    case E_EXP_AVG_SQ: return !is_sgd(kind);
    case E_MAX_EXP_AVG_SQ: return !is_sgd(kind) && h->amsgrad;
    default: return false;
    }
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = cm_alloc(n, 16);
    if (d) memcpy(d, s, n);
    return d;
}

static cm_status rebuild_entries(cm_optim *o) {
    int n = 0;
    for (int i = 0; i < o->n_spans; i++)
        for (int e = 0; e < E_COUNT; e++) n += o->spans[i].entry_name[e] != NULL;
    cm_optim_state_entry *ent = cm_alloc_zeroed((size_t)(n > 0 ? n : 1) * sizeof *ent, 16);
    if (!ent) return cm_last_status();
    int j = 0;
    for (int i = 0; i < o->n_spans; i++) {
        span *s = &o->spans[i];
        for (int e = 0; e < E_COUNT; e++) {
            if (!s->entry_name[e]) continue;
            ent[j].name = s->entry_name[e];
            if (e == E_STEP) {
                ent[j].dtype = CM_DTYPE_I64;
                ent[j].data = &s->step;
                ent[j].numel = 1;
            } else {
                ent[j].dtype = CM_DTYPE_F32;
                ent[j].data = s->buf[e];
                ent[j].numel = s->n;
                ent[j].device = s->device;
            }
            j++;
        }
    }
    cm_free(o->entries);
    o->entries = ent;
    o->n_entries = n;
    return CM_OK;
}

static bool name_taken(const cm_optim *o, const span *fresh, int n_fresh, const char *name) {
    for (int i = 0; i < o->n_spans; i++)
        if (strcmp(o->spans[i].name, name) == 0) return true;
    for (int i = 0; i < n_fresh; i++)
        if (strcmp(fresh[i].name, name) == 0) return true;
    return false;
}

cm_status cm_optim_add_group(cm_optim *o, const cm_optim_hparams *hp, const cm_optim_span *spans, int n_spans) {
    if (!o) return cm_set_error(CM_ERR_INVALID_ARG, "optimizer add_group: NULL optimizer");
    char where[64];
    snprintf(where, sizeof where, "group %d", o->n_groups);
    cm_status st = check_hparams(o->kind, hp, where);
    if (st != CM_OK) return st;
    if (n_spans < 0 || (n_spans > 0 && !spans))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s %s: bad span list (%d spans at %p)", cm_optim_kind_name(o->kind),
                            where, n_spans, (const void *)spans);
    for (int i = 0; i < n_spans; i++) {
        const cm_optim_span *sp = &spans[i];
        if (sp->n < 0 || (sp->n > 0 && !sp->param))
            return cm_set_error(CM_ERR_INVALID_ARG, "%s %s: span %d ('%s'): %s", cm_optim_kind_name(o->kind), where, i,
                                sp->name ? sp->name : "", sp->n < 0 ? "negative length" : "NULL param buffer");
        if (sp->name && (strlen(sp->name) == 0 || strlen(sp->name) > NAME_MAX_LEN))
            return cm_set_error(CM_ERR_INVALID_ARG, "%s %s: span %d: name must be 1 to %d characters",
                                cm_optim_kind_name(o->kind), where, i, NAME_MAX_LEN);
    }

    span *all = cm_alloc_zeroed((size_t)(o->n_spans + n_spans + 1) * sizeof *all, 16);
    group *groups = cm_alloc_zeroed((size_t)(o->n_groups + 1) * sizeof *groups, 16);
    if (!all || !groups) {
        cm_free(all);
        cm_free(groups);
        return CM_ERR_OOM;
    }
    span *fresh = all + o->n_spans;
    int made = 0;
    st = CM_OK;
    for (; made < n_spans; made++) {
        const cm_optim_span *sp = &spans[made];
        span *s = &fresh[made];
        char buf[NAME_MAX_LEN + 32];
        if (sp->name) snprintf(buf, sizeof buf, "%s", sp->name);
        else snprintf(buf, sizeof buf, "span%d", o->n_spans + made);
        if (name_taken(o, fresh, made, buf)) {
            st = cm_set_error(CM_ERR_INVALID_ARG,
                              "%s %s: span name '%s' is already used (names key the optimizer state; make them "
                              "unique)",
                              cm_optim_kind_name(o->kind), where, buf);
            break;
        }
        s->name = dup_str(buf);
        if (!s->name) {
            st = CM_ERR_OOM;
            break;
        }
        s->param = sp->param;
        s->group = o->n_groups;
        s->grad = sp->grad;
        s->n = sp->n;
        s->device = cmi_ptr_device(sp->param);
        if (sp->grad && cmi_ptr_device(sp->grad) != s->device) {
            st = cm_set_error(CM_ERR_INVALID_ARG, "%s %s: span '%s' has its parameters on %s and its gradients on %s",
                              cm_optim_kind_name(o->kind), where, buf, cm_device_name(s->device),
                              cm_device_name(cmi_ptr_device(sp->grad)));
            made++;
            break;
        }
        for (int e = 0; e < E_COUNT && st == CM_OK; e++) {
            if (!uses(o->kind, hp, e)) continue;
            char key[sizeof buf + 32];
            snprintf(key, sizeof key, "%s.%s", buf, entry_keys[e]);
            s->entry_name[e] = dup_str(key);
            if (!s->entry_name[e]) st = CM_ERR_OOM;
            if (e != E_STEP && s->n > 0 && st == CM_OK) {
                s->buf[e] = cmi_dev_alloc(s->device, (size_t)s->n * sizeof(float), true);
                if (!s->buf[e]) st = cm_last_status() ? cm_last_status() : CM_ERR_OOM;
            }
        }
        if (st != CM_OK) {
            made++; /* release this one too */
            break;
        }
    }
    if (st != CM_OK) {
        for (int i = 0; i < made; i++) span_release(&fresh[i]);
        cm_free(all);
        cm_free(groups);
        return st;
    }
    if (o->n_spans) memcpy(all, o->spans, (size_t)o->n_spans * sizeof *all);
    if (o->n_groups) memcpy(groups, o->groups, (size_t)o->n_groups * sizeof *groups);
    group *g = &groups[o->n_groups];
    g->hp = *hp;
    g->initial_lr = hp->lr;
    g->first = o->n_spans;
    g->count = n_spans;

    span *old_spans = o->spans;
    group *old_groups = o->groups;
    int old_n_spans = o->n_spans, old_n_groups = o->n_groups;
    o->spans = all;
    o->groups = groups;
    o->n_spans += n_spans;
    o->n_groups += 1;
    st = rebuild_entries(o);
    if (st != CM_OK) { /* roll back */
        for (int i = 0; i < n_spans; i++) span_release(&fresh[i]);
        o->spans = old_spans;
        o->groups = old_groups;
        o->n_spans = old_n_spans;
        o->n_groups = old_n_groups;
        cm_free(all);
        cm_free(groups);
        return st;
    }
    cm_free(old_spans);
    cm_free(old_groups);
    return CM_OK;
}

cm_status cm_optim_group_get(const cm_optim *o, int g, cm_optim_hparams *out) {
    if (!o || g < 0 || g >= o->n_groups)
        return cm_set_error(CM_ERR_INVALID_ARG, "optimizer: group %d out of range (%d groups)", g,
                            o ? o->n_groups : 0);
    *out = o->groups[g].hp;
    return CM_OK;
}

cm_status cm_optim_group_set(cm_optim *o, int g, const cm_optim_hparams *hp) {
    if (!o || g < 0 || g >= o->n_groups)
        return cm_set_error(CM_ERR_INVALID_ARG, "optimizer: group %d out of range (%d groups)", g,
                            o ? o->n_groups : 0);
    char where[64];
    snprintf(where, sizeof where, "group %d", g);
    cm_status st = check_hparams(o->kind, hp, where);
    if (st != CM_OK) return st;
    const cm_optim_hparams *cur = &o->groups[g].hp;
    for (int e = 0; e < E_COUNT; e++)
        if (uses(o->kind, cur, e) != uses(o->kind, hp, e))
            return cm_set_error(CM_ERR_INVALID_ARG,
                                "%s %s: the change would %s the '%s' state (momentum between 0 and non-0, or amsgrad); "
                                "create a new optimizer instead",
                                cm_optim_kind_name(o->kind), where, uses(o->kind, hp, e) ? "add" : "drop",
                                entry_keys[e]);
    o->groups[g].hp = *hp;
    return CM_OK;
}

/* ---- kernels ----
 * Each kernel is an always-inline loop over [lo, hi) whose flags are compile-time constants at
 * every call site (the dispatchers expand the combinations), so each variant is a branch-free
 * vector loop. Threads split a span into contiguous, 16-element-aligned ranges. */

typedef struct sgd_args {
    float *p, *b;
    const float *g;
    float l2, mom, one_minus_damp, keep, neg_lr;
} sgd_args;

/* d = g + l2·p; momentum buffer b (b = d when `first`); p = p·keep - lr·d. */
static inline __attribute__((always_inline)) void sgd_range(const sgd_args *a, int64_t lo, int64_t hi, bool has_mom,
                                                            bool first, bool nesterov, bool decay, bool l2) {
    float *restrict p = a->p, *restrict b = a->b;
    const float *restrict g = a->g;
    const float wd = a->l2, mom = a->mom, omd = a->one_minus_damp, keep = a->keep, neg_lr = a->neg_lr;
#pragma omp simd
    for (int64_t i = lo; i < hi; i++) {
        float pi = p[i];
        float d = g[i];
        if (l2) d = d + wd * pi;
        if (has_mom) {
            float bi = first ? d : b[i] * mom + omd * d;
            b[i] = bi;
            d = nesterov ? d + mom * bi : bi;
        }
        if (decay) pi = pi * keep;
        p[i] = pi + neg_lr * d;
    }
}

static void sgd_dispatch(const sgd_args *a, int64_t lo, int64_t hi, bool has_mom, bool first, bool nesterov,
                         bool decay, bool l2) {
    int code = (has_mom ? 1 : 0) | (first ? 2 : 0) | (nesterov ? 4 : 0) | (decay ? 8 : 0) | (l2 ? 16 : 0);
    switch (code) {
#define CASE_(c) \
    case c: sgd_range(a, lo, hi, (c)&1, ((c) >> 1) & 1, ((c) >> 2) & 1, ((c) >> 3) & 1, ((c) >> 4) & 1); break;
#define CASE4_(c) CASE_(c) CASE_(c + 1) CASE_(c + 2) CASE_(c + 3)
        CASE4_(0) CASE4_(4) CASE4_(8) CASE4_(12) CASE4_(16) CASE4_(20) CASE4_(24) CASE4_(28)
#undef CASE4_
#undef CASE_
    default: break;
    }
}

typedef struct adam_args {
    float *p, *m, *v, *vmax;
    const float *g;
    float keep, l2, b1, omb1, b2, omb2, neg_step, bc2_sqrt, eps;
} adam_args;

/* keep: decoupled decay factor applied to p first; l2: Adam's decay added to the gradient. */
static inline __attribute__((always_inline)) void adam_range(const adam_args *a, int64_t lo, int64_t hi, bool decay,
                                                             bool l2, bool amsgrad) {
    float *restrict p = a->p, *restrict m = a->m, *restrict v = a->v, *restrict vmax = a->vmax;
    const float *restrict g = a->g;
    const float keep = a->keep, wd = a->l2, b1 = a->b1, omb1 = a->omb1, b2 = a->b2, omb2 = a->omb2;
    const float neg_step = a->neg_step, bc2_sqrt = a->bc2_sqrt, eps = a->eps;
#pragma omp simd
    for (int64_t i = lo; i < hi; i++) {
        float pi = p[i];
        float gi = g[i];
        if (l2) gi = gi + wd * pi;
        if (decay) pi = pi * keep;
        float mi = m[i] * b1 + omb1 * gi;
        float vi = v[i] * b2 + omb2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float vd = vi;
        if (amsgrad) {
            vd = fmaxf(vmax[i], vi);
            vmax[i] = vd;
        }
        float denom = sqrtf(vd) / bc2_sqrt + eps;
        p[i] = pi + neg_step * (mi / denom);
    }
}

static void adam_dispatch(const adam_args *a, int64_t lo, int64_t hi, bool decay, bool l2, bool amsgrad) {
    switch ((decay ? 1 : 0) | (l2 ? 2 : 0) | (amsgrad ? 4 : 0)) {
    case 0: adam_range(a, lo, hi, false, false, false); break;
    case 1: adam_range(a, lo, hi, true, false, false); break;
    case 2: adam_range(a, lo, hi, false, true, false); break;
    case 3: adam_range(a, lo, hi, true, true, false); break;
    case 4: adam_range(a, lo, hi, false, false, true); break;
    case 5: adam_range(a, lo, hi, true, false, true); break;
    case 6: adam_range(a, lo, hi, false, true, true); break;
    default: adam_range(a, lo, hi, true, true, true); break;
    }
}

/* This thread's share [lo, hi) of n elements, in 16-element (64-byte) aligned pieces. */
static void thread_range(int64_t n, int64_t *lo, int64_t *hi) {
    int nt = omp_get_num_threads(), t = omp_get_thread_num();
    int64_t blocks = (n + 15) / 16, per = blocks / nt, extra = blocks % nt;
    int64_t b0 = t * per + (t < extra ? t : extra), b1 = b0 + per + (t < extra ? 1 : 0);
    *lo = b0 * 16 < n ? b0 * 16 : n;
    *hi = b1 * 16 < n ? b1 * 16 : n;
}

/* One step over elements [b0, b1) of span s with group gr's hyperparameters. */
static cm_status step_sgd(cm_optim_kind kind, const group *gr, span *s, double lr, int64_t b0, int64_t b1) {
    const cm_optim_hparams *h = &gr->hp;
    bool decoupled = kind == CM_OPTIM_DECOUPLED_SGDW && h->weight_decay != 0;
    bool l2 = kind == CM_OPTIM_SGD && h->weight_decay != 0;
    double decay_factor = gr->initial_lr != 0 ? lr / gr->initial_lr : 1.0;
    sgd_args a = {s->param, s->buf[E_MOM], s->grad, (float)h->weight_decay, (float)h->momentum,
                  (float)(1.0 - h->dampening), decoupled ? (float)(1.0 - decay_factor * h->weight_decay) : 1.0f,
                  (float)-lr};
    bool has_mom = h->momentum != 0, first = s->step == 0, nesterov = has_mom && h->nesterov;
    const int64_t n = b1 - b0;
    if (s->device != CM_DEVICE_CPU) {
        const cmi_sgd_args d = {a.p + b0, a.b ? a.b + b0 : NULL, a.g + b0, n, a.l2, a.mom, a.one_minus_damp,
                                a.keep, a.neg_lr, has_mom, first, nesterov, decoupled, l2};
        return cmi_backend_get(s->device)->sgd_step(&d);
    }
#pragma omp parallel if (n >= PAR_MIN)
    {
        int64_t lo, hi;
        thread_range(n, &lo, &hi);
        sgd_dispatch(&a, b0 + lo, b0 + hi, has_mom, first, nesterov, decoupled, l2);
    }
    return CM_OK;
}

static cm_status step_adam(cm_optim_kind kind, const group *gr, span *s, double lr, int64_t b0, int64_t b1) {
    const cm_optim_hparams *h = &gr->hp;
    double t = (double)s->step; /* already incremented */
    double bc1 = 1.0 - pow(h->beta1, t), bc2 = 1.0 - pow(h->beta2, t);
    double step_size = lr / bc1, bc2_sqrt = sqrt(bc2);
    bool decay = false, l2 = false;
    double keep = 1.0;
    if (kind == CM_OPTIM_ADAM) {
        l2 = h->weight_decay != 0;
    } else if (kind == CM_OPTIM_ADAMW) {
        decay = h->weight_decay != 0;
        keep = 1.0 - lr * h->weight_decay;
    } else {
        decay = h->weight_decay != 0;
        double decay_factor = gr->initial_lr != 0 ? lr / gr->initial_lr : 1.0;
        keep = 1.0 - decay_factor * h->weight_decay;
    }
    adam_args a = {s->param,
                   s->buf[E_EXP_AVG],
                   s->buf[E_EXP_AVG_SQ],
                   s->buf[E_MAX_EXP_AVG_SQ],
                   s->grad,
                   (float)keep,
                   (float)h->weight_decay,
                   (float)h->beta1,
                   (float)(1.0 - h->beta1),
                   (float)h->beta2,
                   (float)(1.0 - h->beta2),
                   (float)-step_size,
                   (float)bc2_sqrt,
                   (float)h->eps};
    bool ams = h->amsgrad;
    const int64_t n = b1 - b0;
    if (s->device != CM_DEVICE_CPU) {
        const cmi_adam_args d = {a.p + b0, a.m + b0, a.v + b0, a.vmax ? a.vmax + b0 : NULL, a.g + b0, n, a.keep,
                                 a.l2, a.b1, a.omb1, a.b2, a.omb2, a.neg_step, a.bc2_sqrt, a.eps, decay, l2, ams};
        return cmi_backend_get(s->device)->adam_step(&d);
    }
#pragma omp parallel if (n >= PAR_MIN)
    {
        int64_t lo, hi;
        thread_range(n, &lo, &hi);
        adam_dispatch(&a, b0 + lo, b0 + hi, decay, l2, ams);
    }
    return CM_OK;
}

/* One step of span s: the span minus its excluded ranges, piece by piece, each piece with the
 * hyperparameters of the group it is assigned to (elementwise updates: the split changes
 * nothing else). The caller advances the step count. */
static cm_status step_span(const cm_optim *o, span *s, double lr_multiplier) {
    int a = 0; /* the first assignment that may overlap what is left */
    for (int r = 0; r <= s->n_excl; r++) {
        const int64_t b0 = r == 0 ? 0 : s->excl[2 * r - 1], b1 = r < s->n_excl ? s->excl[2 * r] : s->n;
        for (int64_t pos = b0; pos < b1;) {
            while (a < s->n_asg && s->asg[3 * a + 1] <= pos) a++;
            int g = s->group;
            int64_t end = b1;
            if (a < s->n_asg && s->asg[3 * a] <= pos) {
                g = (int)s->asg[3 * a + 2];
                end = s->asg[3 * a + 1] < b1 ? s->asg[3 * a + 1] : b1;
            } else if (a < s->n_asg && s->asg[3 * a] < b1) {
                end = s->asg[3 * a];
            }
            const group *gr = &o->groups[g];
            const double lr = gr->hp.lr * lr_multiplier;
            const cm_status st = is_sgd(o->kind) ? step_sgd(o->kind, gr, s, lr, pos, end)
                                                 : step_adam(o->kind, gr, s, lr, pos, end);
            if (st) return st;
            pos = end;
        }
    }
    return CM_OK;
}

cm_status cm_optim_step(cm_optim *o, double lr_multiplier) {
    if (!o) return cm_set_error(CM_ERR_INVALID_ARG, "optimizer step: NULL optimizer");
    if (!(lr_multiplier >= 0) || !isfinite(lr_multiplier))
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "%s step: learning-rate multiplier %g must be finite and ≥ 0 (check the schedulers)",
                            cm_optim_kind_name(o->kind), lr_multiplier);
    for (int si = 0; si < o->n_spans; si++) { /* spans are stored group by group */
        span *s = &o->spans[si];
        if (!s->grad) continue;
        cm_status st;
        if (is_sgd(o->kind)) { /* SGD reads the count before it advances (first step: b = d) */
            st = step_span(o, s, lr_multiplier);
            s->step++;
        } else {
            s->step++;
            st = step_span(o, s, lr_multiplier);
        }
        if (st) return st;
    }
    return CM_OK;
}

static span *span_holding(cm_optim *o, const float *param, int64_t n) {
    for (int i = 0; i < o->n_spans; i++)
        if (o->spans[i].param && param >= o->spans[i].param && param + n <= o->spans[i].param + o->spans[i].n)
            return &o->spans[i];
    return NULL;
}

cm_status cm_optim_exclude(cm_optim *o, const float *param, int64_t n) {
    if (!o || (!param && n > 0) || n < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "optimizer exclude: NULL optimizer or parameters, or n %lld < 0",
                            (long long)n);
    if (n == 0) return CM_OK;
    span *sp = span_holding(o, param, n);
    if (!sp)
        return cm_set_error(CM_ERR_NOT_FOUND, "%s: no span holds the %lld parameters to exclude (they must lie in one "
                                              "span's buffer)", cm_optim_kind_name(o->kind), (long long)n);
    int64_t lo = param - sp->param, hi = lo + n;
    /* merge [lo, hi) into the sorted, disjoint list */
    int64_t *nx = cm_alloc(sizeof(int64_t) * 2 * (size_t)(sp->n_excl + 1), 16);
    if (!nx) return cm_set_error(CM_ERR_OOM, "optimizer exclude: out of memory");
    int m = 0;
    bool placed = false;
    for (int r = 0; r < sp->n_excl; r++) {
        const int64_t a = sp->excl[2 * r], b = sp->excl[2 * r + 1];
        if (b < lo) {
            nx[2 * m] = a, nx[2 * m + 1] = b, m++;
        } else if (a > hi) {
            if (!placed) nx[2 * m] = lo, nx[2 * m + 1] = hi, m++, placed = true;
            nx[2 * m] = a, nx[2 * m + 1] = b, m++;
        } else { /* overlapping or touching: absorb */
            lo = a < lo ? a : lo;
            hi = b > hi ? b : hi;
        }
    }
    if (!placed) nx[2 * m] = lo, nx[2 * m + 1] = hi, m++;
    cm_free(sp->excl);
    sp->excl = nx, sp->n_excl = m, sp->cap_excl = m;
    return CM_OK;
}

cm_status cm_optim_assign(cm_optim *o, int g, const float *param, int64_t n) {
    if (!o || (!param && n > 0) || n < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "optimizer assign: NULL optimizer or parameters, or n %lld < 0",
                            (long long)n);
    if (g < 0 || g >= o->n_groups)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s assign: group %d out of range (%d groups)",
                            cm_optim_kind_name(o->kind), g, o->n_groups);
    if (n == 0) return CM_OK;
    span *sp = span_holding(o, param, n);
    if (!sp)
        return cm_set_error(CM_ERR_NOT_FOUND, "%s: no span holds the %lld parameters to assign to group %d (they must "
                                              "lie in one span's buffer)", cm_optim_kind_name(o->kind), (long long)n, g);
    for (int e = 0; e < E_COUNT; e++)
        if (uses(o->kind, &o->groups[g].hp, e) != uses(o->kind, &o->groups[sp->group].hp, e))
            return cm_set_error(CM_ERR_INVALID_ARG,
                                "%s assign: group %d %s '%s' state and group %d (of span '%s') %s (momentum 0 against "
                                "non-0, or amsgrad on against off): give both groups the same",
                                cm_optim_kind_name(o->kind), g, uses(o->kind, &o->groups[g].hp, e) ? "keeps" : "has no",
                                entry_keys[e], sp->group, sp->name, uses(o->kind, &o->groups[g].hp, e) ? "does not" : "does");
    const int64_t lo = param - sp->param, hi = lo + n;
    /* the list without [lo, hi) (a range around it splits in two), then [lo, hi) itself */
    int64_t *nx = cm_alloc(sizeof(int64_t) * 3 * (size_t)(sp->n_asg + 2), 16);
    if (!nx) return cm_set_error(CM_ERR_OOM, "optimizer assign: out of memory");
    int m = 0;
    bool placed = false;
    for (int r = 0; r <= sp->n_asg; r++) {
        const bool end = r == sp->n_asg;
        const int64_t a = end ? INT64_MAX : sp->asg[3 * r], b = end ? INT64_MAX : sp->asg[3 * r + 1],
                      rg = end ? 0 : sp->asg[3 * r + 2];
        if (!end && a < lo) { /* the part left of lo */
            nx[3 * m] = a, nx[3 * m + 1] = b < lo ? b : lo, nx[3 * m + 2] = rg, m++;
        }
        if (!placed && (a >= lo || b > lo)) { /* the first range that reaches past lo */
            if (g != sp->group) nx[3 * m] = lo, nx[3 * m + 1] = hi, nx[3 * m + 2] = g, m++;
            placed = true;
        }
        if (!end && b > hi) { /* the part right of hi */
            nx[3 * m] = a > hi ? a : hi, nx[3 * m + 1] = b, nx[3 * m + 2] = rg, m++;
        }
    }
    /* neighbours in the same group become one range: one loop (one kernel launch) instead of one
     * per parameter when whole units are assigned parameter by parameter */
    int k = 0;
    for (int r = 0; r < m; r++) {
        if (k > 0 && nx[3 * (k - 1) + 1] == nx[3 * r] && nx[3 * (k - 1) + 2] == nx[3 * r + 2]) {
            nx[3 * (k - 1) + 1] = nx[3 * r + 1];
            continue;
        }
        if (k != r) nx[3 * k] = nx[3 * r], nx[3 * k + 1] = nx[3 * r + 1], nx[3 * k + 2] = nx[3 * r + 2];
        k++;
    }
    cm_free(sp->asg);
    sp->asg = nx, sp->n_asg = k;
    return CM_OK;
}

int64_t cm_optim_n_assigned(const cm_optim *o) {
    int64_t n = 0;
    for (int i = 0; o && i < o->n_spans; i++)
        for (int r = 0; r < o->spans[i].n_asg; r++) n += o->spans[i].asg[3 * r + 1] - o->spans[i].asg[3 * r];
    return n;
}

int64_t cm_optim_n_excluded(const cm_optim *o) {
    int64_t n = 0;
    for (int i = 0; o && i < o->n_spans; i++)
        for (int r = 0; r < o->spans[i].n_excl; r++) n += o->spans[i].excl[2 * r + 1] - o->spans[i].excl[2 * r];
    return n;
}

void cm_optim_zero_grad(cm_optim *o) {
    if (!o) return;
    for (int i = 0; i < o->n_spans; i++) {
        span *s = &o->spans[i];
        if (!s->grad || s->n == 0) continue;
        float *g = s->grad;
        int64_t n = s->n;
        if (s->device != CM_DEVICE_CPU) {
            cmi_dev_memset(s->device, g, 0, (size_t)n * sizeof(float));
            continue;
        }
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
        for (int64_t j = 0; j < n; j++) g[j] = 0.0f;
    }
}

int cm_optim_n_state(const cm_optim *o) { return o ? o->n_entries : 0; }

cm_status cm_optim_state_get(const cm_optim *o, int i, cm_optim_state_entry *out) {
    if (!o || !out || i < 0 || i >= o->n_entries)
        return cm_set_error(CM_ERR_INVALID_ARG, "optimizer state: entry %d out of range (%d entries)", i,
                            o ? o->n_entries : 0);
    *out = o->entries[i];
    return CM_OK;
}

cm_status cm_optim_state_find(const cm_optim *o, const char *name, cm_optim_state_entry *out) {
    if (!o || !name || !out) return cm_set_error(CM_ERR_INVALID_ARG, "optimizer state: NULL argument");
    for (int i = 0; i < o->n_entries; i++)
        if (strcmp(o->entries[i].name, name) == 0) {
            *out = o->entries[i];
            return CM_OK;
        }
    return cm_set_error(CM_ERR_NOT_FOUND, "%s state: no entry '%s' (entries are '<span>.step', '<span>.exp_avg', ...)",
                        cm_optim_kind_name(o->kind), name);
}
