/* `composer recipe compare` on tiny GPT runs (a few batches of a 20 kB character corpus): a target
 * reached stops the run there (ThresholdStopper), one never reached runs to max_duration, a budget
 * ends a run from outside; seeds give different runs; the speed-up in results.json is the ratio of
 * the mean times in runs.tsv; curves.tsv (the plot's data) holds exactly the run's metrics.jsonl
 * points; bad flags, targets and configs are named before any run starts. Runs the built binary
 * (CM_COMPOSER_BIN). */
#include "cmtest.h"

#include <composer/tokenizer.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef CM_COMPOSER_BIN
#error "CM_COMPOSER_BIN must name the composer binary (tests/CMakeLists.txt sets it)"
#endif
#define DIR "build/test_cli_recipe"
#define CE "metrics/eval/LanguageCrossEntropy"

static char out[1 << 16];

static int run(const char *args) {
    return cmt_run_capturef(out, sizeof out, "%s %s", CM_COMPOSER_BIN, args);
}

static void write_config(const char *path, const char *body) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("eval_subset_num_batches: 1\n"
          "model: {name: gpt2, preset: tiny}\n"
          "train_loader:\n"
          "  dataset: {type: tokens, dir: " DIR "/data}\n"
          "  batch_size: 4\n"
          "eval_loader:\n"
          "  dataset: {type: tokens, dir: " DIR "/data, split: val}\n"
          "  batch_size: 4\n"
          "sample: {max_new_tokens: 2}\n",
          f);
    fputs(body, f);
    fclose(f);
}

static void setup(void) {
    cr_assert_eq(system("rm -rf " DIR " && mkdir -p " DIR "/data"), 0);
    cmt_char_token_files(DIR "/data", 20000, 2000);
    write_config(DIR "/base.yaml", "max_duration: 12ba\neval_interval: 3ba\noptimizer: {name: decoupled_adamw, lr: 1.0e-3}\n");
    write_config(DIR "/hot.yaml", "max_duration: 12ba\neval_interval: 3ba\noptimizer: {name: decoupled_adamw, lr: 1.0e-2}\n");
    write_config(DIR "/long.yaml", "max_duration: 100000ba\neval_interval: 1000ba\n"
                                   "optimizer: {name: decoupled_adamw, lr: 1.0e-3}\n");
    write_config(DIR "/typo.yaml", "max_duration: 12ba\neval_interval: 3ba\noptimizer: {name: decoupled_adamw, lrr: 1.0e-3}\n");
}

TestSuite(cli_recipe, .init = setup);

/* The rows of runs.tsv as cJSON-free fields: config, seed, reached, batch, seconds, final, end_batch,
 * stopped_by. */
typedef struct {
    char config[32], reached[8], stopped[16];
    long long seed, batch, end_batch;
    double seconds, final;
} row;

static int read_rows(const char *path, row *rows, int cap) {
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "no %s", path);
    char line[2048];
    cr_assert_not_null(fgets(line, sizeof line, f));
    cr_assert(strstr(line, "config\tseed\treached\tbatch_to_target\tseconds_to_target\tfinal"), "header: %s", line);
    int n = 0;
    while (n < cap && fgets(line, sizeof line, f)) {
        row *r = &rows[n];
        double best, end_s, proc;
        int k = sscanf(line, "%31[^\t]\t%lld\t%7[^\t]\t%lld\t%lf\t%lf\t%lf\t%lld\t%lf\t%15[^\t]\t%lf", r->config,
                       &r->seed, r->reached, &r->batch, &r->seconds, &r->final, &best, &r->end_batch, &end_s,
                       r->stopped, &proc);
        cr_assert_eq(k, 11, "row %d: %s", n, line);
        n++;
    }
    fclose(f);
    return n;
}

Test(cli_recipe, reached_targets_stop_the_runs_seeds_differ_and_the_numbers_agree) {
    /* a cross-entropy anyone reaches at the first evaluation: every run stops at batch 3 */
    int rc = run("recipe compare " DIR "/base.yaml " DIR "/hot.yaml --target " CE "=100 --seeds 1,2 -o " DIR "/a");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_expect(strstr(out, "target: " CE " <= 100"), "the direction of a cross-entropy is down:\n%s", out);
    row rows[8];
    int n = read_rows(DIR "/a/runs.tsv", rows, 8);
    cr_assert_eq(n, 4, "2 configs x 2 seeds");
    /* seeds interleaved: base 1, hot 1, base 2, hot 2 */
    const char *cfg[] = {"base", "hot", "base", "hot"};
    const long long seed[] = {1, 1, 2, 2};
    double t[4];
    for (int i = 0; i < 4; i++) {
        cr_expect_str_eq(rows[i].config, cfg[i]);
        cr_expect_eq(rows[i].seed, seed[i]);
        cr_expect_str_eq(rows[i].reached, "yes");
        cr_expect_eq(rows[i].batch, 3, "row %d: reached at batch %lld, the first evaluation is at 3", i, rows[i].batch);
        cr_expect_eq(rows[i].end_batch, 3, "row %d: ran to batch %lld; the ThresholdStopper should end it at 3", i,
                     rows[i].end_batch);
        cr_expect_str_eq(rows[i].stopped, "target");
        cr_expect(rows[i].seconds > 0 && isfinite(rows[i].seconds));
        t[i] = rows[i].seconds;
    }
    /* the speed-up in results.json: mean(base) / mean(hot), and the per-seed ratios */
    char *js = cmt_slurp(DIR "/a/results.json", NULL);
    cr_assert_not_null(js, "cannot read %s", DIR "/a/results.json");
    cJSON *j = cJSON_Parse(js);
    cr_assert_not_null(j, "results.json does not parse:\n%s", js);
    cJSON *sum = cJSON_GetObjectItem(j, "summary");
    cr_assert_eq(cJSON_GetArraySize(sum), 2);
    cJSON *hot = cJSON_GetArrayItem(sum, 1);
    cr_expect_str_eq(cJSON_GetObjectItem(hot, "config")->valuestring, "hot");
    cJSON *sp = cJSON_GetObjectItem(hot, "speedup");
    cr_assert(cJSON_IsObject(sp), "no speed-up although every run reached the target:\n%s", js);
    const double want = (t[0] + t[2]) / (t[1] + t[3]);
    const double got = cJSON_GetObjectItem(sp, "ratio_of_means")->valuedouble;
    cr_expect(fabs(got - want) <= 1e-9 * want, "speed-up %.17g, runs.tsv gives %.17g", got, want);
    cJSON *ps = cJSON_GetObjectItem(sp, "per_seed");
    const double r1 = t[0] / t[1], r2 = t[2] / t[3];
    cr_expect(fabs(cJSON_GetObjectItem(ps, "mean")->valuedouble - (r1 + r2) / 2) <= 1e-9 * (r1 + r2),
              "per-seed mean %.17g, want %.17g", cJSON_GetObjectItem(ps, "mean")->valuedouble, (r1 + r2) / 2);
    cr_expect(fabs(cJSON_GetObjectItem(ps, "std")->valuedouble - fabs(r1 - r2) / sqrt(2.0)) <= 1e-9 + 1e-9 * fabs(r1 - r2));
    cr_expect(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetArrayItem(sum, 0), "speedup")), "the baseline has no speed-up");
    cJSON_Delete(j);
    free(js);
    /* every config was checked before the runs with all the measured overrides: the stopper one
     * ulp past the target, so reaching it (<=) stops the run, as the analysis counts it */
    char *check = cmt_slurp(DIR "/a/logs/hot.check.txt", NULL);
    cr_assert_not_null(check, "cannot read %s", DIR "/a/logs/hot.check.txt");
    cr_expect(strstr(check, "threshold_stopper:\n    monitor: LanguageCrossEntropy\n    dataloader_label: eval\n"
                            "    threshold: 100.00000000000001\n    comp: less\n") &&
                  strstr(check, "time_unit: seconds"),
              "the check did not resolve the measured overrides:\n%s", check);
    free(check);
    /* the seeds reached the children (seed: S in each run's resolved config) and gave different runs */
    char *c1 = cmt_slurp(DIR "/a/runs/base-seed1/config.yaml", NULL), *c2 = cmt_slurp(DIR "/a/runs/base-seed2/config.yaml", NULL);
    cr_assert_not_null(c2, "cannot read %s", DIR "/a/runs/base-seed2/config.yaml");
    cr_assert_not_null(c1, "cannot read %s", DIR "/a/runs/base-seed1/config.yaml");
    cr_expect(strstr(c1, "seed: 1\n") && strstr(c2, "seed: 2\n"), "seeds not passed on");
    free(c1);
    free(c2);
    cr_expect(rows[0].final != rows[2].final, "seeds 1 and 2 of base ended at the same eval loss %.17g: one run twice?",
              rows[0].final);
    /* the plot's data: curves.tsv holds the run's metrics.jsonl eval points, timed by its clock */
    char *curves = cmt_slurp(DIR "/a/curves.tsv", NULL), *metrics = cmt_slurp(DIR "/a/runs/hot-seed2/metrics.jsonl", NULL);
    cr_assert_not_null(metrics, "cannot read %s", DIR "/a/runs/hot-seed2/metrics.jsonl");
    cr_assert_not_null(curves, "cannot read %s", DIR "/a/curves.tsv");
    cr_expect(strstr(curves, "config\tseed\tbatch\tseconds\t" CE "\n"), "curves.tsv header");
    const char *line = strstr(curves, "hot\t2\t3\t");
    cr_assert_not_null(line, "no point of hot seed 2 at batch 3 in curves.tsv:\n%s", curves);
    double secs, val;
    cr_assert_eq(sscanf(line, "hot\t2\t3\t%lf\t%lf", &secs, &val), 2);
    cr_expect_eq(secs, rows[3].seconds, "the point's time is the run's time to target");
    char key[128];
    snprintf(key, sizeof key, "\"" CE "\": ");
    const char *m = strstr(metrics, key);
    cr_assert_not_null(m, "no eval line in hot-seed2's metrics.jsonl");
    cr_expect_eq(strtod(m + strlen(key), NULL), val, "curves.tsv %.17g vs metrics.jsonl", val);
    const char *w = strstr(metrics, "\"wall_clock/train\": ");
    cr_expect_not_null(w, "the child did not log SpeedMonitor's clock");
    free(curves);
    free(metrics);
    /* the picture: a series per config and the target */
    char *svg = cmt_slurp(DIR "/a/pareto.svg", NULL);
    cr_assert_not_null(svg, "cannot read %s", DIR "/a/pareto.svg");
    cr_expect(strstr(svg, "<svg") && strstr(svg, ">base<") && strstr(svg, ">hot<") && strstr(svg, ">target 100<"),
              "pareto.svg lacks its legend entries");
    cr_expect(strstr(svg, "training wall-clock (s)"), "x label");
    free(svg);
}

Test(cli_recipe, a_target_never_reached_runs_to_max_duration_and_gives_no_speedup) {
    /* forced the wrong way for a loss: never reached */
    int rc = run("recipe compare " DIR "/base.yaml " DIR "/hot.yaml --target '" CE ">=100' --seeds 1 -o " DIR "/b");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    row rows[4];
    int n = read_rows(DIR "/b/runs.tsv", rows, 4);
    cr_assert_eq(n, 2);
    for (int i = 0; i < 2; i++) {
        cr_expect_str_eq(rows[i].reached, "no");
        cr_expect_eq(rows[i].batch, -1);
        cr_expect(isnan(rows[i].seconds));
        cr_expect_eq(rows[i].end_batch, 12, "a run that never reaches trains to max_duration, got %lld",
                     rows[i].end_batch);
        cr_expect_str_eq(rows[i].stopped, "max_duration");
        cr_expect(isfinite(rows[i].final));
    }
    cr_expect(strstr(out, "0/1") && strstr(out, "none: the baseline reached the target in 0 of 1 seeds"), "%s", out);
}

/* One config, one seed, a target every run reaches: `recipe compare CONFIG --target TARGET` into
 * DIR/sub; its one row of runs.tsv, checked reached. */
static row reached_once(const char *config, const char *target, const char *sub) {
    char args[512];
    snprintf(args, sizeof args, "recipe compare " DIR "/%s --target %s --seeds 1 -o " DIR "/%s", config, target, sub);
    int rc = run(args);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    char path[256];
    snprintf(path, sizeof path, DIR "/%s/runs.tsv", sub);
    row rows[2];
    cr_assert_eq(read_rows(path, rows, 2), 1);
    cr_expect_str_eq(rows[0].reached, "yes", "%s", out);
    return rows[0];
}

/* A target on a training metric turns the training metrics on (off by default, as in Composer):
 * the curve has them and the run reaches it. */
Test(cli_recipe, a_training_metric_target_turns_the_training_metrics_on) {
    row r = reached_once("base.yaml", "metrics/train/LanguageCrossEntropy=100", "t");
    cr_expect_eq(r.batch, 1, "the first batch's cross-entropy is below 100, got batch %lld", r.batch);
    cr_expect(isfinite(r.final));
}

/* A target on one of a list of labelled eval loaders (metrics/eval/<label>/...): its stopper
 * watches that loader, so the run stops at the first evaluation. */
Test(cli_recipe, a_labelled_eval_loader_target_stops_the_run) {
    FILE *f = fopen(DIR "/multi.yaml", "w");
    cr_assert_not_null(f);
    fputs("max_duration: 12ba\neval_interval: 3ba\neval_subset_num_batches: 1\n"
          "model: {name: gpt2, preset: tiny}\n"
          "train_loader: {dataset: {type: tokens, dir: " DIR "/data}, batch_size: 4}\n"
          "eval_loader:\n"
          "  - {label: train_head, dataset: {type: tokens, dir: " DIR "/data}, batch_size: 4}\n"
          "  - {label: val, dataset: {type: tokens, dir: " DIR "/data, split: val}, batch_size: 4}\n"
          "optimizer: {name: decoupled_adamw, lr: 1.0e-3}\nsample: {max_new_tokens: 2}\n",
          f);
    fclose(f);
    row r = reached_once("multi.yaml", "metrics/eval/val/LanguageCrossEntropy=100", "m");
    cr_expect_eq(r.end_batch, 3, "ran to batch %lld; the ThresholdStopper on eval/val should end it at 3", r.end_batch);
    cr_expect_str_eq(r.stopped, "target");
}

Test(cli_recipe, a_budget_ends_a_run_from_outside) {
    int rc = run("recipe compare " DIR "/long.yaml --target " CE "=0.001 --seeds 1 --budget 3s -o " DIR "/c");
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    row r;
    cr_assert_eq(read_rows(DIR "/c/runs.tsv", &r, 1), 1);
    cr_expect_str_eq(r.stopped, "budget");
    cr_expect_str_eq(r.reached, "no");
    /* the batch it stopped at, or -1 when the budget came before its first evaluation (no curve) */
    cr_expect(r.end_batch == -1 || (r.end_batch > 0 && r.end_batch < 100000), "ran %lld batches", r.end_batch);
    char *tsv = cmt_slurp(DIR "/c/runs.tsv", NULL);
    cr_assert_not_null(tsv, "cannot read %s", DIR "/c/runs.tsv");
    const char *last_tab = strrchr(tsv, '\t');
    const char *p = last_tab;
    while (p > tsv && p[-1] != '\t') p--;
    const double proc = strtod(p, NULL);
    cr_expect(proc >= 3.0 && proc < 15.0, "the run lasted %.3f s with a 3 s budget", proc);
    free(tsv);
}

Test(cli_recipe, bad_flags_targets_and_configs_are_named_before_any_run) {
    struct {
        const char *args;
        int rc;
        const char *want;
    } cases[] = {
        {"recipe compare " DIR "/base.yaml", 2, "missing --target METRIC=VALUE"},
        {"recipe compare --target " CE "=1", 2, "missing BASELINE.yaml"},
        {"recipe compare " DIR "/base.yaml --target " CE, 2, "no '=', '<=' or '>='"},
        {"recipe compare " DIR "/base.yaml --target " CE "=low", 2, "value 'low' is not a finite number"},
        {"recipe compare " DIR "/base.yaml --target " CE "=1 --seeds 0", 2, "--seeds '0' must be a count from 1"},
        {"recipe compare " DIR "/base.yaml --target " CE "=1 --seeds 3,3", 2, "seed 3 is listed twice"},
        {"recipe compare " DIR "/base.yaml --target " CE "=1 --budget 10ba", 2, "--budget '10ba' is not a wall-clock"},
        {"recipe compare " DIR "/base.yaml --target " CE "=1 --seed 2", 2, "unknown flag '--seed'; did you mean '--seeds'?"},
        {"recipe compare " DIR "/nope.yaml --target " CE "=1", 2, "config '" DIR "/nope.yaml' is not a readable file"},
        {"recipe compare " DIR "/base.yaml " DIR "/typo.yaml --target " CE "=1 -o " DIR "/d", 2,
         "did you mean 'optimizer.lr'?"},
        {"recipe comapre", 2, "did you mean 'compare'?"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = run(cases[i].args);
        cr_expect_eq(rc, cases[i].rc, "'%s': exit %d, want %d:\n%s", cases[i].args, rc, cases[i].rc, out);
        cr_expect(strstr(out, cases[i].want), "'%s': output lacks '%s':\n%s", cases[i].args, cases[i].want, out);
    }
    struct stat st;
    cr_expect(stat(DIR "/d/runs", &st) != 0, "the typo in the recipe was found only after the baseline trained");
    /* a target metric the model does not compute: the run's own error names what it does compute */
    int rc = run("recipe compare " DIR "/base.yaml --target metrics/eval/MulticlassAccuracy=0.5 --seeds 1 -o " DIR "/e");
    cr_expect_eq(rc, 1, "exit %d:\n%s", rc, out);
    cr_expect(strstr(out, "MulticlassAccuracy") && strstr(out, "LanguageCrossEntropy"), "%s", out);
}

/* bench/recipes_summary.py --target: the time to another target is read from each run's curve (the
 * copy's NAME-curves.tsv), a run that never got there is "not reached", and one that stopped at its
 * own target before the new one is an error, not a guess. Hand-made runs, so the numbers are known. */
Test(cli_recipe, the_summary_retargets_from_the_curves) {
    cr_assert_eq(system("mkdir -p " DIR "/summary"), 0);
    FILE *f = fopen(DIR "/summary/r.tsv", "w");
    cr_assert_not_null(f);
    fputs("config\tseed\treached\tbatch_to_target\tseconds_to_target\tfinal\tbest\tend_batch\tend_seconds\tstopped_by\t"
          "process_seconds\trun_folder\n"
          "base\t1\tno\t-1\tnan\t1.95\t1.95\t30\t3.0\tmax_duration\t4\tx\n"
          "base\t2\tno\t-1\tnan\t1.97\t1.97\t30\t3.3\tmax_duration\t4\tx\n"
          "hot\t1\tyes\t30\t1.5\t1.9\t1.9\t30\t1.5\ttarget\t2\tx\n"
          "hot\t2\tyes\t30\t1.6\t1.89\t1.89\t30\t1.6\ttarget\t2\tx\n",
          f);
    fclose(f);
    cr_assert_not_null(f = fopen(DIR "/summary/r-curves.tsv", "w"));
    fputs("config\tseed\tbatch\tseconds\t" CE "\n"
          "base\t1\t10\t1.0\t2.5\nbase\t1\t20\t2.0\t2.0\nbase\t1\t30\t3.0\t1.95\n"
          "base\t2\t10\t1.0\t2.4\nbase\t2\t20\t2.2\t1.99\nbase\t2\t30\t3.3\t1.97\n"
          "hot\t1\t10\t0.5\t2.2\nhot\t1\t20\t1.0\t1.98\nhot\t1\t30\t1.5\t1.9\n"
          "hot\t2\t10\t0.5\t2.1\nhot\t2\t20\t1.1\t1.99\nhot\t2\t30\t1.6\t1.89\n",
          f);
    fclose(f);
    const char *py = "/usr/bin/python3 bench/recipes_summary.py";
    /* 2.0: base at 2.0 and 2.2 s, hot at 1.0 and 1.1 s */
    int rc = cmt_run_capture("/usr/bin/python3 bench/recipes_summary.py --target " CE "=2.0 " DIR "/summary/r.tsv", out,
                             sizeof out);
    cr_assert_eq(rc, 0, "%s: %s", py, out);
    cr_expect(strstr(out, "| base | 2/2 | 2.1 ± 0.1 |") && strstr(out, "| hot | 2/2 | 1.1 ± 0.1 |") &&
                  strstr(out, "2.00x (per seed 2.00"),
              "%s", out);
    /* 1.96: base seed 2 ended at 1.97 by max_duration: not reached, so no speed-up */
    rc = cmt_run_capture("/usr/bin/python3 bench/recipes_summary.py --target " CE "=1.96 " DIR "/summary/r.tsv", out,
                         sizeof out);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "| base | 1/2 |") && strstr(out, "none: not every seed reached"), "%s", out);
    /* 1.85: hot stopped at its own 1.9, so when it would have reached 1.85 is unknown */
    rc = cmt_run_capture("/usr/bin/python3 bench/recipes_summary.py --target " CE "=1.85 " DIR "/summary/r.tsv", out,
                         sizeof out);
    cr_expect_neq(rc, 0, "a target past the runs' own stop must fail: %s", out);
    cr_expect(strstr(out, "hot seed 1 stopped at its own target") && strstr(out, "--no-stop"), "%s", out);
    /* a rerun of base seed 1 in a later file (its time 1.0 s, reached) replaces the first run: at the
     * runs' own targets base is then 1.0 s and 4.0 s against hot's 1.5 and 1.6 */
    cr_assert_not_null(f = fopen(DIR "/summary/rerun.tsv", "w"));
    fputs("config\tseed\treached\tbatch_to_target\tseconds_to_target\tfinal\tbest\tend_batch\tend_seconds\tstopped_by\t"
          "process_seconds\trun_folder\n"
          "base\t1\tyes\t10\t1.0\t1.9\t1.9\t10\t1.0\ttarget\t2\tx\n"
          "base\t2\tyes\t40\t4.0\t1.9\t1.9\t40\t4.0\ttarget\t5\tx\n",
          f);
    fclose(f);
    rc = cmt_run_capture("/usr/bin/python3 bench/recipes_summary.py " DIR "/summary/r.tsv " DIR "/summary/rerun.tsv", out,
                         sizeof out);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "| base | 2/2 | 2.5 ± 2.1 | 1.0 .. 4.0 | 1.9 |") && strstr(out, "| hot | 2/2 | 1.6 ± 0.1 |") &&
                  strstr(out, "1.61x (per seed 1.58"),
              "a later file's run of the same config and seed replaces the earlier one:\n%s", out);
}
