/* Tokenizer throughput on tiny Shakespeare (1.1 MB): GPT-2 BPE (with its per-call pre-token cache),
 * GPT-2 decode, char, and BERT WordPiece. Best of 5 runs, single thread. Prints a table and appends
 * one dated line per result to bench/results/tokenizer.tsv.
 *
 *   build/bench/bench_tokenizer [results.tsv]     # run from the repo root (reads ../shared/data) */
#include <composer/composer.h>
#include <composer/tokenizer.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define INPUT "../shared/data/tinyshakespeare/input.txt"

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    if (!p || fread(p, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(p);
        return NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return p;
}

static FILE *g_tsv;
static char g_date[32], g_host[64];

static void report(const char *name, size_t bytes, int64_t tokens, double s) {
    printf("%-22s %8.1f ms %8.1f MB/s %10lld tokens %8.2f Mtok/s\n", name, s * 1e3, (double)bytes / s / 1e6,
           (long long)tokens, (double)tokens / s / 1e6);
    if (g_tsv)
        fprintf(g_tsv, "%s\t%s\t%s\t%zu\t%lld\t%.3f\t%.2f\n", g_date, g_host, name, bytes, (long long)tokens, s * 1e3,
                (double)bytes / s / 1e6);
}

static double bench_encode(const cm_tokenizer *tok, const char *text, size_t len, int64_t *n) {
    double best = 1e9;
    for (int r = 0; r < 5; r++) {
        int32_t *ids;
        double t0 = cm_clock_s();
        if (cm_tokenizer_encode(tok, text, len, &ids, n) != CM_OK) {
            fprintf(stderr, "encode failed: %s\n", cm_last_error());
            exit(1);
        }
        double t = cm_clock_s() - t0;
        if (t < best) best = t;
        cm_free(ids);
    }
    return best;
}

int main(int argc, char **argv) {
    size_t len;
    char *text = slurp(INPUT, &len);
    if (!text) {
        fprintf(stderr, "bench_tokenizer: cannot read %s (run from the repo root)\n", INPUT);
        return 1;
    }
    const char *tsv = argc > 1 ? argv[1] : "bench/results/tokenizer.tsv";
    struct stat st;
    bool fresh = stat(tsv, &st) != 0;
    g_tsv = fopen(tsv, "a");
    if (!g_tsv) fprintf(stderr, "bench_tokenizer: cannot append to %s (results not saved)\n", tsv);
    if (g_tsv && fresh) fprintf(g_tsv, "date\thost\tname\tbytes\ttokens\tms\tMB_per_s\n");
    time_t now = time(NULL);
    strftime(g_date, sizeof g_date, "%Y-%m-%dT%H:%M:%S", localtime(&now));
    gethostname(g_host, sizeof g_host);

    cm_tokenizer *gpt2, *chr, *bert;
    double t0 = cm_clock_s();
    if (cm_tokenizer_gpt2_new("../shared/data/gpt2/encoder.json", "../shared/data/gpt2/vocab.bpe", &gpt2) != CM_OK) {
        fprintf(stderr, "%s\n", cm_last_error());
        return 1;
    }
    double load = cm_clock_s() - t0;
    printf("tiny Shakespeare, %zu bytes; GPT-2 load %.1f ms\n", len, load * 1e3);
    int64_t n;
    double t = bench_encode(gpt2, text, len, &n);
    report("gpt2_encode", len, n, t);
    int32_t *ids;
    cm_tokenizer_encode(gpt2, text, len, &ids, &n);
    double best = 1e9;
    for (int r = 0; r < 5; r++) {
        char *out;
        size_t ol;
        double t1 = cm_clock_s();
        cm_tokenizer_decode(gpt2, ids, n, &out, &ol);
        double dt = cm_clock_s() - t1;
        if (dt < best) best = dt;
        cm_free(out);
    }
    report("gpt2_decode", len, n, best);
    cm_free(ids);
    cm_tokenizer_char_new_from_text(text, len, &chr);
    t = bench_encode(chr, text, len, &n);
    report("char_encode", len, n, t);
    if (cm_tokenizer_wordpiece_new("../shared/data/bert/vocab.txt", true, &bert) == CM_OK) {
        t = bench_encode(bert, text, len, &n);
        report("wordpiece_encode", len, n, t);
        cm_tokenizer_free(bert);
    }
    cm_tokenizer_free(gpt2);
    cm_tokenizer_free(chr);
    if (g_tsv) fclose(g_tsv);
    free(text);
    return 0;
}
