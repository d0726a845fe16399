/* Hugging Face pretrained folders (composer/hf.h): config.json into the zoo's BERT / GPT-2
 * configurations and back, weights by Hugging Face's names with transformers' strictness and
 * announcements, and whole folders written as save_pretrained writes them. */
#include <composer/hf.h>
#include <composer/config.h>
#include <composer/nn.h>
#include <composer/safetensors.h>
#include <composer/zoo_bert.h>
#include <composer/zoo_gpt2.h>

#include "base/json.h"
#include "text/text_impl.h"
#include "zoo/hf_impl.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_PATH 4096

/* ---------------------------------------------------------------------------------------------
 * Tasks
 * ------------------------------------------------------------------------------------------- */

static const char *const k_tasks[3] = {"masked_lm", "sequence_classification", "causal_lm"};

const char *cm_hf_task_name(cm_hf_task t) { return (unsigned)t < 3 ? k_tasks[t] : "?"; }

cm_status cm_hf_task_parse(const char *s, cm_hf_task *out) {
    if (!s || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_hf_task_parse: NULL argument");
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, k_tasks[i])) {
            *out = (cm_hf_task)i;
            return CM_OK;
        }
    const char *near = cm_config_closest(s, k_tasks, 3);
    return cm_set_error(CM_ERR_INVALID_ARG, "unknown task '%s' (%s%s%suse masked_lm, sequence_classification or causal_lm)",
                        s, near ? "did you mean '" : "", near ? near : "", near ? "'? " : "");
}

cm_hf_load_opts cm_hf_load_opts_default(void) {
    cm_hf_load_opts o;
    memset(&o, 0, sizeof o);
    o.task = CM_HF_TASK_MASKED_LM;
    o.pretrained = true;
    return o;
}

/* ---------------------------------------------------------------------------------------------
 * config.json
 * ------------------------------------------------------------------------------------------- */

typedef enum family { FAM_BERT = 0, FAM_GPT2 = 1 } family;

typedef struct hf_cfg {
    family fam;
    cm_bert_config bert;
    cm_gpt2_config gpt2;
    char architecture[96];
    bool has_num_labels;   /* config.json says how many labels */
    int64_t eos_token_id;  /* GPT-2: for writing back; -1 */
} hf_cfg;

/* The classes we build, and the ones whose weights load by name into them. */
static const char *const k_bert_arch[] = {"BertForMaskedLM", "BertForPreTraining", "BertModel",
                                          "BertForSequenceClassification", "BertForNextSentencePrediction",
                                          "BertForTokenClassification", "BertForQuestionAnswering",
                                          "BertForMultipleChoice"};
static const char *const k_gpt2_arch[] = {"GPT2LMHeadModel", "GPT2Model", "GPT2DoubleHeadsModel",
                                          "GPT2ForSequenceClassification", "GPT2ForTokenClassification",
                                          "GPT2ForQuestionAnswering"};
#define N_OF(a) ((int)(sizeof(a) / sizeof *(a)))

/* Fields any PretrainedConfig may carry that do not change the computation here: ignored. */
static const char *const k_ignored[] = {
    "transformers_version", "torch_dtype", "use_cache", "return_dict", "output_hidden_states", "output_attentions",
    "torchscript", "use_bfloat16", "tf_legacy_loss", "chunk_size_feed_forward", "max_length", "min_length",
    "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty", "temperature", "top_k",
    "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens", "task_specific_params",
    "prefix", "finetuning_task", "label2id", "tokenizer_class", "bos_token_id", "eos_token_id", "sep_token_id",
    "decoder_start_token_id", "gradient_checkpointing", "output_past", "architectures", "model_type", "id2label",
    "num_labels", "problem_type", "cross_attention_hidden_size", "tie_encoder_decoder", "is_encoder_decoder",
    "is_decoder", "add_cross_attention", "pruned_heads", "tie_word_embeddings"};
/* GPT-2's fields for heads we do not build (GPT2DoubleHeadsModel's summary) or numerics only. */
static const char *const k_gpt2_ignored[] = {"n_ctx", "summary_type", "summary_use_proj", "summary_activation",
                                             "summary_proj_to_labels", "summary_first_dropout",
                                             "reorder_and_upcast_attn", "pad_token_id"};

static bool in_list(const char *s, const char *const *l, int n) {
    for (int i = 0; i < n; i++)
        if (!strcmp(s, l[i])) return true;
    return false;
}

typedef struct jctx {
    const char *path; /* config.json's path (for messages) */
    const char *from; /* " (with config_overrides)" or "" */
} jctx;

static cm_status field_err(const jctx *j, cm_status s, const char *field, const char *what) {
    return cm_set_error(s, "config.json '%s'%s: field \"%s\" %s", j->path, j->from, field, what);
}

static cm_status get_int(const jctx *j, const cJSON *v, int64_t *out) {
    if (!cmi_json_whole(v, INT64_MIN, INT64_MAX, out)) return field_err(j, CM_ERR_FORMAT, v->string, "must be an integer");
    return CM_OK;
}

static cm_status get_float(const jctx *j, const cJSON *v, float *out) {
    if (!cJSON_IsNumber(v)) return field_err(j, CM_ERR_FORMAT, v->string, "must be a number");
    *out = (float)v->valuedouble;
    return CM_OK;
}

static const struct {
    const char *name;
    cm_activation act;
} k_acts[] = {{"gelu", CM_ACT_GELU},       {"gelu_new", CM_ACT_GELU_TANH}, {"gelu_pytorch_tanh", CM_ACT_GELU_TANH},
              {"gelu_fast", CM_ACT_GELU_TANH}, {"relu", CM_ACT_RELU},     {"silu", CM_ACT_SILU},
              {"swish", CM_ACT_SILU},      {"tanh", CM_ACT_TANH},         {"sigmoid", CM_ACT_SIGMOID},
              {"linear", CM_ACT_IDENTITY}};

static cm_status get_act(const jctx *j, const cJSON *v, cm_activation *out) {
    if (!cJSON_IsString(v)) return field_err(j, CM_ERR_FORMAT, v->string, "must be a string (gelu, gelu_new, relu, ...)");
    for (int i = 0; i < N_OF(k_acts); i++)
        if (!strcmp(v->valuestring, k_acts[i].name)) {
            *out = k_acts[i].act;
            return CM_OK;
        }
    char msg[256];
    snprintf(msg, sizeof msg,
             "is \"%.60s\": not implemented (use gelu, gelu_new, gelu_pytorch_tanh, gelu_fast, relu, silu, swish, "
             "tanh, sigmoid or linear)",
             v->valuestring);
    return field_err(j, CM_ERR_UNSUPPORTED, v->string, msg);
}

static const char *act_name(cm_activation a) {
    switch (a) {
    case CM_ACT_GELU: return "gelu";
    case CM_ACT_GELU_TANH: return "gelu_new";
    case CM_ACT_RELU: return "relu";
    case CM_ACT_SILU: return "silu";
    case CM_ACT_TANH: return "tanh";
    case CM_ACT_SIGMOID: return "sigmoid";
    case CM_ACT_IDENTITY: return "linear";
    }
    return "?";
}

/* A field that must keep transformers' default: bool default, or a string. */
static cm_status must_be_false(const jctx *j, const cJSON *v) {
    if (cJSON_IsFalse(v) || cJSON_IsNull(v)) return CM_OK;
    return field_err(j, CM_ERR_UNSUPPORTED, v->string, "is set: not implemented (only false is)");
}

/* The generic fields that matter in every family. */
static cm_status generic(const jctx *j, const cJSON *v, family fam) {
    const char *k = v->string;
    if (!strcmp(k, "is_decoder") || !strcmp(k, "add_cross_attention") || !strcmp(k, "is_encoder_decoder") ||
        !strcmp(k, "tie_encoder_decoder"))
        return must_be_false(j, v);
    if (!strcmp(k, "pruned_heads") && !(cJSON_IsObject(v) && !v->child) && !cJSON_IsNull(v))
        return field_err(j, CM_ERR_UNSUPPORTED, k, "lists pruned heads: not implemented");
    if (!strcmp(k, "cross_attention_hidden_size") && !cJSON_IsNull(v))
        return field_err(j, CM_ERR_UNSUPPORTED, k, "is set: cross-attention is not implemented");
    if (!strcmp(k, "tie_word_embeddings") && fam == FAM_BERT && !cJSON_IsTrue(v))
        return field_err(j, CM_ERR_UNSUPPORTED, k, "is false: BERT's MLM decoder is always tied to the word embeddings here");
    return CM_OK;
}

static cm_status read_bert(const jctx *j, const cJSON *o, hf_cfg *c) {
    cm_bert_config *b = &c->bert;
    *b = cm_bert_config_default();
    int64_t id2label = -1, num_labels = -1;
    const char *problem = NULL;
    cm_status st = CM_OK;
    for (const cJSON *v = o->child; v && st == CM_OK; v = v->next) {
        const char *k = v->string;
        if (!strcmp(k, "vocab_size")) st = get_int(j, v, &b->vocab_size);
        else if (!strcmp(k, "hidden_size")) st = get_int(j, v, &b->hidden_size);
        else if (!strcmp(k, "num_hidden_layers")) st = get_int(j, v, &b->num_hidden_layers);
        else if (!strcmp(k, "num_attention_heads")) st = get_int(j, v, &b->num_attention_heads);
        else if (!strcmp(k, "intermediate_size")) st = get_int(j, v, &b->intermediate_size);
        else if (!strcmp(k, "hidden_act")) st = get_act(j, v, &b->hidden_act);
        else if (!strcmp(k, "hidden_dropout_prob")) st = get_float(j, v, &b->hidden_dropout_prob);
        else if (!strcmp(k, "attention_probs_dropout_prob")) st = get_float(j, v, &b->attention_probs_dropout_prob);
        else if (!strcmp(k, "max_position_embeddings")) st = get_int(j, v, &b->max_position_embeddings);
        else if (!strcmp(k, "type_vocab_size")) st = get_int(j, v, &b->type_vocab_size);
        else if (!strcmp(k, "initializer_range")) st = get_float(j, v, &b->initializer_range);
        else if (!strcmp(k, "layer_norm_eps")) st = get_float(j, v, &b->layer_norm_eps);
        else if (!strcmp(k, "pad_token_id")) {
            if (cJSON_IsNull(v)) b->pad_token_id = -1;
            else st = get_int(j, v, &b->pad_token_id);
        } else if (!strcmp(k, "classifier_dropout")) {
            if (cJSON_IsNull(v)) b->classifier_dropout = -1.0f;
            else st = get_float(j, v, &b->classifier_dropout);
        } else if (!strcmp(k, "position_embedding_type")) {
            if (!cJSON_IsString(v) || strcmp(v->valuestring, "absolute"))
                st = field_err(j, CM_ERR_UNSUPPORTED, k,
                               "is not \"absolute\": relative position embeddings are not implemented");
        } else if (!strcmp(k, "num_labels")) {
            st = get_int(j, v, &num_labels);
        } else if (!strcmp(k, "id2label")) {
            if (!cJSON_IsObject(v)) st = field_err(j, CM_ERR_FORMAT, k, "must be an object");
            else id2label = cJSON_GetArraySize(v);
        } else if (!strcmp(k, "problem_type")) {
            if (cJSON_IsString(v)) problem = v->valuestring;
            else if (!cJSON_IsNull(v)) st = field_err(j, CM_ERR_FORMAT, k, "must be a string or null");
        } else if (in_list(k, k_ignored, N_OF(k_ignored)) || k[0] == '_') {
            st = generic(j, v, FAM_BERT);
        } else {
            st = field_err(j, CM_ERR_UNSUPPORTED, k,
                           "is not a BertConfig field we implement (if it does not change the model, delete it from "
                           "config.json)");
        }
    }
    if (st != CM_OK) return st;
    if (num_labels >= 1 || id2label >= 1) {
        b->num_labels = num_labels >= 1 ? num_labels : id2label;
        c->has_num_labels = true;
    }
    if (problem && strcmp(problem, "single_label_classification") && strcmp(problem, "regression"))
        return field_err(j, CM_ERR_UNSUPPORTED, "problem_type",
                         "is not single_label_classification or regression: multi-label classification is not "
                         "implemented");
    if (problem && !strcmp(problem, "regression")) {
        if (c->has_num_labels && b->num_labels != 1)
            return field_err(j, CM_ERR_FORMAT, "problem_type", "is regression but num_labels is not 1");
        b->num_labels = 1;
        c->has_num_labels = true;
    }
    return CM_OK;
}

static cm_status read_gpt2(const jctx *j, const cJSON *o, hf_cfg *c) {
    cm_gpt2_config *g = &c->gpt2;
    *g = cm_gpt2_config_default();
    int64_t n_inner = -1;
    cm_status st = CM_OK;
    for (const cJSON *v = o->child; v && st == CM_OK; v = v->next) {
        const char *k = v->string;
        if (!strcmp(k, "vocab_size")) st = get_int(j, v, &g->vocab_size);
        else if (!strcmp(k, "n_positions")) st = get_int(j, v, &g->n_positions);
        else if (!strcmp(k, "n_embd")) st = get_int(j, v, &g->n_embd);
        else if (!strcmp(k, "n_layer")) st = get_int(j, v, &g->n_layer);
        else if (!strcmp(k, "n_head")) st = get_int(j, v, &g->n_head);
        else if (!strcmp(k, "n_inner")) {
            if (!cJSON_IsNull(v)) st = get_int(j, v, &n_inner);
        } else if (!strcmp(k, "activation_function")) st = get_act(j, v, &g->activation);
        else if (!strcmp(k, "resid_pdrop")) st = get_float(j, v, &g->resid_pdrop);
        else if (!strcmp(k, "embd_pdrop")) st = get_float(j, v, &g->embd_pdrop);
        else if (!strcmp(k, "attn_pdrop")) st = get_float(j, v, &g->attn_pdrop);
        else if (!strcmp(k, "layer_norm_epsilon")) st = get_float(j, v, &g->layer_norm_eps);
        else if (!strcmp(k, "initializer_range")) st = get_float(j, v, &g->initializer_range);
        else if (!strcmp(k, "tie_word_embeddings")) {
            if (!cJSON_IsBool(v)) st = field_err(j, CM_ERR_FORMAT, k, "must be true or false");
            else g->tie_word_embeddings = cJSON_IsTrue(v);
        } else if (!strcmp(k, "eos_token_id")) {
            if (!cJSON_IsNull(v)) st = get_int(j, v, &c->eos_token_id);
        } else if (!strcmp(k, "scale_attn_weights")) {
            if (!cJSON_IsTrue(v)) st = field_err(j, CM_ERR_UNSUPPORTED, k, "is not true: unscaled attention is not implemented");
        } else if (!strcmp(k, "scale_attn_by_inverse_layer_idx")) {
            st = must_be_false(j, v);
        } else if (in_list(k, k_gpt2_ignored, N_OF(k_gpt2_ignored)) || in_list(k, k_ignored, N_OF(k_ignored)) ||
                   k[0] == '_') {
            st = generic(j, v, FAM_GPT2);
        } else {
            st = field_err(j, CM_ERR_UNSUPPORTED, k,
                           "is not a GPT2Config field we implement (if it does not change the model, delete it from "
                           "config.json)");
        }
    }
    if (st != CM_OK) return st;
    if (n_inner >= 0 && n_inner != 4 * g->n_embd) {
        char msg[160];
        snprintf(msg, sizeof msg, "is %lld: an MLP width other than 4 * n_embd (%lld) is not implemented",
                 (long long)n_inner, (long long)(4 * g->n_embd));
        return field_err(j, CM_ERR_UNSUPPORTED, "n_inner", msg);
    }
    return CM_OK;
}

/* Shallow merge: every field of over replaces base's. */
static cm_status merge(cJSON *base, const cJSON *over) {
    for (const cJSON *e = over->child; e; e = e->next) {
        cJSON *dup = cJSON_Duplicate(e, true);
        if (!dup) return CM_ERR_OOM;
        if (cJSON_GetObjectItemCaseSensitive(base, e->string)) {
            if (!cJSON_ReplaceItemInObjectCaseSensitive(base, e->string, dup)) {
                cJSON_Delete(dup);
                return CM_ERR_OOM;
            }
        } else if (!cJSON_AddItemToObject(base, e->string, dup)) {
            cJSON_Delete(dup);
            return CM_ERR_OOM;
        }
    }
    return CM_OK;
}

static bool file_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static void list_join(char *buf, size_t cap, const char *const *l, int n) {
    buf[0] = '\0';
    for (int i = 0; i < n; i++) snprintf(buf + strlen(buf), cap - strlen(buf), "%s%s", i ? ", " : "", l[i]);
}

/* Reads dir/config.json (with overrides) into *c. */
static cm_status read_config(const char *dir, const char *overrides, hf_cfg *c) {
    memset(c, 0, sizeof *c);
    c->eos_token_id = -1;
    char path[MAX_PATH];
    snprintf(path, sizeof path, "%s/config.json", dir);
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return cm_set_error(CM_ERR_NOT_FOUND, "pretrained folder '%s' does not exist or is not a folder", dir);
    if (!file_exists(path))
        return cm_set_error(CM_ERR_NOT_FOUND,
                            "'%s' has no config.json: not a Hugging Face pretrained folder (save_pretrained writes "
                            "config.json beside the weights)",
                            dir);
    uint8_t *data;
    size_t len;
    cm_status st = cm_read_file_(path, "config.json", &data, &len);
    if (st != CM_OK) return st;
    cJSON *o = cJSON_ParseWithLength((const char *)data, len);
    cm_free(data);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return cm_set_error(CM_ERR_FORMAT, "config.json '%s' is not a JSON object; is it truncated?", path);
    }
    jctx j = {path, ""};
    if (overrides) {
        cJSON *ov = cJSON_Parse(overrides);
        if (!cJSON_IsObject(ov)) st = cm_set_error(CM_ERR_FORMAT, "config_overrides '%.80s' is not a JSON object", overrides);
        else st = merge(o, ov);
        cJSON_Delete(ov);
        j.from = " (with config_overrides)";
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(o, "model_type");
    const cJSON *ar = cJSON_GetObjectItemCaseSensitive(o, "architectures");
    const char *arch = cJSON_IsArray(ar) && cJSON_IsString(ar->child) ? ar->child->valuestring : NULL;
    const char *type = cJSON_IsString(mt) ? mt->valuestring : NULL;
    if (st == CM_OK && !type && arch) type = !strncmp(arch, "Bert", 4) ? "bert" : !strncmp(arch, "GPT2", 4) ? "gpt2" : NULL;
    /* transformers' AutoConfig, for configs from before model_type (Google's BERT-Tiny): the
     * model type named in the folder's path */
    if (st == CM_OK && !type) type = strstr(dir, "gpt2") ? "gpt2" : strstr(dir, "bert") ? "bert" : NULL;
    if (st == CM_OK && !type)
        st = cm_set_error(CM_ERR_FORMAT,
                          "config.json '%s' has neither model_type nor architectures, and the path names no model type "
                          "(add \"model_type\": \"bert\" or \"gpt2\")",
                          path);
    if (st == CM_OK && strcmp(type, "bert") && strcmp(type, "gpt2"))
        st = cm_set_error(CM_ERR_UNSUPPORTED,
                          "config.json '%s': model_type \"%s\"%s%s%s is not implemented (supported: bert, gpt2)", path,
                          type, arch ? " (architecture " : "", arch ? arch : "", arch ? ")" : "");
    if (st == CM_OK) {
        c->fam = !strcmp(type, "bert") ? FAM_BERT : FAM_GPT2;
        const char *const *known = c->fam == FAM_BERT ? k_bert_arch : k_gpt2_arch;
        int n_known = c->fam == FAM_BERT ? N_OF(k_bert_arch) : N_OF(k_gpt2_arch);
        if (arch && !in_list(arch, known, n_known)) {
            char list[512];
            list_join(list, sizeof list, known, n_known);
            st = cm_set_error(CM_ERR_UNSUPPORTED, "config.json '%s': architecture \"%s\" is not implemented for %s (%s)",
                              path, arch, type, list);
        }
        snprintf(c->architecture, sizeof c->architecture, "%s", arch ? arch : type);
    }
    if (st == CM_OK) st = c->fam == FAM_BERT ? read_bert(&j, o, c) : read_gpt2(&j, o, c);
    if (st == CM_OK) {
        st = c->fam == FAM_BERT ? cm_bert_config_check(&c->bert) : cm_gpt2_config_check(&c->gpt2);
        if (st != CM_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            st = cm_set_error(CM_ERR_FORMAT, "config.json '%s'%s: %s", path, j.from, msg);
        }
    }
    cJSON_Delete(o);
    return st;
}

/* ---------------------------------------------------------------------------------------------
 * Loading
 * ------------------------------------------------------------------------------------------- */

static void list_add(char *buf, size_t cap, const char *name) {
    size_t len = strlen(buf);
    if (strstr(buf, ", ...")) return;
    if (len + strlen(name) + 8 >= cap) {
        snprintf(buf + len, cap - len, "%s...", len ? ", " : "");
        return;
    }
    snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", name);
}

/* A file name as the model names it: BERT's bare BertModel names get "bert.", TF-era gamma/beta
 * become weight/bias; GPT2Model's names get "transformer.". Into buf. */
static void canonical(family fam, const char *name, char *buf, size_t cap) {
    if (fam == FAM_BERT && (!strncmp(name, "embeddings.", 11) || !strncmp(name, "encoder.", 8) ||
                            !strncmp(name, "pooler.", 7)))
        snprintf(buf, cap, "bert.%s", name);
    else if (fam == FAM_GPT2 && strncmp(name, "transformer.", 12) && strncmp(name, "lm_head.", 8))
        snprintf(buf, cap, "transformer.%s", name);
    else snprintf(buf, cap, "%s", name);
    size_t n = strlen(buf);
    if (n >= 15 && !strcmp(buf + n - 15, "LayerNorm.gamma")) strcpy(buf + n - 5, "weight");
    else if (n >= 14 && !strcmp(buf + n - 14, "LayerNorm.beta")) strcpy(buf + n - 4, "bias");
}

/* The heads of a task: groups the folder may lack as a whole (new), and globs of the family's
 * other heads (unused). */
typedef struct heads {
    const char *groups[2];
    int n_groups;
    const char *other[5];
    int n_other;
} heads;

static heads task_heads(family fam, cm_hf_task task) {
    heads h = {{0}, 0, {0}, 0};
    if (fam == FAM_GPT2) {
        static const char *const o[4] = {"score.*", "multiple_choice_head.*", "classifier.*", "qa_outputs.*"};
        for (int i = 0; i < 4; i++) h.other[h.n_other++] = o[i];
    } else if (task == CM_HF_TASK_MASKED_LM) {
        h.groups[h.n_groups++] = "cls.predictions.*";
        static const char *const o[4] = {"cls.seq_relationship.*", "bert.pooler.*", "classifier.*", "qa_outputs.*"};
        for (int i = 0; i < 4; i++) h.other[h.n_other++] = o[i];
    } else {
        h.groups[h.n_groups++] = "bert.pooler.*";
        h.groups[h.n_groups++] = "classifier.*";
        static const char *const o[2] = {"cls.*", "qa_outputs.*"};
        for (int i = 0; i < 2; i++) h.other[h.n_other++] = o[i];
    }
    return h;
}

/* The weights file of a folder; an error naming what is there when there is none. */
static cm_status check_weights(const char *dir) {
    char p[MAX_PATH];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    if (file_exists(p)) return CM_OK;
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    if (file_exists(p)) return CM_OK;
    static const char *const other[] = {"pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5",
                                        "flax_model.msgpack"};
    for (int i = 0; i < N_OF(other); i++) {
        snprintf(p, sizeof p, "%s/%s", dir, other[i]);
        if (file_exists(p))
            return cm_set_error(CM_ERR_NOT_FOUND,
                                "'%s' holds %s but no model.safetensors: only safetensors weights are read (convert "
                                "them, e.g. in Python: AutoModel.from_pretrained(DIR).save_pretrained(DIR, "
                                "safe_serialization=True))",
                                dir, other[i]);
    }
    return cm_set_error(CM_ERR_NOT_FOUND,
                        "'%s' has config.json but no weights (model.safetensors or model.safetensors.index.json); use "
                        "pretrained: false to start from the config alone",
                        dir);
}

static const char *model_class(family fam, cm_hf_task task) {
    if (fam == FAM_GPT2) return "GPT2LMHeadModel";
    return task == CM_HF_TASK_MASKED_LM ? "BertForMaskedLM" : "BertForSequenceClassification";
}

cm_status cm_hf_load(const char *dir, const cm_hf_load_opts *opts, cm_model **out, cm_hf_load_report *report) {
    if (!dir || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_hf_load: NULL argument");
    *out = NULL;
    cm_hf_load_opts o = opts ? *opts : cm_hf_load_opts_default();
    if ((unsigned)o.task > 2) return cm_set_error(CM_ERR_INVALID_ARG, "cm_hf_load: unknown task %d", (int)o.task);
    if (o.num_labels < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_hf_load: num_labels %lld must be >= 0 (0 = config.json's)",
                            (long long)o.num_labels);
    cm_hf_load_report rep;
    memset(&rep, 0, sizeof rep);
    hf_cfg c;
    cm_status st = read_config(dir, o.config_overrides, &c);
    if (st != CM_OK) return st;
    snprintf(rep.architecture, sizeof rep.architecture, "%s", c.architecture);
    const bool bert = c.fam == FAM_BERT;
    if (bert && o.task == CM_HF_TASK_CAUSAL_LM)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "'%s' is a BERT (%s): task causal_lm is not implemented for it (use masked_lm or "
                            "sequence_classification)",
                            dir, c.architecture);
    if (!bert && o.task != CM_HF_TASK_CAUSAL_LM)
        return cm_set_error(CM_ERR_INVALID_ARG, "'%s' is a GPT-2 (%s): task %s is not implemented for it (use causal_lm)",
                            dir, c.architecture, cm_hf_task_name(o.task));
    if (bert && o.num_labels > 0) c.bert.num_labels = o.num_labels;
    else if (bert && !c.has_num_labels) c.bert.num_labels = 2;
    snprintf(rep.model_class, sizeof rep.model_class, "%s", model_class(c.fam, o.task));
    if (o.pretrained && (st = check_weights(dir)) != CM_OK) return st;

    cm_rng rng = cm_rng_init(o.seed, 0);
    cm_model *m = NULL;
    if (bert) st = o.task == CM_HF_TASK_MASKED_LM ? cm_bert_mlm_new(&c.bert, &rng, &m) : cm_bert_classifier_new(&c.bert, &rng, &m);
    else st = cm_gpt2_new(&c.gpt2, &rng, &m);
    if (st != CM_OK) return st;
    if (!o.pretrained) {
        *out = m;
        if (report) *report = rep;
        return CM_OK;
    }

    /* Which heads the folder lacks and which of its tensors belong to other heads. */
    cm_safetensors_index *idx = NULL;
    if ((st = cm_safetensors_index_open(dir, &idx)) != CM_OK) {
        cm_model_free(m);
        return st;
    }
    const heads h = task_heads(c.fam, o.task);
    bool group_in_file[2] = {false, false};
    const char *ignore[8];
    int n_ignore = 0;
    for (size_t i = 0; i < cm_safetensors_index_count(idx); i++) {
        char name[512];
        canonical(c.fam, cm_safetensors_index_name(idx, i), name, sizeof name);
        for (int g = 0; g < h.n_groups; g++) group_in_file[g] |= cm_name_match(h.groups[g], name);
        for (int k = 0; k < h.n_other; k++)
            if (cm_name_match(h.other[k], name)) {
                rep.n_unused++;
                list_add(rep.unused_names, sizeof rep.unused_names, name);
            }
    }
    cm_safetensors_index_close(idx);
    for (int k = 0; k < h.n_other; k++) ignore[n_ignore++] = h.other[k];
    cm_module *root = cm_model_module(m);
    for (int g = 0; g < h.n_groups; g++) {
        if (group_in_file[g]) continue;
        ignore[n_ignore++] = h.groups[g];
        for (int64_t i = 0; i < cm_module_n_params(root); i++) {
            cm_param_info pi = cm_module_param_info(root, i);
            if (!cm_name_match(h.groups[g], pi.name)) continue;
            rep.n_new++;
            list_add(rep.new_names, sizeof rep.new_names, pi.name);
        }
    }
    cm_load_opts lo = cm_load_opts_default();
    lo.ignore = ignore, lo.n_ignore = n_ignore;
    cm_load_report lr;
    st = bert ? cm_bert_load_safetensors(m, dir, &lo, &lr) : cm_gpt2_load_safetensors(m, dir, &lo, &lr);
    if (st != CM_OK) {
        cm_model_free(m);
        return st;
    }
    rep.n_loaded = lr.n_loaded;
    /* transformers' announcements, in its words */
    if (rep.n_unused)
        cm_log_msg(CM_LOG_WARN,
                   "Some weights of the model checkpoint at %s were not used when initializing %s: [%s]\n- This IS "
                   "expected if you are initializing %s from the checkpoint of a model trained on another task or "
                   "with another architecture (e.g. initializing a BertForSequenceClassification model from a "
                   "BertForPreTraining model).",
                   dir, rep.model_class, rep.unused_names, rep.model_class);
    if (rep.n_new)
        cm_log_msg(CM_LOG_WARN,
                   "Some weights of %s were not initialized from the model checkpoint at %s and are newly "
                   "initialized: [%s]\nYou should probably TRAIN this model on a down-stream task to be able to use "
                   "it for predictions and inference.",
                   rep.model_class, dir, rep.new_names);
    *out = m;
    if (report) *report = rep;
    return CM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Writing
 * ------------------------------------------------------------------------------------------- */

/* The shortest decimal that reads back to f, as a JSON number (0.1f is written 0.1, not
 * 0.10000000149011612). */
static cJSON *num_f(float f) {
    char buf[32];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)f);
        if ((float)strtod(buf, NULL) == f) break;
    }
    return cJSON_CreateNumber(strtod(buf, NULL));
}

static cJSON *num_i(int64_t v) { return cJSON_CreateNumber((double)v); }

/* Adds fields in the order given (transformers sorts its keys; the callers list them sorted). */
typedef struct kv {
    const char *k;
    cJSON *v;
} kv;

static bool add_all(cJSON *o, kv *f, int n) {
    bool ok = true;
    for (int i = 0; i < n; i++) {
        if (!f[i].v) ok = false;
        else if (ok && !cJSON_AddItemToObject(o, f[i].k, f[i].v)) ok = false, cJSON_Delete(f[i].v);
        else if (!ok) cJSON_Delete(f[i].v);
    }
    return ok;
}

static cJSON *arch_list(const char *cls) {
    cJSON *a = cJSON_CreateArray(), *s = cJSON_CreateString(cls);
    if (!a || !s || !cJSON_AddItemToArray(a, s)) {
        cJSON_Delete(a);
        cJSON_Delete(s);
        return NULL;
    }
    return a;
}

/* id2label {"0": "LABEL_0", ...} (labels = true) or label2id {"LABEL_0": 0, ...}. */
static cJSON *label_map(int64_t n, bool id2label) {
    cJSON *o = cJSON_CreateObject();
    for (int64_t i = 0; o && i < n; i++) {
        char k[32], v[32];
        snprintf(k, sizeof k, "%lld", (long long)i);
        snprintf(v, sizeof v, "LABEL_%lld", (long long)i);
        cJSON *item = id2label ? cJSON_CreateString(v) : num_i(i);
        if (!item || !cJSON_AddItemToObject(o, id2label ? k : v, item)) {
            cJSON_Delete(item);
            cJSON_Delete(o);
            return NULL;
        }
    }
    return o;
}

cm_status cm_hf_config_json(const cm_model *m, int64_t eos_token_id, char **json) {
    if (!m || !json) return cm_set_error(CM_ERR_INVALID_ARG, "cm_hf_config_json: NULL argument");
    *json = NULL;
    const cm_bert_config *b = cm_bert_model_config(m);
    const cm_gpt2_config *g = cm_gpt2_model_config(m);
    if (!b && !g)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_hf_config_json: %s is not a BERT or GPT-2 zoo model",
                            cm_model_type_name(m));
    if (g && !g->bias)
        return cm_set_error(CM_ERR_UNSUPPORTED, "a GPT-2 without biases (bias: false) has no Hugging Face GPT2Config "
                                                "equivalent");
    cJSON *o = cJSON_CreateObject();
    if (!o) return CM_ERR_OOM;
    bool ok;
    const char *cls = cm_model_type_name(m);
    if (b) {
        const bool cls_head = !strcmp(cls, "BertForSequenceClassification");
        kv f[] = {
            {"architectures", arch_list(cls)},
            {"attention_probs_dropout_prob", num_f(b->attention_probs_dropout_prob)},
            {"classifier_dropout", b->classifier_dropout < 0 ? cJSON_CreateNull() : num_f(b->classifier_dropout)},
            {"hidden_act", cJSON_CreateString(act_name(b->hidden_act))},
            {"hidden_dropout_prob", num_f(b->hidden_dropout_prob)},
            {"hidden_size", num_i(b->hidden_size)},
            {"id2label", cls_head ? label_map(b->num_labels, true) : NULL},
            {"initializer_range", num_f(b->initializer_range)},
            {"intermediate_size", num_i(b->intermediate_size)},
            {"label2id", cls_head ? label_map(b->num_labels, false) : NULL},
            {"layer_norm_eps", num_f(b->layer_norm_eps)},
            {"max_position_embeddings", num_i(b->max_position_embeddings)},
            {"model_type", cJSON_CreateString("bert")},
            {"num_attention_heads", num_i(b->num_attention_heads)},
            {"num_hidden_layers", num_i(b->num_hidden_layers)},
            {"pad_token_id", b->pad_token_id < 0 ? cJSON_CreateNull() : num_i(b->pad_token_id)},
            {"position_embedding_type", cJSON_CreateString("absolute")},
            {"problem_type", cls_head && b->num_labels == 1 ? cJSON_CreateString("regression") : NULL},
            {"torch_dtype", cJSON_CreateString("float32")},
            {"type_vocab_size", num_i(b->type_vocab_size)},
            {"use_cache", cJSON_CreateBool(true)},
            {"vocab_size", num_i(b->vocab_size)},
        };
        /* the label fields belong to the classifier (problem_type only for regression) */
        kv keep[N_OF(f)];
        int n = 0;
        for (int i = 0; i < N_OF(f); i++) {
            bool labels = !strcmp(f[i].k, "id2label") || !strcmp(f[i].k, "label2id");
            bool problem = !strcmp(f[i].k, "problem_type");
            if ((labels && !cls_head) || (problem && !(cls_head && b->num_labels == 1))) {
                cJSON_Delete(f[i].v);
                continue;
            }
            keep[n++] = f[i];
        }
        ok = add_all(o, keep, n);
    } else {
        kv f[] = {
            {"activation_function", cJSON_CreateString(act_name(g->activation))},
            {"architectures", arch_list(cls)},
            {"attn_pdrop", num_f(g->attn_pdrop)},
            {"bos_token_id", eos_token_id >= 0 ? num_i(eos_token_id) : cJSON_CreateNull()},
            {"embd_pdrop", num_f(g->embd_pdrop)},
            {"eos_token_id", eos_token_id >= 0 ? num_i(eos_token_id) : cJSON_CreateNull()},
            {"initializer_range", num_f(g->initializer_range)},
            {"layer_norm_epsilon", num_f(g->layer_norm_eps)},
            {"model_type", cJSON_CreateString("gpt2")},
            {"n_embd", num_i(g->n_embd)},
            {"n_head", num_i(g->n_head)},
            {"n_inner", cJSON_CreateNull()},
            {"n_layer", num_i(g->n_layer)},
            {"n_positions", num_i(g->n_positions)},
            {"resid_pdrop", num_f(g->resid_pdrop)},
            {"scale_attn_by_inverse_layer_idx", cJSON_CreateBool(false)},
            {"scale_attn_weights", cJSON_CreateBool(true)},
            {"tie_word_embeddings", cJSON_CreateBool(g->tie_word_embeddings)},
            {"torch_dtype", cJSON_CreateString("float32")},
            {"use_cache", cJSON_CreateBool(true)},
            {"vocab_size", num_i(g->vocab_size)},
        };
        ok = add_all(o, f, N_OF(f));
    }
    char *s = ok ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    if (!s) return cm_set_error(CM_ERR_OOM, "cm_hf_config_json: out of memory");
    size_t n = strlen(s);
    *json = cm_alloc(n + 2, 16);
    if (*json) {
        memcpy(*json, s, n);
        (*json)[n] = '\n';
        (*json)[n + 1] = '\0';
    }
    cJSON_free(s);
    return *json ? CM_OK : cm_set_error(CM_ERR_OOM, "cm_hf_config_json: out of memory");
}

cm_status cmi_hf_mkdirs(const char *path) {
    char p[MAX_PATH];
    snprintf(p, sizeof p, "%s", path);
    size_t n = strlen(p);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            return cm_set_error(CM_ERR_IO, "cannot create folder '%s': %s", p, strerror(errno));
        p[i] = c;
    }
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return cm_set_error(CM_ERR_IO, "'%s' exists and is not a folder", path);
    return CM_OK;
}

/* The module types of a plain model of m's class: the same configuration made tiny (structure
 * does not depend on the sizes), built without weights. */
typedef struct {
    const char *types[64];
    int n;
} type_set;

static bool add_type(cm_module *m, const char *path, int depth, void *data) {
    (void)path, (void)depth;
    type_set *t = data;
    const char *name = cm_module_type_name(m);
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->types[i], name)) return true;
    if (t->n < (int)(sizeof t->types / sizeof *t->types)) t->types[t->n++] = name;
    return true;
}

static cm_status plain_types(const cm_model *m, type_set *out) {
    const cm_bert_config *b = cm_bert_model_config(m);
    const cm_gpt2_config *g = cm_gpt2_model_config(m);
    cm_model *ref = NULL;
    cm_status st;
    if (b) {
        cm_bert_config c = *b;
        c.vocab_size = 8, c.hidden_size = c.num_attention_heads, c.intermediate_size = 4, c.num_hidden_layers = 1;
        c.max_position_embeddings = 4;
        if (c.pad_token_id >= c.vocab_size) c.pad_token_id = 0;
        st = !strcmp(cm_model_type_name(m), "BertForSequenceClassification") ? cm_bert_classifier_new(&c, NULL, &ref)
                                                                             : cm_bert_mlm_new(&c, NULL, &ref);
    } else if (g) {
        cm_gpt2_config c = *g;
        c.vocab_size = 8, c.n_embd = c.n_head, c.n_positions = 4, c.n_layer = 1;
        st = cm_gpt2_new(&c, NULL, &ref);
    } else {
        return cm_set_error(CM_ERR_INVALID_ARG, "%s is not a BERT or GPT-2 zoo model", cm_model_type_name(m));
    }
    if (st != CM_OK) return st;
    out->n = 0;
    cm_module_visit(cm_model_module(ref), add_type, out);
    cm_model_free(ref);
    return CM_OK;
}

typedef struct {
    const type_set *plain;
    char path[256];
    const char *type; /* a module type the plain model lacks */
    bool alibi;       /* an attention module with ALiBi */
} plain_scan;

static bool scan_module(cm_module *m, const char *path, int depth, void *data) {
    (void)depth;
    plain_scan *c = data;
    const char *name = cm_module_type_name(m);
    cm_nn_attention_config ac;
    if ((!strcmp(name, "GPT2Attention") || !strcmp(name, "BertSelfAttention")) &&
        cm_nn_attention_config_of(m, &ac) == CM_OK && ac.alibi)
        c->alibi = true;
    else if (!strcmp(name, "GyroDropoutLayer")) /* dropout of another kind: training only, no weights */
        return true;
    else {
        for (int i = 0; i < c->plain->n; i++)
            if (!strcmp(c->plain->types[i], name)) return true;
        c->type = name;
    }
    snprintf(c->path, sizeof c->path, "%s", path && *path ? path : "(root)");
    return false;
}

/* The methods of composer/surgery_algorithms.h whose changes a folder keeps: the low-precision norms
 * (a flag on LayerNorm / GroupNorm: rounding under amp_bf16, no weight changes) and GyroDropout (the
 * GyroDropoutLayer that scan_module lets through). The manifest's other required_on_load methods
 * change the model's structure or forward. */
bool cmi_hf_folder_keeps(const char *algorithm) {
    static const char *const kept[] = {"LowPrecisionLayerNorm", "LowPrecisionGroupNorm", "GyroDropout"};
    for (size_t i = 0; i < sizeof kept / sizeof *kept; i++)
        if (!strcmp(algorithm, kept[i])) return true;
    return false;
}

#define HF_FOLDER_FIX                                                                                                 \
    "Keep Composer checkpoints (save_folder) and fine-tune from one instead: load_path=CHECKPOINT "                   \
    "load_weights_only=true load_strict_model_weights=false (the checkpoint re-applies its model surgery), as "     \
    "MosaicBERT's fine-tuning starts from its pretraining checkpoint"

cm_status cmi_hf_check_plain(const cm_model *m) {
    type_set plain;
    cm_status st = plain_types(m, &plain);
    if (st != CM_OK) return st;
    plain_scan c = {.plain = &plain};
    cm_module_visit(cm_model_module(m), scan_module, &c);
    const char *cls = cm_model_type_name(m);
    if (c.alibi)
        return cm_set_error(CM_ERR_UNSUPPORTED,
                            "%s cannot be written as a pretrained folder: its attention at '%s' uses ALiBi (the alibi "
                            "algorithm), which config.json cannot express; the folder would load back, here and in "
                            "transformers, with learned position embeddings and no ALiBi. " HF_FOLDER_FIX,
                            cls, c.path);
    if (c.type)
        return cm_set_error(CM_ERR_UNSUPPORTED,
                            "%s cannot be written as a pretrained folder: module '%s' is of type %s, which a %s as "
                            "config.json describes it does not have (model surgery such as gated_linear_units or "
                            "factorize changed it); the folder would not load back as this model. " HF_FOLDER_FIX,
                            cls, c.path, c.type, cls);
    return CM_OK;
}

cm_status cmi_hf_write(const char *dir, const char *config_json, cm_model *m, const cm_hf_file *files, int n) {
    char p[MAX_PATH];
    snprintf(p, sizeof p, "%s/config.json", dir);
    cm_status st = m ? cmi_hf_check_plain(m) : CM_OK;
    if (st == CM_OK) st = cm_write_file_atomic_(p, config_json, strlen(config_json));
    if (st == CM_OK && m) {
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
        if (unlink(p) != 0 && errno != ENOENT) st = cm_set_error(CM_ERR_IO, "cannot remove '%s': %s", p, strerror(errno));
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        if (st == CM_OK) st = cm_module_save_safetensors(cm_model_module(m), p);
    }
    for (int i = 0; st == CM_OK && i < n; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i].name);
        st = cm_write_file_atomic_(p, files[i].data, files[i].len);
    }
    return st;
}

static int64_t max_positions(const cm_model *m) {
    const cm_bert_config *b = cm_bert_model_config(m);
    const cm_gpt2_config *g = cm_gpt2_model_config(m);
    return b ? b->max_position_embeddings : g ? g->n_positions : -1;
}

cm_status cm_hf_save(cm_model *m, const cm_tokenizer *tok, const cm_hf_tokenizer_info *ti, const char *dir) {
    if (!m || !dir) return cm_set_error(CM_ERR_INVALID_ARG, "cm_hf_save: NULL argument");
    char *cfg = NULL;
    cm_hf_file *files = NULL;
    int n = 0;
    int64_t eos = tok ? cm_tokenizer_special(tok, CM_TOKEN_EOT) : -1;
    cm_status st = cm_hf_config_json(m, eos, &cfg);
    if (st == CM_OK && tok)
        st = cm_hf_tokenizer_files(tok, ti && ti->model_max_length > 0 ? ti->model_max_length : max_positions(m), &files,
                                   &n);
    if (st == CM_OK) st = cmi_hf_mkdirs(dir);
    if (st == CM_OK) st = cmi_hf_write(dir, cfg, m, files, n);
    cm_hf_files_free(files, n);
    cm_free(cfg);
    return st;
}
