/* The data methods inside the trainer, on every model family each applies to (tests/util/cmdata.h):
 * a few batches of fit, fit again, and Composer's resumption test (checkpoint at batch 1, resume,
 * later checkpoints bit for bit equal); what each method does to the batch the model sees; and the
 * error each gives on a model or batch it cannot apply to, naming what it looked for. */
#include "cmdata.h"
#include "cmtest.h"

#include <composer/data_algos.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- algorithm makers (data: a config of the method) ---- */

#define MAKER(fn, type, ctor)                                                   \
    static int fn(cm_algorithm_plugin *out, int cap, void *data) {              \
        cr_assert_eq(ctor((const type *)data, &out[0]), CM_OK, "%s", cm_last_error()); \
        return 1;                                                               \
    }
MAKER(mk_mixup, cm_mixup_config, cm_mixup_new)
MAKER(mk_cutmix, cm_cutmix_config, cm_cutmix_new)
MAKER(mk_cutout, cm_cutout_config, cm_cutout_new)
MAKER(mk_ls, cm_label_smoothing_config, cm_label_smoothing_new)
MAKER(mk_pr, cm_progressive_resizing_config, cm_progressive_resizing_new)
MAKER(mk_slw, cm_seq_length_warmup_config, cm_seq_length_warmup_new)
MAKER(mk_sb, cm_selective_backprop_config, cm_selective_backprop_new)
MAKER(mk_colout, cm_colout_config, cm_colout_new)
MAKER(mk_alibi, cm_alibi_config, cm_alibi_new)

static void fit_and_resume(cda_family f, cda_algos_fn mk, void *cfg, const char *label) {
    cda_run_opts o = cda_run_opts_default();
    cda_check_fit_twice(f, mk, cfg, &o, label);
    cda_check_resumption(f, mk, cfg, &o, 3, 1, label);
}

/* A run whose trainer is expected to fail on the first batch (or at INIT) with `status` and a
 * message containing each of the given strings (NULL-terminated). */
static void expect_failure(cda_family f, cda_algos_fn mk, void *cfg, cm_status status, const char *const *needles) {
    cda_run_opts o = cda_run_opts_default();
    cda_rig rig = cda_rig_new(f, &o.rig);
    cm_algorithm_plugin ap;
    cr_assert_eq(mk(&ap, 1, cfg), 1);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = rig.model;
    c.train_dataloader = rig.dl;
    c.max_duration = cm_time_make(1, CM_TIME_BATCH);
    c.algorithms = &ap, c.n_algorithms = 1;
    c.handle_signals = false;
    cm_trainer *tr = NULL;
    cm_status s = cm_trainer_new(&c, &tr);
    if (s) cm_algorithm_plugin_free(ap); /* refused at INIT: not taken */
    if (!s) s = cm_trainer_fit(tr, NULL);
    cr_expect_eq(s, status, "%s: status %s, want %s: %s", cda_family_name(f), cm_status_name(s), cm_status_name(status),
                 cm_last_error());
    for (const char *const *n = needles; *n; n++)
        cr_expect(strstr(cm_last_error(), *n), "%s: message lacks '%s': %s", cda_family_name(f), *n, cm_last_error());
    cm_trainer_free(tr);
    cda_rig_free(&rig);
}

/* A callback recording, on BEFORE_FORWARD, the shape of a field of the model batch, and the
 * number of rows, per microbatch. */
typedef struct {
    const char *field;
    int64_t dims[16][4];
    int n;
} shapes;
static cm_status sh_run(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    shapes *s = self;
    if (ev != CM_EVENT_BEFORE_FORWARD || s->n == 16) return CM_OK;
    cm_tensor *t = cm_model_batch_field(cm_state_model_batch(st), s->field);
    for (int d = 0; d < 4; d++) s->dims[s->n][d] = d < cm_tensor_ndim(t) ? cm_tensor_dim(t, d) : 0;
    s->n++;
    return CM_OK;
}
static const cm_callback_i shapes_vt = {CM_CALLBACK_ABI, "Shapes", sh_run, NULL, NULL, NULL, NULL};

/* Runs `batches` batches of family f with one algorithm and a Shapes callback on `field`. */
static cda_run run_with_shapes(cda_family f, cda_algos_fn mk, void *cfg, const char *dur, shapes *sh) {
    cda_run_opts o = cda_run_opts_default();
    o.max_duration = dur;
    o.save_interval = NULL;
    cda_run r = cda_run_new(f, mk, cfg, &o);
    cm_callback_plugin cb = {&shapes_vt, sh};
    cr_assert_eq(cm_engine_add_callback(cm_trainer_engine(r.tr), cb), CM_OK);
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_OK, "%s", cm_last_error());
    return r;
}

/* ---- MixUp ---- */

Test(data_algos_train, mixup_fits_and_resumes_on_images_and_vectors) {
    cm_mixup_config c = cm_mixup_config_default();
    fit_and_resume(CDA_RESNET, mk_mixup, &c, "MixUp");
    fit_and_resume(CDA_MLP, mk_mixup, &c, "MixUp");
    c.interpolate_loss = true;
    fit_and_resume(CDA_CNN, mk_mixup, &c, "MixUp (interpolate_loss)");
    /* microbatches: pairs within each microbatch, as Composer */
    cda_run_opts o = cda_run_opts_default();
    o.microbatch = 3;
    cda_check_fit_twice(CDA_RESNET, mk_mixup, &c, &o, "MixUp (microbatches of 3)");
}

Test(data_algos_train, mixup_refuses_token_ids_and_unknown_keys) {
    cm_mixup_config c = cm_mixup_config_default();
    expect_failure(CDA_GPT2, mk_mixup, &c, CM_ERR_DTYPE,
                   (const char *const[]){"MixUp", "'input_ids'", "(8, 16) i32", "f32 inputs", NULL});
    c.input_key = "pixels";
    expect_failure(CDA_RESNET, mk_mixup, &c, CM_ERR_NOT_FOUND,
                   (const char *const[]){"MixUp", "no field 'pixels'", "input_key", "image, label", NULL});
    c.input_key = NULL, c.alpha = -1;
    cm_algorithm_plugin p;
    cr_expect_eq(cm_mixup_new(&c, &p), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "alpha -1"), "%s", cm_last_error());
}

/* The model sees mixed inputs: with alpha large the images differ from the loader's. The mixed
 * training loss differs from the plain run's on the same first batch. */
Test(data_algos_train, mixup_changes_the_loss_but_not_the_data_when_alpha_is_0) {
    cda_run_opts o = cda_run_opts_default();
    o.max_duration = "1ba", o.save_interval = NULL;
    cda_run plain = cda_run_new(CDA_RESNET, NULL, NULL, &o);
    cr_assert_eq(cm_trainer_fit(plain.tr, NULL), CM_OK, "%s", cm_last_error());
    cm_mixup_config c = cm_mixup_config_default();
    c.alpha = 0; /* mixing 0: the input is x itself and the targets one-hot: the same loss */
    cda_run zero = cda_run_new(CDA_RESNET, mk_mixup, &c, &o);
    cr_assert_eq(cm_trainer_fit(zero.tr, NULL), CM_OK, "%s", cm_last_error());
    c.alpha = 2;
    cda_run mixed = cda_run_new(CDA_RESNET, mk_mixup, &c, &o);
    cr_assert_eq(cm_trainer_fit(mixed.tr, NULL), CM_OK, "%s", cm_last_error());
    double lp, lz, lm;
    cr_assert_eq(cm_in_memory_logger_last(plain.mem, "loss/train/total", &lp), CM_OK);
    cr_assert_eq(cm_in_memory_logger_last(zero.mem, "loss/train/total", &lz), CM_OK);
    cr_assert_eq(cm_in_memory_logger_last(mixed.mem, "loss/train/total", &lm), CM_OK);
    cr_expect(fabs(lp - lz) < 1e-6, "alpha 0: loss %g vs plain %g", lz, lp);
    cr_expect(fabs(lp - lm) > 1e-4, "alpha 2: loss %g equals the plain %g", lm, lp);
    cda_run_free(&plain), cda_run_free(&zero), cda_run_free(&mixed);
}

/* ---- CutMix ---- */

Test(data_algos_train, cutmix_fits_and_resumes_on_images) {
    cm_cutmix_config c = cm_cutmix_config_default();
    fit_and_resume(CDA_RESNET, mk_cutmix, &c, "CutMix");
    c.uniform_sampling = true, c.interpolate_loss = true;
    fit_and_resume(CDA_CNN, mk_cutmix, &c, "CutMix (uniform, interpolate_loss)");
}

Test(data_algos_train, cutmix_refuses_non_images) {
    cm_cutmix_config c = cm_cutmix_config_default();
    expect_failure(CDA_MLP, mk_cutmix, &c, CM_ERR_SHAPE,
                   (const char *const[]){"CutMix", "'input'", "(8, 8) f32", "(N, C, H, W)", NULL});
}

/* ---- CutOut ---- */

Test(data_algos_train, cutout_fits_and_resumes_on_images_and_zeroes_a_square) {
    cm_cutout_config c = cm_cutout_config_default();
    fit_and_resume(CDA_RESNET, mk_cutout, &c, "CutOut");
    c.num_holes = 2, c.uniform_sampling = true;
    fit_and_resume(CDA_CNN, mk_cutout, &c, "CutOut (2 holes, uniform)");
    expect_failure(CDA_MLP, mk_cutout, &c, CM_ERR_SHAPE, (const char *const[]){"CutOut", "'input'", "images", NULL});
    expect_failure(CDA_GPT2, mk_cutout, &c, CM_ERR_SHAPE, (const char *const[]){"CutOut", "'input_ids'", NULL});
}

/* ---- LabelSmoothing ---- */

/* On AFTER_LOSS (after LabelSmoothing's own AFTER_LOSS: callbacks run after algorithms) the label
 * field is the original again; the loss equals the cross-entropy against smoothed targets. */
typedef struct {
    double worst;
    int restored, n;
} lsprobe;
static cm_status lsp_run(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    lsprobe *p = self;
    if (ev != CM_EVENT_AFTER_LOSS) return CM_OK;
    const cm_model_batch *mb = cm_state_model_batch(st);
    cm_tensor *y = cm_model_batch_field(mb, "label"), *x = cm_state_outputs(st);
    p->restored += cm_tensor_dtype(y) == CM_DTYPE_I64 && cm_tensor_ndim(y) == 1;
    const int64_t N = cm_tensor_dim(x, 0), C = cm_tensor_dim(x, 1);
    double want = 0;
    for (int64_t i = 0; i < N; i++) {
        double mx = -INFINITY, se = 0, mean = 0;
        for (int64_t c = 0; c < C; c++) mx = fmax(mx, cm_tensor_get_flat(x, i * C + c));
        for (int64_t c = 0; c < C; c++) se += exp(cm_tensor_get_flat(x, i * C + c) - mx);
        for (int64_t c = 0; c < C; c++) mean += cm_tensor_get_flat(x, i * C + c) / (double)C;
        const double lse = mx + log(se), xt = cm_tensor_get_flat(x, i * C + (int64_t)cm_tensor_get_flat(y, i));
        want += (0.8 * (lse - xt) + 0.2 * (lse - mean)) / (double)N; /* smoothing 0.2 */
    }
    p->worst = fmax(p->worst, fabs(want - cm_tensor_get_flat(cm_state_loss(st), 0)));
    p->n++;
    return CM_OK;
}
static const cm_callback_i lsprobe_vt = {CM_CALLBACK_ABI, "LSProbe", lsp_run, NULL, NULL, NULL, NULL};

Test(data_algos_train, label_smoothing_smooths_the_loss_restores_the_labels_and_resumes) {
    cm_label_smoothing_config c = cm_label_smoothing_config_default();
    fit_and_resume(CDA_RESNET, mk_ls, &c, "LabelSmoothing");
    fit_and_resume(CDA_MLP, mk_ls, &c, "LabelSmoothing");
    c.smoothing = 0.2;
    cda_run_opts o = cda_run_opts_default();
    o.max_duration = "2ba", o.save_interval = NULL, o.microbatch = 4;
    cda_run r = cda_run_new(CDA_CNN, mk_ls, &c, &o);
    lsprobe p = {0, 0, 0};
    cm_callback_plugin cb = {&lsprobe_vt, &p};
    cr_assert_eq(cm_engine_add_callback(cm_trainer_engine(r.tr), cb), CM_OK);
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_expect_eq(p.n, 4);
    cr_expect_eq(p.restored, 4, "labels restored after the loss in %d of 4 microbatches", p.restored);
    cr_expect_leq(p.worst, 1e-5, "loss vs smoothed cross-entropy: off by %g (tolerance 1e-5)", p.worst);
    cda_run_free(&r);
    expect_failure(CDA_GPT2, mk_ls, &c, CM_ERR_SHAPE,
                   (const char *const[]){"LabelSmoothing", "not class logits (N, C)", "'labels'", "classifiers", NULL});
}

/* ---- ProgressiveResizing ---- */

Test(data_algos_train, progressive_resizing_grows_the_images_and_resumes) {
    cm_progressive_resizing_config c = cm_progressive_resizing_config_default();
    c.delay_fraction = 0, c.finetune_fraction = 0; /* scales 0.5, 2/3, 5/6 over 3 batches */
    shapes sh = {"image", {{0}}, 0};
    cda_run r = run_with_shapes(CDA_RESNET, mk_pr, &c, "3ba", &sh);
    cr_assert_eq(sh.n, 3);
    /* 16 wide: round(16·s/4)·4 = 8, 12, 12 */
    const int64_t want[3] = {8, 12, 12};
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(sh.dims[i][2], want[i], "batch %d: height %lld, want %lld", i, (long long)sh.dims[i][2],
                     (long long)want[i]);
        cr_expect_eq(sh.dims[i][3], want[i]);
    }
    double sf;
    cr_expect_eq(cm_in_memory_logger_last(r.mem, "progressive_resizing/scale_factor", &sf), CM_OK);
    cr_expect(fabs(sf - (0.5 + 0.5 * 2.0 / 3.0)) < 1e-12, "scale_factor %g", sf);
    cr_expect_eq(cm_in_memory_logger_count(r.mem, "progressive_resizing/width"), 3);
    cda_run_free(&r);
    fit_and_resume(CDA_RESNET, mk_pr, &c, "ProgressiveResizing");
    c.mode = CM_RESIZE_MODE_CROP;
    fit_and_resume(CDA_RESNET, mk_pr, &c, "ProgressiveResizing (crop)");
}

Test(data_algos_train, progressive_resizing_errors_name_what_they_need) {
    cm_progressive_resizing_config c = cm_progressive_resizing_config_default();
    c.delay_fraction = 0;
    expect_failure(CDA_GPT2, mk_pr, &c, CM_ERR_SHAPE,
                   (const char *const[]){"ProgressiveResizing", "'input_ids'", "(N, C, H, W)", NULL});
    /* the MNIST CNN has a fixed-size fc layer: smaller images fail in the model, which says so */
    expect_failure(CDA_CNN, mk_pr, &c, CM_ERR_SHAPE, (const char *const[]){"fit", NULL});
    cm_algorithm_plugin p;
    c.delay_fraction = 0.9, c.finetune_fraction = 0.2;
    cr_expect_eq(cm_progressive_resizing_new(&c, &p), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "delay_fraction + finetune_fraction"), "%s", cm_last_error());
    c = cm_progressive_resizing_config_default();
    c.size_increment = 0;
    cr_expect_eq(cm_progressive_resizing_new(&c, &p), CM_ERR_INVALID_ARG);
}

/* ---- SeqLengthWarmup ---- */

Test(data_algos_train, seq_length_warmup_truncates_then_grows_and_resumes_on_gpt2_and_bert) {
    cm_seq_length_warmup_config c = cm_seq_length_warmup_config_default();
    c.duration = 1.0, c.min_seq_length = 4, c.max_seq_length = 16, c.step_size = 4; /* 4, 8, 12 */
    shapes sh = {"input_ids", {{0}}, 0};
    cda_run r = run_with_shapes(CDA_GPT2, mk_slw, &c, "3ba", &sh);
    cr_assert_eq(sh.n, 3);
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(sh.dims[i][0], 8);
        cr_expect_eq(sh.dims[i][1], 4 * (i + 1), "batch %d: length %lld", i, (long long)sh.dims[i][1]);
    }
    /* time counts the tokens trained: 8 rows of 4, 8 and 12 */
    cr_expect_eq(cm_state_timestamp(cm_trainer_state(r.tr))->token, 8 * (4 + 8 + 12));
    double len;
    cr_expect_eq(cm_in_memory_logger_last(r.mem, "seq_length_warmup/curr_seq_len", &len), CM_OK);
    cr_expect_eq(len, 12);
    cda_run_free(&r);
    fit_and_resume(CDA_GPT2, mk_slw, &c, "SeqLengthWarmup");
    fit_and_resume(CDA_BERT, mk_slw, &c, "SeqLengthWarmup");
    c.preserve_end_of_sequence = true;
    fit_and_resume(CDA_BERT, mk_slw, &c, "SeqLengthWarmup (preserve_end_of_sequence)");
}

Test(data_algos_train, seq_length_warmup_reshape_makes_more_shorter_rows) {
    cm_seq_length_warmup_config c = cm_seq_length_warmup_config_default();
    c.duration = 1.0, c.min_seq_length = 4, c.max_seq_length = 16, c.step_size = 4, c.truncate = false;
    shapes sh = {"input_ids", {{0}}, 0};
    cda_run r = run_with_shapes(CDA_GPT2, mk_slw, &c, "2ba", &sh);
    cr_assert_eq(sh.n, 2);
    cr_expect(sh.dims[0][0] == 32 && sh.dims[0][1] == 4, "batch 0: (%lld, %lld), want (32, 4)", (long long)sh.dims[0][0],
              (long long)sh.dims[0][1]);
    cr_expect(sh.dims[1][0] == 16 && sh.dims[1][1] == 8, "batch 1: (%lld, %lld), want (16, 8)", (long long)sh.dims[1][0],
              (long long)sh.dims[1][1]);
    /* samples count the new rows, as Composer counts the reshaped batch */
    cr_expect_eq(cm_state_timestamp(cm_trainer_state(r.tr))->sample, 32 + 16);
    cda_run_free(&r);
    fit_and_resume(CDA_GPT2, mk_slw, &c, "SeqLengthWarmup (reshape)");
}

/* ---- ALiBi's train_sequence_length_scaling (a surgery method with a data side) ---- */

/* SeqLengthWarmup (4, 8, 12 over three batches) and ALiBi at 0.5, in that order */
static int mk_slw_alibi(cm_algorithm_plugin *out, int cap, void *data) {
    cm_seq_length_warmup_config w = cm_seq_length_warmup_config_default();
    w.duration = 1.0, w.min_seq_length = 4, w.max_seq_length = 16, w.step_size = 4;
    cm_alibi_config a = cm_alibi_config_default();
    a.max_sequence_length = 16, a.train_sequence_length_scaling = 0.5;
    cr_assert_eq(cm_seq_length_warmup_new(&w, &out[0]), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_alibi_new(&a, &out[1]), CM_OK, "%s", cm_last_error());
    return 2;
}

Test(data_algos_train, alibi_trains_on_shorter_rows_of_the_same_tokens_and_resumes) {
    cm_alibi_config c = cm_alibi_config_default(); /* Composer's default scaling, 0.25 */
    c.max_sequence_length = 16;
    shapes sh = {"input_ids", {{0}}, 0};
    cda_run r = run_with_shapes(CDA_GPT2, mk_alibi, &c, "2ba", &sh);
    cr_assert_eq(sh.n, 2);
    for (int i = 0; i < 2; i++) /* (8, 16) -> (int(8 / 0.25), int(16 · 0.25)) */
        cr_expect(sh.dims[i][0] == 32 && sh.dims[i][1] == 4, "batch %d: (%lld, %lld), want (32, 4)", i,
                  (long long)sh.dims[i][0], (long long)sh.dims[i][1]);
    const cm_timestamp *ts = cm_state_timestamp(cm_trainer_state(r.tr));
    cr_expect_eq(ts->sample, 2 * 32, "samples count the reshaped rows, as Composer's");
    cr_expect_eq(ts->token, 2 * 8 * 16, "the same tokens");
    double len, bs;
    cr_expect_eq(cm_in_memory_logger_last(r.mem, "alibi/train_seq_len", &len), CM_OK);
    cr_expect_eq(cm_in_memory_logger_last(r.mem, "alibi/train_bs", &bs), CM_OK);
    cr_expect(len == 4 && bs == 32, "logged %g x %g", bs, len);
    cda_run_free(&r);
    fit_and_resume(CDA_GPT2, mk_alibi, &c, "Alibi (train_sequence_length_scaling 0.25)");
    /* with SeqLengthWarmup, as Composer's GPT recipe. AFTER_ events run the algorithms in reverse
     * (Composer's set_filo_order), so ALiBi, listed second, reshapes (8, 16) to (16, 8) first and
     * the warmup then cuts that to 4, 8 and (12 >= 8: as it is) 8 */
    shapes both = {"input_ids", {{0}}, 0};
    r = run_with_shapes(CDA_GPT2, mk_slw_alibi, NULL, "3ba", &both);
    cr_assert_eq(both.n, 3);
    for (int i = 0; i < 3; i++) {
        const int want = i == 0 ? 4 : 8;
        cr_expect(both.dims[i][0] == 16 && both.dims[i][1] == want, "batch %d: (%lld, %lld), want (16, %d)", i,
                  (long long)both.dims[i][0], (long long)both.dims[i][1], want);
    }
    cda_run_free(&r);
    fit_and_resume(CDA_GPT2, mk_slw_alibi, NULL, "SeqLengthWarmup + Alibi (0.5)");
    /* sizes that do not reshape exactly are an error naming them */
    c.train_sequence_length_scaling = 0.3; /* int(8 / 0.3) x int(16 · 0.3) = 26 x 4 != 128 */
    expect_failure(CDA_GPT2, mk_alibi, &c, CM_ERR_SHAPE,
                   (const char *const[]){"train_sequence_length_scaling 0.3 cannot reshape a batch of 8 rows of 16",
                                         "26 rows of 4", NULL});
    c.train_sequence_length_scaling = 0.5;
    fit_and_resume(CDA_BERT, mk_alibi, &c, "Alibi (train_sequence_length_scaling 0.5) on BERT's masked LM");
}

/* The full-length pass claims the arena first: with it, the arena's peak is reached in batch 0
 * (the later, longer batches never grow it past that); under automatic microbatching it settles
 * the microbatch size for the longest sequences before the first (short) batch trains. */
Test(data_algos_train, seq_length_warmup_claims_memory_at_full_length_first) {
    cm_seq_length_warmup_config c = cm_seq_length_warmup_config_default();
    c.duration = 1.0, c.min_seq_length = 4, c.max_seq_length = 16, c.step_size = 4;
    cda_run_opts o = cda_run_opts_default();
    o.max_duration = "1ba", o.save_interval = NULL;
    cda_run plain = cda_run_new(CDA_GPT2, NULL, NULL, &o); /* full-length batches */
    cr_assert_eq(cm_trainer_fit(plain.tr, NULL), CM_OK, "%s", cm_last_error());
    const size_t full = cm_arena_peak(cm_tape_arena(cm_state_tape(cm_trainer_state(plain.tr))));
    cda_run_free(&plain);
    cda_run r = cda_run_new(CDA_GPT2, mk_slw, &c, &o); /* one batch of length 4 after the pass */
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_OK, "%s", cm_last_error());
    const size_t peak = cm_arena_peak(cm_tape_arena(cm_state_tape(cm_trainer_state(r.tr))));
    cr_expect_geq(peak, full, "after one short batch the arena peaked at %zu, the full-length step needs %zu", peak, full);
    cr_expect_eq(cm_state_timestamp(cm_trainer_state(r.tr))->token, 8 * 4, "the pass is not counted");
    cda_run_free(&r);
}

Test(data_algos_train, seq_length_warmup_refuses_images_and_token_durations) {
    cm_seq_length_warmup_config c = cm_seq_length_warmup_config_default();
    expect_failure(CDA_RESNET, mk_slw, &c, CM_ERR_INVALID_ARG,
                   (const char *const[]){"SeqLengthWarmup", "no 'input_ids'", "image, label", "GPT-2, BERT", NULL});
    cm_algorithm_plugin p;
    c.max_seq_length = 4;
    cr_expect_eq(cm_seq_length_warmup_new(&c, &p), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "max_seq_length=4 must be greater than min_seq_length=8"), "%s", cm_last_error());
    c = cm_seq_length_warmup_config_default();
    c.duration = 1.5;
    cr_expect_eq(cm_seq_length_warmup_new(&c, &p), CM_ERR_INVALID_ARG);
}

/* ---- SelectiveBackprop ---- */

Test(data_algos_train, selective_backprop_keeps_half_the_rows_and_resumes) {
    cm_selective_backprop_config c = cm_selective_backprop_config_default();
    c.start = 0, c.end = 1, c.interrupt = 0;
    shapes sh = {"image", {{0}}, 0};
    cda_run r = run_with_shapes(CDA_RESNET, mk_sb, &c, "2ba", &sh);
    cr_assert_eq(sh.n, 2);
    cr_expect_eq(sh.dims[0][0], 4, "the step trains int(0.5·8) = 4 rows, got %lld", (long long)sh.dims[0][0]);
    cr_expect_eq(cm_state_timestamp(cm_trainer_state(r.tr))->sample, 8, "time counts the kept samples");
    cda_run_free(&r);
    fit_and_resume(CDA_RESNET, mk_sb, &c, "SelectiveBackprop");
    fit_and_resume(CDA_MLP, mk_sb, &c, "SelectiveBackprop");
    fit_and_resume(CDA_GPT2, mk_sb, &c, "SelectiveBackprop (per-sequence token losses)");
    c.scale_factor = 0.5, c.interrupt = 2;
    fit_and_resume(CDA_RESNET, mk_sb, &c, "SelectiveBackprop (downscaled selection)");
}

Test(data_algos_train, selective_backprop_interval_and_interrupt_follow_composer) {
    cm_selective_backprop_config c = cm_selective_backprop_config_default(); /* 0.5 .. 0.9, interrupt 2 */
    shapes sh = {"image", {{0}}, 0};
    cda_run_opts o = cda_run_opts_default();
    o.rig.batches_per_epoch = 10;
    o.max_duration = "10ba", o.save_interval = NULL;
    cda_run r = cda_run_new(CDA_RESNET, mk_sb, &c, &o);
    cm_callback_plugin cb = {&shapes_vt, &sh};
    cr_assert_eq(cm_engine_add_callback(cm_trainer_engine(r.tr), cb), CM_OK);
    cr_assert_eq(cm_trainer_fit(r.tr, NULL), CM_OK, "%s", cm_last_error());
    cr_assert_eq(sh.n, 10);
    for (int b = 0; b < 10; b++) {
        const bool sel = cm_should_selective_backprop(b / 10.0, b, 0.5, 0.9, 2);
        cr_expect_eq(sh.dims[b][0], sel ? 4 : 8, "batch %d: %lld rows", b, (long long)sh.dims[b][0]);
    }
    cda_run_free(&r);
    c.scale_factor = 0.5, c.start = 0, c.interrupt = 0;
    expect_failure(CDA_MLP, mk_sb, &c, CM_ERR_SHAPE,
                   (const char *const[]){"SelectiveBackprop", "scale_factor 0.5", "'input' is (8, 8) f32", NULL});
}

/* ---- ColOut ---- */

Test(data_algos_train, colout_drops_rows_and_columns_and_resumes) {
    cm_colout_config c = cm_colout_config_default();
    shapes sh = {"image", {{0}}, 0};
    cda_run r = run_with_shapes(CDA_RESNET, mk_colout, &c, "1ba", &sh);
    cr_expect(sh.dims[0][2] == 13 && sh.dims[0][3] == 13, "int(0.85·16) = 13: got %lld x %lld", (long long)sh.dims[0][2],
              (long long)sh.dims[0][3]);
    cda_run_free(&r);
    fit_and_resume(CDA_RESNET, mk_colout, &c, "ColOut");
    c.batch = false;
    fit_and_resume(CDA_RESNET, mk_colout, &c, "ColOut (per sample)");
    expect_failure(CDA_MLP, mk_colout, &c, CM_ERR_SHAPE, (const char *const[]){"ColOut", "'input'", "(N, C, H, W)", NULL});
    cm_algorithm_plugin p;
    c.resize_target = CM_RESIZE_TARGET_YES;
    cr_expect_eq(cm_colout_new(&c, &p), CM_ERR_UNSUPPORTED);
    c = cm_colout_config_default();
    c.p_row = 1.5;
    cr_expect_eq(cm_colout_new(&c, &p), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "p_row must be between 0 and 1"), "%s", cm_last_error());
}

/* ---- all of them at once ---- */

Test(data_algos_train, every_image_method_composes_on_a_resnet_and_every_token_method_on_gpt2) {
    cda_run_opts o = cda_run_opts_default();
    o.microbatch = 2;
    cda_check_fit_twice(CDA_RESNET, cda_image_methods, NULL, &o, "all image methods");
    cda_check_resumption(CDA_RESNET, cda_image_methods, NULL, &o, 3, 1, "all image methods");
    cda_check_fit_twice(CDA_GPT2, cda_token_methods, NULL, &o, "all token methods");
    cda_check_resumption(CDA_GPT2, cda_token_methods, NULL, &o, 3, 1, "all token methods");
}

/* ---- checkpoint state ---- */

Test(data_algos_train, stateful_methods_save_what_they_applied_and_check_what_they_load) {
    cm_algorithm_plugin a[2];
    cr_assert_eq(cm_seq_length_warmup_new(NULL, &a[0]), CM_OK);
    cr_assert_eq(cm_progressive_resizing_new(NULL, &a[1]), CM_OK);
    const char *good[2] = {"{\"curr_seq_len\":16,\"curr_bs\":8}", "{\"scale_factor\":0.75,\"height\":24,\"width\":24}"};
    const char *key[2] = {"curr_seq_len", "scale_factor"};
    for (int i = 0; i < 2; i++) {
        char buf[256];
        cr_assert_eq(a[i].vt->load(a[i].self, good[i], strlen(good[i])), CM_OK, "%s", cm_last_error());
        const size_t n = a[i].vt->save(a[i].self, buf, sizeof buf);
        cr_assert_lt(n, sizeof buf);
        cr_expect_str_eq(buf, good[i]);
        cr_expect_eq(a[i].vt->load(a[i].self, "[1]", 3), CM_ERR_FORMAT);
        cr_expect_eq(a[i].vt->load(a[i].self, "{}", 2), CM_ERR_FORMAT);
        cr_expect(strstr(cm_last_error(), key[i]) && strstr(cm_last_error(), a[i].vt->name), "%s", cm_last_error());
        cm_algorithm_plugin_free(a[i]);
    }
}
