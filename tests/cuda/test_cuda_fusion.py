"""The CUDA backend's decode-step launch reduction (on a GPU): the GEMV epilogues and PDL.

With KVDECK_CUDA_FUSE=1 (opt-in: fewer kernels but slower on the H200, kernels/cuda/NOTES.md)
a batch-1 NVFP4 / W4A8 GEMV runs the op consuming its outputs by segments in its own blocks
(kernels_cuda.h GemvEpilogue): o / down + residual + rmsnorm + quantise and q/k/v + rope + KV
write (gate/up + silu + quantise only where its q8 does not overwrite the GEMV's input, which
the engine's one activation scratch does). Checked here: decode logits with the epilogues equal
those without (KVDECK_CUDA_FUSE=0, the separate kernels) on a 2-layer model within 1e-3 of the
largest logit (the norm's sum of squares runs in another order, which can flip an int8
rounding; 30 random layers amplify such a flip to ~1e-2, as between the CPU's own kernel
paths) with the same greedy tokens; the captured step has at most 8 kernels a layer (11
without the epilogues), and every kernel-to-kernel edge of the captured graph is programmatic
(PDL on every kernel of the step survived the stream capture). Random SmolLM2-135M-shaped
weights (app/bench/gpu_model.py).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from app.engine import _native

pytestmark = [pytest.mark.cuda, pytest.mark.skipif("cuda" not in _native.backends(),
                                                   reason="no usable CUDA backend (build or GPU)")]
LAYERS = 30


def _decode(eng, prompt: np.ndarray, steps: int) -> tuple[list[np.ndarray], list[int]]:
    s = eng.open_sequence(0)
    try:
        tok = int(eng.forward(s, prompt, False, None).argmax())
        logits, toks = [], []
        for _ in range(steps):
            lg = eng.forward(s, np.array([tok], np.int32), False, None)
            logits.append(lg)
            tok = int(lg.argmax())
            toks.append(tok)
        return logits, toks
    finally:
        eng.close_sequence(s)


@pytest.fixture(scope="module")
def tensors():
    from app.bench import gpu_model

    return {(w, n): gpu_model.random_tensors("smollm2-135m", w, "w8a8", n, seed=5)
            for w in ("nvfp4", "w4a8") for n in (2, LAYERS)}


def _build(tensors, weights: str, kv: str, monkeypatch, fuse: bool, layers: int = LAYERS):
    from app.bench import gpu_model

    monkeypatch.setenv("KVDECK_CUDA_FUSE", "1" if fuse else "0")  # read when the backend is created
    try:
        t = tensors[(weights, layers)]
        return gpu_model.build("smollm2-135m", weights, kv, "cuda", tensors=t, head="w8a8", layers=layers)
    finally:
        monkeypatch.delenv("KVDECK_CUDA_FUSE")


@pytest.mark.parametrize("weights,kv", [("nvfp4", "f16"), ("w4a8", "nvfp4"), ("nvfp4", "f32")])
def test_epilogues_equal_separate_kernels(tensors, weights, kv, monkeypatch):
    prompt = np.random.default_rng(7).integers(0, 49152, 21).astype(np.int32)
    fused, ft = _decode(_build(tensors, weights, kv, monkeypatch, True, 2), prompt, 10)
    plain, pt = _decode(_build(tensors, weights, kv, monkeypatch, False, 2), prompt, 10)
    err = max(float(np.abs(f - p).max() / np.abs(p).max()) for f, p in zip(fused, plain))
    print(f"\n{weights} weights, {kv} KV: epilogues vs separate kernels {err:.2e}")
    assert err < 1e-3, err
    assert ft == pt


def _graph_line(capfd) -> tuple[int, int, int]:
    err = capfd.readouterr().err
    m = re.findall(r"kvdeck cuda graph \d+: \d+ nodes, (\d+) kernels, (\d+) edges \((\d+) programmatic\)", err)
    assert m, err[-2000:]
    return tuple(int(v) for v in m[-1])


def test_captured_step_kernels_and_pdl_edges(tensors, monkeypatch, capfd):
    monkeypatch.setenv("KVDECK_CUDA_GRAPH_INFO", "1")
    prompt = np.arange(1, 17, dtype=np.int32)
    counts = {}
    for name, fuse in (("epilogues", True), ("separate", False)):
        capfd.readouterr()
        eng = _build(tensors, "nvfp4", "f16", monkeypatch, fuse)
        _decode(eng, prompt, 3)  # eager, capture, replay
        counts[name] = _graph_line(capfd)
    (kf, ef, pf), (ks, es, ps) = counts["epilogues"], counts["separate"]
    print(f"\ncaptured decode step: {kf} kernels with the epilogues ({kf / LAYERS:.1f} a layer), {ks} with one "
          f"kernel per op; {ps} of {es} edges programmatic")
    assert kf <= 8 * LAYERS + 5 and ks >= 10 * LAYERS
    assert pf == ef and ps == es, (pf, ef, ps, es)
