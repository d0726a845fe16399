/* The Pillow operations of AugMix and RandAugment (cm_pil_*) against Debian's python3-pil
 * (tests/golden/gen_pil_ops.py -> tests/golden/pil_ops.safetensors), every pixel exactly, on RGB
 * and L images (including a flat image and equalize's clipped table); AugMix's mixing against
 * numpy; Composer's level sampling (the strength ranges of each operation); RandAugment and
 * AugMix keyed by (seed, epoch, index); the datasets' u8_transform hook; the plugins; errors. */
#include "cmdata.h"
#include "cmtest.h"

#include <composer/data_algos.h>
#include <composer/datasets.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define GOLDEN "tests/golden/pil_ops.safetensors"

static const char *const k_images[] = {"rgb", "rgbfull", "gray", "flat", "eqedge"};

/* Runs op on golden image `img` and compares with golden `img.key` exactly. */
typedef cm_status (*op_fn)(const uint8_t *in, int64_t C, int64_t H, int64_t W, const void *arg, uint8_t *out);

static void compare(cmt_golden *g, const char *img, const char *key, op_fn fn, const void *arg) {
    char k[96];
    snprintf(k, sizeof k, "%s.in", img);
    cm_tensor *x = cmt_golden_get(g, k);
    snprintf(k, sizeof k, "%s.%s", img, key);
    cm_tensor *want = cmt_golden_get(g, k);
    const int64_t C = cm_tensor_dim(x, 0), H = cm_tensor_dim(x, 1), W = cm_tensor_dim(x, 2);
    uint8_t *o = malloc((size_t)(C * H * W));
    cr_assert_eq(fn(cm_tensor_data(x), C, H, W, arg, o), CM_OK, "%s: %s", k, cm_last_error());
    const uint8_t *w = cm_tensor_data(want);
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < C * H * W; i++)
        if (o[i] != w[i]) bad++, first = first < 0 ? i : first;
    cr_expect_eq(bad, 0, "%s: %lld of %lld pixels differ from Pillow's (first at %lld: %d vs %d)", k, (long long)bad,
                 (long long)(C * H * W), (long long)first, first >= 0 ? o[first] : 0, first >= 0 ? w[first] : 0);
    free(o);
    cm_tensor_free(x), cm_tensor_free(want);
}

static cm_status f_autocontrast(const uint8_t *in, int64_t C, int64_t H, int64_t W, const void *a, uint8_t *o) {
    return cm_pil_autocontrast(in, C, H, W, o);
}
static cm_status f_equalize(const uint8_t *in, int64_t C, int64_t H, int64_t W, const void *a, uint8_t *o) {
    return cm_pil_equalize(in, C, H, W, o);
}
static cm_status f_posterize(const uint8_t *in, int64_t C, int64_t H, int64_t W, const void *a, uint8_t *o) {
    return cm_pil_posterize(in, C, H, W, *(const int *)a, o);
}
static cm_status f_solarize(const uint8_t *in, int64_t C, int64_t H, int64_t W, const void *a, uint8_t *o) {
    return cm_pil_solarize(in, C, H, W, *(const int *)a, o);
}
static cm_status f_rotate(const uint8_t *in, int64_t C, int64_t H, int64_t W, const void *a, uint8_t *o) {
    return cm_pil_rotate(in, C, H, W, *(const double *)a, o);
}
static cm_status f_affine(const uint8_t *in, int64_t C, int64_t H, int64_t W, const void *a, uint8_t *o) {
    return cm_pil_affine(in, C, H, W, a, o);
}
static cm_status f_color(const uint8_t *in, int64_t C, int64_t H, int64_t W, const void *a, uint8_t *o) {
    return cm_pil_color(in, C, H, W, *(const double *)a, o);
}
static cm_status f_contrast(const uint8_t *in, int64_t C, int64_t H, int64_t W, const void *a, uint8_t *o) {
    return cm_pil_contrast(in, C, H, W, *(const double *)a, o);
}
static cm_status f_brightness(const uint8_t *in, int64_t C, int64_t H, int64_t W, const void *a, uint8_t *o) {
    return cm_pil_brightness(in, C, H, W, *(const double *)a, o);
}
static cm_status f_sharpness(const uint8_t *in, int64_t C, int64_t H, int64_t W, const void *a, uint8_t *o) {
    return cm_pil_sharpness(in, C, H, W, *(const double *)a, o);
}

Test(pil_ops, look_up_table_operations_match_pillow) {
    cmt_golden *g = cmt_golden_open(GOLDEN);
    for (size_t i = 0; i < sizeof k_images / sizeof *k_images; i++) {
        compare(g, k_images[i], "autocontrast", f_autocontrast, NULL);
        compare(g, k_images[i], "equalize", f_equalize, NULL);
        for (int bits = 1; bits <= 4; bits++) {
            char k[32];
            snprintf(k, sizeof k, "posterize%d", bits);
            compare(g, k_images[i], k, f_posterize, &bits);
        }
        const int thr[] = {256, 200, 128, 31, 1};
        for (int t = 0; t < 5; t++) {
            char k[32];
            snprintf(k, sizeof k, "solarize%d", thr[t]);
            compare(g, k_images[i], k, f_solarize, &thr[t]);
        }
    }
    cmt_golden_close(g);
}

Test(pil_ops, geometric_operations_match_pillow_bilinear) {
    cmt_golden *g = cmt_golden_open(GOLDEN);
    const double degs[] = {3, -7, 17, -29, 90, 180};
    const struct {
        const char *key;
        double a[6];
    } aff[] = {{"shearx", {1, 0.27, 0, 0, 1, 0}},  {"shearxn", {1, -0.18, 0, 0, 1, 0}}, {"sheary", {1, 0, 0, 0.12, 1, 0}},
               {"shearyn", {1, 0, 0, -0.29, 1, 0}}, {"transx", {1, 0, 5, 0, 1, 0}},      {"transxn", {1, 0, -4, 0, 1, 0}},
               {"transy", {1, 0, 0, 0, 1, 3}},     {"transyn", {1, 0, 0, 0, 1, -2}}};
    for (size_t i = 0; i < sizeof k_images / sizeof *k_images; i++) {
        for (int d = 0; d < 6; d++) {
            char k[32];
            snprintf(k, sizeof k, "rotate%d", (int)degs[d]);
            compare(g, k_images[i], k, f_rotate, &degs[d]);
        }
        for (size_t a = 0; a < sizeof aff / sizeof *aff; a++) compare(g, k_images[i], aff[a].key, f_affine, aff[a].a);
    }
    cmt_golden_close(g);
}

Test(pil_ops, enhancements_match_pillow) {
    cmt_golden *g = cmt_golden_open(GOLDEN);
    const double fs[] = {0.1, 0.55, 1.0, 1.45, 3.2};
    const char *tags[] = {"0p1", "0p55", "1p0", "1p45", "3p2"};
    for (size_t i = 0; i < sizeof k_images / sizeof *k_images; i++)
        for (int f = 0; f < 5; f++) {
            char k[32];
            snprintf(k, sizeof k, "color%s", tags[f]);
            compare(g, k_images[i], k, f_color, &fs[f]);
            snprintf(k, sizeof k, "contrast%s", tags[f]);
            compare(g, k_images[i], k, f_contrast, &fs[f]);
            snprintf(k, sizeof k, "brightness%s", tags[f]);
            compare(g, k_images[i], k, f_brightness, &fs[f]);
            snprintf(k, sizeof k, "sharpness%s", tags[f]);
            compare(g, k_images[i], k, f_sharpness, &fs[f]);
        }
    cmt_golden_close(g);
}

Test(pil_ops, augmix_mixing_matches_numpy) {
    cmt_golden *g = cmt_golden_open(GOLDEN);
    cm_tensor *x = cmt_golden_get(g, "rgb.in"), *ch = cmt_golden_get(g, "augmix.chains"), *w = cmt_golden_get(g, "augmix.weights");
    cm_tensor *m = cmt_golden_get(g, "augmix.mixing"), *want = cmt_golden_get(g, "augmix.out");
    const int64_t n = cm_tensor_numel(x);
    const uint8_t *chains[3] = {(const uint8_t *)cm_tensor_data(ch), (const uint8_t *)cm_tensor_data(ch) + n,
                                (const uint8_t *)cm_tensor_data(ch) + 2 * n};
    uint8_t *o = malloc((size_t)n);
    cr_assert_eq(cm_augmix_combine(cm_tensor_data(x), chains, cm_tensor_data(w), 3, *(float *)cm_tensor_data(m), n, o),
                 CM_OK);
    cr_expect(memcmp(o, cm_tensor_data(want), (size_t)n) == 0, "AugMix's mix differs from numpy's");
    free(o);
    cm_tensor *all[] = {x, ch, w, m, want};
    for (int i = 0; i < 5; i++) cm_tensor_free(all[i]);
    cmt_golden_close(g);
}

/* ---- Composer's level sampling ---- */

/* posterize keeps 4 - int(U(0.1, s)·0.4) bits; solarize's threshold is 256 - int(U(0.1, s)·25.6);
 * rotate's angle |int(U(0.1, s)·3)| degrees: check the extreme outputs over many draws. */
Test(pil_ops, levels_follow_composers_ranges) {
    const int64_t C = 1, H = 8, W = 8;
    uint8_t in[64], out[64];
    for (int i = 0; i < 64; i++) in[i] = (uint8_t)(i * 4 + 1); /* 1, 5, ..., 253: odd, all bits used */
    cm_rng r = cm_rng_init(3, 3);
    int min_bits = 8, max_bits = 0, min_thr = 999, max_thr = 0;
    for (int t = 0; t < 2000; t++) {
        cr_assert_eq(cm_augment_op_apply(CM_AUGMENT_POSTERIZE, 10, &r, in, C, H, W, out), CM_OK);
        /* the kept bits: the mask of the brightest pixel 253 = 0b11111101 */
        int bits = 0;
        for (int b = 7; b >= 0 && (out[63] >> b & 1); b--) bits++;
        if (out[63] == 0xfc) bits = 6; /* 253 & ~3 */
        min_bits = bits < min_bits ? bits : min_bits, max_bits = bits > max_bits ? bits : max_bits;
        cr_assert_eq(cm_augment_op_apply(CM_AUGMENT_SOLARIZE, 10, &r, in, C, H, W, out), CM_OK);
        int thr = 256; /* the smallest input that was inverted */
        for (int i = 63; i >= 0; i--)
            if (out[i] != in[i]) thr = in[i];
        min_thr = thr < min_thr ? thr : min_thr, max_thr = thr > max_thr ? thr : max_thr;
    }
    cr_expect(min_bits == 1 && max_bits == 4, "posterize at severity 10 keeps 1 to 4 bits: %d to %d", min_bits, max_bits);
    cr_expect(min_thr <= 5 && max_thr == 256, "solarize thresholds from about 1 to 256: %d to %d", min_thr, max_thr);
    /* severity 0: U(0.1, 0) stays below 0.1, so posterize keeps 4 bits and solarize changes nothing */
    cr_assert_eq(cm_augment_op_apply(CM_AUGMENT_SOLARIZE, 0, &r, in, C, H, W, out), CM_OK);
    cr_expect(memcmp(in, out, 64) == 0);
    cm_augment_op ops[CM_AUGMENT_OP_COUNT];
    cr_expect_eq(cm_augmentation_set_ops(CM_AUGMENTATION_SET_ALL, ops), 13);
    cr_expect_eq(ops[12], CM_AUGMENT_SHARPNESS);
    cr_expect_eq(cm_augmentation_set_ops(CM_AUGMENTATION_SET_SAFE, ops), 9);
    cr_expect_eq(cm_augmentation_set_ops(CM_AUGMENTATION_SET_ORIGINAL, ops), 13);
    cr_expect_eq(ops[9], CM_AUGMENT_COLOR_ORIGINAL);
    cm_augmentation_set s;
    cr_expect_eq(cm_augmentation_set_parse("original", &s), CM_OK);
    cr_expect_eq(cm_augmentation_set_parse("everything", &s), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "all, safe, original"), "%s", cm_last_error());
}

/* ---- RandAugment and AugMix ---- */

Test(pil_ops, randaugment_and_augmix_are_keyed_by_seed_epoch_and_index) {
    const int64_t C = 3, H = 12, W = 10, n = C * H * W;
    uint8_t img[360], a[360], b[360];
    cm_rng r0 = cm_rng_init(1, 1);
    for (int64_t i = 0; i < n; i++) img[i] = (uint8_t)(cm_rng_uniform_at(1, 1, (uint64_t)i) * 256);
    (void)r0;
    cm_randaugment_config rc = cm_randaugment_config_default();
    cm_augmix_config ac = cm_augmix_config_default();
    for (int which = 0; which < 2; which++) {
        cm_status (*fn)(uint8_t *, int64_t, int64_t, int64_t, uint64_t, int64_t, int64_t, const void *) =
            which ? cm_augmix_transform : cm_randaugment_transform;
        const void *cfg = which ? (const void *)&ac : (const void *)&rc;
        memcpy(a, img, (size_t)n), memcpy(b, img, (size_t)n);
        cr_assert_eq(fn(a, C, H, W, 42, 3, 17, cfg), CM_OK, "%s", cm_last_error());
        cr_assert_eq(fn(b, C, H, W, 42, 3, 17, cfg), CM_OK);
        cr_expect(memcmp(a, b, (size_t)n) == 0, "the same key gives the same image");
        int differ = 0;
        for (int k = 0; k < 3; k++) { /* other epochs, indices, seeds: other images (almost surely) */
            memcpy(b, img, (size_t)n);
            cr_assert_eq(fn(b, C, H, W, k == 2 ? 43 : 42, k == 0 ? 4 : 3, k == 1 ? 18 : 17, cfg), CM_OK);
            differ += memcmp(a, b, (size_t)n) != 0;
        }
        cr_expect_geq(differ, 2, "%s: other keys gave the same image %d times of 3", which ? "AugMix" : "RandAugment",
                      3 - differ);
    }
    /* depth 0: RandAugment changes nothing */
    rc.depth = 0;
    memcpy(a, img, (size_t)n);
    cr_assert_eq(cm_randaugment_transform(a, C, H, W, 1, 0, 0, &rc), CM_OK);
    cr_expect(memcmp(a, img, (size_t)n) == 0);
    /* errors: Composer's argument checks, images that are not L or RGB */
    cm_algorithm_plugin p;
    rc = cm_randaugment_config_default();
    rc.severity = 11;
    cr_expect_eq(cm_randaugment_new(&rc, NULL, &p), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "0 <= severity <= 10"), "%s", cm_last_error());
    ac.width = 0;
    cr_expect_eq(cm_augmix_new(&ac, NULL, &p), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "width 0 must be >= 1"), "%s", cm_last_error());
    cr_expect_eq(cm_randaugment_transform(a, 2, H, W, 1, 0, 0, NULL), CM_ERR_SHAPE);
    cr_expect(strstr(cm_last_error(), "C = 1 or 3"), "%s", cm_last_error());
}

/* The dataset hook: CIFAR-10 with RandAugment in its augmentation gives the same images for any
 * number of loader workers, differs from the plain dataset, and leaves evaluation alone. */
Test(pil_ops, cifar_u8_transform_is_the_same_for_any_number_of_workers) {
    cm_randaugment_config rc = cm_randaugment_config_default();
    cm_cifar10_config cc = cm_cifar10_config_default();
    cc.augment.u8_transform = cm_randaugment_transform, cc.augment.u8_transform_data = &rc;
    cm_dataset *aug, *plain;
    cr_assert_eq(cm_dataset_cifar10_new("../shared/data/cifar10", CM_SPLIT_TEST, &cc, &aug), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_dataset_cifar10_new("../shared/data/cifar10", CM_SPLIT_TEST, NULL, &plain), CM_OK);
    float *first[2] = {NULL, NULL};
    for (int w = 0; w < 2; w++) {
        cm_dataloader_config lc = cm_dataloader_config_default();
        lc.batch_size = 16, lc.seed = 9, lc.num_workers = w ? 2 : 0;
        cm_dataloader *dl;
        cr_assert_eq(cm_dataloader_new(aug, &lc, &dl), CM_OK);
        cm_batch *b;
        cr_assert_eq(cm_dataloader_next(dl, &b), CM_OK, "%s", cm_last_error());
        cm_tensor *x = cm_batch_field(b, "image");
        first[w] = malloc(cm_tensor_nbytes(x));
        memcpy(first[w], cm_tensor_data(x), cm_tensor_nbytes(x));
        /* not the plain image of the same sample */
        if (w == 0) {
            float plain_img[3 * 32 * 32];
            int64_t label;
            void *o[2] = {plain_img, &label};
            const cm_sample_ctx ctx = {9, 0, true};
            cr_assert_eq(cm_dataset_get(plain, b->indices[0], &ctx, o), CM_OK);
            cr_expect(memcmp(plain_img, first[0], sizeof plain_img) != 0, "RandAugment changed nothing");
        }
        cm_dataloader_free(dl);
    }
    cr_expect(memcmp(first[0], first[1], sizeof(float) * 16 * 3 * 32 * 32) == 0, "0 and 2 workers differ");
    free(first[0]), free(first[1]);
    /* evaluation samples are not augmented */
    float e1[3 * 32 * 32], e2[3 * 32 * 32];
    int64_t l;
    void *o1[2] = {e1, &l}, *o2[2] = {e2, &l};
    cr_assert_eq(cm_dataset_get(aug, 5, NULL, o1), CM_OK);
    cr_assert_eq(cm_dataset_get(plain, 5, NULL, o2), CM_OK);
    cr_expect(memcmp(e1, e2, sizeof e1) == 0);
    cm_dataset_free(aug), cm_dataset_free(plain);
}

/* ---- the plugins ---- */

static int mk_ra(cm_algorithm_plugin *out, int cap, void *data) {
    cr_assert_eq(cm_randaugment_new(NULL, NULL, &out[0]), CM_OK);
    return 1;
}
static int mk_am(cm_algorithm_plugin *out, int cap, void *data) {
    cr_assert_eq(cm_augmix_new(NULL, NULL, &out[0]), CM_OK);
    return 1;
}

Test(pil_ops, plugins_fit_and_resume_on_u8_images_and_refuse_floats) {
    cda_run_opts o = cda_run_opts_default();
    o.rig.u8_images = true; /* the CNN sees raw pixels (a model that would normalise them itself) */
    cda_check_fit_twice(CDA_CNN, mk_ra, NULL, &o, "RandAugment");
    cda_check_resumption(CDA_CNN, mk_ra, NULL, &o, 3, 1, "RandAugment");
    cda_check_resumption(CDA_RESNET, mk_am, NULL, &o, 3, 1, "AugMix");
    /* float images: the advice names the dataset transform */
    cda_run_opts f = cda_run_opts_default();
    f.max_duration = "1ba", f.save_interval = NULL;
    cda_rig rig = cda_rig_new(CDA_RESNET, &f.rig);
    cm_algorithm_plugin ap;
    cr_assert_eq(cm_randaugment_new(NULL, NULL, &ap), CM_OK);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = rig.model, c.train_dataloader = rig.dl, c.max_duration = cm_time_make(1, CM_TIME_BATCH);
    c.algorithms = &ap, c.n_algorithms = 1, c.handle_signals = false;
    cm_trainer *tr;
    cr_assert_eq(cm_trainer_new(&c, &tr), CM_OK, "%s", cm_last_error());
    cr_expect_eq(cm_trainer_fit(tr, NULL), CM_ERR_DTYPE);
    cr_expect(strstr(cm_last_error(), "RandAugment: input 'image' is (8, 3, 16, 16) f32") &&
                  strstr(cm_last_error(), "u8_transform"),
              "%s", cm_last_error());
    cm_trainer_free(tr);
    cda_rig_free(&rig);
}
