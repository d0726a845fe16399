/* The Pillow operations of AugMix and RandAugment on u8 images (C, H, W), C = 1 ("L") or 3
 * ("RGB"), written after Pillow 9's C code (libImaging) so results agree pixel for pixel:
 * ImageOps.autocontrast / equalize / posterize / solarize (look-up tables per band),
 * Image.rotate and Image.transform(AFFINE) with bilinear resampling (Geometry.c: source
 * coordinates of the pixel centre, outside pixels black, truncated to u8), and ImageEnhance's
 * Color / Contrast / Brightness / Sharpness (Image.blend of a degenerate image: the "L" conversion
 * with Pillow's fixed-point weights, the rounded mean, black, ImageFilter.SMOOTH). */
/* Pillow and numpy round every product and sum: no fused multiply-adds here (the compiler would
 * contract a·b + c under -march=native, and a pixel would differ by one in a few hundred). */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "plugins/data_algos/da_impl.h"

#include <math.h>
#include <stdlib.h>

static cm_status check(const char *who, const uint8_t *in, int64_t C, int64_t H, int64_t W, const uint8_t *out) {
    if (!in || !out) return cm_set_error(CM_ERR_INVALID_ARG, "%s: NULL image", who);
    if ((C != 1 && C != 3) || H < 1 || W < 1)
        return cm_set_error(CM_ERR_SHAPE, "%s: the image is (%lld, %lld, %lld); the operations take u8 images (C, H, W) "
                                          "with C = 1 (L) or 3 (RGB)",
                            who, (long long)C, (long long)H, (long long)W);
    return CM_OK;
}

static cm_status check_distinct(const char *who, const uint8_t *in, const uint8_t *out, size_t n) {
    if (in < out + n && out < in + n)
        return cm_set_error(CM_ERR_INVALID_ARG, "%s: in and out overlap (use a separate output)", who);
    return CM_OK;
}

/* Applies a per-band look-up table lut[c][256]. */
static void apply_lut(const uint8_t *in, int64_t C, int64_t hw, const uint8_t (*lut)[256], uint8_t *out) {
    for (int64_t c = 0; c < C; c++)
        for (int64_t i = 0; i < hw; i++) out[c * hw + i] = lut[c][in[c * hw + i]];
}

static void histogram(const uint8_t *plane, int64_t n, int64_t h[256]) {
    memset(h, 0, sizeof(int64_t) * 256);
    for (int64_t i = 0; i < n; i++) h[plane[i]]++;
}

cm_status cm_pil_autocontrast(const uint8_t *in, int64_t C, int64_t H, int64_t W, uint8_t *out) {
    cm_status s = check("autocontrast", in, C, H, W, out);
    if (s) return s;
    uint8_t lut[3][256];
    int64_t h[256];
    for (int64_t c = 0; c < C; c++) {
        histogram(in + c * H * W, H * W, h);
        int lo = 0, hi = 255;
        while (lo < 255 && !h[lo]) lo++;
        while (hi > 0 && !h[hi]) hi--;
        for (int i = 0; i < 256; i++) lut[c][i] = (uint8_t)i;
        if (hi <= lo) continue;
        const double scale = 255.0 / (hi - lo), offset = -lo * scale;
        for (int i = 0; i < 256; i++) {
            const int v = (int)(i * scale + offset); /* Python's int(): toward zero */
            lut[c][i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
    }
    apply_lut(in, C, H * W, (const uint8_t(*)[256])lut, out);
    return CM_OK;
}

cm_status cm_pil_equalize(const uint8_t *in, int64_t C, int64_t H, int64_t W, uint8_t *out) {
    cm_status s = check("equalize", in, C, H, W, out);
    if (s) return s;
    uint8_t lut[3][256];
    int64_t h[256];
    for (int64_t c = 0; c < C; c++) {
        histogram(in + c * H * W, H * W, h);
        for (int i = 0; i < 256; i++) lut[c][i] = (uint8_t)i;
        int64_t total = 0, last = 0, nonzero = 0;
        for (int i = 0; i < 256; i++)
            if (h[i]) total += h[i], last = h[i], nonzero++;
        if (nonzero <= 1) continue;
        const int64_t step = (total - last) / 255;
        if (!step) continue;
        int64_t n = step / 2;
        for (int i = 0; i < 256; i++) {
            const int64_t v = n / step; /* Image.point clips the table to [0, 255] */
            lut[c][i] = (uint8_t)(v > 255 ? 255 : v);
            n += h[i];
        }
    }
    apply_lut(in, C, H * W, (const uint8_t(*)[256])lut, out);
    return CM_OK;
}

cm_status cm_pil_posterize(const uint8_t *in, int64_t C, int64_t H, int64_t W, int bits, uint8_t *out) {
    cm_status s = check("posterize", in, C, H, W, out);
    if (s) return s;
    if (bits < 0 || bits > 8) return cm_set_error(CM_ERR_INVALID_ARG, "posterize: bits %d must be in [0, 8]", bits);
    const uint8_t mask = (uint8_t)~((1u << (8 - bits)) - 1u);
    for (int64_t i = 0; i < C * H * W; i++) out[i] = in[i] & mask;
    return CM_OK;
}

cm_status cm_pil_solarize(const uint8_t *in, int64_t C, int64_t H, int64_t W, int threshold, uint8_t *out) {
    cm_status s = check("solarize", in, C, H, W, out);
    if (s) return s;
    for (int64_t i = 0; i < C * H * W; i++) out[i] = in[i] < threshold ? in[i] : (uint8_t)(255 - in[i]);
    return CM_OK;
}

/* Geometry.c's bilinear filter at source point (xin, yin) of plane p (H × W); false outside. */
static bool bilinear(const uint8_t *p, int64_t H, int64_t W, double xin, double yin, uint8_t *v) {
    if (xin < 0.0 || xin >= (double)W || yin < 0.0 || yin >= (double)H) return false;
    xin -= 0.5, yin -= 0.5;
    const int64_t x = (int64_t)floor(xin), y = (int64_t)floor(yin);
    const double dx = xin - (double)x, dy = yin - (double)y;
#define CLIP(v, n) ((v) < 0 ? 0 : (v) < (n) ? (v) : (n) - 1)
    const int64_t x0 = CLIP(x, W), x1 = CLIP(x + 1, W);
    const uint8_t *r = p + CLIP(y, H) * W;
#undef CLIP
    double v1 = r[x0] + ((double)r[x1] - r[x0]) * dx, v2 = v1;
    if (y + 1 >= 0 && y + 1 < H) {
        r = p + (y + 1) * W;
        v2 = r[x0] + ((double)r[x1] - r[x0]) * dx;
    }
    *v = (uint8_t)(v1 + (v2 - v1) * dy);
    return true;
}

cm_status cm_pil_affine(const uint8_t *in, int64_t C, int64_t H, int64_t W, const double a[6], uint8_t *out) {
    cm_status s = check("affine", in, C, H, W, out);
    if (!s) s = check_distinct("affine", in, out, (size_t)(C * H * W));
    if (s) return s;
    if (!a) return cm_set_error(CM_ERR_INVALID_ARG, "affine: NULL matrix");
    for (int64_t y = 0; y < H; y++)
        for (int64_t x = 0; x < W; x++) {
            /* the source of the output pixel's centre */
            const double xi = x + 0.5, yi = y + 0.5;
            const double xs = a[0] * xi + a[1] * yi + a[2], ys = a[3] * xi + a[4] * yi + a[5];
            for (int64_t c = 0; c < C; c++) {
                uint8_t v;
                out[(c * H + y) * W + x] = bilinear(in + c * H * W, H, W, xs, ys, &v) ? v : 0;
            }
        }
    return CM_OK;
}

/* Python's round(x, 15) for the rotation matrix, as Image.rotate rounds it: the exact decimal
 * value rounded half to even (glibc's printf), read back correctly rounded. */
static double round15(double x) {
    char buf[64];
    snprintf(buf, sizeof buf, "%.15f", x);
    return strtod(buf, NULL);
}

cm_status cm_pil_rotate(const uint8_t *in, int64_t C, int64_t H, int64_t W, double degrees, uint8_t *out) {
    cm_status s = check("rotate", in, C, H, W, out);
    if (s) return s;
    double angle = fmod(degrees, 360.0);
    if (angle < 0) angle += 360.0; /* Python's % */
    if (angle == 0) {
        memcpy(out, in, (size_t)(C * H * W));
        return CM_OK;
    }
    /* Image.rotate's inverse matrix about the centre (w/2, h/2); its 180° and (square) 90°/270°
     * fast paths are the same resampling at exact angles up to the last bit of cos and sin, which
     * round(·, 15) already makes exact */
    const double r = -angle * M_PI / 180.0;
    double m[6] = {round15(cos(r)), round15(sin(r)), 0.0, round15(-sin(r)), round15(cos(r)), 0.0};
    const double cx = (double)W / 2.0, cy = (double)H / 2.0;
    m[2] = m[0] * -cx + m[1] * -cy + m[2] + cx;
    m[5] = m[3] * -cx + m[4] * -cy + m[5] + cy;
    return cm_pil_affine(in, C, H, W, m, out);
}

/* Image.blend(degenerate, image, factor): ImagingBlend with a float alpha; interpolation
 * truncates, extrapolation clips. */
static void blend(const uint8_t *deg, const uint8_t *img, int64_t n, double factor, uint8_t *out) {
    const float alpha = (float)factor;
    if (alpha >= 0 && alpha <= 1.0f) {
        for (int64_t i = 0; i < n; i++) out[i] = (uint8_t)((int)deg[i] + alpha * ((int)img[i] - (int)deg[i]));
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        const float t = (float)((int)deg[i] + alpha * ((int)img[i] - (int)deg[i]));
        out[i] = t <= 0.0f ? 0 : t >= 255.0f ? 255 : (uint8_t)t;
    }
}

/* image.convert("L"): Pillow's L = (R·19595 + G·38470 + B·7471 + 0x8000) >> 16. */
static void to_gray(const uint8_t *in, int64_t C, int64_t hw, uint8_t *g) {
    if (C == 1) {
        memcpy(g, in, (size_t)hw);
        return;
    }
    for (int64_t i = 0; i < hw; i++)
        g[i] = (uint8_t)(((uint32_t)in[i] * 19595u + (uint32_t)in[hw + i] * 38470u + (uint32_t)in[2 * hw + i] * 7471u +
                          0x8000u) >> 16);
}

typedef enum { ENH_COLOR, ENH_CONTRAST, ENH_BRIGHTNESS, ENH_SHARPNESS } enhance_kind;

/* ImageFilter.SMOOTH (3×3 kernel 1 1 1 / 1 5 1 / 1 1 1 over 13) on one plane: border pixels copied,
 * float sums row y+1, y, y-1 from an offset of 0.5, clipped and truncated (Filter.c). */
static void smooth(const uint8_t *p, int64_t H, int64_t W, uint8_t *o) {
    const float k[9] = {1.0f / 13, 1.0f / 13, 1.0f / 13, 1.0f / 13, 5.0f / 13, 1.0f / 13, 1.0f / 13, 1.0f / 13, 1.0f / 13};
    memcpy(o, p, (size_t)(H * W));
    for (int64_t y = 1; y < H - 1; y++)
        for (int64_t x = 1; x < W - 1; x++) {
            float ss = 0.5f;
            const int64_t rows[3] = {y + 1, y, y - 1};
            for (int r = 0; r < 3; r++) {
                const uint8_t *q = p + rows[r] * W + x;
                ss += (float)q[-1] * k[3 * r] + (float)q[0] * k[3 * r + 1] + (float)q[1] * k[3 * r + 2];
            }
            o[y * W + x] = ss <= 0.0f ? 0 : ss >= 255.0f ? 255 : (uint8_t)ss;
        }
}

static cm_status enhance(const char *who, enhance_kind kind, const uint8_t *in, int64_t C, int64_t H, int64_t W,
                         double factor, uint8_t *out) {
    cm_status s = check(who, in, C, H, W, out);
    if (s) return s;
    if (!isfinite(factor)) return cm_set_error(CM_ERR_INVALID_ARG, "%s: factor %g must be finite", who, factor);
    const int64_t hw = H * W, n = C * hw;
    uint8_t *deg = cm_alloc((size_t)(n + hw), 16);
    if (!deg) return cm_set_error(CM_ERR_OOM, "%s: out of memory", who);
    uint8_t *g = deg + n;
    switch (kind) {
    case ENH_COLOR: /* convert("L").convert(mode) */
        to_gray(in, C, hw, g);
        for (int64_t c = 0; c < C; c++) memcpy(deg + c * hw, g, (size_t)hw);
        break;
    case ENH_CONTRAST: { /* a flat image of the rounded mean of the "L" image */
        to_gray(in, C, hw, g);
        int64_t h[256];
        histogram(g, hw, h);
        double sum = 0;
        for (int i = 0; i < 256; i++) sum += (double)i * (double)h[i];
        memset(deg, (int)(sum / (double)hw + 0.5), (size_t)n);
        break;
    }
    case ENH_BRIGHTNESS: memset(deg, 0, (size_t)n); break;
    case ENH_SHARPNESS:
        for (int64_t c = 0; c < C; c++) smooth(in + c * hw, H, W, deg + c * hw);
        break;
    }
    blend(deg, in, n, factor, out);
    cm_free(deg);
    return CM_OK;
}

cm_status cm_pil_color(const uint8_t *in, int64_t C, int64_t H, int64_t W, double f, uint8_t *out) {
    return enhance("color", ENH_COLOR, in, C, H, W, f, out);
}
cm_status cm_pil_contrast(const uint8_t *in, int64_t C, int64_t H, int64_t W, double f, uint8_t *out) {
    return enhance("contrast", ENH_CONTRAST, in, C, H, W, f, out);
}
cm_status cm_pil_brightness(const uint8_t *in, int64_t C, int64_t H, int64_t W, double f, uint8_t *out) {
    return enhance("brightness", ENH_BRIGHTNESS, in, C, H, W, f, out);
}
cm_status cm_pil_sharpness(const uint8_t *in, int64_t C, int64_t H, int64_t W, double f, uint8_t *out) {
    return enhance("sharpness", ENH_SHARPNESS, in, C, H, W, f, out);
}
