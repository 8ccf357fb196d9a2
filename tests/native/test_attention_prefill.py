"""Prefill attention: many new queries over a cached prefix (attention_queries: the rows kernel
of attention_prefill_avx2.cpp, the prefill tail of every cached agent call).

The kernel shares each K / V row among a task's rows (queries x the G query heads of a KV head)
and keeps the online softmax per page; checked here against float64 on the values the pool
stores, bit for bit against decode steps over the same pages (the arithmetic it promises to
repeat), and bit for bit across thread counts. Shapes cover D 32 / 64 / 96 / 128, G 1 / 3 / 4 /
8, tails crossing the 256-key segment edges and ending mid-page, a chunk starting at position 0
(its own causal triangle only), and row counts that leave padding in the last row block.
The neon version is checked the same way under qemu (native/tests/kernel_check_neon.cpp).
"""
from __future__ import annotations

import numpy as np
import pytest

from app.engine import _native
from test_attention import _causal_oracle, _inputs, _stored  # the float64 oracle and inputs of the decode tests

TOL = 2e-5  # |out - float64| / max|v|, as tests/native/test_attention.py
SHAPES = [(9, 3, 64), (8, 2, 128), (6, 2, 96), (4, 4, 32), (8, 1, 64)]  # (q heads, KV heads, D)


@pytest.mark.parametrize("kv", ["f32", "f16", "nvfp4"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("p0,M", [(0, 40), (490, 37), (1000, 19)])
def test_prefill_matches_float64(kv, shape, p0, M):
    """The tail's output against float64 on the stored K / V (nvfp4: the decoded values)."""
    nh, nkv, D = shape
    q, k, v = _inputs(p0 + 13 * M + D, p0, M, nh, nkv, D)
    out = _native.BackendOps("cpu", 2).attention(q, k, v, p0, kv)
    want = _causal_oracle(q, _stored(k, kv), _stored(v, kv), p0)
    err = np.abs(out - want).max() / np.abs(v).max()
    assert err <= TOL, f"{kv} {shape} p0={p0} M={M}: {err:.2e} of max|v|"


@pytest.mark.parametrize("kv", ["f32", "f16"])
@pytest.mark.parametrize("shape", SHAPES)
def test_prefill_rows_equal_decode_bitwise(kv, shape):
    """Each tail query's output equals a decode step over the same pages, bit for bit (the
    promise that lets a cached call's tail and a cold prefill give the same logits)."""
    nh, nkv, D = shape
    p0, M = 250, 29  # queries on both sides of the 256-key edge; the last page partly filled
    q, k, v = _inputs(7 + D, p0, M, nh, nkv, D)
    ops = _native.BackendOps("cpu", 1)
    full = ops.attention(q, k, v, p0, kv)
    bad = []
    for i in range(M):
        c = p0 + i + 1
        step = ops.attention(q[i:i + 1], k[:c], v[:c], p0 + i, kv)[0]
        if not np.array_equal(step, full[i]):
            bad.append(i)
    assert not bad, f"{kv} {shape}: queries {bad} differ from decode"


@pytest.mark.parametrize("kv", ["f16", "nvfp4"])
def test_prefill_threads_agree_bitwise(kv):
    """The tail over 1,300 cached tokens on 1 and 2 threads (tasks claimed in another order)."""
    q, k, v = _inputs(3, 1300, 70, 9, 3, 64)
    a = _native.BackendOps("cpu", 1).attention(q, k, v, 1300, kv)
    b = _native.BackendOps("cpu", 2).attention(q, k, v, 1300, kv)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("kv", ["f16", "nvfp4"])
@pytest.mark.parametrize("shape", [(9, 3, 64), (8, 1, 64), (8, 2, 128)])
def test_prefill_rows_do_not_depend_on_the_split(kv, shape):
    """A query's output is the same bits whichever queries share its call: the tail in one chunk
    and in three (the cached == cold promise). Over nvfp4 pages the prefill runs each segment
    whole (attention_prefill_wide_avx2.cpp), grouping rows into score pairs and P·V triples by
    their order in the call; a row's sums must still be its own."""
    nh, nkv, D = shape
    p0, M = 700, 150  # splits mid-page and across the 768 / 1024 segment edges
    q, k, v = _inputs(11 + D, p0, M, nh, nkv, D)
    ops = _native.BackendOps("cpu", 2)
    full = ops.attention(q, k, v, p0, kv)
    parts = []
    for a, b in ((0, 37), (37, 101), (101, M)):
        parts.append(ops.attention(q[a:b], k[:p0 + b], v[:p0 + b], p0 + a, kv))
    assert np.array_equal(np.concatenate(parts), full)
