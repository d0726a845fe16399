/* A tiny GPT-2 trained on N ranks equals one process, under each sharding strategy: the model has
 * what the MLP of dist_train lacks — tied embeddings (lm_head.weight is transformer.wte.weight,
 * read from two units' code), attention, layer norms, views of parameters, one wrap unit per
 * block — and FULL_SHARD must gather every one of them on use, in forward and in backward.
 *
 *   dist_gpt OUT STRATEGY [bf16] [dropout] [ckpt]
 *                                  train 6 batches of 6 sequences in microbatches of 2 (AdamW,
 *                                  clipping); rank 0 writes every parameter and the last loss
 * Outputs are compared with `dist_train --compare A B TOL`.
 *
 * `dropout` sets every dropout of the model to 0.1: masks are keyed by global row, so N ranks
 * still equal one process. `ckpt` checkpoints every block (the default activation checkpointing
 * policy): the same bits as without.
 *
 * `mp=FULL|DEFAULT|PURE`: FSDP mixed precision (Composer's policy for this run's precision);
 * rank 0 prints "bytes: reduced R gathered G", the gradient bytes reduced and the parameter
 * bytes gathered, summed over the ranks. `shard=N`: a hybrid strategy's shard degree.
 *
 * FULL_SHARD prefetch: `bp=PRE|POST|NONE` (backward_prefetch; default the config default,
 * BACKWARD_POST), `fwd` (forward_prefetch), `nolimit` (limit_all_gathers false), `layers=N`
 * (blocks, default 2), `resident=N` (max_resident_units). Rank 0 prints a line "prefetch: ..."
 * with the counters of cm_dist_stats, each summed (maxima: the largest) over the ranks.
 *
 * `gpu`: the model trains on the GPU (moved there after cm_dist_new, as the CLI does; NO_SHARD:
 * the gradients are all-reduced through host memory); `gpu=first`: moved before cm_dist_new (rank
 * 0's weights are broadcast from GPU memory to ranks that built others). Exits 77 where no GPU can be used. */
#include <composer/composer.h>
#include <composer/algorithms.h>
#include <composer/dist.h>
#include <composer/zoo_gpt2.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { T = 8, V = 24, NS = 36 };

typedef struct seqs {
    cm_field_desc fields[2];
} seqs;

static int64_t q_len(void *self) { return NS; }
static int q_nf(void *self) { return 2; }
static const cm_field_desc *q_field(void *self, int i) { return &((seqs *)self)->fields[i]; }
/* A learnable pattern: each sequence counts up by a step from a start, modulo V. */
static cm_status q_get(void *self, int64_t i, const cm_sample_ctx *ctx, void *const *out) {
    int32_t *x = out[0], *y = out[1];
    const int32_t start = (int32_t)(i * 7 % V), step = (int32_t)(1 + i % 3);
    for (int t = 0; t < T; t++) {
        x[t] = (start + step * t) % V;
        y[t] = (start + step * (t + 1)) % V;
    }
    return CM_OK;
}
static int64_t q_tok(void *self, int64_t i) { return T; }
static void q_close(void *self) { free(self); }
static const cm_dataset_i k_seqs = {CM_DATASET_ABI, "seqs", q_len, q_nf, q_field, q_get, q_tok, q_close};

#define TRY(call)                                                                 \
    do {                                                                          \
        if ((call) != CM_OK) {                                                    \
            fprintf(stderr, "dist_gpt: %s failed: %s\n", #call, cm_last_error()); \
            return 1;                                                             \
        }                                                                         \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: dist_gpt OUT STRATEGY [bf16]\n");
        return 2;
    }
    cm_dist_config dc = cm_dist_config_default();
    TRY(cm_sharding_parse(argv[2], &dc.sharding));
    bool bf16 = false, dropout = false, ckpt = false, fused = false;
    int layers = 2, embd = 16;
    bool sgd = false;      /* SGD (lr 0.05, momentum 0.9) instead of AdamW: a step linear in the gradient */
    bool gpu = false, gpu_first = false;
    const char *mp = NULL; /* mp=FULL|DEFAULT|PURE: the mixed precision policy (under this run's precision) */
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "bf16")) bf16 = true;
        else if (!strcmp(argv[i], "dropout")) dropout = true;
        else if (!strcmp(argv[i], "ckpt")) ckpt = true;
        else if (!strcmp(argv[i], "fused")) fused = true;
        else if (!strcmp(argv[i], "fwd")) dc.forward_prefetch = true;
        else if (!strcmp(argv[i], "nolimit")) dc.limit_all_gathers = false;
        else if (!strncmp(argv[i], "layers=", 7)) layers = atoi(argv[i] + 7);
        else if (!strncmp(argv[i], "embd=", 5)) embd = atoi(argv[i] + 5);
        else if (!strncmp(argv[i], "resident=", 9)) dc.max_resident_units = atoi(argv[i] + 9);
        else if (!strncmp(argv[i], "shard=", 6)) dc.shard_degree = atoi(argv[i] + 6);
        else if (!strncmp(argv[i], "mp=", 3)) mp = argv[i] + 3;
        else if (!strcmp(argv[i], "sgd")) sgd = true;
        else if (!strcmp(argv[i], "gpu")) gpu = true;
        else if (!strcmp(argv[i], "gpu=first")) gpu = gpu_first = true;
        else if (!strncmp(argv[i], "bp=", 3)) {
            char name[32];
            snprintf(name, sizeof name, "%s%s", strcmp(argv[i] + 3, "NONE") ? "BACKWARD_" : "", argv[i] + 3);
            TRY(cm_backward_prefetch_parse(name, &dc.backward_prefetch));
        } else {
            fprintf(stderr, "dist_gpt: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (mp) TRY(cm_mixed_precision_policy(mp, bf16 ? CM_PRECISION_AMP_BF16 : CM_PRECISION_FP32, &dc.mixed_precision));
    cm_comm *comm;
    TRY(cm_comm_auto_new(NULL, &comm));
    const int rank = cm_comm_rank(comm), world = cm_comm_size(comm);

    seqs *q = calloc(1, sizeof *q);
    q->fields[0] = (cm_field_desc){"input_ids", CM_DTYPE_I32, 1, {T}};
    q->fields[1] = (cm_field_desc){"labels", CM_DTYPE_I32, 1, {T}};
    cm_dataset *ds;
    TRY(cm_dataset_new(&k_seqs, q, &ds));

    cm_gpt2_config gc = cm_gpt2_config_default();
    gc.vocab_size = V, gc.n_positions = 16, gc.n_embd = embd, gc.n_layer = layers, gc.n_head = 2;
    /* dropout masks are keyed by global row (cm_tape_set_rows), attention's fused one included,
     * so with `dropout` N ranks still equal one process */
    gc.embd_pdrop = gc.attn_pdrop = gc.resid_pdrop = dropout ? 0.1f : 0.0f;
    gc.initializer_range = 0.2f;
    /* no projection biases: the key bias has an exactly-zero gradient (softmax ignores a constant
     * per query), so Adam's normalised step turns its rounding noise into ±lr moves that no two
     * summation orders share */
    gc.bias = false;
    /* gpu=first: the other ranks start from other weights, which only the broadcast of rank 0's
     * (from GPU memory) makes equal */
    cm_rng rng = cm_rng_init(gpu_first && rank > 0 ? 99 : 3, 0);
    cm_model *model;
    TRY(cm_gpt2_new(&gc, &rng, &model));
    if (fused) TRY(cm_gpt2_set_fused_linear_cross_entropy(model, true, 4)); /* lm_head fused with the loss */
    if (ckpt) {
        int marked = 0;
        TRY(cm_module_checkpoint_policy(cm_model_module(model), NULL, 0, &marked));
        if (marked != gc.n_layer) {
            fprintf(stderr, "dist_gpt: the default policy checkpoints %d modules, not the %lld blocks\n", marked,
                    (long long)gc.n_layer);
            return 1;
        }
    }
    if (gpu && cm_device_check(CM_DEVICE_CUDA) != CM_OK) {
        fprintf(stderr, "dist_gpt: no GPU: %s\n", cm_last_error());
        return 77;
    }
    cm_dist *dp;
    if (gpu_first) TRY(cm_module_to_device(cm_model_module(model), CM_DEVICE_CUDA));
    TRY(cm_dist_new(comm, model, &dc, &dp));
    if (gpu && !gpu_first) TRY(cm_module_to_device(cm_model_module(model), CM_DEVICE_CUDA));

    cm_dataloader_config lc = cm_dataloader_config_default();
    lc.batch_size = 6;
    lc.seed = 1;
    lc.rank = rank;
    lc.world_size = world;
    cm_dataloader *dl;
    TRY(cm_dataloader_new(ds, &lc, &dl));

    /* evaluation too: every forward gathers, and the eval loader pads ranks to equal rows */
    cm_dataloader_config ec = cm_dataloader_config_eval();
    ec.batch_size = 8;
    ec.rank = rank;
    ec.world_size = world;
    cm_dataloader *edl;
    TRY(cm_dataloader_new(ds, &ec, &edl));

    const cm_optim_span *ospans;
    int n_ospans;
    TRY(cm_dist_optim_spans(dp, &ospans, &n_ospans));
    cm_optim *opt;
    const cm_optim_kind ok = sgd ? CM_OPTIM_SGD : CM_OPTIM_DECOUPLED_ADAMW;
    cm_optim_hparams hp = cm_optim_hparams_default(ok);
    hp.lr = sgd ? 0.05 : 3e-3;
    if (sgd) hp.momentum = 0.9;
    TRY(cm_optim_new(ok, &opt));
    TRY(cm_optim_add_group(opt, &hp, ospans, n_ospans));
    cm_algorithm_plugin clip;
    TRY(cm_grad_clip_new(CM_GRAD_CLIP_NORM, 1.0, &clip));

    cm_trainer_config cfg = cm_trainer_config_default();
    cfg.model = model;
    cfg.train_dataloader = dl;
    cfg.eval_dataloader = edl;
    cfg.eval_interval = cm_time_make(3, CM_TIME_BATCH);
    cfg.optimizer = opt;
    cfg.algorithms = &clip;
    cfg.n_algorithms = 1;
    cfg.precision = bf16 ? CM_PRECISION_AMP_BF16 : CM_PRECISION_FP32;
    cfg.device = gpu ? CM_DEVICE_CUDA : CM_DEVICE_CPU;
    cfg.device_train_microbatch_size = 2;
    cfg.run_name = "dist-gpt";
    TRY(cm_time_parse("6ba", &cfg.max_duration));
    cm_dist_trainer_hooks(dp, &cfg);
    cm_trainer *tr;
    TRY(cm_trainer_new(&cfg, &tr));
    TRY(cm_dist_attach(dp, tr));
    if (cm_trainer_fit(tr, NULL) != CM_OK) {
        fprintf(stderr, "dist_gpt: rank %d: fit failed: %s\n", rank, cm_last_error());
        return 1;
    }
    /* the prefetch counters before gather_params (which takes what is still pending) */
    const cm_dist_stats st = cm_dist_get_stats(dp);
    int64_t sums[5] = {st.n_gathers, st.n_prefetches, st.n_prefetch_hits, st.n_prefetch_unused, 0};
    double bytes[5] = {st.bytes, st.gather_bytes, (double)st.n_buckets_early, (double)st.n_buckets_late,
                       (double)st.n_gathers};
    TRY(cm_comm_all_reduce(comm, bytes, 5, CM_COMM_F64, CM_REDUCE_SUM));
    if (rank == 0)
        printf("bytes: reduced %.0f gathered %.0f (buckets %.0f early, %.0f late; %.0f gathers)\n", bytes[0], bytes[1],
               bytes[2], bytes[3], bytes[4]);
    int64_t maxes[2] = {st.max_in_flight, st.max_gathered};
    TRY(cm_comm_all_reduce(comm, sums, 5, CM_COMM_I64, CM_REDUCE_SUM));
    TRY(cm_comm_all_reduce(comm, maxes, 2, CM_COMM_I64, CM_REDUCE_MAX));
    TRY(cm_dist_gather_params(dp));
    /* every unit is resident now: how much of this rank's memory is in transparent huge pages
     * (FULL_SHARD's units of 2 MiB and more ask for them) */
    long huge_kb = -1;
    FILE *sr = fopen("/proc/self/smaps_rollup", "r");
    for (char line[256]; sr && fgets(line, sizeof line, sr);)
        if (sscanf(line, "AnonHugePages: %ld kB", &huge_kb) == 1) break;
    if (sr) fclose(sr);
    if (rank == 0) printf("hugepages: %ld kB\n", huge_kb);
    if (rank == 0)
        printf("prefetch: %s %s%s%s: gathers %lld prefetched %lld hits %lld unused %lld max_in_flight %lld "
               "max_gathered %lld\n",
               cm_sharding_name(dc.sharding), cm_backward_prefetch_name(dc.backward_prefetch),
               dc.forward_prefetch ? " forward_prefetch" : "", dc.limit_all_gathers ? "" : " no-limit",
               (long long)sums[0], (long long)sums[1], (long long)sums[2], (long long)sums[3], (long long)maxes[0],
               (long long)maxes[1]);
    if (rank == 0) {
        FILE *f = fopen(argv[1], "w");
        if (!f) {
            fprintf(stderr, "dist_gpt: cannot write %s\n", argv[1]);
            return 1;
        }
        cm_module *root = cm_model_module(model);
        for (int64_t k = 0; k < cm_module_n_params(root); k++) { /* a host copy of each parameter (it may be on a GPU) */
            cm_tensor *h;
            TRY(cm_tensor_to_device(cm_module_param_info(root, k).tensor, CM_DEVICE_CPU, &h));
            const float *p = cm_tensor_data(h);
            for (int64_t i = 0; i < cm_tensor_numel(h); i++) fprintf(f, "%.9g\n", p[i]);
            cm_tensor_free(h);
        }
        fprintf(f, "%.9g\n", cm_state_total_loss(cm_trainer_state(tr)));
        const int n_eval = cm_state_n_metrics(cm_trainer_state(tr), "eval");
        if (n_eval < 1) {
            fprintf(stderr, "dist_gpt: no eval metrics\n");
            return 1;
        }
        for (int i = 0; i < n_eval; i++) {
            const char *name;
            double v;
            TRY(cm_state_metric_at(cm_trainer_state(tr), "eval", i, &name, &v));
            fprintf(f, "%.9g\n", v);
        }
        fclose(f);
        printf("dist_gpt: %d ranks, %s%s%s: loss %.6f, %d units, gathers %lld\n", world,
               cm_sharding_name(dc.sharding), bf16 ? ", amp_bf16" : "", ckpt ? ", checkpointed" : "",
               cm_state_total_loss(cm_trainer_state(tr)), cm_module_n_units(root), (long long)st.n_gathers);
    }
    cm_trainer_free(tr);
    cm_optim_free(opt);
    cm_dist_free(dp);
    cm_dataloader_free(dl);
    cm_dataloader_free(edl);
    cm_dataset_free(ds);
    cm_model_free(model);
    cm_comm_free(comm);
    return 0;
}
