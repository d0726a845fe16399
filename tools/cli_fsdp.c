/* fsdp_config: Composer's FSDPConfig keys (llm-foundry writes them under a top-level fsdp_config:,
 * Composer's parallelism_config under fsdp:; this CLI reads parallelism.fsdp or fsdp_config), each
 * mapped onto what it means in this library or refused where that meaning is not built. */
#include "cli_fsdp.h"

#include <stdarg.h>
#include <string.h>
#include <strings.h>

#define TRY_FSDP(call)              \
    do {                            \
        cm_status s_ = (call);      \
        if (s_ != CM_OK) return s_; \
    } while (0)

static const char *key(char *buf, size_t cap, const cli_fsdp *f, const char *k) {
    snprintf(buf, cap, "%s.%s", f->prefix, k);
    return buf;
}

/* "<file:line:col>: <prefix.key>: <message>" with status s. */
#define fail cli_key_error

/* A bool that, when absent, stays absent (the resolved config shows only what the user wrote:
 * these keys are Composer's, and their defaults are the behaviour of a run without the block). */
static cm_status opt_bool(cm_config *c, const cli_fsdp *f, const char *k, bool def, bool *out) {
    char p[128];
    key(p, sizeof p, f, k);
    if (!cm_config_has(c, p)) {
        cm_config_touch(c, p);
        *out = def;
        return CM_OK;
    }
    return cm_config_get_bool(c, p, def, out);
}

/* torch dtype names as Composer's get_torch_dtype reads them: 0 fp32, 1 bf16, 2 fp16, -1 unknown. */
static int dtype_of(const char *s) {
    static const char *const f32[] = {"fp32", "float32", "float", "torch.float32", "amp_fp32"};
    static const char *const b16[] = {"bf16", "bfloat16", "amp_bf16", "torch.bfloat16"};
    static const char *const f16[] = {"fp16", "float16", "half", "amp_fp16", "torch.float16"};
    for (size_t i = 0; i < sizeof f32 / sizeof *f32; i++)
        if (!strcasecmp(s, f32[i])) return 0;
    for (size_t i = 0; i < sizeof b16 / sizeof *b16; i++)
        if (!strcasecmp(s, b16[i])) return 1;
    for (size_t i = 0; i < sizeof f16 / sizeof *f16; i++)
        if (!strcasecmp(s, f16[i])) return 2;
    return -1;
}

/* mixed_precision: FULL | DEFAULT | PURE or {param_dtype, reduce_dtype, buffer_dtype,
 * keep_low_precision_grads}, Composer's meanings (cm_mixed_precision): unset with the block
 * present is Composer's default, DEFAULT, on the CPU and on a GPU (with cpu_offload too: the
 * uploaded f32 units are rounded on the device); fp16 (no kernels) and keep_low_precision_grads:
 * true are refused. */
static cm_status read_mixed_precision(cm_config *c, cli_fsdp *f, cm_precision prec) {
    char p[128], q[160];
    key(p, sizeof p, f, "mixed_precision");
    const cm_config_kind kind = cm_config_kind_of(c, p);
    cm_mixed_precision *mp = &f->mixed_precision;
    *mp = (cm_mixed_precision){CM_DTYPE_F32, CM_DTYPE_F32, CM_DTYPE_F32, false};
    if (kind == CM_CONFIG_MAP) {
        cm_config_mark_read(c, p);
        static const char *const fields[] = {"param_dtype", "reduce_dtype", "buffer_dtype"};
        cm_dtype *dst[] = {&mp->param_dtype, &mp->reduce_dtype, &mp->buffer_dtype};
        for (int i = 0; i < 3; i++) {
            const char *v;
            snprintf(q, sizeof q, "%s.%s", p, fields[i]);
            TRY_FSDP(cm_config_get_string(c, q, NULL, &v));
            if (!v) continue; /* Composer: absent = fp32 */
            const int d = dtype_of(v);
            if (d < 0)
                return fail(c, q, CM_ERR_INVALID_ARG, "unknown dtype '%s' (use fp32 | float32, bf16 | bfloat16, fp16 | "
                                                      "float16)", v);
            if (d == 2)
                return fail(c, q, CM_ERR_UNSUPPORTED, "'%s': fp16 is not built (there are no fp16 kernels, and precision "
                                                      "amp_fp16 is refused too); use bf16 or fp32", v);
            *dst[i] = d == 1 ? CM_DTYPE_BF16 : CM_DTYPE_F32;
        }
        snprintf(q, sizeof q, "%s.keep_low_precision_grads", p);
        bool keep = false;
        TRY_FSDP(cm_config_get_bool(c, q, false, &keep));
        if (keep)
            return fail(c, q, CM_ERR_UNSUPPORTED, "true is not built: the optimizer steps f32 gradients here (the reduced "
                                                  "gradient is widened to f32, Composer's default false); set it to false");
    } else if (kind == CM_CONFIG_SEQ) {
        return fail(c, p, CM_ERR_INVALID_ARG, "expected FULL, DEFAULT, PURE or {param_dtype, reduce_dtype, buffer_dtype}");
    } else {
        static const char *const policies[] = {"FULL", "DEFAULT", "PURE"};
        int pol;
        TRY_FSDP(cm_config_get_choice(c, p, policies, 3, NULL, &pol));
        /* Composer's default is DEFAULT, when there is an FSDP block at all (amp_fp16 is left to
         * the trainer's own refusal) */
        if (pol < 0) pol = f->present && prec != CM_PRECISION_AMP_FP16 ? 1 : 0;
        TRY_FSDP(cm_mixed_precision_policy(policies[pol], prec, mp));
        if (mp->param_dtype == CM_DTYPE_F16)
            return fail(c, p, CM_ERR_UNSUPPORTED, "%s with precision amp_fp16 holds parameters in fp16, which is not "
                                                  "built (there are no fp16 kernels); use amp_bf16",
                        policies[pol]);
    }
    f->mp16 = mp->param_dtype != CM_DTYPE_F32 || mp->reduce_dtype != CM_DTYPE_F32 || mp->buffer_dtype != CM_DTYPE_F32;
    return CM_OK;
}

/* activation_checkpointing_target, llm-foundry's forms: a type name, a list of them, or a map
 * type -> blocks (an id, a list of ids and range strings, or one string "first-2, middle-4"). */
static cm_status read_targets(cm_config *c, cli_fsdp *f) {
    char p[128], q[400];
    key(p, sizeof p, f, "activation_checkpointing_target");
    const cm_config_kind kind = cm_config_kind_of(c, p);
    f->n_targets = 0;
    if (kind == CM_CONFIG_ABSENT || kind == CM_CONFIG_NULL) {
        cm_config_touch(c, p);
        return CM_OK;
    }
    if (kind == CM_CONFIG_SCALAR) {
        TRY_FSDP(cm_config_get_string(c, p, NULL, &f->targets[0].type_name));
        f->targets[0].blocks = NULL;
        f->n_targets = 1;
        return CM_OK;
    }
    const int n = cm_config_len(c, p);
    if (n > CLI_FSDP_MAX_TARGETS) return fail(c, p, CM_ERR_INVALID_ARG, "at most %d types (has %d)", CLI_FSDP_MAX_TARGETS, n);
    cm_config_mark_read(c, p);
    for (int i = 0; i < n; i++) {
        cm_act_ckpt_target *t = &f->targets[i];
        if (kind == CM_CONFIG_SEQ) {
            snprintf(q, sizeof q, "%s.%d", p, i);
            if (cm_config_kind_of(c, q) != CM_CONFIG_SCALAR)
                return fail(c, q, CM_ERR_INVALID_ARG, "expected a module type name (GPT2Block)");
            TRY_FSDP(cm_config_get_string(c, q, NULL, &t->type_name));
            t->blocks = NULL;
            continue;
        }
        t->type_name = cm_config_key_at(c, p, i);
        snprintf(q, sizeof q, "%s.%s", p, t->type_name);
        char *b = f->target_blocks[i];
        b[0] = 0;
        const cm_config_kind bk = cm_config_kind_of(c, q);
        if (bk == CM_CONFIG_SCALAR) {
            const char *v;
            TRY_FSDP(cm_config_get_string(c, q, NULL, &v));
            snprintf(b, sizeof f->target_blocks[i], "%s", v);
        } else if (bk == CM_CONFIG_SEQ) {
            cm_config_mark_read(c, q);
            size_t used = 0;
            for (int j = 0; j < cm_config_len(c, q); j++) {
                char e[440];
                const char *v;
                snprintf(e, sizeof e, "%s.%d", q, j);
                if (cm_config_kind_of(c, e) != CM_CONFIG_SCALAR)
                    return fail(c, e, CM_ERR_INVALID_ARG, "expected a block id or first-n, last-k, middle-m, range-i-j, "
                                                          "every-k");
                TRY_FSDP(cm_config_get_string(c, e, NULL, &v));
                const int w = snprintf(b + used, sizeof f->target_blocks[i] - used, "%s%s", j ? "," : "", v);
                if (w < 0 || (size_t)w >= sizeof f->target_blocks[i] - used)
                    return fail(c, q, CM_ERR_INVALID_ARG, "the block list is too long (at most %zu characters)",
                                sizeof f->target_blocks[i] - 1);
                used += (size_t)w;
            }
        } else if (bk == CM_CONFIG_MAP) {
            return fail(c, q, CM_ERR_INVALID_ARG, "expected blocks: an id, a list, or \"first-n, last-k, middle-m, "
                                                  "range-i-j, every-k\"");
        } else {
            cm_config_touch(c, q); /* `GPT2Block:` (null): every block of the type */
        }
        t->blocks = b[0] ? b : NULL;
    }
    f->n_targets = n;
    return CM_OK;
}

cm_status cli_fsdp_read(cm_config *c, bool train, cm_precision precision, cm_device device, cli_fsdp *out) {
    cli_fsdp *f = out;
    memset(f, 0, sizeof *f);
    f->state_dict_type = CLI_SDT_UNSET;
    f->backward_prefetch = CM_BACKWARD_PREFETCH_POST, f->limit_all_gathers = true;
    const cm_config_kind ours = cm_config_kind_of(c, "parallelism.fsdp");
    const cm_config_kind theirs = cm_config_kind_of(c, "fsdp_config");
    if (ours != CM_CONFIG_ABSENT && theirs != CM_CONFIG_ABSENT && ours != CM_CONFIG_NULL && theirs != CM_CONFIG_NULL)
        return fail(c, "fsdp_config", CM_ERR_INVALID_ARG, "given twice: here and as parallelism.fsdp (%s); keep one",
                    cm_config_origin(c, "parallelism.fsdp"));
    f->prefix = theirs != CM_CONFIG_ABSENT && theirs != CM_CONFIG_NULL ? "fsdp_config" : "parallelism.fsdp";
    if (theirs == CM_CONFIG_NULL) cm_config_touch(c, "fsdp_config"); /* `fsdp_config:` with nothing under it */
    const cm_config_kind kind = cm_config_kind_of(c, f->prefix);
    if (kind == CM_CONFIG_SCALAR || kind == CM_CONFIG_SEQ)
        return fail(c, f->prefix, CM_ERR_INVALID_ARG, "expected a map of FSDP options ({sharding_strategy: FULL_SHARD, "
                                                      "activation_checkpointing: true, ...})");
    f->present = kind == CM_CONFIG_MAP;
    char p[128];

    /* sharding_strategy */
    static const char *const strategies[] = {
#define CM_X_(name, str) str,
        CM_SHARDING_LIST(CM_X_)
#undef CM_X_
    };
    key(p, sizeof p, f, "sharding_strategy");
    int strat;
    TRY_FSDP(cm_config_get_choice(c, p, strategies, CM_SHARDING_COUNT, "NO_SHARD", &strat));
    f->sharding = (cm_sharding)strat;
    /* HYBRID_SHARD's group sizes (Composer: data_parallel_shard_degree -1 = derive; replicate
     * degree absent = derive); checked against the world size in cli_fsdp_check_dist */
    static const char *const degrees[] = {"data_parallel_shard_degree", "data_parallel_replicate_degree"};
    for (int i = 0; i < 2; i++) {
        int64_t v;
        key(p, sizeof p, f, degrees[i]);
        if (!cm_config_has(c, p) || cm_config_kind_of(c, p) == CM_CONFIG_NULL) {
            cm_config_touch(c, p);
            continue;
        }
        TRY_FSDP(cm_config_get_int(c, p, -1, &v));
        if (v == 0 || v < -1 || v > (1 << 20))
            return fail(c, p, CM_ERR_INVALID_ARG, "%lld: a number of ranks >= 1 (or -1: derived from the world size)",
                        (long long)v);
        if (v > 0 && !cm_sharding_is_hybrid(f->sharding))
            return fail(c, p, CM_ERR_INVALID_ARG, "%lld applies to sharding_strategy HYBRID_SHARD or _HYBRID_SHARD_ZERO2 "
                                                  "only (%s shards over every rank); use a hybrid strategy or leave it out",
                        (long long)v, cm_sharding_name(f->sharding));
        *(i ? &f->replicate_degree : &f->shard_degree) = v > 0 ? (int)v : 0;
    }
    /* an evaluation reads the parameters as training does: the policy applies there too */
    TRY_FSDP(read_mixed_precision(c, f, precision));
    if (!train) {
        if (f->present) cm_config_touch(c, f->prefix);
        return CM_OK;
    }
    if (f->present) cm_config_mark_read(c, f->prefix);

    /* activation checkpointing */
    bool reentrant;
    TRY_FSDP(opt_bool(c, f, "activation_checkpointing", false, &f->act_ckpt));
    TRY_FSDP(opt_bool(c, f, "activation_checkpointing_reentrant", true, &reentrant)); /* same results either way */
    TRY_FSDP(read_targets(c, f));

    /* offload: to host memory, which is where a CPU run's tensors already are; on a GPU run
     * cpu_offload keeps parameters, gradients and optimizer state there (cm_dist_config) */
    bool act_off, par_off;
    TRY_FSDP(opt_bool(c, f, "activation_cpu_offload", false, &act_off));
    TRY_FSDP(opt_bool(c, f, "cpu_offload", false, &par_off));
    if (act_off && device != CM_DEVICE_CPU && f->act_ckpt)
        return fail(c, key(p, sizeof p, f, "activation_cpu_offload"), CM_ERR_UNSUPPORTED,
                    "with activation_checkpointing: a checkpointed block keeps only its input, so there is nothing "
                    "left to offload; choose one (checkpointing recomputes, offloading copies to host memory and "
                    "back)");
    f->offload = (act_off || par_off) && device == CM_DEVICE_CPU;
    f->act_offload = act_off && device != CM_DEVICE_CPU;
    f->cpu_offload = par_off && device != CM_DEVICE_CPU;


    key(p, sizeof p, f, "sync_module_states");
    f->has_sync_module_states = cm_config_has(c, p);
    TRY_FSDP(opt_bool(c, f, "sync_module_states", true, &f->sync_module_states));

    static const char *const sdt[] = {"full", "sharded"};
    int st;
    TRY_FSDP(cm_config_get_choice(c, key(p, sizeof p, f, "state_dict_type"), sdt, 2, NULL, &st));
    f->state_dict_type = (cli_state_dict_type)st;

    TRY_FSDP(opt_bool(c, f, "verbose", false, &f->verbose));

    /* accepted, with their meaning here in --help */
    bool ignored;
    TRY_FSDP(opt_bool(c, f, "use_orig_params", true, &ignored));

    /* FULL_SHARD prefetch (cm_dist_config): Composer's defaults */
    TRY_FSDP(opt_bool(c, f, "limit_all_gathers", true, &f->limit_all_gathers));
    TRY_FSDP(opt_bool(c, f, "forward_prefetch", false, &f->forward_prefetch));
    static const char *const prefetch[] = {"BACKWARD_PRE", "BACKWARD_POST", "NONE"};
    static const cm_backward_prefetch prefetch_of[] = {CM_BACKWARD_PREFETCH_PRE, CM_BACKWARD_PREFETCH_POST,
                                                       CM_BACKWARD_PREFETCH_NONE};
    int bp;
    TRY_FSDP(cm_config_get_choice(c, key(p, sizeof p, f, "backward_prefetch"), prefetch, 3, NULL, &bp));
    f->backward_prefetch = bp < 0 ? CM_BACKWARD_PREFETCH_POST : prefetch_of[bp];
    return CM_OK;
}

typedef struct verbose_walk {
    const cli_ctx *ctx;
    int n;
} verbose_walk;

static bool say_checkpointed(cm_module *m, const char *path, int depth, void *data) {
    (void)depth;
    verbose_walk *w = data;
    if (!cm_module_checkpointing(m) && !cm_module_activation_offload(m)) return true;
    cli_say(w->ctx, "  activation %s: %s (%s)\n", cm_module_checkpointing(m) ? "checkpointed" : "offloaded",
            path[0] ? path : "<root>", cm_module_type_name(m));
    w->n++;
    return true;
}

cm_status cli_fsdp_apply_model(cm_config *c, const cli_fsdp *f, cm_model *model, const cli_ctx *ctx, int rank) {
    cm_module *root = cm_model_module(model);
    char p[128];
    if (f->act_ckpt || f->act_offload) { /* offload picks its blocks as checkpointing does (llm-foundry) */
        int marked = 0;
        cm_status s = f->act_offload ? cm_module_activation_offload_policy(root, f->targets, f->n_targets, &marked)
                                     : cm_module_checkpoint_policy(root, f->targets, f->n_targets, &marked);
        if (s) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            const char *k = f->n_targets ? "activation_checkpointing_target"
                            : f->act_offload ? "activation_cpu_offload"
                                             : "activation_checkpointing";
            const size_t kl = strlen("activation_checkpointing_target: ");
            const bool dup = !strncmp(msg, "activation_checkpointing_target: ", kl);
            /* a type the model does not have is a bad value in the config, as a malformed one is */
            return fail(c, key(p, sizeof p, f, k), s == CM_ERR_NOT_FOUND ? CM_ERR_INVALID_ARG : s, "%s",
                        msg + (dup ? kl : 0));
        }
        if (marked == 0)
            return fail(c, key(p, sizeof p, f, f->act_offload ? "activation_cpu_offload" : "activation_checkpointing"),
                        CM_ERR_INVALID_ARG,
                        "no module of %s to %s (it has no repeated wrap units); name the types with "
                        "activation_checkpointing_target",
                        cm_model_type_name(model), f->act_offload ? "offload" : "checkpoint");
    }
    if (f->offload && rank == 0)
        cm_log_msg(CM_LOG_INFO, "%s: cpu_offload / activation_cpu_offload: this is a CPU run, every tensor is "
                                "already in host memory: nothing to offload to",
                   f->prefix);
    if (f->verbose && rank == 0) {
        const int n = cm_module_n_units(root);
        cli_say(ctx, "%s: %d wrap units (each one flat parameter buffer: the bucket of its reduction and the piece "
                     "that is sharded)\n",
                f->prefix, n);
        for (int i = 0; i < n; i++) {
            const cm_unit_info *u = cm_module_unit(root, i);
            cli_say(ctx, "  unit %d: %s, %lld parameters, %lld elements\n", i, u->name, (long long)u->n_params,
                    (long long)u->numel);
        }
        verbose_walk w = {ctx, 0};
        cm_module_visit(root, say_checkpointed, &w);
        if (!w.n) cli_say(ctx, "  no activation checkpointing or offload\n");
        cli_say(ctx, "  mixed_precision: param_dtype %s, reduce_dtype %s, buffer_dtype %s (masters and optimizer: f32)\n",
                cm_dtype_name(f->mixed_precision.param_dtype), cm_dtype_name(f->mixed_precision.reduce_dtype),
                cm_dtype_name(f->mixed_precision.buffer_dtype));
    }
    return CM_OK;
}

cm_status cli_fsdp_check_dist(cm_config *c, const cli_fsdp *f, int world, cm_dist_config *dc) {
    char p[128];
    if (dc && f->has_sync_module_states) dc->sync_module_states = f->sync_module_states;
    if (dc) dc->cpu_offload = f->cpu_offload;
    if (cm_sharding_is_hybrid(f->sharding)) {
        int sd = f->shard_degree, rd = f->replicate_degree;
        if (cm_dist_hybrid_degrees(world, cm_dist_env_get().local_world_size, &sd, &rd) != CM_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", cm_last_error());
            /* the key the user wrote (the shard degree when both or neither) */
            return fail(c, key(p, sizeof p, f, f->replicate_degree && !f->shard_degree ? "data_parallel_replicate_degree"
                                                                                        : "data_parallel_shard_degree"),
                        CM_ERR_INVALID_ARG, "%s (%s on %d rank%s)", msg, cm_sharding_name(f->sharding), world,
                        world == 1 ? "" : "s");
        }
        if (dc) dc->shard_degree = sd, dc->replicate_degree = rd;
    }
    if (dc) dc->mixed_precision = f->mixed_precision;
    if (dc && f->present) {
        dc->backward_prefetch = f->backward_prefetch;
        dc->forward_prefetch = f->forward_prefetch;
        dc->limit_all_gathers = f->limit_all_gathers;
    }
    if (f->state_dict_type == CLI_SDT_UNSET) return CM_OK;
    const bool sharded = world > 1 && f->sharding != CM_SHARDING_NO_SHARD;
    key(p, sizeof p, f, "state_dict_type");
    if (f->state_dict_type == CLI_SDT_FULL && sharded)
        return fail(c, p, CM_ERR_UNSUPPORTED,
                    "full with %s on %d ranks: gathering one monolithic checkpoint on rank 0 is not built yet; use "
                    "sharded (one file pair per rank; it loads on any number of ranks, and composer ckpt export "
                    "writes the whole model as one safetensors file)",
                    cm_sharding_name(f->sharding), world);
    if (f->state_dict_type == CLI_SDT_SHARDED && !sharded)
        cm_log_msg(CM_LOG_INFO, "%s: sharded: %s every rank holds every parameter, so checkpoints are monolithic "
                                "(rank 0 writes them; they load on any number of ranks, sharded or not)",
                   p, world == 1 ? "one process:" : "NO_SHARD:");
    return CM_OK;
}

void cli_fsdp_say_dist(const cli_fsdp *f, const cm_dist_config *dc, const cli_ctx *ctx, int rank) {
    if (!f->verbose || rank != 0 || dc->sharding != CM_SHARDING_FULL_SHARD) return;
    cli_say(ctx, "%s: FULL_SHARD prefetch: backward_prefetch %s, forward_prefetch %s, limit_all_gathers %s\n", f->prefix,
            cm_backward_prefetch_name(dc->backward_prefetch), dc->forward_prefetch ? "true" : "false",
            dc->limit_all_gathers ? "true" : "false");
}

void cli_fsdp_help(FILE *f) {
    fprintf(f,
            "  parallelism.fsdp.sharding_strategy   NO_SHARD (DDP, default) | SHARD_GRAD_OP (ZeRO-2) |\n"
            "                     FULL_SHARD (ZeRO-3) | HYBRID_SHARD | _HYBRID_SHARD_ZERO2, with several ranks\n"
            "                     (composer -n N; one process has nothing to shard). HYBRID_SHARD: FULL_SHARD\n"
            "                     within groups of data_parallel_shard_degree ranks (consecutive ranks: a node by\n"
            "                     default), replicated over data_parallel_replicate_degree groups; gradients are\n"
            "                     reduce-scattered in the group, then all-reduced over the ranks holding the\n"
            "                     same piece. _HYBRID_SHARD_ZERO2: the same with SHARD_GRAD_OP in the groups.\n"
            "                     data_parallel_shard_degree, data_parallel_replicate_degree: give one and the\n"
            "                     other is the number of ranks divided by it (-1: derived); neither: shard\n"
            "                     degree = ranks per node, replicate degree = nodes; their product must be the\n"
            "                     number of ranks (an error naming both otherwise). Hybrid checkpoints are\n"
            "                     sharded (each piece written once) and load on any number of ranks\n"
            "  parallelism.fsdp:  (or llm-foundry's top-level fsdp_config:) Composer's other FSDP keys:\n"
            "                     activation_checkpointing (false): keep only each block's input in forward and\n"
            "                     recompute the block in backward (same losses and gradients, bit for bit)\n"
            "                     activation_checkpointing_target: which modules, by type name: GPT2Block, a\n"
            "                     list, or {GPT2Block: blocks} with blocks an id, a list, or \"first-n, last-k,\n"
            "                     middle-m, range-i-j, every-k\" (default: the blocks that are repeated wrap units)\n"
            "                     activation_checkpointing_reentrant: accepted (the recompute replays the\n"
            "                     tape; results are the same either way)\n"
            "                     cpu_offload (false): on a GPU run (one process), parameters, gradients and\n"
            "                     optimizer state live in host memory: each block's parameters are uploaded\n"
            "                     when it runs (the next one prefetched, as FULL_SHARD's keys below say), its\n"
            "                     gradient downloaded when final; the optimizer and clipping run on the CPU.\n"
            "                     Device memory holds about 2 blocks instead of the model (plus activations)\n"
            "                     activation_cpu_offload (false): on a GPU run, what each block (the blocks\n"
            "                     activation_checkpointing_target picks) saves for backward waits in host\n"
            "                     memory between its forward and its backward (the same bits); not with\n"
            "                     activation_checkpointing (an error: nothing is left to offload)\n"
            "                     a CPU run has nothing to offload to: either key is accepted and said once\n"
            "                     mixed_precision (DEFAULT when the block is given, as Composer's): FULL (fp32\n"
            "                     throughout) | DEFAULT (parameters and buffers in the precision's dtype, bf16\n"
            "                     under amp_bf16; gradient reductions fp32) | PURE (reductions too) |\n"
            "                     {param_dtype, reduce_dtype, buffer_dtype: fp32 | bf16 (absent: fp32),\n"
            "                     keep_low_precision_grads: false}. The optimizer steps fp32 masters (what\n"
            "                     checkpoints hold, so a run resumes under any policy); forward and backward\n"
            "                     read the parameters rounded to bf16 (fp32 kernels on the rounded values, or\n"
            "                     bf16 matmuls under amp_bf16); FULL_SHARD / SHARD_GRAD_OP gather them as bf16\n"
            "                     (half the bytes); bf16 reductions move half the bytes (summed in fp32 in rank\n"
            "                     order, rounded once). Also on one process, and on device gpu (one process:\n"
            "                     the masters and the rounding on the GPU; with cpu_offload the masters stay\n"
            "                     in host memory and each unit is rounded on the GPU after its upload).\n"
            "                     fp16 and keep_low_precision_grads: true: not built (an error naming the key)\n"
            "                     sync_module_states (true): broadcast rank 0's weights at the start (false: each\n"
            "                     rank's, equal anyway: every rank builds them from the same seed)\n"
            "                     state_dict_type: full | sharded: the checkpoints' layout; sharded under\n"
            "                     SHARD_GRAD_OP / FULL_SHARD / hybrid on several ranks (full there: not built, an\n"
            "                     error); full otherwise (sharded is then noted and written monolithic)\n"
            "                     verbose (false): print the wrap units and the checkpointed modules\n"
            "                     use_orig_params: accepted (parameters always keep their names over flat\n"
            "                     buffers)\n"
            "                     FULL_SHARD prefetch (no effect under the other strategies; values are the\n"
            "                     same bits, only when a unit's all-gather starts changes; units are taken in\n"
            "                     the order the previous forward / backward read them):\n"
            "                     backward_prefetch (BACKWARD_POST): BACKWARD_PRE starts the next unit's\n"
            "                     gather when backward enters a unit, BACKWARD_POST once the unit's gradient\n"
            "                     is final, NONE gathers each unit when backward reads it\n"
            "                     forward_prefetch (false): entering a unit in forward starts the next one's\n"
            "                     limit_all_gathers (true): at most 2 gathers in flight, one unit ahead; false:\n"
            "                     up to 2 units ahead (3 in flight; more memory: the units in flight hold\n"
            "                     their parameters on top of the 2 gathered units the tape uses)\n");
}
