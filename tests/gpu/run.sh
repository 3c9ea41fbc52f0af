#!/usr/bin/env bash
# The GPU check: one command for a machine with one NVIDIA GPU (an H200 here), inside 9 minutes.
#
#   tests/gpu/run.sh [--dry-run] [--build DIR]
#
# Stages run in order, each with its own budget; a stage that would start with less time left
# than its budget prints `SKIPPED: <stage> (budget)` instead of running into the device tool's
# kill. Every stage ends with an `N passed, N failed` line; the last line of the run adds them up.
# A case is one command with its own timeout (the rest of its stage's budget at most).
#
# Build: a build carried from the CPU machine (--build DIR, default build-gpu, made with
# `meson setup build-gpu -Dcuda=enabled -Dbuildtype=release`) is used as it is when its library
# loads here; otherwise the script builds one with the toolkit it finds (meson, ninja -j16).
#
# Results (at most 8 files) go under $OUT (the device tool's folder; ./gpu-out otherwise):
# summary.txt, env.txt, build.log, unit.log (stages unit and kunit), multirank.log, perf.csv,
# perf.log, sanitizer.log.
#
# --dry-run (on the CPU machine, no GPU): checks this script's own tools and its stage list: every
# binary a case names exists in the build and runs its --help (or the emulated GPU, where the case
# can run there), the budgets add up to the deadline, and the result files stay within 8. It costs
# no device minutes, so a script bug is found before a lease is spent on it.
set -u

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
dry=0
build=""
while [ $# -gt 0 ]; do
    case "$1" in
    --dry-run) dry=1 ;;
    --build) build=$2; shift ;;
    -h | --help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1"; exit 2 ;;
    esac
    shift
done
[ -n "$build" ] || build=$top/build-gpu
case "$build" in /*) ;; *) build=$top/$build ;; esac
out=${OUT:-$top/gpu-out}
mkdir -p "$out"

DEADLINE=540 # seconds: the device tool kills a command at 600
start=$(date +%s)
# stage name, budget (s), result file
# (kunit writes into unit.log after unit: at most 8 result files.)
stages=(preflight:15:env.txt build:120:build.log unit:45:unit.log kunit:60:unit.log
        multirank:140:multirank.log perf:90:perf.log sanitizer:60:sanitizer.log)
total_pass=0
total_fail=0
summary=$out/summary.txt
: >"$summary"

say() { echo "$*" | tee -a "$summary"; }
elapsed() { echo $(($(date +%s) - start)); }

# The cases of each stage: "name|timeout|command". $B is the build folder. A case passes when its
# command exits 0 (each binary checks its results element by element and exits non-zero on a
# wrong one). Cases marked emu= also run on the emulated GPU in --dry-run (WEFT_CUDA=emu:1: the
# one GPU of the real machine), so the very command lines a lease will run are tried here first.
unit_cases=(
    "emu=copy-rate-check|20|\$B/tests/gpu/copy_rate 67108864 3"
    "emu=loopback-1rank|60|\$B/tests/gpu-emu/test_coll sweep -n 1 -d 1 -q"
    "emu=abort|20|\$B/tests/gpu-emu/test_coll abort -n 2 -d 1"
    "emu=deadline|20|env WEFT_TIMEOUT=2 \$B/tests/gpu-emu/test_coll timeout -n 2 -d 1"
    "emu=mismatch|20|\$B/tests/gpu-emu/test_coll mismatch -n 2 -d 1"
    "emu=bad-buffers|20|\$B/tests/gpu-emu/test_coll badbuf -n 2 -d 1"
)
# Kernel unit tests (tests/gpu-emu/test_kern_unit.c): device reductions bit-equal to the host's
# for every type x op, Simple and LL loopback at 0 B .. 64 MiB, the LL flag wrap of the 8-bit-flag
# kernel build, abort and deadline, on each protocol.
K=\$B/tests/gpu-emu/test_kern_unit
kunit_cases=(
    "emu=rules|10|$K rules"
    "emu=redop-ll|20|env NCCL_PROTO=LL $K redop"
    "emu=redop-simple|20|env NCCL_PROTO=Simple $K redop"
    "emu=loopback-ll|30|env NCCL_PROTO=LL $K loopback -f"
    "emu=loopback-simple|30|env NCCL_PROTO=Simple $K loopback -f"
    "emu=ll-wrap|20|env NCCL_PROTO=LL $K wrap"
    "emu=abort-ll|10|env NCCL_PROTO=LL $K abort"
    "emu=abort-simple|10|env NCCL_PROTO=Simple $K abort"
    "emu=deadline-ll|15|env NCCL_PROTO=LL WEFT_TIMEOUT=2 $K deadline"
    "emu=deadline-simple|15|env NCCL_PROTO=Simple WEFT_TIMEOUT=2 $K deadline"
)
multirank_cases=(
    "emu=threads-2|50|\$B/tests/gpu-emu/test_coll sweep -n 2 -d 1 -q"
    "emu=threads-4|60|\$B/tests/gpu-emu/test_coll sweep -n 4 -d 1 -q"
    "emu=one-stream-4|40|\$B/tests/gpu-emu/test_coll sweep -n 4 -d 1 -s -q"
    "emu=graph-replay|20|\$B/tests/gpu-emu/test_coll graph -n 2 -d 1"
    "emu=multicomm|20|\$B/tests/gpu-emu/test_coll multicomm -n 3 -d 1"
    "emu=initrank-threads|20|\$B/tests/gpu-emu/test_coll initrank -n 4 -d 1"
    "emu=procs-2-cumem|30|\$B/tools/weftrun -n 2 --timeout 28 \$B/tests/gpu-emu/test_coll_mp sweep -q"
    "emu=procs-2-legacy|30|env NCCL_CUMEM_ENABLE=0 \$B/tools/weftrun -n 2 --timeout 28 \$B/tests/gpu-emu/test_coll_mp sweep -q"
)
perf_cases=(
    "copy-rate|15|\$B/tests/gpu/copy_rate"
    "weft-1rank|25|\$B/perf/all_reduce_perf -b 8 -e 1G -f 4 -g 1 -c 0"
    "weft-2ranks|30|\$B/perf/all_reduce_perf -b 8 -e 1G -f 4 -g 2 -c 0"
    "nvidia-1rank|25|nccl_wheel \$B/perf/all_reduce_perf -b 8 -e 1G -f 4 -g 1 -c 0"
)
sanitizer_cases=(
    "memcheck|25|compute-sanitizer --tool memcheck --error-exitcode 1 \$B/tests/gpu-emu/test_coll sweep -n 1 -d 1 -q"
    "racecheck-ll|15|env NCCL_PROTO=LL compute-sanitizer --tool racecheck --error-exitcode 1 $K loopback -s"
    "synccheck-simple|15|env NCCL_PROTO=Simple compute-sanitizer --tool synccheck --error-exitcode 1 $K loopback -s"
)

# NVIDIA's libnccl.so.2 from the image's nvidia-nccl-cu13 wheel: runs a command with it first on
# the library path.
nccl_wheel_dir() {
    python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' \
        2>/dev/null
}
nccl_wheel() {
    local d
    d=$(nccl_wheel_dir)
    [ -n "$d" ] && [ -e "$d/libnccl.so.2" ] || { echo "no nvidia-nccl wheel"; return 3; }
    LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$@"
}

# run_cases STAGE LOG BUDGET_END CASE... : runs each case with min(its timeout, time left).
run_cases() {
    local stage=$1 log=$2 end=$3
    shift 3
    local pass=0 fail=0 c name tmo cmd left
    for c in "$@"; do
        name=${c%%|*}; c=${c#*|}; tmo=${c%%|*}; cmd=${c#*|}
        name=${name#emu=}
        left=$((end - $(date +%s)))
        if [ "$left" -lt 3 ]; then
            say "SKIPPED: $stage/$name (budget)"
            fail=$((fail + 1))
            continue
        fi
        [ "$tmo" -le "$left" ] || tmo=$left
        echo "=== $stage/$name: $cmd" >>"$log"
        local t0=$(date +%s)
        B=$build eval "timeout -k 5 $tmo $cmd" >>"$log" 2>&1
        local rc=$?
        if [ $rc = 0 ]; then
            pass=$((pass + 1)); echo "    ok   $stage/$name ($(($(date +%s) - t0)) s)"
        else
            fail=$((fail + 1)); echo "    FAIL $stage/$name (exit $rc, $(($(date +%s) - t0)) s)"
            echo "--- exit $rc" >>"$log"
        fi
    done
    total_pass=$((total_pass + pass)); total_fail=$((total_fail + fail))
    say "$stage: $pass passed, $fail failed"
}

stage_preflight() {
    local log=$1 pass=0 fail=0
    {
        echo "date: $(date -u)"; uname -a; ldd --version 2>&1 | head -1
        nvidia-smi -L 2>&1; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
        nvcc --version 2>&1 | tail -2; cc --version 2>&1 | head -1
        meson --version 2>&1 || python3 -m mesonbuild.mesonmain --version 2>&1
        compute-sanitizer --version 2>&1 | head -2
        command -v nvidia-cuda-mps-control || echo "no nvidia-cuda-mps-control"
        echo "nvidia nccl wheel: $(nccl_wheel_dir)"
    } >"$log" 2>&1
    if nvidia-smi -L >/dev/null 2>&1; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
    total_pass=$((total_pass + pass)); total_fail=$((total_fail + fail))
    say "preflight: $pass passed, $fail failed ($(nvidia-smi -L 2>/dev/null | head -1))"
}

stage_build() {
    local log=$1 end=$2
    if [ -e "$build/libnccl.so.2" ] && "$build/tools/weft-info" >/dev/null 2>&1; then
        echo "using the carried build $build" >"$log"
        say "build: 1 passed, 0 failed (carried $build)"
        total_pass=$((total_pass + 1))
        return
    fi
    echo "building $build" >"$log"
    local left=$((end - $(date +%s)))
    if (cd "$top" && timeout "$left" meson setup "$build" -Dcuda=enabled -Dbuildtype=release \
            >>"$log" 2>&1 && timeout "$((end - $(date +%s)))" ninja -C "$build" -j16 \
            >>"$log" 2>&1); then
        say "build: 1 passed, 0 failed (built here)"
        total_pass=$((total_pass + 1))
    else
        tail -40 "$log" >"$log.tail"; mv "$log.tail" "$log"
        say "build: 0 passed, 1 failed (see build.log)"
        total_fail=$((total_fail + 1))
    fi
}

# perf.csv: the rows of the perf tools' tables at 8 B, 1 MiB, 64 MiB and 1 GiB, one per case.
perf_csv() {
    local log=$1 csv=$out/perf.csv
    echo "case,bytes,time_us,algbw_GBs,busbw_GBs" >"$csv"
    awk '/^=== perf\// { split($2, a, "/"); name = substr(a[2], 1, length(a[2]) - 1) }
         $1 ~ /^[0-9]+$/ && ($1 == 8 || $1 == 1048576 || $1 == 67108864 || $1 == 1073741824) {
             printf "%s,%s,%s,%s,%s\n", name, $1, $6, $7, $8 }' "$log" >>"$csv"
}

dry_run() {
    local pass=0 fail=0 sum=0 s name budget file nfiles
    for s in "${stages[@]}"; do
        budget=${s#*:}; budget=${budget%%:*}
        sum=$((sum + budget))
    done
    # summary.txt, perf.csv and each stage's file once
    nfiles=$(( $(for s in "${stages[@]}"; do echo "${s##*:}"; done | sort -u | wc -l) + 2 ))
    if [ "$sum" -le "$DEADLINE" ]; then pass=$((pass + 1)); else
        echo "FAIL: stage budgets add up to $sum s, over the $DEADLINE s deadline"; fail=$((fail + 1)); fi
    if [ "$nfiles" -le 8 ]; then pass=$((pass + 1)); else
        echo "FAIL: $nfiles result files, over 8"; fail=$((fail + 1)); fi
    for t in timeout awk python3 date tee; do
        if command -v "$t" >/dev/null; then pass=$((pass + 1)); else
            echo "FAIL: no $t"; fail=$((fail + 1)); fi
    done
    [ -e "$build/libnccl.so.2" ] || { echo "FAIL: no build at $build (meson setup $build)"; fail=$((fail + 1)); }
    local c cmd bin tmo
    for c in "${unit_cases[@]}" "${kunit_cases[@]}" "${multirank_cases[@]}" "${perf_cases[@]}" \
             "${sanitizer_cases[@]}"; do
        name=${c%%|*}; cmd=${c#*|}; tmo=${cmd%%|*}; cmd=${cmd#*|}
        # the binary a case runs: the first word that names a file of the build
        bin=$(B=$build eval "echo $cmd" | tr ' ' '\n' | grep "^$build/" | head -1)
        if [ -z "$bin" ] || [ ! -x "$bin" ]; then
            echo "FAIL: ${name#emu=}: $bin not built"; fail=$((fail + 1)); continue
        fi
        case "$name" in
        emu=*)
            if B=$build WEFT_CUDA=emu:1 eval "timeout -k 5 $tmo $cmd" >/tmp/weft-gpu-dry.$$ 2>&1; then
                pass=$((pass + 1)); echo "    ok   ${name#emu=} on the emulated GPU"
            else
                fail=$((fail + 1)); echo "FAIL: ${name#emu=} on the emulated GPU:"; tail -5 /tmp/weft-gpu-dry.$$
            fi ;;
        *) pass=$((pass + 1)); echo "    ok   $name: $bin exists" ;;
        esac
    done
    rm -f /tmp/weft-gpu-dry.$$
    echo "dry-run: $pass passed, $fail failed"
    [ "$fail" = 0 ]
}

if [ "$dry" = 1 ]; then
    dry_run
    exit $?
fi

started="" # result files begun by this run (two stages may share one)
for s in "${stages[@]}"; do
    name=${s%%:*}; rest=${s#*:}; budget=${rest%%:*}; file=${rest#*:}
    now=$(elapsed)
    if [ $((now + budget)) -gt "$DEADLINE" ]; then
        say "SKIPPED: $name (budget)"
        continue
    fi
    end=$(($(date +%s) + budget))
    log=$out/$file
    case " $started " in *" $file "*) ;; *) : >"$log"; started="$started $file" ;; esac
    echo "--- stage $name (budget $budget s, at $now s)"
    case "$name" in
    preflight) stage_preflight "$log" ;;
    build) stage_build "$log" "$end" ;;
    unit) run_cases unit "$log" "$end" "${unit_cases[@]}" ;;
    kunit) run_cases kunit "$log" "$end" "${kunit_cases[@]}" ;;
    multirank) run_cases multirank "$log" "$end" "${multirank_cases[@]}" ;;
    perf) run_cases perf "$log" "$end" "${perf_cases[@]}"; perf_csv "$log" ;;
    sanitizer)
        if command -v compute-sanitizer >/dev/null; then
            run_cases sanitizer "$log" "$end" "${sanitizer_cases[@]}"
        else
            say "SKIPPED: sanitizer (no compute-sanitizer)"
        fi ;;
    esac
done
say "total: $total_pass passed, $total_fail failed in $(elapsed) s"
[ "$total_fail" = 0 ]
