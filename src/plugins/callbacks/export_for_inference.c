/* ExportForInferenceCallback (Composer's, save_format "c"): the weights as safetensors and a
 * standalone C program that runs the model's forward on them. */
#include "cb_impl.h"

#include <composer/safetensors.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

/* One layer of the exported program. */
typedef enum { L_LINEAR, L_ACT } layer_kind;

typedef struct layer {
    layer_kind kind;
    int act;                     /* cm_activation for L_ACT */
    int64_t in, out;             /* L_LINEAR */
    bool transposed;             /* weight stored (in, out) (GPT-2's Conv1D) */
    char wname[256], bname[256]; /* tensor names; bname "" = no bias */
    uint64_t wbegin, bbegin;     /* offsets in the data section */
} layer;

static const char *const k_act_c[] = {
    /* CM_ACT_RELU */ "v > 0.0 ? v : 0.0",
    /* GELU (erf) */ "0.5 * v * (1.0 + erf(v / sqrt(2.0)))",
    /* NewGELU */ "0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))",
    /* SiLU */ "v / (1.0 + exp(-v))",
    /* Tanh */ "tanh(v)",
    /* Sigmoid */ "1.0 / (1.0 + exp(-v))",
    /* Identity */ "v",
};
_Static_assert(sizeof k_act_c / sizeof *k_act_c == CM_ACT_IDENTITY + 1, "one formula per activation");

static const char *const k_act_types[] = {"ReLU", "GELU", "NewGELU", "SiLU", "Tanh", "Sigmoid", "Identity"};

/* The layers of a Sequential root, in order. */
static cm_status plan(cm_module *root, layer **out, int *n_out) {
    *out = NULL, *n_out = 0;
    if (strcmp(cm_module_type_name(root), "Sequential"))
        return cm_set_error(CM_ERR_UNSUPPORTED, "ExportForInference: the model's root is a %s; the C export runs a "
                                                "Sequential of Flatten, Linear, activations and Dropout (the zoo MLP)",
                            cm_module_type_name(root));
    const int n = cm_module_n_children(root);
    layer *ls = cm_alloc_zeroed(sizeof *ls * (size_t)(n ? n : 1), 16);
    if (!ls) return cm_set_error(CM_ERR_OOM, "ExportForInference: out of memory");
    int k = 0;
    for (int i = 0; i < n; i++) {
        cm_module *c = cm_module_child_at(root, i);
        const char *type = cm_module_type_name(c);
        if (!strcmp(type, "Flatten") || !strcmp(type, "Dropout")) continue; /* the input is flat; no dropout */
        if (cm_nn_is_linear(c)) {
            layer *l = &ls[k++];
            l->kind = L_LINEAR;
            cm_nn_linear_dims(c, &l->in, &l->out, &l->transposed);
            snprintf(l->wname, sizeof l->wname, "%s.weight", cm_module_name(c));
            if (cm_module_param(c, "bias")) snprintf(l->bname, sizeof l->bname, "%s.bias", cm_module_name(c));
            continue;
        }
        int act = -1;
        for (int a = 0; a <= CM_ACT_IDENTITY; a++)
            if (!strcmp(type, k_act_types[a])) act = a;
        if (act < 0) {
            cm_free(ls);
            return cm_set_error(CM_ERR_UNSUPPORTED, "ExportForInference: layer %d ('%s') is a %s, which the C export "
                                                    "cannot run (Flatten, Linear, activations and Dropout only)",
                                i, cm_module_name(c), type);
        }
        ls[k++] = (layer){.kind = L_ACT, .act = act};
    }
    if (!k || ls[0].kind != L_LINEAR) {
        cm_free(ls);
        return cm_set_error(CM_ERR_UNSUPPORTED, "ExportForInference: the model must start with a Linear layer");
    }
    for (int i = 1; i < k; i++)
        if (ls[i].kind == L_LINEAR) {
            int64_t prev = 0;
            for (int j = i - 1; j >= 0 && !prev; j--) prev = ls[j].kind == L_LINEAR ? ls[j].out : 0;
            if (prev != ls[i].in) {
                cm_free(ls);
                return cm_set_error(CM_ERR_SHAPE, "ExportForInference: a Linear of %lld inputs follows one of %lld outputs",
                                    (long long)ls[i].in, (long long)prev);
            }
        }
    *out = ls, *n_out = k;
    return CM_OK;
}

static cm_status write_program(const char *path, const layer *ls, int n, uint64_t header_len) {
    FILE *f = fopen(path, "w");
    if (!f) return cm_set_error(CM_ERR_IO, "ExportForInference: cannot write '%s': %s", path, strerror(errno));
    int64_t width = ls[0].in;
    for (int i = 0; i < n; i++)
        if (ls[i].kind == L_LINEAR && ls[i].out > width) width = ls[i].out;
    fprintf(f,
            "/* Inference for a model exported by Composer for C (ExportForInferenceCallback, save_format \"c\").\n"
            " *   cc -O2 -o infer infer.c -lm\n"
            " *   ./infer model.safetensors < input.txt\n"
            " * reads %lld numbers (the flattened input) from stdin and prints %lld logits, one a line.\n"
            " * The weights are read from the model.safetensors written with this program (F32, at the offsets\n"
            " * below; the header is %llu bytes). */\n"
            "#include <math.h>\n#include <stdint.h>\n#include <stdio.h>\n#include <stdlib.h>\n\n"
            "#define HEADER_LEN %lluull\n#define WIDTH %lld\n\n",
            (long long)ls[0].in, (long long)ls[n - 1].kind == L_LINEAR ? (long long)ls[n - 1].out : 0LL,
            (unsigned long long)header_len, (unsigned long long)header_len, (long long)width);
    fputs("static float *read_tensor(FILE *f, uint64_t begin, long long n, const char *name) {\n"
          "    float *p = malloc(sizeof(float) * (size_t)n);\n"
          "    if (!p || fseek(f, (long)(8 + HEADER_LEN + begin), SEEK_SET) != 0 ||\n"
          "        fread(p, sizeof(float), (size_t)n, f) != (size_t)n) {\n"
          "        fprintf(stderr, \"infer: cannot read tensor %s\\n\", name);\n"
          "        exit(1);\n"
          "    }\n"
          "    return p; /* little-endian F32, as safetensors stores it */\n"
          "}\n\n"
          "/* y (out) = x (in) . W^T + b, W (out, in) row-major; or W (in, out) when transposed */\n"
          "static void linear(const double *x, double *y, const float *w, const float *b, long long in, long long out,\n"
          "                   int transposed) {\n"
          "    for (long long o = 0; o < out; o++) {\n"
          "        double acc = b ? b[o] : 0.0;\n"
          "        for (long long i = 0; i < in; i++) acc += x[i] * (transposed ? w[i * out + o] : w[o * in + i]);\n"
          "        y[o] = (float)acc;\n"
          "    }\n"
          "}\n\n"
          "int main(int argc, char **argv) {\n"
          "    if (argc != 2) {\n"
          "        fprintf(stderr, \"usage: %s model.safetensors < input.txt\\n\", argv[0]);\n"
          "        return 2;\n"
          "    }\n"
          "    FILE *f = fopen(argv[1], \"rb\");\n"
          "    uint8_t hl[8];\n"
          "    if (!f || fread(hl, 1, 8, f) != 8) {\n"
          "        fprintf(stderr, \"infer: cannot read %s\\n\", argv[1]);\n"
          "        return 1;\n"
          "    }\n"
          "    uint64_t h = 0;\n"
          "    for (int i = 7; i >= 0; i--) h = h << 8 | hl[i];\n"
          "    if (h != HEADER_LEN) {\n"
          "        fprintf(stderr, \"infer: %s is not the weights file this program was exported with\\n\", argv[1]);\n"
          "        return 1;\n"
          "    }\n"
          "    static double a[WIDTH], b[WIDTH];\n",
          f);
    fprintf(f,
            "    for (long long i = 0; i < %lld; i++)\n"
            "        if (scanf(\"%%lf\", &a[i]) != 1) {\n"
            "            fprintf(stderr, \"infer: the input needs %lld numbers, got %%lld\\n\", i);\n"
            "            return 1;\n"
            "        }\n",
            (long long)ls[0].in, (long long)ls[0].in);
    fputs("    double *x = a, *y = b, *t;\n    long long n = 0;\n", f);
    for (int i = 0; i < n; i++) {
        const layer *l = &ls[i];
        if (l->kind == L_LINEAR) {
            fprintf(f, "    { /* %s */\n", l->wname);
            fprintf(f, "        float *w = read_tensor(f, %lluull, %lldll, \"%s\");\n", (unsigned long long)l->wbegin,
                    (long long)(l->in * l->out), l->wname);
            if (l->bname[0])
                fprintf(f, "        float *bias = read_tensor(f, %lluull, %lldll, \"%s\");\n",
                        (unsigned long long)l->bbegin, (long long)l->out, l->bname);
            else
                fputs("        float *bias = NULL;\n", f);
            fprintf(f, "        linear(x, y, w, bias, %lld, %lld, %d);\n", (long long)l->in, (long long)l->out,
                    l->transposed ? 1 : 0);
            fprintf(f, "        free(w), free(bias);\n        t = x, x = y, y = t, n = %lld;\n    }\n", (long long)l->out);
        } else {
            fprintf(f, "    for (long long i = 0; i < n; i++) { /* %s */\n        const double v = x[i];\n"
                       "        x[i] = (float)(%s);\n    }\n",
                    k_act_types[l->act], k_act_c[l->act]);
        }
    }
    fputs("    for (long long i = 0; i < n; i++) printf(\"%.9g\\n\", x[i]);\n    fclose(f);\n    return 0;\n}\n", f);
    const bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) return cm_set_error(CM_ERR_IO, "ExportForInference: writing '%s' failed", path);
    return CM_OK;
}

cm_status cm_export_for_inference(cm_model *model, const char *save_path) {
    if (!model || !save_path) return cm_set_error(CM_ERR_INVALID_ARG, "cm_export_for_inference: NULL argument");
    cm_module *root = cm_model_module(model);
    layer *ls;
    int n;
    cm_status s = plan(root, &ls, &n);
    if (s) return s;
    if (mkdir(save_path, 0755) != 0 && errno != EEXIST) {
        cm_free(ls);
        return cm_set_error(CM_ERR_IO, "ExportForInference: cannot create '%s': %s", save_path, strerror(errno));
    }
    char wpath[4200], cpath[4200];
    snprintf(wpath, sizeof wpath, "%s/model.safetensors", save_path);
    snprintf(cpath, sizeof cpath, "%s/infer.c", save_path);
    cm_safetensors *st = NULL;
    if (!(s = cm_module_save_safetensors(root, wpath)) && !(s = cm_safetensors_open(wpath, &st))) {
        for (int i = 0; !s && i < n; i++) {
            if (ls[i].kind != L_LINEAR) continue;
            const cm_st_tensor *w = cm_safetensors_find(st, ls[i].wname);
            const cm_st_tensor *b = ls[i].bname[0] ? cm_safetensors_find(st, ls[i].bname) : NULL;
            if (!w || w->dtype != CM_ST_DTYPE_F32 || w->numel != ls[i].in * ls[i].out || (ls[i].bname[0] && (!b || b->dtype != CM_ST_DTYPE_F32)))
                s = cm_set_error(CM_ERR_STATE, "ExportForInference: '%s' in %s is not the F32 tensor the program reads",
                                 ls[i].wname, wpath);
            else
                ls[i].wbegin = w->begin, ls[i].bbegin = b ? b->begin : 0;
        }
        if (!s) s = write_program(cpath, ls, n, cm_safetensors_header_len(st));
        cm_safetensors_close(st);
    }
    cm_free(ls);
    return s;
}

/* ---- the callback ---- */

typedef struct export_cb {
    char *path;
} export_cb;

cm_export_for_inference_config cm_export_for_inference_config_default(void) {
    return (cm_export_for_inference_config){"c", NULL};
}

static cm_status ex_run_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    export_cb *e = self;
    if (ev != CM_EVENT_FIT_END || cm_state_rank(st) != 0) return CM_OK;
    char path[2048];
    size_t k = 0;
    for (const char *p = e->path; *p && k + 1 < sizeof path; p++) {
        if (!strncmp(p, "{run_name}", 10)) k += (size_t)snprintf(path + k, sizeof path - k, "%s", cm_state_run_name(st)), p += 9;
        else path[k++] = *p;
        if (k >= sizeof path) k = sizeof path - 1;
    }
    path[k] = '\0';
    cm_status s = cm_export_for_inference(cm_state_model(st), path);
    if (!s) cm_log_msg(CM_LOG_INFO, "ExportForInference: wrote %s/model.safetensors and %s/infer.c", path, path);
    return s;
}

static void ex_free(void *self) {
    export_cb *e = self;
    cm_free(e->path);
    cm_free(e);
}

static const cm_callback_i export_vt = {
    .abi = CM_CALLBACK_ABI,
    .name = "ExportForInferenceCallback",
    .run_event = ex_run_event,
    .free = ex_free,
};

cm_status cm_export_for_inference_new(const cm_export_for_inference_config *cfg, cm_callback_plugin *out) {
    if (!cfg || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_export_for_inference_new: NULL argument");
    *out = (cm_callback_plugin){0};
    const char *fmt = cfg->save_format ? cfg->save_format : "c";
    if (!strcasecmp(fmt, "torchscript") || !strcasecmp(fmt, "onnx"))
        return cm_set_error(CM_ERR_UNSUPPORTED, "ExportForInference: save_format '%s' needs PyTorch; use \"c\" (the "
                                                "weights and a standalone C program)", fmt);
    if (strcasecmp(fmt, "c"))
        return cm_set_error(CM_ERR_INVALID_ARG, "ExportForInference: save_format '%s': use c", fmt);
    if (!cfg->save_path || !cfg->save_path[0])
        return cm_set_error(CM_ERR_INVALID_ARG, "ExportForInference: save_path is required (a folder)");
    export_cb *e = cm_alloc_zeroed(sizeof *e, 16);
    if (!e || !(e->path = cbi_strdup(cfg->save_path))) {
        cm_free(e);
        return cm_set_error(CM_ERR_OOM, "ExportForInference: out of memory");
    }
    *out = (cm_callback_plugin){&export_vt, e};
    return CM_OK;
}
