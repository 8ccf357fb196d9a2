"""kpc4 KV on the CUDA backend (opt-in, KVDECK_CUDA_KPC4=1) against the CPU backend (on a GPU).

The KV write byte for byte against the CPU codec (full pages' K codes / lo / step, every V row);
decode attention (the tensor-core kernel on the K codes, the own page from staging) and prefill
attention (pages decoded to f32, the paged kernel per query page) against the CPU backend's kpc4
path; a random-weight SmolLM2-shaped model's logits (prefill and decode steps) against the CPU
engine's with kpc4 KV; without the switch the pool is refused by name. The same kernels run
under emulation without a GPU in tests/native/test_cuda_kpc4_emu.py. Skipped where the build
has no CUDA backend or the machine no GPU (CI).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from app.engine import EngineError, _native

pytestmark = [pytest.mark.cuda, pytest.mark.skipif("cuda" not in _native.backends(),
                                                   reason="no usable CUDA backend (build or GPU)")]
RNG = np.random.default_rng(20261202)


def _rel(a, b) -> float:
    return float(np.abs(a.astype(np.float64) - b).max() / max(1e-30, np.abs(b).max()))


@pytest.fixture(scope="module")
def cpu():
    return _native.BackendOps("cpu", 0)


@pytest.fixture(scope="module")
def gpu():
    old = os.environ.get("KVDECK_CUDA_KPC4")
    os.environ["KVDECK_CUDA_KPC4"] = "1"  # read by the backend (created here) and by each pool
    yield _native.BackendOps("cuda", 0)
    if old is None:
        os.environ.pop("KVDECK_CUDA_KPC4", None)
    else:
        os.environ["KVDECK_CUDA_KPC4"] = old


def _kv(ctx: int, nkv: int, D: int):
    """K as the format expects it (a mean per channel, slow drift), with a constant channel and
    one beyond E4M3's range; V normal with a zero block."""
    mean = RNG.uniform(-3, 3, (1, nkv, D))
    k = (mean + 0.5 * RNG.standard_normal((ctx, nkv, D))).astype(np.float32)
    k[:, :, 3] = 1.25
    k[:, :, 5] += 600.0
    v = RNG.standard_normal((ctx, nkv, D)).astype(np.float32)
    v[::5, :, 16:32] = 0.0
    return k, v


def test_refused_without_the_switch(monkeypatch):
    monkeypatch.delenv("KVDECK_CUDA_KPC4", raising=False)
    ops = _native.BackendOps("cuda", 0)
    k, v = _kv(20, 1, 64)
    with pytest.raises((EngineError, ValueError), match="KVDECK_CUDA_KPC4=1"):
        ops.kv_write_bytes(k, v, "kpc4")


@pytest.mark.parametrize("ctx, nkv, D", [(37, 3, 64), (64, 2, 128)])
def test_kv_write_bytes_equal_cpu_codec(cpu, gpu, ctx, nkv, D):
    k, v = _kv(ctx, nkv, D)
    (gk, gv), (ck, cv) = gpu.kv_write_bytes(k, v, "kpc4"), cpu.kv_write_bytes(k, v, "kpc4")
    full = ctx // 16 * nkv * 10 * D  # the full pages' K (the open page's K lives in staging)
    np.testing.assert_array_equal(gk[:full], ck[:full])
    np.testing.assert_array_equal(gv, cv)


@pytest.mark.parametrize("ctx, nh, nkv, D", [(1, 9, 3, 64), (16, 9, 3, 64), (17, 32, 8, 128), (300, 32, 8, 128),
                                             (1000, 9, 3, 64), (4100, 32, 8, 128)])
def test_decode_matches_cpu(cpu, gpu, ctx, nh, nkv, D):
    """Bound 3e-3: q and p in f16 on the tensor cores (the emulation's float64 check: <= 1.8e-3)."""
    k, v = _kv(ctx, nkv, D)
    q = RNG.standard_normal((1, nh * D)).astype(np.float32)
    want, got = cpu.attention(q, k, v, ctx - 1, "kpc4"), gpu.attention(q, k, v, ctx - 1, "kpc4")
    err = _rel(got, want)
    print(f"\nkpc4 decode ctx={ctx} h={nh}/{nkv} D={D}: cuda vs cpu {err:.2e}")
    assert err < 3e-3, err
    if ctx > 16:  # pooled (rounded) pages were read: f32 KV is visibly different
        assert _rel(got, cpu.attention(q, k, v, ctx - 1, "f32")) > 3 * err


@pytest.mark.parametrize("M, p0, nh, nkv, D", [(45, 0, 9, 3, 64), (45, 100, 9, 3, 64), (130, 300, 32, 8, 128),
                                               (5, 31, 32, 8, 128)])
def test_prefill_matches_cpu(cpu, gpu, M, p0, nh, nkv, D):
    """Both decode the same pages to f32 (bit for bit) and run f32 softmax kernels: 1e-4."""
    k, v = _kv(p0 + M, nkv, D)
    q = RNG.standard_normal((M, nh * D)).astype(np.float32)
    want, got = cpu.attention(q, k, v, p0, "kpc4"), gpu.attention(q, k, v, p0, "kpc4")
    err = _rel(got, want)
    print(f"\nkpc4 prefill M={M} p0={p0}: cuda vs cpu {err:.2e}")
    assert err < 1e-4, err


def test_model_logits_match_cpu(gpu):
    """A 45-token prefill and 6 decode steps (the CPU's tokens fed to both), SmolLM2-shaped random
    model, nvfp4 weights: CUDA within 3x the CPU's own best-ISA vs scalar spread (floor 1e-3), as
    tests/cuda/test_backend_cuda.py's whole-model bound."""
    from app.bench import gpu_model

    t = gpu_model.random_tensors("smollm2-135m", "nvfp4", "w8a8", seed=3)
    prompt = RNG.integers(0, 49152, 45).astype(np.int32)

    def run(eng, toks=None):
        s = eng.open_sequence(0)
        try:
            pre = eng.forward(s, prompt, True, None)
            outs, tok = [], int(pre[-1].argmax()) if toks is None else toks[0]
            for i in range(6):
                lg = eng.forward(s, np.array([tok], np.int32), False, None)
                outs.append(lg)
                tok = int(lg.argmax()) if toks is None else toks[min(i + 1, len(toks) - 1)]
            return pre, outs
        finally:
            eng.close_sequence(s)

    c = gpu_model.build("smollm2-135m", "nvfp4", "kpc4", "cpu", tensors=t, head="w8a8")
    pre_c, dec_c = run(c)
    toks = [int(pre_c[-1].argmax())] + [int(x.argmax()) for x in dec_c]
    isa = _native.kernels.kernel_isa()
    _native.kernels.set_kernel_isa("scalar")
    try:
        pre_s, dec_s = run(c, toks)
    finally:
        _native.kernels.set_kernel_isa(isa)
    g = gpu_model.build("smollm2-135m", "nvfp4", "kpc4", "cuda", tensors=t, head="w8a8")
    pre_g, dec_g = run(g, toks)
    err = max([_rel(pre_g, pre_c)] + [_rel(a, b) for a, b in zip(dec_g, dec_c)])
    ref = max([_rel(pre_s, pre_c)] + [_rel(a, b) for a, b in zip(dec_s, dec_c)])
    print(f"\nkpc4 KV model: cuda vs cpu({isa}) {err:.2e}; cpu scalar vs cpu({isa}) {ref:.2e}")
    assert err <= max(3 * ref, 1e-3), (err, ref)
