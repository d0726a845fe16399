/* Flat parameter buffers (one per wrap unit), named parameters, counting, freezing, groups and
 * model surgery.
 *
 * Packing keeps each parameter's cm_tensor and moves only its memory: the tensor's data pointer is
 * rebound to its span of the unit's flat buffer (tensor internals, hence tensor_impl.h), so every
 * pointer to a parameter — in module state, in user code — stays valid across re-packs. The
 * gradient is a borrowed view (cm_tensor_set_grad) of the same span of the unit's gradient buffer. */
#include "nn/nn_impl.h"
#include "tensor/tensor_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cmn_entry {
    char *name;
    cm_module *m;
    int pi;         /* index in m->params */
    int unit;
    int64_t offset;
    int64_t numel;
    cm_tensor *gview;
} cmn_entry;

typedef struct cmn_bentry {
    char *name;
    cm_module *m;
    int bi;
} cmn_bentry;

struct cmn_pack {
    cm_unit_info *units;
    char **unit_names;
    int n_units;
    cmn_entry *params;
    int64_t n_params;
    cmn_bentry *buffers;
    int64_t n_buffers;
    int locks;
    cm_device device; /* of every unit's buffers (cm_module_to_device) */
};

void cmn_pack_free(cmn_pack *p) {
    if (!p) return;
    for (int64_t i = 0; i < p->n_params; i++) {
        cm_tensor_free(p->params[i].gview);
        cm_free(p->params[i].name);
    }
    for (int64_t i = 0; i < p->n_buffers; i++) cm_free(p->buffers[i].name);
    for (int u = 0; u < p->n_units; u++) {
        cmi_dev_free(p->device, p->units[u].params);
        cmi_dev_free(p->device, p->units[u].grads);
        cm_free(p->unit_names[u]);
    }
    cm_free(p->units);
    cm_free(p->unit_names);
    cm_free(p->params);
    cm_free(p->buffers);
    cm_free(p);
}

static char *join(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    char *s = cm_alloc(na + nb + 2, 8);
    if (!s) return NULL;
    if (na) {
        memcpy(s, a, na);
        s[na] = '.';
        memcpy(s + na + 1, b, nb + 1);
    } else {
        memcpy(s, b, nb + 1);
    }
    return s;
}

/* Points t at `data`; frees its old memory if it owned it. */
static void rebind(cm_tensor *t, void *data, bool owns) {
    if (t->flags & CM_TF_OWNS_DATA) cmi_dev_free(t->device, t->data);
    t->data = data;
    if (owns)
        t->flags |= CM_TF_OWNS_DATA;
    else
        t->flags &= ~(uint32_t)CM_TF_OWNS_DATA;
}

/* Gives every packed parameter its own memory again and drops the pack (the module joins
 * another tree). */
cm_status cmn_unpack(cm_module *root) {
    cmn_pack *p = root->pack;
    if (!p) return CM_OK;
    if (p->locks) return cm_set_error(CM_ERR_STATE, "cannot move a model that is locked by an optimizer");
    if (p->device != CM_DEVICE_CPU)
        return cm_set_error(CM_ERR_STATE, "cannot move a submodule of a model on %s: move the model to the CPU first "
                                          "(cm_module_to_device)", cm_device_name(p->device));
    void **mem = cm_alloc_zeroed(sizeof(void *) * (size_t)(p->n_params + 1), 8);
    if (!mem) return CM_ERR_OOM;
    for (int64_t i = 0; i < p->n_params; i++) {
        size_t bytes = (size_t)p->params[i].numel * sizeof(float);
        if (!(mem[i] = cm_alloc(bytes ? bytes : 1, 64))) {
            for (int64_t j = 0; j < i; j++) cm_free(mem[j]);
            cm_free(mem);
            return CM_ERR_OOM;
        }
    }
    for (int64_t i = 0; i < p->n_params; i++) {
        cm_tensor *t = p->params[i].m->params[p->params[i].pi].t;
        memcpy(mem[i], t->data, (size_t)p->params[i].numel * sizeof(float));
        cm_tensor_set_grad(t, NULL);
        rebind(t, mem[i], true);
    }
    cm_free(mem);
    cmn_pack_free(p);
    root->pack = NULL;
    root->layout_version++;
    return CM_OK;
}

/* ---- building the layout ---- */

typedef struct {
    cmn_entry *e;
    int64_t n, cap;
    cmn_bentry *b;
    int64_t nb, capb;
    char **units;
    int n_units, cap_units;
    cm_status st;
    cm_module *root;
} layout;

static bool push(void **arr, int64_t *cap, int64_t n, size_t elem) {
    if (n < *cap) return true;
    int64_t nc = *cap ? *cap * 2 : 16;
    void *na = cm_alloc(elem * (size_t)nc, 8);
    if (!na) return false;
    if (*arr) memcpy(na, *arr, elem * (size_t)n);
    cm_free(*arr);
    *arr = na;
    *cap = nc;
    return true;
}

static int unit_index(layout *L, const char *name) {
    for (int u = 0; u < L->n_units; u++)
        if (!strcmp(L->units[u], name)) return u;
    int64_t cap = L->cap_units, n = L->n_units;
    if (!push((void **)&L->units, &cap, n, sizeof(char *))) return -1;
    L->cap_units = (int)cap;
    char *nm = join("", name);
    if (!nm) return -1;
    L->units[L->n_units] = nm;
    return L->n_units++;
}

static bool layout_rec(layout *L, cm_module *m, const char *path, const char *unit) {
    if (m->unit) unit = m->unit[0] ? m->unit : (path[0] ? path : "root");
    int u = -1;
    for (int i = 0; i < m->n_params; i++) {
        if (!m->params[i].owned) continue;
        if (u < 0 && (u = unit_index(L, unit)) < 0) return false;
        if (!push((void **)&L->e, &L->cap, L->n, sizeof(cmn_entry))) return false;
        char *nm = join(path, m->params[i].name);
        if (!nm) return false;
        L->e[L->n++] = (cmn_entry){nm, m, i, u, 0, cm_tensor_numel(m->params[i].t), NULL};
    }
    for (int i = 0; i < m->n_buffers; i++) {
        if (!m->buffers[i].persistent) continue;
        if (!push((void **)&L->b, &L->capb, L->nb, sizeof(cmn_bentry))) return false;
        char *nm = join(path, m->buffers[i].name);
        if (!nm) return false;
        L->b[L->nb++] = (cmn_bentry){nm, m, i};
    }
    for (int i = 0; i < m->n_children; i++) {
        char *cp = join(path, m->children[i].name);
        if (!cp) return false;
        bool ok = layout_rec(L, m->children[i].m, cp, unit);
        cm_free(cp);
        if (!ok) return false;
    }
    return true;
}

/* A tied parameter whose tensor no parameter in the tree owns: its owner was freed or lives in
 * another tree. */
static bool check_ties(layout *L, cm_module *m, const char *path) {
    for (int i = 0; i < m->n_params; i++) {
        if (m->params[i].owned) continue;
        bool found = false;
        for (int64_t k = 0; k < L->n && !found; k++) found = L->e[k].m->params[L->e[k].pi].t == m->params[i].t;
        if (!found) {
            L->st = cm_set_error(CM_ERR_STATE,
                                 "cm_module_finalize: parameter '%s%s%s' is tied to a tensor that no parameter of "
                                 "this model owns (tie to a parameter of the same tree)",
                                 path, path[0] ? "." : "", m->params[i].name);
            return false;
        }
    }
    for (int i = 0; i < m->n_children; i++) {
        char *cp = join(path, m->children[i].name);
        if (!cp) return false;
        bool ok = check_ties(L, m->children[i].m, cp);
        cm_free(cp);
        if (!ok) return false;
    }
    return true;
}

static void layout_free(layout *L) {
    for (int64_t i = 0; i < L->n; i++) {
        cm_tensor_free(L->e[i].gview);
        cm_free(L->e[i].name);
    }
    for (int64_t i = 0; i < L->nb; i++) cm_free(L->b[i].name);
    for (int u = 0; u < L->n_units; u++) cm_free(L->units[u]);
    cm_free(L->e);
    cm_free(L->b);
    cm_free(L->units);
}

static bool seed_at_finalize(cm_module *m, const char *path, int depth, void *data) {
    if (cmn_is_dropout(m)) {
        cm_rng *r = cm_nn_dropout_rng(m);
        cmn_dropout_seed(m, r->seed, cm_hash64(path, strlen(path), 0));
    }
    return true;
}

cm_status cm_module_finalize(cm_module *root) {
    if (!root) return cm_set_error(CM_ERR_INVALID_ARG, "cm_module_finalize: module is NULL");
    if (root->parent)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "cm_module_finalize: module '%s' (%s) has a parent; finalize the root of the tree",
                            root->name, root->vt->type_name);
    if (root->pack && root->pack->locks)
        return cm_set_error(CM_ERR_STATE, "cm_module_finalize: the model is locked by an optimizer; build and "
                                          "change the model (surgery included) before creating the optimizer");
    if (root->pack && root->pack->device != CM_DEVICE_CPU)
        return cm_set_error(CM_ERR_STATE, "cm_module_finalize: the model is on %s; re-packing and surgery need it on "
                                          "the CPU (cm_module_to_device(root, CM_DEVICE_CPU) first)",
                            cm_device_name(root->pack->device));
    layout L = {0};
    L.root = root;
    L.st = CM_OK;
    if (!layout_rec(&L, root, "", "root") || !check_ties(&L, root, "")) {
        cm_status st = L.st ? L.st : CM_ERR_OOM;
        layout_free(&L);
        return st;
    }
    cmn_pack *p = cm_alloc_zeroed(sizeof *p, 8);
    cm_unit_info *units = cm_alloc_zeroed(sizeof(cm_unit_info) * (size_t)(L.n_units + 1), 8);
    if (!p || !units) goto oom;
    p->units = units;
    for (int64_t i = 0; i < L.n; i++) {
        cm_unit_info *u = &units[L.e[i].unit];
        L.e[i].offset = u->numel;
        u->numel += L.e[i].numel;
        u->n_params++;
    }
    for (int u = 0; u < L.n_units; u++) {
        size_t bytes = (size_t)units[u].numel * sizeof(float);
        units[u].name = L.units[u];
        units[u].params = cm_alloc(bytes ? bytes : 64, 64);
        units[u].grads = cm_alloc_zeroed(bytes ? bytes : 64, 64);
        if (!units[u].params || !units[u].grads) goto oom;
    }
    for (int64_t i = 0; i < L.n; i++) {
        cm_tensor *t = L.e[i].m->params[L.e[i].pi].t;
        if (cm_tensor_from_data(CM_DTYPE_F32, t->ndim, t->shape, units[L.e[i].unit].grads + L.e[i].offset,
                                &L.e[i].gview))
            goto oom;
    }
    /* commit: nothing fails from here on */
    for (int64_t i = 0; i < L.n; i++) {
        cm_tensor *t = L.e[i].m->params[L.e[i].pi].t;
        float *dst = units[L.e[i].unit].params + L.e[i].offset;
        memcpy(dst, t->data, (size_t)L.e[i].numel * sizeof(float));
        rebind(t, dst, false);
        cm_tensor_set_grad(t, L.e[i].gview);
    }
    p->unit_names = L.units;
    p->n_units = L.n_units;
    p->params = L.e;
    p->n_params = L.n;
    p->buffers = L.b;
    p->n_buffers = L.nb;
    cmn_pack_free(root->pack); /* the old flat buffers: no tensor points into them any more */
    root->pack = p;
    root->layout_version++;
    cm_module_visit(root, seed_at_finalize, NULL);
    return CM_OK;
oom:
    if (units)
        for (int u = 0; u < L.n_units; u++) {
            cm_free(units[u].params);
            cm_free(units[u].grads);
        }
    cm_free(units);
    cm_free(p);
    layout_free(&L);
    return cm_set_error(CM_ERR_OOM, "cm_module_finalize: out of memory packing the parameters (the model is "
                                    "unchanged)");
}

/* Moves unit u's flat buffers into new ones of `capacity` ≥ numel floats (the tail zero), keeping
 * the values and every tensor's identity: the distributed layer pads units to a multiple of the
 * world size so collectives need no staging copies. */
cm_status cmn_unit_reserve(cm_module *root, int u, int64_t capacity, size_t align) {
    cmn_pack *p = root ? root->pack : NULL;
    if (!p || u < 0 || u >= p->n_units)
        return cm_set_error(CM_ERR_INVALID_ARG, "unit %d: the model is not finalized or has no such unit", u);
    if (p->locks)
        return cm_set_error(CM_ERR_STATE, "unit '%s': the model is locked by an optimizer or a trainer; set up data "
                                          "parallelism (cm_dist_new) before creating them", p->units[u].name);
    if (p->device != CM_DEVICE_CPU)
        return cm_set_error(CM_ERR_UNSUPPORTED, "unit '%s': sharded data parallelism of a model on %s is not "
                                                "supported yet (multi-GPU training needs NCCL)",
                            p->units[u].name, cm_device_name(p->device));
    cm_unit_info *ui = &p->units[u];
    if (capacity < ui->numel) capacity = ui->numel;
    const size_t bytes = (size_t)capacity * sizeof(float), used = (size_t)ui->numel * sizeof(float);
    if (align < 64) align = 64;
    float *np = cm_alloc_zeroed(bytes ? bytes : 64, align), *ng = cm_alloc_zeroed(bytes ? bytes : 64, align);
    if (!np || !ng) {
        cm_free(np);
        cm_free(ng);
        return cm_set_error(CM_ERR_OOM, "unit '%s': out of memory for %lld floats", ui->name, (long long)capacity);
    }
    memcpy(np, ui->params, used);
    memcpy(ng, ui->grads, used);
    for (int64_t i = 0; i < p->n_params; i++) {
        cmn_entry *e = &p->params[i];
        if (e->unit != u) continue;
        rebind(e->m->params[e->pi].t, np + e->offset, false);
        e->gview->data = ng + e->offset;
    }
    cm_free(ui->params);
    cm_free(ui->grads);
    ui->params = np;
    ui->grads = ng;
    return CM_OK;
}

bool cm_module_is_finalized(const cm_module *root) { return root && root->pack; }
uint64_t cm_module_layout_version(const cm_module *root) { return root ? root->layout_version : 0; }

cm_device cm_module_device(const cm_module *root) { return root && root->pack ? root->pack->device : CM_DEVICE_CPU; }

typedef struct {
    cm_device dev;
    cm_status st;
    int pass; /* 0: allocate and copy into scratch[i]; 1: commit */
    void **scratch;
    int64_t n, cap;
} buf_move;

/* Every buffer of every module (persistent or not) gets a copy on the target device (pass 0), then
 * is rebound to it (pass 1). */
static bool move_buffers(cm_module *m, const char *path, int depth, void *data) {
    (void)path, (void)depth;
    buf_move *bm = data;
    for (int i = 0; i < m->n_buffers && bm->st == CM_OK; i++) {
        cm_tensor *t = m->buffers[i].t;
        if (bm->pass == 0) {
            if (bm->n == bm->cap) {
                int64_t cap = bm->cap ? bm->cap * 2 : 16;
                void **ns = cm_alloc(sizeof(void *) * (size_t)cap, 8);
                if (!ns) {
                    bm->st = CM_ERR_OOM;
                    return false;
                }
                if (bm->n) memcpy(ns, bm->scratch, sizeof(void *) * (size_t)bm->n);
                cm_free(bm->scratch);
                bm->scratch = ns;
                bm->cap = cap;
            }
            const size_t bytes = cm_tensor_nbytes(t);
            void *d = cmi_dev_alloc(bm->dev, bytes, false);
            bm->scratch[bm->n++] = d;
            if (!d) bm->st = cm_last_status() ? cm_last_status() : CM_ERR_OOM;
            else if (!cmi_is_contig(t))
                bm->st = cm_set_error(CM_ERR_UNSUPPORTED, "buffer '%s' of %s is not contiguous", m->buffers[i].name,
                                      m->name);
            else bm->st = cmi_dev_memcpy(d, bm->dev, t->data, t->device, bytes);
        } else {
            const bool owned = t->flags & CM_TF_OWNS_DATA;
            if (owned) cmi_dev_free(t->device, t->data);
            t->data = bm->scratch[bm->n++];
            t->device = bm->dev;
            t->flags |= CM_TF_OWNS_DATA;
            if (t->grad) cm_tensor_clear_grad(t);
        }
    }
    return bm->st == CM_OK;
}

cm_status cm_module_to_device(cm_module *root, cm_device dev) {
    cmn_pack *p = root ? root->pack : NULL;
    if (!p)
        return cm_set_error(CM_ERR_STATE, "cm_module_to_device: the model is not finalized (cm_module_finalize first)");
    if (p->locks)
        return cm_set_error(CM_ERR_STATE, "cm_module_to_device: the model is locked by an optimizer or a trainer; move "
                                          "it before creating them");
    if (p->device == dev) return CM_OK;
    cm_status st = cm_device_check(dev);
    if (st) return st;
    const cm_device from = p->device;
    /* allocate and copy everything first, so a failure leaves the model as it was */
    float **np = cm_alloc_zeroed(sizeof(float *) * (size_t)(2 * p->n_units + 1), 8);
    if (!np) return CM_ERR_OOM;
    float **ng = np + p->n_units;
    buf_move bm = {dev, CM_OK, 0, NULL, 0, 0};
    for (int u = 0; u < p->n_units && st == CM_OK; u++) {
        const size_t bytes = (size_t)p->units[u].numel * sizeof(float);
        np[u] = cmi_dev_alloc(dev, bytes, false);
        ng[u] = cmi_dev_alloc(dev, bytes, false);
        if (!np[u] || !ng[u]) st = cm_last_status() ? cm_last_status() : CM_ERR_OOM;
        if (!st) st = cmi_dev_memcpy(np[u], dev, p->units[u].params, from, bytes);
        if (!st) st = cmi_dev_memcpy(ng[u], dev, p->units[u].grads, from, bytes);
    }
    if (!st) {
        cm_module_visit(root, move_buffers, &bm);
        st = bm.st;
    }
    if (st) {
        for (int u = 0; u < p->n_units; u++) {
            cmi_dev_free(dev, np[u]);
            cmi_dev_free(dev, ng[u]);
        }
        for (int64_t i = 0; i < bm.n; i++) cmi_dev_free(dev, bm.scratch[i]);
        cm_free(bm.scratch);
        cm_free(np);
        return st;
    }
    /* commit: nothing fails from here on */
    for (int64_t i = 0; i < p->n_params; i++) {
        cmn_entry *e = &p->params[i];
        cm_tensor *t = e->m->params[e->pi].t;
        t->data = np[e->unit] + e->offset;
        t->device = dev;
        e->gview->data = ng[e->unit] + e->offset;
        e->gview->device = dev;
        if (t->grad != e->gview) cm_tensor_set_grad(t, e->gview);
    }
    for (int u = 0; u < p->n_units; u++) {
        cmi_dev_free(from, p->units[u].params);
        cmi_dev_free(from, p->units[u].grads);
        p->units[u].params = np[u];
        p->units[u].grads = ng[u];
        p->units[u].device = dev;
    }
    bm.pass = 1;
    bm.n = 0;
    cm_module_visit(root, move_buffers, &bm);
    cm_free(bm.scratch);
    cm_free(np);
    p->device = dev;
    return CM_OK;
}

void cmn_unit_rebind(cm_module *root, int u, float *params, float *grads, cm_device dev, float **old_params,
                     float **old_grads) {
    cmn_pack *p = root->pack;
    cm_unit_info *ui = &p->units[u];
    if (old_params) *old_params = ui->params;
    if (old_grads) *old_grads = ui->grads;
    for (int64_t i = 0; i < p->n_params; i++) {
        cmn_entry *e = &p->params[i];
        if (e->unit != u) continue;
        cm_tensor *t = e->m->params[e->pi].t;
        t->data = params + e->offset;
        t->device = dev;
        t->flags &= ~(uint32_t)CM_TF_OWNS_DATA;
        e->gview->data = grads + e->offset;
        e->gview->device = dev;
        if (t->grad != e->gview) cm_tensor_set_grad(t, e->gview);
    }
    ui->params = params;
    ui->grads = grads;
    ui->device = dev;
}

cm_status cmn_buffers_to_device(cm_module *root, cm_device dev) {
    cmn_pack *p = root ? root->pack : NULL;
    if (!p) return cm_set_error(CM_ERR_STATE, "the model is not finalized");
    buf_move bm = {dev, CM_OK, 0, NULL, 0, 0};
    cm_module_visit(root, move_buffers, &bm);
    if (bm.st) {
        for (int64_t i = 0; i < bm.n; i++) cmi_dev_free(dev, bm.scratch[i]);
        cm_free(bm.scratch);
        return bm.st;
    }
    bm.pass = 1;
    bm.n = 0;
    cm_module_visit(root, move_buffers, &bm);
    cm_free(bm.scratch);
    p->device = dev;
    return CM_OK;
}

/* ---- queries ---- */

int cm_module_n_units(const cm_module *root) { return root && root->pack ? root->pack->n_units : 0; }
const cm_unit_info *cm_module_unit(const cm_module *root, int i) {
    if (!root || !root->pack || i < 0 || i >= root->pack->n_units) return NULL;
    return &root->pack->units[i];
}
int64_t cm_module_n_params(const cm_module *root) { return root && root->pack ? root->pack->n_params : 0; }

cm_param_info cm_module_param_info(const cm_module *root, int64_t i) {
    cm_param_info pi = {0};
    if (!root || !root->pack || i < 0 || i >= root->pack->n_params) return pi;
    const cmn_entry *e = &root->pack->params[i];
    const cmn_param *p = &e->m->params[e->pi];
    pi.name = e->name;
    pi.tensor = p->t;
    pi.module = e->m;
    pi.unit = e->unit;
    pi.offset = e->offset;
    pi.numel = e->numel;
    pi.requires_grad = cm_tensor_requires_grad(p->t);
    pi.no_decay = p->no_decay;
    return pi;
}

int64_t cm_module_n_buffers(const cm_module *root) { return root && root->pack ? root->pack->n_buffers : 0; }
cm_buffer_info cm_module_buffer_info(const cm_module *root, int64_t i) {
    cm_buffer_info bi = {0};
    if (!root || !root->pack || i < 0 || i >= root->pack->n_buffers) return bi;
    const cmn_bentry *b = &root->pack->buffers[i];
    bi.name = b->name;
    bi.tensor = b->m->buffers[b->bi].t;
    bi.module = b->m;
    return bi;
}

int64_t cm_module_param_index(const cm_module *root, const char *name) {
    if (!root || !root->pack || !name) return -1;
    const cmn_pack *p = root->pack;
    for (int64_t i = 0; i < p->n_params; i++)
        if (!strcmp(p->params[i].name, name)) return i;
    cm_tensor *t = cm_module_find_param(root, name); /* a tied name */
    for (int64_t i = 0; t && i < p->n_params; i++)
        if (p->params[i].m->params[p->params[i].pi].t == t) return i;
    return -1;
}

static bool count_fn(cm_module *m, const char *path, int depth, void *data) {
    int64_t *acc = data; /* acc[0] = total, acc[1] = trainable_only flag */
    for (int i = 0; i < m->n_params; i++) {
        if (!m->params[i].owned) continue;
        if (acc[1] && !cm_tensor_requires_grad(m->params[i].t)) continue;
        acc[0] += cm_tensor_numel(m->params[i].t);
    }
    return true;
}

int64_t cm_module_count_params(const cm_module *m, bool trainable_only) {
    int64_t acc[2] = {0, trainable_only};
    cm_module_visit((cm_module *)m, count_fn, acc);
    return acc[0];
}

bool cm_name_match(const char *g, const char *s) {
    if (!g || !s) return false;
    const char *star = NULL, *ss = NULL;
    while (*s) {
        if (*g == '?' || *g == *s) {
            g++, s++;
        } else if (*g == '*') {
            star = g++;
            ss = s;
        } else if (star) {
            g = star + 1;
            s = ++ss;
        } else {
            return false;
        }
    }
    while (*g == '*') g++;
    return !*g;
}

typedef struct {
    const char *glob;
    bool on;
    int what; /* 0 requires_grad, 1 no_decay */
    int64_t n;
} flag_ctx;

static bool flag_fn(cm_module *m, const char *path, int depth, void *data) {
    flag_ctx *c = data;
    char name[1024];
    for (int i = 0; i < m->n_params; i++) {
        if (!m->params[i].owned) continue;
        snprintf(name, sizeof name, "%s%s%s", path, path[0] ? "." : "", m->params[i].name);
        if (c->glob && !cm_name_match(c->glob, name)) continue;
        c->n++;
        if (c->what == 0) {
            cm_tensor_set_requires_grad(m->params[i].t, c->on);
            if (!c->on) cm_tensor_zero_grad(m->params[i].t);
        } else {
            m->params[i].no_decay = c->on;
        }
    }
    return true;
}

static cm_status set_flag(cm_module *m, const char *glob, bool on, int what, int64_t *n_matched) {
    const char *fn = what ? "cm_module_set_no_decay" : "cm_module_set_requires_grad";
    if (n_matched) *n_matched = 0;
    if (!m) return cm_set_error(CM_ERR_INVALID_ARG, "%s: module is NULL", fn);
    flag_ctx c = {glob, on, what, 0};
    cm_module_visit(m, flag_fn, &c);
    if (n_matched) *n_matched = c.n;
    if (!c.n)
        return cm_set_error(CM_ERR_NOT_FOUND,
                            "%s: no parameter matches '%s' ('*' matches any run of characters, dots included; names "
                            "are dotted paths such as 'h.0.attn.c_attn.weight')",
                            fn, glob ? glob : "*");
    return CM_OK;
}

cm_status cm_module_set_requires_grad(cm_module *m, const char *glob, bool on, int64_t *n_matched) {
    return set_flag(m, glob, on, 0, n_matched);
}
cm_status cm_module_set_no_decay(cm_module *m, const char *glob, bool on, int64_t *n_matched) {
    return set_flag(m, glob, on, 1, n_matched);
}

typedef struct {
    const cm_tensor *t;
    int found; /* 0 not found, 1 decay, 2 no decay */
} nd_ctx;

static bool nd_fn(cm_module *m, const char *path, int depth, void *data) {
    nd_ctx *c = data;
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i].owned && m->params[i].t == c->t) {
            c->found = m->params[i].no_decay ? 2 : 1;
            return false;
        }
    return true;
}

bool cm_module_param_no_decay(const cm_module *m, const cm_tensor *param) {
    nd_ctx c = {param, 0};
    cm_module_visit((cm_module *)m, nd_fn, &c);
    return c.found == 2;
}

int64_t cm_module_select_params(const cm_module *root, cm_param_pred pred, void *data, int64_t *idx) {
    int64_t n = 0, np = cm_module_n_params(root);
    for (int64_t i = 0; i < np; i++) {
        cm_param_info pi = cm_module_param_info(root, i);
        if (pred && pred(&pi, data)) idx[n++] = i;
    }
    return n;
}

void cm_module_zero_grad(cm_module *root) {
    if (!root || !root->pack) return;
    cmn_pack *p = root->pack;
    for (int u = 0; u < p->n_units; u++)
        cmi_dev_memset(p->device, p->units[u].grads, 0, (size_t)p->units[u].numel * sizeof(float));
    for (int64_t i = 0; i < p->n_params; i++) {
        cm_tensor *t = p->params[i].m->params[p->params[i].pi].t;
        if (t->grad != p->params[i].gview) cm_tensor_set_grad(t, p->params[i].gview);
    }
}

void cmn_relink_grads(cm_module *root) {
    if (!root || !root->pack) return;
    cmn_pack *p = root->pack;
    for (int64_t i = 0; i < p->n_params; i++) {
        cm_tensor *t = p->params[i].m->params[p->params[i].pi].t;
        if (t->grad != p->params[i].gview) cm_tensor_set_grad(t, p->params[i].gview);
    }
}

cm_status cm_module_lock(cm_module *root) {
    if (!root || !root->pack)
        return cm_set_error(CM_ERR_STATE, "cm_module_lock: the model is not finalized (call cm_module_finalize "
                                          "before creating the optimizer)");
    root->pack->locks++;
    return CM_OK;
}
void cm_module_unlock(cm_module *root) {
    if (root && root->pack && root->pack->locks > 0) root->pack->locks--;
}
bool cm_module_is_locked(const cm_module *root) { return root && root->pack && root->pack->locks > 0; }

/* ---- surgery ---- */

bool cm_module_match_type(cm_module *m, const char *path, void *data) {
    return data && !strcmp(m->vt->type_name, (const char *)data);
}

typedef struct {
    const cm_tensor **owned;
    int64_t n_owned;
    const cm_module *sub;
    bool tied;
} tie_ctx;

static bool collect_owned(cm_module *m, const char *path, int depth, void *data) {
    int64_t *n = data;
    for (int i = 0; i < m->n_params; i++) *n += m->params[i].owned;
    return true;
}

typedef struct {
    const cm_tensor **arr;
    int64_t n;
} owned_list;

static bool fill_owned(cm_module *m, const char *path, int depth, void *data) {
    owned_list *L = data;
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i].owned) L->arr[L->n++] = m->params[i].t;
    return true;
}

static bool in_subtree(const cm_module *m, const cm_module *sub) {
    for (; m; m = m->parent)
        if (m == sub) return true;
    return false;
}

static bool find_tie(cm_module *m, const char *path, int depth, void *data) {
    tie_ctx *c = data;
    if (in_subtree(m, c->sub)) return true;
    for (int i = 0; i < m->n_params; i++) {
        if (m->params[i].owned) continue;
        for (int64_t k = 0; k < c->n_owned; k++)
            if (c->owned[k] == m->params[i].t) {
                c->tied = true;
                return false;
            }
    }
    return true;
}

/* Does a parameter outside `sub` (in root's tree) share a tensor owned inside sub? */
static cm_status tied_from_outside(cm_module *root, cm_module *sub, bool *tied) {
    int64_t n = 0;
    cm_module_visit(sub, collect_owned, &n);
    *tied = false;
    if (!n) return CM_OK;
    owned_list L = {cm_alloc(sizeof(cm_tensor *) * (size_t)n, 8), 0};
    if (!L.arr) return CM_ERR_OOM;
    cm_module_visit(sub, fill_owned, &L);
    tie_ctx c = {L.arr, L.n, sub, false};
    cm_module_visit(root, find_tie, &c);
    cm_free(L.arr);
    *tied = c.tied;
    return CM_OK;
}

typedef struct {
    cm_module *root;
    cm_module_match_fn match;
    cm_module_make_fn make;
    void *data;
    int64_t n;
} surgery;

static cm_status replace_rec(surgery *S, cm_module *m, const char *path) {
    for (int i = 0; i < m->n_children; i++) {
        cm_module *c = m->children[i].m;
        char *cp = join(path, m->children[i].name);
        if (!cp) return CM_ERR_OOM;
        cm_status st = CM_OK;
        if (!S->match(c, cp, S->data)) {
            st = replace_rec(S, c, cp);
            cm_free(cp);
            if (st) return st;
            continue;
        }
        bool tied = false;
        if ((st = tied_from_outside(S->root, c, &tied))) goto done;
        if (tied) {
            st = cm_set_error(CM_ERR_STATE,
                              "cm_module_replace: '%s' (%s) owns a parameter that is tied elsewhere in the model; "
                              "untie it or replace the module that uses the tie instead",
                              cp, c->vt->type_name);
            goto done;
        }
        /* detach c while make runs, so make may adopt it (cm_module_add_child needs a parentless child) */
        c->parent = NULL;
        cm_module *nw = NULL;
        st = S->make(c, cp, S->data, &nw);
        bool adopted = c->parent != NULL;
        if (!adopted) c->parent = m;
        if (st) goto done;
        if (!nw) {
            st = cm_set_error(CM_ERR_INVALID_ARG, "cm_module_replace: the make function returned no module for '%s'",
                              cp);
            goto done;
        }
        if (nw == c) goto done; /* kept as it is */
        if (nw->parent || nw == S->root) {
            st = cm_set_error(CM_ERR_INVALID_ARG,
                              "cm_module_replace: the replacement for '%s' already has a parent; return a new "
                              "parentless module (it may adopt the old one)",
                              cp);
            goto done;
        }
        if (nw->pack && (st = cmn_unpack(nw))) {
            if (!adopted) cm_module_free(nw);
            goto done;
        }
        nw->parent = m;
        nw->name = m->children[i].name;
        m->children[i].m = nw;
        if (m->children[i].slot) *m->children[i].slot = nw;
        cm_module_train(nw, c->training);
        if (!adopted) {
            c->parent = NULL;
            cm_module_free(c);
        }
        S->n++;
    done:
        cm_free(cp);
        if (st) return st;
    }
    return CM_OK;
}

cm_status cm_module_replace(cm_module *root, cm_module_match_fn match, cm_module_make_fn make, void *data,
                            int64_t *n_replaced) {
    if (n_replaced) *n_replaced = 0;
    if (!root || !match || !make) return cm_set_error(CM_ERR_INVALID_ARG, "cm_module_replace: NULL argument");
    if (root->parent)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_module_replace: run surgery on the root of the model");
    if (cm_module_is_locked(root))
        return cm_set_error(CM_ERR_STATE, "cm_module_replace: model surgery after the optimizer was created; do "
                                          "model surgery before creating the optimizer (the optimizer holds the flat "
                                          "parameter buffers that surgery re-packs)");
    surgery S = {root, match, make, data, 0};
    cm_status st = replace_rec(&S, root, "");
    if (n_replaced) *n_replaced = S.n;
    if (root->pack && S.n) {
        char saved[1024] = "";
        if (st) snprintf(saved, sizeof saved, "%s", cm_last_error());
        cm_status st2 = cm_module_finalize(root);
        if (st) {
            cm_set_error(st, "%s", saved);
            return st;
        }
        return st2;
    }
    return st;
}
