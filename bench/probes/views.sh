#!/bin/sh
# The daemon's resident memory, descriptors and threads per agent view: a release `ctx mount`
# on a fresh storage, 200 views of one agent made through its control socket, each asked one
# `stat` of its `status`; per transport. Root only. Usage: bench/probes/views.sh [COUNT]
set -eu
R=$(dirname "$0")/../../target/release
N=${1:-200}
D=$(mktemp -d /var/tmp/cortexfs-views.XXXXXX)
mkdir -p "$D/st" "$D/mnt" "$D/v"
"$R/ctx" bootstrap "$D/st" >/dev/null 2>&1
"$R/ctx" agent new vq --uid 1000 --gid 1000 --source "$D/st" >/dev/null 2>&1
for T in dev uring; do
  "$R/ctx" mount --source "$D/st" "$D/mnt" --control "$D/ctl.sock" --transport "$T" >"$D/log" 2>&1 &
  while [ ! -S "$D/ctl.sock" ]; do sleep 0.1; done
  P=$!
  r0=$(awk '/VmRSS/{print $2}' /proc/$P/status); f0=$(ls /proc/$P/fd | wc -l); t0=$(ls /proc/$P/task | wc -l)
  i=1
  while [ $i -le "$N" ]; do
    mkdir -p "$D/v/$i"
    "$R/ctx" view create --agent vq --session "s$i" --path "$D/v/$i" --control "$D/ctl.sock" >/dev/null
    stat "$D/v/$i/status" >/dev/null
    i=$((i + 1))
  done
  r1=$(awk '/VmRSS/{print $2}' /proc/$P/status); f1=$(ls /proc/$P/fd | wc -l); t1=$(ls /proc/$P/task | wc -l)
  echo "$T: $N views: RSS $r0 -> $r1 KiB ($(( (r1 - r0) / N )) KiB per view), descriptors $f0 -> $f1, threads $t0 -> $t1"
  kill -TERM $P; wait $P || true
  for v in "$D"/v/*; do umount -l "$v" 2>/dev/null || true; done
done
rm -rf "$D"
