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

case "$case_" in
launcher_env_and_stdout_per_rank)
    launch -n 3 --stdout "$tmp/out{rank}of{world_size}.txt" sh -c 'echo "$RANK $LOCAL_RANK $NODE_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_PORT"' \
        || fail "launching sh on 3 ranks"
    for r in 0 1 2; do
        [ "$(cat "$tmp/out${r}of3.txt")" = "$r $r 0 3 3 29500" ] || fail "rank $r wrote '$(cat "$tmp/out${r}of3.txt")'"
    done
    "$composer" -n 2 --stdout "x{rnk}" sh -c true 2>"$tmp/err" && fail "a bad format was accepted"
    grep -q "unknown placeholder '{rnk}'" "$tmp/err" || fail "bad format message: $(cat "$tmp/err")"
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
*)
    fail "unknown case '$case_'"
    ;;
esac
echo "dist $case_: ok"
