"""A torch forward of the Llama family (float32 by default, float64 for GPTQ) over f32 tensors
under Hugging Face names.

The model pipeline's own forward (models/ never imports app): GPTQ (models/quant/gptq.py)
runs it layer by layer over the calibration text to record each linear's inputs, and the
fidelity experiments run it with a hook on every linear's input.

Architectures as docs/ENGINE.md: llama (Llama 3.x, SmolLM2), qwen2 (q/k/v biases),
qwen3 (q/k norm); RoPE rotate-half (HF layout), GQA, RMSNorm, SiLU-gated MLP, tied or
untied head. Llama-3 rope_scaling is applied to the inverse frequencies.

`Lin` is the hook of one linear: lin(name, x [M, K] f32, w [N, K] f32) -> y [M, N]; the
default is x @ w.T. Names are HF prefixes ("model.layers.3.mlp.down_proj", "lm_head").
"""

from __future__ import annotations

import math
import warnings
from typing import Callable

import numpy as np
import torch

Lin = Callable[[str, torch.Tensor, torch.Tensor], torch.Tensor]

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def plain(name: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w.T


def _inv_freq(meta: dict, exact: bool = False) -> np.ndarray:
    """The RoPE inverse frequencies: float32 as transformers computes them, or (exact) float64
    from the C library's scalar pow, element by element (numpy's vector pow differs by an ulp
    between SIMD paths, and GPTQ must not depend on the machine)."""
    D, theta = int(meta["head_dim"]), float(meta["rope_theta"])
    if exact:
        inv = np.array([1.0 / math.pow(theta, i / D) for i in range(0, D, 2)], np.float64)
    else:  # the correctly rounded f32 theta^(i/D), as torch's powf (app/engine/loader.py)
        expo = np.arange(0, D, 2, dtype=np.float32) / np.float32(D)
        inv = np.float32(1.0) / np.array([math.pow(theta, float(x)) for x in expo]).astype(np.float32)
    rs = meta.get("rope_scaling") or {}
    if rs.get("rope_type", rs.get("type")) == "llama3":  # as transformers' _compute_llama3_parameters
        factor, lo, hi = float(rs["factor"]), float(rs.get("low_freq_factor", 1.0)), float(rs.get("high_freq_factor", 4.0))
        old = float(rs["original_max_position_embeddings"])
        wl = 2 * math.pi / inv
        smooth = (old / wl - lo) / (hi - lo)
        scaled = np.where(wl > old / lo, inv / factor, inv)
        mid = (wl <= old / lo) & (wl >= old / hi)
        inv = np.where(mid, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    return np.asarray(inv, np.float64 if exact else np.float32)


class TorchLlama:
    """meta: config keys (hidden_size, heads, head_dim, rms_norm_eps, rope_theta, ...);
    tensors: HF name -> f32 array (linears [N, K]); the tied head reads the embedding.
    dtype: the forward's precision (the tensors are widened to it; float64 makes the result
    independent of which SIMD paths this machine's torch takes, to rounding at 1e-16)."""

    def __init__(self, meta: dict, tensors: dict[str, np.ndarray], dtype: torch.dtype = torch.float32):
        self.meta = meta
        self.dtype = dtype
        self.np_dtype = np.float64 if dtype == torch.float64 else np.float32
        with warnings.catch_warnings():  # read-only source arrays: never written (set_weight replaces)
            warnings.simplefilter("ignore", UserWarning)
            self.t = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=self.np_dtype)) for k, v in tensors.items()}
        self.L = int(meta["num_hidden_layers"])
        self.nh, self.nkv, self.D = int(meta["num_attention_heads"]), int(meta["num_key_value_heads"]), int(meta["head_dim"])
        self.eps = float(meta["rms_norm_eps"])
        self.inv_freq = torch.from_numpy(_inv_freq(meta, exact=dtype == torch.float64))

    def w(self, prefix: str) -> torch.Tensor:
        if prefix == "lm_head" and "lm_head.weight" not in self.t:
            return self.t["model.embed_tokens.weight"]
        return self.t[prefix + ".weight"]

    def set_weight(self, prefix: str, w: np.ndarray) -> None:
        self.t[prefix + ".weight"] = torch.from_numpy(np.ascontiguousarray(w, dtype=self.np_dtype))

    def rmsnorm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps) * w

    def rope(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, heads, D] rotated at positions 0..T-1 (rotate-half)."""
        T = x.shape[1]
        ang = torch.arange(T, dtype=self.dtype)[:, None] * self.inv_freq[None, :]  # [T, D/2]
        cos, sin = torch.cos(ang)[None, :, None, :], torch.sin(ang)[None, :, None, :]
        h = self.D // 2
        a, b = x[..., :h], x[..., h:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    def embed(self, ids: np.ndarray) -> torch.Tensor:
        """ids int [B, T] -> x f32 [B, T, H]."""
        return self.t["model.embed_tokens.weight"][torch.from_numpy(np.asarray(ids, np.int64))]

    def layer(self, l: int, x: torch.Tensor, lin: Lin = plain) -> torch.Tensor:
        """One transformer block over x [B, T, H] (each row of B a sequence from position 0)."""
        B, T, H = x.shape
        p = f"model.layers.{l}."
        nh, nkv, D = self.nh, self.nkv, self.D

        def L(name, inp):
            y = lin(p + name, inp.reshape(B * T, -1), self.w(p + name))
            b = self.t.get(p + name + ".bias")
            return (y if b is None else y + b).reshape(B, T, -1)

        h = self.rmsnorm(x, self.t[p + "input_layernorm.weight"])
        q = L("self_attn.q_proj", h).reshape(B, T, nh, D)
        k = L("self_attn.k_proj", h).reshape(B, T, nkv, D)
        v = L("self_attn.v_proj", h).reshape(B, T, nkv, D)
        if self.meta.get("qk_norm"):
            q = self.rmsnorm(q, self.t[p + "self_attn.q_norm.weight"])
            k = self.rmsnorm(k, self.t[p + "self_attn.k_norm.weight"])
        q, k = self.rope(q), self.rope(k)
        rep = nh // nkv
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)  # [B, nh, T, D]
        o = o.transpose(1, 2).reshape(B, T, nh * D)
        x = x + L("self_attn.o_proj", o)
        h = self.rmsnorm(x, self.t[p + "post_attention_layernorm.weight"])
        g, u = L("mlp.gate_proj", h), L("mlp.up_proj", h)
        return x + L("mlp.down_proj", torch.nn.functional.silu(g) * u)

    def head(self, x: torch.Tensor, lin: Lin = plain) -> torch.Tensor:
        B, T, H = x.shape
        h = self.rmsnorm(x, self.t["model.norm.weight"]).reshape(B * T, H)
        return lin("lm_head", h, self.w("lm_head")).reshape(B, T, -1)

    @torch.no_grad()
    def logits(self, ids, lin: Lin = plain) -> np.ndarray:
        """ids [T] or [B, T] -> f32 logits [T, V] or [B, T, V]."""
        a = np.asarray(ids)
        x = self.embed(a.reshape(1, -1) if a.ndim == 1 else a)
        for l in range(self.L):
            x = self.layer(l, x, lin)
        y = self.head(x, lin).numpy()
        return y[0] if a.ndim == 1 else y


def fake_q8(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """The engine's int8 activation rounding (models/quant/q8.py) applied in float: x [M, K]."""
    M, K = x.shape
    Kp = -(-K // block) * block
    xp = torch.nn.functional.pad(x, (0, Kp - K)).reshape(M, Kp // block, block)
    amax = xp.abs().amax(-1, keepdim=True)
    ok = amax > 0
    inv = torch.where(ok, 127.0 / torch.where(ok, amax, 1.0), 0.0)
    q = torch.clamp(torch.round(xp * inv), -127, 127)
    return (q * (amax / 127.0)).reshape(M, Kp)[:, :K]
