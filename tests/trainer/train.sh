#!/bin/sh
# Bitwise pairs of weft-train runs (suite trainer). $1 mode, $2 weftrun, $3 weft-train.
# The first run writes a golden file (per step: loss, gradient norm, hash of the canonical
# parameters, all bit for bit); the second compares against it and exits 1 on any difference.
set -eu
mode=$1 weftrun=$2 train=$3
dir=$(mktemp -d "${TMPDIR:-/tmp}/weft-train-test.XXXXXX")
trap 'rm -rf "$dir"' EXIT
steps=12
run() { # ranks, then weft-train arguments
    n=$1
    shift
    "$weftrun" -n "$n" --timeout 200 "$train" --steps $steps --quiet "$@"
}
case $mode in
zero) # DP 2: a + b is the same sum whether all-reduced or reduce-scattered
    run 2 --zero 0 --golden-out "$dir/g"
    for z in 1 2 3; do run 2 --zero $z --golden-in "$dir/g"; done ;;
zero3) # DP 3: ZeRO stages issue the same reduce-scatters on the same padded units
    run 3 --batch 6 --zero 1 --golden-out "$dir/g"
    for z in 2 3; do run 3 --batch 6 --zero $z --golden-in "$dir/g"; done ;;
schedules) # backward in micro-batch order 0..m-1 under both schedules
    run 2 --pp 2 --microbatches 4 --schedule gpipe --golden-out "$dir/g"
    run 2 --pp 2 --microbatches 4 --schedule 1f1b --golden-in "$dir/g"
    run 4 --pp 4 --microbatches 8 --schedule gpipe --golden-out "$dir/g4"
    run 4 --pp 4 --microbatches 8 --schedule 1f1b --golden-in "$dir/g4" ;;
resume) # stop at step 6, resume: the same bits as an uninterrupted run; then a checkpoint
        # written by one layout resumed by another, checked against the single-rank model
    run 2 --zero 1 --golden-out "$dir/g"
    run 2 --zero 1 --steps 6 --ckpt-dir "$dir/ck" --ckpt-every 3
    [ -f "$dir/ck/step_00000006/DONE" ]
    run 2 --zero 1 --ckpt-dir "$dir/ck" --ckpt-every 3 --golden-in "$dir/g"
    run 2 --pp 2 --microbatches 2 --steps 6 --ckpt-dir "$dir/ck2" --ckpt-every 6
    run 4 --tp 2 --zero 3 --ckpt-dir "$dir/ck2" --check ref ;;
kill) # rank 1 is killed in step 7; the survivors get an error from the library, weftrun
      # restarts the job, which resumes from step 6 and must match the uninterrupted run
    run 3 --batch 6 --golden-out "$dir/g"
    out=$dir/out
    if ! "$weftrun" -n 3 --restarts 1 --linger 60 --timeout 200 "$train" --steps $steps --batch 6 \
        --ckpt-dir "$dir/ck" --ckpt-every 3 --fail-at-step 7 --fail-rank 1 \
        --golden-in "$dir/g" > "$out" 2>&1; then
        cat "$out"
        exit 1
    fi
    cat "$out"
    grep -q "fault injection: killing myself in step 7" "$out"
    # each survivor saw the failure through a library error and exited with status 3
    [ "$(grep -c 'failed: .*aborting' "$out")" -ge 2 ]
    ! grep -q "still running .* after the failure" "$out"
    grep -q "resuming from checkpoint step 6" "$out"
    grep -q "restart 1 of 1" "$out" ;;
*)
    echo "unknown mode $mode" >&2
    exit 2 ;;
esac
