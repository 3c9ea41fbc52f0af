#!/usr/bin/env bash
# nvcc_spills.sh NVCC ARGS...: runs nvcc (with -Xptxas -v among ARGS) and fails the build when a
# kernel entry function spills registers to local memory, the signature of a kernel whose hot
# loop left its registers (the collective kernel once spilled 244 bytes under a 1024-thread launch
# bound). Spills inside called device functions (the schedule code thread 0 runs between steps,
# through the ABI's stack) are counted and printed, not fatal.
set -o pipefail
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$@" 2>&1 | tee "$log" >&2
rc=${PIPESTATUS[0]}
[ "$rc" = 0 ] || exit "$rc"
awk '
    /Compiling entry function/ { match($0, /\x27[^\x27]+\x27/); entry[substr($0, RSTART + 1, RLENGTH - 2)] = 1 }
    /Function properties for/ { fn = $NF }
    /bytes spill stores/ {
        stores = $5; loads = $9
        if (stores + 0 > 0 || loads + 0 > 0) {
            if (fn in entry) { printf "nvcc_spills: kernel %s spills %s bytes stored, %s loaded\n", fn, stores, loads; bad = 1 }
            else called++
        }
    }
    END {
        if (called) printf "nvcc_spills: %d called device functions use the stack for spills (not kernels)\n", called
        exit bad
    }' "$log" >&2
