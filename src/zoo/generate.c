/* GPT-2 text generation: sampling (greedy, temperature, top-k, top-p) and the decoding loop with a
 * per-layer key/value cache. The cached path runs the blocks' own submodules (ln_1, c_attn,
 * c_proj, ln_2, mlp) one new position at a time against the cached keys and values, so a projection
 * replaced by surgery (LoRA, ...) is what generation uses too; a block of another type falls back
 * to recomputing the context each step. */
#include "zoo/gpt2_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

cm_gpt2_generate_config cm_gpt2_generate_config_default(void) {
    cm_gpt2_generate_config c;
    memset(&c, 0, sizeof c);
    c.temperature = 1.0f;
    c.top_p = 1.0f;
    c.eos_token = -1;
    c.use_cache = true;
    return c;
}

static cm_status check_cfg(const char *fn, const cm_gpt2_generate_config *c) {
    if (!(c->temperature >= 0) || !isfinite(c->temperature))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: temperature %g must be finite and >= 0 (0 = greedy)", fn,
                            c->temperature);
    if (c->top_k < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: top_k %lld must be >= 0 (0 = no limit)", fn, (long long)c->top_k);
    if (!(c->top_p > 0 && c->top_p <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: top_p %g must be in (0, 1] (1 = no limit)", fn, c->top_p);
    return CM_OK;
}

/* ---- sampling ---- */

typedef struct {
    double p;
    int64_t i;
} prob_idx;

/* Descending by probability, ties by index (qsort is not stable; this makes the order total). */
static int by_prob_desc(const void *a, const void *b) {
    const prob_idx *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return (x->i > y->i) - (x->i < y->i);
}

static int by_float_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

cm_status cm_gpt2_sample(const float *logits, int64_t V, const cm_gpt2_generate_config *cfg, cm_rng *rng,
                         int64_t *token) {
    if (!logits || !cfg || !rng || !token || V < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_gpt2_sample: NULL argument or V = %lld < 1", (long long)V);
    cm_status st = check_cfg("cm_gpt2_sample", cfg);
    if (st) return st;
    int64_t best = 0;
    for (int64_t i = 0; i < V; i++) {
        if (isnan(logits[i]))
            return cm_set_error(CM_ERR_INVALID_ARG, "cm_gpt2_sample: logit %lld is NaN (the model diverged?)",
                                (long long)i);
        if (logits[i] > logits[best]) best = i;
    }
    if (cfg->temperature == 0) {
        *token = best;
        return CM_OK;
    }
    const double inv_t = 1.0 / cfg->temperature, mx = (double)logits[best] * inv_t;
    double thresh = -INFINITY;
    if (cfg->top_k > 0 && cfg->top_k < V) {
        float *tmp = cm_alloc(sizeof(float) * (size_t)V, 64);
        if (!tmp) return CM_ERR_OOM;
        memcpy(tmp, logits, sizeof(float) * (size_t)V);
        qsort(tmp, (size_t)V, sizeof(float), by_float_desc);
        thresh = (double)tmp[cfg->top_k - 1] * inv_t;
        cm_free(tmp);
    }
    prob_idx *p = cm_alloc(sizeof(prob_idx) * (size_t)V, 64);
    if (!p) return CM_ERR_OOM;
    double sum = 0;
    for (int64_t i = 0; i < V; i++) {
        double z = (double)logits[i] * inv_t;
        p[i].i = i;
        p[i].p = z >= thresh ? exp(z - mx) : 0.0; /* ties with the k-th are kept, as nanoGPT */
        sum += p[i].p;
    }
    if (cfg->top_p < 1) {
        /* keep the smallest prefix (by probability) whose mass reaches top_p; at least one token */
        prob_idx *s = cm_alloc(sizeof(prob_idx) * (size_t)V, 64);
        if (!s) {
            cm_free(p);
            return CM_ERR_OOM;
        }
        memcpy(s, p, sizeof(prob_idx) * (size_t)V);
        qsort(s, (size_t)V, sizeof(prob_idx), by_prob_desc);
        double cum = 0, kept = 0;
        int64_t j = 0;
        for (; j < V && s[j].p > 0; j++) {
            cum += s[j].p;
            if (cum >= (double)cfg->top_p * sum) {
                j++;
                break;
            }
        }
        for (int64_t q = j; q < V; q++) p[s[q].i].p = 0;
        for (int64_t q = 0; q < j; q++) kept += s[q].p;
        sum = kept;
        cm_free(s);
    }
    float u;
    cm_rng_uniform(rng, &u, 1, 0.0f, 1.0f);
    const double target = (double)u * sum;
    double acc = 0;
    int64_t pick = best; /* rounding fallback: the most likely token */
    for (int64_t i = 0; i < V; i++) {
        if (p[i].p <= 0) continue;
        acc += p[i].p;
        if (acc > target) {
            pick = i;
            break;
        }
    }
    cm_free(p);
    *token = pick;
    return CM_OK;
}

/* ---- the cached forward ---- */

/* The pieces of one block the cached path calls. */
typedef struct {
    cm_module *ln_1, *c_attn, *c_proj, *ln_2, *mlp;
} block_parts;

static bool block_parts_of(cm_module *blk, block_parts *bp) {
    if (strcmp(cm_module_type_name(blk), "GPT2Block")) return false;
    cm_module *attn = cm_module_child(blk, "attn");
    if (!attn || strcmp(cm_module_type_name(attn), "GPT2Attention")) return false;
    cm_nn_attention_config ac;
    if (cm_nn_attention_config_of(attn, &ac) || ac.alibi) return false; /* the cached path adds no ALiBi bias */
    bp->ln_1 = cm_module_child(blk, "ln_1");
    bp->ln_2 = cm_module_child(blk, "ln_2");
    bp->mlp = cm_module_child(blk, "mlp");
    bp->c_attn = cm_module_child(attn, "c_attn");
    bp->c_proj = cm_module_child(attn, "c_proj");
    return bp->ln_1 && bp->ln_2 && bp->mlp && bp->c_attn && bp->c_proj;
}

typedef struct {
    gpt2_root *root;
    gpt2_body *body;
    int64_t L, C, H;
    cm_tensor **k, **v; /* L each: (1, T_max, C) — the keys/values of positions 0..T_max-1 */
} kv_cache;

/* Runs ids (1, t) at positions past .. past+t-1 through the blocks, appending their keys and
 * values to the cache (which must hold positions 0..past-1; past = 0 or t = 1), and returns the
 * logits of the last position (1, 1, V). */
static cm_tensor *cached_forward(cm_tape *tp, kv_cache *kc, cm_tensor *ids, int64_t past) {
    if (!ids) return NULL;
    const int64_t t = cm_tensor_dim(ids, 1), C = kc->C, H = kc->H, D = C / H, S = past + t;
    const int perm[4] = {0, 2, 1, 3};
    const int64_t q4[4] = {1, t, H, D}, s4[4] = {1, S, H, D}, y3[3] = {1, t, C};
    cm_tensor *x = gpt2_embed(tp, kc->body, ids, past); /* (1, t, C); embedding dropout is off in eval */
    for (int64_t l = 0; x && l < kc->L; l++) {
        block_parts bp;
        block_parts_of(cm_module_child_at(kc->body->h, (int)l), &bp);
        cm_tensor *qkv = cm_module_forward(bp.c_attn, tp, cm_module_forward(bp.ln_1, tp, x)); /* (1, t, 3C) */
        if (!qkv) return NULL;
        if (cm_tensor_copy(cm_narrow(tp, kc->k[l], 1, past, t), cm_narrow(tp, qkv, 2, C, C)) ||
            cm_tensor_copy(cm_narrow(tp, kc->v[l], 1, past, t), cm_narrow(tp, qkv, 2, 2 * C, C))) {
            cm_tape_fail(tp, CM_ERR_INTERNAL, "GPT-2 generate: writing the KV cache failed: %s", cm_last_error());
            return NULL;
        }
        cm_tensor *q = cm_permute(tp, cm_reshape(tp, cm_narrow(tp, qkv, 2, 0, C), 4, q4), perm); /* (1, H, t, D) */
        cm_tensor *k = cm_permute(tp, cm_reshape(tp, cm_narrow(tp, kc->k[l], 1, 0, S), 4, s4), perm); /* (1, H, S, D) */
        cm_tensor *v = cm_permute(tp, cm_reshape(tp, cm_narrow(tp, kc->v[l], 1, 0, S), 4, s4), perm);
        cm_attention_opts o = cm_attention_opts_default();
        o.causal = past == 0; /* a prefill is square; one new query sees every cached key */
        o.out_bthd = true;    /* (1, t, H, D): merging the heads is a view */
        cm_tensor *y = cm_reshape(tp, cm_attention(tp, q, k, v, &o), 3, y3); /* (1, t, C) */
        x = cm_add(tp, x, cm_module_forward(bp.c_proj, tp, y));
        x = cm_add(tp, x, cm_module_forward(bp.mlp, tp, cm_module_forward(bp.ln_2, tp, x)));
    }
    cm_tensor *last = cm_narrow(tp, x, 1, t - 1, 1); /* (1, 1, C) */
    return cm_module_forward(kc->root->lm_head, tp, cm_module_forward(kc->body->ln_f, tp, last));
}

static bool cache_supported(gpt2_body *b) {
    for (int i = 0; i < cm_module_n_children(b->h); i++) {
        block_parts bp;
        if (!block_parts_of(cm_module_child_at(b->h, i), &bp)) return false;
    }
    return true;
}

/* (1, n) i64 tape tensor of seq[0..n) on the model's device (written on the host, then moved). */
static cm_tensor *ids_tensor(cm_tape *tp, const int64_t *seq, int64_t n, cm_device dev) {
    const int64_t shape[2] = {1, n};
    cm_tensor *t = cm_empty_on(tp, CM_DEVICE_CPU, CM_DTYPE_I64, 2, shape);
    if (t) memcpy(cm_tensor_data(t), seq, sizeof(int64_t) * (size_t)n);
    return cm_to_device(tp, t, dev);
}

cm_status cm_gpt2_generate(cm_model *m, const int64_t *prompt, int64_t n_prompt, int64_t max_new_tokens,
                           const cm_gpt2_generate_config *cfg, int64_t *out, int64_t *n_out) {
    const char *fn = "cm_gpt2_generate";
    if (n_out) *n_out = 0;
    gpt2_root *r = gpt2_root_of(m);
    if (!r)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: the model is %s, not a GPT-2 made by cm_gpt2_new", fn,
                            m ? cm_model_type_name(m) : "NULL");
    if (!prompt || !out || !n_out || n_prompt < 1 || max_new_tokens < 0)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "%s: needs a prompt of at least one token (n_prompt = %lld), max_new_tokens >= 0 (%lld) "
                            "and non-NULL out and n_out",
                            fn, (long long)n_prompt, (long long)max_new_tokens);
    cm_gpt2_generate_config c = cfg ? *cfg : cm_gpt2_generate_config_default();
    cm_status st = check_cfg(fn, &c);
    if (st) return st;
    const cm_gpt2_config *mc = &r->cfg;
    const int64_t V = mc->vocab_size, P = mc->n_positions;
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return cm_set_error(CM_ERR_INVALID_ARG, "%s: prompt token %lld at position %lld is outside [0, %lld)", fn,
                                (long long)prompt[i], (long long)i, (long long)V);
    if (max_new_tokens == 0) return CM_OK;

    cm_module *root = cm_model_module(m);
    const cm_device dev = cm_module_device(root); /* a model on a GPU generates there */
    kv_cache kc = {r, cm_module_self(r->transformer), mc->n_layer, mc->n_embd, mc->n_head, NULL, NULL};
    const bool cached = c.use_cache && cache_supported(kc.body);
    const int64_t total = n_prompt + max_new_tokens, t_max = total < P ? total : P;
    int64_t *seq = cm_alloc(sizeof(int64_t) * (size_t)total, 64);
    float *row = cm_alloc(sizeof(float) * (size_t)V, 64);
    cm_tape *tp = NULL;
    if (!seq || !row || (st = cm_tape_new(NULL, &tp)) || (st = cm_tape_set_device(tp, dev))) {
        st = st ? st : CM_ERR_OOM;
        goto done;
    }
    if (cached) {
        kc.k = cm_alloc_zeroed(sizeof(cm_tensor *) * (size_t)(2 * kc.L), 16);
        if (!kc.k) {
            st = CM_ERR_OOM;
            goto done;
        }
        kc.v = kc.k + kc.L;
        const int64_t shape[3] = {1, t_max, kc.C};
        for (int64_t l = 0; l < 2 * kc.L; l++)
            if ((st = cm_tensor_new_on(dev, CM_DTYPE_F32, 3, shape, &kc.k[l]))) goto done;
    }
    memcpy(seq, prompt, sizeof(int64_t) * (size_t)n_prompt);
    const bool was_training = cm_module_is_training(root);
    cm_module_train(root, false);
    cm_rng rng = cm_rng_init(c.seed, 0);
    int64_t n = n_prompt, cache_len = 0;
    for (int64_t step = 0; step < max_new_tokens; step++) {
        cm_tape_reset(tp);
        cm_tape_set_grad_enabled(tp, false);
        const int64_t start = n > P ? n - P : 0; /* the window the model sees */
        cm_tensor *logits;
        if (cached && start == 0 && cache_len > 0 && cache_len == n - 1) {
            logits = cached_forward(tp, &kc, ids_tensor(tp, seq + n - 1, 1, dev), n - 1);
            cache_len = n;
        } else if (cached) {
            logits = cached_forward(tp, &kc, ids_tensor(tp, seq + start, n - start, dev), 0);
            cache_len = start == 0 ? n : 0; /* a cropped window cannot be extended */
        } else {
            cm_tensor *all = cm_module_forward(root, tp, ids_tensor(tp, seq + start, n - start, dev)); /* (1, t, V) */
            logits = all ? cm_narrow(tp, all, 1, cm_tensor_dim(all, 1) - 1, 1) : NULL;
        }
        if (logits) logits = cm_to_device(tp, logits, CM_DEVICE_CPU); /* (1, 1, V) read on the host */
        if (!logits) {
            st = cm_tape_status(tp) ? cm_tape_status(tp) : CM_ERR_INTERNAL;
            cm_set_error(st, "%s: step %lld: %s", fn, (long long)step, cm_tape_error(tp));
            break;
        }
        const int64_t vs = cm_tensor_strides(logits)[2];
        const float *lp = cm_tensor_data(logits);
        for (int64_t i = 0; i < V; i++) row[i] = lp[i * vs];
        int64_t tok;
        if ((st = cm_gpt2_sample(row, V, &c, &rng, &tok))) break;
        seq[n++] = tok;
        out[step] = tok;
        *n_out = step + 1;
        const bool go_on = !c.on_token || c.on_token(tok, step, c.data);
        if (tok == c.eos_token || !go_on) break;
    }
    cm_module_train(root, was_training);
done:
    if (kc.k)
        for (int64_t l = 0; l < 2 * kc.L; l++) cm_tensor_free(kc.k[l]);
    cm_free(kc.k);
    cm_tape_free(tp);
    cm_free(row);
    cm_free(seq);
    return st;
}
