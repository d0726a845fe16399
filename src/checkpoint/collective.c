/* Checkpoints of multi-rank runs: agreement between ranks (same outcome and message everywhere),
 * this rank's pieces under sharding, and the load plan (which elements of which checkpoint
 * tensor go where on this rank) that lets a checkpoint saved by N ranks load on M. */
#include "checkpoint/ckpt_impl.h"
#include "tensor/tensor_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

cm_status (*cmi_ckpt_fault_hook)(const char *point, int rank);

void cmi_shard_range(int64_t numel, int w, int r, int64_t *begin, int64_t *end) {
    const int64_t chunk = w > 0 ? (numel + w - 1) / w : numel;
    int64_t b = (int64_t)r * chunk;
    if (b > numel) b = numel;
    int64_t e = b + chunk;
    if (e > numel) e = numel;
    *begin = b, *end = e;
}

bool cmi_multi(const cm_trainer *tr) { return tr->dist.world_size > 1; }

/* ---------------------------------------------------------------------------------------------
 * Agreement
 * ------------------------------------------------------------------------------------------- */

typedef struct agree_rec {
    int32_t status;
    char msg[1276];
} agree_rec;

cm_status cmi_dist_agree(cm_trainer *tr, cm_status mine, const char *what) {
    if (!cmi_multi(tr)) return mine;
    const int w = tr->dist.world_size;
    agree_rec me = {(int32_t)mine, ""};
    if (mine) snprintf(me.msg, sizeof me.msg, "%s", cm_last_error());
    agree_rec *all = cm_alloc(sizeof *all * (size_t)w, 16);
    if (!all) return cm_set_error(CM_ERR_OOM, "%s: out of memory", what);
    cm_status s = tr->dist.all_gather(&me, all, (int64_t)sizeof me, tr->dist.data);
    if (s) {
        char msg[1500];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        cm_free(all);
        return cm_set_error(s, "%s: the ranks could not agree on the outcome (%s)", what, msg);
    }
    for (int r = 0; r < w; r++) {
        if (!all[r].status) continue;
        all[r].msg[sizeof all[r].msg - 1] = 0;
        s = cm_set_error((cm_status)all[r].status, "%s: rank %d of %d: %s", what, r, w, all[r].msg);
        break;
    }
    cm_free(all);
    return s;
}

cm_status cmi_dist_bcast(cm_trainer *tr, void *buf, size_t n) {
    if (!cmi_multi(tr)) return CM_OK;
    return tr->dist.broadcast(buf, (int64_t)n, 0, tr->dist.data);
}

cm_status cmi_dist_gather(cm_trainer *tr, cm_status mine, const char *text, cm_status **status, char ***texts) {
    *status = NULL, *texts = NULL;
    const bool multi = cmi_multi(tr);
    const int w = multi ? tr->dist.world_size : 1;
    if (!text) text = "";
    int64_t me[2] = {(int64_t)mine, (int64_t)strlen(text)};
    int64_t *hdr = cm_alloc(sizeof *hdr * 2 * (size_t)w, 16);
    if (!hdr) return cm_set_error(CM_ERR_OOM, "checkpoint: out of memory");
    cm_status s = CM_OK;
    if (multi) s = tr->dist.all_gather(me, hdr, (int64_t)sizeof me, tr->dist.data);
    else memcpy(hdr, me, sizeof me);
    int64_t mx = 1;
    for (int r = 0; !s && r < w; r++) {
        const int64_t len = hdr[2 * r + 1];
        if (len < 0 || len > ((int64_t)1 << 30))
            s = cm_set_error(CM_ERR_FORMAT, "checkpoint: rank %d sent a text of %lld bytes", r, (long long)len);
        else if (len + 1 > mx)
            mx = len + 1;
    }
    char *pad = NULL, *blob = NULL, **tv = NULL;
    cm_status *sv = NULL;
    if (!s) {
        pad = cm_alloc_zeroed((size_t)mx, 16);
        blob = cm_alloc_zeroed((size_t)mx * (size_t)w, 16);
        tv = cm_alloc(sizeof *tv * (size_t)w, 16);
        sv = cm_alloc(sizeof *sv * (size_t)w, 16);
        if (!pad || !blob || !tv || !sv) s = cm_set_error(CM_ERR_OOM, "checkpoint: out of memory");
    }
    if (!s) {
        memcpy(pad, text, (size_t)me[1]);
        if (multi) s = tr->dist.all_gather(pad, blob, mx, tr->dist.data);
        else memcpy(blob, pad, (size_t)mx);
    }
    if (!s)
        for (int r = 0; r < w; r++) {
            tv[r] = blob + (size_t)r * (size_t)mx;
            tv[r][mx - 1] = 0;
            sv[r] = (cm_status)hdr[2 * r];
        }
    cm_free(pad);
    cm_free(hdr);
    if (s) {
        cm_free(blob);
        cm_free(tv);
        cm_free(sv);
        return s;
    }
    *texts = tv; /* tv[0] is the start of blob: see cmi_dist_gather_free */
    *status = sv;
    return CM_OK;
}

void cmi_dist_gather_free(cm_status *status, char **texts) {
    if (texts) cm_free(texts[0]);
    cm_free(texts);
    cm_free(status);
}

/* ---------------------------------------------------------------------------------------------
 * This rank's pieces
 * ------------------------------------------------------------------------------------------- */

static const cm_shard_span *span_of_unit(const cm_trainer *tr, int unit) {
    for (int i = 0; i < tr->dist.n_shard_spans; i++)
        if (tr->dist.shard_spans[i].unit == unit) return &tr->dist.shard_spans[i];
    return NULL;
}

/* The global tensor an optimizer entry belongs to: piece [*b, *e) of a (*gnumel,) tensor when the
 * entry is this rank's share of a unit's state; the whole entry otherwise (replicated: "step").
 * *replica (may be NULL): the piece's span is a replica (HYBRID_SHARD: another rank saves it). */
static bool optim_piece_of(const cm_trainer *tr, const cm_optim_state_entry *en, int64_t *gnumel, int64_t *b,
                           int64_t *e, bool *replica) {
    *gnumel = en->numel, *b = 0, *e = en->numel;
    if (replica) *replica = false;
    if (tr->dist.n_shard_spans <= 0 || en->dtype != CM_DTYPE_F32) return false;
    const char *dot = strrchr(en->name, '.');
    if (!dot) return false;
    const size_t k = (size_t)(dot - en->name);
    cm_module *root = cm_model_module(tr->st.model);
    for (int i = 0; i < tr->dist.n_shard_spans; i++) {
        const cm_shard_span *sp = &tr->dist.shard_spans[i];
        const cm_unit_info *ui = cm_module_unit(root, sp->unit);
        if (!ui || strlen(ui->name) != k || strncmp(ui->name, en->name, k) || sp->end - sp->begin != en->numel) continue;
        *gnumel = ui->numel, *b = sp->begin, *e = sp->end;
        if (replica) *replica = sp->replica;
        return true;
    }
    return false;
}

static bool optim_piece(const cm_trainer *tr, const cm_optim_state_entry *en, int64_t *gnumel, int64_t *b, int64_t *e) {
    return optim_piece_of(tr, en, gnumel, b, e, NULL);
}

/* Under sharding every f32 state entry must be a span's piece: one that is not (an optimizer
 * built over other spans) would be saved from rank 0 alone and lose the other ranks' state. */
static cm_status unmapped(const cm_trainer *tr, const char *name) {
    return cm_set_error(CM_ERR_STATE, "checkpoint: optimizer state '%s' is not this rank's piece of a wrap unit (rank "
                                      "%d): under sharding the optimizer must be built over cm_dist_optim_spans (one "
                                      "span per unit, named by the unit)",
                        name, tr->dist.rank);
}

static cmi_ck_tensor *push(cmi_ck_job *job, int f, int *cap) {
    if (job->n_tensors[f] == cap[f]) {
        int nc = cap[f] ? 2 * cap[f] : 32;
        cmi_ck_tensor *nt = cm_alloc_zeroed(sizeof *nt * (size_t)nc, 16);
        if (!nt) return NULL;
        if (job->tensors[f]) memcpy(nt, job->tensors[f], sizeof *nt * (size_t)job->n_tensors[f]);
        cm_free(job->tensors[f]);
        job->tensors[f] = nt, cap[f] = nc;
    }
    cmi_ck_tensor *t = &job->tensors[f][job->n_tensors[f]++];
    memset(t, 0, sizeof *t);
    return t;
}

static void set_piece(cmi_ck_tensor *t, const char *name, cm_st_dtype dt, int gndim, const int64_t *gshape,
                      int64_t begin, int64_t end, const void *data) {
    t->name = name;
    t->dtype = dt;
    t->ndim = 1;
    t->shape[0] = end - begin;
    t->data = data;
    t->device = cmi_ptr_device(data); /* cpu_offload keeps the model's buffers on the GPU: snapshot them */
    t->nbytes = (size_t)(end - begin) * (size_t)(cm_st_dtype_bits(dt) / 8);
    t->piece = true;
    t->gndim = gndim;
    if (gndim) memcpy(t->gshape, gshape, sizeof(int64_t) * (size_t)gndim);
    t->begin = begin, t->end = end;
}

cm_status cmi_shard_job_tensors(cm_trainer *tr, cmi_ck_job *job, bool weights_only) {
    const int rank = tr->dist.rank, w = tr->dist.world_size;
    cm_module *root = cm_model_module(tr->st.model);
    int cap[CMI_CK_MAX_FILES] = {0};
    snprintf(job->fnames[0], sizeof job->fnames[0], "model-rank%d-of-%d.safetensors", rank, w);
    job->n_files = 1;
#define PUSH(f, t)                                                               \
    do {                                                                         \
        if (!((t) = push(job, f, cap))) return cm_set_error(CM_ERR_OOM, "checkpoint: out of memory"); \
    } while (0)
    cmi_ck_tensor *t;
    for (int64_t i = 0; i < cm_module_n_params(root); i++) {
        cm_param_info pi = cm_module_param_info(root, i);
        const cm_shard_span *sp = span_of_unit(tr, pi.unit);
        const int nd = cm_tensor_ndim(pi.tensor);
        const int64_t *shape = cm_tensor_shape(pi.tensor);
        if (!sp) {
            if (tr->dist.params_sharded)
                return cm_set_error(CM_ERR_STATE, "checkpoint: parameter '%s' (unit %d) has no shard span on rank %d and "
                                                  "the parameters are sharded: its values are nowhere to be read",
                                    pi.name, pi.unit, rank);
            if (rank != 0) continue;
            PUSH(0, t);
            set_piece(t, pi.name, CM_ST_DTYPE_F32, nd, shape, 0, pi.numel, cm_tensor_data(pi.tensor));
            continue;
        }
        if (sp->replica) continue; /* HYBRID_SHARD: the first shard group's rank with this piece saves it */
        const int64_t x = sp->begin > pi.offset ? sp->begin : pi.offset;
        const int64_t y = sp->end < pi.offset + pi.numel ? sp->end : pi.offset + pi.numel;
        if (x >= y) continue;
        PUSH(0, t);
        set_piece(t, pi.name, CM_ST_DTYPE_F32, nd, shape, x - pi.offset, y - pi.offset, sp->params + (x - sp->begin));
    }
    for (int64_t i = 0; rank == 0 && i < cm_module_n_buffers(root); i++) {
        cm_buffer_info bi = cm_module_buffer_info(root, i);
        if (!cm_tensor_is_contiguous(bi.tensor))
            return cm_set_error(CM_ERR_STATE, "checkpoint: buffer '%s' is not contiguous", bi.name);
        PUSH(0, t);
        set_piece(t, bi.name, cm_st_dtype_from_cm(cm_tensor_dtype(bi.tensor)), cm_tensor_ndim(bi.tensor),
                  cm_tensor_shape(bi.tensor), 0, cm_tensor_numel(bi.tensor), cm_tensor_data(bi.tensor));
    }
    if (weights_only) return CM_OK;
    snprintf(job->fnames[1], sizeof job->fnames[1], "optimizer-rank%d-of-%d.safetensors", rank, w);
    job->n_files = 2;
    const cm_optim *o = tr->st.optimizer;
    for (int i = 0; i < cm_optim_n_state(o); i++) {
        cm_optim_state_entry en;
        cm_optim_state_get(o, i, &en);
        int64_t g, b, e;
        bool replica;
        const bool piece = optim_piece_of(tr, &en, &g, &b, &e, &replica);
        if (!piece && en.dtype == CM_DTYPE_F32) return unmapped(tr, en.name);
        if ((!piece && rank != 0) || replica || e <= b) continue;
        PUSH(1, t);
        set_piece(t, en.name, cm_st_dtype_from_cm(en.dtype), 1, &g, b, e, en.data);
    }
#undef PUSH
    return CM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * The load plan
 * ------------------------------------------------------------------------------------------- */

void cmi_ld_plan_free(cmi_ld_plan *p) {
    cm_free(p->ops);
    memset(p, 0, sizeof *p);
}

cm_status cmi_ld_plan_add(cmi_ld_plan *p, cm_checkpoint *c, int kind, const char *name, int64_t a, int64_t b, void *dst) {
    if (b <= a) return CM_OK;
    cm_status s = cmi_ck_read_range(c, kind, name, a, b, NULL); /* the pieces it reads are intact */
    if (s) return s;
    if (p->n == p->cap) {
        int nc = p->cap ? 2 * p->cap : 64;
        cmi_ld_op *no = cm_alloc(sizeof *no * (size_t)nc, 16);
        if (!no) return cm_set_error(CM_ERR_OOM, "checkpoint load: out of memory");
        if (p->ops) memcpy(no, p->ops, sizeof *no * (size_t)p->n);
        cm_free(p->ops);
        p->ops = no, p->cap = nc;
    }
    p->ops[p->n++] = (cmi_ld_op){kind, name, a, b, dst};
    return CM_OK;
}

static void list_add(char *buf, size_t cap, const char *name) {
    size_t n = strlen(buf);
    if (n + 8 >= cap) return;
    int k = snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", name);
    if (k < 0 || (size_t)k >= cap - n) snprintf(buf + cap - 6, 6, ", ...");
}

static bool ignored(const cmi_ckpt *ck, const char *name) {
    for (int i = 0; i < ck->n_ignore_keys; i++)
        if (cm_name_match(ck->ignore_keys[i], name)) return true;
    return false;
}

static void shape_str(char *buf, size_t cap, const int64_t *shape, int ndim) {
    size_t o = (size_t)snprintf(buf, cap, "(");
    for (int d = 0; d < ndim && o + 24 < cap; d++) o += (size_t)snprintf(buf + o, cap - o, d ? ", %lld" : "%lld", (long long)shape[d]);
    snprintf(buf + o, cap - o, ")");
}

/* One model tensor (parameter or buffer) of this trainer: found, same dtype and shape. */
static cm_status check_model_tensor(cm_checkpoint *c, cmi_ld_plan *p, const char *name, const cm_tensor *t,
                                    cmi_ck_global *g, bool *found) {
    *found = cmi_ck_find(c, CMI_CK_KIND_MODEL, name, g);
    if (!*found) {
        p->n_missing++;
        list_add(p->missing, sizeof p->missing, name);
        return CM_OK;
    }
    const int nd = cm_tensor_ndim(t);
    bool same = g->ndim == nd;
    for (int d = 0; same && d < nd; d++) same = g->shape[d] == cm_tensor_shape(t)[d];
    if (!same) {
        char a[160], b[160];
        shape_str(a, sizeof a, g->shape, g->ndim);
        shape_str(b, sizeof b, cm_tensor_shape(t), nd);
        return cm_set_error(CM_ERR_SHAPE, "checkpoint '%s': tensor '%s' has shape %s in the checkpoint but %s in the "
                                          "model", cm_checkpoint_path(c), name, a, b);
    }
    if (g->dtype != cm_st_dtype_from_cm(cm_tensor_dtype(t)))
        return cm_set_error(CM_ERR_DTYPE, "checkpoint '%s': tensor '%s' is %s in the checkpoint but %s in the model",
                            cm_checkpoint_path(c), name, cm_st_dtype_name(g->dtype),
                            cm_st_dtype_name(cm_st_dtype_from_cm(cm_tensor_dtype(t))));
    return CM_OK;
}

static bool is_model_name(cm_module *root, const char *name) {
    if (cm_module_param_index(root, name) >= 0) return true;
    for (int64_t i = 0; i < cm_module_n_buffers(root); i++)
        if (!strcmp(cm_module_buffer_info(root, i).name, name)) return true;
    return false;
}

cm_status cmi_ld_plan_build(cm_trainer *tr, cm_checkpoint *c, bool weights_only, cmi_ld_plan *p) {
    memset(p, 0, sizeof *p);
    const cmi_ckpt *ck = tr->ckpt;
    const char *path = cm_checkpoint_path(c);
    cm_module *root = cm_model_module(tr->st.model);
    const bool spans = tr->dist.n_shard_spans > 0;
    cm_status s = CM_OK;
    cmi_ck_global g;
    bool found;
    for (int64_t i = 0; !s && i < cm_module_n_params(root); i++) {
        cm_param_info pi = cm_module_param_info(root, i);
        if (ignored(ck, pi.name)) continue;
        if ((s = check_model_tensor(c, p, pi.name, pi.tensor, &g, &found)) || !found) continue;
        const cm_shard_span *sp = NULL;
        for (int k = 0; spans && k < tr->dist.n_shard_spans; k++)
            if (tr->dist.shard_spans[k].unit == pi.unit) sp = &tr->dist.shard_spans[k];
        if (sp) {
            const int64_t x = sp->begin > pi.offset ? sp->begin : pi.offset;
            const int64_t y = sp->end < pi.offset + pi.numel ? sp->end : pi.offset + pi.numel;
            if (x < y) s = cmi_ld_plan_add(p, c, CMI_CK_KIND_MODEL, g.name, x - pi.offset, y - pi.offset, sp->params + (x - sp->begin));
            p->wrote_spans = true;
            /* without a sync_params hook the flat buffers are refreshed here (they are valid at rest) */
            if (!s && !tr->dist.sync_params && !tr->dist.params_sharded)
                s = cmi_ld_plan_add(p, c, CMI_CK_KIND_MODEL, g.name, 0, pi.numel, cm_tensor_data(pi.tensor));
        } else if (tr->dist.params_sharded) {
            s = cm_set_error(CM_ERR_STATE, "checkpoint load: parameter '%s' has no shard span on rank %d and the "
                                           "parameters are sharded", pi.name, tr->dist.rank);
        } else {
            s = cmi_ld_plan_add(p, c, CMI_CK_KIND_MODEL, g.name, 0, pi.numel, cm_tensor_data(pi.tensor));
        }
    }
    for (int64_t i = 0; !s && i < cm_module_n_buffers(root); i++) {
        cm_buffer_info bi = cm_module_buffer_info(root, i);
        if (ignored(ck, bi.name)) continue;
        if ((s = check_model_tensor(c, p, bi.name, bi.tensor, &g, &found)) || !found) continue;
        s = cmi_ld_plan_add(p, c, CMI_CK_KIND_MODEL, g.name, 0, cm_tensor_numel(bi.tensor), cm_tensor_data(bi.tensor));
    }
    const size_t ng = cmi_ck_n_global(c, CMI_CK_KIND_MODEL);
    for (size_t k = 0; !s && k < ng; k++) {
        const char *name = cmi_ck_global_name(c, CMI_CK_KIND_MODEL, k);
        if (!ignored(ck, name) && !is_model_name(root, name)) {
            p->n_unexpected++;
            list_add(p->unexpected, sizeof p->unexpected, name);
        }
    }
    if (!s && ck->load_strict && (p->n_missing || p->n_unexpected))
        s = cm_set_error(CM_ERR_NOT_FOUND, "loading the model from checkpoint '%s': %lld missing and %lld unexpected "
                                           "tensors (strict load). Missing: [%s]. Unexpected: [%s]. Set "
                                           "load_ignore_keys or load_strict_model_weights = false to load the rest",
                         path, (long long)p->n_missing, (long long)p->n_unexpected, p->missing, p->unexpected);
    if (s || weights_only) return s;

    const cm_optim *o = tr->st.optimizer;
    const int n = cm_optim_n_state(o);
    const size_t have = cmi_ck_n_global(c, CMI_CK_KIND_OPTIM);
    if ((size_t)n != have)
        return cm_set_error(CM_ERR_STATE, "checkpoint '%s' holds %zu optimizer state tensors; this trainer's optimizer "
                                          "has %d (different parameter groups or model?)",
                            path, have, n);
    for (int i = 0; !s && i < n; i++) {
        cm_optim_state_entry en;
        cm_optim_state_get(o, i, &en);
        int64_t gn, b, e;
        if (!optim_piece(tr, &en, &gn, &b, &e) && spans && en.dtype == CM_DTYPE_F32) return unmapped(tr, en.name);
        if (!cmi_ck_find(c, CMI_CK_KIND_OPTIM, en.name, &g) || g.dtype != cm_st_dtype_from_cm(en.dtype) || g.numel != gn)
            return cm_set_error(CM_ERR_STATE, "checkpoint '%s': optimizer state '%s' %s", path, en.name,
                                cmi_ck_find(c, CMI_CK_KIND_OPTIM, en.name, &g)
                                    ? "has another dtype or size than this trainer's"
                                    : "is missing");
        s = cmi_ld_plan_add(p, c, CMI_CK_KIND_OPTIM, g.name, b, e, en.data);
    }
    return s;
}

void cmi_ld_plan_apply(cm_checkpoint *c, const cmi_ld_plan *p) {
    for (int i = 0; i < p->n; i++) {
        const cmi_ld_op *op = &p->ops[i];
        cmi_ck_read_range(c, op->kind, op->name, op->a, op->b, op->dst); /* checked when planned */
    }
}
