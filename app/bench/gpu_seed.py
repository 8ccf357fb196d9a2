"""`kvdeck bench gpu`'s seed-000 rows: the agent task's TTFT per call with the prefix cache on
and off, on the CUDA backend (and the CPU backend of the same machine beside it).

The task is `kvdeck bench cache`'s synthetic seed-000 task (app/bench/cache.py: system prompt
800 tokens, tool schemas 2000, first user message 400, then 500 new tokens per call, --gen
tokens generated greedily per call) on a random-weight SmolLM2-135M-shaped model in the
default folder's formats (nvfp4 layers, 8-bit head; app/bench/gpu_model.py): the time of each
call depends on shapes, formats and token counts, not on the weights' values, and the device
machine cannot receive the real weights. Every computed token is counted: the ledger's
computed tokens of each call are printed beside its TTFT.
"""

from __future__ import annotations

import time
from pathlib import Path

from app.bench import gpu_model
from app.bench.cache import run_task
from app.engine import Engine, ModelConfig


def _config(shape: str) -> ModelConfig:
    s = gpu_model.SHAPES[shape]
    return ModelConfig(
        model=f"{shape} (random weights)", architecture="llama", hidden_size=s["hidden"],
        intermediate_size=s["intermediate"], num_hidden_layers=s["n_layers"], num_attention_heads=s["n_heads"],
        num_key_value_heads=s["n_kv_heads"], head_dim=s["head_dim"], vocab_size=s["vocab"],
        rope_theta=s["rope_theta"], rms_norm_eps=1e-5, max_position_embeddings=8192,
        tie_word_embeddings=s["tied"], attention_bias=False, qk_norm=False, bos_token_id=None,
        eos_token_id=None, stop_token_ids=(), chat_format="chatml", weight_format="nvfp4")


def task(device: str, kv: str, calls: int, gen: int, tensors) -> dict:
    """Cache off, then on (fresh cache), for one backend; per-call ledger and TTFT."""
    cfg = _config("smollm2-135m")
    runs = {}
    for cache in (False, True):
        native = gpu_model.build("smollm2-135m", "nvfp4", kv, device, tensors=tensors, max_context=8192,
                                 prefix_cache=cache)
        eng = Engine(native, cfg, tokenizer=None, folder=Path("."), prefix_cache=cache)
        run_task(eng, 1, 2)  # warm-up: graphs captured, kernels loaded (not part of the figures)
        eng.clear_cache()
        t = time.perf_counter()
        stats = run_task(eng, calls, gen)
        runs[cache] = (time.perf_counter() - t, stats)
        del eng, native
    (t_off, s_off), (t_on, s_on) = runs[False], runs[True]
    return {
        "device": device, "kv": kv, "calls": calls, "gen": gen, "total_s_off": t_off, "total_s_on": t_on,
        "speedup": t_off / t_on,
        "per_call": [{"call": i + 1, "prompt": a.prompt_tokens, "cached_on": a.cached_tokens,
                      "computed_on": a.computed_tokens, "computed_off": b.computed_tokens,
                      "ttft_on_s": a.ttft_s, "ttft_off_s": b.ttft_s} for i, (a, b) in enumerate(zip(s_on, s_off))],
    }


def seed000(out: dict, calls: int = 4, gen: int = 64, devices: tuple[str, ...] = ("cuda", "cpu")) -> None:
    t = gpu_model.random_tensors("smollm2-135m", "nvfp4", "w8a8", seed=0)
    rows = []
    for device in devices:
        r = task(device, "f16", calls, gen, t)
        rows.append(r)
        print(f"  seed-000 task ({calls} calls, {gen} tokens each, f16 KV) on {device}: "
              f"total {r['total_s_off']:.2f} s without the cache -> {r['total_s_on']:.2f} s with it "
              f"({r['speedup']:.2f}x)", flush=True)
        for c in r["per_call"]:
            print(f"    call {c['call']}: prompt {c['prompt']:5}, cached {c['cached_on']:5}, computed "
                  f"{c['computed_on']:5} (off: {c['computed_off']:5}); TTFT {c['ttft_off_s'] * 1e3:8.1f} ms off, "
                  f"{c['ttft_on_s'] * 1e3:7.1f} ms on", flush=True)
    out["seed000"] = rows
