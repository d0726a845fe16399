/* The functional forms of the data methods (composer/data_algos.h): golden values from PyTorch
 * (tests/golden/gen_data_algos.py -> tests/golden/data_algos.safetensors, with Composer's code
 * restated on torch tensors and the random draws fixed), the draws' distributions, the
 * invariants of the randomised ones, and the errors. Tolerances: copies and index arithmetic are
 * exact; f32 arithmetic within 1e-6 absolute + 1e-6 relative (a few ulps of O(1) values). */
#include "cmtest.h"

#include <composer/data_algos.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define GOLDEN "tests/golden/data_algos.safetensors"
#define ATOL 1e-6
#define RTOL 1e-6

/* Doubles stored as I64 bit patterns (the golden reader has no F64). */
static double *g_f64(cmt_golden *g, const char *name, int64_t *n) {
    cm_tensor *t = cmt_golden_get(g, name);
    cr_assert_eq(cm_tensor_dtype(t), CM_DTYPE_I64, "%s holds doubles as i64 bits", name);
    *n = cm_tensor_numel(t);
    double *d = malloc(sizeof(double) * (size_t)(*n ? *n : 1));
    memcpy(d, cm_tensor_data(t), sizeof(double) * (size_t)*n);
    cm_tensor_free(t);
    return d;
}
static int64_t *g_i64(cmt_golden *g, const char *name, int64_t *n) {
    cm_tensor *t = cmt_golden_get(g, name);
    *n = cm_tensor_numel(t);
    int64_t *d = malloc(sizeof(int64_t) * (size_t)(*n ? *n : 1));
    for (int64_t i = 0; i < *n; i++) d[i] = (int64_t)cm_tensor_get_flat(t, i);
    cm_tensor_free(t);
    return d;
}
static cm_tensor *like(const cm_tensor *t, cm_dtype dt) {
    cm_tensor *o;
    cr_assert_eq(cm_tensor_new(dt, cm_tensor_ndim(t), cm_tensor_shape(t), &o), CM_OK);
    return o;
}
static cm_tensor *new2(int64_t a, int64_t b) {
    const int64_t s[2] = {a, b};
    cm_tensor *o;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 2, s, &o), CM_OK);
    return o;
}
static void assert_equal(const char *what, const cm_tensor *a, const cm_tensor *b) { cmt_assert_close(what, a, b, 0, 0); }

/* ---- MixUp ---- */

Test(data_algos, mixup_batch_targets_and_losses_match_torch) {
    cmt_golden *g = cmt_golden_open(GOLDEN);
    cm_tensor *x = cmt_golden_get(g, "mixup.x"), *y = cmt_golden_get(g, "mixup.y");
    int64_t n;
    int64_t *perm = g_i64(g, "mixup.perm", &n);
    double *m = g_f64(g, "mixup.mixing", &n);
    cm_tensor *xm = like(x, CM_DTYPE_F32), *want = cmt_golden_get(g, "mixup.x_mix");
    cr_assert_eq(cm_mixup_batch(x, perm, m[0], xm), CM_OK, "%s", cm_last_error());
    cmt_assert_close("mixup x", xm, want, ATOL, RTOL);
    cm_tensor *ym = new2(6, 10), *ywant = cmt_golden_get(g, "mixup.y_mix");
    cr_assert_eq(cm_mix_targets(y, perm, 1.0 - m[0], 10, ym), CM_OK, "%s", cm_last_error());
    cmt_assert_close("mixup targets", ym, ywant, ATOL, RTOL);
    /* the loss on the mixed targets, and the interpolated loss of interpolate_loss */
    cm_tape *tp = cmt_tape();
    cm_tensor *logits = cmt_golden_on_tape(g, tp, "mixup.logits", false);
    cm_tensor *l1 = cm_cross_entropy(tp, logits, cm_clone_detached(tp, ym), NULL);
    cm_tensor *lw = cmt_golden_get(g, "mixup.loss_targets");
    cr_assert(l1);
    cr_expect(fabs(cm_tensor_get_flat(l1, 0) - cm_tensor_get_flat(lw, 0)) < 1e-5, "loss %g vs %g",
              cm_tensor_get_flat(l1, 0), cm_tensor_get_flat(lw, 0));
    cm_tensor *yp = like(y, CM_DTYPE_I64);
    for (int64_t i = 0; i < 6; i++) ((int64_t *)cm_tensor_data(yp))[i] = (int64_t)cm_tensor_get_flat(y, perm[i]);
    cm_tensor *a = cm_cross_entropy(tp, logits, cm_clone_detached(tp, y), NULL);
    cm_tensor *b = cm_cross_entropy(tp, logits, cm_clone_detached(tp, yp), NULL);
    const double li = (1 - m[0]) * cm_tensor_get_flat(a, 0) + m[0] * cm_tensor_get_flat(b, 0);
    cm_tensor *liw = cmt_golden_get(g, "mixup.loss_interp");
    cr_expect(fabs(li - cm_tensor_get_flat(liw, 0)) < 1e-5, "interpolated loss %g vs %g", li, cm_tensor_get_flat(liw, 0));
    cm_tape_free(tp);
    cm_tensor *all[] = {x, y, xm, want, ym, ywant, lw, yp, liw};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) cm_tensor_free(all[i]);
    free(perm), free(m);
    cmt_golden_close(g);
}

Test(data_algos, mixup_draws_are_beta_and_permutations) {
    cm_rng r = cm_rng_init(7, 1);
    /* Beta(a, b): mean a/(a+b), variance ab/((a+b)^2 (a+b+1)); 20000 draws: 5 standard errors */
    const double ab[3][2] = {{0.2, 0.2}, {2, 5}, {1, 1}};
    for (int c = 0; c < 3; c++) {
        const double a = ab[c][0], b = ab[c][1], mean = a / (a + b), var = a * b / ((a + b) * (a + b) * (a + b + 1));
        double s = 0, s2 = 0;
        const int N = 20000;
        for (int i = 0; i < N; i++) {
            const double z = cm_random_beta(&r, a, b);
            cr_assert(z >= 0 && z <= 1, "Beta(%g, %g) draw %g", a, b, z);
            s += z, s2 += z * z;
        }
        const double m = s / N, v = s2 / N - m * m;
        cr_expect(fabs(m - mean) < 5 * sqrt(var / N), "Beta(%g, %g): mean %g, want %g", a, b, m, mean);
        cr_expect(fabs(v - var) < 0.1 * var, "Beta(%g, %g): variance %g, want %g", a, b, v, var);
    }
    /* MixUp's coefficient: the smaller side, so in [0, 0.5]; 0 for alpha 0 */
    for (int i = 0; i < 1000; i++) {
        const double mx = cm_mixup_draw_mixing(0.2, &r);
        cr_assert(mx >= 0 && mx <= 0.5, "mixing %g", mx);
    }
    cr_expect_eq(cm_mixup_draw_mixing(0, &r), 0.0);
    /* permutations: every element once, and element 0 lands uniformly */
    int64_t p[10];
    int hist[10] = {0};
    for (int t = 0; t < 10000; t++) {
        cm_random_permutation(&r, 10, p);
        int seen[10] = {0};
        for (int i = 0; i < 10; i++) seen[p[i]]++;
        for (int i = 0; i < 10; i++) cr_assert_eq(seen[i], 1);
        for (int i = 0; i < 10; i++)
            if (p[i] == 0) hist[i]++;
    }
    for (int i = 0; i < 10; i++) cr_expect(abs(hist[i] - 1000) < 150, "element 0 at position %d %d times of 10000", i, hist[i]);
}

/* ---- CutMix ---- */

Test(data_algos, cutmix_batch_lambda_and_targets_match_torch) {
    cmt_golden *g = cmt_golden_open(GOLDEN);
    cm_tensor *x = cmt_golden_get(g, "cutmix.x"), *y = cmt_golden_get(g, "cutmix.y");
    int64_t n;
    int64_t *perm = g_i64(g, "cutmix.perm", &n);
    for (int c = 0; c < 3; c++) {
        char k[64];
        snprintf(k, sizeof k, "cutmix%d.bbox", c);
        int64_t *bb = g_i64(g, k, &n);
        const cm_bbox box = {bb[0], bb[1], bb[2], bb[3]};
        cm_tensor *xc = like(x, CM_DTYPE_F32);
        cr_assert_eq(cm_cutmix_batch(x, perm, box, xc), CM_OK, "%s", cm_last_error());
        snprintf(k, sizeof k, "cutmix%d.x_cut", c);
        cm_tensor *want = cmt_golden_get(g, k);
        assert_equal(k, xc, want);
        snprintf(k, sizeof k, "cutmix%d.lambda", c);
        double *lam = g_f64(g, k, &n);
        const double l = cm_cutmix_adjusted_lambda(7, 9, box);
        cr_expect_eq(l, lam[0], "%s: %.17g vs %.17g", k, l, lam[0]);
        cm_tensor *yc = new2(5, 4);
        cr_assert_eq(cm_mix_targets(y, perm, l, 4, yc), CM_OK, "%s", cm_last_error());
        snprintf(k, sizeof k, "cutmix%d.y_cut", c);
        cm_tensor *yw = cmt_golden_get(g, k);
        cmt_assert_close(k, yc, yw, ATOL, RTOL);
        cm_tensor_free(xc), cm_tensor_free(want), cm_tensor_free(yc), cm_tensor_free(yw);
        free(bb), free(lam);
    }
    cm_tensor_free(x), cm_tensor_free(y);
    free(perm);
    cmt_golden_close(g);
}

Test(data_algos, cutmix_boxes_follow_composers_sampling) {
    cm_rng r = cm_rng_init(3, 0);
    for (int t = 0; t < 2000; t++) {
        const double lam = cm_cutmix_draw_lambda(1.0, &r);
        const bool uni = t % 2;
        const cm_bbox b = cm_cutmix_draw_bbox(12, 20, lam, uni, &r);
        cr_assert(0 <= b.x1 && b.x1 <= b.x2 && b.x2 <= 12 && 0 <= b.y1 && b.y1 <= b.y2 && b.y2 <= 20,
                  "box [%lld, %lld) x [%lld, %lld)", (long long)b.x1, (long long)b.x2, (long long)b.y1, (long long)b.y2);
        /* clipped, the box is at most the nominal cut: (cut//2)·2 per side */
        const double cut = sqrt(1 - lam);
        cr_assert_leq(b.x2 - b.x1, ((int64_t)(12 * cut) / 2) * 2);
        cr_assert_leq(b.y2 - b.y1, ((int64_t)(20 * cut) / 2) * 2);
        /* centres inside the image (not uniform sampling) always leave a box of cut//2 at least */
        if (!uni && (int64_t)(12 * cut) >= 2 && (int64_t)(20 * cut) >= 2)
            cr_assert(b.x2 > b.x1 && b.y2 > b.y1, "an empty box from a centre inside the 12 x 20 image");
    }
    /* lambda 1: an empty box, the original keeps weight 1 */
    const cm_bbox e = cm_cutmix_draw_bbox(12, 20, 1.0, false, &r);
    cr_expect_eq(cm_cutmix_adjusted_lambda(12, 20, e), 1.0);
    /* uniform sampling lets every pixel be covered equally often: the corners are reached too */
    int corner = 0, centre = 0;
    for (int t = 0; t < 4000; t++) {
        const cm_bbox b = cm_cutmix_draw_bbox(10, 10, 0.75, true, &r);
        corner += b.x1 == 0 && b.y1 == 0 && b.x2 > 0 && b.y2 > 0;
        centre += b.x1 <= 5 && 5 < b.x2 && b.y1 <= 5 && 5 < b.y2;
    }
    cr_expect(corner > 100 && centre > 100, "corner %d, centre %d of 4000", corner, centre);
}

/* ---- CutOut ---- */

Test(data_algos, cutout_zeroes_the_same_clipped_squares_everywhere) {
    const int64_t shape[4] = {3, 2, 10, 14};
    cm_tensor *x;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 4, shape, &x), CM_OK);
    cm_rng r = cm_rng_init(11, 2);
    for (int t = 0; t < 200; t++) {
        cm_tensor_fill(x, 1.0);
        cr_assert_eq(cm_cutout_batch(x, 1, 0.5, t % 2, &r), CM_OK);
        /* L = int(10·0.5) = 5: a rectangle of at most (5//2)·2 = 4 per side, the same in all 6 planes */
        const float *p = cm_tensor_data(x);
        int64_t y1 = 99, y2 = -1, x1 = 99, x2 = -1, zeros = 0;
        for (int64_t i = 0; i < 10; i++)
            for (int64_t j = 0; j < 14; j++)
                if (p[i * 14 + j] == 0) {
                    zeros++;
                    y1 = i < y1 ? i : y1, y2 = i > y2 ? i : y2, x1 = j < x1 ? j : x1, x2 = j > x2 ? j : x2;
                }
        if (zeros) {
            cr_assert_eq(zeros, (y2 - y1 + 1) * (x2 - x1 + 1), "the hole is a rectangle");
            cr_assert_leq(y2 - y1 + 1, 4);
            cr_assert_leq(x2 - x1 + 1, 4);
        }
        for (int64_t pl = 1; pl < 6; pl++) cr_assert(memcmp(p, p + pl * 140, 140 * sizeof(float)) == 0, "plane %lld", (long long)pl);
    }
    /* u8 images too; no holes with num_holes 0 or length 0 */
    cm_tensor *u;
    const int64_t us[3] = {2, 6, 6};
    cr_assert_eq(cm_tensor_new(CM_DTYPE_U8, 3, us, &u), CM_OK);
    cm_tensor_fill(u, 7);
    cr_assert_eq(cm_cutout_batch(u, 0, 0.5, false, &r), CM_OK);
    cr_assert_eq(cm_cutout_batch(u, 3, 0.0, false, &r), CM_OK);
    for (int64_t i = 0; i < 72; i++) cr_assert_eq(((uint8_t *)cm_tensor_data(u))[i], 7);
    cr_assert_eq(cm_cutout_batch(u, 2, 1.0, false, &r), CM_OK);
    int z = 0;
    for (int64_t i = 0; i < 72; i++) z += ((uint8_t *)cm_tensor_data(u))[i] == 0;
    cr_expect_gt(z, 0);
    cr_expect_eq(cm_cutout_batch(u, -1, 0.5, false, &r), CM_ERR_INVALID_ARG);
    cr_expect_eq(cm_cutout_batch(u, 1, 1.5, false, &r), CM_ERR_INVALID_ARG);
    cm_tensor_free(x), cm_tensor_free(u);
}

/* ---- LabelSmoothing ---- */

Test(data_algos, smooth_labels_match_torch) {
    cmt_golden *g = cmt_golden_open(GOLDEN);
    cm_tensor *logits = cmt_golden_get(g, "ls.logits"), *y = cmt_golden_get(g, "ls.y"), *soft = cmt_golden_get(g, "ls.soft");
    cm_tensor *o = new2(7, 5), *w1 = cmt_golden_get(g, "ls.smooth_index"), *w2 = cmt_golden_get(g, "ls.smooth_dense");
    cr_assert_eq(cm_smooth_labels(logits, y, 0.1, o), CM_OK, "%s", cm_last_error());
    cmt_assert_close("smooth index targets", o, w1, ATOL, RTOL);
    cm_tape *tp = cmt_tape();
    cm_tensor *l = cm_cross_entropy(tp, cm_clone_detached(tp, logits), cm_clone_detached(tp, o), NULL);
    cm_tensor *lw = cmt_golden_get(g, "ls.loss");
    cr_expect(fabs(cm_tensor_get_flat(l, 0) - cm_tensor_get_flat(lw, 0)) < 1e-5, "loss %g vs %g", cm_tensor_get_flat(l, 0),
              cm_tensor_get_flat(lw, 0));
    cr_assert_eq(cm_smooth_labels(logits, soft, 0.25, o), CM_OK, "%s", cm_last_error());
    cmt_assert_close("smooth dense targets", o, w2, ATOL, RTOL);
    /* errors: a class out of range, logits that are not (N, C), smoothing outside [0, 1] */
    ((int64_t *)cm_tensor_data(y))[3] = 5;
    cr_expect_eq(cm_smooth_labels(logits, y, 0.1, o), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "target[3] = 5"), "%s", cm_last_error());
    cr_expect_eq(cm_smooth_labels(y, y, 0.1, o), CM_ERR_SHAPE);
    cr_expect_eq(cm_smooth_labels(logits, soft, 1.5, o), CM_ERR_INVALID_ARG);
    cm_tape_free(tp);
    cm_tensor *all[] = {logits, y, soft, o, w1, w2, lw};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) cm_tensor_free(all[i]);
    cmt_golden_close(g);
}

/* ---- ProgressiveResizing ---- */

Test(data_algos, progressive_resizing_schedule_and_pinning_match_composer) {
    cmt_golden *g = cmt_golden_open(GOLDEN);
    int64_t n, m;
    double *e = g_f64(g, "pr.elapsed", &n), *s = g_f64(g, "pr.scale", &m), *s2 = g_f64(g, "pr.scale_alt", &m);
    cm_progressive_resizing_config c = cm_progressive_resizing_config_default(), c2 = c;
    c2.initial_scale = 0.25, c2.finetune_fraction = 0.1, c2.delay_fraction = 0.2;
    for (int64_t i = 0; i < n; i++) {
        cr_expect(fabs(cm_progressive_resizing_scale(&c, e[i]) - s[i]) < 1e-15, "elapsed %g: %.17g vs %.17g", e[i],
                  cm_progressive_resizing_scale(&c, e[i]), s[i]);
        cr_expect(fabs(cm_progressive_resizing_scale(&c2, e[i]) - s2[i]) < 1e-15, "elapsed %g (alt): %.17g vs %.17g", e[i],
                  cm_progressive_resizing_scale(&c2, e[i]), s2[i]);
    }
    double *pin = g_f64(g, "pr.pin_in", &n), *pout = g_f64(g, "pr.pin_out", &m);
    for (int64_t i = 0; i < m; i++) {
        const double v = cm_progressive_resizing_pinned_scale(pin[3 * i], (int64_t)pin[3 * i + 1], (int64_t)pin[3 * i + 2]);
        cr_expect_eq(v, pout[i], "pin(%g, %g, %g): %.17g vs %.17g (Python rounds halves to even)", pin[3 * i],
                     pin[3 * i + 1], pin[3 * i + 2], v, pout[i]);
    }
    free(e), free(s), free(s2), free(pin), free(pout);
    cmt_golden_close(g);
}

Test(data_algos, resize_batch_matches_torch_nearest_interpolation) {
    cmt_golden *g = cmt_golden_open(GOLDEN);
    const char *names[] = {"a", "b", "c", "d", "e"};
    for (int i = 0; i < 5; i++) {
        char k[64];
        int64_t n;
        snprintf(k, sizeof k, "pr_%s.x", names[i]);
        cm_tensor *x = cmt_golden_get(g, k);
        snprintf(k, sizeof k, "pr_%s.t", names[i]);
        cm_tensor *t = cmt_golden_get(g, k);
        snprintf(k, sizeof k, "pr_%s.scale", names[i]);
        double *s = g_f64(g, k, &n);
        cm_tensor *xo, *to;
        cr_assert_eq(cm_resize_batch(x, t, s[0], CM_RESIZE_MODE_RESIZE, true, NULL, &xo, &to), CM_OK, "%s", cm_last_error());
        snprintf(k, sizeof k, "pr_%s.x_resized", names[i]);
        cm_tensor *xw = cmt_golden_get(g, k);
        assert_equal(k, xo, xw);
        snprintf(k, sizeof k, "pr_%s.t_resized", names[i]);
        cm_tensor *tw = cmt_golden_get(g, k);
        assert_equal(k, to, tw);
        cm_tensor *all[] = {x, t, xo, to, xw, tw};
        for (size_t j = 0; j < 6; j++) cm_tensor_free(all[j]);
        free(s);
    }
    cmt_golden_close(g);
}

Test(data_algos, resize_batch_crops_and_copies) {
    const int64_t shape[4] = {2, 1, 8, 10}, ts[3] = {2, 8, 10};
    cm_tensor *x, *t, *xo, *to;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 4, shape, &x), CM_OK);
    cr_assert_eq(cm_tensor_new(CM_DTYPE_I64, 3, ts, &t), CM_OK);
    cm_tensor_arange_fill(x, 0, 1);
    cm_tensor_arange_fill(t, 0, 1);
    cm_rng r = cm_rng_init(5, 5);
    cr_assert_eq(cm_resize_batch(x, t, 0.5, CM_RESIZE_MODE_CROP, true, &r, &xo, &to), CM_OK, "%s", cm_last_error());
    /* a 4 x 5 window of the image at one (top, left) for both images, the target's at the same place */
    cr_assert_eq(cm_tensor_dim(xo, 2), 4);
    cr_assert_eq(cm_tensor_dim(xo, 3), 5);
    const float *p = cm_tensor_data(xo);
    const int64_t top = (int64_t)p[0] / 10, left = (int64_t)p[0] % 10;
    cr_expect(top < 4 && left < 5, "top %lld left %lld", (long long)top, (long long)left);
    for (int64_t b = 0; b < 2; b++)
        for (int64_t i = 0; i < 4; i++)
            for (int64_t j = 0; j < 5; j++) {
                cr_assert_eq(p[(b * 4 + i) * 5 + j], (float)(b * 80 + (top + i) * 10 + left + j));
                cr_assert_eq(((int64_t *)cm_tensor_data(to))[(b * 4 + i) * 5 + j], b * 80 + (top + i) * 10 + left + j);
            }
    cm_tensor_free(xo), cm_tensor_free(to);
    /* scale >= 1: copies; targets untouched without resize_targets */
    cr_assert_eq(cm_resize_batch(x, t, 1.0, CM_RESIZE_MODE_RESIZE, false, NULL, &xo, &to), CM_OK);
    assert_equal("copy", xo, x);
    assert_equal("target copy", to, t);
    cm_tensor_free(xo), cm_tensor_free(to);
    cr_assert_eq(cm_resize_batch(x, t, 0.5, CM_RESIZE_MODE_RESIZE, false, NULL, &xo, &to), CM_OK);
    assert_equal("target kept", to, t);
    cm_tensor_free(xo), cm_tensor_free(to);
    /* errors */
    cr_expect_eq(cm_resize_batch(t, NULL, 0.5, CM_RESIZE_MODE_RESIZE, false, NULL, &xo, &to), CM_ERR_SHAPE);
    cr_expect(strstr(cm_last_error(), "(N, C, H, W)"), "%s", cm_last_error());
    cr_expect_eq(cm_resize_batch(x, t, 0.01, CM_RESIZE_MODE_RESIZE, false, NULL, &xo, &to), CM_ERR_SHAPE);
    cr_expect(strstr(cm_last_error(), "leaves nothing"), "%s", cm_last_error());
    cr_expect_eq(cm_resize_batch(x, NULL, 0.5, CM_RESIZE_MODE_RESIZE, true, NULL, &xo, &to), CM_ERR_INVALID_ARG);
    cm_resize_mode mode;
    cr_expect_eq(cm_resize_mode_parse("crop", &mode), CM_OK);
    cr_expect_eq(mode, CM_RESIZE_MODE_CROP);
    cr_expect_eq(cm_resize_mode_parse("bilinear", &mode), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "'resize' or 'crop'"), "%s", cm_last_error());
    cm_tensor_free(x), cm_tensor_free(t);
}

/* ---- SelectiveBackprop ---- */

Test(data_algos, selective_backprop_schedule_losses_and_selection_match_composer) {
    cmt_golden *g = cmt_golden_open(GOLDEN);
    int64_t n;
    double *grid = g_f64(g, "sb.should", &n);
    for (int64_t i = 0; i < n / 4; i++) {
        const double *r = grid + 4 * i;
        cr_expect_eq(cm_should_selective_backprop(r[0], (int64_t)r[1], 0.5, 0.9, (int64_t)r[2]), r[3] != 0,
                     "elapsed %g batch %g interrupt %g", r[0], r[1], r[2]);
    }
    /* per-sample losses: the classifier's cross-entropy without reduction */
    cm_tape *tp = cmt_tape();
    cm_tensor *logits = cmt_golden_on_tape(g, tp, "sb.logits", false), *y = cmt_golden_on_tape(g, tp, "sb.y", false);
    cm_cross_entropy_opts o = cm_cross_entropy_opts_default();
    o.reduction = CM_REDUCTION_NONE;
    cm_tensor *l = cm_cross_entropy(tp, logits, y, &o), *lw = cmt_golden_get(g, "sb.losses");
    cmt_assert_close("per-sample losses", l, lw, 1e-5, 1e-5);
    const char *keeps[] = {"sb_keep50", "sb_keep25", "sb_keep90"};
    const double kv[] = {0.5, 0.25, 0.9};
    for (int c = 0; c < 3; c++) {
        char k[64];
        int64_t nu, ns;
        snprintf(k, sizeof k, "%s.u", keeps[c]);
        double *u = g_f64(g, k, &nu);
        snprintf(k, sizeof k, "%s.select", keeps[c]);
        int64_t *want = g_i64(g, k, &ns), sel[12], got;
        cr_assert_eq(cm_select_using_loss(cm_tensor_data(lw), 12, kv[c], u, NULL, sel, &got), CM_OK, "%s", cm_last_error());
        cr_assert_eq(got, ns, "keep %g: %lld rows, want %lld", kv[c], (long long)got, (long long)ns);
        for (int64_t j = 0; j < ns; j++) cr_expect_eq(sel[j], want[j], "keep %g: draw %lld took row %lld, want %lld", kv[c], (long long)j, (long long)sel[j], (long long)want[j]);
        free(u), free(want);
    }
    cm_tensor_free(lw);
    cm_tape_free(tp);
    free(grid);
    cmt_golden_close(g);
}

Test(data_algos, selection_prefers_high_losses) {
    float losses[100];
    for (int i = 0; i < 100; i++) losses[i] = (float)((i * 37) % 100); /* row i has rank (37·i) mod 100 */
    cm_rng r = cm_rng_init(1, 1);
    double top = 0;
    for (int t = 0; t < 200; t++) {
        int64_t sel[100], k;
        cr_assert_eq(cm_select_using_loss(losses, 100, 0.3, NULL, &r, sel, &k), CM_OK);
        cr_assert_eq(k, 30);
        bool seen[100] = {false};
        for (int64_t j = 0; j < k; j++) {
            cr_assert(!seen[sel[j]], "row %lld drawn twice", (long long)sel[j]);
            seen[sel[j]] = true;
            top += losses[sel[j]] >= 50;
        }
    }
    /* weights (rank+0.5)^(1/0.3-1): about 87% of the mass is in the upper half */
    cr_expect(top / (200 * 30) > 0.75, "share of kept rows from the upper half of losses: %g", top / 6000);
    int64_t sel[4], k;
    cr_expect_eq(cm_select_using_loss(losses, 4, 0.0, NULL, &r, sel, &k), CM_ERR_INVALID_ARG);
    cr_expect_eq(cm_select_using_loss(losses, 0, 0.5, NULL, &r, sel, &k), CM_ERR_INVALID_ARG);
}

Test(data_algos, interpolate_bilinear_matches_torch) {
    cmt_golden *g = cmt_golden_open(GOLDEN);
    const char *names[] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) {
        char k[64];
        int64_t n;
        snprintf(k, sizeof k, "sb_interp_%s.x", names[i]);
        cm_tensor *x = cmt_golden_get(g, k), *o;
        snprintf(k, sizeof k, "sb_interp_%s.scale", names[i]);
        double *s = g_f64(g, k, &n);
        cr_assert_eq(cm_interpolate_bilinear(x, s[0], &o), CM_OK, "%s", cm_last_error());
        snprintf(k, sizeof k, "sb_interp_%s.out", names[i]);
        cm_tensor *w = cmt_golden_get(g, k);
        cmt_assert_close(k, o, w, ATOL, RTOL);
        cm_tensor_free(x), cm_tensor_free(o), cm_tensor_free(w);
        free(s);
    }
    cmt_golden_close(g);
}

/* ---- SeqLengthWarmup ---- */

Test(data_algos, set_batch_sequence_length_matches_composer) {
    cmt_golden *g = cmt_golden_open(GOLDEN);
    const char *names[3] = {"input_ids", "attention_mask", "labels"};
    cm_tensor *f[3];
    for (int i = 0; i < 3; i++) {
        char k[64];
        snprintf(k, sizeof k, "slw.%s", names[i]);
        f[i] = cmt_golden_get(g, k);
    }
    struct {
        const char *name;
        int64_t L;
        bool trunc, pres;
        int64_t rows;
    } cases[] = {{"trunc4", 4, true, false, 3}, {"pres4", 4, true, true, 3}, {"reshape4", 4, false, false, 7},
                 {"reshape3", 3, false, false, 10}, {"long", 12, true, false, 3}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        cm_tensor *o[3];
        int64_t rows;
        cr_assert_eq(cm_set_batch_sequence_length(names, f, 3, cases[c].L, cases[c].trunc, cases[c].pres, o, &rows), CM_OK,
                     "%s: %s", cases[c].name, cm_last_error());
        cr_expect_eq(rows, cases[c].rows, "%s: %lld rows", cases[c].name, (long long)rows);
        for (int i = 0; i < 3; i++) {
            char k[64];
            snprintf(k, sizeof k, "slw_%s.%s", cases[c].name, names[i]);
            cm_tensor *w = cmt_golden_get(g, k);
            cr_expect_eq(cm_tensor_dtype(o[i]), cm_tensor_dtype(w), "%s dtype", k);
            assert_equal(k, o[i], w);
            cm_tensor_free(w), cm_tensor_free(o[i]);
        }
    }
    /* errors: a non-sequence field, reshape without input_ids or with other shapes, no mask */
    cm_tensor *o[3];
    const int64_t s1[1] = {3};
    cm_tensor *lab;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_I64, 1, s1, &lab), CM_OK);
    cm_tensor *f2[2] = {f[0], lab};
    const char *n2[2] = {"input_ids", "label"};
    cr_expect_eq(cm_set_batch_sequence_length(n2, f2, 2, 4, true, false, o, NULL), CM_ERR_SHAPE);
    cr_expect(strstr(cm_last_error(), "'label'") && strstr(cm_last_error(), "(3,)"), "%s", cm_last_error());
    cr_expect_eq(cm_set_batch_sequence_length(n2, f2, 2, 4, false, false, o, NULL), CM_ERR_SHAPE);
    const char *n3[2] = {"ids", "labels"};
    cm_tensor *f3[2] = {f[0], f[2]};
    cr_expect_eq(cm_set_batch_sequence_length(n3, f3, 2, 4, false, false, o, NULL), CM_ERR_NOT_FOUND);
    cr_expect_eq(cm_set_batch_sequence_length(n3, f3, 2, 4, true, true, o, NULL), CM_ERR_NOT_FOUND);
    cr_expect(strstr(cm_last_error(), "attention_mask"), "%s", cm_last_error());
    cr_expect_eq(cm_set_batch_sequence_length(n3, f3, 2, 0, true, false, o, NULL), CM_ERR_INVALID_ARG);
    cm_tensor_free(lab);
    for (int i = 0; i < 3; i++) cm_tensor_free(f[i]);
    cmt_golden_close(g);
}

Test(data_algos, seq_length_warmup_schedule_matches_composer) {
    cmt_golden *g = cmt_golden_open(GOLDEN);
    int64_t n;
    double *s = g_f64(g, "slw.schedule", &n);
    for (int64_t i = 0; i < n / 7; i++) {
        const double *r = s + 7 * i;
        cm_seq_length_warmup_config c = cm_seq_length_warmup_config_default();
        c.duration = r[1], c.min_seq_length = (int64_t)r[2], c.max_seq_length = (int64_t)r[3], c.step_size = (int64_t)r[4];
        const int64_t L = cm_seq_length_warmup_length(&c, (int64_t)r[5], (int64_t)r[0]);
        cr_expect_eq(L, (int64_t)r[6], "total %g duration %g min %g max %g step %g batch %g: %lld, want %g", r[0], r[1],
                     r[2], r[3], r[4], r[5], (long long)L, r[6]);
    }
    free(s);
    cmt_golden_close(g);
    /* where Composer divides by zero: no warmup for duration 0; at least one step per batch */
    cm_seq_length_warmup_config c = cm_seq_length_warmup_config_default();
    c.duration = 0;
    cr_expect_eq(cm_seq_length_warmup_length(&c, 0, 100), 1024);
    c.duration = 0.3, c.min_seq_length = 8, c.max_seq_length = 1024, c.step_size = 8; /* 126 steps in 3 batches */
    cr_expect_eq(cm_seq_length_warmup_length(&c, 0, 10), 8);
    cr_expect_eq(cm_seq_length_warmup_length(&c, 2, 10), 24);
    c.min_seq_length = 8, c.max_seq_length = 12, c.step_size = 8; /* max - min < step_size */
    cr_expect_eq(cm_seq_length_warmup_length(&c, 0, 100), 8);
    cr_expect_eq(cm_seq_length_warmup_length(&c, 30, 100), 12);
}

/* ---- ColOut ---- */

Test(data_algos, colout_keeps_ordered_rows_and_columns_of_input_and_target) {
    const int64_t shape[4] = {2, 3, 10, 20}, ts[3] = {2, 10, 20};
    cm_tensor *x, *t, *xo, *to;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 4, shape, &x), CM_OK);
    cr_assert_eq(cm_tensor_new(CM_DTYPE_I32, 3, ts, &t), CM_OK);
    cm_tensor_arange_fill(x, 0, 1);
    cm_tensor_arange_fill(t, 0, 1);
    cm_rng r = cm_rng_init(9, 9);
    cr_assert_eq(cm_colout_batch(x, t, 0.15, 0.3, &r, &xo, &to), CM_OK, "%s", cm_last_error());
    /* int(0.85·10) = 8 rows, int(0.7·20) = 14 columns */
    cr_assert_eq(cm_tensor_dim(xo, 2), 8);
    cr_assert_eq(cm_tensor_dim(xo, 3), 14);
    cr_assert_eq(cm_tensor_dim(to, 1), 8);
    cr_assert_eq(cm_tensor_dim(to, 2), 14);
    const float *p = cm_tensor_data(xo);
    const int32_t *q = cm_tensor_data(to);
    int64_t rows[8], cols[14];
    for (int64_t i = 0; i < 8; i++) rows[i] = (int64_t)p[i * 14] / 20;
    for (int64_t j = 0; j < 14; j++) cols[j] = (int64_t)p[j] % 20;
    for (int64_t i = 1; i < 8; i++) cr_assert_gt(rows[i], rows[i - 1]);
    for (int64_t j = 1; j < 14; j++) cr_assert_gt(cols[j], cols[j - 1]);
    for (int64_t pl = 0; pl < 6; pl++) /* every image and channel: the same rows and columns */
        for (int64_t i = 0; i < 8; i++)
            for (int64_t j = 0; j < 14; j++) {
                cr_assert_eq(p[(pl * 8 + i) * 14 + j], (float)(pl * 200 + rows[i] * 20 + cols[j]));
                if (pl < 2) cr_assert_eq(q[(pl * 8 + i) * 14 + j], (int32_t)(pl * 200 + rows[i] * 20 + cols[j]));
            }
    cm_tensor_free(xo), cm_tensor_free(to);
    cr_expect_eq(cm_colout_batch(x, NULL, 1.5, 0.1, &r, &xo, NULL), CM_ERR_INVALID_ARG);
    const int64_t bs[3] = {2, 10, 19};
    cm_tensor *bad;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_I32, 3, bs, &bad), CM_OK);
    cr_expect_eq(cm_colout_batch(x, bad, 0.1, 0.1, &r, &xo, &to), CM_ERR_SHAPE);
    cr_expect(strstr(cm_last_error(), "height and width"), "%s", cm_last_error());
    cm_tensor_free(bad), cm_tensor_free(x), cm_tensor_free(t);
}

/* ---- argument errors of the batch functions ---- */

Test(data_algos, mixing_functions_refuse_bad_arguments) {
    const int64_t s4[4] = {3, 1, 4, 4};
    cm_tensor *x, *o, *i;
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 4, s4, &x), CM_OK);
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 4, s4, &o), CM_OK);
    cr_assert_eq(cm_tensor_new(CM_DTYPE_I32, 4, s4, &i), CM_OK);
    int64_t perm[3] = {2, 0, 1}, bad[3] = {0, 3, 1};
    cr_expect_eq(cm_mixup_batch(x, bad, 0.2, o), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "perm[1] = 3"), "%s", cm_last_error());
    cr_expect_eq(cm_mixup_batch(x, perm, 0.2, x), CM_ERR_INVALID_ARG);
    cr_expect_eq(cm_mixup_batch(x, perm, 0.2, i), CM_ERR_SHAPE);
    cr_expect_eq(cm_cutmix_batch(x, perm, (cm_bbox){0, 0, 5, 2}, o), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_last_error(), "4 x 4"), "%s", cm_last_error());
    cr_assert_eq(cm_cutmix_batch(x, perm, (cm_bbox){1, 1, 3, 3}, o), CM_OK);
    cm_tensor *y = new2(3, 2), *t = new2(3, 5);
    cr_expect_eq(cm_mix_targets(y, perm, 0.5, 5, t), CM_ERR_DTYPE); /* dense targets of the wrong width */
    cr_expect(strstr(cm_last_error(), "(3, 2) f32"), "%s", cm_last_error());
    cm_tensor_free(x), cm_tensor_free(o), cm_tensor_free(i), cm_tensor_free(y), cm_tensor_free(t);
}

/* The functional forms read and write host memory: a GPU tensor is refused, never read as host
 * memory (skipped where no GPU, nor the CUDA emulator, is built in). */
Test(data_algos, gpu_tensors_are_refused_by_name) {
    if (cm_device_check(CM_DEVICE_CUDA) != CM_OK) cr_skip_test("no CUDA device: %s", cm_last_error());
    const int64_t s[4] = {2, 1, 4, 4};
    cm_tensor *g, *c;
    cr_assert_eq(cm_tensor_new_on(CM_DEVICE_CUDA, CM_DTYPE_F32, 4, s, &g), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_tensor_new(CM_DTYPE_F32, 4, s, &c), CM_OK);
    int64_t perm[2] = {1, 0};
    cr_expect_eq(cm_mixup_batch(g, perm, 0.3, c), CM_ERR_UNSUPPORTED);
    cr_expect(strstr(cm_last_error(), "cuda") && strstr(cm_last_error(), "CPU tensors"), "%s", cm_last_error());
    cm_rng r = cm_rng_init(1, 1);
    cr_expect_eq(cm_cutout_batch(g, 1, 0.5, false, &r), CM_ERR_UNSUPPORTED);
    cm_tensor_free(g), cm_tensor_free(c);
}
