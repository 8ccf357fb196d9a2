"""A decode step's host path (engine.cpp forward_chunk, CPU backend): the packed upload of the
step's id / position / slot / page table (one copy instead of four) and publishing only when
the forward reserved pages give the same logits bit for bit and the same published snapshot
after every call as the four-upload path that publishes every call (KVDECK_STEP_PACK=0, read
when the engine is created), across page boundaries and a prefix-cache hit."""

from __future__ import annotations

import os

import numpy as np

from app.bench import gpu_model

LAYERS = 2


def _engine(pack: bool, tensors):
    old = os.environ.get("KVDECK_STEP_PACK")
    os.environ["KVDECK_STEP_PACK"] = "1" if pack else "0"
    try:
        return gpu_model.build("smollm2-135m", "nvfp4", "f16", "cpu", tensors=tensors, layers=LAYERS,
                               max_context=512)
    finally:
        if old is None:
            os.environ.pop("KVDECK_STEP_PACK", None)
        else:
            os.environ["KVDECK_STEP_PACK"] = old


def _run(eng, prompt, toks):
    """Prefill, 20 decode steps (tokens given: both engines see the same inputs), a finish into
    the cache and a second sequence hitting it; logits and the snapshot after every call."""
    out, snaps = [], []
    s = eng.open_sequence(0)
    out.append(eng.forward(s, prompt, False, None))
    snaps.append(eng.snapshot())
    for t in toks:  # 12 + 20 tokens: pages of 16 fill at 16 and 32
        out.append(eng.forward(s, np.array([t], np.int32), False, None))
        snaps.append(eng.snapshot())
    greedy = [eng.forward_greedy(s, np.array([toks[0]], np.int32), None)]
    snaps.append(eng.snapshot())
    eng.finish(s)
    h = eng.open_sequence(0)
    ids = np.concatenate([prompt, np.array(toks, np.int32)])
    cached = eng.begin(h, ids)
    assert cached == 16  # whole pages, the last token always computed
    out.append(eng.forward(h, ids[cached:], False, None))
    greedy.append(eng.forward_greedy(h, np.array([toks[1]], np.int32), None))
    snaps.append(eng.snapshot())
    eng.close_sequence(h)
    return out, snaps, greedy


def test_packed_step_equals_four_uploads():
    t = gpu_model.random_tensors("smollm2-135m", "nvfp4", "w8a8", LAYERS, seed=7)
    rng = np.random.default_rng(7)
    prompt = rng.integers(0, 49152, 12).astype(np.int32)
    toks = [int(x) for x in rng.integers(0, 49152, 20)]
    new, old = _run(_engine(True, t), prompt, toks), _run(_engine(False, t), prompt, toks)
    for a, b in zip(new[0], old[0]):
        np.testing.assert_array_equal(a, b)
    assert new[1] == old[1]
    assert new[2] == old[2]
    assert [s["used_pages"] for s in new[1][:22]] == [1] * 5 + [2] * 16 + [3]  # pages as the steps cross 16, 32
