#!/usr/bin/python3
"""Summarises `composer recipe compare` runs.tsv files made separately (one per seed, as
bench/recipes-device.sh runs them side by side) into the table `composer recipe compare` prints for
one call: per config, the seeds that reached the target, time to target mean ± sample std (s),
min..max, mean final quality, and the speed-up over the first config (the baseline): the ratio of
the mean times, with the mean ± std of the per-seed ratios. A speed-up is given only when every
seed of both configs reached the target.

    /usr/bin/python3 bench/recipes_summary.py OUT/cpu2-seed1/runs.tsv OUT/cpu2-seed2/runs.tsv ...

A run of a config and seed that a later file holds again is replaced by the later one (a rerun).

With --target METRIC=VALUE the time to another target is read from the curves.tsv beside each
runs.tsv (every evaluation against training time; for a copy NAME.tsv, NAME-curves.tsv): the first evaluation that reached it, by the
tool's rule (lower is better for names with loss, error, perplexity or cross-entropy; `<=` / `>=`
before the value force it). A run that stopped at its own target before reaching the new one
cannot say when it would have: that is an error (rerun with --no-stop), not "not reached".

    /usr/bin/python3 bench/recipes_summary.py --target metrics/eval/LanguageCrossEntropy=1.95 OUT/runs.tsv
"""
import csv
import math
import os
import statistics
import sys


def lower_is_better(name):
    n = name.lower()
    return any(k in n for k in ("loss", "error", "perplexity", "crossentropy", "cross_entropy"))


def retarget(rows, runs_path, spec):
    """Replaces each row's reached / seconds_to_target by the first crossing of spec in curves.tsv."""
    name, _, value = spec.partition("=")
    if not value:
        sys.exit("--target wants METRIC=VALUE, got " + spec)
    if value.startswith("<=") or value.startswith(">="):
        lower, value = value.startswith("<="), value[2:]
    else:
        lower = lower_is_better(name)
    target = float(value)
    curves = runs_path[:-4] + "-curves.tsv" if runs_path.endswith(".tsv") else ""
    if not os.path.exists(curves):  # a copy kept as NAME.tsv + NAME-curves.tsv, else the tool's folder
        curves = os.path.join(os.path.dirname(runs_path) or ".", "curves.tsv")
    with open(curves, newline="") as f:
        pts = list(csv.DictReader(f, delimiter="\t"))
    if pts and name not in pts[0]:
        sys.exit("%s: no column %s (has %s)" % (curves, name, ", ".join(pts[0])))
    for r in rows:
        mine = [p for p in pts if p["config"] == r["config"] and p["seed"] == r["seed"]]
        hit = next((p for p in mine if (float(p[name]) <= target if lower else float(p[name]) >= target)), None)
        if hit:
            r["reached"], r["seconds_to_target"] = "yes", hit["seconds"]
        elif r["stopped_by"] == "target":
            sys.exit("%s seed %s stopped at its own target before reaching %s=%s: rerun it with --no-stop"
                     % (r["config"], r["seed"], name, value))
        else:
            r["reached"], r["seconds_to_target"] = "no", "nan"


def stats(xs):
    if not xs:
        return None
    return (statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0, min(xs), max(xs))


def main(args):
    spec = None
    if args[:1] == ["--target"] and len(args) > 1:
        spec, args = args[1], args[2:]
    paths = args
    rows = []
    for p in paths:
        with open(p, newline="") as f:
            mine = list(csv.DictReader(f, delimiter="\t"))
        if spec:
            retarget(mine, p, spec)
        rows += mine
    if not rows:
        sys.exit("no runs in " + " ".join(paths))
    # a run of the same config and seed in a later file replaces the earlier one (a rerun)
    rows = list({(r["config"], r["seed"]): r for r in rows}.values())
    configs = list(dict.fromkeys(r["config"] for r in rows))
    seeds = sorted({int(r["seed"]) for r in rows})
    t = {(r["config"], int(r["seed"])): float(r["seconds_to_target"]) for r in rows if r["reached"] == "yes"}
    fin = {c: [float(r["final"]) for r in rows if r["config"] == c and not math.isnan(float(r["final"]))]
           for c in configs}
    base = configs[0]
    print("| config | reached | time to target (s), mean ± std | min .. max | final (mean) | speed-up vs %s |" % base)
    print("|---|---|---|---|---|---|")
    for c in configs:
        ts = [t[(c, s)] for s in seeds if (c, s) in t]
        st = stats(ts)
        tt = "%.1f ± %.1f" % st[:2] if st else "-"
        mm = "%.1f .. %.1f" % st[2:] if st else "-"
        fm = "%.4g" % statistics.mean(fin[c]) if fin[c] else "-"
        if c == base:
            sp = "(baseline)"
        elif all((base, s) in t and (c, s) in t for s in seeds):
            ratio = sum(t[(base, s)] for s in seeds) / sum(t[(c, s)] for s in seeds)
            per = stats([t[(base, s)] / t[(c, s)] for s in seeds])
            sp = "%.2fx (per seed %.2f ± %.2f, %.2f .. %.2f)" % ((ratio,) + per)
        else:
            sp = "none: not every seed reached the target"
        print("| %s | %d/%d | %s | %s | %s | %s |" % (c, len(ts), len(seeds), tt, mm, fm, sp))


if __name__ == "__main__":
    main(sys.argv[1:])
