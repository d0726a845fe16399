/* Levelled logging to stderr with an optional per-line prefix hook (rank, etc.). */
#include <composer/base.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int g_level = -1; /* -1: not read from CM_LOG yet */
static cm_log_prefix_fn g_prefix_fn;
static void *g_prefix_data;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const k_names[] = {"debug", "info", "warn", "error", "off"};

cm_status cm_log_level_parse(const char *s, cm_log_level *out) {
    for (int i = 0; i <= CM_LOG_OFF; i++) {
        if (s && strcasecmp(s, k_names[i]) == 0) {
            *out = (cm_log_level)i;
            return CM_OK;
        }
    }
    return cm_set_error(CM_ERR_INVALID_ARG, "log level '%s' is not known (use debug, info, warn, error or off)",
                        s ? s : "(null)");
}

cm_log_level cm_log_get_level(void) {
    int lv = __atomic_load_n(&g_level, __ATOMIC_ACQUIRE);
    if (lv < 0) {
        cm_log_level parsed = CM_LOG_INFO;
        const char *env = getenv("CM_LOG");
        if (env && *env && cm_log_level_parse(env, &parsed) != CM_OK) {
            fprintf(stderr, "[composer warn] CM_LOG='%s' is not a level (use debug, info, warn, error or off); using info\n",
                    env);
            parsed = CM_LOG_INFO;
        }
        lv = (int)parsed;
        __atomic_store_n(&g_level, lv, __ATOMIC_RELEASE);
    }
    return (cm_log_level)lv;
}

void cm_log_set_level(cm_log_level level) { __atomic_store_n(&g_level, (int)level, __ATOMIC_RELEASE); }

void cm_log_set_prefix(cm_log_prefix_fn fn, void *data) {
    pthread_mutex_lock(&g_lock);
    g_prefix_fn = fn;
    g_prefix_data = data;
    pthread_mutex_unlock(&g_lock);
}

void cm_log_msg(cm_log_level level, const char *fmt, ...) {
    if (level >= CM_LOG_OFF || level < cm_log_get_level()) return;
    char prefix[128] = "";
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&g_lock);
    if (g_prefix_fn) g_prefix_fn(prefix, sizeof prefix, g_prefix_data);
    fprintf(stderr, "[composer %s] %s%s\n", k_names[level], prefix, msg);
    pthread_mutex_unlock(&g_lock);
}
