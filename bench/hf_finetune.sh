#!/bin/sh
# Does MLM pretraining show its worth? The seeds' workflow measured: examples/bert-mlm.yaml
# pretrains a BERT-Tiny-shaped model with masked LM on SST-2's training sentences and tiny
# Shakespeare, then examples/bert-sst2.yaml fine-tunes it on SST-2 — once from the pretrained
# folder and once from random weights (model.pretrained=false), the same config and the same
# budget — and the SST-2 dev accuracy, cross-entropy and wall-clock of each are reported.
#
#   bench/hf_finetune.sh                      # pretraining 6 epochs, fine-tuning 3 epochs (the
#                                             # examples as written: hours on two cores)
#   MLM_DURATION=2ep FT_DURATION=1ep bench/hf_finetune.sh    # a smaller budget
#   SKIP_MLM=1 bench/hf_finetune.sh           # reuse runs/$MLM_NAME/huggingface/final
#   FOLDER=/path/to/body SEEDS="17 18 19 20 21 22" FULL=0 bench/hf_finetune.sh
#                                             # fine-tune a given folder only, few labels, six seeds
#
# Two fine-tuning settings, each run from the pretrained folder and from random weights: the first
# SUBSET rows of SST-2's training set (2000; 0 skips it) for SUBSET_DURATION (3ep) — few labels,
# where pretraining on the unlabelled sentences matters most — then all of it for FT_DURATION (the
# seeds'; FULL=0 skips it). Each setting runs once per seed of SEEDS (default: SEED), both inits
# with the same seed (it sets the data order, the dropout masks and the new weights), and a
# summary follows the rows: per setting and init the mean and standard deviation over the seeds,
# and the paired difference pretrained - random with its standard error (the per-seed differences'
# standard deviation / sqrt(seeds)) — one seed's accuracy on 2000 rows moves by a point or two.
# FOLDER fine-tunes an existing pretrained folder (no pretraining run).
#
# Other knobs: MLM_NAME (the pretraining run's name, bench-bert-mlm), FT_SEQ (max_seq_len of fine-tuning, 128 as the seed; SST-2's longest sentence is 66
# tokens, so 64 gives the same model at half the cost), FT_LR, SEED (the pretraining's seed and the
# default SEEDS), THREADS (CM_NUM_THREADS),
# COMPOSER (the binary, default build/tools/composer), DATA (the folder holding sst2/,
# tinyshakespeare/ and bert/, default ../shared/data), EXTRA (overrides added to every run, e.g.
# "device=gpu precision=amp_bf16": scripts/gpu-check --only mlm runs it so), MLM_TEXT (more text
# files for pretraining, space-separated, e.g. the corpus bench/mlm_corpus.py makes), MLM_ARGS and
# FT_ARGS (overrides for the pretraining run only / the fine-tuning runs only, shell-quoted, e.g.
# MLM_ARGS="train_loader.dataset.mlm_probability=0.3"). Results are appended to
# bench/results/hf_finetune.tsv. Run from the repository root on an otherwise idle machine: the
# wall-clock figures are only comparable between runs on the same machine and load.
# For scale: Google's BERT-Tiny, pretrained on BooksCorpus + Wikipedia, scores 83.2 on SST-2
# (GLUE test set, google-research/bert README).
set -eu

COMPOSER=${COMPOSER:-build/tools/composer}
MLM_DURATION=${MLM_DURATION:-6ep}
FT_DURATION=${FT_DURATION:-3ep}
FT_SEQ=${FT_SEQ:-128}
FT_LR=${FT_LR:-1.0e-4}
SEED=${SEED:-17}
SEEDS=${SEEDS:-$SEED}
FULL=${FULL:-1}
FOLDER=${FOLDER:-}
SUBSET=${SUBSET:-2000}
SUBSET_DURATION=${SUBSET_DURATION:-3ep}
MLM_NAME=${MLM_NAME:-bench-bert-mlm}
THREADS=${THREADS:-}
DATA=${DATA:-../shared/data}
EXTRA=${EXTRA:-}
MLM_TEXT=${MLM_TEXT:-}
MLM_ARGS=${MLM_ARGS:-}
FT_ARGS=${FT_ARGS:-}
ROOT=runs
OUT=bench/results/hf_finetune.tsv

[ -x "$COMPOSER" ] || { echo "$COMPOSER not found: run make build first" >&2; exit 1; }
[ -n "$THREADS" ] && export CM_NUM_THREADS="$THREADS"
mkdir -p bench/results
[ -f "$OUT" ] || printf 'date\thost\trun\tinit\tbudget\tdev_accuracy\tdev_cross_entropy\tbatches\twall_s\tseed\n' >"$OUT"
host=$(hostname 2>/dev/null || echo host)
rows=$(mktemp) # this invocation's rows, for the summary
trap 'rm -f "$rows"' EXIT

# run NAME INIT BUDGET SEED ARGS...: one composer train; appends a result row, prints it
run() {
    name=$1 init=$2 budget=$3 seed=$4
    shift 4
    log=$(mktemp)
    start=$(date +%s.%N)
    # shellcheck disable=SC2086 # EXTRA is a list of overrides
    if ! "$COMPOSER" train "$@" $EXTRA >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        exit 1
    fi
    end=$(date +%s.%N)
    acc=$(sed -n 's/.*metrics\/eval\/MulticlassAccuracy: //p' "$log" | tail -1)
    ce=$(sed -n 's/.*metrics\/eval\/CrossEntropy: //p' "$log" | tail -1)
    batches=$(sed -n 's/^trained \([0-9]*\) batches.*/\1/p' "$log" | tail -1)
    wall=$(awk "BEGIN {print $end - $start}")
    rm -f "$log"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%s\n' "$(date -u +%Y-%m-%dT%H:%M:%S)" "$host" "$name" "$init" "$budget" \
        "${acc:--}" "${ce:--}" "${batches:--}" "$wall" "$seed" | tee -a "$OUT" "$rows"
}

printf 'run\tinit\tbudget\tdev_accuracy\tdev_cross_entropy\tbatches\twall_s\tseed (appended to %s)\n' "$OUT"
if [ -z "${SKIP_MLM:-}" ] && [ -z "$FOLDER" ]; then
    text="$DATA/sst2/train.tsv, $DATA/tinyshakespeare/input.txt"
    for f in $MLM_TEXT; do
        [ -f "$f" ] || { echo "MLM_TEXT: no file $f" >&2; exit 1; }
        text="$text, $f"
    done
    eval "set -- $MLM_ARGS"
    run bert-mlm random "$MLM_DURATION" "$SEED" examples/bert-mlm.yaml progress_bar=false run_root=$ROOT run_name="$MLM_NAME" \
        seed="$SEED" max_duration="$MLM_DURATION" save_folder=null callbacks.hf_checkpointer.save_folder="$ROOT/$MLM_NAME" \
        tokenizer.name="$DATA/bert" train_loader.dataset.path="[$text]" "$@"
fi
FOLDER=${FOLDER:-$ROOT/$MLM_NAME/huggingface/final}
[ -f "$FOLDER/config.json" ] || { echo "no pretrained folder $FOLDER (run without SKIP_MLM, or set FOLDER)" >&2; exit 1; }
# fine-tune NAME TRAIN_DATASET DURATION: the pretrained and the random-weights run, for each seed
finetune() {
    name=$1 data=$2 dur=$3
    eval "set -- $FT_ARGS"
    for seed in $SEEDS; do
        for init in pretrained random; do
            pre=true
            [ $init = random ] && pre=false
            run "$name" "$init" "$dur" "$seed" examples/bert-sst2.yaml progress_bar=false run_root=$ROOT \
                run_name=bench-$name-$init-$seed seed="$seed" max_duration="$dur" \
                model.pretrained_model_name_or_path="$FOLDER" model.pretrained=$pre train_loader.dataset="$data" \
                eval_loader.dataset.max_seq_len="$FT_SEQ" eval_loader.dataset.dir="$DATA/sst2" \
                optimizer.lr="$FT_LR" save_folder=null "$@"
        done
    done
}
# few labels first (cheaper, and where a body should matter most): the first SUBSET rows of
# train.tsv, SUBSET_DURATION of training
if [ "$SUBSET" -gt 0 ]; then
    head -n $((SUBSET + 1)) "$DATA/sst2/train.tsv" >"$ROOT/sst2-train-$SUBSET.tsv"
    finetune "bert-sst2-$SUBSET" "{type: tsv, path: $ROOT/sst2-train-$SUBSET.tsv, max_seq_len: $FT_SEQ}" "$SUBSET_DURATION"
fi
# the seeds' setting: all of SST-2's training set
if [ "$FULL" != 0 ]; then
    finetune bert-sst2 "{type: sst2, dir: $DATA/sst2, split: train, max_seq_len: $FT_SEQ}" "$FT_DURATION"
fi

# per setting: each init's mean ± standard deviation over the seeds, and pretrained - random paired by seed
echo "summary (dev accuracy over seeds $SEEDS; pretrained folder $FOLDER)"
awk -F'\t' '
$3 != "bert-mlm" && $6 != "-" {
    k = $3; if (!(k in seen)) { seen[k] = 1; order[++n] = k }
    v[k, $4, $10] = $6; s[k, $4] += $6; ss[k, $4] += $6 * $6; c[k, $4]++
}
function sd(k, i,   m) { if (c[k, i] < 2) return 0; m = s[k, i] / c[k, i]; return sqrt((ss[k, i] - c[k, i] * m * m) / (c[k, i] - 1)) }
END {
    for (j = 1; j <= n; j++) {
        k = order[j]
        for (i = 1; i <= 2; i++) {
            init = i == 1 ? "pretrained" : "random"
            if (c[k, init]) printf "  %s %-10s %.4f +- %.4f (%d seeds)\n", k, init, s[k, init] / c[k, init], sd(k, init), c[k, init]
        }
        m = 0; q = 0; p = 0
        for (key in v) {
            split(key, f, SUBSEP)
            if (f[1] != k || f[2] != "pretrained" || !((k, "random", f[3]) in v)) continue
            d = v[key] - v[k, "random", f[3]]; m += d; q += d * d; p++
        }
        if (p) {
            m /= p; se = p > 1 ? sqrt((q - p * m * m) / (p - 1) / p) : 0
            printf "  %s pretrained - random: %+.4f (standard error %.4f over %d paired seeds)\n", k, m, se, p
        }
    }
}' "$rows"
