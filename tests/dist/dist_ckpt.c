/* Checkpoints of multi-rank runs, sharded and replicated, saved on N ranks and resumed on M.
 *
 * The sharded strategy here is a test double of ZeRO-2 (SHARD_GRAD_OP) built on the trainer's
 * dist hooks, so the checkpoint layer can be proved without the real one: every unit's flat
 * buffer is split as cm_shard_span says (chunk = ceil(numel / W)); span.params points into the
 * model's own flat parameters at begin, span.grads at a per-rank buffer; sync_grads all-reduces
 * the full gradients (as DDP) and copies this rank's range into span.grads; the optimizer (Adam)
 * holds only the spans, so its state is sharded too; sync_params all-reduces zero-filled copies
 * of every rank's piece (exact: x + 0 = x), so every rank's model has all updated parameters. The
 * trainer does not call sync_params after the step yet, so a BATCH_END callback does. --full is
 * FULL_SHARD-like: the spans are separate master copies, the model's flat buffers are NaN at rest
 * (gathered at BATCH_START, poisoned at BATCH_END), so a checkpoint that read or wrote the flat
 * buffers instead of the spans would show.
 *
 * --strategy SHARD_GRAD_OP|FULL_SHARD|NO_SHARD uses the real cm_dist strategy instead (its own
 * optimizer spans, hooks, backward overlap and cm_dist_gather_params for the final parameters).
 *
 *   dist_ckpt OUT [--shard | --full | --strategy S [--shard-degree N]] [--save DIR] [--interval 4ba] [--load PATH]
 *                 [--autoresume]
 *                 [--batch 10] [--max 12ba] [--fault kill|fail:RANK:NTH]
 *                 [--save-weights-only] [--load-weights-only] [--term RANK:BATCH]
 *       train a 3-layer MLP; rank 0 writes "L <batch> <loss>" per batch and "P <value>" for
 *       every final parameter to OUT, and "R <path>" for the checkpoint it resumed from.
 *       --fault: rank RANK dies (SIGKILL) or fails at its NTH collective save, after writing
 *       its files. --term: rank RANK alone gets SIGTERM at the end of batch BATCH; every rank
 *       must stop after the same batch and save (exit 143, "I <batch>" in OUT).
 *   dist_ckpt --compare REF OUT TOL
 *       every L line of OUT against REF's line of the same batch, every P line in order:
 *       |a - b| <= TOL·max(1, |a|).
 */
#include <composer/composer.h>
#include <composer/dist.h>

#include "synth.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NS = 60 };


static int g_rank;
static int g_term_rank = -1;  /* --term RANK:BATCH: that rank raises SIGTERM at the end of that batch */
static int64_t g_term_batch;
static cm_comm *g_comm;
/* On a failure every rank prints its error and waits for the others at a barrier before exiting
 * (the launcher ends the job at the first nonzero exit: without it, a slower rank might be
 * killed before printing; a rank that is gone makes the barrier time out instead). */
#define TRY(call)                                                                                    \
    do {                                                                                             \
        if ((call) != CM_OK) {                                                                       \
            fprintf(stderr, "dist_ckpt: rank %d: %s failed: %s\n", g_rank, #call, cm_last_error()); \
            fflush(stderr);                                                                          \
            if (g_comm) cm_comm_barrier(g_comm);                                                     \
            return 1;                                                                                \
        }                                                                                            \
    } while (0)

/* ---- the sharded test double ---- */

typedef struct zero2 {
    cm_comm *comm;
    cm_dist *dp; /* NO_SHARD: its sync_grads all-reduces the full flat gradients */
    cm_module *root;
    cm_shard_span *spans;
    int n;
    float *tmp;
    bool sharded;
    bool full; /* FULL_SHARD-like: span.params are separate master copies, the flat buffers hold
                  NaN at rest (gathered at BATCH_START, poisoned at BATCH_END) */
} zero2;

static cm_status z_all_reduce_sum(double *v, int n, void *data) { return cm_comm_all_reduce_sum_f64(((zero2 *)data)->comm, v, n); }
static cm_status z_barrier(void *data) { return cm_comm_barrier(((zero2 *)data)->comm); }
static cm_status z_broadcast(void *buf, int64_t bytes, int root, void *data) {
    return cm_comm_broadcast(((zero2 *)data)->comm, buf, bytes, CM_COMM_U8, root);
}
static cm_status z_all_gather(const void *send, void *recv, int64_t bytes, void *data) {
    return cm_comm_all_gather(((zero2 *)data)->comm, send, recv, bytes, CM_COMM_U8);
}
static cm_status z_sync_grads(cm_state *st, void *data) {
    zero2 *z = data;
    cm_status s = cm_dist_sync_grads(z->dp);
    for (int i = 0; !s && z->sharded && i < z->n; i++) {
        const cm_unit_info *ui = cm_module_unit(z->root, z->spans[i].unit);
        memcpy(z->spans[i].grads, ui->grads + z->spans[i].begin, sizeof(float) * (size_t)(z->spans[i].end - z->spans[i].begin));
    }
    return s;
}
static cm_status z_sync_params(cm_state *st, void *data) {
    zero2 *z = data;
    for (int i = 0; i < z->n; i++) {
        const cm_shard_span *sp = &z->spans[i];
        const cm_unit_info *ui = cm_module_unit(z->root, sp->unit);
        memset(z->tmp, 0, sizeof(float) * (size_t)ui->numel);
        memcpy(z->tmp + sp->begin, sp->params, sizeof(float) * (size_t)(sp->end - sp->begin));
        cm_status s = cm_comm_all_reduce_sum_f32(z->comm, z->tmp, ui->numel);
        if (s) return s;
        memcpy(ui->params, z->tmp, sizeof(float) * (size_t)ui->numel);
    }
    return CM_OK;
}

/* ---- a callback: the loss per batch (rank 0) and the parameter all-gather after each step ---- */

typedef struct rec {
    zero2 *z;
    FILE *f;
} rec;

static cm_status rec_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    rec *r = self;
    if (ev == CM_EVENT_BATCH_START && r->z->full) return z_sync_params((cm_state *)st, r->z);
    if (ev != CM_EVENT_BATCH_END) return CM_OK;
    if (g_rank == g_term_rank && cm_state_timestamp(st)->batch == g_term_batch) raise(SIGTERM);
    if (r->z->full) {
        for (int i = 0; i < r->z->n; i++) {
            const cm_unit_info *ui = cm_module_unit(r->z->root, i);
            for (int64_t k = 0; k < ui->numel; k++) ui->params[k] = NAN;
        }
    } else if (r->z->sharded) {
        cm_status s = z_sync_params((cm_state *)st, r->z);
        if (s) return s;
    }
    if (r->f) fprintf(r->f, "L %lld %.9g\n", (long long)cm_state_timestamp(st)->batch, cm_state_total_loss(st));
    return CM_OK;
}
static void rec_free(void *self) {}
static const cm_callback_i k_rec = {CM_CALLBACK_ABI, "LossRecorder", rec_event, NULL, NULL, NULL, rec_free};

/* ---- the fault hook (private to the checkpoint layer) ---- */

extern cm_status (*cmi_ckpt_fault_hook)(const char *point, int rank);
static int g_fault_rank = -1, g_fault_nth, g_fault_seen;
static bool g_fault_kill;
static cm_status fault(const char *point, int rank) {
    if (strcmp(point, "shard_written") || rank != g_fault_rank || ++g_fault_seen != g_fault_nth) return CM_OK;
    if (g_fault_kill) {
        fprintf(stderr, "rank %d: killing myself during save %d (on purpose)\n", rank, g_fault_nth);
        fflush(stderr);
        raise(SIGKILL);
    }
    return cm_set_error(CM_ERR_IO, "simulated failure: disk full while writing shard (on purpose)");
}

/* ---- compare ---- */

static int compare(const char *a, const char *b, double tol) {
    FILE *fa = fopen(a, "r"), *fb = fopen(b, "r");
    if (!fa || !fb) {
        fprintf(stderr, "compare: cannot open %s\n", fa ? b : a);
        return 1;
    }
    enum { MAXL = 4096 };
    static double ref_loss[MAXL];
    static bool has[MAXL];
    static double ref_p[1 << 16], out_p[1 << 16];
    int nrp = 0, nop = 0;
    char tag[4];
    while (fscanf(fa, "%3s", tag) == 1) {
        if (!strcmp(tag, "L")) {
            long long bt;
            double v;
            if (fscanf(fa, "%lld %lf", &bt, &v) == 2 && bt >= 0 && bt < MAXL) ref_loss[bt] = v, has[bt] = true;
        } else if (!strcmp(tag, "P")) {
            if (fscanf(fa, "%lf", &ref_p[nrp]) == 1 && nrp < (1 << 16) - 1) nrp++;
        } else {
            char rest[4096];
            if (!fgets(rest, sizeof rest, fa)) break;
        }
    }
    double worst = 0;
    long bad = 0, nl = 0;
    while (fscanf(fb, "%3s", tag) == 1) {
        if (!strcmp(tag, "L")) {
            long long bt;
            double v;
            if (fscanf(fb, "%lld %lf", &bt, &v) != 2) break;
            if (bt < 0 || bt >= MAXL || !has[bt]) {
                fprintf(stderr, "compare: batch %lld is not in %s\n", bt, a);
                return 1;
            }
            double rel = fabs(ref_loss[bt] - v) / fmax(1.0, fabs(ref_loss[bt]));
            if (rel > worst) worst = rel;
            if (!(rel <= tol) && bad++ < 5)
                fprintf(stderr, "compare: loss at batch %lld: %.9g vs %.9g (rel %.3g > tol %.3g)\n", bt, ref_loss[bt], v, rel, tol);
            nl++;
        } else if (!strcmp(tag, "P")) {
            if (fscanf(fb, "%lf", &out_p[nop]) == 1 && nop < (1 << 16) - 1) nop++;
        } else {
            char rest[4096];
            if (!fgets(rest, sizeof rest, fb)) break;
        }
    }
    if (nop != nrp || nop == 0 || nl == 0) {
        fprintf(stderr, "compare: %s has %d parameters and %ld losses, %s has %d parameters\n", b, nop, nl, a, nrp);
        return 1;
    }
    double worst_p = 0;
    for (int i = 0; i < nop; i++) {
        double rel = fabs(ref_p[i] - out_p[i]) / fmax(1.0, fabs(ref_p[i]));
        if (rel > worst_p) worst_p = rel;
        if (!(rel <= tol) && bad++ < 10)
            fprintf(stderr, "compare: parameter %d: %.9g vs %.9g (rel %.3g > tol %.3g)\n", i, ref_p[i], out_p[i], rel, tol);
    }
    printf("compare %s %s: %ld losses (worst rel %.3g), %d parameters (worst rel %.3g), tol %.3g, %ld over\n", a, b, nl,
           worst, nop, worst_p, tol, bad);
    fclose(fa);
    fclose(fb);
    return bad ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "--compare")) return compare(argv[2], argv[3], atof(argv[4]));
    if (argc < 2) {
        fprintf(stderr, "usage: see the comment at the top of dist_ckpt.c\n");
        return 2;
    }
    const char *out = argv[1], *save = NULL, *interval = "4ba", *load = NULL, *max = "12ba";
    bool shard = false, full = false, autoresume = false, save_wo = false, load_wo = false, real = false;
    cm_dist_config dc = cm_dist_config_default();
    int64_t batch = 10;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--shard")) shard = true;
        else if (!strcmp(a, "--full")) shard = full = true;
        else if (!strcmp(a, "--autoresume")) autoresume = true;
        else if (!strcmp(a, "--save-weights-only")) save_wo = true;
        else if (!strcmp(a, "--load-weights-only")) load_wo = true;
        else if (!strcmp(a, "--strategy") && v) {
            if (cm_sharding_parse(v, &dc.sharding) != CM_OK) {
                fprintf(stderr, "dist_ckpt: %s\n", cm_last_error());
                return 2;
            }
            real = true, i++;
        } else if (!strcmp(a, "--term") && v) {
            long long tb;
            if (sscanf(v, "%d:%lld", &g_term_rank, &tb) != 2) return 2;
            g_term_batch = tb;
            i++;
        } else if (!strcmp(a, "--save") && v) save = v, i++;
        else if (!strcmp(a, "--interval") && v) interval = v, i++;
        else if (!strcmp(a, "--load") && v) load = v, i++;
        else if (!strcmp(a, "--max") && v) max = v, i++;
        else if (!strcmp(a, "--batch") && v) batch = atoll(v), i++;
        else if (!strcmp(a, "--shard-degree") && v) dc.shard_degree = atoi(v), i++;
        else if (!strcmp(a, "--fault") && v) {
            char kind[8];
            if (sscanf(v, "%7[a-z]:%d:%d", kind, &g_fault_rank, &g_fault_nth) != 3) return 2;
            g_fault_kill = !strcmp(kind, "kill");
            cmi_ckpt_fault_hook = fault;
            i++;
        } else {
            fprintf(stderr, "dist_ckpt: unknown argument '%s'\n", a);
            return 2;
        }
    }
    cm_comm *comm;
    TRY(cm_comm_auto_new(NULL, &comm));
    g_comm = comm;
    const int rank = cm_comm_rank(comm), world = cm_comm_size(comm);
    g_rank = rank;

    cm_dataset *ds;
    TRY(dt_synth_new(NS, false, &ds));

    cm_model *model;
    TRY(dt_mlp_new(0, 0.0f, &model));
    cm_dist *dp;
    TRY(cm_dist_new(comm, model, real ? &dc : NULL, &dp));

    zero2 z = {comm, dp, cm_model_module(model), NULL, 0, NULL, shard, full};
    z.n = cm_module_n_units(z.root);
    z.spans = calloc((size_t)z.n, sizeof *z.spans);
    int64_t maxn = 1;
    for (int u = 0; u < z.n; u++) {
        const cm_unit_info *ui = cm_module_unit(z.root, u);
        const int64_t chunk = (ui->numel + world - 1) / world;
        int64_t b = rank * chunk < ui->numel ? rank * chunk : ui->numel;
        int64_t e = b + chunk < ui->numel ? b + chunk : ui->numel;
        float *master = ui->params + b;
        if (full) {
            master = calloc((size_t)(e - b + 1), sizeof(float));
            memcpy(master, ui->params + b, sizeof(float) * (size_t)(e - b));
        }
        z.spans[u] = (cm_shard_span){u, b, e, master, calloc((size_t)(e - b + 1), sizeof(float)), false};
        if (ui->numel > maxn) maxn = ui->numel;
    }
    z.tmp = calloc((size_t)maxn, sizeof(float));
    cm_optim *opt;
    TRY(cm_optim_new(CM_OPTIM_ADAM, &opt));
    cm_optim_span os[8];
    for (int u = 0; u < z.n; u++) {
        const cm_unit_info *ui = cm_module_unit(z.root, u);
        os[u] = z.sharded ? (cm_optim_span){ui->name, z.spans[u].params, z.spans[u].grads, z.spans[u].end - z.spans[u].begin}
                          : (cm_optim_span){ui->name, ui->params, ui->grads, ui->numel};
    }
    const cm_optim_span *ospans = os;
    int n_ospans = z.n;
    if (real) TRY(cm_dist_optim_spans(dp, &ospans, &n_ospans));
    cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_ADAM);
    hp.lr = 1e-2;
    TRY(cm_optim_add_group(opt, &hp, ospans, n_ospans));

    cm_dataloader_config lc = cm_dataloader_config_default();
    lc.batch_size = batch;
    lc.seed = 5;
    lc.rank = rank;
    lc.world_size = world;
    cm_dataloader *dl;
    TRY(cm_dataloader_new(ds, &lc, &dl));

    FILE *f = NULL;
    if (rank == 0 && !(f = fopen(out, "w"))) {
        fprintf(stderr, "dist_ckpt: cannot write %s\n", out);
        return 1;
    }
    rec r = {&z, f};
    cm_callback_plugin cb = {&k_rec, &r};
    cm_trainer_config cfg = cm_trainer_config_default();
    cfg.model = model;
    cfg.optimizer = opt;
    cfg.train_dataloader = dl;
    TRY(cm_time_parse(max, &cfg.max_duration));
    cfg.device_train_microbatch_size = 2;
    cfg.callbacks = &cb;
    cfg.n_callbacks = 1;
    cfg.run_name = "dist-ckpt";
    cfg.save_folder = save;
    cfg.save_interval_str = interval;
    cfg.load_path = load;
    cfg.autoresume = autoresume;
    cfg.save_weights_only = save_wo;
    cfg.load_weights_only = load_wo;
    cfg.handle_signals = g_term_rank >= 0;
    cm_dist_trainer_hooks(dp, &cfg);
    if (!real && (world > 1 || z.sharded)) {
        cfg.dist.all_reduce_sum = z_all_reduce_sum;
        cfg.dist.barrier = z_barrier;
        cfg.dist.broadcast = z_broadcast;
        cfg.dist.all_gather = z_all_gather;
        cfg.dist.sync_grads = z_sync_grads;
        cfg.dist.data = &z;
        if (z.sharded) {
            cfg.dist.sync_params = z_sync_params;
            cfg.dist.shard_spans = z.spans;
            cfg.dist.n_shard_spans = z.n;
            cfg.dist.params_sharded = z.full;
        }
    }
    cm_trainer *tr;
    TRY(cm_trainer_new(&cfg, &tr));
    if (real) TRY(cm_dist_attach(dp, tr));
    if (f && cm_trainer_resumed_from(tr)) fprintf(f, "R %s\n", cm_trainer_resumed_from(tr));
    cm_status fs = cm_trainer_fit(tr, NULL);
    if (fs == CM_ERR_INTERRUPTED) { /* every rank stops after the same batch, checkpoint saved */
        fprintf(stderr, "dist_ckpt: rank %d: %s\n", rank, cm_last_error());
        if (f) fprintf(f, "I %lld\n", (long long)cm_state_timestamp(cm_trainer_state(tr))->batch);
        if (f) fclose(f);
        const int code = cm_trainer_exit_code(tr, fs);
        cm_trainer_free(tr);
        cm_comm_free(comm);
        return code;
    }
    TRY(fs);
    if (z.full) TRY(z_sync_params(NULL, &z)); /* gather the final parameters */
    if (real) TRY(cm_dist_gather_params(dp));
    if (f) {
        for (int u = 0; u < z.n; u++) {
            const cm_unit_info *ui = cm_module_unit(z.root, u);
            for (int64_t i = 0; i < ui->numel; i++) fprintf(f, "P %.9g\n", ui->params[i]);
        }
        fclose(f);
        printf("dist_ckpt: %d ranks (%s): loss %.6f\n", world,
               real ? cm_sharding_name(dc.sharding) : z.sharded ? "sharded" : "replicated",
               cm_state_total_loss(cm_trainer_state(tr)));
    }
    cm_trainer_free(tr);
    cm_optim_free(opt);
    cm_dist_free(dp);
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
    cm_model_free(model);
    for (int u = 0; u < z.n; u++) {
        free(z.spans[u].grads);
        if (z.full) free(z.spans[u].params);
    }
    free(z.spans);
    free(z.tmp);
    cm_comm_free(comm);
    return 0;
}
