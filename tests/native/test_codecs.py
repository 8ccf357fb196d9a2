"""C++ codecs (app.engine._native.formats) against the numpy references, bit for bit.

The numpy references are themselves checked against torch in
tests/unit/test_quant_reference.py; here every C++ twin must reproduce them exactly,
plus f16 against numpy's own float16 cast.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from app.engine import _native
from models.quant.e2m1 import decode_e2m1, encode_e2m1
from models.quant.e4m3 import decode_e4m3, encode_e4m3
from models.quant.nvfp4 import Nvfp4Tensor, dequantize_nvfp4, quantize_nvfp4
from models.quant.w4a8 import W4a8Tensor, dequantize_w4a8, quantize_w4a8

F = _native.formats
RNG = np.random.default_rng(99)


def f32(bits) -> np.ndarray:
    """u32 bit patterns -> f32 [n]."""
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def u32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


def sweep_bits(low_bits: int = 12) -> np.ndarray:
    """All 2^20 float32 top-bit patterns (NaNs included) plus random low bits. f32 [2^21]."""
    hi = np.arange(1 << (32 - low_bits), dtype=np.uint32) << low_bits  # u32 [2^20]
    rnd = hi | RNG.integers(0, 1 << low_bits, hi.shape, dtype=np.uint32)
    return f32(np.concatenate([hi, rnd]))


def neighbours(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.float32)
    return np.concatenate([v, np.nextafter(v, np.float32(-np.inf)), np.nextafter(v, np.float32(np.inf))])


# =====================================================================================
# elementwise codecs
# =====================================================================================

def test_f16_encode_vs_numpy_bit_for_bit():
    half = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)  # all halves
    fin = half[np.isfinite(half)].astype(np.float64)
    fin = np.unique(fin)
    mids = (fin[:-1] + fin[1:]) / 2                                 # exact in f32
    specials = np.float32([0, -0.0, np.inf, -np.inf, 65504, 65519.996, 65520, 1e30,
                           2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -14, 1e-45])
    qnan = f32([0x7FC00000, 0xFFC00000, 0x7FC01234, 0x7F800001, 0x7FA00000, 0xFF812345])
    x = np.concatenate([neighbours(fin), neighbours(mids), neighbours(specials), qnan, sweep_bits()])
    got = F.encode_f16(x)
    assert got.dtype == np.uint16 and got.shape == x.shape
    with np.errstate(over="ignore"):
        ref = x.astype(np.float16).view(np.uint16)
    bad = np.nonzero(got != ref)[0]
    assert bad.size == 0, [(hex(u32(x)[i]), hex(got[i]), hex(ref[i])) for i in bad[:10]]
    # N-d input keeps its shape
    assert F.encode_f16(x[:12].reshape(3, 4)).shape == (3, 4)


def test_f16_decode_all_halves():
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    ref = h.view(np.float16).astype(np.float32).view(np.uint32)
    assert np.array_equal(F.decode_f16(h).view(np.uint32), ref)
    assert np.array_equal(F.decode_f16(h.view(np.float16)).view(np.uint32), ref)  # f16 view accepted


def test_e4m3_codecs_vs_numpy():
    codes = np.arange(256, dtype=np.uint8)
    assert np.array_equal(F.decode_e4m3(codes).view(np.uint32), decode_e4m3(codes).view(np.uint32))
    x = sweep_bits()
    assert np.array_equal(F.encode_e4m3(x), encode_e4m3(x))
    assert F.encode_e4m3(np.float32([np.nan, -np.nan, 1e9, -0.0])).tolist() == [0x7F, 0xFF, 0x7E, 0x80]


def test_e2m1_codecs_vs_numpy():
    codes = np.arange(256, dtype=np.uint8)
    assert np.array_equal(F.decode_e2m1(codes).view(np.uint32), decode_e2m1(codes).view(np.uint32))
    x = np.concatenate([sweep_bits(), neighbours(np.float32([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]))])
    assert np.array_equal(F.encode_e2m1(x), encode_e2m1(x))
    assert F.encode_e2m1(np.float32([0.25, 0.75, 5.0, -0.0, np.nan, -9])).tolist() == [0, 2, 6, 8, 0, 15]


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(max_dims=3, max_side=9), elements=st.floats(width=32)))
def test_elementwise_hypothesis(x):
    assert np.array_equal(F.encode_e4m3(x), encode_e4m3(x))
    assert np.array_equal(F.encode_e2m1(x), encode_e2m1(x))
    with np.errstate(over="ignore"):
        assert np.array_equal(F.encode_f16(x), x.astype(np.float16).view(np.uint16))


# =====================================================================================
# tensor codecs
# =====================================================================================

def weight_matrix(N: int, K: int, exp10: int, kind: str, seed: int) -> np.ndarray:
    """f32 [N, K] test weights: gaussian, heavy-tailed, or with zero rows / spikes."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((N, K)) * 10.0 ** exp10
    if kind == "cauchy":
        w = rng.standard_cauchy((N, K)) * 10.0 ** exp10
    elif kind == "zero_rows":
        w[::2] = 0
    elif kind == "spike":
        w[rng.integers(N), rng.integers(K)] *= 1e4
    elif kind == "ties":  # values that land exactly on e2m1 grid midpoints / ties
        w = rng.choice([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.0], (N, K)) * 10.0 ** exp10
    return np.clip(w, -3e38, 3e38).astype(np.float32)


KINDS = st.sampled_from(["gauss", "cauchy", "zero_rows", "spike", "ties"])
RECIPES = st.sampled_from(["mse", "amax", None])  # None: each side's default (mse)


def recipe_kw(recipe) -> dict:
    return {} if recipe is None else {"recipe": recipe}


@settings(max_examples=120, deadline=None)
@given(st.integers(1, 9), st.integers(1, 100), st.integers(-40, 34), KINDS, RECIPES,
       st.integers(0, 2**32 - 1))
def test_nvfp4_cpp_matches_numpy(N, K, exp10, kind, recipe, seed):
    w = weight_matrix(N, K, exp10, kind, seed)
    ref = quantize_nvfp4(w, **recipe_kw(recipe))
    codes, scales, tscale = F.nvfp4_quantize(w, **recipe_kw(recipe))
    assert codes.dtype == np.uint8 and scales.dtype == np.uint8
    assert np.array_equal(codes, ref.codes)
    assert np.array_equal(scales, ref.scales)
    assert np.float32(tscale).view(np.uint32) == ref.tscale.view(np.uint32)
    d_cpp = F.nvfp4_dequantize(codes, scales, tscale, K)
    d_np = dequantize_nvfp4(Nvfp4Tensor(codes, scales, np.float32(tscale), K))
    assert d_cpp.shape == (N, K) and np.array_equal(d_cpp.view(np.uint32), d_np.view(np.uint32))


@settings(max_examples=120, deadline=None)
@given(st.integers(1, 9), st.integers(1, 100), st.integers(-8, 4), KINDS,
       st.sampled_from([32, None, 0, 64, 2, 16]), RECIPES, st.integers(0, 2**32 - 1))
def test_w4a8_cpp_matches_numpy(N, K, exp10, kind, group, recipe, seed):
    w = weight_matrix(N, K, exp10, kind, seed)
    Kp = -(-K // 32) * 32
    if group == 64 and Kp % 64:
        with pytest.raises(ValueError):
            F.w4a8_quantize(w, 64)
        with pytest.raises(ValueError):
            quantize_w4a8(w, 64)
        return
    ref = quantize_w4a8(w, group, **recipe_kw(recipe))
    codes, scales = F.w4a8_quantize(w, group, **recipe_kw(recipe))
    assert codes.dtype == np.uint8 and scales.dtype == np.float16
    assert np.array_equal(codes, ref.codes)
    assert np.array_equal(scales.view(np.uint16), ref.scales.view(np.uint16))
    d_cpp = F.w4a8_dequantize(codes, scales, K)
    d_np = dequantize_w4a8(W4a8Tensor(codes, scales, ref.group, K))
    assert d_cpp.shape == (N, K) and np.array_equal(d_cpp.view(np.uint32), d_np.view(np.uint32))


@pytest.mark.parametrize("recipe", ["mse", "amax"])
def test_tensor_codecs_larger_and_noncontiguous(recipe):
    w = RNG.standard_normal((1100, 1000)).astype(np.float32)[:, ::2]  # [1100, 500], strided
    w[3, 40:72] = 0                                                  # zero groups / blocks
    w[5, 7] = 1e3                                                    # a spike (row-wise scale)
    ref = quantize_nvfp4(w, recipe=recipe)                           # > 1 numpy row chunk
    codes, scales, tscale = F.nvfp4_quantize(w, recipe=recipe)
    assert np.array_equal(codes, ref.codes) and np.array_equal(scales, ref.scales)
    for group in (32, None):
        rw = quantize_w4a8(w, group, recipe=recipe)
        c2, s2 = F.w4a8_quantize(w, group, recipe=recipe)
        assert np.array_equal(c2, rw.codes) and np.array_equal(s2.view(np.uint16), rw.scales.view(np.uint16))


def test_recipes_differ_and_unknown_recipe_raises():
    w = RNG.standard_normal((16, 64)).astype(np.float32)
    assert not np.array_equal(F.nvfp4_quantize(w, recipe="mse")[1], F.nvfp4_quantize(w, recipe="amax")[1])
    assert np.array_equal(F.nvfp4_quantize(w)[1], F.nvfp4_quantize(w, recipe="mse")[1])
    assert not np.array_equal(F.w4a8_quantize(w, recipe="mse")[1], F.w4a8_quantize(w, recipe="amax")[1])
    for fn in (lambda: F.nvfp4_quantize(w, recipe="best"), lambda: F.w4a8_quantize(w, recipe="best"),
               lambda: quantize_nvfp4(w, recipe="best"), lambda: quantize_w4a8(w, recipe="best")):
        with pytest.raises(ValueError):
            fn()


def test_tensor_codec_shape_errors():
    codes, scales, tscale = F.nvfp4_quantize(np.ones((2, 40), np.float32))
    with pytest.raises(ValueError):
        F.nvfp4_dequantize(codes, scales, tscale, 70)  # Kp 96 does not match codes
    with pytest.raises(ValueError):
        F.nvfp4_quantize(np.ones(5, np.float32))
    c2, s2 = F.w4a8_quantize(np.ones((2, 40), np.float32))
    with pytest.raises(ValueError):
        F.w4a8_dequantize(c2, s2, 100)


# =====================================================================================
# KV rows (nvfp4r, k8v4) against a float64 reference
# =====================================================================================

E2M1_GRID = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)
E4M3_GRID = np.unique(np.abs(np.array([v for v in decode_e4m3(np.arange(256, dtype=np.uint8)).astype(np.float64)
                                       if np.isfinite(v)])))


def nearest(grid: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Round |a| to the nearest grid value (float64; ties are measure-zero for random rows)."""
    i = np.clip(np.searchsorted(grid, a), 1, len(grid) - 1)
    lo, hi = grid[i - 1], grid[i]
    return np.where(a - lo <= hi - a, lo, hi)


def kv_ref(fmt: str, v: bool, x: np.ndarray) -> np.ndarray:
    """float64 reference of the KV row codecs (kv_pool.h): dequantised rows [n, D]."""
    x = x.astype(np.float64)
    amax = np.abs(x).max(-1, keepdims=True)
    if fmt == "k8v4" and not v:  # int8, f16 row scale amax / 127
        g = np.maximum(np.float16(amax / 127).astype(np.float64), 2.0**-24) * (amax > 0)
        q = np.clip(np.round(x / np.where(g > 0, g, 1)), -127, 127)
        return q * g
    # nvfp4r: g = f16(amax / 2688); s_b = e4m3(amax_b / (6 g)); x = e2m1(x / (s_b g)) s_b g
    g = np.maximum(np.float16(amax / 2688).astype(np.float64), 2.0**-24) * (amax > 0)
    xb = x.reshape(x.shape[0], -1, 16)
    ab = np.abs(xb).max(-1, keepdims=True)
    gb = g[:, :, None]
    s = nearest(E4M3_GRID, np.minimum(ab / (6 * np.where(gb > 0, gb, 1)), 448)) * gb
    q = np.sign(xb) * nearest(E2M1_GRID, np.minimum(np.abs(xb) / np.where(s > 0, s, 1), 6))
    return (q * s).reshape(x.shape)


def kv_rows(kind: str, n: int = 512, D: int = 64) -> np.ndarray:
    x = RNG.standard_normal((n, D)).astype(np.float32)
    if kind == "small":       # every block's scale-1 E4M3 scale subnormal or zero
        x *= np.float32(1e-3)
    elif kind == "tiny":
        x *= np.float32(1e-6)
    elif kind == "outlier":   # one large value per row, beyond scale-1 nvfp4's 6 * 448
        x[np.arange(n), RNG.integers(0, D, n)] = np.float32(5e3) * RNG.choice([-1, 1], n)
    elif kind == "mixed":     # blocks of very different magnitude in one row
        x *= np.repeat(np.float32([1e-2, 1e-1, 1.0, 30.0]), D // 4)[None, :]
    elif kind == "zero":
        x[:] = 0
        x[::2, :16] = RNG.standard_normal((n // 2, 16))  # zero blocks beside non-zero ones
    return x


@pytest.mark.parametrize("kind", ["normal", "small", "tiny", "outlier", "mixed", "zero"])
@pytest.mark.parametrize("fmt, v", [("nvfp4r", False), ("k8v4", False), ("k8v4", True)])
def test_kv_rows_match_float64_reference(fmt, v, kind):
    x = kv_rows(kind)
    rows, back = _native.kv_roundtrip(fmt, v, x)
    assert rows.shape == (x.shape[0], {("nvfp4r", False): 38, ("k8v4", False): 66, ("k8v4", True): 38}[fmt, v])
    ref = kv_ref(fmt, v, x)
    assert np.isfinite(back).all()
    same = (back.astype(np.float64) == ref).mean()
    assert same >= 0.999, f"{fmt} {'V' if v else 'K'} {kind}: {same:.4f} of values as the float64 reference"
    err = np.linalg.norm(back - x, axis=-1) / np.maximum(np.linalg.norm(x, axis=-1), 1e-30)
    # int8 rows: 1/254 of the row max; rows of ~1e-6 get the smallest f16 scale, 2^-24 (2-3%)
    bound = (0.03 if kind == "tiny" else 0.02) if (fmt, v) == ("k8v4", False) else 0.2
    assert err[np.abs(x).max(-1) > 0].max() <= bound, f"{fmt} {kind}: worst row error {err.max():.3f}"
    assert (back[np.abs(x).max(-1) == 0] == 0).all()


@pytest.mark.parametrize("kind", ["small", "tiny", "outlier", "mixed"])
def test_second_level_scale_is_what_keeps_these_rows(kind):
    """The same rows through nvfp4 (second-level scale fixed at 1) lose them: the assertion
    above would fail without the row scale."""
    x = kv_rows(kind)

    def worst_block_error(b):  # relative error of the worst block of 16 (blocks of zeros skipped)
        xb, bb = x.reshape(-1, 16), b.reshape(-1, 16)
        n = np.linalg.norm(xb, axis=-1)
        return (np.linalg.norm(bb - xb, axis=-1)[n > 0] / n[n > 0]).max()
    e1 = worst_block_error(_native.kv_roundtrip("nvfp4", False, x)[1])
    e2 = worst_block_error(_native.kv_roundtrip("nvfp4r", False, x)[1])
    assert e2 <= 0.25 < e1, f"{kind}: worst block error nvfp4 {e1:.3f}, nvfp4r {e2:.3f}"


def test_kv_roundtrip_rejects_bad_input():
    with pytest.raises(ValueError, match="not supported"):
        _native.kv_roundtrip("nvfp5", False, np.zeros((1, 64), np.float32))
    with pytest.raises(ValueError, match="D % 16"):
        _native.kv_roundtrip("nvfp4r", False, np.zeros((1, 60), np.float32))
