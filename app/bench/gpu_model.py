"""Random-weight models in the engine's own formats, built straight into a native engine.

`bench gpu` and tests/cuda compare the CUDA backend with the CPU backend and time it on a
GPU machine that has no model files (and could not receive them: the device call carries at
most 64 MiB). The codes and scales are drawn at random in the layouts of kvdeck/formats.h
(no quantiser runs), scaled so that weights have a standard deviation near 0.02, as a
trained model's do; norms are 1. Speed depends only on shapes and formats, so a random
SmolLM2-135M-shaped model decodes exactly as fast as the real one; CUDA-vs-CPU agreement is
checked on identical bytes.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np

from app.engine import _native
from app.engine.loader import upload_arrays

# (hidden, intermediate, layers, heads, kv heads, head_dim, vocab, rope_theta, tied)
SHAPES = {
    "smollm2-135m": dict(hidden=576, intermediate=1536, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64,
                         vocab=49152, rope_theta=100000.0, tied=True),
    "llama3-8b": dict(hidden=4096, intermediate=14336, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
                      vocab=128256, rope_theta=500000.0, tied=False),
}
STD = 0.02


def native_config(shape: str, layers: int | None = None) -> dict:
    s = SHAPES[shape]
    d = s["head_dim"]
    inv = (1.0 / (np.float32(s["rope_theta"]) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d))))
    return {"hidden": s["hidden"], "intermediate": s["intermediate"], "n_layers": layers or s["n_layers"],
            "n_heads": s["n_heads"], "n_kv_heads": s["n_kv_heads"], "head_dim": d, "vocab": s["vocab"],
            "rms_eps": 1e-5, "rope_inv_freq": inv.astype(np.float32).tolist()}


def _linear(rng: np.random.Generator, fmt: str, N: int, K: int) -> dict[str, np.ndarray]:
    """One linear weight [N, K] as the WeightsBuilder reads it (suffix -> array)."""
    Kp = -(-K // 32) * 32
    if fmt == "f32":
        return {".weight": (rng.standard_normal((N, K), np.float32) * STD)}
    if fmt == "f16":
        return {".weight": (rng.standard_normal((N, K), np.float32) * STD).astype(np.float16)}
    if fmt == "nvfp4":  # E2M1 codes uniform (mean |v| 2.25), E4M3 scales in [0.5, 2], tensor scale
        codes = rng.integers(0, 256, (N, Kp // 2), dtype=np.uint8)
        scales = rng.integers(0x30, 0x41, (N, Kp // 16), dtype=np.uint8)  # 0.5 .. 2.0
        return {".weight.codes": codes, ".weight.scales": scales,
                ".weight.tscale": np.array([STD / 2.9], np.float32)}
    if fmt == "w4a8":  # offset-binary nibbles (|q| ~ 4.5), f16 scales per 32
        codes = rng.integers(0, 256, (N, Kp // 2), dtype=np.uint8)
        scales = (rng.uniform(0.5, 1.5, (N, Kp // 32)) * STD / 4.6).astype(np.float16)
        return {".weight.codes": codes, ".weight.scales": scales}
    if fmt == "w8a8":  # int8 codes (|q| ~ 64), f16 scales per 32
        codes = rng.integers(-127, 128, (N, Kp), dtype=np.int8)
        scales = (rng.uniform(0.5, 1.5, (N, Kp // 32)) * STD / 73.0).astype(np.float16)
        return {".weight.codes": codes, ".weight.scales": scales}
    raise ValueError(f"weight format {fmt!r} (f32, f16, nvfp4, w4a8, w8a8)")


def random_tensors(shape: str, weights: str, head: str | None = "w8a8", layers: int | None = None,
                   seed: int = 0, embed: str = "f32") -> tuple[dict[str, np.ndarray], bool]:
    """The tensors of a random model: (name -> array, tie_embeddings). head: the lm_head's
    format (None: tied to the embedding, as the f16/f32 folders are)."""
    s = SHAPES[shape]
    rng = np.random.default_rng(seed)
    H, F, V = s["hidden"], s["intermediate"], s["vocab"]
    QD, KD = s["n_heads"] * s["head_dim"], s["n_kv_heads"] * s["head_dim"]
    t: dict[str, np.ndarray] = {}
    e = rng.standard_normal((V, H), np.float32)
    t["model.embed_tokens.weight"] = e.astype(np.float16) if embed == "f16" else e
    t["model.norm.weight"] = np.ones(H, np.float32)
    if head is not None:
        for k, v in _linear(rng, head, V, H).items():
            t["lm_head" + k] = v
    for layer in range(layers or s["n_layers"]):
        p = f"model.layers.{layer}."
        t[p + "input_layernorm.weight"] = np.ones(H, np.float32)
        t[p + "post_attention_layernorm.weight"] = np.ones(H, np.float32)
        for name, N, K in (("self_attn.q_proj", QD, H), ("self_attn.k_proj", KD, H), ("self_attn.v_proj", KD, H),
                           ("self_attn.o_proj", H, QD), ("mlp.gate_proj", F, H), ("mlp.up_proj", F, H),
                           ("mlp.down_proj", H, F)):
            for k, v in _linear(rng, weights, N, K).items():
                t[p + name + k] = v
    return t, head is None


@contextlib.contextmanager
def switches(env: dict[str, str]):
    """The CUDA backend's environment switches (kernels_cuda.h) set for the block, as they were
    after it: the backend reads most of them when it is created, some at every launch."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def build(shape: str, weights: str, kv: str, device: str, *, head: str | None = "w8a8", layers: int | None = None,
          seed: int = 0, max_context: int = 4096, max_chunk: int = 512, embed: str = "f32", tensors=None,
          prefix_cache: bool = True):
    """A native engine (app.engine._native.Engine) on `device` holding a random model.
    tensors: a random_tensors() result to reuse (the same bytes on two backends)."""
    tensors = tensors or random_tensors(shape, weights, head, layers, seed, embed)
    native = _native.Engine(native_config(shape, layers),
                            {"backend": device, "kv": kv, "max_context": max_context, "max_chunk": max_chunk,
                             "prefix_cache": prefix_cache})
    upload_arrays(native, tensors[0], tensors[1])
    return native
