"""16-bit activations ("a16", native/kernels/cpu/gemm_a16*.cpp): the quantiser and the W4A8
(GGUF Q4_0 / Q4_1) and W8A8 (Q8_0) products on every ISA this CPU runs.

Oracles: a numpy float32 transcription of the quantiser's contract (kernels.h), gguf-py's
quantisation / dequantisation of the blocks, and float64 products. The integer sums are
checked exactly: with power-of-two scales every float operation of the kernels is exact, so
each ISA's result must equal the int64 reference bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from app.engine import _native  # noqa: E402
from models.quant.gguf_blocks import q4_to_w4a8, q8_0_to_w8a8  # noqa: E402

K_ = _native.kernels
ISAS = [isa for isa in ("scalar", "avx2", "avx512vnni", "neon") if K_.cpu_supports(isa)]


def on_every_isa(fn):
    before = K_.kernel_isa()
    try:
        out = {}
        for isa in ISAS:
            assert K_.set_kernel_isa(isa)
            out[isa] = fn()
        return out
    finally:
        K_.set_kernel_isa(before)


def q16_reference(x: np.ndarray):
    """kernels.h's contract in numpy float32: d = amax / 32767, q = rint(clip(x * (32767 / amax)))."""
    M, K = x.shape
    Kp = -(-K // 32) * 32
    xp = np.zeros((M, Kp), np.float32)
    xp[:, :K] = x
    b = xp.reshape(M, Kp // 32, 32)
    amax = np.abs(b).max(-1)
    inv = np.where(amax > 0, np.float32(32767) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.rint(np.clip(b * inv[..., None], -32767, 32767)).astype(np.int16)
    return q.reshape(M, Kp), (amax / np.float32(32767)).astype(np.float32), q.astype(np.int32).sum(-1)


def test_quantiser_matches_the_contract_on_every_isa():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((7, 200)) * rng.uniform(1e-3, 50, (7, 1))).astype(np.float32)
    x[2, 32:64] = 0.0  # an all-zero block: q = 0, d = 0
    want = q16_reference(x)
    for isa, (q, d, s) in on_every_isa(lambda: K_.quantize_act_q8(x, bits=16)).items():
        assert q.dtype == np.int16
        np.testing.assert_array_equal(q, want[0], err_msg=isa)
        np.testing.assert_array_equal(d, want[1], err_msg=isa)
        np.testing.assert_array_equal(s, want[2], err_msg=isa)


def _weights(kind, N, K, rng, pow2=False):
    w = (rng.standard_normal((N, K)) * rng.uniform(0.01, 2.0, (N, 1))).astype(np.float32)
    if kind == "Q4_1":
        w += rng.uniform(-1, 1, (N, 1)).astype(np.float32)
    raw = gguf.quants.quantize(w, getattr(gguf.GGMLQuantizationType, kind))
    q = q8_0_to_w8a8(raw, N, K) if kind == "Q8_0" else q4_to_w4a8(raw, N, K, kind)
    if pow2:  # power-of-two scales and minimums: every float op of the kernels is exact
        nb = K // 32
        q["scales"] = (2.0 ** -rng.integers(2, 5, (N, nb))).astype(np.float16)
        if "mins" in q:
            q["mins"] = (rng.integers(-8, 8, (N, nb)) * 2.0**-4).astype(np.float16)
        # small weights where the activations hold their 32767 (element 0 of each block), so
        # every partial sum stays within float32's 24 bits
        if kind == "Q8_0":
            q["codes"][:, ::32] = rng.integers(-2, 3, (N, nb))
        else:
            q["codes"][:, ::16] = (q["codes"][:, ::16] & 0xF0) | rng.integers(7, 10, (N, nb)).astype(np.uint8)
    return q


def _run(kind, q, x):
    dt = "w8a8" if kind == "Q8_0" else "w4a8"
    return K_.gemm(dt, q["codes"], x, scales=q["scales"], mins=q.get("mins"), act_bits=16)


def _int_reference(kind, q, x) -> np.ndarray:
    """float64 of the contract: sum_b d_a * (scale * t + min * s) with exact integer t, s."""
    qa, d, s = q16_reference(x)
    M, Kp = qa.shape
    if kind == "Q8_0":
        wq = q["codes"].astype(np.int64)
    else:
        c = q["codes"]
        wq = np.empty((c.shape[0], Kp), np.int64)
        wq[:, 0::2], wq[:, 1::2] = c & 0xF, c >> 4
        if kind == "Q4_0":
            wq -= 8
    t = np.einsum("mbi,nbi->mnb", qa.reshape(M, -1, 32).astype(np.int64), wq.reshape(wq.shape[0], -1, 32))
    y = d.astype(np.float64)[:, None, :] * q["scales"].astype(np.float64)[None] * t
    if kind == "Q4_1":
        y += d.astype(np.float64)[:, None, :] * q["mins"].astype(np.float64)[None] * s[:, None, :]
    return y.sum(-1)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("M", [1, 6])
def test_integer_sums_are_exact_on_every_isa(kind, M):
    rng = np.random.default_rng(1)
    N, K = 37, 160  # an odd number of 32-blocks; N not a multiple of the 4-row GEMV step
    q = _weights(kind, N, K, rng, pow2=True)
    # activations whose quantisation is exact: d = 2^-10, q = small integers and one 32767 per block
    xi = rng.integers(-50, 51, (M, K)).astype(np.float32)
    xi[:, ::32] = 32767 * np.where(rng.random((M, K // 32)) < 0.5, -1, 1)
    x = xi * np.float32(2.0**-10)
    want = _int_reference(kind, q, x)
    for isa, y in on_every_isa(lambda: _run(kind, q, x)).items():
        np.testing.assert_array_equal(y.astype(np.float64), want, err_msg=isa)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("M", [1, 5, 70])
def test_products_track_float64_and_beat_8_bit_activations(kind, M):
    rng = np.random.default_rng(2)
    N, K = 45, 192
    raw_w = (rng.standard_normal((N, K)) * 0.3).astype(np.float32)
    t = getattr(gguf.GGMLQuantizationType, kind)
    raw = gguf.quants.quantize(raw_w, t)
    w = gguf.quants.dequantize(raw, t).astype(np.float64)
    q = q8_0_to_w8a8(raw, N, K) if kind == "Q8_0" else q4_to_w4a8(raw, N, K, kind)
    x = rng.standard_normal((M, K)).astype(np.float32)
    exact = x.astype(np.float64) @ w.T
    scale = np.abs(exact).max()
    outs = on_every_isa(lambda: _run(kind, q, x))
    a8 = K_.gemm("w8a8" if kind == "Q8_0" else "w4a8", q["codes"], x, scales=q["scales"], mins=q.get("mins"))
    err8 = np.abs(a8 - exact).max() / scale
    for isa, y in outs.items():
        err16 = np.abs(y - exact).max() / scale
        assert err16 <= 5e-5, (isa, err16)
        assert err16 * 50 < err8, (isa, err16, err8)  # 16-bit activations: ~2^8 less rounding
        np.testing.assert_allclose(y, outs["scalar"], rtol=1e-5, atol=1e-6 * scale)


def test_formats_without_an_a16_kernel_refuse():
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 256, (8, 32), dtype=np.uint8)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    for isa in ISAS:
        K_.set_kernel_isa(isa)
        with pytest.raises(ValueError, match="activations a16: weights of format nvfp4"):
            K_.gemm("nvfp4", codes, x, scales=np.full((8, 4), 0x38, np.uint8), act_bits=16)
    K_.set_kernel_isa(ISAS[-1] if "avx2" not in ISAS else "avx2")


# ============================================================================
# The engine option
# ============================================================================
def test_engine_option_is_validated(root):
    from app.engine import EngineError, load_engine

    with pytest.raises(EngineError, match="activations = 'a12' is not supported \\(auto, a8, a16\\)"):
        load_engine(root, weights="gguf", activations="a12")
    with pytest.raises(EngineError, match="self_attn.q_proj is nvfp4, which has no kernel for activations = \"a16\""):
        load_engine(root, weights="nvfp4", activations="a16")
    assert load_engine(root, weights="nvfp4").native.activations == "a8"  # auto: a8 off gguf
    assert load_engine(root, weights="w4a8", activations="a16").native.activations == "a16"


def test_cuda_backend_refuses_a16():
    cfg = {"hidden": 64, "intermediate": 128, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "head_dim": 32,
           "vocab": 256, "rms_eps": 1e-5, "attn_bias": False, "qk_norm": False, "rope_inv_freq": [1.0] * 16}
    with pytest.raises(ValueError, match="activations = \"a16\" is not supported on the cuda backend"):
        _native.Engine(cfg, {"backend": "cuda", "activations": "a16"})
