/* The profiler (composer/profiler.h): Composer's cyclic schedule and its edge cases (epochs
 * shorter than a cycle, repeat 0, a run resumed mid-cycle), traces of real fits on a tiny MLP
 * (valid JSON, slices that nest on every thread, the engine's event pairs, plugin calls, the
 * optimizer step, every op with its FLOPs), the merge of several ranks' files onto one clock with
 * the last rank at each collective, markers, the op table and the errors. */
#define _GNU_SOURCE /* nftw */
#include "cmtest.h"
#include "cmtrain.h"

#include <composer/profiler.h>

#include <cjson/cJSON.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers -------------------------------------------------------------------------------- */

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb, (void)flag, (void)f;
    return remove(p);
}

static void tmp_make(char *dir, size_t cap) {
    snprintf(dir, cap, "/tmp/cm-prof-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void tmp_remove(const char *dir) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static cJSON *load_json(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    cJSON *j = cJSON_Parse(s);
    cr_assert_not_null(j, "%s is not valid JSON", path);
    cr_assert(cJSON_IsArray(j), "%s is not a JSON array", path);
    cr_assert(s[0] == '[' && n >= 3 && !strcmp(s + n - 3, "\n]\n"), "%s is not written as Composer writes it", path);
    free(s);
    return j;
}

static const char *str_of(const cJSON *e, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, key);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static double num_of(const cJSON *e, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

typedef struct span {
    double t0, t1;
    int64_t order;
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->t0 != y->t0) return x->t0 < y->t0 ? -1 : 1;
    if (x->t1 != y->t1) return x->t1 > y->t1 ? -1 : 1;
    return x->order < y->order ? -1 : 1;
}

/* Every (pid, tid): its B/E events, read in time order (ties in file order), form a stack whose
 * every E closes the B on top with the same name and leaves nothing open; and the slices (B..E
 * and X) never overlap partly. Async b/e come in pairs with the same id. Returns the count. */
static int64_t check_nesting(const cJSON *arr, const char *what) {
    int64_t n = cJSON_GetArraySize(arr), checked = 0;
    int keys[64][2], n_keys = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        const char *ph = str_of(e, "ph");
        if (!strcmp(ph, "M")) continue;
        cr_assert(!isnan(num_of(e, "ts")), "%s: an event without ts", what);
        int pid = (int)num_of(e, "pid"), tid = (int)num_of(e, "tid");
        bool seen = false;
        for (int k = 0; k < n_keys; k++) seen |= keys[k][0] == pid && keys[k][1] == tid;
        if (!seen && n_keys < 64) keys[n_keys][0] = pid, keys[n_keys][1] = tid, n_keys++;
    }
    for (int k = 0; k < n_keys; k++) {
        /* the thread's events in time order, ties in file order */
        span *order = malloc(sizeof *order * (size_t)(n + 1));
        const cJSON **evs = malloc(sizeof *evs * (size_t)(n + 1));
        int64_t m = 0, idx = 0;
        cJSON_ArrayForEach(e, arr) {
            idx++;
            const char *ph = str_of(e, "ph");
            if (!strcmp(ph, "M") || (int)num_of(e, "pid") != keys[k][0] || (int)num_of(e, "tid") != keys[k][1])
                continue;
            evs[m] = e;
            order[m] = (span){num_of(e, "ts"), 0, m};
            m++;
        }
        /* stable sort by time: insertion (already nearly sorted) */
        for (int64_t i = 1; i < m; i++)
            for (int64_t j = i; j > 0 && order[j - 1].t0 > order[j].t0; j--) {
                span t = order[j];
                order[j] = order[j - 1];
                order[j - 1] = t;
            }
        const char *stack[256];
        double starts[256];
        int depth = 0;
        span *sl = malloc(sizeof *sl * (size_t)(m + 1));
        int64_t ns = 0;
        for (int64_t i = 0; i < m; i++) {
            const cJSON *ev = evs[order[i].order];
            const char *ph = str_of(ev, "ph");
            if (!strcmp(ph, "B")) {
                cr_assert_lt(depth, 256);
                starts[depth] = num_of(ev, "ts");
                stack[depth++] = str_of(ev, "name");
            } else if (!strcmp(ph, "E")) {
                cr_assert_gt(depth, 0, "%s: pid %d tid %d: an E ('%s') with no open B", what, keys[k][0], keys[k][1],
                             str_of(ev, "name"));
                const char *nm = str_of(ev, "name");
                cr_assert(!nm[0] || !strcmp(nm, stack[depth - 1]), "%s: E '%s' closes B '%s'", what, nm,
                          stack[depth - 1]);
                depth--;
                sl[ns++] = (span){starts[depth], num_of(ev, "ts"), i};
            } else if (!strcmp(ph, "X")) {
                sl[ns++] = (span){num_of(ev, "ts"), num_of(ev, "ts") + num_of(ev, "dur"), i};
            }
            checked++;
        }
        cr_assert_eq(depth, 0, "%s: pid %d tid %d: %d slice(s) left open (innermost '%s')", what, keys[k][0],
                     keys[k][1], depth, depth ? stack[depth - 1] : "");
        /* laminar: sorted by start (longer first), every slice ends inside the one it starts in */
        qsort(sl, (size_t)ns, sizeof *sl, span_cmp);
        double ends[512];
        int d = 0;
        for (int64_t i = 0; i < ns; i++) {
            while (d > 0 && ends[d - 1] <= sl[i].t0 + 1e-3) d--;
            if (d > 0)
                cr_assert_leq(sl[i].t1, ends[d - 1] + 1e-3, "%s: a slice [%f, %f] overlaps the end of its parent (%f)",
                              what, sl[i].t0, sl[i].t1, ends[d - 1]);
            cr_assert_lt(d, 512);
            ends[d++] = sl[i].t1;
        }
        free(sl), free(order), free((void *)evs);
    }
    /* async pairs */
    cJSON_ArrayForEach(e, arr) {
        if (strcmp(str_of(e, "ph"), "b")) continue;
        int found = 0;
        const cJSON *f;
        cJSON_ArrayForEach(f, arr) found += !strcmp(str_of(f, "ph"), "e") && num_of(f, "id") == num_of(e, "id") &&
                                            num_of(f, "pid") == num_of(e, "pid") && num_of(f, "ts") >= num_of(e, "ts");
        cr_assert_eq(found, 1, "%s: async '%s' id %g has %d ends", what, str_of(e, "name"), num_of(e, "id"), found);
    }
    return checked;
}

static int count_named(const cJSON *arr, const char *ph, const char *name) {
    int c = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) c += !strcmp(str_of(e, "ph"), ph) && !strcmp(str_of(e, "name"), name);
    return c;
}

static const cJSON *first_named(const cJSON *arr, const char *ph, const char *name) {
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) if (!strcmp(str_of(e, "ph"), ph) && !strcmp(str_of(e, "name"), name)) return e;
    return NULL;
}

/* ---- the schedule --------------------------------------------------------------------------- */

static void expect_actions(const cm_cyclic_schedule *s, int64_t len, int64_t start, const char *want) {
    /* want: one letter per batch: S skip, W warmup, A active, V active_and_save */
    char got[128];
    const int64_t n = (int64_t)strlen(want);
    for (int64_t b = 0; b < n; b++) {
        cm_profiler_action a = cm_cyclic_schedule_action(s, b, len, start);
        got[b] = "SWAV"[a];
    }
    got[n] = '\0';
    cr_assert_str_eq(got, want, "schedule (%lld, %lld, %lld, %lld, %lld), len %lld, start %lld", (long long)s->skip_first,
                     (long long)s->wait, (long long)s->warmup, (long long)s->active, (long long)s->repeat,
                     (long long)len, (long long)start);
}

Test(profiler_schedule, cyclic_schedule_follows_composer) {
    cm_cyclic_schedule d = cm_cyclic_schedule_default();
    cr_assert(d.skip_first == 0 && d.wait == 0 && d.warmup == 1 && d.active == 4 && d.repeat == 1);
    expect_actions(&d, 100, 0, "WAAAVSSSSS");
    cm_cyclic_schedule s = {1, 1, 1, 2, 2};
    expect_actions(&s, 100, 0, "SSWAVSWAVSSSS");
    s.repeat = 0; /* until the epoch ends; its last batch saves */
    expect_actions(&s, 11, 0, "SSWAVSWAVSW"); /* the last batch warms up: nothing to save */
    /* an epoch shorter than a cycle: its last batch still saves */
    expect_actions(&d, 3, 0, "WAV");
    expect_actions(&d, 1, 0, "W"); /* a one-batch epoch: warmup only, nothing active */
    /* past the end of the epoch (the BEFORE_DATALOADER that finds it exhausted) */
    cr_assert_eq(cm_cyclic_schedule_action(&d, 3, 3, 0), CM_PROFILER_ACTION_SKIP);
    /* resumed at batch 3: skip_first counts from there, a fresh cycle starts */
    s.repeat = 1;
    expect_actions(&s, 100, 3, "SSSSSWAVSSS");
    /* unknown epoch length: cycles only */
    expect_actions(&d, -1, 0, "WAAAVS");
    cm_cyclic_schedule bad = d;
    bad.active = 0;
    cr_assert_eq(cm_cyclic_schedule_check(&bad), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "active"), "%s", cm_last_error());
    bad = d;
    bad.wait = -1;
    cr_assert_eq(cm_cyclic_schedule_check(&bad), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "wait"), "%s", cm_last_error());
    cr_assert_str_eq(cm_profiler_action_name(CM_PROFILER_ACTION_ACTIVE_AND_SAVE), "active_and_save");
}

/* ---- profiled fits -------------------------------------------------------------------------- */

typedef struct rig {
    cm_dataset *ds;
    cm_dataloader *dl;
    cm_model *model;
    cm_trainer *tr;
    cm_profiler *prof;
    char dir[64], traces[128];
} rig;

typedef struct rig_opts {
    cm_cyclic_schedule sched;
    int64_t n, batch; /* samples and batch size (default 48, 8: 6 batches an epoch) */
    const char *max_duration;
    const char *save_interval; /* checkpoints into dir/ck */
    bool autoresume;
    const char *dir;           /* reuse a folder (resuming) */
    FILE *summary;
    bool overwrite;
} rig_opts;

static rig make(const rig_opts *o) {
    rig g = {0};
    if (o->dir) snprintf(g.dir, sizeof g.dir, "%s", o->dir);
    else tmp_make(g.dir, sizeof g.dir);
    snprintf(g.traces, sizeof g.traces, "%s/traces", g.dir);
    g.ds = cmt_synth_dataset(o->n ? o->n : 48, 8, 3, false, NULL);
    g.dl = cmt_loader(g.ds, o->batch ? o->batch : 8, false, 7);
    g.model = cmt_mlp(8, 16, 3, 0.0f, 3);
    cm_json_trace_handler_config jc = cm_json_trace_handler_config_default();
    jc.folder = g.traces;
    jc.overwrite = o->overwrite;
    cm_trace_handler th;
    cr_assert_eq(cm_json_trace_handler_new(&jc, &th), CM_OK, "%s", cm_last_error());
    cm_profiler_config pc = cm_profiler_config_default();
    pc.schedule = o->sched;
    pc.trace_handlers = &th, pc.n_trace_handlers = 1;
    pc.sys_prof_stats_thread_interval_seconds = 0.01;
    pc.sys_prof_memory = pc.sys_prof_disk = pc.sys_prof_net = true;
    pc.summary_stream = o->summary;
    cm_callback_plugin pp;
    cr_assert_eq(cm_profiler_new(&pc, &g.prof, &pp), CM_OK, "%s", cm_last_error());
    cm_trainer_config c = cm_trainer_config_default();
    c.model = g.model;
    c.train_dataloader = g.dl;
    c.run_name = "prof";
    cr_assert_eq(cm_time_parse(o->max_duration ? o->max_duration : "1ep", &c.max_duration), CM_OK);
    char ck[128];
    if (o->save_interval) {
        snprintf(ck, sizeof ck, "%s/ck", g.dir);
        c.save_folder = ck;
        cr_assert_eq(cm_time_parse(o->save_interval, &c.save_interval), CM_OK);
        c.autoresume = o->autoresume;
    }
    c.callbacks = &pp, c.n_callbacks = 1;
    cr_assert_eq(cm_trainer_new(&c, &g.tr), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_profiler_of(cm_trainer_state(g.tr)), g.prof, "state.profiler is the bound profiler");
    return g;
}

static void unmake(rig *g, bool keep_dir) {
    cm_trainer_free(g->tr);
    cm_model_free(g->model);
    cm_dataloader_free(g->dl);
    cm_dataset_free(g->ds);
    if (!keep_dir) tmp_remove(g->dir);
}

static void fit(rig *g) { cr_assert_eq(cm_trainer_fit(g->tr, NULL), CM_OK, "%s", cm_last_error()); }

static void expect_files(const char *dir, const char *const *names, int n) {
    for (int i = 0; i < n; i++) {
        char p[256];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        cr_assert(cmt_exists(p), "trace %s missing", p);
    }
    /* and nothing else but the merged trace */
    char cmd[300];
    snprintf(cmd, sizeof cmd, "ls %s | grep -v merged_trace.json | wc -l", dir);
    FILE *f = popen(cmd, "r");
    int count = -1;
    cr_assert_eq(fscanf(f, "%d", &count), 1);
    pclose(f);
    cr_assert_eq(count, n, "%d trace files in %s, want %d", count, dir, n);
}

/* One epoch of 6 batches with cyclic_schedule(1, 0, 1, 2, 1): batch 0 skipped, 1 warmup, 2 and
 * 3 active, saved as ep0-ba4-rank0.json; everything in it nests and the events are all there. */
Test(profiler, fit_writes_a_valid_trace_with_events_plugins_and_ops) {
    rig g = make(&(rig_opts){.sched = {1, 0, 1, 2, 1}});
    fit(&g);
    cr_assert_eq(cm_profiler_n_cycles(g.prof), 1);
    const char *want[] = {"ep0-ba4-rank0.json"};
    expect_files(g.traces, want, 1);
    char path[256];
    snprintf(path, sizeof path, "%s/ep0-ba4-rank0.json", g.traces);
    cJSON *t = load_json(path);
    cr_assert_gt(check_nesting(t, "rank file"), 50);
    /* Composer's metadata */
    const cJSON *pn = first_named(t, "M", "process_name");
    cr_assert_not_null(pn);
    cr_assert_str_eq(str_of(cJSON_GetObjectItemCaseSensitive(pn, "args"), "name"), "Rank 0 training loop process");
    cr_assert_not_null(first_named(t, "M", "clock_sync_timestamp_us"));
    cr_assert_eq(num_of(cJSON_GetObjectItemCaseSensitive(first_named(t, "M", "global_rank"), "args"), "value"), 0);
    /* three recorded batches (warmup + 2 active): their event pairs, the optimizer step */
    cr_assert_eq(count_named(t, "B", "event/batch"), 3, "event/batch slices");
    cr_assert_eq(count_named(t, "B", "event/dataloader"), 3);
    cr_assert_eq(count_named(t, "B", "event/forward"), 3);
    cr_assert_eq(count_named(t, "B", "event/loss"), 3);
    cr_assert_eq(count_named(t, "B", "event/backward"), 3);
    cr_assert_eq(count_named(t, "B", "event/train_batch"), 3);
    cr_assert_eq(count_named(t, "B", "optimizer/step"), 3);
    cr_assert_geq(count_named(t, "B", "callback/Profiler/event/batch_end"), 3, "plugin calls");
    const cJSON *b = first_named(t, "B", "event/batch");
    cr_assert_eq(num_of(cJSON_GetObjectItemCaseSensitive(b, "args"), "batch"), 1, "the first recorded batch is 1");
    /* ops: the MLP's two linears forward and backward with the GEMM FLOPs (batch 8, 8 -> 16 -> 3) */
    cr_assert_eq(count_named(t, "X", "linear"), 2 * 3);
    cr_assert_eq(count_named(t, "X", "linear_backward"), 2 * 3);
    const cJSON *lin = first_named(t, "X", "linear");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(lin, "args");
    cr_assert_eq(num_of(args, "flops"), 2.0 * 8 * 8 * 16, "first linear: 2·8·8·16 FLOPs, got %g", num_of(args, "flops"));
    char *shapes = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(args, "shapes"));
    cr_assert_str_eq(shapes, "[[8,8],[16,8],[16]]");
    free(shapes);
    const cJSON *linb = first_named(t, "X", "linear_backward");
    const double fb = num_of(cJSON_GetObjectItemCaseSensitive(linb, "args"), "flops");
    cr_assert(fb == 2.0 * 8 * 16 * 3 || fb == 2.0 * 2 * 8 * 16 * 3, "the last linear's backward first: %g", fb);
    /* system counters from the sampling thread */
    cr_assert_not_null(first_named(t, "M", "thread_name"));
    cJSON_Delete(t);
    /* the merged trace of one rank: valid, the same events in time order */
    snprintf(path, sizeof path, "%s/merged_trace.json", g.traces);
    cJSON *m = load_json(path);
    check_nesting(m, "merged");
    double prev = -1e300;
    const cJSON *e;
    cJSON_ArrayForEach(e, m) {
        if (!strcmp(str_of(e, "ph"), "M")) continue;
        cr_assert_geq(num_of(e, "ts"), prev, "merged events are in time order");
        prev = num_of(e, "ts");
    }
    cJSON_Delete(m);
    /* the op table: the linears with their FLOPs, 2 active batches (warmup left out) */
    cr_assert_geq(cm_profiler_n_op_stats(g.prof), 2);
    bool seen = false;
    for (int i = 0; i < cm_profiler_n_op_stats(g.prof); i++) {
        const cm_op_stat *o = cm_profiler_op_stat(g.prof, i);
        if (i) cr_assert_leq(o->self_s, cm_profiler_op_stat(g.prof, i - 1)->self_s, "sorted by self time");
        cr_assert_leq(o->self_s, o->total_s + 1e-12);
        if (!strcmp(o->name, "linear")) {
            seen = true;
            cr_assert_eq(o->calls, 2 * 2, "2 linears x 2 ACTIVE batches");
            cr_assert_eq(o->flops, 2 * (2.0 * 8 * 8 * 16 + 2.0 * 8 * 16 * 3));
        }
    }
    cr_assert(seen);
    char table[8192];
    size_t need = cm_profiler_op_table(g.prof, 0, table, sizeof table);
    cr_assert_lt(need, sizeof table);
    cr_assert(strstr(table, "linear_backward") && strstr(table, "GFLOP/s"), "%s", table);
    unmake(&g, false);
}

/* Epochs of 3 batches, shorter than the default cycle (warmup 1, active 4): each epoch's last
 * batch saves its cycle, and every epoch starts a new one. */
Test(profiler, epochs_shorter_than_a_cycle_save_at_their_last_batch) {
    rig g = make(&(rig_opts){.sched = cm_cyclic_schedule_default(), .n = 24, .max_duration = "2ep"});
    fit(&g);
    const char *want[] = {"ep0-ba3-rank0.json", "ep1-ba6-rank0.json"};
    expect_files(g.traces, want, 2);
    for (int i = 0; i < 2; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/%s", g.traces, want[i]);
        cJSON *t = load_json(path);
        check_nesting(t, want[i]);
        cr_assert_eq(count_named(t, "B", "event/batch"), 3, "%s: all 3 batches of the epoch", want[i]);
        cJSON_Delete(t);
    }
    unmake(&g, false);
}

/* A run of 12 batches saved at batch 5, then resumed: with cyclic_schedule(0, 1, 1, 2, 0) the
 * uninterrupted run saves at ba4, ba8, ba12; the resumed one starts a fresh cycle at batch 5
 * (wait 5, warmup 6, active 7-8: ba9) and the epoch's last batch saves the next (ba12). */
Test(profiler, a_run_resumed_mid_cycle_starts_a_fresh_cycle) {
    rig g = make(&(rig_opts){.sched = {0, 1, 1, 2, 0}, .n = 96, .max_duration = "1ep"});
    fit(&g);
    const char *full[] = {"ep0-ba4-rank0.json", "ep0-ba8-rank0.json", "ep0-ba12-rank0.json"};
    expect_files(g.traces, full, 3);
    unmake(&g, false);

    rig a = make(&(rig_opts){.sched = {0, 1, 1, 2, 0}, .n = 96, .max_duration = "5ba", .save_interval = "5ba"});
    fit(&a);
    const char *first[] = {"ep0-ba4-rank0.json"};
    expect_files(a.traces, first, 1);
    char dir[64];
    snprintf(dir, sizeof dir, "%s", a.dir);
    unmake(&a, true);
    rig b = make(&(rig_opts){.sched = {0, 1, 1, 2, 0}, .n = 96, .max_duration = "1ep", .save_interval = "5ba",
                             .autoresume = true, .dir = dir, .overwrite = true});
    fit(&b);
    const char *after[] = {"ep0-ba4-rank0.json", "ep0-ba9-rank0.json", "ep0-ba12-rank0.json"};
    expect_files(b.traces, after, 3);
    char path[256];
    snprintf(path, sizeof path, "%s/ep0-ba9-rank0.json", b.traces);
    cJSON *t = load_json(path);
    check_nesting(t, "resumed");
    cr_assert_eq(count_named(t, "B", "event/batch"), 3, "warmup 6, active 7 and 8");
    cr_assert_eq(num_of(cJSON_GetObjectItemCaseSensitive(first_named(t, "B", "event/batch"), "args"), "batch"), 6);
    cJSON_Delete(t);
    unmake(&b, false);
}

/* The op table is printed when the profiler closes, and a fit that ends mid-cycle writes what it
 * recorded. */
Test(profiler, fit_ending_mid_cycle_writes_it_and_prints_the_op_table) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    rig g = make(&(rig_opts){.sched = {0, 0, 1, 4, 1}, .max_duration = "3ba", .summary = f});
    fit(&g);
    const char *want[] = {"ep0-ba3-rank0.json"};
    expect_files(g.traces, want, 1);
    unmake(&g, false);
    fclose(f);
    cr_assert(strstr(text, "profiler: ops of the") && strstr(text, "linear_backward"), "%s", text);
    cr_assert(strstr(text, "Self time total"), "%s", text);
    free(text);
}

/* ---- markers and errors --------------------------------------------------------------------- */

Test(profiler, markers_record_by_their_actions_and_refuse_misuse) {
    cm_profiler *p;
    cm_callback_plugin pp;
    cm_profiler_config pc = cm_profiler_config_default();
    cr_assert_eq(cm_profiler_new(&pc, &p, &pp), CM_OK);
    cm_marker *m, *m2, *always;
    cr_assert_eq(cm_profiler_marker(p, "user/section", NULL, &m), CM_OK);
    cr_assert_eq(cm_profiler_marker(p, "user/section", NULL, &m2), CM_OK);
    cr_assert_eq(m, m2, "the same name gives the same marker");
    cr_assert_eq(cm_marker_finish(m), CM_ERR_STATE);
    cr_assert(strstr(cm_last_error(), "user/section"), "%s", cm_last_error());
    cr_assert_eq(cm_marker_start(m), CM_OK);
    cr_assert_eq(cm_marker_start(m), CM_ERR_STATE);
    cr_assert_eq(cm_marker_finish(m), CM_OK);
    cm_marker_config mc = cm_marker_config_default();
    mc.actions = 0;
    cr_assert_eq(cm_profiler_marker(p, "x", &mc, &always), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_profiler_marker(p, "", NULL, &always), CM_ERR_INVALID_ARG);
    cm_callback_plugin_free(pp);
}

/* A marker used by a callback during the fit: its slices land in the trace when the batch is
 * recorded, nested in the callback's call. */
static cm_status marking_run(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    (void)self, (void)lg;
    cm_profiler *p = cm_profiler_of(st);
    cr_assert_not_null(p);
    /* a slice left open across the end of the cycle: the trace closes it, the late end is dropped */
    cm_marker *lm;
    if (ev == CM_EVENT_BATCH_END && cm_state_timestamp(st)->batch == 1) {
        cr_assert_eq(cm_profiler_marker(p, "user/long", NULL, &lm), CM_OK);
        cr_assert_eq(cm_marker_start(lm), CM_OK);
    }
    if (ev == CM_EVENT_FIT_END) {
        cr_assert_eq(cm_profiler_marker(p, "user/long", NULL, &lm), CM_OK);
        cr_assert_eq(cm_marker_finish(lm), CM_OK);
    }
    if (ev != CM_EVENT_BATCH_END) return CM_OK;
    cm_marker *m;
    cm_status s = cm_profiler_marker(p, "user/work", NULL, &m);
    if (!s) s = cm_marker_start(m);
    if (!s) s = cm_marker_finish(m);
    cm_marker *c;
    if (!s) s = cm_profiler_marker(p, "user/counter", NULL, &c);
    const char *series = "value";
    double v = (double)cm_state_timestamp(st)->batch;
    if (!s) cm_marker_counter(c, &series, &v, 1);
    return s;
}
static const cm_callback_i marking_vt = {CM_CALLBACK_ABI, "Marking", marking_run, NULL, NULL, NULL, NULL};

Test(profiler, markers_from_a_callback_are_in_the_trace) {
    char dir[64], traces[128];
    tmp_make(dir, sizeof dir);
    snprintf(traces, sizeof traces, "%s/t", dir);
    cm_json_trace_handler_config jc = cm_json_trace_handler_config_default();
    jc.folder = traces;
    cm_trace_handler th;
    cr_assert_eq(cm_json_trace_handler_new(&jc, &th), CM_OK);
    cm_profiler_config pc = cm_profiler_config_default();
    pc.schedule = (cm_cyclic_schedule){0, 0, 0, 2, 1};
    pc.trace_handlers = &th, pc.n_trace_handlers = 1;
    pc.sys_prof_cpu = false;
    cm_profiler *p;
    cm_callback_plugin cbs[2];
    cr_assert_eq(cm_profiler_new(&pc, &p, &cbs[0]), CM_OK);
    cbs[1] = (cm_callback_plugin){&marking_vt, NULL};
    cm_dataset *ds = cmt_synth_dataset(48, 8, 3, false, NULL);
    cm_dataloader *dl = cmt_loader(ds, 8, false, 7);
    cm_model *model = cmt_mlp(8, 16, 3, 0.0f, 3);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = model, c.train_dataloader = dl, c.run_name = "mk";
    cr_assert_eq(cm_time_parse("3ba", &c.max_duration), CM_OK);
    c.callbacks = cbs, c.n_callbacks = 2;
    cm_trainer *tr;
    cr_assert_eq(cm_trainer_new(&c, &tr), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_fit(tr, NULL), CM_OK, "%s", cm_last_error());
    cm_trainer_free(tr);
    char path[256];
    snprintf(path, sizeof path, "%s/ep0-ba2-rank0.json", traces);
    cJSON *t = load_json(path);
    check_nesting(t, "markers");
    cr_assert_eq(count_named(t, "B", "user/work"), 2, "recorded in the 2 active batches only");
    cr_assert_eq(count_named(t, "C", "user/counter"), 2);
    cr_assert_eq(count_named(t, "B", "user/long"), 1);
    cr_assert_eq(count_named(t, "E", "user/long"), 1, "closed when the cycle was written");
    cJSON_Delete(t);
    cm_model_free(model);
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
    tmp_remove(dir);
}

Test(profiler, a_second_profiled_trainer_is_refused_while_one_records) {
    rig g = make(&(rig_opts){.sched = cm_cyclic_schedule_default()});
    cm_profiler *p2;
    cm_callback_plugin pp;
    cm_profiler_config pc = cm_profiler_config_default();
    cr_assert_eq(cm_profiler_new(&pc, &p2, &pp), CM_OK);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = cmt_mlp(8, 16, 3, 0.0f, 4);
    c.run_name = "second";
    c.callbacks = &pp, c.n_callbacks = 1;
    cm_trainer *tr;
    cr_assert_eq(cm_trainer_new(&c, &tr), CM_ERR_STATE);
    cr_assert(strstr(cm_last_error(), "another profiler"), "%s", cm_last_error());
    cm_callback_plugin_free(pp);
    cm_model_free(c.model);
    unmake(&g, false);
}

Test(profiler, json_trace_handler_refuses_bad_configs_and_a_used_folder) {
    cm_json_trace_handler_config jc = cm_json_trace_handler_config_default();
    cm_trace_handler th;
    jc.filename = "trace.json";
    cr_assert_eq(cm_json_trace_handler_new(&jc, &th), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "{rank}"), "%s", cm_last_error());
    jc = cm_json_trace_handler_config_default();
    jc.num_traces_to_keep = -2;
    cr_assert_eq(cm_json_trace_handler_new(&jc, &th), CM_ERR_INVALID_ARG);
    /* a folder with files in it, without overwrite: INIT fails naming it */
    rig g = make(&(rig_opts){.sched = cm_cyclic_schedule_default(), .max_duration = "5ba"});
    fit(&g);
    char dir[64];
    snprintf(dir, sizeof dir, "%s", g.dir);
    cm_trainer_free(g.tr);
    g.tr = NULL;
    jc = cm_json_trace_handler_config_default();
    jc.folder = g.traces;
    cr_assert_eq(cm_json_trace_handler_new(&jc, &th), CM_OK);
    cm_profiler_config pc = cm_profiler_config_default();
    pc.trace_handlers = &th, pc.n_trace_handlers = 1;
    cm_profiler *p;
    cm_callback_plugin pp;
    cr_assert_eq(cm_profiler_new(&pc, &p, &pp), CM_OK);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = g.model, c.train_dataloader = g.dl, c.run_name = "again";
    c.callbacks = &pp, c.n_callbacks = 1;
    cm_trainer *tr;
    cr_assert_eq(cm_trainer_new(&c, &tr), CM_ERR_IO);
    cr_assert(strstr(cm_last_error(), "not empty") && strstr(cm_last_error(), g.traces), "%s", cm_last_error());
    cm_callback_plugin_free(pp);
    unmake(&g, false);
}

/* ---- merging ranks -------------------------------------------------------------------------- */

/* Two ranks whose clocks differ by 1000 us: after the merge rank 1's events are on rank 0's clock,
 * everything is in time order, and the collective #7 knows rank 1 came last (30 us after rank 0). */
Test(trace_merge, ranks_share_rank0s_clock_and_collectives_name_the_last_rank) {
    char dir[64], a[128], b[128], out[128];
    tmp_make(dir, sizeof dir);
    snprintf(a, sizeof a, "%s/r0.json", dir);
    snprintf(b, sizeof b, "%s/r1.json", dir);
    snprintf(out, sizeof out, "%s/merged.json", dir);
    cmt_write_text(a, "[\n"
                  "{\"name\": \"global_rank\", \"ph\": \"M\", \"pid\": 0, \"tid\": 5, \"args\": {\"value\": 0}},\n"
                  "{\"name\": \"clock_sync_timestamp_us\", \"ph\": \"M\", \"pid\": 0, \"tid\": 5, \"args\": {\"value\": 10000}},\n"
                  "{\"name\": \"event/batch\", \"ph\": \"B\", \"ts\": 10010, \"pid\": 0, \"tid\": 5},\n"
                  "{\"name\": \"collective/all_reduce\", \"cat\": \"collective\", \"ph\": \"b\", \"id\": 7, \"ts\": 10020, "
                  "\"pid\": 0, \"tid\": 5, \"args\": {\"seq\": 7, \"bytes\": 64}},\n"
                  "{\"name\": \"collective/all_reduce\", \"cat\": \"collective\", \"ph\": \"e\", \"id\": 7, \"ts\": 10060, "
                  "\"pid\": 0, \"tid\": 5},\n"
                  "{\"name\": \"event/batch\", \"ph\": \"E\", \"ts\": 10100, \"pid\": 0, \"tid\": 5}\n]\n");
    /* rank 1's clock is 1000 us ahead; the file lacks its closing bracket (a crashed writer) */
    cmt_write_text(b, "[\n"
                  "{\"name\": \"global_rank\", \"ph\": \"M\", \"pid\": 3, \"tid\": 9, \"args\": {\"value\": 1}},\n"
                  "{\"name\": \"clock_sync_timestamp_us\", \"ph\": \"M\", \"pid\": 3, \"tid\": 9, \"args\": {\"value\": 11000}},\n"
                  "{\"name\": \"event/batch\", \"ph\": \"B\", \"ts\": 11005, \"pid\": 3, \"tid\": 9},\n"
                  "{\"name\": \"collective/all_reduce\", \"cat\": \"collective\", \"ph\": \"b\", \"id\": 7, \"ts\": 11050, "
                  "\"pid\": 3, \"tid\": 9, \"args\": {\"seq\": 7, \"bytes\": 64}},\n"
                  "{\"name\": \"collective/all_reduce\", \"cat\": \"collective\", \"ph\": \"e\", \"id\": 7, \"ts\": 11061, "
                  "\"pid\": 3, \"tid\": 9},\n"
                  "{\"name\": \"event/batch\", \"ph\": \"E\", \"ts\": 11090, \"pid\": 3, \"tid\": 9},\n");
    const char *in[2] = {b, a};
    cr_assert_eq(cm_trace_merge(in, 2, out), CM_OK, "%s", cm_last_error());
    cJSON *m = load_json(out);
    check_nesting(m, "merged");
    double prev = -1e300;
    int k = 0;
    const char *order[] = {"event/batch@1", "event/batch@0", "collective/all_reduce@0", "collective/all_reduce@1",
                           "collective/all_reduce@0", "collective/all_reduce@1", "event/batch@1", "event/batch@0"};
    const double times[] = {10005, 10010, 10020, 10050, 10060, 10061, 10090, 10100};
    const cJSON *e;
    cJSON_ArrayForEach(e, m) {
        if (!strcmp(str_of(e, "ph"), "M")) continue;
        cr_assert_lt(k, 8);
        char got[64];
        snprintf(got, sizeof got, "%s@%d", str_of(e, "name"), (int)num_of(e, "pid"));
        cr_assert_str_eq(got, order[k], "event %d: %s, want %s", k, got, order[k]);
        cr_assert_float_eq(num_of(e, "ts"), times[k], 1e-6, "event %d at %g, want %g", k, num_of(e, "ts"), times[k]);
        cr_assert_geq(num_of(e, "ts"), prev);
        prev = num_of(e, "ts");
        if (!strcmp(str_of(e, "ph"), "b")) {
            const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
            cr_assert_eq(num_of(args, "last_rank"), 1, "rank 1 arrived last");
            cr_assert_float_eq(num_of(args, "waited_us"), num_of(e, "pid") == 0 ? 30.0 : 0.0, 1e-6);
        }
        k++;
    }
    cr_assert_eq(k, 8);
    cJSON_Delete(m);
    /* errors name the file */
    cmt_write_text(a, "{\"no\": 1}");
    cr_assert_eq(cm_trace_merge(in, 2, out), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), a), "%s", cm_last_error());
    tmp_remove(dir);
}

/* ---- FLOPs ---------------------------------------------------------------------------------- */

Test(profiler, op_flops_count_gemm_like_ops_as_torch) {
    cm_tape *tp;
    cr_assert_eq(cm_tape_new(NULL, &tp), CM_OK);
    int64_t xs[2] = {4, 6}, ws[2] = {5, 6}, bs[2] = {6, 7};
    cm_tensor *x = cmt_randn(tp, 2, xs, 1, true), *w = cmt_randn(tp, 2, ws, 2, false), *b = cmt_randn(tp, 2, bs, 3, false);
    cm_tensor *y = cm_linear(tp, x, w, NULL);
    cm_tensor *ins[3] = {x, w, NULL};
    cr_assert_eq(cm_op_flops("linear", false, y, 3, ins), 2.0 * 4 * 6 * 5);
    cr_assert_eq(cm_op_flops("linear", true, y, 3, ins), 2.0 * 4 * 6 * 5, "only x needs a gradient");
    cm_tensor *z = cm_matmul(tp, x, b);
    cm_tensor *mm[2] = {x, b};
    cr_assert_eq(cm_op_flops("matmul", false, z, 2, mm), 2.0 * 4 * 7 * 6);
    cr_assert_eq(cm_op_flops("add", false, z, 2, mm), 0.0, "elementwise ops are not counted");
    int64_t q[4] = {2, 3, 5, 4}, k[4] = {2, 3, 7, 4};
    cm_tensor *qq = cmt_randn(tp, 4, q, 4, true), *kk = cmt_randn(tp, 4, k, 5, false), *vv = cmt_randn(tp, 4, k, 6, false);
    cm_tensor *o = cm_attention(tp, qq, kk, vv, NULL);
    cm_tensor *at[4] = {qq, kk, vv, NULL};
    cr_assert_eq(cm_op_flops("attention", false, o, 4, at), 4.0 * 2 * 3 * 5 * 7 * 4);
    cr_assert_eq(cm_op_flops("attention", true, o, 4, at), 8.0 * 2 * 3 * 5 * 7 * 4);
    cm_tape_free(tp);
}
