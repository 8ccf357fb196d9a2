"""The engine under threads: concurrent reads during generation, cancellation, option checks.

These assert what the console relies on: a UI thread polling the pool and the tree while a
worker generates never corrupts or blocks the engine; a cancel stops a long prefill quickly
and leaves the session usable; bad options are refused with a message naming them.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from app.engine import EngineError, load_engine
from app.engine import _native


def _ids(rng, n, vocab=49152):
    return [int(x) for x in rng.integers(100, vocab - 100, size=n)]


# ============================================================================
# Reads from another thread while one generates with evictions
# ============================================================================
def test_reads_from_another_thread_during_generation_keep_the_engine_whole(root):
    eng = load_engine(root, weights="nvfp4", kv="f16", kv_pages=24)  # 384 tokens: evicts constantly
    rng = np.random.default_rng(7)
    stop = threading.Event()
    errors: list[BaseException] = []
    reads = {"n": 0, "max_s": 0.0}

    def reader():
        try:
            while not stop.is_set():
                t = time.perf_counter()
                snap = eng.snapshot()
                nodes = eng.tree()
                assert eng.dropped_events == 0  # (draining here would steal the calls' events)
                reads["max_s"] = max(reads["max_s"], time.perf_counter() - t)
                assert snap["used_pages"] + snap["free_pages"] == snap["total_pages"]
                assert all(len(n["tokens"]) == len(n["pages"]) * snap["block"] for n in nodes)
                reads["n"] += 1
        except BaseException as e:  # surfaced below
            errors.append(e)

    th = threading.Thread(target=reader)
    th.start()
    try:
        shared = _ids(rng, 96)
        evicted = 0
        for i in range(10):
            g = eng.generate(shared + _ids(rng, 120), max_tokens=6, stop_ids=[])
            list(g)
            evicted += g.stats.evicted_pages
    finally:
        stop.set()
        th.join()
    assert not errors, errors[0]
    assert reads["n"] > 1000, f"only {reads['n']} reads ran beside the generation"
    assert evicted > 0, "the pool was meant to evict"
    eng.check_integrity()


def test_reads_do_not_wait_for_a_running_prefill(root):
    """snapshot / tree / progress come from a published copy: a UI thread keeps reading while
    a long prefill holds the engine (were they behind the engine's lock, none could run)."""
    eng = load_engine(root, weights="nvfp4", kv="f16", max_context=4096, max_chunk=256)
    prompt = _ids(np.random.default_rng(9), 1500)
    during = {"reads": 0, "progress": []}
    running = threading.Event()
    finished = threading.Event()

    def prefill():
        running.set()
        list(eng.generate(prompt, max_tokens=1, stop_ids=[]))
        finished.set()

    th = threading.Thread(target=prefill)
    th.start()
    running.wait()
    while not finished.is_set():
        eng.snapshot()
        eng.tree()
        p = eng.progress()
        if p is not None:
            during["reads"] += 1
            during["progress"].append(p)
        time.sleep(0.001)
    th.join()
    assert during["reads"] >= 20, f"only {during['reads']} reads completed during a 1500-token prefill"
    prog = during["progress"]
    assert prog == sorted(prog) and 0 <= prog[0] < 0.5 < prog[-1] <= 1, (prog[0], prog[-1])
    assert eng.progress() is None


def test_threads_give_identical_logits(root):
    """The pool splits work into tasks; the math per output must not depend on who ran it."""
    rng = np.random.default_rng(3)
    prompt = _ids(rng, 300)
    out = []
    for threads in (1, 2):
        eng = load_engine(root, weights="w4a8", kv="f16", threads=threads)
        assert eng.threads == threads
        out.append(eng.logits(prompt))
    np.testing.assert_array_equal(out[0], out[1])


# ============================================================================
# Cancellation
# ============================================================================
def test_cancel_stops_a_long_prefill_quickly_and_the_session_goes_on(root):
    eng = load_engine(root, weights="nvfp4", kv="f16", max_context=8192, max_chunk=256)
    rng = np.random.default_rng(11)
    prompt = _ids(rng, 3000)
    s = eng.session("cancel")
    g = s.generate(prompt, max_tokens=4, stop_ids=[])
    done = {}

    def consume():
        done["tokens"] = list(g)
        done["t"] = time.perf_counter()

    th = threading.Thread(target=consume)
    th.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until the first 256-token chunk is done
        p = eng.prefill_progress()
        if p is not None and p["done"] >= 256:
            break
        time.sleep(0.005)
    t_cancel = time.perf_counter()
    g.cancel()
    th.join(timeout=10)
    assert not th.is_alive()
    latency = done["t"] - t_cancel
    assert latency < 0.2, f"cancel took {latency * 1000:.0f} ms"
    assert done["tokens"] == []
    st = g.stats
    assert st is not None and st.finish_reason == "cancelled"
    assert 0 < st.computed_tokens < len(prompt) and st.computed_tokens % 256 == 0, st.computed_tokens
    eng.check_integrity()
    # The chunks computed before the cancel are in the cache; the session is usable.
    g2 = s.generate(prompt[: st.computed_tokens + 40], max_tokens=2, stop_ids=[])
    assert len(list(g2)) == 2
    assert g2.stats.cached_tokens >= st.computed_tokens - 16
    assert g2.stats.finish_reason == "length"


def test_cancel_between_decode_steps(root):
    eng = load_engine(root, weights="nvfp4")
    g = eng.generate(_ids(np.random.default_rng(1), 20), max_tokens=50, stop_ids=[])
    got = []
    for tok in g:
        got.append(tok)
        if len(got) == 3:
            g.cancel()
    assert len(got) == 3 and g.stats.finish_reason == "cancelled"
    assert g.stats.decode_tokens == 2


def test_full_pool_during_decode_ends_with_pool_full(root):
    eng = load_engine(root, weights="nvfp4", kv_pages=2)  # 32 tokens
    g = eng.generate(_ids(np.random.default_rng(2), 28), max_tokens=20, stop_ids=[])
    toks = list(g)
    assert g.stats.finish_reason == "pool_full", g.stats.finish_reason
    assert 1 <= len(toks) <= 5
    eng.check_integrity()


# ============================================================================
# Options are validated twice: in load_engine and in the native constructor
# ============================================================================
@pytest.mark.parametrize(
    "opts, name",
    [
        ({"kv_pages": -5}, "kv_pages"),
        ({"kv_pages": 0}, "kv_pages"),
        ({"threads": -1}, "threads"),
        ({"kv_block": 0}, "kv_block"),
        ({"kv_block": 257}, "kv_block"),
        ({"max_chunk": 0}, "max_chunk"),
        ({"max_context": 0}, "max_context"),
        ({"kv_mib": -1.0}, "kv_mib"),
    ],
)
def test_load_engine_refuses_bad_options(root, opts, name):
    with pytest.raises(EngineError, match=f"engine option {name}"):
        load_engine(root, weights="nvfp4", **opts)


@pytest.mark.parametrize(
    "key, value", [("threads", -1), ("kv_block", 300), ("kv_block", 0), ("max_chunk", 0), ("kv_pages", -3)]
)
def test_native_constructor_refuses_bad_options(key, value):
    cfg = {"hidden": 64, "intermediate": 128, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "head_dim": 32,
           "vocab": 100, "rms_eps": 1e-5, "rope_inv_freq": [1.0] * 16}
    with pytest.raises(ValueError, match=f"engine option {key}"):
        _native.Engine(cfg, {key: value})


def test_small_kv_block_still_computes(root):
    """kv_block 1..256 are all legal; an odd one must give the same logits as the default."""
    rng = np.random.default_rng(5)
    prompt = _ids(rng, 40)
    a = load_engine(root, weights="f16", kv="f32").logits(prompt)
    b = load_engine(root, weights="f16", kv="f32", kv_block=7).logits(prompt)
    np.testing.assert_allclose(a, b, rtol=0, atol=2e-4)
