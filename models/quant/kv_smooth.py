"""Per-channel smoothing of K and V folded into the weights (exact in real arithmetic).

Attention reads q·k and p·v. Dividing K's channel c by s_c and multiplying q's channel c by
s_c leaves every q·k unchanged; dividing V's channel c by t_c and multiplying the matching
input columns of W_o by t_c leaves every output unchanged. The KV cache then stores K/s and
V/t, whose channels are flatter, so a 4-bit block of 16 channels is not set by one outlier
channel. Folded into the weights, nothing changes at run time.

Constraints:
  * RoPE (rotate-half, docs/ENGINE.md) rotates the pair (i, i + D/2): s_i = s_{i+D/2}, so one
    factor per pair, from the pair's norm sqrt(k_i^2 + k_{i+D/2}^2) (invariant under RoPE).
  * GQA: a KV head's s multiplies the q rows of every q head of its group.
  * Biases (qwen2) are scaled with their rows. qk_norm (qwen3) normalises k before a per-channel
    weight shared by all heads: there s is per layer (shared by the heads) and is folded into
    k_norm.weight / q_norm.weight instead of the projections.

Factors (calibrated on the calibration text, never the evaluation text), per layer and KV head:
    s_pair = kmax_pair^alpha          (kmax_pair: max over tokens of the pair norm)
    t_c    = vmax_c^alpha_v           (vmax_c: max over tokens of |v_c|)
each normalised so the head's largest channel lands on LEVEL (inside E4M3's normal range,
since today's nvfp4 KV fixes the second-level scale at 1). alpha = 0 leaves that side alone.

Measured (app/bench/kv_probe.py, "sm<a>_<av>:" variants, 2,048 eval tokens, f32 weights, every
read from the pages): top-1 against f16 KV, nvfp4 0.833; K smoothed alpha 1: 0.790, 0.75:
0.819, 0.5: 0.819, 0.25: 0.826; K and V alpha 1: 0.789, 0.5: 0.809; V alone alpha 1: 0.835
(V's error is small to begin with). It does not pay: K's error is not
channel imbalance within a row but the rows themselves (pre-RoPE K is ~80% one mean vector per
head; see the probe's "pce" and "cr:" variants), and flattening the channels takes the block
maximum away from K's largest channel, which nvfp4 otherwise keeps to E4M3's precision. So
the converter does not apply it; `fold` is kept, tested exact, for studies that do.
"""

from __future__ import annotations

import numpy as np

LEVEL = 32.0  # the largest smoothed channel of a head (block scales then sit near 32/6 ~ 5)


def factors(kmax_pair: np.ndarray, vmax: np.ndarray, alpha: float, alpha_v: float,
            level: float = LEVEL, shared_heads: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """kmax_pair [L, nkv, D/2], vmax [L, nkv, D] (calibration maxima) -> (s, t), f32 [L, nkv, D].
    shared_heads: one factor per layer for all KV heads (qk_norm models)."""
    kp = np.maximum(np.asarray(kmax_pair, np.float64), 1e-6)
    vm = np.maximum(np.asarray(vmax, np.float64), 1e-6)
    if shared_heads:
        kp = np.broadcast_to(kp.max(1, keepdims=True), kp.shape)
        vm = np.broadcast_to(vm.max(1, keepdims=True), vm.shape)

    def side(m, a):
        if a == 0:
            return np.ones_like(m)
        f = m ** a
        return f * ((m / f).max(-1, keepdims=True) / level)  # max_c m_c / f_c == level

    sp = side(kp, alpha)
    s = np.concatenate([sp, sp], -1)
    return s.astype(np.float32), side(vm, alpha_v).astype(np.float32)


def fold(tensors: dict[str, np.ndarray], meta: dict, s: np.ndarray, t: np.ndarray) -> dict[str, np.ndarray]:
    """A new {HF name: f32 array} with s, t [L, nkv, D] folded in (module docstring); the
    arrays not touched are shared with `tensors`."""
    L, nh, nkv, D = (int(meta[k]) for k in ("num_hidden_layers", "num_attention_heads",
                                             "num_key_value_heads", "head_dim"))
    if s.shape != (L, nkv, D) or t.shape != (L, nkv, D):
        raise ValueError(f"smoothing factors of shape {s.shape} / {t.shape}, expected {(L, nkv, D)}")
    G = nh // nkv
    out = dict(tensors)
    qk_norm = bool(meta.get("qk_norm"))
    for l in range(L):
        p = f"model.layers.{l}.self_attn."
        sk = s[l].reshape(-1).astype(np.float64)            # per k row
        sq = np.repeat(s[l], G, axis=0).reshape(-1)          # per q row (head j -> group j // G)
        tv = t[l].reshape(-1).astype(np.float64)
        to = np.repeat(t[l], G, axis=0).reshape(-1)          # per W_o input column
        if qk_norm:  # s shared by the heads: fold into the norms' per-channel weights
            out[p + "k_norm.weight"] = (tensors[p + "k_norm.weight"] / s[l, 0]).astype(np.float32)
            out[p + "q_norm.weight"] = (tensors[p + "q_norm.weight"] * s[l, 0]).astype(np.float32)
        else:
            out[p + "k_proj.weight"] = _rows(tensors[p + "k_proj.weight"], 1.0 / sk)
            out[p + "q_proj.weight"] = _rows(tensors[p + "q_proj.weight"], sq)
            for n, f in (("k_proj.bias", 1.0 / sk), ("q_proj.bias", sq)):
                if p + n in tensors:
                    out[p + n] = (np.asarray(tensors[p + n], np.float64) * f).astype(np.float32)
        out[p + "v_proj.weight"] = _rows(tensors[p + "v_proj.weight"], 1.0 / tv)
        if p + "v_proj.bias" in tensors:
            out[p + "v_proj.bias"] = (np.asarray(tensors[p + "v_proj.bias"], np.float64) / tv).astype(np.float32)
        wo = np.asarray(tensors[p + "o_proj.weight"], np.float64)
        out[p + "o_proj.weight"] = (wo * to[None, :]).astype(np.float32)
    return out


def _rows(w: np.ndarray, f: np.ndarray) -> np.ndarray:
    return (np.asarray(w, np.float64) * f[:, None]).astype(np.float32)


def pair_norm(k: np.ndarray) -> np.ndarray:
    """k [..., D] -> [..., D/2]: sqrt(k_i^2 + k_{i+D/2}^2), the RoPE-invariant magnitude."""
    h = k.shape[-1] // 2
    return np.sqrt(k[..., :h] ** 2 + k[..., h:] ** 2)
