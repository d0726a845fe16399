/* Text datasets for the Hugging Face models: TSV classification by column names, text for masked
 * LM (run_mlm's group_texts and line_by_line) and causal LM, and the masked-LM dataset — Hugging
 * Face's 80/10/10 rule, masks that are a pure function of (seed, epoch, sample) and fixed for
 * evaluation, special tokens and padding never selected. */
#include "cmtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define VOCAB "tests/golden/hf/bert-mlm"

static cm_tokenizer *bert_tok(void) {
    cm_tokenizer *t;
    cr_assert_eq(cm_hf_tokenizer_load(VOCAB, &t, NULL), CM_OK, "%s", cm_last_error());
    return t;
}

static char *write_tmp(const char *suffix, const char *text) {
    char *p = malloc(64);
    snprintf(p, 64, "/tmp/cmhfdata-XXXXXX%s", suffix);
    int fd = mkstemps(p, (int)strlen(suffix));
    cr_assert(fd >= 0, "mkstemps");
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return p;
}

/* Sample i's fields into buffers (up to 4 fields of up to 64 int64). */
typedef struct sample {
    int32_t ids[64], mask[64], types[64];
    int64_t label, labels[64];
} sample;

static void get(const cm_dataset *ds, int64_t i, const cm_sample_ctx *ctx, sample *s) {
    memset(s, 0, sizeof *s);
    void *out[CM_DATASET_MAX_FIELDS];
    for (int f = 0; f < cm_dataset_n_fields(ds); f++) {
        const char *n = cm_dataset_field(ds, f)->name;
        out[f] = !strcmp(n, "input_ids") ? (void *)s->ids
                 : !strcmp(n, "attention_mask") ? (void *)s->mask
                 : !strcmp(n, "token_type_ids") ? (void *)s->types
                 : !strcmp(n, "label") ? (void *)&s->label
                 : (void *)s->labels;
    }
    cr_assert_eq(cm_dataset_get(ds, i, ctx, out), CM_OK, "%s", cm_last_error());
}

static int32_t id_of(const cm_tokenizer *t, const char *tok) { return cm_tokenizer_token_id(t, tok, strlen(tok)); }

Test(hf_data, tsv_reads_columns_by_header_name) {
    cm_tokenizer *t = bert_tok();
    char *p = write_tmp(".tsv", "id\tscore\tsentence\n7\t1\tthe movie was good\n8\t0\tthe plot was dull\n\n9\t2\tbad\n");
    cm_tsv_config c = cm_tsv_config_default();
    c.max_len = 8;
    c.label_column = "score";
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_tsv_new(p, t, &c, &ds), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_dataset_len(ds), 3);
    sample s;
    get(ds, 0, NULL, &s);
    const int32_t want[8] = {id_of(t, "[CLS]"), id_of(t, "the"), id_of(t, "movie"), id_of(t, "was"),
                             id_of(t, "good"), id_of(t, "[SEP]"), 0, 0};
    for (int k = 0; k < 8; k++) {
        cr_assert_eq(s.ids[k], want[k], "position %d: %d vs %d", k, s.ids[k], want[k]);
        cr_assert_eq(s.mask[k], k < 6);
        cr_assert_eq(s.types[k], 0);
    }
    cr_assert_eq(s.label, 1);
    cr_assert_eq(cm_dataset_n_tokens(ds, 0), 6);
    get(ds, 2, NULL, &s);
    cr_assert_eq(s.label, 2);
    cm_dataset_free(ds);
    /* num_labels bounds the labels */
    c.num_labels = 2;
    cr_assert_eq(cm_dataset_tsv_new(p, t, &c, &ds), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "line 5") && strstr(cm_last_error(), "in [0, 2)"), "%s", cm_last_error());
    c.num_labels = 0;
    c.label_column = "label";
    cr_assert_eq(cm_dataset_tsv_new(p, t, &c, &ds), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "no column \"label\""), "%s", cm_last_error());
    unlink(p);
    free(p);
    p = write_tmp(".tsv", "sentence\tlabel\ngood\t1\ntruncated line\n");
    cr_assert_eq(cm_dataset_tsv_new(p, t, NULL, &ds), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "line 3") && strstr(cm_last_error(), "fewer than the header's 2 fields"), "%s",
              cm_last_error());
    unlink(p);
    free(p);
    cm_tokenizer_free(t);
}

Test(hf_data, text_blocks_follow_run_mlm_group_texts) {
    cm_tokenizer *t = bert_tok();
    /* two texts of 3 and 2 tokens: [CLS] a b c [SEP] [CLS] d e [SEP] = 9 ids → 2 blocks of 4 */
    char *p = write_tmp(".txt", "the movie was\n\n  \nvery good\n");
    cm_text_config c = cm_text_config_default();
    c.max_len = 4;
    cm_dataset *ds;
    const char *paths[1] = {p};
    cr_assert_eq(cm_dataset_text_new(paths, 1, t, &c, &ds), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_dataset_len(ds), 2, "9 ids make 2 blocks of 4 (the remainder is dropped)");
    sample s;
    get(ds, 1, NULL, &s);
    const int32_t want[4] = {id_of(t, "[SEP]"), id_of(t, "[CLS]"), id_of(t, "very"), id_of(t, "good")};
    for (int k = 0; k < 4; k++) cr_assert_eq(s.ids[k], want[k], "position %d", k);
    for (int k = 0; k < 4; k++) cr_assert_eq(s.mask[k], 1);
    cm_dataset_free(ds);
    /* line_by_line: one padded sample per non-blank line */
    c.layout = CM_TEXT_LINES;
    c.max_len = 6;
    cr_assert_eq(cm_dataset_text_new(paths, 1, t, &c, &ds), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_dataset_len(ds), 2);
    get(ds, 1, NULL, &s);
    cr_assert_eq(s.ids[3], id_of(t, "[SEP]"));
    cr_assert_eq(s.mask[3], 1);
    cr_assert_eq(s.mask[4], 0);
    cr_assert_eq(s.ids[4], id_of(t, "[PAD]"));
    cm_dataset_free(ds);
    /* a TSV among the files is read by its text column */
    char *q = write_tmp(".tsv", "sentence\tlabel\nfun\t1\n");
    const char *two[2] = {q, p};
    c.layout = CM_TEXT_BLOCKS;
    c.max_len = 3;
    cr_assert_eq(cm_dataset_text_new(two, 2, t, &c, &ds), CM_OK, "%s", cm_last_error());
    get(ds, 0, NULL, &s);
    cr_assert_eq(s.ids[1], id_of(t, "fun"), "the TSV's sentence, not its header or label");
    cm_dataset_free(ds);
    c.max_len = 100; /* too few tokens for one block */
    cr_assert_eq(cm_dataset_text_new(paths, 1, t, &c, &ds), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "make no block of max_len 100"), "%s", cm_last_error());
    unlink(p), unlink(q);
    free(p), free(q);
    cm_tokenizer_free(t);
}

Test(hf_data, causal_text_windows_predict_the_next_token) {
    cm_tokenizer *t;
    cr_assert_eq(cm_hf_tokenizer_load("tests/golden/hf/gpt2", &t, NULL), CM_OK, "%s", cm_last_error());
    char *p = write_tmp(".txt", "the heat\nin the winter");
    cm_text_config c = cm_text_config_default();
    c.layout = CM_TEXT_CAUSAL;
    c.max_len = 4;
    cm_dataset *ds;
    const char *paths[1] = {p};
    cr_assert_eq(cm_dataset_text_new(paths, 1, t, &c, &ds), CM_OK, "%s", cm_last_error());
    int32_t *all;
    int64_t n;
    const char *text = "the heat\nin the winter";
    cr_assert_eq(cm_tokenizer_encode(t, text, strlen(text), &all, &n), CM_OK);
    /* the whole file is one document, then <|endoftext|> */
    cr_assert_eq(cm_dataset_len(ds), n / 4, "%lld ids + EOT make %lld windows of 4 + 1", (long long)n, (long long)(n / 4));
    int32_t in[4], lab[4];
    void *out[2] = {in, lab};
    cr_assert_eq(cm_dataset_get(ds, 1, NULL, out), CM_OK);
    for (int k = 0; k < 4; k++) {
        cr_assert_eq(in[k], all[4 + k]);
        cr_assert_eq(lab[k], 4 + k + 1 < n ? all[4 + k + 1] : 265, "labels are the next tokens");
    }
    cm_free(all);
    cm_dataset_free(ds);
    unlink(p);
    free(p);
    cm_tokenizer_free(t);
}

/* ---- masked LM ---- */

static cm_dataset *mlm_over_lines(cm_tokenizer *t, float prob, int n_lines) {
    static char text[1 << 16];
    text[0] = 0;
    const char *words[] = {"the movie was good", "the best acting and the worst plot", "it was not fun",
                           "very dull story"};
    for (int i = 0; i < n_lines; i++) strcat(strcat(text, words[i % 4]), "\n");
    char *p = write_tmp(".txt", text);
    cm_text_config c = cm_text_config_default();
    c.layout = CM_TEXT_LINES;
    c.max_len = 12;
    const char *paths[1] = {p};
    cm_dataset *inner, *ds;
    cr_assert_eq(cm_dataset_text_new(paths, 1, t, &c, &inner), CM_OK, "%s", cm_last_error());
    unlink(p);
    free(p);
    cm_bert_mlm_mask_config mc;
    cr_assert_eq(cm_bert_mlm_mask_config_from_tokenizer(t, 0, &mc), CM_OK);
    mc.mlm_probability = prob;
    cr_assert_eq(cm_bert_mlm_dataset_new(inner, &mc, &ds), CM_OK, "%s", cm_last_error());
    return ds;
}

Test(hf_data, mlm_masks_follow_the_80_10_10_rule_and_skip_specials) {
    cm_tokenizer *t = bert_tok();
    cm_dataset *ds = mlm_over_lines(t, 0.5f, 2000);
    cm_dataset *plain;
    {
        /* the unmasked reference: the same lines */
        static char text[1 << 16];
        text[0] = 0;
        const char *words[] = {"the movie was good", "the best acting and the worst plot", "it was not fun",
                               "very dull story"};
        for (int i = 0; i < 2000; i++) strcat(strcat(text, words[i % 4]), "\n");
        char *p = write_tmp(".txt", text);
        cm_text_config c = cm_text_config_default();
        c.layout = CM_TEXT_LINES;
        c.max_len = 12;
        const char *paths[1] = {p};
        cr_assert_eq(cm_dataset_text_new(paths, 1, t, &c, &plain), CM_OK);
        unlink(p);
        free(p);
    }
    cr_assert_eq(cm_dataset_find_field(ds, "labels"), 3);
    cr_assert_eq(cm_dataset_field(ds, 3)->dtype, CM_DTYPE_I64);
    const int32_t cls = id_of(t, "[CLS]"), sep = id_of(t, "[SEP]"), pad = id_of(t, "[PAD]"), mask = id_of(t, "[MASK]");
    int64_t eligible = 0, selected = 0, as_mask = 0, kept = 0, random = 0;
    cm_sample_ctx ctx = {.seed = 42, .epoch = 0, .training = true};
    for (int64_t i = 0; i < cm_dataset_len(ds); i++) {
        sample s, r;
        get(ds, i, &ctx, &s);
        get(plain, i, NULL, &r);
        for (int k = 0; k < 12; k++) {
            const bool special = r.ids[k] == cls || r.ids[k] == sep || r.ids[k] == pad;
            if (special) {
                cr_assert_eq(s.labels[k], -100, "a special token or padding was selected");
                cr_assert_eq(s.ids[k], r.ids[k]);
                continue;
            }
            eligible++;
            if (s.labels[k] == -100) {
                cr_assert_eq(s.ids[k], r.ids[k], "an unselected token changed");
                continue;
            }
            selected++;
            cr_assert_eq(s.labels[k], r.ids[k], "the label is the original token");
            if (s.ids[k] == mask) as_mask++;
            else if (s.ids[k] == r.ids[k]) kept++;
            else random++;
        }
    }
    /* binomial bounds, about 5 standard deviations */
    const double p_sel = (double)selected / (double)eligible;
    cr_assert(p_sel > 0.48 && p_sel < 0.52, "selected %.4f of %lld eligible (want 0.5)", p_sel, (long long)eligible);
    const double pm = (double)as_mask / (double)selected, pk = (double)kept / (double)selected;
    cr_assert(pm > 0.78 && pm < 0.82, "[MASK] for %.4f of the selected (want 0.8)", pm);
    /* a random replacement may draw the original token (1 in 100 here): kept ≈ 0.1 + 0.001 */
    cr_assert(pk > 0.088 && pk < 0.115, "kept %.4f (want about 0.1)", pk);
    cr_assert((double)random / (double)selected > 0.085, "random %lld", (long long)random);
    cm_dataset_free(ds);
    cm_dataset_free(plain);
    cm_tokenizer_free(t);
}

static bool same_sample(const sample *a, const sample *b) {
    return !memcmp(a->ids, b->ids, sizeof a->ids) && !memcmp(a->labels, b->labels, sizeof a->labels);
}

Test(hf_data, mlm_masks_depend_on_seed_epoch_and_sample_only) {
    cm_tokenizer *t = bert_tok();
    cm_dataset *a = mlm_over_lines(t, 0.15f, 64), *b = mlm_over_lines(t, 0.15f, 64);
    cm_sample_ctx e0 = {.seed = 42, .epoch = 0, .training = true}, e1 = e0, other = e0, ev = e0, ev5 = e0;
    e1.epoch = 1;
    other.seed = 43;
    ev.training = false;
    ev5.training = false, ev5.epoch = 5;
    int diff_epoch = 0, diff_seed = 0;
    for (int64_t i = 0; i < 64; i++) {
        sample x, y, z;
        get(a, i, &e0, &x);
        get(b, i, &e0, &y); /* another dataset object, the same masks: no hidden state */
        cr_assert(same_sample(&x, &y), "sample %lld masked differently by a second dataset", (long long)i);
        get(a, i, &e0, &y); /* and again, after other samples were drawn */
        cr_assert(same_sample(&x, &y));
        get(a, i, &e1, &z);
        diff_epoch += !same_sample(&x, &z);
        get(a, i, &other, &z);
        diff_seed += !same_sample(&x, &z);
        get(a, i, &ev, &y);
        get(a, i, &ev5, &z);
        cr_assert(same_sample(&y, &z), "evaluation masks change with the epoch");
    }
    cr_assert_gt(diff_epoch, 40, "only %d of 64 samples are masked differently in the next epoch", diff_epoch);
    cr_assert_gt(diff_seed, 40, "only %d of 64 samples change with the seed", diff_seed);
    cm_dataset_free(a);
    cm_dataset_free(b);
    cm_tokenizer_free(t);
}

Test(hf_data, mlm_dataset_rejects_what_it_cannot_mask) {
    cm_tokenizer *t = bert_tok();
    cm_dataset *ds = mlm_over_lines(t, 0.15f, 4), *bad;
    cm_bert_mlm_mask_config mc = cm_bert_mlm_mask_config_default();
    cr_assert_eq(cm_bert_mlm_dataset_new(ds, &mc, &bad), CM_ERR_INVALID_ARG, "it has labels already");
    cr_assert(strstr(cm_last_error(), "\"labels\""), "%s", cm_last_error());
    cm_dataset_free(ds);
    cm_tokenizer_free(t);
}
