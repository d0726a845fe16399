#!/usr/bin/python3
"""Summarises `composer recipe compare` runs.tsv files made separately (one per seed, as
bench/recipes-device.sh runs them side by side) into the table `composer recipe compare` prints for
one call: per config, the seeds that reached the target, time to target mean ± sample std (s),
min..max, mean final quality, and the speed-up over the first config (the baseline): the ratio of
the mean times, with the mean ± std of the per-seed ratios. A speed-up is given only when every
seed of both configs reached the target.

    /usr/bin/python3 bench/recipes_summary.py OUT/cpu2-seed1/runs.tsv OUT/cpu2-seed2/runs.tsv ...
"""
import csv
import math
import statistics
import sys


def stats(xs):
    if not xs:
        return None
    return (statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0, min(xs), max(xs))


def main(paths):
    rows = []
    for p in paths:
        with open(p, newline="") as f:
            rows += list(csv.DictReader(f, delimiter="\t"))
    if not rows:
        sys.exit("no runs in " + " ".join(paths))
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
