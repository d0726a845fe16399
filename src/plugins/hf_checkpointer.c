/* The HuggingFaceCheckpointer callback (llm-foundry's) and the export of a checkpoint to a
 * pretrained folder (composer/hf.h). The callback's checkpoint state is the folder's config.json
 * and tokenizer files, as Composer keeps state["integrations"]["huggingface"]; with a save_folder
 * it also writes folders during training. */
#include <composer/checkpoint.h>
#include <composer/hf.h>
#include <composer/zoo_bert.h>
#include <composer/zoo_gpt2.h>

#include "checkpoint/ckpt_impl.h"
#include "zoo/hf_impl.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Paths are cut to PATH_MAX-sized buffers on purpose (longer ones cannot be opened anyway). */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#define NAME "HuggingFaceCheckpointer"
#define MAX_PATH 4096

typedef struct hfc {
    char *state;        /* the checkpoint state: {"task", "config", "tokenizer"} */
    size_t state_len;
    char *config_json;  /* config.json's text */
    cm_hf_file *files;  /* the tokenizer's files */
    int n_files;
    char *save_folder;  /* NULL: record only */
    char *name_pattern;
    cm_time interval;
    int64_t last_batch; /* the batch of the last folder written (-1: none) */
    int64_t last_sample, last_token; /* at the previous batch end (sp / tok intervals) */
} hfc;

cm_hf_checkpointer_config cm_hf_checkpointer_config_default(void) {
    cm_hf_checkpointer_config c;
    memset(&c, 0, sizeof c);
    c.model_max_length = -1;
    c.save_interval = cm_time_dur(1.0);
    c.huggingface_folder_name = "ba{batch}";
    return c;
}

static void hfc_free(void *self) {
    hfc *h = self;
    if (!h) return;
    cm_free(h->state);
    cm_free(h->config_json);
    cm_hf_files_free(h->files, h->n_files);
    cm_free(h->save_folder);
    cm_free(h->name_pattern);
    cm_free(h);
}

static char *str_dup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = cm_alloc(n, 8);
    if (d) memcpy(d, s, n);
    return d;
}

static size_t hfc_save(void *self, char *buf, size_t cap) {
    hfc *h = self;
    if (cap) {
        size_t n = h->state_len < cap - 1 ? h->state_len : cap - 1;
        memcpy(buf, h->state, n);
        buf[n] = '\0';
    }
    return h->state_len;
}

/* The state describes the folder, not progress: nothing to restore; it only has to be ours. */
static cm_status hfc_load(void *self, const char *json, size_t len) {
    (void)self;
    cJSON *j = cJSON_ParseWithLength(json, len);
    bool ok = cJSON_IsObject(j) && cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(j, "config"));
    cJSON_Delete(j);
    return ok ? CM_OK : cm_set_error(CM_ERR_FORMAT, NAME ": the checkpoint's state has no \"config\" object");
}

static cm_status write_folder(hfc *h, const cm_state *st) {
    const cm_timestamp *ts = cm_state_timestamp(st);
    h->last_batch = ts->batch;
    if (cm_state_rank(st) != 0) return CM_OK;
    char name[300], dir[MAX_PATH];
    cm_status s = cm_checkpoint_format_name(h->name_pattern, ts, cm_state_run_name(st), 0, name, sizeof name);
    if (s != CM_OK) return s;
    snprintf(dir, sizeof dir, "%s/huggingface/%s", h->save_folder, name);
    if ((s = cmi_hf_mkdirs(dir)) == CM_OK) s = cmi_hf_write(dir, h->config_json, cm_state_model(st), h->files, h->n_files);
    if (s != CM_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, NAME ": writing the pretrained folder '%s': %s", dir, msg);
    }
    cm_log_msg(CM_LOG_INFO, NAME ": wrote %s (config.json, model.safetensors%s)", dir, h->n_files ? ", tokenizer" : "");
    return CM_OK;
}

/* Whether the interval (ba, ep, sp, tok) is due at this event. */
static bool due(hfc *h, cm_event ev, const cm_state *st) {
    const cm_timestamp *ts = cm_state_timestamp(st);
    cm_time iv = h->interval;
    if (iv.unit == CM_TIME_DURATION) { /* a fraction of max_duration, in its unit */
        cm_time max = cm_state_max_duration(st);
        if (iv.frac >= 1.0 || max.unit == CM_TIME_DURATION) return false; /* the end: FIT_END */
        iv = cm_time_make((int64_t)(iv.frac * (double)max.count + 0.5), max.unit);
        if (iv.count < 1) iv.count = 1;
    }
    switch (iv.unit) {
    case CM_TIME_BATCH: return ev == CM_EVENT_BATCH_END && ts->batch % iv.count == 0;
    case CM_TIME_EPOCH: return ev == CM_EVENT_EPOCH_END && ts->epoch % iv.count == 0;
    case CM_TIME_SAMPLE:
    case CM_TIME_TOKEN: { /* a multiple of the interval was passed during this batch */
        if (ev != CM_EVENT_BATCH_END) return false;
        const bool sp = iv.unit == CM_TIME_SAMPLE;
        const int64_t prev = sp ? h->last_sample : h->last_token, now = sp ? ts->sample : ts->token;
        return now / iv.count > prev / iv.count;
    }
    default: return false;
    }
}

static cm_status hfc_run_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    (void)lg;
    hfc *h = self;
    if (!h->save_folder) return CM_OK;
    const cm_timestamp *ts = cm_state_timestamp(st);
    cm_status s = CM_OK;
    if (ev == CM_EVENT_FIT_START) {
        h->last_batch = -1;
        /* model surgery ran at INIT: refuse now, not after hours of training */
        if ((s = cmi_hf_check_plain(cm_state_model(st))) != CM_OK) {
            char msg[2048];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            return cm_set_error(s, NAME " (save_folder %s): %s", h->save_folder, msg);
        }
    } else if (ev == CM_EVENT_FIT_END) {
        if (h->last_batch != ts->batch) s = write_folder(h, st);
    } else if ((ev == CM_EVENT_BATCH_END || ev == CM_EVENT_EPOCH_END) && due(h, ev, st) && h->last_batch != ts->batch) {
        s = write_folder(h, st);
    }
    if (ev == CM_EVENT_FIT_START || ev == CM_EVENT_BATCH_END) h->last_sample = ts->sample, h->last_token = ts->token;
    return s;
}

static const cm_callback_i hfc_vt = {
    .abi = CM_CALLBACK_ABI,
    .name = NAME,
    .run_event = hfc_run_event,
    .save = hfc_save,
    .load = hfc_load,
    .free = hfc_free,
};

static cm_hf_task task_of(const cm_model *m) {
    const char *t = cm_model_type_name(m);
    if (!strcmp(t, "BertForMaskedLM")) return CM_HF_TASK_MASKED_LM;
    if (!strcmp(t, "BertForSequenceClassification")) return CM_HF_TASK_SEQUENCE_CLASSIFICATION;
    return CM_HF_TASK_CAUSAL_LM;
}

cm_status cm_hf_checkpointer_new(const cm_hf_checkpointer_config *cfg, cm_callback_plugin *out) {
    if (!cfg || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_hf_checkpointer_new: NULL argument");
    if (!cfg->model || (!cm_bert_model_config(cfg->model) && !cm_gpt2_model_config(cfg->model)))
        return cm_set_error(CM_ERR_INVALID_ARG, NAME ": the model must be a BERT or GPT-2 zoo model (got %s)",
                            cfg->model ? cm_model_type_name(cfg->model) : "none");
    const cm_time_unit u = cfg->save_interval.unit;
    if (cfg->save_folder && (u == CM_TIME_ITERATION || u == CM_TIME_SECOND ||
                             (u != CM_TIME_DURATION && cfg->save_interval.count < 1) ||
                             (u == CM_TIME_DURATION && !(cfg->save_interval.frac > 0))))
        return cm_set_error(CM_ERR_INVALID_ARG, NAME ": save_interval must be a positive count of ba, ep, sp, tok or dur");
    const char *pattern = cfg->huggingface_folder_name ? cfg->huggingface_folder_name : "ba{batch}";
    char probe[300];
    cm_timestamp ts0 = {0};
    if (cm_checkpoint_format_name(pattern, &ts0, "run", 0, probe, sizeof probe) != CM_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(CM_ERR_INVALID_ARG, NAME ": huggingface_folder_name '%s': %s", pattern, msg);
    }
    hfc *h = cm_alloc_zeroed(sizeof *h, 16);
    if (!h) return CM_ERR_OOM;
    h->interval = cfg->save_interval;
    h->last_batch = -1;
    const cm_bert_config *b = cm_bert_model_config(cfg->model);
    const cm_gpt2_config *g = cm_gpt2_model_config(cfg->model);
    int64_t max_len = cfg->model_max_length > 0 ? cfg->model_max_length
                                                : (b ? b->max_position_embeddings : g->n_positions);
    cm_status st = cm_hf_config_json(cfg->model, cfg->tokenizer ? cm_tokenizer_special(cfg->tokenizer, CM_TOKEN_EOT) : -1,
                                     &h->config_json);
    if (st == CM_OK && cfg->tokenizer) st = cm_hf_tokenizer_files(cfg->tokenizer, max_len, &h->files, &h->n_files);
    if (st == CM_OK && ((cfg->save_folder && !(h->save_folder = str_dup(cfg->save_folder))) ||
                        !(h->name_pattern = str_dup(pattern))))
        st = CM_ERR_OOM;
    /* the state: {"task": ..., "config": {...}, "tokenizer": {"<file>": "<content>"}} */
    cJSON *o = st == CM_OK ? cJSON_CreateObject() : NULL, *tk = NULL;
    if (st == CM_OK) {
        cJSON *conf = cJSON_Parse(h->config_json);
        bool ok = o && conf && cJSON_AddItemToObject(o, "config", conf);
        if (!ok) cJSON_Delete(conf);
        ok = ok && cJSON_AddStringToObject(o, "task", cm_hf_task_name(task_of(cfg->model))) &&
             (tk = cJSON_AddObjectToObject(o, "tokenizer"));
        for (int i = 0; ok && i < h->n_files; i++) ok = cJSON_AddStringToObject(tk, h->files[i].name, h->files[i].data);
        char *s = ok ? cJSON_PrintUnformatted(o) : NULL;
        if (s) {
            h->state_len = strlen(s);
            h->state = str_dup(s);
            cJSON_free(s);
        }
        if (!h->state) st = cm_set_error(CM_ERR_OOM, NAME ": out of memory");
    }
    cJSON_Delete(o);
    if (st != CM_OK) {
        hfc_free(h);
        return st;
    }
    *out = (cm_callback_plugin){&hfc_vt, h};
    return CM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * composer ckpt export --hf
 * ------------------------------------------------------------------------------------------- */

/* The HuggingFaceCheckpointer state in a manifest, or NULL. */
static const cJSON *find_state(const cJSON *manifest) {
    const cJSON *cbs = cJSON_GetObjectItemCaseSensitive(manifest, "callbacks");
    for (const cJSON *c = cJSON_IsArray(cbs) ? cbs->child : NULL; c; c = c->next) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(c, "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, NAME)) return cJSON_GetObjectItemCaseSensitive(c, "state");
    }
    return NULL;
}

/* The first required_on_load algorithm of the manifest whose model surgery a folder cannot express
 * (cmi_hf_folder_keeps); NULL when none. */
static const char *surgery_of(const cJSON *manifest) {
    const cJSON *algs = cJSON_GetObjectItemCaseSensitive(manifest, "algorithms");
    for (const cJSON *a = cJSON_IsArray(algs) ? algs->child : NULL; a; a = a->next) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(a, "name");
        if (cJSON_IsString(n) && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "required_on_load")) &&
            !cmi_hf_folder_keeps(n->valuestring))
            return n->valuestring;
    }
    return NULL;
}

static cm_status write_text(const char *dir, const char *name, const char *text) {
    char p[MAX_PATH];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return cmi_write_file_atomic(p, text, strlen(text));
}

/* Moves every file of src into dst (created if missing). */
static cm_status move_files(const char *src, const char *dst, const char *const *names, int n) {
    cm_status st = cmi_hf_mkdirs(dst);
    for (int i = 0; st == CM_OK && i < n; i++) {
        char a[MAX_PATH], b[MAX_PATH];
        snprintf(a, sizeof a, "%s/%s", src, names[i]);
        snprintf(b, sizeof b, "%s/%s", dst, names[i]);
        if (rename(a, b) != 0) st = cm_set_error(CM_ERR_IO, "cannot move '%s' to '%s': %s", a, b, strerror(errno));
    }
    if (st == CM_OK) st = cmi_fsync_dir(dst);
    return st;
}

cm_status cm_hf_export_checkpoint(const char *checkpoint, const char *dir) {
    if (!checkpoint || !dir) return cm_set_error(CM_ERR_INVALID_ARG, "cm_hf_export_checkpoint: NULL argument");
    cm_checkpoint *ck;
    cm_status st = cm_checkpoint_open(checkpoint, &ck);
    if (st != CM_OK) return st;
    cJSON *man = cJSON_Parse(cm_checkpoint_manifest(ck));
    const cJSON *state = man ? find_state(man) : NULL;
    const cJSON *conf = cJSON_GetObjectItemCaseSensitive(state, "config");
    const cJSON *task = cJSON_GetObjectItemCaseSensitive(state, "task");
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(state, "tokenizer");
    if (!cJSON_IsObject(conf) || !cJSON_IsString(task)) {
        st = cm_set_error(CM_ERR_NOT_FOUND,
                          "checkpoint '%s' has no %s state (config.json and tokenizer): it was not trained from a "
                          "Hugging Face model (model: {name: hf} in composer train, or cm_hf_checkpointer_new); "
                          "'composer ckpt export -o model.safetensors' exports its weights alone",
                          cm_checkpoint_path(ck), NAME);
        cJSON_Delete(man);
        cm_checkpoint_close(ck);
        return st;
    }
    /* model surgery recorded in the manifest changes what the weights mean */
    const char *alg = surgery_of(man);
    if (alg) {
        const cJSON *arch = cJSON_GetObjectItemCaseSensitive(conf, "architectures");
        const cJSON *cls = cJSON_IsArray(arch) ? arch->child : NULL;
        st = cm_set_error(CM_ERR_UNSUPPORTED,
                          "checkpoint '%s' was trained with %s, model surgery that a pretrained folder cannot express "
                          "(config.json describes a plain %s; the folder would load back as another model). "
                          "Fine-tune from the checkpoint itself: load_path=%s load_weights_only=true "
                          "load_strict_model_weights=false (the checkpoint re-applies %s)",
                          cm_checkpoint_path(ck), alg, cJSON_IsString(cls) ? cls->valuestring : task->valuestring,
                          cm_checkpoint_path(ck), alg);
        cJSON_Delete(man);
        cm_checkpoint_close(ck);
        return st;
    }
    /* everything goes into a temporary folder beside dir, is loaded back, then moved */
    char tmp[MAX_PATH];
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", dir, (long)getpid());
    cmi_remove_tree(tmp);
    const char *names[16];
    int n = 0;
    names[n++] = "config.json";
    names[n++] = "model.safetensors";
    st = cmi_hf_mkdirs(tmp);
    char *text = st == CM_OK ? cJSON_Print(conf) : NULL;
    if (st == CM_OK && !text) st = CM_ERR_OOM;
    if (st == CM_OK) {
        size_t len = strlen(text);
        char *withnl = cm_alloc(len + 2, 8);
        if (!withnl) st = CM_ERR_OOM;
        else {
            memcpy(withnl, text, len);
            memcpy(withnl + len, "\n", 2);
            st = write_text(tmp, "config.json", withnl);
            cm_free(withnl);
        }
    }
    cJSON_free(text);
    for (const cJSON *f = cJSON_IsObject(tok) ? tok->child : NULL; st == CM_OK && f; f = f->next) {
        if (!cJSON_IsString(f) || strchr(f->string, '/') || f->string[0] == '.' || n == 16) {
            st = cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': %s state has a bad tokenizer file entry '%s'",
                              cm_checkpoint_path(ck), NAME, f->string);
            break;
        }
        names[n++] = f->string;
        st = write_text(tmp, f->string, f->valuestring);
    }
    char p[MAX_PATH];
    snprintf(p, sizeof p, "%s/model.safetensors", tmp);
    if (st == CM_OK) st = cm_checkpoint_export_model(ck, p);
    /* the folder must load as what it claims to be */
    cm_hf_load_opts o = cm_hf_load_opts_default();
    if (st == CM_OK) st = cm_hf_task_parse(task->valuestring, &o.task);
    cm_model *m = NULL;
    if (st == CM_OK) {
        cm_log_level lv = cm_log_get_level();
        cm_log_set_level(CM_LOG_ERROR); /* a complete folder has no new heads to announce */
        st = cm_hf_load(tmp, &o, &m, NULL);
        cm_log_set_level(lv);
        if (st != CM_OK) {
            char msg[2048];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            st = cm_set_error(st, "checkpoint '%s' does not export to a loadable pretrained folder: %s",
                              cm_checkpoint_path(ck), msg);
        }
    }
    cm_model_free(m);
    if (st == CM_OK) st = move_files(tmp, dir, names, n);
    cmi_remove_tree(tmp);
    cJSON_Delete(man);
    cm_checkpoint_close(ck);
    return st;
}
