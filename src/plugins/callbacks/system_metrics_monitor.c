/* SystemMetricsMonitor (Composer's): the machine's CPU, memory, disk and network at every batch
 * start, read from /proc (src/plugins/sysstat.c) and statvfs. */
#include <stdbool.h>

#include "cb_impl.h"
#include "plugins/sysstat_impl.h"

#include <sys/statvfs.h>

typedef struct sysmon {
    cm_system_metrics_monitor_config cfg;
    cmi_sysstat prev;
    bool have_prev;
    int64_t starts;
} sysmon;

cm_system_metrics_monitor_config cm_system_metrics_monitor_config_default(void) {
    return (cm_system_metrics_monitor_config){false, 1};
}

static cm_status sm_run_event(void *self, cm_event ev, const cm_state *st, cm_logger *lg) {
    sysmon *m = self;
    if (ev != CM_EVENT_BATCH_START && ev != CM_EVENT_EVAL_BATCH_START && ev != CM_EVENT_PREDICT_BATCH_START)
        return CM_OK;
    if (m->starts++ % m->cfg.interval) return CM_OK;
    cmi_sysstat now;
    cmi_sysstat_read(&now, true, true, false, true);
    cm_metric_value v[16];
    int k = 0;
    if (m->have_prev) {
        const double sys = cmi_sysstat_cpu_percent(&m->prev, &now), proc = cmi_sysstat_proc_percent(&m->prev, &now);
        if (sys >= 0) v[k++] = (cm_metric_value){"cpu_percentage", sys};
        if (proc >= 0) v[k++] = (cm_metric_value){"process_cpu_percentage", proc};
    }
    /* /proc/stat moves in clock ticks: keep the older reading until one has passed */
    if (!m->have_prev || now.sys_total > m->prev.sys_total) m->prev = now, m->have_prev = true;
    if (now.mem_total > 0 && now.mem_available >= 0) {
        v[k++] = (cm_metric_value){"cpu_memory_total", (double)now.mem_total};
        v[k++] = (cm_metric_value){"cpu_memory_available", (double)now.mem_available};
        v[k++] = (cm_metric_value){"cpu_memory_used", (double)(now.mem_total - now.mem_available)};
        v[k++] = (cm_metric_value){"cpu_memory_percent",
                                   100.0 * (double)(now.mem_total - now.mem_available) / (double)now.mem_total};
    }
    if (now.rss_bytes >= 0) v[k++] = (cm_metric_value){"process_rss_bytes", (double)now.rss_bytes};
    struct statvfs fs;
    if (statvfs("/", &fs) == 0 && fs.f_blocks > 0) {
        const double total = (double)fs.f_blocks * (double)fs.f_frsize, free_ = (double)fs.f_bavail * (double)fs.f_frsize;
        const double used = (double)(fs.f_blocks - fs.f_bfree) * (double)fs.f_frsize;
        v[k++] = (cm_metric_value){"disk_memory_total", total};
        v[k++] = (cm_metric_value){"disk_memory_used", used};
        v[k++] = (cm_metric_value){"disk_memory_free", free_};
        /* as psutil: used / (used + free for unprivileged users) */
        v[k++] = (cm_metric_value){"disk_memory_percent", used + free_ > 0 ? 100.0 * used / (used + free_) : 0.0};
    }
    double sent = 0, recv = 0;
    for (int i = 0; i < now.n_nics; i++) sent += (double)now.nics[i].a, recv += (double)now.nics[i].b;
    if (now.n_nics) {
        v[k++] = (cm_metric_value){"network_bytes_sent", sent};
        v[k++] = (cm_metric_value){"network_bytes_recv", recv};
    }
    return cm_logger_log_metrics(lg, v, k);
}

static void sm_free(void *self) { cm_free(self); }

static const cm_callback_i sysmon_vt = {
    .abi = CM_CALLBACK_ABI,
    .name = "SystemMetricsMonitor",
    .run_event = sm_run_event,
    .free = sm_free,
};

cm_status cm_system_metrics_monitor_new(const cm_system_metrics_monitor_config *cfg, cm_callback_plugin *out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_system_metrics_monitor_new: out is NULL");
    *out = (cm_callback_plugin){0};
    const cm_system_metrics_monitor_config c = cfg ? *cfg : cm_system_metrics_monitor_config_default();
    if (c.interval < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "SystemMetricsMonitor: interval %d must be >= 1 (batch starts)",
                            c.interval);
    sysmon *m = cm_alloc_zeroed(sizeof *m, 16);
    if (!m) return cm_set_error(CM_ERR_OOM, "SystemMetricsMonitor: out of memory");
    m->cfg = c;
    *out = (cm_callback_plugin){&sysmon_vt, m};
    return CM_OK;
}
