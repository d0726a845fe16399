/* Module weights in and out as safetensors, by dotted name. */
#include <composer/nn.h>
#include <composer/safetensors.h>

#include <stdio.h>
#include <string.h>

cm_load_opts cm_load_opts_default(void) {
    cm_load_opts o = {0};
    o.strict = true;
    return o;
}

static bool ignored(const cm_load_opts *o, const char *name) {
    for (int i = 0; i < o->n_ignore; i++)
        if (cm_name_match(o->ignore[i], name)) return true;
    return false;
}

static void list_add(char *buf, size_t cap, const char *name) {
    size_t len = strlen(buf);
    if (len + 8 >= cap) return;
    if (strstr(buf, ", ...")) return;
    size_t need = strlen(name) + (len ? 2 : 0);
    if (len + need + 6 >= cap) {
        snprintf(buf + len, cap - len, "%s...", len ? ", " : "");
        return;
    }
    snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", name);
}

/* The source: one file, or a sharded index. */
typedef struct {
    cm_safetensors *file;
    cm_safetensors_index *idx;
} source;

static size_t src_count(const source *s) {
    return s->file ? cm_safetensors_count(s->file) : cm_safetensors_index_count(s->idx);
}
static const char *src_name(const source *s, size_t i) {
    return s->file ? cm_safetensors_at(s->file, i)->name : cm_safetensors_index_name(s->idx, i);
}
static cm_status src_find(source *s, const char *name, const cm_safetensors **f, const cm_st_tensor **t) {
    if (s->file) {
        *f = s->file;
        *t = cm_safetensors_find(s->file, name);
        return *t ? CM_OK : CM_ERR_NOT_FOUND;
    }
    return cm_safetensors_index_find(s->idx, name, f, t);
}

/* One model tensor to fill: a parameter or a persistent buffer. */
typedef struct {
    const char *name;
    cm_tensor *t;
    const char *file_name; /* matched name in the file (NULL: missing) */
} target;

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

cm_status cm_module_load_safetensors(cm_module *root, const char *path, const cm_load_opts *opts,
                                     cm_load_report *report) {
    cm_load_opts o = opts ? *opts : cm_load_opts_default();
    cm_load_report rep;
    memset(&rep, 0, sizeof rep);
    if (!cm_module_is_finalized(root))
        return cm_set_error(CM_ERR_STATE, "load '%s': the module is not finalized (call cm_module_finalize first)",
                            path);
    source src = {0};
    cm_status st = ends_with(path, ".safetensors") ? cm_safetensors_open(path, &src.file)
                                                   : cm_safetensors_index_open(path, &src.idx);
    if (st) return st;

    int64_t np = cm_module_n_params(root), nb = cm_module_n_buffers(root), nt = np + nb;
    target *tg = cm_alloc_zeroed(sizeof(target) * (size_t)(nt ? nt : 1), 16);
    size_t nf = src_count(&src);
    char **renamed = cm_alloc_zeroed(sizeof(char *) * (nf ? nf : 1), 16);
    if (!tg || !renamed) {
        st = CM_ERR_OOM;
        goto done;
    }
    for (int64_t i = 0; i < np; i++) {
        cm_param_info pi = cm_module_param_info(root, i);
        tg[i].name = pi.name;
        tg[i].t = pi.tensor;
    }
    for (int64_t i = 0; i < nb; i++) {
        cm_buffer_info bi = cm_module_buffer_info(root, i);
        tg[np + i].name = bi.name;
        tg[np + i].t = bi.tensor;
    }
    /* Match file names (after renaming) to targets. */
    for (size_t k = 0; k < nf; k++) {
        const char *fname = src_name(&src, k);
        const char *mname = fname;
        char buf[512];
        if (o.rename && o.rename(fname, buf, sizeof buf, o.rename_data)) {
            size_t n = strlen(buf) + 1;
            renamed[k] = cm_alloc(n, 8);
            if (!renamed[k]) {
                st = CM_ERR_OOM;
                goto done;
            }
            memcpy(renamed[k], buf, n);
            mname = renamed[k];
        }
        if (ignored(&o, mname) || ignored(&o, fname)) continue;
        int64_t hit = -1;
        for (int64_t i = 0; i < nt && hit < 0; i++)
            if (strcmp(tg[i].name, mname) == 0) hit = i;
        if (hit < 0) {
            /* A tied parameter's second name (lm_head.weight) resolves to its owner. */
            int64_t pi = cm_module_param_index(root, mname);
            if (pi >= 0) hit = pi;
        }
        if (hit < 0) {
            rep.n_unexpected++;
            list_add(rep.unexpected, sizeof rep.unexpected, mname);
        } else if (!tg[hit].file_name) {
            tg[hit].file_name = fname;
        }
    }
    for (int64_t i = 0; i < nt; i++) {
        if (!tg[i].file_name && !ignored(&o, tg[i].name)) {
            rep.n_missing++;
            list_add(rep.missing, sizeof rep.missing, tg[i].name);
        }
    }
    if (o.strict && (rep.n_missing || rep.n_unexpected)) {
        st = cm_set_error(CM_ERR_NOT_FOUND,
                          "load '%s': %lld missing and %lld unexpected tensors (strict load). Missing: [%s]. "
                          "Unexpected: [%s]. Pass ignore patterns or strict=false to load the rest",
                          path, (long long)rep.n_missing, (long long)rep.n_unexpected, rep.missing, rep.unexpected);
        goto done;
    }
    /* Check every shape before changing anything. */
    for (int64_t i = 0; i < nt; i++) {
        if (!tg[i].file_name) continue;
        const cm_safetensors *f;
        const cm_st_tensor *e;
        st = src_find(&src, tg[i].file_name, &f, &e);
        if (st) goto done;
        const cm_tensor *t = tg[i].t;
        bool same = e->ndim == cm_tensor_ndim(t);
        for (int d = 0; same && d < e->ndim; d++) same = e->shape[d] == cm_tensor_shape(t)[d];
        if (!same) {
            char a[160], b[160];
            size_t off = (size_t)snprintf(a, sizeof a, "(");
            for (int d = 0; d < e->ndim && off < sizeof a - 24; d++)
                off += (size_t)snprintf(a + off, sizeof a - off, d ? ", %lld" : "%lld", (long long)e->shape[d]);
            snprintf(a + off, sizeof a - off, ")");
            st = cm_set_error(CM_ERR_SHAPE, "load '%s': tensor '%s' has shape %s in the file but %s in the model", path,
                              tg[i].file_name, a, cm_tensor_shape_str(t, b, sizeof b));
            goto done;
        }
    }
    for (int64_t i = 0; i < nt; i++) {
        if (!tg[i].file_name) continue;
        const cm_safetensors *f;
        const cm_st_tensor *e;
        st = src_find(&src, tg[i].file_name, &f, &e);
        if (!st) st = cm_safetensors_copy(f, tg[i].file_name, tg[i].t);
        if (st) goto done;
        rep.n_loaded++;
    }
done:
    if (report) *report = rep;
    for (size_t k = 0; renamed && k < nf; k++) cm_free(renamed[k]);
    cm_free(renamed);
    cm_free(tg);
    cm_safetensors_close(src.file);
    cm_safetensors_index_close(src.idx);
    return st;
}

cm_status cm_module_save_safetensors(cm_module *root, const char *path) {
    return cm_module_save_safetensors_with(root, path, NULL, 0);
}

cm_status cm_module_save_safetensors_with(cm_module *root, const char *path, const char *const *meta, int n_meta) {
    if (n_meta < 0 || (n_meta > 0 && !meta))
        return cm_set_error(CM_ERR_INVALID_ARG, "save '%s': %d metadata entries%s", path, n_meta,
                            n_meta > 0 ? " and NULL meta" : "");
    if (!cm_module_is_finalized(root))
        return cm_set_error(CM_ERR_STATE, "save '%s': the module is not finalized (call cm_module_finalize first)",
                            path);
    cm_safetensors_writer *w;
    cm_status st = cm_safetensors_writer_new(&w);
    if (st) return st;
    st = cm_safetensors_writer_add_metadata(w, "format", "pt");
    for (int i = 0; !st && i < n_meta; i++) st = cm_safetensors_writer_add_metadata(w, meta[2 * i], meta[2 * i + 1]);
    for (int64_t i = 0; !st && i < cm_module_n_params(root); i++) {
        cm_param_info pi = cm_module_param_info(root, i);
        st = cm_safetensors_writer_add(w, pi.name, pi.tensor);
    }
    for (int64_t i = 0; !st && i < cm_module_n_buffers(root); i++) {
        cm_buffer_info bi = cm_module_buffer_info(root, i);
        st = cm_safetensors_writer_add(w, bi.name, bi.tensor);
    }
    if (!st) st = cm_safetensors_writer_write(w, path);
    cm_safetensors_writer_free(w);
    return st;
}
