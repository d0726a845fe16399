/* The YAML config layer: loading, overrides, typed getters and their errors (file:line:col and
 * the key), the unknown-key check with suggestions, defaults, and dump/reload round trips. */
#include "cmtest.h"

#include <composer/config.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

static cm_config *load(const char *text) {
    cm_config *c = NULL;
    cr_assert_eq(cm_config_load_string(text, strlen(text), "x.yaml", &c), CM_OK, "%s", cm_last_error());
    return c;
}

static void expect_msg(cm_status got, cm_status want, const char *part) {
    cr_assert_eq(got, want, "status %d, want %d (%s)", got, want, cm_last_error());
    cr_assert(strstr(cm_last_error(), part), "message '%s' lacks '%s'", cm_last_error(), part);
}

static const char *k_doc = "max_duration: 20ba\n"
                           "seed: 7\n"
                           "model:\n"
                           "  name: gpt2\n"
                           "  n_layer: 4\n"
                           "optimizer:\n"
                           "  lr: 3.0e-4\n"
                           "  betas: [0.9, 0.95]\n"
                           "  amsgrad: yes\n"
                           "run_name: '123'\n";

Test(config, getters_read_typed_values) {
    cm_config *c = load(k_doc);
    int64_t seed, layers;
    double lr, betas[2];
    bool ams;
    cm_time t;
    const char *name, *run;
    int n;
    cr_assert_eq(cm_config_get_int(c, "seed", 42, &seed), CM_OK);
    cr_assert_eq(seed, 7);
    cr_assert_eq(cm_config_get_int(c, "model.n_layer", 1, &layers), CM_OK);
    cr_assert_eq(layers, 4);
    cr_assert_eq(cm_config_get_double(c, "optimizer.lr", 1, &lr), CM_OK);
    cr_assert_float_eq(lr, 3e-4, 1e-18, "lr %g", lr);
    cr_assert_eq(cm_config_get_doubles(c, "optimizer.betas", NULL, 0, betas, 2, &n), CM_OK, "%s", cm_last_error());
    cr_assert(n == 2 && betas[0] == 0.9 && betas[1] == 0.95, "betas %d: %g %g", n, betas[0], betas[1]);
    cr_assert_eq(cm_config_get_double(c, "optimizer.betas.1", 0, &betas[1]), CM_OK);
    cr_assert_eq(betas[1], 0.95);
    cr_assert_eq(cm_config_get_bool(c, "optimizer.amsgrad", false, &ams), CM_OK);
    cr_assert(ams);
    cr_assert_eq(cm_config_get_time(c, "max_duration", NULL, &t), CM_OK);
    cr_assert(t.unit == CM_TIME_BATCH && t.count == 20, "unit %d count %lld", t.unit, (long long)t.count);
    cr_assert_eq(cm_config_get_string(c, "model.name", NULL, &name), CM_OK);
    cr_assert_str_eq(name, "gpt2");
    cr_assert_eq(cm_config_get_string(c, "run_name", NULL, &run), CM_OK);
    cr_assert_str_eq(run, "123");
    cr_assert_eq(cm_config_check_unknown(c), CM_OK, "%s", cm_last_error());
    cm_config_free(c);
}

Test(config, absent_keys_give_defaults_and_are_stored) {
    cm_config *c = load("a: 1\n");
    int64_t a, b;
    double d;
    const char *s;
    cr_assert_eq(cm_config_get_int(c, "a", 0, &a), CM_OK);
    cr_assert_eq(cm_config_get_int(c, "sec.b", 5, &b), CM_OK);
    cr_assert_eq(b, 5);
    cr_assert_eq(cm_config_get_double(c, "sec.d", 0.25, &d), CM_OK);
    cr_assert_eq(cm_config_get_string(c, "none", NULL, &s), CM_OK);
    cr_assert_null(s);
    cr_assert_eq(cm_config_kind_of(c, "none"), CM_CONFIG_ABSENT);
    cr_assert_eq(cm_config_kind_of(c, "sec.b"), CM_CONFIG_SCALAR);
    cr_assert_str_eq(cm_config_origin(c, "sec.b"), "default");
    cr_assert_str_eq(cm_config_origin(c, "a"), "x.yaml:1:4");
    cm_config_free(c);
}

Test(config, null_values_read_as_absent) {
    cm_config *c = load("callbacks:\nx: ~\n");
    int64_t v;
    cr_assert_eq(cm_config_kind_of(c, "callbacks"), CM_CONFIG_NULL);
    cr_assert_not(cm_config_has(c, "callbacks"));
    cr_assert_eq(cm_config_get_int(c, "x", 3, &v), CM_OK);
    cr_assert_eq(v, 3);
    cm_config_free(c);
}

Test(config, overrides_replace_create_and_parse_yaml_values) {
    cm_config *c = load(k_doc);
    cr_assert_eq(cm_config_override(c, "optimizer.lr=1e-3"), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_config_override(c, "optimizer.betas=[0.8, 0.99]"), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_config_override(c, "scheduler.name=cosine_with_warmup"), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_config_override(c, "algorithms={gradient_clipping: {clipping_threshold: 0.5}}"), CM_OK);
    cr_assert_eq(cm_config_override(c, "run_name='007'"), CM_OK);
    cr_assert_eq(cm_config_override(c, "optimizer.betas.0=0.7"), CM_OK, "%s", cm_last_error());
    double lr, b[2], thr;
    int n;
    const char *s, *run;
    cr_assert_eq(cm_config_get_double(c, "optimizer.lr", 0, &lr), CM_OK);
    cr_assert_eq(lr, 1e-3);
    cr_assert_eq(cm_config_get_doubles(c, "optimizer.betas", NULL, 0, b, 2, &n), CM_OK);
    cr_assert(n == 2 && b[0] == 0.7 && b[1] == 0.99, "%g %g", b[0], b[1]);
    cr_assert_eq(cm_config_get_string(c, "scheduler.name", NULL, &s), CM_OK);
    cr_assert_str_eq(s, "cosine_with_warmup");
    cr_assert_eq(cm_config_get_double(c, "algorithms.gradient_clipping.clipping_threshold", 1, &thr), CM_OK);
    cr_assert_eq(thr, 0.5);
    cr_assert_eq(cm_config_get_string(c, "run_name", NULL, &run), CM_OK);
    cr_assert_str_eq(run, "007");
    cr_assert_str_eq(cm_config_origin(c, "optimizer.lr"), "override 'optimizer.lr=1e-3'");
    cm_config_free(c);
}

Test(config, bad_overrides_are_errors) {
    cm_config *c = load(k_doc);
    expect_msg(cm_config_override(c, "optimizer.lr"), CM_ERR_INVALID_ARG, "is not KEY=VALUE");
    expect_msg(cm_config_override(c, "=3"), CM_ERR_INVALID_ARG, "is not KEY=VALUE");
    expect_msg(cm_config_override(c, "seed.x=3"), CM_ERR_INVALID_ARG, "'seed' is a scalar");
    expect_msg(cm_config_override(c, "optimizer..lr=3"), CM_ERR_INVALID_ARG, "empty key");
    expect_msg(cm_config_override(c, "optimizer.betas.5=3"), CM_ERR_INVALID_ARG, "past the end");
    expect_msg(cm_config_override(c, "a=[1, 2"), CM_ERR_FORMAT, "override 'a=[1, 2'");
    cm_config_free(c);
}

Test(config, unknown_key_suggests_the_sibling) {
    cm_config *c = load("optimizer:\n  name: adamw\n  lrr: 0.1\n");
    double lr;
    const char *name;
    cr_assert_eq(cm_config_get_string(c, "optimizer.name", NULL, &name), CM_OK);
    cr_assert_eq(cm_config_get_double(c, "optimizer.lr", 1e-3, &lr), CM_OK);
    expect_msg(cm_config_check_unknown(c), CM_ERR_INVALID_ARG,
               "x.yaml:3:3: unknown key 'optimizer.lrr' (did you mean 'optimizer.lr'?)");
    cm_config_free(c);
}

Test(config, unknown_key_at_the_wrong_level_points_to_the_right_one) {
    cm_config *c = load("lr: 0.1\nmodel: {name: gpt2, nlayer: 3, junk: 1}\n");
    double lr;
    int64_t n;
    cr_assert_eq(cm_config_get_double(c, "optimizer.lr", 1e-3, &lr), CM_OK);
    cr_assert_eq(cm_config_get_int(c, "model.n_layer", 1, &n), CM_OK);
    cm_config_touch(c, "model.name");
    expect_msg(cm_config_check_unknown(c), CM_ERR_INVALID_ARG, "unknown key 'lr' (did you mean 'optimizer.lr'?)");
    cr_assert(strstr(cm_last_error(), "(and 2 more unknown keys)"), "%s", cm_last_error());
    cm_config_free(c);
}

Test(config, type_errors_name_file_line_column_and_key) {
    cm_config *c = load("seed: 7\nmax_duration: 20xx\nmodel: {n_layer: four, drop: x}\nflag: maybe\nopt: adamw\n");
    cm_time t;
    int64_t n;
    bool b;
    double d;
    expect_msg(cm_config_get_time(c, "max_duration", NULL, &t), CM_ERR_INVALID_ARG,
               "x.yaml:2:15: max_duration: '20xx' is not a time");
    expect_msg(cm_config_get_int(c, "model.n_layer", 1, &n), CM_ERR_INVALID_ARG,
               "x.yaml:3:18: model.n_layer: 'four' is not an integer");
    expect_msg(cm_config_get_double(c, "model.drop", 0, &d), CM_ERR_INVALID_ARG, "model.drop: 'x' is not a number");
    expect_msg(cm_config_get_bool(c, "flag", false, &b), CM_ERR_INVALID_ARG, "'maybe' is not a boolean");
    expect_msg(cm_config_get_int(c, "model", 1, &n), CM_ERR_INVALID_ARG, "model: expected an integer, found a map");
    expect_msg(cm_config_get_double(c, "opt.lr", 1, &d), CM_ERR_INVALID_ARG, "opt: expected a map");
    static const char *const kinds[] = {"sgd", "adamw", "adam"};
    int k;
    cm_config_set(c, "opt", "adamm");
    expect_msg(cm_config_get_choice(c, "opt", kinds, 3, NULL, &k), CM_ERR_INVALID_ARG, "did you mean 'adam");
    cr_assert_eq(cm_config_get_int(c, "seed", 1, &n), CM_OK);
    cm_config_free(c);
}

Test(config, integers_accept_whole_reals_and_times_accept_zero) {
    cm_config *c = load("a: 1e3\nb: 2.5\neval_interval: 0\n");
    int64_t a, b;
    cm_time t;
    cr_assert_eq(cm_config_get_int(c, "a", 0, &a), CM_OK);
    cr_assert_eq(a, 1000);
    expect_msg(cm_config_get_int(c, "b", 0, &b), CM_ERR_INVALID_ARG, "'2.5' is not an integer");
    cr_assert_eq(cm_config_get_time(c, "eval_interval", "1ep", &t), CM_OK);
    cr_assert_eq(t.count, 0);
    cm_config_free(c);
}

Test(config, syntax_and_structure_errors) {
    cm_config *c = NULL;
    const char *bad = "a: 1\nb: [1, 2\nc: 3\n";
    expect_msg(cm_config_load_string(bad, strlen(bad), "bad.yaml", &c), CM_ERR_FORMAT, "bad.yaml:");
    cr_assert(strstr(cm_last_error(), "invalid YAML"), "%s", cm_last_error());
    const char *dup = "a: 1\nb: 2\na: 3\n";
    expect_msg(cm_config_load_string(dup, strlen(dup), "d.yaml", &c), CM_ERR_FORMAT, "d.yaml:3:1: duplicate key 'a'");
    const char *list = "- 1\n- 2\n";
    expect_msg(cm_config_load_string(list, strlen(list), "l.yaml", &c), CM_ERR_FORMAT, "must be a map");
    const char *dotted = "a.b: 1\n";
    expect_msg(cm_config_load_string(dotted, strlen(dotted), "k.yaml", &c), CM_ERR_FORMAT, "key 'a.b' is not allowed");
    const char *two = "a: 1\n---\nb: 2\n";
    expect_msg(cm_config_load_string(two, strlen(two), "t.yaml", &c), CM_ERR_FORMAT, "second YAML document");
    const char *rec = "a: &x [1, *x]\n";
    cr_assert_neq(cm_config_load_string(rec, strlen(rec), "r.yaml", &c), CM_OK);
    expect_msg(cm_config_load_file("/nonexistent/c.yaml", &c), CM_ERR_IO, "/nonexistent/c.yaml");
    cr_assert_null(c);
    const char *empty = "";
    cr_assert_eq(cm_config_load_string(empty, 0, "e.yaml", &c), CM_OK);
    cr_assert_eq(cm_config_len(c, ""), 0);
    cm_config_free(c);
}

Test(config, dump_and_reload_round_trip) {
    cm_config *c = load("name: 'quoted 1'\nmsg: \"a\\nb\"\nlist: [1, 2.5, x]\nnested:\n  deep: {k: true}\n"
                        "empty: {}\nnothing:\n");
    int64_t v;
    cr_assert_eq(cm_config_get_int(c, "added.value", 9, &v), CM_OK);
    char *text;
    size_t len;
    cr_assert_eq(cm_config_to_string(c, &text, &len), CM_OK, "%s", cm_last_error());
    cm_config *d = load(text);
    char *text2;
    cr_assert_eq(cm_config_to_string(d, &text2, NULL), CM_OK);
    cr_assert_str_eq(text, text2);
    const char *s;
    cr_assert_eq(cm_config_get_string(d, "name", NULL, &s), CM_OK);
    cr_assert_str_eq(s, "quoted 1");
    cr_assert_eq(cm_config_get_string(d, "msg", NULL, &s), CM_OK);
    cr_assert_str_eq(s, "a\nb");
    cr_assert_eq(cm_config_get_string(d, "list.2", NULL, &s), CM_OK);
    cr_assert_str_eq(s, "x");
    cr_assert_eq(cm_config_get_int(d, "added.value", 0, &v), CM_OK);
    cr_assert_eq(v, 9);
    cr_assert_eq(cm_config_kind_of(d, "empty"), CM_CONFIG_MAP);
    cr_assert_eq(cm_config_kind_of(d, "nothing"), CM_CONFIG_NULL);
    cr_assert_eq(cm_config_kind_of(d, "nested.deep.k"), CM_CONFIG_SCALAR);
    cm_free(text);
    cm_free(text2);
    cm_config_free(c);
    cm_config_free(d);
}

Test(config, save_writes_a_file_that_loads_back) {
    cm_config *c = load(k_doc);
    const char *path = "build/test_config_save.yaml";
    cr_assert_eq(cm_config_save(c, path), CM_OK, "%s", cm_last_error());
    cm_config *d;
    cr_assert_eq(cm_config_load_file(path, &d), CM_OK, "%s", cm_last_error());
    int64_t seed;
    cr_assert_eq(cm_config_get_int(d, "seed", 0, &seed), CM_OK);
    cr_assert_eq(seed, 7);
    cr_assert_str_eq(cm_config_origin(d, "seed"), "build/test_config_save.yaml:2:7");
    remove(path);
    expect_msg(cm_config_save(c, "/nonexistent/dir/c.yaml"), CM_ERR_IO, "/nonexistent/dir/c.yaml");
    cm_config_free(c);
    cm_config_free(d);
}

Test(config, out_of_memory_fails_cleanly) {
    for (int64_t n = 1; n < 200; n++) {
        cm_alloc_fail_at(n);
        cm_config *c = NULL;
        cm_status s = cm_config_load_string(k_doc, strlen(k_doc), "x.yaml", &c);
        if (s == CM_OK) {
            s = cm_config_override(c, "optimizer.lr=1");
            cm_config_free(c);
        }
        cm_alloc_fail_at(0);
        if (s == CM_OK) break;
        cr_assert_eq(s, CM_ERR_OOM, "failure at allocation %lld: %s", (long long)n, cm_last_error());
    }
}

Test(config, a_close_sibling_beats_the_same_name_elsewhere) {
    cm_config *c = load("a: {lrr: 1}\n");
    double v;
    cr_assert_eq(cm_config_get_double(c, "a.lr", 1, &v), CM_OK);
    cr_assert_eq(cm_config_get_double(c, "b.lrr", 1, &v), CM_OK);
    expect_msg(cm_config_check_unknown(c), CM_ERR_INVALID_ARG, "unknown key 'a.lrr' (did you mean 'a.lr'?)");
    cm_config_free(c);
}
