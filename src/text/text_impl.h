/* Private: the tokenizer object and the small containers the tokenizers share (a growable buffer,
 * a string -> int32 hash map, a u64 -> (int32, int32) hash map). */
#ifndef CM_TEXT_IMPL_H
#define CM_TEXT_IMPL_H

#include <composer/tokenizer.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- growable byte buffer (cm_alloc'ed) ---- */
typedef struct cm_buf {
    uint8_t *p;
    size_t n, cap;
} cm_buf;
/* Ensures room for `extra` more bytes; CM_ERR_OOM on failure (the buffer is unchanged). */
cm_status cm_buf_reserve(cm_buf *b, size_t extra);
cm_status cm_buf_append(cm_buf *b, const void *data, size_t n);
void cm_buf_deinit(cm_buf *b);

/* ---- string -> int32 (open addressing; keys copied into an owned pool) ---- */
typedef struct cm_strmap_slot {
    uint64_t hash;
    uint32_t off, len;
    int32_t value;
    uint32_t used;
} cm_strmap_slot;
typedef struct cm_strmap {
    cm_strmap_slot *slots;
    size_t cap, count; /* cap a power of two */
    cm_buf keys;
} cm_strmap;
cm_status cm_strmap_init(cm_strmap *m, size_t expected);
/* Inserts key -> value. If the key exists, leaves it and stores its value in *existing (if
 * non-NULL) and returns CM_OK; *existing = -1 when newly inserted. */
cm_status cm_strmap_put(cm_strmap *m, const void *key, size_t len, int32_t value, int32_t *existing);
int32_t cm_strmap_get(const cm_strmap *m, const void *key, size_t len); /* -1 if absent */
void cm_strmap_deinit(cm_strmap *m);

/* ---- u64 -> (a, b) ---- */
typedef struct cm_pairmap_slot {
    uint64_t key; /* UINT64_MAX = empty */
    int32_t a, b;
} cm_pairmap_slot;
typedef struct cm_pairmap {
    cm_pairmap_slot *slots;
    size_t cap, count;
} cm_pairmap;
cm_status cm_pairmap_init(cm_pairmap *m, size_t expected);
cm_status cm_pairmap_put(cm_pairmap *m, uint64_t key, int32_t a, int32_t b);
const cm_pairmap_slot *cm_pairmap_get(const cm_pairmap *m, uint64_t key); /* NULL if absent */
void cm_pairmap_deinit(cm_pairmap *m);

/* ---- the tokenizer ---- */
struct cm_tokenizer {
    cm_tokenizer_type type;
    int64_t vocab_size;
    int32_t special[CM_TOKEN_SPECIAL_COUNT]; /* -1 where absent */
    /* id -> the token's bytes: tok_bytes.p[tok_start[id], + tok_len[id]) (for GPT-2 the raw bytes,
     * not the byte-alphabet string; for WordPiece the vocab line, "##" included). An id with no
     * token (a gap in encoder.json) has length 0. */
    uint32_t *tok_start, *tok_len; /* (vocab_size) */
    cm_buf tok_bytes;
    cm_strmap vocab;   /* token bytes -> id */
    /* gpt2 */
    cm_pairmap merges;       /* (left id << 32 | right id) -> (rank, merged id) */
    int32_t byte_id[256];    /* id of the single-byte token */
    char *path_a, *path_b;   /* encoder.json / vocab.bpe (gpt2) or vocab.txt (wordpiece), as given */
    /* wordpiece */
    bool lowercase;
    /* char: sorted code points; id = index */
    uint32_t *cps;
    int32_t ascii_id[128]; /* fast path; -1 where absent */
};

/* Allocates a zeroed tokenizer with no specials. */
cm_status cm_tokenizer_alloc_(cm_tokenizer_type type, cm_tokenizer **out);
/* Allocates tok_start/tok_len for vocab_size ids (zeroed). */
cm_status cm_tokenizer_alloc_vocab_(cm_tokenizer *tok, int64_t vocab_size);

/* Growable int32 vector used by the encoders. */
typedef struct cm_ids {
    int32_t *p;
    int64_t n, cap;
} cm_ids;
/* Ensures room for `extra` more ids and that p is non-NULL. */
cm_status cm_ids_reserve(cm_ids *v, int64_t extra);
cm_status cm_ids_push(cm_ids *v, int32_t id);
cm_status cm_ids_append(cm_ids *v, const int32_t *ids, int64_t n);

/* The per-type encoders: append the ids of text[0, len) to out. */
cm_status cm_gpt2_encode_(const cm_tokenizer *tok, const uint8_t *text, size_t len, cm_ids *out);
cm_status cm_wordpiece_encode_(const cm_tokenizer *tok, const uint8_t *text, size_t len, cm_ids *out);
cm_status cm_char_encode_(const cm_tokenizer *tok, const uint8_t *text, size_t len, cm_ids *out);

/* GPT-2 byte-level BPE from an encoder object (token string -> id over GPT-2's byte alphabet) and
 * vocab.bpe text; *_what name them in messages ("GPT-2 encoder.json '<path>'"). Does not take
 * encoder. No paths are set (cm_tokenizer_save needs them). */
struct cJSON;
cm_status cm_gpt2_from_memory_(const struct cJSON *encoder, const char *encoder_what, const uint8_t *merges,
                               size_t merges_len, const char *merges_what, cm_tokenizer **out);
/* GPT-2's bytes_to_unicode: the code point that spells byte b. */
void cm_gpt2_byte_alphabet_(uint32_t byte_to_cp[256]);
/* WordPiece from vocab.txt's text (one token per line); `what` names it in messages ("WordPiece
 * vocab.txt '<path>'"). No path is set. */
cm_status cm_wordpiece_from_memory_(const uint8_t *data, size_t len, const char *what, bool lowercase,
                                    cm_tokenizer **out);

/* A Hugging Face tokenizer.json from memory (the fuzzing entry point of cm_hf_tokenizer_load's
 * tokenizer.json path; `label` names it in messages). */
cm_status cmi_hf_tokenizer_from_json_text(const char *text, size_t len, const char *label, cm_tokenizer **out);

/* The char tokenizer for sorted, distinct code points cps[0, n). */
cm_status cm_char_from_code_points_(const uint32_t *cps, int64_t n, cm_tokenizer **out);

/* Writes data[0, len) to path atomically: a temporary file in the same directory, fsync, rename,
 * fsync of the directory. Errors (CM_ERR_IO) name the path and the system error. */
cm_status cm_write_file_atomic_(const char *path, const void *data, size_t len);
/* The same in steps: open a temporary file next to path, write, then commit (fsync, rename, fsync
 * the directory) or abort (remove the temporary file). Every call names the final path in errors;
 * after a failed write or commit the file is already aborted. */
typedef struct cm_atomic_file {
    int fd;
    char *path, *tmp;
} cm_atomic_file;
cm_status cm_atomic_open_(const char *path, cm_atomic_file *af);
cm_status cm_atomic_write_(cm_atomic_file *af, const void *data, size_t n);
cm_status cm_atomic_commit_(cm_atomic_file *af);
void cm_atomic_abort_(cm_atomic_file *af);

/* A copy of s (cm_alloc'ed), or NULL with CM_ERR_OOM. */
char *cm_strdup_(const char *s);
/* Reads a whole file (cm_alloc'ed, NUL-terminated); errors name the path. `what` says what the
 * file is, for messages ("GPT-2 encoder.json"). */
cm_status cm_read_file_(const char *path, const char *what, uint8_t **data, size_t *len);

#endif
