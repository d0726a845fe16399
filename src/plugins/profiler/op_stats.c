/* FLOPs of tape ops and the per-op table (torch.profiler's key_averages) of the profiler. */
#include "plugins/profiler/profiler_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- FLOPs ---- */

static double numel(const cm_tensor *t) { return t ? (double)cm_tensor_numel(t) : 0.0; }

static bool needs(int n_in, cm_tensor *const *ins, int i) {
    return i < n_in && ins[i] && cm_tensor_requires_grad(ins[i]);
}

double cm_op_flops(const char *op, bool backward, const cm_tensor *out, int n_in, cm_tensor *const *ins) {
    if (!op || !out || n_in < 2 || !ins[0] || !ins[1]) return 0.0;
    double fwd = 0.0;
    int operands = 2; /* the inputs whose gradients backward computes with a GEMM of the same size */
    if (!strcmp(op, "matmul") || !strcmp(op, "linear")) {
        /* matmul: a (..., M, K) · b (..., K, N); linear: x (..., in) · wᵀ (in, out) */
        const cm_tensor *a = ins[0];
        const int nd = cm_tensor_ndim(a);
        if (nd < 1) return 0.0;
        const double k = (double)cm_tensor_shape(a)[nd - 1];
        fwd = 2.0 * numel(out) * k;
    } else if (!strcmp(op, "conv2d")) {
        /* weight (Cout, Cin/groups, KH, KW) in any layout: each output element is a dot product of
         * numel(weight) / Cout products */
        const cm_tensor *w = ins[1];
        const double cout = cm_tensor_ndim(w) >= 1 ? (double)cm_tensor_shape(w)[0] : 0.0;
        if (!(cout > 0)) return 0.0;
        fwd = 2.0 * numel(out) * (numel(w) / cout);
    } else if (!strcmp(op, "attention")) {
        /* q (B, H, T, D), k (B, H, S, D): q·kᵀ and p·v, 2·B·H·T·S·D each */
        if (n_in < 3 || !ins[2] || cm_tensor_ndim(ins[0]) != 4 || cm_tensor_ndim(ins[1]) != 4) return 0.0;
        const int64_t *q = cm_tensor_shape(ins[0]), *k = cm_tensor_shape(ins[1]);
        fwd = 4.0 * (double)q[0] * (double)q[1] * (double)q[2] * (double)k[2] * (double)q[3];
        if (!backward) return fwd;
        return needs(n_in, ins, 0) || needs(n_in, ins, 1) || needs(n_in, ins, 2) ? 2.0 * fwd : 0.0;
    } else {
        return 0.0;
    }
    if (!backward) return fwd;
    double bw = 0.0;
    for (int i = 0; i < operands; i++)
        if (needs(n_in, ins, i)) bw += fwd;
    return bw;
}

/* ---- statistics ---- */

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static cm_status rehash(cmi_op_stats *s, int cap_slots) {
    int *slots = cm_alloc_zeroed(sizeof *slots * (size_t)cap_slots, 16);
    if (!slots) return CM_ERR_OOM;
    for (int i = 0; i < s->n; i++) {
        uint64_t h = hash_str(s->v[i].name) & (uint64_t)(cap_slots - 1);
        while (slots[h]) h = (h + 1) & (uint64_t)(cap_slots - 1);
        slots[h] = i + 1;
    }
    cm_free(s->slots);
    s->slots = slots, s->cap_slots = cap_slots;
    return CM_OK;
}

cm_status cmi_op_stats_add(cmi_op_stats *s, const char *name, int64_t total_ns, int64_t self_ns, double flops) {
    if (!s->cap_slots && rehash(s, 64)) return CM_ERR_OOM;
    uint64_t h = hash_str(name) & (uint64_t)(s->cap_slots - 1);
    while (s->slots[h] && strcmp(s->v[s->slots[h] - 1].name, name)) h = (h + 1) & (uint64_t)(s->cap_slots - 1);
    int idx = s->slots[h] - 1;
    if (idx < 0 && 2 * (s->n + 1) > s->cap_slots) { /* keep the table at most half full */
        if (rehash(s, 2 * s->cap_slots)) return CM_ERR_OOM;
        h = hash_str(name) & (uint64_t)(s->cap_slots - 1);
        while (s->slots[h]) h = (h + 1) & (uint64_t)(s->cap_slots - 1);
    }
    if (idx < 0) { /* a new op */
        if (s->n == s->cap) {
            const int cap = s->cap ? 2 * s->cap : 32;
            cm_op_stat *nv = cm_alloc(sizeof *nv * (size_t)cap, 16);
            const cm_op_stat **ns = cm_alloc(sizeof *ns * (size_t)cap, 16);
            if (!nv || !ns) {
                cm_free(nv), cm_free(ns);
                return CM_ERR_OOM;
            }
            if (s->n) memcpy(nv, s->v, sizeof *nv * (size_t)s->n);
            cm_free(s->v), cm_free((void *)s->sorted);
            s->v = nv, s->sorted = ns, s->cap = cap;
        }
        const size_t len = strlen(name) + 1;
        char *copy = cm_alloc(len, 1);
        if (!copy) return CM_ERR_OOM;
        memcpy(copy, name, len);
        idx = s->n++;
        s->v[idx] = (cm_op_stat){copy, 0, 0.0, 0.0, 0.0};
        s->slots[h] = idx + 1;
    }
    cm_op_stat *o = &s->v[idx];
    o->calls++;
    o->total_s += (double)total_ns * 1e-9;
    o->self_s += (double)self_ns * 1e-9;
    o->flops += flops;
    s->dirty = true;
    return CM_OK;
}

void cmi_op_stats_free(cmi_op_stats *s) {
    for (int i = 0; i < s->n; i++) cm_free((char *)s->v[i].name);
    cm_free(s->v), cm_free(s->slots), cm_free((void *)s->sorted);
    memset(s, 0, sizeof *s);
}

static int by_self(const void *a, const void *b) {
    const cm_op_stat *x = *(const cm_op_stat *const *)a, *y = *(const cm_op_stat *const *)b;
    if (x->self_s != y->self_s) return x->self_s > y->self_s ? -1 : 1;
    return strcmp(x->name, y->name);
}

static void sort_now(cmi_op_stats *s) {
    if (!s->dirty) return;
    for (int i = 0; i < s->n; i++) s->sorted[i] = &s->v[i];
    qsort(s->sorted, (size_t)s->n, sizeof *s->sorted, by_self);
    s->dirty = false;
}

int cmi_op_stats_n(cmi_op_stats *s) { return s->n; }

const cm_op_stat *cmi_op_stats_at(cmi_op_stats *s, int i) {
    if (i < 0 || i >= s->n) return NULL;
    sort_now(s);
    return s->sorted[i];
}

/* snprintf into buf at *len, tracking the length needed past cap. */
static void put(char *buf, size_t cap, size_t *len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void put(char *buf, size_t cap, size_t *len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(*len < cap ? buf + *len : NULL, *len < cap ? cap - *len : 0, fmt, ap);
    va_end(ap);
    if (k > 0) *len += (size_t)k;
}

size_t cmi_op_stats_table(cmi_op_stats *s, int row_limit, char *buf, size_t cap) {
    sort_now(s);
    if (cap) buf[0] = '\0';
    size_t len = 0;
    double self = 0, flops = 0;
    int64_t calls = 0;
    for (int i = 0; i < s->n; i++) self += s->v[i].self_s, flops += s->v[i].flops, calls += s->v[i].calls;
    const char *rule = "------------------------------  ----------  -------  ----------  --------  ----------  "
                       "----------  ----------\n";
    put(buf, cap, &len, "%s", rule);
    put(buf, cap, &len, "%-30s  %10s  %7s  %10s  %8s  %10s  %10s  %10s\n", "Name", "Self ms", "Self %", "Total ms",
        "Calls", "Avg us", "GFLOP", "GFLOP/s");
    put(buf, cap, &len, "%s", rule);
    const int rows = row_limit > 0 && row_limit < s->n ? row_limit : s->n;
    for (int i = 0; i < rows; i++) {
        const cm_op_stat *o = s->sorted[i];
        char gf[16] = "-", rate[16] = "-";
        if (o->flops > 0) {
            snprintf(gf, sizeof gf, "%.3f", o->flops * 1e-9);
            if (o->total_s > 0) snprintf(rate, sizeof rate, "%.2f", o->flops * 1e-9 / o->total_s);
        }
        put(buf, cap, &len, "%-30.30s  %10.3f  %6.2f%%  %10.3f  %8lld  %10.2f  %10s  %10s\n", o->name, o->self_s * 1e3,
            self > 0 ? 100.0 * o->self_s / self : 0.0, o->total_s * 1e3, (long long)o->calls,
            o->calls ? o->total_s * 1e6 / (double)o->calls : 0.0, gf, rate);
    }
    put(buf, cap, &len, "%s", rule);
    put(buf, cap, &len, "Self time total: %.3f ms over %lld op calls (%d ops%s); %.3f GFLOP (%.2f GFLOP/s over the "
                        "counted ops' self time)\n",
        self * 1e3, (long long)calls, s->n, rows < s->n ? ", the rest not shown" : "", flops * 1e-9,
        self > 0 ? flops * 1e-9 / self : 0.0);
    return len;
}
