#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, runs the default test suites.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
[ -d build ] || meson setup build
meson compile -C build
meson test -C build --print-errorlogs --num-processes 2
# ThreadSanitizer over the emulated GPU with ranks as threads (a reduced pass; scripts/tsan.sh).
bash scripts/tsan.sh
# AddressSanitizer + UBSan over unit, sim and the small mp cases (a reduced pass; the full ones:
# scripts/sanitize.sh asan|tsan, README "Tests").
bash scripts/sanitize.sh asan --reduced
