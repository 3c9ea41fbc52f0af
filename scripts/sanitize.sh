#!/usr/bin/env bash
# Sanitizer passes over the unit, sim and mp suites.
#
#   scripts/sanitize.sh asan [--reduced] [meson test args...]   AddressSanitizer + UBSan
#   scripts/sanitize.sh tsan [--reduced] [meson test args...]   ThreadSanitizer
#
# Configures build-asan (-Db_sanitize=address,undefined) or build-tsan (-Db_sanitize=thread) once
# (override with ASAN_BUILD / TSAN_BUILD), builds it, and runs `meson test --setup asan|tsan`
# (meson.build: sanitizer options, timeouts x4) on the suites. --reduced runs the subset CI runs
# (scripts/test.sh): unit, sim without the large counts, the 1- and 2-rank mp cases and the
# fault cases, with the schedule sweeps on 1..16 ranks. Any sanitizer report fails its test.
set -uo pipefail
cd "$(dirname "$0")/.."
kind=${1:-}
shift || true
case $kind in
    asan) dir=${ASAN_BUILD:-build-asan}; san=address,undefined ;;
    tsan) dir=${TSAN_BUILD:-build-tsan}; san=thread ;;
    *) echo "usage: $0 asan|tsan [--reduced] [meson test args...]" >&2; exit 2 ;;
esac
reduced=0
if [ "${1:-}" = --reduced ]; then reduced=1; shift; fi
if [ ! -d "$dir" ]; then
    meson setup "$dir" -Db_sanitize=$san -Db_lundef=false -Dbuildtype=debugoptimized -Dcuda=disabled >/dev/null ||
        { echo "$kind: meson setup $dir failed"; exit 1; }
fi
meson compile -C "$dir" >/dev/null || { echo "$kind: build of $dir failed"; exit 1; }
if [ "$reduced" = 1 ]; then
    # unit; sim without the large counts; mp at 1 and 2 ranks, the fault and injected-fault cases.
    list() { meson test -C "$dir" --list --suite "$1" 2>/dev/null | sed 's/.* \/ //'; }
    tests="$(list unit) $(list sim | grep -v -E '^sim-(big|huge)-')
           $(list mp | grep -E -- '-(1|2)$|^faults?-')"
    # The schedule sweeps of tests/unit on 1..16 ranks, not 1..64 (their 2 minutes under ASan).
    export WEFT_TEST_SCHED_MAX_RANKS=${WEFT_TEST_SCHED_MAX_RANKS:-16}
    # shellcheck disable=SC2086
    exec meson test -C "$dir" --setup "$kind" --print-errorlogs --num-processes 2 $tests "$@"
fi
exec meson test -C "$dir" --setup "$kind" --print-errorlogs --num-processes 2 \
    --suite unit --suite sim --suite mp "$@"
