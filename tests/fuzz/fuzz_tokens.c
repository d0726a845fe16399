/* libFuzzer target: llm.c token files. Header validation, then windows gathered the way the
 * dataset does, at the first and last sample positions. The sequence length, output type and
 * vocabulary check are taken from header bytes the format leaves unused (words 3..4), so the
 * fuzzer explores them too. */
#include "data/formats.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cm_tokfile tf;
    if (cm_tokfile_parse(data, size, "fuzz.bin", &tf) != CM_OK) return 0;
    int64_t T = 1 + data[12] % 64;
    bool i64 = data[13] & 1;
    int64_t vocab = (int64_t)data[16] | (int64_t)data[17] << 8;
    if (tf.n_tokens < T + 1) return 0;
    int64_t n_samples = (tf.n_tokens - 1) / T;
    int64_t in[64], lab[64];
    for (int64_t k = 0; k < n_samples && k < 8; k++) {
        int64_t i = k < 4 ? k : n_samples - 1 - (k - 4);
        memset(in, 0, sizeof in);
        memset(lab, 0, sizeof lab);
        cm_tokfile_window(&tf, i * T, T, i64, vocab, "fuzz.bin", in, lab);
    }
    return 0;
}
