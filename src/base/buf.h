/* A growable byte buffer (private; shared by the MDS writer, the streaming dataset and the tracker
 * loggers' encoders). Memory comes from cm_alloc. A buffer that could not grow sets `oom` and
 * ignores further writes, so a writer checks once at the end. Zero-initialise to start. */
#ifndef CM_BASE_BUF_H
#define CM_BASE_BUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cmi_buf {
    uint8_t *p; /* the bytes; NUL-terminated when read as text (cmi_buf_str) */
    size_t n, cap;
    bool oom;   /* sticky: a failed append leaves the contents as they were and sets this */
} cmi_buf;

/* Room for `extra` more bytes (and a NUL) without another allocation; false (and oom set) if the
 * memory is not there. */
bool cmi_buf_reserve(cmi_buf *b, size_t extra);
void cmi_buf_put(cmi_buf *b, const void *data, size_t n);
void cmi_buf_putc(cmi_buf *b, int c);
void cmi_buf_puts(cmi_buf *b, const char *s);
void cmi_buf_printf(cmi_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cmi_buf_u32(cmi_buf *b, uint32_t v); /* little-endian on the hosts we build for */
/* The contents as a C string (a NUL kept after the last byte; "" for an empty buffer). */
const char *cmi_buf_str(cmi_buf *b);
void cmi_buf_reset(cmi_buf *b); /* n = 0, oom cleared, storage kept */
void cmi_buf_free(cmi_buf *b);

#endif
