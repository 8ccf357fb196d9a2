"""The schema: a blank database migrates to the expected columns and indexes; a database written
by the first migration upgrades cleanly (its rows become searchable)."""

from __future__ import annotations

import sqlite3

from sqlite_utils import Database

from app.store.db import Store, connect
from app.store.schema import migrations

I, S, F, B = int, str, float, bytes
EXPECTED = {
    "sessions": dict(id=S, created=F, title=S, kind=S, parent_id=S, run_json=S, model=S, weight_format=S, kv_format=S,
                     backend=S, prefix_cache=I, prewarm=I, status=S, pid=I, host=S),
    "turns": dict(id=I, session_id=S, turn=I, user_text=S, tool_choice=S, now=S, status=S, answer=S, error=S,
                  started=F, finished=F),
    "messages": dict(id=I, session_id=S, turn=I, seq=I, role=S, content=S, start=I, end=I, token_ids=B, t_wall=F),
    "tool_calls": dict(id=I, session_id=S, turn=I, call_id=S, name=S, arguments=S, raw=S, t_wall=F),
    "tool_results": dict(id=I, session_id=S, turn=I, call_id=S, name=S, ok=I, content=S, elapsed_s=F, outcome=S,
                         t_wall=F),
    "engine_calls": dict(id=I, session_id=S, turn=I, call=I, kind=S, tool_choice=S, reusable_tokens=I, output_tokens=I,
                         prompt_tokens=I, cached_tokens=I, computed_tokens=I, new_tokens=I, waste_tokens=I, reuse=F,
                         ttft_s=F, prefill_s=F, decode_s=F, decode_tokens=I, decode_tok_s=F, finish_reason=S,
                         weight_format=S, kv_format=S, backend=S, threads=I, kv_used_pages=I, kv_pinned_pages=I,
                         kv_free_pages=I, evicted_pages=I, kv_total_pages=I, kv_block=I, kv_bytes_per_token=F, t_wall=F),
    "cache_events": dict(id=I, session_id=S, turn=I, call=I, kind=S, engine_session=I, pages=I, tokens=I,
                         prefix_tokens=I, head_text=S, reason=S, t_wall=F),
    "telemetry": dict(id=I, session_id=S, turn=I, call=I, source=S, samples=I, temp_min_c=F, temp_max_c=F,
                      temp_mean_c=F, energy_j=F, power_mean_w=F, peak_power_w=F, throttled=I, detail=S),
}
INDEXES = {
    "sessions": {("created",), ("parent_id",), ("id",)},
    "turns": {("session_id", "status"), ("session_id", "turn")},
    **{t: {("session_id", "turn")} for t in ("messages", "tool_calls", "tool_results", "engine_calls", "cache_events",
                                            "telemetry")},
}


def test_blank_database_has_the_expected_tables_columns_and_indexes(tmp_path):
    db = connect(tmp_path / "k.db")
    for table, cols in EXPECTED.items():
        assert db[table].columns_dict == cols, table
        assert {tuple(i.columns) for i in db[table].indexes} == INDEXES[table], table
    assert db["messages_fts"].exists() and db["tool_results_fts"].exists()
    assert {t.name for t in db.triggers} >= {"messages_ai", "messages_ad", "tool_results_ai", "tool_results_ad"}
    assert [m.name for m in migrations.applied(db)] == ["m001_tables", "m002_indexes_and_search"]
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    connect(tmp_path / "k.db")  # opening again applies nothing and changes nothing
    assert len(migrations.applied(db)) == 2


def test_a_database_of_the_first_schema_upgrades_cleanly(tmp_path):
    path = tmp_path / "old.db"
    old = Database(sqlite3.connect(str(path)))
    migrations.apply(old, stop_before="m002_indexes_and_search")
    assert not old["messages_fts"].exists()
    old.execute("INSERT INTO sessions (id, created, run_json) VALUES ('abcdef012345', 1.0, '{}')")
    old.execute("INSERT INTO turns (session_id, turn, user_text, tool_choice, status) "
                "VALUES ('abcdef012345', 1, 'fan?', 'auto', 'complete')")
    old.execute("INSERT INTO messages (session_id, turn, seq, role, content, start, \"end\") "
                "VALUES ('abcdef012345', 1, 0, 'user', 'is the radiator fan dusty', 0, 5)")
    old.execute("INSERT INTO tool_results (session_id, turn, call_id, name, ok, content) "
                "VALUES ('abcdef012345', 1, 'c1', 'search_notes', 1, 'clean the intake grille monthly')")
    old.conn.commit()
    old.close()
    store = Store.open(path)  # applies m002
    assert [m.name for m in migrations.applied(store.db)] == ["m001_tables", "m002_indexes_and_search"]
    assert [h["role"] for h in store.search("radiator")] == ["user"]
    assert [h["role"] for h in store.search("grille")] == ["tool:search_notes"]
    assert store.resolve("abcd") == "abcdef012345"
    for table, cols in EXPECTED.items():
        assert store.db[table].columns_dict == cols, table
