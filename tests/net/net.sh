#!/bin/bash
# Several "hosts" on one machine: one network namespace per host (own UTS namespace and hostname
# too), joined by veth pairs to a bridge that lives in a namespace of its own, with private
# 10.77.0.x addresses that exist only inside them. Ranks of one host share memory (same
# NCCL_HOSTID); ranks of different hosts talk over the socket transport on veth0.
#
#   net.sh DRIVER colls HOSTS RANKS_PER_HOST   every collective, checked element by element
#                                              (WEFT_NET_PLACEMENT=rr: ranks round robin)
#   net.sh DRIVER dev HOSTS RANKS_PER_HOST PROG ARGS...
#                                              PROG ARGS on every rank (tests/gpu-emu/test_coll_mp
#                                              sweep -q under WEFT_CUDA=emu:D: device buffers
#                                              across hosts, checked element by element)
#   net.sh DRIVER devkill PROG                 3 hosts x 2 ranks of PROG kill (test_coll_mp:
#                                              the last rank SIGKILLs itself mid-collective on
#                                              device buffers); every survivor must name it
#   net.sh DRIVER kill                         3 hosts x 2 ranks; rank 5 is killed mid-run; the
#                                              others must fail naming it and its host
#   net.sh DRIVER bench PERF [SIZE]            all_reduce_perf busbw across 2 hosts vs iperf3
#                                              (WEFT_NET_ROUNDS rounds, default 3: medians)
#   net.sh DRIVER algos PERFDIR [HxR ...]      all-reduce time by size (8 B .. 1 MiB, every 4x)
#                                              with NCCL_ALGO=ring, tree, direct, hier and unset (the
#                                              tuner), on H hosts (at most 4) x R ranks (default
#                                              2x2 2x4; WEFT_NET_ALGOS picks others), repeated
#                                              WEFT_NET_REPEATS times (default 5): medians; and
#                                              the inter-host alpha/beta from sendrecv_perf 2x1
#
# DRIVER is tests/net/net_colls. Needs root (exit 77, SKIP, otherwise) and iproute2 (a failure
# without it: scripts/deps.sh installs it). Everything it creates is named weftnet-<pid>-* and
# removed on exit, whatever happens.
set -u

driver=$1
mode=$2
shift 2

skip() {
    echo "SKIP: $*"
    exit 77
}
[ "$EUID" = 0 ] || skip "creating network namespaces needs root"
# Packages scripts/deps.sh installs are never a reason to skip: their absence is a failure.
missing() {
    echo "FAIL: no $1 command: run scripts/deps.sh (Debian package $2)"
    exit 1
}
command -v ip >/dev/null 2>&1 || missing ip iproute2
command -v unshare >/dev/null 2>&1 || missing unshare util-linux

tag=weftnet-$$
letters=(a b c d)
namespaces=()
pids=()
logs=$(mktemp -d /tmp/$tag.XXXXXX)

cleanup() {
    for pid in "${pids[@]}" $(jobs -p); do
        kill -9 "$pid" 2>/dev/null
    done
    wait 2>/dev/null
    for ns in "${namespaces[@]}"; do
        ip netns del "$ns" 2>/dev/null
    done
    rm -rf "$logs"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkns() {
    ip netns add "$1" 2>/dev/null || skip "cannot create network namespace $1"
    namespaces+=("$1")
    ip -n "$1" link set lo up
}

# hosts N: namespaces $tag-a.. with veth0 at 10.77.0.1.., bridged in $tag-sw
hosts() {
    local n=$1 h ns
    mkns "$tag-sw"
    ip -n "$tag-sw" link add br0 type bridge || skip "no bridge support"
    ip -n "$tag-sw" link set br0 up
    for ((h = 0; h < n; h++)); do
        ns=$tag-${letters[h]}
        mkns "$ns"
        ip -n "$ns" link add veth0 type veth peer name p$h netns "$tag-sw" || skip "no veth support"
        ip -n "$tag-sw" link set p$h master br0
        ip -n "$tag-sw" link set p$h up
        ip -n "$ns" addr add 10.77.0.$((h + 1))/24 dev veth0
        ip -n "$ns" link set veth0 up
    done
}

# in_host H CMD...: runs CMD in host H's network namespace, under hostname weft-<letter>.
# It execs, so that $! of "in_host ... &" is the program's own pid: call it only in a subshell
# (in the background, in a pipeline or in $(...)).
in_host() {
    local h=$1
    shift
    exec ip netns exec "$tag-${letters[h]}" unshare -u sh -c 'hostname "$0" && exec "$@"' \
        "weft-${letters[h]}" "$@"
}

# unique id for a job whose rank 0 is on host a (it serves the rendezvous itself)
make_id() {
    # below the ephemeral range (32768..), where a connection of an earlier run may hold the port
    in_host 0 env NCCL_COMM_ID=10.77.0.1:$((20000 + $$ % 12000)) "$driver" id
}

# launch NHOSTS RPH ARGS...: starts every rank in the background; pids[rank] = its pid
launch() {
    local nh=$1 rph=$2 id h l rank
    shift 2
    id=$(make_id) || { echo "FAIL: no unique id"; exit 1; }
    pids=()
    for ((h = 0; h < nh; h++)); do
        for ((l = 0; l < rph; l++)); do
            rank=$((h * rph + l))
            # WEFT_NET_PLACEMENT=rr: ranks dealt round robin (host h holds h, h+nh, ...)
            [ "${WEFT_NET_PLACEMENT:-}" = rr ] && rank=$((l * nh + h))
            in_host $h env WEFT_RANK=$rank WEFT_NRANKS=$((nh * rph)) WEFT_LOCAL_RANK=$l \
                WEFT_UNIQUE_ID="$id" NCCL_HOSTID=$tag-${letters[h]} NCCL_SOCKET_IFNAME=veth0 \
                WEFT_NET_NHOSTS=$nh \
                WEFT_TIMEOUT=30 "$@" >"$logs/rank$rank" 2>&1 &
            pids[rank]=$!
        done
    done
}

# collect LIMIT_S: waits for every rank (killing all at the limit); sets status[rank]
collect() {
    local limit=$1 start=$SECONDS r alive
    status=()
    while :; do
        alive=0
        for r in "${!pids[@]}"; do
            kill -0 "${pids[r]}" 2>/dev/null && alive=1
        done
        [ $alive = 0 ] && break
        if ((SECONDS - start > limit)); then
            echo "FAIL: ranks still running after ${limit} s; killing them"
            for r in "${!pids[@]}"; do kill -9 "${pids[r]}" 2>/dev/null; done
            break
        fi
        sleep 0.1
    done
    for r in "${!pids[@]}"; do
        wait "${pids[r]}"
        status[r]=$?
    done
    pids=()
}

show_logs() {
    local r
    for r in $(ls "$logs" | sed 's/rank//' | sort -n); do
        sed "s/^/[$r] /" "$logs/rank$r" | tail -n 20
    done
}

case $mode in
colls)
    nh=$1 rph=$2
    hosts "$nh"
    launch "$nh" "$rph" "$driver" colls
    collect 110   # a 3x3 run takes 8 s idle, 50 s on a machine loaded 12 deep
    show_logs
    for r in "${!status[@]}"; do
        [ "${status[r]}" = 0 ] || { echo "FAIL: rank $r exited with ${status[r]}"; exit 1; }
    done
    echo "PASS: every collective on $nh hosts x $rph ranks"
    ;;
dev)
    nh=$1 rph=$2
    shift 2
    hosts "$nh"
    launch "$nh" "$rph" "$@"
    collect 55
    show_logs
    for r in "${!status[@]}"; do
        [ "${status[r]}" = 77 ] && skip "rank $r: no device"
        [ "${status[r]}" = 0 ] || { echo "FAIL: rank $r exited with ${status[r]}"; exit 1; }
        grep -q " passed, 0 failed" "$logs/rank$r" ||
            { echo "FAIL: rank $r reported no pass"; exit 1; }
    done
    echo "PASS: device buffers on $nh hosts x $rph ranks: $*"
    ;;
devkill)
    nh=3 rph=2 victim=5
    hosts $nh
    launch $nh $rph "$1" kill
    collect 55
    show_logs
    for r in "${!status[@]}"; do
        [ "${status[r]}" = 77 ] && skip "rank $r: no device"
        if [ "$r" = $victim ]; then
            [ "${status[r]}" = 137 ] || { echo "FAIL: victim exited with ${status[r]}"; exit 1; }
            continue
        fi
        [ "${status[r]}" = 0 ] || { echo "FAIL: rank $r exited with ${status[r]}"; exit 1; }
        grep -q "kill: ok" "$logs/rank$r" ||
            { echo "FAIL: rank $r did not name the victim"; exit 1; }
    done
    echo "PASS: every survivor named peer $victim on weft-c (device buffers)"
    ;;
kill)
    nh=3 rph=2 victim=5
    hosts $nh
    launch $nh $rph "$driver" kill $victim weft-c
    sleep 3
    if ! kill -0 "${pids[victim]}" 2>/dev/null; then
        show_logs
        echo "FAIL: rank $victim ended early"
        exit 1
    fi
    kill -9 "${pids[victim]}"
    echo "killed rank $victim (pid ${pids[victim]}) on host weft-c"
    collect 40
    show_logs
    for r in "${!status[@]}"; do
        [ "$r" = $victim ] && continue
        [ "${status[r]}" = 0 ] || { echo "FAIL: rank $r exited with ${status[r]}"; exit 1; }
    done
    echo "PASS: every survivor named peer $victim on weft-c"
    ;;
bench)
    perf=$1 size=${2:-64M} rounds=${WEFT_NET_ROUNDS:-3}
    command -v iperf3 >/dev/null 2>&1 || skip "no iperf3"
    hosts 2
    # iperf3 GB/s per direction (mean of both directions' receiver rates) for "$@" --bidir
    iperf_bidir() {
        in_host 1 iperf3 -s -1 -p 5201 >"$logs/iperf3-server" 2>&1 &
        sleep 0.5
        (in_host 0 iperf3 -c 10.77.0.2 -p 5201 -t 4 -f g --bidir "$@") >"$logs/iperf3" 2>&1
        wait
        awk -v sum=$(($# > 0)) '/receiver/ && (!sum || /SUM/) { for (i = 1; i < NF; i++)
                if ($(i + 1) == "Gbits/sec") { s += $i; n++ } }
            END { if (n) printf "%.3f", s / n / 8; else print "0" }' "$logs/iperf3"
    }
    # median of the numbers on stdin
    median() { sort -g | awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
    echo "# $rounds rounds, each: iperf3 --bidir with one flow each way, iperf3 --bidir -P 8"
    echo "# (as many flows as Weft opens per peer with 2 ranks), all_reduce_perf -b $size -e $size"
    echo "# on 2 hosts x 1 rank (socket transport); GB/s per direction, busbw out-of-place/in-place"
    one=() eight=() ar=()
    for ((k = 0; k < rounds; k++)); do
        one[k]=$(iperf_bidir)
        eight[k]=$(iperf_bidir -P 8)
        launch 2 1 "$perf" -b "$size" -e "$size" -n 20 -w 5
        collect 120
        for r in "${!status[@]}"; do
            if [ "${status[r]}" != 0 ]; then
                tail "$logs/rank$r"
                echo "FAIL: rank $r exited with ${status[r]}"
                exit 1
            fi
        done
        [ $k = 0 ] && grep -E '^# +(size|\(B\))' "$logs/rank0"
        line=$(awk '$1 ~ /^[0-9]+$/ && NF >= 12' "$logs/rank0")
        echo "$line"
        ar[k]=$(echo "$line" | awk '{ print $8 }')
        echo "# round $((k + 1)): iperf3 1 flow ${one[k]}, 8 flows ${eight[k]}, all-reduce ${ar[k]}" \
            "(out-of-place busbw: with 2 ranks, the bytes each rank sends and receives per second)"
    done
    m1=$(printf '%s\n' "${one[@]}" | median)
    m8=$(printf '%s\n' "${eight[@]}" | median)
    ma=$(printf '%s\n' "${ar[@]}" | median)
    awk -v a="$ma" -v i="$m1" -v j="$m8" 'BEGIN { printf "# summary (medians): all-reduce busbw " \
        "%.2f GB/s; iperf3 bidir %.2f GB/s per direction with one flow: %.0f%%; %.2f with 8 " \
        "flows: %.0f%%\n", a, i, (i > 0 ? 100 * a / i : 0), j, (j > 0 ? 100 * a / j : 0) }'
    ;;
algos)
    perfdir=$1
    shift
    layouts=${*:-2x2 2x4}
    reps=${WEFT_NET_REPEATS:-5}
    # The namespaces share this machine's cores, which each "host" counts as its own: with more
    # ranks in all than cores, every rank must give its core away when it waits (as an
    # oversubscribed host does), or spinning ranks starve the ones they wait for.
    spin=()
    most=2
    for hr in $layouts; do
        ((${hr%x*} * ${hr#*x} > $(nproc))) && spin=(WEFT_SPIN_COUNT=0 WEFT_SOCKET_SPIN_US=0)
        ((${hr%x*} > most)) && most=${hr%x*}
    done
    ((most <= ${#letters[@]})) || { echo "algos: at most ${#letters[@]} hosts"; exit 2; }
    [ ${#spin[@]} = 0 ] || echo "# more ranks than the $(nproc) cores: ${spin[*]}"
    hosts $most
    # median of the out-of-place time (us) by size over the runs in $logs/NAME.*
    median() {
        cat "$logs/$1".* | awk '$1 ~ /^[0-9]+$/ && NF >= 12 { t[$1] = t[$1] " " $6 }
            END { for (s in t) { n = split(t[s], v, " "); for (i = 1; i <= n; i++)
                    for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { x = v[i]; v[i] = v[j]; v[j] = x }
                  printf "%d %.2f\n", s, n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 } }' |
            sort -n
    }
    # run NAME H R PROG ARGS...: one run; rank 0's output appended as $logs/NAME.<run>
    run() {
        local name=$1 nh=$2 rph=$3 r
        shift 3
        launch "$nh" "$rph" "$@"
        collect 120
        for r in "${!status[@]}"; do
            if [ "${status[r]}" != 0 ]; then
                show_logs
                echo "FAIL: $name: rank $r exited with ${status[r]}"
                exit 1
            fi
        done
        cp "$logs/rank0" "$logs/$name.$i"
    }
    echo "# inter-host link: sendrecv_perf, 2 hosts x 1 rank, median of $reps runs (time: us)"
    for ((i = 0; i < reps; i++)); do
        run sendrecv 2 1 env "${spin[@]}" "$perfdir/sendrecv_perf" -b 8 -e 4M -f 4 -n 50 -w 10
    done
    median sendrecv | awk '{ t[NR] = $2; s[NR] = $1; printf "#   %9d B %10.2f us\n", $1, $2 }
        END { printf "# alpha %.1f us, beta %.3f us/KiB (%.2f GB/s) from %d B and %d B\n", t[1],
              (t[NR] - t[1]) / (s[NR] - s[1]) * 1024, (s[NR] - s[1]) / (t[NR] - t[1]) / 1e3,
              s[1], s[NR] }'
    for hr in $layouts; do
        nh=${hr%x*} rph=${hr#*x}
        for ((i = 0; i < reps; i++)); do
            for a in ${WEFT_NET_ALGOS:-ring tree direct hier auto}; do
                algo=NCCL_ALGO=$a
                [ $a = auto ] && algo=NCCL_ALGO=
                run "$hr-$a" "$nh" "$rph" env "${spin[@]}" "$algo" "$perfdir/all_reduce_perf" \
                    -b 8 -e 1M -f 4 -n 100 -w 10
            done
        done
        echo "# all_reduce_perf $nh hosts x $rph ranks: median out-of-place time (us) of $reps runs"
        printf "# %10s %10s %10s %10s %10s %10s %8s %8s\n" bytes ring tree direct hier auto \
            tree/ring hier/ring
        if [ -n "${WEFT_NET_ALGOS:-}" ]; then
            for a in $WEFT_NET_ALGOS; do echo "# $a"; median "$hr-$a"; done
            continue
        fi
        join <(median "$hr-ring") <(median "$hr-tree") | join - <(median "$hr-direct") |
            join - <(median "$hr-hier") | join - <(median "$hr-auto") |
            awk '{ printf "%12d %10.2f %10.2f %10.2f %10.2f %10.2f %8.2f %8.2f\n", $1, $2, $3, $4,
                   $5, $6, $3 / $2, $5 / $2 }'
    done
    ;;
*)
    echo "unknown mode $mode"
    exit 2
    ;;
esac
