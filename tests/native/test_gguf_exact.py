"""The `gguf` weight format: a GGUF file's own Q4_0 / Q4_1 / Q8_0 blocks, run without re-rounding.

Oracles we did not write: gguf-py quantises and dequantises the blocks (llama.cpp's layouts);
the engine's f32 folder is that dequantisation run in float32 (itself checked against
transformers in test_parity.py).

Measured 2026-12-01, the default model, KV f32, top-1 agreement with the f32 engine /
perplexity ratio on edge_agents.txt (808 tokens; both eval texts, 2120 tokens, in brackets):
  activations a16 (the default for gguf: int16 per 32 values, gemm_a16*.cpp)
      0.9975 / 1.0000 (0.9991 / 1.0000)
  activations a8 (int8 per 32) 0.962 / 1.002 (0.961 / 1.007); llama.cpp on the same GGUF
      0.959 / 1.001 (0.965 / 1.007), which also rounds activations to 8 bits.
A float32 simulation with the exact weights (models/quant/act_study.py) gives the same
ordering: a8 0.956, a8 per 16 values 0.969, a10 0.993, a12 0.998, a16 and two int8 planes
0.9995; a16 on only the head, only the layers, or any subset of matmuls stays <= 0.979.
Asserted: a16 top-1 >= 0.99 and perplexity within 0.3%; a8 >= 0.94 and within 1.5%.
"""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from app.engine import _native, load_engine  # noqa: E402
from models.quant.gguf_blocks import dequantize_w4a8, dequantize_w8a8, q4_to_w4a8, q8_0_to_w8a8  # noqa: E402
from tests.native.test_accuracy import EVAL, ppl  # noqa: E402

K_ = _native.kernels
ISAS = [isa for isa in ("scalar", "avx2", "avx512vnni") if K_.cpu_supports(isa)]


def _blocks(kind: str, n: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 2.0, (n, 1))).astype(np.float32)
    if kind == "Q4_1":
        w += rng.uniform(-1, 1, (n, 1)).astype(np.float32)  # an offset: the minimum term matters
    t = getattr(gguf.GGMLQuantizationType, kind)
    raw = gguf.quants.quantize(w, t)  # u8 [n, k/32 * bytes]
    return raw, gguf.quants.dequantize(raw, t).astype(np.float32)


# ============================================================================
# Repack: bit-exact against gguf-py's own dequantisation
# ============================================================================
@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_repacked_blocks_decode_as_gguf_py_does(kind):
    raw, ref = _blocks(kind, 24, 96, seed=1)
    if kind == "Q8_0":
        q = q8_0_to_w8a8(raw, 24, 96)
        got = dequantize_w8a8(q["codes"], q["scales"])
    else:
        q = q4_to_w4a8(raw, 24, 96, kind)
        got = dequantize_w4a8(q["codes"], q["scales"], q.get("mins"))
    np.testing.assert_array_equal(got, ref)


def test_repack_refuses_a_wrong_size():
    raw, _ = _blocks("Q4_1", 4, 64, seed=2)
    with pytest.raises(ValueError, match="Q4_1: 160 bytes for \\[4, 96\\], expected 240"):
        q4_to_w4a8(raw, 4, 96, "Q4_1")


# ============================================================================
# Kernels: W4A8 + mins (Q4_1) and W8A8 (Q8_0) on every ISA this CPU has
# ============================================================================
def _reference(w_deq: np.ndarray, x: np.ndarray) -> np.ndarray:
    """float64 y = x_q · w^T with x quantised exactly as the engine does (int8 per 32)."""
    q, d, _ = K_.quantize_act_q8(x)
    xa = (q.reshape(q.shape[0], -1, 32).astype(np.float64) * d[:, :, None]).reshape(q.shape)
    return xa[:, : w_deq.shape[1]] @ w_deq.astype(np.float64).T


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "Q4_0"])
@pytest.mark.parametrize("M", [1, 5])
def test_exact_block_kernels_match_the_reference_on_every_isa(kind, M):
    N, K = 70, 160
    raw, w_deq = _blocks(kind, N, K, seed=3)
    x = np.random.default_rng(4).standard_normal((M, K)).astype(np.float32)
    ref = _reference(w_deq, x)
    before = K_.kernel_isa()
    outs = {}
    try:
        for isa in ISAS:
            assert K_.set_kernel_isa(isa)
            if kind == "Q8_0":
                q = q8_0_to_w8a8(raw, N, K)
                y = K_.gemm("w8a8", q["codes"], x, scales=q["scales"])
            else:
                q = q4_to_w4a8(raw, N, K, kind)
                y = K_.gemm("w4a8", q["codes"], x, scales=q["scales"], mins=q.get("mins"))
            outs[isa] = y
            scale = np.abs(ref).max()
            assert np.abs(y - ref).max() <= 2e-5 * scale, (isa, np.abs(y - ref).max() / scale)
    finally:
        K_.set_kernel_isa(before)
    for isa, y in outs.items():  # the ISAs agree with the scalar kernel to float rounding
        np.testing.assert_allclose(y, outs["scalar"], rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_mins_are_not_ignored():
    """Dropping the Q4_1 minimum term must change the result (the test above could not tell)."""
    raw, w_deq = _blocks("Q4_1", 32, 64, seed=5)
    x = np.abs(np.random.default_rng(6).standard_normal((1, 64))).astype(np.float32)
    q = q4_to_w4a8(raw, 32, 64, "Q4_1")
    with_m = K_.gemm("w4a8", q["codes"], x, scales=q["scales"], mins=q["mins"])
    without = K_.gemm("w4a8", q["codes"], x, scales=q["scales"])
    assert np.abs(with_m - without).max() > 0.1 * np.abs(with_m).max()


# ============================================================================
# The default model's gguf folder
# ============================================================================
@pytest.fixture(scope="module")
def eval_ids(engine):
    return engine("f32", "f32").tokenizer.encode((EVAL / "edge_agents.txt").read_text(), add_special_tokens=False).ids


@pytest.mark.parametrize("act,min_top1,max_dev", [("auto", 0.99, 0.003), ("a8", 0.94, 0.015)])
def test_gguf_folder_is_the_source_model(root, engine, eval_ids, act, min_top1, max_dev):
    f32 = engine("f32", "f32").logits(eval_ids)
    e = load_engine(root, weights="gguf", activations=act)
    assert e.native.activations == ("a16" if act == "auto" else act)
    g = e.logits(eval_ids)
    top1 = (g.argmax(-1) == f32.argmax(-1)).mean()
    ratio = ppl(g, eval_ids) / ppl(f32, eval_ids)
    assert top1 >= min_top1, f"gguf ({act}): top-1 agreement with f32 {top1:.4f}"
    assert abs(ratio - 1) <= max_dev, f"gguf ({act}): perplexity {ratio:.4f}x f32"


def _head_codes(f, names):
    """The int8 codes the tied head runs on: its own, or (recipe embed = "w8a8") the embedding's."""
    if "lm_head.weight.codes" in names:
        return f.get_tensor("lm_head.weight.codes")
    assert not any(n.startswith("lm_head") for n in names)
    return f.get_tensor("model.embed_tokens.weight.codes")


def test_gguf_folder_holds_the_files_own_blocks(root):
    import json

    from safetensors import safe_open

    recipe = json.loads((root / "gguf" / "config.json").read_text())["weights"]["recipe"]
    with safe_open(str(root / "gguf" / "model.safetensors"), framework="numpy") as f:
        names = set(f.keys())
        assert "model.layers.0.self_attn.q_proj.weight.mins" in names  # Q4_1 kept with its minimums
        assert _head_codes(f, names).dtype == np.int8  # the Q8_0 embedding as the head
        assert not any(n.endswith(".tscale") for n in names)
        if recipe.get("embed") == "w8a8":  # the file's Q8_0 rows are the lookup table, exactly
            src = gguf.GGUFReader(sorted((root.parent / "_downloads").glob("*Q4_1.gguf"))[0])
            emb = next(t for t in src.tensors if t.name == "token_embd.weight")
            want = q8_0_to_w8a8(np.asarray(emb.data, np.uint8), int(emb.shape[1]), int(emb.shape[0]))
            np.testing.assert_array_equal(f.get_tensor("model.embed_tokens.weight.codes"), want["codes"])
            np.testing.assert_array_equal(f.get_tensor("model.embed_tokens.weight.scales"), want["scales"])


# ============================================================================
# The 8-bit head of the 4-bit folders ([quant] head = "w8a8")
# ============================================================================
def test_w8a8_recipe_is_q8_0s():
    """Our W8A8 quantiser against gguf-py's Q8_0: the same f16 scales; codes equal except where
    gguf-py divides by the unrounded f32 scale (<1% of codes, never more than 1 apart)."""
    from models.quant.w8a8 import dequantize_w8a8 as deq, quantize_w8a8

    w = np.random.default_rng(7).standard_normal((64, 256)).astype(np.float32)
    ours = quantize_w8a8(w)
    ref = q8_0_to_w8a8(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0), 64, 256)
    np.testing.assert_array_equal(ours["scales"], ref["scales"])
    diff = np.abs(ours["codes"].astype(int) - ref["codes"])
    assert diff.max() <= 1 and (diff == 0).mean() >= 0.98
    assert np.abs(deq(ours["codes"], ours["scales"]) - w).max() <= np.abs(w).max() / 127


@pytest.mark.parametrize("fmt", ["nvfp4", "w4a8"])
def test_4bit_folders_carry_an_8bit_head(root, fmt):
    from safetensors import safe_open

    with safe_open(str(root / fmt / "model.safetensors"), framework="numpy") as f:
        names = set(f.keys())
        assert _head_codes(f, names).dtype == np.int8
        assert "model.layers.0.mlp.up_proj.weight.codes" in names
