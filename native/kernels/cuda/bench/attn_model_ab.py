"""The attention kernels' A/B through the whole model on the CUDA backend (random weights in the
engine's formats, app/bench/gpu_model.py): prefill tok/s (512 tokens) with the default
tensor-core prefill attention against the f32 paged kernel (KVDECK_CUDA_ATTN_PREFILL=paged),
and decode µs/token with the default split kernels against the paged kernel
(KVDECK_CUDA_ATTN_DECODE=paged; only f32 / nvfp4r / k8v4 KV differ). Arms alternate repetition
by repetition (engines built once per arm; the switches are read at backend creation); best of
the repetitions.

    python3 native/kernels/cuda/bench/attn_model_ab.py [--prefill] [--decode] [--big]
"""
from __future__ import annotations

import argparse
import sys

from app.bench import gpu_model
from app.bench.gpu import decode_us, prefill_tps

ARMS = {"default": {}, "paged": {"KVDECK_CUDA_ATTN_PREFILL": "paged", "KVDECK_CUDA_ATTN_DECODE": "paged"}}


def _build(env: dict, *args, **kw):
    with gpu_model.switches(env):  # read at backend creation
        return gpu_model.build(*args, **kw)


def prefill(model: str, kv: str, reps: int, **kw) -> None:
    big = model.startswith("llama")
    t = gpu_model.random_tensors(model, "nvfp4", kw.get("head", "w8a8"), seed=0, embed=kw.get("embed", "f32"))
    engs = {arm: _build(env, model, "nvfp4", kv, "cuda", tensors=t, max_context=8192, **kw) for arm, env in ARMS.items()}
    best: dict[str, float] = {}
    for _ in range(reps):
        for arm, eng in engs.items():
            best[arm] = max(best.get(arm, 0.0), prefill_tps(eng, 512, 1 if big else 2))
    print(f"prefill 512 {model} nvfp4 weights, {kv} KV: tensor-core attention {best['default']:.0f} tok/s, "
          f"paged {best['paged']:.0f} ({best['default'] / best['paged']:.2f}x)", flush=True)


def decode(model: str, kv: str, ctx: int, reps: int) -> None:
    t = gpu_model.random_tensors(model, "nvfp4", "w8a8", seed=0)
    engs = {arm: _build(env, model, "nvfp4", kv, "cuda", tensors=t, max_context=8192) for arm, env in ARMS.items()}
    best: dict[str, float] = {}
    for _ in range(reps):
        for arm, eng in engs.items():
            best[arm] = min(best.get(arm, 1e18), decode_us(eng, ctx, 32, 2))
    print(f"decode @{ctx} {model} nvfp4 weights, {kv} KV: split kernel {best['default']:.1f} us/token, "
          f"paged {best['paged']:.1f} ({best['paged'] / best['default']:.2f}x)", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefill", action="store_true")
    ap.add_argument("--decode", action="store_true")
    ap.add_argument("--big", action="store_true", help="also the Llama-3-8B-shaped prefill")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    if a.prefill:
        for kv in ("f32", "f16", "nvfp4", "k8v4"):
            prefill("smollm2-135m", kv, a.reps)
        if a.big:
            prefill("llama3-8b", "nvfp4", 2, head="nvfp4", embed="f16")
    if a.decode:
        for kv in ("f32", "nvfp4r", "k8v4"):
            decode("smollm2-135m", kv, 512, a.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
