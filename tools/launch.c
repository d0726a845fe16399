/* `composer -n N ...`: the launcher. It runs mpirun (OpenMPI) or mpiexec (MPICH) with the flags a
 * user would otherwise have to know (--allow-run-as-root as root, --oversubscribe beyond the
 * cores, --bind-to none so each rank's OpenMP threads may use every core) and starts every rank
 * through `composer --rank-exec`, which exports RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and
 * NODE_RANK, shares the node's cores among its ranks (CM_NUM_THREADS and OMP_NUM_THREADS, unless
 * set), redirects the rank's stdout/stderr when asked, and execs the program. */
#include "launch.h"

#include <composer/composer.h>
#include <composer/dist.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define EXIT_USAGE 2

static void launch_usage(FILE *f) {
    fprintf(f,
            "usage: composer -n N [--world_size W] [--node_rank R] [--master_addr A] [--master_port P]\n"
            "                [--stdout FMT] [--stderr FMT] PROGRAM|SUBCOMMAND [ARGS...]\n"
            "\n"
            "Starts N ranks of PROGRAM (a path or a command on PATH) or of `composer SUBCOMMAND` on this\n"
            "node through mpirun. FMT names a file per rank: {rank}, {local_rank}, {node_rank} and\n"
            "{world_size} are replaced (e.g. --stdout 'logs/rank{rank}.txt'). Ranks see RANK, WORLD_SIZE,\n"
            "LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR and MASTER_PORT.\n"
            "Threads: each rank gets CM_NUM_THREADS = OMP_NUM_THREADS = cores / N (at least 1) unless the\n"
            "environment sets them, so N ranks do not each start a thread per core.\n"
            "Several nodes: run it on node 0 with --world_size W (a multiple of N) and an MPI hostfile\n"
            "(OMPI_MCA_orte_default_hostfile, or mpirun's own configuration); mpirun starts the other\n"
            "nodes' ranks, so on nodes with --node_rank > 0 the launcher has nothing to do.\n"
            "Environment: CM_MPIRUN overrides the mpirun program; CM_LAUNCH_DRY_RUN=1 prints the\n"
            "command instead of running it. Without ssh or rsh on PATH (a container), a one-node job\n"
            "still starts: Open MPI is told not to look for them (OMPI_MCA_plm_rsh_agent=/bin/false).\n");
}

static int parse_int(const char *flag, const char *v, int min, int *out) {
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || end == v || *end || errno || x < min || x > 1000000) {
        fprintf(stderr, "composer: %s needs an integer >= %d, got '%s'\n", flag, min, v ? v : "(nothing)");
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* "openmpi", "mpich" or NULL when `mpirun --version` cannot be run. */
static const char *mpi_flavour(const char *mpirun) {
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof cmd, "'%s' --version 2>&1", mpirun);
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, p);
    buf[n] = '\0';
    int rc = pclose(p);
    if (strstr(buf, "Open MPI") || strstr(buf, "OpenRTE")) return "openmpi";
    if (strstr(buf, "HYDRA") || strstr(buf, "MPICH") || strstr(buf, "Intel(R) MPI")) return "mpich";
    return rc == 0 ? "openmpi" : NULL;
}

typedef struct argvec {
    char **v;
    int n, cap;
} argvec;

/* Whether an executable `name` is in a directory of PATH. */
static bool on_path(const char *name) {
    const char *path = getenv("PATH");
    if (!path || !*path) return false;
    char dir[PATH_MAX];
    while (*path) {
        const char *colon = strchr(path, ':');
        const size_t n = colon ? (size_t)(colon - path) : strlen(path);
        if (n > 0 && n + strlen(name) + 2 < sizeof dir) {
            snprintf(dir, sizeof dir, "%.*s/%s", (int)n, path, name);
            if (access(dir, X_OK) == 0) return true;
        }
        path += n + (colon ? 1 : 0);
    }
    return false;
}

static void push(argvec *a, const char *s) {
    if (a->n + 2 > a->cap) {
        a->cap = a->cap ? a->cap * 2 : 64;
        a->v = realloc(a->v, sizeof *a->v * (size_t)a->cap);
        if (!a->v) {
            fprintf(stderr, "composer: out of memory\n");
            exit(1);
        }
    }
    a->v[a->n++] = strdup(s);
    a->v[a->n] = NULL;
}

static void push_env(argvec *a, const char *flavour, const char *name, const char *value) {
    char kv[PATH_MAX + 64];
    if (!strcmp(flavour, "mpich")) {
        push(a, "-genv");
        push(a, name);
        push(a, value);
    } else {
        snprintf(kv, sizeof kv, "%s=%s", name, value);
        push(a, "-x");
        push(a, kv);
    }
}

/* ---- mpirun's banners ----
 * A composer subcommand prints its own error on every failing rank before it exits nonzero (a
 * config error once, from rank 0). OpenMPI's mpirun then adds two boxed banners ("Primary job
 * terminated normally, but 1 process returned a non-zero exit code..." and "mpirun detected that
 * one or more processes exited with non-zero status...") that say nothing more. The launcher runs
 * mpirun as a child with its stderr through a pipe and drops exactly those two boxes; every other
 * line (the ranks' stderr, which mpirun forwards, and its other boxes such as a rank killed by a
 * signal) passes through as it comes. */

static bool is_rule(const char *line, size_t n) {
    if (n > 0 && line[n - 1] == '\n') n--;
    if (n < 20) return false;
    for (size_t i = 0; i < n; i++)
        if (line[i] != '-') return false;
    return true;
}

static bool redundant_box(const char *box) {
    return strstr(box, "terminated normally, but") != NULL ||
           strstr(box, "exited with non-zero status, thus causing") != NULL;
}

typedef struct filter {
    char *line, *box; /* the current line; the box being collected (from its first rule) */
    size_t n, cap, nbox, capbox;
    bool in_box, midline; /* midline: the start of this line was passed through already */
} filter;

static void grow_to(char **p, size_t *cap, size_t need) {
    if (need <= *cap) return;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    char *q = realloc(*p, c);
    if (!q) {
        fprintf(stderr, "composer: out of memory\n");
        exit(1);
    }
    *p = q, *cap = c;
}

static void emit(const char *s, size_t n) {
    fwrite(s, 1, n, stderr);
    fflush(stderr);
}

/* One complete line (with its newline, unless at EOF). */
static void filter_line(filter *f, const char *s, size_t n) {
    if (f->midline) { /* the rest of a line already started on the terminal */
        emit(s, n);
        f->midline = false;
        return;
    }
    if (!f->in_box && is_rule(s, n)) f->in_box = true, f->nbox = 0;
    if (!f->in_box) {
        emit(s, n);
        return;
    }
    grow_to(&f->box, &f->capbox, f->nbox + n + 1);
    memcpy(f->box + f->nbox, s, n);
    f->nbox += n;
    f->box[f->nbox] = '\0';
    if (is_rule(s, n) && f->nbox > n) { /* the closing rule */
        if (!redundant_box(f->box)) emit(f->box, f->nbox);
        f->in_box = false, f->nbox = 0;
    }
}

static void filter_feed(filter *f, const char *s, size_t n) {
    grow_to(&f->line, &f->cap, f->n + n + 1);
    memcpy(f->line + f->n, s, n);
    f->n += n;
    size_t start = 0;
    for (size_t i = 0; i < f->n; i++)
        if (f->line[i] == '\n') {
            filter_line(f, f->line + start, i + 1 - start);
            start = i + 1;
        }
    memmove(f->line, f->line + start, f->n - start);
    f->n -= start;
    /* a partial line that cannot begin a box (a progress line drawn with \r) shows at once */
    if (f->n > 0 && !f->in_box && (f->midline || f->line[0] != '-')) {
        emit(f->line, f->n);
        f->n = 0;
        f->midline = true;
    }
}

static void filter_end(filter *f) {
    if (f->n) filter_line(f, f->line, f->n);
    if (f->in_box && f->nbox) emit(f->box, f->nbox); /* an unclosed box is shown as it is */
    free(f->line);
    free(f->box);
}

static volatile sig_atomic_t g_child;

static void forward_signal(int sig) {
    if (g_child > 0) kill((pid_t)g_child, sig);
}

/* Runs argv (mpirun) with its stderr filtered; returns its exit status the way a shell would. */
static int run_filtered(char **argv) {
    int fds[2];
    if (pipe(fds) != 0) {
        fprintf(stderr, "composer: pipe: %s\n", strerror(errno));
        return 1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "composer: fork: %s\n", strerror(errno));
        return 1;
    }
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], STDERR_FILENO);
        close(fds[1]);
        execvp(argv[0], argv);
        fprintf(stderr, "composer: cannot run '%s': %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    /* Ctrl-C reaches mpirun through the terminal's process group; a SIGTERM or SIGHUP sent to the
     * launcher alone is passed on, and the launcher stays to report mpirun's status */
    g_child = pid;
    struct sigaction fw, ign;
    memset(&fw, 0, sizeof fw);
    memset(&ign, 0, sizeof ign);
    fw.sa_handler = forward_signal;
    ign.sa_handler = SIG_IGN;
    sigaction(SIGTERM, &fw, NULL);
    sigaction(SIGHUP, &fw, NULL);
    sigaction(SIGINT, &ign, NULL);
    sigaction(SIGQUIT, &ign, NULL);
    filter f = {0};
    char buf[4096];
    for (;;) {
        ssize_t n = read(fds[0], buf, sizeof buf);
        if (n > 0) filter_feed(&f, buf, (size_t)n);
        else if (n == 0 || errno != EINTR) break;
    }
    filter_end(&f);
    close(fds[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return 1;
}

int cm_cli_launch(int argc, char **argv, bool (*is_subcommand)(const char *name)) {
    int n = 0, world = 0, node_rank = 0, port = 29500;
    const char *addr = "127.0.0.1", *out_fmt = NULL, *err_fmt = NULL;
    /* `composer -n --help` (the form the messages suggest) */
    if (argc >= 3 && (!strcmp(argv[2], "-h") || !strcmp(argv[2], "--help"))) {
        launch_usage(stdout);
        return 0;
    }
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--")) {
            i++;
            break;
        }
        if (a[0] != '-') break;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            launch_usage(stdout);
            return 0;
        }
        int rc = 0;
        if (!strcmp(a, "-n") || !strcmp(a, "--nproc")) rc = parse_int("-n", v, 1, &n);
        else if (!strcmp(a, "--world_size")) rc = parse_int(a, v, 1, &world);
        else if (!strcmp(a, "--node_rank")) rc = parse_int(a, v, 0, &node_rank);
        else if (!strcmp(a, "--master_port")) rc = parse_int(a, v, 1, &port);
        else if (!strcmp(a, "--master_addr")) addr = v;
        else if (!strcmp(a, "--stdout")) out_fmt = v;
        else if (!strcmp(a, "--stderr")) err_fmt = v;
        else {
            fprintf(stderr, "composer: unknown launcher flag '%s' (see composer -n --help)\n", a);
            return EXIT_USAGE;
        }
        if (rc) return EXIT_USAGE;
        if (!v) {
            fprintf(stderr, "composer: %s needs a value\n", a);
            return EXIT_USAGE;
        }
        i++;
    }
    if (n < 1) {
        fprintf(stderr, "composer: -n N (the number of ranks on this node) is required\n");
        return EXIT_USAGE;
    }
    if (i >= argc) {
        fprintf(stderr, "composer: -n %d: which program? (composer -n %d ./train ARGS, or a composer subcommand)\n",
                n, n);
        return EXIT_USAGE;
    }
    if (!world) world = n;
    if (world % n != 0) {
        fprintf(stderr, "composer: --world_size %d is not a multiple of -n %d (every node runs -n ranks)\n", world, n);
        return EXIT_USAGE;
    }
    if (node_rank >= world / n) {
        fprintf(stderr, "composer: --node_rank %d is out of range for %d nodes\n", node_rank, world / n);
        return EXIT_USAGE;
    }
    /* check the formats before starting anything */
    cm_dist_env probe = {0, world, 0, n, node_rank, "composer"};
    char tmp[PATH_MAX];
    const char *fmts[2] = {out_fmt, err_fmt};
    for (int k = 0; k < 2; k++)
        if (fmts[k] && cm_dist_format(fmts[k], &probe, tmp, sizeof tmp) != CM_OK) {
            fprintf(stderr, "composer: --%s: %s\n", k ? "stderr" : "stdout", cm_last_error());
            return EXIT_USAGE;
        }
    if (node_rank > 0) {
        printf("composer: node %d: mpirun on node 0 starts this node's %d ranks; nothing to do here\n", node_rank, n);
        return 0;
    }

    const char *mpirun = getenv("CM_MPIRUN");
    if (!mpirun || !*mpirun) mpirun = "mpirun";
    const char *flavour = mpi_flavour(mpirun);
    if (!flavour) {
        fprintf(stderr, "composer: cannot run '%s' (install OpenMPI: scripts/install-deps, or set CM_MPIRUN)\n",
                mpirun);
        return 1;
    }
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        fprintf(stderr, "composer: cannot find its own executable: %s\n", strerror(errno));
        return 1;
    }
    self[len] = '\0';

    argvec a = {0};
    push(&a, mpirun);
    char num[32];
    if (!strcmp(flavour, "openmpi")) {
        /* Open MPI 4's mpirun will not start even a one-node job when it finds neither ssh nor rsh
         * ("plm_rsh_agent: ssh : rsh ... could not be found"), which is every container without
         * an ssh client. A one-node job never uses them: tell it to take /bin/false (a remote
         * launch, which no one-node job makes, would then fail), unless the user chose an agent. */
        if (world == n && !on_path("ssh") && !on_path("rsh")) setenv("OMPI_MCA_plm_rsh_agent", "/bin/false", 0);
        if (geteuid() == 0) push(&a, "--allow-run-as-root");
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        if (cores < 1 || n > cores) push(&a, "--oversubscribe");
        push(&a, "--bind-to");
        push(&a, "none");
        if (world != n) {
            push(&a, "--npernode");
            snprintf(num, sizeof num, "%d", n);
            push(&a, num);
        }
        push(&a, "-np");
    } else {
        if (world != n) {
            push(&a, "-ppn");
            snprintf(num, sizeof num, "%d", n);
            push(&a, num);
        }
        push(&a, "-n");
    }
    snprintf(num, sizeof num, "%d", world);
    push(&a, num);
    push_env(&a, flavour, "MASTER_ADDR", addr);
    snprintf(num, sizeof num, "%d", port);
    push_env(&a, flavour, "MASTER_PORT", num);
    push(&a, self);
    push(&a, "--rank-exec");
    if (out_fmt) push(&a, "--stdout"), push(&a, out_fmt);
    if (err_fmt) push(&a, "--stderr"), push(&a, err_fmt);
    push(&a, "--");
    const bool run_subcommand = is_subcommand && strchr(argv[i], '/') == NULL && is_subcommand(argv[i]);
    if (run_subcommand) push(&a, self);
    for (; i < argc; i++) push(&a, argv[i]);

    const char *dry = getenv("CM_LAUNCH_DRY_RUN");
    if (dry && *dry && strcmp(dry, "0")) {
        for (int k = 0; k < a.n; k++) printf("%s%s", k ? " " : "", a.v[k]);
        printf("\n");
        return 0;
    }
    fflush(stdout);
    fflush(stderr);
    if (!run_subcommand || strcmp(flavour, "openmpi")) {
        execvp(a.v[0], a.v);
        fprintf(stderr, "composer: cannot run '%s': %s\n", a.v[0], strerror(errno));
        return 1;
    }
    return run_filtered(a.v);
}

static int redirect(const char *fmt, const cm_dist_env *env, int fd) {
    char path[PATH_MAX];
    if (cm_dist_format(fmt, env, path, sizeof path) != CM_OK) {
        fprintf(stderr, "composer: %s\n", cm_last_error());
        return -1;
    }
    int f = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f < 0) {
        fprintf(stderr, "composer: rank %d cannot open '%s' for its %s: %s\n", env->rank, path,
                fd == 1 ? "stdout" : "stderr", strerror(errno));
        return -1;
    }
    if (dup2(f, fd) < 0) {
        close(f);
        return -1;
    }
    close(f);
    return 0;
}

int cm_cli_rank_exec(int argc, char **argv) {
    const char *out_fmt = NULL, *err_fmt = NULL;
    int i = 1;
    for (; i < argc; i++) {
        if (!strcmp(argv[i], "--")) {
            i++;
            break;
        }
        if (i + 1 < argc && !strcmp(argv[i], "--stdout")) out_fmt = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--stderr")) err_fmt = argv[++i];
        else break;
    }
    if (i >= argc) {
        fprintf(stderr, "composer --rank-exec: no program to run\n");
        return EXIT_USAGE;
    }
    cm_dist_env e = cm_dist_env_get();
    char num[32];
#define SETI(name, v) (snprintf(num, sizeof num, "%d", (v)), setenv(name, num, 1))
    SETI("RANK", e.rank);
    SETI("WORLD_SIZE", e.world_size);
    SETI("LOCAL_RANK", e.local_rank);
    SETI("LOCAL_WORLD_SIZE", e.local_world_size);
    SETI("NODE_RANK", e.node_rank);
    /* N ranks with a thread per core each would run N× the cores' threads, and OpenMP's and MPI's
     * spinning waits then slow every step down by several times: split the cores instead */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const int per_rank = (int)(cores > 0 ? cores : 1) / (e.local_world_size > 0 ? e.local_world_size : 1);
    const char *cm_t = getenv("CM_NUM_THREADS"), *omp_t = getenv("OMP_NUM_THREADS");
    if (!cm_t || !*cm_t) SETI("CM_NUM_THREADS", per_rank > 0 ? per_rank : 1);
    if (!omp_t || !*omp_t) SETI("OMP_NUM_THREADS", per_rank > 0 ? per_rank : 1);
#undef SETI
    if (out_fmt && redirect(out_fmt, &e, 1)) return 1;
    if (err_fmt && redirect(err_fmt, &e, 2)) return 1;
    execvp(argv[i], argv + i);
    fprintf(stderr, "composer: rank %d cannot run '%s': %s\n", e.rank, argv[i], strerror(errno));
    return 127;
}
