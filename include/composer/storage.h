/*
 * composer/storage.h — object stores behind one interface: local folders and S3-compatible
 * buckets (AWS S3, Google Cloud Storage through its S3 interoperability, Oracle OCI, Cloudflare R2,
 * MinIO), as Composer's ObjectStore classes.
 *
 * A store is opened for a URI and every key is relative to it:
 *
 *     s3://bucket/some/prefix      AWS S3, or any S3-compatible endpoint (S3_ENDPOINT_URL: MinIO,
 *                                  R2 at https://<account>.r2.cloudflarestorage.com, ...)
 *     gs://bucket/prefix           GCS through https://storage.googleapis.com with HMAC keys
 *                                  (GCS_KEY, GCS_SECRET)
 *     oci://bucket/prefix          OCI's S3-compatible endpoint: S3_ENDPOINT_URL, or
 *                                  https://<OCI_NAMESPACE>.compat.objectstorage.<OCI_REGION>.
 *                                  oraclecloud.com; keys are OCI "customer secret keys" in AWS_*
 *     file:///abs/dir, /abs/dir,   a local folder (created when the first object is written)
 *     rel/dir
 *
 * so `cm_object_store_open("s3://b/runs/r1", ...)` then `..._download(st, "ckpt/latest", dst)`
 * reads s3://b/runs/r1/ckpt/latest. Keys use '/' as separator and never start with '/'.
 *
 * S3 requests are signed with AWS Signature Version 4 (written here, payloads hashed and signed).
 * Credentials and endpoint come from Composer's environment variables unless the config names
 * them: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN (temporary credentials),
 * AWS_REGION (or AWS_DEFAULT_REGION; default us-east-1), S3_ENDPOINT_URL (a custom endpoint:
 * path-style addressing, http:// allowed). Without an endpoint, AWS is addressed virtual-host
 * style (https://BUCKET.s3.REGION.amazonaws.com/KEY) unless the bucket name has a dot.
 *
 * Failures: a transient failure (HTTP 500, 502, 503 SlowDown, 504, 408, 429, a refused or reset
 * connection, a response slower than timeout_s) is retried max_retries times with exponential
 * backoff (retry_backoff_s, doubled each time, with jitter, capped at 30 s); downloads resume
 * where the failed attempt stopped (a ranged GET pinned to the object's ETag). Anything else is
 * permanent and fails at once: CM_ERR_NOT_FOUND for a missing object or bucket, CM_ERR_IO for 403
 * (AccessDenied, InvalidAccessKeyId, SignatureDoesNotMatch: the message says which credentials
 * to check) and every other error. Every message names the URI and, for S3, the server's error
 * code and message. Nothing partial is ever left under a final name: a download goes to
 * "<path>.part-<pid>-<n>" and is renamed when complete and of the right size; an upload is
 * visible only when complete (a single PUT, or a multipart upload completed after every part
 * succeeded, aborted otherwise).
 *
 * Thread-safety: a store may be used from several threads at once (each call has its own
 * connection); open and close are not concurrent with other calls on the same store.
 *
 *     cm_object_store *st;
 *     if (cm_object_store_open("s3://my-bucket/data/mds", NULL, &st) != CM_OK) {
 *         fprintf(stderr, "%s\n", cm_last_error());
 *         return 1;
 *     }
 *     uint64_t n;
 *     cm_status s = cm_object_store_get_size(st, "index.json", &n);          // HEAD
 *     if (!s) s = cm_object_store_download(st, "index.json", "/tmp/cache/index.json");
 *     cm_object_list l;
 *     if (!s) s = cm_object_store_list(st, "shard.", &l);                    // keys "shard.00000.mds", ...
 *     if (!s) cm_object_list_free(&l);
 *     cm_object_store_close(st);
 */
#ifndef COMPOSER_STORAGE_H
#define COMPOSER_STORAGE_H

#include <composer/base.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cm_object_store cm_object_store;

typedef enum cm_s3_addressing {
    CM_S3_ADDRESSING_AUTO = 0, /* path style with a custom endpoint, virtual-host style on AWS */
    CM_S3_ADDRESSING_PATH = 1, /* http(s)://ENDPOINT/BUCKET/KEY */
    CM_S3_ADDRESSING_VIRTUAL = 2, /* http(s)://BUCKET.ENDPOINT/KEY */
} cm_s3_addressing;

/* Options of a store; every field has a default (cm_object_store_config_default). Strings are
 * copied at open. NULL strings fall back to the environment variables named above. */
typedef struct cm_object_store_config {
    size_t multipart_threshold; /* uploads of at least this many bytes are multipart (default 64 MiB) */
    size_t part_size;           /* bytes per part (default 16 MiB; S3 needs at least 5 MiB) */
    int max_concurrency;        /* parts uploaded in parallel (default 4) */
    int max_retries;            /* retries of a transient failure, after the first try (default 5) */
    double retry_backoff_s;     /* the first wait before a retry (default 0.5 s; then doubled) */
    double timeout_s;           /* a request that makes no progress for this long fails (default 60) */
    double connect_timeout_s;   /* connecting (default 10) */
    const char *endpoint_url;   /* instead of S3_ENDPOINT_URL */
    const char *region;         /* instead of AWS_REGION */
    const char *access_key_id;  /* instead of AWS_ACCESS_KEY_ID (GCS_KEY for gs://) */
    const char *secret_access_key; /* instead of AWS_SECRET_ACCESS_KEY (GCS_SECRET for gs://) */
    const char *session_token;  /* instead of AWS_SESSION_TOKEN */
    cm_s3_addressing addressing;
} cm_object_store_config;

/* The defaults above; the environment variables CM_STORAGE_MAX_RETRIES, CM_STORAGE_RETRY_BACKOFF_S
 * and CM_STORAGE_TIMEOUT_S, when set, replace max_retries, retry_backoff_s and timeout_s (for
 * every store, including the checkpoints' and datasets'). */
cm_object_store_config cm_object_store_config_default(void);

/* Whether `path` names an object store rather than a local path: it starts with "<scheme>://"
 * (file:// included: it is a local folder, but through a URI). */
bool cm_storage_is_uri(const char *path);
/* Whether `path` names a remote store (s3://, gs://, oci://): not local, not file://. */
bool cm_storage_is_remote(const char *path);

/* Opens the store for `uri` (cfg NULL = defaults). Nothing is contacted yet; a missing bucket,
 * wrong credentials or an unreachable endpoint show up at the first request. On success *out is
 * owned by the caller (cm_object_store_close). Errors: CM_ERR_INVALID_ARG (an unknown scheme —
 * the message lists the known ones —, no bucket, a bad endpoint URL, remote credentials missing:
 * the message names the variables to set), CM_ERR_OOM. */
cm_status cm_object_store_open(const char *uri, const cm_object_store_config *cfg, cm_object_store **out);

/* Closes the store. NULL is a no-op. */
void cm_object_store_close(cm_object_store *st);

/* The URI the store was opened with, without a trailing '/' ("s3://b/runs/r1", "/tmp/x").
 * Borrowed until close. */
const char *cm_object_store_uri(const cm_object_store *st);
/* Whether the store is remote (not a local folder). */
bool cm_object_store_is_remote(const cm_object_store *st);

/* Uploads the local file `local_path` as `key` (replacing it). Multipart, with parts in parallel,
 * from multipart_threshold bytes. Errors: CM_ERR_NOT_FOUND / CM_ERR_IO for the local file (named),
 * the store's errors above. */
cm_status cm_object_store_upload(cm_object_store *st, const char *key, const char *local_path);

/* Writes `n` bytes from memory as `key` (small objects: pointers, manifests). */
cm_status cm_object_store_put(cm_object_store *st, const char *key, const void *data, size_t n);

/* Downloads `key` to `local_path` (parent folders created), atomically: the file appears only
 * when complete. Errors: CM_ERR_NOT_FOUND (no such object: the URI is named), CM_ERR_IO. */
cm_status cm_object_store_download(cm_object_store *st, const char *key, const char *local_path);

/* Reads a whole object of at most max_bytes into a new NUL-terminated buffer (*out, free with
 * cm_free; *len its length without the NUL). Errors: CM_ERR_NOT_FOUND, CM_ERR_FORMAT (larger than
 * max_bytes), CM_ERR_IO, CM_ERR_OOM. */
cm_status cm_object_store_get(cm_object_store *st, const char *key, size_t max_bytes, char **out, size_t *len);

/* The size of object `key` in bytes. Errors: CM_ERR_NOT_FOUND when it does not exist. */
cm_status cm_object_store_get_size(cm_object_store *st, const char *key, uint64_t *size);

/* One object of a listing: its key relative to the store and its size. */
typedef struct cm_object_info {
    char *key;
    uint64_t size;
} cm_object_info;

typedef struct cm_object_list {
    cm_object_info *items; /* sorted by key (byte order) */
    size_t n;
} cm_object_list;

/* Every object whose key starts with `prefix` ("" or NULL: all), however deep, sorted by key;
 * S3 listings are followed over every page. Free with cm_object_list_free. A prefix that matches
 * nothing gives an empty list (n = 0), not an error. Errors: the store's (a missing bucket is
 * CM_ERR_NOT_FOUND). */
cm_status cm_object_store_list(cm_object_store *st, const char *prefix, cm_object_list *out);
void cm_object_list_free(cm_object_list *l);

/* Deletes `key`. Deleting an object that does not exist succeeds (as S3's DELETE does). */
cm_status cm_object_store_delete(cm_object_store *st, const char *key);

/* Counters since open (for tests and logs): requests sent, retries after transient failures,
 * bytes sent and received. Thread-safe. */
typedef struct cm_object_store_stats {
    int64_t requests, retries;
    int64_t bytes_up, bytes_down;
} cm_object_store_stats;
cm_object_store_stats cm_object_store_get_stats(const cm_object_store *st);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_STORAGE_H */
