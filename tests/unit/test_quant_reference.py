"""numpy reference codecs (models.quant) against torch and against their own contracts.

torch 2.13.0 is the oracle for float8_e4m3fn (Tensor.to) and for E2M1 (torchao's
`_f32_to_floatx_unpacked(x, 2, 1)`, vendored in torch as torch/_vendor/quack/mx_utils.py
and torch/testing/_internal/common_quantized.py; both import slowly or need extra
packages, so the function's own source is extracted from the installed file and run).

Convention notes (measured on torch 2.13.0 CPU, asserted below):
  - e4m3: torch's cast saturates like our spec: |x| > 448 (including inf) -> 0x7E|sign,
    NaN -> 0x7F|sign. The main comparison still clamps inputs beyond ±448 so it does not
    depend on that; a separate test pins the unclamped agreement.
  - e2m1: identical on every non-NaN float32 (sign kept, so -0.0 and tiny negatives give
    0x8; saturation to ±6; ties to the even code). NaN differs: torch's helper returns an
    arbitrary magnitude code for NaN (3 for the default NaN); ours returns 0|sign.
"""
from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from models.quant import dequantize_linear, quantize_linear
from models.quant.e2m1 import E2M1_VALUES, _encode_e2m1_cmp, decode_e2m1, encode_e2m1
from models.quant.e4m3 import E4M3_VALUES, decode_e4m3, encode_e4m3
from models.quant.nvfp4 import Nvfp4Tensor, dequantize_nvfp4, quantize_nvfp4, unpack_nibbles
from models.quant.q8 import quantize_act_q8
from models.quant.w4a8 import dequantize_w4a8, quantize_w4a8

RNG = np.random.default_rng(1234)


# =====================================================================================
# helpers
# =====================================================================================

def f32(bits) -> np.ndarray:
    """u32 bit patterns -> f32 [n]."""
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def torch_e4m3(x: np.ndarray) -> np.ndarray:
    """f32 [n] -> u8 [n] through torch's float8_e4m3fn cast."""
    return torch.from_numpy(np.ascontiguousarray(x)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def _load_torch_floatx():
    """torch's `_f32_to_floatx_unpacked` (torchao's code) without importing its package."""
    root = pathlib.Path(torch.__path__[0])
    wanted = {"_n_ones", "_f32_to_floatx_unpacked", "EBITS_F32", "MBITS_F32", "F32_EXP_BIAS"}
    for rel in ("_vendor/quack/mx_utils.py", "testing/_internal/common_quantized.py"):
        path = root / rel
        if not path.exists():
            continue
        tree = ast.parse(path.read_text())
        body = []
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in wanted:
                body.append(node)
            elif isinstance(node, ast.Assign) and any(
                    isinstance(t, (ast.Name, ast.Tuple)) and wanted & {
                        n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
                    for t in node.targets):
                body.append(node)
        ns = {"torch": torch, "Tensor": torch.Tensor}
        exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), ns)
        if "_f32_to_floatx_unpacked" in ns:
            return ns["_f32_to_floatx_unpacked"]
    pytest.fail("torch 2.13 should ship _f32_to_floatx_unpacked")


def torch_e2m1(x: np.ndarray) -> np.ndarray:
    """f32 [n] -> u8 codes [n] through torch's E2M1 helper."""
    global _TORCH_FLOATX
    if _TORCH_FLOATX is None:
        _TORCH_FLOATX = _load_torch_floatx()
    fn = _TORCH_FLOATX
    return fn(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), 2, 1).numpy()


_TORCH_FLOATX = None


def neighbours(v: np.ndarray) -> np.ndarray:
    """f32 [n] -> f32 [3n]: each value and its next float32 down and up."""
    v = v.astype(np.float32)
    return np.concatenate([v, np.nextafter(v, np.float32(-np.inf)), np.nextafter(v, np.float32(np.inf))])


def e4m3_probe_values() -> np.ndarray:
    """Every float32 worth probing around the e4m3 grid, both signs. f32 [n]."""
    grid = np.unique(np.abs(E4M3_VALUES[np.isfinite(E4M3_VALUES)]).astype(np.float64))  # f64 [127]
    mids = (grid[:-1] + grid[1:]) / 2                                # exact in f32
    beyond = np.array([448, 456, 464, 472, 480, 500, 512, 1e4, 3.4e38], dtype=np.float64)
    tiny = np.ldexp(1.0, np.arange(-149, -5))                        # down into f32 subnormals
    pos = np.concatenate([neighbours(grid), neighbours(mids), neighbours(beyond), neighbours(tiny),
                          f32([0, 1, 0x7F7FFFFF, 0x7F800000])])
    return np.concatenate([pos, -pos])


def sweep_bits(low_bits: int = 12) -> np.ndarray:
    """All 2^20 float32 top-bit patterns (low bits 0) plus the same with random low bits."""
    hi = np.arange(1 << (32 - low_bits), dtype=np.uint32) << low_bits  # u32 [2^20]
    rnd = hi | RNG.integers(0, 1 << low_bits, hi.shape, dtype=np.uint32)
    return f32(np.concatenate([hi, rnd]))


# =====================================================================================
# E4M3
# =====================================================================================

def test_e4m3_decode_all_codes_vs_torch():
    codes = np.arange(256, dtype=np.uint8)
    ref = torch.from_numpy(codes).view(torch.float8_e4m3fn).float().numpy()  # f32 [256]
    got = decode_e4m3(codes)
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    assert np.isnan(got[[0x7F, 0xFF]]).all() and np.isnan(got).sum() == 2
    fin = ~np.isnan(ref)
    assert np.array_equal(got[fin].view(np.uint32), ref[fin].view(np.uint32))  # incl. -0.0
    assert got[0x7E] == 448 and got[0x01] == 2.0 ** -9 and got[0x08] == 2.0 ** -6


def test_e4m3_encode_code_points_midpoints_neighbours_vs_torch():
    x = e4m3_probe_values()
    # our spec saturates at ±448; compare torch on the clamped inputs
    ref = torch_e4m3(np.clip(x, -448, 448))
    got = encode_e4m3(x)
    bad = np.nonzero(got != ref)[0]
    assert bad.size == 0, [(float(x[i]), int(got[i]), int(ref[i])) for i in bad[:10]]
    # sanity on what is being compared: exact values round trip, ties go to even
    assert encode_e4m3(np.float32([448, 464, 465, -1e30, np.inf])).tolist() == [0x7E, 0x7E, 0x7E, 0xFE, 0x7E]
    assert encode_e4m3(np.float32([2.0 ** -10, 3 * 2.0 ** -10, 5 * 2.0 ** -10, -0.0])).tolist() == [0, 2, 2, 0x80]
    assert encode_e4m3(np.float32([np.nan, -np.nan])).tolist() == [0x7F, 0xFF]


def test_e4m3_bit_sweep_vs_torch():
    x = sweep_bits()
    x = x[~np.isnan(x)]
    ref = torch_e4m3(np.clip(x, -448, 448))
    assert np.array_equal(encode_e4m3(x), ref)


def test_e4m3_torch_2_13_also_saturates_unclamped():
    """Measured convention: torch 2.13's CPU cast saturates too (this pins that finding)."""
    x = np.concatenate([e4m3_probe_values(), np.float32([np.nan, -np.nan, np.inf, -np.inf])])
    assert np.array_equal(encode_e4m3(x), torch_e4m3(x))


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 64), elements=st.floats(width=32, allow_nan=False)))
def test_e4m3_hypothesis_vs_torch(x):
    assert np.array_equal(encode_e4m3(x), torch_e4m3(np.clip(x, -448, 448)))
    d = decode_e4m3(encode_e4m3(x))
    small = np.abs(x) <= 448
    # round trip: within half an e4m3 step (relative 2^-4, absolute 2^-10 in subnormals)
    assert np.all(np.abs(d[small] - x[small]) <= np.maximum(np.abs(x[small]) * 2.0 ** -4, 2.0 ** -10))


# =====================================================================================
# E2M1
# =====================================================================================

def test_e2m1_table_exhaustive():
    mags = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    expect = np.array(mags + [-m for m in mags], dtype=np.float32)
    assert np.array_equal(E2M1_VALUES.view(np.uint32), expect.view(np.uint32))  # code 8 is -0.0
    codes = np.arange(256, dtype=np.uint8)
    assert np.array_equal(decode_e2m1(codes), expect[codes & 0xF])
    # every code round-trips through its value
    assert np.array_equal(encode_e2m1(expect), np.arange(16, dtype=np.uint8))


def e2m1_probe_values() -> np.ndarray:
    grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)
    mids = (grid[:-1] + grid[1:]) / 2
    extra = np.array([6.5, 7, 8, 1e10, 3.4e38, 1e-3, 1e-30, 1e-45], dtype=np.float64)
    pos = np.concatenate([neighbours(grid), neighbours(mids), neighbours(extra),
                          f32([0, 1, 0x7FFFFF, 0x7F7FFFFF, 0x7F800000])])
    return np.concatenate([pos, -pos])


def test_e2m1_encode_vs_torch_edges():
    x = e2m1_probe_values()
    got, ref = encode_e2m1(x), torch_e2m1(x)
    bad = np.nonzero(got != ref)[0]
    assert bad.size == 0, [(float(x[i]), int(got[i]), int(ref[i])) for i in bad[:10]]
    # ties to the even code, saturation, signed zero
    ties = np.float32([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert encode_e2m1(ties).tolist() == [0, 2, 2, 4, 4, 6, 6]
    assert encode_e2m1(np.float32([-0.0, -1e-30, 7, -np.inf])).tolist() == [8, 8, 7, 15]


def test_e2m1_encode_vs_torch_bit_sweep():
    x = sweep_bits()
    x = x[~np.isnan(x)]  # NaN: torch's helper returns an arbitrary code, ours 0|sign
    assert np.array_equal(encode_e2m1(x), torch_e2m1(x))
    assert encode_e2m1(np.float32([np.nan, -np.nan])).tolist() == [0, 8]


def test_e2m1_table_form_equals_comparison_form():
    # every bucket start, its neighbours and random interiors of the lookup table
    i = np.arange(8192, dtype=np.uint32)
    starts = f32((i >> 1) << 20)
    x = np.concatenate([neighbours(starts[np.isfinite(starts)]), sweep_bits()])
    assert np.array_equal(encode_e2m1(x), _encode_e2m1_cmp(x))


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 64), elements=st.floats(width=32, allow_nan=False)))
def test_e2m1_hypothesis_vs_torch(x):
    assert np.array_equal(encode_e2m1(x), torch_e2m1(x))


# =====================================================================================
# NVFP4
# =====================================================================================

def block_divisor(t: Nvfp4Tensor) -> np.ndarray:
    """f32 [N, Kp/16]: the divisor e4m3(s_b) * g of every block."""
    return decode_e4m3(t.scales) * np.float32(t.tscale)


@pytest.mark.parametrize("recipe", ["mse", "amax"])
def test_nvfp4_structure_and_nibble_order(recipe):
    w = np.zeros((3, 40), dtype=np.float32)  # K=40 -> Kp=64
    w[0, :4] = [6.0, 1.0, -0.5, 3.0]
    t = quantize_nvfp4(w, recipe=recipe)
    assert t.codes.shape == (3, 32) and t.codes.dtype == np.uint8
    assert t.scales.shape == (3, 4) and t.scales.dtype == np.uint8
    assert t.K == 40 and isinstance(t.tscale, np.float32)
    assert t.tscale == np.float32(np.float32(6.0) / np.float32(2688.0))
    assert t.scales[0, 0] == 0x7E                  # block holding the amax gets 448
    assert t.codes[0, 0] == (7 | (2 << 4))         # element 0 low nibble, element 1 high
    assert t.codes[0, 1] == (9 | (5 << 4))         # -0.5 -> 0x9, 3.0 -> 0x5
    assert (t.codes[1:] == 0).all() and (t.scales[1:] == 0).all()  # all-zero rows
    assert (t.codes[:, 20:] == 0).all() and (t.scales[:, 3] == 0).all()  # padding 40..63
    # on-grid values come back up to the rounding of g (one f32 ulp)
    np.testing.assert_allclose(dequantize_nvfp4(t)[0, :4], w[0, :4], rtol=2e-7, atol=0)


@pytest.mark.parametrize("recipe", ["mse", "amax"])
def test_nvfp4_all_zero_matrix(recipe):
    t = quantize_nvfp4(np.zeros((2, 5), np.float32), recipe=recipe)
    assert t.tscale == 1.0 and not t.codes.any() and not t.scales.any()
    assert np.array_equal(dequantize_nvfp4(t), np.zeros((2, 5), np.float32))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.integers(1, 100), st.integers(-30, 30), st.sampled_from(["mse", "amax"]),
       st.integers(0, 2**32 - 1))
def test_nvfp4_round_trip_bound(N, K, exp10, recipe, seed):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((N, K)) * 10.0 ** exp10).astype(np.float32)
    t = quantize_nvfp4(w, recipe=recipe)
    d = dequantize_nvfp4(t)
    assert d.shape == (N, K) and d.dtype == np.float32
    den = np.repeat(block_divisor(t), 16, axis=1)[:, :K]    # f32 [N, K]
    q = np.abs(w) / np.where(den > 0, den, 1)
    # within one grid step (the widest gap is 4..6) of w/den, or the saturation excess
    allowed = np.where(den > 0, den * np.maximum(1.0, q - 6.0) * (1 + 1e-5), np.abs(w))
    assert np.all(np.abs(d - w) <= allowed)
    # block scales never exceed 448 (nor are NaN); the amax block is at the top (amax recipe:
    # to e4m3 rounding; mse: its candidates are within 2 e4m3 steps of level 6 or 4 at the max)
    assert np.abs(decode_e4m3(t.scales)).max() <= 448
    assert not np.isin(t.scales, [0x7F, 0xFF]).any()
    rel = 0.07 if recipe == "amax" else 0.2
    assert np.max(np.abs(d)) == pytest.approx(np.max(np.abs(w)), rel=rel)
    # mse codes: one of the documented candidates of each block
    if recipe == "mse":
        a = quantize_nvfp4(w, recipe="amax")
        wp = np.zeros((N, t.scales.shape[1] * 16), np.float32)
        wp[:, :K] = w
        bmax = np.abs(wp.reshape(N, -1, 16)).max(axis=2)
        s4 = encode_e4m3(bmax / (np.float32(4.0) * t.tscale)).astype(int)
        s6 = a.scales.astype(int)
        cands = np.clip(np.stack([s6, s6 - 1, s6 + 1, s4, s4 - 1, s4 + 1]), 0, 0x7E)
        assert np.all((cands == t.scales.astype(int)[None]).any(axis=0))


@pytest.mark.parametrize("recipe,lo,hi", [("amax", 0.09, 0.11), ("mse", 0.07, 0.09)])
def test_nvfp4_gaussian_error(recipe, lo, hi):
    w = RNG.standard_normal((64, 256)).astype(np.float32)
    d = dequantize_nvfp4(quantize_nvfp4(w, recipe=recipe))
    rel = np.linalg.norm(d - w) / np.linalg.norm(w)
    assert lo < rel < hi, rel


# =====================================================================================
# W4A8
# =====================================================================================

@pytest.mark.parametrize("recipe", ["mse", "amax"])
def test_w4a8_structure_and_nibble_order(recipe):
    w = np.zeros((3, 40), dtype=np.float32)  # K=40 -> Kp=64
    w[0, :3] = [7.0, -7.0, 1.0]               # exact at amax/7: mse keeps its first candidate
    t = quantize_w4a8(w, group=32, recipe=recipe)
    assert t.codes.shape == (3, 32) and t.scales.shape == (3, 2) and t.scales.dtype == np.float16
    assert t.group == 32 and t.K == 40
    assert t.scales[0, 0] == 1.0
    assert t.codes[0, 0] == ((7 + 8) | ((-7 + 8) << 4))
    assert t.codes[0, 1] == ((1 + 8) | (8 << 4))
    assert (t.codes[1:] == 0x88).all() and (t.scales[1:] == 0).all()  # zero rows: q = 0
    assert not t.scales.view(np.uint16)[1:].any()                      # ... and +0 scales
    assert (t.codes[:, 20:] == 0x88).all()                              # padding: q = 0
    assert np.array_equal(dequantize_w4a8(t)[0, :3], w[0, :3])
    r = quantize_w4a8(w, group=None, recipe=recipe)
    assert r.group == 64 and r.scales.shape == (3, 1)
    assert quantize_w4a8(w, group=0, recipe=recipe).group == 64
    with pytest.raises(ValueError):
        quantize_w4a8(w, group=48, recipe=recipe)


def test_w4a8_mse_uses_minus_8():
    w = np.zeros((1, 32), dtype=np.float32)
    w[0, :3] = [8.0, -3.0, 1.0]                 # exact on d = -1 (q = -8, 3, -1), not on 8/7
    t = quantize_w4a8(w)
    assert t.scales[0, 0] == -1.0 and np.array_equal(dequantize_w4a8(t), w)
    assert t.codes[0, 0] == ((-8 + 8) | ((3 + 8) << 4))
    a = quantize_w4a8(w, recipe="amax")
    assert a.scales[0, 0] == np.float16(8 / 7) and not np.array_equal(dequantize_w4a8(a), w)


def test_w4a8_huge_scale_saturates_not_inf():
    w = np.full((1, 32), 1e6, dtype=np.float32)
    t = quantize_w4a8(w, recipe="amax")
    assert np.isfinite(t.scales).all() and t.scales[0, 0] == np.float16(65504)
    assert np.all(dequantize_w4a8(t) == np.float32(7 * 65504))
    t = quantize_w4a8(w)                        # mse: the saturated scale, signed to reach -8
    assert np.isfinite(t.scales).all() and t.scales[0, 0] == np.float16(-65504)
    assert np.all(dequantize_w4a8(t) == np.float32(8 * 65504))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.integers(1, 100), st.integers(-4, 4), st.sampled_from([32, None]),
       st.sampled_from(["mse", "amax"]), st.integers(0, 2**32 - 1))
def test_w4a8_round_trip_bound(N, K, exp10, group, recipe, seed):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((N, K)) * 10.0 ** exp10).astype(np.float32)
    t = quantize_w4a8(w, group, recipe=recipe)
    d = dequantize_w4a8(t)
    dd = np.repeat(t.scales.astype(np.float32), t.group, axis=1)[:, :K]  # f32 [N, K]
    nib = unpack_nibbles(t.codes).astype(int)[:, :K] - 8
    assert nib.min() >= -8 and nib.max() <= 7
    half = 0.5 * np.abs(dd) * (1 + 2.0 ** -20) + 1e-38
    if recipe == "amax":
        assert (t.scales >= 0).all() and nib.min() >= -7    # amax/7 never reaches -8
        assert np.all(np.abs(d - w) <= half)
    else:
        # q is w/dd rounded to nearest, clipped to [-8, 7]: inside the range within half a
        # step; at the ends w/dd lies beyond the end's rounding boundary
        r = w / np.where(dd != 0, dd, 1)
        inner = (nib > -8) & (nib < 7)
        assert np.all((np.abs(d - w) <= half)[inner])
        assert np.all(r[(nib == 7) & (dd != 0)] >= 6.5 * (1 - 2.0 ** -20))
        assert np.all(r[(nib == -8) & (dd != 0)] <= -7.5 * (1 - 2.0 ** -20))


# =====================================================================================
# mse recipe vs amax recipe: never a larger squared error (per block / group)
# =====================================================================================

def heavy_or_gauss(kind: str, shape, rng) -> np.ndarray:
    if kind == "gauss":
        w = rng.standard_normal(shape)
    elif kind == "cauchy":
        w = rng.standard_cauchy(shape)
    elif kind == "student3":
        w = rng.standard_t(3, shape)
    else:  # "q4_1": 16 asymmetric levels per 32 (what GGUF Q4_1 sources dequantise to)
        n, k = shape
        lo = -rng.random((n, k // 32, 1)) - 0.2
        hi = rng.random((n, k // 32, 1)) + 0.2
        w = (lo + (hi - lo) / 15 * rng.integers(0, 16, (n, k // 32, 32))).reshape(n, k)
    return np.clip(w, -1e30, 1e30).astype(np.float32)


def nvfp4_block_err(w: np.ndarray, t: Nvfp4Tensor) -> np.ndarray:
    """The recipe's own error per block: sum of float64(w/g - e2m1*e4m3)^2. f64 [N, Kp/16]."""
    N, K = w.shape
    wp = np.zeros((N, t.scales.shape[1] * 16), np.float32)
    wp[:, :K] = w
    x = wp.reshape(N, -1, 16) / t.tscale
    v = E2M1_VALUES[unpack_nibbles(t.codes)].reshape(N, -1, 16) * decode_e4m3(t.scales)[:, :, None]
    return ((x - v).astype(np.float64) ** 2).sum(axis=2)


def w4a8_group_err(w: np.ndarray, t) -> np.ndarray:
    """The recipe's own error per group: sum of float64(w - q*d)^2. f64 [N, Kp/G]."""
    N, K = w.shape
    d = np.zeros((N, t.codes.shape[1] * 2), np.float32)
    d[:, :K] = dequantize_w4a8(t) - w
    return (d.astype(np.float64) ** 2).reshape(N, -1, t.group).sum(axis=2)


@pytest.mark.parametrize("kind", ["gauss", "cauchy", "student3", "q4_1"])
@pytest.mark.parametrize("K", [64, 100, 576])
def test_mse_recipe_error_never_above_amax(kind, K):
    rng = np.random.default_rng(K * 7 + len(kind))
    w = heavy_or_gauss(kind, (48, -(-K // 32) * 32), rng)[:, :K]
    w = np.ascontiguousarray(w)
    tiny = 1e-12  # the per-block sums here are pairwise, the recipe's sequential
    gain = 0.85 if kind in ("gauss", "q4_1") else 1.0  # heavy tails: outliers dominate the sum
    # NVFP4: per block (same g), and in total in the true float64 error
    tm, ta = quantize_nvfp4(w), quantize_nvfp4(w, recipe="amax")
    assert tm.tscale == ta.tscale
    em, ea = nvfp4_block_err(w, tm), nvfp4_block_err(w, ta)
    assert np.all(em <= ea * (1 + tiny)), (em - ea).max()
    dm, da = dequantize_nvfp4(tm).astype(np.float64), dequantize_nvfp4(ta).astype(np.float64)
    tot_m, tot_a = ((dm - w) ** 2).sum(), ((da - w) ** 2).sum()
    assert tot_m < tot_a * gain, (tot_m, tot_a)
    # W4A8, group 32 and row-wise
    for group in (32, None):
        tm, ta = quantize_w4a8(w, group), quantize_w4a8(w, group, recipe="amax")
        em, ea = w4a8_group_err(w, tm), w4a8_group_err(w, ta)
        assert np.all(em <= ea * (1 + tiny)), (em - ea).max()
        assert em.sum() < ea.sum() * gain, (group, em.sum(), ea.sum())


# =====================================================================================
# Q8 activations
# =====================================================================================

@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(1, 100), st.integers(-6, 6), st.integers(0, 2**32 - 1))
def test_q8_contract(M, K, exp10, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((M, K)) * 10.0 ** exp10).astype(np.float32)
    x[0, : min(K, 40)] = 0  # an all-zero block
    q, d, s = quantize_act_q8(x)
    Kp = -(-K // 32) * 32
    assert q.shape == (M, Kp) and q.dtype == np.int8
    assert d.shape == s.shape == (M, Kp // 32) and d.dtype == np.float32 and s.dtype == np.int32
    assert np.array_equal(s, q.reshape(M, -1, 32).astype(np.int32).sum(axis=2))
    assert not q[:, K:].any() and np.abs(q.astype(int)).max() <= 127
    xp = np.zeros((M, Kp), np.float32)
    xp[:, :K] = x
    amax = np.abs(xp).reshape(M, -1, 32).max(axis=2)
    assert np.array_equal(d, amax / np.float32(127))
    dq = q.reshape(M, -1, 32) * d[:, :, None]
    assert np.all(np.abs(dq - xp.reshape(M, -1, 32)) <= 0.5 * d[:, :, None] * (1 + 1e-5) + 1e-38)
    nz = amax > 0
    assert np.all(np.abs(q.reshape(M, -1, 32)).max(axis=2)[nz] == 127)
    assert not q[0, : min(K, 32)].any() and d[0, 0] == 0


# =====================================================================================
# quantize_linear / dequantize_linear
# =====================================================================================

@pytest.mark.parametrize("fmt", ["nvfp4", "w4a8", "f16", "f32"])
def test_quantize_linear_entries(fmt):
    w = RNG.standard_normal((5, 70)).astype(np.float32)
    e = quantize_linear(w, fmt)
    keys = {"nvfp4": {"weight.codes", "weight.scales", "weight.tscale"},
            "w4a8": {"weight.codes", "weight.scales"}, "f16": {"weight"}, "f32": {"weight"}}[fmt]
    assert set(e) == keys
    d = dequantize_linear(e, fmt, 70)
    assert d.shape == (5, 70) and d.dtype == np.float32
    if fmt == "nvfp4":
        assert e["weight.tscale"].shape == (1,) and e["weight.tscale"].dtype == np.float32
        assert np.array_equal(d, dequantize_nvfp4(quantize_nvfp4(w)))
    elif fmt == "w4a8":
        assert e["weight.scales"].dtype == np.float16 and e["weight.scales"].shape == (5, 3)
        assert np.array_equal(d, dequantize_w4a8(quantize_w4a8(w)))
        row = quantize_linear(w, fmt, group=None)
        assert row["weight.scales"].shape == (5, 1)
        assert np.array_equal(dequantize_linear(row, fmt, 70), dequantize_w4a8(quantize_w4a8(w, None)))
    elif fmt == "f16":
        assert e["weight"].dtype == np.float16 and np.array_equal(d, w.astype(np.float16).astype(np.float32))
    else:
        assert np.array_equal(d, w)
    if fmt in ("nvfp4", "w4a8"):
        q = {"nvfp4": quantize_nvfp4, "w4a8": quantize_w4a8}[fmt]
        assert np.array_equal(dequantize_linear(quantize_linear(w, fmt, recipe="amax"), fmt, 70),
                              {"nvfp4": dequantize_nvfp4, "w4a8": dequantize_w4a8}[fmt](q(w, recipe="amax")))
        with pytest.raises(ValueError):
            quantize_linear(w, fmt, recipe="max")
    with pytest.raises(ValueError):
        quantize_linear(w, "int3")
