"""The writer, export → import, malformed imports, id prefixes, search, delete, two writer processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.store import Store, StoreError, StoreWriter
from app.store.export import export_dict, export_json, export_markdown, import_file
from synthetic import session_events

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def write(path, sid: str, turns: int = 2) -> StoreWriter:
    w = StoreWriter(path, kind="test")
    for ev in session_events(sid, turns):
        w(ev)
    w.end_session(sid)
    w.close()
    assert not w.errors, w.errors
    return w


def test_writer_commits_each_turn_and_the_ledger(tmp_path):
    w = write(tmp_path / "a.db", "a1b2c3d4e5f6", turns=3)
    assert len(w.turn_ms) == 3
    store = Store.open(tmp_path / "a.db")
    d = store.session("a1b2c3d4e5f6")
    assert [t["status"] for t in d["turns"]] == ["complete"] * 3
    assert [t["now"] for t in d["turns"]][0] == "2026-05-09T07:31:00+00:00"
    calls = d["engine_calls"]
    assert [(c["turn"], c["call"], c["kind"]) for c in calls][:3] == [(0, 0, "prewarm"), (1, 1, "generate"), (1, 2, "generate")]
    assert all(c["kv_bytes_per_token"] == 18432.0 and c["kv_block"] == 16 for c in calls)
    msgs = d["messages"]
    assert [m["role"] for m in msgs[:6]] == ["system", "tools", "user", "assistant", "tool", "assistant"]
    assert [m["seq"] for m in msgs] == list(range(len(msgs)))
    assert msgs[2]["token_ids"] == [100, 101, 102, 103, 104] and (msgs[2]["start"], msgs[2]["end"]) == (8, 13)
    assert len(d["cache_events"]) == 6 and len(d["tool_results"]) == 3
    conv = store.conversation("a1b2c3d4e5f6")  # what --resume rebuilds: every id, in order
    assert sum(len(m[3]) for m in conv) == msgs[-1]["end"]


def test_export_import_round_trip(tmp_path):
    write(tmp_path / "a.db", "0123456789ab")
    src = Store.open(tmp_path / "a.db")
    f = tmp_path / "s.json"
    f.write_text(export_json(src, "0123456789ab"))
    dst = Store.open(tmp_path / "b.db")
    assert import_file(dst, f) == "0123456789ab"
    a, b = export_dict(src, "0123456789ab"), export_dict(dst, "0123456789ab")
    assert a["session"].pop("kind") == "test" and b["session"].pop("kind") == "test"
    assert a == b
    assert dst.run_config("0123456789ab") == src.run_config("0123456789ab")
    md = export_markdown(dst, "0123456789ab")
    assert "## Turn 2 (complete)" in md and "| 0 | 0 | prewarm |" in md
    with pytest.raises(StoreError, match="already in"):
        import_file(dst, f)


def _count(store: Store) -> tuple[int, ...]:
    return tuple(store.db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                 for t in ("sessions", "turns", "messages", "engine_calls"))


@pytest.mark.parametrize("mangle, message", [
    (lambda d: "not json at all {", "not valid JSON"),
    (lambda d: json.dumps([1, 2]), "top level: expected a JSON object"),
    (lambda d: json.dumps(d | {"format": "other"}), "format: expected 'kvdeck-session'"),
    (lambda d: json.dumps(d | {"version": 9}), "version: this kvdeck reads version 1"),
    (lambda d: json.dumps(d | {"session": d["session"] | {"id": "xyz"}}), "session.id"),
    (lambda d: json.dumps(d | {"session": d["session"] | {"run": {"weight_formatt": "f16"}}}), "session.run: RunConfig has no field weight_formatt"),
    (lambda d: json.dumps(d | {"messages": d["messages"][:3] + [d["messages"][3] | {"colour": 1}]}), r"messages\[3\]: unknown field colour"),
    (lambda d: json.dumps(d | {"messages": [d["messages"][0] | {"token_ids": [1, "x"]}]}), r"messages\[0\].token_ids"),
    (lambda d: json.dumps(d | {"engine_calls": [{"turn": 1, "call": "one", "kind": "generate"}]}), r"engine_calls\[0\].call: expected an integer"),
    (lambda d: json.dumps(d | {"turns": d["turns"] + d["turns"][:1]}), "UNIQUE constraint failed"),  # caught by SQLite: rolled back
])
def test_a_malformed_export_is_a_clear_error_and_imports_nothing(tmp_path, mangle, message):
    write(tmp_path / "a.db", "fedcba987654")
    data = export_dict(Store.open(tmp_path / "a.db"), "fedcba987654")
    dst = Store.open(tmp_path / "b.db")
    write(tmp_path / "b.db", "111111111111")  # the target already holds a session
    before = _count(dst)
    f = tmp_path / "bad.json"
    f.write_text(mangle(data))
    with pytest.raises(StoreError, match=message) as e:
        import_file(dst, f)
    assert str(f) in str(e.value)
    assert _count(dst) == before


def test_ids_by_prefix_search_and_delete(tmp_path):
    path = tmp_path / "a.db"
    write(path, "abc111111111")
    write(path, "abc222222222")
    store = Store.open(path)
    with pytest.raises(StoreError, match="ambiguous"):
        store.resolve("abc")
    with pytest.raises(StoreError, match="no session"):
        store.resolve("999")
    assert store.resolve("abc2") == "abc222222222" and store.short("abc222222222") == "abc2222"
    hits = store.search("filter")
    assert {h["session_id"] for h in hits} == {"abc111111111", "abc222222222"}
    store.delete("abc111111111")
    assert {h["session_id"] for h in store.search("filter")} == {"abc222222222"}
    assert store.db.execute("SELECT count(*) FROM messages WHERE session_id = 'abc111111111'").fetchone()[0] == 0


WRITER = """
import sys
sys.path[:0] = [{root!r}, {here!r}]
from app.store import StoreWriter
from synthetic import session_events
w = StoreWriter(sys.argv[1])
for i in range(int(sys.argv[3])):
    sid = f"{{sys.argv[2]}}{{i:06x}}"
    for ev in session_events(sid, 3):
        w(ev)
    w.end_session(sid)
w.close()
sys.exit(1 if w.errors else 0)
"""


def test_two_processes_writing_one_database_lose_nothing(tmp_path):
    path = tmp_path / "shared.db"  # blank: both processes migrate it first
    code = WRITER.format(root=str(ROOT), here=str(HERE))
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), tag, "8"]) for tag in ("aaaaaa", "bbbbbb")]
    assert [p.wait(120) for p in procs] == [0, 0]
    store = Store.open(path)
    assert _count(store) == (16, 48, 16 * (2 + 3 * 4), 16 * 7)
    assert {r["statuses"] for r in store.list_sessions(100)} == {"complete"}


def test_the_shipped_seed000_session_imports_with_its_ledger(tmp_path):
    store = Store.open(tmp_path / "a.db")
    sid = import_file(store, ROOT / "assets" / "sessions" / "seed000.json")
    run = store.run_config(sid)
    assert (run.model, run.weight_format, run.kv_format, run.prefix_cache, run.prewarm) == \
        ("smollm2-135m", "nvfp4", "f16", True, True)
    calls = store.rows("engine_calls", sid)
    assert calls[0]["kind"] == "prewarm" and calls[0]["computed_tokens"] == calls[0]["prompt_tokens"]
    assert [t["status"] for t in store.rows("turns", sid)] == ["complete"] * 4
    steady = sum(c["cached_tokens"] for c in calls[1:]) / sum(c["prompt_tokens"] for c in calls[1:])
    assert steady > 0.9  # the recorded reuse of the task's own calls
    assert len(store.rows("tool_results", sid)) == 3


def test_a_file_that_is_not_a_database_is_a_clear_error(tmp_path):
    bad = tmp_path / "notes.db"
    bad.write_text("these are my notes, not a database " * 20)
    with pytest.raises(StoreError, match="notes.db: cannot open the sessions database"):
        Store.open(bad)
    with pytest.raises(StoreError, match="notes.db: cannot open the sessions database"):
        StoreWriter(bad)
    assert bad.read_text().startswith("these are my notes")  # left as it was


def test_where_the_database_lives(tmp_path, monkeypatch):
    import argparse

    import platformdirs

    from app.chat import db_path

    monkeypatch.setenv("KVDECK_CONFIG", str(tmp_path / "none.toml"))
    assert db_path(argparse.Namespace(db=None)) == Path(platformdirs.user_data_dir("kvdeck")) / "kvdeck.db"
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[store]\npath = "{tmp_path / "mine.db"}"\n')
    monkeypatch.setenv("KVDECK_CONFIG", str(cfg))
    assert db_path(argparse.Namespace(db=None)) == tmp_path / "mine.db"
    assert db_path(argparse.Namespace(db=str(tmp_path / "flag.db"))) == tmp_path / "flag.db"  # --db wins
    cfg.write_text('[store]\npth = "x"\n')
    from app.config import ConfigError

    with pytest.raises(ConfigError, match=r"\[store\] has unknown field 'pth'"):
        db_path(argparse.Namespace(db=None))
