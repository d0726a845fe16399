/* The console text of Composer's ConsoleLogger, shared by the ConsoleLogger and the FileLogger's
 * log.txt: the hyperparameters as a YAML block at the start, blocks of train metrics every
 * log_interval, and a block of eval metrics at each EVAL_END. */
#include "loggers_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

cm_status cmi_check_log_interval(const char *who, cm_time iv) {
    if (iv.unit != CM_TIME_BATCH && iv.unit != CM_TIME_EPOCH) {
        char b[CM_TIME_STR_MAX];
        cm_time_to_string(iv, b, sizeof b);
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: log_interval '%s' must be in batches or epochs (e.g. \"1ba\", \"1ep\")",
                            who, b);
    }
    if (iv.count <= 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: log_interval must be positive, got %lld%s", who,
                            (long long)iv.count, cm_time_unit_name(iv.unit));
    return CM_OK;
}

/* ---- ordered name -> value list ------------------------------------------------------------ */

cm_status cmi_kvlist_set(cmi_kvlist *l, const char *name, double value) {
    for (int i = 0; i < l->n; i++) {
        if (!strcmp(l->v[i].name, name)) {
            l->v[i].value = value;
            return CM_OK;
        }
    }
    if (l->n == l->cap) {
        int ncap = l->cap ? l->cap * 2 : 16;
        cmi_kv *nv = cm_alloc(sizeof *nv * (size_t)ncap, 16);
        if (!nv) return cm_set_error(CM_ERR_OOM, "logger: no memory for %d metric names", ncap);
        if (l->n) memcpy(nv, l->v, sizeof *nv * (size_t)l->n);
        cm_free(l->v);
        l->v = nv;
        l->cap = ncap;
    }
    char *d = cmi_strdup(name);
    if (!d) return cm_set_error(CM_ERR_OOM, "logger: no memory for the metric name '%s'", name);
    l->v[l->n++] = (cmi_kv){d, value};
    return CM_OK;
}

void cmi_kvlist_clear(cmi_kvlist *l) {
    for (int i = 0; i < l->n; i++) cm_free(l->v[i].name);
    l->n = 0;
}

void cmi_kvlist_free(cmi_kvlist *l) {
    cmi_kvlist_clear(l);
    cm_free(l->v);
    *l = (cmi_kvlist){0};
}

/* ---- YAML scalars -------------------------------------------------------------------------- */

static bool looks_numeric(const char *s) {
    if (!strchr("0123456789+-.", s[0])) return false;
    for (const char *c = s; *c; c++)
        if (!strchr("0123456789abcdefABCDEFxXoO._:+-", *c)) return false;
    return true;
}

static bool reserved_word(const char *s) {
    static const char *const words[] = {"true", "false", "yes", "no", "on", "off", "null", "~", "y", "n",
                                        ".inf", "-.inf", "+.inf", ".nan"};
    for (size_t i = 0; i < sizeof words / sizeof *words; i++)
        if (!strcasecmp(s, words[i])) return true;
    return false;
}

char *cmi_yaml_scalar(const char *s) {
    if (!s) s = "";
    size_t len = strlen(s);
    bool control = false;
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) control |= *c < 0x20 || *c == 0x7f;
    bool quote = control || len == 0 || strchr("-?:,[]{}#&*!|>'\"%@` ", s[0]) || s[len - 1] == ' ' ||
                 s[len - 1] == ':' || strstr(s, ": ") || strstr(s, " #") || reserved_word(s) || looks_numeric(s);
    if (!quote) return cmi_strdup(s);
    char *out = cm_alloc(len * 4 + 3, 8); /* worst case: every byte as \xNN */
    if (!out) return NULL;
    size_t k = 0;
    if (!control) {
        out[k++] = '\'';
        for (const char *c = s; *c; c++) {
            if (*c == '\'') out[k++] = '\'';
            out[k++] = *c;
        }
        out[k++] = '\'';
    } else {
        out[k++] = '"';
        for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
            if (*c == '"' || *c == '\\') out[k++] = '\\', out[k++] = (char)*c;
            else if (*c == '\n') out[k++] = '\\', out[k++] = 'n';
            else if (*c == '\t') out[k++] = '\\', out[k++] = 't';
            else if (*c < 0x20 || *c == 0x7f) k += (size_t)sprintf(out + k, "\\x%02x", *c);
            else out[k++] = (char)*c;
        }
        out[k++] = '"';
    }
    out[k] = '\0';
    return out;
}

/* ---- the console ---------------------------------------------------------------------------- */

void cmi_console_init(cmi_console *c, FILE *out, cm_time interval, bool log_traces) {
    *c = (cmi_console){.out = out, .interval = interval, .log_traces = log_traces};
}

void cmi_console_deinit(cmi_console *c) {
    cmi_kvlist_free(&c->train);
    cmi_kvlist_free(&c->eval);
    for (int i = 0; i < c->n_hp; i++) cm_free(c->hps[i].key), cm_free(c->hps[i].value);
    cm_free(c->hps);
    c->hps = NULL;
    c->n_hp = c->cap_hp = 0;
}

cm_status cmi_console_log_metrics(cmi_console *c, const cm_metric_value *v, int n) {
    cmi_kvlist *l = c->in_eval ? &c->eval : &c->train;
    for (int i = 0; i < n; i++) {
        if (!v[i].name || (!c->log_traces && cmi_is_trace(v[i].name))) continue;
        cm_status s = cmi_kvlist_set(l, v[i].name, v[i].value);
        if (s) return s;
    }
    return CM_OK;
}

static char *format_number(double x) {
    char b[40];
    if (isnan(x)) snprintf(b, sizeof b, ".nan");
    else if (isinf(x)) snprintf(b, sizeof b, x > 0 ? ".inf" : "-.inf");
    else if (x == floor(x) && fabs(x) < 9e15) snprintf(b, sizeof b, "%lld", (long long)x);
    else cm_format_double_shortest(x, b, sizeof b);
    return cmi_strdup(b);
}

cm_status cmi_console_log_hparams(cmi_console *c, const cm_hparam *h, int n) {
    for (int i = 0; i < n; i++) {
        if (!h[i].key) continue;
        char *val = h[i].kind == CM_HPARAM_STRING ? cmi_yaml_scalar(h[i].string)
                    : h[i].kind == CM_HPARAM_BOOL ? cmi_strdup(h[i].number != 0 ? "true" : "false")
                                                  : format_number(h[i].number);
        if (!val) return cm_set_error(CM_ERR_OOM, "logger: no memory for hyperparameter '%s'", h[i].key);
        int j = 0;
        while (j < c->n_hp && strcmp(c->hps[j].key, h[i].key)) j++;
        if (j < c->n_hp) { /* logged again: the latest value wins */
            cm_free(c->hps[j].value);
            c->hps[j].value = val;
            continue;
        }
        if (c->n_hp == c->cap_hp) {
            int ncap = c->cap_hp ? c->cap_hp * 2 : 16;
            cmi_hp *nh = cm_alloc(sizeof *nh * (size_t)ncap, 16);
            if (!nh) {
                cm_free(val);
                return cm_set_error(CM_ERR_OOM, "logger: no memory for %d hyperparameters", ncap);
            }
            if (c->n_hp) memcpy(nh, c->hps, sizeof *nh * (size_t)c->n_hp);
            cm_free(c->hps);
            c->hps = nh;
            c->cap_hp = ncap;
        }
        char *key = cmi_strdup(h[i].key);
        if (!key) {
            cm_free(val);
            return cm_set_error(CM_ERR_OOM, "logger: no memory for hyperparameter '%s'", h[i].key);
        }
        c->hps[c->n_hp++] = (cmi_hp){key, val};
    }
    return CM_OK;
}

static int hp_cmp(const void *a, const void *b) {
    return strcmp(((const cmi_hp *)a)->key, ((const cmi_hp *)b)->key);
}

/* Composer prints `yaml.dump(hparams)` (keys sorted) between two lines of 30 stars. */
static void print_hparams(cmi_console *c) {
    qsort(c->hps, (size_t)c->n_hp, sizeof *c->hps, hp_cmp);
    fputs("******************************\nConfig:\n", c->out);
    for (int i = 0; i < c->n_hp; i++) fprintf(c->out, "%s: %s\n", c->hps[i].key, c->hps[i].value);
    fputs("******************************\n", c->out);
    fflush(c->out);
}

static bool is_count(const char *name) { return !strncmp(name, "time/", 5) || !strncmp(name, "trainer/", 8); }

static void print_block(cmi_console *c, const char *header, const char *prefix, const cmi_kvlist *l) {
    fprintf(c->out, "%s:\n", header);
    for (int i = 0; i < l->n; i++) {
        char b[CM_FORMAT_MAX];
        double x = l->v[i].value;
        if (is_count(l->v[i].name) && isfinite(x) && x == floor(x) && fabs(x) < 9e15)
            snprintf(b, sizeof b, "%lld", (long long)x);
        else
            cm_format_metric(x, b, sizeof b);
        fprintf(c->out, "\t %s%s: %s\n", prefix, l->v[i].name, b);
    }
    fflush(c->out);
}

/* The run's length in `unit` (batches or epochs), or -1 when it cannot be told. */
static int64_t total_in(const cm_state *st, cm_time_unit unit) {
    cm_time md = cm_state_max_duration(st);
    int64_t bpe = cm_state_batches_per_epoch(st);
    if (md.count <= 0) return -1;
    if (md.unit == unit) return md.count;
    if (unit == CM_TIME_BATCH && md.unit == CM_TIME_EPOCH && bpe > 0) return md.count * bpe;
    if (unit == CM_TIME_EPOCH && md.unit == CM_TIME_BATCH && bpe > 0) return (md.count + bpe - 1) / bpe;
    return -1;
}

static void print_train(cmi_console *c, const cm_state *st) {
    const cm_timestamp *ts = cm_state_timestamp(st);
    const bool ep = c->interval.unit == CM_TIME_EPOCH;
    int64_t cur = ep ? ts->epoch : ts->batch, total = total_in(st, ep ? CM_TIME_EPOCH : CM_TIME_BATCH);
    char header[96];
    if (total >= 0)
        snprintf(header, sizeof header, "[%s=%lld/%lld]", ep ? "epoch" : "batch", (long long)cur, (long long)total);
    else
        snprintf(header, sizeof header, "[%s=%lld]", ep ? "epoch" : "batch", (long long)cur);
    print_block(c, header, "Train ", &c->train);
    c->last_logged_batch = ts->batch;
    cmi_kvlist_clear(&c->train);
}

void cmi_console_run_event(cmi_console *c, cm_event ev, const cm_state *st, bool hparams) {
    const cm_timestamp *ts = cm_state_timestamp(st);
    switch (ev) {
    case CM_EVENT_FIT_START:
    case CM_EVENT_EVAL_STANDALONE_START:
    case CM_EVENT_PREDICT_START:
        if (hparams && !c->hparams_printed && c->n_hp > 0) print_hparams(c);
        c->hparams_printed = true;
        break;
    case CM_EVENT_BATCH_END:
        if (c->interval.unit == CM_TIME_BATCH && (ts->batch % c->interval.count == 0 || c->last_logged_batch == 0))
            print_train(c, st);
        break;
    case CM_EVENT_EPOCH_END:
        if (c->interval.unit == CM_TIME_EPOCH && (ts->epoch % c->interval.count == 0 || c->last_logged_batch == 0))
            print_train(c, st);
        break;
    case CM_EVENT_FIT_END:
        if (c->last_logged_batch != ts->batch && c->train.n > 0) print_train(c, st);
        cmi_kvlist_clear(&c->train);
        break;
    case CM_EVENT_EVAL_START:
        c->in_eval = true;
        c->eval_batches = 0;
        cmi_kvlist_clear(&c->eval);
        break;
    case CM_EVENT_EVAL_BATCH_END:
        c->eval_batches++;
        break;
    case CM_EVENT_EVAL_END: {
        char header[96];
        snprintf(header, sizeof header, "[Eval batch=%lld/%lld]", (long long)c->eval_batches,
                 (long long)c->eval_batches);
        print_block(c, header, "Eval ", &c->eval);
        cmi_kvlist_clear(&c->eval);
        c->in_eval = false;
        break;
    }
    default:
        break;
    }
}
