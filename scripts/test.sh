#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, runs the default test suites.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
[ -d build ] || meson setup build
meson compile -C build
# 3 at a time on CI's 2 cores: most parallel tests are 1-2 short-lived ranks that mostly start and
# wait; the tests of more ranks run alone (is_parallel: false).
meson test -C build --print-errorlogs --num-processes 3
# ThreadSanitizer over the emulated GPU with ranks as threads (a reduced pass; scripts/tsan.sh).
bash scripts/tsan.sh
# AddressSanitizer + UBSan over unit, sim and the small mp cases (a reduced pass; the full ones:
# scripts/sanitize.sh asan|tsan, docs/testing.md "Sanitizers").
bash scripts/sanitize.sh asan --reduced
