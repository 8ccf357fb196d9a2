"""The prefix cache: radix tree vs a Python reference, page references, eviction, pins.

Most tests drive a tiny random model (1 layer, hidden 32, vocab 16) so thousands of
engine calls run in seconds; the logits tests use the real default model.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.engine import _native
from app.engine.loader import upload_arrays
from tests.native.radix_reference import RefCache

V, H, F, NH, NKV, D = 16, 32, 64, 2, 1, 16


def tiny_engine(pages: int, block: int = 4, kv: str = "f32", seed: int = 0) -> _native.Engine:
    rng = np.random.default_rng(seed)
    cfg = {"hidden": H, "intermediate": F, "n_layers": 1, "n_heads": NH, "n_kv_heads": NKV, "head_dim": D,
           "vocab": V, "rms_eps": 1e-5, "rope_inv_freq": (1.0 / 10000 ** (np.arange(0, D, 2) / D)).tolist()}
    eng = _native.Engine(cfg, {"kv": kv, "threads": 1, "kv_pages": pages, "kv_block": block, "max_chunk": 64})
    w = lambda *s: (rng.standard_normal(s) * 0.2).astype(np.float32)  # noqa: E731
    t = {"model.embed_tokens.weight": w(V, H), "model.norm.weight": np.ones(H, np.float32),
         "model.layers.0.input_layernorm.weight": np.ones(H, np.float32),
         "model.layers.0.post_attention_layernorm.weight": np.ones(H, np.float32)}
    for name, (n, k) in {"self_attn.q_proj": (NH * D, H), "self_attn.k_proj": (NKV * D, H),
                         "self_attn.v_proj": (NKV * D, H), "self_attn.o_proj": (H, NH * D),
                         "mlp.gate_proj": (F, H), "mlp.up_proj": (F, H), "mlp.down_proj": (H, F)}.items():
        t[f"model.layers.0.{name}.weight"] = w(n, k)
    upload_arrays(eng, t, True)
    return eng


def run_call(eng, prompt, extra, session=1):
    """begin + forward(prompt tail) + forward(t) per extra token + finish, as a Generation
    does. Returns (cached, fitted, evicted pages, last logits or None)."""
    seq = eng.open_sequence(session)
    fitted, logits = True, None
    try:
        cached = eng.begin(seq, np.array(prompt, np.int32))
        logits = eng.forward(seq, np.array(prompt[cached:], np.int32))
        for t in extra:
            logits = eng.forward(seq, np.array([t], np.int32))
    except _native.KvPoolFullError:
        fitted = False
    finally:
        eng.finish(seq)
    run_call.events = eng.drain_events()
    evicted = sum(e["pages"] for e in run_call.events if e["kind"] == "evict")
    return cached, fitted, evicted, logits


# ---- differential: native tree vs the Python reference ----------------------------------
tokens = st.lists(st.integers(0, 2), min_size=1, max_size=40)  # 3 symbols: prefixes collide often
ops = st.lists(
    st.one_of(
        st.tuples(st.just("call"), tokens, st.lists(st.integers(0, 2), max_size=6)),
        st.tuples(st.just("pin"), tokens),
        st.tuples(st.just("unpin_last")),
        st.tuples(st.just("evict"), st.integers(1, 6)),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, pages=st.integers(4, 24))
def test_native_tree_matches_reference(ops, pages):
    eng, ref = tiny_engine(pages), RefCache(block=4, total_pages=pages)
    pinned: list[tuple[int, list[int]]] = []
    for op in ops:
        if op[0] == "call":
            _, prompt, extra = op
            cached, fitted, evicted, _ = run_call(eng, prompt, extra)
            r_cached, r_fitted = ref.call(prompt, extra)
            assert (cached, fitted, evicted) == (r_cached, r_fitted, ref.evicted), op
        elif op[0] == "pin":
            pin_id, n = eng.pin(1, np.array(op[1], np.int32))
            assert n == ref.pin(op[1])
            pinned.append((pin_id, op[1][:n]))
        elif op[0] == "unpin_last" and pinned:
            pin_id, ids = pinned.pop()
            eng.unpin(pin_id)
            ref.unpin(ids)
        elif op[0] == "evict":
            ref.evicted = 0
            assert eng.evict(op[1], "test") == ref.evict(op[1])
        eng.drain_events()
        eng.check_integrity()
        snap = eng.snapshot()
        assert snap["cached_pages"] == len(ref.last)
        assert snap["free_pages"] == ref.free
    assert eng.release_session(1) == len(pinned)
    eng.clear_cache()
    eng.check_integrity()
    assert eng.snapshot()["free_pages"] == pages, "every page returns to the pool"


# ---- references, locks, pins, eviction ----------------------------------------------------
def test_refcounts_return_to_zero():
    eng = tiny_engine(32)
    seqs = []
    for i in range(3):
        s = eng.open_sequence(i + 1)
        eng.begin(s, np.array([1, 2, 1, 2, 1, 2, 0, i], np.int32))
        eng.forward(s, np.array([1, 2, 1, 2, 1, 2, 0, i], np.int32)[eng.sequence_tokens(s).__len__():])
        seqs.append(s)
        eng.check_integrity()
    for s in seqs:
        eng.finish(s)
    eng.check_integrity()
    assert eng.snapshot()["locked_pages"] == 0
    eng.clear_cache()
    snap = eng.snapshot()
    assert snap["free_pages"] == snap["total_pages"] == 32 and snap["tree_nodes"] == 0


def test_pool_full_is_an_error_not_a_crash():
    eng = tiny_engine(4)
    seq = eng.open_sequence(1)
    with pytest.raises(_native.KvPoolFullError, match="17 tokens need 5 more pages"):
        eng.forward(seq, np.zeros(17, np.int32))
    assert eng.sequence_tokens(seq) == []  # nothing half-written
    eng.forward(seq, np.zeros(16, np.int32))  # what fits still works
    eng.close_sequence(seq)
    eng.check_integrity()


def test_lru_keeps_the_pinned_prefix_under_pressure():
    eng = tiny_engine(12)
    system = [1] * 16  # 4 pages, the static prefix
    cached, *_ = run_call(eng, system + [2], [])
    pin_id, n = eng.pin(7, np.array(system, np.int32))
    assert n == 16
    # Other sessions push 8-page prompts through a 12-page pool: every call evicts.
    for i in range(6):
        run_call(eng, [2, i % 3] * 16 + [0], [], session=100 + i)
    cached, fitted, _, _ = run_call(eng, system + [0, 0, 0, 0, 1], [])
    assert fitted and cached == 16, "the pinned system prompt survived the pressure"
    eng.unpin(pin_id)
    eng.check_integrity()


def test_eviction_events_name_the_prefix_and_its_owner():
    eng = tiny_engine(8)
    run_call(eng, [1, 1, 1, 1, 2, 2, 2, 2, 0], [], session=5)
    run_call(eng, [0, 0, 0, 0] * 5 + [1], [], session=6)
    eng.drain_events()
    _, fitted, evicted, _ = run_call(eng, [2] * 12 + [1], [], session=9)  # needs 4 pages, 1 free
    assert fitted and evicted == 3
    evicts = [e for e in run_call.events if e["kind"] == "evict"]
    # LRU: session 5's older prefix goes first, then the tail of session 6's.
    assert [(e["session"], e["pages"]) for e in evicts] == [(5, 2), (6, 1)]
    assert evicts[0]["head"] == [1, 1, 1, 1, 2, 2, 2, 2] and evicts[0]["prefix_tokens"] == 0
    assert evicts[1]["head"] == [0] * 8 and evicts[1]["prefix_tokens"] == 16
    assert all(e["reason"] == "pool full: 4 pages needed" for e in evicts)


# ---- logits: cached == cold, on the real model --------------------------------------------
@pytest.mark.parametrize("kv", ["f32", "f16", "k8v4", "kpc4"])
def test_cached_logits_equal_cold_prefill(engine, kv, monkeypatch):
    """Multi-turn: each call's logits served from the cache are bit-identical to a cold
    prefill of the same prompt, across page boundaries and after evictions. (A quantised pool
    lets a chunk read its own K/V unrounded, so there a cached call differs from a cold one by
    design; the pages themselves are what must agree: checked with that switched off. kpc4
    rounds a page only when it is full and reads the open one from its staging, so a prefix
    ending mid-page recomputes that page's tail and agrees as it is; no staging is left.)"""
    from app.engine import load_engine

    if kv == "k8v4":
        monkeypatch.setenv("KVDECK_KV_FRESH", "0")

    from tests.conftest import model_root

    cold = engine("f32", kv)
    warm = load_engine(model_root(), weights="f32", kv=kv, kv_pages=24)  # 384 tokens: evicts
    tok = warm.tokenizer
    history = tok.encode("<|im_start|>system\nYou watch a robot fleet's batteries.<|im_end|>\n").ids
    for turn, text in enumerate(["Status of unit 7?", "And unit 12, the one by the dock?",
                                 "Summarise both in one line.", "Schedule a charge for 3 pm."]):
        history += tok.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n").ids
        seq = warm.native.open_sequence(1)
        cached = warm.native.begin(seq, np.array(history, np.int32))
        logits = warm.native.forward(seq, np.array(history[cached:], np.int32))
        warm.native.finish(seq)
        ref = cold.logits(history)[-1]
        assert np.array_equal(logits, ref), f"turn {turn}: cached {cached} of {len(history)}"
        if turn:
            assert cached > 0
        history += tok.encode(f"Reply {turn} with some words.<|im_end|>\n").ids
        if turn == 2:
            warm.native.evict(3, "test")  # drop part of the cached path
    warm.check_integrity()
    if kv == "kpc4":  # its open pages' staging is given back
        assert warm.snapshot()["kv_staged_pages"] == 0
