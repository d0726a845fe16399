/* Shared test helpers: random tensors, non-contiguous inputs, the gradient checker and the golden
 * file reader. Every check prints both values and the tolerance on failure. */
#ifndef CMTEST_H
#define CMTEST_H

#include <composer/composer.h>
#include <criterion/criterion.h>

/* A tape with poisoned (NaN-filled) arena memory, so unwritten outputs are caught. */
cm_tape *cmt_tape(void);

/* A tape tensor with values from N(0, 1) (or U(lo, hi) with cmt_rand_uniform), seeded; marked
 * requires_grad when `grad` is set. Aborts the test on failure. */
cm_tensor *cmt_randn(cm_tape *tp, int ndim, const int64_t *shape, uint64_t seed, bool grad);
cm_tensor *cmt_rand_uniform(cm_tape *tp, int ndim, const int64_t *shape, uint64_t seed, float lo, float hi, bool grad);
/* Same values as cmt_randn but stored transposed in memory (last two dims swapped, or with a
 * stride of 2 for 1-d), so the tensor is a non-contiguous leaf view. */
cm_tensor *cmt_randn_noncontig(cm_tape *tp, int ndim, const int64_t *shape, uint64_t seed, bool grad);
/* Integer tensor (i64) with values uniform in [lo, hi). */
cm_tensor *cmt_randint(cm_tape *tp, int ndim, const int64_t *shape, uint64_t seed, int64_t lo, int64_t hi);

/* The function under test: builds the output from the inputs on tp. */
typedef cm_tensor *(*cmt_fn)(cm_tape *tp, cm_tensor *const *in, void *ctx);

typedef struct cmt_gradcheck_opts {
    double eps;        /* central-difference step (default 1e-2) */
    double atol, rtol; /* |analytic - numeric| <= atol + rtol·|numeric| (defaults 1e-3, 1e-2) */
    int max_checks;    /* elements checked per input, spread over the tensor (default 48; 0 = all) */
} cmt_gradcheck_opts;
cmt_gradcheck_opts cmt_gradcheck_defaults(void);

/* Checks the gradient of L = Σ out·R (R a fixed random tensor) w.r.t. every input that requires
 * grad, against central differences computed in double from f32 forward passes. Also checks that
 * the output has no NaN (poisoned memory left unwritten). `name` labels failures. */
void cmt_gradcheck(const char *name, cmt_fn f, void *ctx, int n_in, cm_tensor *const *in,
                   const cmt_gradcheck_opts *opts);

/* An op's first gradient of an intermediate input is written (cmi_grad_for_write), not zeroed and
 * added to: on a poisoning tape (new memory NaN) any element it fails to write shows up. Runs f
 * on 1.5·in[k] for every input that requires grad, once as leaves holding those values (their
 * gradients are zeroed and added to) and once as intermediates (mul_scalar outputs), backward
 * with the same upstream gradient, and checks grad in[k] = 1.5 · grad leaf[k] within atol + rtol.
 * Inputs that need no grad are passed as they are. f must be deterministic (reseed any rng). */
void cmt_check_fresh_grads(const char *name, cmt_fn f, void *ctx, int n_in, cm_tensor *const *in, double atol,
                           double rtol);

/* A backward hook (cm_tape_set_backward_hook(tp, cmt_grad_probe_hook, &probe)) recording the dtype
 * of t's gradient each time a node of op `op` has run its backward while t has one — the gradient
 * that node wrote or read, before the tape drops it. seen counts those nodes; start it at 0 and
 * dtype at CM_DTYPE_COUNT. */
typedef struct {
    const cm_tensor *t;
    const char *op;
    int seen;
    cm_dtype dtype;
} cmt_grad_probe;
void cmt_grad_probe_hook(cm_tape *tp, const void *node, void *data);

/* Asserts every element of a and b (any dtypes/strides, same shape) agree within atol + rtol·|b|. */
void cmt_assert_close(const char *what, const cm_tensor *a, const cm_tensor *b, double atol, double rtol);
void cmt_assert_close_f32(const char *what, const float *a, const float *b, int64_t n, double atol, double rtol);

/* Asserts an op failed: `result` is NULL, the tape's status is `want`, and its message contains
 * each of the following strings (the list ends at the first NULL, so an optional last string
 * may be passed as NULL). Leaves the tape as it is. */
void cmt_expect_error(cm_tape *tp, const cm_tensor *result, cm_status want, ...);

/* Golden files: safetensors written by tests/golden/make_golden.py. */
typedef struct cmt_golden cmt_golden;
cmt_golden *cmt_golden_open(const char *path); /* aborts the test if missing or malformed */
void cmt_golden_close(cmt_golden *g);
/* A long-lived tensor (caller frees) copied from the file; aborts if the name is missing. */
cm_tensor *cmt_golden_get(cmt_golden *g, const char *name);
bool cmt_golden_has(cmt_golden *g, const char *name);
/* A tape tensor with the golden's values, optionally requiring grad. */
cm_tensor *cmt_golden_on_tape(cmt_golden *g, cm_tape *tp, const char *name, bool grad);

/* Runs a shell command with stderr joined to stdout, keeping the first cap - 1 bytes of the output
 * in out (NUL-terminated); returns the exit status (128 when it did not exit normally). */
int cmt_run_capture(const char *cmd, char *out, size_t cap);
/* cmt_run_capture of the command the printf-style format makes, e.g. the CLI tests'
 * cmt_run_capturef(out, cap, "%s %s", CM_COMPOSER_BIN, args). */
int cmt_run_capturef(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* main() of a test executable that needs a GPU: probes CUDA in a child process (CUDA initialised
 * here would be unusable in Criterion's forked workers); without a usable GPU prints
 * "NAME: skipped: why" and returns 77 (CTest's SKIP_RETURN_CODE), else prints the device when
 * describe is set and runs the Criterion tests. */
int cmt_gpu_main(int argc, char *argv[], const char *name, bool describe);
/* The whole file (malloc'd, NUL-terminated; *len if not NULL), or NULL if it cannot be read. */
char *cmt_slurp(const char *path, size_t *len);
/* cmt_slurp that fails the test naming the path when the file cannot be read. */
char *cmt_read_file(const char *path, size_t *len);
/* Writes n bytes (or text) to path, replacing it; fails the test naming the path when it cannot. */
void cmt_write_file(const char *path, const void *data, size_t n);
void cmt_write_text(const char *path, const char *text);
/* Whether path exists (anything stat sees) / is of at least one byte. */
bool cmt_exists(const char *path);
bool cmt_nonempty(const char *path);

/* Character-level token files for the CLI tests, from the first text_bytes (at most 65536) of tiny
 * Shakespeare (../shared/data/tinyshakespeare/input.txt): dir/train.bin with every token but the
 * last val_tokens, dir/val.bin with those (none when val_tokens is 0) and dir/tokenizer.json. dir
 * must exist. Asserts on any failure. */
void cmt_char_token_files(const char *dir, size_t text_bytes, int64_t val_tokens);

#endif
