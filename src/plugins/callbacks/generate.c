/* Generate (Composer's): text samples from a GPT every interval, logged as texts. */
#include "cb_impl.h"

#include <composer/tokenizer.h>
#include <composer/zoo_gpt2.h>

#include <stdio.h>
#include <string.h>

typedef struct gen_cb {
    cm_generate_config cfg; /* prompts: owned copies */
    char **prompts;
} gen_cb;

cm_generate_config cm_generate_config_default(void) {
    return (cm_generate_config){NULL, NULL, 0, {CM_TIME_BATCH, 0, 0}, 100, 0.0f, 0, 1.0f, 42};
}

/* prompt + up to max_new_tokens generated tokens, decoded (cm_alloc'd) into *text. */
static cm_status generate_one(gen_cb *g, cm_model *m, const char *prompt, char **text) {
    const cm_tokenizer *tok = g->cfg.tokenizer;
    int32_t *ids = NULL;
    int64_t np = 0;
    cm_status s = prompt[0] ? cm_tokenizer_encode(tok, prompt, strlen(prompt), &ids, &np) : CM_OK;
    if (s) return s;
    const int64_t n = g->cfg.max_new_tokens;
    int64_t *p64 = cm_alloc(sizeof(int64_t) * (size_t)(np + 1), 16), *out = cm_alloc(sizeof(int64_t) * (size_t)n, 16);
    int32_t *all = cm_alloc(sizeof(int32_t) * (size_t)(np + n + 1), 16);
    const int32_t eot = cm_tokenizer_special(tok, CM_TOKEN_EOT);
    if (!p64 || !out || !all) s = cm_set_error(CM_ERR_OOM, "Generate: out of memory");
    if (!s) {
        for (int64_t i = 0; i < np; i++) p64[i] = ids[i];
        if (np == 0) p64[0] = eot >= 0 ? eot : 0;
        cm_gpt2_generate_config gc = cm_gpt2_generate_config_default();
        gc.temperature = g->cfg.temperature;
        gc.top_k = g->cfg.top_k;
        gc.top_p = g->cfg.top_p;
        gc.seed = g->cfg.seed;
        gc.eos_token = eot;
        int64_t n_out = 0;
        s = cm_gpt2_generate(m, p64, np ? np : 1, n, &gc, out, &n_out);
        if (!s) {
            for (int64_t i = 0; i < np; i++) all[i] = ids[i];
            for (int64_t i = 0; i < n_out; i++) all[np + i] = (int32_t)out[i];
            size_t len;
            s = cm_tokenizer_decode(tok, all, np + n_out, text, &len);
        }
    }
    cm_free(ids), cm_free(p64), cm_free(out), cm_free(all);
    return s;
}

static bool due(const gen_cb *g, cm_event ev, const cm_timestamp *ts) {
    const cm_time iv = g->cfg.interval;
    if (iv.unit == CM_TIME_BATCH) return ev == CM_EVENT_BATCH_END && ts->batch > 0 && ts->batch % iv.count == 0;
    return ev == CM_EVENT_EPOCH_END && ts->epoch > 0 && ts->epoch % iv.count == 0;
}

static cm_status gen_run_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    gen_cb *g = self;
    cm_model *m = cm_state_model(st);
    if (ev == CM_EVENT_FIT_START) {
        if (!m || !cm_model_is_gpt2(m))
            return cm_set_error(CM_ERR_UNSUPPORTED, "Generate: the model is not a GPT-2 of the zoo (model.name: gpt2)");
        int n_spans = 0;
        cm_state_shard_spans(st, &n_spans);
        if (n_spans > 0)
            return cm_set_error(CM_ERR_UNSUPPORTED, "Generate: the parameters are sharded over the ranks "
                                                    "(FULL_SHARD / SHARD_GRAD_OP); generate after training instead");
        return CM_OK;
    }
    if (!due(g, ev, cm_state_timestamp(st)) || cm_state_rank(st) != 0) return CM_OK;
    for (int i = 0; i < g->cfg.n_prompts; i++) {
        char *text = NULL;
        cm_status s = generate_one(g, m, g->prompts[i], &text);
        if (s) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            return cm_set_error(s, "Generate: prompt %d: %s", i, msg);
        }
        char key[48];
        snprintf(key, sizeof key, "generate/%d", i);
        s = cm_logger_log_text(lg, key, text);
        cm_free(text);
        if (s) return s;
    }
    return CM_OK;
}

static void gen_free(void *self) {
    gen_cb *g = self;
    for (int i = 0; g->prompts && i < g->cfg.n_prompts; i++) cm_free(g->prompts[i]);
    cm_free(g->prompts);
    cm_free(g);
}

static const cm_callback_i generate_vt = {
    .abi = CM_CALLBACK_ABI,
    .name = "Generate",
    .run_event = gen_run_event,
    .free = gen_free,
};

cm_status cm_generate_new(const cm_generate_config *cfg, cm_callback_plugin *out) {
    if (!cfg || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_generate_new: NULL argument");
    *out = (cm_callback_plugin){0};
    if (!cfg->tokenizer) return cm_set_error(CM_ERR_INVALID_ARG, "Generate: a tokenizer is required");
    if (cfg->n_prompts < 1 || !cfg->prompts)
        return cm_set_error(CM_ERR_INVALID_ARG, "Generate: prompts is required (a list of strings)");
    for (int i = 0; i < cfg->n_prompts; i++)
        if (!cfg->prompts[i]) return cm_set_error(CM_ERR_INVALID_ARG, "Generate: prompts[%d] is NULL", i);
    if ((cfg->interval.unit != CM_TIME_BATCH && cfg->interval.unit != CM_TIME_EPOCH) || cfg->interval.count < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "Generate: interval must be a positive count of ba or ep (e.g. 100ba)");
    if (cfg->max_new_tokens < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "Generate: max_new_tokens %lld must be >= 1",
                            (long long)cfg->max_new_tokens);
    if (!(cfg->temperature >= 0)) return cm_set_error(CM_ERR_INVALID_ARG, "Generate: temperature %g must be >= 0 (0: greedy)", cfg->temperature);
    if (!(cfg->top_p > 0 && cfg->top_p <= 1))
        return cm_set_error(CM_ERR_INVALID_ARG, "Generate: top_p %g must be in (0, 1]", cfg->top_p);
    if (cfg->top_k < 0) return cm_set_error(CM_ERR_INVALID_ARG, "Generate: top_k %lld must be >= 0", (long long)cfg->top_k);
    gen_cb *g = cm_alloc_zeroed(sizeof *g, 16);
    if (!g || !(g->prompts = cm_alloc_zeroed(sizeof *g->prompts * (size_t)cfg->n_prompts, 16))) {
        cm_free(g);
        return cm_set_error(CM_ERR_OOM, "Generate: out of memory");
    }
    g->cfg = *cfg;
    for (int i = 0; i < cfg->n_prompts; i++)
        if (!(g->prompts[i] = cbi_strdup(cfg->prompts[i]))) {
            gen_free(g);
            return cm_set_error(CM_ERR_OOM, "Generate: out of memory");
        }
    g->cfg.prompts = (const char *const *)g->prompts;
    *out = (cm_callback_plugin){&generate_vt, g};
    return CM_OK;
}
