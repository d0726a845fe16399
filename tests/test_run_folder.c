/* Run folders and run names (include/composer/report.h). */
#include "cmtest.h"

#include <composer/report.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[64];

static void make_dir(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/cm_runs_XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir), "mkdtemp failed");
}

static void remove_dir(void) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "chmod -R u+w '%s'; rm -rf '%s'", g_dir, g_dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(run_folder, .init = make_dir, .fini = remove_dir);

static bool is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

Test(run_folder, generated_names_look_like_composers) {
    char a[CM_RUN_NAME_MAX], b[CM_RUN_NAME_MAX], c[CM_RUN_NAME_MAX];
    cm_run_name_generate(1718000000, 42, a, sizeof a);
    cm_run_name_generate(1718000000, 42, b, sizeof b);
    cm_run_name_generate(1718000000, 43, c, sizeof c);
    cr_assert_str_eq(a, b, "same entropy, same name: '%s' vs '%s'", a, b);
    cr_assert_str_neq(a, c, "entropy 42 and 43 both gave '%s'", a);
    /* "<time>-<adjective>-<animal>", lower-case words. */
    cr_assert_eq(strncmp(a, "1718000000-", 11), 0, "name '%s'", a);
    const char *w1 = a + 11, *dash = strchr(w1, '-');
    cr_assert_not_null(dash, "name '%s' has no second dash", a);
    cr_assert_null(strchr(dash + 1, '-'), "name '%s' has more than three parts", a);
    for (const char *q = w1; *q; q++) cr_assert(*q == '-' || islower((unsigned char)*q), "name '%s'", a);
    cr_assert(dash > w1 && dash[1], "empty word in '%s'", a);
    cr_assert_eq(cm_run_name_check(a), CM_OK, "%s", cm_last_error());
    /* Many draws give many different names. */
    int distinct = 0;
    char seen[64][CM_RUN_NAME_MAX];
    for (uint64_t e = 0; e < 64; e++) {
        char n[CM_RUN_NAME_MAX];
        cm_run_name_generate(0, e, n, sizeof n);
        bool dup = false;
        for (int i = 0; i < distinct && !dup; i++) dup = strcmp(seen[i], n) == 0;
        if (!dup) snprintf(seen[distinct++], CM_RUN_NAME_MAX, "%s", n);
    }
    cr_assert_geq(distinct, 50, "only %d distinct names in 64 draws", distinct);
}

Test(run_folder, creates_nested_folder_and_reuses_it) {
    char root[128], *path = NULL;
    snprintf(root, sizeof root, "%s/a/b/runs", g_dir);
    cr_assert_eq(cm_run_folder_create(root, "my-run", &path), CM_OK, "%s", cm_last_error());
    char want[192];
    snprintf(want, sizeof want, "%s/my-run", root);
    cr_assert_str_eq(path, want);
    cr_assert(is_dir(path), "%s is not a folder", path);

    /* Existing files survive a second create (autoresume). */
    char *log_path = NULL;
    cr_assert_eq(cm_run_folder_path(path, CM_RUN_FILE_LOG, &log_path), CM_OK);
    FILE *f = fopen(log_path, "w");
    cr_assert_not_null(f);
    fputs("epoch 0\n", f);
    fclose(f);
    char *again = NULL;
    cr_assert_eq(cm_run_folder_create(root, "my-run", &again), CM_OK, "%s", cm_last_error());
    cr_assert_str_eq(again, path);
    cr_assert_eq(access(log_path, F_OK), 0, "the log was removed");
    cm_free(again);
    cm_free(log_path);
    cm_free(path);

    /* A trailing slash on the root does not double up. */
    snprintf(root, sizeof root, "%s/c/", g_dir);
    cr_assert_eq(cm_run_folder_create(root, "x", &path), CM_OK, "%s", cm_last_error());
    snprintf(want, sizeof want, "%s/c/x", g_dir);
    cr_assert_str_eq(path, want);
    cm_free(path);
}

Test(run_folder, null_name_generates_one_and_null_root_is_runs) {
    char root[128], *path = NULL;
    snprintf(root, sizeof root, "%s/runs", g_dir);
    cr_assert_eq(cm_run_folder_create(root, NULL, &path), CM_OK, "%s", cm_last_error());
    cr_assert(is_dir(path));
    const char *name = path + strlen(root) + 1;
    cr_assert(isdigit((unsigned char)name[0]) && strchr(name, '-'), "generated name '%s'", name);
    cm_free(path);

    /* root NULL: "runs" under the working directory. */
    char cwd[512];
    cr_assert_not_null(getcwd(cwd, sizeof cwd));
    cr_assert_eq(chdir(g_dir), 0);
    cr_assert_eq(cm_run_folder_create(NULL, "r1", &path), CM_OK, "%s", cm_last_error());
    cr_assert_str_eq(path, "runs/r1");
    cr_assert(is_dir("runs/r1"));
    cm_free(path);
    cr_assert_eq(chdir(cwd), 0);
}

Test(run_folder, standard_file_paths) {
    char *p = NULL;
    cr_assert_eq(cm_run_folder_path("runs/x", CM_RUN_FILE_CONFIG, &p), CM_OK);
    cr_assert_str_eq(p, "runs/x/config.yaml");
    cm_free(p);
    cr_assert_eq(cm_run_folder_path("runs/x/", CM_RUN_FILE_METRICS, &p), CM_OK);
    cr_assert_str_eq(p, "runs/x/metrics.jsonl");
    cm_free(p);
    cr_assert_eq(cm_run_folder_path("runs/x", CM_RUN_FILE_PLOT, &p), CM_OK);
    cr_assert_str_eq(p, "runs/x/loss.svg");
    cm_free(p);
    cr_assert_eq(cm_run_folder_path(NULL, "x", &p), CM_ERR_INVALID_ARG);
}

Test(run_folder, bad_names_and_paths_are_errors_naming_them) {
    char root[128], *path = (char *)1;
    snprintf(root, sizeof root, "%s/runs", g_dir);
    struct { const char *name, *msg; } bad[] = {
        {"", "empty"}, {".", "'.'"}, {"..", "'..'"}, {"a/b", "contains '/'"}, {"a\nb", "control character 0x0a"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(cm_run_folder_create(root, bad[i].name, &path), CM_ERR_INVALID_ARG, "name '%s' accepted",
                     bad[i].name);
        cr_assert(strstr(cm_last_error(), bad[i].msg), "message '%s' lacks '%s'", cm_last_error(), bad[i].msg);
        cr_assert_null(path);
    }
    char long_name[300];
    memset(long_name, 'a', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    cr_assert_eq(cm_run_name_check(long_name), CM_ERR_INVALID_ARG);

    /* A file where a folder should be. */
    char file[160];
    snprintf(file, sizeof file, "%s/plain-file", g_dir);
    FILE *f = fopen(file, "w");
    cr_assert_not_null(f);
    fclose(f);
    cr_assert_eq(cm_run_folder_create(file, "r", &path), CM_ERR_IO);
    cr_assert(strstr(cm_last_error(), file), "message '%s' lacks the path", cm_last_error());
    cr_assert(strstr(cm_last_error(), "not a folder"), "message: %s", cm_last_error());
    cr_assert_eq(cm_run_folder_create(g_dir, "plain-file", &path), CM_ERR_IO);
    cr_assert(strstr(cm_last_error(), "plain-file"), "message: %s", cm_last_error());

    /* No permission (root bypasses permissions, so only checked when it applies). */
    if (geteuid() != 0) {
        char ro[160];
        snprintf(ro, sizeof ro, "%s/readonly", g_dir);
        cr_assert_eq(mkdir(ro, 0555), 0);
        cr_assert_eq(cm_run_folder_create(ro, "r", &path), CM_ERR_IO);
        cr_assert(strstr(cm_last_error(), "readonly/r"), "message: %s", cm_last_error());
    }
    cr_assert_eq(cm_run_folder_create(root, "ok", NULL), CM_ERR_INVALID_ARG);
}
