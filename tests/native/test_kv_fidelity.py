"""KV formats' fidelity against f16 KV on the default model (f32 weights, 1,024 tokens).

Measured 2026-12-01 (`kvdeck bench kv --ctx 1024`, assets/eval texts, this engine):
top-1 agreement with f16 KV / perplexity ratio: nvfp4 0.835 / 1.051, nvfp4r 0.825 / 1.108,
k8v4 0.950 / 0.998. At 2K and 8K see docs/ENGINE.md (KV formats). The error is K's: with
nvfp4 V and f16 K the torch model (app/bench/kv_probe.py) gives 0.956, with nvfp4 K and f16
V 0.826, so k8v4 keeps K in 8 bits. Asserted with a margin for summation order: k8v4 >= 0.93
and ppl <= 1.02x (its K at 4 bits, i.e. nvfp4r everywhere, measures 0.825 / 1.11x and fails
both); nvfp4r >= 0.78 and <= 1.16x. kpc4 (K int4 per page and channel, the open page unrounded;
measured 2026-12-01 at 1,024 tokens: 0.954 / 0.997x, at 2K 0.952 / 1.007x, at 8K 0.982 / 1.013x)
>= 0.94 and <= 1.01x: plain nvfp4 at its 0.28x (0.835 / 1.051x) fails both.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.bench.kv import eval_ids

CTX = 1024


def nll(L: np.ndarray, ids) -> float:
    L = L.astype(np.float64)
    m = L.max(-1)
    lse = np.log(np.exp(L - m[:, None]).sum(-1)) + m
    return float((lse[:-1] - L[np.arange(len(ids) - 1), ids[1:]]).mean())


@pytest.fixture(scope="module")
def ref(engine):
    eng = engine("f32", "f16")
    ids = eval_ids(eng.tokenizer, CTX)
    return ids, eng.logits(ids)


@pytest.mark.parametrize("kv, top1_min, ppl_max", [("k8v4", 0.93, 1.02), ("nvfp4r", 0.78, 1.16),
                                                   ("kpc4", 0.94, 1.01)])
def test_kv_format_tracks_f16_kv(engine, ref, kv, top1_min, ppl_max, monkeypatch):
    monkeypatch.setenv("KVDECK_KV_FRESH", "0")  # every read rounded, as a generated token sees it
    ids, base = ref
    q = engine("f32", kv).logits(ids)
    top1 = (q.argmax(-1) == base.argmax(-1)).mean()
    ratio = np.exp(nll(q, ids) - nll(base, ids))
    assert top1 >= top1_min, f"{kv} KV: top-1 agreement with f16 KV {top1:.3f} over {len(ids)} tokens"
    assert ratio <= ppl_max, f"{kv} KV: perplexity {ratio:.4f}x f16 KV"


@pytest.mark.parametrize("kv, ratio", [("nvfp4", 0.28125), ("nvfp4r", 0.296875), ("k8v4", 0.40625),
                                       ("kpc4", 0.296875)])
def test_bytes_per_token_as_documented(engine, kv, ratio):
    from app.engine.loader import KV_BYTES, kv_bytes_per_token

    f16 = engine("f32", "f16").snapshot()["bytes_per_token"]
    got = engine("f32", kv).snapshot()["bytes_per_token"]
    assert got == f16 * ratio and KV_BYTES[kv] == 2.0 * ratio
    assert kv_bytes_per_token(kv, 30, 3, 64) == got


def test_decode_equals_prefill_for_k8v4(engine, monkeypatch):
    """A decode step reads the pages the prefill wrote through the same f32 workspace: the
    last token's logits of a prefill equal a decode of that token after the prefix (with every
    read from the pages: by default a chunk reads its own K/V unrounded, so they differ)."""
    monkeypatch.setenv("KVDECK_KV_FRESH", "0")
    eng = engine("f32", "k8v4")
    ids = eval_ids(eng.tokenizer, 300)
    full = eng.logits(ids)[-1]
    seq = eng.native.open_sequence()
    try:
        eng._forward(seq, ids[:-1])
        step = eng._forward(seq, ids[-1:])
    finally:
        eng.native.close_sequence(seq)
    assert np.array_equal(step.reshape(-1), full)


def test_bench_kv_json(root, capsys):
    import json

    from app.bench import cli

    assert cli.main(["kv", "--formats", "f16,k8v4", "--ctx", "256", "--steps", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    f16, k8 = out["rows"]
    assert (f16["kv"], k8["kv"]) == ("f16", "k8v4") and out["ref"] == "f16" and out["ctx"] == [256]
    assert f16["top1_256"] == 1.0 and f16["ppl_ratio_256"] == 1.0
    assert k8["x_f16_bytes"] == 0.40625 and 0.85 <= k8["top1_256"] <= 1.0
    assert k8["decode_tok_s_256"] > 0.5
    assert cli.main(["kv", "--formats", "f16,nvfp5"]) == 2


def test_bench_kv_speed_json(root, capsys):
    import json

    from app.bench import cli

    assert cli.main(["kv", "--speed", "--formats", "nvfp4,kpc4", "--ctx", "64", "--steps", "2", "--reps", "1",
                     "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["kv"] for r in out["speed"]] == ["nvfp4", "kpc4"]
    assert all(r["ctx"] == 64 and r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0 for r in out["speed"])
