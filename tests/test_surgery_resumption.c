/* Every surgery method on every model family it applies to, as Composer's
 * tests/algorithms/test_algorithm_resumption.py does it — and on the methods Composer marks xfail
 * there (StochasticDepth, GyroDropout) too: run A trains 2 batches (4 for the methods that draw at
 * random), fit("1ba") then fit again, saving a checkpoint after every batch; run B starts from a
 * fresh model with fresh plugins, loads A's batch-1 checkpoint and trains on; every later
 * checkpoint of both runs must be
 * bit for bit the same (model, optimizer, RNG counters, timestamp, algorithm records), and A's
 * batch-1 and batch-2 weights must differ. Also the composition of every method that applies to a
 * ResNet, of every method that applies to a GPT-2, and of every one that applies to BERT, in one
 * run each. */
#include "cmsurg.h"
#include "cmtest.h"

#include <math.h>
#include <composer/data_algos.h>
#include <composer/train_algos.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*algs_fn)(cm_algorithm_plugin *out);

static cm_algorithm_plugin make(const char *name, const char *json) {
    cm_algorithm_plugin p;
    cr_assert_eq(cm_algorithm_new_from_json(name, json, &p), CM_OK, "%s: %s", name, cm_last_error());
    return p;
}

/* batches: the runs' length (2, as Composer's test; more for the methods with random draws, so a
 * lost draw state cannot match by chance); every checkpoint after batch 1 is compared. */
static void check_resumption_n(const char *label, cmt_family f, algs_fn algs, cm_precision prec, int batches) {
    char *d1 = cmt_temp_dir(), *d2 = cmt_temp_dir();
    cm_algorithm_plugin a[24];
    cm_optim *opt;
    cm_status s;
    /* run A: fit 1 batch, then fit again to the end */
    cmt_srig r = cmt_srig_new(f, 11);
    cmt_srun o = cmt_srun_default();
    char md[16];
    snprintf(md, sizeof md, "%dba", batches);
    o.max_duration = md;
    o.precision = prec;
    o.save_folder = d1;
    int n = algs(a);
    cm_trainer *tr = cmt_strainer(&r, a, n, &o, &opt, &s);
    cr_assert(tr, "%s on %s: %s", label, cmt_family_name(f), cm_last_error());
    cm_fit_opts fo = cm_fit_opts_default();
    cr_assert_eq(cm_time_parse("1ba", &fo.duration), CM_OK);
    cr_assert_eq(cm_trainer_fit(tr, &fo), CM_OK, "%s on %s: %s", label, cmt_family_name(f), cm_last_error());
    cr_assert_eq(cm_time_parse(batches > 2 ? "3ba" : "1ba", &fo.duration), CM_OK);
    cr_assert_eq(cm_trainer_fit(tr, &fo), CM_OK, "%s on %s (fit again): %s", label, cmt_family_name(f), cm_last_error());
    cr_assert_eq(cm_state_timestamp(cm_trainer_state(tr))->batch, batches, "%s on %s: fit twice trained %d batches",
                 label, cmt_family_name(f), batches);
    const double loss = cm_state_total_loss(cm_trainer_state(tr));
    cr_assert(isfinite(loss), "%s on %s: loss %g", label, cmt_family_name(f), loss);
    cm_trainer_free(tr);
    cmt_srig_free(&r);
    /* run B: a fresh model and fresh plugins from A's batch-1 checkpoint */
    char ck[1024];
    snprintf(ck, sizeof ck, "%s/ba1", d1);
    r = cmt_srig_new(f, 11);
    o.save_folder = d2;
    o.load_path = ck;
    n = algs(a);
    tr = cmt_strainer(&r, a, n, &o, &opt, &s);
    cr_assert(tr, "%s on %s (resumed): %s", label, cmt_family_name(f), cm_last_error());
    cr_assert_eq(cm_trainer_fit(tr, NULL), CM_OK, "%s on %s (resumed): %s", label, cmt_family_name(f), cm_last_error());
    cm_trainer_free(tr);
    cmt_srig_free(&r);
    char a2[1024], b2[1024], what[160];
    for (int b = 2; b <= batches; b++) {
        snprintf(a2, sizeof a2, "%s/ba%d", d1, b);
        snprintf(b2, sizeof b2, "%s/ba%d", d2, b);
        snprintf(what, sizeof what, "%s on %s, batch %d", label, cmt_family_name(f), b);
        cmt_assert_ckpts_equal(a2, b2, what);
    }
    snprintf(a2, sizeof a2, "%s/ba2", d1);
    snprintf(what, sizeof what, "%s on %s", label, cmt_family_name(f));
    cmt_assert_weights_differ(ck, a2, what);
    cmt_rm_rf(d1);
    cmt_rm_rf(d2);
    free(d1);
    free(d2);
}

static void check_resumption(const char *label, cmt_family f, algs_fn algs, cm_precision prec) {
    check_resumption_n(label, f, algs, prec, 2);
}

static int alibi(cm_algorithm_plugin *o) {
    o[0] = make("alibi", "{\"max_sequence_length\": 16, \"train_sequence_length_scaling\": 1}");
    return 1;
}
static int blurpool(cm_algorithm_plugin *o) {
    o[0] = make("blurpool", "{\"min_channels\": 4}");
    return 1;
}
static int blurpool_after(cm_algorithm_plugin *o) {
    o[0] = make("blurpool", "{\"min_channels\": 4, \"blur_first\": false}");
    return 1;
}
static int channels_last(cm_algorithm_plugin *o) {
    o[0] = make("channels_last", NULL);
    return 1;
}
static int sd_basic(cm_algorithm_plugin *o) {
    o[0] = make("stochastic_depth", "{\"target_layer_name\": \"ResNetBasicBlock\", \"drop_rate\": 0.5, "
                                    "\"drop_distribution\": \"uniform\"}");
    return 1;
}
static int sd_warmup(cm_algorithm_plugin *o) {
    o[0] = make("stochastic_depth", "{\"target_layer_name\": \"ResNetBasicBlock\", \"drop_rate\": 0.9, "
                                    "\"drop_warmup\": \"1ba\"}");
    return 1;
}
static int sd_bottleneck_sample(cm_algorithm_plugin *o) {
    o[0] = make("stochastic_depth", "{\"target_layer_name\": \"ResNetBottleneck\", \"stochastic_method\": \"sample\", "
                                    "\"drop_rate\": 0.5}");
    return 1;
}
static int se(cm_algorithm_plugin *o) {
    o[0] = make("squeeze_excite", "{\"latent_channels\": 0.5, \"min_channels\": 4}");
    return 1;
}
static int ghost(cm_algorithm_plugin *o) {
    o[0] = make("ghost_batchnorm", "{\"ghost_batch_size\": 4}");
    return 1;
}
static int lpln(cm_algorithm_plugin *o) {
    o[0] = make("low_precision_layernorm", NULL);
    return 1;
}
static int lpgn(cm_algorithm_plugin *o) {
    o[0] = make("low_precision_groupnorm", "{\"apply_at\": \"after_load\"}");
    return 1;
}
static int fused(cm_algorithm_plugin *o) {
    o[0] = make("fused_layernorm", NULL);
    return 1;
}

Test(surgery_resumption, alibi_on_gpt2_and_bert) {
    check_resumption("Alibi", CMT_GPT2, alibi, CM_PRECISION_FP32);
    check_resumption("Alibi", CMT_BERT, alibi, CM_PRECISION_FP32);
}

Test(surgery_resumption, blurpool_on_resnets) {
    check_resumption("BlurPool", CMT_RESNET_IMNET, blurpool, CM_PRECISION_FP32);
    check_resumption("BlurPool(blur_first=false)", CMT_RESNET, blurpool_after, CM_PRECISION_FP32);
}

Test(surgery_resumption, channels_last_on_resnet_and_cnn) {
    check_resumption("ChannelsLast", CMT_RESNET, channels_last, CM_PRECISION_FP32);
    check_resumption("ChannelsLast", CMT_CNN, channels_last, CM_PRECISION_FP32);
}

Test(surgery_resumption, stochastic_depth_block_with_warmup_and_sample) {
    check_resumption_n("StochasticDepth(block)", CMT_RESNET, sd_basic, CM_PRECISION_FP32, 4);
    check_resumption_n("StochasticDepth(block, warmup)", CMT_RESNET, sd_warmup, CM_PRECISION_FP32, 4);
    check_resumption_n("StochasticDepth(sample)", CMT_RESNET_IMNET, sd_bottleneck_sample, CM_PRECISION_FP32, 4);
}

Test(surgery_resumption, squeeze_excite_on_resnet_and_cnn) {
    check_resumption("SqueezeExcite", CMT_RESNET, se, CM_PRECISION_FP32);
    check_resumption("SqueezeExcite", CMT_CNN, se, CM_PRECISION_FP32);
}

Test(surgery_resumption, ghost_batchnorm_on_resnets) {
    check_resumption("GhostBatchNorm", CMT_RESNET, ghost, CM_PRECISION_FP32);
    check_resumption("GhostBatchNorm", CMT_RESNET_IMNET, ghost, CM_PRECISION_AMP_BF16);
}

Test(surgery_resumption, low_precision_norms_and_fused_layernorm_under_amp) {
    check_resumption("LowPrecisionLayerNorm", CMT_GPT2, lpln, CM_PRECISION_AMP_BF16);
    check_resumption("LowPrecisionLayerNorm", CMT_BERT, lpln, CM_PRECISION_AMP_BF16);
    check_resumption("LowPrecisionGroupNorm(after_load)", CMT_GROUPNORM, lpgn, CM_PRECISION_AMP_BF16);
    check_resumption("FusedLayerNorm", CMT_GPT2, fused, CM_PRECISION_FP32);
}

static int factorize_convs(cm_algorithm_plugin *o) {
    o[0] = make("factorize", "{\"min_channels\": 8, \"latent_channels\": 0.25}");
    return 1;
}
static int factorize_linears(cm_algorithm_plugin *o) {
    o[0] = make("factorize", "{\"min_features\": 8, \"latent_features\": 0.25}");
    return 1;
}
static int glu(cm_algorithm_plugin *o) {
    o[0] = make("gated_linear_units", "{\"gated_layer_bias\": true}");
    return 1;
}
static int ws(cm_algorithm_plugin *o) {
    o[0] = make("weight_standardization", "{\"n_last_layers_ignore\": 1}");
    return 1;
}
static int gyro(cm_algorithm_plugin *o) {
    o[0] = make("gyro_dropout", "{\"p\": 0.5, \"sigma\": 8, \"tau\": 4}");
    return 1;
}

Test(surgery_resumption, factorize_on_resnet_mlp_and_bert) {
    check_resumption("Factorize(convs)", CMT_RESNET_IMNET, factorize_convs, CM_PRECISION_FP32);
    check_resumption("Factorize(linears)", CMT_MLP, factorize_linears, CM_PRECISION_FP32);
    check_resumption("Factorize(linears)", CMT_BERT, factorize_linears, CM_PRECISION_FP32);
}

Test(surgery_resumption, gated_linear_units_on_bert) {
    check_resumption("GatedLinearUnits", CMT_BERT, glu, CM_PRECISION_FP32);
}

Test(surgery_resumption, weight_standardization_on_resnet_and_cnn) {
    check_resumption("WeightStandardization", CMT_RESNET, ws, CM_PRECISION_FP32);
    check_resumption("WeightStandardization", CMT_CNN, ws, CM_PRECISION_FP32);
}

static int noop(cm_algorithm_plugin *o) {
    o[0] = make("no_op_model", NULL);
    return 1;
}

Test(surgery_resumption, no_op_model_on_mlp_and_gpt2) {
    check_resumption("NoOpModel", CMT_MLP, noop, CM_PRECISION_FP32);
    check_resumption("NoOpModel", CMT_GPT2, noop, CM_PRECISION_FP32);
}

Test(surgery_resumption, gyro_dropout_on_mlp) {
    check_resumption_n("GyroDropout", CMT_MLP, gyro, CM_PRECISION_FP32, 4);
}

/* Every method that applies to a ResNet, composed. */
static int resnet_all(cm_algorithm_plugin *o) {
    int n = 0;
    o[n++] = make("blurpool", "{\"min_channels\": 4}");
    o[n++] = make("squeeze_excite", "{\"latent_channels\": 0.5, \"min_channels\": 8}");
    o[n++] = make("ghost_batchnorm", "{\"ghost_batch_size\": 4}");
    o[n++] = make("stochastic_depth", "{\"target_layer_name\": \"ResNetBottleneck\", \"drop_rate\": 0.3}");
    o[n++] = make("channels_last", NULL);
    o[n++] = make("factorize", "{\"min_channels\": 8, \"latent_channels\": 0.25}");
    o[n++] = make("weight_standardization", NULL);
    return n;
}

/* Every method that applies to BERT, composed. */
static int bert_all(cm_algorithm_plugin *o) {
    int n = 0;
    o[n++] = make("low_precision_layernorm", NULL);
    o[n++] = make("alibi", "{\"max_sequence_length\": 16, \"train_sequence_length_scaling\": 1}");
    o[n++] = make("gated_linear_units", NULL);
    o[n++] = make("factorize", "{\"min_features\": 16, \"latent_features\": 0.25}");
    o[n++] = make("fused_layernorm", NULL);
    return n;
}

/* Every method that applies to a GPT-2, composed. */
static int gpt_all(cm_algorithm_plugin *o) {
    int n = 0;
    o[n++] = make("low_precision_layernorm", NULL); /* registered first, runs last */
    o[n++] = make("alibi", "{\"max_sequence_length\": 16, \"train_sequence_length_scaling\": 1}");
    o[n++] = make("fused_layernorm", NULL);
    return n;
}

Test(surgery_resumption, every_resnet_method_composed_and_every_gpt_method_composed) {
    check_resumption("the ResNet methods", CMT_RESNET_IMNET, resnet_all, CM_PRECISION_AMP_BF16);
    check_resumption("the GPT-2 methods", CMT_GPT2, gpt_all, CM_PRECISION_AMP_BF16);
    check_resumption("the BERT methods", CMT_BERT, bert_all, CM_PRECISION_AMP_BF16);
}

/* The training methods of Composer (EMA, SWA, SAM, LayerFreezing, GradientClipping) after the
 * methods of the other kinds in out[0..n); returns the new count. */
static int add_training_methods(cm_algorithm_plugin *o, int n) {
    cm_ema_config ec = cm_ema_config_default();
    ec.half_life = "2ba", ec.update_interval = "1ba";
    cm_ema *ema;
    cr_assert_eq(cm_ema_new(&ec, &ema, &o[n++]), CM_OK, "%s", cm_last_error());
    cm_swa_config wc = cm_swa_config_default();
    wc.swa_start = "0.25dur", wc.swa_end = "0.75dur", wc.update_interval = "1ba";
    cr_assert_eq(cm_swa_new(&wc, &o[n++]), CM_OK, "%s", cm_last_error());
    cm_sam_config sc = cm_sam_config_default();
    sc.interval = 2;
    cr_assert_eq(cm_sam_new(&sc, &o[n++]), CM_OK, "%s", cm_last_error());
    cm_layer_freezing_config lc = cm_layer_freezing_config_default();
    lc.freeze_start = 0.25;
    cr_assert_eq(cm_layer_freezing_new(&lc, &o[n++]), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_grad_clip_new(CM_GRAD_CLIP_NORM, 1.0, &o[n++]), CM_OK, "%s", cm_last_error());
    return n;
}

/* Every method of every kind that applies to a ResNet: surgery, data and training methods. */
static int resnet_every_kind(cm_algorithm_plugin *o) {
    int n = resnet_all(o);
    cm_selective_backprop_config sb = cm_selective_backprop_config_default();
    sb.start = 0, sb.end = 1;
    cm_progressive_resizing_config pr = cm_progressive_resizing_config_default();
    pr.delay_fraction = 0, pr.finetune_fraction = 0;
    const cm_colout_config co = cm_colout_config_default();
    const cm_cutout_config cu = cm_cutout_config_default();
    const cm_mixup_config mu = cm_mixup_config_default();
    const cm_cutmix_config cm = cm_cutmix_config_default();
    const cm_label_smoothing_config ls = cm_label_smoothing_config_default();
    cr_assert_eq(cm_selective_backprop_new(&sb, &o[n++]), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_progressive_resizing_new(&pr, &o[n++]), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_colout_new(&co, &o[n++]), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_cutout_new(&cu, &o[n++]), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_mixup_new(&mu, &o[n++]), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_cutmix_new(&cm, &o[n++]), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_label_smoothing_new(&ls, &o[n++]), CM_OK, "%s", cm_last_error());
    return add_training_methods(o, n);
}

/* Every method of every kind that applies to a GPT-2. */
static int gpt_every_kind(cm_algorithm_plugin *o) {
    int n = gpt_all(o);
    cm_selective_backprop_config sb = cm_selective_backprop_config_default();
    sb.start = 0, sb.end = 1;
    cm_seq_length_warmup_config sl = cm_seq_length_warmup_config_default();
    sl.duration = 1.0, sl.min_seq_length = 4, sl.max_seq_length = 8, sl.step_size = 4;
    cr_assert_eq(cm_selective_backprop_new(&sb, &o[n++]), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_seq_length_warmup_new(&sl, &o[n++]), CM_OK, "%s", cm_last_error());
    return add_training_methods(o, n);
}

Test(surgery_resumption, every_method_of_every_kind_composed_on_a_resnet_and_on_gpt2) {
    /* Composer's whole library in one run per family — model surgery, data methods and training
     * methods together — fits twice and resumes bit for bit (4 batches: SWA, SAM's interval and
     * LayerFreezing all act within them; amp_bf16, so LowPrecisionLayerNorm acts too) */
    check_resumption_n("every ResNet method", CMT_RESNET_IMNET, resnet_every_kind, CM_PRECISION_AMP_BF16, 4);
    check_resumption_n("every GPT-2 method", CMT_GPT2, gpt_every_kind, CM_PRECISION_AMP_BF16, 4);
}
