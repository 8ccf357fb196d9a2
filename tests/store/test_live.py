"""The store with the real engine and agent (default model, short generations): kill -9 in the
middle of a turn, and a replay that reproduces a recorded session's ledger and answers."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from app.store import Store

ROOT = Path(__file__).resolve().parents[2]


def _env(tmp_path) -> dict:
    return os.environ | {"KVDECK_CONFIG": str(tmp_path / "none.toml"), "KVDECK_WORKSPACE": str(tmp_path / "ws"),
                         "PYTHONPATH": str(ROOT)}


def _turns(db: Path) -> list[tuple[int, str]]:
    try:
        with sqlite3.connect(db, timeout=5) as c:
            return c.execute("SELECT turn, status FROM turns ORDER BY turn").fetchall()
    except sqlite3.OperationalError:  # not created yet
        return []


def _wait(pred, timeout: float = 120.0) -> None:
    t0 = time.monotonic()
    while not pred():
        assert time.monotonic() - t0 < timeout, "timed out waiting"
        time.sleep(0.01)


def test_kill_9_mid_turn_keeps_the_completed_turns_and_marks_the_interrupted_one(root, tmp_path):
    db = tmp_path / "k.db"
    chat = subprocess.Popen(
        [sys.executable, "-m", "app", "chat", "--db", str(db), "--no-prewarm", "--no-tools", "--max-tokens", "6",
         "--threads", "1", "--tool-choice", "none"],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path, env=_env(tmp_path),
        text=True)
    try:
        chat.stdin.write("Hello there.\n")
        chat.stdin.flush()
        _wait(lambda: _turns(db) == [(1, "complete")])
        chat.stdin.write("Please summarise the maintenance checklist for the cabinet fans. " * 30 + "\n")
        chat.stdin.flush()
        _wait(lambda: (2, "running") in _turns(db))  # turn 2 is computing its long prompt
        chat.send_signal(signal.SIGKILL)
        assert chat.wait(10) == -signal.SIGKILL
    finally:
        chat.kill()
    store = Store.open(db)  # opens (WAL recovery), marks the interrupted turn
    (sid,) = [r["id"] for r in store.list_sessions()]
    d = store.session(sid)
    assert [(t["turn"], t["status"]) for t in d["turns"]] == [(1, "complete"), (2, "incomplete")]
    assert "interrupted" in d["turns"][1]["error"]
    assert [(m["turn"], m["role"]) for m in d["messages"]] == [(0, "system"), (0, "tools"), (1, "user"), (1, "assistant")]
    assert [(c["turn"], c["call"]) for c in d["engine_calls"]] == [(1, 1)]
    assert d["turns"][0]["answer"] is not None and d["session"]["status"] == "closed"
    assert [m[0] for m in store.conversation(sid)] == [0, 0, 1, 1]  # what --resume rebuilds
    store.close()

    # --resume continues it: the next turn is numbered after the interrupted one and its prompt
    # extends turn 1's prompt + reply (the rebuilt token ids)
    again = subprocess.run([sys.executable, "-m", "app", "chat", "--db", str(db), "--resume", sid[:5], "--no-prewarm"],
                           input="Again, please.\n\n", capture_output=True, cwd=tmp_path, env=_env(tmp_path), text=True,
                           timeout=300)
    assert again.returncode == 0 and "resumed after turn 2" in again.stdout, again.stderr
    store = Store.open(db)
    assert [(t["turn"], t["status"]) for t in store.rows("turns", sid)] == [(1, "complete"), (2, "incomplete"),
                                                                            (3, "complete")]
    calls = store.rows("engine_calls", sid)
    msgs = store.session(sid)["messages"]
    turn1 = [i for m in msgs if m["turn"] in (0, 1) for i in m["token_ids"]]
    (user3,) = [m for m in msgs if m["turn"] == 3 and m["role"] == "user"]
    assert user3["start"] == len(turn1)  # turn 3's message follows turn 1's reply, token for token
    assert [c["turn"] for c in calls] == [1, 3] and calls[1]["call"] == 2


def _main(argv, capsys) -> tuple[int, str]:
    from app.__main__ import main

    capsys.readouterr()
    rc = main(argv)
    return rc, capsys.readouterr().out


def _record(root, db: str) -> str:
    """A two-turn session with one tool, recorded by the real agent (short generations)."""
    import tools

    from app.chat import make_agent, start
    from app.config import RunConfig
    from app.engine import SamplingParams, load_engine
    from app.store import StoreWriter, new_id

    eng = load_engine(root, weights="nvfp4", threads=1)
    limits = RunConfig(max_steps=2, max_tokens=8, call_max_tokens=24, follow_up="none")
    sid, writer = new_id(), StoreWriter(db, kind="test")
    agent = make_agent(eng, lambda a, names: ([tools.now], None), sampling=SamplingParams(), session_id=sid,
                       run=limits)
    start(agent, writer, prewarm=True, title="tiny")
    for text, choice in (("What time is it on the device?", "now"), ("Thanks. Say it again in words.", "none")):
        for ev in agent.run_turn(text, choice):
            writer(ev)
    agent.close()
    writer.end_session(sid)
    writer.close()
    assert not writer.errors and len(writer.turn_ms) == 2
    return sid


def test_replay_reproduces_the_recorded_ledger_and_answers(root, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KVDECK_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("KVDECK_WORKSPACE", str(tmp_path / "ws"))
    db = str(tmp_path / "k.db")
    src = _record(root, db)
    store = Store.open(db)
    recorded = store.rows("engine_calls", src)
    assert [c["kind"] for c in recorded] == ["prewarm", "generate", "generate", "generate"]
    assert store.run_config(src).tools == ("now",) and store.run_config(src).threads == 1
    assert store.run_config(src).activations == "a8"  # what nvfp4 ran with, recorded resolved
    rc, out = _main(["replay", src[:6], "--rerun", "--json", "--db", db], capsys)
    assert rc == 0
    cmp = json.loads(out)
    key = lambda c: (c["turn"], c["call"], c["kind"], c["prompt_tokens"], c["cached_tokens"], c["computed_tokens"])  # noqa: E731
    assert [key(c) for c in cmp["replay_calls"]] == [key(c) for c in recorded]
    assert cmp["identical_answers"] and cmp["replay"]["answers"] == [t["answer"] for t in store.rows("turns", src)]
    assert cmp["tool_mismatches"] == [] and cmp["notes"] == []
    rep = cmp["replay_id"]
    assert store.db["sessions"].get(rep)["parent_id"] == src
    assert [r["outcome"] for r in store.rows("tool_results", rep)] == ["replayed"]

    rc, out = _main(["replay", src, "--with", "cache=off,prewarm=off", "--json", "--db", db], capsys)
    cmp = json.loads(out)
    calls = cmp["replay_calls"]
    assert [c["kind"] for c in calls] == ["generate"] * 3
    assert all(c["cached_tokens"] == 0 and c["computed_tokens"] == c["prompt_tokens"] for c in calls)
    assert [c["prompt_tokens"] for c in calls] == [c["prompt_tokens"] for c in recorded[1:]]
    assert cmp["identical_answers"], (cmp["source"]["answers"], cmp["replay"]["answers"])
    assert cmp["replay"]["computed_tokens"] > cmp["source"]["computed_tokens"]

    # other weights: the recorded a8 does not follow them (gguf's own default, a16, applies) ...
    rc, out = _main(["replay", src, "--with", "weights=gguf,prewarm=off", "--json", "--db", db], capsys)
    assert rc == 0
    rep = store.run_config(json.loads(out)["replay_id"])
    assert (rep.weight_format, rep.activations) == ("gguf", "a16")
    # ... and asking nvfp4 for 16-bit activations is refused by name, the store untouched
    n = store.db["sessions"].count
    from app.__main__ import main

    capsys.readouterr()
    rc = main(["replay", src, "--with", "act=a16", "--json", "--db", db])
    err = capsys.readouterr().err
    assert rc != 0 and "activations" in err and "a16" in err and "nvfp4" in err, err
    assert store.db["sessions"].count == n


def test_ctrl_c_cancels_the_reply_and_the_chat_goes_on(root, tmp_path):
    db = tmp_path / "c.db"
    chat = subprocess.Popen(
        [sys.executable, "-m", "app", "chat", "--db", str(db), "--no-prewarm", "--no-tools", "--max-tokens", "6",
         "--threads", "1", "--tool-choice", "none"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path, env=_env(tmp_path),
        text=True)
    try:
        chat.stdin.write("Please summarise the maintenance checklist for the cabinet fans. " * 40 + "\n")
        chat.stdin.flush()
        _wait(lambda: (1, "running") in _turns(db))
        t0 = time.monotonic()
        chat.send_signal(signal.SIGINT)
        _wait(lambda: (1, "failed") in _turns(db))
        stopped_s = time.monotonic() - t0
        chat.stdin.write("Hello.\n")
        chat.stdin.flush()
        _wait(lambda: (2, "complete") in _turns(db))
        out, err = chat.communicate("\n", timeout=60)
    finally:
        chat.kill()
    assert chat.returncode == 0, err
    assert "Traceback" not in err and "cancelled" in err, err
    assert stopped_s < 5.0
    store = Store.open(db)
    (sid,) = [r["id"] for r in store.list_sessions()]
    turns = store.rows("turns", sid)
    assert turns[0]["error"] == "cancelled" and turns[1]["status"] == "complete"
    calls = store.rows("engine_calls", sid)
    assert calls[0]["finish_reason"] == "cancelled"
    # the cancelled turn was rolled back: turn 2's prompt holds no trace of turn 1's long message
    assert calls[1]["prompt_tokens"] < calls[0]["prompt_tokens"] - 400  # the long message: ~480 tokens
    assert [m[0] for m in store.conversation(sid)] == [0, 0, 2, 2]


def test_chat_says_when_the_pool_is_too_small_and_keeps_the_session(root, tmp_path):
    db = tmp_path / "p.db"
    lines = "Hello.\n" + "Tell me about the fans. " * 80 + "\nHi again.\n\n"
    chat = subprocess.run(
        [sys.executable, "-m", "app", "chat", "--db", str(db), "--kv-pages", "30", "--no-tools", "--no-prewarm",
         "--max-tokens", "6", "--threads", "1", "--tool-choice", "none"],
        input=lines, capture_output=True, cwd=tmp_path, env=_env(tmp_path), text=True, timeout=300)
    assert chat.returncode == 0 and "Traceback" not in chat.stderr, chat.stderr
    assert "turn failed" in chat.stderr and "fit" in chat.stderr, chat.stderr  # a message, then the chat goes on
    store = Store.open(db)
    (sid,) = [r["id"] for r in store.list_sessions()]
    assert [t["status"] for t in store.rows("turns", sid)] == ["complete", "failed", "complete"]


def test_chat_trims_ahead_between_prompts_and_stores_the_trim_as_a_call(root, tmp_path):
    db = tmp_path / "t.db"
    msg = "Tell me about the fans. " * 8  # ~100 tokens a turn: the third reply leaves no room for a fourth
    lines = "".join(f"{msg}{k}\n" for k in range(6)) + "\n"
    chat = subprocess.run(
        [sys.executable, "-m", "app", "chat", "--db", str(db), "--kv-pages", "30", "--no-tools", "--no-prewarm",
         "--max-tokens", "6", "--threads", "1", "--tool-choice", "none"],
        input=lines, capture_output=True, cwd=tmp_path, env=_env(tmp_path), text=True, timeout=300)
    assert chat.returncode == 0 and "Traceback" not in chat.stderr, chat.stderr
    assert "[context trimmed ahead after turn" in chat.stdout, chat.stdout
    store = Store.open(db)
    (sid,) = [r["id"] for r in store.list_sessions()]
    assert [t["status"] for t in store.rows("turns", sid)] == ["complete"] * 6
    calls = store.rows("engine_calls", sid)
    trims = [c for c in calls if c["kind"] == "trim"]
    assert trims and all(c["trimmed_tokens"] > 0 and c["decode_tokens"] == 0 for c in trims)
    assert any(c["call"] + 1 in {d["call"] for d in calls} for c in trims), "a trim ahead of a prompt"
    # every token computed is in the ledger: a trim cut short by the next prompt leaves the rest to
    # the next call, which counts it as the trim's recomputation
    for t in trims:
        nxt = next((c for c in calls if c["call"] == t["call"] + 1), None)
        if nxt is None:  # after the last prompt: cancelled when the chat ended
            continue
        left = t["prompt_tokens"] - t["cached_tokens"] - t["computed_tokens"]
        assert nxt["kind"] == "generate" and nxt["trimmed_tokens"] == 0
        assert nxt["trim_recomputed_tokens"] == left and nxt["computed_tokens"] >= left
