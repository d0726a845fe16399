/* Activation checkpointing policies: which modules of a tree run as checkpointed regions
 * (cm_module_checkpoint_policy). The regions themselves are the tape's (src/tensor/checkpoint.c). */
#include "nn/nn_impl.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct {
    cm_module **mods;
    int n, cap;
} modlist;

static bool push(modlist *l, cm_module *m) {
    if (l->n == l->cap) {
        const int cap = l->cap ? 2 * l->cap : 64;
        cm_module **nm = cm_alloc(sizeof *nm * (size_t)cap, 16);
        if (!nm) return false;
        if (l->n) memcpy(nm, l->mods, sizeof *nm * (size_t)l->n);
        cm_free(l->mods);
        l->mods = nm;
        l->cap = cap;
    }
    l->mods[l->n++] = m;
    return true;
}

static bool collect_fn(cm_module *m, const char *path, int depth, void *data) {
    (void)path, (void)depth;
    return push(data, m);
}

/* Parses an unsigned decimal number filling all of [s, e). */
static bool num(const char *s, const char *e, int64_t *out) {
    if (s >= e || e - s > 12) return false;
    int64_t v = 0;
    for (const char *p = s; p < e; p++) {
        if (!isdigit((unsigned char)*p)) return false;
        v = v * 10 + (*p - '0');
    }
    *out = v;
    return true;
}

static bool prefixed(const char *s, const char *e, const char *pre, const char **rest) {
    const size_t n = strlen(pre);
    if ((size_t)(e - s) < n || strncasecmp(s, pre, n) != 0) return false;
    *rest = s + n;
    return true;
}

/* Marks in sel[0..count) the blocks one element [s, e) of a blocks list names. */
static cm_status element(const char *type, const char *s, const char *e, int64_t count, bool *sel) {
    const int64_t last = count - 1;
    const char *r;
    int64_t a, b, lo = 0, hi = 0, step = 1;
    if (num(s, e, &a)) {
        lo = a, hi = a + 1;
    } else if (prefixed(s, e, "first-", &r) && num(r, e, &a)) {
        lo = 0, hi = a;
    } else if (prefixed(s, e, "last-", &r) && num(r, e, &a)) {
        lo = last - a + 1, hi = count;
    } else if (prefixed(s, e, "middle-", &r) && num(r, e, &a)) {
        lo = last / 2 - a / 2;
        if (lo < 0) lo = 0;
        hi = lo + a;
    } else if (prefixed(s, e, "range-", &r)) {
        const char *dash = memchr(r, '-', (size_t)(e - r));
        if (!dash || !num(r, dash, &a) || !num(dash + 1, e, &b)) goto bad;
        lo = a, hi = b;
    } else if (prefixed(s, e, "every-", &r) && num(r, e, &a) && a >= 1) {
        lo = 0, hi = count, step = a;
    } else {
        goto bad;
    }
    if (lo < 0) lo = 0;
    if (hi > count) hi = count;
    for (int64_t i = lo; i < hi; i += step) sel[i] = true;
    return CM_OK;
bad:
    return cm_set_error(CM_ERR_INVALID_ARG,
                        "activation_checkpointing_target %s: '%.*s' is not a block id or first-n, last-k, middle-m, "
                        "range-i-j, every-k",
                        type, (int)(e - s), s);
}

/* Whether m roots a wrap unit, and the unit's name (its label, or its path). */
static bool unit_root(const cm_module *m, char *name, size_t cap) {
    if (!m->unit) return false;
    if (m->unit[0]) snprintf(name, cap, "%s", m->unit);
    else cm_module_path(m, name, cap);
    return true;
}

/* The default targets: types that root at least two different wrap units. Writes at most cap
 * distinct type names into types. */
static int default_types(const modlist *all, const char **types, int cap) {
    int n = 0;
    for (int i = 0; i < all->n && n < cap; i++) {
        char ui[512], uj[512];
        const cm_module *m = all->mods[i];
        if (!unit_root(m, ui, sizeof ui)) continue;
        const char *t = m->vt->type_name;
        bool seen = false;
        for (int k = 0; k < n && !seen; k++) seen = !strcmp(types[k], t);
        if (seen) continue;
        bool other = false;
        for (int j = i + 1; j < all->n && !other; j++)
            other = !strcmp(all->mods[j]->vt->type_name, t) && unit_root(all->mods[j], uj, sizeof uj) &&
                    strcmp(ui, uj) != 0;
        if (other) types[n++] = t;
    }
    return n;
}

cm_status cm_module_checkpoint_policy(cm_module *root, const cm_act_ckpt_target *targets, int n, int *n_marked) {
    if (n_marked) *n_marked = 0;
    if (!root || n < 0 || (n > 0 && !targets))
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_module_checkpoint_policy: %s",
                            !root ? "root is NULL" : "n < 0 or targets is NULL");
    modlist all = {0};
    if (!cm_module_visit(root, collect_fn, &all)) {
        cm_free(all.mods);
        return cm_set_error(CM_ERR_OOM, "cm_module_checkpoint_policy: out of memory");
    }
    bool *mark = cm_alloc_zeroed(sizeof(bool) * (size_t)(all.n + 1), 16);
    bool *sel = cm_alloc_zeroed(sizeof(bool) * (size_t)(all.n + 1), 16);
    const char *deft[64];
    cm_act_ckpt_target dt[64];
    cm_status st = CM_OK;
    if (!mark || !sel) {
        st = cm_set_error(CM_ERR_OOM, "cm_module_checkpoint_policy: out of memory");
        goto done;
    }
    if (n == 0) {
        const int nd = default_types(&all, deft, 64);
        for (int i = 0; i < nd; i++) dt[i] = (cm_act_ckpt_target){deft[i], NULL};
        targets = dt;
        n = nd;
    }
    for (int t = 0; t < n; t++) {
        const char *type = targets[t].type_name;
        if (!type || !type[0]) {
            st = cm_set_error(CM_ERR_INVALID_ARG, "activation_checkpointing_target: entry %d has no type name", t);
            goto done;
        }
        int64_t count = 0;
        for (int i = 0; i < all.n; i++) count += strcasecmp(all.mods[i]->vt->type_name, type) == 0;
        if (count == 0) {
            const char *best = NULL;
            int best_d = 1 << 30;
            for (int i = 0; i < all.n; i++) {
                const int d = cm_edit_distance(type, all.mods[i]->vt->type_name);
                if (d < best_d) best_d = d, best = all.mods[i]->vt->type_name;
            }
            st = cm_set_error(CM_ERR_NOT_FOUND,
                              "activation_checkpointing_target: the model has no module of type '%s' (did you mean "
                              "'%s'?)",
                              type, best ? best : "");
            goto done;
        }
        memset(sel, 0, sizeof(bool) * (size_t)count);
        const char *b = targets[t].blocks;
        if (!b || !*b) {
            for (int64_t i = 0; i < count; i++) sel[i] = true;
        } else {
            for (const char *p = b; *p;) {
                while (*p == ' ' || *p == ',') p++;
                if (!*p) break;
                const char *e = p;
                while (*e && *e != ',') e++;
                const char *te = e;
                while (te > p && te[-1] == ' ') te--;
                if ((st = element(type, p, te, count, sel))) goto done;
                p = e;
            }
        }
        for (int i = 0, k = 0; i < all.n; i++)
            if (strcasecmp(all.mods[i]->vt->type_name, type) == 0) {
                if (sel[k]) mark[i] = true;
                k++;
            }
    }
    /* one granularity per region: no marked module inside a marked one */
    for (int i = 0; i < all.n; i++) {
        if (!mark[i]) continue;
        for (const cm_module *p = all.mods[i]->parent; p; p = p->parent)
            for (int j = 0; j < all.n; j++)
                if (mark[j] && all.mods[j] == p) {
                    char a[512], c[512];
                    cm_module_path(all.mods[i], a, sizeof a);
                    cm_module_path(p, c, sizeof c);
                    st = cm_set_error(CM_ERR_INVALID_ARG,
                                      "activation_checkpointing_target: %s (%s) would be checkpointed inside %s (%s), "
                                      "which is checkpointed too; each block can have one granularity",
                                      a, all.mods[i]->vt->type_name, c[0] ? c : "<root>", p->vt->type_name);
                    goto done;
                }
    }
    int marked = 0;
    for (int i = 0; i < all.n; i++) {
        all.mods[i]->checkpoint = mark[i];
        all.mods[i]->act_offload = false; /* the offload policy's marks: a module is one or the other */
        marked += mark[i];
    }
    if (n_marked) *n_marked = marked;
done:
    cm_free(mark);
    cm_free(sel);
    cm_free(all.mods);
    return st;
}

static bool ckpt_to_offload(cm_module *m, const char *path, int depth, void *data) {
    (void)path, (void)depth, (void)data;
    m->act_offload = m->checkpoint;
    m->checkpoint = false;
    return true;
}

cm_status cm_module_activation_offload_policy(cm_module *root, const cm_act_ckpt_target *targets, int n, int *n_marked) {
    cm_status s = cm_module_checkpoint_policy(root, targets, n, n_marked);
    if (!s) cm_module_visit(root, ckpt_to_offload, NULL);
    return s;
}
