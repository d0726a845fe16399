/* The launcher (launch.c), called from the top of composer's main. */
#ifndef CM_TOOLS_LAUNCH_H
#define CM_TOOLS_LAUNCH_H

#include <stdbool.h>

/* `composer -n N [flags] PROGRAM|SUBCOMMAND [ARGS...]`: execs mpirun; returns only on error (the
 * exit status). is_subcommand says whether a bare word is one of composer's commands. */
int cm_cli_launch(int argc, char **argv, bool (*is_subcommand)(const char *name));
/* `composer --rank-exec [--stdout FMT] [--stderr FMT] -- PROGRAM [ARGS...]`: what mpirun starts
 * on each rank. Returns only on error. */
int cm_cli_rank_exec(int argc, char **argv);

#endif
