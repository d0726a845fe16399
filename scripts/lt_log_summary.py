"""Counts the distinct GEMMs in a cuBLASLt trace log (CUBLASLT_LOG_LEVEL=2; scripts/gpu-check's
gemm_log stage): each cublasLtMatmul line with its pointers, stream and timestamp taken out, so the
calls that differ only in their buffers count as one. Prints count and the call, most frequent first.

usage: python3 scripts/lt_log_summary.py LOG"""
import re
import sys
from collections import Counter


def main():
    c = Counter()
    for ln in open(sys.argv[1], errors="replace"):
        if "cublasLtMatmul]" not in ln:
            continue
        ln = ln.split("cublasLtMatmul]", 1)[1]
        ln = re.sub(r"\b[A-Za-z]+=0[xX][0-9a-fA-F]+", "", ln)
        ln = re.sub(r"(stream|workSpace|workspaceSizeInBytes|alpha|beta)=\S+", "", ln)
        c[" ".join(ln.split())] += 1
    for k, n in c.most_common():
        print(f"{n:5d}  {k[:600]}")
    return 0 if c else 1


if __name__ == "__main__":
    sys.exit(main())
