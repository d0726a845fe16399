/* The trainer's checkpoints: options, what a checkpoint holds (the snapshot), the transactional
 * commit (temporary directory, fsync, verify, rename, pointer, rotation), the background writer,
 * and loading a checkpoint back into a trainer (autoresume, load_path). */
#define _GNU_SOURCE
#include "checkpoint/ckpt_impl.h"
#include "base/prof_impl.h"
#include "tensor/tensor_impl.h"

#include <composer/surgery_algorithms.h>

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef CM_GIT_COMMIT
#define CM_GIT_COMMIT "unknown"
#endif

const cJSON *cmi_checkpoint_root(const cm_checkpoint *ck); /* reader.c */

static char *dup_str(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s);
    char *p = cm_alloc(n + 1, 1);
    if (p) memcpy(p, s, n + 1);
    return p;
}

static void free_strs(char **v, int n) {
    for (int i = 0; v && i < n; i++) cm_free(v[i]);
    cm_free(v);
}

static cm_status dup_strs(const char *const *src, int n, char ***out) {
    *out = NULL;
    if (n <= 0) return CM_OK;
    char **v = cm_alloc_zeroed(sizeof *v * (size_t)n, 16);
    if (!v) return CM_ERR_OOM;
    for (int i = 0; i < n; i++) {
        if (!src[i] || !(v[i] = dup_str(src[i]))) {
            free_strs(v, n);
            return src[i] ? CM_ERR_OOM : cm_set_error(CM_ERR_INVALID_ARG, "a NULL pattern in a load_* list");
        }
    }
    *out = v;
    return CM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Options
 * ------------------------------------------------------------------------------------------- */

static bool has_folder(const cm_trainer_config *c) { return c->save_folder && c->save_folder[0]; }

cm_status cmi_ckpt_validate(const cm_trainer_config *c) {
    cm_status s;
    if (c->save_interval_str) {
        cm_time t;
        if ((s = cm_time_parse_named("save_interval", c->save_interval_str, &t))) return s;
    }
    cm_time iv = c->save_interval;
    if (c->save_interval_str) cm_time_parse_named("save_interval", c->save_interval_str, &iv);
    char buf[CM_TIME_STR_MAX];
    cm_time_to_string(iv, buf, sizeof buf);
    if (iv.unit == CM_TIME_DURATION ? !(iv.frac > 0 && iv.frac <= 1)
                                    : (iv.unit == CM_TIME_ITERATION || iv.unit == CM_TIME_SECOND ||
                                       (unsigned)iv.unit >= CM_TIME_UNIT_COUNT || iv.count <= 0))
        return cm_set_error(CM_ERR_INVALID_ARG, "save_interval '%s': use a positive count in ep, ba, sp or tok, or a "
                                                "fraction of the run in (0, 1] dur (e.g. \"1ep\", \"500ba\", \"0.25dur\")",
                            buf);
    if (c->save_num_checkpoints_to_keep == 0 || c->save_num_checkpoints_to_keep < -1)
        return cm_set_error(CM_ERR_INVALID_ARG, "save_num_checkpoints_to_keep %d: use -1 (keep all) or a positive count",
                            c->save_num_checkpoints_to_keep);
    if (has_folder(c)) {
        char name[300];
        cm_timestamp ts = {0};
        if ((s = cm_checkpoint_format_name(c->save_filename ? c->save_filename : CM_CKPT_FILENAME_DEFAULT, &ts, "run",
                                           0, name, sizeof name)))
            return s;
        const char *ln = c->save_latest_filename;
        if (ln && ln[0] && (ln[0] == '.' || strchr(ln, '/')))
            return cm_set_error(CM_ERR_INVALID_ARG, "save_latest_filename '%s': a plain file name, without '/' and not "
                                                    "starting with '.' (or \"\" for no pointer)", ln);
    }
    if (c->autoresume && (!has_folder(c) || !c->run_name || !c->run_name[0]))
        return cm_set_error(CM_ERR_INVALID_ARG, "autoresume needs save_folder (where the checkpoints are) and run_name "
                                                "(set it explicitly, so a restarted run finds its own checkpoints)");
    if ((c->n_load_ignore_keys < 0 || (c->n_load_ignore_keys && !c->load_ignore_keys)) ||
        (c->n_load_exclude_algorithms < 0 || (c->n_load_exclude_algorithms && !c->load_exclude_algorithms)))
        return cm_set_error(CM_ERR_INVALID_ARG, "load_ignore_keys / load_exclude_algorithms: a count without its array");
    return CM_OK;
}

cm_status cmi_ckpt_new(cm_trainer *tr, const cm_trainer_config *c) {
    cmi_ckpt *ck = cm_alloc_zeroed(sizeof *ck, 64);
    if (!ck) return CM_ERR_OOM;
    tr->ckpt = ck;
    ck->save_interval = c->save_interval;
    if (c->save_interval_str) cm_time_parse_named("save_interval", c->save_interval_str, &ck->save_interval);
    ck->save_overwrite = c->save_overwrite;
    ck->save_weights_only = c->save_weights_only;
    ck->save_async = c->save_async;
    ck->handle_signals = c->handle_signals;
    ck->autoresume = c->autoresume;
    ck->keep = c->save_num_checkpoints_to_keep;
    ck->async_max_bytes = c->save_async_max_bytes ? c->save_async_max_bytes : ((size_t)1 << 30);
    ck->load_weights_only = c->load_weights_only;
    ck->load_strict = c->load_strict_model_weights;
    ck->last_saved_batch = -1;
    ck->last_saved_epoch = -1;
    ck->rank = c->dist.rank;
    if (has_folder(c)) {
        /* file:// is a local folder; s3://, gs://, oci:// commit into a local staging folder and upload */
        const char *sf = !strncmp(c->save_folder, "file://", 7) ? c->save_folder + 7 : c->save_folder;
        const bool remote = cm_storage_is_remote(sf);
        if (!(ck->save_folder = remote ? cmi_remote_default_local(sf) : dup_str(sf)) ||
            !(ck->save_filename = dup_str(c->save_filename ? c->save_filename : CM_CKPT_FILENAME_DEFAULT)) ||
            !(ck->save_latest_filename =
                  dup_str(c->save_latest_filename ? c->save_latest_filename : CM_CKPT_LATEST_DEFAULT)))
            return CM_ERR_OOM;
        cm_status rs = remote ? cmi_remote_new(sf, ck->save_folder, ck->save_latest_filename, ck->keep,
                                               c->dist.rank == 0, &ck->remote)
                              : CM_OK;
        if (rs) return rs;
    }
    if (c->load_path && c->load_path[0] &&
        !(ck->load_path = dup_str(!strncmp(c->load_path, "file://", 7) ? c->load_path + 7 : c->load_path)))
        return CM_ERR_OOM;
    if (c->dist.world_size > 1 && (ck->save_folder || ck->load_path || ck->autoresume) &&
        (!c->dist.broadcast || !c->dist.all_gather))
        return cm_set_error(CM_ERR_INVALID_ARG, "checkpoints in a %d-rank run are collective and need the dist hooks "
                                                "broadcast and all_gather (cm_dist_trainer_hooks sets them)",
                            c->dist.world_size);
    cm_status s;
    if ((s = dup_strs(c->load_ignore_keys, c->n_load_ignore_keys, &ck->ignore_keys))) return s;
    ck->n_ignore_keys = c->n_load_ignore_keys > 0 ? c->n_load_ignore_keys : 0;
    if ((s = dup_strs(c->load_exclude_algorithms, c->n_load_exclude_algorithms, &ck->exclude_algs))) return s;
    ck->n_exclude_algs = c->n_load_exclude_algorithms > 0 ? c->n_load_exclude_algorithms : 0;
    return CM_OK;
}

void cmi_ckpt_free(cm_trainer *tr) {
    cmi_ckpt *ck = tr->ckpt;
    if (!ck) return;
    if (ck->running && cmi_ckpt_wait(tr) != CM_OK)
        cm_log_msg(CM_LOG_WARN, "trainer: %s", cm_last_error());
    if (ck->remote && cmi_remote_drain(ck->remote) != CM_OK) cm_log_msg(CM_LOG_WARN, "trainer: %s", cm_last_error());
    cmi_remote_free(ck->remote);
    cmi_remote_free(ck->load_remote);
    cm_free(ck->save_folder);
    cm_free(ck->save_filename);
    cm_free(ck->save_latest_filename);
    cm_free(ck->load_path);
    free_strs(ck->ignore_keys, ck->n_ignore_keys);
    free_strs(ck->exclude_algs, ck->n_exclude_algs);
    free_strs(ck->kept, ck->n_kept);
    cm_free(ck->last_path);
    cm_free(ck->resumed_from);
    cm_free(ck->pending);
    cm_free(ck);
    tr->ckpt = NULL;
}

bool cmi_ckpt_handles_signals(const cm_trainer *tr) { return tr->ckpt && tr->ckpt->handle_signals; }

/* ---------------------------------------------------------------------------------------------
 * The manifest of a trainer
 * ------------------------------------------------------------------------------------------- */

static cJSON *time_json(cm_time t) {
    char b[CM_TIME_STR_MAX];
    cm_time_to_string(t, b, sizeof b);
    return cJSON_CreateString(b);
}

static cJSON *num_or_null(double v) { return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull(); }

static bool add(cJSON *o, const char *k, cJSON *v) {
    if (!v) return false;
    if (!cJSON_AddItemToObject(o, k, v)) {
        cJSON_Delete(v);
        return false;
    }
    return true;
}

static cJSON *optim_json(const cm_optim *o) {
    cJSON *j = cJSON_CreateObject(), *groups = cJSON_CreateArray();
    bool ok = j && groups && add(j, "kind", cJSON_CreateString(cm_optim_kind_name(cm_optim_get_kind(o))));
    for (int g = 0; ok && g < cm_optim_n_groups(o); g++) {
        cm_optim_hparams hp;
        cm_optim_group_get(o, g, &hp);
        cJSON *h = cJSON_CreateObject();
        ok = h && cJSON_AddItemToArray(groups, h);
        ok = ok && add(h, "lr", num_or_null(hp.lr)) && add(h, "weight_decay", num_or_null(hp.weight_decay)) &&
             add(h, "momentum", num_or_null(hp.momentum)) && add(h, "dampening", num_or_null(hp.dampening)) &&
             add(h, "nesterov", cJSON_CreateBool(hp.nesterov)) && add(h, "beta1", num_or_null(hp.beta1)) &&
             add(h, "beta2", num_or_null(hp.beta2)) && add(h, "eps", num_or_null(hp.eps)) &&
             add(h, "amsgrad", cJSON_CreateBool(hp.amsgrad));
    }
    ok = ok && add(j, "groups", groups);
    if (!ok) {
        if (j && !cJSON_GetObjectItemCaseSensitive(j, "groups")) cJSON_Delete(groups);
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

static cJSON *sched_json(const cm_sched_config *c) {
    cJSON *j = cJSON_CreateObject(), *ms = cJSON_CreateArray();
    bool ok = j && ms;
    for (int i = 0; ok && i < c->n_milestones; i++) ok = cJSON_AddItemToArray(ms, time_json(c->milestones[i]));
    ok = ok && add(j, "kind", cJSON_CreateString(cm_sched_kind_name(c->kind))) && add(j, "t_max", time_json(c->t_max)) &&
         add(j, "t_warmup", time_json(c->t_warmup)) && add(j, "step_size", time_json(c->step_size)) &&
         add(j, "decay_period", time_json(c->decay_period)) && add(j, "t_0", time_json(c->t_0)) &&
         add(j, "milestones", ms);
    if (!ok) cJSON_Delete(ms), ms = NULL;
    ok = ok && add(j, "gamma", num_or_null(c->gamma)) && add(j, "alpha", num_or_null(c->alpha)) &&
         add(j, "alpha_i", num_or_null(c->alpha_i)) && add(j, "alpha_f", num_or_null(c->alpha_f)) &&
         add(j, "power", num_or_null(c->power)) && add(j, "t_mult", num_or_null(c->t_mult)) &&
         add(j, "scale_warmup", cJSON_CreateBool(c->scale_warmup));
    if (!ok) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

static cJSON *loader_json(cm_dataloader *dl) {
    cm_dataloader_state s = cm_dataloader_get_state(dl);
    const cm_dataloader_config *c = cm_dataloader_get_config(dl);
    cJSON *j = cJSON_CreateObject();
    if (!j || !add(j, "epoch", cJSON_CreateNumber((double)s.epoch)) ||
        !add(j, "position", cJSON_CreateNumber((double)s.position)) ||
        !add(j, "batch_size", cJSON_CreateNumber((double)c->batch_size)) || !add(j, "seed", cmi_json_u64(c->seed)) ||
        !add(j, "shuffle", cJSON_CreateBool(c->shuffle))) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

/* The resolved run configuration (what decides the math), for the manifest and its digest. */
static cJSON *config_json(cm_trainer *tr) {
    const cm_state *st = &tr->st;
    cJSON *j = cJSON_CreateObject(), *sch = cJSON_CreateArray();
    bool ok = j && sch;
    for (int i = 0; ok && i < st->n_schedulers; i++) ok = cJSON_AddItemToArray(sch, sched_json(&st->schedulers[i]));
    char mb[32];
    if (tr->mb_config == CM_MICROBATCH_AUTO) snprintf(mb, sizeof mb, "auto");
    else snprintf(mb, sizeof mb, "%lld", (long long)tr->mb_config);
    ok = ok && add(j, "precision", cJSON_CreateString(cm_precision_name(st->precision))) &&
         add(j, "device_train_microbatch_size", cJSON_CreateString(mb)) &&
         add(j, "accumulate_train_batch_on_tokens", cJSON_CreateBool(tr->tokens_weighting)) &&
         add(j, "seed", cmi_json_u64(st->seed)) && add(j, "scale_schedule_ratio", num_or_null(st->ssr)) &&
         add(j, "deterministic_mode", cJSON_CreateBool(tr->deterministic)) &&
         add(j, "optimizer", optim_json(st->optimizer)) && add(j, "schedulers", sch);
    if (!ok && sch && !cJSON_GetObjectItemCaseSensitive(j, "schedulers")) cJSON_Delete(sch);
    if (ok && st->train_dl) {
        cJSON *d = loader_json(st->train_dl);
        cJSON_DeleteItemFromObject(d, "epoch");
        cJSON_DeleteItemFromObject(d, "position");
        ok = add(j, "train_dataloader", d);
    }
    if (!ok) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

typedef struct visit_ctx {
    cJSON *arr;
    bool ok;
} visit_ctx;

static bool visit_dropout(cm_module *m, const char *path, int depth, void *data) {
    visit_ctx *v = data;
    cm_rng *r = cm_nn_dropout_rng(m);
    if (!r) return true;
    cJSON *o = cJSON_CreateObject();
    v->ok = v->ok && o && cJSON_AddItemToArray(v->arr, o) && add(o, "module", cJSON_CreateString(path)) &&
            add(o, "seed", cmi_json_u64(r->seed)) && add(o, "stream", cmi_json_u64(r->stream)) &&
            add(o, "counter", cmi_json_u64(r->counter));
    return v->ok;
}

static cm_status plugin_state(const char *kind, const char *name, size_t (*save)(void *, char *, size_t), void *self,
                              cJSON **out) {
    *out = NULL;
    if (!save) {
        *out = cJSON_CreateObject();
        return *out ? CM_OK : CM_ERR_OOM;
    }
    char small[512];
    size_t n = save(self, small, sizeof small);
    char *buf = small;
    if (n >= sizeof small) {
        if (!(buf = cm_alloc(n + 1, 1))) return CM_ERR_OOM;
        save(self, buf, n + 1);
    }
    cJSON *j = cJSON_ParseWithLength(buf, n);
    if (buf != small) cm_free(buf);
    if (!j)
        return cm_set_error(CM_ERR_FORMAT, "%s '%s': its save() returned invalid JSON (%zu bytes): checkpoint state "
                                           "must be a JSON object",
                            kind, name, n);
    *out = j;
    return CM_OK;
}

static cm_status build_manifest(cm_trainer *tr, bool weights_only, cJSON **out) {
    *out = NULL;
    cm_state *st = &tr->st;
    cJSON *m = cJSON_CreateObject();
    if (!m) return CM_ERR_OOM;
    char created[64];
    time_t now = time(NULL);
    struct tm tmv;
    gmtime_r(&now, &tmv);
    strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", &tmv);
    cJSON *lib = cJSON_CreateObject();
    bool ok = add(m, "format_version", cJSON_CreateNumber(CM_CKPT_FORMAT_VERSION)) && add(m, "library", lib) &&
              add(lib, "name", cJSON_CreateString("composer")) && add(lib, "version", cJSON_CreateString(cm_version())) &&
              add(lib, "git_commit", cJSON_CreateString(CM_GIT_COMMIT)) && add(m, "created", cJSON_CreateString(created)) &&
              add(m, "run_name", cJSON_CreateString(st->run_name)) &&
              add(m, "world_size", cJSON_CreateNumber(st->world_size)) &&
              add(m, "layout", cJSON_CreateString(tr->dist.n_shard_spans > 0 ? "sharded" : "monolithic")) &&
              add(m, "weights_only", cJSON_CreateBool(weights_only)) && add(m, "config", config_json(tr)) &&
              add(m, "timestamp", cmi_timestamp_to_json(&st->ts)) && add(m, "max_duration", time_json(st->max_duration));
    if (!ok && lib && !cJSON_GetObjectItemCaseSensitive(m, "library")) cJSON_Delete(lib);

    cJSON *dls = ok ? cJSON_CreateObject() : NULL;
    ok = ok && add(m, "dataloaders", dls);
    if (ok && st->train_dl) ok = add(dls, "train", loader_json(st->train_dl));
    for (int i = 0; ok && i < tr->n_evals; i++)
        if (!cJSON_GetObjectItemCaseSensitive(dls, tr->evals[i].label))
            ok = add(dls, tr->evals[i].label, loader_json(tr->evals[i].dl));

    cJSON *rng = ok ? cJSON_CreateObject() : NULL, *drop = ok ? cJSON_CreateArray() : NULL;
    ok = ok && add(m, "rng", rng) && add(rng, "seed", cmi_json_u64(st->seed));
    if (ok && !add(rng, "dropout", drop)) ok = false, drop = NULL;
    if (ok) {
        visit_ctx v = {drop, true};
        cm_module_visit(cm_model_module(st->model), visit_dropout, &v);
        ok = v.ok;
    } else if (drop && !cJSON_GetObjectItemCaseSensitive(rng, "dropout")) {
        cJSON_Delete(drop);
    }
    cJSON *trn = ok ? cJSON_CreateObject() : NULL;
    ok = ok && add(m, "trainer", trn) && add(trn, "microbatch_size", cJSON_CreateNumber((double)st->microbatch_size)) &&
         add(trn, "total_loss", num_or_null(st->total_loss)) && add(trn, "lr_multiplier", num_or_null(st->lr_multiplier)) &&
         add(trn, "last_eval_batch", cJSON_CreateNumber((double)tr->last_eval_batch)) &&
         add(m, "loss_scaler", cJSON_CreateNull());
    if (ok && !weights_only) ok = add(m, "optimizer", optim_json(st->optimizer));
    if (ok) {
        cJSON *sch = cJSON_CreateArray();
        ok = add(m, "schedulers", sch);
        for (int i = 0; ok && i < st->n_schedulers; i++) ok = cJSON_AddItemToArray(sch, sched_json(&st->schedulers[i]));
    }
    if (!ok) {
        cJSON_Delete(m);
        return cm_set_error(CM_ERR_OOM, "checkpoint manifest: out of memory");
    }
    /* plugins */
    cJSON *algs = cJSON_CreateArray(), *cbs = cJSON_CreateArray(), *lgs = cJSON_CreateArray();
    if (!add(m, "algorithms", algs) || !add(m, "callbacks", cbs) || !add(m, "loggers", lgs)) {
        if (!cJSON_GetObjectItemCaseSensitive(m, "callbacks")) cJSON_Delete(cbs);
        if (!cJSON_GetObjectItemCaseSensitive(m, "loggers")) cJSON_Delete(lgs);
        cJSON_Delete(m);
        return cm_set_error(CM_ERR_OOM, "checkpoint manifest: out of memory");
    }
    cm_status s = CM_OK;
    for (int i = 0; !s && i < cm_engine_n_algorithms(tr->engine); i++) {
        cm_algorithm *a = cm_engine_algorithm(tr->engine, i);
        cJSON *state, *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(algs, o)) {
            cJSON_Delete(o);
            s = CM_ERR_OOM;
            break;
        }
        if ((s = plugin_state("algorithm", cm_algorithm_name(a), cm_algorithm_vtable(a)->save, cm_algorithm_self(a),
                              &state)))
            break;
        if (!add(o, "name", cJSON_CreateString(cm_algorithm_name(a))) || !add(o, "state", state)) {
            s = CM_ERR_OOM;
            break;
        }
        /* the methods of composer/surgery_algorithms.h: their arguments (Composer's repr) and
         * whether loading must re-apply them */
        const cm_algorithm_info *info = cm_algorithm_info_of(cm_algorithm_vtable(a));
        if (info) {
            char hp[1024];
            size_t n = cm_algorithm_hparams_json((cm_algorithm_plugin){cm_algorithm_vtable(a), cm_algorithm_self(a)},
                                                 hp, sizeof hp);
            cJSON *hj = n && n < sizeof hp ? cJSON_Parse(hp) : NULL;
            if (!hj) {
                s = cm_set_error(CM_ERR_INTERNAL, "algorithm '%s': its arguments are not JSON (%zu bytes)",
                                 cm_algorithm_name(a), n);
                break;
            }
            if (!add(o, "hparams", hj) || !add(o, "required_on_load", cJSON_CreateBool(info->required_on_load))) {
                s = CM_ERR_OOM;
                break;
            }
        }
    }
    for (int i = 0; !s && i < cm_engine_n_callbacks(tr->engine); i++) {
        cm_callback_plugin p = cm_engine_callback(tr->engine, i);
        cJSON *state, *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(cbs, o)) {
            cJSON_Delete(o);
            s = CM_ERR_OOM;
            break;
        }
        if ((s = plugin_state("callback", p.vt->name, p.vt->save, p.self, &state))) break;
        if (!add(o, "name", cJSON_CreateString(p.vt->name)) || !add(o, "state", state)) s = CM_ERR_OOM;
    }
    for (int i = 0; !s && i < cm_engine_n_loggers(tr->engine); i++) {
        cm_logger_plugin p = cm_engine_logger_plugin(tr->engine, i);
        cJSON *state, *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(lgs, o)) {
            cJSON_Delete(o);
            s = CM_ERR_OOM;
            break;
        }
        if ((s = plugin_state("logger", p.vt->name, p.vt->save, p.self, &state))) break;
        if (!add(o, "name", cJSON_CreateString(p.vt->name)) || !add(o, "state", state)) s = CM_ERR_OOM;
    }
    if (s) {
        cJSON_Delete(m);
        return s == CM_ERR_OOM ? cm_set_error(s, "checkpoint manifest: out of memory") : s;
    }
    *out = m;
    return CM_OK;
}

static atomic_int g_tmp_counter; /* names of temporary directories */

/* ---------------------------------------------------------------------------------------------
 * The snapshot: which tensors, borrowed or copied
 * ------------------------------------------------------------------------------------------- */

void cmi_ck_job_free(cmi_ck_job *job) {
    if (!job) return;
    cm_free(job->folder);
    cm_free(job->name);
    cJSON_Delete(job->manifest);
    for (int i = 0; i < CMI_CK_MAX_FILES; i++) cm_free(job->tensors[i]);
    cm_free(job->staging);
    cm_free(job->names);
    cm_free(job);
}

static void set_tensor(cmi_ck_tensor *t, const char *name, const cm_tensor *x) {
    t->name = name;
    t->dtype = cm_st_dtype_from_cm(cm_tensor_dtype(x));
    t->ndim = cm_tensor_ndim(x);
    memcpy(t->shape, cm_tensor_shape(x), sizeof(int64_t) * (size_t)t->ndim);
    t->data = cm_tensor_data(x);
    t->nbytes = cm_tensor_nbytes(x);
    t->device = cm_tensor_device(x);
}

int cmi_algo_tensor_name(cm_engine *e, int i, const char *tensor, char *buf, size_t cap) {
    const char *name = cm_algorithm_name(cm_engine_algorithm(e, i));
    int k = 0;
    for (int j = 0; j < i; j++) k += !strcmp(cm_algorithm_name(cm_engine_algorithm(e, j)), name);
    return k ? snprintf(buf, cap, "%s#%d/%s", name, k, tensor) : snprintf(buf, cap, "%s/%s", name, tensor);
}

/* Algorithm i's checkpoint tensors (cm_algorithm_i.tensors) into a new array; *n = 0 and NULL
 * when it has none. */
static cm_status algo_tensors(cm_engine *e, int i, cm_plugin_tensor **out, int *n) {
    *out = NULL, *n = 0;
    cm_algorithm *a = cm_engine_algorithm(e, i);
    const cm_algorithm_i *vt = cm_algorithm_vtable(a);
    if (!vt->tensors) return CM_OK;
    const int cnt = vt->tensors(cm_algorithm_self(a), NULL, 0);
    if (cnt < 0) return cm_set_error(CM_ERR_STATE, "algorithm '%s' listed %d checkpoint tensors", vt->name, cnt);
    if (cnt == 0) return CM_OK;
    cm_plugin_tensor *t = cm_alloc_zeroed(sizeof *t * (size_t)cnt, 16);
    if (!t) return cm_set_error(CM_ERR_OOM, "checkpoint: out of memory");
    const int again = vt->tensors(cm_algorithm_self(a), t, cnt);
    for (int k = 0; k < cnt && again == cnt; k++) {
        if (!t[k].name || (!t[k].data && t[k].ndim >= 0) || t[k].ndim < 0 || t[k].ndim > CM_MAX_DIMS) {
            cm_free(t);
            return cm_set_error(CM_ERR_STATE, "algorithm '%s': checkpoint tensor %d has no name, no data or a bad rank",
                                vt->name, k);
        }
    }
    if (again != cnt) {
        cm_free(t);
        return cm_set_error(CM_ERR_STATE, "algorithm '%s' listed %d checkpoint tensors, then %d", vt->name, cnt, again);
    }
    *out = t, *n = cnt;
    return CM_OK;
}

static int64_t plugin_numel(const cm_plugin_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

/* The algorithms' tensors of the job (file algorithms.safetensors), with their names in
 * job->names. Sharded saves refuse them: their files are per rank. */
static cm_status job_algorithm_tensors(cm_trainer *tr, cmi_ck_job *job, bool sharded) {
    cm_engine *e = tr->engine;
    int total = 0;
    size_t name_bytes = 0;
    cm_status s = CM_OK;
    for (int i = 0; !s && i < cm_engine_n_algorithms(e); i++) {
        cm_plugin_tensor *t;
        int n;
        if ((s = algo_tensors(e, i, &t, &n))) break;
        for (int k = 0; k < n; k++) name_bytes += (size_t)cmi_algo_tensor_name(e, i, t[k].name, NULL, 0) + 1;
        total += n;
        cm_free(t);
        if (n && sharded)
            s = cm_set_error(CM_ERR_UNSUPPORTED, "checkpoint: algorithm '%s' keeps tensors in checkpoints, which sharded "
                                                 "checkpoints do not hold yet (use sharding_strategy NO_SHARD)",
                             cm_algorithm_name(cm_engine_algorithm(e, i)));
    }
    if (s || total == 0) return s;
    const int f = job->n_files;
    snprintf(job->fnames[f], sizeof job->fnames[f], "%s", CM_CKPT_ALGO_FILE);
    job->tensors[f] = cm_alloc_zeroed(sizeof(cmi_ck_tensor) * (size_t)total, 16);
    job->names = cm_alloc(name_bytes, 1);
    if (!job->tensors[f] || !job->names) return cm_set_error(CM_ERR_OOM, "checkpoint: out of memory");
    char *np = job->names;
    for (int i = 0; !s && i < cm_engine_n_algorithms(e); i++) {
        cm_plugin_tensor *t;
        int n;
        if ((s = algo_tensors(e, i, &t, &n))) break;
        for (int k = 0; k < n; k++) {
            cmi_ck_tensor *ct = &job->tensors[f][job->n_tensors[f]++];
            const int len = cmi_algo_tensor_name(e, i, t[k].name, np, name_bytes - (size_t)(np - job->names));
            ct->name = np;
            np += len + 1;
            ct->dtype = cm_st_dtype_from_cm(t[k].dtype);
            ct->ndim = t[k].ndim;
            memcpy(ct->shape, t[k].shape, sizeof(int64_t) * (size_t)t[k].ndim);
            ct->data = t[k].data;
            ct->nbytes = (size_t)plugin_numel(&t[k]) * cm_dtype_size(t[k].dtype);
            ct->device = cmi_ptr_device(t[k].data); /* EMA's and SWA's copies live on the model's device */
        }
        cm_free(t);
    }
    job->n_files = f + 1;
    return s;
}

static cm_status build_job(cm_trainer *tr, const char *folder, const char *name, bool update_pointer, bool async,
                           cmi_ck_job **out) {
    *out = NULL;
    cmi_ckpt *ck = tr->ckpt;
    const bool weights_only = ck->save_weights_only;
    cmi_ck_job *job = cm_alloc_zeroed(sizeof *job, 16);
    if (!job) return cm_set_error(CM_ERR_OOM, "checkpoint: out of memory");
    job->folder = dup_str(folder);
    job->name = dup_str(name);
    job->update_pointer = update_pointer;
    /* a remote save_folder decides "already exists" remotely; the staging folder is a cache */
    job->upload = update_pointer && ck->remote && !strcmp(folder, ck->save_folder);
    job->overwrite = ck->save_overwrite || job->upload;
    cm_status s = (!job->folder || !job->name) ? cm_set_error(CM_ERR_OOM, "checkpoint: out of memory") : CM_OK;
    const bool sharded = tr->dist.n_shard_spans > 0; /* also on one rank: FULL_SHARD's buffers are not valid at rest */
    if (!s && (!sharded || tr->dist.rank == 0)) s = build_manifest(tr, weights_only, &job->manifest);
    cm_module *root = cm_model_module(tr->st.model);
    if (!s && sharded) s = cmi_shard_job_tensors(tr, job, weights_only);
    if (!s && !sharded) {
        int64_t np = cm_module_n_params(root), nb = cm_module_n_buffers(root);
        snprintf(job->fnames[0], sizeof job->fnames[0], "%s", CM_CKPT_MODEL_FILE);
        job->tensors[0] = cm_alloc_zeroed(sizeof(cmi_ck_tensor) * (size_t)(np + nb + 1), 16);
        if (!job->tensors[0]) s = cm_set_error(CM_ERR_OOM, "checkpoint: out of memory");
        for (int64_t i = 0; !s && i < np; i++) {
            cm_param_info pi = cm_module_param_info(root, i);
            set_tensor(&job->tensors[0][job->n_tensors[0]++], pi.name, pi.tensor);
        }
        for (int64_t i = 0; !s && i < nb; i++) {
            cm_buffer_info bi = cm_module_buffer_info(root, i);
            if (!cm_tensor_is_contiguous(bi.tensor)) {
                s = cm_set_error(CM_ERR_STATE, "checkpoint: buffer '%s' is not contiguous", bi.name);
                break;
            }
            set_tensor(&job->tensors[0][job->n_tensors[0]++], bi.name, bi.tensor);
        }
        job->n_files = 1;
    }
    if (!s && !sharded && !weights_only) {
        const cm_optim *o = tr->st.optimizer;
        int n = cm_optim_n_state(o);
        snprintf(job->fnames[1], sizeof job->fnames[1], "%s", CM_CKPT_OPTIM_FILE);
        job->tensors[1] = cm_alloc_zeroed(sizeof(cmi_ck_tensor) * (size_t)(n + 1), 16);
        if (!job->tensors[1]) s = cm_set_error(CM_ERR_OOM, "checkpoint: out of memory");
        for (int i = 0; !s && i < n; i++) {
            cm_optim_state_entry e;
            cm_optim_state_get(o, i, &e);
            cmi_ck_tensor *t = &job->tensors[1][job->n_tensors[1]++];
            t->name = e.name;
            t->dtype = cm_st_dtype_from_cm(e.dtype);
            t->ndim = 1;
            t->shape[0] = e.numel;
            t->data = e.data;
            t->nbytes = (size_t)e.numel * cm_dtype_size(e.dtype);
            t->device = e.device;
        }
        job->n_files = 2;
    }
    if (!s && !weights_only) s = job_algorithm_tensors(tr, job, sharded);
    /* tensors on a GPU are written from a host snapshot, as a background save's */
    bool on_device = false;
    for (int f = 0; !s && f < job->n_files; f++)
        for (int i = 0; i < job->n_tensors[f]; i++) on_device = on_device || job->tensors[f][i].device != CM_DEVICE_CPU;
    if (!s && (async || on_device)) {
        size_t total = 0;
        for (int f = 0; f < job->n_files; f++)
            for (int i = 0; i < job->n_tensors[f]; i++) total += (job->tensors[f][i].nbytes + 63) & ~(size_t)63;
        job->staging_bytes = total;
        job->staging = cm_alloc(total ? total : 64, 64);
        if (!job->staging) {
            s = cm_set_error(CM_ERR_OOM, "checkpoint: cannot allocate the %zu-byte snapshot for the background save",
                             total);
        } else {
            char *p = job->staging;
            for (int f = 0; f < job->n_files; f++)
                for (int i = 0; i < job->n_tensors[f]; i++) {
                    cmi_ck_tensor *t = &job->tensors[f][i];
                    if (t->nbytes && !s) s = cmi_dev_memcpy(p, CM_DEVICE_CPU, t->data, t->device, t->nbytes);
                    t->data = p;
                    t->device = CM_DEVICE_CPU;
                    p += (t->nbytes + 63) & ~(size_t)63;
                }
        }
    }
    if (s) {
        cmi_ck_job_free(job);
        return s;
    }
    *out = job;
    return CM_OK;
}

static size_t snapshot_bytes(cm_trainer *tr) {
    cm_module *root = cm_model_module(tr->st.model);
    size_t total = 0;
    for (int64_t i = 0; i < cm_module_n_params(root); i++) total += cm_tensor_nbytes(cm_module_param_info(root, i).tensor);
    for (int64_t i = 0; i < cm_module_n_buffers(root); i++) total += cm_tensor_nbytes(cm_module_buffer_info(root, i).tensor);
    if (!tr->ckpt->save_weights_only) {
        for (int i = 0; i < cm_optim_n_state(tr->st.optimizer); i++) {
            cm_optim_state_entry e;
            cm_optim_state_get(tr->st.optimizer, i, &e);
            total += (size_t)e.numel * cm_dtype_size(e.dtype);
        }
        for (int i = 0; i < cm_engine_n_algorithms(tr->engine); i++) {
            cm_plugin_tensor *t;
            int n;
            if (algo_tensors(tr->engine, i, &t, &n)) continue;
            for (int k = 0; k < n; k++) total += (size_t)plugin_numel(&t[k]) * cm_dtype_size(t[k].dtype);
            cm_free(t);
        }
    }
    return total;
}

/* ---------------------------------------------------------------------------------------------
 * The commit
 * ------------------------------------------------------------------------------------------- */

/* Whether process pid is gone: no such process, or a zombie (killed, not yet reaped: a killed
 * job's ranks can stay so for a moment after the launcher returned, and a zombie never writes). */
static bool process_gone(long pid) {
    if (kill((pid_t)pid, 0) != 0) return errno == ESRCH;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *rp = strrchr(buf, ')'); /* "pid (comm) S ..." where comm may hold spaces */
    return rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
}

/* Removes ".tmp-<pid>-..." / ".old-<pid>-..." directories whose process is gone (killed saves). */
static void sweep_stale(const char *folder) {
    DIR *d = opendir(folder);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, ".tmp-", 5) && strncmp(e->d_name, ".old-", 5)) continue;
        long pid = strtol(e->d_name + 5, NULL, 10);
        if (pid <= 0 || pid == (long)getpid() || !process_gone(pid)) continue;
        char *p = cmi_path_join(folder, e->d_name);
        if (p && cmi_remove_tree(p)) cm_log_msg(CM_LOG_INFO, "checkpoint: removed '%s', left by a save that was killed", p);
        cm_free(p);
    }
    closedir(d);
}

static cm_status write_file(const char *dir, const char *fname, const cmi_ck_tensor *ts, int n, cJSON *files) {
    cm_safetensors_writer *w;
    cm_status s = cm_safetensors_writer_new(&w);
    if (s) return s;
    cJSON *fo = cJSON_CreateObject(), *tl = cJSON_CreateObject();
    if (!fo || !tl || !cJSON_AddItemToObject(files, fname, fo)) {
        cJSON_Delete(fo);
        cJSON_Delete(tl);
        cm_safetensors_writer_free(w);
        return cm_set_error(CM_ERR_OOM, "checkpoint: out of memory");
    }
    if (!add(fo, "tensors", tl)) s = CM_ERR_OOM;
    if (!s && !strcmp(fname, CM_CKPT_MODEL_FILE)) s = cm_safetensors_writer_add_metadata(w, "format", "pt");
    for (int i = 0; !s && i < n; i++) {
        const cmi_ck_tensor *t = &ts[i];
        if ((s = cm_safetensors_writer_add_raw(w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes))) break;
        char hex[17];
        snprintf(hex, sizeof hex, "%016" PRIx64, cm_hash64(t->data, t->nbytes, 0));
        cJSON *to = cJSON_CreateObject(), *sh = cJSON_CreateArray();
        bool ok = to && sh && cJSON_AddItemToObject(tl, t->name, to);
        for (int d = 0; ok && d < t->ndim; d++) ok = cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
        ok = ok && add(to, "dtype", cJSON_CreateString(cm_st_dtype_name(t->dtype)));
        if (ok) ok = add(to, "shape", sh), sh = NULL;
        ok = ok && add(to, "nbytes", cJSON_CreateNumber((double)t->nbytes)) && add(to, "xxh3", cJSON_CreateString(hex));
        cJSON_Delete(sh);
        if (ok && t->piece) {
            cJSON *gs = cJSON_CreateArray(), *rg = cJSON_CreateArray();
            ok = gs && rg;
            for (int d = 0; ok && d < t->gndim; d++) ok = cJSON_AddItemToArray(gs, cJSON_CreateNumber((double)t->gshape[d]));
            ok = ok && cJSON_AddItemToArray(rg, cJSON_CreateNumber((double)t->begin)) &&
                 cJSON_AddItemToArray(rg, cJSON_CreateNumber((double)t->end));
            if (ok) ok = add(to, "global_shape", gs), gs = NULL;
            if (ok) ok = add(to, "range", rg), rg = NULL;
            cJSON_Delete(gs);
            cJSON_Delete(rg);
        }
        if (!ok) s = cm_set_error(CM_ERR_OOM, "checkpoint: out of memory");
    }
    if (!s) s = add(fo, "size", cJSON_CreateNumber((double)cm_safetensors_writer_size(w))) ? CM_OK : CM_ERR_OOM;
    if (!s) {
        char *path = cmi_path_join(dir, fname);
        s = path ? cm_safetensors_writer_write(w, path) : CM_ERR_OOM;
        cm_free(path);
    }
    cm_safetensors_writer_free(w);
    return s;
}

static cm_status rotate(cmi_ckpt *ck, const char *folder, const char *name) {
    for (int i = 0; i < ck->n_kept; i++)
        if (!strcmp(ck->kept[i], name)) { /* re-saved (overwrite): move to the end */
            char *k = ck->kept[i];
            memmove(ck->kept + i, ck->kept + i + 1, sizeof *ck->kept * (size_t)(ck->n_kept - i - 1));
            ck->kept[ck->n_kept - 1] = k;
            goto trim;
        }
    if (ck->n_kept == ck->cap_kept) {
        int nc = ck->cap_kept ? 2 * ck->cap_kept : 8;
        char **nk = cm_alloc(sizeof *nk * (size_t)nc, 16);
        if (!nk) return cm_set_error(CM_ERR_OOM, "checkpoint rotation: out of memory");
        if (ck->kept) memcpy(nk, ck->kept, sizeof *nk * (size_t)ck->n_kept);
        cm_free(ck->kept);
        ck->kept = nk, ck->cap_kept = nc;
    }
    if (!(ck->kept[ck->n_kept] = dup_str(name))) return cm_set_error(CM_ERR_OOM, "checkpoint rotation: out of memory");
    ck->n_kept++;
trim:
    while (ck->keep > 0 && ck->n_kept > ck->keep) {
        /* hide it first (one atomic rename), so a crash while deleting never leaves a visible,
         * half-deleted checkpoint; a killed deletion's leftovers are swept at the next save */
        char hidden[320];
        snprintf(hidden, sizeof hidden, ".old-%ld-%d-%s", (long)getpid(), atomic_fetch_add(&g_tmp_counter, 1),
                 ck->kept[0]);
        char *p = cmi_path_join(folder, ck->kept[0]), *h = cmi_path_join(folder, hidden);
        if (!p || !h) {
            cm_free(p);
            cm_free(h);
            return CM_ERR_OOM;
        }
        if (rename(p, h) != 0 || !cmi_remove_tree(h))
            cm_log_msg(CM_LOG_WARN, "checkpoint rotation: could not remove '%s': %s", p, strerror(errno));
        else
            cm_log_msg(CM_LOG_INFO, "checkpoint rotation: removed '%s' (save_num_checkpoints_to_keep %d)", p, ck->keep);
        cm_free(p);
        cm_free(h);
        cm_free(ck->kept[0]);
        memmove(ck->kept, ck->kept + 1, sizeof *ck->kept * (size_t)(ck->n_kept - 1));
        ck->n_kept--;
    }
    return CM_OK;
}

/* Where a save goes: the final directory, the temporary one it is written in, and the hidden
 * name an old checkpoint of the same name moves to while being replaced. */
typedef struct ck_paths {
    char *final, *tmp, *old;
    bool exists, made_tmp;
} ck_paths;

static void paths_free(ck_paths *p) {
    if (p->made_tmp) cmi_remove_tree(p->tmp);
    cm_free(p->final);
    cm_free(p->tmp);
    cm_free(p->old);
    memset(p, 0, sizeof *p);
}

/* Makes save_folder, sweeps leftovers of killed saves, refuses an existing checkpoint without
 * overwrite, and creates the temporary directory. */
static cm_status job_prepare(cmi_ck_job *job, ck_paths *p) {
    memset(p, 0, sizeof *p);
    cm_status s = cmi_mkdirs(job->folder);
    if (s) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "checkpoint: save_folder '%s' is not usable: %s", job->folder, msg);
    }
    p->final = cmi_path_join(job->folder, job->name);
    char tmpname[320], oldname[320];
    int ctr = atomic_fetch_add(&g_tmp_counter, 1);
    snprintf(tmpname, sizeof tmpname, ".tmp-%ld-%d-%s", (long)getpid(), ctr, job->name);
    snprintf(oldname, sizeof oldname, ".old-%ld-%d-%s", (long)getpid(), ctr, job->name);
    p->tmp = cmi_path_join(job->folder, tmpname), p->old = cmi_path_join(job->folder, oldname);
    if (!p->final || !p->tmp || !p->old) return cm_set_error(CM_ERR_OOM, "checkpoint: out of memory");
    sweep_stale(job->folder);
    p->exists = access(p->final, F_OK) == 0;
    if (p->exists && !job->overwrite) {
        /* a checkpoint known to be damaged (autoresume skipped it) must not block the run: set it
         * aside under a hidden name (never deleted: the message says where) and save anew */
        cm_checkpoint *old = NULL;
        cm_status os = cm_checkpoint_open(p->final, &old);
        if (!os) os = cm_checkpoint_verify(old);
        cm_checkpoint_close(old);
        if (os) {
            char why[1024], aside[320];
            snprintf(why, sizeof why, "%s", cm_last_error());
            snprintf(aside, sizeof aside, ".corrupt-%lld-%d-%s", (long long)time(NULL), ctr, job->name);
            char *ap = cmi_path_join(job->folder, aside);
            if (!ap) return cm_set_error(CM_ERR_OOM, "checkpoint: out of memory");
            if (rename(p->final, ap) != 0) {
                cm_status rs = cm_set_error(CM_ERR_IO, "checkpoint '%s' is damaged (%s) and cannot be moved aside to "
                                                       "'%s': %s", p->final, why, ap, strerror(errno));
                cm_free(ap);
                return rs;
            }
            cm_log_msg(CM_LOG_WARN, "checkpoint '%s' is damaged (%s): moved aside to '%s'; saving it anew", p->final,
                       why, ap);
            cm_free(ap);
            p->exists = false;
        }
    }
    if (p->exists && !job->overwrite)
        return cm_set_error(CM_ERR_STATE, "checkpoint '%s' already exists: set save_overwrite to replace it, or change "
                                          "save_filename / save_folder",
                            p->final);
    if (mkdir(p->tmp, 0755) != 0)
        return cm_set_error(CM_ERR_IO, "checkpoint: cannot create '%s': %s", p->tmp, strerror(errno));
    p->made_tmp = true;
    return CM_OK;
}

/* The manifest (with its "files") goes in last; the directory is read back (every tensor hashed
 * when full_verify, else the structure: sizes, headers, tiling), renamed into place, pointed to
 * and rotated. */
static cm_status job_commit(cmi_ckpt *ck, cmi_ck_job *job, ck_paths *p, bool full_verify) {
    char *text = NULL, *mp = NULL;
    size_t len = 0;
    cm_status s = cmi_manifest_serialize(job->manifest, &text, &len);
    if (!s && !(mp = cmi_path_join(p->tmp, CM_CKPT_MANIFEST))) s = CM_ERR_OOM;
    if (!s) s = cmi_write_file_sync(mp, text, len);
    cm_free(text);
    cm_free(mp);
    if (!s) s = cmi_fsync_dir(p->tmp);
    if (s) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "checkpoint '%s' was not saved (previous checkpoints are intact): %s", p->final, msg);
    }
    /* read back what the disk holds before committing to it */
    cm_checkpoint *rb;
    if (!(s = cm_checkpoint_open(p->tmp, &rb))) {
        if (full_verify) s = cm_checkpoint_verify(rb);
        cm_checkpoint_close(rb);
    }
    if (s) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(CM_ERR_IO, "checkpoint '%s': the written files did not read back correctly (not committed): %s",
                            p->final, msg);
    }
    if (p->exists && rename(p->final, p->old) != 0)
        return cm_set_error(CM_ERR_IO, "checkpoint: cannot move the old '%s' aside: %s", p->final, strerror(errno));
    if (rename(p->tmp, p->final) != 0) {
        s = cm_set_error(CM_ERR_IO, "checkpoint: cannot rename '%s' to '%s': %s", p->tmp, p->final, strerror(errno));
        if (p->exists) rename(p->old, p->final);
        return s;
    }
    p->made_tmp = false;
    if ((s = cmi_fsync_dir(job->folder))) return s;
    if (p->exists) cmi_remove_tree(p->old);
    cm_free(ck->last_path);
    ck->last_path = dup_str(p->final);
    if (job->update_pointer && ck->save_latest_filename && ck->save_latest_filename[0]) {
        char *lp = cmi_path_join(job->folder, ck->save_latest_filename);
        char line[300];
        int k = snprintf(line, sizeof line, "%s\n", job->name);
        s = lp ? cmi_write_file_atomic(lp, line, (size_t)k) : CM_ERR_OOM;
        cm_free(lp);
        if (s) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            return cm_set_error(s, "checkpoint '%s' was committed but the latest pointer was not updated: %s", p->final,
                                msg);
        }
    }
    /* with a remote save_folder the uploader rotates (remotely, then the local copy), after the
     * newer checkpoint is uploaded */
    if (job->update_pointer && !job->upload) s = rotate(ck, job->folder, job->name);
    cm_log_msg(CM_LOG_DEBUG, "checkpoint: saved '%s'", p->final);
    if (!s && job->upload) s = cmi_remote_enqueue(ck->remote, job->name, job->update_pointer);
    return s;
}

cm_status cmi_ck_job_run(cmi_ckpt *ck, cmi_ck_job *job) {
    ck_paths p;
    const bool prof = cmi_prof_on(); /* a background save records on its own thread */
    if (prof) cmi_prof_begin("checkpoint/write", "checkpoint", NULL);
    cm_status s = job_prepare(job, &p);
    cJSON *files = s ? NULL : cJSON_CreateObject();
    if (!s && !add(job->manifest, "files", files)) s = cm_set_error(CM_ERR_OOM, "checkpoint: out of memory");
    for (int f = 0; !s && f < job->n_files; f++) s = write_file(p.tmp, job->fnames[f], job->tensors[f], job->n_tensors[f], files);
    if (prof) cmi_prof_end("checkpoint/write");
    if (s && p.made_tmp) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        s = cm_set_error(s, "checkpoint '%s' was not saved (previous checkpoints are intact): %s", p.final, msg);
    }
    if (!s && prof) cmi_prof_begin("checkpoint/commit", "checkpoint", NULL);
    if (!s) s = job_commit(ck, job, &p, true);
    if (prof) cmi_prof_end("checkpoint/commit");
    paths_free(&p);
    return s;
}

/* ---------------------------------------------------------------------------------------------
 * Saving from the trainer: synchronous or in the background
 * ------------------------------------------------------------------------------------------- */

static void *writer_main(void *arg) {
    cmi_ckpt *ck = arg;
    cm_status s = cmi_ck_job_run(ck, ck->job);
    ck->job_status = s;
    if (s) snprintf(ck->job_msg, sizeof ck->job_msg, "%s", cm_last_error());
    cmi_ck_job_free(ck->job);
    ck->job = NULL;
    atomic_store(&ck->done, true);
    return NULL;
}

cm_status cmi_ckpt_wait(cm_trainer *tr) {
    cmi_ckpt *ck = tr->ckpt;
    if (!ck || !ck->running) return CM_OK;
    pthread_join(ck->thread, NULL);
    ck->running = false;
    if (ck->job_status) {
        cm_status s = ck->job_status;
        ck->job_status = CM_OK;
        return cm_set_error(s, "background checkpoint save failed: %s", ck->job_msg);
    }
    return CM_OK;
}

/* Re-reads the files this rank wrote and compares every tensor with what it meant to write. */
static cm_status verify_written(const char *dir, const cJSON *files) {
    const cJSON *fo;
    cJSON_ArrayForEach(fo, files) {
        char *path = cmi_path_join(dir, fo->string);
        cm_safetensors *st = NULL;
        cm_status s = path ? cm_safetensors_open(path, &st) : CM_ERR_OOM;
        int64_t size = -1;
        cmi_json_get_i64(fo, "size", &size);
        if (!s && (int64_t)cm_safetensors_file_len(st) != size)
            s = cm_set_error(CM_ERR_IO, "'%s' has %zu bytes on disk, %lld were written", path,
                             cm_safetensors_file_len(st), (long long)size);
        const cJSON *te;
        cJSON_ArrayForEach(te, cJSON_GetObjectItemCaseSensitive(fo, "tensors")) {
            if (s) break;
            const cm_st_tensor *ft = cm_safetensors_find(st, te->string);
            const cJSON *hx = cJSON_GetObjectItemCaseSensitive(te, "xxh3");
            char hex[17];
            if (ft) snprintf(hex, sizeof hex, "%016" PRIx64, cm_hash64(ft->data, ft->nbytes, 0));
            if (!ft || !cJSON_IsString(hx) || strcmp(hx->valuestring, hex))
                s = cm_set_error(CM_ERR_IO, "'%s': tensor '%s' did not read back as written", path, te->string);
        }
        cm_safetensors_close(st);
        cm_free(path);
        if (s) return s;
    }
    return CM_OK;
}

/* A save in a multi-rank run; every rank calls it at the same point. Replicated parameters: rank
 * 0 writes a monolithic checkpoint, the others wait for the outcome. Sharded: rank 0 makes the
 * temporary directory, every rank writes, fsyncs and re-reads its own files there and sends
 * their description (or its error) to all; rank 0 writes the manifest last and commits only if
 * every rank succeeded; the outcome (and a failure's message, naming the rank) is the same on
 * every rank. */
static cm_status save_collective(cm_trainer *tr, const char *folder_in, const char *name_in, bool update_pointer) {
    cmi_ckpt *ck = tr->ckpt;
    const int rank = tr->dist.rank, w = tr->dist.world_size;
    const bool sharded = tr->dist.n_shard_spans > 0;
    struct {
        char folder[4096];
        char name[320];
    } where;
    snprintf(where.folder, sizeof where.folder, "%s", folder_in);
    snprintf(where.name, sizeof where.name, "%s", name_in);
    cm_status s = cmi_dist_bcast(tr, &where, sizeof where); /* rank 0's ({rank} in a name would differ) */
    if (s) return s;
    const char *folder = where.folder, *name = where.name;
    char final[4500];
    snprintf(final, sizeof final, "%s/%s", folder, name);
    cmi_ck_job *job = NULL;
    cm_status mine = CM_OK;
    if (!sharded) {
        if (rank == 0 && !(mine = build_job(tr, folder, name, update_pointer, false, &job))) mine = cmi_ck_job_run(ck, job);
        cmi_ck_job_free(job);
        s = cmi_dist_agree(tr, mine, "checkpoint save");
        if (!s && rank != 0) {
            cm_free(ck->last_path);
            ck->last_path = dup_str(final);
        }
        return s;
    }
    ck_paths p = {0};
    mine = build_job(tr, folder, name, update_pointer, false, &job);
    if (!mine && rank == 0) mine = job_prepare(job, &p);
    if ((s = cmi_dist_agree(tr, mine, "checkpoint save"))) goto out;
    char tmp[4500] = "";
    if (rank == 0) snprintf(tmp, sizeof tmp, "%s", p.tmp);
    if ((s = cmi_dist_bcast(tr, tmp, sizeof tmp))) goto out;

    /* this rank's files */
    cJSON *files = cJSON_CreateObject();
    mine = files ? CM_OK : cm_set_error(CM_ERR_OOM, "checkpoint: out of memory");
    for (int f = 0; !mine && f < job->n_files; f++)
        mine = write_file(tmp, job->fnames[f], job->tensors[f], job->n_tensors[f], files);
    if (!mine) mine = verify_written(tmp, files);
    if (!mine && cmi_ckpt_fault_hook) mine = cmi_ckpt_fault_hook("shard_written", rank);
    char *text = mine ? NULL : cJSON_PrintUnformatted(files);
    if (!mine && !text) mine = cm_set_error(CM_ERR_OOM, "checkpoint: out of memory");
    cm_status *sv;
    char **tv;
    s = cmi_dist_gather(tr, mine, mine ? cm_last_error() : text, &sv, &tv);
    cJSON_free(text);
    cJSON_Delete(files);
    if (s) goto out; /* a rank is gone: nothing is committed (rank 0 removes the directory) */
    for (int r = 0; r < w && !s; r++)
        if (sv[r])
            s = cm_set_error(sv[r], "checkpoint '%s' was not saved (previous checkpoints are intact): rank %d of %d: %s",
                             final, r, w, tv[r]);
    if (!s && rank == 0) {
        /* every rank's files, then the manifest last */
        cJSON *all = cJSON_CreateObject();
        mine = all && add(job->manifest, "files", all) ? CM_OK : cm_set_error(CM_ERR_OOM, "checkpoint: out of memory");
        for (int r = 0; !mine && r < w; r++) {
            cJSON *fr = cJSON_Parse(tv[r]), *fo;
            if (!fr) mine = cm_set_error(CM_ERR_FORMAT, "checkpoint: rank %d's file list is not JSON", r);
            while (!mine && fr && (fo = fr->child)) {
                cJSON_DetachItemViaPointer(fr, fo);
                char *k = fo->string;
                fo->string = NULL;
                if (!cJSON_AddItemToObject(all, k, fo)) {
                    cJSON_Delete(fo);
                    mine = cm_set_error(CM_ERR_OOM, "checkpoint: out of memory");
                }
                cJSON_free(k);
            }
            cJSON_Delete(fr);
        }
        if (!mine) mine = job_commit(ck, job, &p, false);
    }
    if (!s) s = cmi_dist_agree(tr, rank == 0 ? mine : CM_OK, "checkpoint save");
    cmi_dist_gather_free(sv, tv);
    if (!s && rank != 0) {
        cm_free(ck->last_path);
        ck->last_path = dup_str(final);
    }
out:
    paths_free(&p); /* removes the temporary directory unless committed */
    cmi_ck_job_free(job);
    return s;
}

static cm_status save_impl(cm_trainer *tr, const char *folder, const char *name, bool update_pointer,
                           bool allow_async);

/* A save as one profiler slice (composer/profiler.h), its phases inside. */
static cm_status save(cm_trainer *tr, const char *folder, const char *name, bool update_pointer, bool allow_async) {
    if (cmi_prof_on()) {
        char args[400];
        snprintf(args, sizeof args, "{\"name\": \"%.300s\"}", name);
        cmi_prof_begin("checkpoint/save", "checkpoint", args);
    }
    cm_status s = save_impl(tr, folder, name, update_pointer, allow_async);
    cmi_prof_end("checkpoint/save");
    return s;
}

static cm_status save_impl(cm_trainer *tr, const char *folder, const char *name, bool update_pointer,
                           bool allow_async) {
    cmi_ckpt *ck = tr->ckpt;
    cm_status s = cmi_ckpt_wait(tr); /* one save at a time: the extra memory is one snapshot */
    if (s) return s;
    if (cmi_multi(tr)) {
        if (allow_async && ck->save_async && !ck->warned_async_size) {
            cm_log_msg(CM_LOG_INFO, "checkpoint: save_async saves synchronously in a multi-rank run (a save is a "
                                    "collective: the ranks write their pieces and agree before rank 0 commits, and the "
                                    "communicator belongs to the training thread)");
            ck->warned_async_size = true;
        }
        ck->last_saved_batch = tr->st.ts.batch;
        ck->last_saved_epoch = tr->st.ts.epoch;
        return save_collective(tr, folder, name, update_pointer);
    }
    bool async = allow_async && ck->save_async;
    if (async) {
        size_t need = snapshot_bytes(tr);
        if (need > ck->async_max_bytes) {
            if (!ck->warned_async_size)
                cm_log_msg(CM_LOG_WARN, "checkpoint: the state (%zu bytes) exceeds save_async_max_bytes (%zu); saving "
                                        "synchronously",
                           need, ck->async_max_bytes);
            ck->warned_async_size = true;
            async = false;
        }
    }
    cmi_ck_job *job;
    if (cmi_prof_on()) cmi_prof_begin("checkpoint/snapshot", "checkpoint", NULL);
    s = build_job(tr, folder, name, update_pointer, async, &job);
    cmi_prof_end("checkpoint/snapshot");
    if (s) return s;
    ck->last_saved_batch = tr->st.ts.batch;
    ck->last_saved_epoch = tr->st.ts.epoch;
    if (!async) {
        s = cmi_ck_job_run(ck, job);
        cmi_ck_job_free(job);
        return s;
    }
    ck->job = job;
    atomic_store(&ck->done, false);
    ck->job_status = CM_OK;
    if (pthread_create(&ck->thread, NULL, writer_main, ck) != 0) {
        ck->job = NULL;
        s = cmi_ck_job_run(ck, job); /* no thread: do it here */
        cmi_ck_job_free(job);
        return s;
    }
    ck->running = true;
    return CM_OK;
}

static cm_status save_interval_name(cm_trainer *tr, bool allow_async) {
    cmi_ckpt *ck = tr->ckpt;
    char name[300];
    cm_status s = cm_checkpoint_format_name(ck->save_filename, &tr->st.ts, tr->st.run_name, tr->st.rank, name, sizeof name);
    if (s) return s;
    if (ck->remote) {
        /* before anything is written: an earlier upload's failure, and "already exists" remotely
         * (a checkpoint autoresume found damaged is set aside and saved anew instead) */
        cm_status mine = CM_OK;
        if (tr->dist.rank == 0) {
            mine = cmi_remote_failure(ck->remote);
            if (!mine && !ck->save_overwrite && !cmi_remote_was_rejected(ck->remote, name) &&
                cmi_remote_exists(ck->remote, name))
                mine = cm_set_error(CM_ERR_STATE, "checkpoint '%s/%s' already exists: set save_overwrite to replace it, "
                                                  "or change save_filename / save_folder",
                                    cmi_remote_uri(ck->remote), name);
        }
        if ((s = cmi_dist_agree(tr, mine, "checkpoint save"))) return s;
    }
    return save(tr, ck->save_folder, name, true, allow_async);
}

cm_status cmi_ckpt_finish(cm_trainer *tr, bool collective) {
    cmi_ckpt *ck = tr->ckpt;
    if (!ck || (collective && !ck->remote)) return CM_OK; /* fit's end waits for uploads only */
    cm_status s = cmi_ckpt_wait(tr);
    char msg[2048] = "";
    if (s) snprintf(msg, sizeof msg, "%s", cm_last_error());
    if (!s && ck->remote && tr->dist.rank == 0) s = cmi_remote_drain(ck->remote);
    if (s && !msg[0]) snprintf(msg, sizeof msg, "%s", cm_last_error());
    if (s) cm_set_error(s, "%s", msg);
    if (collective && cmi_multi(tr)) s = cmi_dist_agree(tr, s, "finishing the checkpoint uploads");
    return s;
}

cm_status cmi_ckpt_save_now(cm_trainer *tr) {
    cmi_ckpt *ck = tr->ckpt;
    if (!ck || !ck->save_folder) return cmi_ckpt_wait(tr);
    if (ck->last_saved_batch == tr->st.ts.batch && ck->last_saved_epoch == tr->st.ts.epoch) return cmi_ckpt_wait(tr);
    cm_status s = save_interval_name(tr, false);
    cm_status w = cmi_ckpt_wait(tr);
    return s ? s : w;
}

bool cmi_ckpt_due(const cm_trainer *tr, cm_event ev, const cm_timestamp *prev) {
    const cmi_ckpt *ck = tr->ckpt;
    if (!ck || !ck->save_folder) return false;
    const cm_state *st = &tr->st;
    const bool done = cmi_fit_done(tr);
    const bool ep = ck->save_interval.unit == CM_TIME_EPOCH;
    bool due;
    if (ev == CM_EVENT_BATCH_CHECKPOINT) {
        const bool epoch_end_follows = st->batches_per_epoch > 0 && st->ts.batch_in_epoch == st->batches_per_epoch;
        due = (!ep && cmi_interval_hit(tr, ck->save_interval, prev, &st->ts, false)) || (done && !epoch_end_follows);
    } else {
        due = (ep && cmi_interval_hit(tr, ck->save_interval, prev, &st->ts, true)) ||
              (done && ck->last_saved_batch != st->ts.batch);
    }
    return due && !(ck->last_saved_batch == st->ts.batch && ck->last_saved_epoch == st->ts.epoch);
}

cm_status cmi_ckpt_on_event(cm_trainer *tr, cm_event ev, const cm_timestamp *prev) {
    cmi_ckpt *ck = tr->ckpt;
    if (!ck) return CM_OK;
    if (ck->running && atomic_load(&ck->done)) {
        cm_status s = cmi_ckpt_wait(tr);
        if (s) return s;
    }
    if (ck->remote && !cmi_multi(tr)) {
        cm_status s = cmi_remote_failure(ck->remote); /* a background upload failed: stop loudly */
        if (s) return s;
    }
    if (!cmi_ckpt_due(tr, ev, prev)) return CM_OK;
    return save_interval_name(tr, true);
}

/* ---------------------------------------------------------------------------------------------
 * Loading into the trainer
 * ------------------------------------------------------------------------------------------- */

static bool excluded(const cmi_ckpt *ck, const char *name) {
    for (int i = 0; i < ck->n_exclude_algs; i++)
        if (cm_name_match(ck->exclude_algs[i], name)) return true;
    return false;
}

/* The k-th entry called `name` in a manifest plugin list. */
static const cJSON *find_plugin(const cJSON *list, const char *name, int k) {
    const cJSON *e;
    cJSON_ArrayForEach(e, list) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(e, "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name) && k-- == 0) return e;
    }
    return NULL;
}

static cm_status load_plugin(const char *kind, const char *name, cm_status (*load)(void *, const char *, size_t),
                             void *self, const cJSON *list, int k, const char *path) {
    const cJSON *e = find_plugin(list, name, k);
    if (!e) {
        cm_log_msg(CM_LOG_INFO, "checkpoint '%s' has no state for %s '%s' (added since?); it starts fresh", path, kind, name);
        return CM_OK;
    }
    if (!load) return CM_OK;
    char *txt = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(e, "state"));
    if (!txt) return cm_set_error(CM_ERR_OOM, "checkpoint: out of memory");
    cm_status s = load(self, txt, strlen(txt));
    cJSON_free(txt);
    if (s) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "%s '%s' could not load its state from checkpoint '%s': %s", kind, name, path, msg);
    }
    return CM_OK;
}

typedef struct rng_ctx {
    const cJSON *list;
    const char *path;
    bool strict;
    cm_status s;
} rng_ctx;

static bool visit_restore(cm_module *m, const char *mpath, int depth, void *data) {
    rng_ctx *c = data;
    cm_rng *r = cm_nn_dropout_rng(m);
    if (!r) return true;
    const cJSON *e;
    cJSON_ArrayForEach(e, c->list) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(e, "module");
        if (!cJSON_IsString(n) || strcmp(n->valuestring, mpath)) continue;
        cm_rng v;
        if (!cmi_json_get_u64(e, "seed", &v.seed) || !cmi_json_get_u64(e, "stream", &v.stream) ||
            !cmi_json_get_u64(e, "counter", &v.counter)) {
            c->s = cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': the dropout RNG entry of '%s' is malformed", c->path, mpath);
            return false;
        }
        *r = v;
        return true;
    }
    if (c->strict) {
        c->s = cm_set_error(CM_ERR_NOT_FOUND, "checkpoint '%s' has no RNG state for the dropout module '%s' (the model "
                                              "differs; set load_strict_model_weights = false to reseed it)",
                            c->path, mpath);
        return false;
    }
    return true;
}

static cm_status get_loader_state(const cJSON *dls, const char *label, const char *path, bool *found,
                                  cm_dataloader_state *out) {
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(dls, label);
    *found = o != NULL;
    if (!o) return CM_OK;
    if (!cmi_json_get_i64(o, "epoch", &out->epoch) || !cmi_json_get_i64(o, "position", &out->position))
        return cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': dataloader '%s' has no valid epoch/position", path, label);
    return CM_OK;
}

/* Everything about the run's state (not the tensors) that must hold before a load changes
 * anything: the optimizer kind, the timestamp, the global batch size, the train loader's
 * position (moved here, moved back by the caller on failure). */
static cm_status check_run_state(cm_trainer *tr, const cm_checkpoint *c, const cJSON *root, const char *path,
                                 cm_dataloader_state *old_train, bool *moved_train) {
    cm_state *st = &tr->st;
    const cJSON *oj = cJSON_GetObjectItemCaseSensitive(root, "optimizer");
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(oj, "kind");
    const char *mine = cm_optim_kind_name(cm_optim_get_kind(st->optimizer));
    if (!cJSON_IsString(kind) || !cmi_ck_has_kind(c, CMI_CK_KIND_OPTIM))
        return cm_set_error(CM_ERR_FORMAT, "checkpoint '%s' has no optimizer state (set load_weights_only to load only "
                                           "the weights)", path);
    if (strcmp(kind->valuestring, mine))
        return cm_set_error(CM_ERR_STATE, "checkpoint '%s' was trained with optimizer %s; this trainer uses %s (set "
                                          "load_weights_only to start a new optimizer from the weights)",
                            path, kind->valuestring, mine);
    if (!cmi_timestamp_from_json(cJSON_GetObjectItemCaseSensitive(root, "timestamp"), &(cm_timestamp){0}))
        return cm_set_error(CM_ERR_FORMAT, "checkpoint '%s': bad timestamp", path);
    const cJSON *dls = cJSON_GetObjectItemCaseSensitive(root, "dataloaders");
    if (!st->train_dl) return CM_OK;
    bool found;
    cm_dataloader_state ds;
    cm_status s = get_loader_state(dls, "train", path, &found, &ds);
    if (s || !found) return s;
    int64_t bs;
    const int64_t mybs = cm_dataloader_get_config(st->train_dl)->batch_size;
    if (cmi_json_get_i64(cJSON_GetObjectItemCaseSensitive(dls, "train"), "batch_size", &bs) && bs != mybs)
        return cm_set_error(CM_ERR_STATE, "checkpoint '%s' was saved with a global batch of %lld samples; this run's "
                                          "train loader has %lld: the data order and the schedules would not continue "
                                          "the saved run (use batch_size %lld: it is global, so the number of ranks "
                                          "may change; or set load_weights_only to start a new run from the weights)",
                            path, (long long)bs, (long long)mybs, (long long)bs);
    *old_train = cm_dataloader_get_state(st->train_dl);
    if ((s = cm_dataloader_set_state(st->train_dl, ds))) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "checkpoint '%s': the train loader cannot resume at epoch %lld, position %lld (a "
                               "different dataset or batch size?): %s",
                            path, (long long)ds.epoch, (long long)ds.position, msg);
    }
    *moved_train = true;
    return CM_OK;
}

/* The algorithms' checkpoint tensors: for every algorithm that is not excluded and whose state
 * the checkpoint holds, each of its tensors must be there with the same dtype and shape. */
static cm_status plan_algorithms(cm_trainer *tr, cm_checkpoint *c, const cJSON *root, cmi_ld_plan *p) {
    cmi_ckpt *ck = tr->ckpt;
    cm_engine *e = tr->engine;
    const char *path = cm_checkpoint_path(c);
    const cJSON *algs = cJSON_GetObjectItemCaseSensitive(root, "algorithms");
    cm_status s = CM_OK;
    for (int i = 0; !s && i < cm_engine_n_algorithms(e); i++) {
        const char *name = cm_algorithm_name(cm_engine_algorithm(e, i));
        int k = 0;
        for (int j = 0; j < i; j++) k += !strcmp(cm_algorithm_name(cm_engine_algorithm(e, j)), name);
        if (excluded(ck, name) || !find_plugin(algs, name, k)) continue;
        cm_plugin_tensor *t;
        int n;
        if ((s = algo_tensors(e, i, &t, &n))) break;
        for (int q = 0; !s && q < n; q++) {
            char full[512];
            cmi_algo_tensor_name(e, i, t[q].name, full, sizeof full);
            cmi_ck_global g;
            if (!cmi_ck_find(c, CMI_CK_KIND_ALGO, full, &g)) {
                s = cm_set_error(CM_ERR_FORMAT, "checkpoint '%s' holds the state of algorithm '%s' but not its tensor "
                                                "'%s' (saved by another version? set load_exclude_algorithms to start "
                                                "'%s' fresh)", path, name, full, name);
                break;
            }
            bool same = g.ndim == t[q].ndim && g.dtype == cm_st_dtype_from_cm(t[q].dtype);
            for (int d = 0; same && d < g.ndim; d++) same = g.shape[d] == t[q].shape[d];
            if (!same) {
                s = cm_set_error(CM_ERR_SHAPE, "checkpoint '%s': algorithm tensor '%s' has another dtype or shape than "
                                               "this run's (a different model, or the algorithm's settings changed)",
                                 path, full);
                break;
            }
            s = cmi_ld_plan_add(p, c, CMI_CK_KIND_ALGO, g.name, 0, g.numel, t[q].data);
        }
        cm_free(t);
    }
    return s;
}

/* Loads on every rank (all ranks call it with the same path): each checks and plans its part,
 * the ranks agree, and only then does anything change. */
static cm_status load_into(cm_trainer *tr, const char *path, cmi_remote *via) {
    cmi_ckpt *ck = tr->ckpt;
    cm_state *st = &tr->st;
    cm_checkpoint *c = NULL;
    cmi_ld_plan plan = {0};
    cm_dataloader_state old_train = {0, 0};
    bool moved_train = false, weights_only = ck->load_weights_only;
    const cJSON *root = NULL;
    cm_status s = via ? cmi_remote_open_path(via, path, &c) : cm_checkpoint_open(path, &c);
    /* a monolithic checkpoint is read whole: hash it whole; a sharded one is hashed piece by
     * piece as this rank reads it */
    if (!s && !cm_checkpoint_sharded(c)) s = cm_checkpoint_verify(c);
    if (!s) {
        path = cm_checkpoint_path(c);
        root = cmi_checkpoint_root(c);
        weights_only = weights_only || cm_checkpoint_weights_only(c);
        if (!weights_only) s = check_run_state(tr, c, root, path, &old_train, &moved_train);
    }
    if (!s) s = cmi_ld_plan_build(tr, c, weights_only, &plan);
    if (!s && !weights_only) s = plan_algorithms(tr, c, root, &plan);
    s = cmi_dist_agree(tr, s, "loading a checkpoint");
    if (s) goto done;

    /* committed: from here on only copies */
    cmi_ld_plan_apply(c, &plan);
    moved_train = false;
    if (plan.n_missing || plan.n_unexpected)
        cm_log_msg(CM_LOG_WARN, "checkpoint '%s': %lld model tensors missing (%s), %lld unexpected (%s)", path,
                   (long long)plan.n_missing, plan.missing, (long long)plan.n_unexpected, plan.unexpected);
    if (plan.wrote_spans && tr->dist.sync_params && (s = tr->dist.sync_params(st, tr->dist.data))) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        s = cm_set_error(s, "checkpoint '%s': refreshing the parameters from the shards after the load failed: %s",
                         path, msg);
        goto done;
    }
    if (weights_only) {
        cm_log_msg(CM_LOG_INFO, "loaded the weights of checkpoint '%s' (weights only: time, optimizer and data "
                                "order start fresh)", path);
        goto done;
    }
    cmi_timestamp_from_json(cJSON_GetObjectItemCaseSensitive(root, "timestamp"), &st->ts);
    if (st->max_duration.unit == CM_TIME_DURATION ? st->max_duration.frac == 0 : st->max_duration.count == 0) {
        const cJSON *md = cJSON_GetObjectItemCaseSensitive(root, "max_duration");
        cm_time t;
        if (cJSON_IsString(md) && !cm_time_parse(md->valuestring, &t)) st->max_duration = t;
    }
    const cJSON *trn = cJSON_GetObjectItemCaseSensitive(root, "trainer");
    int64_t v;
    double d;
    if (tr->mb_config == CM_MICROBATCH_AUTO && cmi_json_get_i64(trn, "microbatch_size", &v) && v > 0)
        st->microbatch_size = v;
    if (cmi_json_get_double(trn, "total_loss", &d)) st->total_loss = d;
    if (cmi_json_get_double(trn, "lr_multiplier", &d) && isfinite(d)) st->lr_multiplier = d;
    if (cmi_json_get_i64(trn, "last_eval_batch", &v)) tr->last_eval_batch = v;
    {
        const cJSON *dls = cJSON_GetObjectItemCaseSensitive(root, "dataloaders");
        for (int i = 0; i < tr->n_evals; i++) {
            bool found;
            cm_dataloader_state ds;
            if (get_loader_state(dls, tr->evals[i].label, path, &found, &ds) == CM_OK && found &&
                cm_dataloader_set_state(tr->evals[i].dl, ds) != CM_OK)
                cm_log_msg(CM_LOG_WARN, "checkpoint '%s': eval loader '%s' cannot be set to its saved position; it "
                                        "restarts at its next evaluation anyway", path, tr->evals[i].label);
        }
    }
    const cJSON *rng = cJSON_GetObjectItemCaseSensitive(root, "rng");
    uint64_t seed;
    if (cmi_json_get_u64(rng, "seed", &seed) && seed != st->seed)
        cm_log_msg(CM_LOG_WARN, "checkpoint '%s' was trained with seed %llu; this trainer has seed %llu (the dropout "
                                "streams continue the checkpoint's)", path, (unsigned long long)seed,
                   (unsigned long long)st->seed);
    {
        rng_ctx rc = {cJSON_GetObjectItemCaseSensitive(rng, "dropout"), path, ck->load_strict, CM_OK};
        cm_module_visit(cm_model_module(st->model), visit_restore, &rc);
        s = rc.s;
    }
    const cJSON *algs = cJSON_GetObjectItemCaseSensitive(root, "algorithms");
    for (int i = 0; !s && i < cm_engine_n_algorithms(tr->engine); i++) {
        cm_algorithm *a = cm_engine_algorithm(tr->engine, i);
        const char *name = cm_algorithm_name(a);
        if (excluded(ck, name)) continue;
        int k = 0;
        for (int j = 0; j < i; j++) k += !strcmp(cm_algorithm_name(cm_engine_algorithm(tr->engine, j)), name);
        s = load_plugin("algorithm", name, cm_algorithm_vtable(a)->load, cm_algorithm_self(a), algs, k, path);
    }
    const cJSON *cbs = cJSON_GetObjectItemCaseSensitive(root, "callbacks");
    for (int i = 0; !s && i < cm_engine_n_callbacks(tr->engine); i++) {
        cm_callback_plugin p = cm_engine_callback(tr->engine, i);
        int k = 0;
        for (int j = 0; j < i; j++) k += !strcmp(cm_engine_callback(tr->engine, j).vt->name, p.vt->name);
        s = load_plugin("callback", p.vt->name, p.vt->load, p.self, cbs, k, path);
    }
    const cJSON *lgs = cJSON_GetObjectItemCaseSensitive(root, "loggers"); /* absent before loggers kept state */
    for (int i = 0; !s && lgs && i < cm_engine_n_loggers(tr->engine); i++) {
        cm_logger_plugin p = cm_engine_logger_plugin(tr->engine, i);
        int k = 0;
        for (int j = 0; j < i; j++) k += !strcmp(cm_engine_logger_plugin(tr->engine, j).vt->name, p.vt->name);
        s = load_plugin("logger", p.vt->name, p.vt->load, p.self, lgs, k, path);
    }
    s = cmi_dist_agree(tr, s, "loading a checkpoint");
    if (!s) {
        /* a later save of the same batch would only repeat this checkpoint */
        ck->last_saved_batch = st->ts.batch;
        ck->last_saved_epoch = st->ts.epoch;
        cm_log_msg(CM_LOG_INFO, "resumed from checkpoint '%s' at epoch %lld, batch %lld", path, (long long)st->ts.epoch,
                   (long long)st->ts.batch);
    }
done:
    if (moved_train) cm_dataloader_set_state(st->train_dl, old_train);
    if (!s) {
        cm_free(ck->resumed_from);
        ck->resumed_from = dup_str(path);
    }
    cmi_ld_plan_free(&plan);
    cm_checkpoint_close(c);
    return s;
}

cm_status cmi_ckpt_resolve(cm_trainer *dist_tr, bool autoresume, const char *save_folder, const char *latest,
                           const char *load_path, char **out) {
    *out = NULL;
    if (autoresume && save_folder) {
        cm_checkpoint_search srch;
        memset(&srch, 0, sizeof srch);
        /* rank 0 chooses; every rank loads what it chose (they could see the folder at different
         * instants) */
        struct {
            int32_t status;
            char msg[1500];
        } res = {0, ""};
        if (!dist_tr || dist_tr->dist.rank == 0) {
            res.status = cm_checkpoint_find_latest(save_folder, latest, &srch);
            if (res.status) snprintf(res.msg, sizeof res.msg, "%s", cm_last_error());
        }
        if (dist_tr) {
            cm_status bs = cmi_dist_bcast(dist_tr, &res, sizeof res);
            if (!bs) bs = cmi_dist_bcast(dist_tr, &srch, sizeof srch);
            if (bs) return bs;
        }
        cm_status s = (cm_status)res.status;
        if (s) cm_set_error(s, "%s", res.msg);
        if (s == CM_OK) {
            if (srch.n_rejected)
                cm_log_msg(CM_LOG_WARN, "autoresume: fell back to '%s'; unusable: %s", srch.path, srch.rejected);
            *out = dup_str(srch.path);
            return *out ? CM_OK : cm_set_error(CM_ERR_OOM, "checkpoint: out of memory");
        }
        if (s != CM_ERR_NOT_FOUND) return s;
        if (srch.n_rejected) {
            return cm_set_error(CM_ERR_FORMAT, "autoresume: every checkpoint in '%s' is damaged (%s); move them away to "
                                               "start the run over",
                                save_folder, srch.rejected);
        }
        cm_log_msg(CM_LOG_INFO, "autoresume: no checkpoint in '%s' yet; %s", save_folder,
                   load_path ? "loading load_path" : "starting from scratch");
    }
    if (load_path && load_path[0]) {
        *out = dup_str(load_path);
        return *out ? CM_OK : cm_set_error(CM_ERR_OOM, "checkpoint: out of memory");
    }
    return CM_OK;
}

/* load_path on an object store: ".../NAME" (a checkpoint) or a folder with a latest pointer.
 * Rank 0 fetches the manifest into a staging folder; every rank then reads its part lazily.
 * *path: the checkpoint's local staging path, read through ck->load_remote. */
static cm_status resolve_remote_path(cm_trainer *tr, char **path) {
    cmi_ckpt *ck = tr->ckpt;
    const char *lp = ck->load_path;
    size_t n = strlen(lp);
    while (n && lp[n - 1] == '/') n--;
    char parent[4096], name[256];
    const char *slash = memrchr(lp, '/', n);
    if (!slash || slash - lp < 6 || (size_t)(slash - lp) >= sizeof parent || n - (size_t)(slash - lp) - 1 >= sizeof name)
        return cm_set_error(CM_ERR_INVALID_ARG, "load_path '%s': name a checkpoint (s3://BUCKET/PREFIX/NAME)", lp);
    snprintf(parent, sizeof parent, "%.*s", (int)(slash - lp), lp);
    snprintf(name, sizeof name, "%.*s", (int)(n - (size_t)(slash - lp) - 1), slash + 1);
    char *local = cmi_remote_default_local(parent);
    cm_status s = local ? cmi_remote_new(parent, local, NULL, -1, false, &ck->load_remote) : CM_ERR_OOM;
    cm_free(local);
    struct {
        int32_t status;
        char msg[1500];
        char path[4096];
    } res = {0, "", ""};
    if (!s && tr->dist.rank == 0) {
        cm_checkpoint *c = NULL;
        cm_status os = cmi_remote_exists(ck->load_remote, name) ? cmi_remote_open(ck->load_remote, name, &c)
                                                                 : CM_ERR_NOT_FOUND;
        if (os == CM_ERR_NOT_FOUND) {
            /* a folder: follow its pointer */
            cmi_remote *pr = NULL;
            char *l2 = cmi_remote_default_local(lp);
            char *txt = NULL;
            size_t tn;
            cm_object_store *st = NULL;
            os = l2 ? cm_object_store_open(lp, NULL, &st) : CM_ERR_OOM;
            if (!os) os = cm_object_store_get(st, CM_CKPT_LATEST_DEFAULT, 4096, &txt, &tn);
            while (!os && tn && (txt[tn - 1] == '\n' || txt[tn - 1] == ' ')) txt[--tn] = 0;
            if (!os) os = cmi_remote_new(lp, l2, NULL, -1, false, &pr);
            if (!os) os = cmi_remote_open(pr, txt, &c);
            if (os == CM_ERR_NOT_FOUND)
                cm_set_error(CM_ERR_NOT_FOUND, "load_path '%s' is neither a checkpoint (no %s) nor a folder with a "
                                               "latest pointer", lp, CM_CKPT_MANIFEST);
            if (!os) { /* load through the folder's store from now on */
                cmi_remote_free(ck->load_remote);
                ck->load_remote = pr;
                pr = NULL;
            }
            cmi_remote_free(pr);
            cm_object_store_close(st);
            cm_free(txt);
            cm_free(l2);
        }
        if (!os) snprintf(res.path, sizeof res.path, "%s", cm_checkpoint_path(c));
        cm_checkpoint_close(c);
        res.status = os;
        if (os) snprintf(res.msg, sizeof res.msg, "%s", cm_last_error());
    }
    cm_status bs = cmi_dist_bcast(tr, &res, sizeof res);
    if (bs) return bs;
    if (s) return s;
    if (res.status) return cm_set_error((cm_status)res.status, "%s", res.msg);
    if (tr->dist.rank != 0) {
        /* the pointer may have named another folder: open the store rank 0 used */
        const char *rp = res.path;
        if (!strstr(rp, cmi_remote_local(ck->load_remote))) {
            cmi_remote_free(ck->load_remote);
            ck->load_remote = NULL;
            char *l2 = cmi_remote_default_local(lp);
            s = l2 ? cmi_remote_new(lp, l2, NULL, -1, false, &ck->load_remote) : CM_ERR_OOM;
            cm_free(l2);
            if (s) return s;
        }
    }
    *path = dup_str(res.path);
    return *path ? CM_OK : cm_set_error(CM_ERR_OOM, "checkpoint: out of memory");
}

cm_status cmi_ckpt_rollback_load(cm_trainer *tr, const char *path) {
    cmi_ckpt *ck = tr->ckpt;
    if (!ck) return cm_set_error(CM_ERR_STATE, "no checkpoint configuration to roll back with");
    const bool wo = ck->load_weights_only;
    ck->load_weights_only = false;
    cm_status s = load_into(tr, path, NULL);
    ck->load_weights_only = wo;
    return s;
}

/* Which checkpoint this trainer loads: autoresume's choice (rank 0's, shared; in save_folder or
 * its object store), else load_path (local, or on a store). *path (new string, or NULL: nothing)
 * and *via (the store to read it through; NULL: local). */
static cm_status resolve_for_trainer(cm_trainer *tr, char **path, cmi_remote **via) {
    cmi_ckpt *ck = tr->ckpt;
    *path = NULL, *via = NULL;
    if (ck->autoresume && ck->remote) {
        cm_checkpoint_search srch;
        memset(&srch, 0, sizeof srch);
        struct {
            int32_t status;
            char msg[1500];
        } res = {0, ""};
        if (tr->dist.rank == 0) {
            res.status = cmi_remote_find_latest(ck->remote, &srch);
            if (res.status) snprintf(res.msg, sizeof res.msg, "%s", cm_last_error());
        }
        cm_status bs = cmi_dist_bcast(tr, &res, sizeof res);
        if (!bs) bs = cmi_dist_bcast(tr, &srch, sizeof srch);
        if (bs) return bs;
        cm_status s = (cm_status)res.status;
        if (s) cm_set_error(s, "%s", res.msg);
        if (s == CM_OK) {
            if (srch.n_rejected)
                cm_log_msg(CM_LOG_WARN, "autoresume: fell back to '%s'; unusable: %s", srch.path, srch.rejected);
            *via = ck->remote;
            *path = dup_str(srch.path);
            return *path ? CM_OK : cm_set_error(CM_ERR_OOM, "checkpoint: out of memory");
        }
        if (s != CM_ERR_NOT_FOUND) return s;
        if (srch.n_rejected)
            return cm_set_error(CM_ERR_FORMAT, "autoresume: every checkpoint in '%s' is damaged (%s); move them away to "
                                               "start the run over",
                                cmi_remote_uri(ck->remote), srch.rejected);
        cm_log_msg(CM_LOG_INFO, "autoresume: no checkpoint in '%s' yet; %s", cmi_remote_uri(ck->remote),
                   ck->load_path ? "loading load_path" : "starting from scratch");
    } else if (ck->autoresume) {
        cm_status s = cmi_ckpt_resolve(tr, true, ck->save_folder, ck->save_latest_filename, NULL, path);
        if (s || *path) return s;
    }
    if (ck->load_path && cm_storage_is_remote(ck->load_path)) {
        cm_status s = resolve_remote_path(tr, path);
        if (!s) *via = ck->load_remote;
        return s;
    }
    return cmi_ckpt_resolve(tr, false, NULL, NULL, ck->load_path, path);
}

cm_status cmi_ckpt_prepare_load(cm_trainer *tr) {
    cmi_ckpt *ck = tr->ckpt;
    if (!ck) return CM_OK;
    cm_free(ck->pending);
    ck->pending = NULL;
    ck->pending_via = NULL;
    cm_status s = resolve_for_trainer(tr, &ck->pending, &ck->pending_via);
    if (s || !ck->pending) return s;
    int added = 0;
    s = cmi_apply_required_algorithms(tr->engine, &tr->st, ck->pending, ck->pending_via,
                                      (const char *const *)ck->exclude_algs, ck->n_exclude_algs, &added);
    return cmi_dist_agree(tr, s, "applying the checkpoint's required algorithms");
}

cm_status cmi_ckpt_load_start(cm_trainer *tr) {
    cmi_ckpt *ck = tr->ckpt;
    return ck && ck->pending ? load_into(tr, ck->pending, ck->pending_via) : CM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Public trainer functions
 * ------------------------------------------------------------------------------------------- */

cm_status cm_trainer_save_checkpoint(cm_trainer *tr, const char *path) {
    if (!tr) return cm_set_error(CM_ERR_INVALID_ARG, "cm_trainer_save_checkpoint: trainer is NULL");
    cmi_ckpt *ck = tr->ckpt;
    if (!path) {
        if (!ck->save_folder)
            return cm_set_error(CM_ERR_INVALID_ARG, "cm_trainer_save_checkpoint: no path and no save_folder configured");
        cm_status s = save_interval_name(tr, false);
        return s ? s : cmi_ckpt_wait(tr);
    }
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    char *p = cm_alloc(n + 1, 1);
    if (!p) return CM_ERR_OOM;
    memcpy(p, path, n);
    p[n] = 0;
    char *slash = strrchr(p, '/');
    const char *folder = ".", *name = p;
    if (slash) {
        *slash = 0;
        folder = slash == p ? "/" : p;
        name = slash + 1;
    }
    cm_status s = name[0] && name[0] != '.' ? CM_OK
                                            : cm_set_error(CM_ERR_INVALID_ARG, "cm_trainer_save_checkpoint: '%s' does not "
                                                                               "end in a checkpoint name", path);
    if (!s) s = save(tr, folder, name, false, false);
    cm_free(p);
    return s;
}

const char *cm_trainer_last_checkpoint(const cm_trainer *tr) { return tr && tr->ckpt ? tr->ckpt->last_path : NULL; }
const char *cm_trainer_resumed_from(const cm_trainer *tr) { return tr && tr->ckpt ? tr->ckpt->resumed_from : NULL; }
int cm_trainer_interrupted_signal(const cm_trainer *tr) { return tr ? tr->interrupted_signal : 0; }
int cm_trainer_exit_code(const cm_trainer *tr, cm_status s) {
    return cm_exit_status(s, tr ? tr->interrupted_signal : 0);
}
