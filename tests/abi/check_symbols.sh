#!/bin/sh
# Compares the dynamic symbols of Weft's libnccl.so.2 with NVIDIA's.
#
#   check_symbols.sh WEFT_LIB [NVIDIA_LIB]
#
# Every nccl*/pnccl* symbol NVIDIA's library defines must be defined by ours with the same nm kind
# (W for the weak ncclX aliases, T for the strong pncclX definitions and for
# ncclResetDebugInitInternal). Ours must export nothing outside nccl*, pnccl* and weft[A-Z]*.
# Extra nccl* names are listed but allowed.
# NVIDIA_LIB defaults to the CUDA toolkit's (CUDA_HOME, then /usr/local/cuda). Exit 77 (skip)
# when it is absent, 1 on any mismatch, 0 otherwise.
set -u

if [ $# -lt 1 ]; then
    echo "usage: $0 WEFT_LIB [NVIDIA_LIB]" >&2
    exit 2
fi
weft_lib=$1
nv_lib=${2:-}
if [ -z "$nv_lib" ]; then
    for dir in "${CUDA_HOME:-}" /usr/local/cuda; do
        [ -n "$dir" ] || continue
        for sub in lib64 lib targets/x86_64-linux/lib; do
            if [ -e "$dir/$sub/libnccl.so.2" ]; then
                nv_lib=$dir/$sub/libnccl.so.2
                break 2
            fi
        done
    done
fi
if [ -z "$nv_lib" ] || [ ! -e "$nv_lib" ]; then
    echo "SKIP: NVIDIA's libnccl.so.2 not found (pass it as the second argument or set CUDA_HOME)"
    exit 77
fi
if [ ! -e "$weft_lib" ]; then
    echo "FAIL: $weft_lib does not exist"
    exit 1
fi
if ! command -v nm >/dev/null 2>&1; then
    echo "SKIP: nm not found"
    exit 77
fi

tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM

# "KIND NAME" lines of the defined dynamic symbols.
nm -D --defined-only "$nv_lib" | awk 'NF >= 3 { print $2, $3 }' | sort -k2 > "$tmp/nv" || exit 1
nm -D --defined-only "$weft_lib" | awk 'NF >= 3 { print $2, $3 }' | sort -k2 > "$tmp/weft" || exit 1

echo "NVIDIA: $nv_lib"
echo "Weft:   $weft_lib"

fail=0
nv_count=0
while read -r kind name; do
    case $name in
        nccl* | pnccl*) ;;
        *) continue ;;
    esac
    nv_count=$((nv_count + 1))
    ours=$(awk -v n="$name" '$2 == n { print $1; exit }' "$tmp/weft")
    if [ -z "$ours" ]; then
        echo "MISSING: $name ($kind in NVIDIA's library)"
        fail=1
    elif [ "$ours" != "$kind" ]; then
        echo "KIND: $name is $ours in ours, $kind in NVIDIA's"
        fail=1
    fi
done < "$tmp/nv"

while read -r kind name; do
    case $name in
        nccl* | pnccl*)
            if ! awk -v n="$name" '$2 == n { found = 1 } END { exit !found }' "$tmp/nv"; then
                echo "EXTRA: $name ($kind) is not in NVIDIA's library (allowed)"
            fi
            ;;
        weft[A-Z]*) ;;
        *)
            echo "UNEXPECTED EXPORT: $name ($kind): only nccl*, pnccl*, weft[A-Z]* may be exported"
            fail=1
            ;;
    esac
done < "$tmp/weft"

if [ "$nv_count" -eq 0 ]; then
    echo "FAIL: no nccl symbols read from $nv_lib"
    exit 1
fi
if [ "$fail" -ne 0 ]; then
    echo "FAIL: symbol check ($nv_count NVIDIA symbols compared)"
    exit 1
fi
echo "PASS: all $nv_count nccl*/pnccl* symbols of NVIDIA's library are defined with the same kind"
exit 0
