/* Sharded checkpoints in one process: the span layout, and the reader of a checkpoint whose
 * tensors are split into pieces over per-rank files (written here by hand, as two ranks would):
 * ranges read across piece boundaries, whole tensors assembled by export, gaps, overlaps,
 * missing rank files and corrupt pieces reported by name, and a corrupt piece noticed only by a
 * read that touches it. The multi-rank save and resume are in tests/dist (dist_ckpt). */
#include "checkpoint/ckpt_impl.h"
#include "cmtest.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

Test(ckpt_sharded, shard_range_follows_the_span_layout) {
    /* chunk = ceil(numel / w); the last ranks may hold less or nothing */
    const struct {
        int64_t numel;
        int w, r;
        int64_t b, e;
    } c[] = {{10, 4, 0, 0, 3}, {10, 4, 1, 3, 6}, {10, 4, 2, 6, 9}, {10, 4, 3, 9, 10}, {2, 4, 1, 1, 2},
             {2, 4, 2, 2, 2},  {2, 4, 3, 2, 2},  {0, 3, 0, 0, 0},  {208, 3, 2, 140, 208}, {7, 1, 0, 0, 7}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        int64_t b, e;
        cmi_shard_range(c[i].numel, c[i].w, c[i].r, &b, &e);
        cr_assert(b == c[i].b && e == c[i].e, "numel %lld over %d ranks, rank %d: got [%lld, %lld), want [%lld, %lld)",
                  (long long)c[i].numel, c[i].w, c[i].r, (long long)b, (long long)e, (long long)c[i].b,
                  (long long)c[i].e);
    }
    /* the pieces of all ranks tile [0, numel) */
    for (int64_t n = 0; n < 40; n++)
        for (int w = 1; w <= 9; w++) {
            int64_t at = 0;
            for (int r = 0; r < w; r++) {
                int64_t b, e;
                cmi_shard_range(n, w, r, &b, &e);
                cr_assert(b == at && e >= b, "numel %lld, %d ranks: rank %d starts at %lld, want %lld", (long long)n, w,
                          r, (long long)b, (long long)at);
                at = e;
            }
            cr_assert_eq(at, n, "numel %lld over %d ranks covers %lld", (long long)n, w, (long long)at);
        }
}

/* ---- a hand-made 2-rank checkpoint ---- */

typedef struct piece {
    const char *name;
    cm_st_dtype dt;
    int gndim;
    int64_t gshape[2];
    int64_t begin, end;
    const void *data; /* the whole tensor: the piece is data[begin, end) */
} piece;

static float g_w[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}; /* "w" (2, 5) */
static float g_b[3] = {100, 101, 102};                  /* "b" (3,) */
static float g_m[10] = {.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f, 6.5f, 7.5f, 8.5f, 9.5f};
static int64_t g_step = 7;

static void write_rank_file(const char *dir, const char *fname, const piece *ps, int n, cJSON *files) {
    cm_safetensors_writer *w;
    cr_assert_eq(cm_safetensors_writer_new(&w), CM_OK);
    cJSON *fo = cJSON_AddObjectToObject(files, fname), *tl = cJSON_AddObjectToObject(fo, "tensors");
    for (int i = 0; i < n; i++) {
        const size_t es = (size_t)cm_st_dtype_bits(ps[i].dt) / 8;
        const char *p = (const char *)ps[i].data + (size_t)ps[i].begin * es;
        const int64_t len = ps[i].end - ps[i].begin;
        const size_t nb = (size_t)len * es;
        cr_assert_eq(cm_safetensors_writer_add_raw(w, ps[i].name, ps[i].dt, 1, &len, p, nb), CM_OK, "%s", cm_last_error());
        cJSON *t = cJSON_AddObjectToObject(tl, ps[i].name);
        char hex[17];
        snprintf(hex, sizeof hex, "%016" PRIx64, cm_hash64(p, nb, 0));
        cJSON_AddStringToObject(t, "dtype", cm_st_dtype_name(ps[i].dt));
        cJSON_AddItemToObject(t, "shape", cJSON_CreateIntArray((int[]){(int)len}, 1));
        cJSON_AddNumberToObject(t, "nbytes", (double)nb);
        cJSON_AddStringToObject(t, "xxh3", hex);
        int gs[2] = {(int)ps[i].gshape[0], (int)ps[i].gshape[1]};
        cJSON_AddItemToObject(t, "global_shape", cJSON_CreateIntArray(gs, ps[i].gndim));
        cJSON_AddItemToObject(t, "range", cJSON_CreateIntArray((int[]){(int)ps[i].begin, (int)ps[i].end}, 2));
    }
    cJSON_AddNumberToObject(fo, "size", (double)cm_safetensors_writer_size(w));
    char *path = cmi_path_join(dir, fname);
    cr_assert_eq(cm_safetensors_writer_write(w, path), CM_OK, "%s", cm_last_error());
    cm_free(path);
    cm_safetensors_writer_free(w);
}

/* w (2, 5): rank 0 [0, w_split), rank 1 [w_from1, 10); b: [0, 2) and [2, 3); the optimizer's
 * "u.exp_avg" (10,) [0, 5) and [5, 10), "u.step" (1,) on rank 0. skip_opt1: rank 1 has no
 * optimizer file. */
static char *make_ckpt(int64_t w_split, int64_t w_from1, bool skip_opt1) {
    static char dir[] = "/tmp/cm_shck_XXXXXX";
    char *d = cm_alloc(sizeof dir, 1);
    memcpy(d, dir, sizeof dir);
    cr_assert(mkdtemp(d));
    cJSON *m = cJSON_CreateObject(), *files = cJSON_CreateObject();
    cJSON_AddNumberToObject(m, "format_version", CM_CKPT_FORMAT_VERSION);
    cJSON_AddStringToObject(m, "run_name", "hand-made");
    cJSON_AddNumberToObject(m, "world_size", 2);
    cJSON_AddStringToObject(m, "layout", "sharded");
    cJSON_AddBoolToObject(m, "weights_only", false);
    cm_timestamp ts = {0};
    ts.batch = 3;
    cJSON_AddItemToObject(m, "timestamp", cmi_timestamp_to_json(&ts));
    const piece m0[] = {{"w", CM_ST_DTYPE_F32, 2, {2, 5}, 0, w_split, g_w}, {"b", CM_ST_DTYPE_F32, 1, {3, 0}, 0, 2, g_b}};
    const piece m1[] = {{"w", CM_ST_DTYPE_F32, 2, {2, 5}, w_from1, 10, g_w}, {"b", CM_ST_DTYPE_F32, 1, {3, 0}, 2, 3, g_b}};
    const piece o0[] = {{"u.exp_avg", CM_ST_DTYPE_F32, 1, {10, 0}, 0, 5, g_m}, {"u.step", CM_ST_DTYPE_I64, 1, {1, 0}, 0, 1, &g_step}};
    const piece o1[] = {{"u.exp_avg", CM_ST_DTYPE_F32, 1, {10, 0}, 5, 10, g_m}};
    write_rank_file(d, "model-rank0-of-2.safetensors", m0, 2, files);
    write_rank_file(d, "optimizer-rank0-of-2.safetensors", o0, 2, files);
    write_rank_file(d, "model-rank1-of-2.safetensors", m1, 2, files);
    if (!skip_opt1) write_rank_file(d, "optimizer-rank1-of-2.safetensors", o1, 1, files);
    cJSON_AddItemToObject(m, "files", files);
    char *text;
    size_t len;
    cr_assert_eq(cmi_manifest_serialize(m, &text, &len), CM_OK);
    char *mp = cmi_path_join(d, CM_CKPT_MANIFEST);
    cr_assert_eq(cmi_write_file_sync(mp, text, len), CM_OK);
    cm_free(mp);
    cm_free(text);
    cJSON_Delete(m);
    return d;
}

static void expect_open_error(const char *dir, const char *want) {
    cm_checkpoint *ck;
    cm_status s = cm_checkpoint_open(dir, &ck);
    cr_assert_eq(s, CM_ERR_FORMAT, "open of '%s' gave %d: %s", dir, (int)s, cm_last_error());
    cr_assert(strstr(cm_last_error(), want), "message '%s' lacks '%s'", cm_last_error(), want);
}

Test(ckpt_sharded, reads_ranges_across_pieces_and_exports_whole_tensors) {
    char *d = make_ckpt(6, 6, false);
    cm_checkpoint *ck;
    cr_assert_eq(cm_checkpoint_open(d, &ck), CM_OK, "%s", cm_last_error());
    cr_assert(cm_checkpoint_sharded(ck));
    cr_assert_eq(cm_checkpoint_world_size(ck), 2);
    cr_assert_eq(cm_checkpoint_verify(ck), CM_OK, "%s", cm_last_error());
    cmi_ck_global g;
    cr_assert(cmi_ck_find(ck, CMI_CK_KIND_MODEL, "w", &g));
    cr_assert(g.ndim == 2 && g.shape[0] == 2 && g.shape[1] == 5 && g.numel == 10 && g.n_pieces == 2);
    cr_assert(!cmi_ck_find(ck, CMI_CK_KIND_MODEL, "u.exp_avg", &g), "optimizer tensors are not model tensors");
    cr_assert_eq(cmi_ck_n_global(ck, CMI_CK_KIND_MODEL), 2);
    cr_assert_eq(cmi_ck_n_global(ck, CMI_CK_KIND_OPTIM), 2);
    float got[10];
    cr_assert_eq(cmi_ck_read_range(ck, CMI_CK_KIND_MODEL, "w", 4, 8, got), CM_OK, "%s", cm_last_error());
    for (int i = 0; i < 4; i++) cr_assert_eq(got[i], g_w[4 + i], "w[%d]: %g, want %g", 4 + i, got[i], g_w[4 + i]);
    cr_assert_eq(cmi_ck_read_range(ck, CMI_CK_KIND_OPTIM, "u.exp_avg", 0, 10, got), CM_OK);
    cmt_assert_close_f32("u.exp_avg", got, g_m, 10, 0, 0);
    int64_t step = 0;
    cr_assert_eq(cmi_ck_read_range(ck, CMI_CK_KIND_OPTIM, "u.step", 0, 1, &step), CM_OK);
    cr_assert_eq(step, 7);
    cr_assert_eq(cmi_ck_read_range(ck, CMI_CK_KIND_MODEL, "w", 8, 11, got), CM_ERR_INVALID_ARG);
    cr_assert_eq(cmi_ck_read_range(ck, CMI_CK_KIND_MODEL, "nope", 0, 1, got), CM_ERR_NOT_FOUND);

    char *out = cmi_path_join(d, "export.safetensors");
    cr_assert_eq(cm_checkpoint_export_model(ck, out), CM_OK, "%s", cm_last_error());
    cm_safetensors *st;
    cr_assert_eq(cm_safetensors_open(out, &st), CM_OK);
    cr_assert_eq(cm_safetensors_count(st), 2);
    const cm_st_tensor *w = cm_safetensors_find(st, "w"), *b = cm_safetensors_find(st, "b");
    cr_assert(w && w->ndim == 2 && w->shape[0] == 2 && w->shape[1] == 5 && w->nbytes == sizeof g_w);
    cr_assert(b && b->ndim == 1 && b->shape[0] == 3);
    cr_assert(!memcmp(w->data, g_w, sizeof g_w) && !memcmp(b->data, g_b, sizeof g_b));
    cr_assert_str_eq(cm_safetensors_metadata_get(st, "format"), "pt");
    cm_safetensors_close(st);
    char sum[4096];
    cm_checkpoint_summary(ck, sum, sizeof sum);
    cr_assert(strstr(sum, "layout      sharded, saved by 2 ranks"), "%s", sum);
    cr_assert(strstr(sum, "[6, 10) of (2, 5)"), "%s", sum);
    cm_checkpoint_close(ck);
    cmi_remove_tree(d);
    cm_free(out);
    cm_free(d);
}

Test(ckpt_sharded, a_gap_or_an_overlap_between_pieces_is_named) {
    char *d = make_ckpt(6, 7, false);
    expect_open_error(d, "tensor 'w' has no piece holding elements [6, 7)");
    cmi_remove_tree(d);
    cm_free(d);
    d = make_ckpt(7, 6, false);
    expect_open_error(d, "tensor 'w' has two pieces holding elements [6, 7)");
    cmi_remove_tree(d);
    cm_free(d);
    d = make_ckpt(4, 4, false);
    cm_checkpoint *ck;
    cr_assert_eq(cm_checkpoint_open(d, &ck), CM_OK, "uneven pieces are fine: %s", cm_last_error());
    cm_checkpoint_close(ck);
    cmi_remove_tree(d);
    cm_free(d);
}

Test(ckpt_sharded, a_missing_rank_file_is_named) {
    char *d = make_ckpt(6, 6, true);
    expect_open_error(d, "(saved by 2 ranks) does not list 'optimizer-rank1-of-2.safetensors'");
    cmi_remove_tree(d);
    cm_free(d);
    d = make_ckpt(6, 6, false);
    char *p = cmi_path_join(d, "model-rank1-of-2.safetensors");
    cr_assert_eq(unlink(p), 0);
    expect_open_error(d, "'model-rank1-of-2.safetensors' is missing");
    cm_free(p);
    cmi_remove_tree(d);
    cm_free(d);
}

Test(ckpt_sharded, a_corrupt_piece_is_found_by_the_reads_that_touch_it) {
    char *d = make_ckpt(6, 6, false);
    char *p = cmi_path_join(d, "model-rank1-of-2.safetensors");
    cm_safetensors *st;
    cr_assert_eq(cm_safetensors_open(p, &st), CM_OK);
    const long off = (long)(8 + cm_safetensors_header_len(st) + cm_safetensors_find(st, "w")->begin + 1);
    cm_safetensors_close(st);
    FILE *f = fopen(p, "r+b");
    cr_assert(f);
    fseek(f, off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(c ^ 0x40, f);
    fclose(f);
    cm_checkpoint *ck;
    cr_assert_eq(cm_checkpoint_open(d, &ck), CM_OK, "open checks structure only: %s", cm_last_error());
    float got[10];
    cr_assert_eq(cmi_ck_read_range(ck, CMI_CK_KIND_MODEL, "w", 0, 6, got), CM_OK, "rank 0's piece is intact");
    cr_assert_eq(cmi_ck_read_range(ck, CMI_CK_KIND_MODEL, "w", 5, 7, got), CM_ERR_FORMAT);
    cr_assert(strstr(cm_last_error(), "tensor 'w' in 'model-rank1-of-2.safetensors' is corrupt"), "%s", cm_last_error());
    cr_assert_eq(cm_checkpoint_verify(ck), CM_ERR_FORMAT);
    cm_checkpoint_close(ck);
    cm_free(p);
    cmi_remove_tree(d);
    cm_free(d);
}
