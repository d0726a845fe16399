/* libFuzzer target: the checkpoint manifest and the checks of cm_checkpoint_open (format version,
 * layout, world size, files, sizes, tensor entries, global shapes and ranges, rank-file names and
 * the tiling of every tensor's pieces), then every reader on an accepted checkpoint: verify, the
 * summary, and range reads of every whole tensor.
 *
 * The input is the manifest's text without its closing checksum field; the harness appends
 * `,"manifest_xxh3":"<XXH3 of the input>"}` (otherwise almost every mutation would stop at the
 * checksum) and writes it into a directory next to fixed rank and monolithic files
 * (fixtures/manifest: a 2-rank sharded checkpoint's and a 1-process one's, which the seeds in
 * corpus/manifest describe). */
#define _GNU_SOURCE
#include "checkpoint/ckpt_impl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_dir[256];
static char *g_manifest;

static const char *const k_fixtures[] = {"model-rank0-of-2.safetensors", "model-rank1-of-2.safetensors",
                                         "optimizer-rank0-of-2.safetensors", "optimizer-rank1-of-2.safetensors",
                                         "model.safetensors", "optimizer.safetensors"};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    cm_log_set_level(CM_LOG_ERROR + 1); /* the search's warnings are not news here */
    snprintf(g_dir, sizeof g_dir, "%s/cm_fuzz_manifest_XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (!mkdtemp(g_dir)) abort();
    /* the fixtures sit next to this source file */
    char src[1024];
    snprintf(src, sizeof src, "%s", __FILE__);
    char *slash = strrchr(src, '/');
    const size_t base = slash ? (size_t)(slash - src) + 1 : 0;
    for (size_t i = 0; i < sizeof k_fixtures / sizeof k_fixtures[0]; i++) {
        snprintf(src + base, sizeof src - base, "fixtures/manifest/%s", k_fixtures[i]);
        char *bytes;
        size_t n;
        if (cmi_read_file(src, 1 << 20, &bytes, &n) != CM_OK) {
            fprintf(stderr, "fuzz_manifest: %s\n", cm_last_error());
            abort();
        }
        char *dst = cmi_path_join(g_dir, k_fixtures[i]);
        if (!dst || cmi_write_file_sync(dst, bytes, n) != CM_OK) abort();
        cm_free(dst);
        cm_free(bytes);
    }
    g_manifest = cmi_path_join(g_dir, CM_CKPT_MANIFEST);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1 << 20)) return 0;
    char tail[64];
    const int k = snprintf(tail, sizeof tail, ",\"manifest_xxh3\":\"%016" PRIx64 "\"}\n", cm_hash64(data, size, 0));
    char *text = malloc(size + (size_t)k);
    if (!text) return 0;
    memcpy(text, data, size);
    memcpy(text + size, tail, (size_t)k);
    /* not fsync'ed: the file system's durability is not under test */
    FILE *f = fopen(g_manifest, "wb");
    if (!f) abort();
    fwrite(text, 1, size + (size_t)k, f);
    fclose(f);
    free(text);

    cm_checkpoint *ck;
    if (cm_checkpoint_open(g_dir, &ck) != CM_OK) return 0;
    cm_checkpoint_verify(ck);
    char sum[512];
    size_t need = cm_checkpoint_summary(ck, sum, sizeof sum);
    if (sum[sizeof sum - 1 < need ? sizeof sum - 1 : need] != 0) abort(); /* always terminated */
    for (size_t i = 0; i < cm_checkpoint_n_tensors(ck); i++) {
        cm_ckpt_tensor t;
        if (cm_checkpoint_tensor(ck, i, &t) != CM_OK || t.begin < 0 || t.end < t.begin) abort();
    }
    for (int kind = 0; kind < 2; kind++) {
        const size_t n = cmi_ck_n_global(ck, kind);
        for (size_t i = 0; i < n; i++) {
            const char *name = cmi_ck_global_name(ck, kind, i);
            cmi_ck_global g;
            if (!name || !cmi_ck_find(ck, kind, name, &g)) abort(); /* every listed name is found */
            const size_t nb = (size_t)g.numel * (size_t)(cm_st_dtype_bits(g.dtype) / 8);
            if (nb > (1 << 24)) continue;
            void *buf = malloc(nb ? nb : 1);
            if (buf) cmi_ck_read_range(ck, kind, name, 0, g.numel, buf);
            free(buf);
        }
    }
    cm_checkpoint_close(ck);
    return 0;
}
