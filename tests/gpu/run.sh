#!/usr/bin/env bash
# The GPU check: one command on a machine with one NVIDIA GPU (the device tool's H100 or H200),
# planned to fit twice, with a rerun, in the 15 minutes of device time a session gets.
#
#   tests/gpu/run.sh --make-carry BUILD     make the carried build (on the CPU machine)
#   tests/gpu/run.sh --dry-run              print and check the plan (on the CPU machine)
#   tests/gpu/run.sh --emu                  its cases' command lines on the emulated GPU (CPU)
#   tests/gpu/run.sh [--only STAGE,...]     the check itself (on the GPU machine)
#   options: --build DIR (the carried build, default build-gpu), --sanitizer, --baseline,
#            --more, --build-here (opt-in stages), --keep-going, -h/--help
#
# How to run it on a lent GPU:
#   1. Here, once (nvcc takes minutes; -Dgpu_checks=true adds the 8-bit-flag kernel of kunit's
#      wrap case, which is opt-in):
#          meson setup build -Dcuda=enabled && meson compile -C build
#   2. tests/gpu/run.sh --make-carry build
#      copies what the cases run, and nothing else, into build-gpu/ (ignored by git): the
#      library (libnccl.so.2) and the binaries the case table names ($B/...: the launcher
#      tests/gpu/weftrun, the perf tool, tests/gpu's checks, test_coll, test_coll_mp,
#      test_kern_unit), at the paths they have in the build (their RUNPATH finds the library),
#      with debug information stripped (strip --strip-debug), and a manifest CARRY (source
#      commit, nvcc). 51 MiB from a -Dcuda=enabled build (2026-12): the library and the three
#      statically linked tests of tests/gpu-emu hold the kernels' fat binary (sm_80, sm_90,
#      sm_100: 10 MB each); the rest link libnccl.so.2.
#   3. tests/gpu/run.sh --dry-run
#      ends with `plan: N s of device time, carry M MiB` (M: du of build-gpu/) and exits non-zero
#      if N > 420, M > 60, a case's timeout is over its stage's budget, or a binary is missing.
#   4. The device tool: run with carry ["build-gpu"], command
#          tests/gpu/run.sh
#      and timeout_s at least the plan's stage sum + 30 (the stage sum is the script's own
#      deadline). The results come back from $OUT. Then give the machine back unless a rerun
#      follows at once (its 30 s warm wait counts). A rerun of one stage: --only multirank. The
#      opt-in stages make a second run of their own, e.g. --sanitizer --baseline --only
#      sanitizer,baseline (230 s with the allowance: --dry-run with the same flags says).
#
# The build on the GPU machine is the carried one: preflight checks that it runs there and holds
# the CUDA kernels, and the run stops after preflight if it does not (no stage would pass). The
# kernels are never built on the GPU machine unless --build-here asks for it, and then only when
# the carried build does not load (minutes of nvcc: over the plan, by its budget below).
#
# Stages run in the order of the budget table below: what is most likely to fail, and says the
# most when it does, first. Each stage has a budget; every case of a stage has its own timeout,
# and the timeouts of a stage add up to no more than its budget, so no case is ever cut short by
# its stage (a cut case would count as a failure). A stage that would start with less time left
# than its budget says `SKIPPED: <stage> (budget)`. Every stage ends with an
# `N passed, N failed, N skipped` line; the last line adds them up. A case exits 0 (pass), 77
# (skipped; the reason is the last `SKIP` line it printed: no torch, no wheel NCCL) or anything
# else (fail). Every case runs with WEFT_TIMEOUT=10 (unless it sets its own) and NCCL_DEBUG=WARN,
# so a hang ends in the library's stuck record (who waits for whom) well inside the case timeout.
#
# Results (at most 8 files) under $OUT (the device tool's folder; ./gpu-out otherwise):
# summary.txt (every stage line), env.txt (preflight: driver, runtime, compute mode, MIG, the
# devices, the library's init lines), multirank.log (stages multirank and reg), torch.log,
# perf.log (perf and baseline), perf.csv (the perf tables' rows at 8 B, 16 B, 1 MiB, 64 MiB and
# 1 GiB), unit.log (kunit, sanitizer, more), build.log (--build-here only).
#
# --dry-run costs no device time (and a few seconds here): it prints the budget table and every
# case with its timeout, checks the bounds above, that each binary a case names is in the carried
# build, that torch_check.py compiles, and that the carried build plus the tracked tree fit the
# 64 MiB the device tool carries. --emu runs each case marked emu= on the emulated GPU
# (WEFT_CUDA=emu:1) with its very command line, and the torch cases, which must skip here (about
# a minute).
# shellcheck disable=SC2034 # the *_cases arrays are read by name: ${!ref}
set -u

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)

# ---- the budget table -------------------------------------------------------------------------
# Device time, in seconds. ALLOWANCE is the part of a lease outside this script: the machine's
# start (a minute or more), the working tree and the carried build going there (up to 64 MiB),
# the results coming back and the machine's close. The plan is ALLOWANCE plus the budgets of the
# stages a run selects; the default selection must stay within PLAN_MAX, and the carried build
# within CARRY_MAX MiB, so that a second run fits in the 15 minutes too.
ALLOWANCE=90
PLAN_MAX=420
CARRY_MAX=60
#   stage      budget  run      result file    what
TABLE=(
    "preflight  20      default  env.txt        driver, runtime, compute mode, MIG; build; probe"
    "multirank  130     default  multirank.log  threads and processes; a capture + watchdog"
    "reg        45      default  multirank.log  registered buffers: zero-copy, perf -R 1"
    "torch      55      default  torch.log      PyTorch's nccl backend on Weft, 2 processes"
    "perf       50      default  perf.log       copy rate; all_reduce_perf, 1 and 2 ranks"
    "kunit      30      default  unit.log       device reductions bit-equal to the host's"
    "sanitizer  60      opt-in   unit.log       --sanitizer: compute-sanitizer (10-100x slower)"
    "baseline   60      opt-in   perf.log       --baseline: NVIDIA's NCCL (the wheel) beside Weft"
    "more       120     opt-in   unit.log       --more: the other kernel and fault cases"
    "build-here 300     opt-in   build.log      --build-here: nvcc there if the carry fails"
)

# ---- the cases --------------------------------------------------------------------------------
# "name|timeout|command": $B is the carried build, $G this folder, $WANT the backend the probe
# wants (cuda; emu in --emu). A case passes when its command exits 0 (every binary checks its
# results element by element). Marks before the name: emu= the case also runs on the emulated GPU
# in --emu; py= a torch case (in --emu it must exit 0 or 77 here). Names are unique within a
# stage. A stage's timeouts add up to its budget at most.
T=\$B/tests/gpu-emu/test_coll
M=\$B/tests/gpu-emu/test_coll_mp
K=\$B/tests/gpu-emu/test_kern_unit
C=\$B/tests/gpu/gpu_check
R="\$B/tests/gpu/weftrun -n 2 --timeout \${WR_TIMEOUT:-14}"
P=\$B/perf/all_reduce_perf
preflight_cases=(
    "facts|8|preflight_facts"
    "build|4|build_loads"
    "emu=probe|8|env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV $C probe --want \$WANT"
)
# Issue 29's findings first: the capture with a watchdog polling (item 1; not emu=: until item 1
# is fixed the emulated GPU invalidates that capture now and then, in the moments its internal
# stream is joined to it), first launches of kernels while another rank's kernel spins, lazily
# and eagerly loaded (item 2), four ranks' own streams on one hardware queue, in one group and
# from a thread each with operations issued back to back (item 3), legacy IPC
# teardown between processes (item 5).
multirank_cases=(
    "graph-watchdog|15|$C graph-watchdog -n 2"
    "emu=initrank-4|15|$T initrank -n 4 -d 1"
    "emu=initrank-4-eager|15|env CUDA_MODULE_LOADING=EAGER $T initrank -n 4 -d 1"
    "emu=threads-4|15|$T sweep -n 4 -d 1 -q"
    "emu=threads-4-1queue|15|env CUDA_DEVICE_MAX_CONNECTIONS=1 $T sweep -n 4 -d 1 -q"
    "emu=queues-4-1queue|10|env CUDA_DEVICE_MAX_CONNECTIONS=1 WEFT_TIMEOUT=5 $T queues -n 4 -d 1"
    "emu=one-stream-4|15|$T sweep -n 4 -d 1 -s -q"
    "emu=procs-2-cumem|15|$R $M sweep -q"
    "emu=procs-2-legacy|15|env NCCL_CUMEM_ENABLE=0 $R $M sweep -q"
)
reg_cases=(
    "emu=zcopy-threads-2|15|env WEFT_ZCOPY_MIN_BYTES=1024 $T zcopy -n 2 -d 1"
    "emu=zcopy-procs-2|15|env WEFT_ZCOPY_MIN_BYTES=1024 $R $M zcopy"
    "ar-reg-2|15|$P -g 2 -b 1M -e 64M -f 64 -n 20 -w 3 -c 1 -R 1"
)
# PyTorch on Weft (tests/gpu/torch_check.py: exit 77 where torch or its CUDA is absent): two
# processes on the one GPU through LD_PRELOAD; its library check fails if torch ends up on
# NVIDIA's NCCL. (One process, and NVIDIA's NCCL as the baseline: --baseline.)
TC="python3 \$G/torch_check.py --lib \$B/libnccl.so.2"
PRE="env LD_PRELOAD=\$B/libnccl.so.2"
torch_cases=(
    "py=weft-2proc|55|$PRE $TC --nproc 2 --timeout 50 --expect weft --timing"
)
perf_cases=(
    "copy-rate|5|\$B/tests/gpu/copy_rate"
    "weft-1rank|15|$P -b 16 -e 1G -f 4 -g 1 -c 0"
    "weft-2ranks|15|$P -b 16 -e 1G -f 4 -g 2 -c 0"
    "emu=weft-2procs|15|$R $P -b 16 -e 64M -f 4 -c 1"
)
kunit_cases=(
    "emu=redop-ll|15|env NCCL_PROTO=LL $K redop"
    "emu=redop-simple|15|env NCCL_PROTO=Simple $K redop"
)
CS="compute-sanitizer --error-exitcode 1 --tool"
sanitizer_cases=(
    "memcheck|30|$CS memcheck $T sweep -n 1 -d 1 -q"
    "racecheck-ll|15|env NCCL_PROTO=LL $CS racecheck $K loopback -s"
    "synccheck-simple|15|env NCCL_PROTO=Simple $CS synccheck $K loopback -s"
)
baseline_cases=(
    "nvidia-1rank|15|nccl_wheel $P -b 16 -e 1G -f 4 -g 1 -c 0"
    "py=nvidia-1proc|30|$TC --expect nvidia --timing"
    "py=weft-ldpath|15|env LD_LIBRARY_PATH=\$B\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} $TC --probe"
)
more_cases=(
    "emu=loopback-ll|15|env NCCL_PROTO=LL $K loopback -f"
    "emu=loopback-simple|15|env NCCL_PROTO=Simple $K loopback -f"
    "emu=ll-wrap|15|env NCCL_PROTO=LL $K wrap"
    "emu=abort|15|env WEFT_CUDA_ORDER=0 $T abort -n 2 -d 1"
    "emu=deadline|15|env WEFT_CUDA_ORDER=0 WEFT_TIMEOUT=2 $T timeout -n 2 -d 1"
    "emu=mismatch|15|$T mismatch -n 2 -d 1"
    "emu=graph-replay|15|$T graph -n 2 -d 1"
    "emu=multicomm|15|$T multicomm -n 3 -d 1"
)
build_here_cases=()

# ---- options ----------------------------------------------------------------------------------
dry=0
emu=0
build=""
only=""
make_carry=""
keep_going=0
optin=","
while [ $# -gt 0 ]; do
    case "$1" in
    --dry-run) dry=1 ;;
    --emu) emu=1 ;;
    --build) build=$2; shift ;;
    --only) only=,$2,; shift ;;
    --make-carry) make_carry=$2; shift ;;
    --keep-going) keep_going=1 ;;
    --sanitizer | --baseline | --more | --build-here) optin="$optin${1#--},"; ;;
    -h | --help) awk 'NR > 1 && /^set -u/ { exit } NR > 1 && !/^# shellcheck/ { sub(/^# ?/, "")
                                                                              print }' "$0"
                 exit 0 ;;
    *) echo "run.sh: unknown argument $1 (--help)"; exit 2 ;;
    esac
    shift
done
[ -n "$build" ] || build="build-gpu"
case "$build" in /*) ;; *) build=$top/$build ;; esac

# The table, parsed once: STAGES in order; BUDGET, RUN, FILE and WHAT by stage name.
declare -A BUDGET RUN FILE WHAT
STAGES=()
for row in "${TABLE[@]}"; do
    read -r name budget run file what <<<"$row"
    STAGES+=("$name")
    BUDGET[$name]=$budget RUN[$name]=$run FILE[$name]=$file WHAT[$name]=$what
done
# SEL: the stages a run selects, in table order: the default ones and the opt-in ones asked for,
# narrowed by --only (preflight always runs: the later stages need its verdict on the build).
SEL=()
for name in "${STAGES[@]}"; do
    [ "${RUN[$name]}" = default ] || case "$optin" in *,$name,*) ;; *) continue ;; esac
    case "$only" in "" | *,$name,*) ;; *) [ "$name" = preflight ] || continue ;; esac
    SEL+=("$name")
done
# case_bins CMD: BINS, the build-relative paths of the build files ($B/...) a case's command
# names, also as the value of an assignment (LD_PRELOAD=$B/libnccl.so.2).
case_bins() {
    local w
    BINS=()
    set -f
    for w in $1; do
        w=${w#*=}
        [[ "$w" == '$B/'* ]] && BINS+=("${w#\$B/}")
    done
    set +f
}

# ---- helpers a case may name (exported: each case runs as bash -c CMD under timeout) ----------
# The facts of issue 29 item 7, from nvidia-smi: devices, driver, the CUDA version the driver
# supports, compute mode, MIG; and the CUDA runtime the carried build links statically (its
# manifest). Fails without a GPU or with a driver older than that runtime needs (580 for CUDA 13,
# 525 for 12); says what an exclusive compute mode or MIG will break.
preflight_facts() {
    local q n drv mode mig rt need=525
    echo "date: $(date -u)"; echo "kernel: $(uname -r)"; ldd --version 2>&1 | head -1
    echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}" \
         "CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS-unset}" \
         "CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING-unset}"
    [ -r "$B/CARRY" ] && sed 's/^/carried build: /' "$B/CARRY"
    command -v nvidia-smi >/dev/null ||
        { echo "FACTS no nvidia-smi: no NVIDIA driver here"; return 1; }
    local fields=index,name,pci.bus_id,uuid,driver_version,compute_mode,mig.mode.current
    fields=$fields,memory.total,memory.used
    q=$(nvidia-smi --query-gpu=$fields --format=csv,noheader 2>&1)
    echo "$fields"
    echo "$q"
    n=$(echo "$q" | grep -c 'GPU-')
    drv=$(echo "$q" | head -1 | awk -F', ' '{ print $5 }')
    mode=$(echo "$q" | head -1 | awk -F', ' '{ print $6 }')
    mig=$(echo "$q" | head -1 | awk -F', ' '{ print $7 }')
    rt=$(sed -n 's/.*release \([0-9.]*\),.*/\1/p' "$B/CARRY" 2>/dev/null)
    [ "${rt%%.*}" -lt 13 ] 2>/dev/null || need=580
    echo "FACTS $n device(s): $(echo "$q" | head -1 | awk -F', ' '{ print $2 }'), driver $drv" \
         "($(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | head -1)), compute mode" \
         "$mode, MIG $mig; the build's static runtime: CUDA ${rt:-?}"
    echo "compute-sanitizer: $(command -v compute-sanitizer || echo none)"
    [ "$n" -ge 1 ] || { echo "FACTS no GPU listed"; return 1; }
    case "$mode" in Default) ;; *)
        echo "FACTS WARN compute mode $mode: ranks as processes cannot share the GPU" ;;
    esac
    case "$mig" in Enabled) echo "FACTS WARN MIG enabled: each process sees one MIG slice" ;; esac
    if [ "${drv%%.*}" -lt "$need" ] 2>/dev/null; then
        echo "FACTS driver $drv is older than $need, which the static CUDA ${rt:-13} runtime needs"
        return 1
    fi
}
# The carried build runs here and holds the CUDA kernels.
build_loads() {
    "$B/tests/gpu/gpu_check" version || { echo "FACTS $B does not run here (libc? see above)"
                                          return 1; }
    has_kernels "$B" || { echo "FACTS $B/libnccl.so.2 has no CUDA kernels (built without nvcc)"
                          return 1; }
    echo "FACTS build $B runs here and holds the CUDA kernels"
}
# has_kernels BUILD: whether the build's library holds nvcc's kernels (a -Dcuda=enabled build).
has_kernels() {
    LC_ALL=C grep -qa nv_fatbin "$1/libnccl.so.2"
}
# NVIDIA's libnccl.so.2 from the image's nvidia-nccl-cu13 wheel first on the library path, and
# the wheel's CUDA runtime (the perf tools dlopen one) after it; exit 77 without the wheel.
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
export -f preflight_facts build_loads has_kernels nccl_wheel_dir cudart_wheel_dir nccl_wheel

# run_case TIMEOUT CMD: one case's command line under timeout (B: the build, G: this folder),
# killed by TIMEOUT at the latest: SIGTERM a second before (its exit status is then 124),
# SIGKILL at TIMEOUT (137) if it is still there. (A hang meets WEFT_TIMEOUT=10 first: 15 s cases.)
run_case() {
    B=$build G=$here WANT=${WANT_BACKEND:-cuda} timeout -k 1 "$(($1 - 1))" bash -c "$2"
}

# skip_reason FILE: the last SKIP line a case printed (its reason for exit 77).
skip_reason() {
    grep -ao 'SKIP[^[:cntrl:]]*' "$1" | tail -1 | sed 's/^SKIP[A-Z]*:* *//' | cut -c1-160
}

say() { echo "$*" | tee -a "$summary"; }

# run_cases STAGE LOG BUDGET_END CASE...: each case with its timeout (less if the stage's time is
# short, which the table's check in --dry-run rules out). Sets stage_failed to the failures.
run_cases() {
    local stage=$1 log=$2 end=$3
    shift 3
    local pass=0 fail=0 skip=0 c name tmo cmd left caseout=$log.case t0 rc
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
        t0=$(date +%s)
        run_case "$tmo" "$cmd" >"$caseout" 2>&1
        rc=$?
        cat "$caseout" >>"$log"
        grep -a '^FACTS\|^probe:\|graph-watchdog:' "$caseout" | sed "s|^|$stage/$name: |" \
            >>"$summary"
        if [ $rc = 0 ]; then
            pass=$((pass + 1)); echo "    ok   $stage/$name ($(($(date +%s) - t0)) s)"
        elif [ $rc = 77 ]; then
            skip=$((skip + 1)); say "SKIPPED: $stage/$name ($(skip_reason "$caseout"))"
        else
            fail=$((fail + 1))
            [ $rc = 124 ] || [ $rc = 137 ] && rc="$rc, its timeout of $tmo s"
            say "    FAIL $stage/$name (exit $rc, $(($(date +%s) - t0)) s)"
            echo "--- exit $rc" >>"$log"
        fi
    done
    rm -f "$caseout"
    total_pass=$((total_pass + pass)); total_fail=$((total_fail + fail))
    total_skip=$((total_skip + skip))
    stage_failed=$fail
    say "$stage: $pass passed, $fail failed, $skip skipped"
}

# ---- perf.csv and the summaries of the perf numbers -------------------------------------------
# perf.csv: the rows of the perf tables in perf.log and multirank.log (reg's ar-reg-2) at 8 B,
# 16 B, 1 MiB, 64 MiB and 1 GiB, one per case and size (rank 0's where weftrun prefixed rows
# with "[rank] "): the out-of-place columns.
perf_csv() {
    local csv=$out/perf.csv log
    echo "case,bytes,time_us,algbw_GBs,busbw_GBs" >"$csv"
    for log in "$out/perf.log" "$out/multirank.log"; do
        [ -e "$log" ] || continue
    awk '/^=== [a-z-]+\// { split($2, a, "/"); name = substr(a[2], 1, length(a[2]) - 1); next }
         { sub(/^\[[0-9]+\] +/, "") }
         $1 ~ /^[0-9]+$/ && ($1 == 8 || $1 == 16 || $1 == 1048576 || $1 == 67108864 ||
                             $1 == 1073741824) && !seen[name "," $1]++ {
             printf "%s,%s,%s,%s,%s\n", name, $1, $6, $7, $8 }' "$log" >>"$csv"
    done
}
# csv_get CASE BYTES COLUMN: one value of perf.csv (empty when the case has no such row).
csv_get() {
    awk -F, -v c="$1" -v b="$2" -v k="$3" '$1 == c && $2 == b { print $k; exit }' "$out/perf.csv"
}
# ratio A B: A / B to two decimals, or "?" when either is missing or B is 0.
ratio() {
    awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print "?";
                                     else printf "%.2f", a / b }'
}
perf_summary() {
    local c
    say "perf: copy $(grep -ao 'copy_rate: [^[:cntrl:]]*' "$out/perf.log" | tail -1 | cut -c12-)"
    for c in weft-1rank weft-2ranks weft-2procs nvidia-1rank; do
        [ -n "$(csv_get $c 16 3)" ] || continue
        say "perf: $c 16 B $(csv_get $c 16 3) us, 1 MiB $(csv_get $c 1048576 5) GB/s," \
            "64 MiB $(csv_get $c 67108864 5) GB/s, 1 GiB $(csv_get $c 1073741824 5) GB/s busbw"
    done
    say "perf: 2 processes / 2 threads at 16 B: $(ratio "$(csv_get weft-2procs 16 3)" \
        "$(csv_get weft-2ranks 16 3)")x the time; registered / unregistered busbw (2 ranks):" \
        "1 MiB $(ratio "$(csv_get ar-reg-2 1048576 5)" "$(csv_get weft-2ranks 1048576 5)")x," \
        "64 MiB $(ratio "$(csv_get ar-reg-2 67108864 5)" "$(csv_get weft-2ranks 67108864 5)")x"
}
# The torch summary: its timing lines and its first failed checks (torch.log has them all).
torch_summary() {
    local log=$1
    grep -ao 'TORCH time [^[:cntrl:]]*' "$log" | head -3 |
        while IFS= read -r l; do say "torch: $l"; done
    awk '/^=== [a-z]+\// { split($2, a, "/"); c = substr(a[2], 1, length(a[2]) - 1); next }
         /TORCH FAIL/ && n++ < 6 {
             print "torch: " c ": " substr($0, index($0, "TORCH FAIL"), 200) }' "$log" |
        while IFS= read -r line; do say "$line"; done
}

# ---- --make-carry -----------------------------------------------------------------------------
# carry_files: the build-relative paths the cases of every stage name ($B/...), and the library.
carry_files() {
    local c s ref f
    declare -A seen=([libnccl.so.2]=1 [tests/gpu/gpu_check]=1)
    for s in "${STAGES[@]}"; do
        ref="${s//-/_}_cases[@]"
        for c in "${!ref}"; do
            case_bins "${c#*|*|}"
            for f in "${BINS[@]}"; do seen[$f]=1; done
        done
    done
    printf '%s\n' "${!seen[@]}" | sort
}

do_make_carry() {
    local src=$1 f n=0 missing=0
    case "$src" in /*) ;; *) src=$PWD/$src ;; esac
    [ -e "$src/libnccl.so.2" ] ||
        { echo "run.sh: no build at $src (meson setup $src -Dcuda=enabled)"; exit 1; }
    [ "$(cd "$src" && pwd)" != "$(mkdir -p "$build" && cd "$build" && pwd)" ] ||
        { echo "run.sh: --make-carry needs a build other than $build"; exit 2; }
    # files of an earlier carry that no case names any more go; a file is copied again only when
    # the build's is newer (a second --make-carry after a rebuild of one test is quick)
    local keep
    keep=$(carry_files)
    mkdir -p "$build"
    (cd "$build" && find . -type f ! -name CARRY | sed 's|^\./||') | while read -r f; do
        echo "$keep" | grep -qxF "$f" || rm -f "$build/$f"
    done
    for f in $keep; do
        if [ ! -e "$src/$f" ]; then
            echo "    missing: $f (its cases will fail; -Dtests=true?)"; missing=$((missing + 1))
            continue
        fi
        n=$((n + 1))
        [ "$src/$f" -nt "$build/$f" ] || continue
        mkdir -p "$build/$(dirname "$f")"
        cp -L "$src/$f" "$build/$f"
        chmod u+w "$build/$f"
        strip --strip-debug "$build/$f" 2>/dev/null || true
    done
    {
        echo "from $src, source $(git -C "$top" rev-parse --short HEAD 2>/dev/null)$(
            git -C "$top" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')," \
             "made $(date -u +%Y-%m-%dT%H:%MZ)"
        "${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}" --version 2>/dev/null |
            tail -2 | head -1
    } >"$build/CARRY"
    has_kernels "$build" ||
        echo "    warning: $build/libnccl.so.2 has no CUDA kernels: set up $src with -Dcuda=enabled"
    echo "carry: $n files, $(carry_mib "$build") MiB in $build ($missing missing)"
    du -sk "$build"/* "$build"/*/* 2>/dev/null | sort -rn | head -12 |
        awk '{ printf "    %6.1f MiB  %s\n", $1 / 1024, $2 }'
    [ "$missing" = 0 ]
}

# carry_mib DIR: du of the folder, in MiB, rounded up.
carry_mib() {
    du -sk "$1" | awk '{ print int(($1 + 1023) / 1024) }'
}

# ---- --dry-run --------------------------------------------------------------------------------
dry_run() {
    local fail=0 plan=$ALLOWANCE s budget file what ref c name tmo cmd sum bin rc nfiles mib tree
    local tmp=/tmp/weft-gpu-dry.$$
    printf '%-11s %6s  %-8s %-14s %s\n' stage budget run file what
    for s in "${STAGES[@]}"; do
        printf '%-11s %5s s  %-8s %-14s %s\n' "$s" "${BUDGET[$s]}" "${RUN[$s]}" "${FILE[$s]}" \
            "${WHAT[$s]}"
    done
    echo
    for s in "${SEL[@]}"; do
        budget=${BUDGET[$s]}
        plan=$((plan + budget))
        ref="${s//-/_}_cases[@]"
        sum=0
        echo "--- $s: budget $budget s"
        for c in "${!ref}"; do
            name=${c%%|*}; cmd=${c#*|}; tmo=${cmd%%|*}; cmd=${cmd#*|}
            sum=$((sum + tmo))
            printf '    %-20s %3s s  %s\n' "${name#*=}" "$tmo" "$cmd"
            if [ "$tmo" -gt "$budget" ]; then
                echo "FAIL: $s/${name#*=}: timeout $tmo s over the stage's budget of $budget s"
                fail=$((fail + 1))
            fi
            # the binaries of the carried build it names
            case_bins "$cmd"
            for bin in "${BINS[@]}"; do
                [ -e "$build/$bin" ] || { echo "FAIL: $s/${name#*=}: $build/$bin not in the" \
                                               "carried build"; fail=$((fail + 1)); }
            done
        done
        if [ "$sum" -gt "$budget" ]; then
            echo "FAIL: $s: its cases' timeouts add up to $sum s, over its budget of $budget s"
            fail=$((fail + 1))
        fi
    done
    rm -f "$tmp"
    if ! python3 -c 'import sys; compile(open(sys.argv[1]).read(), sys.argv[1], "exec")' \
            "$here/torch_check.py"; then
        echo "FAIL: torch_check.py does not compile"; fail=$((fail + 1))
    fi
    for t in timeout awk python3 tee bash; do
        command -v "$t" >/dev/null || { echo "FAIL: no $t"; fail=$((fail + 1)); }
    done
    nfiles=$(( $(printf '%s\n' "${FILE[@]}" | sort -u | wc -l) + 2 ))
    [ "$nfiles" -le 8 ] || { echo "FAIL: $nfiles result files, over 8"; fail=$((fail + 1)); }
    mib=0
    if [ ! -e "$build/libnccl.so.2" ]; then
        echo "FAIL: no carried build at $build (tests/gpu/run.sh --make-carry BUILD)"
        fail=$((fail + 1))
    else
        mib=$(carry_mib "$build")
        has_kernels "$build" || { echo "FAIL: $build/libnccl.so.2 has no CUDA kernels" \
                                       "(make it from a -Dcuda=enabled build)"
                                  fail=$((fail + 1)); }
        [ -r "$build/CARRY" ] && sed 's/^/carried build: /' "$build/CARRY"
        # what the device tool sends with it: the tracked tree (untracked files too, if any)
        tree=$(git -C "$top" ls-files -z 2>/dev/null | (cd "$top" && xargs -0 du -cb 2>/dev/null) |
               awk 'END { print int(($1 + 1048575) / 1048576) }')
        echo "carried build: $build, $mib MiB (du); with the tracked tree (${tree:-?} MiB)" \
             "$((mib + ${tree:-0})) MiB of the device tool's 64"
        [ $((mib + ${tree:-0})) -le 64 ] ||
            { echo "FAIL: the carried build and the tree are over 64 MiB"; fail=$((fail + 1)); }
    fi
    echo "allowance: $ALLOWANCE s (machine start, transfers, close); the script's own deadline:" \
         "$((plan - ALLOWANCE)) s (the device tool's timeout_s: at least" \
         "$((plan - ALLOWANCE + 30)))"
    [ "$plan" -le "$PLAN_MAX" ] ||
        { echo "FAIL: the plan is $plan s, over $PLAN_MAX s"; fail=$((fail + 1)); }
    [ "$mib" -le "$CARRY_MAX" ] || { echo "FAIL: the carried build is $mib MiB, over $CARRY_MAX MiB"
                                    fail=$((fail + 1)); }
    echo "dry-run: $fail failed"
    echo "plan: $plan s of device time, carry $mib MiB"
    [ "$fail" = 0 ]
}

# ---- --emu ------------------------------------------------------------------------------------
# The cases marked emu= of every stage, opt-in ones too, with their command lines, on one emulated
# GPU (WEFT_CUDA=emu:1; the probe wants the backend "emu"), one at a time, each with EMU_SLOW
# times its timeout: the emulated GPU runs kernels on this machine's cores. And the torch cases
# (py=): here, without a CUDA torch, each must exit 77 (skipped) or 0.
EMU_SLOW=4
emu_run() {
    local fail=0 pass=0 row s ref c name tmo cmd t0 rc tmp=/tmp/weft-gpu-emu.$$
    for s in "${STAGES[@]}"; do
        ref="${s//-/_}_cases[@]"
        for c in "${!ref}"; do
            name=${c%%|*}; cmd=${c#*|}; tmo=${cmd%%|*}; cmd=${cmd#*|}
            t0=$(date +%s)
            case "$name" in
            emu=*) ;;
            py=*)
                # no CUDA torch here: the case must skip (77), or pass
                run_case "$tmo" "$cmd" >"$tmp" 2>&1
                rc=$?
                case $rc in
                0 | 77) pass=$((pass + 1)); echo "    ok   $s/${name#py=} exits $rc here" ;;
                *) echo "FAIL: $s/${name#py=} exits $rc here:"; tail -5 "$tmp"
                   fail=$((fail + 1)) ;;
                esac
                continue ;;
            *) continue ;;
            esac
            if WEFT_CUDA=emu:1 WANT_BACKEND=emu WR_TIMEOUT=$((14 * EMU_SLOW)) \
                    run_case $((tmo * EMU_SLOW)) "$cmd" >"$tmp" 2>&1; then
                pass=$((pass + 1))
                echo "    ok   $s/${name#emu=} on the emulated GPU ($(($(date +%s) - t0)) s)"
            else
                fail=$((fail + 1))
                echo "FAIL: $s/${name#emu=} on the emulated GPU ($(($(date +%s) - t0)) s): $cmd"
                tail -8 "$tmp"
            fi
        done
    done
    rm -f "$tmp"
    echo "emu: $pass passed, $fail failed"
    [ "$fail" = 0 ] && [ "$pass" -gt 0 ]
}

if [ -n "$make_carry" ]; then
    do_make_carry "$make_carry"
    exit $?
fi
if [ "$dry" = 1 ]; then
    dry_run
    exit $?
fi
if [ "$emu" = 1 ]; then
    emu_run
    exit $?
fi

# ---- the run ----------------------------------------------------------------------------------
out=${OUT:-$top/gpu-out}
mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"
export WEFT_TIMEOUT=${WEFT_TIMEOUT:-10} NCCL_DEBUG=${NCCL_DEBUG:-WARN}
deadline=0
for s in "${SEL[@]}"; do deadline=$((deadline + ${BUDGET[$s]})); done
start=$(date +%s)
total_pass=0 total_fail=0 total_skip=0 stage_failed=0
started="" # result files begun by this run (stages may share one)
say "GPU check: stages ${SEL[*]} ($deadline s), build $build," \
    "WEFT_TIMEOUT=$WEFT_TIMEOUT"
for s in "${SEL[@]}"; do
    budget=${BUDGET[$s]}
    file=${FILE[$s]}
    now=$(($(date +%s) - start))
    if [ $((now + budget)) -gt "$deadline" ]; then
        say "SKIPPED: $s (budget)"
        continue
    fi
    log=$out/$file
    case " $started " in *" $file "*) ;; *) : >"$log"; started="$started $file" ;; esac
    echo "--- stage $s (budget $budget s, at $now s)"
    end=$(($(date +%s) + budget))
    case "$s" in
    preflight)
        run_cases preflight "$log" "$end" "${preflight_cases[@]}"
        if [ "$stage_failed" != 0 ] && [ "$keep_going" = 0 ]; then
            if grep -q '^FACTS .*\(does not run here\|no CUDA kernels\)' "$log" &&
                    case "$optin" in *,build-here,*) true ;; *) false ;; esac; then
                say "preflight: the carried build is unusable here: --build-here builds one"
            else
                say "preflight failed: the later stages would only fail; stopping (--keep-going" \
                    "runs them anyway; --build-here builds here when the carried build does not" \
                    "load)"
                break
            fi
        fi ;;
    build-here)
        if B=$build build_loads >/dev/null 2>&1; then
            say "build-here: 0 passed, 0 failed, 1 skipped (the carried build loads: not rebuilt)"
            total_skip=$((total_skip + 1))
            continue
        fi
        local_build=$top/build-gpu-local
        if (cd "$top" && timeout "$((end - $(date +%s)))" meson setup --wipe "$local_build" \
                -Dcuda=enabled -Dgpu_checks=true -Dbuildtype=release >"$log" 2>&1 &&
                timeout "$((end - $(date +%s)))" ninja -C "$local_build" -j16 >>"$log" 2>&1); then
            build=$local_build
            say "build-here: 1 passed, 0 failed, 0 skipped (built $build)"
            total_pass=$((total_pass + 1))
        else
            tail -40 "$log" >"$log.tail"; mv "$log.tail" "$log"
            say "build-here: 0 passed, 1 failed, 0 skipped (see build.log)"
            total_fail=$((total_fail + 1))
        fi ;;
    sanitizer)
        if command -v compute-sanitizer >/dev/null; then
            run_cases sanitizer "$log" "$end" "${sanitizer_cases[@]}"
        else
            say "SKIPPED: sanitizer (no compute-sanitizer)"
        fi ;;
    *)
        ref="${s//-/_}_cases[@]"
        run_cases "$s" "$log" "$end" "${!ref}" ;;
    esac
    case "$s" in
    perf | baseline) perf_csv; perf_summary ;;
    torch) torch_summary "$log" ;;
    esac
done
say "total: $total_pass passed, $total_fail failed, $total_skip skipped in" \
    "$(($(date +%s) - start)) s"
[ "$total_fail" = 0 ]
