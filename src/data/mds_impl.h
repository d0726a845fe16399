/* Private to the MDS code: compressions, hashes, a JSON writer that prints as Python's json.dumps,
 * the parsed index.json and the shard store the reader and the streaming dataset share. */
#ifndef CM_MDS_IMPL_H
#define CM_MDS_IMPL_H

#include "base/buf.h"

#include <composer/streaming.h>

#include <pthread.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "MDS shards are little-endian; this code reads them in place and needs a little-endian host"
#endif

/* ---- JSON text as Python writes it (into cmi_buf, base/buf.h) ------------------------------ */

/* A JSON string as Python's json.dumps (ensure_ascii): \" \\ \n \r \t \b \f, other controls and
 * every non-ASCII code point as \uXXXX (surrogate pairs above U+FFFF). Invalid UTF-8 bytes are
 * written as U+FFFD. */
void cmi_buf_json_str(cmi_buf *b, const char *s);
/* One UTF-8 code point at s (len bytes left): its length, or 0 if invalid (overlong, surrogate, ...). */
int cmi_utf8_decode(const uint8_t *s, size_t len, uint32_t *cp);

/* ---- compression (compression.py) -------------------------------------------------------- */

typedef enum { CMI_Z_NONE, CMI_Z_BR, CMI_Z_BZ2, CMI_Z_GZ, CMI_Z_SNAPPY, CMI_Z_ZSTD } cmi_zfamily;

/* Parses "family" or "family:level" as Streaming accepts them; NULL or "" is NONE. On an unknown
 * family or a level outside its range returns false. *ext is the file extension. */
bool cmi_mds_compression_parse(const char *s, cmi_zfamily *fam, int *level, const char **ext);
/* Compresses into a new buffer (out->p cm_alloc'd). */
cm_status cmi_mds_compress(cmi_zfamily fam, int level, const uint8_t *in, size_t n, cmi_buf *out);
/* Decompresses a whole file whose raw size is known (index.json's raw_data.bytes): output of any
 * other size is CM_ERR_FORMAT naming `name`. out is cm_alloc'd (free with cm_free). */
cm_status cmi_mds_decompress(cmi_zfamily fam, const uint8_t *in, size_t n, size_t raw_size, const char *name,
                             uint8_t **out);

/* ---- hashes (hashing.py) ------------------------------------------------------------------ */

/* Whether `algo` is a hash Streaming names that this build computes. */
bool cmi_mds_hash_known(const char *algo);
/* hexdigest() of data under `algo` into hex (at least 129 bytes). Errors: CM_ERR_INVALID_ARG for an
 * unknown algorithm, CM_ERR_INTERNAL if the crypto library fails. */
cm_status cmi_mds_hash(const char *algo, const void *data, size_t n, char *hex);
/* The names, for messages: "md5, sha1, ..." */
const char *cmi_mds_hash_names(void);

/* ---- index.json --------------------------------------------------------------------------- */

#define CMI_MDS_MAX_HASHES 20

typedef struct cmi_mds_file {
    char *basename;
    int64_t bytes;
    int n_hashes;
    char *hash_names[CMI_MDS_MAX_HASHES];
    char *hash_values[CMI_MDS_MAX_HASHES];
} cmi_mds_file;

typedef struct cmi_mds_shard_info {
    int64_t samples;
    int64_t sample_offset; /* global id of its first sample (within its stream's index) */
    cmi_zfamily zfam;
    bool has_zip;
    cmi_mds_file raw, zip;
} cmi_mds_shard_info;

typedef struct cmi_mds_index {
    char *path; /* the index.json it came from, for messages */
    int n_shards;
    cmi_mds_shard_info *shards;
    int64_t n_samples;
    int n_columns;
    char *column_names[CM_MDS_MAX_COLUMNS];
    char *column_enc_text[CM_MDS_MAX_COLUMNS];
    cm_mds_encoding columns[CM_MDS_MAX_COLUMNS];
    int64_t index_bytes; /* size of index.json (cache accounting) */
} cmi_mds_index;

/* Parses index.json text. Checks everything the reader relies on; errors name `path`. */
cm_status cmi_mds_index_parse(const char *text, size_t len, const char *path, cmi_mds_index *out);
void cmi_mds_index_free(cmi_mds_index *ix);
/* The hash value of `algo` recorded for a file, or NULL. */
const char *cmi_mds_file_hash(const cmi_mds_file *f, const char *algo);
/* The shard holding global sample `index` (binary search); *local gets the index within it. */
int cmi_mds_index_locate(const cmi_mds_index *ix, int64_t index, int64_t *local);

/* ---- shards in memory --------------------------------------------------------------------- */

/* One open shard: its raw bytes (mapped or decompressed), validated, shared by readers through a
 * reference count. */
typedef struct cmi_mds_open_shard {
    int refs;
    uint8_t *data;
    size_t size;
    bool mapped;
    uint32_t n;       /* samples */
    char *path;       /* the file the bytes came from (for messages) */
} cmi_mds_open_shard;

/* Loads shard `s` from directory `dir`: the raw file if present (mapped), else the compressed one
 * (read, decompressed in memory). Checks sizes, the hash `validate_hash` (NULL: none) of the file
 * actually read, and the sample table. */
cm_status cmi_mds_shard_load(const cmi_mds_index *ix, int s, const char *dir, const char *validate_hash,
                             cmi_mds_open_shard **out);
/* Validates raw shard bytes (header, offsets, count) and hashes, naming `path`. */
cm_status cmi_mds_shard_check(const cmi_mds_index *ix, int s, const uint8_t *data, size_t size, const char *path);
void cmi_mds_shard_unref(cmi_mds_open_shard *sh);
/* Decodes record `local` of an open shard into sample (no reference taken). */
cm_status cmi_mds_shard_sample(const cmi_mds_index *ix, const cmi_mds_open_shard *sh, int64_t local,
                               cm_mds_sample *out);
/* Checks a file's bytes against the hash recorded in the index. */
cm_status cmi_mds_check_hash(const cmi_mds_file *f, const char *algo, const void *data, size_t n, const char *path);

/* ---- misc --------------------------------------------------------------------------------- */

char *cmi_mds_strdup(const char *s);
char *cmi_mds_path2(const char *a, const char *b);           /* a/b (b alone when a is NULL or "") */
cm_status cmi_mds_write_atomic(const char *path, const void *data, size_t n); /* tmp + rename */
cm_status cmi_mds_mkdir_p(const char *path);
/* Human byte sizes as Streaming's bytes_to_int ("64mb" = 64 << 20, "100kb", "1gb", "10b", "123"). */
bool cmi_mds_parse_bytes(const char *s, int64_t *out);

#endif
