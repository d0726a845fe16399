/* Checkpoints: resumed runs equal uninterrupted ones bit for bit (parameters, optimizer state,
 * logged losses) after a clean stop, SIGTERM, and kill -9 after a completed save, in fp32 and
 * amp_bf16, with microbatches, GradientClipping and dropout, mid-epoch and at an epoch boundary,
 * with synchronous and background saves; kill -9 at random instants during saves never leaves a
 * checkpoint that loads silently wrong; truncated, flipped, missing and version-mismatched files
 * are reported by name; autoresume falls back; overwrite, rotation, unwritable folders, weights-
 * only saves, export, plugin state, configuration errors; PyTorch reads model.safetensors. */
#include "checkpoint/ckpt_impl.h"
#include "cmtest.h"
#include "cmtrain.h"

#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- a run ---- */

typedef struct run_opts {
    const char *max_duration;   /* "10ba" */
    cm_precision precision;
    int64_t mb;
    bool clip;
    float dropout;
    const char *save_folder, *save_interval, *run_name, *load_path;
    bool autoresume, save_async, overwrite, weights_only, load_weights_only;
    int keep;
    int64_t stop_at, sigterm_at, kill_at; /* batch counts (0 = never) */
    bool counter_cb;                      /* a callback with checkpoint state */
} run_opts;

typedef struct rig {
    cm_dataset *ds;
    cm_dataloader *dl;
    cm_model *model;
    cm_optim *opt;
    cm_trainer *tr;
    cm_in_memory_logger *mem;
    cm_status fit_status, new_status;
} rig;

typedef struct act_cb {
    int64_t stop_at, sigterm_at, kill_at;
    int64_t events; /* BATCH_END count: state saved in checkpoints when counter_cb */
    bool has_state;
} act_cb;

static cm_status act_run(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    act_cb *a = self;
    const int64_t b = cm_state_timestamp(st)->batch;
    if (ev == CM_EVENT_BATCH_END) {
        a->events++;
        if (a->stop_at && b == a->stop_at) cm_state_stop_training(st);
        if (a->sigterm_at && b == a->sigterm_at) raise(SIGTERM);
    }
    /* after the save at BATCH_CHECKPOINT of kill_at has committed: die without any cleanup */
    if (ev == CM_EVENT_BATCH_START && a->kill_at && b == a->kill_at) kill(getpid(), SIGKILL);
    return CM_OK;
}
static size_t act_save(void *self, char *buf, size_t cap) {
    return (size_t)snprintf(buf, cap, "{\"events\": %lld}", (long long)((act_cb *)self)->events);
}
static cm_status act_load(void *self, const char *json, size_t len) {
    long long v;
    if (sscanf(json, "{\"events\":%lld}", &v) != 1) return cm_set_error(CM_ERR_FORMAT, "bad state '%.*s'", (int)len, json);
    ((act_cb *)self)->events = v;
    return CM_OK;
}
static void act_free(void *self) { free(self); }
static const cm_callback_i act_vt = {CM_CALLBACK_ABI, "Actions", act_run, NULL, NULL, NULL, act_free};
static const cm_callback_i act_state_vt = {CM_CALLBACK_ABI, "Actions", act_run, act_save, act_load, NULL, act_free};

static cm_optim *adamw(cm_model *m) {
    cm_module *root = cm_model_module(m);
    int n = cm_module_n_units(root);
    cm_optim_span spans[8];
    cr_assert(n <= 8);
    for (int i = 0; i < n; i++) {
        const cm_unit_info *u = cm_module_unit(root, i);
        spans[i] = (cm_optim_span){u->name, u->params, u->grads, u->numel};
    }
    cm_optim *o;
    cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_DECOUPLED_ADAMW);
    hp.lr = 3e-3;
    hp.weight_decay = 1e-4;
    cr_assert_eq(cm_optim_new(CM_OPTIM_DECOUPLED_ADAMW, &o), CM_OK);
    cr_assert_eq(cm_optim_add_group(o, &hp, spans, n), CM_OK, "%s", cm_last_error());
    return o;
}

static run_opts base(void) {
    return (run_opts){.max_duration = "10ba", .precision = CM_PRECISION_FP32, .keep = -1};
}

static rig make(const run_opts *o) {
    rig g = {0};
    g.ds = cmt_synth_dataset(48, 8, 3, false, NULL); /* 6 batches of 8 per epoch */
    g.dl = cmt_loader(g.ds, 8, false, 7);
    g.model = cmt_mlp(8, 16, 3, o->dropout, 3);
    g.opt = adamw(g.model);
    cm_logger_plugin mp;
    cr_assert_eq(cm_in_memory_logger_new(&g.mem, &mp), CM_OK);
    act_cb *a = calloc(1, sizeof *a);
    a->stop_at = o->stop_at, a->sigterm_at = o->sigterm_at, a->kill_at = o->kill_at;
    cm_callback_plugin cb = {o->counter_cb ? &act_state_vt : &act_vt, a};
    cm_algorithm_plugin clip;
    if (o->clip) cr_assert_eq(cm_grad_clip_new(CM_GRAD_CLIP_NORM, 0.05, &clip), CM_OK);
    cm_sched_config cos = cm_sched_config_default(CM_SCHED_COSINE_ANNEALING_WITH_WARMUP);
    cr_assert_eq(cm_time_parse("3ba", &cos.t_warmup), CM_OK);

    cm_trainer_config c = cm_trainer_config_default();
    c.model = g.model;
    c.train_dataloader = g.dl;
    cr_assert_eq(cm_time_parse(o->max_duration, &c.max_duration), CM_OK);
    c.optimizer = g.opt;
    c.schedulers = &cos;
    c.n_schedulers = 1;
    c.precision = o->precision;
    c.device_train_microbatch_size = o->mb;
    c.algorithms = o->clip ? &clip : NULL;
    c.n_algorithms = o->clip ? 1 : 0;
    c.callbacks = &cb;
    c.n_callbacks = 1;
    c.loggers = &mp;
    c.n_loggers = 1;
    c.run_name = o->run_name ? o->run_name : "ckpt-test";
    c.save_folder = o->save_folder;
    c.save_interval_str = o->save_interval;
    c.save_overwrite = o->overwrite;
    c.save_weights_only = o->weights_only;
    c.save_num_checkpoints_to_keep = o->keep;
    c.save_async = o->save_async;
    c.autoresume = o->autoresume;
    c.load_path = o->load_path;
    c.load_weights_only = o->load_weights_only;
    g.new_status = cm_trainer_new(&c, &g.tr);
    if (g.new_status) {
        cm_callback_plugin_free(cb);
        cm_logger_plugin_free(mp);
        if (o->clip) cm_algorithm_plugin_free(clip);
    }
    return g;
}

static void unmake(rig *g) {
    cm_trainer_free(g->tr);
    cm_optim_free(g->opt);
    cm_model_free(g->model);
    cm_dataloader_free(g->dl);
    cm_dataset_free(g->ds);
}

static rig run(const run_opts *o) {
    rig g = make(o);
    cr_assert_eq(g.new_status, CM_OK, "%s", cm_last_error());
    g.fit_status = cm_trainer_fit(g.tr, NULL);
    return g;
}

/* The logged losses of a run, in order. */
static int losses(const rig *g, double *out, int cap) {
    int n = 0;
    for (int64_t i = 0; i < cm_in_memory_logger_n(g->mem); i++) {
        const cm_log_record *r = cm_in_memory_logger_record(g->mem, i);
        if (!strcmp(r->name, "loss/train/total") && n < cap) out[n++] = r->value;
    }
    return n;
}

static void expect_same_state(const rig *a, const rig *b, const char *what) {
    int64_t na, nb;
    float *pa = cmt_params_copy(a->model, &na), *pb = cmt_params_copy(b->model, &nb);
    cr_assert_eq(na, nb);
    for (int64_t i = 0; i < na; i++)
        cr_assert(memcmp(&pa[i], &pb[i], 4) == 0, "%s: parameter %lld is %.9g uninterrupted, %.9g resumed (tol 0)",
                  what, (long long)i, pa[i], pb[i]);
    free(pa);
    free(pb);
    cr_assert_eq(cm_optim_n_state(a->opt), cm_optim_n_state(b->opt));
    for (int i = 0; i < cm_optim_n_state(a->opt); i++) {
        cm_optim_state_entry ea, eb;
        cm_optim_state_get(a->opt, i, &ea);
        cm_optim_state_get(b->opt, i, &eb);
        cr_assert(memcmp(ea.data, eb.data, (size_t)ea.numel * cm_dtype_size(ea.dtype)) == 0,
                  "%s: optimizer state '%s' differs", what, ea.name);
    }
}

/* Losses of the uninterrupted run == the first run's, then the resumed run's. */
static void expect_same_losses(const rig *full, const rig *first, const rig *resumed, const char *what) {
    double lf[64], l1[64], l2[64];
    int nf = losses(full, lf, 64), n1 = losses(first, l1, 64), n2 = losses(resumed, l2, 64);
    cr_assert_eq(n1 + n2, nf, "%s: %d + %d losses logged, uninterrupted %d", what, n1, n2, nf);
    for (int i = 0; i < nf; i++) {
        double v = i < n1 ? l1[i] : l2[i - n1];
        cr_assert(memcmp(&v, &lf[i], sizeof v) == 0, "%s: loss %d is %.17g resumed, %.17g uninterrupted (tol 0)", what,
                  i, v, lf[i]);
    }
}

static char *tmpdir(void) {
    char *d = strdup("/tmp/cmckpt-XXXXXX");
    cr_assert(mkdtemp(d), "mkdtemp");
    return d;
}

static char *pjoin(const char *a, const char *b) {
    char *p = malloc(strlen(a) + strlen(b) + 2);
    sprintf(p, "%s/%s", a, b);
    return p;
}

static bool exists(const char *dir, const char *name) {
    char *p = pjoin(dir, name);
    bool e = access(p, F_OK) == 0;
    free(p);
    return e;
}

/* Trains to `cut` (by stop, SIGTERM or clean end), then autoresumes to the end, and compares
 * with the uninterrupted run. */
static void resume_case(run_opts o, const char *interval, int64_t stop_at, bool sigterm, const char *what) {
    char *dir = tmpdir();
    rig full = run(&o);
    cr_assert_eq(full.fit_status, CM_OK, "%s", cm_last_error());

    run_opts o1 = o;
    o1.save_folder = dir, o1.save_interval = interval, o1.autoresume = true;
    if (sigterm) o1.sigterm_at = stop_at;
    else o1.stop_at = stop_at;
    rig first = run(&o1);
    if (sigterm) {
        cr_assert_eq(first.fit_status, CM_ERR_INTERRUPTED, "%s", cm_last_error());
        cr_expect_eq(cm_trainer_interrupted_signal(first.tr), SIGTERM);
        cr_expect_eq(cm_trainer_exit_code(first.tr, first.fit_status), 143);
        cr_expect(strstr(cm_last_error(), "SIGTERM") && strstr(cm_last_error(), dir), "message: %s", cm_last_error());
        cr_expect_eq(cm_trainer_fit(first.tr, NULL), CM_ERR_STATE, "the trainer is closed after preemption");
    } else {
        cr_assert_eq(first.fit_status, CM_OK, "%s", cm_last_error());
    }
    cr_assert_eq(cm_state_timestamp(cm_trainer_state(first.tr))->batch, stop_at);
    cr_assert_eq(cm_trainer_close(first.tr), CM_OK, "%s", cm_last_error());

    run_opts o2 = o;
    o2.save_folder = dir, o2.save_interval = interval, o2.autoresume = true;
    rig resumed = run(&o2);
    cr_assert_eq(resumed.fit_status, CM_OK, "%s", cm_last_error());
    cr_assert(cm_trainer_resumed_from(resumed.tr), "%s: did not resume", what);
    expect_same_state(&full, &resumed, what);
    expect_same_losses(&full, &first, &resumed, what);
    unmake(&full);
    unmake(&first);
    unmake(&resumed);
    cmi_remove_tree(dir);
    free(dir);
}

/* ---- exact resumption ---- */

Test(checkpoint, resume_mid_epoch_matches_uninterrupted_fp32_with_dropout) {
    run_opts o = base();
    o.dropout = 0.3f;
    resume_case(o, "2ba", 4, false, "fp32 mid-epoch");
}

Test(checkpoint, resume_at_epoch_boundary_batch_save_matches_uninterrupted) {
    run_opts o = base();
    resume_case(o, "3ba", 6, false, "epoch boundary, saved before EPOCH_END");
}

Test(checkpoint, resume_at_epoch_boundary_epoch_save_matches_uninterrupted) {
    run_opts o = base();
    o.max_duration = "3ep";
    o.dropout = 0.2f;
    resume_case(o, "1ep", 6, false, "epoch boundary, saved after EPOCH_END");
}

Test(checkpoint, resume_amp_bf16_microbatched_with_clipping_matches_uninterrupted) {
    run_opts o = base();
    o.precision = CM_PRECISION_AMP_BF16, o.mb = 3, o.clip = true, o.dropout = 0.1f;
    resume_case(o, "2ba", 4, false, "amp_bf16, microbatch 3, clipping");
}

Test(checkpoint, sigterm_saves_closes_and_resumes_exactly) {
    run_opts o = base();
    o.mb = 3, o.clip = true, o.dropout = 0.2f;
    resume_case(o, "100ba", 5, true, "SIGTERM at batch 5");
}

Test(checkpoint, sigterm_in_bf16_at_epoch_end_resumes_exactly) {
    run_opts o = base();
    o.precision = CM_PRECISION_AMP_BF16;
    resume_case(o, "100ba", 6, true, "SIGTERM at batch 6, bf16");
}

Test(checkpoint, background_saves_resume_exactly_and_close_waits) {
    char *dir = tmpdir();
    run_opts o = base();
    o.dropout = 0.2f;
    rig full = run(&o);
    run_opts o1 = o;
    o1.save_folder = dir, o1.save_interval = "1ba", o1.save_async = true, o1.stop_at = 7, o1.autoresume = true;
    rig first = run(&o1);
    cr_assert_eq(first.fit_status, CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_close(first.tr), CM_OK, "%s", cm_last_error());
    cr_expect(exists(dir, "ep1-ba7"), "the last background save is committed by close");
    run_opts o2 = o;
    o2.save_folder = dir, o2.save_interval = "1ba", o2.save_async = true, o2.autoresume = true;
    rig resumed = run(&o2);
    cr_assert_eq(resumed.fit_status, CM_OK, "%s", cm_last_error());
    cr_expect(strstr(cm_trainer_resumed_from(resumed.tr), "ep1-ba7"), "resumed from %s", cm_trainer_resumed_from(resumed.tr));
    expect_same_state(&full, &resumed, "async");
    expect_same_losses(&full, &first, &resumed, "async");
    unmake(&full);
    unmake(&first);
    unmake(&resumed);
    cmi_remove_tree(dir);
    free(dir);
}

Test(checkpoint, kill9_after_a_completed_save_resumes_exactly) {
    char *dir = tmpdir();
    run_opts o = base();
    o.precision = CM_PRECISION_AMP_BF16, o.clip = true, o.mb = 4, o.dropout = 0.2f;
    run_opts o1 = o;
    o1.save_folder = dir, o1.save_interval = "2ba", o1.kill_at = 4, o1.autoresume = true;
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        rig g = run(&o1);
        _exit(g.fit_status == CM_OK ? 0 : 3); /* not reached: killed at batch 4 */
    }
    int ws;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    cr_assert(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL, "child status %d", ws);
    cr_assert(exists(dir, "ep0-ba4"));
    rig full = run(&o);
    /* the first part's losses: an uninterrupted run of 4 batches logs the same ones */
    run_opts o4 = o;
    o4.stop_at = 4;
    rig first = run(&o4);
    run_opts o2 = o;
    o2.save_folder = dir, o2.save_interval = "2ba", o2.autoresume = true;
    rig resumed = run(&o2);
    cr_assert_eq(resumed.fit_status, CM_OK, "%s", cm_last_error());
    expect_same_state(&full, &resumed, "kill -9");
    expect_same_losses(&full, &first, &resumed, "kill -9");
    unmake(&full);
    unmake(&first);
    unmake(&resumed);
    cmi_remove_tree(dir);
    free(dir);
}

Test(checkpoint, callback_state_is_saved_and_restored) {
    char *dir = tmpdir();
    run_opts o = base();
    o.save_folder = dir, o.save_interval = "2ba", o.stop_at = 4, o.counter_cb = true, o.autoresume = true;
    rig first = run(&o);
    cr_assert_eq(first.fit_status, CM_OK);
    run_opts o2 = base();
    o2.save_folder = dir, o2.save_interval = "2ba", o2.counter_cb = true, o2.autoresume = true;
    rig g = make(&o2);
    cr_assert_eq(g.new_status, CM_OK, "%s", cm_last_error());
    act_cb *a = cm_engine_callback(cm_trainer_engine(g.tr), 0).self;
    cr_expect_eq(a->events, 4, "the callback's counter continues from the checkpoint: %lld", (long long)a->events);
    unmake(&first);
    unmake(&g);
    cmi_remove_tree(dir);
    free(dir);
}

/* ---- never lose anything ---- */

Test(checkpoint, kill9_at_random_instants_during_saves_never_leaves_a_bad_checkpoint) {
    char *dir = tmpdir();
    srand((unsigned)time(NULL));
    int complete = 0;
    for (int iter = 0; iter < 10; iter++) {
        run_opts o = base();
        o.max_duration = "100000ba", o.save_folder = dir, o.save_interval = "1ba", o.overwrite = true, o.keep = 2;
        o.autoresume = true;
        fflush(NULL);
        pid_t pid = fork();
        cr_assert(pid >= 0);
        if (pid == 0) {
            cm_log_set_level(CM_LOG_ERROR);
            rig g = run(&o);
            _exit(g.fit_status == CM_OK ? 0 : 3);
        }
        /* the first child must get as far as one save (slow machines start slowly); later ones
         * resume and are killed anywhere: while starting, training, writing or rotating */
        for (int w = 0; iter == 0 && w < 1000 && !exists(dir, "latest"); w++) usleep(10000);
        usleep((useconds_t)(rand() % 40000));
        kill(pid, SIGKILL);
        int ws;
        waitpid(pid, &ws, 0);
        cr_assert(WIFSIGNALED(ws), "iteration %d: the child ended by itself (status %d): %s", iter, ws,
                  WIFEXITED(ws) && WEXITSTATUS(ws) == 3 ? "its fit failed" : "");
        /* every committed directory is complete; the search finds one or reports none */
        cm_checkpoint_search srch;
        cm_status s = cm_checkpoint_find_latest(dir, NULL, &srch);
        cr_assert(s == CM_OK || s == CM_ERR_NOT_FOUND, "iteration %d: %s", iter, cm_last_error());
        cr_assert_eq(srch.n_rejected, 0, "iteration %d: a committed checkpoint is damaged: %s", iter, srch.rejected);
        if (s == CM_OK) {
            complete++;
            cm_checkpoint *ck;
            cr_assert_eq(cm_checkpoint_open(srch.path, &ck), CM_OK, "%s", cm_last_error());
            cr_assert_eq(cm_checkpoint_verify(ck), CM_OK, "%s", cm_last_error());
            cm_checkpoint_close(ck);
        }
    }
    cr_expect_gt(complete, 0, "no iteration got as far as one committed save");
    /* a resumed trainer sweeps the killed saves' temporaries at its first save */
    run_opts o = base();
    o.save_folder = dir, o.save_interval = "1ba", o.overwrite = true, o.autoresume = true, o.keep = 1;
    o.max_duration = "100000ba";
    rig g = make(&o);
    cr_assert_eq(g.new_status, CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_save_checkpoint(g.tr, NULL), CM_OK, "%s", cm_last_error());
    DIR *d = opendir(dir);
    struct dirent *e;
    while ((e = readdir(d))) cr_expect(strncmp(e->d_name, ".tmp-", 5) != 0, "stale temporary '%s' left", e->d_name);
    closedir(d);
    unmake(&g);
    cmi_remove_tree(dir);
    free(dir);
}

/* Two checkpoints (ba2, ba4) in a fresh folder. */
static char *two_checkpoints(void) {
    char *dir = tmpdir();
    run_opts o = base();
    o.save_folder = dir, o.save_interval = "2ba", o.stop_at = 4;
    rig g = run(&o);
    cr_assert_eq(g.fit_status, CM_OK, "%s", cm_last_error());
    unmake(&g);
    cr_assert(exists(dir, "ep0-ba2") && exists(dir, "ep0-ba4") && exists(dir, "latest"));
    return dir;
}

static void flip_byte(const char *path, long off_from_end) {
    FILE *f = fopen(path, "r+b");
    cr_assert(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    long at = off_from_end >= 0 ? n - 1 - off_from_end : n / 2;
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
}

static void truncate_half(const char *path) {
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0);
    cr_assert_eq(truncate(path, sb.st_size / 2), 0);
}

/* open + verify must fail with a message naming `needle`, and autoresume falls back to ba2. */
static void expect_detected_and_fallback(const char *dir, const char *needle) {
    char *p = pjoin(dir, "ep0-ba4");
    cm_checkpoint *ck = NULL;
    cm_status s = cm_checkpoint_open(p, &ck);
    if (!s) s = cm_checkpoint_verify(ck);
    cm_checkpoint_close(ck);
    cr_expect_neq(s, CM_OK, "damage to %s was not detected", needle);
    cr_expect(strstr(cm_last_error(), needle) && strstr(cm_last_error(), "ep0-ba4"), "message names %s: %s", needle,
              cm_last_error());
    cm_checkpoint_search srch;
    cr_assert_eq(cm_checkpoint_find_latest(dir, NULL, &srch), CM_OK, "%s", cm_last_error());
    cr_expect(strstr(srch.path, "ep0-ba2"), "fell back to %s", srch.path);
    cr_expect_eq(srch.n_rejected, 1);
    cr_expect(strstr(srch.rejected, "ep0-ba4"), "rejected: %s", srch.rejected);
    run_opts o = base();
    o.save_folder = dir, o.autoresume = true, o.save_interval = "2ba";
    rig g = make(&o);
    cr_assert_eq(g.new_status, CM_OK, "%s", cm_last_error());
    cr_expect(strstr(cm_trainer_resumed_from(g.tr), "ep0-ba2"));
    cr_expect_eq(cm_state_timestamp(cm_trainer_state(g.tr))->batch, 2);
    unmake(&g);
    free(p);
}

Test(checkpoint, flipped_tensor_byte_is_named_and_autoresume_falls_back) {
    const char *files[] = {"model.safetensors", "optimizer.safetensors"};
    for (int i = 0; i < 2; i++) {
        char *dir = two_checkpoints();
        char *p = pjoin(dir, "ep0-ba4");
        char *f = pjoin(p, files[i]);
        flip_byte(f, 0); /* the last byte: inside the last tensor's data */
        expect_detected_and_fallback(dir, files[i]);
        free(f);
        free(p);
        cmi_remove_tree(dir);
        free(dir);
    }
}

Test(checkpoint, truncated_files_are_named_and_autoresume_falls_back) {
    const char *files[] = {"model.safetensors", "optimizer.safetensors", "manifest.json"};
    for (int i = 0; i < 3; i++) {
        char *dir = two_checkpoints();
        char *p = pjoin(dir, "ep0-ba4");
        char *f = pjoin(p, files[i]);
        truncate_half(f);
        expect_detected_and_fallback(dir, files[i]);
        free(f);
        free(p);
        cmi_remove_tree(dir);
        free(dir);
    }
}

Test(checkpoint, edited_manifest_fails_its_checksum) {
    char *dir = two_checkpoints();
    char *p = pjoin(dir, "ep0-ba4");
    char *f = pjoin(p, "manifest.json");
    /* a digit inside the manifest: still valid JSON, but not what was written */
    char *txt;
    size_t n;
    cr_assert_eq(cmi_read_file(f, 1 << 24, &txt, &n), CM_OK);
    char *at = strstr(txt, "\"batch\":\t4");
    cr_assert(at);
    at[9] = '5';
    FILE *fp = fopen(f, "wb");
    fwrite(txt, 1, n, fp);
    fclose(fp);
    cm_free(txt);
    expect_detected_and_fallback(dir, "manifest.json");
    free(f);
    free(p);
    cmi_remove_tree(dir);
    free(dir);
}

Test(checkpoint, removed_file_is_named_and_autoresume_falls_back) {
    const char *files[] = {"optimizer.safetensors", "model.safetensors", "manifest.json"};
    for (int i = 0; i < 3; i++) {
        char *dir = two_checkpoints();
        char *p = pjoin(dir, "ep0-ba4");
        char *f = pjoin(p, files[i]);
        cr_assert_eq(unlink(f), 0);
        expect_detected_and_fallback(dir, i == 2 ? "manifest" : files[i]);
        free(f);
        free(p);
        cmi_remove_tree(dir);
        free(dir);
    }
}

Test(checkpoint, deleted_latest_pointer_still_finds_the_newest) {
    char *dir = two_checkpoints();
    char *lp = pjoin(dir, "latest"), *other = pjoin(dir, "logs");
    cr_assert_eq(unlink(lp), 0);
    cr_assert_eq(mkdir(other, 0755), 0); /* not a checkpoint: ignored without a warning */
    cm_checkpoint_search srch;
    cr_assert_eq(cm_checkpoint_find_latest(dir, NULL, &srch), CM_OK, "%s", cm_last_error());
    cr_expect(strstr(srch.path, "ep0-ba4"), "found %s", srch.path);
    cr_expect_eq(srch.n_rejected, 0, "%s", srch.rejected);
    free(other);
    /* a pointer to something that is gone is reported, the newest complete one is used */
    FILE *f = fopen(lp, "w");
    fputs("ep9-ba99\n", f);
    fclose(f);
    cr_assert_eq(cm_checkpoint_find_latest(dir, NULL, &srch), CM_OK, "%s", cm_last_error());
    cr_expect(strstr(srch.path, "ep0-ba4"), "found %s", srch.path);
    cr_expect(strstr(srch.rejected, "ep9-ba99"), "rejected: %s", srch.rejected);
    free(lp);
    cmi_remove_tree(dir);
    free(dir);
}

Test(checkpoint, every_checkpoint_damaged_is_an_error_not_a_fresh_start) {
    char *dir = two_checkpoints();
    const char *names[] = {"ep0-ba2", "ep0-ba4"};
    for (int i = 0; i < 2; i++) {
        char *p = pjoin(dir, names[i]);
        char *f = pjoin(p, "model.safetensors");
        flip_byte(f, 0);
        free(f);
        free(p);
    }
    run_opts o = base();
    o.save_folder = dir, o.autoresume = true;
    rig g = make(&o);
    cr_expect_eq(g.new_status, CM_ERR_FORMAT, "%s", cm_last_error());
    cr_expect(strstr(cm_last_error(), "ep0-ba2") && strstr(cm_last_error(), "ep0-ba4"), "%s", cm_last_error());
    unmake(&g);
    cmi_remove_tree(dir);
    free(dir);
}

Test(checkpoint, other_format_versions_get_a_clear_message) {
    char *dir = two_checkpoints();
    char *p = pjoin(dir, "ep0-ba4");
    char *f = pjoin(p, "manifest.json");
    const int versions[] = {2, 0};
    const char *advice[] = {"upgrade composer", "old format version 0"};
    char *orig;
    size_t olen;
    cr_assert_eq(cmi_read_file(f, 1 << 24, &orig, &olen), CM_OK);
    for (int i = 0; i < 2; i++) {
        cm_checkpoint *ck;
        cJSON *root = cJSON_Parse(orig);
        cJSON_DeleteItemFromObject(root, "manifest_xxh3");
        cJSON_ReplaceItemInObject(root, "format_version", cJSON_CreateNumber(versions[i]));
        char *txt;
        size_t n;
        cr_assert_eq(cmi_manifest_serialize(root, &txt, &n), CM_OK);
        cJSON_Delete(root);
        FILE *fp = fopen(f, "wb");
        fwrite(txt, 1, n, fp);
        fclose(fp);
        cm_free(txt);
        cr_expect_eq(cm_checkpoint_open(p, &ck), CM_ERR_UNSUPPORTED);
        cr_expect(strstr(cm_last_error(), advice[i]) && strstr(cm_last_error(), "reads version 1"), "%s",
                  cm_last_error());
    }
    cm_free(orig);
    free(f);
    free(p);
    cmi_remove_tree(dir);
    free(dir);
}

Test(checkpoint, existing_checkpoint_is_kept_unless_save_overwrite) {
    char *dir = two_checkpoints();
    char *p = pjoin(dir, "ep0-ba4"), *m = pjoin(p, "manifest.json");
    struct stat before, after;
    cr_assert_eq(stat(m, &before), 0);
    run_opts o = base();
    o.save_folder = dir, o.save_interval = "2ba", o.stop_at = 4; /* a fresh run saving the same names */
    rig g = run(&o);
    cr_expect_eq(g.fit_status, CM_ERR_STATE);
    cr_expect(strstr(cm_last_error(), "already exists") && strstr(cm_last_error(), "save_overwrite"), "%s",
              cm_last_error());
    unmake(&g);
    cr_assert_eq(stat(m, &after), 0);
    cr_expect_eq(before.st_ino, after.st_ino, "the existing checkpoint was replaced");
    o.overwrite = true;
    g = run(&o);
    cr_expect_eq(g.fit_status, CM_OK, "%s", cm_last_error());
    unmake(&g);
    cm_checkpoint *ck;
    cr_assert_eq(cm_checkpoint_open(p, &ck), CM_OK, "%s", cm_last_error());
    cr_expect_eq(cm_checkpoint_verify(ck), CM_OK);
    cm_checkpoint_close(ck);
    free(m);
    free(p);
    cmi_remove_tree(dir);
    free(dir);
}

Test(checkpoint, unwritable_save_folder_is_a_clear_error) {
    char *dir = tmpdir();
    char *file = pjoin(dir, "a-file");
    FILE *f = fopen(file, "w");
    fclose(f);
    char *folder = pjoin(file, "ckpt");
    run_opts o = base();
    o.save_folder = folder, o.save_interval = "2ba";
    rig g = run(&o);
    cr_expect_eq(g.fit_status, CM_ERR_IO);
    cr_expect(strstr(cm_last_error(), "a-file"), "%s", cm_last_error());
    unmake(&g);
    free(folder);
    free(file);
    cmi_remove_tree(dir);
    free(dir);
}

Test(checkpoint, rotation_keeps_the_newest_and_the_pointer_follows) {
    char *dir = tmpdir();
    run_opts o = base();
    o.save_folder = dir, o.save_interval = "1ba", o.keep = 2, o.max_duration = "5ba";
    rig g = run(&o);
    cr_assert_eq(g.fit_status, CM_OK, "%s", cm_last_error());
    unmake(&g);
    for (int b = 1; b <= 5; b++) {
        char name[32];
        snprintf(name, sizeof name, "ep0-ba%d", b);
        cr_expect_eq(exists(dir, name), b >= 4, "%s %s", name, b >= 4 ? "should be kept" : "should be rotated out");
    }
    char *txt;
    size_t n;
    char *lp = pjoin(dir, "latest");
    cr_assert_eq(cmi_read_file(lp, 4096, &txt, &n), CM_OK);
    cr_expect_str_eq(txt, "ep0-ba5\n");
    cm_free(txt);
    free(lp);
    cmi_remove_tree(dir);
    free(dir);
}

Test(checkpoint, end_of_training_always_saves_and_a_finished_run_resumes_to_nothing) {
    char *dir = tmpdir();
    run_opts o = base();
    o.save_folder = dir, o.max_duration = "8ba", o.autoresume = true; /* interval 1ep: saves ba6 and the end */
    rig g = run(&o);
    cr_assert_eq(g.fit_status, CM_OK, "%s", cm_last_error());
    unmake(&g);
    cr_expect(exists(dir, "ep1-ba6"));
    cr_expect(exists(dir, "ep1-ba8"));
    g = run(&o);
    cr_assert_eq(g.fit_status, CM_OK, "%s", cm_last_error());
    double l[4];
    cr_expect_eq(losses(&g, l, 4), 0, "a finished run trains nothing more");
    unmake(&g);
    cmi_remove_tree(dir);
    free(dir);
}

Test(checkpoint, weights_only_save_load_export_and_inspect) {
    char *dir = tmpdir();
    run_opts o = base();
    o.save_folder = dir, o.save_interval = "2ba", o.max_duration = "2ba", o.weights_only = true;
    rig a = run(&o);
    cr_assert_eq(a.fit_status, CM_OK, "%s", cm_last_error());
    char *p = pjoin(dir, "ep0-ba2");
    cr_expect(!exists(p, "optimizer.safetensors"));
    cm_checkpoint *ck;
    cr_assert_eq(cm_checkpoint_open(dir, &ck), CM_OK, "%s", cm_last_error()); /* a folder: follows latest */
    cr_expect(cm_checkpoint_weights_only(ck));
    cr_expect_eq(cm_checkpoint_timestamp(ck)->batch, 2);
    cm_checkpoint_close(ck);
    /* the pointer file itself (as Composer users pass latest-rank0.pt): the checkpoint it names */
    char *ptr = pjoin(dir, "latest");
    cr_assert_eq(cm_checkpoint_open(ptr, &ck), CM_OK, "%s", cm_last_error());
    cr_expect_eq(cm_checkpoint_timestamp(ck)->batch, 2);
    cm_checkpoint_close(ck);
    free(ptr);
    /* any other file is named as what it is */
    char *bogus = pjoin(dir, "notes.txt");
    FILE *bf = fopen(bogus, "w");
    fputs("see ../elsewhere\n", bf);
    fclose(bf);
    cr_assert_eq(cm_checkpoint_open(bogus, &ck), CM_ERR_NOT_FOUND);
    cr_expect(strstr(cm_last_error(), "is a file, not a checkpoint folder"), "%s", cm_last_error());
    remove(bogus);
    free(bogus);
    cr_assert_eq(cm_checkpoint_open(dir, &ck), CM_OK, "%s", cm_last_error());
    cr_expect_str_eq(cm_checkpoint_run_name(ck), "ckpt-test");
    char sum[8192];
    cm_checkpoint_summary(ck, sum, sizeof sum);
    cr_expect(strstr(sum, "0.weight") && strstr(sum, "F32") && strstr(sum, "batch 2"), "%s", sum);
    char *out = pjoin(dir, "exported.safetensors");
    cr_assert_eq(cm_checkpoint_export_model(ck, out), CM_OK, "%s", cm_last_error());
    cm_checkpoint_close(ck);
    /* the export loads into a fresh model and equals the trained one */
    run_opts ob = base();
    ob.load_path = p;
    rig b = make(&ob);
    cr_assert_eq(b.new_status, CM_OK, "%s", cm_last_error());
    cr_expect_eq(cm_state_timestamp(cm_trainer_state(b.tr))->batch, 0, "weights only: time starts fresh");
    int64_t na, nb;
    float *pa = cmt_params_copy(a.model, &na), *pb = cmt_params_copy(b.model, &nb);
    cr_expect(na == nb && !memcmp(pa, pb, 4 * (size_t)na), "loaded weights differ");
    cm_model *m = cmt_mlp(8, 16, 3, 0, 99);
    cr_assert_eq(cm_module_load_safetensors(cm_model_module(m), out, NULL, NULL), CM_OK, "%s", cm_last_error());
    float *pc = cmt_params_copy(m, &nb);
    cr_expect(!memcmp(pa, pc, 4 * (size_t)na), "exported weights differ");
    free(pa);
    free(pb);
    free(pc);
    cm_model_free(m);
    unmake(&a);
    unmake(&b);
    free(out);
    free(p);
    cmi_remove_tree(dir);
    free(dir);
}

Test(checkpoint, load_weights_only_from_a_full_checkpoint_and_a_different_optimizer_is_refused) {
    char *dir = two_checkpoints();
    char *p = pjoin(dir, "ep0-ba4");
    run_opts o = base();
    o.load_path = p, o.load_weights_only = true;
    rig g = make(&o);
    cr_assert_eq(g.new_status, CM_OK, "%s", cm_last_error());
    cr_expect_eq(cm_state_timestamp(cm_trainer_state(g.tr))->batch, 0);
    unmake(&g);
    /* a trainer with the default optimizer (DecoupledSGDW) cannot take AdamW state */
    cm_dataset *ds = cmt_synth_dataset(48, 8, 3, false, NULL);
    cm_dataloader *dl = cmt_loader(ds, 8, false, 7);
    cm_model *m = cmt_mlp(8, 16, 3, 0, 3);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = m, c.train_dataloader = dl, c.load_path = p;
    cm_trainer *tr;
    cr_expect_eq(cm_trainer_new(&c, &tr), CM_ERR_STATE);
    cr_expect(strstr(cm_last_error(), "decoupled_adamw") && strstr(cm_last_error(), "load_weights_only"), "%s",
              cm_last_error());
    /* a missing load_path is named */
    c.load_path = "/nonexistent/ckpt";
    cr_expect_eq(cm_trainer_new(&c, &tr), CM_ERR_NOT_FOUND);
    cr_expect(strstr(cm_last_error(), "/nonexistent/ckpt"), "%s", cm_last_error());
    cm_model_free(m);
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
    free(p);
    cmi_remove_tree(dir);
    free(dir);
}

Test(checkpoint, configuration_errors_name_the_option) {
    cm_dataset *ds = cmt_synth_dataset(48, 8, 3, false, NULL);
    cm_dataloader *dl = cmt_loader(ds, 8, false, 7);
    cm_model *m = cmt_mlp(8, 16, 3, 0, 3);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = m, c.train_dataloader = dl;
    cm_trainer *tr;
    c.save_folder = "/tmp/x", c.save_interval_str = "3xx";
    cr_expect_eq(cm_trainer_new(&c, &tr), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "save_interval '3xx'"), "%s", cm_last_error());
    c.save_interval_str = "0ba";
    cr_expect_eq(cm_trainer_new(&c, &tr), CM_ERR_INVALID_ARG);
    c.save_interval_str = NULL, c.save_filename = "ep{epoch}-{step}";
    cr_expect_eq(cm_trainer_new(&c, &tr), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "{step}"), "%s", cm_last_error());
    c.save_filename = "a/b";
    cr_expect_eq(cm_trainer_new(&c, &tr), CM_ERR_INVALID_ARG);
    c.save_filename = NULL, c.autoresume = true;
    cr_expect_eq(cm_trainer_new(&c, &tr), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "run_name"), "%s", cm_last_error());
    c.autoresume = false, c.save_num_checkpoints_to_keep = 0;
    cr_expect_eq(cm_trainer_new(&c, &tr), CM_ERR_INVALID_ARG);
    cr_expect_eq(cm_exit_status(CM_OK, 0), 0);
    cr_expect_eq(cm_exit_status(CM_ERR_INTERRUPTED, SIGINT), 130);
    cr_expect_eq(cm_exit_status(CM_ERR_IO, 0), 1);
    char name[64];
    cm_timestamp ts = {.epoch = 2, .batch = 30, .sample = 240};
    cr_assert_eq(cm_checkpoint_format_name("{run_name}-ep{epoch}-ba{batch}-sp{sample}-rank{rank}", &ts, "r", 0, name,
                                           sizeof name),
                 CM_OK);
    cr_expect_str_eq(name, "r-ep2-ba30-sp240-rank0");
    cm_model_free(m);
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
}

Test(checkpoint, manifest_records_provenance_positions_and_checksums) {
    char *dir = two_checkpoints();
    char *p = pjoin(dir, "ep0-ba4");
    cm_checkpoint *ck;
    cr_assert_eq(cm_checkpoint_open(p, &ck), CM_OK, "%s", cm_last_error());
    cJSON *root = cJSON_Parse(cm_checkpoint_manifest(ck));
    cr_assert(root);
    const char *keys[] = {"format_version", "library", "created", "run_name", "world_size", "config", "timestamp",
                          "schedulers", "dataloaders", "rng", "algorithms", "callbacks", "loss_scaler", "optimizer",
                          "files", "manifest_xxh3"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        cr_expect(cJSON_HasObjectItem(root, keys[i]), "manifest lacks '%s'", keys[i]);
    /* the commit the library was built from: the tree's HEAD when the tests run after a build
     * (cmake/git_commit.cmake checks it at every build), "unknown" outside git */
    char head[128];
    const int rc = cmt_run_capture("git rev-parse --short=12 HEAD", head, sizeof head);
    head[strcspn(head, "\n")] = 0;
    const cJSON *commit = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "library"), "git_commit");
    cr_assert(cJSON_IsString(commit), "manifest's library lacks git_commit");
    cr_expect_str_eq(commit->valuestring, rc == 0 ? head : "unknown", "git_commit (rebuilt since the last commit?)");
    const cJSON *train = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "dataloaders"), "train");
    cr_expect_eq(cJSON_GetObjectItem(train, "position")->valuedouble, 32);
    cr_expect_eq(cm_checkpoint_n_tensors(ck), 4 + 3, "4 parameters + (step, exp_avg, exp_avg_sq) of the one unit");
    cm_ckpt_tensor t;
    cr_assert_eq(cm_checkpoint_tensor(ck, 0, &t), CM_OK);
    const cm_st_tensor *ft = cm_safetensors_find(cm_checkpoint_file(ck, t.file), t.name);
    cr_expect_eq(cm_hash64(ft->data, ft->nbytes, 0), t.xxh3);
    cJSON_Delete(root);
    cm_checkpoint_close(ck);
    free(p);
    cmi_remove_tree(dir);
    free(dir);
}

/* ---- PyTorch reads model.safetensors ---- */

Test(checkpoint, pytorch_loads_model_safetensors_with_our_names_and_values) {
    if (access("/usr/bin/python3", X_OK) != 0 || system("/usr/bin/python3 -c 'import torch' 2>/dev/null") != 0) {
        cr_skip_test("/usr/bin/python3 with torch is not available (scripts/install-deps --golden installs it)");
    }
    char *dir = two_checkpoints();
    char *p = pjoin(dir, "ep0-ba4");
    /* the C side's names and values */
    run_opts o = base();
    o.load_path = p, o.load_weights_only = true;
    rig g = make(&o);
    cr_assert_eq(g.new_status, CM_OK, "%s", cm_last_error());
    char *ref = pjoin(dir, "expected.txt");
    FILE *f = fopen(ref, "w");
    cm_module *root = cm_model_module(g.model);
    for (int64_t i = 0; i < cm_module_n_params(root); i++) {
        cm_param_info pi = cm_module_param_info(root, i);
        fprintf(f, "%s", pi.name);
        const float *d = cm_tensor_data(pi.tensor);
        for (int64_t k = 0; k < pi.numel; k++) fprintf(f, " %a", (double)d[k]);
        fprintf(f, "\n");
    }
    fclose(f);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/ckpt_torch_check.py %s/model.safetensors %s", p, ref);
    int rc = system(cmd);
    cr_expect_eq(rc, 0, "%s failed (status %d)", cmd, rc);
    unmake(&g);
    free(ref);
    free(p);
    cmi_remove_tree(dir);
    free(dir);
}
