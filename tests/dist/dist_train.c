/* N ranks train the same steps as one process: a 3-layer MLP (each linear its own wrap unit, so
 * three gradient buckets) on a synthetic classification set, global batch 10 in microbatches of
 * 2 — uneven over 3 and 4 ranks (4+3+3, 3+3+2+2) — with gradient clipping by the global norm.
 *
 *   dist_train OUT [tokens] [tail] [dropout] [value] [auto=BYTES | plan=BYTES] [STRATEGY]
 *                                 (value: clip each gradient element to ±0.02 instead of the norm)
 *                                 train; rank 0 writes the parameters, the last loss and the
 *                                 train accuracy to OUT (f64 text, one value per line);
 *                                 STRATEGY: NO_SHARD (default), SHARD_GRAD_OP, FULL_SHARD
 *   dist_train --compare A B TOL  compare two such files: |a - b| <= TOL·max(1, |a|) for all
 *
 * `tokens` weights microbatches by tokens (1..5 per sample) instead of samples (microbatches of
 * one sample, see below). `tail` uses 62 samples: every 7th batch has 2 samples, so on 3 or 4
 * ranks some slices are empty (FULL_SHARD then runs phantom microbatches from the dataset). */
#include <composer/composer.h>
#include <composer/algorithms.h>
#include <composer/dist.h>

#include "synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

enum { NS = 60 };

static int64_t g_ns = NS; /* `tail`: 62 samples, so each epoch ends with a batch of 2 (empty slices) */


#define TRY(call)                                                                   \
    do {                                                                            \
        if ((call) != CM_OK) {                                                      \
            fprintf(stderr, "dist_train: %s failed: %s\n", #call, cm_last_error()); \
            return 1;                                                               \
        }                                                                           \
    } while (0)

static int compare(const char *a, const char *b, double tol) {
    FILE *fa = fopen(a, "r"), *fb = fopen(b, "r");
    if (!fa || !fb) {
        fprintf(stderr, "compare: cannot open %s\n", fa ? b : a);
        return 1;
    }
    double x, y, worst = 0;
    long n = 0, bad = 0, worst_i = -1;
    while (fscanf(fa, "%lf", &x) == 1) {
        if (fscanf(fb, "%lf", &y) != 1) {
            fprintf(stderr, "compare: %s has fewer values than %s (%ld)\n", b, a, n);
            return 1;
        }
        double rel = fabs(x - y) / fmax(1.0, fabs(x));
        if (rel > worst) worst = rel, worst_i = n;
        if (!(rel <= tol)) {
            if (bad < 5) fprintf(stderr, "compare: value %ld: %.9g vs %.9g (|diff|/max(1,|a|) = %.3g > tol %.3g)\n", n, x, y, rel, tol);
            bad++;
        }
        n++;
    }
    if (fscanf(fb, "%lf", &y) == 1) {
        fprintf(stderr, "compare: %s has more values than %s\n", b, a);
        return 1;
    }
    printf("compare %s %s: %ld values, worst |diff|/max(1,|a|) = %.3g at value %ld (tol %.3g), %ld over\n", a, b, n,
           worst, worst_i, tol, bad);
    fclose(fa);
    fclose(fb);
    return bad || n == 0 ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "--compare")) return compare(argv[2], argv[3], atof(argv[4]));
    if (argc < 2) {
        fprintf(stderr, "usage: dist_train OUT [tokens] | dist_train --compare A B TOL\n");
        return 2;
    }
    bool tokens = false, dropout = false, clip_value = false;
    size_t auto_budget = 0; /* auto=BYTES: automatic microbatching under this arena budget */
    bool plan = false;      /* plan=BYTES: the same, with the pre-flight memory plan (auto=: the search alone) */
    cm_dist_config dc = cm_dist_config_default();
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "tokens")) tokens = true;
        else if (!strcmp(argv[i], "tail")) g_ns = 62;
        else if (!strcmp(argv[i], "dropout")) dropout = true;
        else if (!strcmp(argv[i], "value")) clip_value = true;
        else if (!strncmp(argv[i], "auto=", 5)) auto_budget = (size_t)atoll(argv[i] + 5);
        else if (!strncmp(argv[i], "shard=", 6)) dc.shard_degree = atoi(argv[i] + 6); /* HYBRID: ranks a group */
        else if (!strncmp(argv[i], "plan=", 5)) auto_budget = (size_t)atoll(argv[i] + 5), plan = true;
        else if (cm_sharding_parse(argv[i], &dc.sharding) != CM_OK) {
            fprintf(stderr, "dist_train: %s\n", cm_last_error());
            return 2;
        }
    }
    cm_comm *comm;
    TRY(cm_comm_auto_new(NULL, &comm));
    const int rank = cm_comm_rank(comm), world = cm_comm_size(comm);

    cm_dataset *ds;
    TRY(dt_synth_new(g_ns, true, &ds));

    /* a different stream per rank on purpose: cm_dist_new's broadcast must fix it; dropout masks
     * are keyed by global row, so N ranks still equal 1 process */
    cm_model *model;
    TRY(dt_mlp_new((uint64_t)rank, dropout ? 0.3f : 0.0f, &model));

    cm_dist *dp;
    TRY(cm_dist_new(comm, model, &dc, &dp));

    cm_dataloader_config lc = cm_dataloader_config_default();
    lc.batch_size = 10;
    lc.seed = 5;
    lc.rank = rank;
    lc.world_size = world;
    lc.drop_last = g_ns == NS; /* tail: keep the short batch */
    cm_dataloader *dl;
    TRY(cm_dataloader_new(ds, &lc, &dl));

    /* Adam moments: under SHARD_GRAD_OP each rank keeps them for its pieces only */
    const cm_optim_span *ospans;
    int n_ospans;
    TRY(cm_dist_optim_spans(dp, &ospans, &n_ospans));
    cm_optim *opt;
    cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_DECOUPLED_ADAMW);
    hp.lr = 1e-2;
    hp.weight_decay = 1e-4;
    TRY(cm_optim_new(CM_OPTIM_DECOUPLED_ADAMW, &opt));
    TRY(cm_optim_add_group(opt, &hp, ospans, n_ospans));

    cm_algorithm_plugin clip;
    TRY(clip_value ? cm_grad_clip_new(CM_GRAD_CLIP_VALUE, 0.02, &clip) : cm_grad_clip_new(CM_GRAD_CLIP_NORM, 0.5, &clip));
    cm_trainer_config cfg = cm_trainer_config_default();
    cfg.model = model;
    cfg.train_dataloader = dl;
    cfg.optimizer = opt;
    cfg.compute_training_metrics = true; /* the ranks' accuracy is compared */
    TRY(cm_time_parse("8ba", &cfg.max_duration));
    /* token weighting is grouping-independent only for a loss that is a mean over tokens; this
     * classifier's loss is a mean over samples, so with tokens every microbatch is one sample */
    cfg.device_train_microbatch_size = tokens ? 1 : 2;
    if (auto_budget) {
        cfg.device_train_microbatch_size = CM_MICROBATCH_AUTO;
        cfg.arena_budget = auto_budget;
        cfg.plan_memory = plan;
    }
    cfg.accumulate_train_batch_on_tokens = tokens;
    cfg.algorithms = &clip;
    cfg.n_algorithms = 1;
    /* OptimizerMonitor's norms must be the global ones on every rank (sums over shards) */
    cm_callback_plugin om;
    TRY(cm_optimizer_monitor_new(NULL, &om));
    cm_in_memory_logger *mem;
    cm_logger_plugin memp;
    TRY(cm_in_memory_logger_new(&mem, &memp));
    cfg.callbacks = &om;
    cfg.n_callbacks = 1;
    cfg.loggers = &memp;
    cfg.n_loggers = 1;
    cfg.run_name = "dist-train";
    cm_dist_trainer_hooks(dp, &cfg);
    cm_trainer *tr;
    TRY(cm_trainer_new(&cfg, &tr));
    TRY(cm_dist_attach(dp, tr));
    cm_status st = cm_trainer_fit(tr, NULL);
    if (st) {
        fprintf(stderr, "dist_train: rank %d: fit failed: %s\n", rank, cm_last_error());
        return 1;
    }
    /* the optimizer state really is sharded: each rank's moments cover its piece of each unit (of
     * its shard group's pieces, under a hybrid strategy) */
    const int sw = cm_comm_size(cm_dist_shard_comm(dp)), sr = cm_comm_rank(cm_dist_shard_comm(dp));
    if (cm_sharding_is_hybrid(dc.sharding) ? sw * cm_comm_size(cm_dist_replicate_comm(dp)) != world || sw == world
                                           : sw != world) {
        fprintf(stderr, "dist_train: rank %d: shard group of %d ranks in a world of %d\n", rank, sw, world);
        return 1;
    }
    for (int u = 0; u < cm_module_n_units(cm_model_module(model)); u++) {
        const cm_unit_info *ui = cm_module_unit(cm_model_module(model), u);
        const int64_t chunk = (ui->numel + sw - 1) / sw;
        int64_t b = sr * chunk, e = b + chunk;
        if (b > ui->numel) b = ui->numel;
        if (e > ui->numel) e = ui->numel;
        const int64_t want = dc.sharding == CM_SHARDING_NO_SHARD ? ui->numel : e - b;
        char name[160];
        snprintf(name, sizeof name, "%s.exp_avg", ui->name);
        cm_optim_state_entry ent;
        TRY(cm_optim_state_find(opt, name, &ent));
        if (ent.numel != want) {
            fprintf(stderr, "dist_train: rank %d: %s has %lld elements, expected %lld\n", rank, name,
                    (long long)ent.numel, (long long)want);
            return 1;
        }
    }
    /* FULL_SHARD keeps only chunks at rest: after the last step every unit's full parameter and
     * gradient buffers have given their pages back to the system (mincore: none resident) */
    if (dc.sharding == CM_SHARDING_FULL_SHARD || dc.sharding == CM_SHARDING_HYBRID_SHARD) {
        for (int u = 0; u < cm_module_n_units(cm_model_module(model)); u++) {
            const cm_unit_info *ui = cm_module_unit(cm_model_module(model), u);
            const size_t page = 4096, len = ((size_t)ui->numel * sizeof(float) + page - 1) / page * page;
            for (int which = 0; which < 2; which++) { /* parameters, then gradients */
                unsigned char vec[64] = {0};
                if (len / page > sizeof vec || mincore(which ? ui->grads : ui->params, len, vec) != 0) {
                    fprintf(stderr, "dist_train: mincore on unit %s failed\n", ui->name);
                    return 1;
                }
                for (size_t k = 0; k < len / page; k++)
                    if (vec[k] & 1) {
                        fprintf(stderr, "dist_train: rank %d: unit %s still holds page %zu of its full %s\n", rank,
                                ui->name, k, which ? "gradients" : "parameters");
                        return 1;
                    }
            }
        }
    }
    /* FULL_SHARD keeps only chunks at rest: gather every unit before reading the model (all ranks) */
    TRY(cm_dist_gather_params(dp));
    const cm_dist_stats ds_ = cm_dist_get_stats(dp);
    double acc = NAN;
    cm_state_metric(cm_trainer_state(tr), "train", "MulticlassAccuracy", &acc);
    if (rank == 0) {
        FILE *f = fopen(argv[1], "w");
        if (!f) {
            fprintf(stderr, "dist_train: cannot write %s\n", argv[1]);
            return 1;
        }
        cm_module *root = cm_model_module(model);
        for (int u = 0; u < cm_module_n_units(root); u++) {
            const cm_unit_info *ui = cm_module_unit(root, u);
            for (int64_t i = 0; i < ui->numel; i++) fprintf(f, "%.9g\n", ui->params[i]);
        }
        fprintf(f, "%.9g\n%.9g\n", cm_state_total_loss(cm_trainer_state(tr)), acc);
        static const char *const keys[] = {"l2_norm/grad/%s", "l2_norm/param/%s", "l2_norm/moment/%s",
                                           "l2_norm/second_moment_sqrt/%s", "l2_norm/update/%s",
                                           "cosine/update_grad/%s", "cosine/moment_grad/%s"};
        for (int64_t i = 0; i < cm_module_n_params(root); i++)
            for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
                char key[256];
                double v;
                snprintf(key, sizeof key, keys[k], cm_module_param_info(root, i).name);
                if (cm_in_memory_logger_last(mem, key, &v) != CM_OK) {
                    fprintf(stderr, "dist_train: OptimizerMonitor logged no %s\n", key);
                    return 1;
                }
                fprintf(f, "%.9g\n", v);
            }
        double gn;
        TRY(cm_in_memory_logger_last(mem, "l2_norm/grad/global", &gn));
        fprintf(f, "%.9g\n", gn);
        fclose(f);
        printf("dist_train: %d ranks, %s, %s weighting: loss %.6f, accuracy %.4f, buckets early %lld late %lld, "
               "gathers %lld\n", world,
               cm_sharding_name(dc.sharding), tokens ? "token" : "sample", cm_state_total_loss(cm_trainer_state(tr)), acc,
               (long long)ds_.n_buckets_early, (long long)ds_.n_buckets_late, (long long)ds_.n_gathers);
    }
    if (auto_budget && rank == 0)
        printf("dist_train: automatic microbatch size settled at %lld rows\n",
               (long long)cm_state_microbatch_size(cm_trainer_state(tr)));
    cm_trainer_free(tr);
    cm_optim_free(opt);
    cm_dist_free(dp);
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
    cm_model_free(model);
    cm_comm_free(comm);
    return 0;
}
