/* libFuzzer target: the YAML config loader (libyaml document -> tree: duplicate keys, dotted keys,
 * aliases, depth and size limits), a few typed getters, the unknown-key check, and a dump that must
 * load back to the same dump. */
#include <composer/config.h>

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cm_config *c;
    if (cm_config_load_string((const char *)data, size, "fuzz.yaml", &c) != CM_OK) return 0;
    int64_t i;
    double d;
    bool b;
    cm_time t;
    const char *s;
    double v[4];
    int n;
    cm_config_get_int(c, "seed", 1, &i);
    cm_config_get_double(c, "optimizer.lr", 1e-3, &d);
    cm_config_get_bool(c, "progress_bar", true, &b);
    cm_config_get_time(c, "max_duration", "1ep", &t);
    cm_config_get_string(c, "model.name", NULL, &s);
    cm_config_get_doubles(c, "optimizer.betas", NULL, 0, v, 4, &n);
    cm_config_override(c, "model.n_layer=[1, {a: b}]");
    cm_config_check_unknown(c);
    char *text, *text2;
    if (cm_config_to_string(c, &text, NULL) == CM_OK) {
        cm_config *d2;
        if (cm_config_load_string(text, strlen(text), "dump.yaml", &d2) != CM_OK) abort();
        if (cm_config_to_string(d2, &text2, NULL) != CM_OK || strcmp(text, text2) != 0) abort();
        cm_free(text2);
        cm_config_free(d2);
        cm_free(text);
    }
    cm_config_free(c);
    return 0;
}
