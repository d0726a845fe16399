/* LoadCheckpoint (Composer's): the model's weights from a checkpoint or a .safetensors file, at a
 * chosen event; and CheckpointSaver's arguments onto the trainer's own saver. */
#include "cb_impl.h"

#include <composer/checkpoint.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct load_cb {
    char *path;
    cm_event event;
    bool strict, done;
    char **ignore;
    int n_ignore;
} load_cb;

cm_load_checkpoint_config cm_load_checkpoint_config_default(void) {
    return (cm_load_checkpoint_config){NULL, CM_EVENT_BEFORE_LOAD, true, NULL, 0};
}

static bool ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static cm_status load_weights(load_cb *c, const cm_state *st) {
    int n_spans = 0;
    cm_state_shard_spans(st, &n_spans);
    if (n_spans > 0)
        return cm_set_error(CM_ERR_UNSUPPORTED, "LoadCheckpoint: the parameters are sharded over the ranks; load "
                                                "'%s' with the trainer's load_path instead", c->path);
    cm_module *root = cm_model_module(cm_state_model(st));
    cm_load_opts lo = cm_load_opts_default();
    lo.strict = c->strict;
    lo.ignore = (const char *const *)c->ignore, lo.n_ignore = c->n_ignore;
    if (ends_with(c->path, ".safetensors")) return cm_module_load_safetensors(root, c->path, &lo, NULL);
    cm_checkpoint *ck;
    cm_status s = cm_checkpoint_open(c->path, &ck);
    if (s) return s;
    char file[4200];
    bool temp = false;
    if (!cm_checkpoint_sharded(ck) && cm_checkpoint_file(ck, "model.safetensors")) {
        s = cm_checkpoint_verify(ck);
        snprintf(file, sizeof file, "%s/model.safetensors", cm_checkpoint_path(ck));
    } else { /* pieces on several files: assembled (and verified) into one */
        snprintf(file, sizeof file, "/tmp/cm-load-checkpoint-%ld-XXXXXX", (long)getpid());
        int fd = mkstemp(file);
        if (fd < 0) s = cm_set_error(CM_ERR_IO, "LoadCheckpoint: cannot make a temporary file to assemble '%s'", c->path);
        else close(fd), temp = true;
        if (!s) s = cm_checkpoint_export_model(ck, file);
    }
    cm_checkpoint_close(ck);
    if (!s) s = cm_module_load_safetensors(root, file, &lo, NULL);
    if (temp) unlink(file);
    return s;
}

static cm_status lc_run_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    load_cb *c = self;
    if (ev != c->event || c->done) return CM_OK;
    c->done = true;
    cm_status s = load_weights(c, st);
    if (s) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "LoadCheckpoint: loading '%s' on %s: %s", c->path, cm_event_name(ev), msg);
    }
    cm_log_msg(CM_LOG_INFO, "LoadCheckpoint: loaded the weights of '%s' on %s", c->path, cm_event_name(ev));
    return CM_OK;
}

static void lc_free(void *self) {
    load_cb *c = self;
    for (int i = 0; i < c->n_ignore; i++) cm_free(c->ignore[i]);
    cm_free(c->ignore);
    cm_free(c->path);
    cm_free(c);
}

static const cm_callback_i load_vt = {
    .abi = CM_CALLBACK_ABI,
    .name = "LoadCheckpoint",
    .run_event = lc_run_event,
    .free = lc_free,
};

cm_status cm_load_checkpoint_new(const cm_load_checkpoint_config *cfg, cm_callback_plugin *out) {
    if (!cfg || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_load_checkpoint_new: NULL argument");
    *out = (cm_callback_plugin){0};
    if (!cfg->load_path || !cfg->load_path[0])
        return cm_set_error(CM_ERR_INVALID_ARG, "LoadCheckpoint: load_path is required (a checkpoint directory or a "
                                                ".safetensors file)");
    if ((unsigned)cfg->event >= CM_EVENT_COUNT || cfg->event == CM_EVENT_INIT)
        return cm_set_error(CM_ERR_INVALID_ARG, "LoadCheckpoint: event %d is not an event it can load on (INIT comes "
                                                "before the model is the trainer's; use BEFORE_LOAD or later)",
                            (int)cfg->event);
    if (cfg->n_ignore_keys < 0 || (cfg->n_ignore_keys && !cfg->ignore_keys))
        return cm_set_error(CM_ERR_INVALID_ARG, "LoadCheckpoint: n_ignore_keys %d without ignore_keys", cfg->n_ignore_keys);
    load_cb *c = cm_alloc_zeroed(sizeof *c, 16);
    if (!c) return cm_set_error(CM_ERR_OOM, "LoadCheckpoint: out of memory");
    bool oom = !(c->path = cbi_strdup(cfg->load_path));
    if (cfg->n_ignore_keys) {
        oom |= !(c->ignore = cm_alloc_zeroed(sizeof *c->ignore * (size_t)cfg->n_ignore_keys, 16));
        for (int i = 0; c->ignore && i < cfg->n_ignore_keys; i++, c->n_ignore++)
            oom |= !(c->ignore[i] = cbi_strdup(cfg->ignore_keys[i]));
    }
    if (oom) {
        lc_free(c);
        return cm_set_error(CM_ERR_OOM, "LoadCheckpoint: out of memory");
    }
    c->event = cfg->event;
    c->strict = cfg->strict_model_weights;
    *out = (cm_callback_plugin){&load_vt, c};
    return CM_OK;
}

/* ---- CheckpointSaver ---- */

cm_checkpoint_saver_config cm_checkpoint_saver_config_default(void) {
    return (cm_checkpoint_saver_config){"{run_name}/checkpoints", "ep{epoch}-ba{batch}", "latest",
                                        cm_time_make(1, CM_TIME_EPOCH), false, -1, false};
}

cm_status cm_checkpoint_saver_apply(const cm_checkpoint_saver_config *cfg, const char *run_name, char *folder_buf,
                                    size_t cap, cm_trainer_config *tc) {
    if (!cfg || !tc || !folder_buf || !cap) return cm_set_error(CM_ERR_INVALID_ARG, "cm_checkpoint_saver_apply: NULL argument");
    if (!cfg->folder || !cfg->folder[0]) return cm_set_error(CM_ERR_INVALID_ARG, "CheckpointSaver: folder is empty");
    if (cfg->num_checkpoints_to_keep < -1 || cfg->num_checkpoints_to_keep == 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "CheckpointSaver: num_checkpoints_to_keep %d (use -1 for all, or a count "
                                                ">= 1)", cfg->num_checkpoints_to_keep);
    size_t k = 0;
    for (const char *p = cfg->folder; *p; p++) {
        const char *rep = NULL;
        if (!strncmp(p, "{run_name}", 10)) rep = run_name ? run_name : "";
        const size_t n = rep ? strlen(rep) : 1;
        if (k + n + 1 > cap)
            return cm_set_error(CM_ERR_INVALID_ARG, "CheckpointSaver: folder '%s' is too long once expanded", cfg->folder);
        memcpy(folder_buf + k, rep ? rep : p, n);
        k += n;
        if (rep) p += 9;
    }
    folder_buf[k] = '\0';
    tc->save_folder = folder_buf;
    tc->save_filename = cfg->filename;
    tc->save_latest_filename = cfg->latest_filename;
    tc->save_interval = cfg->save_interval;
    tc->save_interval_str = NULL;
    tc->save_weights_only = cfg->weights_only;
    tc->save_num_checkpoints_to_keep = cfg->num_checkpoints_to_keep;
    tc->save_overwrite = cfg->overwrite;
    return CM_OK;
}
