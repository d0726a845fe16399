/*
 * composer/zoo_bert.h — BERT from the model zoo: any size (presets bert-base-uncased,
 * bert-large-uncased, bert-tiny, test-tiny), with a masked-LM head (BertForMaskedLM) or a
 * sequence-classification head (BertForSequenceClassification), Hugging Face's module tree and
 * parameter names, weights in and out as safetensors, and the MLM masking function.
 *
 * The module trees (nn.h) carry Hugging Face's names exactly, so a checkpoint loads by name:
 *   bert.embeddings.{word,position,token_type}_embeddings.weight, bert.embeddings.LayerNorm.*
 *   bert.encoder.layer.{i}.attention.self.{query,key,value}.*, .attention.output.dense.*,
 *     .attention.output.LayerNorm.*, .intermediate.dense.*, .output.dense.*, .output.LayerNorm.*
 *   classification: bert.pooler.dense.*, classifier.*   (logits = classifier(tanh(dense(h[:, 0]))))
 *   masked LM: cls.predictions.bias, cls.predictions.transform.{dense,LayerNorm}.*, and
 *     cls.predictions.decoder.weight, tied to bert.embeddings.word_embeddings.weight (one tensor,
 *     saved once under the embedding's name, as Hugging Face's save_pretrained does).
 * Math as Hugging Face: post-LN layers, exact (erf) GELU, word + position + token-type embeddings
 * then LayerNorm, the padding row of the word embeddings (pad_token_id) gets no gradient
 * (nn.Embedding's padding_idx). Padding is a key padding mask in the attention: padded keys get
 * exactly zero weight (Hugging Face adds finfo.min, which gives the same zero weight in f32).
 *
 * Batches (cm_model_batch fields, as the SST-2 dataset in tokenizer.h produces them):
 *   "input_ids"      (B, L) i32/i64   token ids (required)
 *   "attention_mask" (B, L) i32/i64/u8 1 = real token, 0 = padding (optional: all real)
 *   "token_type_ids" (B, L) i32/i64   segment ids (optional: all 0)
 *   "label"          (B)    i64       classification targets (regression: f32, num_labels = 1)
 *   "labels"         (B, L) i64       MLM targets: the original id at masked positions, -100
 *                                     elsewhere (cm_bert_mlm_mask makes them)
 * Outputs: logits (B, L, vocab_size) for the MLM model, (B, num_labels) for the classifier.
 *
 * Wrap units (flat buffers): "bert.embeddings" (the tied decoder weight lives here), one per
 * encoder layer ("bert.encoder.layer.3"), and "head" (pooler + classifier, or cls).
 *
 *     cm_bert_config cfg;
 *     cm_bert_config_preset("bert-base-uncased", &cfg);
 *     cfg.num_labels = 2;
 *     cm_model *model;
 *     if (cm_bert_classifier_new(&cfg, NULL, &model) != CM_OK)  // NULL rng: weights about to load
 *         fprintf(stderr, "%s\n", cm_last_error());
 *     // a BertForPreTraining checkpoint has cls.* heads and no classifier: load the rest
 *     const char *skip[] = {"cls.*", "classifier.*"};
 *     cm_load_opts lo = cm_load_opts_default();
 *     lo.ignore = skip, lo.n_ignore = 2;
 *     cm_load_report rep;
 *     if (cm_bert_load_safetensors(model, "bert-base-uncased/model.safetensors", &lo, &rep) != CM_OK)
 *         fprintf(stderr, "%s\n", cm_last_error());
 *     ...                                                       // train (trainer.h), then
 *     cm_bert_save_safetensors(model, "out/model.safetensors"); // loads in PyTorch / HF
 *     cm_model_free(model);
 *
 * Threading: as the module tree — one thread at a time. cm_bert_mlm_mask is reentrant.
 */
#ifndef COMPOSER_ZOO_BERT_H
#define COMPOSER_ZOO_BERT_H

#include <composer/model.h>
#include <composer/tokenizer.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Hugging Face's BertConfig fields (same names, same defaults: bert-base-uncased). Plain data. */
typedef struct cm_bert_config {
    int64_t vocab_size;                 /* 30522 */
    int64_t hidden_size;                /* 768 */
    int64_t num_hidden_layers;          /* 12 */
    int64_t num_attention_heads;        /* 12; hidden_size divisible by it */
    int64_t intermediate_size;          /* 3072 */
    cm_activation hidden_act;           /* CM_ACT_GELU ("gelu", the erf form) */
    float hidden_dropout_prob;          /* 0.1 */
    float attention_probs_dropout_prob; /* 0.1 */
    int64_t max_position_embeddings;    /* 512: the longest sequence */
    int64_t type_vocab_size;            /* 2 */
    float layer_norm_eps;               /* 1e-12 */
    int64_t pad_token_id;               /* 0; its embedding row gets no gradient (-1: none) */
    int64_t num_labels;                 /* 2 (classifier only; 1 = regression with MSE) */
    float classifier_dropout;           /* -1 = hidden_dropout_prob (HF's None) */
    float initializer_range;            /* 0.02: weights N(0, 0.02), biases 0, LayerNorm 1/0 */
} cm_bert_config;

/* bert-base-uncased (the values above). */
cm_bert_config cm_bert_config_default(void);

/* A named configuration into *out:
 *   "bert-base-uncased"  12 layers, hidden 768, 12 heads, intermediate 3072 (110M parameters)
 *   "bert-large-uncased" 24 layers, hidden 1024, 16 heads, intermediate 4096 (335M)
 *   "bert-tiny"          2 layers, hidden 128, 2 heads, intermediate 512 (google/bert_uncased_L-2_H-128_A-2)
 *   "test-tiny"          vocab 100, 2 layers, hidden 32, 4 heads, intermediate 64, max_pos 32
 *                        (the golden tests' size)
 * Errors: CM_ERR_NOT_FOUND for an unknown name (the message lists the names), CM_ERR_INVALID_ARG
 * for NULL arguments. */
cm_status cm_bert_config_preset(const char *name, cm_bert_config *out);

/* Checks a configuration: CM_ERR_INVALID_ARG naming the first bad field and its value. */
cm_status cm_bert_config_check(const cm_bert_config *cfg);

/* Parameters of BertForMaskedLM (mlm = true, tied decoder counted once) or
 * BertForSequenceClassification for cfg, without building it (0 for an invalid config). */
int64_t cm_bert_count_params(const cm_bert_config *cfg, bool mlm);

/* ---------------------------------------------------------------------------------------------
 * Models
 * ------------------------------------------------------------------------------------------- */

/* A BERT with a masked-LM head ("BertForMaskedLM"): forward → logits (B, L, vocab_size); loss =
 * the mean cross-entropy over positions whose "labels" are not -100 (NaN when none is); metrics
 * in training and evaluation: LanguageCrossEntropy and MulticlassAccuracy (the masked accuracy),
 * both over "labels". rng initialises the weights (advanced in place); NULL leaves them zero
 * (LayerNorm weights one) for a load. The module tree is finalized, in training mode; dropout
 * streams come from cm_module_set_seed. cfg is copied. On success the caller owns *out (free with
 * cm_model_free). Errors: CM_ERR_INVALID_ARG (bad config, naming the field), CM_ERR_OOM. */
cm_status cm_bert_mlm_new(const cm_bert_config *cfg, cm_rng *rng, cm_model **out);

/* A BERT with a sequence-classification head ("BertForSequenceClassification"): forward → logits
 * (B, num_labels) from the pooled [CLS] state; loss = the mean cross-entropy against "label"
 * (num_labels >= 2) or the mean squared error against "label" as f32 (num_labels = 1, the logit
 * squeezed); metrics: MulticlassAccuracy in training, MulticlassAccuracy and CrossEntropy in
 * evaluation (none for regression). Otherwise as cm_bert_mlm_new. */
cm_status cm_bert_classifier_new(const cm_bert_config *cfg, cm_rng *rng, cm_model **out);

/* The configuration of a model made by the two constructors above (borrowed; valid while the
 * model lives), or NULL for any other model. */
const cm_bert_config *cm_bert_model_config(const cm_model *m);

/* Sparse MLM logits (off by default): when on, forward on a batch with "labels" runs the MLM head
 * only at the positions whose label is not -100 and returns their logits, (n, vocab_size) in
 * row-major order of (B, L), instead of (B, L, vocab_size); the loss and both metrics read them
 * against those labels and give the same values as the dense logits (to rounding), for a
 * fraction of the decoder's cost (MosaicBERT computes its MLM head the same way). A batch without
 * labels, or whose labels select nothing, gets the dense logits. `composer train` turns it on for
 * masked_lm. Errors: CM_ERR_INVALID_ARG (not a BertForMaskedLM zoo model). */
cm_status cm_bert_mlm_sparse_logits(cm_model *m, bool on);

/* FLOPs of forward + backward for one sequence of L tokens (3 × the forward's multiply-adds × 2):
 * every matmul of the embeddings-to-head path, the attention scores and weighted sums (L² terms),
 * and the head (the MLM decoder over all L positions, or the pooler and classifier). */
double cm_bert_flops_per_sequence(const cm_bert_config *cfg, bool mlm, int64_t L);

/* ---------------------------------------------------------------------------------------------
 * Weights
 * ------------------------------------------------------------------------------------------- */

/* Loads Hugging Face-named weights into a model from the constructors above, with
 * cm_module_load_safetensors (strict by default: missing and unexpected names are listed in the
 * error and in *report) plus Hugging Face's conventions:
 * - bert.embeddings.position_ids and bert.embeddings.token_type_ids (buffers) are ignored;
 * - cls.predictions.decoder.weight is the tied word embedding (either name loads it);
 *   cls.predictions.decoder.bias is cls.predictions.bias;
 * - old TensorFlow-converted names LayerNorm.gamma / LayerNorm.beta read as weight / bias.
 * opts (NULL = cm_load_opts_default()) adds its own ignore patterns and renaming (applied before
 * the conventions). A BertForPreTraining checkpoint into the MLM model needs "cls.seq_relationship.*"
 * and "bert.pooler.*" ignored (or strict = false); into the classifier "cls.*" and, for a
 * fresh head, "classifier.*". Errors: CM_ERR_INVALID_ARG (not a BERT zoo model, or too many
 * ignore patterns: at most 60), and cm_module_load_safetensors's (CM_ERR_NOT_FOUND,
 * CM_ERR_SHAPE, CM_ERR_IO, CM_ERR_FORMAT, CM_ERR_DTYPE); on error nothing is changed. */
cm_status cm_bert_load_safetensors(cm_model *m, const char *path, const cm_load_opts *opts, cm_load_report *report);

/* Writes the model's parameters with Hugging Face's names to a safetensors file that PyTorch
 * (load_state_dict(strict=True) on a BertForMaskedLM / BertForSequenceClassification) and
 * Hugging Face's from_pretrained read: the MLM model also writes the tied aliases
 * cls.predictions.decoder.weight and cls.predictions.decoder.bias, which a strict torch
 * load_state_dict expects. Metadata {"format": "pt"}. Written atomically. Errors:
 * CM_ERR_INVALID_ARG (not a BERT zoo model), CM_ERR_IO naming the path, CM_ERR_OOM. */
cm_status cm_bert_save_safetensors(cm_model *m, const char *path);

/* ---------------------------------------------------------------------------------------------
 * Masked-LM masking (BERT's recipe, as Hugging Face's DataCollatorForLanguageModeling)
 * ------------------------------------------------------------------------------------------- */

typedef struct cm_bert_mlm_mask_config {
    float mlm_probability;      /* 0.15: the share of tokens selected for prediction */
    float mask_replace_prob;    /* 0.8: of the selected, replaced by [MASK] */
    float random_replace_prob;  /* 0.1: of the selected, replaced by a random id in [0, vocab_size);
                                   the rest (0.1) stay unchanged */
    int32_t mask_token_id;      /* 103 in bert-base-uncased ([MASK]) */
    int64_t vocab_size;         /* 30522 */
    int32_t special_ids[8];     /* never selected ([CLS], [SEP], [PAD], ...); unused entries -1 */
    uint64_t seed;              /* with the sample index, fixes every draw */
} cm_bert_mlm_mask_config;

/* mlm_probability 0.15, 0.8 / 0.1, mask_token_id 103, vocab_size 30522, special ids 101 ([CLS]),
 * 102 ([SEP]) and 0 ([PAD]) of bert-base-uncased's vocabulary, seed 0. */
cm_bert_mlm_mask_config cm_bert_mlm_mask_config_default(void);

/* The defaults with mask_token_id, vocab_size and the special ids ([CLS], [SEP], [PAD], [UNK]) of
 * a tokenizer into *out. Errors: CM_ERR_INVALID_ARG (NULL arguments, a tokenizer without [MASK]). */
cm_status cm_bert_mlm_mask_config_from_tokenizer(const cm_tokenizer *tok, uint64_t seed, cm_bert_mlm_mask_config *out);

/* Masks one sequence in place, deterministically from (cfg->seed, sample_index) (Philox stream
 * sample_index), so a sample is masked the same way whatever the batch, worker or rank:
 * each position whose id is not special and whose attention_mask (may be NULL) is nonzero is
 * selected with probability mlm_probability; labels[i] gets the original id at a selected
 * position and -100 elsewhere; a selected id becomes [MASK] with probability mask_replace_prob,
 * a random id with probability random_replace_prob, else stays. ids (L) and labels (L) are the
 * caller's. *n_selected (may be NULL) gets the count. Errors: CM_ERR_INVALID_ARG (NULL arrays,
 * L < 0, probabilities outside [0, 1] or mask + random > 1, vocab_size < 1, mask_token_id outside
 * the vocabulary). */
cm_status cm_bert_mlm_mask(const cm_bert_mlm_mask_config *cfg, uint64_t sample_index, int64_t L, int32_t *ids,
                           const int32_t *attention_mask, int64_t *labels, int64_t *n_selected);

/* The batch form, as a batch transform: input_ids (B, L) i32 or i64, contiguous, masked in place;
 * attention_mask (B, L) i32 or NULL; labels (B, L) i64, contiguous, written. Row b uses sample
 * index first_sample_index + b. Errors: as cm_bert_mlm_mask, CM_ERR_SHAPE / CM_ERR_DTYPE naming
 * the tensor. */
cm_status cm_bert_mlm_mask_batch(const cm_bert_mlm_mask_config *cfg, uint64_t first_sample_index,
                                 cm_tensor *input_ids, const cm_tensor *attention_mask, cm_tensor *labels);

/* A masked-LM dataset over `inner` (any dataset with "input_ids" i32 (L,) and optionally
 * "attention_mask" i32 (L,): cm_dataset_text_new, cm_dataset_tsv_new, SST-2): every sample's
 * input_ids are masked by cm_bert_mlm_mask (Hugging Face DataCollatorForLanguageModeling's
 * 80/10/10 rule, mlm_probability, special tokens and padding never selected) and a field
 * "labels" i64 (L,) is added (the original id at selected positions, -100 elsewhere), so BERT's
 * MLM loss and metrics read it. The masks are a pure function of (cfg->seed, the loader's seed,
 * the epoch, the sample index): new masks every training epoch, as the collator re-masks each
 * time it sees a sample, and the same on every worker, rank and resumption; evaluation
 * (ctx->training false) masks as epoch 0, so every evaluation scores the same positions. On
 * success the new dataset owns inner (cm_dataset_free frees both); on failure inner stays the
 * caller's. Errors: CM_ERR_INVALID_ARG (bad cfg as cm_bert_mlm_mask, no "input_ids", a field
 * called "labels" already, wrong dtypes), CM_ERR_OOM. get is thread-safe when inner's is. */
cm_status cm_bert_mlm_dataset_new(cm_dataset *inner, const cm_bert_mlm_mask_config *cfg, cm_dataset **out);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_ZOO_BERT_H */
