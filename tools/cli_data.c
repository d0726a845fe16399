/* composer data convert --to mds: datasets as MosaicML Streaming's MDS shards (streaming.h), in
 * the layouts Streaming's and llm-foundry's own conversion scripts write, so that
 * `dataset: {type: streaming, ...}` (and Python's StreamingDataset) read them:
 *
 *   tokens   an llm.c token file: sample i is the window of seq_len + 1 tokens the token dataset
 *            gives as sample i ("tokens" ndarray:int32; max_seq_len = seq_len gives the same
 *            input_ids and labels)
 *   mnist    "x" pil (mode L, 28 x 28), "y" int        (Streaming's vision layout)
 *   cifar10  "x" pil (mode RGB, 32 x 32), "y" int
 *   tsv      GLUE SST-2 ("sentence<TAB>label", or "index<TAB>sentence" for test): "sentence" str,
 *            "label" int (-1 without labels), "idx" int for the test layout; with --tokenizer also
 *            "input_ids", "attention_mask", "token_type_ids" ndarray:int32:<max_len> as the sst2
 *            dataset tokenises them
 *
 * OUT is a local folder or an object store URI (s3://, gs://, oci://, file://): the shards are
 * written to a temporary folder first and uploaded with index.json last, so a reader never sees
 * a partial dataset. */
#include "cli.h"

#include <composer/datasets.h>
#include <composer/storage.h>
#include <composer/streaming.h>
#include <composer/tokenizer.h>

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *g_to, *g_from = "auto", *g_out, *g_split = "train", *g_seq_len = "1024", *g_tokenizer,
                  *g_max_len = "128", *g_compression, *g_hashes, *g_size_limit = "64mb", *g_limit, *g_exist_ok, *g_quiet;

static const cli_flag k_convert_flags[] = {
    {"--to", NULL, "FORMAT", "the output format: mds (MosaicML Streaming's shards); required", &g_to},
    {"--from", NULL, "KIND", "tokens, mnist, cifar10 or tsv; default auto (from INPUT)", &g_from},
    {"--output", "-o", "OUT", "a folder, or s3://, gs://, oci://, file:// (uploaded, index.json last)", &g_out},
    {"--split", NULL, "SPLIT", "mnist, cifar10: train or test; default train", &g_split},
    {"--seq-len", NULL, "T", "tokens: tokens a sample trains on (T + 1 are stored); default 1024", &g_seq_len},
    {"--tokenizer", NULL, "PATH", "tsv: also tokenize the sentences (vocab.txt: uncased WordPiece; tokenizer.json)",
     &g_tokenizer},
    {"--max-len", NULL, "L", "tsv with --tokenizer: tokens a sample, [CLS] and [SEP] included; default 128", &g_max_len},
    {"--compression", NULL, "ALGO", "zstd, gz, bz2, snappy or br, optionally :level; default none", &g_compression},
    {"--hashes", NULL, "LIST", "hashes recorded for every shard, e.g. sha1,xxh64; default none", &g_hashes},
    {"--size-limit", NULL, "BYTES", "start a new shard before this size (64mb, 500kb, 1048576); default 64mb",
     &g_size_limit},
    {"--limit", NULL, "N", "convert only the first N samples", &g_limit},
    {"--exist-ok", NULL, NULL, "replace the files of a non-empty local OUT", &g_exist_ok},
    {"--quiet", "-q", NULL, "no summary", &g_quiet},
    {NULL, NULL, NULL, NULL, NULL},
};

static void convert_usage(FILE *f, const char *prog) {
    fprintf(f,
            "usage: %s --to mds [options] INPUT -o OUT\n\n"
            "Converts a dataset to MosaicML Streaming's MDS shards (index.json + shard.NNNNN.mds), readable by\n"
            "`dataset: {type: streaming, remote: OUT, ...}` and by Python's StreamingDataset. INPUT is\n"
            "  an llm.c token file (train.bin)       -> \"tokens\" ndarray:int32, windows of T+1 tokens\n"
            "  an MNIST folder (IDX files)           -> \"x\" pil (L, 28x28), \"y\" int\n"
            "  a CIFAR-10 folder (binary version)    -> \"x\" pil (RGB, 32x32), \"y\" int\n"
            "  a GLUE SST-2 .tsv file                -> \"sentence\" str, \"label\" int (+ token ids with --tokenizer)\n\n"
            "options:\n",
            prog);
    cli_print_flags(f, k_convert_flags);
    fprintf(f, "  %-28s %s\n", "-h, --help", "show this help");
}

static int fail(const char *prog, const char *what) {
    fprintf(stderr, "%s: %s: %s\n", prog, what, cm_last_error());
    return 1;
}

static bool parse_i64(const char *t, int64_t lo, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(t, &end, 10);
    if (errno || end == t || *end || v < lo) return false;
    *out = v;
    return true;
}

/* Bytes as Streaming's bytes_to_int reads them: 123, "10b", "64kb", "1.5mb", "2gb" (base 1024). */
static bool parse_bytes(const char *t, int64_t *out) {
    char *end;
    double v = strtod(t, &end);
    if (end == t || v < 0) return false;
    double m = 1;
    if (!strcasecmp(end, "kb")) m = 1024.0;
    else if (!strcasecmp(end, "mb")) m = 1024.0 * 1024;
    else if (!strcasecmp(end, "gb")) m = 1024.0 * 1024 * 1024;
    else if (*end && strcasecmp(end, "b")) return false;
    *out = (int64_t)(v * m);
    return true;
}

static bool file_exists(const char *dir, const char *name) {
    char p[PATH_MAX];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0;
}

/* The kind of INPUT: a folder of MNIST or CIFAR-10 files, a .tsv, or a token file. */
static const char *detect(const char *input) {
    struct stat st;
    if (stat(input, &st) != 0) return NULL;
    if (S_ISDIR(st.st_mode)) {
        static const char *const mnist[] = {"train-images-idx3-ubyte", "train-images-idx3-ubyte.gz",
                                            "t10k-images-idx3-ubyte", "t10k-images-idx3-ubyte.gz"};
        for (int i = 0; i < 4; i++)
            if (file_exists(input, mnist[i])) return "mnist";
        if (file_exists(input, "data_batch_1.bin") || file_exists(input, "test_batch.bin") ||
            file_exists(input, "cifar-10-batches-bin"))
            return "cifar10";
        return NULL;
    }
    size_t n = strlen(input);
    if (n > 4 && !strcmp(input + n - 4, ".tsv")) return "tsv";
    FILE *f = fopen(input, "rb");
    int32_t magic = 0;
    bool tok = f && fread(&magic, 4, 1, f) == 1 && magic == CM_TOKEN_FILE_MAGIC;
    if (f) fclose(f);
    return tok ? "tokens" : NULL;
}

/* ---- sources: each writes its samples into an open writer ---------------------------------- */

typedef struct conv {
    cm_mds_writer *w;
    int64_t limit; /* samples at most (INT64_MAX: all) */
    int64_t n;
} conv;

static cm_status from_tokens(const char *input, int64_t T, conv *cv) {
    cm_tokens_config tc = cm_tokens_config_default();
    tc.seq_len = T;
    cm_dataset *ds;
    cm_status st = cm_dataset_tokens_new(input, &tc, &ds);
    if (st) return st;
    int32_t *win = malloc(sizeof(int32_t) * (size_t)(2 * T));
    if (!win) {
        cm_dataset_free(ds);
        return CM_ERR_OOM;
    }
    for (int64_t i = 0; i < cm_dataset_len(ds) && cv->n < cv->limit && !st; i++) {
        void *out[2] = {win, win + T}; /* input_ids, then labels: the window is input_ids + the last label */
        if ((st = cm_dataset_get(ds, i, NULL, out))) break;
        win[T] = win[2 * T - 1];
        cm_mds_value v = {.data = win, .size = sizeof(int32_t) * (size_t)(T + 1), .dtype = CM_MDS_DT_I32, .ndim = 1,
                          .shape = {T + 1}};
        if (!(st = cm_mds_writer_write(cv->w, &v))) cv->n++;
    }
    free(win);
    cm_dataset_free(ds);
    return st;
}

static cm_status from_images(const char *input, bool mnist, cm_data_split split, conv *cv) {
    cm_dataset *ds;
    cm_status st;
    if (mnist) {
        cm_mnist_config mc = cm_mnist_config_default();
        mc.raw_u8 = true;
        st = cm_dataset_mnist_new(input, split, &mc, &ds);
    } else {
        cm_cifar10_config cc = cm_cifar10_config_default();
        cc.raw_u8 = true;
        st = cm_dataset_cifar10_new(input, split, &cc, &ds);
    }
    if (st) return st;
    const cm_field_desc *d = cm_dataset_field(ds, 0); /* "image" u8 (C, H, W) */
    const int64_t C = d->shape[0], H = d->shape[1], W = d->shape[2];
    uint8_t chw[3 * 32 * 32], hwc[3 * 32 * 32];
    for (int64_t i = 0; i < cm_dataset_len(ds) && cv->n < cv->limit && !st; i++) {
        int64_t y;
        void *out[2] = {chw, &y};
        if ((st = cm_dataset_get(ds, i, NULL, out))) break;
        for (int64_t c = 0; c < C; c++) /* PIL's tobytes(): rows of interleaved channels */
            for (int64_t p = 0; p < H * W; p++) hwc[p * C + c] = chw[c * H * W + p];
        cm_mds_value v[2] = {{.data = hwc, .size = (size_t)(C * H * W), .ndim = 2, .shape = {H, W}, .mode = C == 1 ? "L" : "RGB"},
                             {.data = &y, .size = 8}};
        if (!(st = cm_mds_writer_write(cv->w, v))) cv->n++;
    }
    cm_dataset_free(ds);
    return st;
}

/* Reads a whole file into a new NUL-terminated buffer. */
static char *read_text(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return cm_set_error(CM_ERR_IO, "cannot open '%s': %s", path, strerror(errno)), NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *t = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!t || fread(t, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(t);
        return cm_set_error(CM_ERR_IO, "cannot read '%s'", path), NULL;
    }
    fclose(f);
    t[n] = 0;
    *len = (size_t)n;
    return t;
}

/* GLUE SST-2: the same lines the sst2 dataset reads (header, CRLF, blank lines skipped; the
 * sentence before the last tab of a labelled line, after the first tab of a test line). With a
 * tokenizer, the sst2 dataset's fields of the same sample go in too. */
static cm_status from_tsv(const char *input, const char *tok_path, int64_t max_len, conv *cv) {
    size_t len;
    char *text = read_text(input, &len);
    if (!text) return cm_last_status();
    cm_tokenizer *tok = NULL;
    cm_dataset *ds = NULL;
    cm_status st = CM_OK;
    if (tok_path) {
        size_t n = strlen(tok_path);
        st = n > 5 && !strcmp(tok_path + n - 5, ".json") ? cm_tokenizer_load(tok_path, &tok)
                                                         : cm_tokenizer_wordpiece_new(tok_path, true, &tok);
        if (!st) st = cm_dataset_sst2_new(input, tok, max_len, &ds);
    }
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(3 * max_len));
    if (!ids) st = CM_ERR_OOM;
    bool labelled = true;
    long line = 0;
    int64_t row = 0;
    for (size_t i = 0; i < len && !st && cv->n < cv->limit;) {
        char *s = text + i, *nl = memchr(s, '\n', len - i);
        size_t n = nl ? (size_t)(nl - s) : len - i;
        i += n + 1;
        line++;
        if (n > 0 && s[n - 1] == '\r') n--;
        if (line == 1) {
            if (n == 14 && !memcmp(s, "sentence\tlabel", 14)) labelled = true;
            else if (n == 14 && !memcmp(s, "index\tsentence", 14)) labelled = false;
            else
                st = cm_set_error(CM_ERR_FORMAT, "'%s' line 1: header \"%.*s\" is not \"sentence<TAB>label\" or "
                                                 "\"index<TAB>sentence\" (GLUE SST-2)", input, (int)(n < 60 ? n : 60), s);
            continue;
        }
        if (n == 0) continue;
        int64_t label = -1, idx = 0;
        const char *sent;
        size_t sent_n;
        char *tab = NULL;
        if (labelled) {
            for (size_t k = n; k-- > 0 && !tab;)
                if (s[k] == '\t') tab = s + k;
            char *end = NULL;
            if (tab) label = strtoll(tab + 1, &end, 10);
            if (!tab || end != s + n || end == tab + 1) {
                st = cm_set_error(CM_ERR_FORMAT, "'%s' line %ld: expected \"sentence<TAB>label\" with an integer label",
                                  input, line);
                break;
            }
            sent = s, sent_n = (size_t)(tab - s);
        } else {
            tab = memchr(s, '\t', n);
            char *end = NULL;
            if (tab) idx = strtoll(s, &end, 10);
            if (!tab || end != tab || end == s) {
                st = cm_set_error(CM_ERR_FORMAT, "'%s' line %ld: expected \"index<TAB>sentence\" with a numeric index",
                                  input, line);
                break;
            }
            sent = tab + 1, sent_n = n - (size_t)(sent - s);
        }
        cm_mds_value v[6];
        int nv = 0;
        if (ds) {
            int64_t dl;
            void *out[4] = {ids, ids + max_len, ids + 2 * max_len, &dl};
            if ((st = cm_dataset_get(ds, row, NULL, out))) break;
            if (dl != label) {
                st = cm_set_error(CM_ERR_INTERNAL, "'%s' line %ld: label %lld, the sst2 dataset's %lld", input, line,
                                  (long long)label, (long long)dl);
                break;
            }
            for (int k = 0; k < 3; k++) /* attention_mask, input_ids, token_type_ids: see the columns */
                v[nv++] = (cm_mds_value){.data = ids + (k == 0 ? max_len : k == 1 ? 0 : 2 * max_len),
                                         .size = sizeof(int32_t) * (size_t)max_len, .dtype = CM_MDS_DT_I32, .ndim = 1,
                                         .shape = {max_len}};
        }
        if (!labelled) v[nv++] = (cm_mds_value){.data = &idx, .size = 8};
        v[nv++] = (cm_mds_value){.data = &label, .size = 8};
        v[nv++] = (cm_mds_value){.data = sent, .size = sent_n};
        if ((st = cm_mds_writer_write(cv->w, v))) break;
        cv->n++;
        row++;
    }
    free(ids);
    free(text);
    cm_dataset_free(ds);
    cm_tokenizer_free(tok);
    return st;
}

/* ---- output ------------------------------------------------------------------------------- */

/* Uploads the files of `dir` to `uri`, index.json last (a reader sees the dataset only whole). */
static cm_status upload_dir(const char *dir, const char *uri) {
    cm_object_store *st;
    cm_status s = cm_object_store_open(uri, NULL, &st);
    if (s) return s;
    DIR *d = opendir(dir);
    if (!d) s = cm_set_error(CM_ERR_IO, "cannot read '%s': %s", dir, strerror(errno));
    struct dirent *e;
    while (!s && d && (e = readdir(d))) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "index.json")) continue;
        char p[PATH_MAX + 256];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        s = cm_object_store_upload(st, e->d_name, p);
    }
    if (d) closedir(d);
    if (!s) {
        char p[PATH_MAX + 16];
        snprintf(p, sizeof p, "%s/index.json", dir);
        s = cm_object_store_upload(st, "index.json", p);
    }
    cm_object_store_close(st);
    return s;
}

int cmd_data_convert(const char *prog, int argc, char **argv) {
    const char *pos[1] = {NULL};
    int n_pos;
    g_to = g_out = g_tokenizer = g_compression = g_hashes = g_limit = g_exist_ok = g_quiet = NULL;
    g_from = "auto", g_split = "train", g_seq_len = "1024", g_max_len = "128", g_size_limit = "64mb";
    int rc = cli_parse_flags(prog, k_convert_flags, argc, argv, pos, 1, &n_pos, convert_usage);
    if (rc) return rc < 0 ? 0 : rc;
    static const char *const formats[] = {"mds"}, *const kinds[] = {"tokens", "mnist", "cifar10", "tsv"},
                             *const splits[] = {"train", "test"};
    if (!g_to) {
        fprintf(stderr, "%s: missing --to FORMAT (mds); see '%s --help'\n", prog, prog);
        return EXIT_USAGE;
    }
    if (strcmp(g_to, "mds")) {
        fprintf(stderr, "%s: unknown --to '%s' (the one format is mds)", prog, g_to);
        cli_print_suggestion(g_to, formats, 1);
        return EXIT_USAGE;
    }
    if (n_pos == 0) {
        fprintf(stderr, "%s: missing INPUT (a token file, an MNIST or CIFAR-10 folder, or a .tsv); see '%s --help'\n",
                prog, prog);
        return EXIT_USAGE;
    }
    if (!g_out) {
        fprintf(stderr, "%s: missing -o OUT (a folder or a bucket URI); see '%s --help'\n", prog, prog);
        return EXIT_USAGE;
    }
    const char *input = pos[0];
    const char *kind = g_from;
    if (!strcmp(kind, "auto")) {
        if (!(kind = detect(input))) {
            fprintf(stderr, "%s: cannot tell what INPUT '%s' is%s: give --from tokens, mnist, cifar10 or tsv\n", prog, input,
                    access(input, F_OK) ? " (it does not exist)" : "");
            return access(input, F_OK) ? 1 : EXIT_USAGE;
        }
    } else {
        int k = 0;
        while (k < 4 && strcmp(kinds[k], kind)) k++;
        if (k == 4) {
            fprintf(stderr, "%s: unknown --from '%s' (use tokens, mnist, cifar10 or tsv)", prog, kind);
            cli_print_suggestion(kind, kinds, 4);
            return EXIT_USAGE;
        }
    }
    int64_t seq_len, max_len, size_limit, limit = INT64_MAX;
    if (!parse_i64(g_seq_len, 1, &seq_len)) {
        fprintf(stderr, "%s: --seq-len '%s' must be an integer >= 1\n", prog, g_seq_len);
        return EXIT_USAGE;
    }
    if (!parse_i64(g_max_len, 3, &max_len)) {
        fprintf(stderr, "%s: --max-len '%s' must be an integer >= 3 ([CLS] and [SEP] and one token)\n", prog, g_max_len);
        return EXIT_USAGE;
    }
    if (!parse_bytes(g_size_limit, &size_limit)) {
        fprintf(stderr, "%s: --size-limit '%s' is not a byte size (64mb, 500kb, 1048576)\n", prog, g_size_limit);
        return EXIT_USAGE;
    }
    if (g_limit && !parse_i64(g_limit, 1, &limit)) {
        fprintf(stderr, "%s: --limit '%s' must be an integer >= 1\n", prog, g_limit);
        return EXIT_USAGE;
    }
    int split = strcmp(g_split, "train") ? (strcmp(g_split, "test") ? -1 : 1) : 0;
    if (split < 0) {
        fprintf(stderr, "%s: unknown --split '%s' (use train or test)", prog, g_split);
        cli_print_suggestion(g_split, splits, 2);
        return EXIT_USAGE;
    }
    if (g_tokenizer && strcmp(kind, "tsv")) {
        fprintf(stderr, "%s: --tokenizer is for tsv input (token files are tokenized already)\n", prog);
        return EXIT_USAGE;
    }
    char *hashes[CM_MDS_MAX_COLUMNS], hbuf[512];
    int n_hashes = 0;
    if (g_hashes) {
        snprintf(hbuf, sizeof hbuf, "%s", g_hashes);
        for (char *t = strtok(hbuf, ","); t && n_hashes < CM_MDS_MAX_COLUMNS; t = strtok(NULL, ",")) hashes[n_hashes++] = t;
        /* Streaming keeps them sorted */
        for (int a = 1; a < n_hashes; a++)
            for (int b = a; b > 0 && strcmp(hashes[b - 1], hashes[b]) > 0; b--) {
                char *t = hashes[b];
                hashes[b] = hashes[b - 1], hashes[b - 1] = t;
            }
    }

    /* a remote OUT is written to a temporary folder first */
    const bool remote = cm_storage_is_uri(g_out) && strncmp(g_out, "file://", 7);
    char dir[PATH_MAX];
    if (remote) {
        const char *t = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/composer-convert-XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(dir)) {
            fprintf(stderr, "%s: cannot make a temporary folder '%s': %s\n", prog, dir, strerror(errno));
            return 1;
        }
    } else {
        snprintf(dir, sizeof dir, "%s", strncmp(g_out, "file://", 7) ? g_out : g_out + 7);
    }
    cm_mds_column cols[6];
    int nc = 0;
    if (!strcmp(kind, "tokens")) {
        cols[nc++] = (cm_mds_column){"tokens", "ndarray:int32"};
    } else if (!strcmp(kind, "tsv")) {
        static char enc[64];
        snprintf(enc, sizeof enc, "ndarray:int32:%lld", (long long)max_len);
        if (g_tokenizer) {
            cols[nc++] = (cm_mds_column){"attention_mask", enc};
            cols[nc++] = (cm_mds_column){"input_ids", enc};
            cols[nc++] = (cm_mds_column){"token_type_ids", enc};
        }
        FILE *f = fopen(input, "rb");
        char head[16] = "";
        if (f) {
            if (!fgets(head, sizeof head, f)) head[0] = 0;
            fclose(f);
        }
        if (!strncmp(head, "index\t", 6)) cols[nc++] = (cm_mds_column){"idx", "int"};
        cols[nc++] = (cm_mds_column){"label", "int"};
        cols[nc++] = (cm_mds_column){"sentence", "str"};
    } else {
        cols[nc++] = (cm_mds_column){"x", "pil"};
        cols[nc++] = (cm_mds_column){"y", "int"};
    }
    cm_mds_writer_config wc = cm_mds_writer_config_default();
    wc.compression = g_compression;
    wc.hashes = (const char *const *)hashes;
    wc.n_hashes = n_hashes;
    wc.size_limit = size_limit;
    wc.exist_ok = g_exist_ok != NULL || remote;
    conv cv = {NULL, limit, 0};
    cm_status s = cm_mds_writer_new(dir, cols, nc, &wc, &cv.w);
    if (s) {
        rc = fail(prog, "--to mds");
    } else {
        double t0 = cm_clock_s();
        if (!strcmp(kind, "tokens")) s = from_tokens(input, seq_len, &cv);
        else if (!strcmp(kind, "tsv")) s = from_tsv(input, g_tokenizer, max_len, &cv);
        else s = from_images(input, !strcmp(kind, "mnist"), (cm_data_split)split, &cv);
        if (!s) s = cm_mds_writer_finish(cv.w);
        if (s) {
            rc = fail(prog, input);
        } else {
            int shards = cm_mds_writer_n_shards(cv.w);
            if (remote && (s = upload_dir(dir, g_out))) rc = fail(prog, "uploading");
            if (!rc && !g_quiet)
                printf("%s (%s): %lld samples -> %d MDS shards in %s (%.1f s)\n", input, kind, (long long)cv.n, shards,
                       g_out, cm_clock_s() - t0);
        }
    }
    cm_mds_writer_free(cv.w);
    if (remote) {
        char cmd[PATH_MAX + 256];
        DIR *d = opendir(dir);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2]))) continue;
            snprintf(cmd, sizeof cmd, "%s/%s", dir, e->d_name);
            unlink(cmd);
        }
        if (d) closedir(d);
        rmdir(dir);
    }
    return rc;
}
