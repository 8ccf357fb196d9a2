"""Decode attention through the CUDA backend, every KV pool format, with and without the step's
own row unrounded (attention_fresh): µs per layer, KV GB/s, time over f16's at the same context.

    python3 native/kernels/cuda/bench/attn_formats.py [--ctx 4096,16384,32768] [--reps 7]
    python3 native/kernels/cuda/bench/attn_formats.py --prefill [--p0 0,4096] [--m 512]

f32 / nvfp4r / k8v4 rows are timed twice, interleaved: the default split kernel (f32 SIMT, the
others on the tensor cores; column "kernel" split) and the f32 paged kernel it replaced
(KVDECK_CUDA_ATTN_DECODE=paged, "paged").
--prefill: M new queries at p0 (every format; nvfp4 with its own rows unrounded as the engine
runs it) on the default tensor-core prefill kernel (mma) against the f32 paged kernel
(KVDECK_CUDA_ATTN_PREFILL=paged), interleaved, same backend build.

One layer of Llama-3-8B (32 q heads, 8 KV heads, D 128, pages of 16) through
BackendOps.attention_timing: `layers` pools, each its own memory (>= 256 MB of KV in all, past
the 60 MB L2), one attention per layer a pass, host-timed around a sync; the best of the
passes over layers. Launch-inclusive (each layer is 2-3 launches), so the kernel bench
(gpu_bench, CUDA graphs) reads slightly lower for the same kernel.
"""
from __future__ import annotations

import argparse
import sys

from app.bench import gpu_model
from app.engine import _native

def kv_bytes(kv: str, D: int) -> int:
    """A token's K row + V row of one KV head (kv_pool.h)."""
    nv = D // 2 + D // 16
    return {"f32": 8 * D, "f16": 4 * D, "nvfp4": 2 * nv, "nvfp4r": 2 * (nv + 2), "k8v4": D + 2 + nv + 2}[kv]


def backend(**env: str):
    """A CUDA backend created under `env` (the kernel switches are read at creation)."""
    with gpu_model.switches(env):
        return _native.BackendOps("cuda", 0)


def prefill(a) -> int:
    nh, nkv, D = 32, 8, 128
    old = backend(KVDECK_CUDA_ATTN_PREFILL="paged")
    new = backend(KVDECK_CUDA_ATTN_PREFILL="mma")
    print(f"{'kv':<8}{'fresh':<7}{'M':>5}{'p0':>6} {'mma us':>9} {'paged us':>9} {'speed-up':>9}")
    for p0 in (int(x) for x in a.p0.split(",")):
        for kv, fresh in (("f32", False), ("f16", False), ("nvfp4", True), ("nvfp4r", True), ("k8v4", True)):
            layers = 8
            best = {}
            for _ in range(2):  # interleaved: new, old, new, old
                for name, ops in (("mma", new), ("paged", old)):
                    secs, _ = ops.attention_timing(nh, nkv, D, p0, a.m, kv=kv, layers=layers, repeat=a.reps,
                                                   fresh=fresh)
                    best[name] = min(best.get(name, 1e9), min(secs) / layers * 1e6)
            print(f"{kv:<8}{'yes' if fresh else 'no':<7}{a.m:>5}{p0:>6} {best['mma']:>9.1f} {best['paged']:>9.1f} "
                  f"{best['paged'] / best['mma']:>8.1f}x", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", default="4096,16384,32768")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--formats", default="f16,f32,nvfp4,nvfp4r,k8v4")
    ap.add_argument("--prefill", action="store_true")
    ap.add_argument("--p0", default="0,4096")
    ap.add_argument("--m", type=int, default=512)
    a = ap.parse_args()
    if a.prefill:
        return prefill(a)
    kernels = {"split": backend(), "paged": backend(KVDECK_CUDA_ATTN_DECODE="paged")}
    nh, nkv, D = 32, 8, 128
    print(f"{'kv':<8}{'fresh':<7}{'kernel':<9}{'ctx':>7} {'us/layer':>9} {'GB/s':>7} {'x f16':>6}")
    for ctx in (int(c) for c in a.ctx.split(",")):
        base = None
        for kv in a.formats.split(","):
            for fresh in (False, True):
                if fresh and kv == "f16":
                    continue
                for kern in ("split", "paged") if kv in ("f32", "nvfp4r", "k8v4") else ("split",):
                    per_layer = ctx * nkv * kv_bytes(kv, D)
                    layers = max(2, min(64, (256 << 20) // per_layer + 1))
                    secs, _ = kernels[kern].attention_timing(nh, nkv, D, ctx - 1, 1, kv=kv, layers=layers,
                                                             repeat=a.reps, fresh=fresh)
                    us = min(secs) / layers * 1e6
                    if kv == "f16":
                        base = us
                    print(f"{kv:<8}{'yes' if fresh else 'no':<7}{kern:<9}{ctx:>7} {us:>9.1f} "
                          f"{per_layer / us / 1e3:>7.0f} {us / base if base else float('nan'):>6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
