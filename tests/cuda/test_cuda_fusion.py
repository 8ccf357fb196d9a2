"""The CUDA backend's decode step as a CUDA graph (on a GPU): its kernels, PDL, and the GEMVs
that quantise their input themselves.

A random SmolLM2-135M-shaped model (app/bench/gpu_model.py), 30 layers. By default the o and
down projections (short rows: K 576 and 1,536) run gemv_m1_f32, whose lanes quantise the
attention output / silu(gate) * up from f32 in registers, so the q8 and silu + q8 kernels before
them do not run: 9 kernels a layer (norm + q8, q/k/v, rope + KV write, attention split, combine,
o, add + norm + q8, gate/up, down) instead of 11 (KVDECK_CUDA_F32ACT=0). Checked: decode logits
of both equal bit for bit (the same q8 blocks, the same sums in the same order) for nvfp4 and
w4a8 weights, the captured step's kernel counts, and every kernel-to-kernel edge of the captured
graph is programmatic (PDL on every kernel of the step survived the stream capture). The GEMV
epilogues and segment GEMVs of earlier sessions (fewer kernels too, but slower) were removed
(kernels/cuda/NOTES.md, session 6).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from app.engine import _native

pytestmark = [pytest.mark.cuda, pytest.mark.skipif("cuda" not in _native.backends(),
                                                   reason="no usable CUDA backend (build or GPU)")]
LAYERS = 30


def _graph_line(err: str) -> tuple[int, int, int]:
    m = re.findall(r"kvdeck cuda graph \d+: \d+ nodes, (\d+) kernels, (\d+) edges \((\d+) programmatic\)", err)
    assert m, err[-2000:]
    return tuple(int(v) for v in m[-1])


@pytest.mark.parametrize("weights, kv", [("nvfp4", "f16"), ("w4a8", "nvfp4")])
def test_f32_activation_gemvs_equal_two_kernels_and_pdl_edges(weights, kv, monkeypatch, capfd):
    from app.bench import gpu_model

    t = gpu_model.random_tensors("smollm2-135m", weights, "w8a8", LAYERS, seed=5)
    prompt = np.random.default_rng(8).integers(0, 49152, 19).astype(np.int32)
    logits, counts = {}, {}
    monkeypatch.setenv("KVDECK_CUDA_GRAPH_INFO", "1")
    for f32act in ("1", "0"):
        monkeypatch.setenv("KVDECK_CUDA_F32ACT", f32act)  # read when the backend is created
        eng = gpu_model.build("smollm2-135m", weights, kv, "cuda", tensors=t, head="w8a8", layers=LAYERS)
        capfd.readouterr()
        s = eng.open_sequence(0)
        tok, out = int(eng.forward(s, prompt, False, None).argmax()), []
        for _ in range(6):  # eager, capture, replays
            out.append(eng.forward(s, np.array([tok], np.int32), False, None))
            tok = int(out[-1].argmax())
        eng.close_sequence(s)
        logits[f32act], counts[f32act] = out, _graph_line(capfd.readouterr().err)
        del eng
    monkeypatch.delenv("KVDECK_CUDA_F32ACT")
    (k1, e1, p1), (k0, e0, p0) = counts["1"], counts["0"]
    print(f"\n{weights} weights, {kv} KV: captured decode step {k1} kernels ({k1 / LAYERS:.1f} a layer) with the "
          f"f32-activation GEMVs, {k0} without; {p1} of {e1} edges programmatic")
    for a, b in zip(logits["1"], logits["0"]):
        np.testing.assert_array_equal(a, b)
    assert 9 * LAYERS <= k1 <= 9 * LAYERS + 5 and 11 * LAYERS <= k0 <= 11 * LAYERS + 5, (k1, k0)
    assert p1 == e1 >= k1 - 1 and p0 == e0 >= k0 - 1, (p1, e1, p0, e0)
