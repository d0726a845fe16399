/* /proc readers for the system counters (sysstat_impl.h). */
#include <stdbool.h>

#include "plugins/sysstat_impl.h"

#include <composer/base.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void read_cpu(cmi_sysstat *s) {
    s->sys_busy = s->sys_total = -1;
    s->proc_cpu_s = -1;
    FILE *f = fopen("/proc/stat", "r");
    if (f) {
        long long v[10] = {0};
        if (fscanf(f, "cpu %lld %lld %lld %lld %lld %lld %lld %lld", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
                   &v[7]) == 8) {
            long long total = 0;
            for (int i = 0; i < 8; i++) total += v[i];
            s->sys_total = total;
            s->sys_busy = total - v[3] - v[4]; /* idle, iowait */
        }
        fclose(f);
    }
    f = fopen("/proc/self/stat", "r");
    if (f) {
        char buf[1024];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = '\0';
        fclose(f);
        /* fields after the command name (which may hold spaces) start after the last ')' */
        const char *p = strrchr(buf, ')');
        unsigned long long ut = 0, stime = 0;
        if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &stime) == 2) {
            const long hz = sysconf(_SC_CLK_TCK);
            s->proc_cpu_s = (double)(ut + stime) / (double)(hz > 0 ? hz : 100);
        }
    }
}

static void read_memory(cmi_sysstat *s) {
    s->rss_bytes = s->mem_total = s->mem_available = -1;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        long long size, rss;
        if (fscanf(f, "%lld %lld", &size, &rss) == 2) s->rss_bytes = rss * (int64_t)sysconf(_SC_PAGESIZE);
        fclose(f);
    }
    f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f)) {
            long long kb;
            if (sscanf(line, "MemTotal: %lld kB", &kb) == 1) s->mem_total = kb * 1024;
            else if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) s->mem_available = kb * 1024;
        }
        fclose(f);
    }
}

/* Whole disks: not loop/ram devices, and not a partition of a listed disk (sda1 after sda). */
static bool is_partition(const cmi_sysstat *s, const char *name) {
    for (int i = 0; i < s->n_disks; i++) {
        const size_t n = strlen(s->disks[i].name);
        if (!strncmp(name, s->disks[i].name, n) && name[n]) return true;
    }
    return false;
}

static void read_disk(cmi_sysstat *s) {
    s->io_read_bytes = s->io_write_bytes = -1;
    s->n_disks = 0;
    FILE *f = fopen("/proc/self/io", "r");
    if (f) {
        char line[128];
        while (fgets(line, sizeof line, f)) {
            long long v;
            if (sscanf(line, "read_bytes: %lld", &v) == 1) s->io_read_bytes = v;
            else if (sscanf(line, "write_bytes: %lld", &v) == 1) s->io_write_bytes = v;
        }
        fclose(f);
    }
    f = fopen("/proc/diskstats", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f) && s->n_disks < CMI_SYSSTAT_MAX_DEV) {
        char name[64];
        unsigned long long rd, rd_sect, wr, wr_sect;
        if (sscanf(line, "%*u %*u %63s %llu %*u %llu %*u %llu %*u %llu", name, &rd, &rd_sect, &wr, &wr_sect) != 5)
            continue;
        if (!strncmp(name, "loop", 4) || !strncmp(name, "ram", 3) || rd + wr == 0 || is_partition(s, name)) continue;
        cmi_sysstat_dev *d = &s->disks[s->n_disks++];
        snprintf(d->name, sizeof d->name, "%.31s", name);
        d->a = (int64_t)rd_sect * 512, d->b = (int64_t)wr_sect * 512;
    }
    fclose(f);
}

static void read_net(cmi_sysstat *s) {
    s->n_nics = 0;
    FILE *f = fopen("/proc/net/dev", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f) && s->n_nics < CMI_SYSSTAT_MAX_DEV) {
        char *colon = strchr(line, ':');
        if (!colon) continue; /* the two header lines */
        *colon = '\0';
        const char *name = line;
        while (*name == ' ') name++;
        unsigned long long rx, tx;
        if (sscanf(colon + 1, "%llu %*u %*u %*u %*u %*u %*u %*u %llu", &rx, &tx) != 2) continue;
        cmi_sysstat_dev *d = &s->nics[s->n_nics++];
        snprintf(d->name, sizeof d->name, "%.31s", name);
        d->a = (int64_t)tx, d->b = (int64_t)rx;
    }
    fclose(f);
}

void cmi_sysstat_read(cmi_sysstat *s, bool cpu, bool memory, bool disk, bool net) {
    memset(s, 0, sizeof *s);
    s->t_s = cm_clock_s();
    if (cpu) read_cpu(s);
    if (memory) read_memory(s);
    if (disk) read_disk(s);
    if (net) read_net(s);
}

double cmi_sysstat_cpu_percent(const cmi_sysstat *a, const cmi_sysstat *b) {
    if (a->sys_total < 0 || b->sys_total <= a->sys_total) return -1;
    return 100.0 * (double)(b->sys_busy - a->sys_busy) / (double)(b->sys_total - a->sys_total);
}

double cmi_sysstat_proc_percent(const cmi_sysstat *a, const cmi_sysstat *b) {
    if (a->proc_cpu_s < 0 || b->proc_cpu_s < 0 || !(b->t_s > a->t_s)) return -1;
    return 100.0 * (b->proc_cpu_s - a->proc_cpu_s) / (b->t_s - a->t_s);
}
