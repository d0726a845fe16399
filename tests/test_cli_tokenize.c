/* `composer data tokenize` end to end on tiny Shakespeare (char and gpt2): header bytes, counts,
 * the split, tokenizer.json, a decode of the first tokens; and the messages and exit codes of bad
 * commands, flags, values and paths. Runs the built binary (CM_COMPOSER_BIN). */
#include "cmtest.h"

#include <composer/tokenizer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef CM_COMPOSER_BIN
#error "CM_COMPOSER_BIN must name the composer binary (tests/CMakeLists.txt sets it)"
#endif
#define INPUT "../shared/data/tinyshakespeare/input.txt"

/* Runs `composer ARGS` with stdout+stderr captured into out; returns the exit status. */
static int run(const char *args, char *out, size_t cap) {
    return cmt_run_capturef(out, cap, "%s %s", CM_COMPOSER_BIN, args);
}

static uint32_t le32(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }

/* Checks OUTDIR/NAME's header and returns its tokens (uint16) widened to int32 (malloc'ed). */
static int32_t *read_tokens(const char *dir, const char *name, int64_t want_n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t len;
    uint8_t *b = (uint8_t *)cmt_read_file(path, &len);
    cr_assert_eq(le32(b), 20240520u, "%s: magic %u", path, le32(b));
    cr_assert_eq(le32(b + 4), 1u, "%s: version %u (uint16 expected)", path, le32(b + 4));
    cr_assert_eq((int64_t)le32(b + 8), want_n, "%s: header count %u, want %lld", path, le32(b + 8), (long long)want_n);
    cr_assert_eq(len, 1024 + 2 * (size_t)want_n, "%s: %zu bytes", path, len);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(want_n + 1));
    for (int64_t i = 0; i < want_n; i++) ids[i] = b[1024 + 2 * i] | b[1025 + 2 * i] << 8;
    free(b);
    return ids;
}

static void expect_decoded_prefix(const char *dir, const int32_t *ids, int64_t n, const char *want) {
    char path[256];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    cm_tokenizer *tok;
    cr_assert_eq(cm_tokenizer_load(path, &tok), CM_OK, "%s", cm_last_error());
    char *text;
    cr_assert_eq(cm_tokenizer_decode(tok, ids, n, &text, NULL), CM_OK);
    cr_assert_str_eq(text, want);
    cm_free(text);
    cm_tokenizer_free(tok);
}

static void rm_outdir(const char *dir) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

Test(cli, version_and_help) {
    char out[4096];
    cr_assert_eq(run("--version", out, sizeof out), 0);
    cr_assert_str_eq(out, "composer 0.1.0\n");
    cr_assert_eq(run("--help", out, sizeof out), 0);
    cr_assert(strstr(out, "data") && strstr(out, "--version"), "%s", out);
    cr_assert_eq(run("data tokenize --help", out, sizeof out), 0);
    cr_assert(strstr(out, "--val-fraction") && strstr(out, "20240520"), "%s", out);
}

Test(cli, char_tokenize_tiny_shakespeare) {
    char dir[] = "/tmp/cm_cli_char_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char args[512], out[4096];
    snprintf(args, sizeof args, "data tokenize --tokenizer char --val-fraction 0.1 %s -o %s/sub", INPUT, dir);
    cr_assert_eq(run(args, out, sizeof out), 0, "%s", out);
    char sub[300];
    snprintf(sub, sizeof sub, "%s/sub", dir);
    /* nanoGPT shakespeare_char: train 1,003,854 and val 111,540 characters */
    int32_t *train = read_tokens(sub, "train.bin", 1003854);
    int32_t *val = read_tokens(sub, "val.bin", 111540);
    expect_decoded_prefix(sub, train, 15, "First Citizen:\n");
    free(train);
    free(val);
    rm_outdir(dir);
}

Test(cli, gpt2_tokenize_tiny_shakespeare_keeps_every_token) {
    char dir[] = "/tmp/cm_cli_gpt2_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char args[512], out[4096];
    snprintf(args, sizeof args, "data tokenize %s --output=%s --val-fraction=0.1", INPUT, dir);
    cr_assert_eq(run(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "338025"), "summary: %s", out);
    /* 338,025 tokens in all (the full file's count): floor(0.9 n) train, the rest val */
    int32_t *train = read_tokens(dir, "train.bin", 304222);
    int32_t *val = read_tokens(dir, "val.bin", 338025 - 304222);
    static const int32_t first[5] = {5962, 22307, 25, 198, 8421}; /* "First Citizen:\nBefore" */
    for (int i = 0; i < 5; i++) cr_assert_eq(train[i], first[i], "train[%d] = %d, want %d", i, train[i], first[i]);
    expect_decoded_prefix(dir, train, 5, "First Citizen:\nBefore");
    free(train);
    free(val);
    rm_outdir(dir);
}

Test(cli, bad_commands_flags_and_paths_fail_with_clear_messages) {
    char out[4096];
    static const struct {
        const char *args;
        int rc;
        const char *msg;
    } cases[] = {
        {"dta", 2, "unknown command 'dta'; did you mean 'data'?"},
        {"data tokenise x -o y", 2, "did you mean 'tokenize'?"},
        {"--verison", 2, "did you mean '--version'?"},
        {"data tokenize --val-fracton 0.2 x -o /tmp/x", 2, "unknown flag '--val-fracton'; did you mean '--val-fraction'?"},
        {"data tokenize --tokenizer gtp2 x -o /tmp/x", 2, "unknown tokenizer 'gtp2' (use gpt2 or char); did you mean 'gpt2'?"},
        {"data tokenize --val-fraction 1.5 x -o /tmp/x", 2, "--val-fraction '1.5'"},
        {"data tokenize --val-fraction abc x -o /tmp/x", 2, "--val-fraction 'abc'"},
        {"data tokenize -o /tmp/x", 2, "missing INPUT"},
        {"data tokenize " INPUT, 2, "missing -o OUTDIR"},
        {"data tokenize a b -o /tmp/x", 2, "unexpected argument 'b'"},
        {"data tokenize " INPUT " -o", 2, "needs a value"},
        {"data tokenize /nonexistent/input.txt -o /tmp/x", 1, "cannot open INPUT '/nonexistent/input.txt'"},
        {"data tokenize " INPUT " --encoder /nonexistent/enc.json -o /tmp/cm_cli_never", 1, "/nonexistent/enc.json"},
        {"data tokenize " INPUT " -o /dev/null/sub", 1, "cannot create OUTDIR '/dev/null/sub'"},
        {"data tokenize --dtype int8 " INPUT " -o /tmp/x", 2, "unknown --dtype 'int8'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = run(cases[i].args, out, sizeof out);
        cr_assert_eq(rc, cases[i].rc, "`composer %s` exited %d, want %d: %s", cases[i].args, rc, cases[i].rc, out);
        cr_assert(strstr(out, cases[i].msg), "`composer %s` said \"%s\", want it to contain \"%s\"", cases[i].args, out,
                  cases[i].msg);
    }
    cr_assert_neq(access("/tmp/cm_cli_never", F_OK), 0, "a failed run must not create OUTDIR");
}
