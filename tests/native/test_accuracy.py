"""Accuracy of the quantised weight and KV formats on fixed texts.

Thresholds come from measurement (this repo's eval texts, the default model):
- weights (808-token edge_agents.txt, KV f32), top-1 agreement with the f32 engine and
  perplexity ratio, f32 34.42 (manifest recipe: 8-bit tied head and embedding, GPTQ rounding
  against assets/calib/mixed.txt). Converter 3 (GPTQ in float64, the same codes on every
  machine: checked 2026-12-03 by converting with torch, MKL, oneDNN and numpy held to AVX2 on
  an AVX-512 Xeon, every tensor equal), measured 2026-12-03: nvfp4 0.751 / 1.150x, w4a8
  0.723 / 1.212x; the kernels' summation order moves the ratio by 0.001 (avx512vnni, avx2 and
  scalar). Converter 2's float32 GPTQ gave machine-dependent folders: w4a8 1.190x (Zen 3),
  1.220x (Xeon), 1.238x (Xeon with torch on AVX2) — the 1.220x failed CI. Round-to-nearest
  ("mse", no GPTQ): nvfp4 0.705 / 1.211x, w4a8 0.698 / 1.244x; with a 4-bit head as well:
  0.642 / 1.35x, 0.652 / 1.32x. The source is already Q4_1 and the model has 135M
  parameters, so a second 4-bit rounding costs a lot. Asserted: nvfp4 >= 0.74 and <= 1.18x,
  w4a8 >= 0.69 and <= 1.22x; round-to-nearest folders fail them (nvfp4 on top-1, w4a8 on
  perplexity), as do a broken kernel, a 4-bit head or the "amax" recipe (0.62/0.58,
  1.59x/1.64x). The gguf format: test_gguf_exact.py.
- KV (2121 tokens: both texts, nvfp4 weights): nvfp4 KV vs f16 KV top-1 0.817, perplexity
  +10%; asserted >= 0.75 and <= 1.15x. f16 KV vs f32 KV: top-1 0.996, asserted >= 0.98.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

EVAL = Path(__file__).resolve().parents[2] / "assets" / "eval"


def nll(logits: np.ndarray, ids: list[int]) -> np.ndarray:
    L = logits.astype(np.float64)
    m = L.max(-1, keepdims=True)
    lse = np.log(np.exp(L - m).sum(-1)) + m[:, 0]
    return lse[:-1] - L[np.arange(len(ids) - 1), ids[1:]]


def ppl(logits, ids) -> float:
    return float(np.exp(nll(logits, ids).mean()))


@pytest.fixture(scope="module")
def text_ids(engine):
    return engine("f32", "f32").tokenizer.encode((EVAL / "edge_agents.txt").read_text(), add_special_tokens=False).ids


@pytest.fixture(scope="module")
def f32_logits(engine, text_ids):
    return engine("f32", "f32").logits(text_ids)


def test_eval_text_is_long_enough(text_ids):
    assert len(text_ids) >= 512


@pytest.mark.parametrize("weights,min_top1,max_ratio", [("nvfp4", 0.74, 1.18), ("w4a8", 0.69, 1.22)])
def test_quantised_weights_track_f32(engine, text_ids, f32_logits, weights, min_top1, max_ratio):
    q = engine(weights, "f32").logits(text_ids)
    top1 = (q.argmax(-1) == f32_logits.argmax(-1)).mean()
    ratio = ppl(q, text_ids) / ppl(f32_logits, text_ids)
    assert top1 >= min_top1, f"{weights}: top-1 agreement with f32 {top1:.3f}"
    assert ratio <= max_ratio, f"{weights}: perplexity {ratio:.3f}x f32"


def test_f16_kv_tracks_f32_kv(engine, text_ids, f32_logits):
    q = engine("f32", "f16").logits(text_ids)
    assert (q.argmax(-1) == f32_logits.argmax(-1)).mean() >= 0.98


@pytest.mark.slow
def test_nvfp4_kv_over_a_2048_token_context(engine):
    text = (EVAL / "edge_agents.txt").read_text() + "\n\n" + (EVAL / "field_notes.txt").read_text()
    base = engine("nvfp4", "f16")
    ids = base.tokenizer.encode(text, add_special_tokens=False).ids
    assert len(ids) >= 2048
    ref = base.logits(ids)
    q = engine("nvfp4", "nvfp4").logits(ids)
    top1 = (q.argmax(-1) == ref.argmax(-1)).mean()
    ratio = ppl(q, ids) / ppl(ref, ids)
    assert top1 >= 0.75, f"nvfp4 KV: top-1 agreement with f16 KV {top1:.3f} over {len(ids)} tokens"
    assert ratio <= 1.15, f"nvfp4 KV: perplexity {ratio:.3f}x f16 KV"
