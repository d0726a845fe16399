/* Image augmentation: parameters are a pure function of (seed, epoch, index); crop and flip move
 * pixels exactly as torchvision's RandomCrop(padding=P) + RandomHorizontalFlip; the datasets apply
 * the same geometry as the functional form, and only when training. */
#include "cmtest.h"

#include <composer/datasets.h>
#include <math.h>
#include <string.h>

Test(augment, parameters_depend_only_on_seed_epoch_and_index) {
    cm_image_augment aug = cm_image_augment_default();
    cr_assert_eq(aug.crop_padding, 4);
    cr_assert_float_eq(aug.hflip_p, 0.5f, 0);
    int differ_epoch = 0, differ_seed = 0;
    for (int64_t i = 0; i < 200; i++) {
        cm_image_augment_params a = cm_image_augment_draw(&aug, 7, 2, i), b = cm_image_augment_draw(&aug, 7, 2, i);
        cr_assert(a.shift_y == b.shift_y && a.shift_x == b.shift_x && a.flip == b.flip, "index %lld not reproducible",
                  (long long)i);
        cm_image_augment_params c = cm_image_augment_draw(&aug, 7, 3, i), d = cm_image_augment_draw(&aug, 8, 2, i);
        differ_epoch += a.shift_y != c.shift_y || a.shift_x != c.shift_x || a.flip != c.flip;
        differ_seed += a.shift_y != d.shift_y || a.shift_x != d.shift_x || a.flip != d.flip;
    }
    /* 81 crops x 2 flips: a repeat has probability 1/162 per sample */
    cr_assert_gt(differ_epoch, 180, "only %d of 200 samples changed with the epoch", differ_epoch);
    cr_assert_gt(differ_seed, 180, "only %d of 200 samples changed with the seed", differ_seed);
}

Test(augment, shifts_cover_minus_p_to_p_and_flips_follow_the_probability) {
    cm_image_augment aug = {.crop_padding = 2, .hflip_p = 0.25f};
    int seen_y[5] = {0}, seen_x[5] = {0}, flips = 0;
    const int n = 8000;
    for (int64_t i = 0; i < n; i++) {
        cm_image_augment_params p = cm_image_augment_draw(&aug, 1, 0, i);
        cr_assert(p.shift_y >= -2 && p.shift_y <= 2 && p.shift_x >= -2 && p.shift_x <= 2, "shift (%d, %d) outside [-2, 2]",
                  p.shift_y, p.shift_x);
        seen_y[p.shift_y + 2]++;
        seen_x[p.shift_x + 2]++;
        flips += p.flip;
    }
    for (int k = 0; k < 5; k++) {
        /* expected 1600 each; 6 sigma is about 215 */
        cr_assert(seen_y[k] > 1380 && seen_y[k] < 1820, "shift_y %d drawn %d times of %d (want ~1600)", k - 2, seen_y[k], n);
        cr_assert(seen_x[k] > 1380 && seen_x[k] < 1820, "shift_x %d drawn %d times of %d (want ~1600)", k - 2, seen_x[k], n);
    }
    cr_assert(flips > 1770 && flips < 2230, "%d flips of %d at p = 0.25 (want ~2000)", flips, n);
    /* disabled components draw nothing */
    cm_image_augment none = {.crop_padding = 0, .hflip_p = 0.0f};
    for (int64_t i = 0; i < 100; i++) {
        cm_image_augment_params p = cm_image_augment_draw(&none, 1, 0, i);
        cr_assert(p.shift_y == 0 && p.shift_x == 0 && !p.flip);
    }
    cm_image_augment always = {.crop_padding = 0, .hflip_p = 1.0f};
    for (int64_t i = 0; i < 100; i++) cr_assert(cm_image_augment_draw(&always, 1, 0, i).flip);
}

/* A (2, 3, 4) image with values 1..24. */
static void known_image(float *x) {
    for (int k = 0; k < 24; k++) x[k] = (float)(k + 1);
}

static void expect_image(const float *got, const float *want, int n, const char *what) {
    for (int k = 0; k < n; k++)
        cr_assert_eq(got[k], want[k], "%s: element %d is %g, want %g", what, k, got[k], want[k]);
}

Test(augment, crop_shifts_with_zero_fill_and_flip_mirrors_rows_on_a_known_image) {
    float in[24], out[24];
    known_image(in);
    /* identity */
    cm_image_augment_params id = {0, 0, false};
    cr_assert_eq(cm_image_transform(&id, 2, 3, 4, in, out), CM_OK);
    expect_image(out, in, 24, "identity");
    /* shift down-right by (1, 1): out[y][x] = in[y+1][x+1] */
    cm_image_augment_params s = {1, 1, false};
    cr_assert_eq(cm_image_transform(&s, 2, 3, 4, in, out), CM_OK);
    const float want_s[24] = {6, 7, 8, 0, 10, 11, 12, 0, 0, 0, 0, 0, 18, 19, 20, 0, 22, 23, 24, 0, 0, 0, 0, 0};
    expect_image(out, want_s, 24, "shift (1, 1)");
    /* shift (-1, -2): out[y][x] = in[y-1][x-2] */
    cm_image_augment_params s2 = {-1, -2, false};
    cr_assert_eq(cm_image_transform(&s2, 2, 3, 4, in, out), CM_OK);
    const float want_s2[24] = {0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 5, 6, 0, 0, 0, 0, 0, 0, 13, 14, 0, 0, 17, 18};
    expect_image(out, want_s2, 24, "shift (-1, -2)");
    /* flip alone reverses each row */
    cm_image_augment_params f = {0, 0, true};
    cr_assert_eq(cm_image_transform(&f, 2, 3, 4, in, out), CM_OK);
    const float want_f[24] = {4, 3, 2, 1, 8, 7, 6, 5, 12, 11, 10, 9, 16, 15, 14, 13, 20, 19, 18, 17, 24, 23, 22, 21};
    expect_image(out, want_f, 24, "flip");
    /* crop then flip (torchvision order): flip of the shifted image */
    cm_image_augment_params sf = {1, 1, true};
    cr_assert_eq(cm_image_transform(&sf, 2, 3, 4, in, out), CM_OK);
    const float want_sf[24] = {0, 8, 7, 6, 0, 12, 11, 10, 0, 0, 0, 0, 0, 20, 19, 18, 0, 24, 23, 22, 0, 0, 0, 0};
    expect_image(out, want_sf, 24, "shift (1, 1) + flip");
    /* a shift past the whole image leaves zeros */
    cm_image_augment_params far = {0, 9, false};
    cr_assert_eq(cm_image_transform(&far, 2, 3, 4, in, out), CM_OK);
    for (int k = 0; k < 24; k++) cr_assert_eq(out[k], 0.0f, "far shift: element %d is %g", k, out[k]);
    far.shift_x = -9;
    far.flip = true;
    cr_assert_eq(cm_image_transform(&far, 2, 3, 4, in, out), CM_OK);
    for (int k = 0; k < 24; k++) cr_assert_eq(out[k], 0.0f, "far negative shift: element %d is %g", k, out[k]);
}

Test(augment, functional_apply_equals_draw_then_transform) {
    float in[3 * 8 * 8], a[3 * 8 * 8], b[3 * 8 * 8];
    for (int k = 0; k < 192; k++) in[k] = (float)k * 0.5f - 7.0f;
    cm_image_augment aug = {.crop_padding = 3, .hflip_p = 0.5f};
    for (int64_t i = 0; i < 50; i++) {
        cr_assert_eq(cm_image_augment_apply(&aug, 11, 4, i, 3, 8, 8, in, a), CM_OK);
        cm_image_augment_params p = cm_image_augment_draw(&aug, 11, 4, i);
        cr_assert_eq(cm_image_transform(&p, 3, 8, 8, in, b), CM_OK);
        expect_image(a, b, 192, "apply vs draw + transform");
    }
}

Test(augment, bad_arguments_are_rejected) {
    float x[4] = {0}, y[4];
    cm_image_augment aug = {.crop_padding = -2, .hflip_p = 0.5f};
    cr_assert_eq(cm_image_augment_apply(&aug, 0, 0, 0, 1, 2, 2, x, y), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "crop_padding is -2"), "%s", cm_last_error());
    aug = (cm_image_augment){.crop_padding = 1, .hflip_p = NAN};
    cr_assert_eq(cm_image_augment_apply(&aug, 0, 0, 0, 1, 2, 2, x, y), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "hflip_p"), "%s", cm_last_error());
    cm_image_augment_params p = {0, 0, false};
    cr_assert_eq(cm_image_transform(&p, 1, 0, 2, x, y), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "(1, 0, 2)"), "%s", cm_last_error());
    cr_assert_eq(cm_image_transform(&p, 1, 2, 2, x, x), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "same buffer"), "%s", cm_last_error());
    const float mean[1] = {0}, bad_std[1] = {0};
    cr_assert_eq(cm_image_normalize(x, 1, 4, mean, bad_std), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "std[0]"), "%s", cm_last_error());
}

Test(augment, normalize_applies_per_channel_mean_and_std) {
    float x[6] = {0.0f, 0.5f, 1.0f, 0.0f, 0.5f, 1.0f};
    const float mean[2] = {0.5f, 0.25f}, std[2] = {0.5f, 0.25f};
    cr_assert_eq(cm_image_normalize(x, 2, 3, mean, std), CM_OK);
    const float want[6] = {-1.0f, 0.0f, 1.0f, -1.0f, 1.0f, 3.0f};
    expect_image(x, want, 6, "normalize");
}

/* The datasets augment u8 pixels before normalising; the result must equal the functional form
 * applied to the raw image (as floats) followed by the same normalisation. Padding is black. */
Test(augment, mnist_dataset_applies_the_functional_geometry_only_when_training) {
    cm_mnist_config raw = cm_mnist_config_default();
    raw.raw_u8 = true;
    cm_mnist_config aug = cm_mnist_config_default();
    aug.augment = (cm_image_augment){.crop_padding = 3, .hflip_p = 0.5f};
    cm_dataset *dr, *da;
    cr_assert_eq(cm_dataset_mnist_new("../shared/data/mnist", CM_SPLIT_TEST, &raw, &dr), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_dataset_mnist_new("../shared/data/mnist", CM_SPLIT_TEST, &aug, &da), CM_OK, "%s", cm_last_error());
    uint8_t px[784];
    float fin[784], want[784], got[784], plain[784], again[784];
    int64_t l1, l2;
    int changed = 0;
    for (int64_t i = 0; i < 40; i++) {
        cr_assert_eq(cm_dataset_get(dr, i, NULL, (void *[]){px, &l1}), CM_OK);
        for (int k = 0; k < 784; k++) fin[k] = (float)px[k];
        cm_sample_ctx train = {.seed = 5, .epoch = 1, .training = true};
        cr_assert_eq(cm_image_augment_apply(&aug.augment, train.seed, train.epoch, i, 1, 28, 28, fin, want), CM_OK);
        for (int k = 0; k < 784; k++) want[k] = (want[k] / 255.0f - 0.1307f) / 0.3081f;
        cr_assert_eq(cm_dataset_get(da, i, &train, (void *[]){got, &l2}), CM_OK);
        cr_assert_eq(l1, l2);
        cmt_assert_close_f32("augmented sample", got, want, 784, 1e-6, 0);
        /* same (seed, epoch, index) again: identical */
        cr_assert_eq(cm_dataset_get(da, i, &train, (void *[]){again, &l2}), CM_OK);
        cr_assert_eq(memcmp(got, again, sizeof got), 0, "sample %lld not reproducible", (long long)i);
        /* evaluation: no augmentation */
        cm_sample_ctx eval = {.seed = 5, .epoch = 1, .training = false};
        cr_assert_eq(cm_dataset_get(da, i, &eval, (void *[]){plain, &l2}), CM_OK);
        for (int k = 0; k < 784; k++) {
            float w = ((float)px[k] / 255.0f - 0.1307f) / 0.3081f;
            cr_assert(fabsf(plain[k] - w) <= 1e-6f, "eval sample %lld px %d: %g, want %g", (long long)i, k, plain[k], w);
        }
        /* another epoch gives another augmentation (for nearly every sample) */
        cm_sample_ctx next = {.seed = 5, .epoch = 2, .training = true};
        cr_assert_eq(cm_dataset_get(da, i, &next, (void *[]){again, &l2}), CM_OK);
        changed += memcmp(got, again, sizeof got) != 0;
    }
    cr_assert_gt(changed, 30, "only %d of 40 samples changed between epochs", changed);
    cm_dataset_free(dr);
    cm_dataset_free(da);
}
