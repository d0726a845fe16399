/* `composer train`, `composer eval` and `composer generate`: a YAML config (composer/config.h)
 * becomes a zoo model, datasets and loaders, an optimizer, schedulers and plugins, handed to the
 * Trainer. The keys are Composer's / llm-foundry's names (see print_keys, `composer train --help`). */
#include "cli.h"
#include "cli_fsdp.h"

/* Keys and paths are cut to their buffers on purpose (longer ones are not valid config paths). */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#include <composer/datasets.h>
#include <composer/hf.h>
#include <composer/streaming.h>
#include <composer/tokenizer.h>
#include <composer/zoo_bert.h>
#include <composer/zoo_gpt2.h>
#include <composer/zoo_vision.h>

#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_PLUGINS 16
#define MAX_EVALS 8
#define MAX_SCHEDS 8

typedef enum run_mode { MODE_TRAIN, MODE_EVAL, MODE_GENERATE } run_mode;

typedef struct run {
    run_mode mode;
    cm_config *cfg;
    uint64_t seed;
    const char *run_name, *run_root;
    /* model */
    cm_model *model;
    bool gpt2;
    cm_gpt2_config gpt;
    /* model.name: hf (a Hugging Face pretrained folder) */
    bool hf;
    cm_hf_task hf_task;
    cm_hf_tokenizer_info hf_ti; /* model_max_length also from tokenizer.kwargs */
    /* data */
    cm_tokenizer *tok;
    char tok_path[PATH_MAX];
    cm_dataset *train_ds, *eval_ds[MAX_EVALS];
    cm_dataloader *train_dl, *eval_dl[MAX_EVALS];
    /* eval_loader: one map (label "eval"), or llm-foundry's list of labelled loaders ("eval/<label>") */
    char eval_label[MAX_EVALS][80];
    cm_evaluator evals[MAX_EVALS];
    int n_evals;
    int64_t train_batch;
    /* distribution: under the launcher (or mpirun / srun) a communicator over every rank and data
     * parallelism over it; one process: NULL, rank 0 of 1 */
    cm_comm *comm;
    cm_dist *dp;
    int rank, world;
    cm_sharding sharding;  /* parallelism.fsdp.sharding_strategy */
    cli_fsdp fsdp;         /* parallelism.fsdp / fsdp_config: every key of Composer's FSDP config */
    double dist_timeout;   /* seconds; 0 = cm_comm_config_default (CM_DIST_TIMEOUT, else 300) */
    bool keep_comm;        /* this rank failed alone: exit without finalising MPI */
    /* the first error of this rank, until the ranks agree on how the job ends (settle) */
    char err[2048];
    int err_code;
    /* optimization */
    cli_optim opt_cfg;
    cm_optim *opt;
    cm_sched_config scheds[MAX_SCHEDS];
    int n_scheds;
    cm_algorithm_plugin algs[MAX_PLUGINS];
    int n_algs;
    cm_callback_plugin cbs[MAX_PLUGINS];
    int n_cbs;
    cm_logger_plugin lgs[MAX_PLUGINS];
    int n_lgs;
    cm_trainer_config tc;
    const char *load_path;
    const char *exclude_algs[MAX_PLUGINS]; /* load_exclude_algorithms (borrowed from the config) */
    cli_ctx ctx;
    /* sample (GPT) */
    const char *prompt;
    int64_t sample_tokens, top_k;
    double temperature;
} run;

static void run_free(run *r) {
    cm_dist_free(r->dp); /* borrows the model */
    r->dp = NULL;
    for (int i = 0; i < r->n_algs; i++) cm_algorithm_plugin_free(r->algs[i]);
    for (int i = 0; i < r->n_cbs; i++) cm_callback_plugin_free(r->cbs[i]);
    for (int i = 0; i < r->n_lgs; i++) cm_logger_plugin_free(r->lgs[i]);
    cm_optim_free(r->opt);
    cli_optim_free(&r->opt_cfg);
    cm_dataloader_free(r->train_dl);
    for (int i = 0; i < r->n_evals; i++) cm_dataloader_free(r->eval_dl[i]);
    cm_dataset_free(r->train_ds);
    for (int i = 0; i < r->n_evals; i++) cm_dataset_free(r->eval_ds[i]);
    cm_model_free(r->model);
    cm_tokenizer_free(r->tok);
    cm_config_free(r->cfg);
    if (r->ctx.log) fclose(r->ctx.log);
    cm_free((char *)r->ctx.run_dir);
    /* A rank that failed alone must not finalise MPI (MPI_Finalize waits for every rank, and the
     * others may be waiting for it in a collective): it exits nonzero and mpirun ends the job. */
    if (!r->keep_comm) cm_comm_free(r->comm);
    r->comm = NULL;
}

#define TRY(call)                           \
    do {                                    \
        cm_status s_ = (call);              \
        if (s_ != CM_OK) return s_;         \
    } while (0)

static char *keyf(char *buf, size_t cap, const char *prefix, const char *key) {
    snprintf(buf, cap, "%s%s%s", prefix, *prefix ? "." : "", key);
    return buf;
}

static cm_status get_i(cm_config *c, const char *prefix, const char *key, int64_t def, int64_t *out) {
    char k[256];
    return cm_config_get_int(c, keyf(k, sizeof k, prefix, key), def, out);
}
static cm_status get_d(cm_config *c, const char *prefix, const char *key, double def, double *out) {
    char k[256];
    return cm_config_get_double(c, keyf(k, sizeof k, prefix, key), def, out);
}
/* The shortest decimal that reads back to the float, so defaults print as 1e-05, not 9.99...e-06. */
static double short_decimal(float v) {
    char buf[32];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)v);
        if ((float)strtod(buf, NULL) == v) break;
    }
    return strtod(buf, NULL);
}
static cm_status get_f(cm_config *c, const char *prefix, const char *key, float def, float *out) {
    double d;
    TRY(get_d(c, prefix, key, short_decimal(def), &d));
    *out = (float)d;
    return CM_OK;
}
static cm_status get_b(cm_config *c, const char *prefix, const char *key, bool def, bool *out) {
    char k[256];
    return cm_config_get_bool(c, keyf(k, sizeof k, prefix, key), def, out);
}
static cm_status get_s(cm_config *c, const char *prefix, const char *key, const char *def, const char **out) {
    char k[256];
    return cm_config_get_string(c, keyf(k, sizeof k, prefix, key), def, out);
}
static cm_status get_t(cm_config *c, const char *prefix, const char *key, const char *def, cm_time *out) {
    char k[256];
    return cm_config_get_time(c, keyf(k, sizeof k, prefix, key), def, out);
}
/* A value error at a key: "<origin>: <key>: <msg>". */
#define bad(c, key, ...) cli_key_error(c, key, CM_ERR_INVALID_ARG, __VA_ARGS__)
/* Prefixes the current error with the key's origin and name (for library parsers' messages). */
static cm_status at_key(cm_config *c, const char *key, cm_status s) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", cm_last_error());
    const char *o = cm_config_origin(c, key);
    return cm_set_error(s, "%s%s%s: %s", o, *o ? ": " : "", key, msg);
}

static bool file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* ---------------------------------------------------------------------------------------------
 * Model
 * ------------------------------------------------------------------------------------------- */

static const char *const k_model_names[] = {"gpt2", "mlp", "cnn", "resnet", "hf"};

static cm_status build_gpt2(run *r, bool init) {
    cm_config *c = r->cfg;
    const char *preset;
    TRY(cm_config_get_string(c, "model.preset", "gpt2", &preset));
    cm_gpt2_config g;
    if (cm_gpt2_config_preset(preset, &g) != CM_OK) return at_key(c, "model.preset", CM_ERR_INVALID_ARG);
    int64_t vocab_default = g.vocab_size;
    if (r->tok && !cm_config_has(c, "model.vocab_size")) vocab_default = cm_tokenizer_vocab_size(r->tok);
    TRY(get_i(c, "model", "vocab_size", vocab_default, &g.vocab_size));
    TRY(get_i(c, "model", "n_positions", g.n_positions, &g.n_positions));
    TRY(get_i(c, "model", "n_embd", g.n_embd, &g.n_embd));
    TRY(get_i(c, "model", "n_layer", g.n_layer, &g.n_layer));
    TRY(get_i(c, "model", "n_head", g.n_head, &g.n_head));
    if (cm_config_has(c, "model.dropout")) {
        float d;
        TRY(get_f(c, "model", "dropout", 0, &d));
        g.embd_pdrop = g.attn_pdrop = g.resid_pdrop = d;
    } else {
        TRY(get_f(c, "model", "embd_pdrop", g.embd_pdrop, &g.embd_pdrop));
        TRY(get_f(c, "model", "attn_pdrop", g.attn_pdrop, &g.attn_pdrop));
        TRY(get_f(c, "model", "resid_pdrop", g.resid_pdrop, &g.resid_pdrop));
    }
    TRY(get_f(c, "model", "layer_norm_eps", g.layer_norm_eps, &g.layer_norm_eps));
    TRY(get_b(c, "model", "tie_word_embeddings", g.tie_word_embeddings, &g.tie_word_embeddings));
    TRY(get_b(c, "model", "bias", g.bias, &g.bias));
    TRY(get_f(c, "model", "initializer_range", g.initializer_range, &g.initializer_range));
    if (cm_gpt2_config_check(&g) != CM_OK) return at_key(c, "model", CM_ERR_INVALID_ARG);
    if (r->tok && cm_tokenizer_vocab_size(r->tok) > g.vocab_size)
        return bad(c, "model.vocab_size", "%lld is smaller than the tokenizer's vocabulary (%lld, %s)",
                   (long long)g.vocab_size, (long long)cm_tokenizer_vocab_size(r->tok), r->tok_path);
    r->gpt = g;
    r->gpt2 = true;
    cm_rng rng = cm_rng_init(r->seed, 0);
    return cm_gpt2_new(&g, init ? &rng : NULL, &r->model);
}

/* Appends s to buf[*n, cap) as a JSON string. */
static void json_str(char *buf, size_t cap, size_t *n, const char *s) {
    if (*n < cap) buf[(*n)++] = '"';
    for (; *s && *n + 8 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') *n += (size_t)snprintf(buf + *n, cap - *n, "\\%c", ch);
        else if (ch < 0x20) *n += (size_t)snprintf(buf + *n, cap - *n, "\\u%04x", ch);
        else buf[(*n)++] = (char)ch;
    }
    if (*n < cap) buf[(*n)++] = '"';
}

/* model.config_overrides (a map of scalars) as a JSON object for cm_hf_load into buf; "" when
 * absent. */
static cm_status overrides_json(cm_config *c, const char *key, char *buf, size_t cap) {
    buf[0] = '\0';
    cm_config_kind k = cm_config_kind_of(c, key);
    if (k == CM_CONFIG_ABSENT || k == CM_CONFIG_NULL) {
        cm_config_touch(c, key);
        return CM_OK;
    }
    if (k != CM_CONFIG_MAP) return bad(c, key, "expected a map of config.json fields ({hidden_dropout_prob: 0.0})");
    size_t n = 0;
    buf[n++] = '{';
    for (int i = 0; i < cm_config_len(c, key); i++) {
        const char *name = cm_config_key_at(c, key, i);
        char kk[512];
        snprintf(kk, sizeof kk, "%s.%s", key, name);
        if (i) buf[n++] = ',';
        json_str(buf, cap - 64, &n, name);
        buf[n++] = ':';
        cm_config_kind vk = cm_config_kind_of(c, kk);
        if (vk == CM_CONFIG_NULL) {
            cm_config_touch(c, kk);
            n += (size_t)snprintf(buf + n, cap - n, "null");
            continue;
        }
        if (vk != CM_CONFIG_SCALAR)
            return bad(c, kk, "only scalar values (numbers, strings, true/false, null) can override config.json");
        const char *txt;
        TRY(cm_config_get_string(c, kk, NULL, &txt));
        char *end;
        double d = strtod(txt, &end);
        if (*txt && !*end && isfinite(d)) n += (size_t)snprintf(buf + n, cap - n, "%.17g", d);
        else if (!strcmp(txt, "true") || !strcmp(txt, "false")) n += (size_t)snprintf(buf + n, cap - n, "%s", txt);
        else json_str(buf, cap - 64, &n, txt);
        if (n + 80 >= cap) return bad(c, key, "too long (at most %zu bytes as JSON)", cap - 80);
    }
    buf[n++] = '}';
    buf[n] = '\0';
    return CM_OK;
}

/* model: {name: hf, pretrained_model_name_or_path, task, num_labels, pretrained, config_overrides}
 * (llm-foundry's keys) and the tokenizer: tokenizer.name (default: the same folder),
 * tokenizer.kwargs.model_max_length. */
static cm_status build_hf(run *r) {
    cm_config *c = r->cfg;
    const char *dir, *tdir;
    TRY(get_s(c, "model", "pretrained_model_name_or_path", NULL, &dir));
    if (!dir)
        return bad(c, "model.pretrained_model_name_or_path",
                   "required: a Hugging Face pretrained folder (config.json, model.safetensors, tokenizer files)");
    static const char *const tasks[3] = {"masked_lm", "sequence_classification", "causal_lm"}; /* cm_hf_task order */
    int task;
    TRY(cm_config_get_choice(c, "model.task", tasks, 3, NULL, &task));
    if (task < 0) return bad(c, "model.task", "required: masked_lm, sequence_classification or causal_lm");
    cm_hf_load_opts o = cm_hf_load_opts_default();
    o.task = (cm_hf_task)task;
    if (o.task == CM_HF_TASK_SEQUENCE_CLASSIFICATION) TRY(get_i(c, "model", "num_labels", 0, &o.num_labels));
    if (o.num_labels < 0) return bad(c, "model.num_labels", "%lld must be >= 1 (or 0: config.json's)", (long long)o.num_labels);
    TRY(get_b(c, "model", "pretrained", true, &o.pretrained));
    o.seed = r->seed;
    char ov[4096];
    TRY(overrides_json(c, "model.config_overrides", ov, sizeof ov));
    o.config_overrides = ov[0] ? ov : NULL;
    cm_status s = cm_hf_load(dir, &o, &r->model, NULL);
    if (s) return at_key(c, "model.pretrained_model_name_or_path", s);
    /* the tokenizer: tokenizer.name, else the model's folder */
    const bool tok_set = cm_config_has(c, "tokenizer.name");
    TRY(cm_config_get_string(c, "tokenizer.name", dir, &tdir));
    int64_t kw_max = -1; /* optional: not written into the resolved config when absent */
    if (cm_config_has(c, "tokenizer.kwargs.model_max_length"))
        TRY(cm_config_get_int(c, "tokenizer.kwargs.model_max_length", -1, &kw_max));
    cm_tokenizer_free(r->tok);
    r->tok = NULL;
    if (cm_hf_tokenizer_load(tdir, &r->tok, &r->hf_ti) != CM_OK) {
        r->tok = NULL;
        return at_key(c, tok_set ? "tokenizer.name" : "model.pretrained_model_name_or_path", cm_last_status());
    }
    if (kw_max > 0) r->hf_ti.model_max_length = kw_max;
    snprintf(r->tok_path, sizeof r->tok_path, "%s", tdir);
    r->hf = true;
    r->hf_task = o.task;
    /* the MLM head on the masked positions only: the same loss and metrics, a fraction of the cost */
    if (o.task == CM_HF_TASK_MASKED_LM) TRY(cm_bert_mlm_sparse_logits(r->model, true));
    const cm_bert_config *b = cm_bert_model_config(r->model);
    const int64_t V = b ? b->vocab_size : cm_gpt2_model_config(r->model)->vocab_size;
    if (cm_tokenizer_vocab_size(r->tok) > V)
        return bad(c, "tokenizer.name", "the tokenizer of '%s' has %lld tokens but the model's vocab_size is %lld", tdir,
                   (long long)cm_tokenizer_vocab_size(r->tok), (long long)V);
    if (!b) {
        r->gpt2 = true;
        r->gpt = *cm_gpt2_model_config(r->model);
    }
    return CM_OK;
}

static cm_status build_model_named(run *r, bool init);

/* model.fused_linear_cross_entropy (GPT models: gpt2 and hf causal_lm): lm_head fused with the
 * loss (Liger's name), so the (B, T, V) logits and their gradient are never held whole. */
static cm_status build_model(run *r, bool init) {
    TRY(build_model_named(r, init));
    cm_config *c = r->cfg;
    bool fused = false;
    TRY(get_b(c, "model", "fused_linear_cross_entropy", false, &fused));
    if (!fused) return CM_OK;
    if (!cm_model_is_gpt2(r->model))
        return bad(c, "model.fused_linear_cross_entropy",
                   "applies to GPT models (name: gpt2, or hf with task: causal_lm); this model is %s",
                   cm_model_type_name(r->model));
    if (cm_gpt2_set_fused_linear_cross_entropy(r->model, true, 0) != CM_OK)
        return at_key(c, "model.fused_linear_cross_entropy", cm_last_status());
    return CM_OK;
}

static cm_status build_model_named(run *r, bool init) {
    cm_config *c = r->cfg;
    int which;
    TRY(cm_config_get_choice(c, "model.name", k_model_names, 5, NULL, &which));
    if (which < 0) return bad(c, "model.name", "required: the zoo model (gpt2, mlp, cnn, resnet) or hf");
    switch (which) {
    case 0:
        return build_gpt2(r, init);
    case 4:
        return build_hf(r);
    case 1: {
        cm_mlp_config m;
        const char *preset;
        TRY(cm_config_get_string(c, "model.preset", "mnist", &preset));
        if (cm_mlp_config_preset(preset, &m) != CM_OK) return at_key(c, "model.preset", CM_ERR_INVALID_ARG);
        TRY(get_i(c, "model", "in_features", m.in_features, &m.in_features));
        double hid[CM_MLP_MAX_HIDDEN], def[CM_MLP_MAX_HIDDEN];
        for (int i = 0; i < m.n_hidden; i++) def[i] = (double)m.hidden[i];
        int nh;
        TRY(cm_config_get_doubles(c, "model.hidden", def, m.n_hidden, hid, CM_MLP_MAX_HIDDEN, &nh));
        m.n_hidden = nh;
        for (int i = 0; i < nh; i++) m.hidden[i] = (int64_t)hid[i];
        TRY(get_i(c, "model", "num_classes", m.num_classes, &m.num_classes));
        TRY(get_f(c, "model", "dropout", m.dropout, &m.dropout));
        m.seed = r->seed;
        m.random_init = init;
        return cm_mlp_model_new(&m, &r->model);
    }
    case 2: {
        cm_cnn_config m;
        const char *preset;
        TRY(cm_config_get_string(c, "model.preset", "mnist", &preset));
        if (cm_cnn_config_preset(preset, &m) != CM_OK) return at_key(c, "model.preset", CM_ERR_INVALID_ARG);
        TRY(get_i(c, "model", "in_channels", m.in_channels, &m.in_channels));
        TRY(get_i(c, "model", "image_h", m.image_h, &m.image_h));
        TRY(get_i(c, "model", "image_w", m.image_w, &m.image_w));
        double ch[2], def[2] = {(double)m.channels[0], (double)m.channels[1]};
        int n;
        TRY(cm_config_get_doubles(c, "model.channels", def, 2, ch, 2, &n));
        if (n != 2) return bad(c, "model.channels", "needs 2 values ([32, 64]), got %d", n);
        m.channels[0] = (int64_t)ch[0], m.channels[1] = (int64_t)ch[1];
        TRY(get_i(c, "model", "hidden", m.hidden, &m.hidden));
        TRY(get_i(c, "model", "num_classes", m.num_classes, &m.num_classes));
        TRY(get_f(c, "model", "dropout1", m.dropout1, &m.dropout1));
        TRY(get_f(c, "model", "dropout2", m.dropout2, &m.dropout2));
        m.seed = r->seed;
        m.random_init = init;
        return cm_cnn_model_new(&m, &r->model);
    }
    default: {
        cm_resnet_config m;
        const char *preset;
        TRY(cm_config_get_string(c, "model.preset", "resnet20", &preset));
        if (cm_resnet_config_preset(preset, &m) != CM_OK) return at_key(c, "model.preset", CM_ERR_INVALID_ARG);
        TRY(get_i(c, "model", "num_classes", m.num_classes, &m.num_classes));
        TRY(get_i(c, "model", "in_channels", m.in_channels, &m.in_channels));
        TRY(get_b(c, "model", "zero_init_residual", m.zero_init_residual, &m.zero_init_residual));
        TRY(get_b(c, "model", "channels_last", m.channels_last, &m.channels_last));
        m.seed = r->seed;
        m.random_init = init;
        return cm_resnet_model_new(&m, &r->model);
    }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Data
 * ------------------------------------------------------------------------------------------- */

static const char *const k_dataset_types[] = {"tokens", "mnist", "cifar10", "sst2", "tsv", "text", "streaming"};

/* The tokenizer.json of a token dataset section (its dir, or next to its path), if any. */
static void find_tokenizer(run *r, const char *sec) {
    if (r->tok) return;
    char k[256];
    const char *dir = NULL, *path = NULL;
    cm_config *c = r->cfg;
    snprintf(k, sizeof k, "%s.dataset.dir", sec);
    if (cm_config_kind_of(c, k) == CM_CONFIG_SCALAR && cm_config_get_string(c, k, NULL, &dir) != CM_OK) dir = NULL;
    snprintf(k, sizeof k, "%s.dataset.path", sec);
    if (!dir && cm_config_kind_of(c, k) == CM_CONFIG_SCALAR && cm_config_get_string(c, k, NULL, &path) != CM_OK)
        path = NULL;
    char buf[PATH_MAX];
    if (dir) snprintf(buf, sizeof buf, "%s/tokenizer.json", dir);
    else if (path) {
        char tmp[PATH_MAX];
        snprintf(tmp, sizeof tmp, "%s", path);
        snprintf(buf, sizeof buf, "%s/tokenizer.json", dirname(tmp));
    } else return;
    if (!file_exists(buf)) return;
    if (cm_tokenizer_load(buf, &r->tok) != CM_OK) {
        cm_log_msg(CM_LOG_WARN, "cannot load %s (no text samples): %s", buf, cm_last_error());
        r->tok = NULL;
        return;
    }
    snprintf(r->tok_path, sizeof r->tok_path, "%s", buf);
}

/* The model's longest sequence (BERT's max_position_embeddings, GPT-2's n_positions), or -1. */
static int64_t model_max_positions(const run *r) {
    const cm_bert_config *b = r->model ? cm_bert_model_config(r->model) : NULL;
    return b ? b->max_position_embeddings : r->gpt2 ? r->gpt.n_positions : -1;
}

/* sst2 | tsv | text datasets (type 3, 4, 5) at section p ("train_loader.dataset"); masked-LM
 * models get them through cm_bert_mlm_dataset_new. */
static cm_status open_text_dataset(run *r, const char *p, bool train, int type, cm_dataset **out) {
    cm_config *c = r->cfg;
    char k[256];
    const char *tname = k_dataset_types[type];
    keyf(k, sizeof k, p, "type");
    if (!r->tok)
        return bad(c, k, "%s needs a tokenizer: use model.name: hf (the folder's tokenizer) or set tokenizer.name", tname);
    const bool mlm = r->hf && r->hf_task == CM_HF_TASK_MASKED_LM;
    const bool cls = r->hf ? r->hf_task == CM_HF_TASK_SEQUENCE_CLASSIFICATION : !r->gpt2;
    if (cls && type == 5)
        return bad(c, k, "text has no labels: sequence_classification trains on sst2 or tsv (with label_column)");
    if (r->gpt2 && type != 5) return bad(c, k, "a causal LM trains on text (or tokens), not %s", tname);
    /* max_seq_len: 128 (the seed's), within the model's positions and the tokenizer's limit */
    const int64_t max_pos = model_max_positions(r), tok_max = r->hf_ti.model_max_length;
    int64_t def = 128;
    if (max_pos > 0 && def > max_pos) def = max_pos;
    if (tok_max > 0 && def > tok_max) def = tok_max;
    int64_t L;
    TRY(get_i(c, p, "max_seq_len", def, &L));
    keyf(k, sizeof k, p, "max_seq_len");
    if (max_pos > 0 && L > max_pos)
        return bad(c, k, "%lld is longer than the model's maximum of %lld positions", (long long)L, (long long)max_pos);
    if (tok_max > 0 && L > tok_max)
        return bad(c, k, "%lld is longer than the tokenizer's model_max_length %lld (tokenizer_config.json, or "
                         "tokenizer.kwargs.model_max_length)", (long long)L, (long long)tok_max);
    cm_dataset *ds = NULL;
    cm_status s = CM_OK;
    const char *path = NULL;
    char buf[PATH_MAX];
    if (type == 3) { /* sst2: path, or dir + split */
        static const char *const splits[] = {"train", "dev", "test"};
        const char *dir;
        TRY(get_s(c, p, "path", NULL, &path));
        if (!path) {
            int split;
            TRY(get_s(c, p, "dir", "../shared/data/sst2", &dir));
            TRY(cm_config_get_choice(c, keyf(k, sizeof k, p, "split"), splits, 3, train ? "train" : "dev", &split));
            snprintf(buf, sizeof buf, "%s/%s.tsv", dir, splits[split]);
            path = buf;
        }
        s = cm_dataset_sst2_new(path, r->tok, L, &ds);
    } else if (type == 4) { /* tsv: path, text_column, label_column (classification) */
        cm_tsv_config tc = cm_tsv_config_default();
        tc.max_len = L;
        TRY(get_s(c, p, "path", NULL, &path));
        if (!path) return bad(c, p, "a tsv dataset needs 'path' (a tab-separated file with a header)");
        TRY(get_s(c, p, "text_column", tc.text_column, &tc.text_column));
        if (cls) {
            TRY(get_s(c, p, "label_column", tc.label_column, &tc.label_column));
            const cm_bert_config *b = cm_bert_model_config(r->model);
            tc.num_labels = b ? b->num_labels : 0;
        } else {
            tc.label_column = NULL;
        }
        s = cm_dataset_tsv_new(path, r->tok, &tc, &ds);
    } else { /* text: path (a file or a list), text_column (.tsv files), line_by_line */
        cm_text_config xc = cm_text_config_default();
        xc.max_len = L;
        xc.layout = r->gpt2 ? CM_TEXT_CAUSAL : CM_TEXT_BLOCKS;
        const char *paths[16];
        int n = 0;
        keyf(k, sizeof k, p, "path");
        if (cm_config_kind_of(c, k) == CM_CONFIG_SEQ) {
            n = cm_config_len(c, k);
            if (n < 1 || n > 16) return bad(c, k, "a list of 1 to 16 files, got %d", n);
            for (int i = 0; i < n; i++) {
                char ki[300];
                snprintf(ki, sizeof ki, "%s.%d", k, i);
                TRY(cm_config_get_string(c, ki, NULL, &paths[i]));
            }
        } else {
            TRY(get_s(c, p, "path", NULL, &paths[0]));
            if (!paths[0]) return bad(c, p, "a text dataset needs 'path' (a file, or a list of files)");
            n = 1;
        }
        path = paths[0];
        TRY(get_s(c, p, "text_column", xc.text_column, &xc.text_column));
        if (!r->gpt2) {
            bool lbl;
            TRY(get_b(c, p, "line_by_line", false, &lbl));
            if (lbl) xc.layout = CM_TEXT_LINES;
        }
        s = cm_dataset_text_new(paths, n, r->tok, &xc, &ds);
    }
    if (s != CM_OK) return at_key(c, p, s);
    if (mlm) { /* Hugging Face's DataCollatorForLanguageModeling: mlm_probability, 80/10/10 */
        cm_bert_mlm_mask_config mc;
        if (cm_bert_mlm_mask_config_from_tokenizer(r->tok, 0, &mc) != CM_OK) {
            cm_dataset_free(ds);
            return at_key(c, "tokenizer.name", cm_last_status());
        }
        double prob;
        if ((s = get_d(c, p, "mlm_probability", mc.mlm_probability, &prob)) != CM_OK) {
            cm_dataset_free(ds);
            return s;
        }
        mc.mlm_probability = (float)prob;
        cm_dataset *m = NULL;
        if ((s = cm_bert_mlm_dataset_new(ds, &mc, &m)) != CM_OK) {
            cm_dataset_free(ds);
            return at_key(c, keyf(k, sizeof k, p, "mlm_probability"), s);
        }
        ds = m;
    }
    *out = ds;
    return CM_OK;
}

/* Bytes as Streaming's bytes_to_int reads them: 123, "10b", "64kb", "1.5mb", "2gb" (base 1024). */
static bool parse_bytes(const char *t, int64_t *out) {
    char *end;
    double v = strtod(t, &end);
    if (end == t || v < 0) return false;
    while (*end == ' ') end++;
    double m = 1;
    if (!strcasecmp(end, "kb")) m = 1024.0;
    else if (!strcasecmp(end, "mb")) m = 1024.0 * 1024;
    else if (!strcasecmp(end, "gb")) m = 1024.0 * 1024 * 1024;
    else if (!strcasecmp(end, "tb")) m = 1024.0 * 1024 * 1024 * 1024;
    else if (*end && strcasecmp(end, "b")) return false;
    *out = (int64_t)(v * m);
    return true;
}

/* dataset: {type: streaming, remote, local, split, shuffle, shuffle_algo, ...}: MosaicML
 * Streaming's StreamingDataset arguments under their names. batch_size is per device, as
 * Streaming's (default: the loader's global batch / world size). */
static cm_status open_streaming(run *r, const char *sec, const char *p, bool train, cm_dataset **out) {
    cm_config *c = r->cfg;
    char k[256];
    int64_t global = train ? 32 : (r->train_batch ? r->train_batch : 32);
    if (train && cm_config_has(c, "global_train_batch_size")) TRY(cm_config_get_int(c, "global_train_batch_size", 32, &global));
    TRY(get_i(c, sec, "batch_size", global, &global));
    if (global % r->world)
        return bad(c, keyf(k, sizeof k, sec, "batch_size"), "%lld is not a multiple of the %d ranks (a streaming dataset "
                                                           "gives every device the same batch)", (long long)global, r->world);
    cm_streaming_config sc = cm_streaming_config_default();
    TRY(get_s(c, p, "remote", NULL, &sc.remote));
    TRY(get_s(c, p, "local", NULL, &sc.local));
    TRY(get_s(c, p, "split", NULL, &sc.split));
    TRY(get_s(c, p, "validate_hash", NULL, &sc.validate_hash));
    TRY(get_s(c, p, "shuffle_algo", "py1e", &sc.shuffle_algo));
    TRY(get_s(c, p, "partition_algo", "relaxed", &sc.partition_algo));
    TRY(get_s(c, p, "sampling_method", "balanced", &sc.sampling_method));
    TRY(get_b(c, p, "shuffle", false, &sc.shuffle));
    TRY(get_b(c, p, "keep_zip", false, &sc.keep_zip));
    TRY(get_b(c, p, "allow_unsafe_types", false, &sc.allow_unsafe_types));
    int64_t v;
    TRY(get_i(c, p, "shuffle_seed", 9176, &v));
    sc.shuffle_seed = (uint64_t)v;
    TRY(get_i(c, p, "shuffle_block_size", 0, &sc.shuffle_block_size));
    TRY(get_i(c, p, "num_canonical_nodes", 0, &sc.num_canonical_nodes));
    TRY(get_i(c, p, "predownload", -1, &sc.predownload));
    TRY(get_i(c, p, "download_retry", 2, &v));
    sc.download_retry = (int)v;
    TRY(get_i(c, p, "epoch_size", 0, &sc.epoch_size));
    TRY(get_i(c, p, "sampling_granularity", 1, &sc.sampling_granularity));
    TRY(get_i(c, p, "max_seq_len", r->gpt2 ? r->gpt.n_positions : 0, &sc.max_seq_len));
    TRY(get_i(c, p, "batch_size", global / r->world, &sc.batch_size));
    if (sc.batch_size * r->world != global)
        return bad(c, keyf(k, sizeof k, p, "batch_size"), "%lld per device on %d ranks is not the loader's global batch "
                                                         "of %lld", (long long)sc.batch_size, r->world, (long long)global);
    const char *cl;
    TRY(get_s(c, p, "cache_limit", NULL, &cl));
    if (cl && !parse_bytes(cl, &sc.cache_limit))
        return bad(c, keyf(k, sizeof k, p, "cache_limit"), "'%s' is not a byte size (e.g. 10gb, 500mb, 1048576)", cl);
    /* streams: {name: {remote, local, split, proportion | repeat | choose}, ...} as llm-foundry's
     * (a list of such maps works too) */
    cm_stream_config streams[CM_STREAMING_MAX_STREAMS];
    const char *sp = keyf(k, sizeof k, p, "streams");
    char spath[256];
    snprintf(spath, sizeof spath, "%s", sp);
    const cm_config_kind sk = cm_config_kind_of(c, spath);
    if (sk != CM_CONFIG_ABSENT && sk != CM_CONFIG_NULL) {
        if (sk != CM_CONFIG_MAP && sk != CM_CONFIG_SEQ)
            return bad(c, spath, "expected a map of stream names to {remote, local, split, proportion, repeat, choose}");
        sc.n_streams = cm_config_len(c, spath);
        if (sc.n_streams < 1 || sc.n_streams > CM_STREAMING_MAX_STREAMS)
            return bad(c, spath, "%d streams (1 to %d)", sc.n_streams, CM_STREAMING_MAX_STREAMS);
        for (int i = 0; i < sc.n_streams; i++) {
            char one[320];
            if (sk == CM_CONFIG_MAP) snprintf(one, sizeof one, "%s.%s", spath, cm_config_key_at(c, spath, i));
            else snprintf(one, sizeof one, "%s.%d", spath, i);
            if (cm_config_kind_of(c, one) != CM_CONFIG_MAP)
                return bad(c, one, "expected a map {remote, local, split, proportion, repeat, choose}");
            cm_stream_config *st = &streams[i];
            *st = (cm_stream_config){.proportion = -1, .repeat = -1, .choose = -1};
            TRY(get_s(c, one, "remote", NULL, &st->remote));
            TRY(get_s(c, one, "local", NULL, &st->local));
            TRY(get_s(c, one, "split", NULL, &st->split));
            char kk[400];
            if (cm_config_has(c, keyf(kk, sizeof kk, one, "proportion"))) TRY(get_d(c, one, "proportion", 0, &st->proportion));
            if (cm_config_has(c, keyf(kk, sizeof kk, one, "repeat"))) TRY(get_d(c, one, "repeat", 0, &st->repeat));
            if (cm_config_has(c, keyf(kk, sizeof kk, one, "choose"))) TRY(get_i(c, one, "choose", 0, &st->choose));
            if ((st->proportion >= 0) + (st->repeat >= 0) + (st->choose >= 0) > 1)
                return bad(c, one, "give at most one of proportion, repeat and choose");
            if (!st->remote && !st->local && !sc.remote && !sc.local)
                return bad(c, one, "a stream needs remote and/or local");
        }
        sc.streams = streams;
    } else if (!sc.remote && !sc.local) {
        return bad(c, p, "a streaming dataset needs remote and/or local (or streams: {name: {remote, local}, ...})");
    }
    /* images: image_h/w/c, normalised as the cifar10 (3 channels) and mnist (1) datasets by
     * default, augmented with their keys; fields renames columns ({x: image, y: label}) */
    TRY(get_i(c, p, "image_h", 0, &sc.image_h));
    if (sc.image_h > 0) {
        TRY(get_i(c, p, "image_w", sc.image_h, &sc.image_w));
        TRY(get_i(c, p, "image_c", 3, &sc.image_c));
        if (sc.image_c != 1 && sc.image_c != 3) return bad(c, keyf(k, sizeof k, p, "image_c"), "%lld (use 1 or 3)", (long long)sc.image_c);
        const cm_cifar10_config cc = cm_cifar10_config_default();
        const cm_mnist_config mc = cm_mnist_config_default();
        double dm[3], ds[3], vm[3], vs[3];
        for (int q = 0; q < 3; q++) {
            dm[q] = short_decimal(sc.image_c == 3 ? cc.mean[q] : mc.mean);
            ds[q] = short_decimal(sc.image_c == 3 ? cc.std[q] : mc.std);
        }
        int nm, ns;
        TRY(cm_config_get_doubles(c, keyf(k, sizeof k, p, "image_mean"), dm, (int)sc.image_c, vm, 3, &nm));
        if (nm != sc.image_c) return bad(c, k, "%d values for %lld channels", nm, (long long)sc.image_c);
        TRY(cm_config_get_doubles(c, keyf(k, sizeof k, p, "image_std"), ds, (int)sc.image_c, vs, 3, &ns));
        if (ns != sc.image_c) return bad(c, k, "%d values for %lld channels", ns, (long long)sc.image_c);
        for (int q = 0; q < ns; q++) {
            if (!(vs[q] > 0)) return bad(c, k, "%g must be > 0", vs[q]);
            sc.image_mean[q] = (float)vm[q], sc.image_std[q] = (float)vs[q];
        }
        int64_t crop;
        TRY(get_i(c, p, "crop_padding", 0, &crop));
        sc.image_augment.crop_padding = (int)crop;
        TRY(get_f(c, p, "hflip_p", 0, &sc.image_augment.hflip_p));
        if (!train) sc.image_augment = (cm_image_augment){0};
    }
    cm_streaming_rename renames[8];
    const char *fp = keyf(k, sizeof k, p, "fields");
    char fpath[256];
    snprintf(fpath, sizeof fpath, "%s", fp);
    if (cm_config_kind_of(c, fpath) == CM_CONFIG_MAP) {
        sc.n_renames = cm_config_len(c, fpath);
        if (sc.n_renames > 8) return bad(c, fpath, "at most 8 renames");
        for (int i = 0; i < sc.n_renames; i++) {
            renames[i].column = cm_config_key_at(c, fpath, i);
            char one[400];
            snprintf(one, sizeof one, "%s.%s", fpath, renames[i].column);
            TRY(cm_config_get_string(c, one, NULL, &renames[i].field));
        }
        sc.renames = renames;
    } else if (cm_config_kind_of(c, fpath) != CM_CONFIG_ABSENT) {
        return bad(c, fpath, "expected a map of column names to field names ({x: image, y: label})");
    }
    if (cm_dataset_streaming_new(&sc, r->rank, r->world, out) != CM_OK) return at_key(c, p, cm_last_status());
    /* the zoo's models read fixed field names: say which are missing and how to map them */
    const char *need = r->gpt2 ? "input_ids" : "image";
    if (cm_dataset_find_field(*out, need) < 0) {
        char have[512] = "";
        for (int f = 0; f < cm_dataset_n_fields(*out); f++)
            snprintf(have + strlen(have), sizeof have - strlen(have), "%s%s", f ? ", " : "", cm_dataset_field(*out, f)->name);
        cm_dataset_free(*out);
        *out = NULL;
        return bad(c, p, "the model reads the field '%s', and this dataset has %s%s", need, have,
                   r->gpt2 ? " (set max_seq_len for a 'tokens' column)"
                           : " (map the columns with fields: {x: image, y: label}, and set image_h/image_w/image_c)");
    }
    return CM_OK;
}

static cm_status open_dataset(run *r, const char *sec, bool train, cm_dataset **out) {
    cm_config *c = r->cfg;
    char k[256], p[256];
    snprintf(p, sizeof p, "%s.dataset", sec);
    int type;
    TRY(cm_config_get_choice(c, keyf(k, sizeof k, p, "type"), k_dataset_types, 7, r->gpt2 ? "tokens" : NULL, &type));
    if (type < 0) return bad(c, k, "required: tokens, mnist, cifar10, sst2, tsv, text or streaming");
    if (type == 6) return open_streaming(r, sec, p, train, out);
    if (type >= 3) return open_text_dataset(r, p, train, type, out);
    if (type == 0) {
        static const char *const splits[] = {"train", "val"};
        const char *path, *dir;
        TRY(get_s(c, p, "path", NULL, &path));
        char buf[PATH_MAX];
        if (!path) {
            TRY(get_s(c, p, "dir", NULL, &dir));
            if (!dir) return bad(c, p, "a token dataset needs 'dir' (with train.bin / val.bin) or 'path'");
            int split;
            TRY(cm_config_get_choice(c, keyf(k, sizeof k, p, "split"), splits, 2, train ? "train" : "val", &split));
            snprintf(buf, sizeof buf, "%s/%s.bin", dir, splits[split]);
            path = buf;
        }
        cm_tokens_config tc = cm_tokens_config_default();
        TRY(get_i(c, p, "seq_len", r->gpt2 ? r->gpt.n_positions : 1024, &tc.seq_len));
        if (r->gpt2 && tc.seq_len > r->gpt.n_positions)
            return bad(c, keyf(k, sizeof k, p, "seq_len"), "%lld is longer than the model's n_positions (%lld)",
                       (long long)tc.seq_len, (long long)r->gpt.n_positions);
        if (r->gpt2) tc.vocab_size = r->gpt.vocab_size;
        if (cm_dataset_tokens_new(path, &tc, out) != CM_OK) {
            cm_status s = at_key(c, p, cm_last_status());
            /* the tokenizer the model's vocabulary was made for: GPT-2's BPE (50257) or characters */
            if (access(path, F_OK) != 0 && strstr(path, "shakespeare"))
                cm_set_error(s, "%s (tokenize the text first: composer data tokenize --tokenizer %s "
                                "../shared/data/tinyshakespeare/input.txt -o %.*s)",
                             cm_last_error(), r->gpt2 && r->gpt.vocab_size > 256 ? "gpt2" : "char",
                             (int)(strrchr(path, '/') ? strrchr(path, '/') - path : 4), path);
            return s;
        }
        return CM_OK;
    }
    static const char *const splits[] = {"train", "test"};
    const char *dir;
    int split;
    TRY(get_s(c, p, "dir", type == 1 ? "../shared/data/mnist" : "../shared/data/cifar10", &dir));
    TRY(cm_config_get_choice(c, keyf(k, sizeof k, p, "split"), splits, 2, train ? "train" : "test", &split));
    cm_image_augment aug = {0};
    int64_t crop;
    TRY(get_i(c, p, "crop_padding", 0, &crop));
    aug.crop_padding = (int)crop;
    if (train) TRY(cli_image_u8_transform(c, &aug)); /* algorithms.randaugment / augmix */
    if (type == 1) {
        cm_mnist_config mc = cm_mnist_config_default();
        mc.augment = aug;
        if (cm_dataset_mnist_new(dir, (cm_data_split)split, &mc, out) != CM_OK) return at_key(c, p, cm_last_status());
    } else {
        TRY(get_f(c, p, "hflip_p", 0, &aug.hflip_p));
        cm_cifar10_config cc = cm_cifar10_config_default();
        cc.augment = aug;
        if (cm_dataset_cifar10_new(dir, (cm_data_split)split, &cc, out) != CM_OK) return at_key(c, p, cm_last_status());
    }
    return CM_OK;
}

static cm_status build_loader(run *r, const char *sec, bool train, cm_dataset **ds, cm_dataloader **dl) {
    cm_config *c = r->cfg;
    TRY(open_dataset(r, sec, train, ds));
    cm_dataloader_config lc = train ? cm_dataloader_config_default() : cm_dataloader_config_eval();
    int64_t bs_default = train ? 32 : (r->train_batch ? r->train_batch : 32);
    if (train && cm_config_has(c, "global_train_batch_size")) {
        TRY(cm_config_get_int(c, "global_train_batch_size", 32, &bs_default));
        char k[256];
        if (cm_config_has(c, keyf(k, sizeof k, sec, "batch_size")))
            return bad(c, "global_train_batch_size", "set both here and as %s; keep one", k);
    }
    TRY(get_i(c, sec, "batch_size", bs_default, &lc.batch_size));
    if (train) {
        TRY(get_b(c, sec, "shuffle", true, &lc.shuffle));
        TRY(get_b(c, sec, "drop_last", true, &lc.drop_last));
        r->train_batch = lc.batch_size;
    }
    int64_t nw;
    TRY(get_i(c, sec, "num_workers", 1, &nw));
    lc.num_workers = (int)nw;
    int64_t pf;
    TRY(get_i(c, sec, "prefetch_depth", 2, &pf));
    lc.prefetch_depth = (int)pf;
    lc.seed = r->seed;
    /* llm-foundry's dataset.allow_pad_trimming: each batch cut to its longest row (a multiple of
     * pad_to_multiple_of, Hugging Face's collator argument; 8 as llm-foundry's collator) */
    char dk[256], trim_key[300], mult_key[300];
    keyf(dk, sizeof dk, sec, "dataset");
    keyf(trim_key, sizeof trim_key, dk, "allow_pad_trimming");
    keyf(mult_key, sizeof mult_key, dk, "pad_to_multiple_of");
    TRY(get_b(c, dk, "allow_pad_trimming", false, &lc.trim_padding));
    if (!lc.trim_padding && cm_config_has(c, mult_key))
        return bad(c, mult_key, "has no effect without %s: true (batches are padded to max_seq_len)", trim_key);
    if (lc.trim_padding) /* read only then, so a run folder's config.yaml of an untrimmed run has no value for it */
        TRY(get_i(c, dk, "pad_to_multiple_of", 8, &lc.pad_to_multiple_of));
    /* batch_size stays the global batch (Composer's global_train_batch_size): each rank loads its
     * slice of it, and the trainer weights every rank's microbatches by their share */
    lc.rank = r->rank;
    lc.world_size = r->world;
    if (cm_dataloader_new(*ds, &lc, dl) != CM_OK)
        return at_key(c, !lc.trim_padding ? sec : lc.pad_to_multiple_of < 1 ? mult_key : trim_key, cm_last_status());
    if (lc.trim_padding)
        cli_say(&r->ctx, "%s: each batch cut to its longest row, a multiple of %lld (allow_pad_trimming)\n", sec,
                (long long)lc.pad_to_multiple_of);
    return CM_OK;
}

/* eval_loader: one loader (metrics/eval/...), or llm-foundry's list of loaders, each with a
 * `label` (metrics/eval/<label>/...), evaluated one after the other at every evaluation. */
static cm_status build_eval_loaders(run *r) {
    cm_config *c = r->cfg;
    if (cm_config_kind_of(c, "eval_loader") == CM_CONFIG_MAP) {
        snprintf(r->eval_label[0], sizeof r->eval_label[0], "eval");
        r->n_evals = 1; /* first: what a failing build_loader leaves is freed with the run */
        return build_loader(r, "eval_loader", false, &r->eval_ds[0], &r->eval_dl[0]);
    }
    const int n = cm_config_len(c, "eval_loader");
    if (n == 0 || n > MAX_EVALS)
        return bad(c, "eval_loader", "a list of 1 to %d loaders, each {label: NAME, dataset: {...}, batch_size: ...} "
                   "(it has %d)", MAX_EVALS, n);
    for (int i = 0; i < n; i++) {
        char sec[64], k[96];
        snprintf(sec, sizeof sec, "eval_loader.%d", i);
        if (cm_config_kind_of(c, sec) != CM_CONFIG_MAP)
            return bad(c, sec, "expected {label: NAME, dataset: {...}, batch_size: ...}");
        const char *label;
        TRY(get_s(c, sec, "label", NULL, &label));
        keyf(k, sizeof k, sec, "label");
        if (!label || !*label)
            return bad(c, k, "required in a list of eval loaders: the name its metrics are logged under "
                       "(metrics/eval/<label>/...)");
        if (strlen(label) > 58 || strspn(label, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") !=
                                      strlen(label))
            return bad(c, k, "'%s': letters, digits, '_', '-' and '.', at most 58", label);
        snprintf(r->eval_label[i], sizeof r->eval_label[i], "eval/%s", label);
        for (int j = 0; j < i; j++)
            if (!strcmp(r->eval_label[j], r->eval_label[i]))
                return bad(c, k, "'%s' labels two eval loaders (%d and %d)", label, j, i);
        r->n_evals = i + 1;
        TRY(build_loader(r, sec, false, &r->eval_ds[i], &r->eval_dl[i]));
    }
    return CM_OK;
}

/* The trainer's evaluation sets: the one loader as its eval_dataloader, or the labelled list. */
static void set_evaluators(run *r) {
    if (r->n_evals == 1 && !strcmp(r->eval_label[0], "eval")) {
        r->tc.eval_dataloader = r->eval_dl[0];
        return;
    }
    for (int i = 0; i < r->n_evals; i++) {
        r->evals[i] = cm_evaluator_default();
        r->evals[i].label = r->eval_label[i];
        r->evals[i].dataloader = r->eval_dl[i];
    }
    r->tc.evaluators = r->evals, r->tc.n_evaluators = r->n_evals;
}

/* ---------------------------------------------------------------------------------------------
 * Optimizer and schedulers
 * ------------------------------------------------------------------------------------------- */

/* The optimizer's keys are read by cli_optim_read; make_optimizer builds it once the model is
 * finalized, placed and (with data parallelism) laid out. */
static cm_status make_optimizer(run *r) {
    return cli_optim_make(&r->opt_cfg, r->model, r->dp, &r->ctx, &r->opt);
}

enum { F_TMAX = 1, F_TWARM = 2, F_STEP = 4, F_DECAY = 8, F_T0 = 16, F_MILE = 32, F_GAMMA = 64, F_ALPHA = 128,
       F_ALPHA_I = 256, F_ALPHA_F = 512, F_POWER = 1024, F_TMULT = 2048 };

static int sched_fields(cm_sched_kind k) {
    switch (k) {
    case CM_SCHED_STEP: return F_STEP | F_GAMMA;
    case CM_SCHED_MULTISTEP: return F_MILE | F_GAMMA;
    case CM_SCHED_CONSTANT: return F_ALPHA | F_TMAX;
    case CM_SCHED_LINEAR: return F_ALPHA_I | F_ALPHA_F | F_TMAX;
    case CM_SCHED_EXPONENTIAL: return F_GAMMA | F_DECAY;
    case CM_SCHED_COSINE_ANNEALING: return F_TMAX | F_ALPHA_F;
    case CM_SCHED_COSINE_ANNEALING_WARM_RESTARTS: return F_T0 | F_TMULT | F_ALPHA_F;
    case CM_SCHED_POLYNOMIAL: return F_POWER | F_TMAX | F_ALPHA_F;
    case CM_SCHED_MULTISTEP_WITH_WARMUP: return F_TWARM | F_MILE | F_GAMMA;
    case CM_SCHED_CONSTANT_WITH_WARMUP: return F_TWARM | F_ALPHA | F_TMAX;
    case CM_SCHED_LINEAR_WITH_WARMUP: return F_TWARM | F_ALPHA_I | F_ALPHA_F | F_TMAX;
    case CM_SCHED_COSINE_ANNEALING_WITH_WARMUP: return F_TWARM | F_TMAX | F_ALPHA_F;
    case CM_SCHED_POLYNOMIAL_WITH_WARMUP: return F_TWARM | F_POWER | F_TMAX | F_ALPHA_F;
    default: return 0;
    }
}

static cm_status sched_time(cm_config *c, const char *p, const char *key, cm_time *t) {
    char def[CM_TIME_STR_MAX];
    cm_time_to_string(*t, def, sizeof def);
    return get_t(c, p, key, def, t);
}

static cm_status build_one_sched(run *r, const char *p) {
    cm_config *c = r->cfg;
    char k[256];
    const char *name;
    TRY(get_s(c, p, "name", NULL, &name));
    if (!name) return bad(c, p, "a scheduler needs a name (e.g. cosine_with_warmup)");
    cm_sched_kind kind;
    if (cm_sched_kind_parse(name, &kind) != CM_OK) return at_key(c, keyf(k, sizeof k, p, "name"), CM_ERR_INVALID_ARG);
    if (r->n_scheds == MAX_SCHEDS) return bad(c, p, "at most %d schedulers", MAX_SCHEDS);
    cm_sched_config s = cm_sched_config_default(kind);
    int f = sched_fields(kind);
    if (f & F_TWARM) {
        TRY(sched_time(c, p, "t_warmup", &s.t_warmup));
        TRY(get_b(c, p, "scale_warmup", s.scale_warmup, &s.scale_warmup));
    }
    if (f & F_TMAX) TRY(sched_time(c, p, "t_max", &s.t_max));
    if (f & F_STEP) TRY(sched_time(c, p, "step_size", &s.step_size));
    if (f & F_DECAY) TRY(sched_time(c, p, "decay_period", &s.decay_period));
    if (f & F_T0) TRY(sched_time(c, p, "t_0", &s.t_0));
    if (f & F_TMULT) TRY(get_d(c, p, "t_mult", s.t_mult, &s.t_mult));
    if (f & F_GAMMA) TRY(get_d(c, p, "gamma", s.gamma, &s.gamma));
    if (f & F_ALPHA) TRY(get_d(c, p, "alpha", s.alpha, &s.alpha));
    if (f & F_ALPHA_I) TRY(get_d(c, p, "alpha_i", s.alpha_i, &s.alpha_i));
    if (f & F_ALPHA_F) TRY(get_d(c, p, "alpha_f", s.alpha_f, &s.alpha_f));
    if (f & F_POWER) TRY(get_d(c, p, "power", s.power, &s.power));
    if (f & F_MILE) {
        keyf(k, sizeof k, p, "milestones");
        int n = cm_config_len(c, k);
        if (cm_config_kind_of(c, k) != CM_CONFIG_SEQ || n < 1) return bad(c, k, "required: a list of times ([30ep, 60ep])");
        if (n > CM_SCHED_MAX_MILESTONES) return bad(c, k, "at most %d milestones", CM_SCHED_MAX_MILESTONES);
        for (int i = 0; i < n; i++) {
            char ki[300];
            snprintf(ki, sizeof ki, "%s.%d", k, i);
            TRY(cm_config_get_time(c, ki, NULL, &s.milestones[i]));
        }
        s.n_milestones = n;
    }
    if (cm_sched_validate(&s) != CM_OK) return at_key(c, p, CM_ERR_INVALID_ARG);
    r->scheds[r->n_scheds++] = s;
    return CM_OK;
}

static cm_status build_schedulers(run *r) {
    cm_config *c = r->cfg;
    if (cm_config_has(c, "scheduler") && cm_config_has(c, "schedulers"))
        return bad(c, "scheduler", "use either 'scheduler' (one) or 'schedulers' (a list), not both");
    if (cm_config_kind_of(c, "scheduler") == CM_CONFIG_MAP) return build_one_sched(r, "scheduler");
    if (cm_config_has(c, "scheduler")) return bad(c, "scheduler", "expected a map ({name: cosine_with_warmup, ...})");
    cm_config_kind k = cm_config_kind_of(c, "schedulers");
    if (k == CM_CONFIG_MAP) return build_one_sched(r, "schedulers");
    if (k == CM_CONFIG_SEQ) {
        for (int i = 0; i < cm_config_len(c, "schedulers"); i++) {
            char p[64];
            snprintf(p, sizeof p, "schedulers.%d", i);
            TRY(build_one_sched(r, p));
        }
    } else if (k == CM_CONFIG_SCALAR) {
        return bad(c, "schedulers", "expected a list of maps ([{name: cosine_with_warmup, t_warmup: 100ba}])");
    }
    return CM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Plugins
 * ------------------------------------------------------------------------------------------- */

/* Makes the entries of `section` into r's plugins; surgery_only (eval and generate): only the
 * algorithms that change the model (composer/surgery_algorithms.h), the others are left unread. */
static cm_status build_plugins_of(run *r, const char *section, cli_plugin_kind kind, bool surgery_only) {
    cm_config *c = r->cfg;
    cm_config_kind k = cm_config_kind_of(c, section);
    if (k == CM_CONFIG_ABSENT || k == CM_CONFIG_NULL) {
        cm_config_touch(c, section);
        return CM_OK;
    }
    if (k != CM_CONFIG_MAP) return bad(c, section, "expected a map of names to arguments (%s: {name: {...}})", section);
    for (int i = 0; i < cm_config_len(c, section); i++) {
        const char *name = cm_config_key_at(c, section, i);
        if (surgery_only && !cm_algorithm_info_find(name)) continue;
        const cli_plugin_entry *e = cli_plugin_find(c, section, name, kind);
        if (!e) return CM_ERR_INVALID_ARG;
        char p[256];
        snprintf(p, sizeof p, "%s.%s", section, name);
        cm_config_kind pk = cm_config_kind_of(c, p);
        if (pk != CM_CONFIG_MAP && pk != CM_CONFIG_NULL) return bad(c, p, "expected a map of arguments ({} for none)");
        cli_plugin_out out = {0};
        TRY(e->make(c, p, &r->ctx, &out));
        /* an argument-less entry ({} or null) is read; an entry with arguments is read key by key
         * by its constructor, so an argument it does not know stays unread and is reported with
         * the closest valid name (touching the whole map would hide it) */
        cli_touch_entry(c, p);
        if (out.none) continue;
        int *n = kind == CLI_ALGORITHM ? &r->n_algs : kind == CLI_CALLBACK ? &r->n_cbs : &r->n_lgs;
        if (*n == MAX_PLUGINS) return bad(c, section, "at most %d entries", MAX_PLUGINS);
        if (kind == CLI_ALGORITHM) r->algs[(*n)++] = out.algorithm;
        else if (kind == CLI_CALLBACK) r->cbs[(*n)++] = out.callback;
        else r->lgs[(*n)++] = out.logger;
    }
    return CM_OK;
}

static cm_status build_plugins(run *r, const char *section, cli_plugin_kind kind) {
    return build_plugins_of(r, section, kind, false);
}

/* eval and generate: the model the weights were trained as. The config's surgery algorithms and
 * what the checkpoint it started from (load_path) requires on load are applied before the
 * weights load (ALiBi's attention, gated linear units' layers, BlurPool's filters: without them
 * the weights do not load, or load into another model). `ckpt`, a Composer checkpoint given as
 * the weights, is asked instead of the config's load_path. Afterwards r->tc loads `ckpt`'s
 * weights (strictly) or nothing: the config's load_path is never loaded over the weights being
 * evaluated. */
static cm_status apply_trained_surgery(run *r, const char *ckpt) {
    cm_trainer_config *tc = &r->tc;
    if (ckpt) {
        tc->load_path = ckpt;
    } else if (tc->load_path && !cm_storage_is_remote(tc->load_path) && access(tc->load_path, F_OK) != 0) {
        cm_log_msg(CM_LOG_WARN, "load_path '%s' (the checkpoint the run started from) is gone: the model surgery it "
                   "required on load, if any, is not applied", tc->load_path);
        tc->load_path = NULL;
    }
    tc->model = r->model;
    tc->algorithms = r->algs, tc->n_algorithms = r->n_algs;
    cm_status s = cm_trainer_prepare_model(tc);
    tc->load_path = ckpt;
    tc->load_weights_only = true;
    tc->load_strict_model_weights = true;
    return s;
}

/* The surgery a weights file records (surgery_algorithms.h, CM_SURGERY_METADATA_KEY): its methods
 * the config does not name are appended to r->algs (with Composer's warning), so that
 * cm_trainer_prepare_model makes the model the weights were trained as before they load.
 * *recorded (may be NULL): whether the file records any. Anything but a readable .safetensors file
 * (a checkpoint, a folder) records nothing here; its loader reports what is wrong with it. */
static cm_status add_recorded_surgery(run *r, const char *weights, bool *recorded) {
    if (recorded) *recorded = false;
    struct stat sb;
    cm_safetensors *st;
    if (!weights || stat(weights, &sb) != 0 || !S_ISREG(sb.st_mode)) return CM_OK;
    if (cm_safetensors_open(weights, &st) != CM_OK) {
        cm_clear_error();
        return CM_OK;
    }
    const char *rec = cm_safetensors_metadata_get(st, CM_SURGERY_METADATA_KEY);
    if (recorded) *recorded = rec != NULL;
    cm_status s = cm_algorithms_add_recorded(rec, weights, r->tc.load_exclude_algorithms, r->tc.n_load_exclude_algorithms,
                                             r->algs, &r->n_algs, MAX_PLUGINS, NULL);
    cm_safetensors_close(st);
    return s;
}

/* Whether `path` is a Composer checkpoint (a folder with a manifest, or a save folder whose
 * latest pointer leads to one), not a .safetensors file or a Hugging Face folder. */
static bool is_composer_checkpoint(const char *path) {
    char m[PATH_MAX];
    snprintf(m, sizeof m, "%s/manifest.json", path);
    if (access(m, F_OK) == 0) return true;
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) return false;
    cm_checkpoint *ck;
    if (cm_checkpoint_open(path, &ck) != CM_OK) {
        cm_clear_error();
        return false;
    }
    cm_checkpoint_close(ck);
    return true;
}

/* The profiler runs first among the callbacks (every rank makes one: the ranks meet at its
 * barriers when a cycle starts and ends; rank 0 prints the op table). */
static cm_status build_profiler(run *r) {
    cm_callback_plugin p;
    bool present;
    TRY(cli_profiler_make(r->cfg, r->run_root, r->tc.autoresume, r->rank == 0 && !r->ctx.quiet, &p, &present));
    if (!present) return CM_OK;
    if (r->n_cbs == MAX_PLUGINS) {
        cm_callback_plugin_free(p);
        return bad(r->cfg, "callbacks", "at most %d entries with the profiler", MAX_PLUGINS - 1);
    }
    memmove(r->cbs + 1, r->cbs, sizeof *r->cbs * (size_t)r->n_cbs);
    r->cbs[0] = p;
    r->n_cbs++;
    return CM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * The whole config
 * ------------------------------------------------------------------------------------------- */

/* Keys a config may carry that this mode does not use (so eval and generate accept a training
 * config as is). */
static void touch_unused(run *r) {
    static const char *const train_only[] = {
        "max_duration", "optimizer", "scheduler", "schedulers", "algorithms", "callbacks", "loggers",
        "train_loader", "global_train_batch_size", "device_train_microbatch_size", "eval_interval", "profiler",
        "save_folder", "save_interval", "save_num_checkpoints_to_keep", "autoresume", "load_path",
        "save_filename", "save_latest_filename", "save_overwrite", "save_weights_only", "load_weights_only",
        "load_strict_model_weights", "load_exclude_algorithms",
        "scale_schedule_ratio", "progress_bar", "console_log_interval", "sample", "run_root", "run_name",
        "deterministic_mode", "accumulate_train_batch_on_tokens", "parallelism", "precision", "device",
        "dist_timeout", "fsdp_config", "arena_budget", "device_arena_budget", "compute_training_metrics"};
    for (size_t i = 0; i < sizeof train_only / sizeof *train_only; i++) cm_config_touch(r->cfg, train_only[i]);
    if (r->mode == MODE_GENERATE) {
        cm_config_touch(r->cfg, "eval_loader");
        cm_config_touch(r->cfg, "eval_subset_num_batches");
    }
}

static cm_status read_load_keys(run *r);

static cm_status read_trainer_keys(run *r) {
    cm_config *c = r->cfg;
    cm_trainer_config *tc = &r->tc;
    static const char *const precisions[] = {
#define CM_X_(name, str) str,
        CM_PRECISION_LIST(CM_X_)
#undef CM_X_
    };
    int prec;
    TRY(cm_config_get_choice(c, "precision", precisions, CM_PRECISION_COUNT, "fp32", &prec));
    tc->precision = (cm_precision)prec;
    /* Composer's device: cpu or gpu ("cuda" is taken too) */
    static const char *const devices[] = {"cpu", "gpu", "cuda"};
    int dev;
    TRY(cm_config_get_choice(c, "device", devices, 3, "cpu", &dev));
    tc->device = dev == 0 ? CM_DEVICE_CPU : CM_DEVICE_CUDA;
    if (r->mode == MODE_GENERATE) return CM_OK;
    /* distribution (used when the launcher or mpirun started this process) */
    TRY(cli_fsdp_read(c, r->mode == MODE_TRAIN, tc->precision, tc->device, &r->fsdp));
    r->sharding = r->fsdp.sharding;
    if (cm_config_has(c, "dist_timeout")) {
        TRY(cm_config_get_double(c, "dist_timeout", 300, &r->dist_timeout));
        if (!(r->dist_timeout > 0))
            return bad(c, "dist_timeout", "%g must be > 0 (seconds a rank waits in one collective)", r->dist_timeout);
    }
    if (r->mode != MODE_TRAIN) return CM_OK;
    TRY(cm_config_get_time(c, "max_duration", NULL, &tc->max_duration));
    if (tc->max_duration.count == 0 && tc->max_duration.unit != CM_TIME_DURATION)
        return bad(c, "max_duration", "required: how long to train (e.g. max_duration: 2000ba, or 2ep)");
    TRY(cm_config_get_time(c, "eval_interval", "1ep", &tc->eval_interval));
    TRY(cm_config_get_bool(c, "compute_training_metrics", false, &tc->compute_training_metrics));
    TRY(cm_config_get_double(c, "scale_schedule_ratio", 1.0, &tc->scale_schedule_ratio));
    TRY(cm_config_get_bool(c, "deterministic_mode", false, &tc->deterministic_mode));
    TRY(cm_config_get_bool(c, "accumulate_train_batch_on_tokens", false, &tc->accumulate_train_batch_on_tokens));
    if (cm_config_kind_of(c, "device_train_microbatch_size") == CM_CONFIG_SCALAR) {
        const char *v;
        TRY(cm_config_get_string(c, "device_train_microbatch_size", NULL, &v));
        bool is_auto = strcasecmp(v, "auto") == 0;
        if (is_auto) tc->device_train_microbatch_size = CM_MICROBATCH_AUTO;
        else TRY(cm_config_get_int(c, "device_train_microbatch_size", 0, &tc->device_train_microbatch_size));
        if (!is_auto && tc->device_train_microbatch_size < 0)
            return bad(c, "device_train_microbatch_size", "'%s' must be a number of rows (0 = the whole batch) or auto", v);
    } else {
        TRY(cm_config_get_int(c, "device_train_microbatch_size", 0, &tc->device_train_microbatch_size));
    }
    /* the tape's byte budgets (what automatic microbatching and its memory plan fit into) */
    static const char *const budget_keys[] = {"arena_budget", "device_arena_budget"};
    size_t *budgets[] = {&tc->arena_budget, &tc->device_arena_budget};
    for (int i = 0; i < 2; i++) {
        const char *v;
        int64_t n = 0;
        TRY(cm_config_get_string(c, budget_keys[i], NULL, &v));
        if (v && !parse_bytes(v, &n))
            return bad(c, budget_keys[i], "'%s' is not a byte size (e.g. 2gb, 512mb, 1048576; 0 = unlimited)", v);
        *budgets[i] = (size_t)n;
    }
    TRY(cm_config_get_bool(c, "progress_bar", true, &r->ctx.progress_bar));
    TRY(cm_config_get_time(c, "console_log_interval", "0", &r->ctx.console_log_interval));
    /* checkpoints (Composer's names; see checkpoint.h and cm_trainer_config) */
    TRY(cm_config_get_string(c, "save_folder", NULL, &tc->save_folder));
    TRY(cm_config_get_string(c, "save_filename", NULL, &tc->save_filename));
    TRY(cm_config_get_string(c, "save_latest_filename", NULL, &tc->save_latest_filename));
    TRY(cm_config_get_time(c, "save_interval", "1ep", &tc->save_interval));
    TRY(cm_config_get_bool(c, "save_overwrite", false, &tc->save_overwrite));
    TRY(cm_config_get_bool(c, "save_weights_only", false, &tc->save_weights_only));
    int64_t keep;
    TRY(cm_config_get_int(c, "save_num_checkpoints_to_keep", -1, &keep));
    tc->save_num_checkpoints_to_keep = (int)keep;
    TRY(cm_config_get_bool(c, "autoresume", false, &tc->autoresume));
    TRY(cm_config_get_bool(c, "load_weights_only", false, &tc->load_weights_only));
    TRY(cm_config_get_bool(c, "load_strict_model_weights", true, &tc->load_strict_model_weights));
    TRY(read_load_keys(r));
    if (tc->autoresume && !tc->save_folder)
        return bad(c, "autoresume", "needs save_folder (the folder to resume from) and a fixed run_name");
    return CM_OK;
}

/* load_path and load_exclude_algorithms: what a run starts from (train), and what surgery the
 * checkpoint it started from requires (eval and generate, apply_trained_surgery). */
static cm_status read_load_keys(run *r) {
    cm_config *c = r->cfg;
    cm_trainer_config *tc = &r->tc;
    /* load_path: a .safetensors file is weights to start from; anything else is a checkpoint */
    TRY(cm_config_get_string(c, "load_path", NULL, &r->load_path));
    if (r->load_path && !strstr(r->load_path, ".safetensors")) {
        tc->load_path = r->load_path;
        r->load_path = NULL;
    }
    /* load_exclude_algorithms: [BlurPool, ...] — algorithms (glob patterns of class names) whose
     * checkpoint state is not loaded and whose surgery is not re-applied */
    cm_config_kind ek = cm_config_kind_of(c, "load_exclude_algorithms");
    if (ek == CM_CONFIG_SCALAR) {
        TRY(cm_config_get_string(c, "load_exclude_algorithms", NULL, &r->exclude_algs[0]));
        tc->n_load_exclude_algorithms = 1;
    } else if (ek == CM_CONFIG_SEQ) {
        const int n = cm_config_len(c, "load_exclude_algorithms");
        if (n > MAX_PLUGINS) return bad(c, "load_exclude_algorithms", "at most %d names", MAX_PLUGINS);
        for (int i = 0; i < n; i++) {
            char k[64];
            snprintf(k, sizeof k, "load_exclude_algorithms.%d", i);
            TRY(cm_config_get_string(c, k, NULL, &r->exclude_algs[i]));
        }
        tc->n_load_exclude_algorithms = n;
    } else if (ek == CM_CONFIG_MAP) {
        return bad(c, "load_exclude_algorithms", "expected a list of algorithm names ([BlurPool, SqueezeExcite])");
    } else {
        cm_config_touch(c, "load_exclude_algorithms");
    }
    tc->load_exclude_algorithms = r->exclude_algs;
    return CM_OK;
}

/* The communicator, when the launcher or mpirun / srun started this process (cm_dist_launched);
 * one process makes none (rank 0 of 1, MPI never initialised). dist_timeout (Composer's name)
 * becomes every collective's timeout. */
static cm_status start_comm(run *r) {
    r->rank = 0, r->world = 1;
    if (!cm_dist_launched()) return CM_OK;
    cm_comm_config cc = cm_comm_config_default();
    if (r->dist_timeout > 0) cc.timeout_s = r->dist_timeout;
    if (cm_comm_auto_new(&cc, &r->comm) != CM_OK) return cm_last_status();
    r->rank = cm_comm_rank(r->comm);
    r->world = cm_comm_size(r->comm);
    /* plain mpirun / srun: share the node's cores among its ranks as `composer -n` does */
    const char *t = getenv("CM_NUM_THREADS");
    const cm_dist_env env = cm_dist_env_get();
    if ((!t || !*t) && env.local_world_size > 1) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        long per_rank = (cores > 0 ? cores : 1) / env.local_world_size;
        cm_set_num_threads(per_rank > 0 ? (int)per_rank : 1);
    }
    return CM_OK;
}

/* Data parallelism over the communicator (after the model, before the optimizer): broadcasts rank
 * 0's parameters, so every rank starts from the same weights. */
static cm_status start_dist(run *r) {
    cm_dist_config dc = cm_dist_config_default();
    TRY(cli_fsdp_check_dist(r->cfg, &r->fsdp, r->world, &dc));
    char k[128];
    snprintf(k, sizeof k, "%s.sharding_strategy", r->fsdp.prefix);
    if (!r->comm && dc.cpu_offload) { /* one process streams its GPU's blocks from host memory */
        cm_status s = cm_device_check(r->tc.device);
        if (s) { /* said as a plain GPU run says it */
            char msg[900];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            return cm_set_error(s, "%s: device gpu: %s", cm_config_origin(r->cfg, "device"), msg);
        }
        s = cm_comm_single_new(NULL, &r->comm);
        if (!s) s = cm_dist_new(r->comm, r->model, &dc, &r->dp);
        snprintf(k, sizeof k, "%s.cpu_offload", r->fsdp.prefix);
        if (s) return at_key(r->cfg, k, s);
        cm_log_msg(CM_LOG_INFO, "%s: parameters, gradients and optimizer state in host memory; each of the %d wrap "
                                "units is uploaded to the GPU when it runs, and the optimizer steps on the CPU",
                   k, cm_module_n_units(cm_model_module(r->model)));
        return CM_OK;
    }
    if (!r->comm) {
        if (r->sharding != CM_SHARDING_NO_SHARD)
            cm_log_msg(CM_LOG_INFO, "one process: %s %s has nothing to shard (start ranks with composer -n N)", k,
                       cm_sharding_name(r->sharding));
        if (!r->fsdp.mp16) return CM_OK;
        /* a 16-bit mixed_precision applies on one process too: a data-parallel layer of one rank
         * (NO_SHARD) holds the f32 masters and rounds */
        TRY(cm_comm_single_new(NULL, &r->comm));
        dc.sharding = CM_SHARDING_NO_SHARD;
        return cm_dist_new(r->comm, r->model, &dc, &r->dp);
    }
    dc.sharding = r->sharding;
    if (r->tc.device != CM_DEVICE_CPU && dc.sharding != CM_SHARDING_NO_SHARD)
        return at_key(r->cfg, k, cm_set_error(CM_ERR_UNSUPPORTED, "%s on %d ranks with device gpu is not built (the "
                                                                  "sharded strategies keep their shards in host memory); "
                                                                  "use NO_SHARD: each rank's GPU holds the model and "
                                                                  "the gradients are all-reduced",
                                              cm_sharding_name(dc.sharding), r->world));
    cm_status s = cm_dist_new(r->comm, r->model, &dc, &r->dp);
    if (s == CM_ERR_UNSUPPORTED || s == CM_ERR_INVALID_ARG) return at_key(r->cfg, k, s);
    if (!s) cli_fsdp_say_dist(&r->fsdp, &dc, &r->ctx, r->rank);
    return s;
}

/* A model from a pretrained folder carries the folder's config.json and tokenizer into every
 * checkpoint (a record-only HuggingFaceCheckpointer, unless callbacks.hf_checkpointer made one),
 * so `composer ckpt export --hf` can write the folder back. */
static cm_status add_hf_record(run *r) {
    if (!r->hf) return CM_OK;
    for (int i = 0; i < r->n_cbs; i++)
        if (!strcmp(r->cbs[i].vt->name, "HuggingFaceCheckpointer")) return CM_OK;
    if (r->n_cbs == MAX_PLUGINS) return bad(r->cfg, "callbacks", "at most %d entries", MAX_PLUGINS - 1);
    cm_hf_checkpointer_config hc = cm_hf_checkpointer_config_default();
    hc.model = r->model;
    hc.tokenizer = r->tok;
    hc.model_max_length = r->hf_ti.model_max_length;
    TRY(cm_hf_checkpointer_new(&hc, &r->cbs[r->n_cbs]));
    r->n_cbs++;
    return CM_OK;
}

static cm_status build_run(run *r) {
    cm_config *c = r->cfg;
    int64_t seed;
    TRY(cm_config_get_int(c, "seed", 42, &seed));
    r->seed = (uint64_t)seed;
    r->tc = cm_trainer_config_default();
    r->tc.seed = r->seed;
    if (r->mode == MODE_TRAIN) {
        TRY(cm_config_get_string(c, "run_name", NULL, &r->run_name));
        TRY(cm_config_get_string(c, "run_root", CM_RUN_ROOT_DEFAULT, &r->run_root));
        if (r->run_name && cm_run_name_check(r->run_name) != CM_OK) return at_key(c, "run_name", CM_ERR_INVALID_ARG);
    }
    TRY(read_trainer_keys(r));
    if (r->mode != MODE_GENERATE) TRY(start_comm(r));
    /* the tokenizer of the token data (vocabulary size, samples) */
    find_tokenizer(r, r->mode == MODE_TRAIN                                  ? "train_loader"
                      : cm_config_kind_of(r->cfg, "eval_loader") == CM_CONFIG_SEQ ? "eval_loader.0"
                                                                                  : "eval_loader");
    if (r->mode != MODE_TRAIN) find_tokenizer(r, "train_loader");
    TRY(build_model(r, true));
    if (r->mode == MODE_TRAIN) {
        if (cm_config_kind_of(c, "train_loader") != CM_CONFIG_MAP)
            return bad(c, "train_loader", "required: {dataset: {type: ..., ...}, batch_size: ...}");
        TRY(build_loader(r, "train_loader", true, &r->train_ds, &r->train_dl));
    }
    if (r->mode != MODE_GENERATE) {
        const cm_config_kind ek = cm_config_kind_of(c, "eval_loader");
        if (ek == CM_CONFIG_MAP || ek == CM_CONFIG_SEQ)
            TRY(build_eval_loaders(r));
        else if (r->mode == MODE_EVAL)
            return bad(c, "eval_loader", "required for eval: {dataset: {type: ..., ...}, batch_size: ...}, or a list of "
                                         "them, each with a label");
        else
            cm_config_touch(c, "eval_loader");
        TRY(cm_config_get_int(c, "eval_subset_num_batches", -1, &r->tc.eval_subset_num_batches));
    }
    if (r->mode == MODE_TRAIN) {
        TRY(cli_optim_read(c, &r->opt_cfg));
        TRY(build_schedulers(r));
        r->ctx.run_root = r->run_root;
        r->ctx.model = r->model;
        r->ctx.tok = r->tok;
        r->ctx.model_max_length = r->hf_ti.model_max_length;
        r->ctx.full_shard = r->sharding == CM_SHARDING_FULL_SHARD || r->sharding == CM_SHARDING_HYBRID_SHARD;
        TRY(build_plugins(r, "algorithms", CLI_ALGORITHM));
        TRY(build_plugins(r, "callbacks", CLI_CALLBACK));
        TRY(add_hf_record(r));
        TRY(build_profiler(r));
        TRY(build_plugins(r, "loggers", CLI_LOGGER));
        if (r->gpt2) {
            TRY(cm_config_get_string(c, "sample.prompt", "\n", &r->prompt));
            TRY(cm_config_get_int(c, "sample.max_new_tokens", 300, &r->sample_tokens));
            TRY(cm_config_get_double(c, "sample.temperature", 0.8, &r->temperature));
            TRY(cm_config_get_int(c, "sample.top_k", 200, &r->top_k));
        }
    } else {
        TRY(read_load_keys(r));
        TRY(build_plugins_of(r, "algorithms", CLI_ALGORITHM, true));
        touch_unused(r);
    }
    return cm_config_check_unknown(c);
}

/* ---------------------------------------------------------------------------------------------
 * Help
 * ------------------------------------------------------------------------------------------- */

/* The registry's rows of a kind, one a line, indented to the key column. */
static void plugin_rows(FILE *f, cli_plugin_kind kind) {
    for (const cli_plugin_entry *e = cli_plugin_registry; e->name; e++)
        if (e->kind == kind) fprintf(f, "                     %s: %s\n", e->name, e->help);
}

static void print_keys(FILE *f) {
    fprintf(f,
            "config keys (YAML; override any of them with key.path=value):\n"
            "  model:             name: gpt2 | mlp | cnn | resnet | hf; preset: a zoo preset (gpt2: shakespeare-char,\n"
            "                     tiny, gpt2, ...; mlp/cnn: mnist, mnist_small, ...; resnet: resnet20, ...);\n"
            "                     then any config field by name (gpt2: vocab_size, n_positions, n_embd,\n"
            "                     n_layer, n_head, dropout | embd_pdrop attn_pdrop resid_pdrop,\n"
            "                     layer_norm_eps, bias, tie_word_embeddings, initializer_range;\n"
            "                     gpt2 and hf causal_lm: fused_linear_cross_entropy (false; true: lm_head and\n"
            "                     the loss fused by row chunks, the logits never held whole — Liger's kernel); mlp:\n"
            "                     in_features, hidden [..], num_classes, dropout; cnn: in_channels, image_h,\n"
            "                     image_w, channels [c1, c2], hidden, num_classes, dropout1, dropout2;\n"
            "                     resnet: num_classes, in_channels, zero_init_residual, channels_last)\n"
            "                     hf: a Hugging Face pretrained folder (BERT, GPT-2): pretrained_model_name_or_path,\n"
            "                     task: masked_lm | sequence_classification | causal_lm, num_labels (0: config.json's),\n"
            "                     pretrained (true; false: config.json only), config_overrides {field: value}\n"
            "  tokenizer:         (hf) name: a folder with vocab.txt / vocab.json+merges.txt / tokenizer.json\n"
            "                     (default: the model's folder), kwargs: {model_max_length}\n"
            "  train_loader:      dataset: {type: tokens | mnist | cifar10 | sst2 | tsv | text, dir, split, path\n"
            "  eval_loader:       (tokens: a .bin file or glob; text: a file or a list, .tsv files by column),\n"
            "                     seq_len (tokens), crop_padding, hflip_p (cifar10), max_seq_len (128),\n"
            "                     text_column (sentence), label_column (label), line_by_line (false),\n"
            "                     mlm_probability (0.15, masked_lm), allow_pad_trimming (false; true: each\n"
            "                     batch cut to its longest row, llm-foundry's), pad_to_multiple_of (8)},\n"
            "                     batch_size (global), shuffle, drop_last, num_workers (1), prefetch_depth;\n"
            "                     or dataset: {type: streaming (MosaicML Streaming's MDS), remote (s3://, gs://,\n"
            "                     oci://, file://, a folder), local (the cache), split, streams: {name: {remote,\n"
            "                     local, split, proportion | repeat | choose}}, shuffle, shuffle_algo,\n"
            "                     shuffle_seed, shuffle_block_size, num_canonical_nodes, partition_algo,\n"
            "                     sampling_method, sampling_granularity, epoch_size, batch_size (per device),\n"
            "                     predownload, cache_limit (10gb), download_retry, keep_zip, validate_hash,\n"
            "                     allow_unsafe_types, max_seq_len (a tokens column), image_h, image_w,\n"
            "                     image_c, image_mean, image_std, crop_padding, hflip_p (image columns),\n"
            "                     fields: {column: field}}; eval_loader may be a list of loaders, each with a\n"
            "                     label (llm-foundry's: logged as metrics/eval/<label>/..., all evaluated at\n"
            "                     every evaluation)\n"
            "  optimizer:         name: decoupled_adamw | adamw | adam | sgd | decoupled_sgdw; lr,\n"
            "                     weight_decay, betas [b1, b2], eps, amsgrad (adam kinds); momentum,\n"
            "                     dampening, nesterov (sgd kinds); disable_grad: REGEX | [REGEX, ..] (freeze\n"
            "                     the parameters whose names match); param_groups: [{param_str_match: REGEX,\n"
            "                     lr, weight_decay, ..}, ..] (a matching parameter takes the first group's\n"
            "                     values; POSIX extended regular expressions, as llm-foundry's re.search)\n"
            "  scheduler:         {name: cosine_with_warmup | linear_decay_with_warmup | constant_with_warmup\n"
            "  schedulers:        | step | multistep | exponential | cosine_annealing | polynomial | ...,\n"
            "                     t_warmup, t_max, alpha_f, alpha_i, alpha, gamma, power, step_size,\n"
            "                     milestones, decay_period, t_0, t_mult, scale_warmup}; schedulers: a list\n"
            "  algorithms:        gradient_clipping: {clipping_type: norm | value | adaptive, clipping_threshold};\n"
            "                     ema: {half_life, smoothing, ema_start, update_interval}; sam: {rho, epsilon,\n"
            "                     interval}; swa: {swa_start, swa_end, update_interval, schedule_swa_lr,\n"
            "                     anneal_strategy, anneal_steps, swa_lr}; layer_freezing: {freeze_start, freeze_level};\n"
            "                     model surgery, Composer's names and arguments: alibi {max_sequence_length,\n"
            "                     train_sequence_length_scaling}; blurpool {replace_convs, replace_maxpools,\n"
            "                     blur_first, min_channels}; channels_last {}; fused_layernorm {} (built in);\n"
            "                     ghost_batchnorm {ghost_batch_size}; low_precision_layernorm {apply_at};\n"
            "                     low_precision_groupnorm {apply_at}; squeeze_excite {latent_channels,\n"
            "                     min_channels}; stochastic_depth {target_layer_name, stochastic_method,\n"
            "                     drop_rate, drop_distribution, drop_warmup}; factorize {factorize_convs,\n"
            "                     factorize_linears, min_channels, latent_channels, min_features,\n"
            "                     latent_features}; gated_linear_units {act_fn, gated_layer_bias,\n"
            "                     non_gated_layer_bias}; gyro_dropout {p, sigma, tau};\n"
            "                     weight_standardization {n_last_layers_ignore}; no_op_model {};\n"
            "                     mixup, cutmix, cutout, colout, label_smoothing, progressive_resizing,\n"
            "                     seq_length_warmup, selective_backprop, randaugment, augmix: {Composer's\n"
            "                     argument names}\n"
            "  callbacks:         a map of Composer's callbacks by snake_case name, with their arguments:\n");
    plugin_rows(f, CLI_CALLBACK);
    fprintf(f,
            "  loggers:           a map of loggers:\n");
    plugin_rows(f, CLI_LOGGER);
    fprintf(f,
            "  profiler:          schedule: {skip_first (0), wait (0), warmup (1), active (4), repeat (1)},\n"
            "                     json_trace_handler: {folder (<run folder>/traces), filename\n"
            "                     (ep{epoch}-ba{batch}-rank{rank}.json), merged_trace_filename (merged_trace.json),\n"
            "                     overwrite, num_traces_to_keep (-1)}, sys_prof_cpu (true), sys_prof_memory,\n"
            "                     sys_prof_disk, sys_prof_net (false), sys_prof_stats_thread_interval_seconds (0.5),\n"
            "                     record_ops (true), summary_row_limit (20): Chrome traces and an op table\n"
            "  sample:            (gpt2) prompt (\"\\n\"), max_new_tokens (300), temperature (0.8), top_k (200)\n"
            "  max_duration       how long to train: 2000ba, 3ep, 1e6tok, ... (required)\n"
            "  eval_interval      1ep; 500ba; 0 disables evaluation during training\n"
            "  eval_subset_num_batches   -1 = the whole eval set\n"
            "  compute_training_metrics  false (Composer's default): true also computes the model's metrics\n"
            "                     on every training batch and logs metrics/train/<Name>\n"
            "  global_train_batch_size   the train loader's batch size (llm-foundry's name)\n"
            "  device_train_microbatch_size   rows per microbatch, or auto; 0 = the whole batch\n"
            "  arena_budget       bytes (2gb, 512mb) a microbatch's activations may take on the CPU (0 = no\n"
            "                     limit); device_arena_budget the same on the GPU. With auto microbatching\n"
            "                     the size is planned from a dry run of 1 and 2 rows to fit it (10%% margin),\n"
            "                     then halved on out-of-memory; --plan-memory prints the plan\n"
            "  precision          fp32 | amp_bf16 (amp_fp16: not on CPU)\n"
            "  seed (42), run_name (generated), run_root (runs), progress_bar (true),\n"
            "  console_log_interval (0 = off; e.g. 100ba), scale_schedule_ratio (1), deterministic_mode,\n"
            "  accumulate_train_batch_on_tokens (false) weight microbatches by their labelled tokens (labels\n"
            "                     other than -100) instead of samples: microbatched = the full batch for LMs\n"
            "  device             cpu | gpu: one NVIDIA GPU, in a build with CUDA\n"
            "  load_path          weights (.safetensors) to start from; the surgery they record is re-applied\n"
            "  save_folder, save_filename, save_interval, save_overwrite, save_weights_only,\n"
            "  save_num_checkpoints_to_keep, load_path (a checkpoint, or .safetensors weights),\n"
            "  load_weights_only, load_strict_model_weights, load_exclude_algorithms, autoresume:\n"
            "                     checkpoints, as Composer (a checkpoint's model surgery is re-applied)\n"
            "  dist_timeout       seconds a rank waits in one collective before the job fails naming the\n"
            "                     missing rank (300; the environment's CM_DIST_TIMEOUT when unset)\n");
    cli_fsdp_help(f);
    fprintf(f,
            "\nThe run writes runs/<run_name>/: config.yaml (resolved), log.txt, metrics.jsonl, loss.svg,\n"
            "model.safetensors and, for GPT models, tokenizer.json and sample.txt. A model: {name: hf} run\n"
            "keeps config.json and the tokenizer in its checkpoints: composer ckpt export --hf CKPT -o DIR\n"
            "writes the pretrained folder (or callbacks.hf_checkpointer writes it during training); a model\n"
            "changed by alibi or gated_linear_units has no folder form and fine-tunes from its checkpoint:\n"
            "load_path=CKPT load_weights_only=true load_strict_model_weights=false. With a bucket as\n"
            "save_folder, the run folder follows every checkpoint to <save_folder>/run/.\n");
}

static const char *g_print_config, *g_quiet_train, *g_plan_memory;
static const cli_flag k_train_flags[] = {
    {"--print-config", NULL, NULL, "print the resolved config (defaults filled in) and exit", &g_print_config},
    {"--plan-memory", NULL, NULL,
     "print the memory plan of the first batch (parameters, gradients, optimizer state, activations a row, "
     "workspace, the microbatch size that fits arena_budget) and exit without training or a run folder",
     &g_plan_memory},
    {"--quiet", "-q", NULL, "no progress output (the run folder is still written)", &g_quiet_train},
    {NULL, NULL, NULL, NULL, NULL},
};

static void train_usage(FILE *f, const char *prog) {
    fprintf(f,
            "usage: %s CONFIG.yaml [key.path=value ...] [--print-config | --plan-memory]\n\n"
            "Trains the model a YAML config describes (llm-foundry style: trainer options are top-level\n"
            "keys). Overrides on the command line are parsed as YAML values: optimizer.lr=3e-4,\n"
            "max_duration=500ba, optimizer.betas=[0.9,0.99]. Unknown keys and bad values are errors that\n"
            "name the key and suggest the closest valid one.\n\n"
            "Several ranks: composer -n N train CONFIG.yaml (or mpirun / srun) trains data-parallel.\n"
            "train_loader.batch_size is the global batch (Composer's global_train_batch_size): each rank\n"
            "loads its slice and the gradients are summed over the ranks, so N ranks train the same\n"
            "steps as one process. Rank 0 alone writes the run folder and prints; every rank's warnings\n"
            "and errors go to its stderr (composer -n N --stderr 'logs/rank{rank}.txt' keeps them apart).\n"
            "If a rank fails or a collective outlasts dist_timeout, the job stops with that rank's error.\n"
            "\noptions:\n",
            prog);
    cli_print_flags(f, k_train_flags);
    fprintf(f, "  %-28s %s\n\n", "-h, --help", "show this help and the config keys");
    print_keys(f);
}

/* Loads the config and applies the overrides; prints the error and returns nonzero on failure. */
static int load_config(const char *prog, const char *path, const char *const *overrides, int n, cm_config **out) {
    if (cm_config_load_file(path, out) != CM_OK) {
        fprintf(stderr, "%s: %s\n", prog, cm_last_error());
        return cm_last_status() == CM_ERR_IO ? 1 : EXIT_USAGE;
    }
    for (int i = 0; i < n; i++) {
        if (!strchr(overrides[i], '=')) {
            fprintf(stderr, "%s: unexpected argument '%s' (overrides are key.path=value)\n", prog, overrides[i]);
            cm_config_free(*out);
            return EXIT_USAGE;
        }
        if (cm_config_override(*out, overrides[i]) != CM_OK) {
            fprintf(stderr, "%s: %s\n", prog, cm_last_error());
            cm_config_free(*out);
            return EXIT_USAGE;
        }
    }
    return 0;
}

static int config_error(const char *prog, run *r) {
    fprintf(stderr, "%s: %s\n", prog, cm_last_error());
    cm_status s = cm_last_status();
    run_free(r);
    return s == CM_ERR_INVALID_ARG ? EXIT_USAGE : 1;
}

/* ---------------------------------------------------------------------------------------------
 * composer train
 * ------------------------------------------------------------------------------------------- */

static int64_t total_batches(const run *r) {
    cm_time m = r->tc.max_duration;
    int64_t spe = cm_dataloader_steps_per_epoch(r->train_dl);
    switch (m.unit) {
    case CM_TIME_BATCH: return m.count;
    case CM_TIME_EPOCH: return m.count * spe;
    case CM_TIME_SAMPLE: return r->train_batch ? (m.count + r->train_batch - 1) / r->train_batch : 0;
    default: return 0;
    }
}

static bool sample_progress(int64_t token, int64_t index, void *data) {
    (void)token, (void)index, (void)data;
    return true;
}

/* Generates n tokens after the prompt with the tokenizer; returns the text (cm_alloc'ed) or NULL. */
static char *generate_text(cm_model *m, cm_tokenizer *tok, const char *prompt, int64_t n, double temperature,
                           int64_t top_k, uint64_t seed) {
    int32_t *ids = NULL;
    int64_t np = 0;
    if (prompt && *prompt && cm_tokenizer_encode(tok, prompt, strlen(prompt), &ids, &np) != CM_OK) return NULL;
    int64_t *p64 = cm_alloc(sizeof(int64_t) * (size_t)(np + 1), 16);
    int64_t *out = cm_alloc(sizeof(int64_t) * (size_t)(n + 1), 16);
    int32_t *all = cm_alloc(sizeof(int32_t) * (size_t)(np + n + 1), 16);
    char *text = NULL;
    if (p64 && out && all) {
        for (int64_t i = 0; i < np; i++) p64[i] = ids[i];
        if (np == 0) {
            int32_t eot = cm_tokenizer_special(tok, CM_TOKEN_EOT);
            p64[0] = eot >= 0 ? eot : 0;
        }
        cm_gpt2_generate_config gc = cm_gpt2_generate_config_default();
        gc.temperature = (float)temperature;
        gc.top_k = top_k;
        gc.seed = seed;
        gc.on_token = sample_progress;
        int64_t n_out = 0;
        if (cm_gpt2_generate(m, p64, np ? np : 1, n, &gc, out, &n_out) == CM_OK) {
            for (int64_t i = 0; i < np; i++) all[i] = ids[i];
            for (int64_t i = 0; i < n_out; i++) all[np + i] = (int32_t)out[i];
            size_t len;
            if (cm_tokenizer_decode(tok, all, np + n_out, &text, &len) != CM_OK) text = NULL;
        }
    }
    cm_free(ids);
    cm_free(p64);
    cm_free(out);
    cm_free(all);
    return text;
}

static int write_text_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs(text, f);
    if (text[0] && text[strlen(text) - 1] != '\n') fputc('\n', f);
    return fclose(f);
}

static void print_eval_metrics(run *r, cm_trainer *tr, const char *label) {
    cm_state *st = cm_trainer_state(tr);
    for (int i = 0; i < cm_state_n_metrics(st, label); i++) {
        const char *name;
        double v;
        char buf[CM_FORMAT_MAX];
        if (cm_state_metric_at(st, label, i, &name, &v) == CM_OK)
            cli_say(&r->ctx, "  metrics/%s/%s: %s\n", label, name, cm_format_metric(v, buf, sizeof buf));
    }
}

/* ---------------------------------------------------------------------------------------------
 * Ending a job with several ranks
 * ------------------------------------------------------------------------------------------- */

/* Records this rank's first error (the current cm_last_error, after `what` if given) and the exit
 * status it asks for: 2 for a config value (CM_ERR_INVALID_ARG), else 1. Returns the status. */
static int note(run *r, const char *what) {
    if (r->err_code) return r->err_code;
    cm_status s = cm_last_status();
    snprintf(r->err, sizeof r->err, "%s%s%s", what ? what : "", what ? ": " : "", cm_last_error());
    r->err_code = s == CM_ERR_INVALID_ARG ? EXIT_USAGE : 1;
    return r->err_code;
}

static void print_err(const run *r, const char *prog) {
    if (r->world > 1 && r->rank > 0) fprintf(stderr, "[rank %d] %s: %s\n", r->rank, prog, r->err);
    else fprintf(stderr, "%s: %s\n", prog, r->err);
}

/* Where every rank must agree before going on (setup steps that may fail on some ranks only):
 * each rank tells the others its exit status and a hash of its message (one all_gather of 16
 * bytes a rank); a failing rank prints its message unless a lower rank failed with the same one
 * (a config error shows once, not once per rank); every rank returns the lowest failing rank's
 * status, so all of them stop here together and MPI finalises normally. One process, or a
 * communicator that already failed (a timeout: nothing can be agreed on), just prints. Returns 0
 * when every rank is fine. */
static int settle(run *r, const char *prog) {
    if (!r->comm || r->world < 2 || cm_comm_status(r->comm) != CM_OK) {
        if (!r->err_code) return 0;
        cm_dist_env env = cm_dist_env_get();
        /* before the communicator only the config was read: the same on every rank */
        if (r->comm || env.world_size < 2 || env.rank == 0 || r->err_code != EXIT_USAGE) print_err(r, prog);
        if (r->comm && r->world > 1) r->keep_comm = true;
        return r->err_code;
    }
    typedef struct outcome {
        int64_t code;
        uint64_t hash;
    } outcome;
    const outcome me = {r->err_code, r->err_code ? cm_hash64(r->err, strlen(r->err), 0) : 0};
    outcome *all = cm_alloc_zeroed(sizeof *all * (size_t)r->world, 16);
    if (!all || cm_comm_all_gather(r->comm, &me, all, (int64_t)sizeof me, CM_COMM_U8) != CM_OK) {
        if (r->err_code) print_err(r, prog);
        fprintf(stderr, "%s: rank %d: %s\n", prog, r->rank, all ? cm_last_error() : "out of memory");
        cm_free(all);
        r->keep_comm = true;
        return r->err_code ? r->err_code : 1;
    }
    int code = 0;
    bool shown = false;
    for (int k = 0; k < r->world; k++) {
        if (all[k].code && !code) code = (int)all[k].code;
        if (k < r->rank && all[k].code == me.code && all[k].hash == me.hash) shown = true;
    }
    if (me.code && !shown) print_err(r, prog);
    cm_free(all);
    return code;
}

/* Ends the command: frees the run (dist, model, loaders, then the communicator) and returns rc. */
static int finish(run *r, int rc) {
    run_free(r);
    return rc;
}

/* Texts the callbacks log (Generate's samples, ImageVisualizer's files): printed and teed into
 * log.txt like the rest of the CLI's output (the FileLogger's own text log is off here). */
static cm_status text_log_metrics(void *self, const cm_metric_value *v, int n, const cm_timestamp *ts) {
    (void)self, (void)v, (void)n, (void)ts;
    return CM_OK;
}
static cm_status text_log_text(void *self, const char *key, const char *text, const cm_timestamp *ts) {
    const size_t n = strlen(text);
    cli_say(self, "[text] %s (epoch %lld, batch %lld):\n%s%s", key, (long long)ts->epoch, (long long)ts->batch, text,
            n && text[n - 1] == '\n' ? "" : "\n");
    return CM_OK;
}
static void text_free(void *self) { (void)self; }
static const cm_logger_i k_text_logger = {
    .abi = CM_LOGGER_ABI, .name = "TextLog", .log_metrics = text_log_metrics, .free = text_free,
    .log_text = text_log_text};

/* Rank 0's run folder: config.yaml, log.txt, tokenizer.json. Fills run_name (cap 256). */
static cm_status make_run_folder(run *r, char *run_name) {
    char *dir = NULL, *path = NULL;
    if (cm_run_folder_create(r->run_root, r->run_name, &dir) != CM_OK) return cm_last_status();
    r->ctx.run_dir = dir;
    const char *slash = strrchr(dir, '/');
    snprintf(run_name, 256, "%s", slash ? slash + 1 : dir);
    if (!r->run_name) cm_config_set(r->cfg, "run_name", run_name);
    cm_run_folder_path(dir, CM_RUN_FILE_CONFIG, &path);
    cm_status s = cm_config_save(r->cfg, path);
    cm_free(path);
    if (s) return s;
    cm_run_folder_path(dir, CM_RUN_FILE_LOG, &path);
    r->ctx.log = fopen(path, r->tc.autoresume ? "a" : "w"); /* a resumed run goes on in the same folder */
    cm_free(path);
    if (r->tok && !r->hf) { /* a pretrained folder's tokenizer travels with the HF folders instead */
        cm_run_folder_path(dir, "tokenizer.json", &path);
        if (cm_tokenizer_save(r->tok, path) != CM_OK) cm_log_msg(CM_LOG_WARN, "%s", cm_last_error());
        cm_free(path);
    }
    return CM_OK;
}

/* Uploads the regular files under `dir` (subfolders such as traces/ included, as key prefixes)
 * to `st` under `prefix`. */
static cm_status upload_tree(cm_object_store *st, const char *dir, const char *prefix, int depth) {
    DIR *d = opendir(dir);
    if (!d) return cm_set_error(CM_ERR_IO, "cannot read the run folder '%s': %s", dir, strerror(errno));
    cm_status s = CM_OK;
    struct dirent *e;
    while (!s && (e = readdir(d))) {
        char path[PATH_MAX], key[PATH_MAX];
        struct stat sb;
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        snprintf(key, sizeof key, "%s%s", prefix, e->d_name);
        if (stat(path, &sb) != 0) continue;
        if (S_ISREG(sb.st_mode)) {
            s = cm_object_store_upload(st, key, path);
        } else if (S_ISDIR(sb.st_mode) && depth < 4) {
            strncat(key, "/", sizeof key - strlen(key) - 1);
            s = upload_tree(st, path, key, depth + 1);
        }
    }
    closedir(d);
    return s;
}

/* With a remote save_folder, the run folder's files (config, log, metrics, plot, weights, sample,
 * and what subfolders hold) go to "<save_folder>/run/", beside the checkpoints. */
static cm_status upload_run_folder(const char *dir, const char *save_folder) {
    char uri[PATH_MAX];
    snprintf(uri, sizeof uri, "%s/run", save_folder);
    cm_object_store *st;
    cm_status s = cm_object_store_open(uri, NULL, &st);
    if (!s) s = upload_tree(st, dir, "", 0);
    cm_object_store_close(st);
    return s;
}

/* With a remote save_folder, rank 0's run folder follows the checkpoints to <save_folder>/run/
 * at the save interval (loss.svg redrawn first), not only at the end, so a run that dies mid-way
 * still left its log, metrics and plot beside its checkpoints. A failed upload here is a warning
 * (the next interval tries again; the one at the end of the run is an error). */
typedef struct run_uploader {
    const char *dir, *save_folder;
    FILE *log;
    cm_time iv;
    int64_t total_batches;
    int64_t prev_sample, prev_token, prev_batch;
    int64_t uploads;
} run_uploader;

static bool crossed(int64_t prev, int64_t now, int64_t every) { return every > 0 && now / every > prev / every; }

static cm_status ru_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    (void)lg;
    run_uploader *u = self;
    const cm_timestamp *ts = cm_state_timestamp(st);
    bool due = false;
    if (ev == CM_EVENT_BATCH_CHECKPOINT) {
        switch (u->iv.unit) {
        case CM_TIME_BATCH: due = crossed(u->prev_batch, ts->batch, u->iv.count); break;
        case CM_TIME_SAMPLE: due = crossed(u->prev_sample, ts->sample, u->iv.count); break;
        case CM_TIME_TOKEN: due = crossed(u->prev_token, ts->token, u->iv.count); break;
        case CM_TIME_DURATION: {
            const int64_t every = (int64_t)llround(u->iv.frac * (double)u->total_batches);
            due = crossed(u->prev_batch, ts->batch, every > 0 ? every : 1);
            break;
        }
        default: break;
        }
        u->prev_batch = ts->batch, u->prev_sample = ts->sample, u->prev_token = ts->token;
    } else if (ev == CM_EVENT_EPOCH_CHECKPOINT) {
        due = u->iv.unit == CM_TIME_EPOCH && u->iv.count > 0 && ts->epoch % u->iv.count == 0;
    }
    if (!due) return CM_OK;
    if (u->log) fflush(u->log);
    char *metrics = NULL, *plot = NULL;
    cm_run_folder_path(u->dir, CM_RUN_FILE_METRICS, &metrics);
    cm_run_folder_path(u->dir, CM_RUN_FILE_PLOT, &plot);
    if (metrics && plot && access(metrics, F_OK) == 0) cm_svg_plot_metrics_file(metrics, plot, NULL, 0, NULL);
    cm_free(metrics), cm_free(plot);
    if (upload_run_folder(u->dir, u->save_folder) == CM_OK) u->uploads++;
    else cm_log_msg(CM_LOG_WARN, "uploading the run folder to %s/run/ (will retry at the next interval): %s",
                    u->save_folder, cm_last_error());
    return CM_OK;
}

static void ru_free(void *self) { cm_free(self); }

static const cm_callback_i k_run_uploader = {CM_CALLBACK_ABI, "RunFolderUploader", ru_event, NULL, NULL, NULL, ru_free};

static cm_status run_uploader_new(run *r, cm_callback_plugin *out) {
    run_uploader *u = cm_alloc_zeroed(sizeof *u, 16);
    if (!u) return CM_ERR_OOM;
    u->dir = r->ctx.run_dir;
    u->save_folder = r->tc.save_folder;
    u->log = r->ctx.log;
    u->iv = r->tc.save_interval;
    if (r->tc.save_interval_str && cm_time_parse(r->tc.save_interval_str, &u->iv) != CM_OK) u->iv = r->tc.save_interval;
    u->total_batches = r->ctx.total_batches;
    *out = (cm_callback_plugin){&k_run_uploader, u};
    return CM_OK;
}

/* --plan-memory: a trainer with the config's model, loader, optimizer, precision, budgets and
 * algorithms, but no run folder, loggers, callbacks or checkpoints, plans the first batch and
 * prints it (rank 0; every rank plans its own slice). */
static int plan_memory(run *r, const char *prog) {
    int rc = settle(r, prog);
    if (rc) return finish(r, rc);
    r->tc.model = r->model;
    r->tc.train_dataloader = r->train_dl;
    r->tc.eval_dataloader = NULL;
    r->tc.optimizer = r->opt;
    r->tc.schedulers = r->scheds, r->tc.n_schedulers = r->n_scheds;
    r->tc.algorithms = r->algs, r->tc.n_algorithms = r->n_algs;
    r->tc.callbacks = NULL, r->tc.n_callbacks = 0;
    r->tc.loggers = NULL, r->tc.n_loggers = 0;
    r->tc.save_folder = NULL, r->tc.autoresume = false;
    r->tc.run_name = "plan-memory";
    r->tc.handle_signals = false;
    if (r->dp) cm_dist_trainer_hooks(r->dp, &r->tc);
    cm_trainer *tr = NULL;
    cm_memory_plan p;
    if (cm_trainer_new(&r->tc, &tr) != CM_OK) note(r, NULL), tr = NULL;
    else r->n_algs = 0; /* the trainer owns them now */
    if (tr && r->dp && cm_dist_attach(r->dp, tr) != CM_OK) note(r, NULL);
    if (!r->err_code && cm_trainer_plan_memory(tr, &p) != CM_OK) note(r, "memory plan");
    if (!r->err_code && r->rank == 0) {
        char text[2048];
        cm_memory_plan_format(&p, text, sizeof text);
        const int64_t mb = r->tc.device_train_microbatch_size;
        printf("%s", text);
        if (mb != CM_MICROBATCH_AUTO)
            printf("  (device_train_microbatch_size is %lld%s: the size above is what auto would start with)\n",
                   (long long)mb, mb == 0 ? ", the whole batch" : "");
    }
    rc = settle(r, prog);
    cm_trainer_free(tr);
    return finish(r, rc);
}

/* train's load_path: X.safetensors into r->model (GPT-2 files by their Hugging Face names). */
static void load_start_weights(run *r) {
    cm_status s = r->gpt2 ? cm_gpt2_load_safetensors(r->model, r->load_path, NULL, NULL)
                          : cm_module_load_safetensors(cm_model_module(r->model), r->load_path, NULL, NULL);
    if (s) note(r, "load_path");
}

int cmd_train(const char *prog, int argc, char **argv) {
    const char *pos[64];
    int n_pos;
    g_print_config = g_quiet_train = g_plan_memory = NULL;
    int rc = cli_parse_flags(prog, k_train_flags, argc, argv, pos, 64, &n_pos, train_usage);
    if (rc) return rc < 0 ? 0 : rc;
    if (n_pos == 0) {
        fprintf(stderr, "%s: missing CONFIG.yaml (e.g. %s examples/shakespeare-char.yaml); see '%s --help'\n", prog,
                prog, prog);
        return EXIT_USAGE;
    }
    run r = {0};
    r.mode = MODE_TRAIN;
    r.rank = 0, r.world = 1;
    r.ctx.quiet = g_quiet_train != NULL;
    if ((rc = load_config(prog, pos[0], pos + 1, n_pos - 1, &r.cfg)) != 0) return rc;
    if (build_run(&r) != CM_OK) note(&r, NULL);
    if ((rc = settle(&r, prog))) return finish(&r, rc);
    if (g_print_config) {
        if (r.rank == 0) cm_config_write(r.cfg, stdout);
        return finish(&r, 0);
    }
    /* load_path: X.safetensors. Plain weights (a pretrained GPT-2, a run without surgery) load
     * into the plain model, before the config's surgery (ALiBi on pretrained weights); weights
     * that record the surgery they were trained with load after it, into the model it makes, as a
     * checkpoint's do (its methods the config lacks are added, with Composer's warning). Every
     * rank loads them (cm_dist_new then broadcasts rank 0's anyway). */
    bool load_after = false;
    if (!r.err_code && r.load_path && add_recorded_surgery(&r, r.load_path, &load_after) != CM_OK) note(&r, NULL);
    if (!r.err_code && r.load_path && !load_after) load_start_weights(&r);
    /* model surgery (the algorithms' and what a checkpoint to load requires) before data
     * parallelism and the optimizer take the flat parameter buffers; the trainer applies the same
     * methods again on INIT, which then change nothing */
    r.tc.model = r.model;
    r.tc.algorithms = r.algs, r.tc.n_algorithms = r.n_algs;
    if (!r.err_code && cm_trainer_prepare_model(&r.tc) != CM_OK) note(&r, NULL);
    if (!r.err_code && r.load_path && load_after) load_start_weights(&r);
    /* activation checkpointing marks the modules that surgery left in place */
    if (!r.err_code && cli_fsdp_apply_model(r.cfg, &r.fsdp, r.model, &r.ctx, r.rank) != CM_OK) note(&r, NULL);
    if (!r.err_code && start_dist(&r) != CM_OK) note(&r, NULL);
    /* device: gpu moves the model before the optimizer is made over its buffers */
    if (!r.err_code && r.tc.device != CM_DEVICE_CPU && cm_module_device(cm_model_module(r.model)) != r.tc.device) {
        cm_status s = cm_module_to_device(cm_model_module(r.model), r.tc.device);
        if (s) {
            char msg[900];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            cm_set_error(s, "%s: device gpu: %s", cm_config_origin(r.cfg, "device"), msg);
            note(&r, NULL);
        }
    }
    if (!r.err_code && make_optimizer(&r) != CM_OK) note(&r, NULL);
    if (g_plan_memory) return plan_memory(&r, prog);
    /* the run folder: rank 0 alone makes it (generating the name when the config has none) */
    char run_name[256] = "";
    if (!r.err_code && r.rank == 0 && make_run_folder(&r, run_name) != CM_OK) note(&r, NULL);
    if ((rc = settle(&r, prog))) return finish(&r, rc);
    /* every rank uses rank 0's run name (checkpoint names, logged hyperparameters) */
    if (r.world > 1 && cm_comm_broadcast(r.comm, run_name, sizeof run_name, CM_COMM_U8, 0) != CM_OK) {
        note(&r, "sharing the run name");
        return finish(&r, settle(&r, prog));
    }
    r.tc.run_name = run_name;
    char saver_folder[1024];
    if (!r.err_code && r.ctx.has_saver &&
        cm_checkpoint_saver_apply(&r.ctx.saver, run_name, saver_folder, sizeof saver_folder, &r.tc) != CM_OK)
        note(&r, "callbacks.checkpoint_saver");
    /* rank 0 speaks for the job; another rank's warnings and errors still reach its stderr (the
     * launcher's --stderr 'logs/rank{rank}.txt' keeps them apart), its info lines only when
     * CM_LOG asks for them */
    if (r.rank > 0) {
        r.ctx.quiet = true;
        const char *lv = getenv("CM_LOG");
        if ((!lv || !*lv) && cm_log_get_level() < CM_LOG_WARN) cm_log_set_level(CM_LOG_WARN);
    }
    r.ctx.total_batches = total_batches(&r);

    /* the trainer */
    /* The run's loggers (loggers.h): metrics.jsonl (and loss.svg at the end) in the run folder
     * (log.txt is the CLI's own tee of what it prints), a progress bar on stderr, and console
     * lines when asked — on rank 0 only (the logged losses and metrics are the global batch's,
     * the same on every rank). */
    cm_logger_plugin lp;
    if (!r.err_code && r.ctx.run_dir) {
        cm_file_logger_config fc = cm_file_logger_config_default();
        fc.folder = r.ctx.run_dir;
        fc.text_log = false;
        fc.append = r.tc.autoresume; /* the loss curve of a resumed run continues the earlier one's */
        if (r.ctx.file_flush_interval > 0) fc.flush_interval = r.ctx.file_flush_interval;
        fc.log_traces = r.ctx.file_log_traces;
        if (cm_file_logger_new(&fc, &lp) != CM_OK) note(&r, NULL);
        else r.lgs[r.n_lgs++] = lp;
    }
    if (!r.err_code && r.rank == 0 && r.ctx.progress_bar && !r.ctx.quiet) {
        cm_progress_bar_logger_config pc = cm_progress_bar_logger_config_default();
        if (cm_progress_bar_logger_new(&pc, &lp) != CM_OK) note(&r, NULL);
        else r.lgs[r.n_lgs++] = lp;
    }
    if (!r.err_code && r.rank == 0 && r.n_lgs < MAX_PLUGINS) r.lgs[r.n_lgs++] = (cm_logger_plugin){&k_text_logger, &r.ctx};
    if (!r.err_code && r.rank == 0 && r.ctx.console_log_interval.count > 0) {
        cm_console_logger_config cc = cm_console_logger_config_default();
        cc.log_interval = r.ctx.console_log_interval;
        cc.stream = stdout;
        if (cm_console_logger_new(&cc, &lp) != CM_OK) note(&r, NULL);
        else r.lgs[r.n_lgs++] = lp;
    }
    if (!r.err_code && r.rank == 0 && r.tc.save_folder && cm_storage_is_remote(r.tc.save_folder)) {
        if (r.n_cbs == MAX_PLUGINS) note(&r, "too many callbacks for the run folder's uploader");
        else if (run_uploader_new(&r, &r.cbs[r.n_cbs]) != CM_OK) note(&r, NULL);
        else r.n_cbs++;
    }
    r.tc.model = r.model;
    r.tc.train_dataloader = r.train_dl;
    set_evaluators(&r);
    r.tc.optimizer = r.opt;
    r.tc.schedulers = r.scheds, r.tc.n_schedulers = r.n_scheds;
    r.tc.algorithms = r.algs, r.tc.n_algorithms = r.n_algs;
    r.tc.callbacks = r.cbs, r.tc.n_callbacks = r.n_cbs;
    r.tc.loggers = r.lgs, r.tc.n_loggers = r.n_lgs;
    r.tc.progress_bar = r.ctx.progress_bar && r.rank == 0;
    if (r.dp) cm_dist_trainer_hooks(r.dp, &r.tc);
    cm_module *root = cm_model_module(r.model);
    char ranks[128] = "";
    if (r.world > 1) {
        const long long lo = (long long)(r.train_batch / r.world);
        const long long hi = (long long)((r.train_batch + r.world - 1) / r.world);
        char per[48];
        if (lo == hi) snprintf(per, sizeof per, "%lld", lo);
        else snprintf(per, sizeof per, "%lld-%lld", lo, hi);
        char groups[64] = ""; /* hybrid: "2 groups of 2" (replicate x shard degree) */
        if (cm_sharding_is_hybrid(r.sharding) && r.dp)
            snprintf(groups, sizeof groups, " in %d groups of %d", cm_comm_size(cm_dist_replicate_comm(r.dp)),
                     cm_comm_size(cm_dist_shard_comm(r.dp)));
        snprintf(ranks, sizeof ranks, ", %d ranks (%s%s, %s samples a rank a batch)", r.world,
                 cm_sharding_name(r.sharding), groups, per);
    }
    const char *evals = r.n_evals > 1 ? " (+ eval sets)" : r.n_evals ? " (+ eval set)" : "";
    cli_say(&r.ctx, "run %s: %s (%lld parameters), %lld train samples%s, batch %lld, %lld batches%s\n", run_name,
            cm_model_type_name(r.model), (long long)cm_module_count_params(root, false),
            (long long)cm_dataset_len(r.train_ds), evals, (long long)r.train_batch, (long long)r.ctx.total_batches,
            ranks);
    cm_trainer *tr = NULL;
    if (!r.err_code) {
        if (cm_trainer_new(&r.tc, &tr) != CM_OK) note(&r, NULL), tr = NULL;
        else r.n_algs = r.n_cbs = r.n_lgs = 0; /* the trainer owns them now */
    }
    if (tr && r.dp && cm_dist_attach(r.dp, tr) != CM_OK) note(&r, NULL);
    if ((rc = settle(&r, prog))) {
        cm_trainer_free(tr);
        return finish(&r, rc);
    }
    double t0 = cm_clock_s();
    cm_status s = cm_trainer_fit(tr, NULL);
    double secs = cm_clock_s() - t0;
    if (s != CM_OK) {
        /* preemption (SIGTERM/SIGINT): the trainer saved a checkpoint and closed; exit 128+signal.
         * A failed collective (dist.h "Failure model") or any other error: print it and exit
         * nonzero without waiting for the other ranks (mpirun stops them). */
        const bool interrupted = s == CM_ERR_INTERRUPTED;
        note(&r, interrupted ? "training interrupted" : "training failed");
        print_err(&r, prog);
        if (r.ctx.log) fprintf(r.ctx.log, "%s\n", r.err);
        int code = interrupted ? cm_trainer_exit_code(tr, s) : 1;
        if (r.world > 1) r.keep_comm = true;
        cm_trainer_free(tr);
        return finish(&r, code);
    }
    const cm_timestamp *ts = cm_state_timestamp(cm_trainer_state(tr));
    cli_say(&r.ctx, "trained %lld batches (%lld samples, %lld tokens) in %.1f s\n", (long long)ts->batch,
            (long long)ts->sample, (long long)ts->token, secs);
    for (int i = 0; i < r.n_evals; i++) print_eval_metrics(&r, tr, r.eval_label[i]);
    /* the surgery the model was trained with (the config's and what load_path added), recorded
     * in model.safetensors for eval and generate */
    char *surgery = NULL;
    if (cm_engine_required_on_load_json(cm_trainer_engine(tr), &surgery) != CM_OK) note(&r, NULL);
    if (cm_trainer_close(tr) != CM_OK) note(&r, NULL);
    cm_trainer_free(tr);
    /* FULL_SHARD keeps only each rank's chunk of the parameters at rest: gather them (a
     * collective, so on every rank) before rank 0 saves the weights and samples from them */
    if (!r.err_code && r.dp && r.fsdp.cpu_offload) { /* the model goes back to host memory with its values */
        const cm_dist_stats ds = cm_dist_get_stats(r.dp);
        if (r.fsdp.verbose)
            cli_say(&r.ctx, "%s.cpu_offload: %lld unit uploads (%lld prefetched), at most %d units' parameters on the GPU at "
                            "once\n",
                    r.fsdp.prefix, (long long)ds.n_gathers, (long long)ds.n_prefetches, ds.max_gathered);
        cm_dist_free(r.dp);
        r.dp = NULL;
    }
    if (!r.err_code && r.dp && cm_dist_gather_params(r.dp) != CM_OK) note(&r, "gathering the parameters");
    if ((rc = settle(&r, prog)) || r.rank > 0) {
        cm_free(surgery);
        return finish(&r, rc);
    }
    /* the weights are written and sampled from on the host */
    if (cm_module_device(root) != CM_DEVICE_CPU && cm_module_to_device(root, CM_DEVICE_CPU) != CM_OK) {
        cm_free(surgery);
        note(&r, "moving the trained model back to the CPU");
        return finish(&r, settle(&r, prog));
    }

    /* outputs (rank 0): weights, plot, sample */
    const char *dir = r.ctx.run_dir;
    char *weights = NULL, *metrics = NULL, *plot = NULL, *sample = NULL;
    cm_run_folder_path(dir, "model.safetensors", &weights);
    cm_run_folder_path(dir, CM_RUN_FILE_METRICS, &metrics);
    cm_run_folder_path(dir, CM_RUN_FILE_PLOT, &plot);
    /* the surgery record in the metadata (and a GPT's n_head, cm_gpt2_save_safetensors's) */
    const char *meta[2] = {CM_SURGERY_METADATA_KEY, surgery};
    const int n_meta = surgery ? 1 : 0;
    s = r.gpt2 ? cm_gpt2_save_safetensors_with(r.model, weights, meta, n_meta)
               : cm_module_save_safetensors_with(root, weights, meta, n_meta);
    cm_free(surgery);
    if (s) fprintf(stderr, "%s: saving the weights: %s\n", prog, cm_last_error()), rc = 1;
    const bool have_weights = s == CM_OK;
    bool have_plot = cm_svg_plot_metrics_file(metrics, plot, NULL, 0, NULL) == CM_OK;
    if (!have_plot) cm_log_msg(CM_LOG_WARN, "no plot: %s", cm_last_error());
    bool have_sample = false;
    if (r.gpt2 && r.tok && r.sample_tokens > 0) {
        char *text = generate_text(r.model, r.tok, r.prompt, r.sample_tokens, r.temperature, r.top_k, r.seed);
        if (text) {
            cli_say(&r.ctx, "\n--- sample (%lld tokens, temperature %g, top_k %lld) ---\n%s\n---\n",
                    (long long)r.sample_tokens, r.temperature, (long long)r.top_k, text);
            cm_run_folder_path(dir, "sample.txt", &sample);
            have_sample = write_text_file(sample, text) == 0;
            cm_free(text);
        } else {
            fprintf(stderr, "%s: sampling failed: %s\n", prog, cm_last_error());
        }
    }
    cli_say(&r.ctx, "run folder %s: config.yaml, log.txt, metrics.jsonl%s%s%s\n", dir, have_plot ? ", loss.svg" : "",
            have_weights ? ", model.safetensors" : "", have_sample ? ", sample.txt" : "");
    if (r.tc.save_folder && cm_storage_is_remote(r.tc.save_folder)) {
        if (r.ctx.log) fflush(r.ctx.log);
        if (upload_run_folder(dir, r.tc.save_folder) == CM_OK)
            cli_say(&r.ctx, "run folder uploaded to %s/run/\n", r.tc.save_folder);
        else
            fprintf(stderr, "%s: uploading the run folder: %s\n", prog, cm_last_error()), rc = 1;
    }
    cm_free(weights), cm_free(metrics), cm_free(plot), cm_free(sample);
    return finish(&r, rc);
}

/* ---------------------------------------------------------------------------------------------
 * composer eval
 * ------------------------------------------------------------------------------------------- */

static const char *g_eval_weights;
static const cli_flag k_eval_flags[] = {
    {"--weights", "-w", "PATH", "the weights to evaluate (a run's model.safetensors, or a checkpoint)", &g_eval_weights},
    {NULL, NULL, NULL, NULL, NULL},
};

static void eval_usage(FILE *f, const char *prog) {
    fprintf(f,
            "usage: %s CONFIG.yaml --weights PATH [key.path=value ...]\n\n"
            "Builds the config's model, loads PATH and evaluates it on the config's eval_loader,\n"
            "printing every metric. A run folder's config.yaml works as CONFIG. The model is the one the\n"
            "weights were trained as: the config's model surgery (algorithms: alibi, blurpool, ...) and\n"
            "what the checkpoint of its load_path requires on load are applied before they load. PATH is\n"
            "a .safetensors file (the surgery its metadata records re-applied: run folders and 'composer\n"
            "ckpt export' write it), or a Composer checkpoint (its weights only; the surgery it was\n"
            "trained with re-applied, as Composer's required_on_load). A model from a pretrained\n"
            "folder (model.name: hf) is evaluated with the folder's weights when --weights is not given.\n"
            "\noptions:\n",
            prog);
    cli_print_flags(f, k_eval_flags);
    fprintf(f, "  %-28s %s\n", "-h, --help", "show this help");
}

int cmd_eval(const char *prog, int argc, char **argv) {
    const char *pos[64];
    int n_pos;
    g_eval_weights = NULL;
    int rc = cli_parse_flags(prog, k_eval_flags, argc, argv, pos, 64, &n_pos, eval_usage);
    if (rc) return rc < 0 ? 0 : rc;
    if (n_pos == 0) {
        fprintf(stderr, "%s: missing CONFIG.yaml; see '%s --help'\n", prog, prog);
        return EXIT_USAGE;
    }
    run r = {0};
    r.mode = MODE_EVAL;
    r.rank = 0, r.world = 1;
    if ((rc = load_config(prog, pos[0], pos + 1, n_pos - 1, &r.cfg)) != 0) return rc;
    if (build_run(&r) != CM_OK) note(&r, NULL);
    if (!r.err_code && !g_eval_weights && !r.hf) {
        fprintf(stderr, "%s: missing --weights PATH; see '%s --help'\n", prog, prog);
        return finish(&r, EXIT_USAGE);
    }
    const bool weights_ckpt = !r.err_code && g_eval_weights && is_composer_checkpoint(g_eval_weights);
    if (!r.err_code && !weights_ckpt && add_recorded_surgery(&r, g_eval_weights, NULL) != CM_OK) note(&r, NULL);
    if (!r.err_code && apply_trained_surgery(&r, weights_ckpt ? g_eval_weights : NULL) != CM_OK) note(&r, NULL);
    if (!r.err_code && g_eval_weights && !weights_ckpt) {
        cm_status s = r.gpt2 ? cm_gpt2_load_safetensors(r.model, g_eval_weights, NULL, NULL)
                             : cm_module_load_safetensors(cm_model_module(r.model), g_eval_weights, NULL, NULL);
        if (s) {
            char what[PATH_MAX + 16];
            snprintf(what, sizeof what, "loading %s", g_eval_weights);
            note(&r, what);
            r.err_code = 1; /* a bad file, not a bad config */
        }
    }
    if ((rc = settle(&r, prog))) return finish(&r, rc);
    /* several ranks: each evaluates its slice of the eval set; the metric sums are all-reduced */
    if (start_dist(&r) != CM_OK) note(&r, NULL);
    r.tc.model = r.model;
    set_evaluators(&r);
    if (r.dp) cm_dist_trainer_hooks(r.dp, &r.tc);
    if (r.rank > 0) r.ctx.quiet = true;
    cm_trainer *tr = NULL;
    if (!r.err_code) {
        if (cm_trainer_new(&r.tc, &tr) != CM_OK) note(&r, NULL), tr = NULL;
        else r.n_algs = 0; /* the trainer owns them now */
    }
    if (tr && r.dp && cm_dist_attach(r.dp, tr) != CM_OK) note(&r, NULL);
    if ((rc = settle(&r, prog))) {
        cm_trainer_free(tr);
        return finish(&r, rc);
    }
    double t0 = cm_clock_s();
    if (cm_trainer_eval(tr, NULL, 0) != CM_OK) {
        note(&r, "evaluation failed");
        r.err_code = 1;
        print_err(&r, prog);
        if (r.world > 1) r.keep_comm = true;
        cm_trainer_free(tr);
        return finish(&r, 1);
    }
    /* eval_subset_num_batches stops early: say the samples those batches hold */
    int64_t n_eval = 0;
    for (int i = 0; i < r.n_evals; i++) {
        int64_t n = cm_dataloader_samples_per_epoch(r.eval_dl[i]);
        const int64_t sub = r.tc.eval_subset_num_batches, gb = cm_dataloader_get_config(r.eval_dl[i])->batch_size;
        n_eval += sub >= 0 && sub * gb < n ? sub * gb : n;
    }
    cli_say(&r.ctx, "evaluated %s on %lld samples in %.1f s%s\n", g_eval_weights ? g_eval_weights : "the pretrained folder",
            (long long)n_eval, cm_clock_s() - t0, r.world > 1 ? " (split over the ranks)" : "");
    for (int i = 0; i < r.n_evals; i++) print_eval_metrics(&r, tr, r.eval_label[i]);
    cm_trainer_free(tr);
    return finish(&r, 0);
}

/* ---------------------------------------------------------------------------------------------
 * composer generate
 * ------------------------------------------------------------------------------------------- */

static const char *g_gen_weights, *g_gen_config, *g_gen_tok, *g_gen_prompt, *g_gen_n, *g_gen_temp, *g_gen_topk,
    *g_gen_seed, *g_gen_heads, *g_gen_device;
static const cli_flag k_gen_flags[] = {
    {"--weights", "-w", "PATH", "GPT-2 weights (.safetensors, e.g. runs/NAME/model.safetensors)", &g_gen_weights},
    {"--config", "-c", "YAML", "the model config (default: config.yaml next to the weights, if present)",
     &g_gen_config},
    {"--tokenizer", "-t", "JSON", "tokenizer.json (default: next to the weights), or a Hugging Face folder", &g_gen_tok},
    {"--prompt", "-p", "TEXT", "the text to continue (default \"\\n\"; \"\" = start from <|endoftext|> / id 0)",
     &g_gen_prompt},
    {"--max-new-tokens", "-n", "N", "tokens to generate (default 200)", &g_gen_n},
    {"--temperature", NULL, "T", "sampling temperature, 0 = greedy (default 0.8)", &g_gen_temp},
    {"--top-k", NULL, "K", "sample among the K most likely tokens, 0 = all (default 200)", &g_gen_topk},
    {"--seed", NULL, "S", "sampling seed (default 42)", &g_gen_seed},
    {"--n-head", NULL, "H", "attention heads, when there is no config (default: the file's record, else n_embd / 64)", &g_gen_heads},
    {"--device", "-d", "DEV", "cpu (default) or gpu: where the model runs (a build with CUDA, a GPU)", &g_gen_device},
    {NULL, NULL, NULL, NULL, NULL},
};

static void gen_usage(FILE *f, const char *prog) {
    fprintf(f,
            "usage: %s --weights PATH [--prompt TEXT] [--max-new-tokens N] [options]\n\n"
            "Samples text from a GPT-2 model with a KV cache. The model's shape comes from --config (or\n"
            "the run folder's config.yaml next to the weights), else from the weights' shapes; the\n"
            "config's model surgery (algorithms: alibi) and the surgery the weights file records in its\n"
            "metadata (a run folder's model.safetensors does) are applied before the weights load.\n\noptions:\n",
            prog);
    cli_print_flags(f, k_gen_flags);
    fprintf(f, "  %-28s %s\n", "-h, --help", "show this help");
}

static bool parse_num(const char *prog, const char *flag, const char *s, double lo, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo) || !isfinite(v)) {
        fprintf(stderr, "%s: %s '%s' must be a number >= %g\n", prog, flag, s, lo);
        return false;
    }
    *out = v;
    return true;
}

int cmd_generate(const char *prog, int argc, char **argv) {
    const char *pos[1];
    int n_pos;
    g_gen_weights = g_gen_config = g_gen_tok = g_gen_heads = NULL;
    g_gen_prompt = "\n", g_gen_n = "200", g_gen_temp = "0.8", g_gen_topk = "200", g_gen_seed = "42", g_gen_device = "cpu";
    int rc = cli_parse_flags(prog, k_gen_flags, argc, argv, pos, 0, &n_pos, gen_usage);
    if (rc) return rc < 0 ? 0 : rc;
    if (!g_gen_weights) {
        fprintf(stderr, "%s: missing --weights PATH; see '%s --help'\n", prog, prog);
        return EXIT_USAGE;
    }
    double n, temp, topk, seed, heads = 0;
    if (!parse_num(prog, "--max-new-tokens", g_gen_n, 0, &n) || !parse_num(prog, "--temperature", g_gen_temp, 0, &temp) ||
        !parse_num(prog, "--top-k", g_gen_topk, 0, &topk) || !parse_num(prog, "--seed", g_gen_seed, 0, &seed) ||
        (g_gen_heads && !parse_num(prog, "--n-head", g_gen_heads, 1, &heads)))
        return EXIT_USAGE;
    cm_device dev;
    if (cm_device_parse(g_gen_device, &dev) != CM_OK) {
        fprintf(stderr, "%s: --device '%s': cpu or gpu\n", prog, g_gen_device);
        return EXIT_USAGE;
    }
    if (cm_device_check(dev) != CM_OK) { /* before any file is read: the machine cannot do it */
        fprintf(stderr, "%s: --device %s: %s\n", prog, g_gen_device, cm_last_error());
        return 1;
    }
    /* the weights first: the tokenizer and config are found next to them, so a wrong path would
     * otherwise be reported as a missing '<dir>/tokenizer.json' */
    struct stat wst;
    const int wrc = stat(g_gen_weights, &wst), werr = errno;
    if (wrc != 0 || !S_ISREG(wst.st_mode)) {
        fprintf(stderr, "%s: --weights '%s': %s\n", prog, g_gen_weights,
                wrc != 0 ? (werr == ENOENT ? "no such file (a model.safetensors, e.g. runs/NAME/model.safetensors)"
                                           : strerror(werr))
                : S_ISDIR(wst.st_mode) ? "is a directory (pass the .safetensors file in it)"
                                       : "is not a regular file");
        return 1;
    }
    char wdir[PATH_MAX], cfg_path[PATH_MAX], tok_path[PATH_MAX];
    snprintf(wdir, sizeof wdir, "%s", g_gen_weights);
    char *d = dirname(wdir);
    snprintf(cfg_path, sizeof cfg_path, "%s/config.yaml", d);
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", d);
    if (!g_gen_config && file_exists(cfg_path)) g_gen_config = cfg_path;
    if (!g_gen_tok) g_gen_tok = tok_path;

    run r = {0};
    r.mode = MODE_GENERATE;
    struct stat tsb;
    const bool tok_dir = stat(g_gen_tok, &tsb) == 0 && S_ISDIR(tsb.st_mode); /* a Hugging Face folder */
    if ((tok_dir ? cm_hf_tokenizer_load(g_gen_tok, &r.tok, NULL) : cm_tokenizer_load(g_gen_tok, &r.tok)) != CM_OK) {
        fprintf(stderr, "%s: tokenizer: %s (pass --tokenizer DIR/tokenizer.json, or a pretrained folder)\n", prog,
                cm_last_error());
        return 1;
    }
    snprintf(r.tok_path, sizeof r.tok_path, "%s", g_gen_tok);
    cm_status s;
    if (g_gen_config) {
        if ((rc = load_config(prog, g_gen_config, NULL, 0, &r.cfg)) != 0) {
            run_free(&r);
            return rc;
        }
        int64_t sd;
        if (cm_config_get_int(r.cfg, "seed", 42, &sd) != CM_OK || build_model(&r, false) != CM_OK)
            return config_error(prog, &r);
        /* the model the weights were trained as (ALiBi, ...): the config's surgery, and what the
         * checkpoint it started from requires */
        r.tc = cm_trainer_config_default();
        r.tc.seed = (uint64_t)sd;
        if (r.gpt2 && (read_trainer_keys(&r) != CM_OK || read_load_keys(&r) != CM_OK ||
                       build_plugins_of(&r, "algorithms", CLI_ALGORITHM, true) != CM_OK ||
                       add_recorded_surgery(&r, g_gen_weights, NULL) != CM_OK || apply_trained_surgery(&r, NULL) != CM_OK))
            return config_error(prog, &r);
        if (!r.gpt2) {
            fprintf(stderr, "%s: %s: the model is not a GPT (model.name: gpt2)\n", prog, g_gen_config);
            run_free(&r);
            return EXIT_USAGE;
        }
    } else {
        cm_gpt2_config g;
        if (cm_gpt2_config_from_safetensors(g_gen_weights, &g) != CM_OK) {
            fprintf(stderr, "%s: %s\n", prog, cm_last_error());
            run_free(&r);
            return 1;
        }
        if (heads > 0) g.n_head = (int64_t)heads;
        if ((s = cm_gpt2_new(&g, NULL, &r.model)) != CM_OK) {
            fprintf(stderr, "%s: %s\n", prog, cm_last_error());
            run_free(&r);
            return 1;
        }
        /* no config: the surgery the file records (ALiBi) is all there is to apply */
        r.gpt2 = true;
        r.tc = cm_trainer_config_default();
        if (add_recorded_surgery(&r, g_gen_weights, NULL) != CM_OK ||
            (r.n_algs > 0 && apply_trained_surgery(&r, NULL) != CM_OK)) {
            fprintf(stderr, "%s: %s: %s\n", prog, g_gen_weights, cm_last_error());
            run_free(&r);
            return 1;
        }
    }
    if (cm_gpt2_load_safetensors(r.model, g_gen_weights, NULL, NULL) != CM_OK) {
        fprintf(stderr, "%s: loading %s: %s\n", prog, g_gen_weights, cm_last_error());
        run_free(&r);
        return 1;
    }
    if (dev != CM_DEVICE_CPU && cm_module_to_device(cm_model_module(r.model), dev) != CM_OK) {
        fprintf(stderr, "%s: moving the model to the GPU: %s\n", prog, cm_last_error());
        run_free(&r);
        return 1;
    }
    char *text = generate_text(r.model, r.tok, g_gen_prompt, (int64_t)n, temp, (int64_t)topk, (uint64_t)seed);
    if (!text) {
        fprintf(stderr, "%s: generation failed: %s\n", prog, cm_last_error());
        run_free(&r);
        return 1;
    }
    printf("%s\n", text);
    cm_free(text);
    run_free(&r);
    return 0;
}
