"""8-bit weights per 32-block (the engine's W8A8; GGUF Q8_0's recipe), numpy reference.

Per row, per block of 32 along K (rows zero-padded to Kp), every operation in float32:
    amax = max |w|
    d    = f16(amax / 127)          (stored f16; the kernels read it as f32)
    q    = clip(rint(w / f32(d)), -127, 127)   if d > 0, else 0
    w'   = f32(d) * q
The tied head of a 4-bit folder may use it (`[quant] head = "w8a8"`): the head is the one
linear whose 4-bit rounding costs several points of next-token agreement on small models.
"""
from __future__ import annotations

import numpy as np

BLOCK = 32


def quantize_w8a8(w: np.ndarray) -> dict[str, np.ndarray]:
    """f32 [N, K] -> {"codes": i8 [N, Kp], "scales": f16 [N, Kp/32]}."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"quantize_w8a8 expects a 2-D array, got shape {w.shape}")
    N, K = w.shape
    Kp = -(-K // BLOCK) * BLOCK
    wp = np.zeros((N, Kp), np.float32)
    wp[:, :K] = w
    wb = wp.reshape(N, Kp // BLOCK, BLOCK)
    amax = np.abs(wb).max(axis=2)
    d16 = (amax / np.float32(127.0)).astype(np.float16)
    d = d16.astype(np.float32)
    ok = d > 0
    q = np.clip(np.rint(wb / np.where(ok, d, np.float32(1))[:, :, None]), -127, 127)
    q[~ok] = 0
    return {"codes": q.astype(np.int8).reshape(N, Kp), "scales": d16}


def dequantize_w8a8(codes: np.ndarray, scales: np.ndarray, K: int | None = None) -> np.ndarray:
    """f32 [N, K]: f32(d) * q."""
    w = np.repeat(scales.astype(np.float32), BLOCK, axis=1) * codes.astype(np.float32)
    return w if K is None else w[:, :K]
