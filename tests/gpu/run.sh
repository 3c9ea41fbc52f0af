#!/usr/bin/env bash
# The GPU check: one command for a machine with one NVIDIA GPU (an H200 here), inside 9 minutes.
#
#   tests/gpu/run.sh [--dry-run] [--build DIR] [--only STAGE,...]
#
# Stages run in order, each with its own budget; a stage that would start with less time left
# than its budget prints `SKIPPED: <stage> (budget)` instead of running into the device tool's
# kill. Every stage ends with an `N passed, N failed, N skipped` line; the last line of the run
# adds them up. A case is one command with its own timeout (the rest of its stage's budget at
# most); a case that exits 77 is skipped, not failed, and its summary line gives the reason (the
# last `SKIP...` line it printed): torch without CUDA, no wheel NCCL, perf tools without -R.
#
# Stages: preflight, build, unit (1 process), kunit (kernel unit tests), multirank (threads and
# processes on the one GPU), perf (nccl-tests tables, Weft and the wheel's NCCL), mplat (8 B
# all-reduce latency of 2 and 4 processes over cuMem and legacy IPC beside 2 and 4 threads, -S
# time-targeted; summary line: the ratio procs/threads), reg (busbw at 1 MiB and 64 MiB with and
# without -R 1, nccl-tests' --local_register: ncclMemAlloc + ncclCommRegister), torch (PyTorch's
# nccl backend on Weft: tests/gpu/torch_check.py through LD_PRELOAD, which LD_LIBRARY_PATH loads,
# 2 processes on the GPU, and the wheel's NCCL as the baseline), sanitizer.
#
# --only runs just the stages named (a rerun of one stage; or, with WEFT_CUDA=emu:1 on a machine
# without a GPU, the stages whose cases can run on the emulated GPU: mplat, reg, torch).
#
# Build: a build carried from the CPU machine (--build DIR, default build-gpu, made with
# `meson setup build-gpu -Dcuda=enabled -Dgpu_checks=true -Dbuildtype=release`) is used as it is when its library
# loads here and holds the CUDA kernels; otherwise the script builds one with the toolkit it finds
# (meson, ninja -j16), in a fresh folder build-gpu-local where the carried one is unusable.
#
# Results (at most 8 files) go under $OUT (the device tool's folder; ./gpu-out otherwise):
# summary.txt, env.txt, build.log, unit.log (stages unit, kunit and sanitizer), multirank.log,
# perf.log (stages perf, mplat and reg), perf.csv (their rows at 8 B, 1 MiB, 64 MiB, 1 GiB),
# torch.log.
#
# --dry-run (on the CPU machine, no GPU): checks this script's own tools and its stage list: every
# binary a case names exists in the build (and the case runs on the emulated GPU, where it can),
# each torch case's script compiles (as python3 -m py_compile) and its command runs here to 0 or 77
# (skipped: no CUDA torch here), the perf tools say whether they have -R, the budgets add up to
# the deadline, and the result files stay within 8. It costs no device minutes, so a script bug
# is found before a lease is spent on it.
set -u

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
dry=0
build=""
only=""
while [ $# -gt 0 ]; do
    case "$1" in
    --dry-run) dry=1 ;;
    --build) build=$2; shift ;;
    --only) only=,$2,; shift ;;
    -h | --help) awk 'NR > 1 && /^set -u/ { exit } NR > 1' "$0"; exit 0 ;;
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
# (Stages share files so that there are at most 8: kunit and sanitizer write into unit.log, mplat
# and reg into perf.log.) The budgets add up to DEADLINE, so every stage runs even if each one
# takes all of its budget; a carried build leaves build's 80 s unused.
stages=(preflight:10:env.txt build:80:build.log unit:35:unit.log kunit:45:unit.log
        multirank:100:multirank.log perf:55:perf.log mplat:40:perf.log reg:45:perf.log
        torch:100:torch.log sanitizer:30:unit.log)
total_pass=0
total_fail=0
total_skip=0
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
# Multi-process latency (issue 13 items 2 and 6): without MPS the GPU time-slices between
# processes, so ranks as processes on one GPU wait for each other's time slice; threads of one
# process share a context and run concurrently. 8 B all-reduce, iterations from a 0.2 s time
# target (-S), 2 and 4 ranks each way, both handle paths for processes.
P=\$B/perf/all_reduce_perf
L="-b 8 -e 8 -S 0.2 -w 5 -c 1"
mplat_cases=(
    "emu=threads-2|15|$P -t 2 $L"
    "emu=threads-4|15|$P -t 4 $L"
    "emu=procs-2-cumem|15|\$B/tools/weftrun -n 2 --timeout 13 $P $L"
    "emu=procs-2-legacy|15|env NCCL_CUMEM_ENABLE=0 \$B/tools/weftrun -n 2 --timeout 13 $P $L"
    "emu=procs-4-cumem|15|\$B/tools/weftrun -n 4 --timeout 13 $P $L"
    "emu=procs-4-legacy|15|env NCCL_CUMEM_ENABLE=0 \$B/tools/weftrun -n 4 --timeout 13 $P $L"
)
# Registered against unregistered buffers (nccl-tests' -R 1: ncclMemAlloc + ncclCommRegister),
# rows at 1 MiB and 64 MiB: device buffers (ncclMemAlloc is device memory on a GPU), 2 ranks on
# the GPU in one process; and host buffers (-H 1, WEFT_CUDA=0: ncclMemAlloc is host memory only
# without a CUDA device), 2 processes. with_reg adds -R 1, or skips the case with the reason (no
# -R in this tree; an older tree whose -R 1 refuses device buffers).
G="-b 1M -e 64M -f 64 -n 20 -w 3 -c 1"
W2="env WEFT_CUDA=0 \$B/tools/weftrun -n 2 --timeout 8"
reg_cases=(
    "ar-unreg|10|\$B/perf/all_reduce_perf -g 2 $G"
    "ar-reg|10|with_reg \$B/perf/all_reduce_perf -g 2 $G"
    "ag-unreg|10|\$B/perf/all_gather_perf -g 2 $G"
    "ag-reg|10|with_reg \$B/perf/all_gather_perf -g 2 $G"
    "rs-unreg|10|\$B/perf/reduce_scatter_perf -g 2 $G"
    "rs-reg|10|with_reg \$B/perf/reduce_scatter_perf -g 2 $G"
    "ar-host-unreg|10|$W2 \$B/perf/all_reduce_perf -H 1 $G"
    "ar-host-reg|10|with_reg $W2 \$B/perf/all_reduce_perf -H 1 $G"
    "ag-host-unreg|10|$W2 \$B/perf/all_gather_perf -H 1 $G"
    "ag-host-reg|10|with_reg $W2 \$B/perf/all_gather_perf -H 1 $G"
    "rs-host-unreg|10|$W2 \$B/perf/reduce_scatter_perf -H 1 $G"
    "rs-host-reg|10|with_reg $W2 \$B/perf/reduce_scatter_perf -H 1 $G"
)
# PyTorch on Weft (tests/gpu/torch_check.py; it exits 77 where torch or its CUDA is absent). Every
# check prints `TORCH ok|FAIL|skip ...` into torch.log. LD_PRELOAD puts Weft first whatever torch's
# own library path says; the ldpath case only reports which libnccl.so.2 LD_LIBRARY_PATH gives
# torch (the torch stage's summary line says it). The wheel's NCCL refuses two ranks on one GPU, so
# 2 processes are Weft only; nvidia-1proc is the timing baseline (and checks the checks).
TC="python3 $here/torch_check.py --lib \$B/libnccl.so.2"
PRE="env LD_PRELOAD=\$B/libnccl.so.2"
torch_cases=(
    "py=weft-1proc-preload|40|$PRE $TC --expect weft --timing"
    "py=weft-1proc-ldpath|20|env LD_LIBRARY_PATH=\$B\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} $TC --probe"
    "py=nvidia-1proc|35|$TC --expect nvidia --timing"
    "py=weft-2proc-1gpu|70|$PRE $TC --nproc 2 --timeout 65 --expect weft --timing"
)
sanitizer_cases=(
    "memcheck|25|compute-sanitizer --tool memcheck --error-exitcode 1 \$B/tests/gpu-emu/test_coll sweep -n 1 -d 1 -q"
    "racecheck-ll|15|env NCCL_PROTO=LL compute-sanitizer --tool racecheck --error-exitcode 1 $K loopback -s"
    "synccheck-simple|15|env NCCL_PROTO=Simple compute-sanitizer --tool synccheck --error-exitcode 1 $K loopback -s"
)

# Helpers a case's command may name: each case runs as `bash -c CMD` under timeout, so they are
# exported functions.
# NVIDIA's libnccl.so.2 from the image's nvidia-nccl-cu13 wheel: runs a command with it first on
# the library path (exit 77, skipped, without the wheel). The perf tools then dlopen a CUDA runtime
# (perf/devmem.c): the cu13 wheels keep libcudart.so.13 in nvidia/cu13/lib, so that folder and the
# toolkit's come after the NCCL one.
nccl_wheel_dir() {
    python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' \
        2>/dev/null
}
cudart_wheel_dir() {
    python3 -c 'import nvidia.cu13, os; print(os.path.join(list(nvidia.cu13.__path__)[0], "lib"))' \
        2>/dev/null
}
nccl_wheel() {
    local d r p
    d=$(nccl_wheel_dir)
    [ -n "$d" ] && [ -e "$d/libnccl.so.2" ] || { echo "SKIP: no nvidia-nccl wheel"; return 77; }
    p=$d
    for r in "$(cudart_wheel_dir)" /usr/local/cuda/lib64; do
        [ -z "$r" ] || [ ! -e "$r/libcudart.so.13" ] || p=$p:$r
    done
    LD_LIBRARY_PATH=$p${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$@"
}
# has_reg TOOL: whether the perf tool takes -R (its --help lists -R,--local_register).
has_reg() {
    case "$("$1" -h 2>&1)" in *"-R,--local_register"*) return 0 ;; *) return 1 ;; esac
}
# with_reg CMD...: runs CMD with -R 1 (registered buffers) after its perf tool (the first word
# ending in _perf; CMD may start with env or weftrun). Exit 77 where the tool has no -R, or where
# its -R 1 refuses device buffers (trees before ncclMemAlloc gave device memory).
with_reg() {
    local a tool="" args=() out rc
    for a in "$@"; do
        args+=("$a")
        if [ -z "$tool" ] && [[ "$a" == *_perf ]]; then tool=$a; args+=(-R 1); fi
    done
    [ -n "$tool" ] || { echo "with_reg: no perf tool in: $*"; return 2; }
    has_reg "$tool" || { echo "SKIP: no -R in $tool"; return 77; }
    out=$("${args[@]}" 2>&1)
    rc=$?
    printf '%s\n' "$out"
    case "$rc:$out" in
    2:*"needs Weft on host buffers"*) echo "SKIP: -R 1 takes host buffers only (-H 1)"; return 77 ;;
    esac
    return $rc
}
export -f nccl_wheel_dir cudart_wheel_dir nccl_wheel has_reg with_reg

# run_case TIMEOUT CMD: runs one case's command line (B = the build folder) under timeout.
run_case() {
    B=$build timeout -k 5 "$1" bash -c "$2"
}

# skip_reason FILE: the last SKIP line a case printed (its reason for exit 77).
skip_reason() {
    grep -ao 'SKIP[^[:cntrl:]]*' "$1" | tail -1 | sed 's/^SKIP[A-Z]*:* *//' | cut -c1-160
}

# run_cases STAGE LOG BUDGET_END CASE... : runs each case with min(its timeout, time left).
run_cases() {
    local stage=$1 log=$2 end=$3
    shift 3
    local pass=0 fail=0 skip=0 c name tmo cmd left out=$log.case
    for c in "$@"; do
        name=${c%%|*}; c=${c#*|}; tmo=${c%%|*}; cmd=${c#*|}
        name=${name#*=}
        left=$((end - $(date +%s)))
        if [ "$left" -lt 3 ]; then
            say "SKIPPED: $stage/$name (budget)"
            fail=$((fail + 1))
            continue
        fi
        [ "$tmo" -le "$left" ] || tmo=$left
        echo "=== $stage/$name: $cmd" >>"$log"
        local t0=$(date +%s)
        run_case "$tmo" "$cmd" >"$out" 2>&1
        local rc=$?
        cat "$out" >>"$log"
        if [ $rc = 0 ]; then
            pass=$((pass + 1)); echo "    ok   $stage/$name ($(($(date +%s) - t0)) s)"
        elif [ $rc = 77 ]; then
            skip=$((skip + 1)); say "SKIPPED: $stage/$name ($(skip_reason "$out"))"
        else
            fail=$((fail + 1)); say "    FAIL $stage/$name (exit $rc, $(($(date +%s) - t0)) s)"
            echo "--- exit $rc" >>"$log"
        fi
    done
    rm -f "$out"
    total_pass=$((total_pass + pass)); total_fail=$((total_fail + fail))
    total_skip=$((total_skip + skip))
    say "$stage: $pass passed, $fail failed, $skip skipped"
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
        echo "nvidia nccl wheel: $(nccl_wheel_dir); cu13 runtime wheel: $(cudart_wheel_dir)"
    } >"$log" 2>&1
    if nvidia-smi -L >/dev/null 2>&1; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
    total_pass=$((total_pass + pass)); total_fail=$((total_fail + fail))
    say "preflight: $pass passed, $fail failed, 0 skipped ($(nvidia-smi -L 2>/dev/null | head -1))"
}

# has_kernels BUILD: whether the build's library holds nvcc's kernels (a -Dcuda=enabled build;
# one made without the toolkit has only the emulated GPU).
has_kernels() {
    LC_ALL=C grep -qa nv_fatbin "$1/libnccl.so.2"
}

stage_build() {
    local log=$1 end=$2 b local=$top/build-gpu-local
    : >"$log"
    # the carried build, or one this script made here before (a rerun on the same machine)
    for b in "$build" "$local"; do
        [ -e "$b/libnccl.so.2" ] || continue
        if ! "$b/tools/weft-info" >/dev/null 2>&1; then
            echo "$b does not run here" >>"$log"
        elif ! has_kernels "$b"; then
            echo "$b has no CUDA kernels (made without nvcc)" >>"$log"
        else
            echo "using the build $b" >>"$log"
            build=$b
            say "build: 1 passed, 0 failed, 0 skipped (using $build)"
            total_pass=$((total_pass + 1))
            return
        fi
    done
    # a fresh folder where the carried one is unusable (configured elsewhere, or without CUDA)
    [ ! -e "$build" ] || { build=$local; rm -rf "$build"; }
    echo "building $build" >>"$log"
    local left=$((end - $(date +%s)))
    if (cd "$top" && timeout "$left" meson setup "$build" -Dcuda=enabled -Dgpu_checks=true -Dbuildtype=release \
            >>"$log" 2>&1 && timeout "$((end - $(date +%s)))" ninja -C "$build" -j16 \
            >>"$log" 2>&1); then
        say "build: 1 passed, 0 failed, 0 skipped (built here)"
        total_pass=$((total_pass + 1))
    else
        tail -40 "$log" >"$log.tail"; mv "$log.tail" "$log"
        say "build: 0 passed, 1 failed, 0 skipped (see build.log)"
        total_fail=$((total_fail + 1))
    fi
}

# perf.csv: the rows of the perf tools' tables (stages perf, mplat and reg, all in perf.log) at
# 8 B, 1 MiB, 64 MiB and 1 GiB, one per case and size: the out-of-place columns. Rows that weftrun
# prefixed with "[rank] " count too.
perf_csv() {
    local log=$1 csv=$out/perf.csv
    echo "case,bytes,time_us,algbw_GBs,busbw_GBs" >"$csv"
    awk '/^=== [a-z]+\// { split($2, a, "/"); name = substr(a[2], 1, length(a[2]) - 1); next }
         { sub(/^\[[0-9]+\] +/, "") }
         $1 ~ /^[0-9]+$/ && ($1 == 8 || $1 == 1048576 || $1 == 67108864 || $1 == 1073741824) {
             printf "%s,%s,%s,%s,%s\n", name, $1, $6, $7, $8 }' "$log" >>"$csv"
}

# csv_get CASE BYTES COLUMN: one value of perf.csv (empty when the case has no such row).
csv_get() {
    awk -F, -v c="$1" -v b="$2" -v k="$3" '$1 == c && $2 == b { print $k; exit }' "$out/perf.csv"
}

# ratio A B: A / B to one decimal, or "?" when either is missing or B is 0.
ratio() {
    awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print "?";
                                     else printf "%.1f", a / b }'
}

# The mplat summary: 8 B all-reduce time of processes against threads, and whether it is over
# the 10x at which the issue wants a copy-engine path.
mplat_summary() {
    local n t p v r line="" worst=0
    for n in 2 4; do
        t=$(csv_get threads-$n 8 3)
        for p in cumem legacy; do
            v=$(csv_get procs-$n-$p 8 3)
            r=$(ratio "$v" "$t")
            line="$line; $n procs $p ${v:-?} us / $n threads ${t:-?} us = ${r}x"
            [ "$r" = "?" ] || worst=$(awk -v a="$r" -v w="$worst" 'BEGIN { print (a > w) ? a : w }')
        done
    done
    say "mplat: 8 B all-reduce, processes/threads on one GPU${line}"
    if awk -v w="$worst" 'BEGIN { exit !(w > 10) }'; then
        say "mplat: processes are over 10x threads (${worst}x): the copy-engine path is wanted"
    fi
}

# The reg summary: busbw registered against unregistered, per tool and size.
reg_summary() {
    local t b u g line=""
    for t in ar ag rs ar-host ag-host rs-host; do
        for b in 1048576 67108864; do
            u=$(csv_get $t-unreg $b 5); g=$(csv_get $t-reg $b 5)
            line="$line; $t $((b >> 20)) MiB ${u:-?} -> ${g:-?} GB/s ($(ratio "$g" "$u")x)"
        done
    done
    say "reg: busbw unregistered -> registered (-R 1)${line}"
}

# The torch summary: which library LD_PRELOAD and LD_LIBRARY_PATH gave torch (the library
# line of the weft-1proc-preload and weft-1proc-ldpath cases), and Weft against the wheel's NCCL
# (the TORCH time lines of torch_check.py).
torch_lib() {
    local w
    w=$(awk -v c="=== torch/$2:" 'index($0, c) == 1 { on = 1; next } /^=== / { on = 0 }
            on && /TORCH (ok|FAIL) library/ && match($0, /weft=(yes|no)/) {
                print substr($0, RSTART + 5, RLENGTH - 5) }' "$1" | tail -1)
    case "$w" in yes) echo "Weft" ;; no) echo "NVIDIA's" ;; *) echo "? (no library line)" ;; esac
}
torch_summary() {
    local log=$1 tw tn t2
    say "torch: LD_PRELOAD=build/libnccl.so.2 gives torch $(torch_lib "$log" weft-1proc-preload);" \
        "LD_LIBRARY_PATH=build gives torch $(torch_lib "$log" weft-1proc-ldpath)"
    tw=$(grep -ao 'lib=weft ranks=1 [^[:cntrl:]]*' "$log" | tail -1)
    tn=$(grep -ao 'lib=nvidia ranks=1 [^[:cntrl:]]*' "$log" | tail -1)
    t2=$(grep -ao 'lib=weft ranks=2 [^[:cntrl:]]*' "$log" | tail -1)
    say "torch: ${tw:-lib=weft ranks=1: no timing}; ${tn:-lib=nvidia ranks=1: no timing}"
    say "torch: ${t2:-lib=weft ranks=2: no timing}"
    # the first failed checks, named by case (torch.log has them all)
    awk '/^=== torch\// { split($2, a, "/"); c = substr(a[2], 1, length(a[2]) - 1); next }
         /TORCH FAIL/ && n++ < 6 { print "torch: " c ": " substr($0, index($0, "TORCH FAIL"), 200) }' \
        "$log" | while IFS= read -r line; do say "$line"; done
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
    for t in timeout awk python3 date tee bash; do
        if command -v "$t" >/dev/null; then pass=$((pass + 1)); else
            echo "FAIL: no $t"; fail=$((fail + 1)); fi
    done
    [ -e "$build/libnccl.so.2" ] || { echo "FAIL: no build at $build (meson setup $build)"; fail=$((fail + 1)); }
    if [ -e "$build/libnccl.so.2" ] && ! has_kernels "$build"; then
        echo "    note: $build has no CUDA kernels (no nvcc): carried to the GPU, it would be" \
             "rebuilt there (build stage); carry a -Dcuda=enabled build"
    fi
    local c cmd bin tmo rc tmp=/tmp/weft-gpu-dry.$$
    : >"$tmp.perf"
    # (python3 -m py_compile's check, without writing __pycache__ into the source tree)
    if python3 -c 'import sys; compile(open(sys.argv[1]).read(), sys.argv[1], "exec")' \
            "$here/torch_check.py" 2>"$tmp"; then
        pass=$((pass + 1)); echo "    ok   torch_check.py compiles"
    else
        fail=$((fail + 1)); echo "FAIL: torch_check.py does not compile:"; cat "$tmp"
    fi
    for c in "${unit_cases[@]}" "${kunit_cases[@]}" "${multirank_cases[@]}" "${perf_cases[@]}" \
             "${mplat_cases[@]}" "${reg_cases[@]}" "${torch_cases[@]}" "${sanitizer_cases[@]}"; do
        name=${c%%|*}; cmd=${c#*|}; tmo=${cmd%%|*}; cmd=${cmd#*|}
        # the binary a case runs: the first word that names a file of the build (the library
        # for the torch cases)
        bin=$(B=$build eval "echo $cmd" | tr ' =' '\n\n' | grep "^$build/" | head -1)
        if [ -z "$bin" ] || [ ! -e "$bin" ]; then
            echo "FAIL: ${name#*=}: $bin not built"; fail=$((fail + 1)); continue
        fi
        case "$name" in
        emu=*)
            if WEFT_CUDA=emu:1 run_case "$tmo" "$cmd" >"$tmp" 2>&1; then
                pass=$((pass + 1)); echo "    ok   ${name#emu=} on the emulated GPU"
            else
                fail=$((fail + 1)); echo "FAIL: ${name#emu=} on the emulated GPU:"; tail -5 "$tmp"
            fi
            # the perf tables, for the perf.csv check below
            case "$cmd" in
            *_perf*) { echo "=== dry/${name#emu=}: $cmd"; cat "$tmp"; } >>"$tmp.perf" ;;
            esac
            ;;
        py=*)
            # here (no GPU) the case must skip, or pass where torch has a GPU
            run_case "$tmo" "$cmd" >"$tmp" 2>&1
            rc=$?
            case $rc in
            0) pass=$((pass + 1)); echo "    ok   ${name#py=} ran" ;;
            77) pass=$((pass + 1))
                echo "    ok   ${name#py=} skips here ($(skip_reason "$tmp"))" ;;
            *) fail=$((fail + 1)); echo "FAIL: ${name#py=} exits $rc:"; tail -5 "$tmp" ;;
            esac ;;
        *)
            pass=$((pass + 1)); echo "    ok   $name: $bin exists"
            case "$cmd" in
            with_reg*)
                bin=$(B=$build eval "echo $cmd" | tr ' ' '\n' | grep '_perf$' | head -1)
                if has_reg "$bin"; then echo "         (it has -R)"; else
                    echo "         (no -R in this tree: the case will say SKIPPED)"; fi ;;
            esac ;;
        esac
    done
    # perf.csv from those tables: a row at 8 B for every mplat case, so its summary has numbers
    local keep=$out n
    out=$tmp.d
    mkdir -p "$out"
    perf_csv "$tmp.perf"
    for c in "${mplat_cases[@]}"; do
        n=${c%%|*}; n=${n#emu=}
        if [ -n "$(csv_get "$n" 8 3)" ]; then pass=$((pass + 1)); else
            fail=$((fail + 1)); echo "FAIL: perf.csv has no 8 B row for mplat/$n"; fi
    done
    echo "    ok   perf.csv rows: $(($(wc -l <"$out/perf.csv") - 1)) from the emulated perf cases"
    out=$keep
    rm -rf "$tmp" "$tmp.perf" "$tmp.d"
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
    case "$only" in "" | *,$name,*) ;; *) continue ;; esac
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
    mplat) run_cases mplat "$log" "$end" "${mplat_cases[@]}"; perf_csv "$log"; mplat_summary ;;
    reg) run_cases reg "$log" "$end" "${reg_cases[@]}"; perf_csv "$log"; reg_summary ;;
    torch) run_cases torch "$log" "$end" "${torch_cases[@]}"; torch_summary "$log" ;;
    sanitizer)
        if command -v compute-sanitizer >/dev/null; then
            run_cases sanitizer "$log" "$end" "${sanitizer_cases[@]}"
        else
            say "SKIPPED: sanitizer (no compute-sanitizer)"
        fi ;;
    esac
done
say "total: $total_pass passed, $total_fail failed, $total_skip skipped in $(elapsed) s"
[ "$total_fail" = 0 ]
