/* Private: the byte-level parsers behind the dataset formats, callable on memory so that the fuzz
 * targets (tests/fuzz/) reach exactly the code the datasets run. Each parser validates completely
 * before it returns a view: a view that comes back with CM_OK can be read anywhere within its
 * stated sizes. `name` is the file name the error messages quote.
 *
 * These files depend only on the base layer (status, allocator), zlib and POSIX, so a fuzz target
 * links them without the tensor layer. */
#ifndef CM_DATA_FORMATS_H
#define CM_DATA_FORMATS_H

#include <composer/base.h>

/* ---- whole files ------------------------------------------------------------------------- */

/* A file's bytes in memory: either cm_alloc'd (`owned`) or mmap'd read-only (`mapped`). */
typedef struct cm_blob {
    uint8_t *data;
    size_t size;
    int kind; /* 0 = borrowed (not freed), 1 = cm_alloc'd, 2 = mmap'd */
} cm_blob;

/* Reads a whole file into memory; if it starts with the gzip magic (1f 8b) it is decompressed
 * (several concatenated members are allowed). Errors: CM_ERR_NOT_FOUND (missing), CM_ERR_IO,
 * CM_ERR_FORMAT (corrupt or truncated gzip), CM_ERR_OOM; each message names the file. */
cm_status cm_blob_read(const char *path, cm_blob *out);
/* Maps a whole file read-only (an empty file gives size 0 and data NULL). Same errors. */
cm_status cm_blob_map(const char *path, cm_blob *out);
void cm_blob_release(cm_blob *b);

/* Decompresses gzip data from memory into a cm_alloc'd buffer of at most `max_out` bytes (more
 * is CM_ERR_FORMAT: a defence against decompression bombs). */
cm_status cm_gunzip(const uint8_t *in, size_t n, size_t max_out, const char *name, cm_blob *out);

/* ---- IDX (MNIST) ------------------------------------------------------------------------- */

#define CM_IDX_MAX_DIMS 8

typedef struct cm_idx {
    uint32_t magic;  /* the first four bytes big-endian, e.g. 0x00000803 */
    int type;        /* 0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64 */
    int elem_size;   /* bytes per element */
    int ndim;
    uint32_t dims[CM_IDX_MAX_DIMS];
    uint64_t numel;
    const uint8_t *data; /* numel × elem_size bytes, big-endian elements */
} cm_idx;

/* Parses and validates an IDX buffer: magic, known type, 1..8 dims, and a size that matches the
 * dims exactly (truncation and trailing bytes are both errors). CM_ERR_FORMAT otherwise. */
cm_status cm_idx_parse(const uint8_t *buf, size_t n, const char *name, cm_idx *out);

/* ---- llm.c token files ------------------------------------------------------------------- */

#define CM_TOKFILE_MAGIC 20240520
#define CM_TOKFILE_HEADER_BYTES 1024 /* 256 int32, little-endian */

typedef struct cm_tokfile {
    int version;       /* 1: uint16 tokens, 2: uint32 tokens */
    int width;         /* bytes per token: 2 or 4 */
    int64_t n_tokens;
    const uint8_t *tokens; /* n_tokens × width bytes, little-endian */
} cm_tokfile;

/* Parses and validates a token file held in memory: header size, magic 20240520, version 1 or 2,
 * a non-negative count, and a size that matches the count exactly. CM_ERR_FORMAT otherwise. */
cm_status cm_tokfile_parse(const uint8_t *buf, size_t n, const char *name, cm_tokfile *out);

/* Writes the window [start, start + T] (T + 1 tokens) as input_ids (T) = tokens [start, start+T)
 * and labels (T) = tokens [start+1, start+T+1), widened to i32 (`i64` false) or i64. The caller
 * guarantees start + T + 1 <= n_tokens. Tokens must be < vocab_size when vocab_size > 0, and
 * must fit the output type; otherwise CM_ERR_FORMAT naming the file and the token position. */
cm_status cm_tokfile_window(const cm_tokfile *tf, int64_t start, int64_t T, bool i64, int64_t vocab_size,
                            const char *name, void *input_ids, void *labels);

#endif
