/* The optimizer section of a training config: the optimizer's hyperparameters and llm-foundry's
 * two keys over parameter names —
 *   disable_grad: REGEX | [REGEX, ...]   parameters whose name re.search-matches one are frozen
 *                                        (requires_grad false, and left out of the optimizer: no
 *                                        update and no weight decay, as torch skips a parameter
 *                                        without a gradient);
 *   param_groups: [{param_str_match: REGEX, lr, weight_decay, betas, eps, ...}, ...]
 *                                        each parameter whose name matches goes to the first group
 *                                        that matches it, with that group's hyperparameters (the
 *                                        keys it does not give are the optimizer's); the rest stay
 *                                        in the default group, as llm-foundry's build_optimizer
 *                                        inserts it at index 0.
 * Patterns are POSIX extended regular expressions (with GNU's \w \s \b) searched anywhere in the
 * dotted Hugging Face style name ("bert.encoder.layer.0.attention.self.query.weight"), which
 * covers what these keys are used for; Python-only syntax (\d and other escapes, lazy quantifiers,
 * (?:...) and look-arounds) is an error naming the fix, never read as something else. A
 * pattern that matches no parameter is announced, as llm-foundry warns. Groups change how
 * elements of the flat unit buffers are stepped (cm_optim_assign), not the optimizer state's
 * layout, so checkpoints stay elastic and resumable with or without them. */
#include "cli.h"

#include <regex.h>
#include <stdio.h>
#include <string.h>

#define TRY(call)                   \
    do {                            \
        cm_status s_ = (call);      \
        if (s_ != CM_OK) return s_; \
    } while (0)

#define bad(c, key, ...) cli_key_error(c, key, CM_ERR_INVALID_ARG, __VA_ARGS__)

static const char *const kind_names[] = {
#define CM_X_(name, str) str,
    CM_OPTIM_KIND_LIST(CM_X_)
#undef CM_X_
};

static bool is_sgd(cm_optim_kind k) { return k == CM_OPTIM_SGD || k == CM_OPTIM_DECOUPLED_SGDW; }

/* The hyperparameters under `prefix`, each defaulting to def's. */
static cm_status read_hparams(cm_config *c, const char *prefix, cm_optim_kind kind, const cm_optim_hparams *def,
                              cm_optim_hparams *out) {
    char k[320];
    cm_optim_hparams hp = *def;
#define KEY(name) (snprintf(k, sizeof k, "%s.%s", prefix, name), k)
    TRY(cm_config_get_double(c, KEY("lr"), hp.lr, &hp.lr));
    TRY(cm_config_get_double(c, KEY("weight_decay"), hp.weight_decay, &hp.weight_decay));
    if (is_sgd(kind)) {
        TRY(cm_config_get_double(c, KEY("momentum"), hp.momentum, &hp.momentum));
        TRY(cm_config_get_double(c, KEY("dampening"), hp.dampening, &hp.dampening));
        TRY(cm_config_get_bool(c, KEY("nesterov"), hp.nesterov, &hp.nesterov));
    } else {
        double betas[2], d[2] = {hp.beta1, hp.beta2};
        int n;
        TRY(cm_config_get_doubles(c, KEY("betas"), d, 2, betas, 2, &n));
        if (n != 2) return bad(c, k, "needs 2 values ([0.9, 0.95]), got %d", n);
        hp.beta1 = betas[0], hp.beta2 = betas[1];
        TRY(cm_config_get_double(c, KEY("eps"), hp.eps, &hp.eps));
        TRY(cm_config_get_bool(c, KEY("amsgrad"), hp.amsgrad, &hp.amsgrad));
    }
#undef KEY
    *out = hp;
    return CM_OK;
}

static cm_status compile(cm_config *c, const char *key, const char *pattern, regex_t *re) {
    /* glibc reads an escape it does not know (Python's \d, \A, \Z) as the letter itself: refuse
     * those rather than match something else than the user's re.search would */
    for (const char *p = pattern; *p; p++) {
        if (*p != '\\') continue;
        const char x = p[1];
        if (x && ((x >= 'a' && x <= 'z') || (x >= 'A' && x <= 'Z')) && !strchr("wWsSbB", x))
            return bad(c, key, "'%s': \\%c is Python regex syntax this build does not read (POSIX extended; GNU "
                               "adds \\w \\s \\b): %s",
                       pattern, x, x == 'd' ? "write [0-9]" : x == 'D' ? "write [^0-9]" : "rewrite it without");
        if (x) p++;
    }
    /* a lazy quantifier reads as an optional group there ('a+?' as '(a+)?'), which matches more */
    for (const char *q = "*?+???}?"; *q; q += 2)
        if (strstr(pattern, (char[3]){q[0], q[1], 0}))
            return bad(c, key, "'%s': the lazy quantifier %c? is Python regex syntax this build does not read (POSIX "
                               "extended): drop the '?' (a search matches the same names either way)",
                       pattern, q[0]);
    const int e = regcomp(re, pattern, REG_EXTENDED | REG_NOSUB);
    if (e == 0) return CM_OK;
    char why[256];
    regerror(e, re, why, sizeof why);
    regfree(re);
    return bad(c, key, "'%s' is not a regular expression this build reads (%s; POSIX extended syntax: use [0-9] "
                       "for \\d)",
               pattern, why);
}

void cli_optim_free(cli_optim *o) {
    if (!o) return;
    for (int i = 0; i < o->n_groups; i++) regfree(&o->groups[i].re);
    for (int i = 0; i < o->n_disable; i++) regfree(&o->disable[i].re);
    cm_free(o->groups);
    cm_free(o->disable);
    memset(o, 0, sizeof *o);
}

/* An absent or null key: marked read, nothing to do. */
static bool absent(cm_config *c, const char *key) {
    const cm_config_kind k = cm_config_kind_of(c, key);
    if (k != CM_CONFIG_ABSENT && k != CM_CONFIG_NULL) return false;
    cm_config_touch(c, key);
    return true;
}

/* disable_grad: one pattern or a list of them. */
static cm_status read_disable(cm_config *c, cli_optim *o) {
    const char *key = "optimizer.disable_grad";
    if (absent(c, key)) return CM_OK;
    const cm_config_kind k = cm_config_kind_of(c, key);
    const int n = k == CM_CONFIG_SEQ ? cm_config_len(c, key) : 1;
    if (k == CM_CONFIG_MAP) return bad(c, key, "expected a regular expression or a list of them (disable_grad: [norm, bias])");
    o->disable = cm_alloc_zeroed(sizeof *o->disable * (size_t)(n ? n : 1), 16);
    if (!o->disable) return CM_ERR_OOM;
    cm_config_mark_read(c, key);
    for (int i = 0; i < n; i++) {
        char e[96];
        if (k == CM_CONFIG_SEQ) snprintf(e, sizeof e, "%s.%d", key, i);
        else snprintf(e, sizeof e, "%s", key);
        if (cm_config_kind_of(c, e) != CM_CONFIG_SCALAR) return bad(c, e, "expected a regular expression");
        TRY(cm_config_get_string(c, e, NULL, &o->disable[i].pattern));
        snprintf(o->disable[i].key, sizeof o->disable[i].key, "%s", e);
        TRY(compile(c, e, o->disable[i].pattern, &o->disable[i].re));
        o->n_disable = i + 1;
    }
    return CM_OK;
}

static cm_status read_groups(cm_config *c, cli_optim *o) {
    const char *key = "optimizer.param_groups";
    if (absent(c, key)) return CM_OK;
    const cm_config_kind k = cm_config_kind_of(c, key);
    if (k != CM_CONFIG_SEQ)
        return bad(c, key, "expected a list of groups ([{param_str_match: '^bert\\.', lr: 1.0e-4}, ...])");
    const int n = cm_config_len(c, key);
    o->groups = cm_alloc_zeroed(sizeof *o->groups * (size_t)(n ? n : 1), 16);
    if (!o->groups) return CM_ERR_OOM;
    cm_config_mark_read(c, key);
    for (int i = 0; i < n; i++) {
        cli_param_group *g = &o->groups[i];
        snprintf(g->key, sizeof g->key, "%s.%d", key, i);
        if (cm_config_kind_of(c, g->key) != CM_CONFIG_MAP)
            return bad(c, g->key, "expected a map with param_str_match and the group's hyperparameters");
        cm_config_mark_read(c, g->key);
        char m[96];
        snprintf(m, sizeof m, "%s.param_str_match", g->key);
        TRY(cm_config_get_string(c, m, NULL, &g->pattern));
        if (!g->pattern) return bad(c, g->key, "param_str_match is required (a regular expression over parameter names)");
        TRY(compile(c, m, g->pattern, &g->re));
        o->n_groups = i + 1;
        TRY(read_hparams(c, g->key, o->kind, &o->hp, &g->hp));
    }
    return CM_OK;
}

cm_status cli_optim_read(cm_config *c, cli_optim *o) {
    memset(o, 0, sizeof *o);
    int kind;
    TRY(cm_config_get_choice(c, "optimizer.name", kind_names, CM_OPTIM_KIND_COUNT, "decoupled_adamw", &kind));
    o->kind = (cm_optim_kind)kind;
    const cm_optim_hparams def = cm_optim_hparams_default(o->kind);
    if (is_sgd(o->kind) && !cm_config_has(c, "optimizer.lr"))
        return bad(c, "optimizer.lr", "required for %s (e.g. optimizer.lr=0.1)", kind_names[kind]);
    TRY(read_hparams(c, "optimizer", o->kind, &def, &o->hp));
    TRY(read_disable(c, o));
    return read_groups(c, o);
}

/* This rank's span of unit u holds elements [*begin, *begin + span->n) of the unit: the whole
 * unit, or under a sharded strategy piece r of S (chunk = ceil(numel / S), cm_dist_new). */
static cm_status span_begin(cm_dist *dp, const cm_unit_info *u, const cm_optim_span *sp, int64_t *begin) {
    if (sp->n == u->numel) {
        *begin = 0;
        return CM_OK;
    }
    const cm_comm *sc = dp ? cm_dist_shard_comm(dp) : NULL;
    const int S = sc ? cm_comm_size(sc) : 1, r = sc ? cm_comm_rank(sc) : 0;
    const int64_t chunk = (u->numel + S - 1) / S, b = (int64_t)r * chunk < u->numel ? (int64_t)r * chunk : u->numel;
    const int64_t e = b + chunk < u->numel ? b + chunk : u->numel;
    if (e - b != sp->n && chunk != sp->n)
        return cm_set_error(CM_ERR_STATE, "optimizer.param_groups: unit '%s' has %lld elements and this rank's piece "
                                          "%lld, which is not piece %d of %d",
                            u->name, (long long)u->numel, (long long)sp->n, r, S);
    *begin = b;
    return CM_OK;
}

static void say_matches(const cli_ctx *ctx, const char *key, const char *pattern, int64_t n, int64_t numel,
                        const char *what) {
    if (n == 0)
        cli_say(ctx, "%s: no parameter name matches '%s' (names look like those of `composer ckpt export --hf`)\n",
                key, pattern);
    else
        cli_say(ctx, "%s '%s': %lld parameter%s (%lld values) %s\n", key, pattern, (long long)n, n == 1 ? "" : "s",
                (long long)numel, what);
}

cm_status cli_optim_make(const cli_optim *o, cm_model *model, cm_dist *dp, const cli_ctx *ctx, cm_optim **out) {
    cm_module *root = cm_model_module(model);
    const int n_units = cm_module_n_units(root);
    const cm_optim_span *spans;
    cm_optim_span *own = NULL;
    int n;
    if (dp) {
        TRY(cm_dist_optim_spans(dp, &spans, &n));
    } else {
        n = n_units;
        own = cm_alloc(sizeof *own * (size_t)(n ? n : 1), 16);
        if (!own) return CM_ERR_OOM;
        for (int i = 0; i < n; i++) {
            const cm_unit_info *u = cm_module_unit(root, i);
            own[i] = (cm_optim_span){u->name, u->params, u->grads, u->numel};
        }
        spans = own;
    }
    cm_optim *opt = NULL;
    cm_status s = cm_optim_new(o->kind, &opt);
    if (!s && (s = cm_optim_add_group(opt, &o->hp, spans, n)) != CM_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        s = cm_set_error(s, "optimizer: %s", msg);
    }
    for (int g = 0; !s && g < o->n_groups; g++)
        if ((s = cm_optim_add_group(opt, &o->groups[g].hp, NULL, 0))) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            s = cm_set_error(s, "%s: %s", o->groups[g].key, msg);
        }
    if (s || (!o->n_groups && !o->n_disable)) goto done;
    if (n != n_units) {
        s = cm_set_error(CM_ERR_STATE, "optimizer: %d spans for %d wrap units", n, n_units);
        goto done;
    }
    int64_t *count = cm_alloc_zeroed(sizeof *count * 2 * (size_t)(o->n_groups + o->n_disable + 1), 16);
    if (!count) {
        s = CM_ERR_OOM;
        goto done;
    }
    const int64_t np = cm_module_n_params(root);
    for (int64_t i = 0; !s && i < np; i++) {
        const cm_param_info pi = cm_module_param_info(root, i);
        int hit = -1, group = -1;
        for (int d = 0; d < o->n_disable && hit < 0; d++)
            if (regexec(&o->disable[d].re, pi.name, 0, NULL, 0) == 0) hit = d;
        for (int g = 0; hit < 0 && g < o->n_groups && group < 0; g++)
            if (regexec(&o->groups[g].re, pi.name, 0, NULL, 0) == 0) group = g;
        if (hit < 0 && group < 0) continue;
        const int c = hit >= 0 ? o->n_groups + hit : group;
        count[2 * c]++, count[2 * c + 1] += pi.numel;
        if (hit >= 0 && (s = cm_tensor_set_requires_grad(pi.tensor, false))) break;
        /* this rank's part of the parameter: [offset, offset + numel) ∩ its span of the unit */
        const cm_unit_info *u = cm_module_unit(root, pi.unit);
        int64_t b = 0;
        if ((s = span_begin(dp, u, &spans[pi.unit], &b))) break;
        const int64_t lo = pi.offset > b ? pi.offset : b,
                      hi = pi.offset + pi.numel < b + spans[pi.unit].n ? pi.offset + pi.numel : b + spans[pi.unit].n;
        if (hi <= lo) continue;
        float *at = spans[pi.unit].param + (lo - b);
        s = hit >= 0 ? cm_optim_exclude(opt, at, hi - lo) : cm_optim_assign(opt, 1 + group, at, hi - lo);
        if (s) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            s = cm_set_error(s, "%s: parameter '%s': %s", hit >= 0 ? o->disable[hit].key : o->groups[group].key,
                             pi.name, msg);
        }
    }
    for (int d = 0; !s && d < o->n_disable; d++)
        say_matches(ctx, o->disable[d].key, o->disable[d].pattern, count[2 * (o->n_groups + d)],
                    count[2 * (o->n_groups + d) + 1], "frozen (disable_grad)");
    for (int g = 0; !s && g < o->n_groups; g++) {
        char what[96];
        snprintf(what, sizeof what, "at lr %g, weight_decay %g", o->groups[g].hp.lr, o->groups[g].hp.weight_decay);
        say_matches(ctx, o->groups[g].key, o->groups[g].pattern, count[2 * g], count[2 * g + 1], what);
    }
    cm_free(count);
done:
    cm_free(own);
    if (s) {
        cm_optim_free(opt);
        return s;
    }
    *out = opt;
    return CM_OK;
}
