"""Runs every tests/golden/gen_*.py generator with Debian's PyTorch. `make golden` calls this."""
import glob
import os
import runpy
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
for gen in sorted(glob.glob(os.path.join(here, "gen_*.py"))):
    print("golden:", os.path.basename(gen))
    runpy.run_path(gen, run_name="__main__")
