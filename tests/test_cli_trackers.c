/* The tracker loggers from YAML: `composer train` with loggers: {tensorboard: ..., mlflow: ...,
 * wandb: ...} on a few MNIST batches — the files and requests they produce, and the messages for
 * misspelt or bad arguments. Runs the built binary (CM_COMPOSER_BIN). */
#include "cmtest.h"
#include "cmtrack.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CM_COMPOSER_BIN
#error "CM_COMPOSER_BIN must name the composer binary (tests/CMakeLists.txt sets it)"
#endif
#define DIR "build/test_cli_trackers"

static char out[1 << 16];

static int run(const char *args) {
    return cmt_run_capturef(out, sizeof out, "%s %s", CM_COMPOSER_BIN, args);
}

static void setup(void) {
    cr_assert_eq(system("rm -rf " DIR " && mkdir -p " DIR), 0);
    FILE *f = fopen(DIR "/mnist.yaml", "w");
    fputs("run_root: " DIR "/runs\nmax_duration: 3ba\neval_interval: 0\nprogress_bar: false\n"
          "model: {name: mlp, preset: mnist_small}\n"
          "train_loader: {dataset: {type: mnist, dir: ../shared/data/mnist}, batch_size: 64}\n"
          "optimizer: {name: sgd, lr: 0.1, momentum: 0.9}\n",
          f);
    fclose(f);
}

TestSuite(cli_trackers, .init = setup);

/* The only file in a folder (the event file's name has the time, host and pid in it). */
static char *only_file(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "ls -1 '%s'", dir);
    int rc;
    char *o = cmt_run(cmd, &rc);
    cr_assert_eq(rc, 0, "no folder %s", dir);
    char *nl = strchr(o, '\n');
    cr_assert(nl && nl[1] == '\0', "want one file in %s, got:\n%s", dir, o);
    *nl = '\0';
    char *p = malloc(strlen(dir) + strlen(o) + 2);
    sprintf(p, "%s/%s", dir, o);
    free(o);
    return p;
}

Test(cli_trackers, tensorboard_from_yaml_writes_a_readable_event_file) {
    int rc = run("train " DIR "/mnist.yaml run_name=tb loggers.tensorboard.log_dir=" DIR "/tb "
                 "loggers.tensorboard.flush_interval=1");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    char *file = only_file(DIR "/tb/tb");
    cr_assert(strstr(file, "/events.out.tfevents."), "%s", file);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/trackers/tb_read.py '%s'", file);
    char *json = cmt_run(cmd, &rc);
    cr_assert_eq(rc, 0, "tb_read.py failed on %s", file);
    cJSON *ev = cJSON_Parse(json);
    int losses = 0;
    for (int i = 0; i < cJSON_GetArraySize(ev); i++) {
        const cJSON *e = cJSON_GetArrayItem(ev, i);
        const cJSON *v = cJSON_GetArrayItem(cJSON_GetObjectItem(e, "values"), 0);
        const cJSON *tag = v ? cJSON_GetObjectItem(v, "tag") : NULL;
        if (tag && strcmp(tag->valuestring, "loss/train/total") == 0) {
            losses++;
            cr_assert_eq(cJSON_GetObjectItem(e, "step")->valuedouble, losses - 1, "loss %d at step %g", losses,
                         cJSON_GetObjectItem(e, "step")->valuedouble);
        }
    }
    cr_assert_eq(losses, 3, "%d train losses in %s", losses, file);
    cJSON_Delete(ev);
    free(json), free(file);
}

Test(cli_trackers, mlflow_from_yaml_logs_the_run_to_the_server) {
    cmt_server srv = cmt_server_start("mlflow_server.py");
    char args[2048];
    snprintf(args, sizeof args,
             "train " DIR "/mnist.yaml run_name=ml loggers.mlflow.tracking_uri=%s loggers.mlflow.experiment_name=cli "
             "loggers.mlflow.tags.team=vision 'loggers.mlflow.ignore_metrics=[\"trainer/*\"]' "
             "loggers.mlflow.flush_interval=0.1 loggers.mlflow.synchronous=false",
             srv.url);
    int rc = run(args);
    cJSON *st = cmt_server_state(&srv);
    cmt_server_stop(&srv);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "loggers.mlflow.synchronous has no effect here"), "%s", out);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(st, "violations")), 0, "%s", cJSON_Print(st));
    const cJSON *run = cJSON_GetObjectItem(st, "runs")->child;
    cr_assert_not_null(run);
    const cJSON *info = cJSON_GetObjectItem(run, "info"), *data = cJSON_GetObjectItem(run, "data");
    cr_assert_str_eq(cJSON_GetObjectItem(info, "run_name")->valuestring, "ml");
    cr_assert_str_eq(cJSON_GetObjectItem(info, "status")->valuestring, "FINISHED");
    cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(data, "tags"), "team")->valuestring, "vision");
    int losses = 0, trainer = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, cJSON_GetObjectItem(data, "metrics")) {
        const char *k = cJSON_GetObjectItem(m, "key")->valuestring;
        losses += !strcmp(k, "loss/train/total");
        trainer += !strncmp(k, "trainer/", 8);
    }
    cr_assert_eq(losses, 3);
    cr_assert_eq(trainer, 0, "ignore_metrics trainer/* let %d through", trainer);
    cJSON_Delete(st);
}

Test(cli_trackers, wandb_from_yaml_online_and_offline) {
    cmt_server srv = cmt_server_start("wandb_server.py");
    setenv("WANDB_API_KEY", "test-key", 1);
    setenv("WANDB_BASE_URL", srv.url, 1);
    char args[2048];
    snprintf(args, sizeof args,
             "train " DIR "/mnist.yaml run_name=wb loggers.wandb.project=p 'loggers.wandb.tags=[x, y]' "
             "loggers.wandb.flush_interval=0.1 loggers.wandb.init_kwargs.notes=hello");
    int rc = run(args);
    cJSON *st = cmt_server_state(&srv);
    cmt_server_stop(&srv);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(st, "violations")), 0, "%s", cJSON_Print(st));
    const cJSON *wrun = cJSON_GetObjectItem(st, "runs")->child;
    cr_assert_not_null(wrun);
    cr_assert_str_eq(cJSON_GetObjectItem(wrun, "displayName")->valuestring, "wb");
    cr_assert_str_eq(cJSON_GetObjectItem(wrun, "notes")->valuestring, "hello");
    cmt_assert_json(cJSON_GetObjectItem(wrun, "tags"), "[\"x\",\"y\"]");
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(wrun, "history")), 3, "one row per batch");
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(wrun, "complete")));
    cJSON_Delete(st);
    /* offline, through init_kwargs as Composer passes it; no key needed */
    unsetenv("WANDB_API_KEY");
    rc = run("train " DIR "/mnist.yaml run_name=wboff loggers.wandb.init_kwargs.mode=offline "
             "loggers.wandb.init_kwargs.dir=" DIR "/wbdir");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    int lrc;
    char *ls = cmt_run("ls -1 " DIR "/wbdir/wandb/offline-run-*/run-*.wandb", &lrc);
    cr_assert_eq(lrc, 0, "no offline run file: %s", ls);
    char *nl = strchr(ls, '\n');
    cr_assert(nl && nl[1] == '\0', "want one run file, got %s", ls);
    *nl = '\0';
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/trackers/wandb_read.py '%s'", ls);
    char *json = cmt_run(cmd, &rc);
    cr_assert_eq(rc, 0, "wandb_read.py failed on %s", ls);
    cJSON *recs = cJSON_Parse(json);
    int hist = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, recs) hist += cJSON_GetObjectItem(r, "history") != NULL;
    cr_assert_eq(hist, 3);
    cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(recs, 1), "run"), "display_name")
                         ->valuestring,
                     "wboff");
    cJSON_Delete(recs);
    free(json), free(ls);
}

Test(cli_trackers, misspelt_or_bad_tracker_arguments_name_the_key) {
    struct {
        const char *args;
        int rc;
        const char *want;
    } cases[] = {
        {"loggers.tensorbord={}", 2, "unknown loggers 'tensorbord' (did you mean 'tensorboard'?"},
        {"loggers.tensorboard.flush_intervall=5", 2,
         "unknown key 'loggers.tensorboard.flush_intervall' (did you mean 'loggers.tensorboard.flush_interval'?)"},
        {"loggers.tensorboard.flush_interval=0", 2, "flush_interval must be at least 1 batch"},
        {"loggers.tensorboard.rank_zero_only=maybe", 2, "loggers.tensorboard.rank_zero_only: 'maybe'"},
        {"loggers.mlflow.tracking_uri=http://localhost:1' 'loggers.mlflow.experiment=x", 2,
         "unknown key 'loggers.mlflow.experiment' (did you mean 'loggers.mlflow.experiment_name'?)"},
        {"loggers.mlflow.tracking_uri=file:///tmp/mlruns", 2, "is not an http(s) URL"},
        {"loggers.mlflow.tags=[a]", 2, "loggers.mlflow.tags: expected a map"},
        {"loggers.wandb.init_kwargs.mode=offline' 'loggers.wandb.init_kwargs.job_typ=x", 2,
         "unknown key 'loggers.wandb.init_kwargs.job_typ' (did you mean 'loggers.wandb.init_kwargs.job_type'?)"},
        {"loggers.wandb.init_kwargs.mode=sometimes", 2, "loggers.wandb.init_kwargs.mode: unknown value 'sometimes'"},
        {"loggers.wandb.init_kwargs.mode=offline' 'loggers.wandb.projct=p", 2, "did you mean 'loggers.wandb.project'?"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char args[1024];
        snprintf(args, sizeof args, "train " DIR "/mnist.yaml --print-config '%s'", cases[i].args);
        int rc = run(args);
        cr_assert_eq(rc, cases[i].rc, "%s: exit %d, want %d:\n%s", cases[i].args, rc, cases[i].rc, out);
        cr_assert(strstr(out, cases[i].want), "%s: output lacks '%s':\n%s", cases[i].args, cases[i].want, out);
    }
}
