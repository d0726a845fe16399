/* libFuzzer target: the safetensors header parser and validator (FORMATS.md §4.2), then every
 * accessor on an accepted file: tensor loads with dtype conversion, metadata, and a re-write of
 * the accepted tensors through the writer, whose output must itself be accepted. */
#include <composer/safetensors.h>

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cm_safetensors *st;
    if (cm_safetensors_open_memory(data, size, "fuzz", &st) != CM_OK) return 0;
    cm_safetensors_writer *w = NULL;
    if (cm_safetensors_writer_new(&w) != CM_OK) w = NULL;
    for (size_t i = 0; i < cm_safetensors_count(st); i++) {
        const cm_st_tensor *e = cm_safetensors_at(st, i);
        if (cm_safetensors_find(st, e->name) == NULL) abort(); /* every listed name must be found */
        cm_tensor *t = NULL;
        if (e->numel <= (1 << 16) && cm_safetensors_load(st, e->name, CM_DTYPE_F32, &t) == CM_OK) cm_tensor_free(t);
        if (w) cm_safetensors_writer_add_raw(w, e->name, e->dtype, e->ndim, e->shape, e->data, e->nbytes);
    }
    for (size_t i = 0; i < cm_safetensors_metadata_count(st); i++) {
        const char *k, *v;
        if (cm_safetensors_metadata_at(st, i, &k, &v) == CM_OK && w) cm_safetensors_writer_add_metadata(w, k, v);
    }
    void *buf = NULL;
    size_t len = 0;
    if (w && cm_safetensors_writer_serialize(w, &buf, &len) == CM_OK) {
        cm_safetensors *again;
        if (cm_safetensors_open_memory(buf, len, "rewrite", &again) != CM_OK) abort(); /* writer output is valid */
        if (cm_safetensors_count(again) != cm_safetensors_count(st)) abort();
        cm_safetensors_close(again);
        cm_free(buf);
    }
    cm_safetensors_writer_free(w);
    cm_safetensors_close(st);
    return 0;
}
