/* Character-level tokenizer: nanoGPT's shakespeare_char vocabulary and ids, non-ASCII text,
 * unknown characters and invalid UTF-8, tokenizer.json round trip and corrupt descriptions. */
#include "cmtest.h"

#include <composer/tokenizer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

Test(char_tok, shakespeare_vocabulary_matches_nanogpt) {
    size_t len;
    char *text = cmt_read_file("../shared/data/tinyshakespeare/input.txt", &len);
    cm_tokenizer *tok;
    cr_assert_eq(cm_tokenizer_char_new_from_text(text, len, &tok), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_tokenizer_vocab_size(tok), 65, "vocab %lld, nanoGPT has 65", (long long)cm_tokenizer_vocab_size(tok));
    int32_t ids[16];
    int64_t n;
    cr_assert_eq(cm_tokenizer_encode_into(tok, "hii there", 9, ids, 16, &n), CM_OK);
    static const int32_t want[9] = {46, 47, 47, 1, 58, 46, 43, 56, 43}; /* nanoGPT's encode("hii there") */
    cr_assert_eq(n, 9);
    for (int i = 0; i < 9; i++) cr_assert_eq(ids[i], want[i], "id %d: %d, want %d", i, ids[i], want[i]);
    int32_t *all;
    cr_assert_eq(cm_tokenizer_encode(tok, text, len, &all, &n), CM_OK);
    cr_assert_eq(n, (int64_t)len);
    char *back;
    size_t blen;
    cr_assert_eq(cm_tokenizer_decode(tok, all, n, &back, &blen), CM_OK);
    cr_assert(blen == len && memcmp(back, text, len) == 0, "round trip differs");
    cm_free(back);
    cm_free(all);
    cm_tokenizer_free(tok);
    free(text);
}

Test(char_tok, non_ascii_characters_sort_by_code_point) {
    const char *text = "h\xC3\xA9llo \xE2\x86\x92 \xF0\x9F\x98\x80!"; /* "héllo → 😀!" */
    cm_tokenizer *tok;
    cr_assert_eq(cm_tokenizer_char_new_from_text(text, strlen(text), &tok), CM_OK, "%s", cm_last_error());
    /* ' ' ! h l o é → 😀 */
    cr_assert_eq(cm_tokenizer_vocab_size(tok), 8);
    cr_assert_eq(cm_tokenizer_token_id(tok, "\xC3\xA9", 2), 5);
    cr_assert_eq(cm_tokenizer_token_id(tok, "\xF0\x9F\x98\x80", 4), 7);
    int32_t *ids;
    int64_t n;
    cr_assert_eq(cm_tokenizer_encode(tok, text, strlen(text), &ids, &n), CM_OK);
    cr_assert_eq(n, 10);
    char *back;
    cr_assert_eq(cm_tokenizer_decode(tok, ids, n, &back, NULL), CM_OK);
    cr_assert_str_eq(back, text);
    cm_free(back);
    cm_free(ids);
    cm_tokenizer_free(tok);
}

Test(char_tok, unknown_characters_and_bad_text_are_errors) {
    cm_tokenizer *tok;
    cr_assert_eq(cm_tokenizer_char_new_from_text("abc", 3, &tok), CM_OK);
    int32_t *ids = (int32_t *)1;
    int64_t n;
    cr_assert_eq(cm_tokenizer_encode(tok, "abz", 3, &ids, &n), CM_ERR_INVALID_ARG);
    cr_assert_null(ids);
    cr_assert(strstr(cm_last_error(), "U+007A") && strstr(cm_last_error(), "offset 2"), "%s", cm_last_error());
    cr_assert_eq(cm_tokenizer_encode(tok, "a\xFF", 2, &ids, &n), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "0xFF"), "%s", cm_last_error());
    int32_t bad = 3;
    char *out;
    cr_assert_eq(cm_tokenizer_decode(tok, &bad, 1, &out, NULL), CM_ERR_INVALID_ARG);
    cm_tokenizer_free(tok);
    cr_assert_eq(cm_tokenizer_char_new_from_text("ab\xC3", 3, &tok), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "offset 2"), "%s", cm_last_error());
    cr_assert_eq(cm_tokenizer_char_new_from_text("", 0, &tok), CM_ERR_INVALID_ARG);
}

Test(char_tok, tokenizer_json_round_trip_and_corrupt_files) {
    cm_tokenizer *tok, *t2;
    const char *text = "hello\n\xC3\xA9";
    cr_assert_eq(cm_tokenizer_char_new_from_text(text, strlen(text), &tok), CM_OK);
    char p[] = "/tmp/cm_tok_char_XXXXXX";
    close(mkstemp(p));
    cr_assert_eq(cm_tokenizer_save(tok, p), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_tokenizer_load(p, &t2), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_tokenizer_vocab_size(t2), cm_tokenizer_vocab_size(tok));
    for (int32_t i = 0; i < cm_tokenizer_vocab_size(tok); i++) {
        size_t l1, l2;
        const char *a = cm_tokenizer_token_bytes(tok, i, &l1), *b = cm_tokenizer_token_bytes(t2, i, &l2);
        cr_assert(l1 == l2 && memcmp(a, b, l1) == 0, "token %d differs after load", i);
    }
    cm_tokenizer_free(t2);
    cm_tokenizer_free(tok);

    static const struct {
        const char *json, *msg;
    } bad[] = {
        {"{\"type\": \"char\", \"code_points\": [10, 32", "truncated"},
        {"{\"type\": \"char\", \"code_points\": [32, 10]}", "code_points[1]"},
        {"{\"type\": \"char\", \"code_points\": []}", "non-empty"},
        {"{\"type\": \"char\", \"code_points\": [55296]}", "code_points[0]"},
        {"{\"type\": \"char\", \"vocab_size\": 3, \"code_points\": [10, 32]}", "vocab_size 3"},
        {"{\"type\": \"sentencepiece\"}", "unknown type"},
        {"{\"code_points\": [10]}", "\"type\""},
        {"{\"type\": \"gpt2\"}", "encoder_json"},
        {"[1, 2]", "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cmt_write_text(p, bad[i].json);
        t2 = (cm_tokenizer *)1;
        cr_assert_eq(cm_tokenizer_load(p, &t2), CM_ERR_FORMAT, "case %zu (%s) loaded", i, bad[i].json);
        cr_assert_null(t2);
        cr_assert(strstr(cm_last_error(), bad[i].msg) && strstr(cm_last_error(), p), "case %zu: %s", i, cm_last_error());
    }
    unlink(p);
    cr_assert_eq(cm_tokenizer_load("/nonexistent/tokenizer.json", &t2), CM_ERR_IO);
    cr_assert(strstr(cm_last_error(), "/nonexistent/tokenizer.json"), "%s", cm_last_error());
}
