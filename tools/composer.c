/* The `composer` command-line tool.
 *
 *   composer --help | --version
 *   composer train CONFIG.yaml [key.path=value ...] [--print-config]
 *   composer -n N train CONFIG.yaml ...        (data-parallel over N ranks; see cli_train.c)
 *   composer eval CONFIG.yaml --weights PATH [key.path=value ...]
 *   composer generate --weights PATH [--prompt TEXT] [--max-new-tokens N] ...
 *   composer data tokenize [--tokenizer gpt2|char] [--val-fraction F] INPUT -o OUTDIR
 *   composer data convert --to mds INPUT -o OUT        (tools/cli_data.c)
 *   composer -n N [--world_size W] [--stdout FMT] ... PROGRAM|SUBCOMMAND [ARGS...]   (tools/launch.c)
 *   composer ckpt inspect PATH | ckpt verify PATH | ckpt export PATH -o model.safetensors
 *   composer recipe compare BASELINE.yaml RECIPE.yaml --target METRIC=VALUE [--seeds 3]   (cli_recipe.c)
 *
 * Commands live in tables of {name, function, help} (a group's entry points at its sub-table), so
 * adding a subcommand is adding a row. Unknown commands, flags and values are answered with the
 * closest valid spelling. Exit status: 0 success, 1 failure while working (I/O, bad file), 2 usage
 * error. */
#include "cli.h"

#include <composer/checkpoint.h>
#include <composer/composer.h>
#include <composer/tokenizer.h>

#include "launch.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct cli_cmd cli_cmd;
struct cli_cmd {
    const char *name;
    int (*fn)(const char *prog, int argc, char **argv); /* argv[0] is the first argument after the name */
    const char *help;
    const cli_cmd *sub; /* a command group: its subcommands (fn is NULL) */
};

/* ---------------------------------------------------------------------------------------------
 * Suggestions
 * ------------------------------------------------------------------------------------------- */

void cli_print_suggestion(const char *word, const char *const *cands, int n) {
    const char *s = cm_closest_name(word, cands, n);
    if (s) fprintf(stderr, "; did you mean '%s'?\n", s);
    else fprintf(stderr, "\n");
}

/* ---------------------------------------------------------------------------------------------
 * Command tables and dispatch
 * ------------------------------------------------------------------------------------------- */

static void print_commands(FILE *f, const char *prog, const cli_cmd *table) {
    fprintf(f, "usage: %s <command> [options]\n\ncommands:\n", prog);
    for (const cli_cmd *c = table; c->name; c++) fprintf(f, "  %-12s %s\n", c->name, c->help);
    if (!strchr(prog, ' '))
        fprintf(f, "\noptions:\n  -h, --help     show this help\n  -V, --version  print the version\n"
                   "  -n N ...       start N ranks: composer -n 2 train CONFIG.yaml trains data-parallel\n"
                   "                 (composer -n --help for the launcher's options)\n");
    fprintf(f, "\nRun '%s <command> --help' for a command's options.\n", prog);
}

static int dispatch(const char *prog, const cli_cmd *table, int argc, char **argv) {
    if (argc == 0) {
        print_commands(stderr, prog, table);
        return EXIT_USAGE;
    }
    if (strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0 || strcmp(argv[0], "help") == 0) {
        print_commands(stdout, prog, table);
        return 0;
    }
    for (const cli_cmd *c = table; c->name; c++) {
        if (strcmp(c->name, argv[0]) != 0) continue;
        char sub_prog[256];
        snprintf(sub_prog, sizeof sub_prog, "%s %s", prog, c->name);
        if (c->sub) return dispatch(sub_prog, c->sub, argc - 1, argv + 1);
        return c->fn(sub_prog, argc - 1, argv + 1);
    }
    const char *names[32];
    int n = 0;
    for (const cli_cmd *c = table; c->name && n < 32; c++) names[n++] = c->name;
    fprintf(stderr, "%s: unknown command '%s'", prog, argv[0]);
    cli_print_suggestion(argv[0], names, n);
    fprintf(stderr, "Run '%s --help' for the list of commands.\n", prog);
    return EXIT_USAGE;
}

/* ---------------------------------------------------------------------------------------------
 * Flags: a table per command; "--name value", "--name=value" and short "-x value"
 * ------------------------------------------------------------------------------------------- */


void cli_print_flags(FILE *f, const cli_flag *flags) {
    for (const cli_flag *fl = flags; fl->name; fl++) {
        char left[64];
        snprintf(left, sizeof left, "%s%s%s%s%s", fl->short_name ? fl->short_name : "", fl->short_name ? ", " : "",
                 fl->name, fl->value ? " " : "", fl->value ? fl->value : "");
        fprintf(f, "  %-28s %s\n", left, fl->help);
    }
}

/* Parses argv against flags; positional arguments go to pos (up to max_pos). Returns 0, or
 * EXIT_USAGE after printing the problem, or -1 when --help was printed. */
int cli_parse_flags(const char *prog, const cli_flag *flags, int argc, char **argv, const char **pos, int max_pos,
                       int *n_pos, void (*usage)(FILE *, const char *)) {
    *n_pos = 0;
    bool only_pos = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (only_pos || a[0] != '-' || a[1] == 0) {
            if (*n_pos >= max_pos) {
                fprintf(stderr, "%s: unexpected argument '%s' (see '%s --help')\n", prog, a, prog);
                return EXIT_USAGE;
            }
            pos[(*n_pos)++] = a;
            continue;
        }
        if (strcmp(a, "--") == 0) {
            only_pos = true;
            continue;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout, prog);
            return -1;
        }
        const char *eq = strchr(a, '=');
        size_t name_len = eq ? (size_t)(eq - a) : strlen(a);
        const cli_flag *hit = NULL;
        for (const cli_flag *fl = flags; fl->name && !hit; fl++)
            if ((strlen(fl->name) == name_len && strncmp(fl->name, a, name_len) == 0) ||
                (fl->short_name && strlen(fl->short_name) == name_len && strncmp(fl->short_name, a, name_len) == 0))
                hit = fl;
        if (!hit) {
            const char *names[32];
            int n = 0;
            for (const cli_flag *fl = flags; fl->name && n < 31; fl++) names[n++] = fl->name;
            names[n++] = "--help";
            char word[128];
            snprintf(word, sizeof word, "%.*s", (int)name_len, a);
            fprintf(stderr, "%s: unknown flag '%s'", prog, word);
            cli_print_suggestion(word, names, n);
            return EXIT_USAGE;
        }
        if (!hit->value) {
            if (eq) {
                fprintf(stderr, "%s: flag %s takes no value\n", prog, hit->name);
                return EXIT_USAGE;
            }
            *hit->out = "1";
        } else if (eq) {
            *hit->out = eq + 1;
        } else if (i + 1 < argc) {
            *hit->out = argv[++i];
        } else {
            fprintf(stderr, "%s: flag %s needs a value (%s)\n", prog, hit->name, hit->value);
            return EXIT_USAGE;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * composer data tokenize
 * ------------------------------------------------------------------------------------------- */

static const char *g_tok_name = "gpt2", *g_val_frac = "0.1", *g_outdir, *g_encoder = "../shared/data/gpt2/encoder.json",
                  *g_vocab_bpe = "../shared/data/gpt2/vocab.bpe", *g_dtype = "auto", *g_quiet;

static const cli_flag k_tokenize_flags[] = {
    {"--tokenizer", NULL, "NAME", "gpt2 (byte-level BPE) or char (vocabulary from INPUT); default gpt2", &g_tok_name},
    {"--val-fraction", NULL, "F", "the last F of the tokens go to val.bin, 0 <= F < 1; default 0.1", &g_val_frac},
    {"--output", "-o", "OUTDIR", "directory for train.bin, val.bin, tokenizer.json (created if missing)", &g_outdir},
    {"--encoder", NULL, "PATH", "GPT-2 encoder.json; default ../shared/data/gpt2/encoder.json", &g_encoder},
    {"--vocab-bpe", NULL, "PATH", "GPT-2 vocab.bpe; default ../shared/data/gpt2/vocab.bpe", &g_vocab_bpe},
    {"--dtype", NULL, "W", "token width: auto (uint16 if every id < 65536), uint16 or uint32; default auto",
     &g_dtype},
    {"--quiet", "-q", NULL, "no progress or summary output", &g_quiet},
    {NULL, NULL, NULL, NULL, NULL},
};

static void tokenize_usage(FILE *f, const char *prog) {
    fprintf(f,
            "usage: %s [options] INPUT -o OUTDIR\n\n"
            "Tokenizes the UTF-8 text file INPUT and writes llm.c token files (256-int32 header: magic\n"
            "20240520, version 1 = uint16 / 2 = uint32 tokens, count; then the tokens) as nanoGPT does:\n"
            "OUTDIR/train.bin holds the first 1-F of the tokens, OUTDIR/val.bin the last F, and\n"
            "OUTDIR/tokenizer.json describes the tokenizer for training and sampling.\n\noptions:\n",
            prog);
    cli_print_flags(f, k_tokenize_flags);
    fprintf(f, "  %-28s %s\n", "-h, --help", "show this help");
}

int cli_mkdirs(const char *path) {
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return ENAMETOOLONG;
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) return errno;
            *p = c;
            if (c == 0) break;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0) return errno;
    return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
}

static bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* Where to end a chunk that starts at `from`, near from + want. For GPT-2 the cut must fall on a
 * pre-token boundary that the regex finds whatever follows: after a lone "\n" between two ASCII
 * non-space characters ("x\nY"), because there the newline is a pre-token of its own both in the
 * whole text and at the end of the chunk. For char, any character boundary. */
static size_t chunk_end(const char *t, size_t len, size_t from, size_t want, bool gpt2) {
    if (len - from <= want + want / 2) return len;
    for (size_t p = from + want; p + 1 < len; p++) {
        if (gpt2) {
            if (p >= 2 && t[p - 1] == '\n' && (unsigned char)t[p - 2] < 0x80 && !is_ascii_space(t[p - 2]) &&
                (unsigned char)t[p] < 0x80 && !is_ascii_space(t[p]))
                return p;
        } else if (((unsigned char)t[p] & 0xC0) != 0x80) {
            return p;
        }
    }
    return len;
}

static int fail(const char *prog, const char *what) {
    fprintf(stderr, "%s: %s: %s\n", prog, what, cm_last_error());
    return 1;
}

static int cmd_data_tokenize(const char *prog, int argc, char **argv) {
    const char *pos[1] = {NULL};
    int n_pos;
    int rc = cli_parse_flags(prog, k_tokenize_flags, argc, argv, pos, 1, &n_pos, tokenize_usage);
    if (rc) return rc < 0 ? 0 : rc;
    static const char *const tok_names[] = {"gpt2", "char"};
    static const char *const dtypes[] = {"auto", "uint16", "uint32"};
    bool gpt2 = strcmp(g_tok_name, "gpt2") == 0;
    if (!gpt2 && strcmp(g_tok_name, "char") != 0) {
        fprintf(stderr, "%s: unknown tokenizer '%s' (use gpt2 or char)", prog, g_tok_name);
        cli_print_suggestion(g_tok_name, tok_names, 2);
        return EXIT_USAGE;
    }
    cm_token_width width = CM_TOKEN_WIDTH_AUTO;
    if (strcmp(g_dtype, "uint16") == 0) width = CM_TOKEN_WIDTH_U16;
    else if (strcmp(g_dtype, "uint32") == 0) width = CM_TOKEN_WIDTH_U32;
    else if (strcmp(g_dtype, "auto") != 0) {
        fprintf(stderr, "%s: unknown --dtype '%s' (use auto, uint16 or uint32)", prog, g_dtype);
        cli_print_suggestion(g_dtype, dtypes, 3);
        return EXIT_USAGE;
    }
    char *end;
    errno = 0;
    double frac = strtod(g_val_frac, &end);
    if (errno || end == g_val_frac || *end || !(frac >= 0 && frac < 1)) {
        fprintf(stderr, "%s: --val-fraction '%s' must be a number with 0 <= F < 1 (e.g. 0.1)\n", prog, g_val_frac);
        return EXIT_USAGE;
    }
    if (n_pos == 0) {
        fprintf(stderr, "%s: missing INPUT (the text file to tokenize); see '%s --help'\n", prog, prog);
        return EXIT_USAGE;
    }
    if (!g_outdir) {
        fprintf(stderr, "%s: missing -o OUTDIR (where train.bin and val.bin go); see '%s --help'\n", prog, prog);
        return EXIT_USAGE;
    }
    const char *input = pos[0];
    bool quiet = g_quiet != NULL;

    /* read the input */
    FILE *f = fopen(input, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open INPUT '%s': %s\n", prog, input, strerror(errno));
        return 1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "%s: INPUT '%s' is not a regular file\n", prog, input);
        fclose(f);
        return 1;
    }
    size_t len = (size_t)st.st_size;
    char *text = malloc(len + 1);
    if (!text || fread(text, 1, len, f) != len) {
        fprintf(stderr, "%s: cannot read INPUT '%s': %s\n", prog, input, text ? strerror(errno) : "out of memory");
        free(text);
        fclose(f);
        return 1;
    }
    fclose(f);
    if (len == 0) {
        fprintf(stderr, "%s: INPUT '%s' is empty; there is nothing to tokenize\n", prog, input);
        free(text);
        return 1;
    }

    /* the tokenizer (absolute vocabulary paths, so tokenizer.json works from any directory) */
    cm_tokenizer *tok = NULL;
    cm_status s;
    if (gpt2) {
        char enc[PATH_MAX], bpe[PATH_MAX];
        s = cm_tokenizer_gpt2_new(realpath(g_encoder, enc) ? enc : g_encoder, realpath(g_vocab_bpe, bpe) ? bpe : g_vocab_bpe,
                                  &tok);
        if (s != CM_OK && access(g_encoder, R_OK) != 0)
            fprintf(stderr, "%s: (the GPT-2 files default to ../shared/data/gpt2/ relative to the current directory; "
                            "pass --encoder and --vocab-bpe to use others)\n",
                    prog);
    } else {
        s = cm_tokenizer_char_new_from_text(text, len, &tok);
    }
    if (s != CM_OK) {
        free(text);
        return fail(prog, gpt2 ? "loading the GPT-2 tokenizer" : "building the character vocabulary");
    }

    /* encode in chunks, with a progress line on a terminal */
    int32_t *ids = NULL;
    int64_t n = 0, cap = 0;
    double t0 = cm_clock_s();
    bool tty = !quiet && isatty(STDERR_FILENO);
    for (size_t from = 0; from < len;) {
        size_t to = chunk_end(text, len, from, (size_t)1 << 22, gpt2);
        int32_t *part;
        int64_t np;
        if ((s = cm_tokenizer_encode(tok, text + from, to - from, &part, &np)) != CM_OK) {
            cm_set_error(s, "INPUT '%s' near byte %zu: %s", input, from, cm_last_error());
            free(ids);
            free(text);
            cm_tokenizer_free(tok);
            return fail(prog, "tokenizing");
        }
        if (n + np > cap) {
            cap = (n + np) * 2;
            int32_t *grown = realloc(ids, (size_t)cap * sizeof(int32_t));
            if (!grown) {
                fprintf(stderr, "%s: out of memory holding %lld tokens\n", prog, (long long)(n + np));
                cm_free(part);
                free(ids);
                free(text);
                cm_tokenizer_free(tok);
                return 1;
            }
            ids = grown;
        }
        memcpy(ids + n, part, (size_t)np * sizeof(int32_t));
        n += np;
        cm_free(part);
        from = to;
        if (tty)
            fprintf(stderr, "\rtokenizing %s: %5.1f%% (%.1f of %.1f MB, %lld tokens)", input, 100.0 * (double)from / (double)len,
                    (double)from / 1e6, (double)len / 1e6, (long long)n);
    }
    if (tty) fprintf(stderr, "\n");
    double secs = cm_clock_s() - t0;
    free(text);

    /* write train.bin, val.bin, tokenizer.json */
    int64_t n_train = (int64_t)((double)n * (1.0 - frac));
    if (n_train > n) n_train = n;
    char path[PATH_MAX];
    int err = cli_mkdirs(g_outdir);
    rc = 0;
    if (err) {
        fprintf(stderr, "%s: cannot create OUTDIR '%s': %s\n", prog, g_outdir, strerror(err));
        rc = 1;
    }
    if (!rc) {
        snprintf(path, sizeof path, "%s/train.bin", g_outdir);
        if (cm_token_file_write(path, ids, n_train, width) != CM_OK) rc = fail(prog, "writing train.bin");
    }
    if (!rc) {
        snprintf(path, sizeof path, "%s/val.bin", g_outdir);
        if (cm_token_file_write(path, ids + n_train, n - n_train, width) != CM_OK) rc = fail(prog, "writing val.bin");
    }
    if (!rc) {
        snprintf(path, sizeof path, "%s/tokenizer.json", g_outdir);
        if (cm_tokenizer_save(tok, path) != CM_OK) rc = fail(prog, "writing tokenizer.json");
    }
    if (!rc && !quiet) {
        int32_t max_id = 0;
        for (int64_t i = 0; i < n; i++)
            if (ids[i] > max_id) max_id = ids[i];
        bool u16 = width == CM_TOKEN_WIDTH_U16 || (width == CM_TOKEN_WIDTH_AUTO && max_id < 65536);
        printf("%s: %zu bytes -> %lld %s tokens in %.2f s (vocab %lld)\n", input, len, (long long)n,
               cm_tokenizer_type_name(tok), secs, (long long)cm_tokenizer_vocab_size(tok));
        printf("wrote %s/train.bin (%lld tokens), %s/val.bin (%lld tokens) as %s, and %s/tokenizer.json\n", g_outdir,
               (long long)n_train, g_outdir, (long long)(n - n_train), u16 ? "uint16" : "uint32", g_outdir);
    }
    free(ids);
    cm_tokenizer_free(tok);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * composer ckpt inspect | verify | export  (composer/checkpoint.h)
 * ------------------------------------------------------------------------------------------- */

static const char *g_ckpt_out, *g_ckpt_hf;
static const cli_flag k_ckpt_flags[] = {{NULL, NULL, NULL, NULL, NULL}};
static const cli_flag k_ckpt_export_flags[] = {
    {"--output", "-o", "FILE", "where to write model.safetensors (atomically); with --hf, the folder", &g_ckpt_out},
    {"--hf", NULL, NULL, "write a Hugging Face pretrained folder: config.json, model.safetensors, tokenizer files",
     &g_ckpt_hf},
    {NULL, NULL, NULL, NULL, NULL},
};

static void ckpt_inspect_usage(FILE *f, const char *prog) {
    fprintf(f, "usage: %s PATH\n\nPrints a checkpoint's manifest summary: format, library, run, step, config digest,\n"
               "the algorithms it was trained with (model surgery that loading it re-applies marked 'required\n"
               "on load', with its arguments), the callbacks whose state it carries, files, tensors with\n"
               "dtype, shape and bytes. PATH is a checkpoint directory, or a save folder\n"
               "(its latest pointer is followed). Checks the structure, not the tensor checksums (see verify).\n"
               "PATH may also be a weights file (a run folder's model.safetensors, an export): its tensors,\n"
               "metadata and the model surgery it records (which eval and generate re-apply).\n",
            prog);
}
static void ckpt_verify_usage(FILE *f, const char *prog) {
    fprintf(f, "usage: %s PATH\n\nChecks a checkpoint: the manifest's checksum and version, every file's size and\n"
               "structure, every tensor's XXH3. Exit status 0 when it is complete and intact, 1 otherwise.\n",
            prog);
}
static void ckpt_export_usage(FILE *f, const char *prog) {
    fprintf(f, "usage: %s PATH -o model.safetensors\n       %s --hf PATH -o DIR\n\nVerifies the checkpoint's model "
               "tensors and writes its\nmodel.safetensors (Hugging Face names; any safetensors reader loads it).\n"
               "With --hf (a run of model: {name: hf}), writes the pretrained folder DIR instead: config.json,\n"
               "model.safetensors and the tokenizer files, which transformers' from_pretrained(DIR) and\n"
               "model: {name: hf, pretrained_model_name_or_path: DIR} load.\n\noptions:\n",
            prog, prog);
    cli_print_flags(f, k_ckpt_export_flags);
}

/* Whether `path` is a safetensors file (a regular file whose header starts at byte 8), not a
 * checkpoint folder or a pointer file. */
static bool is_weights_file(const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < 10) return false;
    FILE *f = fopen(path, "rb");
    unsigned char h[9];
    const bool ok = f && fread(h, 1, sizeof h, f) == sizeof h && h[8] == '{';
    if (f) fclose(f);
    return ok;
}

/* Parses PATH (and flags) and opens the checkpoint; returns 0 or an exit status. With `weights`,
 * a weights file as PATH is not opened: *weights gets its path and *ck NULL. */
static int ckpt_open_or(const char *prog, const cli_flag *flags, void (*usage)(FILE *, const char *), int argc,
                        char **argv, cm_checkpoint **ck, const char **weights) {
    const char *pos[1] = {NULL};
    int n_pos;
    int rc = cli_parse_flags(prog, flags, argc, argv, pos, 1, &n_pos, usage);
    if (rc) return rc < 0 ? -1 : rc;
    if (n_pos != 1) {
        fprintf(stderr, "%s: expected one checkpoint PATH (see '%s --help')\n", prog, prog);
        return EXIT_USAGE;
    }
    *ck = NULL;
    if (weights && is_weights_file(pos[0])) {
        *weights = pos[0];
        return 0;
    }
    if (cm_checkpoint_open(pos[0], ck) != CM_OK) return fail(prog, pos[0]);
    return 0;
}
static int ckpt_open(const char *prog, const cli_flag *flags, void (*usage)(FILE *, const char *), int argc, char **argv,
                     cm_checkpoint **ck) {
    return ckpt_open_or(prog, flags, usage, argc, argv, ck, NULL);
}

static int cmd_ckpt_inspect(const char *prog, int argc, char **argv) {
    cm_checkpoint *ck;
    const char *weights = NULL;
    int rc = ckpt_open_or(prog, k_ckpt_flags, ckpt_inspect_usage, argc, argv, &ck, &weights);
    if (rc) return rc < 0 ? 0 : rc;
    if (weights) {
        char *text;
        if (cm_weights_summary(weights, &text) != CM_OK) return fail(prog, weights);
        fputs(text, stdout);
        cm_free(text);
        return 0;
    }
    size_t n = cm_checkpoint_summary(ck, NULL, 0);
    char *buf = malloc(n + 1);
    if (!buf) {
        cm_checkpoint_close(ck);
        fprintf(stderr, "%s: out of memory\n", prog);
        return 1;
    }
    cm_checkpoint_summary(ck, buf, n + 1);
    fputs(buf, stdout);
    free(buf);
    cm_checkpoint_close(ck);
    return 0;
}

static int cmd_ckpt_verify(const char *prog, int argc, char **argv) {
    cm_checkpoint *ck;
    int rc = ckpt_open(prog, k_ckpt_flags, ckpt_verify_usage, argc, argv, &ck);
    if (rc) return rc < 0 ? 0 : rc;
    if (cm_checkpoint_verify(ck) != CM_OK) {
        cm_checkpoint_close(ck);
        return fail(prog, "verify");
    }
    printf("ok: %s: %zu tensors, checksums match\n", cm_checkpoint_path(ck), cm_checkpoint_n_tensors(ck));
    cm_checkpoint_close(ck);
    return 0;
}

static int cmd_ckpt_export(const char *prog, int argc, char **argv) {
    cm_checkpoint *ck;
    g_ckpt_out = g_ckpt_hf = NULL;
    /* --hf: the folder export reads the checkpoint itself */
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--hf")) {
            const char *pos[1] = {NULL};
            int n_pos;
            int r2 = cli_parse_flags(prog, k_ckpt_export_flags, argc, argv, pos, 1, &n_pos, ckpt_export_usage);
            if (r2) return r2 < 0 ? 0 : r2;
            if (n_pos != 1 || !g_ckpt_out) {
                fprintf(stderr, "%s: expected --hf PATH -o DIR (see '%s --help')\n", prog, prog);
                return EXIT_USAGE;
            }
            if (cm_hf_export_checkpoint(pos[0], g_ckpt_out) != CM_OK) return fail(prog, "export --hf");
            printf("wrote %s: config.json, model.safetensors and the tokenizer files\n", g_ckpt_out);
            return 0;
        }
    int rc = ckpt_open(prog, k_ckpt_export_flags, ckpt_export_usage, argc, argv, &ck);
    if (rc) return rc < 0 ? 0 : rc;
    if (!g_ckpt_out) {
        cm_checkpoint_close(ck);
        fprintf(stderr, "%s: missing -o FILE (where to write model.safetensors)\n", prog);
        return EXIT_USAGE;
    }
    rc = cm_checkpoint_export_model(ck, g_ckpt_out) == CM_OK ? 0 : fail(prog, "export");
    if (!rc) printf("wrote %s\n", g_ckpt_out);
    cm_checkpoint_close(ck);
    return rc;
}

static const cli_cmd k_ckpt_cmds[] = {
    {"inspect", cmd_ckpt_inspect, "summarize a checkpoint (step, algorithms, tensors, sizes)", NULL},
    {"verify", cmd_ckpt_verify, "check a checkpoint's checksums and files", NULL},
    {"export", cmd_ckpt_export, "write a checkpoint's model.safetensors (-o FILE), or with --hf a pretrained folder", NULL},
    {NULL, NULL, NULL, NULL},
};

/* ---------------------------------------------------------------------------------------------
 * Top level
 * ------------------------------------------------------------------------------------------- */

static const cli_cmd k_data_cmds[] = {
    {"tokenize", cmd_data_tokenize, "tokenize a text file into llm.c train.bin/val.bin token files", NULL},
    {"convert", cmd_data_convert, "convert a dataset to MosaicML Streaming's MDS shards (--to mds)", NULL},
    {NULL, NULL, NULL, NULL},
};

static const cli_cmd k_recipe_cmds[] = {
    {"compare", cmd_recipe_compare, "time to a target quality for a baseline and recipes over seeds, and the speed-up",
     NULL},
    {NULL, NULL, NULL, NULL},
};

static const cli_cmd k_commands[] = {
    {"train", cmd_train, "train a model from a YAML config (composer train CONFIG.yaml key=value ...)", NULL},
    {"eval", cmd_eval, "evaluate saved weights on a config's eval set", NULL},
    {"generate", cmd_generate, "sample text from a trained GPT", NULL},
    {"data", NULL, "prepare datasets (tokenize, convert)", k_data_cmds},
    {"ckpt", NULL, "inspect, verify and export checkpoints", k_ckpt_cmds},
    {"recipe", NULL, "compare speed-up recipes by time to a target quality (compare)", k_recipe_cmds},
    {NULL, NULL, NULL, NULL},
};

static bool is_top_command(const char *name) {
    for (const cli_cmd *c = k_commands; c->name; c++)
        if (!strcmp(c->name, name)) return true;
    return false;
}

int main(int argc, char **argv) {
    /* the launcher (tools/launch.c): composer -n N ..., and what it starts on each rank */
    if (argc >= 2 && (!strcmp(argv[1], "-n") || !strcmp(argv[1], "--nproc") || !strncmp(argv[1], "--world_size", 12)))
        return cm_cli_launch(argc, argv, is_top_command);
    if (argc >= 2 && !strcmp(argv[1], "--rank-exec")) return cm_cli_rank_exec(argc - 1, argv + 1);
    if (argc >= 2 && (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-V") == 0)) {
        printf("composer %s\n", cm_version());
        return 0;
    }
    if (argc >= 2 && argv[1][0] == '-' && strcmp(argv[1], "--help") != 0 && strcmp(argv[1], "-h") != 0) {
        static const char *const top_flags[] = {"--help", "--version"};
        fprintf(stderr, "composer: unknown flag '%s'", argv[1]);
        cli_print_suggestion(argv[1], top_flags, 2);
        return EXIT_USAGE;
    }
    int rc = dispatch("composer", k_commands, argc - 1, argv + 1);
    fflush(stdout);
    return rc;
}
