/* Thread count for OpenMP kernels and OpenBLAS. The OpenMP build of OpenBLAS shares the OpenMP
 * runtime, so a BLAS call from inside one of our parallel regions runs single-threaded instead of
 * oversubscribing the cores (bench/gemm measures this). */
#include <composer/base.h>

#include <omp.h>
#include <stdlib.h>
#include <unistd.h>

void openblas_set_num_threads(int num_threads);

static int g_threads; /* 0: not initialised */

static void init_threads(void) {
    int n = 0;
    const char *env = getenv("CM_NUM_THREADS");
    if (env && *env) {
        char *end = NULL;
        long v = strtol(env, &end, 10);
        if (end && *end == '\0' && v >= 1 && v <= 4096) {
            n = (int)v;
        } else {
            cm_log_msg(CM_LOG_WARN, "CM_NUM_THREADS='%s' is not a positive integer; using all cores", env);
        }
    }
    if (n == 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n = c > 0 ? (int)c : 1;
    }
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
    g_threads = n;
}

int cm_num_threads(void) {
    if (!g_threads) init_threads();
    return g_threads;
}

cm_status cm_set_num_threads(int n) {
    if (n < 1) return cm_set_error(CM_ERR_INVALID_ARG, "num_threads must be >= 1 (got %d)", n);
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
    g_threads = n;
    return CM_OK;
}
