/* MemoryMonitor: the process's resident set and the tape arena's use (the CPU analogue of
 * Composer's MemoryMonitor, which reads torch.cuda.memory_stats). */
#include "cb_impl.h"

#include <stdio.h>
#include <sys/resource.h>
#include <unistd.h>

void cm_process_memory(int64_t *rss_bytes, int64_t *peak_rss_bytes) {
    if (rss_bytes) {
        *rss_bytes = 0;
        FILE *f = fopen("/proc/self/statm", "r");
        long long size, resident;
        if (f) {
            if (fscanf(f, "%lld %lld", &size, &resident) == 2) *rss_bytes = (int64_t)resident * sysconf(_SC_PAGESIZE);
            fclose(f);
        }
    }
    if (peak_rss_bytes) {
        struct rusage ru;
        /* Linux reports ru_maxrss in KiB. */
        *peak_rss_bytes = getrusage(RUSAGE_SELF, &ru) == 0 ? (int64_t)ru.ru_maxrss * 1024 : 0;
        if (rss_bytes && *rss_bytes > *peak_rss_bytes) *peak_rss_bytes = *rss_bytes;
    }
}

typedef struct {
    size_t batch_arena; /* the largest arena use seen at AFTER_BACKWARD in this batch */
} memory_monitor;

static cm_status mm_run_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    memory_monitor *m = self;
    cm_tape *tape = cm_state_tape(st);
    cm_arena *arena = tape ? cm_tape_arena(tape) : NULL;
    if (ev == CM_EVENT_BEFORE_TRAIN_BATCH) {
        m->batch_arena = 0;
    } else if (ev == CM_EVENT_AFTER_BACKWARD && arena) {
        /* The tape holds the whole microbatch here (it is rewound right after): its high-water mark. */
        const size_t used = cm_arena_used(arena);
        if (used > m->batch_arena) m->batch_arena = used;
    } else if (ev == CM_EVENT_AFTER_TRAIN_BATCH) {
        int64_t rss, peak;
        cm_process_memory(&rss, &peak);
        cm_metric_value v[10];
        int k = 0;
        v[k++] = (cm_metric_value){"memory/rss_bytes", (double)rss};
        v[k++] = (cm_metric_value){"memory/peak_rss_bytes", (double)peak};
        if (arena) {
            v[k++] = (cm_metric_value){"memory/arena_bytes", (double)m->batch_arena};
            v[k++] = (cm_metric_value){"memory/arena_peak_bytes", (double)cm_arena_peak(arena)};
            if (cm_arena_budget(arena) > 0)
                v[k++] = (cm_metric_value){"memory/arena_budget_bytes", (double)cm_arena_budget(arena)};
        }
        /* on a GPU, Composer's names from torch.cuda.memory_stats: the bytes in use as PyTorch
         * counts them (requests rounded to 512), held by the caching allocator, and the peak in use;
         * the allocator's blocks in use (up to twice a request: a cached block is reused for any
         * request of half its size); the tape's GPU arena */
        const cm_model *model = cm_state_model(st);
        const cm_device dev = model ? cm_module_device(cm_model_module((cm_model *)model)) : CM_DEVICE_CPU;
        cm_device_memory dm;
        if (dev != CM_DEVICE_CPU && cm_device_memory_stats(dev, &dm) == CM_OK) {
            const double gib = 1.0 / (double)(1u << 30);
            v[k++] = (cm_metric_value){"memory/allocated_mem", (double)dm.requested * gib};
            v[k++] = (cm_metric_value){"memory/reserved_mem", (double)dm.reserved * gib};
            v[k++] = (cm_metric_value){"memory/peak_allocated_mem", (double)dm.peak_requested * gib};
            v[k++] = (cm_metric_value){"memory/allocated_blocks_mem", (double)dm.allocated * gib};
            v[k++] = (cm_metric_value){"memory/peak_allocated_blocks_mem", (double)dm.peak * gib};
            cm_arena *da = tape ? cm_tape_device_arena(tape, dev) : NULL;
            if (da) v[k++] = (cm_metric_value){"memory/device_arena_peak_bytes", (double)cm_arena_peak(da)};
        }
        return cm_logger_log_metrics(lg, v, k);
    }
    return CM_OK;
}

static void mm_free(void *self) { cm_free(self); }

static const cm_callback_i memory_monitor_vt = {
    .abi = CM_CALLBACK_ABI,
    .name = "MemoryMonitor",
    .run_event = mm_run_event,
    .free = mm_free,
};

cm_status cm_memory_monitor_new(cm_callback_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_memory_monitor_new: out is NULL");
    memory_monitor *m = cm_alloc_zeroed(sizeof *m, 16);
    if (!m) return CM_ERR_OOM;
    *out = (cm_callback_plugin){&memory_monitor_vt, m};
    return CM_OK;
}
