#!/bin/sh
# check_ptx.sh NVCC SRC INCDIR OUT.ptx: compiles SRC (kernels/dialect.h's primitives) to PTX for
# sm_90 and checks that each promised instruction is there. Exit 0 pass, 1 fail.
set -u
nvcc=$1 src=$2 inc=$3 out=$4
"$nvcc" -std=c++17 -arch=sm_90 -ptx -I"$inc" "$src" -o "$out" || exit 1
fail=0
for insn in 'ld.acquire.gpu.u64' 'ld.acquire.sys.u64' 'ld.relaxed.gpu.u64' 'ld.relaxed.sys.u64' \
            'st.release.gpu.u64' 'st.release.sys.u64' 'st.relaxed.gpu.u64' 'st.relaxed.sys.u64' \
            'ld.acquire.gpu.u32' 'ld.acquire.sys.u32' 'ld.relaxed.sys.u32' 'st.release.sys.u32' \
            'st.relaxed.gpu.u32' 'fence.acq_rel.gpu' 'fence.acq_rel.sys' 'ld.v2.u64' \
            'ld.volatile.v2.u64' 'st.v2.u64' 'st.volatile.v2.u64' '%globaltimer' 'bar.sync' \
            'nanosleep' 'trap'; do
    if grep -q -F "$insn" "$out"; then
        echo "ok   $insn"
    else
        echo "FAIL $insn not in $out"
        fail=1
    fi
done
exit $fail
