/* The safetensors reader: mmap, a strict JSON parser for the header, and the validation rules of
 * FORMATS.md §4.2; loading tensors into cm_tensors with dtype conversion.
 *
 * Why a parser of our own rather than cJSON for the header: the rules need things cJSON does not
 * give — duplicate keys must be rejected (cJSON keeps both), offsets and dims are u64 and must be
 * exact (cJSON stores doubles: 2^53 + 1 would silently become 2^53), "1.5" or "-3" or "1e3" must not
 * pass as a size, and strings must be decoded strictly (lone surrogates, raw control characters).
 * The header grammar is tiny, so one pass over the bytes checks all of it and builds the entries
 * directly, with no intermediate tree. cJSON is used for the index JSON (safetensors_index.c),
 * which has none of these needs. */
#define _GNU_SOURCE /* qsort_r */
#include "io/safetensors_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER 100000000ull /* the reference's MAX_HEADER_SIZE */
#define ST_MAX_DEPTH 128           /* serde_json's recursion limit */
#define ST_NAME_SHOWN 160          /* bytes of a name shown in a message */

struct cm_safetensors {
    char *path;
    const unsigned char *base; /* the whole file */
    size_t len;
    void *map; /* non-NULL when we mapped it */
    uint64_t hlen;
    size_t n;
    cm_st_tensor *t; /* file (offset) order */
    size_t *by_name; /* indices into t, sorted by name */
    bool has_meta;
    size_t n_meta;
    const char **meta; /* 2 * n_meta: key, value, in header order */
    cm_st_buf str;     /* decoded strings, NUL-terminated */
    cm_st_buf shapes;  /* int64_t dims */
};

/* ---------------------------------------------------------------------------------------------
 * Parser
 * ------------------------------------------------------------------------------------------- */

typedef struct raw_ent {
    size_t name_off, shape_off, order;
    cm_st_dtype dt;
    int ndim;
    uint64_t begin, end;
} raw_ent;

typedef struct parser {
    const unsigned char *s; /* the header */
    size_t n, i;
    const char *file;
    cm_st_buf str, shapes, ents, meta; /* meta: size_t pairs (key offset, value offset) */
    bool has_meta, seen_meta;
    int depth;
} parser;

/* A name for a message: the first ST_NAME_SHOWN bytes, with "..." when cut. */
static const char *shown(const char *name, char *buf, size_t cap) {
    size_t n = strlen(name);
    if (n < cap) return name;
    snprintf(buf, cap, "%.*s...", (int)(cap - 4), name);
    return buf;
}

static const char *pstr(const parser *p, size_t off) { return (const char *)p->str.p + off; }

/* A header error: the file, where in the file, which tensor (if any), what is wrong. */
__attribute__((format(printf, 3, 4))) static cm_status herr(const parser *p, const char *tensor, const char *fmt,
                                                            ...) {
    char msg[768], nb[ST_NAME_SHOWN + 4];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (tensor)
        return cm_set_error(CM_ERR_FORMAT, "safetensors '%s': bad header (at file byte %zu): tensor '%s': %s", p->file,
                            p->i + 8, shown(tensor, nb, sizeof nb), msg);
    return cm_set_error(CM_ERR_FORMAT, "safetensors '%s': bad header (at file byte %zu): %s", p->file, p->i + 8, msg);
}

static void ws(parser *p) {
    while (p->i < p->n) {
        unsigned char c = p->s[p->i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->i++;
    }
}

/* What is at the cursor, for messages. */
static const char *found(const parser *p, char *buf, size_t cap) {
    if (p->i >= p->n) return "the end of the header";
    unsigned char c = p->s[p->i];
    if (c >= 0x21 && c < 0x7f) snprintf(buf, cap, "'%c'", c);
    else snprintf(buf, cap, "byte 0x%02x", c);
    return buf;
}

static cm_status expect(parser *p, char c, const char *tensor, const char *what) {
    ws(p);
    if (p->i < p->n && p->s[p->i] == (unsigned char)c) {
        p->i++;
        return CM_OK;
    }
    char fb[16];
    return herr(p, tensor, "expected %s, found %s", what, found(p, fb, sizeof fb));
}

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool hex4(parser *p, unsigned *cp) {
    if (p->n - p->i < 4) return false;
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(p->s[p->i + (size_t)k]);
        if (h < 0) return false;
        v = v * 16 + (unsigned)h;
    }
    p->i += 4;
    *cp = v;
    return true;
}

/* Decodes the JSON string at the cursor (after optional whitespace) into p->str, NUL-terminated:
 * *off is where it starts, *len its decoded length (it may contain U+0000: strlen differs). */
static cm_status parse_string(parser *p, const char *tensor, size_t *off, size_t *len) {
    ws(p);
    if (p->i >= p->n || p->s[p->i] != '"') {
        char fb[16];
        return herr(p, tensor, "expected a string, found %s", found(p, fb, sizeof fb));
    }
    p->i++;
    *off = p->str.len;
    for (;;) {
        if (p->i >= p->n) return herr(p, tensor, "unterminated string");
        unsigned char c = p->s[p->i];
        if (c == '"') {
            p->i++;
            break;
        }
        if (c < 0x20) return herr(p, tensor, "raw control character 0x%02x in a string (JSON needs it escaped)", c);
        if (c != '\\') {
            size_t j = p->i;
            while (j < p->n && p->s[j] != '"' && p->s[j] != '\\' && p->s[j] >= 0x20) j++;
            if (cm_st_buf_put(&p->str, p->s + p->i, j - p->i) != CM_OK) return CM_ERR_OOM;
            p->i = j;
            continue;
        }
        p->i++;
        if (p->i >= p->n) return herr(p, tensor, "unterminated string");
        unsigned char e = p->s[p->i++], out[4];
        size_t k = 1;
        switch (e) {
        case '"': case '\\': case '/': out[0] = e; break;
        case 'b': out[0] = '\b'; break;
        case 'f': out[0] = '\f'; break;
        case 'n': out[0] = '\n'; break;
        case 'r': out[0] = '\r'; break;
        case 't': out[0] = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            if (!hex4(p, &cp)) return herr(p, tensor, "\\u must be followed by 4 hex digits");
            if (cp >= 0xDC00 && cp <= 0xDFFF) return herr(p, tensor, "lone low surrogate \\u%04X in a string", cp);
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (p->n - p->i < 2 || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u')
                    return herr(p, tensor, "high surrogate \\u%04X not followed by a low surrogate", cp);
                p->i += 2;
                if (!hex4(p, &lo)) return herr(p, tensor, "\\u must be followed by 4 hex digits");
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return herr(p, tensor, "high surrogate \\u%04X followed by \\u%04X, not a low surrogate", cp, lo);
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            if (cp < 0x80) out[0] = (unsigned char)cp;
            else if (cp < 0x800) {
                out[0] = (unsigned char)(0xC0 | (cp >> 6));
                out[1] = (unsigned char)(0x80 | (cp & 0x3F));
                k = 2;
            } else if (cp < 0x10000) {
                out[0] = (unsigned char)(0xE0 | (cp >> 12));
                out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
                out[2] = (unsigned char)(0x80 | (cp & 0x3F));
                k = 3;
            } else {
                out[0] = (unsigned char)(0xF0 | (cp >> 18));
                out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
                out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
                out[3] = (unsigned char)(0x80 | (cp & 0x3F));
                k = 4;
            }
            break;
        }
        default:
            p->i--;
            return herr(p, tensor, "invalid escape '\\%c' in a string", e >= 0x21 && e < 0x7f ? e : '?');
        }
        if (cm_st_buf_put(&p->str, out, k) != CM_OK) return CM_ERR_OOM;
    }
    *len = p->str.len - *off;
    return cm_st_buf_put(&p->str, "", 1);
}

/* A non-negative integer that fits u64, as serde reads usize: digits only, no leading zeros, no
 * sign, fraction or exponent. */
static cm_status parse_u64(parser *p, const char *tensor, const char *field, uint64_t *v) {
    ws(p);
    if (p->i < p->n && p->s[p->i] == '-') return herr(p, tensor, "%s: negative number (must be ≥ 0)", field);
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') {
        char fb[16];
        return herr(p, tensor, "%s: expected a non-negative integer, found %s", field, found(p, fb, sizeof fb));
    }
    if (p->s[p->i] == '0' && p->i + 1 < p->n && p->s[p->i + 1] >= '0' && p->s[p->i + 1] <= '9')
        return herr(p, tensor, "%s: number with a leading zero (not JSON)", field);
    uint64_t x = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        if (__builtin_mul_overflow(x, 10, &x) || __builtin_add_overflow(x, (uint64_t)(p->s[p->i] - '0'), &x))
            return herr(p, tensor, "%s: integer larger than 2^64-1", field);
        p->i++;
    }
    if (p->i < p->n && (p->s[p->i] == '.' || p->s[p->i] == 'e' || p->s[p->i] == 'E'))
        return herr(p, tensor, "%s: must be an integer (no fraction or exponent)", field);
    *v = x;
    return CM_OK;
}

static cm_status skip_value(parser *p, const char *tensor);

static cm_status skip_container(parser *p, const char *tensor, bool object) {
    if (++p->depth > ST_MAX_DEPTH) return herr(p, tensor, "JSON nested more than %d levels deep", ST_MAX_DEPTH);
    p->i++;
    ws(p);
    char close = object ? '}' : ']';
    if (p->i < p->n && p->s[p->i] == (unsigned char)close) {
        p->i++;
        p->depth--;
        return CM_OK;
    }
    for (;;) {
        cm_status s;
        if (object) {
            size_t off, len;
            if ((s = parse_string(p, tensor, &off, &len)) != CM_OK) return s;
            p->str.len = off;
            if ((s = expect(p, ':', tensor, "':'")) != CM_OK) return s;
        }
        if ((s = skip_value(p, tensor)) != CM_OK) return s;
        ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if ((s = expect(p, close, tensor, object ? "',' or '}'" : "',' or ']'")) != CM_OK) return s;
        p->depth--;
        return CM_OK;
    }
}

static bool digit(const parser *p) { return p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9'; }

/* Any JSON value (an unknown field of a tensor entry, which the reference ignores). */
static cm_status skip_value(parser *p, const char *tensor) {
    ws(p);
    char fb[16];
    if (p->i >= p->n) return herr(p, tensor, "expected a value, found the end of the header");
    unsigned char c = p->s[p->i];
    if (c == '{' || c == '[') return skip_container(p, tensor, c == '{');
    if (c == '"') {
        size_t off, len;
        cm_status s = parse_string(p, tensor, &off, &len);
        p->str.len = off;
        return s;
    }
    static const char *const lits[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t l = strlen(lits[k]);
        if (p->n - p->i >= l && memcmp(p->s + p->i, lits[k], l) == 0) {
            p->i += l;
            return CM_OK;
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        if (c == '-') p->i++;
        if (!digit(p)) return herr(p, tensor, "malformed number");
        if (p->s[p->i] == '0') p->i++;
        else
            while (digit(p)) p->i++;
        if (p->i < p->n && p->s[p->i] == '.') {
            p->i++;
            if (!digit(p)) return herr(p, tensor, "malformed number");
            while (digit(p)) p->i++;
        }
        if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
            p->i++;
            if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
            if (!digit(p)) return herr(p, tensor, "malformed number");
            while (digit(p)) p->i++;
        }
        return CM_OK;
    }
    return herr(p, tensor, "expected a JSON value, found %s", found(p, fb, sizeof fb));
}

/* "__metadata__": null, or an object of string → string. */
static cm_status parse_metadata(parser *p) {
    cm_status s;
    ws(p);
    if (p->n - p->i >= 4 && memcmp(p->s + p->i, "null", 4) == 0) {
        p->i += 4;
        return CM_OK;
    }
    if (p->i >= p->n || p->s[p->i] != '{')
        return herr(p, NULL, "__metadata__ must be an object mapping strings to strings");
    p->i++;
    p->has_meta = true;
    ws(p);
    if (p->i < p->n && p->s[p->i] == '}') {
        p->i++;
        return CM_OK;
    }
    for (;;) {
        size_t ko, kl, vo, vl;
        char nb[ST_NAME_SHOWN + 4];
        if ((s = parse_string(p, NULL, &ko, &kl)) != CM_OK) return s;
        if ((s = expect(p, ':', NULL, "':'")) != CM_OK) return s;
        ws(p);
        if (p->i >= p->n || p->s[p->i] != '"')
            return herr(p, NULL, "__metadata__ value for key '%s' is not a string (only strings are allowed)",
                        shown(pstr(p, ko), nb, sizeof nb));
        if ((s = parse_string(p, NULL, &vo, &vl)) != CM_OK) return s;
        if (strlen(pstr(p, ko)) != kl || strlen(pstr(p, vo)) != vl)
            return herr(p, NULL, "__metadata__ entry '%s' contains U+0000, which this library does not support",
                        shown(pstr(p, ko), nb, sizeof nb));
        size_t pair[2] = {ko, vo};
        if ((s = cm_st_buf_put(&p->meta, pair, sizeof pair)) != CM_OK) return s;
        ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        return expect(p, '}', NULL, "',' or '}' in __metadata__");
    }
}

/* One tensor entry {"dtype": ..., "shape": [...], "data_offsets": [b, e]} (other fields ignored,
 * as the reference does). The name is at p->str + name_off. */
static cm_status parse_tensor(parser *p, size_t name_off, raw_ent *e) {
    cm_status s;
    char nb[ST_NAME_SHOWN + 4];
    /* The name may move when p->str grows: copy what messages need. */
    char name[ST_NAME_SHOWN + 4];
    snprintf(name, sizeof name, "%s", shown(pstr(p, name_off), nb, sizeof nb));
    ws(p);
    if (p->i >= p->n || p->s[p->i] != '{')
        return herr(p, name, "expected an object {\"dtype\":..,\"shape\":[..],\"data_offsets\":[begin,end]}");
    p->i++;
    bool seen_dt = false, seen_shape = false, seen_off = false;
    ws(p);
    if (p->i < p->n && p->s[p->i] == '}') p->i++;
    else
        for (;;) {
            size_t ko, kl;
            if ((s = parse_string(p, name, &ko, &kl)) != CM_OK) return s;
            if ((s = expect(p, ':', name, "':'")) != CM_OK) return s;
            const char *key = pstr(p, ko);
            if (strcmp(key, "dtype") == 0 && kl == 5) {
                p->str.len = ko;
                if (seen_dt) return herr(p, name, "duplicate key \"dtype\"");
                seen_dt = true;
                size_t vo, vl;
                ws(p);
                if (p->i >= p->n || p->s[p->i] != '"') return herr(p, name, "dtype must be a string such as \"F32\"");
                if ((s = parse_string(p, name, &vo, &vl)) != CM_OK) return s;
                bool ok = strlen(pstr(p, vo)) == vl && cm_st_dtype_parse(pstr(p, vo), &e->dt) == CM_OK;
                if (!ok) {
                    char db[40];
                    snprintf(db, sizeof db, "%.36s", shown(pstr(p, vo), nb, 36));
                    return herr(p, name,
                                "unknown dtype '%s' (known: BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, "
                                "F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, I16, U16, F16, BF16, I32, U32, F32, C64, F64, "
                                "I64, U64)",
                                db);
                }
                p->str.len = vo;
            } else if (strcmp(key, "shape") == 0 && kl == 5) {
                p->str.len = ko;
                if (seen_shape) return herr(p, name, "duplicate key \"shape\"");
                seen_shape = true;
                if ((s = expect(p, '[', name, "'[' starting the shape")) != CM_OK) return s;
                e->shape_off = p->shapes.len / sizeof(int64_t);
                e->ndim = 0;
                ws(p);
                if (p->i < p->n && p->s[p->i] == ']') p->i++;
                else
                    for (;;) {
                        uint64_t d;
                        if ((s = parse_u64(p, name, "shape", &d)) != CM_OK) return s;
                        if (d > (uint64_t)INT64_MAX)
                            return herr(p, name, "shape: dim %llu is larger than 2^63-1, which this library does "
                                                 "not support", (unsigned long long)d);
                        if (e->ndim == 1 << 20) return herr(p, name, "shape: more than 2^20 dims");
                        int64_t di = (int64_t)d;
                        if ((s = cm_st_buf_put(&p->shapes, &di, sizeof di)) != CM_OK) return s;
                        e->ndim++;
                        ws(p);
                        if (p->i < p->n && p->s[p->i] == ',') {
                            p->i++;
                            continue;
                        }
                        if ((s = expect(p, ']', name, "',' or ']' in the shape")) != CM_OK) return s;
                        break;
                    }
            } else if (strcmp(key, "data_offsets") == 0 && kl == 12) {
                p->str.len = ko;
                if (seen_off) return herr(p, name, "duplicate key \"data_offsets\"");
                seen_off = true;
                if ((s = expect(p, '[', name, "'[' starting data_offsets [begin, end]")) != CM_OK) return s;
                if ((s = parse_u64(p, name, "data_offsets", &e->begin)) != CM_OK) return s;
                if ((s = expect(p, ',', name, "',' in data_offsets (it must be [begin, end])")) != CM_OK) return s;
                if ((s = parse_u64(p, name, "data_offsets", &e->end)) != CM_OK) return s;
                if ((s = expect(p, ']', name, "']' after data_offsets [begin, end] (exactly two numbers)")) != CM_OK)
                    return s;
            } else {
                p->str.len = ko;
                if ((s = skip_value(p, name)) != CM_OK) return s;
            }
            ws(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                continue;
            }
            if ((s = expect(p, '}', name, "',' or '}'")) != CM_OK) return s;
            break;
        }
    const char *missing = !seen_dt ? "dtype" : !seen_shape ? "shape" : !seen_off ? "data_offsets" : NULL;
    if (missing) return herr(p, name, "missing field \"%s\"", missing);
    return CM_OK;
}

static cm_status parse_header(parser *p) {
    cm_status s;
    p->i = 1; /* the caller checked the '{' */
    ws(p);
    if (p->i < p->n && p->s[p->i] == '}') p->i++;
    else
        for (;;) {
            size_t ko, kl;
            if ((s = parse_string(p, NULL, &ko, &kl)) != CM_OK) return s;
            if ((s = expect(p, ':', NULL, "':' after a tensor name")) != CM_OK) return s;
            if (kl == 12 && strcmp(pstr(p, ko), "__metadata__") == 0) {
                p->str.len = ko;
                if (p->seen_meta) return herr(p, NULL, "duplicate key \"__metadata__\"");
                p->seen_meta = true;
                if ((s = parse_metadata(p)) != CM_OK) return s;
            } else {
                char nb[ST_NAME_SHOWN + 4];
                if (strlen(pstr(p, ko)) != kl)
                    return herr(p, shown(pstr(p, ko), nb, sizeof nb),
                                "name contains U+0000, which this library does not support");
                raw_ent e = {.name_off = ko, .order = p->ents.len / sizeof(raw_ent)};
                if ((s = parse_tensor(p, ko, &e)) != CM_OK) return s;
                if ((s = cm_st_buf_put(&p->ents, &e, sizeof e)) != CM_OK) return s;
            }
            ws(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                continue;
            }
            if ((s = expect(p, '}', NULL, "',' or '}' after a tensor entry")) != CM_OK) return s;
            break;
        }
    ws(p);
    if (p->i != p->n) {
        char fb[16];
        return herr(p, NULL, "%s after the header's closing '}' (only spaces may pad the header)",
                    found(p, fb, sizeof fb));
    }
    return CM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Open and validate
 * ------------------------------------------------------------------------------------------- */

static int cmp_offsets(const void *a, const void *b, void *ctx) {
    const raw_ent *e = ctx;
    const raw_ent *x = &e[*(const size_t *)a], *y = &e[*(const size_t *)b];
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

static int cmp_names(const void *a, const void *b, void *ctx) {
    const cm_st_tensor *t = ctx;
    return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

static int cmp_meta(const void *a, const void *b, void *ctx) {
    const char **m = ctx;
    return strcmp(m[2 * *(const size_t *)a], m[2 * *(const size_t *)b]);
}

static cm_status ferr(const char *file, const char *tensor, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static cm_status ferr(const char *file, const char *tensor, const char *fmt, ...) {
    char msg[768], nb[ST_NAME_SHOWN + 4];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (tensor)
        return cm_set_error(CM_ERR_FORMAT, "safetensors '%s': tensor '%s': %s", file, shown(tensor, nb, sizeof nb),
                            msg);
    return cm_set_error(CM_ERR_FORMAT, "safetensors '%s': %s", file, msg);
}

static void shape_str(const cm_st_tensor *t, char *buf, size_t cap) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < t->ndim && k < cap; d++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

/* Parses and validates base[0..len) into st (whose path is set). */
static cm_status st_parse(cm_safetensors *st) {
    const char *file = st->path;
    const unsigned char *b = st->base;
    size_t len = st->len;
    if (len < 8)
        return ferr(file, NULL, "file is %zu bytes, too small for the 8-byte header length (HeaderTooSmall)", len);
    uint64_t n = 0;
    for (int k = 7; k >= 0; k--) n = (n << 8) | b[k];
    if (n > ST_MAX_HEADER)
        return ferr(file, NULL, "header length %llu is larger than the limit of %llu bytes (HeaderTooLarge)",
                    (unsigned long long)n, ST_MAX_HEADER);
    if (n > len - 8)
        return ferr(file, NULL,
                    "header length %llu runs past the end of the file (%zu bytes: the file is truncated or not "
                    "safetensors) (InvalidHeaderLength)",
                    (unsigned long long)n, len);
    st->hlen = n;
    size_t bad;
    if (!cm_st_utf8_valid(b + 8, (size_t)n, &bad))
        return ferr(file, NULL, "header is not valid UTF-8 (bad byte 0x%02x at file byte %zu) (InvalidHeader)",
                    b[8 + bad], 8 + bad);
    if (n == 0 || b[8] != '{')
        return ferr(file, NULL, "header does not start with '{' (InvalidHeaderStart)%s",
                    n == 0 ? ": it is empty" : "");

    parser p = {.s = b + 8, .n = (size_t)n, .file = file};
    cm_status s = parse_header(&p);
    size_t ne = p.ents.len / sizeof(raw_ent), nm = p.meta.len / (2 * sizeof(size_t));
    size_t *order = NULL;
    if (s != CM_OK) goto done;

    /* Final arrays: strings and shapes stay in the pools, which st now owns. */
    st->str = p.str;
    st->shapes = p.shapes;
    p.str = (cm_st_buf){0};
    p.shapes = (cm_st_buf){0};
    st->has_meta = p.has_meta;
    st->n = ne;
    st->n_meta = nm;
    size_t cnt = ne > nm ? ne : nm;
    st->t = cm_alloc_zeroed((ne ? ne : 1) * sizeof *st->t, 16);
    st->by_name = cm_alloc((ne ? ne : 1) * sizeof *st->by_name, 16);
    st->meta = cm_alloc((nm ? 2 * nm : 1) * sizeof *st->meta, 16);
    order = cm_alloc((cnt ? cnt : 1) * sizeof *order, 16);
    if (!st->t || !st->by_name || !st->meta || !order) {
        s = CM_ERR_OOM;
        goto done;
    }
    const size_t *mp = (const size_t *)p.meta.p;
    for (size_t k = 0; k < nm; k++) {
        st->meta[2 * k] = (const char *)st->str.p + mp[2 * k];
        st->meta[2 * k + 1] = (const char *)st->str.p + mp[2 * k + 1];
        order[k] = k;
    }
    qsort_r(order, nm, sizeof *order, cmp_meta, st->meta);
    for (size_t k = 1; k < nm; k++) {
        if (strcmp(st->meta[2 * order[k]], st->meta[2 * order[k - 1]]) == 0) {
            char nb[ST_NAME_SHOWN + 4];
            s = ferr(file, NULL, "bad header: duplicate key '%s' in __metadata__",
                     shown(st->meta[2 * order[k]], nb, sizeof nb));
            goto done;
        }
    }

    /* File order: by data_offsets (as the reference sorts before validating). */
    const raw_ent *re = (const raw_ent *)p.ents.p;
    for (size_t k = 0; k < ne; k++) order[k] = k;
    qsort_r(order, ne, sizeof *order, cmp_offsets, (void *)re);
    for (size_t k = 0; k < ne; k++) {
        const raw_ent *e = &re[order[k]];
        cm_st_tensor *t = &st->t[k];
        t->name = (const char *)st->str.p + e->name_off;
        t->dtype = e->dt;
        t->ndim = e->ndim;
        t->shape = e->ndim ? (const int64_t *)st->shapes.p + e->shape_off : NULL;
        t->begin = e->begin;
        t->end = e->end;
        st->by_name[k] = k;
    }
    qsort_r(st->by_name, ne, sizeof *st->by_name, cmp_names, st->t);
    for (size_t k = 1; k < ne; k++) {
        if (strcmp(st->t[st->by_name[k]].name, st->t[st->by_name[k - 1]].name) == 0) {
            s = ferr(file, st->t[st->by_name[k]].name, "bad header: the name appears twice (duplicate key)");
            goto done;
        }
    }

    uint64_t start = 0;
    for (size_t k = 0; k < ne; k++) {
        cm_st_tensor *t = &st->t[k];
        if (t->begin != start || t->end < t->begin) {
            if (t->end < t->begin)
                s = ferr(file, t->name, "data_offsets [%llu, %llu] end before they begin (InvalidOffset)",
                         (unsigned long long)t->begin, (unsigned long long)t->end);
            else if (k == 0)
                s = ferr(file, t->name,
                         "data_offsets [%llu, %llu]: the first tensor must start at 0 (a gap at the start of the "
                         "data) (InvalidOffset)",
                         (unsigned long long)t->begin, (unsigned long long)t->end);
            else if (t->begin > start)
                s = ferr(file, t->name,
                         "data_offsets [%llu, %llu] leave a gap of %llu bytes after tensor '%s', which ends at %llu "
                         "(InvalidOffset)",
                         (unsigned long long)t->begin, (unsigned long long)t->end,
                         (unsigned long long)(t->begin - start), st->t[k - 1].name, (unsigned long long)start);
            else
                s = ferr(file, t->name,
                         "data_offsets [%llu, %llu] overlap tensor '%s', which ends at %llu (InvalidOffset)",
                         (unsigned long long)t->begin, (unsigned long long)t->end, st->t[k - 1].name,
                         (unsigned long long)start);
            goto done;
        }
        start = t->end;
        uint64_t numel = 1, nbytes;
        const char *why = NULL;
        bool ok = true;
        for (int d = 0; d < t->ndim && ok; d++) ok = !__builtin_mul_overflow(numel, (uint64_t)t->shape[d], &numel);
        if (ok) ok = cm_st_nbytes(t->dtype, numel, &nbytes, &why);
        else why = "overflow";
        char sb[200];
        shape_str(t, sb, sizeof sb);
        if (!ok && strcmp(why, "bits") == 0) {
            s = ferr(file, t->name,
                     "%s shape %s has %llu elements of %d bits, not a whole number of bytes (MisalignedSlice)",
                     cm_st_dtype_name(t->dtype), sb, (unsigned long long)numel, cm_st_dtype_bits(t->dtype));
            goto done;
        }
        if (!ok || numel > (uint64_t)INT64_MAX) {
            s = ferr(file, t->name, "%s shape %s: the byte size overflows 64 bits (ValidationOverflow)",
                     cm_st_dtype_name(t->dtype), sb);
            goto done;
        }
        if (t->end - t->begin != nbytes) {
            s = ferr(file, t->name,
                     "data_offsets [%llu, %llu] span %llu bytes but %s shape %s needs %llu bytes (TensorInvalidInfo)",
                     (unsigned long long)t->begin, (unsigned long long)t->end,
                     (unsigned long long)(t->end - t->begin), cm_st_dtype_name(t->dtype), sb,
                     (unsigned long long)nbytes);
            goto done;
        }
        t->numel = (int64_t)numel;
        t->nbytes = (size_t)nbytes;
    }
    uint64_t have = (uint64_t)len - 8 - n;
    if (start != have) {
        if (start > have)
            s = ferr(file, NULL,
                     "file is truncated: the tensors need %llu data bytes (file length %llu) but only %llu are "
                     "there (MetadataIncompleteBuffer)",
                     (unsigned long long)start, (unsigned long long)(8 + n + start), (unsigned long long)have);
        else
            s = ferr(file, NULL,
                     "%llu trailing bytes after the last tensor's data (the data ends at file byte %llu, the file "
                     "at %zu) (MetadataIncompleteBuffer)",
                     (unsigned long long)(have - start), (unsigned long long)(8 + n + start), len);
        goto done;
    }
    for (size_t k = 0; k < ne; k++) st->t[k].data = b + 8 + n + st->t[k].begin;

done:
    cm_free(order);
    cm_st_buf_free(&p.str);
    cm_st_buf_free(&p.shapes);
    cm_st_buf_free(&p.ents);
    cm_st_buf_free(&p.meta);
    return s;
}

static cm_status st_new(const char *label, cm_safetensors **out) {
    cm_safetensors *st = cm_alloc_zeroed(sizeof *st, 16);
    if (!st) return CM_ERR_OOM;
    st->path = cm_st_strdup(label);
    if (!st->path) {
        cm_free(st);
        return CM_ERR_OOM;
    }
    *out = st;
    return CM_OK;
}

void cm_safetensors_close(cm_safetensors *st) {
    if (!st) return;
    if (st->map) munmap(st->map, st->len);
    cm_free(st->t);
    cm_free(st->by_name);
    cm_free(st->meta);
    cm_st_buf_free(&st->str);
    cm_st_buf_free(&st->shapes);
    cm_free(st->path);
    cm_free(st);
}

cm_status cm_safetensors_open_memory(const void *data, size_t len, const char *label, cm_safetensors **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_safetensors_open_memory: out is NULL");
    *out = NULL;
    if (!data && len) return cm_set_error(CM_ERR_INVALID_ARG, "cm_safetensors_open_memory: data is NULL");
    cm_safetensors *st;
    cm_status s = st_new(label ? label : "<memory>", &st);
    if (s != CM_OK) return s;
    st->base = data;
    st->len = len;
    if ((s = st_parse(st)) != CM_OK) {
        cm_safetensors_close(st);
        return s;
    }
    *out = st;
    return CM_OK;
}

cm_status cm_safetensors_open(const char *path, cm_safetensors **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_safetensors_open: out is NULL");
    *out = NULL;
    if (!path) return cm_set_error(CM_ERR_INVALID_ARG, "cm_safetensors_open: path is NULL");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return cm_set_error(CM_ERR_IO, "safetensors '%s': cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return cm_set_error(CM_ERR_IO, "safetensors '%s': cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return cm_set_error(CM_ERR_IO, "safetensors '%s': not a regular file", path);
    }
    cm_safetensors *st;
    cm_status s = st_new(path, &st);
    if (s != CM_OK) {
        close(fd);
        return s;
    }
    st->len = (size_t)sb.st_size;
    if (st->len >= 8) { /* smaller files fail validation with HeaderTooSmall; mmap of 0 bytes is EINVAL */
        void *m = mmap(NULL, st->len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            cm_safetensors_close(st);
            return cm_set_error(CM_ERR_IO, "safetensors '%s': cannot map %zu bytes: %s", path, (size_t)sb.st_size,
                                strerror(e));
        }
        st->map = m;
        st->base = m;
    } else {
        static const unsigned char none[8];
        st->base = none;
    }
    close(fd);
    if ((s = st_parse(st)) != CM_OK) {
        cm_safetensors_close(st);
        return s;
    }
    *out = st;
    return CM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Queries
 * ------------------------------------------------------------------------------------------- */

const char *cm_safetensors_path(const cm_safetensors *st) { return st->path; }
uint64_t cm_safetensors_header_len(const cm_safetensors *st) { return st->hlen; }
size_t cm_safetensors_file_len(const cm_safetensors *st) { return st->len; }
size_t cm_safetensors_count(const cm_safetensors *st) { return st->n; }

const cm_st_tensor *cm_safetensors_at(const cm_safetensors *st, size_t i) { return i < st->n ? &st->t[i] : NULL; }

const cm_st_tensor *cm_safetensors_at_sorted(const cm_safetensors *st, size_t i) {
    return i < st->n ? &st->t[st->by_name[i]] : NULL;
}

const cm_st_tensor *cm_safetensors_find(const cm_safetensors *st, const char *name) {
    size_t lo = 0, hi = st->n;
    while (name && lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, st->t[st->by_name[mid]].name);
        if (c == 0) return &st->t[st->by_name[mid]];
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    char nb[ST_NAME_SHOWN + 4];
    cm_set_error(CM_ERR_NOT_FOUND, "safetensors '%s': no tensor named '%s' (the file has %zu tensors)", st->path,
                 name ? shown(name, nb, sizeof nb) : "(null)", st->n);
    return NULL;
}

bool cm_safetensors_has_metadata(const cm_safetensors *st) { return st->has_meta; }
size_t cm_safetensors_metadata_count(const cm_safetensors *st) { return st->n_meta; }

cm_status cm_safetensors_metadata_at(const cm_safetensors *st, size_t i, const char **key, const char **value) {
    if (i >= st->n_meta)
        return cm_set_error(CM_ERR_INVALID_ARG, "safetensors '%s': metadata index %zu out of range (%zu entries)",
                            st->path, i, st->n_meta);
    if (key) *key = st->meta[2 * i];
    if (value) *value = st->meta[2 * i + 1];
    return CM_OK;
}

const char *cm_safetensors_metadata_get(const cm_safetensors *st, const char *key) {
    for (size_t i = 0; key && i < st->n_meta; i++)
        if (strcmp(st->meta[2 * i], key) == 0) return st->meta[2 * i + 1];
    return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Loading with conversion
 * ------------------------------------------------------------------------------------------- */

static bool st_is_float(cm_st_dtype d) {
    return d == CM_ST_DTYPE_F64 || d == CM_ST_DTYPE_F32 || d == CM_ST_DTYPE_F16 || d == CM_ST_DTYPE_BF16 ||
           d == CM_ST_DTYPE_F8_E4M3 || d == CM_ST_DTYPE_F8_E5M2;
}

/* float8 e4m3fn (torch.float8_e4m3fn): bias 7, no infinities, S.1111.111 is NaN. */
static float f8_e4m3_to_f32(uint8_t b) {
    int e = (b >> 3) & 15, m = b & 7;
    float v;
    if (e == 15 && m == 7) v = NAN;
    else if (e == 0) v = ldexpf((float)m, -9); /* subnormal: m/8 · 2^-6 */
    else v = ldexpf((float)(8 + m), e - 10); /* (1 + m/8) · 2^(e-7) */
    return (b & 0x80) ? -v : v;
}

static bool st_is_int(cm_st_dtype d) {
    switch (d) {
    case CM_ST_DTYPE_BOOL: case CM_ST_DTYPE_U8: case CM_ST_DTYPE_I8: case CM_ST_DTYPE_I16: case CM_ST_DTYPE_U16:
    case CM_ST_DTYPE_I32: case CM_ST_DTYPE_U32: case CM_ST_DTYPE_I64: case CM_ST_DTYPE_U64: return true;
    default: return false;
    }
}

static bool cm_is_float(cm_dtype d) { return d == CM_DTYPE_F32 || d == CM_DTYPE_BF16 || d == CM_DTYPE_F16; }

/* Element i of an integer source as (negative?, magnitude). Unaligned reads via memcpy. */
static void read_int(const unsigned char *src, cm_st_dtype dt, size_t i, bool *neg, uint64_t *mag) {
    int64_t sv = 0;
    uint64_t uv = 0;
    bool is_signed = true;
    switch (dt) {
    case CM_ST_DTYPE_BOOL: is_signed = false; uv = src[i] != 0; break;
    case CM_ST_DTYPE_U8: is_signed = false; uv = src[i]; break;
    case CM_ST_DTYPE_I8: sv = (int8_t)src[i]; break;
    case CM_ST_DTYPE_I16: { int16_t v; memcpy(&v, src + 2 * i, 2); sv = v; break; }
    case CM_ST_DTYPE_U16: { uint16_t v; memcpy(&v, src + 2 * i, 2); is_signed = false; uv = v; break; }
    case CM_ST_DTYPE_I32: { int32_t v; memcpy(&v, src + 4 * i, 4); sv = v; break; }
    case CM_ST_DTYPE_U32: { uint32_t v; memcpy(&v, src + 4 * i, 4); is_signed = false; uv = v; break; }
    case CM_ST_DTYPE_I64: memcpy(&sv, src + 8 * i, 8); break;
    default: memcpy(&uv, src + 8 * i, 8); is_signed = false; break; /* U64 */
    }
    if (is_signed) {
        *neg = sv < 0;
        *mag = sv < 0 ? (uint64_t)0 - (uint64_t)sv : (uint64_t)sv;
    } else {
        *neg = false;
        *mag = uv;
    }
}

static float read_float(const unsigned char *src, cm_st_dtype dt, size_t i) {
    switch (dt) {
    case CM_ST_DTYPE_F64: { double v; memcpy(&v, src + 8 * i, 8); return (float)v; }
    case CM_ST_DTYPE_F32: { float v; memcpy(&v, src + 4 * i, 4); return v; }
    case CM_ST_DTYPE_F16: { uint16_t v; memcpy(&v, src + 2 * i, 2); return cm_f16_to_f32(v); }
    case CM_ST_DTYPE_F8_E4M3: return f8_e4m3_to_f32(src[i]);
    case CM_ST_DTYPE_F8_E5M2: return cm_f16_to_f32((uint16_t)(src[i] << 8)); /* the top byte of an f16 */
    default: { uint16_t v; memcpy(&v, src + 2 * i, 2); return cm_bf16_to_f32(v); } /* BF16 */
    }
}

static void write_float(void *dst, cm_dtype dt, size_t i, float v) {
    if (dt == CM_DTYPE_F32) ((float *)dst)[i] = v;
    else if (dt == CM_DTYPE_BF16) ((uint16_t *)dst)[i] = cm_f32_to_bf16(v);
    else ((uint16_t *)dst)[i] = cm_f32_to_f16(v);
}

/* Converts n elements; `what` names the tensor in messages. */
static cm_status convert(const cm_safetensors *st, const cm_st_tensor *t, void *dst, cm_dtype ddt) {
    const unsigned char *src = t->data;
    size_t n = (size_t)t->numel;
    char nb[ST_NAME_SHOWN + 4];
    const char *name = shown(t->name, nb, sizeof nb);
    cm_dtype same;
    if (cm_st_dtype_to_cm(t->dtype, &same) && same == ddt) {
        if (t->nbytes) memcpy(dst, src, t->nbytes);
        return CM_OK;
    }
    if (st_is_float(t->dtype) && cm_is_float(ddt)) {
        for (size_t i = 0; i < n; i++) write_float(dst, ddt, i, read_float(src, t->dtype, i));
        return CM_OK;
    }
    if (st_is_int(t->dtype) && cm_is_float(ddt)) {
        for (size_t i = 0; i < n; i++) {
            bool neg;
            uint64_t mag;
            read_int(src, t->dtype, i, &neg, &mag);
            write_float(dst, ddt, i, neg ? -(float)mag : (float)mag);
        }
        return CM_OK;
    }
    if (st_is_int(t->dtype) && !cm_is_float(ddt)) {
        uint64_t pmax = ddt == CM_DTYPE_U8 ? 255 : ddt == CM_DTYPE_I32 ? (uint64_t)INT32_MAX : (uint64_t)INT64_MAX;
        uint64_t nmax = ddt == CM_DTYPE_U8 ? 0 : ddt == CM_DTYPE_I32 ? (uint64_t)INT32_MAX + 1 : (uint64_t)INT64_MAX + 1;
        for (size_t i = 0; i < n; i++) {
            bool neg;
            uint64_t mag;
            read_int(src, t->dtype, i, &neg, &mag);
            if (neg ? mag > nmax : mag > pmax)
                return cm_set_error(CM_ERR_INVALID_ARG,
                                    "safetensors '%s': tensor '%s': element %zu (%s%llu) does not fit %s; load it as "
                                    "a wider dtype",
                                    st->path, name, i, neg ? "-" : "", (unsigned long long)mag, cm_dtype_name(ddt));
            int64_t v = neg ? (int64_t)(0 - mag) : (int64_t)mag;
            if (ddt == CM_DTYPE_U8) ((uint8_t *)dst)[i] = (uint8_t)v;
            else if (ddt == CM_DTYPE_I32) ((int32_t *)dst)[i] = (int32_t)v;
            else ((int64_t *)dst)[i] = v;
        }
        return CM_OK;
    }
    if (st_is_float(t->dtype))
        return cm_set_error(CM_ERR_DTYPE,
                            "safetensors '%s': tensor '%s': refusing to convert floating %s to integer %s (it would "
                            "truncate); load it as f32 and use cm_cast",
                            st->path, name, cm_st_dtype_name(t->dtype), cm_dtype_name(ddt));
    return cm_set_error(CM_ERR_DTYPE,
                        "safetensors '%s': tensor '%s': dtype %s has no conversion to %s in this library (its raw "
                        "bytes are at cm_st_tensor.data)",
                        st->path, name, cm_st_dtype_name(t->dtype), cm_dtype_name(ddt));
}

static cm_status check_target(const cm_safetensors *st, const cm_st_tensor *t, cm_dtype dt) {
    char nb[ST_NAME_SHOWN + 4];
    if ((unsigned)dt >= CM_DTYPE_COUNT)
        return cm_set_error(CM_ERR_INVALID_ARG, "safetensors '%s': tensor '%s': target dtype %d is not a cm_dtype",
                            st->path, shown(t->name, nb, sizeof nb), (int)dt);
    if (t->ndim > CM_MAX_DIMS)
        return cm_set_error(CM_ERR_SHAPE, "safetensors '%s': tensor '%s' has %d dims; a cm_tensor has at most %d",
                            st->path, shown(t->name, nb, sizeof nb), t->ndim, CM_MAX_DIMS);
    return CM_OK;
}

cm_status cm_safetensors_load(const cm_safetensors *st, const char *name, cm_dtype dt, cm_tensor **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_safetensors_load: out is NULL");
    *out = NULL;
    const cm_st_tensor *t = cm_safetensors_find(st, name);
    if (!t) return CM_ERR_NOT_FOUND;
    cm_status s = check_target(st, t, dt);
    if (s != CM_OK) return s;
    cm_tensor *x;
    if ((s = cm_tensor_new(dt, t->ndim, t->shape, &x)) != CM_OK) return s;
    if ((s = convert(st, t, cm_tensor_data(x), dt)) != CM_OK) {
        cm_tensor_free(x);
        return s;
    }
    *out = x;
    return CM_OK;
}

cm_status cm_safetensors_copy(const cm_safetensors *st, const char *name, cm_tensor *dst) {
    if (!dst) return cm_set_error(CM_ERR_INVALID_ARG, "cm_safetensors_copy: dst is NULL");
    const cm_st_tensor *t = cm_safetensors_find(st, name);
    if (!t) return CM_ERR_NOT_FOUND;
    cm_status s = check_target(st, t, cm_tensor_dtype(dst));
    if (s != CM_OK) return s;
    char nb[ST_NAME_SHOWN + 4], fs[200], ds[200];
    bool same = cm_tensor_ndim(dst) == t->ndim;
    for (int d = 0; same && d < t->ndim; d++) same = cm_tensor_shape(dst)[d] == t->shape[d];
    if (!same) {
        shape_str(t, fs, sizeof fs);
        return cm_set_error(CM_ERR_SHAPE, "safetensors '%s': tensor '%s' has shape %s but the destination has %s",
                            st->path, shown(t->name, nb, sizeof nb), fs, cm_tensor_shape_str(dst, ds, sizeof ds));
    }
    if (!cm_tensor_is_contiguous(dst))
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "safetensors '%s': tensor '%s': the destination is not contiguous (copy into a "
                            "contiguous tensor)",
                            st->path, shown(t->name, nb, sizeof nb));
    return convert(st, t, cm_tensor_data(dst), cm_tensor_dtype(dst));
}
