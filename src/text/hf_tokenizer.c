/* Hugging Face tokenizer folders (composer/hf.h): the slow tokenizers' files (vocab.txt;
 * vocab.json + merges.txt) or a fast tokenizer's tokenizer.json, with tokenizer_config.json and
 * special_tokens_map.json, read into our WordPiece / GPT-2 BPE tokenizers and written back as
 * save_pretrained writes the slow tokenizers. */
#include <composer/hf.h>

#include "base/json.h"
#include "text/text_impl.h"
#include "text/unicode.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_PATH 4096

static void join(char *buf, const char *dir, const char *name) { snprintf(buf, MAX_PATH, "%s/%s", dir, name); }

static bool exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* Parses the JSON file at path into *out, or leaves *out NULL when the file is absent. */
static cm_status read_json_opt(const char *path, cJSON **out) {
    *out = NULL;
    if (!exists(path)) return CM_OK;
    uint8_t *data;
    size_t len;
    cm_status st = cm_read_file_(path, "JSON file", &data, &len);
    if (st != CM_OK) return st;
    cJSON *j = cJSON_ParseWithLength((const char *)data, len);
    cm_free(data);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return cm_set_error(CM_ERR_FORMAT, "'%s' is not a JSON object; is it truncated?", path);
    }
    *out = j;
    return CM_OK;
}

/* A special token's text: "[CLS]" or transformers' AddedToken {"content": "[CLS]", ...}; NULL
 * for null or an absent key. */
static const char *special_text(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(c)) return c->valuestring;
    }
    return NULL;
}

/* tokenizer_config.json's keys for our specials, in cm_token_special order. */
static const char *const k_special_keys[CM_TOKEN_SPECIAL_COUNT] = {"eos_token", "cls_token", "sep_token",
                                                                   "pad_token", "unk_token", "mask_token"};
static const char *const k_special_defaults[CM_TOKEN_SPECIAL_COUNT] = {"<|endoftext|>", "[CLS]", "[SEP]",
                                                                       "[PAD]", "[UNK]", "[MASK]"};

typedef struct settings {
    int do_lower_case;        /* -1 unsaid */
    int strip_accents;        /* -1 unsaid (null: follows do_lower_case) */
    int64_t model_max_length; /* -1 unsaid */
    const char *names[CM_TOKEN_SPECIAL_COUNT]; /* NULL unsaid */
    const char *names_from[CM_TOKEN_SPECIAL_COUNT];
    char tokenizer_class[64];
} settings;

/* Reads tokenizer_config.json or special_tokens_map.json (path) into s. */
static cm_status read_settings(const cJSON *o, const char *path, settings *s) {
    for (const cJSON *e = o ? o->child : NULL; e; e = e->next) {
        const char *k = e->string;
        if (!strcmp(k, "do_lower_case")) {
            if (!cJSON_IsBool(e)) return cm_set_error(CM_ERR_FORMAT, "'%s': do_lower_case must be true or false", path);
            s->do_lower_case = cJSON_IsTrue(e);
        } else if (!strcmp(k, "strip_accents")) {
            if (!cJSON_IsNull(e) && !cJSON_IsBool(e))
                return cm_set_error(CM_ERR_FORMAT, "'%s': strip_accents must be null, true or false", path);
            s->strip_accents = cJSON_IsNull(e) ? -1 : cJSON_IsTrue(e);
        } else if (!strcmp(k, "model_max_length")) {
            if (!cJSON_IsNumber(e) || !(e->valuedouble >= 1))
                return cm_set_error(CM_ERR_FORMAT, "'%s': model_max_length must be a positive number", path);
            /* transformers writes int(1e30) for "no limit" */
            s->model_max_length = e->valuedouble > 1e18 ? -1 : (int64_t)e->valuedouble;
        } else if (!strcmp(k, "tokenize_chinese_chars")) {
            if (!cJSON_IsTrue(e))
                return cm_set_error(CM_ERR_UNSUPPORTED,
                                    "'%s': tokenize_chinese_chars false is not implemented (the WordPiece tokenizer "
                                    "always puts CJK ideographs in words of their own)",
                                    path);
        } else if (!strcmp(k, "add_prefix_space")) {
            if (!cJSON_IsFalse(e))
                return cm_set_error(CM_ERR_UNSUPPORTED,
                                    "'%s': add_prefix_space true is not implemented (GPT-2's byte-level BPE here "
                                    "encodes the text as given)",
                                    path);
        } else if (!strcmp(k, "tokenizer_class")) {
            if (cJSON_IsString(e)) snprintf(s->tokenizer_class, sizeof s->tokenizer_class, "%s", e->valuestring);
        } else {
            for (int i = 0; i < CM_TOKEN_SPECIAL_COUNT; i++) {
                if (strcmp(k, k_special_keys[i])) continue;
                const char *t = special_text(e);
                if (t) s->names[i] = t, s->names_from[i] = path;
            }
        }
    }
    return CM_OK;
}

/* Sets the tokenizer's special ids from the configured names (or the defaults, which may be absent
 * from the vocabulary). A configured name that the vocabulary lacks is an error. */
static cm_status apply_specials(cm_tokenizer *tok, const settings *s, const char *dir) {
    for (int i = 0; i < CM_TOKEN_SPECIAL_COUNT; i++) {
        if ((tok->type == CM_TOKENIZER_GPT2) != (i == CM_TOKEN_EOT)) continue;
        const char *name = s->names[i] ? s->names[i] : k_special_defaults[i];
        int32_t id = cm_strmap_get(&tok->vocab, name, strlen(name));
        if (id < 0 && s->names[i])
            return cm_set_error(CM_ERR_FORMAT,
                                "tokenizer in '%s': %s \"%s\" (from '%s') is not in the vocabulary (added tokens beyond "
                                "the vocabulary are not implemented)",
                                dir, k_special_keys[i], name, s->names_from[i]);
        tok->special[i] = id;
    }
    if (tok->type == CM_TOKENIZER_WORDPIECE && tok->special[CM_TOKEN_UNK] < 0)
        return cm_set_error(CM_ERR_FORMAT, "tokenizer in '%s': the WordPiece vocabulary has no unk_token", dir);
    return CM_OK;
}

/* ---- tokenizer.json ---- */

static const cJSON *item(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

static bool str_is(const cJSON *v, const char *want) { return cJSON_IsString(v) && !strcmp(v->valuestring, want); }

/* A WordPiece model: vocab (dense ids) -> vocab.txt text -> cm_wordpiece_from_memory_. */
static cm_status wordpiece_from_json(const cJSON *root, const char *path, settings *s, cm_tokenizer **out) {
    const cJSON *model = item(root, "model"), *vocab = item(model, "vocab");
    const cJSON *norm = item(root, "normalizer"), *pre = item(root, "pre_tokenizer");
    if (!str_is(item(model, "continuing_subword_prefix"), "##") && item(model, "continuing_subword_prefix"))
        return cm_set_error(CM_ERR_UNSUPPORTED, "tokenizer.json '%s': continuing_subword_prefix other than \"##\" is not "
                                                "implemented", path);
    const cJSON *mx = item(model, "max_input_chars_per_word");
    if (mx && !(cJSON_IsNumber(mx) && mx->valuedouble == 100))
        return cm_set_error(CM_ERR_UNSUPPORTED, "tokenizer.json '%s': max_input_chars_per_word other than 100 is not "
                                                "implemented", path);
    if (!cJSON_IsNull(norm) && norm) {
        if (!str_is(item(norm, "type"), "BertNormalizer"))
            return cm_set_error(CM_ERR_UNSUPPORTED,
                                "tokenizer.json '%s': normalizer type \"%s\" is not implemented (WordPiece takes "
                                "BertNormalizer)",
                                path, cJSON_IsString(item(norm, "type")) ? item(norm, "type")->valuestring : "?");
        if (cJSON_IsFalse(item(norm, "clean_text")) || cJSON_IsFalse(item(norm, "handle_chinese_chars")))
            return cm_set_error(CM_ERR_UNSUPPORTED, "tokenizer.json '%s': BertNormalizer with clean_text or "
                                                    "handle_chinese_chars false is not implemented", path);
        const cJSON *lc = item(norm, "lowercase"), *sa = item(norm, "strip_accents");
        if (s->do_lower_case < 0 && cJSON_IsBool(lc)) s->do_lower_case = cJSON_IsTrue(lc);
        if (s->strip_accents < 0 && cJSON_IsBool(sa)) s->strip_accents = cJSON_IsTrue(sa);
    }
    if (!str_is(item(pre, "type"), "BertPreTokenizer"))
        return cm_set_error(CM_ERR_UNSUPPORTED,
                            "tokenizer.json '%s': pre_tokenizer %s is not implemented (WordPiece takes BertPreTokenizer)",
                            path, cJSON_IsString(item(pre, "type")) ? item(pre, "type")->valuestring : "null");
    int n = cJSON_GetArraySize(vocab);
    if (!cJSON_IsObject(vocab) || n < 1)
        return cm_set_error(CM_ERR_FORMAT, "tokenizer.json '%s': model.vocab must be a non-empty object", path);
    const char **by_id = cm_alloc_zeroed(sizeof(char *) * (size_t)n, 16);
    if (!by_id) return CM_ERR_OOM;
    cm_status st = CM_OK;
    size_t total = 0;
    for (const cJSON *e = vocab->child; e && st == CM_OK; e = e->next) {
        double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (!(v >= 0 && v < n && v == (double)(int)v) || by_id[(int)v])
            st = cm_set_error(CM_ERR_FORMAT,
                              "tokenizer.json '%s': model.vocab[\"%.40s\"] is not a distinct id in [0, %d) (ids must "
                              "number the tokens 0..n-1)",
                              path, e->string, n);
        else if (!*e->string || strpbrk(e->string, "\r\n"))
            st = cm_set_error(CM_ERR_FORMAT, "tokenizer.json '%s': model.vocab has an empty token or one with a line break",
                              path);
        else by_id[(int)v] = e->string, total += strlen(e->string) + 1;
    }
    char *text = st == CM_OK ? cm_alloc(total + 1, 16) : NULL;
    if (st == CM_OK && !text) st = CM_ERR_OOM;
    if (st == CM_OK) {
        size_t k = 0;
        for (int i = 0; i < n; i++) {
            size_t l = strlen(by_id[i]);
            memcpy(text + k, by_id[i], l);
            text[k + l] = '\n';
            k += l + 1;
        }
        char what[MAX_PATH + 64];
        snprintf(what, sizeof what, "tokenizer.json '%s' model.vocab", path);
        st = cm_wordpiece_from_memory_((const uint8_t *)text, total, what, true, out);
    }
    const char *unk = cJSON_IsString(item(model, "unk_token")) ? item(model, "unk_token")->valuestring : NULL;
    if (st == CM_OK && unk && !s->names[CM_TOKEN_UNK]) s->names[CM_TOKEN_UNK] = unk, s->names_from[CM_TOKEN_UNK] = path;
    cm_free(text);
    cm_free(by_id);
    return st;
}

/* A byte-level BPE model: model.vocab is GPT-2's encoder, model.merges its vocab.bpe. */
static cm_status bpe_from_json(const cJSON *root, const char *path, cm_tokenizer **out) {
    const cJSON *model = item(root, "model"), *norm = item(root, "normalizer"), *pre = item(root, "pre_tokenizer");
    if (norm && !cJSON_IsNull(norm))
        return cm_set_error(CM_ERR_UNSUPPORTED, "tokenizer.json '%s': a normalizer with a BPE model is not implemented "
                                                "(GPT-2's byte-level BPE has none)", path);
    if (!str_is(item(pre, "type"), "ByteLevel"))
        return cm_set_error(CM_ERR_UNSUPPORTED,
                            "tokenizer.json '%s': pre_tokenizer %s is not implemented (BPE takes GPT-2's ByteLevel)", path,
                            cJSON_IsString(item(pre, "type")) ? item(pre, "type")->valuestring : "null");
    if (cJSON_IsTrue(item(pre, "add_prefix_space")) || cJSON_IsFalse(item(pre, "use_regex")))
        return cm_set_error(CM_ERR_UNSUPPORTED, "tokenizer.json '%s': ByteLevel with add_prefix_space true or use_regex "
                                                "false is not implemented", path);
    const cJSON *dr = item(model, "dropout");
    if ((dr && !cJSON_IsNull(dr)) || cJSON_IsTrue(item(model, "byte_fallback")) ||
        (cJSON_IsString(item(model, "continuing_subword_prefix")) && *item(model, "continuing_subword_prefix")->valuestring) ||
        (cJSON_IsString(item(model, "end_of_word_suffix")) && *item(model, "end_of_word_suffix")->valuestring))
        return cm_set_error(CM_ERR_UNSUPPORTED, "tokenizer.json '%s': BPE dropout, byte_fallback, a subword prefix or a "
                                                "word suffix is not implemented", path);
    const cJSON *merges = item(model, "merges");
    if (!cJSON_IsArray(merges))
        return cm_set_error(CM_ERR_FORMAT, "tokenizer.json '%s': model.merges must be an array", path);
    cm_buf text = {0};
    cm_status st = cm_buf_append(&text, "#version: 0.2\n", 14);
    int i = 0;
    for (const cJSON *m = merges->child; m && st == CM_OK; m = m->next, i++) {
        /* "a b" (tokenizers < 0.20) or ["a", "b"] */
        const char *a = NULL, *b = NULL;
        if (cJSON_IsString(m)) {
            a = m->valuestring;
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
                   cJSON_IsString(m->child->next)) {
            a = m->child->valuestring, b = m->child->next->valuestring;
        }
        if (!a || strpbrk(a, "\r\n") || (b && (strpbrk(b, " \r\n") || strchr(a, ' ')))) {
            st = cm_set_error(CM_ERR_FORMAT, "tokenizer.json '%s': model.merges[%d] is not \"a b\" or [\"a\", \"b\"]", path, i);
            break;
        }
        st = cm_buf_append(&text, a, strlen(a));
        if (b && st == CM_OK) st = cm_buf_append(&text, " ", 1);
        if (b && st == CM_OK) st = cm_buf_append(&text, b, strlen(b));
        if (st == CM_OK) st = cm_buf_append(&text, "\n", 1);
    }
    char w1[MAX_PATH + 64], w2[MAX_PATH + 64];
    snprintf(w1, sizeof w1, "tokenizer.json '%s' model.vocab", path);
    snprintf(w2, sizeof w2, "tokenizer.json '%s' model.merges (as lines)", path);
    if (st == CM_OK) st = cm_gpt2_from_memory_(item(model, "vocab"), w1, text.p, text.n, w2, out);
    cm_buf_deinit(&text);
    return st;
}

/* The tokenizer of a parsed tokenizer.json (root stays the caller's: s may point into it). */
static cm_status from_tokenizer_json(const cJSON *root, const char *path, settings *s, cm_tokenizer **out) {
    cm_status st;
    const cJSON *type = item(item(root, "model"), "type");
    if (str_is(type, "WordPiece")) {
        st = wordpiece_from_json(root, path, s, out);
    } else if (str_is(type, "BPE")) {
        st = bpe_from_json(root, path, out);
    } else {
        st = cm_set_error(CM_ERR_UNSUPPORTED,
                          "tokenizer.json '%s': model type \"%s\" is not implemented (WordPiece and GPT-2's byte-level "
                          "BPE are)",
                          path, cJSON_IsString(type) ? type->valuestring : "(none)");
    }
    /* added tokens must be the vocabulary's own: ids beyond it would need embedding rows we lack */
    const cJSON *added = item(root, "added_tokens");
    for (const cJSON *a = cJSON_IsArray(added) ? added->child : NULL; a && st == CM_OK; a = a->next) {
        const cJSON *id = item(a, "id"), *content = item(a, "content");
        if (!cJSON_IsNumber(id) || !cJSON_IsString(content)) continue;
        int32_t have = cm_strmap_get(&(*out)->vocab, content->valuestring, strlen(content->valuestring));
        int64_t want;
        if (!cmi_json_whole(id, 0, INT32_MAX, &want) || have != (int32_t)want)
            st = cm_set_error(CM_ERR_UNSUPPORTED,
                              "tokenizer.json '%s': added token \"%.40s\" (id %.15g) is not that entry of the model's "
                              "vocabulary (added tokens beyond the vocabulary are not implemented)",
                              path, content->valuestring, id->valuedouble);
    }
    if (st != CM_OK) {
        cm_tokenizer_free(*out);
        *out = NULL;
    }
    return st;
}

cm_status cmi_hf_tokenizer_from_json_text(const char *text, size_t len, const char *label, cm_tokenizer **out) {
    *out = NULL;
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return cm_set_error(CM_ERR_FORMAT, "'%s' is not a JSON object; is it truncated?", label);
    }
    settings s;
    memset(&s, 0, sizeof s);
    s.do_lower_case = s.strip_accents = -1;
    s.model_max_length = -1;
    cm_status st = from_tokenizer_json(root, label, &s, out);
    if (st == CM_OK && (*out)->type == CM_TOKENIZER_WORDPIECE) (*out)->lowercase = s.do_lower_case != 0;
    if (st == CM_OK && (st = apply_specials(*out, &s, label)) != CM_OK) {
        cm_tokenizer_free(*out);
        *out = NULL;
    }
    cJSON_Delete(root);
    return st;
}

cm_status cm_hf_tokenizer_load(const char *dir, cm_tokenizer **out, cm_hf_tokenizer_info *info) {
    if (!dir || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_hf_tokenizer_load: NULL argument");
    *out = NULL;
    settings s;
    memset(&s, 0, sizeof s);
    s.do_lower_case = s.strip_accents = -1;
    s.model_max_length = -1;
    char p_cfg[MAX_PATH], p_map[MAX_PATH], p_vocab[MAX_PATH], p_json[MAX_PATH], p_merges[MAX_PATH], p_tok[MAX_PATH];
    join(p_cfg, dir, "tokenizer_config.json");
    join(p_map, dir, "special_tokens_map.json");
    join(p_vocab, dir, "vocab.txt");
    join(p_json, dir, "vocab.json");
    join(p_merges, dir, "merges.txt");
    join(p_tok, dir, "tokenizer.json");
    cJSON *cfg = NULL, *map = NULL, *tj = NULL;
    cm_status st = read_json_opt(p_cfg, &cfg);
    if (st == CM_OK) st = read_json_opt(p_map, &map);
    if (st == CM_OK) st = read_settings(cfg, p_cfg, &s);
    if (st == CM_OK) st = read_settings(map, p_map, &s);
    cm_tokenizer *tok = NULL;
    if (st != CM_OK) {
        /* the settings are checked first */
    } else if (exists(p_vocab)) {
        st = cm_tokenizer_wordpiece_new(p_vocab, s.do_lower_case != 0, &tok);
    } else if (exists(p_json) && exists(p_merges)) {
        st = cm_tokenizer_gpt2_new(p_json, p_merges, &tok);
    } else if (exists(p_tok)) {
        st = read_json_opt(p_tok, &tj);
        if (st == CM_OK) st = from_tokenizer_json(tj, p_tok, &s, &tok);
        if (st == CM_OK && tok->type == CM_TOKENIZER_WORDPIECE) tok->lowercase = s.do_lower_case != 0;
    } else {
        st = cm_set_error(CM_ERR_NOT_FOUND,
                          "'%s' has no tokenizer: none of vocab.txt (WordPiece), vocab.json + merges.txt (GPT-2 BPE) "
                          "or tokenizer.json%s",
                          dir, exists(p_json) != exists(p_merges) ? " (one of vocab.json and merges.txt is missing)" : "");
    }
    if (st == CM_OK && tok->type == CM_TOKENIZER_WORDPIECE && s.strip_accents >= 0 &&
        s.strip_accents != (int)tok->lowercase)
        st = cm_set_error(CM_ERR_UNSUPPORTED,
                          "tokenizer in '%s': strip_accents %s with do_lower_case %s is not implemented (accents are "
                          "stripped exactly when lower-casing, as BERT's uncased and cased models do)",
                          dir, s.strip_accents ? "true" : "false", tok->lowercase ? "true" : "false");
    if (st == CM_OK) st = apply_specials(tok, &s, dir);
    if (st == CM_OK && info) {
        memset(info, 0, sizeof *info);
        snprintf(info->tokenizer_class, sizeof info->tokenizer_class, "%s", s.tokenizer_class);
        info->model_max_length = s.model_max_length;
        info->do_lower_case = tok->type == CM_TOKENIZER_WORDPIECE && tok->lowercase;
    }
    cJSON_Delete(cfg);
    cJSON_Delete(map);
    cJSON_Delete(tj);
    if (st != CM_OK) {
        cm_tokenizer_free(tok);
        return st;
    }
    *out = tok;
    return CM_OK;
}

/* ---- writing ---- */

void cm_hf_files_free(cm_hf_file *files, int n) {
    if (!files) return;
    for (int i = 0; i < n; i++) cm_free(files[i].data);
    cm_free(files);
}

/* Moves the text of a cJSON value (printed) into file f; frees j. */
static cm_status json_file(cm_hf_file *f, const char *name, cJSON *j) {
    char *s = j ? cJSON_Print(j) : NULL;
    cJSON_Delete(j);
    if (!s) return cm_set_error(CM_ERR_OOM, "tokenizer files: out of memory");
    size_t n = strlen(s);
    f->data = cm_alloc(n + 2, 16);
    if (!f->data) {
        cJSON_free(s);
        return CM_ERR_OOM;
    }
    memcpy(f->data, s, n);
    f->data[n] = '\n';
    f->data[n + 1] = '\0';
    f->len = n + 1;
    cJSON_free(s);
    snprintf(f->name, sizeof f->name, "%s", name);
    return CM_OK;
}

static cm_status buf_file(cm_hf_file *f, const char *name, cm_buf *b) {
    cm_status st = cm_buf_append(b, "", 1);
    if (st != CM_OK) return st;
    f->data = (char *)b->p;
    f->len = b->n - 1;
    b->p = NULL, b->n = b->cap = 0;
    snprintf(f->name, sizeof f->name, "%s", name);
    return CM_OK;
}

/* The token text of special `which` (a new string in *out, or NULL when the tokenizer has none). */
static char *special_name(const cm_tokenizer *tok, cm_token_special which) {
    int32_t id = tok->special[which];
    if (id < 0) return NULL;
    size_t n = tok->tok_len[id];
    char *s = cm_alloc(n + 1, 8);
    if (!s) return NULL;
    memcpy(s, tok->tok_bytes.p + tok->tok_start[id], n);
    s[n] = '\0';
    return s;
}

/* tokenizer_config.json and special_tokens_map.json with the given (key, special) pairs. */
static cm_status config_files(const cm_tokenizer *tok, int64_t max_len, const char *cls_name, const char *const *keys,
                              const cm_token_special *which, int n, cm_hf_file *cfg_file, cm_hf_file *map_file) {
    cJSON *cfg = cJSON_CreateObject(), *map = cJSON_CreateObject();
    bool ok = cfg && map;
    for (int i = 0; ok && i < n; i++) {
        char *name = special_name(tok, which[i]);
        if (!name) continue;
        ok = cJSON_AddStringToObject(cfg, keys[i], name) && cJSON_AddStringToObject(map, keys[i], name);
        cm_free(name);
    }
    ok = ok && cJSON_AddBoolToObject(cfg, "clean_up_tokenization_spaces", true) &&
         cJSON_AddNumberToObject(cfg, "model_max_length", max_len > 0 ? (double)max_len : 1e30) &&
         cJSON_AddStringToObject(cfg, "tokenizer_class", cls_name);
    if (ok && tok->type == CM_TOKENIZER_WORDPIECE)
        ok = cJSON_AddBoolToObject(cfg, "do_lower_case", tok->lowercase) && cJSON_AddNullToObject(cfg, "strip_accents") &&
             cJSON_AddBoolToObject(cfg, "tokenize_chinese_chars", true);
    if (ok && tok->type == CM_TOKENIZER_GPT2) ok = cJSON_AddBoolToObject(cfg, "add_prefix_space", false) != NULL;
    if (!ok) {
        cJSON_Delete(cfg);
        cJSON_Delete(map);
        return cm_set_error(CM_ERR_OOM, "tokenizer files: out of memory");
    }
    cm_status st = json_file(cfg_file, "tokenizer_config.json", cfg);
    if (st == CM_OK) st = json_file(map_file, "special_tokens_map.json", map);
    else cJSON_Delete(map);
    return st;
}

static cm_status wordpiece_files(const cm_tokenizer *tok, int64_t max_len, cm_hf_file *f) {
    cm_buf b = {0};
    cm_status st = CM_OK;
    for (int64_t i = 0; i < tok->vocab_size && st == CM_OK; i++) {
        st = cm_buf_append(&b, tok->tok_bytes.p + tok->tok_start[i], tok->tok_len[i]);
        if (st == CM_OK) st = cm_buf_append(&b, "\n", 1);
    }
    if (st == CM_OK) st = buf_file(&f[0], "vocab.txt", &b);
    cm_buf_deinit(&b);
    static const char *const keys[5] = {"cls_token", "mask_token", "pad_token", "sep_token", "unk_token"};
    static const cm_token_special which[5] = {CM_TOKEN_CLS, CM_TOKEN_MASK, CM_TOKEN_PAD, CM_TOKEN_SEP, CM_TOKEN_UNK};
    if (st == CM_OK) st = config_files(tok, max_len, "BertTokenizer", keys, which, 5, &f[1], &f[2]);
    return st;
}

/* The byte-alphabet spelling of token id into b. */
static cm_status spell(const cm_tokenizer *tok, const uint32_t byte_to_cp[256], int32_t id, cm_buf *b) {
    const uint8_t *p = tok->tok_bytes.p + tok->tok_start[id];
    for (uint32_t k = 0; k < tok->tok_len[id]; k++) {
        uint8_t u[4];
        int l = cm_utf8_encode(byte_to_cp[p[k]], u);
        cm_status st = cm_buf_append(b, u, (size_t)l);
        if (st != CM_OK) return st;
    }
    return CM_OK;
}

static cm_status gpt2_files(const cm_tokenizer *tok, int64_t max_len, cm_hf_file *f) {
    uint32_t byte_to_cp[256];
    cm_gpt2_byte_alphabet_(byte_to_cp);
    cm_status st = CM_OK;
    /* vocab.json: every token spelled in the byte alphabet (the special token as itself) */
    cJSON *enc = cJSON_CreateObject();
    cm_buf name = {0};
    if (!enc) st = CM_ERR_OOM;
    for (int32_t id = 0; st == CM_OK && id < tok->vocab_size; id++) {
        if (tok->tok_len[id] == 0) continue; /* a gap in the ids */
        name.n = 0;
        if (id == tok->special[CM_TOKEN_EOT]) st = cm_buf_append(&name, tok->tok_bytes.p + tok->tok_start[id], tok->tok_len[id]);
        else st = spell(tok, byte_to_cp, id, &name);
        if (st == CM_OK) st = cm_buf_append(&name, "", 1);
        if (st == CM_OK && !cJSON_AddNumberToObject(enc, (const char *)name.p, id)) st = CM_ERR_OOM;
    }
    cm_buf_deinit(&name);
    if (st == CM_OK) st = json_file(&f[0], "vocab.json", enc);
    else cJSON_Delete(enc);
    /* merges.txt: the merges in rank order */
    int64_t n_merges = (int64_t)tok->merges.count;
    const cm_pairmap_slot **by_rank = st == CM_OK ? cm_alloc_zeroed(sizeof(void *) * (size_t)(n_merges + 1), 16) : NULL;
    if (st == CM_OK && !by_rank) st = CM_ERR_OOM;
    for (size_t i = 0; st == CM_OK && i < tok->merges.cap; i++) {
        const cm_pairmap_slot *sl = &tok->merges.slots[i];
        if (sl->key == UINT64_MAX) continue;
        if (sl->a < 0 || sl->a >= n_merges || by_rank[sl->a])
            st = cm_set_error(CM_ERR_INTERNAL, "GPT-2 merges: rank %d is not a distinct rank below %lld", sl->a,
                              (long long)n_merges);
        else by_rank[sl->a] = sl;
    }
    cm_buf b = {0};
    if (st == CM_OK) st = cm_buf_append(&b, "#version: 0.2\n", 14);
    for (int64_t r = 0; st == CM_OK && r < n_merges; r++) {
        st = spell(tok, byte_to_cp, (int32_t)(by_rank[r]->key >> 32), &b);
        if (st == CM_OK) st = cm_buf_append(&b, " ", 1);
        if (st == CM_OK) st = spell(tok, byte_to_cp, (int32_t)(uint32_t)by_rank[r]->key, &b);
        if (st == CM_OK) st = cm_buf_append(&b, "\n", 1);
    }
    if (st == CM_OK) st = buf_file(&f[1], "merges.txt", &b);
    cm_buf_deinit(&b);
    cm_free(by_rank);
    static const char *const keys[3] = {"bos_token", "eos_token", "unk_token"};
    static const cm_token_special which[3] = {CM_TOKEN_EOT, CM_TOKEN_EOT, CM_TOKEN_EOT};
    if (st == CM_OK) st = config_files(tok, max_len, "GPT2Tokenizer", keys, which, 3, &f[2], &f[3]);
    return st;
}

cm_status cm_hf_tokenizer_files(const cm_tokenizer *tok, int64_t model_max_length, cm_hf_file **files, int *n) {
    if (!tok || !files || !n) return cm_set_error(CM_ERR_INVALID_ARG, "cm_hf_tokenizer_files: NULL argument");
    *files = NULL;
    *n = 0;
    if (tok->type == CM_TOKENIZER_CHAR)
        return cm_set_error(CM_ERR_UNSUPPORTED, "a character-level tokenizer has no Hugging Face form (use a WordPiece "
                                                "vocab.txt or GPT-2's vocab.json + merges.txt)");
    const int count = tok->type == CM_TOKENIZER_WORDPIECE ? 3 : 4;
    cm_hf_file *f = cm_alloc_zeroed(sizeof *f * (size_t)count, 16);
    if (!f) return CM_ERR_OOM;
    cm_status st = tok->type == CM_TOKENIZER_WORDPIECE ? wordpiece_files(tok, model_max_length, f)
                                                       : gpt2_files(tok, model_max_length, f);
    if (st != CM_OK) {
        cm_hf_files_free(f, count);
        return st;
    }
    *files = f;
    *n = count;
    return CM_OK;
}

cm_status cm_hf_tokenizer_save(const cm_tokenizer *tok, int64_t model_max_length, const char *dir) {
    if (!dir) return cm_set_error(CM_ERR_INVALID_ARG, "cm_hf_tokenizer_save: dir is NULL");
    cm_hf_file *f;
    int n;
    cm_status st = cm_hf_tokenizer_files(tok, model_max_length, &f, &n);
    for (int i = 0; st == CM_OK && i < n; i++) {
        char p[MAX_PATH];
        join(p, dir, f[i].name);
        st = cm_write_file_atomic_(p, f[i].data, f[i].len);
    }
    cm_hf_files_free(f, n);
    return st;
}
