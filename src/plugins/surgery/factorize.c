/* Factorize (Composer's Factorize): wide convolutions and linear layers become two thinner ones
 * through a latent size k — FactorizedConv2d {module0: Conv2d(in, k, kernel, stride, padding, no
 * bias), module1: Conv2d(k, out, 1×1, bias)} and FactorizedLinear {module0: Linear(in, k, no bias),
 * module1: Linear(k, out, bias if the original had one)} — when k is small enough for the pair to
 * cost fewer multiply-adds (Composer's factorizing_could_speedup) and the layer wide enough.
 *
 * Initialisation: Composer re-initialises the pair randomly (reset_parameters). Here the pair
 * starts as the best rank-k approximation of the original layer — the truncated SVD of its weight
 * (out, fan_in) = U S Vᵀ gives module1 = U_k √S_k and module0 = √S_k V_kᵀ (Composer's
 * _svd_initialize), and module1's bias is the original bias — so a layer whose weight has rank ≤ k
 * computes exactly what it did. The SVD is LAPACK's dgesdd (OpenBLAS), in double. */
#include "plugins/surgery/surgery_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* LAPACK (OpenBLAS exports the Fortran symbols; the trailing length is gfortran's hidden
 * CHARACTER length). */
extern void dgesdd_(const char *jobz, const int *m, const int *n, double *a, const int *lda, double *s, double *u,
                    const int *ldu, double *vt, const int *ldvt, double *work, const int *lwork, int *iwork, int *info,
                    size_t jobz_len);

cm_status cm_factorize_svd(const float *w, int64_t rows, int64_t cols, int64_t k, float *p, float *q, float *s_out) {
    if (!w || !p || !q || rows < 1 || cols < 1 || k < 1 || k > (rows < cols ? rows : cols))
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_factorize_svd: a (%lld, %lld) matrix has no rank-%lld factors",
                            (long long)rows, (long long)cols, (long long)k);
    if (rows > (1 << 30) / cols)
        return cm_set_error(CM_ERR_UNSUPPORTED, "cm_factorize_svd: a (%lld, %lld) matrix is too large for LAPACK's int",
                            (long long)rows, (long long)cols);
    const int m = (int)rows, n = (int)cols, mn = m < n ? m : n;
    double *a = cm_alloc(sizeof(double) * (size_t)m * (size_t)n, 64);
    double *sv = cm_alloc(sizeof(double) * (size_t)mn, 64);
    double *u = cm_alloc(sizeof(double) * (size_t)m * (size_t)mn, 64);
    double *vt = cm_alloc(sizeof(double) * (size_t)mn * (size_t)n, 64);
    int *iwork = cm_alloc(sizeof(int) * 8 * (size_t)mn, 64);
    double *work = NULL;
    cm_status st = CM_OK;
    if (!a || !sv || !u || !vt || !iwork) {
        st = cm_set_error(CM_ERR_OOM, "cm_factorize_svd: out of memory for a (%d, %d) SVD", m, n);
        goto done;
    }
    for (int i = 0; i < m; i++) /* column-major, as LAPACK reads it */
        for (int j = 0; j < n; j++) a[i + (size_t)j * m] = w[(size_t)i * n + j];
    int info = 0, lwork = -1;
    double wq;
    dgesdd_("S", &m, &n, a, &m, sv, u, &m, vt, &mn, &wq, &lwork, iwork, &info, 1);
    lwork = info == 0 ? (int)wq : 0;
    if (info || !(work = cm_alloc(sizeof(double) * (size_t)(lwork > 1 ? lwork : 1), 64))) {
        st = info ? cm_set_error(CM_ERR_INTERNAL, "cm_factorize_svd: dgesdd's workspace query failed (info %d)", info)
                  : cm_set_error(CM_ERR_OOM, "cm_factorize_svd: out of memory");
        goto done;
    }
    dgesdd_("S", &m, &n, a, &m, sv, u, &m, vt, &mn, work, &lwork, iwork, &info, 1);
    if (info) {
        st = cm_set_error(CM_ERR_INTERNAL, "cm_factorize_svd: dgesdd failed on a (%d, %d) matrix (info %d%s)", m, n,
                          info, info > 0 ? ": did not converge" : "");
        goto done;
    }
    for (int t = 0; t < k; t++) {
        const double r = sqrt(sv[t]);
        for (int i = 0; i < m; i++) p[(size_t)i * k + t] = (float)(u[i + (size_t)t * m] * r);
        for (int j = 0; j < n; j++) q[(size_t)t * n + j] = (float)(vt[t + (size_t)j * mn] * r);
    }
    if (s_out)
        for (int t = 0; t < mn; t++) s_out[t] = (float)sv[t];
done:
    cm_free(a), cm_free(sv), cm_free(u), cm_free(vt), cm_free(iwork), cm_free(work);
    return st;
}

/* ---- Composer's size rules (factorize_modules.py) ---- */

int64_t cm_factorize_latent_size(double latent, int64_t in, int64_t out) {
    if (latent < 1) {
        const int64_t l = (int64_t)(latent * (double)(in < out ? in : out));
        return l > 1 ? l : 1;
    }
    return (int64_t)latent;
}

int64_t cm_factorize_max_rank(int64_t in, int64_t out, int64_t kernel_numel) {
    const double fan_in = (double)in * (double)kernel_numel;
    return (int64_t)ceil(fan_in * (double)out / (fan_in + (double)out) - 1);
}

/* ---- the modules ---- */

typedef struct {
    int64_t latent;
    cm_module *module0, *module1;
} fac_s;

static cm_tensor *fac_fwd(cm_module *m, cm_tape *tp, int n_in, cm_tensor *const *in) {
    fac_s *s = cm_module_self(m);
    return cm_module_forward(s->module1, tp, cm_module_forward(s->module0, tp, in[0]));
}

static void fac_desc(const cm_module *m, char *buf, size_t cap) {
    snprintf(buf, cap, "latent=%lld", (long long)((const fac_s *)cm_module_self(m))->latent);
}

static void free_self(void *self) { cm_free(self); }

static const cm_module_i fconv_vt = {CM_MODULE_ABI, "FactorizedConv2d", fac_fwd, free_self, fac_desc};
static const cm_module_i flin_vt = {CM_MODULE_ABI, "FactorizedLinear", fac_fwd, free_self, fac_desc};

static bool is_type(const cm_module *m, const char *t) { return m && !strcmp(cm_module_type_name(m), t); }

typedef struct {
    const cm_factorize_config *cfg;
    int64_t n_conv, n_linear;
} fac_ctx;

static bool conv_eligible(cm_module *m, const cm_factorize_config *cfg) {
    cm_nn_conv2d_config cc;
    if (!cfg->factorize_convs || !is_type(m, "Conv2d") || cmi_has_ancestor(m, "FactorizedConv2d") ||
        cm_nn_conv2d_config_of(m, &cc) || cc.opts.groups != 1)
        return false;
    const int64_t k = cm_factorize_latent_size(cfg->latent_channels, cc.in, cc.out);
    return k <= cm_factorize_max_rank(cc.in, cc.out, (int64_t)cc.kernel[0] * cc.kernel[1]) &&
           (cc.in < cc.out ? cc.in : cc.out) >= cfg->min_channels;
}

static bool linear_eligible(cm_module *m, const cm_factorize_config *cfg) {
    int64_t in, out;
    bool tr;
    if (!cfg->factorize_linears || !is_type(m, "Linear") || cmi_has_ancestor(m, "FactorizedLinear") ||
        cm_nn_linear_dims(m, &in, &out, &tr))
        return false;
    const int64_t k = cm_factorize_latent_size(cfg->latent_features, in, out);
    return k <= cm_factorize_max_rank(in, out, 1) && (in < out ? in : out) >= cfg->min_features;
}

static bool fac_match(cm_module *m, const char *path, void *data) {
    const fac_ctx *c = data;
    return conv_eligible(m, c->cfg) || linear_eligible(m, c->cfg);
}

/* Adds a freshly made module as child `name`, or frees it. */
static cm_status adopt(cm_module *m, const char *name, cm_status made, cm_module *c, cm_module **slot) {
    if (made) return made;
    cm_status st = cm_module_add_child(m, name, c, slot);
    if (st) cm_module_free(c);
    return st;
}

static cm_status fac_make(cm_module *old, const char *path, void *data, cm_module **out) {
    fac_ctx *c = data;
    const bool conv = is_type(old, "Conv2d");
    int64_t in, outc, kn = 1;
    cm_nn_conv2d_config cc;
    bool bias;
    cm_status st;
    if (conv) {
        if ((st = cm_nn_conv2d_config_of(old, &cc))) return st;
        in = cc.in, outc = cc.out, kn = (int64_t)cc.kernel[0] * cc.kernel[1], bias = cc.bias;
    } else {
        if ((st = cm_nn_linear_dims(old, &in, &outc, NULL))) return st;
        bias = cm_module_param(old, "bias") != NULL;
    }
    const int64_t k = cm_factorize_latent_size(conv ? c->cfg->latent_channels : c->cfg->latent_features, in, outc);
    const int64_t fan_in = in * kn;
    /* the weight as (out, fan_in) ≈ P (out, k) · Q (k, fan_in) */
    float *p = cm_alloc(sizeof(float) * (size_t)(outc * k), 64), *q = cm_alloc(sizeof(float) * (size_t)(k * fan_in), 64);
    if (!p || !q) {
        cm_free(p), cm_free(q);
        return cm_set_error(CM_ERR_OOM, "Factorize: out of memory for '%s'", path);
    }
    if ((st = cm_factorize_svd(cm_tensor_data(cm_module_param(old, "weight")), outc, fan_in, k, p, q, NULL))) {
        cm_free(p), cm_free(q);
        return st;
    }
    fac_s *s = cm_alloc_zeroed(sizeof *s, 8);
    if (!s || (st = cm_module_new(conv ? &fconv_vt : &flin_vt, s, out))) {
        cm_free(s), cm_free(p), cm_free(q);
        return s ? st : CM_ERR_OOM;
    }
    s->latent = k;
    cm_module *m0 = NULL, *m1 = NULL;
    if (conv) {
        cm_nn_conv2d_config c0 = cc, c1 = cm_nn_conv2d_config_default(k, outc, 1, 1);
        c0.out = k, c0.bias = false;
        c1.opts.channels_last = cc.opts.channels_last, c1.opts.out_bf16 = cc.opts.out_bf16;
        c1.bias = true;
        st = cm_nn_conv2d_new(&c0, NULL, &m0);
        if (!(st = adopt(*out, "module0", st, m0, &s->module0))) {
            st = cm_nn_conv2d_new(&c1, NULL, &m1);
            st = adopt(*out, "module1", st, m1, &s->module1);
        }
    } else {
        st = cm_nn_linear_new(in, k, false, NULL, &m0);
        if (!(st = adopt(*out, "module0", st, m0, &s->module0))) {
            st = cm_nn_linear_new(k, outc, bias, NULL, &m1);
            st = adopt(*out, "module1", st, m1, &s->module1);
        }
    }
    if (!st) {
        memcpy(cm_tensor_data(cm_module_param(s->module0, "weight")), q, sizeof(float) * (size_t)(k * fan_in));
        memcpy(cm_tensor_data(cm_module_param(s->module1, "weight")), p, sizeof(float) * (size_t)(outc * k));
        cm_tensor *b1 = cm_module_param(s->module1, "bias");
        if (b1) {
            if (bias)
                st = cm_tensor_copy(b1, cm_module_param(old, "bias"));
            else
                st = cm_tensor_fill(b1, 0.0);
        }
    }
    cm_free(p), cm_free(q);
    if (st) {
        cm_module_free(*out);
        *out = NULL;
        return st;
    }
    if (conv)
        c->n_conv++;
    else
        c->n_linear++;
    return CM_OK;
}

typedef struct {
    const cm_factorize_config *cfg;
    int64_t eligible, done, convs, linears;
} fac_scan;

static bool scan_visit(cm_module *m, const char *path, int depth, void *data) {
    fac_scan *s = data;
    fac_ctx c = {s->cfg, 0, 0};
    s->eligible += fac_match(m, path, &c);
    s->done += is_type(m, "FactorizedConv2d") || is_type(m, "FactorizedLinear");
    s->convs += is_type(m, "Conv2d");
    s->linears += is_type(m, "Linear");
    return true;
}

cm_factorize_config cm_factorize_config_default(void) { return (cm_factorize_config){true, true, 256, 0.25, 256, 128}; }

static cm_status check_cfg(const cm_factorize_config *c) {
    if (!c) return cm_set_error(CM_ERR_INVALID_ARG, "Factorize: config is NULL");
    if (!c->factorize_convs && !c->factorize_linears)
        return cm_set_error(CM_ERR_INVALID_ARG, "Factorize: factorize_convs and factorize_linears are both false");
    if (!(c->latent_channels > 0) || !(c->latent_features > 0) || !isfinite(c->latent_channels) ||
        !isfinite(c->latent_features) || c->min_channels < 0 || c->min_features < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "Factorize: latent_channels %g and latent_features %g must be > 0, "
                                                "min_channels %lld and min_features %lld >= 0",
                            c->latent_channels, c->latent_features, (long long)c->min_channels,
                            (long long)c->min_features);
    return CM_OK;
}

cm_status cm_apply_factorization(cm_module *root, const cm_factorize_config *cfg, int64_t *n_convs, int64_t *n_linears) {
    if (n_convs) *n_convs = 0;
    if (n_linears) *n_linears = 0;
    cm_status st = check_cfg(cfg);
    if (st || (st = cmi_surgery_check_unlocked(root, "Factorize", "cm_apply_factorization"))) return st;
    fac_scan sc = {cfg, 0, 0, 0, 0};
    cm_module_visit(root, scan_visit, &sc);
    if (!sc.eligible) {
        if (sc.done) return CM_OK;
        char looked[256], hint[256];
        snprintf(looked, sizeof looked, "%s%s%s",
                 cfg->factorize_convs ? "Conv2d layers (groups 1) with at least min_channels input and output channels"
                                      : "",
                 cfg->factorize_convs && cfg->factorize_linears ? " and " : "",
                 cfg->factorize_linears ? "Linear layers with at least min_features inputs and outputs" : "");
        snprintf(hint, sizeof hint, "whose latent size is small enough to save work (min_channels %lld, latent_channels "
                                    "%g, min_features %lld, latent_features %g; the model has %lld Conv2d and %lld Linear)",
                 (long long)cfg->min_channels, cfg->latent_channels, (long long)cfg->min_features, cfg->latent_features,
                 (long long)sc.convs, (long long)sc.linears);
        return cmi_nothing_to_apply(root, "Factorize", looked, hint);
    }
    fac_ctx c = {cfg, 0, 0};
    st = cm_module_replace(root, fac_match, fac_make, &c, NULL);
    if (n_convs) *n_convs = c.n_conv;
    if (n_linears) *n_linears = c.n_linear;
    if (!st)
        cm_log_msg(CM_LOG_INFO, "Factorize: applied to %s: %lld FactorizedConv2d and %lld FactorizedLinear modules",
                   cm_module_type_name(root), (long long)c.n_conv, (long long)c.n_linear);
    return st;
}

/* ---- the algorithm ---- */

typedef struct {
    cm_factorize_config cfg;
} fac_self;

static bool alg_match(void *self, cm_event ev, const cm_state *st) { return ev == CM_EVENT_INIT; }

static cm_status alg_apply(void *self, cm_event ev, cm_state *st, cm_logger *lg) {
    fac_self *s = self;
    cm_module *root;
    cm_status r = cmi_state_root(st, "Factorize", &root);
    if (r || (r = cm_apply_factorization(root, &s->cfg, NULL, NULL))) return r;
    const char *const tc[1] = {"FactorizedConv2d"}, *const tl[1] = {"FactorizedLinear"};
    cm_hparam h[2] = {{"factorize/num_conv2d_replacements", CM_HPARAM_NUMBER, (double)cmi_count_types(root, tc, 1), NULL},
                      {"factorize/num_linear_replacements", CM_HPARAM_NUMBER, (double)cmi_count_types(root, tl, 1),
                       NULL}};
    return cm_logger_log_hyperparameters(lg, h + (s->cfg.factorize_convs ? 0 : 1),
                                         (s->cfg.factorize_convs ? 1 : 0) + (s->cfg.factorize_linears ? 1 : 0));
}

static void alg_free(void *self) { cm_free(self); }

static const cm_algorithm_i fac_alg_vt = {
    .abi = CM_ALGORITHM_ABI,
    .name = "Factorize",
    .match = alg_match,
    .apply = alg_apply,
    .free = alg_free,
};

cm_status cm_factorize_new(const cm_factorize_config *cfg, cm_algorithm_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_factorize_new: out is NULL");
    cm_status st = check_cfg(cfg);
    if (st) return st;
    fac_self *s = cm_alloc_zeroed(sizeof *s, 16);
    if (!s) return CM_ERR_OOM;
    s->cfg = *cfg;
    *out = (cm_algorithm_plugin){&fac_alg_vt, s};
    return CM_OK;
}

static void cfg_default(void *c) { *(cm_factorize_config *)c = cm_factorize_config_default(); }
static cm_status make(const void *c, cm_algorithm_plugin *out) { return cm_factorize_new(c, out); }

static const cmi_arg k_args[] = {
    {{"factorize_convs", CM_ALGO_ARG_BOOL, "true", NULL, 0}, offsetof(cm_factorize_config, factorize_convs), false},
    {{"factorize_linears", CM_ALGO_ARG_BOOL, "true", NULL, 0}, offsetof(cm_factorize_config, factorize_linears), false},
    {{"min_channels", CM_ALGO_ARG_INT, "256", NULL, 0}, offsetof(cm_factorize_config, min_channels), false},
    {{"latent_channels", CM_ALGO_ARG_REAL, "0.25", NULL, 0}, offsetof(cm_factorize_config, latent_channels), false},
    {{"min_features", CM_ALGO_ARG_INT, "256", NULL, 0}, offsetof(cm_factorize_config, min_features), false},
    {{"latent_features", CM_ALGO_ARG_REAL, "128", NULL, 0}, offsetof(cm_factorize_config, latent_features), false},
};

const cmi_algo_entry cmi_factorize_entry = {
    {"Factorize", "factorize", true, 6}, &fac_alg_vt, sizeof(cm_factorize_config), cfg_default, k_args, 6, make,
};
