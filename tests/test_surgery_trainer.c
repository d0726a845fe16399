/* Model surgery in the trainer: it runs on INIT before the trainer's optimizer exists (the new
 * layers train), a given optimizer with surgery is a clear error that cm_trainer_prepare_model
 * fixes, checkpoints record the methods and their arguments, and Composer's required-on-load rule —
 * loading a checkpoint re-applies its surgery before the weights are read, with Composer's warnings
 * (auto-adding; the same method with other arguments) and errors (ordering conflict; a method that
 * fails), load_exclude_algorithms, and the re-applied methods saved again. */
#include "cms3.h"
#include "cmsurg.h"
#include "cmtest.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool has_type(cm_module *m, const char *path, int depth, void *data) {
    if (!strcmp(cm_module_type_name(m), ((const char **)data)[0])) ((const char **)data)[1] = "yes";
    return true;
}
static bool model_has(cm_model *model, const char *type) {
    const char *d[2] = {type, NULL};
    cm_module_visit(cm_model_module(model), has_type, d);
    return d[1] != NULL;
}

static cm_algorithm_plugin se(double latent, int64_t min_channels) {
    cm_squeeze_excite_config c = cm_squeeze_excite_config_default();
    c.latent_channels = latent, c.min_channels = min_channels;
    cm_algorithm_plugin p;
    cr_assert_eq(cm_squeeze_excite_new(&c, &p), CM_OK, "%s", cm_last_error());
    return p;
}
static cm_algorithm_plugin blur(void) {
    cm_blurpool_config c = cm_blurpool_config_default();
    c.min_channels = 4;
    cm_algorithm_plugin p;
    cr_assert_eq(cm_blurpool_new(&c, &p), CM_OK);
    return p;
}
static cm_algorithm_plugin ghost(void) {
    cm_ghost_batchnorm_config c = {4};
    cm_algorithm_plugin p;
    cr_assert_eq(cm_ghost_batchnorm_new(&c, &p), CM_OK);
    return p;
}

Test(surgery_trainer, init_surgery_happens_before_the_trainers_optimizer_and_the_new_layers_train) {
    cmt_srig rig = cmt_srig_new(CMT_RESNET_IMNET, 1);
    cm_algorithm_plugin algs[2] = {blur(), se(2, 8)};
    cmt_srun o = cmt_srun_default();
    cm_optim *opt;
    cm_status s;
    cm_trainer *tr = cmt_strainer(&rig, algs, 2, &o, &opt, &s);
    cr_assert(tr, "%s", cm_last_error());
    cr_assert(model_has(rig.model, "BlurConv2d") && model_has(rig.model, "BlurMaxPool2d") &&
              model_has(rig.model, "SqueezeExciteConv2d"));
    cm_module *root = cm_model_module(rig.model);
    cr_assert(cm_module_is_locked(root), "the trainer locked the re-packed model");
    const int64_t i = cm_module_param_index(root, "layer2.0.conv3.se.pool_and_mlp.2.weight");
    cr_assert(i >= 0, "the SqueezeExcite layer of layer2.0.conv3 is a parameter");
    cm_tensor *w = cm_module_param_info(root, i).tensor;
    const float before = (float)cm_tensor_get_flat(w, 0);
    cr_assert_eq(cm_trainer_fit(tr, NULL), CM_OK, "%s", cm_last_error());
    cr_assert_neq((float)cm_tensor_get_flat(w, 0), before, "the optimizer made after the surgery trains the new layer");
    cm_trainer_free(tr);
    cmt_srig_free(&rig);
}

Test(surgery_trainer, surgery_under_a_given_optimizer_is_an_error_that_prepare_model_fixes) {
    cmt_srig rig = cmt_srig_new(CMT_RESNET_IMNET, 1);
    cm_algorithm_plugin algs[1] = {blur()};
    cmt_srun o = cmt_srun_default();
    o.own_optimizer = true;
    cm_optim *opt;
    cm_status s;
    cr_assert_null(cmt_strainer(&rig, algs, 1, &o, &opt, &s));
    cr_assert_eq(s, CM_ERR_STATE);
    cr_assert(strstr(cm_last_error(), "model surgery on INIT (BlurPool) re-packed the model's parameters") &&
                  strstr(cm_last_error(), "cm_trainer_prepare_model(&cfg) before making the optimizer"),
              "%s", cm_last_error());
    cm_optim_free(opt);
    cmt_srig_free(&rig);
    /* the plugin is still ours: prepare the model first, then the optimizer, then the trainer */
    rig = cmt_srig_new(CMT_RESNET_IMNET, 1);
    o.prepare = true;
    cm_trainer *tr = cmt_strainer(&rig, algs, 1, &o, &opt, &s);
    cr_assert(tr, "%s", cm_last_error());
    cr_assert(model_has(rig.model, "BlurConv2d"));
    cr_assert_eq(cm_trainer_fit(tr, NULL), CM_OK, "%s", cm_last_error());
    cm_trainer_free(tr);
    cm_optim_free(opt);
    /* a model locked by an optimizer or data parallelism cannot be prepared */
    cm_module *root = cm_model_module(rig.model);
    cm_module_lock(root);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = rig.model;
    cr_assert_eq(cm_trainer_prepare_model(&c), CM_ERR_STATE);
    cr_assert(strstr(cm_last_error(), "locked"), "%s", cm_last_error());
    cm_module_unlock(root);
    cmt_srig_free(&rig);
}

/* Trains `family` with algs for 2 batches, saving every batch under dir. */
static void train_and_save(cmt_family f, cm_algorithm_plugin *algs, int n, const char *dir) {
    cmt_srig rig = cmt_srig_new(f, 1);
    cmt_srun o = cmt_srun_default();
    o.max_duration = "2ba";
    o.save_folder = dir;
    cm_optim *opt;
    cm_status s;
    cm_trainer *tr = cmt_strainer(&rig, algs, n, &o, &opt, &s);
    cr_assert(tr, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_fit(tr, NULL), CM_OK, "%s", cm_last_error());
    cm_trainer_free(tr);
    cmt_srig_free(&rig);
}

static cJSON *read_manifest(const char *ckpt) {
    cm_checkpoint *ck;
    cr_assert_eq(cm_checkpoint_open(ckpt, &ck), CM_OK, "%s", cm_last_error());
    cJSON *j = cJSON_Parse(cm_checkpoint_manifest(ck));
    cm_checkpoint_close(ck);
    cr_assert(j);
    return j;
}

Test(surgery_trainer, checkpoints_record_the_methods_and_their_arguments) {
    char *dir = cmt_temp_dir();
    cm_algorithm_plugin algs[2] = {se(2, 8), ghost()};
    train_and_save(CMT_RESNET_IMNET, algs, 2, dir);
    char ck[1024];
    snprintf(ck, sizeof ck, "%s/ba2", dir);
    cJSON *m = read_manifest(ck);
    cJSON *a = cJSON_GetObjectItemCaseSensitive(m, "algorithms");
    cr_assert_eq(cJSON_GetArraySize(a), 2);
    cJSON *e0 = cJSON_GetArrayItem(a, 0);
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(e0, "name")->valuestring, "SqueezeExcite");
    char *hp = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(e0, "hparams"));
    cr_assert_str_eq(hp, "{\"latent_channels\":2,\"min_channels\":8}");
    cJSON_free(hp);
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e0, "required_on_load")));
    cJSON_Delete(m);
    cmt_rm_rf(dir);
    free(dir);
}

Test(surgery_trainer, loading_reapplies_the_checkpoints_surgery_before_the_weights) {
    char *dir = cmt_temp_dir(), *dir2 = cmt_temp_dir();
    cm_algorithm_plugin algs[3] = {se(2, 8), blur(), ghost()};
    train_and_save(CMT_RESNET_IMNET, algs, 3, dir);
    char ck[1024];
    snprintf(ck, sizeof ck, "%s/ba2", dir);
    /* a fresh model, no algorithms: the checkpoint's surgery is applied, then its weights load */
    cmt_srig rig = cmt_srig_new(CMT_RESNET_IMNET, 2);
    cmt_srun o = cmt_srun_default();
    o.load_path = ck;
    o.save_folder = dir2;
    cm_optim *opt;
    cm_status s;
    cmt_log_capture_start();
    cm_trainer *tr = cmt_strainer(&rig, NULL, 0, &o, &opt, &s);
    const char *log = cmt_log_capture_text();
    cr_assert(tr, "%s", cm_last_error());
    cr_assert(strstr(log, "Automatically adding required_on_load algorithm SqueezeExcite to trainer") &&
                  strstr(log, "load_exclude_algorithms=['BlurPool']"),
              "%s", log);
    cmt_log_capture_stop();
    cr_assert(model_has(rig.model, "SqueezeExciteConv2d") && model_has(rig.model, "BlurConv2d") &&
              model_has(rig.model, "GhostBatchNorm2d"));
    cr_assert_eq(cm_engine_n_algorithms(cm_trainer_engine(tr)), 3, "the re-created methods are registered");
    cr_assert_eq(cm_trainer_state(tr) ? cm_timestamp_get(cm_state_timestamp(cm_trainer_state(tr)), CM_TIME_BATCH,
                                                         &(cm_time){0})
                                      : CM_OK,
                 CM_OK);
    /* the weights are the checkpoint's: the same checkpoint written again at once is identical */
    cr_assert_eq(cm_trainer_fit(tr, NULL), CM_OK, "%s", cm_last_error());
    char ck3[1024];
    snprintf(ck3, sizeof ck3, "%s/ba3", dir2);
    cJSON *m = read_manifest(ck3);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(m, "algorithms")), 3,
                 "the re-applied methods are recorded again");
    cJSON_Delete(m);
    cm_trainer_free(tr);
    cmt_srig_free(&rig);
    /* excluding one: its surgery is not re-applied, so the strict weight load names its tensors */
    rig = cmt_srig_new(CMT_RESNET_IMNET, 2);
    const char *ex[1] = {"Squeeze*"};
    o.exclude = ex, o.n_exclude = 1, o.save_folder = NULL;
    cr_assert_null(cmt_strainer(&rig, NULL, 0, &o, &opt, &s));
    cr_assert_eq(s, CM_ERR_NOT_FOUND, "%s", cm_last_error());
    cr_assert(strstr(cm_last_error(), "se.pool_and_mlp"), "%s", cm_last_error());
    cmt_srig_free(&rig);
    cmt_rm_rf(dir);
    cmt_rm_rf(dir2);
    free(dir);
    free(dir2);
}

Test(surgery_trainer, the_same_method_with_other_arguments_warns_as_composer) {
    char *dir = cmt_temp_dir();
    cm_algorithm_plugin algs[1] = {se(2, 8)};
    train_and_save(CMT_RESNET_IMNET, algs, 1, dir);
    char ck[1024];
    snprintf(ck, sizeof ck, "%s/ba2", dir);
    cmt_srig rig = cmt_srig_new(CMT_RESNET_IMNET, 2);
    cm_algorithm_plugin mine[1] = {se(3, 8)};
    cmt_srun o = cmt_srun_default();
    o.load_path = ck;
    cm_optim *opt;
    cm_status s;
    cmt_log_capture_start();
    cm_trainer *tr = cmt_strainer(&rig, mine, 1, &o, &opt, &s);
    const char *log = cmt_log_capture_text();
    cr_assert(strstr(log, "required_on_load algorithm SqueezeExcite({\"latent_channels\":2,\"min_channels\":8}) was "
                          "enabled when training the loaded checkpoint") &&
                  strstr(log, "is now specified in the following forms: "
                              "SqueezeExcite({\"latent_channels\":3,\"min_channels\":8})"),
              "%s", log);
    cmt_log_capture_stop();
    /* not added a second time: the weights then differ in shape (latent 3 vs 2), named by the load */
    cr_assert_null(tr);
    cr_assert_eq(s, CM_ERR_SHAPE, "%s", cm_last_error());
    cm_algorithm_plugin_free(mine[0]);
    cmt_srig_free(&rig);
    cmt_rm_rf(dir);
    free(dir);
}

Test(surgery_trainer, a_required_method_ordered_before_a_users_is_composers_error) {
    char *dir = cmt_temp_dir();
    cm_algorithm_plugin algs[1] = {ghost()};
    train_and_save(CMT_RESNET_IMNET, algs, 1, dir);
    char ck[1024];
    snprintf(ck, sizeof ck, "%s/ba2", dir);
    cmt_srig rig = cmt_srig_new(CMT_RESNET_IMNET, 2);
    /* LowPrecisionLayerNorm runs last, so GhostBatchNorm would go before it — after it already ran */
    cm_low_precision_norm_config lc = cm_low_precision_norm_config_default();
    cm_algorithm_plugin mine[1];
    cr_assert_eq(cm_low_precision_layernorm_new(&lc, &mine[0]), CM_OK);
    cmt_srun o = cmt_srun_default();
    o.load_path = ck;
    cm_optim *opt;
    cm_status s;
    cr_assert_null(cmt_strainer(&rig, mine, 1, &o, &opt, &s));
    cr_assert_eq(s, CM_ERR_STATE);
    cr_assert(strstr(cm_last_error(), "required to successfully load it: [GhostBatchNorm({\"ghost_batch_size\":4})]") &&
                  strstr(cm_last_error(), "ordered before a user specified algorithm (LowPrecisionLayerNorm)") &&
                  strstr(cm_last_error(), "load_exclude_algorithms=['GhostBatchNorm']"),
              "%s", cm_last_error());
    cr_assert(!model_has(rig.model, "GhostBatchNorm2d"), "nothing was applied");
    cm_algorithm_plugin_free(mine[0]);
    cmt_srig_free(&rig);
    cmt_rm_rf(dir);
    free(dir);
}

Test(surgery_trainer, a_required_method_that_fails_is_composers_error) {
    char *dir = cmt_temp_dir();
    cm_algorithm_plugin algs[1] = {se(2, 8)};
    train_and_save(CMT_RESNET_IMNET, algs, 1, dir);
    char ck[1024];
    snprintf(ck, sizeof ck, "%s/ba2", dir);
    /* an MLP has no convolution for SqueezeExcite */
    cmt_srig rig = cmt_srig_new(CMT_MLP, 2);
    cmt_srun o = cmt_srun_default();
    o.load_path = ck;
    o.weights_only = true;
    cm_optim *opt;
    cm_status s;
    cr_assert_null(cmt_strainer(&rig, NULL, 0, &o, &opt, &s));
    cr_assert_eq(s, CM_ERR_UNSUPPORTED, "%s", cm_last_error());
    cr_assert(strstr(cm_last_error(), "Attempted to autocreate and apply required algorithms but SqueezeExcite failed") &&
                  strstr(cm_last_error(), "looked for Conv2d layers") &&
                  strstr(cm_last_error(), "load_exclude_algorithms=['SqueezeExcite']"),
              "%s", cm_last_error());
    cmt_srig_free(&rig);
    cmt_rm_rf(dir);
    free(dir);
}

Test(surgery_trainer, prepare_model_applies_the_checkpoints_surgery_before_a_given_optimizer) {
    char *dir = cmt_temp_dir();
    cm_algorithm_plugin algs[2] = {se(2, 8), blur()};
    train_and_save(CMT_RESNET_IMNET, algs, 2, dir);
    char ck[1024];
    snprintf(ck, sizeof ck, "%s/ba1", dir);
    cmt_srig rig = cmt_srig_new(CMT_RESNET_IMNET, 2);
    cmt_srun o = cmt_srun_default();
    o.load_path = ck;
    o.weights_only = true; /* trained with the trainer's DecoupledSGDW; this run brings its own AdamW */
    o.own_optimizer = true;
    cm_optim *opt;
    cm_status s;
    cr_assert_null(cmt_strainer(&rig, NULL, 0, &o, &opt, &s), "without preparing, the optimizer's spans go stale");
    cr_assert_eq(s, CM_ERR_STATE, "%s", cm_last_error());
    cm_optim_free(opt);
    cmt_srig_free(&rig);
    rig = cmt_srig_new(CMT_RESNET_IMNET, 2);
    o.prepare = true;
    cm_trainer *tr = cmt_strainer(&rig, NULL, 0, &o, &opt, &s);
    cr_assert(tr, "%s", cm_last_error());
    cr_assert(model_has(rig.model, "SqueezeExciteConv2d"));
    cr_assert_eq(cm_engine_n_algorithms(cm_trainer_engine(tr)), 2);
    cr_assert_eq(cm_trainer_fit(tr, NULL), CM_OK, "%s", cm_last_error());
    cm_trainer_free(tr);
    cm_optim_free(opt);
    cmt_srig_free(&rig);
    cmt_rm_rf(dir);
    free(dir);
}

Test(surgery_trainer, no_op_model_replaces_the_model_on_init_only) {
    cmt_srig rig = cmt_srig_new(CMT_MLP, 1);
    cm_algorithm_plugin a[1];
    cr_assert_eq(cm_no_op_model_new(&a[0]), CM_OK);
    cmt_srun o = cmt_srun_default();
    cm_optim *opt;
    cm_status s;
    cm_trainer *tr = cmt_strainer(&rig, a, 1, &o, &opt, &s);
    cr_assert(tr, "%s", cm_last_error());
    cm_state *st = cm_trainer_state(tr);
    cm_model *m = cm_state_model(st);
    cr_assert_str_eq(cm_model_type_name(m), "NoOpModelClass");
    cm_module *root = cm_model_module(m);
    cr_assert_eq(cm_module_n_params(root), 1);
    cr_assert(cm_module_is_locked(root) && !cm_module_is_locked(cm_model_module(rig.model)),
              "the trainer locked the model it trains");
    cm_tensor *w = cm_module_find_param(root, "weights");
    cr_assert_eq(cm_tensor_get_flat(w, 0), 1.5);
    cr_assert_eq(cm_trainer_fit(tr, NULL), CM_OK, "%s", cm_last_error());
    cr_assert_neq(cm_tensor_get_flat(w, 0), 1.5, "the one weight trains toward 1");
    cr_assert(isfinite(cm_state_total_loss(st)));
    /* only in the surgery window */
    cr_assert_eq(cm_state_set_model(st, rig.model), CM_ERR_STATE);
    cr_assert(strstr(cm_last_error(), "only be replaced on INIT"), "%s", cm_last_error());
    cm_trainer_free(tr);
    /* with an optimizer made over the old model: an error */
    o.own_optimizer = true;
    cr_assert_eq(cm_no_op_model_new(&a[0]), CM_OK);
    cr_assert_null(cmt_strainer(&rig, a, 1, &o, &opt, &s));
    cr_assert_eq(s, CM_ERR_STATE);
    cr_assert(strstr(cm_last_error(), "replaced the model on INIT, but the optimizer in the config"), "%s", cm_last_error());
    cm_algorithm_plugin_free(a[0]);
    cm_optim_free(opt);
    cmt_srig_free(&rig);
}

/* A checkpoint on an object store: its surgery is re-applied from the manifest fetched through the
 * store, before the weights are read (load_path s3://... and autoresume on the store). */
Test(surgery_trainer, a_checkpoint_on_an_object_store_reapplies_its_surgery) {
    cmt_s3 s3;
    cmt_s3_start(&s3, "bkt");
    cm_algorithm_plugin algs[2] = {se(2, 8), blur()};
    cmt_srig rig = cmt_srig_new(CMT_RESNET_IMNET, 1);
    cmt_srun o = cmt_srun_default();
    o.max_duration = "2ba";
    o.save_folder = "s3://bkt/surg";
    cm_optim *opt;
    cm_status s;
    cm_trainer *tr = cmt_strainer(&rig, algs, 2, &o, &opt, &s);
    cr_assert(tr, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_fit(tr, NULL), CM_OK, "%s", cm_last_error());
    cm_trainer_free(tr);
    cmt_srig_free(&rig);
    const char *paths[2] = {"s3://bkt/surg/ba2", NULL};
    for (int k = 0; k < 2; k++) {
        rig = cmt_srig_new(CMT_RESNET_IMNET, 2);
        o = cmt_srun_default();
        o.load_path = paths[k];
        if (paths[k]) {
            tr = cmt_strainer(&rig, NULL, 0, &o, &opt, &s);
        } else {
            /* autoresume from the store: the helper's config plus autoresume */
            cm_trainer_config tc = cm_trainer_config_default();
            tc.model = rig.model;
            tc.train_dataloader = rig.dl;
            cr_assert_eq(cm_time_parse("3ba", &tc.max_duration), CM_OK);
            tc.seed = 17;
            tc.save_folder = "s3://bkt/surg";
            tc.save_filename = "ba{batch}";
            tc.save_interval_str = "1ba";
            tc.autoresume = true;
            tc.run_name = "surgery-test";
            tc.handle_signals = false;
            s = cm_trainer_new(&tc, &tr);
            if (s) tr = NULL;
        }
        cr_assert(tr, "%s: %s", paths[k] ? paths[k] : "autoresume", cm_last_error());
        cr_assert(model_has(rig.model, "SqueezeExciteConv2d") && model_has(rig.model, "BlurConv2d"));
        cr_assert_eq(cm_engine_n_algorithms(cm_trainer_engine(tr)), 2);
        cr_assert_eq(cm_state_timestamp(cm_trainer_state(tr))->batch, 2, "resumed at batch 2");
        cr_assert_eq(cm_trainer_fit(tr, NULL), CM_OK, "%s", cm_last_error());
        cm_trainer_free(tr);
        cmt_srig_free(&rig);
    }
    cmt_s3_stop(&s3);
}

/* Weights files record the required-on-load surgery (surgery_algorithms.h): the trainer's engine
 * gives the record, the module writer stores it, ckpt export copies the manifest's, and
 * cm_algorithms_add_recorded makes the methods a config lacks, as loading a checkpoint does. */
Test(surgery_trainer, weights_files_record_their_surgery_and_it_is_made_again) {
    char *dir = cmt_temp_dir();
    cm_algorithm_plugin algs[3] = {se(2, 8), blur(), ghost()};
    train_and_save(CMT_RESNET_IMNET, algs, 3, dir);
    char ck[1024], ex[1024], wf[1024];
    snprintf(ck, sizeof ck, "%s/ba2", dir);
    snprintf(ex, sizeof ex, "%s/export.safetensors", dir);
    snprintf(wf, sizeof wf, "%s/w.safetensors", dir);
    /* the trainer's record: the three methods, in registration order, with every argument */
    cmt_srig rig = cmt_srig_new(CMT_RESNET_IMNET, 2);
    cmt_srun o = cmt_srun_default();
    o.load_path = ck;
    cm_optim *opt;
    cm_status s;
    cmt_log_capture_start();
    cm_trainer *tr = cmt_strainer(&rig, NULL, 0, &o, &opt, &s);
    cmt_log_capture_stop();
    cr_assert(tr, "%s", cm_last_error());
    char *rec;
    cr_assert_eq(cm_engine_required_on_load_json(cm_trainer_engine(tr), &rec), CM_OK, "%s", cm_last_error());
    cr_assert(rec, "three required-on-load methods, no record");
    const char *a = strstr(rec, "{\"name\":\"SqueezeExcite\",\"hparams\":{"), *b = strstr(rec, "{\"name\":\"BlurPool\""),
               *c = strstr(rec, "{\"name\":\"GhostBatchNorm\"");
    cr_assert(rec[0] == '[' && a && b && c && a < b && b < c && strstr(rec, "\"latent_channels\":2"), "%s", rec);
    /* written into the file's metadata next to "format" */
    const char *meta[2] = {CM_SURGERY_METADATA_KEY, rec};
    cr_assert_eq(cm_module_save_safetensors_with(cm_model_module(rig.model), wf, meta, 1), CM_OK, "%s", cm_last_error());
    cm_safetensors *st;
    cr_assert_eq(cm_safetensors_open(wf, &st), CM_OK, "%s", cm_last_error());
    cr_assert_str_eq(cm_safetensors_metadata_get(st, "format"), "pt");
    cr_assert_str_eq(cm_safetensors_metadata_get(st, CM_SURGERY_METADATA_KEY), rec);
    cm_safetensors_close(st);
    const char *twice[2] = {"format", "np"};
    cr_assert_eq(cm_module_save_safetensors_with(cm_model_module(rig.model), wf, twice, 1), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "'format' added twice"), "%s", cm_last_error());
    cr_assert_eq(cm_module_save_safetensors_with(cm_model_module(rig.model), wf, NULL, 1), CM_ERR_INVALID_ARG);
    cm_trainer_free(tr);
    cmt_srig_free(&rig);
    /* ckpt export: the manifest's record, the same text */
    cm_checkpoint *ckp;
    cr_assert_eq(cm_checkpoint_open(ck, &ckp), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_checkpoint_export_model(ckp, ex), CM_OK, "%s", cm_last_error());
    cm_checkpoint_close(ckp);
    cr_assert_eq(cm_safetensors_open(ex, &st), CM_OK, "%s", cm_last_error());
    cr_assert_str_eq(cm_safetensors_metadata_get(st, CM_SURGERY_METADATA_KEY), rec);
    /* and the checkpoint's tensors, byte for byte */
    char mf[1100];
    snprintf(mf, sizeof mf, "%s/model.safetensors", ck);
    cm_safetensors *sm;
    cr_assert_eq(cm_safetensors_open(mf, &sm), CM_OK, "%s", cm_last_error());
    cr_assert(cm_safetensors_count(st) == cm_safetensors_count(sm) && cm_safetensors_count(st) > 0);
    for (size_t i = 0; i < cm_safetensors_count(sm); i++) {
        const cm_st_tensor *t = cm_safetensors_at(sm, i), *u = cm_safetensors_find(st, t->name);
        cr_assert(u && u->nbytes == t->nbytes && !memcmp(u->data, t->data, t->nbytes), "%s", t->name);
    }
    cm_safetensors_close(sm);
    cm_safetensors_close(st);

    /* made again: the methods a list lacks are appended, with Composer's warning */
    cm_algorithm_plugin mine[4] = {se(4, 8)};
    int n = 1, added = -1;
    cmt_log_capture_start();
    cr_assert_eq(cm_algorithms_add_recorded(rec, "w.safetensors", NULL, 0, mine, &n, 4, &added), CM_OK, "%s",
                 cm_last_error());
    const char *log = cmt_log_capture_text();
    cr_assert(n == 3 && added == 2 && !strcmp(mine[1].vt->name, "BlurPool") && !strcmp(mine[2].vt->name, "GhostBatchNorm"),
              "n %d added %d", n, added);
    cr_assert(strstr(log, "Automatically adding required_on_load algorithm BlurPool, which was enabled when training the "
                          "loaded weights 'w.safetensors'") &&
                  strstr(log, "GhostBatchNorm") &&
                  strstr(log, "now specified in the following forms: SqueezeExcite({\"latent_channels\":4"),
              "%s", log);
    cmt_log_capture_stop();
    char hp[256];
    cm_algorithm_hparams_json(mine[1], hp, sizeof hp);
    cr_assert(strstr(hp, "\"min_channels\": 4") || strstr(hp, "\"min_channels\":4"), "BlurPool as recorded: %s", hp);
    for (int i = 1; i < n; i++) cm_algorithm_plugin_free(mine[i]);
    /* excluded by pattern; no room (nothing appended); not such a list; a method this version
     * cannot make (warned and skipped, as Composer) */
    const char *exc[2] = {"Blur*", "Ghost*"};
    n = 1;
    cr_assert_eq(cm_algorithms_add_recorded(rec, "w", exc, 2, mine, &n, 4, &added), CM_OK);
    cr_assert(n == 1 && added == 0);
    cr_assert_eq(cm_algorithms_add_recorded(rec, "w", NULL, 0, mine, &n, 2, &added), CM_ERR_INVALID_ARG);
    cr_assert(n == 1 && strstr(cm_last_error(), "no room for more than 2"), "%s", cm_last_error());
    static const char *const bad[] = {"{}", "[{\"name\": 1, \"hparams\": {}}]", "[{\"name\": \"BlurPool\"}]", "[1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(cm_algorithms_add_recorded(bad[i], "w.safetensors", NULL, 0, mine, &n, 4, NULL), CM_ERR_FORMAT,
                     "%s", bad[i]);
        cr_assert(n == 1 && strstr(cm_last_error(), "'w.safetensors'") && strstr(cm_last_error(), CM_SURGERY_METADATA_KEY),
                  "%s", cm_last_error());
    }
    cmt_log_capture_start();
    cr_assert_eq(cm_algorithms_add_recorded("[{\"name\": \"Hyperdrive\", \"hparams\": {}}]", "w", NULL, 0, mine, &n, 4,
                                            &added),
                 CM_OK);
    cr_assert(n == 1 && added == 0 && strstr(cmt_log_capture_text(), "recreating the algorithm failed"), "%s",
              cmt_log_capture_text());
    cmt_log_capture_stop();
    cr_assert_eq(cm_algorithms_add_recorded(NULL, "w", NULL, 0, mine, &n, 4, &added), CM_OK);
    cr_assert(n == 1 && added == 0);
    cm_algorithm_plugin_free(mine[0]);
    cm_free(rec);
    cmt_rm_rf(dir);
    free(dir);
}
