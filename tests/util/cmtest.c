#include "cmtest.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tensor/tensor_impl.h"

cm_tape *cmt_tape(void) {
    cm_tape_config c = cm_tape_config_default();
    c.poison = true;
    cm_tape *tp = NULL;
    cr_assert_eq(cm_tape_new(&c, &tp), CM_OK, "cm_tape_new: %s", cm_last_error());
    return tp;
}

static cm_tensor *new_leaf(cm_tape *tp, int ndim, const int64_t *shape) {
    cm_tensor *t = cm_empty(tp, CM_DTYPE_F32, ndim, shape);
    cr_assert(t, "cm_empty %s: %s", cmi_shape_of(ndim, shape), cm_tape_error(tp));
    return t;
}

cm_tensor *cmt_randn(cm_tape *tp, int ndim, const int64_t *shape, uint64_t seed, bool grad) {
    cm_tensor *t = new_leaf(tp, ndim, shape);
    cm_rng r = cm_rng_init(seed, 77);
    cm_rng_normal(&r, cmi_f32(t), (size_t)cm_tensor_numel(t), 0.0f, 1.0f);
    if (grad) cm_tensor_set_requires_grad(t, true);
    return t;
}

cm_tensor *cmt_rand_uniform(cm_tape *tp, int ndim, const int64_t *shape, uint64_t seed, float lo, float hi,
                            bool grad) {
    cm_tensor *t = new_leaf(tp, ndim, shape);
    cm_rng r = cm_rng_init(seed, 78);
    cm_rng_uniform(&r, cmi_f32(t), (size_t)cm_tensor_numel(t), lo, hi);
    if (grad) cm_tensor_set_requires_grad(t, true);
    return t;
}

cm_tensor *cmt_randn_noncontig(cm_tape *tp, int ndim, const int64_t *shape, uint64_t seed, bool grad) {
    cm_tensor *src = cmt_randn(tp, ndim, shape, seed, false);
    int64_t mshape[CM_MAX_DIMS], stride[CM_MAX_DIMS];
    memcpy(mshape, shape, sizeof(int64_t) * (size_t)ndim);
    cm_tensor *view;
    if (ndim >= 2) {
        mshape[ndim - 1] = shape[ndim - 2];
        mshape[ndim - 2] = shape[ndim - 1];
        cm_tensor *mem = new_leaf(tp, ndim, mshape);
        cmi_contig_strides(ndim, mshape, stride);
        int64_t t = stride[ndim - 1];
        stride[ndim - 1] = stride[ndim - 2];
        stride[ndim - 2] = t;
        view = cmi_view(tp, CM_DTYPE_F32, ndim, shape, stride, mem->data);
    } else {
        int64_t n = ndim == 1 ? shape[0] : 1;
        int64_t big[1] = {2 * n};
        cm_tensor *mem = new_leaf(tp, 1, big);
        stride[0] = 2;
        view = cmi_view(tp, CM_DTYPE_F32, ndim, shape, stride, mem->data);
    }
    cr_assert(view);
    cr_assert_eq(cm_tensor_copy(view, src), CM_OK);
    if (grad) cm_tensor_set_requires_grad(view, true);
    return view;
}

cm_tensor *cmt_randint(cm_tape *tp, int ndim, const int64_t *shape, uint64_t seed, int64_t lo, int64_t hi) {
    cm_tensor *t = cm_empty(tp, CM_DTYPE_I64, ndim, shape);
    cr_assert(t);
    cm_rng r = cm_rng_init(seed, 79);
    cm_rng_randint(&r, (int64_t *)t->data, (size_t)cm_tensor_numel(t), lo, hi);
    return t;
}

cmt_gradcheck_opts cmt_gradcheck_defaults(void) {
    cmt_gradcheck_opts o = {1e-2, 1e-3, 1e-2, 48};
    return o;
}

static void flat_index(const cm_tensor *t, int64_t i, int64_t *idx) {
    for (int d = t->ndim - 1; d >= 0; d--) {
        idx[d] = i % t->shape[d];
        i /= t->shape[d];
    }
}

/* L = Σ out·R in double. */
static double project(const cm_tensor *out, const float *r) {
    double s = 0;
    int64_t n = cm_tensor_numel(out);
    for (int64_t i = 0; i < n; i++) s += cm_tensor_get_flat(out, i) * (double)r[i];
    return s;
}

void cmt_gradcheck(const char *name, cmt_fn f, void *ctx, int n_in, cm_tensor *const *in,
                   const cmt_gradcheck_opts *opts) {
    cmt_gradcheck_opts o = opts ? *opts : cmt_gradcheck_defaults();
    cm_tape *tp = cmt_tape();
    for (int k = 0; k < n_in; k++)
        if (in[k]) cm_tensor_clear_grad(in[k]);
    cm_tensor *out = f(tp, in, ctx);
    cr_assert(out, "%s: forward failed: %s", name, cm_tape_error(tp));
    int64_t n_out = cm_tensor_numel(out);
    for (int64_t i = 0; i < n_out; i++) {
        double v = cm_tensor_get_flat(out, i);
        cr_assert(!isnan(v), "%s: output element %lld is NaN (unwritten or bad math)", name, (long long)i);
    }
    float *r = malloc(sizeof(float) * (size_t)(n_out + 1));
    cm_rng rr = cm_rng_init(1234, 5);
    cm_rng_uniform(&rr, r, (size_t)n_out, -1.0f, 1.0f);
    cm_tensor *rt;
    cr_assert_eq(cm_tensor_from_data(CM_DTYPE_F32, out->ndim, out->shape, r, &rt), CM_OK);
    cm_status st = cm_tape_backward_with(tp, out, rt);
    cr_assert_eq(st, CM_OK, "%s: backward failed: %s", name, cm_tape_error(tp));

    cm_tape *tp2 = cmt_tape();
    cm_tape_set_grad_enabled(tp2, false);
    int checked_inputs = 0;
    for (int k = 0; k < n_in; k++) {
        cm_tensor *x = in[k];
        if (!x || !cm_tensor_requires_grad(x) || x->dtype != CM_DTYPE_F32) continue;
        checked_inputs++;
        cm_tensor *g = cm_tensor_grad(x);
        int64_t n = cm_tensor_numel(x);
        if (n == 0) continue;
        cr_assert(g, "%s: input %d requires grad but received no gradient", name, k);
        int64_t checks = (o.max_checks <= 0 || o.max_checks >= n) ? n : o.max_checks;
        for (int64_t c = 0; c < checks; c++) {
            int64_t i = checks == n ? c : (c * 7919 + 13) % n;
            int64_t idx[CM_MAX_DIMS];
            flat_index(x, i, idx);
            double x0 = cm_tensor_get(x, idx);
            cm_tensor_set(x, idx, x0 + o.eps);
            cm_tensor *op = f(tp2, in, ctx);
            cr_assert(op, "%s: forward (+eps) failed: %s", name, cm_tape_error(tp2));
            double lp = project(op, r);
            cm_tape_reset(tp2);
            cm_tensor_set(x, idx, x0 - o.eps);
            cm_tensor *om = f(tp2, in, ctx);
            cr_assert(om, "%s: forward (-eps) failed: %s", name, cm_tape_error(tp2));
            double lm = project(om, r);
            cm_tape_reset(tp2);
            cm_tensor_set(x, idx, x0);
            double num = (lp - lm) / (2.0 * o.eps);
            double ana = cmi_f32(g)[i];
            double tol = o.atol + o.rtol * fabs(num);
            cr_assert(fabs(ana - num) <= tol,
                      "%s: d/d input%d[%lld]: analytic %.7g vs numeric %.7g (|diff| %.3g > tol %.3g)", name, k,
                      (long long)i, ana, num, fabs(ana - num), tol);
        }
    }
    cr_assert(checked_inputs > 0, "%s: no input requires grad; the check would test nothing", name);
    cm_tensor_free(rt);
    free(r);
    cm_tape_free(tp2);
    cm_tape_free(tp);
}

void cmt_check_fresh_grads(const char *name, cmt_fn f, void *ctx, int n_in, cm_tensor *const *in, double atol,
                           double rtol) {
    enum { MAXI = 8 };
    cr_assert(n_in <= MAXI);
    cm_tape *tp = cmt_tape();
    cm_tensor *x0[MAXI] = {0}, *leaf[MAXI] = {0}, *mid[MAXI] = {0};
    int n_diff = 0;
    for (int k = 0; k < n_in; k++) {
        if (!in[k] || !cm_tensor_requires_grad(in[k])) {
            leaf[k] = mid[k] = in[k];
            continue;
        }
        n_diff++;
        x0[k] = cm_clone_detached(tp, in[k]);
        cm_tensor_set_requires_grad(x0[k], true);
        leaf[k] = cm_clone_detached(tp, cm_mul_scalar(tp, x0[k], 1.5f));
        cm_tensor_set_requires_grad(leaf[k], true);
        mid[k] = cm_mul_scalar(tp, x0[k], 1.5f);
        cr_assert(leaf[k] && mid[k], "%s: %s", name, cm_tape_error(tp));
    }
    cr_assert(n_diff > 0, "%s: no input requires grad; the check would test nothing", name);
    cm_tensor *yl = f(tp, leaf, ctx);
    cr_assert(yl, "%s (leaves): %s", name, cm_tape_error(tp));
    cm_tensor *g = cmt_randn(tp, yl->ndim, yl->shape, 4242, false);
    cr_assert_eq(cm_tape_backward_with(tp, yl, g), CM_OK, "%s: %s", name, cm_tape_error(tp));
    cm_tensor *y = f(tp, mid, ctx);
    cr_assert(y, "%s (intermediates): %s", name, cm_tape_error(tp));
    cmt_assert_close(name, y, yl, 0, 0);
    cr_assert_eq(cm_tape_backward_with(tp, y, g), CM_OK, "%s: %s", name, cm_tape_error(tp));
    for (int k = 0; k < n_in; k++) {
        if (!x0[k]) continue;
        char what[160];
        snprintf(what, sizeof what, "%s: grad of input %d written fresh", name, k);
        cm_tensor *want = cm_mul_scalar(tp, cm_tensor_grad(leaf[k]), 1.5f);
        cr_assert(want && cm_tensor_grad(x0[k]), "%s: missing gradient", what);
        cmt_assert_close(what, cm_tensor_grad(x0[k]), want, atol, rtol);
    }
    cm_tape_free(tp);
}

void cmt_assert_close(const char *what, const cm_tensor *a, const cm_tensor *b, double atol, double rtol) {
    cr_assert_eq(a->ndim, b->ndim, "%s: ndim %d vs %d (%s vs %s)", what, a->ndim, b->ndim, cmi_shape(a),
                 cmi_shape(b));
    for (int i = 0; i < a->ndim; i++)
        cr_assert_eq(a->shape[i], b->shape[i], "%s: shapes %s vs %s", what, cmi_shape(a), cmi_shape(b));
    int64_t n = cm_tensor_numel(a);
    for (int64_t i = 0; i < n; i++) {
        double x = cm_tensor_get_flat(a, i), y = cm_tensor_get_flat(b, i);
        double tol = atol + rtol * fabs(y);
        cr_assert(fabs(x - y) <= tol || (isnan(x) && isnan(y)), "%s[%lld]: %.7g vs expected %.7g (|diff| %.3g > tol %.3g)",
                  what, (long long)i, x, y, fabs(x - y), tol);
    }
}

void cmt_assert_close_f32(const char *what, const float *a, const float *b, int64_t n, double atol, double rtol) {
    for (int64_t i = 0; i < n; i++) {
        double tol = atol + rtol * fabs((double)b[i]);
        cr_assert(fabs((double)a[i] - (double)b[i]) <= tol, "%s[%lld]: %.7g vs expected %.7g (|diff| %.3g > tol %.3g)",
                  what, (long long)i, (double)a[i], (double)b[i], fabs((double)a[i] - (double)b[i]), tol);
    }
}

void cmt_expect_error(cm_tape *tp, const cm_tensor *result, cm_status want, ...) {
    cr_assert_null(result, "expected the op to fail with %s", cm_status_name(want));
    cr_assert_eq(cm_tape_status(tp), want, "status %s, want %s: %s", cm_status_name(cm_tape_status(tp)),
                 cm_status_name(want), cm_tape_error(tp));
    va_list ap;
    va_start(ap, want);
    for (const char *s = va_arg(ap, const char *); s; s = va_arg(ap, const char *))
        cr_assert(strstr(cm_tape_error(tp), s), "message '%s' lacks '%s'", cm_tape_error(tp), s);
    va_end(ap);
}

/* ---- golden files (safetensors) ---- */

struct cmt_golden {
    char *path;
    unsigned char *buf;
    size_t size;
    size_t data_start;
    cJSON *header;
};

cmt_golden *cmt_golden_open(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "golden file %s is missing (regenerate with 'make golden')", path);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    cmt_golden *g = calloc(1, sizeof *g);
    g->buf = malloc((size_t)sz);
    g->size = (size_t)sz;
    cr_assert_eq(fread(g->buf, 1, (size_t)sz, f), (size_t)sz, "golden %s: short read", path);
    fclose(f);
    cr_assert(sz >= 8, "golden %s: too small", path);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | g->buf[i];
    cr_assert(8 + n <= (uint64_t)sz, "golden %s: header length %llu past end", path, (unsigned long long)n);
    char *hdr = malloc(n + 1);
    memcpy(hdr, g->buf + 8, n);
    hdr[n] = 0;
    g->header = cJSON_Parse(hdr);
    free(hdr);
    cr_assert(g->header, "golden %s: header is not JSON", path);
    g->data_start = 8 + n;
    g->path = strdup(path);
    return g;
}

void cmt_golden_close(cmt_golden *g) {
    if (!g) return;
    cJSON_Delete(g->header);
    free(g->buf);
    free(g->path);
    free(g);
}

bool cmt_golden_has(cmt_golden *g, const char *name) { return cJSON_GetObjectItemCaseSensitive(g->header, name); }

cm_tensor *cmt_golden_get(cmt_golden *g, const char *name) {
    cJSON *e = cJSON_GetObjectItemCaseSensitive(g->header, name);
    cr_assert(e, "golden %s: no tensor '%s'", g->path, name);
    const char *dt = cJSON_GetObjectItem(e, "dtype")->valuestring;
    cJSON *shape = cJSON_GetObjectItem(e, "shape");
    cJSON *offs = cJSON_GetObjectItem(e, "data_offsets");
    int ndim = cJSON_GetArraySize(shape);
    int64_t sh[CM_MAX_DIMS];
    for (int i = 0; i < ndim; i++) sh[i] = (int64_t)cJSON_GetArrayItem(shape, i)->valuedouble;
    size_t b = (size_t)cJSON_GetArrayItem(offs, 0)->valuedouble, en = (size_t)cJSON_GetArrayItem(offs, 1)->valuedouble;
    cm_dtype d;
    if (strcmp(dt, "F32") == 0) d = CM_DTYPE_F32;
    else if (strcmp(dt, "I64") == 0) d = CM_DTYPE_I64;
    else if (strcmp(dt, "I32") == 0) d = CM_DTYPE_I32;
    else if (strcmp(dt, "BF16") == 0) d = CM_DTYPE_BF16;
    else if (strcmp(dt, "U8") == 0) d = CM_DTYPE_U8;
    else cr_assert_fail("golden %s: tensor '%s' has unsupported dtype %s", g->path, name, dt);
    cm_tensor *t;
    cr_assert_eq(cm_tensor_new(d, ndim, sh, &t), CM_OK);
    cr_assert_eq(en - b, cm_tensor_nbytes(t), "golden %s: '%s' byte size mismatch", g->path, name);
    cr_assert(g->data_start + en <= g->size, "golden %s: '%s' past end of file", g->path, name);
    memcpy(cm_tensor_data(t), g->buf + g->data_start + b, en - b);
    return t;
}

cm_tensor *cmt_golden_on_tape(cmt_golden *g, cm_tape *tp, const char *name, bool grad) {
    cm_tensor *h = cmt_golden_get(g, name);
    cm_tensor *t = cm_clone_detached(tp, h);
    cr_assert(t);
    cm_tensor_free(h);
    if (grad) cm_tensor_set_requires_grad(t, true);
    return t;
}

void cmt_grad_probe_hook(cm_tape *tp, const void *node, void *data) {
    (void)tp;
    cmt_grad_probe *p = data;
    const cm_node *n = node;
    if (n && strcmp(n->op, p->op) == 0 && cm_tensor_grad(p->t)) {
        p->seen++;
        p->dtype = cm_tensor_dtype(cm_tensor_grad(p->t));
    }
}

int cmt_run_capture(const char *cmd, char *out, size_t cap) {
    char full[8192];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    cr_assert_not_null(p, "cannot run %s", cmd);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    char sink[4096]; /* the rest, so the command never blocks on a full pipe */
    while (fread(sink, 1, sizeof sink, p) > 0) {
    }
    const int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

char *cmt_slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *s = malloc(cap);
    for (;;) {
        if (n + 1 >= cap) s = realloc(s, cap *= 2);
        size_t k = fread(s + n, 1, cap - n - 1, f);
        if (k == 0) break;
        n += k;
    }
    fclose(f);
    s[n] = '\0';
    if (len) *len = n;
    return s;
}

int cmt_run_capturef(char *out, size_t cap, const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    cr_assert(n >= 0 && (size_t)n < sizeof cmd, "command of %d bytes does not fit %zu", n, sizeof cmd);
    return cmt_run_capture(cmd, out, cap);
}

char *cmt_read_file(const char *path, size_t *len) {
    char *s = cmt_slurp(path, len);
    cr_assert_not_null(s, "cannot read %s", path);
    return s;
}

void cmt_write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot write %s: %s", path, strerror(errno));
    cr_assert_eq(fwrite(data, 1, n, f), n, "cannot write %s", path);
    cr_assert_eq(fclose(f), 0, "cannot write %s", path);
}

void cmt_write_text(const char *path, const char *text) { cmt_write_file(path, text, strlen(text)); }

bool cmt_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

bool cmt_nonempty(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && st.st_size > 0;
}

void cmt_char_token_files(const char *dir, size_t text_bytes, int64_t val_tokens) {
    static const char *input = "../shared/data/tinyshakespeare/input.txt";
    static char text[65536];
    cr_assert(text_bytes <= sizeof text, "cmt_char_token_files: %zu bytes (at most %zu)", text_bytes, sizeof text);
    FILE *f = fopen(input, "rb");
    cr_assert_not_null(f, "cannot open %s", input);
    const size_t len = fread(text, 1, text_bytes, f);
    fclose(f);
    cm_tokenizer *tok;
    cr_assert_eq(cm_tokenizer_char_new_from_text(text, len, &tok), CM_OK, "%s", cm_last_error());
    int32_t *ids;
    int64_t n;
    cr_assert_eq(cm_tokenizer_encode(tok, text, len, &ids, &n), CM_OK, "%s", cm_last_error());
    cr_assert(val_tokens >= 0 && val_tokens < n, "cmt_char_token_files: %lld validation tokens of %lld",
              (long long)val_tokens, (long long)n);
    char path[512];
    snprintf(path, sizeof path, "%s/train.bin", dir);
    cr_assert_eq(cm_token_file_write(path, ids, n - val_tokens, CM_TOKEN_WIDTH_AUTO), CM_OK, "%s", cm_last_error());
    if (val_tokens) {
        snprintf(path, sizeof path, "%s/val.bin", dir);
        cr_assert_eq(cm_token_file_write(path, ids + n - val_tokens, val_tokens, CM_TOKEN_WIDTH_AUTO), CM_OK, "%s",
                     cm_last_error());
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    cr_assert_eq(cm_tokenizer_save(tok, path), CM_OK, "%s", cm_last_error());
    cm_free(ids);
    cm_tokenizer_free(tok);
}

int cmt_gpu_main(int argc, char *argv[], const char *name, bool describe) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (cm_device_check(CM_DEVICE_CUDA) != CM_OK) {
            printf("%s: skipped: %s\n", name, cm_last_error());
            fflush(stdout);
            _exit(77);
        }
        if (describe) printf("%s: comparing the CPU with %s\n", name, cm_device_describe(CM_DEVICE_CUDA));
        fflush(stdout);
        _exit(0);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st)) return 1;
    if (WEXITSTATUS(st) != 0) return WEXITSTATUS(st) == 77 ? 77 : 1;
    struct criterion_test_set *tests = criterion_initialize();
    int result = 0;
    if (criterion_handle_args(argc, argv, true)) result = !criterion_run_all_tests(tests);
    criterion_finalize(tests);
    return result;
}
