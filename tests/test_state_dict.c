/* Module weights to and from safetensors by dotted name: round trip, strictness, shapes, ignore
 * patterns, renaming, buffers. */
#include "cmtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Sequential: 0 = Linear(4, 3), 1 = LayerNorm(3), 2 = BatchNorm2d(3) (buffers). */
static cm_module *make(uint64_t seed) {
    cm_rng rng = cm_rng_init(seed, 0);
    cm_module *seq, *lin, *ln, *bn;
    cr_assert_eq(cm_nn_sequential_new(&seq), CM_OK);
    cr_assert_eq(cm_nn_linear_new(4, 3, true, &rng, &lin), CM_OK);
    cr_assert_eq(cm_nn_layer_norm_new(3, 1e-5f, true, &ln), CM_OK);
    cm_nn_batch_norm_config bc = cm_nn_batch_norm_config_default();
    cr_assert_eq(cm_nn_batch_norm2d_new(3, &bc, &bn), CM_OK);
    cr_assert_eq(cm_nn_sequential_append(seq, lin), CM_OK);
    cr_assert_eq(cm_nn_sequential_append(seq, ln), CM_OK);
    cr_assert_eq(cm_nn_sequential_append(seq, bn), CM_OK);
    cr_assert_eq(cm_module_finalize(seq), CM_OK, "%s", cm_last_error());
    /* make the layer-norm weight and a running stat differ between seeds too */
    cm_tensor_fill(cm_module_find_param(seq, "1.weight"), (double)seed);
    cm_tensor_fill(cm_module_find_buffer(seq, "2.running_mean"), (double)seed + 0.5);
    return seq;
}

static void tmp_path(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "/tmp/cm_state_dict_%d_%s", (int)getpid(), name);
}

static void assert_same(cm_module *a, cm_module *b) {
    for (int64_t i = 0; i < cm_module_n_params(a); i++) {
        cm_param_info pa = cm_module_param_info(a, i), pb = cm_module_param_info(b, i);
        cr_assert_str_eq(pa.name, pb.name);
        cmt_assert_close(pa.name, pa.tensor, pb.tensor, 0, 0);
    }
    for (int64_t i = 0; i < cm_module_n_buffers(a); i++) {
        cm_buffer_info ba = cm_module_buffer_info(a, i), bb = cm_module_buffer_info(b, i);
        cmt_assert_close(ba.name, ba.tensor, bb.tensor, 0, 0);
    }
}

Test(state_dict, save_then_load_restores_params_and_buffers_exactly) {
    char path[256];
    tmp_path(path, sizeof path, "rt.safetensors");
    cm_module *a = make(1), *b = make(2);
    cr_assert_eq(cm_module_save_safetensors(a, path), CM_OK, "%s", cm_last_error());
    cm_load_report rep;
    cr_assert_eq(cm_module_load_safetensors(b, path, NULL, &rep), CM_OK, "%s", cm_last_error());
    cr_assert_eq(rep.n_loaded, cm_module_n_params(a) + cm_module_n_buffers(a));
    cr_assert_eq(rep.n_missing + rep.n_unexpected, 0);
    assert_same(a, b);
    /* the file is a plain safetensors file with the dotted names */
    cm_safetensors *st;
    cr_assert_eq(cm_safetensors_open(path, &st), CM_OK);
    cr_assert_not_null(cm_safetensors_find(st, "0.weight"));
    cr_assert_not_null(cm_safetensors_find(st, "2.running_var"));
    cr_assert_str_eq(cm_safetensors_metadata_get(st, "format"), "pt");
    cm_safetensors_close(st);
    unlink(path);
    cm_module_free(a);
    cm_module_free(b);
}

Test(state_dict, strict_load_lists_missing_and_unexpected_names_and_changes_nothing) {
    char path[256];
    tmp_path(path, sizeof path, "strict.safetensors");
    /* a file with one model tensor renamed and one extra tensor */
    cm_module *a = make(1), *b = make(2);
    cm_safetensors_writer *w;
    cr_assert_eq(cm_safetensors_writer_new(&w), CM_OK);
    for (int64_t i = 0; i < cm_module_n_params(a); i++) {
        cm_param_info p = cm_module_param_info(a, i);
        cm_safetensors_writer_add(w, strcmp(p.name, "1.bias") == 0 ? "model.1.bias" : p.name, p.tensor);
    }
    for (int64_t i = 0; i < cm_module_n_buffers(a); i++) {
        cm_buffer_info bi = cm_module_buffer_info(a, i);
        cm_safetensors_writer_add(w, bi.name, bi.tensor);
    }
    cr_assert_eq(cm_safetensors_writer_write(w, path), CM_OK, "%s", cm_last_error());
    cm_safetensors_writer_free(w);

    cm_load_report rep;
    cr_assert_eq(cm_module_load_safetensors(b, path, NULL, &rep), CM_ERR_NOT_FOUND);
    cr_assert(strstr(cm_last_error(), "Missing: [1.bias]") && strstr(cm_last_error(), "Unexpected: [model.1.bias]"),
              "%s", cm_last_error());
    cr_assert_eq(cm_tensor_get_flat(cm_module_find_param(b, "1.weight"), 0), 2.0, "a failed load changes nothing");

    /* non-strict loads the rest and reports */
    cm_load_opts o = cm_load_opts_default();
    o.strict = false;
    cr_assert_eq(cm_module_load_safetensors(b, path, &o, &rep), CM_OK, "%s", cm_last_error());
    cr_assert_eq(rep.n_missing, 1);
    cr_assert_eq(rep.n_unexpected, 1);
    cr_assert_eq(cm_tensor_get_flat(cm_module_find_param(b, "1.weight"), 0), 1.0);

    /* ignore patterns on both sides make a strict load pass */
    const char *ign[2] = {"model.*", "1.bias"};
    o = cm_load_opts_default();
    o.ignore = ign;
    o.n_ignore = 2;
    cr_assert_eq(cm_module_load_safetensors(b, path, &o, &rep), CM_OK, "%s", cm_last_error());
    unlink(path);
    cm_module_free(a);
    cm_module_free(b);
}

static bool strip_model(const char *name, char *buf, size_t cap, void *data) {
    (void)data;
    if (strncmp(name, "model.", 6) != 0) return false;
    snprintf(buf, cap, "%s", name + 6);
    return true;
}

Test(state_dict, rename_hook_maps_file_names) {
    char path[256];
    tmp_path(path, sizeof path, "rename.safetensors");
    cm_module *a = make(3), *b = make(4);
    cm_safetensors_writer *w;
    cr_assert_eq(cm_safetensors_writer_new(&w), CM_OK);
    char names[32][64];
    int k = 0;
    for (int64_t i = 0; i < cm_module_n_params(a); i++, k++) {
        cm_param_info p = cm_module_param_info(a, i);
        snprintf(names[k], sizeof names[k], "model.%s", p.name);
        cm_safetensors_writer_add(w, names[k], p.tensor);
    }
    for (int64_t i = 0; i < cm_module_n_buffers(a); i++, k++) {
        cm_buffer_info bi = cm_module_buffer_info(a, i);
        snprintf(names[k], sizeof names[k], "model.%s", bi.name);
        cm_safetensors_writer_add(w, names[k], bi.tensor);
    }
    cr_assert_eq(cm_safetensors_writer_write(w, path), CM_OK);
    cm_safetensors_writer_free(w);
    cm_load_opts o = cm_load_opts_default();
    o.rename = strip_model;
    cr_assert_eq(cm_module_load_safetensors(b, path, &o, NULL), CM_OK, "%s", cm_last_error());
    assert_same(a, b);
    unlink(path);
    cm_module_free(a);
    cm_module_free(b);
}

Test(state_dict, shape_mismatch_names_the_tensor_and_both_shapes) {
    char path[256];
    tmp_path(path, sizeof path, "shape.safetensors");
    cm_module *a = make(1);
    cm_rng rng = cm_rng_init(0, 0);
    cm_module *other, *lin;
    cr_assert_eq(cm_nn_sequential_new(&other), CM_OK);
    cr_assert_eq(cm_nn_linear_new(5, 3, true, &rng, &lin), CM_OK);
    cr_assert_eq(cm_nn_sequential_append(other, lin), CM_OK);
    cr_assert_eq(cm_module_finalize(other), CM_OK);
    cr_assert_eq(cm_module_save_safetensors(other, path), CM_OK);
    cm_load_opts o = cm_load_opts_default();
    o.strict = false;
    cr_assert_eq(cm_module_load_safetensors(a, path, &o, NULL), CM_ERR_SHAPE);
    cr_assert(strstr(cm_last_error(), "0.weight") && strstr(cm_last_error(), "(3, 5)") &&
                  strstr(cm_last_error(), "(3, 4)"),
              "%s", cm_last_error());
    /* errors for a missing file and an unfinalized module */
    cr_assert_eq(cm_module_load_safetensors(a, "/nonexistent/x.safetensors", NULL, NULL), CM_ERR_IO);
    cm_module *raw;
    cr_assert_eq(cm_nn_linear_new(2, 2, true, &rng, &raw), CM_OK);
    cr_assert_eq(cm_module_save_safetensors(raw, path), CM_ERR_STATE);
    cr_assert(strstr(cm_last_error(), "finalize"), "%s", cm_last_error());
    unlink(path);
    cm_module_free(raw);
    cm_module_free(a);
    cm_module_free(other);
}
