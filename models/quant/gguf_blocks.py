"""GGUF Q4_0 / Q4_1 / Q8_0 blocks repacked, without rounding, into kvdeck's integer layouts.

The exact import of a GGUF file (weights format "gguf"): the file's own 4- and 8-bit blocks
become the engine's weights bit for bit, so the model that runs is the model that shipped.

GGUF block layouts (ggml-common.h; gguf-py's quants.py decodes them the same way), 32 values:
  Q4_0: d f16, qs u8[16]: value j in the low nibble of qs[j], value j+16 in the high nibble;
        w = d * (q - 8).
  Q4_1: d f16, m f16, qs u8[16] as Q4_0;  w = d * q + m.
  Q8_0: d f16, qs i8[32];                 w = d * q.
kvdeck layouts (native/include/kvdeck/formats.h):
  w4a8 group 32: codes u8 [N, Kp/2] (element 2i in the low nibble), nibble = q (offset 8),
        scales f16 [N, Kp/32]; optional mins f16 [N, Kp/32] (Q4_1): w = d * nibble + m.
  w8a8: codes i8 [N, Kp], scales f16 [N, Kp/32].
Rows are whole blocks along K (K % 32 == 0 in every GGUF quantised row), so a row permutation
(the converter un-permutes GGUF's Q/K rows) moves blocks intact.

Contracts: pure functions of numpy arrays; `dequantize_*` state the float operations the
engine's kernels assume, and equal gguf-py's dequantisation bit for bit (tests).
"""

from __future__ import annotations

import numpy as np

BLOCK = 32
BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


def _blocks(raw: np.ndarray, n: int, k: int, kind: str) -> np.ndarray:
    """raw u8 (any shape holding n*k/32 blocks) -> u8 [n, k/32, bytes per block]."""
    if k % BLOCK:
        raise ValueError(f"{kind}: row length {k} is not a multiple of {BLOCK}")
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    need = n * (k // BLOCK) * BYTES[kind]
    if raw.size != need:
        raise ValueError(f"{kind}: {raw.size} bytes for [{n}, {k}], expected {need}")
    return raw.reshape(n, k // BLOCK, BYTES[kind])


def _nibbles_to_codes(qs: np.ndarray) -> np.ndarray:
    """qs u8 [n, nb, 16] in GGUF order -> codes u8 [n, nb*16] with element 2i in the low nibble."""
    lo, hi = qs & 0x0F, qs >> 4  # [n, nb, 16]: values 0..15 and 16..31 of each block
    q = np.concatenate([lo, hi], axis=2)  # [n, nb, 32] in element order
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8).reshape(qs.shape[0], -1)


def q4_to_w4a8(raw: np.ndarray, n: int, k: int, kind: str) -> dict[str, np.ndarray]:
    """Q4_0 or Q4_1 -> {"codes" u8 [n, k/2], "scales" f16 [n, k/32], + "mins" f16 for Q4_1}."""
    b = _blocks(raw, n, k, kind)
    d = b[..., 0:2].copy().view(np.float16)[..., 0]  # [n, nb]
    if kind == "Q4_0":
        return {"codes": _nibbles_to_codes(b[..., 2:18]), "scales": np.ascontiguousarray(d)}
    if kind == "Q4_1":
        m = b[..., 2:4].copy().view(np.float16)[..., 0]
        return {"codes": _nibbles_to_codes(b[..., 4:20]), "scales": np.ascontiguousarray(d),
                "mins": np.ascontiguousarray(m)}
    raise ValueError(f"not a 4-bit GGUF block kind: {kind}")


def q8_0_to_w8a8(raw: np.ndarray, n: int, k: int) -> dict[str, np.ndarray]:
    """Q8_0 -> {"codes" i8 [n, k], "scales" f16 [n, k/32]}."""
    b = _blocks(raw, n, k, "Q8_0")
    d = b[..., 0:2].copy().view(np.float16)[..., 0]
    q = b[..., 2:34].copy().view(np.int8).reshape(n, k)
    return {"codes": q, "scales": np.ascontiguousarray(d)}


def dequantize_w4a8(codes: np.ndarray, scales: np.ndarray, mins: np.ndarray | None = None) -> np.ndarray:
    """f32 [n, Kp]: d * (nibble - 8), or with mins d * nibble + m (f32 arithmetic, group 32)."""
    nib = np.empty((codes.shape[0], codes.shape[1] * 2), np.float32)
    nib[:, 0::2] = codes & 0x0F
    nib[:, 1::2] = codes >> 4
    d = np.repeat(scales.astype(np.float32), BLOCK, axis=1)
    if mins is None:
        return d * (nib - 8.0)
    return d * nib + np.repeat(mins.astype(np.float32), BLOCK, axis=1)


def dequantize_w8a8(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """f32 [n, Kp]: d * q."""
    return np.repeat(scales.astype(np.float32), BLOCK, axis=1) * codes.astype(np.float32)
