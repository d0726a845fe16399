/* TensorBoard event files: TFRecords of hand-encoded Event protos (FORMATS.md §6). */
#include "tb_events.h"

#include "loggers_impl.h"
#include "wire.h"

#include <errno.h>
#include <float.h>
#include <pthread.h>
#include <string.h>

struct cmi_tb_writer {
    FILE *f;
    char *path;
    cmi_buf ev, rec; /* the Event being built; its framed record */
};

/* Event field numbers (tensorboard/compat/proto/event.proto, summary.proto, tensor.proto) */
enum { EV_WALL_TIME = 1, EV_STEP = 2, EV_FILE_VERSION = 3, EV_SUMMARY = 5 };
enum { SUM_VALUE = 1 };
enum { VAL_TAG = 1, VAL_SIMPLE = 2, VAL_HISTO = 5, VAL_TENSOR = 8, VAL_METADATA = 9 };
enum { META_PLUGIN_DATA = 1, PLUGIN_NAME = 1 };
enum { TENSOR_DTYPE = 1, TENSOR_SHAPE = 2, TENSOR_STRING_VAL = 8, SHAPE_DIM = 2, DIM_SIZE = 1, DT_STRING = 7 };
enum { HISTO_MIN = 1, HISTO_MAX, HISTO_NUM, HISTO_SUM, HISTO_SUM_SQUARES, HISTO_LIMITS, HISTO_BUCKETS };

/* Frames w->ev as one TFRecord and writes it. */
static cm_status write_event(cmi_tb_writer *w) {
    if (w->ev.oom) return cm_set_error(CM_ERR_OOM, "TensorBoard: no memory to encode an event for '%s'", w->path);
    cmi_buf *r = &w->rec;
    cmi_buf_reset(r);
    uint8_t head[12];
    const uint64_t len = w->ev.n;
    for (int i = 0; i < 8; i++) head[i] = (uint8_t)(len >> (8 * i));
    uint32_t c = cmi_crc32c_masked(head, 8);
    for (int i = 0; i < 4; i++) head[8 + i] = (uint8_t)(c >> (8 * i));
    cmi_buf_put(r, head, 12);
    cmi_buf_put(r, w->ev.p, w->ev.n);
    c = cmi_crc32c_masked(w->ev.p, w->ev.n);
    uint8_t tail[4] = {(uint8_t)c, (uint8_t)(c >> 8), (uint8_t)(c >> 16), (uint8_t)(c >> 24)};
    cmi_buf_put(r, tail, 4);
    if (r->oom) return cm_set_error(CM_ERR_OOM, "TensorBoard: no memory to frame an event for '%s'", w->path);
    if (fwrite(r->p, 1, r->n, w->f) != r->n) {
        const int e = errno ? errno : EIO;
        return cm_set_error(CM_ERR_IO, "TensorBoard: writing '%s' failed: %s", w->path, strerror(e));
    }
    return CM_OK;
}

static void begin_event(cmi_tb_writer *w, double wall_time, int64_t step, bool with_step) {
    cmi_buf_reset(&w->ev);
    cmi_pb_double(&w->ev, EV_WALL_TIME, wall_time);
    if (with_step) cmi_pb_int64(&w->ev, EV_STEP, step); /* also when 0, as torch's writer does */
}

cm_status cmi_tb_open(const char *path, double wall_time, cmi_tb_writer **out) {
    *out = NULL;
    cmi_tb_writer *w = cm_alloc_zeroed(sizeof *w, 16);
    if (!w || !(w->path = cmi_strdup(path))) {
        cm_free(w);
        return cm_set_error(CM_ERR_OOM, "TensorBoard: out of memory opening '%s'", path);
    }
    w->f = fopen(path, "wb");
    if (!w->f) {
        cm_status s = cm_set_error(CM_ERR_IO, "TensorBoard: cannot create the event file '%s': %s", path, strerror(errno));
        cm_free(w->path), cm_free(w);
        return s;
    }
    begin_event(w, wall_time, 0, false);
    cmi_pb_string(&w->ev, EV_FILE_VERSION, "brain.Event:2");
    cm_status s = write_event(w);
    if (!s && fflush(w->f) != 0)
        s = cm_set_error(CM_ERR_IO, "TensorBoard: writing '%s' failed: %s", path, strerror(errno));
    if (s) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cm_last_error());
        fclose(w->f);
        cmi_buf_free(&w->ev), cmi_buf_free(&w->rec);
        cm_free(w->path), cm_free(w);
        return cm_set_error(s, "%s", msg);
    }
    *out = w;
    return CM_OK;
}

const char *cmi_tb_path(const cmi_tb_writer *w) { return w ? w->path : NULL; }

cm_status cmi_tb_flush(cmi_tb_writer *w) {
    if (fflush(w->f) != 0 || ferror(w->f)) {
        const int e = errno ? errno : EIO;
        clearerr(w->f);
        return cm_set_error(CM_ERR_IO, "TensorBoard: writing '%s' failed: %s", w->path, strerror(e));
    }
    return CM_OK;
}

cm_status cmi_tb_close(cmi_tb_writer *w) {
    if (!w) return CM_OK;
    cm_status s = CM_OK;
    errno = 0;
    const bool bad = fflush(w->f) != 0 || ferror(w->f);
    const int e = errno ? errno : EIO;
    if (fclose(w->f) != 0 || bad)
        s = cm_set_error(CM_ERR_IO, "TensorBoard: writing '%s' failed: %s", w->path, strerror(bad ? e : errno));
    cmi_buf_free(&w->ev), cmi_buf_free(&w->rec);
    cm_free(w->path);
    cm_free(w);
    return s;
}

cm_status cmi_tb_scalar(cmi_tb_writer *w, const char *tag, float value, int64_t step, double wall_time) {
    begin_event(w, wall_time, step, true);
    size_t sum = cmi_pb_begin(&w->ev, EV_SUMMARY);
    size_t val = cmi_pb_begin(&w->ev, SUM_VALUE);
    cmi_pb_string(&w->ev, VAL_TAG, tag);
    cmi_pb_float(&w->ev, VAL_SIMPLE, value);
    cmi_pb_end(&w->ev, val);
    cmi_pb_end(&w->ev, sum);
    return write_event(w);
}

cm_status cmi_tb_text(cmi_tb_writer *w, const char *tag, const char *text, int64_t step, double wall_time) {
    begin_event(w, wall_time, step, true);
    cmi_buf *b = &w->ev;
    size_t sum = cmi_pb_begin(b, EV_SUMMARY);
    size_t val = cmi_pb_begin(b, SUM_VALUE);
    cmi_pb_key(b, VAL_TAG, 2);
    const size_t tl = strlen(tag), sl = strlen("/text_summary");
    cmi_pb_varint(b, tl + sl);
    cmi_buf_put(b, tag, tl);
    cmi_buf_put(b, "/text_summary", sl);
    size_t ten = cmi_pb_begin(b, VAL_TENSOR);
    cmi_pb_int64(b, TENSOR_DTYPE, DT_STRING);
    size_t shape = cmi_pb_begin(b, TENSOR_SHAPE);
    size_t dim = cmi_pb_begin(b, SHAPE_DIM);
    cmi_pb_int64(b, DIM_SIZE, 1);
    cmi_pb_end(b, dim);
    cmi_pb_end(b, shape);
    cmi_pb_string(b, TENSOR_STRING_VAL, text);
    cmi_pb_end(b, ten);
    size_t meta = cmi_pb_begin(b, VAL_METADATA); /* fields in number order, as protobuf writes them */
    size_t pd = cmi_pb_begin(b, META_PLUGIN_DATA);
    cmi_pb_string(b, PLUGIN_NAME, "text");
    cmi_pb_end(b, pd);
    cmi_pb_end(b, meta);
    cmi_pb_end(b, val);
    cmi_pb_end(b, sum);
    return write_event(w);
}

/* ---- histograms ---- */

static double *g_limits;
static int g_n_limits;
static pthread_once_t g_limits_once = PTHREAD_ONCE_INIT;
static double g_limits_store[1600];

static void limits_init(void) {
    double pos[800];
    int k = 0;
    for (double v = 1e-12; v < 1e20; v *= 1.1) pos[k++] = v;
    int n = 0;
    g_limits_store[n++] = -DBL_MAX;
    for (int i = k - 1; i >= 0; i--) g_limits_store[n++] = -pos[i];
    g_limits_store[n++] = 0.0;
    for (int i = 0; i < k; i++) g_limits_store[n++] = pos[i];
    g_limits_store[n++] = DBL_MAX;
    g_limits = g_limits_store;
    g_n_limits = n;
}

int cmi_tb_n_buckets(void) {
    pthread_once(&g_limits_once, limits_init);
    return g_n_limits;
}

const double *cmi_tb_bucket_limits(void) {
    pthread_once(&g_limits_once, limits_init);
    return g_limits;
}

int cmi_tb_bucket_of(double v) {
    pthread_once(&g_limits_once, limits_init);
    int lo = 0, hi = g_n_limits; /* first index with limits[i] > v */
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (g_limits[mid] > v) hi = mid;
        else lo = mid + 1;
    }
    return lo < g_n_limits ? lo : g_n_limits - 1; /* DBL_MAX itself: the last bucket */
}

cm_status cmi_tb_histogram(cmi_tb_writer *w, const char *tag, const cmi_tb_histo *h, int64_t step, double wall_time) {
    const int nb = cmi_tb_n_buckets();
    const double *lim = cmi_tb_bucket_limits();
    begin_event(w, wall_time, step, true);
    cmi_buf *b = &w->ev;
    size_t sum = cmi_pb_begin(b, EV_SUMMARY);
    size_t val = cmi_pb_begin(b, SUM_VALUE);
    cmi_pb_string(b, VAL_TAG, tag);
    size_t hp = cmi_pb_begin(b, VAL_HISTO);
    const double fields[5] = {h->min, h->max, h->num, h->sum, h->sum_squares};
    for (int f = 0; f < 5; f++) {
        uint64_t bits;
        memcpy(&bits, &fields[f], 8);
        if (bits) cmi_pb_double(b, HISTO_MIN + f, fields[f]); /* proto3: a zero is left out */
    }
    /* TF's EncodeToProto: a bucket per non-empty one; a run of empty ones becomes one entry at
     * the run's last limit; at least one entry. Two passes: the limits, then the counts. */
    for (int pass = 0; pass < 2; pass++) {
        size_t m = cmi_pb_begin(b, pass == 0 ? HISTO_LIMITS : HISTO_BUCKETS);
        int n_out = 0;
        for (int i = 0; i < nb;) {
            double end = lim[i], count = h->counts[i];
            i++;
            if (count <= 0.0)
                while (i < nb && h->counts[i] <= 0.0) end = lim[i], count = h->counts[i], i++;
            double x = pass == 0 ? end : count;
            uint8_t t[8];
            uint64_t u;
            memcpy(&u, &x, 8);
            for (int k = 0; k < 8; k++) t[k] = (uint8_t)(u >> (8 * k));
            cmi_buf_put(b, t, 8);
            n_out++;
        }
        if (n_out == 0) { /* (only when there are no buckets at all) */
            double x = pass == 0 ? DBL_MAX : 0.0;
            uint64_t u;
            memcpy(&u, &x, 8);
            uint8_t t[8];
            for (int k = 0; k < 8; k++) t[k] = (uint8_t)(u >> (8 * k));
            cmi_buf_put(b, t, 8);
        }
        cmi_pb_end(b, m);
    }
    cmi_pb_end(b, hp);
    cmi_pb_end(b, val);
    cmi_pb_end(b, sum);
    return write_event(w);
}
