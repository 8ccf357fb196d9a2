"""NVFP4 weight quantisation (numpy reference; C++ twin: kvdeck::nvfp4_quantize/_dequantize).

Layout (docs/ENGINE.md): codes u8 [N, Kp/2] (two E2M1 per byte, element 2i in the low
nibble), block scales u8 E4M3 [N, Kp/16], one float32 tensor scale g. Kp = K rounded up
to 32; padded weights are zero (padded codes are 0).

Two block-scale recipes (`recipe=`); every operation in float32 (IEEE, round-to-nearest)
unless stated, in this order:
    Wp    = W zero-padded to [N, Kp]
    amax  = max |Wp|                                (exact)
    g     = amax / 2688.0f  if amax > 0 else 1.0f   (2688 = 6 * 448; the format's tensor scale)
    sden  = 6.0f * g
    bmax  = max |Wp[n, 16b : 16b+16]|               (exact)
    s6    = encode_e4m3(bmax / sden)                (u8: the block max on E2M1 level 6)
    s_b   = s6                          ("amax": the DESIGN recipe, converter_version 1)
    s_b   = the mse choice below        ("mse", the default)
    den   = decode_e4m3(s_b) * g
    q     = encode_e2m1(w / den)  if den != 0 else 0   (code 0, i.e. +0)

"mse": s4 = encode_e4m3(bmax / (4.0f * g)) (the block max on level 4: finer steps near the
max, coarser near 0). Candidate codes, in this order, each clamped to [0, 0x7E]:
    s6, s6 - 1, s6 + 1, s4, s4 - 1, s4 + 1
(codes of positive E4M3 values are monotone, so +-1 is the next E4M3 value). For a code s,
with sv = decode_e4m3(s), den and q as above, v_j = decode_e2m1(q_j) and x_j = w_j / g:
    err(s) = sum over j = 0..15 in this order of float64(x_j - v_j * sv)^2
(v * sv is exact, so x - v*sv has one float32 rounding; squares exact, sequential float64
sum: the block's squared error in units of g). A later candidate replaces the best only if
its error is strictly less, so the mse error is never above the amax recipe's (s6 first).
If g == 0 (amax > 0 below ~1.9e-42) every den is 0 and the mse recipe keeps s6.
Dequantisation: w = (decode_e2m1(q) * decode_e4m3(s_b)) * g  (the first product is exact).
Inputs must be finite.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .e2m1 import E2M1_VALUES, encode_e2m1
from .e4m3 import decode_e4m3, encode_e4m3

__all__ = ["RECIPES", "NVFP4_BLOCK", "QUANT_PAD", "Nvfp4Tensor", "quantize_nvfp4", "dequantize_nvfp4",
           "pack_nibbles", "unpack_nibbles", "pad_k"]

NVFP4_BLOCK = 16  # values per E4M3 block scale
QUANT_PAD = 32    # K of quantised weights is padded to a multiple of this
_ROWS = 1024      # rows per chunk in the quantisers (temporaries stay cache-sized)


class Nvfp4Tensor(NamedTuple):
    codes: np.ndarray   # u8 [N, Kp/2], element 2i in the low nibble
    scales: np.ndarray  # u8 (E4M3) [N, Kp/16]
    tscale: np.float32  # g
    K: int              # logical K (columns before padding)


def pad_k(w: np.ndarray) -> np.ndarray:
    """f32 [N, K] -> f32 [N, Kp] with zero columns appended (no copy when K == Kp)."""
    N, K = w.shape
    Kp = -(-K // QUANT_PAD) * QUANT_PAD
    if Kp == K:
        return w
    wp = np.zeros((N, Kp), dtype=np.float32)  # wp: f32 [N, Kp]
    wp[:, :K] = w
    return wp


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """u8 [N, Kp] values < 16 -> u8 [N, Kp/2]; element 2i low nibble, 2i+1 high nibble."""
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_nibbles(codes: np.ndarray) -> np.ndarray:
    """u8 [N, Kp/2] -> u8 [N, Kp] (inverse of pack_nibbles)."""
    N, H = codes.shape
    q = np.empty((N, 2 * H), dtype=np.uint8)  # q: u8 [N, Kp]
    q[:, 0::2] = codes & 0xF
    q[:, 1::2] = codes >> 4
    return q


RECIPES = ("mse", "amax")


def _seq_sum(t: np.ndarray) -> np.ndarray:
    """f64 [R, nb, B] -> f64 [R, nb]: sum over the last axis in index order (sequential)."""
    acc = t[:, :, 0].copy()
    for j in range(1, t.shape[2]):
        acc += t[:, :, j]
    return acc


def _block_err(wb: np.ndarray, x: np.ndarray, s: np.ndarray, g: np.float32) -> np.ndarray:
    """Recipe error of block codes s (u8 [R, nb]) on wb / x = wb/g (f32 [R, nb, 16]). f64 [R, nb]."""
    sv = decode_e4m3(s)                                  # sv: f32 [R, nb]
    den = sv * g
    ok = den != 0
    q = encode_e2m1(wb / np.where(ok, den, np.float32(1))[:, :, None])  # q: u8 [R, nb, 16]
    if not ok.all():
        q[~ok] = 0
    e = (x - E2M1_VALUES[q] * sv[:, :, None]).astype(np.float64)        # e: f64 [R, nb, 16]
    return _seq_sum(e * e)


def _mse_scales(wb: np.ndarray, bmax: np.ndarray, s6: np.ndarray, g: np.float32) -> np.ndarray:
    """The "mse" recipe's block codes of one row chunk: wb f32 [R, nb, 16] -> u8 [R, nb]."""
    x = wb / g                                           # x: f32 [R, nb, 16]
    s4 = encode_e4m3(bmax / (np.float32(4.0) * g)).astype(np.int16)
    best_s = s6
    best = _block_err(wb, x, s6, g)                      # best: f64 [R, nb]
    s6i = s6.astype(np.int16)
    for base, delta in ((s6i, -1), (s6i, 1), (s4, 0), (s4, -1), (s4, 1)):
        s = np.clip(base + delta, 0, 0x7E).astype(np.uint8)
        err = _block_err(wb, x, s, g)
        m = err < best                                   # strictly less
        best = np.where(m, err, best)
        best_s = np.where(m, s, best_s)
    return best_s


def quantize_nvfp4(w, recipe: str = "mse") -> Nvfp4Tensor:
    """f32 [N, K] -> Nvfp4Tensor, bit-exact with kvdeck::nvfp4_quantize (module doc).

    recipe: "mse" (default; per block the least-squared-error E4M3 scale among 6 candidate
    codes) or "amax" (s_b = e4m3(bmax/(6g)), the DESIGN recipe of converter_version 1).
    """
    if recipe not in RECIPES:
        raise ValueError(f"unknown nvfp4 recipe {recipe!r}; expected one of {RECIPES}")
    w = np.ascontiguousarray(w, dtype=np.float32)  # w: f32 [N, K]
    if w.ndim != 2:
        raise ValueError(f"quantize_nvfp4 expects a 2-D array, got shape {w.shape}")
    N, K = w.shape
    wp = pad_k(w)                                   # wp: f32 [N, Kp]
    Kp = wp.shape[1]
    nb = Kp // NVFP4_BLOCK
    wb = wp.reshape(N, nb, NVFP4_BLOCK)             # wb: f32 [N, Kp/16, 16]
    bmax = np.zeros((N, nb), dtype=np.float32)      # bmax: f32 [N, Kp/16]
    for r in range(0, N, _ROWS):                    # row chunks keep temporaries in cache
        bmax[r:r + _ROWS] = np.abs(wb[r:r + _ROWS]).max(axis=2, initial=np.float32(0))
    amax = np.float32(bmax.max(initial=np.float32(0)))
    g = np.float32(amax / np.float32(2688.0)) if amax > 0 else np.float32(1.0)
    sden = np.float32(6.0) * g
    scales = encode_e4m3(bmax / sden)               # scales: u8 [N, Kp/16]
    if recipe == "mse" and g != 0:
        for r in range(0, N, _ROWS):
            scales[r:r + _ROWS] = _mse_scales(wb[r:r + _ROWS], bmax[r:r + _ROWS],
                                              scales[r:r + _ROWS], g)
    den = decode_e4m3(scales) * g                   # den: f32 [N, Kp/16]
    ok = den != 0                                   # ok: bool [N, Kp/16]
    den1 = np.where(ok, den, np.float32(1))[:, :, None]  # den1: f32 [N, Kp/16, 1]
    q = np.empty((N, nb, NVFP4_BLOCK), dtype=np.uint8)   # q: u8 [N, Kp/16, 16]
    for r in range(0, N, _ROWS):
        q[r:r + _ROWS] = encode_e2m1(wb[r:r + _ROWS] / den1[r:r + _ROWS])
    if not ok.all():
        q[~ok] = 0
    return Nvfp4Tensor(pack_nibbles(q.reshape(N, Kp)), scales, np.float32(g), K)


def dequantize_nvfp4(t: Nvfp4Tensor) -> np.ndarray:
    """Nvfp4Tensor -> f32 [N, K]: w = (e2m1(q) * e4m3(s_b)) * g, padding dropped."""
    codes = np.asarray(t.codes, dtype=np.uint8)     # codes: u8 [N, Kp/2]
    N, Kp = codes.shape[0], codes.shape[1] * 2
    vals = E2M1_VALUES[unpack_nibbles(codes)].reshape(N, Kp // NVFP4_BLOCK, NVFP4_BLOCK)
    sv = decode_e4m3(t.scales)                      # sv: f32 [N, Kp/16]
    w = (vals * sv[:, :, None]) * np.float32(t.tscale)  # w: f32 [N, Kp/16, 16]
    return np.ascontiguousarray(w.reshape(N, Kp)[:, : t.K])
