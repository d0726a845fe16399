/*
 * composer/tokenizer.h — tokenizers (GPT-2 byte-level BPE, BERT WordPiece, character level), the
 * llm.c token file writer, and the SST-2 sentence classification dataset.
 *
 * A cm_tokenizer turns UTF-8 text into int32 token ids and back. Three kinds:
 *  - GPT-2 byte-level BPE from openai's encoder.json + vocab.bpe. Encoding matches GPT-2's
 *    reference (openai encoder.py / tiktoken `encode_ordinary`) exactly: the same pre-tokenisation
 *    regex with the same Unicode classes, merges by rank, and `<|endoftext|>` (50256) is never
 *    produced from text — append it yourself as a document separator. Decoding joins token bytes
 *    and repairs invalid UTF-8 the way Python's errors='replace' does (one U+FFFD per maximal
 *    ill-formed subpart).
 *  - BERT WordPiece from a vocab.txt (one token per line, id = line index): BERT's basic tokenizer
 *    (clean control characters, split CJK ideographs, optionally lowercase + strip accents, split on
 *    whitespace and punctuation) then greedy longest-match-first WordPiece with "##" continuations.
 *  - Character level: the vocabulary is the sorted set of code points of a training text (as
 *    nanoGPT's shakespeare_char); saved with the model in tokenizer.json.
 *
 *     cm_tokenizer *tok;
 *     if (cm_tokenizer_gpt2_new("../shared/data/gpt2/encoder.json", "../shared/data/gpt2/vocab.bpe",
 *                               &tok) != CM_OK) {
 *         fprintf(stderr, "%s\n", cm_last_error());
 *         return 1;
 *     }
 *     int32_t *ids;
 *     int64_t n;
 *     cm_tokenizer_encode(tok, "Hello world", 11, &ids, &n);     // [15496, 995]
 *     char *text;
 *     size_t len;
 *     cm_tokenizer_decode(tok, ids, n, &text, &len);              // "Hello world"
 *     cm_free(text);
 *     cm_free(ids);
 *     cm_tokenizer_free(tok);
 *
 * Thread-safety: a tokenizer is immutable after creation; encode, decode and the getters may be
 * called from any number of threads at once (GPT-2's BPE cache is per call).
 *
 * tokenizer.json (cm_tokenizer_save / cm_tokenizer_load) is a small JSON object:
 *     {"type": "gpt2", "encoder_json": "<path>", "vocab_bpe": "<path>", "vocab_size": 50257, "eot": 50256}
 *     {"type": "wordpiece", "vocab_txt": "<path>", "lowercase": true, "vocab_size": 30522}
 *     {"type": "char", "vocab_size": 65, "code_points": [10, 32, 33, ...]}
 * GPT-2 and WordPiece refer to their vocabulary files by path (as given at creation); the
 * character vocabulary is stored inline, id i = code_points[i]. vocab_size is informational for
 * readers and checked on load.
 *
 * Token files (cm_token_file_write) use llm.c's layout: a header of 256 little-endian int32 —
 * [0] magic 20240520, [1] version (1: tokens are uint16, 2: uint32), [2] token count, the rest 0 —
 * then the tokens, little-endian.
 */
#ifndef COMPOSER_TOKENIZER_H
#define COMPOSER_TOKENIZER_H

#include <composer/data.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cm_tokenizer cm_tokenizer;

typedef enum cm_tokenizer_type {
    CM_TOKENIZER_GPT2 = 0,
    CM_TOKENIZER_WORDPIECE = 1,
    CM_TOKENIZER_CHAR = 2,
} cm_tokenizer_type;

/* Special tokens a tokenizer may have (cm_tokenizer_special returns -1 where it has none). */
typedef enum cm_token_special {
    CM_TOKEN_EOT = 0,  /* GPT-2 <|endoftext|> (50256) */
    CM_TOKEN_CLS = 1,  /* BERT [CLS] */
    CM_TOKEN_SEP = 2,  /* BERT [SEP] */
    CM_TOKEN_PAD = 3,  /* BERT [PAD] */
    CM_TOKEN_UNK = 4,  /* BERT [UNK] */
    CM_TOKEN_MASK = 5, /* BERT [MASK] */
    CM_TOKEN_SPECIAL_COUNT = 6
} cm_token_special;

/* ---------------------------------------------------------------------------------------------
 * Creating and freeing
 * ------------------------------------------------------------------------------------------- */

/* Loads GPT-2's byte-level BPE from encoder.json (token string -> id, over GPT-2's byte alphabet)
 * and vocab.bpe ("#version" line, then one merge "A B" per line, rank = line order). Every merge's
 * parts and result must be in the encoder. Errors: CM_ERR_IO (a file cannot be read; names the
 * path), CM_ERR_FORMAT (bad JSON, a token outside the byte alphabet, a bad merge line; names the
 * file and line), CM_ERR_OOM. The paths are remembered for cm_tokenizer_save. */
cm_status cm_tokenizer_gpt2_new(const char *encoder_json_path, const char *vocab_bpe_path, cm_tokenizer **out);

/* Loads a BERT WordPiece vocabulary (one token per line, id = 0-based line index, "\r\n" allowed).
 * `lowercase` selects the uncased pipeline (lowercase + strip accents), as bert-base-uncased;
 * false keeps case and accents (cased models). The vocabulary must contain [UNK]; [CLS], [SEP],
 * [PAD] and [MASK] are looked up and are -1 when absent. Errors: CM_ERR_IO, CM_ERR_FORMAT (empty
 * file, empty or duplicate token; names the line), CM_ERR_OOM. */
cm_status cm_tokenizer_wordpiece_new(const char *vocab_txt_path, bool lowercase, cm_tokenizer **out);

/* Builds a character vocabulary from text[0, len): its distinct code points, sorted, id = rank.
 * The text must be valid UTF-8 (CM_ERR_INVALID_ARG names the byte offset otherwise) and not
 * empty. */
cm_status cm_tokenizer_char_new_from_text(const char *text, size_t len, cm_tokenizer **out);

/* Writes tokenizer.json (format in the overview) atomically (temporary file + rename). Errors:
 * CM_ERR_IO naming the path, CM_ERR_UNSUPPORTED (a tokenizer made from a Hugging Face
 * tokenizer.json has no vocabulary files to refer to: write it with cm_hf_tokenizer_save),
 * CM_ERR_OOM. */
cm_status cm_tokenizer_save(const cm_tokenizer *tok, const char *path);

/* Reads a tokenizer.json written by cm_tokenizer_save and creates the tokenizer it describes
 * (for gpt2 and wordpiece this loads their vocabulary files from the stored paths). Errors:
 * CM_ERR_IO, CM_ERR_FORMAT (bad JSON, unknown type, missing or bad fields, a vocab_size that does
 * not match; names the file and field), and those of the constructors. */
cm_status cm_tokenizer_load(const char *path, cm_tokenizer **out);

void cm_tokenizer_free(cm_tokenizer *tok); /* NULL is a no-op */

/* ---------------------------------------------------------------------------------------------
 * Queries
 * ------------------------------------------------------------------------------------------- */

cm_tokenizer_type cm_tokenizer_get_type(const cm_tokenizer *tok);
const char *cm_tokenizer_type_name(const cm_tokenizer *tok); /* "gpt2", "wordpiece", "char" */
/* Number of ids (max id + 1): 50257 for GPT-2, 30522 for bert-base-uncased. */
int64_t cm_tokenizer_vocab_size(const cm_tokenizer *tok);
/* The id of a special token, or -1 if this tokenizer has none. */
int32_t cm_tokenizer_special(const cm_tokenizer *tok, cm_token_special which);
/* The id of the token whose bytes are token[0, len) — for GPT-2 the raw bytes (" the"), not the
 * byte-alphabet spelling ("Ġthe"); for WordPiece the vocab line ("##ing"); for char one
 * character — or -1. */
int32_t cm_tokenizer_token_id(const cm_tokenizer *tok, const char *token, size_t len);
/* The bytes of token `id` (not NUL-terminated; valid while tok lives) and their count, or NULL
 * for an id out of range. */
const char *cm_tokenizer_token_bytes(const cm_tokenizer *tok, int32_t id, size_t *len);

/* ---------------------------------------------------------------------------------------------
 * Encoding and decoding
 * ------------------------------------------------------------------------------------------- */

/* Encodes text[0, len) (UTF-8; may contain NUL bytes) into a new array *ids (cm_alloc'ed; the
 * caller cm_frees it; never NULL on success, even for n = 0) of *n ids. No special tokens are
 * added. Invalid UTF-8: GPT-2 keeps each invalid byte as its own byte token (decode gives the bytes
 * back, repaired); WordPiece drops it (as U+FFFD, which BERT's cleaning removes); char fails.
 * Errors: CM_ERR_INVALID_ARG (char: a character outside the vocabulary, naming it and its byte
 * offset; invalid UTF-8), CM_ERR_OOM. Thread-safe. */
cm_status cm_tokenizer_encode(const cm_tokenizer *tok, const char *text, size_t len, int32_t **ids, int64_t *n);

/* Like cm_tokenizer_encode, into caller memory: writes the first min(count, cap) ids to ids[] and
 * sets *n to the full count (so *n > cap means the output was truncated). */
cm_status cm_tokenizer_encode_into(const cm_tokenizer *tok, const char *text, size_t len, int32_t *ids, int64_t cap,
                                   int64_t *n);

/* Decodes ids[0, n) into new UTF-8 text *text (cm_alloc'ed, NUL-terminated, caller cm_frees) of
 * *len bytes. GPT-2: token bytes joined, invalid UTF-8 replaced by U+FFFD (errors='replace').
 * WordPiece: tokens joined by spaces with "##" continuations glued to the previous token
 * (HF's convert_tokens_to_string). Char: the characters joined. Errors: CM_ERR_INVALID_ARG (an id
 * out of range, naming it and its position), CM_ERR_OOM. Thread-safe. */
cm_status cm_tokenizer_decode(const cm_tokenizer *tok, const int32_t *ids, int64_t n, char **text, size_t *len);

/* BERT input for one or two segments: [CLS] a [SEP] (b [SEP]), truncated to max_len with HF's
 * "longest_first" rule (drop the last token of the longer segment, of b on a tie, until it fits),
 * then padded to max_len with [PAD]. Writes max_len ids to input_ids, token type ids (0 for [CLS],
 * a and its [SEP]; 1 for b and its [SEP]; 0 for padding) to token_type_ids, and 1/0 to
 * attention_mask (1 for real tokens); any of the last two may be NULL. *n_real (may be NULL) gets
 * the count of real tokens. b NULL means a single segment. Errors: CM_ERR_UNSUPPORTED (tokenizer
 * without [CLS]/[SEP]/[PAD]), CM_ERR_INVALID_ARG (max_len too small for the special tokens),
 * CM_ERR_OOM. Thread-safe. */
cm_status cm_tokenizer_encode_pair(const cm_tokenizer *tok, const char *a, size_t a_len, const char *b, size_t b_len,
                                   int64_t max_len, int32_t *input_ids, int32_t *token_type_ids,
                                   int32_t *attention_mask, int64_t *n_real);

/* ---------------------------------------------------------------------------------------------
 * Token files (llm.c layout)
 * ------------------------------------------------------------------------------------------- */

#define CM_TOKEN_FILE_MAGIC 20240520
#define CM_TOKEN_FILE_HEADER_INTS 256

typedef enum cm_token_width {
    CM_TOKEN_WIDTH_AUTO = 0, /* uint16 when every id < 65536, else uint32 */
    CM_TOKEN_WIDTH_U16 = 1,  /* header version 1 */
    CM_TOKEN_WIDTH_U32 = 2,  /* header version 2 */
} cm_token_width;

/* Writes ids[0, n) to `path` as a token file: into a temporary file in the same directory, fsync,
 * rename over `path`, fsync the directory — a crash leaves either the old file or the new one.
 * Errors: CM_ERR_INVALID_ARG (a negative id, an id >= 65536 with CM_TOKEN_WIDTH_U16, n over
 * INT32_MAX which the header cannot hold; names the value and position), CM_ERR_IO (names the path
 * and the system error), CM_ERR_OOM. */
cm_status cm_token_file_write(const char *path, const int32_t *ids, int64_t n, cm_token_width width);

/* ---------------------------------------------------------------------------------------------
 * SST-2 (GLUE TSV) sequence classification
 * ------------------------------------------------------------------------------------------- */

/* Opens a GLUE SST-2 TSV and tokenises every sentence now (get is a copy). Two layouts, told
 * apart by the header line:
 *   "sentence\tlabel"   (train.tsv, dev.tsv): label 0 or 1
 *   "index\tsentence"   (test.tsv, no labels): label -1 for every sample
 * A "\r\n" line end and a missing final newline are accepted; blank lines are skipped.
 * Each sample is [CLS] sentence [SEP], truncated to max_len, padded with [PAD]. Fields:
 *   "input_ids" i32 (max_len), "attention_mask" i32 (max_len), "token_type_ids" i32 (max_len, all 0),
 *   "label" i64 ().
 * `tok` must have [CLS], [SEP] and [PAD] (a WordPiece tokenizer); it is only used during this call.
 * n_tokens(i) is the count of real tokens. Errors: CM_ERR_IO (names the path), CM_ERR_FORMAT (an
 * unknown header, a line without the right fields, a bad label; names the file and line),
 * CM_ERR_INVALID_ARG (max_len < 3, a tokenizer without the special tokens), CM_ERR_OOM. */
cm_status cm_dataset_sst2_new(const char *tsv_path, const cm_tokenizer *tok, int64_t max_len, cm_dataset **out);

/* The same from memory: data[0, len) is the file's content and `name` is used in messages. Never
 * reads outside data (a fuzzing entry point). */
cm_status cm_dataset_sst2_new_from_memory(const char *data, size_t len, const char *name, const cm_tokenizer *tok,
                                          int64_t max_len, cm_dataset **out);

/* ---------------------------------------------------------------------------------------------
 * TSV sequence classification and text for language modelling
 *
 * The datasets behind `composer train`'s `dataset: {type: tsv | text, path, max_seq_len,
 * text_column, label_column}`. Files are read and tokenised when the dataset opens (errors name the
 * file and line); get() copies from memory and is thread-safe.
 * ------------------------------------------------------------------------------------------- */

typedef struct cm_tsv_config {
    int64_t max_len;          /* tokens per sample, [CLS] and [SEP] included (128) */
    const char *text_column;  /* the header's name of the text column ("sentence") */
    const char *label_column; /* the label column ("label"), integers >= 0; NULL: no labels */
    int64_t num_labels;       /* when > 0, labels must be below it (0) */
} cm_tsv_config;

/* max_len 128, text_column "sentence", label_column "label", num_labels 0. */
cm_tsv_config cm_tsv_config_default(void);

/* A tab-separated file whose first line names the columns (GLUE's layout; no quoting: a field runs
 * to the next tab). Each row is [CLS] text [SEP], truncated to max_len and padded with [PAD]:
 * fields "input_ids", "attention_mask", "token_type_ids" (i32, (max_len,)) and, with a label
 * column, "label" (i64, ()); n_tokens is the real tokens. Blank lines are skipped. cfg NULL = the
 * defaults. Errors: CM_ERR_IO (names the path), CM_ERR_FORMAT (no header, a column the header
 * lacks — naming the header —, a short row, a label that is not an integer below num_labels;
 * naming the file and line), CM_ERR_INVALID_ARG (max_len < 3, a tokenizer without [CLS] / [SEP] /
 * [PAD]), CM_ERR_OOM. */
cm_status cm_dataset_tsv_new(const char *path, const cm_tokenizer *tok, const cm_tsv_config *cfg, cm_dataset **out);

/* How texts become samples. */
typedef enum cm_text_layout {
    /* Masked LM, Hugging Face run_mlm's default (group_texts): each text is [CLS] text [SEP], the
     * texts are concatenated in order and cut into blocks of max_len tokens (the remainder is
     * dropped). Fields "input_ids", "attention_mask" (all 1), "token_type_ids" (0). */
    CM_TEXT_BLOCKS = 0,
    /* Masked LM, run_mlm --line_by_line: each text is one sample, [CLS] text [SEP] truncated to
     * max_len and padded with [PAD]; the same fields, attention_mask 0 on padding. */
    CM_TEXT_LINES = 1,
    /* Causal LM: the texts' tokens, each document followed by <|endoftext|> when the tokenizer has
     * it, cut into windows of max_len + 1 tokens sharing one token (as the token-file dataset):
     * "input_ids" = the first max_len, "labels" = the last max_len (next-token targets), i32. */
    CM_TEXT_CAUSAL = 2,
} cm_text_layout;

typedef struct cm_text_config {
    int64_t max_len;         /* tokens per sample (128) */
    cm_text_layout layout;   /* CM_TEXT_BLOCKS */
    const char *text_column; /* for .tsv files: the header's name of the text column ("sentence") */
} cm_text_config;

/* max_len 128, CM_TEXT_BLOCKS, text_column "sentence". */
cm_text_config cm_text_config_default(void);

/* Texts from n_paths files, in order: a path ending in ".tsv" gives one text per row (the
 * text_column of a header-named TSV, as cm_dataset_tsv_new reads it); any other file gives one
 * text per non-blank line (BLOCKS, LINES) or is one document (CAUSAL). The masked-LM layouts need
 * a tokenizer with [CLS], [SEP] and [PAD]. cfg NULL = the defaults. Errors: CM_ERR_IO,
 * CM_ERR_FORMAT (no text, too few tokens for one block, a TSV without the column; naming the
 * file), CM_ERR_INVALID_ARG (no paths, max_len out of range, a tokenizer without the specials a
 * layout needs), CM_ERR_OOM. */
cm_status cm_dataset_text_new(const char *const *paths, int n_paths, const cm_tokenizer *tok, const cm_text_config *cfg,
                              cm_dataset **out);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_TOKENIZER_H */
