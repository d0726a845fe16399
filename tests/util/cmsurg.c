#include "cmsurg.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

static const char *const k_names[CMT_FAMILY_COUNT] = {"mlp",  "cnn",  "resnet",   "resnet-imagenet",
                                                       "gpt2", "bert", "groupnorm"};
const char *cmt_family_name(cmt_family f) { return (unsigned)f < CMT_FAMILY_COUNT ? k_names[f] : "?"; }

/* ---- datasets: every sample a pure function of its index ---- */

typedef struct {
    int kind; /* 0 vectors, 1 images, 2 tokens (gpt2), 3 tokens + label (bert) */
    int64_t n;
    int d, c, h, w, T, vocab, classes;
    cm_field_desc f[2];
} sds;

static int64_t d_len(void *self) { return ((sds *)self)->n; }
static int d_nf(void *self) { return 2; }
static const cm_field_desc *d_field(void *self, int i) { return &((sds *)self)->f[i]; }
static cm_status d_get(void *self, int64_t i, const cm_sample_ctx *ctx, void *const *out) {
    sds *s = self;
    cm_rng r = cm_rng_init(4242, (uint64_t)i);
    if (s->kind <= 1) {
        const int n = s->kind ? s->c * s->h * s->w : s->d;
        float *x = out[0];
        cm_rng_normal(&r, x, (size_t)n, 0, 1);
        double acc = 0;
        for (int k = 0; k < n; k += 3) acc += x[k];
        *(int64_t *)out[1] = (int64_t)(acc > 0.5 ? 2 : acc > -0.5 ? 1 : 0) % s->classes;
        return CM_OK;
    }
    int64_t *ids = out[0];
    cm_rng_randint(&r, ids, (size_t)s->T, 0, s->vocab);
    if (s->kind == 2) {
        int64_t *lab = out[1];
        for (int t = 0; t < s->T; t++) lab[t] = (ids[t] * 7 + 3) % s->vocab; /* a learnable next "token" */
    } else {
        *(int64_t *)out[1] = ids[0] % 2;
    }
    return CM_OK;
}
static void d_close(void *self) { free(self); }
static const cm_dataset_i k_ds_vt = {CM_DATASET_ABI, "synthetic", d_len, d_nf, d_field, d_get, NULL, d_close};

static cm_dataset *dataset(sds proto) {
    sds *s = malloc(sizeof *s);
    *s = proto;
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_new(&k_ds_vt, s, &ds), CM_OK, "%s", cm_last_error());
    return ds;
}

/* ---- models ---- */

static cm_model *gn_model(uint64_t seed) {
    cm_rng rng = cm_rng_init(seed, 0);
    cm_module *seq, *m;
    cr_assert_eq(cm_nn_sequential_new(&seq), CM_OK);
    cm_nn_conv2d_config cc = cm_nn_conv2d_config_default(1, 8, 3, 3);
    cc.opts.padding[0] = cc.opts.padding[1] = 1;
    cr_assert_eq(cm_nn_conv2d_new(&cc, &rng, &m), CM_OK);
    cm_nn_sequential_append(seq, m);
    cr_assert_eq(cm_nn_group_norm_new(2, 8, 1e-5f, true, &m), CM_OK);
    cm_nn_sequential_append(seq, m);
    cr_assert_eq(cm_nn_activation_new(CM_ACT_RELU, &m), CM_OK);
    cm_nn_sequential_append(seq, m);
    cr_assert_eq(cm_nn_adaptive_avg_pool2d_new(1, 1, false, &m), CM_OK);
    cm_nn_sequential_append(seq, m);
    cr_assert_eq(cm_nn_flatten_new(1, &m), CM_OK);
    cm_nn_sequential_append(seq, m);
    cr_assert_eq(cm_nn_linear_new(8, 3, true, &rng, &m), CM_OK);
    cm_nn_sequential_append(seq, m);
    cm_classifier_config cc2 = cm_classifier_config_default();
    cc2.input_field = "image";
    cm_model *model;
    cr_assert_eq(cm_model_classifier_new(seq, &cc2, &model), CM_OK, "%s", cm_last_error());
    return model;
}

cmt_srig cmt_srig_new(cmt_family f, uint64_t seed) {
    cmt_srig r = {f, NULL, NULL, NULL};
    const int64_t n = 32;
    switch (f) {
    case CMT_MLP: {
        cm_rng rng = cm_rng_init(seed, 0);
        cm_module *seq, *m;
        cr_assert_eq(cm_nn_sequential_new(&seq), CM_OK);
        cr_assert_eq(cm_nn_linear_new(8, 16, true, &rng, &m), CM_OK);
        cm_nn_sequential_append(seq, m);
        cr_assert_eq(cm_nn_activation_new(CM_ACT_RELU, &m), CM_OK);
        cm_nn_sequential_append(seq, m);
        cr_assert_eq(cm_nn_dropout_new(0.2f, &m), CM_OK);
        cm_nn_sequential_append(seq, m);
        cr_assert_eq(cm_nn_linear_new(16, 3, true, &rng, &m), CM_OK);
        cm_nn_sequential_append(seq, m);
        cr_assert_eq(cm_model_classifier_new(seq, NULL, &r.model), CM_OK, "%s", cm_last_error());
        r.ds = dataset((sds){0, n, 8, 0, 0, 0, 0, 0, 3, {{"input", CM_DTYPE_F32, 1, {8}}, {"label", CM_DTYPE_I64, 0, {0}}}});
        break;
    }
    case CMT_CNN: {
        cm_cnn_config c = cm_cnn_config_default();
        c.image_h = c.image_w = 8, c.channels[0] = 4, c.channels[1] = 8, c.hidden = 16, c.num_classes = 3;
        c.seed = seed;
        cr_assert_eq(cm_cnn_model_new(&c, &r.model), CM_OK, "%s", cm_last_error());
        r.ds = dataset((sds){1, n, 0, 1, 8, 8, 0, 0, 3, {{"image", CM_DTYPE_F32, 3, {1, 8, 8}}, {"label", CM_DTYPE_I64, 0, {0}}}});
        break;
    }
    case CMT_RESNET:
    case CMT_RESNET_IMNET: {
        cm_resnet_config c;
        const bool im = f == CMT_RESNET_IMNET;
        cr_assert_eq(cm_resnet_config_preset(im ? "resnet50" : "resnet20", &c), CM_OK);
        c.n_stages = im ? 2 : 3;
        c.layers[0] = c.layers[1] = c.layers[2] = 1;
        c.widths[0] = 4, c.widths[1] = 8, c.widths[2] = 16;
        c.shortcut = CM_RESNET_SHORTCUT_B;
        c.num_classes = 3;
        c.channels_last = false;
        c.seed = seed;
        cr_assert_eq(cm_resnet_model_new(&c, &r.model), CM_OK, "%s", cm_last_error());
        const int hw = im ? 16 : 8;
        r.ds = dataset((sds){1, n, 0, 3, hw, hw, 0, 0, 3,
                             {{"image", CM_DTYPE_F32, 3, {3, hw, hw}}, {"label", CM_DTYPE_I64, 0, {0}}}});
        break;
    }
    case CMT_GPT2: {
        cm_gpt2_config c;
        cr_assert_eq(cm_gpt2_config_preset("tiny", &c), CM_OK);
        c.embd_pdrop = c.attn_pdrop = c.resid_pdrop = 0.1f;
        cm_rng rng = cm_rng_init(seed, 0);
        cr_assert_eq(cm_gpt2_new(&c, &rng, &r.model), CM_OK, "%s", cm_last_error());
        r.ds = dataset((sds){2, n, 0, 0, 0, 0, 8, (int)c.vocab_size, 0,
                             {{"input_ids", CM_DTYPE_I64, 1, {8}}, {"labels", CM_DTYPE_I64, 1, {8}}}});
        break;
    }
    case CMT_BERT: {
        cm_bert_config c;
        cr_assert_eq(cm_bert_config_preset("test-tiny", &c), CM_OK, "%s", cm_last_error());
        c.num_labels = 2;
        cm_rng rng = cm_rng_init(seed, 0);
        cr_assert_eq(cm_bert_classifier_new(&c, &rng, &r.model), CM_OK, "%s", cm_last_error());
        r.ds = dataset((sds){3, n, 0, 0, 0, 0, 8, (int)c.vocab_size, 2,
                             {{"input_ids", CM_DTYPE_I64, 1, {8}}, {"label", CM_DTYPE_I64, 0, {0}}}});
        break;
    }
    case CMT_GROUPNORM:
        r.model = gn_model(seed);
        r.ds = dataset((sds){1, n, 0, 1, 8, 8, 0, 0, 3, {{"image", CM_DTYPE_F32, 3, {1, 8, 8}}, {"label", CM_DTYPE_I64, 0, {0}}}});
        break;
    default: cr_assert_fail("family %d", (int)f);
    }
    cm_dataloader_config lc = cm_dataloader_config_default();
    lc.batch_size = 8;
    lc.seed = 7;
    cr_assert_eq(cm_dataloader_new(r.ds, &lc, &r.dl), CM_OK, "%s", cm_last_error());
    return r;
}

void cmt_srig_free(cmt_srig *r) {
    cm_dataloader_free(r->dl);
    cm_dataset_free(r->ds);
    cm_model_free(r->model);
    memset(r, 0, sizeof *r);
}

cmt_srun cmt_srun_default(void) {
    cmt_srun o;
    memset(&o, 0, sizeof o);
    o.max_duration = "3ba";
    o.precision = CM_PRECISION_FP32;
    return o;
}

cm_trainer *cmt_strainer(cmt_srig *rig, cm_algorithm_plugin *algs, int n, const cmt_srun *o, cm_optim **opt,
                        cm_status *status) {
    cm_trainer_config c = cm_trainer_config_default();
    c.model = rig->model;
    c.train_dataloader = rig->dl;
    cr_assert_eq(cm_time_parse(o->max_duration, &c.max_duration), CM_OK);
    c.precision = o->precision;
    c.device_train_microbatch_size = o->microbatch;
    c.algorithms = algs, c.n_algorithms = n;
    c.seed = 17;
    c.save_folder = o->save_folder;
    c.save_filename = "ba{batch}";
    c.save_interval_str = "1ba";
    c.load_path = o->load_path;
    c.load_exclude_algorithms = o->exclude, c.n_load_exclude_algorithms = o->n_exclude;
    c.load_weights_only = o->weights_only;
    c.handle_signals = false;
    c.run_name = "surgery-test";
    *opt = NULL;
    cm_status s = CM_OK;
    if (o->own_optimizer) {
        if (o->prepare) s = cm_trainer_prepare_model(&c);
        cm_module *root = cm_model_module(rig->model);
        const int nu = cm_module_n_units(root);
        cm_optim_span sp[64];
        cr_assert(nu <= 64);
        for (int i = 0; i < nu; i++) {
            const cm_unit_info *u = cm_module_unit(root, i);
            sp[i] = (cm_optim_span){u->name, u->params, u->grads, u->numel};
        }
        cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_DECOUPLED_ADAMW);
        hp.lr = 1e-2;
        cr_assert_eq(cm_optim_new(CM_OPTIM_DECOUPLED_ADAMW, opt), CM_OK);
        cr_assert_eq(cm_optim_add_group(*opt, &hp, sp, nu), CM_OK, "%s", cm_last_error());
        c.optimizer = *opt;
    }
    cm_trainer *tr = NULL;
    if (!s) s = cm_trainer_new(&c, &tr);
    if (status) *status = s;
    return s ? NULL : tr;
}

/* ---- checkpoints ---- */

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    cr_assert(fread(b, 1, (size_t)n, f) == (size_t)n);
    b[n] = '\0';
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void same_file(const char *a, const char *b, const char *name, const char *label) {
    char pa[1024], pb[1024];
    snprintf(pa, sizeof pa, "%s/%s", a, name);
    snprintf(pb, sizeof pb, "%s/%s", b, name);
    size_t la, lb;
    char *da = slurp(pa, &la), *db = slurp(pb, &lb);
    cr_assert(da && db, "%s: %s missing in %s or %s", label, name, a, b);
    size_t first = 0;
    while (first < la && first < lb && da[first] == db[first]) first++;
    cr_assert(la == lb && first == la, "%s: %s differs (sizes %zu and %zu, first difference at byte %zu)", label, name,
              la, lb, first);
    free(da);
    free(db);
}

static cJSON *manifest(const char *dir) {
    char p[1024];
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    size_t n;
    char *t = slurp(p, &n);
    cr_assert(t, "no manifest in %s", dir);
    char *key = strstr(t, "\"manifest_xxh3\"");
    cr_assert(key, "no manifest checksum in %s", dir);
    char *end = key;
    while (end > t && *end != ',') end--;
    strcpy(end, "}");
    cJSON *j = cJSON_Parse(t);
    free(t);
    cr_assert(j, "manifest of %s does not parse", dir);
    return j;
}

static void same_json(cJSON *a, cJSON *b, const char *key, const char *label) {
    cJSON *x = cJSON_GetObjectItemCaseSensitive(a, key), *y = cJSON_GetObjectItemCaseSensitive(b, key);
    char *sx = cJSON_PrintUnformatted(x), *sy = cJSON_PrintUnformatted(y);
    cr_assert(sx && sy && !strcmp(sx, sy), "%s: manifest %s differs:\n%s\n%s", label, key, sx ? sx : "(none)",
              sy ? sy : "(none)");
    cJSON_free(sx);
    cJSON_free(sy);
}

void cmt_assert_ckpts_equal(const char *a, const char *b, const char *label) {
    same_file(a, b, "model.safetensors", label);
    same_file(a, b, "optimizer.safetensors", label);
    cJSON *ma = manifest(a), *mb = manifest(b);
    static const char *const wct[] = {"total_wct", "epoch_wct", "batch_wct", "iteration_wct"};
    for (int k = 0; k < 4; k++) {
        cJSON_DeleteItemFromObject(cJSON_GetObjectItemCaseSensitive(ma, "timestamp"), wct[k]);
        cJSON_DeleteItemFromObject(cJSON_GetObjectItemCaseSensitive(mb, "timestamp"), wct[k]);
    }
    same_json(ma, mb, "rng", label);
    same_json(ma, mb, "timestamp", label);
    same_json(ma, mb, "algorithms", label);
    same_json(ma, mb, "dataloaders", label);
    cJSON_Delete(ma);
    cJSON_Delete(mb);
}

void cmt_assert_weights_differ(const char *a, const char *b, const char *label) {
    char pa[1024], pb[1024];
    snprintf(pa, sizeof pa, "%s/model.safetensors", a);
    snprintf(pb, sizeof pb, "%s/model.safetensors", b);
    size_t la, lb;
    char *da = slurp(pa, &la), *db = slurp(pb, &lb);
    cr_assert(da && db);
    cr_assert(la != lb || memcmp(da, db, la), "%s: the weights of %s and %s are the same (nothing trained?)", label, a, b);
    free(da);
    free(db);
}

char *cmt_temp_dir(void) {
    /* tmpfs when there is one: checkpoints fsync every file */
    struct stat st;
    char *t = strdup(!stat("/dev/shm", &st) && S_ISDIR(st.st_mode) && !access("/dev/shm", W_OK)
                         ? "/dev/shm/cm-surgery-XXXXXX"
                         : "/tmp/cm-surgery-XXXXXX");
    cr_assert(mkdtemp(t), "mkdtemp");
    return t;
}

void cmt_rm_rf(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char p[1024];
            snprintf(p, sizeof p, "%s/%s", path, e->d_name);
            struct stat st;
            if (!lstat(p, &st) && S_ISDIR(st.st_mode))
                cmt_rm_rf(p);
            else
                unlink(p);
        }
        closedir(d);
    }
    rmdir(path);
}

/* ---- capturing stderr ---- */

static int g_saved_fd = -1;
static char g_cap_path[64];
static char *g_cap_text;

void cmt_log_capture_start(void) {
    fflush(stderr);
    snprintf(g_cap_path, sizeof g_cap_path, "/tmp/cm-log-XXXXXX");
    int fd = mkstemp(g_cap_path);
    cr_assert(fd >= 0);
    g_saved_fd = dup(2);
    dup2(fd, 2);
    close(fd);
}

const char *cmt_log_capture_text(void) {
    fflush(stderr);
    size_t n;
    free(g_cap_text);
    g_cap_text = slurp(g_cap_path, &n);
    return g_cap_text ? g_cap_text : "";
}

void cmt_log_capture_stop(void) {
    fflush(stderr);
    if (g_saved_fd >= 0) {
        dup2(g_saved_fd, 2);
        close(g_saved_fd);
        g_saved_fd = -1;
    }
    unlink(g_cap_path);
}
