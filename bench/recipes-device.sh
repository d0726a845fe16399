#!/bin/bash
# Time to quality of the GPT recipes (examples/recipes/gpt-char) on a lent machine, in one call:
#  - CPU: one `composer recipe compare` per seed, each pinned to its own two cores (taskset,
#    CM_NUM_THREADS=2) and run side by side, so every seed sees a quiet two-core machine;
#  - GPU: the same configs with device=gpu, 3 seeds in one compare.
# Run on the device machine from the repository root of a checkout that has this script (the
# device tool copies the session's checkout: main, once this is merged) with .gpu
# (scripts/gpu-bundle, or any bundle holding bin/composer and its libraries) and
# data/shakespeare_char carried:
#     run(command="bench/recipes-device.sh", carry=[".gpu", "data/shakespeare_char"], timeout_s=540)
# then summarise here: /usr/bin/python3 bench/recipes_summary.py <files_at>/cpu2-seed*/runs.tsv
# TARGET (default metrics/eval/LanguageCrossEntropy=2.1) and BUDGET (default 4m) override.
# FAMILY=gpt-bpe times examples/recipes/gpt-bpe instead (carry data/shakespeare_gpt2; default
# target 5.2); CPU_SEEDS="" skips the CPU seeds (a GPU row only: gpt-bpe's CPU runs take ~4 min each).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cm-recipes-out}
FAMILY=${FAMILY:-gpt-char}
case "$FAMILY" in
gpt-char) DEF_TARGET=2.1 ;;
gpt-bpe) DEF_TARGET=5.2 ;;
*) echo "recipes-device: FAMILY is gpt-char or gpt-bpe, not '$FAMILY'"; exit 2 ;;
esac
TARGET=${TARGET:-metrics/eval/LanguageCrossEntropy=$DEF_TARGET}
BUDGET=${BUDGET:-4m}
CPU_SEEDS=${CPU_SEEDS-1 2 3}
mkdir -p "$OUT"
B=/tmp/cm-gpu
rm -rf "$B" && mkdir -p "$B"
tar -C "$B" -xJf .gpu/bundle.tar.xz || { echo "recipes-device: cannot unpack .gpu/bundle.tar.xz"; exit 1; }
cudalib=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$d/libcublasLt.so.13" ] && cudalib="$cudalib:$d"
done
if [ -z "$cudalib" ]; then
    d=$(python3 -c "import nvidia.cublas, os; print(os.path.join(os.path.dirname(nvidia.cublas.__file__), 'lib'))" 2>/dev/null)
    [ -n "$d" ] && cudalib=":$d"
    d=$(python3 -c "import nvidia.cuda_runtime, os; print(os.path.join(os.path.dirname(nvidia.cuda_runtime.__file__), 'lib'))" 2>/dev/null)
    [ -n "$d" ] && cudalib="$cudalib:$d"
fi
export LD_LIBRARY_PATH="$B/lib$cudalib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
C="$B/bin/composer"
R=examples/recipes/$FAMILY
CFGS="$R/baseline.yaml $R/mild.yaml $R/medium.yaml $R/hot.yaml"
{ lscpu; nproc; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat "$B/COMMIT"; } >"$OUT/machine.txt" 2>&1
echo "target $TARGET budget $BUDGET" >>"$OUT/machine.txt"
pids=""
for s in $CPU_SEEDS; do
    taskset -c $((2 * s - 2)),$((2 * s - 1)) env CM_NUM_THREADS=2 "$C" recipe compare $CFGS --target "$TARGET" \
        --seeds "$s," --budget "$BUDGET" -o "$OUT/cpu2-seed$s" >"$OUT/cpu2-seed$s.txt" 2>&1 &
    pids="$pids $!"
done
taskset -c 8-15 env CM_NUM_THREADS=8 "$C" recipe compare $CFGS --target "$TARGET" --seeds 3 --budget "$BUDGET" \
    -o "$OUT/gpu" device=gpu >"$OUT/gpu.txt" 2>&1
echo "gpu compare: exit $?"
for p in $pids; do wait "$p"; echo "cpu compare $p: exit $?"; done
# the weights and samples are not needed to read the results (and are most of the bytes)
find "$OUT" \( -name model.safetensors -o -name sample.txt -o -name tokenizer.json \) -delete
tail -n 8 "$OUT"/cpu2-seed*.txt "$OUT/gpu.txt" 2>/dev/null
