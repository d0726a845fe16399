/* libFuzzer target: Hugging Face tokenizer.json (composer/hf.h, cm_hf_tokenizer_load's fast-tokenizer
 * path) from memory — the JSON, the WordPiece vocabulary or the byte-level BPE vocabulary and merges
 * (strings or pairs), the normalizer and pre-tokenizer checks, added tokens — then an encode and a
 * decode of a short text with whatever tokenizer came out. */
#include <composer/tokenizer.h>

#include "text/text_impl.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cm_tokenizer *tok;
    if (cmi_hf_tokenizer_from_json_text((const char *)data, size, "fuzz/tokenizer.json", &tok) != CM_OK) return 0;
    static const char text[] = "The movie's plot, not bad! \xc3\xa9t\xc3\xa9 \xe4\xb8\xad";
    int32_t *ids;
    int64_t n;
    if (cm_tokenizer_encode(tok, text, sizeof text - 1, &ids, &n) != CM_OK) abort();
    char *back;
    size_t len;
    if (cm_tokenizer_decode(tok, ids, n, &back, &len) != CM_OK) abort();
    cm_free(back);
    cm_free(ids);
    cm_tokenizer_free(tok);
    return 0;
}
