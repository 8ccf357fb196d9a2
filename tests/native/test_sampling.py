"""Sampling where the logits are (Backend::sample, Engine.forward_sample) against the CPU
Sampler that chose every token before: the same ids from the same seed, under a mask.

Per backend this build can run (CPU here; CUDA on a GPU, where the device sort and double sums
must agree with the CPU's: see native/kernels/cuda/sampling.cu for what is exact). The draw u
comes from a second Sampler with the same seed, so both sides consume one RNG stream alike.
The engine test runs a constrained, sampled generation through Generation (the path the agent
uses) and replays it with the old host path: logits downloaded, np.where(mask), Sampler.sample.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.engine import SamplingParams, _native

BACKENDS = list(_native.backends())
PARAMS = [(0.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 5, 1.0), (0.8, 0, 0.9), (1.3, 40, 0.5), (0.6, 0, 0.3),
          (2.0, 0, 0.999), (1.0, 3000, 0.95)]


@pytest.fixture(scope="module", params=BACKENDS)
def ops(request):
    return _native.BackendOps(request.param, 2)


def _masked(logits, mask):
    return logits if mask is None else np.where(mask, logits, np.float32(-np.inf)).astype(np.float32)


@pytest.mark.parametrize("V", [1000, 49152])
@pytest.mark.parametrize("masked", [False, True])
def test_backend_sample_equals_cpu_sampler(ops, V, masked):
    rng = np.random.default_rng(V + masked)
    mismatches, n = [], 0
    for trial in range(6):
        # LM-like logits: a few strong candidates over a long tail, and exact ties
        logits = (rng.standard_normal(V) * 2.5).astype(np.float32)
        logits[rng.integers(0, V, 8)] += 9.0
        logits[rng.integers(0, V, 50)] = logits[3]
        mask = rng.random(V) < 0.3 if masked else None
        for t, k, p in PARAMS:
            seed = 1000 * trial + 7
            want_s, draw_s = _native.Sampler(seed), _native.Sampler(seed)
            for _ in range(3):  # a few tokens from one stream
                want = want_s.sample(_masked(logits, mask), t, k, p)
                u = draw_s.uniform() if t > 0 else 0.0
                got = ops.sample(logits, t, k, p, u, mask)
                n += 1
                if got != want:
                    mismatches.append((trial, t, k, p, got, want))
                if mask is not None:
                    assert mask[got], f"{ops.name} chose a masked token {got}"
    assert not mismatches, f"{ops.name}: {len(mismatches)} of {n} differ: {mismatches[:5]}"


def test_greedy_mask_ties_and_nothing_allowed(ops):
    x = np.zeros(70000, np.float32)
    x[[5, 900, 60000]] = 3.0
    mask = np.ones(70000, bool)
    assert ops.sample(x) == 5  # ties: the lowest id, as argmax
    mask[5] = False
    assert ops.sample(x, mask=mask) == 900
    mask[:] = False
    mask[12345] = True
    assert ops.sample(x, mask=mask) == 12345
    assert ops.sample(x, 0.9, 0, 1.0, 0.5, mask) == 12345  # one allowed token: always it
    with pytest.raises(ValueError, match="top_p"):
        ops.sample(x, 0.9, 0, 0.0, 0.5)


class _Mask:
    """A constraint whose mask changes every token (the agent's grammar does)."""

    def __init__(self, V: int, seed: int, n: int):
        self.rng, self.V, self.left, self.log = np.random.default_rng(seed), V, n, []

    def allowed(self):
        m = self.rng.random(self.V) < 0.05
        self.log.append(m)
        return m

    def advance(self, tok):
        self.left -= 1

    def done(self):
        return self.left <= 0


@pytest.mark.parametrize("sp", [SamplingParams(0.8, 20, 0.9, seed=11), SamplingParams(0.0)])
def test_constrained_generation_equals_the_host_path(engine, sp):
    eng = engine("nvfp4", "f16")
    prompt = eng.tokenizer.encode("The history of the printing press").ids
    c = _Mask(eng.config.vocab_size, 5, 10)
    got = list(eng.generate(prompt, sampling=sp, max_tokens=12, constraint=c, stop_ids=[]))
    assert len(got) == 10  # the constraint ended the stream
    # the old way: the logits to the host, the mask there, the Sampler there
    sampler, seq = _native.Sampler(sp.seed), eng.native.open_sequence(0)
    try:
        want, ids = [], prompt
        for m in c.log:
            lg = np.where(m, eng._forward(seq, ids), np.float32(-np.inf)).astype(np.float32)
            want.append(sampler.sample(lg, sp.temperature, sp.top_k, sp.top_p))
            ids = [want[-1]]
    finally:
        eng.native.close_sequence(seq)
    assert got == want
    assert all(m[t] for m, t in zip(c.log, got))
