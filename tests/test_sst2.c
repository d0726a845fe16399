/* SST-2 (GLUE TSV): fields and layout, the three shipped splits, truncation and padding, CRLF and
 * blank lines, and malformed files (errors name the file and line). */
#include "cmtest.h"

#include <composer/tokenizer.h>
#include <string.h>

static cm_tokenizer *g_tok;
static void setup(void) {
    cr_assert_eq(cm_tokenizer_wordpiece_new("../shared/data/bert/vocab.txt", true, &g_tok), CM_OK, "%s", cm_last_error());
}
static void teardown(void) { cm_tokenizer_free(g_tok); }
TestSuite(sst2, .init = setup, .fini = teardown);

typedef struct {
    int32_t ids[64], mask[64], types[64];
    int64_t label;
} sample;

static void get(const cm_dataset *ds, int64_t i, sample *s) {
    void *out[4] = {s->ids, s->mask, s->types, &s->label};
    cr_assert_eq(cm_dataset_get(ds, i, NULL, out), CM_OK, "%s", cm_last_error());
}

Test(sst2, dev_split_fields_and_first_sample) {
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_sst2_new("../shared/data/sst2/dev.tsv", g_tok, 16, &ds), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_dataset_len(ds), 872);
    static const char *names[4] = {"input_ids", "attention_mask", "token_type_ids", "label"};
    for (int f = 0; f < 4; f++) {
        const cm_field_desc *d = cm_dataset_field(ds, f);
        cr_assert_str_eq(d->name, names[f]);
        cr_assert_eq(d->dtype, f == 3 ? CM_DTYPE_I64 : CM_DTYPE_I32);
        cr_assert_eq(d->ndim, f == 3 ? 0 : 1);
        if (f < 3) cr_assert_eq(d->shape[0], 16);
    }
    cr_assert_str_eq(cm_dataset_type_name(ds), "sst2");
    /* "it 's a charming and often affecting journey . \t1" */
    sample s;
    get(ds, 0, &s);
    const char *words[] = {"it", "'", "s", "a", "charming", "and", "often", "affecting", "journey", "."};
    cr_assert_eq(s.ids[0], 101);
    for (int i = 0; i < 10; i++) {
        int32_t w = cm_tokenizer_token_id(g_tok, words[i], strlen(words[i]));
        cr_assert_eq(s.ids[1 + i], w, "input_ids[%d] = %d, want %d (\"%s\")", 1 + i, s.ids[1 + i], w, words[i]);
    }
    cr_assert_eq(s.ids[11], 102);
    for (int i = 0; i < 16; i++) {
        cr_assert_eq(s.mask[i], i < 12, "attention_mask[%d] = %d", i, s.mask[i]);
        cr_assert_eq(s.types[i], 0);
        if (i >= 12) cr_assert_eq(s.ids[i], 0, "padding input_ids[%d] = %d", i, s.ids[i]);
    }
    cr_assert_eq(s.label, 1);
    cr_assert_eq(cm_dataset_n_tokens(ds, 0), 12);
    get(ds, 1, &s); /* "unflinchingly bleak and desperate \t0" */
    cr_assert_eq(s.label, 0);
    cm_dataset_free(ds);
}

Test(sst2, train_and_unlabelled_test_splits) {
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_sst2_new("../shared/data/sst2/train.tsv", g_tok, 64, &ds), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_dataset_len(ds), 67349);
    int64_t pos = 0;
    sample s;
    for (int64_t i = 0; i < 67349; i += 97) {
        get(ds, i, &s);
        cr_assert(s.label == 0 || s.label == 1);
        pos += s.label;
    }
    cr_assert(pos > 300 && pos < 500, "%lld positives in 695 samples", (long long)pos);
    cm_dataset_free(ds);
    cr_assert_eq(cm_dataset_sst2_new("../shared/data/sst2/test.tsv", g_tok, 64, &ds), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_dataset_len(ds), 1821);
    get(ds, 0, &s); /* "0\tuneasy mishmash of styles and genres ." */
    cr_assert_eq(s.label, -1);
    cr_assert_eq(s.ids[0], 101);
    cr_assert_eq(s.ids[1], cm_tokenizer_token_id(g_tok, "uneasy", 6));
    cm_dataset_free(ds);
}

Test(sst2, long_sentences_truncate_and_crlf_blank_lines_are_accepted) {
    const char *tsv = "sentence\tlabel\r\n"
                      "one two three four five six seven eight\t1\r\n"
                      "\r\n"
                      "short\t0"; /* no final newline */
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_sst2_new_from_memory(tsv, strlen(tsv), "mem.tsv", g_tok, 5, &ds), CM_OK, "%s",
                 cm_last_error());
    cr_assert_eq(cm_dataset_len(ds), 2);
    sample s;
    get(ds, 0, &s);
    int32_t one = cm_tokenizer_token_id(g_tok, "one", 3), three = cm_tokenizer_token_id(g_tok, "three", 5);
    cr_assert(s.ids[0] == 101 && s.ids[1] == one && s.ids[3] == three && s.ids[4] == 102, "truncation keeps [SEP] last");
    cr_assert(s.label == 1 && s.mask[4] == 1);
    get(ds, 1, &s);
    cr_assert(s.label == 0 && s.ids[2] == 102 && s.ids[3] == 0 && s.mask[3] == 0);
    cm_dataset_free(ds);
}

Test(sst2, malformed_files_name_file_and_line) {
    static const struct {
        const char *tsv, *msg;
    } bad[] = {
        {"", "is empty"},
        {"sentence\tlabel\n", "no samples"},
        {"text\tlabel\ngood\t1\n", "line 1"},
        {"sentence\tlabel\ngood\t1\nbad movie\n", "line 3: expected \"sentence<TAB>label\""},
        {"sentence\tlabel\ngood\t1\nbad movie\t\n", "line 3: label \"\""},
        {"sentence\tlabel\ngood\t2\n", "line 2: label \"2\" is not 0 or 1"},
        {"index\tsentence\nx\tgood\n", "line 2: expected \"index<TAB>sentence\""},
        {"sentence\tlabel\ngo\0od\t1\n", "NUL"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t len = strlen(bad[i].tsv);
        if (strstr(bad[i].msg, "NUL")) len = 23; /* the NUL is inside the data */
        cm_dataset *ds = (cm_dataset *)1;
        cm_status st = cm_dataset_sst2_new_from_memory(bad[i].tsv, len, "bad.tsv", g_tok, 8, &ds);
        cr_assert_eq(st, CM_ERR_FORMAT, "case %zu accepted", i);
        cr_assert_null(ds);
        cr_assert(strstr(cm_last_error(), bad[i].msg) && strstr(cm_last_error(), "bad.tsv"), "case %zu: %s", i,
                  cm_last_error());
    }
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_sst2_new("/nonexistent/dev.tsv", g_tok, 8, &ds), CM_ERR_IO);
    cr_assert(strstr(cm_last_error(), "/nonexistent/dev.tsv"), "%s", cm_last_error());
    cr_assert_eq(cm_dataset_sst2_new_from_memory("sentence\tlabel\na\t1\n", 18, "m", g_tok, 2, &ds), CM_ERR_INVALID_ARG);
    cm_tokenizer *chr;
    cr_assert_eq(cm_tokenizer_char_new_from_text("abc", 3, &chr), CM_OK);
    cr_assert_eq(cm_dataset_sst2_new_from_memory("sentence\tlabel\na\t1\n", 18, "m", chr, 8, &ds), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "[CLS]"), "%s", cm_last_error());
    cm_tokenizer_free(chr);
}
