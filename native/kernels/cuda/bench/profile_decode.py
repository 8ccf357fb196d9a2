"""Where a decode step's time goes: per-kernel GPU time of the engine's CUDA-graph decode step
(CUPTI through torch.profiler, which records every kernel of the process, ours included).

    python3 native/kernels/cuda/bench/profile_decode.py smollm2-135m|llama3-8b [layers]

Any A/B switch in the environment (e.g. KVDECK_CUDA_CTX_BUCKETS=0) profiles the step under it.
Prints the captured graph's kernel nodes and programmatic (PDL) edges, then per kernel name:
launches per step, µs per step, µs per launch; then the sum of kernel time per step, the GPU span per step (first kernel start to last kernel end: kernel time plus
the gaps between dependent kernels) and the wall time per step (the host's share on top).
"""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from app.bench import gpu_model

STEPS = 10


def main() -> int:
    shape = sys.argv[1]
    os.environ["KVDECK_CUDA_GRAPH_INFO"] = "1"  # the captured step's kernel nodes and PDL edges (stderr)
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else None
    torch.zeros(1, device="cuda")
    big = shape == "llama3-8b"
    eng = gpu_model.build(shape, "nvfp4", "nvfp4" if big else "f16", "cuda", layers=layers, max_context=4096,
                          head="nvfp4" if big else "w8a8", embed="f16" if big else "f32")
    s = eng.open_sequence(0)
    tok = eng.forward_greedy(s, np.arange(1, 65, dtype=np.int32), None)
    for _ in range(5):
        tok = eng.forward_greedy(s, np.array([tok], np.int32), None)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(STEPS):
            tok = eng.forward_greedy(s, np.array([tok], np.int32), None)
        wall = (time.perf_counter() - t0) / STEPS * 1e6
    per = defaultdict(lambda: [0, 0.0])
    lo, hi = float("inf"), 0.0
    for e in prof.events():
        if e.device_type.name != "CUDA" or "memcpy" in e.name.lower() or "memset" in e.name.lower():
            continue
        dur = e.time_range.elapsed_us()
        per[e.name][0] += 1
        per[e.name][1] += dur
        lo, hi = min(lo, e.time_range.start), max(hi, e.time_range.end)
    total = sum(v[1] for v in per.values()) / STEPS
    print(f"{shape} ({layers or 'all'} layers): per decode step")
    for name, (n, us) in sorted(per.items(), key=lambda kv: -kv[1][1])[:20]:
        print(f"  {n / STEPS:6.1f} x {us / STEPS:8.1f} us  ({us / n:6.2f} us each)  {name[:90]}")
    print(f"  kernels {total:.1f} us; GPU span {(hi - lo) / STEPS:.1f} us (with the gaps between steps); wall {wall:.1f} us per step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
