/* JSON Lines metrics file: one object per log call, written with one fwrite and flushed, read back
 * with cJSON line by line (strict, except for a torn last line left by a crash). */
#include <composer/report.h>

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct cm_metrics_file {
    FILE *fp;
    char *path;
    char *line; /* reused line buffer */
    size_t cap;
};

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = cm_alloc(n, 16);
    if (d) memcpy(d, s, n);
    return d;
}

/* Cuts a partial last line (no trailing newline) off a file opened for appending. */
static cm_status trim_torn_tail(FILE *fp, const char *path) {
    if (fseeko(fp, 0, SEEK_END) != 0) return CM_OK; /* not seekable (a pipe): nothing to trim */
    off_t size = ftello(fp);
    if (size <= 0) return CM_OK;
    off_t pos = size;
    char chunk[4096];
    while (pos > 0) {
        off_t start = pos > (off_t)sizeof chunk ? pos - (off_t)sizeof chunk : 0;
        size_t len = (size_t)(pos - start);
        if (fseeko(fp, start, SEEK_SET) != 0 || fread(chunk, 1, len, fp) != len)
            return cm_set_error(CM_ERR_IO, "metrics file '%s': cannot read it to check its last line: %s", path,
                                strerror(errno));
        size_t i = len;
        while (i > 0 && chunk[i - 1] != '\n') i--;
        if (i > 0) {
            pos = start + (off_t)i;
            break;
        }
        pos = start;
        if (pos == 0) break;
    }
    if (pos == size) return CM_OK;
    cm_log_msg(CM_LOG_WARN, "metrics file '%s': dropping an incomplete last line (%lld bytes, from an interrupted run)",
               path, (long long)(size - pos));
    fflush(fp);
    if (ftruncate(fileno(fp), pos) != 0)
        return cm_set_error(CM_ERR_IO, "metrics file '%s': cannot cut its incomplete last line: %s", path,
                            strerror(errno));
    fseeko(fp, 0, SEEK_END);
    return CM_OK;
}

cm_status cm_metrics_file_open(const char *path, bool append, cm_metrics_file **out) {
    if (!path || !out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_metrics_file_open: path and out must not be NULL");
    *out = NULL;
    /* "a+" would force every write to the end but also forbid the truncation below; "r+" after
     * creating the file keeps both possible. */
    FILE *fp = NULL;
    if (append) {
        fp = fopen(path, "r+");
        if (!fp && errno == ENOENT) fp = fopen(path, "w+");
    } else {
        fp = fopen(path, "w+"); /* readable too: cm_metrics_file_cut reads back */
    }
    if (!fp)
        return cm_set_error(CM_ERR_IO, "metrics file '%s': cannot open it for writing: %s", path, strerror(errno));
    if (append) {
        cm_status st = trim_torn_tail(fp, path);
        if (st != CM_OK) {
            fclose(fp);
            return st;
        }
    }
    cm_metrics_file *f = cm_alloc_zeroed(sizeof *f, 16);
    char *p = dup_str(path);
    if (!f || !p) {
        fclose(fp);
        cm_free(f);
        cm_free(p);
        return CM_ERR_OOM;
    }
    f->fp = fp;
    f->path = p;
    *out = f;
    return CM_OK;
}

const char *cm_metrics_file_path(const cm_metrics_file *f) { return f ? f->path : NULL; }

int64_t cm_metrics_file_size(const cm_metrics_file *f) {
    if (!f) return cm_set_error(CM_ERR_INVALID_ARG, "cm_metrics_file_size: file is NULL"), -1;
    struct stat sb;
    if (fflush(f->fp) != 0 || fstat(fileno(f->fp), &sb) != 0) {
        cm_set_error(CM_ERR_IO, "metrics file '%s': cannot read its size: %s", f->path, strerror(errno));
        return -1;
    }
    return (int64_t)sb.st_size;
}

/* Whether byte `at` of the file starts a line (0, or the byte before it is a newline). */
static bool line_start(FILE *fp, int64_t at) {
    if (at == 0) return true;
    char c;
    return fseeko(fp, (off_t)(at - 1), SEEK_SET) == 0 && fread(&c, 1, 1, fp) == 1 && c == '\n';
}

cm_status cm_metrics_file_cut(cm_metrics_file *f, int64_t from, int64_t to) {
    if (!f) return cm_set_error(CM_ERR_INVALID_ARG, "cm_metrics_file_cut: file is NULL");
    const int64_t size = cm_metrics_file_size(f);
    if (size < 0) return cm_last_status();
    cm_status s = CM_OK;
    if (!(from >= 0 && from <= to && to <= size))
        return cm_set_error(CM_ERR_INVALID_ARG, "metrics file '%s': cannot cut bytes [%lld, %lld) from a file of %lld",
                            f->path, (long long)from, (long long)to, (long long)size);
    if (from == to) return CM_OK;
    if (!line_start(f->fp, from) || !line_start(f->fp, to)) {
        s = cm_set_error(CM_ERR_INVALID_ARG, "metrics file '%s': bytes %lld and %lld are not both at the start of a "
                                             "line (the file is not the one the offsets came from?)",
                         f->path, (long long)from, (long long)to);
        goto end;
    }
    /* move the tail [to, size) down to `from`, then cut the file there */
    char buf[1 << 14];
    for (int64_t rd = to, wr = from; rd < size;) {
        const size_t n = (size_t)(size - rd < (int64_t)sizeof buf ? size - rd : (int64_t)sizeof buf);
        if (fseeko(f->fp, (off_t)rd, SEEK_SET) != 0 || fread(buf, 1, n, f->fp) != n ||
            fseeko(f->fp, (off_t)wr, SEEK_SET) != 0 || fwrite(buf, 1, n, f->fp) != n || fflush(f->fp) != 0) {
            s = cm_set_error(CM_ERR_IO, "metrics file '%s': moving its last lines failed: %s", f->path, strerror(errno));
            goto end;
        }
        rd += (int64_t)n, wr += (int64_t)n;
    }
    if (ftruncate(fileno(f->fp), (off_t)(size - (to - from))) != 0)
        s = cm_set_error(CM_ERR_IO, "metrics file '%s': cannot cut it: %s", f->path, strerror(errno));
end:
    fseeko(f->fp, 0, SEEK_END);
    return s;
}

/* Appends bytes to the line buffer, growing it. */
static bool put(cm_metrics_file *f, size_t *len, const char *s, size_t n) {
    if (*len + n + 1 > f->cap) {
        size_t cap = f->cap ? f->cap : 256;
        while (*len + n + 1 > cap) cap *= 2;
        char *nb = cm_alloc(cap, 16);
        if (!nb) return false;
        if (*len) memcpy(nb, f->line, *len);
        cm_free(f->line);
        f->line = nb;
        f->cap = cap;
    }
    memcpy(f->line + *len, s, n);
    *len += n;
    return true;
}

static bool put_json_string(cm_metrics_file *f, size_t *len, const char *s) {
    if (!put(f, len, "\"", 1)) return false;
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        char esc[8];
        const char *e = NULL;
        switch (*c) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        default:
            if (*c < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", *c);
                e = esc;
            }
        }
        if (e ? !put(f, len, e, strlen(e)) : !put(f, len, (const char *)c, 1)) return false;
    }
    return put(f, len, "\"", 1);
}

cm_status cm_metrics_file_write(cm_metrics_file *f, int64_t batch, int64_t epoch, const char *const *names,
                                const double *values, size_t n) {
    if (!f) return cm_set_error(CM_ERR_INVALID_ARG, "cm_metrics_file_write: file is NULL");
    if (n && (!names || !values))
        return cm_set_error(CM_ERR_INVALID_ARG, "metrics file '%s': %zu metrics but names or values is NULL", f->path,
                            n);
    for (size_t i = 0; i < n; i++) {
        if (!names[i] || !names[i][0])
            return cm_set_error(CM_ERR_INVALID_ARG, "metrics file '%s': metric %zu has no name", f->path, i);
        if (strcmp(names[i], "batch") == 0 || strcmp(names[i], "epoch") == 0)
            return cm_set_error(CM_ERR_INVALID_ARG,
                                "metrics file '%s': a metric may not be called '%s' (the line's own key)", f->path,
                                names[i]);
        for (size_t j = 0; j < i; j++)
            if (strcmp(names[i], names[j]) == 0)
                return cm_set_error(CM_ERR_INVALID_ARG, "metrics file '%s': metric '%s' given twice in one line",
                                    f->path, names[i]);
    }
    size_t len = 0;
    char num[64];
    int k = snprintf(num, sizeof num, "{\"batch\": %lld, \"epoch\": %lld", (long long)batch, (long long)epoch);
    bool ok = put(f, &len, num, (size_t)k);
    for (size_t i = 0; ok && i < n; i++) {
        ok = put(f, &len, ", ", 2) && put_json_string(f, &len, names[i]) && put(f, &len, ": ", 2);
        char v[40];
        int vl = cm_format_double_shortest(values[i], v, sizeof v);
        if (ok && isfinite(values[i])) ok = put(f, &len, v, (size_t)vl);
        else if (ok) ok = put(f, &len, "\"", 1) && put(f, &len, v, (size_t)vl) && put(f, &len, "\"", 1);
    }
    ok = ok && put(f, &len, "}\n", 2);
    if (!ok) return CM_ERR_OOM;
    if (fwrite(f->line, 1, len, f->fp) != len || fflush(f->fp) != 0)
        return cm_set_error(CM_ERR_IO, "metrics file '%s': write failed: %s", f->path, strerror(errno));
    return CM_OK;
}

cm_status cm_metrics_file_close(cm_metrics_file *f) {
    if (!f) return CM_OK;
    cm_status st = CM_OK;
    if (fclose(f->fp) != 0)
        st = cm_set_error(CM_ERR_IO, "metrics file '%s': closing failed: %s", f->path, strerror(errno));
    cm_free(f->line);
    cm_free(f->path);
    cm_free(f);
    return st;
}

/* ---- reading ------------------------------------------------------------------------------- */

static bool as_integer(const cJSON *it, int64_t *out) {
    if (!cJSON_IsNumber(it)) return false;
    double d = it->valuedouble;
    if (!(d == floor(d)) || fabs(d) > 9007199254740992.0) return false;
    *out = (int64_t)d;
    return true;
}

static bool blank(const char *s) {
    for (; *s; s++)
        if (*s != ' ' && *s != '\t' && *s != '\r' && *s != '\n') return false;
    return true;
}

/* Parses one line; on a format problem sets the error with "<path>:<line>: ..." and returns it. */
static cm_status read_line(const char *path, int64_t lineno, const char *text, cm_metrics_record_fn fn, void *data,
                           bool *parse_failed) {
    *parse_failed = false;
    const char *end = NULL;
    cJSON *obj = cJSON_ParseWithOpts(text, &end, true);
    if (!obj) {
        *parse_failed = true;
        size_t at = end ? (size_t)(end - text) : 0;
        return cm_set_error(CM_ERR_FORMAT, "%s:%lld: not valid JSON (near byte %zu of the line)", path,
                            (long long)lineno, at + 1);
    }
    cm_status st = CM_OK;
    int64_t batch = 0, epoch = 0;
    if (!cJSON_IsObject(obj)) {
        st = cm_set_error(CM_ERR_FORMAT, "%s:%lld: the line is not a JSON object", path, (long long)lineno);
        goto done;
    }
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(obj, "batch");
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(obj, "epoch");
    if (!b || !as_integer(b, &batch) || !e || !as_integer(e, &epoch)) {
        st = cm_set_error(CM_ERR_FORMAT, "%s:%lld: \"batch\" and \"epoch\" must be present and integers", path,
                          (long long)lineno);
        goto done;
    }
    for (const cJSON *it = obj->child; it; it = it->next) {
        for (const cJSON *prev = obj->child; prev != it; prev = prev->next) {
            if (strcmp(prev->string, it->string) == 0) {
                st = cm_set_error(CM_ERR_FORMAT, "%s:%lld: key \"%s\" appears twice", path, (long long)lineno,
                                  it->string);
                goto done;
            }
        }
    }
    for (const cJSON *it = obj->child; it; it = it->next) {
        if (strcmp(it->string, "batch") == 0 || strcmp(it->string, "epoch") == 0) continue;
        double v;
        if (cJSON_IsNumber(it)) v = it->valuedouble;
        else if (cJSON_IsNull(it)) v = NAN;
        else if (cJSON_IsString(it) && strcmp(it->valuestring, "NaN") == 0) v = NAN;
        else if (cJSON_IsString(it) && strcmp(it->valuestring, "Infinity") == 0) v = INFINITY;
        else if (cJSON_IsString(it) && strcmp(it->valuestring, "-Infinity") == 0) v = -INFINITY;
        else {
            st = cm_set_error(CM_ERR_FORMAT,
                              "%s:%lld: value of \"%s\" is not a number (nor null, \"NaN\", \"Infinity\" or "
                              "\"-Infinity\")",
                              path, (long long)lineno, it->string);
            goto done;
        }
        st = fn(data, lineno, batch, epoch, it->string, v);
        if (st != CM_OK) goto done;
    }
done:
    cJSON_Delete(obj);
    return st;
}

cm_status cm_metrics_file_read(const char *path, cm_metrics_record_fn fn, void *data) {
    if (!path || !fn) return cm_set_error(CM_ERR_INVALID_ARG, "cm_metrics_file_read: path and fn must not be NULL");
    FILE *fp = fopen(path, "r");
    if (!fp) return cm_set_error(CM_ERR_IO, "metrics file '%s': cannot open it: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int64_t lineno = 0;
    cm_status st = CM_OK;
    while ((got = getline(&line, &cap, fp)) >= 0) {
        lineno++;
        bool complete = got > 0 && line[got - 1] == '\n';
        if ((size_t)got != strlen(line)) {
            st = cm_set_error(CM_ERR_FORMAT, "%s:%lld: the line contains a NUL byte", path, (long long)lineno);
            break;
        }
        if (blank(line)) continue;
        bool parse_failed;
        st = read_line(path, lineno, line, fn, data, &parse_failed);
        if (st != CM_OK && parse_failed && !complete) {
            /* The writer ends every line with '\n': a last line without one that does not parse was
             * cut by a crash. */
            cm_log_msg(CM_LOG_WARN, "%s:%lld: ignoring an incomplete last line (an interrupted write)", path,
                       (long long)lineno);
            cm_clear_error();
            st = CM_OK;
        }
        if (st != CM_OK) break;
    }
    if (st == CM_OK && ferror(fp))
        st = cm_set_error(CM_ERR_IO, "metrics file '%s': read failed after line %lld: %s", path, (long long)lineno,
                          strerror(errno));
    free(line);
    fclose(fp);
    return st;
}
