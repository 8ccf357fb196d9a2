#!/bin/bash
# The end-to-end A/B of issue 13: `kvdeck bench cpu --no-peer --formats nvfp4,w4a8 --decode-ctx 32`
# under the default kernel set (avx512vnni here) and KVDECK_ISA=avx2, one repetition per process,
# the two alternating (A B B A ...), $1 rounds (default 2). Raw JSON beside this script.
cd "$(dirname "$0")/../../../../../.." || exit 1
D=native/kernels/cpu/bench/results/e2e
R=${1:-2}
for r in $(seq 1 "$R"); do
  if [ $((r % 2)) = 1 ]; then order="default avx2"; else order="avx2 default"; fi
  for isa in $order; do
    echo "== round $r $isa $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    if [ $isa = default ]; then env -u KVDECK_ISA .venv/bin/python -m app bench cpu --no-peer --formats nvfp4,w4a8 --decode-ctx 32 --reps 1 --save $D/${TAG:-}r${r}_$isa.json 2>&1 | tail -12
    else KVDECK_ISA=avx2 .venv/bin/python -m app bench cpu --no-peer --formats nvfp4,w4a8 --decode-ctx 32 --reps 1 --save $D/${TAG:-}r${r}_$isa.json 2>&1 | tail -12; fi
  done
done
echo "== done $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
