"""A plain numpy forward pass of the Llama family over a kvdeck model folder.

The oracle the engine is checked against: no paging, no quantised arithmetic, float64
throughout. Quantised linears are dequantised with the reference codecs of models.quant.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from models.quant import dequantize_linear


class NumpyLlama:
    def __init__(self, folder: Path):
        self.cfg = json.loads((folder / "config.json").read_text())
        self.t = load_file(str(folder / "model.safetensors"))
        c = self.cfg
        self.H, self.nh, self.nkv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        self.D = c.get("head_dim") or self.H // self.nh
        self.eps = c["rms_norm_eps"]
        d = self.D
        self.inv_freq = (1.0 / (np.float32(c["rope_theta"]) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)))).astype(np.float64)
        self._w: dict[str, np.ndarray] = {}

    def linear(self, prefix: str, K: int) -> np.ndarray:
        """W f64 [N, K] for a linear stored in any format."""
        if prefix not in self._w:
            if prefix + ".weight" in self.t:
                w = self.t[prefix + ".weight"].astype(np.float64)
            elif prefix == "lm_head" and not any(k.startswith("lm_head") for k in self.t):
                w = self.embedding()
            else:
                entries = {k[len(prefix) + 1:]: v for k, v in self.t.items() if k.startswith(prefix + ".weight")}
                if entries["weight.codes"].dtype == np.int8:  # w8a8
                    w = (np.repeat(entries["weight.scales"].astype(np.float64), 32, axis=1) * entries["weight.codes"])[:, :K]
                elif "weight.mins" in entries:  # w4a8 + GGUF Q4_1 minimums
                    from models.quant.gguf_blocks import dequantize_w4a8

                    w = dequantize_w4a8(entries["weight.codes"], entries["weight.scales"], entries["weight.mins"])[:, :K].astype(np.float64)
                else:
                    fmt = "nvfp4" if "weight.tscale" in entries else "w4a8"
                    w = dequantize_linear(entries, fmt, K).astype(np.float64)
            self._w[prefix] = w
        return self._w[prefix]

    def embedding(self) -> np.ndarray:
        """f64 [V, H]: f32 / f16 rows, or int8 codes with an f16 scale per 32 (w8a8)."""
        if "model.embed_tokens.weight" in self.t:
            return self.t["model.embed_tokens.weight"].astype(np.float64)
        codes, scales = self.t["model.embed_tokens.weight.codes"], self.t["model.embed_tokens.weight.scales"]
        return (np.repeat(scales.astype(np.float64), 32, axis=1) * codes)[:, : self.H]

    def vec(self, name: str) -> np.ndarray:
        return self.t[name].astype(np.float64)

    def rmsnorm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def rope(self, x: np.ndarray) -> np.ndarray:
        """x [T, heads, D] rotated at positions 0..T-1 (rotate-half)."""
        T = x.shape[0]
        ang = np.arange(T, dtype=np.float64)[:, None] * self.inv_freq[None, :]  # [T, D/2]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        h = self.D // 2
        a, b = x[..., :h], x[..., h:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)

    def logits(self, ids: list[int]) -> np.ndarray:
        """f64 [T, V] logits of every position."""
        c, H, D, nh, nkv = self.cfg, self.H, self.D, self.nh, self.nkv
        T = len(ids)
        x = self.embedding()[ids]  # [T, H]
        mask = np.triu(np.full((T, T), -np.inf), 1)
        for layer in range(c["num_hidden_layers"]):
            p = f"model.layers.{layer}."
            h = self.rmsnorm(x, self.vec(p + "input_layernorm.weight"))
            q = h @ self.linear(p + "self_attn.q_proj", H).T
            k = h @ self.linear(p + "self_attn.k_proj", H).T
            v = h @ self.linear(p + "self_attn.v_proj", H).T
            if c.get("attention_bias"):
                q += self.vec(p + "self_attn.q_proj.bias")
                k += self.vec(p + "self_attn.k_proj.bias")
                v += self.vec(p + "self_attn.v_proj.bias")
            q, k, v = q.reshape(T, nh, D), k.reshape(T, nkv, D), v.reshape(T, nkv, D)
            if c.get("qk_norm"):
                q = self.rmsnorm(q, self.vec(p + "self_attn.q_norm.weight"))
                k = self.rmsnorm(k, self.vec(p + "self_attn.k_norm.weight"))
            q, k = self.rope(q), self.rope(k)
            rep = nh // nkv
            k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
            s = np.einsum("thd,shd->hts", q, k) / np.sqrt(D) + mask  # [nh, T, T]
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = np.einsum("hts,shd->thd", s, v).reshape(T, nh * D)
            x = x + o @ self.linear(p + "self_attn.o_proj", nh * D).T
            h = self.rmsnorm(x, self.vec(p + "post_attention_layernorm.weight"))
            g = h @ self.linear(p + "mlp.gate_proj", H).T
            u = h @ self.linear(p + "mlp.up_proj", H).T
            x = x + (g / (1 + np.exp(-g)) * u) @ self.linear(p + "mlp.down_proj", c["intermediate_size"]).T
        x = self.rmsnorm(x, self.vec("model.norm.weight"))
        return x @ self.linear("lm_head", H).T
