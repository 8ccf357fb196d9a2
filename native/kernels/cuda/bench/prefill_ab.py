"""Prefill A/B on a CUDA machine, without the decode rounds of decode_ab.py: tok/s of a
512-token prefill, arms interleaved repetition by repetition (medians).

    python3 native/kernels/cuda/bench/prefill_ab.py [8b] [smollm2] [--reps R]

8b: the 32-layer Llama-3-8B shape (nvfp4 layers and head, NVFP4 KV, codes drawn on the host
as bench gpu does), the arms of app/bench/gpu.py prefill_ab on one engine (their switches
are read at every launch), with the ratio to llama.cpp's pp512. smollm2: the SmolLM2-135M
shape (nvfp4 layers, w8a8 head, f16 KV), the same arms, then prefill attention as q in
f16 only (KVDECK_CUDA_ATTN_PREFILL=mma16, read when a backend is created: a second engine on
the same tensors) against the default q split into f16 hi + lo, alternated engine by engine.
"""

from __future__ import annotations

import statistics
import sys
import time

from app.bench import gpu, gpu_model


def engines_ab(engines: dict, n: int, reps: int) -> dict[str, float]:
    """One prefill of n tokens per engine per round, rounds alternating; medians."""
    ids = gpu._ids(n, 2)
    times = {k: [] for k in engines}
    for r in range(reps + 1):
        for k, eng in engines.items():
            dt = gpu.prefill_s(eng, ids)
            if r:
                times[k].append(dt)
    return {k: n / statistics.median(t) for k, t in times.items()}


def show(name: str, tps: dict[str, float], peer: float | None = None) -> None:
    first = next(iter(tps.values()))
    print(f"  {name}: " + ", ".join(f"{arm} {v:8.0f} tok/s (x{v / first:.3f})" for arm, v in tps.items())
          + (f"; first = {first / peer:.3f}x llama.cpp pp512 ({peer})" if peer else ""), flush=True)


def main(argv: list[str]) -> int:
    reps = int(argv[argv.index("--reps") + 1]) if "--reps" in argv else 5
    print(f"device: {gpu.device_name()}", flush=True)
    if "8b" in argv:
        t0 = time.perf_counter()
        t = gpu_model.random_tensors("llama3-8b", "nvfp4", "nvfp4", seed=0, embed="f16")
        eng = gpu_model.build("llama3-8b", "nvfp4", "nvfp4", "cuda", tensors=t, head="nvfp4", max_context=8192,
                              embed="f16")
        print(f"  (8b tensors and engine {time.perf_counter() - t0:.1f} s)", flush=True)
        show("8b prefill 512, 32 layers", gpu.prefill_ab(eng, 512, reps), gpu.LLAMA_CPP_PP512_8B)
        del eng, t
    if "smollm2" in argv:
        t = gpu_model.random_tensors("smollm2-135m", "nvfp4", "w8a8", seed=0)
        kw = dict(tensors=t, max_context=4096)
        eng = gpu_model.build("smollm2-135m", "nvfp4", "f16", "cuda", **kw)
        show("smollm2 prefill 512, f16 KV", gpu.prefill_ab(eng, 512, 3 * reps))
        with gpu_model.switches({"KVDECK_CUDA_ATTN_PREFILL": "mma16"}):
            eng16 = gpu_model.build("smollm2-135m", "nvfp4", "f16", "cuda", **kw)
        show("smollm2 prefill 512, f16 KV, attention", engines_ab({"mma": eng, "mma16": eng16}, 512, 3 * reps))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
