/* The registry of the surgery methods (class name, YAML key, required_on_load, argument table),
 * making a method from JSON arguments and printing a live one's arguments, and the helpers the
 * methods share. */
#include "plugins/surgery/surgery_impl.h"
#include "base/json.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const cmi_algo_entry *const k_entries[] = {
    &cmi_alibi_entry,
    &cmi_blurpool_entry,
    &cmi_channels_last_entry,
    &cmi_factorize_entry,
    &cmi_fused_layernorm_entry,
    &cmi_glu_entry,
    &cmi_ghost_bn_entry,
    &cmi_gyro_dropout_entry,
    &cmi_lp_groupnorm_entry,
    &cmi_lp_layernorm_entry,
    &cmi_no_op_model_entry,
    &cmi_squeeze_excite_entry,
    &cmi_stochastic_depth_entry,
    &cmi_weight_std_entry,
};
#define N_ENTRIES ((int)(sizeof k_entries / sizeof *k_entries))

int cm_algorithm_info_count(void) { return N_ENTRIES; }

const cm_algorithm_info *cm_algorithm_info_at(int i) { return i >= 0 && i < N_ENTRIES ? &k_entries[i]->info : NULL; }

static const cmi_algo_entry *entry_find(const char *name) {
    for (int i = 0; name && i < N_ENTRIES; i++)
        if (!strcmp(k_entries[i]->info.name, name) || !strcmp(k_entries[i]->info.key, name)) return k_entries[i];
    return NULL;
}

static const cmi_algo_entry *entry_of(const cm_algorithm_i *vt) {
    for (int i = 0; vt && i < N_ENTRIES; i++)
        if (k_entries[i]->vt == vt) return k_entries[i];
    return NULL;
}

const cm_algo_arg *cm_algorithm_info_arg(const cm_algorithm_info *info, int i) {
    for (int k = 0; info && k < N_ENTRIES; k++)
        if (&k_entries[k]->info == info) return i >= 0 && i < k_entries[k]->n_args ? &k_entries[k]->args[i].pub : NULL;
    return NULL;
}

const cm_algorithm_info *cm_algorithm_info_find(const char *name) {
    const cmi_algo_entry *e = entry_find(name);
    return e ? &e->info : NULL;
}

const cm_algorithm_info *cm_algorithm_info_of(const cm_algorithm_i *vt) {
    const cmi_algo_entry *e = entry_of(vt);
    return e ? &e->info : NULL;
}

/* ---- arguments: JSON in, JSON out ---- */

static int choice_index(const cm_algo_arg *a, const char *s) {
    for (int i = 0; i < a->n_choices; i++)
        if (!strcmp(a->choices[i], s)) return i;
    return -2;
}

static cm_status choice_error(const char *algo, const cm_algo_arg *a, const char *s) {
    char list[256] = "";
    for (int i = 0; i < a->n_choices; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", a->choices[i]);
    const char *near = cm_closest_name(s, a->choices, a->n_choices);
    return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s '%s' is not known (%s%s%suse %s)", algo, a->name, s,
                        near ? "did you mean '" : "", near ? near : "", near ? "'? " : "", list);
}

/* A Time argument: a Time string, or a bare number (a fraction of the run, Composer's float). */
static cm_status parse_time_arg(const char *algo, const char *name, const cJSON *v, cm_time *out) {
    if (cJSON_IsNumber(v)) {
        if (!(v->valuedouble >= 0) || !isfinite(v->valuedouble))
            return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s %g must be a fraction of the run >= 0", algo, name,
                                v->valuedouble);
        *out = cm_time_dur(v->valuedouble);
        return CM_OK;
    }
    if (!cJSON_IsString(v))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s must be a time (\"0.1dur\", \"100ba\") or a fraction", algo,
                            name);
    char *end;
    const double f = strtod(v->valuestring, &end);
    if (end != v->valuestring && !*end) {
        cJSON num = {.type = cJSON_Number, .valuedouble = f};
        return parse_time_arg(algo, name, &num, out);
    }
    cm_status s = cm_time_parse_named(name, v->valuestring, out);
    if (s) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "%s: %s", algo, msg);
    }
    return CM_OK;
}

static cm_status set_arg(const char *algo, const cmi_arg *ca, const cJSON *v, void *cfg) {
    const cm_algo_arg *a = &ca->pub;
    char *field = (char *)cfg + ca->offset;
    switch (a->kind) {
    case CM_ALGO_ARG_BOOL:
        if (!cJSON_IsBool(v)) return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s must be true or false", algo, a->name);
        *(bool *)field = cJSON_IsTrue(v);
        return CM_OK;
    case CM_ALGO_ARG_INT:
        if (!cmi_json_whole(v, INT64_MIN, INT64_MAX, (int64_t *)field))
            return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s must be an integer", algo, a->name);
        return CM_OK;
    case CM_ALGO_ARG_REAL:
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
            return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s must be a finite number", algo, a->name);
        *(double *)field = v->valuedouble;
        return CM_OK;
    case CM_ALGO_ARG_CHOICE: {
        if (cJSON_IsNull(v) && ca->null_ok) {
            *(int *)field = -1;
            return CM_OK;
        }
        if (!cJSON_IsString(v)) return choice_error(algo, a, "(not a string)");
        int k = choice_index(a, v->valuestring);
        if (k < 0) return choice_error(algo, a, v->valuestring);
        *(int *)field = k;
        return CM_OK;
    }
    case CM_ALGO_ARG_TIME:
        return parse_time_arg(algo, a->name, v, (cm_time *)field);
    }
    return cm_set_error(CM_ERR_INTERNAL, "%s: argument %s has no kind", algo, a->name);
}

/* The config's defaults (its _default(); the argument table's default texts say the same, which
 * the registry test checks: YAML reads those). */
static cm_status apply_defaults(const cmi_algo_entry *e, void *cfg) {
    e->cfg_default(cfg);
    return CM_OK;
}

cm_status cm_algorithm_new_from_json(const char *name, const char *json, cm_algorithm_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_algorithm_new_from_json: out is NULL");
    *out = (cm_algorithm_plugin){NULL, NULL};
    const cmi_algo_entry *e = entry_find(name);
    if (!e) {
        const char *names[2 * N_ENTRIES];
        char list[512] = "";
        for (int i = 0; i < N_ENTRIES; i++) {
            names[2 * i] = k_entries[i]->info.name, names[2 * i + 1] = k_entries[i]->info.key;
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", k_entries[i]->info.name);
        }
        const char *near = cm_closest_name(name ? name : "", names, 2 * N_ENTRIES);
        return cm_set_error(CM_ERR_NOT_FOUND, "unknown surgery algorithm '%s' (%s%s%sknown: %s)", name ? name : "(null)",
                            near ? "did you mean '" : "", near ? near : "", near ? "'? " : "", list);
    }
    const char *algo = e->info.name;
    void *cfg = cm_alloc_zeroed(e->cfg_size ? e->cfg_size : 1, 16);
    if (!cfg) return cm_set_error(CM_ERR_OOM, "%s: out of memory", algo);
    cm_status s = apply_defaults(e, cfg);
    cJSON *root = NULL;
    if (!s && json && *json) {
        root = cJSON_Parse(json);
        if (!root || !cJSON_IsObject(root))
            s = cm_set_error(CM_ERR_FORMAT, "%s: the arguments are not a JSON object: %.120s", algo, json);
    }
    const cJSON *it;
    if (!s && root) {
        cJSON_ArrayForEach(it, root) {
            const cmi_arg *ca = NULL;
            for (int i = 0; i < e->n_args; i++)
                if (!strcmp(e->args[i].pub.name, it->string)) ca = &e->args[i];
            if (!ca) {
                const char *names[16];
                char list[256] = "";
                for (int i = 0; i < e->n_args && i < 16; i++) {
                    names[i] = e->args[i].pub.name;
                    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", names[i]);
                }
                const char *near = cm_closest_name(it->string, names, e->n_args < 16 ? e->n_args : 16);
                s = cm_set_error(CM_ERR_INVALID_ARG, "%s: unknown argument '%s' (%s%s%s%s%s)", algo, it->string,
                                 near ? "did you mean '" : "", near ? near : "", near ? "'? " : "",
                                 e->n_args ? "arguments: " : "it takes no arguments", list);
                break;
            }
            if (cJSON_IsNull(it) && !(ca->pub.kind == CM_ALGO_ARG_CHOICE && ca->null_ok)) continue; /* the default */
            if ((s = set_arg(algo, ca, it, cfg))) break;
        }
    }
    for (int i = 0; !s && i < e->n_args; i++) {
        if (e->args[i].pub.def) continue;
        const cJSON *v = root ? cJSON_GetObjectItemCaseSensitive(root, e->args[i].pub.name) : NULL;
        if (!v || cJSON_IsNull(v))
            s = cm_set_error(CM_ERR_INVALID_ARG, "%s: the argument %s is required", algo, e->args[i].pub.name);
    }
    cJSON_Delete(root);
    if (!s) s = e->make(cfg, out);
    cm_free(cfg);
    return s;
}

size_t cmi_args_to_json(const cmi_arg *args, int n, const void *cfg, char *buf, size_t cap) {
    size_t len = 0;
#define PUT(...)                                                                                \
    do {                                                                                        \
        int k_ = snprintf(len < cap ? buf + len : NULL, len < cap ? cap - len : 0, __VA_ARGS__); \
        if (k_ > 0) len += (size_t)k_;                                                          \
    } while (0)
    if (cap) buf[0] = '\0';
    PUT("{");
    for (int i = 0; i < n; i++) {
        const cm_algo_arg *a = &args[i].pub;
        const char *field = (const char *)cfg + args[i].offset;
        PUT("%s\"%s\":", i ? "," : "", a->name);
        switch (a->kind) {
        case CM_ALGO_ARG_BOOL: PUT("%s", *(const bool *)field ? "true" : "false"); break;
        case CM_ALGO_ARG_INT: PUT("%lld", (long long)*(const int64_t *)field); break;
        case CM_ALGO_ARG_REAL: {
            /* the shortest form that reads back the same (0.2, not 0.20000000000000001) */
            const double v = *(const double *)field;
            char t[40];
            snprintf(t, sizeof t, "%.15g", v);
            if (strtod(t, NULL) != v) snprintf(t, sizeof t, "%.17g", v);
            PUT("%s", t);
            break;
        }
        case CM_ALGO_ARG_CHOICE: {
            const int k = *(const int *)field;
            if (k >= 0 && k < a->n_choices)
                PUT("\"%s\"", a->choices[k]);
            else
                PUT("null");
            break;
        }
        case CM_ALGO_ARG_TIME: {
            char t[CM_TIME_STR_MAX];
            cm_time_to_string(*(const cm_time *)field, t, sizeof t);
            PUT("\"%s\"", t);
            break;
        }
        }
    }
    PUT("}");
#undef PUT
    return len;
}

size_t cm_algorithm_hparams_json(cm_algorithm_plugin p, char *buf, size_t cap) {
    const cmi_algo_entry *e = entry_of(p.vt);
    if (!e || !p.self) {
        if (cap) buf[0] = '\0';
        return 0;
    }
    return cmi_args_to_json(e->args, e->n_args, p.self, buf, cap);
}

/* ---- shared helpers ---- */

cm_status cmi_surgery_check_unlocked(const cm_module *root, const char *algo, const char *fn) {
    if (!root) return cm_set_error(CM_ERR_INVALID_ARG, "%s: the model is NULL", fn);
    if (cm_module_parent(root))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: give the root of the model (this module has a parent)", fn);
    if (cm_module_is_locked(root))
        return cm_set_error(CM_ERR_STATE,
                            "%s: the model's parameters are locked by an optimizer or data parallelism made before "
                            "the trainer, and surgery re-packs them: call cm_trainer_prepare_model(&cfg) (or %s) "
                            "first, then make the optimizer and data parallelism",
                            algo, fn);
    return CM_OK;
}

typedef struct {
    const char *const *types;
    int n;
    int64_t count;
} count_ctx;

static bool count_visit(cm_module *m, const char *path, int depth, void *data) {
    count_ctx *c = data;
    for (int i = 0; i < c->n; i++)
        if (!strcmp(cm_module_type_name(m), c->types[i])) c->count++;
    return true;
}

bool cmi_has_ancestor(const cm_module *m, const char *type) {
    for (const cm_module *p = m ? cm_module_parent(m) : NULL; p; p = cm_module_parent(p))
        if (!strcmp(cm_module_type_name(p), type)) return true;
    return false;
}

int64_t cmi_count_types(cm_module *root, const char *const *types, int n) {
    count_ctx c = {types, n, 0};
    if (root) cm_module_visit(root, count_visit, &c);
    return c.count;
}

cm_status cmi_nothing_to_apply(const cm_module *root, const char *algo, const char *looked_for, const char *hint) {
    return cm_set_error(CM_ERR_UNSUPPORTED, "%s: the model (%s) has nothing to apply to: it looked for %s%s%s", algo,
                        root ? cm_module_type_name(root) : "NULL", looked_for, hint && *hint ? "; " : "",
                        hint ? hint : "");
}

cm_rng cmi_surgery_rng(uint64_t seed, const char *path) {
    return cm_rng_init(seed, cm_hash64(path, strlen(path), 0x53555247ull /* "SURG" */));
}

cm_status cmi_state_root(const cm_state *st, const char *algo, cm_module **out) {
    cm_model *m = st ? cm_state_model(st) : NULL;
    *out = m ? cm_model_module(m) : NULL;
    if (!*out) return cm_set_error(CM_ERR_STATE, "%s: the state has no model", algo);
    return CM_OK;
}

void cmi_log_once(const char *what) {
    enum { MAXK = 16 };
    static const char *seen[MAXK];
    static int n_seen;
#pragma omp critical(cmi_log_once)
    {
        bool found = false;
        for (int i = 0; i < n_seen; i++) found = found || seen[i] == what;
        if (!found) {
            if (n_seen < MAXK) seen[n_seen++] = what;
            cm_log_msg(CM_LOG_INFO, "%s", what);
        }
    }
}

void cmi_surgery_set_channels_last(cm_module *m, bool on) {
    static const char *const layered[] = {"Conv2d", "BatchNorm2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d"};
    for (int i = 0; i < 5; i++)
        if (!strcmp(cm_module_type_name(m), layered[i])) {
            cm_nn_set_channels_last(m, on);
            return;
        }
    if (!cmi_blurpool_set_channels_last(m, on)) cmi_se_set_channels_last(m, on);
}
