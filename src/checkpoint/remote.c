/* Remote checkpoints: save_folder / load_path / autoresume on an object store. A checkpoint is
 * committed locally as always (into a staging folder), then a background uploader (rank 0) sends
 * its files, the manifest last — so a remote checkpoint is visible, to the search below, only when
 * complete —, then the latest pointer, then rotates old checkpoints out (remote manifest first,
 * then the rest, then the local copy). Resuming lists the remote folder, reads the manifests,
 * and opens the newest complete checkpoint lazily: each rank downloads only the files holding
 * the pieces it reads. */
#define _GNU_SOURCE
#include "checkpoint/ckpt_impl.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define QUEUE_MAX 2 /* committed checkpoints waiting for upload before a save blocks */

typedef struct task {
    char name[256];
    bool update_pointer, set_aside;
} task;

struct cmi_remote {
    cm_object_store *store;
    char *local;  /* the staging folder */
    char *latest; /* pointer name ("" none) */
    int keep;
    bool uploader; /* this rank uploads (rank 0) */
    /* the queue and its thread */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool started, stop, busy;
    task q[QUEUE_MAX];
    int qn;
    cm_status failed;
    char msg[2048];
    /* rotation: uploaded checkpoints of this run, oldest first */
    char (*kept)[256];
    int n_kept, cap_kept;
    /* names a search found damaged: replaced remotely (set aside first) when saved again */
    char rejected[16][256];
    int n_rejected;
};

static char *dup_str(const char *s) {
    size_t n = strlen(s);
    char *p = cm_alloc(n + 1, 1);
    if (p) memcpy(p, s, n + 1);
    return p;
}

const char *cmi_remote_uri(const cmi_remote *r) { return cm_object_store_uri(r->store); }
const char *cmi_remote_local(const cmi_remote *r) { return r->local; }

/* The staging folder of a remote URI: ${TMPDIR:-/tmp}/composer-checkpoints/<xxh3 of the URI>. */
char *cmi_remote_default_local(const char *uri) {
    const char *t = getenv("TMPDIR");
    if (!t || !t[0]) t = "/tmp";
    char buf[4200];
    snprintf(buf, sizeof buf, "%s/composer-checkpoints/%016llx", t, (unsigned long long)cm_hash64(uri, strlen(uri), 0));
    return dup_str(buf);
}

cm_status cmi_remote_new(const char *uri, const char *local, const char *latest, int keep, bool uploader,
                         cmi_remote **out) {
    *out = NULL;
    cmi_remote *r = cm_alloc_zeroed(sizeof *r, 64);
    if (!r) return cm_set_error(CM_ERR_OOM, "remote checkpoints: out of memory");
    cm_status s = cm_object_store_open(uri, NULL, &r->store);
    if (s) {
        cm_free(r);
        char msg[1500];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "save_folder '%s': %s", uri, msg);
    }
    r->local = dup_str(local);
    r->latest = dup_str(latest ? latest : "");
    r->keep = keep;
    r->uploader = uploader;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    if (!r->local || !r->latest) {
        cmi_remote_free(r);
        return cm_set_error(CM_ERR_OOM, "remote checkpoints: out of memory");
    }
    *out = r;
    return CM_OK;
}

/* ---- uploading one checkpoint ---- */

static cm_status delete_prefix(cmi_remote *r, const char *name, bool manifest_first) {
    char pre[300];
    snprintf(pre, sizeof pre, "%s/", name);
    cm_status s = CM_OK;
    if (manifest_first) {
        char mk[300];
        snprintf(mk, sizeof mk, "%s/%s", name, CM_CKPT_MANIFEST);
        if ((s = cm_object_store_delete(r->store, mk))) return s; /* now invisible to a search */
    }
    cm_object_list l;
    if ((s = cm_object_store_list(r->store, pre, &l))) return s;
    for (size_t i = 0; !s && i < l.n; i++) s = cm_object_store_delete(r->store, l.items[i].key);
    cm_object_list_free(&l);
    return s;
}

/* Moves the remote checkpoint `name` under ".corrupt-<name>-<time>/" (the store has no rename:
 * each object is copied through a local file, then the original removed, manifest first). */
static cm_status set_aside_remote(cmi_remote *r, const char *name) {
    char pre[300], aside[300];
    snprintf(pre, sizeof pre, "%s/", name);
    snprintf(aside, sizeof aside, ".corrupt-%s-%lld", name, (long long)time(NULL));
    cm_object_list l;
    cm_status s = cm_object_store_list(r->store, pre, &l);
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s/.aside-%ld", r->local, (long)getpid());
    for (size_t i = 0; !s && i < l.n; i++) {
        char dst[600];
        snprintf(dst, sizeof dst, "%s/%s", aside, l.items[i].key + strlen(pre));
        if (!(s = cm_object_store_download(r->store, l.items[i].key, tmp))) s = cm_object_store_upload(r->store, dst, tmp);
        unlink(tmp);
    }
    cm_object_list_free(&l);
    if (!s) s = delete_prefix(r, name, true);
    if (!s)
        cm_log_msg(CM_LOG_WARN, "checkpoint: the damaged remote checkpoint '%s/%s' was set aside as '%s/%s'",
                   cmi_remote_uri(r), name, cmi_remote_uri(r), aside);
    return s;
}

static cm_status upload_one(cmi_remote *r, const task *t) {
    char dir[4400];
    snprintf(dir, sizeof dir, "%s/%s", r->local, t->name);
    cm_status s = CM_OK;
    char mk[300];
    snprintf(mk, sizeof mk, "%s/%s", t->name, CM_CKPT_MANIFEST);
    uint64_t sz;
    if (t->set_aside) {
        s = set_aside_remote(r, t->name);
    } else if (cm_object_store_get_size(r->store, mk, &sz) == CM_OK) {
        /* replaced (save_overwrite): hide the old one first, so no reader sees old and new parts mixed */
        s = delete_prefix(r, t->name, true);
    }
    DIR *d = s ? NULL : opendir(dir);
    if (!s && !d) s = cm_set_error(CM_ERR_IO, "cannot read the local checkpoint '%s': %s", dir, strerror(errno));
    struct dirent *e;
    while (!s && d && (e = readdir(d))) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, CM_CKPT_MANIFEST)) continue;
        char lp[4700], key[600];
        snprintf(lp, sizeof lp, "%s/%s", dir, e->d_name);
        snprintf(key, sizeof key, "%s/%s", t->name, e->d_name);
        s = cm_object_store_upload(r->store, key, lp);
    }
    if (d) closedir(d);
    if (!s) { /* the manifest last: from now on the checkpoint is complete remotely */
        char lp[4700];
        snprintf(lp, sizeof lp, "%s/%s", dir, CM_CKPT_MANIFEST);
        s = cm_object_store_upload(r->store, mk, lp);
    }
    if (!s && t->update_pointer && r->latest[0]) {
        char line[300];
        int k = snprintf(line, sizeof line, "%s\n", t->name);
        s = cm_object_store_put(r->store, r->latest, line, (size_t)k);
    }
    if (s) {
        char msg[1700];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s, "checkpoint '%s' is saved locally in '%s' but its upload to '%s/%s' failed: %s", t->name,
                            dir, cmi_remote_uri(r), t->name, msg);
    }
    cm_log_msg(CM_LOG_DEBUG, "checkpoint: uploaded '%s/%s'", cmi_remote_uri(r), t->name);
    if (!t->update_pointer) return CM_OK;
    /* rotation, remote and local: only checkpoints this run uploaded, oldest first */
    int at = -1;
    for (int i = 0; i < r->n_kept; i++)
        if (!strcmp(r->kept[i], t->name)) at = i;
    if (at >= 0) {
        memmove(r->kept + at, r->kept + at + 1, sizeof *r->kept * (size_t)(r->n_kept - at - 1));
        r->n_kept--;
    }
    if (r->n_kept == r->cap_kept) {
        int nc = r->cap_kept ? 2 * r->cap_kept : 8;
        char(*nk)[256] = cm_alloc(sizeof *nk * (size_t)nc, 16);
        if (!nk) return cm_set_error(CM_ERR_OOM, "checkpoint rotation: out of memory");
        if (r->kept) memcpy(nk, r->kept, sizeof *nk * (size_t)r->n_kept);
        cm_free(r->kept);
        r->kept = nk, r->cap_kept = nc;
    }
    snprintf(r->kept[r->n_kept++], 256, "%s", t->name);
    while (r->keep > 0 && r->n_kept > r->keep) {
        const char *old = r->kept[0];
        if ((s = delete_prefix(r, old, true))) {
            char msg[1700];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            return cm_set_error(s, "checkpoint rotation: removing '%s/%s' failed: %s", cmi_remote_uri(r), old, msg);
        }
        char lp[4400], hidden[4500];
        snprintf(lp, sizeof lp, "%s/%s", r->local, old);
        snprintf(hidden, sizeof hidden, "%s/.old-%ld-r-%s", r->local, (long)getpid(), old);
        if (access(lp, F_OK) == 0 && (rename(lp, hidden) != 0 || !cmi_remove_tree(hidden)))
            cm_log_msg(CM_LOG_WARN, "checkpoint rotation: could not remove the local copy '%s': %s", lp, strerror(errno));
        cm_log_msg(CM_LOG_INFO, "checkpoint rotation: removed '%s/%s' (save_num_checkpoints_to_keep %d)",
                   cmi_remote_uri(r), old, r->keep);
        memmove(r->kept, r->kept + 1, sizeof *r->kept * (size_t)(r->n_kept - 1));
        r->n_kept--;
    }
    return CM_OK;
}

static void *uploader_main(void *arg) {
    cmi_remote *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->qn && !r->stop) pthread_cond_wait(&r->cv, &r->mu);
        if (!r->qn) break;
        task t = r->q[0];
        r->busy = true;
        pthread_mutex_unlock(&r->mu);
        cm_status s = upload_one(r, &t);
        pthread_mutex_lock(&r->mu);
        if (s && !r->failed) {
            r->failed = s;
            snprintf(r->msg, sizeof r->msg, "%s", cm_last_error());
        }
        memmove(r->q, r->q + 1, sizeof *r->q * (size_t)(r->qn - 1));
        r->qn--;
        r->busy = false;
        if (r->failed) r->qn = 0; /* nothing after a failure: later checkpoints stay local */
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

cm_status cmi_remote_failure(cmi_remote *r) {
    if (!r) return CM_OK;
    pthread_mutex_lock(&r->mu);
    cm_status s = r->failed;
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", r->msg);
    pthread_mutex_unlock(&r->mu);
    return s ? cm_set_error(s, "%s", msg) : CM_OK;
}

bool cmi_remote_was_rejected(cmi_remote *r, const char *name) {
    for (int i = 0; i < r->n_rejected; i++)
        if (!strcmp(r->rejected[i], name)) return true;
    return false;
}

cm_status cmi_remote_enqueue(cmi_remote *r, const char *name, bool update_pointer) {
    pthread_mutex_lock(&r->mu);
    if (!r->started) {
        if (pthread_create(&r->thread, NULL, uploader_main, r) != 0) {
            pthread_mutex_unlock(&r->mu);
            return cm_set_error(CM_ERR_IO, "checkpoint: cannot start the upload thread");
        }
        r->started = true;
    }
    while (r->qn >= QUEUE_MAX && !r->failed) pthread_cond_wait(&r->cv, &r->mu); /* bounded */
    if (!r->failed) {
        task *t = &r->q[r->qn++];
        memset(t, 0, sizeof *t);
        snprintf(t->name, sizeof t->name, "%s", name);
        t->update_pointer = update_pointer;
        t->set_aside = cmi_remote_was_rejected(r, name);
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return cmi_remote_failure(r);
}

cm_status cmi_remote_drain(cmi_remote *r) {
    if (!r) return CM_OK;
    pthread_mutex_lock(&r->mu);
    while (r->qn > 0 || r->busy) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    return cmi_remote_failure(r);
}

void cmi_remote_free(cmi_remote *r) {
    if (!r) return;
    if (r->started) {
        pthread_mutex_lock(&r->mu);
        r->stop = true;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->thread, NULL);
    }
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    cm_object_store_close(r->store);
    cm_free(r->local);
    cm_free(r->latest);
    cm_free(r->kept);
    cm_free(r);
}

/* Whether a remote checkpoint `name` exists (its manifest). */
bool cmi_remote_exists(cmi_remote *r, const char *name) {
    char mk[300];
    snprintf(mk, sizeof mk, "%s/%s", name, CM_CKPT_MANIFEST);
    uint64_t sz;
    return cm_object_store_get_size(r->store, mk, &sz) == CM_OK;
}

/* ---- reading ---- */

/* The lazy open's fetch: "<local>/<name>/<file>" from "<name>/<file>". */
static cm_status fetch(void *data, const char *dir, const char *file) {
    cmi_remote *r = data;
    const char *slash = strrchr(dir, '/');
    const char *name = slash ? slash + 1 : dir;
    char key[600], lp[4700];
    snprintf(key, sizeof key, "%s/%s", name, file);
    snprintf(lp, sizeof lp, "%s/%s", dir, file);
    cm_log_msg(CM_LOG_DEBUG, "checkpoint: downloading '%s/%s'", cmi_remote_uri(r), key);
    return cm_object_store_download(r->store, key, lp);
}

/* Puts the remote manifest of `name` in the staging folder (unless the same one is there) and
 * opens the checkpoint lazily. */
cm_status cmi_remote_open(cmi_remote *r, const char *name, cm_checkpoint **out) {
    *out = NULL;
    char key[600], dir[4400], lp[4700];
    snprintf(key, sizeof key, "%s/%s", name, CM_CKPT_MANIFEST);
    snprintf(dir, sizeof dir, "%s/%s", r->local, name);
    snprintf(lp, sizeof lp, "%s/%s", dir, CM_CKPT_MANIFEST);
    char *text = NULL, *have = NULL;
    size_t n = 0, hn = 0;
    cm_status s = cm_object_store_get(r->store, key, 64u << 20, &text, &n);
    if (!s && !(cmi_read_file(lp, 64u << 20, &have, &hn) == CM_OK && hn == n && !memcmp(have, text, n))) {
        /* another manifest (or none) here: the files beside it are not this checkpoint's */
        if (cmi_is_dir(dir)) {
            char hidden[4500];
            snprintf(hidden, sizeof hidden, "%s/.old-%ld-s-%s", r->local, (long)getpid(), name);
            if (rename(dir, hidden) == 0) cmi_remove_tree(hidden);
        }
        if (!(s = cmi_mkdirs(dir))) s = cmi_write_file_atomic(lp, text, n);
    }
    cm_free(text);
    cm_free(have);
    if (s) return s;
    return cmi_checkpoint_open_lazy(dir, fetch, r, out);
}

typedef struct rcand {
    char name[256];
    int64_t batch, epoch;
    bool pointed;
} rcand;

static int rcand_cmp(const void *a, const void *b) {
    const rcand *x = a, *y = b;
    if (x->batch != y->batch) return x->batch > y->batch ? -1 : 1;
    if (x->pointed != y->pointed) return x->pointed ? -1 : 1;
    return strcmp(y->name, x->name);
}

static void reject(cmi_remote *r, cm_checkpoint_search *out, const char *name, const char *why) {
    cm_log_msg(CM_LOG_WARN, "autoresume: skipping checkpoint '%s/%s': %s", cmi_remote_uri(r), name, why);
    size_t used = strlen(out->rejected);
    if (used + 8 < sizeof out->rejected)
        snprintf(out->rejected + used, sizeof out->rejected - used, "%s%s: %s", used ? "; " : "", name, why);
    out->n_rejected++;
    if (r->n_rejected < 16) snprintf(r->rejected[r->n_rejected++], 256, "%s", name);
}

cm_status cmi_remote_find_latest(cmi_remote *r, cm_checkpoint_search *out) {
    memset(out, 0, sizeof *out);
    cm_object_list l;
    cm_status s = cm_object_store_list(r->store, "", &l);
    if (s) {
        char msg[1500];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        return cm_set_error(s == CM_ERR_NOT_FOUND ? CM_ERR_IO : s, "autoresume: cannot list '%s': %s", cmi_remote_uri(r), msg);
    }
    char pointed[256] = "";
    if (r->latest[0]) {
        char *txt;
        size_t n;
        if (cm_object_store_get(r->store, r->latest, 4096, &txt, &n) == CM_OK) {
            while (n && (txt[n - 1] == '\n' || txt[n - 1] == '\r' || txt[n - 1] == ' ')) txt[--n] = 0;
            snprintf(pointed, sizeof pointed, "%s", txt);
            cm_free(txt);
        }
    }
    rcand *cs = cm_alloc_zeroed(sizeof *cs * (l.n ? l.n : 1), 16);
    int n = 0;
    if (!cs) s = cm_set_error(CM_ERR_OOM, "autoresume: out of memory");
    for (size_t i = 0; !s && i < l.n; i++) {
        const char *k = l.items[i].key, *slash = strchr(k, '/');
        if (!slash || strcmp(slash + 1, CM_CKPT_MANIFEST) || k[0] == '.' || slash == k || slash - k > 255) continue;
        rcand *c = &cs[n];
        snprintf(c->name, sizeof c->name, "%.*s", (int)(slash - k), k);
        /* the manifest: its checksum, its timestamp, and every listed file present at its size */
        char *text;
        size_t tn;
        cJSON *root = NULL;
        cm_status ms = cm_object_store_get(r->store, k, 64u << 20, &text, &tn);
        if (!ms) {
            char label[700];
            snprintf(label, sizeof label, "checkpoint '%s/%s': %s", cmi_remote_uri(r), c->name, CM_CKPT_MANIFEST);
            ms = cmi_manifest_parse(text, tn, label, &root);
            cm_free(text);
        }
        cm_timestamp ts;
        if (!ms && !cmi_timestamp_from_json(cJSON_GetObjectItemCaseSensitive(root, "timestamp"), &ts))
            ms = cm_set_error(CM_ERR_FORMAT, "the manifest's timestamp is malformed");
        const cJSON *fo, *files = root ? cJSON_GetObjectItemCaseSensitive(root, "files") : NULL;
        cJSON_ArrayForEach(fo, files) {
            if (ms) break;
            char fk[600];
            snprintf(fk, sizeof fk, "%s/%s", c->name, fo->string);
            int64_t want = -1;
            cmi_json_get_i64(fo, "size", &want);
            bool found = false;
            for (size_t j = 0; j < l.n && !found; j++)
                if (!strcmp(l.items[j].key, fk)) {
                    found = true;
                    if ((int64_t)l.items[j].size != want)
                        ms = cm_set_error(CM_ERR_FORMAT, "'%s' has %llu bytes, the manifest says %lld", fo->string,
                                          (unsigned long long)l.items[j].size, (long long)want);
                }
            if (!found) ms = cm_set_error(CM_ERR_FORMAT, "incomplete: '%s' is missing", fo->string);
        }
        cJSON_Delete(root);
        if (ms == CM_ERR_OOM) s = ms;
        if (ms) {
            reject(r, out, c->name, cm_last_error());
            continue;
        }
        c->batch = ts.batch, c->epoch = ts.epoch;
        c->pointed = !strcmp(c->name, pointed);
        n++;
    }
    cm_object_list_free(&l);
    if (n) qsort(cs, (size_t)n, sizeof *cs, rcand_cmp);
    /* the newest that opens; a monolithic one is verified whole here (its files are downloaded
     * anyway), a sharded one piece by piece as each rank reads its part */
    for (int i = 0; !s && i < n; i++) {
        cm_checkpoint *ck = NULL;
        cm_status os = cmi_remote_open(r, cs[i].name, &ck);
        if (!os && !cm_checkpoint_sharded(ck)) os = cm_checkpoint_verify(ck);
        if (!os) snprintf(out->path, sizeof out->path, "%s", cm_checkpoint_path(ck));
        cm_checkpoint_close(ck);
        if (!os) {
            cm_free(cs);
            return CM_OK;
        }
        if (os == CM_ERR_OOM) s = os;
        else reject(r, out, cs[i].name, cm_last_error());
    }
    cm_free(cs);
    if (s) return s;
    return cm_set_error(CM_ERR_NOT_FOUND, "no complete checkpoint in '%s'%s%s", cmi_remote_uri(r),
                        out->n_rejected ? "; rejected: " : "", out->rejected);
}

/* Whether `path` (a checkpoint directory) is in this remote's staging folder. */
bool cmi_remote_owns(const cmi_remote *r, const char *path) {
    size_t n = strlen(r->local);
    return !strncmp(path, r->local, n) && path[n] == '/';
}

cm_status cmi_remote_open_path(cmi_remote *r, const char *path, cm_checkpoint **out) {
    return cmi_checkpoint_open_lazy(path, fetch, r, out);
}
