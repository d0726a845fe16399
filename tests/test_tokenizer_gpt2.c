/* GPT-2 byte-level BPE: the shipped reference vectors (13 languages/emoji from tiktoken/HF, the
 * first 1000 ids of tiny Shakespeare, FORMATS.md's worked example), the full file's round trip,
 * the regex's corner cases, decode's UTF-8 repair, save/load, and bad vocabulary files. */
#include "cmtest.h"

#include <composer/tokenizer.h>
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ENC "../shared/data/gpt2/encoder.json"
#define BPE "../shared/data/gpt2/vocab.bpe"
#define SHAKESPEARE "../shared/data/tinyshakespeare/input.txt"

static cm_tokenizer *g_tok;

static void setup(void) {
    cm_status st = cm_tokenizer_gpt2_new(ENC, BPE, &g_tok);
    cr_assert_eq(st, CM_OK, "loading GPT-2: %s", cm_last_error());
}
static void teardown(void) { cm_tokenizer_free(g_tok); }

static void expect_ids(const char *what, const int32_t *got, int64_t n_got, const int32_t *want, int64_t n_want) {
    int64_t first_diff = -1;
    for (int64_t i = 0; i < n_got && i < n_want; i++)
        if (got[i] != want[i]) {
            first_diff = i;
            break;
        }
    cr_assert(first_diff < 0 && n_got == n_want,
              "%s: %lld ids, expected %lld; first difference at %lld (got %d, want %d)", what, (long long)n_got,
              (long long)n_want, (long long)first_diff, first_diff >= 0 ? got[first_diff] : -1,
              first_diff >= 0 ? want[first_diff] : -1);
}

static void expect_encode(const char *text, const int32_t *want, int64_t n_want) {
    int32_t *ids;
    int64_t n;
    cr_assert_eq(cm_tokenizer_encode(g_tok, text, strlen(text), &ids, &n), CM_OK, "%s", cm_last_error());
    expect_ids(text, ids, n, want, n_want);
    cm_free(ids);
}

TestSuite(gpt2, .init = setup, .fini = teardown);

Test(gpt2, vocabulary_size_and_end_of_text) {
    cr_assert_eq(cm_tokenizer_vocab_size(g_tok), 50257);
    cr_assert_eq(cm_tokenizer_special(g_tok, CM_TOKEN_EOT), 50256);
    cr_assert_eq(cm_tokenizer_special(g_tok, CM_TOKEN_CLS), -1);
    cr_assert_str_eq(cm_tokenizer_type_name(g_tok), "gpt2");
    cr_assert_eq(cm_tokenizer_token_id(g_tok, " the", 4), 262);
    size_t len;
    const char *b = cm_tokenizer_token_bytes(g_tok, 50256, &len);
    cr_assert(len == 13 && memcmp(b, "<|endoftext|>", 13) == 0);
    /* encode never produces the special token from text */
    int32_t *ids;
    int64_t n;
    cr_assert_eq(cm_tokenizer_encode(g_tok, "<|endoftext|>", 13, &ids, &n), CM_OK);
    for (int64_t i = 0; i < n; i++) cr_assert_neq(ids[i], 50256, "id %lld is <|endoftext|>", (long long)i);
    cr_assert_gt(n, 1);
    cm_free(ids);
}

Test(gpt2, formats_md_worked_example) {
    static const int32_t want[] = {314, 1101, 994, 628, 220, 12876};
    expect_encode(" I'm here\n\n  ok", want, 6);
    static const int32_t hw[] = {15496, 995};
    expect_encode("Hello world", hw, 2);
}

Test(gpt2, shipped_multilingual_vectors_encode_and_decode_exactly) {
    size_t len;
    char *json = cmt_read_file("../shared/data/gpt2/opencv_gpt2_hf_tik_testdata.json", &len);
    cJSON *root = cJSON_Parse(json);
    cr_assert_not_null(root);
    cJSON *samples = cJSON_GetObjectItem(root, "samples");
    int count = 0;
    for (cJSON *s = samples->child; s; s = s->next, count++) {
        const char *name = cJSON_GetObjectItem(s, "name")->valuestring;
        const char *text = cJSON_GetObjectItem(s, "text")->valuestring;
        cJSON *jids = cJSON_GetObjectItem(s, "ids");
        int nw = cJSON_GetArraySize(jids);
        int32_t *want = malloc(sizeof(int32_t) * (size_t)nw);
        for (int i = 0; i < nw; i++) want[i] = cJSON_GetArrayItem(jids, i)->valueint;
        int32_t *ids;
        int64_t n;
        cr_assert_eq(cm_tokenizer_encode(g_tok, text, strlen(text), &ids, &n), CM_OK, "%s", cm_last_error());
        expect_ids(name, ids, n, want, nw);
        char *back;
        size_t blen;
        cr_assert_eq(cm_tokenizer_decode(g_tok, want, nw, &back, &blen), CM_OK);
        cr_assert(blen == strlen(text) && strcmp(back, text) == 0, "%s: decode gave \"%s\", want \"%s\"", name, back, text);
        cm_free(back);
        cm_free(ids);
        free(want);
    }
    cr_assert_eq(count, 13, "expected the 13 shipped samples, found %d", count);
    cJSON_Delete(root);
    free(json);
}

Test(gpt2, tiny_shakespeare_first_1000_ids_match) {
    size_t len, tlen;
    char *txt = cmt_read_file("../shared/data/tinyshakespeare/gpt2_tokens_first1000.txt", &tlen);
    int32_t want[1000];
    int nw = 0;
    for (char *p = txt; nw < 1000;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) break;
        want[nw++] = (int32_t)v;
        p = end;
    }
    free(txt);
    cr_assert_eq(nw, 1000);
    char *text = cmt_read_file(SHAKESPEARE, &len);
    /* the first 1000 tokens come from the first few KB; encode a prefix that ends at a line break
     * followed by a non-space (a pre-token boundary), then the full file in the next test */
    int32_t ids[1200];
    int64_t n;
    size_t cut = 6000;
    while (!(text[cut - 1] == '\n' && text[cut] != '\n' && text[cut] != ' ')) cut++;
    cr_assert_eq(cm_tokenizer_encode_into(g_tok, text, cut, ids, 1200, &n), CM_OK, "%s", cm_last_error());
    cr_assert_geq(n, 1000, "a %zu-byte prefix gave only %lld tokens", cut, (long long)n);
    expect_ids("tiny shakespeare", ids, 1000, want, 1000);
    free(text);
}

Test(gpt2, tiny_shakespeare_full_file_round_trips_with_known_count) {
    size_t len;
    char *text = cmt_read_file(SHAKESPEARE, &len);
    int32_t *ids;
    int64_t n;
    cr_assert_eq(cm_tokenizer_encode(g_tok, text, len, &ids, &n), CM_OK, "%s", cm_last_error());
    /* nanoGPT/llm.c: train 301,966 + val 36,059 = 338,025 GPT-2 tokens */
    cr_assert_eq(n, 338025, "tiny Shakespeare: %lld tokens, expected 338025", (long long)n);
    char *back;
    size_t blen;
    cr_assert_eq(cm_tokenizer_decode(g_tok, ids, n, &back, &blen), CM_OK);
    cr_assert(blen == len && memcmp(back, text, len) == 0, "decoded %zu bytes, expected %zu identical bytes", blen, len);
    cm_free(back);
    cm_free(ids);
    free(text);
}

/* The scanner's corner cases, checked as token sequences built from the vocabulary (each
 * expectation is what the regex's pre-tokens give, merged by BPE into single known tokens). */
static int32_t id_of(const char *s) {
    int32_t id = cm_tokenizer_token_id(g_tok, s, strlen(s));
    cr_assert_geq(id, 0, "\"%s\" is not a GPT-2 token", s);
    return id;
}

Test(gpt2, contractions_are_case_sensitive_and_spaces_attach_forward) {
    int32_t want1[] = {id_of("he"), id_of("'s")};
    expect_encode("he's", want1, 2);
    /* "'S" is not a contraction: "'" and "S" are separate pre-tokens, though "'S" is in the vocab */
    int32_t want2[] = {id_of("HE"), id_of("'"), id_of("S")};
    expect_encode("HE'S", want2, 3);
    /* a whitespace run before a word gives its last character to the word (GPT-2 has no
     * multi-space tokens, so "  " is two 220s); a run that ends the text stays whole */
    int32_t want3[] = {id_of("a"), 220, 220, id_of(" b")};
    expect_encode("a   b", want3, 4);
    int32_t want4[] = {id_of("a"), id_of("\n\n")};
    expect_encode("a\n\n", want4, 2);
    int32_t want4b[] = {id_of("a"), id_of("\n"), id_of("\n"), id_of("b")};
    expect_encode("a\n\nb", want4b, 4);
    /* digits and letters are separate runs; " 42" keeps its space */
    int32_t want5[] = {id_of("abc"), id_of("42"), id_of(" 42")};
    expect_encode("abc42 42", want5, 3);
    /* a single newline before a word is its own pre-token */
    int32_t want6[] = {id_of("\n"), id_of("x")};
    expect_encode("\nx", want6, 2);
}

/* \p{L} and \p{N} are Unicode 15.0's, as in the reference (`regex` 2022.10.31). A character's class
 * shows in the ids where a contraction follows it: a letter/digit run stops before "'s", so "'s" is
 * one token (338), while a character the tables do not know (Unicode 14 tables: unassigned, so
 * "other") would swallow the "'" into its [^\s\p{L}\p{N}]+ run and leave "'" (6) and "s" (82).
 * Expected ids computed with regex 2022.10.31 (Debian python3-regex) and openai's encoder.py BPE. */
Test(gpt2, unicode_15_letters_and_digits_are_classified_like_the_reference) {
    /* U+31350 CJK Ext. H ideograph, U+11F04 KAWI LETTER A (Lo), U+11F50 KAWI DIGIT ZERO (Nd): new in 15 */
    int32_t cjk_h[] = {172, 109, 235, 238, 338};
    expect_encode("\xF0\xB1\x8D\x90's", cjk_h, 5);
    int32_t kawi_a[] = {172, 239, 120, 226, 338};
    expect_encode("\xF0\x91\xBC\x84's", kawi_a, 5);
    int32_t kawi_0[] = {172, 239, 121, 238, 338};
    expect_encode("\xF0\x91\xBD\x90's", kawi_0, 5);
    /* the same shape with a letter Unicode 14 already had (U+10400 DESERET CAPITAL LONG I) */
    int32_t deseret[] = {172, 238, 238, 222, 338};
    expect_encode("\xF0\x90\x90\x80's", deseret, 5);
    /* a space attaches forward to a run of new letters, and the run ends before "'s" */
    int32_t words[] = {42, 23368, 220, 172, 239, 120, 226, 172, 239, 120, 227, 338};
    expect_encode("Kawi \xF0\x91\xBC\x84\xF0\x91\xBC\x85's", words, 12);
}

Test(gpt2, decode_replaces_invalid_utf8_like_python) {
    /* byte tokens: 0xE4 0xBD (a truncated 3-byte sequence) then 'a', 0xFF, 0xC0 'b' */
    int32_t ids[6];
    const uint8_t bytes[6] = {0xE4, 0xBD, 'a', 0xFF, 0xC0, 'b'};
    for (int i = 0; i < 6; i++) ids[i] = cm_tokenizer_token_id(g_tok, (const char *)&bytes[i], 1);
    char *text;
    size_t len;
    cr_assert_eq(cm_tokenizer_decode(g_tok, ids, 6, &text, &len), CM_OK);
    /* b'\xe4\xbda\xff\xc0b'.decode('utf-8', 'replace') == '\ufffda\ufffd\ufffdb' */
    const char *want = "\xEF\xBF\xBD" "a" "\xEF\xBF\xBD\xEF\xBF\xBD" "b";
    cr_assert(len == strlen(want) && memcmp(text, want, len) == 0, "got %zu bytes \"%s\"", len, text);
    cm_free(text);
    int32_t bad = 50257;
    cr_assert_eq(cm_tokenizer_decode(g_tok, &bad, 1, &text, &len), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "50257"), "%s", cm_last_error());
}

Test(gpt2, invalid_utf8_input_round_trips_through_byte_tokens) {
    const char text[] = "ok \xFF\xFE bytes\x80";
    int32_t *ids;
    int64_t n;
    cr_assert_eq(cm_tokenizer_encode(g_tok, text, sizeof text - 1, &ids, &n), CM_OK);
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        size_t l;
        cm_tokenizer_token_bytes(g_tok, ids[i], &l);
        total += l;
    }
    cr_assert_eq(total, sizeof text - 1, "token bytes add up to %zu, expected %zu", total, sizeof text - 1);
    cm_free(ids);
    /* empty text: zero ids, non-NULL array */
    cr_assert_eq(cm_tokenizer_encode(g_tok, "", 0, &ids, &n), CM_OK);
    cr_assert(n == 0 && ids != NULL);
    cm_free(ids);
}

typedef struct {
    const char *text;
    size_t len;
    int64_t n;
} thread_job;

static void *encode_job(void *arg) {
    thread_job *j = arg;
    int32_t *ids;
    if (cm_tokenizer_encode(g_tok, j->text, j->len, &ids, &j->n) != CM_OK) j->n = -1;
    else cm_free(ids);
    return NULL;
}

Test(gpt2, concurrent_encodes_agree) {
    size_t len;
    char *text = cmt_read_file(SHAKESPEARE, &len);
    thread_job jobs[2] = {{text, 200000, 0}, {text, 200000, 0}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, encode_job, &jobs[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    cr_assert(jobs[0].n > 0 && jobs[0].n == jobs[1].n, "%lld vs %lld", (long long)jobs[0].n, (long long)jobs[1].n);
    free(text);
}

Test(gpt2, save_and_load_round_trip) {
    char path[] = "/tmp/cm_tok_gpt2_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    cr_assert_eq(cm_tokenizer_save(g_tok, path), CM_OK, "%s", cm_last_error());
    cm_tokenizer *t2;
    cr_assert_eq(cm_tokenizer_load(path, &t2), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_tokenizer_get_type(t2), CM_TOKENIZER_GPT2);
    int32_t ids[4];
    int64_t n;
    cr_assert_eq(cm_tokenizer_encode_into(t2, "Hello world", 11, ids, 4, &n), CM_OK);
    cr_assert(n == 2 && ids[0] == 15496 && ids[1] == 995);
    cm_tokenizer_free(t2);
    unlink(path);
}

Test(gpt2_files, missing_or_corrupt_files_name_the_file) {
    cm_tokenizer *t = (cm_tokenizer *)1;
    cr_assert_eq(cm_tokenizer_gpt2_new("/nonexistent/encoder.json", BPE, &t), CM_ERR_IO);
    cr_assert_null(t);
    cr_assert(strstr(cm_last_error(), "/nonexistent/encoder.json"), "%s", cm_last_error());

    char enc[] = "/tmp/cm_enc_XXXXXX", bpe[] = "/tmp/cm_bpe_XXXXXX";
    close(mkstemp(enc));
    close(mkstemp(bpe));
    cmt_write_text(enc, "{\"a\": 0, \"b\": ");
    cr_assert_eq(cm_tokenizer_gpt2_new(enc, BPE, &t), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), enc) && strstr(cm_last_error(), "truncated"), "%s", cm_last_error());

    /* a merge whose tokens the encoder lacks: the line is named */
    cr_assert_eq(cm_tokenizer_gpt2_new(ENC, "../shared/data/gpt2/encoder.json", &t), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "line"), "%s", cm_last_error());
    cmt_write_text(bpe, "#version: 0.2\n\xC4\xA0 t\nzzzzqqqq xxxyyy\n");
    cr_assert_eq(cm_tokenizer_gpt2_new(ENC, bpe, &t), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "line 3") && strstr(cm_last_error(), bpe), "%s", cm_last_error());
    cmt_write_text(bpe, "#version: 0.2\n");
    cr_assert_eq(cm_tokenizer_gpt2_new(ENC, bpe, &t), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "no merges"), "%s", cm_last_error());
    unlink(enc);
    unlink(bpe);
}

Test(gpt2_files, failing_allocations_while_loading_are_clean) {
    /* count the allocations of one load, then fail the first few and the last few */
    cm_tokenizer *t = NULL;
    cm_alloc_fail_at(0);
    cr_assert_eq(cm_tokenizer_gpt2_new(ENC, BPE, &t), CM_OK);
    int64_t total = cm_alloc_fail_at(0);
    cm_tokenizer_free(t);
    cr_assert_gt(total, 8);
    int64_t ks[] = {1, 2, 3, 4, 5, total / 2, total - 2, total - 1, total};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        cm_alloc_fail_at(ks[i]);
        t = NULL;
        cm_status st = cm_tokenizer_gpt2_new(ENC, BPE, &t);
        cm_alloc_fail_at(0);
        cr_assert_eq(st, CM_ERR_OOM, "failing allocation %lld of %lld: status %d, %s", (long long)ks[i],
                     (long long)total, st, cm_last_error());
        cr_assert_null(t);
    }
}
