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
                         kv_free_pages=I, evicted_pages=I, kv_total_pages=I, kv_block=I, kv_bytes_per_token=F, t_wall=F,
                         context_budget=I, context_used=I, trimmed_tokens=I, trim_recomputed_tokens=I,
                         events_dropped=I),
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
    assert [m.name for m in migrations.applied(db)] == ["m001_tables", "m002_indexes_and_search", "m003_context_budget"]
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    connect(tmp_path / "k.db")  # opening again applies nothing and changes nothing
    assert len(migrations.applied(db)) == 3


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
    assert [m.name for m in migrations.applied(store.db)] == ["m001_tables", "m002_indexes_and_search", "m003_context_budget"]
    assert [h["role"] for h in store.search("radiator")] == ["user"]
    assert [h["role"] for h in store.search("grille")] == ["tool:search_notes"]
    assert store.resolve("abcd") == "abcdef012345"
    for table, cols in EXPECTED.items():
        assert store.db[table].columns_dict == cols, table


def test_a_trim_calls_budget_fields_reach_the_engine_calls_row():
    """m003: what the console and replay need to tell a trim from a cache killer is stored."""
    from app.engine.types import CallStats
    from app.events import EngineCallFinished
    from app.store.writer import call_row

    st = CallStats(prompt_tokens=4899, cached_tokens=1008, computed_tokens=3891, new_tokens=60, waste_tokens=3831,
                   reuse=1008 / 4899, ttft_s=19.7, prefill_s=19.6, decode_s=0.1, decode_tokens=3, decode_tok_s=30.0,
                   finish_reason="stop", weight_format="nvfp4", kv_format="f32", backend="cpu", kv_used_pages=300,
                   kv_pinned_pages=63, kv_free_pages=212, evicted_pages=0, threads=2, events_dropped=4)
    ev = EngineCallFinished(127, 1, st, 1008, 3, "auto", context_budget=8192, context_used=4902,
                            trimmed_tokens=3297, trim_recomputed_tokens=3823, session_id="abcdef012345")
    row = call_row("abcdef012345", ev)
    assert (row["context_budget"], row["context_used"], row["trimmed_tokens"], row["trim_recomputed_tokens"],
            row["events_dropped"]) == (8192, 4902, 3297, 3823, 4)
