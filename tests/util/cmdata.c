#include "cmdata.h"
#pragma GCC diagnostic ignored "-Wformat-truncation" /* paths under mkdtemp are short */
#include "cmtrain.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *cda_family_name(cda_family f) {
    static const char *const n[] = {"resnet", "cnn", "mlp", "gpt2", "bert"};
    return (unsigned)f < CDA_FAMILY_COUNT ? n[f] : "?";
}

/* ---- synthetic datasets ---- */

typedef struct {
    int kind; /* 0 images, 1 GPT tokens, 2 BERT MLM */
    int64_t n, C, H, W, T;
    bool u8;
    cm_field_desc fields[3];
    int n_fields;
} synth;

static int64_t sy_len(void *self) { return ((synth *)self)->n; }
static int sy_nf(void *self) { return ((synth *)self)->n_fields; }
static const cm_field_desc *sy_field(void *self, int i) { return &((synth *)self)->fields[i]; }
static int64_t sy_tokens(void *self, int64_t i) { return ((synth *)self)->kind ? ((synth *)self)->T : 0; }

static cm_status sy_get(void *self, int64_t idx, const cm_sample_ctx *ctx, void *const *out) {
    synth *s = self;
    cm_rng r = cm_rng_init(4242, (uint64_t)idx);
    if (s->kind == 0) {
        const int64_t n = s->C * s->H * s->W;
        float *buf = malloc(sizeof(float) * (size_t)n);
        cm_rng_normal(&r, buf, (size_t)n, 0, 1);
        /* the class: which quadrant of channel 0 is brightest; images get a brighter quadrant */
        const int cls = (int)(idx % 4);
        for (int64_t y = 0; y < s->H; y++)
            for (int64_t x = 0; x < s->W; x++)
                if ((y < s->H / 2) == (cls < 2) && (x < s->W / 2) == (cls % 2 == 0)) buf[y * s->W + x] += 1.5f;
        if (s->u8)
            for (int64_t i = 0; i < n; i++) {
                const float v = 128.0f + 40.0f * buf[i];
                ((uint8_t *)out[0])[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
        else
            memcpy(out[0], buf, sizeof(float) * (size_t)n);
        free(buf);
        *(int64_t *)out[1] = cls;
        return CM_OK;
    }
    int32_t *ids = out[0];
    if (s->kind == 1) { /* a noisy counting sequence: labels are the next tokens */
        int64_t t0 = cm_rng_uniform_at(4242, (uint64_t)idx, 0) * 96;
        int32_t *labels = out[1];
        for (int64_t t = 0; t <= s->T; t++) {
            const int32_t tok = (int32_t)((t0 + 3 * t + (cm_rng_uniform_at(7, (uint64_t)idx, (uint64_t)t) < 0.2f)) % 96);
            if (t < s->T) ids[t] = tok;
            if (t > 0) labels[t - 1] = tok;
        }
        return CM_OK;
    }
    int32_t *mask = out[1];
    int64_t *labels = out[2];
    const int64_t real = idx % 3 == 0 ? s->T - 4 : s->T;
    for (int64_t t = 0; t < s->T; t++) {
        const int32_t tok = 5 + (int32_t)(cm_rng_uniform_at(4242, (uint64_t)idx, (uint64_t)t) * 95);
        const bool masked = t < real && cm_rng_uniform_at(99, (uint64_t)idx, (uint64_t)t) < 0.2f;
        ids[t] = t < real ? (masked ? 4 : tok) : 0;
        mask[t] = t < real;
        labels[t] = masked ? tok : -100;
    }
    return CM_OK;
}

static void sy_close(void *self) { free(self); }

static const cm_dataset_i synth_vt = {CM_DATASET_ABI, "synth-data-algos", sy_len, sy_nf, sy_field, sy_get,
                                      sy_tokens, sy_close};

static cm_dataset *synth_new(int kind, int64_t n, int64_t C, int64_t H, int64_t W, bool u8, int64_t T) {
    synth *s = calloc(1, sizeof *s);
    s->kind = kind, s->n = n, s->C = C, s->H = H, s->W = W, s->u8 = u8, s->T = T;
    if (kind == 0) {
        s->fields[0] = (cm_field_desc){"image", u8 ? CM_DTYPE_U8 : CM_DTYPE_F32, 3, {C, H, W}};
        s->fields[1] = (cm_field_desc){"label", CM_DTYPE_I64, 0, {0}};
        s->n_fields = 2;
    } else if (kind == 1) {
        s->fields[0] = (cm_field_desc){"input_ids", CM_DTYPE_I32, 1, {T}};
        s->fields[1] = (cm_field_desc){"labels", CM_DTYPE_I32, 1, {T}};
        s->n_fields = 2;
    } else {
        s->fields[0] = (cm_field_desc){"input_ids", CM_DTYPE_I32, 1, {T}};
        s->fields[1] = (cm_field_desc){"attention_mask", CM_DTYPE_I32, 1, {T}};
        s->fields[2] = (cm_field_desc){"labels", CM_DTYPE_I64, 1, {T}};
        s->n_fields = 3;
    }
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_new(&synth_vt, s, &ds), CM_OK, "%s", cm_last_error());
    return ds;
}

/* ---- a model that normalises u8 images itself (for RandAugment / AugMix on raw pixels) ---- */

typedef struct {
    cm_model *inner;
    const char *names[CM_DATASET_MAX_FIELDS];
} u8model;

/* The batch with "image" cast to f32 and scaled to [0, 1). */
static cm_model_batch as_float(cm_tape *tp, const cm_model_batch *b, cm_tensor **fields) {
    for (int i = 0; i < b->n; i++) {
        fields[i] = b->fields[i];
        if (!strcmp(b->names[i], "image") && cm_tensor_dtype(b->fields[i]) == CM_DTYPE_U8)
            fields[i] = cm_mul_scalar(tp, cm_cast(tp, b->fields[i], CM_DTYPE_F32), 1.0f / 255.0f);
    }
    return (cm_model_batch){b->names, fields, b->n, b->n_samples, b->n_tokens};
}
static cm_tensor *u8_forward(void *self, cm_tape *tp, const cm_model_batch *b) {
    cm_tensor *f[CM_DATASET_MAX_FIELDS];
    const cm_model_batch fb = as_float(tp, b, f);
    return cm_model_forward(((u8model *)self)->inner, tp, &fb);
}
static cm_tensor *u8_loss(void *self, cm_tape *tp, cm_tensor *out, const cm_model_batch *b) {
    return cm_model_loss(((u8model *)self)->inner, tp, out, b);
}
static int u8_n_metrics(void *self, bool train) { return cm_model_n_metrics(((u8model *)self)->inner, train); }
static cm_metric u8_metric(void *self, bool train, int i) { return cm_model_metric(((u8model *)self)->inner, train, i); }
static cm_module *u8_module(void *self) { return cm_model_module(((u8model *)self)->inner); }
static void u8_free(void *self) {
    cm_model_free(((u8model *)self)->inner);
    free(self);
}
static const cm_model_i u8_vt = {CM_MODEL_ABI, "U8ImageModel", u8_forward, u8_loss, NULL, u8_n_metrics, u8_metric,
                                 NULL, u8_module, u8_free};

static cm_model *u8_wrap(cm_model *inner) {
    u8model *u = calloc(1, sizeof *u);
    u->inner = inner;
    cm_model *m;
    cr_assert_eq(cm_model_new(&u8_vt, u, &m), CM_OK, "%s", cm_last_error());
    return m;
}

/* ---- rigs ---- */

cda_rig_opts cda_rig_opts_default(void) { return (cda_rig_opts){3, 8, false}; }

cda_rig cda_rig_new(cda_family f, const cda_rig_opts *o) {
    const cda_rig_opts ro = o ? *o : cda_rig_opts_default();
    cda_rig r = {f, NULL, NULL, NULL};
    const int64_t n = ro.batches_per_epoch * ro.batch_size;
    switch (f) {
    case CDA_RESNET: {
        cm_resnet_config c;
        cr_assert_eq(cm_resnet_config_preset("resnet20", &c), CM_OK);
        c.n_stages = 2, c.layers[0] = c.layers[1] = 1, c.widths[0] = 8, c.widths[1] = 16;
        c.num_classes = 4, c.seed = 3;
        cr_assert_eq(cm_resnet_model_new(&c, &r.model), CM_OK, "%s", cm_last_error());
        r.ds = synth_new(0, n, 3, 16, 16, ro.u8_images, 0);
        break;
    }
    case CDA_CNN: {
        cm_cnn_config c = cm_cnn_config_default();
        c.in_channels = 1, c.image_h = c.image_w = 12, c.channels[0] = 4, c.channels[1] = 8, c.hidden = 16;
        c.num_classes = 4, c.dropout1 = c.dropout2 = 0.1f, c.seed = 3;
        cr_assert_eq(cm_cnn_model_new(&c, &r.model), CM_OK, "%s", cm_last_error());
        r.ds = synth_new(0, n, 1, 12, 12, ro.u8_images, 0);
        break;
    }
    case CDA_MLP:
        r.model = cmt_mlp(8, 16, 3, 0.1f, 3);
        r.ds = cmt_synth_dataset(n, 8, 3, true, NULL);
        break;
    case CDA_GPT2: {
        cm_gpt2_config c;
        cr_assert_eq(cm_gpt2_config_preset("tiny", &c), CM_OK);
        c.embd_pdrop = c.attn_pdrop = c.resid_pdrop = 0.1f;
        cm_rng rng = cm_rng_init(3, 0);
        cr_assert_eq(cm_gpt2_new(&c, &rng, &r.model), CM_OK, "%s", cm_last_error());
        r.ds = synth_new(1, n, 0, 0, 0, false, 16);
        break;
    }
    case CDA_BERT: {
        cm_bert_config c;
        cr_assert_eq(cm_bert_config_preset("test-tiny", &c), CM_OK);
        cm_rng rng = cm_rng_init(3, 0);
        cr_assert_eq(cm_bert_mlm_new(&c, &rng, &r.model), CM_OK, "%s", cm_last_error());
        r.ds = synth_new(2, n, 0, 0, 0, false, 16);
        break;
    }
    default:
        cr_assert_fail("family %d", (int)f);
    }
    if (ro.u8_images && (f == CDA_RESNET || f == CDA_CNN)) r.model = u8_wrap(r.model);
    r.dl = cmt_loader(r.ds, ro.batch_size, false, 5);
    return r;
}

void cda_rig_free(cda_rig *r) {
    cm_dataloader_free(r->dl);
    cm_dataset_free(r->ds);
    cm_model_free(r->model);
    memset(r, 0, sizeof *r);
}

/* ---- method sets ---- */

int cda_image_methods(cm_algorithm_plugin *out, int cap, void *data) {
    (void)cap, (void)data;
    cm_selective_backprop_config sb = cm_selective_backprop_config_default();
    sb.start = 0, sb.end = 1;
    cm_progressive_resizing_config pr = cm_progressive_resizing_config_default();
    pr.delay_fraction = 0, pr.finetune_fraction = 0;
    cm_colout_config co = cm_colout_config_default();
    cm_cutout_config cu = cm_cutout_config_default();
    cm_mixup_config mu = cm_mixup_config_default();
    cm_cutmix_config cm = cm_cutmix_config_default();
    cm_label_smoothing_config ls = cm_label_smoothing_config_default();
    /* SelectiveBackprop first, where Composer's ordering pass sorts it; AFTER_DATALOADER is an
     * AFTER_ event, so the first-in-last-out pass then runs it last there, after the others have
     * changed the batch — Composer's net order too */
    cr_assert_eq(cm_selective_backprop_new(&sb, &out[0]), CM_OK);
    cr_assert_eq(cm_progressive_resizing_new(&pr, &out[1]), CM_OK);
    cr_assert_eq(cm_colout_new(&co, &out[2]), CM_OK);
    cr_assert_eq(cm_cutout_new(&cu, &out[3]), CM_OK);
    cr_assert_eq(cm_mixup_new(&mu, &out[4]), CM_OK);
    cr_assert_eq(cm_cutmix_new(&cm, &out[5]), CM_OK);
    cr_assert_eq(cm_label_smoothing_new(&ls, &out[6]), CM_OK);
    return 7;
}

int cda_token_methods(cm_algorithm_plugin *out, int cap, void *data) {
    (void)cap, (void)data;
    cm_selective_backprop_config sb = cm_selective_backprop_config_default();
    sb.start = 0, sb.end = 1;
    cm_seq_length_warmup_config sl = cm_seq_length_warmup_config_default();
    sl.duration = 1.0, sl.min_seq_length = 4, sl.max_seq_length = 16, sl.step_size = 4;
    cr_assert_eq(cm_selective_backprop_new(&sb, &out[0]), CM_OK);
    cr_assert_eq(cm_seq_length_warmup_new(&sl, &out[1]), CM_OK);
    return 2;
}

/* ---- runs ---- */

cda_run_opts cda_run_opts_default(void) {
    cda_run_opts o;
    memset(&o, 0, sizeof o);
    o.max_duration = "3ba";
    o.precision = CM_PRECISION_FP32;
    o.save_interval = "1ba";
    o.rig = cda_rig_opts_default();
    return o;
}

static cm_optim *sgd(cm_model *m) {
    cm_module *root = cm_model_module(m);
    const int n = cm_module_n_units(root);
    cm_optim_span spans[16];
    cr_assert(n <= 16);
    for (int i = 0; i < n; i++) {
        const cm_unit_info *u = cm_module_unit(root, i);
        spans[i] = (cm_optim_span){u->name, u->params, u->grads, u->numel};
    }
    cm_optim *o;
    cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_DECOUPLED_SGDW);
    hp.lr = 0.05, hp.momentum = 0.9;
    cr_assert_eq(cm_optim_new(CM_OPTIM_DECOUPLED_SGDW, &o), CM_OK);
    cr_assert_eq(cm_optim_add_group(o, &hp, spans, n), CM_OK, "%s", cm_last_error());
    return o;
}

cda_run cda_run_new(cda_family f, cda_algos_fn algos, void *data, const cda_run_opts *o) {
    cda_run r;
    memset(&r, 0, sizeof r);
    r.rig = cda_rig_new(f, &o->rig);
    cm_algorithm_plugin ap[8];
    const int na = algos ? algos(ap, 8, data) : 0;
    cm_logger_plugin lp;
    cr_assert_eq(cm_in_memory_logger_new(&r.mem, &lp), CM_OK);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = r.rig.model;
    c.train_dataloader = r.rig.dl;
    cr_assert_eq(cm_time_parse(o->max_duration, &c.max_duration), CM_OK);
    c.algorithms = ap, c.n_algorithms = na;
    c.precision = o->precision; /* surgery reads it (LowPrecisionLayerNorm) */
    /* model surgery (ALiBi's) first, so the optimizer is made over the final parameters */
    cr_assert_eq(cm_trainer_prepare_model(&c), CM_OK, "%s: %s", cda_family_name(f), cm_last_error());
    if (o->device != CM_DEVICE_CPU)
        cr_assert_eq(cm_module_to_device(cm_model_module(r.rig.model), o->device), CM_OK, "%s", cm_last_error());
    c.device = o->device;
    c.optimizer = sgd(r.rig.model);
    c.loggers = &lp, c.n_loggers = 1;
    c.device_train_microbatch_size = o->microbatch;
    c.seed = 17;
    c.run_name = "cda";
    c.save_folder = o->save_folder;
    c.save_interval_str = o->save_interval;
    c.load_path = o->load_path;
    c.handle_signals = false;
    cm_status s = cm_trainer_new(&c, &r.tr);
    if (s) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        for (int i = 0; i < na; i++) cm_algorithm_plugin_free(ap[i]);
        cm_logger_plugin_free(lp);
        cr_assert_fail("%s: cm_trainer_new: %s", cda_family_name(f), msg);
    }
    return r; /* the optimizer belongs to the run: cda_run_free frees it after the trainer */
}

void cda_run_free(cda_run *r) {
    cm_optim *opt = r->tr ? cm_state_optimizer(cm_trainer_state(r->tr)) : NULL;
    cm_trainer_free(r->tr);
    cm_optim_free(opt);
    cda_rig_free(&r->rig);
}

float *cda_params(cm_model *m, int64_t *n) { return cmt_params_copy(m, n); }

void cda_check_fit_twice(cda_family f, cda_algos_fn algos, void *data, const cda_run_opts *o, const char *label) {
    cda_run r = cda_run_new(f, algos, data, o);
    int64_t n;
    float *p0 = cda_params(r.rig.model, &n);
    cm_fit_opts fo = cm_fit_opts_default();
    fo.duration = cm_time_make(1, CM_TIME_BATCH);
    cr_assert_eq(cm_trainer_fit(r.tr, &fo), CM_OK, "%s on %s: first fit: %s", label, cda_family_name(f), cm_last_error());
    cm_time md;
    cr_assert_eq(cm_time_parse(o->max_duration, &md), CM_OK);
    fo.duration = cm_time_make(md.count - 1, CM_TIME_BATCH); /* "fit again": the rest of the run */
    cr_assert_eq(cm_trainer_fit(r.tr, &fo), CM_OK, "%s on %s: second fit: %s", label, cda_family_name(f), cm_last_error());
    cr_expect_eq(cm_state_timestamp(cm_trainer_state(r.tr))->batch, md.count, "%s on %s: %lld batches trained", label,
                 cda_family_name(f), (long long)cm_state_timestamp(cm_trainer_state(r.tr))->batch);
    const int64_t nl = cm_in_memory_logger_n(r.mem);
    int losses = 0;
    for (int64_t i = 0; i < nl; i++) {
        const cm_log_record *rec = cm_in_memory_logger_record(r.mem, i);
        if (strcmp(rec->name, "loss/train/total")) continue;
        losses++;
        cr_expect(isfinite(rec->value), "%s on %s: loss %g at batch %lld", label, cda_family_name(f), rec->value,
                  (long long)rec->batch);
    }
    cr_expect_eq(losses, md.count, "%s on %s: %d losses logged", label, cda_family_name(f), losses);
    float *p1 = cda_params(r.rig.model, &n);
    cr_expect(memcmp(p0, p1, sizeof(float) * (size_t)n) != 0, "%s on %s: the weights did not change", label,
              cda_family_name(f));
    free(p0), free(p1);
    cda_run_free(&r);
}

/* ---- checkpoints ---- */

/* Under /dev/shm when there is one: the checkpoints' fsyncs then cost nothing (the durability is
 * tested elsewhere; here only the contents matter). */
static char *tmpdir(void) {
    char tmpl[64];
    snprintf(tmpl, sizeof tmpl, "%s/cm-data-algos-XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    char *d = mkdtemp(tmpl);
    cr_assert(d, "mkdtemp");
    return strdup(d);
}

static void rmtree(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", path, e->d_name);
            struct stat st;
            if (!lstat(p, &st) && S_ISDIR(st.st_mode)) rmtree(p);
            else unlink(p);
        }
        closedir(d);
    }
    rmdir(path);
}

/* The checkpoint directory of a run at `batch` (the default name "ep{epoch}-ba{batch}"). */
static bool find_ckpt(const char *folder, int64_t batch, char *out, size_t cap) {
    DIR *d = opendir(folder);
    if (!d) return false;
    char suffix[32];
    snprintf(suffix, sizeof suffix, "-ba%lld", (long long)batch);
    bool found = false;
    struct dirent *e;
    while (!found && (e = readdir(d))) {
        const size_t n = strlen(e->d_name), m = strlen(suffix);
        if (n > m && !strncmp(e->d_name, "ep", 2) && !strcmp(e->d_name + n - m, suffix)) {
            snprintf(out, cap, "%s/%s", folder, e->d_name);
            found = true;
        }
    }
    closedir(d);
    return found;
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    const long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)sz + 1);
    cr_assert_eq(fread(b, 1, (size_t)sz, f), (size_t)sz);
    fclose(f);
    b[sz] = 0;
    *n = (size_t)sz;
    return b;
}

static void strip(cJSON *o) {
    static const char *const drop[] = {"created", "manifest_xxh3", "total_wct", "iteration_wct", "epoch_wct", "batch_wct"};
    for (size_t i = 0; i < sizeof drop / sizeof *drop; i++) cJSON_DeleteItemFromObjectCaseSensitive(o, drop[i]);
    for (cJSON *c = o ? o->child : NULL; c; c = c->next)
        if (cJSON_IsObject(c) || cJSON_IsArray(c)) strip(c);
}

static void assert_same_checkpoint(const char *a, const char *b, const char *label) {
    DIR *d = opendir(a);
    cr_assert(d, "%s: no checkpoint %s", label, a);
    struct dirent *e;
    int files = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char pa[4096], pb[4096];
        snprintf(pa, sizeof pa, "%s/%s", a, e->d_name);
        snprintf(pb, sizeof pb, "%s/%s", b, e->d_name);
        size_t na, nb;
        char *ba = slurp(pa, &na), *bb = slurp(pb, &nb);
        if (!strcmp(e->d_name, "manifest.json")) {
            cJSON *ja = cJSON_Parse(ba), *jb = cJSON_Parse(bb);
            cr_assert(ja && jb, "%s: manifests parse", label);
            strip(ja), strip(jb);
            char *sa = cJSON_PrintUnformatted(ja), *sb = cJSON_PrintUnformatted(jb);
            if (strcmp(sa, sb)) {
                size_t k = 0;
                while (sa[k] && sa[k] == sb[k]) k++;
                cr_assert_fail("%s: manifests of %s and %s differ at byte %zu:\n  %.160s\n  %.160s", label, a, b, k,
                               sa + (k > 60 ? k - 60 : 0), sb + (k > 60 ? k - 60 : 0));
            }
            free(sa), free(sb);
            cJSON_Delete(ja), cJSON_Delete(jb);
        } else {
            cr_assert(na == nb && memcmp(ba, bb, na) == 0, "%s: %s differs between %s and %s (%zu vs %zu bytes)", label,
                      e->d_name, a, b, na, nb);
        }
        free(ba), free(bb);
        files++;
    }
    closedir(d);
    cr_assert_geq(files, 2, "%s: %d files in %s", label, files, a);
}

void cda_check_resumption(cda_family f, cda_algos_fn algos, void *data, const cda_run_opts *o, int64_t total,
                          int64_t resume, const char *label) {
    char *root = tmpdir(), fa[4096], fb[4096], dur[32];
    snprintf(fa, sizeof fa, "%s/a", root);
    snprintf(fb, sizeof fb, "%s/b", root);
    snprintf(dur, sizeof dur, "%lldba", (long long)total);
    cda_run_opts oa = *o;
    oa.max_duration = dur, oa.save_folder = fa, oa.save_interval = "1ba", oa.load_path = NULL;
    cda_run a = cda_run_new(f, algos, data, &oa);
    cr_assert_eq(cm_trainer_fit(a.tr, NULL), CM_OK, "%s on %s: the first run: %s", label, cda_family_name(f),
                 cm_last_error());
    cda_run_free(&a);
    char from[4096];
    cr_assert(find_ckpt(fa, resume, from, sizeof from), "%s: no checkpoint of batch %lld in %s", label, (long long)resume, fa);
    cda_run_opts ob = oa;
    ob.save_folder = fb, ob.load_path = from;
    cda_run b = cda_run_new(f, algos, data, &ob);
    cr_assert_eq(cm_state_timestamp(cm_trainer_state(b.tr))->batch, resume);
    cr_assert_eq(cm_trainer_fit(b.tr, NULL), CM_OK, "%s on %s: the resumed run: %s", label, cda_family_name(f),
                 cm_last_error());
    cda_run_free(&b);
    char lbl[256];
    for (int64_t k = resume + 1; k <= total; k++) {
        char ca[4096], cb[4096];
        cr_assert(find_ckpt(fa, k, ca, sizeof ca) && find_ckpt(fb, k, cb, sizeof cb), "%s: checkpoints of batch %lld",
                  label, (long long)k);
        snprintf(lbl, sizeof lbl, "%s on %s, batch %lld", label, cda_family_name(f), (long long)k);
        assert_same_checkpoint(ca, cb, lbl);
    }
    /* the runs trained: the weights at `resume` and at `total` differ */
    char c0[4096], c1[4096], m0[4200], m1[4200];
    cr_assert(find_ckpt(fa, resume, c0, sizeof c0) && find_ckpt(fa, total, c1, sizeof c1));
    snprintf(m0, sizeof m0, "%s/model.safetensors", c0);
    snprintf(m1, sizeof m1, "%s/model.safetensors", c1);
    size_t n0, n1;
    char *b0 = slurp(m0, &n0), *b1 = slurp(m1, &n1);
    cr_expect(n0 != n1 || memcmp(b0, b1, n0) != 0, "%s on %s: the weights did not change", label, cda_family_name(f));
    free(b0), free(b1);
    rmtree(root);
    free(root);
}
