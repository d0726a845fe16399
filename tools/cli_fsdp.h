/* Composer's / llm-foundry's fsdp_config for `composer train` (cli_fsdp.c): every key read,
 * validated against this run (precision, device, ranks) and mapped onto what it means here —
 * activation checkpointing on the model, the data-parallel config, the checkpoint layout — or
 * refused with CM_ERR_UNSUPPORTED where the meaning is not built, never silently different. */
#ifndef COMPOSER_CLI_FSDP_H
#define COMPOSER_CLI_FSDP_H

#include "cli.h"

#define CLI_FSDP_MAX_TARGETS 16

typedef enum cli_state_dict_type { CLI_SDT_UNSET = -1, CLI_SDT_FULL = 0, CLI_SDT_SHARDED = 1 } cli_state_dict_type;

typedef struct cli_fsdp {
    const char *prefix;   /* "parallelism.fsdp" (ours) or "fsdp_config" (llm-foundry's top-level block) */
    bool present;         /* the config has the block */
    cm_sharding sharding; /* sharding_strategy (NO_SHARD when absent) */
    int shard_degree;     /* data_parallel_shard_degree (0: absent or -1, derived) */
    int replicate_degree; /* data_parallel_replicate_degree (0: absent or -1, derived) */
    bool act_ckpt;        /* activation_checkpointing */
    /* activation_checkpointing_target: n_targets 0 = the default policy (the repeated wrap units) */
    cm_act_ckpt_target targets[CLI_FSDP_MAX_TARGETS];
    int n_targets;
    char target_blocks[CLI_FSDP_MAX_TARGETS][256]; /* the blocks lists the map form wrote */
    bool offload;           /* activation_cpu_offload or cpu_offload on a CPU run: one note at start */
    bool cpu_offload;       /* cpu_offload on a GPU run: cm_dist_config.cpu_offload (one process) */
    bool act_offload;       /* activation_cpu_offload on a GPU run: the checkpointing policy's modules offload */
    bool has_sync_module_states;
    bool sync_module_states;
    cli_state_dict_type state_dict_type;
    bool verbose;
    /* FULL_SHARD prefetch (Composer's defaults when absent) */
    cm_backward_prefetch backward_prefetch;
    bool forward_prefetch, limit_all_gathers;
    /* mixed_precision resolved for this run's precision (Composer's DEFAULT when the block is
     * present and the key is not; f32 throughout without a block); mp16: some field is bf16 (a
     * one-process run then gets a cm_dist of its own to apply it) */
    cm_mixed_precision mixed_precision;
    bool mp16;
} cli_fsdp;

/* Reads the block (in every mode but generate; train = false reads sharding_strategy and
 * mixed_precision only and marks the rest read). Errors (CM_ERR_INVALID_ARG, or CM_ERR_UNSUPPORTED for a meaning that is
 * not built) name the key with its file:line. */
cm_status cli_fsdp_read(cm_config *c, bool train, cm_precision precision, cm_device device, cli_fsdp *out);

/* After model surgery, before data parallelism: applies the activation checkpointing policy to
 * the model, says once that there is nothing to offload to (CPU runs that asked for it), and with
 * verbose prints the wrap units and the checkpointed modules (rank 0 only prints). */
cm_status cli_fsdp_apply_model(cm_config *c, const cli_fsdp *f, cm_model *model, const cli_ctx *ctx, int rank);

/* Once the number of ranks is known: checks state_dict_type against the layout this run's
 * checkpoints have and a hybrid strategy's degrees against the world size (file:line, both keys
 * and the world size named), fills the data-parallel config's keys (sync_module_states, the
 * degrees, the prefetch keys). */
cm_status cli_fsdp_check_dist(cm_config *c, const cli_fsdp *f, int world, cm_dist_config *dc);

/* With verbose, on rank 0 under FULL_SHARD: the prefetch settings cm_dist_new was given. */
void cli_fsdp_say_dist(const cli_fsdp *f, const cm_dist_config *dc, const cli_ctx *ctx, int rank);

/* The keys' lines for `composer train --help`. */
void cli_fsdp_help(FILE *f);

#endif
