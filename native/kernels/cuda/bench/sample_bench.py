"""A sampled, masked decode step on the CUDA backend: the token chosen on the device
(Engine.forward_sample: the mask goes up as bits, one id comes back) against the host path it
replaced (the [V] logits downloaded, np.where(mask), Sampler.sample), and greedy on the device.

    PYTHONPATH=. python3 native/kernels/cuda/bench/sample_bench.py [--shape smollm2-135m] [--steps 32]

Random-weight model (app/bench/gpu_model.py), nvfp4 weights, f16 KV, after a 64-token prefill;
the mask allows a random 5% of the vocabulary and changes every token (as a grammar's does).
Median µs per token over interleaved rounds (A, B, C, A, B, C, ...); the device and host paths
are checked to choose the same ids.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from app.bench import gpu_model
from app.engine import _native


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="smollm2-135m")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    eng = gpu_model.build(a.shape, "nvfp4", "f16", a.device, layers=a.layers)
    V = gpu_model.native_config(a.shape, a.layers)["vocab"]
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, 30000, 64).astype(np.int32)
    masks = [rng.random(V) < 0.05 for _ in range(a.steps)]
    T, K, P = 0.8, 0, 0.95

    def run(mode: str) -> tuple[float, list[int]]:
        s = eng.open_sequence(0)
        try:
            tok = eng.forward_greedy(s, prompt, None)
            for _ in range(3):  # the eager step, the capture, a replay
                tok = eng.forward_greedy(s, np.array([tok], np.int32), None)
            sampler, out = _native.Sampler(7), []
            t0 = time.perf_counter()
            for m in masks:
                ids = np.array([tok], np.int32)
                if mode == "device":
                    tok = eng.forward_sample(s, ids, sampler, T, K, P, m, None)
                elif mode == "host":
                    lg = np.where(m, eng.forward(s, ids, False, None), np.float32(-np.inf)).astype(np.float32)
                    tok = sampler.sample(lg, T, K, P)
                else:
                    tok = eng.forward_greedy(s, ids, None)
                out.append(tok)
            return (time.perf_counter() - t0) / len(masks) * 1e6, out
        finally:
            eng.close_sequence(s)

    times: dict[str, list[float]] = {"device": [], "host": [], "greedy": []}
    same = True
    for _ in range(a.rounds):
        got = {}
        for mode in times:
            us, got[mode] = run(mode)
            times[mode].append(us)
        same &= got["device"] == got["host"]
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{a.shape} (V {V}) sampled T={T} top_p={P}, 5% mask, us/token (median of {a.rounds}):")
    print(f"  device sample {med['device']:.0f}   host sample {med['host']:.0f}   device greedy {med['greedy']:.0f}"
          f"   host/device {med['host'] / med['device']:.2f}   same ids: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
