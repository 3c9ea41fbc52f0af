#!/bin/sh
# The signature check's cost (exec/sig.h, issue 15 item 6): 8-byte all-reduce on 2 ranks with
# WEFT_CHECK=1 and WEFT_CHECK=0, alternating, ROUNDS rounds of ITERS iterations each; prints every
# round's times (us, out-of-place and in-place as all_reduce_perf reports them), the medians and
# the ratio check/nocheck. A benchmark, not a test: it never fails on the figures.
#   meson test -C build --benchmark check-cost-8b-np2 -v
#   perf/check_cost.sh build/tools/weftrun build/perf/all_reduce_perf [ROUNDS] [ITERS]
set -eu
weftrun=$1
perf=$2
rounds=${3:-10}
iters=${4:-20000}
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
run() { # $1: WEFT_CHECK value; prints "oop ip"
    WEFT_CHECK=$1 "$weftrun" -n 2 "$perf" -b 8 -e 8 -n "$iters" -w 1000 2>&1 |
        awk '$2 == 8 && $3 == 2 { print $7, $11; exit }'
}
i=0
while [ "$i" -lt "$rounds" ]; do
    if [ $((i % 2)) -eq 0 ]; then
        a=$(run 1); b=$(run 0)
    else
        b=$(run 0); a=$(run 1)
    fi
    echo "round $i: WEFT_CHECK=1 $a   WEFT_CHECK=0 $b"
    echo "$a $b" >>"$tmp"
    i=$((i + 1))
done
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
c_oop=$(awk '{ print $1 }' "$tmp" | median); c_ip=$(awk '{ print $2 }' "$tmp" | median)
n_oop=$(awk '{ print $3 }' "$tmp" | median); n_ip=$(awk '{ print $4 }' "$tmp" | median)
echo "median over $rounds rounds of $iters iterations, 8 B all-reduce, 2 ranks:"
echo "  out-of-place: WEFT_CHECK=1 $c_oop us, WEFT_CHECK=0 $n_oop us, ratio $(echo "$c_oop $n_oop" | awk '{ printf "%.3f", $1 / $2 }')"
echo "  in-place:     WEFT_CHECK=1 $c_ip us, WEFT_CHECK=0 $n_ip us, ratio $(echo "$c_ip $n_ip" | awk '{ printf "%.3f", $1 / $2 }')"
