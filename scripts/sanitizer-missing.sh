#!/bin/sh
# The exe_wrapper of `meson test --setup asan|tsan` in a build directory that was not configured
# for that sanitizer: fails the test with a message saying how to get one (meson.build).
echo "meson test --setup $1: this build directory was not configured with -Db_sanitize=$2;" \
     "use scripts/sanitize.sh $1 (build-$1), or meson setup DIR -Db_sanitize=$2" >&2
exit 1
