/* Image values of MDS columns (pil, jpeg, png) to 8-bit (H, W, C) pixels. */
#include "mds_impl.h"

#include <stdio.h> /* before jpeglib.h, which uses FILE */

#include <jpeglib.h>
#include <png.h>
#include <setjmp.h>
#include <string.h>

/* (h, w, cin) 8-bit pixels to (h, w, cout): gray as PIL's convert("L") (ITU-R 601-2: L = R * 299/1000
 * + G * 587/1000 + B * 114/1000, rounded as PIL does with its fixed-point tables), RGB with gray
 * replicated, alpha dropped. cin: 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA. */
static void convert_px(const uint8_t *in, int64_t n, int cin, int cout, uint8_t *out) {
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *p = in + i * cin;
        uint8_t r, g, b;
        if (cin <= 2) r = g = b = p[0];
        else r = p[0], g = p[1], b = p[2];
        if (cout == 1) {
            out[i] = cin <= 2 ? p[0] : (uint8_t)((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
        } else {
            out[3 * i] = r;
            out[3 * i + 1] = g;
            out[3 * i + 2] = b;
        }
    }
}

static cm_status size_err(const char *what, int64_t gh, int64_t gw, int64_t h, int64_t w) {
    return cm_set_error(CM_ERR_FORMAT, "%s image is %lldx%lld (HxW), the field needs %lldx%lld", what, (long long)gh,
                        (long long)gw, (long long)h, (long long)w);
}

typedef struct jerr {
    struct jpeg_error_mgr mgr;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
} jerr;

static void jpeg_fail(j_common_ptr c) {
    jerr *e = (jerr *)c->err;
    (*c->err->format_message)(c, e->msg);
    longjmp(e->jb, 1);
}

static cm_status decode_jpeg(const cm_mds_value *v, int64_t h, int64_t w, int c, uint8_t *out) {
    struct jpeg_decompress_struct d;
    jerr e;
    uint8_t *volatile rowbuf = NULL;
    d.err = jpeg_std_error(&e.mgr);
    e.mgr.error_exit = jpeg_fail;
    if (setjmp(e.jb)) {
        jpeg_destroy_decompress(&d);
        cm_free(rowbuf);
        return cm_set_error(CM_ERR_FORMAT, "jpeg image: %s", e.msg);
    }
    jpeg_create_decompress(&d);
    jpeg_mem_src(&d, v->data, (unsigned long)v->size);
    jpeg_read_header(&d, TRUE);
    if (d.jpeg_color_space == JCS_CMYK || d.jpeg_color_space == JCS_YCCK) {
        jpeg_destroy_decompress(&d);
        return cm_set_error(CM_ERR_UNSUPPORTED, "jpeg image: CMYK JPEGs are not decoded here");
    }
    d.out_color_space = c == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_start_decompress(&d);
    if ((int64_t)d.output_height != h || (int64_t)d.output_width != w) {
        int64_t gh = d.output_height, gw = d.output_width;
        jpeg_destroy_decompress(&d);
        return size_err("jpeg", gh, gw, h, w);
    }
    while (d.output_scanline < d.output_height) {
        JSAMPROW row = out + (size_t)d.output_scanline * (size_t)w * (size_t)c;
        jpeg_read_scanlines(&d, &row, 1);
    }
    jpeg_finish_decompress(&d);
    jpeg_destroy_decompress(&d);
    return CM_OK;
}

typedef struct png_src {
    const uint8_t *p;
    size_t n, at;
} png_src;

static void png_read_mem(png_structp png, png_bytep dst, png_size_t len) {
    png_src *s = png_get_io_ptr(png);
    if (s->n - s->at < len) png_error(png, "truncated PNG data");
    memcpy(dst, s->p + s->at, len);
    s->at += len;
}

static void png_err(png_structp png, png_const_charp msg) {
    char *buf = png_get_error_ptr(png);
    snprintf(buf, 200, "%s", msg);
    png_longjmp(png, 1);
}

static cm_status decode_png(const cm_mds_value *v, int64_t h, int64_t w, int c, uint8_t *out) {
    char msg[200] = "";
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, msg, png_err, NULL);
    if (!png) return CM_ERR_OOM;
    png_infop info = png_create_info_struct(png);
    uint8_t *volatile px = NULL;
    png_bytep *volatile rows = NULL;
    png_src src = {v->data, v->size, 0};
    if (!info) {
        png_destroy_read_struct(&png, NULL, NULL);
        return CM_ERR_OOM;
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_read_struct(&png, &info, NULL);
        cm_free(px);
        cm_free(rows);
        return cm_set_error(CM_ERR_FORMAT, "png image: %s", msg[0] ? msg : "corrupt data");
    }
    png_set_read_fn(png, &src, png_read_mem);
    png_read_info(png, info);
    int depth = png_get_bit_depth(png, info), ct = png_get_color_type(png, info);
    int64_t gh = png_get_image_height(png, info), gw = png_get_image_width(png, info);
    if (depth == 16) {
        png_destroy_read_struct(&png, &info, NULL);
        return cm_set_error(CM_ERR_UNSUPPORTED, "png image: 16-bit PNGs are not decoded here");
    }
    if (gh != h || gw != w) {
        png_destroy_read_struct(&png, &info, NULL);
        return size_err("png", gh, gw, h, w);
    }
    if (ct == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (ct == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (png_get_valid(png, info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    int cin = png_get_channels(png, info);
    size_t rb = png_get_rowbytes(png, info);
    px = cm_alloc(rb * (size_t)h, 64);
    rows = cm_alloc(sizeof(png_bytep) * (size_t)h, 16);
    if (!px || !rows) png_error(png, "out of memory");
    for (int64_t y = 0; y < h; y++) rows[y] = px + (size_t)y * rb;
    png_read_image(png, rows);
    png_read_end(png, NULL);
    png_destroy_read_struct(&png, &info, NULL);
    convert_px(px, h * w, cin, c, out);
    cm_free(px);
    cm_free(rows);
    return CM_OK;
}

cm_status cm_mds_image_decode(cm_mds_kind kind, const cm_mds_value *v, int64_t h, int64_t w, int c, uint8_t *out) {
    if (c != 1 && c != 3) return cm_set_error(CM_ERR_INVALID_ARG, "image decode: %d channels (use 1 or 3)", c);
    if (kind == CM_MDS_JPEG) return decode_jpeg(v, h, w, c, out);
    if (kind == CM_MDS_PNG) return decode_png(v, h, w, c, out);
    if (kind != CM_MDS_PIL) return cm_set_error(CM_ERR_INVALID_ARG, "image decode: encoding %d is not pil, jpeg or png", (int)kind);
    if (!v->mode) return cm_set_error(CM_ERR_INVALID_ARG, "image decode: a pil value without its mode");
    int cin = !strcmp(v->mode, "L") ? 1 : !strcmp(v->mode, "LA") ? 2 : !strcmp(v->mode, "RGB") ? 3 : !strcmp(v->mode, "RGBA") ? 4 : 0;
    if (!cin)
        return cm_set_error(CM_ERR_UNSUPPORTED, "pil image of mode '%s': only L, LA, RGB and RGBA are decoded here", v->mode);
    if (v->ndim != 2 || v->shape[0] != h || v->shape[1] != w) return size_err("pil", v->shape[0], v->shape[1], h, w);
    if (v->size != (size_t)(h * w * cin)) return cm_set_error(CM_ERR_FORMAT, "pil image: %zu bytes of pixels for %lldx%lld %s", v->size, (long long)h, (long long)w, v->mode);
    convert_px(v->data, h * w, cin, c, out);
    return CM_OK;
}
