/* The small containers the tokenizers share: growable buffers, a string -> int32 map and a
 * u64 -> (int32, int32) map, all on cm_alloc so allocation failures are testable. */
#include "text/text_impl.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

cm_status cm_buf_reserve(cm_buf *b, size_t extra) {
    if (b->cap - b->n >= extra) return CM_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap - b->n < extra) cap *= 2;
    uint8_t *p = cm_alloc(cap, 16);
    if (!p) return CM_ERR_OOM;
    if (b->n) memcpy(p, b->p, b->n);
    cm_free(b->p);
    b->p = p;
    b->cap = cap;
    return CM_OK;
}

cm_status cm_buf_append(cm_buf *b, const void *data, size_t n) {
    if (cm_buf_reserve(b, n) != CM_OK) return CM_ERR_OOM;
    if (n) memcpy(b->p + b->n, data, n);
    b->n += n;
    return CM_OK;
}

void cm_buf_deinit(cm_buf *b) {
    cm_free(b->p);
    memset(b, 0, sizeof *b);
}

cm_status cm_ids_push(cm_ids *v, int32_t id) { return cm_ids_append(v, &id, 1); }

cm_status cm_ids_reserve(cm_ids *v, int64_t extra) {
    if (v->p && v->cap - v->n >= extra) return CM_OK;
    int64_t cap = v->cap ? v->cap : 256;
    while (cap - v->n < extra) cap *= 2;
    int32_t *p = cm_alloc((size_t)cap * sizeof(int32_t), 64);
    if (!p) return CM_ERR_OOM;
    if (v->n) memcpy(p, v->p, (size_t)v->n * sizeof(int32_t));
    cm_free(v->p);
    v->p = p;
    v->cap = cap;
    return CM_OK;
}

cm_status cm_ids_append(cm_ids *v, const int32_t *ids, int64_t n) {
    if (cm_ids_reserve(v, n) != CM_OK) return CM_ERR_OOM;
    if (n) memcpy(v->p + v->n, ids, (size_t)n * sizeof(int32_t));
    v->n += n;
    return CM_OK;
}

/* ---- string map ---- */

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

cm_status cm_strmap_init(cm_strmap *m, size_t expected) {
    memset(m, 0, sizeof *m);
    m->cap = pow2_at_least(expected * 2);
    m->slots = cm_alloc_zeroed(m->cap * sizeof(cm_strmap_slot), 64);
    return m->slots ? CM_OK : CM_ERR_OOM;
}

static cm_strmap_slot *strmap_find(const cm_strmap *m, const void *key, size_t len, uint64_t h) {
    size_t mask = m->cap - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        cm_strmap_slot *s = &m->slots[i];
        if (!s->used) return s;
        if (s->hash == h && s->len == len && memcmp(m->keys.p + s->off, key, len) == 0) return s;
    }
}

static cm_status strmap_grow(cm_strmap *m) {
    size_t cap = m->cap * 2;
    cm_strmap_slot *slots = cm_alloc_zeroed(cap * sizeof(cm_strmap_slot), 64);
    if (!slots) return CM_ERR_OOM;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].used) continue;
        size_t j = (size_t)m->slots[i].hash & (cap - 1);
        while (slots[j].used) j = (j + 1) & (cap - 1);
        slots[j] = m->slots[i];
    }
    cm_free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return CM_OK;
}

cm_status cm_strmap_put(cm_strmap *m, const void *key, size_t len, int32_t value, int32_t *existing) {
    if ((m->count + 1) * 2 > m->cap && strmap_grow(m) != CM_OK) return CM_ERR_OOM;
    uint64_t h = cm_hash64(key, len, 0);
    cm_strmap_slot *s = strmap_find(m, key, len, h);
    if (s->used) {
        if (existing) *existing = s->value;
        return CM_OK;
    }
    if (len > UINT32_MAX || m->keys.n > UINT32_MAX - len)
        return cm_set_error(CM_ERR_INVALID_ARG, "string map: keys exceed 4 GiB");
    uint32_t off = (uint32_t)m->keys.n;
    if (cm_buf_append(&m->keys, key, len) != CM_OK) return CM_ERR_OOM;
    s->hash = h;
    s->off = off;
    s->len = (uint32_t)len;
    s->value = value;
    s->used = 1;
    m->count++;
    if (existing) *existing = -1;
    return CM_OK;
}

int32_t cm_strmap_get(const cm_strmap *m, const void *key, size_t len) {
    if (!m->slots) return -1;
    const cm_strmap_slot *s = strmap_find(m, key, len, cm_hash64(key, len, 0));
    return s->used ? s->value : -1;
}

void cm_strmap_deinit(cm_strmap *m) {
    cm_free(m->slots);
    cm_buf_deinit(&m->keys);
    memset(m, 0, sizeof *m);
}

/* ---- pair map ---- */

static inline size_t pair_hash(uint64_t k) { return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 17); }

cm_status cm_pairmap_init(cm_pairmap *m, size_t expected) {
    m->cap = pow2_at_least(expected * 2);
    m->count = 0;
    m->slots = cm_alloc(m->cap * sizeof(cm_pairmap_slot), 64);
    if (!m->slots) return CM_ERR_OOM;
    for (size_t i = 0; i < m->cap; i++) m->slots[i].key = UINT64_MAX;
    return CM_OK;
}

cm_status cm_pairmap_put(cm_pairmap *m, uint64_t key, int32_t a, int32_t b) {
    if ((m->count + 1) * 2 > m->cap) {
        cm_pairmap bigger;
        if (cm_pairmap_init(&bigger, m->cap) != CM_OK) return CM_ERR_OOM;
        for (size_t i = 0; i < m->cap; i++)
            if (m->slots[i].key != UINT64_MAX) cm_pairmap_put(&bigger, m->slots[i].key, m->slots[i].a, m->slots[i].b);
        cm_free(m->slots);
        *m = bigger;
    }
    size_t mask = m->cap - 1;
    for (size_t i = pair_hash(key) & mask;; i = (i + 1) & mask) {
        cm_pairmap_slot *s = &m->slots[i];
        if (s->key == key) return CM_OK; /* first (lowest rank) wins */
        if (s->key == UINT64_MAX) {
            s->key = key;
            s->a = a;
            s->b = b;
            m->count++;
            return CM_OK;
        }
    }
}

const cm_pairmap_slot *cm_pairmap_get(const cm_pairmap *m, uint64_t key) {
    size_t mask = m->cap - 1;
    for (size_t i = pair_hash(key) & mask;; i = (i + 1) & mask) {
        const cm_pairmap_slot *s = &m->slots[i];
        if (s->key == key) return s;
        if (s->key == UINT64_MAX) return NULL;
    }
}

void cm_pairmap_deinit(cm_pairmap *m) {
    cm_free(m->slots);
    memset(m, 0, sizeof *m);
}

/* ---- misc ---- */

char *cm_strdup_(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = cm_alloc(n, 1);
    if (p) memcpy(p, s, n);
    return p;
}

cm_status cm_read_file_(const char *path, const char *what, uint8_t **data, size_t *len) {
    *data = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return cm_set_error(CM_ERR_IO, "cannot open %s '%s': %s", what, path, strerror(errno));
    cm_buf b = {0};
    for (;;) {
        if (cm_buf_reserve(&b, 1 << 16) != CM_OK) {
            fclose(f);
            cm_buf_deinit(&b);
            return CM_ERR_OOM;
        }
        size_t got = fread(b.p + b.n, 1, b.cap - b.n - 1, f);
        b.n += got;
        if (got == 0) break;
    }
    int err = ferror(f) ? errno : 0;
    fclose(f);
    if (err) {
        cm_buf_deinit(&b);
        return cm_set_error(CM_ERR_IO, "cannot read %s '%s': %s", what, path, strerror(err));
    }
    b.p[b.n] = 0; /* reserve kept one spare byte */
    *data = b.p;
    *len = b.n;
    return CM_OK;
}
