/* Private pieces shared by the logger destinations: the run folder helpers for an explicit
 * folder, and the console text formatter used by the ConsoleLogger (to its stream) and the
 * FileLogger (to log.txt), so both print the same blocks. */
#ifndef CM_LOGGERS_IMPL_H
#define CM_LOGGERS_IMPL_H

#include <composer/loggers.h>

/* mkdir -p `dir` and check it is writable; CM_ERR_IO naming the path and the reason. */
cm_status cmi_folder_make(const char *dir);

/* A copy of s with cm_alloc (NULL for NULL or on OOM). */
char *cmi_strdup(const char *s);

/* Whether a metric name is an algorithm trace ("traces/..."). */
bool cmi_is_trace(const char *name);

/* Checks a ConsoleLogger-style log_interval (ba or ep, positive). `who` names the logger. */
cm_status cmi_check_log_interval(const char *who, cm_time iv);

/* Ordered name -> latest value list (first-logged order kept when a name is logged again). */
typedef struct cmi_kv {
    char *name;
    double value;
} cmi_kv;
typedef struct cmi_kvlist {
    cmi_kv *v;
    int n, cap;
} cmi_kvlist;
cm_status cmi_kvlist_set(cmi_kvlist *l, const char *name, double value);
void cmi_kvlist_clear(cmi_kvlist *l); /* drops the entries, keeps the storage */
void cmi_kvlist_free(cmi_kvlist *l);

typedef struct cmi_hp {
    char *key, *value; /* value already formatted as a YAML scalar */
} cmi_hp;

/* Composer's ConsoleLogger text: hyperparameter block, train blocks per interval, eval blocks. */
typedef struct cmi_console {
    FILE *out;
    cm_time interval;
    bool log_traces;
    cmi_kvlist train, eval;
    cmi_hp *hps;
    int n_hp, cap_hp;
    bool hparams_printed, in_eval, any_batch;
    int64_t last_logged_batch, eval_batches;
} cmi_console;

void cmi_console_init(cmi_console *c, FILE *out, cm_time interval, bool log_traces);
void cmi_console_deinit(cmi_console *c);
cm_status cmi_console_log_metrics(cmi_console *c, const cm_metric_value *v, int n);
cm_status cmi_console_log_hparams(cmi_console *c, const cm_hparam *h, int n);
/* Prints what is due on `ev`. `hparams` false: never print the hyperparameter block (ranks > 0). */
void cmi_console_run_event(cmi_console *c, cm_event ev, const cm_state *st, bool hparams);

/* A YAML scalar for a string, in a new cm_alloc'd string: plain when YAML reads it back as the
 * same string, else single-quoted (double-quoted with escapes when it has control characters).
 * NULL on OOM. */
char *cmi_yaml_scalar(const char *s);

#endif
