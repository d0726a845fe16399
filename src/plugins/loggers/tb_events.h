/* TensorBoard event files (../shared/FORMATS.md §6): TFRecord framing with masked CRC-32C around
 * Event protocol buffers written by hand — the file_version header, scalars (simple_value), text
 * (the text plugin's DT_STRING tensor, as torch's add_text writes it) and histograms
 * (HistogramProto with TensorFlow's default bucket limits, empty runs merged as TF's C++ writer
 * does). Private to the loggers; tests include it to write the byte-exact reference vector. */
#ifndef CM_LOGGERS_TB_EVENTS_H
#define CM_LOGGERS_TB_EVENTS_H

#include <composer/base.h>

#include <stdint.h>
#include <stdio.h>

typedef struct cmi_tb_writer cmi_tb_writer;

/* Creates (truncates) `path` and writes the file_version record
 * Event{wall_time, file_version: "brain.Event:2"}. Errors: CM_ERR_IO naming the path, CM_ERR_OOM. */
cm_status cmi_tb_open(const char *path, double wall_time, cmi_tb_writer **out);
/* Closes (flushing) and frees; returns a write error not reported before. NULL is a no-op. */
cm_status cmi_tb_close(cmi_tb_writer *w);
cm_status cmi_tb_flush(cmi_tb_writer *w);
const char *cmi_tb_path(const cmi_tb_writer *w);

/* Event{wall_time, step, summary{value{tag, simple_value}}}. */
cm_status cmi_tb_scalar(cmi_tb_writer *w, const char *tag, float value, int64_t step, double wall_time);
/* torch's add_text: Value{tag: "<tag>/text_summary", metadata{plugin_data{plugin_name: "text"}},
 * tensor{dtype: DT_STRING, tensor_shape{dim{size: 1}}, string_val: [text]}}. */
cm_status cmi_tb_text(cmi_tb_writer *w, const char *tag, const char *text, int64_t step, double wall_time);

/* TensorFlow's default histogram bucket limits: -DBL_MAX, -1e20·…, …, -1e-12, 0, 1e-12, …,
 * (growing by 1.1), DBL_MAX. */
int cmi_tb_n_buckets(void);
const double *cmi_tb_bucket_limits(void);
/* The bucket a finite value falls in (TF's upper_bound: limits[i-1] <= v < limits[i]). */
int cmi_tb_bucket_of(double v);

/* A histogram over the default buckets (counts has cmi_tb_n_buckets() entries). */
typedef struct cmi_tb_histo {
    double min, max, num, sum, sum_squares;
    const double *counts;
} cmi_tb_histo;
/* Event{wall_time, step, summary{value{tag, histo{min, max, num, sum, sum_squares, bucket_limit,
 * bucket}}}} with runs of empty buckets merged into the next limit (TF's EncodeToProto). */
cm_status cmi_tb_histogram(cmi_tb_writer *w, const char *tag, const cmi_tb_histo *h, int64_t step, double wall_time);

#endif
