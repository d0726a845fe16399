/* The llm.c token file writer: header bytes, uint16/uint32 choice, atomic replacement, errors. */
#include "cmtest.h"

#include <composer/tokenizer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint8_t *slurp(const char *path, size_t *len) { return (uint8_t *)cmt_read_file(path, len); }

static uint32_t le32(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }

Test(token_file, uint16_layout_is_llmc_compatible) {
    char dir[] = "/tmp/cm_tf_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[64];
    snprintf(path, sizeof path, "%s/train.bin", dir);
    const int32_t ids[3] = {1, 65535, 258};
    cr_assert_eq(cm_token_file_write(path, ids, 3, CM_TOKEN_WIDTH_AUTO), CM_OK, "%s", cm_last_error());
    size_t len;
    uint8_t *b = slurp(path, &len);
    cr_assert_eq(len, 1024 + 6);
    cr_assert_eq(le32(b), 20240520u);
    cr_assert_eq(le32(b + 4), 1u);
    cr_assert_eq(le32(b + 8), 3u);
    for (int i = 3; i < 256; i++) cr_assert_eq(le32(b + 4 * i), 0u, "header int %d is not 0", i);
    static const uint8_t tail[6] = {1, 0, 0xFF, 0xFF, 2, 1};
    cr_assert(memcmp(b + 1024, tail, 6) == 0, "token bytes differ");
    free(b);
    /* rewriting replaces the file and leaves no temporary files behind */
    const int32_t big[2] = {70000, 5};
    cr_assert_eq(cm_token_file_write(path, big, 2, CM_TOKEN_WIDTH_AUTO), CM_OK);
    b = slurp(path, &len);
    cr_assert(len == 1024 + 8 && le32(b + 4) == 2 && le32(b + 1024) == 70000 && le32(b + 1028) == 5);
    free(b);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "test $(ls %s | wc -l) -eq 1", dir);
    cr_assert_eq(system(cmd), 0, "temporary files were left in %s", dir);
    /* forced uint32 for small ids; empty files are valid */
    cr_assert_eq(cm_token_file_write(path, ids, 0, CM_TOKEN_WIDTH_U32), CM_OK);
    b = slurp(path, &len);
    cr_assert(len == 1024 && le32(b + 4) == 2 && le32(b + 8) == 0);
    free(b);
    unlink(path);
    rmdir(dir);
}

Test(token_file, bad_ids_and_paths_are_named) {
    const int32_t neg[2] = {3, -1};
    cr_assert_eq(cm_token_file_write("/tmp/cm_tf_never.bin", neg, 2, CM_TOKEN_WIDTH_AUTO), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "token 1") && strstr(cm_last_error(), "/tmp/cm_tf_never.bin"), "%s", cm_last_error());
    const int32_t big[1] = {65536};
    cr_assert_eq(cm_token_file_write("/tmp/cm_tf_never.bin", big, 1, CM_TOKEN_WIDTH_U16), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "65536"), "%s", cm_last_error());
    cr_assert_eq(cm_token_file_write("/nonexistent/dir/train.bin", big, 1, CM_TOKEN_WIDTH_AUTO), CM_ERR_IO);
    cr_assert(strstr(cm_last_error(), "/nonexistent/dir/train.bin"), "%s", cm_last_error());
    struct stat st;
    cr_assert_neq(stat("/tmp/cm_tf_never.bin", &st), 0);
}
