/* System counters read from /proc, shared by the profiler's sampling thread and the
 * SystemMetricsMonitor callback. Linux only; a file that cannot be read leaves its fields at -1. */
#ifndef CM_SYSSTAT_IMPL_H
#define CM_SYSSTAT_IMPL_H

#include <stdint.h>

#define CMI_SYSSTAT_MAX_DEV 16

typedef struct cmi_sysstat_dev {
    char name[32];
    int64_t a, b; /* disks: read and written bytes; NICs: bytes sent and received */
} cmi_sysstat_dev;

typedef struct cmi_sysstat {
    double t_s;                     /* monotonic seconds when read */
    double proc_cpu_s;              /* this process's user + system CPU seconds (-1: unknown) */
    int64_t sys_busy, sys_total;    /* /proc/stat jiffies of all CPUs (busy = total - idle - iowait) */
    int64_t rss_bytes;              /* resident set */
    int64_t mem_total, mem_available; /* /proc/meminfo, bytes */
    int64_t io_read_bytes, io_write_bytes; /* this process's storage I/O (/proc/self/io) */
    cmi_sysstat_dev disks[CMI_SYSSTAT_MAX_DEV]; /* whole disks with any I/O (no loop/ram devices) */
    int n_disks;
    cmi_sysstat_dev nics[CMI_SYSSTAT_MAX_DEV];
    int n_nics;
} cmi_sysstat;

/* Reads the counters now (only the groups asked for). */
void cmi_sysstat_read(cmi_sysstat *s, bool cpu, bool memory, bool disk, bool net);

/* Percentages between two readings: the machine's busy CPU share (0..100) and this process's CPU
 * use (100 = one core busy). -1 when unknown. */
double cmi_sysstat_cpu_percent(const cmi_sysstat *a, const cmi_sysstat *b);
double cmi_sysstat_proc_percent(const cmi_sysstat *a, const cmi_sysstat *b);

#endif
