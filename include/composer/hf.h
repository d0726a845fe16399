/*
 * composer/hf.h — Hugging Face pretrained folders in and out: BERT and GPT-2 models built from a
 * folder's config.json with its weights (model.safetensors, or shards with
 * model.safetensors.index.json) and its tokenizer; the same folder layout written back so that
 * transformers' from_pretrained(DIR) loads it; and the Composer-style integration that keeps the
 * folder's config and tokenizer inside every checkpoint, so a checkpoint exports to a folder.
 *
 * A pretrained folder, as the hub and save_pretrained write it:
 *   config.json                 the architecture and its sizes (see "config.json" below)
 *   model.safetensors           weights by Hugging Face's names, or model-0000k-of-0000N.safetensors
 *                               with model.safetensors.index.json (pytorch_model.bin is not read:
 *                               convert it to safetensors)
 *   vocab.txt                   BERT's WordPiece vocabulary, or
 *   vocab.json + merges.txt     GPT-2's byte-level BPE, or
 *   tokenizer.json              a fast tokenizer (model type WordPiece or BPE) holding either
 *   tokenizer_config.json       optional: do_lower_case, model_max_length, special tokens
 *   special_tokens_map.json     optional: special tokens
 *
 *     cm_hf_load_opts o = cm_hf_load_opts_default();
 *     o.task = CM_HF_TASK_SEQUENCE_CLASSIFICATION;
 *     o.num_labels = 2;
 *     cm_model *model;
 *     cm_hf_load_report rep;
 *     if (cm_hf_load("bert-base-uncased", &o, &model, &rep) != CM_OK) {   // a downloaded folder
 *         fprintf(stderr, "%s\n", cm_last_error());
 *         return 1;
 *     }
 *     // rep.new_names: "bert.pooler.dense.weight, ..., classifier.bias" (initialised, announced)
 *     cm_tokenizer *tok;
 *     cm_hf_tokenizer_info ti;
 *     cm_hf_tokenizer_load("bert-base-uncased", &tok, &ti);              // WordPiece, lower case
 *     ...                                                                // fine-tune (trainer.h)
 *     cm_hf_save(model, tok, &ti, "my-sst2-model");                      // from_pretrained loads it
 *
 * Models. model_type "bert" builds the zoo's BERT (zoo_bert.h) with the head of the task:
 * masked_lm → BertForMaskedLM, sequence_classification → BertForSequenceClassification; "gpt2"
 * builds GPT2LMHeadModel (zoo_gpt2.h) for causal_lm. The folder's architecture may be any class
 * of that family (BertForPreTraining, BertModel, GPT2Model, ...): weights load by name.
 *
 * Weights load strictly, as transformers does, with its announcements: every weight of the
 * model's body must be in the folder and every weight of the folder must be used, else
 * CM_ERR_NOT_FOUND lists the missing and the unexpected names. Two exceptions, each logged at
 * warn level in transformers' words and listed in the report: a head of the task that the folder
 * lacks as a whole (the classifier and pooler of a BERT pretrained with MLM; the MLM head of a bare
 * BertModel) is "newly initialized" — N(0, initializer_range) weights, zero biases, from
 * opts.seed — and weights of another head of the same family (cls.* of a BertForPreTraining
 * loaded for classification, the pooler loaded for MLM) are "not used". Tied weights are as
 * transformers ties them: cls.predictions.decoder.{weight,bias} are the word embeddings and
 * cls.predictions.bias, lm_head.weight is transformer.wte.weight; either name loads them.
 *
 * config.json. Fields read — BERT: vocab_size, hidden_size, num_hidden_layers,
 * num_attention_heads, intermediate_size, hidden_act, hidden_dropout_prob,
 * attention_probs_dropout_prob, max_position_embeddings, type_vocab_size, initializer_range,
 * layer_norm_eps, pad_token_id, classifier_dropout, num_labels / id2label, problem_type;
 * GPT-2: vocab_size, n_positions, n_embd, n_layer, n_head, n_inner, activation_function,
 * resid_pdrop, embd_pdrop, attn_pdrop, layer_norm_epsilon, initializer_range,
 * tie_word_embeddings. Activations: gelu, gelu_new, gelu_pytorch_tanh, gelu_fast, relu, silu,
 * swish, tanh, sigmoid, linear. Fields that do not change the computation (transformers_version,
 * torch_dtype, use_cache, token ids, generation settings, label names, ...) are accepted and
 * ignored. Fields whose non-default value we do not implement (position_embedding_type other than
 * "absolute", is_decoder, add_cross_attention, scale_attn_by_inverse_layer_idx, ...) and fields we
 * do not know are CM_ERR_UNSUPPORTED naming the field, its value and the file; so is an unknown
 * model_type or architecture (naming it and listing the supported ones).
 *
 * Written folders (cm_hf_save, cm_hf_export_checkpoint) hold config.json (the fields above,
 * architectures = the model's class, torch_dtype float32), model.safetensors (f32, Hugging Face
 * names, tied weights stored once as save_pretrained stores them, metadata {"format": "pt"}) and
 * the tokenizer's files (vocab.txt, or vocab.json + merges.txt, with tokenizer_config.json and
 * special_tokens_map.json), every file written atomically.
 *
 * Threading: the functions are reentrant; a model or tokenizer passed in is used by one thread.
 */
#ifndef COMPOSER_HF_H
#define COMPOSER_HF_H

#include <composer/model.h>
#include <composer/tokenizer.h>
#include <composer/trainer.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What a folder's tokenizer_config.json (and tokenizer files) said (cm_hf_tokenizer_load). */
typedef struct cm_hf_tokenizer_info {
    char tokenizer_class[64]; /* "BertTokenizer", "GPT2TokenizerFast", ... ("" when unsaid) */
    int64_t model_max_length; /* the longest input the model takes; -1 when the folder does not say */
    bool do_lower_case;       /* WordPiece: lower-case and strip accents (BERT uncased) */
} cm_hf_tokenizer_info;

/* ---------------------------------------------------------------------------------------------
 * Models
 * ------------------------------------------------------------------------------------------- */

/* llm-foundry's / transformers' task names. */
typedef enum cm_hf_task {
    CM_HF_TASK_MASKED_LM = 0,               /* "masked_lm": BertForMaskedLM */
    CM_HF_TASK_SEQUENCE_CLASSIFICATION = 1, /* "sequence_classification": BertForSequenceClassification */
    CM_HF_TASK_CAUSAL_LM = 2,               /* "causal_lm": GPT2LMHeadModel */
} cm_hf_task;

/* "masked_lm", "sequence_classification", "causal_lm" ("?" for other values). */
const char *cm_hf_task_name(cm_hf_task task);
/* The task called s. Errors: CM_ERR_INVALID_ARG naming s, the closest name and the three. */
cm_status cm_hf_task_parse(const char *s, cm_hf_task *out);

typedef struct cm_hf_load_opts {
    cm_hf_task task;              /* CM_HF_TASK_MASKED_LM */
    int64_t num_labels;           /* classification: 0 = config.json's (num_labels, or the size of
                                     id2label), else 2 (transformers' default) */
    bool pretrained;              /* true: load the weights; false: config.json only, every weight
                                     initialised from seed (llm-foundry's pretrained: false) */
    uint64_t seed;                /* initialises new heads (everything when !pretrained); 0 */
    const char *config_overrides; /* NULL, or a JSON object whose fields replace config.json's
                                     (llm-foundry's config_overrides), checked like them */
} cm_hf_load_opts;

/* task masked_lm, num_labels 0, pretrained true, seed 0, no overrides. */
cm_hf_load_opts cm_hf_load_opts_default(void);

/* What cm_hf_load did. Name lists are comma-separated, truncated with ", ..." when long. */
typedef struct cm_hf_load_report {
    char architecture[96]; /* config.json's architectures[0] (or its model_type when absent) */
    char model_class[64];  /* the class built: "BertForSequenceClassification", ... */
    int64_t n_loaded;      /* tensors copied from the folder */
    int64_t n_new;         /* model tensors newly initialised (a head the folder lacks) */
    int64_t n_unused;      /* folder tensors not used (another head of the family) */
    char new_names[1024];
    char unused_names[1024];
} cm_hf_load_report;

/* Builds the model a pretrained folder describes for opts->task (NULL = the defaults) and loads
 * its weights, as described in the overview. The model is finalized, in training mode; the caller
 * owns *out (cm_model_free). report may be NULL. Errors, each naming the folder and the file:
 * CM_ERR_INVALID_ARG (NULL arguments, a task the architecture does not have, bad opts),
 * CM_ERR_NOT_FOUND (no config.json; no weights file when pretrained; missing or unexpected
 * weights: the message lists them), CM_ERR_FORMAT (config.json or config_overrides not a JSON
 * object, a field of the wrong type, a truncated or malformed safetensors file or index),
 * CM_ERR_UNSUPPORTED (unknown model_type, architecture or field, or a value we do not implement),
 * CM_ERR_SHAPE (a weight whose shape differs from what config.json says: both shapes named),
 * CM_ERR_IO, CM_ERR_OOM. On error *out is NULL. */
cm_status cm_hf_load(const char *dir, const cm_hf_load_opts *opts, cm_model **out, cm_hf_load_report *report);

/* config.json for a BERT or GPT-2 zoo model (zoo_bert.h, zoo_gpt2.h: made by cm_hf_load or by the
 * zoo constructors) as a new NUL-terminated string in *json (cm_alloc'ed; the caller cm_frees it):
 * the fields cm_hf_load reads, architectures = [the model's class], model_type, torch_dtype
 * "float32"; a classifier's id2label / label2id (LABEL_0, ...); GPT-2's bos/eos_token_id when
 * eos_token_id >= 0. Errors: CM_ERR_INVALID_ARG (not a BERT or GPT-2 zoo model),
 * CM_ERR_UNSUPPORTED (a configuration with no Hugging Face equivalent: GPT-2 without biases),
 * CM_ERR_OOM. */
cm_status cm_hf_config_json(const cm_model *m, int64_t eos_token_id, char **json);

/* Writes the folder `dir` (created if missing, with parents): config.json, model.safetensors
 * and, when tok is not NULL, the tokenizer files (cm_hf_tokenizer_save with ti's
 * model_max_length; ti may be NULL: then model_max_length is the model's maximum positions).
 * Existing files of those names are replaced; other files are left alone. A model changed by
 * model surgery that config.json cannot express — attention with ALiBi, modules a plain model of
 * its class does not have (gated linear units, factorized layers) — is refused and nothing is
 * written: the folder would load back, here and in transformers, as another model. Such a model
 * is fine-tuned from its Composer checkpoint instead (load_path with load_weights_only and
 * load_strict_model_weights = false: the checkpoint re-applies the surgery), as MosaicBERT's
 * fine-tuning starts from its pretraining checkpoint. Low-precision norms and GyroDropout change
 * no weights and are written. Errors: cm_hf_config_json's, cm_hf_tokenizer_save's,
 * CM_ERR_UNSUPPORTED (such surgery: the module and the fix named), CM_ERR_IO naming the path,
 * CM_ERR_OOM. */
cm_status cm_hf_save(cm_model *m, const cm_tokenizer *tok, const cm_hf_tokenizer_info *ti, const char *dir);

/* ---------------------------------------------------------------------------------------------
 * Tokenizers
 * ------------------------------------------------------------------------------------------- */

/* Loads the tokenizer of a pretrained folder: vocab.txt (WordPiece), else vocab.json + merges.txt
 * (GPT-2 byte-level BPE), else tokenizer.json (a fast tokenizer whose model is WordPiece with
 * BertNormalizer / BertPreTokenizer, or byte-level BPE). tokenizer_config.json and
 * special_tokens_map.json are honoured: do_lower_case (else tokenizer.json's normalizer, else
 * true for WordPiece), model_max_length, and the special tokens unk/cls/sep/pad/mask (BERT) and
 * eos (GPT-2) as strings or {"content": ...} objects, which must be in the vocabulary. Settings we
 * do not implement (strip_accents different from do_lower_case, tokenize_chinese_chars false,
 * add_prefix_space true, another normalizer or pre-tokenizer, BPE dropout) are
 * CM_ERR_UNSUPPORTED naming the setting and the file. info may be NULL. Errors: CM_ERR_NOT_FOUND
 * (none of the tokenizer files: the names are listed), CM_ERR_FORMAT (bad JSON, a bad vocabulary:
 * naming the file), CM_ERR_UNSUPPORTED, CM_ERR_IO, CM_ERR_OOM. */
cm_status cm_hf_tokenizer_load(const char *dir, cm_tokenizer **out, cm_hf_tokenizer_info *info);

/* One file of a folder, in memory. */
typedef struct cm_hf_file {
    char name[64]; /* "vocab.txt" */
    char *data;    /* cm_alloc'ed, NUL-terminated */
    size_t len;
} cm_hf_file;

/* The tokenizer's files as save_pretrained writes them for the slow tokenizer: WordPiece →
 * vocab.txt, tokenizer_config.json (BertTokenizer, do_lower_case, model_max_length, the special
 * tokens), special_tokens_map.json; GPT-2 → vocab.json, merges.txt, tokenizer_config.json
 * (GPT2Tokenizer), special_tokens_map.json. model_max_length < 0 writes transformers' "no limit"
 * (1e30, as from_pretrained writes it). *files (an array of *n, cm_alloc'ed) is freed with
 * cm_hf_files_free. Errors: CM_ERR_UNSUPPORTED (a character-level tokenizer: it has no Hugging
 * Face form), CM_ERR_OOM. */
cm_status cm_hf_tokenizer_files(const cm_tokenizer *tok, int64_t model_max_length, cm_hf_file **files, int *n);
void cm_hf_files_free(cm_hf_file *files, int n); /* NULL is a no-op */

/* cm_hf_tokenizer_files written into dir (which must exist), each file atomically. Errors:
 * cm_hf_tokenizer_files's, CM_ERR_IO naming the path. */
cm_status cm_hf_tokenizer_save(const cm_tokenizer *tok, int64_t model_max_length, const char *dir);

/* ---------------------------------------------------------------------------------------------
 * Checkpoints: the HuggingFaceCheckpointer callback and export
 * ------------------------------------------------------------------------------------------- */

typedef struct cm_hf_checkpointer_config {
    cm_model *model;          /* the run's BERT or GPT-2 zoo model (borrowed; required) */
    const cm_tokenizer *tokenizer; /* borrowed for the call to cm_hf_checkpointer_new; may be NULL */
    int64_t model_max_length; /* for tokenizer_config.json; -1 = the model's maximum positions */
    const char *save_folder;  /* NULL: only record the folder's config and tokenizer in checkpoints;
                                 else write folders into <save_folder>/huggingface/ */
    cm_time save_interval;    /* how often to write a folder (1dur: at the end of training) */
    const char *huggingface_folder_name; /* "ba{batch}": the folder's name; {epoch} {batch}
                                            {sample} {token} {run_name} are filled in */
} cm_hf_checkpointer_config;

/* model NULL, tokenizer NULL, model_max_length -1, save_folder NULL, save_interval 1dur,
 * huggingface_folder_name "ba{batch}". */
cm_hf_checkpointer_config cm_hf_checkpointer_config_default(void);

/* llm-foundry's HuggingFaceCheckpointer: a callback ("HuggingFaceCheckpointer") that
 * - puts the model's config.json and the tokenizer's files into every checkpoint the trainer
 *   saves (its state in the manifest: {"task": ..., "config": {...}, "tokenizer": {"<file>":
 *   "<content>", ...}}), as Composer keeps state["integrations"]["huggingface"], so
 *   cm_hf_export_checkpoint (composer ckpt export --hf) can write the folder later;
 * - with save_folder, writes a pretrained folder (cm_hf_save) into
 *   <save_folder>/huggingface/<huggingface_folder_name> every save_interval (ba, ep, sp, tok;
 *   dur: at the end) and at the end of training if the last batch was not written — on rank 0,
 *   replacing a folder of the same name. Not with FULL_SHARD (parameters are sharded at rest), and
 *   not for a model that cm_hf_save refuses (ALiBi, gated linear units: checked at FIT_START, after
 *   the surgery ran, so the run stops before its first batch).
 * The config and tokenizer files are taken now (the tokenizer is not kept). On success the caller
 * owns *out until it registers it (cm_callback_plugin_free otherwise). Errors: CM_ERR_INVALID_ARG
 * (no model, not a BERT / GPT-2 zoo model, a save_interval unit other than ba, ep, sp, tok, dur, a
 * bad folder name pattern), cm_hf_config_json's and cm_hf_tokenizer_files's, CM_ERR_OOM. At run
 * time a failed write stops training with the error naming the folder. */
cm_status cm_hf_checkpointer_new(const cm_hf_checkpointer_config *cfg, cm_callback_plugin *out);

/* Writes the pretrained folder of a checkpoint (a checkpoint directory, or a save folder whose
 * `latest` pointer names one; monolithic or sharded) into dir (created if missing): the model
 * weights, verified against the manifest's checksums and assembled whole (cm_checkpoint_export_model),
 * as model.safetensors, and config.json and the tokenizer files the HuggingFaceCheckpointer
 * recorded in the manifest. The checkpoint's tensor names must be the config's model's names (they
 * are checked by building the model and loading the folder back: a folder that would not load is
 * removed again and the error says why). Errors: cm_checkpoint_open's and _verify's,
 * CM_ERR_NOT_FOUND (a checkpoint without HuggingFaceCheckpointer state: trained from
 * `model: {name: hf}`?), CM_ERR_UNSUPPORTED (the manifest lists a required_on_load surgery a folder
 * cannot express, as cm_hf_save refuses: the algorithm named, with the load_path settings that
 * fine-tune from the checkpoint instead), cm_hf_load's, CM_ERR_IO naming the path, CM_ERR_OOM. */
cm_status cm_hf_export_checkpoint(const char *checkpoint, const char *dir);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_HF_H */
