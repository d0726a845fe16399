/* `composer ckpt inspect | verify | export` on a checkpoint a trainer saved: the summary, a
 * passing and a failing verify (a flipped byte is named), an export that loads into a model, and
 * usage errors. Runs the built binary (CM_COMPOSER_BIN). */
#include "checkpoint/ckpt_impl.h"
#include "cmtest.h"
#include "cmtrain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef CM_COMPOSER_BIN
#error "CM_COMPOSER_BIN must name the composer binary (tests/CMakeLists.txt sets it)"
#endif

static int run_cli(const char *args, char *out, size_t cap) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", CM_COMPOSER_BIN, args);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Trains 3 batches with a save at the end into a new folder; returns the folder. */
static char *saved_run(cm_model **model_out) {
    char *dir = strdup("/tmp/cmckpt-cli-XXXXXX");
    cr_assert(mkdtemp(dir));
    cm_dataset *ds = cmt_synth_dataset(48, 8, 3, false, NULL);
    cm_dataloader *dl = cmt_loader(ds, 8, false, 7);
    cm_model *m = cmt_mlp(8, 16, 3, 0, 3);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = m, c.train_dataloader = dl, c.save_folder = dir, c.run_name = "cli";
    cm_time_parse("3ba", &c.max_duration);
    cm_trainer *tr;
    cr_assert_eq(cm_trainer_new(&c, &tr), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_fit(tr, NULL), CM_OK, "%s", cm_last_error());
    cm_trainer_free(tr);
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
    *model_out = m;
    return dir;
}

Test(cli_ckpt, inspect_verify_export_round_trip) {
    cm_model *m;
    char *dir = saved_run(&m);
    char out[16384], args[1024];
    snprintf(args, sizeof args, "ckpt inspect %s", dir); /* a save folder: follows latest */
    cr_assert_eq(run_cli(args, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "ep0-ba3") && strstr(out, "batch 3") && strstr(out, "run         cli") &&
                  strstr(out, "2.weight") && strstr(out, "config      xxh3"),
              "%s", out);
    snprintf(args, sizeof args, "ckpt verify %s/ep0-ba3", dir);
    cr_assert_eq(run_cli(args, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "ok:"), "%s", out);
    snprintf(args, sizeof args, "ckpt export %s/ep0-ba3 -o %s/exported.safetensors", dir, dir);
    cr_assert_eq(run_cli(args, out, sizeof out), 0, "%s", out);
    cm_model *m2 = cmt_mlp(8, 16, 3, 0, 77);
    char path[512];
    snprintf(path, sizeof path, "%s/exported.safetensors", dir);
    cr_assert_eq(cm_module_load_safetensors(cm_model_module(m2), path, NULL, NULL), CM_OK, "%s", cm_last_error());
    int64_t na, nb;
    float *pa = cmt_params_copy(m, &na), *pb = cmt_params_copy(m2, &nb);
    cr_expect(na == nb && !memcmp(pa, pb, 4 * (size_t)na), "exported weights differ from the trained ones");
    free(pa);
    free(pb);
    /* damage: verify fails with status 1 and names the tensor */
    snprintf(path, sizeof path, "%s/ep0-ba3/model.safetensors", dir);
    FILE *f = fopen(path, "r+b");
    fseek(f, -1, SEEK_END);
    int c = fgetc(f);
    fseek(f, -1, SEEK_END);
    fputc(c ^ 1, f);
    fclose(f);
    snprintf(args, sizeof args, "ckpt verify %s/ep0-ba3", dir);
    cr_expect_eq(run_cli(args, out, sizeof out), 1, "%s", out);
    cr_expect(strstr(out, "corrupt") && strstr(out, "model.safetensors"), "%s", out);
    snprintf(args, sizeof args, "ckpt export %s/ep0-ba3 -o %s/x.safetensors", dir, dir);
    cr_expect_eq(run_cli(args, out, sizeof out), 1, "%s", out);
    cm_model_free(m);
    cm_model_free(m2);
    cmi_remove_tree(dir);
    free(dir);
}

Test(cli_ckpt, usage_errors) {
    char out[4096];
    cr_expect_eq(run_cli("ckpt", out, sizeof out), 2);
    cr_expect_eq(run_cli("ckpt inspekt x", out, sizeof out), 2);
    cr_expect(strstr(out, "did you mean 'inspect'"), "%s", out);
    cr_expect_eq(run_cli("ckpt verify", out, sizeof out), 2);
    cr_expect_eq(run_cli("ckpt export /tmp", out, sizeof out), 1, "not a checkpoint: %s", out);
    cr_expect_eq(run_cli("ckpt verify /nonexistent-ckpt", out, sizeof out), 1);
    cr_expect(strstr(out, "/nonexistent-ckpt"), "%s", out);
    cr_expect_eq(run_cli("ckpt inspect --help", out, sizeof out), 0);
    cr_expect(strstr(out, "usage:"), "%s", out);
}
