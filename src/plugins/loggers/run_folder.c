/* Run folder helpers: cm_run_folder_setup (report.h's folder, checked writable) and atomic small
 * text files (config.yaml). */
#include "loggers_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

char *cmi_strdup(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = cm_alloc(n, 8);
    if (d) memcpy(d, s, n);
    return d;
}

bool cmi_is_trace(const char *name) { return name && strncmp(name, "traces/", 7) == 0; }

static cm_status check_writable(const char *dir) {
    if (access(dir, W_OK | X_OK) != 0)
        return cm_set_error(CM_ERR_IO, "run folder '%s' is not writable: %s (choose another root or fix its permissions)",
                            dir, strerror(errno));
    return CM_OK;
}

cm_status cmi_folder_make(const char *dir) {
    if (!dir || !dir[0]) return cm_set_error(CM_ERR_INVALID_ARG, "run folder: the folder path is empty");
    char *p = cmi_strdup(dir);
    if (!p) return CM_ERR_OOM;
    size_t len = strlen(p);
    cm_status st = CM_OK;
    for (size_t i = 1; i <= len && st == CM_OK; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        if (p[i - 1] == '/') continue;
        char saved = p[i];
        p[i] = '\0';
        struct stat sb;
        if (mkdir(p, 0777) != 0) {
            int err = errno;
            if (!(err == EEXIST && stat(p, &sb) == 0 && S_ISDIR(sb.st_mode)))
                st = cm_set_error(CM_ERR_IO, "run folder: cannot create '%s': %s", p,
                                  err == EEXIST ? "a file that is not a folder is in the way" : strerror(err));
        }
        p[i] = saved;
    }
    cm_free(p);
    return st ? st : check_writable(dir);
}

cm_run_folder_config cm_run_folder_config_default(void) {
    return (cm_run_folder_config){.root = CM_RUN_ROOT_DEFAULT, .run_name = NULL};
}

cm_status cm_run_folder_setup(const cm_run_folder_config *cfg, char **out_path) {
    if (!out_path) return cm_set_error(CM_ERR_INVALID_ARG, "cm_run_folder_setup: out_path must not be NULL");
    *out_path = NULL;
    cm_run_folder_config c = cfg ? *cfg : cm_run_folder_config_default();
    char *dir;
    cm_status st = cm_run_folder_create(c.root, c.run_name, &dir);
    if (st) return st;
    if ((st = check_writable(dir))) {
        cm_free(dir);
        return st;
    }
    *out_path = dir;
    return CM_OK;
}

cm_status cm_run_folder_write_text(const char *dir, const char *file, const char *text) {
    if (!dir || !file || !text)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_run_folder_write_text: dir, file and text must not be NULL");
    if (!file[0] || strchr(file, '/') || !strcmp(file, ".") || !strcmp(file, ".."))
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_run_folder_write_text: '%s' is not a plain file name", file);
    char *path, *tmp = NULL;
    cm_status st = cm_run_folder_path(dir, file, &path);
    if (st) return st;
    size_t n = strlen(path) + 32;
    tmp = cm_alloc(n, 8);
    if (!tmp) {
        cm_free(path);
        return CM_ERR_OOM;
    }
    snprintf(tmp, n, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        st = cm_set_error(CM_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    } else {
        size_t len = strlen(text);
        bool ok = fwrite(text, 1, len, f) == len;
        int err = ok ? 0 : errno;
        if (fclose(f) != 0 && ok) ok = false, err = errno;
        if (!ok) st = cm_set_error(CM_ERR_IO, "cannot write '%s': %s", path, strerror(err));
        else if (rename(tmp, path) != 0)
            st = cm_set_error(CM_ERR_IO, "cannot write '%s': rename from '%s' failed: %s", path, tmp, strerror(errno));
        if (st) remove(tmp);
    }
    cm_free(tmp);
    cm_free(path);
    return st;
}
