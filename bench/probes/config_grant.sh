#!/bin/sh
# The cost of a grant that commits its own change: `ctx agent grant` p50/p90 over N grants on a
# storage of A agents and T tools, as a plain storage and as a configuration repository (each
# grant a commit and a generation checked out), and a daemon's start on each.
# Usage: bench/probes/config_grant.sh [CTX] [A] [T] [N]   (as root; release ctx by default)
set -eu
CTX=${1:-target/release/ctx}
A=${2:-100}
T=${3:-100}
N=${4:-50}
d=$(mktemp -d /var/tmp/cfgbench.XXXXXX)
# The storages' checked-out generations (in /run, named by a hash of the storage's path) go too.
generations() { printf %s "$(realpath "$1")" | sha256sum | cut -c1-16; }
trap 'rm -rf "/run/cortexfs/generation/$(generations "$d/repo")" "/run/cortexfs/generation/$(generations "$d/plain")" "$d"' EXIT
make_storage() {
    s=$1
    mkdir -p "$s/tool" "$s/agent" "$s/model" "$s/home" "$s/shared"
    i=0
    while [ $i -lt "$T" ]; do
        mkdir -p "$s/tool/t$i.d"
        head -c 65536 /dev/urandom > "$s/tool/t$i"; chmod 755 "$s/tool/t$i"
        echo "allow a0_t tool:t$i execute" > "$s/tool/t$i.d/policy"
        i=$((i + 1))
    done
    i=0
    while [ $i -lt "$A" ]; do
        mkdir -p "$s/agent/a$i.d"
        printf '#!/bin/sh\n' > "$s/agent/a$i"; chmod 755 "$s/agent/a$i"
        echo "a${i}_t" > "$s/agent/a$i.d/label"
        echo $((20000 + i)) > "$s/agent/a$i.d/uid"
        echo "allow a${i}_t tool:t0 execute" > "$s/agent/a$i.d/policy"
        i=$((i + 1))
    done
}
grants() {
    s=$1
    i=0
    : > "$d/times"
    while [ $i -lt "$N" ]; do
        t0=$(date +%s%N)
        "$CTX" agent grant --source "$s" a1 "tool:t$((i % T))" execute > /dev/null
        "$CTX" agent revoke --source "$s" a1 "tool:t$((i % T))" execute > /dev/null
        t1=$(date +%s%N)
        echo $(( (t1 - t0) / 2000 )) >> "$d/times"
        i=$((i + 1))
    done
    sort -n "$d/times" | awk '{a[NR]=$1} END {printf "p50 %.1f ms p90 %.1f ms\n", a[int(NR/2)+1]/1000, a[int(NR*0.9)+1]/1000}'
}
starts() {
    s=$1
    : > "$d/times"
    for i in 1 2 3 4 5 6 7 8 9; do
        mkdir -p "$d/mnt"
        t0=$(date +%s%N)
        "$CTX" mount --source "$s" --control "$d/control.sock" "$d/mnt" 2>/dev/null &
        pid=$!
        until [ -S "$d/control.sock" ] && [ -e "$d/mnt/status" ]; do sleep 0.001; done
        t1=$(date +%s%N)
        echo $(( (t1 - t0) / 1000 )) >> "$d/times"
        kill $pid; wait $pid || true
        rm -f "$d/control.sock"
    done
    sort -n "$d/times" | awk '{a[NR]=$1} END {printf "p50 %.1f ms\n", a[int(NR/2)+1]/1000}'
}
make_storage "$d/plain"
make_storage "$d/repo"
sync
t0=$(date +%s%N)
"$CTX" config commit --source "$d/repo" -m "first generation" > /dev/null
t1=$(date +%s%N)
echo "first commit of $A agents and $T tools: $(( (t1 - t0) / 1000000 )) ms"
sync
echo "grant, plain storage:          $(grants "$d/plain")"
echo "grant, a commit per grant:     $(grants "$d/repo")"
# The same with a daemon serving each storage: each grant also waits until the daemon serves
# it (for a repository, its generation).
served() {
    mkdir -p "$d/served"
    "$CTX" mount --source "$1" --control "$d/served.sock" "$d/served" 2>/dev/null &
    pid=$!
    until [ -S "$d/served.sock" ] && [ -e "$d/served/status" ]; do sleep 0.001; done
    grants "$1"
    kill $pid; wait $pid || true
    rm -f "$d/served.sock"
}
echo "grant, plain, a daemon serving: $(served "$d/plain")"
echo "grant, a repository, served:   $(served "$d/repo")"
echo "daemon start, plain storage:   $(starts "$d/plain")"
echo "daemon start, a repository:    $(starts "$d/repo")"
