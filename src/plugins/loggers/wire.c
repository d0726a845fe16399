/* Byte buffers, hand-written protocol buffers, JSON text and CRC-32C for the tracker loggers. */
#include "wire.h"

#include <composer/report.h>

#include <fnmatch.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>

/* ---- protocol buffers ---- */

void cmi_pb_varint(cmi_buf *b, uint64_t v) {
    uint8_t t[10];
    int k = 0;
    do {
        t[k++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    cmi_buf_put(b, t, (size_t)k);
}

void cmi_pb_key(cmi_buf *b, int field, int wire_type) { cmi_pb_varint(b, ((uint64_t)field << 3) | (uint64_t)wire_type); }

void cmi_pb_int64(cmi_buf *b, int field, int64_t v) {
    cmi_pb_key(b, field, 0);
    cmi_pb_varint(b, (uint64_t)v);
}

void cmi_pb_double(cmi_buf *b, int field, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    uint8_t t[8];
    for (int i = 0; i < 8; i++) t[i] = (uint8_t)(u >> (8 * i));
    cmi_pb_key(b, field, 1);
    cmi_buf_put(b, t, 8);
}

void cmi_pb_float(cmi_buf *b, int field, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    uint8_t t[4] = {(uint8_t)u, (uint8_t)(u >> 8), (uint8_t)(u >> 16), (uint8_t)(u >> 24)};
    cmi_pb_key(b, field, 5);
    cmi_buf_put(b, t, 4);
}

void cmi_pb_bytes(cmi_buf *b, int field, const void *data, size_t n) {
    cmi_pb_key(b, field, 2);
    cmi_pb_varint(b, n);
    cmi_buf_put(b, data, n);
}

void cmi_pb_string(cmi_buf *b, int field, const char *s) { cmi_pb_bytes(b, field, s, strlen(s)); }

size_t cmi_pb_begin(cmi_buf *b, int field) {
    cmi_pb_key(b, field, 2);
    return b->n;
}

void cmi_pb_end(cmi_buf *b, size_t mark) {
    if (b->oom) return;
    const size_t len = b->n - mark;
    uint8_t t[10];
    int k = 0;
    uint64_t v = len;
    do {
        t[k++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    if (!cmi_buf_reserve(b, (size_t)k)) return;
    memmove(b->p + mark + k, b->p + mark, len);
    memcpy(b->p + mark, t, (size_t)k);
    b->n += (size_t)k;
}

/* ---- JSON ---- */

void cmi_json_str(cmi_buf *b, const char *s) {
    if (!s) {
        cmi_buf_puts(b, "null");
        return;
    }
    cmi_buf_putc(b, '"');
    const char *run = s;
    for (const char *c = s;; c++) {
        const unsigned char u = (unsigned char)*c;
        if (u && u >= 0x20 && u != '"' && u != '\\') continue;
        cmi_buf_put(b, run, (size_t)(c - run));
        if (!u) break;
        switch (u) {
        case '"': cmi_buf_puts(b, "\\\""); break;
        case '\\': cmi_buf_puts(b, "\\\\"); break;
        case '\n': cmi_buf_puts(b, "\\n"); break;
        case '\r': cmi_buf_puts(b, "\\r"); break;
        case '\t': cmi_buf_puts(b, "\\t"); break;
        default: cmi_buf_printf(b, "\\u%04x", u); break;
        }
        run = c + 1;
    }
    cmi_buf_putc(b, '"');
}

void cmi_json_num(cmi_buf *b, double v, int nan_style) {
    if (!isfinite(v)) {
        const char *s = isnan(v) ? "NaN" : v > 0 ? "Infinity" : "-Infinity";
        if (nan_style == 0) cmi_json_str(b, s);
        else cmi_buf_puts(b, s);
        return;
    }
    char t[48];
    cm_format_double_shortest(v, t, sizeof t);
    cmi_buf_puts(b, t);
}

void cmi_json_int(cmi_buf *b, int64_t v) { cmi_buf_printf(b, "%lld", (long long)v); }

/* ---- CRC-32C ---- */

static uint32_t g_crc_table[256];
static pthread_once_t g_crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        g_crc_table[i] = c;
    }
}

uint32_t cmi_crc32c(uint32_t crc, const void *data, size_t n) {
    pthread_once(&g_crc_once, crc_init);
    const uint8_t *p = data;
    uint32_t c = ~crc;
    for (size_t i = 0; i < n; i++) c = g_crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return ~c;
}

uint32_t cmi_crc32c_masked(const void *data, size_t n) {
    const uint32_t c = cmi_crc32c(0, data, n);
    return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

/* ---- interned names ---- */

static uint64_t str_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

int64_t cmi_intern_find(const cmi_intern *t, const char *s) {
    if (!t->cap) return -1;
    for (uint64_t i = str_hash(s) & (uint64_t)(t->cap - 1);; i = (i + 1) & (uint64_t)(t->cap - 1)) {
        const int64_t k = t->slots[i];
        if (!k) return -1;
        if (strcmp(t->names[k - 1], s) == 0) return k - 1;
    }
}

int64_t cmi_intern_add(cmi_intern *t, const char *s, bool *added) {
    *added = false;
    int64_t k = cmi_intern_find(t, s);
    if (k >= 0) return k;
    if (2 * (t->n + 1) > t->cap) { /* keep the table at most half full */
        const int64_t cap = t->cap ? 2 * t->cap : 64;
        int64_t *slots = cm_alloc_zeroed(sizeof *slots * (size_t)cap, 16);
        if (!slots) return -1;
        for (int64_t j = 0; j < t->n; j++) {
            uint64_t i = str_hash(t->names[j]) & (uint64_t)(cap - 1);
            while (slots[i]) i = (i + 1) & (uint64_t)(cap - 1);
            slots[i] = j + 1;
        }
        cm_free(t->slots);
        t->slots = slots, t->cap = cap;
    }
    if (t->n == t->names_cap) {
        const int64_t nc = t->names_cap ? 2 * t->names_cap : 32;
        char **nn = cm_alloc(sizeof *nn * (size_t)nc, 16);
        if (!nn) return -1;
        if (t->n) memcpy(nn, t->names, sizeof *nn * (size_t)t->n);
        cm_free(t->names);
        t->names = nn, t->names_cap = nc;
    }
    const size_t len = strlen(s) + 1;
    char *copy = cm_alloc(len, 8);
    if (!copy) return -1;
    memcpy(copy, s, len);
    uint64_t i = str_hash(s) & (uint64_t)(t->cap - 1);
    while (t->slots[i]) i = (i + 1) & (uint64_t)(t->cap - 1);
    t->names[t->n] = copy;
    t->slots[i] = ++t->n;
    *added = true;
    return t->n - 1;
}

void cmi_intern_free(cmi_intern *t) {
    for (int64_t i = 0; i < t->n; i++) cm_free(t->names[i]);
    cm_free(t->names), cm_free(t->slots);
    *t = (cmi_intern){0};
}

/* ---- helpers ---- */

bool cmi_glob_any(const char *const *patterns, size_t n, const char *name) {
    for (size_t i = 0; patterns && i < n; i++)
        if (patterns[i] && fnmatch(patterns[i], name, 0) == 0) return true;
    return false;
}

double cmi_unix_time(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
}
