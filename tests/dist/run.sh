#!/bin/sh
# Runs one distributed test case through the launcher.
# Usage: tests/dist/run.sh COMPOSER_BIN TEST_BIN_DIR CASE
set -u
composer=$1
bin=$2
case_=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# the shared data (../shared/data from the repository root; scripts/gpu-check points it into its bundle)
data=${CM_SHARED_DATA:-../shared/data}

# A real S3-compatible server on loopback (s3rver, installed by scripts/install-deps) behind
# tests/s3/s3proxy.py, which checks every request's SigV4 signature; the environment points
# every rank at it. Both stop when the case ends.
s3_start() {
    s3rver=${CM_S3RVER:-/usr/local/lib/composer-test-tools/node_modules/.bin/s3rver}
    [ -x "$s3rver" ] || fail "s3rver is not installed at $s3rver: run scripts/install-deps"
    s3port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    mkdir -p "$tmp/s3data"
    # its listing continuation tokens use DES, in OpenSSL 3's legacy provider
    NODE_OPTIONS=--openssl-legacy-provider "$s3rver" -d "$tmp/s3data" -a 127.0.0.1 -p "$s3port" --silent \
        --configure-bucket bkt >"$tmp/s3rver.log" 2>&1 &
    s3pid=$!
    /usr/bin/python3 tests/s3/s3proxy.py "$s3port" S3RVER S3RVER "$tmp/proxy.port" >"$tmp/proxy.log" 2>&1 &
    proxypid=$!
    trap 'kill $s3pid $proxypid 2>/dev/null; rm -rf "$tmp"' EXIT
    for _ in $(seq 150); do
        [ -f "$tmp/proxy.port" ] && /usr/bin/python3 -c "import socket; socket.create_connection(('127.0.0.1', $s3port))" \
            2>/dev/null && break
        sleep 0.1
    done
    [ -f "$tmp/proxy.port" ] || fail "the S3 test proxy did not start: $(cat "$tmp/proxy.log")"
    export S3_ENDPOINT_URL="http://127.0.0.1:$(cat "$tmp/proxy.port")" AWS_ACCESS_KEY_ID=S3RVER \
        AWS_SECRET_ACCESS_KEY=S3RVER AWS_REGION=us-east-1
}
s3_stat() { # a counter of the proxy ("refused": requests whose signature it rejected)
    /usr/bin/python3 -c "import json, urllib.request; print(json.load(urllib.request.urlopen('$S3_ENDPOINT_URL/__proxy/stats'))['$1'])"
}

# `timeout` guards the harness itself: a case that hangs fails instead of blocking the suite.
# A hang shows as a run that lasted the whole limit (exit statuses cannot tell: mpirun itself
# reports a rank killed by SIGKILL as 137).
launch() {
    t0=$(date +%s)
    timeout -k 5 60 "$composer" "$@"
    rc_=$?
    [ $(($(date +%s) - t0)) -lt 60 ] || fail "the job hung until the harness timeout (60 s)"
    return $rc_
}

# A tiny char GPT (2 layers, 32 wide, vocabulary from the text) over the first 20 kB of tiny
# Shakespeare, trained for 6 batches of 6 windows in microbatches of 2 (uneven on 2 ranks: 2+1),
# with an evaluation after batch 3 and at the end. No run_name: each job generates one.
cli_setup() {
    head -c 20000 "$data/tinyshakespeare/input.txt" >"$tmp/input.txt" || fail "no $data"
    "$composer" data tokenize --tokenizer char -q "$tmp/input.txt" -o "$tmp/data" || fail "tokenize"
    cat >"$tmp/tiny.yaml" <<EOF
max_duration: 6ba
eval_interval: 3ba
eval_subset_num_batches: 2
progress_bar: false
device_train_microbatch_size: 2
model: {name: gpt2, preset: tiny}
train_loader: {dataset: {type: tokens, dir: $tmp/data}, batch_size: 6}
eval_loader: {dataset: {type: tokens, dir: $tmp/data}, batch_size: 4}
optimizer: {name: sgd, lr: 0.5, momentum: 0.9}
sample: {max_new_tokens: 8}
EOF
}

case "$case_" in
launcher_env_and_stdout_per_rank)
    launch -n 3 --stdout "$tmp/out{rank}of{world_size}.txt" sh -c 'echo "$RANK $LOCAL_RANK $NODE_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_PORT"' \
        || fail "launching sh on 3 ranks"
    for r in 0 1 2; do
        [ "$(cat "$tmp/out${r}of3.txt")" = "$r $r 0 3 3 29500" ] || fail "rank $r wrote '$(cat "$tmp/out${r}of3.txt")'"
    done
    # each rank gets a share of the cores unless the environment chose a thread count
    cores=$(getconf _NPROCESSORS_ONLN); want=$((cores / 2)); [ $want -ge 1 ] || want=1
    got=$(env -u CM_NUM_THREADS -u OMP_NUM_THREADS "$composer" -n 2 sh -c 'echo "$CM_NUM_THREADS $OMP_NUM_THREADS"' | sort -u)
    [ "$got" = "$want $want" ] || fail "threads per rank: '$got', want '$want $want' ($cores cores, 2 ranks)"
    got=$(CM_NUM_THREADS=3 "$composer" -n 2 sh -c 'echo "$CM_NUM_THREADS"' | sort -u)
    [ "$got" = 3 ] || fail "CM_NUM_THREADS=3 became '$got'"
    "$composer" -n --help | grep -q "usage: composer -n N" || fail "composer -n --help shows no usage"
    "$composer" -n 2 --stdout "x{rnk}" sh -c true 2>"$tmp/err" && fail "a bad format was accepted"
    grep -q "unknown placeholder '{rnk}'" "$tmp/err" || fail "bad format message: $(cat "$tmp/err")"
    # a machine without ssh or rsh (a container, the lent GPU machine): Open MPI's mpirun refuses
    # even a one-node job while it cannot find them; the launcher tells it not to look
    mkdir -p "$tmp/nossh"
    ln -s "$(command -v "${CM_MPIRUN:-mpirun}")" "$tmp/nossh/mpirun"
    got=$(timeout 60 env PATH="$tmp/nossh" "$composer" -n 2 /bin/sh -c 'echo "rank $RANK"' 2>&1 | sort)
    [ "$got" = "$(printf 'rank 0\nrank 1')" ] || fail "2 ranks without ssh on PATH: $got"
    ;;
collectives)
    for n in 2 3 4; do
        launch -n $n "$bin/dist_collectives" || fail "collectives on $n ranks"
    done
    ;;
train_equivalence)
    # The reference: one plain process (no MPI at all).
    env -u OMPI_COMM_WORLD_SIZE "$bin/dist_train" "$tmp/ref.txt" || fail "1-process run"
    "$bin/dist_train" "$tmp/ref_tok.txt" tokens || fail "1-process run (tokens)"
    # Tolerance: ranks sum their microbatch gradients in a different order and MPI adds the
    # per-rank sums, so each gradient differs from the 1-process one by a few f32 roundings
    # (~1e-7 relative); 8 SGD steps with clipping carry that into the parameters. 2e-6 relative
    # (absolute below 1) is ~20 ulps: far below what a wrong weighting or a missing rank gives
    # (summing with MAX instead of SUM, for one, is off by 7e-2).
    tol=2e-6
    for n in 2 3 4; do
        launch -n $n "$bin/dist_train" "$tmp/n$n.txt" || fail "training on $n ranks"
        "$bin/dist_train" --compare "$tmp/ref.txt" "$tmp/n$n.txt" $tol || fail "$n ranks differ from 1 process"
    done
    launch -n 3 "$bin/dist_train" "$tmp/n3tok.txt" tokens || fail "token-weighted training on 3 ranks"
    "$bin/dist_train" --compare "$tmp/ref_tok.txt" "$tmp/n3tok.txt" $tol || fail "3 ranks (tokens) differ from 1 process"
    # Dropout (p 0.3 after both activations): each row's mask is keyed by its global row, so
    # N ranks (and any microbatching) draw the masks one process draws.
    env -u OMPI_COMM_WORLD_SIZE "$bin/dist_train" "$tmp/ref_drop.txt" dropout || fail "1-process run (dropout)"
    for strategy in NO_SHARD FULL_SHARD; do
        launch -n 3 "$bin/dist_train" "$tmp/drop.txt" dropout $strategy || fail "dropout ($strategy) on 3 ranks"
        "$bin/dist_train" --compare "$tmp/ref_drop.txt" "$tmp/drop.txt" $tol || fail "dropout ($strategy) on 3 ranks differs from 1 process"
    done
    # Automatic microbatching, searched together: with a 6300-byte arena (the middle of the window,
    # 6100-6500 bytes, where this holds) the 4-row slice of rank 0
    # runs out and the 3-row slices do not, so all three ranks retry the batch with smaller pieces.
    for strategy in NO_SHARD SHARD_GRAD_OP; do
        launch -n 3 "$bin/dist_train" "$tmp/auto.txt" auto=6300 $strategy >"$tmp/auto.out" 2>&1 || { cat "$tmp/auto.out"; fail "auto microbatching ($strategy) on 3 ranks"; }
        grep -q "1 rank(s) ran out of arena memory" "$tmp/auto.out" || { cat "$tmp/auto.out"; fail "no rank followed another's out-of-memory retry"; }
        "$bin/dist_train" --compare "$tmp/ref.txt" "$tmp/auto.txt" $tol || fail "auto microbatching ($strategy) on 3 ranks differs from 1 process"
        # the same with the pre-flight memory plan: each rank's plan fits its slice on the first try
        launch -n 3 "$bin/dist_train" "$tmp/plan.txt" plan=6300 $strategy >"$tmp/plan.out" 2>&1 || { cat "$tmp/plan.out"; fail "planned auto microbatching ($strategy) on 3 ranks"; }
        grep -q "ran out of arena memory" "$tmp/plan.out" && { cat "$tmp/plan.out"; fail "a planned size ran out of memory ($strategy)"; }
        grep -q "memory plan" "$tmp/plan.out" || { cat "$tmp/plan.out"; fail "no memory plan was printed ($strategy)"; }
        "$bin/dist_train" --compare "$tmp/ref.txt" "$tmp/plan.txt" $tol || fail "planned auto microbatching ($strategy) on 3 ranks differs from 1 process"
    done
    ;;
train_equivalence_sharded)
    # ZeRO: the same 8 steps as one plain process (NO_SHARD), with the optimizer state and the
    # reduced gradient sharded. The tolerance is the NO_SHARD one, for the same reason: a
    # reduce-scatter adds the per-rank sums in another order than one process does (a few f32
    # roundings); the norm for clipping is a sum over ranks of partial sums of squares.
    env -u OMPI_COMM_WORLD_SIZE "$bin/dist_train" "$tmp/ref.txt" || fail "1-process run"
    tol=2e-6
    env -u OMPI_COMM_WORLD_SIZE "$bin/dist_train" "$tmp/ref_val.txt" value || fail "1-process run (value clipping)"
    for strategy in SHARD_GRAD_OP FULL_SHARD; do
        launch -n 3 "$bin/dist_train" "$tmp/val.txt" value $strategy || fail "$strategy with value clipping on 3 ranks"
        "$bin/dist_train" --compare "$tmp/ref_val.txt" "$tmp/val.txt" $tol || fail "$strategy (value clipping) differs"
        "$bin/dist_train" "$tmp/s1.txt" $strategy || fail "$strategy on one process"
        "$bin/dist_train" --compare "$tmp/ref.txt" "$tmp/s1.txt" $tol || fail "$strategy on 1 process differs"
        for n in 2 3 4; do
            launch -n $n "$bin/dist_train" "$tmp/n$n.txt" $strategy || fail "$strategy on $n ranks"
            "$bin/dist_train" --compare "$tmp/ref.txt" "$tmp/n$n.txt" $tol || fail "$strategy on $n ranks differs from 1 process"
        done
        env -u OMPI_COMM_WORLD_SIZE "$bin/dist_train" "$tmp/ref_tail.txt" tail || fail "1-process run (tail)"
        for n in 3 4; do
            launch -n $n "$bin/dist_train" "$tmp/tail$n.txt" tail $strategy || fail "$strategy with empty slices on $n ranks"
            "$bin/dist_train" --compare "$tmp/ref_tail.txt" "$tmp/tail$n.txt" $tol || fail "$strategy (empty slices) on $n ranks differs"
        done
        launch -n 3 "$bin/dist_train" "$tmp/n3tok.txt" tokens $strategy || fail "$strategy token-weighted on 3 ranks"
        if [ $strategy = FULL_SHARD ]; then
            launch -n 2 "$bin/dist_train" "$tmp/x.txt" auto=6000 FULL_SHARD >"$tmp/fs.out" 2>&1 && fail "FULL_SHARD accepted auto microbatching on 2 ranks"
            grep -q "auto with FULL_SHARD on 2 ranks" "$tmp/fs.out" || { cat "$tmp/fs.out"; fail "no clear error for auto microbatching under FULL_SHARD"; }
        fi
        "$bin/dist_train" "$tmp/ref_tok.txt" tokens || fail "1-process run (tokens)"
        "$bin/dist_train" --compare "$tmp/ref_tok.txt" "$tmp/n3tok.txt" $tol || fail "$strategy (tokens) on 3 ranks differs"
    done
    ;;
gpt_sharded_equivalence)
    # A tiny GPT-2 (tied embeddings, attention, layer norms, a unit per block), 6 AdamW steps
    # with clipping, global batch 6 in microbatches of 2 (uneven on 4 ranks: 2+2+1+1). Same
    # tolerance argument as train_equivalence; Adam's normalised step can magnify a rounding
    # difference on a near-zero gradient element (3.6e-6 seen on 2 ranks), hence 2e-5 here.
    env -u OMPI_COMM_WORLD_SIZE "$bin/dist_gpt" "$tmp/ref.txt" NO_SHARD || fail "1-process GPT run"
    tol=2e-5
    for strategy in NO_SHARD SHARD_GRAD_OP FULL_SHARD; do
        for n in 2 3 4; do
            launch -n $n "$bin/dist_gpt" "$tmp/g$n.txt" $strategy || fail "GPT $strategy on $n ranks"
            "$bin/dist_train" --compare "$tmp/ref.txt" "$tmp/g$n.txt" $tol || fail "GPT $strategy on $n ranks differs from 1 process"
        done
    done
    # lm_head fused with the loss (chunks of 4 rows): the tied head's gradient, made in the loss's
    # forward and scaled in its backward, is reduced like any other — 2 ranks equal the unfused
    # one-process run
    for strategy in SHARD_GRAD_OP FULL_SHARD; do
        launch -n 2 "$bin/dist_gpt" "$tmp/gf.txt" $strategy fused || fail "fused-head GPT $strategy on 2 ranks"
        "$bin/dist_train" --compare "$tmp/ref.txt" "$tmp/gf.txt" $tol || fail "fused-head GPT $strategy on 2 ranks differs from 1 process"
    done
    # With dropout 0.1 everywhere (masks keyed by global row, attention's fused mask included):
    # 2.2e-5 seen (Adam again, on rarely used token embeddings), so 1e-4; masks drawn per rank
    # instead are off by 3e-2 on almost every value.
    env -u OMPI_COMM_WORLD_SIZE "$bin/dist_gpt" "$tmp/refd.txt" NO_SHARD dropout || fail "1-process GPT run (dropout)"
    for n in 2 3; do
        launch -n $n "$bin/dist_gpt" "$tmp/gd.txt" FULL_SHARD dropout || fail "GPT FULL_SHARD with dropout on $n ranks"
        "$bin/dist_train" --compare "$tmp/refd.txt" "$tmp/gd.txt" 1e-4 || fail "GPT with dropout on $n ranks differs from 1 process"
    done
    # Units of 2 MiB and more (a 256-wide block: 3 MB) sit on 2 MiB-aligned buffers madvised for
    # transparent huge pages under FULL_SHARD (every gather faults the released pages in again):
    # the same values, and the pages are huge wherever the kernel's THP mode is not "never". SGD
    # with momentum: Adam's normalised step turns this wide model's rounding differences into
    # 1e-2 apart on 2 ranks of NO_SHARD too; SGD's stay at 6e-7.
    env -u OMPI_COMM_WORLD_SIZE "$bin/dist_gpt" "$tmp/refw.txt" NO_SHARD embd=256 sgd >/dev/null || fail "1-process wide GPT run"
    launch -n 2 "$bin/dist_gpt" "$tmp/gw.txt" FULL_SHARD embd=256 sgd >"$tmp/gw.out" || fail "wide GPT FULL_SHARD on 2 ranks"
    "$bin/dist_train" --compare "$tmp/refw.txt" "$tmp/gw.txt" $tol || fail "wide GPT FULL_SHARD on 2 ranks differs from 1 process"
    huge=$(sed -n 's/^hugepages: \(-*[0-9]*\) kB/\1/p' "$tmp/gw.out")
    if grep -q '\[never\]' /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null; then
        echo "THP is off on this machine: huge pages not checked"
    else
        [ "${huge:-0}" -ge 2048 ] || { cat "$tmp/gw.out"; fail "FULL_SHARD's 3 MB units got no transparent huge page (AnonHugePages ${huge:-?} kB)"; }
    fi
    env -u OMPI_COMM_WORLD_SIZE "$bin/dist_gpt" "$tmp/ref16.txt" NO_SHARD bf16 || fail "1-process GPT run (amp_bf16)"
    launch -n 3 "$bin/dist_gpt" "$tmp/g16.txt" FULL_SHARD bf16 || fail "GPT FULL_SHARD amp_bf16 on 3 ranks"
    "$bin/dist_train" --compare "$tmp/ref16.txt" "$tmp/g16.txt" $tol || fail "GPT FULL_SHARD amp_bf16 differs from 1 process"
    ;;
act_ckpt_equivalence)
    # Activation checkpointing of every block changes no bit: one process (fp32 and amp_bf16,
    # dropout on, microbatches of 2), and 3 ranks of each sharding strategy against the same
    # ranks without it (tolerance 0: the files hold every value to 9 digits, which round-trips
    # f32). Against one process the usual GPT dropout tolerance (gpt_sharded_equivalence) holds.
    g=$bin/dist_gpt
    for p in "" bf16; do
        env -u OMPI_COMM_WORLD_SIZE "$g" "$tmp/ref$p.txt" NO_SHARD dropout $p || fail "1-process GPT run $p"
        env -u OMPI_COMM_WORLD_SIZE "$g" "$tmp/ck$p.txt" NO_SHARD dropout ckpt $p || fail "1-process checkpointed GPT run $p"
        "$bin/dist_train" --compare "$tmp/ref$p.txt" "$tmp/ck$p.txt" 0 || fail "checkpointing changed a 1-process run $p"
    done
    for strategy in NO_SHARD SHARD_GRAD_OP FULL_SHARD; do
        launch -n 3 "$g" "$tmp/a.txt" $strategy dropout || fail "GPT $strategy on 3 ranks"
        launch -n 3 "$g" "$tmp/b.txt" $strategy dropout ckpt || fail "checkpointed GPT $strategy on 3 ranks"
        "$bin/dist_train" --compare "$tmp/a.txt" "$tmp/b.txt" 0 || fail "checkpointing changed $strategy on 3 ranks"
        "$bin/dist_train" --compare "$tmp/ref.txt" "$tmp/b.txt" 1e-4 || fail "checkpointed $strategy on 3 ranks differs from 1 process"
    done
    ;;
gpu_data_parallel_equivalence)
    # NO_SHARD with the model on GPUs over several ranks (each process on its local rank's GPU —
    # here they share one; the gradients are downloaded into pinned host stages during backward
    # and all-reduced over MPI) equals one GPU process: with dropout in fp32 (the tolerance of
    # cli_train_equivalence), under DEFAULT and PURE (those of mixed_precision_equivalence; PURE
    # reduces half the bytes); the reductions start during backward. `composer -n 3 train
    # device=gpu` equals `composer train device=gpu`, and a sharded strategy with device gpu is
    # refused naming the key. Skipped (77) where no GPU can be used (the CUDA emulator build,
    # -DCM_CUDA=EMU, runs it).
    g=$bin/dist_gpt
    env -u OMPI_COMM_WORLD_SIZE "$g" "$tmp/f1.txt" NO_SHARD sgd dropout gpu >"$tmp/f1.log" 2>&1
    rc=$?
    [ $rc = 77 ] && { cat "$tmp/f1.log"; exit 77; }
    [ $rc = 0 ] || { cat "$tmp/f1.log"; fail "one GPU process"; }
    launch -n 2 "$g" "$tmp/f2.txt" NO_SHARD sgd dropout gpu >"$tmp/f2.log" 2>&1 || { cat "$tmp/f2.log"; fail "2 GPU ranks"; }
    grep "^bytes:" "$tmp/f2.log"
    grep -q "buckets [1-9][0-9]* early, 0 late" "$tmp/f2.log" || fail "the reductions did not start during backward"
    "$bin/dist_train" --compare "$tmp/f1.txt" "$tmp/f2.txt" 2e-6 || fail "2 GPU ranks differ from one GPU process"
    # the model on the GPU before cm_dist_new, rank 1 built with other weights: rank 0's are
    # broadcast from GPU memory
    launch -n 2 "$g" "$tmp/f3.txt" NO_SHARD sgd dropout gpu=first >"$tmp/f3.log" 2>&1 || { cat "$tmp/f3.log"; fail "2 GPU ranks, moved first"; }
    "$bin/dist_train" --compare "$tmp/f1.txt" "$tmp/f3.txt" 2e-6 || fail "2 GPU ranks (moved before cm_dist_new) differ from one GPU process"
    for pt in DEFAULT:2e-5 PURE:1e-3; do
        pol=${pt%%:*} tol=${pt#*:}
        env -u OMPI_COMM_WORLD_SIZE "$g" "$tmp/m1.txt" NO_SHARD bf16 sgd mp=$pol gpu >/dev/null || fail "one GPU process, $pol"
        launch -n 2 "$g" "$tmp/m2.txt" NO_SHARD bf16 sgd mp=$pol gpu >"$tmp/m2.log" 2>&1 || { cat "$tmp/m2.log"; fail "2 GPU ranks, $pol"; }
        grep "^bytes:" "$tmp/m2.log" | sed "s/^/$pol: /"
        "$bin/dist_train" --compare "$tmp/m1.txt" "$tmp/m2.txt" $tol || fail "$pol on 2 GPU ranks differs from one GPU process"
        bytes_=$(sed -n 's/^bytes: reduced \([0-9]*\).*/\1/p' "$tmp/m2.log")
        if [ $pol = DEFAULT ]; then b_default=$bytes_; else b_pure=$bytes_; fi
    done
    [ "$b_default" = $((2 * b_pure)) ] || fail "PURE reduced $b_pure bytes, DEFAULT $b_default: not half"
    cli_setup
    "$composer" train "$tmp/tiny.yaml" run_root="$tmp/ref" device=gpu >"$tmp/ref.out" 2>&1 || { cat "$tmp/ref.out"; fail "composer train device=gpu"; }
    launch -n 3 train "$tmp/tiny.yaml" run_root="$tmp/n3" device=gpu >"$tmp/n3.out" 2>&1 || { cat "$tmp/n3.out"; fail "composer -n 3 train device=gpu"; }
    "$bin/dist_cli_compare" "$tmp/ref/"* "$tmp/n3/"* 2e-6 || fail "3 GPU ranks differ from one GPU process"
    launch -n 2 train "$tmp/tiny.yaml" run_root="$tmp/fs" device=gpu parallelism.fsdp.sharding_strategy=FULL_SHARD >"$tmp/fs.out" 2>&1 \
        && fail "FULL_SHARD with device gpu was not refused"
    grep -q "parallelism.fsdp.sharding_strategy.*use NO_SHARD" "$tmp/fs.out" || { cat "$tmp/fs.out"; fail "the refusal does not name the key and the fix"; }
    ;;
mixed_precision_equivalence)
    # FSDP mixed precision on 2 ranks equals one process (tests/test_mixed_precision.c proves one
    # process against a reference rounding the parameters before every forward): a tiny GPT under
    # amp_bf16, SGD with momentum (a step linear in the gradient), 6 batches in microbatches of 2.
    # DEFAULT (bf16 parameters, f32 reductions): the gathered parameters are the bf16 roundings of
    # the same masters, the reductions differ only in f32 summation order: the tolerance of
    # gpt_sharded_equivalence, 2e-5 (3e-8 seen). PURE (bf16 reductions too): each rank rounds its
    # part of the gradient to bf16 before the sum (summed in f32, rounded once), one process rounds
    # the whole, so a reduced element differs by up to ~1.5 bf16 ulps (2^-8 relative); 6 steps at
    # lr 0.05 carry that into the parameters: 3e-4 seen, 1e-3 allowed (the bf16 sum leaving out
    # rank 1's part is off by 4e-3).
    g=$bin/dist_gpt
    env -u OMPI_COMM_WORLD_SIZE "$g" "$tmp/d1.txt" NO_SHARD bf16 sgd mp=DEFAULT >/dev/null || fail "1-process DEFAULT"
    env -u OMPI_COMM_WORLD_SIZE "$g" "$tmp/p1.txt" NO_SHARD bf16 sgd mp=PURE >/dev/null || fail "1-process PURE"
    run_mp() { # OUT POLICY STRATEGY [options]: trains on 2 ranks, prints the byte counters
        out_=$1 pol_=$2; shift 2
        launch -n 2 "$g" "$tmp/$out_.txt" "$@" bf16 sgd mp=$pol_ >"$tmp/$out_.log" 2>&1 || { cat "$tmp/$out_.log"; fail "$pol_ $* on 2 ranks"; }
        grep "^bytes:" "$tmp/$out_.log" | sed "s/^/$pol_ $1: /"
    }
    run_mp sgo DEFAULT SHARD_GRAD_OP
    "$bin/dist_train" --compare "$tmp/d1.txt" "$tmp/sgo.txt" 2e-5 || fail "SHARD_GRAD_OP DEFAULT on 2 ranks differs from 1 process"
    run_mp fsd DEFAULT FULL_SHARD bp=PRE fwd
    "$bin/dist_train" --compare "$tmp/d1.txt" "$tmp/fsd.txt" 2e-5 || fail "FULL_SHARD DEFAULT (prefetch) on 2 ranks differs from 1 process"
    run_mp fsp PURE FULL_SHARD bp=NONE
    "$bin/dist_train" --compare "$tmp/p1.txt" "$tmp/fsp.txt" 1e-3 || fail "FULL_SHARD PURE (no prefetch) on 2 ranks differs from 1 process"
    run_mp nsp PURE NO_SHARD
    "$bin/dist_train" --compare "$tmp/p1.txt" "$tmp/nsp.txt" 1e-3 || fail "NO_SHARD PURE on 2 ranks differs from 1 process"
    run_mp hyp PURE HYBRID_SHARD shard=1
    "$bin/dist_train" --compare "$tmp/p1.txt" "$tmp/hyp.txt" 1e-3 || fail "HYBRID_SHARD PURE on 2 ranks differs from 1 process"
    run_mp fsf FULL FULL_SHARD
    # the bytes: bf16 parameters halve FULL_SHARD's gathers, bf16 reductions its reduce-scatters
    # (the same collectives: with or without prefetch every unit is gathered as often here)
    b() { sed -n "s/^bytes: reduced \([0-9]*\) gathered \([0-9]*\).*/\1 \2/p" "$tmp/$1.log"; }
    set -- $(b fsf) $(b fsp) $(b fsd)
    [ "$1" -gt 0 ] && [ "$2" -gt 0 ] || fail "FULL_SHARD FULL counted no bytes: $*"
    [ $(($1 / 2)) -eq "$3" ] && [ $(($2 / 2)) -eq "$4" ] || fail "PURE moved $3 / $4 bytes (reduced / gathered), FULL $1 / $2: not half"
    [ "$5" -eq "$1" ] && [ $(($2 / 2)) -eq "$6" ] || fail "DEFAULT moved $5 / $6 bytes, FULL $1 / $2: want f32 reductions, half the gathers"
    # NO_SHARD's all-reduce in bf16 moves half of SHARD_GRAD_OP's f32 reduce-scatter (same gradient, no padding here)
    set -- $(b sgo) $(b nsp)
    [ $(($1 / 2)) -eq "$3" ] || fail "NO_SHARD PURE reduced $3 bytes, SHARD_GRAD_OP DEFAULT $1: not half"
    ;;
full_shard_prefetch)
    # FULL_SHARD prefetch changes when a unit's all-gather starts, never a value: every setting
    # (forward_prefetch on/off x backward_prefetch PRE / POST / NONE x limit_all_gathers on/off)
    # gives the bits of FULL_SHARD without prefetch on 2 ranks (tolerance 0), which equals one
    # process within gpt_sharded_equivalence's tolerance. A GPT of 4 blocks (5 units: the
    # embeddings + final norm, one per block), with an eval pass every 3 batches. The counters
    # (summed over ranks) show the prefetch happened: gathers started ahead and then read by the
    # tape ("hits"), fewer blocking gathers than without, and the in-flight limit held.
    g=$bin/dist_gpt
    env -u OMPI_COMM_WORLD_SIZE "$g" "$tmp/ref.txt" NO_SHARD layers=4 || fail "1-process GPT run"
    launch -n 2 "$g" "$tmp/off.txt" FULL_SHARD layers=4 bp=NONE >"$tmp/off.out" || fail "FULL_SHARD without prefetch"
    "$bin/dist_train" --compare "$tmp/ref.txt" "$tmp/off.txt" 2e-5 || fail "FULL_SHARD without prefetch differs from 1 process"
    cat "$tmp/off.out"
    stat() { sed -n "s/^prefetch: .* $2 \([0-9]*\).*/\1/p" "$1"; }
    [ "$(stat "$tmp/off.out" prefetched)" = 0 ] || fail "prefetches with every prefetch key off"
    blocking_off=$(stat "$tmp/off.out" gathers)
    max_nolimit=0
    for fwd in "" fwd; do
        for bp in NONE PRE POST; do
            for lim in "" nolimit; do
                [ -z "$fwd$lim" ] && [ $bp = NONE ] && continue
                launch -n 2 "$g" "$tmp/p.txt" FULL_SHARD layers=4 bp=$bp $fwd $lim >"$tmp/p.out" || fail "FULL_SHARD bp=$bp $fwd $lim"
                cat "$tmp/p.out"
                "$bin/dist_train" --compare "$tmp/off.txt" "$tmp/p.txt" 0 || fail "prefetch (bp=$bp $fwd $lim) changed FULL_SHARD's bits"
                pf=$(stat "$tmp/p.out" prefetched); hits=$(stat "$tmp/p.out" hits); all=$(stat "$tmp/p.out" gathers)
                inflight=$(stat "$tmp/p.out" max_in_flight)
                if [ -z "$fwd" ] && [ $bp = NONE ]; then
                    [ "$pf" = 0 ] || fail "bp=NONE without forward_prefetch prefetched $pf gathers"
                    continue
                fi
                # most prefetched gathers are read by the tape, and they replace blocking ones
                [ "$hits" -gt 0 ] && [ $((2 * hits)) -ge "$pf" ] || fail "bp=$bp $fwd $lim: $pf prefetched, $hits read"
                [ $((all - pf)) -lt "$blocking_off" ] || fail "bp=$bp $fwd $lim: $((all - pf)) blocking gathers, $blocking_off without prefetch"
                if [ -z "$lim" ]; then
                    [ "$inflight" -le 2 ] || fail "limit_all_gathers: $inflight gathers in flight"
                elif [ "$inflight" -gt "$max_nolimit" ]; then
                    max_nolimit=$inflight
                fi
            done
        done
    done
    # without the limit, prefetch runs further ahead (up to max_resident_units units)
    [ "$max_nolimit" -gt 2 ] || fail "no more than 2 gathers in flight without limit_all_gathers"
    # activation checkpointing: the replays read the units inside backward
    launch -n 2 "$g" "$tmp/c0.txt" FULL_SHARD layers=4 bp=NONE ckpt >/dev/null || fail "checkpointed, no prefetch"
    launch -n 2 "$g" "$tmp/c1.txt" FULL_SHARD layers=4 bp=PRE fwd ckpt >"$tmp/c1.out" || fail "checkpointed with prefetch"
    "$bin/dist_train" --compare "$tmp/c0.txt" "$tmp/c1.txt" 0 || fail "prefetch changed a checkpointed FULL_SHARD run"
    [ "$(stat "$tmp/c1.out" hits)" -gt 0 ] || fail "no prefetch hit with activation checkpointing"
    ;;
timeout_names_missing_rank)
    start=$(date +%s)
    CM_DIST_TIMEOUT=2 launch -n 3 "$bin/dist_faults" skip >"$tmp/out" 2>&1
    rc=$?
    end=$(date +%s)
    cat "$tmp/out"
    [ $rc -ne 0 ] || fail "exit status 0 after a skipped collective"
    grep -q "error (CM_ERR_TIMEOUT): .*timed out after .* in collective #3 all_reduce" "$tmp/out" \
        || fail "no CM_ERR_TIMEOUT message naming #3 all_reduce"
    grep -q "rank 2 did not arrive (last seen entering #2 all_reduce" "$tmp/out" || fail "the message does not name rank 2"
    echo "ended in $((end - start)) s with status $rc"
    ;;
killed_rank_ends_job)
    CM_DIST_TIMEOUT=30 launch -n 3 "$bin/dist_faults" kill >"$tmp/out" 2>&1
    rc=$?
    cat "$tmp/out"
    [ $rc -ne 0 ] || fail "exit status 0 after a rank was killed"
    grep -qi "signal 9\|killed" "$tmp/out" || fail "the output does not say a rank was killed"
    ;;
crashed_rank_shows_error)
    CM_DIST_TIMEOUT=30 launch -n 3 "$bin/dist_faults" crash >"$tmp/out" 2>&1
    rc=$?
    cat "$tmp/out"
    [ $rc -ne 0 ] || fail "exit status 0 after a rank failed"
    grep -q "simulated failure: cannot read shard 7" "$tmp/out" || fail "the failing rank's error is not shown"
    ;;
data_algos_on_ranks)
    # SeqLengthWarmup cuts every row the same way on any number of ranks, so N ranks train as one
    # process — the full-length dry run of the first batch included, which runs the strategy's
    # collectives (DDP's gradient all-reduce, SHARD_GRAD_OP's reduce-scatter, FULL_SHARD's gathers
    # and phantom microbatches) — and the trainer recounts the shorter batches' tokens on every
    # rank. Same tolerance as cli_train_equivalence.
    cli_setup
    slw="algorithms.seq_length_warmup={duration: 1.0, min_seq_length: 8, max_seq_length: 32, step_size: 8}"
    "$composer" train "$tmp/tiny.yaml" run_root="$tmp/ref" run_name=ref "$slw" >"$tmp/ref.out" 2>&1 || { cat "$tmp/ref.out"; fail "1-process train"; }
    for st in NO_SHARD SHARD_GRAD_OP FULL_SHARD; do
        launch -n 2 train "$tmp/tiny.yaml" run_root="$tmp/$st" run_name=s parallelism.fsdp.sharding_strategy=$st "$slw" \
            >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "SeqLengthWarmup under $st on 2 ranks"; }
        "$bin/dist_cli_compare" "$tmp/ref/ref" "$tmp/$st/s" 2e-6 || fail "SeqLengthWarmup under $st: 2 ranks differ from 1 process"
    done
    # truncate false re-cuts each rank's 3 rows of 32 tokens into more, shorter rows (12, then 6, then
    # 4): in the same global order as one process's, so with dropout the masks — keyed by global
    # row — agree only if every rank's row offset and the batch's row total are recounted
    slw="algorithms.seq_length_warmup={duration: 1.0, min_seq_length: 8, max_seq_length: 32, step_size: 8, truncate: false}"
    "$composer" train "$tmp/tiny.yaml" run_root="$tmp/ref" run_name=reshape model.dropout=0.1 "$slw" >"$tmp/ref.out" 2>&1 \
        || { cat "$tmp/ref.out"; fail "1-process train (reshape)"; }
    launch -n 2 train "$tmp/tiny.yaml" run_root="$tmp/re" run_name=s model.dropout=0.1 "$slw" \
        >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "SeqLengthWarmup (reshape) on 2 ranks"; }
    "$bin/dist_cli_compare" "$tmp/ref/reshape" "$tmp/re/s" 2e-6 || fail "SeqLengthWarmup (reshape, dropout): 2 ranks differ from 1 process"
    # SelectiveBackprop selects on each rank's rows: the job runs, counts the kept samples, and
    # refuses the sharded strategies with a message instead of a hang
    sb="algorithms.selective_backprop={start: 0, end: 1, interrupt: 0}"
    launch -n 2 train "$tmp/tiny.yaml" run_root="$tmp/sb" run_name=sb "$sb" >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "SelectiveBackprop on 2 ranks"; }
    [ "$(grep -c '"loss/train/total"' "$tmp/sb/sb/metrics.jsonl")" = 6 ] || fail "SelectiveBackprop on 2 ranks: not 6 train losses"
    launch -n 2 train "$tmp/tiny.yaml" run_root="$tmp/sbfs" run_name=sb parallelism.fsdp.sharding_strategy=FULL_SHARD "$sb" \
        >"$tmp/out" 2>&1 && fail "SelectiveBackprop under FULL_SHARD should be refused"
    grep -q "SelectiveBackprop: the selection forward under a sharded strategy on 2 ranks is not supported" "$tmp/out" \
        || { cat "$tmp/out"; fail "SelectiveBackprop under FULL_SHARD: no clear message"; }
    ;;
cli_train_equivalence)
    # `composer -n N train` against a plain `composer train` of the same config.
    cli_setup
    "$composer" train "$tmp/tiny.yaml" run_root="$tmp/ref" >"$tmp/ref.out" 2>&1 || { cat "$tmp/ref.out"; fail "1-process train"; }
    # Tolerance 2e-6 relative (absolute below 1), as in train_equivalence: the ranks sum their
    # microbatch gradients in another order and MPI adds the per-rank sums, so each gradient is
    # the 1-process one up to a few f32 roundings (~1e-7 relative); 6 SGD steps carry that into
    # the weights (measured: 1.2e-7 on 2 ranks, 1.5e-7 on 3, 2.1e-7 on 4). The config is plain
    # SGD with no clipping on purpose: AdamW and norm clipping are invariant to the gradient's
    # scale and would hide a rank weighting its gradient wrongly, which SGD shows at once (a
    # rank training alone on all the data, or a per-rank batch of the global size, is off by
    # more than 1e-2 in the weights).
    tol=2e-6
    for n in 2 3; do
        launch -n $n train "$tmp/tiny.yaml" run_root="$tmp/n$n" >"$tmp/n$n.out" 2>&1 || { cat "$tmp/n$n.out"; fail "train on $n ranks"; }
        cat "$tmp/n$n.out"
        # rank 0 alone writes the run folder, and one folder for the job (the generated name agrees)
        [ "$(ls "$tmp/n$n" | wc -l)" = 1 ] || fail "$n ranks made $(ls "$tmp/n$n" | wc -l) run folders: $(ls "$tmp/n$n")"
        dir="$tmp/n$n/$(ls "$tmp/n$n")"
        files=$(cd "$dir" && ls | tr '\n' ' ')
        [ "$files" = "config.yaml log.txt loss.svg metrics.jsonl model.safetensors sample.txt tokenizer.json " ] \
            || fail "$n ranks: the run folder holds '$files'"
        [ "$(grep -c '^trained 6 batches' "$tmp/n$n.out")" = 1 ] || fail "$n ranks: not exactly one 'trained' line (rank 0 speaks)"
        grep -q "$n ranks (NO_SHARD" "$dir/log.txt" || fail "$n ranks: log.txt does not say how many ranks"
        [ "$(grep -c '"loss/train/total"' "$dir/metrics.jsonl")" = 6 ] || fail "$n ranks: metrics.jsonl has other than 6 train losses"
        "$bin/dist_cli_compare" "$tmp/ref/"* "$dir" $tol || fail "$n ranks differ from 1 process"
    done
    # eval splits the eval set over the ranks and all-reduces the metric sums: the same metrics
    ref_dir=$(echo "$tmp/ref/"*)
    "$composer" eval "$tmp/tiny.yaml" --weights "$ref_dir/model.safetensors" >"$tmp/eval1.out" 2>&1 || { cat "$tmp/eval1.out"; fail "1-process eval"; }
    launch -n 3 eval "$tmp/tiny.yaml" --weights "$ref_dir/model.safetensors" >"$tmp/eval3.out" 2>&1 || { cat "$tmp/eval3.out"; fail "eval on 3 ranks"; }
    cat "$tmp/eval3.out"
    grep metrics/ "$tmp/eval1.out" >"$tmp/m1"
    grep metrics/ "$tmp/eval3.out" >"$tmp/m3"
    [ -s "$tmp/m1" ] && cmp -s "$tmp/m1" "$tmp/m3" || fail "eval on 3 ranks printed other metrics: $(cat "$tmp/m3") vs $(cat "$tmp/m1")"
    ;;
cli_train_sharding_and_timeout_keys)
    # parallelism.fsdp.sharding_strategy and dist_timeout from the config
    cli_setup
    # a misspelt strategy: one message (not one per rank) naming the key and the valid values
    launch -n 2 train "$tmp/tiny.yaml" run_root="$tmp/runs" parallelism.fsdp.sharding_strategy=FULL_SHRAD >"$tmp/out" 2>&1
    rc=$?
    cat "$tmp/out"
    [ $rc = 2 ] || fail "exit status $rc for a bad sharding_strategy (want 2)"
    [ "$(grep -c 'parallelism.fsdp.sharding_strategy' "$tmp/out")" = 1 ] || fail "the error is not shown exactly once"
    grep 'parallelism.fsdp.sharding_strategy' "$tmp/out" | grep -q "FULL_SHRAD.*NO_SHARD.*SHARD_GRAD_OP.*FULL_SHARD" \
        || fail "the message does not list the valid values"
    [ ! -e "$tmp/runs" ] || fail "a run folder was made for a bad config"
    # ZeRO-2 and ZeRO-3 from the config: the same training as one process (tolerance as in
    # cli_train_equivalence: the gradient is the same sum, reduce-scattered instead of
    # all-reduced), and under FULL_SHARD the parameters are gathered before rank 0 saves and
    # samples (the sample is the 1-process one; without the gather it would come from zeros)
    "$composer" train "$tmp/tiny.yaml" run_root="$tmp/ref" run_name=ref >"$tmp/ref.out" 2>&1 || { cat "$tmp/ref.out"; fail "1-process train"; }
    for st in SHARD_GRAD_OP FULL_SHARD; do
        for n in 2 3; do
            launch -n $n train "$tmp/tiny.yaml" run_root="$tmp/$st$n" run_name=s parallelism.fsdp.sharding_strategy=$st \
                >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "$st on $n ranks"; }
            grep -q "$n ranks ($st" "$tmp/out" || { cat "$tmp/out"; fail "$st on $n ranks: the run line does not say so"; }
            "$bin/dist_cli_compare" "$tmp/ref/ref" "$tmp/$st$n/s" 2e-6 || fail "$st on $n ranks differs from 1 process"
            cmp -s "$tmp/ref/ref/sample.txt" "$tmp/$st$n/s/sample.txt" \
                || fail "$st on $n ranks sampled '$(cat "$tmp/$st$n/s/sample.txt")', 1 process '$(cat "$tmp/ref/ref/sample.txt")'"
        done
    done
    # eval under FULL_SHARD gathers each unit as its forward reads it: the same metrics
    "$composer" eval "$tmp/tiny.yaml" --weights "$tmp/ref/ref/model.safetensors" >"$tmp/eval1.out" 2>&1 || { cat "$tmp/eval1.out"; fail "1-process eval"; }
    launch -n 2 eval "$tmp/tiny.yaml" --weights "$tmp/ref/ref/model.safetensors" parallelism.fsdp.sharding_strategy=FULL_SHARD \
        >"$tmp/eval2.out" 2>&1 || { cat "$tmp/eval2.out"; fail "FULL_SHARD eval on 2 ranks"; }
    grep metrics/ "$tmp/eval1.out" >"$tmp/m1"
    grep metrics/ "$tmp/eval2.out" >"$tmp/m2"
    [ -s "$tmp/m1" ] && cmp -s "$tmp/m1" "$tmp/m2" || fail "FULL_SHARD eval printed $(cat "$tmp/m2"), 1 process $(cat "$tmp/m1")"
    launch -n 2 train "$tmp/tiny.yaml" run_root="$tmp/runs" dist_timeout=0 >"$tmp/out" 2>&1
    rc=$?
    [ $rc = 2 ] && grep -q "dist_timeout: 0 must be > 0" "$tmp/out" || { cat "$tmp/out"; fail "dist_timeout=0: exit $rc"; }
    ;;
cli_train_param_groups_on_ranks)
    cli_setup
    # optimizer.param_groups and disable_grad on sharded ranks: each rank maps every parameter onto
    # its piece of the unit (3 ranks cut the units mid-parameter), so the groups and the frozen
    # parameters are the 1-process ones
    pg="optimizer.param_groups=[{param_str_match: 'attn', lr: 0.1, weight_decay: 0.01}, {param_str_match: '[.]h[.]1[.]', momentum: 0.5}]"
    "$composer" train "$tmp/tiny.yaml" run_root="$tmp/ref" run_name=pg "$pg" optimizer.disable_grad=wpe >"$tmp/ref.out" 2>&1 \
        || { cat "$tmp/ref.out"; fail "1-process train with param_groups"; }
    grep -q "optimizer.param_groups.0 'attn': [1-9]" "$tmp/ref.out" || { cat "$tmp/ref.out"; fail "param_groups.0 matched nothing"; }
    for st in SHARD_GRAD_OP:2 FULL_SHARD:3; do
        n=${st#*:} st=${st%%:*}
        launch -n $n train "$tmp/tiny.yaml" run_root="$tmp/pg$st" run_name=s parallelism.fsdp.sharding_strategy=$st "$pg" \
            optimizer.disable_grad=wpe >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "$st on $n ranks with param_groups"; }
        "$bin/dist_cli_compare" "$tmp/ref/pg" "$tmp/pg$st/s" 2e-6 || fail "$st on $n ranks with param_groups differs from 1 process"
    done
    ;;
cli_fsdp_config_on_ranks)
    # fsdp_config keys on 2 ranks through the CLI: activation checkpointing under FULL_SHARD with
    # dropout trains the same bits as the same ranks without it (tolerance 0), sharded
    # checkpoints with state_dict_type: sharded, sync_module_states: false (every rank builds the
    # same weights from the seed), the prefetch keys (verbose says what cm_dist_new got; the bits
    # are those of Composer's default BACKWARD_POST), and state_dict_type: full under FULL_SHARD
    # refused once, by name
    cli_setup
    fs="parallelism.fsdp.sharding_strategy=FULL_SHARD"
    launch -n 2 train "$tmp/tiny.yaml" run_root="$tmp/a" run_name=a model.dropout=0.1 "$fs" \
        >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "FULL_SHARD on 2 ranks"; }
    launch -n 2 train "$tmp/tiny.yaml" run_root="$tmp/b" run_name=b model.dropout=0.1 "$fs" \
        parallelism.fsdp.activation_checkpointing=true parallelism.fsdp.state_dict_type=sharded \
        parallelism.fsdp.sync_module_states=false save_folder="$tmp/ck" save_interval=6ba \
        parallelism.fsdp.backward_prefetch=BACKWARD_PRE parallelism.fsdp.forward_prefetch=true \
        parallelism.fsdp.limit_all_gathers=false parallelism.fsdp.verbose=true \
        >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "FULL_SHARD with activation checkpointing on 2 ranks"; }
    grep -q "parallelism.fsdp: FULL_SHARD prefetch: backward_prefetch BACKWARD_PRE, forward_prefetch true, limit_all_gathers false" \
        "$tmp/out" || { cat "$tmp/out"; fail "the prefetch keys did not reach the data-parallel config"; }
    # (run a: Composer's defaults, BACKWARD_POST; the prefetch keys change no bit either)
    "$bin/dist_cli_compare" "$tmp/a/a" "$tmp/b/b" 0 || fail "activation checkpointing changed FULL_SHARD on 2 ranks"
    [ -f "$tmp/ck/ep0-ba6/model-rank1-of-2.safetensors" ] || fail "state_dict_type: sharded wrote no rank files: $(ls "$tmp/ck"/*)"
    launch -n 2 train "$tmp/tiny.yaml" run_root="$tmp/c" "$fs" parallelism.fsdp.state_dict_type=full >"$tmp/out" 2>&1
    rc=$?
    [ $rc = 1 ] || { cat "$tmp/out"; fail "state_dict_type: full under FULL_SHARD: exit $rc (want 1)"; }
    [ "$(grep -c 'parallelism.fsdp.state_dict_type: full with FULL_SHARD on 2 ranks' "$tmp/out")" = 1 ] \
        || { cat "$tmp/out"; fail "state_dict_type: full under FULL_SHARD: not one clear message"; }
    ;;
cli_train_stopped_rank_times_out)
    # dist_timeout from the config bounds every collective: rank 1 is stopped (SIGSTOP) mid-run,
    # rank 0 fails its collective after 2 s saying who is missing and exits nonzero, and mpirun
    # ends the job.
    cli_setup
    t0=$(date +%s)
    timeout -k 5 60 "$composer" -n 2 train "$tmp/tiny.yaml" run_root="$tmp/hang" run_name=h max_duration=1000000ba \
        eval_interval=0 dist_timeout=2 >"$tmp/out" 2>&1 &
    job=$!
    i=0
    while [ ! -s "$tmp/hang/h/metrics.jsonl" ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i + 1)); done
    sleep 0.5
    stopped=
    for p in $(pgrep -f "run_root=$tmp/hang"); do
        if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx RANK=1; then kill -STOP "$p" && stopped=$p; fi
    done
    [ -n "$stopped" ] || { kill "$job"; fail "rank 1 not found"; }
    # once rank 0 has given up, let rank 1 run again so mpirun's SIGTERM ends it at once
    i=0
    while ! grep -q "timed out" "$tmp/out" && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
    kill -CONT "$stopped" 2>/dev/null
    wait $job
    rc=$?
    cat "$tmp/out"
    [ $rc -ne 0 ] || fail "exit status 0 with a stopped rank"
    [ $(($(date +%s) - t0)) -lt 50 ] || fail "the job hung"
    # SIGSTOP lands between collectives (rank 1 did not arrive) or inside one (every rank entered it)
    grep -Eq "training failed: .*timed out after 2\.. s \(dist_timeout\) in collective #[0-9]+ .*(rank 1 did not arrive|every rank entered it)" \
        "$tmp/out" || fail "no timeout message after dist_timeout=2"
    ;;
ckpt_elastic_resume)
    # Save on 4 ranks (sharded: one model and one optimizer file per rank) mid-epoch (batch 4 of
    # 6), resume on 2, 3 and 1 (a plain process: the pieces assemble into whole tensors).
    # Tolerance: the resumed runs sum each gradient over a different number of ranks, so it
    # differs from the 4-rank one by a few f32 roundings; Adam over 8 more steps carries that
    # into the parameters. Measured: <= 3.1e-8 relative (an uninterrupted 3-rank run differs
    # from the 4-rank one by as much, 6e-8: the resume adds nothing). 2e-6 (as train_equivalence)
    # is far below what a misplaced range or lost optimizer state gives (1e-3 and more).
    tol=2e-6
    ck=$bin/dist_ckpt
    launch -n 4 "$ck" "$tmp/ref.txt" --shard --save "$tmp/A" || fail "the 4-rank sharded run"
    [ "$(cat "$tmp/A/latest")" = ep1-ba12 ] || fail "latest is '$(cat "$tmp/A/latest")'"
    [ -f "$tmp/A/ep0-ba4/model-rank3-of-4.safetensors" ] && [ -f "$tmp/A/ep0-ba4/optimizer-rank0-of-4.safetensors" ] \
        || fail "no per-rank files: $(ls "$tmp/A/ep0-ba4")"
    "$composer" ckpt verify "$tmp/A/ep0-ba4" || fail "composer ckpt verify of a sharded checkpoint"
    "$composer" ckpt inspect "$tmp/A/ep0-ba4" | grep -q "layout      sharded, saved by 4 ranks" || fail "inspect"
    for n in 2 3; do
        launch -n $n "$ck" "$tmp/r$n.txt" --shard --load "$tmp/A/ep0-ba4" || fail "resuming on $n ranks"
        grep -q "^R $tmp/A/ep0-ba4" "$tmp/r$n.txt" || fail "the $n-rank run did not resume"
        "$ck" --compare "$tmp/ref.txt" "$tmp/r$n.txt" $tol || fail "4 -> $n ranks differs from the uninterrupted run"
    done
    env -u OMPI_COMM_WORLD_SIZE "$ck" "$tmp/r1.txt" --load "$tmp/A/ep0-ba4" || fail "resuming on 1 process"
    "$ck" --compare "$tmp/ref.txt" "$tmp/r1.txt" $tol || fail "4 ranks -> 1 process differs from the uninterrupted run"
    # and up: a 1-process sharded save (one pair of rank files) resumed on 3 ranks
    env -u OMPI_COMM_WORLD_SIZE "$ck" "$tmp/s1.txt" --shard --save "$tmp/S" --max 4ba || fail "1-process sharded run"
    [ -f "$tmp/S/ep0-ba4/model-rank0-of-1.safetensors" ] || fail "no rank file in the 1-process sharded save"
    launch -n 3 "$ck" "$tmp/s3.txt" --shard --load "$tmp/S/ep0-ba4" || fail "1 -> 3 ranks"
    "$ck" --compare "$tmp/ref.txt" "$tmp/s3.txt" $tol || fail "1 -> 3 ranks differs from the uninterrupted run"
    ;;
ckpt_elastic_real_strategies)
    # The same elastic proof with the real ZeRO strategies instead of the test double: save on 4
    # ranks mid-epoch, resume on 2 and 3 ranks of the same strategy, on 3 ranks of the other ones,
    # and on one plain process. Tolerance and its reason as in ckpt_elastic_resume.
    tol=2e-6
    ck=$bin/dist_ckpt
    for strategy in SHARD_GRAD_OP FULL_SHARD; do
        launch -n 4 "$ck" "$tmp/ref_$strategy.txt" --strategy $strategy --save "$tmp/$strategy" || fail "4-rank $strategy run"
        [ -f "$tmp/$strategy/ep0-ba4/optimizer-rank3-of-4.safetensors" ] || fail "$strategy: no per-rank optimizer files"
        "$composer" ckpt verify "$tmp/$strategy/ep0-ba4" || fail "$strategy: ckpt verify"
        for n in 2 3; do
            launch -n $n "$ck" "$tmp/r.txt" --strategy $strategy --load "$tmp/$strategy/ep0-ba4" || fail "$strategy: resuming on $n ranks"
            grep -q "^R $tmp/$strategy/ep0-ba4" "$tmp/r.txt" || fail "$strategy: the $n-rank run did not resume"
            "$ck" --compare "$tmp/ref_$strategy.txt" "$tmp/r.txt" $tol || fail "$strategy: 4 -> $n ranks differs"
        done
        for other in NO_SHARD SHARD_GRAD_OP FULL_SHARD; do
            [ $other = $strategy ] && continue
            launch -n 3 "$ck" "$tmp/x.txt" --strategy $other --load "$tmp/$strategy/ep0-ba4" || fail "$strategy -> $other on 3 ranks"
            "$ck" --compare "$tmp/ref_$strategy.txt" "$tmp/x.txt" $tol || fail "$strategy (4 ranks) -> $other (3 ranks) differs"
        done
        env -u OMPI_COMM_WORLD_SIZE "$ck" "$tmp/r1.txt" --load "$tmp/$strategy/ep0-ba4" || fail "$strategy -> 1 process"
        "$ck" --compare "$tmp/ref_$strategy.txt" "$tmp/r1.txt" $tol || fail "$strategy (4 ranks) -> 1 process differs"
    done
    ;;
hybrid_shard_equivalence)
    # HYBRID_SHARD (FULL_SHARD in groups) and _HYBRID_SHARD_ZERO2 (SHARD_GRAD_OP in groups) on 4
    # ranks, 2 shard groups of 2: the same training as one process (norm clipping and
    # OptimizerMonitor's norms included: they sum over the shards, each piece once though two
    # ranks hold it), tolerance as train_equivalence. Without the all-reduce across the groups
    # each group would step on half the batch's gradient (off by ~1e-2).
    tol=2e-6
    env -u OMPI_COMM_WORLD_SIZE "$bin/dist_train" "$tmp/ref.txt" || fail "1-process run"
    for strategy in HYBRID_SHARD _HYBRID_SHARD_ZERO2; do
        launch -n 4 "$bin/dist_train" "$tmp/h.txt" $strategy shard=2 || fail "$strategy on 4 ranks (2x2)"
        "$bin/dist_train" --compare "$tmp/ref.txt" "$tmp/h.txt" $tol || fail "$strategy on 4 ranks (2x2) differs from 1 process"
    done
    # Its checkpoints are sharded and elastic: each piece is written once (the second group's
    # rank files are listed and empty: the reader refuses two pieces holding the same elements),
    # and they resume on 3 ranks under FULL_SHARD, on one process, and on 4 ranks of the same
    # layout (every rank of both groups reads its piece), continuing the uninterrupted run.
    # Tolerance as ckpt_elastic_resume.
    ck=$bin/dist_ckpt
    for strategy in HYBRID_SHARD _HYBRID_SHARD_ZERO2; do
        launch -n 4 "$ck" "$tmp/ref_$strategy.txt" --strategy $strategy --shard-degree 2 --save "$tmp/$strategy" \
            || fail "4-rank $strategy run"
        "$composer" ckpt verify "$tmp/$strategy/ep0-ba4" || fail "$strategy: ckpt verify"
        "$composer" ckpt inspect "$tmp/$strategy/ep0-ba4" >"$tmp/inspect" || fail "$strategy: ckpt inspect"
        for r in 2 3; do
            for kind in model optimizer; do
                grep -q "^file        $kind-rank$r-of-4.safetensors: .* 0 tensors" "$tmp/inspect" \
                    || { cat "$tmp/inspect"; fail "$strategy: rank $r (a replica) wrote pieces into $kind-rank$r-of-4"; }
            done
        done
        grep -q "^file        model-rank1-of-4.safetensors: .* [1-9][0-9]* tensors" "$tmp/inspect" \
            || { cat "$tmp/inspect"; fail "$strategy: rank 1 wrote no pieces"; }
        launch -n 3 "$ck" "$tmp/x.txt" --strategy FULL_SHARD --load "$tmp/$strategy/ep0-ba4" || fail "$strategy -> FULL_SHARD on 3 ranks"
        grep -q "^R $tmp/$strategy/ep0-ba4" "$tmp/x.txt" || fail "$strategy -> FULL_SHARD on 3 ranks did not resume"
        "$ck" --compare "$tmp/ref_$strategy.txt" "$tmp/x.txt" $tol || fail "$strategy (4 ranks) -> FULL_SHARD (3 ranks) differs"
        env -u OMPI_COMM_WORLD_SIZE "$ck" "$tmp/r1.txt" --load "$tmp/$strategy/ep0-ba4" || fail "$strategy -> 1 process"
        "$ck" --compare "$tmp/ref_$strategy.txt" "$tmp/r1.txt" $tol || fail "$strategy (4 ranks) -> 1 process differs"
    done
    launch -n 4 "$ck" "$tmp/h4.txt" --strategy HYBRID_SHARD --shard-degree 2 --load "$tmp/HYBRID_SHARD/ep0-ba4" \
        || fail "HYBRID_SHARD resumed on 4 ranks"
    "$ck" --compare "$tmp/ref_HYBRID_SHARD.txt" "$tmp/h4.txt" $tol || fail "HYBRID_SHARD resumed on the same layout differs"
    ;;
cli_hybrid_shard)
    # `composer -n 4 train` with sharding_strategy HYBRID_SHARD and data_parallel_shard_degree 2
    # trains as one process (tolerance as cli_train_equivalence), says its layout once, and its
    # checkpoint of batch 3 resumes on 3 ranks under FULL_SHARD to the same batches 4-6 and
    # weights as the uninterrupted hybrid run (dist_cli_compare --resumed).
    cli_setup
    tol=2e-6
    "$composer" train "$tmp/tiny.yaml" run_root="$tmp/ref" run_name=ref >"$tmp/ref.out" 2>&1 || { cat "$tmp/ref.out"; fail "1-process train"; }
    hy="parallelism.fsdp.sharding_strategy=HYBRID_SHARD"
    launch -n 4 train "$tmp/tiny.yaml" run_root="$tmp/h" run_name=h "$hy" parallelism.fsdp.data_parallel_shard_degree=2 \
        save_folder="$tmp/ck" save_interval=3ba >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "HYBRID_SHARD on 4 ranks"; }
    [ "$(grep -c '4 ranks (HYBRID_SHARD in 2 groups of 2' "$tmp/out")" = 1 ] || { cat "$tmp/out"; fail "the run line does not say the layout once"; }
    "$bin/dist_cli_compare" "$tmp/ref/ref" "$tmp/h/h" $tol || fail "HYBRID_SHARD on 4 ranks differs from 1 process"
    cmp -s "$tmp/ref/ref/sample.txt" "$tmp/h/h/sample.txt" || fail "HYBRID_SHARD sampled '$(cat "$tmp/h/h/sample.txt")'"
    [ -f "$tmp/ck/ep0-ba3/model-rank3-of-4.safetensors" ] || fail "no rank files: $(ls "$tmp/ck"/*)"
    launch -n 3 train "$tmp/tiny.yaml" run_root="$tmp/r" run_name=r parallelism.fsdp.sharding_strategy=FULL_SHARD \
        load_path="$tmp/ck/ep0-ba3" >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "resuming the hybrid checkpoint on 3 ranks"; }
    grep -q "resumed from checkpoint '$tmp/ck/ep0-ba3'" "$tmp/out" || { cat "$tmp/out"; fail "the 3-rank run did not resume"; }
    "$bin/dist_cli_compare" "$tmp/h/h" "$tmp/r/r" $tol --resumed || fail "HYBRID_SHARD (4 ranks) -> FULL_SHARD (3 ranks) differs"
    # degrees that do not fit the world: one message naming the keys and the world size, exit 2,
    # no run folder
    for bad in "data_parallel_shard_degree=3:data_parallel_shard_degree 3 does not divide the world size 4" \
               "data_parallel_replicate_degree=3:data_parallel_replicate_degree 3 does not divide the world size 4" \
               "data_parallel_shard_degree=2 parallelism.fsdp.data_parallel_replicate_degree=3:data_parallel_shard_degree 2 x data_parallel_replicate_degree 3 = 6 is not the world size 4"; do
        launch -n 4 train "$tmp/tiny.yaml" run_root="$tmp/bad" "$hy" parallelism.fsdp.${bad%%:*} >"$tmp/out" 2>&1
        rc=$?
        [ $rc = 2 ] || { cat "$tmp/out"; fail "${bad%%:*}: exit $rc (want 2)"; }
        [ "$(grep -c "${bad#*:}" "$tmp/out")" = 1 ] || { cat "$tmp/out"; fail "${bad%%:*}: not one clear message"; }
        [ ! -e "$tmp/bad" ] || fail "${bad%%:*}: a run folder was made"
    done
    # a degree with a strategy that shards over every rank is refused by name
    launch -n 2 train "$tmp/tiny.yaml" run_root="$tmp/bad" parallelism.fsdp.sharding_strategy=FULL_SHARD \
        parallelism.fsdp.data_parallel_shard_degree=2 >"$tmp/out" 2>&1
    [ $? = 2 ] && grep -q "data_parallel_shard_degree: 2 applies to sharding_strategy HYBRID_SHARD" "$tmp/out" \
        || { cat "$tmp/out"; fail "a shard degree under FULL_SHARD was not refused"; }
    ;;
ckpt_sigterm_on_one_rank)
    # Preemption reaching one rank of three: every rank stops after the same batch and they save
    # together (sharded, collective), the job exits 143, and autoresume continues exactly.
    ck=$bin/dist_ckpt
    launch -n 3 "$ck" "$tmp/ref.txt" --strategy SHARD_GRAD_OP || fail "uninterrupted 3-rank run"
    launch -n 3 "$ck" "$tmp/a.txt" --strategy SHARD_GRAD_OP --save "$tmp/T" --interval 100ba --term 1:5 >"$tmp/out" 2>&1
    rc=$?
    [ $rc -ne 0 ] || { cat "$tmp/out"; fail "exit status 0 after SIGTERM"; }
    grep -q "^I 5$" "$tmp/a.txt" || { cat "$tmp/out"; fail "rank 0 did not stop after batch 5: $(tail -1 "$tmp/a.txt")"; }
    [ "$(grep -c 'interrupted by SIGTERM after batch 5' "$tmp/out")" = 3 ] || { cat "$tmp/out"; fail "not all 3 ranks stopped after batch 5"; }
    [ -f "$tmp/T/ep0-ba5/manifest.json" ] || fail "no checkpoint saved at the interruption: $(ls "$tmp/T")"
    launch -n 3 "$ck" "$tmp/b.txt" --strategy SHARD_GRAD_OP --save "$tmp/T" --autoresume || fail "autoresume after SIGTERM"
    grep -q "^R $tmp/T/ep0-ba5" "$tmp/b.txt" || fail "did not resume from ep0-ba5"
    "$ck" --compare "$tmp/ref.txt" "$tmp/b.txt" 2e-6 || fail "the resumed run differs from the uninterrupted one"
    ;;
ckpt_monolithic_sharded)
    # A replicated (NO_SHARD) multi-rank run: rank 0 alone writes one monolithic checkpoint.
    # It resumes sharded on 3 ranks; a sharded checkpoint resumes replicated on 2. Tolerance as
    # in ckpt_elastic_resume. Exports of both layouts are the same bytes.
    tol=2e-6
    ck=$bin/dist_ckpt
    launch -n 4 "$ck" "$tmp/ref.txt" --shard --save "$tmp/A" || fail "the 4-rank sharded run"
    launch -n 4 "$ck" "$tmp/mono.txt" --save "$tmp/B" || fail "the 4-rank replicated run"
    [ -f "$tmp/B/ep0-ba4/model.safetensors" ] && [ "$(ls "$tmp/B/ep0-ba4" | wc -l)" = 3 ] \
        || fail "the replicated run did not write one monolithic checkpoint: $(ls "$tmp/B/ep0-ba4")"
    "$ck" --compare "$tmp/ref.txt" "$tmp/mono.txt" $tol || fail "sharded and replicated runs differ"
    launch -n 3 "$ck" "$tmp/m2s.txt" --shard --load "$tmp/B/ep0-ba4" || fail "monolithic -> 3 sharded ranks"
    "$ck" --compare "$tmp/ref.txt" "$tmp/m2s.txt" $tol || fail "monolithic -> sharded differs"
    launch -n 2 "$ck" "$tmp/s2m.txt" --load "$tmp/A/ep0-ba4" || fail "sharded -> 2 replicated ranks"
    "$ck" --compare "$tmp/ref.txt" "$tmp/s2m.txt" $tol || fail "sharded -> replicated differs"
    "$composer" ckpt export "$tmp/A/ep0-ba4" -o "$tmp/a.safetensors" || fail "export of a sharded checkpoint"
    "$composer" ckpt export "$tmp/B/ep0-ba4" -o "$tmp/b.safetensors" || fail "export of a monolithic checkpoint"
    cmp "$tmp/a.safetensors" "$tmp/b.safetensors" || fail "the sharded export differs from the monolithic one"
    # weights only: model rank files alone; they load into a replicated run on 2 ranks
    launch -n 3 "$ck" "$tmp/w.txt" --shard --save "$tmp/W" --max 4ba --save-weights-only || fail "weights-only save"
    [ "$(ls "$tmp/W/ep0-ba4" | grep -c optimizer)" = 0 ] && [ -f "$tmp/W/ep0-ba4/model-rank2-of-3.safetensors" ] \
        || fail "weights-only files: $(ls "$tmp/W/ep0-ba4")"
    "$composer" ckpt verify "$tmp/W/ep0-ba4" || fail "verify of a weights-only sharded checkpoint"
    launch -n 2 "$ck" "$tmp/w2.txt" --load "$tmp/W/ep0-ba4" --max 1ba || fail "loading weights-only pieces"
    grep -q "^R $tmp/W/ep0-ba4" "$tmp/w2.txt" || fail "the weights were not loaded"
    ;;
ckpt_full_shard_params_only_in_spans)
    # FULL_SHARD-like: the parameters at rest are only in the spans (the model's flat buffers
    # are NaN between batches), so saves must read the spans and loads must write them and call
    # sync_params. Same math as SHARD_GRAD_OP: bit-equal to it uninterrupted; resumed on 3
    # (FULL_SHARD-like) and on 2 (replicated) within the tolerance of ckpt_elastic_resume.
    tol=2e-6
    ck=$bin/dist_ckpt
    launch -n 4 "$ck" "$tmp/ref.txt" --shard || fail "the 4-rank sharded run"
    launch -n 4 "$ck" "$tmp/full.txt" --full --save "$tmp/F" || fail "the 4-rank FULL_SHARD-like run"
    "$ck" --compare "$tmp/ref.txt" "$tmp/full.txt" 0 || fail "FULL_SHARD-like and SHARD_GRAD_OP-like runs differ"
    launch -n 3 "$ck" "$tmp/f3.txt" --full --load "$tmp/F/ep0-ba4" || fail "4 -> 3 FULL_SHARD-like ranks"
    "$ck" --compare "$tmp/ref.txt" "$tmp/f3.txt" $tol || fail "4 -> 3 FULL_SHARD-like differs"
    launch -n 2 "$ck" "$tmp/f2.txt" --load "$tmp/F/ep0-ba4" || fail "4 FULL_SHARD-like -> 2 replicated ranks"
    "$ck" --compare "$tmp/ref.txt" "$tmp/f2.txt" $tol || fail "4 FULL_SHARD-like -> 2 replicated differs"
    ;;
ckpt_killed_rank_commits_nothing)
    # Rank 2 is killed during the second save, after writing its files: the job ends, nothing
    # of that save is committed, and autoresume on 2 ranks continues from the first checkpoint.
    ck=$bin/dist_ckpt
    CM_DIST_TIMEOUT=20 launch -n 4 "$ck" "$tmp/k.txt" --shard --save "$tmp/K" --fault kill:2:2 >"$tmp/out" 2>&1
    rc=$?
    cat "$tmp/out"
    [ $rc -ne 0 ] || fail "exit status 0 after a rank was killed"
    [ "$(cat "$tmp/K/latest")" = ep0-ba4 ] || fail "latest is '$(cat "$tmp/K/latest")'"
    [ ! -e "$tmp/K/ep1-ba8" ] || fail "the interrupted save was committed"
    "$composer" ckpt verify "$tmp/K" || fail "the previous checkpoint is damaged"
    launch -n 2 "$ck" "$tmp/k2.txt" --shard --save "$tmp/K" --autoresume || fail "autoresume on 2 ranks"
    grep -q "^R $tmp/K/ep0-ba4" "$tmp/k2.txt" || fail "autoresume did not take ep0-ba4"
    [ "$(cat "$tmp/K/latest")" = ep1-ba12 ] || fail "the resumed run did not finish"
    [ -z "$(ls -a "$tmp/K" | grep '^\.tmp-')" ] || fail "the killed save's directory was not swept: $(ls -a "$tmp/K")"
    ;;
ckpt_failed_rank_same_error_everywhere)
    # Rank 1 fails while writing its piece of the first save: every rank reports the same error
    # naming rank 1, nothing is committed, the temporary directory is gone.
    ck=$bin/dist_ckpt
    CM_DIST_TIMEOUT=20 launch -n 4 "$ck" "$tmp/f.txt" --shard --save "$tmp/F" --fault fail:1:1 >"$tmp/out" 2>&1
    rc=$?
    cat "$tmp/out"
    [ $rc -ne 0 ] || fail "exit status 0 after a failed save"
    n=$(grep -c "rank 1 of 4: simulated failure: disk full" "$tmp/out")
    [ "$n" = 4 ] || fail "$n ranks (not 4) report rank 1's failure"
    [ -z "$(ls -a "$tmp/F" | grep -v '^\.\.\?$')" ] || fail "something was left in the folder: $(ls -a "$tmp/F")"
    ;;
ckpt_resume_mismatch_errors)
    # A different global batch size, and a checkpoint missing a rank file: clear errors on every
    # rank, no hang (launch fails the case if the job runs into the harness timeout).
    ck=$bin/dist_ckpt
    launch -n 4 "$ck" "$tmp/a.txt" --shard --save "$tmp/A" --max 4ba || fail "the 4-rank run"
    CM_DIST_TIMEOUT=20 launch -n 3 "$ck" "$tmp/b.txt" --shard --load "$tmp/A/ep0-ba4" --batch 12 >"$tmp/out" 2>&1
    rc=$?
    cat "$tmp/out"
    [ $rc -ne 0 ] || fail "a different batch size was accepted"
    n=$(grep -c "saved with a global batch of 10 samples; this run's train loader has 12" "$tmp/out")
    [ "$n" = 3 ] || fail "$n ranks (not 3) report the batch size"
    cp -r "$tmp/A/ep0-ba4" "$tmp/M"
    rm "$tmp/M/optimizer-rank3-of-4.safetensors"
    CM_DIST_TIMEOUT=20 launch -n 2 "$ck" "$tmp/c.txt" --shard --load "$tmp/M" >"$tmp/out" 2>&1
    rc=$?
    cat "$tmp/out"
    [ $rc -ne 0 ] || fail "a checkpoint without a rank file was accepted"
    n=$(grep -c "'optimizer-rank3-of-4.safetensors' is missing" "$tmp/out")
    [ "$n" = 2 ] || fail "$n ranks (not 2) name the missing rank file"
    ;;
cli_config_error_shows_our_message_alone)
    # A typo'd key on 2 ranks: the job ends with status 2 and our one-line error, once, without
    # mpirun's two boxes about a process that "returned a non-zero exit code".
    cli_setup
    launch -n 2 train "$tmp/tiny.yaml" optimzer.lr=1 run_root="$tmp/runs" >"$tmp/out" 2>&1
    rc=$?
    cat "$tmp/out"
    [ $rc = 2 ] || fail "exit status $rc, want 2 (a config error)"
    [ "$(grep -c "unknown key 'optimzer" "$tmp/out")" = 1 ] || fail "the error is not shown exactly once"
    [ "$(wc -l <"$tmp/out")" = 1 ] || fail "more than our one line was printed"
    # the launcher drops only those two boxes: another of mpirun's boxes (a rank killed by a
    # signal) and the ranks' own lines pass through, in order (a stand-in mpirun prints them)
    cat >"$tmp/mpirun" <<'EOS'
#!/bin/sh
[ "$1" = --version ] && { echo "mpirun (Open MPI) 4.1.4"; exit 0; }
r=--------------------------------------------------------------------------
printf 'rank line\n%s\nPrimary job  terminated normally, but 1 process returned\na non-zero exit code.\n%s\n' $r $r >&2
printf '%s\nmpirun noticed that process rank 1 exited on signal 11 (Segmentation fault).\n%s\n' $r $r >&2
printf '%s\nmpirun detected that one or more processes exited with non-zero status, thus causing\n%s\n' $r $r >&2
printf 'partial' >&2
exit 139
EOS
    chmod +x "$tmp/mpirun"
    CM_MPIRUN="$tmp/mpirun" "$composer" -n 2 train x.yaml >"$tmp/out" 2>&1
    rc=$?
    cat "$tmp/out"
    [ $rc = 139 ] || fail "the stand-in's status 139 became $rc"
    printf 'rank line\n%s\nmpirun noticed that process rank 1 exited on signal 11 (Segmentation fault).\n%s\npartial' \
        -------------------------------------------------------------------------- \
        -------------------------------------------------------------------------- >"$tmp/want"
    cmp -s "$tmp/out" "$tmp/want" || fail "the filtered output differs from the expected one"
    ;;
cli_train_profiler_merges_ranks)
    # `composer -n 2 train` with a profiler: each rank writes its file of the cycle, rank 0 merges
    # them onto its clock; the merged trace is valid, nested, in time order, has both ranks, and
    # every collective names the rank that arrived last.
    cli_setup
    launch -n 2 train "$tmp/tiny.yaml" run_root="$tmp/runs" run_name=prof \
        'profiler={schedule: {wait: 1, warmup: 1, active: 2}, sys_prof_memory: true}' >"$tmp/out" 2>&1 \
        || { cat "$tmp/out"; fail "profiled train on 2 ranks"; }
    cat "$tmp/out"
    t="$tmp/runs/prof/traces"
    [ "$(ls "$t" | tr '\n' ' ')" = "ep0-ba4-rank0.json ep0-ba4-rank1.json merged_trace.json " ] \
        || fail "trace folder holds: $(ls "$t")"
    "$bin/trace_check" "$t/merged_trace.json" 2 || fail "the merged trace"
    grep -q '"name":"collective/all_reduce"' "$t/merged_trace.json" || fail "no all_reduce in the merged trace"
    grep -q '"name": "linear_backward"' "$t/ep0-ba4-rank1.json" || fail "rank 1 recorded no backward op"
    [ "$(grep -c '^linear ' "$tmp/out")" = 1 ] || fail "the op table is printed once (rank 0)"
    ;;
ckpt_remote_preemption)
    # Preemption end to end on a bucket: 4 sharded ranks save every 2 batches to s3:// (uploads in
    # the background), rank 2 is killed (SIGKILL) in the 6th save, the local staging folder is
    # deleted (a fresh machine), and the job resumes on 3 ranks from the newest complete remote
    # checkpoint. It must equal, bit for bit, the same 3-rank resume from a local copy of that
    # checkpoint, and the uninterrupted 4-rank run within the elastic tolerance (ckpt_elastic_resume).
    s3_start
    export TMPDIR="$tmp/stage" CM_STORAGE_RETRY_BACKOFF_S=0.05
    mkdir -p "$TMPDIR"
    ck=$bin/dist_ckpt
    launch -n 4 "$ck" "$tmp/ref.txt" --shard --save "$tmp/A" --interval 2ba || fail "the uninterrupted 4-rank run"
    CM_DIST_TIMEOUT=20 launch -n 4 "$ck" "$tmp/k.txt" --shard --save s3://bkt/run --interval 2ba --autoresume \
        --fault kill:2:6 >"$tmp/out" 2>&1
    [ $? -ne 0 ] || fail "exit status 0 after a rank was killed"
    rm -rf "$TMPDIR/composer-checkpoints"
    launch -n 3 "$ck" "$tmp/r3.txt" --shard --save s3://bkt/run --interval 2ba --autoresume \
        || fail "resuming on 3 ranks from the bucket"
    name=$(sed -n 's|^R .*/\(ep[0-9]*-ba[0-9]*\)$|\1|p' "$tmp/r3.txt")
    [ -n "$name" ] || fail "the 3-rank run did not resume from the bucket: $(head -3 "$tmp/r3.txt")"
    launch -n 3 "$ck" "$tmp/l3.txt" --shard --load "$tmp/A/$name" || fail "the same resume from the local copy"
    "$ck" --compare "$tmp/l3.txt" "$tmp/r3.txt" 0 || fail "resuming from s3 differs from resuming from the local $name"
    "$ck" --compare "$tmp/ref.txt" "$tmp/r3.txt" 2e-6 || fail "4 -> 3 ranks through s3 differs from the uninterrupted run"
    [ "$(s3_stat refused)" = 0 ] || fail "the proxy refused $(s3_stat refused) signatures"
    echo "resumed from s3 at $name"
    ;;
streaming_shared_cache)
    # Three ranks in three processes share one cache (their `local`) and read a shuffled epoch
    # from the bucket: every shard is downloaded once (the proxy counts the GETs), and together
    # they see, step by step, exactly the samples one process sees.
    s3_start
    export CM_STORAGE_RETRY_BACKOFF_S=0.05
    st=$bin/dist_streaming
    "$st" write "$tmp/src" s3://bkt/ds >/dev/null || fail "writing the dataset"
    n=$(ls "$tmp/src" | grep -c '^shard\.')
    [ "$n" -ge 6 ] || fail "only $n shards"
    launch -n 3 "$st" read "$tmp/three.txt" s3://bkt/ds "$tmp/cache3" || fail "reading on 3 ranks"
    gets=$(/usr/bin/python3 -c "
import collections, json, urllib.request
s = json.load(urllib.request.urlopen('$S3_ENDPOINT_URL/__proxy/stats'))
c = collections.Counter(l.split('?')[0] for l in s['lines'] if l.startswith('GET ') and '/shard.' in l)
print(len(c), max(c.values()))")
    [ "$gets" = "$n 1" ] || fail "shards fetched from the bucket (distinct, most GETs of one): '$gets', want '$n 1'"
    grep -qx "F $n" "$tmp/three.txt" || fail "the ranks fetched $(grep '^F' "$tmp/three.txt") shards, want $n"
    env -u OMPI_COMM_WORLD_SIZE "$st" read "$tmp/one.txt" s3://bkt/ds "$tmp/cache1" || fail "reading in 1 process"
    grep '^S' "$tmp/one.txt" >"$tmp/one_s"
    grep '^S' "$tmp/three.txt" >"$tmp/three_s"
    [ "$(wc -l <"$tmp/one_s")" = 20 ] || fail "1 process read $(wc -l <"$tmp/one_s") steps, want 20"
    cmp -s "$tmp/one_s" "$tmp/three_s" || { diff "$tmp/one_s" "$tmp/three_s" | head; fail "3 ranks saw other samples than 1 process"; }
    # the same with a cache_limit of Streaming's minimum (4 x the largest shard, raw and zip
    # together, + index.json): the ranks evict each other's shards (never one being fetched or
    # opened) and still read exactly the same samples, and the cache ends within its limit
    limit=$(/usr/bin/python3 -c "
import json, os
ix = json.load(open('$tmp/src/index.json'))
print(4 * max(s['raw_data']['bytes'] + (s['zip_data'] or {'bytes': 0})['bytes'] for s in ix['shards'])
      + os.path.getsize('$tmp/src/index.json'))")
    launch -n 3 "$st" read "$tmp/lim.txt" s3://bkt/ds "$tmp/cachelim" "$limit" || fail "reading on 3 ranks under cache_limit $limit"
    grep '^S' "$tmp/lim.txt" >"$tmp/lim_s"
    cmp -s "$tmp/one_s" "$tmp/lim_s" || { diff "$tmp/one_s" "$tmp/lim_s" | head; fail "under cache_limit the ranks saw other samples"; }
    used=$(cat "$tmp/cachelim"/index.json "$tmp/cachelim"/shard.*.mds 2>/dev/null | wc -c)
    [ "$used" -le "$limit" ] || fail "the cache holds $used bytes, over cache_limit $limit"
    echo "under cache_limit $limit: $(grep '^F' "$tmp/lim.txt") shard fetches for $n shards, $used bytes cached at the end"
    [ "$(s3_stat refused)" = 0 ] || fail "the proxy refused $(s3_stat refused) signatures"
    ;;
streaming_resume_elastic)
    # Mid-epoch resumption on another number of ranks through the Trainer's checkpoints, the
    # data streamed from the bucket: 1 process trains 30 batches (20 an epoch) saving every 5,
    # 3 ranks resume it from batch 5; 4 ranks train and save, 2 ranks resume them from batch 5.
    # Every resumed batch holds exactly the uninterrupted run's samples (no replay, nothing
    # skipped; the 4-rank run's as well), and the weights agree within the elastic tolerance of
    # ckpt_elastic_resume (the ranks sum the gradients in another order).
    s3_start
    export CM_STORAGE_RETRY_BACKOFF_S=0.05
    st=$bin/dist_streaming
    tol=2e-6
    "$st" write "$tmp/src" s3://bkt/ds >/dev/null || fail "writing the dataset"
    env -u OMPI_COMM_WORLD_SIZE "$st" train "$tmp/ref.txt" s3://bkt/ds "$tmp/c1" --save "$tmp/A" || fail "1-process run"
    grep '^S' "$tmp/ref.txt" >"$tmp/ref_s"
    [ "$(wc -l <"$tmp/ref_s")" = 30 ] || fail "the reference has $(wc -l <"$tmp/ref_s") batches"
    awk '$2 > 5' "$tmp/ref_s" >"$tmp/ref_after5"
    launch -n 3 "$st" train "$tmp/r3.txt" s3://bkt/ds "$tmp/c3" --load "$tmp/A/ep0-ba5" || fail "1 -> 3 ranks"
    grep -q "^R $tmp/A/ep0-ba5" "$tmp/r3.txt" || fail "the 3-rank run did not resume"
    grep '^S' "$tmp/r3.txt" >"$tmp/r3_s"
    cmp -s "$tmp/ref_after5" "$tmp/r3_s" || { diff "$tmp/ref_after5" "$tmp/r3_s" | head; fail "1 -> 3 ranks: other samples than uninterrupted"; }
    "$bin/dist_ckpt" --compare "$tmp/ref.txt" "$tmp/r3.txt" $tol || fail "1 -> 3 ranks differs from the uninterrupted run"
    launch -n 4 "$st" train "$tmp/w4.txt" s3://bkt/ds "$tmp/c4" --save "$tmp/B" || fail "the 4-rank run"
    grep '^S' "$tmp/w4.txt" >"$tmp/w4_s"
    cmp -s "$tmp/ref_s" "$tmp/w4_s" || { diff "$tmp/ref_s" "$tmp/w4_s" | head; fail "4 ranks saw other samples than 1 process"; }
    launch -n 2 "$st" train "$tmp/r2.txt" s3://bkt/ds "$tmp/c2" --load "$tmp/B/ep0-ba5" || fail "4 -> 2 ranks"
    grep -q "^R $tmp/B/ep0-ba5" "$tmp/r2.txt" || fail "the 2-rank run did not resume"
    grep '^S' "$tmp/r2.txt" >"$tmp/r2_s"
    cmp -s "$tmp/ref_after5" "$tmp/r2_s" || { diff "$tmp/ref_after5" "$tmp/r2_s" | head; fail "4 -> 2 ranks: other samples than uninterrupted"; }
    "$bin/dist_ckpt" --compare "$tmp/w4.txt" "$tmp/r2.txt" $tol || fail "4 -> 2 ranks differs from the uninterrupted 4-rank run"
    [ "$(s3_stat refused)" = 0 ] || fail "the proxy refused $(s3_stat refused) signatures"
    ;;
train_algos_equivalence)
    # The training methods under NO_SHARD: every rank applies the same update (SAM perturbs by the
    # global batch's gradient), so 2 ranks (microbatches of 2 and 1 rows each) train as one process
    # (tolerance as cli_train_equivalence).
    # Under a sharded strategy they refuse to start, on every rank, naming NO_SHARD.
    cli_setup
    algos='algorithms={ema: {half_life: 2ba}, sam: {rho: 0.1, interval: 2}, swa: {swa_start: 0.3dur, swa_end: 0.7dur, update_interval: 1ba, schedule_swa_lr: true, swa_lr: 0.05}, layer_freezing: {freeze_start: 0.0}}'
    "$composer" train "$tmp/tiny.yaml" run_root="$tmp/ref" run_name=ref "$algos" >"$tmp/ref.out" 2>&1 || { cat "$tmp/ref.out"; fail "1-process train"; }
    for n in 2; do
        launch -n $n train "$tmp/tiny.yaml" run_root="$tmp/n$n" run_name=r "$algos" >"$tmp/n$n.out" 2>&1 || { cat "$tmp/n$n.out"; fail "train on $n ranks"; }
        "$bin/dist_cli_compare" "$tmp/ref/ref" "$tmp/n$n/r" 2e-6 || fail "$n ranks with the methods differ from 1 process"
    done
    launch -n 2 train "$tmp/tiny.yaml" run_root="$tmp/sh" "$algos" parallelism.fsdp.sharding_strategy=SHARD_GRAD_OP >"$tmp/sh.out" 2>&1
    rc=$?
    cat "$tmp/sh.out"
    [ $rc -ne 0 ] || fail "the methods were accepted under SHARD_GRAD_OP"
    grep -q "use sharding_strategy NO_SHARD" "$tmp/sh.out" || fail "the refusal does not name NO_SHARD"
    ;;
*)
    fail "unknown case '$case_'"
    ;;
esac
echo "dist $case_: ok"
