#!/usr/bin/env bash
# The pre-flight memory plan of automatic microbatching against the measured peak, on the example
# configs (and GPT-2 124M at T 1024 when BIG=1): for each, `composer train --plan-memory` with no
# budget gives the whole batch's arena peak P; then, under arena_budget = FRAC × P (default 0.4),
# --plan-memory names a microbatch size and its predicted arena peak, and a 2-batch training run
# with device_train_microbatch_size auto under the same budget reports (MemoryMonitor) the arena
# peak it reached, the peak RSS, and how often the size was logged (1 = no out-of-memory retry).
#
#   bench/memory_plan.sh                 # build/ must hold the built composer
#   BIG=1 bench/memory_plan.sh           # also GPT-2 124M (12 layers, 768 wide) at T 1024, with and
#                                        # without the fused lm_head + loss
#   FRAC=0.25 bench/memory_plan.sh
#   BIG=1 BIG_BATCH=8 FRAC=0.6 ONLY=124M bench/memory_plan.sh   # one case (a regex on the names)
#
# Writes bench/results/memory_plan.tsv. Needs the token files of the Shakespeare examples (made
# here with `composer data tokenize` if missing) and ../shared/data (MNIST, SST-2, BERT's vocab).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${COMPOSER:-build/tools/composer}
frac=${FRAC:-0.4}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=bench/results/memory_plan.tsv
[ -x "$bin" ] || { echo "build the composer first (make build)" >&2; exit 1; }
[ -d data/shakespeare_char ] ||
    "$bin" data tokenize --tokenizer char ../shared/data/tinyshakespeare/input.txt -o data/shakespeare_char >/dev/null
[ -d data/shakespeare_gpt2 ] ||
    "$bin" data tokenize --tokenizer gpt2 ../shared/data/tinyshakespeare/input.txt -o data/shakespeare_gpt2 >/dev/null

bert_sst2="model.pretrained=false model.pretrained_model_name_or_path=examples/bert-tiny tokenizer.name=../shared/data/bert"
gpt2_124m="model.n_layer=12 model.n_head=12 model.n_embd=768 model.n_positions=1024 train_loader.batch_size=${BIG_BATCH:-4}"
cases=(
    "mnist|examples/mnist.yaml|"
    "shakespeare-char|examples/shakespeare-char.yaml|sample.max_new_tokens=0"
    "gpt2-shakespeare|examples/gpt2-shakespeare.yaml|sample.max_new_tokens=0"
    "bert-mlm|examples/bert-mlm.yaml|callbacks.hf_checkpointer.save_folder=$tmp/hf"
    "bert-sst2 (random init)|examples/bert-sst2.yaml|$bert_sst2"
)
[ "${BIG:-0}" = 1 ] && cases+=("gpt2-124M T1024|examples/gpt2-shakespeare.yaml|sample.max_new_tokens=0 $gpt2_124m"
    "gpt2-124M T1024 fused head|examples/gpt2-shakespeare.yaml|sample.max_new_tokens=0 $gpt2_124m model.fused_linear_cross_entropy=true")

# the number after "label" in the plan's text
num() { grep -m1 "$1" | sed -E "s/.*$1 *([0-9.]+).*/\1/"; }
# the largest value of a metric in a metrics.jsonl, and how many times it was logged
metric_max() { grep -o "\"$2\": [0-9.e+-]*" "$1" | awk '{ if ($2 > m) m = $2 } END { printf "%.0f", m }'; }
metric_count() { grep -o "\"$2\"" "$1" | wc -l; }

[ -n "${ONLY:-}" ] && out=$tmp/only.tsv
printf "config\tbatch\tbudget_mib\tsize\tprobes\tplan_s\tretries\tpredicted_mib\tmeasured_mib\terror_pct\tstatic_mib\tpeak_rss_mib\n" >"$out"
for c in "${cases[@]}"; do
    IFS='|' read -r name cfg extra <<<"$c"
    [[ -z "${ONLY:-}" || "$name" =~ $ONLY ]] || continue
    # shellcheck disable=SC2086
    full=$("$bin" train "$cfg" --plan-memory device_train_microbatch_size=auto $extra 2>&1) ||
        { echo "$name: $full" >&2; continue; }
    batch=$(echo "$full" | sed -nE 's/.*\(cpu, ([0-9]+) rows a batch.*/\1/p')
    whole=$(echo "$full" | num "predicted peak")
    budget=$(awk -v p="$whole" -v f="$frac" 'BEGIN { printf "%d", p * f * 1048576 }')
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086
    plan=$("$bin" train "$cfg" --plan-memory device_train_microbatch_size=auto arena_budget=$budget $extra 2>&1) ||
        { echo "$name: $plan" >&2; continue; }
    t1=$(date +%s.%N)
    size=$(echo "$plan" | num "microbatch size")
    probes=$(echo "$plan" | num "dry runs")
    predicted=$(echo "$plan" | num "predicted peak")
    static=$(echo "$plan" | sed -nE 's/.*MiB of arena, ([0-9.]+) MiB with.*/\1/p')
    # shellcheck disable=SC2086
    "$bin" train "$cfg" device_train_microbatch_size=auto arena_budget=$budget max_duration=2ba eval_interval=0 \
        run_root="$tmp" run_name=run save_folder="$tmp/ck" -q 'callbacks.memory_monitor={}' $extra >"$tmp/log" 2>&1 ||
        { echo "$name: training failed:" >&2; cat "$tmp/log" >&2; continue; }
    m="$tmp/run/metrics.jsonl"
    measured=$(metric_max "$m" memory/arena_peak_bytes)
    rss=$(metric_max "$m" memory/peak_rss_bytes)
    retries=$(($(metric_count "$m" trainer/device_train_microbatch_size) - 1))
    awk -v n="$name" -v b="$batch" -v bu="$budget" -v s="$size" -v pr="$probes" -v t0="$t0" -v t1="$t1" -v r="$retries" \
        -v p="$predicted" -v me="$measured" -v st="$static" -v rss="$rss" 'BEGIN {
        mib = 1048576; m = me / mib
        printf "%s\t%d\t%.1f\t%d\t%d\t%.1f\t%d\t%.2f\t%.2f\t%+.1f\t%.1f\t%.0f\n", n, b, bu / mib, s, pr, t1 - t0, r, p, m,
               100 * (p - m) / m, st - p, rss / mib }' >>"$out"
    rm -rf "$tmp/run" "$tmp/ck" "$tmp/hf"
    tail -1 "$out"
done
column -t -s $'\t' "$out"
