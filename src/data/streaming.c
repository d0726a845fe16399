/* StreamingDataset: MDS streams with Streaming's epoch order and a local shard cache.
 *
 * The order (batch_order) materialises one epoch as Streaming's generate_work_random_batching does
 * — resample_streams, get_partitions over (nodes, ranks per node, 1 worker, per-device batch),
 * get_shuffle over the shuffle units, then the mapping back to sample ids — for the position the
 * loader resumes from, and keeps it while the loader walks forward from there.
 *
 * Shards reach the cache from the stream's remote through a cm_object_store (s3://, gs://,
 * oci://, file://, local paths). The cache is shared by every process whose `local` is the same
 * directory, coordinated by lock files only:
 *   - "<shard>.lock", exclusive while the shard is fetched and decompressed (so ranks fetch it
 *     once), shared while a process maps it (so nobody evicts it in between), and taken without
 *     waiting by an evictor (a held shard is skipped);
 *   - ".cm_cache.lock", exclusive while shards are evicted to stay under cache_limit.
 * The LRU clock is the raw files' mtime, refreshed at every open. */
#include "image_impl.h"
#include "mds_impl.h"
#include "stream_order_impl.h"

#include <composer/storage.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- fetching ------------------------------------------------------------------------------ */

/* Downloads `rel` (relative to the stream's remote) to `dst`, atomically, through the stream's
 * object store (its retries with backoff on transient failures: download_retry of them). */
static cm_status fetch_file(cm_object_store *store, const char *rel, const char *dst) {
    return cm_object_store_download(store, rel, dst);
}

/* ---- the dataset ---------------------------------------------------------------------------- */

typedef struct stream {
    char *remote, *dir; /* dir = local/split */
    char *rel_prefix;   /* split/ on the remote ("" without split) */
    cm_object_store *store; /* the remote; NULL when the shards are read in place */
    cmi_mds_index ix;
    int64_t shard_base, sample_base;
    bool has_prop, has_rep, has_choose;
    double proportion, repeat;
    int64_t choose;
} stream;

typedef struct shard_ref {
    int stream, local; /* which stream, which shard of it */
    int64_t samples, sample_offset, max_size;
    cmi_mds_open_shard *open;
    uint64_t last_use;
} shard_ref;

typedef enum { F_NUMERIC, F_INPUT_IDS, F_LABELS, F_IMAGE } fkind;

typedef struct field {
    cm_field_desc desc;
    fkind kind;
    int column;
    char name[64];
} field;

typedef struct plan {
    bool valid;
    int64_t epoch, drop;
    int64_t nb;   /* batches per rank */
    int64_t *ids; /* (world, nb * B) this epoch's sample ids of every rank, -1 for padding */
} plan;

typedef struct streaming {
    cm_streaming_config cfg;
    char *validate_hash, *shuffle_algo, *partition_algo;
    bool fixed_sampling;
    int rank, world, P, R;
    int n_streams;
    stream streams[CM_STREAMING_MAX_STREAMS];
    int n_shards;
    shard_ref *shards;
    int64_t n_samples, epoch_size;
    int n_fields;
    field fields[CM_DATASET_MAX_FIELDS];
    int tokens_col;
    bool img_f32, img_augment; /* image fields normalised to f32 (C, H, W); augmented for training */
    float lut[3][256];         /* (x/255 - mean[c]) / std[c] */
    pthread_mutex_t mu; /* shards' open state, plan, counters */
    uint64_t clock;
    plan plan;
    int64_t epoch0_size; /* epoch_size() cache */
    int64_t epoch0_global;
    int64_t n_fetched, n_evicted;
    /* prefetch */
    pthread_t pf_thread;
    bool pf_running, pf_stop;
    pthread_cond_t pf_cv;
    int64_t pf_epoch, pf_from; /* the plan position the consumer reached, in this rank's sequence */
    uint64_t pf_gen;
} streaming;

cm_streaming_config cm_streaming_config_default(void) {
    cm_streaming_config c;
    memset(&c, 0, sizeof c);
    c.download_retry = 2;
    c.predownload = -1;
    c.sampling_method = "balanced";
    c.sampling_granularity = 1;
    c.partition_algo = "relaxed";
    c.shuffle_algo = "py1e";
    c.shuffle_seed = 9176;
    return c;
}

int64_t cm_streaming_n_fetched(const cm_dataset *ds) { return ((streaming *)cm_dataset_self(ds))->n_fetched; }
int64_t cm_streaming_n_evicted(const cm_dataset *ds) { return ((streaming *)cm_dataset_self(ds))->n_evicted; }

static bool file_size(const char *p, int64_t *sz) {
    struct stat st;
    if (stat(p, &st) != 0) return false;
    *sz = st.st_size;
    return true;
}

static int64_t cache_usage_locked(streaming *s) {
    int64_t total = 0;
    for (int k = 0; k < s->n_streams; k++) total += s->streams[k].ix.index_bytes;
    for (int i = 0; i < s->n_shards; i++) {
        const stream *st = &s->streams[s->shards[i].stream];
        const cmi_mds_shard_info *si = &st->ix.shards[s->shards[i].local];
        char path[4200];
        int64_t sz;
        snprintf(path, sizeof path, "%s/%s", st->dir, si->raw.basename);
        if (file_size(path, &sz)) total += sz;
        if (si->has_zip) {
            snprintf(path, sizeof path, "%s/%s", st->dir, si->zip.basename);
            if (file_size(path, &sz)) total += sz;
        }
    }
    return total;
}

int64_t cm_streaming_cache_usage(const cm_dataset *ds) {
    streaming *s = cm_dataset_self(ds);
    return cache_usage_locked(s);
}

static int lock_file(const char *path) {
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) return -1;
    while (flock(fd, LOCK_EX) != 0)
        if (errno != EINTR) {
            close(fd);
            return -1;
        }
    return fd;
}

static void unlock_file(int fd) {
    if (fd >= 0) {
        flock(fd, LOCK_UN);
        close(fd);
    }
}

/* A shared lock on a shard's lock file while this process maps the shard: the shard cannot be
 * evicted (nor half-written) under it. -1 on failure. */
static int pin_file(const char *path) {
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) return -1;
    while (flock(fd, LOCK_SH) != 0)
        if (errno != EINTR) {
            close(fd);
            return -1;
        }
    return fd;
}

static bool shard_present(const stream *st, const cmi_mds_shard_info *si) {
    char path[4200];
    int64_t sz;
    snprintf(path, sizeof path, "%s/%s", st->dir, si->raw.basename);
    if (file_size(path, &sz)) return true;
    if (!si->has_zip) return false;
    snprintf(path, sizeof path, "%s/%s", st->dir, si->zip.basename);
    return file_size(path, &sz);
}

/* How long make_room waits for shards that other readers hold (fetching or opening them) before
 * it reports the cache full. Those holds last one download or one mmap. */
#define EVICT_WAIT_S 2.0

typedef struct lru_item {
    int shard;
    int64_t mtime_ns;
} lru_item;

static int lru_cmp(const void *a, const void *b) {
    const lru_item *x = a, *y = b;
    return x->mtime_ns < y->mtime_ns ? -1 : x->mtime_ns > y->mtime_ns;
}

/* Evicts shard `v` if no reader holds it: its lock file taken without waiting, then its files
 * removed. Returns 1 when evicted, 0 when held by someone, or -1 with an error. */
static int try_evict(streaming *s, int v) {
    const stream *sm = &s->streams[s->shards[v].stream];
    const cmi_mds_shard_info *si = &sm->ix.shards[s->shards[v].local];
    char raw[4200], zip[4200], lock[4300];
    snprintf(raw, sizeof raw, "%s/%s", sm->dir, si->raw.basename);
    snprintf(lock, sizeof lock, "%s.lock", raw);
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) return cm_set_error(CM_ERR_IO, "cannot open the lock file '%s': %s", lock, strerror(errno)), -1;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        close(fd);
        return 0;
    }
    int rc = 1;
    if (unlink(raw) != 0 && errno != ENOENT)
        rc = -1, cm_set_error(CM_ERR_IO, "cannot evict '%s' from the cache: %s", raw, strerror(errno));
    if (rc > 0 && si->has_zip) {
        snprintf(zip, sizeof zip, "%s/%s", sm->dir, si->zip.basename);
        if (unlink(zip) != 0 && errno != ENOENT)
            rc = -1, cm_set_error(CM_ERR_IO, "cannot evict '%s' from the cache: %s", zip, strerror(errno));
    }
    unlock_file(fd);
    if (rc > 0) {
        pthread_mutex_lock(&s->mu);
        cmi_mds_shard_unref(s->shards[v].open); /* a get holding a reference keeps its mapping */
        s->shards[v].open = NULL;
        s->n_evicted++;
        pthread_mutex_unlock(&s->mu);
    }
    return rc;
}

/* The cache-wide eviction, Streaming's: frees room for `need` bytes by removing the least
 * recently used shards (by the files' mtime, which every open refreshes, so ranks sharing the
 * cache share the clock). Holds the cache lock file. A shard that another reader holds is
 * skipped; if every shard is held, it waits up to EVICT_WAIT_S and then reports the cache full. */
static cm_status make_room(streaming *s, int for_shard, int64_t need) {
    char lp[4200];
    snprintf(lp, sizeof lp, "%s/.cm_cache.lock", s->streams[0].dir);
    int fd = lock_file(lp);
    if (fd < 0) return cm_set_error(CM_ERR_IO, "cannot lock the cache '%s': %s", lp, strerror(errno));
    lru_item *cand = cm_alloc(sizeof *cand * (size_t)(s->n_shards + 1), 64);
    if (!cand) {
        unlock_file(fd);
        return CM_ERR_OOM;
    }
    cm_status st = CM_OK;
    double waited = 0;
    for (;;) {
        const int64_t used = cache_usage_locked(s);
        if (used + need <= s->cfg.cache_limit) break;
        int n = 0;
        for (int i = 0; i < s->n_shards; i++) {
            const stream *sm = &s->streams[s->shards[i].stream];
            const cmi_mds_shard_info *si = &sm->ix.shards[s->shards[i].local];
            if (i == for_shard || !sm->store) continue; /* shards read in place are never evicted */
            char path[4200];
            struct stat stt;
            snprintf(path, sizeof path, "%s/%s", sm->dir, si->raw.basename);
            if (stat(path, &stt) != 0) {
                if (!si->has_zip) continue;
                snprintf(path, sizeof path, "%s/%s", sm->dir, si->zip.basename);
                if (stat(path, &stt) != 0) continue;
            }
            cand[n++] = (lru_item){i, (int64_t)stt.st_mtim.tv_sec * 1000000000 + stt.st_mtim.tv_nsec};
        }
        qsort(cand, (size_t)n, sizeof *cand, lru_cmp);
        int evicted = 0;
        for (int k = 0; k < n && !evicted; k++)
            if ((evicted = try_evict(s, cand[k].shard)) < 0) break;
        if (evicted < 0) {
            st = cm_last_status();
            break;
        }
        if (evicted) continue;
        const stream *fs = &s->streams[s->shards[for_shard].stream];
        const char *name = fs->ix.shards[s->shards[for_shard].local].raw.basename;
        if (n == 0) {
            st = cm_set_error(CM_ERR_IO, "cache '%s' is full: %lld bytes used of cache_limit %lld, %lld more needed "
                                         "for shard '%s', and no shard is left in it to evict (raise cache_limit)",
                              s->streams[0].dir, (long long)used, (long long)s->cfg.cache_limit, (long long)need, name);
            break;
        }
        if (waited >= EVICT_WAIT_S) {
            st = cm_set_error(CM_ERR_IO, "cache '%s' is full: %lld bytes used of cache_limit %lld, %lld more needed "
                                         "for shard '%s', and all %d shards in it are held by readers sharing the "
                                         "cache (waited %.1f s for one to be released; raise cache_limit, or give "
                                         "each rank its own local directory)",
                              s->streams[0].dir, (long long)used, (long long)s->cfg.cache_limit, (long long)need, name,
                              n, waited);
            break;
        }
        struct timespec nap = {0, 20 * 1000000L};
        nanosleep(&nap, NULL);
        waited += 0.02;
    }
    cm_free(cand);
    unlock_file(fd);
    return st;
}

/* Decompresses a compressed shard `zip` into its raw file `raw` (checked against index.json: size,
 * hash, raw size). The caller holds the shard's lock. With remove_zip the compressed file is
 * removed afterwards (keep_zip false), and always when it is corrupt (the next try fetches it
 * anew). */
static cm_status decompress_shard(streaming *s, const cmi_mds_shard_info *si, const char *zip, const char *raw,
                                  bool remove_zip, bool from_remote) {
    int64_t zn = 0;
    if (!file_size(zip, &zn)) return cm_set_error(CM_ERR_NOT_FOUND, "shard '%s' vanished from the cache", zip);
    FILE *f = fopen(zip, "rb");
    uint8_t *z = cm_alloc((size_t)zn + 1, 64), *out = NULL;
    cm_status st = CM_OK;
    if (!z) st = CM_ERR_OOM;
    else if (!f || fread(z, 1, (size_t)zn, f) != (size_t)zn)
        st = cm_set_error(CM_ERR_IO, "cannot read '%s': %s", zip, f ? "short read" : strerror(errno));
    if (f) fclose(f);
    if (!st && zn != si->zip.bytes)
        st = cm_set_error(CM_ERR_FORMAT, "shard '%s' has %lld bytes, index.json says %lld (truncated or corrupt%s)", zip,
                          (long long)zn, (long long)si->zip.bytes,
                          from_remote ? ": the cached copy was removed, the next try fetches it again" : "");
    if (!st && s->validate_hash) st = cmi_mds_check_hash(&si->zip, s->validate_hash, z, (size_t)zn, zip);
    if (!st) st = cmi_mds_decompress(si->zfam, z, (size_t)zn, (size_t)si->raw.bytes, zip, &out);
    cm_free(z);
    if (!st) st = cmi_mds_write_atomic(raw, out, (size_t)si->raw.bytes);
    cm_free(out);
    if (from_remote && (remove_zip || st == CM_ERR_FORMAT)) unlink(zip);
    return st;
}

/* Makes shard i's raw file present in the cache: fetched (compressed form if any, checked and
 * decompressed) under the shard's lock file, so other ranks wait instead of fetching it again. */
static cm_status ensure_local(streaming *s, int i) {
    const stream *sm = &s->streams[s->shards[i].stream];
    const cmi_mds_shard_info *si = &sm->ix.shards[s->shards[i].local];
    char raw[4200], zip[4200] = "", lock[4300];
    snprintf(raw, sizeof raw, "%s/%s", sm->dir, si->raw.basename);
    int64_t sz;
    if (file_size(raw, &sz)) return CM_OK;
    if (si->has_zip) snprintf(zip, sizeof zip, "%s/%s", sm->dir, si->zip.basename);
    if (!sm->store && !(si->has_zip && file_size(zip, &sz))) return CM_OK; /* the load reports the missing file */
    snprintf(lock, sizeof lock, "%s.lock", raw);
    int fd = lock_file(lock);
    if (fd < 0) return cm_set_error(CM_ERR_IO, "cannot lock '%s': %s", lock, strerror(errno));
    cm_status st = CM_OK;
    if (file_size(raw, &sz)) goto done; /* another rank fetched it while we waited */
    if (sm->store) {
        if (s->cfg.cache_limit > 0 && (st = make_room(s, i, s->shards[i].max_size))) goto done;
        if (!si->has_zip || !file_size(zip, &sz)) {
            char rel[4200];
            snprintf(rel, sizeof rel, "%s%s", sm->rel_prefix, si->has_zip ? si->zip.basename : si->raw.basename);
            if ((st = fetch_file(sm->store, rel, si->has_zip ? zip : raw))) goto done;
            __atomic_add_fetch(&s->n_fetched, 1, __ATOMIC_RELAXED);
        }
    }
    if (si->has_zip) st = decompress_shard(s, si, zip, raw, !s->cfg.keep_zip, sm->store != NULL);
done:
    unlock_file(fd);
    return st;
}

/* Opens shard i (fetching it first) and takes a reference. */
static cm_status shard_acquire(streaming *s, int i, cmi_mds_open_shard **out) {
    const stream *sm = &s->streams[s->shards[i].stream];
    const cmi_mds_shard_info *si = &sm->ix.shards[s->shards[i].local];
    char raw[4200], lock[4300];
    snprintf(raw, sizeof raw, "%s/%s", sm->dir, si->raw.basename);
    snprintf(lock, sizeof lock, "%s.lock", raw);
    int64_t sz;
    pthread_mutex_lock(&s->mu);
    cmi_mds_open_shard *sh = s->shards[i].open;
    if (sh && sm->store && !file_size(raw, &sz)) {
        /* another rank evicted the file: drop our mapping (its disk space is freed only once
         * nobody maps it) and fetch it again */
        cmi_mds_shard_unref(sh);
        s->shards[i].open = sh = NULL;
    }
    if (sh) {
        __atomic_add_fetch(&sh->refs, 1, __ATOMIC_ACQ_REL);
        s->shards[i].last_use = ++s->clock;
        pthread_mutex_unlock(&s->mu);
        *out = sh;
        return CM_OK;
    }
    pthread_mutex_unlock(&s->mu);
    cmi_mds_open_shard *fresh = NULL;
    cm_status st = CM_OK;
    for (int tries = 0; !fresh; tries++) {
        if ((st = ensure_local(s, i))) return st;
        /* a cached shard is mapped under a shared lock, so no rank evicts it between the check
         * and the mapping; once mapped, an eviction no longer disturbs this process */
        int pin = -1;
        if (sm->store) {
            if ((pin = pin_file(lock)) < 0) return cm_set_error(CM_ERR_IO, "cannot lock '%s': %s", lock, strerror(errno));
            if (!file_size(raw, &sz)) {
                unlock_file(pin);
                if (tries < 8) continue; /* evicted right after the fetch: fetch it again */
                return cm_set_error(CM_ERR_IO, "shard '%s' was evicted from the cache %d times before it could be "
                                               "opened: the cache is too small for the ranks sharing it (raise "
                                               "cache_limit)", raw, tries + 1);
            }
        }
        st = cmi_mds_shard_load(&sm->ix, s->shards[i].local, sm->dir, s->validate_hash, &fresh);
        if (!st && sm->store) utimensat(AT_FDCWD, raw, NULL, 0); /* the cache's LRU clock */
        if (st == CM_ERR_FORMAT && sm->store) {
            /* a corrupt download is not kept: the next try fetches it anew */
            unlink(raw);
            cm_set_error(st, "%s (shard fetched from %s/%s%s; the cached copy was removed)", cm_last_error(),
                         cm_object_store_uri(sm->store), sm->rel_prefix,
                         si->has_zip ? si->zip.basename : si->raw.basename);
        }
        unlock_file(pin);
        if (st) return st;
    }
    pthread_mutex_lock(&s->mu);
    if (s->shards[i].open) {
        cmi_mds_shard_unref(fresh);
        fresh = s->shards[i].open;
    } else {
        s->shards[i].open = fresh;
    }
    __atomic_add_fetch(&fresh->refs, 1, __ATOMIC_ACQ_REL);
    s->shards[i].last_use = ++s->clock;
    pthread_mutex_unlock(&s->mu);
    *out = fresh;
    return CM_OK;
}

static int locate(const streaming *s, int64_t index, int64_t *local) {
    int lo = 0, hi = s->n_shards - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (s->shards[mid].sample_offset <= index) lo = mid;
        else hi = mid - 1;
    }
    while (lo > 0 && s->shards[lo].samples == 0) lo--;
    *local = index - s->shards[lo].sample_offset;
    return lo;
}

/* ---- cm_dataset_i --------------------------------------------------------------------------- */

static int64_t st_len(void *self) { return ((streaming *)self)->n_samples; }
static int st_nf(void *self) { return ((streaming *)self)->n_fields; }
static const cm_field_desc *st_field(void *self, int i) { return &((streaming *)self)->fields[i].desc; }

static int64_t read_int(const cm_mds_value *v, cm_mds_dtype dt, const uint8_t *p) {
    (void)v;
    switch (dt) {
    case CM_MDS_DT_U8: return p[0];
    case CM_MDS_DT_I8: return (int8_t)p[0];
    case CM_MDS_DT_U16: { uint16_t x; memcpy(&x, p, 2); return x; }
    case CM_MDS_DT_I16: { int16_t x; memcpy(&x, p, 2); return x; }
    case CM_MDS_DT_U32: { uint32_t x; memcpy(&x, p, 4); return x; }
    case CM_MDS_DT_I32: { int32_t x; memcpy(&x, p, 4); return x; }
    default: { int64_t x; memcpy(&x, p, 8); return x; }
    }
}

/* An image value as normalised f32 (C, H, W): decoded to u8 (H, W, C), laid out as (C, H, W),
 * augmented for training (cm_image_augment_draw keyed by the sample id, as cm_dataset_cifar10),
 * then mapped through the per-channel LUT — the steps and arithmetic of the cifar10 and mnist
 * datasets, so the same pixels give the same floats. */
static cm_status image_f32(const streaming *s, cm_mds_kind kind, const cm_mds_value *v, int64_t index,
                           const cm_sample_ctx *ctx, int64_t C, int64_t H, int64_t W, float *out) {
    const size_t n = (size_t)(C * H * W);
    uint8_t small[3 * 3 * 64 * 64], *buf = n * 3 <= sizeof small ? small : cm_alloc(n * 3, 64);
    if (!buf) return CM_ERR_OOM;
    uint8_t *hwc = buf, *chw = buf + n, *aug = buf + 2 * n;
    cm_status st = cm_mds_image_decode(kind, v, H, W, (int)C, hwc);
    if (!st) {
        for (int64_t c = 0; c < C; c++)
            for (int64_t p = 0; p < H * W; p++) chw[c * H * W + p] = hwc[p * C + c];
        const uint8_t *src = chw;
        if (s->img_augment && ctx->training) {
            cm_image_augment_params ap = cm_image_augment_draw(&s->cfg.image_augment, ctx->seed, ctx->epoch, index);
            cm_image_transform_u8(&ap, C, H, W, chw, aug);
            src = aug;
        }
        for (int64_t c = 0; c < C; c++)
            for (int64_t p = 0; p < H * W; p++) out[c * H * W + p] = s->lut[c][src[c * H * W + p]];
    }
    if (buf != small) cm_free(buf);
    return st;
}

static cm_status st_get(void *self, int64_t index, const cm_sample_ctx *ctx, void *const *out) {
    streaming *s = self;
    int64_t local;
    int i = locate(s, index, &local);
    cmi_mds_open_shard *sh = NULL;
    cm_status st = shard_acquire(s, i, &sh);
    if (st) return st;
    cm_mds_sample smp;
    const stream *sm = &s->streams[s->shards[i].stream];
    if ((st = cmi_mds_shard_sample(&sm->ix, sh, local, &smp))) {
        cmi_mds_shard_unref(sh);
        return st;
    }
    for (int f = 0; f < s->n_fields && !st; f++) {
        const field *fd = &s->fields[f];
        const cm_mds_value *v = &smp.values[fd->column];
        const cm_mds_encoding *enc = &sm->ix.columns[fd->column];
        int64_t numel = 1;
        for (int d = 0; d < fd->desc.ndim; d++) numel *= fd->desc.shape[d];
        if (fd->kind == F_IMAGE) {
            if (!s->img_f32) {
                st = cm_mds_image_decode(enc->kind, v, fd->desc.shape[0], fd->desc.shape[1], (int)fd->desc.shape[2], out[f]);
                continue;
            }
            st = image_f32(s, enc->kind, v, index, ctx, fd->desc.shape[0], fd->desc.shape[1], fd->desc.shape[2], out[f]);
            continue;
        }
        if (fd->kind == F_INPUT_IDS || fd->kind == F_LABELS) {
            cm_mds_dtype dt = enc->kind == CM_MDS_BYTES ? CM_MDS_DT_I64 : v->dtype;
            size_t isz = cm_mds_dtype_size(dt);
            int64_t n = (int64_t)(v->size / isz);
            int64_t *o = out[f];
            const int64_t T = s->cfg.max_seq_len;
            for (int64_t t = 0; t < T; t++) {
                int64_t src = fd->kind == F_INPUT_IDS ? t : t + 1;
                o[t] = src < n ? read_int(v, dt, (const uint8_t *)v->data + src * (int64_t)isz) : (fd->kind == F_LABELS ? -100 : 0);
            }
            continue;
        }
        /* numeric: convert element by element into the field's dtype */
        const uint8_t *p = v->data;
        cm_mds_dtype dt = v->dtype;
        size_t isz = cm_mds_dtype_size(dt);
        for (int64_t k = 0; k < numel; k++, p += isz) {
            switch (fd->desc.dtype) {
            case CM_DTYPE_U8: ((uint8_t *)out[f])[k] = p[0]; break;
            case CM_DTYPE_F16: memcpy((uint16_t *)out[f] + k, p, 2); break;
            case CM_DTYPE_F32:
                if (dt == CM_MDS_DT_F64) {
                    double x;
                    memcpy(&x, p, 8);
                    ((float *)out[f])[k] = (float)x;
                } else {
                    memcpy((float *)out[f] + k, p, 4);
                }
                break;
            case CM_DTYPE_I32: ((int32_t *)out[f])[k] = (int32_t)read_int(v, dt, p); break;
            default: {
                int64_t x = read_int(v, dt, p);
                if (dt == CM_MDS_DT_U64 && x < 0)
                    st = cm_set_error(CM_ERR_FORMAT, "shard '%s', sample %lld: uint64 value of column '%s' does not fit "
                                                     "int64", sh->path, (long long)local, fd->name);
                ((int64_t *)out[f])[k] = x;
            }
            }
        }
    }
    cmi_mds_shard_unref(sh);
    return st;
}

static int64_t st_tokens(void *self, int64_t index) {
    (void)index;
    streaming *s = self;
    return s->cfg.max_seq_len > 0 ? s->cfg.max_seq_len : 0;
}

static void plan_free(plan *p) {
    cm_free(p->ids);
    memset(p, 0, sizeof *p);
}

static void st_close(void *self) {
    streaming *s = self;
    if (s->pf_running) {
        pthread_mutex_lock(&s->mu);
        s->pf_stop = true;
        pthread_cond_broadcast(&s->pf_cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->pf_thread, NULL);
    }
    for (int i = 0; i < s->n_shards; i++) cmi_mds_shard_unref(s->shards[i].open);
    cm_free(s->shards);
    for (int k = 0; k < s->n_streams; k++) {
        cmi_mds_index_free(&s->streams[k].ix);
        cm_free(s->streams[k].remote);
        cm_free(s->streams[k].dir);
        cm_free(s->streams[k].rel_prefix);
        cm_object_store_close(s->streams[k].store);
    }
    plan_free(&s->plan);
    cm_free(s->validate_hash);
    cm_free(s->shuffle_algo);
    cm_free(s->partition_algo);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->pf_cv);
    cm_free(s);
}

static const cm_dataset_i k_streaming_vt = {
    .abi = CM_DATASET_ABI,
    .type_name = "streaming",
    .len = st_len,
    .n_fields = st_nf,
    .field = st_field,
    .get = st_get,
    .n_tokens = st_tokens,
    .close = st_close,
};

/* ---- the epoch (generate_work_random_batching) ---------------------------------------------- */

/* sampling.py get_sampling */
static cm_status get_sampling(const int64_t *sizes, int64_t n, int64_t choose, int64_t gran, uint64_t seed, int64_t epoch,
                              bool use_epoch, int64_t *out) {
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) total += sizes[i];
    if (total == 0) {
        for (int64_t i = 0; i < n; i++) out[i] = 0;
        return CM_OK;
    }
    if (choose % total == 0) {
        for (int64_t i = 0; i < n; i++) out[i] = sizes[i] * choose / total;
        return CM_OK;
    }
    int64_t n_picks = 0;
    for (int64_t i = 0; i < n; i++) n_picks += (sizes[i] + gran - 1) / gran;
    int64_t *pick_shard = cm_alloc(sizeof(int64_t) * (size_t)(n_picks + 1), 64);
    int64_t *pick_size = cm_alloc(sizeof(int64_t) * (size_t)(n_picks + 1), 64);
    int64_t *order = cm_alloc(sizeof(int64_t) * (size_t)(n_picks + 1), 64);
    if (!pick_shard || !pick_size || !order) {
        cm_free(pick_shard);
        cm_free(pick_size);
        cm_free(order);
        return CM_ERR_OOM;
    }
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t picks = (sizes[i] + gran - 1) / gran;
        for (int64_t j = 0; j < picks; j++, k++) {
            pick_shard[k] = i;
            pick_size[k] = j == picks - 1 ? sizes[i] - (picks - 1) * gran : gran;
        }
    }
    cmi_pcg64 g;
    unsigned __int128 es = (unsigned __int128)seed + (use_epoch ? (uint64_t)epoch : 0);
    cmi_pcg64_seed(&g, (uint64_t)es, (uint64_t)(es >> 64));
    for (int64_t i = 0; i < n_picks; i++) order[i] = i;
    cmi_pcg64_shuffle(&g, order, n_picks);
    for (int64_t i = 0; i < n; i++) out[i] = sizes[i] * (choose / total);
    choose %= total;
    for (int64_t i = 0; i < n_picks && choose; i++) {
        int64_t take = pick_size[order[i]] < choose ? pick_size[order[i]] : choose;
        out[pick_shard[order[i]]] += take;
        choose -= take;
    }
    cm_free(pick_shard);
    cm_free(pick_size);
    cm_free(order);
    return CM_OK;
}

/* resample_streams: shuffle units and the big -> small sample map. */
static cm_status resample(streaming *s, int64_t epoch, int64_t **units, int64_t *n_units, int64_t **small) {
    cmi_pcg64 rng;
    unsigned __int128 es = (unsigned __int128)s->cfg.shuffle_seed + (s->fixed_sampling ? 0 : (uint64_t)epoch);
    cmi_pcg64_seed(&rng, (uint64_t)es, (uint64_t)(es >> 64));
    cmi_buf ub = {0}, sb = {0};
    cm_status st = CM_OK;
    int64_t *choose = cm_alloc(sizeof(int64_t) * (size_t)s->n_shards, 64), *sizes = cm_alloc(sizeof(int64_t) * (size_t)s->n_shards, 64);
    if (!choose || !sizes) {
        st = CM_ERR_OOM;
        goto done;
    }
    for (int k = 0; k < s->n_streams; k++) {
        const stream *sm = &s->streams[k];
        int64_t ns = sm->ix.n_shards;
        for (int64_t j = 0; j < ns; j++) sizes[j] = sm->ix.shards[j].samples;
        if ((st = get_sampling(sizes, ns, sm->choose, s->cfg.sampling_granularity, s->cfg.shuffle_seed, epoch,
                               s->cfg.shuffle && !s->fixed_sampling, choose)))
            goto done;
        for (int64_t j = 0; j < ns; j++) {
            const int64_t size = sizes[j], ch = choose[j], off = sm->sample_base + sm->ix.shards[j].sample_offset;
            if (size == 0) continue;
            for (int64_t r = 0; r < ch / size; r++) cmi_buf_put(&ub, &size, 8);
            int64_t rem = ch % size;
            if (rem) cmi_buf_put(&ub, &rem, 8);
            for (int64_t r = 0; r < ch / size; r++)
                for (int64_t x = 0; x < size; x++) {
                    int64_t id = off + x;
                    cmi_buf_put(&sb, &id, 8);
                }
            if (rem) {
                int64_t *pick = cm_alloc(sizeof(int64_t) * (size_t)rem, 64);
                if (!pick) {
                    st = CM_ERR_OOM;
                    goto done;
                }
                if ((st = cmi_pcg64_choice(&rng, size, rem, pick))) {
                    cm_free(pick);
                    goto done;
                }
                /* sorted, as the Python sorts the partial repeat */
                for (int64_t a = 1; a < rem; a++)
                    for (int64_t b = a; b > 0 && pick[b - 1] > pick[b]; b--) {
                        int64_t t = pick[b];
                        pick[b] = pick[b - 1];
                        pick[b - 1] = t;
                    }
                for (int64_t x = 0; x < rem; x++) {
                    int64_t id = off + pick[x];
                    cmi_buf_put(&sb, &id, 8);
                }
                cm_free(pick);
            }
        }
    }
    if (ub.oom || sb.oom) st = CM_ERR_OOM;
done:
    cm_free(choose);
    cm_free(sizes);
    if (st) {
        cmi_buf_free(&ub);
        cmi_buf_free(&sb);
        return st;
    }
    *units = (int64_t *)ub.p;
    *n_units = (int64_t)(ub.n / 8);
    *small = (int64_t *)sb.p;
    return CM_OK;
}

/* The epoch's ids for every rank, Streaming's generate_work_random_batching with drop_first. */
static cm_status build_plan(streaming *s, int64_t epoch, int64_t drop, plan *p) {
    int64_t *units = NULL, n_units = 0, *small = NULL, *part = NULL, *shuf = NULL, shape[5];
    cm_status st = resample(s, epoch, &units, &n_units, &small);
    if (st) return st;
    const int64_t ncn = s->cfg.num_canonical_nodes;
    if ((st = cm_streaming_partition(s->partition_algo, s->epoch_size, ncn, s->P, s->R, 1, s->cfg.batch_size, drop,
                                     s->cfg.initial_physical_nodes, &part, shape)))
        goto done;
    if (s->cfg.shuffle) {
        shuf = cm_alloc(sizeof(int64_t) * (size_t)(s->epoch_size + 1), 64);
        if (!shuf) {
            st = CM_ERR_OOM;
            goto done;
        }
        if ((st = cm_streaming_shuffle(s->shuffle_algo, units, n_units, ncn, s->cfg.shuffle_seed, epoch,
                                       s->cfg.shuffle_block_size, shuf)))
            goto done;
    }
    const int64_t total = shape[0] * shape[1] * shape[2] * shape[3] * shape[4];
    for (int64_t k = 0; k < total; k++)
        if (part[k] >= 0) part[k] = small[shuf ? shuf[part[k]] : part[k]];
    plan_free(p);
    p->valid = true;
    p->epoch = epoch;
    p->drop = drop;
    p->nb = shape[3];
    p->ids = part; /* (P, R, 1, nb, B) = (world, nb * B) with global rank = node * R + rank of node */
    part = NULL;
done:
    cm_free(units);
    cm_free(small);
    cm_free(part);
    cm_free(shuf);
    return st;
}

static void pf_kick(streaming *s, int64_t epoch, int64_t from) {
    s->pf_epoch = epoch;
    s->pf_from = from;
    s->pf_gen++;
    pthread_cond_broadcast(&s->pf_cv);
}

static cm_status st_batch_order(void *self, int64_t epoch, int64_t position, int64_t global_batch, int rank,
                                int world_size, int64_t *ids, int64_t *n_rank, int64_t *n_global) {
    streaming *s = self;
    const int64_t B = s->cfg.batch_size;
    if (world_size != s->world || global_batch != B * world_size)
        return cm_set_error(CM_ERR_INVALID_ARG, "streaming dataset: made for batch_size %lld on %d ranks (a global batch "
                                                "of %lld), but the loader asks for %lld on %d ranks",
                            (long long)B, s->world, (long long)(B * s->world), (long long)global_batch, world_size);
    pthread_mutex_lock(&s->mu);
    plan *p = &s->plan;
    cm_status st = CM_OK;
    const int64_t G = global_batch;
    if (!p->valid || p->epoch != epoch || position < p->drop || (position - p->drop) % G != 0) {
        /* a real resumption point (or a new epoch): Streaming's partition with drop_first */
        plan np = {0};
        pthread_mutex_unlock(&s->mu);
        st = build_plan(s, epoch, position, &np);
        pthread_mutex_lock(&s->mu);
        if (st) {
            pthread_mutex_unlock(&s->mu);
            return st;
        }
        plan_free(p);
        *p = np;
    }
    const int64_t k = (position - p->drop) / G;
    *n_rank = 0;
    *n_global = 0;
    if (k < p->nb) {
        for (int r = 0; r < s->world; r++) {
            const int64_t *row = p->ids + ((int64_t)r * p->nb + k) * B;
            for (int64_t j = 0; j < B; j++) {
                if (row[j] < 0) continue;
                (*n_global)++;
                if (r == rank) ids[(*n_rank)++] = row[j];
            }
        }
    }
    if (rank == s->rank) pf_kick(s, epoch, k * B);
    pthread_mutex_unlock(&s->mu);
    return CM_OK;
}

static int64_t st_epoch_size(void *self, int64_t global_batch, int world_size) {
    streaming *s = self;
    if (s->epoch0_size >= 0 && s->epoch0_global == global_batch) return s->epoch0_size;
    plan p = {0};
    if (world_size != s->world || global_batch != s->cfg.batch_size * world_size) {
        cm_set_error(CM_ERR_INVALID_ARG, "streaming dataset: made for batch_size %lld per device on %d ranks (a global "
                                         "batch of %lld); the loader has a global batch of %lld on %d ranks",
                     (long long)s->cfg.batch_size, s->world, (long long)(s->cfg.batch_size * s->world),
                     (long long)global_batch, world_size);
        return -1;
    }
    if (build_plan(s, 0, 0, &p) != CM_OK) return -1;
    int64_t n = 0;
    for (int64_t k = 0; k < (int64_t)s->world * p.nb * s->cfg.batch_size; k++) n += p.ids[k] >= 0;
    plan_free(&p);
    s->epoch0_size = n;
    s->epoch0_global = global_batch;
    return n;
}

static const cm_dataset_order_i k_streaming_order = {st_batch_order, st_epoch_size};

/* Fetches the shards of this rank's next `predownload` samples ahead of the loader. */
static void *prefetch_main(void *arg) {
    streaming *s = arg;
    pthread_mutex_lock(&s->mu);
    uint64_t seen = 0;
    while (!s->pf_stop) {
        if (seen == s->pf_gen || !s->plan.valid) {
            pthread_cond_wait(&s->pf_cv, &s->mu);
            continue;
        }
        seen = s->pf_gen;
        const int64_t B = s->cfg.batch_size, len = s->plan.nb * B;
        const int64_t from = s->pf_from, to = from + s->cfg.predownload < len ? from + s->cfg.predownload : len;
        int64_t *mine = cm_alloc(sizeof(int64_t) * (size_t)(to - from + 1), 64);
        if (!mine) continue;
        memcpy(mine, s->plan.ids + (int64_t)s->rank * len + from, sizeof(int64_t) * (size_t)(to - from));
        pthread_mutex_unlock(&s->mu);
        int last = -1;
        for (int64_t k = 0; k < to - from && !s->pf_stop; k++) {
            if (mine[k] < 0) continue;
            int64_t local;
            int i = locate(s, mine[k], &local);
            if (i == last) continue;
            last = i;
            const stream *sm = &s->streams[s->shards[i].stream];
            if (!shard_present(sm, &sm->ix.shards[s->shards[i].local])) ensure_local(s, i); /* errors: get() reports them */
        }
        cm_free(mine);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- construction ------------------------------------------------------------------------- */

static cm_status load_stream(streaming *s, stream *sm, const char *remote, const char *local, const char *split) {
    if (!local && !remote)
        return cm_set_error(CM_ERR_INVALID_ARG, "streaming dataset: a stream needs remote and/or local (local: the cache "
                                                "directory; remote: where the shards are)");
    char tmp_local[4200];
    if (remote && !strncmp(remote, "file://", 7) && (!local || !strcmp(remote + 7, local))) {
        local = remote + 7; /* a local dataset read in place */
        remote = NULL;
    }
    if (!local && cm_storage_is_remote(remote)) {
        /* Streaming's default: a temporary directory of the remote's own */
        const char *t = getenv("TMPDIR");
        snprintf(tmp_local, sizeof tmp_local, "%s/composer-streaming/%016llx", t && *t ? t : "/tmp",
                 (unsigned long long)cm_hash64(remote, strlen(remote), 0));
        local = tmp_local;
    }
    if (!local) local = remote; /* a local dataset read in place */
    if (remote && strcmp(remote, local) == 0) remote = NULL;
    sm->dir = split && *split ? cmi_mds_path2(local, split) : cmi_mds_strdup(local);
    sm->remote = remote ? cmi_mds_strdup(remote) : NULL;
    char pre[1024];
    snprintf(pre, sizeof pre, "%s%s", split && *split ? split : "", split && *split ? "/" : "");
    sm->rel_prefix = cmi_mds_strdup(pre);
    if (!sm->dir || !sm->rel_prefix || (remote && !sm->remote)) return CM_ERR_OOM;
    cm_status st;
    if (remote) {
        /* download_retry as Streaming's: retries of a failed download (transient failures, with
         * the store's backoff); CM_STORAGE_MAX_RETRIES, when set, rules every store */
        cm_object_store_config oc = cm_object_store_config_default();
        const char *e = getenv("CM_STORAGE_MAX_RETRIES");
        if (!(e && *e)) oc.max_retries = s->cfg.download_retry;
        if ((st = cm_object_store_open(remote, &oc, &sm->store)))
            return cm_set_error(st, "streaming dataset: remote '%s': %s", remote, cm_last_error());
    }
    char ip[4200], rel[1100];
    snprintf(ip, sizeof ip, "%s/index.json", sm->dir);
    int64_t sz = 0;
    if (sm->store && !file_size(ip, &sz)) {
        if ((st = cmi_mds_mkdir_p(sm->dir))) return st;
        snprintf(rel, sizeof rel, "%sindex.json", sm->rel_prefix);
        if ((st = fetch_file(sm->store, rel, ip)))
            return cm_set_error(st, "streaming dataset: no index.json from the remote: %s (check remote and split)",
                                cm_last_error());
    }
    uint8_t *text;
    FILE *f = fopen(ip, "rb");
    if (!f)
        return cm_set_error(CM_ERR_NOT_FOUND, "no MDS dataset at '%s' (index.json is missing: check local, remote and "
                                              "split)", ip);
    file_size(ip, &sz);
    text = cm_alloc((size_t)sz + 1, 16);
    size_t got = text ? fread(text, 1, (size_t)sz, f) : 0;
    fclose(f);
    if (!text) return CM_ERR_OOM;
    if ((int64_t)got != sz) {
        cm_free(text);
        return cm_set_error(CM_ERR_IO, "cannot read '%s'", ip);
    }
    st = cmi_mds_index_parse((const char *)text, (size_t)sz, ip, &sm->ix);
    cm_free(text);
    return st;
}

static bool numeric_dtype(cm_mds_dtype dt, cm_dtype *out) {
    switch (dt) {
    case CM_MDS_DT_U8: *out = CM_DTYPE_U8; return true;
    case CM_MDS_DT_F16: *out = CM_DTYPE_F16; return true;
    case CM_MDS_DT_F32:
    case CM_MDS_DT_F64: *out = CM_DTYPE_F32; return true;
    case CM_MDS_DT_I8:
    case CM_MDS_DT_I16:
    case CM_MDS_DT_U16:
    case CM_MDS_DT_I32: *out = CM_DTYPE_I32; return true;
    case CM_MDS_DT_U32:
    case CM_MDS_DT_I64:
    case CM_MDS_DT_U64: *out = CM_DTYPE_I64; return true;
    default: return false;
    }
}

static cm_status build_fields(streaming *s) {
    const cmi_mds_index *ix = &s->streams[0].ix;
    s->tokens_col = -1;
    for (int c = 0; c < ix->n_columns; c++) {
        const cm_mds_encoding *e = &ix->columns[c];
        field *fd = &s->fields[s->n_fields];
        if (s->cfg.max_seq_len > 0 && strcmp(ix->column_names[c], "tokens") == 0) {
            if (!(e->kind == CM_MDS_BYTES || (e->kind == CM_MDS_NDARRAY && e->dtype != CM_MDS_DT_F16 && e->dtype != CM_MDS_DT_F32 && e->dtype != CM_MDS_DT_F64)))
                return cm_set_error(CM_ERR_INVALID_ARG, "%s: column 'tokens' is %s; max_seq_len needs an integer ndarray "
                                                        "or bytes of int64 tokens", ix->path, ix->column_enc_text[c]);
            if (s->n_fields + 2 > CM_DATASET_MAX_FIELDS) break;
            for (int k = 0; k < 2; k++) {
                fd = &s->fields[s->n_fields++];
                snprintf(fd->name, sizeof fd->name, "%s", k ? "labels" : "input_ids");
                fd->kind = k ? F_LABELS : F_INPUT_IDS;
                fd->column = c;
                fd->desc = (cm_field_desc){fd->name, CM_DTYPE_I64, 1, {s->cfg.max_seq_len}};
            }
            s->tokens_col = c;
            continue;
        }
        if ((e->kind == CM_MDS_PIL || e->kind == CM_MDS_PNG || e->kind == CM_MDS_JPEG) && s->cfg.image_h > 0) {
            if (s->n_fields == CM_DATASET_MAX_FIELDS) break;
            snprintf(fd->name, sizeof fd->name, "%s", ix->column_names[c]);
            fd->kind = F_IMAGE;
            fd->column = c;
            const int64_t H = s->cfg.image_h, W = s->cfg.image_w, C = s->cfg.image_c;
            fd->desc = s->img_f32 ? (cm_field_desc){fd->name, CM_DTYPE_F32, 3, {C, H, W}}
                                  : (cm_field_desc){fd->name, CM_DTYPE_U8, 3, {H, W, C}};
            s->n_fields++;
            continue;
        }
        cm_dtype dt;
        if (e->size < 0 || !numeric_dtype(e->dtype, &dt)) continue; /* str, json, images without a size, ... */
        if (s->n_fields == CM_DATASET_MAX_FIELDS) break;
        snprintf(fd->name, sizeof fd->name, "%s", ix->column_names[c]);
        fd->kind = F_NUMERIC;
        fd->column = c;
        fd->desc.name = fd->name;
        fd->desc.dtype = dt;
        fd->desc.ndim = e->kind == CM_MDS_NDARRAY ? e->ndim : 0;
        if (fd->desc.ndim > CM_MAX_DIMS - 1)
            return cm_set_error(CM_ERR_UNSUPPORTED, "%s: column '%s' has %d dims", ix->path, fd->name, fd->desc.ndim);
        for (int d = 0; d < fd->desc.ndim; d++) fd->desc.shape[d] = e->shape[d];
        s->n_fields++;
    }
    if (s->n_fields == 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: no column of this dataset becomes a tensor field (fixed-size numeric "
                                                "columns do; set max_seq_len for a 'tokens' column, image_h/w/c for "
                                                "images)", ix->path);
    return CM_OK;
}

/* The field names of `renames` (checked: each names a column that became one field; the new
 * names are unique). */
static cm_status apply_renames(streaming *s, const cm_streaming_rename *rn, int n) {
    const cmi_mds_index *ix = &s->streams[0].ix;
    char have[512] = "";
    for (int f = 0; f < s->n_fields; f++)
        if (s->fields[f].kind == F_NUMERIC || s->fields[f].kind == F_IMAGE)
            snprintf(have + strlen(have), sizeof have - strlen(have), "%s%s", *have ? ", " : "",
                     ix->column_names[s->fields[f].column]);
    for (int k = 0; k < n; k++) {
        if (!rn[k].column || !rn[k].field || !rn[k].field[0] || strlen(rn[k].field) >= sizeof s->fields[0].name)
            return cm_set_error(CM_ERR_INVALID_ARG, "streaming dataset: renames[%d] needs a column and a field name of "
                                                    "1 to %zu characters", k, sizeof s->fields[0].name - 1);
        int hit = -1;
        for (int f = 0; f < s->n_fields && hit < 0; f++)
            if ((s->fields[f].kind == F_NUMERIC || s->fields[f].kind == F_IMAGE) &&
                !strcmp(ix->column_names[s->fields[f].column], rn[k].column))
                hit = f;
        if (hit < 0)
            return cm_set_error(CM_ERR_INVALID_ARG, "streaming dataset: cannot rename column '%s': it is not a field of "
                                                    "%s (columns that are: %s)", rn[k].column, ix->path, have);
        snprintf(s->fields[hit].name, sizeof s->fields[hit].name, "%s", rn[k].field);
    }
    for (int a = 0; a < s->n_fields; a++)
        for (int b = a + 1; b < s->n_fields; b++)
            if (!strcmp(s->fields[a].name, s->fields[b].name))
                return cm_set_error(CM_ERR_INVALID_ARG, "streaming dataset: two fields would be called '%s' (check "
                                                        "renames)", s->fields[a].name);
    return CM_OK;
}

/* image_c, image_mean/std and image_augment: checked, and the normalisation tables built. */
static cm_status setup_images(streaming *s) {
    const cm_streaming_config *c = &s->cfg;
    if (c->image_h <= 0 && c->image_w <= 0 && c->image_c <= 0) {
        if (c->image_std[0] != 0 || cm_image_augment_enabled(&c->image_augment))
            return cm_set_error(CM_ERR_INVALID_ARG, "streaming dataset: image_std / image_augment need image_h, image_w "
                                                    "and image_c");
        return CM_OK;
    }
    if (c->image_h <= 0 || c->image_w <= 0 || (c->image_c != 1 && c->image_c != 3))
        return cm_set_error(CM_ERR_INVALID_ARG, "streaming dataset: image_h %lld, image_w %lld, image_c %lld (sizes >= 1; "
                                                "image_c 1 or 3)", (long long)c->image_h, (long long)c->image_w,
                            (long long)c->image_c);
    cm_status st = cm_image_augment_check(&c->image_augment, "streaming dataset: image_augment");
    if (st) return st;
    s->img_f32 = c->image_std[0] != 0;
    s->img_augment = cm_image_augment_enabled(&c->image_augment);
    if (s->img_augment && !s->img_f32)
        return cm_set_error(CM_ERR_INVALID_ARG, "streaming dataset: image_augment works on normalised images: set "
                                                "image_mean and image_std too");
    for (int k = 0; s->img_f32 && k < c->image_c; k++) {
        if (!(c->image_std[k] > 0))
            return cm_set_error(CM_ERR_INVALID_ARG, "streaming dataset: image_std[%d] %g must be > 0 (one per channel, "
                                                    "image_c of them)", k, (double)c->image_std[k]);
        cm_image_make_lut(s->lut[k], c->image_mean[k], c->image_std[k]);
    }
    return CM_OK;
}

/* stream.py Stream.apply_weights */
static cm_status apply_weights(streaming *s) {
    const int n = s->n_streams;
    bool relative = s->streams[0].has_prop, unspecified = true;
    for (int k = 0; k < n; k++) {
        const stream *sm = &s->streams[k];
        if (sm->has_prop + sm->has_rep + sm->has_choose > 1)
            return cm_set_error(CM_ERR_INVALID_ARG, "streams[%d]: give at most one of proportion, repeat and choose", k);
        if (relative != sm->has_prop)
            return cm_set_error(CM_ERR_INVALID_ARG, "streams[%d]: relative (proportion) and absolute (repeat, choose, "
                                                    "none) stream weights cannot be mixed", k);
        if (sm->has_prop || sm->has_rep || sm->has_choose) unspecified = false;
    }
    int64_t epoch_size = s->cfg.epoch_size;
    if (relative || (unspecified && epoch_size > 0)) {
        if (!epoch_size)
            for (int k = 0; k < n; k++) epoch_size += s->streams[k].ix.n_samples;
        double props[CM_STREAMING_MAX_STREAMS], total = 0;
        for (int k = 0; k < n; k++) total += (props[k] = relative ? s->streams[k].proportion : (double)s->streams[k].ix.n_samples);
        int64_t sum = 0;
        for (int k = 0; k < n; k++) {
            s->streams[k].choose = (int64_t)((double)epoch_size * (props[k] / total));
            sum += s->streams[k].choose;
        }
        int64_t shortfall = epoch_size - sum;
        if (shortfall > 0) {
            cmi_pcg64 g;
            cmi_pcg64_seed(&g, s->cfg.shuffle_seed, 0);
            int64_t idx[CM_STREAMING_MAX_STREAMS];
            cm_status st = cmi_pcg64_choice(&g, n, shortfall, idx);
            if (st) return st;
            for (int64_t k = 0; k < shortfall; k++) s->streams[idx[k]].choose++;
        }
    } else {
        if (epoch_size > 0)
            return cm_set_error(CM_ERR_INVALID_ARG, "epoch_size: only give it when weighting streams relatively "
                                                    "(proportion) or not at all");
        for (int k = 0; k < n; k++) {
            stream *sm = &s->streams[k];
            if (sm->has_rep) sm->choose = (int64_t)(sm->repeat * (double)sm->ix.n_samples);
            else if (!sm->has_choose) sm->choose = sm->ix.n_samples;
        }
    }
    s->epoch_size = 0;
    for (int k = 0; k < n; k++) s->epoch_size += s->streams[k].choose;
    return CM_OK;
}

cm_status cm_dataset_streaming_new(const cm_streaming_config *cfg, int rank, int world_size, cm_dataset **out) {
    *out = NULL;
    cm_streaming_config c = cfg ? *cfg : cm_streaming_config_default();
    if (c.batch_size < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "streaming dataset: batch_size %lld (the per-device batch, as "
                                                "Streaming's batch_size, must be >= 1)", (long long)c.batch_size);
    if (world_size < 1 || rank < 0 || rank >= world_size)
        return cm_set_error(CM_ERR_INVALID_ARG, "streaming dataset: rank %d of %d", rank, world_size);
    if (c.n_streams < 0 || c.n_streams > CM_STREAMING_MAX_STREAMS || (c.n_streams > 0 && !c.streams))
        return cm_set_error(CM_ERR_INVALID_ARG, "streaming dataset: %d streams (1..%d)", c.n_streams, CM_STREAMING_MAX_STREAMS);
    if (cmi_shuffle_algo(c.shuffle_algo) < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "shuffle_algo '%s' is not one of Streaming's (py1e, py1br, py1s, py2s, "
                                                "naive, py1b)", c.shuffle_algo ? c.shuffle_algo : "(null)");
    if (!c.partition_algo || (strcmp(c.partition_algo, "relaxed") && strcmp(c.partition_algo, "orig")))
        return cm_set_error(CM_ERR_INVALID_ARG, "partition_algo '%s' is not one of Streaming's (relaxed, orig)",
                            c.partition_algo ? c.partition_algo : "(null)");
    if (!c.sampling_method || (strcmp(c.sampling_method, "balanced") && strcmp(c.sampling_method, "fixed")))
        return cm_set_error(CM_ERR_INVALID_ARG, "sampling_method '%s' (use balanced or fixed)",
                            c.sampling_method ? c.sampling_method : "(null)");
    if (c.sampling_granularity < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "sampling_granularity %lld must be >= 1", (long long)c.sampling_granularity);
    if (c.validate_hash && *c.validate_hash && !cmi_mds_hash_known(c.validate_hash))
        return cm_set_error(CM_ERR_INVALID_ARG, "validate_hash '%s' is not a hash Streaming names (use one of %s)",
                            c.validate_hash, cmi_mds_hash_names());
    streaming *s = cm_alloc_zeroed(sizeof *s, 64);
    if (!s) return CM_ERR_OOM;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->pf_cv, NULL);
    s->epoch0_size = -1;
    s->rank = rank;
    s->world = world_size;
    int rpn = c.ranks_per_node;
    if (rpn <= 0) {
        const char *e = getenv("LOCAL_WORLD_SIZE");
        if (!e) e = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
        rpn = e ? atoi(e) : world_size;
        if (rpn <= 0 || world_size % rpn) rpn = world_size;
    }
    cm_status st = CM_OK;
    if (world_size % rpn) {
        st = cm_set_error(CM_ERR_INVALID_ARG, "streaming dataset: ranks_per_node %d does not divide world_size %d", rpn, world_size);
        goto fail;
    }
    s->R = rpn;
    s->P = world_size / rpn;
    if (!c.num_canonical_nodes) {
        c.num_canonical_nodes = (!strcmp(c.shuffle_algo, "py1s") || !strcmp(c.shuffle_algo, "py2s")) ? 64 * (int64_t)s->P : s->P;
        if (c.initial_physical_nodes > 0 && strcmp(c.shuffle_algo, "py1s") && strcmp(c.shuffle_algo, "py2s"))
            c.num_canonical_nodes = c.initial_physical_nodes;
    }
    if (!c.shuffle_block_size) {
        c.shuffle_block_size = 4000000 / c.num_canonical_nodes;
        if (c.shuffle_block_size < (1 << 18)) c.shuffle_block_size = 1 << 18;
    }
    if (c.predownload < 0) c.predownload = 8 * c.batch_size;
    s->validate_hash = c.validate_hash && *c.validate_hash ? cmi_mds_strdup(c.validate_hash) : NULL;
    s->shuffle_algo = cmi_mds_strdup(c.shuffle_algo);
    s->partition_algo = cmi_mds_strdup(c.partition_algo);
    s->fixed_sampling = strcmp(c.sampling_method, "fixed") == 0;
    c.validate_hash = s->validate_hash;
    c.shuffle_algo = s->shuffle_algo;
    c.partition_algo = s->partition_algo;
    c.sampling_method = s->fixed_sampling ? "fixed" : "balanced";
    c.streams = NULL;
    c.renames = NULL; /* read once, while the fields are named */
    c.n_renames = 0;
    s->cfg = c;
    if (!s->shuffle_algo || !s->partition_algo) {
        st = CM_ERR_OOM;
        goto fail;
    }
    s->n_streams = cfg && cfg->n_streams > 0 ? cfg->n_streams : 1;
    for (int k = 0; k < s->n_streams; k++) {
        stream *sm = &s->streams[k];
        const cm_stream_config *sc = cfg && cfg->n_streams > 0 ? &cfg->streams[k] : NULL;
        const char *remote = sc && sc->remote ? sc->remote : c.remote;
        const char *local = sc && sc->local ? sc->local : c.local;
        const char *split = sc && sc->split ? sc->split : c.split;
        if (sc && sc->local == NULL && c.local && cfg->n_streams > 1) {
            st = cm_set_error(CM_ERR_INVALID_ARG, "streams[%d]: each stream needs its own local directory", k);
            goto fail;
        }
        if ((st = load_stream(s, sm, remote, local, split))) goto fail;
        if (sc) {
            sm->has_prop = sc->proportion >= 0;
            sm->has_rep = sc->repeat >= 0;
            sm->has_choose = sc->choose >= 0;
            sm->proportion = sc->proportion;
            sm->repeat = sc->repeat;
            sm->choose = sc->choose;
        }
        if (sm->ix.n_samples == 0) {
            st = cm_set_error(CM_ERR_INVALID_ARG, "Stream contains no samples: %s", sm->ix.path);
            goto fail;
        }
        if (k > 0) {
            const cmi_mds_index *a = &s->streams[0].ix, *b = &sm->ix;
            bool same = a->n_columns == b->n_columns;
            for (int col = 0; same && col < a->n_columns; col++)
                same = !strcmp(a->column_names[col], b->column_names[col]) && !strcmp(a->column_enc_text[col], b->column_enc_text[col]);
            if (!same) {
                st = cm_set_error(CM_ERR_INVALID_ARG, "streams[%d] (%s) has other columns than streams[0] (%s)", k, b->path, a->path);
                goto fail;
            }
        }
        for (int col = 0; col < sm->ix.n_columns; col++)
            if (sm->ix.columns[col].kind == CM_MDS_PKL && !c.allow_unsafe_types) {
                st = cm_set_error(CM_ERR_INVALID_ARG, "%s: column '%s' contains an unsafe type: pkl (set "
                                                      "allow_unsafe_types to proceed anyway)", sm->ix.path, sm->ix.column_names[col]);
                goto fail;
            }
        sm->shard_base = s->n_shards;
        sm->sample_base = s->n_samples;
        s->n_shards += sm->ix.n_shards;
        s->n_samples += sm->ix.n_samples;
    }
    if (!(s->shards = cm_alloc_zeroed(sizeof *s->shards * (size_t)s->n_shards, 64))) {
        st = CM_ERR_OOM;
        goto fail;
    }
    int64_t max_shard = 0, index_bytes = 0;
    for (int k = 0; k < s->n_streams; k++) {
        stream *sm = &s->streams[k];
        index_bytes += sm->ix.index_bytes;
        for (int j = 0; j < sm->ix.n_shards; j++) {
            shard_ref *r = &s->shards[sm->shard_base + j];
            r->stream = k;
            r->local = j;
            r->samples = sm->ix.shards[j].samples;
            r->sample_offset = sm->sample_base + sm->ix.shards[j].sample_offset;
            r->max_size = sm->ix.shards[j].raw.bytes + (sm->ix.shards[j].has_zip ? sm->ix.shards[j].zip.bytes : 0);
            if (r->max_size > max_shard) max_shard = r->max_size;
        }
        if (s->validate_hash)
            for (int j = 0; j < sm->ix.n_shards; j++)
                if (!cmi_mds_file_hash(&sm->ix.shards[j].raw, s->validate_hash)) {
                    st = cm_set_error(CM_ERR_INVALID_ARG, "Hash algorithm `%s` chosen for data validation does not match "
                                                          "with those provided during dataset creation (%s, shard %d)",
                                      s->validate_hash, sm->ix.path, j);
                    goto fail;
                }
    }
    if (c.cache_limit > 0) {
        if (c.cache_limit <= index_bytes) {
            st = cm_set_error(CM_ERR_INVALID_ARG, "Minimum cache usage (%lld bytes) is larger than the cache limit (%lld "
                                                  "bytes). Please raise `cache_limit`.", (long long)index_bytes,
                              (long long)c.cache_limit);
            goto fail;
        }
        if (c.cache_limit < 4 * max_shard) {
            st = cm_set_error(CM_ERR_INVALID_ARG, "Cache limit (%lld bytes) is too low. Increase the `cache_limit` to at "
                                                  "least four times the largest shard size (%lld bytes), raw and zip "
                                                  "together.", (long long)c.cache_limit, (long long)max_shard);
            goto fail;
        }
    }
    if ((st = apply_weights(s))) goto fail;
    if ((st = setup_images(s))) goto fail;
    if ((st = build_fields(s))) goto fail;
    if (cfg && cfg->n_renames > 0 && (st = apply_renames(s, cfg->renames, cfg->n_renames))) goto fail;
    if ((st = cm_dataset_new(&k_streaming_vt, s, out))) goto fail;
    if ((st = cm_dataset_set_order(*out, &k_streaming_order))) {
        cm_dataset_free(*out); /* frees s */
        *out = NULL;
        return st;
    }
    bool any_remote = false;
    for (int k = 0; k < s->n_streams; k++) any_remote |= s->streams[k].store != NULL;
    if (any_remote && c.predownload > 0) {
        if (pthread_create(&s->pf_thread, NULL, prefetch_main, s) == 0) s->pf_running = true;
    }
    return CM_OK;
fail:
    st_close(s);
    return st;
}
