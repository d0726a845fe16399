/* The module tree: construction, lookup, the forward wrapper, summaries, training mode. Packing,
 * named parameters and surgery are in pack.c. */
#include "nn/nn_impl.h"
#include "tensor/tensor_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = cm_alloc(n, 8);
    if (d) memcpy(d, s, n);
    return d;
}

cm_module *cmn_root(const cm_module *m) {
    while (m->parent) m = m->parent;
    return (cm_module *)m;
}

cm_tensor *cmn_fail(cm_tape *tp, cm_status s, const char *fmt, ...) {
    if (tp && tp->status == CM_OK) {
        va_list ap;
        va_start(ap, fmt);
        cmi_failv(tp, s, fmt, ap);
        va_end(ap);
    }
    return NULL;
}

cm_status cm_module_new(const cm_module_i *vt, void *self, cm_module **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_module_new: out is NULL");
    *out = NULL;
    if (!vt || vt->abi != CM_MODULE_ABI || !vt->type_name || !vt->type_name[0])
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "cm_module_new: the vtable must be non-NULL, with abi %d (got %d) and a type name",
                            CM_MODULE_ABI, vt ? vt->abi : -1);
    cm_module *m = cm_alloc_zeroed(sizeof *m, 8);
    if (!m) return CM_ERR_OOM;
    m->vt = vt;
    m->self = self;
    m->name = "";
    m->training = true;
    *out = m;
    return CM_OK;
}

void cmn_pack_free(cmn_pack *p); /* pack.c */

void cm_module_free(cm_module *m) {
    if (!m) return;
    if (m->parent) {
        cm_log_msg(CM_LOG_ERROR, "cm_module_free: module '%s' (%s) still has a parent (ignored; free the root)",
                   m->name, m->vt->type_name);
        return;
    }
    for (int i = 0; i < m->n_children; i++) {
        m->children[i].m->parent = NULL;
        cm_module_free(m->children[i].m);
        cm_free(m->children[i].name);
    }
    for (int i = 0; i < m->n_params; i++) {
        if (m->params[i].owned) cm_tensor_free(m->params[i].t);
        cm_free(m->params[i].name);
    }
    for (int i = 0; i < m->n_buffers; i++) {
        cm_tensor_free(m->buffers[i].t);
        cm_free(m->buffers[i].name);
    }
    cm_free(m->children);
    cm_free(m->params);
    cm_free(m->buffers);
    cm_free(m->unit);
    cmn_pack_free(m->pack); /* after the tensors: they only borrow the flat buffers */
    if (m->vt->free_self) m->vt->free_self(m->self);
    cm_free(m);
}

void *cm_module_self(const cm_module *m) { return m ? m->self : NULL; }
const cm_module_i *cm_module_vtable(const cm_module *m) { return m ? m->vt : NULL; }
const char *cm_module_type_name(const cm_module *m) { return m ? m->vt->type_name : ""; }
const char *cm_module_name(const cm_module *m) { return m ? m->name : ""; }
cm_module *cm_module_parent(const cm_module *m) { return m ? m->parent : NULL; }

char *cm_module_path(const cm_module *m, char *buf, size_t cap) {
    if (!cap) return buf;
    buf[0] = '\0';
    /* collect the chain root→m, then join */
    const cm_module *chain[256];
    int n = 0;
    for (const cm_module *p = m; p && p->parent && n < 256; p = p->parent) chain[n++] = p;
    size_t len = 0;
    for (int i = n - 1; i >= 0; i--) {
        int w = snprintf(buf + len, cap - len, "%s%s", i == n - 1 ? "" : ".", chain[i]->name);
        if (w < 0 || (size_t)w >= cap - len) break;
        len += (size_t)w;
    }
    return buf;
}

/* ---- construction ---- */

static bool valid_name(const char *name) {
    if (!name || !name[0]) return false;
    for (const char *c = name; *c; c++)
        if (*c == '.' || *c == ' ' || *c == '*' || *c == '?') return false;
    return true;
}

static bool name_taken(const cm_module *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i].name, name)) return true;
    for (int i = 0; i < m->n_buffers; i++)
        if (!strcmp(m->buffers[i].name, name)) return true;
    for (int i = 0; i < m->n_children; i++)
        if (!strcmp(m->children[i].name, name)) return true;
    return false;
}

static cm_status check_new_member(const cm_module *m, const char *what, const char *name) {
    if (!m) return cm_set_error(CM_ERR_INVALID_ARG, "cm_module_add_%s: module is NULL", what);
    if (!valid_name(name))
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "cm_module_add_%s: name '%s' is not valid for %s module; use a non-empty name without "
                            "'.', ' ', '*' or '?'",
                            what, name ? name : "(null)", m->vt->type_name);
    if (name_taken(m, name))
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_module_add_%s: %s module already has a member called '%s'", what,
                            m->vt->type_name, name);
    const cm_module *r = cmn_root(m);
    if (cm_module_is_locked(r))
        return cm_set_error(CM_ERR_STATE,
                            "cm_module_add_%s('%s'): the model is locked by an optimizer; change the model before "
                            "creating the optimizer",
                            what, name);
    return CM_OK;
}

static bool grow(void **arr, int *cap, int n, size_t elem) {
    if (n < *cap) return true;
    int nc = *cap ? *cap * 2 : 4;
    void *na = cm_alloc(elem * (size_t)nc, 8);
    if (!na) return false;
    if (*arr) memcpy(na, *arr, elem * (size_t)n);
    cm_free(*arr);
    *arr = na;
    *cap = nc;
    return true;
}

cm_status cm_module_add_param(cm_module *m, const char *name, int ndim, const int64_t *shape, bool no_decay,
                              cm_tensor **slot) {
    cm_status st = check_new_member(m, "param", name);
    if (st) return st;
    if (!grow((void **)&m->params, &m->cap_params, m->n_params, sizeof(cmn_param))) return CM_ERR_OOM;
    cm_tensor *t;
    if ((st = cm_tensor_new(CM_DTYPE_F32, ndim, shape, &t))) return st;
    char *nm = dup_str(name);
    if (!nm) {
        cm_tensor_free(t);
        return CM_ERR_OOM;
    }
    cm_tensor_set_requires_grad(t, true);
    m->params[m->n_params++] = (cmn_param){nm, t, slot, true, no_decay};
    if (slot) *slot = t;
    return CM_OK;
}

cm_status cm_module_add_buffer(cm_module *m, const char *name, cm_dtype dt, int ndim, const int64_t *shape,
                               bool persistent, cm_tensor **slot) {
    cm_status st = check_new_member(m, "buffer", name);
    if (st) return st;
    if (!grow((void **)&m->buffers, &m->cap_buffers, m->n_buffers, sizeof(cmn_buffer))) return CM_ERR_OOM;
    cm_tensor *t;
    if ((st = cm_tensor_new(dt, ndim, shape, &t))) return st;
    char *nm = dup_str(name);
    if (!nm) {
        cm_tensor_free(t);
        return CM_ERR_OOM;
    }
    m->buffers[m->n_buffers++] = (cmn_buffer){nm, t, slot, persistent};
    if (slot) *slot = t;
    return CM_OK;
}

cm_status cmn_unpack(cm_module *root); /* pack.c */

/* Installs child under m (name already validated); used by add_child and surgery. */
cm_status cm_module_add_child(cm_module *m, const char *name, cm_module *child, cm_module **slot) {
    cm_status st = check_new_member(m, "child", name);
    if (st) return st;
    if (!child) return cm_set_error(CM_ERR_INVALID_ARG, "cm_module_add_child('%s'): child is NULL", name);
    if (child->parent)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "cm_module_add_child('%s'): the %s module already has a parent ('%s'); a module lives in "
                            "one place in one tree",
                            name, child->vt->type_name, child->parent->vt->type_name);
    for (const cm_module *p = m; p; p = p->parent)
        if (p == child)
            return cm_set_error(CM_ERR_INVALID_ARG, "cm_module_add_child('%s'): the child is the module itself or "
                                                    "one of its ancestors (a cycle)",
                                name);
    if (cm_module_is_locked(child))
        return cm_set_error(CM_ERR_STATE, "cm_module_add_child('%s'): the child is locked by an optimizer", name);
    if (!grow((void **)&m->children, &m->cap_children, m->n_children, sizeof(cmn_child))) return CM_ERR_OOM;
    char *nm = dup_str(name);
    if (!nm) return CM_ERR_OOM;
    if (child->pack && (st = cmn_unpack(child))) {
        cm_free(nm);
        return st;
    }
    m->children[m->n_children++] = (cmn_child){nm, child, slot};
    child->parent = m;
    child->name = nm;
    if (slot) *slot = child;
    return CM_OK;
}

static cmn_param *own_param(const cm_module *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i].name, name)) return &m->params[i];
    return NULL;
}

cm_status cm_module_tie_param(cm_module *m, const char *name, cm_tensor *src) {
    if (!m || !name || !src) return cm_set_error(CM_ERR_INVALID_ARG, "cm_module_tie_param: NULL argument");
    cmn_param *p = own_param(m, name);
    if (!p)
        return cm_set_error(CM_ERR_NOT_FOUND, "cm_module_tie_param: %s module has no parameter '%s'",
                            m->vt->type_name, name);
    if (p->t == src) return CM_OK;
    if (cmn_root(m)->pack)
        return cm_set_error(CM_ERR_STATE,
                            "cm_module_tie_param('%s'): the model is already finalized; tie parameters while "
                            "building it, before cm_module_finalize",
                            name);
    if (src->dtype != CM_DTYPE_F32 || src->ndim != p->t->ndim ||
        memcmp(src->shape, p->t->shape, sizeof(int64_t) * (size_t)src->ndim) != 0)
        return cm_set_error(CM_ERR_SHAPE, "cm_module_tie_param('%s'): shapes differ: %s vs the source's %s (f32)",
                            name, cmi_shape(p->t), cmi_shape(src));
    if (p->owned) cm_tensor_free(p->t);
    p->t = src;
    p->owned = false;
    if (p->slot) *p->slot = src;
    return CM_OK;
}

cm_status cm_module_set_wrap_unit(cm_module *m, const char *unit_name) {
    if (!m) return cm_set_error(CM_ERR_INVALID_ARG, "cm_module_set_wrap_unit: module is NULL");
    char *u = dup_str(unit_name ? unit_name : "");
    if (!u) return CM_ERR_OOM;
    cm_free(m->unit);
    m->unit = u;
    return CM_OK;
}

/* ---- the tree ---- */

int cm_module_n_children(const cm_module *m) { return m ? m->n_children : 0; }
cm_module *cm_module_child_at(const cm_module *m, int i) {
    return (m && i >= 0 && i < m->n_children) ? m->children[i].m : NULL;
}
cm_module *cm_module_child(const cm_module *m, const char *name) {
    if (!m || !name) return NULL;
    for (int i = 0; i < m->n_children; i++)
        if (!strcmp(m->children[i].name, name)) return m->children[i].m;
    return NULL;
}

/* Walks the dotted prefix of path (all but the last component when `last` is set) from m.
 * *rest gets the last component. */
static cm_module *walk(const cm_module *m, const char *path, bool last, const char **rest) {
    const char *p = path;
    while (m) {
        const char *dot = strchr(p, '.');
        if (!dot) {
            if (last) {
                *rest = p;
                return (cm_module *)m;
            }
            return *p ? cm_module_child(m, p) : (cm_module *)m;
        }
        size_t n = (size_t)(dot - p);
        cm_module *next = NULL;
        for (int i = 0; i < m->n_children; i++)
            if (strlen(m->children[i].name) == n && !memcmp(m->children[i].name, p, n)) next = m->children[i].m;
        m = next;
        p = dot + 1;
    }
    return NULL;
}

cm_module *cm_module_find(const cm_module *m, const char *path) {
    if (!m || !path) return NULL;
    return walk(m, path, false, NULL);
}

cm_tensor *cm_module_param(const cm_module *m, const char *name) {
    if (!m || !name) return NULL;
    cmn_param *p = own_param(m, name);
    return p ? p->t : NULL;
}

cm_tensor *cm_module_buffer(const cm_module *m, const char *name) {
    if (!m || !name) return NULL;
    for (int i = 0; i < m->n_buffers; i++)
        if (!strcmp(m->buffers[i].name, name)) return m->buffers[i].t;
    return NULL;
}

int cm_module_n_own_params(const cm_module *m) { return m ? m->n_params : 0; }
cm_tensor *cm_module_own_param_at(const cm_module *m, int i, const char **name) {
    if (!m || i < 0 || i >= m->n_params) return NULL;
    if (name) *name = m->params[i].name;
    return m->params[i].t;
}

cm_tensor *cm_module_find_param(const cm_module *m, const char *path) {
    if (!m || !path) return NULL;
    const char *rest = NULL;
    cm_module *o = walk(m, path, true, &rest);
    return o ? cm_module_param(o, rest) : NULL;
}

cm_tensor *cm_module_find_buffer(const cm_module *m, const char *path) {
    if (!m || !path) return NULL;
    const char *rest = NULL;
    cm_module *o = walk(m, path, true, &rest);
    return o ? cm_module_buffer(o, rest) : NULL;
}

static bool visit_rec(cm_module *m, char *path, size_t len, size_t cap, int depth, cm_module_visit_fn fn,
                      void *data) {
    if (!fn(m, path, depth, data)) return false;
    for (int i = 0; i < m->n_children; i++) {
        int w = snprintf(path + len, cap - len, "%s%s", len ? "." : "", m->children[i].name);
        size_t nl = (w < 0 || (size_t)w >= cap - len) ? cap - 1 : len + (size_t)w;
        if (!visit_rec(m->children[i].m, path, nl, cap, depth + 1, fn, data)) return false;
        path[len] = '\0';
    }
    return true;
}

bool cm_module_visit(cm_module *m, cm_module_visit_fn fn, void *data) {
    if (!m || !fn) return true;
    char path[1024] = "";
    return visit_rec(m, path, 0, sizeof path, 0, fn, data);
}

static bool train_fn(cm_module *m, const char *path, int depth, void *data) {
    m->training = *(bool *)data;
    return true;
}
void cm_module_train(cm_module *m, bool on) { cm_module_visit(m, train_fn, &on); }
bool cm_module_is_training(const cm_module *m) { return m && m->training; }

static bool seed_fn(cm_module *m, const char *path, int depth, void *data) {
    if (cmn_is_dropout(m)) {
        char full[1024];
        cm_module_path(m, full, sizeof full);
        cmn_dropout_seed(m, *(uint64_t *)data, cm_hash64(full, strlen(full), 0));
    }
    return true;
}
void cm_module_set_seed(cm_module *m, uint64_t seed) { cm_module_visit(m, seed_fn, &seed); }

/* ---- forward ---- */

void cm_module_set_checkpointing(cm_module *m, bool on) {
    if (m) m->checkpoint = on;
}
bool cm_module_checkpointing(const cm_module *m) { return m && m->checkpoint; }
void cm_module_set_activation_offload(cm_module *m, bool on) {
    if (m) m->act_offload = on;
}
bool cm_module_activation_offload(const cm_module *m) { return m && m->act_offload; }

/* A checkpointed module's region: its own forward (cm_module_forward_n checked the inputs). */
static cm_tensor *module_region(cm_tape *tp, int n_in, cm_tensor *const *in, void *data) {
    cm_module *m = data;
    return m->vt->forward(m, tp, n_in, in);
}

cm_tensor *cm_module_forward_n(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    if (!tp || tp->status != CM_OK) return NULL;
    if (!m) return cmn_fail(tp, CM_ERR_INVALID_ARG, "cm_module_forward: module is NULL");
    char path[512];
    if (!m->vt->forward) {
        cm_module_path(m, path, sizeof path);
        return cmn_fail(tp, CM_ERR_UNSUPPORTED,
                        "in module %s (%s): this container has no forward; call its children (e.g. "
                        "cm_module_child_at)",
                        path[0] ? path : "<root>", m->vt->type_name);
    }
    if (n_in < 1 || !in || !in[0]) {
        cm_module_path(m, path, sizeof path);
        return cmn_fail(tp, CM_ERR_INVALID_ARG, "in module %s (%s): input 0 is NULL", path[0] ? path : "<root>",
                        m->vt->type_name);
    }
    if (m->checkpoint && m->act_offload) {
        cm_module_path(m, path, sizeof path);
        return cmn_fail(tp, CM_ERR_UNSUPPORTED,
                        "in module %s (%s): activation checkpointing and activation offload are both on; a "
                        "checkpointed module keeps only its input, so there is nothing to offload: choose one",
                        path[0] ? path : "<root>", m->vt->type_name);
    }
    cm_tensor *y = m->checkpoint && tp->grad_enabled     ? cm_tape_checkpoint(tp, module_region, m, n_in, in)
                   : m->act_offload && tp->grad_enabled ? cm_tape_offload(tp, module_region, m, n_in, in)
                                                        : m->vt->forward(m, tp, n_in, in);
    if (y && m->fwd_hook && !cm_tape_replaying(tp)) m->fwd_hook(m, n_in, in, y, m->fwd_hook_data);
    if (y) return y;
    cm_module_path(m, path, sizeof path);
    if (tp->status == CM_OK)
        return cmn_fail(tp, CM_ERR_INTERNAL, "in module %s (%s): forward returned NULL without recording an error",
                        path[0] ? path : "<root>", m->vt->type_name);
    if (strncmp(tp->error, "in module ", 10) != 0) {
        char msg[sizeof tp->error];
        int w = snprintf(msg, sizeof msg, "in module %s (%s): ", path[0] ? path : "<root>", m->vt->type_name);
        size_t used = w > 0 && (size_t)w < sizeof msg ? (size_t)w : 0;
        size_t rest = strnlen(tp->error, sizeof tp->error - 1);
        if (rest > sizeof msg - 1 - used) rest = sizeof msg - 1 - used;
        memcpy(msg + used, tp->error, rest);
        msg[used + rest] = '\0';
        memcpy(tp->error, msg, sizeof msg);
        cm_set_error(tp->status, "%s", tp->error);
    }
    return NULL;
}

cm_tensor *cm_module_forward(cm_module *m, cm_tape *tp, cm_tensor *x) { return cm_module_forward_n(m, tp, 1, &x); }

/* ---- summary ---- */

typedef struct {
    char *buf;
    size_t cap, len;
} sbuf;

static void sput(sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sput(sbuf *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = s->len < s->cap ? s->cap - s->len : 0;
    int w = vsnprintf(room ? s->buf + s->len : NULL, room, fmt, ap);
    va_end(ap);
    if (w > 0) s->len += (size_t)w;
}

static void summary_rec(const cm_module *m, sbuf *s, int depth) {
    char desc[256] = "";
    if (m->vt->describe) m->vt->describe(m, desc, sizeof desc);
    sput(s, "%s(%s", m->vt->type_name, desc);
    if (!m->n_children) {
        sput(s, ")");
        return;
    }
    sput(s, "\n");
    for (int i = 0; i < m->n_children; i++) {
        sput(s, "%*s(%s): ", 2 * (depth + 1), "", m->children[i].name);
        summary_rec(m->children[i].m, s, depth + 1);
        sput(s, "\n");
    }
    sput(s, "%*s)", 2 * depth, "");
}

size_t cm_module_summary(const cm_module *m, char *buf, size_t cap) {
    sbuf s = {buf, cap, 0};
    if (cap) buf[0] = '\0';
    if (!m) return 0;
    summary_rec(m, &s, 0);
    if (cap) buf[s.len < cap ? s.len : cap - 1] = '\0';
    return s.len;
}

static bool set_hook(cm_module *m, const char *path, int depth, void *data) {
    const cm_module *src = data;
    m->fwd_hook = src->fwd_hook;
    m->fwd_hook_data = src->fwd_hook_data;
    return true;
}

void cm_module_set_forward_hook(cm_module *m, cm_module_forward_hook_fn fn, void *data) {
    if (!m) return;
    cm_module src = {0};
    src.fwd_hook = fn;
    src.fwd_hook_data = fn ? data : NULL;
    cm_module_visit(m, set_hook, &src);
}
