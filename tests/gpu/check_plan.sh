#!/bin/sh
# check_plan.sh RUN_SH BUILD CARRY cuda|no-cuda: the GPU check's plan (meson test gpu-run-plan).
# Makes the carried build CARRY from BUILD (run.sh --make-carry), runs run.sh --dry-run on it and
# checks, from its output and not only its exit status: the last line is exactly
# `plan: N s of device time, carry M MiB` with N <= 420 and M <= 60, M is the du of CARRY, and
# every case's timeout is at most its stage's budget (the `--- STAGE: budget B s` lines and the
# case lines under them). Exit 77 where BUILD has no real CUDA backend (nothing to carry).
run=$1 build=$2 carry=$3 cuda=$4
if [ "$cuda" != cuda ]; then
    echo "SKIP: this build has no real CUDA backend (-Dcuda=disabled or no toolkit): no kernels to carry"
    exit 77
fi
out=$(mktemp) || exit 1
trap 'rm -f "$out"' EXIT
"$run" --make-carry "$build" --build "$carry" || { echo "FAIL: run.sh --make-carry $build"; exit 1; }
"$run" --dry-run --build "$carry" >"$out" 2>&1
rc=$?
cat "$out"
fail=0
last=$(tail -n 1 "$out")
n=$(echo "$last" | sed -n 's/^plan: \([0-9][0-9]*\) s of device time, carry \([0-9][0-9]*\) MiB$/\1/p')
m=$(echo "$last" | sed -n 's/^plan: \([0-9][0-9]*\) s of device time, carry \([0-9][0-9]*\) MiB$/\2/p')
if [ -z "$n" ] || [ -z "$m" ]; then
    echo "FAIL: the last line is not 'plan: N s of device time, carry M MiB': $last"
    exit 1
fi
[ "$n" -le 420 ] || { echo "FAIL: plan of $n s, over 420 s"; fail=1; }
[ "$m" -le 60 ] || { echo "FAIL: carry of $m MiB, over 60 MiB"; fail=1; }
du=$(du -sk "$carry" | awk '{ print int(($1 + 1023) / 1024) }')
[ "$du" = "$m" ] || { echo "FAIL: the plan says $m MiB, du of $carry says $du MiB"; fail=1; }
# every case timeout against its stage's budget, and at least one case per stage listed
awk '/^--- [a-z-]+: budget [0-9]+ s$/ { stage = $2; sub(/:$/, "", stage); budget = $4; stages++; next }
     stage != "" && /^    [a-z0-9-]+ +[0-9]+ s  / {
         cases++
         if ($2 + 0 > budget + 0) { print "FAIL: " stage "/" $1 ": timeout " $2 " s over the budget " budget " s"; bad = 1 }
     }
     END { if (stages < 5 || cases < 10) { print "FAIL: " stages + 0 " stages, " cases + 0 " cases listed"; bad = 1 }
           else print "checked " cases " case timeouts of " stages " stages against their budgets"
           exit bad }' "$out" || fail=1
[ "$rc" = 0 ] || { echo "FAIL: run.sh --dry-run exits $rc"; fail=1; }
[ "$fail" = 0 ] && echo "ok: plan $n s <= 420, carry $m MiB <= 60"
exit $fail
