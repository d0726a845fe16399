/* CIFAR-10 binary batches: memory-mapped files of 3073-byte records (label, R, G, B planes). */
#include <composer/datasets.h>

#include <stdio.h>
#include <string.h>

#include "data/formats.h"
#include "data/image_impl.h"

#define CIFAR_HW 32
#define CIFAR_PIX (3 * CIFAR_HW * CIFAR_HW)
#define CIFAR_REC (1 + CIFAR_PIX)
#define CIFAR_MAX_FILES 5

typedef struct cifar_ds {
    int n_files;
    cm_blob files[CIFAR_MAX_FILES];
    char *paths[CIFAR_MAX_FILES];
    int64_t first[CIFAR_MAX_FILES + 1]; /* sample index where each file starts; first[n_files] = len */
    cm_cifar10_config cfg;
    bool augment;
    float lut[3][256];
    cm_field_desc fields[2];
} cifar_ds;

cm_cifar10_config cm_cifar10_config_default(void) {
    return (cm_cifar10_config){.raw_u8 = false,
                               .mean = {0.4914f, 0.4822f, 0.4465f},
                               .std = {0.2470f, 0.2435f, 0.2616f},
                               .augment = {.crop_padding = 0, .hflip_p = 0.0f}};
}

static int64_t cf_len(void *self) {
    cifar_ds *d = self;
    return d->first[d->n_files];
}
static int cf_n_fields(void *self) { return 2; }
static const cm_field_desc *cf_field(void *self, int i) { return &((cifar_ds *)self)->fields[i]; }

static cm_status cf_get(void *self, int64_t index, const cm_sample_ctx *ctx, void *const *out) {
    cifar_ds *d = self;
    int f = 0;
    while (index >= d->first[f + 1]) f++;
    int64_t rec = index - d->first[f];
    const uint8_t *r = d->files[f].data + rec * CIFAR_REC;
    if (r[0] > 9)
        return cm_set_error(CM_ERR_FORMAT, "'%s': record %lld (sample %lld) has label %u, outside 0..9 (corrupt file, "
                            "or CIFAR-100 data, whose records are 3074 bytes)", d->paths[f], (long long)rec,
                            (long long)index, r[0]);
    const uint8_t *src = r + 1;
    uint8_t tmp[CIFAR_PIX];
    if (d->augment && ctx->training) {
        cm_status s = cm_image_augment_u8(&d->cfg.augment, ctx, index, 3, CIFAR_HW, CIFAR_HW, src, tmp, "cifar10");
        if (s) return s;
        src = tmp;
    }
    if (d->cfg.raw_u8) {
        memcpy(out[0], src, CIFAR_PIX);
    } else {
        float *img = out[0];
        for (int c = 0; c < 3; c++) {
            const float *lut = d->lut[c];
            const uint8_t *s = src + c * CIFAR_HW * CIFAR_HW;
            float *o = img + c * CIFAR_HW * CIFAR_HW;
            for (int i = 0; i < CIFAR_HW * CIFAR_HW; i++) o[i] = lut[s[i]];
        }
    }
    *(int64_t *)out[1] = r[0];
    return CM_OK;
}

static void cf_close(void *self) {
    cifar_ds *d = self;
    for (int f = 0; f < CIFAR_MAX_FILES; f++) {
        cm_blob_release(&d->files[f]);
        cm_free(d->paths[f]);
    }
    cm_free(d);
}

static const cm_dataset_i k_cifar_vt = {
    .abi = CM_DATASET_ABI,
    .type_name = "cifar10",
    .len = cf_len,
    .n_fields = cf_n_fields,
    .field = cf_field,
    .get = cf_get,
    .close = cf_close,
};

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = cm_alloc(n, 16);
    if (p) memcpy(p, s, n);
    return p;
}

static bool file_exists(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    return f != NULL;
}

cm_status cm_dataset_cifar10_new(const char *dir, cm_data_split split, const cm_cifar10_config *cfg, cm_dataset **out) {
    if (!out) return cm_set_error(CM_ERR_INVALID_ARG, "cm_dataset_cifar10_new: out is NULL");
    *out = NULL;
    if (!dir) return cm_set_error(CM_ERR_INVALID_ARG, "cm_dataset_cifar10_new: dir is NULL");
    if (split != CM_SPLIT_TRAIN && split != CM_SPLIT_TEST)
        return cm_set_error(CM_ERR_INVALID_ARG, "cifar10 '%s': unknown split %d (use CM_SPLIT_TRAIN or CM_SPLIT_TEST)",
                            dir, (int)split);
    cm_cifar10_config c = cfg ? *cfg : cm_cifar10_config_default();
    if (!c.raw_u8)
        for (int k = 0; k < 3; k++)
            if (!(c.std[k] > 0.0f))
                return cm_set_error(CM_ERR_INVALID_ARG, "cifar10 '%s': std[%d] %g must be > 0", dir, k, (double)c.std[k]);
    cm_status st = cm_image_augment_check(&c.augment, "cifar10");
    if (st != CM_OK) return st;

    /* Accept the folder the official archive unpacks to as well as its parent. */
    char root[4096], path[4200];
    const char *first_name = split == CM_SPLIT_TRAIN ? "data_batch_1.bin" : "test_batch.bin";
    snprintf(root, sizeof root, "%s", dir);
    snprintf(path, sizeof path, "%s/%s", dir, first_name);
    if (!file_exists(path)) {
        char sub[4200];
        snprintf(sub, sizeof sub, "%s/cifar-10-batches-bin/%s", dir, first_name);
        if (file_exists(sub)) snprintf(root, sizeof root, "%s/cifar-10-batches-bin", dir);
    }

    cifar_ds *d = cm_alloc_zeroed(sizeof *d, 64);
    if (!d) return cm_set_error(CM_ERR_OOM, "cifar10 '%s': out of memory", dir);
    d->n_files = split == CM_SPLIT_TRAIN ? 5 : 1;
    for (int f = 0; f < d->n_files && st == CM_OK; f++) {
        if (split == CM_SPLIT_TRAIN)
            snprintf(path, sizeof path, "%s/data_batch_%d.bin", root, f + 1);
        else
            snprintf(path, sizeof path, "%s/test_batch.bin", root);
        d->paths[f] = dup_str(path);
        if (!d->paths[f]) {
            st = cm_set_error(CM_ERR_OOM, "cifar10 '%s': out of memory", path);
            break;
        }
        st = cm_blob_map(path, &d->files[f]);
        if (st == CM_ERR_NOT_FOUND)
            st = cm_set_error(CM_ERR_NOT_FOUND, "cifar10: '%s' does not exist (the binary version of CIFAR-10, "
                              "cifar-10-binary.tar.gz, unpacks data_batch_1..5.bin and test_batch.bin)", path);
        if (st != CM_OK) break;
        size_t sz = d->files[f].size;
        if (sz == 0)
            st = cm_set_error(CM_ERR_FORMAT, "'%s': the file is empty (expected records of %d bytes)", path, CIFAR_REC);
        else if (sz % CIFAR_REC != 0)
            st = cm_set_error(CM_ERR_FORMAT, "'%s': %zu bytes is not a whole number of %d-byte records (%zu records and "
                              "%zu bytes over: truncated or not CIFAR-10 binary)", path, sz, CIFAR_REC, sz / CIFAR_REC,
                              sz % CIFAR_REC);
        d->first[f + 1] = d->first[f] + (int64_t)(sz / CIFAR_REC);
    }
    if (st != CM_OK) {
        cf_close(d);
        return st;
    }
    d->cfg = c;
    d->augment = cm_image_augment_enabled(&c.augment);
    if (!c.raw_u8)
        for (int k = 0; k < 3; k++) cm_image_make_lut(d->lut[k], c.mean[k], c.std[k]);
    d->fields[0] = (cm_field_desc){.name = "image", .dtype = c.raw_u8 ? CM_DTYPE_U8 : CM_DTYPE_F32, .ndim = 3,
                                   .shape = {3, CIFAR_HW, CIFAR_HW}};
    d->fields[1] = (cm_field_desc){.name = "label", .dtype = CM_DTYPE_I64, .ndim = 0};
    st = cm_dataset_new(&k_cifar_vt, d, out);
    if (st != CM_OK) cf_close(d);
    return st;
}
