/* Private encoders shared by the tracker loggers: a growable byte buffer, protocol buffers written
 * by hand (TensorBoard's Event, W&B's transaction-log Record), JSON text (MLflow and W&B request
 * bodies) and the two CRC-32 variants their files use, all written into cmi_buf (base/buf.h). */
#ifndef CM_LOGGERS_WIRE_H
#define CM_LOGGERS_WIRE_H

#include "base/buf.h"

#include <composer/base.h>

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- protocol buffers (proto3 wire format) ---- */
void cmi_pb_varint(cmi_buf *b, uint64_t v);
void cmi_pb_key(cmi_buf *b, int field, int wire_type);
void cmi_pb_int64(cmi_buf *b, int field, int64_t v); /* varint of the two's complement */
void cmi_pb_double(cmi_buf *b, int field, double v);
void cmi_pb_float(cmi_buf *b, int field, float v);
void cmi_pb_bytes(cmi_buf *b, int field, const void *data, size_t n);
void cmi_pb_string(cmi_buf *b, int field, const char *s);
/* A nested message: begin writes the key and returns where the body starts; end measures the body
 * and slides it to make room for its (minimal) length varint. */
size_t cmi_pb_begin(cmi_buf *b, int field);
void cmi_pb_end(cmi_buf *b, size_t mark);

/* ---- JSON text ---- */
/* A JSON string literal (quoted; control characters, quotes and backslashes escaped; other bytes
 * as they are, so UTF-8 passes through). NULL writes null. */
void cmi_json_str(cmi_buf *b, const char *s);
/* The shortest round-trip decimal of v; NaN and infinities as `nan_style`: 0 = the strings "NaN",
 * "Infinity", "-Infinity" (protobuf JSON, MLflow), 1 = bare NaN / Infinity / -Infinity (Python's
 * json and wandb's simplejsonext). */
void cmi_json_num(cmi_buf *b, double v, int nan_style);
/* An integer as a JSON number. */
void cmi_json_int(cmi_buf *b, int64_t v);

/* ---- checksums ---- */
/* CRC-32C (Castagnoli), continuing from crc (0 to start). crc32c("123456789") = 0xE3069283. */
uint32_t cmi_crc32c(uint32_t crc, const void *data, size_t n);
/* TFRecord's masked CRC: ((c >> 15) | (c << 17)) + 0xA282EAD8. */
uint32_t cmi_crc32c_masked(const void *data, size_t n);

/* ---- interned names: a string -> dense index table (indices 0, 1, 2, ... in first-seen order) ---- */
typedef struct cmi_intern {
    char **names;    /* (n) owned copies */
    int64_t *slots;  /* (cap) open addressing: index + 1, 0 = empty */
    int64_t n, names_cap, cap;
} cmi_intern;
/* The index of s, or -1. */
int64_t cmi_intern_find(const cmi_intern *t, const char *s);
/* The index of s, adding it (*added = true) if new; -1 on OOM. */
int64_t cmi_intern_add(cmi_intern *t, const char *s, bool *added);
void cmi_intern_free(cmi_intern *t);

/* ---- small helpers ---- */
/* Whether `name` matches any of the fnmatch patterns (NULL list = none). */
bool cmi_glob_any(const char *const *patterns, size_t n, const char *name);
/* Wall-clock time now, in seconds since the epoch (microsecond resolution). */
double cmi_unix_time(void);

#endif
