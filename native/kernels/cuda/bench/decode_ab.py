"""Interleaved A/B of the decode step's switches in one process (on a CUDA machine).

    python3 native/kernels/cuda/bench/decode_ab.py [smollm2] [8b [pf8b]] [--reps R]

Each variant is an engine built with its environment switches set (the backend reads them
when it is created; the CUDA graph is captured under them); the same random tensors serve
every variant of a model. Repetitions
alternate between the variants (R rounds of `steps` greedy decode steps each, median per
variant), so a drift of the machine hits all alike; the timed steps stay inside one context
bucket of the step key (backend.h step_begin). SmolLM2-135M-shaped: nvfp4 layers, w8a8
head, f16 KV, after a 64-token prompt; Llama-3-8B-shaped: nvfp4 layers and head, nvfp4 KV,
after 16 tokens, with the roofline of app/bench/gpu.py (weights + KV bytes over the copy).
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

from app.bench import gpu, gpu_model

SMOL = [("defaults", {}),
        ("ATTN_Q8=0 (o's q8 kernel: session 6's step)", {"KVDECK_CUDA_ATTN_Q8": "0"}),
        ("COMBINE_TRIGGER=0 (q8 in the combine, no trigger)", {"KVDECK_CUDA_COMBINE_TRIGGER": "0"}),
        ("GEMV_GU=1 (gate/up at four chunks a lane, not pipelined)", {"KVDECK_CUDA_GEMV_GU": "1"})]
BIG = [("defaults", {}),
       ("ATTN_Q8=0 (o's q8 kernel: session 6's step)", {"KVDECK_CUDA_ATTN_Q8": "0"}),
       ("COMBINE_TRIGGER=1 (q8 in the combine, early trigger)", {"KVDECK_CUDA_COMBINE_TRIGGER": "1"}),
       ("GEMV_GU=0 (gate/up pipelined at two chunks: session 7's step)", {"KVDECK_CUDA_GEMV_GU": "0"})]


def build(env: dict, *args, **kw):
    with gpu_model.switches(env):  # read at backend creation
        return gpu_model.build(*args, **kw)


def ab(name: str, variants, make, ctx: int, steps: int, reps: int, floor=None, after=None) -> dict:
    """floor: engine -> the roofline µs of its step (or None); after: called with the first
    variant's engine once the decode rounds are done (the 32-layer prefill A/B)."""
    runs = []
    for label, env in variants:
        eng = build(env, *make[0], **make[1])
        s = eng.open_sequence(0)
        with gpu_model.switches(env):  # the eager step and the capture run under the switches too
            tok = eng.forward_greedy(s, np.random.default_rng(1).integers(100, 30000, ctx).astype(np.int32), None)
            for _ in range(3):
                tok = eng.forward_greedy(s, np.array([tok], np.int32), None)
        runs.append([label, eng, s, tok, []])
    for _ in range(reps):
        for r in runs:
            eng, s, tok = r[1], r[2], r[3]
            t0 = time.perf_counter()
            for _ in range(steps):
                tok = eng.forward_greedy(s, np.array([tok], np.int32), None)
            r[4].append((time.perf_counter() - t0) / steps * 1e6)
            r[3] = tok
    out = {}
    base = statistics.median(runs[0][4])
    floor_us = floor(runs[0][1]) if floor else None
    for label, eng, s, _, t in runs:
        us = statistics.median(t)
        out[label] = us
        roof = f", {floor_us / us:.3f} of roofline" if floor_us else ""
        print(f"  {name} {label:48s} {us:8.1f} µs/token (min {min(t):7.1f}; x{base / us:5.3f} vs the first){roof}",
              flush=True)
        eng.close_sequence(s)
    if after:
        after(runs[0][1])
    return out


def main(argv: list[str]) -> int:
    reps = int(argv[argv.index("--reps") + 1]) if "--reps" in argv else 7
    gbs = gpu.copy_gbs()
    print(f"device: {gpu.device_name()}; copy {gbs or 0:.0f} GB/s", flush=True)
    if "smollm2" in argv:
        t = gpu_model.random_tensors("smollm2-135m", "nvfp4", "w8a8", seed=0)
        ab("smollm2 f16 KV @64", SMOL, (("smollm2-135m", "nvfp4", "f16", "cuda"), dict(tensors=t, max_context=4096)),
           64, 24, reps)  # 64 + 3 + 7 x 24 tokens: one context bucket (256)
    if "8b" in argv:
        t0 = time.perf_counter()
        t = gpu_model.random_tensors("llama3-8b", "nvfp4", "nvfp4", seed=0, embed="f16")
        print(f"  (8b tensors {time.perf_counter() - t0:.1f} s)", flush=True)
        mid = 16 + reps * 32 // 2  # the context half way through the timed steps

        def floor(eng):
            wb = eng.weight_bytes - 128256 * 4096 * 2  # the embedding table: one row a token
            return (wb + mid * eng.kv_bytes_per_token) / (gbs * 1e9) * 1e6 if gbs else None

        def prefill(eng):  # pf8b: bench gpu's 32-layer prefill A/B (new GEMM, v1, NVFP4 on the f16 mma)
            pf = gpu.prefill_ab(eng, 512, 3)
            print("  8b prefill 512, 32 layers, interleaved: " + ", ".join(
                f"{arm} {tps:7.0f} tok/s (x{tps / pf['new']:.3f})" for arm, tps in pf.items())
                + f"; new = {pf['new'] / gpu.LLAMA_CPP_PP512_8B:.3f}x llama.cpp pp512", flush=True)

        ab("8b nvfp4 KV @16", BIG, (("llama3-8b", "nvfp4", "nvfp4", "cuda"),
                                    dict(tensors=t, head="nvfp4", max_context=8192, embed="f16")), 16, 32, reps, floor,
           prefill if "pf8b" in argv else None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
