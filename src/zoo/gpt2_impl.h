/* Private definitions shared by the GPT-2 model (gpt2.c) and its generation loop (generate.c). */
#ifndef CM_ZOO_GPT2_IMPL_H
#define CM_ZOO_GPT2_IMPL_H

#include <composer/zoo_gpt2.h>

/* The "GPT2Model" module (transformer): children in slots that surgery updates. */
typedef struct gpt2_body {
    cm_gpt2_config cfg;
    cm_module *wte, *wpe, *drop, *h, *ln_f;
} gpt2_body;

/* The "GPT2LMHeadModel" root module. */
typedef struct gpt2_root {
    cm_gpt2_config cfg;
    cm_module *transformer, *lm_head;
    bool hidden_only; /* this forward stops at ln_f: the fused loss applies lm_head */
} gpt2_root;

/* The cm_model's state. */
typedef struct gpt2_model {
    cm_gpt2_config cfg;
    cm_module *root;
    /* cm_gpt2_set_fused_linear_cross_entropy: training forwards return the hidden states, the loss
     * applies lm_head fused with the cross-entropy, and the training metrics read that loss */
    bool fused;
    int64_t chunk_rows;
    const cm_tensor *fused_h;  /* what the last forward returned when it stopped at ln_f */
    double fused_mean;         /* the fused loss of the current microbatch (valid when fused_ready) */
    bool fused_ready;          /* set by the loss, cleared by the next forward */
} gpt2_model;

/* The root's state, or NULL when m is not a GPT-2 model. */
gpt2_root *gpt2_root_of(const cm_model *m);

/* The positions the model takes: the rows of its position embedding (ALiBi may have widened it),
 * else cfg.n_positions. */
int64_t gpt2_positions(const gpt2_body *b);

/* wte(ids) + wpe(pos0 .. pos0 + T) → (B, T, C), before the embedding dropout. ids (B, T). */
cm_tensor *gpt2_embed(cm_tape *tp, gpt2_body *b, cm_tensor *ids, int64_t pos0);

#endif
