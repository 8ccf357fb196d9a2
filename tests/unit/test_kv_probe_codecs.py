"""The KV study's per-page-channel codecs (app/bench/kv_probe_codecs.py) and the probe's
own-page attention: the references a C++ port of the "pce" / "pcz" K formats would be checked
against. Values are compared with float64 bounds, no model needed."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from app.bench.kv_probe import attend  # noqa: E402
from app.bench.kv_probe_codecs import (int4_asym_e4m3, int4_asym_f16, int4_window_int8,  # noqa: E402
                                       pages_of_16)


def blocks(seed=0, n=4000):
    g = torch.Generator().manual_seed(seed)
    off = torch.randn(n, 1, generator=g) * 30  # a channel's offset dwarfs its variation (K's case)
    spread = torch.rand(n, 1, generator=g) * 2
    y = off + spread * torch.randn(n, 16, generator=g)
    y[:3] = 0.0                       # an all-zero block
    y[3:6] = y[3:6, :1]               # constant blocks
    y[6] = 1000.0 + torch.arange(16)  # offset / range beyond int8 steps: the step widens
    return y


@pytest.mark.parametrize("fn", [int4_asym_f16, int4_asym_e4m3, int4_window_int8])
def test_asymmetric_int4_keeps_every_value_within_half_a_step(fn):
    y = blocks()
    if fn is int4_asym_e4m3:  # its minimum is one E4M3 value: blocks beyond 448 are out of its range
        y = y[y.abs().amax(-1) < 400]
    q = fn(y)
    rng = (y.amax(-1) - y.amin(-1)).double()
    lo = y.amin(-1).abs().double()
    if fn is int4_asym_e4m3:  # its minimum is an E4M3 value at or below min: up to 12.5% of |min| lower
        rng = rng + 0.125 * lo
    step = torch.maximum(rng / 15, lo / 127)  # a window's step at the least
    # E4M3's step (3 mantissa bits) is up to 12.5% coarser per code; two codes of search at most
    bound = 0.5 * step * 1.125**2 + 1e-3 * (1 + y.abs().amax(-1).double() / 64)
    err = (q - y).abs().amax(-1).double()
    assert (err <= bound).all(), f"{fn.__name__}: worst block error {float((err / bound).max()):.2f} of the bound"
    assert torch.equal(q[:3], y[:3])  # zero blocks stay zero


def test_window_beats_an_e4m3_minimum():
    y = blocks(1)
    e_win = (int4_window_int8(y) - y).pow(2).mean().item()
    e_e4 = (int4_asym_e4m3(y) - y).pow(2).mean().item()
    assert e_win < e_e4


def test_pages_of_16_round_each_channel_over_its_page():
    # per (page, head, channel) one asymmetric block: a channel constant within each page is exact
    T, nkv, D = 40, 2, 8
    x = torch.randn(math.ceil(T / 16), nkv, D).half().float().repeat_interleave(16, 0)[:T]
    assert torch.equal(pages_of_16(x, int4_asym_f16), x)
    x2 = x.clone()
    x2[17, 0, 3] += 5.0  # one token of page 1 moves: only that page's channel re-rounds
    diff = (pages_of_16(x2, int4_asym_f16) - pages_of_16(x, int4_asym_f16)).abs().amax(-1)  # [T, nkv]
    changed = (diff > 0).nonzero()[:, 0]
    assert changed.min() >= 16 and changed.max() < 32


def test_own_page_attention_reads_the_exact_rows_of_its_page():
    g = torch.Generator().manual_seed(2)
    n, nh, nkv, D = 48, 4, 2, 8
    q = torch.randn(n, nh, D, generator=g)
    k, v = torch.randn(n, nkv, D, generator=g), torch.randn(n, nkv, D, generator=g)
    ref = attend(q, k, v, 0, nh // nkv)
    assert torch.allclose(attend(q, k, v, 0, nh // nkv, (k, v)), ref, atol=1e-6)  # same rows: same result
    kq, vq = k + 0.3, v - 0.2  # "rounded" rows
    got = attend(q, kq, vq, 0, nh // nkv, (k, v))
    assert torch.allclose(got[:16], ref[:16], atol=1e-6)  # the first page reads only its own rows
    assert not torch.allclose(got[16:], ref[16:], atol=1e-3)  # later pages read rounded earlier pages
