/* libFuzzer target: the GLUE/SST-2 TSV parser (header, rows, labels, CRLF, blank lines) and the
 * WordPiece tokenisation of every accepted sentence, through cm_dataset_sst2_new_from_memory, then
 * a read of the first and last samples. The vocabulary is a small one written at start-up, so the
 * target needs no shared data. */
#include <composer/data.h>
#include <composer/tokenizer.h>

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static cm_tokenizer *g_tok;

static cm_tokenizer *tokenizer(void) {
    if (g_tok) return g_tok;
    static const char *const vocab[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "movie", "good",
                                        "bad", "not", "##s", "##ing", "film", ",", ".", "!", "'", "e", "##e",
                                        "s", "t", "##t", "un", "##able"};
    char path[64];
    snprintf(path, sizeof path, "/tmp/cm_fuzz_vocab_%d.txt", (int)getpid());
    FILE *f = fopen(path, "w");
    if (!f) abort();
    for (size_t i = 0; i < sizeof vocab / sizeof vocab[0]; i++) fprintf(f, "%s\n", vocab[i]);
    fclose(f);
    if (cm_tokenizer_wordpiece_new(path, true, &g_tok) != CM_OK) abort();
    unlink(path);
    return g_tok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cm_dataset *ds;
    if (cm_dataset_sst2_new_from_memory((const char *)data, size, "fuzz.tsv", tokenizer(), 16, &ds) != CM_OK)
        return 0;
    int64_t n = cm_dataset_len(ds);
    int32_t ids[16], mask[16], types[16];
    int64_t label;
    void *out[4] = {ids, mask, types, &label};
    if (n > 0) {
        if (cm_dataset_get(ds, 0, NULL, out) != CM_OK) abort();
        if (cm_dataset_get(ds, n - 1, NULL, out) != CM_OK) abort();
    }
    cm_dataset_free(ds);
    return 0;
}
