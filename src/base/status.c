/* Status codes and the thread-local last-error message. */
#include <composer/base.h>

#include <assert.h>
#include <stdio.h>
#include <string.h>

/* The list is dense: n entries take the values 0 .. -(n - 1). Every value in that range here, and
 * no two alike (the switches below would not compile), means a status added with a gap or a
 * reused value fails the build. */
#define CM_X_(name, value, desc) +1
enum { CM_STATUS_COUNT_ = 0 CM_STATUS_LIST(CM_X_) };
#undef CM_X_
#define CM_X_(name, value, desc) \
    static_assert(value <= 0 && value > -CM_STATUS_COUNT_, #name " is out of the dense range");
CM_STATUS_LIST(CM_X_)
#undef CM_X_

#ifndef CM_VERSION_STRING
#define CM_VERSION_STRING "0.0.0"
#endif

#define CM_ERROR_CAP 2048

static _Thread_local char g_msg[CM_ERROR_CAP];
static _Thread_local cm_status g_status = CM_OK;

const char *cm_status_name(cm_status s) {
    switch (s) {
#define CM_X_(name, value, desc) case name: return #name;
        CM_STATUS_LIST(CM_X_)
#undef CM_X_
    }
    return "CM_ERR_?";
}

const char *cm_status_str(cm_status s) {
    switch (s) {
#define CM_X_(name, value, desc) case name: return desc;
        CM_STATUS_LIST(CM_X_)
#undef CM_X_
    }
    return "unknown status";
}

const char *cm_last_error(void) { return g_msg; }

cm_status cm_last_status(void) { return g_status; }

cm_status cm_set_errorv(cm_status s, const char *fmt, va_list ap) {
    char tmp[CM_ERROR_CAP];
    vsnprintf(tmp, sizeof tmp, fmt, ap); /* tmp: the message may quote the previous one */
    memcpy(g_msg, tmp, sizeof tmp);
    g_status = s;
    return s;
}

cm_status cm_set_error(cm_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cm_set_errorv(s, fmt, ap);
    va_end(ap);
    return s;
}

void cm_clear_error(void) {
    g_msg[0] = '\0';
    g_status = CM_OK;
}

const char *cm_version(void) { return CM_VERSION_STRING; }
