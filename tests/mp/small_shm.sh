#!/usr/bin/env bash
# small_shm.sh SIZE EXPECT PROGRAM [ARGS...]: runs PROGRAM in a private mount namespace whose
# /dev/shm is a fresh tmpfs of SIZE (Docker gives containers 64 MiB by default), and removes it
# afterwards (the namespace dies with the program).
#   EXPECT pass       PROGRAM must exit 0 (it checks its results element by element)
#   EXPECT fail-init  PROGRAM must exit non-zero, not by a signal, and its output must hold the
#                     shared-memory reservation message naming the space needed and the knobs
# Needs root for the mount namespace (exit 77, SKIP, otherwise).
set -u
size=$1 expect=$2
shift 2
[ "$EUID" = 0 ] || { echo "SKIP: a private /dev/shm needs root"; exit 77; }
command -v unshare >/dev/null || { echo "FAIL: no unshare: run scripts/deps.sh (util-linux)"; exit 1; }
out=$(mktemp /tmp/weft-small-shm.XXXXXX)
trap 'rm -f "$out"' EXIT
unshare --mount --propagation private -- sh -c \
    'mount -t tmpfs -o size="$0" weft-small-shm /dev/shm || exit 99; exec "$@"' \
    "$size" "$@" >"$out" 2>&1
rc=$?
[ $rc = 99 ] && { cat "$out"; echo "SKIP: cannot mount a tmpfs on /dev/shm here"; exit 77; }
case "$expect" in
pass)
    tail -20 "$out"
    [ $rc = 0 ] || { echo "FAIL: exit $rc in a $size /dev/shm"; exit 1; } ;;
fail-init)
    tail -20 "$out"
    if [ $rc = 0 ]; then echo "FAIL: succeeded in a $size /dev/shm, expected a clean init failure"; exit 1; fi
    if [ $rc -gt 128 ] || grep -q "signal\|SIGBUS\|Bus error" "$out"; then
        echo "FAIL: killed by a signal (exit $rc)"; exit 1
    fi
    grep -q "cannot reserve .* MiB of shared memory .* need .* MiB there, it holds .* MiB" "$out" ||
        { echo "FAIL: no reservation message"; exit 1; } ;;
*) echo "small_shm.sh: EXPECT is pass or fail-init"; exit 2 ;;
esac
echo "PASS"
