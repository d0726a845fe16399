/* TensorBoardLogger: scalars, hyperparameters as text and parameter/gradient histograms in a
 * tfevents file under <log_dir>/<run name>/ (Composer's TensorboardLogger, without torch). */
#include "loggers_impl.h"
#include "tb_events.h"
#include "wire.h"

#include <composer/nn.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    /* configuration */
    char *log_dir;
    int64_t flush_interval, histogram_interval;
    bool rank_zero_only, log_traces, hist_params, hist_grads;
    /* the run */
    bool initialised, writes, broken, warned_nonfinite;
    char *dir, *file;
    cmi_tb_writer *w;
    int64_t step; /* the last timestamp's batch (for hyperparameters, which come without one) */
    cmi_hp *hps;
    int n_hp, cap_hp;
    double *scratch; /* histogram sums (sharded runs) */
    size_t scratch_n;
} tb_logger;

static volatile int g_file_counter; /* the <n> of the file name, per process (as TensorBoard's writer) */

cm_tensorboard_logger_config cm_tensorboard_logger_config_default(void) {
    return (cm_tensorboard_logger_config){
        .log_dir = "tensorboard_logs",
        .flush_interval = 100,
        .rank_zero_only = true,
        .log_traces = false,
        .histogram_interval = 0,
        .histogram_params = true,
        .histogram_grads = true,
    };
}

/* A write error: reported once; the logger stops writing and training goes on. */
static void fail(tb_logger *lg, const char *what) {
    if (lg->broken) return;
    lg->broken = true;
    cm_log_msg(CM_LOG_WARN, "TensorBoardLogger: %s; no more events go to '%s' (training goes on; the other loggers "
                            "keep the metrics)",
               what, lg->file ? lg->file : lg->dir ? lg->dir : "?");
}

static void check(tb_logger *lg, cm_status s) {
    if (s) fail(lg, cm_last_error());
}

static cm_status tb_init(void *self, const cm_state *st) {
    tb_logger *lg = self;
    if (lg->initialised)
        return cm_set_error(CM_ERR_STATE, "TensorBoardLogger: already initialised (one logger per trainer)");
    lg->initialised = true;
    lg->writes = !lg->rank_zero_only || cm_state_rank(st) == 0;
    if (!lg->writes) return CM_OK;
    const char *run = cm_state_run_name(st);
    cmi_buf p = {0};
    cmi_buf_printf(&p, "%s/%s", lg->log_dir, run && run[0] ? run : "run");
    if (p.oom) return cm_set_error(CM_ERR_OOM, "TensorBoardLogger: out of memory");
    lg->dir = cmi_strdup(cmi_buf_str(&p));
    cmi_buf_free(&p);
    if (!lg->dir) return cm_set_error(CM_ERR_OOM, "TensorBoardLogger: out of memory");
    cm_status s = cmi_folder_make(lg->dir);
    if (s) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "TensorBoardLogger: log_dir: %s", msg);
    }
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    const double now = cmi_unix_time();
    const int n = __atomic_fetch_add(&g_file_counter, 1, __ATOMIC_RELAXED);
    cmi_buf f = {0};
    cmi_buf_printf(&f, "%s/events.out.tfevents.%010lld.%s.%ld.%d", lg->dir, (long long)now, host, (long)getpid(), n);
    if (f.oom) return cm_set_error(CM_ERR_OOM, "TensorBoardLogger: out of memory");
    s = cmi_tb_open(cmi_buf_str(&f), now, &lg->w);
    if (!s && !(lg->file = cmi_strdup(cmi_buf_str(&f)))) s = cm_set_error(CM_ERR_OOM, "TensorBoardLogger: out of memory");
    cmi_buf_free(&f);
    return s;
}

static bool active(const tb_logger *lg) { return lg->w && !lg->broken; }

static cm_status tb_log_metrics(void *self, const cm_metric_value *v, int n, const cm_timestamp *ts) {
    tb_logger *lg = self;
    if (ts) lg->step = ts->batch;
    if (!active(lg)) return CM_OK;
    const double now = cmi_unix_time();
    for (int i = 0; i < n && !lg->broken; i++) {
        if (!v[i].name || !v[i].name[0] || (!lg->log_traces && cmi_is_trace(v[i].name))) continue;
        check(lg, cmi_tb_scalar(lg->w, v[i].name, (float)v[i].value, lg->step, now));
    }
    return CM_OK;
}

/* ---- hyperparameters: a Markdown table in a text summary ---- */

static char *hp_value(const cm_hparam *h) {
    char b[64];
    if (h->kind == CM_HPARAM_STRING) return cmi_strdup(h->string ? h->string : "");
    if (h->kind == CM_HPARAM_BOOL) return cmi_strdup(h->number != 0 ? "true" : "false");
    if (h->number == floor(h->number) && fabs(h->number) < 9e15) snprintf(b, sizeof b, "%lld", (long long)h->number);
    else cm_format_double_shortest(h->number, b, sizeof b);
    return cmi_strdup(b);
}

static int hp_cmp(const void *a, const void *b) { return strcmp(((const cmi_hp *)a)->key, ((const cmi_hp *)b)->key); }

/* Markdown table cell: '|' escaped, line breaks as spaces. */
static void md_cell(cmi_buf *b, const char *s) {
    for (; *s; s++) {
        if (*s == '|') cmi_buf_puts(b, "\\|");
        else if (*s == '\n' || *s == '\r') cmi_buf_putc(b, ' ');
        else cmi_buf_putc(b, *s);
    }
}

static cm_status tb_log_hparams(void *self, const cm_hparam *h, int n) {
    tb_logger *lg = self;
    if (!lg->writes) return CM_OK;
    for (int i = 0; i < n; i++) {
        if (!h[i].key) continue;
        char *val = hp_value(&h[i]);
        if (!val) return cm_set_error(CM_ERR_OOM, "TensorBoardLogger: no memory for hyperparameter '%s'", h[i].key);
        int j = 0;
        while (j < lg->n_hp && strcmp(lg->hps[j].key, h[i].key)) j++;
        if (j < lg->n_hp) {
            cm_free(lg->hps[j].value);
            lg->hps[j].value = val;
            continue;
        }
        if (lg->n_hp == lg->cap_hp) {
            int ncap = lg->cap_hp ? 2 * lg->cap_hp : 16;
            cmi_hp *nh = cm_alloc(sizeof *nh * (size_t)ncap, 16);
            if (!nh) {
                cm_free(val);
                return cm_set_error(CM_ERR_OOM, "TensorBoardLogger: no memory for hyperparameters");
            }
            if (lg->n_hp) memcpy(nh, lg->hps, sizeof *nh * (size_t)lg->n_hp);
            cm_free(lg->hps);
            lg->hps = nh, lg->cap_hp = ncap;
        }
        char *key = cmi_strdup(h[i].key);
        if (!key) {
            cm_free(val);
            return cm_set_error(CM_ERR_OOM, "TensorBoardLogger: no memory for hyperparameter '%s'", h[i].key);
        }
        lg->hps[lg->n_hp++] = (cmi_hp){key, val};
    }
    if (!active(lg) || lg->n_hp == 0) return CM_OK;
    qsort(lg->hps, (size_t)lg->n_hp, sizeof *lg->hps, hp_cmp);
    cmi_buf t = {0};
    cmi_buf_puts(&t, "| key | value |\n|---|---|\n");
    for (int i = 0; i < lg->n_hp; i++) {
        cmi_buf_puts(&t, "| ");
        md_cell(&t, lg->hps[i].key);
        cmi_buf_puts(&t, " | ");
        md_cell(&t, lg->hps[i].value);
        cmi_buf_puts(&t, " |\n");
    }
    if (t.oom) check(lg, cm_set_error(CM_ERR_OOM, "out of memory for the hyperparameter table"));
    else check(lg, cmi_tb_text(lg->w, "hyperparameters", cmi_buf_str(&t), lg->step, cmi_unix_time()));
    cmi_buf_free(&t);
    return CM_OK;
}

/* ---- histograms ---- */

/* Per histogram: counts (nb), then num, sum, sum of squares, then min and max per rank (2·W). */
typedef struct {
    int nb, world, rank;
    size_t per; /* doubles per histogram */
} hist_layout;

static void hist_add(const hist_layout *L, double *h, const float *x, int64_t n, int64_t *nonfinite) {
    double *c = h, *tot = h + L->nb, *mm = tot + 3;
    double lo = INFINITY, hi = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        const double v = x[i];
        if (!isfinite(v)) {
            (*nonfinite)++;
            continue;
        }
        c[cmi_tb_bucket_of(v)] += 1.0;
        tot[0] += 1.0, tot[1] += v, tot[2] += v * v;
        lo = v < lo ? v : lo, hi = v > hi ? v : hi;
    }
    /* this rank's slot; other ranks' slots stay 0 and the sum over ranks fills them */
    mm[2 * L->rank] = lo, mm[2 * L->rank + 1] = hi;
}

static cm_status write_hist(tb_logger *lg, const hist_layout *L, const char *tag, const double *h, int64_t step,
                            double now) {
    const double *tot = h + L->nb, *mm = tot + 3;
    double lo = INFINITY, hi = -INFINITY;
    for (int r = 0; r < L->world; r++) {
        lo = mm[2 * r] < lo ? mm[2 * r] : lo;
        hi = mm[2 * r + 1] > hi ? mm[2 * r + 1] : hi;
    }
    if (tot[0] == 0) lo = hi = 0; /* no finite element: an empty histogram */
    cmi_tb_histo hg = {lo, hi, tot[0], tot[1], tot[2], h};
    return cmi_tb_histogram(lg->w, tag, &hg, step, now);
}

static cm_status histograms(tb_logger *lg, const cm_state *st) {
    cm_model *model = cm_state_model(st);
    cm_module *root = model ? cm_model_module(model) : NULL;
    if (!root || !cm_module_is_finalized(root)) return CM_OK;
    int n_sh = 0;
    const cm_shard_span *sh = cm_state_shard_spans(st, &n_sh);
    const bool sharded = sh && n_sh > 0;
    if (!sharded && !active(lg)) return CM_OK; /* nothing to write and no collective to join */
    hist_layout L = {.nb = cmi_tb_n_buckets(), .world = sharded ? cm_state_world_size(st) : 1,
                     .rank = sharded ? cm_state_rank(st) : 0};
    L.per = (size_t)L.nb + 3 + 2 * (size_t)L.world;
    const int64_t np = cm_module_n_params(root);
    const int kinds = (lg->hist_params ? 1 : 0) + (lg->hist_grads ? 1 : 0);
    const size_t need = L.per * (size_t)(np * kinds);
    if (need > lg->scratch_n) {
        cm_free(lg->scratch);
        lg->scratch = cm_alloc(sizeof *lg->scratch * (need ? need : 1), 64);
        lg->scratch_n = lg->scratch ? need : 0;
        if (!lg->scratch)
            return cm_set_error(CM_ERR_OOM, "TensorBoardLogger: no memory for %lld histograms", (long long)(np * kinds));
    }
    memset(lg->scratch, 0, sizeof *lg->scratch * need);
    int64_t nonfinite = 0;
    for (int64_t i = 0, k = 0; i < np; i++) {
        const cm_param_info p = cm_module_param_info(root, i);
        const cm_unit_info *u = cm_module_unit(root, p.unit);
        for (int kind = 0; kind < 2; kind++) {
            if ((kind == 0 && !lg->hist_params) || (kind == 1 && !lg->hist_grads)) continue;
            double *h = lg->scratch + L.per * (size_t)k++;
            const float *base = NULL;
            int64_t lo = p.offset, hi = p.offset + p.numel, at = 0;
            if (sharded) {
                const cm_shard_span *sp = &sh[p.unit];
                lo = lo > sp->begin ? lo : sp->begin;
                hi = hi < sp->end ? hi : sp->end;
                base = sp->replica ? NULL : kind == 0 ? sp->params : sp->grads; /* a replica's piece counts once, elsewhere */
                at = sp->begin;
            } else if (u) {
                base = kind == 0 ? u->params : u->grads;
            }
            if (kind == 1 && !p.requires_grad) base = NULL; /* frozen: no gradient */
            if (base && hi > lo) hist_add(&L, h, base + (lo - at), hi - lo, &nonfinite);
            else hist_add(&L, h, NULL, 0, &nonfinite);
        }
    }
    if (sharded) {
        cm_status s = cm_state_all_reduce_sum(st, lg->scratch, (int)need);
        if (s) return s; /* a failed collective is the run's failure, not the logger's */
        double nf = (double)nonfinite;
        if ((s = cm_state_all_reduce_sum(st, &nf, 1))) return s;
        nonfinite = (int64_t)nf;
    }
    if (!active(lg)) return CM_OK;
    if (nonfinite && !lg->warned_nonfinite) {
        lg->warned_nonfinite = true;
        cm_log_msg(CM_LOG_WARN, "TensorBoardLogger: %lld NaN or infinite parameter/gradient elements at batch %lld are "
                                "left out of the histograms",
                   (long long)nonfinite, (long long)cm_state_timestamp(st)->batch);
    }
    const int64_t step = cm_state_timestamp(st)->batch;
    const double now = cmi_unix_time();
    cmi_buf tag = {0};
    for (int64_t i = 0, k = 0; i < np && !lg->broken; i++) {
        const cm_param_info p = cm_module_param_info(root, i);
        for (int kind = 0; kind < 2 && !lg->broken; kind++) {
            if ((kind == 0 && !lg->hist_params) || (kind == 1 && !lg->hist_grads)) continue;
            const double *h = lg->scratch + L.per * (size_t)k++;
            if (kind == 1 && !p.requires_grad) continue;
            cmi_buf_reset(&tag);
            cmi_buf_printf(&tag, "%s/%s", kind == 0 ? "parameters" : "gradients", p.name);
            if (tag.oom) check(lg, cm_set_error(CM_ERR_OOM, "out of memory for a histogram tag"));
            else check(lg, write_hist(lg, &L, cmi_buf_str(&tag), h, step, now));
        }
    }
    cmi_buf_free(&tag);
    return CM_OK;
}

static void flush(tb_logger *lg) {
    if (active(lg)) check(lg, cmi_tb_flush(lg->w));
}

static cm_status tb_run_event(void *self, cm_event ev, const cm_state *st) {
    tb_logger *lg = self;
    switch (ev) {
    case CM_EVENT_BATCH_END: {
        const int64_t b = cm_state_timestamp(st)->batch;
        lg->step = b;
        if (lg->histogram_interval > 0 && b % lg->histogram_interval == 0) {
            cm_status s = histograms(lg, st);
            if (s) {
                if (s != CM_ERR_OOM) return s;
                fail(lg, cm_last_error());
            }
        }
        if (b % lg->flush_interval == 0) flush(lg);
        break;
    }
    case CM_EVENT_EVAL_START:
    case CM_EVENT_EVAL_END:
    case CM_EVENT_EPOCH_END:
    case CM_EVENT_FIT_END:
        flush(lg);
        break;
    default:
        break;
    }
    return CM_OK;
}

static cm_status tb_flush(void *self) {
    flush(self);
    return CM_OK;
}

static cm_status tb_close(void *self, const cm_state *st) {
    tb_logger *lg = self;
    if (!lg->w) return CM_OK;
    cm_status s = cmi_tb_close(lg->w);
    if (s && !lg->broken) fail(lg, cm_last_error());
    lg->w = NULL;
    lg->broken = true; /* closed: later calls write nothing */
    return CM_OK;
}

static void tb_free(void *self) {
    tb_logger *lg = self;
    cmi_tb_close(lg->w);
    for (int i = 0; i < lg->n_hp; i++) cm_free(lg->hps[i].key), cm_free(lg->hps[i].value);
    cm_free(lg->hps);
    cm_free(lg->scratch);
    cm_free(lg->log_dir), cm_free(lg->dir), cm_free(lg->file);
    cm_free(lg);
}

static const cm_logger_i tb_vt = {
    .abi = CM_LOGGER_ABI,
    .name = "TensorBoardLogger",
    .init = tb_init,
    .log_hyperparameters = tb_log_hparams,
    .log_metrics = tb_log_metrics,
    .run_event = tb_run_event,
    .flush = tb_flush,
    .close = tb_close,
    .free = tb_free,
};

cm_status cm_tensorboard_logger_new(const cm_tensorboard_logger_config *cfg, cm_logger_plugin *out) {
    if (!cfg || !out)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_tensorboard_logger_new: cfg and out must not be NULL");
    *out = (cm_logger_plugin){0};
    if (cfg->flush_interval < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "TensorBoardLogger: flush_interval must be at least 1 batch, got %lld",
                            (long long)cfg->flush_interval);
    if (cfg->histogram_interval < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "TensorBoardLogger: histogram_interval must be >= 0 batches (0 = no "
                                                "histograms), got %lld",
                            (long long)cfg->histogram_interval);
    if (cfg->histogram_interval > 0 && !cfg->histogram_params && !cfg->histogram_grads)
        return cm_set_error(CM_ERR_INVALID_ARG, "TensorBoardLogger: histogram_interval is %lld but histogram_params and "
                                                "histogram_grads are both false (turn one on, or set the interval to 0)",
                            (long long)cfg->histogram_interval);
    tb_logger *lg = cm_alloc_zeroed(sizeof *lg, 16);
    if (!lg || !(lg->log_dir = cmi_strdup(cfg->log_dir && cfg->log_dir[0] ? cfg->log_dir : "tensorboard_logs"))) {
        cm_free(lg);
        return cm_set_error(CM_ERR_OOM, "cm_tensorboard_logger_new: out of memory");
    }
    size_t l = strlen(lg->log_dir);
    while (l > 1 && lg->log_dir[l - 1] == '/') lg->log_dir[--l] = '\0';
    lg->flush_interval = cfg->flush_interval;
    lg->histogram_interval = cfg->histogram_interval;
    lg->rank_zero_only = cfg->rank_zero_only;
    lg->log_traces = cfg->log_traces;
    lg->hist_params = cfg->histogram_params;
    lg->hist_grads = cfg->histogram_grads;
    *out = (cm_logger_plugin){&tb_vt, lg};
    return CM_OK;
}

const char *cm_tensorboard_logger_file(const cm_logger_plugin *p) {
    if (!p || p->vt != &tb_vt || !p->self) return NULL;
    return ((const tb_logger *)p->self)->file;
}
