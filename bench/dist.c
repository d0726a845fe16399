/* Distributed benchmarks, run through the launcher:
 *
 *   composer -n 2 build/bench/bench_dist allreduce   all-reduce bus bandwidth: cm_comm (with its
 *                                                    timeouts and heartbeats) against MPI_Allreduce
 *   composer -n 2 build/bench/bench_dist progress     does a non-blocking all-gather progress while
 *                                                    the rank computes without calling MPI? (the
 *                                                    question FULL_SHARD's prefetch depends on)
 *   composer -n 2 build/bench/bench_dist train [STRATEGY] [small|medium] [PREFETCH...]
 *                                                    GPT-2 tokens/s under NO_SHARD (default),
 *                                                    SHARD_GRAD_OP or FULL_SHARD, how much of the
 *                                                    gradient collective backward hides, and the
 *                                                    memory a rank holds (peak RSS, optimizer state)
 *                                                    and the page faults a step
 *                                                    PREFETCH (FULL_SHARD): bp=PRE|POST|NONE
 *                                                    (backward_prefetch, default POST), fwd
 *                                                    (forward_prefetch), nolimit (limit_all_gathers
 *                                                    false); the unit gathers' counters and the time
 *                                                    the tape blocked in them are printed
 *
 * Bus bandwidth = 2(P-1)/P · bytes / time (the ring all-reduce's traffic per rank, as nccl-tests).
 * Hidden fraction = 1 - (time blocked in sync_grads per step) / (time the same all-reduces take
 * alone, blocking). Rank 0 prints a table and appends to bench/results/dist.tsv. */
#include <composer/composer.h>
#include <composer/dist.h>
#include <composer/tokenizer.h>
#include <composer/zoo_gpt2.h>

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <unistd.h>

#define TRY(call)                                                                   \
    do {                                                                            \
        if ((call) != CM_OK) {                                                      \
            fprintf(stderr, "bench_dist: %s failed: %s\n", #call, cm_last_error()); \
            exit(1);                                                                \
        }                                                                           \
    } while (0)

static FILE *results(void) {
    FILE *f = fopen("bench/results/dist.tsv", "a");
    if (f && ftell(f) == 0)
        fprintf(f, "date\thost\tsection\tname\tranks\tthreads\tbytes\tms\tbusbw_gbs\ttokens_per_s\thidden_frac\tpeak_rss_mb\topt_"
                   "state_mb\n");
    return f;
}

static void stamp(char *date, char *host) {
    time_t t = time(NULL);
    strftime(date, 32, "%Y-%m-%dT%H:%M:%S", localtime(&t));
    gethostname(host, 64);
    host[63] = '\0';
}

static void bench_allreduce(cm_comm *c) {
    const int rank = cm_comm_rank(c), P = cm_comm_size(c);
    FILE *f = rank == 0 ? results() : NULL;
    char date[32], host[64];
    stamp(date, host);
    if (rank == 0) printf("%-10s %12s %10s %12s %10s %12s\n", "bytes", "cm_comm ms", "busbw GB/s", "MPI ms", "busbw GB/s", "cm/MPI");
    for (int64_t bytes = 4096; bytes <= (64 << 20); bytes *= 4) {
        const int64_t n = bytes / 4;
        float *x = calloc((size_t)n, 4);
        const int iters = bytes <= (1 << 20) ? 50 : 8;
        double t[2];
        for (int impl = 0; impl < 2; impl++) {
            TRY(cm_comm_barrier(c));
            for (int w = 0; w < 2; w++) impl ? (void)MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD)
                                             : (void)cm_comm_all_reduce_sum_f32(c, x, n);
            TRY(cm_comm_barrier(c));
            const double t0 = cm_clock_s();
            for (int i = 0; i < iters; i++) {
                if (impl) MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                else TRY(cm_comm_all_reduce_sum_f32(c, x, n));
            }
            double dt = (cm_clock_s() - t0) / iters;
            TRY(cm_comm_all_reduce(c, &dt, 1, CM_COMM_F64, CM_REDUCE_MAX));
            t[impl] = dt;
        }
        const double factor = P > 1 ? 2.0 * (P - 1) / P : 1.0;
        const double bw[2] = {factor * (double)bytes / t[0] / 1e9, factor * (double)bytes / t[1] / 1e9};
        if (rank == 0) {
            printf("%-10lld %12.3f %10.2f %12.3f %10.2f %12.2f\n", (long long)bytes, t[0] * 1e3, bw[0], t[1] * 1e3, bw[1],
                   t[0] / t[1]);
            if (f) {
                fprintf(f, "%s\t%s\tallreduce\tcm_comm\t%d\t%d\t%lld\t%.4f\t%.3f\t\t\n", date, host, P, cm_num_threads(),
                        (long long)bytes, t[0] * 1e3, bw[0]);
                fprintf(f, "%s\t%s\tallreduce\tMPI_Allreduce\t%d\t%d\t%lld\t%.4f\t%.3f\t\t\n", date, host, P,
                        cm_num_threads(), (long long)bytes, t[1] * 1e3, bw[1]);
            }
        }
        free(x);
    }
    if (f) fclose(f);
}

/* Busy arithmetic for `ms` milliseconds; with req, tests it every ~0.25 ms until it is done. */
static double compute_for(cm_comm *c, double ms, cm_comm_request **req) {
    volatile double acc = 0;
    const double t0 = cm_clock_s();
    double next_poll = t0;
    while (cm_clock_s() - t0 < ms / 1e3) {
        for (int i = 0; i < 2000; i++) acc += (double)i * 1e-9;
        if (req && *req && cm_clock_s() >= next_poll) {
            bool done = false;
            TRY(cm_comm_test(c, *req, &done));
            if (done) *req = NULL;
            next_poll = cm_clock_s() + 0.25e-3;
        }
    }
    return acc;
}

/* An all-gather of 4 MiB per rank started, 50 ms of computing, then the wait: how long the wait
 * takes with no MPI call during the compute, and with cm_comm_test every ~0.25 ms (what
 * FULL_SHARD's fetch hook does between ops), against the gather alone. */
static void bench_progress(cm_comm *c) {
    const int rank = cm_comm_rank(c), P = cm_comm_size(c);
    const int64_t n = 1 << 20;
    float *send = calloc((size_t)n, 4), *recv = calloc((size_t)(n * P), 4);
    enum { ITERS = 6 };
    double alone = 0, wait[2] = {0, 0};
    for (int it = 0; it < ITERS + 1; it++) {
        TRY(cm_comm_barrier(c));
        double t0 = cm_clock_s();
        TRY(cm_comm_all_gather(c, send, recv, n, CM_COMM_F32));
        if (it) alone += cm_clock_s() - t0;
        for (int poll = 0; poll < 2; poll++) {
            TRY(cm_comm_barrier(c));
            cm_comm_request *req;
            TRY(cm_comm_iall_gather(c, send, recv, n, CM_COMM_F32, &req));
            compute_for(c, 50, poll ? &req : NULL);
            t0 = cm_clock_s();
            if (req) TRY(cm_comm_wait(c, req));
            if (it) wait[poll] += cm_clock_s() - t0;
        }
    }
    double r[3] = {alone / ITERS * 1e3, wait[0] / ITERS * 1e3, wait[1] / ITERS * 1e3};
    TRY(cm_comm_all_reduce(c, r, 3, CM_COMM_F64, CM_REDUCE_MAX));
    if (rank == 0)
        printf("all-gather of %lld MiB per rank on %d ranks: %.2f ms alone; started, then 50 ms of compute, then the "
               "wait: %.2f ms without an MPI call during the compute, %.2f ms with cm_comm_test every 0.25 ms\n",
               (long long)(n * 4 >> 20), P, r[0], r[1], r[2]);
    free(send);
    free(recv);
}

static void bench_train(cm_comm *c, cm_sharding strategy, bool medium, cm_dist_config dc) {
    const int rank = cm_comm_rank(c), P = cm_comm_size(c);
    enum { T = 64, GLOBAL_B = 16, STEPS = 12, WARM = 2 };
    char path[64];
    snprintf(path, sizeof path, "/tmp/bench_dist_tokens.bin");
    if (rank == 0) {
        int32_t *ids = malloc(sizeof(int32_t) * 200000);
        int64_t *v = malloc(sizeof(int64_t) * 200000);
        cm_rng r = cm_rng_init(3, 0);
        cm_rng_randint(&r, v, 200000, 0, 65);
        for (int i = 0; i < 200000; i++) ids[i] = (int32_t)v[i];
        free(v);
        TRY(cm_token_file_write(path, ids, 200000, CM_TOKEN_WIDTH_U16));
        free(ids);
    }
    TRY(cm_comm_barrier(c));
    cm_tokens_config tc = cm_tokens_config_default();
    tc.seq_len = T;
    cm_dataset *ds;
    TRY(cm_dataset_tokens_new(path, &tc, &ds));
    cm_gpt2_config g = cm_gpt2_config_default();
    g.vocab_size = 65, g.n_positions = T, g.n_embd = medium ? 384 : 192, g.n_layer = medium ? 6 : 4, g.n_head = 4;
    g.embd_pdrop = g.attn_pdrop = g.resid_pdrop = 0;
    cm_rng rng = cm_rng_init(1, 0);
    cm_model *m;
    TRY(cm_gpt2_new(&g, &rng, &m));
    cm_dist *d;
    dc.sharding = strategy;
    TRY(cm_dist_new(c, m, &dc, &d));
    /* AdamW: two moments per parameter, so sharding the optimizer state shows */
    const cm_optim_span *ospans;
    int n_ospans;
    TRY(cm_dist_optim_spans(d, &ospans, &n_ospans));
    cm_optim *opt;
    cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_DECOUPLED_ADAMW);
    TRY(cm_optim_new(CM_OPTIM_DECOUPLED_ADAMW, &opt));
    TRY(cm_optim_add_group(opt, &hp, ospans, n_ospans));
    cm_dataloader_config lc = cm_dataloader_config_default();
    lc.batch_size = GLOBAL_B, lc.rank = rank, lc.world_size = P;
    cm_dataloader *dl;
    TRY(cm_dataloader_new(ds, &lc, &dl));
    cm_trainer_config cfg = cm_trainer_config_default();
    cfg.model = m;
    cfg.train_dataloader = dl;
    cfg.optimizer = opt;
    cfg.max_duration = cm_time_make(WARM, CM_TIME_BATCH);
    cfg.run_name = "bench-dist";
    cm_dist_trainer_hooks(d, &cfg);
    cm_trainer *tr;
    TRY(cm_trainer_new(&cfg, &tr));
    TRY(cm_dist_attach(d, tr));
    TRY(cm_trainer_fit(tr, NULL)); /* warm-up */
    cm_dist_reset_stats(d);
    TRY(cm_comm_barrier(c));
    struct rusage ru0;
    getrusage(RUSAGE_SELF, &ru0);
    double t0 = cm_clock_s();
    cm_fit_opts fo = cm_fit_opts_default();
    fo.duration = cm_time_make(STEPS, CM_TIME_BATCH);
    TRY(cm_trainer_fit(tr, &fo));
    double dt = cm_clock_s() - t0;
    struct rusage ru1;
    getrusage(RUSAGE_SELF, &ru1);
    /* page faults a step (FULL_SHARD faults released pages in again; the largest over ranks) */
    double faults = (double)(ru1.ru_minflt - ru0.ru_minflt) / STEPS;
    TRY(cm_comm_all_reduce(c, &faults, 1, CM_COMM_F64, CM_REDUCE_MAX));
    TRY(cm_comm_all_reduce(c, &dt, 1, CM_COMM_F64, CM_REDUCE_MAX));
    cm_dist_stats st = cm_dist_get_stats(d);
    /* the same all-reduces alone: what a step would wait with no overlap at all */
    cm_module *root = cm_model_module(m);
    double alone = 0;
    if (P > 1) {
        TRY(cm_comm_barrier(c));
        const double a0 = cm_clock_s();
        int n_sh = 0;
        const cm_shard_span *sh = cm_state_shard_spans(cm_trainer_state(tr), &n_sh);
        for (int k = 0; k < 5; k++)
            for (int u = cm_module_n_units(root) - 1; u >= 0; u--) {
                const cm_unit_info *ui = cm_module_unit(root, u);
                if (sh) { /* the padded gradient reduce-scattered into a scratch chunk */
                    const int64_t chunk = (ui->numel + P - 1) / P;
                    float *tmp = malloc(sizeof(float) * (size_t)(chunk ? chunk : 1));
                    TRY(cm_comm_reduce_scatter(c, ui->grads, tmp, chunk, CM_COMM_F32, CM_REDUCE_SUM));
                    free(tmp);
                } else {
                    TRY(cm_comm_all_reduce_sum_f32(c, ui->grads, ui->numel));
                }
            }
        alone = (cm_clock_s() - a0) / 5;
        TRY(cm_comm_all_reduce(c, &alone, 1, CM_COMM_F64, CM_REDUCE_MAX));
    }
    int64_t n_params = 0;
    for (int u = 0; u < cm_module_n_units(root); u++) n_params += cm_module_unit(root, u)->numel;
    double exposed = st.wait_s / (double)STEPS;
    TRY(cm_comm_all_reduce(c, &exposed, 1, CM_COMM_F64, CM_REDUCE_MAX));
    const double tok_s = (double)STEPS * GLOBAL_B * T / dt;
    /* memory a rank holds: optimizer state (MB) and peak RSS (MB), the largest over ranks */
    double mem[3] = {0, 0, 0};
    for (int i = 0; i < cm_optim_n_state(opt); i++) {
        cm_optim_state_entry e;
        TRY(cm_optim_state_get(opt, i, &e));
        mem[0] += (double)e.numel * (double)cm_dtype_size(e.dtype) / 1e6;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    mem[1] = (double)ru.ru_maxrss / 1024.0;
    /* RSS now, between steps: what a rank holds at rest (the lifetime peak above includes setup) */
    FILE *sm = fopen("/proc/self/statm", "r");
    long pages_total = 0, pages_res = 0;
    if (sm && fscanf(sm, "%ld %ld", &pages_total, &pages_res) == 2) mem[2] = (double)pages_res * 4096.0 / 1e6;
    if (sm) fclose(sm);
    TRY(cm_comm_all_reduce(c, mem, 3, CM_COMM_F64, CM_REDUCE_MAX));
    const double hidden = P > 1 && alone > 0 ? 1.0 - exposed / alone : 0;
    if (rank == 0) {
        printf("GPT-2 %s (L%lld C%lld T%d, %lld parameters), global batch %d, AdamW, %s: %d rank(s) x %d thread(s): %.0f "
               "tokens/s, %.1f ms/step, %.0f page faults/step, optimizer state %.1f MB/rank, peak RSS %.0f MB/rank, RSS at rest "
               "%.0f MB/rank",
               medium ? "medium" : "tiny", (long long)g.n_layer, (long long)g.n_embd, T, (long long)n_params, GLOBAL_B,
               cm_sharding_name(strategy), P, cm_num_threads(), tok_s, dt / STEPS * 1e3, faults, mem[0], mem[1], mem[2]);
        if (P > 1 && strategy == CM_SHARDING_FULL_SHARD)
            printf("; prefetch %s%s%s: %.1f unit gathers/step (%.1f prefetched, %.1f of them read by the tape), "
                   "%.2f ms/step blocked in gathers, at most %d in flight, %d units gathered",
                   cm_backward_prefetch_name(dc.backward_prefetch), dc.forward_prefetch ? " + forward_prefetch" : "",
                   dc.limit_all_gathers ? "" : ", no limit_all_gathers", (double)st.n_gathers / STEPS,
                   (double)st.n_prefetches / STEPS, (double)st.n_prefetch_hits / STEPS, st.gather_s / STEPS * 1e3,
                   st.max_in_flight, st.max_gathered);
        if (P > 1)
            printf("; gradient %s %.2f MB/step: %.2f ms alone, %.2f ms exposed after backward -> %.0f%% hidden "
                   "(%lld of %lld buckets started during backward); %lld unit gathers",
                   strategy == CM_SHARDING_NO_SHARD ? "all-reduce" : "reduce-scatter", st.bytes / STEPS / 1e6,
                   alone * 1e3, exposed * 1e3, 100 * hidden, (long long)st.n_buckets_early,
                   (long long)(st.n_buckets_early + st.n_buckets_late), (long long)st.n_gathers);
        printf("\n");
        FILE *f = results();
        if (f) {
            char date[32], host[64];
            stamp(date, host);
            char name[96];
            snprintf(name, sizeof name, "%s%s%s%s%s", cm_sharding_name(strategy),
                     strategy == CM_SHARDING_FULL_SHARD ? "_" : "",
                     strategy == CM_SHARDING_FULL_SHARD ? cm_backward_prefetch_name(dc.backward_prefetch) : "",
                     strategy == CM_SHARDING_FULL_SHARD && dc.forward_prefetch ? "_fwd" : "",
                     strategy == CM_SHARDING_FULL_SHARD && !dc.limit_all_gathers ? "_nolimit" : "");
            fprintf(f, "%s\t%s\ttrain\tgpt2_%s_%s\t%d\t%d\t%.0f\t%.3f\t\t%.1f\t%.3f\t%.1f\t%.2f\n", date, host,
                    medium ? "medium" : "tiny", name, P, cm_num_threads(), st.bytes / STEPS,
                    dt / STEPS * 1e3, tok_s, hidden, mem[1], mem[0]);
            fclose(f);
        }
    }
    cm_trainer_free(tr);
    cm_optim_free(opt);
    cm_dist_free(d);
    cm_dataloader_free(dl);
    cm_dataset_free(ds);
    cm_model_free(m);
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "allreduce";
    cm_comm *c;
    cm_comm_config cc = cm_comm_config_default();
    TRY(cm_comm_mpi_new(&cc, &c)); /* MPI even for one rank, so the MPI_Allreduce column runs */
    if (!strcmp(what, "allreduce")) bench_allreduce(c);
    else if (!strcmp(what, "progress")) bench_progress(c);
    else if (!strcmp(what, "train")) {
        cm_sharding strategy = CM_SHARDING_NO_SHARD;
        if (argc > 2) TRY(cm_sharding_parse(argv[2], &strategy));
        cm_dist_config dc = cm_dist_config_default();
        for (int i = 4; i < argc; i++) {
            if (!strcmp(argv[i], "fwd")) dc.forward_prefetch = true;
            else if (!strcmp(argv[i], "nolimit")) dc.limit_all_gathers = false;
            else if (!strcmp(argv[i], "bp=NONE")) dc.backward_prefetch = CM_BACKWARD_PREFETCH_NONE;
            else if (!strcmp(argv[i], "bp=PRE")) dc.backward_prefetch = CM_BACKWARD_PREFETCH_PRE;
            else if (!strcmp(argv[i], "bp=POST")) dc.backward_prefetch = CM_BACKWARD_PREFETCH_POST;
            else {
                fprintf(stderr, "bench_dist: unknown prefetch option '%s' (bp=PRE|POST|NONE, fwd, nolimit)\n", argv[i]);
                return 2;
            }
        }
        bench_train(c, strategy, argc > 3 && !strcmp(argv[3], "medium"), dc);
    } else {
        fprintf(stderr, "usage: composer -n N bench_dist allreduce | progress | train [NO_SHARD|SHARD_GRAD_OP|FULL_SHARD] [small|medium] "
                        "[bp=PRE|POST|NONE] [fwd] [nolimit]\n");
        return 2;
    }
    cm_comm_free(c);
    return 0;
}
