#!/usr/bin/env python3
"""How long a process takes to move itself into a run's cgroups, one start at a time.

Makes a `memory` and a `pids` group under each hierarchy's `cortexfs/` (cgroup v1, as
ctxterm::launch::cgroups does), then times a shell that writes its pid into both and execs
/bin/true, against the same shell joining none; 8 rounds, 300 ms apart (back to back, only
the first move of a burst waits for the kernel). Root only. Usage: bench/probes/cgroup_join.py
"""
import os
import statistics
import subprocess
import time

JOIN = 'IFS=:; for p in $0; do echo $$ > "$p" || exit 69; done; unset IFS; exec "$@"'


def main():
    joined, bare = [], []
    for i in range(8):
        time.sleep(0.3)
        dirs = []
        for c in ("memory", "pids"):
            d = f"/sys/fs/cgroup/{c}/cortexfs/probe{i}"
            os.makedirs(d, exist_ok=True)
            dirs.append(d)
        t = time.perf_counter()
        subprocess.run(["/bin/sh", "-c", JOIN, ":".join(d + "/cgroup.procs" for d in dirs), "/bin/true"], check=True)
        joined.append((time.perf_counter() - t) * 1e3)
        for d in dirs:
            os.rmdir(d)
        time.sleep(0.3)
        t = time.perf_counter()
        subprocess.run(["/bin/sh", "-c", 'exec "$@"', "x", "/bin/true"], check=True)
        bare.append((time.perf_counter() - t) * 1e3)
    print(f"join memory+pids: p50 {statistics.median(joined):.2f} ms, all {sorted(round(x, 2) for x in joined)}")
    print(f"join none:        p50 {statistics.median(bare):.2f} ms")


if __name__ == "__main__":
    main()
