/* Private pieces of the profiler (composer/profiler.h): the op statistics and path formatting the
 * profiler and the JSONTraceHandler share. */
#ifndef CM_PROFILER_IMPL_H
#define CM_PROFILER_IMPL_H

#include <composer/profiler.h>

/* ---- op statistics (op_stats.c) ---- */

typedef struct cmi_op_stats {
    cm_op_stat *v; /* names owned */
    int n, cap;
    int *slots; /* open-addressing hash of names -> index + 1 (cap_slots, a power of two) */
    int cap_slots;
    const cm_op_stat **sorted; /* by self time, rebuilt on demand */
    bool dirty;
} cmi_op_stats;

/* Adds one call of `name`. CM_ERR_OOM (the stats unchanged). */
cm_status cmi_op_stats_add(cmi_op_stats *s, const char *name, int64_t total_ns, int64_t self_ns, double flops);
void cmi_op_stats_free(cmi_op_stats *s);
int cmi_op_stats_n(cmi_op_stats *s);
const cm_op_stat *cmi_op_stats_at(cmi_op_stats *s, int i); /* by self time */
size_t cmi_op_stats_table(cmi_op_stats *s, int row_limit, char *buf, size_t cap);

/* ---- paths (json_trace.c) ---- */

/* Expands {run_name}, {rank}, {world_size} and, with ts, {epoch}, {batch}, {sample}, {token}.
 * CM_ERR_INVALID_ARG naming the pattern for an unknown placeholder, an unclosed brace or a result
 * longer than cap. */
cm_status cmi_trace_format(const char *pattern, const char *run_name, int rank, int world_size,
                           const cm_timestamp *ts, char *out, size_t cap);

#endif
