#!/usr/bin/env bash
# The per-mode table of the trainer issue: every parallel mode of weft-train checked against the
# single-rank model (--check ref, 20 steps, micro preset unless WEFT_TRAIN_ARGS says otherwise),
# one markdown row each: worst loss difference, tokens/s, model-state memory per rank against the
# ZeRO formula (max over ranks of measured / formula), and the pipeline wait of rank 0 against
# (p-1)/(m+p-1). Usage: scripts/train-modes.sh [build dir]
set -euo pipefail
build=${1:-build}
weftrun=$build/tools/weftrun
train=$build/tools/train/weft-train
extra=${WEFT_TRAIN_ARGS:-}
modes=(
  "2|DDP dp2|"
  "3|DDP dp3|--batch 6"
  "4|DDP dp4 m2|--microbatches 2"
  "3|ZeRO-1 dp3|--zero 1 --batch 6"
  "3|ZeRO-2 dp3|--zero 2 --batch 6"
  "3|ZeRO-3 dp3|--zero 3 --batch 6"
  "2|TP2|--tp 2"
  "2|TP2 + SP|--tp 2 --sp"
  "4|TP4|--tp 4"
  "4|TP4 + SP|--tp 4 --sp"
  "2|PP2 GPipe m4|--pp 2 --microbatches 4 --schedule gpipe"
  "2|PP2 1F1B m4|--pp 2 --microbatches 4 --schedule 1f1b"
  "4|PP4 GPipe m8|--pp 4 --microbatches 8 --schedule gpipe"
  "4|PP4 1F1B m8|--pp 4 --microbatches 8 --schedule 1f1b"
  "2|EP2 (4 experts)|--ep 2 --experts 4"
  "8|dp2 tp2 pp2 ZeRO-3 1F1B m2|--dp 2 --tp 2 --pp 2 --zero 3 --schedule 1f1b --microbatches 2"
)
echo "| mode | ranks | max abs loss diff | tok/s | model states / formula (max over ranks) | pipeline wait (rank 0) vs (p-1)/(m+p-1) | result |"
echo "|---|---|---|---|---|---|---|"
for m in "${modes[@]}"; do
  IFS='|' read -r n name args <<< "$m"
  # shellcheck disable=SC2086
  out=$("$weftrun" -n "$n" --no-prefix "$train" --steps 20 --quiet --check ref $args $extra 2>&1) || true
  dloss=$(sed -n 's/^# worst: dloss \([^ ]*\).*/\1/p' <<< "$out")
  toks=$(sed -n 's/^# throughput \([0-9]*\) tok\/s.*/\1/p' <<< "$out")
  ratio=$(awk '/^ *rank +psi/ {t=1; next} t && NF==11 && $1 ~ /^[0-9]+$/ {if ($11 > r) r = $11} END {printf "%.3f", r}' <<< "$out")
  bubble=$(sed -n 's/.*pipeline wait \([0-9.]*\) of step time, (p-1)\/(m+p-1) = \([0-9.]*\).*/\1 vs \2/p' <<< "$out")
  verdict=$(tail -1 <<< "$out")
  echo "| $name | $n | ${dloss:-?} | ${toks:-?} | $ratio | ${bubble:--} | $verdict |"
done
