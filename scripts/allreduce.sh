#!/usr/bin/env bash
# The README's main job: all-reduce perf on 4 local ranks over host memory.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
[ -d build ] || meson setup build
meson compile -C build
# -H 1: host memory also where a GPU is (the perf tools' default there is device buffers).
./build/tools/weftrun -n "${NRANKS:-4}" ./build/perf/all_reduce_perf -H 1 -b 8 -e 64M -f 2 "$@"
