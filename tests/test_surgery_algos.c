/* The surgery methods on their own (functional forms and plugins): the registry (Composer's names,
 * keys, required_on_load, defaults, JSON arguments in and out, errors naming the closest valid
 * name), and for each method what it changes on the model families it applies to, that applying it
 * again changes nothing, the error naming what it looked for on a model it cannot apply to, and the
 * locked-model error. */
#include "cmsurg.h"
#include "cmtest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *type;
    int64_t n;
} cnt;
static bool cnt_visit(cm_module *m, const char *path, int depth, void *data) {
    cnt *c = data;
    c->n += !strcmp(cm_module_type_name(m), c->type);
    return true;
}
static int64_t n_of(cm_model *m, const char *type) {
    cnt c = {type, 0};
    cm_module_visit(cm_model_module(m), cnt_visit, &c);
    return c.n;
}

/* The model's output on a fixed batch of its rig (eval mode, no gradients), as a new tensor. */
static cm_tensor *fixed_output(cmt_srig *r) {
    cm_batch *b;
    cm_dataloader_config ec = cm_dataloader_config_eval();
    ec.batch_size = 4;
    cm_dataloader *dl;
    cr_assert_eq(cm_dataloader_new(r->ds, &ec, &dl), CM_OK);
    cr_assert_eq(cm_dataloader_next(dl, &b), CM_OK);
    const char *names[CM_DATASET_MAX_FIELDS];
    cm_tensor *fields[CM_DATASET_MAX_FIELDS];
    for (int i = 0; i < b->n_fields; i++) names[i] = b->names[i], fields[i] = b->fields[i];
    cm_model_batch mb = {names, fields, b->n_fields, b->n_rows, 0};
    cm_tape *tp = cmt_tape();
    cm_tape_set_grad_enabled(tp, false);
    cm_module *root = cm_model_module(r->model);
    const bool tr = cm_module_is_training(root);
    cm_module_train(root, false);
    cm_tensor *y = cm_model_forward(r->model, tp, &mb);
    cr_assert(y, "%s", cm_tape_error(tp));
    cm_tensor *out;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, cm_tensor_ndim(y), cm_tensor_shape(y), &out), CM_OK);
    cm_tensor_copy(out, y);
    cm_module_train(root, tr);
    cm_tape_free(tp);
    cm_dataloader_free(dl);
    return out;
}

static double max_diff(const cm_tensor *a, const cm_tensor *b) {
    double d = 0;
    for (int64_t i = 0; i < cm_tensor_numel(a); i++) d = fmax(d, fabs(cm_tensor_get_flat(a, i) - cm_tensor_get_flat(b, i)));
    return d;
}

/* ---- the registry ---- */

Test(surgery_algos, registry_has_composers_names_keys_and_required_on_load) {
    struct {
        const char *name, *key;
        bool required;
    } want[] = {{"Alibi", "alibi", true},
                {"BlurPool", "blurpool", true},
                {"ChannelsLast", "channels_last", false},
                {"Factorize", "factorize", true},
                {"FusedLayerNorm", "fused_layernorm", false},
                {"GatedLinearUnits", "gated_linear_units", true},
                {"GhostBatchNorm", "ghost_batchnorm", true},
                {"GyroDropout", "gyro_dropout", true},
                {"LowPrecisionGroupNorm", "low_precision_groupnorm", true},
                {"LowPrecisionLayerNorm", "low_precision_layernorm", true},
                {"NoOpModel", "no_op_model", true},
                {"SqueezeExcite", "squeeze_excite", true},
                {"StochasticDepth", "stochastic_depth", true},
                {"WeightStandardization", "weight_standardization", true}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const cm_algorithm_info *a = cm_algorithm_info_find(want[i].name), *b = cm_algorithm_info_find(want[i].key);
        cr_assert(a && a == b, "%s / %s", want[i].name, want[i].key);
        cr_expect_str_eq(a->key, want[i].key);
        cr_expect_eq(a->required_on_load, want[i].required, "%s", want[i].name);
        /* every method is made from "{}" but those with a required argument */
        cm_algorithm_plugin p;
        bool needs = false;
        for (int k = 0; k < a->n_args; k++) needs = needs || !cm_algorithm_info_arg(a, k)->def;
        cm_status s = cm_algorithm_new_from_json(a->name, "{}", &p);
        if (needs) {
            cr_expect_eq(s, CM_ERR_INVALID_ARG, "%s", a->name);
            cr_expect(strstr(cm_last_error(), "is required"), "%s", cm_last_error());
            continue;
        }
        cr_assert_eq(s, CM_OK, "%s: %s", a->name, cm_last_error());
        cr_expect_str_eq(p.vt->name, a->name);
        cr_expect_eq(cm_algorithm_info_of(p.vt), a);
        cm_algorithm_plugin_free(p);
    }
    cr_expect_eq(cm_algorithm_info_count(), (int)(sizeof want / sizeof *want));
    cr_expect_null(cm_algorithm_info_find("GradientClipping"), "only the surgery methods are here");
}

/* The argument tables' default texts (what YAML reads) and the configs' _default() (what C and
 * JSON get) agree: the method made from every default written out prints the same arguments as
 * the one made from "{}". */
Test(surgery_algos, the_default_texts_and_the_config_defaults_agree) {
    for (int i = 0; i < cm_algorithm_info_count(); i++) {
        const cm_algorithm_info *info = cm_algorithm_info_at(i);
        char json[1024] = "{", req[256] = "";
        for (int k = 0; k < info->n_args; k++) {
            const cm_algo_arg *a = cm_algorithm_info_arg(info, k);
            const char *v = a->def;
            if (!v) { /* a required argument: the same value on both sides */
                v = a->kind == CM_ALGO_ARG_CHOICE ? a->choices[0] : "16";
                snprintf(req + strlen(req), sizeof req - strlen(req), "%s\"%s\":%s%s%s", req[0] ? "," : "", a->name,
                         a->kind == CM_ALGO_ARG_CHOICE ? "\"" : "", v, a->kind == CM_ALGO_ARG_CHOICE ? "\"" : "");
            }
            const bool quote = (a->kind == CM_ALGO_ARG_CHOICE && strcmp(v, "null")) || a->kind == CM_ALGO_ARG_TIME;
            snprintf(json + strlen(json), sizeof json - strlen(json), "%s\"%s\":%s%s%s", k ? "," : "", a->name,
                     quote ? "\"" : "", v, quote ? "\"" : "");
        }
        strcat(json, "}");
        char base[300];
        snprintf(base, sizeof base, "{%s}", req);
        cm_algorithm_plugin a, b;
        cr_assert_eq(cm_algorithm_new_from_json(info->name, base, &a), CM_OK, "%s %s: %s", info->name, base,
                     cm_last_error());
        cr_assert_eq(cm_algorithm_new_from_json(info->name, json, &b), CM_OK, "%s %s: %s", info->name, json,
                     cm_last_error());
        char ha[512], hb[512];
        cm_algorithm_hparams_json(a, ha, sizeof ha);
        cm_algorithm_hparams_json(b, hb, sizeof hb);
        cr_expect_str_eq(ha, hb, "%s: _default() vs the default texts %s", info->name, json);
        cm_algorithm_plugin_free(a);
        cm_algorithm_plugin_free(b);
    }
}

Test(surgery_algos, arguments_print_composers_defaults_and_round_trip) {
    cm_algorithm_plugin p, q;
    cr_assert_eq(cm_algorithm_new_from_json("blurpool", NULL, &p), CM_OK);
    char a[512], b[512];
    cm_algorithm_hparams_json(p, a, sizeof a);
    cr_expect_str_eq(a, "{\"replace_convs\":true,\"replace_maxpools\":true,\"blur_first\":true,\"min_channels\":16}");
    cm_algorithm_plugin_free(p);
    cr_assert_eq(cm_algorithm_new_from_json("StochasticDepth",
                                            "{\"target_layer_name\": \"ResNetBasicBlock\", \"drop_warmup\": \"0.1\"}", &p),
                 CM_OK, "%s", cm_last_error());
    cm_algorithm_hparams_json(p, a, sizeof a);
    cr_expect_str_eq(a, "{\"target_layer_name\":\"ResNetBasicBlock\",\"stochastic_method\":\"block\",\"drop_rate\":0.2,"
                        "\"drop_distribution\":\"linear\",\"drop_warmup\":\"0.1dur\"}");
    cr_assert_eq(cm_algorithm_new_from_json("StochasticDepth", a, &q), CM_OK, "%s", cm_last_error());
    cm_algorithm_hparams_json(q, b, sizeof b);
    cr_expect_str_eq(a, b, "printed arguments make the same method again");
    cm_algorithm_plugin_free(p);
    cm_algorithm_plugin_free(q);
    cr_assert_eq(cm_algorithm_new_from_json("squeeze_excite", "{\"latent_channels\": 0.25, \"min_channels\": null}", &p),
                 CM_OK);
    cm_algorithm_hparams_json(p, a, sizeof a);
    cr_expect_str_eq(a, "{\"latent_channels\":0.25,\"min_channels\":128}", "null is the default");
    cm_algorithm_plugin_free(p);
    char small[8];
    cr_assert_eq(cm_algorithm_new_from_json("GhostBatchNorm", NULL, &p), CM_OK);
    cr_expect_eq(cm_algorithm_hparams_json(p, small, sizeof small), strlen("{\"ghost_batch_size\":32}"));
    cr_expect_eq(strlen(small), 7, "truncated like snprintf");
    cm_algorithm_plugin_free(p);
}

Test(surgery_algos, bad_names_and_arguments_name_the_closest_valid_one) {
    cm_algorithm_plugin p;
    cr_expect_eq(cm_algorithm_new_from_json("BlurPol", NULL, &p), CM_ERR_NOT_FOUND);
    cr_expect(strstr(cm_last_error(), "did you mean 'BlurPool'"), "%s", cm_last_error());
    cr_expect_eq(cm_algorithm_new_from_json("blurpool", "{\"min_channel\": 8}", &p), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "BlurPool: unknown argument 'min_channel' (did you mean 'min_channels'?"), "%s",
              cm_last_error());
    cr_expect_eq(cm_algorithm_new_from_json("blurpool", "{\"min_channels\": \"x\"}", &p), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "min_channels must be an integer"), "%s", cm_last_error());
    cr_expect_eq(cm_algorithm_new_from_json("stochastic_depth",
                                            "{\"target_layer_name\": \"ResNetBottleneck\", \"stochastic_method\": \"blok\"}",
                                            &p),
                 CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "did you mean 'block'"), "%s", cm_last_error());
    cr_expect_eq(cm_algorithm_new_from_json("stochastic_depth", "{\"target_layer_name\": \"Bottleneck\"}", &p),
                 CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "ResNetBottleneck, ResNetBasicBlock"), "%s", cm_last_error());
    cr_expect_eq(cm_algorithm_new_from_json("stochastic_depth",
                                            "{\"target_layer_name\": \"ResNetBottleneck\", \"stochastic_method\": \"sample\", "
                                            "\"drop_warmup\": \"10ba\"}",
                                            &p),
                 CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "drop_warmup can not be used with \"sample\""), "%s", cm_last_error());
    cr_expect_eq(cm_algorithm_new_from_json("alibi", "[1]", &p), CM_ERR_FORMAT);
    cr_expect_eq(cm_algorithm_new_from_json("blurpool", "{\"replace_convs\": false, \"replace_maxpools\": false}", &p),
                 CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "both false"), "%s", cm_last_error());
    cr_expect_eq(cm_algorithm_new_from_json("channels_last", "{\"x\": 1}", &p), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "it takes no arguments"), "%s", cm_last_error());
    cr_expect_eq(cm_algorithm_new_from_json("low_precision_layernorm", "{\"apply_at\": \"fit_start\"}", &p),
                 CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "init, before_load, after_load"), "%s", cm_last_error());
    cr_expect_eq(cm_algorithm_new_from_json("alibi", "{\"max_sequence_length\": 64, "
                                                     "\"train_sequence_length_scaling\": 1.5}",
                                            &p),
                 CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "train_sequence_length_scaling 1.5 must be in (0, 1]"), "%s", cm_last_error());
    cr_assert_eq(cm_algorithm_new_from_json("alibi", "{\"max_sequence_length\": 64}", &p), CM_OK, "%s",
                 cm_last_error()); /* Composer's default scaling, 0.25 */
    cm_algorithm_plugin_free(p);
    cr_assert_eq(cm_algorithm_new_from_json("alibi", "{\"max_sequence_length\": 64, "
                                                     "\"train_sequence_length_scaling\": 1}",
                                            &p),
                 CM_OK, "%s", cm_last_error());
    cm_algorithm_plugin_free(p);
}

/* ---- BlurPool ---- */

Test(surgery_algos, blurpool_blurs_strided_convs_and_max_pools_once) {
    cmt_srig r = cmt_srig_new(CMT_RESNET_IMNET, 1);
    cm_module *root = cm_model_module(r.model);
    const int64_t params = cm_module_count_params(root, false);
    cm_blurpool_config c = cm_blurpool_config_default();
    c.min_channels = 8;
    int64_t nc, np;
    cr_assert_eq(cm_apply_blurpool(root, &c, &nc, &np), CM_OK, "%s", cm_last_error());
    /* widths 4/8: layer2.0's strided conv2 (8 in) and downsample.0 (16 in); the stem (3 in) and
     * nothing in layer1 (stride 1) */
    cr_expect_eq(nc, 2);
    cr_expect_eq(np, 1, "the stem's max pool");
    cr_expect_str_eq(cm_module_type_name(cm_module_find(root, "layer2.0.conv2")), "BlurConv2d");
    cr_expect_str_eq(cm_module_type_name(cm_module_find(root, "layer2.0.downsample.0")), "BlurConv2d");
    cr_expect_str_eq(cm_module_type_name(cm_module_find(root, "conv1")), "Conv2d");
    cr_expect_str_eq(cm_module_type_name(cm_module_find(root, "maxpool")), "BlurMaxPool2d");
    cr_expect_eq(cm_module_count_params(root, false), params, "the convolutions keep their weights");
    cm_tensor *y1 = fixed_output(&r);
    cr_assert_eq(cm_apply_blurpool(root, &c, &nc, &np), CM_OK);
    cr_expect_eq(nc + np, 0, "applied again: nothing to do");
    cm_tensor *y2 = fixed_output(&r);
    cr_expect_eq(max_diff(y1, y2), 0);
    cm_tensor_free(y1);
    cm_tensor_free(y2);
    /* locked: surgery would re-pack under the optimizer */
    cmt_srig_free(&r);
    r = cmt_srig_new(CMT_RESNET_IMNET, 1);
    root = cm_model_module(r.model);
    cm_module_lock(root);
    cr_assert_eq(cm_apply_blurpool(root, &c, &nc, &np), CM_ERR_STATE);
    cr_expect(strstr(cm_last_error(), "cm_trainer_prepare_model"), "%s", cm_last_error());
    cm_module_unlock(root);
    cmt_srig_free(&r);
    /* nothing to blur: the error names what it looked for */
    r = cmt_srig_new(CMT_GPT2, 1);
    cr_assert_eq(cm_apply_blurpool(cm_model_module(r.model), &c, &nc, &np), CM_ERR_UNSUPPORTED);
    cr_expect(strstr(cm_last_error(), "BlurPool: the model (GPT2LMHeadModel) has nothing to apply to: it looked for "
                                      "Conv2d layers with a stride above 1 and at least min_channels input channels and "
                                      "MaxPool2d layers; min_channels is 8"),
              "%s", cm_last_error());
    cmt_srig_free(&r);
}

/* ---- ChannelsLast ---- */

Test(surgery_algos, channels_last_switches_the_zoo_cnns_with_the_same_outputs) {
    const cmt_family fams[3] = {CMT_RESNET, CMT_RESNET_IMNET, CMT_CNN};
    for (int i = 0; i < 3; i++) {
        cmt_srig r = cmt_srig_new(fams[i], 1);
        cm_module *root = cm_model_module(r.model);
        if (fams[i] == CMT_RESNET_IMNET) { /* with blurred layers in it */
            cm_blurpool_config c = cm_blurpool_config_default();
            c.min_channels = 8;
            cr_assert_eq(cm_apply_blurpool(root, &c, NULL, NULL), CM_OK);
            cm_squeeze_excite_config sc = {2, 8};
            cr_assert_eq(cm_apply_squeeze_excite(root, &sc, 3, NULL), CM_OK, "%s", cm_last_error());
        }
        cm_tensor *y0 = fixed_output(&r);
        int64_t n;
        cr_assert_eq(cm_apply_channels_last(root, &n), CM_OK, "%s", cm_last_error());
        cr_expect_eq(n, 1, "%s", cmt_family_name(fams[i]));
        cr_expect(cm_nn_is_channels_last(cm_module_find(root, "conv1")) ||
                      cm_nn_is_channels_last(cm_module_find(root, "conv1.conv")),
                  "%s: conv1 is channels-last", cmt_family_name(fams[i]));
        cm_tensor *y1 = fixed_output(&r);
        cr_expect(max_diff(y0, y1) < 1e-5, "%s: outputs %g apart", cmt_family_name(fams[i]), max_diff(y0, y1));
        cr_assert_eq(cm_apply_channels_last(root, &n), CM_OK);
        cr_expect_eq(n, 0, "already channels-last");
        cm_tensor_free(y0);
        cm_tensor_free(y1);
        cmt_srig_free(&r);
    }
    cmt_srig r = cmt_srig_new(CMT_GROUPNORM, 1);
    cr_assert_eq(cm_apply_channels_last(cm_model_module(r.model), NULL), CM_ERR_UNSUPPORTED);
    cr_expect(strstr(cm_last_error(), "looked for a ResNet or MnistCNN network") &&
                  strstr(cm_last_error(), "Conv2d layers sit in a network without a layout switch"),
              "%s", cm_last_error());
    cmt_srig_free(&r);
}

/* ---- ALiBi ---- */

Test(surgery_algos, alibi_biases_attention_and_zeroes_and_widens_position_embeddings) {
    const cmt_family fams[2] = {CMT_GPT2, CMT_BERT};
    const char *pos[2] = {"transformer.wpe", "bert.embeddings.position_embeddings"};
    for (int i = 0; i < 2; i++) {
        cmt_srig r = cmt_srig_new(fams[i], 1);
        cm_module *root = cm_model_module(r.model);
        int64_t n;
        cr_assert_eq(cm_apply_alibi(root, 48, &n), CM_OK, "%s", cm_last_error());
        cr_expect_eq(n, 2 + 1, "%s: 2 attention modules and the position embedding", cmt_family_name(fams[i]));
        cm_module *pe = cm_module_find(root, pos[i]);
        int64_t rows;
        cr_assert_eq(cm_nn_embedding_dims(pe, &rows, NULL), CM_OK);
        cr_expect_eq(rows, 48);
        cm_tensor *w = cm_module_param(pe, "weight");
        cr_expect(!cm_tensor_requires_grad(w), "frozen");
        for (int64_t k = 0; k < cm_tensor_numel(w); k++) cr_assert_eq(cm_tensor_get_flat(w, k), 0.0);
        cr_assert_eq(cm_apply_alibi(root, 48, &n), CM_OK);
        cr_expect_eq(n, 0, "applied again: nothing to do");
        /* sequences longer than the model's 32 positions now run */
        const int64_t s[2] = {2, 40};
        cm_tape *tp = cmt_tape();
        cm_tensor *ids = cmt_randint(tp, 2, s, 1, 0, 50);
        const char *names[1] = {"input_ids"};
        cm_model_batch mb = {names, &ids, 1, 2, 0};
        cm_tensor *y = cm_model_forward(r.model, tp, &mb);
        cr_assert(y, "%s: %s", cmt_family_name(fams[i]), cm_tape_error(tp));
        cm_tape_free(tp);
        if (fams[i] == CMT_GPT2) { /* generation runs (without the KV cache) */
            int64_t prompt[3] = {1, 2, 3}, out[5], nout;
            cm_gpt2_generate_config gc = cm_gpt2_generate_config_default();
            gc.temperature = 0;
            cr_assert_eq(cm_gpt2_generate(r.model, prompt, 3, 5, &gc, out, &nout), CM_OK, "%s", cm_last_error());
            cr_expect_eq(nout, 5);
        }
        cmt_srig_free(&r);
    }
    cmt_srig r = cmt_srig_new(CMT_RESNET, 1);
    cr_assert_eq(cm_apply_alibi(cm_model_module(r.model), 48, NULL), CM_ERR_UNSUPPORTED);
    cr_expect(strstr(cm_last_error(), "ALiBi: the model (ResNet) has nothing to apply to: it looked for GPT2Attention "
                                      "and BertSelfAttention modules"),
              "%s", cm_last_error());
    cmt_srig_free(&r);
}

/* ---- StochasticDepth ---- */

Test(surgery_algos, stochastic_depth_rates_follow_depth_and_blocks_drop) {
    cmt_srig r = cmt_srig_new(CMT_RESNET, 1);
    cm_module *root = cm_model_module(r.model);
    cr_assert_eq(cm_apply_stochastic_depth(root, CM_SD_RESNET_BOTTLENECK, CM_STOCHASTIC_BLOCK, 0.3, CM_DROP_LINEAR, NULL),
                 CM_ERR_UNSUPPORTED);
    cr_expect(strstr(cm_last_error(), "looked for Bottleneck blocks (target_layer_name ResNetBottleneck); ResNet-18/34 "
                                      "and the CIFAR ResNets have BasicBlock: use ResNetBasicBlock"),
              "%s", cm_last_error());
    int64_t n;
    cr_assert_eq(cm_apply_stochastic_depth(root, CM_SD_RESNET_BASIC_BLOCK, CM_STOCHASTIC_BLOCK, 0.3, CM_DROP_LINEAR, &n),
                 CM_OK, "%s", cm_last_error());
    cr_expect_eq(n, 3);
    const char *blocks[3] = {"layer1.0", "layer2.0", "layer3.0"};
    for (int i = 0; i < 3; i++) {
        cm_resnet_drop_mode mode;
        float rate;
        cr_assert_eq(cm_resnet_block_drop(cm_module_find(root, blocks[i]), &mode, &rate), CM_OK);
        cr_expect_eq(mode, CM_RESNET_DROP_BLOCK);
        cr_expect(fabsf(rate - 0.3f * (float)(i + 1) / 3.0f) < 1e-7f, "block %d: rate %g", i, rate);
        cr_expect(cm_nn_dropout_rng(cm_module_find(root, "layer1.0.stochastic_depth")), "the generator child");
    }
    cr_assert_eq(cm_stochastic_depth_set_rate(root, CM_SD_RESNET_BASIC_BLOCK, 0.6, CM_DROP_UNIFORM, &n), CM_OK);
    float rate;
    cm_resnet_block_drop(cm_module_find(root, "layer1.0"), NULL, &rate);
    cr_expect(fabsf(rate - 0.6f) < 1e-7f);
    /* drop_rate 1 in training: every block is skipped — layer1.0 (identity shortcut) returns its
     * input, so the output only depends on the stem and the downsampling shortcuts */
    cm_stochastic_depth_set_rate(root, CM_SD_RESNET_BASIC_BLOCK, 1.0, CM_DROP_UNIFORM, NULL);
    cm_tape *tp = cmt_tape();
    const int64_t xs[4] = {2, 8, 4, 4};
    cm_tensor *x = cmt_randn(tp, 4, xs, 3, false);
    cm_module *b1 = cm_module_find(root, "layer1.0");
    cm_tensor *y = cm_module_forward(b1, tp, cm_relu(tp, x));
    cr_assert(y, "%s", cm_tape_error(tp));
    cmt_assert_close("a dropped identity block returns its input", y, cm_relu(tp, x), 0, 0);
    cm_tape_free(tp);
    cmt_srig_free(&r);
}

Test(surgery_algos, stochastic_depth_sample_mode_drops_rows_by_global_row) {
    cm_resnet_config rc = cm_resnet_config_default();
    rc.channels_last = false;
    cm_module *blk;
    cm_rng rng = cm_rng_init(1, 0);
    cr_assert_eq(cm_resnet_block_new(&rc, 4, 4, 1, &rng, &blk), CM_OK);
    cr_assert_eq(cm_module_finalize(blk), CM_OK);
    cr_assert_eq(cm_resnet_block_set_drop(blk, CM_RESNET_DROP_SAMPLE, 0.5f), CM_OK);
    cm_module_set_seed(blk, 5);
    cm_tape *tp = cmt_tape();
    const int64_t xs[4] = {16, 4, 3, 3};
    cm_tensor *x = cm_relu(tp, cmt_randn(tp, 4, xs, 3, false));
    cm_rng *g = cm_nn_dropout_rng(cm_module_child(blk, "stochastic_depth"));
    const cm_rng start = *g;
    cm_tensor *y = cm_module_forward(blk, tp, x);
    cr_assert(y, "%s", cm_tape_error(tp));
    /* a dropped row is relu(0 + x) = x (identity shortcut, x ≥ 0); kept rows differ */
    int dropped = 0;
    for (int64_t i = 0; i < 16; i++) {
        bool same = true;
        for (int64_t k = 0; k < 36; k++) same = same && cm_tensor_get_flat(y, i * 36 + k) == cm_tensor_get_flat(x, i * 36 + k);
        dropped += same;
    }
    cr_expect(dropped > 2 && dropped < 14, "%d of 16 rows dropped at rate 0.5", dropped);
    /* the same rows again from the same counter: the draws are a function of (seed, stream, row) */
    *g = start;
    cm_tensor *y2 = cm_module_forward(blk, tp, x);
    cmt_assert_close("redrawn from the same counter", y2, y, 0, 0);
    cm_tape_free(tp);
    cm_module_free(blk);
}

/* ---- SqueezeExcite ---- */

Test(surgery_algos, squeeze_excite_wraps_wide_convs_with_seeded_layers) {
    cmt_srig a = cmt_srig_new(CMT_RESNET, 1), b = cmt_srig_new(CMT_RESNET, 1), c = cmt_srig_new(CMT_RESNET, 1);
    cm_squeeze_excite_config sc = {0.5, 8};
    int64_t n;
    cr_assert_eq(cm_apply_squeeze_excite(cm_model_module(a.model), &sc, 7, &n), CM_OK, "%s", cm_last_error());
    /* widths 4/8/16: every conv with min(in, out) >= 8 — layer2.0.conv2, layer3.0.{conv1, conv2}, the
     * downsample convs of layer2.0 (4 in) no, of layer3.0 (8 → 16) yes */
    cr_expect_eq(n, 4);
    cr_expect_eq(n_of(a.model, "SqueezeExciteConv2d"), 4);
    cm_module *se = cm_module_find(cm_model_module(a.model), "layer3.0.conv2.se");
    cr_assert(se);
    cr_expect_str_eq(cm_module_type_name(se), "SqueezeExcite2d");
    cr_assert(cm_module_find_param(cm_model_module(a.model), "layer3.0.conv2.se.pool_and_mlp.2.weight"));
    cr_assert(cm_module_find_param(cm_model_module(a.model), "layer3.0.conv2.conv.weight"));
    cr_assert_eq(cm_apply_squeeze_excite(cm_model_module(b.model), &sc, 7, NULL), CM_OK);
    cr_assert_eq(cm_apply_squeeze_excite(cm_model_module(c.model), &sc, 8, NULL), CM_OK);
    cm_tensor *wa = cm_module_find_param(cm_model_module(a.model), "layer3.0.conv2.se.pool_and_mlp.2.weight");
    cm_tensor *wb = cm_module_find_param(cm_model_module(b.model), "layer3.0.conv2.se.pool_and_mlp.2.weight");
    cm_tensor *wc = cm_module_find_param(cm_model_module(c.model), "layer3.0.conv2.se.pool_and_mlp.2.weight");
    cr_expect_eq(max_diff(wa, wb), 0, "the same seed draws the same layers");
    cr_expect(max_diff(wa, wc) > 0, "another seed others");
    cr_assert_eq(cm_apply_squeeze_excite(cm_model_module(a.model), &sc, 7, &n), CM_OK);
    cr_expect_eq(n, 0, "applied again: nothing to do");
    cmt_srig_free(&a);
    cmt_srig_free(&b);
    cmt_srig_free(&c);
    a = cmt_srig_new(CMT_MLP, 1);
    cr_assert_eq(cm_apply_squeeze_excite(cm_model_module(a.model), &sc, 7, &n), CM_ERR_UNSUPPORTED);
    cr_expect(strstr(cm_last_error(), "looked for Conv2d layers with at least min_channels input and output channels; "
                                      "min_channels is 8 and the model has 0 Conv2d layers"),
              "%s", cm_last_error());
    cmt_srig_free(&a);
}

/* ---- GhostBatchNorm ---- */

Test(surgery_algos, ghost_batchnorm_wraps_every_batch_norm) {
    cmt_srig r = cmt_srig_new(CMT_RESNET, 1);
    const int64_t bns = n_of(r.model, "BatchNorm2d");
    cm_tensor *y0 = fixed_output(&r);
    int64_t n;
    cr_assert_eq(cm_apply_ghost_batchnorm(cm_model_module(r.model), 2, &n), CM_OK, "%s", cm_last_error());
    cr_expect_eq(n, bns);
    cr_expect_eq(n_of(r.model, "GhostBatchNorm2d"), bns);
    cm_tensor *y1 = fixed_output(&r);
    cr_expect_eq(max_diff(y0, y1), 0, "in eval a ghost batch norm is its batch norm");
    cr_assert_eq(cm_apply_ghost_batchnorm(cm_model_module(r.model), 2, &n), CM_OK);
    cr_expect_eq(n, 0);
    cm_tensor_free(y0);
    cm_tensor_free(y1);
    cmt_srig_free(&r);
    r = cmt_srig_new(CMT_GPT2, 1);
    cr_assert_eq(cm_apply_ghost_batchnorm(cm_model_module(r.model), 2, &n), CM_ERR_UNSUPPORTED);
    cr_expect(strstr(cm_last_error(), "it looked for BatchNorm2d layers"), "%s", cm_last_error());
    cmt_srig_free(&r);
}

/* ---- LowPrecisionLayerNorm / GroupNorm, FusedLayerNorm ---- */

Test(surgery_algos, low_precision_norms_switch_under_amp_only) {
    cmt_srig r = cmt_srig_new(CMT_GPT2, 1);
    int64_t n = -1;
    cr_assert_eq(cm_apply_low_precision_layernorm(cm_model_module(r.model), CM_PRECISION_FP32, &n), CM_OK);
    cr_expect_eq(n, 0, "fp32: Composer's NoEffectWarning, nothing changed");
    cr_assert_eq(cm_apply_low_precision_layernorm(cm_model_module(r.model), CM_PRECISION_AMP_BF16, &n), CM_OK);
    cr_expect_eq(n, 5, "ln_1 and ln_2 of 2 blocks, ln_f");
    cr_expect(cm_nn_norm_is_low_precision(cm_module_find(cm_model_module(r.model), "transformer.ln_f")));
    cr_assert_eq(cm_apply_low_precision_groupnorm(cm_model_module(r.model), CM_PRECISION_AMP_BF16, &n),
                 CM_ERR_UNSUPPORTED);
    cr_expect(strstr(cm_last_error(), "LowPrecisionGroupNorm: the model (GPT2LMHeadModel) has nothing to apply to: it "
                                      "looked for GroupNorm layers"),
              "%s", cm_last_error());
    cmt_srig_free(&r);
    r = cmt_srig_new(CMT_GROUPNORM, 1);
    cr_assert_eq(cm_apply_low_precision_groupnorm(cm_model_module(r.model), CM_PRECISION_AMP_BF16, &n), CM_OK);
    cr_expect_eq(n, 1);
    cmt_srig_free(&r);
    /* FusedLayerNorm: accepted, says once that it is built in */
    cm_algorithm_plugin p;
    cr_assert_eq(cm_algorithm_new_from_json("fused_layernorm", NULL, &p), CM_OK);
    cm_state *st;
    cm_state_new(&st);
    cmt_log_capture_start();
    cr_assert(p.vt->match(p.self, CM_EVENT_INIT, st));
    cr_assert_eq(p.vt->apply(p.self, CM_EVENT_INIT, st, NULL), CM_OK);
    cr_assert_eq(p.vt->apply(p.self, CM_EVENT_INIT, st, NULL), CM_OK);
    const char *log = cmt_log_capture_text();
    const char *first = strstr(log, "FusedLayerNorm: built in");
    cr_expect(first && !strstr(first + 1, "FusedLayerNorm: built in"), "logged once: %s", log);
    cmt_log_capture_stop();
    cm_state_free(st);
    cm_algorithm_plugin_free(p);
}

/* ---- WeightStandardization ---- */

Test(surgery_algos, weight_standardization_skips_the_last_layers) {
    cmt_srig r = cmt_srig_new(CMT_RESNET, 1);
    cm_module *root = cm_model_module(r.model);
    const int64_t convs = n_of(r.model, "Conv2d");
    int64_t n;
    cr_assert_eq(cm_apply_weight_standardization(root, 2, &n), CM_OK, "%s", cm_last_error());
    cr_expect_eq(n, convs - 2);
    cr_expect(cm_nn_conv2d_weight_standardization(cm_module_find(root, "conv1")), "the first is standardized");
    cr_expect(!cm_nn_conv2d_weight_standardization(cm_module_find(root, "layer3.0.downsample.0")),
              "the last (in model order) is not");
    cm_module_lock(root);
    cr_assert_eq(cm_apply_weight_standardization(root, 2, &n), CM_OK, "no re-packing: fine on a locked model");
    cm_module_unlock(root);
    cmt_srig_free(&r);
    r = cmt_srig_new(CMT_MLP, 1);
    cr_assert_eq(cm_apply_weight_standardization(cm_model_module(r.model), 0, &n), CM_ERR_UNSUPPORTED);
    cr_expect(strstr(cm_last_error(), "it looked for Conv2d layers"), "%s", cm_last_error());
    cmt_srig_free(&r);
}

/* ---- GatedLinearUnits ---- */

Test(surgery_algos, gated_linear_units_replace_berts_feed_forward) {
    cmt_srig r = cmt_srig_new(CMT_BERT, 1);
    cm_gated_linear_units_config gc = cm_gated_linear_units_config_default();
    int64_t n;
    cr_assert_eq(cm_apply_gated_linear_units(cm_model_module(r.model), &gc, 3, &n), CM_OK, "%s", cm_last_error());
    cr_expect_eq(n, 4, "2 layers × (intermediate, output)");
    cr_expect_eq(n_of(r.model, "BERTGatedFFOutput"), 2);
    cr_expect_eq(n_of(r.model, "BertIntermediate"), 0);
    cm_tensor *y = fixed_output(&r);
    cr_expect(isfinite(cm_tensor_get_flat(y, 0)));
    cm_tensor_free(y);
    cr_assert_eq(cm_apply_gated_linear_units(cm_model_module(r.model), &gc, 3, &n), CM_OK);
    cr_expect_eq(n, 0, "applied again: nothing to do");
    cmt_srig_free(&r);
    r = cmt_srig_new(CMT_GPT2, 1);
    cr_assert_eq(cm_apply_gated_linear_units(cm_model_module(r.model), &gc, 3, &n), CM_ERR_UNSUPPORTED);
    cr_expect(strstr(cm_last_error(), "it looked for BertIntermediate and BertOutput modules; Gated Linear Units only "
                                      "has a surgery policy for BERT"),
              "%s", cm_last_error());
    cmt_srig_free(&r);
}

/* ---- Factorize ---- */

Test(surgery_algos, factorize_keeps_what_rank_k_can_keep) {
    /* a rank-2 weight factorized at rank 2 computes exactly what it did */
    cm_module *seq, *lin;
    cm_nn_sequential_new(&seq);
    cr_assert_eq(cm_nn_linear_new(12, 10, true, NULL, &lin), CM_OK);
    cm_nn_sequential_append(seq, lin);
    cr_assert_eq(cm_module_finalize(seq), CM_OK);
    float *w = cm_tensor_data(cm_module_param(lin, "weight"));
    for (int i = 0; i < 10; i++)
        for (int j = 0; j < 12; j++) w[i * 12 + j] = (float)((i + 1) * (j % 3) - 0.5 * (i % 2) * (j + 1));
    cm_tensor_fill(cm_module_param(lin, "bias"), 0.25);
    cm_tape *tp = cmt_tape();
    const int64_t xs[2] = {3, 12};
    cm_tensor *x = cmt_randn(tp, 2, xs, 1, false);
    cm_tensor *y0 = cm_clone_detached(tp, cm_module_forward(seq, tp, x));
    cm_factorize_config fc = cm_factorize_config_default();
    fc.min_features = 0, fc.latent_features = 2;
    int64_t nc, nl;
    cr_assert_eq(cm_apply_factorization(seq, &fc, &nc, &nl), CM_OK, "%s", cm_last_error());
    cr_assert_eq(nl, 1);
    cmt_assert_close("rank 2 at rank 2", cm_module_forward(seq, tp, x), y0, 1e-4, 1e-4);
    cr_assert_eq(cm_apply_factorization(seq, &fc, &nc, &nl), CM_OK);
    cr_expect_eq(nc + nl, 0, "applied again: nothing to do");
    cm_tape_free(tp);
    cm_module_free(seq);
    /* too small a gain: a latent size above the break-even rank is not factorized */
    cmt_srig r = cmt_srig_new(CMT_MLP, 1);
    fc = cm_factorize_config_default();
    /* Linear(8, 16): 0.9 · 8 = 7 > ceil(8·16/24 - 1) = 5; Linear(16, 3): narrower than min_features */
    fc.min_features = 4, fc.latent_features = 0.9;
    fc.factorize_convs = false;
    cr_assert_eq(cm_apply_factorization(cm_model_module(r.model), &fc, &nc, &nl), CM_ERR_UNSUPPORTED);
    cr_expect(strstr(cm_last_error(), "Linear layers with at least min_features inputs and outputs; whose latent size is "
                                      "small enough to save work") &&
                  strstr(cm_last_error(), "the model has 0 Conv2d and 2 Linear"),
              "%s", cm_last_error());
    fc.latent_features = 0.25;
    cr_assert_eq(cm_apply_factorization(cm_model_module(r.model), &fc, &nc, &nl), CM_OK, "%s", cm_last_error());
    cr_expect_eq(nl, 1, "Linear(8, 16) at rank 0.25 · 8 = 2");
    cr_expect_str_eq(cm_module_type_name(cm_module_find(cm_model_module(r.model), "0")), "FactorizedLinear");
    cmt_srig_free(&r);
}

/* ---- GyroDropout ---- */

Test(surgery_algos, gyro_dropout_masks_rows_in_tau_groups_by_global_row) {
    cmt_srig r = cmt_srig_new(CMT_MLP, 1);
    cm_module *root = cm_model_module(r.model);
    cm_gyro_dropout_config gc = {0.5, 8, 4};
    int64_t n;
    cr_assert_eq(cm_apply_gyro_dropout(root, &gc, 9, &n), CM_OK, "%s", cm_last_error());
    cr_expect_eq(n, 1);
    cm_module *g = cm_module_find(root, "2");
    cr_assert_str_eq(cm_module_type_name(g), "GyroDropoutLayer");
    cm_tape *tp = cmt_tape();
    const int64_t xs[2] = {8, 16};
    cm_tensor *ones = cm_full(tp, CM_DTYPE_F32, 2, xs, 1.0);
    cmt_expect_error(tp, cm_module_forward(g, tp, ones), CM_ERR_STATE, "no schedule yet", NULL);
    cm_tape_free(tp);
    tp = cmt_tape();
    ones = cm_full(tp, CM_DTYPE_F32, 2, xs, 1.0);
    cr_assert_eq(cm_gyro_dropout_set_schedule(root, 4, 2), CM_OK); /* iter_num int(8/8)·4 = 4 */
    cm_tensor *y = cm_module_forward(g, tp, ones);
    cr_assert(y, "%s", cm_tape_error(tp));
    /* rows 0-1, 2-3, 4-5, 6-7 share a mask; kept features are 2 (1 / (1 - 0.5)) */
    for (int row = 0; row < 8; row += 2)
        for (int f = 0; f < 16; f++) {
            const double a = cm_tensor_get_flat(y, row * 16 + f), b = cm_tensor_get_flat(y, (row + 1) * 16 + f);
            cr_assert(a == b && (a == 0 || a == 2), "row %d feature %d: %g %g", row, f, a, b);
        }
    /* a microbatch of rows 4..7 of the same batch gets those rows' masks */
    const int64_t hs[2] = {4, 16};
    cm_tape_set_rows(tp, 4, 4, 8);
    cm_tensor *yh = cm_module_forward(g, tp, cm_full(tp, CM_DTYPE_F32, 2, hs, 1.0));
    cmt_assert_close("microbatch rows 4..7", yh, cm_narrow(tp, y, 0, 4, 4), 0, 0);
    cm_tape_set_rows(tp, 0, 0, 0);
    /* the picks change every iter_num steps, not before */
    cm_gyro_dropout_set_step(root, 3);
    cmt_assert_close("step 3: the same picks", cm_module_forward(g, tp, ones), y, 0, 0);
    cm_gyro_dropout_set_step(root, 4);
    cr_expect(max_diff(cm_module_forward(g, tp, ones), y) > 0, "step 4: new picks");
    /* rows not a multiple of tau: Composer's layer cannot split them */
    const int64_t bad[2] = {6, 16};
    cmt_expect_error(tp, cm_module_forward(g, tp, cm_full(tp, CM_DTYPE_F32, 2, bad, 1.0)), CM_ERR_SHAPE,
                     "not a multiple of tau 4", NULL);
    cm_tape_free(tp);
    cmt_srig_free(&r);
}

/* ---- gradient checks of the new functions (compositions of checked ops, checked again) ---- */

static cm_tensor *f_blur(cm_tape *tp, cm_tensor *const *in, void *ctx) {
    return cm_blur_2d(tp, in[0], NULL, *(int *)ctx, false, false);
}
static cm_tensor *f_blurmax(cm_tape *tp, cm_tensor *const *in, void *ctx) {
    cm_pool2d_opts o = cm_pool2d_opts_default(3, 3);
    o.stride[0] = o.stride[1] = 2, o.padding[0] = o.padding[1] = 1;
    return cm_blurmax_pool2d(tp, in[0], &o, NULL);
}
static cm_tensor *f_standardize(cm_tape *tp, cm_tensor *const *in, void *ctx) { return cm_nn_standardize_weight(tp, in[0]); }
static cm_tensor *f_ghost(cm_tape *tp, cm_tensor *const *in, void *ctx) { return cm_ghost_batch_norm(tp, ctx, in[0], 3); }

Test(surgery_algos, gradients_of_the_new_functions) {
    cm_tape *tp = cmt_tape();
    const int64_t xs[4] = {2, 3, 6, 5};
    cm_tensor *x = cmt_randn(tp, 4, xs, 1, true);
    int strides[2] = {1, 2};
    for (int i = 0; i < 2; i++) cmt_gradcheck("blur_2d", f_blur, &strides[i], 1, &x, NULL);
    cmt_gradcheck("blurmax_pool2d", f_blurmax, NULL, 1, &x, NULL); /* random values: no ties in the max */
    const int64_t ws[4] = {4, 3, 3, 3};
    cm_tensor *w = cmt_randn(tp, 4, ws, 2, true);
    cmt_gradcheck("standardize_weight", f_standardize, NULL, 1, &w, NULL);
    cm_module *bn;
    cr_assert_eq(cm_nn_batch_norm2d_new(3, NULL, &bn), CM_OK);
    const int64_t gs[4] = {7, 3, 2, 2};
    cm_tensor *g = cmt_randn(tp, 4, gs, 3, true);
    cmt_gradcheck("ghost batch norm (chunks 3, 3, 1)", f_ghost, bn, 1, &g, NULL);
    cm_module_free(bn);
    cm_tape_free(tp);
}
