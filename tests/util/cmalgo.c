#define _XOPEN_SOURCE 700
#include "cmalgo.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------
 * Synthetic datasets
 * ------------------------------------------------------------------------------------------- */

/* Vectors "input" (d) f32 with "label" i64; images "image" (c, h, w) f32 with "label" i64; token
 * sequences "input_ids" (t) i64 with "labels" (t) i64 (the next token, wrapping). Every sample is
 * a pure function of its index. */
typedef enum { DS_VEC, DS_IMAGE, DS_TOKENS } ds_kind;

typedef struct {
    ds_kind kind;
    int64_t n, classes, vocab;
    cm_field_desc fields[2];
} synth;

static int64_t s_len(void *self) { return ((synth *)self)->n; }
static int s_nf(void *self) { return 2; }
static const cm_field_desc *s_field(void *self, int i) { return &((synth *)self)->fields[i]; }

static cm_status s_get(void *self, int64_t i, const cm_sample_ctx *ctx, void *const *out) {
    synth *s = self;
    const cm_field_desc *f = &s->fields[0];
    int64_t numel = 1;
    for (int d = 0; d < f->ndim; d++) numel *= f->shape[d];
    cm_rng r = cm_rng_init(4321, (uint64_t)i);
    if (s->kind == DS_TOKENS) {
        int64_t *ids = out[0], *labels = out[1];
        cm_rng_randint(&r, ids, (size_t)numel, 0, s->vocab);
        for (int64_t t = 0; t < numel; t++) labels[t] = ids[(t + 1) % numel];
        return CM_OK;
    }
    float *x = out[0];
    cm_rng_normal(&r, x, (size_t)numel, 0, 1);
    double acc = 0;
    for (int64_t k = 0; k < numel; k++) acc += x[k] * (double)((k % 3) - 1);
    *(int64_t *)out[1] = (int64_t)(fabs(acc) * 7.0) % s->classes;
    return CM_OK;
}

static void s_close(void *self) { free(self); }

static const cm_dataset_i synth_vt = {CM_DATASET_ABI, "algo-synth", s_len, s_nf, s_field, s_get, NULL, s_close};

static cm_dataset *synth_new(ds_kind kind, int64_t n, int ndim, const int64_t *shape, int64_t classes, int64_t vocab) {
    synth *s = calloc(1, sizeof *s);
    s->kind = kind, s->n = n, s->classes = classes, s->vocab = vocab;
    const char *in = kind == DS_VEC ? "input" : kind == DS_IMAGE ? "image" : "input_ids";
    s->fields[0] = (cm_field_desc){in, kind == DS_TOKENS ? CM_DTYPE_I64 : CM_DTYPE_F32, ndim, {0}};
    for (int d = 0; d < ndim; d++) s->fields[0].shape[d] = shape[d];
    if (kind == DS_TOKENS) {
        s->fields[1] = (cm_field_desc){"labels", CM_DTYPE_I64, ndim, {0}};
        for (int d = 0; d < ndim; d++) s->fields[1].shape[d] = shape[d];
    } else {
        s->fields[1] = (cm_field_desc){"label", CM_DTYPE_I64, 0, {0}};
    }
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_new(&synth_vt, s, &ds), CM_OK, "%s", cm_last_error());
    return ds;
}

static cm_dataloader *loader(cm_dataset *ds, int64_t batch, bool eval) {
    cm_dataloader_config c = eval ? cm_dataloader_config_eval() : cm_dataloader_config_default();
    c.batch_size = batch;
    c.seed = 17;
    cm_dataloader *dl;
    cr_assert_eq(cm_dataloader_new(ds, &c, &dl), CM_OK, "%s", cm_last_error());
    return dl;
}

static void rig_data(cmt_rig *r, ds_kind kind, int ndim, const int64_t *shape, int64_t classes, int64_t vocab,
                     int64_t batch, void *data) {
    r->batches_per_epoch = data ? *(int64_t *)data : 2;
    r->ds = synth_new(kind, batch * r->batches_per_epoch, ndim, shape, classes, vocab);
    r->dl = loader(r->ds, batch, false);
    r->eval_ds = synth_new(kind, batch + 1, ndim, shape, classes, vocab); /* a short last batch */
    r->eval_dl = loader(r->eval_ds, batch, true);
}

void cmt_rig_free(cmt_rig *r) {
    cm_model_free(r->model);
    cm_dataloader_free(r->dl);
    cm_dataset_free(r->ds);
    cm_dataloader_free(r->eval_dl);
    cm_dataset_free(r->eval_ds);
    memset(r, 0, sizeof *r);
}

void cmt_rig_mlp(cmt_rig *out, void *data) {
    memset(out, 0, sizeof *out);
    out->family = "mlp";
    cm_rng rng = cm_rng_init(5, 0);
    cm_module *seq, *l1, *act, *dr, *l2;
    cr_assert_eq(cm_nn_sequential_new(&seq), CM_OK);
    cr_assert_eq(cm_nn_linear_new(8, 16, true, &rng, &l1), CM_OK);
    cr_assert_eq(cm_nn_activation_new(CM_ACT_RELU, &act), CM_OK);
    cr_assert_eq(cm_nn_dropout_new(0.1f, &dr), CM_OK);
    cr_assert_eq(cm_nn_linear_new(16, 3, true, &rng, &l2), CM_OK);
    cm_nn_sequential_append(seq, l1);
    cm_nn_sequential_append(seq, act);
    cm_nn_sequential_append(seq, dr);
    cm_nn_sequential_append(seq, l2);
    cr_assert_eq(cm_model_classifier_new(seq, NULL, &out->model), CM_OK, "%s", cm_last_error());
    const int64_t shape[1] = {8};
    rig_data(out, DS_VEC, 1, shape, 3, 0, 8, data);
}

void cmt_rig_cnn(cmt_rig *out, void *data) {
    memset(out, 0, sizeof *out);
    out->family = "cnn";
    cm_cnn_config c = cm_cnn_config_default();
    c.in_channels = 1, c.image_h = 8, c.image_w = 8;
    c.channels[0] = 4, c.channels[1] = 8;
    c.hidden = 16, c.num_classes = 4, c.seed = 3;
    cr_assert_eq(cm_cnn_model_new(&c, &out->model), CM_OK, "%s", cm_last_error());
    const int64_t shape[3] = {1, 8, 8};
    rig_data(out, DS_IMAGE, 3, shape, 4, 0, 4, data);
}

void cmt_rig_resnet(cmt_rig *out, void *data) {
    memset(out, 0, sizeof *out);
    out->family = "resnet";
    cm_resnet_config c = cm_resnet_config_default();
    c.block = CM_RESNET_BASIC, c.stem = CM_RESNET_STEM_CIFAR, c.shortcut = CM_RESNET_SHORTCUT_B;
    c.n_stages = 2, c.layers[0] = 1, c.layers[1] = 1, c.widths[0] = 4, c.widths[1] = 8;
    c.in_channels = 3, c.num_classes = 4, c.seed = 4;
    cr_assert_eq(cm_resnet_model_new(&c, &out->model), CM_OK, "%s", cm_last_error());
    const int64_t shape[3] = {3, 8, 8};
    rig_data(out, DS_IMAGE, 3, shape, 4, 0, 4, data);
}

void cmt_rig_gpt2(cmt_rig *out, void *data) {
    memset(out, 0, sizeof *out);
    out->family = "gpt2";
    cm_gpt2_config c;
    cr_assert_eq(cm_gpt2_config_preset("tiny", &c), CM_OK);
    c.embd_pdrop = 0.1f, c.resid_pdrop = 0.1f; /* dropout streams must resume too */
    cm_rng rng = cm_rng_init(6, 0);
    cr_assert_eq(cm_gpt2_new(&c, &rng, &out->model), CM_OK, "%s", cm_last_error());
    const int64_t shape[1] = {8};
    rig_data(out, DS_TOKENS, 1, shape, 0, c.vocab_size, 4, data);
}

/* ---------------------------------------------------------------------------------------------
 * Runs
 * ------------------------------------------------------------------------------------------- */

cmt_run_opts cmt_run_opts_default(void) {
    return (cmt_run_opts){.max_duration = "2ba", .precision = CM_PRECISION_FP32, .eval_interval = "1ep",
                          .save_interval = "1ba", .adam = true, .schedule = true};
}

static cm_optim *make_optim(cm_model *m, bool adam) {
    cm_module *root = cm_model_module(m);
    const int n = cm_module_n_units(root);
    cm_optim_span *spans = calloc((size_t)n + 1, sizeof *spans);
    for (int i = 0; i < n; i++) {
        const cm_unit_info *u = cm_module_unit(root, i);
        spans[i] = (cm_optim_span){u->name, u->params, u->grads, u->numel};
    }
    const cm_optim_kind kind = adam ? CM_OPTIM_DECOUPLED_ADAMW : CM_OPTIM_DECOUPLED_SGDW;
    cm_optim_hparams hp = cm_optim_hparams_default(kind);
    hp.lr = adam ? 1e-2 : 0.1;
    hp.weight_decay = 1e-4;
    if (!adam) hp.momentum = 0.9;
    cm_optim *o;
    cr_assert_eq(cm_optim_new(kind, &o), CM_OK);
    cr_assert_eq(cm_optim_add_group(o, &hp, spans, n), CM_OK, "%s", cm_last_error());
    free(spans);
    return o;
}

cm_status cmt_run_try(cmt_rig *rig, cmt_algos_fn make_algos, void *algos_data, const cmt_run_opts *o, cmt_run *out) {
    cmt_run r = {0};
    r.opt = make_optim(rig->model, o->adam);
    cm_algorithm_plugin algs[16];
    const int n_algs = make_algos ? make_algos(algs, 16, algos_data) : 0;
    cr_assert(n_algs >= 0 && n_algs <= 16, "the algorithm factory returned %d", n_algs);
    cm_logger_plugin mp;
    cr_assert_eq(cm_in_memory_logger_new(&r.mem, &mp), CM_OK);
    cm_sched_config step = cm_sched_config_default(CM_SCHED_STEP);
    step.step_size = cm_time_make(1, CM_TIME_BATCH);
    step.gamma = 0.5;

    cm_trainer_config c = cm_trainer_config_default();
    c.model = rig->model;
    c.train_dataloader = rig->dl;
    if (o->eval) {
        c.eval_dataloader = rig->eval_dl;
        cr_assert_eq(cm_time_parse(o->eval_interval, &c.eval_interval), CM_OK);
    } else {
        c.eval_interval = cm_time_make(0, CM_TIME_EPOCH);
    }
    cr_assert_eq(cm_time_parse(o->max_duration, &c.max_duration), CM_OK);
    c.optimizer = r.opt;
    c.schedulers = o->schedule ? &step : NULL;
    c.n_schedulers = o->schedule ? 1 : 0;
    c.precision = o->precision;
    c.device_train_microbatch_size = o->microbatch;
    c.algorithms = algs;
    c.n_algorithms = n_algs;
    c.loggers = &mp;
    c.n_loggers = 1;
    c.run_name = "algo-test";
    c.save_folder = o->save_folder;
    c.save_interval_str = o->save_interval;
    c.save_filename = "ba{batch}";
    c.load_path = o->load_path;
    c.handle_signals = false;
    c.save_async = o->save_async;
    if (o->load_exclude_algorithms) c.load_exclude_algorithms = &o->load_exclude_algorithms, c.n_load_exclude_algorithms = 1;
    cm_status s = cm_trainer_new(&c, &r.tr);
    if (s) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        for (int i = 0; i < n_algs; i++) cm_algorithm_plugin_free(algs[i]);
        cm_logger_plugin_free(mp);
        cm_optim_free(r.opt);
        memset(out, 0, sizeof *out);
        return cm_set_error(s, "%s", msg);
    }
    *out = r;
    return CM_OK;
}

cmt_run cmt_run_new(cmt_rig *rig, cmt_algos_fn make_algos, void *algos_data, const cmt_run_opts *o) {
    cmt_run r;
    cm_status s = cmt_run_try(rig, make_algos, algos_data, o, &r);
    cr_assert_eq(s, CM_OK, "cm_trainer_new (%s): %s", rig->family, cm_last_error());
    return r;
}

void cmt_run_free(cmt_run *r) {
    cm_trainer_free(r->tr);
    cm_optim_free(r->opt);
    memset(r, 0, sizeof *r);
}

static float *weights(cm_model *m, int64_t *n) {
    cm_module *root = cm_model_module(m);
    int64_t total = 0;
    for (int i = 0; i < cm_module_n_units(root); i++) total += cm_module_unit(root, i)->numel;
    float *p = malloc(sizeof(float) * (size_t)(total ? total : 1));
    int64_t off = 0;
    for (int i = 0; i < cm_module_n_units(root); i++) {
        const cm_unit_info *u = cm_module_unit(root, i);
        memcpy(p + off, u->params, sizeof(float) * (size_t)u->numel);
        off += u->numel;
    }
    *n = total;
    return p;
}

void cmt_check_fit_twice(cmt_rig_fn make_rig, void *rig_data, cmt_algos_fn make_algos, void *algos_data,
                         const cmt_run_opts *o, const char *fit_first, const char *label) {
    cmt_rig rig;
    make_rig(&rig, rig_data);
    cmt_run r = cmt_run_new(&rig, make_algos, algos_data, o);
    int64_t n0;
    float *w0 = weights(rig.model, &n0);
    cm_fit_opts fo = cm_fit_opts_default();
    cr_assert_eq(cm_time_parse(fit_first, &fo.duration), CM_OK);
    cr_assert_eq(cm_trainer_fit(r.tr, &fo), CM_OK, "%s (%s): first fit: %s", label, rig.family, cm_last_error());
    const int64_t b1 = cm_state_timestamp(cm_trainer_state(r.tr))->batch;
    /* a fit with a duration moves max_duration to its end: the second fit asks for the rest */
    cm_time md;
    cr_assert_eq(cm_time_parse(o->max_duration, &md), CM_OK);
    cr_assert(md.unit == CM_TIME_BATCH && fo.duration.unit == CM_TIME_BATCH, "fit twice: use durations in ba");
    fo.duration.count = md.count - fo.duration.count;
    cr_assert_eq(cm_trainer_fit(r.tr, &fo), CM_OK, "%s (%s): second fit: %s", label, rig.family, cm_last_error());
    int cmp = -1;
    cm_timestamp_cmp(cm_state_timestamp(cm_trainer_state(r.tr)), md, &cmp);
    cr_assert(cmp >= 0 && b1 > 0 && cm_state_timestamp(cm_trainer_state(r.tr))->batch > b1,
              "%s (%s): the fits trained %lld then %lld batches", label, rig.family, (long long)b1,
              (long long)cm_state_timestamp(cm_trainer_state(r.tr))->batch);
    double loss;
    cr_assert_eq(cm_in_memory_logger_last(r.mem, "loss/train/total", &loss), CM_OK);
    cr_assert(isfinite(loss), "%s (%s): loss %g", label, rig.family, loss);
    int64_t n1;
    float *w1 = weights(rig.model, &n1);
    cr_assert_eq(n0, n1);
    cr_assert(memcmp(w0, w1, sizeof(float) * (size_t)n0) != 0, "%s (%s): the weights did not change", label,
              rig.family);
    free(w0);
    free(w1);
    cmt_run_free(&r);
    cmt_rig_free(&rig);
}

/* ---------------------------------------------------------------------------------------------
 * Checkpoint comparison
 * ------------------------------------------------------------------------------------------- */

char *cmt_tmpdir(void) {
    /* in memory when the machine has it (fsync is free there), as Composer's test does */
    char *d = strdup(access("/dev/shm", W_OK) == 0 ? "/dev/shm/cmalgo-XXXXXX" : "/tmp/cmalgo-XXXXXX");
    cr_assert(mkdtemp(d), "mkdtemp");
    return d;
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) { return remove(p); }

void cmt_rmtree(const char *path) { nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* Removes what differs between two saves of the same state: the creation time, the wall clock
 * and the manifest's own checksum (over the text, which holds both). */
static void scrub(cJSON *m) {
    cJSON_DeleteItemFromObjectCaseSensitive(m, "created");
    cJSON_DeleteItemFromObjectCaseSensitive(m, "manifest_xxh3");
    cJSON *ts = cJSON_GetObjectItemCaseSensitive(m, "timestamp");
    const char *wct[] = {"total_wct", "iteration_wct", "epoch_wct", "batch_wct"};
    for (int i = 0; i < 4; i++) cJSON_DeleteItemFromObjectCaseSensitive(ts, wct[i]);
}

/* The first differing member of two JSON values, as a dotted path (for messages). */
static void first_diff(const cJSON *a, const cJSON *b, char *path, size_t cap) {
    if (cJSON_IsObject(a) && cJSON_IsObject(b)) {
        const cJSON *x;
        cJSON_ArrayForEach(x, a) {
            const cJSON *y = cJSON_GetObjectItemCaseSensitive(b, x->string);
            if (!y || !cJSON_Compare(x, y, true)) {
                size_t n = strlen(path);
                snprintf(path + n, cap - n, "%s%s", n ? "." : "", x->string);
                if (y) first_diff(x, y, path, cap);
                return;
            }
        }
    } else if (cJSON_IsArray(a) && cJSON_IsArray(b)) {
        for (int i = 0; i < cJSON_GetArraySize(a) && i < cJSON_GetArraySize(b); i++) {
            const cJSON *x = cJSON_GetArrayItem(a, i), *y = cJSON_GetArrayItem(b, i);
            if (!cJSON_Compare(x, y, true)) {
                size_t n = strlen(path);
                snprintf(path + n, cap - n, "[%d]", i);
                first_diff(x, y, path, cap);
                return;
            }
        }
    }
}

bool cmt_checkpoints_differ(const char *a, const char *b, char *msg, size_t cap) {
    cm_checkpoint *ca, *cb;
    cr_assert_eq(cm_checkpoint_open(a, &ca), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_checkpoint_open(b, &cb), CM_OK, "%s", cm_last_error());
    bool differ = false;
    const size_t n = cm_checkpoint_n_tensors(ca);
    if (n != cm_checkpoint_n_tensors(cb)) {
        snprintf(msg, cap, "%zu tensors in '%s', %zu in '%s'", n, a, cm_checkpoint_n_tensors(cb), b);
        differ = true;
    }
    for (size_t i = 0; !differ && i < n; i++) {
        cm_ckpt_tensor ta, tb;
        cr_assert_eq(cm_checkpoint_tensor(ca, i, &ta), CM_OK);
        cr_assert_eq(cm_checkpoint_tensor(cb, i, &tb), CM_OK);
        if (strcmp(ta.file, tb.file) || strcmp(ta.name, tb.name)) {
            snprintf(msg, cap, "tensor %zu is %s:%s in one and %s:%s in the other", i, ta.file, ta.name, tb.file,
                     tb.name);
            differ = true;
            break;
        }
        const cm_st_tensor *sa = cm_safetensors_find(cm_checkpoint_file(ca, ta.file), ta.name);
        const cm_st_tensor *sb = cm_safetensors_find(cm_checkpoint_file(cb, tb.file), tb.name);
        cr_assert(sa && sb, "%s:%s not readable", ta.file, ta.name);
        bool same = sa->dtype == sb->dtype && sa->ndim == sb->ndim && sa->nbytes == sb->nbytes;
        for (int d = 0; same && d < sa->ndim; d++) same = sa->shape[d] == sb->shape[d];
        if (!same) {
            snprintf(msg, cap, "%s:%s has another dtype or shape", ta.file, ta.name);
            differ = true;
        } else if (memcmp(sa->data, sb->data, sa->nbytes) != 0) {
            size_t k = 0; /* the first differing f32 element, for the message */
            float x = 0, y = 0;
            if (sa->dtype == CM_ST_DTYPE_F32)
                for (; k < sa->nbytes / 4; k++) {
                    memcpy(&x, (const char *)sa->data + 4 * k, 4);
                    memcpy(&y, (const char *)sb->data + 4 * k, 4);
                    if (memcmp(&x, &y, 4)) break;
                }
            snprintf(msg, cap, "%s:%s differs (tol 0): element %zu is %.9g in '%s', %.9g in '%s'", ta.file, ta.name, k,
                     x, a, y, b);
            differ = true;
        }
    }
    if (!differ) {
        cJSON *ma = cJSON_Parse(cm_checkpoint_manifest(ca)), *mb = cJSON_Parse(cm_checkpoint_manifest(cb));
        cr_assert(ma && mb, "the manifests do not parse");
        scrub(ma), scrub(mb);
        if (!cJSON_Compare(ma, mb, true)) {
            char path[512] = "";
            first_diff(ma, mb, path, sizeof path);
            snprintf(msg, cap, "the manifests of '%s' and '%s' differ at '%s'", a, b, path);
            differ = true;
        }
        cJSON_Delete(ma);
        cJSON_Delete(mb);
    }
    cm_checkpoint_close(ca);
    cm_checkpoint_close(cb);
    return differ;
}

void cmt_assert_checkpoints_equal(const char *a, const char *b, const char *label) {
    char msg[2048];
    if (cmt_checkpoints_differ(a, b, msg, sizeof msg)) cr_assert_fail("%s: %s", label, msg);
}

cmt_resumption_opts cmt_resumption_opts_default(void) {
    return (cmt_resumption_opts){.run = cmt_run_opts_default(), .total_batches = 2, .resume_batch = 1,
                                 .label = "resumption"};
}

static bool model_equal(const char *a, const char *b) {
    cm_checkpoint *ca, *cb;
    cr_assert_eq(cm_checkpoint_open(a, &ca), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_checkpoint_open(b, &cb), CM_OK, "%s", cm_last_error());
    const cm_safetensors *fa = cm_checkpoint_file(ca, CM_CKPT_MODEL_FILE), *fb = cm_checkpoint_file(cb, CM_CKPT_MODEL_FILE);
    bool eq = cm_safetensors_count(fa) == cm_safetensors_count(fb);
    for (size_t i = 0; eq && i < cm_safetensors_count(fa); i++) {
        const cm_st_tensor *x = cm_safetensors_at_sorted(fa, i), *y = cm_safetensors_at_sorted(fb, i);
        eq = !strcmp(x->name, y->name) && x->nbytes == y->nbytes && !memcmp(x->data, y->data, x->nbytes);
    }
    cm_checkpoint_close(ca);
    cm_checkpoint_close(cb);
    return eq;
}

bool cmt_algorithm_resumption_differs(cmt_rig_fn make_rig, void *rig_data, cmt_algos_fn make_algos, void *algos_data,
                                      const cmt_resumption_opts *o, char *msg, size_t cap) {
    cr_assert(o->resume_batch >= 1 && o->resume_batch < o->total_batches, "%s: resume_batch %lld of %lld", o->label,
              (long long)o->resume_batch, (long long)o->total_batches);
    char *dir = cmt_tmpdir();
    char d1[512], d2[512], dur[32], ck[600], ck2[600];
    snprintf(d1, sizeof d1, "%s/folder1", dir);
    snprintf(d2, sizeof d2, "%s/folder2", dir);
    snprintf(dur, sizeof dur, "%lldba", (long long)o->total_batches);
    cmt_run_opts ro = o->run;
    ro.max_duration = dur;
    ro.save_interval = "1ba";

    cmt_rig rig;
    make_rig(&rig, rig_data);
    ro.save_folder = d1, ro.load_path = NULL;
    cmt_run r1 = cmt_run_new(&rig, make_algos, algos_data, &ro);
    cr_assert_eq(cm_trainer_fit(r1.tr, NULL), CM_OK, "%s (%s): uninterrupted fit: %s", o->label, rig.family,
                 cm_last_error());
    cmt_run_free(&r1);
    cmt_rig_free(&rig);

    make_rig(&rig, rig_data);
    snprintf(ck, sizeof ck, "%s/ba%lld", d1, (long long)o->resume_batch);
    ro.save_folder = d2, ro.load_path = ck;
    cmt_run r2 = cmt_run_new(&rig, make_algos, algos_data, &ro);
    cr_assert(cm_trainer_resumed_from(r2.tr), "%s (%s): did not load '%s'", o->label, rig.family, ck);
    cr_assert_eq(cm_trainer_fit(r2.tr, NULL), CM_OK, "%s (%s): resumed fit: %s", o->label, rig.family, cm_last_error());
    const char *family = rig.family;
    cmt_run_free(&r2);
    cmt_rig_free(&rig);

    bool differ = false;
    for (int64_t b = o->resume_batch + 1; !differ && b <= o->total_batches; b++) {
        snprintf(ck, sizeof ck, "%s/ba%lld", d1, (long long)b);
        snprintf(ck2, sizeof ck2, "%s/ba%lld", d2, (long long)b);
        char why[2048];
        if ((differ = cmt_checkpoints_differ(ck, ck2, why, sizeof why)))
            snprintf(msg, cap, "%s (%s), resumed from batch %lld: the checkpoints of batch %lld differ: %s", o->label,
                     family, (long long)o->resume_batch, (long long)b, why);
    }
    snprintf(ck, sizeof ck, "%s/ba%lld", d1, (long long)o->resume_batch);
    snprintf(ck2, sizeof ck2, "%s/ba%lld", d1, (long long)o->total_batches);
    cr_assert(!model_equal(ck, ck2), "%s: the model did not change between batch %lld and %lld", o->label,
              (long long)o->resume_batch, (long long)o->total_batches);
    cmt_rmtree(dir);
    free(dir);
    return differ;
}

void cmt_check_algorithm_resumption(cmt_rig_fn make_rig, void *rig_data, cmt_algos_fn make_algos, void *algos_data,
                                    const cmt_resumption_opts *o) {
    char msg[3000];
    if (cmt_algorithm_resumption_differs(make_rig, rig_data, make_algos, algos_data, o, msg, sizeof msg))
        cr_assert_fail("%s", msg);
}
