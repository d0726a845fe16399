/* The YAML configuration tree (composer/config.h): libyaml's document loader builds a tree of
 * nodes that keep their text and where they came from; getters interpret scalars and record
 * which keys were read; the check walks the tree for keys nobody read. */
#include <composer/config.h>

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#define MAX_NODES 1000000
#define MAX_DEPTH 64

typedef struct node {
    cm_config_kind kind; /* NULL, SCALAR, MAP, SEQ */
    char *key;           /* the key when the node is a map's child */
    char *value;         /* scalar text ("" for null) */
    bool quoted;         /* a quoted (or !!str) scalar: a string even if it looks like a number */
    struct node **kids;
    int n, cap;
    int line, col;   /* the value's position, 1-based; 0 when not from the file */
    int kline, kcol; /* the key's position (map children from the file) */
    int origin;    /* 0: the file (line/col); else an index into cfg->origins */
    bool used;
} node;

struct cm_config {
    node *root;
    char **origins; /* origins[0] is the file name */
    int n_origins, cap_origins;
    char **asked; /* paths the getters asked for (valid keys, for suggestions) */
    int n_asked, cap_asked;
    char loc[600];
};

/* ---------------------------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------------------------- */

static char *dup_n(const char *s, size_t n) {
    char *p = cm_alloc(n + 1, 16);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}
static char *dup_s(const char *s) { return dup_n(s, strlen(s)); }

static void node_free(node *n) {
    if (!n) return;
    for (int i = 0; i < n->n; i++) node_free(n->kids[i]);
    cm_free(n->kids);
    cm_free(n->key);
    cm_free(n->value);
    cm_free(n);
}

static node *node_new(cm_config_kind kind, int origin) {
    node *n = cm_alloc_zeroed(sizeof *n, 16);
    if (!n) return NULL;
    n->kind = kind;
    n->origin = origin;
    return n;
}

static cm_status node_add(node *parent, node *kid) {
    if (parent->n == parent->cap) {
        int cap = parent->cap ? parent->cap * 2 : 4;
        node **k = cm_alloc((size_t)cap * sizeof *k, 16);
        if (!k) return CM_ERR_OOM;
        if (parent->n) memcpy(k, parent->kids, (size_t)parent->n * sizeof *k);
        cm_free(parent->kids);
        parent->kids = k;
        parent->cap = cap;
    }
    parent->kids[parent->n++] = kid;
    return CM_OK;
}

static node *map_find(const node *m, const char *key, size_t len) {
    if (m->kind != CM_CONFIG_MAP) return NULL;
    for (int i = 0; i < m->n; i++)
        if (strlen(m->kids[i]->key) == len && memcmp(m->kids[i]->key, key, len) == 0) return m->kids[i];
    return NULL;
}

static cm_status push_str(char ***arr, int *n, int *cap, const char *s, int *index) {
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 8;
        char **a = cm_alloc((size_t)nc * sizeof *a, 16);
        if (!a) return CM_ERR_OOM;
        if (*n) memcpy(a, *arr, (size_t)*n * sizeof *a);
        cm_free(*arr);
        *arr = a;
        *cap = nc;
    }
    char *d = dup_s(s);
    if (!d) return CM_ERR_OOM;
    (*arr)[*n] = d;
    if (index) *index = *n;
    (*n)++;
    return CM_OK;
}

static int add_origin(cm_config *c, const char *what) {
    for (int i = 1; i < c->n_origins; i++)
        if (strcmp(c->origins[i], what) == 0) return i;
    int idx;
    if (push_str(&c->origins, &c->n_origins, &c->cap_origins, what, &idx) != CM_OK) return -1;
    return idx;
}

static const char *node_origin(const cm_config *c, const node *n, char *buf, size_t cap) {
    if (n->origin == 0) snprintf(buf, cap, "%s:%d:%d", c->origins[0], n->line, n->col);
    else snprintf(buf, cap, "%s", c->origins[n->origin]);
    return buf;
}

static bool is_null_text(const char *s) {
    return !*s || strcmp(s, "~") == 0 || strcmp(s, "null") == 0 || strcmp(s, "Null") == 0 || strcmp(s, "NULL") == 0;
}

/* ---------------------------------------------------------------------------------------------
 * Suggestions
 * ------------------------------------------------------------------------------------------- */

const char *cm_config_closest(const char *word, const char *const *cands, int n) {
    return cm_closest_name(word, cands, n);
}

/* ---------------------------------------------------------------------------------------------
 * Building a tree from a libyaml document
 * ------------------------------------------------------------------------------------------- */

typedef struct build_ctx {
    cm_config *c;
    yaml_document_t *doc;
    int origin;
    int line_base; /* added to libyaml's 0-based line (1 for files) */
    int col_base;
    long count;
} build_ctx;

static cm_status build(build_ctx *b, yaml_node_t *yn, int depth, node **out) {
    char where[600];
    int line = (int)yn->start_mark.line + b->line_base, col = (int)yn->start_mark.column + b->col_base;
    if (b->origin == 0) snprintf(where, sizeof where, "%s:%d:%d", b->c->origins[0], line, col);
    else snprintf(where, sizeof where, "%s", b->c->origins[b->origin]);
    if (++b->count > MAX_NODES)
        return cm_set_error(CM_ERR_FORMAT, "%s: more than %d nodes (aliases expanding without bound?)", where,
                            MAX_NODES);
    if (depth > MAX_DEPTH)
        return cm_set_error(CM_ERR_FORMAT, "%s: nested deeper than %d levels (a recursive alias?)", where, MAX_DEPTH);
    node *n = node_new(CM_CONFIG_NULL, b->origin);
    if (!n) return cm_set_error(CM_ERR_OOM, "config: out of memory");
    n->line = b->origin == 0 ? line : 0;
    n->col = b->origin == 0 ? col : 0;
    cm_status s = CM_OK;
    switch (yn->type) {
    case YAML_SCALAR_NODE: {
        const char *v = (const char *)yn->data.scalar.value;
        size_t len = yn->data.scalar.length;
        n->value = dup_n(v, len);
        if (!n->value) {
            s = cm_set_error(CM_ERR_OOM, "config: out of memory");
            break;
        }
        bool plain = yn->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
        n->quoted = !plain;
        n->kind = (plain && is_null_text(n->value)) ? CM_CONFIG_NULL : CM_CONFIG_SCALAR;
        break;
    }
    case YAML_SEQUENCE_NODE:
        n->kind = CM_CONFIG_SEQ;
        for (yaml_node_item_t *it = yn->data.sequence.items.start; it < yn->data.sequence.items.top && !s; it++) {
            node *kid;
            s = build(b, yaml_document_get_node(b->doc, *it), depth + 1, &kid);
            if (!s && node_add(n, kid) != CM_OK) {
                node_free(kid);
                s = cm_set_error(CM_ERR_OOM, "config: out of memory");
            }
        }
        break;
    case YAML_MAPPING_NODE:
        n->kind = CM_CONFIG_MAP;
        for (yaml_node_pair_t *p = yn->data.mapping.pairs.start; p < yn->data.mapping.pairs.top && !s; p++) {
            yaml_node_t *k = yaml_document_get_node(b->doc, p->key);
            char kwhere[600];
            int kl = (int)k->start_mark.line + b->line_base, kc = (int)k->start_mark.column + b->col_base;
            if (b->origin == 0) snprintf(kwhere, sizeof kwhere, "%s:%d:%d", b->c->origins[0], kl, kc);
            else snprintf(kwhere, sizeof kwhere, "%s", b->c->origins[b->origin]);
            if (k->type != YAML_SCALAR_NODE) {
                s = cm_set_error(CM_ERR_FORMAT, "%s: a map key must be a plain name, not a %s", kwhere,
                                 k->type == YAML_MAPPING_NODE ? "map" : "sequence");
                break;
            }
            const char *key = (const char *)k->data.scalar.value;
            size_t klen = k->data.scalar.length;
            if (klen == 0 || memchr(key, '.', klen) || strlen(key) != klen) {
                s = cm_set_error(CM_ERR_FORMAT, "%s: key '%.*s' is not allowed (keys are non-empty and have no '.'; "
                                 "nest maps instead: 'a: {b: 1}')", kwhere, (int)klen, key);
                break;
            }
            if (map_find(n, key, klen)) {
                s = cm_set_error(CM_ERR_FORMAT, "%s: duplicate key '%.*s' (each key may appear once in a map)", kwhere,
                                 (int)klen, key);
                break;
            }
            node *kid;
            s = build(b, yaml_document_get_node(b->doc, p->value), depth + 1, &kid);
            if (s) break;
            kid->key = dup_n(key, klen);
            if (!kid->key || node_add(n, kid) != CM_OK) {
                node_free(kid);
                s = cm_set_error(CM_ERR_OOM, "config: out of memory");
            }
                if (!s && b->origin == 0) kid->kline = kl, kid->kcol = kc;
        }
        break;
    default:
        s = cm_set_error(CM_ERR_FORMAT, "%s: empty node", where);
    }
    if (s) {
        node_free(n);
        return s;
    }
    *out = n;
    return CM_OK;
}

/* Parses text as one YAML document; *out NULL for an empty document. `label` names the source
 * in messages ("x.yaml" with line/col for files, the override otherwise). */
static cm_status parse_yaml(cm_config *c, const char *text, size_t len, int origin, node **out) {
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) return cm_set_error(CM_ERR_OOM, "config: out of memory (YAML parser)");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    yaml_document_t doc;
    const char *label = c->origins[origin];
    cm_status s = CM_OK;
    *out = NULL;
    if (!yaml_parser_load(&parser, &doc)) {
        if (origin == 0)
            s = cm_set_error(CM_ERR_FORMAT, "%s:%zu:%zu: invalid YAML: %s%s%s", label, parser.problem_mark.line + 1,
                             parser.problem_mark.column + 1, parser.problem ? parser.problem : "syntax error",
                             parser.context ? " " : "", parser.context ? parser.context : "");
        else
            s = cm_set_error(CM_ERR_FORMAT, "%s: the value is not valid YAML: %s%s%s", label,
                             parser.problem ? parser.problem : "syntax error", parser.context ? " " : "",
                             parser.context ? parser.context : "");
        yaml_parser_delete(&parser);
        return s;
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root) {
        build_ctx b = {c, &doc, origin, 1, 1, 0};
        s = build(&b, root, 0, out);
        if (!s) {
            yaml_document_t doc2;
            if (!yaml_parser_load(&parser, &doc2)) {
                node_free(*out);
                *out = NULL;
                s = cm_set_error(CM_ERR_FORMAT, "%s:%zu:%zu: invalid YAML after the first document: %s", label,
                                 parser.problem_mark.line + 1, parser.problem_mark.column + 1,
                                 parser.problem ? parser.problem : "syntax error");
            } else {
                yaml_node_t *r2 = yaml_document_get_root_node(&doc2);
                if (r2) {
                    node_free(*out);
                    *out = NULL;
                    s = cm_set_error(CM_ERR_FORMAT, "%s:%zu: a second YAML document ('---'); a config is one document",
                                     label, r2->start_mark.line + 1);
                }
                yaml_document_delete(&doc2);
            }
        }
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return s;
}

/* ---------------------------------------------------------------------------------------------
 * Creating and freeing
 * ------------------------------------------------------------------------------------------- */

cm_status cm_config_new(const char *name, cm_config **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_config_new: out is NULL");
    cm_config *c = cm_alloc_zeroed(sizeof *c, 16);
    if (!c) return cm_set_error(CM_ERR_OOM, "config: out of memory");
    if (push_str(&c->origins, &c->n_origins, &c->cap_origins, name ? name : "config", NULL) != CM_OK ||
        !(c->root = node_new(CM_CONFIG_MAP, 0))) {
        cm_config_free(c);
        return cm_set_error(CM_ERR_OOM, "config: out of memory");
    }
    c->root->line = 1, c->root->col = 1;
    *out = c;
    return CM_OK;
}

void cm_config_free(cm_config *c) {
    if (!c) return;
    node_free(c->root);
    for (int i = 0; i < c->n_origins; i++) cm_free(c->origins[i]);
    cm_free(c->origins);
    for (int i = 0; i < c->n_asked; i++) cm_free(c->asked[i]);
    cm_free(c->asked);
    cm_free(c);
}

cm_status cm_config_load_string(const char *text, size_t len, const char *name, cm_config **out) {
    if (!out || (!text && len)) return cm_set_error(CM_ERR_INVALID_ARG, "cm_config_load_string: NULL argument");
    cm_config *c;
    cm_status s = cm_config_new(name, &c);
    if (s) return s;
    node *root;
    if ((s = parse_yaml(c, text ? text : "", len, 0, &root)) != CM_OK) {
        cm_config_free(c);
        return s;
    }
    if (root) {
        if (root->kind == CM_CONFIG_NULL) {
            node_free(root);
        } else if (root->kind != CM_CONFIG_MAP) {
            s = cm_set_error(CM_ERR_FORMAT, "%s:%d:%d: the top level of a config must be a map of keys (key: value), "
                             "found a %s", c->origins[0], root->line, root->col,
                             root->kind == CM_CONFIG_SEQ ? "sequence" : "scalar");
            node_free(root);
            cm_config_free(c);
            return s;
        } else {
            node_free(c->root);
            c->root = root;
        }
    }
    *out = c;
    return CM_OK;
}

cm_status cm_config_load_file(const char *path, cm_config **out) {
    if (!path || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_config_load_file: NULL argument");
    FILE *f = fopen(path, "rb");
    if (!f) return cm_set_error(CM_ERR_IO, "cannot open config '%s': %s", path, strerror(errno));
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            return cm_set_error(CM_ERR_OOM, "config '%s': out of memory", path);
        }
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap) break;
        char *g = realloc(buf, cap * 2);
        if (!g) free(buf);
        buf = g;
        cap *= 2;
    }
    bool err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return cm_set_error(CM_ERR_IO, "cannot read config '%s'", path);
    }
    cm_status s = cm_config_load_string(buf, len, path, out);
    free(buf);
    return s;
}

/* ---------------------------------------------------------------------------------------------
 * Paths
 * ------------------------------------------------------------------------------------------- */

static bool seg_index(const char *seg, size_t len, long *out) {
    if (len == 0 || len > 9) return false;
    long v = 0;
    for (size_t i = 0; i < len; i++) {
        if (seg[i] < '0' || seg[i] > '9') return false;
        v = v * 10 + (seg[i] - '0');
    }
    *out = v;
    return true;
}

static const char *kind_word(cm_config_kind k) {
    return k == CM_CONFIG_MAP ? "a map" : k == CM_CONFIG_SEQ ? "a sequence" : k == CM_CONFIG_NULL ? "null" : "a scalar";
}

/* Finds the node at path: *out NULL when absent (a null or missing node on the way). With `mark`
 * every node on the way is marked read. Errors: a path through a scalar. */
static cm_status find(cm_config *c, const char *path, bool mark, node **out) {
    node *n = c->root;
    *out = NULL;
    if (mark) n->used = true;
    const char *p = path;
    while (p && *p) {
        const char *dot = strchr(p, '.');
        size_t len = dot ? (size_t)(dot - p) : strlen(p);
        node *next = NULL;
        long idx;
        if (n->kind == CM_CONFIG_MAP) {
            next = map_find(n, p, len);
        } else if (n->kind == CM_CONFIG_SEQ && seg_index(p, len, &idx)) {
            next = idx < n->n ? n->kids[idx] : NULL;
        } else if (n->kind == CM_CONFIG_NULL) {
            return CM_OK;
        } else {
            char where[600];
            return cm_set_error(CM_ERR_INVALID_ARG, "%s: %.*s: expected a map (to look up '%.*s'), found %s%s%s%s",
                                node_origin(c, n, where, sizeof where), (int)(p - path - (p > path)), path, (int)len,
                                p, kind_word(n->kind), n->kind == CM_CONFIG_SCALAR ? " '" : "",
                                n->kind == CM_CONFIG_SCALAR ? n->value : "", n->kind == CM_CONFIG_SCALAR ? "'" : "");
        }
        if (!next) return CM_OK;
        n = next;
        if (mark) n->used = true;
        p = dot ? dot + 1 : NULL;
    }
    *out = n;
    return CM_OK;
}

static const node *find_const(const cm_config *c, const char *path) {
    node *n;
    cm_status s = find((cm_config *)c, path, false, &n);
    if (s) cm_clear_error();
    return s ? NULL : n;
}

/* Replaces the node at path with `val` (taken), creating maps on the way. */
static cm_status put(cm_config *c, const char *path, node *val, const char *what) {
    node *n = c->root;
    const char *p = path;
    for (;;) {
        const char *dot = strchr(p, '.');
        size_t len = dot ? (size_t)(dot - p) : strlen(p);
        if (len == 0) {
            node_free(val);
            return cm_set_error(CM_ERR_INVALID_ARG, "%s: empty key in path '%s'", what, path);
        }
        if (n->kind == CM_CONFIG_NULL) {
            cm_free(n->value);
            n->value = NULL;
            n->kind = CM_CONFIG_MAP;
        }
        long idx = -1;
        node **slot = NULL;
        if (n->kind == CM_CONFIG_MAP) {
            for (int i = 0; i < n->n; i++)
                if (strlen(n->kids[i]->key) == len && memcmp(n->kids[i]->key, p, len) == 0) slot = &n->kids[i];
        } else if (n->kind == CM_CONFIG_SEQ && seg_index(p, len, &idx)) {
            if (idx > n->n) {
                node_free(val);
                return cm_set_error(CM_ERR_INVALID_ARG, "%s: index %ld is past the end of the sequence (%d items)",
                                    what, idx, n->n);
            }
            if (idx < n->n) slot = &n->kids[idx];
        } else {
            node_free(val);
            return cm_set_error(CM_ERR_INVALID_ARG, "%s: '%.*s' is %s, cannot set '%.*s' inside it", what,
                                (int)(p - path - (p > path)), path, kind_word(n->kind), (int)len, p);
        }
        if (!dot) {
            if (slot) {
                if (n->kind == CM_CONFIG_MAP) {
                    val->key = (*slot)->key;
                    (*slot)->key = NULL;
                }
                node_free(*slot);
                *slot = val;
                return CM_OK;
            }
            if (n->kind == CM_CONFIG_MAP && !(val->key = dup_n(p, len))) {
                node_free(val);
                return cm_set_error(CM_ERR_OOM, "config: out of memory");
            }
            if (node_add(n, val) != CM_OK) {
                node_free(val);
                return cm_set_error(CM_ERR_OOM, "config: out of memory");
            }
            return CM_OK;
        }
        if (!slot) {
            node *m = node_new(CM_CONFIG_MAP, val->origin);
            if (!m || (n->kind == CM_CONFIG_MAP && !(m->key = dup_n(p, len))) || node_add(n, m) != CM_OK) {
                node_free(m);
                node_free(val);
                return cm_set_error(CM_ERR_OOM, "config: out of memory");
            }
            n = m;
        } else {
            n = *slot;
        }
        p = dot + 1;
    }
}

static cm_status set_value(cm_config *c, const char *path, const char *yaml_value, const char *origin_text) {
    int origin = add_origin(c, origin_text);
    if (origin < 0) return cm_set_error(CM_ERR_OOM, "config: out of memory");
    if (!*path) return cm_set_error(CM_ERR_INVALID_ARG, "%s: empty key", origin_text);
    node *val;
    cm_status s = parse_yaml(c, yaml_value, strlen(yaml_value), origin, &val);
    if (s) return s;
    if (!val && !(val = node_new(CM_CONFIG_NULL, origin))) return cm_set_error(CM_ERR_OOM, "config: out of memory");
    if (!val->value && val->kind == CM_CONFIG_NULL && !(val->value = dup_s("")))
        return node_free(val), cm_set_error(CM_ERR_OOM, "config: out of memory");
    return put(c, path, val, origin_text);
}

cm_status cm_config_override(cm_config *c, const char *assignment) {
    if (!c || !assignment) return cm_set_error(CM_ERR_INVALID_ARG, "cm_config_override: NULL argument");
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment)
        return cm_set_error(CM_ERR_INVALID_ARG, "override '%s' is not KEY=VALUE (e.g. optimizer.lr=3e-4)", assignment);
    char what[600];
    snprintf(what, sizeof what, "override '%s'", assignment);
    char *key = dup_n(assignment, (size_t)(eq - assignment));
    if (!key) return cm_set_error(CM_ERR_OOM, "config: out of memory");
    cm_status s = set_value(c, key, eq + 1, what);
    cm_free(key);
    return s;
}

cm_status cm_config_set(cm_config *c, const char *path, const char *yaml_value) {
    if (!c || !path || !yaml_value) return cm_set_error(CM_ERR_INVALID_ARG, "cm_config_set: NULL argument");
    char what[600];
    snprintf(what, sizeof what, "set '%s'", path);
    return set_value(c, path, yaml_value, what);
}

void cm_config_remove(cm_config *c, const char *path) {
    if (!c || !path || !*path) return;
    const char *dot = strrchr(path, '.');
    node *parent = c->root;
    if (dot) {
        char *pp = dup_n(path, (size_t)(dot - path));
        if (!pp) return;
        const node *q = find_const(c, pp);
        cm_free(pp);
        if (!q) return;
        parent = (node *)q;
    }
    const char *leaf = dot ? dot + 1 : path;
    long idx;
    for (int i = 0; i < parent->n; i++) {
        bool hit = parent->kind == CM_CONFIG_MAP ? strcmp(parent->kids[i]->key, leaf) == 0
                                                 : (seg_index(leaf, strlen(leaf), &idx) && idx == i);
        if (hit) {
            node_free(parent->kids[i]);
            memmove(parent->kids + i, parent->kids + i + 1, (size_t)(parent->n - i - 1) * sizeof *parent->kids);
            parent->n--;
            return;
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Reading
 * ------------------------------------------------------------------------------------------- */

cm_config_kind cm_config_kind_of(const cm_config *c, const char *path) {
    if (!c || !path) return CM_CONFIG_ABSENT;
    const node *n = find_const(c, path);
    return n ? n->kind : CM_CONFIG_ABSENT;
}

bool cm_config_has(const cm_config *c, const char *path) {
    cm_config_kind k = cm_config_kind_of(c, path);
    return k != CM_CONFIG_ABSENT && k != CM_CONFIG_NULL;
}

int cm_config_len(const cm_config *c, const char *path) {
    if (!c || !path) return 0;
    const node *n = find_const(c, path);
    return n && (n->kind == CM_CONFIG_MAP || n->kind == CM_CONFIG_SEQ) ? n->n : 0;
}

const char *cm_config_key_at(const cm_config *c, const char *path, int i) {
    if (!c || !path) return NULL;
    const node *n = find_const(c, path);
    return n && n->kind == CM_CONFIG_MAP && i >= 0 && i < n->n ? n->kids[i]->key : NULL;
}

const char *cm_config_origin(const cm_config *c, const char *path) {
    if (!c || !path) return "";
    const node *n = find_const(c, path);
    if (!n) return "";
    return node_origin(c, n, ((cm_config *)c)->loc, sizeof c->loc);
}

static void record_asked(cm_config *c, const char *path) {
    for (int i = 0; i < c->n_asked; i++)
        if (strcmp(c->asked[i], path) == 0) return;
    if (push_str(&c->asked, &c->n_asked, &c->cap_asked, path, NULL) != CM_OK) cm_clear_error();
}

static void mark_tree(node *n) {
    n->used = true;
    for (int i = 0; i < n->n; i++) mark_tree(n->kids[i]);
}

void cm_config_touch(cm_config *c, const char *path) {
    if (!c || !path) return;
    record_asked(c, path);
    node *n;
    if (find(c, path, true, &n) != CM_OK) {
        cm_clear_error();
        return;
    }
    if (n) mark_tree(n);
}

void cm_config_mark_read(cm_config *c, const char *path) {
    if (!c || !path) return;
    record_asked(c, path);
    node *n = NULL;
    if (find(c, path, true, &n) != CM_OK) {
        cm_clear_error();
        return;
    }
    if (n) n->used = true;
}

/* Looks up a scalar for a getter: *out NULL when absent or null. Errors for maps and sequences
 * and for paths through scalars. */
static cm_status get_scalar(cm_config *c, const char *path, const char *expected, node **out) {
    if (!c || !path) return cm_set_error(CM_ERR_INVALID_ARG, "config getter: NULL argument");
    record_asked(c, path);
    node *n;
    cm_status s = find(c, path, true, &n);
    if (s) return s;
    if (n && (n->kind == CM_CONFIG_MAP || n->kind == CM_CONFIG_SEQ)) {
        char where[600];
        mark_tree(n);
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s: expected %s, found %s", node_origin(c, n, where, sizeof where),
                            path, expected, kind_word(n->kind));
    }
    *out = n && n->kind == CM_CONFIG_SCALAR ? n : NULL;
    return CM_OK;
}

/* Stores a default (plain scalar text) at path. Failures to store are ignored: the value is used
 * either way; only the dump would lack it. */
static void store_default(cm_config *c, const char *path, const char *text) {
    int origin = add_origin(c, "default");
    node *v = origin < 0 ? NULL : node_new(CM_CONFIG_SCALAR, origin);
    if (!v || !(v->value = dup_s(text))) {
        node_free(v);
        cm_clear_error();
        return;
    }
    v->used = true;
    if (put(c, path, v, "default") != CM_OK) {
        cm_clear_error();
        return;
    }
    node *n;
    if (find(c, path, true, &n) != CM_OK) cm_clear_error();
}

static cm_status type_error(cm_config *c, const node *n, const char *path, const char *what, const char *detail) {
    char where[600];
    return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s: '%s' is not %s%s%s", node_origin(c, n, where, sizeof where), path,
                        n->value, what, detail ? ": " : "", detail ? detail : "");
}

static bool parse_double(const char *s, double *out) {
    if (!*s) return false;
    const char *t = s;
    bool neg = false;
    if (*t == '+' || *t == '-') neg = *t == '-', t++;
    if (strcasecmp(t, ".inf") == 0) {
        *out = neg ? -INFINITY : INFINITY;
        return true;
    }
    if (strcasecmp(s, ".nan") == 0) {
        *out = NAN;
        return true;
    }
    if (strcasecmp(t, "inf") == 0 || strcasecmp(t, "infinity") == 0 || strcasecmp(t, "nan") == 0) return false;
    if (t[0] == '0' && (t[1] == 'x' || t[1] == 'X')) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno == ERANGE) return false;
    *out = v;
    return true;
}

static bool parse_int(const char *s, int64_t *out) {
    if (!*s) return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end != s && !*end && errno == 0) {
        *out = v;
        return true;
    }
    double d;
    if (parse_double(s, &d) && isfinite(d) && d == floor(d) && fabs(d) < 9.007199254740992e15) {
        *out = (int64_t)d;
        return true;
    }
    return false;
}

cm_status cm_config_get_string(cm_config *c, const char *path, const char *def, const char **out) {
    node *n;
    cm_status s = get_scalar(c, path, "a string", &n);
    if (s) return s;
    if (!n) {
        if (def) {
            store_default(c, path, def);
            node *m;
            if (find(c, path, false, &m) == CM_OK && m && m->kind == CM_CONFIG_SCALAR) def = m->value;
            cm_clear_error();
        }
        *out = def;
        return CM_OK;
    }
    *out = n->value;
    return CM_OK;
}

cm_status cm_config_get_int(cm_config *c, const char *path, int64_t def, int64_t *out) {
    node *n;
    cm_status s = get_scalar(c, path, "an integer", &n);
    if (s) return s;
    if (!n) {
        char buf[32];
        snprintf(buf, sizeof buf, "%lld", (long long)def);
        store_default(c, path, buf);
        *out = def;
        return CM_OK;
    }
    int64_t v;
    if (!parse_int(n->value, &v)) return type_error(c, n, path, "an integer", NULL);
    *out = v;
    return CM_OK;
}

static void fmt_double(double x, char *buf, size_t cap) {
    if (isnan(x)) snprintf(buf, cap, ".nan");
    else if (isinf(x)) snprintf(buf, cap, x > 0 ? ".inf" : "-.inf");
    else {
        for (int prec = 6; prec <= 17; prec++) {
            snprintf(buf, cap, "%.*g", prec, x);
            if (strtod(buf, NULL) == x) break;
        }
        /* keep it a real when read as YAML: "1" -> "1.0" */
        if (!strpbrk(buf, ".eEn")) {
            size_t l = strlen(buf);
            if (l + 2 < cap) memcpy(buf + l, ".0", 3);
        }
    }
}

cm_status cm_config_get_double(cm_config *c, const char *path, double def, double *out) {
    node *n = NULL;
    cm_status s = get_scalar(c, path, "a number", &n);
    if (s) return s;
    if (!n) {
        char buf[40];
        fmt_double(def, buf, sizeof buf);
        store_default(c, path, buf);
        *out = def;
        return CM_OK;
    }
    double v;
    if (!parse_double(n->value, &v)) return type_error(c, n, path, "a number", NULL);
    *out = v;
    return CM_OK;
}

cm_status cm_config_get_bool(cm_config *c, const char *path, bool def, bool *out) {
    node *n;
    cm_status s = get_scalar(c, path, "a boolean", &n);
    if (s) return s;
    if (!n) {
        store_default(c, path, def ? "true" : "false");
        *out = def;
        return CM_OK;
    }
    static const char *const t[] = {"true", "yes", "on"}, *const f[] = {"false", "no", "off"};
    for (int i = 0; i < 3; i++) {
        if (strcasecmp(n->value, t[i]) == 0) return *out = true, CM_OK;
        if (strcasecmp(n->value, f[i]) == 0) return *out = false, CM_OK;
    }
    return type_error(c, n, path, "a boolean", "use true or false");
}

cm_status cm_config_get_time(cm_config *c, const char *path, const char *def, cm_time *out) {
    node *n;
    cm_status s = get_scalar(c, path, "a time", &n);
    if (s) return s;
    const char *text = n ? n->value : def;
    if (!text) {
        *out = cm_time_make(0, CM_TIME_BATCH);
        return CM_OK;
    }
    cm_time t;
    if (strcmp(text, "0") == 0) {
        t = cm_time_make(0, CM_TIME_BATCH);
    } else if ((s = cm_time_parse_named(path, text, &t)) != CM_OK) {
        if (!n) return s; /* a bad default: the program's bug, reported as is */
        char detail[512];
        snprintf(detail, sizeof detail, "%s", cm_last_error());
        return type_error(c, n, path, "a time", detail);
    }
    if (!n) store_default(c, path, def);
    *out = t;
    return CM_OK;
}

cm_status cm_config_get_choice(cm_config *c, const char *path, const char *const *choices, int n_choices,
                               const char *def, int *out) {
    node *n;
    cm_status s = get_scalar(c, path, "a name", &n);
    if (s) return s;
    const char *text = n ? n->value : def;
    if (!text) {
        *out = -1;
        return CM_OK;
    }
    for (int i = 0; i < n_choices; i++)
        if (strcasecmp(text, choices[i]) == 0) {
            if (!n) store_default(c, path, choices[i]);
            *out = i;
            return CM_OK;
        }
    char list[1024] = "";
    size_t used = 0;
    for (int i = 0; i < n_choices && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", choices[i]);
    const char *near = cm_config_closest(text, choices, n_choices);
    char where[600];
    if (!n) return cm_set_error(CM_ERR_INVALID_ARG, "default for %s: '%s' is not one of %s", path, text, list);
    return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s: unknown value '%s' (%s%s%suse one of %s)",
                        node_origin(c, n, where, sizeof where), path, text, near ? "did you mean '" : "",
                        near ? near : "", near ? "'? " : "", list);
}

cm_status cm_config_get_doubles(cm_config *c, const char *path, const double *def, int n_def, double *out, int cap,
                                int *n_out) {
    if (!c || !path || !out || !n_out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_config_get_doubles: NULL argument");
    record_asked(c, path);
    node *n;
    cm_status s = find(c, path, true, &n);
    if (s) return s;
    char where[600];
    if (!n || n->kind == CM_CONFIG_NULL) {
        if (n_def > cap) return cm_set_error(CM_ERR_INVALID_ARG, "%s: default has %d values, room for %d", path, n_def, cap);
        char buf[1024] = "[", one[40];
        for (int i = 0; i < n_def; i++) {
            out[i] = def[i];
            fmt_double(def[i], one, sizeof one);
            snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", i ? ", " : "", one);
        }
        snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "]");
        if (set_value(c, path, buf, "default") != CM_OK) cm_clear_error();
        node *m;
        if (find(c, path, true, &m) == CM_OK && m) mark_tree(m);
        cm_clear_error();
        *n_out = n_def;
        return CM_OK;
    }
    mark_tree(n);
    if (n->kind == CM_CONFIG_MAP)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s: expected a list of numbers ([0.9, 0.95]), found a map",
                            node_origin(c, n, where, sizeof where), path);
    node *const *items = n->kind == CM_CONFIG_SEQ ? n->kids : &n;
    int count = n->kind == CM_CONFIG_SEQ ? n->n : 1;
    if (count > cap)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s: %d values, at most %d allowed",
                            node_origin(c, n, where, sizeof where), path, count, cap);
    for (int i = 0; i < count; i++) {
        if (items[i]->kind != CM_CONFIG_SCALAR || !parse_double(items[i]->value, &out[i])) {
            char p[600];
            snprintf(p, sizeof p, "%s.%d", path, i);
            if (items[i]->kind != CM_CONFIG_SCALAR)
                return cm_set_error(CM_ERR_INVALID_ARG, "%s: %s: expected a number, found %s",
                                    node_origin(c, items[i], where, sizeof where), p, kind_word(items[i]->kind));
            return type_error(c, items[i], p, "a number", NULL);
        }
    }
    *n_out = count;
    return CM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * The unknown-key check
 * ------------------------------------------------------------------------------------------- */

typedef struct unknown_walk {
    const cm_config *c;
    const node *first;
    char first_path[600];
    int count;
} unknown_walk;

static void walk_unknown(unknown_walk *w, const node *n, const char *path) {
    for (int i = 0; i < n->n; i++) {
        const node *k = n->kids[i];
        char p[600];
        if (n->kind == CM_CONFIG_MAP) snprintf(p, sizeof p, "%s%s%s", path, *path ? "." : "", k->key);
        else snprintf(p, sizeof p, "%s%s%d", path, *path ? "." : "", i);
        if (!k->used) {
            if (n->kind == CM_CONFIG_SEQ && k->kind != CM_CONFIG_MAP) continue; /* items of a list read whole */
            if (!w->first) {
                w->first = k;
                snprintf(w->first_path, sizeof w->first_path, "%s", p);
            }
            w->count++;
            continue;
        }
        if (k->kind == CM_CONFIG_MAP || k->kind == CM_CONFIG_SEQ) walk_unknown(w, k, p);
    }
}

static const char *leaf_of(const char *p) {
    const char *d = strrchr(p, '.');
    return d ? d + 1 : p;
}

cm_status cm_config_check_unknown(const cm_config *c) {
    if (!c) return cm_set_error(CM_ERR_INVALID_ARG, "cm_config_check_unknown: NULL config");
    unknown_walk w = {c, NULL, "", 0};
    walk_unknown(&w, c->root, "");
    if (!w.first) return CM_OK;
    const char *path = w.first_path, *leaf = leaf_of(path);
    size_t parent_len = (size_t)(leaf - path);
    /* 1. a sibling that was asked for (same parent, the next segment) */
    const char *best = NULL;
    char sugg[600];
    int n_c = 0;
    char(*segs)[128] = malloc(sizeof *segs * (size_t)(c->n_asked + 1));
    const char **cands = malloc(sizeof *cands * (size_t)(c->n_asked + 1));
    for (int i = 0; segs && cands && i < c->n_asked; i++) {
        const char *a = c->asked[i];
        if (strlen(a) <= parent_len || strncmp(a, path, parent_len) != 0) continue;
        const char *rest = a + parent_len, *dot = strchr(rest, '.');
        size_t seg = dot ? (size_t)(dot - rest) : strlen(rest);
        if (seg >= 128) continue;
        memcpy(segs[n_c], rest, seg);
        segs[n_c][seg] = 0;
        cands[n_c] = segs[n_c];
        n_c++;
    }
    const char *hit = n_c ? cm_config_closest(leaf, cands, n_c) : NULL;
    if (hit) {
        snprintf(sugg, sizeof sugg, "%.*s%s", (int)parent_len, path, hit);
        best = sugg;
    }
    free(segs);
    free(cands);
    /* 2. the same name asked for at another level */
    for (int i = 0; !best && i < c->n_asked; i++)
        if (strcmp(leaf_of(c->asked[i]), leaf) == 0) best = c->asked[i];
    /* 3. the closest full path */
    if (!best) best = cm_config_closest(path, (const char *const *)c->asked, c->n_asked);
    char where[600];
    char more[64] = "";
    if (w.count > 1) snprintf(more, sizeof more, " (and %d more unknown key%s)", w.count - 1, w.count > 2 ? "s" : "");
    if (w.first->origin == 0 && w.first->kline > 0)
        snprintf(where, sizeof where, "%s:%d:%d", c->origins[0], w.first->kline, w.first->kcol);
    else
        node_origin(c, w.first, where, sizeof where);
    return cm_set_error(CM_ERR_INVALID_ARG, "%s: unknown key '%s'%s%s%s%s", where,
                        path, best ? " (did you mean '" : "", best ? best : "", best ? "'?)" : "", more);
}

/* ---------------------------------------------------------------------------------------------
 * Writing
 * ------------------------------------------------------------------------------------------- */

static int emit_ok(yaml_emitter_t *e, yaml_event_t *ev) { return yaml_emitter_emit(e, ev); }

static int emit_scalar(yaml_emitter_t *e, const char *text, bool quoted) {
    yaml_event_t ev;
    /* quoted: single quotes (libyaml switches to double quotes where they cannot hold the text);
     * control characters: double quotes ("\n" reads better than a folded block) */
    yaml_scalar_style_t style = quoted ? YAML_SINGLE_QUOTED_SCALAR_STYLE : YAML_PLAIN_SCALAR_STYLE;
    for (const char *p = text; *p; p++)
        if ((unsigned char)*p < 0x20) style = YAML_DOUBLE_QUOTED_SCALAR_STYLE;
    if (!yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)text, (int)strlen(text), 1, 1, style))
        return 0;
    return emit_ok(e, &ev);
}

static int emit_node(yaml_emitter_t *e, const node *n) {
    yaml_event_t ev;
    switch (n->kind) {
    case CM_CONFIG_NULL:
        return emit_scalar(e, "null", false);
    case CM_CONFIG_SCALAR:
        /* a plain scalar that would read back as null must be quoted */
        return emit_scalar(e, n->value, n->quoted || is_null_text(n->value));
    case CM_CONFIG_SEQ: {
        bool flow = true;
        for (int i = 0; i < n->n; i++)
            if (n->kids[i]->kind == CM_CONFIG_MAP || n->kids[i]->kind == CM_CONFIG_SEQ) flow = false;
        if (!yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1,
                                                  flow ? YAML_FLOW_SEQUENCE_STYLE : YAML_BLOCK_SEQUENCE_STYLE) ||
            !emit_ok(e, &ev))
            return 0;
        for (int i = 0; i < n->n; i++)
            if (!emit_node(e, n->kids[i])) return 0;
        return yaml_sequence_end_event_initialize(&ev) && emit_ok(e, &ev);
    }
    case CM_CONFIG_MAP:
        if (!yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1,
                                                 n->n ? YAML_BLOCK_MAPPING_STYLE : YAML_FLOW_MAPPING_STYLE) ||
            !emit_ok(e, &ev))
            return 0;
        for (int i = 0; i < n->n; i++)
            if (!emit_scalar(e, n->kids[i]->key, false) || !emit_node(e, n->kids[i])) return 0;
        return yaml_mapping_end_event_initialize(&ev) && emit_ok(e, &ev);
    default:
        return 0;
    }
}

static int write_handler(void *data, unsigned char *buf, size_t size) {
    return fwrite(buf, 1, size, (FILE *)data) == size;
}

cm_status cm_config_write(const cm_config *c, FILE *f) {
    if (!c || !f) return cm_set_error(CM_ERR_INVALID_ARG, "cm_config_write: NULL argument");
    yaml_emitter_t e;
    if (!yaml_emitter_initialize(&e)) return cm_set_error(CM_ERR_OOM, "config: out of memory (YAML emitter)");
    yaml_emitter_set_output(&e, write_handler, f);
    yaml_emitter_set_unicode(&e, 1);
    yaml_emitter_set_width(&e, 100);
    yaml_event_t ev;
    int ok = yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING) && emit_ok(&e, &ev) &&
             yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1) && emit_ok(&e, &ev) &&
             emit_node(&e, c->root) && yaml_document_end_event_initialize(&ev, 1) && emit_ok(&e, &ev) &&
             yaml_stream_end_event_initialize(&ev) && emit_ok(&e, &ev) && yaml_emitter_flush(&e);
    const char *problem = e.problem;
    yaml_emitter_delete(&e);
    if (!ok || ferror(f))
        return cm_set_error(CM_ERR_IO, "writing the config as YAML failed: %s", problem ? problem : strerror(errno));
    return CM_OK;
}

cm_status cm_config_to_string(const cm_config *c, char **out, size_t *len) {
    if (!c || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_config_to_string: NULL argument");
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) return cm_set_error(CM_ERR_OOM, "config: out of memory");
    cm_status s = cm_config_write(c, f);
    fclose(f);
    if (!s) {
        *out = dup_n(buf, n);
        if (!*out) s = cm_set_error(CM_ERR_OOM, "config: out of memory");
        else if (len) *len = n;
    }
    free(buf);
    return s;
}

cm_status cm_config_save(const cm_config *c, const char *path) {
    if (!c || !path) return cm_set_error(CM_ERR_INVALID_ARG, "cm_config_save: NULL argument");
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return cm_set_error(CM_ERR_INVALID_ARG, "config path too long: '%s'", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return cm_set_error(CM_ERR_IO, "cannot write config '%s': %s", tmp, strerror(errno));
    cm_status s = cm_config_write(c, f);
    if (fclose(f) != 0 && !s) s = cm_set_error(CM_ERR_IO, "cannot write config '%s': %s", tmp, strerror(errno));
    if (!s && rename(tmp, path) != 0) s = cm_set_error(CM_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
    if (s) remove(tmp);
    return s;
}
