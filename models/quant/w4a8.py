"""W4A8 weight quantisation (numpy reference; C++ twin: kvdeck::w4a8_quantize/_dequantize).

Layout (docs/ENGINE.md): codes u8 [N, Kp/2], two int4 per byte, element 2i in the low
nibble, nibble = q + 8 (offset binary, q in [-8, 7]); scales float16 [N, Kp/group].
Kp = K rounded up to 32, padded weights zero. group = 32 by default; group None/0 means
row-wise (group = Kp). group must be even and divide Kp.

Two scale recipes (`recipe=`); both compute every operation in float32 unless stated,
per group of `group` values along K, and share the final step
    d16  = float16(clip(d, -65504.0f, 65504.0f))     (RNE; saturated, never inf)
    dd   = float32(d16)                              (exact)
    q    = clip(rint(w / dd), -8, 7)  if dd != 0 else 0     (rint: nearest-even)

"amax" (the DESIGN recipe, converter_version 1): d = amax / 7.0f, amax = max |w| (exact).
    It never uses the level -8.

"mse" (default): the scale with the least squared error among candidates. With
    amax = max |w| and smax = the first element (lowest k) with |w| == amax (signed):
      candidates, in this order: amax / 7.0f, then smax / c for
      c in (-8.0f, -8.5f, -9.0f, -9.5f, 7.5f)       (signed: c < 0 puts smax on q <= -8)
    For a candidate d (d16, dd, q as above) the error is
      err(d) = sum over j = 0, 1, ..., group-1 in this order of float64(e_j)^2,
      e_j = w_j - float32(q_j) * dd                  (q*dd is exact: one float32 rounding)
    accumulated in float64 (the squares are exact; the sum is sequential). Candidates are
    tried in order and a later one replaces the best only if its error is strictly less.
    Then one least-squares refit: with the best candidate's q,
      num = sum_j float64(w_j) * float64(q_j)  (sequential, float64; each product exact)
      den = sum_j q_j^2                         (exact)
      d   = float32(num / den)                  (float64 division, one RNE to float32)
    is tried as one more candidate (not when den == 0), under the same strict-less rule.
    So the mse error is never above the amax recipe's (its first candidate). Zero groups
    keep the +0 scale of the first candidate. Scales may be negative (the kernels only
    multiply by them).
Dequantisation: w = float32(q) * dd. Inputs must be finite.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .nvfp4 import pack_nibbles, pad_k, unpack_nibbles

__all__ = ["RECIPES", "W4a8Tensor", "quantize_w4a8", "dequantize_w4a8", "resolve_group"]

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


RECIPES = ("mse", "amax")
_MSE_DIVISORS = (-8.0, -8.5, -9.0, -9.5, 7.5)  # smax / c, after amax / 7 (module doc)
_ROWS = 1024  # rows per chunk of the mse search (temporaries stay cache-sized)


def _scale16(d: np.ndarray) -> np.ndarray:
    """f32 scales -> f16 (saturated to +-65504, never inf)."""
    return np.clip(d, -_F16_MAX, _F16_MAX).astype(np.float16)


def _round_q(wg: np.ndarray, dd: np.ndarray) -> np.ndarray:
    """q = clip(rint(w / dd), -8, 7), 0 where dd == 0. wg f32 [R, ng, G], dd f32 [R, ng]."""
    ok = dd != 0
    q = np.rint(wg / np.where(ok, dd, np.float32(1))[:, :, None])  # q: f32 [R, ng, G]
    q = np.clip(q, -8, 7)
    if not ok.all():
        q[~ok] = 0
    return q


def _seq_sum(t: np.ndarray) -> np.ndarray:
    """f64 [R, ng, G] -> f64 [R, ng]: sum over the last axis in index order (sequential)."""
    acc = t[:, :, 0].copy()
    for j in range(1, t.shape[2]):
        acc += t[:, :, j]
    return acc


def _sq_err(wg: np.ndarray, q: np.ndarray, dd: np.ndarray) -> np.ndarray:
    """Recipe error: sequential float64 sum of float64(w - q*dd)^2 per group. f64 [R, ng]."""
    e = (wg - q * dd[:, :, None]).astype(np.float64)   # e: f64 [R, ng, G] (q*dd exact)
    return _seq_sum(e * e)


def _mse_scales(wg: np.ndarray) -> np.ndarray:
    """The "mse" recipe's f16 scales of one row chunk. wg f32 [R, ng, G] -> f16 [R, ng]."""
    a = np.abs(wg)                                                   # a: f32 [R, ng, G]
    idx = a.argmax(axis=2)                                           # first maximum
    smax = np.take_along_axis(wg, idx[:, :, None], axis=2)[:, :, 0]  # smax: f32 [R, ng]
    amax = np.abs(smax)                                              # amax: f32 [R, ng]
    best16 = _scale16(amax / np.float32(7.0))                        # best16: f16 [R, ng]
    bestq = _round_q(wg, best16.astype(np.float32))                  # bestq: f32 [R, ng, G]
    best = _sq_err(wg, bestq, best16.astype(np.float32))             # best: f64 [R, ng]

    def attempt(d16, track_q):
        nonlocal best16, bestq, best
        dd = d16.astype(np.float32)
        q = _round_q(wg, dd)
        err = _sq_err(wg, q, dd)
        m = err < best                                               # strictly less
        best = np.where(m, err, best)
        best16 = np.where(m, d16, best16)
        if track_q:
            bestq = np.where(m[:, :, None], q, bestq)

    for c in _MSE_DIVISORS:
        attempt(_scale16(smax / np.float32(c)), True)
    qq = bestq.astype(np.float64)
    num = _seq_sum(wg.astype(np.float64) * qq)                       # num: f64 [R, ng]
    den = _seq_sum(qq * qq)                                          # den: f64 [R, ng], exact
    ok = den != 0
    d = (num / np.where(ok, den, 1.0)).astype(np.float32)            # d: f32 [R, ng]
    attempt(np.where(ok, _scale16(d), best16), False)                # den == 0: the best again
    return best16


def quantize_w4a8(w, group: int | None = 32, recipe: str = "mse") -> W4a8Tensor:
    """f32 [N, K] -> W4a8Tensor, bit-exact with kvdeck::w4a8_quantize (module doc).

    recipe: "mse" (default; least squared error over scale candidates + one refit) or
    "amax" (d = amax/7, the DESIGN recipe of converter_version 1).
    """
    if recipe not in RECIPES:
        raise ValueError(f"unknown w4a8 recipe {recipe!r}; expected one of {RECIPES}")
    w = np.ascontiguousarray(w, dtype=np.float32)  # w: f32 [N, K]
    if w.ndim != 2:
        raise ValueError(f"quantize_w4a8 expects a 2-D array, got shape {w.shape}")
    N, K = w.shape
    wp = pad_k(w)                                   # wp: f32 [N, Kp]
    Kp = wp.shape[1]
    G = resolve_group(group, Kp)
    wg = wp.reshape(N, Kp // G, G)                  # wg: f32 [N, Kp/G, G]
    if recipe == "amax" or not wg.size:
        amax = np.abs(wg).max(axis=2) if wg.size else np.zeros((N, Kp // G), np.float32)
        d16 = _scale16(amax / np.float32(7.0))      # d16: f16 [N, Kp/G]
    else:
        d16 = np.empty((N, Kp // G), dtype=np.float16)
        for r in range(0, N, _ROWS):
            d16[r:r + _ROWS] = _mse_scales(wg[r:r + _ROWS])
    dd = d16.astype(np.float32)                     # dd: f32 [N, Kp/G]
    q = _round_q(wg, dd)                            # q: f32 [N, Kp/G, G]
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
