/* Private pieces of the storage layer: the backend vtable behind cm_object_store, the SigV4
 * signer and the hashes it needs, URI parsing. Not installed. */
#ifndef CM_STORAGE_IMPL_H
#define CM_STORAGE_IMPL_H

#include <composer/storage.h>

#include <stdatomic.h>

/* A backend: local folder or S3. Every slot is required; keys are full keys inside the backend
 * (the store's prefix already applied), uri is the object's URI for messages. */
typedef struct cmi_store_i {
    const char *name;
    cm_status (*upload)(cm_object_store *st, const char *key, const char *uri, const char *local_path);
    cm_status (*put)(cm_object_store *st, const char *key, const char *uri, const void *data, size_t n);
    cm_status (*download)(cm_object_store *st, const char *key, const char *uri, const char *local_path);
    cm_status (*get)(cm_object_store *st, const char *key, const char *uri, size_t max, char **out, size_t *len);
    cm_status (*get_size)(cm_object_store *st, const char *key, const char *uri, uint64_t *size);
    /* appends to out (keys are full keys; the caller strips the store prefix and sorts) */
    cm_status (*list)(cm_object_store *st, const char *prefix, const char *uri, cm_object_list *out);
    cm_status (*del)(cm_object_store *st, const char *key, const char *uri);
    void (*close)(cm_object_store *st);
} cmi_store_i;

struct cm_object_store {
    const cmi_store_i *vt;
    void *impl;
    char *uri;    /* as opened, without a trailing '/' */
    char *prefix; /* the key prefix inside the bucket or folder ("" or "a/b/") */
    bool remote;
    cm_object_store_config cfg; /* strings owned (copies) */
    atomic_llong n_requests, n_retries, n_up, n_down;
};

/* Appends one item (key copied). CM_ERR_OOM. */
cm_status cmi_object_list_add(cm_object_list *l, const char *key, uint64_t size);

/* Test hook (s3.c): max-keys of each ListObjectsV2 page; 0 = the server default. */
extern int cmi_s3_list_max_keys;

/* ---- local folders (local.c) ---- */
cm_status cmi_local_open(cm_object_store *st, const char *dir);

/* ---- S3 (s3.c) ---- */
/* scheme: "s3", "gs" or "oci"; bucket: the bucket name. */
cm_status cmi_s3_open(cm_object_store *st, const char *scheme, const char *bucket);

/* ---- hashes and SigV4 (sigv4.c) ---- */
void cmi_sha256(const void *data, size_t n, uint8_t out[32]);
void cmi_sha256_hex(const void *data, size_t n, char hex[65]);
void cmi_hmac_sha256(const void *key, size_t klen, const void *data, size_t n, uint8_t out[32]);

typedef struct cmi_sigv4_header {
    const char *name; /* any case; lowercased when signed */
    const char *value;
} cmi_sigv4_header;

/* A request to sign. The headers must include host and x-amz-date (and, for S3,
 * x-amz-content-sha256); all of them are signed. */
typedef struct cmi_sigv4_request {
    const char *method;        /* "GET" */
    const char *path;          /* the URI path as sent, already percent-encoded ("/bucket/a%20b") */
    const char *query;         /* the query string as sent, without '?' ("" or NULL: none) */
    const cmi_sigv4_header *headers;
    int n_headers;
    const char *payload_sha256; /* hex SHA-256 of the body, or "UNSIGNED-PAYLOAD" */
    const char *region, *service;
    const char *amz_date; /* "20150830T123600Z" (the x-amz-date header's value) */
    const char *access_key, *secret_key;
} cmi_sigv4_request;

/* Writes the Authorization header's value into auth (cap bytes); optionally the canonical request
 * and the string to sign (NULL: not wanted), for tests. The canonical query re-encodes every key
 * and value (decoded first) with RFC 3986 unreserved characters kept, sorted by key then value;
 * header values are trimmed and inner runs of spaces collapsed. Errors: CM_ERR_INVALID_ARG
 * (something missing, or a buffer too small), CM_ERR_OOM. */
cm_status cmi_sigv4_sign(const cmi_sigv4_request *r, char *auth, size_t cap, char *creq, size_t creq_cap, char *sts,
                         size_t sts_cap);

/* Percent-encodes s into out (cap bytes) with AWS's rules: A-Z a-z 0-9 - . _ ~ kept, and '/' too
 * when keep_slash (object keys in paths). Returns false when out is too small. */
bool cmi_uri_encode(const char *s, bool keep_slash, char *out, size_t cap);

#endif
