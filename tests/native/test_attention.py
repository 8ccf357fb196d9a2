"""CPU attention kernel (ops_cpu.h attention_query / attention_segment) against a float64
softmax oracle: f32 and f16 pages, shuffled page tables, contexts that end mid-page and
span several segments (kAttnSegment = 256 keys), the AVX2 path and the portable one."""
from __future__ import annotations

import numpy as np
import pytest

from app.engine import _native

K_ = _native.kernels
TOL = 2e-5   # |out - ref| / max|v|


def _case(rng, ctx, G=3, D=64, block=16, nkv=3, dtype=np.float32):
    n_pages = (ctx + block - 1) // block + 2
    k = rng.standard_normal((n_pages, block, nkv, D)).astype(dtype) * 2
    v = rng.standard_normal((n_pages, block, nkv, D)).astype(dtype)
    q = rng.standard_normal((G, D)).astype(np.float32)
    pages = rng.permutation(n_pages).astype(np.int32)
    return q, k, v, pages


def _oracle(q, k, v, pages, g, ctx):
    block = k.shape[1]
    rows = np.concatenate([np.arange(p * block, (p + 1) * block) for p in pages])[:ctx]
    kk = k.reshape(-1, k.shape[2], k.shape[3])[rows, g].astype(np.float64)
    vv = v.reshape(-1, v.shape[2], v.shape[3])[rows, g].astype(np.float64)
    s = q.astype(np.float64) @ kk.T / np.sqrt(q.shape[1])
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ vv


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("ctx", [1, 7, 16, 33, 256, 257, 700, 2048])
@pytest.mark.parametrize("ref", [False, True])
def test_attention_matches_oracle(dtype, ctx, ref):
    rng = np.random.default_rng(ctx)
    q, k, v, pages = _case(rng, ctx, dtype=dtype)
    for g in (0, 2):
        out = K_.attention(q, k, v, pages, g=g, ctx=ctx, ref=ref)
        want = _oracle(q, k, v, pages, g, ctx)
        assert np.abs(out - want).max() <= TOL * np.abs(v).max()


def test_attention_dispatched_close_to_reference():
    rng = np.random.default_rng(7)
    q, k, v, pages = _case(rng, 1000)
    a = K_.attention(q, k, v, pages, g=1, ctx=1000)
    b = K_.attention(q, k, v, pages, g=1, ctx=1000, ref=True)
    assert np.abs(a - b).max() <= 1e-5


@pytest.mark.parametrize("kv", ["f16", "f32"])
def test_long_decode_bit_identical_to_prefill(engine, kv):
    """Decode over a context of several segments (split across threads) gives the logits of a
    prefill of the same tokens (one thread per query, f16 via the widened workspace), bit for bit."""
    eng = engine("nvfp4", kv)
    nat = eng.native
    ids = np.random.default_rng(3).integers(256, 49000, 560, dtype=np.int32)
    s = nat.open_sequence()
    try:
        full = nat.forward(s, ids, True)
    finally:
        nat.close_sequence(s)
    s = nat.open_sequence()
    try:
        nat.forward(s, ids[:540], False)
        steps = [nat.forward(s, ids[i:i + 1], False) for i in range(540, 560)]
    finally:
        nat.close_sequence(s)
    for j, logits in enumerate(steps):
        assert np.array_equal(logits, full[540 + j])
