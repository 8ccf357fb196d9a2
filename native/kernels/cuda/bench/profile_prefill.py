"""Where a prefill's time goes: per-kernel GPU time of one M-token prefill of a random-weight
model on the CUDA backend (CUPTI through torch.profiler, which records every kernel of the
process, ours included), grouped by op kind.

    python3 native/kernels/cuda/bench/profile_prefill.py llama3-8b|smollm2-135m [layers] [M] [ab]

Layers default to 8 for llama3-8b (the per-layer figures scale to 32; building the whole model
takes ~20 s of host time for nothing new) and all for smollm2-135m; M defaults to 512. Prints
per kernel name: launches, µs per prefill, µs per launch; then per op kind (gemm, attention,
norm+q8, rope+kv, silu+q8, other), the kernel sum, the GPU span and the wall time per prefill,
and the wall time scaled to the full layer count (layers' share by kernel time, the head as is).
KVDECK_CUDA_MMA=0 in the environment profiles the batch-8 GEMV chunks instead (A/B); `ab`
profiles the same engine again with KVDECK_CUDA_GEMM_NVFP4=i8 (NVFP4 on the int8 mma instead of
the default f16 mma; read at every launch).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections import defaultdict

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from app.bench import gpu_model
from app.bench.gpu_peer import RECORDED_PP512 as LLAMA_CPP_PP512_8B

REPS = 3
KINDS = (("gemm", ("gemm_q8", "gemv")), ("attention", ("attention", "attn")), ("norm+q8", ("rmsnorm", "norm")),
         ("rope+kv", ("rope", "kv_write")), ("silu+q8", ("silu",)), ("quantize", ("quantize",)))


def kind(name: str) -> str:
    low = name.lower()
    for k, keys in KINDS:
        if any(s in low for s in keys):
            return k
    return "other"


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "ab"]
    shape = args[0]
    big = shape == "llama3-8b"
    full = gpu_model.SHAPES[shape]["n_layers"]
    layers = int(args[1]) if len(args) > 1 else (8 if big else full)
    M = int(args[2]) if len(args) > 2 else 512
    torch.zeros(1, device="cuda")
    eng = gpu_model.build(shape, "nvfp4", "nvfp4" if big else "f16", "cuda", layers=layers, max_context=4096,
                          head="nvfp4" if big else "w8a8", embed="f16" if big else "f32", max_chunk=max(512, M))
    report(eng, shape, full, layers, M)
    if "ab" in sys.argv[1:]:  # the same engine: the switch is read at every GEMM launch
        os.environ["KVDECK_CUDA_GEMM_NVFP4"] = "i8"
        print("[KVDECK_CUDA_GEMM_NVFP4=i8: NVFP4 on the int8 mma]")
        report(eng, shape, full, layers, M)
        os.environ.pop("KVDECK_CUDA_GEMM_NVFP4")
    return 0


def report(eng, shape: str, full: int, layers: int, M: int) -> None:
    big = shape == "llama3-8b"
    ids = np.random.default_rng(2).integers(100, 30000, M).astype(np.int32)
    for _ in range(2):  # warm-up: workspaces, module load
        s = eng.open_sequence(0)
        eng.forward_greedy(s, ids, None)
        eng.close_sequence(s)
    walls = []
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPS):
            s = eng.open_sequence(0)
            t0 = time.perf_counter()
            eng.forward_greedy(s, ids, None)
            walls.append(time.perf_counter() - t0)
            eng.close_sequence(s)
    per = defaultdict(lambda: [0, 0.0])
    lo, hi = float("inf"), 0.0
    for e in prof.events():
        if e.device_type.name != "CUDA" or "memcpy" in e.name.lower() or "memset" in e.name.lower():
            continue
        per[e.name][0] += 1
        per[e.name][1] += e.time_range.elapsed_us()
        lo, hi = min(lo, e.time_range.start), max(hi, e.time_range.end)
    total = sum(v[1] for v in per.values()) / REPS
    wall = statistics.median(walls) * 1e6
    print(f"{shape} ({layers} of {full} layers), prefill of {M} tokens: per prefill")
    for name, (n, us) in sorted(per.items(), key=lambda kv: -kv[1][1])[:24]:
        print(f"  {n / REPS:6.1f} x {us / REPS:9.1f} us ({us / n:8.2f} us each)  [{kind(name)}] {name[:100]}")
    kinds = defaultdict(float)
    for name, (_, us) in per.items():
        kinds[kind(name)] += us / REPS
    print("  by kind: " + ", ".join(f"{k} {v:.0f} us ({v / total:.0%})" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])))
    print(f"  kernels {total:.0f} us; GPU span {(hi - lo) / REPS:.0f} us; wall {wall:.0f} us "
          f"({M / wall * 1e6:.0f} tok/s at {layers} layers"
          + (f", {M / wall * 1e6 / LLAMA_CPP_PP512_8B:.2f}x llama.cpp's pp512)" if layers == full and big else ")"))
    if layers != full:
        # the head (final norm + lm_head on the last row) is not per layer: the whole-model
        # estimate scales the wall time less the head's kernels
        head = sum(us for name, (n, us) in per.items() if n == REPS and kind(name) in ("gemm",)) / REPS
        est = (wall - head) * full / layers + head
        print(f"  scaled to {full} layers: ~{est:.0f} us ({M / est * 1e6:.0f} tok/s); "
              f"by kind x{full / layers:.0f}: " + ", ".join(f"{k} {v * full / layers / 1e3:.1f} ms" for k, v in kinds.items()))


if __name__ == "__main__":
    sys.exit(main())
