/* The streaming dataset across real processes (tests/dist/run.sh streaming_*).
 *
 *   dist_streaming write DIR [URI]
 *       writes the synthetic classification set (synth.h, 240 samples) as MDS shards of about 30
 *       samples into DIR ("input" ndarray:float32:12, "label" int), and uploads its files to URI.
 *   dist_streaming read OUT REMOTE LOCAL [CACHE_LIMIT]
 *       every rank reads its part of epoch 0 (global batch 12, shuffled py1e) through a
 *       dataloader, with LOCAL as the cache shared by the ranks (CACHE_LIMIT bytes at most);
 *       rank 0 writes each step's global sample ids ("S <step> id...", sorted) and
 *       "F <shards fetched by all ranks>" to OUT.
 *   dist_streaming train OUT REMOTE LOCAL [--save DIR] [--load PATH] [--max 30ba] [--interval 5ba]
 *       trains the MLP of synth.h on the streaming dataset with the Trainer (DDP, NO_SHARD, Adam,
 *       global batch 12), checkpoints to DIR; rank 0 writes "S <batch> ids..." (every rank's
 *       samples of that batch, sorted), "L <batch> <loss>", "R <path>" when it resumed, and
 *       "P <value>" for every final parameter (dist_ckpt --compare reads L and P).
 */
#include <composer/composer.h>
#include <composer/dist.h>
#include <composer/storage.h>
#include <composer/streaming.h>

#include "synth.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N = 240, G = 12 };

static int g_rank;
static cm_comm *g_comm;
#define TRY(call)                                                                                        \
    do {                                                                                                 \
        if ((call) != CM_OK) {                                                                           \
            fprintf(stderr, "dist_streaming: rank %d: %s failed: %s\n", g_rank, #call, cm_last_error()); \
            fflush(stderr);                                                                              \
            if (g_comm) cm_comm_barrier(g_comm);                                                         \
            return 1;                                                                                    \
        }                                                                                                \
    } while (0)

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Every rank's sample ids of the batch, sorted (each rank fills its slice of a zeroed array, a
 * sum over the ranks puts them together); -1 marks no sample. `sum` sums doubles over the ranks. */
static cm_status gather_ids(const cm_batch *b, int world, cm_status (*sum)(double *, int, const void *), const void *ctx,
                            double all[G]) {
    memset(all, 0, sizeof(double) * G);
    const int64_t per = G / world;
    for (int64_t q = 0; q < b->n_rows && q < per; q++) all[g_rank * per + q] = (double)(b->indices[q] + 1);
    cm_status s = sum(all, G, ctx);
    qsort(all, G, sizeof(double), cmp_d);
    for (int k = 0; k < G; k++) all[k] -= 1;
    return s;
}

static void print_ids(FILE *f, long long step, const double all[G]) {
    fprintf(f, "S %lld", step);
    for (int k = 0; k < G; k++)
        if (all[k] >= 0) fprintf(f, " %lld", (long long)all[k]);
    fprintf(f, "\n");
}

static cm_status comm_sum(double *v, int n, const void *ctx) {
    (void)ctx;
    return cm_comm_all_reduce_sum_f64(g_comm, v, n);
}

static cm_status open_stream(const char *remote, const char *local, int world, int64_t cache_limit, cm_dataset **ds) {
    cm_streaming_config sc = cm_streaming_config_default();
    sc.cache_limit = cache_limit;
    sc.remote = remote;
    sc.local = local;
    sc.batch_size = G / world;
    sc.shuffle = true;
    sc.shuffle_block_size = 50;
    sc.validate_hash = "xxh64";
    return cm_dataset_streaming_new(&sc, g_rank, world, ds);
}

static int cmd_write(const char *dir, const char *uri) {
    cm_dataset *src;
    TRY(dt_synth_new(N, false, &src));
    cm_mds_column cols[] = {{"input", "ndarray:float32:12"}, {"label", "int"}};
    cm_mds_writer_config wc = cm_mds_writer_config_default();
    wc.size_limit = 2000; /* about 30 samples a shard */
    const char *h[] = {"xxh64"};
    wc.hashes = h, wc.n_hashes = 1;
    wc.compression = "zstd";
    cm_mds_writer *w;
    TRY(cm_mds_writer_new(dir, cols, 2, &wc, &w));
    for (int64_t i = 0; i < N; i++) {
        float x[DT_D];
        int64_t y;
        void *out[2] = {x, &y};
        TRY(cm_dataset_get(src, i, NULL, out));
        cm_mds_value v[2] = {{.data = x, .size = sizeof x, .dtype = CM_MDS_DT_F32, .ndim = 1, .shape = {DT_D}},
                             {.data = &y, .size = 8}};
        TRY(cm_mds_writer_write(w, v));
    }
    TRY(cm_mds_writer_finish(w));
    printf("wrote %d shards to %s\n", cm_mds_writer_n_shards(w), dir);
    cm_mds_writer_free(w);
    cm_dataset_free(src);
    if (!uri) return 0;
    cm_object_store *st;
    TRY(cm_object_store_open(uri, NULL, &st));
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        TRY(cm_object_store_upload(st, e->d_name, p));
    }
    if (d) closedir(d);
    cm_object_store_close(st);
    return 0;
}

static int cmd_read(const char *out, const char *remote, const char *local, int64_t cache_limit) {
    const int world = cm_comm_size(g_comm);
    cm_dataset *ds;
    TRY(open_stream(remote, local, world, cache_limit, &ds));
    cm_dataloader_config lc = cm_dataloader_config_default();
    lc.batch_size = G;
    lc.rank = g_rank;
    lc.world_size = world;
    cm_dataloader *dl;
    TRY(cm_dataloader_new(ds, &lc, &dl));
    FILE *f = g_rank == 0 ? fopen(out, "w") : NULL;
    cm_batch *b;
    long long step = 0;
    for (;;) {
        TRY(cm_dataloader_next(dl, &b));
        if (!b) break;
        double all[G];
        TRY(gather_ids(b, world, comm_sum, NULL, all));
        if (f) print_ids(f, step, all);
        step++;
    }
    double fetched = (double)cm_streaming_n_fetched(ds);
    TRY(cm_comm_all_reduce_sum_f64(g_comm, &fetched, 1));
    if (f) {
        fprintf(f, "F %lld\n", (long long)fetched);
        fclose(f);
    }
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
    return 0;
}

/* ---- training ---- */

typedef struct rec {
    FILE *f;
    int world;
    double ids[G];
} rec;

static cm_status state_sum(double *v, int n, const void *ctx) { return cm_state_all_reduce_sum(ctx, v, n); }

static cm_status rec_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    (void)lg;
    rec *r = self;
    if (ev == CM_EVENT_AFTER_DATALOADER) return gather_ids(cm_state_batch(st), r->world, state_sum, st, r->ids);
    if (ev != CM_EVENT_BATCH_END || !r->f) return CM_OK;
    const long long bt = (long long)cm_state_timestamp(st)->batch;
    print_ids(r->f, bt, r->ids);
    fprintf(r->f, "L %lld %.9g\n", bt, cm_state_total_loss(st));
    return CM_OK;
}
static void rec_free(void *self) { (void)self; }
static const cm_callback_i k_rec = {CM_CALLBACK_ABI, "SampleRecorder", rec_event, NULL, NULL, NULL, rec_free};

static int cmd_train(int argc, char **argv) {
    const char *out = argv[0], *remote = argv[1], *local = argv[2], *save = NULL, *load = NULL, *max = "30ba",
               *interval = "5ba";
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--save") && v) save = v, i++;
        else if (!strcmp(a, "--load") && v) load = v, i++;
        else if (!strcmp(a, "--max") && v) max = v, i++;
        else if (!strcmp(a, "--interval") && v) interval = v, i++;
        else {
            fprintf(stderr, "dist_streaming: unknown argument '%s'\n", a);
            return 2;
        }
    }
    const int world = cm_comm_size(g_comm);
    cm_dataset *ds;
    TRY(open_stream(remote, local, world, 0, &ds));
    cm_model *model;
    TRY(dt_mlp_new(0, 0.0f, &model));
    cm_dist *dp;
    TRY(cm_dist_new(g_comm, model, NULL, &dp));
    const cm_optim_span *spans;
    int n_spans;
    TRY(cm_dist_optim_spans(dp, &spans, &n_spans));
    cm_optim *opt;
    TRY(cm_optim_new(CM_OPTIM_ADAM, &opt));
    cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_ADAM);
    hp.lr = 1e-2;
    TRY(cm_optim_add_group(opt, &hp, spans, n_spans));
    cm_dataloader_config lc = cm_dataloader_config_default();
    lc.batch_size = G;
    lc.rank = g_rank;
    lc.world_size = world;
    cm_dataloader *dl;
    TRY(cm_dataloader_new(ds, &lc, &dl));
    FILE *f = NULL;
    if (g_rank == 0 && !(f = fopen(out, "w"))) {
        fprintf(stderr, "dist_streaming: cannot write %s\n", out);
        return 1;
    }
    rec r = {f, world, {0}};
    cm_callback_plugin cb = {&k_rec, &r};
    cm_trainer_config cfg = cm_trainer_config_default();
    cfg.model = model;
    cfg.optimizer = opt;
    cfg.train_dataloader = dl;
    TRY(cm_time_parse(max, &cfg.max_duration));
    cfg.device_train_microbatch_size = 2;
    cfg.callbacks = &cb;
    cfg.n_callbacks = 1;
    cfg.run_name = "dist-streaming";
    cfg.save_folder = save;
    cfg.save_interval_str = interval;
    cfg.load_path = load;
    cm_dist_trainer_hooks(dp, &cfg);
    cm_trainer *tr;
    TRY(cm_trainer_new(&cfg, &tr));
    TRY(cm_dist_attach(dp, tr));
    if (f && cm_trainer_resumed_from(tr)) fprintf(f, "R %s\n", cm_trainer_resumed_from(tr));
    TRY(cm_trainer_fit(tr, NULL));
    TRY(cm_dist_gather_params(dp));
    if (f) {
        cm_module *root = cm_model_module(model);
        for (int u = 0; u < cm_module_n_units(root); u++) {
            const cm_unit_info *ui = cm_module_unit(root, u);
            for (int64_t i = 0; i < ui->numel; i++) fprintf(f, "P %.9g\n", ui->params[i]);
        }
        fclose(f);
        printf("dist_streaming: %d ranks: loss %.6f\n", world, cm_state_total_loss(cm_trainer_state(tr)));
    }
    cm_trainer_free(tr);
    cm_optim_free(opt);
    cm_dist_free(dp);
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
    cm_model_free(model);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "write")) return cmd_write(argv[2], argc > 3 ? argv[3] : NULL);
    if (argc < 5 || (strcmp(argv[1], "read") && strcmp(argv[1], "train"))) {
        fprintf(stderr, "usage: see the comment at the top of dist_streaming.c\n");
        return 2;
    }
    TRY(cm_comm_auto_new(NULL, &g_comm));
    g_rank = cm_comm_rank(g_comm);
    int rc = !strcmp(argv[1], "read") ? cmd_read(argv[2], argv[3], argv[4], argc > 5 ? atoll(argv[5]) : 0)
                                      : cmd_train(argc - 2, argv + 2);
    cm_comm_free(g_comm);
    return rc;
}
