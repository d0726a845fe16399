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
#   SKIP_MLM=1 bench/hf_finetune.sh           # reuse runs/bench-bert-mlm/huggingface/final
#
# Other knobs: FT_SEQ (max_seq_len of fine-tuning, 128 as the seed; SST-2's longest sentence is 66
# tokens, so 64 gives the same model at half the cost), FT_LR, SEED, THREADS (CM_NUM_THREADS),
# COMPOSER (the binary, default build/tools/composer). Results are appended to
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
THREADS=${THREADS:-}
ROOT=runs
OUT=bench/results/hf_finetune.tsv

[ -x "$COMPOSER" ] || { echo "$COMPOSER not found: run make build first" >&2; exit 1; }
[ -n "$THREADS" ] && export CM_NUM_THREADS="$THREADS"
mkdir -p bench/results
[ -f "$OUT" ] || printf 'date\thost\trun\tinit\tbudget\tdev_accuracy\tdev_cross_entropy\tbatches\twall_s\n' >"$OUT"
host=$(hostname 2>/dev/null || echo host)

# run NAME INIT BUDGET ARGS...: one composer train; appends a result row, prints it
run() {
    name=$1 init=$2 budget=$3
    shift 3
    log=$(mktemp)
    start=$(date +%s.%N)
    if ! "$COMPOSER" train "$@" >"$log" 2>&1; then
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
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\n' "$(date -u +%Y-%m-%dT%H:%M:%S)" "$host" "$name" "$init" "$budget" \
        "${acc:--}" "${ce:--}" "${batches:--}" "$wall" | tee -a "$OUT"
}

printf 'run\tinit\tbudget\tdev_accuracy\tdev_cross_entropy\tbatches\twall_s (appended to %s)\n' "$OUT"
if [ -z "${SKIP_MLM:-}" ]; then
    run bert-mlm random "$MLM_DURATION" examples/bert-mlm.yaml progress_bar=false run_root=$ROOT run_name=bench-bert-mlm \
        seed="$SEED" max_duration="$MLM_DURATION" save_folder=null callbacks.hf_checkpointer.save_folder=$ROOT/bench-bert-mlm
fi
FOLDER=$ROOT/bench-bert-mlm/huggingface/final
[ -f "$FOLDER/config.json" ] || { echo "no pretrained folder $FOLDER (run without SKIP_MLM)" >&2; exit 1; }
for init in pretrained random; do
    pre=true
    [ $init = random ] && pre=false
    run bert-sst2 "$init" "$FT_DURATION" examples/bert-sst2.yaml progress_bar=false run_root=$ROOT run_name=bench-bert-sst2-$init \
        seed="$SEED" max_duration="$FT_DURATION" model.pretrained_model_name_or_path="$FOLDER" model.pretrained=$pre \
        train_loader.dataset.max_seq_len="$FT_SEQ" eval_loader.dataset.max_seq_len="$FT_SEQ" optimizer.lr="$FT_LR" \
        save_folder=null
done
