"""Sums ncu's per-kernel durations by kernel name (scripts/gpu-check's profile stage).

usage: python3 scripts/ncu_summary.py NCU_CSV_LOG [STEPS]
NCU_CSV_LOG is what `ncu --csv --metrics gpu__time_duration.sum PROGRAM` printed (the program's own
lines mixed in are skipped); STEPS divides the totals to give a step's share. Prints one line per
kernel name, largest first: total ms per step, launches per step, mean us, share of the GPU time."""
import csv
import sys
from collections import defaultdict

SCALE = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3, "s": 1e3}


def main():
    path = sys.argv[1]
    steps = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    lines = [ln for ln in open(path, errors="replace") if ln.startswith('"')]
    tot, cnt = defaultdict(float), defaultdict(int)
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(row["Metric Value"].replace(",", ""))
        name = row["Kernel Name"]
        short = name.split("(")[0][:90]
        tot[short] += v * SCALE.get(row.get("Metric Unit", "ns"), 1e-6)
        cnt[short] += 1
    all_ms = sum(tot.values())
    if not all_ms:
        print(f"{path}: no gpu__time_duration.sum rows")
        return 1
    print(f"GPU time per step {all_ms / steps:.2f} ms in {sum(cnt.values()) / steps:.0f} launches")
    print(f"{'ms/step':>8} {'n/step':>7} {'mean us':>8} {'share':>6}  kernel")
    for k in sorted(tot, key=tot.get, reverse=True):
        print(f"{tot[k] / steps:8.2f} {cnt[k] / steps:7.0f} {1e3 * tot[k] / cnt[k]:8.1f} {100 * tot[k] / all_ms:5.1f}%  {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
