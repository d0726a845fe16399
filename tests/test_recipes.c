/* Every recipe under examples/recipes/ parses and starts: `composer train` on it trains 2 batches
 * of 2 samples (ResNet-56's, the ResNet-20 recipes on a deeper preset, are resolved only) (on small stand-ins for the data that would take long to load), with its
 * algorithms applied — so a recipe a user copies does not fail on a key, a value or a method that
 * cannot apply. Each family has its baseline and its mild, medium and hot recipes, every file opens
 * with a comment, and each recipe differs from its baseline. Runs the built binary (CM_COMPOSER_BIN). */
#include "cmtest.h"

#include <composer/tokenizer.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CM_COMPOSER_BIN
#error "CM_COMPOSER_BIN must name the composer binary (tests/CMakeLists.txt sets it)"
#endif
#define DIR "build/test_recipes"

static char out[1 << 16];

static int run(const char *args) {
    return cmt_run_capturef(out, sizeof out, "%s %s", CM_COMPOSER_BIN, args);
}

/* Character token files from the first 20 kB of tiny Shakespeare, for the char GPT recipes, and
 * GPT-2 BPE token files from the same text (`composer data tokenize --tokenizer gpt2`), for
 * gpt-bpe/. */
static void setup(void) {
    cr_assert_eq(system("rm -rf " DIR " && mkdir -p " DIR "/char"), 0);
    cmt_char_token_files(DIR "/char", 20000, 2000);
    cr_assert_eq(system("head -c 20000 ../shared/data/tinyshakespeare/input.txt > " DIR "/bpe.txt"), 0);
    int rc = run("data tokenize --tokenizer gpt2 " DIR "/bpe.txt -o " DIR "/bpe");
    cr_assert_eq(rc, 0, "cannot tokenize the GPT-2 stand-in data (exit %d):\n%s", rc, out);
}

TestSuite(recipes, .init = setup);

/* The overrides that make a recipe start quickly on small data, by family (the path's folder). */
static const char *family_overrides(const char *path) {
    if (strstr(path, "/gpt-char/") || strstr(path, "/gpt-char-256/"))
        return "train_loader.dataset.dir=" DIR "/char eval_loader.dataset.dir=" DIR "/char sample.max_new_tokens=2";
    if (strstr(path, "/gpt-bpe/"))
        return "train_loader.dataset.dir=" DIR "/bpe eval_loader.dataset.dir=" DIR "/bpe sample.max_new_tokens=2";
    if (strstr(path, "/bert/mlm-")) /* the dev sentences stand in for the pretraining corpus */
        return "train_loader.dataset.path=../shared/data/sst2/dev.tsv";
    if (strstr(path, "/bert/sst2-")) /* no pretrained folder in a test: the same shape, random weights */
        return "model.pretrained=false model.pretrained_model_name_or_path=examples/bert-tiny "
               "tokenizer.name=../shared/data/bert";
    return "";
}

Test(recipes, every_recipe_parses_and_trains_two_batches) {
    glob_t g;
    cr_assert_eq(glob("examples/recipes/*/*.yaml", 0, NULL, &g), 0, "no recipes under examples/recipes/");
    cr_assert_geq(g.gl_pathc, 18, "expected the ResNet-20/56, GPT and BERT families, found %zu files", g.gl_pathc);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        const char *p = g.gl_pathv[i];
        /* ResNet-56's recipes are ResNet-20's with a deeper preset: resolving them (every key and
         * method argument checked) is enough, and keeps this test short */
        const bool resolve_only = strstr(p, "/resnet56-") != NULL;
        char args[2048];
        snprintf(args, sizeof args,
                 "train %s max_duration=2ba eval_interval=0 train_loader.batch_size=2 run_root=" DIR "/runs %s %s", p,
                 family_overrides(p), resolve_only ? "--print-config" : "-q");
        int rc = run(args);
        cr_expect_eq(rc, 0, "%s does not start (exit %d):\n%s", p, rc, out);
        char *text = cmt_slurp(p, NULL);
        cr_assert_not_null(text, "cannot read %s", p);
        cr_expect(text[0] == '#', "%s does not open with a comment saying what it is", p);
        /* a recipe applies methods, changes the schedule or trims padding; a baseline does none of these
         * beyond clipping */
        const bool baseline = strstr(p, "baseline") != NULL;
        const bool methods = strstr(text, "\nalgorithms:\n") && (strstr(text, "alibi") || strstr(text, "blurpool") ||
                                                                  strstr(text, "ema:") || strstr(text, "gated_linear") ||
                                                                  strstr(text, "seq_length_warmup"));
        const bool ssr = strstr(text, "scale_schedule_ratio") != NULL;
        const bool trim = strstr(text, "allow_pad_trimming: true") != NULL; /* the padding's compute removed */
        if (baseline) cr_expect(!methods && !ssr && !trim, "%s is a baseline but applies speed-up methods", p);
        else cr_expect(methods || ssr || trim, "%s is a recipe but changes neither methods, schedule nor padding", p);
        free(text);
    }
    globfree(&g);
}

Test(recipes, every_family_has_a_baseline_and_three_strengths) {
    const char *families[] = {"resnet-cifar10/resnet20-", "resnet-cifar10/resnet56-", "gpt-char/", "gpt-char-256/",
                              "gpt-bpe/", "bert/mlm-"};
    const char *strengths[] = {"baseline", "mild", "medium", "hot"};
    for (size_t f = 0; f < sizeof families / sizeof *families; f++)
        for (size_t s = 0; s < 4; s++) {
            char path[256];
            snprintf(path, sizeof path, "examples/recipes/%s%s.yaml", families[f], strengths[s]);
            FILE *fp = fopen(path, "r");
            cr_expect_not_null(fp, "missing %s", path);
            if (fp) fclose(fp);
        }
}
