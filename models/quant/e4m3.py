"""float8_e4m3fn codec (numpy reference; C++ twin: kvdeck::f32_to_e4m3 / e4m3_to_f32).

Format: 1 sign, 4 exponent (bias 7), 3 mantissa bits. No infinities; 0x7F and 0xFF are
NaN; max finite 448 (0x7E); subnormals 0x01..0x07 = m * 2^-9; -0.0 is 0x80.

Encoding contract (all integer arithmetic on the float32 bit pattern, so the C++ twin is
the same algorithm line for line):
  - sign bit of the input is kept in every case (including -0.0 and NaN);
  - NaN -> 0x7F | sign;  |x| >= 448 (including inf) -> 0x7E | sign (saturate);
  - 2^-6 <= |x| < 448 (normal): round the 23-bit mantissa to 3 bits, nearest-even;
  - |x| < 2^-6 (subnormal): round |x| / 2^-9 to an integer 0..8, nearest-even
    (8 is the smallest normal, 0x08).
|x| in [448, 464] rounds to 448 under RNE anyway; above 464 the saturation is our choice
(torch 2.13's CPU cast happens to saturate as well, including inf -> 448).
"""
from __future__ import annotations

import numpy as np

__all__ = ["E4M3_MAX", "E4M3_VALUES", "encode_e4m3", "decode_e4m3"]

E4M3_MAX = np.float32(448.0)

_F32_MIN_NORMAL_E4M3 = 0x3C800000  # bits of 2^-6, the smallest e4m3 normal
_F32_448 = 0x43E00000              # bits of 448.0
_F32_INF = 0x7F800000


def _build_table() -> np.ndarray:
    """All 256 decoded values; NaN codes hold the quiet NaN 0x7FC00000 | sign."""
    c = np.arange(256, dtype=np.int64)  # c: [256]
    e = (c >> 3) & 0xF
    m = (c & 7).astype(np.float64)
    mag = np.where(e == 0, np.ldexp(m, -9), np.ldexp(1.0 + m / 8.0, (e - 7).astype(np.int64)))
    val = np.where(c >= 128, -mag, mag).astype(np.float32)  # val: f32 [256]
    bits = val.view(np.uint32)
    bits[0x7F] = 0x7FC00000
    bits[0xFF] = 0xFFC00000
    return val


E4M3_VALUES = _build_table()  # f32 [256], indexed by code
E4M3_VALUES.setflags(write=False)


def encode_e4m3(x) -> np.ndarray:
    """float32 array (any shape) -> uint8 e4m3fn codes (same shape). See module doc."""
    x = np.ascontiguousarray(x, dtype=np.float32)  # x: f32 [...]
    bits = x.view(np.uint32)                      # bits: u32 [...]
    sign = ((bits >> 24) & 0x80).astype(np.uint8)  # sign: u8 [...]
    a = bits & np.uint32(0x7FFFFFFF)              # a: u32 [...], |x| bits

    # normal range: keep 3 mantissa bits, round-to-nearest-even via the carry trick,
    # then rebias the exponent from 127 to 7 (carries flow into the exponent).
    normal = ((a + np.uint32(0x7FFFF) + ((a >> 20) & 1)) >> 20) - np.uint32((127 - 7) << 3)

    # subnormal range: value in units of 2^-9 is mant >> (141 - e); shifts >= 25 give 0.
    e = (a >> 23).astype(np.int32)
    mant = np.where(e > 0, (a & np.uint32(0x7FFFFF)) | np.uint32(0x800000), 0).astype(np.uint32)
    sh = np.clip(141 - e, 21, 25).astype(np.uint32)
    sub = (mant + ((np.uint32(1) << (sh - 1)) - 1) + ((mant >> sh) & 1)) >> sh

    code = np.where(a >= _F32_MIN_NORMAL_E4M3, normal, sub)
    code = np.where(a >= _F32_448, 0x7E, code)
    code = np.where(a > _F32_INF, 0x7F, code)
    return code.astype(np.uint8) | sign


def decode_e4m3(b) -> np.ndarray:
    """uint8 e4m3fn codes (any shape) -> float32 values (same shape); 0x7F/0xFF -> NaN."""
    b = np.asarray(b, dtype=np.uint8)  # b: u8 [...]
    return E4M3_VALUES[b]
