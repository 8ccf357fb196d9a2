"""`kvdeck bench formats`' accuracy figures on synthetic logits (the pooled figures weight each
text by its tokens; perplexity ratios are to the reference's)."""

from __future__ import annotations

import numpy as np

from app.bench.formats import accuracy


def test_accuracy_pools_texts_by_tokens():
    rng = np.random.default_rng(0)
    texts = {"a": list(rng.integers(0, 50, 11)), "b": list(rng.integers(0, 50, 31))}
    ref = {k: rng.standard_normal((len(v), 50)).astype(np.float32) for k, v in texts.items()}
    same = accuracy(ref, ref, texts)
    assert same["all"]["top1"] == 1.0 and abs(same["all"]["ppl_ratio"] - 1.0) < 1e-12
    flat = {k: np.zeros_like(v) for k, v in ref.items()}  # uniform: perplexity = vocabulary size
    got = accuracy(flat, ref, texts)
    assert abs(got["b"]["ppl"] - 50.0) < 1e-9
    agree = sum(int((flat[k].argmax(-1) == ref[k].argmax(-1)).sum()) for k in texts)
    assert got["all"]["top1"] == agree / 42
