/* Private helpers shared by the safetensors reader, writer and index. */
#ifndef CM_SAFETENSORS_IMPL_H
#define CM_SAFETENSORS_IMPL_H

#include <composer/safetensors.h>

#include <stddef.h>
#include <stdint.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors: the library supports little-endian hosts only"
#endif

/* True when s[0..n) is valid UTF-8 as Rust's str::from_utf8 defines it (no overlong forms, no
 * surrogates, nothing above U+10FFFF). On failure *bad is the offset of the first bad byte. */
bool cm_st_utf8_valid(const unsigned char *s, size_t n, size_t *bad);

/* A growable byte buffer over cm_alloc (the allocator hook has no realloc). */
typedef struct cm_st_buf {
    unsigned char *p;
    size_t len, cap;
} cm_st_buf;

/* Makes room for `more` bytes; CM_ERR_OOM (recorded) on failure, the buffer unchanged. */
cm_status cm_st_buf_reserve(cm_st_buf *b, size_t more);
cm_status cm_st_buf_put(cm_st_buf *b, const void *data, size_t n);
void cm_st_buf_free(cm_st_buf *b);

/* The byte size of `numel` elements of dt: false on overflow or when the bit count is not a
 * multiple of 8 (*why: "overflow" or "bits"). */
bool cm_st_nbytes(cm_st_dtype dt, uint64_t numel, uint64_t *nbytes, const char **why);

/* A copy of s made with cm_alloc (NULL and CM_ERR_OOM on failure). */
char *cm_st_strdup(const char *s);

#endif
