#!/usr/bin/env bash
# Installs the Debian packages Weft needs to build and test (idempotent; apt-get only when missing).
# Extra package names given as arguments are installed too.
set -euo pipefail
# openmpi-bin and mpich: the launch suite runs the perf tools under mpirun and mpiexec.
pkgs=(meson ninja-build gcc g++ pkg-config binutils python3 openmpi-bin mpich "$@")
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
