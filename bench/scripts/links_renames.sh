#!/bin/bash
# Hard-link removal and rename rate in home/ of a ctx mount against ext4 (/var/tmp), one run.
# Usage (root): bench/scripts/links_renames.sh target/release/ctx
set -e
ctx=$1; d=$(mktemp -d /var/tmp/lb.XXXX); mkdir -p $d/m $d/native
$ctx mount --source $d/s $d/m --control $d/c.sock 2>/dev/null & pid=$!
for i in $(seq 200); do [ -e $d/m/status ] && break; sleep 0.05; done
mkdir -p $d/m/home/0
python3 - "$d/m/home/0" "$d/native" <<'PY'
import os, sys, time, shutil, subprocess
def links(base):
    d=os.path.join(base,"l"); os.mkdir(d); f=os.path.join(d,"f"); open(f,"w").write("x")
    for i in range(16000): os.link(f, os.path.join(d,"l%d"%i))
    t=time.time(); subprocess.run(["rm","-rf",d],check=True); return time.time()-t
def renames(base, known):
    d=os.path.join(base,"r%d"%known); os.mkdir(d)
    for i in range(known): open(os.path.join(d,"k%d"%i),"w").close()
    for i in range(known): os.stat(os.path.join(d,"k%d"%i))
    a,b=os.path.join(d,"a"),os.path.join(d,"b"); open(a,"w").close()
    n=2000; t=time.time()
    for i in range(n):
        os.rename(a,b); a,b=b,a
    rate=n/(time.time()-t); shutil.rmtree(d); return rate
for name,base in (("cortexfs",sys.argv[1]),("ext4",sys.argv[2])):
    print("%-8s rm -rf of 16,000 links: %.3f s; renames/s with 100 known: %.0f, with 50,000 known: %.0f" % (name, links(base), renames(base,100), renames(base,50000)))
PY
kill $pid; wait $pid 2>/dev/null || true; rm -rf $d
