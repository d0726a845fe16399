/*
 * composer/zoo_gpt2.h — GPT-2 of any size as a trainable model, Hugging Face weights in and out,
 * and text generation with a KV cache.
 *
 * The module tree is Hugging Face's GPT2LMHeadModel, so parameter names equal the checkpoint keys:
 *
 *   transformer.wte.weight (V, C)         token embedding        ─┐ unit "embeddings"
 *   transformer.wpe.weight (P, C)         position embedding     ─┘
 *   transformer.h.{i}.ln_1.{weight,bias}  (C)                    ─┐
 *   transformer.h.{i}.attn.c_attn.{weight (C, 3C), bias (3C)}     │ unit "transformer.h.{i}"
 *   transformer.h.{i}.attn.c_proj.{weight (C, C), bias}           │ (a GPT2Block: pre-LN,
 *   transformer.h.{i}.ln_2.{weight,bias}                          │  Conv1D (in, out) weights,
 *   transformer.h.{i}.mlp.c_fc.{weight (C, 4C), bias (4C)}        │  tanh GELU)
 *   transformer.h.{i}.mlp.c_proj.{weight (4C, C), bias (C)}      ─┘
 *   transformer.ln_f.{weight,bias}        (C)                      unit "transformer.ln_f"
 *   lm_head.weight (V, C)                 tied to wte (not a separate parameter) unless
 *                                         tie_word_embeddings is false (then unit "lm_head")
 *
 * As a cm_model (model.h) it reads the batch fields "input_ids" (B, T) i32/i64 and "labels" (B, T)
 * — exactly what the token-file dataset (datasets.h) produces: labels are the *next-token targets*
 * at each position (already shifted, as llm.c/nanoGPT; not Hugging Face's labels = input_ids), and
 * positions whose label is -100 are ignored. An optional field "attention_mask" (B, T) (nonzero =
 * real token) masks padded keys. forward gives the logits (B, T, V); loss is the mean cross-entropy
 * over the non-ignored positions (NaN when every label is -100, as PyTorch); the metrics are
 * LanguageCrossEntropy and LanguagePerplexity, in training and evaluation.
 *
 *     cm_gpt2_config cfg;
 *     if (cm_gpt2_config_preset("shakespeare-char", &cfg) != CM_OK) fprintf(stderr, "%s\n", cm_last_error());
 *     cm_rng rng = cm_rng_init(1337, 0);
 *     cm_model *gpt;
 *     cm_gpt2_new(&cfg, &rng, &gpt);                           // initialised as GPT-2, finalized
 *     ...                                                      // train with the trainer
 *     int64_t prompt[1] = {0}, out[200], n_out;
 *     cm_gpt2_generate_config gc = cm_gpt2_generate_config_default();
 *     gc.temperature = 0.8f, gc.top_k = 200, gc.seed = 42;
 *     cm_gpt2_generate(gpt, prompt, 1, 200, &gc, out, &n_out); // 200 new token ids in out
 *     cm_gpt2_save_safetensors(gpt, "ckpt/model.safetensors"); // Hugging Face names
 *     cm_model_free(gpt);
 *
 * Loading Hugging Face weights: make the model with rng NULL (no initialisation) and call
 * cm_gpt2_load_safetensors, which accepts both GPT2LMHeadModel files ("transformer.h.0...") and
 * GPT2Model files ("h.0...", as the hub's gpt2/model.safetensors), skips the attention-mask
 * buffers (attn.bias, attn.masked_bias) and is strict otherwise.
 *
 * Threading: as the module tree — a model belongs to one thread at a time.
 */
#ifndef COMPOSER_ZOO_GPT2_H
#define COMPOSER_ZOO_GPT2_H

#include <composer/model.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Configuration
 * ------------------------------------------------------------------------------------------- */

/* Plain data, as Hugging Face's GPT2Config. */
typedef struct cm_gpt2_config {
    int64_t vocab_size;       /* V (50257) */
    int64_t n_positions;      /* P, the block size: the longest sequence (1024) */
    int64_t n_embd;           /* C (768) */
    int64_t n_layer;          /* L (12) */
    int64_t n_head;           /* H (12); n_embd must be a multiple of it */
    float embd_pdrop;         /* dropout after wte + wpe (0.1) */
    float attn_pdrop;         /* dropout on the attention probabilities (0.1) */
    float resid_pdrop;        /* dropout after each block's c_proj projections (0.1) */
    float layer_norm_eps;     /* 1e-5 */
    cm_activation activation; /* CM_ACT_GELU_TANH (Hugging Face's "gelu_new") */
    bool tie_word_embeddings; /* lm_head.weight is transformer.wte.weight (true) */
    bool bias;                /* biases in the Conv1D projections (true; LayerNorms always have one) */
    float initializer_range;  /* std of the N(0, std) weight init (0.02) */
} cm_gpt2_config;

/* The "gpt2" (124M) configuration with Hugging Face's defaults (dropouts 0.1). */
cm_gpt2_config cm_gpt2_config_default(void);

/* Fills *out with a named preset (the defaults with these sizes):
 *   "gpt2"             V 50257, P 1024, C 768,  L 12, H 12  (124,439,808 parameters)
 *   "gpt2-medium"      V 50257, P 1024, C 1024, L 24, H 16  (354,823,168)
 *   "gpt2-large"       V 50257, P 1024, C 1280, L 36, H 20  (774,030,080)
 *   "gpt2-xl"          V 50257, P 1024, C 1600, L 48, H 25  (1,557,611,200)
 *   "shakespeare-char" V 65,    P 256,  C 384,  L 6,  H 6, dropout 0.2 (nanoGPT's character model)
 *   "tiny"             V 96,    P 32,   C 32,   L 2,  H 4, dropout 0 (tests and smoke runs)
 * Errors: CM_ERR_NOT_FOUND for an unknown name, naming the closest preset and listing them all;
 * CM_ERR_INVALID_ARG for NULL arguments. Thread-safe. */
cm_status cm_gpt2_config_preset(const char *name, cm_gpt2_config *out);

/* The preset names, comma-separated ("gpt2, gpt2-medium, ..."). Static storage. */
const char *cm_gpt2_preset_names(void);

/* Checks a configuration: every size positive, n_embd divisible by n_head, dropouts in [0, 1],
 * layer_norm_eps ≥ 0, a known activation, initializer_range ≥ 0. Errors: CM_ERR_INVALID_ARG
 * naming the field and its value. */
cm_status cm_gpt2_config_check(const cm_gpt2_config *cfg);

/* The number of parameters the configuration gives, computed without building the model (a tied
 * lm_head counted once, as PyTorch's parameters()); with non_embedding the position embedding is
 * left out (nanoGPT's get_num_params, the N of the 6·N FLOPs estimate). -1 for an invalid
 * configuration. */
int64_t cm_gpt2_config_n_params(const cm_gpt2_config *cfg, bool non_embedding);

/* The "__metadata__" key under which cm_gpt2_save_safetensors records n_head (as decimal text), the
 * one size the tensors' shapes do not tell. */
#define CM_GPT2_N_HEAD_METADATA_KEY "gpt2_n_head"

/* Infers a configuration from a GPT-2 checkpoint's tensor shapes: vocab_size and n_embd from wte,
 * n_positions from wpe, n_layer from the highest block index, bias from h.0.attn.c_attn.bias;
 * n_head from the file's CM_GPT2_N_HEAD_METADATA_KEY when it has one (files of
 * cm_gpt2_save_safetensors and the `composer` run folder do), else n_embd / 64 (every released
 * GPT-2 uses 64-dim heads; said at INFO: set it yourself for other models). The other fields are
 * the defaults (tied embeddings, dropouts 0.1). Accepts the same files and folders as
 * cm_gpt2_load_safetensors, with or without the "transformer." prefix. Errors: the file's errors;
 * CM_ERR_NOT_FOUND (no wte/wpe weights: not a GPT-2 checkpoint); CM_ERR_FORMAT (inconsistent
 * shapes, no blocks, a recorded n_head that does not divide n_embd). */
cm_status cm_gpt2_config_from_safetensors(const char *path, cm_gpt2_config *out);

/* ---------------------------------------------------------------------------------------------
 * The model
 * ------------------------------------------------------------------------------------------- */

/* A new GPT-2 module tree (type "GPT2LMHeadModel", see the names above), finalized, in training
 * mode. rng, if not NULL, initialises it as Hugging Face / nanoGPT do — every weight N(0,
 * initializer_range), the c_proj weights of attention and MLP N(0, initializer_range/√(2·L)),
 * biases 0, LayerNorms 1 and 0 — and is advanced; NULL leaves weights zero (for weights about to
 * be loaded). The caller frees it with cm_module_free. Errors: cm_gpt2_config_check's, CM_ERR_OOM. */
cm_status cm_gpt2_module_new(const cm_gpt2_config *cfg, cm_rng *rng, cm_module **out);

/* The same tree wrapped as a cm_model (type "GPT2LMHeadModel") with the fields, loss and metrics
 * described above and flops_per_sample = 6·N·T + 12·L·C·T² (N = parameters without wpe, T the
 * batch's sequence length: nanoGPT's estimate_mfu and Composer's). Free with cm_model_free.
 * Errors: as cm_gpt2_module_new. At forward time: CM_ERR_NOT_FOUND (no "input_ids" field, naming
 * the batch's fields), CM_ERR_SHAPE (input_ids not (B, T), T > n_positions), CM_ERR_INVALID_ARG (a
 * token outside [0, V)) — on the tape. */
cm_status cm_gpt2_new(const cm_gpt2_config *cfg, cm_rng *rng, cm_model **out);

/* True if m was made by cm_gpt2_new. */
bool cm_model_is_gpt2(const cm_model *m);
/* The model's configuration (borrowed, valid while m lives), or NULL if m is not a GPT-2. */
const cm_gpt2_config *cm_gpt2_model_config(const cm_model *m);

/* Fuses lm_head with the loss (Liger's FusedLinearCrossEntropy, cm_linear_cross_entropy): a forward
 * that records gradients returns the hidden states after ln_f (B, T, C) instead of the logits, the
 * loss multiplies them by lm_head's weight chunk_rows rows at a time (0 = automatic), and the
 * (B, T, V) logits and their gradient are never held whole — for GPT-2 124M at 8 × 1024 tokens,
 * 3.3 GB less at the peak. Same loss and gradients up to summation order. The training metrics
 * (LanguageCrossEntropy, LanguagePerplexity) are then read from the loss; forwards without
 * gradients (evaluation, prediction, generation) return logits as before. Errors:
 * CM_ERR_INVALID_ARG (m not a GPT-2 from cm_gpt2_new, chunk_rows < 0). */
cm_status cm_gpt2_set_fused_linear_cross_entropy(cm_model *m, bool on, int64_t chunk_rows);

/* ---------------------------------------------------------------------------------------------
 * Weights in and out (Hugging Face names)
 * ------------------------------------------------------------------------------------------- */

/* Loads weights from a .safetensors file, a Hugging Face checkpoint folder or an index JSON
 * (sharded), as cm_module_load_safetensors, with GPT-2's conventions added to opts (NULL =
 * cm_load_opts_default(): strict): the attention-mask buffers "*.attn.bias" and
 * "*.attn.masked_bias" are skipped, names without the "transformer." prefix (GPT2Model files) get
 * it, and a stored lm_head.weight loads into the tied wte (when both are stored, wte wins). The
 * caller's ignore globs and rename are applied too (rename first). Errors: CM_ERR_INVALID_ARG (m
 * is not a GPT-2), CM_ERR_NOT_FOUND (strict and tensors missing or unexpected: the message names
 * them), CM_ERR_SHAPE (a size mismatch: both shapes named — usually the wrong preset), the file's
 * errors. Nothing changes unless every check passes. report may be NULL. */
cm_status cm_gpt2_load_safetensors(cm_model *m, const char *path, const cm_load_opts *opts, cm_load_report *report);

/* Writes the weights with Hugging Face's GPT2LMHeadModel names, as save_pretrained does (a tied
 * lm_head.weight is not stored; Hugging Face and cm_gpt2_load_safetensors re-tie it; in plain
 * PyTorch load with strict=False or copy wte into lm_head). Metadata {"format": "pt",
 * CM_GPT2_N_HEAD_METADATA_KEY: n_head}. Errors:
 * CM_ERR_INVALID_ARG (not a GPT-2), the writer's (CM_ERR_IO naming the path, CM_ERR_OOM). */
cm_status cm_gpt2_save_safetensors(cm_model *m, const char *path);
/* The same with more metadata after n_head's: n_meta (at most 8) (key, value) pairs, as
 * cm_module_save_safetensors_with (e.g. the surgery record of composer/surgery_algorithms.h).
 * Errors: cm_gpt2_save_safetensors's, CM_ERR_INVALID_ARG (n_meta outside [0, 8], NULL meta). */
cm_status cm_gpt2_save_safetensors_with(cm_model *m, const char *path, const char *const *meta, int n_meta);

/* ---------------------------------------------------------------------------------------------
 * Generation
 * ------------------------------------------------------------------------------------------- */

/* Called with each new token and its 0-based index among the new tokens; return false to stop. */
typedef bool (*cm_gpt2_token_fn)(int64_t token, int64_t index, void *data);

typedef struct cm_gpt2_generate_config {
    float temperature;  /* logits are divided by it before sampling; 0 = greedy (argmax) (1) */
    int64_t top_k;      /* sample among the k most likely tokens (ties with the k-th kept); 0 = all (0) */
    float top_p;        /* then among the smallest set whose probability reaches top_p; 1 = all (1) */
    uint64_t seed;      /* the sampling stream: Philox (seed, 0), one draw per token (0) */
    int64_t eos_token;  /* stop after emitting this token; -1 = none (-1) */
    bool use_cache;     /* keep per-layer keys and values (true); false recomputes the whole
                           context each step (the reference the cache is tested against) */
    cm_gpt2_token_fn on_token; /* optional (NULL) */
    void *data;                /* for on_token */
} cm_gpt2_generate_config;

cm_gpt2_generate_config cm_gpt2_generate_config_default(void);

/* Continues prompt (n_prompt ≥ 1 token ids in [0, V)) by up to max_new_tokens tokens, written to
 * out (room for max_new_tokens); *n_out gets how many were produced (fewer when eos_token or
 * on_token stopped it). The model runs in eval mode (no dropout) for the call and its mode is
 * restored; gradients are not recorded; parameters are not changed. Memory: the KV cache holds
 * 2·L·min(n_prompt + max_new_tokens, P)·C floats, allocated per call.
 *
 * Context longer than n_positions: the model sees the last n_positions tokens (nanoGPT's crop).
 * The prompt is cropped to them; once the sequence outgrows the window, each step recomputes the
 * window from scratch (the cache cannot slide: every token's position changes), so steps beyond P
 * cost a full forward of P tokens. Results are the same with and without the cache.
 *
 * Reproducible: the same model, prompt and config give the same tokens. A model whose blocks were
 * replaced by surgery with types other than GPT2Block/GPT2Attention is still generated from, by
 * recomputing the context each step. Errors: CM_ERR_INVALID_ARG (not a GPT-2, n_prompt < 1, a
 * prompt token outside [0, V), max_new_tokens < 0, temperature < 0, top_k < 0, top_p outside
 * (0, 1], NULL out/n_out), CM_ERR_OOM, and the forward pass's errors. out[0..*n_out) is valid even
 * when a later step fails. */
cm_status cm_gpt2_generate(cm_model *m, const int64_t *prompt, int64_t n_prompt, int64_t max_new_tokens,
                           const cm_gpt2_generate_config *cfg, int64_t *out, int64_t *n_out);

/* Picks the next token from one row of logits (V floats) with the config's temperature, top_k
 * and top_p, drawing one uniform from rng when sampling (advancing it by one block); greedy
 * returns the first maximum. Exposed for tests and custom decoding loops. Errors:
 * CM_ERR_INVALID_ARG (bad config values as above, V < 1, NULL pointers), CM_ERR_OOM. */
cm_status cm_gpt2_sample(const float *logits, int64_t V, const cm_gpt2_generate_config *cfg, cm_rng *rng,
                         int64_t *token);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_ZOO_GPT2_H */
