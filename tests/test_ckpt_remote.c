/* Checkpoints on an object store (s3rver on loopback behind the signature-checking proxy): saves
 * upload in the background with the manifest last, the latest pointer and rotation act remotely,
 * autoresume on a fresh machine (the local staging folder deleted) continues bit for bit; upload
 * failures stop fit loudly with the local checkpoint intact; transient ones are retried; and a
 * checkpoint known to be corrupt is set aside and saved anew — locally and remotely — with the
 * run ending bitwise equal to an uninterrupted one. */
#define _GNU_SOURCE
#include "checkpoint/ckpt_impl.h"
#include "cms3.h"
#include "cmtest.h"
#include "cmtrain.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct opts {
    const char *save_folder, *interval, *max, *load_path;
    bool autoresume;
    int keep;
    int64_t stop_at; /* stop after this batch (0: run to max) */
} opts;

typedef struct rig {
    cm_dataset *ds;
    cm_dataloader *dl;
    cm_model *model;
    cm_optim *opt;
    cm_trainer *tr;
    cm_status new_status, fit_status;
} rig;

typedef struct stop_cb {
    int64_t at;
} stop_cb;

static cm_status stop_run(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    stop_cb *c = self;
    if (ev == CM_EVENT_BATCH_END && c->at && cm_state_timestamp(st)->batch == c->at) cm_state_stop_training(st);
    return CM_OK;
}
static void stop_free(void *self) { free(self); }
static const cm_callback_i stop_vt = {CM_CALLBACK_ABI, "Stopper", stop_run, NULL, NULL, NULL, stop_free};

static cm_optim *adamw(cm_model *m) {
    cm_module *root = cm_model_module(m);
    int n = cm_module_n_units(root);
    cm_optim_span spans[8];
    for (int i = 0; i < n; i++) {
        const cm_unit_info *u = cm_module_unit(root, i);
        spans[i] = (cm_optim_span){u->name, u->params, u->grads, u->numel};
    }
    cm_optim *o;
    cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_DECOUPLED_ADAMW);
    hp.lr = 3e-3;
    cr_assert_eq(cm_optim_new(CM_OPTIM_DECOUPLED_ADAMW, &o), CM_OK);
    cr_assert_eq(cm_optim_add_group(o, &hp, spans, n), CM_OK, "%s", cm_last_error());
    return o;
}

static rig run(const opts *o) {
    rig g = {0};
    g.ds = cmt_synth_dataset(48, 8, 3, false, NULL); /* 6 batches of 8 per epoch */
    g.dl = cmt_loader(g.ds, 8, false, 7);
    g.model = cmt_mlp(8, 16, 3, 0.1f, 3); /* dropout: its RNG state travels too */
    g.opt = adamw(g.model);
    stop_cb *sc = calloc(1, sizeof *sc);
    sc->at = o->stop_at;
    cm_callback_plugin cb = {&stop_vt, sc};
    cm_trainer_config c = cm_trainer_config_default();
    c.model = g.model;
    c.train_dataloader = g.dl;
    cr_assert_eq(cm_time_parse(o->max ? o->max : "10ba", &c.max_duration), CM_OK);
    c.optimizer = g.opt;
    c.callbacks = &cb;
    c.n_callbacks = 1;
    c.run_name = "remote-test";
    c.save_folder = o->save_folder;
    c.save_interval_str = o->interval;
    c.save_num_checkpoints_to_keep = o->keep ? o->keep : -1;
    c.autoresume = o->autoresume;
    c.load_path = o->load_path;
    g.new_status = cm_trainer_new(&c, &g.tr);
    if (g.new_status) {
        cm_callback_plugin_free(cb);
        return g;
    }
    g.fit_status = cm_trainer_fit(g.tr, NULL);
    return g;
}

static void unmake(rig *g) {
    cm_trainer_free(g->tr);
    cm_optim_free(g->opt);
    cm_model_free(g->model);
    cm_dataloader_free(g->dl);
    cm_dataset_free(g->ds);
}

static void expect_same_state(const rig *a, const rig *b, const char *what) {
    int64_t na, nb;
    float *pa = cmt_params_copy(a->model, &na), *pb = cmt_params_copy(b->model, &nb);
    cr_assert_eq(na, nb);
    for (int64_t i = 0; i < na; i++)
        cr_assert(memcmp(&pa[i], &pb[i], 4) == 0, "%s: parameter %lld is %.9g uninterrupted, %.9g resumed (tol 0)", what,
                  (long long)i, pa[i], pb[i]);
    free(pa);
    free(pb);
    for (int i = 0; i < cm_optim_n_state(a->opt); i++) {
        cm_optim_state_entry ea, eb;
        cm_optim_state_get(a->opt, i, &ea);
        cm_optim_state_get(b->opt, i, &eb);
        cr_assert(memcmp(ea.data, eb.data, (size_t)ea.numel * cm_dtype_size(ea.dtype)) == 0,
                  "%s: optimizer state '%s' differs", what, ea.name);
    }
    cr_assert_eq(cm_state_timestamp(cm_trainer_state(a->tr))->batch, cm_state_timestamp(cm_trainer_state(b->tr))->batch);
}

static cmt_s3 g_s3;
static char g_tmp[256];

static void setup(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/cm-ckrem-XXXXXX");
    cr_assert(mkdtemp(g_tmp));
    setenv("TMPDIR", g_tmp, 1); /* the staging folder goes under it */
    setenv("CM_STORAGE_RETRY_BACKOFF_S", "0.05", 1);
    cmt_s3_start(&g_s3, "bkt");
}

static void teardown(void) {
    cmt_s3_stop(&g_s3);
    cmi_remove_tree(g_tmp);
}

/* The staging folder is gone, as on a fresh machine. */
static void wipe_local(void) {
    char p[400];
    snprintf(p, sizeof p, "%s/composer-checkpoints", g_tmp);
    cmi_remove_tree(p);
}

static char *staging(const char *uri) { return cmi_remote_default_local(uri); }

/* The names of the remote checkpoints with a manifest, "a,b," sorted. */
static void remote_names(const char *uri, char *out, size_t cap) {
    cm_object_store *st;
    cr_assert_eq(cm_object_store_open(uri, NULL, &st), CM_OK, "%s", cm_last_error());
    cm_object_list l;
    cr_assert_eq(cm_object_store_list(st, "", &l), CM_OK, "%s", cm_last_error());
    out[0] = 0;
    for (size_t i = 0; i < l.n; i++) {
        const char *s = strchr(l.items[i].key, '/');
        if (s && !strcmp(s + 1, "manifest.json")) {
            size_t u = strlen(out);
            snprintf(out + u, cap - u, "%.*s,", (int)(s - l.items[i].key), l.items[i].key);
        }
    }
    cm_object_list_free(&l);
    cm_object_store_close(st);
}

static void remote_get(const char *uri, const char *key, char *out, size_t cap) {
    cm_object_store *st;
    cr_assert_eq(cm_object_store_open(uri, NULL, &st), CM_OK);
    char *t;
    size_t n;
    cr_assert_eq(cm_object_store_get(st, key, cap - 1, &t, &n), CM_OK, "%s", cm_last_error());
    memcpy(out, t, n + 1);
    cm_free(t);
    cm_object_store_close(st);
}

Test(ckpt_remote, s3_save_then_resume_on_a_fresh_machine_matches_uninterrupted, .init = setup, .fini = teardown,
     .timeout = 120) {
    const char *uri = "s3://bkt/runs/r1";
    opts full_o = {.max = "10ba"};
    rig full = run(&full_o);
    cr_assert_eq(full.fit_status, CM_OK, "%s", cm_last_error());

    opts o1 = {.save_folder = uri, .interval = "2ba", .max = "10ba", .autoresume = true, .stop_at = 6};
    rig first = run(&o1);
    cr_assert_eq(first.new_status, CM_OK, "%s", cm_last_error());
    cr_assert_eq(first.fit_status, CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_close(first.tr), CM_OK, "%s", cm_last_error()); /* waits for the uploads */
    char names[512], latest[64];
    remote_names(uri, names, sizeof names);
    cr_assert_str_eq(names, "ep0-ba2,ep0-ba4,ep0-ba6,", "remote checkpoints: %s", names);
    remote_get(uri, "latest", latest, sizeof latest);
    cr_assert_str_eq(latest, "ep0-ba6\n");
    unmake(&first);

    wipe_local();
    opts o2 = {.save_folder = uri, .interval = "2ba", .max = "10ba", .autoresume = true};
    rig resumed = run(&o2);
    cr_assert_eq(resumed.new_status, CM_OK, "%s", cm_last_error());
    cr_assert_eq(resumed.fit_status, CM_OK, "%s", cm_last_error());
    const char *from = cm_trainer_resumed_from(resumed.tr);
    cr_assert(from && strstr(from, "ep0-ba6"), "resumed from %s", from ? from : "(nothing)");
    expect_same_state(&full, &resumed, "s3 resume");
    /* fit returned only after the last upload */
    remote_names(uri, names, sizeof names);
    cr_assert(strstr(names, "ep1-ba10,"), "the final checkpoint is not remote when fit returned: %s", names);
    remote_get(uri, "latest", latest, sizeof latest);
    cr_assert_str_eq(latest, "ep1-ba10\n");
    cr_assert_eq(cmt_s3_stat(&g_s3, "refused"), 0, "a request was not signed right");
    unmake(&resumed);
    unmake(&full);
}

Test(ckpt_remote, rotation_and_pointer_act_remotely_and_locally, .init = setup, .fini = teardown, .timeout = 120) {
    const char *uri = "s3://bkt/rot";
    opts o = {.save_folder = uri, .interval = "2ba", .max = "10ba", .keep = 2};
    rig g = run(&o);
    cr_assert_eq(g.fit_status, CM_OK, "%s", cm_last_error());
    char names[512], latest[64];
    remote_names(uri, names, sizeof names);
    cr_assert_str_eq(names, "ep1-ba10,ep1-ba8,", "remote checkpoints after rotation: %s", names);
    remote_get(uri, "latest", latest, sizeof latest);
    cr_assert_str_eq(latest, "ep1-ba10\n");
    /* no orphan file of a rotated checkpoint */
    cm_object_store *st;
    cr_assert_eq(cm_object_store_open(uri, NULL, &st), CM_OK);
    cm_object_list l;
    cr_assert_eq(cm_object_store_list(st, "ep0-", &l), CM_OK);
    cr_assert_eq(l.n, 0, "left behind: %s", l.n ? l.items[0].key : "");
    cm_object_list_free(&l);
    cm_object_store_close(st);
    /* each checkpoint's manifest went up after its files: a checkpoint is visible only complete */
    static char stats[1 << 20];
    cmt_s3_ctl(&g_s3, "stats", stats, sizeof stats);
    const char *names_[] = {"ep0-ba2", "ep0-ba4", "ep0-ba6", "ep1-ba8", "ep1-ba10"};
    for (int i = 0; i < 5; i++) {
        char mk[128], mo[128], op[128];
        snprintf(mk, sizeof mk, "PUT /bkt/rot/%s/manifest.json", names_[i]);
        snprintf(mo, sizeof mo, "PUT /bkt/rot/%s/model.safetensors", names_[i]);
        snprintf(op, sizeof op, "PUT /bkt/rot/%s/optimizer.safetensors", names_[i]);
        const char *a = strstr(stats, mk), *b = strstr(stats, mo), *c = strstr(stats, op);
        cr_assert(a && b && c, "%s: uploads missing", names_[i]);
        cr_assert(a > b && a > c, "%s: the manifest was uploaded before a file", names_[i]);
    }
    /* the staging folder keeps the same two */
    char *loc = staging(uri);
    char *p1 = cmi_path_join(loc, "ep1-ba8"), *p2 = cmi_path_join(loc, "ep0-ba6"), *p3 = cmi_path_join(loc, "ep1-ba10");
    cr_assert(cmi_is_dir(p1) && cmi_is_dir(p3) && !cmi_is_dir(p2), "local staging rotation");
    cm_free(p1), cm_free(p2), cm_free(p3), cm_free(loc);
    unmake(&g);
}

Test(ckpt_remote, upload_failures_stop_fit_loudly_and_transient_ones_are_retried, .init = setup, .fini = teardown,
     .timeout = 120) {
    /* 500s on some uploads: retried, the run completes with every checkpoint remote */
    cmt_s3_ctl(&g_s3, "fail?status=500&count=3&match=PUT", NULL, 0);
    opts o = {.save_folder = "s3://bkt/flaky", .interval = "2ba", .max = "4ba"};
    rig g = run(&o);
    cr_assert_eq(g.fit_status, CM_OK, "%s", cm_last_error());
    char names[512];
    remote_names("s3://bkt/flaky", names, sizeof names);
    cr_assert_str_eq(names, "ep0-ba2,ep0-ba4,");
    cr_assert_geq(cmt_s3_stat(&g_s3, "faults"), 3);
    unmake(&g);
    /* the server gone for good: fit fails, naming the checkpoint, the local copy and the URI; the
     * local checkpoint is intact and complete */
    setenv("CM_STORAGE_MAX_RETRIES", "1", 1);
    cmt_s3_server_kill(&g_s3);
    opts o2 = {.save_folder = "s3://bkt/down", .interval = "2ba", .max = "4ba"};
    rig d = run(&o2);
    cr_assert_eq(d.new_status, CM_OK, "%s", cm_last_error());
    cr_assert_neq(d.fit_status, CM_OK, "fit succeeded with its uploads failing");
    const char *m = cm_last_error();
    cr_assert(strstr(m, "is saved locally in") && strstr(m, "s3://bkt/down/ep0-ba2") && strstr(m, "gave up after 1 retries"),
              "message: %s", m);
    char *loc = staging("s3://bkt/down");
    char *p = cmi_path_join(loc, "ep0-ba2");
    cm_checkpoint *ck;
    cr_assert_eq(cm_checkpoint_open(p, &ck), CM_OK, "the local checkpoint: %s", cm_last_error());
    cr_assert_eq(cm_checkpoint_verify(ck), CM_OK, "%s", cm_last_error());
    cm_checkpoint_close(ck);
    cm_free(p);
    cm_free(loc);
    unmake(&d);
    /* nothing half-uploaded is visible once the server is back */
    cmt_s3_server_restart(&g_s3);
    remote_names("s3://bkt/down", names, sizeof names);
    cr_assert_str_eq(names, "");
}

static void flip_last_byte(const char *path) {
    FILE *f = fopen(path, "r+b");
    cr_assert(f, "%s", path);
    fseek(f, -1, SEEK_END);
    int c = fgetc(f);
    fseek(f, -1, SEEK_END);
    fputc(c ^ 0x10, f);
    fclose(f);
}

static int count_prefix(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    cr_assert(d, "%s", dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += !strncmp(e->d_name, prefix, strlen(prefix));
    closedir(d);
    return n;
}

/* The "fix on the way": the newest checkpoint corrupt, autoresume falls back, and when the
 * run reaches the corrupt one's batch it sets it aside and saves anew (it used to fail with
 * "already exists"); the run ends bitwise equal to an uninterrupted one. */
Test(ckpt_remote, corrupt_checkpoint_is_set_aside_and_saved_anew_locally, .init = setup, .fini = teardown,
     .timeout = 120) {
    opts full_o = {.max = "10ba"};
    rig full = run(&full_o);
    char dir[300];
    snprintf(dir, sizeof dir, "%s/local", g_tmp);
    opts o1 = {.save_folder = dir, .interval = "2ba", .max = "10ba", .autoresume = true, .stop_at = 4};
    rig first = run(&o1);
    cr_assert_eq(first.fit_status, CM_OK, "%s", cm_last_error());
    unmake(&first);
    char f[400];
    snprintf(f, sizeof f, "%s/ep0-ba4/model.safetensors", dir);
    flip_last_byte(f);
    opts o2 = {.save_folder = dir, .interval = "2ba", .max = "10ba", .autoresume = true};
    rig resumed = run(&o2);
    cr_assert_eq(resumed.new_status, CM_OK, "%s", cm_last_error());
    cr_assert_eq(resumed.fit_status, CM_OK, "%s", cm_last_error());
    cr_assert(strstr(cm_trainer_resumed_from(resumed.tr), "ep0-ba2"), "fell back to %s", cm_trainer_resumed_from(resumed.tr));
    expect_same_state(&full, &resumed, "after setting the corrupt checkpoint aside");
    cr_assert_eq(count_prefix(dir, ".corrupt-"), 1, "the corrupt checkpoint was not kept aside");
    char p[400];
    snprintf(p, sizeof p, "%s/ep0-ba4", dir);
    cm_checkpoint *ck;
    cr_assert_eq(cm_checkpoint_open(p, &ck), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_checkpoint_verify(ck), CM_OK, "the new ep0-ba4: %s", cm_last_error());
    cm_checkpoint_close(ck);
    unmake(&resumed);
    unmake(&full);
}

Test(ckpt_remote, corrupt_checkpoint_is_set_aside_and_saved_anew_remotely, .init = setup, .fini = teardown,
     .timeout = 120) {
    const char *uri = "s3://bkt/fix";
    opts full_o = {.max = "10ba"};
    rig full = run(&full_o);
    opts o1 = {.save_folder = uri, .interval = "2ba", .max = "10ba", .autoresume = true, .stop_at = 4};
    rig first = run(&o1);
    cr_assert_eq(first.fit_status, CM_OK, "%s", cm_last_error());
    unmake(&first);
    /* corrupt the remote ep0-ba4's model (same size: only the hash can tell) */
    cm_object_store *st;
    cr_assert_eq(cm_object_store_open(uri, NULL, &st), CM_OK);
    char f[400];
    snprintf(f, sizeof f, "%s/m.safetensors", g_tmp);
    cr_assert_eq(cm_object_store_download(st, "ep0-ba4/model.safetensors", f), CM_OK, "%s", cm_last_error());
    flip_last_byte(f);
    cr_assert_eq(cm_object_store_upload(st, "ep0-ba4/model.safetensors", f), CM_OK);
    wipe_local();
    opts o2 = {.save_folder = uri, .interval = "2ba", .max = "10ba", .autoresume = true};
    rig resumed = run(&o2);
    cr_assert_eq(resumed.new_status, CM_OK, "%s", cm_last_error());
    cr_assert_eq(resumed.fit_status, CM_OK, "%s", cm_last_error());
    cr_assert(strstr(cm_trainer_resumed_from(resumed.tr), "ep0-ba2"), "fell back to %s", cm_trainer_resumed_from(resumed.tr));
    expect_same_state(&full, &resumed, "after setting the corrupt remote checkpoint aside");
    /* the damaged one is kept under a hidden name; the new ep0-ba4 is whole */
    cm_object_list l;
    cr_assert_eq(cm_object_store_list(st, ".corrupt-ep0-ba4-", &l), CM_OK);
    cr_assert_geq(l.n, 3, "the corrupt remote checkpoint was not set aside (%zu objects)", l.n);
    cm_object_list_free(&l);
    cm_object_store_close(st);
    wipe_local();
    char *loc = staging(uri);
    cmi_remote *r;
    cr_assert_eq(cmi_remote_new(uri, loc, "latest", -1, false, &r), CM_OK);
    cm_checkpoint *ck;
    cr_assert_eq(cmi_remote_open(r, "ep0-ba4", &ck), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_checkpoint_verify(ck), CM_OK, "the new remote ep0-ba4: %s", cm_last_error());
    cm_checkpoint_close(ck);
    cmi_remote_free(r);
    cm_free(loc);
    unmake(&resumed);
    unmake(&full);
}

Test(ckpt_remote, existing_remote_checkpoint_is_kept_without_save_overwrite, .init = setup, .fini = teardown,
     .timeout = 120) {
    const char *uri = "s3://bkt/lp";
    opts o1 = {.save_folder = uri, .interval = "2ba", .max = "4ba"};
    rig first = run(&o1);
    cr_assert_eq(first.fit_status, CM_OK, "%s", cm_last_error());
    unmake(&first);
    wipe_local();
    /* a second run into the same remote folder without autoresume or save_overwrite: refused */
    rig again = run(&o1);
    cr_assert_eq(again.fit_status, CM_ERR_STATE);
    cr_assert(strstr(cm_last_error(), "s3://bkt/lp/ep0-ba2' already exists") && strstr(cm_last_error(), "save_overwrite"),
              "message: %s", cm_last_error());
    unmake(&again);
}

Test(ckpt_remote, load_path_on_s3_names_a_checkpoint_or_a_folder_with_a_pointer, .init = setup, .fini = teardown,
     .timeout = 120) {
    opts full_o = {.max = "10ba"};
    rig full = run(&full_o);
    opts o1 = {.save_folder = "s3://bkt/lp", .interval = "2ba", .max = "4ba"};
    rig first = run(&o1);
    cr_assert_eq(first.fit_status, CM_OK, "%s", cm_last_error());
    unmake(&first);
    const char *paths[] = {"s3://bkt/lp/ep0-ba4", "s3://bkt/lp/"};
    for (int i = 0; i < 2; i++) {
        wipe_local();
        opts o2 = {.load_path = paths[i], .max = "10ba"};
        rig r = run(&o2);
        cr_assert_eq(r.new_status, CM_OK, "%s: %s", paths[i], cm_last_error());
        cr_assert_eq(r.fit_status, CM_OK, "%s", cm_last_error());
        cr_assert(strstr(cm_trainer_resumed_from(r.tr), "ep0-ba4"), "%s loaded %s", paths[i], cm_trainer_resumed_from(r.tr));
        expect_same_state(&full, &r, paths[i]);
        unmake(&r);
    }
    opts bad = {.load_path = "s3://bkt/lp/nothing-here", .max = "10ba"};
    rig b = run(&bad);
    cr_assert_eq(b.new_status, CM_ERR_NOT_FOUND, "%s", cm_last_error());
    cr_assert(strstr(cm_last_error(), "s3://bkt/lp/nothing-here"), "message: %s", cm_last_error());
    unmake(&b);
    unmake(&full);
}

/* A lazy open downloads a file only when a read first touches it: reading a model tensor fetches
 * model.safetensors and nothing else (a sharded resume reads only its ranks' pieces, so each rank
 * downloads only the files holding them). */
Test(ckpt_remote, lazy_open_downloads_only_the_files_read, .init = setup, .fini = teardown, .timeout = 120) {
    const char *uri = "s3://bkt/lazy";
    opts o = {.save_folder = uri, .interval = "2ba", .max = "2ba"};
    rig g = run(&o);
    cr_assert_eq(g.fit_status, CM_OK, "%s", cm_last_error());
    unmake(&g);
    wipe_local();
    char *loc = staging(uri);
    cmi_remote *r;
    cr_assert_eq(cmi_remote_new(uri, loc, "latest", -1, false, &r), CM_OK);
    cm_checkpoint *ck;
    cr_assert_eq(cmi_remote_open(r, "ep0-ba2", &ck), CM_OK, "%s", cm_last_error());
    char mp[600], op[600];
    snprintf(mp, sizeof mp, "%s/ep0-ba2/model.safetensors", loc);
    snprintf(op, sizeof op, "%s/ep0-ba2/optimizer.safetensors", loc);
    cr_assert(access(mp, F_OK) != 0 && access(op, F_OK) != 0, "files were downloaded at open");
    const char *name = cmi_ck_global_name(ck, CMI_CK_KIND_MODEL, 0);
    cmi_ck_global gl;
    cr_assert(cmi_ck_find(ck, CMI_CK_KIND_MODEL, name, &gl));
    float *buf = malloc(sizeof(float) * (size_t)gl.numel);
    cr_assert_eq(cmi_ck_read_range(ck, CMI_CK_KIND_MODEL, name, 0, gl.numel, buf), CM_OK, "%s", cm_last_error());
    cr_assert(access(mp, F_OK) == 0, "the model file was not fetched");
    cr_assert(access(op, F_OK) != 0, "the optimizer file was fetched without being read");
    cr_assert_eq(cm_checkpoint_verify(ck), CM_OK, "%s", cm_last_error()); /* verify fetches the rest */
    cr_assert(access(op, F_OK) == 0);
    free(buf);
    cm_checkpoint_close(ck);
    cmi_remote_free(r);
    cm_free(loc);
}
