#!/bin/sh
# torch-oracle.sh WEFTRUN WEFT_TRAIN ORACLE_PY -- the PyTorch oracle (suite `torch`, opt-in).
#
# Runs weft-train on one rank for 5 steps with --dump into a temporary folder (initial canonical
# parameters, the batches, the losses and the step-0 gradient), then torch_oracle.py, which builds
# the same GPT-2 in PyTorch from those weights and compares. Exits 77 (skip) when no python3 can
# import torch (Debian: python3-torch). Extra weft-train arguments (a different model size, say)
# can be given in $WEFT_ORACLE_ARGS.
set -u
weftrun=$1
weft_train=$2
oracle=$3

# Debian's python3-torch lives in /usr/bin/python3's path; a python3 earlier in PATH (pyenv, a
# venv) may not see it. $PYTHON overrides.
py=
for cand in ${PYTHON:-} python3 /usr/bin/python3; do
    if "$cand" -c 'import torch' 2>/dev/null; then
        py=$cand
        break
    fi
done
if [ -z "$py" ]; then
    echo "SKIP: no python3 can import torch (install python3-torch)"
    exit 77
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/weft-oracle-XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT

# shellcheck disable=SC2086  # WEFT_ORACLE_ARGS is a list of words on purpose
if ! "$weftrun" -n 1 --timeout 240 "$weft_train" --steps 5 --dump "$dir" ${WEFT_ORACLE_ARGS:-}; then
    echo "FAIL: weft-train --dump did not complete"
    exit 1
fi
"$py" "$oracle" "$dir"
