/* The distributed layer in one process: the single-process communicator, argument checks,
 * timeouts on a backend that never finishes, the launch environment and {rank} formats, and DDP
 * on one rank. Multi-rank behaviour is tested through the launcher in tests/dist/. */
#include "cmtest.h"

#include <math.h>
#include "cmtrain.h"

#include <composer/dist.h>
#include <composer/zoo_gpt2.h>
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

Test(dist, single_comm_collectives_are_identities_and_count_sequence_numbers) {
    cm_comm *c;
    cr_assert_eq(cm_comm_single_new(NULL, &c), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_comm_rank(c), 0);
    cr_assert_eq(cm_comm_size(c), 1);
    cr_assert_str_eq(cm_comm_backend(c), "single");
    float x[3] = {1, 2, 3}, y[3] = {0};
    cr_assert_eq(cm_comm_all_reduce_sum_f32(c, x, 3), CM_OK);
    cr_assert(x[0] == 1 && x[2] == 3, "all_reduce changed the data: %g %g", x[0], x[2]);
    cr_assert_eq(cm_comm_all_gather(c, x, y, 3, CM_COMM_F32), CM_OK);
    cr_assert(y[1] == 2, "all_gather copy: %g, want 2", y[1]);
    cr_assert_eq(cm_comm_reduce_scatter(c, x, y, 3, CM_COMM_F32, CM_REDUCE_MAX), CM_OK);
    cr_assert_eq(cm_comm_broadcast(c, x, 3, CM_COMM_F32, 0), CM_OK);
    cr_assert_eq(cm_comm_barrier(c), CM_OK);
    cr_assert_eq(cm_comm_seq(c), 5, "seq %llu, want 5", (unsigned long long)cm_comm_seq(c));
    cm_comm_free(c);
}

Test(dist, bad_arguments_are_refused_without_a_sequence_number) {
    cm_comm *c;
    cr_assert_eq(cm_comm_single_new(NULL, &c), CM_OK);
    float x[2];
    cr_assert_eq(cm_comm_all_reduce(c, x, -1, CM_COMM_F32, CM_REDUCE_SUM), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "count -1"), "message: %s", cm_last_error());
    cr_assert_eq(cm_comm_all_reduce(c, NULL, 2, CM_COMM_F32, CM_REDUCE_SUM), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_comm_all_reduce(c, x, 2, (cm_comm_dtype)99, CM_REDUCE_SUM), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_comm_all_reduce(c, x, 2, CM_COMM_F32, (cm_reduce_op)9), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_comm_broadcast(c, x, 2, CM_COMM_F32, 1), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "root 1"), "message: %s", cm_last_error());
    cr_assert_eq(cm_comm_seq(c), 0);
    cm_comm_config cc = cm_comm_config_default();
    cc.timeout_s = 0;
    cm_comm *bad = NULL;
    cr_assert_eq(cm_comm_single_new(&cc, &bad), CM_ERR_INVALID_ARG);
    cr_assert_null(bad);
    cm_comm_free(c);
}

/* A backend whose collectives never finish: the wait must give up at the timeout, say which
 * collective, and leave the communicator failed. */
static int n_freed, freed_failed;
static int h_rank(void *s) { return 1; }
static int h_size(void *s) { return 2; }
static cm_status h_start(void **req) {
    *req = (void *)1;
    return CM_OK;
}
static cm_status h_ar(void *s, const cm_coll_info *ci, void *b, cm_reduce_op op, void **r) { return h_start(r); }
static cm_status h_rs(void *s, const cm_coll_info *ci, const void *a, void *b, cm_reduce_op op, void **r) { return h_start(r); }
static cm_status h_ag(void *s, const cm_coll_info *ci, const void *a, void *b, void **r) { return h_start(r); }
static cm_status h_bc(void *s, const cm_coll_info *ci, void *b, int root, void **r) { return h_start(r); }
static cm_status h_ba(void *s, const cm_coll_info *ci, void **r) { return h_start(r); }
static cm_status h_test(void *s, void *r, bool *done) {
    *done = false;
    return CM_OK;
}
static void h_describe(void *s, const cm_coll_info *ci, char *buf, size_t cap) {
    snprintf(buf, cap, "rank 0 did not arrive (test double)");
}
static void h_free(void *s, bool failed) {
    n_freed++;
    freed_failed = failed;
}
static const cm_comm_i k_hang = {CM_COMM_ABI, "hang", h_rank, h_size, h_ar, h_rs, h_ag, h_bc, h_ba, h_test,
                                 h_describe, NULL, h_free, NULL};

Test(dist, a_collective_that_never_finishes_times_out_with_its_number_and_the_missing_rank) {
    cm_comm_config cc = cm_comm_config_default();
    cc.timeout_s = 0.05;
    cm_comm *c;
    cr_assert_eq(cm_comm_new(&k_hang, NULL, &cc, &c), CM_OK, "%s", cm_last_error());
    cm_comm_request *r;
    cr_assert_eq(cm_comm_ibarrier(c, &r), CM_OK); /* #1 */
    float x[4] = {0};
    cm_status s = cm_comm_all_reduce_sum_f32(c, x, 4); /* #2, while #1 is still pending */
    cr_assert_eq(s, CM_ERR_TIMEOUT, "status %s", cm_status_name(s));
    const char *m = cm_last_error();
    cr_assert(strstr(m, "rank 1 of 2 timed out") && strstr(m, "collective #2 all_reduce (4 f32)") &&
                  strstr(m, "rank 0 did not arrive"),
              "message: %s", m);
    cr_assert_eq(cm_comm_status(c), CM_ERR_TIMEOUT);
    cr_assert_eq(cm_comm_barrier(c), CM_ERR_STATE, "a failed communicator must refuse new collectives");
    cr_assert(strstr(cm_last_error(), "failed earlier"), "message: %s", cm_last_error());
    cr_assert_eq(cm_comm_wait(c, r), CM_ERR_TIMEOUT, "the pending barrier times out too");
    n_freed = 0;
    cm_comm_free(c);
    cr_assert(n_freed == 1 && freed_failed, "backend freed %d times, failed=%d", n_freed, freed_failed);
}

Test(dist, comm_new_refuses_a_backend_with_a_wrong_abi_or_missing_slots) {
    cm_comm_i bad = k_hang;
    bad.abi = 99;
    cm_comm *c = NULL;
    cr_assert_eq(cm_comm_new(&bad, NULL, NULL, &c), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "'hang' has abi 99"), "message: %s", cm_last_error());
    bad = k_hang;
    bad.test = NULL;
    cr_assert_eq(cm_comm_new(&bad, NULL, NULL, &c), CM_ERR_INVALID_ARG);
    cr_assert_null(c);
}

Test(dist, env_reads_each_launchers_variables) {
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                          "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID",
                          "SLURM_NTASKS", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
    cm_dist_env e = cm_dist_env_get();
    cr_assert(e.rank == 0 && e.world_size == 1 && !strcmp(e.launcher, "none"), "plain: %d of %d (%s)", e.rank,
              e.world_size, e.launcher);
    cr_assert(!cm_dist_launched(), "a plain process must not start MPI");
    setenv("OMPI_COMM_WORLD_SIZE", "8", 1), setenv("OMPI_COMM_WORLD_RANK", "5", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1), setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
    e = cm_dist_env_get();
    cr_assert(e.rank == 5 && e.world_size == 8 && e.local_rank == 1 && e.node_rank == 1 &&
                  !strcmp(e.launcher, "openmpi"),
              "openmpi: rank %d of %d, local %d, node %d", e.rank, e.world_size, e.local_rank, e.node_rank);
    cr_assert(cm_dist_launched());
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
    setenv("SLURM_PROCID", "2", 1), setenv("SLURM_NTASKS", "3", 1);
    e = cm_dist_env_get();
    cr_assert(e.rank == 2 && e.world_size == 3 && !strcmp(e.launcher, "slurm"), "slurm: %d of %d", e.rank, e.world_size);
    cr_assert(cm_dist_launched());
    setenv("SLURM_NTASKS", "1", 1);
    cr_assert(!cm_dist_launched(), "a one-task srun step is a plain process");
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
    setenv("WORLD_SIZE", "4", 1), setenv("RANK", "3", 1), setenv("NODE_RANK", "1", 1);
    e = cm_dist_env_get();
    cr_assert(e.rank == 3 && e.world_size == 4 && e.node_rank == 1 && !strcmp(e.launcher, "composer"));
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
}

Test(dist, format_expands_rank_placeholders_and_names_unknown_ones) {
    cm_dist_env e = {3, 8, 1, 4, 0, "composer"};
    char buf[64];
    cr_assert_eq(cm_dist_format("log/{node_rank}-{rank}of{world_size}.{local_rank}.txt", &e, buf, sizeof buf), CM_OK);
    cr_assert_str_eq(buf, "log/0-3of8.1.txt");
    cr_assert_eq(cm_dist_format("x{rnk}", &e, buf, sizeof buf), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "'{rnk}'"), "message: %s", cm_last_error());
    cr_assert_eq(cm_dist_format("x{rank", &e, buf, sizeof buf), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "unclosed"), "message: %s", cm_last_error());
    cr_assert_eq(cm_dist_format("0123456789{rank}", &e, buf, 8), CM_ERR_INVALID_ARG);
}

Test(dist, sharding_names_parse_and_bad_setups_are_refused) {
    cm_sharding s;
    cr_assert_eq(cm_sharding_parse("full_shard", &s), CM_OK);
    cr_assert_eq(s, CM_SHARDING_FULL_SHARD);
    cr_assert_str_eq(cm_sharding_name(CM_SHARDING_NO_SHARD), "NO_SHARD");
    cr_assert_eq(cm_sharding_parse("hybrid_shard", &s), CM_OK);
    cr_assert_eq(s, CM_SHARDING_HYBRID_SHARD);
    cr_assert_eq(cm_sharding_parse("_HYBRID_SHARD_ZERO2", &s), CM_OK);
    cr_assert(cm_sharding_is_hybrid(s) && !cm_sharding_is_hybrid(CM_SHARDING_FULL_SHARD));
    cr_assert_eq(cm_sharding_parse("ZERO9", &s), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "HYBRID_SHARD or _HYBRID_SHARD_ZERO2"), "message: %s", cm_last_error());
    cm_comm *c;
    cr_assert_eq(cm_comm_single_new(NULL, &c), CM_OK);
    cm_model *m = cmt_mlp(4, 8, 3, 0, 1);
    cm_dist_config dc = cm_dist_config_default();
    cm_dist *d = NULL;
    /* sharding moves the flat buffers: not once an optimizer or trainer holds them */
    dc.sharding = CM_SHARDING_SHARD_GRAD_OP;
    cr_assert_eq(cm_module_lock(cm_model_module(m)), CM_OK);
    cr_assert_eq(cm_dist_new(c, m, &dc, &d), CM_ERR_STATE);
    cr_assert(strstr(cm_last_error(), "before creating them"), "message: %s", cm_last_error());
    cm_module_unlock(cm_model_module(m));
    dc.sharding = CM_SHARDING_FULL_SHARD;
    dc.max_resident_units = 1;
    cr_assert_eq(cm_dist_new(c, m, &dc, &d), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "max_resident_units 1"), "message: %s", cm_last_error());
    cr_assert_eq(cm_dist_new(NULL, m, NULL, &d), CM_ERR_INVALID_ARG);
    cm_model_free(m);
    cm_comm_free(c);
}

Test(dist, hybrid_degrees_are_derived_as_composer_does_and_misfits_name_both_keys_and_the_world) {
    typedef struct {
        int world, local, shard, rep; /* in: 0 = not given */
        cm_status want;
        int shard_out, rep_out;
        const char *msg;
    } deg_case;
    static const deg_case cases[] = {
        {8, 4, 0, 0, CM_OK, 4, 2, NULL},  /* neither: shard within a node, a replica per node */
        {4, 4, 2, 0, CM_OK, 2, 2, NULL},  /* one given: the other derived */
        {4, 4, 0, 4, CM_OK, 1, 4, NULL},
        {6, 6, 3, 2, CM_OK, 3, 2, NULL},  /* both: their product is the world */
        {1, 1, 0, 0, CM_OK, 1, 1, NULL},
        {4, 4, 3, 0, CM_ERR_INVALID_ARG, 0, 0,
         "data_parallel_shard_degree 3 does not divide the world size 4, so data_parallel_replicate_degree cannot be derived"},
        {4, 4, 0, 3, CM_ERR_INVALID_ARG, 0, 0,
         "data_parallel_replicate_degree 3 does not divide the world size 4, so data_parallel_shard_degree cannot be derived"},
        {4, 4, 2, 3, CM_ERR_INVALID_ARG, 0, 0,
         "data_parallel_shard_degree 2 x data_parallel_replicate_degree 3 = 6 is not the world size 4"},
        {6, 4, 0, 0, CM_ERR_INVALID_ARG, 0, 0,
         "data_parallel_shard_degree defaults to the ranks per node (4), which does not divide the world size 6"},
        {4, 4, -2, 0, CM_ERR_INVALID_ARG, 0, 0, "data_parallel_shard_degree -2 must be >= 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const deg_case *k = &cases[i];
        int sd = k->shard, rd = k->rep;
        cm_status s = cm_dist_hybrid_degrees(k->world, k->local, &sd, &rd);
        cr_assert_eq(s, k->want, "case %zu: %s", i, cm_last_error());
        if (!s) cr_assert(sd == k->shard_out && rd == k->rep_out, "case %zu: %d x %d", i, sd, rd);
        else cr_assert(strstr(cm_last_error(), k->msg), "case %zu: message: %s", i, cm_last_error());
    }
    /* cm_dist_new refuses the same misfit before it touches the model */
    cm_comm *c;
    cr_assert_eq(cm_comm_single_new(NULL, &c), CM_OK);
    cm_model *m = cmt_mlp(4, 8, 3, 0, 1);
    cm_dist_config dc = cm_dist_config_default();
    dc.sharding = CM_SHARDING_HYBRID_SHARD;
    dc.replicate_degree = 2;
    cm_dist *d = NULL;
    cr_assert_eq(cm_dist_new(c, m, &dc, &d), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "data_parallel_replicate_degree 2 does not divide the world size 1"), "message: %s",
              cm_last_error());
    cr_assert_null(d);
    cm_model_free(m);
    cm_comm_free(c);
}

Test(dist, split_makes_a_sub_communicator_with_its_own_sequence_and_needs_a_backend_that_can) {
    cm_comm *c, *sub = NULL;
    cr_assert_eq(cm_comm_single_new(NULL, &c), CM_OK);
    cm_comm_set_timeout(c, 7);
    cr_assert_eq(cm_comm_split(c, 0, 0, &sub), CM_OK, "%s", cm_last_error());
    cr_assert(sub && sub != c && cm_comm_size(sub) == 1 && cm_comm_rank(sub) == 0);
    cr_assert_eq(cm_comm_timeout(sub), 7, "the parent's timeout");
    cr_assert_eq(cm_comm_seq(c), 1, "the colors are exchanged with one all_gather on the parent");
    float x = 2;
    cr_assert_eq(cm_comm_all_reduce_sum_f32(sub, &x, 1), CM_OK);
    cr_assert(cm_comm_seq(sub) == 1 && cm_comm_seq(c) == 1, "sequence numbers are per communicator");
    cm_comm_free(sub);
    cr_assert_eq(cm_comm_split(c, -1, 0, &sub), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "color -1"), "message: %s", cm_last_error());
    cm_comm_free(c);
    /* a backend without the slot (k_hang's) cannot, and says which */
    cm_comm *h;
    cr_assert_eq(cm_comm_new(&k_hang, NULL, NULL, &h), CM_OK);
    cr_assert_eq(cm_comm_split(h, 0, 0, &sub), CM_ERR_UNSUPPORTED);
    cr_assert(strstr(cm_last_error(), "'hang' communicator cannot make sub-communicators"), "message: %s", cm_last_error());
    cr_assert_null(sub);
    cm_comm_free(h);
}

/* A parent of 2 ranks whose collectives finish at once (its all_gather reports the other rank
 * sending what this one sent) and whose split makes a hanging child: the child's timeout says
 * which ranks of the parent it is made of. */
static cm_status p_ag(void *s, const cm_coll_info *ci, const void *a, void *b, void **r) {
    const size_t n = (size_t)ci->count * cm_comm_dtype_size(ci->dtype);
    memcpy(b, a, n);
    memcpy((char *)b + n, a, n);
    return h_start(r);
}
static cm_status p_test(void *s, void *r, bool *done) {
    *done = true;
    return CM_OK;
}
static void p_free(void *s, bool failed) {}
static cm_status p_split(void *s, int color, int key, const cm_comm_i **vt, void **out) {
    *vt = &k_hang, *out = NULL;
    return CM_OK;
}
static const cm_comm_i k_pair = {CM_COMM_ABI, "pair", h_rank, h_size, h_ar, h_rs, p_ag, h_bc, h_ba, p_test,
                                 NULL, NULL, p_free, p_split};

Test(dist, a_sub_communicators_timeout_names_the_parent_ranks_it_is_made_of) {
    cm_comm_config cc = cm_comm_config_default();
    cc.timeout_s = 0.05;
    cm_comm *c, *sub = NULL;
    cr_assert_eq(cm_comm_new(&k_pair, NULL, &cc, &c), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_comm_split(c, 3, 0, &sub), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_comm_timeout(sub), 0.05);
    float x = 1;
    cr_assert_eq(cm_comm_all_reduce_sum_f32(sub, &x, 1), CM_ERR_TIMEOUT);
    const char *m = cm_last_error();
    cr_assert(strstr(m, "rank 1 of 2 (a sub-communicator of ranks 0, 1 of 2) timed out") &&
                  strstr(m, "collective #1 all_reduce"),
              "message: %s", m);
    cr_assert_eq(cm_comm_status(c), CM_OK, "the parent is not failed by its child's timeout");
    n_freed = 0;
    cm_comm_free(sub);
    cr_assert(n_freed == 1 && freed_failed, "the child's backend freed %d times, failed=%d", n_freed, freed_failed);
    cm_comm_free(c);
}

/* with = 0: no cm_dist; 1-5: NO_SHARD, SHARD_GRAD_OP, FULL_SHARD, HYBRID_SHARD,
 * _HYBRID_SHARD_ZERO2 on one rank, where every collective is a copy, so the run must be bit for
 * bit the plain one. */
Test(dist, every_strategy_on_one_rank_trains_exactly_like_no_ddp) {
    enum { N_RUNS = 1 + CM_SHARDING_COUNT };
    float *p[N_RUNS];
    int64_t n = 0;
    for (int with = 0; with < N_RUNS; with++) {
        cm_dataset *ds = cmt_synth_dataset(40, 6, 3, false, NULL);
        cm_dataloader *dl = cmt_loader(ds, 8, false, 3);
        cm_model *m = cmt_mlp(6, 8, 3, 0, 11);
        cm_comm *c = NULL;
        cm_dist *d = NULL;
        cm_trainer_config cfg = cm_trainer_config_default();
        cfg.model = m;
        cfg.train_dataloader = dl;
        cfg.device_train_microbatch_size = 3;
        cr_assert_eq(cm_time_parse("4ba", &cfg.max_duration), CM_OK);
        if (with) {
            cr_assert_eq(cm_comm_single_new(NULL, &c), CM_OK);
            cm_dist_config dc = cm_dist_config_default();
            dc.sharding = (cm_sharding)(with - 1);
            cr_assert_eq(cm_dist_new(c, m, &dc, &d), CM_OK, "%s", cm_last_error());
            /* hybrid on one rank: one shard group of one, one replicate group of one, no replicas */
            const bool hy = cm_sharding_is_hybrid(dc.sharding);
            cr_assert(hy ? cm_dist_shard_comm(d) != c && cm_comm_size(cm_dist_replicate_comm(d)) == 1
                         : cm_dist_shard_comm(d) == c && !cm_dist_replicate_comm(d),
                      "%s: shard / replicate communicators", cm_sharding_name(dc.sharding));
            cm_dist_trainer_hooks(d, &cfg);
            for (int i = 0; i < cfg.dist.n_shard_spans; i++)
                cr_assert(!cfg.dist.shard_spans[i].replica, "%s: span %d is a replica on the only rank",
                          cm_sharding_name(dc.sharding), i);
        }
        cm_trainer *tr;
        cr_assert_eq(cm_trainer_new(&cfg, &tr), CM_OK, "%s", cm_last_error());
        if (with) cr_assert_eq(cm_dist_attach(d, tr), CM_OK, "%s", cm_last_error());
        cr_assert_eq(cm_trainer_fit(tr, NULL), CM_OK, "%s", cm_last_error());
        if (with) cr_assert_eq(cm_dist_gather_params(d), CM_OK, "%s", cm_last_error());
        p[with] = cmt_params_copy(m, &n);
        if (with) {
            cm_dist_stats st = cm_dist_get_stats(d);
            cr_assert_eq(st.n_syncs, 4, "sync_grads ran %lld times, want 4", (long long)st.n_syncs);
        }
        /* the cm_dist may go before or after the trainer */
        if (with) cm_dist_free(d);
        cm_trainer_free(tr);
        cm_comm_free(c);
        cm_dataloader_free(dl);
        cm_dataset_free(ds);
        cm_model_free(m);
    }
    for (int k = 1; k < N_RUNS; k++) {
        for (int64_t i = 0; i < n; i++)
            cr_assert(p[0][i] == p[k][i], "strategy %d, param %lld: %g vs %g", k, (long long)i, p[0][i], p[k][i]);
        free(p[k]);
    }
    free(p[0]);
}

/* FULL_SHARD at rest: the model's buffers are released; freeing the cm_dist without gathering
 * leaves NaN in them (never silent zeros), gathering first leaves the trained values. */
Test(dist, full_shard_free_without_gather_leaves_nan_not_zeros) {
    for (int gather_first = 0; gather_first < 2; gather_first++) {
        cm_comm *c;
        cr_assert_eq(cm_comm_single_new(NULL, &c), CM_OK);
        cm_model *m = cmt_mlp(4, 8, 3, 0, 1);
        cm_dist_config dc = cm_dist_config_default();
        dc.sharding = CM_SHARDING_FULL_SHARD;
        cm_dist *d;
        cr_assert_eq(cm_dist_new(c, m, &dc, &d), CM_OK, "%s", cm_last_error());
        if (gather_first) cr_assert_eq(cm_dist_gather_params(d), CM_OK, "%s", cm_last_error());
        cm_dist_free(d);
        int64_t n = 0;
        float *p = cmt_params_copy(m, &n);
        cr_assert(n > 0);
        for (int64_t i = 0; i < n; i++)
            cr_assert(gather_first ? isfinite(p[i]) : isnan(p[i]), "gather %d, param %lld = %g", gather_first,
                      (long long)i, p[i]);
        free(p);
        cm_model_free(m);
        cm_comm_free(c);
    }
}

Test(dist, backward_prefetch_names_parse_defaults_are_composers_and_bad_values_are_refused) {
    cm_backward_prefetch p;
    cr_assert_eq(cm_backward_prefetch_parse("backward_pre", &p), CM_OK);
    cr_assert_eq(p, CM_BACKWARD_PREFETCH_PRE);
    cr_assert_eq(cm_backward_prefetch_parse("NONE", &p), CM_OK);
    cr_assert_eq(p, CM_BACKWARD_PREFETCH_NONE);
    cr_assert_str_eq(cm_backward_prefetch_name(CM_BACKWARD_PREFETCH_POST), "BACKWARD_POST");
    cr_assert_str_eq(cm_backward_prefetch_name((cm_backward_prefetch)9), "?");
    cr_assert_eq(cm_backward_prefetch_parse("BACKWARD_PRR", &p), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "use BACKWARD_PRE, BACKWARD_POST or NONE"), "message: %s", cm_last_error());
    /* Composer's FSDPConfig defaults */
    const cm_dist_config dc0 = cm_dist_config_default();
    cr_assert_eq(dc0.backward_prefetch, CM_BACKWARD_PREFETCH_POST);
    cr_assert(!dc0.forward_prefetch && dc0.limit_all_gathers);
    cm_comm *c;
    cr_assert_eq(cm_comm_single_new(NULL, &c), CM_OK);
    cm_model *m = cmt_mlp(4, 8, 3, 0, 1);
    cm_dist_config dc = dc0;
    dc.sharding = CM_SHARDING_FULL_SHARD;
    dc.backward_prefetch = (cm_backward_prefetch)7;
    cm_dist *d = NULL;
    cr_assert_eq(cm_dist_new(c, m, &dc, &d), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "backward_prefetch 7"), "message: %s", cm_last_error());
    cr_assert_null(d);
    cm_model_free(m);
    cm_comm_free(c);
}

/* A counting sequence task for a tiny GPT-2 (as tests/dist/dist_gpt.c). */
enum { PF_T = 8, PF_V = 24, PF_N = 24 };
static cm_field_desc pf_fields[2] = {{"input_ids", CM_DTYPE_I32, 1, {PF_T}}, {"labels", CM_DTYPE_I32, 1, {PF_T}}};
static int64_t pf_len(void *self) { return PF_N; }
static int pf_nf(void *self) { return 2; }
static const cm_field_desc *pf_field(void *self, int i) { return &pf_fields[i]; }
static cm_status pf_get(void *self, int64_t i, const cm_sample_ctx *ctx, void *const *out) {
    int32_t *x = out[0], *y = out[1];
    for (int t = 0; t < PF_T; t++) {
        x[t] = (int32_t)((i * 7 + (1 + i % 3) * t) % PF_V);
        y[t] = (int32_t)((i * 7 + (1 + i % 3) * (t + 1)) % PF_V);
    }
    return CM_OK;
}
static int64_t pf_tok(void *self, int64_t i) { return PF_T; }
static void pf_close(void *self) {}
static const cm_dataset_i k_pf_seqs = {CM_DATASET_ABI, "seqs", pf_len, pf_nf, pf_field, pf_get, pf_tok, pf_close};

/* FULL_SHARD on one rank, a GPT-2 of 4 blocks (5 units) with an eval every 2 batches: returns the
 * trained parameters (gathered) and the counters. */
static float *pf_train(cm_dist_config dc, bool ckpt, int64_t *n, cm_dist_stats *st) {
    cm_dataset *ds;
    cr_assert_eq(cm_dataset_new(&k_pf_seqs, NULL, &ds), CM_OK);
    cm_dataloader *dl = cmt_loader(ds, 6, false, 1);
    cm_dataloader *edl = cmt_loader(ds, 8, true, 1);
    cm_gpt2_config gc = cm_gpt2_config_default();
    gc.vocab_size = PF_V, gc.n_positions = 16, gc.n_embd = 16, gc.n_layer = 4, gc.n_head = 2;
    gc.embd_pdrop = gc.attn_pdrop = gc.resid_pdrop = 0.1f;
    cm_rng rng = cm_rng_init(3, 0);
    cm_model *m;
    cr_assert_eq(cm_gpt2_new(&gc, &rng, &m), CM_OK, "%s", cm_last_error());
    if (ckpt) {
        int marked = 0;
        cr_assert_eq(cm_module_checkpoint_policy(cm_model_module(m), NULL, 0, &marked), CM_OK, "%s", cm_last_error());
    }
    cm_comm *c;
    cr_assert_eq(cm_comm_single_new(NULL, &c), CM_OK);
    dc.sharding = CM_SHARDING_FULL_SHARD;
    cm_dist *d;
    cr_assert_eq(cm_dist_new(c, m, &dc, &d), CM_OK, "%s", cm_last_error());
    const cm_optim_span *sp;
    int nsp;
    cr_assert_eq(cm_dist_optim_spans(d, &sp, &nsp), CM_OK);
    cm_optim *opt;
    cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_DECOUPLED_ADAMW);
    hp.lr = 3e-3;
    cr_assert_eq(cm_optim_new(CM_OPTIM_DECOUPLED_ADAMW, &opt), CM_OK);
    cr_assert_eq(cm_optim_add_group(opt, &hp, sp, nsp), CM_OK);
    cm_trainer_config cfg = cm_trainer_config_default();
    cfg.model = m;
    cfg.train_dataloader = dl;
    cfg.eval_dataloader = edl;
    cfg.eval_interval = cm_time_make(2, CM_TIME_BATCH);
    cfg.optimizer = opt;
    cfg.device_train_microbatch_size = 2;
    cfg.run_name = "prefetch";
    cr_assert_eq(cm_time_parse("4ba", &cfg.max_duration), CM_OK);
    cm_dist_trainer_hooks(d, &cfg);
    cm_trainer *tr;
    cr_assert_eq(cm_trainer_new(&cfg, &tr), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_dist_attach(d, tr), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_fit(tr, NULL), CM_OK, "%s", cm_last_error());
    *st = cm_dist_get_stats(d);
    cr_assert_eq(cm_dist_gather_params(d), CM_OK, "%s", cm_last_error());
    float *p = cmt_params_copy(m, n);
    cm_trainer_free(tr);
    cm_dist_free(d);
    cm_optim_free(opt);
    cm_comm_free(c);
    cm_dataloader_free(dl);
    cm_dataloader_free(edl);
    cm_dataset_free(ds);
    cm_model_free(m);
    return p;
}

/* Prefetch changes when a unit's gather starts, never a value: every setting trains the bits of
 * FULL_SHARD without prefetch (dropout on, evals between steps, with and without activation
 * checkpointing); the counters show the gathers started ahead and then read by the tape, fewer
 * blocking ones, and the in-flight limit. (On 2 ranks: tests/dist, full_shard_prefetch.) */
Test(dist, full_shard_prefetch_changes_no_bit_and_starts_gathers_ahead, .timeout = 60) {
    for (int ckpt = 0; ckpt < 2; ckpt++) {
        cm_dist_config off = cm_dist_config_default();
        off.backward_prefetch = CM_BACKWARD_PREFETCH_NONE;
        int64_t n = 0, n2 = 0;
        cm_dist_stats s0;
        float *ref = pf_train(off, ckpt, &n, &s0);
        cr_assert_eq(s0.n_prefetches, 0);
        cr_assert_eq(s0.max_in_flight, 1);
        cr_assert_leq(s0.max_gathered, 2, "without prefetch at most max_resident_units (2) gathered, saw %d",
                      s0.max_gathered);
        const struct {
            cm_backward_prefetch bp;
            bool fwd, limit;
        } cases[] = {{CM_BACKWARD_PREFETCH_PRE, false, true},  {CM_BACKWARD_PREFETCH_POST, false, true},
                     {CM_BACKWARD_PREFETCH_NONE, true, true},  {CM_BACKWARD_PREFETCH_PRE, true, true},
                     {CM_BACKWARD_PREFETCH_POST, true, false}, {CM_BACKWARD_PREFETCH_PRE, true, false}};
        for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
            cm_dist_config dc = off;
            dc.backward_prefetch = cases[k].bp, dc.forward_prefetch = cases[k].fwd, dc.limit_all_gathers = cases[k].limit;
            cm_dist_stats st;
            float *p = pf_train(dc, ckpt, &n2, &st);
            cr_assert_eq(n2, n);
            for (int64_t i = 0; i < n; i++)
                cr_assert(p[i] == ref[i], "ckpt %d case %zu, param %lld: %.9g vs %.9g", ckpt, k, (long long)i, p[i],
                          ref[i]);
            free(p);
            cr_assert_gt(st.n_prefetches, 0, "ckpt %d case %zu: nothing prefetched", ckpt, k);
            cr_assert_geq(2 * st.n_prefetch_hits, st.n_prefetches, "ckpt %d case %zu: %lld prefetched, %lld read", ckpt,
                          k, (long long)st.n_prefetches, (long long)st.n_prefetch_hits);
            cr_assert_lt(st.n_gathers - st.n_prefetches, s0.n_gathers, "ckpt %d case %zu: %lld blocking gathers, %lld without",
                         ckpt, k, (long long)(st.n_gathers - st.n_prefetches), (long long)s0.n_gathers);
            const int cap = cases[k].limit ? 2 : 3; /* max_resident_units + 1 without the limit */
            cr_assert_leq(st.max_in_flight, cap, "ckpt %d case %zu: %d in flight", ckpt, k, st.max_in_flight);
            cr_assert_leq(st.max_gathered, 2 + cap, "ckpt %d case %zu: %d gathered", ckpt, k, st.max_gathered);
            if (cases[k].fwd && !cases[k].limit)
                cr_assert_eq(st.max_in_flight, 3, "ckpt %d case %zu: the prefetch did not run 2 units ahead", ckpt, k);
        }
        free(ref);
    }
}

/* The library never exits: aborting a single-process job returns an error for the program to act
 * on (this test process goes on running). */
Test(dist, abort_on_one_process_returns_instead_of_exiting) {
    cm_comm *c;
    cr_assert_eq(cm_comm_single_new(NULL, &c), CM_OK);
    cr_assert_eq(cm_comm_abort(c, 3, "(expected by the test)"), CM_ERR_UNSUPPORTED);
    cr_assert(strstr(cm_last_error(), "exit status 3"), "message: %s", cm_last_error());
    cr_assert_eq(cm_comm_abort(NULL, 1, NULL), CM_ERR_INVALID_ARG);
    cm_comm_free(c);
}
