/* JSONTraceHandler: Chrome Trace Event JSON per rank per cycle, and the merger of several ranks'
 * files into one trace on rank 0's clock (composer/profiler.h). */
#include "plugins/profiler/profiler_impl.h"
#include "base/json.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Trace files hold long strings (a path per event is not one of them): names are cut here. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

void cm_trace_handler_free(cm_trace_handler h) {
    if (h.vt && h.vt->free && h.self) h.vt->free(h.self);
}

/* ---- formatting paths ---- */

cm_status cmi_trace_format(const char *pattern, const char *run_name, int rank, int world_size,
                           const cm_timestamp *ts, char *out, size_t cap) {
    size_t k = 0;
    for (const char *p = pattern; *p;) {
        if (*p != '{') {
            if (k + 1 >= cap) goto too_long;
            out[k++] = *p++;
            continue;
        }
        const char *close = strchr(p, '}');
        if (!close)
            return cm_set_error(CM_ERR_INVALID_ARG, "trace path '%s': an unclosed '{' (placeholders: {run_name}, "
                                                    "{rank}, {world_size}, {epoch}, {batch}, {sample}, {token})",
                                pattern);
        char key[32];
        snprintf(key, sizeof key, "%.*s", (int)(close - p - 1), p + 1);
        char val[160];
        if (!strcmp(key, "run_name")) snprintf(val, sizeof val, "%s", run_name ? run_name : "");
        else if (!strcmp(key, "rank")) snprintf(val, sizeof val, "%d", rank);
        else if (!strcmp(key, "world_size")) snprintf(val, sizeof val, "%d", world_size);
        else if (ts && !strcmp(key, "epoch")) snprintf(val, sizeof val, "%lld", (long long)ts->epoch);
        else if (ts && !strcmp(key, "batch")) snprintf(val, sizeof val, "%lld", (long long)ts->batch);
        else if (ts && !strcmp(key, "sample")) snprintf(val, sizeof val, "%lld", (long long)ts->sample);
        else if (ts && !strcmp(key, "token")) snprintf(val, sizeof val, "%lld", (long long)ts->token);
        else
            return cm_set_error(CM_ERR_INVALID_ARG, "trace path '%s': unknown placeholder '{%s}' (use {run_name}, "
                                                    "{rank}, {world_size}%s)",
                                pattern, key, ts ? ", {epoch}, {batch}, {sample} or {token}" : "; the time fields "
                                                                                              "only in filename");
        const size_t n = strlen(val);
        if (k + n + 1 > cap) goto too_long;
        memcpy(out + k, val, n);
        k += n;
        p = close + 1;
    }
    out[k] = '\0';
    return CM_OK;
too_long:
    return cm_set_error(CM_ERR_INVALID_ARG, "trace path '%s' is longer than %zu bytes once expanded", pattern, cap - 1);
}

static cm_status mkdirs(const char *path) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
            return cm_set_error(CM_ERR_IO, "JSONTraceHandler: cannot create '%s': %s", tmp, strerror(errno));
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return cm_set_error(CM_ERR_IO, "JSONTraceHandler: cannot create the trace folder '%s': %s", tmp, strerror(errno));
    return CM_OK;
}

/* ---- writing one rank's file ---- */

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        switch (*c) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\t': fputs("\\t", f); break;
        case '\r': fputs("\\r", f); break;
        default:
            if (*c < 0x20) fprintf(f, "\\u%04x", *c);
            else fputc(*c, f);
        }
    }
    fputc('"', f);
}

/* Microseconds with three decimals, exactly (ns are integers). */
static void json_us(FILE *f, int64_t ns) {
    const char *sign = ns < 0 ? "-" : "";
    const int64_t a = ns < 0 ? -ns : ns;
    fprintf(f, "%s%lld.%03lld", sign, (long long)(a / 1000), (long long)(a % 1000));
}

static void meta(FILE *f, bool *first, const char *name, int pid, int tid, const char *key, const char *sval,
                 long long ival) {
    fputs(*first ? "" : ",\n", f);
    *first = false;
    fprintf(f, "{\"name\": \"%s\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"%s\": ", name, pid, tid, key);
    if (sval) json_str(f, sval);
    else fprintf(f, "%lld", ival);
    fputs("}}", f);
}

/* Times are written relative to `base_ns` (a whole second of the wall clock, the same for every
 * cycle of the handler), so they stay exact through a reader's doubles; the base is given as
 * wall_clock_base_us and the clock sync is relative to it too (merging only uses differences). */
static cm_status write_trace(const char *path, const cm_trace_cycle *c, int rank, int64_t base_ns) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return cm_set_error(CM_ERR_IO, "JSONTraceHandler: cannot write '%s': %s", tmp, strerror(errno));
    fputs("[\n", f);
    bool first = true;
    const int main_tid = c->n_threads > 0 ? c->threads[0].tid : 0;
    char pname[64];
    snprintf(pname, sizeof pname, "Rank %d training loop process", rank);
    meta(f, &first, "process_name", rank, main_tid, "name", pname, 0);
    for (int i = 0; i < c->n_threads; i++) {
        meta(f, &first, "thread_name", rank, c->threads[i].tid, "name", c->threads[i].name, 0);
        meta(f, &first, "thread_sort_index", rank, c->threads[i].tid, "sort_index", NULL, i);
    }
    meta(f, &first, "global_rank", rank, main_tid, "value", NULL, rank);
    meta(f, &first, "process_sort_index", rank, main_tid, "sort_index", NULL, rank);
    meta(f, &first, "wall_clock_base_us", rank, main_tid, "value", NULL, (long long)(base_ns / 1000));
    meta(f, &first, "clock_sync_timestamp_us", rank, main_tid, "value", NULL,
         (long long)((c->clock_sync_ns - base_ns) / 1000));
    meta(f, &first, "clock_sync_error_bound", rank, main_tid, "value", NULL, (long long)(c->clock_sync_error_ns / 1000));
    meta(f, &first, "cycle", rank, main_tid, "value", NULL, (long long)c->cycle);
    for (int64_t i = 0; i < c->n_events; i++) {
        const cm_trace_event *e = &c->events[i];
        fputs(",\n{\"name\": ", f);
        json_str(f, e->name);
        if (e->cat && e->cat[0]) {
            fputs(", \"cat\": ", f);
            json_str(f, e->cat);
        }
        fprintf(f, ", \"ph\": \"%c\", \"ts\": ", e->ph);
        json_us(f, e->ts_ns - base_ns);
        if (e->ph == 'X') {
            fputs(", \"dur\": ", f);
            json_us(f, e->dur_ns);
        }
        if (e->ph == 'b' || e->ph == 'e') fprintf(f, ", \"id\": %llu", (unsigned long long)e->id);
        if (e->ph == 'i') fputs(", \"s\": \"t\"", f);
        fprintf(f, ", \"pid\": %d, \"tid\": %d", e->pid, e->tid);
        if (e->args) fprintf(f, ", \"args\": %s", e->args);
        fputc('}', f);
    }
    fputs("\n]\n", f);
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0) bad = true;
    if (bad || rename(tmp, path) != 0) {
        cm_status s = cm_set_error(CM_ERR_IO, "JSONTraceHandler: writing '%s' failed: %s", path, strerror(errno));
        unlink(tmp);
        return s;
    }
    return CM_OK;
}

/* ---- the handler ---- */

typedef struct saved {
    char **paths; /* one per rank */
} saved;

typedef struct json_handler {
    char *folder_fmt, *filename_fmt, *merged_fmt;
    bool overwrite;
    int keep;
    /* the run */
    char folder[4096], merged[4096], run_name[128];
    int rank, world;
    cm_status (*barrier)(void *);
    void *barrier_data;
    int64_t base_ns; /* times in the files are relative to it (0: not chosen yet) */
    saved *saves; /* every cycle's files (NULL paths once deleted) */
    int n_saves, cap_saves;
} json_handler;

static char *dup_or_null(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = cm_alloc(n, 1);
    if (d) memcpy(d, s, n);
    return d;
}

cm_json_trace_handler_config cm_json_trace_handler_config_default(void) {
    return (cm_json_trace_handler_config){
        .folder = "{run_name}/traces",
        .filename = "ep{epoch}-ba{batch}-rank{rank}.json",
        .merged_trace_filename = "merged_trace.json",
        .overwrite = false,
        .num_traces_to_keep = -1,
    };
}

static bool dir_empty(const char *path) {
    DIR *d = opendir(path);
    if (!d) return true;
    struct dirent *e;
    bool empty = true;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            empty = false;
            break;
        }
    closedir(d);
    return empty;
}

static cm_status jt_init(void *self, const cm_trace_run *run) {
    json_handler *h = self;
    cm_status s;
    snprintf(h->run_name, sizeof h->run_name, "%s", run->run_name ? run->run_name : "");
    h->rank = run->rank, h->world = run->world_size;
    h->barrier = run->barrier, h->barrier_data = run->barrier_data;
    if ((s = cmi_trace_format(h->folder_fmt, h->run_name, h->rank, h->world, NULL, h->folder, sizeof h->folder)))
        return s;
    /* the time fields are checked once here, with a zero timestamp */
    cm_timestamp zero = {0};
    char probe[4096];
    if ((s = cmi_trace_format(h->filename_fmt, h->run_name, h->rank, h->world, &zero, probe, sizeof probe))) return s;
    h->merged[0] = '\0';
    if (h->merged_fmt) {
        char name[1024];
        if ((s = cmi_trace_format(h->merged_fmt, h->run_name, h->rank, h->world, NULL, name, sizeof name))) return s;
        snprintf(h->merged, sizeof h->merged, "%s/%s", h->folder, name);
    }
    if (!h->overwrite && !dir_empty(h->folder))
        s = cm_set_error(CM_ERR_IO, "JSONTraceHandler: the trace folder '%s' is not empty (set overwrite, or use "
                                    "another folder)", h->folder);
    if (!s) s = mkdirs(h->folder);
    if (!s && h->rank == 0 && h->merged[0]) unlink(h->merged); /* a stale merged trace of an earlier run */
    /* every rank checked the folder before any writes to it (Composer's barrier) */
    cm_status b = h->barrier ? h->barrier(h->barrier_data) : CM_OK;
    return s ? s : b;
}

static cm_status merge_all(json_handler *h) {
    int n = 0;
    for (int i = 0; i < h->n_saves; i++)
        for (int r = 0; r < h->world; r++) n += h->saves[i].paths[r] && access(h->saves[i].paths[r], R_OK) == 0;
    if (!n) return CM_OK;
    const char **in = cm_alloc(sizeof *in * (size_t)n, 16);
    if (!in) return cm_set_error(CM_ERR_OOM, "JSONTraceHandler: out of memory");
    int k = 0;
    for (int i = 0; i < h->n_saves; i++)
        for (int r = 0; r < h->world; r++)
            if (h->saves[i].paths[r] && access(h->saves[i].paths[r], R_OK) == 0) in[k++] = h->saves[i].paths[r];
    if (k < (h->n_saves ? h->world : 0))
        cm_log_msg(CM_LOG_WARN, "JSONTraceHandler: merging %d trace file(s); some ranks' files are not readable "
                                "from rank 0 (another node?)", k);
    cm_status s = cm_trace_merge(in, k, h->merged);
    cm_free(in);
    return s;
}

static cm_status jt_save(void *self, const cm_trace_cycle *c) {
    json_handler *h = self;
    if (h->n_saves == h->cap_saves) {
        const int cap = h->cap_saves ? 2 * h->cap_saves : 8;
        saved *ns = cm_alloc_zeroed(sizeof *ns * (size_t)cap, 16);
        if (!ns) return cm_set_error(CM_ERR_OOM, "JSONTraceHandler: out of memory");
        if (h->n_saves) memcpy(ns, h->saves, sizeof *ns * (size_t)h->n_saves);
        cm_free(h->saves);
        h->saves = ns, h->cap_saves = cap;
    }
    saved *sv = &h->saves[h->n_saves];
    if (!(sv->paths = cm_alloc_zeroed(sizeof *sv->paths * (size_t)h->world, 16)))
        return cm_set_error(CM_ERR_OOM, "JSONTraceHandler: out of memory");
    h->n_saves++;
    cm_status s = CM_OK;
    for (int r = 0; !s && r < h->world; r++) {
        char folder[4096], name[1024], path[8192];
        if ((s = cmi_trace_format(h->folder_fmt, h->run_name, r, h->world, NULL, folder, sizeof folder)) ||
            (s = cmi_trace_format(h->filename_fmt, h->run_name, r, h->world, c->timestamp, name, sizeof name)))
            break;
        snprintf(path, sizeof path, "%s/%s", folder, name);
        if (!(sv->paths[r] = dup_or_null(path))) s = cm_set_error(CM_ERR_OOM, "JSONTraceHandler: out of memory");
    }
    if (!s) {
        char dir[8192];
        snprintf(dir, sizeof dir, "%s", sv->paths[h->rank]);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
        if (slash) s = mkdirs(dir);
    }
    if (!h->base_ns) h->base_ns = c->clock_sync_ns - c->clock_sync_ns % 1000000000;
    if (!s) s = write_trace(sv->paths[h->rank], c, h->rank, h->base_ns);
    /* every rank's file is on disk before rank 0 merges them (all ranks reach the barrier, even
     * one whose write failed, so none waits for ever) */
    cm_status b = h->barrier ? h->barrier(h->barrier_data) : CM_OK;
    if (!s) s = b;
    if (!s && h->rank == 0 && h->merged[0]) s = merge_all(h);
    if (h->keep >= 0) { /* this rank's oldest files beyond num_traces_to_keep */
        int have = 0;
        for (int i = h->n_saves - 1; i >= 0; i--) {
            char **p = &h->saves[i].paths[h->rank];
            if (!*p) continue;
            if (have++ < h->keep) continue;
            unlink(*p);
            cm_free(*p);
            *p = NULL;
        }
    }
    return s;
}

static void jt_free(void *self) {
    json_handler *h = self;
    for (int i = 0; i < h->n_saves; i++) {
        for (int r = 0; h->saves[i].paths && r < h->world; r++) cm_free(h->saves[i].paths[r]);
        cm_free(h->saves[i].paths);
    }
    cm_free(h->saves);
    cm_free(h->folder_fmt), cm_free(h->filename_fmt), cm_free(h->merged_fmt);
    cm_free(h);
}

static const cm_trace_handler_i json_vt = {
    .abi = CM_TRACE_HANDLER_ABI,
    .name = "JSONTraceHandler",
    .init = jt_init,
    .save = jt_save,
    .close = NULL,
    .free = jt_free,
};

cm_status cm_json_trace_handler_new(const cm_json_trace_handler_config *cfg, cm_trace_handler *out) {
    if (!cfg || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_json_trace_handler_new: NULL argument");
    *out = (cm_trace_handler){0};
    if (!cfg->folder || !cfg->folder[0])
        return cm_set_error(CM_ERR_INVALID_ARG, "JSONTraceHandler: folder is empty (default \"{run_name}/traces\")");
    if (!cfg->filename || !cfg->filename[0] || strchr(cfg->filename, '/'))
        return cm_set_error(CM_ERR_INVALID_ARG, "JSONTraceHandler: filename '%s' must be a file name (default "
                                                "\"ep{epoch}-ba{batch}-rank{rank}.json\")",
                            cfg->filename ? cfg->filename : "");
    if (!strstr(cfg->filename, "{rank}") && !strstr(cfg->folder, "{rank}"))
        return cm_set_error(CM_ERR_INVALID_ARG, "JSONTraceHandler: filename '%s' has no {rank}: the ranks would "
                                                "write the same file", cfg->filename);
    if (cfg->merged_trace_filename && (!cfg->merged_trace_filename[0] || strchr(cfg->merged_trace_filename, '/')))
        return cm_set_error(CM_ERR_INVALID_ARG, "JSONTraceHandler: merged_trace_filename '%s' must be a file name in "
                                                "the folder (NULL: no merging)", cfg->merged_trace_filename);
    if (cfg->num_traces_to_keep < -1)
        return cm_set_error(CM_ERR_INVALID_ARG, "JSONTraceHandler: num_traces_to_keep %d (use -1 for all, or >= 0)",
                            cfg->num_traces_to_keep);
    json_handler *h = cm_alloc_zeroed(sizeof *h, 16);
    if (!h) return cm_set_error(CM_ERR_OOM, "JSONTraceHandler: out of memory");
    h->folder_fmt = dup_or_null(cfg->folder);
    h->filename_fmt = dup_or_null(cfg->filename);
    h->merged_fmt = dup_or_null(cfg->merged_trace_filename);
    h->overwrite = cfg->overwrite;
    h->keep = cfg->num_traces_to_keep;
    h->world = 1;
    if (!h->folder_fmt || !h->filename_fmt || (cfg->merged_trace_filename && !h->merged_fmt)) {
        jt_free(h);
        return cm_set_error(CM_ERR_OOM, "JSONTraceHandler: out of memory");
    }
    *out = (cm_trace_handler){&json_vt, h};
    return CM_OK;
}

/* ---- merging ---- */

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? cm_alloc((size_t)n + 2, 1) : NULL;
    if (!s || fread(s, 1, (size_t)n, f) != (size_t)n) {
        cm_free(s);
        fclose(f);
        return NULL;
    }
    fclose(f);
    s[n] = '\0';
    *len = (size_t)n;
    return s;
}

/* A trace file: an array, an object with traceEvents, or an array whose closing bracket is
 * missing (a process that died while writing; the format allows it). */
static cJSON *load_trace(const char *path, cm_status *s) {
    size_t len = 0;
    char *text = slurp(path, &len);
    if (!text) {
        *s = cm_set_error(CM_ERR_IO, "trace merge: cannot read '%s': %s", path, strerror(errno));
        return NULL;
    }
    cJSON *j = cJSON_ParseWithLength(text, len);
    if (!j) {
        while (len && (text[len - 1] == '\n' || text[len - 1] == ' ' || text[len - 1] == ',')) len--;
        text[len++] = ']';
        j = cJSON_ParseWithLength(text, len);
    }
    cm_free(text);
    cJSON *arr = cJSON_IsArray(j) ? j : cJSON_GetObjectItemCaseSensitive(j, "traceEvents");
    if (!cJSON_IsArray(arr)) {
        cJSON_Delete(j);
        *s = cm_set_error(CM_ERR_FORMAT, "trace merge: '%s' is not a Chrome trace (a JSON array of events, or an "
                                         "object with traceEvents)", path);
        return NULL;
    }
    if (arr != j) { /* keep only the array */
        cJSON_DetachItemViaPointer(j, arr);
        cJSON_Delete(j);
    }
    return arr;
}

static const cJSON *meta_value(const cJSON *arr, const char *name) {
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph"), *n = cJSON_GetObjectItemCaseSensitive(e, "name");
        if (cJSON_IsString(ph) && !strcmp(ph->valuestring, "M") && cJSON_IsString(n) && !strcmp(n->valuestring, name)) {
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(e, "args");
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(a, "value");
            if (cJSON_IsNumber(v)) return v;
        }
    }
    return NULL;
}

typedef struct item {
    cJSON *ev;
    double ts;
    int64_t index; /* order of reading: ties keep it */
    int rank;
    int64_t cycle;
    char ph;
    double dur;
} item;

static int item_cmp(const void *a, const void *b) {
    const item *x = a, *y = b;
    if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
    /* at the same time: reading order (a rank's file is in time order on each thread), except
     * that of two complete events the longer (the outer one, recorded after) comes first */
    if (x->ph == 'X' && y->ph == 'X' && x->dur != y->dur) return x->dur > y->dur ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* The collectives' starts on every rank: one entry per (cycle, seq, rank). */
typedef struct coll {
    int64_t cycle;
    double seq;
    int rank;
    double ts;
    cJSON *ev;
} coll;

static int coll_cmp(const void *a, const void *b) {
    const coll *x = a, *y = b;
    if (x->cycle != y->cycle) return x->cycle < y->cycle ? -1 : 1;
    if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
    return x->rank - y->rank;
}

static bool meta_kept(const char *name) {
    return !strcmp(name, "process_name") || !strcmp(name, "thread_name") || !strcmp(name, "thread_sort_index") ||
           !strcmp(name, "process_sort_index") || !strcmp(name, "global_rank") || !strcmp(name, "process_labels");
}

cm_status cm_trace_merge(const char *const *inputs, int n, const char *output) {
    if (!inputs || n < 1 || !output) return cm_set_error(CM_ERR_INVALID_ARG, "cm_trace_merge: no input files");
    cJSON **files = cm_alloc_zeroed(sizeof *files * (size_t)n, 16);
    int *rank = cm_alloc_zeroed(sizeof *rank * (size_t)n, 16);
    int64_t *cycle = cm_alloc_zeroed(sizeof *cycle * (size_t)n, 16);
    double *sync = cm_alloc_zeroed(sizeof *sync * (size_t)n, 16);
    item *items = NULL;
    coll *colls = NULL;
    cm_status s = CM_OK;
    if (!files || !rank || !cycle || !sync) {
        s = cm_set_error(CM_ERR_OOM, "trace merge: out of memory");
        goto done;
    }
    int64_t total = 0;
    for (int i = 0; i < n && !s; i++) {
        if (!(files[i] = load_trace(inputs[i], &s))) break;
        const cJSON *g = meta_value(files[i], "global_rank"), *c = meta_value(files[i], "clock_sync_timestamp_us"),
                    *cy = meta_value(files[i], "cycle");
        int64_t r, cyc = -1; /* without cycles: one group, as Composer merges */
        if (!g) {
            s = cm_set_error(CM_ERR_FORMAT, "trace merge: '%s' has no global_rank metadata event (not written by a "
                                            "JSONTraceHandler?)", inputs[i]);
            break;
        }
        if (!cmi_json_whole(g, 0, INT32_MAX, &r) || (cy && !cmi_json_whole(cy, 0, INT64_MAX, &cyc))) {
            s = cm_set_error(CM_ERR_FORMAT, "trace merge: '%s' has a global_rank or cycle metadata value that is not a "
                                            "whole number >= 0", inputs[i]);
            break;
        }
        rank[i] = (int)r;
        sync[i] = c ? c->valuedouble : 0.0;
        cycle[i] = cyc;
        total += cJSON_GetArraySize(files[i]);
    }
    if (s) goto done;
    /* each file's shift: onto the clock of the lowest rank's file of the same cycle */
    double *shift = sync; /* reused in place below */
    double *ref = cm_alloc(sizeof *ref * (size_t)n, 16);
    if (!ref) {
        s = cm_set_error(CM_ERR_OOM, "trace merge: out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        int best = i;
        for (int j = 0; j < n; j++)
            if (cycle[j] == cycle[i] && rank[j] < rank[best]) best = j;
        ref[i] = sync[best];
    }
    for (int i = 0; i < n; i++) shift[i] = ref[i] - sync[i];
    cm_free(ref);

    items = cm_alloc(sizeof *items * (size_t)(total ? total : 1), 16);
    colls = cm_alloc(sizeof *colls * (size_t)(total ? total : 1), 16);
    if (!items || !colls) {
        s = cm_set_error(CM_ERR_OOM, "trace merge: out of memory");
        goto done;
    }
    int64_t ni = 0, nc = 0, nm = 0;
    for (int i = 0; i < n; i++) {
        cJSON *e;
        cJSON_ArrayForEach(e, files[i]) {
            const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
            if (!cJSON_IsString(ph) || !ph->valuestring[0] || !cJSON_IsObject(e)) continue;
            cJSON *pid = cJSON_GetObjectItemCaseSensitive(e, "pid");
            if (cJSON_IsNumber(pid)) cJSON_SetNumberValue(pid, rank[i]);
            else {
                cJSON_DeleteItemFromObjectCaseSensitive(e, "pid");
                cJSON_AddNumberToObject(e, "pid", rank[i]);
            }
            const char p = ph->valuestring[0];
            if (p == 'M') {
                if (!cJSON_IsString(name) || !meta_kept(name->valuestring)) continue;
                /* once per (name, pid, tid): every cycle's file repeats them */
                bool dup = false;
                const cJSON *tid = cJSON_GetObjectItemCaseSensitive(e, "tid");
                for (int64_t k = 0; k < nm && !dup; k++) {
                    const cJSON *n2 = cJSON_GetObjectItemCaseSensitive(items[k].ev, "name");
                    const cJSON *t2 = cJSON_GetObjectItemCaseSensitive(items[k].ev, "tid");
                    dup = items[k].rank == rank[i] && !strcmp(n2->valuestring, name->valuestring) &&
                          cJSON_IsNumber(tid) == cJSON_IsNumber(t2) && (!cJSON_IsNumber(tid) || tid->valuedouble == t2->valuedouble);
                }
                if (dup) continue;
                /* metadata first, in reading order (they are moved to the front below) */
                items[ni] = (item){e, -1e300, ni, rank[i], cycle[i], 'M', 0};
                if (ni != nm) {
                    item t = items[nm];
                    items[nm] = items[ni];
                    items[ni] = t;
                }
                ni++, nm++;
                continue;
            }
            /* async ids are per rank (a collective's sequence number): unique over the ranks */
            cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
            if ((p == 'b' || p == 'e' || p == 'n') && cJSON_IsNumber(id))
                cJSON_SetNumberValue(id, (double)rank[i] * 4294967296.0 + id->valuedouble);
            cJSON *ts = cJSON_GetObjectItemCaseSensitive(e, "ts");
            double t = cJSON_IsNumber(ts) ? ts->valuedouble + shift[i] : 0.0;
            if (cJSON_IsNumber(ts)) cJSON_SetNumberValue(ts, t);
            const cJSON *dur = cJSON_GetObjectItemCaseSensitive(e, "dur");
            items[ni] = (item){e, t, ni, rank[i], cycle[i], p, cJSON_IsNumber(dur) ? dur->valuedouble : 0};
            ni++;
            const cJSON *cat = cJSON_GetObjectItemCaseSensitive(e, "cat");
            const cJSON *seq = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(e, "args"), "seq");
            if (p == 'b' && cJSON_IsString(cat) && !strcmp(cat->valuestring, "collective") && cJSON_IsNumber(seq))
                colls[nc++] = (coll){cycle[i], seq->valuedouble, rank[i], t, e};
        }
    }
    /* which rank came last to each collective, and how long each rank waited for it */
    qsort(colls, (size_t)nc, sizeof *colls, coll_cmp);
    for (int64_t a = 0; a < nc;) {
        int64_t b = a;
        int last = colls[a].rank;
        double latest = colls[a].ts;
        while (b < nc && colls[b].cycle == colls[a].cycle && colls[b].seq == colls[a].seq) {
            if (colls[b].ts > latest) latest = colls[b].ts, last = colls[b].rank;
            b++;
        }
        for (int64_t k = a; k < b; k++) {
            cJSON *args = cJSON_GetObjectItemCaseSensitive(colls[k].ev, "args");
            cJSON_DeleteItemFromObjectCaseSensitive(args, "last_rank");
            cJSON_DeleteItemFromObjectCaseSensitive(args, "waited_us");
            cJSON_AddNumberToObject(args, "last_rank", last);
            cJSON_AddNumberToObject(args, "waited_us", latest - colls[k].ts);
        }
        a = b;
    }
    qsort(items + nm, (size_t)(ni - nm), sizeof *items, item_cmp);

    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", output);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        s = cm_set_error(CM_ERR_IO, "trace merge: cannot write '%s': %s", tmp, strerror(errno));
        goto done;
    }
    fputs("[\n", f);
    for (int64_t k = 0; k < ni; k++) {
        char *txt = cJSON_PrintUnformatted(items[k].ev);
        if (!txt) {
            fclose(f);
            unlink(tmp);
            s = cm_set_error(CM_ERR_OOM, "trace merge: out of memory");
            goto done;
        }
        fputs(k ? ",\n" : "", f);
        fputs(txt, f);
        cJSON_free(txt);
    }
    fputs("\n]\n", f);
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0) bad = true;
    if (bad || rename(tmp, output) != 0) {
        s = cm_set_error(CM_ERR_IO, "trace merge: writing '%s' failed: %s", output, strerror(errno));
        unlink(tmp);
    }
done:
    for (int i = 0; files && i < n; i++) cJSON_Delete(files[i]);
    cm_free(files), cm_free(rank), cm_free(cycle), cm_free(sync), cm_free(items), cm_free(colls);
    return s;
}
