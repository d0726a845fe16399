/* libFuzzer target: the IDX reader as the MNIST dataset runs it — gunzip when the bytes start with
 * the gzip magic, then header validation — and a read of every data byte the parser vouched for,
 * so AddressSanitizer sees any view that promises more than the buffer holds. */
#include "data/formats.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cm_blob gz = {0};
    const uint8_t *buf = data;
    size_t n = size;
    if (size >= 2 && data[0] == 0x1f && data[1] == 0x8b) {
        if (cm_gunzip(data, size, (size_t)64 << 20, "fuzz.idx.gz", &gz) != CM_OK) return 0;
        buf = gz.data;
        n = gz.size;
    }
    cm_idx idx;
    if (cm_idx_parse(buf, n, "fuzz.idx", &idx) == CM_OK) {
        uint64_t bytes = idx.numel * (uint64_t)idx.elem_size, sum = 0;
        for (uint64_t i = 0; i < bytes; i++) sum += idx.data[i];
        volatile uint64_t sink = sum;
        (void)sink;
    }
    cm_blob_release(&gz);
    return 0;
}
