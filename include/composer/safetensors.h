/*
 * composer/safetensors.h — reading and writing safetensors files, and Hugging Face sharded
 * checkpoints (model.safetensors.index.json).
 *
 * A safetensors file is an 8-byte little-endian header length N, a JSON header of N bytes that maps
 * each tensor name to its dtype, shape and byte range, and then the raw little-endian tensor bytes
 * (docs: FORMATS.md §4). This module follows the reference implementation (huggingface/safetensors):
 *
 *   - The reader maps the file read-only (mmap) and validates everything before it returns: header
 *     size and UTF-8, strict JSON without duplicate keys, known dtypes, shapes whose byte count does
 *     not overflow, tensors that tile the data buffer from byte 0 with no gap and no overlap, and no
 *     trailing bytes. A bad file gives CM_ERR_FORMAT and a message naming the file, the tensor or
 *     field, and what is wrong. After a successful open every tensor's bytes are inside the mapping.
 *   - The writer reproduces the reference writer byte for byte (tensors sorted by dtype, descending
 *     in the reference enum order, then by name; compact JSON; header padded with spaces to a
 *     multiple of 8) and writes atomically (temporary file, fsync, rename, fsync of the folder).
 *
 *     cm_safetensors *st;
 *     if (cm_safetensors_open("model.safetensors", &st) != CM_OK) {
 *         fprintf(stderr, "%s\n", cm_last_error());
 *         return 1;
 *     }
 *     for (size_t i = 0; i < cm_safetensors_count(st); i++) {
 *         const cm_st_tensor *e = cm_safetensors_at(st, i);       // file (offset) order
 *         printf("%s %s %zu bytes\n", e->name, cm_st_dtype_name(e->dtype), e->nbytes);
 *     }
 *     cm_tensor *w;                                              // bf16/f16/f64 in the file → f32
 *     if (cm_safetensors_load(st, "wte.weight", CM_DTYPE_F32, &w) != CM_OK) {
 *         fprintf(stderr, "%s\n", cm_last_error());               // names the file and the tensor
 *         cm_safetensors_close(st);
 *         return 1;
 *     }
 *     cm_safetensors_close(st);                                  // w is a copy: still valid
 *
 *     cm_safetensors_writer *wr;
 *     cm_safetensors_writer_new(&wr);
 *     cm_safetensors_writer_add_metadata(wr, "format", "pt");
 *     cm_safetensors_writer_add(wr, "wte.weight", w);            // borrowed until write/free
 *     cm_status s = cm_safetensors_writer_write(wr, "out/model.safetensors");
 *     cm_safetensors_writer_free(wr);
 *     cm_tensor_free(w);
 *
 * Where the reference is silent or C needs a choice: unknown fields inside a tensor entry are
 * ignored (as serde does) but must be valid JSON; duplicate keys are rejected at every level the
 * format defines (tensor names, the three fields, "__metadata__" and its keys); names or metadata
 * containing U+0000 and dims above 2^63-1 are rejected (a C string / int64_t cannot hold them);
 * `"__metadata__": null` means no metadata, as in serde.
 *
 * Threading: an open cm_safetensors is immutable, so any number of threads may read it (and load
 * from it) at once. A writer belongs to one thread at a time. cm_safetensors_index_find and
 * cm_safetensors_index_load are thread-safe (shards are opened under a lock).
 *
 * Host byte order: the library supports little-endian hosts only (checked at compile time), so the
 * bytes in the file are the host's representation.
 */
#ifndef COMPOSER_SAFETENSORS_H
#define COMPOSER_SAFETENSORS_H

#include <composer/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Dtypes
 * ------------------------------------------------------------------------------------------- */

/* X-macro: the safetensors dtype name (also the enum suffix) and its width in bits, in the
 * reference's enum order ("increasing alignment"). The writer sorts by this order, descending.
 * Sub-byte types (F4, F6_*) are packed; BOOL is one byte per element. */
#define CM_ST_DTYPE_LIST(X) \
    X(BOOL, 8)              \
    X(F4, 4)                \
    X(F6_E2M3, 6)           \
    X(F6_E3M2, 6)           \
    X(U8, 8)                \
    X(I8, 8)                \
    X(F8_E5M2, 8)           \
    X(F8_E4M3, 8)           \
    X(F8_E8M0, 8)           \
    X(F8_E4M3FNUZ, 8)       \
    X(F8_E5M2FNUZ, 8)       \
    X(I16, 16)              \
    X(U16, 16)              \
    X(F16, 16)              \
    X(BF16, 16)             \
    X(I32, 32)              \
    X(U32, 32)              \
    X(F32, 32)              \
    X(C64, 64)              \
    X(F64, 64)              \
    X(I64, 64)              \
    X(U64, 64)

/* Every dtype a safetensors file may hold, including those the library cannot compute in. */
typedef enum cm_st_dtype {
#define CM_X_(name, bits) CM_ST_DTYPE_##name,
    CM_ST_DTYPE_LIST(CM_X_)
#undef CM_X_
    CM_ST_DTYPE_COUNT
} cm_st_dtype;

/* "F32", "BF16", ... exactly as in the file ("?" if out of range). */
const char *cm_st_dtype_name(cm_st_dtype dt);
/* Bits per element (4, 6, 8, 16, 32 or 64; 0 if out of range). */
int cm_st_dtype_bits(cm_st_dtype dt);
/* Parses a dtype name exactly as the file spells it (case-sensitive, "F32"). CM_ERR_INVALID_ARG
 * naming the known names otherwise. */
cm_status cm_st_dtype_parse(const char *s, cm_st_dtype *out);
/* The cm_dtype with the same bytes (F32, BF16, F16, I32, I64, U8): true and *out set; false for
 * every other dtype (which can still be converted by cm_safetensors_load/copy, see there). */
bool cm_st_dtype_to_cm(cm_st_dtype dt, cm_dtype *out);
/* The safetensors dtype of a cm_dtype (always exists). */
cm_st_dtype cm_st_dtype_from_cm(cm_dtype dt);

/* ---------------------------------------------------------------------------------------------
 * Reader
 * ------------------------------------------------------------------------------------------- */

typedef struct cm_safetensors cm_safetensors;

/* One tensor of an open file. Plain data, borrowed: every pointer stays valid until
 * cm_safetensors_close. */
typedef struct cm_st_tensor {
    const char *name;     /* UTF-8, NUL-terminated (a name containing U+0000 is rejected at open) */
    cm_st_dtype dtype;
    int ndim;             /* 0 for a scalar; may exceed CM_MAX_DIMS (such a tensor cannot be loaded
                             into a cm_tensor, but its bytes are available) */
    const int64_t *shape; /* ndim entries, each 0 .. INT64_MAX */
    int64_t numel;        /* product of the shape (1 for a scalar) */
    uint64_t begin, end;  /* data_offsets: [begin, end) relative to the start of the data buffer */
    size_t nbytes;        /* end - begin */
    /* The bytes, inside the read-only mapping. NOT aligned in general (the format does not pad,
     * and files from old writers put tensors at any offset): read with memcpy, or load a copy
     * with cm_safetensors_load/copy. Never write through it. */
    const void *data;
} cm_st_tensor;

/* Opens and validates the file at `path`, mapping it read-only. On success *out owns the mapping
 * (free with cm_safetensors_close). Errors: CM_ERR_IO (cannot open, stat or map; not a regular
 * file), CM_ERR_FORMAT (any rule of FORMATS.md §4.2 broken: the message names the file, the tensor
 * or header field, and what is wrong), CM_ERR_OOM. The file must not be truncated by another
 * process while it is open (reading a vanished page of a mapping raises SIGBUS). */
cm_status cm_safetensors_open(const char *path, cm_safetensors **out);

/* The same over `len` bytes in memory (not copied: they must stay valid and unchanged until
 * close). `label` names the buffer in error messages (NULL: "<memory>"). This is the entry point
 * for fuzzing the parser. */
cm_status cm_safetensors_open_memory(const void *data, size_t len, const char *label, cm_safetensors **out);

/* Unmaps and frees. NULL is a no-op. Every cm_st_tensor pointer of the file dies with it. */
void cm_safetensors_close(cm_safetensors *st);

/* The path (or label) the file was opened with. */
const char *cm_safetensors_path(const cm_safetensors *st);
/* The header length N (bytes, including padding) and the total file length. */
uint64_t cm_safetensors_header_len(const cm_safetensors *st);
size_t cm_safetensors_file_len(const cm_safetensors *st);

/* The number of tensors, and tensor i in file order (by data offset; ties, which only zero-size
 * tensors can have, in header order). NULL if i is out of range. */
size_t cm_safetensors_count(const cm_safetensors *st);
const cm_st_tensor *cm_safetensors_at(const cm_safetensors *st, size_t i);
/* Tensor i in name order (byte-wise ascending), for sorted listings. NULL if out of range. */
const cm_st_tensor *cm_safetensors_at_sorted(const cm_safetensors *st, size_t i);

/* The tensor called `name` (binary search), or NULL with CM_ERR_NOT_FOUND recorded (the message
 * names the file and the tensor). */
const cm_st_tensor *cm_safetensors_find(const cm_safetensors *st, const char *name);

/* The "__metadata__" map: whether the header had one (an empty `{}` counts; `null` does not), the
 * number of entries, entry i in header order, and lookup by key (NULL if absent; no error set).
 * Strings are UTF-8, NUL-terminated, valid until close. */
bool cm_safetensors_has_metadata(const cm_safetensors *st);
size_t cm_safetensors_metadata_count(const cm_safetensors *st);
cm_status cm_safetensors_metadata_at(const cm_safetensors *st, size_t i, const char **key, const char **value);
const char *cm_safetensors_metadata_get(const cm_safetensors *st, const char *key);

/* Loads tensor `name` into a new contiguous, aligned tensor of dtype `dt` (owned by the caller;
 * free with cm_tensor_free). Conversions:
 *   - the same bytes (F32→f32, BF16→bf16, F16→f16, I32→i32, I64→i64, U8→u8): copied;
 *   - floating (F64, F32, F16, BF16, F8_E4M3, F8_E5M2) → floating (f32, bf16, f16): rounded to
 *     nearest even (F64 goes through f32 first, so F64→bf16/f16 may round twice; the F8 types are
 *     torch's float8_e4m3fn and float8_e5m2);
 *   - integer or BOOL (BOOL, U8, I8, I16, U16, I32, U32, I64, U64) → integer (i32, i64, u8):
 *     exact, else CM_ERR_INVALID_ARG naming the first element out of range; BOOL reads as 0/1;
 *   - integer or BOOL → floating: converted as by C (exact up to 2^24 for f32).
 * Errors: CM_ERR_NOT_FOUND (no such tensor), CM_ERR_DTYPE (floating → integer, which would
 * truncate, and the dtypes with no conversion: F8_E8M0, the FNUZ F8s, F6_*, F4, C64), CM_ERR_SHAPE (more than
 * CM_MAX_DIMS dims), CM_ERR_INVALID_ARG (value out of range), CM_ERR_OOM. Thread-safe. */
cm_status cm_safetensors_load(const cm_safetensors *st, const char *name, cm_dtype dt, cm_tensor **out);

/* Copies tensor `name` into an existing contiguous tensor `dst` of the same shape, converting to
 * dst's dtype as cm_safetensors_load does. Errors as cm_safetensors_load, plus CM_ERR_SHAPE (shape
 * differs: both shapes named) and CM_ERR_INVALID_ARG (dst not contiguous). On error dst may be
 * partly written. Thread-safe for distinct dst. */
cm_status cm_safetensors_copy(const cm_safetensors *st, const char *name, cm_tensor *dst);

/* ---------------------------------------------------------------------------------------------
 * Writer
 * ------------------------------------------------------------------------------------------- */

typedef struct cm_safetensors_writer cm_safetensors_writer;

/* An empty writer (no tensors, no metadata). Errors: CM_ERR_OOM. */
cm_status cm_safetensors_writer_new(cm_safetensors_writer **out);
/* Frees the writer and its copies of names and shapes (never the tensors). NULL is a no-op. */
void cm_safetensors_writer_free(cm_safetensors_writer *w);

/* Adds a "__metadata__" entry (both strings copied; valid UTF-8 without U+0000). The header
 * carries a "__metadata__" object exactly when at least one entry was added; entries are written
 * in the order added (the reference's order is a hash map's, so readers must not rely on it).
 * Errors: CM_ERR_INVALID_ARG (key already added, invalid UTF-8), CM_ERR_OOM. */
cm_status cm_safetensors_writer_add_metadata(cm_safetensors_writer *w, const char *key, const char *value);

/* Adds a tensor under `name` (copied; valid UTF-8, not "__metadata__", no U+0000). The tensor is
 * borrowed: it must stay alive and unchanged until the write (or until the writer is freed), so a
 * checkpoint does not copy its weights. It must be contiguous (use cm_contiguous on a view). A
 * tensor on a GPU is copied to host memory here (the writer keeps the copy until it is freed, so
 * later changes to the GPU tensor are not written).
 * Errors: CM_ERR_INVALID_ARG (bad name, non-contiguous tensor), CM_ERR_OOM, the device's errors
 * copying a GPU tensor. A name added twice is reported by the write (CM_ERR_INVALID_ARG). */
cm_status cm_safetensors_writer_add(cm_safetensors_writer *w, const char *name, const cm_tensor *t);

/* Adds raw bytes as a tensor of any safetensors dtype: `ndim` dims from `shape` (copied; ndim 0
 * is a scalar), `nbytes` bytes at `data` (borrowed like a tensor; any alignment; may be NULL when
 * nbytes is 0). Errors: CM_ERR_INVALID_ARG (bad name or dtype, negative dim, nbytes not equal to
 * the size the dtype and shape need, a packed tensor whose bits are not a multiple of 8), CM_ERR_OOM. */
cm_status cm_safetensors_writer_add_raw(cm_safetensors_writer *w, const char *name, cm_st_dtype dt, int ndim,
                                        const int64_t *shape, const void *data, size_t nbytes);

/* The number of bytes the file will have. */
size_t cm_safetensors_writer_size(const cm_safetensors_writer *w);

/* Writes the file at `path` atomically: a temporary file next to it ("<path>.tmp-<pid>-<n>") is
 * written, fsync'ed, renamed over `path`, and the folder is fsync'ed. On any error the temporary
 * file is removed and `path` is left as it was. The writer stays usable (write again elsewhere).
 * Errors: CM_ERR_INVALID_ARG (a name added twice), CM_ERR_IO (the message names the path, the
 * failing step and the system's reason: missing or unwritable folder, full disk...), CM_ERR_OOM. */
cm_status cm_safetensors_writer_write(const cm_safetensors_writer *w, const char *path);

/* Serializes into a new buffer (*out, *len; free with cm_free). Errors as above, without I/O. */
cm_status cm_safetensors_writer_serialize(const cm_safetensors_writer *w, void **out, size_t *len);

/* ---------------------------------------------------------------------------------------------
 * Sharded checkpoints (Hugging Face): model-0000k-of-0000N.safetensors + an index JSON
 * {"metadata": {...}, "weight_map": {"<tensor name>": "<shard file name>", ...}}
 * ------------------------------------------------------------------------------------------- */

typedef struct cm_safetensors_index cm_safetensors_index;

/* Opens a checkpoint. `path` is the index JSON file itself, or a folder holding
 * "model.safetensors.index.json" — or, when that is absent, a single "model.safetensors", which is
 * then the one shard. Shard files are named relative to the index's folder; they are opened (and
 * fully validated) on first use, not here. Errors: CM_ERR_IO (cannot read), CM_ERR_NOT_FOUND
 * (folder with neither file: both names given), CM_ERR_FORMAT (not JSON, no "weight_map" object,
 * a non-string file name, a file name that is absolute or contains "..", a tensor listed twice),
 * CM_ERR_OOM. Free with cm_safetensors_index_close. */
cm_status cm_safetensors_index_open(const char *path, cm_safetensors_index **out);
/* Closes every shard opened so far. NULL is a no-op. */
void cm_safetensors_index_close(cm_safetensors_index *idx);

/* The number of tensors in the weight map, and name i / its shard's file name in name order
 * (NULL if out of range). Borrowed until close. */
size_t cm_safetensors_index_count(const cm_safetensors_index *idx);
const char *cm_safetensors_index_name(const cm_safetensors_index *idx, size_t i);
const char *cm_safetensors_index_file(const cm_safetensors_index *idx, size_t i);

/* Finds tensor `name`: opens its shard if not yet open, and returns the shard (*file, may be NULL)
 * and the tensor (*t, may be NULL), both borrowed until cm_safetensors_index_close. Errors:
 * CM_ERR_NOT_FOUND (not in the weight map), the shard's open errors (prefixed with the index path,
 * the shard file and the tensor), CM_ERR_FORMAT (the shard lacks a tensor the map assigns to it).
 * Thread-safe. */
cm_status cm_safetensors_index_find(cm_safetensors_index *idx, const char *name, const cm_safetensors **file,
                                    const cm_st_tensor **t);

/* cm_safetensors_index_find, then cm_safetensors_load. Thread-safe. */
cm_status cm_safetensors_index_load(cm_safetensors_index *idx, const char *name, cm_dtype dt, cm_tensor **out);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_SAFETENSORS_H */
