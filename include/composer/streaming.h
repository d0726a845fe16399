/*
 * composer/streaming.h — MosaicML Streaming compatibility: MDS shards (writer and reader), the
 * sample order of Streaming's StreamingDataset (shuffles, partitions, stream weighting) and a
 * streaming dataset for the dataloader, with a local cache in front of a remote.
 *
 * MDS is Streaming's own shard format: a directory with index.json and shard.NNNNN.mds files
 * (optionally compressed as shard.NNNNN.mds.zstd / .gz / .bz2 / .snappy / .br). Files written here
 * are byte-identical to Streaming's MDSWriter for the same samples and settings (the compressed
 * forms are valid streams of the same algorithm; their bytes may differ with library versions),
 * and every dataset Streaming writes in MDS is read here.
 *
 *     cm_mds_column cols[] = {{"tokens", "ndarray:int32"}, {"label", "int"}};
 *     cm_mds_writer_config wc = cm_mds_writer_config_default();
 *     wc.compression = "zstd";
 *     const char *hashes[] = {"sha1", "xxh64"};
 *     wc.hashes = hashes; wc.n_hashes = 2;
 *     cm_mds_writer *w;
 *     if (cm_mds_writer_new("out/mds", cols, 2, &wc, &w) != CM_OK) fprintf(stderr, "%s\n", cm_last_error());
 *     int32_t toks[4] = {1, 2, 3, 4};
 *     int64_t label = 7;
 *     cm_mds_value v[2] = {{.data = toks, .size = sizeof toks, .dtype = CM_MDS_DT_I32, .ndim = 1, .shape = {4}},
 *                          {.data = &label, .size = 8}};
 *     cm_mds_writer_write(w, v);          // values in the order of `cols`
 *     cm_mds_writer_finish(w);            // last shard, then index.json
 *     cm_mds_writer_free(w);
 *
 *     cm_mds_reader *r;
 *     cm_mds_reader_open("out/mds", NULL, &r);
 *     cm_mds_sample s;
 *     cm_mds_reader_get(r, 0, &s);        // s.values[c] in index.json column order (sorted names)
 *     cm_mds_sample_release(&s);
 *     cm_mds_reader_free(r);
 *
 * Byte order: MDS is little-endian; the library supports little-endian hosts only.
 */
#ifndef COMPOSER_STREAMING_H
#define COMPOSER_STREAMING_H

#include <composer/data.h>
#include <composer/datasets.h>

#ifdef __cplusplus
extern "C" {
#endif



/* ---------------------------------------------------------------------------------------------
 * Column encodings
 * ------------------------------------------------------------------------------------------- */

/* Element types of `ndarray` columns; each value is the code MDS stores for it. */
typedef enum cm_mds_dtype {
    CM_MDS_DT_NONE = 0,
    CM_MDS_DT_U8 = 8,
    CM_MDS_DT_I8 = 9,
    CM_MDS_DT_U16 = 16,
    CM_MDS_DT_I16 = 17,
    CM_MDS_DT_F16 = 18,
    CM_MDS_DT_U32 = 32,
    CM_MDS_DT_I32 = 33,
    CM_MDS_DT_F32 = 34,
    CM_MDS_DT_U64 = 64,
    CM_MDS_DT_I64 = 65,
    CM_MDS_DT_F64 = 66,
} cm_mds_dtype;

/* numpy's name of a dtype ("uint8", ..., "float64"), or NULL for an unknown value. */
const char *cm_mds_dtype_name(cm_mds_dtype dt);
/* Bytes per element (0 for CM_MDS_DT_NONE or an unknown value). */
size_t cm_mds_dtype_size(cm_mds_dtype dt);

/* Every encoding Streaming's MDS defines: enum, name, the scalar dtype of fixed-size scalars
 * (NONE otherwise). `jpegarray` is an alias Streaming accepts for `jpeg_array`. */
#define CM_MDS_KIND_LIST(X)                               \
    X(CM_MDS_BYTES, "bytes", CM_MDS_DT_NONE)              \
    X(CM_MDS_STR, "str", CM_MDS_DT_NONE)                  \
    X(CM_MDS_INT, "int", CM_MDS_DT_I64)                   \
    X(CM_MDS_UINT8, "uint8", CM_MDS_DT_U8)                \
    X(CM_MDS_UINT16, "uint16", CM_MDS_DT_U16)             \
    X(CM_MDS_UINT32, "uint32", CM_MDS_DT_U32)             \
    X(CM_MDS_UINT64, "uint64", CM_MDS_DT_U64)             \
    X(CM_MDS_INT8, "int8", CM_MDS_DT_I8)                  \
    X(CM_MDS_INT16, "int16", CM_MDS_DT_I16)               \
    X(CM_MDS_INT32, "int32", CM_MDS_DT_I32)               \
    X(CM_MDS_INT64, "int64", CM_MDS_DT_I64)               \
    X(CM_MDS_FLOAT16, "float16", CM_MDS_DT_F16)           \
    X(CM_MDS_FLOAT32, "float32", CM_MDS_DT_F32)           \
    X(CM_MDS_FLOAT64, "float64", CM_MDS_DT_F64)           \
    X(CM_MDS_STR_INT, "str_int", CM_MDS_DT_NONE)          \
    X(CM_MDS_STR_FLOAT, "str_float", CM_MDS_DT_NONE)      \
    X(CM_MDS_STR_DECIMAL, "str_decimal", CM_MDS_DT_NONE)  \
    X(CM_MDS_PIL, "pil", CM_MDS_DT_NONE)                  \
    X(CM_MDS_JPEG, "jpeg", CM_MDS_DT_NONE)                \
    X(CM_MDS_JPEG_ARRAY, "jpeg_array", CM_MDS_DT_NONE)    \
    X(CM_MDS_PNG, "png", CM_MDS_DT_NONE)                  \
    X(CM_MDS_LIST_PIL, "list[pil]", CM_MDS_DT_NONE)       \
    X(CM_MDS_LIST_JPEG, "list[jpeg]", CM_MDS_DT_NONE)     \
    X(CM_MDS_LIST_PNG, "list[png]", CM_MDS_DT_NONE)       \
    X(CM_MDS_PKL, "pkl", CM_MDS_DT_NONE)                  \
    X(CM_MDS_JSON, "json", CM_MDS_DT_NONE)                \
    X(CM_MDS_NDARRAY, "ndarray", CM_MDS_DT_NONE)

typedef enum cm_mds_kind {
#define CM_X_(e, name, dt) e,
    CM_MDS_KIND_LIST(CM_X_)
#undef CM_X_
    CM_MDS_KIND_COUNT
} cm_mds_kind;

/* Most dims an ndarray value may have here (MDS allows 63; more is CM_ERR_UNSUPPORTED). */
#define CM_MDS_MAX_NDIM 16

/* A parsed encoding string such as "int", "str" or "ndarray:uint8:2,3". */
typedef struct cm_mds_encoding {
    cm_mds_kind kind;
    cm_mds_dtype dtype;             /* scalars: their type; ndarray: the static dtype or NONE */
    int ndim;                       /* ndarray: the static shape's dims, or -1 when dynamic */
    int64_t shape[CM_MDS_MAX_NDIM]; /* ndarray: the static shape */
    int64_t size;                   /* bytes of every value when fixed (scalars, static ndarray), else -1 */
} cm_mds_encoding;

/* Parses `text` as Streaming does. Errors: CM_ERR_INVALID_ARG naming the text and listing the
 * encodings (unknown name, an ndarray dtype that is not one of the eleven, a dim < 1, a malformed
 * shape). */
cm_status cm_mds_encoding_parse(const char *text, cm_mds_encoding *out);

/* One value of one column, for writing and as read back.
 *  - scalars (int, uint8..float64): data points at the native value, size = its width;
 *  - bytes, str, str_int, str_float, str_decimal, json, pkl, jpeg, png: data/size are the bytes
 *    (str: UTF-8; str_*: the decimal text as Python's str() writes it; json: the JSON text;
 *    jpeg/png: the encoded image file);
 *  - ndarray: data/size the values in C order, dtype and ndim/shape describe them;
 *  - pil: data/size the raw pixels as PIL's tobytes(), shape[0] = height, shape[1] = width (ndim
 *    2) and `mode` the PIL mode ("L", "RGB", "RGBA", ...);
 *  - list[pil|jpeg|png], jpeg_array: for writing, `items`/`n_items` are the elements; as read
 *    back, data/size are the encoded list and n_items the count (cm_mds_list_item reads one).
 * Read values point into the shard (no alignment guarantee: copy before typed access) and stay
 * valid until the sample is released. */
typedef struct cm_mds_value {
    const void *data;
    size_t size;
    cm_mds_dtype dtype;
    int ndim;
    int64_t shape[CM_MDS_MAX_NDIM];
    const char *mode;
    const struct cm_mds_value *items;
    int64_t n_items;
} cm_mds_value;

/* Element i of a list[...] or jpeg_array value read from a shard (kind is the column's kind):
 * its bytes in item->data/size (pil elements also get mode and shape). Errors:
 * CM_ERR_INVALID_ARG (i out of range, a kind that is no list), CM_ERR_FORMAT (sizes that do not
 * fit the value). */
cm_status cm_mds_list_item(cm_mds_kind kind, const cm_mds_value *list, int64_t i, cm_mds_value *item);

/* Decodes an image value into 8-bit pixels, (height, width, channels) row-major: `pil` values
 * of mode L, RGB or RGBA are copied; `jpeg` (libjpeg) and `png` (libpng: 8-bit gray, gray+alpha,
 * RGB, RGBA or palette, expanded) are decoded. The image must be exactly h × w; its channels are
 * converted to `c` (1: gray via ITU-R 601-2 luma as PIL's convert("L"); 3: RGB, gray replicated;
 * alpha dropped). Errors: CM_ERR_FORMAT (a corrupt image, or one of another size, naming the
 * sizes), CM_ERR_UNSUPPORTED (another PIL mode, 16-bit PNG, CMYK JPEG). Thread-safe. */
cm_status cm_mds_image_decode(cm_mds_kind kind, const cm_mds_value *v, int64_t h, int64_t w, int c, uint8_t *out);

/* ---------------------------------------------------------------------------------------------
 * Writer
 * ------------------------------------------------------------------------------------------- */

typedef struct cm_mds_column {
    const char *name;     /* unique; index.json lists columns sorted by name */
    const char *encoding; /* see cm_mds_encoding_parse */
} cm_mds_column;

typedef struct cm_mds_writer_config {
    /* NULL or "" for none; else "zstd", "gz", "bz2", "snappy" or "br", optionally with a level
     * as "zstd:7" (zstd 1..22 default 3, gz 0..9 default 9, bz2 1..9 default 9, br 0..11
     * default 11; snappy takes none). The string goes into index.json as given. */
    const char *compression;
    /* Hash algorithms for every file, sorted and unique as Streaming requires: md5, sha1,
     * sha224, sha256, sha384, sha512, sha3_224, sha3_256, sha3_384, sha3_512, blake2b, blake2s,
     * xxh32, xxh64, xxh3_64, xxh128, xxh3_128. */
    const char *const *hashes;
    int n_hashes;
    /* Start a new shard before the raw shard would pass this many bytes; default 1 << 26; 0 =
     * everything in one shard. Must be < 2^32 (sample offsets are u32). */
    int64_t size_limit;
    /* false (default): refuse an output directory that already holds files; true: delete its
     * files first (Streaming's exist_ok). */
    bool exist_ok;
} cm_mds_writer_config;

cm_mds_writer_config cm_mds_writer_config_default(void);

typedef struct cm_mds_writer cm_mds_writer;

/* A writer of a new MDS dataset in directory `out` (created with its parents). The columns are
 * copied. Errors: CM_ERR_INVALID_ARG (no columns, duplicate names, bad encodings, an unknown or
 * out-of-range compression, unsorted or unknown hashes, size_limit out of range, a non-empty
 * `out` without exist_ok), CM_ERR_IO (naming the path), CM_ERR_OOM. */
cm_status cm_mds_writer_new(const char *out, const cm_mds_column *columns, int n_columns,
                            const cm_mds_writer_config *cfg, cm_mds_writer **w);

/* Encodes one sample: values[i] belongs to columns[i] as given to _new. May first write out the
 * current shard (compressed and hashed). Errors: CM_ERR_INVALID_ARG naming the column and what
 * is wrong (wrong scalar size, dtype or shape of a static ndarray, an empty or > 63-dim array,
 * invalid UTF-8 in str, text that is not an int for str_int, bad pil size for its mode, ...; the
 * sample is then not written), CM_ERR_IO, CM_ERR_OOM. Not thread-safe. */
cm_status cm_mds_writer_write(cm_mds_writer *w, const cm_mds_value *values);

/* Writes the last shard and then index.json (atomically: a dataset without index.json is not
 * complete). The writer takes no more samples afterwards. Errors: CM_ERR_IO, CM_ERR_OOM,
 * CM_ERR_STATE (called twice). */
cm_status cm_mds_writer_finish(cm_mds_writer *w);

/* Frees the writer; without a successful finish the directory has no index.json. NULL is a no-op. */
void cm_mds_writer_free(cm_mds_writer *w);

/* Samples written so far, and shards written so far. */
int64_t cm_mds_writer_n_samples(const cm_mds_writer *w);
int cm_mds_writer_n_shards(const cm_mds_writer *w);

/* ---------------------------------------------------------------------------------------------
 * Reader of a local MDS directory
 * ------------------------------------------------------------------------------------------- */

typedef struct cm_mds_reader_config {
    /* NULL: no hash check (Streaming's default). Else one of the dataset's hashes: every shard
     * file is checked against index.json when it is first opened, and a mismatch is CM_ERR_FORMAT
     * naming the shard. The size of every file is always checked. */
    const char *validate_hash;
    /* Columns with encoding pkl are refused unless this is set (their values are then handed
     * out as bytes; nothing is unpickled here). */
    bool allow_unsafe_types;
} cm_mds_reader_config;

cm_mds_reader_config cm_mds_reader_config_default(void);

typedef struct cm_mds_reader cm_mds_reader;

/* Opens the dataset in `dir` (its index.json; shards are opened lazily: a raw shard is mapped,
 * a compressed one is decompressed into memory). Errors, each naming the file: CM_ERR_NOT_FOUND
 * (no index.json), CM_ERR_FORMAT (invalid JSON, version other than 2, a format other than mds,
 * missing or ill-typed keys, unknown encodings or compressions, shards whose columns differ),
 * CM_ERR_INVALID_ARG (validate_hash not among a shard's hashes, a pkl column without
 * allow_unsafe_types), CM_ERR_OOM. */
cm_status cm_mds_reader_open(const char *dir, const cm_mds_reader_config *cfg, cm_mds_reader **out);
void cm_mds_reader_free(cm_mds_reader *r); /* NULL is a no-op */

int64_t cm_mds_reader_len(const cm_mds_reader *r);
int cm_mds_reader_n_shards(const cm_mds_reader *r);
int cm_mds_reader_n_columns(const cm_mds_reader *r);
/* Borrowed, valid for the reader's life; NULL for i out of range. */
const char *cm_mds_reader_column_name(const cm_mds_reader *r, int i);
const cm_mds_encoding *cm_mds_reader_column_encoding(const cm_mds_reader *r, int i);
/* The column called `name`, or -1. */
int cm_mds_reader_find_column(const cm_mds_reader *r, const char *name);

#define CM_MDS_MAX_COLUMNS 64

/* One decoded sample: values[c] for column c. Holds a reference on its shard until released. */
typedef struct cm_mds_sample {
    int n_columns;
    cm_mds_value values[CM_MDS_MAX_COLUMNS];
    void *ref_; /* private */
} cm_mds_sample;

/* Reads sample `index` (0 <= index < len; global over the shards in index.json order).
 * Errors: CM_ERR_INVALID_ARG (index), CM_ERR_NOT_FOUND / CM_ERR_IO (a missing shard), CM_ERR_FORMAT
 * (a shard of the wrong size or hash, offsets or column sizes outside the record, a bad ndarray
 * header), each naming the shard file and the sample. Thread-safe. */
cm_status cm_mds_reader_get(cm_mds_reader *r, int64_t index, cm_mds_sample *out);
/* Releases the sample's reference (its values become invalid). Safe on a zeroed sample. */
void cm_mds_sample_release(cm_mds_sample *s);

/* ---------------------------------------------------------------------------------------------
 * Streaming's sample order (FORMATS §5.4-5.8)
 *
 * These reproduce StreamingDataset's functions bit for bit — numpy's default_rng (SeedSequence and
 * PCG64) included — so a run here visits samples in the order MosaicML Streaming would for the
 * same seed and configuration.
 * ------------------------------------------------------------------------------------------- */

/* get_shuffle(algo, shard_sizes, num_canonical_nodes, seed, epoch, block_size): the shuffled
 * sample ids of one epoch into ids (sum of shard_sizes values). algo: "py1e" (Streaming's
 * default), "py1br", "py1s", "py2s", "naive", or "py1b" (removed from Streaming in 0.11; its last
 * version). The seed used is seed + epoch as Python ints. Errors: CM_ERR_INVALID_ARG (unknown
 * algorithm naming it, num_canonical_nodes < 1, block_size < 1, a canonical node with no samples
 * under py1e), CM_ERR_OOM. Thread-safe. */
cm_status cm_streaming_shuffle(const char *algo, const int64_t *shard_sizes, int64_t n_shards, int64_t num_canonical_nodes,
                               uint64_t seed, int64_t epoch, int64_t block_size, int64_t *ids);

/* get_partitions(algo, ...): the epoch's positions dealt to (physical nodes, ranks per node,
 * workers per rank, batches per worker, batch size), -1 for padding, after dropping the first
 * drop_first positions (resumption). algo "orig" or "relaxed" (the default);
 * initial_physical_nodes 0 means None. *out is cm_alloc'd (cm_free it), shape[5] its dims.
 * Errors: CM_ERR_INVALID_ARG with Streaming's own message (nodes that do not divide, a global
 * batch the initial devices do not divide, resuming past the end), CM_ERR_OOM. */
cm_status cm_streaming_partition(const char *algo, int64_t num_samples, int64_t num_canonical_nodes,
                                 int64_t num_physical_nodes, int64_t ranks_per_node, int64_t workers_per_rank,
                                 int64_t batch_size, int64_t drop_first, int64_t initial_physical_nodes, int64_t **out,
                                 int64_t shape[5]);


/* ---------------------------------------------------------------------------------------------
 * StreamingDataset: MDS streams as a dataset that decides its own epoch order
 *
 *     cm_streaming_config sc = cm_streaming_config_default();
 *     sc.remote = "s3://my-bucket/c4-mds"; // gs://, oci://, file://, a folder; NULL: `local` holds it
 *     sc.local = "/tmp/cache";
 *     sc.shuffle = true;                   // py1e, seed 9176 (Streaming's defaults)
 *     sc.batch_size = 8;                   // per device, as Streaming's batch_size
 *     sc.max_seq_len = 1024;               // column "tokens" -> fields input_ids / labels
 *     cm_dataset *ds;
 *     cm_dataset_streaming_new(&sc, rank, world_size, &ds);
 *     // a loader over ds with batch_size 8 * world_size follows Streaming's order
 *
 * Fields: every fixed-size numeric column (scalars and ndarrays of static shape) becomes a field
 * of its name (uint8 -> u8, float16 -> f16, float32 -> f32, int32 -> i32, int/int64 -> i64;
 * int8/int16/uint16 -> i32, uint32/uint64 -> i64, float64 -> f32). With max_seq_len > 0 the
 * column "tokens" (an integer ndarray, or bytes of int64 tokens as llm-foundry writes them) gives
 * "input_ids" (its first max_seq_len tokens, padded with 0) and "labels" (the next token at each
 * position, -100 where there is none, as Hugging Face's shifted causal-LM labels). With image_h,
 * image_w and image_c set, pil/png/jpeg columns become u8 (H, W, C) fields; with image_std also
 * set, f32 (C, H, W) fields normalised as torchvision's ToTensor + Normalize ((x/255 - mean[c]) /
 * std[c], computed as cm_dataset_cifar10 / cm_dataset_mnist do, so the same pixels give the same
 * floats), randomly cropped and flipped for training by image_augment exactly as those datasets
 * do (the draw keyed by the sample id). Other columns (str, json, ...) are not fields. A field is
 * named after its column unless `renames` says otherwise (Streaming's vision datasets call the
 * image and the label "x" and "y"; the zoo's classifiers read "image" and "label").
 *
 * Order: the loader asks the dataset for each global batch. The dataset computes Streaming's
 * epoch exactly (resample_streams, the partition over nodes = world_size / ranks_per_node and
 * ranks_per_node, the shuffle, the mapping back to samples) with drop_first = the position
 * resumed from, so a resumed run sees exactly the samples not yet seen, on any number of ranks
 * (with partition_algo relaxed; the global batch must stay the same). Workers per rank are taken
 * as 1: the loader's threads are not Streaming's DataLoader workers, and Streaming's order does
 * not depend on their number except in how the final partial batch is split.
 *
 * Cache: with a remote, shards are fetched into `local` when a sample needs them and ahead of the
 * order (predownload samples, on a thread of the dataset), compressed shards are decompressed
 * there (the compressed file is removed unless keep_zip), and with cache_limit the least recently
 * used shards are evicted to stay under it. Remotes are object stores (storage.h: s3://, gs://,
 * oci://, file://, local paths), with their credentials and endpoint from the environment;
 * download_retry retries of a transient failure (5xx, a connection cut, a timeout; resumed where
 * it stopped), CM_STORAGE_MAX_RETRIES overriding it. Without `local`, shards of a remote store go
 * to ${TMPDIR:-/tmp}/composer-streaming/<hash of the remote> (Streaming's temporary default).
 *
 * Processes sharing `local` (the ranks of a node) share the cache through lock files beside the
 * shards ("<shard>.lock", ".cm_cache.lock"): each shard is fetched once, a shard is never evicted
 * while a process fetches or maps it, and the mtime of the raw files is the common LRU clock. A
 * cache over cache_limit whose shards are all held by other processes for EVICT_WAIT (2 s) is
 * CM_ERR_IO naming the cache ("cache ... is full"); a corrupt or truncated download is
 * CM_ERR_FORMAT naming the shard and the remote URI, and is removed from the cache so the next
 * attempt fetches it anew. Nothing partial is ever left under a shard's name.
 * ------------------------------------------------------------------------------------------- */

#define CM_STREAMING_MAX_STREAMS 32

/* A field name for a column: {"x", "image"}. */
typedef struct cm_streaming_rename {
    const char *column, *field;
} cm_streaming_rename;

/* One stream; the weights follow Stream(): at most one of proportion, repeat, choose (< 0:
 * unset). Unset remote/local/split/validate_hash take the dataset's. */
typedef struct cm_stream_config {
    const char *remote, *local, *split;
    double proportion, repeat;
    int64_t choose;
} cm_stream_config;

typedef struct cm_streaming_config {
    const cm_stream_config *streams; /* NULL: one stream from remote/local/split */
    int n_streams;
    const char *remote, *local, *split;
    const char *validate_hash; /* NULL: none */
    bool keep_zip;             /* default false */
    int download_retry;        /* default 2 */
    int64_t epoch_size;        /* 0: the streams' own sizes (None) */
    int64_t predownload;       /* -1: 8 * batch_size */
    int64_t cache_limit;       /* bytes; 0: no limit */
    const char *sampling_method; /* "balanced" (default) or "fixed" */
    int64_t sampling_granularity; /* default 1 */
    const char *partition_algo;  /* "relaxed" (default) or "orig" */
    int64_t num_canonical_nodes; /* 0: 64 x nodes for py1s/py2s, else nodes */
    int64_t batch_size;          /* per device; required */
    bool shuffle;                /* default false */
    const char *shuffle_algo;    /* default "py1e" */
    uint64_t shuffle_seed;       /* default 9176 */
    int64_t shuffle_block_size;  /* 0: max(4000000 / num_canonical_nodes, 2^18) */
    int64_t initial_physical_nodes; /* 0: None (this run's node count) */
    bool allow_unsafe_types;
    int ranks_per_node;          /* 0: LOCAL_WORLD_SIZE / OMPI_COMM_WORLD_LOCAL_SIZE, else world_size */
    int64_t max_seq_len;         /* > 0: the text fields (see above) */
    int64_t image_h, image_w, image_c; /* > 0: image columns as u8 (H, W, C) */
    float image_mean[3], image_std[3]; /* image_std[0] > 0: image fields as normalised f32 (C, H, W)
                                          (one value per channel; image_c of them) */
    cm_image_augment image_augment;    /* training only, with image_std; default none */
    const cm_streaming_rename *renames; /* NULL: every field named after its column */
    int n_renames;
} cm_streaming_config;

cm_streaming_config cm_streaming_config_default(void);

/* A streaming dataset for rank `rank` of `world_size`. Reads every stream's index.json (fetched
 * into local first when missing). Errors: CM_ERR_INVALID_ARG naming the argument (no streams,
 * remote and local both unset, bad weights, batch_size < 1, unknown shuffle_algo /
 * partition_algo / sampling_method / validate_hash, a cache_limit under 4 x the largest shard,
 * streams whose columns differ, no usable field, image_c other than 1 or 3, an image_std <= 0,
 * image_augment without image_std, a rename of a column that is no field or to a name taken),
 * the reader's errors for index.json, CM_ERR_IO
 * / CM_ERR_NOT_FOUND from the remote, CM_ERR_OOM. get is thread-safe. */
cm_status cm_dataset_streaming_new(const cm_streaming_config *cfg, int rank, int world_size, cm_dataset **out);

/* Bytes of shard files in the cache of the first stream's local directory (for tests and
 * benchmarks). */
int64_t cm_streaming_cache_usage(const cm_dataset *ds);
/* Shards this process fetched from a remote, and shards it evicted. */
int64_t cm_streaming_n_fetched(const cm_dataset *ds);
int64_t cm_streaming_n_evicted(const cm_dataset *ds);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_STREAMING_H */
