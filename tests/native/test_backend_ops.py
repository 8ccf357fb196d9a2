"""Every op of the Backend interface (native/include/kvdeck/backend.h) on random inputs, per
backend this build has, against float64 numpy references — the harness a second backend
(CUDA) is checked with, op by op, as llama.cpp's test-backend-ops checks its backends.
Where the CPU backend exists beside another, the other is also compared with it.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.engine import _native

BACKENDS = list(_native.backends())
RNG = np.random.default_rng(20261201)


@pytest.fixture(params=BACKENDS)
def ops(request):
    return _native.BackendOps(request.param, 2)


def _close(got, want, tol):
    err = np.abs(got.astype(np.float64) - want).max() / max(1e-30, np.abs(want).max())
    assert err <= tol, f"relative error {err:.2e} > {tol:.0e}"


def test_rmsnorm(ops):
    x = RNG.standard_normal((7, 96)).astype(np.float32)
    w = RNG.standard_normal(96).astype(np.float32)
    ref = x / np.sqrt((x.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-5) * w
    _close(ops.rmsnorm(x, w, 1e-5), ref, 1e-6)


@pytest.mark.parametrize("M", [1, 12])
def test_rope_rotate_half(ops, M):
    nh, D = 3, 16
    x = RNG.standard_normal((M, nh * D)).astype(np.float32)
    pos = np.arange(5, 5 + M, dtype=np.int32)
    inv = (1.0 / 10000 ** (np.arange(0, D, 2) / D)).astype(np.float32)
    a = pos[:, None].astype(np.float32) * inv[None, :]  # f32 angles, as HF
    cos, sin = np.cos(a.astype(np.float64)), np.sin(a.astype(np.float64))
    xr = x.reshape(M, nh, D).astype(np.float64)
    x1, x2 = xr[..., : D // 2], xr[..., D // 2:]
    ref = np.concatenate([x1 * cos[:, None] - x2 * sin[:, None], x2 * cos[:, None] + x1 * sin[:, None]], -1)
    _close(ops.rope(x, nh, pos, inv), ref.reshape(M, nh * D), 1e-5)


def test_silu_mul_add_bias_embed(ops):
    a, b = (RNG.standard_normal((9, 4000)).astype(np.float32) for _ in range(2))
    _close(ops.silu_mul(a, b), a / (1 + np.exp(-a.astype(np.float64))) * b, 1e-5)
    _close(ops.add(a, b).reshape(a.shape), a.astype(np.float64) + b, 1e-7)
    bias = RNG.standard_normal(4000).astype(np.float32)
    _close(ops.add_bias(a, bias), a.astype(np.float64) + bias, 1e-7)
    table = RNG.standard_normal((50, 24)).astype(np.float32)
    ids = np.array([3, 0, 49, 3], np.int32)
    np.testing.assert_array_equal(ops.embed(table, ids), table[ids])
    with pytest.raises(ValueError, match="outside the table"):
        ops.embed(table, np.array([50], np.int32))


@pytest.mark.parametrize("M", [1, 3, 70])
def test_matmul(ops, M):
    w = RNG.standard_normal((130, 96)).astype(np.float32)
    x = RNG.standard_normal((M, 96)).astype(np.float32)
    _close(ops.matmul(w, x), x.astype(np.float64) @ w.T, 1e-5)
    _close(ops.matmul(w, x, quantised_input=True), x.astype(np.float64) @ w.T, 1e-5)  # f32 ignores the int8 copy


def _attention_ref(q, k, v, p0):
    M, nhD = q.shape
    ctx, nkv, D = k.shape
    nh = nhD // D
    G = nh // nkv
    out = np.zeros((M, nh, D))
    for m in range(M):
        for h in range(nh):
            g = h // G
            s = k[: p0 + m + 1, g].astype(np.float64) @ q[m, h * D:(h + 1) * D] / np.sqrt(D)
            p = np.exp(s - s.max())
            out[m, h] = (p / p.sum()) @ v[: p0 + m + 1, g]
    return out.reshape(M, nh * D)


@pytest.mark.parametrize("M, p0", [(1, 700), (40, 300), (5, 0)])
@pytest.mark.parametrize("kv, tol", [("f32", 1e-5), ("f16", 2e-3), ("nvfp4", 0.25), ("nvfp4r", 0.3), ("k8v4", 0.25)])
def test_attention_over_pages(ops, M, p0, kv, tol):
    nkv, G, D = 2, 3, 64
    rng = np.random.default_rng(M * 100003 + p0)  # the same inputs for every backend
    q = rng.standard_normal((M, nkv * G * D)).astype(np.float32)
    k = rng.standard_normal((p0 + M, nkv, D)).astype(np.float32)
    v = rng.standard_normal((p0 + M, nkv, D)).astype(np.float32)
    if ops.name != "cpu" and kv == "f32" and M > 8:
        # The CUDA prefill kernel runs on the tensor cores: K, V and P enter the mma as f16 (q as
        # f16 hi + lo), so f32 pages get f16 pages' bound there; its decode stays f32. The f32 SIMT
        # kernel (KVDECK_CUDA_ATTN_PREFILL=paged) keeps f32's bound: test_f32_prefill_paged_exact.
        tol = 2e-3
    _close(ops.attention(q, k, v, p0, kv), _attention_ref(q, k, v, p0), tol)


@pytest.mark.skipif("cuda" not in BACKENDS, reason="no CUDA backend in this build")
def test_f32_prefill_paged_exact(monkeypatch):
    """KVDECK_CUDA_ATTN_PREFILL=paged: the f32 SIMT prefill kernel, f32 pages at f32's bound."""
    monkeypatch.setenv("KVDECK_CUDA_ATTN_PREFILL", "paged")
    ops = _native.BackendOps("cuda", 0)
    M, p0, nkv, G, D = 40, 300, 2, 3, 64
    rng = np.random.default_rng(M * 100003 + p0)
    q = rng.standard_normal((M, nkv * G * D)).astype(np.float32)
    k = rng.standard_normal((p0 + M, nkv, D)).astype(np.float32)
    v = rng.standard_normal((p0 + M, nkv, D)).astype(np.float32)
    _close(ops.attention(q, k, v, p0, "f32"), _attention_ref(q, k, v, p0), 1e-5)


@pytest.mark.skipif(len(BACKENDS) < 2, reason="only the CPU backend is built")
def test_backends_agree_with_cpu():
    cpu, others = _native.BackendOps("cpu", 2), [_native.BackendOps(b, 0) for b in BACKENDS if b != "cpu"]
    q = RNG.standard_normal((8, 384)).astype(np.float32)
    k = RNG.standard_normal((520, 2, 64)).astype(np.float32)
    v = RNG.standard_normal((520, 2, 64)).astype(np.float32)
    want = cpu.attention(q, k, v, 512, "f16")
    for o in others:
        _close(o.attention(q, k, v, 512, "f16"), want.astype(np.float64), 1e-3)
