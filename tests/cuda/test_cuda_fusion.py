"""The CUDA backend's decode step as a CUDA graph (on a GPU): its kernel count and PDL.

The captured decode step of a random SmolLM2-135M-shaped model (app/bench/gpu_model.py) runs 11
kernels a layer (norm + q8, q/k/v, rope + KV write, attention split, combine, q8, o, add + norm
+ q8, gate/up, silu + q8, down) plus the head, and every kernel-to-kernel edge of the captured
graph is programmatic (PDL on every kernel of the step survived the stream capture). The GEMV
epilogues, segment GEMVs and GEMVs quantising their own f32 input that ran fewer kernels a layer
measured slower on the H200 and were removed (kernels/cuda/NOTES.md, session 6).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from app.engine import _native

pytestmark = [pytest.mark.cuda, pytest.mark.skipif("cuda" not in _native.backends(),
                                                   reason="no usable CUDA backend (build or GPU)")]
LAYERS = 30


def test_captured_step_kernels_and_pdl_edges(monkeypatch, capfd):
    from app.bench import gpu_model

    monkeypatch.setenv("KVDECK_CUDA_GRAPH_INFO", "1")  # read when the backend is created
    t = gpu_model.random_tensors("smollm2-135m", "nvfp4", "w8a8", LAYERS, seed=5)
    eng = gpu_model.build("smollm2-135m", "nvfp4", "f16", "cuda", tensors=t, head="w8a8", layers=LAYERS)
    capfd.readouterr()
    s = eng.open_sequence(0)
    tok = eng.forward_greedy(s, np.arange(1, 17, dtype=np.int32), None)
    for _ in range(3):  # eager, capture, replay
        tok = eng.forward_greedy(s, np.array([tok], np.int32), None)
    eng.close_sequence(s)
    err = capfd.readouterr().err
    m = re.findall(r"kvdeck cuda graph \d+: \d+ nodes, (\d+) kernels, (\d+) edges \((\d+) programmatic\)", err)
    assert m, err[-2000:]
    kernels, edges, prog = (int(v) for v in m[-1])
    print(f"\ncaptured decode step: {kernels} kernels ({kernels / LAYERS:.1f} a layer); {prog} of {edges} edges "
          f"programmatic")
    assert 10 * LAYERS <= kernels <= 11 * LAYERS + 5
    assert prog == edges >= kernels - 1, (prog, edges, kernels)
