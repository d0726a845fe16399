/* The launch environment: rank and world size from the launcher's variables, and the {rank}
 * placeholders of the launcher's --stdout / --stderr formats. */
#include "dist/dist_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    long x = strtol(v, &end, 10);
    return (end != v && *end == '\0' && x >= 0 && x < (1L << 30)) ? (int)x : dflt;
}

static bool has(const char *name) {
    const char *v = getenv(name);
    return v && *v;
}

cm_dist_env cm_dist_env_get(void) {
    cm_dist_env e = {0, 1, 0, 1, 0, "none"};
    if (has("OMPI_COMM_WORLD_SIZE")) {
        e.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
        e.world_size = env_int("OMPI_COMM_WORLD_SIZE", 1);
        e.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
        e.local_world_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
        e.launcher = "openmpi";
    } else if (has("PMI_SIZE") || has("PMI_RANK")) {
        e.rank = env_int("PMI_RANK", 0);
        e.world_size = env_int("PMI_SIZE", 1);
        e.local_rank = env_int("MPI_LOCALRANKID", 0);
        e.local_world_size = env_int("MPI_LOCALNRANKS", 1);
        e.launcher = "mpich";
    } else if (has("SLURM_PROCID") && has("SLURM_NTASKS")) {
        e.rank = env_int("SLURM_PROCID", 0);
        e.world_size = env_int("SLURM_NTASKS", 1);
        e.local_rank = env_int("SLURM_LOCALID", 0);
        e.local_world_size = env_int("SLURM_NTASKS_PER_NODE", 0);
        if (e.local_world_size <= 0) e.local_world_size = env_int("SLURM_TASKS_PER_NODE", 1);
        e.node_rank = env_int("SLURM_NODEID", 0);
        e.launcher = "slurm";
        return e;
    } else if (has("WORLD_SIZE")) {
        e.rank = env_int("RANK", 0);
        e.world_size = env_int("WORLD_SIZE", 1);
        e.local_rank = env_int("LOCAL_RANK", 0);
        e.local_world_size = env_int("LOCAL_WORLD_SIZE", e.world_size);
        e.node_rank = env_int("NODE_RANK", 0);
        e.launcher = "composer";
        return e;
    } else {
        return e;
    }
    if (e.local_world_size < 1) e.local_world_size = 1;
    /* ranks are placed node by node (mpirun --map-by node is not used by the launcher) */
    e.node_rank = has("NODE_RANK") ? env_int("NODE_RANK", 0) : e.rank / e.local_world_size;
    return e;
}

bool cm_dist_launched(void) {
    if (has("OMPI_COMM_WORLD_SIZE") || has("PMI_SIZE") || has("PMI_RANK") || has("PMIX_RANK")) return true;
    /* srun without MPI (a plain `srun ./a.out`) sets SLURM_PROCID too; only a multi-task step counts */
    return has("SLURM_PROCID") && env_int("SLURM_NTASKS", 1) > 1;
}

cm_status cm_dist_format(const char *fmt, const cm_dist_env *env, char *buf, size_t cap) {
    if (!fmt || !env || !buf || cap == 0) return cm_set_error(CM_ERR_INVALID_ARG, "cm_dist_format: NULL argument");
    size_t n = 0;
    for (const char *p = fmt; *p;) {
        char piece[32];
        const char *add = piece;
        size_t len;
        if (*p == '{') {
            const char *close = strchr(p, '}');
            if (!close)
                return cm_set_error(CM_ERR_INVALID_ARG, "format '%s': unclosed '{' (use {rank}, {local_rank}, "
                                                        "{node_rank} or {world_size})", fmt);
            size_t k = (size_t)(close - p - 1);
            int v;
            if (k == 4 && !strncmp(p + 1, "rank", 4)) v = env->rank;
            else if (k == 10 && !strncmp(p + 1, "local_rank", 10)) v = env->local_rank;
            else if (k == 9 && !strncmp(p + 1, "node_rank", 9)) v = env->node_rank;
            else if (k == 10 && !strncmp(p + 1, "world_size", 10)) v = env->world_size;
            else
                return cm_set_error(CM_ERR_INVALID_ARG, "format '%s': unknown placeholder '%.*s' (use {rank}, "
                                                        "{local_rank}, {node_rank} or {world_size})",
                                    fmt, (int)(k + 2), p);
            len = (size_t)snprintf(piece, sizeof piece, "%d", v);
            p = close + 1;
        } else {
            add = p;
            len = 1;
            p++;
        }
        if (n + len + 1 > cap)
            return cm_set_error(CM_ERR_INVALID_ARG, "format '%s': the result is longer than %zu bytes", fmt, cap - 1);
        memcpy(buf + n, add, len);
        n += len;
    }
    buf[n] = '\0';
    return CM_OK;
}

static const char *const k_sharding[] = {
#define CM_X_(name, str) str,
    CM_SHARDING_LIST(CM_X_)
#undef CM_X_
};

const char *cm_sharding_name(cm_sharding s) { return (unsigned)s < CM_SHARDING_COUNT ? k_sharding[s] : "?"; }

cm_status cm_sharding_parse(const char *s, cm_sharding *out) {
    for (int i = 0; s && i < CM_SHARDING_COUNT; i++)
        if (!strcasecmp(s, k_sharding[i])) {
            *out = (cm_sharding)i;
            return CM_OK;
        }
    return cm_set_error(CM_ERR_INVALID_ARG, "sharding_strategy '%s': use NO_SHARD, SHARD_GRAD_OP, FULL_SHARD, "
                                            "HYBRID_SHARD or _HYBRID_SHARD_ZERO2",
                        s ? s : "(null)");
}

bool cm_sharding_is_hybrid(cm_sharding s) { return s == CM_SHARDING_HYBRID_SHARD || s == CM_SHARDING_HYBRID_SHARD_ZERO2; }

cm_status cm_dist_hybrid_degrees(int world, int local_world, int *shard, int *replicate) {
    if (!shard || !replicate) return cm_set_error(CM_ERR_INVALID_ARG, "cm_dist_hybrid_degrees: NULL argument");
    if (world < 1) return cm_set_error(CM_ERR_INVALID_ARG, "cm_dist_hybrid_degrees: world size %d", world);
    int s = *shard, r = *replicate;
    if (s < 0 || r < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "data_parallel_%s_degree %d must be >= 1 (or left out, or -1, to derive "
                                                "it from the world size %d)",
                            s < 0 ? "shard" : "replicate", s < 0 ? s : r, world);
    if (!s && !r) {
        /* Composer's default: shard within a node, one replica per node */
        if (local_world < 1 || world % local_world)
            return cm_set_error(CM_ERR_INVALID_ARG, "HYBRID_SHARD: data_parallel_shard_degree defaults to the ranks per "
                                                    "node (%d), which does not divide the world size %d; set "
                                                    "data_parallel_shard_degree (and data_parallel_replicate_degree) so "
                                                    "that their product is %d",
                                local_world, world, world);
        s = local_world;
    }
    if (s && !r) {
        if (world % s)
            return cm_set_error(CM_ERR_INVALID_ARG, "data_parallel_shard_degree %d does not divide the world size %d, so "
                                                    "data_parallel_replicate_degree cannot be derived; use a divisor of %d",
                                s, world, world);
        r = world / s;
    } else if (r && !s) {
        if (world % r)
            return cm_set_error(CM_ERR_INVALID_ARG, "data_parallel_replicate_degree %d does not divide the world size %d, "
                                                    "so data_parallel_shard_degree cannot be derived; use a divisor of %d",
                                r, world, world);
        s = world / r;
    } else if ((long long)s * r != world) {
        return cm_set_error(CM_ERR_INVALID_ARG, "data_parallel_shard_degree %d x data_parallel_replicate_degree %d = %lld "
                                                "is not the world size %d (their product must be the number of ranks; "
                                                "give one and the other is derived)",
                            s, r, (long long)s * r, world);
    }
    *shard = s, *replicate = r;
    return CM_OK;
}
