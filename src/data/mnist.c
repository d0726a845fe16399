/* MNIST from IDX files (gzip'd or not), decompressed into memory once at open. */
#include <composer/datasets.h>

#include <stdio.h>
#include <string.h>

#include "data/formats.h"
#include "data/image_impl.h"

#define MNIST_HW 28

typedef struct mnist_ds {
    cm_blob images, labels;
    const uint8_t *pix;  /* (N, 28, 28) */
    const uint8_t *lab;  /* (N,) */
    int64_t n;
    cm_mnist_config cfg;
    bool augment;
    float lut[256];
    cm_field_desc fields[2];
} mnist_ds;

cm_mnist_config cm_mnist_config_default(void) {
    return (cm_mnist_config){.raw_u8 = false, .mean = 0.1307f, .std = 0.3081f, .augment = {.crop_padding = 0, .hflip_p = 0.0f}};
}

static int64_t mn_len(void *self) { return ((mnist_ds *)self)->n; }
static int mn_n_fields(void *self) { return 2; }
static const cm_field_desc *mn_field(void *self, int i) { return &((mnist_ds *)self)->fields[i]; }

static cm_status mn_get(void *self, int64_t index, const cm_sample_ctx *ctx, void *const *out) {
    mnist_ds *d = self;
    const uint8_t *src = d->pix + index * MNIST_HW * MNIST_HW;
    uint8_t tmp[MNIST_HW * MNIST_HW];
    if (d->augment && ctx->training) {
        cm_status s = cm_image_augment_u8(&d->cfg.augment, ctx, index, 1, MNIST_HW, MNIST_HW, src, tmp, "mnist");
        if (s) return s;
        src = tmp;
    }
    if (d->cfg.raw_u8) {
        memcpy(out[0], src, MNIST_HW * MNIST_HW);
    } else {
        float *img = out[0];
        for (int i = 0; i < MNIST_HW * MNIST_HW; i++) img[i] = d->lut[src[i]];
    }
    *(int64_t *)out[1] = d->lab[index];
    return CM_OK;
}

static void mn_close(void *self) {
    mnist_ds *d = self;
    cm_blob_release(&d->images);
    cm_blob_release(&d->labels);
    cm_free(d);
}

static const cm_dataset_i k_mnist_vt = {
    .abi = CM_DATASET_ABI,
    .type_name = "mnist",
    .len = mn_len,
    .n_fields = mn_n_fields,
    .field = mn_field,
    .get = mn_get,
    .close = mn_close,
};

/* Reads dir/base.gz, or dir/base when the .gz does not exist; `path` receives the name used. */
static cm_status read_gz_or_plain(const char *dir, const char *base, char *path, size_t cap, cm_blob *out) {
    snprintf(path, cap, "%s/%s.gz", dir, base);
    cm_status st = cm_blob_read(path, out);
    if (st != CM_ERR_NOT_FOUND) return st;
    snprintf(path, cap, "%s/%s", dir, base);
    st = cm_blob_read(path, out);
    if (st == CM_ERR_NOT_FOUND)
        return cm_set_error(CM_ERR_NOT_FOUND, "mnist: neither '%s.gz' nor '%s' exists (download MNIST into '%s')", path,
                            path, dir);
    return st;
}

cm_status cm_dataset_mnist_new(const char *dir, cm_data_split split, const cm_mnist_config *cfg, cm_dataset **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_dataset_mnist_new: out is NULL");
    *out = NULL;
    if (!dir) return cm_set_error(CM_ERR_INVALID_ARG, "cm_dataset_mnist_new: dir is NULL");
    if (split != CM_SPLIT_TRAIN && split != CM_SPLIT_TEST)
        return cm_set_error(CM_ERR_INVALID_ARG, "mnist '%s': unknown split %d (use CM_SPLIT_TRAIN or CM_SPLIT_TEST)", dir,
                            (int)split);
    cm_mnist_config c = cfg ? *cfg : cm_mnist_config_default();
    if (!c.raw_u8 && !(c.std > 0.0f))
        return cm_set_error(CM_ERR_INVALID_ARG, "mnist '%s': std %g must be > 0", dir, (double)c.std);
    cm_status st = cm_image_augment_check(&c.augment, "mnist");
    if (st != CM_OK) return st;

    mnist_ds *d = cm_alloc_zeroed(sizeof *d, 64);
    if (!d) return cm_set_error(CM_ERR_OOM, "mnist '%s': out of memory", dir);
    const char *prefix = split == CM_SPLIT_TRAIN ? "train" : "t10k";
    char img_path[4096], lab_path[4096], base[64];
    cm_idx ii, li;
    snprintf(base, sizeof base, "%s-images-idx3-ubyte", prefix);
    st = read_gz_or_plain(dir, base, img_path, sizeof img_path, &d->images);
    if (st == CM_OK) st = cm_idx_parse(d->images.data, d->images.size, img_path, &ii);
    if (st == CM_OK && (ii.magic != 0x803 || ii.dims[1] != MNIST_HW || ii.dims[2] != MNIST_HW))
        st = cm_set_error(CM_ERR_FORMAT, "'%s': IDX magic 0x%08x with dims %u%s: expected MNIST images, magic "
                          "0x00000803 (u8, 3 dims) with dims N x 28 x 28", img_path, ii.magic, ii.dims[0],
                          ii.ndim == 3 ? "" : " (wrong number of dims)");
    if (st == CM_OK) {
        snprintf(base, sizeof base, "%s-labels-idx1-ubyte", prefix);
        st = read_gz_or_plain(dir, base, lab_path, sizeof lab_path, &d->labels);
    }
    if (st == CM_OK) st = cm_idx_parse(d->labels.data, d->labels.size, lab_path, &li);
    if (st == CM_OK && li.magic != 0x801)
        st = cm_set_error(CM_ERR_FORMAT, "'%s': IDX magic 0x%08x: expected MNIST labels, magic 0x00000801 (u8, 1 dim)",
                          lab_path, li.magic);
    if (st == CM_OK && li.dims[0] != ii.dims[0])
        st = cm_set_error(CM_ERR_FORMAT, "mnist: '%s' has %u images but '%s' has %u labels (files from different "
                          "splits or a corrupt download)", img_path, ii.dims[0], lab_path, li.dims[0]);
    if (st == CM_OK && ii.dims[0] == 0)
        st = cm_set_error(CM_ERR_FORMAT, "'%s': holds no images", img_path);
    if (st == CM_OK) {
        for (uint32_t i = 0; i < li.dims[0]; i++)
            if (li.data[i] > 9) {
                st = cm_set_error(CM_ERR_FORMAT, "'%s': label %u at index %u is outside 0..9 (corrupt file)", lab_path,
                                  li.data[i], i);
                break;
            }
    }
    if (st != CM_OK) {
        mn_close(d);
        return st;
    }
    d->pix = ii.data;
    d->lab = li.data;
    d->n = ii.dims[0];
    d->cfg = c;
    d->augment = cm_image_augment_enabled(&c.augment);
    if (!c.raw_u8) cm_image_make_lut(d->lut, c.mean, c.std);
    d->fields[0] = (cm_field_desc){.name = "image", .dtype = c.raw_u8 ? CM_DTYPE_U8 : CM_DTYPE_F32, .ndim = 3,
                                   .shape = {1, MNIST_HW, MNIST_HW}};
    d->fields[1] = (cm_field_desc){.name = "label", .dtype = CM_DTYPE_I64, .ndim = 0};
    st = cm_dataset_new(&k_mnist_vt, d, out);
    if (st != CM_OK) mn_close(d);
    return st;
}
