"""Runs every tests/golden/gen_*.py generator with Debian's PyTorch. `make golden` calls this.

A generator that needs a source this machine does not have (gen_streaming_vectors.py needs a
checkout of MosaicML Streaming) exits with NEEDS_SOURCE; it is reported at the end as not run, its
committed files are kept, and the others still run. Any other failure fails `make golden`.
"""
import glob
import os
import runpy
import sys

NEEDS_SOURCE = 3

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
not_run, failed = [], []
for gen in sorted(glob.glob(os.path.join(here, "gen_*.py"))):
    name = os.path.basename(gen)
    print("golden:", name, flush=True)
    try:
        runpy.run_path(gen, run_name="__main__")
    except SystemExit as e:
        if e.code == NEEDS_SOURCE:
            not_run.append(name)
        elif e.code not in (None, 0):
            failed.append(name)
for name in not_run:
    print(f"golden: {name} NOT RUN: it needs a source named in its docstring above; "
          "its committed files are unchanged")
if failed:
    sys.exit("golden: FAILED: " + ", ".join(failed))
