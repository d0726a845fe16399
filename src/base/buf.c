/* The growable byte buffer of buf.h. */
#include "buf.h"

#include <composer/base.h>

#include <stdarg.h>

#include <stdio.h>
#include <string.h>

bool cmi_buf_reserve(cmi_buf *b, size_t extra) {
    if (b->oom) return false;
    size_t need = b->n + extra + 1; /* + 1: room for the NUL of cmi_buf_str */
    if (need <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap *= 2;
    uint8_t *p = cm_alloc(cap, 16);
    if (!p) {
        b->oom = true;
        return false;
    }
    if (b->n) memcpy(p, b->p, b->n);
    cm_free(b->p);
    b->p = p;
    b->cap = cap;
    return true;
}

void cmi_buf_put(cmi_buf *b, const void *data, size_t n) {
    if (!n || !cmi_buf_reserve(b, n)) return;
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

void cmi_buf_putc(cmi_buf *b, int c) {
    uint8_t x = (uint8_t)c;
    cmi_buf_put(b, &x, 1);
}

void cmi_buf_puts(cmi_buf *b, const char *s) { cmi_buf_put(b, s, strlen(s)); }

void cmi_buf_printf(cmi_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int k = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if ((size_t)k < sizeof small) {
        cmi_buf_put(b, small, (size_t)k);
        return;
    }
    if (!cmi_buf_reserve(b, (size_t)k)) return;
    va_start(ap, fmt);
    vsnprintf((char *)b->p + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

const char *cmi_buf_str(cmi_buf *b) {
    if (!b->p && !cmi_buf_reserve(b, 0)) return "";
    if (b->oom) return "";
    b->p[b->n] = '\0';
    return (const char *)b->p;
}

void cmi_buf_reset(cmi_buf *b) {
    b->n = 0;
    b->oom = false;
}

void cmi_buf_free(cmi_buf *b) {
    cm_free(b->p);
    *b = (cmi_buf){0};
}

void cmi_buf_u32(cmi_buf *b, uint32_t v) { cmi_buf_put(b, &v, 4); }
