"""W4A8 weight quantisation (numpy reference; C++ twin: kvdeck::w4a8_quantize/_dequantize).

Layout (docs/ENGINE.md): codes u8 [N, Kp/2], two int4 per byte, element 2i in the low
nibble, nibble = q + 8 (offset binary, q in [-8, 7]); scales float16 [N, Kp/group].
Kp = K rounded up to 32, padded weights zero. group = 32 by default; group None/0 means
row-wise (group = Kp). group must be even and divide Kp.

Quantisation recipe, every operation in float32 unless stated, per group of `group`
values along K:
    amax = max |w|                                   (exact)
    d    = amax / 7.0f
    d16  = float16(min(d, 65504.0f))                 (RNE; saturated, never inf)
    dd   = float32(d16)                              (exact)
    q    = clip(rint(w / dd), -8, 7)  if dd != 0 else 0     (rint: nearest-even)
Dequantisation: w = float32(q) * dd. Inputs must be finite.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .nvfp4 import pack_nibbles, pad_k, unpack_nibbles

__all__ = ["W4a8Tensor", "quantize_w4a8", "dequantize_w4a8", "resolve_group"]

_F16_MAX = np.float32(65504.0)


class W4a8Tensor(NamedTuple):
    codes: np.ndarray   # u8 [N, Kp/2], nibble = q + 8, element 2i in the low nibble
    scales: np.ndarray  # f16 [N, Kp/group]
    group: int          # values per scale (Kp for row-wise)
    K: int              # logical K (columns before padding)


def resolve_group(group, Kp: int) -> int:
    """group None/0 -> Kp (row-wise); otherwise check it is even and divides Kp."""
    if not group:
        return Kp
    group = int(group)
    if group <= 0 or group % 2 or Kp % group:
        raise ValueError(f"w4a8 group {group} must be even and divide Kp={Kp}")
    return group


def quantize_w4a8(w, group: int | None = 32) -> W4a8Tensor:
    """f32 [N, K] -> W4a8Tensor, bit-exact with kvdeck::w4a8_quantize (module doc)."""
    w = np.ascontiguousarray(w, dtype=np.float32)  # w: f32 [N, K]
    if w.ndim != 2:
        raise ValueError(f"quantize_w4a8 expects a 2-D array, got shape {w.shape}")
    N, K = w.shape
    wp = pad_k(w)                                   # wp: f32 [N, Kp]
    Kp = wp.shape[1]
    G = resolve_group(group, Kp)
    wg = wp.reshape(N, Kp // G, G)                  # wg: f32 [N, Kp/G, G]
    amax = np.abs(wg).max(axis=2) if wg.size else np.zeros((N, Kp // G), np.float32)
    d = amax / np.float32(7.0)                      # d: f32 [N, Kp/G]
    d16 = np.minimum(d, _F16_MAX).astype(np.float16)  # d16: f16 [N, Kp/G]
    dd = d16.astype(np.float32)                     # dd: f32 [N, Kp/G]
    ok = dd != 0
    q = np.rint(wg / np.where(ok, dd, np.float32(1))[:, :, None])  # q: f32 [N, Kp/G, G]
    q = np.clip(q, -8, 7)
    if not ok.all():
        q[~ok] = 0
    nib = (q.astype(np.int8) + np.int8(8)).view(np.uint8).reshape(N, Kp)  # nib: u8 [N, Kp]
    return W4a8Tensor(pack_nibbles(nib), d16, G, K)


def dequantize_w4a8(t: W4a8Tensor) -> np.ndarray:
    """W4a8Tensor -> f32 [N, K]: w = float32(q) * float32(scale), padding dropped."""
    codes = np.asarray(t.codes, dtype=np.uint8)     # codes: u8 [N, Kp/2]
    N, Kp = codes.shape[0], codes.shape[1] * 2
    scales = np.asarray(t.scales, dtype=np.float16)  # scales: f16 [N, Kp/G]
    G = Kp // scales.shape[1] if scales.shape[1] else Kp
    q = unpack_nibbles(codes).astype(np.float32) - np.float32(8)  # q: f32 [N, Kp]
    w = q.reshape(N, Kp // G, G) * scales.astype(np.float32)[:, :, None]
    return np.ascontiguousarray(w.reshape(N, Kp)[:, : t.K])
