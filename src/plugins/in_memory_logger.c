/* InMemoryLogger: every logged metric and hyperparameter, kept in memory (Composer's
 * InMemoryLogger); for tests and programs that read their metrics back. */
#include <composer/trainer.h>

#include <stdio.h>
#include <string.h>

typedef struct {
    char *key, *value;
} hp_entry;

struct cm_in_memory_logger {
    cm_log_record *recs;
    int64_t n, cap;
    hp_entry *hps;
    int64_t n_hp, cap_hp;
    hp_entry *texts;
    int64_t n_text, cap_text;
};

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = cm_alloc(n, 8);
    if (d) memcpy(d, s, n);
    return d;
}

static bool reserve(void **arr, int64_t *cap, size_t size, int64_t need) {
    if (need <= *cap) return true;
    int64_t ncap = *cap ? *cap * 2 : 64;
    while (ncap < need) ncap *= 2;
    void *n = cm_alloc(size * (size_t)ncap, 16);
    if (!n) return false;
    if (*arr) memcpy(n, *arr, size * (size_t)*cap);
    cm_free(*arr);
    *arr = n;
    *cap = ncap;
    return true;
}

static cm_status iml_log_metrics(void *self, const cm_metric_value *v, int n, const cm_timestamp *ts) {
    cm_in_memory_logger *lg = self;
    if (!reserve((void **)&lg->recs, &lg->cap, sizeof *lg->recs, lg->n + n))
        return cm_set_error(CM_ERR_OOM, "InMemoryLogger: no memory for %lld records", (long long)(lg->n + n));
    for (int i = 0; i < n; i++) {
        char *name = dup_str(v[i].name ? v[i].name : "");
        if (!name) return cm_set_error(CM_ERR_OOM, "InMemoryLogger: no memory for a metric name");
        lg->recs[lg->n++] = (cm_log_record){name, v[i].value, ts ? ts->batch : 0, ts ? ts->epoch : 0};
    }
    return CM_OK;
}

static cm_status iml_log_hparams(void *self, const cm_hparam *h, int n) {
    cm_in_memory_logger *lg = self;
    for (int i = 0; i < n; i++) {
        char buf[64];
        const char *val = buf;
        if (h[i].kind == CM_HPARAM_STRING)
            val = h[i].string ? h[i].string : "";
        else if (h[i].kind == CM_HPARAM_BOOL)
            val = h[i].number != 0 ? "true" : "false";
        else
            snprintf(buf, sizeof buf, "%.17g", h[i].number);
        if (!reserve((void **)&lg->hps, &lg->cap_hp, sizeof *lg->hps, lg->n_hp + 1))
            return cm_set_error(CM_ERR_OOM, "InMemoryLogger: no memory for hyperparameters");
        hp_entry e = {dup_str(h[i].key ? h[i].key : ""), dup_str(val)};
        if (!e.key || !e.value) {
            cm_free(e.key), cm_free(e.value);
            return cm_set_error(CM_ERR_OOM, "InMemoryLogger: no memory for hyperparameters");
        }
        lg->hps[lg->n_hp++] = e;
    }
    return CM_OK;
}

static cm_status iml_log_text(void *self, const char *key, const char *text, const cm_timestamp *ts) {
    cm_in_memory_logger *lg = self;
    if (!reserve((void **)&lg->texts, &lg->cap_text, sizeof *lg->texts, lg->n_text + 1))
        return cm_set_error(CM_ERR_OOM, "InMemoryLogger: no memory for texts");
    hp_entry e = {dup_str(key), dup_str(text)};
    if (!e.key || !e.value) {
        cm_free(e.key), cm_free(e.value);
        return cm_set_error(CM_ERR_OOM, "InMemoryLogger: no memory for a text");
    }
    lg->texts[lg->n_text++] = e;
    return CM_OK;
}

static void iml_free(void *self) {
    cm_in_memory_logger *lg = self;
    for (int64_t i = 0; i < lg->n_text; i++) cm_free(lg->texts[i].key), cm_free(lg->texts[i].value);
    cm_free(lg->texts);
    for (int64_t i = 0; i < lg->n; i++) cm_free((void *)lg->recs[i].name);
    for (int64_t i = 0; i < lg->n_hp; i++) cm_free(lg->hps[i].key), cm_free(lg->hps[i].value);
    cm_free(lg->recs);
    cm_free(lg->hps);
    cm_free(lg);
}

static const cm_logger_i iml_vt = {
    .abi = CM_LOGGER_ABI,
    .name = "InMemoryLogger",
    .log_hyperparameters = iml_log_hparams,
    .log_metrics = iml_log_metrics,
    .free = iml_free,
    .log_text = iml_log_text,
};

cm_status cm_in_memory_logger_new(cm_in_memory_logger **out, cm_logger_plugin *plugin) {
    if (!out || !plugin) return cm_set_error(CM_ERR_INVALID_ARG, "cm_in_memory_logger_new: NULL argument");
    cm_in_memory_logger *lg = cm_alloc_zeroed(sizeof *lg, 16);
    if (!lg) return CM_ERR_OOM;
    *out = lg;
    *plugin = (cm_logger_plugin){&iml_vt, lg};
    return CM_OK;
}

int64_t cm_in_memory_logger_n(const cm_in_memory_logger *lg) { return lg ? lg->n : 0; }

const cm_log_record *cm_in_memory_logger_record(const cm_in_memory_logger *lg, int64_t i) {
    return lg && i >= 0 && i < lg->n ? &lg->recs[i] : NULL;
}

int64_t cm_in_memory_logger_count(const cm_in_memory_logger *lg, const char *name) {
    int64_t c = 0;
    for (int64_t i = 0; lg && name && i < lg->n; i++) c += !strcmp(lg->recs[i].name, name);
    return c;
}

cm_status cm_in_memory_logger_last(const cm_in_memory_logger *lg, const char *name, double *out) {
    for (int64_t i = lg ? lg->n - 1 : -1; name && i >= 0; i--) {
        if (!strcmp(lg->recs[i].name, name)) {
            *out = lg->recs[i].value;
            return CM_OK;
        }
    }
    return cm_set_error(CM_ERR_NOT_FOUND, "InMemoryLogger: nothing was logged as '%s'", name ? name : "(null)");
}

const char *cm_in_memory_logger_hparam(const cm_in_memory_logger *lg, const char *key) {
    for (int64_t i = lg ? lg->n_hp - 1 : -1; key && i >= 0; i--)
        if (!strcmp(lg->hps[i].key, key)) return lg->hps[i].value;
    return NULL;
}

int64_t cm_in_memory_logger_text_count(const cm_in_memory_logger *lg, const char *key) {
    int64_t c = 0;
    for (int64_t i = 0; lg && key && i < lg->n_text; i++) c += !strcmp(lg->texts[i].key, key);
    return c;
}

const char *cm_in_memory_logger_text(const cm_in_memory_logger *lg, const char *key) {
    for (int64_t i = lg ? lg->n_text - 1 : -1; key && i >= 0; i--)
        if (!strcmp(lg->texts[i].key, key)) return lg->texts[i].value;
    return NULL;
}
