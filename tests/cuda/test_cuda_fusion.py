"""The CUDA backend's decode step as a CUDA graph (on a GPU): its kernel count and PDL.

The captured decode step of a random SmolLM2-135M-shaped model (app/bench/gpu_model.py) runs 10
kernels a layer (norm + q8, q/k/v, rope + KV write, attention split, combine + o's q8, o, add +
norm + q8, gate/up, silu + q8, down) plus the head, and every kernel-to-kernel edge of the
captured graph is programmatic (PDL on every kernel of the step survived the stream capture).
KVDECK_CUDA_ATTN_Q8=0 runs o's q8 as a kernel of its own (11 a layer) and gives the same logits
bit for bit. With NVFP4 KV the attention split and combine are one fused kernel (the context's
bucket has <= 4 splits; attention_impl.cuh), 9 a layer, the same logits as KVDECK_CUDA_ATTN_FUSED=0's
pair bit for bit. The GEMV epilogues, segment GEMVs and GEMVs quantising their own f32 input that
ran fewer kernels a layer measured slower on the H200 and were removed (kernels/cuda/NOTES.md,
session 6); so were the rope + KV write in the fused attention's prologue and the fused SIMT
kernel for f16 KV (session 10).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from app.engine import _native

pytestmark = [pytest.mark.cuda, pytest.mark.skipif("cuda" not in _native.backends(),
                                                   reason="no usable CUDA backend (build or GPU)")]
LAYERS = 30


def _captured_step(monkeypatch, capfd, kv: str, env: dict[str, str]) -> tuple[int, int, int, list[np.ndarray]]:
    """(kernels, edges, programmatic edges) of the captured decode step, and the logits of the
    prefill and of the eager, captured and replayed decode steps."""
    from app.bench import gpu_model

    monkeypatch.setenv("KVDECK_CUDA_GRAPH_INFO", "1")  # read when the backend is created
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    t = gpu_model.random_tensors("smollm2-135m", "nvfp4", "w8a8", LAYERS, seed=5)
    eng = gpu_model.build("smollm2-135m", "nvfp4", kv, "cuda", tensors=t, head="w8a8", layers=LAYERS)
    capfd.readouterr()
    s = eng.open_sequence(0)
    logits = [eng.forward(s, np.arange(1, 17, dtype=np.int32), False, None)]
    for tok in (5, 77, 901, 12):  # eager, capture, replay, replay
        logits.append(eng.forward(s, np.array([tok], np.int32), False, None))
    eng.close_sequence(s)
    err = capfd.readouterr().err
    m = re.findall(r"kvdeck cuda graph \d+: \d+ nodes, (\d+) kernels, (\d+) edges \((\d+) programmatic\)", err)
    assert m, err[-2000:]
    kernels, edges, prog = (int(v) for v in m[-1])
    return kernels, edges, prog, logits


def test_captured_step_kernels_and_pdl_edges(monkeypatch, capfd):
    kernels, edges, prog, _ = _captured_step(monkeypatch, capfd, "f16", {})
    print(f"\ncaptured decode step: {kernels} kernels ({kernels / LAYERS:.1f} a layer); {prog} of {edges} edges "
          f"programmatic")
    assert 8 * LAYERS <= kernels <= 8 * LAYERS + 5
    assert prog == edges >= kernels - 1, (prog, edges, kernels)


@pytest.mark.parametrize("kv", ["f16", "nvfp4"])  # the SIMT split kernel; the tensor-core one with the fresh token
def test_combine_q8_equals_separate_kernel(monkeypatch, capfd, kv):
    k1, _, p1, new = _captured_step(monkeypatch, capfd, kv, {})
    k0, _, p0, old = _captured_step(monkeypatch, capfd, kv, {"KVDECK_CUDA_ATTN_Q8": "0"})
    assert k0 - k1 == LAYERS, (k0, k1)
    assert p1 >= k1 - 1, (p1, k1)
    for a, b in zip(new, old):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("q8", ["1", "0"])
def test_fused_attention_equals_split_and_combine(monkeypatch, capfd, q8):
    """The fused decode attention over NVFP4 pages with the fresh token (one block per KV head runs
    the <= 4 splits and the combine; attention_impl.cuh) computes the split kernel + combine kernel
    pair's operations in the same order: one kernel a layer fewer, the same logits bit for bit (the
    o projection's q8 in it or not)."""
    k1, _, p1, new = _captured_step(monkeypatch, capfd, "nvfp4", {"KVDECK_CUDA_ATTN_Q8": q8})
    k0, _, _, old = _captured_step(monkeypatch, capfd, "nvfp4", {"KVDECK_CUDA_ATTN_Q8": q8, "KVDECK_CUDA_ATTN_FUSED": "0"})
    assert k0 - k1 == LAYERS, (k0, k1)
    assert p1 >= k1 - 1, (p1, k1)
    for a, b in zip(new, old):
        np.testing.assert_array_equal(a, b)


def test_gate_up_u4_equals_pipelined(monkeypatch, capfd):
    """The gate/up GEMV at four chunks a lane (not pipelined, the default for Kp >= 2048; forced
    here on SmolLM2's Kp 576) sums each row in the same order as the pipelined two chunks: the
    same kernels and the same logits bit for bit."""
    k1, _, _, u4 = _captured_step(monkeypatch, capfd, "f16", {"KVDECK_CUDA_GEMV_GU": "1"})
    k0, _, _, u2 = _captured_step(monkeypatch, capfd, "f16", {"KVDECK_CUDA_GEMV_GU": "0"})
    assert k1 == k0
    for a, b in zip(u4, u2):
        np.testing.assert_array_equal(a, b)

