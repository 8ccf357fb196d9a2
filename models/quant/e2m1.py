"""E2M1 (FP4) codec (numpy reference; C++ twin: kvdeck::f32_to_e2m1 / e2m1_to_f32).

A code c in [0, 16): bit 3 is the sign, bits 0..2 index the magnitudes
{0, 0.5, 1, 1.5, 2, 3, 4, 6}. Bit 0 is the mantissa bit, so "ties to even mantissa"
is "ties to the even code".

Encoding contract: sign = the float32 sign bit (so -0.0 and tiny negatives give 0x8);
magnitude a = |x| maps to
    code = [a > 0.25] + [a >= 0.75] + [a > 1.25] + [a >= 1.75]
         + [a > 2.5]  + [a >= 3.5]  + [a > 5]
(strict '>' where the tie goes down to an even code, '>=' where it goes up to one),
which is round-to-nearest-even on the grid with saturation to 6 (inf -> 6).
NaN compares false everywhere and encodes to 0 | sign (torch's _f32_to_floatx_unpacked
returns an arbitrary code for NaN; E2M1 has no NaN).

Speed: encode_e2m1 evaluates that definition through a lookup table. Every threshold has
at most 2 mantissa bits, so it starts a bucket of the float32 bit pattern >> 20 (sign,
exponent, 3 mantissa bits); a bucket's values all share one code except its first value
(exactly the threshold). The table index is (bits >> 19) | (low 20 bits != 0), 8192
entries, filled by the comparison definition (_encode_e2m1_cmp).
"""
from __future__ import annotations

import numpy as np

__all__ = ["E2M1_VALUES", "E2M1_MAX", "encode_e2m1", "decode_e2m1"]

E2M1_MAX = np.float32(6.0)
_MAGS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
E2M1_VALUES = np.array(_MAGS + [-v for v in _MAGS], dtype=np.float32)  # f32 [16], by code
E2M1_VALUES.setflags(write=False)

# (threshold, tie goes up) in increasing order; see the module doc.
_THRESHOLDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True),
               (2.5, False), (3.5, True), (5.0, False))


def _encode_e2m1_cmp(x) -> np.ndarray:
    """The defining comparison form of encode_e2m1 (slower; used to fill the table)."""
    x = np.ascontiguousarray(x, dtype=np.float32)  # x: f32 [...]
    sign = ((x.view(np.uint32) >> 28) & 0x8).astype(np.uint8)  # sign: u8 [...], 0 or 8
    a = np.abs(x)                                   # a: f32 [...]
    code = np.zeros(x.shape, dtype=np.uint8)        # code: u8 [...]
    for t, up in _THRESHOLDS:
        code += (a >= np.float32(t)) if up else (a > np.float32(t))
    code |= sign
    return code


def decode_e2m1(c) -> np.ndarray:
    """uint8 codes (any shape; only the low 4 bits are read) -> float32 values."""
    c = np.asarray(c, dtype=np.uint8)  # c: u8 [...]
    return E2M1_VALUES[c & 0xF]


def _build_table() -> np.ndarray:
    i = np.arange(8192, dtype=np.uint32)          # i: u32 [8192]
    rep = ((i >> 1) << 20) + (i & 1)              # bucket start, or start + 1 ulp (interior)
    return _encode_e2m1_cmp(rep.view(np.float32))  # u8 [8192]


_TABLE = _build_table()
_TABLE.setflags(write=False)


def encode_e2m1(x) -> np.ndarray:
    """float32 array (any shape) -> uint8 codes in [0, 16) (same shape). See module doc."""
    x = np.ascontiguousarray(x, dtype=np.float32)  # x: f32 [...]
    bits = x.view(np.uint32)                        # bits: u32 [...]
    idx = (bits >> 19) | ((bits & np.uint32(0xFFFFF)) != 0)  # idx: u32 [...] in [0, 8192)
    return _TABLE[idx]
