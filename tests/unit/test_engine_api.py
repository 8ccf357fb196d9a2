"""The engine as a user meets it: loading errors, chat, sampling, sessions and the ledger."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from app.engine import EngineError, KvPoolFull, SamplingParams, _native, load_engine
from app.engine.chat_format import Message, chat_format_for


@pytest.fixture(scope="module")
def eng(engine):
    return engine("nvfp4", "f32")


def chat_ids(eng, text, system=None):
    fmt = chat_format_for(eng.config.chat_format, eng.tokenizer)
    msgs = ([Message("system", system)] if system else []) + [Message("user", text)]
    return fmt.prompt_ids(msgs)


# ---- chat ---------------------------------------------------------------------------------
def test_greedy_chat_answer_stops_at_the_stop_token(eng):
    g = eng.generate(chat_ids(eng, "What is the capital of France?"), max_tokens=48)
    tokens = list(g)
    assert tokens and "Paris" in g.text()
    assert g.stats.finish_reason == "stop"
    assert g.output_ids[-1] in eng.config.stop_token_ids and g.output_ids[-1] not in tokens
    st = g.stats
    assert st.prompt_tokens == len(g.prompt) and st.decode_tokens == len(tokens)  # one step per token, the last one produced the stop
    assert st.ttft_s > 0 and st.decode_tok_s > 0


def test_length_limit_and_early_close_keep_a_ledger(eng):
    g = eng.generate(chat_ids(eng, "Count from one to fifty in words."), max_tokens=5)
    assert len(list(g)) == 5 and g.stats.finish_reason == "length"
    g = eng.generate(chat_ids(eng, "Count from one to fifty in words."), max_tokens=50)
    next(g), next(g)
    g.close()
    assert g.stats.finish_reason == "cancelled"
    eng.check_integrity()


# ---- sampling -----------------------------------------------------------------------------
def test_sampler_against_numpy_softmax():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(50).astype(np.float32) * 2
    s = _native.Sampler(1)
    assert s.sample(logits, 0.0) == int(np.argmax(logits))
    assert all(s.sample(logits, 1.0, top_k=1) == int(np.argmax(logits)) for _ in range(20))
    n = 20000
    counts = np.bincount([s.sample(logits, 0.7) for _ in range(n)], minlength=50) / n
    p = np.exp((logits - logits.max()) / 0.7)
    p /= p.sum()
    assert np.abs(counts - p).max() < 0.02
    # top-p keeps the smallest set holding p of the mass
    order = np.argsort(-p)
    nucleus = set(order[: np.searchsorted(np.cumsum(p[order]), 0.5) + 1].tolist())
    assert {s.sample(logits, 0.7, top_p=0.5) for _ in range(2000)} <= nucleus
    assert {s.sample(logits, 1.0, top_k=3) for _ in range(2000)} == set(np.argsort(-logits)[:3].tolist())


def test_seeded_sampling_is_reproducible(eng):
    """The seed decides the sample: the same seed repeats the tokens, other seeds change them
    (a sampler that ignored the seed, fixed or fresh entropy, fails one of the two)."""
    ids = chat_ids(eng, "Tell me about robots.")

    def run(seed):
        sp = SamplingParams(temperature=1.0, top_p=1.0, seed=seed)
        return tuple(eng.generate(ids, sp, max_tokens=12))

    a = run(42)
    assert run(42) == a
    others = {run(seed) for seed in (1, 2, 3)}
    assert len(others | {a}) >= 3, f"4 seeds gave only {len(others | {a})} distinct samples"


def test_bad_sampling_parameters_are_refused():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)


# ---- sessions and the ledger ----------------------------------------------------------------
def test_second_call_is_served_from_cache(eng):
    fmt = chat_format_for(eng.config.chat_format, eng.tokenizer)
    with eng.session("ledger") as s:
        p1 = chat_ids(eng, "Name a planet.", system="You answer in one short sentence. " * 8)
        g1 = s.generate(p1, max_tokens=20)
        list(g1)
        p2 = g1.prompt + g1.output_ids + fmt.encode("\n") + fmt.message_ids(Message("user", "Another one?")) + fmt.encode(fmt.assistant_prefix())
        g2 = s.generate(p2, max_tokens=20)
        list(g2)
    a, b = g1.stats, g2.stats
    seen = len(g1.prompt) + len(g1.output_ids)
    # Everything this session saw before is cached down to the page boundary (the last
    # output token was never run through the model, so its K/V does not exist).
    assert b.cached_tokens >= (seen - 1) // 16 * 16
    assert b.cached_tokens + b.computed_tokens == b.prompt_tokens
    assert b.new_tokens == len(p2) - seen and b.waste_tokens == b.computed_tokens - b.new_tokens
    assert b.waste_tokens < 16 and b.reuse == pytest.approx(b.cached_tokens / b.prompt_tokens)
    assert a.cached_tokens <= a.prompt_tokens


def test_prewarm_pins_a_prefix_until_close(eng):
    eng.clear_cache()
    static = chat_ids(eng, "static", system="You operate a robot fleet. " * 20)
    s = eng.session("pinner")
    warm = s.prewarm(static)
    n = warm.pinned_tokens
    assert n == len(static) // 16 * 16 and eng.snapshot()["pinned_pages"] == n // 16
    # The pre-warm is an engine call of its own in the ledger: all of it computed, nothing decoded.
    st = warm.stats
    assert st.kind == "prewarm" and st.prompt_tokens == len(static)
    assert st.cached_tokens + st.computed_tokens == len(static) and st.computed_tokens > 0
    assert st.new_tokens == len(static) and st.decode_tokens == 0
    assert any(e["kind"] == "pin" for e in warm.events), "the pin event belongs to the pre-warm call"
    assert eng.clear_cache() == 0, "pinned pages survive a clear"
    g = s.generate(static + chat_ids(eng, "Go."), max_tokens=4)
    list(g)
    assert g.stats.cached_tokens >= n
    assert not any(e["kind"] == "pin" for e in g.events), "pre-warm events are not handed to the next call"
    assert g.stats.new_tokens == g.stats.prompt_tokens - len(static), "the pre-warmed ids count as sent"
    s.close()
    assert eng.snapshot()["pinned_pages"] == 0
    eng.clear_cache()
    eng.check_integrity()
    assert eng.snapshot()["used_pages"] == 0


def test_pool_too_small_is_a_clear_error(root):
    small = load_engine(root, weights="nvfp4", kv_pages=2)
    with pytest.raises(KvPoolFull, match="tokens need"):
        list(small.generate(list(range(100, 140)), max_tokens=2))
    assert list(small.generate(list(range(100, 120)), max_tokens=2))  # still usable
    small.check_integrity()


def test_kv_mib_sets_the_pool_size(root):
    e = load_engine(root, weights="nvfp4", kv="nvfp4", kv_mib=8)
    snap = e.snapshot()
    assert snap["bytes_per_token"] == 2 * 30 * 3 * (32 + 4)  # 0.28125x of f16's 23040
    assert snap["total_pages"] == 8 * 2**20 // (snap["bytes_per_token"] * 16)


# ---- load errors name the file and the problem ------------------------------------------------
@pytest.fixture()
def folder_copy(root, tmp_path):
    dst = tmp_path / "nvfp4"
    shutil.copytree(root / "nvfp4", dst)
    return dst


def test_truncated_safetensors(folder_copy):
    f = folder_copy / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(EngineError, match=r"model\.safetensors.*truncated"):
        load_engine(folder_copy)


def test_config_errors(folder_copy):
    cfg = json.loads((folder_copy / "config.json").read_text())
    (folder_copy / "config.json").write_text(json.dumps(cfg | {"format_version": 7}))
    with pytest.raises(EngineError, match=r"config\.json: format_version 7"):
        load_engine(folder_copy)
    (folder_copy / "config.json").write_text(json.dumps(cfg | {"architecture": "mixtral"}))
    with pytest.raises(EngineError, match=r"architecture 'mixtral' is not supported"):
        load_engine(folder_copy)
    bad = dict(cfg)
    del bad["hidden_size"]
    (folder_copy / "config.json").write_text(json.dumps(bad))
    with pytest.raises(EngineError, match=r"field 'hidden_size' is missing"):
        load_engine(folder_copy)
    (folder_copy / "config.json").write_text(json.dumps(cfg | {"num_hidden_layers": 31}))
    with pytest.raises(EngineError, match=r"model\.layers\.30\.input_layernorm\.weight is missing"):
        load_engine(folder_copy)


def test_missing_tokenizer_and_unknown_format(folder_copy, root):
    (folder_copy / "tokenizer.json").unlink()
    with pytest.raises(EngineError, match=r"tokenizer\.json: missing"):
        load_engine(folder_copy)
    with pytest.raises(EngineError, match="weights 'int3' is not a weight format"):
        load_engine(root, weights="int3")
    with pytest.raises(EngineError, match="kv format 'bf16'"):
        load_engine(root, kv="bf16")


def test_token_id_outside_the_vocabulary(eng):
    with pytest.raises(EngineError, match="token id 60000 at index 1 is outside the vocabulary"):
        eng.logits([5, 60000])


# ---- the command line ----------------------------------------------------------------------
def test_kvdeck_run_json_prints_the_ledger_and_reply():
    out = subprocess.run(
        [sys.executable, "-m", "app", "run", "--json", "--no-tools", "--max-tokens", "24", "What is the capital of France?"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    last = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("prompt_tokens", "cached_tokens", "computed_tokens", "new_tokens", "ttft_s", "prefill_s", "decode_s",
                "decode_tokens", "decode_tok_s", "kv_used_pages", "evicted_pages"):
        assert key in last
    assert "Paris" in last["reply"] and last["finish_reason"] == "stop"


def test_kvdeck_reports_a_missing_model_without_a_traceback(tmp_path):
    out = subprocess.run([sys.executable, "-m", "app", "run", "--model", str(tmp_path / "nope"), "hi"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "kvdeck: error:" in out.stderr and "Traceback" not in out.stderr


def test_console_runtime_does_not_import_torch_or_textual():
    code = "import sys, app.__main__, app.engine, app.engine.loader; print(sorted(m for m in ('torch','textual','transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
