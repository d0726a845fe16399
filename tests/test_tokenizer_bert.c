/* BERT WordPiece (bert-base-uncased vocab.txt): known ids, the basic tokenizer's rules (cleaning,
 * CJK, lowercasing with accent stripping and Final_Sigma, punctuation), greedy WordPiece with
 * [UNK], pair encoding with truncation and padding, decode, save/load and bad vocabularies. */
#include "cmtest.h"

#include <composer/tokenizer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define VOCAB "../shared/data/bert/vocab.txt"

static cm_tokenizer *g_tok;

static void setup(void) { cr_assert_eq(cm_tokenizer_wordpiece_new(VOCAB, true, &g_tok), CM_OK, "%s", cm_last_error()); }
static void teardown(void) { cm_tokenizer_free(g_tok); }

TestSuite(bert, .init = setup, .fini = teardown);

/* Encodes and compares with a list of token strings looked up in the vocabulary. */
static void expect_tokens(const cm_tokenizer *tok, const char *text, size_t len, const char *const *want, int n_want) {
    int32_t *ids;
    int64_t n;
    cr_assert_eq(cm_tokenizer_encode(tok, text, len, &ids, &n), CM_OK, "%s", cm_last_error());
    bool same = n == n_want;
    for (int i = 0; same && i < n_want; i++) {
        int32_t w = cm_tokenizer_token_id(tok, want[i], strlen(want[i]));
        cr_assert_geq(w, 0, "\"%s\" is not in the vocabulary", want[i]);
        same = ids[i] == w;
    }
    char got[512] = "";
    for (int64_t i = 0; i < n; i++) {
        size_t l;
        const char *b = cm_tokenizer_token_bytes(tok, ids[i], &l);
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%.*s", i ? " | " : "", (int)l, b);
    }
    cr_assert(same, "\"%s\" gave %lld tokens [%s], expected %d starting with \"%s\"", text, (long long)n, got, n_want,
              n_want ? want[0] : "");
    cm_free(ids);
}
#define EXPECT(text, ...)                                                                \
    do {                                                                                 \
        static const char *const w_[] = {__VA_ARGS__};                                   \
        expect_tokens(g_tok, text, strlen(text), w_, (int)(sizeof w_ / sizeof w_[0]));   \
    } while (0)

static void expect_same(const char *a, const char *b) {
    int32_t *ia, *ib;
    int64_t na, nb;
    cr_assert_eq(cm_tokenizer_encode(g_tok, a, strlen(a), &ia, &na), CM_OK);
    cr_assert_eq(cm_tokenizer_encode(g_tok, b, strlen(b), &ib, &nb), CM_OK);
    bool same = na == nb && memcmp(ia, ib, (size_t)na * sizeof(int32_t)) == 0;
    cr_assert(same, "\"%s\" (%lld ids, first %d) and \"%s\" (%lld ids, first %d) should encode alike", a, (long long)na,
              na ? ia[0] : -1, b, (long long)nb, nb ? ib[0] : -1);
    cm_free(ia);
    cm_free(ib);
}

Test(bert, known_ids_and_special_tokens) {
    int32_t ids[8];
    int64_t n;
    cr_assert_eq(cm_tokenizer_encode_into(g_tok, "Hello, world!", 13, ids, 8, &n), CM_OK);
    cr_assert(n == 4 && ids[0] == 7592 && ids[1] == 1010 && ids[2] == 2088 && ids[3] == 999,
              "got %lld ids: %d %d %d %d", (long long)n, ids[0], ids[1], ids[2], ids[3]);
    cr_assert_eq(cm_tokenizer_vocab_size(g_tok), 30522);
    cr_assert_eq(cm_tokenizer_special(g_tok, CM_TOKEN_PAD), 0);
    cr_assert_eq(cm_tokenizer_special(g_tok, CM_TOKEN_UNK), 100);
    cr_assert_eq(cm_tokenizer_special(g_tok, CM_TOKEN_CLS), 101);
    cr_assert_eq(cm_tokenizer_special(g_tok, CM_TOKEN_SEP), 102);
    cr_assert_eq(cm_tokenizer_special(g_tok, CM_TOKEN_MASK), 103);
    cr_assert_eq(cm_tokenizer_special(g_tok, CM_TOKEN_EOT), -1);
}

Test(bert, wordpiece_is_greedy_longest_match_with_continuations) {
    EXPECT("tokenization", "token", "##ization");
    EXPECT("unaffable", "una", "##ffa", "##ble");
    /* a word with an unknown piece is [UNK] as a whole; so is a word over 100 characters */
    EXPECT("hello \xF0\x9D\x94\xB8x world", "hello", "[UNK]", "world");
    char longw[160];
    memset(longw, 'a', 101);
    strcpy(longw + 101, " ok");
    EXPECT(longw, "[UNK]", "ok");
    longw[100] = ' '; /* 100 characters is still a word */
    int32_t ids[64];
    int64_t n;
    cr_assert_eq(cm_tokenizer_encode_into(g_tok, longw, strlen(longw), ids, 64, &n), CM_OK);
    cr_assert(n > 2 && ids[0] != 100, "a 100-character word should be split into pieces, got %lld ids", (long long)n);
}

Test(bert, basic_tokenizer_cleans_splits_and_folds) {
    EXPECT("don't", "don", "'", "t");
    EXPECT("a\x01" "b\x7f  \t\n x", "ab", "x");   /* control characters vanish; whitespace splits */
    EXPECT("ab\xE4\xB8\xAD\xE5\x9B\xBD!", "ab", "\xE4\xB8\xAD", "\xE5\x9B\xBD", "!"); /* ab中国! : CJK one per word */
    EXPECT("Caf\xC3\xA9", "cafe");                   /* lower + strip accents */
    expect_same("Cr\xC3\xA8me BR\xC3\x9BL\xC3\x89" "E", "creme brulee");
    expect_same("cafe\xCC\x81", "cafe");              /* combining accent (Mn) dropped */
    expect_same("\xC4\xB0stanbul", "istanbul");       /* İ lowercases to i + U+0307 */
    expect_same("\xCE\x9F\xCE\x94\xCE\x9F\xCE\xA3", "\xCE\xBF\xCE\xB4\xCE\xBF\xCF\x82");   /* ΟΔΟΣ -> οδος (final ς) */
    expect_same("\xCE\xA3\xCE\x91", "\xCF\x83\xCE\xB1");                                 /* ΣΑ -> σα */
    /* Final_Sigma uses the Cased property, which U+00AA ª has (Other_Lowercase) though it has no
     * case mapping: Python lowers "ªΣ" to "ªς" */
    EXPECT("\xC2\xAA\xCE\xA3", "\xC2\xAA", "##\xCF\x82");
    expect_same("\xED\x95\x9C", "\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB");                   /* 한 -> jamo */
    expect_same("a\xC2\xA0" "b", "a b");              /* NBSP (Zs) splits */
    expect_same("a\xE2\x80\xA8" "b", "a b");          /* U+2028 splits, like Python's str.split() */
    expect_same("ok\xFF\xFE", "ok");                  /* invalid UTF-8 = U+FFFD, removed */
    EXPECT("x\xE3\x80\x82y", "x", "\xE3\x80\x82", "y"); /* U+3002 (Po) is punctuation */
}

Test(bert, cased_pipeline_keeps_case_and_accents) {
    cm_tokenizer *cased;
    cr_assert_eq(cm_tokenizer_wordpiece_new(VOCAB, false, &cased), CM_OK);
    static const char *const w[] = {"hello", "[UNK]"};
    /* the uncased vocabulary has no capitalised "World" and no pieces with capitals */
    expect_tokens(cased, "hello World", 11, w, 2);
    cm_tokenizer_free(cased);
}

Test(bert, pair_encoding_truncates_longest_first_and_pads) {
    int32_t ids[12], types[12], mask[12];
    int64_t real;
    cr_assert_eq(cm_tokenizer_encode_pair(g_tok, "hello world", 11, "hello", 5, 12, ids, types, mask, &real), CM_OK);
    int32_t want[12] = {101, 7592, 2088, 102, 7592, 102, 0, 0, 0, 0, 0, 0};
    int32_t want_t[12] = {0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0};
    cr_assert_eq(real, 6);
    for (int i = 0; i < 12; i++) {
        cr_assert_eq(ids[i], want[i], "input_ids[%d] = %d, want %d", i, ids[i], want[i]);
        cr_assert_eq(types[i], want_t[i], "token_type_ids[%d] = %d, want %d", i, types[i], want_t[i]);
        cr_assert_eq(mask[i], i < 6, "attention_mask[%d] = %d", i, mask[i]);
    }
    /* 5 + 3 tokens into max_len 7 (4 content slots): a loses 2 (the longer), then ties drop from b */
    cr_assert_eq(cm_tokenizer_encode_pair(g_tok, "a b c d e", 9, "x y z", 5, 7, ids, NULL, NULL, &real), CM_OK);
    cr_assert_eq(real, 7);
    int32_t a = cm_tokenizer_token_id(g_tok, "a", 1), b = cm_tokenizer_token_id(g_tok, "b", 1);
    int32_t x = cm_tokenizer_token_id(g_tok, "x", 1), y = cm_tokenizer_token_id(g_tok, "y", 1);
    int32_t want2[7] = {101, a, b, 102, x, y, 102};
    for (int i = 0; i < 7; i++) cr_assert_eq(ids[i], want2[i], "truncated input_ids[%d] = %d, want %d", i, ids[i], want2[i]);
    /* single segment */
    cr_assert_eq(cm_tokenizer_encode_pair(g_tok, "hello", 5, NULL, 0, 4, ids, types, mask, &real), CM_OK);
    cr_assert(real == 3 && ids[0] == 101 && ids[1] == 7592 && ids[2] == 102 && ids[3] == 0 && mask[3] == 0 && types[2] == 0);
    cr_assert_eq(cm_tokenizer_encode_pair(g_tok, "a", 1, "b", 1, 2, ids, NULL, NULL, NULL), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "max_len 2"), "%s", cm_last_error());
}

Test(bert, decode_glues_continuations) {
    int32_t *ids;
    int64_t n;
    const char *text = "Tokenization of Unaffable words, isn't it?";
    cr_assert_eq(cm_tokenizer_encode(g_tok, text, strlen(text), &ids, &n), CM_OK);
    char *out;
    size_t len;
    cr_assert_eq(cm_tokenizer_decode(g_tok, ids, n, &out, &len), CM_OK);
    cr_assert_str_eq(out, "tokenization of unaffable words , isn ' t it ?");
    cm_free(out);
    cm_free(ids);
}

Test(bert, save_and_load_round_trip) {
    char path[] = "/tmp/cm_tok_wp_XXXXXX";
    close(mkstemp(path));
    cr_assert_eq(cm_tokenizer_save(g_tok, path), CM_OK, "%s", cm_last_error());
    cm_tokenizer *t2;
    cr_assert_eq(cm_tokenizer_load(path, &t2), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_tokenizer_get_type(t2), CM_TOKENIZER_WORDPIECE);
    cr_assert_eq(cm_tokenizer_vocab_size(t2), 30522);
    cm_tokenizer_free(t2);
    unlink(path);
}

Test(bert_files, bad_vocabularies_are_named) {
    cm_tokenizer *t = (cm_tokenizer *)1;
    cr_assert_eq(cm_tokenizer_wordpiece_new("/nonexistent/vocab.txt", true, &t), CM_ERR_IO);
    cr_assert_null(t);
    cr_assert(strstr(cm_last_error(), "/nonexistent/vocab.txt"), "%s", cm_last_error());
    char p[] = "/tmp/cm_vocab_XXXXXX";
    close(mkstemp(p));
    cmt_write_text(p, "");
    cr_assert_eq(cm_tokenizer_wordpiece_new(p, true, &t), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "empty"), "%s", cm_last_error());
    cmt_write_text(p, "[PAD]\nhello\n");
    cr_assert_eq(cm_tokenizer_wordpiece_new(p, true, &t), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "[UNK]") && strstr(cm_last_error(), p), "%s", cm_last_error());
    cmt_write_text(p, "[UNK]\n\nhello\n");
    cr_assert_eq(cm_tokenizer_wordpiece_new(p, true, &t), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "line 2"), "%s", cm_last_error());
    cmt_write_text(p, "[UNK]\nhello\r\nhello\n");
    cr_assert_eq(cm_tokenizer_wordpiece_new(p, true, &t), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "line 3") && strstr(cm_last_error(), "line 2"), "%s", cm_last_error());
    /* a tiny vocabulary without [CLS]: pair encoding is refused */
    cmt_write_text(p, "[UNK]\nhello");
    cr_assert_eq(cm_tokenizer_wordpiece_new(p, true, &t), CM_OK, "%s", cm_last_error());
    int32_t ids[4];
    cr_assert_eq(cm_tokenizer_encode_pair(t, "hello", 5, NULL, 0, 4, ids, NULL, NULL, NULL), CM_ERR_UNSUPPORTED);
    cm_tokenizer_free(t);
    unlink(p);
}
