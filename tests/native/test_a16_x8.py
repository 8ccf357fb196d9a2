"""GGUF Q4_1 repacked at load for 16-bit activations: WeightLayout::Q41X8 (kernels.h),
native/kernels/cpu/gemm_a16_x8_avx2.cpp, and the scalar reader of it (gemm_a16.cpp).

Oracles: a numpy transcription of the layout's contract (kernels.h), gguf-py's quantisation /
dequantisation of the blocks with float64 products, and the int64 reference of the integer
sums (test_a16.py: with power-of-two scales every float operation is exact, so each ISA must
equal it bit for bit). The engine: the gguf folder's logits with the repack equal those of the
file layout (KVDECK_Q41_REPACK=0) to float rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from app.engine import _native, load_engine  # noqa: E402
from models.quant.gguf_blocks import q4_to_w4a8  # noqa: E402
from tests.native.test_a16 import ISAS, _int_reference, _weights, on_every_isa  # noqa: E402

K_ = _native.kernels
# K: no whole chunk (5 blocks), one chunk, two chunks + an odd tail (19), the model's 576 / 1536
SHAPES = [(7, 160), (9, 256), (37, 608), (16, 576), (5, 1536)]


def x8_reference(codes: np.ndarray) -> np.ndarray:
    """kernels.h: chunk c (8 blocks, 128 bytes), byte 32v + 4j + k = file byte 4v + k of block 8c + j;
    the blocks after the last whole chunk keep the file order."""
    N, half = codes.shape
    nb = half // 16
    out = codes.copy()
    for c in range(nb // 8):
        blk = codes[:, 128 * c:128 * (c + 1)].reshape(N, 8, 4, 4)  # [n, j, v, k]
        out[:, 128 * c:128 * (c + 1)] = blk.transpose(0, 2, 1, 3).reshape(N, 128)  # [n, v, j, k]
    return out


def _run_x8(q, x):
    return K_.gemm("w4a8", K_.repack_q4_1_x8(q["codes"]), x, scales=q["scales"], mins=q["mins"], act_bits=16,
                   layout="q4_1_x8")


@pytest.mark.parametrize("N,K", SHAPES)
def test_repack_is_the_documented_permutation(N, K):
    codes = np.random.default_rng(K).integers(0, 256, (N, K // 2), dtype=np.uint8)
    np.testing.assert_array_equal(K_.repack_q4_1_x8(codes), x8_reference(codes))


@pytest.mark.parametrize("N,K", SHAPES)
@pytest.mark.parametrize("M", [1, 6])
def test_integer_sums_are_exact_on_every_isa(N, K, M):
    rng = np.random.default_rng(11)
    q = _weights("Q4_1", N, K, rng, pow2=True)
    # coarser than test_a16.py's (up to 48 blocks are summed here): every partial sum of every
    # ISA's order stays on a 2^-12 grid below 2^12, i.e. exact in float32
    nb = K // 32
    q["scales"][:] = np.float16(0.25)
    q["mins"] = (rng.integers(-4, 4, (N, nb)) * 0.25).astype(np.float16)
    q["codes"][:, ::16] = (q["codes"][:, ::16] & 0xF0) | rng.integers(0, 2, (N, nb)).astype(np.uint8)
    xi = rng.integers(-50, 51, (M, K)).astype(np.float32)
    xi[:, ::32] = 32767 * np.where(rng.random((M, K // 32)) < 0.5, -1, 1)
    x = xi * np.float32(2.0**-10)
    want = _int_reference("Q4_1", q, x)
    for isa, y in on_every_isa(lambda: _run_x8(q, x)).items():
        np.testing.assert_array_equal(y.astype(np.float64), want, err_msg=isa)


@pytest.mark.parametrize("N,K", SHAPES[1:])
@pytest.mark.parametrize("M", [1, 5, 70])
def test_products_track_gguf_py_and_the_file_layout(N, K, M):
    rng = np.random.default_rng(12)
    w = (rng.standard_normal((N, K)) * 0.3 + rng.uniform(-0.5, 0.5, (N, 1))).astype(np.float32)
    t = gguf.GGMLQuantizationType.Q4_1
    raw = gguf.quants.quantize(w, t)
    exact_w = gguf.quants.dequantize(raw, t).astype(np.float64)
    q = q4_to_w4a8(raw, N, K, "Q4_1")
    x = rng.standard_normal((M, K)).astype(np.float32)
    exact = x.astype(np.float64) @ exact_w.T
    scale = np.abs(exact).max()
    for isa, (y, f) in on_every_isa(lambda: (_run_x8(q, x), K_.gemm(
            "w4a8", q["codes"], x, scales=q["scales"], mins=q["mins"], act_bits=16))).items():
        assert np.abs(y - exact).max() / scale <= 5e-5, (isa, np.abs(y - exact).max() / scale)
        np.testing.assert_allclose(y, f, rtol=1e-5, atol=2e-6 * scale, err_msg=isa)


def test_the_layout_is_for_16_bit_activations_only():
    q = _weights("Q4_1", 8, 256, np.random.default_rng(13))
    x = np.ones((1, 256), np.float32)
    for isa in ISAS:
        K_.set_kernel_isa(isa)
        with pytest.raises(ValueError, match="layout Q41X8\\) need 16-bit activations"):
            K_.gemm("w4a8", K_.repack_q4_1_x8(q["codes"]), x, scales=q["scales"], mins=q["mins"],
                    layout="q4_1_x8")
    K_.set_kernel_isa(ISAS[-1] if "avx2" not in ISAS else "avx2")
    with pytest.raises(ValueError, match="'q4_1_x8' for w4a8 with mins"):
        K_.gemm("w4a8", q["codes"], x, scales=q["scales"], act_bits=16, layout="q4_1_x8")


def test_which_sets_repack():
    before = K_.kernel_isa()
    try:
        for isa in ISAS:
            K_.set_kernel_isa(isa)
            want = "q4_1_x8" if isa in ("avx2", "avx512vnni") else "file"
            assert K_.preferred_layout_a16("w4a8", mins=True) == want, isa
            assert K_.preferred_layout_a16("w4a8", mins=False) == "file"
            assert K_.preferred_layout_a16("w8a8", mins=False) == "file"
    finally:
        K_.set_kernel_isa(before)


@pytest.mark.skipif("avx2" not in ISAS, reason="the repack happens where the AVX2 kernels run")
def test_engine_on_the_repacked_folder_equals_the_file_layout(root, monkeypatch):
    from tests.native.test_accuracy import EVAL

    e = load_engine(root, weights="gguf")
    assert e.native.activations == "a16"
    ids = e.tokenizer.encode((EVAL / "edge_agents.txt").read_text(), add_special_tokens=False).ids[:300]
    got = e.logits(ids)
    monkeypatch.setenv("KVDECK_Q41_REPACK", "0")
    want = load_engine(root, weights="gguf").logits(ids)
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.995
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-3 * np.abs(want).max())
    # 8-bit activations on the same folder keep the file layout (no Q41X8 kernel for them)
    a8 = load_engine(root, weights="gguf", activations="a8").logits(ids[:40])
    assert (a8.argmax(-1) == want[:40].argmax(-1)).mean() >= 0.85
