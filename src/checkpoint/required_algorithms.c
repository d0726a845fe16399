/* Composer's "required on load" rule (State._apply_required_algorithms): a checkpoint lists the
 * algorithms it was trained with, and the model surgery among them (the required_on_load methods
 * of composer/surgery_algorithms.h) is re-created from the recorded arguments and applied before
 * the weights are read, when the trainer was not given it — with Composer's warnings (the same
 * method given with other arguments; one that cannot be re-created) and errors (a re-created
 * method that the passes would order before one of the trainer's own; one that fails to apply). */
#include "checkpoint/ckpt_impl.h"

#include <composer/surgery_algorithms.h>
#include <stdio.h>
#include <string.h>

const cJSON *cmi_checkpoint_root(const cm_checkpoint *ck); /* reader.c */

static bool excluded(const char *const *exclude, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (cm_name_match(exclude[i], name)) return true;
    return false;
}

/* A plugin's arguments as canonical JSON text (cJSON's unformatted print of the parsed object), or
 * NULL. Caller frees with cJSON_free. */
static char *canonical_hparams(cm_algorithm_plugin p) {
    char buf[1024];
    size_t n = cm_algorithm_hparams_json(p, buf, sizeof buf);
    if (!n || n >= sizeof buf) return NULL;
    cJSON *j = cJSON_Parse(buf);
    char *t = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    return t;
}

/* "Name({...})": Composer's repr, for messages. */
static void repr(const char *name, const char *hp, char *out, size_t cap) {
    snprintf(out, cap, "%s(%s)", name, hp ? hp : "");
}

static void append(char *list, size_t cap, const char *item) {
    size_t l = strlen(list);
    snprintf(list + l, cap - l, "%s%s", l ? ", " : "", item);
}

/* Method `name` made from its recorded arguments hp (`what` '<source>' names the record in
 * messages: "checkpoint 'x'", "weights 'y'"). Composer warns and goes on when that fails: so do
 * we (when warn), returning false. */
static bool recreate(const char *name, const cJSON *hp, const char *what, const char *source, bool warn,
                     cm_algorithm_plugin *p) {
    char *hp_text = cJSON_IsObject(hp) ? cJSON_PrintUnformatted(hp) : NULL;
    const bool ok = hp_text && cm_algorithm_new_from_json(name, hp_text, p) == CM_OK;
    if (!ok && warn)
        cm_log_msg(CM_LOG_WARN,
                   "required_on_load algorithm %s was enabled when training the loaded %s '%s'. Attempted to check its "
                   "presence but recreating the algorithm failed (%s). If this required_on_load algorithm is not "
                   "properly specified, it may lead to unexpected behavior, including failing to load weights for "
                   "some layers.",
                   name, what, source, hp_text ? cm_last_error() : "no recorded arguments");
    cJSON_free(hp_text);
    return ok;
}

/* Adds the form of a method given as `mine` to forms; *same when its arguments are canon's. */
static void add_form(char *forms, size_t cap, const char *name, cm_algorithm_plugin mine, const char *canon, bool *same) {
    char *hp = canonical_hparams(mine), r[256];
    repr(name, hp, r, sizeof r);
    append(forms, cap, r);
    *same = *same || (hp && canon && !strcmp(hp, canon));
    cJSON_free(hp);
}

/* Composer's warning for a required method given with other arguments. */
static void warn_forms(const char *name, const char *canon, const char *what, const char *source, const char *forms) {
    cm_log_msg(CM_LOG_WARN,
               "required_on_load algorithm %s(%s) was enabled when training the loaded %s '%s' but is now specified "
               "in the following forms: %s. Potential parameter discrepancies for this required_on_load algorithm may "
               "lead to unexpected behavior, including failing to load weights for some layers.",
               name, canon ? canon : "", what, source, forms);
}

cm_status cmi_apply_required_algorithms(cm_engine *e, cm_state *st, const char *path, cmi_remote *via,
                                        const char *const *exclude, int n_exclude, bool warn, int *n_added) {
    *n_added = 0;
    cm_checkpoint *ck = NULL;
    cm_status s = via ? cmi_remote_open_path(via, path, &ck) : cm_checkpoint_open(path, &ck);
    if (s) return s;
    const cJSON *algs = cJSON_GetObjectItemCaseSensitive(cmi_checkpoint_root(ck), "algorithms");
    enum { MAXM = 32 };
    cm_algorithm_plugin missing[MAXM];
    char *missing_hp[MAXM];
    const char *missing_name[MAXM];
    int n_missing = 0;
    const int n_user = cm_engine_n_algorithms(e);
    const cJSON *it;
    cJSON_ArrayForEach(it, algs) {
        const cJSON *jn = cJSON_GetObjectItemCaseSensitive(it, "name");
        if (!cJSON_IsString(jn)) continue;
        const char *name = jn->valuestring;
        const cm_algorithm_info *info = cm_algorithm_info_find(name);
        if (!info || !info->required_on_load || strcmp(info->name, name)) continue;
        if (excluded(exclude, n_exclude, name)) {
            if (warn)
                cm_log_msg(CM_LOG_INFO, "checkpoint '%s' was trained with %s; not re-applied (load_exclude_algorithms)",
                           path, name);
            continue;
        }
        cm_algorithm_plugin p;
        if (!recreate(name, cJSON_GetObjectItemCaseSensitive(it, "hparams"), "checkpoint", path, warn, &p)) continue;
        char *canon = canonical_hparams(p);
        /* the trainer's own algorithms of the same class */
        bool same_class = false, same_args = false;
        char forms[512] = "";
        for (int i = 0; i < n_user; i++) {
            cm_algorithm *a = cm_engine_algorithm(e, i);
            if (strcmp(cm_algorithm_name(a), name)) continue;
            same_class = true;
            add_form(forms, sizeof forms, name, (cm_algorithm_plugin){cm_algorithm_vtable(a), cm_algorithm_self(a)}, canon,
                     &same_args);
        }
        for (int i = 0; i < n_missing && !same_class; i++) same_class = !strcmp(missing_name[i], name);
        if (same_class) {
            if (warn && !same_args && forms[0]) warn_forms(name, canon, "checkpoint", path, forms);
            cm_algorithm_plugin_free(p);
            cJSON_free(canon);
            continue;
        }
        if (n_missing == MAXM) {
            cm_algorithm_plugin_free(p);
            cJSON_free(canon);
            s = cm_set_error(CM_ERR_UNSUPPORTED, "checkpoint '%s' requires more than %d algorithms", path, MAXM);
            break;
        }
        missing[n_missing] = p, missing_hp[n_missing] = canon, missing_name[n_missing] = info->name;
        n_missing++;
    }
    char names[512] = "", reprs[1024] = "";
    for (int i = 0; i < n_missing; i++) {
        char r[256], q[96];
        repr(missing_name[i], missing_hp[i], r, sizeof r);
        append(reprs, sizeof reprs, r);
        snprintf(q, sizeof q, "'%s'", missing_name[i]);
        append(names, sizeof names, q);
    }
    /* register them after the trainer's own, as Composer appends them to state.algorithms */
    int registered = 0;
    for (int i = 0; !s && i < n_missing; i++) {
        if ((s = cm_engine_add_algorithm(e, missing[i]))) break;
        registered++;
    }
    for (int i = registered; i < n_missing; i++) cm_algorithm_plugin_free(missing[i]);
    cm_algorithm **order = NULL;
    int n_order = 0;
    if (!s && registered) {
        order = cm_alloc(sizeof *order * (size_t)cm_engine_n_algorithms(e), 16);
        if (!order) s = cm_set_error(CM_ERR_OOM, "checkpoint: out of memory");
        else if ((n_order = cmi_engine_order_all(e, CM_EVENT_INIT, order)) < 0) s = cm_last_status();
    }
    /* one of the checkpoint's methods ordered before one of the trainer's, which already ran */
    for (int i = 0, seen = 0; !s && i < n_order; i++) {
        bool theirs = false;
        for (int k = n_user; k < cm_engine_n_algorithms(e); k++) theirs = theirs || cm_engine_algorithm(e, k) == order[i];
        if (theirs) {
            seen = 1;
        } else if (seen) {
            s = cm_set_error(CM_ERR_STATE,
                             "The following algorithms were enabled when training checkpoint '%s' and are required to "
                             "successfully load it: [%s]. Attempted to autocreate and apply required algorithms, but "
                             "at least one of the loaded algorithms was ordered before a user specified algorithm "
                             "(%s) which has already been applied, preventing automatic application of algorithms. "
                             "If you wish to use pretrained weights and reinitialize layers which have undergone "
                             "surgery, the following algorithms may be excluded using load_exclude_algorithms, e.g. "
                             "load_exclude_algorithms=[%s].",
                             path, reprs, cm_algorithm_name(order[i]), names);
        }
    }
    /* apply them, in the passes' order */
    for (int i = 0; !s && i < n_order; i++) {
        bool theirs = false;
        for (int k = n_user; k < cm_engine_n_algorithms(e); k++) theirs = theirs || cm_engine_algorithm(e, k) == order[i];
        if (!theirs) continue;
        const cm_algorithm_i *vt = cm_algorithm_vtable(order[i]);
        void *self = cm_algorithm_self(order[i]);
        cm_clear_error();
        if (vt->match(self, CM_EVENT_INIT, st)) s = vt->apply(self, CM_EVENT_INIT, st, cm_engine_logger(e));
        if (s) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", cm_last_error()[0] ? cm_last_error() : cm_status_str(s));
            s = cm_set_error(s,
                             "The following algorithms were enabled when training checkpoint '%s' and are required to "
                             "successfully load it: [%s]. Attempted to autocreate and apply required algorithms but "
                             "%s failed: %s. If you wish to use pretrained weights and reinitialize layers which have "
                             "undergone surgery, the following algorithms may be excluded using "
                             "load_exclude_algorithms, e.g. load_exclude_algorithms=[%s].",
                             path, reprs, cm_algorithm_name(order[i]), msg, names);
            break;
        }
        if (warn)
            cm_log_msg(CM_LOG_WARN,
                       "Automatically adding required_on_load algorithm %s to trainer, which was enabled when training "
                       "the loaded checkpoint '%s'. If you wish to use pretrained weights and ignore required_on_load "
                       "algorithms, which may result in some weights failing to load, include %s in "
                       "load_exclude_algorithms, e.g. load_exclude_algorithms=['%s'].",
                       cm_algorithm_name(order[i]), path, cm_algorithm_name(order[i]), cm_algorithm_name(order[i]));
    }
    cm_free(order);
    for (int i = 0; i < n_missing; i++) cJSON_free(missing_hp[i]);
    if (s) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        cmi_engine_pop_algorithms(e, cm_engine_n_algorithms(e) - n_user);
        cm_checkpoint_close(ck);
        return cm_set_error(s, "%s", msg);
    }
    *n_added = registered;
    cm_checkpoint_close(ck);
    return CM_OK;
}

/* ---- weights files that record their surgery (surgery_algorithms.h) ---- */

cm_status cm_engine_required_on_load_json(const cm_engine *e, char **out) {
    if (!e || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_engine_required_on_load_json: NULL argument");
    *out = NULL;
    cJSON *arr = cJSON_CreateArray();
    if (!arr) return cm_set_error(CM_ERR_OOM, "required-on-load record: out of memory");
    cm_status s = CM_OK;
    for (int i = 0; !s && i < cm_engine_n_algorithms(e); i++) {
        cm_algorithm *a = cm_engine_algorithm(e, i);
        const cm_algorithm_info *info = cm_algorithm_info_of(cm_algorithm_vtable(a));
        if (!info || !info->required_on_load) continue;
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(arr, o)) {
            cJSON_Delete(o);
            s = cm_set_error(CM_ERR_OOM, "required-on-load record: out of memory");
            break;
        }
        char *hp = canonical_hparams((cm_algorithm_plugin){cm_algorithm_vtable(a), cm_algorithm_self(a)});
        cJSON *hj = hp ? cJSON_Parse(hp) : NULL;
        cJSON_free(hp);
        if (!hj) {
            s = cm_set_error(CM_ERR_INTERNAL, "algorithm '%s': its arguments are not JSON", cm_algorithm_name(a));
        } else if (!cJSON_AddStringToObject(o, "name", info->name) || !cJSON_AddItemToObject(o, "hparams", hj)) {
            cJSON_Delete(hj);
            s = cm_set_error(CM_ERR_OOM, "required-on-load record: out of memory");
        }
    }
    if (!s && cJSON_GetArraySize(arr) > 0) {
        char *t = cJSON_PrintUnformatted(arr);
        const size_t n = t ? strlen(t) + 1 : 0;
        if (t && (*out = cm_alloc(n, 1))) memcpy(*out, t, n);
        else s = cm_set_error(CM_ERR_OOM, "required-on-load record: out of memory");
        cJSON_free(t);
    }
    cJSON_Delete(arr);
    return s;
}

cm_status cm_algorithms_add_recorded(const char *json, const char *source, const char *const *exclude, int n_exclude,
                                     cm_algorithm_plugin *algs, int *n, int cap, int *n_added) {
    if (n_added) *n_added = 0;
    if (!algs || !n || *n < 0 || *n > cap)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_algorithms_add_recorded: %s",
                            !algs || !n ? "NULL algs or n" : "*n outside [0, cap]");
    if (!json || !json[0]) return CM_OK;
    if (!source) source = "the weights";
    cJSON *arr = cJSON_Parse(json);
    const cJSON *it;
    bool ok = cJSON_IsArray(arr);
    const cJSON *list = ok ? arr : NULL;
    cJSON_ArrayForEach(it, list) {
        ok = ok && cJSON_IsObject(it) && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(it, "name")) &&
             cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(it, "hparams"));
    }
    if (!ok) {
        cJSON_Delete(arr);
        return cm_set_error(CM_ERR_FORMAT,
                            "'%s': its \"%s\" metadata is not a list of {\"name\", \"hparams\"} objects (a file "
                            "written by another program?): %.200s",
                            source, CM_SURGERY_METADATA_KEY, json);
    }
    const int n0 = *n;
    cm_status s = CM_OK;
    cJSON_ArrayForEach(it, arr) {
        const char *name = cJSON_GetObjectItemCaseSensitive(it, "name")->valuestring;
        const cm_algorithm_info *info = cm_algorithm_info_find(name);
        if (info && (!info->required_on_load || strcmp(info->name, name))) continue;
        if (excluded(exclude, n_exclude, name)) {
            cm_log_msg(CM_LOG_INFO, "'%s' was trained with %s; not re-applied (load_exclude_algorithms)", source, name);
            continue;
        }
        cm_algorithm_plugin p;
        if (!recreate(name, cJSON_GetObjectItemCaseSensitive(it, "hparams"), "weights", source, true, &p)) continue;
        char *canon = canonical_hparams(p);
        bool same_class = false, same_args = false;
        char forms[512] = "";
        for (int i = 0; i < *n; i++) {
            if (!algs[i].vt || !algs[i].vt->name || strcmp(algs[i].vt->name, name)) continue;
            same_class = true;
            if (i < n0) add_form(forms, sizeof forms, name, algs[i], canon, &same_args); /* else listed twice */
        }
        if (same_class) {
            if (!same_args && forms[0]) warn_forms(name, canon, "weights", source, forms);
            cm_algorithm_plugin_free(p);
            cJSON_free(canon);
            continue;
        }
        cJSON_free(canon);
        if (*n == cap) {
            cm_algorithm_plugin_free(p);
            s = cm_set_error(CM_ERR_INVALID_ARG, "'%s' requires %s, and there is no room for more than %d algorithms",
                             source, name, cap);
            break;
        }
        algs[(*n)++] = p;
    }
    cJSON_Delete(arr);
    if (s) {
        while (*n > n0) cm_algorithm_plugin_free(algs[--*n]);
        return s;
    }
    for (int i = n0; i < *n; i++)
        cm_log_msg(CM_LOG_WARN,
                   "Automatically adding required_on_load algorithm %s, which was enabled when training the loaded "
                   "weights '%s' (recorded in its metadata). If you wish to use the weights without it, which may "
                   "give other numbers or fail to load some weights, include %s in load_exclude_algorithms, e.g. "
                   "load_exclude_algorithms=['%s'].",
                   algs[i].vt->name, source, algs[i].vt->name, algs[i].vt->name);
    if (n_added) *n_added = *n - n0;
    return CM_OK;
}
