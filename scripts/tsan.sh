#!/usr/bin/env bash
# ThreadSanitizer pass over the emulated GPU and the CUDA executor, ranks as threads of one
# process: TSan sees the protocol's races only there (a second mapping of a memfd or another
# process hides them; shared/reference/gpu-testing.md). A reduced pass sized for CI: it builds
# only the two test programs in build-tsan (-Db_sanitize=thread) and runs the cases below; any
# race report fails the case (TSan exits 66). Part of scripts/test.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
dir=${TSAN_BUILD:-build-tsan}
[ -d "$dir" ] || meson setup "$dir" -Db_sanitize=thread -Dbuildtype=debugoptimized -Dcuda=disabled >/dev/null ||
    { echo "tsan: meson setup failed"; exit 1; }
meson compile -C "$dir" tests/gpu-emu/test_coll tests/gpu-emu/test_emu tests/gpu-emu/test_kern_unit \
    >/dev/null ||
    { echo "tsan: build failed"; exit 1; }
# DEVICES|program arguments
# "devices|[VAR=value ...] program args": the emulated devices, then the case's command line.
cases=(
    "1|test_coll sweep -n 2 -d 1 -q"
    "2|test_coll sweep -n 3 -d 2 -q"
    "2|test_coll sweep -n 4 -d 2 -s -q"
    "2|test_coll graph -n 2 -d 2"
    "1|WEFT_CUDA_ORDER=0 test_coll abort -n 2 -d 1"
    "1|CUDA_DEVICE_MAX_CONNECTIONS=1 WEFT_TIMEOUT=20 test_coll queues -n 2 -d 1"
    "2|CUDA_DEVICE_MAX_CONNECTIONS=1 WEFT_TIMEOUT=20 test_coll queues -n 4 -d 2"
    "2|test_coll multicomm -n 3 -d 2"
    "2|test_coll initrank -n 4 -d 2"
    "2|test_coll initrank -n 3 -d 2 -b"
    "2|test_coll biggroup -n 3 -d 2"
    "1|test_kern_unit loopback -s"
    "1|test_kern_unit wrap"
    "2|test_emu ranks"
    "2|test_emu capture"
    "2|test_emu events"
)
pass=0 fail=0
for c in "${cases[@]}"; do
    ndev=${c%%|*}; cmd=${c#*|}
    vars=()
    while [[ $cmd == [A-Z_]*=* ]]; do vars+=("${cmd%% *}"); cmd=${cmd#* }; done
    log=$(mktemp)
    if WEFT_CUDA=emu:$ndev TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
        timeout 300 env "${vars[@]}" "$dir/tests/gpu-emu/"$cmd >"$log" 2>&1; then
        pass=$((pass + 1)); echo "tsan ok   $cmd (emu:$ndev)"
    else
        fail=$((fail + 1)); echo "tsan FAIL $cmd (emu:$ndev):"; grep -A20 -m1 "WARNING: ThreadSanitizer" "$log" || tail -20 "$log"
    fi
    rm -f "$log"
done
echo "tsan: $pass passed, $fail failed"
[ "$fail" = 0 ]
