/* Shared pieces of the `composer` command-line tool: flag parsing and suggestions (composer.c),
 * the train / eval / generate commands (cli_train.c) and the plugin registry (cli_plugins.c). */
#ifndef COMPOSER_CLI_H
#define COMPOSER_CLI_H

#include <composer/composer.h>
#include <composer/datasets.h>
#include <composer/algorithms.h>
#include <composer/surgery_algorithms.h>
#include <composer/config.h>
#include <composer/profiler.h>
#include <composer/hf.h>
#include <composer/report.h>
#include <composer/trainer.h>

#include <regex.h>
#include <stdio.h>

#define EXIT_USAGE 2

/* Flags: "--name value", "--name=value" and short "-x value". */
typedef struct cli_flag {
    const char *name;       /* "--tokenizer" */
    const char *short_name; /* "-o" or NULL */
    const char *value;      /* metavariable ("NAME") or NULL for a switch */
    const char *help;
    const char **out; /* where the value goes ("1" for a switch) */
} cli_flag;

void cli_print_flags(FILE *f, const cli_flag *flags);
/* Parses argv against flags; positional arguments go to pos (up to max_pos). Returns 0, or
 * EXIT_USAGE after printing the problem, or -1 when --help was printed. */
int cli_parse_flags(const char *prog, const cli_flag *flags, int argc, char **argv, const char **pos, int max_pos,
                    int *n_pos, void (*usage)(FILE *, const char *));
/* Prints "; did you mean 'x'?\n" (or just "\n") to stderr. */
void cli_print_suggestion(const char *word, const char *const *cands, int n);
int cli_mkdirs(const char *path); /* 0 or an errno */

int cmd_train(const char *prog, int argc, char **argv);
int cmd_eval(const char *prog, int argc, char **argv);
int cmd_generate(const char *prog, int argc, char **argv);
int cmd_data_convert(const char *prog, int argc, char **argv); /* cli_data.c */
int cmd_recipe_compare(const char *prog, int argc, char **argv); /* cli_recipe.c */

/* ---------------------------------------------------------------------------------------------
 * Plugin registry: config name -> constructor reading its arguments from the config node
 * ------------------------------------------------------------------------------------------- */

typedef enum cli_plugin_kind { CLI_ALGORITHM = 0, CLI_CALLBACK = 1, CLI_LOGGER = 2 } cli_plugin_kind;

/* What constructors may read besides their config node. */
typedef struct cli_ctx {
    const char *run_dir;     /* the run folder (NULL while only checking the config) */
    FILE *log;               /* <run folder>/log.txt, or NULL */
    bool progress_bar;       /* a progress bar on stderr (loggers.progress_bar or progress_bar: true) */
    cm_time console_log_interval; /* plain progress lines (console logger); count 0 = none */
    int64_t total_batches;   /* batches the fit will run (0 = unknown) */
    bool quiet;
    /* for the callbacks of issue 21 */
    const char *run_root;                /* folders default to <run_root>/{run_name}/... */
    const struct cm_tokenizer *tokenizer; /* the data's (GPT configs), or NULL: for generate */
    cm_checkpoint_saver_config saver;    /* callbacks.checkpoint_saver, applied once the run name is known */
    bool has_saver;
    int64_t file_flush_interval;         /* loggers.file: the run's FileLogger (0 = its default) */
    bool file_log_traces;
    /* the run's model and tokenizer (hf_checkpointer), known when the plugins are made */
    cm_model *model;
    const cm_tokenizer *tok;
    int64_t model_max_length; /* the tokenizer's limit, -1 = the model's positions */
    bool full_shard;          /* parallelism.fsdp.sharding_strategy: FULL_SHARD or HYBRID_SHARD */
} cli_ctx;

typedef struct cli_plugin_out {
    cm_algorithm_plugin algorithm;
    cm_callback_plugin callback;
    cm_logger_plugin logger;
    bool none; /* the entry configured something built in and made no plugin */
} cli_plugin_out;

typedef struct cli_plugin_entry {
    const char *name; /* the key under algorithms:/callbacks:/loggers: */
    cli_plugin_kind kind;
    /* Reads its arguments under `path` (e.g. "algorithms.gradient_clipping") with the config
     * getters and fills the matching member of *out. */
    cm_status (*make)(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out);
    const char *help;
} cli_plugin_entry;

extern const cli_plugin_entry cli_plugin_registry[];

/* The optimizer section (cli_optim.c): the kind, its hyperparameters, and llm-foundry's
 * disable_grad and param_groups over parameter names (regular expressions, borrowed strings). */
typedef struct cli_param_group {
    const char *pattern; /* param_str_match */
    regex_t re;
    cm_optim_hparams hp; /* the optimizer's, with the group's keys over them */
    char key[64];        /* "optimizer.param_groups.0" */
} cli_param_group;
typedef struct cli_name_pattern {
    const char *pattern;
    regex_t re;
    char key[96];        /* "optimizer.disable_grad.1" */
} cli_name_pattern;
typedef struct cli_optim {
    cm_optim_kind kind;
    cm_optim_hparams hp;
    cli_param_group *groups;
    int n_groups;
    cli_name_pattern *disable;
    int n_disable;
} cli_optim;
/* Reads optimizer.* (errors name the key and its origin). */
cm_status cli_optim_read(cm_config *c, cli_optim *o);
/* The optimizer over this rank's parameters: the spans cm_dist_optim_spans gives with data
 * parallelism (whole units under NO_SHARD, this rank's pieces when sharded), else every wrap unit
 * of the model; group 0 is the optimizer's, group 1 + i is param_groups[i] (cm_optim_assign), and
 * disable_grad's parameters are frozen and excluded (cm_optim_exclude). Announces each pattern's
 * parameter count (and a pattern matching nothing) through cli_say. */
cm_status cli_optim_make(const cli_optim *o, cm_model *model, cm_dist *dp, const cli_ctx *ctx, cm_optim **out);
void cli_optim_free(cli_optim *o);

/* The data methods' constructors (cli_data_algos.c). */
cm_status cli_make_mixup(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out);
cm_status cli_make_cutmix(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out);
cm_status cli_make_cutout(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out);
cm_status cli_make_label_smoothing(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out);
cm_status cli_make_progressive_resizing(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out);
cm_status cli_make_seq_length_warmup(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out);
cm_status cli_make_selective_backprop(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out);
cm_status cli_make_colout(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out);
cm_status cli_make_randaugment(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out);
cm_status cli_make_augmix(cm_config *c, const char *path, cli_ctx *ctx, cli_plugin_out *out);
/* Makes the train image dataset's augmentation apply algorithms.randaugment or algorithms.augmix
 * (if configured): reads their arguments and sets aug->u8_transform. */
cm_status cli_image_u8_transform(cm_config *c, cm_image_augment *aug);

/* Looks `name` up among the entries of `kind`; an unknown name is CM_ERR_INVALID_ARG naming the
 * config origin, the closest entry and the available ones. */
const cli_plugin_entry *cli_plugin_find(cm_config *c, const char *section, const char *name, cli_plugin_kind kind);

/* profiler: {schedule: {skip_first, wait, warmup, active, repeat}, json_trace_handler: {folder,
 * filename, merged_trace_filename, overwrite, num_traces_to_keep}, sys_prof_cpu, sys_prof_memory,
 * sys_prof_disk, sys_prof_net, sys_prof_stats_thread_interval_seconds, record_ops,
 * summary_row_limit} (llm-foundry's build_profiler keys). *present false (and nothing made) when
 * the config has no profiler. The trace folder defaults to <run_root>/{run_name}/traces, the run
 * folder's; the op table goes to stdout on rank 0 (`summary`). */
cm_status cli_profiler_make(cm_config *c, const char *run_root, bool autoresume, bool summary, cm_callback_plugin *out,
                            bool *present);
/* Marks an entry without arguments ({} or null) as read; an entry with arguments is left to the
 * getters, so arguments nobody reads are reported as unknown keys. */
void cli_touch_entry(cm_config *c, const char *path);

/* Prints to stdout and to ctx->log (if any). */
void cli_say(const cli_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A config error at a key: sets "<origin>: <key>: <message>" (origin as cm_config_origin: file:line:col,
 * or the override) with status s, and returns s. */
cm_status cli_key_error(cm_config *c, const char *key, cm_status s, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
