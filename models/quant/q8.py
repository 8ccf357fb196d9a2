"""Run-time int8 activation quantisation (numpy oracle of kvdeck::quantize_act_q8).

Per row, per block of 32 along K (rows zero-padded from K to Kp = K rounded up to 32),
every operation in float32:
    amax = max |x|                                   (exact)
    d    = amax / 127.0f
    inv  = 127.0f / amax
    q    = clip(rint(x * inv), -127, 127)  (rint: nearest-even)   if amax > 0
    q    = 0, d = 0                                               if amax == 0
    s    = sum of the block's q (int32)
Inputs must be finite; amax below ~3.7e-37 (where 127/amax overflows) is unspecified.
"""
from __future__ import annotations

import numpy as np

__all__ = ["Q8_BLOCK", "quantize_act_q8"]

Q8_BLOCK = 32


def quantize_act_q8(x):
    """f32 [M, K] -> (q int8 [M, Kp], d f32 [M, Kp/32], s int32 [M, Kp/32])."""
    x = np.ascontiguousarray(x, dtype=np.float32)  # x: f32 [M, K]
    if x.ndim != 2:
        raise ValueError(f"quantize_act_q8 expects a 2-D array, got shape {x.shape}")
    M, K = x.shape
    Kp = -(-K // Q8_BLOCK) * Q8_BLOCK
    xp = np.zeros((M, Kp), dtype=np.float32)       # xp: f32 [M, Kp]
    xp[:, :K] = x
    xb = xp.reshape(M, Kp // Q8_BLOCK, Q8_BLOCK)   # xb: f32 [M, Kp/32, 32]
    amax = np.abs(xb).max(axis=2) if xb.size else np.zeros((M, Kp // Q8_BLOCK), np.float32)
    ok = amax > 0                                  # ok: bool [M, Kp/32]
    d = np.where(ok, amax / np.float32(127.0), np.float32(0)).astype(np.float32)
    inv = np.float32(127.0) / np.where(ok, amax, np.float32(1))  # inv: f32 [M, Kp/32]
    q = np.clip(np.rint(xb * inv[:, :, None]), -127, 127)        # q: f32 [M, Kp/32, 32]
    q[~ok] = 0
    q = q.astype(np.int8)
    s = q.sum(axis=2, dtype=np.int32)              # s: i32 [M, Kp/32]
    return q.reshape(M, Kp), d, s
